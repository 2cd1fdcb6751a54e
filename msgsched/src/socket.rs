//! Message sockets: the I/O core's side ([`MsgIo`]) and one socket per worker
//! ([`MsgSocket`]). Connections are *attached* to the I/O side with a parser and belong
//! to no worker; workers receive whole messages with their [`Origin`] and send the reply
//! on it. One socket per worker, never workers × connections.
//!
//! Driving contract (sans-IO on the I/O side; the r2c integration or a test is the
//! driver), per poll iteration of the I/O core:
//! 1. for each readable attached connection, while [`MsgIo::wants_input`]: read bytes
//!    from TCP and pass them to [`MsgIo::on_data`] (whole messages are dispatched);
//! 2. [`MsgIo::poll_replies`]: replies staged by workers come back, in request order for
//!    ordered protocols, through the callback that queues them on TCP;
//! 3. [`MsgIo::poll_event`] until `None`: connections to shut down gracefully
//!    ([`IoEvent::Shutdown`]: a reply that closes, or a parse error — the requests before
//!    the bad one are answered first, then the parser's farewell, e.g. memcached's
//!    `CLIENT_ERROR line too long`, then FIN), with the counted reason;
//! 4. a connection that TCP closed: [`MsgIo::detach`] (replies still in flight for it
//!    are counted and dropped when they arrive);
//! 5. a connection the driver stopped reading because `wants_input` said no: tell it
//!    with [`MsgIo::wait_input`], and read it again when [`MsgIo::poll_resumed`] returns
//!    it (no scan of every paused connection).
//!
//! Back pressure is event-driven (`stall.rs`): a connection whose message no worker
//! queue had room for waits in line and is retried only after a worker took a message,
//! head first, until the first refusal; a new message joins the line rather than
//! overtake it.
//!
//! Receive memory: each framer is bounded ([`crate::framer`]), but 5,000 connections
//! each holding a partial 1 MiB message held 5 GB, and 500 each pinning 16 receive
//! buffers emptied a DPDK pool of 8,191, after which no connection received anything.
//! So one budget bounds what all of a `MsgIo`'s connections hold before workers get
//! it ([`FramerConfig::mem_budget`]; measured in the stack's truesize,
//! [`crate::framer::truesize`], so a 1-byte slice of a 2 KiB receive buffer costs the
//! buffer): unframed received and heap buffers, spills, held exclusive messages and
//! messages waiting for the scheduler. Messages at workers are not in it (the
//! scheduler's queues bound them). Counted in [`MsgCounters`]: `mem_held`,
//! `mem_high_water`, `mem_refusals`.
//! 1. Back pressure, never loss: a connection reads only while the total is below the
//!    budget (one read may cross it; the next waits), so at most the budget plus one
//!    read's worth is held (a read adds a buffer, or a spill chunk,
//!    [`crate::framer::SPILL_CHUNK`]). A connection stopped by the budget alone joins a
//!    FIFO line and is reported by [`MsgIo::poll_resumed`] when memory is released (a
//!    message goes to a worker, a connection is detached or shut down), about one per
//!    16 KiB of room, more at each `poll_replies` while room is left. Its bytes wait in
//!    TCP, whose queues luna-stack bounds (`rcv_mem_total`), and its window closes.
//!    Framing does not need input: a connection whose next messages are whole in what
//!    it holds keeps being served as its replies complete.
//! 2. No deadlock: when the budget is spent and nothing can release memory (no message
//!    at a worker or in the scheduler, so every holder is a partial message waiting for
//!    bytes it may not read, or a paused connection whose peer does not read its
//!    replies), `poll_replies` first gives a pass to the waiting connection whose head
//!    message lacks the fewest bytes, at most [`PASS_MAX`] (16 KiB): it may read past
//!    the budget until that message goes to a worker, which ends the deadlock without
//!    a casualty when the rest was already in TCP (small requests stopped halfway when
//!    the budget filled). If the next `poll_replies` finds it still deadlocked (or no
//!    connection qualifies), it shuts down the connection holding the most, as for a
//!    framing error: [`ParseErrorKind::Memory`] (`memory_pressure`), its earlier
//!    replies first, then the parser's farewell (memcached: `SERVER_ERROR out of memory
//!    storing object`), then FIN; the others go on. Linux under `tcp_mem` pressure
//!    collapses its queues and then drops segments before acknowledging them, which
//!    the peer repairs; above TCP every byte held was acknowledged, so dropping any
//!    would corrupt the stream, and a partial message cannot be handed to a worker.
//!    memcached, out of memory for a value, answers `SERVER_ERROR` and swallows the
//!    rest; that keeps a slow-loris peer connected and needs a protocol that can both
//!    answer and skip, which knb's framing cannot. Ending the largest holder frees the
//!    most for one casualty (as the OOM killer picks), and KCM/strparser likewise
//!    abort a stream whose message cannot be buffered (`EMSGSIZE` past `sk_rcvbuf`).
//! 3. The common case pays little: a framer keeps what it holds as a running sum
//!    ([`Framer::mem`]), and after each read the connection's charge is compared with
//!    it, returning at once when nothing changed and the driver does not wait for it
//!    (about 250 instructions per knb 4 KiB request in three reads, 5 %: docs/msgsched.md,
//!    "Bounds and receive memory").
//!
//! A worker: [`MsgSocket::recv_timeout`] → handle → [`MsgSocket::reply`] (or
//! [`MsgSocket::finish`] for a message without a reply). The [`Origin`] is consumed by
//! the reply, so a message is answered at most once; an origin dropped unanswered (a
//! handler that bailed out) completes its message without a reply, counted as
//! `abandoned`, so an ordered connection never waits for it forever.

use crate::doorbell::Doorbell;
use crate::framer::{truesize, Framed, Framer, FramerConfig, FramerConfigError, SPILL_MIN};
use crate::parser::{ParseErrorKind, Parser};
use crate::reply::{SequenceError, Sequencer, StageError, Staged, Staging};
use crate::sched::{
    self, Dispatcher, Placed, RecvError, SchedConfig, SchedConfigError, TryRecvError, Worker,
};
use crate::stall::Stalls;
use crossbeam_queue::SegQueue;
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;
use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;
use zbuf::{IoVec, Zbuf};

/// Most bytes a connection's head message may lack for it to get a pass past the spent
/// budget (`MsgIo::grant_pass`): RPC-sized messages, so that what a pass adds to the
/// budget stays small. A larger partial message that deadlocks the budget is shed.
pub const PASS_MAX: usize = SPILL_MIN;

/// Counters of a message-socket group (shared by the I/O side and the workers).
///
/// Every dispatched message ends in exactly one of `replies`, `finished`, `abandoned`
/// and `closed_in_flight`, counted when the I/O side releases (or drops) it: once all
/// have completed, `messages = replies + finished + abandoned + closed_in_flight`.
#[derive(Debug, Default)]
pub struct MsgCounters {
    /// Connections attached.
    pub attached: AtomicU64,
    /// Connections detached (closed by TCP, by the driver, or for a framing error).
    pub detached: AtomicU64,
    /// Whole messages taken from connections and dispatched.
    pub messages: AtomicU64,
    /// Replies handed to the transmit callback.
    pub replies: AtomicU64,
    /// Messages completed without a reply ([`MsgSocket::finish`]).
    pub finished: AtomicU64,
    /// Origins dropped unanswered (completed without a reply).
    pub abandoned: AtomicU64,
    /// Replies (or completions) that arrived after their connection was detached, or
    /// after a reply that closes it, or waited in its reorder slot when it was (dropped).
    pub closed_in_flight: AtomicU64,
    /// Connections closed for a framing error, by [`ParseErrorKind`] (index = position
    /// in [`ParseErrorKind::ALL`]). [`ParseErrorKind::Memory`] (`memory_pressure`)
    /// counts what the memory budget's deadlock breaker shed: connections shut down, and
    /// HTTP/2 streams refused on connections that go on
    /// ([`crate::proto::io::SessionIo`]).
    pub parse_errors: [AtomicU64; ParseErrorKind::ALL.len()],
    /// Times a message could not be placed when its connection tried: the scheduler
    /// refused it (no room in the queues it may use; the scheduler's `rejected` counts
    /// these alone), or it joined connections already waiting in line for room. The
    /// connection stops taking input until it is placed.
    pub backpressure: AtomicU64,
    /// Completions refused by the sequencer (duplicates; a bug if ever non-zero).
    pub sequence_errors: AtomicU64,
    /// Connections the driver ended for being idle too long (no request in progress).
    pub timeout_idle: AtomicU64,
    /// Connections the driver ended because their output made no progress for too long
    /// (a peer that stopped reading, or an HTTP/2 peer holding its windows at zero).
    pub timeout_send: AtomicU64,
    /// Receive memory the I/O side holds, in truesize, before workers get it
    /// ([`FramerConfig::mem_budget`], module docs "Receive memory"), as of its last
    /// `poll_replies` ([`MsgIo::mem_held`] is exact at any time).
    pub mem_held: AtomicU64,
    /// The most it has held (exact, also between `poll_replies`; published by them).
    pub mem_high_water: AtomicU64,
    /// Times a connection that would have taken input was stopped because the memory
    /// budget was spent (each wait counted once; it resumes when memory is released).
    /// Connections shut down because nothing could release any are counted in
    /// `parse_errors` as [`ParseErrorKind::Memory`] (`memory_pressure`).
    pub mem_refusals: AtomicU64,
    /// Times a session withheld flow-control credit (HTTP/2 WINDOW_UPDATE), or stopped
    /// decoding, because memory was tight ([`crate::proto::Session::mem_waits`]; each
    /// wait counted once; its credit is granted when memory is released). Sessions only.
    pub mem_credit_waits: AtomicU64,
}

impl MsgCounters {
    /// Connections closed for `kind`.
    pub fn parse_errors(&self, kind: ParseErrorKind) -> u64 {
        let i = ParseErrorKind::ALL
            .iter()
            .position(|k| *k == kind)
            .unwrap_or(0);
        self.parse_errors[i].load(AtomicOrdering::Relaxed)
    }

    /// `name=value` pairs of every counter (for reports).
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        let l = |a: &AtomicU64| a.load(AtomicOrdering::Relaxed);
        let mut v = vec![
            ("attached", l(&self.attached)),
            ("detached", l(&self.detached)),
            ("messages", l(&self.messages)),
            ("replies", l(&self.replies)),
            ("finished", l(&self.finished)),
            ("abandoned", l(&self.abandoned)),
            ("closed_in_flight", l(&self.closed_in_flight)),
            ("backpressure", l(&self.backpressure)),
            ("sequence_errors", l(&self.sequence_errors)),
            ("timeout_idle", l(&self.timeout_idle)),
            ("timeout_send", l(&self.timeout_send)),
            ("mem_held", l(&self.mem_held)),
            ("mem_high_water", l(&self.mem_high_water)),
            ("mem_refusals", l(&self.mem_refusals)),
            ("mem_credit_waits", l(&self.mem_credit_waits)),
        ];
        for k in ParseErrorKind::ALL {
            v.push((
                match k {
                    ParseErrorKind::Malformed => "parse_malformed",
                    ParseErrorKind::TooLarge => "parse_too_large",
                    ParseErrorKind::BadField => "parse_bad_field",
                    ParseErrorKind::Memory => "memory_pressure",
                },
                self.parse_errors(k),
            ));
        }
        v
    }
}

/// How a worker completed a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Done {
    /// With a reply ([`MsgSocket::reply`], [`MsgSocket::reply_and_close`]).
    Reply,
    /// Without one ([`MsgSocket::finish`]).
    Finished,
    /// Its origin was dropped unanswered.
    Abandoned,
}

/// A staged completion: the reply's bytes (empty without a reply), whether the
/// connection closes after it, and how it completed. Counted once, by the I/O side,
/// when it is released on a connection that is still there (`replies`, `finished`,
/// `abandoned`), or else as `closed_in_flight` — never both.
pub(crate) struct Out {
    pub(crate) data: IoVec,
    pub(crate) close: bool,
    pub(crate) done: Done,
}

impl Out {
    fn none(done: Done) -> Self {
        Out {
            data: IoVec::new(),
            close: false,
            done,
        }
    }

    /// The reply's bytes, `None` for a completion without a reply.
    pub(crate) fn reply(self) -> Option<IoVec> {
        (self.done == Done::Reply).then_some(self.data)
    }

    /// Counts a completion released on a live connection.
    pub(crate) fn count(&self, c: &MsgCounters) {
        match self.done {
            Done::Reply => &c.replies,
            Done::Finished => &c.finished,
            Done::Abandoned => &c.abandoned,
        }
        .fetch_add(1, AtomicOrdering::Relaxed);
    }
}

/// A reply's way back: the connection's staging queue and the I/O core's notification
/// ring.
type Notice = (u64, Arc<Staging<Out>>);

pub(crate) struct Shared {
    pub(crate) notices: SegQueue<Notice>,
    pub(crate) counters: Arc<MsgCounters>,
    /// Rung after each notice (the I/O core may be asleep: r2c's `Backoff`); `None`
    /// when the I/O core never sleeps, so a reply costs nothing more.
    pub(crate) bell: Option<Bell>,
}

/// The I/O core's doorbell, as [`group_with_doorbell`] takes it.
pub type Bell = crate::sched::sync::Arc<Doorbell>;

impl Shared {
    pub(crate) fn new(bell: Option<Bell>) -> Self {
        Shared {
            notices: SegQueue::new(),
            counters: Arc::new(MsgCounters::default()),
            bell,
        }
    }

    /// Queues a notice for the I/O core and wakes it if it may be asleep.
    fn notify(&self, notice: Notice) {
        self.notices.push(notice);
        if let Some(b) = &self.bell {
            b.ring();
        }
    }
}

/// Where a message came from, and the only way to answer it.
pub struct Origin<C> {
    pub(crate) conn: C,
    pub(crate) key: u64,
    pub(crate) seq: u64,
    pub(crate) stream: Option<u64>,
    /// The I/O side's epoch in which the message became available to the workers.
    pub(crate) epoch: u64,
    pub(crate) staging: Arc<Staging<Out>>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) answered: bool,
}

impl<C: Copy> Origin<C> {
    /// The connection (the I/O core's handle).
    pub fn conn(&self) -> C {
        self.conn
    }

    /// The stream or request id, where the protocol has one.
    pub fn stream(&self) -> Option<u64> {
        self.stream
    }

    /// The message's position in its connection.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The I/O side's epoch ([`MsgIo::end_epoch`]) in which the message became available
    /// to the workers: the one it was framed and placed in, or, for a message held under
    /// CS behind its connection's message in service, the one it was released in. A
    /// driver that reads its clock at each `end_epoch` knows by when the message could
    /// have been taken (virtual workers start their occupation there, `crate::virt`).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether the connection has gone: a reply would be dropped, so a handler may skip
    /// the work (dropping the origin then counts it under `closed_in_flight`).
    pub fn is_closed(&self) -> bool {
        self.staging.is_closed()
    }
}

impl<C> Origin<C> {
    /// Stages the completion; false if the connection is gone (counted).
    fn complete(&mut self, out: Out) -> bool {
        self.answered = true;
        match self.staging.stage(self.seq, Some(out)) {
            Ok(Staged::Notify) => {
                self.shared.notify((self.key, Arc::clone(&self.staging)));
                true
            }
            Ok(Staged::Queued) => true,
            Err(StageError::Closed(_)) => {
                self.shared
                    .counters
                    .closed_in_flight
                    .fetch_add(1, AtomicOrdering::Relaxed);
                false
            }
            // The framer lets at most `max_in_flight` messages out per connection and
            // staging has that room, and an origin completes once: cannot happen.
            Err(StageError::Full(_)) => {
                self.shared
                    .counters
                    .sequence_errors
                    .fetch_add(1, AtomicOrdering::Relaxed);
                false
            }
        }
    }
}

impl<C> Drop for Origin<C> {
    fn drop(&mut self) {
        if !self.answered {
            // Counted as abandoned when the I/O side releases it, or as
            // closed_in_flight if its connection has gone.
            self.complete(Out::none(Done::Abandoned));
        }
    }
}

impl<C: fmt::Debug> fmt::Debug for Origin<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Origin")
            .field("conn", &self.conn)
            .field("seq", &self.seq)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

/// A whole message at a worker.
#[derive(Debug)]
pub struct Message<C> {
    /// Where to reply.
    pub origin: Origin<C>,
    /// The message bytes (zero copy: slices of the received buffers).
    pub body: IoVec,
}

/// A worker's message socket.
pub struct MsgSocket<C> {
    pub(crate) worker: Worker<Message<C>>,
    pub(crate) shared: Arc<Shared>,
}

impl<C: Send> MsgSocket<C> {
    /// This socket's worker index.
    pub fn index(&self) -> usize {
        self.worker.index()
    }

    /// The next message, if one is available now.
    pub fn try_recv(&mut self) -> Option<Message<C>> {
        self.worker.try_recv()
    }

    /// Non-blocking receive that keeps the worker announced idle while it finds nothing
    /// ([`Worker::poll`]): for a driver running many sockets on one thread (virtual
    /// workers, [`crate::virt`]). A socket that is not polled is busy: it is handed and
    /// steals nothing.
    pub fn poll(&mut self) -> Result<Message<C>, TryRecvError> {
        self.worker.poll()
    }

    /// Waits up to `timeout` for a message (parked while idle); `Disconnected` once the
    /// I/O side is gone and nothing is left.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Message<C>, RecvError> {
        self.worker.recv_timeout(timeout)
    }

    /// Sends `reply` on the message's connection (in request order for an ordered
    /// protocol). `false` if the connection has gone (the reply is dropped, counted).
    pub fn reply(&mut self, mut origin: Origin<C>, reply: IoVec) -> bool {
        origin.complete(Out {
            data: reply,
            close: false,
            done: Done::Reply,
        })
    }

    /// Sends `reply` (it may be empty) and then closes the connection gracefully: once
    /// this reply and every one before it (ordered protocols) have been handed to the
    /// driver, the I/O side detaches the connection and emits [`IoEvent::Shutdown`];
    /// replies to later messages are dropped (counted as `closed_in_flight`). For
    /// commands such as memcached's `quit`. `false` if the connection has gone.
    pub fn reply_and_close(&mut self, mut origin: Origin<C>, reply: IoVec) -> bool {
        origin.complete(Out {
            data: reply,
            close: true,
            done: Done::Reply,
        })
    }

    /// Completes a message that has no reply (counted as `finished` once the I/O side
    /// has taken it; `false` and `closed_in_flight` if the connection has gone).
    pub fn finish(&mut self, mut origin: Origin<C>) -> bool {
        origin.complete(Out::none(Done::Finished))
    }

    /// The group's counters.
    pub fn counters(&self) -> &MsgCounters {
        &self.shared.counters
    }

    /// The scheduler's counters (handoffs, steals, per-worker progress).
    pub fn sched_stats(&self) -> sched::Stats {
        self.worker.stats()
    }
}

/// What the I/O side asks its driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoEvent<C> {
    /// Close (reset) this connection at once. [`MsgIo`] no longer emits it (a stream
    /// that cannot be framed ends with [`IoEvent::Shutdown`] after the replies to its
    /// valid requests); kept for drivers and session protocols that need a reset. It
    /// has been detached; the reason was counted.
    Close {
        /// The connection.
        conn: C,
        /// Why.
        reason: ParseErrorKind,
    },
    /// Close this connection gracefully (FIN) after what has already been handed to the
    /// transmit callback: a worker answered with [`MsgSocket::reply_and_close`], a
    /// stream failed to frame (after the replies to the requests before the bad one and
    /// the parser's farewell, [`Parser::farewell`]), or a session protocol's goodbye
    /// ([`crate::proto`], e.g. HTTP/2's GOAWAY) is the last of it. It has been detached.
    /// `reason`: the counted error, `None` for a clean end.
    Shutdown {
        /// The connection.
        conn: C,
        /// Why, if it was an error.
        reason: Option<ParseErrorKind>,
    },
}

/// Why a connection could not be attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachError {
    /// The connection is attached already.
    Attached,
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachError::Attached => f.write_str("connection already attached"),
        }
    }
}

impl std::error::Error for AttachError {}

/// Why a message-socket group could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MsgConfigError {
    /// The scheduler's settings.
    Sched(SchedConfigError),
    /// The per-connection bounds.
    Framer(FramerConfigError),
}

impl fmt::Display for MsgConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MsgConfigError::Sched(e) => write!(f, "scheduler: {e}"),
            MsgConfigError::Framer(e) => write!(f, "framer: {e}"),
        }
    }
}

impl std::error::Error for MsgConfigError {}

struct ConnState<C, P> {
    conn: C,
    framer: Framer<P>,
    sequencer: Sequencer<Out>,
    staging: Arc<Staging<Out>>,
    /// A framed message the scheduler had no room for (sent first next time).
    stalled: Option<(u64, Framed)>,
    /// The stall line it waits in (`None`: not in line; a stalled message then waits
    /// for the connection's own message in service under CS, or for a resume).
    queued: Option<usize>,
    /// The driver waits for [`MsgIo::poll_resumed`] to read it again.
    blocked: bool,
    /// The driver cannot send this connection's replies now: take no more messages.
    paused: bool,
    /// Its stream failed to frame (counted): once every earlier message is answered and
    /// sent, `farewell` goes out and the connection is shut down with this reason.
    failed: Option<ParseErrorKind>,
    /// The parser's last word for `failed` ([`Parser::farewell`]).
    farewell: Option<Zbuf>,
    /// What this connection counts in `MsgIo::held`: its framer's memory and its
    /// stalled message's, as of the last `MsgIo::settle`.
    charged: usize,
    /// Its messages dispatched and not completed.
    at_workers: usize,
    /// In `MsgIo::mem_waiting`: the driver waits for it, and only the budget stops it.
    mem_wait: bool,
}

/// The I/O core's side of a message-socket group.
pub struct MsgIo<C, P> {
    dispatcher: Dispatcher<Message<C>>,
    shared: Arc<Shared>,
    framer_cfg: FramerConfig,
    conns: HashMap<u64, ConnState<C, P>>,
    keys: HashMap<C, u64>,
    next_key: u64,
    /// Connections with a stalled message (back pressure), in line for room.
    stalls: Stalls,
    /// Lines to retry in this `poll_replies` (reused buffer).
    ready: Vec<usize>,
    /// Connections that take input again, for [`MsgIo::poll_resumed`].
    resumed: crate::stall::Resumed,
    /// Connections whose stream failed, waiting for their earlier replies to go out.
    failing: Vec<u64>,
    events: VecDeque<IoEvent<C>>,
    /// Sum of the connections' `charged` (module docs, "Receive memory").
    held: usize,
    /// The most `held` has been.
    high_water: usize,
    /// Messages dispatched and not completed, all connections.
    at_workers: usize,
    /// Connections stopped by the budget alone, in the order they stopped (stale
    /// entries, detached or woken since, are skipped).
    mem_waiting: VecDeque<u64>,
    /// Connections with `mem_wait` set.
    mem_waiting_live: usize,
    /// The connection allowed to read past the spent budget to finish its head message
    /// (`MsgIo::grant_pass`), until it releases memory or the next `poll_replies`.
    pass: Option<u64>,
}

/// Dispatcher hook: a message held under CS becomes available when it is released.
pub(crate) fn stamp_release<C>(m: &mut Message<C>, epoch: u64) {
    m.origin.epoch = m.origin.epoch.max(epoch);
}

/// Builds a message-socket group: the I/O side and one socket per worker.
#[allow(clippy::type_complexity)]
pub fn group<C, P>(
    sched_cfg: &SchedConfig,
    framer_cfg: FramerConfig,
) -> Result<(MsgIo<C, P>, Vec<MsgSocket<C>>), MsgConfigError>
where
    C: Copy + Eq + Hash + Send,
    P: Parser,
{
    group_with_doorbell(sched_cfg, framer_cfg, None)
}

/// [`group`] for an I/O core that may sleep when idle: every reply notice (a reply,
/// a finish, an abandoned origin) rings `bell` ([`crate::doorbell`]), and the driver's
/// re-check before it sleeps is [`MsgIo::replies_pending`].
#[allow(clippy::type_complexity)]
pub fn group_with_doorbell<C, P>(
    sched_cfg: &SchedConfig,
    framer_cfg: FramerConfig,
    bell: Option<Bell>,
) -> Result<(MsgIo<C, P>, Vec<MsgSocket<C>>), MsgConfigError>
where
    C: Copy + Eq + Hash + Send,
    P: Parser,
{
    framer_cfg.validate().map_err(MsgConfigError::Framer)?;
    let (mut dispatcher, workers) = sched::scheduler(sched_cfg).map_err(MsgConfigError::Sched)?;
    dispatcher.stamp_releases(stamp_release::<C>);
    let shared = Arc::new(Shared::new(bell));
    let sockets = workers
        .into_iter()
        .map(|worker| MsgSocket {
            worker,
            shared: Arc::clone(&shared),
        })
        .collect();
    Ok((
        MsgIo {
            stalls: Stalls::new(&dispatcher),
            ready: Vec::new(),
            resumed: crate::stall::Resumed::default(),
            dispatcher,
            shared,
            framer_cfg,
            conns: HashMap::default(),
            keys: HashMap::default(),
            next_key: 0,
            failing: Vec::new(),
            events: VecDeque::new(),
            held: 0,
            high_water: 0,
            at_workers: 0,
            mem_waiting: VecDeque::new(),
            mem_waiting_live: 0,
            pass: None,
        },
        sockets,
    ))
}

impl<C, P> MsgIo<C, P>
where
    C: Copy + Eq + Hash + Send,
    P: Parser,
{
    /// Attaches an accepted connection with its parser.
    pub fn attach(&mut self, conn: C, parser: P) -> Result<(), AttachError> {
        if self.keys.contains_key(&conn) {
            return Err(AttachError::Attached);
        }
        let key = self.next_key;
        self.next_key += 1;
        let ordering = parser.ordering();
        let framer = Framer::new(parser, self.framer_cfg).expect("validated in group()");
        let window = self.framer_cfg.max_in_flight;
        self.conns.insert(
            key,
            ConnState {
                conn,
                framer,
                sequencer: Sequencer::new(ordering, window),
                staging: Arc::new(Staging::new(window)),
                stalled: None,
                queued: None,
                blocked: false,
                paused: false,
                failed: None,
                farewell: None,
                charged: 0,
                at_workers: 0,
                mem_wait: false,
            },
        );
        self.keys.insert(conn, key);
        self.shared
            .counters
            .attached
            .fetch_add(1, AtomicOrdering::Relaxed);
        Ok(())
    }

    /// Whether `conn` should be read now (attached, no framing error, not paused by back
    /// pressure or its in-flight cap with a message's worth buffered, and memory left
    /// in the budget).
    pub fn wants_input(&self, conn: C) -> bool {
        let Some(&key) = self.keys.get(&conn) else {
            return false;
        };
        (self.room() || self.pass == Some(key))
            && self.conns.get(&key).is_some_and(Self::takes_input)
    }

    /// Whether the memory budget has room: a connection may read (what one read adds
    /// may cross it; the next read waits).
    fn room(&self) -> bool {
        self.held < self.framer_cfg.mem_budget
    }

    fn takes_input(c: &ConnState<C, P>) -> bool {
        c.stalled.is_none() && !c.paused && c.framer.wants_input()
    }

    /// The driver stops reading `conn` (its [`MsgIo::wants_input`] said no):
    /// [`MsgIo::poll_resumed`] returns it once it takes input again (at once if it does
    /// already). Ignored for a connection not attached.
    pub fn wait_input(&mut self, conn: C) {
        let Some(&key) = self.keys.get(&conn) else {
            return;
        };
        if let Some(c) = self.conns.get_mut(&key) {
            c.blocked = true;
        }
        self.settle(key);
    }

    /// The next connection given to [`MsgIo::wait_input`] that takes input again
    /// (its stalled message placed, its framer below its caps, or resumed by
    /// [`MsgIo::pause`]): read it. Each wait is reported once.
    pub fn poll_resumed(&mut self) -> Option<C> {
        while let Some(key) = self.resumed.pop() {
            if let Some(c) = self.conns.get(&key) {
                return Some(c.conn);
            }
        }
        None
    }

    /// After anything that may change what `key` holds or whether it takes input (bytes
    /// pushed, messages taken, a stall, a failure, a pause, a wait): brings its share of
    /// `held` up to date, reports it resumed if the driver waits for it and it takes
    /// input, or puts it in the memory line if only the budget stops it; wakes that
    /// line if memory was released. One map lookup, and a few instructions more when
    /// nothing changed: the fast path (whole messages dispatched as they arrive) holds
    /// nothing between reads. Inlined into `frame`, so that its lookup shares the key's
    /// hash with `frame_messages`' (out of line it cost two hashes per read).
    #[inline(always)]
    fn settle(&mut self, key: u64) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        let now = c.framer.mem() + c.stalled.as_ref().map_or(0, |(_, m)| truesize(&m.body));
        let mut released = false;
        if now == c.charged {
            if !c.blocked {
                // Nothing to report and nothing released: the common case.
                return;
            }
        } else {
            released = now < c.charged;
            self.held = self.held - c.charged + now;
            c.charged = now;
            // Published at the end of `poll_replies`.
            self.high_water = self.high_water.max(self.held);
        }
        if released && self.pass == Some(key) {
            // Its message went to a worker: the deadlock is broken.
            self.pass = None;
        }
        let room = self.held < self.framer_cfg.mem_budget || self.pass == Some(key);
        let takes = Self::takes_input(c);
        if room {
            self.resumed.check(key, &mut c.blocked, takes);
        } else if c.blocked && takes && !c.mem_wait {
            c.mem_wait = true;
            self.wait_for_mem(key);
        }
        if released && room && self.mem_waiting_live > 0 {
            self.wake_mem_waiters();
        }
    }

    /// `key` (its `mem_wait` just set) joins the memory line.
    #[cold]
    fn wait_for_mem(&mut self, key: u64) {
        self.mem_waiting.push_back(key);
        self.mem_waiting_live += 1;
        self.shared
            .counters
            .mem_refusals
            .fetch_add(1, AtomicOrdering::Relaxed);
    }

    /// Memory has room again: wakes connections waiting for it, oldest first, about one
    /// per [`SPILL_MIN`] of room (at least one), so that a release does not wake every
    /// waiter only for most to stop again at once; `poll_replies` wakes more while room
    /// is left.
    #[cold]
    #[inline(never)]
    fn wake_mem_waiters(&mut self) {
        let budget = self.framer_cfg.mem_budget;
        let mut n = ((budget.saturating_sub(self.held)) / SPILL_MIN).max(1);
        while n > 0 && self.room() {
            let Some(key) = self.mem_waiting.pop_front() else {
                break;
            };
            let Some(c) = self.conns.get_mut(&key) else {
                continue; // stale: detached
            };
            if !c.mem_wait {
                continue; // stale
            }
            c.mem_wait = false;
            self.mem_waiting_live -= 1;
            self.settle(key);
            n -= 1;
        }
    }

    /// Before shedding: the connection stopped by the budget whose head message lacks
    /// the fewest bytes, at most [`PASS_MAX`], may read past the budget until that
    /// message goes to a worker (Linux's `sk_forced_mem_schedule` lets a socket take
    /// what it must to progress). Small requests whose rest waits in TCP, stopped when
    /// the budget filled with others like them, then end the deadlock without a
    /// casualty: the message goes to a worker, its memory is released and the line
    /// moves. A pass lasts until the next `poll_replies`; a peer that has not sent the
    /// rest gains nothing (the shedding waits one poll). False if no connection
    /// qualifies.
    #[cold]
    fn grant_pass(&mut self) -> bool {
        let best = self
            .mem_waiting
            .iter()
            .filter_map(|&k| {
                let c = self.conns.get(&k)?;
                let missing = c.framer.missing()?;
                (c.mem_wait && missing <= PASS_MAX).then_some((missing, k))
            })
            .min();
        let Some((_, key)) = best else {
            return false;
        };
        let Some(c) = self.conns.get_mut(&key) else {
            return false;
        };
        c.mem_wait = false;
        self.mem_waiting_live -= 1;
        self.pass = Some(key);
        self.settle(key);
        true
    }

    /// The budget is spent and nothing in flight can release memory (no message at a
    /// worker or in the scheduler: every holder is a partial message waiting for bytes
    /// it may not read, or a paused connection whose peer does not read its replies):
    /// the connection holding the most is shut down as for a framing error
    /// ([`ParseErrorKind::Memory`], counted `memory_pressure`; its earlier replies have
    /// gone, the parser's farewell follows, then FIN). Ties: the oldest connection.
    fn shed(&mut self) {
        let victim = self
            .conns
            .iter()
            .filter(|(_, c)| c.failed.is_none() && c.charged > 0)
            .max_by_key(|(&k, c)| (c.charged, std::cmp::Reverse(k)))
            .map(|(&k, _)| k);
        let Some(key) = victim else {
            return;
        };
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        let e = c.framer.fail_memory();
        c.failed = Some(e.kind());
        c.farewell = c.framer.take_farewell();
        self.failing.push(key);
        let i = ParseErrorKind::ALL
            .iter()
            .position(|k| *k == e.kind())
            .unwrap_or(0);
        self.shared.counters.parse_errors[i].fetch_add(1, AtomicOrdering::Relaxed);
        self.settle(key);
    }

    /// Pauses (`true`) or resumes taking messages from `conn`, for a driver whose
    /// transmit path cannot take the connection's replies now (a peer that does not
    /// read): while paused, bytes already received stay buffered unframed, so no more
    /// work is done and no more replies pile up for it (memcached likewise stops
    /// processing a connection's commands while its replies cannot be written).
    /// Resuming frames what is buffered. Ignored for a connection not attached.
    pub fn pause(&mut self, conn: C, paused: bool) {
        let Some(&key) = self.keys.get(&conn) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        let was = std::mem::replace(&mut c.paused, paused);
        if was && !paused {
            self.frame(key, false);
        }
    }

    /// Bytes received on `conn`, in order: whole messages are dispatched to workers.
    /// Bytes for a connection that is not attached are ignored.
    pub fn on_data(&mut self, conn: C, data: Zbuf) {
        let Some(&key) = self.keys.get(&conn) else {
            return;
        };
        if let Some(c) = self.conns.get_mut(&key) {
            c.framer.push(data);
        }
        self.frame(key, false);
    }

    /// Takes and dispatches `key`'s whole messages while the scheduler has room, then
    /// reports it resumed if the driver waits for it. `turn`: it was at the head of its
    /// stall line (its stalled message tries the scheduler even though others wait).
    /// Returns whether the scheduler refused a message of the line's class (the line's
    /// round stops: under CP its worker's FIFO is full, under MS and CS every FIFO).
    fn frame(&mut self, key: u64, turn: bool) -> bool {
        let refused = self.frame_messages(key, turn);
        self.settle(key);
        refused
    }

    fn frame_messages(&mut self, key: u64, mut turn: bool) -> bool {
        loop {
            let Some(c) = self.conns.get_mut(&key) else {
                return false;
            };
            if c.paused || c.failed.is_some() || c.queued.is_some() {
                return false;
            }
            let (seq_key, framed) = match c.stalled.take() {
                Some(s) => s,
                None => match c.framer.next_message() {
                    Ok(Some(m)) => (key, m),
                    Ok(None) => return false,
                    Err(e) => {
                        let i = ParseErrorKind::ALL
                            .iter()
                            .position(|k| *k == e.kind())
                            .unwrap_or(0);
                        self.shared.counters.parse_errors[i].fetch_add(1, AtomicOrdering::Relaxed);
                        // The requests before the bad one were valid: their replies go
                        // out first (in `poll_replies`), then the farewell, then FIN.
                        c.failed = Some(e.kind());
                        c.farewell = c.framer.take_farewell();
                        self.failing.push(key);
                        return false;
                    }
                },
            };
            // CS: a key with a message in service has its next ones held in the
            // dispatcher, competing for no FIFO; a refusal there means its held FIFO is
            // full, and its completion (in `poll_replies`) frames it again.
            let held = self.dispatcher.holds(key);
            let class = self.stalls.class(&self.dispatcher, key);
            if !held && !turn && self.stalls.waiting(class) {
                // Others wait for room of this class: in line behind them (no attempt).
                c.stalled = Some((seq_key, framed));
                c.queued = Some(class);
                self.stalls.push(class, key, false);
                self.shared
                    .counters
                    .backpressure
                    .fetch_add(1, AtomicOrdering::Relaxed);
                return false;
            }
            turn = false;
            let msg = Message {
                origin: Origin {
                    conn: c.conn,
                    key,
                    seq: framed.seq,
                    stream: framed.stream,
                    epoch: self.dispatcher.epoch(),
                    staging: Arc::clone(&c.staging),
                    shared: Arc::clone(&self.shared),
                    answered: false,
                },
                body: framed.body.clone(),
            };
            match self.dispatcher.dispatch(seq_key, msg) {
                Ok(_placed @ (Placed::Handoff(_) | Placed::Queued(_) | Placed::Held)) => {
                    self.shared
                        .counters
                        .messages
                        .fetch_add(1, AtomicOrdering::Relaxed);
                    c.at_workers += 1;
                    self.at_workers += 1;
                }
                Err(rejected) => {
                    // Keep the bytes, not the message: an Origin dropped here would
                    // complete it.
                    let mut m = rejected.into_inner();
                    m.origin.answered = true;
                    drop(m);
                    self.shared
                        .counters
                        .backpressure
                        .fetch_add(1, AtomicOrdering::Relaxed);
                    let Some(c) = self.conns.get_mut(&key) else {
                        return false;
                    };
                    c.stalled = Some((seq_key, framed));
                    if held {
                        return false;
                    }
                    // Refused at its turn (or with nobody waiting): first in line.
                    c.queued = Some(class);
                    self.stalls.push(class, key, true);
                    return true;
                }
            }
        }
    }

    /// Ends the current epoch and returns it: messages placed (or, under CS, released)
    /// until the next call carry the next one ([`Origin::epoch`]; the dispatcher keeps
    /// the count). A driver that reads its clock right after this call has an upper
    /// bound on when every message of the returned epoch became available (r2c does,
    /// for its virtual workers, once per loop turn before they take messages).
    pub fn end_epoch(&mut self) -> u64 {
        self.dispatcher.end_epoch()
    }

    /// Whether a worker's notice waits for [`MsgIo::poll_replies`]: the re-check of an
    /// I/O core about to sleep ([`crate::doorbell::Sleeper::sleep`]).
    pub fn replies_pending(&self) -> bool {
        !self.shared.notices.is_empty()
    }

    /// Replies staged by workers: each connection's, in wire order, through
    /// `send(conn, reply)`; then connections paused by back pressure or by their
    /// in-flight cap are framed again. Returns the replies sent.
    pub fn poll_replies(&mut self, mut send: impl FnMut(C, IoVec)) -> usize {
        let mut sent = 0;
        let mut freed = Vec::new();
        // Which stall lines to retry, read before any placement below can be refused.
        let mut ready = std::mem::take(&mut self.ready);
        self.stalls.ready(&self.dispatcher, &mut ready);
        while let Some((key, staging)) = self.shared.notices.pop() {
            let Some(c) = self.conns.get_mut(&key) else {
                // Detached: the completions are counted and dropped.
                let n = staging.drain(|_| {});
                self.shared
                    .counters
                    .closed_in_flight
                    .fetch_add(n as u64, AtomicOrdering::Relaxed);
                continue;
            };
            let (conn, counters) = (c.conn, &self.shared.counters);
            let mut done = 0;
            let mut close = false;
            let (seqr, framer) = (&mut c.sequencer, &mut c.framer);
            staging.drain(|(seq, reply)| {
                done += 1;
                let r = seqr.complete(seq, reply, |r| {
                    framer.reply_done();
                    let Some(r) = r else { return };
                    if close {
                        // After a reply that closes the connection: dropped.
                        counters
                            .closed_in_flight
                            .fetch_add(1, AtomicOrdering::Relaxed);
                        return;
                    }
                    r.count(counters);
                    close = r.close;
                    if let Some(data) = r.reply() {
                        if !data.is_empty() {
                            send(conn, data);
                        }
                        sent += 1;
                    }
                });
                if let Err(SequenceError::Duplicate(_) | SequenceError::OutOfWindow(_)) = r {
                    counters
                        .sequence_errors
                        .fetch_add(1, AtomicOrdering::Relaxed);
                }
            });
            // Each completion is of a message dispatched on this attachment.
            debug_assert!(c.at_workers >= done);
            c.at_workers = c.at_workers.saturating_sub(done);
            self.at_workers = self.at_workers.saturating_sub(done);
            for _ in 0..done {
                self.dispatcher.complete(key);
            }
            if close {
                self.detach(conn);
                self.events
                    .push_back(IoEvent::Shutdown { conn, reason: None });
                continue;
            }
            freed.push(key);
        }
        self.dispatcher.poll();
        for key in freed {
            self.frame(key, false);
        }
        for &class in &ready {
            while let Some(key) = self.stalls.pop(class) {
                let Some(c) = self.conns.get_mut(&key) else {
                    continue; // stale: detached
                };
                if c.queued != Some(class) {
                    continue; // stale
                }
                c.queued = None;
                self.stalls.left(class);
                if self.frame(key, true) {
                    break;
                }
            }
        }
        self.ready = ready;
        if !self.room() {
            if self.at_workers == 0 {
                // A pass given at the last poll that did not free anything: shed.
                if self.pass.take().is_some() || !self.grant_pass() {
                    self.shed();
                }
            }
        } else {
            self.pass = None;
        }
        if self.room() && self.mem_waiting_live > 0 {
            // Those woken at the last release did not take all the room.
            self.wake_mem_waiters();
        }
        if !self.failing.is_empty() {
            sent += self.finish_failed(&mut send);
        }
        let c = &self.shared.counters;
        c.mem_held.store(self.held as u64, AtomicOrdering::Relaxed);
        c.mem_high_water
            .store(self.high_water as u64, AtomicOrdering::Relaxed);
        sent
    }

    /// Connections whose stream failed and whose earlier replies have all gone out:
    /// their farewell is sent, they are detached and shut down with the error's kind.
    fn finish_failed(&mut self, send: &mut impl FnMut(C, IoVec)) -> usize {
        let mut sent = 0;
        let failing = std::mem::take(&mut self.failing);
        for key in failing {
            let Some(c) = self.conns.get_mut(&key) else {
                // Detached meanwhile (closed by TCP, or a reply that closes).
                continue;
            };
            if c.framer.in_flight() > 0 {
                self.failing.push(key);
                continue;
            }
            let (conn, reason) = (c.conn, c.failed);
            if let Some(z) = c.farewell.take() {
                let mut v = IoVec::new();
                v.push(z);
                send(conn, v);
                sent += 1;
            }
            self.detach(conn);
            self.events.push_back(IoEvent::Shutdown { conn, reason });
        }
        sent
    }

    /// Takes the next event for the driver.
    pub fn poll_event(&mut self) -> Option<IoEvent<C>> {
        self.events.pop_front()
    }

    /// The connection is gone (closed by TCP, or by the driver): replies still in
    /// flight for it are dropped and counted when they arrive. Returns the messages that
    /// were in flight.
    pub fn detach(&mut self, conn: C) -> usize {
        let Some(key) = self.keys.remove(&conn) else {
            return 0;
        };
        let Some(c) = self.conns.remove(&key) else {
            return 0;
        };
        self.shared
            .counters
            .detached
            .fetch_add(1, AtomicOrdering::Relaxed);
        // What its messages at workers hold is theirs now (bounded by the scheduler's
        // queues); what it held here is released.
        self.at_workers = self.at_workers.saturating_sub(c.at_workers);
        self.held -= c.charged;
        if self.pass == Some(key) {
            self.pass = None;
        }
        if c.mem_wait {
            self.mem_waiting_live -= 1;
            // Stale entries are skipped when they come up; compact a line that is
            // mostly stale (connections that waited and closed while nothing was freed).
            if self.mem_waiting.len() > 2 * self.mem_waiting_live + 32 {
                let conns = &self.conns;
                self.mem_waiting
                    .retain(|k| conns.get(k).is_some_and(|c| c.mem_wait));
            }
        }
        if self.room() && self.mem_waiting_live > 0 {
            self.wake_mem_waiters();
        }
        let in_flight = c.framer.in_flight();
        // Completions staged and not drained, and those waiting in the reorder slot for
        // an earlier one: all dropped with the connection, each counted once.
        let n = c.staging.close(|_| {}) + c.sequencer.held();
        self.shared
            .counters
            .closed_in_flight
            .fetch_add(n as u64, AtomicOrdering::Relaxed);
        // CS: its messages held behind the one in service never go to a worker (their
        // origins, dropped on the closed staging, count as closed_in_flight), and the
        // dispatcher waits for no completion of this key.
        drop(self.dispatcher.forget(key));
        if let Some(class) = c.queued {
            if self.stalls.detached(class) {
                let conns = &self.conns;
                self.stalls.compact(class, |k| {
                    conns.get(&k).is_some_and(|c| c.queued == Some(class))
                });
            }
        }
        in_flight
    }

    /// Messages of `conn` out at workers or waiting for their reply's turn, plus one
    /// for a pending farewell after a framing error (`None` if not attached).
    pub fn in_flight(&self, conn: C) -> Option<usize> {
        let c = self.conns.get(self.keys.get(&conn)?)?;
        Some(c.framer.in_flight() + usize::from(c.failed.is_some()))
    }

    /// What `conn` holds in the memory budget, in truesize (`None` if not attached):
    /// its unframed and held bytes and a message waiting for the scheduler.
    pub fn mem(&self, conn: C) -> Option<usize> {
        Some(self.conns.get(self.keys.get(&conn)?)?.charged)
    }

    /// What all connections hold in the memory budget ([`MsgCounters::mem_held`]).
    pub fn mem_held(&self) -> usize {
        self.held
    }

    /// Whether `conn` is attached.
    pub fn is_attached(&self, conn: C) -> bool {
        self.keys.contains_key(&conn)
    }

    /// Attached connections.
    pub fn attached(&self) -> usize {
        self.keys.len()
    }

    /// The group's counters.
    pub fn counters(&self) -> &MsgCounters {
        &self.shared.counters
    }

    /// A handle to the group's counters that outlives this side (for reports).
    pub fn counters_handle(&self) -> Arc<MsgCounters> {
        Arc::clone(&self.shared.counters)
    }

    /// The scheduler's counters.
    pub fn sched_stats(&self) -> sched::Stats {
        self.dispatcher.stats()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::parser::knb::{Header, KnbParser};
    use crate::parser::Ordering;
    use crate::sched::Model;

    fn req(id: u64) -> Zbuf {
        let mut v = Header {
            id,
            len: 4,
            flags: 0,
        }
        .bytes()
        .to_vec();
        v.extend([1, 2, 3, 4]);
        Zbuf::copy_from_slice(&v)
    }

    /// A hostile client opens connections that join a stall line which does not move
    /// (CP, its worker stopped taking) and closes each at once: the line must not keep
    /// an entry per closed connection (memory bounded by the connections waiting).
    #[test]
    fn closed_connections_leave_no_entries_in_a_stall_line_that_does_not_move() {
        let sched = SchedConfig {
            model: Model::Cp,
            workers: 1,
            queue_capacity: 1,
            seed: 1,
        };
        let (mut io, mut sockets) =
            group::<u32, KnbParser>(&sched, FramerConfig::default()).unwrap();
        io.attach(0, KnbParser::new(Ordering::Ordered)).unwrap();
        io.on_data(0, req(0));
        io.on_data(0, req(1));
        assert!(!io.wants_input(0), "its second message waits in line");
        for conn in 1..10_000u32 {
            io.attach(conn, KnbParser::new(Ordering::Ordered)).unwrap();
            io.on_data(conn, req(0));
            assert!(!io.wants_input(conn), "joined the line behind 0");
            io.detach(conn);
        }
        // Bounded by the connections waiting (1), not by those that came and went.
        assert!(
            io.stalls.entries() <= 2 + 32,
            "{} entries for 1 connection waiting",
            io.stalls.entries()
        );
        // The line still works: the worker takes, 0's second message is placed.
        let s = &mut sockets[0];
        let m = s.try_recv().unwrap();
        assert!(s.reply(m.origin, IoVec::new()));
        io.poll_replies(|_, _| {});
        let m = s.try_recv().expect("0's second message placed");
        assert_eq!(m.origin.seq(), 1);
    }
}
