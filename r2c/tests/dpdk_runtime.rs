//! The r2c runtime over [`DpdkDevice`] on the testbed: RPC servers in inline and batch
//! mode answer RPC clients.
//!
//! * memif: a server process (inline-r2c or batch-r2c) and a client process (an
//!   inline-r2c client keeping several RPCs outstanding on each of several connections)
//!   exchange RPCs of mixed sizes; every response is checked byte for byte, and the
//!   server echoes payload without copying it (zero bytes copied by device and zbuf).
//! * tap: a kernel client (Python sockets, in the tap topology's host namespace) sends
//!   RPCs to an inline server on net_tap and checks every reply.
//!
//! Framing is knb's (examples/knb): a 16-byte header `id u64 | len u32 | flags u16 |
//! magic u16 = 0x6e6b`, little endian, then `len` payload bytes. The server answers each
//! request with the same id, the RESPONSE flag and the request's payload (echo RPC).
//!
//! Each DPDK process is this test binary re-executed inside the topology's namespace
//! with its role set (`common/children.rs`) (the ignored `role_child` test is the entry point); it prints
//! an `OK key=value...` line. Needs root, hugepages and the testbed (`make setup`).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dpdk_sys::Eal;
use luna_stack::stack::RecvError;
use luna_stack::stack::{StackConfig, SynCookieMode};
use luna_stack::tcp::CloseReason;
use luna_stack::wire::Ipv4Cidr;
use r2c::batch::{BatchApp, Fd, Interest, PollEvent, SockError, Sockets};
use r2c::device::dpdk::{from_testbed, memif_quiesce, memif_quiesce_reset, DpdkDevice};
use r2c::device::Device;
use r2c::{
    Conn, CoreOptions, CoreReport, CoreSetup, Ctx, IdleStrategy, InlineApp, ReleaseHook, Runtime,
};
use testbed::{DpdkPort, Kind, Prefix, Topology};

#[path = "common/children.rs"]
mod children;
use children::{field, lines, role_command, spawn, spawn_on_tap, ARG, PORT_JSON, ROLE};
use zbuf::dpdk::DmaRegistry;
use zbuf::{copy_stats, Slab, SlabConfig, Zbuf};

/// Hang guard for a child (never reached in a passing run).
const LIMIT: Duration = Duration::from_secs(60);
const RPC_PORT: u16 = 7700;

const MAGIC: u16 = 0x6e6b;
const RESPONSE: u16 = 1;
const HDR: usize = 16;
/// Largest payload a server accepts (as knb).
const MAX_PAYLOAD: u32 = 1 << 20;

/// memif client: connections, RPCs outstanding per connection, RPCs per connection.
const CONNS: usize = 4;
const DEPTH: usize = 8;
const RPCS: u64 = 300;
/// Payload sizes, cycled by id: empty, tiny, one segment, several, many.
const SIZES: [u32; 6] = [0, 1, 100, 1448, 4096, 20_000];

fn size_of(id: u64) -> u32 {
    SIZES[(id % SIZES.len() as u64) as usize]
}

/// Byte `off` of request `id`'s payload.
fn pattern(id: u64, off: u32) -> u8 {
    (id.wrapping_mul(131).wrapping_add(u64::from(off)) & 0xff) as u8
}

fn header(id: u64, len: u32, flags: u16) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[0..8].copy_from_slice(&id.to_le_bytes());
    h[8..12].copy_from_slice(&len.to_le_bytes());
    h[12..14].copy_from_slice(&flags.to_le_bytes());
    h[14..16].copy_from_slice(&MAGIC.to_le_bytes());
    h
}

/// (id, len, flags) of a header, or why it is not one.
fn parse(h: &[u8; HDR]) -> Result<(u64, u32, u16), String> {
    let magic = u16::from_le_bytes([h[14], h[15]]);
    if magic != MAGIC {
        return Err(format!("bad magic {magic:#06x}"));
    }
    let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if len > MAX_PAYLOAD {
        return Err(format!("payload length {len} above {MAX_PAYLOAD}"));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&h[0..8]);
    Ok((
        u64::from_le_bytes(id),
        len,
        u16::from_le_bytes([h[12], h[13]]),
    ))
}

// ---------------------------------------------------------------- parent side

/// The testbed prefix of a test: `name` (each test its own), or with
/// `$LUNA_TESTBED_PREFIX` set, that prefix in place of `name`'s leading `llk` (so that
/// several checkouts can run these tests at once without sharing namespaces).
fn test_prefix(name: &str) -> Prefix {
    match std::env::var(testbed::PREFIX_ENV) {
        Ok(p) if !p.is_empty() => {
            let mut s = format!("{p}{}", name.trim_start_matches("llk"));
            s.truncate(10);
            Prefix::new(&s).expect("LUNA_TESTBED_PREFIX")
        }
        _ => Prefix::new(name).expect("prefix"),
    }
}

/// `flat`: the client copies its frames flat (`tx_copy_max`) instead of chaining.
fn memif_rpcs(server_role: &str, prefix: &str, flat: bool) {
    let prefix = test_prefix(prefix);
    let topo = Topology::up(Kind::Memif, &prefix).expect("memif topology (root, make setup)");
    let m = topo.memif().expect("memif details").clone();
    memif_quiesce_reset(&m.socket);
    let server = spawn(
        role_command(server_role, &m.server, &CONNS.to_string()),
        server_role,
    );
    let client = spawn(
        role_command("client", &m.client, if flat { "flat" } else { "" }),
        "r2c client",
    );
    let (c, s) = (client.wait(LIMIT), server.wait(LIMIT));
    drop(topo);
    let got = lines(&[(&c, "OK "), (&s, "OK ")]);
    let (c, s) = (&got[0], &got[1]);
    println!("client: {c}\nserver: {s}");
    let total = CONNS as u64 * RPCS;
    let payload: u64 = (0..CONNS as u64)
        .flat_map(|k| (0..RPCS).map(move |i| u64::from(size_of((k << 32) + i))))
        .sum();
    assert_eq!(field(c, "completed"), total, "{c}");
    assert_eq!(field(c, "verified_bytes"), payload, "{c}");
    assert_eq!(field(s, "requests"), total, "{s}");
    assert_eq!(field(s, "echoed"), payload, "{s}");
    assert_eq!(field(s, "conns"), CONNS as u64, "{s}");
    assert_eq!(field(s, "errors"), 0, "{s}");
    // The echo is zero copy: responses are slices of the received buffers.
    assert_eq!(field(s, "device_copied"), 0, "{s}");
    assert_eq!(field(s, "zbuf_copied"), 0, "{s}");
    // Requests went out attached (zero copy) or, with `flat`, copied into single mbufs.
    if flat {
        assert!(field(c, "device_copied") >= payload, "{c}");
    } else {
        assert_eq!(field(c, "device_copied"), 0, "{c}");
    }
}

#[test]
fn memif_inline_server_answers_rpc_clients() {
    memif_rpcs("server-inline", "llkri", false);
}

#[test]
fn memif_batch_server_answers_rpc_clients() {
    // The client transmits through the flat-copy path: the bytes must be the same.
    memif_rpcs("server-batch", "llkrb", true);
}

#[test]
fn tap_kernel_client_gets_replies_from_an_inline_server() {
    tap_kernel_client("tap-server", "llkrt");
}

#[test]
fn tap_kernel_client_gets_replies_from_a_batch_server() {
    tap_kernel_client("tap-server-batch", "llkrs");
}

/// The kernel's TCP (a Python client in the tap's host namespace) against a luna server
/// of role `server_role` on the DPDK side: 60 RPCs of mixed sizes, bytes checked.
fn tap_kernel_client(server_role: &str, prefix: &str) {
    let prefix = test_prefix(prefix);
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let t = topo.tap().expect("tap details").clone();
    let server = spawn_on_tap(&topo, server_role, server_role);
    let py = format!(
        "import socket,struct,sys,time\n\
         def pat(i,n): return bytes(((i*131+k)&0xff) for k in range(n))\n\
         sizes=[0,1,100,1448,4096,20000]\n\
         end=time.time()+30\n\
         while True:\n  try:\n    c=socket.create_connection(('{ip}',{RPC_PORT}),timeout=5); break\n  \
         except OSError:\n    if time.time()>end: raise\n    time.sleep(0.1)\n\
         c.settimeout(30)\n\
         reqs=[(i,sizes[i%6]) for i in range(60)]\n\
         want=b''.join(struct.pack('<QIHH',i,n,1,0x6e6b)+pat(i,n) for i,n in reqs)\n\
         for k in range(0,60,10):\n  c.sendall(b''.join(struct.pack('<QIHH',i,n,0,0x6e6b)+pat(i,n) for i,n in reqs[k:k+10]))\n\
         buf=bytearray()\n\
         while len(buf)<len(want):\n  d=c.recv(1<<16)\n  if not d: break\n  buf+=d\n\
         c.shutdown(socket.SHUT_WR)\n\
         rest=c.recv(1)\n\
         ok = bytes(buf)==want and rest==b''\n\
         print('KERNEL-CLIENT', 'ok' if ok else 'mismatch', len(buf), len(want))\n\
         sys.exit(0 if ok else 1)\n",
        ip = t.dpdk.ip
    );
    let mut cmd = t.host.command("python3");
    cmd.args(["-c", &py]);
    let kclient = spawn(cmd, "kernel client");
    let (k, s) = (kclient.wait(LIMIT), server.wait(LIMIT));
    drop(topo);
    let got = lines(&[(&k, "KERNEL-CLIENT ok"), (&s, "OK ")]);
    let s = &got[1];
    println!("{}\nserver: {s}", got[0]);
    let payload: u64 = (0..60).map(|i| u64::from(SIZES[i % 6])).sum();
    assert_eq!(field(s, "requests"), 60, "{s}");
    assert_eq!(field(s, "echoed"), payload, "{s}");
    assert_eq!(field(s, "errors"), 0, "{s}");
    assert_eq!(field(s, "zbuf_copied"), 0, "{s}");
}

/// Which server the attack suite runs against.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum AttackServer {
    /// luna's inline echo server on net_tap (the suite's subject).
    Luna,
    /// The control: the kernel's TCP in the veth topology's second namespace, SYN
    /// cookies forced (testbed/attack/kernel_server.py); the same client and attacker.
    Kernel,
}

/// `ATTACK_SERVER=kernel` selects the kernel control for the full suite (`make attack`).
fn attack_server_from_env() -> AttackServer {
    match std::env::var("ATTACK_SERVER").as_deref() {
        Ok("kernel") => AttackServer::Kernel,
        Ok("luna") | Err(_) => AttackServer::Luna,
        Ok(other) => panic!("ATTACK_SERVER={other}: expected luna or kernel"),
    }
}

/// The attack suite (testbed/attack/attack.py, docs/reliability.md): a luna server on
/// net_tap, a legitimate kernel client doing echo RPCs through every phase, and scapy
/// sending one kind of hostile traffic per phase from the tap's kernel namespace. The
/// legitimate connection must survive every phase with every reply correct; the server
/// must not crash or hang, must count what it dropped, and must leak nothing.
/// `reps`: `Some(k)` runs each attack of `phases` k times between baselines of its own
/// (testbed/attack/interleave.py; the report then has a per-attack `summary`), `None`
/// runs `phases` once each as listed.
fn attack(
    prefix: &str,
    phase_secs: f64,
    reps: Option<u32>,
    phases: &[&str],
) -> (serde_json::Value, String) {
    attack_on(AttackServer::Luna, prefix, phase_secs, reps, phases)
}

fn attack_on(
    server_kind: AttackServer,
    prefix: &str,
    phase_secs: f64,
    reps: Option<u32>,
    phases: &[&str],
) -> (serde_json::Value, String) {
    // LUNA_ATTACK_PHASES="synflood blind_data" runs just those (to study one attack; with
    // `reps` attacks only, the baselines are placed around them).
    let chosen = std::env::var("LUNA_ATTACK_PHASES").ok();
    let phases: Vec<&str> = match &chosen {
        Some(p) => p.split_whitespace().collect(),
        None => phases.to_vec(),
    };
    // A list naming baselines itself is run as listed (the earlier, sequential method).
    let reps = reps.filter(|_| !phases.iter().any(|p| p.starts_with("baseline")));
    let prefix = test_prefix(prefix);
    let kind = match server_kind {
        AttackServer::Luna => Kind::Tap,
        AttackServer::Kernel => Kind::Veth,
    };
    let topo = Topology::up(kind, &prefix).expect("attack topology (root, make setup)");
    let out = topo.state_dir().join("attack.json");
    // The server stops when the attacker writes the stop file, `<ready file>.stop`.
    let ready = topo.state_dir().join("r2c-tap-server-attack-ready");
    let stop = std::path::PathBuf::from(format!("{}.stop", ready.display()));
    let _ = std::fs::remove_file(&stop);
    let ddir = concat!(env!("CARGO_MANIFEST_DIR"), "/../testbed/attack");
    // (the attacker's command in its namespace, server address, attacker's interface, server)
    let (mut cmd, server_ip, iface, server) = match server_kind {
        AttackServer::Luna => {
            let t = topo.tap().expect("tap details").clone();
            let server = spawn_on_tap(&topo, "tap-server-attack", "luna server under attack");
            // Debian's python3 carries scapy (python3-scapy); a pyenv python on PATH may not.
            let mut cmd = t.host.command("/usr/bin/python3");
            // The server reports per phase (serve_until_stopped).
            cmd.env(
                "LUNA_ATTACK_PHASE_FILE",
                format!("{}.phase", ready.display()),
            );
            (
                cmd,
                t.dpdk.ip,
                t.host.iface.clone(),
                AttackServerProc::Luna(server),
            )
        }
        AttackServer::Kernel => {
            let v = topo.veth().expect("veth details").clone();
            // As luna learns the SYN's source MAC, the kernel must reach the spoofed
            // sources without ARP (which nobody would answer): its SYN-ACKs then go to
            // the attacker's namespace as luna's do.
            for host in 3..=254u8 {
                let o = v.k1.ip.octets();
                let ip = std::net::Ipv4Addr::new(o[0], o[1], o[2], host);
                v.k2.set_static_neighbor(ip, v.k1.mac)
                    .expect("static neighbour for a spoofed source");
            }
            let _ = std::fs::remove_file(&ready);
            // The server on CPU 0, as luna's poller is (EAL lcore 0).
            let mut scmd = v.k2.pinned_command(0, "/usr/bin/python3");
            scmd.arg(format!("{ddir}/kernel_server.py"))
                .arg(RPC_PORT.to_string())
                .arg(&ready)
                .arg(&stop);
            let server = spawn(scmd, "kernel server under attack");
            let end = Instant::now() + Duration::from_secs(30);
            while !ready.exists() {
                assert!(Instant::now() < end, "the kernel server did not listen");
                std::thread::sleep(Duration::from_millis(20));
            }
            let cmd = v.k1.command("/usr/bin/python3");
            (
                cmd,
                v.k2.ip,
                v.k1.iface.clone(),
                AttackServerProc::Kernel(server),
            )
        }
    };
    cmd.env("LUNA_ATTACK_SERVER_PID", server.pid().to_string())
        .env(
            "LUNA_ATTACK_SERVER_KIND",
            format!("{server_kind:?}").to_lowercase(),
        )
        .arg(format!("{ddir}/attack.py"))
        .arg(server_ip.to_string())
        .arg(RPC_PORT.to_string())
        .arg(&iface)
        .arg(phase_secs.to_string())
        .arg(&out)
        .arg(&stop);
    if let Some(k) = reps {
        cmd.arg("--reps").arg(k.to_string());
    }
    cmd.args(&phases);
    // An empty list means every phase of the script (15, of which 13 attacks).
    let n = match reps {
        None if phases.is_empty() => 15,
        None => phases.len(),
        Some(k) => {
            let attacks = if phases.is_empty() { 13 } else { phases.len() };
            k as usize * 2 * attacks + 1
        }
    };
    let budget = Duration::from_secs_f64(60.0 + phase_secs * 4.0 * n as f64);
    let a = spawn(cmd, "attacker + legitimate client").wait(budget);
    let s = server.wait(budget);
    let _ = std::fs::remove_file(&stop);
    let _ = std::fs::remove_file(&ready);
    let mut report: serde_json::Value = std::fs::read_to_string(&out)
        .ok()
        .and_then(|j| serde_json::from_str(&j).ok())
        .unwrap_or(serde_json::Value::Null);
    merge_server_phases(&mut report, &s.out);
    // LUNA_ATTACK_JSON=<file>: the report with the server's figures per phase, for
    // testbed/attack/memory_table.py (the topology's copy goes with it).
    if let Ok(path) = std::env::var("LUNA_ATTACK_JSON") {
        let pretty = serde_json::to_string_pretty(&report).unwrap_or_default();
        std::fs::write(&path, pretty).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
    drop(topo);
    let got = lines(&[(&a, "ATTACK ok"), (&s, "OK ")]);
    for l in a.out.lines().chain(s.out.lines()).filter(|l| {
        ["PHASE", "SUMMARY", "VERDICTS"]
            .iter()
            .any(|k| l.starts_with(k))
    }) {
        println!("{l}");
    }
    (report, got[1].clone())
}

/// Puts each `PHASE-SERVER label=<step>:<phase> key=value...` line of the luna server into
/// the report's phase `<step>` as `server: {key: value}` (drops by reason, counters and
/// high-water marks of that phase).
fn merge_server_phases(report: &mut serde_json::Value, server_out: &str) {
    let Some(phases) = report["phases"].as_array_mut() else {
        return;
    };
    for l in server_out.lines() {
        let Some(rest) = l.strip_prefix("PHASE-SERVER ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let Some(label) = words.next().and_then(|w| w.strip_prefix("label=")) else {
            continue;
        };
        let (step, name) = label.split_once(':').unwrap_or((label, ""));
        let Some(p) = step.parse::<usize>().ok().and_then(|i| phases.get_mut(i)) else {
            continue;
        };
        if p["phase"] != name {
            continue;
        }
        let mut fields = serde_json::Map::new();
        for w in words {
            if let Some((k, v)) = w.split_once('=') {
                if let Ok(v) = v.parse::<u64>() {
                    fields.insert(k.to_string(), v.into());
                }
            }
        }
        p["server"] = serde_json::Value::Object(fields);
    }
}

/// The server process of an attack run.
enum AttackServerProc {
    Luna(children::TapChild),
    Kernel(children::Proc),
}

impl AttackServerProc {
    fn pid(&self) -> u32 {
        match self {
            AttackServerProc::Luna(c) => c.pid(),
            AttackServerProc::Kernel(p) => p.pid(),
        }
    }

    fn wait(self, limit: Duration) -> children::Outcome {
        match self {
            AttackServerProc::Luna(c) => c.wait(limit),
            AttackServerProc::Kernel(p) => p.wait(limit),
        }
    }
}

/// Every attack of an interleaved run got a summary row with a verdict (its value is a
/// measurement, reported and never asserted: timing is not a test).
fn assert_summarised(report: &serde_json::Value) {
    let phases = report["phases"].as_array().expect("phases");
    let mut attacks: Vec<&str> = phases
        .iter()
        .filter(|p| p["kind"] == "attack")
        .filter_map(|p| p["phase"].as_str())
        .collect();
    attacks.sort_unstable();
    attacks.dedup();
    let summary = report["summary"]
        .as_array()
        .expect("an interleaved run's summary");
    assert_eq!(summary.len(), attacks.len(), "{report}");
    for row in summary {
        let v = row["verdict"].as_str().unwrap_or("");
        assert!(
            v.starts_with("within") || v.starts_with("not within") || v.starts_with("inconclusive"),
            "verdict {v:?}: {row}"
        );
    }
    // Each attack phase sits between two baselines.
    for (i, p) in phases.iter().enumerate() {
        if p["kind"] == "attack" {
            assert_eq!(phases[i - 1]["kind"], "baseline", "{report}");
            assert_eq!(phases[i + 1]["kind"], "baseline", "{report}");
        }
    }
}

/// Reduced attack run for `make test`: one phase of each family, one second each, each
/// between baselines of its own (one repetition, as `make attack` does three times).
/// Asserts behaviour only: no latency figure. Memory: per phase, no connection held more
/// out-of-order bytes than its bound (the receive buffer), and the SYN flood left the
/// connection table bounded by the backlog plus the established connections.
#[test]
fn tap_attack_reduced_leaves_the_legitimate_connection_intact() {
    let (report, s) = attack(
        "llkra",
        1.0,
        Some(1),
        &[
            "synflood",
            "blind_rst",
            "blind_data",
            "bad_checksums",
            "malformed_options",
            "sack_abuse_mss48",
            "overlap_diff_data",
            "seq_wrap",
        ],
    );
    println!("server: {s}");
    assert_eq!(report["ok"], serde_json::Value::Bool(true), "{report}");
    if report["reps"].is_u64() {
        assert_summarised(&report);
    }
    assert_eq!(field(&s, "leaked"), 0, "{s}");
    assert_eq!(field(&s, "panics"), 0, "{s}");
    assert!(
        field(&s, "cookies_sent") > 0,
        "the flood filled the backlog: {s}"
    );
    assert!(
        field(&s, "challenge_acks") > 0,
        "blind RSTs were challenged: {s}"
    );
    assert!(
        field(&s, "drop_malformed") > 0,
        "bad checksums/options counted: {s}"
    );
    if std::env::var("LUNA_ATTACK_PHASES").is_err() {
        assert_phase_memory(&report);
    }
}

/// The per-phase server figures (`server` in each phase of the report, from
/// [`merge_server_phases`]) bound memory: out-of-order bytes per connection never above
/// the receive buffer (the assembler's bound) in any phase; in the SYN flood the table
/// holds at most the backlog in SYN-RECEIVED plus a few established or closing
/// connections (the legitimate one, scapy's last); the overlap attack's repeated bytes
/// were counted (`dup_bytes_in`: the first copy kept, the client's echo byte-exact).
fn assert_phase_memory(report: &serde_json::Value) {
    let rcv_buf = u64::from(luna_stack::tcp::TcpConfig::default().rcv_buf);
    let phases = report["phases"].as_array().expect("phases");
    for p in phases {
        let srv = &p["server"];
        assert!(srv.is_object(), "no server figures for a phase: {p}");
        let n = |k: &str| srv[k].as_u64().unwrap_or_else(|| panic!("{k} in {p}"));
        assert!(n("ooo_bytes_one_conn_hwm") <= rcv_buf, "{p}");
        match p["phase"].as_str() {
            Some("synflood") => {
                assert!(n("cookies_sent") > 0, "{p}");
                assert!(n("half_open_hwm") <= BACKLOG as u64, "{p}");
                assert!(n("conns_hwm") <= BACKLOG as u64 + 8, "{p}");
            }
            Some("overlap_diff_data") => assert!(n("dup_bytes_in") > 0, "{p}"),
            _ => {}
        }
    }
}

/// The full suite (`make attack`): every attack, `LUNA_ATTACK_REPS` times (3), each
/// between baselines of its own, phases of `LUNA_ATTACK_SECS` seconds (3): 79 phases, about
/// 4.5 minutes. `LUNA_ATTACK_REPS=0`: the earlier sequential run (baseline, the 13
/// attacks, baseline_after). The per-attack verdict on the client's p99 is reported
/// (`SUMMARY` lines, `summary` in the JSON), never asserted.
#[test]
#[ignore = "attack suite, about 4.5 minutes: make attack"]
fn tap_attack_full() {
    // ATTACK_SERVER=kernel: the same phases against the kernel's TCP (the control).
    let server = attack_server_from_env();
    let reps: u32 = std::env::var("LUNA_ATTACK_REPS")
        .map(|v| {
            v.parse()
                .expect("LUNA_ATTACK_REPS: a count (0: sequential)")
        })
        .unwrap_or(3);
    let secs: f64 = std::env::var("LUNA_ATTACK_SECS")
        .map(|v| v.parse().expect("LUNA_ATTACK_SECS: seconds per phase"))
        .unwrap_or(3.0);
    // The kernel sends no SYN-ACK for sack_abuse_mss48's MSS-48 SYN (seen 2026-12-02,
    // tcp_syncookies = 2; not investigated), so the control runs every other attack but
    // the two that need luna's test hooks: seq_wrap (the server's fixed ISN and second
    // listener) and overlap_diff_data (not run against the kernel yet: Linux replaces an
    // out-of-order block a later segment covers whole, so its echo may carry the forged
    // bytes; that is a finding about the control, to be measured before it is listed).
    const KERNEL_ATTACKS: &[&str] = &[
        "synflood",
        "blind_rst",
        "blind_syn",
        "blind_data",
        "rst_ack_storm",
        "bad_checksums",
        "malformed_options",
        "ip_options_fragments",
        "ack_unsent",
        "paws",
    ];
    let sequential: Vec<&str> = std::iter::once("baseline")
        .chain(KERNEL_ATTACKS.iter().copied())
        .chain(std::iter::once("baseline_after"))
        .collect();
    let phases: &[&str] = match (server, reps) {
        (AttackServer::Luna, _) => &[],
        (AttackServer::Kernel, 0) => &sequential,
        (AttackServer::Kernel, _) => KERNEL_ATTACKS,
    };
    let (report, s) = attack_on(server, "llkrf", secs, (reps > 0).then_some(reps), phases);
    println!("server: {s}");
    println!(
        "{}",
        serde_json::to_string_pretty(&report).unwrap_or_default()
    );
    assert_eq!(report["ok"], serde_json::Value::Bool(true), "{report}");
    if report["reps"].is_u64() {
        assert_summarised(&report);
    }
    match server {
        AttackServer::Luna => {
            assert_eq!(field(&s, "leaked"), 0, "{s}");
            if std::env::var("LUNA_ATTACK_PHASES").is_err() {
                assert_phase_memory(&report);
            }
        }
        AttackServer::Kernel => {
            let flooded = report["phases"]
                .as_array()
                .is_some_and(|v| v.iter().any(|p| p["phase"] == "synflood"));
            assert!(
                !flooded || field(&s, "cookies_sent") > 0,
                "the kernel sent SYN cookies for the flood: {s}"
            );
        }
    }
}

/// The attack role: an inline echo server that runs until `<ready>.stop` exists (or a
/// hard limit), sampling zbuf objects in use; then prints one `PHASE-SERVER` line per phase
/// the attacker announced in `<ready>.phase` (see [`AttackPhases`]) and, in its `OK` line,
/// every drop counter by name and the whole run's high-water marks. Every connection's ISN
/// is [`ATTACK_ISN`] (the `fixed_isn` test knob), just below 2^32: the seq_wrap phase's
/// data crosses the wrap in both directions.
fn serve_until_stopped(port: &DpdkPort, ready: String) -> String {
    let mut env = setup(port);
    env.core.stack.fixed_isn = Some(ATTACK_ISN);
    let stop = format!("{ready}.stop");
    let phase_file = format!("{ready}.phase");
    let _ = std::fs::remove_file(&stop);
    let _ = std::fs::remove_file(&phase_file);
    std::fs::write(&ready, b"open").expect("ready file");
    let served = Arc::new(Served::default());
    let sv = served.clone();
    let log = Arc::new(PhaseLog::default());
    let lg = log.clone();
    let opts = options(&env.slab, port);
    let rt = Runtime::spawn_inline(vec![env.core], opts, move |_| InlineServer {
        expected: usize::MAX,
        backlog: BACKLOG,
        done: 0,
        polls: 0,
        conns: HashMap::new(),
        served: sv.clone(),
        attack: Some(AttackPhases {
            shared: lg.clone(),
            seen: 0,
            label: None,
            base: Default::default(),
        }),
    })
    .expect("runtime");
    let end = Instant::now() + Duration::from_secs(600);
    let mut hwm = 0;
    let mut last = String::new();
    let mut announced = 0;
    let mut ticks = 0u64;
    while !std::path::Path::new(&stop).exists() && Instant::now() < end && !rt.is_finished() {
        let now = std::fs::read_to_string(&phase_file).unwrap_or_default();
        let now = now.trim();
        if now != last {
            last = now.to_string();
            announced = announced.max(phases_announced(&last));
            *log.label.lock().unwrap() = last.clone();
            log.gen.fetch_add(1, Ordering::Release);
        }
        ticks += 1;
        if ticks % 4 == 0 {
            hwm = hwm.max(env.slab.leak_report().objects_in_use);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // The last phase ends ("end" may not have been seen before the stop file).
    *log.label.lock().unwrap() = "end".into();
    log.gen.fetch_add(1, Ordering::Release);
    let close_by = Instant::now() + Duration::from_secs(2);
    while log.lines.lock().unwrap().len() < announced && Instant::now() < close_by {
        std::thread::sleep(Duration::from_millis(5));
    }
    rt.stop();
    let panics = u64::from(rt.is_finished() && !std::path::Path::new(&stop).exists());
    let reports = rt.join().expect("runtime");
    for l in log.lines.lock().unwrap().iter() {
        println!("{l}");
    }
    let r = &reports[0];
    let mut drops = String::new();
    for d in luna_stack::stack::StackDrop::ALL {
        drops += &format!(" drop_{}={}", d.name(), r.stack.drops(d));
    }
    for d in luna_stack::tcp::DropReason::ALL {
        drops += &format!(" tcp_drop_{}={}", d.name(), r.tcp.drops(d));
    }
    for (k, v) in r.stack.high_water.fields() {
        drops += &format!(" {k}={v}");
    }
    let line = format!(
        "requests={} conns={} errors={} cookies_sent={} cookies_accepted={} rsts_sent={} \
         challenge_acks={} challenge_acks_suppressed={} dup_bytes_in={} zbuf_objects_hwm={hwm} \
         panics={panics}{drops}",
        served.requests.load(Ordering::Relaxed),
        served.conns.load(Ordering::Relaxed),
        served.errors.load(Ordering::Relaxed),
        r.stack.syn_cookies_sent,
        r.stack.syn_cookies_accepted,
        r.stack.rsts_sent,
        r.tcp.challenge_acks,
        r.tcp.challenge_acks_suppressed,
        r.stack.dup_bytes_in,
    );
    drop(reports);
    format!("{line} leaked={}", env.slab.leak_report().objects_in_use)
}

/// How many phases a label says were announced (`<step> <phase>`: step + 1; `end`: 0).
fn phases_announced(last: &str) -> usize {
    last.split_whitespace()
        .next()
        .and_then(|i| i.parse::<usize>().ok())
        .map_or(0, |i| i + 1)
}

/// The attack server's ISN for every connection (`StackConfig::fixed_isn`): 2,048 bytes
/// below 2^32, within attack.py's `WRAP_BELOW`.
const ATTACK_ISN: u32 = u32::MAX - 2047;
/// The inline servers' listen backlog.
const BACKLOG: usize = 64;
/// The attack server's second listener (attack.py's `PORT + WRAP_PORT_OFFSET`).
const WRAP_PORT: u16 = RPC_PORT + 1;

/// Kernel clients connecting to a SYN-cookie listener.
const COOKIE_CONNS: usize = 16;

/// Regression (found by a SYN flood against Linux clients): a connection made through a
/// SYN cookie ran its timestamp clock from a fresh random offset instead of the clock its
/// cookie SYN-ACK had started; whenever the jump was 2^31 or more, the Linux client's PAWS
/// check (RFC 7323 §5.3) discarded every later segment from luna and the connection hung
/// (about half of them). Here every SYN gets a cookie (`SynCookieMode::Always`, Linux's
/// `tcp_syncookies=2`; the same path a full backlog takes), and 16 kernel connections must
/// each complete RPCs in both directions with every byte checked.
#[test]
fn tap_kernel_clients_through_syn_cookies_keep_working() {
    let prefix = test_prefix("llkrc");
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let t = topo.tap().expect("tap details").clone();
    let server = spawn_on_tap(&topo, "tap-server-cookies", "inline server, cookies always");
    let py = format!(
        "import socket,struct,sys,time\n\
         def pat(i,n): return bytes(((i*131+k)&0xff) for k in range(n))\n\
         sizes=[1,1448,4096,20000]\n\
         def rpc(c,i,n):\n  c.sendall(struct.pack('<QIHH',i,n,0,0x6e6b)+pat(i,n))\n  \
         want=struct.pack('<QIHH',i,n,1,0x6e6b)+pat(i,n)\n  buf=b''\n  \
         while len(buf)<len(want):\n    d=c.recv(1<<16)\n    if not d: break\n    buf+=d\n  \
         return buf==want\n\
         end=time.time()+30\n\
         conns=[]\n\
         for k in range({n}):\n  \
         while True:\n    try:\n      conns.append(socket.create_connection(('{ip}',{RPC_PORT}),timeout=5)); break\n    \
         except OSError:\n      if time.time()>end: raise\n      time.sleep(0.1)\n\
         bad=0\n\
         for k,c in enumerate(conns):\n  \
         try:\n    ok=all(rpc(c,k*10+j,sizes[j%4]) for j in range(8))\n  \
         except OSError as e:\n    ok=False\n  \
         if not ok: bad+=1\n\
         for c in conns:\n  c.shutdown(socket.SHUT_WR)\n\
         for c in conns:\n  \
         try: c.recv(1)\n  \
         except OSError: bad+=1\n  \
         c.close()\n\
         print('KERNEL-CLIENT', 'ok' if bad==0 else 'stalled', bad)\n\
         sys.exit(0 if bad==0 else 1)\n",
        n = COOKIE_CONNS,
        ip = t.dpdk.ip
    );
    let mut cmd = t.host.command("python3");
    cmd.args(["-c", &py]);
    let kclient = spawn(cmd, "kernel clients");
    let (k, s) = (kclient.wait(LIMIT), server.wait(LIMIT));
    drop(topo);
    let got = lines(&[(&k, "KERNEL-CLIENT ok"), (&s, "OK ")]);
    let s = &got[1];
    println!("{}\nserver: {s}", got[0]);
    let n = COOKIE_CONNS as u64;
    assert_eq!(field(s, "requests"), 8 * n, "{s}");
    assert_eq!(field(s, "errors"), 0, "{s}");
    assert!(field(s, "cookies_accepted") >= n, "{s}");
}

/// The same regression as it was found: the default mode (cookies only when the backlog
/// is full) with the backlog really full. The listener's backlog is [`FULL_BACKLOG`];
/// scapy fills it with SYNs from spoofed sources in the subnet, which nobody answers (their
/// connections stay in SYN-RECEIVED, retrying, far longer than the test). Then 16 kernel
/// connections (Linux's timestamps on) are made, each through a cookie, and must each
/// complete RPCs in both directions with every byte checked; the server's counters show
/// the cookies were sent and accepted for them.
#[test]
fn tap_kernel_clients_through_syn_cookies_with_a_full_backlog() {
    let prefix = test_prefix("llkrk");
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let t = topo.tap().expect("tap details").clone();
    let server = spawn_on_tap(
        &topo,
        "tap-server-cookies-full",
        "inline server, cookies when full, small backlog",
    );
    let o = t.dpdk.ip.octets();
    let net = format!("{}.{}.{}", o[0], o[1], o[2]);
    let py = format!(
        "import socket,struct,sys,time\n\
         from scapy.all import IP,TCP,Ether,sendp,getmacbyip,conf\n\
         conf.verb=0\n\
         def pat(i,n): return bytes(((i*131+k)&0xff) for k in range(n))\n\
         sizes=[1,1448,4096,20000]\n\
         def rpc(c,i,n):\n  c.sendall(struct.pack('<QIHH',i,n,0,0x6e6b)+pat(i,n))\n  \
         want=struct.pack('<QIHH',i,n,1,0x6e6b)+pat(i,n)\n  buf=b''\n  \
         while len(buf)<len(want):\n    d=c.recv(1<<16)\n    if not d: break\n    buf+=d\n  \
         return buf==want\n\
         end=time.time()+30\n\
         mac=None\n\
         while mac is None and time.time()<end:\n  mac=getmacbyip('{ip}')\n\
         if mac is None: raise SystemExit('no ARP answer from the server')\n\
         syns=[Ether(dst=mac)/IP(src='{net}.{{}}'.format(200+k),dst='{ip}')/TCP(sport=40000+k,dport={RPC_PORT},flags='S',seq=1000*k,options=[('MSS',1460)]) for k in range({fill})]\n\
         sendp(syns,iface='{iface}')\n\
         time.sleep(0.5)\n\
         conns=[]\n\
         for k in range({n}):\n  \
         while True:\n    try:\n      conns.append(socket.create_connection(('{ip}',{RPC_PORT}),timeout=5)); break\n    \
         except OSError:\n      if time.time()>end: raise\n      time.sleep(0.1)\n\
         bad=0\n\
         for k,c in enumerate(conns):\n  \
         try:\n    ok=all(rpc(c,k*10+j,sizes[j%4]) for j in range(8))\n  \
         except OSError as e:\n    ok=False\n  \
         if not ok: bad+=1\n\
         for c in conns:\n  c.shutdown(socket.SHUT_WR)\n\
         for c in conns:\n  \
         try: c.recv(1)\n  \
         except OSError: bad+=1\n  \
         c.close()\n\
         print('KERNEL-CLIENT', 'ok' if bad==0 else 'stalled', bad)\n\
         sys.exit(0 if bad==0 else 1)\n",
        n = COOKIE_CONNS,
        fill = FULL_BACKLOG,
        ip = t.dpdk.ip,
        iface = t.host.iface,
    );
    // Debian's python3 carries scapy (python3-scapy); a pyenv python on PATH may not.
    let mut cmd = t.host.command("/usr/bin/python3");
    cmd.args(["-c", &py]);
    let kclient = spawn(cmd, "backlog filler + kernel clients");
    let (k, s) = (kclient.wait(LIMIT), server.wait(LIMIT));
    drop(topo);
    let got = lines(&[(&k, "KERNEL-CLIENT ok"), (&s, "OK ")]);
    let s = &got[1];
    println!("{}\nserver: {s}", got[0]);
    let n = COOKIE_CONNS as u64;
    assert_eq!(field(s, "requests"), 8 * n, "{s}");
    assert_eq!(field(s, "errors"), 0, "{s}");
    // Every kernel connection came through a cookie: the backlog stayed full.
    assert!(field(s, "cookies_sent") >= n, "{s}");
    assert!(field(s, "cookies_accepted") >= n, "{s}");
}

/// The listen backlog of `tap_kernel_clients_through_syn_cookies_with_a_full_backlog`.
const FULL_BACKLOG: usize = 4;

#[test]
fn a_server_resets_a_client_that_sends_garbage() {
    // Bad input: a header with the wrong magic is counted as an error and the
    // connection is reset; the server then finishes normally.
    let prefix = test_prefix("llkrg");
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let t = topo.tap().expect("tap details").clone();
    let server = spawn_on_tap(&topo, "tap-server", "inline server on net_tap");
    let py = format!(
        "import socket,sys,time\n\
         end=time.time()+30\n\
         while True:\n  try:\n    c=socket.create_connection(('{ip}',{RPC_PORT}),timeout=5); break\n  \
         except OSError:\n    if time.time()>end: raise\n    time.sleep(0.1)\n\
         c.settimeout(30)\n\
         c.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n\
         try:\n  d=c.recv(100)\n  reset = (d==b'')\n\
         except ConnectionResetError:\n  reset=True\n\
         print('KERNEL-CLIENT', 'reset' if reset else 'answered')\n\
         sys.exit(0 if reset else 1)\n",
        ip = t.dpdk.ip
    );
    let mut cmd = t.host.command("python3");
    cmd.args(["-c", &py]);
    let kclient = spawn(cmd, "garbage client");
    let (k, s) = (kclient.wait(LIMIT), server.wait(LIMIT));
    drop(topo);
    let got = lines(&[(&k, "KERNEL-CLIENT reset"), (&s, "OK ")]);
    let s = &got[1];
    assert_eq!(field(s, "errors"), 1, "{s}");
    assert_eq!(field(s, "requests"), 0, "{s}");
}

// ---------------------------------------------------------------- child side

/// Entry point of the role children (ignored in normal runs; see the module docs).
#[test]
#[ignore = "child-process entry point, run by the other tests"]
fn role_child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let port: DpdkPort =
        serde_json::from_str(&std::env::var(PORT_JSON).expect("port json")).expect("port");
    let arg = std::env::var(ARG).unwrap_or_default();
    let msg = match role.as_str() {
        "server-inline" => serve(&port, false, arg.parse().expect("conns"), None),
        "server-batch" => serve(&port, true, arg.parse().expect("conns"), None),
        "tap-server" => serve(&port, false, 1, Some(arg)),
        "tap-server-batch" => serve(&port, true, 1, Some(arg)),
        "tap-server-attack" => serve_until_stopped(&port, arg),
        "tap-server-cookies" => serve_with(
            &port,
            false,
            COOKIE_CONNS,
            Some(arg),
            SynCookieMode::Always,
            BACKLOG,
        ),
        "tap-server-cookies-full" => serve_with(
            &port,
            false,
            COOKIE_CONNS,
            Some(arg),
            SynCookieMode::WhenFull,
            FULL_BACKLOG,
        ),
        "client" => client(&port, arg == "flat"),
        other => panic!("unknown role {other}"),
    };
    println!("OK {msg}");
}

/// EAL, slab and one device, as a runtime's single core.
struct Env {
    _eal: Eal,
    slab: Slab,
    _registry: DmaRegistry,
    core: CoreSetup<DpdkDevice>,
}

fn setup(port: &DpdkPort) -> Env {
    setup_with(port, 0)
}

/// [`setup`] with `DpdkDeviceConfig::tx_copy_max` set.
fn setup_with(port: &DpdkPort, tx_copy_max: usize) -> Env {
    let (args, mut cfg) = from_testbed(port).expect("testbed port");
    cfg.tx_copy_max = Some(tx_copy_max);
    let eal = Eal::init(args).unwrap_or_else(|e| panic!("EAL: {e}"));
    let registry = DmaRegistry::new(&eal);
    let slab =
        Slab::new(registry.slab_config(SlabConfig::new().max_memory(96 << 20))).expect("slab");
    let dev =
        DpdkDevice::open(&eal, &slab, &registry, &cfg).unwrap_or_else(|e| panic!("open: {e}"));
    let mut sc = StackConfig::new(
        dev.mac(),
        Ipv4Cidr::new(port.ip, port.prefix_len).expect("cidr"),
    );
    sc.mtu = dev.mtu();
    sc.caps = dev.caps();
    Env {
        _eal: eal,
        slab,
        _registry: registry,
        core: CoreSetup::new(0, vec![dev], sc),
    }
}

/// Shared CPUs in tests: no pinning, yield when idle. On memif, the process meets its
/// peer before closing the port (`memif_quiesce`: a disconnect while the peer polls can
/// fault inside the PMD).
fn options(slab: &Slab, port: &DpdkPort) -> CoreOptions {
    let vdev = port.eal.vdev.clone();
    CoreOptions {
        idle: IdleStrategy::Yield,
        pin: false,
        slab: Some(slab.clone()),
        before_release: vdev.starts_with("net_memif").then(|| {
            ReleaseHook(Arc::new(move |_| {
                let _ = memif_quiesce(&vdev, Duration::from_secs(10));
            }))
        }),
        ..CoreOptions::default()
    }
}

/// Runs `rt` until its application stops it (or the hang guard, which reports the
/// core's counters and `state()`); returns its reports.
fn finish(rt: Runtime, state: impl Fn() -> String) -> Vec<CoreReport> {
    let end = Instant::now() + LIMIT - Duration::from_secs(10);
    while !rt.is_finished() {
        if Instant::now() > end {
            let stats: Vec<String> = rt.stats()[0]
                .fields()
                .filter(|(_, v)| *v != 0)
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            panic!(
                "the runtime did not finish: {}; core: {}",
                state(),
                stats.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    rt.join().expect("runtime")
}

/// One connection's TCP state and counters, for hang reports.
fn describe(ctx: &Ctx<'_>, conn: Conn) -> String {
    let Some(c) = ctx.stack().connection(conn) else {
        return format!("{conn:?}: gone");
    };
    let k = c.counters();
    let drops: Vec<String> = luna_stack::tcp::DropReason::ALL
        .iter()
        .filter(|r| k.drops(**r) > 0)
        .map(|r| format!("{}={}", r.name(), k.drops(*r)))
        .collect();
    format!(
        "{:?} state={:?} cwnd={} wnd={} flight={} recovery={} segs_in={} segs_out={} \
         rexmit={} rtos={} fast={} dsacks={} challenge_acks={} drops[{}]",
        c.local().port(),
        c.state(),
        c.cwnd(),
        c.send_window(),
        c.bytes_in_flight(),
        c.in_recovery(),
        k.segs_in,
        k.segs_out,
        k.retransmits,
        k.rtos,
        k.fast_retransmits,
        k.dsacks,
        k.challenge_acks,
        drops.join(" ")
    )
}

/// Every 8192 polls, the state of the open connections (read by the hang report).
fn snapshot(
    ctx: &mut Ctx<'_>,
    polls: &mut u64,
    conns: impl Iterator<Item = Conn>,
    out: &Mutex<Vec<String>>,
) {
    *polls += 1;
    if *polls % 8192 == 0 {
        let v: Vec<String> = conns.map(|c| describe(ctx, c)).collect();
        *out.lock().unwrap() = v;
    }
}

/// What the server side counts (shared with the main thread).
#[derive(Default)]
struct Served {
    requests: AtomicU64,
    echoed: AtomicU64,
    conns: AtomicU64,
    errors: AtomicU64,
    tcp: Mutex<Vec<String>>,
}

/// The echo-RPC parser of one connection: whatever it emits is sent in order.
#[derive(Default)]
struct Echo {
    hdr: [u8; HDR],
    have: usize,
    /// Payload bytes of the current request still to echo.
    left: u32,
}

enum Out {
    Header([u8; HDR]),
    Payload(Zbuf),
}

impl Echo {
    /// Consumes `z`, emitting each response header and the payload slices to echo
    /// (views of `z`, no copy).
    fn feed(
        &mut self,
        mut z: Zbuf,
        served: &Served,
        out: &mut impl FnMut(Out),
    ) -> Result<(), String> {
        while !z.is_empty() {
            if self.left > 0 {
                let k = (self.left as usize).min(z.len());
                out(Out::Payload(z.split_to(k)));
                self.left -= k as u32;
                served.echoed.fetch_add(k as u64, Ordering::Relaxed);
                continue;
            }
            let k = (HDR - self.have).min(z.len());
            self.hdr[self.have..self.have + k].copy_from_slice(&z[..k]);
            z.advance(k);
            self.have += k;
            if self.have == HDR {
                self.have = 0;
                let (id, len, flags) = parse(&self.hdr)?;
                if flags & RESPONSE != 0 {
                    return Err(format!("request {id} carries the RESPONSE flag"));
                }
                out(Out::Header(header(id, len, RESPONSE)));
                self.left = len;
                served.requests.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

/// inline-r2c echo-RPC server: replies from the callbacks, payload zero copy.
struct InlineServer {
    expected: usize,
    /// The listener's backlog.
    backlog: usize,
    done: usize,
    polls: u64,
    conns: HashMap<Conn, Echo>,
    served: Arc<Served>,
    /// The attack role's per-phase figures (and its second listener).
    attack: Option<AttackPhases>,
}

impl InlineServer {
    fn end(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        if self.conns.remove(&conn).is_some() {
            self.done += 1;
            if self.done >= self.expected {
                ctx.request_stop();
            }
        }
    }
}

impl InlineApp for InlineServer {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        ctx.listen(RPC_PORT, self.backlog).expect("listen");
        if self.attack.is_some() {
            // The seq_wrap phase's listener, which no flood fills (attack.py).
            ctx.listen(WRAP_PORT, BACKLOG).expect("listen");
        }
    }

    fn on_accept(&mut self, _ctx: &mut Ctx<'_>, conn: Conn, _l: r2c::Listener) {
        self.conns.insert(conn, Echo::default());
        self.served.conns.fetch_add(1, Ordering::Relaxed);
    }

    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        loop {
            let Some(echo) = self.conns.get_mut(&conn) else {
                return;
            };
            match ctx.recv(conn) {
                Ok(Some(z)) => {
                    let mut failed = false;
                    let r = echo.feed(z, &self.served, &mut |o| {
                        let z = match o {
                            Out::Payload(z) => z,
                            Out::Header(h) => {
                                let mut m = ctx.alloc(HDR).expect("zbuf");
                                m.append(HDR).expect("room").copy_from_slice(&h);
                                m.freeze()
                            }
                        };
                        failed |= ctx.send_all(conn, z).is_err();
                    });
                    if r.is_err() || failed {
                        self.served.errors.fetch_add(1, Ordering::Relaxed);
                        ctx.abort(conn);
                        return self.end(ctx, conn);
                    }
                }
                Ok(None) => return,
                Err(RecvError::Finished) => {
                    ctx.close(conn);
                    return self.end(ctx, conn);
                }
                Err(_) => return, // reset: on_closed follows
            }
        }
    }

    fn on_closed(&mut self, ctx: &mut Ctx<'_>, conn: Conn, _r: Option<CloseReason>) {
        self.end(ctx, conn);
    }

    fn on_poll(&mut self, ctx: &mut Ctx<'_>) {
        let conns: Vec<Conn> = self.conns.keys().copied().collect();
        snapshot(ctx, &mut self.polls, conns.into_iter(), &self.served.tcp);
        if let Some(a) = &mut self.attack {
            a.poll(ctx);
        }
    }
}

/// The attack server's figures per phase: the control thread publishes the phase the
/// attacker announces (`LUNA_ATTACK_PHASE_FILE`), and the core's poll loop closes the
/// previous phase with its counter deltas and high-water marks, then starts the next
/// interval (`Ctx::reset_high_water`). A phase's edges lag the attacker's by the control
/// thread's poll (5 ms) and one poll-loop iteration.
struct AttackPhases {
    shared: Arc<PhaseLog>,
    seen: u64,
    label: Option<String>,
    base: (
        luna_stack::stack::StackCounters,
        luna_stack::tcp::ConnCounters,
    ),
}

#[derive(Default)]
struct PhaseLog {
    /// Bumped whenever `label` changes.
    gen: AtomicU64,
    label: Mutex<String>,
    /// One `PHASE-SERVER label=<step>:<phase> ...` line per finished phase.
    lines: Mutex<Vec<String>>,
}

impl AttackPhases {
    fn poll(&mut self, ctx: &mut Ctx<'_>) {
        let g = self.shared.gen.load(Ordering::Acquire);
        if g == self.seen {
            return;
        }
        self.seen = g;
        let st = ctx.stack();
        let now = (st.counters().clone(), st.tcp_counters());
        if let Some(label) = self.label.take() {
            let line = phase_line(&label, &self.base, &now);
            self.shared.lines.lock().unwrap().push(line);
        }
        ctx.reset_high_water();
        self.base = now;
        let next = self.shared.label.lock().unwrap().clone();
        self.label = (next != "end" && !next.is_empty()).then_some(next);
    }
}

/// A phase's figures: drops by reason and a few counters (deltas over the phase; zero
/// drops left out), and the stack's high-water marks in it.
fn phase_line(
    label: &str,
    (s0, t0): &(
        luna_stack::stack::StackCounters,
        luna_stack::tcp::ConnCounters,
    ),
    (s1, t1): &(
        luna_stack::stack::StackCounters,
        luna_stack::tcp::ConnCounters,
    ),
) -> String {
    let mut l = format!(
        "PHASE-SERVER label={} cookies_sent={} cookies_accepted={} challenge_acks={} dup_bytes_in={}",
        label.replace(' ', ":"),
        s1.syn_cookies_sent - s0.syn_cookies_sent,
        s1.syn_cookies_accepted - s0.syn_cookies_accepted,
        t1.challenge_acks - t0.challenge_acks,
        s1.dup_bytes_in - s0.dup_bytes_in,
    );
    for d in luna_stack::stack::StackDrop::ALL {
        let n = s1.drops(d) - s0.drops(d);
        if n > 0 {
            l += &format!(" drop_{}={n}", d.name());
        }
    }
    for d in luna_stack::tcp::DropReason::ALL {
        let n = t1.drops(d) - t0.drops(d);
        if n > 0 {
            l += &format!(" tcp_drop_{}={n}", d.name());
        }
    }
    for (k, v) in s1.high_water.fields() {
        l += &format!(" {k}={v}");
    }
    l
}

/// batch-r2c echo-RPC server: an epoll-style loop over the socket API, `recv_zbuf` /
/// `send_zbuf` for the payload.
struct BatchServer {
    expected: usize,
    done: usize,
    lfd: Option<Fd>,
    events: Vec<PollEvent>,
    conns: HashMap<Fd, (Echo, VecDeque<Zbuf>, bool)>,
    served: Arc<Served>,
}

impl BatchServer {
    fn end(&mut self, s: &mut Sockets<'_>, fd: Fd) {
        if self.conns.remove(&fd).is_some() {
            let _ = s.close(fd);
            self.done += 1;
            if self.done >= self.expected {
                s.request_stop();
            }
        }
    }

    /// Sends what waits; true when all of it went.
    fn flush(s: &mut Sockets<'_>, fd: Fd, q: &mut VecDeque<Zbuf>) -> Result<bool, SockError> {
        while let Some(z) = q.front_mut() {
            match s.send_zbuf(fd, z.clone()) {
                Ok(n) if n == z.len() => {
                    q.pop_front();
                }
                Ok(n) => {
                    z.advance(n);
                    return Ok(false);
                }
                Err(SockError::WouldBlock) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    fn serve(&mut self, s: &mut Sockets<'_>, fd: Fd) {
        let Some((echo, q, eof)) = self.conns.get_mut(&fd) else {
            return;
        };
        loop {
            match Self::flush(s, fd, q) {
                Ok(true) => {}
                Ok(false) => return, // writable interest brings us back
                Err(_) => {
                    self.served.errors.fetch_add(1, Ordering::Relaxed);
                    return self.end(s, fd);
                }
            }
            if *eof {
                return self.end(s, fd);
            }
            match s.recv_zbuf(fd) {
                Ok(Some(z)) => {
                    let r = echo.feed(z, &self.served, &mut |o| {
                        q.push_back(match o {
                            Out::Payload(z) => z,
                            // A fresh buffer per header: the bytes are the response's own.
                            Out::Header(h) => Zbuf::from_vec(h.to_vec()),
                        })
                    });
                    if r.is_err() {
                        self.served.errors.fetch_add(1, Ordering::Relaxed);
                        return self.end(s, fd);
                    }
                }
                Ok(None) => *eof = true,
                Err(SockError::WouldBlock) => return,
                Err(_) => return self.end(s, fd),
            }
        }
    }
}

impl BatchApp for BatchServer {
    fn on_start(&mut self, s: &mut Sockets<'_>) {
        let fd = s.socket();
        s.bind(fd, RPC_PORT).expect("bind");
        s.listen(fd, BACKLOG).expect("listen");
        s.register(fd, Interest::READABLE).expect("register");
        self.lfd = Some(fd);
    }

    fn on_poll(&mut self, s: &mut Sockets<'_>) {
        s.poll(&mut self.events);
        for ev in std::mem::take(&mut self.events) {
            if Some(ev.fd) == self.lfd {
                while let Ok((c, _)) = s.accept(ev.fd) {
                    s.register(c, Interest::BOTH).expect("register");
                    self.conns
                        .insert(c, (Echo::default(), VecDeque::new(), false));
                    self.served.conns.fetch_add(1, Ordering::Relaxed);
                }
                continue;
            }
            self.serve(s, ev.fd);
        }
    }
}

fn serve(port: &DpdkPort, batch: bool, expected: usize, ready: Option<String>) -> String {
    serve_with(
        port,
        batch,
        expected,
        ready,
        SynCookieMode::WhenFull,
        BACKLOG,
    )
}

/// [`serve`] with the listener's SYN-cookie mode set.
fn serve_with(
    port: &DpdkPort,
    batch: bool,
    expected: usize,
    ready: Option<String>,
    cookies: SynCookieMode,
    backlog: usize,
) -> String {
    let mut env = setup(port);
    env.core.stack.syn_cookies = cookies;
    if let Some(f) = &ready {
        std::fs::write(f, b"open").expect("ready file");
    }
    let served = Arc::new(Served::default());
    let sv = served.clone();
    let opts = options(&env.slab, port);
    let rt = if batch {
        Runtime::spawn_batch(vec![env.core], opts, move |_| BatchServer {
            expected,
            done: 0,
            lfd: None,
            events: Vec::new(),
            conns: HashMap::new(),
            served: sv.clone(),
        })
    } else {
        Runtime::spawn_inline(vec![env.core], opts, move |_| InlineServer {
            expected,
            backlog,
            done: 0,
            polls: 0,
            conns: HashMap::new(),
            served: sv.clone(),
            attack: None,
        })
    }
    .expect("runtime");
    let st = served.clone();
    let reports = finish(rt, move || {
        format!(
            "requests={} echoed={} conns={} tcp={:?}",
            st.requests.load(Ordering::Relaxed),
            st.echoed.load(Ordering::Relaxed),
            st.conns.load(Ordering::Relaxed),
            st.tcp.lock().unwrap()
        )
    });
    let dev = reports[0].device;
    let (cookies_sent, cookies_accepted) = (
        reports[0].stack.syn_cookies_sent,
        reports[0].stack.syn_cookies_accepted,
    );
    drop(reports);
    format!(
        "requests={} echoed={} conns={} errors={} device_copied={} zbuf_copied={} \
         rx_frames={} tx_frames={} leaked={} cookies_sent={cookies_sent} \
         cookies_accepted={cookies_accepted}",
        served.requests.load(Ordering::Relaxed),
        served.echoed.load(Ordering::Relaxed),
        served.conns.load(Ordering::Relaxed),
        served.errors.load(Ordering::Relaxed),
        dev.copied_bytes,
        copy_stats().bytes,
        dev.rx_frames,
        dev.tx_frames,
        env.slab.leak_report().objects_in_use,
    )
}

/// One client connection: requests sent, responses expected (id, len), parse state.
#[derive(Default)]
struct ClientConn {
    base: u64,
    sent: u64,
    done: u64,
    outstanding: VecDeque<(u64, u32)>,
    hdr: [u8; HDR],
    have: usize,
    /// (id, payload offset, payload length) of the response being read.
    cur: Option<(u64, u32, u32)>,
}

/// What the client reports.
#[derive(Default)]
struct Tally {
    completed: AtomicU64,
    verified: AtomicU64,
    finished: AtomicUsize,
    bad: Mutex<Vec<String>>,
    /// Per connection (sent, done, outstanding), for the hang report.
    progress: Mutex<HashMap<u64, (u64, u64, usize)>>,
    tcp: Mutex<Vec<String>>,
}

/// inline-r2c client: `CONNS` connections, `DEPTH` RPCs outstanding on each.
struct Client {
    polls: u64,
    remote: SocketAddrV4,
    conns: HashMap<Conn, ClientConn>,
    tally: Arc<Tally>,
}

impl Client {
    fn fill(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        while c.outstanding.len() < DEPTH && c.sent < RPCS {
            let id = c.base + c.sent;
            let len = size_of(id);
            let mut m = ctx.alloc(HDR + len as usize).expect("zbuf");
            let b = m.append(HDR + len as usize).expect("room");
            b[..HDR].copy_from_slice(&header(id, len, 0));
            for (off, x) in b[HDR..].iter_mut().enumerate() {
                *x = pattern(id, off as u32);
            }
            ctx.send_all(conn, m.freeze()).expect("send");
            c.outstanding.push_back((id, len));
            c.sent += 1;
        }
    }

    fn fail(&self, ctx: &mut Ctx<'_>, msg: String) {
        self.tally.bad.lock().unwrap().push(msg);
        ctx.request_stop();
    }

    /// Checks response bytes; returns responses completed.
    fn check(c: &mut ClientConn, mut d: &[u8], tally: &Tally) -> Result<u64, String> {
        let mut n = 0;
        while !d.is_empty() {
            if let Some((id, off, len)) = c.cur {
                let k = ((len - off) as usize).min(d.len());
                for (i, &b) in d[..k].iter().enumerate() {
                    if b != pattern(id, off + i as u32) {
                        return Err(format!("response {id}: byte {} differs", off + i as u32));
                    }
                }
                tally.verified.fetch_add(k as u64, Ordering::Relaxed);
                d = &d[k..];
                let at = off + k as u32;
                c.cur = (at < len).then_some((id, at, len));
                if c.cur.is_none() {
                    n += 1;
                }
                continue;
            }
            let k = (HDR - c.have).min(d.len());
            c.hdr[c.have..c.have + k].copy_from_slice(&d[..k]);
            d = &d[k..];
            c.have += k;
            if c.have < HDR {
                break;
            }
            c.have = 0;
            let (id, len, flags) = parse(&c.hdr)?;
            let (want, wlen) = c
                .outstanding
                .pop_front()
                .ok_or(format!("response {id} with nothing outstanding"))?;
            if (id, len, flags) != (want, wlen, RESPONSE) {
                return Err(format!(
                    "response ({id}, {len}, {flags}) for request ({want}, {wlen})"
                ));
            }
            if len == 0 {
                n += 1;
            } else {
                c.cur = Some((id, 0, len));
            }
        }
        Ok(n)
    }
}

impl InlineApp for Client {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        for k in 0..CONNS as u64 {
            let c = ctx.connect(self.remote).expect("connect");
            self.conns.insert(
                c,
                ClientConn {
                    base: k << 32,
                    ..ClientConn::default()
                },
            );
        }
    }

    fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        self.fill(ctx, conn);
    }

    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        loop {
            let Some(c) = self.conns.get_mut(&conn) else {
                return;
            };
            match ctx.recv(conn) {
                Ok(Some(z)) => match Self::check(c, &z, &self.tally) {
                    Ok(n) => {
                        c.done += n;
                        self.tally.completed.fetch_add(n, Ordering::Relaxed);
                        self.tally
                            .progress
                            .lock()
                            .unwrap()
                            .insert(c.base >> 32, (c.sent, c.done, c.outstanding.len()));
                        if c.done == RPCS {
                            self.conns.remove(&conn);
                            ctx.close(conn);
                            let f = self.tally.finished.fetch_add(1, Ordering::AcqRel) + 1;
                            if f == CONNS {
                                ctx.request_stop();
                            }
                            return;
                        }
                        self.fill(ctx, conn);
                    }
                    Err(e) => return self.fail(ctx, e),
                },
                Ok(None) => return,
                Err(e) => return self.fail(ctx, format!("connection ended early: {e:?}")),
            }
        }
    }

    fn on_closed(&mut self, ctx: &mut Ctx<'_>, conn: Conn, r: Option<CloseReason>) {
        if self.conns.contains_key(&conn) {
            self.fail(ctx, format!("connection closed early: {r:?}"));
        }
    }

    fn on_poll(&mut self, ctx: &mut Ctx<'_>) {
        let conns: Vec<Conn> = self.conns.keys().copied().collect();
        snapshot(ctx, &mut self.polls, conns.into_iter(), &self.tally.tcp);
    }
}

fn client(port: &DpdkPort, flat: bool) -> String {
    let env = setup_with(port, if flat { 2048 } else { 0 });
    let tally = Arc::new(Tally::default());
    let t = tally.clone();
    let remote = SocketAddrV4::new(port.peer_ip, RPC_PORT);
    let rt = Runtime::spawn_inline(vec![env.core], options(&env.slab, port), move |_| Client {
        polls: 0,
        remote,
        conns: HashMap::new(),
        tally: t.clone(),
    })
    .expect("runtime");
    let st = tally.clone();
    let reports = finish(rt, move || {
        format!(
            "completed={} finished={} conns={:?} tcp={:?}",
            st.completed.load(Ordering::Relaxed),
            st.finished.load(Ordering::Relaxed),
            st.progress.lock().unwrap(),
            st.tcp.lock().unwrap()
        )
    });
    let bad = tally.bad.lock().unwrap().clone();
    assert!(bad.is_empty(), "client errors: {bad:?}");
    format!(
        "completed={} verified_bytes={} retransmits={} device_copied={}",
        tally.completed.load(Ordering::Relaxed),
        tally.verified.load(Ordering::Relaxed),
        reports[0].tcp.retransmits,
        reports[0].device.copied_bytes,
    )
}
