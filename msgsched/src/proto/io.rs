//! The I/O core's side of a group whose connections run a [`Session`]: the session
//! counterpart of [`MsgIo`](crate::socket::MsgIo), over the same scheduler, worker
//! sockets ([`MsgSocket`]), origins and transmit delegation.
//!
//! Driving contract, per poll iteration of the I/O core (as for `MsgIo`):
//! 1. for each readable attached connection, while [`SessionIo::wants_input`]: read
//!    bytes and pass them to [`SessionIo::on_data`];
//! 2. [`SessionIo::poll_replies`]: workers' completions go to their sessions, and every
//!    session with output hands it to the callback (in wire order per connection:
//!    control frames the session answered itself and encoded replies alike);
//! 3. [`SessionIo::poll_event`] until `None`: [`IoEvent::Shutdown`] — write what the
//!    callback was given, then close (an error's reason is counted in
//!    [`MsgCounters::parse_errors`], the protocol's own reasons in its counters);
//! 4. a connection TCP closed: [`SessionIo::detach`];
//! 5. a connection the driver stopped reading because `wants_input` said no:
//!    [`SessionIo::wait_input`], then read it again when [`SessionIo::poll_resumed`]
//!    returns it.
//!
//! Back pressure as in `MsgIo`: stalled connections wait in line (`stall.rs`).
//!
//! A request's [`Origin`] carries the session's request id as both `seq` and
//! `stream`; at most the framer config's `max_in_flight` requests of one connection are
//! at workers at once (the session holds the rest, within its own bounds).
//!
//! Receive memory: the same budget as `MsgIo`'s ([`FramerConfig::mem_budget`], one per
//! I/O side, in truesize) bounds what all the sessions hold of their peers' requests
//! before workers get them ([`Session::mem`]: unprocessed input, header blocks, headers
//! and bodies until END_STREAM, whole requests not yet dispatched) plus the requests
//! waiting for the scheduler. A session protocol with flow control (HTTP/2) is asked to
//! use it first, so that a peer that honours it is slowed without being stopped
//! (RFC 9113 §5.2.2: the receiver must keep reading TCP, or the frames that would end
//! the wait are never seen):
//! 1. *credit*: from three quarters of the budget ([`SessionIo::credit_mark`]) while a
//!    whole request waits in the budget for a worker (the budget drains as workers take
//!    them), and always past the budget, sessions grant no flow-control credit for what
//!    they receive ([`Session::set_mem`]); what they owe is granted, oldest waiter first,
//!    once credit opens again. With nothing waiting for a worker, withholding credit
//!    could only deadlock (the partial bodies holding the memory need credit to end), so
//!    credit flows until the budget itself is spent;
//! 2. *reads*: as in `MsgIo`, a connection is read only while the total is below the
//!    budget (the read that crosses it is the last), and a connection stopped by the
//!    budget waits in a FIFO line for [`SessionIo::poll_resumed`]; a session also stops
//!    decoding header blocks (which turn a few bytes into a header list) once the room it
//!    was given is spent. So what is held stays within the budget plus one read's growth;
//! 3. *no deadlock*: when the budget is spent and nothing is at a worker, `poll_replies`
//!    first gives a pass to the waiting connection whose nearest request lacks the fewest
//!    bytes ([`Session::lacks`]: known from its content-length, at most [`PASS_MAX`], and
//!    sendable without more credit, so maybe in TCP already): it may read past the budget
//!    by twice what it lacks and a heap chunk (what the rest costs at worst in receive
//!    buffers and copies) until it releases memory. If the next `poll_replies` is still
//!    deadlocked, or nobody qualifies, the session holding the largest part
//!    ([`Session::shed_size`]; ties: the oldest) gives it up ([`Session::shed`]: HTTP/2
//!    refuses that stream, RST_STREAM REFUSED_STREAM, and the connection goes on; a
//!    session whose memory is no stream's ends with GOAWAY), counted `memory_pressure`.
//!    At most one per poll.

use crate::framer::{truesize, FramerConfig, SPILL_CHUNK, SPILL_MIN};
use crate::parser::ParseErrorKind;
use crate::proto::{Session, SessionRequest, SessionState, Timeout};
use crate::reply::Staging;
use crate::sched::{self, Dispatcher, SchedConfig};
use crate::socket::Out;
use crate::socket::{
    Bell, IoEvent, Message, MsgConfigError, MsgCounters, MsgSocket, Origin, Shared,
};

/// Most bytes a session's partial request may lack for its connection to get a pass past
/// the spent budget (`SessionIo::grant_pass`): HTTP/2's default stream window (65,535),
/// what a peer that honours flow control may have sent beyond what was processed without
/// more credit ([`Session::lacks`] says whether it may). Four times the framers'
/// (`socket::PASS_MAX`): a framer cannot tell whether the rest is on its way, a session
/// can. A larger partial request that deadlocks the budget is refused.
pub const PASS_MAX: usize = 65_535;
use crate::stall::Stalls;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::collections::VecDeque;
use std::hash::Hash;
use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::Arc;
use zbuf::{IoVec, Zbuf};

struct SConn<C> {
    conn: C,
    session: Box<dyn Session>,
    staging: Arc<Staging<Out>>,
    in_flight: usize,
    /// A worker answered with [`MsgSocket::reply_and_close`](crate::socket::MsgSocket::reply_and_close):
    /// end the connection once that reply has been written, as a clean end.
    close_after: bool,
    /// A request the scheduler had no room for (sent first next time).
    stalled: Option<SessionRequest>,
    /// The stall line it waits in (see `MsgIo`).
    queued: Option<usize>,
    /// The driver waits for [`SessionIo::poll_resumed`] to read it again.
    blocked: bool,
    /// What it counts in `SessionIo::held`: its session's [`Session::mem`] and its
    /// stalled request, as of the last `SessionIo::settle`.
    charged: usize,
    /// Its session's [`Session::mem`] as of the last `SessionIo::settle` (unchanged
    /// until the next call into the session): the base of the limit it is told.
    smem: usize,
    /// Counted in `SessionIo::pending`: a whole request of it waits in the budget (for
    /// the scheduler, or behind its in-flight cap).
    pending: bool,
    /// In `SessionIo::mem_waiting`: the driver waits for it, and only the budget stops it.
    mem_wait: bool,
    /// In `SessionIo::credit_waiting`: its session withheld credit, or stopped work, for
    /// lack of memory ([`Session::mem_waits`]).
    credit_wait: bool,
}

/// The I/O core's side of a session group.
pub struct SessionIo<C> {
    dispatcher: Dispatcher<Message<C>>,
    shared: Arc<Shared>,
    cap: usize,
    conns: HashMap<u64, SConn<C>>,
    keys: HashMap<C, u64>,
    next_key: u64,
    /// Connections with a stalled request, in line for room.
    stalls: Stalls,
    /// Lines to retry in this `poll_replies` (reused buffer).
    ready: Vec<usize>,
    /// Connections that take input again, for [`SessionIo::poll_resumed`].
    resumed: crate::stall::Resumed,
    /// Connections whose session may have output.
    dirty: HashSet<u64>,
    events: VecDeque<IoEvent<C>>,
    /// [`FramerConfig::mem_budget`].
    budget: usize,
    /// Sum of the connections' `charged` (module docs, "Receive memory").
    held: usize,
    /// The most `held` has been.
    high_water: usize,
    /// Requests dispatched and not completed, all connections.
    at_workers: usize,
    /// Connections with `pending` set.
    pending: usize,
    /// Connections stopped by the budget alone, in the order they stopped (stale entries
    /// skipped).
    mem_waiting: VecDeque<u64>,
    /// Connections with `mem_wait` set.
    mem_waiting_live: usize,
    /// Sessions waiting for credit or room, in the order they started (stale entries
    /// skipped).
    credit_waiting: VecDeque<u64>,
    /// Connections with `credit_wait` set.
    credit_waiting_live: usize,
    /// The connection allowed to read past the spent budget to finish a request
    /// (`SessionIo::grant_pass`), and up to what total held, until it releases memory or
    /// the next `poll_replies`.
    pass: Option<(u64, usize)>,
}

/// Builds a session group: the I/O side and one socket per worker. Of `framer_cfg`,
/// `max_in_flight` and `mem_budget` apply (a session has its own per-connection bounds).
#[allow(clippy::type_complexity)]
pub fn session_group<C>(
    sched_cfg: &SchedConfig,
    framer_cfg: FramerConfig,
) -> Result<(SessionIo<C>, Vec<MsgSocket<C>>), MsgConfigError>
where
    C: Copy + Eq + Hash + Send,
{
    session_group_with_doorbell(sched_cfg, framer_cfg, None)
}

/// [`session_group`] for an I/O core that may sleep when idle: every completion notice
/// rings `bell` ([`crate::doorbell`]); the driver's re-check before it sleeps is
/// [`SessionIo::replies_pending`].
#[allow(clippy::type_complexity)]
pub fn session_group_with_doorbell<C>(
    sched_cfg: &SchedConfig,
    framer_cfg: FramerConfig,
    bell: Option<Bell>,
) -> Result<(SessionIo<C>, Vec<MsgSocket<C>>), MsgConfigError>
where
    C: Copy + Eq + Hash + Send,
{
    framer_cfg.validate().map_err(MsgConfigError::Framer)?;
    let (mut dispatcher, workers) = sched::scheduler(sched_cfg).map_err(MsgConfigError::Sched)?;
    dispatcher.stamp_releases(crate::socket::stamp_release::<C>);
    let shared = Arc::new(Shared::new(bell));
    let sockets = workers
        .into_iter()
        .map(|worker| MsgSocket {
            worker,
            shared: Arc::clone(&shared),
        })
        .collect();
    Ok((
        SessionIo {
            stalls: Stalls::new(&dispatcher),
            ready: Vec::new(),
            resumed: crate::stall::Resumed::default(),
            dispatcher,
            shared,
            cap: framer_cfg.max_in_flight,
            conns: HashMap::default(),
            keys: HashMap::default(),
            next_key: 0,
            dirty: HashSet::default(),
            events: VecDeque::new(),
            budget: framer_cfg.mem_budget,
            held: 0,
            high_water: 0,
            at_workers: 0,
            pending: 0,
            mem_waiting: VecDeque::new(),
            mem_waiting_live: 0,
            credit_waiting: VecDeque::new(),
            credit_waiting_live: 0,
            pass: None,
        },
        sockets,
    ))
}

impl<C> SessionIo<C>
where
    C: Copy + Eq + Hash + Send,
{
    /// Attaches an accepted connection with its session; false if it is attached already.
    pub fn attach(&mut self, conn: C, session: Box<dyn Session>) -> bool {
        if self.keys.contains_key(&conn) {
            return false;
        }
        let key = self.next_key;
        self.next_key += 1;
        self.conns.insert(
            key,
            SConn {
                conn,
                session,
                staging: Arc::new(Staging::new(self.cap)),
                in_flight: 0,
                close_after: false,
                stalled: None,
                queued: None,
                blocked: false,
                charged: 0,
                smem: 0,
                pending: false,
                mem_wait: false,
                credit_wait: false,
            },
        );
        self.keys.insert(conn, key);
        // The session's own first frames (e.g. HTTP/2 SETTINGS).
        self.dirty.insert(key);
        self.shared
            .counters
            .attached
            .fetch_add(1, AtomicOrdering::Relaxed);
        true
    }

    /// Whether `conn` should be read now (its session takes input, no request of it
    /// waits for the scheduler, and memory is left in the budget).
    pub fn wants_input(&self, conn: C) -> bool {
        let Some(&key) = self.keys.get(&conn) else {
            return false;
        };
        self.may_read(key) && self.conns.get(&key).is_some_and(Self::takes_input)
    }

    fn takes_input(c: &SConn<C>) -> bool {
        c.stalled.is_none() && c.session.wants_input()
    }

    /// Whether the budget lets `key` read: below it, or below the pass's limit.
    fn may_read(&self, key: u64) -> bool {
        self.held < self.cap_for(key)
    }

    /// What `key` may make held reach: the budget, or the pass's limit.
    #[inline]
    fn cap_for(&self, key: u64) -> usize {
        match self.pass {
            Some((k, limit)) if k == key => limit.max(self.budget),
            _ => self.budget,
        }
    }

    fn has_pass(&self, key: u64) -> bool {
        self.pass.is_some_and(|(k, _)| k == key)
    }

    /// Whether the budget has room.
    fn room(&self) -> bool {
        self.held < self.budget
    }

    /// Where credit stops while whole requests wait for workers: three quarters of the
    /// budget (module docs). The quarter above it takes what peers were allowed to send
    /// before it, so that a peer that honours flow control meets the credit mark rather
    /// than the read stop.
    pub fn credit_mark(&self) -> usize {
        self.budget - self.budget / 4
    }

    /// Whether sessions may grant flow-control credit now (module docs).
    fn credit_open(&self) -> bool {
        self.held < self.credit_mark() || (self.held < self.budget && self.pending == 0)
    }

    /// The room left to `key` in the budget (more with the pass).
    #[inline]
    fn room_for(&self, key: u64) -> usize {
        self.cap_for(key).saturating_sub(self.held)
    }

    /// Tells `key`'s session its limits before a call ([`Session::set_mem`]): what it
    /// holds plus the room left, and whether it may grant credit.
    #[inline]
    fn tell(&mut self, key: u64) {
        let (room, credit) = (self.room_for(key), self.credit_open());
        if let Some(c) = self.conns.get_mut(&key) {
            c.session.set_mem(c.smem.saturating_add(room), credit);
        }
    }

    /// The driver stops reading `conn` (its [`SessionIo::wants_input`] said no):
    /// [`SessionIo::poll_resumed`] returns it once it takes input again (at once if it
    /// does already). Ignored for a connection not attached.
    pub fn wait_input(&mut self, conn: C) {
        let Some(&key) = self.keys.get(&conn) else {
            return;
        };
        if let Some(c) = self.conns.get_mut(&key) {
            c.blocked = true;
        }
        self.settle(key);
    }

    /// The next connection given to [`SessionIo::wait_input`] that takes input again:
    /// read it. Each wait is reported once.
    pub fn poll_resumed(&mut self) -> Option<C> {
        while let Some(key) = self.resumed.pop() {
            if let Some(c) = self.conns.get(&key) {
                return Some(c.conn);
            }
        }
        None
    }

    /// After anything that may change what `key` holds or whether it takes input (bytes
    /// pushed, requests taken or stalled, replies, a wait): brings its share of `held` and
    /// of `pending` up to date, reports it resumed if the driver waits for it and it takes
    /// input, or puts it in the memory line if only the budget stops it, or in the credit
    /// line if its session waits for memory; wakes those lines if memory was released.
    /// A few virtual calls and compares when nothing changed (the fast path: a request
    /// read whole and dispatched leaves nothing held).
    #[inline(always)]
    fn settle(&mut self, key: u64) {
        let cap = self.cap;
        let passed = self.pass.is_some_and(|(k, _)| k == key);
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        c.smem = c.session.mem();
        let now = c.smem + c.stalled.as_ref().map_or(0, |r| truesize(&r.body));
        let released = now < c.charged;
        if now != c.charged {
            self.held = self.held - c.charged + now;
            c.charged = now;
            // Published at the end of `poll_replies`.
            self.high_water = self.high_water.max(self.held);
        }
        let pending = c.stalled.is_some() || (c.in_flight >= cap && c.session.has_request());
        let waiters = self.mem_waiting_live + self.credit_waiting_live > 0;
        if pending == c.pending
            && !c.blocked
            && !(released && (waiters || passed))
            && !c.session.mem_waits()
        {
            // Nothing to report, nobody to wake: the common case.
            return;
        }
        self.settle_slow(key, released, pending);
    }

    #[cold]
    #[inline(never)]
    fn settle_slow(&mut self, key: u64, released: bool, pending: bool) {
        if released && self.has_pass(key) {
            // It finished (or moved) what the pass was for.
            self.pass = None;
        }
        let may_read = self.held < self.cap_for(key);
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        if pending != c.pending {
            c.pending = pending;
            if pending {
                self.pending += 1;
            } else {
                self.pending -= 1;
            }
        }
        let takes = Self::takes_input(c);
        if may_read {
            self.resumed.check(key, &mut c.blocked, takes);
        } else if c.blocked && takes && !c.mem_wait {
            c.mem_wait = true;
            self.mem_waiting.push_back(key);
            self.mem_waiting_live += 1;
            self.shared
                .counters
                .mem_refusals
                .fetch_add(1, AtomicOrdering::Relaxed);
        }
        if !c.credit_wait && c.session.mem_waits() {
            c.credit_wait = true;
            self.credit_waiting.push_back(key);
            self.credit_waiting_live += 1;
            self.shared
                .counters
                .mem_credit_waits
                .fetch_add(1, AtomicOrdering::Relaxed);
        }
        if released && self.room() && self.mem_waiting_live > 0 {
            self.wake_mem_waiters();
        }
        if self.credit_waiting_live > 0 && self.credit_open() {
            self.wake_credit_waiters();
        }
    }

    /// Memory has room again: wakes connections waiting to read, oldest first, about one
    /// per [`SPILL_MIN`] of room (at least one), so that a release does not wake every
    /// waiter only for most to stop again; `poll_replies` wakes more while room is left.
    #[cold]
    #[inline(never)]
    fn wake_mem_waiters(&mut self) {
        let mut n = (self.budget.saturating_sub(self.held) / SPILL_MIN).max(1);
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

    /// Credit is open again: sessions that withheld it (or stopped for room) are told so,
    /// oldest first, about one per [`SPILL_MIN`] of room, and serviced at the next
    /// `poll_replies` (their WINDOW_UPDATEs go out; work that waited for room resumes).
    #[cold]
    #[inline(never)]
    fn wake_credit_waiters(&mut self) {
        let mut n = (self.budget.saturating_sub(self.held) / SPILL_MIN).max(1);
        while n > 0 && self.credit_open() {
            let Some(key) = self.credit_waiting.pop_front() else {
                break;
            };
            let Some(c) = self.conns.get_mut(&key) else {
                continue; // stale: detached
            };
            if !c.credit_wait {
                continue; // stale
            }
            c.credit_wait = false;
            self.credit_waiting_live -= 1;
            self.tell(key);
            self.dirty.insert(key);
            n -= 1;
        }
    }

    /// Before shedding: the connection stopped by the budget whose session's nearest
    /// request lacks the fewest bytes, at most [`PASS_MAX`], and may be sent without more
    /// credit ([`Session::lacks`]), may read past the budget until it releases memory, by
    /// up to twice what it lacks and a heap chunk (the rest in receive buffers of 1,448
    /// bytes each counted at 2,176, and the spill chunk it may start). When the rest is
    /// already in TCP (uploads stopped near their end when the budget filled) that ends
    /// the deadlock without a casualty. Lasts until the next `poll_replies`; false if no
    /// connection qualifies.
    #[cold]
    fn grant_pass(&mut self) -> bool {
        let best = self
            .mem_waiting
            .iter()
            .filter_map(|&k| {
                let c = self.conns.get(&k)?;
                let lack = c.session.lacks()?;
                (c.mem_wait && lack <= PASS_MAX).then_some((lack, k))
            })
            .min();
        let Some((lack, key)) = best else {
            return false;
        };
        let Some(c) = self.conns.get_mut(&key) else {
            return false;
        };
        c.mem_wait = false;
        self.mem_waiting_live -= 1;
        self.pass = Some((key, self.held + 2 * lack + SPILL_CHUNK));
        self.settle(key);
        true
    }

    /// The budget is spent and nothing at a worker can release memory: the session
    /// holding the largest part ([`Session::shed_size`]; ties: the oldest connection)
    /// gives it up ([`Session::shed`]), counted as [`ParseErrorKind::Memory`]
    /// (`memory_pressure`). A session that ends for it is shut down by `service` (its
    /// goodbye written first), one without a goodbye here.
    #[cold]
    fn shed(&mut self) {
        let victim = self
            .conns
            .iter()
            .filter(|(_, c)| c.charged > 0)
            .map(|(&k, c)| (c.session.shed_size(), std::cmp::Reverse(k)))
            .filter(|&(size, _)| size > 0)
            .max();
        let Some((_, std::cmp::Reverse(key))) = victim else {
            return;
        };
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        let conn = c.conn;
        let ends = c.session.shed();
        if !ends || c.session.state() == SessionState::Open {
            // A stream refused (the connection goes on), or a session that ends without
            // a word: counted here. A goodbye (`Closing(Memory)`) is counted by `service`.
            let i = ParseErrorKind::ALL
                .iter()
                .position(|k| *k == ParseErrorKind::Memory)
                .unwrap_or(0);
            self.shared.counters.parse_errors[i].fetch_add(1, AtomicOrdering::Relaxed);
        }
        if ends && c.session.state() == SessionState::Open {
            self.detach(conn);
            self.events.push_back(IoEvent::Shutdown {
                conn,
                reason: Some(ParseErrorKind::Memory),
            });
            return;
        }
        self.dirty.insert(key);
        self.settle(key);
    }

    /// Bytes received on `conn`, in order (ignored if it is not attached).
    pub fn on_data(&mut self, conn: C, data: Zbuf) {
        let Some(&key) = self.keys.get(&conn) else {
            return;
        };
        let (room, credit) = (self.room_for(key), self.credit_open());
        if let Some(c) = self.conns.get_mut(&key) {
            c.session.set_mem(c.smem.saturating_add(room), credit);
            c.session.push(data);
        }
        self.dirty.insert(key);
        self.dispatch(key, false);
        self.settle(key);
    }

    /// Hands `key`'s whole requests to the scheduler while it and the in-flight cap
    /// have room. `turn` and the result: as `MsgIo::frame` (head of its stall line;
    /// whether the scheduler refused a request of the line's class).
    fn dispatch(&mut self, key: u64, mut turn: bool) -> bool {
        loop {
            let Some(c) = self.conns.get_mut(&key) else {
                return false;
            };
            if c.in_flight >= self.cap || c.queued.is_some() {
                return false;
            }
            let Some(req) = c.stalled.take().or_else(|| c.session.poll_request()) else {
                return false;
            };
            let held = self.dispatcher.holds(key);
            let class = self.stalls.class(&self.dispatcher, key);
            if !held && !turn && self.stalls.waiting(class) {
                // Others wait for room of this class: in line behind them.
                c.stalled = Some(req);
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
                    seq: req.id,
                    stream: Some(req.id),
                    epoch: self.dispatcher.epoch(),
                    staging: Arc::clone(&c.staging),
                    shared: Arc::clone(&self.shared),
                    answered: false,
                },
                body: req.body.clone(),
            };
            match self.dispatcher.dispatch(key, msg) {
                Ok(_) => {
                    c.in_flight += 1;
                    self.at_workers += 1;
                    self.shared
                        .counters
                        .messages
                        .fetch_add(1, AtomicOrdering::Relaxed);
                }
                Err(rejected) => {
                    let mut m = rejected.into_inner();
                    m.origin.answered = true;
                    drop(m);
                    c.stalled = Some(req);
                    self.shared
                        .counters
                        .backpressure
                        .fetch_add(1, AtomicOrdering::Relaxed);
                    if held {
                        // CS: its held FIFO is full; its completion dispatches again.
                        return false;
                    }
                    c.queued = Some(class);
                    self.stalls.push(class, key, true);
                    return true;
                }
            }
        }
    }

    /// Ends the current epoch and returns it, as [`crate::socket::MsgIo::end_epoch`].
    pub fn end_epoch(&mut self) -> u64 {
        self.dispatcher.end_epoch()
    }

    /// Whether a worker's notice waits for [`SessionIo::poll_replies`]: the re-check
    /// of an I/O core about to sleep ([`crate::doorbell::Sleeper::sleep`]).
    pub fn replies_pending(&self) -> bool {
        !self.shared.notices.is_empty()
    }

    /// Workers' completions go to their sessions; every session's output goes to
    /// `send(conn, bytes)` in wire order. Returns the replies completed.
    pub fn poll_replies(&mut self, mut send: impl FnMut(C, IoVec)) -> usize {
        let mut replies = 0;
        // Which stall lines to retry, read before any dispatch below can be refused.
        let mut ready = std::mem::take(&mut self.ready);
        self.stalls.ready(&self.dispatcher, &mut ready);
        while let Some((key, staging)) = self.shared.notices.pop() {
            let Some(c) = self.conns.get_mut(&key) else {
                let n = staging.drain(|_| {});
                self.shared
                    .counters
                    .closed_in_flight
                    .fetch_add(n as u64, AtomicOrdering::Relaxed);
                continue;
            };
            let counters = &self.shared.counters;
            let mut done = 0;
            let mut close_after = false;
            staging.drain(|(id, out)| {
                done += 1;
                let reply = out.and_then(|o| {
                    o.count(counters);
                    close_after |= o.close;
                    o.reply()
                });
                if reply.is_some() {
                    replies += 1;
                }
                c.session.complete(id, reply);
            });
            c.close_after |= close_after;
            c.in_flight = c.in_flight.saturating_sub(done);
            self.at_workers = self.at_workers.saturating_sub(done);
            for _ in 0..done {
                self.dispatcher.complete(key);
            }
            self.dirty.insert(key);
        }
        self.dispatcher.poll();
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
                self.dirty.insert(key);
                if self.dispatch(key, true) {
                    break;
                }
            }
        }
        self.ready = ready;
        self.service_dirty(&mut send);
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
        if self.credit_waiting_live > 0 && self.credit_open() {
            self.wake_credit_waiters();
        }
        // What was shed or woken: its RST_STREAM, GOAWAY or WINDOW_UPDATEs go out now.
        self.service_dirty(&mut send);
        let c = &self.shared.counters;
        c.mem_held.store(self.held as u64, AtomicOrdering::Relaxed);
        c.mem_high_water
            .store(self.high_water as u64, AtomicOrdering::Relaxed);
        replies
    }

    fn service_dirty(&mut self, send: &mut impl FnMut(C, IoVec)) {
        if self.dirty.is_empty() {
            return;
        }
        let mut dirty: Vec<u64> = self.dirty.drain().collect();
        dirty.sort_unstable();
        for key in dirty {
            self.service(key, send);
        }
    }

    /// Dispatches `key`'s requests and writes its output; ends it if its session did.
    fn service(&mut self, key: u64, send: &mut impl FnMut(C, IoVec)) {
        self.tell(key);
        self.dispatch(key, false);
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        let conn = c.conn;
        while let Some(tx) = c.session.poll_transmit() {
            send(conn, tx);
        }
        let state = match c.session.state() {
            SessionState::Open if c.close_after => SessionState::Done,
            state => state,
        };
        self.dispatch(key, false);
        self.settle(key);
        match state {
            SessionState::Open => {}
            SessionState::Closing(e) => {
                let i = ParseErrorKind::ALL
                    .iter()
                    .position(|k| *k == e.kind())
                    .unwrap_or(0);
                self.shared.counters.parse_errors[i].fetch_add(1, AtomicOrdering::Relaxed);
                self.detach(conn);
                self.events.push_back(IoEvent::Shutdown {
                    conn,
                    reason: Some(e.kind()),
                });
            }
            SessionState::Done => {
                self.detach(conn);
                self.events
                    .push_back(IoEvent::Shutdown { conn, reason: None });
            }
        }
    }

    /// Takes the next event for the driver.
    pub fn poll_event(&mut self) -> Option<IoEvent<C>> {
        self.events.pop_front()
    }

    /// The connection is gone: completions still in flight are counted and dropped.
    /// Returns the requests that were at workers.
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
        let n = c.staging.close(|_| {});
        self.shared
            .counters
            .closed_in_flight
            .fetch_add(n as u64, AtomicOrdering::Relaxed);
        // CS: held requests never go to a worker, and no completion is waited for.
        drop(self.dispatcher.forget(key));
        if let Some(class) = c.queued {
            if self.stalls.detached(class) {
                let conns = &self.conns;
                self.stalls.compact(class, |k| {
                    conns.get(&k).is_some_and(|c| c.queued == Some(class))
                });
            }
        }
        self.dirty.remove(&key);
        // What its requests at workers hold is theirs now; what it held here is released.
        self.at_workers = self.at_workers.saturating_sub(c.in_flight);
        self.held -= c.charged;
        if c.pending {
            self.pending -= 1;
        }
        if self.has_pass(key) {
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
        if c.credit_wait {
            self.credit_waiting_live -= 1;
            if self.credit_waiting.len() > 2 * self.credit_waiting_live + 32 {
                let conns = &self.conns;
                self.credit_waiting
                    .retain(|k| conns.get(k).is_some_and(|c| c.credit_wait));
            }
        }
        if self.room() && self.mem_waiting_live > 0 {
            self.wake_mem_waiters();
        }
        if self.credit_waiting_live > 0 && self.credit_open() {
            self.wake_credit_waiters();
        }
        c.in_flight
    }

    /// Whether `conn`'s session holds output owed to its peer or open requests
    /// ([`Session::busy`]), or a request waits for the scheduler: the driver's send
    /// timeout applies to it rather than its idle timeout. False if not attached.
    pub fn busy(&self, conn: C) -> bool {
        self.keys
            .get(&conn)
            .and_then(|k| self.conns.get(k))
            .is_some_and(|c| c.stalled.is_some() || c.session.busy())
    }

    /// The driver's `timer` expired for `conn`: its session says goodbye
    /// ([`Session::timed_out`]; the bytes go out at the next [`SessionIo::poll_replies`],
    /// followed by [`IoEvent::Shutdown`] with no error) — or, for a session with no
    /// goodbye, `conn` is detached and shut down at once. Counted as `timeout_idle` /
    /// `timeout_send`. Ignored if `conn` is not attached.
    pub fn time_out(&mut self, conn: C, timer: Timeout) {
        let Some(&key) = self.keys.get(&conn) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        let counter = match timer {
            Timeout::Idle => &self.shared.counters.timeout_idle,
            Timeout::Send => &self.shared.counters.timeout_send,
        };
        counter.fetch_add(1, AtomicOrdering::Relaxed);
        c.session.timed_out(timer);
        if c.session.state() == SessionState::Open {
            self.detach(conn);
            self.events
                .push_back(IoEvent::Shutdown { conn, reason: None });
        } else {
            self.dirty.insert(key);
        }
    }

    /// Requests of `conn` at workers, plus one waiting for room in the scheduler (as
    /// `MsgIo::in_flight` counts a stalled message): work of ours, not the peer's
    /// (`None` if not attached).
    pub fn in_flight(&self, conn: C) -> Option<usize> {
        let c = self.conns.get(self.keys.get(&conn)?)?;
        Some(c.in_flight + usize::from(c.stalled.is_some()))
    }

    /// What `conn` holds in the memory budget, in truesize (`None` if not attached): its
    /// session's [`Session::mem`] and a request waiting for the scheduler.
    pub fn mem(&self, conn: C) -> Option<usize> {
        Some(self.conns.get(self.keys.get(&conn)?)?.charged)
    }

    /// What all connections hold in the memory budget ([`MsgCounters::mem_held`]).
    pub fn mem_held(&self) -> usize {
        self.held
    }

    /// What `conn` holds counted afresh: its session's [`Session::mem`] now (an HTTP/2
    /// session's own running sum is checked against a recount of its streams in debug
    /// builds) and its stalled request. Equals [`SessionIo::mem`] after every call of
    /// the driver's (tests).
    pub fn mem_recount(&self, conn: C) -> Option<usize> {
        let c = self.conns.get(self.keys.get(&conn)?)?;
        Some(c.session.mem() + c.stalled.as_ref().map_or(0, |r| truesize(&r.body)))
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

    /// A handle to the group's counters that outlives this side.
    pub fn counters_handle(&self) -> Arc<MsgCounters> {
        Arc::clone(&self.shared.counters)
    }

    /// The scheduler's counters.
    pub fn sched_stats(&self) -> sched::Stats {
        self.dispatcher.stats()
    }
}
