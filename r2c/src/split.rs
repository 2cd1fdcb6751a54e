//! Split mode: NIC I/O and TCP on one core, application handlers on worker threads, joined
//! by bounded lock-free rings (one pair per worker). Messages carry zero-copy [`Zbuf`]s
//! and connection handles; replies go back over the worker's ring and the I/O core sends
//! them. This is the OSS deployment of LUNA (§4.1), and what msgsched's schedulers build on.
//!
//! Connections are assigned to workers by a software steering hash: the Toeplitz hash of
//! the connection's 4-tuple (as the NIC would compute for RSS) through a table of workers,
//! so connections to one port spread over workers by source port. A worker's connections
//! stay with it.
//!
//! Back pressure, never loss: when a worker's inbound ring is full the I/O core stops
//! reading that worker's connections (their data waits in TCP receive buffers, closing the
//! window); control messages (accepted, closed, ...) wait in a per-worker overflow queue
//! in order. When the send backlog of a connection is full the I/O core stops draining that
//! worker's replies until it empties. A worker whose outbound ring is full keeps at most
//! [`SplitConfig::worker_backlog`] messages itself; beyond that [`WorkerCtx::send`] refuses
//! and hands the data back ([`WouldBlock`]), and the worker takes no more input (so
//! [`Handler::on_idle`] runs, the place to offer it again) until the I/O core has drained
//! some.
//!
//! A worker's reset does not wait behind its replies (a ring of its own, taken first), so
//! it can end a connection whose peer does not read while that peer holds the rest up.

use crate::core::{Conn, CoreOptions, CoreSetup, CoreState, Mode};
use crate::device::Device;
use crate::runtime::{Runtime, RuntimeError};
use bifurcation::{RssConfig, MICROSOFT_KEY};
use core::net::SocketAddrV4;
use crossbeam_queue::ArrayQueue;
use luna_stack::stack::RecvError;
use luna_stack::stack::{ConnectError, Event};
use luna_stack::tcp::CloseReason;
use msgsched::doorbell::{DoorbellStats, Sleeper};
use msgsched::socket::Bell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use zbuf::{AllocError, Slab, Zbuf, ZbufMut};

/// I/O core to worker.
#[derive(Debug)]
pub enum ToWorker {
    /// A connection was accepted and assigned to this worker.
    Accepted {
        /// The connection.
        conn: Conn,
        /// Our address.
        local: SocketAddrV4,
        /// The peer.
        peer: SocketAddrV4,
    },
    /// A connection this worker opened is established.
    Connected {
        /// The connection.
        conn: Conn,
        /// The worker's token from [`WorkerCtx::connect`].
        token: u64,
    },
    /// A connect this worker asked for will never be established: refused at once, or
    /// its handshake ended (its handle was never announced, so no `Closed` follows).
    ConnectFailed {
        /// The worker's token.
        token: u64,
        /// Why.
        error: ConnectFailure,
    },
    /// Received bytes, in order (zero copy).
    Data {
        /// The connection.
        conn: Conn,
        /// The bytes.
        data: Zbuf,
    },
    /// The peer finished sending.
    Eof {
        /// The connection.
        conn: Conn,
    },
    /// The connection ended; the handle is dead.
    Closed {
        /// The connection.
        conn: Conn,
        /// Why, if known.
        reason: Option<CloseReason>,
    },
}

/// Why a worker's connect failed ([`ToWorker::ConnectFailed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFailure {
    /// The stack refused it at once (no route, no port, table full).
    Start(ConnectError),
    /// The handshake did not complete: refused by the peer, timed out or reset.
    Handshake(Option<CloseReason>),
    /// Asked after the runtime began to stop.
    Stopping,
}

impl ToWorker {
    /// The connection the message is about, if any.
    fn conn(&self) -> Option<Conn> {
        match self {
            ToWorker::Accepted { conn, .. }
            | ToWorker::Connected { conn, .. }
            | ToWorker::Data { conn, .. }
            | ToWorker::Eof { conn }
            | ToWorker::Closed { conn, .. } => Some(*conn),
            ToWorker::ConnectFailed { .. } => None,
        }
    }
}

/// Worker to I/O core.
#[derive(Debug)]
pub enum ToIo {
    /// Send all of `data` (zero copy).
    Send {
        /// The connection.
        conn: Conn,
        /// The bytes.
        data: Zbuf,
    },
    /// Close gracefully after queued data.
    Close {
        /// The connection.
        conn: Conn,
    },
    /// Reset.
    Abort {
        /// The connection.
        conn: Conn,
    },
    /// Open a connection owned by this worker; answered by `Connected`/`ConnectFailed`.
    Connect {
        /// Echoed back.
        token: u64,
        /// Where to.
        remote: SocketAddrV4,
    },
}

/// Split-mode settings.
#[derive(Debug, Clone)]
pub struct SplitConfig {
    /// Ports the I/O core listens on, with their backlog.
    pub listen: Vec<(u16, usize)>,
    /// Worker threads.
    pub workers: usize,
    /// CPUs to pin workers to (index = worker), when [`CoreOptions::pin`].
    pub worker_cpus: Vec<usize>,
    /// Slots of each ring.
    pub ring_size: usize,
    /// Key of the software steering hash.
    pub steering_key: Vec<u8>,
    /// Messages a worker holds beyond its full outbound ring before [`WorkerCtx::send`]
    /// refuses with [`WouldBlock`] (control messages still queue: a close always follows
    /// the data sent before it).
    pub worker_backlog: usize,
}

impl Default for SplitConfig {
    fn default() -> Self {
        SplitConfig {
            listen: Vec::new(),
            workers: 1,
            worker_cpus: Vec::new(),
            ring_size: 1024,
            steering_key: MICROSOFT_KEY.to_vec(),
            worker_backlog: 1024,
        }
    }
}

/// A worker's counters, readable while running.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Messages received from the I/O core.
    pub messages_in: AtomicU64,
    /// Messages sent to the I/O core.
    pub messages_out: AtomicU64,
    /// Times the outbound ring was full (messages waited in the worker).
    pub ring_full: AtomicU64,
}

struct Link {
    to_worker: ArrayQueue<ToWorker>,
    to_io: ArrayQueue<ToIo>,
    /// Resets, taken ahead of `to_io`: a reset drops the connection's unsent bytes, so
    /// it need not wait behind them (they may wait for a peer that never reads).
    aborts: ArrayQueue<Conn>,
    /// Messages the worker has finished handling (after its replies were queued).
    handled: AtomicU64,
    stats: WorkerStats,
    /// The I/O core's doorbell (the same for every link; `None` unless it sleeps when
    /// idle): rung after the worker pushed to `to_io` or `aborts`, or handled a message.
    bell: Option<Bell>,
}

impl Link {
    /// Wakes the I/O core if it may be asleep (after this worker published to it).
    fn ring(&self) {
        if let Some(b) = &self.bell {
            b.ring();
        }
    }

    /// Whether the I/O core has something of this worker's to take (the re-check of a
    /// core about to sleep).
    fn has_replies(&self) -> bool {
        !self.to_io.is_empty() || !self.aborts.is_empty()
    }
}

/// [`WorkerCtx::send`] refused: the worker already holds [`SplitConfig::worker_backlog`]
/// messages the I/O core has not taken. The data is handed back unchanged; offer it
/// again later (from [`Handler::on_idle`], which runs while the worker takes no input).
#[derive(Debug)]
pub struct WouldBlock(pub Zbuf);

impl WouldBlock {
    /// The refused data.
    pub fn into_inner(self) -> Zbuf {
        self.0
    }
}

impl std::fmt::Display for WouldBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the worker's reply queue is full: {} bytes not taken, send again once the I/O core has drained it",
            self.0.len()
        )
    }
}

impl std::error::Error for WouldBlock {}

/// What a worker's handler may do.
pub struct WorkerCtx<'a> {
    index: usize,
    link: &'a Link,
    overflow: &'a mut VecDeque<ToIo>,
    limit: usize,
    stop: &'a AtomicBool,
    cache: Option<&'a zbuf::CoreCache>,
}

impl WorkerCtx<'_> {
    /// This worker's index.
    pub fn worker(&self) -> usize {
        self.index
    }

    fn push(&mut self, m: ToIo) {
        self.link.stats.messages_out.fetch_add(1, Ordering::Relaxed);
        if self.overflow.is_empty() {
            if let Err(m) = self.link.to_io.push(m) {
                self.link.stats.ring_full.fetch_add(1, Ordering::Relaxed);
                self.overflow.push_back(m);
            }
        } else {
            self.overflow.push_back(m);
        }
    }

    /// Send all of `data` on `conn` (zero copy; the I/O core queues it in the runtime's
    /// send backlog, in order). `Err(WouldBlock(data))` when the worker already holds
    /// [`SplitConfig::worker_backlog`] messages the I/O core has not taken: nothing is
    /// queued and the data comes back ([`WorkerCtx::can_send`] tells beforehand).
    pub fn send(&mut self, conn: Conn, data: Zbuf) -> Result<(), WouldBlock> {
        if !self.can_send() {
            return Err(WouldBlock(data));
        }
        self.push(ToIo::Send { conn, data });
        Ok(())
    }

    /// Whether [`WorkerCtx::send`] takes data now.
    pub fn can_send(&self) -> bool {
        self.overflow.len() < self.limit
    }

    /// Close `conn` gracefully.
    pub fn close(&mut self, conn: Conn) {
        self.push(ToIo::Close { conn });
    }

    /// Reset `conn`. The reset overtakes what this worker queued for `conn` before it
    /// (a reset drops unsent bytes anyway), so it also ends a connection whose peer does
    /// not read while its replies hold up this worker's reply queue.
    pub fn abort(&mut self, conn: Conn) {
        if self.link.aborts.push(conn).is_ok() {
            self.link.stats.messages_out.fetch_add(1, Ordering::Relaxed);
        } else {
            self.push(ToIo::Abort { conn });
        }
    }

    /// Open a connection owned by this worker; `token` comes back in the answer.
    pub fn connect(&mut self, token: u64, remote: SocketAddrV4) {
        self.push(ToIo::Connect { token, remote });
    }

    /// A buffer from this worker's zbuf cache (heap without a slab).
    pub fn alloc(&self, len: usize) -> Result<ZbufMut, AllocError> {
        match self.cache {
            Some(c) => c.alloc(len),
            None => Ok(ZbufMut::heap(128, len)),
        }
    }

    /// Ask the whole runtime to shut down.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// A worker's application logic.
pub trait Handler {
    /// One message from the I/O core.
    fn on_message(&mut self, ctx: &mut WorkerCtx<'_>, msg: ToWorker);
    /// Called when no message was taken: the inbound ring is empty, or input is paused
    /// because the worker's reply queue is full (start client work and offer refused
    /// sends again here).
    fn on_idle(&mut self, _ctx: &mut WorkerCtx<'_>) {}
}

/// The I/O core's side.
struct SplitIo {
    links: Vec<Arc<Link>>,
    /// The `Backoff` sleep, cut short by the workers' rings.
    sleeper: Option<Sleeper>,
    listen: Vec<(u16, usize)>,
    steering: RssConfig,
    owner: HashMap<Conn, usize>,
    tokens: HashMap<Conn, u64>,
    /// Control messages waiting for room, per worker (order kept).
    overflow: Vec<VecDeque<ToWorker>>,
    /// Readable connections whose worker ring was full.
    paused: HashSet<Conn>,
    /// Connections whose `Accepted` still waits in their worker's overflow queue: if one
    /// closes first, its messages are dropped there and its worker never hears of it (a
    /// stuck worker's queue would otherwise grow with every connection that comes and
    /// goes).
    unannounced: HashSet<Conn>,
    /// Connections whose `Eof` went to their worker: `recv` keeps answering `Finished`,
    /// and each later `Readable` (one per segment of a burst) would send another.
    ended: HashSet<Conn>,
    /// A reply that did not fit the backlog, per worker (retried first).
    stalled: Vec<Option<ToIo>>,
    /// Messages pushed into each worker's ring, and taken from its replies and resets.
    pushed: Vec<u64>,
    taken: Vec<u64>,
    /// Stopping: no new input goes to the workers while they finish what they have.
    settling: bool,
}

impl SplitIo {
    /// Queues `m` for worker `w`; returns whether it went into the ring at once.
    fn send_to_worker(&mut self, w: usize, m: ToWorker, st: &mut CoreState) -> bool {
        if self.overflow[w].is_empty() {
            match self.links[w].to_worker.push(m) {
                Ok(()) => {
                    self.pushed[w] += 1;
                    st.stats.to_workers += 1;
                    return true;
                }
                Err(m) => self.overflow[w].push_back(m),
            }
        } else {
            self.overflow[w].push_back(m);
        }
        false
    }

    /// Move readable data of `h` to its worker while its ring has room.
    fn forward(&mut self, h: Conn, st: &mut CoreState) {
        let Some(&w) = self.owner.get(&h) else {
            return;
        };
        loop {
            if !self.overflow[w].is_empty() || self.links[w].to_worker.is_full() {
                if self.paused.insert(h) {
                    st.stats.worker_ring_full += 1;
                }
                return;
            }
            match st.recv(h) {
                Ok(Some(data)) => {
                    // Checked not full above, and only this thread pushes.
                    match self.links[w]
                        .to_worker
                        .push(ToWorker::Data { conn: h, data })
                    {
                        Ok(()) => {
                            self.pushed[w] += 1;
                            st.stats.to_workers += 1;
                        }
                        Err(m) => self.overflow[w].push_back(m),
                    }
                }
                Ok(None) => break,
                Err(RecvError::Finished) => {
                    if self.ended.insert(h) {
                        let _ = self.send_to_worker(w, ToWorker::Eof { conn: h }, st);
                    }
                    break;
                }
                Err(_) => break,
            }
        }
        self.paused.remove(&h);
    }

    fn apply(&mut self, w: usize, m: ToIo, st: &mut CoreState) -> Result<(), ToIo> {
        match m {
            // What does not go now (also the rest of a buffer bigger than the send
            // buffer and the backlog together) is retried first.
            ToIo::Send { conn, data } => match st.send_or_part(conn, data) {
                Ok(None) => {}
                Ok(Some(data)) => return Err(ToIo::Send { conn, data }),
                // The connection is gone or shut: its Closed message tells the worker.
                Err(_) => {}
            },
            ToIo::Close { conn } => {
                if self.owner.remove(&conn).is_some() {
                    self.paused.remove(&conn);
                    self.ended.remove(&conn);
                    st.close(conn);
                }
            }
            ToIo::Abort { conn } => {
                if self.owner.remove(&conn).is_some() {
                    self.paused.remove(&conn);
                    self.ended.remove(&conn);
                    st.abort(conn);
                }
            }
            // Shutdown closes connections without a word to their worker.
            ToIo::Connect { token, .. } if self.settling => {
                let error = ConnectFailure::Stopping;
                let _ = self.send_to_worker(w, ToWorker::ConnectFailed { token, error }, st);
            }
            ToIo::Connect { token, remote } => match st.connect(remote) {
                Ok(h) => {
                    self.owner.insert(h, w);
                    self.tokens.insert(h, token);
                }
                Err(e) => {
                    let error = ConnectFailure::Start(e);
                    let _ = self.send_to_worker(w, ToWorker::ConnectFailed { token, error }, st);
                }
            },
        }
        Ok(())
    }

    fn on_events(&mut self, st: &mut CoreState) -> bool {
        let mut any = false;
        while let Some(ev) = st.stack.poll_event() {
            any = true;
            st.stats.events += 1;
            match ev {
                Event::Acceptable(l) => {
                    while let Some(h) = st.accept(l) {
                        let Some((local, peer)) = st
                            .stack
                            .connection(h)
                            .map(|c| (c.tuple().local, c.tuple().remote))
                        else {
                            continue;
                        };
                        if st.stopping || self.settling {
                            st.close(h);
                            continue;
                        }
                        let w = usize::from(self.steering.queue_of_ipv4_tcp(peer, local));
                        self.owner.insert(h, w);
                        let m = ToWorker::Accepted {
                            conn: h,
                            local,
                            peer,
                        };
                        if !self.send_to_worker(w, m, st) {
                            self.unannounced.insert(h);
                        }
                    }
                }
                Event::Connected(h) => {
                    st.stats.connected += 1;
                    if let (Some(&w), Some(token)) = (self.owner.get(&h), self.tokens.remove(&h)) {
                        let _ = self.send_to_worker(w, ToWorker::Connected { conn: h, token }, st);
                    }
                }
                Event::Readable(h) if !self.settling => self.forward(h, st),
                Event::Readable(_) => {}
                Event::Writable(_) => {}
                Event::Closed(h) => {
                    let reason = st.on_closed(h);
                    self.paused.remove(&h);
                    self.ended.remove(&h);
                    let token = self.tokens.remove(&h);
                    if let Some(w) = self.owner.remove(&h) {
                        if self.unannounced.remove(&h) {
                            // Its worker was never told of it: nothing to tell now.
                            self.overflow[w].retain(|m| m.conn() != Some(h));
                            continue;
                        }
                        // A connection still in its handshake is known to the worker
                        // by its token only.
                        let m = match token {
                            Some(token) => ToWorker::ConnectFailed {
                                token,
                                error: ConnectFailure::Handshake(reason),
                            },
                            None => ToWorker::Closed { conn: h, reason },
                        };
                        let _ = self.send_to_worker(w, m, st);
                    }
                }
            }
        }
        any
    }
}

impl Mode for SplitIo {
    fn start(&mut self, st: &mut CoreState) {
        st.listen_all(&self.listen);
    }

    fn iteration(&mut self, st: &mut CoreState) -> bool {
        let mut work = self.on_events(st);
        // Flush control overflow, then resume paused connections.
        for w in 0..self.links.len() {
            while let Some(m) = self.overflow[w].pop_front() {
                let accepted = match &m {
                    ToWorker::Accepted { conn, .. } => Some(*conn),
                    _ => None,
                };
                if let Err(m) = self.links[w].to_worker.push(m) {
                    self.overflow[w].push_front(m);
                    break;
                }
                if let Some(h) = accepted {
                    self.unannounced.remove(&h);
                }
                self.pushed[w] += 1;
                st.stats.to_workers += 1;
                work = true;
            }
        }
        if !self.paused.is_empty() && !self.settling {
            let paused: Vec<Conn> = self.paused.iter().copied().collect();
            for h in paused {
                self.forward(h, st);
            }
        }
        // Replies, a bounded number per worker so one worker cannot starve the others;
        // resets first (they may end the connection a stalled reply waits for).
        for w in 0..self.links.len() {
            while let Some(conn) = self.links[w].aborts.pop() {
                self.taken[w] += 1;
                work = true;
                st.stats.from_workers += 1;
                let _ = self.apply(w, ToIo::Abort { conn }, st);
            }
            if let Some(m) = self.stalled[w].take() {
                st.flush_backlogs();
                if let Err(m) = self.apply(w, m, st) {
                    self.stalled[w] = Some(m);
                    continue;
                }
            }
            for _ in 0..256 {
                let Some(m) = self.links[w].to_io.pop() else {
                    break;
                };
                self.taken[w] += 1;
                work = true;
                st.stats.from_workers += 1;
                if let Err(m) = self.apply(w, m, st) {
                    self.stalled[w] = Some(m);
                    break;
                }
            }
        }
        work || self.on_events(st)
    }

    fn stop(&mut self, _st: &mut CoreState) {
        self.settling = true;
    }

    fn sleep(&mut self, d: luna_stack::time::Duration) -> u64 {
        // Workers ring after each message handled (its replies, or only the `handled`
        // count `settled` waits for) and after pushing anything else.
        let links = &self.links;
        crate::core::wakeable_sleep(self.sleeper.as_mut(), d, || {
            links.iter().any(|l| l.has_replies())
        })
    }

    /// Every worker has handled what it was given and the I/O core has taken its
    /// replies: the connections may close (their FIN follows the replies).
    fn settled(&mut self, _st: &mut CoreState) -> bool {
        (0..self.links.len()).all(|w| {
            let l = &self.links[w];
            // Acquire: the replies a handled message queued are counted by then.
            self.overflow[w].is_empty()
                && self.stalled[w].is_none()
                && l.handled.load(Ordering::Acquire) == self.pushed[w]
                && l.stats.messages_out.load(Ordering::Relaxed) == self.taken[w]
        })
    }
}

fn worker_loop<H: Handler>(
    index: usize,
    link: Arc<Link>,
    mut handler: H,
    stop: Arc<AtomicBool>,
    cache: Option<zbuf::CoreCache>,
    io_done: Arc<AtomicBool>,
    limit: usize,
) {
    let mut overflow = VecDeque::new();
    loop {
        // What this pass gave the I/O core (messages out, and the handled count),
        // to ring its doorbell once for it.
        let out = link.stats.messages_out.load(Ordering::Relaxed);
        let held = overflow.len();
        // Replies that did not fit go first, in order.
        while let Some(m) = overflow.pop_front() {
            if let Err(m) = link.to_io.push(m) {
                overflow.push_front(m);
                break;
            }
        }
        let mut ctx = WorkerCtx {
            index,
            link: &link,
            overflow: &mut overflow,
            limit,
            stop: &stop,
            cache: cache.as_ref(),
        };
        // Do not take more input while replies are stuck: back pressure to the I/O core.
        let msg = if ctx.can_send() {
            link.to_worker.pop()
        } else {
            None
        };
        match msg {
            Some(m) => {
                link.stats.messages_in.fetch_add(1, Ordering::Relaxed);
                handler.on_message(&mut ctx, m);
                link.handled.fetch_add(1, Ordering::Release);
                link.ring();
            }
            None => {
                if io_done.load(Ordering::Acquire) {
                    break;
                }
                handler.on_idle(&mut ctx);
                // Only a pass that gave the core something rings (an idle worker spins
                // here: its rings would cost a fence each for nothing).
                if overflow.len() < held || link.stats.messages_out.load(Ordering::Relaxed) != out {
                    link.ring();
                }
                std::thread::yield_now();
            }
        }
    }
}

/// Handles to a split runtime's workers.
#[derive(Clone)]
pub struct SplitWorkers {
    links: Vec<Arc<Link>>,
}

impl SplitWorkers {
    /// Counters of worker `i`.
    pub fn stats(&self, i: usize) -> Option<&WorkerStats> {
        self.links.get(i).map(|l| &l.stats)
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// Whether there are no workers.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// The I/O core's idle sleeps and the wakeups the workers delivered (`None` unless
    /// the idle strategy is `Backoff`).
    pub fn doorbell(&self) -> Option<DoorbellStats> {
        self.links.first()?.bell.as_ref().map(|b| b.stats())
    }
}

impl Runtime {
    /// Start split mode: `io` runs NIC I/O and TCP, `split.workers` threads run
    /// `make_handler(worker_index)`. Workers exit after the I/O core has stopped.
    pub fn spawn_split<D, H, F>(
        io: CoreSetup<D>,
        opts: CoreOptions,
        split: SplitConfig,
        make_handler: F,
    ) -> Result<(Runtime, SplitWorkers), RuntimeError>
    where
        D: Device + Send + 'static,
        H: Handler + 'static,
        F: Fn(usize) -> H + Send + Sync + 'static,
    {
        let io_index = io.index;
        let bad = |m: &str| RuntimeError {
            core: io_index,
            error: crate::core::CoreError::Spawn(m.to_string()),
        };
        if split.workers == 0 || split.workers > usize::from(u16::MAX) {
            return Err(bad("split mode needs 1..=65535 workers"));
        }
        if split.ring_size == 0 {
            return Err(bad("split ring_size must be at least 1"));
        }
        if split.worker_backlog == 0 {
            return Err(bad("split worker_backlog must be at least 1"));
        }
        let limit = split.worker_backlog;
        let sleeper = crate::core::doorbell_for(opts.idle);
        let bell = crate::core::bell_of(&sleeper);
        let steering = RssConfig::round_robin(&split.steering_key, 128, split.workers as u16)
            .map_err(|e| bad(&e.to_string()))?;
        let links: Vec<Arc<Link>> = (0..split.workers)
            .map(|_| {
                Arc::new(Link {
                    to_worker: ArrayQueue::new(split.ring_size),
                    to_io: ArrayQueue::new(split.ring_size),
                    aborts: ArrayQueue::new(split.ring_size),
                    handled: AtomicU64::new(0),
                    stats: WorkerStats::default(),
                    bell: bell.clone(),
                })
            })
            .collect();
        let io_links = links.clone();
        let n = split.workers;
        let listen = split.listen.clone();
        let slab: Option<Slab> = opts.slab.clone();
        let pin = opts.pin;
        // The sleeper moves into the core thread (taken there, once).
        let sleeper = std::sync::Mutex::new(sleeper);
        let mut rt = Runtime::spawn_with(vec![io], opts, move |_| SplitIo {
            links: io_links.clone(),
            sleeper: sleeper.lock().ok().and_then(|mut g| g.take()),
            listen: listen.clone(),
            steering: steering.clone(),
            owner: HashMap::new(),
            tokens: HashMap::new(),
            overflow: (0..n).map(|_| VecDeque::new()).collect(),
            paused: HashSet::new(),
            unannounced: HashSet::new(),
            ended: HashSet::new(),
            stalled: (0..n).map(|_| None).collect(),
            pushed: vec![0; n],
            taken: vec![0; n],
            settling: false,
        })?;
        let stop = rt.stop_flag();
        let io_done = Arc::new(AtomicBool::new(false));
        let spawn = crate::workers::Spawn {
            name: "r2c-worker",
            io_index,
            pin,
            cpus: &split.worker_cpus,
            slab,
        };
        let done = Arc::clone(&io_done);
        let handles = crate::workers::spawn(&spawn, links.clone(), move |w, link, cache| {
            // A dead worker would strand its connections for good (nothing else reads its
            // ring): its panic stops the runtime, as a core's does.
            let _stop_on_panic = crate::runtime::StopOnPanic(Arc::clone(&stop));
            worker_loop(
                w,
                link,
                make_handler(w),
                Arc::clone(&stop),
                cache,
                Arc::clone(&done),
                limit,
            )
        })
        .map_err(|e| bad(&e))?;
        // Workers run until the I/O core has finished (its replies drained).
        rt.add_thread(crate::workers::joiner(handles, move || {
            io_done.store(true, Ordering::Release)
        }));
        Ok((rt, SplitWorkers { links }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handle of a real (idle) stack: the rings only carry it.
    fn a_conn() -> Conn {
        use luna_stack::stack::{Stack, StackConfig};
        use luna_stack::wire::{EthernetAddress, Ipv4Cidr};
        let cidr = Ipv4Cidr::new(core::net::Ipv4Addr::new(198, 18, 0, 1), 24).unwrap();
        let cfg = StackConfig::new(EthernetAddress([2, 0, 0, 0, 0, 1]), cidr);
        let mut stack = Stack::new(cfg, crate::rng::CoreRng::from_seed([1; 32])).unwrap();
        let peer = SocketAddrV4::new(core::net::Ipv4Addr::new(198, 18, 0, 2), 7);
        let now = luna_stack::time::Instant::ZERO;
        stack.connect(now, peer, Some(61440)).unwrap()
    }

    fn link(ring: usize) -> Link {
        Link {
            to_worker: ArrayQueue::new(ring),
            to_io: ArrayQueue::new(ring),
            aborts: ArrayQueue::new(ring),
            handled: AtomicU64::new(0),
            stats: WorkerStats::default(),
            bell: None,
        }
    }

    /// A worker's reply queue is bounded: past the ring and `worker_backlog` messages,
    /// `send` hands the data back; control messages still queue behind the data.
    #[test]
    fn worker_send_refuses_past_its_backlog_and_returns_the_data() {
        let link = link(1);
        let mut overflow = VecDeque::new();
        let stop = AtomicBool::new(false);
        let mut ctx = WorkerCtx {
            index: 0,
            link: &link,
            overflow: &mut overflow,
            limit: 2,
            stop: &stop,
            cache: None,
        };
        let conn = a_conn();
        for i in 0..3u8 {
            assert!(
                ctx.send(conn, Zbuf::copy_from_slice(&[i])).is_ok(),
                "send {i}"
            );
        }
        assert!(!ctx.can_send());
        let refused = ctx.send(conn, Zbuf::copy_from_slice(b"four"));
        match refused {
            Err(e) => assert_eq!(&e.into_inner()[..], b"four"),
            Ok(()) => panic!("a fourth send past ring (1) + backlog (2) was taken"),
        }
        ctx.close(conn);
        assert_eq!(overflow.len(), 3);
        // The ring holds the first send, the worker the next two and the close, in order.
        let mut order = Vec::new();
        while let Some(m) = link.to_io.pop().or_else(|| overflow.pop_front()) {
            order.push(match m {
                ToIo::Send { data, .. } => data[0],
                ToIo::Close { .. } => b'c',
                other => panic!("unexpected {other:?}"),
            });
        }
        assert_eq!(order, [0, 1, 2, b'c']);
        assert_eq!(link.stats.ring_full.load(Ordering::Relaxed), 1);
    }
}
