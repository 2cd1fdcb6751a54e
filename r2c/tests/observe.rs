//! Observability against a live runtime: an inline echo server with a control socket
//! over the in-memory link, driven by a luna client; `lunactl` (the real binary) reads
//! its counters and connections and captures the run to pcapng, which tshark reads.

mod common;

use common::*;
use r2c::control::ControlConfig;
use r2c::{Conn, CoreOptions, Ctx, InlineApp, Runtime};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use zbuf::{Slab, SlabConfig, Zbuf};

const CONNS: usize = 3;
const LEN: usize = 20_000;
const PORT: u16 = 7;

#[path = "common/echo.rs"]
mod echo;
const ECHO: echo::Echo = echo::Echo {
    port: PORT,
    backlog: 64,
};

#[derive(Default)]
struct Measured {
    connected: AtomicUsize,
    echoed_bytes: AtomicUsize,
    done: AtomicUsize,
    local_ports: Mutex<BTreeSet<u16>>,
    bad: Mutex<Vec<String>>,
}

/// Opens `CONNS` connections, sends `LEN` bytes on each, checks the echo, then holds the
/// connections open until `release`.
struct Client {
    m: Arc<Measured>,
    release: Arc<AtomicBool>,
    got: HashMap<Conn, Vec<u8>>,
    released: bool,
}

fn payload(i: usize) -> Vec<u8> {
    (0..LEN).map(|b| (b * 7 + i) as u8).collect()
}

impl InlineApp for Client {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        for _ in 0..CONNS {
            let c = ctx.connect(server_addr(PORT)).expect("connect");
            self.got.insert(c, Vec::new());
        }
    }
    fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        self.m.connected.fetch_add(1, Ordering::SeqCst);
        let (local, _) = ctx.addrs(conn).unwrap();
        self.m.local_ports.lock().unwrap().insert(local.port());
        // The byte pattern is keyed by the local port: each connection's echo is its own.
        ctx.send_all(conn, Zbuf::from_vec(payload(local.port() as usize)))
            .unwrap();
    }
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        while let Ok(Some(b)) = ctx.recv(conn) {
            self.m.echoed_bytes.fetch_add(b.len(), Ordering::SeqCst);
            self.got.get_mut(&conn).unwrap().extend_from_slice(&b);
        }
        let data = &self.got[&conn];
        if data.len() == LEN {
            let (local, _) = ctx.addrs(conn).unwrap();
            if *data != payload(local.port() as usize) {
                self.m.bad.lock().unwrap().push("echo differs".into());
            }
            self.m.done.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn on_poll(&mut self, ctx: &mut Ctx<'_>) {
        if !self.released && self.release.load(Ordering::SeqCst) {
            self.released = true;
            for &c in self.got.keys() {
                ctx.close(c);
            }
        }
    }
    fn on_closed(&mut self, _: &mut Ctx<'_>, _: Conn, r: Option<luna_stack::tcp::CloseReason>) {
        if !self.released {
            self.m
                .bad
                .lock()
                .unwrap()
                .push(format!("closed early: {r:?}"));
        }
    }
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("r2c-observe-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn lunactl(socket: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lunactl"))
        .arg("-s")
        .arg(socket)
        .args(args)
        .output()
        .expect("run lunactl")
}

/// Runs lunactl and returns its stdout; fails the test on a non-zero exit.
fn lunactl_ok(socket: &Path, args: &[&str]) -> String {
    let out = lunactl(socket, args);
    assert!(
        out.status.success(),
        "lunactl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn json(socket: &Path, args: &[&str]) -> Value {
    serde_json::from_str(&lunactl_ok(socket, args)).expect("lunactl --json prints JSON")
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{v} is not a count"))
}

/// Datacenter RTO floors are too eager for a loaded 2-CPU machine: keep retransmissions
/// out of a byte-count test.
fn patient(setups: &mut [r2c::CoreSetup<r2c::device::mem::MemDevice>]) {
    for s in setups {
        s.stack.tcp.rtt.min_rto = luna_stack::time::Duration::from_millis(500);
        s.stack.tcp.rtt.initial_rto = luna_stack::time::Duration::from_secs(1);
    }
}

fn slab() -> Slab {
    Slab::new(
        SlabConfig::new()
            .hugepages(zbuf::HugepageMode::Never)
            .max_memory(64 << 20),
    )
    .expect("slab")
}

fn tshark_fields(file: &Path, filter: Option<&str>, fields: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(file).args(["-T", "fields"]);
    if let Some(f) = filter {
        cmd.args(["-Y", f]);
    }
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd
        .output()
        .expect("tshark is installed (testbed/setup.sh)");
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect()
}

#[test]
fn lunactl_counters_conns_and_capture_match_a_live_run() {
    let dir = tmpdir("live");
    let socket = dir.join("srv.sock");
    let pcap = dir.join("run.pcapng");
    let (mut server, mut client) = pair(1, 1, |_| {});
    patient(&mut server);
    patient(&mut client);
    let slab = slab();
    let sopts = CoreOptions {
        control: Some(ControlConfig::new(&socket)),
        slab: Some(slab.clone()),
        ..opts()
    };
    let srv = Runtime::spawn_inline(server, sopts, |_| ECHO).unwrap();

    // Capture from before the first SYN.
    let out = lunactl_ok(
        &socket,
        &[
            "capture",
            "start",
            "--port",
            "0",
            "--file",
            pcap.to_str().unwrap(),
        ],
    );
    assert!(out.contains("capturing port 0"), "{out}");
    let again = lunactl(
        &socket,
        &[
            "capture",
            "start",
            "--port",
            "0",
            "--file",
            pcap.to_str().unwrap(),
        ],
    );
    assert!(
        !again.status.success(),
        "a second capture of one port is refused"
    );
    assert!(String::from_utf8_lossy(&again.stderr).contains("already"));
    let wrong = lunactl(
        &socket,
        &["capture", "start", "--port", "5", "--file", "/tmp/x"],
    );
    assert!(!wrong.status.success());
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("port 5"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );

    let m = Arc::new(Measured::default());
    let release = Arc::new(AtomicBool::new(false));
    let (m2, r2) = (Arc::clone(&m), Arc::clone(&release));
    let cli = Runtime::spawn_inline(client, opts(), move |_| Client {
        m: Arc::clone(&m2),
        release: Arc::clone(&r2),
        got: HashMap::new(),
        released: false,
    })
    .unwrap();
    wait_for("every echo", || m.done.load(Ordering::SeqCst) == CONNS);
    assert!(
        m.bad.lock().unwrap().is_empty(),
        "{:?}",
        m.bad.lock().unwrap()
    );
    assert_eq!(m.echoed_bytes.load(Ordering::SeqCst), CONNS * LEN);

    // (a) counters match what the client measured.
    let stats = json(&socket, &["stats", "--json"]);
    assert_eq!(stats["ok"], true);
    let core = &stats["cores"][0];
    assert_eq!(core["answered"], true, "{core}");
    assert_eq!(
        n(&core["stats"]["accepted"]),
        m.connected.load(Ordering::SeqCst) as u64
    );
    assert_eq!(n(&core["stats"]["accepted"]), CONNS as u64);
    assert_eq!(
        n(&core["tcp"]["bytes_in"]),
        (CONNS * LEN) as u64,
        "bytes the client sent"
    );
    assert_eq!(n(&core["stack"]["passive_opens"]), CONNS as u64);
    assert_eq!(n(&core["states"]["ESTABLISHED"]), CONNS as u64);
    assert_eq!(n(&core["stack"]["drops"]), 0);
    let dev = &core["devices"][0];
    assert_eq!(n(&dev["port"]), 0);
    assert!(n(&dev["stats"]["rx_frames"]) > 0);
    assert!(n(&stats["zbuf"]["objects"]) > 0, "{}", stats["zbuf"]);

    // (b) the connections, netstat-style.
    let conns = json(&socket, &["conns", "--json"]);
    let conns = conns.as_array().unwrap();
    assert_eq!(conns.len(), CONNS, "{conns:?}");
    let mut remote_ports = BTreeSet::new();
    for c in conns {
        assert_eq!(c["state"], "ESTABLISHED");
        assert_eq!(c["local"], format!("{SERVER_IP}:{PORT}"));
        let remote: std::net::SocketAddrV4 = c["remote"].as_str().unwrap().parse().unwrap();
        assert_eq!(*remote.ip(), CLIENT_IP);
        remote_ports.insert(remote.port());
        assert_eq!(n(&c["bytes_in"]), LEN as u64);
        assert_eq!(n(&c["recv_queue"]), 0);
        assert!(n(&c["cwnd"]) > 0);
    }
    assert_eq!(remote_ports, *m.local_ports.lock().unwrap());
    let ls = json(&socket, &["conns", "-l", "--json"]);
    let ls = ls.as_array().unwrap();
    assert_eq!(ls.len(), 1);
    assert_eq!(ls[0]["local"], format!("{SERVER_IP}:{PORT}"));
    assert_eq!(n(&ls[0]["backlog"]), 64);

    // The human-readable forms.
    let table = lunactl_ok(&socket, &["conns"]);
    assert_eq!(table.matches("ESTABLISHED").count(), CONNS, "{table}");
    let text = lunactl_ok(&socket, &["stats"]);
    assert!(
        text.contains("accepted") && text.contains("bytes_in"),
        "{text}"
    );
    let top = lunactl_ok(&socket, &["top", "--count", "2", "--interval", "100"]);
    assert_eq!(top.matches("lunactl top").count(), 2, "{top}");

    // (c) the capture: stop it, then tshark reads every byte sent.
    release.store(true, Ordering::SeqCst);
    // Closed on both sides: the server holds no connection but TIME-WAIT ones (if any).
    wait_for("connections close", || {
        let s = json(&socket, &["stats", "--json"]);
        let states = s["cores"][0]["states"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        std::thread::sleep(std::time::Duration::from_millis(50));
        states.keys().all(|k| k == "TIME-WAIT" || k == "CLOSED")
    });
    let stop = json(&socket, &["capture", "stop", "--port", "0", "--json"]);
    let cs = &stop["stats"];
    assert_eq!(n(&cs["dropped_oldest"]), 0);
    assert_eq!(n(&cs["written"]), n(&cs["captured"]));
    let again = lunactl(&socket, &["capture", "stop", "--port", "0"]);
    assert!(!again.status.success(), "stopping twice is an error");

    let rows = tshark_fields(&pcap, None, &["frame.number"]);
    assert_eq!(
        rows.len() as u64,
        n(&cs["written"]),
        "tshark reads every frame"
    );
    let not_tcp = tshark_fields(&pcap, Some("!tcp"), &["frame.number"]);
    assert!(not_tcp.is_empty(), "non-TCP frames: {not_tcp:?}");
    let bad = tshark_fields(
        &pcap,
        Some("_ws.malformed || _ws.expert.severity >= \"error\""),
        &["frame.number", "_ws.expert.message"],
    );
    assert!(bad.is_empty(), "malformed or error expert info: {bad:?}");
    // Distinct payload bytes per stream and direction: the highest relative sequence
    // number reached (retransmissions, if any, count once).
    let segs = tshark_fields(
        &pcap,
        Some("tcp.len > 0"),
        &["tcp.stream", "tcp.dstport", "tcp.seq", "tcp.len"],
    );
    let mut reach: BTreeMap<(String, bool), u64> = BTreeMap::new();
    for r in &segs {
        let to_server = r[1] == PORT.to_string();
        let end = r[2].parse::<u64>().unwrap() - 1 + r[3].parse::<u64>().unwrap();
        let e = reach.entry((r[0].clone(), to_server)).or_insert(0);
        *e = (*e).max(end);
    }
    let streams: BTreeSet<&String> = reach.keys().map(|(s, _)| s).collect();
    assert_eq!(streams.len(), CONNS);
    let sent: u64 = reach
        .iter()
        .filter(|((_, up), _)| *up)
        .map(|(_, v)| v)
        .sum();
    let echoed: u64 = reach
        .iter()
        .filter(|((_, up), _)| !*up)
        .map(|(_, v)| v)
        .sum();
    assert_eq!(
        sent,
        (CONNS * LEN) as u64,
        "bytes tshark sees client -> server"
    );
    assert_eq!(
        echoed,
        (CONNS * LEN) as u64,
        "bytes tshark sees server -> client"
    );
    let stats_after = json(&socket, &["stats", "--json"]);
    let retx = n(&stats_after["cores"][0]["tcp"]["retransmits"]);
    let total: u64 = tshark_fields(&pcap, Some("tcp.len > 0"), &["tcp.len"])
        .iter()
        .map(|r| r[0].parse::<u64>().unwrap())
        .sum();
    if retx == 0 {
        assert_eq!(total, 2 * (CONNS * LEN) as u64, "every payload byte once");
    }

    cli.stop();
    cli.join().unwrap();
    srv.stop();
    srv.join().unwrap();
    assert!(!socket.exists(), "the socket file is removed at shutdown");
    let gone = lunactl(&socket, &["stats"]);
    assert!(!gone.status.success());
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("no control socket"),
        "{}",
        String::from_utf8_lossy(&gone.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_runtime_on_one_socket_is_refused_and_a_stale_one_replaced() {
    let dir = tmpdir("owner");
    let socket = dir.join("one.sock");
    let o = || CoreOptions {
        control: Some(ControlConfig::new(&socket)),
        ..opts()
    };
    let (a, _pa) = pair(1, 1, |_| {});
    let first = Runtime::spawn_inline(a, o(), |_| ECHO).unwrap();
    let (b, _pb) = pair(1, 1, |_| {});
    let e = Runtime::spawn_inline(b, o(), |_| ECHO).unwrap_err();
    assert!(e.to_string().contains("in use"), "{e}");
    // The first still answers.
    let s = json(&socket, &["stats", "--json"]);
    assert_eq!(s["pid"], std::process::id());
    first.stop();
    first.join().unwrap();
    // A dead process's socket file: bound, never removed.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let dead = lunactl(&socket, &["stats"]);
    assert!(!dead.status.success());
    assert!(
        String::from_utf8_lossy(&dead.stderr).contains("no process answers"),
        "{}",
        String::from_utf8_lossy(&dead.stderr)
    );
    let (c, _pc) = pair(1, 1, |_| {});
    let again = Runtime::spawn_inline(c, o(), |_| ECHO).unwrap();
    assert_eq!(json(&socket, &["stats", "--json"])["ok"], true);
    again.stop();
    again.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn control_section_is_validated() {
    let base = "[device]\nkind = \"mem\"\n[cores]\nlist = [0]\n[net]\nip = \"198.18.0.1\"\n";
    let c =
        r2c::config::Config::parse(&format!("{base}[control]\nsocket = \"/run/luna/a.sock\"\n"))
            .unwrap();
    assert_eq!(
        c.options.control,
        Some(ControlConfig::new("/run/luna/a.sock"))
    );
    assert_eq!(
        r2c::config::Config::parse(base).unwrap().options.control,
        None
    );
    for (extra, key, word) in [
        ("[control]\n", "control.socket", "missing"),
        ("[control]\nsocket = \"\"\n", "control.socket", "empty"),
        ("[control]\nsocket = 3\n", "control.socket", "string"),
        (
            &*format!("[control]\nsocket = \"/{}\"\n", "x".repeat(120)),
            "control.socket",
            "at most",
        ),
        (
            "[control]\nsocket = \"/a\"\nport = 1\n",
            "control.port",
            "unknown",
        ),
    ] {
        let e = r2c::config::Config::parse(&format!("{base}{extra}")).unwrap_err();
        assert_eq!(e.key, key, "{e}");
        assert!(e.to_string().contains(word), "{e}");
    }
}
