//! Read-only views of a core's stack for applications: counters and per-connection
//! state, without the calls that change the stack behind the runtime's bookkeeping
//! (its send backlog, open and closing sets, listeners). Everything that changes a
//! connection goes through [`crate::Ctx`] (or [`crate::batch::Sockets`]).

use crate::core::Conn;
use crate::rng::CoreRng;
use core::net::SocketAddrV4;
use luna_stack::stack::{Stack, StackCounters};
use luna_stack::tcp::{CloseReason, ConnCounters, Connection, State};

/// What an application may read of its core's stack ([`crate::Ctx::stack`]).
#[derive(Clone, Copy)]
pub struct StackView<'a> {
    stack: &'a Stack<CoreRng>,
}

impl<'a> StackView<'a> {
    pub(crate) fn new(stack: &'a Stack<CoreRng>) -> Self {
        StackView { stack }
    }

    /// The stack's counters (frames dropped by reason, ...).
    pub fn counters(&self) -> &'a StackCounters {
        self.stack.counters()
    }

    /// What the connections hold now (table entries, queue bytes); the peaks are in
    /// `counters().high_water`.
    pub fn held(&self) -> luna_stack::stack::Held {
        self.stack.held()
    }

    /// TCP counters summed over the live connections.
    pub fn tcp_counters(&self) -> ConnCounters {
        self.stack.tcp_counters()
    }

    /// The connection's TCP state, `None` once its handle is gone.
    pub fn state(&self, conn: Conn) -> Option<State> {
        self.stack.state(conn)
    }

    /// One connection's state and counters, `None` once its handle is gone.
    pub fn connection(&self, conn: Conn) -> Option<ConnView<'a>> {
        self.stack.connection(conn).map(|c| ConnView { c })
    }
}

/// A read-only view of one connection ([`StackView::connection`]).
#[derive(Clone, Copy)]
pub struct ConnView<'a> {
    c: &'a Connection,
}

impl<'a> ConnView<'a> {
    /// Our address.
    pub fn local(&self) -> SocketAddrV4 {
        self.c.tuple().local
    }

    /// The peer's address.
    pub fn remote(&self) -> SocketAddrV4 {
        self.c.tuple().remote
    }

    /// The TCP state.
    pub fn state(&self) -> State {
        self.c.state()
    }

    /// Why the connection closed, once it has.
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.c.close_reason()
    }

    /// Congestion window in bytes.
    pub fn cwnd(&self) -> u32 {
        self.c.cwnd()
    }

    /// Slow-start threshold in bytes.
    pub fn ssthresh(&self) -> u32 {
        self.c.ssthresh()
    }

    /// Send MSS negotiated with the peer.
    pub fn mss(&self) -> u32 {
        self.c.mss()
    }

    /// The peer's receive window in bytes (scaled).
    pub fn send_window(&self) -> u32 {
        self.c.send_window()
    }

    /// Bytes sent and not yet acknowledged.
    pub fn bytes_in_flight(&self) -> u32 {
        self.c.bytes_in_flight()
    }

    /// Whether loss recovery is in progress.
    pub fn in_recovery(&self) -> bool {
        self.c.in_recovery()
    }

    /// Free space in the send buffer, in bytes (the stack's own; the runtime's backlog is
    /// not counted here).
    pub fn send_capacity(&self) -> usize {
        self.c.send_capacity()
    }

    /// Received bytes ready to read.
    pub fn recv_available(&self) -> usize {
        self.c.recv_available()
    }

    /// Received bytes held out of order (beyond a gap).
    pub fn ooo_bytes(&self) -> usize {
        self.c.ooo_bytes()
    }

    /// The connection's counters (segments, retransmissions, drops by reason, ...).
    pub fn counters(&self) -> &'a ConnCounters {
        &self.c.counters
    }
}
