//! Orchestration: bring up the topology, start the server and the client as child
//! processes in their namespaces, collect their results, tear down.
//!
//! Children talk to the orchestrator with lines on stdout:
//! `KNB_READY {"pid":N}` (server listening), `KNB_PROGRESS <secs> <completions>`
//! (client, once a second), `KNB_RESULT <json>` (either side, at exit).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};
use testbed::{Prefix, Topology};

use crate::backend::{self, Backend, ClientPlan, ClientSpec, ServerSpec};
use crate::cpu;
use crate::engine;
use crate::report;
use crate::workload::{parse_cpus, parse_secs, Cpus, Error, Res, Stack, Workload};

/// Default TCP port of the RPC server.
pub const DEFAULT_PORT: u16 = 7700;

fn ncpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Default server CPUs: CPU 1 (CPU 0 where there is only one).
pub fn default_server_cpus() -> Vec<usize> {
    vec![1 % ncpus()]
}

/// Where the two sides run.
#[derive(Args, Debug, Clone)]
pub struct Placement {
    /// CPUs of the client threads (thread i on the i-th, wrapping), e.g. 0 or 0,2.
    #[arg(long, default_value = "0", value_parser = parse_cpus)]
    pub client_cpus: Cpus,
    /// CPUs of the server threads [default: 1, or 0 on a one-CPU machine].
    #[arg(long, value_parser = parse_cpus)]
    pub server_cpus: Option<Cpus>,
    /// TCP port of the server.
    #[arg(long, default_value_t = DEFAULT_PORT, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    // The help text is an attribute, not a doc comment: rustdoc would read its brackets as
    // links and `<pid>` as an HTML tag.
    #[arg(
        long,
        help = "Testbed name prefix (1-10 of [a-z0-9], starting with a letter) [default: lkb<pid>]."
    )]
    pub prefix: Option<String>,
}

impl Placement {
    /// Server CPUs after defaults.
    pub fn server_cpus(&self) -> Vec<usize> {
        self.server_cpus
            .clone()
            .map(|c| c.0)
            .unwrap_or_else(default_server_cpus)
    }

    /// Checks the CPU numbers exist.
    pub fn validate(&self) -> Res<()> {
        let n = ncpus();
        for c in self.client_cpus.0.iter().chain(self.server_cpus().iter()) {
            if *c >= n {
                return Err(Error::Usage(format!(
                    "CPU {c} does not exist (this machine has {n}: 0..={})",
                    n - 1
                )));
            }
        }
        Ok(())
    }

    /// The validated prefix.
    pub fn prefix(&self) -> Res<Prefix> {
        let s = self
            .prefix
            .clone()
            .unwrap_or_else(|| format!("lkb{}", std::process::id()));
        Prefix::new(&s).map_err(|e| Error::Usage(format!("--prefix: {e}")))
    }
}

/// Output options.
#[derive(Args, Debug, Clone, Default)]
pub struct Output {
    /// Also write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also write the result as CSV (header + one row per run) to this file.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Show a progress line on stderr even when it is not a terminal.
    #[arg(long)]
    pub progress: bool,
}

impl Output {
    /// Whether to draw progress lines.
    pub fn show_progress(&self) -> bool {
        self.progress || std::io::stderr().is_terminal()
    }
}

/// Removes testbed leftovers of earlier knb runs whose process is gone.
pub fn sweep_stale() {
    let Ok(dir) = std::fs::read_dir(testbed::state_root()) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("lkb").and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            if let Ok(p) = Prefix::new(&name) {
                let _ = testbed::sweep(&p);
            }
        }
    }
}

/// Brings up the topology `b` needs under `prefix`.
pub fn topology_for(b: &dyn Backend, prefix: &Prefix) -> Res<Topology> {
    testbed::require_root().map_err(|e| Error::Run(e.to_string()))?;
    Topology::up(b.topology(), prefix)
        .map_err(|e| Error::Run(format!("testbed {}: {e}", b.topology())))
}

/// A child process whose stdout lines arrive on a channel.
struct ChildProc {
    child: Child,
    name: &'static str,
    lines: Receiver<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
    /// The server's stdin: [`ChildProc::ask_to_stop`] (None for the client).
    stdin: Option<std::process::ChildStdin>,
}

impl ChildProc {
    fn spawn(mut cmd: Command, name: &'static str) -> Result<ChildProc, String> {
        let server = name == "server";
        cmd.stdin(if server {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start the {name}: {e}"))?;
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            std::thread::spawn(move || {
                for l in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(l).is_err() {
                        break;
                    }
                }
            });
        }
        let stderr = child.stderr.take().map(|e| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = BufReader::new(e).read_to_string(&mut s);
                s
            })
        });
        Ok(ChildProc {
            child,
            name,
            lines,
            stderr,
            stdin,
        })
    }

    /// Tells a `knb server --child` that its client is done ([`backend::STOP_LINE`],
    /// then EOF): it stops serving and reports.
    fn ask_to_stop(&mut self) {
        if let Some(mut i) = self.stdin.take() {
            let _ = writeln!(i, "{}", backend::STOP_LINE);
        }
    }

    /// Waits up to `limit` for exit (kills past it); returns (ok, stderr tail).
    fn finish(mut self, limit: Duration) -> (bool, String) {
        let end = Instant::now() + limit;
        let (ok, how) = loop {
            match self.child.try_wait() {
                Ok(Some(st)) if st.success() => break (true, String::new()),
                Ok(Some(st)) => break (false, format!("{} {st}", self.name)),
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break (
                        false,
                        format!("{} did not exit within {limit:?}: killed", self.name),
                    );
                }
            }
        };
        let err = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        // The exit status goes last, after the child's own words.
        let mut err = tail(&err, 12);
        if !how.is_empty() {
            err.push_str(&format!("\n    ({how})"));
        }
        (ok, err)
    }
}

/// How long a server may take to end by itself once its client is done (its
/// connections closing) before it is asked to stop ([`backend::STOP_LINE`]).
const SERVER_GRACE: Duration = Duration::from_secs(3);

/// What a child's stderr (as [`ChildProc::finish`] returns it) says went wrong, in one
/// line: its last `knb: error:` message, else how it ended (exit status, killed), else
/// that it said nothing. `knb sweep` keeps only the first line of a failed run's error,
/// so that line must name the cause.
fn cause(err: &str) -> String {
    let lines: Vec<&str> = err.lines().map(str::trim).collect();
    if let Some(e) = lines
        .iter()
        .rev()
        .find_map(|l| l.split_once("knb: error: ").map(|(_, e)| e))
    {
        return e.to_string();
    }
    match lines.last() {
        Some(l) if l.starts_with('(') && l.ends_with(')') => l[1..l.len() - 1].to_string(),
        _ => "no error message".into(),
    }
}

fn tail(s: &str, n: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(n)..].join("\n    ")
}

fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// One RPC (or bulk) run of `b` on an existing topology; returns the report JSON.
pub fn run_on(
    topo: &Topology,
    b: &dyn Backend,
    w: &Workload,
    place: &Placement,
    progress: bool,
) -> Result<Value, String> {
    run_pair(topo, b, b, w, place, progress)
}

/// One run with `b` serving and `cb` as the client (the same backend except in interop
/// runs, where both must share the topology).
pub fn run_pair(
    topo: &Topology,
    b: &dyn Backend,
    cb: &dyn Backend,
    w: &Workload,
    place: &Placement,
    progress: bool,
) -> Result<Value, String> {
    if let Some(why) = b.unavailable().or_else(|| cb.unavailable()) {
        return Err(why);
    }
    if b.topology() != cb.topology() {
        return Err(format!(
            "{} and {} run on different topologies ({} and {})",
            b.stack().name(),
            cb.stack().name(),
            b.topology().name(),
            cb.topology().name()
        ));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let (scpus, ccpus) = (place.server_cpus(), place.client_cpus.0.clone());
    let mut ep = b.endpoints(topo, &scpus, &ccpus)?;
    if w.mtu != 1500 && topo.memif().is_none() {
        return Err(format!(
            "--mtu {} applies to the memif stacks (luna, smoltcp), not {}",
            w.mtu,
            b.stack().name()
        ));
    }
    if topo.memif().is_some() {
        // Both ends' memif buffers hold a whole frame, and their rings the same bytes of
        // buffers as `knb raw`'s: one link for every stack and the ceiling.
        let ring = crate::workload::memif_ring_args(crate::workload::memif_bsize(w.mtu))
            .map_err(|e| e.to_string())?;
        for p in [&mut ep.server, &mut ep.client] {
            for a in p.eal.iter_mut().filter(|a| a.starts_with("net_memif")) {
                a.push_str(&ring);
            }
        }
    }
    if w.memif_zero_copy {
        if topo.memif().is_none() {
            return Err(format!(
                "--memif-zero-copy applies to the memif stacks (luna, smoltcp), not {}",
                b.stack().name()
            ));
        }
        crate::backend::memif::zero_copy_client(&mut ep.client.eal);
    }
    // Where the host runs the two CPUs (crate::hostlink), probed while nothing polls.
    let link = crate::hostlink::Bracket::begin(ccpus.first().copied().zip(scpus.first().copied()));
    if let Some(m) = topo.memif() {
        // A socket left by an earlier server makes the next one fail to bind.
        let _ = std::fs::remove_file(&m.socket);
        r2c::device::dpdk::memif_quiesce_reset(&m.socket);
    }
    let lifetime = w.warmup + w.duration + 60.0;
    let list = |v: &[usize]| {
        v.iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let side = |sub: &str, netns: &str, cpus: &[usize], ip: Ipv4Addr, eal: &[String]| {
        let mut c = testbed::netns_command(netns, &exe);
        let stack = if sub == "client" {
            cb.stack()
        } else {
            b.stack()
        };
        c.arg(sub)
            .arg(format!("--stack={}", stack.name()))
            .arg(format!("--ip={ip}"))
            .arg(format!("--port={}", place.port))
            .arg(format!("--cpus={}", list(cpus)))
            .args(w.to_args())
            .arg("--child");
        for a in eal {
            c.arg(format!("--eal-arg={a}"));
        }
        c
    };
    let mut scmd = side(
        "server",
        &ep.server.netns,
        &scpus,
        ep.server.ip,
        &ep.server.eal,
    );
    scmd.arg(format!("--prefix-len={}", ep.server.prefix_len))
        .arg(format!("--lifetime={lifetime}"));
    let server_cmd = describe(&scmd);
    let server = ChildProc::spawn(scmd, "server")?;
    // Wait for the server to listen.
    let ready_by = Instant::now() + Duration::from_secs(30);
    let server_pid = loop {
        match server.lines.recv_timeout(Duration::from_millis(50)) {
            Ok(l) => {
                if let Some(j) = l.strip_prefix("KNB_READY ") {
                    let v: Value = serde_json::from_str(j).unwrap_or(Value::Null);
                    break v["pid"].as_u64().unwrap_or(0) as u32;
                }
            }
            Err(RecvTimeoutError::Timeout) if Instant::now() < ready_by => {}
            Err(_) => {
                let (_, err) = server.finish(Duration::from_secs(1));
                return Err(format!(
                    "the {} server did not become ready:\n    {err}",
                    b.stack().name()
                ));
            }
        }
    };
    let mut ccmd = side(
        "client",
        &ep.client.netns,
        &ccpus,
        ep.client.ip,
        &ep.client.eal,
    );
    ccmd.arg(format!("--prefix-len={}", ep.client.prefix_len))
        .arg(format!("--server-ip={}", ep.server.ip))
        .arg(format!("--server-pid={server_pid}"));
    let client_cmd = describe(&ccmd);
    let client = match ChildProc::spawn(ccmd, "client") {
        Ok(c) => c,
        Err(e) => {
            let _ = server.finish(Duration::ZERO);
            return Err(e);
        }
    };
    let limit = Instant::now() + Duration::from_secs_f64(lifetime);
    let mut result: Option<Value> = None;
    loop {
        // Blocks until a line (once a second) or the limit: the orchestrator's threads are
        // not pinned and would otherwise wake on a poller's CPU ten times a second.
        let left = limit.saturating_duration_since(Instant::now());
        match client
            .lines
            .recv_timeout(left.max(Duration::from_millis(1)))
        {
            Ok(l) => {
                if let Some(p) = l.strip_prefix("KNB_PROGRESS ") {
                    if progress {
                        eprint!("\r  {} {p:<40}", b.stack().name());
                        let _ = std::io::stderr().flush();
                    }
                } else if let Some(j) = l.strip_prefix("KNB_RESULT ") {
                    result = serde_json::from_str(j).ok();
                }
            }
            Err(RecvTimeoutError::Timeout) if Instant::now() < limit => {}
            Err(_) => break,
        }
    }
    if progress {
        eprint!("\r{:60}\r", "");
    }
    let (cok, cerr) = client.finish(Duration::from_secs(5));
    // The server exits once its connections close; give it a moment. A server still
    // busy past that (overloaded: answering requests the client no longer waits for,
    // or a close that never reached it) is asked to stop and report.
    let mut server = server;
    let mut asked = false;
    let mut until = Instant::now() + SERVER_GRACE;
    let sres = loop {
        match server
            .lines
            .recv_timeout(until.saturating_duration_since(Instant::now()))
        {
            Ok(l) => {
                if let Some(j) = l.strip_prefix("KNB_RESULT ") {
                    break serde_json::from_str::<Value>(j).ok();
                }
            }
            Err(RecvTimeoutError::Timeout) if !asked => {
                server.ask_to_stop();
                asked = true;
                until = Instant::now() + Duration::from_secs(10);
            }
            Err(_) => break None,
        }
    };
    let (sok, serr) = server.finish(Duration::from_secs(5));
    let host_link = link.end();
    let name = b.stack().name();
    let mut r = match (cok, result) {
        (true, Some(r)) => r,
        (ok, r) => {
            let why = if ok && r.is_none() {
                "the client exited 0 without a result line".to_string()
            } else {
                format!("client: {}", cause(&cerr))
            };
            return Err(format!(
                "the {name} run failed: {why}\n  client:\n    {cerr}\n  server:\n    {serr}"
            ));
        }
    };
    let server_v = sres.unwrap_or(Value::Null);
    if !sok {
        return Err(format!(
            "the {name} server failed: {}\n    {serr}\n  (client finished: {})",
            cause(&serr),
            r["rpcs"]
        ));
    }
    if let Some(errs) = server_v["errors"].as_array().filter(|e| !e.is_empty()) {
        return Err(format!("the {name} server saw errors: {errs:?}"));
    }
    r["knb"] = json!("rpc");
    r["stack"] = json!(name);
    if cb.stack() != b.stack() {
        r["client_stack"] = json!(cb.stack().name());
    }
    r["topology"] = json!(b.topology().name());
    let mut cfg = w.to_json();
    cfg["client_cpus"] = json!(ccpus);
    cfg["server_cpus"] = json!(scpus);
    r["config"] = cfg;
    let server_cores = r["cpu"]["server"]["cores"].as_f64().unwrap_or(0.0);
    r["rps_per_server_core"] = match r["rps"].as_f64() {
        Some(rps) if server_cores > 0.0 => json!(rps / server_cores),
        _ => Value::Null,
    };
    r["server"] = server_v;
    r["commands"] = json!({"server": server_cmd, "client": client_cmd});
    r["host_link"] = host_link;
    // Default thresholds; compare and sweep judge again with theirs.
    r["contention"] = crate::contention::assess(&r, &Default::default()).to_json();
    Ok(r)
}

/// Arguments of `knb rpc` / `knb bulk`.
#[derive(Args, Debug, Clone)]
pub struct RpcArgs {
    /// The stack to measure.
    #[arg(long, value_enum)]
    pub stack: Stack,
    /// Interop: run the client on this stack instead (same topology: luna ⇄ smoltcp).
    #[arg(long, value_enum)]
    pub client_stack: Option<Stack>,
    #[command(flatten)]
    pub workload: Workload,
    #[command(flatten)]
    pub place: Placement,
    #[command(flatten)]
    pub out: Output,
    /// Before the run, wait up to this many seconds for the host to place the client's
    /// and the server's CPU near each other (as `knb compare --wait-near`; probed once a
    /// second), then run either way: the run keeps its measured label. 0: do not wait.
    #[arg(long, default_value_t = 0.0, value_parser = crate::compare::parse_wait)]
    pub wait_near: f64,
}

/// `knb rpc`: one run with topology set-up and tear-down.
pub fn rpc(a: RpcArgs) -> Res<()> {
    a.workload.validate()?;
    a.place.validate()?;
    let prefix = a.place.prefix()?;
    let b = backend::backend(a.stack);
    check_server_model(a.stack, a.workload.emu.server_model)?;
    check_service_mode(a.stack, a.workload.emu.service_mode)?;
    if let Some(why) = b.unavailable() {
        return Err(Error::Run(why));
    }
    let cb = backend::backend(a.client_stack.unwrap_or(a.stack));
    if a.workload.mtu != 1500 && b.topology() != testbed::Kind::Memif {
        return Err(Error::Usage(format!(
            "--mtu applies to the memif stacks (luna, smoltcp); {}'s veth is 1500",
            b.stack().name()
        )));
    }
    if cb.topology() != b.topology() {
        return Err(Error::Usage(format!(
            "--client-stack {} runs on {}, --stack {} on {}: an interop run needs one topology \
             (luna and smoltcp share memif)",
            cb.stack().name(),
            cb.topology().name(),
            b.stack().name(),
            b.topology().name()
        )));
    }
    sweep_stale();
    let topo = topology_for(b, &prefix)?;
    let cpus = (a.place.client_cpus.0[0], a.place.server_cpus()[0]);
    let waited =
        (a.wait_near > 0.0).then(|| crate::hostlink::wait_before_run(a.wait_near, cpus, "knb").0);
    let r = run_pair(&topo, b, cb, &a.workload, &a.place, a.out.show_progress());
    drop(topo);
    let mut r = r?;
    if let Some(w) = waited {
        r["host_link"]["waited_s"] = serde_json::json!(w);
    }
    report::print_table(std::slice::from_ref(&r));
    report::write_outputs(&a.out, &r, std::slice::from_ref(&r))?;
    match nothing_measured(&r) {
        Some(why) => Err(Error::Run(why)),
        None => Ok(()),
    }
}

/// Why a finished run measured nothing (no RPC answered, or in bulk mode no byte
/// received, in the measured window), if it did: the table and the outputs are written,
/// and knb then fails instead of reporting a zero as a result.
fn nothing_measured(r: &serde_json::Value) -> Option<String> {
    let secs = r["duration_s"].as_f64().unwrap_or(0.0);
    if r["rps"].is_number() && r["rpcs"].as_u64() == Some(0) {
        return Some(format!(
            "no RPC completed in the {secs:.1} s window: nothing was measured (a server \
             that never answered, or a client that stopped)"
        ));
    }
    if r["rps"].is_null() && r["bulk"]["payload_received"].as_u64() == Some(0) {
        return Some(format!(
            "no byte received in the {secs:.1} s window: nothing was measured"
        ));
    }
    None
}

// ---------------------------------------------------------------- children ---

/// Arguments of `knb server`.
#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// The stack to serve with.
    #[arg(long, value_enum)]
    pub stack: Stack,
    /// Address to listen on.
    #[arg(long)]
    pub ip: Ipv4Addr,
    /// Prefix length of --ip (DPDK stacks configure their interface with it).
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u8).range(1..=32))]
    pub prefix_len: u8,
    /// TCP port.
    #[arg(long, default_value_t = DEFAULT_PORT, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// CPUs of the server threads.
    #[arg(long, default_value = "1", value_parser = parse_cpus)]
    pub cpus: Cpus,
    /// One DPDK EAL argument (repeat; DPDK stacks only), e.g. --eal-arg=--vdev=net_memif0,...
    #[arg(long, allow_hyphen_values = true)]
    pub eal_arg: Vec<String>,
    /// Exit after this many seconds whatever happens [default: warm-up + duration + 60].
    #[arg(long, value_parser = parse_secs)]
    pub lifetime: Option<f64>,
    #[command(flatten)]
    pub workload: Workload,
    /// luna only: share the NIC with the kernel (issue 11). PORT:IFACE names the
    /// exception port (a net_tap with its own --eal-arg=--vdev=PORT,iface=IFACE; the first
    /// --vdev is the NIC) and its kernel netdev: what the traffic model (the listening
    /// port and luna's client range on --ip) leaves to the kernel goes there, and the
    /// kernel's replies leave through the NIC. One lane (--threads 1).
    #[arg(long, value_parser = crate::backend::ExceptionSpec::parse)]
    pub exception: Option<crate::backend::ExceptionSpec>,
    /// With --exception: mirror IFACE's neighbours, routes and addresses into luna's
    /// stack (netlink-sync); luna then neither answers nor sends ARP.
    #[arg(long, requires = "exception")]
    pub exception_mirror: bool,
    /// With --exception: seconds the exception path stays up after knb's connections
    /// are done (the kernel's traffic through the NIC stops when knb exits).
    #[arg(long, requires = "exception", default_value = "1", value_parser = parse_secs)]
    pub exception_linger: f64,
    /// Internal: machine-readable lines for the orchestrator.
    #[arg(long, hide = true)]
    pub child: bool,
}

/// `--exception` is luna's, on one lane, inline.
fn check_exception(a: &ServerArgs) -> Res<()> {
    if a.exception.is_none() {
        return Ok(());
    }
    if a.stack != Stack::Luna {
        return Err(Error::Usage(format!(
            "--exception is luna's kernel coexistence; --stack {} has none",
            a.stack.name()
        )));
    }
    if a.workload.threads != 1 || a.workload.emu.server_model.is_some() {
        return Err(Error::Usage(
            "--exception runs one inline lane: use --threads 1 and no --server-model".into(),
        ));
    }
    Ok(())
}

/// Which stacks run which `--server-model`: the kernel cp|cs|pool, luna cp|cs|ms.
pub(crate) fn check_server_model(stack: Stack, m: Option<crate::service::ServerModel>) -> Res<()> {
    use crate::service::ServerModel as M;
    match (stack, m) {
        (_, None)
        | (Stack::Kernel, Some(M::Cp | M::Cs | M::Pool))
        | (Stack::Luna, Some(M::Cp | M::Cs | M::Ms)) => Ok(()),
        (s, Some(m)) => Err(Error::Usage(format!(
            "--server-model {} is not available on --stack {} (kernel: cp, cs, pool; luna: cp, cs, ms)",
            m.name(),
            s.name()
        ))),
    }
}

/// Timer mode (virtual workers) exists in luna's message mode only; the kernel
/// baselines keep real threads.
pub(crate) fn check_service_mode(stack: Stack, mode: crate::service::ServiceMode) -> Res<()> {
    if mode == crate::service::ServiceMode::Timer && stack != Stack::Luna {
        return Err(Error::Usage(format!(
            "--service-mode timer (virtual workers) runs on --stack luna --server-model \
             cp|cs|ms only; --stack {} keeps real threads: use spin or sleep",
            stack.name()
        )));
    }
    Ok(())
}

/// `knb server`: serve `--connections` connections, then exit.
pub fn server(a: ServerArgs) -> Res<()> {
    a.workload.validate()?;
    check_server_model(a.stack, a.workload.emu.server_model)?;
    check_service_mode(a.stack, a.workload.emu.service_mode)?;
    check_exception(&a)?;
    // Engines that answer inline (no --server-model) occupy their thread this way.
    crate::service::set_inline_mode(a.workload.emu.service_mode);
    let b = backend::backend(a.stack);
    if let Some(why) = b.unavailable() {
        return Err(Error::Run(why));
    }
    let spec = ServerSpec {
        workload: a.workload.clone(),
        ip: a.ip,
        prefix_len: a.prefix_len,
        port: a.port,
        cpus: a.cpus.0.clone(),
        eal: a.eal_arg.clone(),
        lifetime: Duration::from_secs_f64(
            a.lifetime
                .unwrap_or(a.workload.warmup + a.workload.duration + 60.0),
        ),
        exception: a.exception.clone().map(|mut x| {
            x.mirror = a.exception_mirror;
            x.linger = Duration::from_secs_f64(a.exception_linger);
            x
        }),
    };
    backend::pin(a.cpus.0[0]).map_err(Error::Run)?;
    let child = a.child;
    if child {
        backend::watch_for_stop();
    }
    let mut ready = || {
        let pid = std::process::id();
        if child {
            println!("KNB_READY {}", json!({"pid": pid}));
        } else {
            eprintln!(
                "knb server ({}) listening on {}:{} (pid {pid})",
                a.stack.name(),
                a.ip,
                a.port
            );
        }
        let _ = std::io::stdout().flush();
    };
    let mut r = b.serve(&spec, &mut ready).map_err(Error::Run)?;
    if backend::stop_requested() {
        // Its client was done before it: requests it held then are the client's
        // `sent_not_answered`; not an error.
        if let Value::Object(o) = &mut r.extra {
            o.insert("stopped_after_client".into(), json!(true));
        } else {
            r.extra = json!({"stopped_after_client": true});
        }
    }
    if child {
        println!("KNB_RESULT {}", r.to_json());
    } else {
        println!(
            "{}",
            serde_json::to_string_pretty(&r.to_json()).unwrap_or_default()
        );
    }
    if !r.errors.is_empty() {
        return Err(Error::Run(format!("server errors: {:?}", r.errors)));
    }
    Ok(())
}

/// Arguments of `knb client`.
#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    /// The stack to load with.
    #[arg(long, value_enum)]
    pub stack: Stack,
    /// This side's address (DPDK stacks configure it; the kernel picks its own).
    #[arg(long)]
    pub ip: Ipv4Addr,
    /// Prefix length of --ip.
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u8).range(1..=32))]
    pub prefix_len: u8,
    /// The server's address.
    #[arg(long)]
    pub server_ip: Ipv4Addr,
    /// TCP port.
    #[arg(long, default_value_t = DEFAULT_PORT, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// CPUs of the client threads.
    #[arg(long, default_value = "0", value_parser = parse_cpus)]
    pub cpus: Cpus,
    /// One DPDK EAL argument (repeat; DPDK stacks only).
    #[arg(long, allow_hyphen_values = true)]
    pub eal_arg: Vec<String>,
    /// The server's pid, to report its CPU use too.
    #[arg(long)]
    pub server_pid: Option<u32>,
    #[command(flatten)]
    pub workload: Workload,
    #[command(flatten)]
    pub out: Output,
    /// Internal: machine-readable lines for the orchestrator.
    #[arg(long, hide = true)]
    pub child: bool,
}

/// `knb client`: run the workload against a server, report.
pub fn client(a: ClientArgs) -> Res<()> {
    a.workload.validate()?;
    let b = backend::backend(a.stack);
    if let Some(why) = b.unavailable() {
        return Err(Error::Run(why));
    }
    let w = a.workload.clone();
    let spec = ClientSpec {
        ip: a.ip,
        prefix_len: a.prefix_len,
        server_ip: a.server_ip,
        port: a.port,
        cpus: a.cpus.0.clone(),
        eal: a.eal_arg.clone(),
    };
    backend::pin(a.cpus.0[0]).map_err(Error::Run)?;
    let plan = std::sync::Arc::new(ClientPlan::new(w.clone()));
    let bell = Bell::default();
    let progress_tty = !a.child && a.out.show_progress();
    let (results, cpu_v) = std::thread::scope(|s| {
        let mon = s.spawn(|| {
            let v = monitor(&plan, &bell, a.server_pid, a.child, progress_tty);
            plan.end_sampled();
            v
        });
        let r = b.run_client(&spec, &plan);
        bell.ring();
        (r, mon.join().unwrap_or(Value::Null))
    });
    let results = results.map_err(Error::Run)?;
    let mut r = engine::merge(results, w.duration, w.mode.into(), w.rate);
    r["cpu"] = cpu_v;
    if let Some(errs) = r["errors"].as_array().filter(|e| !e.is_empty()) {
        let errs: Vec<String> = errs
            .iter()
            .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_string))
            .collect();
        return Err(Error::Run(format!("the run failed: {}", errs.join("; "))));
    }
    if r["open_loop"]["arrivals"].as_u64() == Some(0) {
        // Seen once (not reproduced): a client that ended before its window reported 0
        // RPC/s as a success. A Poisson schedule always has arrivals in the window.
        return Err(Error::Run(
            "open loop: no arrival was scheduled in the measured window (the client ended \
             before it?)"
                .into(),
        ));
    }
    if a.child {
        println!("KNB_RESULT {r}");
        return Ok(());
    }
    r["knb"] = json!("client");
    r["stack"] = json!(a.stack.name());
    r["config"] = w.to_json();
    report::print_table(std::slice::from_ref(&r));
    report::write_outputs(&a.out, &r, std::slice::from_ref(&r))
}

/// The client's "run finished" flag, with a condition variable so the monitor thread
/// sleeps until its next event instead of waking every few milliseconds: it shares a
/// busy-polling client thread's CPU, and every wake-up preempts that thread.
#[derive(Default)]
struct Bell {
    done: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
}

impl Bell {
    fn ring(&self) {
        if let Ok(mut d) = self.done.lock() {
            *d = true;
        }
        self.cv.notify_all();
    }

    fn is_done(&self) -> bool {
        self.done.lock().map_or(true, |d| *d)
    }

    /// Sleeps until `t` or the ring; true if rung.
    fn sleep_until(&self, t: Instant) -> bool {
        let Ok(mut d) = self.done.lock() else {
            return true;
        };
        while !*d {
            let now = Instant::now();
            if now >= t {
                return false;
            }
            match self.cv.wait_timeout(d, t - now) {
                Ok((g, _)) => d = g,
                Err(_) => return true,
            }
        }
        true
    }
}

/// Samples CPU (per thread, with involuntary context switches) and the host's steal time
/// at the window's start and end, and prints progress once a second. Wakes only for
/// those events (about duration + 3 times a run).
fn monitor(
    plan: &ClientPlan,
    bell: &Bell,
    server_pid: Option<u32>,
    child: bool,
    tty: bool,
) -> Value {
    let timing = loop {
        if let Some(t) = plan.timing() {
            break t;
        }
        // Before the window (connections being set up): a short poll is harmless.
        if bell.sleep_until(Instant::now() + Duration::from_millis(2)) {
            return Value::Null;
        }
    };
    let me = std::process::id();
    let start = Instant::now();
    let mut next = start + Duration::from_secs(1);
    type At = (
        cpu::Sample,
        Option<cpu::Sample>,
        BTreeMap<u32, cpu::CpuTimes>,
        Instant,
    );
    let take = || -> Option<At> {
        let host = cpu::host_times();
        let c = cpu::sample(me)?;
        Some((c, server_pid.and_then(cpu::sample), host, Instant::now()))
    };
    let mut a: Option<At> = None;
    let mut b: Option<At> = None;
    let mut last = 0u64;
    loop {
        let t = [next, timing.warm_end, timing.end]
            .into_iter()
            .filter(|&t| t > Instant::now())
            .min();
        let rung = match t {
            Some(t) => bell.sleep_until(t),
            None => bell.sleep_until(Instant::now() + Duration::from_millis(10)),
        };
        if rung || bell.is_done() {
            break;
        }
        let now = Instant::now();
        if a.is_none() && now >= timing.warm_end {
            a = take();
        }
        if b.is_none() && now >= timing.end {
            b = take();
        }
        if now >= next {
            next += Duration::from_secs(1);
            let c = plan.progress.load(Ordering::Relaxed);
            let secs = now.duration_since(start).as_secs_f64();
            if child {
                println!("KNB_PROGRESS {secs:.0}s {} RPC/s", c - last);
                let _ = std::io::stdout().flush();
            } else if tty {
                eprint!("\r  {secs:.0}s {} RPC/s      ", c - last);
            }
            last = c;
        }
        if b.is_some() {
            break;
        }
    }
    if tty {
        eprint!("\r{:40}\r", "");
    }
    match (a, b) {
        (Some((ca, sa, ha, ta)), Some((cb, sb, hb, tb))) => {
            let secs = tb.duration_since(ta).as_secs_f64();
            let client = cpu::usage(&ca, &cb, secs);
            let server = match (sa, sb) {
                (Some(x), Some(y)) => cpu::usage(&x, &y, secs),
                _ => Value::Null,
            };
            let per_core = cpu::per_core(&[&client, &server]);
            let all: Vec<usize> = hb.keys().map(|&c| c as usize).collect();
            let steal = cpu::steal(&ha, &hb, &all);
            json!({"client": client, "server": server, "per_core": per_core, "steal": steal})
        }
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run that measured nothing fails (after its table) instead of reporting zero as
    /// a result; a run with RPCs, or a bulk run with bytes, does not.
    #[test]
    fn a_run_without_a_measurement_is_an_error() {
        let rpc = |n: u64| serde_json::json!({"duration_s": 3.0, "rpcs": n, "rps": n as f64 / 3.0});
        let why = nothing_measured(&rpc(0)).expect("zero RPCs is not a result");
        assert!(
            why.contains("no RPC completed in the 3.0 s window"),
            "{why}"
        );
        assert_eq!(nothing_measured(&rpc(1)), None);
        let bulk = |b: u64| {
            serde_json::json!({"duration_s": 2.0, "rpcs": 0, "rps": null,
                "bulk": {"payload_received": b}})
        };
        assert!(nothing_measured(&bulk(0))
            .unwrap()
            .contains("no byte received"));
        assert_eq!(nothing_measured(&bulk(4096)), None);
    }

    /// A sweep keeps one line per failed run: it must carry the child's own reason.
    #[test]
    fn a_failed_childs_cause_is_its_last_error_line_or_how_it_ended() {
        let client = "EAL: Detected CPU lcores: 2\n    knb: the memif peer did not stop polling \
                      within 5s; closing anyway\n    knb: error: the run failed: connection 2513 \
                      of lane 0: zbuf: 1360 B for headers: exhausted\n    (client exit status: 1)";
        assert_eq!(
            cause(client),
            "the run failed: connection 2513 of lane 0: zbuf: 1360 B for headers: exhausted"
        );
        let killed = "EAL: Detected CPU lcores: 2\n    (server did not exit within 5s: killed)";
        assert_eq!(cause(killed), "server did not exit within 5s: killed");
        assert_eq!(cause(""), "no error message");
    }
}
