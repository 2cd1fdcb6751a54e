//! The per-core engine shared by the inline, batch and split modes: device polling, the
//! stack, timers, the send backlog, port choice, stats and graceful shutdown.

use crate::clock::{Clock, ClockSource, CoreClock};
use crate::device::{Device, DeviceStats};
use crate::rng::CoreRng;
use crate::stats::{CoreStats, StatsCell, LOOP_GAP_MIN_NS};
use bifurcation::{ChooseError, PortChooser, PortRange, Steering};
use core::net::{Ipv4Addr, SocketAddrV4};
use luna_stack::stack::{
    ConnectError, ListenError, ListenerHandle, SocketHandle, Stack, StackConfig, Transmit,
};
use luna_stack::stack::{RecvError, SendError};
use luna_stack::tables::Route;
use luna_stack::tcp::{CloseReason, State};
use luna_stack::time::{Duration, Instant};
use luna_stack::wire::EthernetAddress;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use zbuf::{AllocError, CoreCache, Slab, Zbuf, ZbufMut};

/// Hashes connection handles with one multiply per word instead of SipHash (FxHash's
/// step); for the runtime's and applications' maps keyed by handles. Handles are
/// slot indexes this core's stack assigned, never chosen by a peer, so there is nothing
/// to defend against (the stack's own demux of peer-chosen 4-tuples stays keyed).
/// `handle_hash_spreads_sequential_slots` checks that sequential slots spread.
#[derive(Default, Clone, Copy)]
pub struct HandleHash(u64);

const HANDLE_HASH_K: u64 = 0x517c_c1b7_2722_0a95;

/// Oldest the published stats get while the core runs (ns): 1 ms. A busy core reaches
/// `stats_interval` iterations far sooner; an idle one that yields or sleeps may not for
/// seconds on a loaded machine, and readers (lunactl, `luna_runtime_stats`, knb's
/// windows) then saw counters seconds old.
pub const PUBLISH_MAX_AGE_NS: u64 = 1_000_000;

impl Hasher for HandleHash {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(HANDLE_HASH_K);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// `BuildHasher` of [`HandleHash`], for maps keyed by connection handles.
pub type HandleHashing = BuildHasherDefault<HandleHash>;

/// A connection, as the application names it (the stack's handle).
pub type Conn = SocketHandle;
/// A listening port.
pub type Listener = ListenerHandle;

/// What a core does when an iteration found no work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdleStrategy {
    /// Spin (lowest latency, one CPU at 100%).
    #[default]
    BusyPoll,
    /// `sched_yield` between empty iterations (shared CPUs, tests).
    Yield,
    /// Sleep, doubling from 2 µs up to `max` while idle, never past the next timer.
    /// In split and message mode a worker's reply or command cuts the sleep short
    /// (a [`msgsched::doorbell`]: the core announces it is about to sleep, re-checks
    /// its workers' rings, then parks; a worker rings after pushing, which costs a
    /// fence and one load unless the core may be asleep), so a reply never waits for
    /// the sleep to end. In batch mode, threads that feed the application ring
    /// [`crate::batch::Sockets::doorbell`] (re-check: [`crate::batch::BatchApp::pending`]).
    Backoff {
        /// Longest sleep.
        max: Duration,
    },
}

/// Knobs of the poll loop; the same for every core of a runtime.
#[derive(Debug, Clone)]
pub struct CoreOptions {
    /// Frames per receive burst.
    pub burst: usize,
    /// A receive burst of more than this many frames is handled in two halves: the
    /// first half's input, application work and transmit before the second half's
    /// input, so that a burst holding a pipelined peer's whole window does not answer
    /// it whole and both sides fall into lock-step. 0 = never split.
    pub rx_split: usize,
    /// What to do when idle.
    pub idle: IdleStrategy,
    /// Free the receive buffers an iteration releases after its transmit burst, not as
    /// the application drops them (`zbuf::dpdk::defer_mbuf_frees`): recycling a
    /// request's mbufs then overlaps the peer's work instead of delaying the answer.
    /// Default on; off frees each buffer at its last release, as before.
    pub defer_frees: bool,
    /// Publish stats every this many iterations, and at least every
    /// [`PUBLISH_MAX_AGE_NS`] of the core's own running (a core that yields or sleeps when
    /// idle may take seconds for `stats_interval` iterations on a busy machine).
    pub stats_interval: u64,
    /// Tries in a row in which the device takes nothing before the runtime drops one burst
    /// (`burst` frames) from the head of its transmit queue; the frames behind it get the
    /// same tries. A stall a little longer than the limit costs a burst, not the whole queue
    /// (up to `tx_queue_limit` frames); a dead link drains it a burst at a time.
    pub tx_retry_limit: u32,
    /// Most frames waiting for the device; beyond, the core stops asking the stack for
    /// more until the device has taken some (back pressure, no loss). Default 65,536
    /// (about 12 MiB of `Transmit`s at most, and only when that many are due): what TCP
    /// lets go out is built into frames at once, while its connection is in cache, and
    /// waits here in order. A queue of 4,096 left the rest of 5,000 connections' replies
    /// on the stack's dirty list, each built later from a connection gone cold:
    /// 5,000 connections × 4 KiB RPCs ran 1.07–1.37× faster with the larger queue
    /// (docs/benchmarks.md, "A deeper transmit queue").
    pub tx_queue_limit: usize,
    /// Most bytes per connection the runtime holds beyond the TCP send buffer for
    /// `Ctx::send`; beyond, `send` answers `WouldBlock`.
    pub max_backlog: usize,
    /// How long shutdown waits for connections to close before resetting them.
    pub shutdown_grace: Duration,
    /// Pin each core's thread to its CPU.
    pub pin: bool,
    /// Time source.
    pub clock: ClockSource,
    /// Fixed RNG seed for reproducible tests; `None` (always in production) seeds from the OS.
    pub rng_seed: Option<[u8; 32]>,
    /// Zbuf slab; each core registers a cache on it (core id = core index). Without it
    /// buffers the runtime allocates come from the heap.
    pub slab: Option<Slab>,
    /// Called on each core's thread, with the core index, once its loop has stopped
    /// polling and before its devices are released (closing a port tells the peer).
    /// For a rendezvous with a peer process: DPDK's memif PMD unmaps the shared rings
    /// from its control thread when the peer disconnects, racing with a receive burst
    /// still in progress, so neither side may close while the other polls
    /// (see `device::dpdk::memif_quiesce`).
    pub before_release: Option<ReleaseHook>,
    /// The control endpoint (`lunactl`): a unix socket path; off when `None`.
    pub control: Option<crate::control::ControlConfig>,
}

/// The frames of a receive burst of `n` handled before its first transmit: the first half
/// (rounded up) when `n` is above `split` (0 = never split), else all of them
/// ([`CoreOptions::rx_split`]; `knb raw` splits its bursts by the same rule).
pub fn rx_split_first(n: usize, split: usize) -> usize {
    if split != 0 && n > split {
        n.div_ceil(2)
    } else {
        n
    }
}

/// See [`CoreOptions::before_release`].
#[derive(Clone)]
pub struct ReleaseHook(pub Arc<dyn Fn(usize) + Send + Sync>);

impl fmt::Debug for ReleaseHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReleaseHook")
    }
}

impl Default for CoreOptions {
    fn default() -> Self {
        CoreOptions {
            burst: 32,
            rx_split: 4,
            idle: IdleStrategy::BusyPoll,
            defer_frees: true,
            stats_interval: 1024,
            tx_retry_limit: 16,
            tx_queue_limit: 65536,
            max_backlog: 4 << 20,
            shutdown_grace: Duration::from_secs(1),
            pin: true,
            clock: ClockSource::Std,
            rng_seed: None,
            slab: None,
            before_release: None,
            control: None,
        }
    }
}

/// The stack-wide receive-memory bound of a core's stack
/// (`StackConfig::rcv_mem_total`): what its devices' receive pools can spare
/// ([`Device::rx_mem_budget`], summed over the queues the core polls), so that
/// connections whose applications do not read cannot empty a pool the rings, ARP, ACKs
/// and every other connection need. A value the setup changed from the stack's default
/// is kept; so is the default when no device has a fixed pool (the in-memory link
/// receives into heap or slab buffers: the default, half of a default DPDK pool, stands
/// in for one). Never below the stack's minimum. `set`: the configuration gave it
/// (`tcp.rcv_mem_total`), kept as given even when it equals the default.
fn rcv_mem_total<D: Device>(cfg: &StackConfig, devices: &[D], set: bool) -> usize {
    if set || cfg.rcv_mem_total != luna_stack::stack::DEFAULT_RCV_MEM_TOTAL {
        return cfg.rcv_mem_total;
    }
    let budget = devices
        .iter()
        .filter_map(Device::rx_mem_budget)
        .fold(None, |sum: Option<usize>, b| {
            Some(sum.unwrap_or(0).saturating_add(b))
        });
    budget.map_or(cfg.rcv_mem_total, |b| {
        b.max(luna_stack::stack::MIN_RCV_MEM_TOTAL)
    })
}

/// Everything one core owns.
pub struct CoreSetup<D> {
    /// Index of the core in the runtime (also its zbuf core id).
    pub index: usize,
    /// CPU to pin to (when [`CoreOptions::pin`]).
    pub cpu: Option<usize>,
    /// The queue pair(s) the core polls; it transmits on the first.
    pub devices: Vec<D>,
    /// The stack's configuration.
    pub stack: StackConfig,
    /// Extra routes.
    pub routes: Vec<Route>,
    /// Static neighbours (the kernel owns ARP in LUNA's model; netlink-sync mirrors it).
    pub neighbours: Vec<(Ipv4Addr, EthernetAddress)>,
    /// This core's client ports (its partition of 61440–65535).
    pub ports: Vec<PortRange>,
    /// `stack.rcv_mem_total` was configured (`tcp.rcv_mem_total`): kept as it is, not
    /// derived from the receive pools.
    pub rcv_mem_total_set: bool,
}

impl<D> CoreSetup<D> {
    /// A core with `devices`, the stack config and the whole reserved range as its ports.
    pub fn new(index: usize, devices: Vec<D>, stack: StackConfig) -> Self {
        CoreSetup {
            index,
            cpu: None,
            devices,
            stack,
            routes: Vec::new(),
            neighbours: Vec::new(),
            ports: vec![PortRange::RESERVED],
            rcv_mem_total_set: false,
        }
    }
}

/// Why a core could not start or run.
#[derive(Debug)]
pub enum CoreError {
    /// The core has no device.
    NoDevice(usize),
    /// Pinning to the CPU failed.
    Pin {
        /// Core index.
        core: usize,
        /// CPU.
        cpu: usize,
    },
    /// The stack refused its configuration.
    Stack(luna_stack::stack::ConfigError),
    /// The zbuf core cache could not be registered.
    Slab(zbuf::SlabError),
    /// No CSPRNG seed.
    Seed(crate::rng::SeedError),
    /// A route or neighbour did not fit its table.
    TableFull,
    /// The core's thread panicked (a bug; the message is the panic payload).
    Panicked(String),
    /// The thread could not be spawned.
    Spawn(String),
    /// The control endpoint could not start (its message says why).
    Control(String),
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoreError::NoDevice(c) => write!(f, "core {c} has no device queue; give it at least one"),
            CoreError::Pin { core, cpu } => write!(
                f,
                "core {core}: cannot pin to CPU {cpu} (not in this process's affinity mask?); pick a CPU listed by `nproc --all` or set runtime.pin = false"
            ),
            CoreError::Stack(e) => write!(f, "stack configuration: {e}"),
            CoreError::Slab(e) => write!(f, "zbuf core cache: {e}"),
            CoreError::Seed(e) => write!(f, "{e}"),
            CoreError::TableFull => f.write_str("too many static routes or neighbours for the stack's tables"),
            CoreError::Panicked(m) => write!(f, "core thread panicked: {m}"),
            CoreError::Spawn(m) => write!(f, "cannot spawn core thread: {m}"),
            CoreError::Control(m) => write!(f, "control endpoint: {m}"),
        }
    }
}

impl std::error::Error for CoreError {}

/// What a core reports when it stops.
#[derive(Debug, Clone)]
pub struct CoreReport {
    /// Core index.
    pub index: usize,
    /// Final counters.
    pub stats: CoreStats,
    /// Device counters (summed over the core's queues).
    pub device: DeviceStats,
    /// The stack's counters.
    pub stack: luna_stack::stack::StackCounters,
    /// TCP counters summed over connections.
    pub tcp: luna_stack::tcp::ConnCounters,
}

struct Backlog {
    bufs: VecDeque<Zbuf>,
    bytes: usize,
    close: bool,
}

/// The device-independent state of a core, reached by applications through
/// [`crate::Ctx`] and [`crate::batch::Sockets`].
pub struct CoreState {
    pub(crate) index: usize,
    pub(crate) stack: Stack<CoreRng>,
    pub(crate) now: Instant,
    chooser: PortChooser,
    backlog: HashMap<Conn, Backlog, HandleHashing>,
    backlog_bytes: usize,
    /// Connections the application holds.
    pub(crate) open: HashSet<Conn, HandleHashing>,
    /// Connections closed by the application or at shutdown, until they finish.
    closing: Vec<Conn>,
    pub(crate) listeners: Vec<Listener>,
    pub(crate) stats: CoreStats,
    stop: Arc<AtomicBool>,
    pub(crate) stopping: bool,
    max_backlog: usize,
    cache: Option<CoreCache>,
    /// Connections whose end (of the stream, or the error that closed them) a `recv` of
    /// the application returned in the current inline dispatch pass: a repeated
    /// `Readable` in that pass says nothing new to them (see `inline::Coalesce`). At most
    /// [`ENDS_READ_MAX`] (beyond, a repeat is delivered, as before this existed).
    pub(crate) ends_read: Vec<Conn>,
}

/// See [`CoreState::ends_read`].
pub(crate) const ENDS_READ_MAX: usize = 64;

impl CoreState {
    /// Notes that a `recv` of `h` returned its end (inline mode's coalescing).
    pub(crate) fn note_end_read(&mut self, h: Conn) {
        if self.ends_read.len() < ENDS_READ_MAX && !self.ends_read.contains(&h) {
            self.ends_read.push(h);
        }
    }

    /// Open a connection to `remote` from a port of this core's partition that the NIC
    /// steers back to this core (see [`bifurcation::PortChooser`]).
    pub(crate) fn connect(&mut self, remote: SocketAddrV4) -> Result<Conn, ConnectError> {
        self.connect_from(None, remote)
    }

    /// [`CoreState::connect`] from the local address `local` (`None`: the route's source).
    pub(crate) fn connect_from(
        &mut self,
        local: Option<Ipv4Addr>,
        remote: SocketAddrV4,
    ) -> Result<Conn, ConnectError> {
        // The source the stack will use (the route's, or the next hop's subnet's).
        let local_ip = local.unwrap_or_else(|| {
            self.stack
                .source_address(*remote.ip())
                .unwrap_or_else(|| self.stack.ipv4())
        });
        let stack = &self.stack;
        let port = self.chooser.choose(local_ip, remote, |p| {
            stack.tuple_in_use(SocketAddrV4::new(local_ip, p), remote)
        });
        let port = match port {
            Ok(p) => p,
            Err(e) => {
                self.stats.connect_errors += 1;
                if e == ChooseError::NoPortForQueue {
                    self.stats.no_port_for_queue += 1;
                }
                return Err(ConnectError::PortsExhausted);
            }
        };
        let r = match local {
            Some(ip) => self.stack.connect_from(self.now, ip, remote, Some(port)),
            None => self.stack.connect(self.now, remote, Some(port)),
        };
        match r {
            Ok(h) => {
                self.open.insert(h);
                Ok(h)
            }
            Err(e) => {
                self.stats.connect_errors += 1;
                Err(e)
            }
        }
    }

    /// Listens on each `(port, backlog)` for a mode whose application cannot see a listen
    /// error (split and message mode): a port already in use is counted in
    /// `connect_errors` and skipped; the other modes report it to the caller.
    pub(crate) fn listen_all(&mut self, ports: &[(u16, usize)]) {
        for &(port, backlog) in ports {
            if self.listen(port, backlog).is_err() {
                self.stats.connect_errors += 1;
            }
        }
    }

    pub(crate) fn listen(&mut self, port: u16, backlog: usize) -> Result<Listener, ListenError> {
        let l = self.stack.listen(port, backlog)?;
        self.listeners.push(l);
        Ok(l)
    }

    pub(crate) fn unlisten(&mut self, l: Listener) {
        self.listeners.retain(|&x| x != l);
        self.stack.unlisten(l);
    }

    pub(crate) fn accept(&mut self, l: Listener) -> Option<Conn> {
        let h = self.stack.accept(l)?;
        self.open.insert(h);
        self.stats.accepted += 1;
        Some(h)
    }

    /// Send as much of `data` as the TCP send buffer takes now; returns the bytes taken.
    ///
    /// Bytes of an earlier [`CoreState::send_all`] still in the runtime's backlog go
    /// first: the backlog is pushed into the send buffer, and while any of it remains
    /// this answers `Err(WouldBlock)` and takes nothing, so the two sends never reorder
    /// bytes. After a deferred close (backlog marked `close`) it answers `Shutdown`.
    pub(crate) fn send(&mut self, h: Conn, data: &Zbuf) -> Result<usize, SendError> {
        // The emptiness check first: no hashing on the common path (no backlog at all).
        if !self.backlog.is_empty() && self.backlog.contains_key(&h) {
            self.flush_backlog(h);
            if let Some(b) = self.backlog.get(&h) {
                return Err(if b.close {
                    SendError::Shutdown
                } else {
                    SendError::WouldBlock
                });
            }
        }
        self.stack.send(h, data)
    }

    /// Free send-buffer space of `h` as [`CoreState::send`] sees it: 0 while the
    /// runtime's backlog holds bytes of `h`.
    pub(crate) fn send_capacity(&self, h: Conn) -> usize {
        if !self.backlog.is_empty() && self.backlog.contains_key(&h) {
            0
        } else {
            self.stack.send_capacity(h)
        }
    }

    /// [`CoreState::send_all`], or where it refuses `data` (the send buffer and the
    /// backlog cannot hold it whole now, or ever: a buffer bigger than both together)
    /// what the send buffer takes now; the rest comes back, to be offered again before
    /// anything later of `h`. So a buffer of any size goes out as the peer takes it.
    /// `Err`: the connection is gone or shut.
    pub(crate) fn send_or_part(&mut self, h: Conn, data: Zbuf) -> Result<Option<Zbuf>, SendError> {
        match self.send_all(h, data.clone()) {
            Ok(()) => Ok(None),
            Err(SendError::WouldBlock) => match self.send(h, &data) {
                Ok(n) if n == data.len() => Ok(None),
                Ok(n) => Ok(Some(data.slice(n..))),
                Err(SendError::WouldBlock) => Ok(Some(data)),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Bytes of `h` waiting in the runtime's backlog (beyond the TCP send buffer).
    pub(crate) fn backlog_len(&self, h: Conn) -> usize {
        if self.backlog.is_empty() {
            return 0;
        }
        self.backlog.get(&h).map_or(0, |b| b.bytes)
    }

    /// Queue all of `data`: what the TCP send buffer cannot take waits in the runtime's
    /// backlog (up to `max_backlog` bytes) and goes out as ACKs free space.
    pub(crate) fn send_all(&mut self, h: Conn, data: Zbuf) -> Result<(), SendError> {
        if data.is_empty() {
            return Ok(());
        }
        if let Some(b) = (!self.backlog.is_empty())
            .then(|| self.backlog.get_mut(&h))
            .flatten()
        {
            if b.close {
                return Err(SendError::Shutdown);
            }
            if b.bytes + data.len() > self.max_backlog {
                return Err(SendError::WouldBlock);
            }
            b.bytes += data.len();
            self.backlog_bytes += data.len();
            b.bufs.push_back(data);
            return Ok(());
        }
        // All or nothing: refuse what neither the send buffer nor the backlog can hold
        // (a buffer no larger than the backlog always fits: no capacity lookup).
        if data.len() > self.max_backlog
            && data.len() > self.stack.send_capacity(h) + self.max_backlog
        {
            return Err(SendError::WouldBlock);
        }
        // The buffer moves into the send queue (no reference taken and dropped).
        let rest = match self.stack.send_owned(h, data) {
            Ok((_, rest)) => rest,
            Err((SendError::WouldBlock, data)) => Some(data),
            Err((e, _)) => return Err(e),
        };
        if let Some(rest) = rest {
            self.backlog_bytes += rest.len();
            self.backlog.insert(
                h,
                Backlog {
                    bytes: rest.len(),
                    bufs: VecDeque::from([rest]),
                    close: false,
                },
            );
        }
        Ok(())
    }

    /// Push backlogged data into send buffers that have room; finish deferred closes.
    pub(crate) fn flush_backlogs(&mut self) {
        if self.backlog.is_empty() {
            return;
        }
        let CoreState {
            backlog,
            stack,
            backlog_bytes,
            closing,
            ..
        } = self;
        backlog.retain(|&h, b| flush_one(stack, backlog_bytes, closing, h, b));
    }

    /// [`CoreState::flush_backlogs`] for one connection.
    fn flush_backlog(&mut self, h: Conn) {
        let CoreState {
            backlog,
            stack,
            backlog_bytes,
            closing,
            ..
        } = self;
        if let Some(b) = backlog.get_mut(&h) {
            if !flush_one(stack, backlog_bytes, closing, h, b) {
                backlog.remove(&h);
            }
        }
    }

    /// Close gracefully once backlogged data is queued; the handle is released.
    pub(crate) fn close(&mut self, h: Conn) {
        self.open.remove(&h);
        match self.backlog.get_mut(&h) {
            Some(b) => b.close = true,
            None => {
                self.stack.close(h);
                self.closing.push(h);
            }
        }
    }

    pub(crate) fn abort(&mut self, h: Conn) {
        self.open.remove(&h);
        if let Some(b) = self.backlog.remove(&h) {
            self.backlog_bytes -= b.bytes;
        }
        self.stack.abort(h);
    }

    pub(crate) fn is_closing(&self, h: Conn) -> bool {
        self.backlog.get(&h).is_some_and(|b| b.close)
    }

    /// The stack reported the connection closed: forget it and release the handle.
    pub(crate) fn on_closed(&mut self, h: Conn) -> Option<CloseReason> {
        let reason = self.stack.close_reason(h);
        self.open.remove(&h);
        if let Some(b) = self.backlog.remove(&h) {
            self.backlog_bytes -= b.bytes;
        }
        self.stack.close(h);
        self.stats.closed += 1;
        reason
    }

    #[inline]
    pub(crate) fn recv(&mut self, h: Conn) -> Result<Option<Zbuf>, RecvError> {
        self.stack.recv(h)
    }

    pub(crate) fn alloc(&self, len: usize) -> Result<ZbufMut, AllocError> {
        match &self.cache {
            Some(c) => c.alloc(len),
            None => Ok(ZbufMut::heap(128, len)),
        }
    }

    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// This core's zbuf cache (message mode's virtual workers allocate on the I/O core).
    pub(crate) fn cache(&self) -> Option<&CoreCache> {
        self.cache.as_ref()
    }

    /// The runtime's stop flag.
    pub(crate) fn stop_flag(&self) -> &AtomicBool {
        &self.stop
    }

    pub(crate) fn stop_requested(&self) -> bool {
        self.stopping || self.stop.load(Ordering::Relaxed)
    }

    /// Start shutdown: stop listening, close every connection the application holds.
    fn begin_shutdown(&mut self) {
        self.stopping = true;
        for l in std::mem::take(&mut self.listeners) {
            self.stack.unlisten(l);
        }
        let open: Vec<Conn> = self.open.iter().copied().collect();
        for h in open {
            self.close(h);
        }
    }

    /// Forget closed connections that have finished (reclaimed, closed or in TIME-WAIT).
    fn prune_closing(&mut self) {
        let stack = &self.stack;
        self.closing.retain(|&h| {
            !matches!(
                stack.state(h),
                None | Some(State::Closed) | Some(State::TimeWait)
            )
        });
    }

    fn closing_done(&mut self) -> bool {
        self.prune_closing();
        self.closing.is_empty() && self.backlog.is_empty() && self.open.is_empty()
    }

    fn abort_all(&mut self) {
        let mut hs: Vec<Conn> = self
            .closing
            .drain(..)
            .chain(self.open.iter().copied())
            .chain(self.backlog.keys().copied())
            .collect();
        // A connection can be in all three (open, closing with bytes still backlogged):
        // one abort, one count each.
        hs.sort_unstable();
        hs.dedup();
        for h in hs {
            self.stats.shutdown_aborts += 1;
            self.abort(h);
        }
    }
}

/// Moves `b`'s bytes into `h`'s send buffer while it has room (a deferred close follows
/// the last byte); returns whether anything is left in the backlog.
fn flush_one(
    stack: &mut Stack<CoreRng>,
    backlog_bytes: &mut usize,
    closing: &mut Vec<Conn>,
    h: Conn,
    b: &mut Backlog,
) -> bool {
    while let Some(front) = b.bufs.front_mut() {
        match stack.send(h, front) {
            Ok(n) if n == front.len() => {
                b.bytes -= n;
                *backlog_bytes -= n;
                b.bufs.pop_front();
            }
            Ok(n) => {
                front.advance(n);
                b.bytes -= n;
                *backlog_bytes -= n;
                return true;
            }
            Err(SendError::WouldBlock) => return true,
            Err(_) => {
                // The connection is gone: nothing will ever take this data.
                *backlog_bytes -= b.bytes;
                return false;
            }
        }
    }
    if b.close {
        stack.close(h);
        closing.push(h);
    }
    false
}

/// Pin the calling thread to `cpu`; `false` if the CPU is not one this process may use.
pub(crate) fn pin_to(cpu: usize) -> bool {
    // core_affinity's CPU_SET asserts on ids past the mask size: check membership first.
    let allowed = core_affinity::get_core_ids().unwrap_or_default();
    allowed.iter().any(|c| c.id == cpu)
        && core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
}

/// How a mode plugs into the loop.
pub(crate) trait Mode {
    /// Once, before the first iteration.
    fn start(&mut self, st: &mut CoreState);
    /// Once per iteration after timers: events and application work. Returns whether
    /// anything was done.
    fn iteration(&mut self, st: &mut CoreState) -> bool;
    /// When shutdown begins, before connections are closed.
    fn stop(&mut self, st: &mut CoreState);
    /// After `stop`, every iteration until it says yes (for at most half the shutdown
    /// grace): whether the work the mode took before the stop is done, so connections
    /// may be closed (split mode: replies its workers were computing).
    fn settled(&mut self, _st: &mut CoreState) -> bool {
        true
    }
    /// The `Backoff` idle strategy's sleep of `d`; returns the nanoseconds it chose to
    /// sleep (credited to the loop-stall stats). A mode whose work comes from other
    /// threads sleeps on a doorbell they ring ([`wakeable_sleep`]).
    fn sleep(&mut self, d: Duration) -> u64 {
        wakeable_sleep(None, d, || false)
    }
}

/// [`Mode::sleep`] on `sleeper`: up to `d`, unless `pending()` (asked after the core
/// announced it is about to sleep: it must see every ring the doorbell's producers
/// publish) finds work, or a producer rings. Returns the nanoseconds it chose to
/// sleep: what passed, up to `d` (so only an overshoot counts as a loop stall), 0 when
/// the re-check found work. Without a sleeper, a plain sleep of `d` (all of it chosen).
pub(crate) fn wakeable_sleep(
    sleeper: Option<&mut msgsched::doorbell::Sleeper>,
    d: Duration,
    pending: impl FnOnce() -> bool,
) -> u64 {
    use msgsched::doorbell::Slept;
    let Some(sleeper) = sleeper else {
        std::thread::sleep(d);
        return u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    };
    let start = std::time::Instant::now();
    let slept = match sleeper.sleep(d, pending) {
        Slept::Declined => Duration::ZERO,
        Slept::TimedOut | Slept::Woken => start.elapsed().min(d),
    };
    u64::try_from(slept.as_nanos()).unwrap_or(u64::MAX)
}

/// A doorbell's sleeping end for a mode whose workers hand the core work, when the core
/// sleeps when idle (`Backoff`); the producers ring [`bell_of`] it. `None` for the
/// strategies that never sleep (nothing to ring, and the workers skip the ring).
pub(crate) fn doorbell_for(idle: IdleStrategy) -> Option<msgsched::doorbell::Sleeper> {
    matches!(idle, IdleStrategy::Backoff { .. }).then(|| msgsched::doorbell::doorbell().1)
}

/// The producers' end of `sleeper`'s doorbell (`None` without one).
pub(crate) fn bell_of(
    sleeper: &Option<msgsched::doorbell::Sleeper>,
) -> Option<msgsched::socket::Bell> {
    sleeper
        .as_ref()
        .map(|s| msgsched::socket::Bell::clone(s.doorbell()))
}

/// Shared with the runtime handle.
pub(crate) struct Shared {
    pub stop: Arc<AtomicBool>,
    pub cell: Arc<StatsCell>,
    pub probe: Arc<crate::control::Probe>,
}

pub(crate) struct CoreLoop<D: Device> {
    pub st: CoreState,
    devices: Vec<D>,
    clock: CoreClock,
    rx: Vec<Zbuf>,
    tx: VecDeque<Transmit>,
    tx_stalled: u32,
    opts: CoreOptions,
    cell: Arc<StatsCell>,
    idle_streak: u32,
    table_changes: Vec<crate::device::TableChange>,
    /// The first device mirrors the kernel's tables (asked once at start).
    mirrors_tables: bool,
    /// The control endpoint's mailbox (looked at when stats are published).
    probe: Arc<crate::control::Probe>,
    /// On while `lunactl capture` runs on this core's port.
    capture: Option<crate::capture::CoreCapture>,
}

impl<D: Device> CoreLoop<D> {
    /// Build the core on its own thread (the zbuf cache is tied to it).
    pub fn new(setup: CoreSetup<D>, opts: &CoreOptions, shared: Shared) -> Result<Self, CoreError> {
        if setup.devices.is_empty() {
            return Err(CoreError::NoDevice(setup.index));
        }
        if let (true, Some(cpu)) = (opts.pin, setup.cpu) {
            if !crate::core::pin_to(cpu) {
                return Err(CoreError::Pin {
                    core: setup.index,
                    cpu,
                });
            }
        }
        let mut setup = setup;
        for d in &mut setup.devices {
            d.on_core_thread();
        }
        let cache = match &opts.slab {
            Some(s) => Some(s.core_cache(setup.index).map_err(CoreError::Slab)?),
            None => None,
        };
        let mut rng = match opts.rng_seed {
            Some(mut seed) => {
                // Distinct streams per core from one test seed.
                seed[0] ^= setup.index as u8;
                seed[1] ^= (setup.index >> 8) as u8;
                CoreRng::from_seed(seed)
            }
            None => CoreRng::from_os().map_err(CoreError::Seed)?,
        };
        // The port search's random start (RFC 6056: unpredictable ports), drawn before the stack takes
        // the generator: reproducible under `rng_seed`.
        let port_start = luna_stack::context::Rng::next_u32(&mut rng);
        let mut stack_cfg = setup.stack;
        stack_cfg.rcv_mem_total =
            rcv_mem_total(&stack_cfg, &setup.devices, setup.rcv_mem_total_set);
        let mut stack = Stack::new(stack_cfg, rng).map_err(CoreError::Stack)?;
        for r in setup.routes {
            stack
                .routes_mut()
                .insert(r)
                .map_err(|_| CoreError::TableFull)?;
        }
        for (ip, mac) in setup.neighbours {
            stack
                .neighbours_mut()
                .insert_permanent(ip, mac)
                .map_err(|_| CoreError::TableFull)?;
        }
        let steering = setup.devices[0].rss().map(|rss| Steering {
            rss,
            queues: setup.devices.iter().map(Device::queue).collect(),
        });
        let mut chooser = PortChooser::new(&setup.ports, steering);
        chooser.start_at(port_start);
        let mut clock = CoreClock::new(opts.clock.clone());
        let st = CoreState {
            index: setup.index,
            now: clock.now(),
            stack,
            chooser,
            backlog: HashMap::default(),
            backlog_bytes: 0,
            open: HashSet::default(),
            closing: Vec::new(),
            listeners: Vec::new(),
            stats: CoreStats::default(),
            stop: shared.stop,
            stopping: false,
            max_backlog: opts.max_backlog,
            cache,
            ends_read: Vec::new(),
        };
        let mirrors_tables = setup.devices.first().is_some_and(|d| d.mirrors_tables());
        Ok(CoreLoop {
            st,
            devices: setup.devices,
            clock,
            rx: Vec::with_capacity(opts.burst),
            tx: VecDeque::new(),
            tx_stalled: 0,
            opts: opts.clone(),
            cell: shared.cell,
            idle_streak: 0,
            table_changes: Vec::new(),
            mirrors_tables,
            probe: shared.probe,
            capture: None,
        })
    }

    /// Run until stopped and drained; returns the final report.
    pub fn run<M: Mode>(mut self, mode: &mut M) -> CoreReport {
        mode.start(&mut self.st);
        let mut deadline = None;
        // Until when the mode may finish, after a stop, the work it took before it.
        let mut settle = None;
        let mut publish_in = self.opts.stats_interval.max(1);
        let mut publish_by = self.clock.now().as_nanos() + PUBLISH_MAX_AGE_NS;
        // The previous iteration's clock reading (ns), for the loop-stall stats.
        let mut last = self.clock.now().as_nanos();
        loop {
            self.st.now = self.clock.now();
            // Loop stalls, from the reading every iteration makes anyway: a subtract and
            // a compare (`record_loop_gap` is out of line).
            let t = self.st.now.as_nanos();
            let gap = t.saturating_sub(last);
            last = t;
            if gap >= LOOP_GAP_MIN_NS {
                self.st.stats.record_loop_gap(gap);
            }
            let busy = self.poll_once(mode);
            let now = self.st.now;
            if deadline.is_none() && self.st.stop.load(Ordering::Acquire) {
                mode.stop(&mut self.st);
                deadline = Some(now + self.opts.shutdown_grace);
                settle = Some(now + self.opts.shutdown_grace / 2);
            }
            if let Some(s) = settle {
                if now >= s || mode.settled(&mut self.st) {
                    self.st.begin_shutdown();
                    settle = None;
                }
            }
            if let (Some(d), None) = (deadline, settle) {
                // Done once every connection has finished and what they owe the wire is
                // out: the stack's frames too, not only the queue's. A close that resets
                // (unread data) or an unlisten leaves a connection CLOSED at once with its
                // RST still in the stack, and a full queue (`tx_queue_limit`) leaves
                // frames there; stopping on an empty queue alone lost them.
                let drained =
                    self.st.closing_done() && self.tx.is_empty() && !self.st.stack.may_transmit();
                if drained || now >= d {
                    if !drained {
                        self.reset_remaining();
                    }
                    break;
                }
            }
            // A countdown instead of `iterations % stats_interval` (a 64-bit division).
            publish_in -= 1;
            if publish_in == 0 || t >= publish_by {
                publish_in = self.opts.stats_interval.max(1);
                publish_by = t + PUBLISH_MAX_AGE_NS;
                self.publish(false);
                if self.probe.pending() {
                    crate::control::serve_core(
                        &self.probe,
                        &self.st,
                        &self.devices,
                        &mut self.capture,
                    );
                }
            }
            if busy {
                self.idle_streak = 0;
            } else {
                self.st.stats.idle_iterations += 1;
                // A chosen sleep is not a stall: only its overshoot counts.
                last = last.saturating_add(self.idle(mode));
            }
        }
        self.publish(true);
        self.probe.retire();
        self.capture = None;
        if let Some(hook) = &self.opts.before_release {
            (hook.0)(self.st.index);
        }
        let mut device = DeviceStats::default();
        for d in &self.devices {
            let s = d.stats();
            device.rx_frames += s.rx_frames;
            device.rx_bytes += s.rx_bytes;
            device.tx_frames += s.tx_frames;
            device.tx_bytes += s.tx_bytes;
            device.tx_dropped += s.tx_dropped;
            device.rx_missed += s.rx_missed;
            device.copied_bytes += s.copied_bytes;
            device.tx_unsent += s.tx_unsent;
        }
        CoreReport {
            index: self.st.index,
            stats: self.st.stats,
            device,
            stack: self.st.stack.counters().clone(),
            tcp: self.st.stack.tcp_counters(),
        }
    }

    /// One iteration: rx burst -> stack (+ inline callbacks) -> timers -> application ->
    /// backlog -> poll_transmit -> tx burst.
    fn poll_once<M: Mode>(&mut self, mode: &mut M) -> bool {
        self.st.stats.iterations += 1;
        // Feature `phases`: the clock at each phase's end (`CoreStats::phase_*`); the
        // iteration began at `st.now`. Without the feature `mark!` is nothing.
        #[cfg(feature = "phases")]
        let mut marks = [self.st.now.as_nanos(); 6];
        #[cfg(feature = "phases")]
        let mut spent = [0u64; 5];
        #[cfg(feature = "phases")]
        macro_rules! mark {
            ($i:expr) => {
                marks[$i] = self.clock.now().as_nanos()
            };
        }
        #[cfg(not(feature = "phases"))]
        macro_rules! mark {
            ($i:expr) => {};
        }
        if self.mirrors_tables {
            self.apply_table_changes();
        }
        let burst = self.opts.burst;
        for d in &mut self.devices {
            if self.rx.len() >= burst {
                break;
            }
            let room = burst - self.rx.len();
            d.rx_burst(&mut self.rx, room);
        }
        let received = self.rx.len();
        // The burst's buffers the iteration releases go back to their pool after its
        // transmit burst, below (this thread only; the scope frees them when dropped).
        let frees = (received > 0 && self.opts.defer_frees).then(zbuf::dpdk::defer_mbuf_frees);
        mark!(1);
        // An empty burst skips capture and the drain (the drain's construction and drop
        // cost ~26 instructions per idle iteration, measured with callgrind).
        if received > 0 {
            if let Some(c) = &mut self.capture {
                c.on_rx(self.st.now.as_nanos(), &self.rx);
            }
            self.st.stats.rx_frames += received as u64;
            self.st.stats.rx_bytes += self.rx.iter().map(|f| f.len() as u64).sum::<u64>();
        }
        // A burst of more than `rx_split` frames is handled in two halves, the first
        // half's replies sent before the second half's input: one burst that takes a
        // pipelined peer's whole window would otherwise answer it whole, and the two sides
        // would fall into lock-step, each idle while the other works (docs/benchmarks.md,
        // "Receive bursts and lock-step").
        let part = rx_split_first(received, self.opts.rx_split);
        let mut worked = false;
        let mut sent = 0;
        // Whether the device was offered frames (in either half): one try of the
        // iteration for `tx_retry_limit` and `tx_retries`, counted after the last half.
        let mut tried = false;
        loop {
            if !self.rx.is_empty() {
                // One call for the part: the stack coalesces a connection's consecutive
                // in-order segments into one pass of its input (`Stack::handle_frames`).
                let n = part.min(self.rx.len());
                self.st.stack.handle_frames(self.st.now, self.rx.drain(..n));
            }
            // Timers once the whole burst is in, as when it is read whole: a deadline
            // due now must see the input already received (an ACK in the second half
            // makes a retransmission or a probe due after the first half moot).
            if self.rx.is_empty()
                && self
                    .st
                    .stack
                    .poll_timeout()
                    .is_some_and(|t| t <= self.st.now)
            {
                self.st.stack.handle_timeouts(self.st.now);
            }
            mark!(2);
            worked |= mode.iteration(&mut self.st);
            mark!(3);
            // The empty checks stay here, inline: called, each cost ~20 instructions per
            // idle iteration.
            if !self.st.backlog.is_empty() {
                self.st.flush_backlogs();
            }
            if self.st.stack.may_transmit() {
                if self.rx.is_empty() {
                    self.drain_stack_tx();
                } else {
                    // The first half: its replies go now; an ACK waits to cover the
                    // second half too (one per burst, as if it were read whole).
                    self.st.stack.hold_acks();
                    self.drain_stack_tx();
                    self.st.stack.release_acks();
                }
            }
            mark!(4);
            if !self.tx.is_empty() {
                tried = true;
                sent += self.offer_tx();
            }
            mark!(5);
            #[cfg(feature = "phases")]
            crate::stats::add_phases(&mut spent, &marks);
            if self.rx.is_empty() {
                break;
            }
            // The second half's input starts where the first half ended.
            #[cfg(feature = "phases")]
            {
                marks[0] = marks[5];
                marks[1] = marks[5];
            }
        }
        if tried {
            self.tx_tried(sent);
        }
        drop(frees);
        #[cfg(feature = "phases")]
        if received > 0 && sent > 0 {
            self.st.stats.record_phases(&spent);
        }
        received > 0 || sent > 0 || worked || !self.tx.is_empty()
    }

    /// The kernel's table changes (netlink-sync through the exception device) into the
    /// stack: neighbours (connections parked on a next hop that resolved are woken at
    /// once), routes (the kernel's table replaces the configured one; connections move
    /// to a changed next hop) and addresses (added to and removed from the stack's local
    /// set, aborting the connections of a removed one; the configured primary stays).
    fn apply_table_changes(&mut self) {
        use crate::device::TableChange;
        self.devices[0].table_changes(&mut self.table_changes);
        if self.table_changes.is_empty() {
            return;
        }
        let me = self.st.stack.ipv4();
        let mut routes_changed = false;
        for change in self.table_changes.drain(..) {
            match change {
                TableChange::NeighbourSet { ip, mac } => {
                    if self.st.stack.neighbour_resolved(ip, mac).is_err() {
                        self.st.stats.exc_neighbour_table_full += 1;
                    }
                }
                TableChange::NeighbourRemoved(ip) => self.st.stack.neighbour_removed(ip),
                TableChange::RoutesCleared => {
                    self.st.stack.routes_mut().clear();
                    routes_changed = true;
                }
                TableChange::RouteAdded(mut r) | TableChange::RouteReplaced(mut r) => {
                    // The route keeps the kernel's source (prefsrc, or the address on the
                    // next hop's subnet); the stack falls back by itself when that is not
                    // one of its addresses. One port.
                    r.interface = 0;
                    if self.st.stack.routes_mut().insert(r).is_err() {
                        self.st.stats.exc_route_table_full += 1;
                    }
                    routes_changed = true;
                }
                TableChange::RouteRemoved(dst) => {
                    self.st.stack.routes_mut().remove(dst);
                    routes_changed = true;
                }
                TableChange::AddressAdded(a) => {
                    if a.address == me {
                        self.st.stats.exc_address_missing = 0;
                        continue;
                    }
                    let added = luna_stack::wire::Ipv4Cidr::new(a.address, a.prefix_len)
                        .ok()
                        .map(|c| self.st.stack.add_address(c));
                    if !matches!(added, Some(Ok(_))) {
                        self.st.stats.exc_address_refused += 1;
                    }
                }
                TableChange::AddressRemoved(a) => {
                    if a.address == me {
                        // The kernel no longer owns luna's address: luna keeps using it
                        // (the primary address is the configuration's; its connections
                        // go on); say so.
                        self.st.stats.exc_address_missing = 1;
                        continue;
                    }
                    // Its connections are aborted (luna_stack's `remove_address`); an
                    // address the stack had refused is not there to remove.
                    if let Ok(n) = self.st.stack.remove_address(self.st.now, a.address) {
                        self.st.stats.exc_address_aborts += n as u64;
                    }
                }
                TableChange::Version(_) => {}
            }
        }
        if routes_changed {
            self.st.stats.exc_rerouted += self.st.stack.routes_changed() as u64;
        }
    }

    fn drain_stack_tx(&mut self) {
        // A full queue stops the polling: what the stack has not emitted yet stays in
        // it (connections stay dirty) until the device drains the queue, instead of
        // being emitted and dropped. (5,000 connections closing at once are 5,000 FINs.)
        while self.tx.len() < self.opts.tx_queue_limit {
            match self.st.stack.poll_transmit(self.st.now) {
                Some(t) => self.tx.push_back(t),
                None => break,
            }
        }
    }

    /// The shutdown grace ran out: reset every connection still open. What waits in the
    /// transmit queue (up to `tx_queue_limit` frames of connections about to be reset) is
    /// dropped first, so the resets are polled and sent, as far as the device takes
    /// them within a bounded number of tries.
    fn reset_remaining(&mut self) {
        /// Tries in which the device takes nothing before the resets are given up.
        const SHUTDOWN_TX_TRIES: u32 = 10_000;
        self.drop_tx_front(self.tx.len());
        self.st.abort_all();
        let mut refused = 0;
        while refused < SHUTDOWN_TX_TRIES {
            self.drain_stack_tx();
            if self.tx.is_empty() {
                break;
            }
            if self.transmit() == 0 {
                refused += 1;
                std::hint::spin_loop();
            }
        }
    }

    /// Drops the first `n` queued frames (and their capture copies), counted.
    fn drop_tx_front(&mut self, n: usize) {
        self.st.stats.tx_dropped += n as u64;
        self.tx.drain(..n);
        if let Some(c) = &mut self.capture {
            c.discard_tx_front(n);
        }
    }

    fn transmit(&mut self) -> usize {
        if self.tx.is_empty() {
            return 0;
        }
        let sent = self.offer_tx();
        self.tx_tried(sent);
        sent
    }

    /// [`transmit`](Self::transmit)'s offer of the queue to the device, without the
    /// retry bookkeeping ([`tx_tried`](Self::tx_tried)): a burst handled in two halves
    /// offers it twice in one iteration, one try.
    fn offer_tx(&mut self) -> usize {
        if let Some(c) = &mut self.capture {
            c.stage_tx(self.st.now.as_nanos(), &self.tx);
        }
        // The first queue only: a frame its ring refuses waits for it. Another queue of
        // the port is another ring the NIC drains on its own, and a connection's later
        // frames handed to it could leave before the ones still in the first ring.
        let sent = self.devices[0].tx_burst(&mut self.tx);
        if let Some(c) = &mut self.capture {
            c.commit_tx(sent);
        }
        self.st.stats.tx_frames += sent as u64;
        sent
    }

    /// After an iteration's try (one or two offers of the queue that took `sent` frames
    /// in all): what is left waits for the next iteration, but not forever.
    fn tx_tried(&mut self, sent: usize) {
        if self.tx.is_empty() {
            self.tx_stalled = 0;
        } else {
            // The ring is full: retry next iteration, but not forever. Only tries that
            // send nothing in a row count: with a standing queue (5,000 connections) the
            // queue is never empty, and counting every refusal since it last was dropped
            // it whole once they added up, whatever the ring took in between.
            self.st.stats.tx_retries += 1;
            if sent == 0 {
                self.tx_stalled += 1;
            } else {
                self.tx_stalled = 0;
            }
            if self.tx_stalled > self.opts.tx_retry_limit {
                // One burst from the head, then the next frames get the same tries (a
                // queue of up to a burst is dropped whole, as it always was).
                self.drop_tx_front(self.tx.len().min(self.opts.burst.max(1)));
                self.tx_stalled = 0;
            }
        }
    }

    /// Waits as the idle strategy says; returns the nanoseconds it chose to sleep.
    fn idle<M: Mode>(&mut self, mode: &mut M) -> u64 {
        match self.opts.idle {
            IdleStrategy::BusyPoll => std::hint::spin_loop(),
            // A yield that takes long is a stall (another thread had the CPU).
            IdleStrategy::Yield => std::thread::yield_now(),
            IdleStrategy::Backoff { max } => {
                self.idle_streak = self.idle_streak.saturating_add(1);
                let mut d = Duration::from_micros(1u64 << self.idle_streak.min(20)).min(max);
                if let Some(t) = self.st.stack.poll_timeout() {
                    d = d.min(t.saturating_duration_since(self.st.now));
                }
                if !d.is_zero() {
                    return mode.sleep(d);
                }
            }
        }
        0
    }

    fn publish(&mut self, stopped: bool) {
        let s = &mut self.st.stats;
        s.open_connections = self.st.open.len() as u64;
        s.backlog_bytes = self.st.backlog_bytes as u64;
        s.stack_drops = self.st.stack.counters().total_drops();
        s.published_at_ns = self.st.now.as_nanos();
        s.stopped = u64::from(stopped);
        for d in &mut self.devices {
            d.maintain();
        }
        let (mut missed, mut copied, mut tx_bytes) = (0, 0, 0);
        for d in &self.devices {
            let ds = d.stats();
            missed += ds.rx_missed;
            copied += ds.copied_bytes;
            tx_bytes += ds.tx_bytes;
        }
        s.rx_missed = missed;
        s.copied_bytes = copied;
        let mut e = crate::exception::ExceptionStats::default();
        for x in self.devices.iter().filter_map(Device::exception) {
            e.luna += x.luna;
            e.to_kernel += x.to_kernel;
            e.to_kernel_dropped += x.to_kernel_dropped;
            e.from_kernel += x.from_kernel;
            e.from_kernel_dropped += x.from_kernel_dropped;
            e.malformed_dropped += x.malformed_dropped;
            e.not_for_us += x.not_for_us;
            e.arp_suppressed += x.arp_suppressed;
            e.nudges += x.nudges;
            e.neighbours_added += x.neighbours_added;
            e.neighbours_removed += x.neighbours_removed;
            e.interface_gone |= x.interface_gone;
            e.table_version = e.table_version.max(x.table_version);
            e.routes_added += x.routes_added;
            e.routes_replaced += x.routes_replaced;
            e.routes_removed += x.routes_removed;
            e.addresses_added += x.addresses_added;
            e.addresses_removed += x.addresses_removed;
            e.sync_resyncs = e.sync_resyncs.max(x.sync_resyncs);
            e.sync_overruns = e.sync_overruns.max(x.sync_overruns);
            e.sync_malformed = e.sync_malformed.max(x.sync_malformed);
        }
        s.exc_luna = e.luna;
        s.exc_to_kernel = e.to_kernel;
        s.exc_to_kernel_dropped = e.to_kernel_dropped;
        s.exc_from_kernel = e.from_kernel;
        s.exc_from_kernel_dropped = e.from_kernel_dropped;
        s.exc_malformed_dropped = e.malformed_dropped;
        s.exc_not_for_us = e.not_for_us;
        s.exc_arp_suppressed = e.arp_suppressed;
        s.exc_nudges = e.nudges;
        s.exc_neighbours_added = e.neighbours_added;
        s.exc_neighbours_removed = e.neighbours_removed;
        s.exc_interface_gone = e.interface_gone;
        s.exc_table_version = e.table_version;
        s.exc_routes_added = e.routes_added;
        s.exc_routes_replaced = e.routes_replaced;
        s.exc_routes_removed = e.routes_removed;
        s.exc_addresses_added = e.addresses_added;
        s.exc_addresses_removed = e.addresses_removed;
        s.exc_sync_resyncs = e.sync_resyncs;
        s.exc_sync_overruns = e.sync_overruns;
        s.exc_sync_malformed = e.sync_malformed;
        s.exc_addresses = self.st.stack.addresses().len() as u64;
        let steering = self.devices.iter().filter_map(Device::steering);
        let (hw, fell_back) =
            steering.fold((0, 0), |(h, f), st| (h.max(st.hw()), f.max(st.fallbacks())));
        s.steering_hw = hw;
        s.steering_fallbacks = fell_back;
        s.tx_bytes = tx_bytes;
        // The stack's running total: summing every connection's counters here cost a walk
        // over all of them per publish (at 5,000 connections, tens of µs of a stalled loop).
        s.retransmits = self.st.stack.counters().tcp_retransmits;
        self.cell.publish(s);
        self.st.prune_closing();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A ring its peer drains slowly: takes one frame on every other call (none when
    /// `stuck`).
    struct Trickle {
        calls: u32,
        stuck: bool,
        /// Frames taken.
        taken: usize,
        /// Frames each receive burst brings (noise: zeros the stack drops).
        noise: usize,
    }

    impl Device for Trickle {
        fn rx_burst(&mut self, out: &mut Vec<Zbuf>, max: usize) -> usize {
            let n = self.noise.min(max);
            out.extend((0..n).map(|_| Zbuf::copy_from_slice(&[0u8; 60])));
            n
        }

        fn tx_burst(&mut self, frames: &mut VecDeque<Transmit>) -> usize {
            self.calls += 1;
            let n = usize::from(!self.stuck && self.calls % 2 == 0 && frames.pop_front().is_some());
            self.taken += n;
            n
        }

        fn mac(&self) -> EthernetAddress {
            EthernetAddress([2, 0, 0, 0, 0, 1])
        }

        fn stats(&self) -> DeviceStats {
            DeviceStats::default()
        }
    }

    const TRICKLE_PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    /// A queue of a fixed receive pool ([`Device::rx_mem_budget`]), or none (also the
    /// message mode's tests).
    pub(crate) struct Pooled(pub(crate) Option<usize>);

    impl Device for Pooled {
        fn rx_burst(&mut self, _out: &mut Vec<Zbuf>, _max: usize) -> usize {
            0
        }

        fn tx_burst(&mut self, _frames: &mut VecDeque<Transmit>) -> usize {
            0
        }

        fn mac(&self) -> EthernetAddress {
            EthernetAddress([2, 0, 0, 0, 0, 1])
        }

        fn stats(&self) -> DeviceStats {
            DeviceStats::default()
        }

        fn rx_mem_budget(&self) -> Option<usize> {
            self.0
        }
    }

    /// A core's stack gets the sum of its queues' budgets, not below the stack's
    /// minimum; the default stays for devices without a fixed pool, and a value the
    /// setup chose stays whatever the devices say.
    #[test]
    fn the_stacks_receive_memory_bound_comes_from_the_devices_pools() {
        use luna_stack::stack::{DEFAULT_RCV_MEM_TOTAL, MIN_RCV_MEM_TOTAL};
        let cidr = luna_stack::wire::Ipv4Cidr::new(Ipv4Addr::new(10, 0, 0, 1), 24).unwrap();
        let mut cfg = StackConfig::new(EthernetAddress([2, 0, 0, 0, 0, 1]), cidr);
        let two = [Pooled(Some(3 << 20)), Pooled(Some(1 << 20))];
        assert_eq!(rcv_mem_total(&cfg, &two, false), 4 << 20);
        assert_eq!(
            rcv_mem_total(&cfg, &[Pooled(None)], false),
            DEFAULT_RCV_MEM_TOTAL
        );
        assert_eq!(
            rcv_mem_total(&cfg, &[Pooled(Some(1000))], false),
            MIN_RCV_MEM_TOTAL
        );
        // Configured (`tcp.rcv_mem_total`): kept, even when it is the default's value.
        assert_eq!(rcv_mem_total(&cfg, &two, true), DEFAULT_RCV_MEM_TOTAL);
        cfg.rcv_mem_total = 1 << 30;
        assert_eq!(rcv_mem_total(&cfg, &two, false), 1 << 30);
    }

    /// A core on one [`Trickle`] ring (`stuck`: it takes nothing) with `opts`, and one SYN
    /// queued for the ring for each of `n` connections to [`TRICKLE_PEER`].
    fn trickle_core(stuck: bool, opts: CoreOptions, n: usize) -> CoreLoop<Trickle> {
        trickle_queues_core(1, stuck, opts, n)
    }

    /// [`trickle_core`] with `queues` [`Trickle`] rings.
    fn trickle_queues_core(
        queues: usize,
        stuck: bool,
        opts: CoreOptions,
        n: usize,
    ) -> CoreLoop<Trickle> {
        let me = Ipv4Addr::new(10, 0, 0, 1);
        let cidr = luna_stack::wire::Ipv4Cidr::new(me, 24).unwrap();
        let mut setup = CoreSetup::new(
            0,
            (0..queues)
                .map(|_| Trickle {
                    calls: 0,
                    stuck,
                    taken: 0,
                    noise: 0,
                })
                .collect(),
            StackConfig::new(EthernetAddress([2, 0, 0, 0, 0, 1]), cidr),
        );
        setup.neighbours = vec![(TRICKLE_PEER, EthernetAddress([2, 0, 0, 0, 0, 2]))];
        let mut lp = test_core(setup, opts);
        for _ in 0..n {
            lp.st.connect(SocketAddrV4::new(TRICKLE_PEER, 80)).unwrap();
        }
        lp.drain_stack_tx();
        assert_eq!(lp.tx.len(), n, "one SYN each");
        lp
    }

    /// A core loop for tests: unpinned, a fixed RNG seed, its own stop flag and stats.
    fn test_core<D: Device>(setup: CoreSetup<D>, opts: CoreOptions) -> CoreLoop<D> {
        let shared = Shared {
            stop: Arc::new(AtomicBool::new(false)),
            cell: Arc::new(StatsCell::default()),
            probe: Arc::new(crate::control::Probe::default()),
        };
        let opts = CoreOptions {
            pin: false,
            rng_seed: Some([7; 32]),
            ..opts
        };
        CoreLoop::new(setup, &opts, shared).unwrap()
    }

    /// An echo server for the receive-split test: sends back what it reads.
    struct EchoAll;

    impl crate::inline::InlineApp for EchoAll {
        fn on_start(&mut self, ctx: &mut crate::Ctx<'_>) {
            ctx.listen(7, 16).unwrap();
        }
        fn on_readable(&mut self, ctx: &mut crate::Ctx<'_>, conn: Conn) {
            while let Ok(Some(b)) = ctx.recv(conn) {
                ctx.send_all(conn, b).unwrap();
            }
        }
    }

    /// A server core running [`EchoAll`] on one in-memory port (`rx_split` as given), a
    /// client stack on the other side, and one connection between them, established.
    struct EchoPair {
        lp: CoreLoop<crate::device::mem::MemDevice>,
        mode: crate::inline::InlineMode<EchoAll>,
        cli: luna_stack::stack::Stack<CoreRng>,
        /// The client's end of the wire.
        wire: crate::device::mem::MemDevice,
        c: SocketHandle,
    }

    impl EchoPair {
        fn new(rx_split: usize) -> EchoPair {
            use crate::device::mem::MemPair;
            use crate::inline::InlineMode;
            let (srv_ip, cli_ip) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
            let (dev, wire) = MemPair::single();
            let (srv_mac, cli_mac) = (dev.mac(), wire.mac());
            let cidr = |ip| luna_stack::wire::Ipv4Cidr::new(ip, 24).unwrap();
            let mut setup = CoreSetup::new(0, vec![dev], StackConfig::new(srv_mac, cidr(srv_ip)));
            setup.neighbours = vec![(cli_ip, cli_mac)];
            let opts = CoreOptions {
                rx_split,
                ..CoreOptions::default()
            };
            let mut lp = test_core(setup, opts.clone());
            let mut mode = InlineMode::new(EchoAll, opts.burst);
            mode.start(&mut lp.st);
            let mut cli = luna_stack::stack::Stack::new(
                StackConfig::new(cli_mac, cidr(cli_ip)),
                CoreRng::from_seed([9; 32]),
            )
            .unwrap();
            cli.neighbour_resolved(srv_ip, srv_mac).unwrap();
            let now = lp.st.now;
            let c = cli
                .connect(now, SocketAddrV4::new(srv_ip, 7), None)
                .unwrap();
            let mut p = EchoPair {
                lp,
                mode,
                cli,
                wire,
                c,
            };
            // Client frames in, the server's out, until the handshake is done.
            for _ in 0..4 {
                p.client_out();
                let frames = p.server_turn();
                p.cli.handle_frames(now, frames);
            }
            assert_eq!(p.cli.state(c), Some(State::Established));
            p
        }

        /// The client's frames onto the wire.
        fn client_out(&mut self) {
            while let Some(t) = self.cli.poll_transmit(self.lp.st.now) {
                assert!(self.wire.inject(Zbuf::copy_from_slice(&t.to_vec())));
            }
        }

        /// One server iteration; what it sent.
        fn server_turn(&mut self) -> Vec<Zbuf> {
            self.lp.poll_once(&mut self.mode);
            let mut frames = Vec::new();
            self.wire.rx_burst(&mut frames, 512);
            frames
        }
    }

    /// A frame's TCP (sequence number, payload length, ACK number).
    fn tcp_of(f: &[u8]) -> (u32, usize, u32) {
        use luna_stack::wire::{Ipv4Packet, TcpPacket};
        let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
        let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
        (tcp.seq_number().0, tcp.payload().len(), tcp.ack_number().0)
    }

    /// The data segments a server core sends back for one receive burst of eight
    /// 100-byte requests, each in a segment of its own: (payload length, ACK number
    /// relative to the client's first byte).
    fn echo_of_one_burst(rx_split: usize) -> Vec<(usize, u32)> {
        let mut p = EchoPair::new(rx_split);
        let (c, now) = (p.c, p.lp.st.now);
        let base = p.cli.connection(c).unwrap().snd_una().0;
        for i in 0..8u8 {
            p.cli.send(c, &Zbuf::copy_from_slice(&[i; 100])).unwrap();
            let t = p.cli.poll_transmit(now).expect("one segment per send");
            assert!(p.wire.inject(Zbuf::copy_from_slice(&t.to_vec())));
        }
        // One server iteration takes the eight frames in one burst.
        p.server_turn()
            .iter()
            .map(|f| {
                let (_, len, ack) = tcp_of(f);
                (len, ack.wrapping_sub(base))
            })
            .collect()
    }

    /// A burst above the split is handled in halves (the first rounded up), one at or
    /// below it whole, and 0 never splits.
    #[test]
    fn a_burst_above_the_split_is_halved() {
        assert_eq!(rx_split_first(5, 4), 3);
        assert_eq!(rx_split_first(32, 4), 16);
        assert_eq!(rx_split_first(4, 4), 4);
        assert_eq!(rx_split_first(1, 4), 1);
        assert_eq!(rx_split_first(0, 4), 0);
        assert_eq!(rx_split_first(32, 0), 32);
    }

    /// `rx_split`: a burst of more frames is answered in two halves, the first half's
    /// replies sent before the second half is read (each acknowledging its own half);
    /// a burst at or below it is answered whole, as without a split.
    #[test]
    fn a_large_burst_is_answered_in_two_halves() {
        assert_eq!(echo_of_one_burst(4), [(400, 400), (400, 800)]);
        assert_eq!(echo_of_one_burst(8), [(800, 800)]);
        assert_eq!(echo_of_one_burst(0), [(800, 800)]);
    }

    /// A deadline that falls due while a split burst is read waits for the whole burst:
    /// the ACK in its second half that makes the retransmission timer's (and the tail
    /// loss probe's) work moot is taken first, as in a burst read whole. Timers ran after
    /// the first half, and retransmitted what the ACK already in hand acknowledged.
    #[test]
    fn a_timer_due_during_a_split_burst_sees_the_whole_burst_first() {
        for rx_split in [4, 0] {
            let mut p = EchoPair::new(rx_split);
            let (c, now) = (p.c, p.lp.st.now);
            // A request, its echo (which arms the server's timers), and the client's ACK
            // of the echo (its delayed ACK, due a while later).
            p.cli.send(c, &Zbuf::copy_from_slice(&[1; 100])).unwrap();
            p.client_out();
            let echo = p.server_turn();
            assert_eq!(echo.len(), 1);
            let (seq, len, _) = tcp_of(&echo[0]);
            assert_eq!(len, 100);
            p.cli.handle_frames(now, echo);
            while let Ok(Some(_)) = p.cli.recv(c) {}
            let later = now + Duration::from_millis(500);
            p.cli.handle_timeouts(later);
            let ack: Vec<Zbuf> = std::iter::from_fn(|| p.cli.poll_transmit(later))
                .map(|t| Zbuf::copy_from_slice(&t.to_vec()))
                .collect();
            assert_eq!(ack.len(), 1, "the client's ACK");
            assert_eq!(tcp_of(&ack[0]).2, seq.wrapping_add(100));
            // The server's next deadline (the probe's or the retransmission's) has come
            // when a burst of eight frames arrives, the ACK in its second half (the
            // others are noise the stack drops).
            let due = p.lp.st.stack.poll_timeout().expect("a timer is armed");
            p.lp.st.now = due;
            let noise = || Zbuf::copy_from_slice(&[0u8; 60]);
            for i in 0..8 {
                let f = if i == 5 { ack[0].clone() } else { noise() };
                assert!(p.wire.inject(f));
            }
            let out = p.server_turn();
            let resent: Vec<_> = out.iter().map(|f| tcp_of(f)).filter(|t| t.1 > 0).collect();
            assert!(resent.is_empty(), "rx_split {rx_split}: resent {resent:?}");
            assert_eq!(p.lp.st.stack.counters().tcp_retransmits, 0);
        }
    }

    /// `tx_retry_limit` counts iterations whose tries took nothing, and `tx_retries`
    /// iterations that ended with frames left: a burst answered in two halves is one
    /// iteration (it tried the ring twice, and used up the limit twice as fast).
    #[test]
    fn a_split_burst_is_one_try_of_a_stuck_ring() {
        let opts = CoreOptions {
            tx_retry_limit: 3,
            ..CoreOptions::default()
        };
        let mut lp = trickle_core(true, opts, 1);
        lp.devices[0].noise = 8;
        let mut mode = crate::inline::InlineMode::new(EchoAll, 32);
        for i in 1..=3 {
            lp.poll_once(&mut mode);
            let s = &lp.st.stats;
            assert_eq!((s.rx_frames, s.tx_retries, s.tx_dropped), (8 * i, i, 0));
        }
        lp.poll_once(&mut mode);
        assert_eq!(lp.st.stats.tx_dropped, 1, "past the limit");
    }

    /// The shutdown's last resort counts each connection it resets once, also one that is
    /// open, closing and holding backlogged bytes at once (it counted it three times).
    #[test]
    fn abort_all_counts_each_connection_once() {
        let mut lp = trickle_core(true, CoreOptions::default(), 2);
        let hs: Vec<Conn> = lp.st.open.iter().copied().collect();
        assert_eq!(hs.len(), 2);
        lp.st.closing.push(hs[0]);
        lp.st.backlog.insert(
            hs[0],
            Backlog {
                bufs: VecDeque::from([Zbuf::copy_from_slice(b"late")]),
                bytes: 4,
                close: true,
            },
        );
        lp.st.backlog_bytes += 4;
        lp.st.abort_all();
        assert_eq!(lp.st.stats.shutdown_aborts, 2);
        assert_eq!(lp.st.backlog_bytes, 0);
        assert!(lp.st.open.is_empty() && lp.st.backlog.is_empty());
    }

    /// `tx_retry_limit` bounds the tries in a row that send nothing: a queue the ring
    /// keeps taking from, however slowly and however long it stays non-empty, is never
    /// dropped (it was, once its refusals added up past the limit).
    #[test]
    fn a_slowly_draining_ring_never_drops_the_queue() {
        let opts = CoreOptions {
            tx_retry_limit: 3,
            ..CoreOptions::default()
        };
        let mut lp = trickle_core(false, opts, 40);
        let mut sent = 0;
        for _ in 0..200 {
            sent += lp.transmit();
        }
        assert_eq!((sent, lp.st.stats.tx_dropped), (40, 0));
        // A ring that takes nothing: dropped after the limit.
        lp.devices[0].stuck = true;
        lp.st.connect(SocketAddrV4::new(TRICKLE_PEER, 80)).unwrap();
        lp.drain_stack_tx();
        for _ in 0..3 {
            lp.transmit();
        }
        assert_eq!(lp.st.stats.tx_dropped, 0);
        lp.transmit();
        assert_eq!(lp.st.stats.tx_dropped, 1);
        assert!(lp.tx.is_empty());
    }

    /// Past `tx_retry_limit` a stuck ring costs one burst from the head of the queue, and
    /// the next burst gets the same tries, not the whole queue at once; once the ring takes
    /// frames again the rest go out.
    #[test]
    fn a_stuck_ring_drops_a_burst_at_a_time_not_the_queue() {
        let opts = CoreOptions {
            tx_retry_limit: 3,
            burst: 8,
            ..CoreOptions::default()
        };
        let mut lp = trickle_core(true, opts, 20);
        for _ in 0..3 {
            lp.transmit();
        }
        let state = |lp: &CoreLoop<Trickle>| (lp.st.stats.tx_dropped, lp.tx.len());
        assert_eq!(state(&lp), (0, 20), "within the limit");
        lp.transmit();
        assert_eq!(state(&lp), (8, 12), "one burst");
        for _ in 0..3 {
            lp.transmit();
        }
        assert_eq!(state(&lp), (8, 12), "the next burst gets its tries");
        lp.transmit();
        assert_eq!(state(&lp), (16, 4), "then goes too");
        // The ring takes frames again: the rest go out, nothing more is dropped.
        lp.devices[0].stuck = false;
        let mut sent = 0;
        for _ in 0..20 {
            sent += lp.transmit();
        }
        assert_eq!((sent, lp.st.stats.tx_dropped), (4, 16));
        assert!(lp.tx.is_empty());
    }

    /// The shutdown grace ran out: what the queue held is dropped and counted (the
    /// connections are being reset), and the reset loop ends even on a device that takes
    /// nothing.
    #[test]
    fn running_out_of_grace_drops_the_queue_and_ends_on_a_stuck_ring() {
        for stuck in [false, true] {
            let mut lp = trickle_core(stuck, CoreOptions::default(), 20);
            lp.reset_remaining();
            assert_eq!(lp.st.stats.tx_dropped, 20, "stuck {stuck}");
            assert!(lp.tx.is_empty(), "stuck {stuck}");
            assert_eq!(
                (lp.st.open.len(), lp.st.stack.connection_count()),
                (0, 0),
                "every connection aborted and released, stuck {stuck}"
            );
        }
    }

    /// A core with several queues of one port transmits on its first: a frame the first
    /// ring refuses waits for it. Handing it to the next queue's ring instead (as the loop
    /// did) splits a connection's frames over two rings the NIC drains independently, so
    /// later frames could leave before earlier ones: reordering on the wire.
    #[test]
    fn a_core_with_several_queues_transmits_in_order_on_its_first() {
        let mut lp = trickle_queues_core(2, false, CoreOptions::default(), 10);
        let mut sent = 0;
        for _ in 0..40 {
            sent += lp.transmit();
        }
        assert_eq!(sent, 10);
        let taken: Vec<usize> = lp.devices.iter().map(|d| d.taken).collect();
        assert_eq!(taken, [10, 0], "frames per queue");
        assert_eq!(lp.st.stats.tx_dropped, 0);
    }

    /// Handles are (slot index, generation) pairs, hashed as two `u32` writes by
    /// `derive(Hash)`: sequential slots must spread over the table's buckets (the low
    /// bits) instead of piling up, and generations must matter.
    #[test]
    fn handle_hash_spreads_sequential_slots() {
        let hash = |idx: u32, gen: u32| {
            let mut h = HandleHash::default();
            h.write_u32(idx);
            h.write_u32(gen);
            h.finish()
        };
        let mut buckets = [0u32; 1024];
        for idx in 0..1024 {
            buckets[(hash(idx, 0) & 1023) as usize] += 1;
        }
        let worst = buckets.iter().max().copied().unwrap_or(0);
        assert!(
            worst <= 8,
            "a bucket holds {worst} of 1024 sequential handles"
        );
        assert_ne!(hash(7, 0), hash(7, 1));
        // hashbrown also uses the top 7 bits as a tag: they vary too.
        let tags: HashSet<u64> = (0..1024).map(|i| hash(i, 0) >> 57).collect();
        assert!(tags.len() > 64, "only {} distinct tags", tags.len());
    }
}
