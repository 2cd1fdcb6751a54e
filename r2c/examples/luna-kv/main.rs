//! luna-kv: a memcached-compatible key-value server (text and binary protocol on one
//! port) on luna, in r2c message mode: the I/O core runs DPDK, TCP and the memcached
//! parsers; whole requests are scheduled over worker threads by msgsched (CP, CS or MS)
//! and the replies go back in request order.
//!
//! ```text
//! sudo make setup
//! sudo cargo run --release -p r2c --example luna-kv -- --model ms --workers 4
//! # in another shell, from the kernel side of the tap topology:
//! sudo ip netns exec <host netns printed at start> memccapable -h 198.18.0.2 -p 11211
//! ```
//!
//! It brings up the testbed's tap topology (prefix `--prefix`, default `lkv`), runs the
//! DPDK side inside it (this program re-executed in the DPDK namespace), configures the
//! kernel side and serves until `--duration` or the stop file it prints (both tear the
//! topology down; after Ctrl-C, `make clean-testbed` does). Needs root and hugepages.

mod kv;
mod server;
#[path = "../common/service.rs"]
mod service;

use clap::Parser;
use msgsched::sched::Model;
use server::{serve, ServeConfig};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use testbed::{DpdkPort, Kind, Prefix, Topology};

/// Environment of the re-executed server child.
const CHILD_PORT: &str = "LUNA_KV_PORT";

#[derive(Parser, Debug)]
#[command(about = "memcached-compatible KV server on luna (msgsched message mode)")]
struct Args {
    /// Scheduling model: cp, cs or ms.
    #[arg(long, default_value = "ms")]
    model: Model,
    /// Worker threads.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// TCP port.
    #[arg(long, default_value_t = 11211)]
    port: u16,
    /// Store memory limit (MiB).
    #[arg(long, default_value_t = 64)]
    memory_mb: usize,
    /// Largest request in bytes (bounds the value size).
    #[arg(long, default_value_t = (1 << 20) + 4096)]
    max_message: usize,
    /// Testbed prefix of the tap topology.
    #[arg(long, default_value = "lkv")]
    prefix: String,
    /// Stop after this many seconds (default: run until stopped).
    #[arg(long)]
    duration: Option<u64>,
    /// Keep this file holding the live counters (rewritten every 250 ms).
    #[arg(long)]
    stats_file: Option<PathBuf>,
    #[command(flatten)]
    service: service::ServiceArgs,
    /// Internal: the ready file (child).
    #[arg(long, hide = true)]
    ready: Option<PathBuf>,
    /// Internal: the stop file (child).
    #[arg(long, hide = true)]
    stop: Option<PathBuf>,
}

fn config(a: &Args) -> ServeConfig {
    ServeConfig {
        model: a.model,
        workers: a.workers,
        port: a.port,
        memory_mb: a.memory_mb,
        max_message: a.max_message,
        limit: Duration::from_secs(a.duration.unwrap_or(365 * 24 * 3600)),
        service: Some(a.service.clone()),
        stats_file: a.stats_file.clone(),
        ..ServeConfig::default()
    }
}

fn main() {
    let a = Args::parse();
    if let Ok(json) = std::env::var(CHILD_PORT) {
        let port: DpdkPort = serde_json::from_str(&json).expect("port json");
        let (ready, stop) = (
            a.ready.clone().expect("--ready"),
            a.stop.clone().expect("--stop"),
        );
        println!("OK {}", serve(&port, &config(&a), &ready, &stop));
        return;
    }
    let prefix = Prefix::new(&a.prefix).unwrap_or_else(|e| panic!("prefix: {e}"));
    let topo = Topology::up(Kind::Tap, &prefix)
        .unwrap_or_else(|e| panic!("tap topology (root, make setup): {e}"));
    let t = topo.tap().expect("tap details").clone();
    let ready = topo.state_dir().join("luna-kv-ready");
    let stop = topo.state_dir().join("luna-kv-stop");
    let _ = std::fs::remove_file(&ready);
    let _ = std::fs::remove_file(&stop);
    let mut port = t.dpdk.clone();
    port.eal.memory_mb = port.eal.memory_mb.min(256);
    let exe = std::env::current_exe().expect("own path");
    let mut cmd = testbed::netns_command(&port.netns, exe);
    cmd.args(std::env::args().skip(1))
        .arg("--ready")
        .arg(&ready)
        .arg("--stop")
        .arg(&stop)
        .env(CHILD_PORT, serde_json::to_string(&port).expect("json"));
    let mut child = cmd.spawn().expect("server child");
    let end = Instant::now() + Duration::from_secs(60);
    while !ready.exists() {
        assert!(Instant::now() < end, "the server did not open its port");
        if let Ok(Some(s)) = child.try_wait() {
            panic!("the server exited: {s}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    t.configure_host(Duration::from_secs(30))
        .expect("tap interface from the DPDK process");
    println!(
        "luna-kv: memcached on {}:{} (model {:?}, {} workers)\n\
         kernel clients: ip netns exec {} memccapable -h {} -p {}\n\
         stop: touch {}",
        port.ip,
        a.port,
        a.model,
        a.workers,
        t.host.netns,
        port.ip,
        a.port,
        stop.display()
    );
    let status = child.wait().expect("server child");
    let _ = std::fs::remove_file(&ready);
    drop(topo);
    std::process::exit(status.code().unwrap_or(1));
}
