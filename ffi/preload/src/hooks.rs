//! The exported libc functions. Each one forwards to libc unless the descriptor is a
//! luna socket (or is about to become one); none unwinds into C.
//!
//! Every function here is called by C code with C's contract for the libc function of
//! the same name: pointers are valid for the lengths given (or null where libc allows).

#![allow(clippy::missing_safety_doc)]

use crate::engine::{self, Cmd};
use crate::epoll;
use crate::real::{self, call_real};
use crate::select::{self, Sets};
use crate::sock::{Phase, Sock, Wait, UNBOUND};
use crate::{internal, set_errno, ACTIVE};
use core::net::{Ipv4Addr, SocketAddrV4};
use libc::{
    c_int, c_ulong, c_void, epoll_event, iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t,
};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

mod extra;

static SOCKS: LazyLock<RwLock<HashMap<c_int, Arc<Sock>>>> = LazyLock::new(Default::default);

/// Sockets the application closed whose queued bytes may still be going out (the poll
/// thread holds them until then): looked at by [`bytes_queued`] at exit.
static CLOSING: Mutex<Vec<Weak<Sock>>> = Mutex::new(Vec::new());

/// Whether a luna socket, open or closed, still has bytes in the shim's send queue that
/// the poll thread can send (at exit: the runtime's stop must wait for them).
pub(crate) fn bytes_queued() -> bool {
    let open: Vec<Arc<Sock>> = SOCKS
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .cloned()
        .collect();
    let closing: Vec<Arc<Sock>> = CLOSING
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    open.iter().chain(&closing).any(|s| {
        let g = s.lock();
        !g.tx.is_empty() && g.fatal.is_none() && g.bfd.is_some()
    })
}

/// The luna socket behind `fd`, if any (never on the shim's own threads or in a forked
/// child).
fn lookup(fd: c_int) -> Option<Arc<Sock>> {
    if !ACTIVE.load(Ordering::Acquire) || internal() {
        return None;
    }
    SOCKS
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(&fd)
        .cloned()
}

/// `fd` names `s` (a new socket or a `dup` copy). A luna socket `fd` named before is
/// released first (the kernel reused the number: `dup2` over it; `linger_zero`: its
/// `SO_LINGER` was `{1, 0}`).
fn insert(fd: c_int, s: Arc<Sock>, linger_zero: bool) {
    let old = {
        let mut t = SOCKS.write().unwrap_or_else(|p| p.into_inner());
        s.fds.fetch_add(1, Ordering::Relaxed);
        let old = t.insert(fd, s);
        old.filter(|o| o.fds.fetch_sub(1, Ordering::Relaxed) == 1)
    };
    if let Some(o) = old {
        release(o, linger_zero);
    }
}

/// Forgets `fd`; its socket if `fd` was the last descriptor naming it (then the caller
/// closes it: [`release`]).
fn remove(fd: c_int) -> Option<Arc<Sock>> {
    if !ACTIVE.load(Ordering::Acquire) || internal() {
        return None;
    }
    let mut t = SOCKS.write().unwrap_or_else(|p| p.into_inner());
    let s = t.remove(&fd)?;
    (s.fds.fetch_sub(1, Ordering::Relaxed) == 1).then_some(s)
}

/// `fd`'s `SO_LINGER` (the option lives on the kernel placeholder, where `setsockopt`
/// forwards it).
fn linger(fd: c_int) -> Option<libc::linger> {
    let zero = libc::linger {
        l_onoff: 0,
        l_linger: 0,
    };
    sockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, zero)
}

/// Whether `fd`'s `SO_LINGER` is `{l_onoff = 1, l_linger = 0}`.
fn linger_zero(fd: c_int) -> bool {
    linger(fd).is_some_and(|l| l.l_onoff != 0 && l.l_linger == 0)
}

/// The last descriptor of `s` is gone: leave the epoll sets and
/// close: gracefully (queued bytes, then FIN), or with a RST as Linux's `tcp_close`
/// when `linger_zero` (`SO_LINGER` `{1, 0}`) or when received bytes were never read
/// (RFC 1122 §4.2.2.13: the peer learns they were lost).
fn release(s: Arc<Sock>, linger_zero: bool) {
    release_lingering(s, linger_zero, None);
}

/// [`release`]; with `linger` (`SO_LINGER` `{1, t > 0}`, `close(2)`) the caller waits,
/// at most that long, until the peer acknowledged what was sent and the FIN (Linux's
/// `tcp_close` → `sk_stream_wait_close`, whether the socket is blocking or not).
fn release_lingering(s: Arc<Sock>, linger_zero: bool, linger: Option<Duration>) {
    epoll::forget_sock(&s);
    let had = {
        let mut g = s.lock();
        g.phase = Phase::Closed;
        g.reset_on_close = linger_zero || !g.rx.is_empty();
        g.linger = linger.is_some() && !g.reset_on_close && !g.listener && g.bfd.is_some();
        // A thread blocked on the socket (another thread's call) wakes and finds it
        // closed, instead of sleeping until a change that will not come.
        s.notify(&g);
        g.bfd.is_some()
    };
    if had {
        let mut c = CLOSING.lock().unwrap_or_else(|p| p.into_inner());
        c.retain(|w| w.strong_count() > 0);
        c.push(Arc::downgrade(&s));
        drop(c);
        if let Some(sh) = engine::engine() {
            let deadline = linger.map(|t| Instant::now() + t);
            sh.push(Cmd::Close(Arc::clone(&s)));
            if let Some(d) = deadline {
                s.linger_wait(sh, d);
            }
        }
    }
}

/// The descriptor `nfd` is a kernel copy of `fd` (`dup`, `dup2`, `dup3`, `F_DUPFD`):
/// it names `fd`'s luna socket too, as a copy of a kernel socket shares its file
/// (dup(2)). Whatever luna socket `nfd` named before lost that descriptor (closed as
/// by `close` if it was its last: `linger_zero` is its `SO_LINGER` `{1, 0}`, read by
/// [`linger_zero_of`] before the kernel closed the placeholder).
fn duplicated(fd: c_int, nfd: c_int, linger_zero: bool) {
    if nfd < 0 || fd == nfd || !ACTIVE.load(Ordering::Acquire) || internal() || crate::vfork_child()
    {
        return;
    }
    let _ = try_luna::<c_int>(|| {
        match lookup(fd) {
            Some(s) => insert(nfd, s, linger_zero),
            None => {
                if let Some(s) = remove(nfd) {
                    release(s, linger_zero);
                }
            }
        }
        None
    });
}

/// Whether `new`, about to be replaced by `dup2`/`dup3`, is a luna socket with
/// `SO_LINGER` `{1, 0}` (read now: the kernel closes its placeholder in the call).
fn linger_zero_of(old: c_int, new: c_int) -> bool {
    old != new && lookup(new).is_some() && linger_zero(new)
}

/// Runs `f`; a panic becomes `-1`/`EIO`.
fn guard<R: From<i8>>(f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_errno(libc::EIO);
        R::from(-1)
    })
}

/// Runs the luna side of a call: `None` means "not luna's, forward to libc" (done by the
/// caller outside the unwinding guard, so a thread cancelled in a blocking libc call
/// unwinds through the shim untouched).
fn try_luna<R: From<i8>>(f: impl FnOnce() -> Option<R>) -> Option<R> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_errno(libc::EIO);
        Some(R::from(-1))
    })
}

fn fail<R: From<i8>>(e: i32) -> R {
    set_errno(e);
    R::from(-1)
}

fn ret_len(r: Result<usize, i32>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => fail(e),
    }
}

fn ret0(r: Result<(), i32>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// How a call on `fd` that would block may wait: not at all with `O_NONBLOCK` or
/// `dontwait` (`MSG_DONTWAIT`), else at most the placeholder's `SO_RCVTIMEO` or
/// `SO_SNDTIMEO` (`opt`, where `setsockopt` forwards it) when set, as Linux's
/// `sock_rcvtimeo`/`sock_sndtimeo`. Asked only when the call would block.
fn how_to_wait(fd: c_int, dontwait: bool, opt: c_int) -> Wait {
    if dontwait || nonblocking(fd) {
        return Wait::No;
    }
    let zero = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    let tv = sockopt(fd, libc::SOL_SOCKET, opt, zero).unwrap_or(zero);
    let t = std::time::Duration::from_secs(u64::try_from(tv.tv_sec).unwrap_or(0))
        + std::time::Duration::from_micros(u64::try_from(tv.tv_usec).unwrap_or(0));
    if !t.is_zero() {
        Wait::For(t)
    } else {
        Wait::Forever
    }
}

/// The placeholder's `O_NONBLOCK`.
fn nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL takes no argument (the 0 is ignored); libc's fcntl.
    let fl = unsafe { call_real!(fcntl(fd, libc::F_GETFL, 0)) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

fn sockopt_int(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    sockopt(fd, level, name, 0)
}

/// Option `level`/`name` of the kernel socket `fd` (libc's `getsockopt`), read into a
/// `T` that starts as `init` (a plain C value: an int, `linger`, `timeval`).
fn sockopt<T: Copy>(fd: c_int, level: c_int, name: c_int, init: T) -> Option<T> {
    let mut v = init;
    let mut len = std::mem::size_of::<T>() as socklen_t;
    // SAFETY: `v` and `len` are live, `len` is `v`'s size; the kernel writes at most
    // `len` bytes of the option (a C struct or int for the options asked).
    let r = unsafe {
        call_real!(getsockopt(
            fd,
            level,
            name,
            (&mut v as *mut T).cast(),
            &mut len
        ))
    };
    (r == 0).then_some(v)
}

/// A new luna socket's connection options: `IP_TOS` set on the kernel socket `fd`
/// before it became luna's carries over (its ECN bits cleared), and `TCP_NODELAY` reads
/// what the stack does (its `tcp.nagle`) until set.
fn initial_conn_opts(o: &mut crate::sock::Opts, fd: c_int, nagle: bool) {
    o.tos = (sockopt_int(fd, libc::IPPROTO_IP, libc::IP_TOS).unwrap_or(0) as u8) & !0b11;
    o.nodelay = c_int::from(!nagle);
}

/// `TCP_NODELAY` or `IP_TOS` of `s` was set (`changed`: to a new value; `g` is its
/// state, released here): a connection it has (a listener's options go to its accepted
/// connections at accept) gets them from the poll thread.
fn pass_opts(s: &Arc<Sock>, g: std::sync::MutexGuard<'_, crate::sock::State>, changed: bool) {
    let connected = g.bfd.is_some() && !g.listener;
    drop(g);
    if changed && connected {
        if let Some(sh) = engine::engine() {
            sh.push(Cmd::Opts(Arc::clone(s)));
        }
    }
}

/// A kernel IPv4 TCP socket (the only kind luna takes over).
fn is_tcp4(fd: c_int) -> bool {
    sockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN) == Some(libc::AF_INET)
        && sockopt_int(fd, libc::SOL_SOCKET, libc::SO_TYPE) == Some(libc::SOCK_STREAM)
        && sockopt_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL) == Some(libc::IPPROTO_TCP)
}

/// A kernel socket not bound yet (a socket bound to a kernel address stays the kernel's).
fn unbound(fd: c_int) -> bool {
    // SAFETY: sockaddr_in is plain data; zeroed is valid.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as socklen_t;
    // SAFETY: `sin`/`len` are live and sized for an IPv4 address.
    let r = unsafe {
        call_real!(getsockname(
            fd,
            (&mut sin as *mut libc::sockaddr_in).cast(),
            &mut len
        ))
    };
    r == 0 && sin.sin_port == 0
}

/// An IPv4 address from C (`None`: not `AF_INET` or too short).
unsafe fn addr_in(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddrV4> {
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sockaddr_in>() {
        return None;
    }
    // SAFETY: the caller passes `len` readable bytes; sockaddr_in fits (checked).
    let sin = unsafe { std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in>()) };
    if sin.sin_family as c_int != libc::AF_INET {
        return None;
    }
    Some(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
        u16::from_be(sin.sin_port),
    ))
}

/// Writes `a` to a C address buffer of `*len` bytes (truncating like the kernel).
unsafe fn put_addr(a: SocketAddrV4, addr: *mut sockaddr, len: *mut socklen_t) -> Result<(), i32> {
    if addr.is_null() || len.is_null() {
        return Err(libc::EFAULT);
    }
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let full = std::mem::size_of::<libc::sockaddr_in>();
    // SAFETY: `len` is a valid pointer (checked non-null); `addr` has `*len` bytes.
    unsafe {
        let n = (*len as usize).min(full);
        std::ptr::copy_nonoverlapping(
            (&sin as *const libc::sockaddr_in).cast::<u8>(),
            addr.cast::<u8>(),
            n,
        );
        *len = full as socklen_t;
    }
    Ok(())
}

/// `iovcnt` C buffers as slices.
unsafe fn iov_slices<'a>(iov: *const iovec, cnt: c_int) -> Result<Vec<&'a mut [u8]>, i32> {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return Err(libc::EINVAL);
    }
    if cnt > 0 && iov.is_null() {
        return Err(libc::EFAULT);
    }
    let mut v = Vec::with_capacity(cnt as usize);
    for i in 0..cnt as usize {
        // SAFETY: the caller passes `cnt` iovecs.
        let io = unsafe { *iov.add(i) };
        if io.iov_len == 0 {
            continue;
        }
        if io.iov_base.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: each iovec describes `iov_len` bytes the caller owns.
        v.push(unsafe { std::slice::from_raw_parts_mut(io.iov_base.cast::<u8>(), io.iov_len) });
    }
    Ok(v)
}

unsafe fn buf_mut<'a>(buf: *mut c_void, n: size_t) -> Result<&'a mut [u8], i32> {
    if n == 0 {
        return Ok(&mut []);
    }
    if buf.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller passes `n` writable bytes.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), n) })
}

unsafe fn buf<'a>(buf: *const c_void, n: size_t) -> Result<&'a [u8], i32> {
    if n == 0 {
        return Ok(&[]);
    }
    if buf.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller passes `n` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) })
}

/// The most `MSG_TRUNC` discards in one call (a shorter read, as a stream allows).
const TRUNC_MAX: usize = 1 << 20;

/// `recv`/`recvfrom`'s data: into the caller's buffer, or with `MSG_TRUNC` discarded —
/// TCP's meaning on Linux: the bytes are consumed and counted, not copied, and the buffer
/// may be null — through a scratch buffer of at most [`TRUNC_MAX`] bytes.
///
/// # Safety
/// Without `MSG_TRUNC`, `b` is null or points to `n` writable bytes.
unsafe fn recv_into(
    fd: c_int,
    s: &Sock,
    b: *mut c_void,
    n: size_t,
    flags: c_int,
) -> Result<usize, i32> {
    if flags & libc::MSG_TRUNC != 0 && flags & libc::MSG_OOB == 0 {
        let mut scratch = vec![0u8; n.min(TRUNC_MAX)];
        return do_read(fd, s, vec![&mut scratch[..]], flags & !libc::MSG_TRUNC);
    }
    // SAFETY: the caller's contract.
    unsafe { buf_mut(b, n) }.and_then(|x| do_read(fd, s, vec![x], flags))
}

fn do_read(fd: c_int, s: &Sock, mut bufs: Vec<&mut [u8]>, flags: c_int) -> Result<usize, i32> {
    if flags & libc::MSG_OOB != 0 {
        // luna sends no urgent data and keeps none: Linux's answer when there is none
        // to read (`tcp_recv_urg`). Reading the stream's bytes instead would take them.
        return Err(libc::EINVAL);
    }
    let dontwait = flags & libc::MSG_DONTWAIT != 0;
    s.read(&mut bufs, flags, &|| {
        how_to_wait(fd, dontwait, libc::SO_RCVTIMEO)
    })
}

fn do_write(fd: c_int, s: &Arc<Sock>, bufs: &[&[u8]], flags: c_int) -> Result<usize, i32> {
    if flags & libc::MSG_OOB != 0 {
        // luna's TCP has no urgent pointer: sending the byte in-band would put it in the
        // peer's stream, where a Linux peer (without SO_OOBINLINE) never reads it.
        return Err(libc::EOPNOTSUPP);
    }
    let Some(sh) = engine::engine() else {
        return Err(libc::ENETDOWN);
    };
    let dontwait = flags & libc::MSG_DONTWAIT != 0;
    let r = s.write(sh, bufs, &|| how_to_wait(fd, dontwait, libc::SO_SNDTIMEO));
    if r == Err(libc::EPIPE) && flags & libc::MSG_NOSIGNAL == 0 {
        // As the kernel does for a stream socket without MSG_NOSIGNAL.
        // SAFETY: raising a signal at ourselves.
        unsafe { libc::raise(libc::SIGPIPE) };
    }
    r
}

// --- sockets ---------------------------------------------------------------------------

/// Serialises the port check and the binding of `bind` (two threads binding one port).
static BIND: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Whether binding a socket with `SO_REUSEADDR` = `reuse` to `other`'s port conflicts
/// with `other`, as Linux's TCP (`inet_csk_bind_conflict`, `SO_REUSEPORT` aside): luna
/// has one address, so `0.0.0.0` and luna's clash; both sockets setting `SO_REUSEADDR`
/// share a port unless `other` listens (two listeners never share one).
fn bind_conflicts(reuse: bool, other: &crate::sock::State) -> bool {
    let listening = matches!(other.phase, Phase::Listening | Phase::Opening);
    other.phase != Phase::Closed && !(reuse && other.opts.reuseaddr != 0 && !listening)
}

/// `EADDRINUSE` if a luna socket other than `me` holds `port` in a way that conflicts
/// with a new binding (`reuse`: its `SO_REUSEADDR`). Called under [`BIND`].
fn port_in_use(port: u16, me: Option<&Arc<Sock>>, reuse: bool) -> Result<(), i32> {
    if port == 0 {
        return Ok(());
    }
    let others: Vec<Arc<Sock>> = SOCKS
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .filter(|o| me.is_none_or(|m| !Arc::ptr_eq(m, o)))
        .cloned()
        .collect();
    // Each socket is locked alone, after the table's lock is released.
    let taken = others.iter().any(|o| {
        let g = o.lock();
        g.local.port() == port && bind_conflicts(reuse, &g)
    });
    if taken {
        Err(libc::EADDRINUSE)
    } else {
        Ok(())
    }
}

/// `bind(2)`: luna's address or `0.0.0.0` makes an IPv4 TCP socket luna's. A port
/// another luna socket of this process holds is `EADDRINUSE` now (`SO_REUSEADDR` as
/// Linux's TCP: [`bind_conflicts`]).
#[no_mangle]
pub unsafe extern "C-unwind" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    guard(|| {
        if !internal() {
            if let Some(s) = lookup(fd) {
                // SAFETY: C's contract for bind.
                let Some(a) = (unsafe { addr_in(addr, len) }) else {
                    return fail(libc::EAFNOSUPPORT);
                };
                let _b = BIND.lock().unwrap_or_else(|p| p.into_inner());
                let reuse = {
                    let g = s.lock();
                    if g.phase != Phase::Fresh || g.local.port() != 0 {
                        return fail(libc::EINVAL);
                    }
                    g.opts.reuseaddr != 0
                };
                if let Err(e) = port_in_use(a.port(), Some(&s), reuse) {
                    return fail(e);
                }
                s.lock().local = a;
                return 0;
            }
            // SAFETY: C's contract for bind.
            if let (Some(a), Some(net)) = (unsafe { addr_in(addr, len) }, engine::net()) {
                if (*a.ip() == net.ip || a.ip().is_unspecified()) && is_tcp4(fd) {
                    if engine::engine().is_none() {
                        return fail(libc::EADDRNOTAVAIL);
                    }
                    // Options set before bind went to the kernel socket; luna answers them
                    // from now on.
                    let opt = |name| sockopt_int(fd, libc::SOL_SOCKET, name).unwrap_or(0);
                    let s = Sock::new(Phase::Fresh, a);
                    {
                        let mut g = s.lock();
                        g.opts.reuseaddr = opt(libc::SO_REUSEADDR);
                        g.opts.reuseport = opt(libc::SO_REUSEPORT);
                        g.opts.keepalive = opt(libc::SO_KEEPALIVE);
                        initial_conn_opts(&mut g.opts, fd, net.cfg.tcp.nagle);
                    }
                    // EADDRINUSE here, as Linux reports it, not at listen.
                    let _b = BIND.lock().unwrap_or_else(|p| p.into_inner());
                    let reuse = s.lock().opts.reuseaddr != 0;
                    if let Err(e) = port_in_use(a.port(), None, reuse) {
                        return fail(e);
                    }
                    insert(fd, s, false);
                    return 0;
                }
            }
        }
        // SAFETY: forwarding the caller's arguments.
        unsafe { call_real!(bind(fd, addr, len)) }
    })
}

/// `listen(2)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn listen(fd: c_int, backlog: c_int) -> c_int {
    guard(|| {
        let Some(s) = lookup(fd) else {
            // SAFETY: forwarding.
            return unsafe { call_real!(listen(fd, backlog)) };
        };
        let Some(sh) = engine::engine() else {
            return fail(libc::ENETDOWN);
        };
        {
            let mut g = s.lock();
            g.backlog = if backlog <= 0 {
                128
            } else {
                backlog.min(65535) as usize
            };
            match g.phase {
                Phase::Listening => return 0,
                // luna has no ephemeral listening port.
                Phase::Fresh if g.local.port() == 0 => return fail(libc::EINVAL),
                Phase::Fresh => g.phase = Phase::Opening,
                _ => return fail(libc::EINVAL),
            }
        }
        sh.push(Cmd::Listen(Arc::clone(&s)));
        ret0(s.wait_reply())
    })
}

unsafe fn do_accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarding.
        return unsafe { call_real!(accept4(fd, addr, len, flags)) };
    };
    // SAFETY: C's contract for accept4.
    guard(|| unsafe { luna_accept(fd, &s, addr, len, flags) })
}

unsafe fn luna_accept(
    fd: c_int,
    s: &Sock,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let open = |flags: c_int| {
        // SAFETY: a plain socket(2); socket is not interposed.
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | flags, 0) }
    };
    // SAFETY: C's contract for accept4.
    unsafe { accept_with(fd, s, addr, len, flags, &open) }
}

/// [`luna_accept`] with `open` making the new descriptor's placeholder (`socket(2)`;
/// tests make it fail).
unsafe fn accept_with(
    fd: c_int,
    s: &Sock,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
    open: &dyn Fn(c_int) -> c_int,
) -> c_int {
    if flags & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) != 0 {
        return fail(libc::EINVAL);
    }
    let c = match s.accept(&|| how_to_wait(fd, false, libc::SO_RCVTIMEO)) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let nfd = open(flags);
    if nfd < 0 {
        let e = crate::errno();
        let mut g = s.lock();
        if g.phase == Phase::Listening {
            // Back to the queue, and readable again: another thread asleep in accept (or
            // an epoll set) must learn of it.
            g.accept_q.push_front(c);
            s.notify(&g);
        } else {
            // The listener was closed or shut down meanwhile, and its queued connections
            // reset (Linux's inet_csk_listen_stop): this one would be in nobody's hands,
            // its connection open in the stack for ever. Reset it as they were.
            drop(g);
            release(c, true);
        }
        return fail(e);
    }
    // An accepted socket is a clone of its listener on Linux (sk_clone_lock): it has
    // the listener's SO_LINGER, which its close reads from the placeholder.
    if let Some(l) = linger(fd).filter(|l| l.l_onoff != 0) {
        // SAFETY: sets a live linger struct of the size passed on our own new socket.
        unsafe {
            call_real!(setsockopt(
                nfd,
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&l as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as socklen_t
            ))
        };
    }
    let peer = c.lock().peer.unwrap_or(UNBOUND);
    insert(nfd, c, false);
    if !addr.is_null() {
        // SAFETY: C's contract for accept.
        let _ = unsafe { put_addr(peer, addr, len) };
    }
    nfd
}

/// `accept(2)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn accept(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> c_int {
    // SAFETY: C's contract for accept.
    unsafe { do_accept(fd, addr, len, 0) }
}

/// `accept4(2)`: `SOCK_NONBLOCK`/`SOCK_CLOEXEC` go to the new placeholder.
#[no_mangle]
pub unsafe extern "C-unwind" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    // SAFETY: C's contract for accept4.
    unsafe { do_accept(fd, addr, len, flags) }
}

/// `connect(2)`: an IPv4 TCP socket connecting to an address luna routes becomes luna's.
#[no_mangle]
pub unsafe extern "C-unwind" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: C's contract for connect.
    if let Some(r) = try_luna(|| unsafe { luna_connect(fd, addr, len) }) {
        return r;
    }
    // SAFETY: forwarding.
    unsafe { call_real!(connect(fd, addr, len)) }
}

unsafe fn luna_connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> Option<c_int> {
    Some({
        if internal() {
            return None;
        }
        // SAFETY: C's contract for connect.
        let a = unsafe { addr_in(addr, len) };
        let s = match lookup(fd) {
            Some(s) => s,
            None => {
                let take = match (a, engine::net()) {
                    (Some(a), Some(net)) => net.routes(*a.ip()) && is_tcp4(fd) && unbound(fd),
                    _ => false,
                };
                if !take {
                    return None;
                }
                let s = Sock::new(Phase::Fresh, UNBOUND);
                if engine::engine().is_none() {
                    return Some(fail(libc::ENETUNREACH));
                }
                {
                    let nagle = engine::net().is_some_and(|n| n.cfg.tcp.nagle);
                    initial_conn_opts(&mut s.lock().opts, fd, nagle);
                }
                insert(fd, Arc::clone(&s), false);
                s
            }
        };
        let Some(a) = a else {
            return Some(fail(libc::EAFNOSUPPORT));
        };
        let Some(sh) = engine::engine() else {
            return Some(fail(libc::ENETDOWN));
        };
        ret0(
            s.connect(&|| sh.push(Cmd::Connect(Arc::clone(&s), a)), &|| {
                how_to_wait(fd, false, libc::SO_SNDTIMEO)
            }),
        )
    })
}

/// `close(2)`: a luna socket closes gracefully after its queued bytes; the placeholder
/// closes now.
#[no_mangle]
pub unsafe extern "C-unwind" fn close(fd: c_int) -> c_int {
    let forgotten: Option<c_int> = try_luna(|| {
        if crate::vfork_child() {
            // Its own descriptor (the parent's luna socket stays open).
            return None;
        }
        let named = lookup(fd).is_some();
        if let Some(s) = remove(fd) {
            let l = linger(fd).filter(|l| l.l_onoff != 0);
            let zero = l.is_some_and(|l| l.l_linger == 0);
            let time = l
                .filter(|l| l.l_linger > 0)
                .map(|l| Duration::from_secs(l.l_linger as u64));
            release_lingering(s, zero, time);
        } else if !named {
            epoll::forget_set(fd);
        }
        None
    });
    if let Some(r) = forgotten {
        return r;
    }
    // SAFETY: forwarding (a luna socket's placeholder too).
    unsafe { call_real!(close(fd)) }
}

/// The luna sockets and epoll sets named by descriptors `first..=last`, released as
/// `close(2)` releases them (before the kernel closes the numbers, which it may then give
/// to new files: a number left in the table would send their I/O to the old socket).
fn release_range(first: c_int, last: c_int) {
    if !ACTIVE.load(Ordering::Acquire) || internal() || first > last {
        return;
    }
    if crate::vfork_child() {
        // CPython's subprocess closes every descriptor from 3 on in its vfork child
        // (close_fds): those are the child's own; the parent's luna sockets stay open.
        return;
    }
    let fds: Vec<c_int> = SOCKS
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .keys()
        .copied()
        .filter(|fd| (first..=last).contains(fd))
        .collect();
    for fd in fds {
        if let Some(s) = remove(fd) {
            release(s, linger_zero(fd));
        }
    }
    epoll::forget_sets_in(first, last);
}

/// `close_range(2)`: the luna sockets in the range are closed as by `close(2)` (unless
/// `CLOSE_RANGE_CLOEXEC`, which closes nothing now), then the kernel's call.
/// `CLOSE_RANGE_UNSHARE` is taken as a plain close (luna's socket table is the
/// process's).
#[no_mangle]
pub unsafe extern "C-unwind" fn close_range(
    first: libc::c_uint,
    last: libc::c_uint,
    flags: c_int,
) -> c_int {
    let known = (libc::CLOSE_RANGE_UNSHARE | libc::CLOSE_RANGE_CLOEXEC) as c_int;
    if flags & !known == 0 && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 && first <= last {
        if let Ok(lo) = c_int::try_from(first) {
            let hi = c_int::try_from(last).unwrap_or(c_int::MAX);
            let _ = try_luna::<c_int>(|| {
                release_range(lo, hi);
                None
            });
        }
    }
    // SAFETY: forwarding.
    unsafe { call_real!(close_range(first, last, flags)) }
}

/// `closefrom(3)`: the luna sockets from `lowfd` on are closed as by `close(2)`, then
/// libc's call.
#[no_mangle]
pub unsafe extern "C-unwind" fn closefrom(lowfd: c_int) {
    let _ = try_luna::<c_int>(|| {
        release_range(lowfd.max(0), c_int::MAX);
        None
    });
    match crate::real::real().closefrom {
        // SAFETY: forwarding.
        Some(f) => unsafe { f(lowfd) },
        None => {
            // SAFETY: the system call closefrom is made of (libc without the wrapper).
            unsafe { libc::syscall(libc::SYS_close_range, lowfd.max(0), u32::MAX, 0) };
        }
    }
}

/// `shutdown(2)`. On a listener, as Linux (`inet_shutdown`, `tcp_disconnect`):
/// `SHUT_WR` alone does nothing; `SHUT_RD`/`SHUT_RDWR` stop listening, close the
/// connections queued for `accept` and wake threads blocked in `accept`, which fail
/// with `EINVAL`.
#[no_mangle]
pub unsafe extern "C-unwind" fn shutdown(fd: c_int, how: c_int) -> c_int {
    guard(|| {
        let Some(s) = lookup(fd) else {
            // SAFETY: forwarding.
            return unsafe { call_real!(shutdown(fd, how)) };
        };
        if !(libc::SHUT_RD..=libc::SHUT_RDWR).contains(&how) {
            return fail(libc::EINVAL);
        }
        let mut g = s.lock();
        if g.phase == Phase::Listening {
            if how == libc::SHUT_WR {
                return 0;
            }
            // Bound, not listening (the port stays taken until close, as on Linux; a
            // new `listen` listens again).
            g.phase = Phase::Fresh;
            let queued: Vec<Arc<Sock>> = g.accept_q.drain(..).collect();
            s.notify(&g);
            drop(g);
            if let Some(sh) = engine::engine() {
                sh.push(Cmd::StopListen(Arc::clone(&s), queued));
            }
            return 0;
        }
        if g.phase != Phase::Connected {
            return fail(libc::ENOTCONN);
        }
        if how != libc::SHUT_WR {
            g.shut_rd = true;
        }
        let wr = how != libc::SHUT_RD && !g.shut_wr;
        if wr {
            g.shut_wr = true;
        }
        s.notify(&g);
        drop(g);
        if wr {
            if let Some(sh) = engine::engine() {
                sh.push(Cmd::Shutdown(Arc::clone(&s)));
            }
        }
        0
    })
}

// --- descriptor copies -----------------------------------------------------------------

/// `dup(2)`: the copy names the same luna socket.
#[no_mangle]
pub unsafe extern "C-unwind" fn dup(fd: c_int) -> c_int {
    // SAFETY: forwarding.
    let r = unsafe { call_real!(dup(fd)) };
    duplicated(fd, r, false);
    r
}

/// `dup2(2)`: `new` names `old`'s socket (a luna socket `new` named loses it).
#[no_mangle]
pub unsafe extern "C-unwind" fn dup2(old: c_int, new: c_int) -> c_int {
    let lz = linger_zero_of(old, new);
    // SAFETY: forwarding.
    let r = unsafe { call_real!(dup2(old, new)) };
    duplicated(old, r, lz);
    r
}

/// `dup3(2)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    let lz = linger_zero_of(old, new);
    // SAFETY: forwarding.
    let r = unsafe { call_real!(dup3(old, new, flags)) };
    duplicated(old, r, lz);
    r
}

/// `fcntl(2)`, for `F_DUPFD`/`F_DUPFD_CLOEXEC` (Python's `os.dup`); every command goes
/// to libc. Declared with the one word argument every command takes (an int or a
/// pointer: the variadic call passes it in the same register on the Linux ABIs, as
/// for `ioctl`).
#[no_mangle]
pub unsafe extern "C-unwind" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { call_real!(fcntl(fd, cmd, arg)) };
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        duplicated(fd, r, false);
    }
    r
}

/// `fcntl64`: glibc's name for `fcntl` in programs built with 64-bit file offsets.
#[no_mangle]
pub unsafe extern "C-unwind" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    let r = match real::real().fcntl64 {
        // SAFETY: forwarding the caller's arguments.
        Some(f) => unsafe { f(fd, cmd, arg) },
        // SAFETY: as above (fcntl64 is fcntl where it is missing).
        None => unsafe { call_real!(fcntl(fd, cmd, arg)) },
    };
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        duplicated(fd, r, false);
    }
    r
}

// --- data ------------------------------------------------------------------------------

/// `read(2)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn read(fd: c_int, b: *mut c_void, n: size_t) -> ssize_t {
    match lookup(fd) {
        Some(s) => {
            // SAFETY: C's contract for read.
            guard(|| ret_len(unsafe { buf_mut(b, n) }.and_then(|x| do_read(fd, &s, vec![x], 0))))
        }
        // SAFETY: forwarding.
        None => unsafe { call_real!(read(fd, b, n)) },
    }
}

/// `write(2)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn write(fd: c_int, b: *const c_void, n: size_t) -> ssize_t {
    match lookup(fd) {
        // SAFETY: C's contract for write.
        Some(s) => guard(|| ret_len(unsafe { buf(b, n) }.and_then(|x| do_write(fd, &s, &[x], 0)))),
        // SAFETY: forwarding.
        None => unsafe { call_real!(write(fd, b, n)) },
    }
}

/// `readv(2)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    match lookup(fd) {
        Some(s) => {
            // SAFETY: C's contract for readv.
            guard(|| ret_len(unsafe { iov_slices(iov, cnt) }.and_then(|v| do_read(fd, &s, v, 0))))
        }
        // SAFETY: forwarding.
        None => unsafe { call_real!(readv(fd, iov, cnt)) },
    }
}

/// `writev(2)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    match lookup(fd) {
        Some(s) => guard(|| {
            // SAFETY: C's contract for writev.
            ret_len(unsafe { iov_slices(iov, cnt) }.and_then(|v| {
                let v: Vec<&[u8]> = v.into_iter().map(|x| &*x).collect();
                do_write(fd, &s, &v, 0)
            }))
        }),
        // SAFETY: forwarding.
        None => unsafe { call_real!(writev(fd, iov, cnt)) },
    }
}

/// `send(2)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn send(
    fd: c_int,
    b: *const c_void,
    n: size_t,
    flags: c_int,
) -> ssize_t {
    match lookup(fd) {
        Some(s) => {
            // SAFETY: C's contract for send.
            guard(|| ret_len(unsafe { buf(b, n) }.and_then(|x| do_write(fd, &s, &[x], flags))))
        }
        // SAFETY: forwarding.
        None => unsafe { call_real!(send(fd, b, n, flags)) },
    }
}

/// `recv(2)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn recv(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    flags: c_int,
) -> ssize_t {
    match lookup(fd) {
        Some(s) => guard(|| {
            // SAFETY: C's contract for recv.
            ret_len(unsafe { recv_into(fd, &s, b, n, flags) })
        }),
        // SAFETY: forwarding.
        None => unsafe { call_real!(recv(fd, b, n, flags)) },
    }
}

/// `sendto(2)`: the address is ignored on a connected stream socket, as Linux does.
#[no_mangle]
pub unsafe extern "C-unwind" fn sendto(
    fd: c_int,
    b: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    match lookup(fd) {
        Some(s) => {
            // SAFETY: C's contract for sendto.
            guard(|| ret_len(unsafe { buf(b, n) }.and_then(|x| do_write(fd, &s, &[x], flags))))
        }
        // SAFETY: forwarding.
        None => unsafe { call_real!(sendto(fd, b, n, flags, addr, len)) },
    }
}

/// `recvfrom(2)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn recvfrom(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    match lookup(fd) {
        Some(s) => guard(|| {
            // SAFETY: C's contract for recvfrom.
            let r = unsafe { recv_into(fd, &s, b, n, flags) };
            if r.is_ok() && !addr.is_null() {
                let peer = s.lock().peer.unwrap_or(UNBOUND);
                // SAFETY: C's contract for recvfrom.
                let _ = unsafe { put_addr(peer, addr, len) };
            }
            ret_len(r)
        }),
        // SAFETY: forwarding.
        None => unsafe { call_real!(recvfrom(fd, b, n, flags, addr, len)) },
    }
}

/// `sendmsg(2)`: the data only (no ancillary data on a luna socket).
#[no_mangle]
pub unsafe extern "C-unwind" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    match lookup(fd) {
        Some(s) => guard(|| {
            if msg.is_null() {
                return fail(libc::EFAULT);
            }
            // SAFETY: C's contract for sendmsg: `msg` is a valid msghdr.
            let m = unsafe { &*msg };
            // SAFETY: its iovecs are valid.
            ret_len(
                unsafe { iov_slices(m.msg_iov, m.msg_iovlen as c_int) }.and_then(|v| {
                    let v: Vec<&[u8]> = v.into_iter().map(|x| &*x).collect();
                    do_write(fd, &s, &v, flags)
                }),
            )
        }),
        // SAFETY: forwarding.
        None => unsafe { call_real!(sendmsg(fd, msg, flags)) },
    }
}

/// `recvmsg(2)`: data and the peer's address; no ancillary data.
#[no_mangle]
pub unsafe extern "C-unwind" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    match lookup(fd) {
        Some(s) => guard(|| {
            if msg.is_null() {
                return fail(libc::EFAULT);
            }
            // SAFETY: C's contract for recvmsg: `msg` is a valid msghdr.
            let m = unsafe { &mut *msg };
            // SAFETY: its iovecs are valid.
            let r = unsafe { iov_slices(m.msg_iov, m.msg_iovlen as c_int) }
                .and_then(|v| do_read(fd, &s, v, flags));
            if r.is_ok() {
                m.msg_controllen = 0;
                m.msg_flags = 0;
                if !m.msg_name.is_null() {
                    let peer = s.lock().peer.unwrap_or(UNBOUND);
                    let mut l = m.msg_namelen;
                    // SAFETY: msg_name has msg_namelen bytes.
                    let _ = unsafe { put_addr(peer, m.msg_name.cast(), &mut l) };
                    m.msg_namelen = l;
                }
            }
            ret_len(r)
        }),
        // SAFETY: forwarding.
        None => unsafe { call_real!(recvmsg(fd, msg, flags)) },
    }
}

// --- options and addresses -------------------------------------------------------------

/// `setsockopt(2)`: the common options are kept here; others go to the placeholder.
#[no_mangle]
pub unsafe extern "C-unwind" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    guard(|| {
        let Some(s) = lookup(fd) else {
            // SAFETY: forwarding.
            return unsafe { call_real!(setsockopt(fd, level, name, val, len)) };
        };
        if level == libc::IPPROTO_IP && matches!(name, libc::IP_TOS | libc::IP_TTL) {
            // SAFETY: C's contract for setsockopt: `val` has `len` bytes.
            return match unsafe { ip_int(val, len) } {
                Ok(v) => ret0(set_ip_opt(&s, name, v)),
                Err(e) => fail(e),
            };
        }
        let mut g = s.lock();
        let o = &mut g.opts;
        let slot = match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => Some(&mut o.reuseaddr),
            (libc::SOL_SOCKET, libc::SO_REUSEPORT) => Some(&mut o.reuseport),
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => Some(&mut o.keepalive),
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => Some(&mut o.rcvbuf),
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => Some(&mut o.sndbuf),
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => Some(&mut o.nodelay),
            _ => None,
        };
        match slot {
            Some(slot) => {
                if val.is_null() || (len as usize) < std::mem::size_of::<c_int>() {
                    return fail(libc::EINVAL);
                }
                // SAFETY: `val` has at least an int (checked).
                let v = unsafe { std::ptr::read_unaligned(val.cast::<c_int>()) };
                if level == libc::IPPROTO_TCP {
                    // TCP_NODELAY: Linux keeps a flag (any non-zero value reads 1).
                    let v = c_int::from(v != 0);
                    let changed = *slot != v;
                    *slot = v;
                    pass_opts(&s, g, changed);
                } else {
                    *slot = v;
                }
                0
            }
            None => {
                drop(g);
                // The placeholder answers the rest (timeouts, linger, keepalive timers):
                // accepted, with no effect on luna.
                // SAFETY: forwarding.
                unsafe { call_real!(setsockopt(fd, level, name, val, len)) }
            }
        }
    })
}

/// The TTL of every datagram luna sends: r2c builds its stack with `StackConfig`'s
/// default (64, Linux's `ip_default_ttl`); its configuration has no key for it and the
/// stack no per-connection TTL.
const LUNA_TTL: c_int = 64;

/// An `IPPROTO_IP` option's value as Linux's `do_ip_setsockopt` reads it: an int, or
/// one byte when fewer than four are given; `EINVAL` for none, `EFAULT` for null.
unsafe fn ip_int(val: *const c_void, len: socklen_t) -> Result<c_int, i32> {
    if len as usize >= std::mem::size_of::<c_int>() {
        if val.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: `val` has at least an int (checked).
        Ok(unsafe { std::ptr::read_unaligned(val.cast::<c_int>()) })
    } else if len >= 1 {
        if val.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: `val` has at least one byte (checked).
        Ok(c_int::from(unsafe { *val.cast::<u8>() }))
    } else {
        Err(libc::EINVAL)
    }
}

/// `IP_TOS` / `IP_TTL` on a luna socket. `IP_TOS` as Linux for TCP (any value; the
/// ECN bits stay the socket's own, 0 here), its DiffServ codepoint passed to the
/// connection (now, or at connect/accept). `IP_TTL`: -1 (the default) or luna's TTL
/// are accepted and change nothing; outside 1..=255 `EINVAL` as Linux; any other TTL
/// `ENOPROTOOPT`: luna's TTL is one for the whole stack, and a TTL that would not be
/// used is refused rather than claimed.
fn set_ip_opt(s: &Arc<Sock>, name: c_int, v: c_int) -> Result<(), i32> {
    if name == libc::IP_TTL {
        return match v {
            -1 | LUNA_TTL => Ok(()),
            v if !(1..=255).contains(&v) => Err(libc::EINVAL),
            _ => Err(libc::ENOPROTOOPT),
        };
    }
    let mut g = s.lock();
    // (Linux stores the int in a byte: `inet->tos`.)
    let tos = (v as u8) & !0b11;
    let changed = g.opts.tos != tos;
    g.opts.tos = tos;
    pass_opts(s, g, changed);
    Ok(())
}

/// `getsockopt(2)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    guard(|| {
        let Some(s) = lookup(fd) else {
            // SAFETY: forwarding.
            return unsafe { call_real!(getsockopt(fd, level, name, val, len)) };
        };
        if (level, name) == (libc::IPPROTO_TCP, libc::TCP_INFO) {
            // SAFETY: C's contract for getsockopt.
            return unsafe { tcp_info(&s, val, len) };
        }
        let mut g = s.lock();
        let v = match (level, name) {
            (libc::SOL_SOCKET, libc::SO_ERROR) => g.so_error.take().unwrap_or(0),
            (libc::SOL_SOCKET, libc::SO_TYPE) => libc::SOCK_STREAM,
            (libc::SOL_SOCKET, libc::SO_DOMAIN) => libc::AF_INET,
            (libc::SOL_SOCKET, libc::SO_PROTOCOL) => libc::IPPROTO_TCP,
            (libc::SOL_SOCKET, libc::SO_ACCEPTCONN) => (g.phase == Phase::Listening) as c_int,
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => g.opts.reuseaddr,
            (libc::SOL_SOCKET, libc::SO_REUSEPORT) => g.opts.reuseport,
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => g.opts.keepalive,
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => g.opts.rcvbuf,
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => g.opts.sndbuf,
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => g.opts.nodelay,
            (libc::IPPROTO_IP, libc::IP_TOS) => c_int::from(g.opts.tos),
            (libc::IPPROTO_IP, libc::IP_TTL) => LUNA_TTL,
            _ => {
                drop(g);
                // SAFETY: forwarding.
                return unsafe { call_real!(getsockopt(fd, level, name, val, len)) };
            }
        };
        if val.is_null() || len.is_null() {
            return fail(libc::EFAULT);
        }
        // SAFETY: `len` is valid (checked); `val` has `*len` bytes.
        unsafe {
            if level == libc::IPPROTO_IP && (1..4).contains(&*len) {
                // Linux's do_ip_getsockopt: one byte for a short buffer.
                *val.cast::<u8>() = v as u8;
                *len = 1;
                return 0;
            }
            if (*len as usize) < std::mem::size_of::<c_int>() {
                return fail(libc::EINVAL);
            }
            std::ptr::write_unaligned(val.cast::<c_int>(), v);
            *len = std::mem::size_of::<c_int>() as socklen_t;
        }
        0
    })
}

/// `getsockopt(fd, IPPROTO_TCP, TCP_INFO, val, len)` of a luna socket: the poll thread
/// fills Linux's `struct tcp_info` from the connection (state, RTT, windows, counters;
/// `engine::tcp_info_of`), and, as Linux's `do_tcp_getsockopt`, the first
/// `min(*len, sizeof)` bytes are copied and `*len` set to them.
///
/// # Safety
/// `val` must be writable for `*len` bytes and `len` valid, as getsockopt(2) requires.
unsafe fn tcp_info(s: &Arc<Sock>, val: *mut c_void, len: *mut socklen_t) -> c_int {
    if len.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: `len` is valid (checked).
    let want = unsafe { *len };
    if (want as i32) < 0 {
        return fail(libc::EINVAL);
    }
    let Some(sh) = engine::engine() else {
        return fail(libc::ENETDOWN);
    };
    sh.push(Cmd::Info(Arc::clone(s)));
    if let Err(e) = s.wait_reply() {
        return fail(e);
    }
    let Some(info) = s.lock().tcp_info.take() else {
        return fail(libc::EIO);
    };
    let n = (want as usize).min(std::mem::size_of::<libc::tcp_info>());
    if n > 0 && val.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: `info` is a live tcp_info of at least `n` bytes; `val` has `*len` >= `n`
    // writable bytes (the caller's contract); `len` is valid.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&*info as *const libc::tcp_info).cast::<u8>(),
            val.cast::<u8>(),
            n,
        );
        *len = n as socklen_t;
    }
    0
}

/// `getsockname(2)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn getsockname(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> c_int {
    match lookup(fd) {
        Some(s) => guard(|| {
            let a = s.lock().local;
            // SAFETY: C's contract for getsockname.
            ret0(unsafe { put_addr(a, addr, len) })
        }),
        // SAFETY: forwarding.
        None => unsafe { call_real!(getsockname(fd, addr, len)) },
    }
}

/// `getpeername(2)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn getpeername(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> c_int {
    match lookup(fd) {
        Some(s) => guard(|| {
            let g = s.lock();
            match (g.phase, g.peer) {
                (Phase::Connected, Some(a)) => {
                    drop(g);
                    // SAFETY: C's contract for getpeername.
                    ret0(unsafe { put_addr(a, addr, len) })
                }
                _ => fail(libc::ENOTCONN),
            }
        }),
        // SAFETY: forwarding.
        None => unsafe { call_real!(getpeername(fd, addr, len)) },
    }
}

/// `ioctl(2)`: `FIONREAD`/`TIOCOUTQ` on a luna socket; everything else (`FIONBIO` too,
/// which sets the placeholder's `O_NONBLOCK`) goes to libc. Declared with the one
/// pointer argument every socket ioctl takes (the variadic call passes it in the same
/// register on the Linux ABIs).
#[no_mangle]
pub unsafe extern "C-unwind" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    guard(|| {
        if let Some(s) = lookup(fd) {
            let v = match req {
                libc::FIONREAD => Some(s.readable()),
                libc::TIOCOUTQ => Some(s.lock().tx.len()),
                _ => None,
            };
            if let Some(v) = v {
                if arg.is_null() {
                    return fail(libc::EFAULT);
                }
                // SAFETY: these requests take an int pointer.
                unsafe {
                    std::ptr::write_unaligned(
                        arg.cast::<c_int>(),
                        v.min(c_int::MAX as usize) as c_int,
                    )
                };
                return 0;
            }
        }
        // SAFETY: forwarding.
        unsafe { call_real!(ioctl(fd, req, arg)) }
    })
}

// --- readiness -------------------------------------------------------------------------

/// `epoll_ctl(2)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut epoll_event,
) -> c_int {
    match lookup(fd) {
        Some(s) => guard(|| {
            // SAFETY: `ev` is null or a valid epoll_event.
            let e = (!ev.is_null()).then(|| unsafe { std::ptr::read_unaligned(ev) });
            ret0(epoll::ctl(epfd, op, fd, s, e))
        }),
        // SAFETY: forwarding.
        None => unsafe { call_real!(epoll_ctl(epfd, op, fd, ev)) },
    }
}

unsafe fn events<'a>(ev: *mut epoll_event, max: c_int) -> Result<&'a mut [epoll_event], i32> {
    if max <= 0 {
        return Err(libc::EINVAL);
    }
    if ev.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller passes room for `max` events.
    Ok(unsafe { std::slice::from_raw_parts_mut(ev, max as usize) })
}

/// `epoll_wait(2)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn epoll_wait(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    let set = if internal() { None } else { epoll::set(epfd) };
    let Some(set) = set else {
        // SAFETY: forwarding.
        return unsafe { call_real!(epoll_wait(epfd, ev, max, timeout)) };
    };
    guard(|| {
        // SAFETY: C's contract for epoll_wait.
        let out = match unsafe { events(ev, max) } {
            Ok(o) => o,
            Err(e) => return fail(e),
        };
        epoll::wait(&set, out, timeout, &mut |b, t| {
            // SAFETY: `b` is a live part of the caller's array.
            unsafe { call_real!(epoll_wait(epfd, b.as_mut_ptr(), b.len() as c_int, t)) }
        })
    })
}

/// `epoll_pwait(2)`: the signal mask applies while waiting in the kernel.
#[no_mangle]
pub unsafe extern "C-unwind" fn epoll_pwait(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    let set = if internal() { None } else { epoll::set(epfd) };
    let Some(set) = set else {
        // SAFETY: forwarding.
        return unsafe { call_real!(epoll_pwait(epfd, ev, max, timeout, mask)) };
    };
    // SAFETY: C's contract for epoll_pwait.
    guard(|| unsafe { pwait_luna_set(&set, epfd, ev, max, Ok(timeout), mask) })
}

/// `epoll_pwait`/`epoll_pwait2` on `set`, an epoll set holding luna sockets: the caller's
/// events array checked, then the mixed wait until `timeout` (ms, -1: forever; or the
/// error of a bad one), the kernel part in real `epoll_pwait` slices with `mask`.
///
/// # Safety
/// `ev` points to `max` writable events (C's contract).
unsafe fn pwait_luna_set(
    set: &epoll::Set,
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    timeout: Result<c_int, i32>,
    mask: *const libc::sigset_t,
) -> c_int {
    let timeout = match timeout {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    // SAFETY: the caller's contract.
    let out = match unsafe { events(ev, max) } {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    epoll::wait(set, out, timeout, &mut |b, t| {
        // SAFETY: `b` is a live part of the caller's array.
        unsafe { call_real!(epoll_pwait(epfd, b.as_mut_ptr(), b.len() as c_int, t, mask)) }
    })
}

/// `epoll_pwait2(2)`: `epoll_pwait` with a timespec timeout (null: forever; invalid:
/// `EINVAL`), kept to the millisecond, rounded up, for a set that holds luna sockets (its
/// kernel part is waited in the real `epoll_pwait` slices with the caller's mask). Without
/// it such a set was waited as its kernel part alone: luna's readiness never reported.
#[no_mangle]
pub unsafe extern "C-unwind" fn epoll_pwait2(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    let set = if internal() { None } else { epoll::set(epfd) };
    let Some(set) = set else {
        // SAFETY: forwarding.
        return unsafe { call_real!(epoll_pwait2(epfd, ev, max, ts, mask)) };
    };
    guard(|| {
        // SAFETY: `ts` is null or a valid timespec (C's contract for epoll_pwait2).
        let timeout = select::timespec((!ts.is_null()).then(|| unsafe { *ts })).map(|t| {
            t.map_or(-1, |d| {
                c_int::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(c_int::MAX)
            })
        });
        // SAFETY: C's contract for epoll_pwait2.
        unsafe { pwait_luna_set(&set, epfd, ev, max, timeout, mask) }
    })
}

/// Luna descriptors of a poll array: (index, fd, socket).
type LunaFds = Vec<(usize, c_int, Arc<Sock>)>;

fn luna_fds(p: &[libc::pollfd]) -> LunaFds {
    p.iter()
        .enumerate()
        .filter_map(|(i, x)| lookup(x.fd).map(|s| (i, x.fd, s)))
        .collect()
}

/// The deadline of a timeout (`None`: forever; far timeouts saturate to forever).
fn deadline_of(t: Option<Duration>) -> Option<Instant> {
    t.and_then(|t| Instant::now().checked_add(t))
}

/// poll(2) over `p`, whose `luna` entries are luna sockets: their readiness is checked
/// between kernel waits of at most 1 ms. `kernel(p, ms)` is the real wait, with the luna
/// entries hidden (fd -1, which poll ignores).
fn poll_mixed(
    p: &mut [libc::pollfd],
    luna: &[(usize, c_int, Arc<Sock>)],
    deadline: Option<Instant>,
    kernel: &mut dyn FnMut(&mut [libc::pollfd], c_int) -> c_int,
) -> c_int {
    loop {
        let mut ready = 0;
        for (i, _, s) in luna {
            let m = s.lock().mask() as libc::c_short;
            let want = p[*i].events | libc::POLLERR | libc::POLLHUP;
            p[*i].revents = m & want;
            if p[*i].revents != 0 {
                ready += 1;
            }
        }
        let slice = if ready > 0 || deadline.is_some_and(|d| Instant::now() >= d) {
            0
        } else {
            1
        };
        for (i, _, _) in luna {
            p[*i].fd = -1;
        }
        let r = kernel(p, slice);
        for (i, fd, s) in luna {
            p[*i].fd = *fd;
            let m = s.lock().mask() as libc::c_short;
            p[*i].revents = m & (p[*i].events | libc::POLLERR | libc::POLLHUP);
        }
        if r < 0 {
            return r;
        }
        let total = r + luna.iter().filter(|(i, _, _)| p[*i].revents != 0).count() as c_int;
        if total > 0 || slice == 0 {
            return total;
        }
    }
}

/// `poll(2)` over luna and kernel descriptors: luna readiness is checked between
/// kernel waits of at most 1 ms.
#[no_mangle]
pub unsafe extern "C-unwind" fn poll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    let wait = || Ok((timeout >= 0).then(|| Duration::from_millis(timeout as u64)));
    let mut kernel = |p: &mut [libc::pollfd], ms: c_int| {
        // SAFETY: the caller's array (luna entries masked with fd -1).
        unsafe { call_real!(poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms)) }
    };
    // SAFETY: C's contract for poll.
    match unsafe { poll_luna(fds, n, wait, &mut kernel) } {
        Some(r) => r,
        // SAFETY: forwarding.
        None => unsafe { call_real!(poll(fds, n, timeout)) },
    }
}

/// poll(2)/ppoll(2) on the caller's `n` pollfds: `None` when the shim is off or none of
/// them is a luna socket (the caller forwards to libc); else the mixed wait until the
/// timeout `wait` gives (`None`: forever; or the error of a bad one), the kernel's part
/// through `kernel`.
///
/// # Safety
/// `fds` is null or points to `n` pollfds (C's contract).
unsafe fn poll_luna(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    wait: impl FnOnce() -> Result<Option<Duration>, i32>,
    kernel: &mut dyn FnMut(&mut [libc::pollfd], c_int) -> c_int,
) -> Option<c_int> {
    if !ACTIVE.load(Ordering::Acquire) || internal() || n == 0 || fds.is_null() || n > 65536 {
        return None;
    }
    let luna = {
        // SAFETY: the caller passes `n` pollfds.
        luna_fds(unsafe { std::slice::from_raw_parts(fds, n as usize) })
    };
    if luna.is_empty() {
        return None;
    }
    Some(guard(|| {
        let t = match wait() {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        // SAFETY: the caller passes `n` pollfds.
        let p = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
        poll_mixed(p, &luna, deadline_of(t), kernel)
    }))
}

/// The kernel's part of a wait as ppoll(2) slices of `ms` with the caller's signal mask
/// (`ppoll`, `pselect`): a signal the mask unblocks ends the call with `EINTR`.
fn ppoll_slices(mask: *const libc::sigset_t) -> impl FnMut(&mut [libc::pollfd], c_int) -> c_int {
    move |p, ms| {
        let slice = libc::timespec {
            tv_sec: 0,
            tv_nsec: ms as libc::c_long * 1_000_000,
        };
        // SAFETY: a live poll array (luna entries hidden) and timespec; the caller's mask
        // (or null).
        unsafe { call_real!(ppoll(p.as_mut_ptr(), p.len() as libc::nfds_t, &slice, mask)) }
    }
}

/// `ppoll(2)`: as `poll`, with a timespec timeout (null: forever; invalid: `EINVAL`) and
/// `mask` applied while waiting in the kernel (each slice is a real `ppoll` with it, so a
/// signal it unblocks ends the call with `EINTR`). Without it a luna socket was polled as
/// its kernel placeholder, an unconnected socket: `POLLHUP` at once (OpenSSH's client
/// waits in `ppoll` and failed its key exchange).
#[no_mangle]
pub unsafe extern "C-unwind" fn ppoll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: `ts` is null or a valid timespec (C's contract for ppoll).
    let wait = || select::timespec((!ts.is_null()).then(|| unsafe { *ts }));
    // SAFETY: C's contract for ppoll.
    match unsafe { poll_luna(fds, n, wait, &mut ppoll_slices(mask)) } {
        Some(r) => r,
        // SAFETY: forwarding.
        None => unsafe { call_real!(ppoll(fds, n, ts, mask)) },
    }
}

/// Whether a luna socket is in one of the sets (never on the shim's own threads).
///
/// # Safety
/// select(2)'s contract: each non-null set holds `nfds` bits.
unsafe fn sets_have_luna(sets: &Sets) -> bool {
    if !ACTIVE.load(Ordering::Acquire) || internal() || sets.nfds == 0 {
        return false;
    }
    let t = SOCKS.read().unwrap_or_else(|p| p.into_inner());
    if t.is_empty() {
        return false;
    }
    if sets.nfds <= libc::FD_SETSIZE {
        // SAFETY: the caller's contract.
        unsafe { sets.fds() }.iter().any(|fd| t.contains_key(fd))
    } else {
        // An oversized set: test the bits of the luna descriptors only (each is open,
        // so below the process's descriptor limit, where the kernel would read too).
        // SAFETY: the caller's contract.
        t.keys().any(|&fd| unsafe { sets.contains(fd) })
    }
}

/// select/pselect with a luna socket in a set: the sets become a poll array for
/// [`poll_mixed`] (`kernel(p, ms)` is the real wait) and are rewritten in place.
///
/// # Safety
/// select(2)'s contract for `sets`.
unsafe fn select_mixed(
    sets: &Sets,
    timeout: Option<Duration>,
    kernel: &mut dyn FnMut(&mut [libc::pollfd], c_int) -> c_int,
) -> Result<c_int, i32> {
    // glibc's FD_SET aborts beyond FD_SETSIZE (fortify); the sets luna reads are
    // FD_SETSIZE bits.
    if sets.nfds > libc::FD_SETSIZE {
        return Err(libc::EINVAL);
    }
    let deadline = deadline_of(timeout);
    // SAFETY: the caller's contract.
    let mut p = unsafe { sets.poll_array() };
    let luna = luna_fds(&p);
    for x in &p {
        if !luna.iter().any(|(_, fd, _)| *fd == x.fd)
            // SAFETY: F_GETFD takes no argument; libc's fcntl on a plain number.
            && unsafe { call_real!(fcntl(x.fd, libc::F_GETFD, 0)) } < 0
        {
            return Err(libc::EBADF);
        }
    }
    let r = poll_mixed(&mut p, &luna, deadline, kernel);
    if r < 0 {
        return Err(crate::errno());
    }
    // A descriptor closed meanwhile (poll's POLLNVAL) is select's EBADF.
    if p.iter().any(|x| x.revents & libc::POLLNVAL != 0) {
        return Err(libc::EBADF);
    }
    // SAFETY: the caller's writable sets.
    Ok(unsafe { sets.write_back(&p) })
}

/// The sets of a select call if one of them names a luna socket (`None`: libc's call,
/// also for a negative `nfds`, which libc refuses with EINVAL).
///
/// # Safety
/// select(2)'s contract for the sets.
unsafe fn luna_sets(nfds: c_int, sets: [*mut libc::fd_set; 3]) -> Option<Sets> {
    let s = Sets {
        nfds: usize::try_from(nfds).ok()?,
        sets,
    };
    // SAFETY: the caller's contract.
    unsafe { sets_have_luna(&s) }.then_some(s)
}

/// `select(2)`: with a luna socket in a set, served by the mixed poll path (readable:
/// data, end of stream, an error or a pending connection; writable; exceptional:
/// `POLLPRI`, never on luna); the timeval gets the time left, as Linux does. Without
/// one, libc's.
#[no_mangle]
pub unsafe extern "C-unwind" fn select(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    tv: *mut libc::timeval,
) -> c_int {
    // SAFETY: C's contract for select.
    let Some(sets) = (unsafe { luna_sets(nfds, [r, w, e]) }) else {
        // SAFETY: forwarding.
        return unsafe { call_real!(select(nfds, r, w, e, tv)) };
    };
    guard(|| {
        // SAFETY: `tv` is null or a valid timeval.
        let t = match select::timeval((!tv.is_null()).then(|| unsafe { *tv })) {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        let deadline = deadline_of(t);
        let mut kernel = |p: &mut [libc::pollfd], ms: c_int| {
            // SAFETY: a live poll array.
            unsafe { call_real!(poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms)) }
        };
        // SAFETY: C's contract for select.
        let res = unsafe { select_mixed(&sets, t, &mut kernel) };
        if let (Some(d), false) = (deadline, t == Some(Duration::ZERO)) {
            // Linux writes the time left back (poll_select_finish), whatever the result.
            // SAFETY: `tv` is non-null (a deadline came from it) and writable.
            unsafe { *tv = select::left(d.saturating_duration_since(Instant::now())) };
        }
        match res {
            Ok(n) => n,
            Err(e) => fail(e),
        }
    })
}

/// `__select`: glibc's other name for `select` (the same function).
#[no_mangle]
pub unsafe extern "C-unwind" fn __select(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    tv: *mut libc::timeval,
) -> c_int {
    // SAFETY: C's contract for select.
    unsafe { select(nfds, r, w, e, tv) }
}

/// `pselect(2)`: as `select`, with a timespec left unchanged and `mask` applied while
/// waiting in the kernel (each slice is a `ppoll` with it, so a signal it unblocks
/// interrupts the call with `EINTR`).
#[no_mangle]
pub unsafe extern "C-unwind" fn pselect(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: C's contract for pselect.
    let Some(sets) = (unsafe { luna_sets(nfds, [r, w, e]) }) else {
        // SAFETY: forwarding.
        return unsafe { call_real!(pselect(nfds, r, w, e, ts, mask)) };
    };
    guard(|| {
        // SAFETY: `ts` is null or a valid timespec.
        let t = match select::timespec((!ts.is_null()).then(|| unsafe { *ts })) {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        // SAFETY: C's contract for pselect.
        let res = unsafe { select_mixed(&sets, t, &mut ppoll_slices(mask)) };
        match res {
            Ok(n) => n,
            Err(e) => fail(e),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread blocked reading a socket whose last descriptor another thread closes
    /// wakes with ENOTCONN instead of sleeping for ever (blocked calls sleep without a
    /// timeout, so only a notification ends the sleep).
    #[test]
    fn closing_the_last_descriptor_wakes_a_blocked_read() {
        let s = Sock::new(
            Phase::Connected,
            SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 6379),
        );
        let s2 = Arc::clone(&s);
        let t = std::thread::spawn(move || s2.read(&mut [&mut [0u8; 4]], 0, &|| Wait::Forever));
        let start = std::time::Instant::now();
        while s.sleepers() == 0 {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "never slept"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        release(Arc::clone(&s), false);
        assert_eq!(t.join().unwrap(), Err(libc::ENOTCONN));
    }

    /// A thread blocked in connect(2) whose socket another thread closes: the close
    /// ends the handshake (the poll thread drops the connection and nothing more is
    /// notified), so the connect fails with ECONNABORTED, as Linux's
    /// `__inet_stream_connect` does when the socket is disconnected under it, instead
    /// of sleeping for ever.
    #[test]
    fn closing_the_last_descriptor_wakes_a_blocked_connect() {
        let s = Sock::new(Phase::Connecting, UNBOUND);
        let s2 = Arc::clone(&s);
        let t = std::thread::spawn(move || s2.wait_connected(None, libc::EINPROGRESS));
        let start = std::time::Instant::now();
        while s.sleepers() == 0 {
            assert!(start.elapsed() < Duration::from_secs(10), "never slept");
            std::thread::sleep(Duration::from_millis(1));
        }
        release(Arc::clone(&s), false);
        let r = crate::sock::ends_soon(&s, t, "connect after the close");
        assert_eq!(r, Err(libc::ECONNABORTED));
    }

    #[test]
    fn addresses_round_trip_and_truncate() {
        let a = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 6379);
        // SAFETY: sockaddr_in is plain data; all zeroes is a valid value.
        let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as socklen_t;
        // SAFETY: `sin` is a live sockaddr_in of `len` bytes.
        unsafe { put_addr(a, (&mut sin as *mut libc::sockaddr_in).cast(), &mut len) }.unwrap();
        assert_eq!(len, 16);
        // SAFETY: `sin` is a live sockaddr_in of `len` bytes.
        let back = unsafe { addr_in((&sin as *const libc::sockaddr_in).cast(), len) };
        assert_eq!(back, Some(a));
        assert_eq!(
            // SAFETY: `sin` holds at least 8 bytes.
            unsafe { addr_in((&sin as *const libc::sockaddr_in).cast(), 8) },
            None,
            "short"
        );
        let mut small = [0u8; 4];
        let mut len = 4;
        // SAFETY: `small` is a live buffer of `len` (4) bytes.
        unsafe { put_addr(a, small.as_mut_ptr().cast(), &mut len) }.unwrap();
        assert_eq!(len, 16, "the full size is reported");
        assert_eq!(small[..2], (libc::AF_INET as u16).to_ne_bytes());
        assert_eq!(
            // SAFETY: a null address is refused before it is written.
            unsafe { put_addr(a, std::ptr::null_mut(), &mut len) },
            Err(libc::EFAULT)
        );
    }

    #[test]
    fn iovecs_are_checked() {
        assert_eq!(
            // SAFETY: a negative count is refused before the pointer is read.
            unsafe { iov_slices(std::ptr::null(), -1) }.err(),
            Some(libc::EINVAL)
        );
        assert_eq!(
            // SAFETY: a null array is refused before it is read.
            unsafe { iov_slices(std::ptr::null(), 1) }.err(),
            Some(libc::EFAULT)
        );
        let mut a = [1u8, 2];
        let io = [
            iovec {
                iov_base: a.as_mut_ptr().cast(),
                iov_len: 2,
            },
            iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            },
        ];
        // SAFETY: `io` holds two live iovecs over `a` and an empty one.
        let v = unsafe { iov_slices(io.as_ptr(), 2) }.unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(&*v[0], &[1, 2]);
    }

    /// A connected luna socket (its placeholder a pipe) registered in a new epoll set for
    /// `events` with user data `data`: (socket, its descriptor, the pipe's other end, the
    /// set's descriptor).
    fn luna_in_epoll(events: u32, data: u64) -> (Arc<Sock>, c_int, c_int, c_int) {
        let s = Sock::new(Phase::Connected, UNBOUND);
        let (fd, ph) = luna_at_pipe(Arc::clone(&s));
        // SAFETY: plain system call.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0);
        let mut ev = epoll_event { events, u64: data };
        assert_eq!(
            // SAFETY: a live event for a descriptor this test owns.
            unsafe { epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) },
            0
        );
        (s, fd, ph, ep)
    }

    /// Turns luna on in this test process (without an engine: nothing here needs the
    /// poll thread; descriptors not in the table behave as before) and names `s` by a
    /// new pipe's read end, standing for its kernel placeholder. (fd, the pipe's write
    /// end); close both with `close`.
    fn luna_at_pipe(s: Arc<Sock>) -> (c_int, c_int) {
        ACTIVE.store(true, Ordering::Release);
        let mut p = [0 as c_int; 2];
        // SAFETY: `p` has room for two descriptors.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        insert(p[0], s, false);
        (p[0], p[1])
    }

    fn fdset(fds: &[c_int]) -> libc::fd_set {
        // SAFETY: fd_set is plain data (zeroed is empty); FD_SET/FD_ZERO on a live set, fds below FD_SETSIZE.
        let mut s: libc::fd_set = unsafe { std::mem::zeroed() };
        for &fd in fds {
            // SAFETY: a live set; fds below FD_SETSIZE.
            unsafe { libc::FD_SET(fd, &mut s) };
        }
        s
    }

    fn isset(fd: c_int, s: &libc::fd_set) -> bool {
        // SAFETY: a live set; fds below FD_SETSIZE.
        unsafe { libc::FD_ISSET(fd, s) }
    }

    /// ppoll(2) on a luna socket answers from luna, not from its kernel placeholder (the
    /// real placeholder, an unconnected TCP socket, is POLLHUP at once): nothing ready
    /// waits the timeout, data is POLLIN, a bad timespec is EINVAL.
    #[test]
    fn ppoll_reports_luna_readiness() {
        let s = Sock::new(Phase::Connected, UNBOUND);
        let (fd, ph) = luna_at_pipe(Arc::clone(&s));
        // SAFETY: a live one-byte buffer to a pipe this test owns (the placeholder
        // readable, which luna's answer must not show).
        assert_eq!(unsafe { libc::write(ph, b"p".as_ptr().cast(), 1) }, 1);
        let mut p = [libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 30_000_000,
        };
        let t0 = Instant::now();
        // SAFETY: a live pollfd array and timespec; no mask.
        let n = unsafe { libc::ppoll(p.as_mut_ptr(), 1, &ts, std::ptr::null()) };
        assert_eq!(
            (n, p[0].revents),
            (0, 0),
            "the placeholder's readiness is not luna's"
        );
        assert!(t0.elapsed() >= Duration::from_millis(25));

        s.lock().rx.extend(b"x");
        // SAFETY: as above, no timeout.
        let n = unsafe { libc::ppoll(p.as_mut_ptr(), 1, std::ptr::null(), std::ptr::null()) };
        assert_eq!((n, p[0].revents), (1, libc::POLLIN));

        let bad = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000_000,
        };
        // SAFETY: as above.
        let n = unsafe { libc::ppoll(p.as_mut_ptr(), 1, &bad, std::ptr::null()) };
        assert_eq!((n, crate::errno()), (-1, libc::EINVAL));
        for x in [fd, ph] {
            // SAFETY: closing descriptors this test opened.
            assert_eq!(unsafe { close(x) }, 0);
        }
    }

    /// select(2) on a luna socket answers from luna, not from its kernel placeholder
    /// (here a readable pipe: the real placeholder, an unconnected TCP socket, always
    /// polls readable), mixed with a kernel descriptor; the sets are rewritten in
    /// place, the count covers all three, the timeval gets the time left.
    #[test]
    fn select_reports_luna_readiness_and_the_time_left() {
        let s = Sock::new(Phase::Connected, UNBOUND);
        let (fd, ph) = luna_at_pipe(Arc::clone(&s));
        // SAFETY: a live one-byte buffer to a pipe this test owns.
        assert_eq!(unsafe { libc::write(ph, b"p".as_ptr().cast(), 1) }, 1);
        let mut k = [0 as c_int; 2];
        // SAFETY: `k` has room for two descriptors.
        assert_eq!(unsafe { libc::pipe(k.as_mut_ptr()) }, 0);
        let nfds = fd.max(k[0]).max(ph) + 1;

        // Nothing to read on luna, the kernel pipe empty: a timeout, the time left 0.
        let (mut r, mut e) = (fdset(&[fd, k[0]]), fdset(&[fd]));
        let mut tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 30_000,
        };
        let t0 = Instant::now();
        // SAFETY: the sets and timeval are live on this stack (or null, as select(2) allows).
        let n = unsafe { libc::select(nfds, &mut r, std::ptr::null_mut(), &mut e, &mut tv) };
        assert_eq!(n, 0, "the placeholder's readability is not luna's");
        assert!(t0.elapsed() >= Duration::from_millis(25));
        assert!(!isset(fd, &r) && !isset(k[0], &r) && !isset(fd, &e));
        assert_eq!((tv.tv_sec, tv.tv_usec), (0, 0));

        // Luna data and a writable luna socket, the kernel pipe readable too.
        s.lock().rx.extend(b"x");
        // SAFETY: a live one-byte buffer to a pipe this test owns.
        assert_eq!(unsafe { libc::write(k[1], b"k".as_ptr().cast(), 1) }, 1);
        let (mut r, mut w) = (fdset(&[fd, k[0]]), fdset(&[fd]));
        let mut tv = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        // SAFETY: the sets and timeval are live on this stack (or null, as select(2) allows).
        let n = unsafe { libc::select(nfds, &mut r, &mut w, std::ptr::null_mut(), &mut tv) };
        assert_eq!(n, 3);
        assert!(isset(fd, &r) && isset(k[0], &r) && isset(fd, &w));
        assert!(tv.tv_sec >= 4 && tv.tv_sec <= 5, "time left: {}", tv.tv_sec);

        // End of stream and errors are readable; nothing asked, nothing counted.
        s.lock().rx.clear();
        s.lock().eof = true;
        let mut r = fdset(&[fd]);
        let mut zero = libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        };
        // SAFETY: the sets and timeval are live on this stack (or null, as select(2) allows).
        let n = unsafe {
            libc::select(
                nfds,
                &mut r,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut zero,
            )
        };
        assert_eq!(n, 1, "EOF is readable");

        // pselect: the same answer, the timespec untouched.
        let mut r = fdset(&[fd]);
        let ts = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        // SAFETY: the sets and timespec are live on this stack; a null mask is allowed (pselect(2)).
        let n = unsafe {
            libc::pselect(
                nfds,
                &mut r,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &ts,
                std::ptr::null(),
            )
        };
        assert_eq!((n, ts.tv_sec, ts.tv_nsec), (1, 1, 0));
        assert!(isset(fd, &r));

        // A bad descriptor next to a luna one: EBADF. The highest descriptor a set can
        // hold, not one just past ours: the other tests of this binary open and close
        // descriptors in parallel, and `nfds + 5` was once theirs (select answered 1).
        let bad = libc::FD_SETSIZE as c_int - 1;
        // SAFETY: F_GETFD on a descriptor number only reads its flags.
        let flags = unsafe { libc::fcntl(bad, libc::F_GETFD) };
        assert_eq!(flags, -1, "descriptor {bad} is open");
        let mut r = fdset(&[fd, bad]);
        // SAFETY: the sets and timeval are live on this stack (or null, as select(2) allows).
        let n = unsafe {
            libc::select(
                bad + 1,
                &mut r,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut zero,
            )
        };
        assert_eq!((n, crate::errno()), (-1, libc::EBADF));

        // Sets beyond FD_SETSIZE holding a luna socket: EINVAL.
        let mut big = [0 as libc::c_ulong; 64];
        big[fd as usize / 64] |= 1 << (fd as usize % 64);
        // SAFETY: the sets and timeval are live on this stack (or null, as select(2) allows).
        let n = unsafe {
            libc::select(
                4096,
                big.as_mut_ptr().cast(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut zero,
            )
        };
        assert_eq!((n, crate::errno()), (-1, libc::EINVAL));

        for x in [fd, ph, k[0], k[1]] {
            // SAFETY: closing descriptors this test opened.
            assert_eq!(unsafe { close(x) }, 0);
        }
    }

    /// accept(2) takes a connection and then cannot open its descriptor (EMFILE): the
    /// connection goes back to the queue, and a thread asleep in accept on the same
    /// listener (it slept again after this one took it) is woken for it. Run in a
    /// forked child (the descriptor limit is process-wide); a hang ends by SIGALRM.
    #[test]
    fn a_connection_put_back_by_a_failed_accept_wakes_another_acceptor() {
        let l = Sock::new(Phase::Listening, UNBOUND);
        let (fd, ph) = luna_at_pipe(Arc::clone(&l));
        let c = Sock::new(Phase::Connected, UNBOUND);
        // SAFETY: the child runs this test's own sockets and plain system calls, and
        // leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: plain system calls in the child.
            unsafe { libc::alarm(5) };
            let t = std::thread::spawn(move || {
                // SAFETY: accept(2) with null address pointers (allowed).
                let r = unsafe { accept(fd, std::ptr::null_mut(), std::ptr::null_mut()) };
                (r, crate::errno())
            });
            while l.sleepers() == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            // Queued while the other thread sleeps (as after it lost the race for it).
            l.lock().accept_q.push_back(c);
            // SAFETY: getrlimit/setrlimit/dup/close on this process.
            let (mut lim, probe) = unsafe {
                let mut lim: libc::rlimit = std::mem::zeroed();
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
                (lim, libc::fcntl(0, libc::F_DUPFD, 0))
            };
            let old = lim.rlim_cur;
            lim.rlim_cur = probe as libc::rlim_t;
            // SAFETY: as above.
            let r = unsafe {
                libc::close(probe);
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
                let r = accept(fd, std::ptr::null_mut(), std::ptr::null_mut());
                let e = crate::errno();
                lim.rlim_cur = old;
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
                (r, e)
            };
            let failed = r == (-1, libc::EMFILE);
            // Woken, it took the connection, or met the limit too if it ran before the
            // limit was raised again.
            let (o, e) = t.join().unwrap();
            let other = o >= 0 || e == libc::EMFILE;
            // SAFETY: ends the child without running the parent's destructors.
            unsafe {
                libc::_exit(if !failed {
                    2
                } else if other {
                    0
                } else {
                    1
                })
            };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            !libc::WIFSIGNALED(status),
            "the other acceptor slept on (killed by signal {})",
            libc::WTERMSIG(status)
        );
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "2: no EMFILE, 1: no connection"
        );
        for x in [fd, ph] {
            // SAFETY: closing descriptors this test opened.
            assert_eq!(unsafe { close(x) }, 0);
        }
    }

    /// A connection accepted from a listener with SO_LINGER {1, 0} has it too (Linux's
    /// accepted sockets are clones of their listener, sk_clone_lock), so its close
    /// resets it as on Linux.
    #[test]
    fn accepted_connections_inherit_so_linger() {
        ACTIVE.store(true, Ordering::Release);
        // SAFETY: a plain socket(2) (not interposed), the listener's placeholder.
        let lfd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
        assert!(lfd >= 0);
        let l = Sock::new(Phase::Listening, UNBOUND);
        insert(lfd, Arc::clone(&l), false);
        let zero = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        let size = std::mem::size_of::<libc::linger>() as socklen_t;
        // SAFETY: a live linger of the size given.
        let r = unsafe {
            setsockopt(
                lfd,
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&zero as *const libc::linger).cast(),
                size,
            )
        };
        assert_eq!(r, 0);
        let c = Sock::new(Phase::Connected, UNBOUND);
        l.lock().accept_q.push_back(Arc::clone(&c));
        // SAFETY: accept(2) with null address pointers (allowed).
        let nfd = unsafe { accept(lfd, std::ptr::null_mut(), std::ptr::null_mut()) };
        assert!(nfd >= 0);
        let mut got = libc::linger {
            l_onoff: 0,
            l_linger: 7,
        };
        let mut len = size;
        // SAFETY: a live linger of the size given.
        let r = unsafe {
            getsockopt(
                nfd,
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&mut got as *mut libc::linger).cast(),
                &mut len,
            )
        };
        assert_eq!(
            (r, got.l_onoff, got.l_linger),
            (0, 1, 0),
            "SO_LINGER inherited"
        );
        // SAFETY: closing descriptors this test opened.
        assert_eq!(unsafe { close(nfd) }, 0);
        assert!(c.lock().reset_on_close, "the close resets");
        // SAFETY: as above.
        assert_eq!(unsafe { close(lfd) }, 0);
    }

    /// dup2(2) over the last descriptor of a luna socket closes it as close(2) would:
    /// with SO_LINGER {1, 0} (read before the kernel closes the placeholder) it resets.
    #[test]
    fn dup2_over_a_linger_zero_socket_resets_it() {
        ACTIVE.store(true, Ordering::Release);
        // SAFETY: a plain socket(2) (not interposed), the placeholder.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
        assert!(fd >= 0);
        let c = Sock::new(Phase::Connected, UNBOUND);
        insert(fd, Arc::clone(&c), false);
        let zero = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: a live linger of the size given.
        let r = unsafe {
            setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&zero as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as socklen_t,
            )
        };
        assert_eq!(r, 0);
        let mut p = [0 as c_int; 2];
        // SAFETY: `p` has room for two descriptors.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        // SAFETY: dup2(2) over a descriptor this test owns.
        assert_eq!(unsafe { dup2(p[1], fd) }, fd);
        assert_eq!(c.lock().phase, Phase::Closed);
        assert!(c.lock().reset_on_close, "SO_LINGER {{1, 0}}: reset");
        for x in [fd, p[0], p[1]] {
            // SAFETY: closing descriptors this test opened.
            assert_eq!(unsafe { close(x) }, 0);
        }
    }

    /// accept(2) takes a connection, then its socket(2) fails (EMFILE) while another
    /// thread closes the listener (or shuts it down): the connection must not go back
    /// to the queue of a listener that is gone (the close already reset what was
    /// queued; nothing would ever accept or close it, and its connection would stay
    /// open in the stack): it is reset as the listener's queued connections were.
    #[test]
    fn a_failed_accept_racing_the_listeners_close_resets_the_connection() {
        for shut_down in [false, true] {
            let l = Sock::new(Phase::Listening, UNBOUND);
            let (fd, ph) = luna_at_pipe(Arc::clone(&l));
            let c = Sock::new(Phase::Connected, UNBOUND);
            l.lock().accept_q.push_back(Arc::clone(&c));
            let l2 = Arc::clone(&l);
            let open = move |_| {
                // Another thread, between the take and the failed socket(2).
                if shut_down {
                    // SAFETY: shutdown(2) on a descriptor this test owns.
                    assert_eq!(unsafe { shutdown(fd, libc::SHUT_RDWR) }, 0);
                } else {
                    release(Arc::clone(&l2), false);
                }
                set_errno(libc::EMFILE);
                -1
            };
            // SAFETY: null address pointers (allowed).
            let r = unsafe {
                accept_with(fd, &l, std::ptr::null_mut(), std::ptr::null_mut(), 0, &open)
            };
            assert_eq!((r, crate::errno()), (-1, libc::EMFILE));
            assert!(
                l.lock().accept_q.is_empty(),
                "put back on a listener that is gone (shut down: {shut_down})"
            );
            let g = c.lock();
            assert_eq!(g.phase, Phase::Closed, "the connection was left open");
            assert!(g.reset_on_close, "reset, as the listener's queue was");
            drop(g);
            for x in [fd, ph] {
                // SAFETY: closing descriptors this test opened.
                assert_eq!(unsafe { close(x) }, 0);
            }
        }
    }

    /// close_range(2) with a flag it does not know, or with first above last, fails
    /// with EINVAL (the kernel's answer) and closes nothing: the luna socket in the
    /// range stays open and named by its descriptor.
    #[test]
    fn close_range_with_unknown_flags_is_einval_and_releases_nothing() {
        let s = Sock::new(Phase::Connected, UNBOUND);
        let (fd, ph) = luna_at_pipe(Arc::clone(&s));
        let lo = fd.min(ph) as libc::c_uint;
        let hi = fd.max(ph) as libc::c_uint;
        for (first, last, flags) in [(lo, hi, 1 << 7), (lo, hi, -1), (hi, lo, 0)] {
            // SAFETY: close_range(2) over descriptors this test owns.
            let r = unsafe { close_range(first, last, flags) };
            assert_eq!(
                (r, crate::errno()),
                (-1, libc::EINVAL),
                "close_range({first}, {last}, {flags:#x})"
            );
            assert_eq!(s.lock().phase, Phase::Connected, "released ({flags:#x})");
            assert!(lookup(fd).is_some_and(|x| Arc::ptr_eq(&x, &s)), "forgotten");
            assert_eq!(s.fds.load(Ordering::Relaxed), 1);
        }
        for x in [fd, ph] {
            // SAFETY: closing descriptors this test opened.
            assert_eq!(unsafe { close(x) }, 0);
        }
    }

    /// TCP_NODELAY, IP_TOS and IP_TTL on a luna socket read back what Linux would:
    /// TCP_NODELAY as a flag (any non-zero value reads 1; 0 turns Nagle on), IP_TOS
    /// without its ECN bits (also set and read as one byte), IP_TTL luna's 64 (-1 and
    /// 64 accepted; outside 1..=255 EINVAL; another TTL ENOPROTOOPT, not a success
    /// that changes nothing). None of them reaches the placeholder (here a pipe, which
    /// would answer ENOTSOCK).
    #[test]
    fn tcp_nodelay_ip_tos_and_ip_ttl_read_back_what_was_set() {
        let s = Sock::new(Phase::Connected, UNBOUND);
        let (fd, ph) = luna_at_pipe(Arc::clone(&s));
        let set = |level, name, v: c_int| {
            // SAFETY: a live int of the size given.
            let r = unsafe {
                setsockopt(
                    fd,
                    level,
                    name,
                    (&v as *const c_int).cast(),
                    std::mem::size_of::<c_int>() as socklen_t,
                )
            };
            (r, if r < 0 { crate::errno() } else { 0 })
        };
        let get = |level, name| {
            let mut v: c_int = -7;
            let mut len = std::mem::size_of::<c_int>() as socklen_t;
            // SAFETY: `v` and `len` are live and sized for an int option.
            let r = unsafe { getsockopt(fd, level, name, (&mut v as *mut c_int).cast(), &mut len) };
            assert_eq!((r, len), (0, 4), "getsockopt({level}, {name})");
            v
        };
        let tcp = libc::IPPROTO_TCP;
        let ip = libc::IPPROTO_IP;
        assert_eq!(get(tcp, libc::TCP_NODELAY), 1, "luna's default: no Nagle");
        assert_eq!(set(tcp, libc::TCP_NODELAY, 0), (0, 0));
        assert_eq!(get(tcp, libc::TCP_NODELAY), 0);
        assert_eq!(s.lock().opts.nodelay, 0, "Nagle on for the connection");
        assert_eq!(set(tcp, libc::TCP_NODELAY, 5), (0, 0));
        assert_eq!(get(tcp, libc::TCP_NODELAY), 1, "a flag");
        assert_eq!(get(ip, libc::IP_TOS), 0);
        assert_eq!(set(ip, libc::IP_TOS, 0xb9), (0, 0));
        assert_eq!(get(ip, libc::IP_TOS), 0xb8, "DSCP 46, no ECN bits");
        assert_eq!(s.lock().opts.tos >> 2, 46);
        let byte = 0x20u8;
        // SAFETY: one live byte, the size given.
        let r = unsafe { setsockopt(fd, ip, libc::IP_TOS, (&byte as *const u8).cast(), 1) };
        assert_eq!(r, 0, "IP_TOS as one byte");
        let (mut b, mut len) = (0u8, 1 as socklen_t);
        // SAFETY: one live byte, the size given.
        let r = unsafe { getsockopt(fd, ip, libc::IP_TOS, (&mut b as *mut u8).cast(), &mut len) };
        assert_eq!((r, b, len), (0, 0x20, 1));
        assert_eq!(get(ip, libc::IP_TTL), 64);
        assert_eq!(set(ip, libc::IP_TTL, -1), (0, 0));
        assert_eq!(set(ip, libc::IP_TTL, 64), (0, 0));
        assert_eq!(set(ip, libc::IP_TTL, 0), (-1, libc::EINVAL));
        assert_eq!(set(ip, libc::IP_TTL, 256), (-1, libc::EINVAL));
        assert_eq!(set(ip, libc::IP_TTL, 7), (-1, libc::ENOPROTOOPT));
        assert_eq!(get(ip, libc::IP_TTL), 64, "still luna's");
        // SAFETY: a zero-length value.
        let r = unsafe { setsockopt(fd, ip, libc::IP_TOS, std::ptr::null(), 0) };
        assert_eq!((r, crate::errno()), (-1, libc::EINVAL));
        for x in [fd, ph] {
            // SAFETY: closing descriptors this test opened.
            assert_eq!(unsafe { close(x) }, 0);
        }
    }

    /// A socket registered in an epoll set under one descriptor and closed through a
    /// copy (dup, then close the registered number, then the copy): closing its last
    /// descriptor takes it out of the set, as Linux drops a file's registrations when the
    /// file closes; the set does not go on reporting EPOLLHUP with the old data word
    /// (a C server's pointer to a freed connection) for a socket that is gone.
    #[test]
    fn closing_the_last_copy_leaves_every_epoll_set() {
        let (s, fd, ph, ep) = luna_in_epoll(libc::EPOLLIN as u32, 42);
        // SAFETY: dup(2) and close(2) of descriptors this test owns.
        let d = unsafe { dup(fd) };
        assert!(d >= 0);
        // SAFETY: as above.
        assert_eq!(unsafe { close(fd) }, 0);
        assert_eq!(s.lock().phase, Phase::Connected, "a copy still names it");
        // SAFETY: as above.
        assert_eq!(unsafe { close(d) }, 0);
        assert_eq!(s.lock().phase, Phase::Closed);
        let mut out = [epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: `out` has room for 4 events.
        let n = unsafe { epoll_wait(ep, out.as_mut_ptr(), 4, 0) };
        let reported: Vec<u64> = out[..n.max(0) as usize].iter().map(|e| e.u64).collect();
        assert_eq!(n, 0, "the closed socket is still reported: {reported:?}");
        for x in [ep, ph] {
            // SAFETY: closing descriptors this test opened.
            assert_eq!(unsafe { close(x) }, 0);
        }
    }

    /// recv(2) flags luna has no counterpart for are not ignored: MSG_TRUNC discards the
    /// bytes it counts (TCP's meaning on Linux; a null buffer is fine), MSG_OOB reads
    /// nothing (EINVAL: no urgent data) and sends nothing (EOPNOTSUPP: it is not sent
    /// in-band as ordinary data).
    #[test]
    fn msg_trunc_discards_and_msg_oob_is_refused() {
        let s = Sock::new(Phase::Connected, UNBOUND);
        let (fd, ph) = luna_at_pipe(Arc::clone(&s));
        s.lock().rx.extend(b"abcdefgh");
        let f = libc::MSG_DONTWAIT;
        // SAFETY: a null buffer with MSG_TRUNC (not written).
        let n = unsafe { recv(fd, std::ptr::null_mut(), 3, f | libc::MSG_TRUNC) };
        assert_eq!(n, 3, "MSG_TRUNC counts the bytes it discards");
        let mut b = [0u8; 8];
        // SAFETY: a live 8-byte buffer.
        let n = unsafe { recv(fd, b.as_mut_ptr().cast(), 8, f | libc::MSG_OOB) };
        assert_eq!((n, crate::errno()), (-1, libc::EINVAL));
        let mut from: libc::sockaddr_in = {
            // SAFETY: plain data, all zeroes valid.
            unsafe { std::mem::zeroed() }
        };
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as socklen_t;
        let n = {
            // SAFETY: a live buffer (ignored with MSG_TRUNC) and a live address.
            unsafe {
                recvfrom(
                    fd,
                    b.as_mut_ptr().cast(),
                    1,
                    f | libc::MSG_TRUNC,
                    (&mut from as *mut libc::sockaddr_in).cast(),
                    &mut len,
                )
            }
        };
        assert_eq!(n, 1);
        assert_eq!(b, [0u8; 8], "MSG_TRUNC copies nothing");
        // SAFETY: a live 8-byte buffer.
        let n = unsafe { recv(fd, b.as_mut_ptr().cast(), 8, f) };
        assert_eq!(
            &b[..n as usize],
            b"efgh",
            "neither the discard nor MSG_OOB lost a byte"
        );
        // SAFETY: a live one-byte buffer.
        let n = unsafe { send(fd, b"!".as_ptr().cast(), 1, libc::MSG_OOB) };
        assert_eq!((n, crate::errno()), (-1, libc::EOPNOTSUPP));
        for x in [fd, ph] {
            // SAFETY: closing descriptors this test opened.
            assert_eq!(unsafe { close(x) }, 0);
        }
    }

    /// getsockopt(TCP_INFO) on a luna socket checks its arguments as Linux does before
    /// asking the poll thread: a null length is EFAULT, a negative one EINVAL; without a
    /// running luna (no LUNA_CONFIG here) it is ENETDOWN, never the placeholder's answer.
    #[test]
    fn tcp_info_bad_arguments_are_errors_and_no_engine_is_enetdown() {
        let s = Sock::new(Phase::Connected, UNBOUND);
        let (fd, ph) = luna_at_pipe(Arc::clone(&s));
        let mut info = [0u8; 232];
        let p = info.as_mut_ptr().cast();
        let (sol, opt) = (libc::IPPROTO_TCP, libc::TCP_INFO);
        // SAFETY: a null length (refused before any write).
        let r = unsafe { getsockopt(fd, sol, opt, p, std::ptr::null_mut()) };
        assert_eq!((r, crate::errno()), (-1, libc::EFAULT));
        let mut len: socklen_t = u32::MAX;
        // SAFETY: a live buffer and length (the length is refused).
        let r = unsafe { getsockopt(fd, sol, opt, p, &mut len) };
        assert_eq!((r, crate::errno()), (-1, libc::EINVAL));
        let mut len = info.len() as socklen_t;
        // SAFETY: a live 232-byte buffer and its length.
        let r = unsafe { getsockopt(fd, sol, opt, p, &mut len) };
        assert_eq!((r, crate::errno()), (-1, libc::ENETDOWN));
        assert_eq!(info, [0u8; 232], "nothing written");
        for x in [fd, ph] {
            // SAFETY: closing descriptors this test opened.
            assert_eq!(unsafe { close(x) }, 0);
        }
    }

    /// epoll_pwait2(2) on a set holding a luna socket answers from luna (without the hook
    /// the kernel saw only the set's kernel part and timed out with the data there):
    /// nothing ready waits the timeout, data is reported with its user data, a timeout
    /// under a millisecond still waits (rounded up, not to 0), a bad timespec is EINVAL.
    #[test]
    fn epoll_pwait2_reports_luna_readiness() {
        let (s, fd, ph, ep) = luna_in_epoll(libc::EPOLLIN as u32, 7);
        let mut out = [epoll_event { events: 0, u64: 0 }; 4];
        let wait = |out: &mut [epoll_event; 4], ns: i64| {
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: ns as libc::c_long,
            };
            let t0 = Instant::now();
            // SAFETY: `out` has room for 4 events; a live timespec; no mask.
            let n = unsafe { epoll_pwait2(ep, out.as_mut_ptr(), 4, &ts, std::ptr::null()) };
            (n, crate::errno(), t0.elapsed())
        };
        let (n, _, took) = wait(&mut out, 30_000_000);
        assert_eq!(n, 0, "nothing is ready");
        assert!(took >= Duration::from_millis(25), "{took:?}");
        let (n, _, took) = wait(&mut out, 200_000);
        assert_eq!(n, 0);
        assert!(
            took >= Duration::from_micros(200),
            "rounded to 0 ms: {took:?}"
        );
        {
            let mut g = s.lock();
            g.rx.extend(b"x");
            s.notify(&g);
        }
        let (n, _, _) = wait(&mut out, 30_000_000);
        assert_eq!(n, 1, "luna's data is not reported");
        assert_eq!(
            ({ out[0].events }, { out[0].u64 }),
            (libc::EPOLLIN as u32, 7)
        );
        let (n, e, _) = wait(&mut out, 1_000_000_000);
        assert_eq!((n, e), (-1, libc::EINVAL));
        for x in [ep, fd, ph] {
            // SAFETY: closing descriptors this test opened.
            assert_eq!(unsafe { close(x) }, 0);
        }
    }

    /// shutdown(2) on a listener: 0, listening stops, a thread blocked in accept(2)
    /// wakes with EINVAL (Linux's way to stop accept threads); SHUT_WR alone changes
    /// nothing.
    #[test]
    fn shutdown_of_a_listener_wakes_accept_with_einval() {
        let l = Sock::new(Phase::Listening, UNBOUND);
        let (fd, ph) = luna_at_pipe(Arc::clone(&l));
        // SAFETY: shutdown(2) on a descriptor this test owns.
        assert_eq!(unsafe { shutdown(fd, libc::SHUT_WR) }, 0);
        assert_eq!(l.lock().phase, Phase::Listening, "SHUT_WR: still listening");
        let t = std::thread::spawn(move || {
            // SAFETY: accept(2) with null address pointers (allowed).
            let r = unsafe { accept(fd, std::ptr::null_mut(), std::ptr::null_mut()) };
            (r, crate::errno())
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished(), "accept blocks while nothing is queued");
        // SAFETY: shutdown(2) on a descriptor this test owns.
        assert_eq!(unsafe { shutdown(fd, libc::SHUT_RDWR) }, 0);
        assert_eq!(t.join().unwrap(), (-1, libc::EINVAL));
        let mut v: c_int = 1;
        let mut len = std::mem::size_of::<c_int>() as socklen_t;
        // SAFETY: `v` and `len` are live and sized for an int option.
        let r = unsafe {
            getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_ACCEPTCONN,
                (&mut v as *mut c_int).cast(),
                &mut len,
            )
        };
        assert_eq!((r, v), (0, 0), "no longer listening");
        // A queued connection is dropped with the listener's queue.
        let l2 = Sock::new(Phase::Listening, UNBOUND);
        l2.lock()
            .accept_q
            .push_back(Sock::new(Phase::Connected, UNBOUND));
        let (fd2, ph2) = luna_at_pipe(Arc::clone(&l2));
        // SAFETY: shutdown(2) on a descriptor this test owns.
        assert_eq!(unsafe { shutdown(fd2, libc::SHUT_RD) }, 0);
        assert!(l2.lock().accept_q.is_empty());
        // SAFETY: accept(2) with null address pointers (allowed).
        let r = unsafe { accept(fd2, std::ptr::null_mut(), std::ptr::null_mut()) };
        assert_eq!((r, crate::errno()), (-1, libc::EINVAL));
        // Not a listener and not connected: ENOTCONN, as before.
        // SAFETY: shutdown(2) on a descriptor this test owns.
        assert_eq!(unsafe { shutdown(fd2, libc::SHUT_RDWR) }, -1);
        assert_eq!(crate::errno(), libc::ENOTCONN);
        for x in [fd, ph, fd2, ph2] {
            // SAFETY: closing descriptors this test opened.
            assert_eq!(unsafe { close(x) }, 0);
        }
    }

    /// bind(2) reports EADDRINUSE itself (not at listen) for a port another luna socket
    /// holds; SO_REUSEADDR on both shares a port unless the other one listens.
    #[test]
    fn bind_to_a_port_in_use_is_eaddrinuse() {
        let at = |port| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: u16::to_be(port),
            sin_addr: libc::in_addr {
                s_addr: u32::from(Ipv4Addr::new(198, 18, 0, 2)).to_be(),
            },
            sin_zero: [0; 8],
        };
        let bind_to = |fd, port| {
            let sin = at(port);
            // SAFETY: `sin` is a live sockaddr_in of the length given.
            let r = unsafe {
                bind(
                    fd,
                    (&sin as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as socklen_t,
                )
            };
            (r, if r < 0 { crate::errno() } else { 0 })
        };
        let l = Sock::new(
            Phase::Listening,
            SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 47001),
        );
        let (lfd, lph) = luna_at_pipe(Arc::clone(&l));
        // A luna socket not bound yet (as connect(2) leaves one before it runs).
        let s = Sock::new(Phase::Fresh, UNBOUND);
        let (fd, ph) = luna_at_pipe(Arc::clone(&s));
        assert_eq!(
            bind_to(fd, 47001),
            (-1, libc::EADDRINUSE),
            "a listener's port"
        );
        s.lock().opts.reuseaddr = 1;
        l.lock().opts.reuseaddr = 1;
        assert_eq!(
            bind_to(fd, 47001),
            (-1, libc::EADDRINUSE),
            "SO_REUSEADDR: still never two listeners"
        );
        // The other socket bound but not listening: both SO_REUSEADDR share the port.
        l.lock().phase = Phase::Fresh;
        assert_eq!(bind_to(fd, 47001), (0, 0));
        assert_eq!(s.lock().local.port(), 47001);
        assert_eq!(bind_to(fd, 47002), (-1, libc::EINVAL), "bound already");
        // Without SO_REUSEADDR on the new one: taken.
        let t = Sock::new(Phase::Fresh, UNBOUND);
        let (tfd, tph) = luna_at_pipe(Arc::clone(&t));
        assert_eq!(bind_to(tfd, 47001), (-1, libc::EADDRINUSE));
        assert_eq!(bind_to(tfd, 47003), (0, 0), "a free port");
        for x in [lfd, lph, fd, ph, tfd, tph] {
            // SAFETY: closing descriptors this test opened.
            assert_eq!(unsafe { close(x) }, 0);
        }
    }

    #[test]
    fn bind_conflicts_follow_linux_tcp() {
        let st = |phase, reuse| {
            let s = Sock::new(phase, UNBOUND);
            s.lock().opts.reuseaddr = reuse;
            s
        };
        let c = |reuse, phase, other_reuse| bind_conflicts(reuse, &st(phase, other_reuse).lock());
        assert!(c(false, Phase::Fresh, 0));
        assert!(c(true, Phase::Fresh, 0));
        assert!(c(false, Phase::Fresh, 1));
        assert!(!c(true, Phase::Fresh, 1));
        assert!(!c(true, Phase::Connected, 1), "accepted connections");
        assert!(c(true, Phase::Connected, 0));
        assert!(c(true, Phase::Listening, 1));
        assert!(c(true, Phase::Opening, 1));
        assert!(!c(false, Phase::Closed, 0));
    }

    #[test]
    fn without_luna_calls_reach_the_kernel() {
        // This test binary exports the hooks too; ACTIVE is false: plain libc behaviour.
        let mut fds = [0 as c_int; 2];
        // SAFETY: pipe(2) writes two descriptors into the array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: our pipe's write end; 2 bytes from a live literal.
        assert_eq!(unsafe { write(fds[1], b"ok".as_ptr().cast(), 2) }, 2);
        let mut b = [0u8; 2];
        // SAFETY: our pipe's read end into a live 2-byte buffer.
        assert_eq!(unsafe { read(fds[0], b.as_mut_ptr().cast(), 2) }, 2);
        assert_eq!(&b, b"ok");
        // SAFETY: closing descriptors this test owns.
        assert_eq!(unsafe { close(fds[0]) }, 0);
        // SAFETY: closing descriptors this test owns.
        assert_eq!(unsafe { close(fds[1]) }, 0);
        // SAFETY: a second close of a closed descriptor (EBADF) touches no memory.
        assert_eq!(unsafe { close(fds[1]) }, -1);
        assert_eq!(crate::errno(), libc::EBADF);
    }
}
