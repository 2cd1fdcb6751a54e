//! Protocols beyond knb's own framing.
//!
//! - [`memcached`]: the memcached text and binary protocols on one port, each behind
//!   [`crate::parser::Parser`] (contiguous messages framed by length).
//! - [`h2`] (with [`grpc`] over it): HTTP/2, a *session* protocol.
//!
//! The [`Parser`](crate::parser::Parser) path frames one connection's byte stream into
//! contiguous messages and sends replies back as they are. A multiplexed protocol such
//! as HTTP/2 needs a per-connection *session* on the I/O core instead: it consumes
//! bytes, answers connection-level frames itself (SETTINGS, PING, WINDOW_UPDATE) without
//! waking a worker, assembles each stream's request into one message, and encodes each
//! worker's reply under the protocol's state (HPACK) and flow control in the order the
//! bytes leave. [`Session`] is that contract; [`SessionIo`](io::SessionIo) drives
//! sessions the way [`MsgIo`](crate::socket::MsgIo) drives framers, over the same
//! scheduler, worker sockets and transmit delegation.
//!
//! Contract, all on the I/O core and sans-IO:
//! - [`Session::push`] hands over received bytes in order; the session processes what it
//!   can and may refuse more ([`Session::wants_input`] false: the bytes wait in TCP);
//! - [`Session::poll_request`] yields whole requests, each with a request id unique on
//!   the connection (an HTTP/2 stream id); every request handed out is completed exactly
//!   once by [`Session::complete`] (with the worker's reply, or `None` when the worker
//!   gave none or the connection is closing);
//! - [`Session::poll_transmit`] yields the bytes to write, in wire order (control frames
//!   and encoded replies); the driver writes them before anything later;
//! - [`Session::state`]: `Closing` once the session has decided to end the connection
//!   (its last transmit carries the goodbye, e.g. GOAWAY with the error code): the driver
//!   writes what is pending, then closes; `Done` once a clean end is reached.
//! - Timers belong to the driver (the session stays deterministic): it asks
//!   [`Session::busy`] whether the peer is owed or holding up output (then its send
//!   timeout applies, else its idle timeout) and, when one expires, calls
//!   [`Session::timed_out`]: the session says goodbye (HTTP/2: GOAWAY NO_ERROR) and
//!   ends (`Done`).

pub mod grpc;
pub mod h2;
pub mod io;
pub mod memcached;

use crate::parser::ParseError;
use zbuf::{IoVec, Zbuf};

/// A whole request taken from a session.
#[derive(Debug, Clone)]
pub struct SessionRequest {
    /// The request id (unique among the connection's requests in flight).
    pub id: u64,
    /// The message handed to a worker (its layout is the protocol's).
    pub body: IoVec,
}

/// Where a session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// Serving.
    Open,
    /// Ending for `ParseError` (counted by the driver): write what is pending, then close.
    Closing(ParseError),
    /// Ended cleanly (e.g. the peer's GOAWAY and every stream answered): write what is
    /// pending, then close.
    Done,
}

/// Which of the driver's timers expired for a connection ([`Session::timed_out`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeout {
    /// Nothing in progress and nothing received for the idle timeout (nginx's
    /// `keepalive_timeout` / `http2_idle_timeout`).
    Idle,
    /// Output owed to the peer made no progress for the send timeout (nginx's
    /// `send_timeout`): a peer that stopped reading, or that holds its flow-control
    /// windows at zero and goes quiet.
    Send,
}

impl Timeout {
    /// Short name for counters and GOAWAY debug data.
    pub fn name(self) -> &'static str {
        match self {
            Timeout::Idle => "idle_timeout",
            Timeout::Send => "send_timeout",
        }
    }
}

/// One connection's protocol session on the I/O core (see the module docs).
pub trait Session: Send {
    /// Received bytes, in stream order.
    fn push(&mut self, data: Zbuf);
    /// Whether the session takes more bytes now.
    fn wants_input(&self) -> bool;
    /// The next whole request to dispatch.
    fn poll_request(&mut self) -> Option<SessionRequest>;
    /// The request `id` completed with `reply` (`None`: no reply).
    fn complete(&mut self, id: u64, reply: Option<IoVec>);
    /// Bytes to write now, in order.
    fn poll_transmit(&mut self) -> Option<IoVec>;
    /// Where the session is.
    fn state(&self) -> SessionState;
    /// Whether the peer is owed output the session holds (e.g. HTTP/2 replies waiting
    /// for flow-control window) or has requests open: the driver's send timeout applies
    /// rather than its idle timeout. Default: never.
    fn busy(&self) -> bool {
        false
    }
    /// The driver's `timer` expired: say goodbye (queued for [`Session::poll_transmit`])
    /// and end ([`SessionState::Done`]). Default: nothing (the driver then closes the
    /// connection without a word).
    fn timed_out(&mut self, _timer: Timeout) {}
}
