//! inline-r2c: application callbacks run inside the poll loop's pass over a received
//! burst. Once the burst's frames have been through the stack, its events are dispatched
//! at once, so receive, TCP, the callback, the reply's header build and transmit happen
//! in one pass over hot caches, with no queue to another thread in between.
//!
//! Events are coalesced per pass: a connection whose frames arrived in one burst gets one
//! `on_readable` for all of them (another only while data it has not read remains) and
//! one `on_writable`, not one per segment. An application reads until `recv` says
//! `None`, as with an edge-triggered epoll.
//!
//! ```
//! use r2c::{Conn, Ctx, InlineApp};
//! /// An echo server: every received buffer goes back as is (zero copy).
//! struct Echo;
//! impl InlineApp for Echo {
//!     fn on_start(&mut self, ctx: &mut Ctx<'_>) {
//!         ctx.listen(7, 1024).expect("port 7 is free");
//!     }
//!     fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
//!         loop {
//!             match ctx.recv(conn) {
//!                 Ok(Some(buf)) => {
//!                     if ctx.send_all(conn, buf).is_err() {
//!                         return ctx.abort(conn);
//!                     }
//!                 }
//!                 Ok(None) => return,
//!                 Err(_) => return ctx.close(conn), // end of stream or reset
//!             }
//!         }
//!     }
//! }
//! ```

use crate::core::{Conn, CoreState, Listener, Mode};
use core::net::SocketAddrV4;
use luna_stack::stack::{ConnectError, Event, ListenError, RecvError, SendError};
use luna_stack::tcp::CloseReason;
use luna_stack::time::Instant;
use zbuf::{AllocError, IoVec, Zbuf, ZbufMut};

use crate::view::StackView;

/// What a callback may do: the core's socket calls, buffers and clock.
pub struct Ctx<'a> {
    pub(crate) st: &'a mut CoreState,
}

impl Ctx<'_> {
    /// The core's index in the runtime.
    pub fn core(&self) -> usize {
        self.st.index
    }

    /// The time of this iteration.
    pub fn now(&self) -> Instant {
        self.st.now
    }

    /// This core's counters as of now (unpublished; the loop-stall counters include
    /// this iteration's gap): an application can difference two readings to count what
    /// happened between them.
    pub fn stats(&self) -> &crate::CoreStats {
        &self.st.stats
    }

    /// Listen on `port` (every core of a runtime may listen on the same port: the NIC's RSS
    /// spreads connections over them by 4-tuple hash).
    pub fn listen(&mut self, port: u16, backlog: usize) -> Result<Listener, ListenError> {
        self.st.listen(port, backlog)
    }

    /// Stop listening.
    pub fn unlisten(&mut self, l: Listener) {
        self.st.unlisten(l)
    }

    /// Connect to `remote` from a port of this core's partition whose replies the NIC
    /// steers to this core; `on_connected` follows.
    pub fn connect(&mut self, remote: SocketAddrV4) -> Result<Conn, ConnectError> {
        self.st.connect(remote)
    }

    /// The next received buffer (zero copy), `Ok(None)` when nothing is ready,
    /// `Err(Finished)` at end of stream.
    pub fn recv(&mut self, conn: Conn) -> Result<Option<Zbuf>, RecvError> {
        let r = self.st.recv(conn);
        if r.is_err() {
            self.st.note_end_read(conn);
        }
        r
    }

    /// Up to `max` received bytes as an io-vector (zero copy).
    pub fn recv_iovec(&mut self, conn: Conn, max: usize) -> Result<IoVec, RecvError> {
        let r = self.st.stack.recv_iovec(conn, max);
        if r.is_err() {
            self.st.note_end_read(conn);
        }
        r
    }

    /// Bytes ready to read.
    pub fn recv_available(&self, conn: Conn) -> usize {
        self.st
            .stack
            .connection(conn)
            .map_or(0, |c| c.recv_available())
    }

    /// Send as much of `data` as the TCP send buffer takes now (zero copy: the stack
    /// keeps a slice of `data`); returns the bytes taken, the rest is the caller's to
    /// offer again after [`InlineApp::on_writable`]. `Err(WouldBlock)` when nothing fits,
    /// which includes the time bytes of an earlier [`Ctx::send_all`] still wait in the
    /// runtime's backlog (they go first, so mixing the two sends never reorders bytes);
    /// other errors mean the connection cannot send any more.
    pub fn send(&mut self, conn: Conn, data: &Zbuf) -> Result<usize, SendError> {
        self.st.send(conn, data)
    }

    /// Send all of `data` or nothing, without copying: what the send buffer cannot take
    /// now waits in the runtime's backlog (at most [`CoreOptions::max_backlog`] bytes per
    /// connection) and goes out as ACKs free space, before anything sent later.
    /// `Err(WouldBlock)` (nothing taken) when even the backlog is full; other errors mean
    /// the connection cannot send any more.
    ///
    /// [`CoreOptions::max_backlog`]: crate::CoreOptions::max_backlog
    pub fn send_all(&mut self, conn: Conn, data: Zbuf) -> Result<(), SendError> {
        self.st.send_all(conn, data)
    }

    /// Free send-buffer space: what [`Ctx::send`] would take now (0 while the runtime's
    /// backlog holds bytes of `conn`).
    pub fn send_capacity(&self, conn: Conn) -> usize {
        self.st.send_capacity(conn)
    }

    /// Bytes of `conn` that [`Ctx::send_all`] handed to the runtime's backlog and the TCP
    /// send buffer has not taken yet (they go out before anything sent later).
    pub fn send_backlog(&self, conn: Conn) -> usize {
        self.st.backlog_len(conn)
    }

    /// Close gracefully (after backlogged data); the handle is released.
    pub fn close(&mut self, conn: Conn) {
        self.st.close(conn)
    }

    /// Reset the connection; the handle is released.
    pub fn abort(&mut self, conn: Conn) {
        self.st.abort(conn)
    }

    /// The connection's addresses (local, remote).
    pub fn addrs(&self, conn: Conn) -> Option<(SocketAddrV4, SocketAddrV4)> {
        self.st
            .stack
            .connection(conn)
            .map(|c| (c.tuple().local, c.tuple().remote))
    }

    /// A writable buffer from this core's zbuf cache (heap without a slab).
    pub fn alloc(&self, len: usize) -> Result<ZbufMut, AllocError> {
        self.st.alloc(len)
    }

    /// Ask every core of the runtime to shut down gracefully.
    pub fn request_stop(&self) {
        self.st.request_stop()
    }

    /// Whether shutdown was requested.
    pub fn stop_requested(&self) -> bool {
        self.st.stop_requested()
    }

    /// A read-only view of the core's stack: counters and per-connection state (what
    /// changes a connection goes through the calls above, so the runtime's backlog and
    /// bookkeeping stay right).
    pub fn stack(&self) -> StackView<'_> {
        StackView::new(&self.st.stack)
    }

    /// Start a new interval of the stack's high-water marks
    /// (`StackCounters::high_water`; a report per phase of a run).
    pub fn reset_high_water(&mut self) {
        self.st.stack.reset_high_water();
    }
}

/// An application run inline. Every method has an empty default.
///
/// Handles are valid until `on_closed` returns or the application calls `close`/`abort`.
pub trait InlineApp {
    /// Once on the core's thread before the first poll (listen or connect here).
    fn on_start(&mut self, _ctx: &mut Ctx<'_>) {}
    /// A connection was accepted from `listener`.
    fn on_accept(&mut self, _ctx: &mut Ctx<'_>, _conn: Conn, _listener: Listener) {}
    /// An active open completed.
    fn on_connected(&mut self, _ctx: &mut Ctx<'_>, _conn: Conn) {}
    /// Data or end of stream is ready: read with `ctx.recv` until it has nothing more.
    /// Called once per connection per received burst, however many segments it
    /// held, and again in that burst while unread data remains; data that arrived
    /// before the accept is announced once.
    fn on_readable(&mut self, _ctx: &mut Ctx<'_>, _conn: Conn) {}
    /// Send-buffer space was freed. At most once per connection per received burst.
    fn on_writable(&mut self, _ctx: &mut Ctx<'_>, _conn: Conn) {}
    /// The connection ended (`reason` from the stack); the handle dies after this returns.
    fn on_closed(&mut self, _ctx: &mut Ctx<'_>, _conn: Conn, _reason: Option<CloseReason>) {}
    /// Once per poll iteration, after the received burst (clients generate load here);
    /// once per half when the burst is answered in halves (`CoreOptions::rx_split`).
    fn on_poll(&mut self, _ctx: &mut Ctx<'_>) {}
    /// Shutdown began; open connections are closed right after this returns.
    fn on_stop(&mut self, _ctx: &mut Ctx<'_>) {}
}

pub(crate) struct InlineMode<A> {
    pub app: A,
    /// The connections given `on_readable` / `on_writable` in the current dispatch pass
    /// (see [`Coalesce`]).
    seen: Coalesce,
}

impl<A> InlineMode<A> {
    /// `burst`: the receive burst's size, the connections a pass remembers.
    pub(crate) fn new(app: A, burst: usize) -> Self {
        Self {
            app,
            seen: Coalesce::new(burst),
        }
    }
}

/// One dispatch pass's record of the connections already told they are readable or
/// writable. No frame is processed during a pass, so a second `Readable` for the same
/// connection says nothing new (the stack queues one per segment) — unless the
/// application left data or the end of the stream unread, when it is delivered again.
/// A second `Writable` never says anything new. The record holds the last `window`
/// connections of the pass (the receive burst's size: a pass after a burst has at most
/// that many), oldest overwritten first, so a pass with events for thousands of
/// connections (accepting a flood, a timer storm) stays linear: a connection that fell
/// out of the window only has a repeat delivered, as before this existed.
pub(crate) struct Coalesce<K = Conn> {
    seen: Vec<(K, u8)>,
    window: usize,
    /// Where the next connection goes once `seen` is full.
    next: usize,
}

const READABLE: u8 = 1;
const WRITABLE: u8 = 2;

impl<K> Coalesce<K> {
    fn new(window: usize) -> Self {
        Self {
            seen: Vec::new(),
            window: window.max(1),
            next: 0,
        }
    }
}

impl<K: Copy + PartialEq> Coalesce<K> {
    fn clear(&mut self) {
        self.seen.clear();
        self.next = 0;
    }

    /// Marks `kind` for `h`; whether it was marked already in this pass.
    #[inline]
    fn repeat(&mut self, h: K, kind: u8) -> bool {
        if let Some((_, k)) = self.seen.iter_mut().find(|(c, _)| *c == h) {
            let was = *k & kind != 0;
            *k |= kind;
            return was;
        }
        if self.seen.len() < self.window {
            self.seen.push((h, kind));
        } else {
            self.seen[self.next] = (h, kind);
            self.next = (self.next + 1) % self.window;
        }
        false
    }
}

/// Whether `recv` on `h` would return something the application has not had in this
/// pass: data, or the end of the stream or an error that no `recv` of this pass returned
/// yet (the end stays readable for good: counting it as unread called an application
/// that had read it once more per segment of the burst). A handle the stack no longer
/// knows is an error too.
fn has_unread(st: &CoreState, h: Conn) -> bool {
    st.stack
        .connection(h)
        .is_none_or(|c| c.recv_available() > 0 || (c.recv_ready() && !st.ends_read.contains(&h)))
}

impl<A: InlineApp> InlineMode<A> {
    fn dispatch(&mut self, st: &mut CoreState) -> bool {
        let mut any = false;
        self.seen.clear();
        st.ends_read.clear();
        while let Some(ev) = st.stack.poll_event() {
            any = true;
            st.stats.events += 1;
            match ev {
                Event::Acceptable(l) => {
                    while let Some(h) = st.accept(l) {
                        if st.stopping {
                            st.close(h);
                            continue;
                        }
                        self.app.on_accept(&mut Ctx { st }, h, l);
                    }
                }
                Event::Connected(h) => {
                    st.stats.connected += 1;
                    if st.open.contains(&h) {
                        self.app.on_connected(&mut Ctx { st }, h);
                    }
                }
                Event::Readable(h) => {
                    if self.seen.repeat(h, READABLE) && !has_unread(st, h) {
                        st.stats.events_coalesced += 1;
                        continue;
                    }
                    if st.open.contains(&h) && !st.is_closing(h) {
                        self.app.on_readable(&mut Ctx { st }, h);
                    }
                }
                Event::Writable(h) => {
                    if self.seen.repeat(h, WRITABLE) {
                        st.stats.events_coalesced += 1;
                        continue;
                    }
                    st.flush_backlogs();
                    if st.open.contains(&h) && !st.is_closing(h) {
                        self.app.on_writable(&mut Ctx { st }, h);
                    }
                }
                Event::Closed(h) => {
                    let held = st.open.contains(&h);
                    let reason = st.on_closed(h);
                    if held {
                        self.app.on_closed(&mut Ctx { st }, h, reason);
                    }
                }
            }
        }
        any
    }
}

impl<A: InlineApp> Mode for InlineMode<A> {
    fn start(&mut self, st: &mut CoreState) {
        self.app.on_start(&mut Ctx { st });
    }

    fn iteration(&mut self, st: &mut CoreState) -> bool {
        // Events from the received burst and timers, then the application's own work and
        // what it caused. The emptiness checks stay inline (idle iterations have no
        // event).
        let timers = st.stack.has_events() && self.dispatch(st);
        self.app.on_poll(&mut Ctx { st });
        let polled = st.stack.has_events() && self.dispatch(st);
        timers || polled
    }

    fn stop(&mut self, st: &mut CoreState) {
        self.app.on_stop(&mut Ctx { st });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connections stand for themselves by number here (the record only compares keys).
    fn h(i: u32) -> u32 {
        i
    }

    /// Per kind, the first event of a connection in a pass is new and the next ones are
    /// repeats; a cleared record (the next pass) forgets.
    #[test]
    fn repeats_are_per_connection_and_kind() {
        let mut c = Coalesce::<u32>::new(32);
        assert!(!c.repeat(h(1), READABLE));
        assert!(!c.repeat(h(2), READABLE));
        assert!(c.repeat(h(1), READABLE));
        assert!(!c.repeat(h(1), WRITABLE));
        assert!(c.repeat(h(1), WRITABLE));
        c.clear();
        assert!(!c.repeat(h(1), READABLE));
    }

    /// Thousands of connections in one pass: the record stays at the window's size, the
    /// connections still in it are recognised, and one that fell out is new again (its
    /// event delivered, never lost).
    #[test]
    fn a_huge_pass_stays_bounded_and_never_hides_an_evicted_connection() {
        let mut c = Coalesce::<u32>::new(32);
        for i in 0..5_000 {
            assert!(!c.repeat(h(i), READABLE));
        }
        assert_eq!(c.seen.len(), 32);
        assert!(c.repeat(h(4_999), READABLE));
        assert!(!c.repeat(h(0), READABLE));
    }
}
