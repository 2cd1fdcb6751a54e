//! batch-r2c: each poll iteration the stack's events are folded into a per-core readiness
//! set, then the application runs once against a BSD-socket/epoll-like API. Existing
//! event-loop servers port by replacing calls: `socket/bind/listen/accept/connect/send/
//! recv/close`, `register` for `epoll_ctl` and `poll` for `epoll_wait` (timeout 0, level
//! triggered). Nothing blocks: calls that would block return [`SockError::WouldBlock`] and
//! `connect` returns [`SockError::InProgress`], as non-blocking sockets do.
//!
//! ```
//! use r2c::batch::{BatchApp, Fd, Interest, PollEvent, SockError, Sockets};
//! /// An echo server written like an epoll loop.
//! #[derive(Default)]
//! struct Echo { lfd: Option<Fd>, events: Vec<PollEvent>, buf: Vec<u8> }
//! impl BatchApp for Echo {
//!     fn on_start(&mut self, s: &mut Sockets<'_>) {
//!         let fd = s.socket();
//!         s.bind(fd, 7).unwrap();
//!         s.listen(fd, 1024).unwrap();
//!         s.register(fd, Interest::READABLE).unwrap();
//!         self.lfd = Some(fd);
//!         self.buf = vec![0; 4096];
//!     }
//!     fn on_poll(&mut self, s: &mut Sockets<'_>) {
//!         s.poll(&mut self.events);                        // epoll_wait(.., 0)
//!         for ev in std::mem::take(&mut self.events) {
//!             if Some(ev.fd) == self.lfd {
//!                 while let Ok((c, _peer)) = s.accept(ev.fd) {
//!                     s.register(c, Interest::READABLE).unwrap();
//!                 }
//!                 continue;
//!             }
//!             loop {
//!                 match s.recv(ev.fd, &mut self.buf) {
//!                     Ok(0) | Err(SockError::ConnReset) => { s.close(ev.fd).ok(); break }
//!                     Ok(n) => { s.send(ev.fd, &self.buf[..n]).ok(); }
//!                     Err(_) => break,                     // WouldBlock
//!                 }
//!             }
//!         }
//!     }
//! }
//! ```

use crate::core::{doorbell_for, Conn, CoreState, IdleStrategy, Listener, Mode};
use core::fmt;
use core::net::SocketAddrV4;
use luna_stack::stack::{ConnectError, Event, ListenError};
use luna_stack::stack::{RecvError, SendError};
use luna_stack::tcp::{CloseReason, State};
use msgsched::doorbell::Sleeper;
use msgsched::socket::Bell;
use std::collections::HashMap;
use zbuf::Zbuf;

/// A socket descriptor, per core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fd(pub u32);

/// What a registered socket is watched for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Interest {
    /// Data, end of stream, or (listeners) connections to accept.
    pub readable: bool,
    /// Send-buffer space (and, for a connecting socket, connect completion).
    pub writable: bool,
}

impl Interest {
    /// `EPOLLIN`.
    pub const READABLE: Interest = Interest {
        readable: true,
        writable: false,
    };
    /// `EPOLLOUT`.
    pub const WRITABLE: Interest = Interest {
        readable: false,
        writable: true,
    };
    /// Both.
    pub const BOTH: Interest = Interest {
        readable: true,
        writable: true,
    };
}

/// One ready socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollEvent {
    /// The socket.
    pub fd: Fd,
    /// Readable (`EPOLLIN`).
    pub readable: bool,
    /// Writable (`EPOLLOUT`).
    pub writable: bool,
    /// The peer closed or the connection ended (`EPOLLHUP`/`EPOLLRDHUP`).
    pub hup: bool,
    /// The connection failed (`EPOLLERR`; the error is also returned by the next call).
    pub error: Option<SockError>,
}

/// Socket errors; [`SockError::errno`] gives the Linux errno for a C edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SockError {
    /// `EAGAIN`: nothing to do now; wait for readiness.
    WouldBlock,
    /// `EINPROGRESS`: connect started; writable readiness reports completion.
    InProgress,
    /// `EBADF`: no such socket.
    BadFd,
    /// `EINVAL`: the call does not fit the socket's state (e.g. listen on a connected one).
    InvalidInput,
    /// `EADDRINUSE`.
    AddrInUse,
    /// `EADDRNOTAVAIL`: no free local port in this core's partition.
    AddrNotAvail,
    /// `ENOTCONN`.
    NotConnected,
    /// `EISCONN`.
    IsConnected,
    /// `ECONNREFUSED`.
    ConnRefused,
    /// `ECONNRESET` (reset by the peer or aborted).
    ConnReset,
    /// `ETIMEDOUT`.
    TimedOut,
    /// `ENETUNREACH`.
    NoRoute,
    /// `EHOSTUNREACH`: the connection attempt's next hop did not answer ARP.
    HostUnreachable,
    /// `EPIPE`: sending after shutdown.
    BrokenPipe,
    /// `ENOBUFS`: no buffer or connection slot.
    NoBufs,
}

impl SockError {
    /// The Linux errno value.
    pub fn errno(self) -> i32 {
        match self {
            SockError::WouldBlock => 11,
            SockError::InProgress => 115,
            SockError::BadFd => 9,
            SockError::InvalidInput => 22,
            SockError::AddrInUse => 98,
            SockError::AddrNotAvail => 99,
            SockError::NotConnected => 107,
            SockError::IsConnected => 106,
            SockError::ConnRefused => 111,
            SockError::ConnReset => 104,
            SockError::TimedOut => 110,
            SockError::NoRoute => 101,
            SockError::HostUnreachable => 113,
            SockError::BrokenPipe => 32,
            SockError::NoBufs => 105,
        }
    }

    fn from_send(e: SendError) -> SockError {
        match e {
            SendError::WouldBlock => SockError::WouldBlock,
            SendError::Shutdown => SockError::BrokenPipe,
            SendError::Closed => SockError::ConnReset,
            SendError::InvalidHandle => SockError::BadFd,
        }
    }

    fn from_close(r: Option<CloseReason>) -> Option<SockError> {
        match r {
            Some(CloseReason::Reset) | Some(CloseReason::Aborted) => Some(SockError::ConnReset),
            Some(CloseReason::Refused) => Some(SockError::ConnRefused),
            Some(CloseReason::Timeout) => Some(SockError::TimedOut),
            Some(CloseReason::HostUnreachable) => Some(SockError::HostUnreachable),
            Some(CloseReason::Normal) | None => None,
        }
    }
}

impl fmt::Display for SockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?} (errno {})", self.errno())
    }
}

impl std::error::Error for SockError {}

#[derive(Debug)]
enum Kind {
    Fresh { port: Option<u16> },
    Listening(Listener),
    Conn(ConnSock),
}

#[derive(Debug)]
struct ConnSock {
    h: Conn,
    connected: bool,
    /// A chunk partly copied out by `recv`.
    partial: Option<Zbuf>,
    eof: bool,
    /// The stack reported the connection ended.
    ended: bool,
    error: Option<SockError>,
    /// `shutdown` was called: sends fail with `BrokenPipe`.
    shut: bool,
}

#[derive(Debug)]
struct Sock {
    kind: Kind,
    interest: Option<Interest>,
    /// A listener had an Acceptable event not yet drained by `accept`.
    pending: bool,
}

/// The per-core socket table and readiness set.
#[derive(Debug, Default)]
pub struct SocketTable {
    socks: Vec<Option<Sock>>,
    free: Vec<u32>,
    by_conn: HashMap<Conn, Fd>,
    by_listener: HashMap<Listener, Fd>,
    /// Sockets that may be ready (an event touched them, or they were ready last poll).
    ready: Vec<Fd>,
    /// Per descriptor: whether it is in `ready`. Kept by descriptor, not by socket: a
    /// closed socket's descriptor stays listed until the next `poll` passes it, and a new
    /// socket given that descriptor meanwhile is served by that entry (a flag of the
    /// socket's own listed it a second time, and `poll` reported it twice).
    listed: Vec<bool>,
}

impl SocketTable {
    fn insert(&mut self, kind: Kind) -> Fd {
        let s = Some(Sock {
            kind,
            interest: None,
            pending: false,
        });
        match self.free.pop() {
            Some(i) => {
                self.socks[i as usize] = s;
                Fd(i)
            }
            None => {
                self.socks.push(s);
                self.listed.push(false);
                Fd(self.socks.len() as u32 - 1)
            }
        }
    }

    fn get(&mut self, fd: Fd) -> Result<&mut Sock, SockError> {
        self.socks
            .get_mut(fd.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(SockError::BadFd)
    }

    fn touch(&mut self, fd: Fd) {
        let i = fd.0 as usize;
        if matches!(self.socks.get(i), Some(Some(_))) && !self.listed[i] {
            self.listed[i] = true;
            self.ready.push(fd);
        }
    }

    /// Fold one stack event into the readiness set.
    fn on_event(&mut self, st: &mut CoreState, ev: Event) {
        match ev {
            Event::Acceptable(l) => {
                if let Some(&fd) = self.by_listener.get(&l) {
                    if let Ok(s) = self.get(fd) {
                        s.pending = true;
                    }
                    self.touch(fd);
                }
            }
            Event::Connected(h) | Event::Readable(h) | Event::Writable(h) => {
                if matches!(ev, Event::Connected(_)) {
                    st.stats.connected += 1;
                }
                if let Some(&fd) = self.by_conn.get(&h) {
                    if let Ok(Sock {
                        kind: Kind::Conn(c),
                        ..
                    }) = self.get(fd)
                    {
                        if matches!(ev, Event::Connected(_)) {
                            c.connected = true;
                        }
                    }
                    self.touch(fd);
                }
            }
            Event::Closed(h) => {
                let reason = st.stack.close_reason(h);
                st.stats.closed += 1;
                if let Some(&fd) = self.by_conn.get(&h) {
                    if let Ok(Sock {
                        kind: Kind::Conn(c),
                        ..
                    }) = self.get(fd)
                    {
                        c.ended = true;
                        c.error = SockError::from_close(reason);
                    }
                    self.touch(fd);
                }
            }
        }
    }
}

/// The socket API of one core, handed to [`BatchApp`] each iteration.
pub struct Sockets<'a> {
    st: &'a mut CoreState,
    t: &'a mut SocketTable,
    bell: Option<&'a Bell>,
}

impl Sockets<'_> {
    /// The core's doorbell, under `IdleStrategy::Backoff` only (`None` otherwise: the
    /// core never sleeps). For an application that other threads feed (work queued for
    /// `on_poll`): such a thread rings it after queueing, and the core, if asleep,
    /// wakes at once instead of at the end of its backoff step; the application's
    /// [`BatchApp::pending`] is the core's re-check before it sleeps. A ring costs a
    /// fence and a load while the core is awake.
    pub fn doorbell(&self) -> Option<Bell> {
        self.bell.cloned()
    }

    /// The core's index.
    pub fn core(&self) -> usize {
        self.st.index
    }

    /// The time of this iteration.
    pub fn now(&self) -> luna_stack::time::Instant {
        self.st.now
    }

    /// Ask every core to shut down gracefully.
    pub fn request_stop(&self) {
        self.st.request_stop()
    }

    /// Whether shutdown was requested.
    pub fn stop_requested(&self) -> bool {
        self.st.stop_requested()
    }

    /// `socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0)`.
    pub fn socket(&mut self) -> Fd {
        self.t.insert(Kind::Fresh { port: None })
    }

    /// `bind`: the local port (0 = chosen at connect from this core's partition).
    pub fn bind(&mut self, fd: Fd, port: u16) -> Result<(), SockError> {
        match &mut self.t.get(fd)?.kind {
            Kind::Fresh { port: p } => {
                *p = (port != 0).then_some(port);
                Ok(())
            }
            _ => Err(SockError::InvalidInput),
        }
    }

    /// `listen`.
    pub fn listen(&mut self, fd: Fd, backlog: usize) -> Result<(), SockError> {
        let port = match self.t.get(fd)?.kind {
            Kind::Fresh { port: Some(p) } => p,
            _ => return Err(SockError::InvalidInput),
        };
        let l = self.st.listen(port, backlog).map_err(|e| match e {
            ListenError::AddrInUse => SockError::AddrInUse,
            ListenError::InvalidBacklog => SockError::InvalidInput,
        })?;
        self.t.get(fd)?.kind = Kind::Listening(l);
        self.t.by_listener.insert(l, fd);
        Ok(())
    }

    /// `accept4(.., SOCK_NONBLOCK)`: a new socket and the peer's address.
    pub fn accept(&mut self, fd: Fd) -> Result<(Fd, SocketAddrV4), SockError> {
        let s = self.t.get(fd)?;
        let Kind::Listening(l) = s.kind else {
            return Err(SockError::InvalidInput);
        };
        let Some(h) = self.st.accept(l) else {
            s.pending = false;
            return Err(SockError::WouldBlock);
        };
        let peer = self
            .st
            .stack
            .connection(h)
            .map(|c| c.tuple().remote)
            .ok_or(SockError::ConnReset)?;
        let nfd = self.t.insert(Kind::Conn(ConnSock {
            h,
            connected: true,
            partial: None,
            eof: false,
            ended: false,
            error: None,
            shut: false,
        }));
        self.t.by_conn.insert(h, nfd);
        Ok((nfd, peer))
    }

    /// Non-blocking `connect`: `Err(InProgress)` once started; the socket turns writable
    /// when the handshake completes (or reports an error).
    pub fn connect(&mut self, fd: Fd, remote: SocketAddrV4) -> Result<(), SockError> {
        self.connect_from(fd, None, remote)
    }

    /// [`connect`](Self::connect) from the local address `local` (`bind` to an address
    /// before `connect`; `None`: the route's source), which must be one of the stack's
    /// (`InvalidInput` otherwise; RFC 9293 §3.9.1.1 MUST-43).
    pub fn connect_from(
        &mut self,
        fd: Fd,
        local: Option<core::net::Ipv4Addr>,
        remote: SocketAddrV4,
    ) -> Result<(), SockError> {
        let port = match self.t.get(fd)?.kind {
            Kind::Fresh { port } => port,
            Kind::Conn(_) => return Err(SockError::IsConnected),
            Kind::Listening(_) => return Err(SockError::InvalidInput),
        };
        let now = self.st.now;
        let r = match (port, local) {
            (Some(p), None) => self.st.stack.connect(now, remote, Some(p)),
            (Some(p), Some(ip)) => self.st.stack.connect_from(now, ip, remote, Some(p)),
            (None, local) => self.st.connect_from(local, remote),
        };
        if let (Some(_), Ok(h)) = (port, &r) {
            self.st.open.insert(*h);
        }
        let h = r.map_err(|e| match e {
            ConnectError::NoRoute => SockError::NoRoute,
            ConnectError::InvalidAddress => SockError::InvalidInput,
            ConnectError::AddrInUse => SockError::AddrInUse,
            ConnectError::PortsExhausted => SockError::AddrNotAvail,
            ConnectError::TableFull => SockError::NoBufs,
        })?;
        self.t.get(fd)?.kind = Kind::Conn(ConnSock {
            h,
            connected: false,
            partial: None,
            eof: false,
            ended: false,
            error: None,
            shut: false,
        });
        self.t.by_conn.insert(h, fd);
        Err(SockError::InProgress)
    }

    fn conn(&mut self, fd: Fd) -> Result<&mut ConnSock, SockError> {
        match &mut self.t.get(fd)?.kind {
            Kind::Conn(c) => Ok(c),
            _ => Err(SockError::NotConnected),
        }
    }

    /// `send`: copies `data` into buffers (the compatibility path); returns bytes taken.
    pub fn send(&mut self, fd: Fd, data: &[u8]) -> Result<usize, SockError> {
        let h = self.conn(fd)?.h;
        if data.is_empty() {
            return Ok(0);
        }
        let n = data.len().min(self.st.send_capacity(h));
        if n == 0 {
            // No room: say why (full, shut down or closed) without queueing anything.
            let c = self.conn(fd)?;
            let (sock, h) = (send_state(c), c.h);
            return Err(send_blocked(self.st, sock, h));
        }
        let mut z = self.st.alloc(n).map_err(|_| SockError::NoBufs)?;
        z.extend_from_slice(&data[..n])
            .map_err(|_| SockError::NoBufs)?;
        self.send_zbuf(fd, z.freeze())
    }

    /// Zero-copy `send`: queues as much of `data` as the send buffer takes; returns bytes
    /// taken.
    pub fn send_zbuf(&mut self, fd: Fd, data: Zbuf) -> Result<usize, SockError> {
        let c = self.conn(fd)?;
        if let Some(e) = c.error {
            return Err(e);
        }
        if c.shut {
            return Err(SockError::BrokenPipe);
        }
        let h = c.h;
        self.st.send(h, &data).map_err(SockError::from_send)
    }

    /// `recv`: copies into `buf`; `Ok(0)` is end of stream.
    pub fn recv(&mut self, fd: Fd, buf: &mut [u8]) -> Result<usize, SockError> {
        // An empty read still names a socket: `EBADF` / `ENOTCONN` as recv(2), not a 0
        // that reads as end of stream.
        self.conn(fd)?;
        if buf.is_empty() {
            return Ok(0);
        }
        let chunk = {
            let c = self.conn(fd)?;
            c.partial.take()
        };
        let mut chunk = match chunk {
            Some(z) => z,
            None => match self.recv_zbuf(fd)? {
                Some(z) => z,
                None => return Ok(0),
            },
        };
        let n = chunk.len().min(buf.len());
        buf[..n].copy_from_slice(&chunk[..n]);
        if n < chunk.len() {
            chunk.advance(n);
            self.conn(fd)?.partial = Some(chunk);
        }
        Ok(n)
    }

    /// Zero-copy `recv`: `Ok(Some(buf))`, `Ok(None)` at end of stream, `Err(WouldBlock)`.
    pub fn recv_zbuf(&mut self, fd: Fd) -> Result<Option<Zbuf>, SockError> {
        let c = self.conn(fd)?;
        if let Some(z) = c.partial.take() {
            return Ok(Some(z));
        }
        if c.eof {
            return Ok(None);
        }
        let (h, err) = (c.h, c.error);
        match self.st.recv(h) {
            Ok(Some(z)) => Ok(Some(z)),
            Ok(None) => Err(SockError::WouldBlock),
            Err(RecvError::Finished) => {
                self.conn(fd)?.eof = true;
                Ok(None)
            }
            Err(RecvError::Closed) => Err(err.unwrap_or(SockError::ConnReset)),
            Err(RecvError::InvalidHandle) => Err(err.unwrap_or(SockError::NotConnected)),
        }
    }

    /// `shutdown(SHUT_WR)`: FIN after queued data.
    pub fn shutdown(&mut self, fd: Fd) -> Result<(), SockError> {
        let c = self.conn(fd)?;
        c.shut = true;
        let h = c.h;
        self.st.stack.shutdown(h);
        Ok(())
    }

    /// `close`: graceful close of a connection, or stop listening.
    pub fn close(&mut self, fd: Fd) -> Result<(), SockError> {
        let s = self.t.get(fd)?;
        let kind = std::mem::replace(&mut s.kind, Kind::Fresh { port: None });
        match kind {
            Kind::Fresh { .. } => {}
            Kind::Listening(l) => {
                self.t.by_listener.remove(&l);
                self.st.unlisten(l);
            }
            Kind::Conn(c) => {
                self.t.by_conn.remove(&c.h);
                if c.ended {
                    self.st.stack.close(c.h);
                    self.st.open.remove(&c.h);
                } else {
                    self.st.close(c.h);
                }
            }
        }
        self.t.socks[fd.0 as usize] = None;
        self.t.free.push(fd.0);
        Ok(())
    }

    /// `close` with `SO_LINGER` `{on, 0}`: a connection is reset (RST at once; queued
    /// bytes, sent or not, are dropped), as Linux's `tcp_close` does for a zero linger
    /// time or for data the application never read; a listener stops listening (its
    /// unaccepted connections are reset, as with `close`) and a fresh socket is freed.
    pub fn abort(&mut self, fd: Fd) -> Result<(), SockError> {
        let s = self.t.get(fd)?;
        // (A connection the stack already ended has nothing left to reset: `close`.)
        if let Kind::Conn(c) = &s.kind {
            if !c.ended {
                let h = c.h;
                s.kind = Kind::Fresh { port: None };
                self.t.by_conn.remove(&h);
                self.st.abort(h);
            }
        }
        self.close(fd)
    }

    /// `TCP_NODELAY` = `!on`: Nagle's algorithm for this connection (RFC 9293 §3.7.4
    /// MUST-17).
    pub fn set_nagle(&mut self, fd: Fd, on: bool) -> Result<(), SockError> {
        let h = self.conn(fd)?.h;
        self.st.stack.set_nagle(h, on);
        Ok(())
    }

    /// `IP_TOS`: the DiffServ codepoint (0..=63; `InvalidInput` above) of the
    /// connection's segments from now on.
    pub fn set_dscp(&mut self, fd: Fd, dscp: u8) -> Result<(), SockError> {
        let h = self.conn(fd)?.h;
        if self.st.stack.set_dscp(h, dscp) {
            Ok(())
        } else {
            Err(SockError::InvalidInput)
        }
    }

    /// The application closed the socket but goes on handing the connection bytes it
    /// had queued before the close (an LD_PRELOAD shim's send queue): from now on the
    /// stack treats it as closed ([`luna_stack::stack::Stack::orphan`]: zero-window probes
    /// count toward R2 even when answered, so a peer that keeps its window shut cannot
    /// hold it for ever). [`close`](Self::close) still follows the last byte.
    pub fn orphan(&mut self, fd: Fd) -> Result<(), SockError> {
        let h = self.conn(fd)?.h;
        self.st.stack.orphan(h);
        Ok(())
    }

    /// Bytes not yet acknowledged by the peer (sent or not; Linux's `SIOCOUTQ`), plus one
    /// for a FIN sent and not acknowledged (FIN-WAIT-1, CLOSING, LAST-ACK): 0 once
    /// everything the socket sent was acknowledged, and for a connection that ended.
    pub fn unacked(&mut self, fd: Fd) -> Result<usize, SockError> {
        let h = self.conn(fd)?.h;
        Ok(self.st.stack.connection(h).map_or(0, |c| {
            let fin = matches!(c.state(), State::FinWait1 | State::Closing | State::LastAck);
            c.send_queued() + usize::from(fin)
        }))
    }

    /// The TCP connection behind a connected socket, for what `getsockopt(TCP_INFO)`
    /// reports (state, RTT, windows, counters); `None` once the stack freed it.
    /// `NotConnected` for a socket that is not a connection (a listener, a fresh one).
    pub fn connection(
        &mut self,
        fd: Fd,
    ) -> Result<Option<&luna_stack::tcp::Connection>, SockError> {
        let h = self.conn(fd)?.h;
        Ok(self.st.stack.connection(h))
    }

    /// `epoll_ctl(ADD/MOD)`.
    pub fn register(&mut self, fd: Fd, interest: Interest) -> Result<(), SockError> {
        self.t.get(fd)?.interest = Some(interest);
        // Level triggered: whatever is ready already shows up at the next poll.
        self.t.touch(fd);
        Ok(())
    }

    /// `epoll_ctl(DEL)`.
    pub fn deregister(&mut self, fd: Fd) -> Result<(), SockError> {
        self.t.get(fd)?.interest = None;
        Ok(())
    }

    /// `epoll_wait(.., timeout 0)`: fills `out` with the registered sockets that are ready
    /// now (level triggered: a socket stays ready until drained). Returns how many.
    pub fn poll(&mut self, out: &mut Vec<PollEvent>) -> usize {
        out.clear();
        let candidates = std::mem::take(&mut self.t.ready);
        for fd in candidates {
            let i = fd.0 as usize;
            let Some(Some(s)) = self.t.socks.get_mut(i) else {
                // Closed since it was listed.
                self.t.listed[i] = false;
                continue;
            };
            let Some(interest) = s.interest else {
                self.t.listed[i] = false;
                continue;
            };
            let ev = readiness(self.st, fd, s);
            let wanted = (interest.readable && ev.readable)
                || (interest.writable && ev.writable)
                || ev.hup
                || ev.error.is_some();
            if wanted {
                out.push(PollEvent {
                    readable: ev.readable && interest.readable,
                    writable: ev.writable && interest.writable,
                    ..ev
                });
                self.t.ready.push(fd);
            } else {
                self.t.listed[i] = false;
            }
        }
        out.len()
    }

    /// The connection's addresses (local, remote).
    pub fn addrs(&mut self, fd: Fd) -> Result<(SocketAddrV4, SocketAddrV4), SockError> {
        let h = self.conn(fd)?.h;
        self.st
            .stack
            .connection(h)
            .map(|c| (c.tuple().local, c.tuple().remote))
            .ok_or(SockError::NotConnected)
    }
}

/// What a connected socket's own bookkeeping says about sending.
fn send_state(c: &ConnSock) -> Result<(), SockError> {
    match c.error {
        Some(e) => Err(e),
        None if c.shut => Err(SockError::BrokenPipe),
        None => Ok(()),
    }
}

/// Why a send that found no room takes nothing: the socket's recorded error or
/// shutdown, a close by the runtime (shutdown of the core), the connection's TCP state,
/// or else a full send buffer (`WouldBlock`).
fn send_blocked(st: &CoreState, sock: Result<(), SockError>, h: Conn) -> SockError {
    if let Err(e) = sock {
        return e;
    }
    if !st.open.contains(&h) {
        // The runtime closed it (graceful shutdown): the sending side is shut.
        return SockError::BrokenPipe;
    }
    match st.stack.state(h) {
        None => SockError::BadFd,
        Some(State::Closed) => SockError::ConnReset,
        Some(State::SynSent | State::SynReceived | State::Established | State::CloseWait) => {
            SockError::WouldBlock
        }
        Some(_) => SockError::BrokenPipe,
    }
}

fn readiness(st: &CoreState, fd: Fd, s: &Sock) -> PollEvent {
    let mut ev = PollEvent {
        fd,
        readable: false,
        writable: false,
        hup: false,
        error: None,
    };
    match &s.kind {
        Kind::Fresh { .. } => {}
        Kind::Listening(_) => ev.readable = s.pending,
        Kind::Conn(c) => {
            let conn = st.stack.connection(c.h);
            let avail = conn.map_or(0, |x| x.recv_available());
            let fin = conn.is_none_or(|x| {
                matches!(
                    x.state(),
                    State::CloseWait
                        | State::LastAck
                        | State::Closing
                        | State::TimeWait
                        | State::Closed
                )
            });
            ev.readable = c.partial.is_some() || avail > 0 || c.eof || fin || c.ended;
            ev.writable = c.connected && !c.ended && st.send_capacity(c.h) > 0;
            ev.hup = c.ended || c.eof;
            ev.error = c.error;
        }
    }
    ev
}

/// An application run in batch mode.
pub trait BatchApp {
    /// Once on the core's thread before the first poll.
    fn on_start(&mut self, _s: &mut Sockets<'_>) {}
    /// Once per iteration, after the burst's events are in the readiness set (twice when
    /// the burst is answered in halves, `CoreOptions::rx_split`: once per half).
    fn on_poll(&mut self, s: &mut Sockets<'_>);
    /// Shutdown began; open connections are closed right after this returns.
    fn on_stop(&mut self, _s: &mut Sockets<'_>) {}
    /// Whether work other threads queued for `on_poll` is waiting: asked by a core
    /// about to sleep under `IdleStrategy::Backoff`, after it announced the sleep, so
    /// it must see whatever those threads queued before ringing
    /// [`Sockets::doorbell`]. Default: nothing (no other thread feeds the application).
    fn pending(&self) -> bool {
        false
    }
}

impl<F: FnMut(&mut Sockets<'_>)> BatchApp for F {
    fn on_poll(&mut self, s: &mut Sockets<'_>) {
        self(s)
    }
}

pub(crate) struct BatchMode<A> {
    app: A,
    table: SocketTable,
    /// `Backoff`'s sleep and its doorbell (handed out by [`Sockets::doorbell`]).
    sleeper: Option<Sleeper>,
}

impl<A: BatchApp> BatchMode<A> {
    pub(crate) fn new(app: A, idle: IdleStrategy) -> Self {
        BatchMode {
            app,
            table: SocketTable::default(),
            sleeper: doorbell_for(idle),
        }
    }
}

impl<A: BatchApp> Mode for BatchMode<A> {
    fn start(&mut self, st: &mut CoreState) {
        self.app.on_start(&mut Sockets {
            st,
            t: &mut self.table,
            bell: self.sleeper.as_ref().map(Sleeper::doorbell),
        });
    }

    fn iteration(&mut self, st: &mut CoreState) -> bool {
        let mut events = 0;
        while let Some(ev) = st.stack.poll_event() {
            events += 1;
            self.table.on_event(st, ev);
        }
        st.stats.events += events;
        self.app.on_poll(&mut Sockets {
            st,
            t: &mut self.table,
            bell: self.sleeper.as_ref().map(Sleeper::doorbell),
        });
        events > 0
    }

    fn stop(&mut self, st: &mut CoreState) {
        self.app.on_stop(&mut Sockets {
            st,
            t: &mut self.table,
            bell: self.sleeper.as_ref().map(Sleeper::doorbell),
        });
    }

    fn sleep(&mut self, d: luna_stack::time::Duration) -> u64 {
        let app = &self.app;
        crate::core::wakeable_sleep(self.sleeper.as_mut(), d, || app.pending())
    }
}
