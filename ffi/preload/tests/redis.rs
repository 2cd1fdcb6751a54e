//! An unmodified Debian `redis-server --io-threads 1` under
//! `LD_PRELOAD=libluna-preload.so` on the tap topology, driven by its stock clients in
//! the kernel namespace: `redis-cli` round trips whose replies are checked, then a
//! bounded `redis-benchmark` whose every request must have reached the server (the
//! counter it INCRs and the list it LPUSHes hold exactly `-n`).
//!
//! Needs root, hugepages and `make setup` (redis-server, redis-tools); skipped with a
//! message otherwise.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use testbed::{Kind, Prefix, Tap, Topology};

const PORT: u16 = 6379;
const LIMIT: Duration = Duration::from_secs(240);
const REQUESTS: u32 = 20_000;

fn skip(why: &str) -> bool {
    eprintln!("SKIPPED: {why}");
    true
}

fn cannot_run() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip("needs root (namespaces, DPDK)");
    }
    for tool in ["redis-server", "redis-cli", "redis-benchmark"] {
        if !Path::new("/usr/bin").join(tool).exists() {
            return skip(&format!("/usr/bin/{tool} is missing: run `make setup` (testbed/setup.sh installs redis-server and redis-tools)"));
        }
    }
    false
}

/// The `libluna_preload.so` cargo built for this test run (in `deps/`, next to the test
/// binary; `target/<profile>/` holds a copy only after `cargo build`).
fn shim() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let dir = exe.parent().expect("deps dir");
    let so = dir.join("libluna_preload.so");
    assert!(
        so.exists(),
        "{} is missing: cargo builds it with this test",
        so.display()
    );
    so
}

/// r2c's configuration for the tap port: one poll thread, yielding when idle (shared CPUs).
fn config(tap: &Tap) -> String {
    let mut port = tap.dpdk.clone();
    port.eal.memory_mb = 128;
    let mut eal = port.eal.args();
    eal.push("--no-telemetry".into());
    let name = port
        .eal
        .vdev
        .split(',')
        .next()
        .expect("vdev name")
        .to_string();
    let eal: Vec<String> = eal.iter().map(|a| format!("{a:?}")).collect();
    format!(
        "eal = [{}]\n\n[device]\nkind = \"dpdk\"\nport = \"{name}\"\n\n[cores]\nlist = [0]\n\n\
         [net]\nip = \"{}\"\nprefix_len = {}\n\n[runtime]\nmode = \"batch\"\nidle = \"yield\"\npin = false\n",
        eal.join(", "),
        port.ip,
        port.prefix_len
    )
}

struct Out {
    ok: bool,
    out: String,
    err: String,
}

fn output(mut c: Child, limit: Duration, what: &str) -> Out {
    let mut so = c.stdout.take().expect("piped");
    let mut se = c.stderr.take().expect("piped");
    let t1 = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t2 = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let end = Instant::now() + limit;
    let status = loop {
        if let Ok(Some(s)) = c.try_wait() {
            break Some(s);
        }
        if Instant::now() > end {
            eprintln!("{what}: killed after {limit:?}");
            let _ = c.kill();
            let _ = c.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Out {
        ok: status.is_some_and(|s| s.success()),
        out: t1.join().unwrap_or_default(),
        err: t2.join().unwrap_or_default(),
    }
}

fn run(mut cmd: Command, limit: Duration, what: &str) -> Out {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let c = cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    output(c, limit, what)
}

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
    if cannot_run() {
        return;
    }
    let so = shim();
    let prefix = Prefix::new("lprds").unwrap();
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let tap = topo.tap().expect("tap details").clone();
    let cfg = topo.state_dir().join("luna-preload-redis.toml");
    std::fs::write(&cfg, config(&tap)).expect("config");

    // `env` sets the preload for redis-server only (not for `ip netns exec`).
    let mut cmd = testbed::netns_command(&tap.dpdk.netns, "env");
    cmd.arg(format!("LD_PRELOAD={}", so.display()))
        .arg(format!("LUNA_CONFIG={}", cfg.display()))
        .arg("/usr/bin/redis-server")
        .args([
            "--port",
            &PORT.to_string(),
            "--bind",
            &tap.dpdk.ip.to_string(),
        ])
        .args(["--io-threads", "1", "--save", "", "--appendonly", "no"])
        .args([
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--unixsocket",
            "",
        ])
        .args(["--dir", &topo.state_dir().display().to_string()]);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let server = cmd.spawn().expect("redis-server");
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
    if cannot_run() {
        return;
    }
    if !Path::new("/usr/bin/python3").exists() {
        skip("/usr/bin/python3 is missing");
        return;
    }
    let so = shim();
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

    let mut cmd = testbed::netns_command(&tap.dpdk.netns, "env");
    cmd.arg(format!("LD_PRELOAD={}", so.display()))
        .arg(format!("LUNA_CONFIG={}", cfg.display()))
        .arg("/usr/bin/python3")
        .arg(format!("{py}/client_check.py"))
        .args([&luna, &kernel, port, &ready.display().to_string()]);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let client = cmd.spawn().expect("python client");

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
