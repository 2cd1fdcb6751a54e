//! The interpreter: runs a parsed script against one `luna_stack::stack::Stack` on virtual
//! time.
//!
//! luna plays packetdrill's "local" host (198.18.0.1); the script plays the remote peer
//! (198.18.0.2). Inbound packets are real frames with correct checksums handed to
//! `handle_frame`; whatever `poll_transmit` emits is queued with the virtual time it left
//! and must be claimed, in order, by `>` lines within the tolerance. System calls map onto
//! the Stack's socket API.
//!
//! Sequence numbers follow packetdrill's convention: the peer's numbers are written as they
//! are on the wire, luna's relative to its ISN as the script's first `>` SYN (or SYN-ACK)
//! of the flow states it (usually 0). Timestamp values luna sends are likewise learned
//! from the first one the script expects, and echoes (`ecr`) the script injects are mapped
//! back.

use super::packet::{self, Ends, Segment};
use super::script::{
    flag, Arg, Direction, Event, EventKind, Opt, OptionSpec, PacketSpec, Result, Script,
    ScriptError, Syscall, Time,
};
use luna_stack::stack::{
    ConnectError, ListenError, ListenerHandle, RecvError, SendError, SocketHandle, Stack,
    StackConfig,
};
use luna_stack::tcp::config::{CcAlgorithm, KeepaliveConfig};
use luna_stack::tcp::{CloseReason, State};
use luna_stack::testutil::{pattern, stack_config, FakeRng, IP_A, IP_B, MAC_A, MAC_B};
use luna_stack::time::{Duration, Instant};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddrV4;
use zbuf::Zbuf;

mod icmp;
mod options;
mod shell;
mod sockopt;
mod sysctl;

pub use options::RunOptions;
pub use shell::split as split_shell;

/// luna's port for `bind`/`listen`, and the peer's port `connect` dials (packetdrill's 8080).
pub const LUNA_PORT: u16 = 8080;
/// The peer's port in passive scripts unless `rport` says otherwise.
pub const PEER_PORT: u16 = 40000;
/// How far `*` lets virtual time run looking for a packet.
const ANY_TIME_LIMIT: Duration = Duration::from_secs(600);
/// A timer that fires this often without virtual time moving is a luna bug (a busy loop).
const MAX_TIMER_REPEATS: u32 = 10_000;
/// Frames one call may emit before the runner calls it a transmit storm.
const MAX_BURST: usize = 100_000;
/// Scripts end within an hour of virtual time (bounds the timer loop of a mangled script).
const MAX_SCRIPT_TIME_US: u64 = 3_600_000_000;
/// Largest write/read one system call may ask for.
const MAX_IO: usize = 16 << 20;
/// Largest payload of an injected segment (one IPv4 datagram with a full TCP header).
const MAX_PAYLOAD: u32 = 65_535 - 20 - 60;

/// What a passing run did.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub events: usize,
    pub frames_in: u64,
    pub frames_out: u64,
    /// Virtual time at the end.
    pub end: Instant,
}

/// Linux errno numbers for the names scripts use.
const ERRNOS: &[(&str, i64)] = &[
    ("EPERM", 1),
    ("EBADF", 9),
    ("EAGAIN", 11),
    ("EWOULDBLOCK", 11),
    ("ENOMEM", 12),
    ("EINVAL", 22),
    ("EPIPE", 32),
    ("ENOPROTOOPT", 92),
    ("EOPNOTSUPP", 95),
    ("EADDRINUSE", 98),
    ("EADDRNOTAVAIL", 99),
    ("ENETUNREACH", 101),
    ("ECONNABORTED", 103),
    ("ECONNRESET", 104),
    ("ENOBUFS", 105),
    ("EISCONN", 106),
    ("ENOTCONN", 107),
    ("ETIMEDOUT", 110),
    ("ECONNREFUSED", 111),
    ("EALREADY", 114),
    ("EINPROGRESS", 115),
];

fn errno_num(name: &str) -> Option<i64> {
    ERRNOS.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
}

fn errno_name(num: i64) -> &'static str {
    ERRNOS
        .iter()
        .find(|(n, v)| *v == num && *n != "EWOULDBLOCK")
        .map_or("E?", |&(n, _)| n)
}

/// A system call's result: a return value and, for -1, an errno.
type Ret = (i64, Option<i64>);

fn ok(v: i64) -> Ret {
    (v, None)
}

fn fail(errno: &str) -> Ret {
    (
        -1,
        Some(errno_num(errno).expect("errno table covers the runner's names")),
    )
}

fn show_ret(r: Ret) -> String {
    match r.1 {
        Some(e) => format!("-1 {}", errno_name(e)),
        None => r.0.to_string(),
    }
}

/// The errno a closed connection reports (Linux's sk_err for each way of ending).
fn reason_errno(r: Option<CloseReason>) -> Option<&'static str> {
    match r? {
        CloseReason::Reset => Some("ECONNRESET"),
        CloseReason::Refused => Some("ECONNREFUSED"),
        CloseReason::Timeout => Some("ETIMEDOUT"),
        CloseReason::Aborted => Some("ECONNABORTED"),
        CloseReason::HostUnreachable => Some("EHOSTUNREACH"),
        CloseReason::Normal => None,
    }
}

fn state_name(s: Option<State>) -> &'static str {
    match s {
        None | Some(State::Closed) => "TCP_CLOSE",
        Some(State::SynSent) => "TCP_SYN_SENT",
        Some(State::SynReceived) => "TCP_SYN_RECV",
        Some(State::Established) => "TCP_ESTABLISHED",
        Some(State::FinWait1) => "TCP_FIN_WAIT1",
        Some(State::FinWait2) => "TCP_FIN_WAIT2",
        Some(State::CloseWait) => "TCP_CLOSE_WAIT",
        Some(State::Closing) => "TCP_CLOSING",
        Some(State::LastAck) => "TCP_LAST_ACK",
        Some(State::TimeWait) => "TCP_TIME_WAIT",
    }
}

#[derive(Debug, Clone, Copy)]
enum FdKind {
    Socket,
    Listener(ListenerHandle),
    Conn(SocketHandle),
}

#[derive(Debug, Clone)]
struct Fd {
    kind: FdKind,
    nonblocking: bool,
    bound: Option<u16>,
    /// The connection's (luna port, peer port).
    flow: Option<(u16, u16)>,
}

/// Per (luna port, peer port): the numbering the script uses and the byte streams.
#[derive(Debug, Clone, Default)]
struct Flow {
    /// luna's actual ISN minus the script's, once a `>` SYN or SYN-ACK was matched.
    isn_off: Option<u32>,
    /// luna's actual ISN (its data starts one after it).
    luna_isn: Option<u32>,
    /// luna's actual TSval minus the script's, once a `>` with a TS option was matched.
    ts_off: Option<u32>,
    /// The peer's ISN (the first `<` SYN or SYN-ACK of the flow).
    peer_isn: Option<u32>,
    /// Bytes the script wrote into luna / read out of luna.
    written: u64,
    read: u64,
}

/// Stream contents: bytes the peer sends luna and bytes luna sends the peer differ.
fn salt(flow: (u16, u16), from_peer: bool) -> u64 {
    (u64::from(flow.0) << 17) | (u64::from(flow.1) << 1) | u64::from(from_peer)
}

/// A blocking call waiting to return.
#[derive(Debug, Clone)]
enum Wait {
    Accept { fd: i64 },
    Connect { fd: i64 },
    Read { fd: i64, max: usize },
    Write { fd: i64, left: usize, done: usize },
}

#[derive(Debug, Clone)]
struct Pending {
    line: usize,
    wait: Wait,
    /// When the script says it returns (script µs).
    end: u64,
    expect: Ret,
    name: String,
}

/// Keepalive as the socket options describe it (Linux defaults until set).
#[derive(Debug, Clone, Copy)]
pub struct KeepaliveOpts {
    on: bool,
    idle: Duration,
    interval: Duration,
    probes: u32,
}

struct Runner {
    ends: Ends,
    tol: u64,
    ts_tick: Option<u64>,
    seed: u64,
    cfg: StackConfig,
    keepalive: KeepaliveOpts,
    stack: Option<Stack<FakeRng>>,
    now: Instant,
    /// Script time of the previous event (µs).
    prev: u64,
    fds: BTreeMap<i64, Fd>,
    flows: HashMap<(u16, u16), Flow>,
    default_flow: (u16, u16),
    outq: VecDeque<(Instant, Vec<u8>)>,
    pending: Option<Pending>,
    line: usize,
    out: Outcome,
    /// `LPD_TRACE=1`: print every packet in and out to stderr.
    trace: bool,
    opts: RunOptions,
    sysctls: sysctl::SysctlState,
    /// Every connection an fd named (accepted or connected), for state checks.
    known: Vec<SocketHandle>,
    sockopts: HashMap<i64, sockopt::FdOpts>,
}

fn us(t: Instant) -> u64 {
    t.as_micros()
}

fn at(us: u64) -> Instant {
    Instant::from_micros(us)
}

fn fmt_time(t: Instant) -> String {
    let n = t.as_nanos();
    format!("{}.{:06}", n / 1_000_000_000, (n / 1_000) % 1_000_000)
}

/// Run a parsed script with the stack's RNG seeded by `seed` and the run's options (profile, peer, lenient matching).
pub fn run_with(script: &Script, seed: u64, opts: &RunOptions) -> Result<Outcome> {
    let mut r = Runner::new(seed);
    r.cfg.tcp.delayed_ack = opts.peer.delayed_ack();
    r.opts = opts.clone();
    r.apply_options(script)?;
    for ev in &script.events {
        r.line = ev.line;
        r.event(ev)?;
        r.out.events += 1;
    }
    r.finish()?;
    r.out.end = r.now;
    Ok(r.out)
}

fn parse_bool(line: usize, name: &str, v: &str) -> Result<bool> {
    match v {
        "1" | "true" | "on" => Ok(true),
        "0" | "false" | "off" => Ok(false),
        _ => Err(ScriptError::new(
            line,
            format!("--{name} takes 0 or 1, not `{v}`"),
        )),
    }
}

fn parse_num<T: std::str::FromStr>(line: usize, name: &str, v: &str) -> Result<T> {
    v.parse()
        .map_err(|_| ScriptError::new(line, format!("--{name}: bad number `{v}`")))
}

fn ms(line: usize, name: &str, v: &str) -> Result<Duration> {
    Ok(Duration::from_millis(parse_num(line, name, v)?))
}

impl Runner {
    fn new(seed: u64) -> Self {
        Runner {
            ends: Ends {
                luna_mac: MAC_A,
                peer_mac: MAC_B,
                luna_ip: IP_A,
                peer_ip: IP_B,
            },
            tol: 4_000,
            ts_tick: None,
            seed,
            cfg: stack_config(MAC_A, IP_A),
            keepalive: KeepaliveOpts {
                on: false,
                idle: Duration::from_secs(7200),
                interval: Duration::from_secs(75),
                probes: 9,
            },
            stack: None,
            now: Instant::ZERO,
            prev: 0,
            fds: BTreeMap::new(),
            flows: HashMap::new(),
            default_flow: (LUNA_PORT, PEER_PORT),
            outq: VecDeque::new(),
            pending: None,
            line: 0,
            out: Outcome::default(),
            trace: std::env::var_os("LPD_TRACE").is_some(),
            opts: RunOptions::default(),
            sysctls: sysctl::SysctlState::default(),
            known: Vec::new(),
            sockopts: HashMap::new(),
        }
    }

    fn err<T>(&self, msg: impl Into<String>) -> Result<T> {
        Err(ScriptError::new(self.line, msg))
    }

    // -----------------------------------------------------------------------------------
    // Header options
    // -----------------------------------------------------------------------------------

    fn apply_options(&mut self, script: &Script) -> Result<()> {
        for (line, name, v) in &script.options {
            let (line, n, v) = (*line, name.as_str(), v.as_str());
            let tcp = &mut self.cfg.tcp;
            match n {
                "tolerance_usecs" => self.tol = parse_num(line, n, v)?,
                "tcp_ts_tick_usecs" => {
                    let t: u64 = parse_num(line, n, v)?;
                    if t == 0 {
                        return Err(ScriptError::new(
                            line,
                            "--tcp_ts_tick_usecs must be positive",
                        ));
                    }
                    self.ts_tick = Some(t);
                }
                "ip_version" if v == "ipv4" => {}
                "ip_version" => {
                    return Err(ScriptError::skip(
                        line,
                        format!("--ip_version={v}: IPv4 only (luna has no IPv6)"),
                    ))
                }
                "mtu" | "luna_mtu" => self.cfg.mtu = parse_num(line, n, v)?,
                "luna_mss" => tcp.mss = parse_num(line, n, v)?,
                "luna_rcv_buf" => tcp.rcv_buf = parse_num(line, n, v)?,
                "luna_snd_buf" => tcp.snd_buf = parse_num(line, n, v)?,
                "luna_window_scaling" => tcp.window_scaling = parse_bool(line, n, v)?,
                "luna_timestamps" => tcp.timestamps = parse_bool(line, n, v)?,
                "luna_sack" => tcp.sack = parse_bool(line, n, v)?,
                "luna_nagle" => tcp.nagle = parse_bool(line, n, v)?,
                "luna_delayed_ack_ms" => {
                    let d = ms(line, n, v)?;
                    tcp.delayed_ack = (!d.is_zero()).then_some(d);
                }
                "luna_rack" => tcp.rack = parse_bool(line, n, v)?,
                "luna_tlp_ack_delay_ms" => tcp.tlp_ack_delay = ms(line, n, v)?,
                "luna_tlp_ms" => {
                    let d = ms(line, n, v)?;
                    tcp.tlp = (!d.is_zero()).then_some(d);
                }
                "luna_cc" => {
                    tcp.cc = match v {
                        "newreno" => CcAlgorithm::NewReno,
                        "cubic" => CcAlgorithm::Cubic,
                        _ => {
                            return Err(ScriptError::new(line, "--luna_cc takes newreno or cubic"))
                        }
                    }
                }
                "luna_initial_cwnd" => {
                    tcp.cc_config.initial_window =
                        luna_stack::tcp::cc::InitialWindow::Segments(parse_num(line, n, v)?)
                }
                "luna_initial_rto_ms" => tcp.rtt.initial_rto = ms(line, n, v)?,
                "luna_min_rto_ms" => tcp.rtt.min_rto = ms(line, n, v)?,
                "luna_max_rto_ms" => tcp.rtt.max_rto = ms(line, n, v)?,
                "luna_syn_retries" => tcp.syn_retries = parse_num(line, n, v)?,
                "luna_max_retries" => tcp.max_retries = parse_num(line, n, v)?,
                "luna_time_wait_ms" => tcp.time_wait = ms(line, n, v)?,
                "luna_fin_timeout_ms" => tcp.fin_timeout = ms(line, n, v)?,
                "luna_challenge_ack_limit" => tcp.challenge_ack_limit = parse_num(line, n, v)?,
                "luna_oow_ack_interval_ms" => tcp.oow_ack_interval = ms(line, n, v)?,
                "luna_time_wait_reopen_by_seq" => {
                    tcp.time_wait_reopen_by_seq = parse_bool(line, n, v)?
                }
                "luna_syn_cookies" => {
                    use luna_stack::stack::SynCookieMode;
                    self.cfg.syn_cookies = match v {
                        "0" => SynCookieMode::Off,
                        "1" => SynCookieMode::WhenFull,
                        "2" => SynCookieMode::Always,
                        _ => {
                            return Err(ScriptError::new(
                                line,
                                format!("--{n} takes 0, 1 or 2 (as tcp_syncookies), not `{v}`"),
                            ))
                        }
                    }
                }
                _ => self.upstream_option(line, n, v)?,
            }
        }
        Ok(())
    }

    /// The stack is built at the first event that needs it, so that socket options set
    /// before `listen`/`connect` can still shape its `TcpConfig` (luna has no per-socket
    /// options).
    fn stack(&mut self) -> Result<&mut Stack<FakeRng>> {
        if self.stack.is_none() {
            let mut cfg = self.cfg.clone();
            if self.keepalive.on {
                cfg.tcp.keepalive = Some(KeepaliveConfig {
                    idle: self.keepalive.idle,
                    interval: self.keepalive.interval,
                    probes: self.keepalive.probes,
                });
            }
            let mut s = match Stack::new(cfg, FakeRng::new(self.seed)) {
                Ok(s) => s,
                Err(e) => return self.err(format!("luna rejected the configuration: {e}")),
            };
            if s.neighbours_mut()
                .insert_permanent(self.ends.peer_ip, self.ends.peer_mac)
                .is_err()
            {
                return self.err("could not add the peer to luna's neighbour table");
            }
            self.stack = Some(s);
        }
        Ok(self.stack.as_mut().expect("just built"))
    }

    // -----------------------------------------------------------------------------------
    // Time
    // -----------------------------------------------------------------------------------

    fn script_time(&self, t: Time) -> Result<Option<u64>> {
        let t = self.bounded(t)?;
        match t {
            Time::Any => Ok(None),
            Time::Rel(d) => Ok(Some(self.prev + d)),
            Time::Abs(a) if a < self.prev => self.err(format!(
                "absolute time {} is before the previous event ({})",
                fmt_time(at(a)),
                fmt_time(at(self.prev))
            )),
            Time::Abs(a) => Ok(Some(a)),
        }
    }

    fn bounded(&self, t: Time) -> Result<Time> {
        let abs = match t {
            Time::Any => return Ok(t),
            Time::Rel(d) => self.prev.saturating_add(d),
            Time::Abs(a) => a,
        };
        if abs > MAX_SCRIPT_TIME_US {
            return self.err("event times beyond 3600 s are not supported");
        }
        Ok(t)
    }

    /// Everything luna has to send now goes to the queue; a blocking call may return.
    fn drain(&mut self) -> Result<()> {
        loop {
            let now = self.now;
            let mut n = 0;
            loop {
                let Some(stack) = self.stack.as_mut() else {
                    return Ok(());
                };
                let Some(t) = stack.poll_transmit(now) else {
                    break;
                };
                let frame = t.to_vec();
                if self.trace {
                    eprintln!("  luna > {}", self.show_actual(now, &frame));
                }
                self.outq.push_back((now, frame));
                self.out.frames_out += 1;
                n += 1;
                if n > MAX_BURST {
                    return self.err(format!(
                        "luna emitted more than {MAX_BURST} frames at {} without input",
                        fmt_time(now)
                    ));
                }
            }
            if let Some(stack) = self.stack.as_mut() {
                while stack.poll_event().is_some() {}
            }
            if !self.try_complete()? {
                return Ok(());
            }
        }
    }

    /// Run luna's timers up to `limit`; with `stop_on_output`, stop at the first frame.
    fn run_until(&mut self, limit: Instant, stop_on_output: bool) -> Result<()> {
        self.run_timers(limit, |r| stop_on_output && !r.outq.is_empty())
    }

    /// Run luna's timers up to `limit` or until `done`; then move the clock to `limit`
    /// unless `done`.
    fn run_timers(&mut self, limit: Instant, done: impl Fn(&Self) -> bool) -> Result<()> {
        let mut repeats = 0u32;
        let mut last = None;
        loop {
            if done(self) {
                return Ok(());
            }
            let Some(stack) = self.stack.as_mut() else {
                break;
            };
            let Some(t) = stack.poll_timeout().filter(|&t| t <= limit) else {
                break;
            };
            self.check_pending_deadline(t)?;
            let t = t.max(self.now);
            if last == Some(t) {
                repeats += 1;
                if repeats > MAX_TIMER_REPEATS {
                    return self.err(format!(
                        "luna's timer keeps firing at {} without progress",
                        fmt_time(t)
                    ));
                }
            } else {
                repeats = 0;
                last = Some(t);
            }
            self.now = t;
            self.stack
                .as_mut()
                .expect("checked above")
                .handle_timeouts(t);
            self.drain()?;
        }
        if done(self) {
            return Ok(());
        }
        self.check_pending_deadline(limit)?;
        self.now = self.now.max(limit);
        self.drain()
    }

    // -----------------------------------------------------------------------------------
    // Events
    // -----------------------------------------------------------------------------------

    fn event(&mut self, ev: &Event) -> Result<()> {
        let start = self.script_time(ev.time)?;
        match &ev.kind {
            EventKind::Packet(p) if p.dir == Direction::Outbound => {
                let when = self.expect_packet(p, start)?;
                self.prev = start.unwrap_or(when);
            }
            EventKind::Packet(p) => {
                let t = start.expect("inbound packets have a time");
                self.prev = t;
                self.stack()?;
                self.run_until(at(t), false)?;
                self.check_unexpected(t)?;
                self.inject(p)?;
            }
            EventKind::Syscall(sc) => {
                let t = start.expect("system calls have a time");
                self.prev = t;
                let end = match ev.end {
                    None => None,
                    Some(Time::Abs(e)) if e > MAX_SCRIPT_TIME_US => {
                        return self.err("event times beyond 3600 s are not supported")
                    }
                    Some(Time::Abs(e)) => Some(e),
                    Some(Time::Rel(d)) if t.saturating_add(d) > MAX_SCRIPT_TIME_US => {
                        return self.err("event times beyond 3600 s are not supported")
                    }
                    Some(Time::Rel(d)) => Some(t + d),
                    Some(Time::Any) => unreachable!("the parser refuses `*` ranges"),
                };
                if end.is_some_and(|e| e < t) {
                    return self.err("the blocking call's end is before its start");
                }
                self.run_until(at(t), false)?;
                self.check_unexpected(t)?;
                self.syscall(sc, end)?;
            }
            EventKind::Shell(_) | EventKind::Python(_) | EventKind::Icmp(_) => {
                self.upstream_event(ev, start)?
            }
        }
        Ok(())
    }

    /// Events only other stacks' scripts use: shell commands, python blocks, ICMP.
    fn upstream_event(&mut self, ev: &Event, start: Option<u64>) -> Result<()> {
        if let EventKind::Python(code) = &ev.kind {
            // packetdrill evaluates these after the run, mostly `assert tcpi_...`: the
            // script's verdict depends on them, so it is skipped rather than passed.
            let first = code.lines().next().unwrap_or("").trim();
            return Err(ScriptError::skip(
                self.line,
                format!(
                    "python blocks (%{{ }}%) are not evaluated (`{first}`); use \
                     getsockopt(TCP_INFO, {{tcpi_...}})"
                ),
            ));
        }
        let t = start.expect("shell and icmp lines have a time");
        self.prev = t;
        if self.stack.is_some() {
            self.run_until(at(t), false)?;
            self.check_unexpected(t)?;
        } else {
            self.now = self.now.max(at(t));
        }
        match &ev.kind {
            EventKind::Shell(cmd) => self.shell(cmd),
            EventKind::Icmp(spec) => {
                self.stack()?;
                self.icmp(spec)
            }
            _ => unreachable!("only upstream events get here"),
        }
    }

    fn finish(&mut self) -> Result<()> {
        if let Some(p) = self.pending.clone() {
            self.run_timers(at(p.end + self.tol), |r| r.pending.is_none())?;
            if let Some(p) = &self.pending {
                self.line = p.line;
                return self.err(format!(
                    "{} was still blocked at the end of the script (expected to return at {})",
                    p.name,
                    fmt_time(at(p.end))
                ));
            }
        }
        if let Some((t, frame)) = self.outq.front() {
            let d = self.show_actual(*t, frame);
            return self.err(format!(
                "unexpected packet after the last event (the script must expect every packet \
                 luna sends):\n  actual packet: {d}"
            ));
        }
        Ok(())
    }

    /// A queued frame the script had its chance to claim, and did not, is unexpected.
    fn check_unexpected(&self, t: u64) -> Result<()> {
        if let Some((sent, frame)) = self.outq.front() {
            if us(*sent) + self.tol < t {
                return self.err(format!(
                    "unexpected packet (luna sent it before this line and no `>` line claimed \
                     it):\n  actual packet: {}",
                    self.show_actual(*sent, frame)
                ));
            }
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------
    // Packets
    // -----------------------------------------------------------------------------------

    fn flow_ports(&self, p: &PacketSpec) -> (u16, u16) {
        (
            p.lport.unwrap_or(self.default_flow.0),
            p.rport.unwrap_or(self.default_flow.1),
        )
    }

    fn inject(&mut self, p: &PacketSpec) -> Result<()> {
        if p.len > MAX_PAYLOAD {
            return self.err(format!(
                "a payload of {} bytes does not fit one IPv4 packet (at most {MAX_PAYLOAD})",
                p.len
            ));
        }
        let ports = self.flow_ports(p);
        let flow = self.flows.entry(ports).or_default();
        if p.flags & flag::SYN != 0 && flow.peer_isn.is_none() {
            // Until luna answers: its SYN-ACK (or its SYN for an active open) settles it.
            flow.peer_isn = Some(p.seq);
        }
        let isn_off = flow.isn_off.unwrap_or(0);
        let ts_off = flow.ts_off.unwrap_or(0);
        let peer_isn = flow.peer_isn.unwrap_or(0);
        let options = match &p.options {
            None => Vec::new(),
            Some(OptionSpec::Any) => unreachable!("the parser refuses <...> inbound"),
            Some(OptionSpec::List(l)) => l
                .iter()
                .map(|o| match o {
                    // RFC 7323 §3.2: TSecr is meaningful only with ACK; then it echoes a
                    // luna TSval, written in the script's numbering.
                    Opt::Ts { val, ecr } if p.flags & flag::ACK != 0 => Opt::Ts {
                        val: *val,
                        ecr: ecr.wrapping_add(ts_off),
                    },
                    Opt::Sack(b) => Opt::Sack(
                        b.iter()
                            .map(|(l, r)| (l.wrapping_add(isn_off), r.wrapping_add(isn_off)))
                            .collect(),
                    ),
                    o => o.clone(),
                })
                .collect(),
        };
        let stream_off = p.seq.wrapping_sub(peer_isn.wrapping_add(1));
        let seg = Segment {
            src_port: ports.1,
            dst_port: ports.0,
            seq: p.seq,
            ack: p.ack.map_or(0, |a| a.wrapping_add(isn_off)),
            flags: p.flags,
            win: p.win.unwrap_or(0),
            urg: p.urg.unwrap_or(0),
            options,
            payload: pattern(salt(ports, true), u64::from(stream_off), p.len as usize),
        };
        let frame = match packet::build_inbound(&self.ends, &seg) {
            Ok(f) => f,
            Err(e) => return self.err(e),
        };
        let now = self.now;
        if self.trace {
            eprintln!(
                "line {:>3}: < {}",
                self.line,
                self.show_spec(p, Some(us(now)))
            );
        }
        self.stack()?.handle_frame(now, Zbuf::from_vec(frame));
        self.out.frames_in += 1;
        self.drain()
    }

    fn show_spec(&self, p: &PacketSpec, t: Option<u64>) -> String {
        let time = t.map_or("*".to_string(), |t| fmt_time(at(t)));
        let opts = match &p.options {
            Some(OptionSpec::List(l)) => Some(l.as_slice()),
            _ => None,
        };
        let ports = (p.lport.is_some() || p.rport.is_some()).then(|| self.flow_ports(p));
        format!(
            "{time} {}",
            packet::describe(
                p.flags,
                p.seq,
                p.len,
                p.ack,
                p.win,
                opts.or(Some(&[])),
                p.options == Some(OptionSpec::Any),
                ports
            )
        )
    }

    /// A frame luna sent, as the script would write it (relative numbers).
    fn show_actual(&self, t: Instant, frame: &[u8]) -> String {
        match packet::decode_outbound(&self.ends, frame) {
            Err(e) => format!("{} {e}", fmt_time(t)),
            Ok(seg) => {
                let ports = (seg.src_port, seg.dst_port);
                let flow = self.flows.get(&ports).cloned().unwrap_or_default();
                let isn_off = flow.isn_off.unwrap_or(0);
                let opts: Vec<Opt> = seg
                    .options
                    .iter()
                    .map(|o| match o {
                        Opt::Ts { val, ecr } => Opt::Ts {
                            val: val.wrapping_sub(flow.ts_off.unwrap_or(0)),
                            ecr: *ecr,
                        },
                        o => o.clone(),
                    })
                    .collect();
                let shown_ports = (ports != self.default_flow).then_some(ports);
                format!(
                    "{} {}",
                    fmt_time(t),
                    packet::describe(
                        seg.flags,
                        seg.seq.wrapping_sub(isn_off),
                        seg.payload.len() as u32,
                        (seg.flags & flag::ACK != 0).then_some(seg.ack),
                        Some(seg.win),
                        Some(&opts),
                        false,
                        shown_ports
                    )
                )
            }
        }
    }

    /// Wait (on virtual time) for luna's next frame and check it against the `>` line.
    /// Returns when it was sent (script µs).
    fn expect_packet(&mut self, p: &PacketSpec, t: Option<u64>) -> Result<u64> {
        self.stack()?;
        let deadline = match t {
            Some(t) => at(t + self.tol),
            None => self.now + ANY_TIME_LIMIT,
        };
        if self.outq.is_empty() {
            self.run_until(deadline, true)?;
        }
        let Some((sent, frame)) = self.outq.pop_front() else {
            return self.err(format!(
                "luna sent nothing by {} (tolerance {} us)\n  script packet: {}",
                fmt_time(deadline),
                self.tol,
                self.show_spec(p, t)
            ));
        };
        let mismatch = |this: &Self, what: String| -> Result<u64> {
            this.err(format!(
                "outbound packet mismatch: {what}\n  script packet: {}\n  actual packet: {}",
                this.show_spec(p, t),
                this.show_actual(sent, &frame)
            ))
        };
        let seg = match packet::decode_outbound(&self.ends, &frame) {
            Ok(s) => s,
            Err(e) => return mismatch(self, format!("luna sent {e}")),
        };
        let ports = self.flow_ports(p);
        if (seg.src_port, seg.dst_port) != ports {
            return mismatch(
                self,
                format!(
                    "ports {} -> {}, expected {} -> {}",
                    seg.src_port, seg.dst_port, ports.0, ports.1
                ),
            );
        }
        if seg.flags != p.flags {
            return mismatch(
                self,
                format!(
                    "flags {} != expected {}",
                    packet::flags_str(seg.flags),
                    packet::flags_str(p.flags)
                ),
            );
        }
        // packetdrill's convention: the first SYN (or SYN-ACK) of a flow fixes luna's ISN.
        // A SYN with another ISN is a new incarnation of the tuple (after TIME-WAIT or a
        // reset): its numbering, timestamp offset and byte streams start afresh. A
        // retransmitted SYN keeps its ISN and is compared as usual.
        let flow = self.flows.entry(ports).or_default();
        if seg.flags & flag::SYN != 0 && flow.luna_isn != Some(seg.seq) {
            *flow = Flow {
                isn_off: Some(seg.seq.wrapping_sub(p.seq)),
                luna_isn: Some(seg.seq),
                // A SYN-ACK names the peer ISN it answers; an active SYN awaits one.
                peer_isn: (seg.flags & flag::ACK != 0).then(|| seg.ack.wrapping_sub(1)),
                ..Flow::default()
            };
        }
        let isn_off = flow.isn_off.unwrap_or(0);
        let rel = seg.seq.wrapping_sub(isn_off);
        if rel != p.seq && !p.seq_any {
            return mismatch(self, format!("seq {rel} != expected {}", p.seq));
        }
        if seg.payload.len() as u32 != p.len {
            return mismatch(
                self,
                format!("payload length {} != expected {}", seg.payload.len(), p.len),
            );
        }
        if let Some(a) = p.ack {
            if seg.ack != a {
                return mismatch(self, format!("ack {} != expected {a}", seg.ack));
            }
        }
        if let Err(why) = self.check_ip_fields(p) {
            return Err(ScriptError::skip(self.line, why));
        }
        if let Some(w) = p.win.filter(|_| !self.opts.lenient) {
            if seg.win != w {
                return mismatch(self, format!("win {} != expected {w}", seg.win));
            }
        }
        if let Some(u) = p.urg {
            if seg.urg != u {
                return mismatch(self, format!("urg {} != expected {u}", seg.urg));
            }
        }
        if let Err(what) = self.match_options(p, &seg) {
            return mismatch(self, what);
        }
        if let Err(what) = self.check_payload(ports, &seg) {
            return mismatch(self, what);
        }
        if let Some(t) = t {
            let s = us(sent);
            if s + self.tol < t || s > t + self.tol {
                return self.err(format!(
                    "outbound packet timing: sent at {}, expected at {} (tolerance {} us)\n  \
                     script packet: {}\n  actual packet: {}",
                    fmt_time(sent),
                    fmt_time(at(t)),
                    self.tol,
                    self.show_spec(p, Some(t)),
                    self.show_actual(sent, &frame)
                ));
            }
        }
        Ok(us(sent))
    }

    fn match_options(&mut self, p: &PacketSpec, seg: &Segment) -> std::result::Result<(), String> {
        let want = match &p.options {
            Some(OptionSpec::Any) => return Ok(()),
            Some(OptionSpec::List(l)) => l.as_slice(),
            None => &[],
        };
        let (want, seg) = if self.opts.lenient {
            lenient_options(want, seg)
        } else {
            (want.to_vec(), seg.clone())
        };
        let (want, seg) = (want.as_slice(), &seg);
        if want.len() != seg.options.len() {
            return Err(format!(
                "{} options, expected {}",
                seg.options.len(),
                want.len()
            ));
        }
        let tol_ticks = self.ts_tick.map(|tick| self.tol / tick + 1);
        let flow = self
            .flows
            .get_mut(&(seg.src_port, seg.dst_port))
            .expect("the flow was created before options are matched");
        for (i, (w, a)) in want.iter().zip(&seg.options).enumerate() {
            let same = match (w, a) {
                (Opt::Ts { val: wv, ecr: we }, Opt::Ts { val: av, ecr: ae }) => {
                    if we != ae {
                        return Err(format!("option {}: TS ecr {ae} != expected {we}", i + 1));
                    }
                    match flow.ts_off {
                        None => {
                            flow.ts_off = Some(av.wrapping_sub(*wv));
                            true
                        }
                        Some(off) => match tol_ticks {
                            // Without --tcp_ts_tick_usecs TS values are not compared
                            // (packetdrill's default).
                            None => true,
                            Some(slack) => {
                                let got = av.wrapping_sub(off);
                                let diff = (got.wrapping_sub(*wv) as i32).unsigned_abs();
                                if u64::from(diff) > slack {
                                    return Err(format!(
                                        "option {}: TS val {got} != expected {wv} (± {slack} ticks)",
                                        i + 1
                                    ));
                                }
                                true
                            }
                        },
                    }
                }
                (w, a) => w == a,
            };
            if !same {
                return Err(format!("option {}: `{a}` != expected `{w}`", i + 1));
            }
        }
        Ok(())
    }

    /// IP header fields written on a `>` line: luna sends TTL 64, TOS 0 and no ECN
    /// codepoint; expecting anything else is a skip reason, not a luna failure.
    fn check_ip_fields(&self, p: &PacketSpec) -> std::result::Result<(), String> {
        if let Some(t) = p.ip.ttl.filter(|&t| t != 64) {
            return Err(format!("`(ttl {t})`: luna sends TTL 64"));
        }
        if let Some(t) = p.ip.tos.filter(|&t| t != 0) {
            return Err(format!(
                "`(tos {t:#x})`: luna sends TOS 0 (no DSCP, no ECN)"
            ));
        }
        match p.ip.ecn.as_deref() {
            None | Some("noecn") => Ok(()),
            Some(e) => Err(format!("`{e}`: luna has no ECN (its packets are not-ECT)")),
        }
    }

    /// The payload must be exactly the bytes the script wrote at that stream offset.
    fn check_payload(&self, ports: (u16, u16), seg: &Segment) -> std::result::Result<(), String> {
        if seg.payload.is_empty() {
            return Ok(());
        }
        let flow = &self.flows[&ports];
        let Some(isn) = flow.luna_isn else {
            return Ok(()); // no SYN seen: the stream offset is unknown
        };
        let off = u64::from(seg.seq.wrapping_sub(isn).wrapping_sub(1));
        let end = off + seg.payload.len() as u64;
        if end > flow.written {
            return Err(format!(
                "luna sent stream bytes {off}..{end} but the script wrote only {}",
                flow.written
            ));
        }
        let want = pattern(salt(ports, false), off, seg.payload.len());
        if let Some(i) = want.iter().zip(&seg.payload).position(|(a, b)| a != b) {
            return Err(format!(
                "payload byte at stream offset {} is wrong (not what the script wrote)",
                off + i as u64
            ));
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------
    // System calls
    // -----------------------------------------------------------------------------------

    fn fd(&self, args: &[Arg], name: &str) -> Result<i64> {
        match args.first() {
            Some(Arg::Int(fd)) => Ok(*fd),
            _ => self.err(format!(
                "{name}: the first argument must be a file descriptor"
            )),
        }
    }

    fn int_arg(&self, args: &[Arg], i: usize, name: &str) -> Result<i64> {
        match args.get(i) {
            Some(Arg::Int(v)) => Ok(*v),
            Some(Arg::Array(v)) if v.len() == 1 => match v[0] {
                Arg::Int(x) => Ok(x),
                _ => self.err(format!("{name}: argument {} must be a number", i + 1)),
            },
            _ => self.err(format!("{name}: argument {} must be a number", i + 1)),
        }
    }

    fn ident_arg(&self, args: &[Arg], i: usize, name: &str) -> Result<Vec<String>> {
        match args.get(i) {
            Some(Arg::Ident(v)) => Ok(v.clone()),
            _ => self.err(format!("{name}: argument {} must be a symbol", i + 1)),
        }
    }

    fn want_args(&self, sc: &Syscall, n: usize) -> Result<()> {
        if sc.args.len() != n {
            return self.err(format!(
                "{} takes {n} arguments, not {}",
                sc.name,
                sc.args.len()
            ));
        }
        Ok(())
    }

    fn nonblocking(&self, fd: i64) -> bool {
        self.fds.get(&fd).is_some_and(|f| f.nonblocking)
    }

    fn lowest_free_fd(&self) -> i64 {
        (3..)
            .find(|fd| !self.fds.contains_key(fd))
            .expect("fds are finite")
    }

    fn syscall(&mut self, sc: &Syscall, end: Option<u64>) -> Result<()> {
        let expect: Ret = match &sc.errno {
            None => (sc.ret, None),
            Some(name) => match errno_num(name) {
                Some(n) => (-1, Some(n)),
                None => return self.err(format!("unknown errno `{name}`")),
            },
        };
        if end.is_some() && self.pending.is_some() {
            return self.err("only one blocking call may be outstanding at a time");
        }
        let attempt = match sc.name.as_str() {
            "socket" => self.sys_socket(sc)?,
            "bind" => self.sys_bind(sc)?,
            "listen" => self.sys_listen(sc)?,
            "accept" => self.sys_accept(sc)?,
            "connect" => self.sys_connect(sc)?,
            "write" | "send" => self.sys_write(sc)?,
            "read" | "recv" => self.sys_read(sc)?,
            "close" => self.sys_close(sc)?,
            "shutdown" => self.sys_shutdown(sc)?,
            "setsockopt" => self.sys_setsockopt(sc)?,
            "getsockopt" => self.sys_getsockopt(sc)?,
            "fcntl" => self.sys_fcntl(sc)?,
            other => {
                return Err(ScriptError::skip(
                    self.line,
                    format!(
                        "system call `{other}` is not supported (supported: socket, bind, listen, \
                     accept, connect, write/send, read/recv, close, shutdown, setsockopt, \
                     getsockopt, fcntl)"
                    ),
                ))
            }
        };
        match attempt {
            Attempt::Done(r) => {
                if let Some(e) = end {
                    // A call written as blocking must block until its end time.
                    if us(self.now) + self.tol < e {
                        return self.err(format!(
                            "{} returned {} at once, but the script expects it to block until {}",
                            sc.name,
                            show_ret(r),
                            fmt_time(at(e))
                        ));
                    }
                }
                self.check_ret(&sc.name, r, expect)?;
                self.drain()
            }
            Attempt::Block(wait) => {
                let Some(end) = end else {
                    return self.err(format!(
                        "{} would block: write its time as `start...end` for a blocking call, or \
                         set O_NONBLOCK with fcntl",
                        sc.name
                    ));
                };
                self.pending = Some(Pending {
                    line: self.line,
                    wait,
                    end,
                    expect,
                    name: sc.name.clone(),
                });
                self.drain()
            }
        }
    }

    fn check_ret(&self, name: &str, got: Ret, want: Ret) -> Result<()> {
        let same = match (got.1, want.1) {
            (Some(g), Some(w)) => g == w,
            (None, None) => got.0 == want.0,
            _ => false,
        };
        if !same {
            return self.err(format!(
                "{name} returned {}, expected {}",
                show_ret(got),
                show_ret(want)
            ));
        }
        Ok(())
    }

    /// A blocking call that cannot return yet fails if its time (plus tolerance) is past.
    fn check_pending_deadline(&mut self, t: Instant) -> Result<()> {
        if let Some(p) = &self.pending {
            if us(t) > p.end + self.tol {
                let msg = format!(
                    "{} (started at line {}) did not return by {} (tolerance {} us)",
                    p.name,
                    p.line,
                    fmt_time(at(p.end)),
                    self.tol
                );
                self.line = p.line;
                return self.err(msg);
            }
        }
        Ok(())
    }

    /// Try to finish the outstanding blocking call; true if it returned.
    fn try_complete(&mut self) -> Result<bool> {
        let Some(p) = self.pending.clone() else {
            return Ok(false);
        };
        let r = match p.wait.clone() {
            Wait::Accept { fd } => self.try_accept(fd)?,
            Wait::Connect { fd } => self.connect_status(fd)?,
            Wait::Read { fd, max } => self.try_read(fd, max)?,
            Wait::Write { fd, left, done } => match self.try_write(fd, left)? {
                None => None,
                Some((n, None)) => {
                    let (done, left) = (done + n as usize, left - n as usize);
                    if left == 0 {
                        Some(ok(done as i64))
                    } else {
                        if let Some(pp) = self.pending.as_mut() {
                            pp.wait = Wait::Write { fd, left, done };
                        }
                        None
                    }
                }
                // An error after a partial write returns what was written (as Linux does).
                Some(_) if done > 0 => Some(ok(done as i64)),
                Some(err) => Some(err),
            },
        };
        let Some(r) = r else {
            return Ok(false);
        };
        self.pending = None;
        let saved = self.line;
        self.line = p.line;
        let t = us(self.now);
        if t + self.tol < p.end {
            return self.err(format!(
                "{} returned {} at {}, before its expected return at {} (tolerance {} us)",
                p.name,
                show_ret(r),
                fmt_time(self.now),
                fmt_time(at(p.end)),
                self.tol
            ));
        }
        self.check_ret(&p.name, r, p.expect)?;
        self.line = saved;
        Ok(true)
    }

    fn sys_socket(&mut self, sc: &Syscall) -> Result<Attempt> {
        self.want_args(sc, 3)?;
        if let Some(Arg::Ident(d)) = sc.args.first() {
            if d.iter().any(|x| x != "AF_INET") {
                return self.err("socket: only AF_INET (or ...) is supported");
            }
        }
        let ty = self.ident_arg(&sc.args, 1, "socket")?;
        if !ty.iter().any(|t| t == "SOCK_STREAM") {
            return self.err("socket: only SOCK_STREAM is supported");
        }
        let nonblocking = ty.iter().any(|t| t == "SOCK_NONBLOCK");
        if let Some(bad) = ty
            .iter()
            .find(|t| !matches!(t.as_str(), "SOCK_STREAM" | "SOCK_NONBLOCK" | "SOCK_CLOEXEC"))
        {
            return self.err(format!("socket: unsupported type flag {bad}"));
        }
        let fd = self.lowest_free_fd();
        self.fds.insert(
            fd,
            Fd {
                kind: FdKind::Socket,
                nonblocking,
                bound: None,
                flow: None,
            },
        );
        Ok(Attempt::Done(ok(fd)))
    }

    fn sys_bind(&mut self, sc: &Syscall) -> Result<Attempt> {
        self.want_args(sc, 3)?;
        let fd = self.fd(&sc.args, "bind")?;
        match self.fds.get_mut(&fd) {
            None => Ok(Attempt::Done(fail("EBADF"))),
            Some(f) if f.bound.is_some() || !matches!(f.kind, FdKind::Socket) => {
                Ok(Attempt::Done(fail("EINVAL")))
            }
            Some(f) => {
                f.bound = Some(LUNA_PORT);
                Ok(Attempt::Done(ok(0)))
            }
        }
    }

    fn sys_listen(&mut self, sc: &Syscall) -> Result<Attempt> {
        self.want_args(sc, 2)?;
        let fd = self.fd(&sc.args, "listen")?;
        let backlog = self.int_arg(&sc.args, 1, "listen")?;
        let Some(f) = self.fds.get(&fd).cloned() else {
            return Ok(Attempt::Done(fail("EBADF")));
        };
        if !matches!(f.kind, FdKind::Socket) {
            return Ok(Attempt::Done(fail("EINVAL")));
        }
        let port = f.bound.unwrap_or(LUNA_PORT);
        let backlog = usize::try_from(backlog).unwrap_or(0);
        match self.stack()?.listen(port, backlog) {
            Ok(l) => {
                let f = self.fds.get_mut(&fd).expect("checked");
                f.kind = FdKind::Listener(l);
                Ok(Attempt::Done(ok(0)))
            }
            Err(ListenError::AddrInUse) => Ok(Attempt::Done(fail("EADDRINUSE"))),
            Err(ListenError::InvalidBacklog) => Ok(Attempt::Done(fail("EINVAL"))),
        }
    }

    fn sys_accept(&mut self, sc: &Syscall) -> Result<Attempt> {
        self.want_args(sc, 3)?;
        let fd = self.fd(&sc.args, "accept")?;
        match self.try_accept(fd)? {
            Some(r) => Ok(Attempt::Done(r)),
            None if self.nonblocking(fd) => Ok(Attempt::Done(fail("EAGAIN"))),
            None => Ok(Attempt::Block(Wait::Accept { fd })),
        }
    }

    fn try_accept(&mut self, fd: i64) -> Result<Option<Ret>> {
        let Some(f) = self.fds.get(&fd).cloned() else {
            return Ok(Some(fail("EBADF")));
        };
        let FdKind::Listener(l) = f.kind else {
            return Ok(Some(fail("EINVAL")));
        };
        let stack = self.stack()?;
        let Some(h) = stack.accept(l) else {
            return Ok(None);
        };
        let tuple = stack.connection(h).map(|c| c.tuple());
        let flow = tuple.map(|t| (t.local.port(), t.remote.port()));
        let nfd = self.lowest_free_fd();
        self.fds.insert(
            nfd,
            Fd {
                kind: FdKind::Conn(h),
                nonblocking: false,
                bound: None,
                flow,
            },
        );
        self.known.push(h);
        self.inherit_sockopts(fd, nfd);
        Ok(Some(ok(nfd)))
    }

    fn sys_connect(&mut self, sc: &Syscall) -> Result<Attempt> {
        self.want_args(sc, 3)?;
        let fd = self.fd(&sc.args, "connect")?;
        let Some(f) = self.fds.get(&fd).cloned() else {
            return Ok(Attempt::Done(fail("EBADF")));
        };
        match f.kind {
            FdKind::Socket => {}
            FdKind::Listener(_) => return Ok(Attempt::Done(fail("EISCONN"))),
            FdKind::Conn(_) if f.nonblocking => {
                // A repeated non-blocking connect reports progress (Linux: EALREADY, then
                // EISCONN or the error).
                return Ok(Attempt::Done(
                    self.connect_status(fd)?.unwrap_or(fail("EALREADY")),
                ));
            }
            FdKind::Conn(_) => return Ok(Attempt::Done(fail("EISCONN"))),
        }
        let now = self.now;
        let remote = SocketAddrV4::new(self.ends.peer_ip, LUNA_PORT);
        let r = self.stack()?.connect(now, remote, f.bound);
        let h = match r {
            Ok(h) => h,
            Err(e) => {
                return Ok(Attempt::Done(fail(match e {
                    ConnectError::NoRoute => "ENETUNREACH",
                    ConnectError::InvalidAddress => "EINVAL",
                    ConnectError::AddrInUse => "EADDRINUSE",
                    ConnectError::PortsExhausted => "EADDRNOTAVAIL",
                    ConnectError::TableFull => "ENOBUFS",
                })))
            }
        };
        let tuple = self.stack()?.connection(h).map(|c| c.tuple());
        let flow = tuple.map(|t| (t.local.port(), t.remote.port()));
        if let Some(fl) = flow {
            self.default_flow = fl;
        }
        self.known.push(h);
        let f = self.fds.get_mut(&fd).expect("checked");
        f.kind = FdKind::Conn(h);
        f.flow = flow;
        if f.nonblocking {
            return Ok(Attempt::Done(fail("EINPROGRESS")));
        }
        Ok(Attempt::Block(Wait::Connect { fd }))
    }

    /// Where a connect stands: `None` while the handshake is in progress.
    fn connect_status(&mut self, fd: i64) -> Result<Option<Ret>> {
        let Some(FdKind::Conn(h)) = self.fds.get(&fd).map(|f| f.kind) else {
            return Ok(Some(fail("EBADF")));
        };
        let stack = self.stack()?;
        Ok(match stack.state(h) {
            Some(State::SynSent) | Some(State::SynReceived) => None,
            None | Some(State::Closed) => Some(match reason_errno(stack.close_reason(h)) {
                Some(e) => fail(e),
                None => fail("ECONNABORTED"),
            }),
            Some(_) => Some(ok(0)),
        })
    }

    fn conn(&self, fd: i64) -> std::result::Result<(SocketHandle, (u16, u16)), Ret> {
        match self.fds.get(&fd) {
            None => Err(fail("EBADF")),
            Some(Fd {
                kind: FdKind::Conn(h),
                flow: Some(fl),
                ..
            }) => Ok((*h, *fl)),
            Some(_) => Err(fail("ENOTCONN")),
        }
    }

    fn sys_write(&mut self, sc: &Syscall) -> Result<Attempt> {
        let n = if sc.name == "send" { 4 } else { 3 };
        self.want_args(sc, n)?;
        let fd = self.fd(&sc.args, &sc.name)?;
        let len = self.int_arg(&sc.args, 2, &sc.name)?;
        let Ok(len) = usize::try_from(len) else {
            return Ok(Attempt::Done(fail("EINVAL")));
        };
        if len > MAX_IO {
            return self.err(format!("writes above {MAX_IO} bytes are not supported"));
        }
        match self.try_write(fd, len)? {
            Some((n, None)) if (n as usize) < len && !self.nonblocking(fd) => {
                Ok(Attempt::Block(Wait::Write {
                    fd,
                    left: len - n as usize,
                    done: n as usize,
                }))
            }
            Some(r) => Ok(Attempt::Done(r)),
            None if self.nonblocking(fd) => Ok(Attempt::Done(fail("EAGAIN"))),
            None => Ok(Attempt::Block(Wait::Write {
                fd,
                left: len,
                done: 0,
            })),
        }
    }

    /// Queue up to `len` script bytes; `None` when the send buffer is full.
    fn try_write(&mut self, fd: i64, len: usize) -> Result<Option<Ret>> {
        let (h, flow) = match self.conn(fd) {
            Ok(x) => x,
            Err(r) => return Ok(Some(r)),
        };
        if len == 0 {
            return Ok(Some(ok(0)));
        }
        let off = self.flows.entry(flow).or_default().written;
        let stack = self.stack()?;
        let room = stack.send_capacity(h).min(len);
        let data = pattern(salt(flow, false), off, room.max(1));
        match stack.send(h, &Zbuf::from_vec(data)) {
            Ok(n) => {
                self.flows.get_mut(&flow).expect("created above").written += n as u64;
                Ok(Some(ok(n as i64)))
            }
            Err(SendError::WouldBlock) => Ok(None),
            Err(SendError::Shutdown) => Ok(Some(fail("EPIPE"))),
            Err(SendError::InvalidHandle) => Ok(Some(fail("EPIPE"))),
            Err(SendError::Closed) => {
                let reason = stack.close_reason(h);
                Ok(Some(fail(reason_errno(reason).unwrap_or("EPIPE"))))
            }
        }
    }

    fn sys_read(&mut self, sc: &Syscall) -> Result<Attempt> {
        let n = if sc.name == "recv" { 4 } else { 3 };
        self.want_args(sc, n)?;
        let fd = self.fd(&sc.args, &sc.name)?;
        let max = self.int_arg(&sc.args, 2, &sc.name)?;
        let Ok(max) = usize::try_from(max) else {
            return Ok(Attempt::Done(fail("EINVAL")));
        };
        if max > MAX_IO {
            return self.err(format!("reads above {MAX_IO} bytes are not supported"));
        }
        let (peek, dontwait) = if sc.name == "recv" {
            self.recv_flags(&sc.args[3])?
        } else {
            (false, false)
        };
        if peek {
            if let Some(r) = self.try_peek(fd, max)? {
                return Ok(Attempt::Done(r));
            }
        }
        match self.try_read(fd, max)? {
            // MSG_PEEK with nothing buffered reaches here: nothing was consumed, and an
            // end of stream or error reads the same either way.
            Some(r) => Ok(Attempt::Done(r)),
            None if self.nonblocking(fd) || dontwait => Ok(Attempt::Done(fail("EAGAIN"))),
            None if peek => self.err(
                "a blocking recv(MSG_PEEK) with nothing buffered is not supported: the runner \
                 can only block in a consuming read",
            ),
            None => Ok(Attempt::Block(Wait::Read { fd, max })),
        }
    }

    /// recv's flags: (MSG_PEEK, MSG_DONTWAIT); others skip the script.
    fn recv_flags(&self, a: &Arg) -> Result<(bool, bool)> {
        let names = match a {
            Arg::Int(0) => return Ok((false, false)),
            Arg::Ident(v) => v,
            _ => return self.err("recv: the flags must be 0 or MSG_* symbols"),
        };
        let (mut peek, mut dontwait) = (false, false);
        for n in names {
            match n.as_str() {
                "MSG_PEEK" => peek = true,
                "MSG_DONTWAIT" => dontwait = true,
                other => {
                    return Err(ScriptError::skip(
                        self.line,
                        format!("recv flag {other} is not supported (MSG_PEEK, MSG_DONTWAIT)"),
                    ))
                }
            }
        }
        Ok((peek, dontwait))
    }

    /// MSG_PEEK: report what a read would return without consuming it. luna's API has no
    /// peek, so the bytes are not checked here; the read that consumes them checks them.
    /// `None` if nothing is buffered.
    fn try_peek(&mut self, fd: i64, max: usize) -> Result<Option<Ret>> {
        let (h, _) = match self.conn(fd) {
            Ok(x) => x,
            Err(r) => return Ok(Some(r)),
        };
        let avail = self
            .stack()?
            .connection(h)
            .map_or(0, |c| c.recv_available());
        Ok((avail > 0).then(|| ok(avail.min(max) as i64)))
    }

    /// Read up to `max` bytes and check they are the peer's stream; `None` if none yet.
    fn try_read(&mut self, fd: i64, max: usize) -> Result<Option<Ret>> {
        let (h, flow) = match self.conn(fd) {
            Ok(x) => x,
            Err(r) => return Ok(Some(r)),
        };
        let stack = self.stack()?;
        let r = stack.recv_iovec(h, max);
        let reason = stack.close_reason(h);
        match r {
            Ok(iov) if iov.is_empty() => Ok(None),
            Ok(iov) => {
                let mut got = Vec::with_capacity(iov.len());
                for c in iov.chunks() {
                    got.extend_from_slice(c);
                }
                let read = self.flows.entry(flow).or_default().read;
                let want = pattern(salt(flow, true), read, got.len());
                if let Some(i) = want.iter().zip(&got).position(|(a, b)| a != b) {
                    return self.err(format!(
                        "read returned a wrong byte at stream offset {} (luna reassembled the \
                         peer's data incorrectly)",
                        read + i as u64
                    ));
                }
                self.flows.get_mut(&flow).expect("created above").read += got.len() as u64;
                Ok(Some(ok(got.len() as i64)))
            }
            Err(RecvError::Finished) => Ok(Some(ok(0))),
            Err(RecvError::Closed) => Ok(Some(match reason_errno(reason) {
                Some(e) => fail(e),
                None => ok(0),
            })),
            Err(RecvError::InvalidHandle) => Ok(Some(fail("EBADF"))),
        }
    }

    fn sys_close(&mut self, sc: &Syscall) -> Result<Attempt> {
        self.want_args(sc, 1)?;
        let fd = self.fd(&sc.args, "close")?;
        let Some(f) = self.fds.remove(&fd) else {
            return Ok(Attempt::Done(fail("EBADF")));
        };
        match f.kind {
            FdKind::Socket => {}
            FdKind::Listener(l) => self.stack()?.unlisten(l),
            FdKind::Conn(h) if self.linger_abort(fd) => self.stack()?.abort(h),
            FdKind::Conn(h) => self.stack()?.close(h),
        }
        self.sockopts.remove(&fd);
        Ok(Attempt::Done(ok(0)))
    }

    fn sys_shutdown(&mut self, sc: &Syscall) -> Result<Attempt> {
        self.want_args(sc, 2)?;
        let fd = self.fd(&sc.args, "shutdown")?;
        let how = self.ident_arg(&sc.args, 1, "shutdown")?;
        match how.as_slice() {
            [h] if h == "SHUT_WR" || h == "SHUT_RDWR" => {}
            [h] if h == "SHUT_RD" => {
                return self
                    .err("shutdown(SHUT_RD) is not supported: luna has no read-side shutdown")
            }
            _ => return self.err("shutdown: the second argument must be SHUT_WR or SHUT_RDWR"),
        }
        let h = match self.conn(fd) {
            Ok((h, _)) => h,
            Err(r) => return Ok(Attempt::Done(r)),
        };
        self.stack()?.shutdown(h);
        Ok(Attempt::Done(ok(0)))
    }

    fn check_tcp_info(&mut self, f: &Fd, fields: &[(String, Arg)]) -> Result<()> {
        let h = match f.kind {
            FdKind::Conn(h) => Some(h),
            FdKind::Listener(_) => None,
            FdKind::Socket => return self.err("getsockopt(TCP_INFO) on an unconnected socket"),
        };
        let stack = self.stack()?;
        let conn = h.and_then(|h| stack.connection(h));
        let state = match f.kind {
            FdKind::Listener(_) => "TCP_LISTEN",
            _ => state_name(conn.map(|c| c.state())),
        };
        let mut errs = Vec::new();
        for (k, v) in fields {
            let got: String = match (k.as_str(), conn) {
                ("tcpi_state", _) => state.to_string(),
                ("tcpi_snd_cwnd", Some(c)) => (c.cwnd() / c.mss().max(1)).to_string(),
                ("tcpi_snd_ssthresh", Some(c)) => (c.ssthresh() / c.mss().max(1)).to_string(),
                ("tcpi_snd_mss", Some(c)) => c.mss().to_string(),
                ("tcpi_rto", Some(c)) => c.rtt().rto().as_micros().to_string(),
                ("tcpi_snd_cwnd" | "tcpi_snd_ssthresh" | "tcpi_snd_mss" | "tcpi_rto", None) => {
                    "(no connection)".to_string()
                }
                _ => {
                    return self.err(format!(
                        "TCP_INFO field `{k}` is not supported (supported: tcpi_state, \
                         tcpi_snd_cwnd, tcpi_snd_ssthresh, tcpi_snd_mss, tcpi_rto)"
                    ))
                }
            };
            let want = v.to_string();
            if got != want {
                errs.push(format!("{k}={got} (expected {want})"));
            }
        }
        if !errs.is_empty() {
            return self.err(format!("getsockopt(TCP_INFO): {}", errs.join(", ")));
        }
        Ok(())
    }

    fn sys_fcntl(&mut self, sc: &Syscall) -> Result<Attempt> {
        let fd = self.fd(&sc.args, "fcntl")?;
        let cmd = self.ident_arg(&sc.args, 1, "fcntl")?.join("|");
        if !self.fds.contains_key(&fd) {
            return Ok(Attempt::Done(fail("EBADF")));
        }
        match cmd.as_str() {
            "F_SETFL" => {
                let flags = match sc.args.get(2) {
                    Some(Arg::Ident(v)) => v.clone(),
                    Some(Arg::Int(0)) => Vec::new(),
                    _ => {
                        return self.err(
                            "fcntl(F_SETFL): the flags must be symbols, e.g. O_RDWR|O_NONBLOCK",
                        )
                    }
                };
                if let Some(bad) = flags
                    .iter()
                    .find(|x| !matches!(x.as_str(), "O_RDWR" | "O_NONBLOCK"))
                {
                    return self.err(format!("fcntl(F_SETFL): unsupported flag {bad}"));
                }
                let nb = flags.iter().any(|x| x == "O_NONBLOCK");
                self.fds.get_mut(&fd).expect("checked").nonblocking = nb;
                Ok(Attempt::Done(ok(0)))
            }
            "F_GETFL" => Ok(Attempt::Done(ok(
                0x2 | if self.nonblocking(fd) { 0x800 } else { 0 }
            ))),
            other => self.err(format!(
                "fcntl({other}) is not supported (F_SETFL, F_GETFL)"
            )),
        }
    }
}

/// Lenient matching: NOP/EOL padding dropped and both lists in one canonical order, so only
/// which options luna sends, and their values, are compared.
fn lenient_options(want: &[Opt], seg: &Segment) -> (Vec<Opt>, Segment) {
    fn rank(o: &Opt) -> u8 {
        match o {
            Opt::Mss(_) => 0,
            Opt::WScale(_) => 1,
            Opt::SackOk => 2,
            Opt::Sack(_) => 3,
            Opt::Ts { .. } => 4,
            Opt::Unknown(k, _) => 5u8.saturating_add(*k),
            Opt::Nop | Opt::Eol => u8::MAX,
        }
    }
    let canon = |l: &[Opt]| {
        let mut v: Vec<Opt> = l
            .iter()
            .filter(|o| !matches!(o, Opt::Nop | Opt::Eol))
            .cloned()
            .collect();
        v.sort_by_key(rank);
        v
    };
    // The window scale is part of the advertised window, which luna sizes from its own
    // buffer: its presence is compared, not its shift.
    let unscale = |l: Vec<Opt>| -> Vec<Opt> {
        l.into_iter()
            .map(|o| match o {
                Opt::WScale(_) => Opt::WScale(0),
                o => o,
            })
            .collect()
    };
    let mut seg = seg.clone();
    seg.options = unscale(canon(&seg.options));
    (unscale(canon(want)), seg)
}

/// What a system call did on its first try.
enum Attempt {
    Done(Ret),
    Block(Wait),
}
