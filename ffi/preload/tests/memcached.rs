//! An unmodified Debian `memcached` (libevent, one listener thread handing connections to
//! four worker threads over pipes, each with its own epoll set) under
//! `LD_PRELOAD=libluna-preload.so` on the tap topology, driven by libmemcached's stock
//! tools in the kernel namespace.

mod common;

use common::{cannot_run, config, output, run, signal, spawn_under_shim};
use std::time::{Duration, Instant};
use testbed::{Kind, Prefix, Tap, Topology};

const PORT: u16 = 11211;

#[test]
fn memcached_on_luna_passes_memccapable() {
    let tools =
        ["memcached", "memccapable", "memcslap", "memcstat"].map(|t| format!("/usr/bin/{t}"));
    if cannot_run(&tools.each_ref().map(String::as_str)) {
        return;
    }
    let prefix = Prefix::new("lprmc").unwrap();
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let tap = topo.tap().expect("tap details").clone();
    let cfg = topo.state_dir().join("luna-preload-memcached.toml");
    std::fs::write(&cfg, config(&tap)).expect("config");
    let ip = tap.dpdk.ip.to_string();
    let port = PORT.to_string();
    let server = spawn_under_shim(
        &tap,
        &cfg,
        "/usr/bin/memcached",
        &[
            "-u", "root", "-l", &ip, "-p", &port, "-U", "0", "-t", "4", "-v",
        ],
    );
    let pid = server.id();
    let server_at = format!("{ip}:{PORT}");
    let check = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tap.configure_host(Duration::from_secs(60)).expect("tap up");
        let end = Instant::now() + Duration::from_secs(60);
        let idle = loop {
            if let Some(s) = stats(&tap, &server_at) {
                break s;
            }
            assert!(
                Instant::now() < end,
                "memcached on luna never answered memcstat"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        for args in [vec!["-a"], vec!["-b"]] {
            let mut c = tap.host.command("memccapable");
            c.args(["-h", &ip, "-p", &PORT.to_string()]).args(&args);
            let o = run(c, Duration::from_secs(120), "memccapable");
            println!("memccapable {args:?}:\n{}{}", o.out, o.err);
            assert!(o.ok, "memccapable {args:?} failed");
        }
        // memcslap: 8 threads, each with its own connection, 2,000 operations each. The
        // get test first sets its 2,000 keys, so every get hits.
        for t in ["set", "get"] {
            let before = stats(&tap, &server_at).expect("stats");
            let mut c = tap.host.command("memcslap");
            c.arg(format!("--servers={server_at}")).args([
                "--concurrency=8",
                "--execute-number=2000",
                "--test",
                t,
            ]);
            let o = run(c, Duration::from_secs(120), "memcslap");
            println!("memcslap {t}:\n{}{}", o.out, o.err);
            assert!(o.ok, "memcslap {t} failed");
            let after = stats(&tap, &server_at).expect("stats");
            let d = |k: &str| after[k] - before[k];
            if t == "set" {
                assert!(
                    d("cmd_set") >= 16_000,
                    "sets reaching memcached: {}",
                    d("cmd_set")
                );
            } else {
                assert!(d("get_hits") >= 16_000, "get hits: {}", d("get_hits"));
                assert_eq!(d("get_misses"), 0, "get misses");
            }
        }
        // Every client's connection was closed, and memcached saw each close (its count
        // is back where it was with only the stats client connected).
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let s = stats(&tap, &server_at).expect("stats");
            if s["curr_connections"] == idle["curr_connections"] {
                assert!(s["total_connections"] > idle["total_connections"] + 16);
                break;
            }
            assert!(
                Instant::now() < end,
                "connections left open: {} (idle {})",
                s["curr_connections"],
                idle["curr_connections"]
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }));
    // memcached ends on SIGTERM with status 0.
    signal(&server, libc::SIGTERM);
    let o = output(server, Duration::from_secs(30), "memcached");
    println!("memcached (pid {pid}):\n{}{}", o.out, o.err);
    drop(topo);
    if let Err(p) = check {
        std::panic::resume_unwind(p);
    }
    assert!(o.ok, "memcached did not exit cleanly");
    assert!(!o.err.contains("luna-preload:"), "shim errors: {}", o.err);
}

/// memcached's counters (`memcstat`), or None if it did not answer.
fn stats(tap: &Tap, server: &str) -> Option<std::collections::HashMap<String, i64>> {
    let mut c = tap.host.command("memcstat");
    c.arg(format!("--servers={server}"));
    let o = run(c, Duration::from_secs(10), "memcstat");
    if !o.ok {
        return None;
    }
    let m: std::collections::HashMap<String, i64> = o
        .out
        .lines()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            Some((k.trim().to_string(), v.trim().parse().ok()?))
        })
        .collect();
    m.contains_key("curr_connections").then_some(m)
}
