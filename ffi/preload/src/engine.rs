//! The poll thread: r2c in batch mode on one core, moving bytes between the stack and
//! the sockets' shared state, plus its lazy start from `LUNA_CONFIG`.

use crate::sock::{Phase, Sock, RX_CAP};
use core::net::{Ipv4Addr, SocketAddrV4};
use dpdk_sys::Eal;
use r2c::batch::{BatchApp, Fd as BFd, Interest, PollEvent, SockError, Sockets};
use r2c::config::{Config, DeviceKind};
use r2c::device::dpdk::{DpdkDevice, DpdkDeviceConfig};
use r2c::Runtime;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use zbuf::dpdk::DmaRegistry;
use zbuf::{Slab, SlabConfig};

/// Most bytes handed to one `Sockets::send` (one zbuf allocation).
const SEND_CHUNK: usize = 16 << 10;

/// The environment variable naming r2c's TOML configuration.
pub(crate) const CONFIG_ENV: &str = "LUNA_CONFIG";

/// What the application side asks of the poll thread.
pub(crate) enum Cmd {
    /// Listen on the socket's bound port (answer in `reply`).
    Listen(Arc<Sock>),
    /// Connect to the address (answer in `reply`: started or failed).
    Connect(Arc<Sock>, SocketAddrV4),
    /// The socket's send queue got bytes.
    Flush(Arc<Sock>),
    /// `shutdown(SHUT_WR)` after the queued bytes.
    Shutdown(Arc<Sock>),
    /// The application closed the socket.
    Close(Arc<Sock>),
    /// `shutdown(SHUT_RD/SHUT_RDWR)` of a listener: stop listening and close the
    /// connections it had queued for `accept` (taken from its queue by the caller).
    StopListen(Arc<Sock>, Vec<Arc<Sock>>),
    /// `TCP_NODELAY` or `IP_TOS` changed: pass them to the connection.
    Opts(Arc<Sock>),
    /// `getsockopt(TCP_INFO)`: the connection's state into `tcp_info` (answer in `reply`).
    Info(Arc<Sock>),
}

/// Passes the socket's `TCP_NODELAY` and `IP_TOS` to its connection (at connect, at
/// accept, and when `setsockopt` changes them).
fn apply_opts(s: &mut Sockets<'_>, fd: BFd, o: &crate::sock::Opts) {
    let _ = s.set_nagle(fd, o.nodelay == 0);
    let _ = s.set_dscp(fd, o.tos >> 2);
}

/// Linux's `TCP_*` state numbers (`include/net/tcp_states.h`), as `tcpi_state` gives them.
fn linux_state(s: luna_stack::tcp::State) -> u8 {
    use luna_stack::tcp::State;
    match s {
        State::Established => 1,
        State::SynSent => 2,
        State::SynReceived => 3,
        State::FinWait1 => 4,
        State::FinWait2 => 5,
        State::TimeWait => 6,
        State::Closed => 7,
        State::CloseWait => 8,
        State::LastAck => 9,
        State::Closing => 11,
    }
}

/// `TCP_INFO` of a socket with no connection (fresh, or its connection gone): state
/// `TCP_CLOSE`, nothing else known.
fn tcp_info_closed() -> libc::tcp_info {
    // SAFETY: tcp_info is plain integers; all zeroes is a valid value.
    let mut i: libc::tcp_info = unsafe { std::mem::zeroed() };
    i.tcpi_state = 7;
    i
}

/// `TCP_INFO` of a listener: state `TCP_LISTEN`.
fn tcp_info_listen() -> libc::tcp_info {
    let mut i = tcp_info_closed();
    i.tcpi_state = 10;
    i
}

/// Linux's `struct tcp_info` from luna's connection, in Linux's units: times in
/// microseconds, windows (`snd_cwnd`, `snd_ssthresh`) and `unacked` in segments of
/// `snd_mss`, as `tcp_get_info` reports them. What luna does not keep (delivery rate,
/// pacing, the `last_*` times, SACKed and lost counts, bytes acknowledged) stays 0.
fn tcp_info_of(c: &luna_stack::tcp::Connection) -> libc::tcp_info {
    let us = |d: Option<luna_stack::time::Duration>| {
        d.map_or(0, |d| u32::try_from(d.as_micros()).unwrap_or(u32::MAX))
    };
    let mut i = tcp_info_closed();
    let mss = c.mss().max(1);
    let rtt = c.rtt();
    let (sack, ts, ws) = c.negotiated();
    i.tcpi_state = linux_state(c.state());
    // Linux's ca_state: TCP_CA_Open 0, Recovery 3, Loss 4 (after a timeout).
    i.tcpi_ca_state = if rtt.backoff_count() > 0 {
        4
    } else if c.in_recovery() {
        3
    } else {
        0
    };
    let backoff = u8::try_from(rtt.backoff_count()).unwrap_or(u8::MAX);
    i.tcpi_retransmits = backoff;
    i.tcpi_backoff = backoff;
    // TCPI_OPT_TIMESTAMPS 1, TCPI_OPT_SACK 2, TCPI_OPT_WSCALE 4.
    i.tcpi_options = u8::from(ts) | u8::from(sack) << 1 | u8::from(ws.is_some()) << 2;
    if let Some((snd, rcv)) = ws {
        // The bitfields tcpi_snd_wscale:4 (low) and tcpi_rcv_wscale:4.
        i.tcpi_snd_rcv_wscale = (snd & 0xf) | (rcv & 0xf) << 4;
    }
    i.tcpi_rto = us(Some(rtt.rto()));
    i.tcpi_snd_mss = mss;
    i.tcpi_rcv_mss = mss;
    i.tcpi_advmss = mss;
    i.tcpi_pmtu = mss + 40;
    i.tcpi_unacked = c.bytes_in_flight().div_ceil(mss);
    i.tcpi_rtt = us(rtt.srtt());
    i.tcpi_rttvar = us(rtt.rttvar());
    i.tcpi_min_rtt = us(rtt.min_rtt());
    i.tcpi_snd_cwnd = c.cwnd() / mss;
    // An unset slow-start threshold (luna's MAX_CWND, RFC 5681's "arbitrarily high") is
    // Linux's TCP_INFINITE_SSTHRESH.
    i.tcpi_snd_ssthresh = if c.ssthresh() >= luna_stack::tcp::cc::MAX_CWND {
        0x7fff_ffff
    } else {
        c.ssthresh() / mss
    };
    i.tcpi_reordering = 3;
    let k = &c.counters;
    i.tcpi_total_retrans = u32::try_from(k.retransmits).unwrap_or(u32::MAX);
    i.tcpi_segs_out = k.segs_out as u32;
    i.tcpi_segs_in = k.segs_in as u32;
    i.tcpi_bytes_sent = k.bytes_out;
    i.tcpi_bytes_received = k.bytes_in;
    i.tcpi_notsent_bytes =
        u32::try_from(c.send_queued().saturating_sub(c.bytes_in_flight() as usize))
            .unwrap_or(u32::MAX);
    i.tcpi_dsack_dups = k.dsacks as u32;
    i.tcpi_snd_wnd = c.send_window();
    i
}

/// The addresses luna serves, from the configuration (read before starting DPDK, so a
/// program that only talks to loopback never starts it).
#[derive(Debug, Clone)]
pub(crate) struct Net {
    pub ip: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Option<Ipv4Addr>,
    pub cfg: Config,
}

impl Net {
    /// Whether `connect` to `dst` goes through luna: on-link or routed, never loopback.
    pub fn routes(&self, dst: Ipv4Addr) -> bool {
        if dst.is_loopback() || dst.is_unspecified() || dst.is_multicast() {
            return false;
        }
        let mask = if self.prefix_len == 0 {
            0
        } else {
            u32::MAX << (32 - self.prefix_len as u32)
        };
        (u32::from(dst) & mask) == (u32::from(self.ip) & mask)
            || self.gateway.is_some()
            || !self.cfg.net.routes.is_empty()
    }
}

/// The configuration, loaded once; `None` without `LUNA_CONFIG` or when it is invalid
/// (the reason is printed once).
pub(crate) fn net() -> Option<&'static Net> {
    static NET: OnceLock<Option<Net>> = OnceLock::new();
    NET.get_or_init(|| {
        let path = std::env::var_os(CONFIG_ENV)?;
        let _g = crate::Internal::enter();
        match load(Path::new(&path)) {
            Ok(n) => Some(n),
            Err(e) => {
                eprintln!(
                    "luna-preload: {CONFIG_ENV}={}: {e}; every socket stays in the kernel",
                    path.to_string_lossy()
                );
                None
            }
        }
    })
    .as_ref()
}

fn load(path: &Path) -> Result<Net, String> {
    let cfg = Config::load(path, &[]).map_err(|e| e.to_string())?;
    if cfg.cores.len() != 1 || cfg.queues_per_core != 1 {
        return Err("the preload shim runs one poll thread: set cores.list to one CPU and queues_per_core = 1".into());
    }
    if !matches!(cfg.device, DeviceKind::Dpdk { .. }) {
        return Err("device.kind must be \"dpdk\" (the in-memory device has no peer here)".into());
    }
    Ok(Net {
        ip: cfg.net.ip,
        prefix_len: cfg.net.prefix_len,
        gateway: cfg.net.gateway,
        cfg,
    })
}

/// What application threads share with the poll thread.
pub(crate) struct Shared {
    cmds: Mutex<Vec<Cmd>>,
    has_cmds: AtomicBool,
    /// An application's call made room in a full queue since the poll thread's last
    /// iteration ([`room_made`]): its re-check before a sleep must see it as it sees a
    /// command, or a ring that came just before the sleep was announced was lost.
    room: AtomicBool,
    /// Rings the poll thread's doorbell (r2c's `IdleStrategy::Backoff`: a command must
    /// not wait for its sleep to end); unset under the other idle strategies.
    bell: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl Shared {
    /// An empty command queue.
    pub fn new() -> Shared {
        Shared {
            cmds: Mutex::new(Vec::new()),
            has_cmds: AtomicBool::new(false),
            room: AtomicBool::new(false),
            bell: OnceLock::new(),
        }
    }

    /// Takes the queued commands (as the poll thread does).
    #[cfg(test)]
    pub fn take(&self) -> Vec<Cmd> {
        self.has_cmds.store(false, Ordering::Release);
        std::mem::take(&mut *self.cmds.lock().unwrap())
    }

    /// Queue a command for the next poll iteration.
    pub fn push(&self, c: Cmd) {
        self.cmds.lock().unwrap_or_else(|p| p.into_inner()).push(c);
        self.has_cmds.store(true, Ordering::Release);
        self.ring();
    }

    /// Wakes the poll thread if it sleeps (`IdleStrategy::Backoff`; nothing otherwise).
    fn ring(&self) {
        if let Some(ring) = self.bell.get() {
            ring();
        }
    }

    /// Room was made in a full queue ([`room_made`]): recorded for the poll thread's
    /// re-check ([`PollApp::pending`]), then rung.
    pub fn make_room(&self) {
        self.room.store(true, Ordering::Release);
        self.ring();
    }
}

/// The engine, once started (never starts it).
static ENGINE: OnceLock<Option<Arc<Shared>>> = OnceLock::new();

#[cfg(test)]
thread_local! {
    /// Counts [`room_made`] calls on this thread (tests: no engine runs there).
    pub(crate) static ROOM_MADE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// An application's call made room the poll thread stopped at: a `read` that took bytes
/// from a full receive queue (the poll thread leaves the rest in the stack, its window
/// shut), an `accept` from a full accept queue (the rest wait in the stack's). Work for
/// the poll thread that is no command: under `IdleStrategy::Backoff` it must be rung, or
/// the rest waits for its sleep to end (up to `backoff_max_us` per queue's worth).
pub(crate) fn room_made() {
    #[cfg(test)]
    ROOM_MADE.with(|c| c.set(c.get() + 1));
    if let Some(Some(sh)) = ENGINE.get() {
        sh.make_room();
    }
}

/// What must live as long as the process: the EAL, the DMA registry, the runtime.
struct Keep {
    _rt: Runtime,
    _registry: DmaRegistry,
    _eal: Eal,
}

// Keep is only stored, never used from several threads.
static KEEP: Mutex<Option<Keep>> = Mutex::new(None);

/// Closed sockets whose connection the stack gave up on (`ETIMEDOUT`) while bytes
/// queued before the close were still waiting here: a peer that kept its window shut
/// (or vanished) after the close. Reported at exit with `LUNA_PRELOAD_DEBUG`.
pub(crate) static ORPHANS_TIMED_OUT: AtomicU64 = AtomicU64::new(0);

/// Set by the poll thread's application as it ends (however it ends: a core error, a
/// panic unwinding, the stop at exit), before it wakes every socket it knows.
static ENDED: AtomicBool = AtomicBool::new(false);

/// False once the poll thread has ended on its own (a core error): waiting callers then
/// fail with `ENETDOWN` instead of waiting forever. True before luna starts.
pub(crate) fn alive() -> bool {
    !ENDED.load(Ordering::SeqCst)
        && KEEP
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_none_or(|k| !k._rt.is_finished())
}

/// The running engine, started at the first call that needs it; `None` if it could not
/// start (the reason is printed once).
pub(crate) fn engine() -> Option<&'static Arc<Shared>> {
    ENGINE
        .get_or_init(|| {
            let net = net()?;
            let _g = crate::Internal::enter();
            match start(net) {
                Ok(s) => {
                    // SAFETY: getpid has no preconditions.
                    crate::PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
                    crate::ACTIVE.store(true, Ordering::Release);
                    Some(s)
                }
                Err(e) => {
                    eprintln!("luna-preload: cannot start luna: {e}");
                    None
                }
            }
        })
        .as_ref()
}

/// The calling thread's CPU affinity (EAL init pins the calling thread to its main
/// lcore; the application's thread gets its own mask back).
struct Affinity(Option<libc::cpu_set_t>);

impl Affinity {
    fn save() -> Affinity {
        // SAFETY: cpu_set_t is plain data; zeroed is a valid empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: pid 0 = this thread; the size matches the set passed.
        let r =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        Affinity((r == 0).then_some(set))
    }

    fn restore(&self) {
        if let Some(set) = &self.0 {
            // SAFETY: pid 0 = this thread; `set` is the mask read by `save`.
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
        }
    }
}

extern "C" fn after_fork_child() {
    crate::FORKED.store(true, Ordering::Release);
    crate::ACTIVE.store(false, Ordering::Release);
}

/// At exit: stop the poll thread gracefully, so luna's peers see their connections
/// close (FIN, or RST after `runtime.shutdown_grace_ms`) instead of a silent peer. The
/// bytes still in the shim's send queues go first (Linux sends them after the process
/// ended): the stop waits for them, for at most `runtime.shutdown_grace_ms`, and the
/// poll thread resets the connections whose bytes did not all go
/// ([`PollApp::on_stop`]) rather than end them with a FIN after a truncated stream.
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        // (`exit` in a vfork child, against vfork's rules, must not stop the parent's
        // runtime, whose memory the child shares.)
        if crate::FORKED.load(Ordering::Acquire) || crate::vfork_child() {
            return;
        }
        if let Some(n) = net() {
            let until = std::time::Instant::now() + n.cfg.options.shutdown_grace;
            while alive() && crate::hooks::bytes_queued() && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        let _g = crate::Internal::enter();
        if crate::debug() {
            eprintln!(
                "luna-preload: closed sockets timed out with bytes unsent: {}",
                ORPHANS_TIMED_OUT.load(Ordering::Relaxed)
            );
        }
        let keep = KEEP.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(k) = keep {
            crate::ACTIVE.store(false, Ordering::Release);
            k._rt.stop();
            let _ = k._rt.join();
        }
    });
}

fn start(net: &Net) -> Result<Arc<Shared>, String> {
    let cfg = &net.cfg;
    let DeviceKind::Dpdk { port } = &cfg.device else {
        return Err("device.kind must be dpdk".into());
    };
    // Until the runtime runs: every thread luna starts blocks the application's signals.
    let _signals = dpdk_sys::tapsignal::AsyncSignalsBlocked::now();
    let aff = Affinity::save();
    let eal = Eal::init(cfg.eal.clone()).map_err(|e| format!("EAL: {e}"));
    aff.restore();
    let eal = eal?;
    let registry = DmaRegistry::new(&eal);
    let slab = Slab::new(registry.slab_config(SlabConfig::new().max_memory(96 << 20)))
        .map_err(|e| format!("slab: {e}"))?;
    let mut dcfg = DpdkDeviceConfig::new(port.clone());
    dcfg.pool_prefix = "lpre".into();
    dcfg.tx_copy_max = cfg.tx_copy_max;
    let dev =
        DpdkDevice::open(&eal, &slab, &registry, &dcfg).map_err(|e| format!("open {port}: {e}"))?;
    let setups = cfg
        .core_setups(vec![vec![dev]])
        .map_err(|e| e.to_string())?;
    let mut opts = cfg.options.clone();
    opts.slab = Some(slab);
    let sh = Arc::new(Shared::new());
    let app_sh = Arc::clone(&sh);
    let rt = Runtime::spawn_batch(setups, opts, move |_| PollApp::new(Arc::clone(&app_sh)))
        .map_err(|e| format!("runtime: {e}"))?;
    // SAFETY: registers a plain extern "C" function with no captured state.
    unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
    // SAFETY: as above.
    unsafe { libc::atexit(at_exit) };
    *KEEP.lock().unwrap_or_else(|p| p.into_inner()) = Some(Keep {
        _rt: rt,
        _registry: registry,
        _eal: eal,
    });
    Ok(sh)
}

/// The batch-mode application of the poll thread.
pub(crate) struct PollApp {
    sh: Arc<Shared>,
    socks: HashMap<BFd, Arc<Sock>>,
    events: Vec<PollEvent>,
    /// Commands taken from the queue and not run yet, last first (`pop` runs the
    /// oldest): they stay here while one runs, so a panic in it leaves them to
    /// `fail_all`.
    cmds: Vec<Cmd>,
    /// The socket of the command running now (for `fail_all`, if it panics).
    running: Option<Arc<Sock>>,
    /// Closed sockets with `SO_LINGER` whose closer waits for the peer's
    /// acknowledgement: looked at every iteration until it came.
    lingering: Vec<Arc<Sock>>,
}

impl PollApp {
    pub(crate) fn new(sh: Arc<Shared>) -> PollApp {
        PollApp {
            sh,
            socks: HashMap::new(),
            events: Vec::new(),
            cmds: Vec::new(),
            running: None,
            lingering: Vec::new(),
        }
    }

    /// Closes the stack socket a failed connect left behind (the application's socket
    /// is unconnected again, [`crate::sock::State::unconnect`]; a new listen or connect
    /// gets a new one).
    fn drop_dead(&mut self, s: &mut Sockets<'_>, g: &mut crate::sock::State) {
        if g.listener {
            return;
        }
        if let Some(old) = g.bfd.take() {
            let _ = s.close(old);
            self.socks.remove(&old);
            g.interest = None;
        }
    }

    fn command(&mut self, s: &mut Sockets<'_>, c: Cmd) {
        match c {
            Cmd::Listen(sock) => {
                let mut g = sock.lock();
                if g.phase == Phase::Closed {
                    // Closed by another thread before the poll thread got here.
                    g.reply = Some(Err(libc::EBADF));
                    sock.notify(&g);
                    return;
                }
                self.drop_dead(s, &mut g);
                let fd = s.socket();
                let port = g.local.port();
                let r = match s
                    .bind(fd, port)
                    .and_then(|_| s.listen(fd, g.backlog.max(1)))
                    .and_then(|_| s.register(fd, Interest::READABLE))
                {
                    Ok(()) => Ok(fd),
                    Err(e) => {
                        let _ = s.close(fd);
                        Err(e.errno())
                    }
                };
                match r {
                    Ok(fd) => {
                        g.bfd = Some(fd);
                        g.interest = Some(Interest::READABLE);
                        g.phase = Phase::Listening;
                        g.listener = true;
                        g.reply = Some(Ok(()));
                        self.socks.insert(fd, Arc::clone(&sock));
                    }
                    Err(e) => {
                        g.phase = Phase::Fresh;
                        g.reply = Some(Err(e));
                    }
                }
                sock.notify(&g);
            }
            Cmd::Connect(sock, addr) => {
                let mut g = sock.lock();
                if g.phase == Phase::Closed {
                    g.reply = Some(Err(libc::EBADF));
                    sock.notify(&g);
                    return;
                }
                self.drop_dead(s, &mut g);
                let fd = s.socket();
                let port = g.local.port();
                // bind(2) to luna's address before connect: the connection's source
                // (else the route's).
                let from = Some(*g.local.ip()).filter(|ip| !ip.is_unspecified());
                let r = s
                    .bind(fd, port)
                    .and_then(|_| match s.connect_from(fd, from, addr) {
                        Err(SockError::InProgress) | Ok(()) => Ok(()),
                        Err(e) => Err(e),
                    });
                match r.and_then(|_| s.register(fd, Interest::BOTH)) {
                    Ok(()) => {
                        apply_opts(s, fd, &g.opts);
                        g.bfd = Some(fd);
                        g.interest = Some(Interest::BOTH);
                        g.phase = Phase::Connecting;
                        g.peer = Some(addr);
                        g.reply = Some(Ok(()));
                        self.socks.insert(fd, Arc::clone(&sock));
                    }
                    Err(e) => {
                        let _ = s.close(fd);
                        g.reply = Some(Err(e.errno()));
                    }
                }
                sock.notify(&g);
            }
            Cmd::Flush(sock) | Cmd::Shutdown(sock) | Cmd::Close(sock) => {
                self.service(s, &sock, None);
            }
            Cmd::Info(sock) => {
                let mut g = sock.lock();
                let info = match (g.bfd, g.listener) {
                    (Some(_), true) => tcp_info_listen(),
                    (Some(fd), false) => match s.connection(fd) {
                        Ok(Some(c)) => tcp_info_of(c),
                        _ => tcp_info_closed(),
                    },
                    (None, _) => tcp_info_closed(),
                };
                g.tcp_info = Some(Box::new(info));
                g.reply = Some(Ok(()));
                sock.notify(&g);
            }
            Cmd::Opts(sock) => {
                let g = sock.lock();
                if let (Some(fd), false) = (g.bfd, g.listener) {
                    apply_opts(s, fd, &g.opts);
                }
            }
            Cmd::StopListen(sock, queued) => {
                // Never accepted: reset, as Linux's inet_csk_listen_stop does.
                for c in queued {
                    let mut cg = c.lock();
                    cg.phase = Phase::Closed;
                    if let Some(cfd) = cg.bfd.take() {
                        let _ = s.abort(cfd);
                        self.socks.remove(&cfd);
                    }
                }
                let mut g = sock.lock();
                if g.listener {
                    if let Some(fd) = g.bfd.take() {
                        let _ = s.close(fd);
                        self.socks.remove(&fd);
                    }
                    g.listener = false;
                    g.interest = None;
                }
            }
        }
    }

    /// Moves bytes and connections between the stack and `sock`'s state; wakes waiters
    /// when readiness grew.
    fn service(&mut self, s: &mut Sockets<'_>, sock: &Arc<Sock>, ev: Option<PollEvent>) {
        let mut g = sock.lock();
        let Some(fd) = g.bfd else {
            return;
        };
        let before = g.mask();
        let mut grew = false;
        match g.phase {
            Phase::Listening => {
                while g.accept_q.len() < g.backlog.max(1) {
                    match s.accept(fd) {
                        Ok((nfd, peer)) => {
                            let local = s.addrs(nfd).map(|(l, _)| l).unwrap_or(g.local);
                            let c = Sock::new(Phase::Connected, local);
                            {
                                let mut cg = c.lock();
                                cg.peer = Some(peer);
                                cg.bfd = Some(nfd);
                                cg.opts = g.opts;
                                // Linux's accepted sockets are clones of their listener:
                                // its TCP_NODELAY and IP_TOS.
                                apply_opts(s, nfd, &cg.opts);
                                if s.register(nfd, Interest::READABLE).is_ok() {
                                    cg.interest = Some(Interest::READABLE);
                                }
                            }
                            self.socks.insert(nfd, Arc::clone(&c));
                            g.accept_q.push_back(c);
                            grew = true;
                        }
                        Err(_) => break,
                    }
                }
            }
            Phase::Closed if g.listener => {}
            Phase::Connecting | Phase::Connected | Phase::Closed => {
                // A failed connect reports its error once (SO_ERROR is read-and-clear, as in
                // Linux): later events of the dead connection must not set it again.
                if g.phase == Phase::Connecting && g.fatal.is_none() {
                    if let Some(e) = ev.and_then(|e| e.error) {
                        g.fatal = Some(e.errno());
                        g.so_error = Some(e.errno());
                    } else if ev.is_some_and(|e| e.writable) {
                        g.phase = Phase::Connected;
                        if let Ok((l, _)) = s.addrs(fd) {
                            g.local = l;
                        }
                    } else if ev.is_some_and(|e| e.hup) {
                        // Ended without connecting and without a reason: refused.
                        g.fatal = Some(libc::ECONNREFUSED);
                        g.so_error = Some(libc::ECONNREFUSED);
                    }
                }
                if g.phase != Phase::Connecting && !g.reset_on_close {
                    self.transfer(s, fd, &mut g, &mut grew);
                }
                // Closed with bytes still here (the stack's send buffer is full: a slow
                // peer, or one that keeps its window shut): the stack must treat the
                // connection as closed while they go, as Linux treats an orphan, so
                // that its limits end it (zero-window probes counted even when
                // answered) instead of probing a peer that never reads for ever.
                if g.phase == Phase::Closed
                    && !g.orphaned
                    && !g.linger
                    && !g.reset_on_close
                    && g.fatal.is_none()
                    && !g.tx.is_empty()
                {
                    g.orphaned = s.orphan(fd).is_ok();
                }
            }
            Phase::Fresh | Phase::Opening => {
                // A connect that failed and was reported: its dead connection goes.
                self.drop_dead(s, &mut g);
                if g.bfd.is_none() {
                    return;
                }
            }
        }
        // Finish a close once the queued bytes are out (or cannot go), or at once with a
        // RST. A listener's unaccepted connections are reset (inet_csk_listen_stop).
        if g.phase == Phase::Closed && (g.reset_on_close || g.tx.is_empty() || g.fatal.is_some()) {
            // SO_LINGER with a time, and the closer still waits: the FIN goes after the
            // bytes, and the connection stays until the peer acknowledged both.
            if g.linger && !g.listener && !g.reset_on_close && g.fatal.is_none() {
                if !g.shut_sent {
                    let _ = s.shutdown(fd);
                    g.shut_sent = true;
                }
                if s.unacked(fd).is_ok_and(|n| n > 0) {
                    if !self.lingering.iter().any(|x| Arc::ptr_eq(x, sock)) {
                        self.lingering.push(Arc::clone(sock));
                    }
                    return;
                }
            }
            if g.orphaned && g.fatal == Some(libc::ETIMEDOUT) {
                ORPHANS_TIMED_OUT.fetch_add(1, Ordering::Relaxed);
                if crate::debug() {
                    eprintln!(
                        "luna-preload: {fd:?}: a closed socket's connection timed out with {} bytes unsent",
                        g.tx.len()
                    );
                }
            }
            for c in std::mem::take(&mut g.accept_q) {
                let cg = c.lock();
                if let Some(cfd) = cg.bfd {
                    let _ = s.abort(cfd);
                    self.socks.remove(&cfd);
                }
            }
            let _ = if g.reset_on_close {
                s.abort(fd)
            } else {
                s.close(fd)
            };
            self.socks.remove(&fd);
            g.bfd = None;
            if g.linger {
                // The lingering closer's wait is over.
                sock.notify(&g);
            }
            return;
        }
        // Interest: always readable while reading matters; writable while bytes wait.
        let want_out = !g.tx.is_empty() || g.phase == Phase::Connecting;
        let done_reading = g.phase == Phase::Closed || g.eof || g.fatal.is_some();
        let want = match (done_reading && g.phase != Phase::Listening, want_out) {
            (true, false) => None,
            (_, true) => Some(Interest::BOTH),
            (false, false) => Some(Interest::READABLE),
        };
        if want != g.interest {
            let _ = match want {
                Some(i) => s.register(fd, i),
                None => s.deregister(fd),
            };
            g.interest = want;
        }
        let after = g.mask();
        if grew || after & !before != 0 {
            sock.notify(&g);
        }
    }

    /// Receive into `rx`, send from `tx`, pass on a pending shutdown.
    fn transfer(
        &mut self,
        s: &mut Sockets<'_>,
        fd: BFd,
        g: &mut crate::sock::State,
        grew: &mut bool,
    ) {
        let closed = g.phase == Phase::Closed;
        while g.fatal.is_none() && !g.eof && (closed || g.rx.len() < RX_CAP) {
            match s.recv_zbuf(fd) {
                Ok(Some(z)) => {
                    if closed {
                        // Bytes after the close: nobody will read them; RFC 1122
                        // §4.2.2.13 (Linux's TCPAbortOnData): a RST says they were lost.
                        if !z.is_empty() {
                            g.reset_on_close = true;
                            break;
                        }
                    } else {
                        g.rx.extend(&z[..]);
                        *grew = true;
                    }
                }
                Ok(None) => {
                    g.eof = true;
                    *grew = true;
                }
                Err(SockError::WouldBlock) => break,
                Err(e) => {
                    if crate::debug() {
                        eprintln!("luna-preload: recv on {fd:?}: {e}");
                    }
                    g.fail(e.errno());
                    *grew = true;
                }
            }
        }
        while !g.tx.is_empty() && g.fatal.is_none() {
            let (a, _) = g.tx.as_slices();
            // One buffer per send: the runtime's allocations are bounded in size.
            let a = &a[..a.len().min(SEND_CHUNK)];
            match s.send(fd, a) {
                // No buffer now: the bytes stay queued and go at a later iteration.
                Ok(0) | Err(SockError::WouldBlock) | Err(SockError::NoBufs) => break,
                Ok(n) => {
                    let was_full = g.tx.len() >= crate::sock::TX_CAP;
                    g.tx.drain(..n);
                    *grew |= was_full;
                }
                Err(e) => {
                    if crate::debug() {
                        eprintln!("luna-preload: send on {fd:?}: {e}");
                    }
                    g.fail(e.errno());
                    g.tx.clear();
                    *grew = true;
                }
            }
        }
        if g.shut_wr && !g.shut_sent && g.tx.is_empty() && g.fatal.is_none() {
            let _ = s.shutdown(fd);
            g.shut_sent = true;
        }
    }
}

/// The poll thread's application ends (dropped by the runtime, also while unwinding a
/// panic): every socket it knows, and every socket a command still waits for, fails with
/// `ENETDOWN` and its blocked callers wake. Blocked callers sleep without a timeout
/// ([`Sock`]'s futex wait, so that signals interrupt them as on Linux), so nothing else
/// would wake them; a caller that comes later finds [`alive`] false and does not sleep.
impl Drop for PollApp {
    fn drop(&mut self) {
        ENDED.store(true, Ordering::SeqCst);
        self.fail_all();
    }
}

impl PollApp {
    /// Fails every socket the poll thread knows or holds a command of with `ENETDOWN`,
    /// and wakes its blocked callers.
    fn fail_all(&mut self) {
        let pending = std::mem::take(&mut *self.sh.cmds.lock().unwrap_or_else(|p| p.into_inner()));
        let mut socks: Vec<Arc<Sock>> = self.socks.values().cloned().collect();
        socks.extend(self.running.take());
        for c in pending.into_iter().chain(std::mem::take(&mut self.cmds)) {
            match c {
                Cmd::Listen(s)
                | Cmd::Connect(s, _)
                | Cmd::Flush(s)
                | Cmd::Shutdown(s)
                | Cmd::Close(s)
                | Cmd::Opts(s)
                | Cmd::Info(s) => socks.push(s),
                Cmd::StopListen(s, queued) => {
                    socks.push(s);
                    socks.extend(queued);
                }
            }
        }
        for sock in socks {
            let mut g = sock.lock();
            if g.fatal.is_none() {
                g.fail(libc::ENETDOWN);
            }
            g.reply.get_or_insert(Err(libc::ENETDOWN));
            sock.notify(&g);
        }
    }
}

impl Cmd {
    /// The socket the command is for.
    fn sock(&self) -> &Arc<Sock> {
        match self {
            Cmd::Listen(s)
            | Cmd::Connect(s, _)
            | Cmd::Flush(s)
            | Cmd::Shutdown(s)
            | Cmd::Close(s)
            | Cmd::Opts(s)
            | Cmd::Info(s)
            | Cmd::StopListen(s, _) => s,
        }
    }
}

impl BatchApp for PollApp {
    fn on_start(&mut self, s: &mut Sockets<'_>) {
        // The poll thread's own libc calls are never luna's.
        crate::Internal::mark_thread();
        if let Some(bell) = s.doorbell() {
            let _ = self.sh.bell.set(Box::new(move || bell.ring()));
        }
    }

    /// Commands queued by the application's threads (the re-check of a sleep under
    /// `IdleStrategy::Backoff`; [`Shared::push`] rings after queueing).
    fn pending(&self) -> bool {
        self.sh.has_cmds.load(Ordering::Acquire) || self.sh.room.load(Ordering::Acquire)
    }

    /// The runtime stops (at exit) and is about to end every connection with a FIN after
    /// what the stack holds: a connection whose bytes are still in the shim would end
    /// truncated with an orderly FIN, so it is reset instead (the peer learns bytes were
    /// lost).
    fn on_stop(&mut self, s: &mut Sockets<'_>) {
        let socks: Vec<(BFd, Arc<Sock>)> = self
            .socks
            .iter()
            .map(|(f, k)| (*f, Arc::clone(k)))
            .collect();
        for (fd, sock) in socks {
            let mut g = sock.lock();
            if g.tx.is_empty() || g.fatal.is_some() || g.bfd != Some(fd) {
                continue;
            }
            let _ = s.abort(fd);
            self.socks.remove(&fd);
            g.bfd = None;
            g.tx.clear();
            g.fail(libc::ENETDOWN);
            sock.notify(&g);
        }
    }

    fn on_poll(&mut self, s: &mut Sockets<'_>) {
        // (This iteration serves every ready socket, those with room made among them.)
        self.sh.room.store(false, Ordering::Release);
        if self.sh.has_cmds.swap(false, Ordering::AcqRel) {
            std::mem::swap(
                &mut self.cmds,
                &mut *self.sh.cmds.lock().unwrap_or_else(|p| p.into_inner()),
            );
            self.cmds.reverse();
            while let Some(c) = self.cmds.pop() {
                self.running = Some(Arc::clone(c.sock()));
                self.command(s, c);
                self.running = None;
            }
        }
        s.poll(&mut self.events);
        for ev in std::mem::take(&mut self.events) {
            if let Some(sock) = self.socks.get(&ev.fd).cloned() {
                self.service(s, &sock, Some(ev));
            }
        }
        // (Each comes back to the list while it still waits for an acknowledgement.)
        for sock in std::mem::take(&mut self.lingering) {
            self.service(s, &sock, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sock::Wait;

    /// The poll thread's end fails and wakes the sockets it knew and those whose
    /// command it had not run: a read blocked on one and a listen waiting for its
    /// answer end with ENETDOWN instead of sleeping for ever.
    #[test]
    fn the_poll_threads_end_wakes_every_blocked_caller() {
        let sh = Arc::new(Shared::new());
        // Not dropped: the drop marks the (process-wide) engine ended.
        let mut app = std::mem::ManuallyDrop::new(PollApp::new(Arc::clone(&sh)));
        let known = Sock::new(Phase::Connected, crate::sock::UNBOUND);
        app.socks.insert(BFd(3), Arc::clone(&known));
        let opening = Sock::new(Phase::Opening, crate::sock::UNBOUND);
        sh.push(Cmd::Listen(Arc::clone(&opening)));
        let (k, o) = (Arc::clone(&known), Arc::clone(&opening));
        let reader = std::thread::spawn(move || k.read(&mut [&mut [0u8; 4]], 0, &|| Wait::Forever));
        let lister = std::thread::spawn(move || o.wait_reply());
        let start = std::time::Instant::now();
        while known.sleepers() == 0 || opening.sleepers() == 0 {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "never slept"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        app.fail_all();
        assert_eq!(reader.join().unwrap(), Err(libc::ENETDOWN));
        assert_eq!(lister.join().unwrap(), Err(libc::ENETDOWN));
        assert!(sh.cmds.lock().unwrap().is_empty());
    }

    /// A panic while a command runs (the runtime then drops the application) leaves the
    /// running command's socket and the commands behind it to `fail_all`: their callers
    /// wait for an answer that no one will give otherwise.
    #[test]
    fn commands_not_run_when_the_poll_thread_panics_are_failed() {
        let sh = Arc::new(Shared::new());
        let mut app = std::mem::ManuallyDrop::new(PollApp::new(Arc::clone(&sh)));
        let socks: Vec<Arc<Sock>> = (0..3)
            .map(|_| Sock::new(Phase::Opening, crate::sock::UNBOUND))
            .collect();
        // As `on_poll` leaves them when the first command panics: it running, the other
        // two still queued (last first).
        app.running = Some(Arc::clone(&socks[0]));
        app.cmds = vec![
            Cmd::Listen(Arc::clone(&socks[2])),
            Cmd::Listen(Arc::clone(&socks[1])),
        ];
        let waiters: Vec<_> = socks
            .iter()
            .map(|s| {
                let s = Arc::clone(s);
                std::thread::spawn(move || s.wait_reply())
            })
            .collect();
        let start = std::time::Instant::now();
        while socks.iter().any(|s| s.sleepers() == 0) {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "never slept"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        app.fail_all();
        for w in waiters {
            assert_eq!(w.join().unwrap(), Err(libc::ENETDOWN));
        }
        assert!(app.running.is_none() && app.cmds.is_empty());
    }

    /// After the poll thread's end a socket it had failed (a connect it never ran) is
    /// connected again: the new command is never run, and the wait for its answer must
    /// end with ENETDOWN instead of sleeping for ever because the socket already holds
    /// an error. Run in a forked child (the end marks the process-wide engine ended);
    /// a hang is ended by SIGALRM.
    #[test]
    fn a_wait_after_the_poll_threads_end_never_sleeps() {
        let sh = Arc::new(Shared::new());
        let app = PollApp::new(Arc::clone(&sh));
        let s = Sock::new(Phase::Fresh, crate::sock::UNBOUND);
        let to = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 7);
        // SAFETY: the child only locks this test's own socket, runs atomics and plain
        // system calls, and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: plain system calls in the child.
            unsafe { libc::alarm(3) };
            sh.push(Cmd::Connect(Arc::clone(&s), to));
            drop(app);
            let first = s.wait_reply();
            // connect(2) again: queued for a poll thread that is gone.
            sh.push(Cmd::Connect(Arc::clone(&s), to));
            let again = s.wait_reply();
            let ok = first == Err(libc::ENETDOWN) && again == Err(libc::ENETDOWN);
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        std::mem::forget(app);
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            !libc::WIFSIGNALED(status),
            "the second wait slept (killed by signal {})",
            libc::WTERMSIG(status)
        );
        assert_eq!(libc::WEXITSTATUS(status), 0, "wrong answers");
    }

    fn net(extra: &str) -> Net {
        let text = format!(
            "eal = [\"--no-pci\"]\n[device]\nkind = \"dpdk\"\nport = \"net_tap0\"\n[cores]\nlist = [0]\n\
             [net]\nip = \"198.18.0.2\"\nprefix_len = 24\n{extra}"
        );
        let cfg = Config::parse(&text).unwrap();
        Net {
            ip: cfg.net.ip,
            prefix_len: cfg.net.prefix_len,
            gateway: cfg.net.gateway,
            cfg,
        }
    }

    #[test]
    fn connect_goes_to_luna_on_link_and_never_to_loopback() {
        let n = net("");
        assert!(n.routes(Ipv4Addr::new(198, 18, 0, 1)));
        assert!(
            !n.routes(Ipv4Addr::new(198, 18, 1, 1)),
            "off-link without a gateway"
        );
        assert!(!n.routes(Ipv4Addr::LOCALHOST));
        assert!(!n.routes(Ipv4Addr::UNSPECIFIED));
        let g = net("gateway = \"198.18.0.254\"\n");
        assert!(
            g.routes(Ipv4Addr::new(10, 1, 2, 3)),
            "routed by the gateway"
        );
        assert!(!g.routes(Ipv4Addr::new(127, 0, 0, 2)));
    }

    #[test]
    fn commands_queue_in_order() {
        let sh = Shared::new();
        let a = Sock::new(Phase::Fresh, crate::sock::UNBOUND);
        sh.push(Cmd::Flush(Arc::clone(&a)));
        sh.push(Cmd::Close(Arc::clone(&a)));
        assert!(sh.has_cmds.load(Ordering::Acquire));
        let c = sh.take();
        assert!(matches!(c[..], [Cmd::Flush(_), Cmd::Close(_)]));
        assert!(!sh.has_cmds.load(Ordering::Acquire));
    }

    /// Under r2c's Backoff the poll thread sleeps on a doorbell: each queued command
    /// rings it, after it is visible to `pending`'s re-check.
    #[test]
    fn a_queued_command_rings_the_poll_threads_doorbell() {
        let sh = Arc::new(Shared::new());
        let rung = Arc::new(AtomicU64::new(0));
        let (r, weak) = (Arc::clone(&rung), Arc::downgrade(&sh));
        let _ = sh.bell.set(Box::new(move || {
            // The command (or the room made) is visible by the time the bell rings.
            let sh = weak.upgrade().expect("shared");
            assert!(sh.has_cmds.load(Ordering::Acquire) || sh.room.load(Ordering::Acquire));
            r.fetch_add(1, Ordering::Relaxed);
        }));
        let a = Sock::new(Phase::Fresh, crate::sock::UNBOUND);
        sh.push(Cmd::Flush(Arc::clone(&a)));
        sh.push(Cmd::Close(a));
        assert_eq!(rung.load(Ordering::Relaxed), 2);
        // Room made in a full queue rings too, and stays pending for the re-check (a
        // ring before the poll thread announced its sleep finds nobody to wake).
        // (Never dropped: its drop ends the engine for every test of the process.)
        let app = std::mem::ManuallyDrop::new(PollApp::new(Arc::clone(&sh)));
        sh.take();
        assert!(!app.pending());
        sh.make_room();
        assert_eq!(rung.load(Ordering::Relaxed), 3);
        assert!(app.pending(), "room made is seen by the re-check");
    }
}
