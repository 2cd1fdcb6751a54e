//! Real memcached clients from the kernel against luna-kv (r2c/examples/luna-kv: the
//! memcached server over msgsched message sockets) on the tap topology:
//!
//! * `memccapable` (libmemcached-tools' conformance checker), text and binary, under
//!   MS, CS and CP: every test must pass (the counts go to docs/msgsched-protocols.md);
//! * `memcslap` (text get, binary mget) with the server's hit counters checked, and
//!   `pymemcache` (Debian python3-pymemcache: tests/memcached/pymemcache_check.py, every
//!   call's result checked);
//! * the memcached attacks (tests/memcached/attack.py: length overflows, huge
//!   `<bytes>`, LF-only lines, keys over 250 bytes, huge multigets, a slow reader) while a
//!   well-behaved client checks every reply; the server's counters show each closed
//!   connection's reason and that the slow reader's requests were not all taken.
//!
//! The server is this test binary re-executed in the topology's namespace (role child,
//! `common/children.rs`); it serves until `<ready>.stop` exists and prints its counters.
//! Needs root, hugepages and `make setup` (which installs the clients).

#[path = "common/children.rs"]
mod children;
#[allow(dead_code)]
#[path = "../examples/luna-kv/kv.rs"]
mod kv;
#[allow(dead_code)]
#[path = "../examples/luna-kv/server.rs"]
mod server;
#[allow(dead_code)]
#[path = "../examples/common/service.rs"]
mod service;

use children::{field, lines, spawn, spawn_on_tap, Outcome, ARG, PORT_JSON, ROLE};
use msgsched::sched::Model;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use testbed::{DpdkPort, Kind, Prefix, Tap, Topology};

const LIMIT: Duration = Duration::from_secs(240);
const PORT: u16 = 11211;
const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/memcached");

/// One luna-kv server at a time: each busy-polls an I/O core, and several at once on a
/// loaded 2-core machine starve each other into client timeouts.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A luna-kv server on the tap topology, stopped by [`Kv::stop`].
struct Kv {
    _turn: MutexGuard<'static, ()>,
    topo: Topology,
    tap: Tap,
    server: children::TapChild,
    stop: PathBuf,
}

impl Kv {
    fn start(prefix: &str, model: &str) -> Kv {
        let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        for tool in ["memccapable", "memcslap"] {
            assert!(
                Path::new("/usr/bin").join(tool).exists(),
                "{tool} is missing: run `make setup` (testbed/setup.sh installs libmemcached-tools)"
            );
        }
        let prefix = Prefix::new(prefix).unwrap();
        let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
        let tap = topo.tap().expect("tap details").clone();
        let role = format!("kv-{model}");
        let ready = topo.state_dir().join(format!("r2c-{role}-ready"));
        let stop = PathBuf::from(format!("{}.stop", ready.display()));
        let _ = std::fs::remove_file(&stop);
        let server = spawn_on_tap(&topo, &role, "luna-kv");
        Kv {
            _turn: turn,
            topo,
            tap,
            server,
            stop,
        }
    }

    fn ip(&self) -> String {
        self.tap.dpdk.ip.to_string()
    }

    /// `program args` in the kernel namespace, bounded.
    fn run(&self, program: &str, args: &[&str], what: &str) -> Outcome {
        let mut cmd: Command = self.tap.host.command(program);
        cmd.args(args);
        spawn(cmd, what).wait(LIMIT)
    }

    /// Stops the server; its `OK` line.
    fn stop(self) -> String {
        std::fs::write(&self.stop, b"stop").expect("stop file");
        let o = self.server.wait(LIMIT);
        drop(self.topo);
        let _ = std::fs::remove_file(&self.stop);
        lines(&[(&o, "OK ")]).remove(0)
    }
}

/// `memccapable -a|-b`: (passed, failed) test names.
fn memccapable(kv: &Kv, flag: &str) -> (Vec<String>, Vec<String>) {
    let ip = kv.ip();
    let o = kv.run(
        "memccapable",
        &["-h", &ip, "-p", &PORT.to_string(), "-t", "15", flag],
        "memccapable",
    );
    let all = format!("{}{}", o.out, o.err);
    let (mut pass, mut fail) = (Vec::new(), Vec::new());
    for l in all.lines() {
        let name = l.get(..40).unwrap_or(l).trim().to_string();
        if l.ends_with("[pass]") {
            pass.push(name);
        } else if l.contains("[FAIL]") {
            fail.push(name);
        }
    }
    println!(
        "memccapable {flag}: {} passed, failed: {fail:?}\n{all}",
        pass.len()
    );
    (pass, fail)
}

fn memccapable_under(model: &str, prefix: &str) {
    let kv = Kv::start(prefix, model);
    let (text_pass, text_fail) = memccapable(&kv, "-a");
    let (bin_pass, bin_fail) = memccapable(&kv, "-b");
    let s = kv.stop();
    println!("server ({model}): {s}");
    assert!(
        text_fail.is_empty() && bin_fail.is_empty(),
        "{text_fail:?} {bin_fail:?}"
    );
    // libmemcached 1.1.4 runs 27 text and 27 binary tests.
    assert_eq!(text_pass.len(), 27, "{text_pass:?}");
    assert_eq!(bin_pass.len(), 27, "{bin_pass:?}");
    assert!(text_pass.iter().any(|t| t == "ascii mget"));
    assert!(bin_pass.iter().any(|t| t == "binary getkq"));
    assert_eq!(field(&s, "panicked"), 0, "{s}");
    assert_eq!(field(&s, "sequence_errors"), 0, "{s}");
    assert!(field(&s, "text") > 100 && field(&s, "binary") > 100, "{s}");
}

#[test]
fn memccapable_passes_text_and_binary_under_ms() {
    memccapable_under("ms", "lmcms");
}

#[test]
fn memccapable_passes_text_and_binary_under_cs() {
    memccapable_under("cs", "lmccs");
}

#[test]
fn memccapable_passes_text_and_binary_under_cp() {
    memccapable_under("cp", "lmccp");
}

/// `stats` over a raw text connection: (cmd_get, get_hits, cmd_set).
fn stats(kv: &Kv) -> (u64, u64, u64) {
    let py = format!(
        "import socket\n\
         c=socket.create_connection(('{}',{PORT}),timeout=10)\n\
         c.sendall(b'stats\\r\\n')\n\
         b=b''\n\
         while not b.endswith(b'END\\r\\n'):\n  d=c.recv(65536)\n  assert d\n  b+=d\n\
         print('STATS',' '.join(l.split()[1]+'='+l.split()[2] for l in b.decode().splitlines() if l.startswith('STAT ')))\n",
        kv.ip()
    );
    let o = kv.run("/usr/bin/python3", &["-c", &py], "stats");
    let l = lines(&[(&o, "STATS")]).remove(0);
    (
        field(&l, "cmd_get"),
        field(&l, "get_hits"),
        field(&l, "cmd_set"),
    )
}

#[test]
fn memcslap_and_pymemcache_get_correct_replies() {
    let kv = Kv::start("lmcsl", "ms");
    let server = format!("{}:{PORT}", kv.ip());
    // Text: 2,000 keys set, then 4 threads x 2,000 gets of them: every get must hit.
    let (g0, h0, s0) = stats(&kv);
    let o = kv.run(
        "memcslap",
        &["-s", &server, "-c", "4", "-t", "get", "-e", "2000"],
        "memcslap get",
    );
    let l = lines(&[(&o, "Time to get")]).remove(0);
    assert!(l.contains("8000 keys by    4 threads"), "{l}");
    let (g1, h1, s1) = stats(&kv);
    assert_eq!(s1 - s0, 2000, "memcslap's sets");
    assert_eq!(g1 - g0, 8000, "memcslap's gets");
    assert_eq!(h1 - h0, 8000, "every get of a key it set hits");
    // Binary multiget.
    let o = kv.run(
        "memcslap",
        &["-b", "-s", &server, "-c", "2", "-t", "mget", "-e", "500"],
        "memcslap binary mget",
    );
    let l = lines(&[(&o, "Time to mget")]).remove(0);
    assert!(l.contains("1000 keys by    2 threads"), "{l}");
    let (g2, h2, _) = stats(&kv);
    assert_eq!(g2 - g1, 1000, "binary mget keys");
    assert_eq!(h2 - h1, 1000, "binary mget hits");
    // pymemcache.
    let script = format!("{SCRIPTS}/pymemcache_check.py");
    let o = kv.run(
        "/usr/bin/python3",
        &[&script, &kv.ip(), &PORT.to_string()],
        "pymemcache",
    );
    let l = lines(&[(&o, "PYMEMCACHE ok")]).remove(0);
    assert!(field(&l, "checks") >= 27, "{l}");
    let s = kv.stop();
    println!("server: {s}");
    assert_eq!(field(&s, "panicked"), 0, "{s}");
    assert_eq!(
        field(&s, "parse_malformed") + field(&s, "parse_too_large"),
        0,
        "{s}"
    );
}

#[test]
fn memcached_attacks_close_only_the_offender_and_a_legit_client_keeps_working() {
    let kv = Kv::start("lmcat", "ms");
    let script = format!("{SCRIPTS}/attack.py");
    let o = kv.run(
        "/usr/bin/python3",
        &[&script, &kv.ip(), &PORT.to_string()],
        "attack",
    );
    let got = lines(&[(&o, "LEGIT ok"), (&o, "ATTACK-SUMMARY ok")]);
    println!("{}", o.out);
    let pairs = field(&got[0], "pairs");
    let slow_sent = field(&got[1], "slow_sent");
    let s = kv.stop();
    println!("server: {s}");
    for a in [
        "bin_bodylen_underflow",
        "bin_key_over_250",
        "bin_huge_bodylen",
        "bin_bad_magic",
        "text_bad_bytes",
        "text_value_too_large",
        "lf_only_lines",
        "key_over_250",
        "huge_multiget",
        "long_line",
        "valid_then_long_line",
        "large_multiget_answered",
        "slow_reader",
    ] {
        assert!(o.out.contains(&format!("ATTACK {a} ok")), "{a}: {}", o.out);
    }
    assert_eq!(field(&s, "panicked"), 0, "{s}");
    // Each closed connection with its reason: keylen + extlen > bodylen and keylen > 250
    // (bad_field), bad magic (malformed), the huge multiget and the two long lines
    // (too_large). Each was closed after the replies to its valid requests and its
    // farewell (the script checks them).
    assert_eq!(field(&s, "parse_bad_field"), 2, "{s}");
    assert_eq!(field(&s, "parse_malformed"), 1, "{s}");
    assert_eq!(field(&s, "parse_too_large"), 3, "{s}");
    // The 3 MiB value was swallowed in chunks of at most 64 KiB, never buffered whole.
    assert!(field(&s, "swallowed") >= 48, "{s}");
    assert!(field(&s, "store_bytes_hwm") < 16 << 20, "{s}");
    // The slow reader's 2,000 requests for a 1 MB value were not all taken: its
    // connection was paused once its replies could not be sent. Besides the legit
    // client's 2 per pair, swallowed chunks and ~40 other requests, at most a few
    // in-flight windows of its requests were served.
    assert!(slow_sent >= 1000, "{slow_sent}");
    let others = 2 * pairs + field(&s, "swallowed") + 60;
    let slow_taken = field(&s, "messages").saturating_sub(others);
    assert!(
        slow_taken < 500,
        "slow reader's requests taken: {slow_taken} ({s})"
    );
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
    let ready = std::env::var(ARG).expect("ready file");
    let model: Model = role
        .strip_prefix("kv-")
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("unknown role {role}"));
    let cfg = server::ServeConfig {
        model,
        workers: 4,
        port: PORT,
        limit: LIMIT,
        ..server::ServeConfig::default()
    };
    let stop = PathBuf::from(format!("{ready}.stop"));
    println!(
        "OK {}",
        server::serve(&port, &cfg, Path::new(&ready), &stop)
    );
}
