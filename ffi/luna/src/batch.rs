//! Batch mode: once per poll iteration each core calls the C `on_poll` with a
//! `luna_sockets_t`, the socket/epoll-like API of `r2c::batch::Sockets` (non-blocking,
//! level triggered, errno like BSD sockets).

use crate::buf::{boxed, get, luna_zbuf_mut_t, luna_zbuf_t};
use crate::env::{luna_env_t, luna_runtime_t, start, Cores};
use crate::error::{guard, null, Fail, Res};
use crate::{luna_addr_t, UserPtr};
use r2c::batch::{BatchApp, Fd, Interest, PollEvent, SockError, Sockets};
use r2c::Runtime;
use std::ffi::{c_int, c_void};

/// `events` bit: readable (data, end of stream, or connections to accept) — `EPOLLIN`.
pub const LUNA_POLLIN: u32 = 0x001;
/// `events` bit: writable (send-buffer space; connect completed) — `EPOLLOUT`.
pub const LUNA_POLLOUT: u32 = 0x004;
/// `events` bit: the connection failed (the error is in `luna_poll_event_t::error`) —
/// `EPOLLERR`.
pub const LUNA_POLLERR: u32 = 0x008;
/// `events` bit: the peer closed or the connection ended — `EPOLLHUP`.
pub const LUNA_POLLHUP: u32 = 0x010;

/// One ready socket, from `luna_sock_poll`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct luna_poll_event_t {
    /// The socket.
    pub fd: i32,
    /// `LUNA_POLL*` bits.
    pub events: u32,
    /// With `LUNA_POLLERR`: the errno of the failure (also returned by the next call); 0
    /// otherwise.
    pub error: i32,
}

/// The socket API of one core during one batch callback. Opaque; valid only during
/// the callback it is passed to, on that core's thread.
pub struct luna_sockets_t {
    _opaque: [u8; 0],
}

/// A batch callback.
pub type luna_sockets_fn = Option<extern "C" fn(s: *mut luna_sockets_t, user: *mut c_void)>;

/// Batch-mode callbacks (`on_poll` is required). Each core calls them on its own
/// thread: callbacks of different cores run at the same time; socket descriptors are
/// per core.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct luna_batch_ops_t {
    /// Once per core before the first poll.
    pub on_start: luna_sockets_fn,
    /// Once per poll iteration, after the burst's events are in the readiness set.
    pub on_poll: luna_sockets_fn,
    /// Shutdown began; open connections are closed right after this returns.
    pub on_stop: luna_sockets_fn,
}

pub(crate) struct SocksInner<'a, 'b> {
    s: &'a mut Sockets<'b>,
    events: &'a mut Vec<PollEvent>,
    fair: &'a mut Fairness,
}

/// When `luna_sock_poll` last reported each descriptor: ready sockets are handed out
/// least recently reported first, so a `max` smaller than the ready set takes turns
/// (r2c lists them in the same order every time, and a socket that stays ready — an idle
/// connection is always writable — kept those behind it out for good).
#[derive(Default)]
struct Fairness {
    /// Per descriptor: the `count` of its last report (0: never).
    last: Vec<u64>,
    count: u64,
}

struct CBatch {
    ops: luna_batch_ops_t,
    user: UserPtr,
    events: Vec<PollEvent>,
    fair: Fairness,
}

impl CBatch {
    fn call(&mut self, s: &mut Sockets<'_>, f: luna_sockets_fn) {
        if let Some(f) = f {
            crate::env::on_core();
            let mut inner = SocksInner {
                s,
                events: &mut self.events,
                fair: &mut self.fair,
            };
            f((&mut inner as *mut SocksInner<'_, '_>).cast(), self.user.0);
        }
    }
}

impl BatchApp for CBatch {
    fn on_start(&mut self, s: &mut Sockets<'_>) {
        self.call(s, self.ops.on_start)
    }
    fn on_poll(&mut self, s: &mut Sockets<'_>) {
        self.call(s, self.ops.on_poll)
    }
    fn on_stop(&mut self, s: &mut Sockets<'_>) {
        self.call(s, self.ops.on_stop)
    }
}

/// Starts the environment's cores in batch mode with `ops` (copied; `on_poll` must be
/// set) and `user`. Returns the runtime, or NULL with errno as `luna_run_inline`.
///
/// # Safety
/// `env` is NULL or live; `ops` is NULL or points to a `luna_batch_ops_t`.
#[no_mangle]
pub unsafe extern "C" fn luna_run_batch(
    env: *mut luna_env_t,
    ops: *const luna_batch_ops_t,
    user: *mut c_void,
) -> *mut luna_runtime_t {
    guard(std::ptr::null_mut(), || {
        // SAFETY: NULL or a valid ops struct (caller's contract).
        let ops = *unsafe { ops.as_ref() }.ok_or_else(|| null("ops"))?;
        if ops.on_poll.is_none() {
            return Err(Fail::new(libc::EINVAL, "batch ops: on_poll is NULL"));
        }
        let user = UserPtr(user);
        let make = move |_i: usize| CBatch {
            ops,
            user,
            events: Vec::new(),
            fair: Fairness::default(),
        };
        start(env, move |cores, opts| match cores {
            Cores::Dpdk(c) => Runtime::spawn_batch(c, opts, make),
            Cores::Mem(c) => Runtime::spawn_batch(c, opts, make),
        })
    })
}

/// # Safety
/// `s` is NULL or the running callback's socket API.
unsafe fn inner<'a>(s: *mut luna_sockets_t) -> Res<&'a mut SocksInner<'a, 'a>> {
    // SAFETY: a non-NULL pointer is the SocksInner of the callback running now on this
    // thread (caller's contract).
    unsafe { s.cast::<SocksInner<'a, 'a>>().as_mut() }.ok_or_else(|| null("sockets"))
}

fn sock_fail(what: &str, e: SockError) -> Fail {
    Fail::new(e.errno(), format!("{what}: {e}"))
}

fn fd(v: c_int) -> Res<Fd> {
    u32::try_from(v)
        .map(Fd)
        .map_err(|_| Fail::new(libc::EBADF, format!("socket {v} is negative")))
}

/// The core's index; -1 with `EINVAL`.
///
/// # Safety
/// `s` is NULL or the running callback's socket API.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_core(s: *mut luna_sockets_t) -> c_int {
    // SAFETY: forwarded caller contract.
    guard(-1, || Ok(unsafe { inner(s) }?.s.core() as c_int))
}

/// The core clock's time of this iteration in nanoseconds; 0 for NULL.
///
/// # Safety
/// `s` is NULL or the running callback's socket API.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_now_ns(s: *mut luna_sockets_t) -> u64 {
    // SAFETY: forwarded caller contract.
    guard(0, || Ok(unsafe { inner(s) }?.s.now().as_nanos()))
}

/// Asks every core to stop gracefully. 0, or -1 with `EINVAL`.
///
/// # Safety
/// `s` is NULL or the running callback's socket API.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_request_stop(s: *mut luna_sockets_t) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        unsafe { inner(s) }?.s.request_stop();
        Ok(0)
    })
}

/// A writable buffer of up to `len` bytes (heap-backed in batch mode); NULL with
/// `ENOBUFS` (the heap has no `len` bytes), `EINVAL` (NULL). Send it with
/// `luna_sock_send_zbuf` after `luna_zbuf_freeze`.
///
/// # Safety
/// `s` is NULL or the running callback's socket API.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_alloc(
    s: *mut luna_sockets_t,
    len: usize,
) -> *mut luna_zbuf_mut_t {
    guard(std::ptr::null_mut(), || {
        // SAFETY: forwarded caller contract.
        unsafe { inner(s) }?;
        Ok(boxed(luna_zbuf_mut_t(heap_zeroed(len)?)))
    })
}

/// `ZbufMut::heap(0, len)` that fails with `ENOBUFS` where the allocator refuses (the
/// infallible one aborts the process: a C program asking for a size the heap has not).
fn heap_zeroed(len: usize) -> Res<zbuf::ZbufMut> {
    let fail = || Fail::new(libc::ENOBUFS, format!("alloc {len}: the heap has no room"));
    let v = if len == 0 {
        Vec::new()
    } else {
        let layout = std::alloc::Layout::array::<u8>(len).map_err(|_| fail())?;
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(fail());
        }
        // SAFETY: `p` was allocated by the global allocator with the layout of `len`
        // bytes, which are initialised (zeroed); length and capacity are `len`.
        unsafe { Vec::from_raw_parts(p, len, len) }
    };
    let mut m = zbuf::ZbufMut::from_vec(v);
    m.clear();
    Ok(m)
}

/// `socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0)`: a new socket; -1 with `EINVAL`.
///
/// # Safety
/// `s` is NULL or the running callback's socket API.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_socket(s: *mut luna_sockets_t) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let Fd(n) = unsafe { inner(s) }?.s.socket();
        c_int::try_from(n).map_err(|_| Fail::new(libc::EMFILE, "too many sockets"))
    })
}

/// `bind` to a local port (0 = chosen at connect). 0, or -1 with `EBADF`, `EINVAL`.
///
/// # Safety
/// `s` is NULL or the running callback's socket API.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_bind(s: *mut luna_sockets_t, sock: c_int, port: u16) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(s) }?;
        c.s.bind(fd(sock)?, port)
            .map_err(|e| sock_fail("bind", e))?;
        Ok(0)
    })
}

/// `listen`. 0, or -1 with `EADDRINUSE`, `EINVAL` (not bound, backlog ≤ 0), `EBADF`.
///
/// # Safety
/// `s` is NULL or the running callback's socket API.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_listen(
    s: *mut luna_sockets_t,
    sock: c_int,
    backlog: c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(s) }?;
        let b = usize::try_from(backlog)
            .ok()
            .filter(|&b| b > 0)
            .ok_or_else(|| Fail::new(libc::EINVAL, format!("listen: backlog {backlog}")))?;
        c.s.listen(fd(sock)?, b)
            .map_err(|e| sock_fail("listen", e))?;
        Ok(0)
    })
}

/// `accept4(.., SOCK_NONBLOCK)`: the new socket (≥ 0), the peer in `*peer` (may be
/// NULL); -1 with `EAGAIN`, `EINVAL` (not listening), `EBADF`, `ECONNRESET`.
///
/// # Safety
/// `s` is NULL or the running callback's socket API; `peer` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_accept(
    s: *mut luna_sockets_t,
    sock: c_int,
    peer: *mut luna_addr_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(s) }?;
        let (Fd(n), p) = c.s.accept(fd(sock)?).map_err(|e| sock_fail("accept", e))?;
        // SAFETY: NULL or writable (caller's contract).
        if let Some(o) = unsafe { peer.as_mut() } {
            *o = luna_addr_t::from_socket(p);
        }
        c_int::try_from(n).map_err(|_| Fail::new(libc::EMFILE, "too many sockets"))
    })
}

/// Non-blocking `connect`: -1 with `EINPROGRESS` once started (the socket turns
/// writable when the handshake completes, or reports `LUNA_POLLERR`); other errors:
/// `EISCONN`, `EINVAL`, `EADDRINUSE`, `EADDRNOTAVAIL`, `ENETUNREACH`, `ENOBUFS`, `EBADF`.
///
/// # Safety
/// `s` is NULL or the running callback's socket API; `remote` NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_connect(
    s: *mut luna_sockets_t,
    sock: c_int,
    remote: *const luna_addr_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(s) }?;
        // SAFETY: NULL or readable (caller's contract).
        let r = unsafe { remote.as_ref() }.ok_or_else(|| null("remote"))?;
        match c.s.connect(fd(sock)?, r.to_socket()) {
            Ok(()) => Ok(0),
            Err(e) => Err(sock_fail("connect", e)),
        }
    })
}

/// `send`: copies up to `len` bytes; the count taken, or -1 with `EAGAIN`, `EPIPE`,
/// `ECONNRESET`, `ENOTCONN`, `ENOBUFS`, `EBADF`, `EINVAL`.
///
/// # Safety
/// `s` is NULL or the running callback's socket API; `data` holds `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_send(
    s: *mut luna_sockets_t,
    sock: c_int,
    data: *const c_void,
    len: usize,
) -> isize {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(s) }?;
        let f = fd(sock)?;
        if len == 0 {
            return c
                .s
                .send(f, &[])
                .map(|n| n as isize)
                .map_err(|e| sock_fail("send", e));
        }
        if data.is_null() {
            return Err(null("data"));
        }
        // SAFETY: `data` holds `len` readable bytes (caller's contract).
        let src = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
        c.s.send(f, src)
            .map(|n| n as isize)
            .map_err(|e| sock_fail("send", e))
    })
}

/// Zero-copy `send` of a frozen buffer (it stays the caller's to free): the bytes
/// taken, or -1 as `luna_sock_send`.
///
/// # Safety
/// `s` is NULL or the running callback's socket API; `buf` NULL or live.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_send_zbuf(
    s: *mut luna_sockets_t,
    sock: c_int,
    buf: *const luna_zbuf_t,
) -> isize {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(s) }?;
        // SAFETY: forwarded caller contract.
        let z = unsafe { get(buf, "buf") }?;
        c.s.send_zbuf(fd(sock)?, z.0.clone())
            .map(|n| n as isize)
            .map_err(|e| sock_fail("send", e))
    })
}

/// `recv`: copies up to `len` bytes; the count, 0 at end of stream, or -1 with
/// `EAGAIN`, `ECONNRESET`, `ENOTCONN`, `EBADF`, `EINVAL`.
///
/// # Safety
/// `s` is NULL or the running callback's socket API; `buf` holds `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_recv(
    s: *mut luna_sockets_t,
    sock: c_int,
    buf: *mut c_void,
    len: usize,
) -> isize {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(s) }?;
        let f = fd(sock)?;
        if len == 0 {
            return c
                .s
                .recv(f, &mut [])
                .map(|n| n as isize)
                .map_err(|e| sock_fail("recv", e));
        }
        if buf.is_null() {
            return Err(null("buf"));
        }
        // SAFETY: `buf` holds `len` writable bytes (caller's contract).
        let dst = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
        c.s.recv(f, dst)
            .map(|n| n as isize)
            .map_err(|e| sock_fail("recv", e))
    })
}

/// Zero-copy `recv`: the next received buffer in `*out` and its length, 0 at end of
/// stream (`*out` NULL), or -1 as `luna_sock_recv`.
///
/// # Safety
/// `s` is NULL or the running callback's socket API; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_recv_zbuf(
    s: *mut luna_sockets_t,
    sock: c_int,
    out: *mut *mut luna_zbuf_t,
) -> isize {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(s) }?;
        // SAFETY: NULL or writable (caller's contract).
        let out = unsafe { out.as_mut() }.ok_or_else(|| null("out"))?;
        *out = std::ptr::null_mut();
        match c.s.recv_zbuf(fd(sock)?).map_err(|e| sock_fail("recv", e))? {
            Some(z) => {
                let n = z.len() as isize;
                *out = boxed(luna_zbuf_t(z));
                Ok(n)
            }
            None => Ok(0),
        }
    })
}

/// `shutdown(SHUT_WR)`: FIN after queued data. 0, or -1 with `ENOTCONN`, `EBADF`.
///
/// # Safety
/// `s` is NULL or the running callback's socket API.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_shutdown(s: *mut luna_sockets_t, sock: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(s) }?;
        c.s.shutdown(fd(sock)?)
            .map_err(|e| sock_fail("shutdown", e))?;
        Ok(0)
    })
}

/// `close`: graceful close, or stop listening; the descriptor is free for reuse. 0, or
/// -1 with `EBADF`.
///
/// # Safety
/// `s` is NULL or the running callback's socket API.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_close(s: *mut luna_sockets_t, sock: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(s) }?;
        c.s.close(fd(sock)?).map_err(|e| sock_fail("close", e))?;
        Ok(0)
    })
}

/// `epoll_ctl(ADD/MOD)` with `LUNA_POLLIN` / `LUNA_POLLOUT` bits (errors and hang-ups
/// are always reported). 0, or -1 with `EBADF`, `EINVAL` (unknown bits).
///
/// # Safety
/// `s` is NULL or the running callback's socket API.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_register(
    s: *mut luna_sockets_t,
    sock: c_int,
    events: u32,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(s) }?;
        let known = LUNA_POLLIN | LUNA_POLLOUT | LUNA_POLLERR | LUNA_POLLHUP;
        if events & !known != 0 {
            return Err(Fail::new(
                libc::EINVAL,
                format!("register: unknown event bits {:#x}", events & !known),
            ));
        }
        let i = Interest {
            readable: events & LUNA_POLLIN != 0,
            writable: events & LUNA_POLLOUT != 0,
        };
        c.s.register(fd(sock)?, i)
            .map_err(|e| sock_fail("register", e))?;
        Ok(0)
    })
}

/// `epoll_ctl(DEL)`. 0, or -1 with `EBADF`.
///
/// # Safety
/// `s` is NULL or the running callback's socket API.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_deregister(s: *mut luna_sockets_t, sock: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(s) }?;
        c.s.deregister(fd(sock)?)
            .map_err(|e| sock_fail("deregister", e))?;
        Ok(0)
    })
}

/// `epoll_wait(.., timeout 0)`: up to `max` ready registered sockets into `out`
/// (level triggered: a socket stays ready until drained; when more than `max` are
/// ready, the least recently reported go first, so ready sockets beyond `max` show up
/// at the next calls). The count, or -1 with `EINVAL` (NULL `out` with
/// `max > 0`).
///
/// # Safety
/// `s` is NULL or the running callback's socket API; `out` has room for `max` events.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_poll(
    s: *mut luna_sockets_t,
    out: *mut luna_poll_event_t,
    max: usize,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(s) }?;
        if max > 0 && out.is_null() {
            return Err(null("out"));
        }
        c.s.poll(c.events);
        let n = c.events.len().min(max).min(c_int::MAX as usize);
        if n == 0 {
            return Ok(0);
        }
        let f = &mut *c.fair;
        if n < c.events.len() {
            let last = &f.last;
            c.events
                .sort_by_key(|e| last.get(e.fd.0 as usize).copied().unwrap_or(0));
        }
        for e in &c.events[..n] {
            let i = e.fd.0 as usize;
            if f.last.len() <= i {
                f.last.resize(i + 1, 0);
            }
            f.count += 1;
            f.last[i] = f.count;
        }
        // SAFETY: `out` has room for `max` ≥ `n` events (caller's contract).
        let dst = unsafe { std::slice::from_raw_parts_mut(out, n) };
        for (d, e) in dst.iter_mut().zip(c.events.iter()) {
            let mut bits = 0;
            if e.readable {
                bits |= LUNA_POLLIN;
            }
            if e.writable {
                bits |= LUNA_POLLOUT;
            }
            if e.hup {
                bits |= LUNA_POLLHUP;
            }
            if e.error.is_some() {
                bits |= LUNA_POLLERR;
            }
            *d = luna_poll_event_t {
                fd: e.fd.0 as i32,
                events: bits,
                error: e.error.map_or(0, SockError::errno),
            };
        }
        Ok(n as c_int)
    })
}

/// The connection's local and remote addresses (either may be NULL). 0, or -1 with
/// `ENOTCONN`, `EBADF`.
///
/// # Safety
/// `s` is NULL or the running callback's socket API; `local`/`remote` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn luna_sock_addrs(
    s: *mut luna_sockets_t,
    sock: c_int,
    local: *mut luna_addr_t,
    remote: *mut luna_addr_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(s) }?;
        let (l, r) = c.s.addrs(fd(sock)?).map_err(|e| sock_fail("addrs", e))?;
        // SAFETY: NULL or writable (caller's contract).
        if let Some(o) = unsafe { local.as_mut() } {
            *o = luna_addr_t::from_socket(l);
        }
        // SAFETY: NULL or writable (caller's contract).
        if let Some(o) = unsafe { remote.as_mut() } {
            *o = luna_addr_t::from_socket(r);
        }
        Ok(0)
    })
}
