//! Where net_tap's receive signals go.
//!
//! DPDK 22.11's net_tap asks the kernel for a real-time signal on every queue's tun file
//! (`F_SETSIG` with the first free `SIGRTMIN+n`, `O_ASYNC`, `F_SETOWN` = the process): its
//! handler bumps a counter that lets `rx_burst` skip the `read` when nothing arrived. The
//! signal is process-directed, so the kernel hands it to any thread that does not block it,
//! the main thread first: the *application's* threads. A handler with `SA_RESTART` does
//! not restart `epoll_wait`, `poll`, `select`, `nanosleep` and the other calls signal(7)
//! lists as never restarted, so every frame the tap received ended one of those in the
//! application with `EINTR` (nginx under the LD_PRELOAD shim logged an interrupted
//! `epoll_wait` several times per request), and `sleep(3)` returned early.
//!
//! [`direct_to_current_thread`] makes the calling thread (the core thread that polls the
//! queues) the owner of those signals (`F_SETOWN_EX`, `F_OWNER_TID`): the handler still
//! runs, in the one thread that busy-polls anyway, and the application sees none.
//!
//! [`AsyncSignalsBlocked`] is the other half for a library that starts luna's threads
//! inside an application (the LD_PRELOAD shim, the C ABI): those threads block the
//! application's asynchronous signals, so they are handled on the application's threads.

use std::os::fd::RawFd;

// <asm-generic/fcntl.h>, the same on every Linux architecture; the libc crate does not
// define them for glibc targets.
const F_SETOWN_EX: libc::c_int = 15;
const F_GETSIG: libc::c_int = 11;
const F_OWNER_TID: libc::c_int = 0;

/// `struct f_owner_ex`.
#[repr(C)]
struct FOwnerEx {
    kind: libc::c_int,
    pid: libc::pid_t,
}

/// This process's tun files attached to interface `iface` that have a signal set
/// (`F_SETSIG`): net_tap's queue files and its detached keep-alive file (DPDK 22.11's
/// `tun_alloc` sets the signal on every file it opens).
pub fn signalling_tun_fds(iface: &str) -> Vec<RawFd> {
    let want = format!("iff:\t{iface}");
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut fds: Vec<RawFd> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd: &RawFd| {
            std::fs::read_link(format!("/proc/self/fd/{fd}"))
                .is_ok_and(|p| p.as_os_str() == "/dev/net/tun")
                && std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
                    .is_ok_and(|s| s.lines().any(|l| l == want))
        })
        // SAFETY: F_GETSIG reads a file's setting; `fd` was listed as open just now (were
        // it closed meanwhile, fcntl fails with EBADF, or reads whatever file took the
        // number, which the interface check above and the caller's ownership of the
        // port's files rule out in practice; no memory is touched either way).
        .filter(|&fd| unsafe { libc::fcntl(fd, F_GETSIG) } > 0)
        .collect();
    fds.sort_unstable();
    fds
}

/// The kernel interface of a net_tap / net_tun port whose device info reports `if_index`
/// (`vdev_iface`: its vdev's `iface=`, if any), when this process has signalling tun
/// files attached to it: the name the kernel gives `if_index` (a vdev without `iface=`
/// gets `dtap0`, `dtun0`, ... from the kernel; `iface=x%d` is a pattern, not a name),
/// else `vdev_iface` (the index names another interface in this network namespace once
/// the tap was moved out of it). `None` for a port of another driver.
pub fn port_iface(driver_name: &str, if_index: u32, vdev_iface: Option<&str>) -> Option<String> {
    if !matches!(driver_name, "net_tap" | "net_tun") {
        return None;
    }
    let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `name` holds IF_NAMESIZE bytes, what if_indextoname may write.
    let by_index = (if_index != 0
        && !unsafe { libc::if_indextoname(if_index, name.as_mut_ptr()) }.is_null())
    .then(|| {
        // SAFETY: if_indextoname wrote a NUL-terminated name into `name`.
        unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    })
    .filter(|n| !signalling_tun_fds(n).is_empty());
    by_index.or_else(|| vdev_iface.map(str::to_owned))
}

/// The calling thread's id.
pub fn current_tid() -> libc::pid_t {
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    libc::pid_t::try_from(tid).expect("thread ids fit pid_t")
}

/// Makes the calling thread the receiver of the signals of `iface`'s net_tap queue files
/// (see the module doc), and unblocks those signals in it (a thread started with every
/// asynchronous signal blocked, as the LD_PRELOAD shim starts luna's, would otherwise
/// leave them pending for ever and the tap's receive trigger with them). Returns how many
/// files it redirected; an error names the file whose owner could not be set (the
/// signals of the others are redirected anyway).
pub fn direct_to_current_thread(iface: &str) -> std::io::Result<usize> {
    let owner = FOwnerEx {
        kind: F_OWNER_TID,
        pid: current_tid(),
    };
    let fds = signalling_tun_fds(iface);
    // SAFETY: sigset_t is plain data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t.
    unsafe { libc::sigemptyset(&mut set) };
    for &fd in &fds {
        // SAFETY: F_GETSIG reads a setting of one of our files.
        let sig = unsafe { libc::fcntl(fd, F_GETSIG) };
        if sig > 0 {
            // SAFETY: `set` is initialised; `sig` is a signal number the kernel holds.
            unsafe { libc::sigaddset(&mut set, sig) };
        }
    }
    // SAFETY: `set` is initialised; no old mask is asked for.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
    let mut n = 0;
    let mut failed = None;
    for fd in fds {
        // SAFETY: F_SETOWN_EX reads a `struct f_owner_ex` (FOwnerEx is its repr(C) layout)
        // through the pointer, which is valid for the call; `fd` is one of this process's
        // tun files of `iface`.
        let r = unsafe { libc::fcntl(fd, F_SETOWN_EX, &owner as *const FOwnerEx) };
        if r == 0 {
            n += 1;
        } else {
            failed = Some((fd, std::io::Error::last_os_error()));
        }
    }
    match failed {
        Some((fd, e)) => Err(std::io::Error::new(
            e.kind(),
            format!("F_SETOWN_EX on tun file {fd} of {iface}: {e}"),
        )),
        None => Ok(n),
    }
}

/// The receive signal of `iface`'s net_tap queue files (DPDK 22.11 sets one signal,
/// the first free `SIGRTMIN+n`, on every file it opens), if this process has any.
pub fn receive_signal(iface: &str) -> Option<libc::c_int> {
    signalling_tun_fds(iface).into_iter().find_map(|fd| {
        // SAFETY: F_GETSIG reads a setting of one of our files.
        let sig = unsafe { libc::fcntl(fd, F_GETSIG) };
        (sig > 0).then_some(sig)
    })
}

/// Raises net_tap's receive signal `sig` in the calling thread, as the kernel does when a
/// frame arrives: its handler bumps the counter that `rx_burst` compares with the last
/// value it saw, so the next `rx_burst` of every tap queue reads its file again.
///
/// Why this is needed: DPDK 22.11's `pmd_rx_burst` reads a queue only when that counter
/// moved, and marks it seen whenever it returns less than a full burst. When the receive
/// pool is empty it reads one frame, cannot refill, drops the frame (`rx_nombuf`) and
/// returns short: the frames still queued in the tun file are read only after the *next*
/// arrival. A peer that waits for us (an ACK, a retransmission timer) leaves them there,
/// and a server whose pool was drained stays deaf after the pool refills. Call it from the
/// thread that polls the queues (the owner of the signals, [`direct_to_current_thread`]);
/// were the signal blocked there, it stays pending until unblocked.
/// A signal without a handler is refused (`InvalidInput`): the default action of a
/// real-time signal ends the process.
pub fn kick(sig: libc::c_int) -> std::io::Result<()> {
    // SAFETY: sigaction is plain data; with a null new action, sigaction(2) only writes
    // the current one into `cur`, valid for the call.
    let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::sigaction(sig, std::ptr::null(), &mut cur) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if cur.sa_sigaction == libc::SIG_DFL || cur.sa_sigaction == libc::SIG_IGN {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("signal {sig} has no handler"),
        ));
    }
    // SAFETY: raise(3) sends `sig` to the calling thread, where the handler just checked
    // runs as for a kernel-sent one.
    if unsafe { libc::raise(sig) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The owner thread or process of `fd`'s signals: `(is_thread, id)`.
pub fn signal_owner(fd: RawFd) -> std::io::Result<(bool, libc::pid_t)> {
    const F_GETOWN_EX: libc::c_int = 16;
    let mut owner = FOwnerEx { kind: -1, pid: 0 };
    // SAFETY: F_GETOWN_EX writes one `struct f_owner_ex` through the pointer, which points
    // to a live FOwnerEx (its layout) for the call.
    let r = unsafe { libc::fcntl(fd, F_GETOWN_EX, &mut owner as *mut FOwnerEx) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((owner.kind == F_OWNER_TID, owner.pid))
}

/// Every asynchronous signal blocked in the calling thread until dropped (the old mask
/// back). For a library that starts threads inside an application (the LD_PRELOAD shim,
/// the C ABI): threads created meanwhile — EAL's interrupt and multi-process threads, the
/// runtime's cores — inherit the mask, so the application's process-directed signals
/// (`SIGTERM`, `SIGINT`, `SIGALRM`, ...) are handled on its own threads, and one it blocks
/// everywhere to take with `sigwait`/`signalfd` is not delivered to a luna thread (where
/// its default action ended the process). Synchronous signals (a fault in luna's own
/// code) stay unblocked; net_tap's receive signal is unblocked again by the core thread
/// that takes it ([`direct_to_current_thread`]).
pub struct AsyncSignalsBlocked(libc::sigset_t);

impl AsyncSignalsBlocked {
    /// Blocks them now, in the calling thread.
    pub fn now() -> AsyncSignalsBlocked {
        // SAFETY: sigset_t is plain data, initialised by sigfillset / pthread_sigmask.
        let (mut all, mut old): (libc::sigset_t, libc::sigset_t) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        // SAFETY: `all` is a valid sigset_t; the signal numbers are valid.
        unsafe {
            libc::sigfillset(&mut all);
            for sig in [
                libc::SIGSEGV,
                libc::SIGBUS,
                libc::SIGFPE,
                libc::SIGILL,
                libc::SIGTRAP,
                libc::SIGSYS,
                libc::SIGABRT,
            ] {
                libc::sigdelset(&mut all, sig);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        }
        AsyncSignalsBlocked(old)
    }
}

impl Drop for AsyncSignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask `now` saved, in the same thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tun file of our own with a signal set, as net_tap makes them (needs root and
    /// /dev/net/tun; skipped otherwise).
    fn tun_with_signal(name: &str, sig: libc::c_int) -> Option<std::fs::File> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
            .ok()?;
        #[repr(C)]
        struct IfReq {
            name: [u8; 16],
            flags: libc::c_short,
            _pad: [u8; 22],
        }
        let mut req = IfReq {
            name: [0; 16],
            flags: (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short,
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        use std::os::fd::AsRawFd;
        const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
        // SAFETY: TUNSETIFF reads a `struct ifreq` (IfReq has its 40-byte layout) through
        // the pointer, valid for the call.
        if unsafe { libc::ioctl(f.as_raw_fd(), TUNSETIFF, &mut req as *mut IfReq) } != 0 {
            return None;
        }
        // SAFETY: F_SETSIG takes an int.
        assert_eq!(unsafe { libc::fcntl(f.as_raw_fd(), 10, sig) }, 0);
        Some(f)
    }

    #[test]
    fn the_signals_of_an_interfaces_tun_files_go_to_the_calling_thread() {
        use std::os::fd::AsRawFd;
        let sig = libc::SIGRTMIN() + 3;
        let Some(a) = tun_with_signal("lunasig0", sig) else {
            eprintln!("SKIPPED: needs root and /dev/net/tun");
            return;
        };
        let b = tun_with_signal("lunasig1", sig).expect("second tun");
        assert_eq!(signalling_tun_fds("lunasig0"), vec![a.as_raw_fd()]);
        assert!(signalling_tun_fds("nosuchtap").is_empty());
        // Before: no owner (pid 0).
        assert_eq!(signal_owner(a.as_raw_fd()).unwrap().1, 0);
        let fd = a.as_raw_fd();
        std::thread::spawn(move || {
            // A thread that blocks the tap's signal (as the shim starts luna's) unblocks it.
            let blocked = || {
                // SAFETY: plain data, initialised by pthread_sigmask.
                let mut cur: libc::sigset_t = unsafe { std::mem::zeroed() };
                // SAFETY: reads this thread's mask into `cur`.
                unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur) };
                // SAFETY: `cur` was filled above.
                unsafe { libc::sigismember(&cur, sig) == 1 }
            };
            // SAFETY: plain data; sigfillset initialises it; the mask is this thread's.
            unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
            }
            assert!(blocked());
            assert_eq!(direct_to_current_thread("lunasig0").unwrap(), 1);
            assert!(
                !blocked(),
                "the tap's signal is unblocked in the receiving thread"
            );
            // (Read while the thread lives: an exited owner reads as pid 0.)
            assert_eq!(signal_owner(fd).unwrap(), (true, current_tid()));
        })
        .join()
        .unwrap();
        // Another interface's file is left alone.
        assert_eq!(signal_owner(b.as_raw_fd()).unwrap().1, 0);
    }
}
