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

use crate::framer::FramerConfig;
use crate::parser::ParseErrorKind;
use crate::proto::{Session, SessionRequest, SessionState, Timeout};
use crate::reply::Staging;
use crate::sched::{self, Dispatcher, SchedConfig};
use crate::socket::Out;
use crate::socket::{
    Bell, IoEvent, Message, MsgConfigError, MsgCounters, MsgSocket, Origin, Shared,
};
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
}

/// Builds a session group: the I/O side and one socket per worker. Of `framer_cfg`
/// only `max_in_flight` applies (a session has its own bounds).
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
    let (dispatcher, workers) = sched::scheduler(sched_cfg).map_err(MsgConfigError::Sched)?;
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

    /// Whether `conn` should be read now.
    pub fn wants_input(&self, conn: C) -> bool {
        self.keys
            .get(&conn)
            .and_then(|k| self.conns.get(k))
            .is_some_and(Self::takes_input)
    }

    fn takes_input(c: &SConn<C>) -> bool {
        c.stalled.is_none() && c.session.wants_input()
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
        self.check_resumed(key);
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

    fn check_resumed(&mut self, key: u64) {
        if let Some(c) = self.conns.get_mut(&key) {
            let takes = Self::takes_input(c);
            self.resumed.check(key, &mut c.blocked, takes);
        }
    }

    /// Bytes received on `conn`, in order (ignored if it is not attached).
    pub fn on_data(&mut self, conn: C, data: Zbuf) {
        let Some(&key) = self.keys.get(&conn) else {
            return;
        };
        if let Some(c) = self.conns.get_mut(&key) {
            c.session.push(data);
        }
        self.dirty.insert(key);
        self.dispatch(key, false);
        self.check_resumed(key);
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
                    staging: Arc::clone(&c.staging),
                    shared: Arc::clone(&self.shared),
                    answered: false,
                },
                body: req.body.clone(),
            };
            match self.dispatcher.dispatch(key, msg) {
                Ok(_) => {
                    c.in_flight += 1;
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
        let mut dirty: Vec<u64> = self.dirty.drain().collect();
        dirty.sort_unstable();
        for key in dirty {
            self.service(key, &mut send);
        }
        replies
    }

    /// Dispatches `key`'s requests and writes its output; ends it if its session did.
    fn service(&mut self, key: u64, send: &mut impl FnMut(C, IoVec)) {
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
        self.check_resumed(key);
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
