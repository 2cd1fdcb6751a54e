//! Message mode: split mode with message sockets (msgsched). The I/O core runs NIC I/O,
//! TCP and each connection's parser; whole messages are scheduled across worker threads
//! by msgsched's CP / CS / MS scheduler, and replies come back through per-connection
//! staging (transmit delegation) in request order for ordered protocols.
//!
//! Connections belong to no worker: an accepted connection is *attached* to the I/O
//! core's [`MsgIo`] with a parser made by the application's factory. A worker's handler
//! gets one [`Message`] at a time and answers on its [`Origin`]
//! through [`MsgCtx::reply`] (zero copy: the reply is an [`IoVec`] of zbufs).
//!
//! Back pressure, never loss: a connection is read only while its framer wants input,
//! the scheduler had room for its last message, and no reply of it waits for TCP send
//! space; otherwise its bytes wait in the TCP receive buffer (the window closes).
//! A parse error ends only its own connection (counted by kind in
//! [`msgsched::socket::MsgCounters`]): the requests before the bad one are answered,
//! then the parser's farewell, then FIN.
//!
//! Timers ([`MsgTimeouts`]; the runtime owns the clock, sessions and framers stay
//! sans-IO): a connection with nothing in progress and no traffic for `idle` is ended,
//! and so is one whose output is owed to a peer that takes none of it for `send` (it
//! stopped reading, or an HTTP/2 peer holds its windows at zero and goes quiet). A
//! session says goodbye first ([`Session::timed_out`]: HTTP/2 GOAWAY NO_ERROR, then the
//! linger below); a framed connection is closed (idle) or reset (send). Counted as
//! `timeout_idle` / `timeout_send`. Time a request spends at a worker is ours, not the
//! peer's: it never counts against the send timeout.

use crate::clock::{Clock as _, ClockSource, CoreClock};
use crate::core::{bell_of, doorbell_for, Conn, CoreOptions, CoreSetup, CoreState, Mode};
use crate::device::Device;
use crate::runtime::{Runtime, RuntimeError};
use luna_stack::stack::Event;
use luna_stack::stack::RecvError;
use msgsched::doorbell::{DoorbellStats, Sleeper};
use msgsched::framer::FramerConfig;
use msgsched::parser::Parser;
use msgsched::proto::io::{session_group_with_doorbell, SessionIo};
use msgsched::proto::{Session, Timeout};
use msgsched::sched::{RecvError as SchedRecvError, SchedConfig};
use msgsched::socket::{
    group_with_doorbell, Bell, IoEvent, Message, MsgCounters, MsgIo, MsgSocket, Origin,
};
use msgsched::virt::{EpochTimes, Occupation, VirtStats, VirtualPool};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use zbuf::{AllocError, IoVec, Slab, Zbuf, ZbufMut};

// The message layer's budget and the stack's `rcv_mem_total` are in one unit.
const _: () = assert!(msgsched::framer::BUF_OVERHEAD == luna_stack::tcp::SEG_OVERHEAD);

/// The per-core receive-memory budget of the message layer
/// ([`FramerConfig::mem_budget`]): what a framer group may hold before workers get it.
/// From the devices' fixed receive pools: half of what the stack may hold
/// ([`Device::rx_mem_budget`] is half of a DPDK port's pool, shared by its queues), so
/// the stack holds at most half of the pool, the message layer a quarter, and the rx
/// rings, ARP, ACKs and FINs keep the rest. A budget the setup changed from msgsched's
/// default is kept; so is the default without a fixed pool (the in-memory link). At
/// least two of the largest messages, so that one can always complete beside another.
fn mem_budget<D: Device>(framer: &FramerConfig, devices: &[D]) -> usize {
    if framer.mem_budget != msgsched::framer::DEFAULT_MEM_BUDGET {
        return framer.mem_budget;
    }
    let pool = devices
        .iter()
        .filter_map(Device::rx_mem_budget)
        .fold(None, |sum: Option<usize>, b| {
            Some(sum.unwrap_or(0).saturating_add(b))
        });
    pool.map_or(framer.mem_budget, |half| {
        (half / 2).max(framer.max_message.saturating_mul(2))
    })
}

/// `cfg.framer` with the budget for `io`'s devices ([`mem_budget`]).
fn framer_cfg<D: Device>(cfg: &MsgConfig, io: &CoreSetup<D>) -> FramerConfig {
    FramerConfig {
        mem_budget: mem_budget(&cfg.framer, &io.devices),
        ..cfg.framer
    }
}

/// Message-mode settings.
#[derive(Debug, Clone)]
pub struct MsgConfig {
    /// Ports the I/O core listens on, with their backlog.
    pub listen: Vec<(u16, usize)>,
    /// The scheduler: model (CP / CS / MS), workers, per-worker queue capacity.
    pub sched: SchedConfig,
    /// Per-connection bounds (largest message, messages in flight) and the core's
    /// receive-memory budget (`mem_budget`: left at its default, it is set from the
    /// devices' receive pools, a quarter of a DPDK port's; `mem_budget` in this module).
    pub framer: FramerConfig,
    /// CPUs to pin workers to (index = worker), when [`CoreOptions::pin`].
    pub worker_cpus: Vec<usize>,
}

/// Message mode's timers (see the module docs). `None`: that timer is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgTimeouts {
    /// End a connection with nothing in progress and no bytes either way for this long
    /// (nginx: `keepalive_timeout` 75 s, formerly `http2_idle_timeout`).
    pub idle: Option<Duration>,
    /// End a connection whose owed output made no progress for this long (nginx:
    /// `send_timeout` 60 s, between two successive writes).
    pub send: Option<Duration>,
}

impl MsgTimeouts {
    /// No timers (memcached's default: `idle_timeout` 0; [`Runtime::spawn_msg`]).
    pub const NONE: MsgTimeouts = MsgTimeouts {
        idle: None,
        send: None,
    };

    /// nginx's defaults for HTTP/2: idle 75 s, send 60 s ([`Runtime::spawn_msg_session`]).
    pub const SESSIONS: MsgTimeouts = MsgTimeouts {
        idle: Some(Duration::from_secs(75)),
        send: Some(Duration::from_secs(60)),
    };
}

/// How often the timers are checked (they are coarse: seconds).
const TIMER_TICK: Duration = Duration::from_millis(100);

/// A connection's last progress, for the timers.
#[derive(Debug, Clone, Copy)]
struct Clock {
    /// Bytes received, or output written.
    last_any: luna_stack::time::Instant,
    /// Output written (to TCP, or acknowledged by the peer), or work at a worker.
    last_out: luna_stack::time::Instant,
    /// TCP send capacity last seen (it grows as the peer acknowledges).
    cap: usize,
}

/// What a worker's handler may do.
pub struct MsgCtx<'a> {
    socket: &'a mut MsgSocket<Conn>,
    cache: Option<&'a zbuf::CoreCache>,
    stop: &'a AtomicBool,
}

impl MsgCtx<'_> {
    /// This worker's index.
    pub fn worker(&self) -> usize {
        self.socket.index()
    }

    /// Answers the message of `origin` with `reply`; false if its connection has gone
    /// (the reply is dropped and counted).
    pub fn reply(&mut self, origin: Origin<Conn>, reply: IoVec) -> bool {
        self.socket.reply(origin, reply)
    }

    /// Answers the message of `origin` with `reply` (it may be empty) and then closes its
    /// connection gracefully, once every earlier reply has gone out (memcached's
    /// `quit`); replies to its later messages are dropped.
    pub fn reply_and_close(&mut self, origin: Origin<Conn>, reply: IoVec) -> bool {
        self.socket.reply_and_close(origin, reply)
    }

    /// Completes the message of `origin` without a reply.
    pub fn finish(&mut self, origin: Origin<Conn>) -> bool {
        self.socket.finish(origin)
    }

    /// A buffer from this worker's zbuf cache (heap without a slab).
    pub fn alloc(&self, len: usize) -> Result<ZbufMut, AllocError> {
        match self.cache {
            Some(c) => c.alloc(len),
            None => Ok(ZbufMut::heap(128, len)),
        }
    }

    /// The group's counters.
    pub fn counters(&self) -> &MsgCounters {
        self.socket.counters()
    }

    /// Ask the whole runtime to shut down.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// A worker's application logic in message mode.
pub trait MsgHandler {
    /// One whole message; answer it (now or later) through `ctx`. Dropping its origin
    /// unanswered completes it without a reply (counted as abandoned).
    fn on_message(&mut self, ctx: &mut MsgCtx<'_>, msg: Message<Conn>);
}

/// A reply held back by an occupied virtual worker ([`VirtualHandler`]).
pub struct Occupied {
    /// How long the worker stays occupied: from when a real worker would have started
    /// the message (its previous occupation's end or the message's arrival, whichever is
    /// later; msgsched's `VirtualPool`, "Start times"), or from when the handler
    /// returned if [`VirtualHandler::start_when_taken`] says so.
    pub service: Duration,
    /// The message to answer once the occupation ends.
    pub origin: Origin<Conn>,
    /// The reply then sent.
    pub reply: IoVec,
}

/// Application logic of *virtual* workers ([`Runtime::spawn_msg_virtual`]): the
/// group's `cfg.sched.workers` message sockets are real msgsched workers (placement,
/// handoff and stealing unchanged), all advanced by the I/O core itself in every
/// iteration ([`msgsched::virt::VirtualPool`]: after the NIC poll and the reads, due
/// occupations end and their replies go out with the others; at the end of the
/// iteration every free worker polls its socket); a worker that took a message stays
/// occupied — takes, steals and is handed nothing — for the [`Occupied::service`] its
/// handler returned, then its reply goes out.
pub trait VirtualHandler: Send + 'static {
    /// One whole message taken by virtual worker `ctx.worker()`: answer it now through
    /// `ctx` (the worker stays free), or return the reply to send after the worker has
    /// been occupied for a while. Must not block: it runs on the I/O core.
    fn on_message(&mut self, ctx: &mut MsgCtx<'_>, msg: Message<Conn>) -> Option<Occupied>;

    /// `true`: every occupation starts when the handler returned, as before the start
    /// times of msgsched's `VirtualPool` (the workers then lose the time between a
    /// deadline and the I/O core's next turn). For comparison runs; asked once, at
    /// spawn.
    fn start_when_taken(&self) -> bool {
        false
    }

    /// The I/O core is done (its mode is dropped at the end of its thread; occupations
    /// still pending then are dropped, their messages completed unanswered): what the
    /// emulation did, with its emulation error.
    fn finished(&mut self, _stats: &VirtStats) {}
}

/// Virtual workers inside the I/O core's iteration (see [`VirtualHandler`]): the two
/// phases of [`VirtualPool`], each at a fresh reading of the clock.
trait Emulation: Send {
    /// Ends the occupations due now; their replies are staged for `poll_replies`.
    fn finish_due(&mut self) -> usize;
    /// Free workers take messages (the handler runs here, on the I/O core); `epoch`
    /// has just ended on the I/O side (every message placed so far is of it or older).
    fn take(&mut self, st: &CoreState, epoch: u64) -> usize;
    /// Whether a worker is occupied (a deadline is pending).
    fn busy(&self) -> bool;
}

struct Virtual<H: VirtualHandler> {
    pool: VirtualPool<Conn>,
    handler: H,
    clock: CoreClock,
    /// The clock at the end of each recent epoch: when a message was available.
    epochs: EpochTimes,
}

/// Epochs whose end times [`Virtual`] keeps (an older message reads as ready at the
/// oldest kept: later than it was, never earlier). 8 KiB.
const EPOCHS_KEPT: usize = 1024;

/// The virtual workers' clock, read fresh for every phase and every start: the core's
/// own source (the TSC when the core runs on it: a read and a multiply, where
/// `clock_gettime` through the vDSO cost the message-mode I/O core ~8% of its samples),
/// except that a manual test clock does not move the workers' deadlines: they are real
/// time.
fn virtual_clock(src: &ClockSource) -> CoreClock {
    CoreClock::new(match src {
        ClockSource::Manual(_) => ClockSource::Std,
        s => s.clone(),
    })
}

impl<H: VirtualHandler> Emulation for Virtual<H> {
    fn finish_due(&mut self) -> usize {
        let now = self.clock.now().as_nanos();
        self.pool.finish_due(now)
    }

    fn take(&mut self, st: &CoreState, epoch: u64) -> usize {
        // Read after the epoch ended: every message of it was placed by now.
        self.epochs.record(epoch, self.clock.now().as_nanos());
        let mut c = self.clock.clone();
        let clock = move || c.now().as_nanos();
        let (handler, cache, stop) = (&mut self.handler, st.cache(), st.stop_flag());
        let epochs = &self.epochs;
        self.pool.take(clock, |socket, m| {
            let ready_ns = epochs.ready(m.origin.epoch());
            let mut ctx = MsgCtx {
                socket,
                cache,
                stop,
            };
            handler.on_message(&mut ctx, m).map(|o| Occupation {
                service_ns: u64::try_from(o.service.as_nanos()).unwrap_or(u64::MAX),
                ready_ns,
                origin: o.origin,
                reply: o.reply,
            })
        })
    }

    fn busy(&self) -> bool {
        self.pool.busy() > 0
    }
}

impl<H: VirtualHandler> Drop for Virtual<H> {
    fn drop(&mut self) {
        // The I/O core is done (the mode is dropped with its thread): occupations still
        // pending are dropped with the pool (their messages complete unanswered, counted).
        self.handler.finished(self.pool.stats());
    }
}

/// What the mode needs of msgsched's I/O side: a framer group ([`MsgIo`]) or a session
/// group ([`SessionIo`]), each with its factory for new connections.
trait IoSide {
    fn attach_new(&mut self, h: Conn);
    fn wants_input(&self, h: Conn) -> bool;
    /// The driver stopped reading `h` because `wants_input` said no.
    fn wait_input(&mut self, h: Conn);
    /// A connection given to `wait_input` that takes input again.
    fn poll_resumed(&mut self) -> Option<Conn>;
    fn is_attached(&self, h: Conn) -> bool;
    fn on_data(&mut self, h: Conn, z: Zbuf);
    fn poll_replies(&mut self, send: &mut dyn FnMut(Conn, IoVec)) -> usize;
    fn poll_event(&mut self) -> Option<IoEvent<Conn>>;
    fn detach(&mut self, h: Conn);
    fn in_flight(&self, h: Conn) -> Option<usize>;
    /// Take no more messages of `h` (`true`) while its replies cannot go to TCP, or
    /// resume.
    fn pause(&mut self, h: Conn, paused: bool);
    /// Whether output owed to `h`'s peer is held above TCP (a session's flow control).
    fn busy(&self, h: Conn) -> bool;
    /// `timer` expired for `h` (counted here): `true` if the I/O side says goodbye and
    /// emits [`IoEvent::Shutdown`]; `false`: the driver closes `h` itself.
    fn time_out(&mut self, h: Conn, timer: Timeout) -> bool;
    /// A worker's notice waits for `poll_replies` (the re-check before a sleep).
    fn replies_pending(&self) -> bool;
    /// Ends the I/O side's epoch (msgsched's `MsgIo::end_epoch`) and returns it.
    fn end_epoch(&mut self) -> u64;
}

struct Framed<P: Parser, F: Fn() -> P> {
    io: MsgIo<Conn, P>,
    make: F,
}

impl<P: Parser, F: Fn() -> P> IoSide for Framed<P, F> {
    fn attach_new(&mut self, h: Conn) {
        // A fresh handle cannot be attached already.
        let _ = self.io.attach(h, (self.make)());
    }
    fn wants_input(&self, h: Conn) -> bool {
        self.io.wants_input(h)
    }
    fn wait_input(&mut self, h: Conn) {
        self.io.wait_input(h)
    }
    fn poll_resumed(&mut self) -> Option<Conn> {
        self.io.poll_resumed()
    }
    fn is_attached(&self, h: Conn) -> bool {
        self.io.is_attached(h)
    }
    fn on_data(&mut self, h: Conn, z: Zbuf) {
        self.io.on_data(h, z)
    }
    fn poll_replies(&mut self, send: &mut dyn FnMut(Conn, IoVec)) -> usize {
        self.io.poll_replies(send)
    }
    fn poll_event(&mut self) -> Option<IoEvent<Conn>> {
        self.io.poll_event()
    }
    fn detach(&mut self, h: Conn) {
        self.io.detach(h);
    }
    fn in_flight(&self, h: Conn) -> Option<usize> {
        self.io.in_flight(h)
    }
    fn pause(&mut self, h: Conn, paused: bool) {
        self.io.pause(h, paused);
    }
    fn busy(&self, _h: Conn) -> bool {
        false
    }
    fn replies_pending(&self) -> bool {
        self.io.replies_pending()
    }
    fn end_epoch(&mut self) -> u64 {
        self.io.end_epoch()
    }
    fn time_out(&mut self, _h: Conn, timer: Timeout) -> bool {
        let c = self.io.counters();
        match timer {
            Timeout::Idle => &c.timeout_idle,
            Timeout::Send => &c.timeout_send,
        }
        .fetch_add(1, Ordering::Relaxed);
        false
    }
}

struct Sessions<F: Fn() -> Box<dyn Session>> {
    io: SessionIo<Conn>,
    make: F,
}

impl<F: Fn() -> Box<dyn Session>> IoSide for Sessions<F> {
    fn attach_new(&mut self, h: Conn) {
        self.io.attach(h, (self.make)());
    }
    fn wants_input(&self, h: Conn) -> bool {
        self.io.wants_input(h)
    }
    fn wait_input(&mut self, h: Conn) {
        self.io.wait_input(h)
    }
    fn poll_resumed(&mut self) -> Option<Conn> {
        self.io.poll_resumed()
    }
    fn is_attached(&self, h: Conn) -> bool {
        self.io.is_attached(h)
    }
    fn on_data(&mut self, h: Conn, z: Zbuf) {
        self.io.on_data(h, z)
    }
    fn poll_replies(&mut self, send: &mut dyn FnMut(Conn, IoVec)) -> usize {
        self.io.poll_replies(send)
    }
    fn poll_event(&mut self) -> Option<IoEvent<Conn>> {
        self.io.poll_event()
    }
    fn detach(&mut self, h: Conn) {
        self.io.detach(h);
    }
    fn in_flight(&self, h: Conn) -> Option<usize> {
        self.io.in_flight(h)
    }
    fn pause(&mut self, _h: Conn, _paused: bool) {
        // Nothing to do: a session bounds its own output (HTTP/2 flow control and its
        // output cap), and `MsgMode::read` leaves the peer's bytes in TCP while replies
        // wait for send space, so no more requests are taken meanwhile.
    }
    fn busy(&self, h: Conn) -> bool {
        self.io.busy(h)
    }
    fn time_out(&mut self, h: Conn, timer: Timeout) -> bool {
        self.io.time_out(h, timer);
        true
    }
    fn replies_pending(&self) -> bool {
        self.io.replies_pending()
    }
    fn end_epoch(&mut self) -> u64 {
        self.io.end_epoch()
    }
}

/// The I/O core's side.
struct MsgMode<S: IoSide> {
    io: Option<S>,
    /// Connections whose session ended (its goodbye, e.g. GOAWAY, is queued): they
    /// linger — the peer's bytes are read and discarded, so the peer is not reset
    /// before it has read the goodbye — and are closed once everything queued has been
    /// acknowledged, or aborted past the bounds (value: bytes discarded, when it began).
    closing: HashMap<Conn, (usize, luna_stack::time::Instant)>,
    listen: Vec<(u16, usize)>,
    /// Attached connections that may have unread bytes, not read while they take no
    /// input: read again when the I/O side reports them resumed
    /// ([`IoSide::poll_resumed`]) or their waiting replies have gone to TCP.
    unread: HashSet<Conn>,
    /// Connections to read again this iteration (reused buffer).
    again: Vec<Conn>,
    /// Reply bytes the send backlog could not take yet, per connection (order kept).
    unsent: HashMap<Conn, VecDeque<Zbuf>>,
    /// Peers that finished sending: close once nothing is in flight and all is sent.
    eof: HashSet<Conn>,
    timeouts: MsgTimeouts,
    /// Per attached connection, its last progress (only with a timer on).
    clocks: HashMap<Conn, Clock>,
    /// When the timers were last checked.
    last_tick: luna_stack::time::Instant,
    /// Virtual workers advanced by this core ([`Runtime::spawn_msg_virtual`]).
    virt: Option<Box<dyn Emulation>>,
    /// The `Backoff` sleep, cut short by the workers' reply notices (`None` with the
    /// idle strategies that never sleep).
    sleeper: Option<Sleeper>,
}

impl<S: IoSide> MsgMode<S> {
    fn io(&mut self) -> &mut S {
        self.io.as_mut().expect("message mode runs with its MsgIo")
    }

    /// Reads `h` while its framer and the scheduler take more.
    fn read(&mut self, h: Conn, st: &mut CoreState) {
        if self.unsent.contains_key(&h) {
            // Replies wait for send space: leave the requests in TCP (back pressure).
            self.unread.insert(h);
            return;
        }
        loop {
            if !self.io().wants_input(h) {
                if self.io().is_attached(h) {
                    self.unread.insert(h);
                    self.io().wait_input(h);
                }
                return;
            }
            match st.recv(h) {
                Ok(Some(z)) => {
                    st.stats.to_workers += 1;
                    if let Some(c) = self.clocks.get_mut(&h) {
                        c.last_any = st.now;
                    }
                    self.io().on_data(h, z);
                }
                Ok(None) => break,
                Err(RecvError::Finished) => {
                    self.eof.insert(h);
                    break;
                }
                Err(_) => break,
            }
        }
        self.unread.remove(&h);
    }

    /// Queues `z` on `h` behind anything already waiting; what does not go now (also
    /// the rest of a buffer bigger than the send buffer and backlog together) waits.
    fn send(unsent: &mut HashMap<Conn, VecDeque<Zbuf>>, h: Conn, z: Zbuf, st: &mut CoreState) {
        if let Some(q) = unsent.get_mut(&h) {
            q.push_back(z);
            return;
        }
        match st.send_or_part(h, z) {
            Ok(None) => {}
            Ok(Some(rest)) => {
                unsent.insert(h, VecDeque::from([rest]));
            }
            // Gone or shut: its Closed event detaches it.
            Err(_) => {}
        }
    }

    fn retry_unsent(&mut self, st: &mut CoreState) {
        if self.unsent.is_empty() {
            return;
        }
        st.flush_backlogs();
        let mut drained = Vec::new();
        let clocks = &mut self.clocks;
        self.unsent.retain(|&h, q| {
            while let Some(z) = q.pop_front() {
                match st.send_or_part(h, z) {
                    Ok(None) => {
                        if let Some(c) = clocks.get_mut(&h) {
                            (c.last_any, c.last_out) = (st.now, st.now);
                        }
                    }
                    Ok(Some(rest)) => {
                        q.push_front(rest);
                        return true;
                    }
                    Err(_) => return false,
                }
            }
            drained.push(h);
            false
        });
        for h in drained {
            // Its replies are in TCP again: take its next messages.
            self.io().pause(h, false);
            if self.unread.contains(&h) {
                self.again.push(h);
            }
        }
    }

    fn on_events(&mut self, st: &mut CoreState) -> bool {
        let mut any = false;
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
                        self.io().attach_new(h);
                        if self.timeouts != MsgTimeouts::NONE {
                            let cap = st.stack.connection(h).map_or(0, |c| c.send_capacity());
                            let c = Clock {
                                last_any: st.now,
                                last_out: st.now,
                                cap,
                            };
                            self.clocks.insert(h, c);
                        }
                        self.read(h, st);
                    }
                }
                Event::Readable(h) => self.read(h, st),
                Event::Connected(_) | Event::Writable(_) => {}
                Event::Closed(h) => {
                    let _ = st.on_closed(h);
                    self.forget(h);
                }
            }
        }
        any
    }

    fn forget(&mut self, h: Conn) {
        self.io().detach(h);
        self.unread.remove(&h);
        self.unsent.remove(&h);
        self.eof.remove(&h);
        self.closing.remove(&h);
        self.clocks.remove(&h);
    }

    /// The timers: each attached connection's idle or send timeout (see the module
    /// docs), checked every [`TIMER_TICK`].
    fn timers(&mut self, st: &mut CoreState) -> bool {
        if self.clocks.is_empty() || st.now.saturating_duration_since(self.last_tick) < TIMER_TICK {
            return false;
        }
        self.last_tick = st.now;
        let snd_buf = st.stack.config().tcp.snd_buf as usize;
        let mut expired = Vec::new();
        let hs: Vec<Conn> = self.clocks.keys().copied().collect();
        for h in hs {
            if self.closing.contains_key(&h) || !self.io().is_attached(h) {
                continue;
            }
            let (cap, unacked) = st.stack.connection(h).map_or((0, false), |c| {
                (
                    c.send_capacity(),
                    c.bytes_in_flight() > 0 || c.send_capacity() < snd_buf,
                )
            });
            let owed = self.unsent.contains_key(&h) || unacked || self.io().busy(h);
            let at_workers = self.io().in_flight(h).unwrap_or(0) > 0;
            let Some(c) = self.clocks.get_mut(&h) else {
                continue;
            };
            if cap > c.cap {
                // The peer acknowledged output.
                (c.last_any, c.last_out) = (st.now, st.now);
            }
            c.cap = cap;
            if at_workers {
                // Waiting for our workers is not the peer's doing.
                (c.last_any, c.last_out) = (st.now, st.now);
            } else if owed {
                if self
                    .timeouts
                    .send
                    .is_some_and(|t| st.now.saturating_duration_since(c.last_out) > t)
                {
                    expired.push((h, Timeout::Send));
                }
            } else if self
                .timeouts
                .idle
                .is_some_and(|t| st.now.saturating_duration_since(c.last_any) > t)
            {
                expired.push((h, Timeout::Idle));
            }
        }
        let work = !expired.is_empty();
        for (h, timer) in expired {
            self.clocks.remove(&h);
            if !self.io().time_out(h, timer) {
                self.forget(h);
                match timer {
                    Timeout::Idle => st.close(h),
                    Timeout::Send => st.abort(h),
                }
            }
        }
        work
    }

    /// Lingering connections: discard input; close once sent and acknowledged.
    fn linger(&mut self, st: &mut CoreState) -> bool {
        let mut work = false;
        let hs: Vec<Conn> = self.closing.keys().copied().collect();
        for h in hs {
            let Some(&(mut discarded, since)) = self.closing.get(&h) else {
                continue;
            };
            while let Ok(Some(z)) = st.recv(h) {
                discarded += z.len();
                work = true;
            }
            let sent = !self.unsent.contains_key(&h)
                && st.stack.connection(h).is_none_or(|c| {
                    c.bytes_in_flight() == 0
                        && c.send_capacity() >= st.stack.config().tcp.snd_buf as usize
                });
            if sent {
                self.forget(h);
                st.close(h);
                work = true;
            } else if discarded > LINGER_BYTES
                || st.now.saturating_duration_since(since) > LINGER_TIME
            {
                self.forget(h);
                st.abort(h);
                work = true;
            } else {
                self.closing.insert(h, (discarded, since));
            }
        }
        work
    }
}

/// Most bytes read and discarded from a lingering connection before it is reset.
const LINGER_BYTES: usize = 1 << 20;
/// Longest a connection lingers before it is reset.
const LINGER_TIME: Duration = Duration::from_secs(5);

impl<S: IoSide> Mode for MsgMode<S> {
    fn start(&mut self, st: &mut CoreState) {
        st.listen_all(&self.listen);
    }

    fn iteration(&mut self, st: &mut CoreState) -> bool {
        let mut work = self.on_events(st);
        self.retry_unsent(st);
        if self.timers(st) {
            work = true;
        }
        // Virtual workers whose occupation has ended stage their replies now, so they
        // go out with the real workers' below.
        if let Some(v) = &mut self.virt {
            if v.finish_due() > 0 {
                work = true;
            }
        }
        // Replies from the workers, in wire order per connection.
        let mut unsent = std::mem::take(&mut self.unsent);
        let mut clocks = std::mem::take(&mut self.clocks);
        let mut sent = 0u64;
        self.io().poll_replies(&mut |h, reply| {
            sent += 1;
            if let Some(c) = clocks.get_mut(&h) {
                (c.last_any, c.last_out) = (st.now, st.now);
            }
            for z in reply {
                Self::send(&mut unsent, h, z, st);
            }
        });
        self.unsent = unsent;
        self.clocks = clocks;
        if sent > 0 {
            // A peer that does not read: take no more of its messages until its replies
            // are in TCP (otherwise replies would pile up here without bound).
            let waiting: Vec<Conn> = self.unsent.keys().copied().collect();
            for h in waiting {
                self.io().pause(h, true);
            }
            st.stats.from_workers += sent;
            work = true;
        }
        while let Some(ev) = self.io().poll_event() {
            match ev {
                IoEvent::Close { conn, .. } => {
                    // A stream that cannot be framed: reset it (detached already).
                    st.abort(conn);
                    self.forget(conn);
                }
                IoEvent::Shutdown { conn, .. } => {
                    // A session's goodbye (e.g. GOAWAY) is queued: linger, then close.
                    self.closing.insert(conn, (0, st.now));
                }
            }
            work = true;
        }
        if !self.closing.is_empty() && self.linger(st) {
            work = true;
        }
        // Connections paused by their caps or by back pressure that take input again
        // (reported by the I/O side, no scan of every paused one), and those whose
        // replies went to TCP (`retry_unsent`).
        while let Some(h) = self.io().poll_resumed() {
            if self.unread.contains(&h) {
                self.again.push(h);
            }
        }
        if !self.again.is_empty() {
            let mut again = std::mem::take(&mut self.again);
            for &h in &again {
                if self.unread.contains(&h) {
                    self.read(h, st);
                }
            }
            again.clear();
            self.again = again;
        }
        // Half-closed peers: close once every request has been answered and sent.
        if !self.eof.is_empty() {
            let done: Vec<Conn> = self
                .eof
                .iter()
                .copied()
                .filter(|h| !self.unsent.contains_key(h))
                .collect();
            for h in done {
                if self.io().in_flight(h) == Some(0) {
                    self.forget(h);
                    st.close(h);
                    work = true;
                }
            }
        }
        // Free virtual workers take what this iteration dispatched (or released, under
        // CS); their replies go out once their occupation ends. While one is occupied
        // the iteration counts as work, so an idle strategy never sleeps past a deadline.
        if let Some(v) = &mut self.virt {
            let epoch = self.io.as_mut().map_or(0, |io| io.end_epoch());
            if v.take(st, epoch) > 0 || v.busy() {
                work = true;
            }
        }
        work || self.on_events(st)
    }

    fn stop(&mut self, _st: &mut CoreState) {
        // Shutdown still delivers events (connections closing): the I/O side stays until
        // the mode is dropped with the core thread, which disconnects the workers once
        // their queues are drained.
    }

    fn sleep(&mut self, d: luna_stack::time::Duration) -> u64 {
        // Every notice rings (msgsched's `Shared::notify`), and a notice is all a worker
        // hands this core. (A worker's take that frees room for a stalled connection
        // does not ring: the reply to what it took will.)
        let io = &self.io;
        let sleeper = self.sleeper.as_mut().filter(|_| io.is_some());
        crate::core::wakeable_sleep(sleeper, d, || {
            io.as_ref().is_some_and(|io| io.replies_pending())
        })
    }
}

fn worker_loop<H: MsgHandler>(
    mut socket: MsgSocket<Conn>,
    mut handler: H,
    stop: Arc<AtomicBool>,
    cache: Option<zbuf::CoreCache>,
) {
    loop {
        match socket.recv_timeout(Duration::from_millis(20)) {
            Ok(m) => {
                let mut ctx = MsgCtx {
                    socket: &mut socket,
                    cache: cache.as_ref(),
                    stop: &stop,
                };
                handler.on_message(&mut ctx, m);
            }
            Err(SchedRecvError::Timeout) => {}
            Err(SchedRecvError::Disconnected) => return,
        }
    }
}

/// Handles to a message-mode runtime's worker group.
#[derive(Clone)]
pub struct MsgWorkers {
    counters: Arc<MsgCounters>,
    workers: usize,
    bell: Option<Bell>,
}

impl MsgWorkers {
    /// The group's counters (messages, replies, drops by reason).
    pub fn counters(&self) -> &MsgCounters {
        &self.counters
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.workers
    }

    /// Whether there are no workers.
    pub fn is_empty(&self) -> bool {
        self.workers == 0
    }

    /// The I/O core's idle sleeps and the wakeups the workers' replies delivered
    /// (`None` unless the idle strategy is `Backoff`).
    pub fn doorbell(&self) -> Option<DoorbellStats> {
        self.bell.as_ref().map(|b| b.stats())
    }
}

impl Runtime {
    /// Start message mode: `io` runs NIC I/O, TCP and the parsers (`make_parser` for each
    /// accepted connection); `cfg.sched.workers` threads run `make_handler(worker)`.
    /// Workers exit after the I/O core has stopped and their queues are drained.
    /// No timers ([`MsgTimeouts::NONE`], memcached's default).
    pub fn spawn_msg<D, P, FP, H, FH>(
        io: CoreSetup<D>,
        opts: CoreOptions,
        cfg: MsgConfig,
        make_parser: FP,
        make_handler: FH,
    ) -> Result<(Runtime, MsgWorkers), RuntimeError>
    where
        D: Device + Send + 'static,
        P: Parser + 'static,
        FP: Fn() -> P + Clone + Send + Sync + 'static,
        H: MsgHandler + 'static,
        FH: Fn(usize) -> H + Send + Sync + 'static,
    {
        Self::spawn_msg_with_timeouts(io, opts, cfg, MsgTimeouts::NONE, make_parser, make_handler)
    }

    /// [`Runtime::spawn_msg`] with `timeouts`.
    pub fn spawn_msg_with_timeouts<D, P, FP, H, FH>(
        io: CoreSetup<D>,
        opts: CoreOptions,
        cfg: MsgConfig,
        timeouts: MsgTimeouts,
        make_parser: FP,
        make_handler: FH,
    ) -> Result<(Runtime, MsgWorkers), RuntimeError>
    where
        D: Device + Send + 'static,
        P: Parser + 'static,
        FP: Fn() -> P + Clone + Send + Sync + 'static,
        H: MsgHandler + 'static,
        FH: Fn(usize) -> H + Send + Sync + 'static,
    {
        let io_index = io.index;
        let sleeper = doorbell_for(opts.idle);
        let bell = bell_of(&sleeper);
        let (msg_io, sockets) =
            group_with_doorbell::<Conn, P>(&cfg.sched, framer_cfg(&cfg, &io), bell.clone())
                .map_err(|e| spawn_error(io_index, &format!("message mode: {e}")))?;
        let counters = msg_io.counters_handle();
        let side = Framed {
            io: msg_io,
            make: make_parser,
        };
        spawn_side(
            io,
            opts,
            cfg,
            timeouts,
            side,
            sleeper,
            counters,
            sockets,
            make_handler,
        )
    }

    /// [`Runtime::spawn_msg`] with *virtual* workers: the `cfg.sched.workers` message
    /// sockets are advanced by the I/O core itself, in every iteration, running
    /// `handler` (see [`VirtualHandler`]): one thread in all, no worker threads
    /// (`cfg.worker_cpus` is not used). For service-time emulation with more workers
    /// than CPUs; use [`crate::IdleStrategy::BusyPoll`] so that deadlines are noticed
    /// at once. No timers.
    pub fn spawn_msg_virtual<D, P, FP, H>(
        io: CoreSetup<D>,
        opts: CoreOptions,
        cfg: MsgConfig,
        make_parser: FP,
        handler: H,
    ) -> Result<(Runtime, MsgWorkers), RuntimeError>
    where
        D: Device + Send + 'static,
        P: Parser + 'static,
        FP: Fn() -> P + Clone + Send + Sync + 'static,
        H: VirtualHandler,
    {
        let io_index = io.index;
        // The virtual workers run on this core, so nothing rings while it sleeps
        // (an occupied worker keeps it awake), unless the handler sends an origin to
        // another thread and answers it there: that reply rings like a real worker's.
        let sleeper = doorbell_for(opts.idle);
        let bell = bell_of(&sleeper);
        let (msg_io, sockets) =
            group_with_doorbell::<Conn, P>(&cfg.sched, framer_cfg(&cfg, &io), bell.clone())
                .map_err(|e| spawn_error(io_index, &format!("message mode: {e}")))?;
        let counters = msg_io.counters_handle();
        let workers = sockets.len();
        let side = Framed {
            io: msg_io,
            make: make_parser,
        };
        let mut pool = VirtualPool::new(sockets);
        pool.set_start_when_taken(handler.start_when_taken());
        let virt: Box<dyn Emulation> = Box::new(Virtual {
            pool,
            handler,
            clock: virtual_clock(&opts.clock),
            epochs: EpochTimes::new(EPOCHS_KEPT),
        });
        let (rt, _stop) = spawn_io(io, opts, &cfg, MsgTimeouts::NONE, side, Some(virt), sleeper)?;
        let workers = MsgWorkers {
            counters,
            workers,
            bell,
        };
        Ok((rt, workers))
    }

    /// Start message mode with a session protocol ([`msgsched::proto`], e.g. HTTP/2):
    /// each accepted connection gets `make_session()`; the session answers connection
    /// frames on the I/O core and hands whole requests to the workers, which answer as in
    /// [`Runtime::spawn_msg`]. Of `cfg.framer`, `max_in_flight` and `mem_budget` apply
    /// (the budget set from the devices' receive pools as for framers, [`mem_budget`]:
    /// what the sessions hold of requests before workers get them; HTTP/2 withholds
    /// flow-control credit first, `msgsched::proto::io`). Timers: nginx's defaults
    /// ([`MsgTimeouts::SESSIONS`]).
    pub fn spawn_msg_session<D, FS, H, FH>(
        io: CoreSetup<D>,
        opts: CoreOptions,
        cfg: MsgConfig,
        make_session: FS,
        make_handler: FH,
    ) -> Result<(Runtime, MsgWorkers), RuntimeError>
    where
        D: Device + Send + 'static,
        FS: Fn() -> Box<dyn Session> + Clone + Send + Sync + 'static,
        H: MsgHandler + 'static,
        FH: Fn(usize) -> H + Send + Sync + 'static,
    {
        Self::spawn_msg_session_with_timeouts(
            io,
            opts,
            cfg,
            MsgTimeouts::SESSIONS,
            make_session,
            make_handler,
        )
    }

    /// [`Runtime::spawn_msg_session`] with `timeouts`.
    pub fn spawn_msg_session_with_timeouts<D, FS, H, FH>(
        io: CoreSetup<D>,
        opts: CoreOptions,
        cfg: MsgConfig,
        timeouts: MsgTimeouts,
        make_session: FS,
        make_handler: FH,
    ) -> Result<(Runtime, MsgWorkers), RuntimeError>
    where
        D: Device + Send + 'static,
        FS: Fn() -> Box<dyn Session> + Clone + Send + Sync + 'static,
        H: MsgHandler + 'static,
        FH: Fn(usize) -> H + Send + Sync + 'static,
    {
        let io_index = io.index;
        let sleeper = doorbell_for(opts.idle);
        let bell = bell_of(&sleeper);
        let (sio, sockets) =
            session_group_with_doorbell::<Conn>(&cfg.sched, framer_cfg(&cfg, &io), bell.clone())
                .map_err(|e| spawn_error(io_index, &format!("message mode: {e}")))?;
        let counters = sio.counters_handle();
        let side = Sessions {
            io: sio,
            make: make_session,
        };
        spawn_side(
            io,
            opts,
            cfg,
            timeouts,
            side,
            sleeper,
            counters,
            sockets,
            make_handler,
        )
    }
}

fn spawn_error(core: usize, m: &str) -> RuntimeError {
    RuntimeError {
        core,
        error: crate::core::CoreError::Spawn(m.to_string()),
    }
}

/// Starts the I/O core with `side`; returns the runtime and its stop flag.
fn spawn_io<D, S>(
    io: CoreSetup<D>,
    opts: CoreOptions,
    cfg: &MsgConfig,
    timeouts: MsgTimeouts,
    side: S,
    virt: Option<Box<dyn Emulation>>,
    sleeper: Option<Sleeper>,
) -> Result<(Runtime, Arc<AtomicBool>), RuntimeError>
where
    D: Device + Send + 'static,
    S: IoSide + Send + 'static,
{
    // The I/O side moves into the core thread (taken there by the closure, once).
    let cell = std::sync::Mutex::new(Some((side, virt, sleeper)));
    let listen = cfg.listen.clone();
    let rt = Runtime::spawn_with(vec![io], opts, move |_| {
        let (io, virt, sleeper) = match cell.lock().ok().and_then(|mut g| g.take()) {
            Some((side, virt, sleeper)) => (Some(side), virt, sleeper),
            None => (None, None, None),
        };
        MsgMode {
            io,
            closing: HashMap::default(),
            listen: listen.clone(),
            unread: HashSet::default(),
            again: Vec::new(),
            unsent: HashMap::default(),
            eof: HashSet::default(),
            timeouts,
            clocks: HashMap::default(),
            last_tick: luna_stack::time::Instant::ZERO,
            virt,
            sleeper,
        }
    })?;
    let stop = rt.stop_flag();
    Ok((rt, stop))
}

/// Starts the I/O core with `side` and the workers on `sockets`.
#[allow(clippy::too_many_arguments)]
fn spawn_side<D, S, H, FH>(
    io: CoreSetup<D>,
    opts: CoreOptions,
    cfg: MsgConfig,
    timeouts: MsgTimeouts,
    side: S,
    sleeper: Option<Sleeper>,
    counters: Arc<MsgCounters>,
    sockets: Vec<MsgSocket<Conn>>,
    make_handler: FH,
) -> Result<(Runtime, MsgWorkers), RuntimeError>
where
    D: Device + Send + 'static,
    S: IoSide + Send + 'static,
    H: MsgHandler + 'static,
    FH: Fn(usize) -> H + Send + Sync + 'static,
{
    let io_index = io.index;
    let workers = sockets.len();
    let slab: Option<Slab> = opts.slab.clone();
    let pin = opts.pin;
    let bell = bell_of(&sleeper);
    let (mut rt, stop) = spawn_io(io, opts, &cfg, timeouts, side, None, sleeper)?;
    let spawn = crate::workers::Spawn {
        name: "r2c-msg-worker",
        io_index,
        pin,
        cpus: &cfg.worker_cpus,
        slab,
    };
    let handles = crate::workers::spawn(&spawn, sockets, move |w, socket, cache| {
        worker_loop(socket, make_handler(w), Arc::clone(&stop), cache)
    })
    .map_err(|e| spawn_error(io_index, &e))?;
    rt.add_thread(crate::workers::joiner(handles, || {}));
    let workers = MsgWorkers {
        counters,
        workers,
        bell,
    };
    Ok((rt, workers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::tests::Pooled;
    use msgsched::framer::DEFAULT_MEM_BUDGET;

    /// The message layer gets half of what the stack gets from the same pools (a quarter
    /// of a DPDK port's), at least two of the largest messages; the default stays
    /// without a fixed pool, and a budget the setup chose stays.
    #[test]
    fn the_message_layers_budget_comes_from_the_devices_pools() {
        let mut cfg = FramerConfig::default();
        let two = [Pooled(Some(6 << 20)), Pooled(Some(2 << 20))];
        assert_eq!(mem_budget(&cfg, &two), 4 << 20);
        assert_eq!(mem_budget(&cfg, &[Pooled(None)]), DEFAULT_MEM_BUDGET);
        assert_eq!(
            mem_budget(&cfg, &[Pooled(Some(1 << 20))]),
            2 * cfg.max_message
        );
        cfg.mem_budget = 1 << 30;
        assert_eq!(mem_budget(&cfg, &two), 1 << 30);
    }
}
