//! An unmodified Debian `memcached` (libevent, one listener thread handing connections to
//! four worker threads over pipes, each with its own epoll set) under
//! `LD_PRELOAD=libluna-preload.so` on the tap topology, driven by libmemcached's stock
//! tools in the kernel namespace.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use testbed::{Kind, Prefix, Tap, Topology};

const PORT: u16 = 11211;

fn skip(why: &str) -> bool {
    eprintln!("SKIPPED: {why}");
    true
}

fn cannot_run() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip("needs root (namespaces, DPDK)");
    }
    for tool in ["memcached", "memccapable", "memcslap", "memcstat"] {
        if !Path::new("/usr/bin").join(tool).exists() {
            return skip(&format!("/usr/bin/{tool} is missing: run `make setup`"));
        }
    }
    false
}

fn shim() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let so = exe.parent().expect("deps dir").join("libluna_preload.so");
    assert!(so.exists(), "{} is missing", so.display());
    so
}

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

#[test]
fn memcached_on_luna_passes_memccapable() {
    if cannot_run() {
        return;
    }
    let so = shim();
    let prefix = Prefix::new("lprmc").unwrap();
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let tap = topo.tap().expect("tap details").clone();
    let cfg = topo.state_dir().join("luna-preload-memcached.toml");
    std::fs::write(&cfg, config(&tap)).expect("config");
    let ip = tap.dpdk.ip.to_string();
    let mut cmd = testbed::netns_command(&tap.dpdk.netns, "env");
    cmd.arg(format!("LD_PRELOAD={}", so.display()))
        .arg(format!("LUNA_CONFIG={}", cfg.display()))
        .arg("/usr/bin/memcached")
        .args([
            "-u",
            "root",
            "-l",
            &ip,
            "-p",
            &PORT.to_string(),
            "-U",
            "0",
            "-t",
            "4",
            "-v",
        ]);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let server = cmd.spawn().expect("memcached");
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
    let pid = libc::pid_t::try_from(pid).expect("pid");
    // SAFETY: kill has no memory preconditions; `pid` is our child, not yet reaped.
    unsafe { libc::kill(pid, libc::SIGTERM) };
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
