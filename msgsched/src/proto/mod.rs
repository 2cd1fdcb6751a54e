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
//! - Receive memory ([`FramerConfig::mem_budget`](crate::framer::FramerConfig), one
//!   budget per I/O side, shared with nothing else): the session reports what it holds of
//!   its peer's requests before they reach a worker ([`Session::mem`], in truesize, a
//!   running sum), and the driver tells it before each call how much more it may take
//!   and whether it may grant its peer flow-control credit ([`Session::set_mem`]). When
//!   nothing in flight can release memory, the driver asks the session holding the most
//!   to give up its largest part ([`Session::shed`]). Every method has a default that
//!   opts out (a session that holds nothing the budget counts).

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

    /// Memory held of the peer's requests that have not gone to a worker, in truesize
    /// ([`crate::framer::truesize`]: received buffers not processed or held as slices,
    /// heap copies, decoded headers, partial and whole requests not yet taken by
    /// [`Session::poll_request`]). Cheap: called after every call that feeds the
    /// session. Default 0.
    fn mem(&self) -> usize {
        0
    }

    /// Set by the driver before each call that feeds the session: `limit`, the most
    /// [`Session::mem`] may reach (past it the session stops work that grows memory
    /// without more input, e.g. decoding header blocks, until told more; `usize::MAX`:
    /// no limit), and `credit`, whether it may grant its peer flow-control credit for
    /// what it receives (HTTP/2 WINDOW_UPDATE). Credit withheld is owed, and granted once
    /// `credit` is true again. Two stores when nothing changed. Default: ignored.
    fn set_mem(&mut self, _limit: usize, _credit: bool) {}

    /// Whether the session withheld credit or stopped work for lack of room (the driver
    /// calls [`Session::set_mem`] again, and then [`Session::poll_transmit`], once there
    /// is room). Default false.
    fn mem_waits(&self) -> bool {
        false
    }

    /// Whether a whole request waits for [`Session::poll_request`] (exact: the driver
    /// counts it as memory about to be released). Default false.
    fn has_request(&self) -> bool {
        false
    }

    /// For the driver's deadlock pass: the fewest bytes one of its partial requests still
    /// lacks, when known and when the peer may send them without more credit (they may
    /// already wait in TCP). Default `None`.
    fn lacks(&self) -> Option<usize> {
        None
    }

    /// The memory the session would release by [`Session::shed`] (its largest part that
    /// can go alone). Default: all of [`Session::mem`].
    fn shed_size(&self) -> usize {
        self.mem()
    }

    /// Nothing in flight can release memory and this session holds the most: give up its
    /// largest part ([`Session::shed_size`]). Returns true if the session ends for it
    /// (its goodbye queued, [`SessionState::Closing`] with
    /// [`crate::parser::ParseErrorKind::Memory`]); false if only a part went and the
    /// connection goes on (HTTP/2: one stream refused). Default: true without a word
    /// (the driver then shuts the connection down itself).
    fn shed(&mut self) -> bool {
        true
    }
}
