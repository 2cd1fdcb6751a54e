//! The control endpoint: a unix stream socket answering `lunactl` with counters,
//! connections and capture commands from a running luna process.
//!
//! Off by default; `[control] socket = "<path>"` in the config (or
//! [`CoreOptions::control`](crate::CoreOptions::control)) turns it on. One control thread
//! per runtime accepts connections on the socket, reads one request line (JSON, see
//! [`Command`]) and writes one reply line ([`Reply`]), then closes the connection.
//!
//! State a core thread owns (its stack, devices, capture) is never touched by the control
//! thread: it pushes a request into the core's [`Probe`] (a small lock-free queue plus a
//! flag) and waits, with a timeout, on a channel. The core looks at the flag only when it
//! publishes its stats (every `stats_interval` iterations: no per-frame or per-iteration
//! cost), builds the answer and sends it; it never blocks on the control thread. Counters
//! of [`CoreStats`](crate::CoreStats) come from the seqlock [`StatsCell`] the core
//! publishes into, read by the control thread.
//!
//! A second process binding the same path gets [`ControlError::InUse`]; a socket file
//! left by a dead process (nothing accepts on it) is replaced. The file is removed when
//! the runtime stops.

use crate::capture::{CaptureRing, CaptureStats, CaptureWriter, CoreCapture};
use crate::core::CoreState;
use crate::device::{Device, DeviceObservation};
use crate::stats::StatsCell;
use crossbeam_queue::ArrayQueue;
use luna_stack::stack::{StackCounters, StackDrop};
use luna_stack::tcp::{ConnCounters, DropReason, State};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// Longest unix socket path (`sun_path` holds 108 bytes with the NUL).
pub const MAX_SOCKET_PATH: usize = 107;
/// Longest request line accepted.
const MAX_REQUEST: u64 = 64 * 1024;
/// How long the control thread waits for a core's answer.
const CORE_TIMEOUT: Duration = Duration::from_secs(3);
/// Default capture snap length and ring size.
pub const DEFAULT_SNAPLEN: u32 = 65535;
/// Default capture ring size, frames.
pub const DEFAULT_RING_FRAMES: usize = 8192;

/// `[control]`: where the control socket lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlConfig {
    /// Path of the unix stream socket.
    pub socket: PathBuf,
}

impl ControlConfig {
    /// A control socket at `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        ControlConfig {
            socket: socket.into(),
        }
    }
}

/// Why the control endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Another live process answers on the path.
    #[error("control socket {0} is in use by a running process; give this process its own [control] socket path")]
    InUse(PathBuf),
    /// Something that is not a socket is at the path.
    #[error("{0} exists and is not a socket; remove it or choose another [control] socket path")]
    NotASocket(PathBuf),
    /// The path is too long for a unix socket.
    #[error("control socket path {0} is longer than {MAX_SOCKET_PATH} bytes; use a shorter path")]
    TooLong(PathBuf),
    /// Binding failed otherwise (missing directory, permissions).
    #[error("cannot bind control socket {path}: {source}; check that the directory exists and is writable")]
    Bind {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

// ---------------------------------------------------------------------------------------
// Wire format
// ---------------------------------------------------------------------------------------

/// A request: one JSON object on one line, tagged by `cmd`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Command {
    /// Counters of every core, device and pool.
    Stats,
    /// [`Command::Stats`] plus every connection and listener.
    Conns,
    /// Start capturing port `port` into `file` (pcapng).
    CaptureStart {
        /// DPDK port id (0 for the in-memory link).
        port: u16,
        /// Output file, created or truncated.
        file: PathBuf,
        /// Bytes kept per frame (default 65535).
        #[serde(default)]
        snaplen: Option<u32>,
        /// Ring size in frames (default 8192); oldest frames are dropped beyond it.
        #[serde(default)]
        ring_frames: Option<usize>,
    },
    /// Stop the capture of `port` and close its file.
    CaptureStop {
        /// DPDK port id.
        port: u16,
    },
}

/// One connection, netstat-style.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnEntry {
    /// Core that owns it.
    pub core: usize,
    /// Local address.
    pub local: String,
    /// Remote address.
    pub remote: String,
    /// TCP state, RFC 9293 spelling (`ESTABLISHED`, `TIME-WAIT`, ...).
    pub state: String,
    /// Bytes queued to send: unacknowledged plus unsent in TCP, plus the runtime's backlog.
    pub send_queue: u64,
    /// Bytes received and not yet read by the application.
    pub recv_queue: u64,
    /// Congestion window, bytes.
    pub cwnd: u64,
    /// Send MSS.
    pub mss: u64,
    /// Smoothed RTT in microseconds, once measured.
    pub srtt_us: Option<u64>,
    /// Current RTO in microseconds.
    pub rto_us: u64,
    /// Segments retransmitted.
    pub retransmits: u64,
    /// Payload bytes received in order.
    pub bytes_in: u64,
    /// Payload bytes sent (retransmissions included).
    pub bytes_out: u64,
}

/// One listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerEntry {
    /// Core that owns it.
    pub core: usize,
    /// Local address (`ip:port`).
    pub local: String,
    /// Backlog.
    pub backlog: u64,
    /// Connections in SYN-RECEIVED.
    pub half_open: u64,
    /// Connections waiting for `accept`.
    pub accept_queue: u64,
}

/// What one core reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoreSnapshot {
    /// Core index.
    pub core: usize,
    /// The core answered (false: it has stopped or did not answer in time; only `stats`,
    /// from its last publication, is filled).
    pub answered: bool,
    /// r2c's [`CoreStats`](crate::CoreStats), as last published through the seqlock.
    pub stats: BTreeMap<String, u64>,
    /// The stack's counters (`StackCounters`; drops as `drop_<reason>`).
    pub stack: BTreeMap<String, u64>,
    /// TCP counters summed over connections (`ConnCounters`; drops as `drop_<reason>`).
    pub tcp: BTreeMap<String, u64>,
    /// Live connections by TCP state.
    pub states: BTreeMap<String, u64>,
    /// The core's device queues.
    pub devices: Vec<DeviceObservation>,
    /// The port this core captures, if any.
    pub capture: Option<u16>,
    /// Listeners (filled for [`Command::Conns`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<ListenerEntry>,
    /// Connections (filled for [`Command::Conns`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conns: Vec<ConnEntry>,
}

/// zbuf slab occupancy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZbufSnapshot {
    /// Zones mapped.
    pub zones: u64,
    /// Of which on hugepages.
    pub hugepage_zones: u64,
    /// Bytes mapped.
    pub mapped_bytes: u64,
    /// Objects in all zones.
    pub objects: u64,
    /// Objects referenced by handles.
    pub in_use: u64,
    /// Allocation failures, all cores.
    pub alloc_failures: u64,
}

/// The result of a capture command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureReply {
    /// Port.
    pub port: u16,
    /// File.
    pub file: PathBuf,
    /// Snap length.
    pub snaplen: u32,
    /// Ring size, frames.
    pub ring_frames: usize,
    /// Cores that capture (start) or captured (stop).
    pub cores: Vec<usize>,
    /// Final counters (stop).
    pub stats: Option<CaptureStats>,
}

/// A reply: one JSON object on one line.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    /// Whether the command succeeded.
    pub ok: bool,
    /// What went wrong, when not `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The process id of the luna process.
    pub pid: u32,
    /// Per-core reports (stats, conns).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cores: Vec<CoreSnapshot>,
    /// zbuf occupancy, when the runtime has a slab.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zbuf: Option<ZbufSnapshot>,
    /// Capture commands' result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<CaptureReply>,
}

impl Reply {
    fn error(e: impl Into<String>) -> Reply {
        Reply {
            ok: false,
            error: Some(e.into()),
            pid: std::process::id(),
            ..Reply::default()
        }
    }
}

// ---------------------------------------------------------------------------------------
// The core side
// ---------------------------------------------------------------------------------------

pub(crate) enum Request {
    Snapshot {
        conns: bool,
        reply: mpsc::Sender<CoreSnapshot>,
    },
    CaptureStart {
        ring: Arc<CaptureRing>,
        reply: mpsc::Sender<bool>,
    },
    CaptureStop {
        port: u16,
        reply: mpsc::Sender<bool>,
    },
}

/// A core's mailbox for the control thread: requests in, answers through each request's
/// channel. The core reads `pending` when it publishes stats.
pub struct Probe {
    pending: AtomicBool,
    requests: ArrayQueue<Request>,
    gone: AtomicBool,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe")
            .field("pending", &self.pending.load(Ordering::Relaxed))
            .finish()
    }
}

impl Default for Probe {
    fn default() -> Self {
        Probe {
            pending: AtomicBool::new(false),
            requests: ArrayQueue::new(16),
            gone: AtomicBool::new(false),
        }
    }
}

impl Probe {
    /// Whether the control thread is waiting for this core (one relaxed load).
    #[inline]
    pub(crate) fn pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed)
    }

    /// The core has stopped: pending and future requests are dropped, which the control
    /// thread sees at once (their channels disconnect).
    pub(crate) fn retire(&self) {
        self.gone.store(true, Ordering::Release);
        while self.requests.pop().is_some() {}
    }

    fn submit(&self, r: Request) -> bool {
        if self.gone.load(Ordering::Acquire) || self.requests.push(r).is_err() {
            return false;
        }
        self.pending.store(true, Ordering::Release);
        // The core may have retired between the check and the push.
        if self.gone.load(Ordering::Acquire) {
            while self.requests.pop().is_some() {}
        }
        true
    }

    fn nudge(&self) {
        if !self.requests.is_empty() {
            self.pending.store(true, Ordering::Release);
        }
    }
}

/// Answers the control thread's requests on the core's thread (called when
/// [`Probe::pending`] is set, at a stats publication).
pub(crate) fn serve_core<D: Device>(
    probe: &Probe,
    st: &CoreState,
    devices: &[D],
    capture: &mut Option<CoreCapture>,
) {
    probe.pending.store(false, Ordering::Relaxed);
    while let Some(req) = probe.requests.pop() {
        match req {
            Request::Snapshot { conns, reply } => {
                let _ = reply.send(snapshot(st, devices, capture.as_ref(), conns));
            }
            Request::CaptureStart { ring, reply } => {
                let mine = devices.iter().any(|d| d.port() == ring.port());
                if mine {
                    *capture = Some(CoreCapture::new(ring, st.now.as_nanos()));
                }
                let _ = reply.send(mine);
            }
            Request::CaptureStop { port, reply } => {
                let had = capture.as_ref().is_some_and(|c| c.port() == port);
                if had {
                    *capture = None;
                }
                let _ = reply.send(had);
            }
        }
    }
    // Anything pushed while the queue was drained is answered at the next publication.
    probe.nudge();
}

/// RFC 9293's names of the states.
pub fn state_name(s: State) -> &'static str {
    match s {
        State::Closed => "CLOSED",
        State::SynSent => "SYN-SENT",
        State::SynReceived => "SYN-RECEIVED",
        State::Established => "ESTABLISHED",
        State::FinWait1 => "FIN-WAIT-1",
        State::FinWait2 => "FIN-WAIT-2",
        State::CloseWait => "CLOSE-WAIT",
        State::Closing => "CLOSING",
        State::LastAck => "LAST-ACK",
        State::TimeWait => "TIME-WAIT",
    }
}

fn stack_map(c: &StackCounters) -> BTreeMap<String, u64> {
    let mut m: BTreeMap<String, u64> = [
        ("frames_in", c.frames_in),
        ("frames_out", c.frames_out),
        ("burst_frames", c.burst_frames),
        ("coalesced_segments", c.coalesced_segments),
        ("arp_requests", c.arp_requests),
        ("arp_replies", c.arp_replies),
        ("arp_failures", c.arp_failures),
        ("unreachable_aborts", c.unreachable_aborts),
        ("icmp_echo_replies", c.icmp_echo_replies),
        ("pmtu_updates", c.pmtu_updates),
        ("icmp_aborts", c.icmp_aborts),
        ("rsts_sent", c.rsts_sent),
        ("active_opens", c.active_opens),
        ("passive_opens", c.passive_opens),
        ("syn_cookies_sent", c.syn_cookies_sent),
        ("syn_cookies_accepted", c.syn_cookies_accepted),
        ("time_wait_reuses", c.time_wait_reuses),
        ("listeners_opened", c.listeners_opened),
        ("drops", c.total_drops()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for (r, v) in StackDrop::ALL.iter().zip(c.drops) {
        m.insert(format!("drop_{}", r.name()), v);
    }
    m
}

fn tcp_map(c: &ConnCounters) -> BTreeMap<String, u64> {
    let mut m: BTreeMap<String, u64> = [
        ("segs_in", c.segs_in),
        ("segs_out", c.segs_out),
        ("bytes_in", c.bytes_in),
        ("bytes_out", c.bytes_out),
        ("retransmits", c.retransmits),
        ("rtos", c.rtos),
        ("fast_retransmits", c.fast_retransmits),
        ("sack_recoveries", c.sack_recoveries),
        ("challenge_acks", c.challenge_acks),
        ("challenge_acks_suppressed", c.challenge_acks_suppressed),
        ("oow_acks_suppressed", c.oow_acks_suppressed),
        ("dsacks", c.dsacks),
        ("sack_renegings", c.sack_renegings),
        ("spurious_recoveries", c.spurious_recoveries),
        ("window_probes", c.window_probes),
        ("keepalive_probes", c.keepalive_probes),
        ("tlp_probes", c.tlp_probes),
        ("rack_recoveries", c.rack_recoveries),
        ("rcv_collapsed", c.rcv_collapsed),
        ("rcv_collapsed_bytes", c.rcv_collapsed_bytes),
        ("rcv_pruned", c.rcv_pruned),
        ("fast_path_hits", c.fast_path_hits),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for (r, v) in DropReason::ALL.iter().zip(c.drops) {
        m.insert(format!("drop_{}", r.name()), v);
    }
    m
}

fn snapshot<D: Device>(
    st: &CoreState,
    devices: &[D],
    capture: Option<&CoreCapture>,
    with_conns: bool,
) -> CoreSnapshot {
    let stack = &st.stack;
    let mut states = BTreeMap::new();
    let mut conns = Vec::new();
    for (h, c) in stack.connections() {
        *states.entry(state_name(c.state()).to_string()).or_insert(0) += 1;
        if with_conns {
            let t = c.tuple();
            conns.push(ConnEntry {
                core: st.index,
                local: t.local.to_string(),
                remote: t.remote.to_string(),
                state: state_name(c.state()).to_string(),
                send_queue: (c.send_queued() + st.backlog_len(h)) as u64,
                recv_queue: c.recv_available() as u64,
                cwnd: u64::from(c.cwnd()),
                mss: u64::from(c.mss()),
                srtt_us: c.rtt().srtt().map(|d| d.as_micros() as u64),
                rto_us: c.rtt().rto().as_micros() as u64,
                retransmits: c.counters.retransmits,
                bytes_in: c.counters.bytes_in,
                bytes_out: c.counters.bytes_out,
            });
        }
    }
    let listeners = if with_conns {
        let ip = stack.ipv4();
        stack
            .listeners()
            .map(|l| ListenerEntry {
                core: st.index,
                local: format!("{ip}:{}", l.port),
                backlog: l.backlog as u64,
                half_open: l.half_open as u64,
                accept_queue: l.accept_queue as u64,
            })
            .collect()
    } else {
        Vec::new()
    };
    CoreSnapshot {
        core: st.index,
        answered: true,
        stats: BTreeMap::new(),
        stack: stack_map(stack.counters()),
        tcp: tcp_map(&stack.tcp_counters()),
        states,
        devices: devices.iter().map(Device::observe).collect(),
        capture: capture.map(CoreCapture::port),
        listeners,
        conns,
    }
}

// ---------------------------------------------------------------------------------------
// The control thread
// ---------------------------------------------------------------------------------------

/// A bound control socket, before its thread starts.
#[derive(Debug)]
pub(crate) struct ControlServer {
    listener: UnixListener,
    path: PathBuf,
    /// (dev, inode) of the socket file we created: removed at exit only if still ours.
    id: (u64, u64),
}

fn connect_refused(path: &Path) -> bool {
    matches!(
        UnixStream::connect(path),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

impl ControlServer {
    /// Binds `cfg.socket`, replacing a stale socket file (one nobody accepts on).
    pub(crate) fn bind(cfg: &ControlConfig) -> Result<ControlServer, ControlError> {
        let path = cfg.socket.clone();
        if path.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(ControlError::TooLong(path));
        }
        let bind_err = |source| ControlError::Bind {
            path: path.clone(),
            source,
        };
        let listener = match UnixListener::bind(&path) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                let meta = std::fs::symlink_metadata(&path).map_err(bind_err)?;
                if !meta.file_type().is_socket() {
                    return Err(ControlError::NotASocket(path));
                }
                if !connect_refused(&path) {
                    return Err(ControlError::InUse(path));
                }
                // A dead process's socket: nobody accepts on it.
                std::fs::remove_file(&path).map_err(bind_err)?;
                UnixListener::bind(&path).map_err(bind_err)?
            }
            Err(e) => return Err(bind_err(e)),
        };
        listener.set_nonblocking(true).map_err(bind_err)?;
        let meta = std::fs::metadata(&path).map_err(bind_err)?;
        Ok(ControlServer {
            listener,
            path,
            id: (meta.dev(), meta.ino()),
        })
    }

    /// Starts the control thread; it runs until `stop` is set.
    pub(crate) fn spawn(
        self,
        stop: Arc<AtomicBool>,
        cores: Vec<(Arc<Probe>, Arc<StatsCell>)>,
        slab: Option<zbuf::Slab>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("r2c-control".into())
            .spawn(move || {
                let mut state = Server {
                    cores,
                    slab,
                    captures: HashMap::new(),
                };
                while !stop.load(Ordering::Acquire) {
                    match self.listener.accept() {
                        Ok((s, _)) => state.session(s),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
                for (_, c) in state.captures.drain() {
                    let _ = c.writer.finish();
                }
                // Dropping `self` removes the socket file.
                drop(self);
            })
    }
}

impl Drop for ControlServer {
    /// Removes the socket file if it is still the one this server bound (a later process
    /// may have replaced it).
    fn drop(&mut self) {
        if std::fs::metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.id) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

struct ActiveCapture {
    writer: CaptureWriter,
    snaplen: u32,
    ring_frames: usize,
    cores: Vec<usize>,
}

struct Server {
    cores: Vec<(Arc<Probe>, Arc<StatsCell>)>,
    slab: Option<zbuf::Slab>,
    captures: HashMap<u16, ActiveCapture>,
}

/// Waits for `rx`, nudging the core's flag now and then; `None` if the core stopped or
/// timed out.
fn wait<T>(probe: &Probe, rx: &mpsc::Receiver<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + CORE_TIMEOUT;
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(v) => return Some(v),
            Err(mpsc::RecvTimeoutError::Disconnected) => return None,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if std::time::Instant::now() >= deadline || probe.gone.load(Ordering::Acquire) {
                    return None;
                }
                probe.nudge();
            }
        }
    }
}

impl Server {
    fn session(&mut self, s: UnixStream) {
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
        let mut line = String::new();
        let read = match s.try_clone() {
            Ok(r) => BufReader::new(r.take(MAX_REQUEST)).read_line(&mut line),
            Err(e) => Err(e),
        };
        let reply = match read {
            Ok(0) => return,
            Ok(_) if !line.ends_with('\n') => Reply::error(format!(
                "request longer than {MAX_REQUEST} bytes or not ended by a newline"
            )),
            Ok(_) => match serde_json::from_str::<Command>(line.trim()) {
                Ok(cmd) => self.handle(cmd),
                Err(e) => Reply::error(format!("bad request: {e}")),
            },
            Err(e) => Reply::error(format!("cannot read request: {e}")),
        };
        let mut out = serde_json::to_string(&reply)
            .unwrap_or_else(|e| format!("{{\"ok\":false,\"error\":\"encoding the reply: {e}\"}}"));
        out.push('\n');
        let mut s = s;
        let _ = s.write_all(out.as_bytes());
    }

    /// Answers one command (public to the crate for tests).
    fn handle(&mut self, cmd: Command) -> Reply {
        match cmd {
            Command::Stats => self.stats(false),
            Command::Conns => self.stats(true),
            Command::CaptureStart {
                port,
                file,
                snaplen,
                ring_frames,
            } => self.capture_start(port, file, snaplen, ring_frames),
            Command::CaptureStop { port } => self.capture_stop(port),
        }
    }

    fn stats(&mut self, conns: bool) -> Reply {
        let waits: Vec<_> = self
            .cores
            .iter()
            .map(|(probe, _)| {
                let (tx, rx) = mpsc::channel();
                probe.submit(Request::Snapshot { conns, reply: tx });
                rx
            })
            .collect();
        let mut cores = Vec::new();
        for (i, ((probe, cell), rx)) in self.cores.iter().zip(waits).enumerate() {
            let mut snap = wait(probe, &rx).unwrap_or(CoreSnapshot {
                core: i,
                ..CoreSnapshot::default()
            });
            snap.stats = cell
                .read()
                .fields()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            cores.push(snap);
        }
        let zbuf = self.slab.as_ref().map(|s| {
            let st = s.stats();
            ZbufSnapshot {
                zones: st.zones as u64,
                hugepage_zones: st.hugepage_zones as u64,
                mapped_bytes: st.mapped_bytes as u64,
                objects: st.classes.iter().map(|c| c.objects as u64).sum(),
                in_use: st.in_use() as u64,
                alloc_failures: st.alloc_failures(),
            }
        });
        Reply {
            ok: true,
            pid: std::process::id(),
            cores,
            zbuf,
            ..Reply::default()
        }
    }

    fn capture_start(
        &mut self,
        port: u16,
        file: PathBuf,
        snaplen: Option<u32>,
        ring_frames: Option<usize>,
    ) -> Reply {
        let snaplen = snaplen.unwrap_or(DEFAULT_SNAPLEN);
        let ring_frames = ring_frames.unwrap_or(DEFAULT_RING_FRAMES);
        if !(1..=crate::capture::MAX_SNAPLEN).contains(&snaplen) {
            return Reply::error(format!(
                "snaplen {snaplen} is out of range; use 1..={}",
                crate::capture::MAX_SNAPLEN
            ));
        }
        if !(1..=crate::capture::MAX_RING_FRAMES).contains(&ring_frames) {
            return Reply::error(format!(
                "ring-frames {ring_frames} is out of range; use 1..={}",
                crate::capture::MAX_RING_FRAMES
            ));
        }
        if file.as_os_str().is_empty() {
            return Reply::error("no capture file given");
        }
        if let Some(c) = self.captures.get(&port) {
            return Reply::error(format!(
                "port {port} is already being captured into {}; stop that capture first",
                c.writer.path().display()
            ));
        }
        let ring = Arc::new(CaptureRing::new(port, snaplen, ring_frames));
        let writer = match CaptureWriter::start(Arc::clone(&ring), file.clone()) {
            Ok(w) => w,
            Err(e) => return Reply::error(e.to_string()),
        };
        let mut cores = Vec::new();
        let mut ports = Vec::new();
        let waits: Vec<_> = self
            .cores
            .iter()
            .map(|(probe, _)| {
                let (tx, rx) = mpsc::channel();
                probe.submit(Request::CaptureStart {
                    ring: Arc::clone(&ring),
                    reply: tx,
                });
                rx
            })
            .collect();
        for (i, ((probe, _), rx)) in self.cores.iter().zip(waits).enumerate() {
            if wait(probe, &rx) == Some(true) {
                cores.push(i);
            }
        }
        if cores.is_empty() {
            let _ = writer.finish();
            let _ = std::fs::remove_file(&file);
            ports.extend(self.known_ports());
            return Reply::error(format!(
                "no running core of this process polls port {port} (ports polled: {ports:?})"
            ));
        }
        self.captures.insert(
            port,
            ActiveCapture {
                writer,
                snaplen,
                ring_frames,
                cores: cores.clone(),
            },
        );
        Reply {
            ok: true,
            pid: std::process::id(),
            capture: Some(CaptureReply {
                port,
                file,
                snaplen,
                ring_frames,
                cores,
                stats: None,
            }),
            ..Reply::default()
        }
    }

    /// Ports of the cores' devices (for an error message).
    fn known_ports(&mut self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .stats(false)
            .cores
            .iter()
            .flat_map(|c| c.devices.iter().map(|d| d.port))
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    fn capture_stop(&mut self, port: u16) -> Reply {
        let Some(c) = self.captures.remove(&port) else {
            return Reply::error(format!("no capture of port {port} is running"));
        };
        let waits: Vec<_> = self
            .cores
            .iter()
            .map(|(probe, _)| {
                let (tx, rx) = mpsc::channel();
                probe.submit(Request::CaptureStop { port, reply: tx });
                rx
            })
            .collect();
        for ((probe, _), rx) in self.cores.iter().zip(waits) {
            // A core that stopped pushes nothing any more either way.
            let _ = wait(probe, &rx);
        }
        let file = c.writer.path().to_path_buf();
        match c.writer.finish() {
            Ok(stats) => Reply {
                ok: true,
                pid: std::process::id(),
                capture: Some(CaptureReply {
                    port,
                    file,
                    snaplen: c.snaplen,
                    ring_frames: c.ring_frames,
                    cores: c.cores,
                    stats: Some(stats),
                }),
                ..Reply::default()
            },
            Err(e) => Reply::error(e.to_string()),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The client (lunactl)
// ---------------------------------------------------------------------------------------

/// Why a request to a control socket failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing at the path.
    #[error("no control socket at {0}: is the luna process running, with [control] socket = \"{0}\" in its config?")]
    NoSocket(PathBuf),
    /// A socket file nobody accepts on.
    #[error("control socket {0} exists but no process answers on it (the process has exited; its stale socket is replaced when it restarts)")]
    Dead(PathBuf),
    /// Other I/O errors.
    #[error("control socket {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The answer was not a reply.
    #[error("control socket {path}: unreadable reply: {problem}")]
    BadReply {
        /// The path.
        path: PathBuf,
        /// What was wrong.
        problem: String,
    },
    /// The process answered with an error.
    #[error("{0}")]
    Refused(String),
}

/// Sends one command to the control socket at `path` and returns the reply (an error
/// reply becomes [`ClientError::Refused`]).
pub fn request(path: &Path, cmd: &Command, timeout: Duration) -> Result<Reply, ClientError> {
    let io = |source: std::io::Error| ClientError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut s = match UnixStream::connect(path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ClientError::NoSocket(path.to_path_buf()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return Err(ClientError::Dead(path.to_path_buf()))
        }
        Err(e) => return Err(io(e)),
    };
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    let mut line = serde_json::to_string(cmd).map_err(|e| ClientError::BadReply {
        path: path.to_path_buf(),
        problem: e.to_string(),
    })?;
    line.push('\n');
    s.write_all(line.as_bytes()).map_err(io)?;
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer).map_err(io)?;
    let reply: Reply = serde_json::from_str(answer.trim()).map_err(|e| ClientError::BadReply {
        path: path.to_path_buf(),
        problem: e.to_string(),
    })?;
    if !reply.ok {
        return Err(ClientError::Refused(
            reply
                .error
                .unwrap_or_else(|| "the process refused the command".into()),
        ));
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_have_a_stable_json_form() {
        let c: Command = serde_json::from_str(r#"{"cmd":"stats"}"#).unwrap();
        assert_eq!(c, Command::Stats);
        let c: Command =
            serde_json::from_str(r#"{"cmd":"capture_start","port":1,"file":"/tmp/x.pcapng"}"#)
                .unwrap();
        assert_eq!(
            c,
            Command::CaptureStart {
                port: 1,
                file: "/tmp/x.pcapng".into(),
                snaplen: None,
                ring_frames: None
            }
        );
        assert_eq!(
            serde_json::to_string(&Command::CaptureStop { port: 2 }).unwrap(),
            r#"{"cmd":"capture_stop","port":2}"#
        );
        assert!(serde_json::from_str::<Command>(r#"{"cmd":"reboot"}"#).is_err());
    }

    #[test]
    fn replies_round_trip_and_omit_empty_parts() {
        let mut r = Reply {
            ok: true,
            pid: 7,
            ..Reply::default()
        };
        let mut core = CoreSnapshot {
            core: 0,
            answered: true,
            ..CoreSnapshot::default()
        };
        core.stats.insert("accepted".into(), 3);
        core.conns.push(ConnEntry {
            core: 0,
            local: "198.18.0.1:7".into(),
            remote: "198.18.0.2:61440".into(),
            state: "ESTABLISHED".into(),
            send_queue: 0,
            recv_queue: 0,
            cwnd: 14600,
            mss: 1460,
            srtt_us: Some(40),
            rto_us: 5000,
            retransmits: 0,
            bytes_in: 10,
            bytes_out: 10,
        });
        r.cores.push(core);
        let text = serde_json::to_string(&r).unwrap();
        assert!(!text.contains("\"error\""), "{text}");
        assert!(!text.contains("\"listeners\""), "{text}");
        assert!(text.contains(r#""stats":{"accepted":3}"#), "{text}");
        let back: Reply = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        let e = serde_json::to_value(Reply::error("boom")).unwrap();
        assert_eq!(e["ok"], false);
        assert_eq!(e["error"], "boom");
    }

    #[test]
    fn a_second_bind_is_refused_and_a_stale_socket_replaced() {
        let dir = std::env::temp_dir().join(format!("r2c-ctl-unit-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("a.sock");
        let _ = std::fs::remove_file(&path);
        let cfg = ControlConfig::new(&path);
        let first = ControlServer::bind(&cfg).unwrap();
        let e = ControlServer::bind(&cfg).unwrap_err();
        assert!(matches!(e, ControlError::InUse(_)), "{e}");
        assert!(e.to_string().contains("in use"), "{e}");
        drop(first);
        assert!(!path.exists(), "a server removes its socket file");
        // A process that died leaves its socket file: bound, nobody accepting.
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let again = ControlServer::bind(&cfg).unwrap();
        drop(again);
        assert!(!path.exists());
        let plain = dir.join("plain");
        std::fs::write(&plain, b"x").unwrap();
        let e = ControlServer::bind(&ControlConfig::new(&plain)).unwrap_err();
        assert!(matches!(e, ControlError::NotASocket(_)), "{e}");
        assert_eq!(
            std::fs::read(&plain).unwrap(),
            b"x",
            "a regular file is never removed"
        );
        let long = dir.join("x".repeat(120));
        assert!(matches!(
            ControlServer::bind(&ControlConfig::new(long)).unwrap_err(),
            ControlError::TooLong(_)
        ));
        let e = ControlServer::bind(&ControlConfig::new("/nonexistent-dir/s.sock")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent-dir/s.sock"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn client_errors_name_the_missing_and_the_dead_socket() {
        let dir = std::env::temp_dir().join(format!("r2c-ctl-client-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("gone.sock");
        let _ = std::fs::remove_file(&path);
        let e = request(&path, &Command::Stats, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, ClientError::NoSocket(_)), "{e}");
        drop(UnixListener::bind(&path).unwrap());
        let e = request(&path, &Command::Stats, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, ClientError::Dead(_)), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
