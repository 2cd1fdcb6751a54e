//! An unmodified Debian `redis-server --io-threads 1` under
//! `LD_PRELOAD=libluna-preload.so` on the tap topology, driven by its stock clients in
//! the kernel namespace: `redis-cli` round trips whose replies are checked, then a
//! bounded `redis-benchmark` whose every request must have reached the server (the
//! counter it INCRs and the list it LPUSHes hold exactly `-n`).
//!
//! Needs root, hugepages and `make setup` (redis-server, redis-tools); skipped with a
//! message otherwise.

mod common;

use common::{cannot_run, config, output, run, skip, spawn_under_shim};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use testbed::{Kind, Prefix, Tap, Topology};

const PORT: u16 = 6379;
const LIMIT: Duration = Duration::from_secs(240);
const REQUESTS: u32 = 20_000;
const REDIS: [&str; 3] = [
    "/usr/bin/redis-server",
    "/usr/bin/redis-cli",
    "/usr/bin/redis-benchmark",
];

struct Redis<'a> {
    tap: &'a Tap,
}

impl Redis<'_> {
    fn cli(&self, args: &[&str]) -> String {
        let mut c = self.tap.host.command("redis-cli");
        c.args(["-h", &self.tap.dpdk.ip.to_string(), "-p", &PORT.to_string()]);
        c.args(args);
        let o = run(c, Duration::from_secs(30), "redis-cli");
        assert!(o.ok, "redis-cli {args:?}: {}{}", o.out, o.err);
        o.out.trim_end_matches('\n').to_string()
    }
}

#[test]
fn redis_server_on_luna_answers_redis_cli_and_redis_benchmark() {
    if cannot_run(&REDIS) {
        return;
    }
    let prefix = Prefix::new("lprds").unwrap();
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let tap = topo.tap().expect("tap details").clone();
    let cfg = topo.state_dir().join("luna-preload-redis.toml");
    std::fs::write(&cfg, config(&tap)).expect("config");

    let (port, ip) = (PORT.to_string(), tap.dpdk.ip.to_string());
    let dir = topo.state_dir().display().to_string();
    let server = spawn_under_shim(
        &tap,
        &cfg,
        "/usr/bin/redis-server",
        &[
            "--port",
            &port,
            "--bind",
            &ip,
            "--io-threads",
            "1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--unixsocket",
            "",
            "--dir",
            &dir,
        ],
    );
    let pid = server.id();

    let check = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tap.configure_host(Duration::from_secs(60))
            .expect("tap up (did redis-server start luna?)");
        let r = Redis { tap: &tap };
        // Ready once it answers.
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let mut c = tap.host.command("redis-cli");
            c.args([
                "-h",
                &tap.dpdk.ip.to_string(),
                "-p",
                &PORT.to_string(),
                "ping",
            ]);
            let o = run(c, Duration::from_secs(10), "redis-cli ping");
            if o.out.trim() == "PONG" {
                break;
            }
            assert!(Instant::now() < end, "no PONG: {}{}", o.out, o.err);
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(r.cli(&["set", "greeting", "hello luna"]), "OK");
        assert_eq!(r.cli(&["get", "greeting"]), "hello luna");
        assert_eq!(r.cli(&["incrby", "n", "41"]), "41");
        assert_eq!(r.cli(&["incr", "n"]), "42");
        // A value larger than a segment and than one read.
        let big: String = (0..100_000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        assert_eq!(r.cli(&["set", "big", &big]), "OK");
        assert_eq!(r.cli(&["strlen", "big"]), "100000");
        assert_eq!(r.cli(&["get", "big"]), big);
        assert_eq!(r.cli(&["rpush", "l", "a", "b", "c"]), "3");
        assert_eq!(r.cli(&["lrange", "l", "0", "-1"]), "a\nb\nc");
        assert_eq!(r.cli(&["del", "greeting", "missing"]), "1");
        assert_eq!(r.cli(&["exists", "greeting"]), "0");

        // The stock benchmark: 10 connections, every request answered.
        let mut c = tap.host.command("redis-benchmark");
        c.args(["-h", &tap.dpdk.ip.to_string(), "-p", &PORT.to_string()]);
        c.args([
            "-n",
            &REQUESTS.to_string(),
            "-c",
            "10",
            "-t",
            "set,get,incr,lpush",
            "-q",
        ]);
        let o = run(c, LIMIT, "redis-benchmark");
        println!("redis-benchmark:\n{}{}", o.out, o.err);
        assert!(o.ok, "redis-benchmark failed: {}{}", o.out, o.err);
        for t in ["SET", "GET", "INCR", "LPUSH"] {
            assert!(
                o.out
                    .lines()
                    .any(|l| l.contains(&format!("{t}: ")) && l.contains("requests per second")),
                "no {t} result: {}",
                o.out
            );
        }
        // Without -r every INCR hits one key and every LPUSH one list.
        assert_eq!(
            r.cli(&["get", "counter:__rand_int__"]),
            REQUESTS.to_string()
        );
        assert_eq!(r.cli(&["llen", "mylist"]), REQUESTS.to_string());
        // Its SET values are 3 bytes (-d default).
        assert_eq!(r.cli(&["strlen", "key:__rand_int__"]), "3");
        // The benchmark's connections are closed (the server saw each FIN).
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let clients = r.cli(&["info", "clients"]);
            if clients.lines().any(|l| l.trim() == "connected_clients:1") {
                break;
            }
            assert!(
                Instant::now() < end,
                "benchmark connections still open: {clients}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        // Ends the process (exit status 0).
        let mut c = tap.host.command("redis-cli");
        c.args([
            "-h",
            &tap.dpdk.ip.to_string(),
            "-p",
            &PORT.to_string(),
            "shutdown",
            "nosave",
        ]);
        let _ = run(c, Duration::from_secs(30), "redis-cli shutdown");
    }));
    let o = output(server, Duration::from_secs(30), "redis-server");
    println!("redis-server (pid {pid}):\n{}{}", o.out, o.err);
    drop(topo);
    if let Err(p) = check {
        std::panic::resume_unwind(p);
    }
    assert!(o.ok, "redis-server did not exit cleanly");
    assert!(!o.err.contains("luna-preload:"), "shim errors: {}", o.err);
}

/// Python (Debian's) under the shim as a luna client of a kernel echo server:
/// blocking connect, getsockname/getpeername, options, 256 KiB echoed, one epoll set
/// with a kernel pipe and the luna socket, non-blocking reads, poll(2), half close,
/// refused connects (blocking and not), a non-blocking connect completed through epoll,
/// select(2) over the luna socket and a pipe, shutdown(2) of a listener waking accept,
/// bind(2) to a port in use (EADDRINUSE at bind), signals interrupting a blocking recv
/// and accept (KeyboardInterrupt) and a handler that returns letting recv go on, close
/// ending in a FIN, or a RST with SO_LINGER {1, 0} or unread bytes (the server tells),
/// os.closerange (close_range) closing a luna socket and freeing its number,
/// shutdown(SHUT_RD) leaving the queued bytes readable, a socket connected again after
/// ECONNREFUSED, a blocked recv ended by another thread's shutdown, a subprocess (vfork)
/// given a luna socket as stdin leaving our descriptors alone, SO_RCVTIMEO ending a
/// blocking recv with EAGAIN, and AF_UNIX/loopback left to the kernel
/// (tests/py/client_check.py: 94 named checks); then 4 MiB sent to a
/// slow reader just before the process exits all arrive before the FIN, and bytes a
/// reader does not take within the exit's grace end in a RST, not a FIN.
#[test]
fn python_client_on_luna_talks_to_a_kernel_server() {
    if cannot_run(&REDIS) {
        return;
    }
    if !Path::new("/usr/bin/python3").exists() {
        skip("/usr/bin/python3 is missing");
        return;
    }
    let py = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py");
    let prefix = Prefix::new("lprpy").unwrap();
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let tap = topo.tap().expect("tap details").clone();
    let cfg = topo.state_dir().join("luna-preload-py.toml");
    // Retransmission and probe intervals of at most 0.5 s: the closed socket stuck
    // behind a zero window is reset after its 15 probes within seconds.
    let text = format!("{}\n[tcp]\nrto_max_us = 500000\n", config(&tap));
    std::fs::write(&cfg, text).expect("config");
    let ready = topo.state_dir().join("luna-preload-echo-ready");
    let _ = std::fs::remove_file(&ready);
    for name in [".sink", ".sink2"] {
        let _ = std::fs::remove_file(format!("{}{name}", ready.display()));
    }
    let (luna, kernel, port) = (tap.dpdk.ip.to_string(), tap.host.ip.to_string(), "7007");

    let script = format!("{py}/client_check.py");
    let ready_s = ready.display().to_string();
    let client = spawn_under_shim(
        &tap,
        &cfg,
        "/usr/bin/python3",
        &[&script, &luna, &kernel, port, &ready_s],
    );

    let up = tap.configure_host(Duration::from_secs(60));
    let mut echo = tap.host.command("/usr/bin/python3");
    echo.arg(format!("{py}/echo_server.py")).args([
        &kernel,
        port,
        &ready.display().to_string(),
        "200",
    ]);
    echo.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut echo = echo.spawn().expect("echo server");
    let o = output(client, LIMIT, "python client");
    // How the last connections, to the slow sinks, ended ("fin <bytes>").
    let until = Instant::now() + Duration::from_secs(20);
    let ended = |name: &str| loop {
        if let Ok(w) = std::fs::read_to_string(format!("{}{name}", ready.display())) {
            break w;
        }
        if Instant::now() > until {
            break "no end seen".to_string();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (sink, sink2) = (ended(".sink"), ended(".sink2"));
    println!("sinks: {sink:?}, {sink2:?}");
    let _ = echo.kill();
    let _ = echo.wait();
    drop(topo);
    println!("client:\n{}{}", o.out, o.err);
    up.expect("tap up (did the client start luna?)");
    assert!(o.ok, "client failed");
    // Every named check of the script ran and passed.
    assert!(o.out.lines().any(|l| l == "OK checks=103"), "{}", o.out);
    assert_eq!(sink, "fin 4194304", "bytes queued at exit were lost");
    assert!(
        sink2.starts_with("reset "),
        "bytes that could not go before the exit's grace ended: {sink2}"
    );
    assert!(!o.err.contains("luna-preload:"), "shim errors: {}", o.err);
}
