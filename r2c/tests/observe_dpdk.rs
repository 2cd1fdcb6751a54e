//! `lunactl` against a luna process on DPDK: an inline echo server on net_tap (the tap
//! topology, root) with a control socket, a kernel client (Python sockets) in the tap's
//! namespace. Checks the counters against the bytes the client sent, the connection in
//! `lunactl conns`, the port's DPDK xstats and mempools, and a pcapng capture read by
//! tshark. The server is this test binary re-executed inside the namespace
//! (`common/children.rs`; the ignored `role_child` test is its entry point).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use dpdk_sys::Eal;
use luna_stack::stack::StackConfig;
use luna_stack::wire::Ipv4Cidr;
use r2c::control::ControlConfig;
use r2c::device::dpdk::{from_testbed, DpdkDevice};
use r2c::device::Device;
use r2c::{CoreOptions, CoreSetup, IdleStrategy, Runtime};
use serde_json::Value;
use testbed::{DpdkPort, Kind, Prefix, Topology};
use zbuf::dpdk::DmaRegistry;
use zbuf::{Slab, SlabConfig};

#[path = "common/children.rs"]
mod children;
use children::{field, lines, spawn, spawn_on_tap, ARG, PORT_JSON, ROLE};

const LIMIT: Duration = Duration::from_secs(90);
const PORT: u16 = 7710;
const BYTES: usize = 60_000;

#[path = "common/echo.rs"]
mod echo;
const ECHO: echo::Echo = echo::Echo {
    port: PORT,
    backlog: 16,
};

/// The server role: runs until `<ready>.stop` exists (or a hang guard).
fn serve(port: &DpdkPort, ready: &str) -> String {
    let stop = format!("{ready}.stop");
    let _ = std::fs::remove_file(&stop);
    let (args, cfg) = from_testbed(port).expect("testbed port");
    let eal = Eal::init(args).unwrap_or_else(|e| panic!("EAL: {e}"));
    let registry = DmaRegistry::new(&eal);
    let slab =
        Slab::new(registry.slab_config(SlabConfig::new().max_memory(64 << 20))).expect("slab");
    let dev =
        DpdkDevice::open(&eal, &slab, &registry, &cfg).unwrap_or_else(|e| panic!("open: {e}"));
    let mut sc = StackConfig::new(dev.mac(), Ipv4Cidr::new(port.ip, port.prefix_len).unwrap());
    sc.mtu = dev.mtu();
    sc.caps = dev.caps();
    let opts = CoreOptions {
        idle: IdleStrategy::Yield,
        pin: false,
        slab: Some(slab.clone()),
        control: Some(ControlConfig::new(format!("{ready}.sock"))),
        ..CoreOptions::default()
    };
    let rt = Runtime::spawn_inline(vec![CoreSetup::new(0, vec![dev], sc)], opts, |_| ECHO)
        .expect("runtime");
    std::fs::write(ready, b"open").expect("ready file");
    let end = Instant::now() + LIMIT;
    while !Path::new(&stop).exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    rt.stop();
    let r = rt.join().expect("runtime");
    drop(eal);
    format!(
        "accepted={} bytes_in={}",
        r[0].stats.accepted, r[0].tcp.bytes_in
    )
}

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
        "tap-observe" => serve(&port, &arg),
        other => panic!("unknown role {other}"),
    };
    println!("OK {msg}");
}

fn lunactl(socket: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_lunactl"))
        .arg("-s")
        .arg(socket)
        .args(args)
        .output()
        .expect("run lunactl");
    assert!(
        out.status.success(),
        "lunactl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn json(socket: &Path, args: &[&str]) -> Value {
    serde_json::from_str(&lunactl(socket, args)).expect("JSON")
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{v} is not a count"))
}

fn wait_file(p: &Path, what: &str) {
    let end = Instant::now() + LIMIT;
    while !p.exists() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn lunactl_reads_a_dpdk_process_and_captures_its_tap_port() {
    let prefix = Prefix::new("lobs").unwrap();
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let t = topo.tap().expect("tap details").clone();
    let state = topo.state_dir();
    let ready: PathBuf = state.join("r2c-tap-observe-ready");
    let socket = PathBuf::from(format!("{}.sock", ready.display()));
    let echoed = state.join("observe-echoed");
    let release = state.join("observe-release");
    let stop_file = PathBuf::from(format!("{}.stop", ready.display()));
    for f in [&echoed, &release, &stop_file] {
        let _ = std::fs::remove_file(f);
    }
    let pcap = state.join("observe-tap.pcapng");
    let server = spawn_on_tap(&topo, "tap-observe", "tap-observe server");

    let s = json(&socket, &["stats", "--json"]);
    let port_id = n(&s["cores"][0]["devices"][0]["port"]);
    lunactl(
        &socket,
        &[
            "capture",
            "start",
            "--port",
            &port_id.to_string(),
            "--file",
            pcap.to_str().unwrap(),
        ],
    );

    let py = format!(
        "import socket,os,sys,time\n\
         data=bytes((k*7)&0xff for k in range({BYTES}))\n\
         end=time.time()+30\n\
         while True:\n  try:\n    c=socket.create_connection(('{ip}',{PORT}),timeout=5); break\n  \
         except OSError:\n    if time.time()>end: raise\n    time.sleep(0.1)\n\
         c.settimeout(30)\n\
         c.sendall(data)\n\
         buf=bytearray()\n\
         while len(buf)<len(data):\n  d=c.recv(1<<16)\n  if not d: break\n  buf+=d\n\
         ok=bytes(buf)==data\n\
         print('LOCAL', c.getsockname()[0], c.getsockname()[1], flush=True)\n\
         open('{echoed}','w').write('%s %d' % c.getsockname())\n\
         while not os.path.exists('{release}') and time.time()<end+60: time.sleep(0.05)\n\
         c.close()\n\
         print('KERNEL-CLIENT', 'ok' if ok else 'mismatch', len(buf))\n\
         sys.exit(0 if ok else 1)\n",
        ip = t.dpdk.ip,
        echoed = echoed.display(),
        release = release.display(),
    );
    let mut cmd = t.host.command("python3");
    cmd.args(["-c", &py]);
    let kclient = spawn(cmd, "kernel client");
    wait_file(&echoed, "the kernel client's echo");
    // The file is written in one call; wait for its content.
    let mut local = String::new();
    for _ in 0..100 {
        local = std::fs::read_to_string(&echoed).unwrap_or_default();
        if local.contains(' ') {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let (cip, cport) = local.trim().split_once(' ').expect("client address");

    let s = json(&socket, &["stats", "--json"]);
    let core = &s["cores"][0];
    assert_eq!(core["answered"], true);
    assert_eq!(n(&core["stats"]["accepted"]), 1, "{core}");
    assert_eq!(
        n(&core["tcp"]["bytes_in"]),
        BYTES as u64,
        "bytes the client sent"
    );
    assert_eq!(n(&core["states"]["ESTABLISHED"]), 1);
    let dev = &core["devices"][0];
    let xs = dev["xstats"].as_object().expect("xstats of the port");
    assert!(n(&xs["rx_good_packets"]) > 0, "{xs:?}");
    assert!(n(&xs["tx_good_bytes"]) >= BYTES as u64, "{xs:?}");
    // The core thread is an EAL lcore: its mbufs go through per-lcore mempool caches.
    assert!(dev["lcore"].is_u64(), "the core thread's lcore id: {dev}");
    let pools = dev["pools"].as_array().expect("pools");
    assert_eq!(pools.len(), 2, "rx and tx pools: {pools:?}");
    assert!(pools
        .iter()
        .all(|p| n(&p["size"]) > 0 && n(&p["in_use"]) <= n(&p["size"])));
    assert!(n(&s["zbuf"]["objects"]) > 0);

    let conns = json(&socket, &["conns", "--json"]);
    let conns = conns.as_array().unwrap();
    assert_eq!(conns.len(), 1, "{conns:?}");
    assert_eq!(conns[0]["state"], "ESTABLISHED");
    assert_eq!(conns[0]["local"], format!("{}:{PORT}", t.dpdk.ip));
    assert_eq!(conns[0]["remote"], format!("{cip}:{cport}"));
    assert_eq!(cip, t.host.ip.to_string());

    std::fs::write(&release, b"go").unwrap();
    let k = kclient.wait(LIMIT);
    let stop = json(
        &socket,
        &["capture", "stop", "--port", &port_id.to_string(), "--json"],
    );
    assert_eq!(n(&stop["stats"]["dropped_oldest"]), 0);
    assert_eq!(n(&stop["stats"]["written"]), n(&stop["stats"]["captured"]));
    std::fs::write(&stop_file, b"stop").unwrap();
    let srv = server.wait(LIMIT);
    drop(topo);
    let got = lines(&[(&k, "KERNEL-CLIENT ok"), (&srv, "OK ")]);
    println!("{}\nserver: {}", got[0], got[1]);
    // The runtime's own final report agrees with what lunactl showed.
    assert_eq!(field(&got[1], "accepted"), 1);
    assert_eq!(field(&got[1], "bytes_in"), BYTES as u64);

    // tshark: distinct payload bytes each way (retransmissions count once), no
    // malformed frame or error expert info.
    let out = Command::new("tshark")
        .arg("-r")
        .arg(&pcap)
        .args(["-Y", "tcp.len > 0", "-T", "fields"])
        .args(["-e", "tcp.dstport", "-e", "tcp.seq", "-e", "tcp.len"])
        .output()
        .expect("tshark");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut reach: BTreeMap<bool, u64> = BTreeMap::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = l.split('\t').collect();
        let up = f[0] == PORT.to_string();
        let end = f[1].parse::<u64>().unwrap() - 1 + f[2].parse::<u64>().unwrap();
        let e = reach.entry(up).or_insert(0);
        *e = (*e).max(end);
    }
    assert_eq!(
        reach.get(&true),
        Some(&(BYTES as u64)),
        "client -> luna bytes"
    );
    assert_eq!(
        reach.get(&false),
        Some(&(BYTES as u64)),
        "luna -> client bytes"
    );
    let bad = Command::new("tshark")
        .arg("-r")
        .arg(&pcap)
        .args([
            "-Y",
            "_ws.malformed || _ws.expert.severity >= \"error\"",
            "-T",
            "fields",
        ])
        .args(["-e", "frame.number", "-e", "_ws.expert.message"])
        .output()
        .expect("tshark");
    assert!(
        String::from_utf8_lossy(&bad.stdout).trim().is_empty(),
        "malformed: {}",
        String::from_utf8_lossy(&bad.stdout)
    );
    for f in [&pcap, &echoed, &release, &stop_file] {
        let _ = std::fs::remove_file(f);
    }
}
