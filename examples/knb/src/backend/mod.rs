//! Stack backends: the one seam between knb's orchestration and a network stack.
//!
//! A backend says which testbed topology it runs on and where each side lives
//! ([`Backend::endpoints`]); inside the child processes that the orchestrator starts
//! (`knb server` / `knb client`) it moves bytes between its sockets and the sans-IO RPC
//! engines ([`crate::proto::ServerConn`], [`crate::engine::ClientWorker`]). Framing,
//! validation, load generation, timing, histograms, CPU accounting and reporting are
//! shared, so a new stack only writes its event loop.
//!
//! | backend | topology | server side | client side |
//! |---|---|---|---|
//! | [`kernel`] | `veth` (k2 ⇄ k1) | epoll (mio) threads in `<p>-k2` | mio threads in `<p>-k1` |
//! | [`smoltcp`] | `memif` | DPDK process, one smoltcp `Interface` per queue | the same, role client |
//! | [`luna`] | `memif` | inline-r2c server over r2c's `DpdkDevice`, zero copy | inline-r2c client |

pub mod kernel;
pub mod luna;
pub mod memif;
pub mod smoltcp;

use std::net::Ipv4Addr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testbed::{Kind, Topology};

use crate::engine::{ClientWorker, ThreadResult, Timing, WorkerSpec};
use crate::proto::ServerCounters;
use crate::workload::{Stack, Workload};

/// Where one side of a run lives.
#[derive(Debug, Clone)]
pub struct Place {
    /// Network namespace to run in.
    pub netns: String,
    /// This side's IPv4 address.
    pub ip: Ipv4Addr,
    /// Prefix length of `ip`.
    pub prefix_len: u8,
    /// DPDK EAL arguments (empty for kernel sides).
    pub eal: Vec<String>,
}

/// Both sides.
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// The server.
    pub server: Place,
    /// The client.
    pub client: Place,
}

/// What a server child process is told.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// Sizes, connections, threads, mode.
    pub workload: Workload,
    /// Address to listen on.
    pub ip: Ipv4Addr,
    /// Prefix length (DPDK stacks configure it on their interface).
    pub prefix_len: u8,
    /// TCP port.
    pub port: u16,
    /// CPU of each thread (thread i on `cpus[i % len]`).
    pub cpus: Vec<usize>,
    /// EAL arguments (DPDK stacks).
    pub eal: Vec<String>,
    /// Hard stop: the server exits after this long whatever happens.
    pub lifetime: Duration,
    /// luna only: the kernel exception path beside the NIC (`--exception`).
    pub exception: Option<ExceptionSpec>,
}

/// `knb server --exception PORT:IFACE [--exception-mirror]` (luna, issue 11): the server
/// shares its NIC with the kernel. The DPDK port `port` (a net_tap given with its own
/// `--vdev`) is the exception port, whose kernel netdev `iface` carries the NIC's MAC
/// and the server's IP; r2c's exception path hands it every frame the traffic model
/// (luna's listening port and client range on `--ip`) leaves to the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExceptionSpec {
    /// The exception port's ethdev name, e.g. `net_tap1`.
    pub port: String,
    /// Its kernel netdev.
    pub iface: String,
    /// Mirror `iface`'s neighbours, routes and addresses (netlink-sync); luna stops ARP.
    pub mirror: bool,
    /// How long the exception path stays up after knb's connections are done (the
    /// kernel's sessions through the NIC end when the process does).
    pub linger: Duration,
}

impl ExceptionSpec {
    /// Parses `PORT:IFACE`.
    pub fn parse(s: &str) -> Result<ExceptionSpec, String> {
        match s.split_once(':') {
            Some((port, iface))
                if !port.is_empty() && !iface.is_empty() && !iface.contains(':') =>
            {
                Ok(ExceptionSpec {
                    port: port.to_string(),
                    iface: iface.to_string(),
                    mirror: false,
                    linger: Duration::from_secs(1),
                })
            }
            _ => Err(format!(
                "expected PORT:IFACE (e.g. net_tap1:luna-exc), got {s:?}"
            )),
        }
    }
}

/// What a client child process is told.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    /// This side's address.
    pub ip: Ipv4Addr,
    /// Prefix length.
    pub prefix_len: u8,
    /// The server's address.
    pub server_ip: Ipv4Addr,
    /// TCP port.
    pub port: u16,
    /// CPU of each thread.
    pub cpus: Vec<usize>,
    /// EAL arguments (DPDK stacks).
    pub eal: Vec<String>,
}

/// What a server reports when it exits.
#[derive(Debug, Default, Clone)]
pub struct ServerReport {
    /// Connections accepted.
    pub connections: u64,
    /// Summed per-connection counters.
    pub counters: ServerCounters,
    /// Protocol or transport errors (a run with any is failed).
    pub errors: Vec<String>,
    /// Backend-specific counters (device drops, ...).
    pub extra: Value,
}

impl ServerReport {
    /// Adds one connection's counters.
    pub fn add(&mut self, c: &ServerCounters) {
        self.counters.requests += c.requests;
        self.counters.rx_payload += c.rx_payload;
        self.counters.tx_payload += c.tx_payload;
    }

    /// As JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "connections": self.connections,
            "requests": self.counters.requests,
            "rx_payload": self.counters.rx_payload,
            "tx_payload": self.counters.tx_payload,
            "errors": self.errors,
            "extra": self.extra,
        })
    }
}

/// A stack under test.
pub trait Backend: Sync {
    /// Which stack.
    fn stack(&self) -> Stack;

    /// The testbed topology both sides run on.
    fn topology(&self) -> Kind;

    /// Why this backend cannot run here (None when it can). Checked before any setup.
    fn unavailable(&self) -> Option<String> {
        None
    }

    /// Namespaces, addresses and EAL arguments of both sides in `topo`. The server's
    /// main thread goes on `server_cpus[0]`, the client's on `client_cpus[0]`.
    fn endpoints(
        &self,
        topo: &Topology,
        server_cpus: &[usize],
        client_cpus: &[usize],
    ) -> Result<Endpoints, String>;

    /// Runs in the server child: call `ready` once clients may connect, serve
    /// `workload.connections` connections until they close or `lifetime` passes.
    fn serve(&self, spec: &ServerSpec, ready: &mut dyn FnMut()) -> Result<ServerReport, String>;

    /// Runs in the client child: open the connections, get each thread's worker from
    /// `plan` once its connections are up, drive it until it finishes.
    fn run_client(
        &self,
        spec: &ClientSpec,
        plan: &Arc<ClientPlan>,
    ) -> Result<Vec<ThreadResult>, String>;
}

/// The backend of `stack`.
pub fn backend(stack: Stack) -> &'static dyn Backend {
    match stack {
        Stack::Kernel => &kernel::Kernel,
        Stack::Smoltcp => &smoltcp::Smoltcp,
        Stack::Luna => &luna::Luna,
    }
}

/// Whether the memif stacks (luna and smoltcp) skip IPv4/TCP checksums, as the kernel
/// does on veth: memif is shared memory and cannot corrupt a frame. On unless the
/// environment says `KNB_SOFTWARE_CHECKSUMS=1` (both child processes read it, so both
/// ends of the link agree).
pub fn virtual_link_checksums() -> bool {
    !std::env::var("KNB_SOFTWARE_CHECKSUMS").is_ok_and(|v| v == "1")
}

/// A receive-burst size from the environment (`KNB_LUNA_BURST`, `KNB_SMOLTCP_BURST`: an
/// experiment knob, docs/benchmarks.md "Receive bursts and lock-step"): None when unset,
/// an error unless 1..=512.
pub fn env_burst(name: &str) -> Result<Option<usize>, String> {
    parse_frames(name, std::env::var(name).ok(), 1, "a receive-burst size")
}

/// luna's receive split from the environment (`KNB_LUNA_RX_SPLIT`: r2c's
/// `CoreOptions::rx_split`, a burst of more frames is handled in two halves): None when
/// unset, an error unless 0..=512 (0 = never split).
pub fn env_split(name: &str) -> Result<Option<usize>, String> {
    parse_frames(name, std::env::var(name).ok(), 0, "a receive split")
}

/// A switch from the environment (`0` or `1`); `None` when unset.
pub fn env_switch(name: &str) -> Result<Option<bool>, String> {
    parse_switch(name, std::env::var(name).ok())
}

fn parse_switch(name: &str, value: Option<String>) -> Result<Option<bool>, String> {
    match value {
        None => Ok(None),
        Some(v) => match v.trim() {
            "0" => Ok(Some(false)),
            "1" => Ok(Some(true)),
            _ => Err(format!("{name}={v:?} is not 0 or 1 (unset: the default)")),
        },
    }
}

fn parse_frames(
    name: &str,
    value: Option<String>,
    min: usize,
    what: &str,
) -> Result<Option<usize>, String> {
    match value {
        None => Ok(None),
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if (min..=512).contains(&n) => Ok(Some(n)),
            _ => Err(format!(
                "{name}={v:?} is not {what} (frames, {min} to 512; unset: the default)"
            )),
        },
    }
}

/// The orchestrator asked this server to stop (see [`watch_for_stop`]).
static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What the orchestrator writes on a child server's stdin once its client is done but
/// the server is still busy (an overloaded server answering requests the client no
/// longer waits for, or connections whose close never arrived).
pub const STOP_LINE: &str = "KNB_STOP";

/// `knb server --child`: a thread that sets [`stop_requested`] when the orchestrator
/// writes [`STOP_LINE`] on stdin or closes it (an orchestrator gone is a stop too).
pub fn watch_for_stop() {
    std::thread::spawn(|| {
        for line in std::io::stdin().lines() {
            match line {
                Ok(l) if l.trim() == STOP_LINE => break,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        STOP.store(true, std::sync::atomic::Ordering::Release);
    });
}

/// Whether the orchestrator asked the server to stop.
pub fn stop_requested() -> bool {
    STOP.load(std::sync::atomic::Ordering::Acquire)
}

/// A server loop goes on: before `deadline` (its lifetime) and not asked to stop.
pub fn serving(deadline: Instant) -> bool {
    Instant::now() < deadline && !stop_requested()
}

/// Pins the calling thread to `cpu`.
pub fn pin(cpu: usize) -> Result<(), String> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu)
        .map_err(|e| format!("CPU {cpu} is out of range: {e}"))?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .map_err(|e| format!("cannot pin to CPU {cpu}: {e} (is it online?)"))
}

/// Hands out workers so every client thread starts measuring at the same moment:
/// each thread reports in once its connections are up; when all have, the run's
/// [`Timing`] starts. A thread that fails releases the others with an error.
pub struct ClientPlan {
    workload: Workload,
    gate: Mutex<Gate>,
    cv: Condvar,
    /// Completions so far (all threads), for progress lines.
    pub progress: Arc<AtomicU64>,
}

#[derive(Default)]
struct Gate {
    arrived: u32,
    failed: Option<String>,
    timing: Option<Timing>,
    end_sampled: bool,
}

/// How long client threads wait for each other to connect.
const CONNECT_WAIT: Duration = Duration::from_secs(30);

impl ClientPlan {
    /// A plan for `workload`.
    pub fn new(workload: Workload) -> ClientPlan {
        ClientPlan {
            workload,
            gate: Mutex::new(Gate::default()),
            cv: Condvar::new(),
            progress: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The workload.
    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    /// Thread `t` has its connections up: waits for the others, returns its worker.
    pub fn start(&self, t: u32) -> Result<ClientWorker, String> {
        self.start_with(t, false)
    }

    /// [`ClientPlan::start`] for a zero-copy backend: the worker queues requests as
    /// [`crate::proto::Piece`]s ([`WorkerSpec::messages`]).
    pub fn start_messages(&self, t: u32) -> Result<ClientWorker, String> {
        self.start_with(t, true)
    }

    fn start_with(&self, t: u32, messages: bool) -> Result<ClientWorker, String> {
        let w = &self.workload;
        let mut g = self.gate.lock().unwrap_or_else(|p| p.into_inner());
        g.arrived += 1;
        if g.arrived == w.threads {
            g.timing = Some(Timing::starting_now(w.warmup, w.duration));
            self.cv.notify_all();
        }
        let end = Instant::now() + CONNECT_WAIT;
        while g.timing.is_none() && g.failed.is_none() {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                g.failed = Some(format!(
                    "client threads did not all connect within {CONNECT_WAIT:?}"
                ));
                self.cv.notify_all();
                break;
            }
            g = self
                .cv
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        if let Some(e) = &g.failed {
            return Err(e.clone());
        }
        let timing = g.timing.ok_or("no timing")?;
        let (first, conns) = w.conns_of(t);
        let spec = WorkerSpec {
            first_conn: first,
            conns,
            req_size: w.req_size,
            resp_size: w.resp_size,
            iodepth: w.iodepth,
            rate: w.rate.map(|r| r / w.threads as f64),
            verify: w.verify,
            mode: w.mode.into(),
            seed: 0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) * 0x1234_5678_9abc_def1),
            messages,
            service: w.emu.service,
            unordered: w.emu.unordered,
        };
        Ok(ClientWorker::new(spec, timing, self.progress.clone()))
    }

    /// Thread failed before starting: release the others.
    pub fn fail(&self, msg: String) {
        let mut g = self.gate.lock().unwrap_or_else(|p| p.into_inner());
        if g.failed.is_none() {
            g.failed = Some(msg);
        }
        self.cv.notify_all();
    }

    /// A thread whose run is over calls this before closing its connections: it waits
    /// (at most 2 s) until the end-of-window CPU sample is taken, so the server is still
    /// running when it is sampled.
    pub fn finished(&self) {
        let mut g = self.gate.lock().unwrap_or_else(|p| p.into_inner());
        let Some(t) = g.timing else { return };
        if Instant::now() < t.end || g.failed.is_some() {
            return;
        }
        let end = Instant::now() + Duration::from_secs(2);
        while !g.end_sampled {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            g = self
                .cv
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The end-of-window sample is taken (or will not be): release [`Self::finished`].
    pub fn end_sampled(&self) {
        let mut g = self.gate.lock().unwrap_or_else(|p| p.into_inner());
        g.end_sampled = true;
        self.cv.notify_all();
    }

    /// The run's timing once all threads started.
    pub fn timing(&self) -> Option<Timing> {
        self.gate.lock().unwrap_or_else(|p| p.into_inner()).timing
    }

    /// True once a thread failed.
    pub fn failed(&self) -> bool {
        self.gate
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .failed
            .is_some()
    }
}

#[cfg(test)]
mod burst_tests {
    use super::{parse_frames, parse_switch};

    fn parse_burst(name: &str, v: Option<String>) -> Result<Option<usize>, String> {
        parse_frames(name, v, 1, "a receive-burst size")
    }

    /// A burst knob is a frame count from 1 to 512; anything else is refused by name.
    #[test]
    fn burst_knobs_take_frame_counts_and_refuse_the_rest() {
        assert_eq!(parse_burst("B", None), Ok(None));
        assert_eq!(parse_burst("B", Some(" 8 ".into())), Ok(Some(8)));
        assert_eq!(parse_burst("B", Some("512".into())), Ok(Some(512)));
        for bad in ["0", "513", "-1", "eight", ""] {
            let e = parse_burst("B", Some(bad.into())).unwrap_err();
            assert!(e.starts_with("B=") && e.contains("1 to 512"), "{e}");
        }
    }

    /// The split knob also takes 0 (never split).
    #[test]
    fn the_split_knob_takes_zero_too() {
        let split = |v: &str| parse_frames("S", Some(v.into()), 0, "a receive split");
        assert_eq!(split("0"), Ok(Some(0)));
        assert_eq!(split("16"), Ok(Some(16)));
        let e = split("513").unwrap_err();
        assert!(e.starts_with("S=") && e.contains("0 to 512"), "{e}");
    }

    /// A switch is 0 or 1; anything else is refused by name.
    #[test]
    fn switches_take_zero_or_one() {
        assert_eq!(parse_switch("D", None), Ok(None));
        assert_eq!(parse_switch("D", Some(" 0".into())), Ok(Some(false)));
        assert_eq!(parse_switch("D", Some("1".into())), Ok(Some(true)));
        for bad in ["", "2", "yes", "on"] {
            let e = parse_switch("D", Some(bad.into())).unwrap_err();
            assert!(e.starts_with("D=") && e.contains("not 0 or 1"), "{e}");
        }
    }
}
