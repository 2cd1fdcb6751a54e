//! Inline mode: C callbacks run inside packet processing on each core's thread
//! (`r2c::InlineApp`), with a `luna_ctx_t` for the core's socket calls.

use crate::buf::{boxed, get, luna_iovec_t, luna_zbuf_mut_t, luna_zbuf_t};
use crate::env::{luna_env_t, luna_runtime_t, start, Cores};
use crate::error::{bad_handle, guard, null, Fail, Res};
use crate::handles::Handles;
use crate::{errno_close, luna_addr_t, UserPtr};
use luna_stack::stack::{ConnectError, ListenError, RecvError, SendError};
use luna_stack::tcp::CloseReason;
use r2c::{Conn, Ctx, InlineApp, Listener, Runtime};
use std::ffi::{c_int, c_void};
use std::net::SocketAddrV4;

/// A connection, as C names it: never 0; stale ids, and ids of another core, are refused
/// with `EBADF`.
pub type luna_conn_t = u64;
/// A listener, as C names it: never 0; stale ids, and ids of another core, are `EBADF`.
pub type luna_listener_t = u64;

/// The context of an inline callback: valid only during the callback it is passed to,
/// on that core's thread. Opaque.
pub struct luna_ctx_t {
    _opaque: [u8; 0],
}

/// A callback with the context only.
pub type luna_ctx_fn = Option<extern "C" fn(ctx: *mut luna_ctx_t, user: *mut c_void)>;
/// A callback about one connection.
pub type luna_conn_fn =
    Option<extern "C" fn(ctx: *mut luna_ctx_t, conn: luna_conn_t, user: *mut c_void)>;

/// Inline-mode callbacks; any may be NULL. Every core calls them on its own thread, so
/// callbacks of different cores run at the same time (use `luna_ctx_core` to keep
/// per-core state apart). Handles are valid until `on_closed` returns or the
/// application calls `luna_close` / `luna_abort`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct luna_inline_ops_t {
    /// Once per core before the first poll (listen or connect here).
    pub on_start: luna_ctx_fn,
    /// A connection was accepted from `listener`.
    pub on_accept: Option<
        extern "C" fn(
            ctx: *mut luna_ctx_t,
            conn: luna_conn_t,
            listener: luna_listener_t,
            user: *mut c_void,
        ),
    >,
    /// An active open completed.
    pub on_connected: luna_conn_fn,
    /// Data or end of stream is ready: read with `luna_recv` until it has nothing more.
    /// Called once per connection per received burst, however many segments it
    /// held, and again in that burst while unread data remains; data that arrived
    /// before the accept is announced once.
    pub on_readable: luna_conn_fn,
    /// Send-buffer space was freed. At most once per connection per received burst.
    pub on_writable: luna_conn_fn,
    /// The connection ended: `reason` is 0 (orderly close), `ECONNRESET` (reset by the
    /// peer), `ECONNREFUSED`, `ETIMEDOUT`, `EHOSTUNREACH` (the connection attempt's next hop
    /// did not answer ARP) or `ECONNABORTED` (aborted here). The id dies
    /// when this returns.
    pub on_closed: Option<
        extern "C" fn(ctx: *mut luna_ctx_t, conn: luna_conn_t, reason: c_int, user: *mut c_void),
    >,
    /// Once per poll iteration, after the received burst (clients generate load here).
    pub on_poll: luna_ctx_fn,
    /// Shutdown began; open connections are closed right after this returns.
    pub on_stop: luna_ctx_fn,
}

/// What a `luna_ctx_t` points to.
pub(crate) struct CtxInner<'a, 'b> {
    ctx: &'a mut Ctx<'b>,
    conns: &'a mut Handles<Conn>,
    listeners: &'a mut Handles<Listener>,
    send_all_limit: usize,
}

struct CApp {
    ops: luna_inline_ops_t,
    user: UserPtr,
    conns: Handles<Conn>,
    listeners: Handles<Listener>,
    /// The TCP send buffer and the runtime's backlog together: `luna_send_all` never
    /// takes a larger buffer whole.
    send_all_limit: usize,
}

impl CApp {
    fn with<R>(
        &mut self,
        ctx: &mut Ctx<'_>,
        f: impl FnOnce(*mut luna_ctx_t, *mut c_void) -> R,
    ) -> R {
        crate::env::on_core();
        let user = self.user.0;
        let mut inner = CtxInner {
            ctx,
            conns: &mut self.conns,
            listeners: &mut self.listeners,
            send_all_limit: self.send_all_limit,
        };
        f((&mut inner as *mut CtxInner<'_, '_>).cast(), user)
    }
}

impl InlineApp for CApp {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        if let Some(f) = self.ops.on_start {
            self.with(ctx, |c, u| f(c, u));
        }
    }
    fn on_accept(&mut self, ctx: &mut Ctx<'_>, conn: Conn, l: Listener) {
        let id = self.conns.insert(conn);
        let lid = self.listeners.id_of(l).unwrap_or(0);
        if let Some(f) = self.ops.on_accept {
            self.with(ctx, |c, u| f(c, id, lid, u));
        }
    }
    fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        if let (Some(f), Some(id)) = (self.ops.on_connected, self.conns.id_of(conn)) {
            self.with(ctx, |c, u| f(c, id, u));
        }
    }
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        if let (Some(f), Some(id)) = (self.ops.on_readable, self.conns.id_of(conn)) {
            self.with(ctx, |c, u| f(c, id, u));
        }
    }
    fn on_writable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        if let (Some(f), Some(id)) = (self.ops.on_writable, self.conns.id_of(conn)) {
            self.with(ctx, |c, u| f(c, id, u));
        }
    }
    fn on_closed(&mut self, ctx: &mut Ctx<'_>, conn: Conn, reason: Option<CloseReason>) {
        let Some(id) = self.conns.id_of(conn) else {
            return;
        };
        if let Some(f) = self.ops.on_closed {
            self.with(ctx, |c, u| f(c, id, errno_close(reason), u));
        }
        self.conns.remove_id(id);
    }
    fn on_poll(&mut self, ctx: &mut Ctx<'_>) {
        if let Some(f) = self.ops.on_poll {
            self.with(ctx, |c, u| f(c, u));
        }
    }
    fn on_stop(&mut self, ctx: &mut Ctx<'_>) {
        if let Some(f) = self.ops.on_stop {
            self.with(ctx, |c, u| f(c, u));
        }
    }
}

/// Starts the environment's cores in inline mode with `ops` (copied) and `user` (passed
/// to every callback of every core). Returns the runtime, or NULL with errno `EINVAL`
/// (NULL env or ops), `EBUSY` (this environment already ran), `EIO` (a core failed to
/// start; message in `luna_last_error`).
///
/// # Safety
/// `env` is NULL or live; `ops` is NULL or points to a `luna_inline_ops_t`; `user` is
/// used by the callbacks from the core threads as the application sees fit.
#[no_mangle]
pub unsafe extern "C" fn luna_run_inline(
    env: *mut luna_env_t,
    ops: *const luna_inline_ops_t,
    user: *mut c_void,
) -> *mut luna_runtime_t {
    guard(std::ptr::null_mut(), || {
        // SAFETY: NULL or a valid ops struct (caller's contract).
        let ops = *unsafe { ops.as_ref() }.ok_or_else(|| null("ops"))?;
        let user = UserPtr(user);
        start(env, move |cores, opts| {
            let snd_bufs: Vec<usize> = match &cores {
                Cores::Dpdk(c) => c.iter().map(|s| s.stack.tcp.snd_buf as usize).collect(),
                Cores::Mem(c) => c.iter().map(|s| s.stack.tcp.snd_buf as usize).collect(),
            };
            let max_backlog = opts.max_backlog;
            let make = move |i: usize| CApp {
                ops,
                user,
                conns: Handles::new(i),
                listeners: Handles::new(i),
                send_all_limit: snd_bufs.get(i).copied().unwrap_or(0) + max_backlog,
            };
            match cores {
                Cores::Dpdk(c) => Runtime::spawn_inline(c, opts, make),
                Cores::Mem(c) => Runtime::spawn_inline(c, opts, make),
            }
        })
    })
}

/// # Safety
/// `ctx` is NULL or the context of the running callback.
unsafe fn inner<'a>(ctx: *mut luna_ctx_t) -> Res<&'a mut CtxInner<'a, 'a>> {
    // SAFETY: a non-NULL ctx points to the CtxInner of the callback running now, on this
    // thread (caller's contract: contexts are used only during their callback).
    unsafe { ctx.cast::<CtxInner<'a, 'a>>().as_mut() }.ok_or_else(|| null("ctx"))
}

fn conn_of(c: &CtxInner<'_, '_>, id: luna_conn_t) -> Res<Conn> {
    c.conns.get(id).ok_or_else(|| bad_handle("connection", id))
}

/// `EMSGSIZE` for a `luna_send_all` buffer larger than the send buffer and the backlog
/// together: it can never be taken whole (`EAGAIN` would have the caller retry for ever).
fn too_large(c: &CtxInner<'_, '_>, len: usize) -> Res<()> {
    if len > c.send_all_limit {
        return Err(Fail::new(
            libc::EMSGSIZE,
            format!(
                "send_all: {len} bytes are more than the send buffer and the backlog hold \
                 together ({}); send them in pieces (luna_zbuf_slice) or with luna_send",
                c.send_all_limit
            ),
        ));
    }
    Ok(())
}

fn send_fail(e: SendError) -> Fail {
    let errno = match e {
        SendError::WouldBlock => libc::EAGAIN,
        SendError::Shutdown => libc::EPIPE,
        SendError::Closed => libc::ECONNRESET,
        SendError::InvalidHandle => libc::EBADF,
    };
    Fail::new(errno, format!("send: {e}"))
}

/// The core's index (0-based); -1 with `EINVAL` (NULL).
///
/// # Safety
/// `ctx` is NULL or the running callback's context.
#[no_mangle]
pub unsafe extern "C" fn luna_ctx_core(ctx: *mut luna_ctx_t) -> c_int {
    // SAFETY: forwarded caller contract.
    guard(-1, || Ok(unsafe { inner(ctx) }?.ctx.core() as c_int))
}

/// The core clock's time of this iteration, in nanoseconds; 0 for NULL.
///
/// # Safety
/// `ctx` is NULL or the running callback's context.
#[no_mangle]
pub unsafe extern "C" fn luna_ctx_now_ns(ctx: *mut luna_ctx_t) -> u64 {
    // SAFETY: forwarded caller contract.
    guard(0, || Ok(unsafe { inner(ctx) }?.ctx.now().as_nanos()))
}

/// Asks every core of the runtime to stop gracefully. 0, or -1 with `EINVAL`.
///
/// # Safety
/// `ctx` is NULL or the running callback's context.
#[no_mangle]
pub unsafe extern "C" fn luna_ctx_request_stop(ctx: *mut luna_ctx_t) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        unsafe { inner(ctx) }?.ctx.request_stop();
        Ok(0)
    })
}

/// A writable buffer of up to `len` bytes from this core's zbuf cache; NULL with
/// `ENOBUFS` (too large for a size class, or the cache is exhausted), `EINVAL`.
///
/// # Safety
/// `ctx` is NULL or the running callback's context.
#[no_mangle]
pub unsafe extern "C" fn luna_ctx_alloc(ctx: *mut luna_ctx_t, len: usize) -> *mut luna_zbuf_mut_t {
    guard(std::ptr::null_mut(), || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(ctx) }?;
        let b = c
            .ctx
            .alloc(len)
            .map_err(|e| Fail::new(libc::ENOBUFS, format!("alloc {len}: {e}")))?;
        Ok(boxed(luna_zbuf_mut_t(b)))
    })
}

/// Listens on `port` (every core may listen on the same port; the NIC spreads
/// connections by 4-tuple hash). The listener id goes to `*out` (may be NULL). 0, or -1
/// with `EADDRINUSE`, `EINVAL` (NULL ctx, backlog 0).
///
/// # Safety
/// `ctx` is NULL or the running callback's context; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn luna_listen(
    ctx: *mut luna_ctx_t,
    port: u16,
    backlog: u32,
    out: *mut luna_listener_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(ctx) }?;
        let l = c.ctx.listen(port, backlog as usize).map_err(|e| {
            let errno = match e {
                ListenError::AddrInUse => libc::EADDRINUSE,
                ListenError::InvalidBacklog => libc::EINVAL,
            };
            Fail::new(errno, format!("listen on {port}: {e}"))
        })?;
        let id = c.listeners.insert(l);
        // SAFETY: NULL or writable (caller's contract).
        if let Some(o) = unsafe { out.as_mut() } {
            *o = id;
        }
        Ok(0)
    })
}

/// Stops listening. 0, or -1 with `EBADF` (unknown listener), `EINVAL`.
///
/// # Safety
/// `ctx` is NULL or the running callback's context.
#[no_mangle]
pub unsafe extern "C" fn luna_unlisten(ctx: *mut luna_ctx_t, listener: luna_listener_t) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(ctx) }?;
        let l = c
            .listeners
            .remove_id(listener)
            .ok_or_else(|| bad_handle("listener", listener))?;
        c.ctx.unlisten(l);
        Ok(0)
    })
}

/// Connects to `remote` from a port of this core's partition; `on_connected` follows
/// (or `on_closed` with the reason). The id goes to `*out`. 0, or -1 with
/// `ENETUNREACH`, `EINVAL` (bad address, NULL), `EADDRINUSE`, `EADDRNOTAVAIL` (no free
/// port steers to this core), `ENOBUFS` (connection table full).
///
/// # Safety
/// `ctx` is NULL or the running callback's context; `remote` NULL or readable; `out`
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn luna_connect(
    ctx: *mut luna_ctx_t,
    remote: *const luna_addr_t,
    out: *mut luna_conn_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(ctx) }?;
        // SAFETY: NULL or readable (caller's contract).
        let r = unsafe { remote.as_ref() }.ok_or_else(|| null("remote"))?;
        let to: SocketAddrV4 = r.to_socket();
        let h = c.ctx.connect(to).map_err(|e| {
            let errno = match e {
                ConnectError::NoRoute => libc::ENETUNREACH,
                ConnectError::InvalidAddress => libc::EINVAL,
                ConnectError::AddrInUse => libc::EADDRINUSE,
                ConnectError::PortsExhausted => libc::EADDRNOTAVAIL,
                ConnectError::TableFull => libc::ENOBUFS,
            };
            Fail::new(errno, format!("connect to {to}: {e}"))
        })?;
        let id = c.conns.insert(h);
        // SAFETY: NULL or writable (caller's contract).
        if let Some(o) = unsafe { out.as_mut() } {
            *o = id;
        }
        Ok(0)
    })
}

/// The next received buffer (zero copy) in `*out`; returns its length (> 0), 0 at end
/// of stream (`*out` NULL), or -1 with `EAGAIN` (nothing ready), `ECONNRESET` (closed
/// before the end of the stream), `EBADF`, `EINVAL`.
///
/// # Safety
/// `ctx` is NULL or the running callback's context; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn luna_recv(
    ctx: *mut luna_ctx_t,
    conn: luna_conn_t,
    out: *mut *mut luna_zbuf_t,
) -> isize {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(ctx) }?;
        // SAFETY: NULL or writable (caller's contract).
        let out = unsafe { out.as_mut() }.ok_or_else(|| null("out"))?;
        *out = std::ptr::null_mut();
        let h = conn_of(c, conn)?;
        match c.ctx.recv(h) {
            Ok(Some(z)) => {
                let n = z.len() as isize;
                *out = boxed(luna_zbuf_t(z));
                Ok(n)
            }
            Ok(None) => Err(Fail::new(libc::EAGAIN, "recv: nothing ready")),
            Err(e) => recv_end(e),
        }
    })
}

fn recv_end(e: RecvError) -> Res<isize> {
    match e {
        RecvError::Finished => Ok(0),
        RecvError::Closed => Err(Fail::new(libc::ECONNRESET, format!("recv: {e}"))),
        RecvError::InvalidHandle => Err(Fail::new(libc::EBADF, format!("recv: {e}"))),
    }
}

/// Up to `max` received bytes as an io-vector (zero copy) in `*out`; returns the byte
/// count (> 0), 0 at end of stream (`*out` NULL), or -1 as `luna_recv`.
///
/// # Safety
/// As `luna_recv`.
#[no_mangle]
pub unsafe extern "C" fn luna_recv_iovec(
    ctx: *mut luna_ctx_t,
    conn: luna_conn_t,
    max: usize,
    out: *mut *mut luna_iovec_t,
) -> isize {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(ctx) }?;
        // SAFETY: NULL or writable (caller's contract).
        let out = unsafe { out.as_mut() }.ok_or_else(|| null("out"))?;
        *out = std::ptr::null_mut();
        let h = conn_of(c, conn)?;
        match c.ctx.recv_iovec(h, max) {
            Ok(v) if v.is_empty() => {
                if max == 0 {
                    return Err(Fail::new(libc::EINVAL, "recv_iovec: max is 0"));
                }
                Err(Fail::new(libc::EAGAIN, "recv_iovec: nothing ready"))
            }
            Ok(v) => {
                let n = v.len() as isize;
                *out = boxed(luna_iovec_t(v));
                Ok(n)
            }
            Err(e) => recv_end(e),
        }
    })
}

/// Bytes ready to read; -1 with `EBADF`, `EINVAL`.
///
/// # Safety
/// `ctx` is NULL or the running callback's context.
#[no_mangle]
pub unsafe extern "C" fn luna_recv_available(ctx: *mut luna_ctx_t, conn: luna_conn_t) -> isize {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(ctx) }?;
        let h = conn_of(c, conn)?;
        Ok(c.ctx.recv_available(h) as isize)
    })
}

/// Sends as much of `buf` as the TCP send buffer takes now, zero copy (the stack keeps
/// a reference; `buf` stays the caller's to free). Returns the bytes taken; the rest is
/// the caller's to offer again after `on_writable` (`luna_zbuf_slice`). -1 with
/// `EAGAIN` (nothing fits now, including while `luna_send_all` bytes wait), `EPIPE`
/// (shut down), `ECONNRESET` (closed), `EBADF`, `EINVAL`.
///
/// # Safety
/// `ctx` is NULL or the running callback's context; `buf` NULL or live.
#[no_mangle]
pub unsafe extern "C" fn luna_send(
    ctx: *mut luna_ctx_t,
    conn: luna_conn_t,
    buf: *const luna_zbuf_t,
) -> isize {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(ctx) }?;
        // SAFETY: forwarded caller contract.
        let z = unsafe { get(buf, "buf") }?;
        let h = conn_of(c, conn)?;
        c.ctx.send(h, &z.0).map(|n| n as isize).map_err(send_fail)
    })
}

/// Sends all of `buf` or nothing, zero copy: what TCP cannot take now waits in the
/// runtime's bounded backlog and goes first. `buf` stays the caller's to free. 0, or -1
/// with `EAGAIN` (the backlog is full: nothing taken), `EMSGSIZE` (`buf` is larger than
/// the TCP send buffer and the backlog together, the config's `tcp.snd_buf` + 4 MiB: it
/// would never be taken whole; send it in pieces), `EPIPE`, `ECONNRESET`, `EBADF`,
/// `EINVAL`.
///
/// # Safety
/// As `luna_send`.
#[no_mangle]
pub unsafe extern "C" fn luna_send_all(
    ctx: *mut luna_ctx_t,
    conn: luna_conn_t,
    buf: *const luna_zbuf_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(ctx) }?;
        // SAFETY: forwarded caller contract.
        let z = unsafe { get(buf, "buf") }?;
        let h = conn_of(c, conn)?;
        too_large(c, z.0.len())?;
        c.ctx.send_all(h, z.0.clone()).map_err(send_fail)?;
        Ok(0)
    })
}

/// Copies `len` bytes of `data` into one buffer from the core's cache and sends it as
/// `luna_send_all` does (all or nothing). 0, or -1 as `luna_send_all` (`EMSGSIZE`
/// included), plus `ENOBUFS` (no buffer that large).
///
/// # Safety
/// `ctx` is NULL or the running callback's context; `data` holds `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn luna_send_copy(
    ctx: *mut luna_ctx_t,
    conn: luna_conn_t,
    data: *const c_void,
    len: usize,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(ctx) }?;
        let h = conn_of(c, conn)?;
        if len == 0 {
            return Ok(0);
        }
        if data.is_null() {
            return Err(null("data"));
        }
        too_large(c, len)?;
        // SAFETY: `data` holds `len` readable bytes (caller's contract).
        let src = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
        let mut b = c
            .ctx
            .alloc(len)
            .map_err(|e| Fail::new(libc::ENOBUFS, format!("alloc {len}: {e}")))?;
        b.extend_from_slice(src)
            .map_err(|_| Fail::new(libc::ENOBUFS, format!("alloc {len}: short buffer")))?;
        c.ctx.send_all(h, b.freeze()).map_err(send_fail)?;
        Ok(0)
    })
}

/// Free send-buffer space (what `luna_send` would take now); -1 with `EBADF`, `EINVAL`.
///
/// # Safety
/// `ctx` is NULL or the running callback's context.
#[no_mangle]
pub unsafe extern "C" fn luna_send_capacity(ctx: *mut luna_ctx_t, conn: luna_conn_t) -> isize {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(ctx) }?;
        let h = conn_of(c, conn)?;
        Ok(c.ctx.send_capacity(h) as isize)
    })
}

/// Bytes of `luna_send_all` still waiting in the runtime's backlog; -1 with `EBADF`,
/// `EINVAL`.
///
/// # Safety
/// `ctx` is NULL or the running callback's context.
#[no_mangle]
pub unsafe extern "C" fn luna_send_backlog(ctx: *mut luna_ctx_t, conn: luna_conn_t) -> isize {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(ctx) }?;
        let h = conn_of(c, conn)?;
        Ok(c.ctx.send_backlog(h) as isize)
    })
}

/// Closes gracefully (after backlogged data); the id dies now (no `on_closed` follows).
/// 0, or -1 with `EBADF`, `EINVAL`.
///
/// # Safety
/// `ctx` is NULL or the running callback's context.
#[no_mangle]
pub unsafe extern "C" fn luna_close(ctx: *mut luna_ctx_t, conn: luna_conn_t) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(ctx) }?;
        let h = c
            .conns
            .remove_id(conn)
            .ok_or_else(|| bad_handle("connection", conn))?;
        c.ctx.close(h);
        Ok(0)
    })
}

/// Resets the connection; the id dies now. 0, or -1 with `EBADF`, `EINVAL`.
///
/// # Safety
/// `ctx` is NULL or the running callback's context.
#[no_mangle]
pub unsafe extern "C" fn luna_abort(ctx: *mut luna_ctx_t, conn: luna_conn_t) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(ctx) }?;
        let h = c
            .conns
            .remove_id(conn)
            .ok_or_else(|| bad_handle("connection", conn))?;
        c.ctx.abort(h);
        Ok(0)
    })
}

/// The connection's local and remote addresses (either pointer may be NULL). 0, or -1
/// with `EBADF`, `EINVAL`.
///
/// # Safety
/// `ctx` is NULL or the running callback's context; `local`/`remote` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn luna_conn_addrs(
    ctx: *mut luna_ctx_t,
    conn: luna_conn_t,
    local: *mut luna_addr_t,
    remote: *mut luna_addr_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(ctx) }?;
        let h = conn_of(c, conn)?;
        let (l, r) = c
            .ctx
            .addrs(h)
            .ok_or_else(|| bad_handle("connection", conn))?;
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

/// Attaches `p` to the connection (returned by `luna_conn_user`; luna never reads it).
/// 0, or -1 with `EBADF`, `EINVAL`.
///
/// # Safety
/// `ctx` is NULL or the running callback's context.
#[no_mangle]
pub unsafe extern "C" fn luna_conn_set_user(
    ctx: *mut luna_ctx_t,
    conn: luna_conn_t,
    p: *mut c_void,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(ctx) }?;
        if c.conns.set_user(conn, p) {
            Ok(0)
        } else {
            Err(bad_handle("connection", conn))
        }
    })
}

/// The pointer attached with `luna_conn_set_user` (NULL if none; NULL with `EBADF` for
/// an unknown connection, `EINVAL` for NULL ctx).
///
/// # Safety
/// `ctx` is NULL or the running callback's context.
#[no_mangle]
pub unsafe extern "C" fn luna_conn_user(ctx: *mut luna_ctx_t, conn: luna_conn_t) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        // SAFETY: forwarded caller contract.
        let c = unsafe { inner(ctx) }?;
        c.conns
            .user(conn)
            .ok_or_else(|| bad_handle("connection", conn))
    })
}
