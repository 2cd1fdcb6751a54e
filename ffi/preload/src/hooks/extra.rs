//! `sendfile` and glibc's fortified entry points, for luna sockets.
//!
//! * `sendfile`/`sendfile64` to a luna socket: nginx's default (`sendfile on`) and Python's
//!   `socket.sendfile`. Without it the call went to the placeholder kernel socket, which is
//!   not connected: nginx answered every static file with `EPIPE`.
//! * `__read_chk`, `__recv_chk`, `__recvfrom_chk`, `__poll_chk`, `__ppoll_chk`: what a program built with
//!   `_FORTIFY_SOURCE` (Debian builds its packages so) calls instead of `read`, `recv`,
//!   `recvfrom`, `poll` and `ppoll` when the compiler knows the buffer's size. glibc's versions
//!   check the size and call the system call directly, past this shim, so a fortified
//!   `read` of a luna socket read the placeholder. Here they check as glibc does
//!   (`__chk_fail` on an overflow) and take the luna path.

use super::{fail, guard, lookup, ret_len};
use crate::real::sym;
use libc::{c_int, c_void, off_t, size_t, sockaddr, socklen_t, ssize_t};
use std::sync::OnceLock;

extern "C" {
    /// glibc's "buffer overflow detected" abort.
    fn __chk_fail() -> !;
}

/// libc's `name` as `T` (a function pointer type spelling its prototype), resolved once.
macro_rules! real_fn {
    ($name:literal, $t:ty) => {{
        static F: OnceLock<Option<$t>> = OnceLock::new();
        *F.get_or_init(|| sym::<$t>($name))
    }};
}

type SendfileFn = unsafe extern "C" fn(c_int, c_int, *mut off_t, size_t) -> ssize_t;

/// Bytes read from the file per step.
const CHUNK: usize = 64 << 10;

/// `sendfile(2)`: to a luna socket, the file's bytes go through a buffer (one copy, as
/// `read` + `write`; the kernel's page-cache splice has no luna counterpart) with the
/// socket's blocking rules: a blocking socket takes all `count` bytes (or up to the end of
/// the file, an error or a signal after some bytes), a non-blocking one what fits.
/// `offset` as Linux: read from `*offset` and advanced past the bytes sent, the file
/// position unchanged; without it the file position advances by the bytes sent.
#[no_mangle]
pub unsafe extern "C-unwind" fn sendfile(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    match lookup(out_fd) {
        // SAFETY: C's contract for sendfile.
        Some(s) => guard(|| ret_len(unsafe { luna_sendfile(out_fd, &s, in_fd, offset, count) })),
        None => match real_fn!(c"sendfile", SendfileFn) {
            // SAFETY: forwarding.
            Some(f) => unsafe { f(out_fd, in_fd, offset, count) },
            None => fail(libc::ENOSYS),
        },
    }
}

/// `sendfile64`: the same call (`off_t` is 64 bits on 64-bit Linux).
#[no_mangle]
pub unsafe extern "C-unwind" fn sendfile64(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    // SAFETY: the same contract.
    unsafe { sendfile(out_fd, in_fd, offset, count) }
}

/// # Safety
/// `offset` is null or points to an `off_t`.
unsafe fn luna_sendfile(
    fd: c_int,
    s: &std::sync::Arc<crate::sock::Sock>,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
) -> Result<usize, i32> {
    // The source as Linux's do_sendfile checks it, before anything is read: open for
    // reading (EBADF), seekable if an offset is given (ESPIPE), the offset not negative
    // (EINVAL), and something the kernel can splice to a socket (a pipe, a socket — a
    // luna socket's placeholder is one — or an eventfd cannot: EINVAL). Reading one of
    // those here would take bytes (a count) that could not go back when the luna
    // socket took fewer.
    // A luna socket as the source is a socket (its placeholder is open for both).
    if lookup(in_fd).is_some() {
        return Err(if offset.is_null() {
            libc::EINVAL
        } else {
            libc::ESPIPE
        });
    }
    // SAFETY: `st` is plain data that fstat fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one `struct stat`; F_GETFL takes no argument.
    let flags = unsafe {
        if libc::fstat(in_fd, &mut st) != 0 {
            return Err(crate::errno());
        }
        libc::fcntl(in_fd, libc::F_GETFL)
    };
    if flags < 0 || flags & libc::O_ACCMODE == libc::O_WRONLY || flags & libc::O_PATH != 0 {
        return Err(libc::EBADF);
    }
    // What splices to a socket: regular files, block and character devices. Not a
    // pipe or a socket (`stream`: no `pread` either), a directory, or an anonymous
    // inode (eventfd, timerfd, signalfd, epoll: no file type), whose read would take
    // a count or a signal.
    let stream = matches!(st.st_mode & libc::S_IFMT, libc::S_IFIFO | libc::S_IFSOCK);
    let splices = matches!(
        st.st_mode & libc::S_IFMT,
        libc::S_IFREG | libc::S_IFBLK | libc::S_IFCHR
    );
    // SAFETY: null or valid (the caller's contract).
    let mut pos = match unsafe { offset.as_ref() } {
        Some(_) if stream => return Err(libc::ESPIPE),
        Some(&p) if p < 0 => return Err(libc::EINVAL),
        Some(&p) => Some(p),
        None => None,
    };
    if !splices {
        return Err(libc::EINVAL);
    }
    let mut buf = vec![0u8; count.clamp(1, CHUNK)];
    let mut sent = 0usize;
    let mut err = None;
    while sent < count {
        let want = (count - sent).min(CHUNK);
        let b = buf.as_mut_ptr().cast::<c_void>();
        // SAFETY: `buf` holds `want` ≤ its length bytes; `in_fd` is the caller's (a
        // kernel descriptor: luna sockets were refused above).
        let n = unsafe {
            match pos {
                Some(p) => libc::pread(in_fd, b, want, p),
                None => libc::read(in_fd, b, want),
            }
        };
        let Ok(n) = usize::try_from(n) else {
            err = Some(crate::errno());
            break;
        };
        if n == 0 {
            break; // end of file
        }
        let w = super::do_write(fd, s, &[&buf[..n]], 0);
        let taken = *w.as_ref().unwrap_or(&0);
        sent += taken;
        if let Some(p) = &mut pos {
            *p += taken as off_t;
        } else if taken < n {
            // The bytes read but not sent go back to the file position.
            // SAFETY: lseek on the caller's descriptor.
            unsafe { libc::lseek(in_fd, -((n - taken) as off_t), libc::SEEK_CUR) };
        }
        match w {
            Ok(m) if m == n => {}
            Ok(_) => break, // a non-blocking socket took what fitted
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    if let (Some(p), false) = (pos, offset.is_null()) {
        // SAFETY: non-null and valid (the caller's contract).
        unsafe { *offset = p };
    }
    match err {
        Some(e) if sent == 0 => Err(e),
        _ => Ok(sent),
    }
}

/// glibc's `__read_chk`: `read` into a buffer of `buflen` bytes.
#[no_mangle]
pub unsafe extern "C-unwind" fn __read_chk(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    if n > buflen {
        // SAFETY: glibc's abort, as its own __read_chk does.
        unsafe { __chk_fail() }
    }
    // SAFETY: C's contract for read, the size checked.
    unsafe { super::read(fd, b, n) }
}

/// glibc's `__recv_chk`.
#[no_mangle]
pub unsafe extern "C-unwind" fn __recv_chk(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    if n > buflen {
        // SAFETY: glibc's abort.
        unsafe { __chk_fail() }
    }
    // SAFETY: C's contract for recv, the size checked.
    unsafe { super::recv(fd, b, n, flags) }
}

/// glibc's `__recvfrom_chk`.
#[no_mangle]
pub unsafe extern "C-unwind" fn __recvfrom_chk(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    if n > buflen {
        // SAFETY: glibc's abort.
        unsafe { __chk_fail() }
    }
    // SAFETY: C's contract for recvfrom, the size checked.
    unsafe { super::recvfrom(fd, b, n, flags, addr, len) }
}

/// glibc's `__ppoll_chk`: `ppoll` over an array of `fdslen` bytes.
#[no_mangle]
pub unsafe extern "C-unwind" fn __ppoll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
    fdslen: size_t,
) -> c_int {
    if fdslen / std::mem::size_of::<libc::pollfd>() < n as usize {
        // SAFETY: glibc's abort.
        unsafe { __chk_fail() }
    }
    // SAFETY: C's contract for ppoll, the length checked.
    unsafe { super::ppoll(fds, n, ts, mask) }
}

/// glibc's `__poll_chk`: `poll` over an array of `fdslen` bytes.
#[no_mangle]
pub unsafe extern "C-unwind" fn __poll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: c_int,
    fdslen: size_t,
) -> c_int {
    if fdslen / std::mem::size_of::<libc::pollfd>() < n as usize {
        // SAFETY: glibc's abort.
        unsafe { __chk_fail() }
    }
    // SAFETY: C's contract for poll, the length checked.
    unsafe { super::poll(fds, n, timeout) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sock::{Phase, Sock};
    use std::io::{Seek, SeekFrom, Write};
    use std::os::fd::AsRawFd;

    fn file_with(bytes: &[u8]) -> std::fs::File {
        let mut f = tempfile();
        f.write_all(bytes).unwrap();
        f.seek(SeekFrom::Start(0)).unwrap();
        f
    }

    fn tempfile() -> std::fs::File {
        let p = std::env::temp_dir().join(format!(
            "luna-preload-extra-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        std::fs::remove_file(&p).unwrap();
        f
    }

    fn pipe() -> (c_int, c_int) {
        let mut p = [0; 2];
        // SAFETY: pipe writes two descriptors into the array.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        (p[0], p[1])
    }

    fn close(fd: c_int) {
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
    }

    /// Kernel descriptors go to libc's calls: sendfile with and without an offset, the
    /// fortified read, poll and ppoll.
    #[test]
    fn kernel_descriptors_fall_through() {
        let f = file_with(b"0123456789");
        let (r, w) = pipe();
        let mut off: off_t = 2;
        // SAFETY: valid descriptors and offset.
        assert_eq!(unsafe { sendfile(w, f.as_raw_fd(), &mut off, 3) }, 3);
        assert_eq!(off, 5);
        assert_eq!(
            // SAFETY: as above; the file position moves (it was 0).
            unsafe { sendfile64(w, f.as_raw_fd(), std::ptr::null_mut(), 4) },
            4
        );
        let mut pfd = [libc::pollfd {
            fd: r,
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: one pollfd of its size.
        assert_eq!(unsafe { __poll_chk(pfd.as_mut_ptr(), 1, 0, 8) }, 1);
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        pfd[0].revents = 0;
        assert_eq!(
            // SAFETY: one pollfd of its size, a live timespec, no mask.
            unsafe { __ppoll_chk(pfd.as_mut_ptr(), 1, &zero, std::ptr::null(), 8) },
            1
        );
        assert_eq!(pfd[0].revents, libc::POLLIN);
        let mut buf = [0u8; 16];
        // SAFETY: 16 bytes of buffer.
        let n = unsafe { __read_chk(r, buf.as_mut_ptr().cast(), 16, 16) };
        assert_eq!(&buf[..n as usize], b"2340123");
        close(r);
        close(w);
    }

    /// A luna socket that refuses the bytes (no engine here: ENETDOWN) leaves the file
    /// position and the offset where they were: nothing was sent.
    #[test]
    fn refused_bytes_go_back_to_the_file() {
        let f = file_with(&[7u8; 1000]);
        let (r, w) = pipe();
        // (As the other tests that name luna sockets: the shim is on.)
        crate::ACTIVE.store(true, std::sync::atomic::Ordering::Release);
        super::super::insert(w, Sock::new(Phase::Connected, crate::sock::UNBOUND), false);
        // SAFETY: valid descriptors.
        let n = unsafe { sendfile(w, f.as_raw_fd(), std::ptr::null_mut(), 500) };
        assert_eq!((n, crate::errno()), (-1, libc::ENETDOWN));
        // SAFETY: lseek on our file.
        assert_eq!(unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_CUR) }, 0);
        let mut off: off_t = 100;
        // SAFETY: valid descriptors and offset.
        assert_eq!(unsafe { sendfile(w, f.as_raw_fd(), &mut off, 500) }, -1);
        assert_eq!(off, 100);
        // A luna socket as the source: EINVAL, as for any socket on Linux (to a kernel
        // descriptor the placeholder socket gets the same answer from the kernel).
        // SAFETY: valid descriptors.
        assert_eq!(unsafe { sendfile(w, w, std::ptr::null_mut(), 1) }, -1);
        assert_eq!(crate::errno(), libc::EINVAL);
        assert!(super::super::remove(w).is_some());
        close(r);
        close(w);
    }

    /// Bytes available in pipe `r`.
    fn queued(r: c_int) -> c_int {
        let mut n: c_int = 0;
        // SAFETY: FIONREAD writes one int.
        assert_eq!(unsafe { libc::ioctl(r, libc::FIONREAD, &mut n) }, 0);
        n
    }

    /// A pipe or a socket as the source: Linux refuses it (`EINVAL` from the splice
    /// without an offset: neither has `splice_read` toward a socket; `ESPIPE` with one)
    /// and leaves its bytes where they were. Reading it (it cannot seek back) lost the
    /// bytes the luna socket did not take.
    #[test]
    fn a_pipe_or_socket_source_is_refused_and_keeps_its_bytes() {
        let (r, w) = pipe();
        let (sr, sw) = pipe();
        assert_eq!(
            // SAFETY: our pipe; 1000 bytes fit its buffer.
            unsafe { libc::write(sw, [5u8; 1000].as_ptr().cast(), 1000) },
            1000
        );
        crate::ACTIVE.store(true, std::sync::atomic::Ordering::Release);
        super::super::insert(w, Sock::new(Phase::Connected, crate::sock::UNBOUND), false);
        // SAFETY: valid descriptors.
        let n = unsafe { sendfile(w, sr, std::ptr::null_mut(), 500) };
        assert_eq!((n, crate::errno()), (-1, libc::EINVAL));
        assert_eq!(queued(sr), 1000, "the pipe's bytes were consumed");
        let mut off: off_t = 0;
        // SAFETY: valid descriptors and offset.
        let n = unsafe { sendfile(w, sr, &mut off, 500) };
        assert_eq!((n, crate::errno()), (-1, libc::ESPIPE));
        assert_eq!(queued(sr), 1000);
        // A kernel socket as the source, its bytes left alone too.
        let mut sp = [0; 2];
        assert_eq!(
            // SAFETY: socketpair writes two descriptors into the array.
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sp.as_mut_ptr()) },
            0
        );
        // SAFETY: our socket.
        assert_eq!(unsafe { libc::write(sp[1], b"abc".as_ptr().cast(), 3) }, 3);
        // SAFETY: valid descriptors.
        let n = unsafe { sendfile(w, sp[0], std::ptr::null_mut(), 3) };
        assert_eq!((n, crate::errno()), (-1, libc::EINVAL));
        assert_eq!(queued(sp[0]), 3);
        // An eventfd (an anonymous inode, no file type): EINVAL, its counter left as it
        // was (reading it would have taken the count).
        // SAFETY: eventfd takes an initial value and flags.
        let efd = unsafe { libc::eventfd(5, 0) };
        assert!(efd >= 0);
        // SAFETY: valid descriptors.
        let n = unsafe { sendfile(w, efd, std::ptr::null_mut(), 8) };
        assert_eq!((n, crate::errno()), (-1, libc::EINVAL));
        let mut v = 0u64;
        assert_eq!(
            // SAFETY: an eventfd reads as 8 bytes.
            unsafe { libc::read(efd, (&mut v as *mut u64).cast(), 8) },
            8
        );
        assert_eq!(v, 5, "the eventfd's counter was taken");
        close(efd);
        // A source not open for reading: EBADF, even for no bytes (as Linux checks it
        // first).
        // SAFETY: valid descriptors.
        let n = unsafe { sendfile(w, sw, std::ptr::null_mut(), 0) };
        assert_eq!((n, crate::errno()), (-1, libc::EBADF));
        assert!(super::super::remove(w).is_some());
        for fd in [r, w, sr, sw, sp[0], sp[1]] {
            close(fd);
        }
    }
}
