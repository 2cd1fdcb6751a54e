//! Real HTTP/2 clients against luna's HTTP/2 server (the `luna-h2` example) on the tap
//! topology: `nghttp` and `h2load` (Debian nghttp2-client) from the kernel side, under
//! each scheduling model; and adversarial Python clients (Debian python3-h2's
//! hyperframe/hpack, `tests/h2/attacks.py`), each attack beside a well-behaved client
//! whose replies are checked.
//!
//! Each test brings up its own tap topology (own prefix), starts the example (which
//! runs itself inside the topology's namespace), runs the clients in that namespace,
//! then stops the server through its stop file and checks the counters it prints.
//! Needs root, hugepages and `make setup` (nghttp2-client, python3-h2).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use testbed::{Kind, Prefix, Topology};

const PORT: u16 = 8080;

/// An example binary, built if it is missing or older than this test.
fn example(name: &str) -> PathBuf {
    let me = std::env::current_exe().expect("test exe");
    let dir = me.parent().and_then(Path::parent).expect("target dir");
    let exe = dir.join("examples").join(name);
    let stale = |p: &Path| {
        let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        match (m(p), m(&me)) {
            (Some(a), Some(b)) => a < b,
            _ => true,
        }
    };
    if stale(&exe) {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let release = dir.file_name().is_some_and(|d| d == "release");
        let st = Command::new(cargo)
            .args(["build", "-p", "r2c", "--example", name])
            .args(release.then_some("--release"))
            .status()
            .expect("cargo build --example");
        assert!(st.success(), "building the {name} example failed");
    }
    exe
}

struct Server {
    child: Child,
    stop: PathBuf,
    topo: Topology,
    port: u16,
}

impl Server {
    fn start(prefix: &str, model: &str, extra: &[&str]) -> Server {
        Self::start_example("luna-h2", PORT, prefix, model, extra)
    }

    fn start_example(name: &str, port: u16, prefix: &str, model: &str, extra: &[&str]) -> Server {
        let prefix = Prefix::new(prefix).unwrap();
        let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
        let dir = topo.state_dir();
        let (stop, ready) = (dir.join("h2-stop"), dir.join("h2-ready"));
        let _ = std::fs::remove_file(&stop);
        let _ = std::fs::remove_file(&ready);
        let mut cmd = Command::new(example(name));
        cmd.args([
            "--prefix",
            prefix.as_str(),
            "--model",
            model,
            "--workers",
            "3",
        ])
        .args(["--stop-file", &stop.display().to_string()])
        .args(["--ready-file", &ready.display().to_string()])
        .args(["--secs", "240"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("luna-h2");
        let end = Instant::now() + Duration::from_secs(90);
        while !ready.exists() {
            if Instant::now() > end || child.try_wait().ok().flatten().is_some() {
                let _ = child.kill();
                let o = child.wait_with_output().unwrap();
                panic!(
                    "luna-h2 did not come up\n{}\n{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Server {
            child,
            stop,
            topo,
            port,
        }
    }

    /// A command in the kernel side's namespace.
    fn client(&self, program: &str) -> Command {
        self.topo.tap().expect("tap").host.command(program)
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}:{}{path}", self.addr(), self.port)
    }

    fn addr(&self) -> std::net::Ipv4Addr {
        self.topo.tap().expect("tap").dpdk.ip
    }

    /// Stops the server; its counters.
    fn stop(mut self) -> HashMap<String, u64> {
        std::fs::write(&self.stop, b"stop").unwrap();
        let end = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() > end {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let o = self.child.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let line = out
            .lines()
            .find(|l| l.starts_with("OK "))
            .unwrap_or_else(|| panic!("no OK line\n{out}\n{}", String::from_utf8_lossy(&o.stderr)));
        println!("server: {line}");
        line.split_whitespace()
            .skip(1)
            .filter_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    }
}

/// Runs a client to its end (killed after `limit`, never reached in a passing run),
/// reading its output while it runs.
fn run(mut cmd: Command, limit: Duration) -> Output {
    let c = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("client");
    let pid = c.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(c.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(o) => o.unwrap(),
        Err(_) => {
            // Only the client this call started, by its pid.
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            rx.recv().unwrap().unwrap()
        }
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// h2load's "requests: N total, N started, N done, N succeeded, ..." line, as numbers.
fn h2load_counts(out: &str) -> (u64, u64, u64) {
    let line = out
        .lines()
        .find(|l| l.starts_with("requests:"))
        .unwrap_or_else(|| panic!("no requests line in\n{out}"));
    let n = |what: &str| -> u64 {
        line.split(',')
            .find(|p| p.trim().ends_with(what))
            .and_then(|p| {
                p.split_whitespace()
                    .rev()
                    .nth(1)
                    .or(p.split_whitespace().next())
            })
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no '{what}' in {line}"))
    };
    let total: u64 = line
        .trim_start_matches("requests:")
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap();
    (total, n("succeeded"), n("failed"))
}

fn clients(prefix: &str, model: &str) {
    let srv = Server::start(prefix, model, &[]);
    // nghttp: the static page, headers and body checked.
    let o = run(
        {
            let mut c = srv.client("nghttp");
            c.args(["-v", &srv.url("/")]);
            c
        },
        Duration::from_secs(30),
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains(":status: 200"), "{t}");
    assert!(t.contains("content-length: 28"), "{t}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("hello from luna over HTTP/2"),
        "{t}"
    );
    // nghttp: a 100 KB upload echoed back byte for byte (flow control both ways).
    let body: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let file = srv.topo.state_dir().join("h2-body");
    std::fs::write(&file, &body).unwrap();
    let o = run(
        {
            let mut c = srv.client("nghttp");
            c.args(["-d", &file.display().to_string(), &srv.url("/echo")]);
            c
        },
        Duration::from_secs(30),
    );
    assert!(
        o.status.success(),
        "{:?} {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.stdout == body,
        "echo: {} bytes back of {}",
        o.stdout.len(),
        body.len()
    );
    // nghttp: several streams on one connection, one of them 64 KiB (beyond the
    // initial window: needs the client's WINDOW_UPDATEs).
    let o = run(
        {
            let mut c = srv.client("nghttp");
            c.args([
                "-n",
                "-s",
                &srv.url("/big"),
                &srv.url("/"),
                &srv.url("/nope"),
            ]);
            c
        },
        Duration::from_secs(30),
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    // The statistics table: one row per stream with its status code and path.
    let row = |code: &str, path: &str| {
        t.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() >= 6 && w[4] == code && w[w.len() - 1] == path
        })
    };
    assert!(
        row("200", "/big") && row("200", "/") && row("404", "/nope"),
        "{t}"
    );
    // h2load: 2,000 requests, 4 connections, 10 streams each.
    let o = run(
        {
            let mut c = srv.client("h2load");
            c.args(["-n", "2000", "-c", "4", "-m", "10", &srv.url("/")]);
            c
        },
        Duration::from_secs(60),
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert_eq!(h2load_counts(&t), (2000, 2000, 0), "{t}");
    assert!(t.contains("status codes: 2000 2xx"), "{t}");
    // h2load: uploads echoed.
    let small = srv.topo.state_dir().join("h2-small");
    std::fs::write(&small, vec![b'x'; 3000]).unwrap();
    let o = run(
        {
            let mut c = srv.client("h2load");
            c.args(["-n", "300", "-c", "2", "-m", "8", "-d"])
                .arg(&small)
                .arg(srv.url("/echo"));
            c
        },
        Duration::from_secs(60),
    );
    let t = text(&o);
    assert_eq!(h2load_counts(&t), (300, 300, 0), "{t}");
    let c = srv.stop();
    // 1 + 1 + 3 nghttp requests, 2,300 h2load ones.
    assert_eq!(c["h2_requests"], 2305, "{c:?}");
    assert_eq!(c["h2_responses"], 2305, "{c:?}");
    assert_eq!(c["replies"], 2305, "{c:?}");
    assert_eq!(c["abandoned"], 0, "{c:?}");
    assert_eq!(c["attached"], c["detached"], "{c:?}");
    // One connection's streams: spread over the workers under MS (the point of
    // message scheduling), kept on one worker under CP.
    match model {
        "ms" => assert!(c["max_workers_per_conn"] > 1, "{c:?}"),
        "cp" => assert_eq!(c["max_workers_per_conn"], 1, "{c:?}"),
        _ => {}
    }
    assert!(
        !c.keys()
            .any(|k| k.starts_with("h2_goaway_") || k.starts_with("h2_rst_")),
        "no GOAWAY or RST_STREAM for well-behaved clients: {c:?}"
    );
}

#[test]
fn nghttp_and_h2load_against_luna_h2_ms() {
    clients("lh2ms", "ms");
}

#[test]
fn nghttp_and_h2load_against_luna_h2_cs() {
    clients("lh2cs", "cs");
}

#[test]
fn nghttp_and_h2load_against_luna_h2_cp() {
    clients("lh2cp", "cp");
}

/// The test scripts' directory.
fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("h2")
}

/// A Python grpcio unary client (generic methods, raw bytes) against luna-grpc: echo of
/// sizes around the frame and window sizes, 200 calls in flight on one channel, KV puts
/// and gets, NOT_FOUND / INVALID_ARGUMENT / UNIMPLEMENTED statuses; a non-gRPC request
/// is answered 415.
fn grpc_client(prefix: &str, model: &str) {
    let srv = Server::start_example("luna-grpc", 50051, prefix, model, &[]);
    let o = run(
        {
            let mut c = srv.client("/usr/bin/python3");
            c.arg(scripts().join("grpc_client.py"))
                .arg(format!("{}:{}", srv.addr(), srv.port));
            c
        },
        Duration::from_secs(120),
    );
    let t = text(&o);
    assert!(
        o.status.success() && t.contains("GRPC-CLIENT ok calls=314"),
        "{t}"
    );
    let o = run(
        {
            let mut c = srv.client("nghttp");
            c.args([
                "-v",
                "-H",
                "content-type: text/plain",
                &srv.url("/luna.Echo/Echo"),
            ]);
            c
        },
        Duration::from_secs(30),
    );
    assert!(text(&o).contains(":status: 415"), "{}", text(&o));
    let c = srv.stop();
    // 9 + 200 + 50 + 50 + 2 (gzip) successful calls; NOT_FOUND (5), INVALID_ARGUMENT
    // (3) and UNIMPLEMENTED (12) once each; the 415 is not a gRPC call.
    assert_eq!(c["grpc_ok"], 311, "{c:?}");
    assert_eq!(
        c["grpc_gzip"], 2,
        "the two gzip calls arrived compressed: {c:?}"
    );
    assert_eq!(c["grpc_status_5"], 1, "{c:?}");
    assert_eq!(c["grpc_status_3"], 1, "{c:?}");
    assert_eq!(c["grpc_status_12"], 1, "{c:?}");
    assert_eq!(c["h2_requests"], 315, "{c:?}");
    assert_eq!(c["h2_responses"], 315, "{c:?}");
    assert_eq!(c["abandoned"], 0, "{c:?}");
    assert!(
        !c.keys()
            .any(|k| k.starts_with("h2_goaway_") || k.starts_with("h2_rst_")),
        "{c:?}"
    );
}

#[test]
fn grpcio_unary_client_against_luna_grpc_ms() {
    grpc_client("lgrms", "ms");
}

#[test]
fn grpcio_unary_client_against_luna_grpc_cs() {
    grpc_client("lgrcs", "cs");
}

#[test]
fn grpcio_unary_client_against_luna_grpc_cp() {
    grpc_client("lgrcp", "cp");
}

/// Each attack of `tests/h2/attacks.py` on its own connection while h2load, a
/// well-behaved client, keeps requesting on two others: the attacker gets the GOAWAY
/// code the defence says (for the zero-window slow read: its streams past the
/// concurrency limit refused, then, once it has been quiet for the send timeout, GOAWAY
/// NO_ERROR and the close; an idle connection likewise after the idle timeout), every
/// h2load request succeeds, and the server's counters name each defence.
#[test]
fn http2_attacks_are_stopped_and_a_good_client_is_served() {
    // Short timers so the test is quick (the defaults are nginx's: 75 s / 60 s).
    let srv = Server::start(
        "lh2at",
        "ms",
        &["--idle-timeout", "3", "--send-timeout", "3"],
    );
    let mut good = srv.client("h2load");
    good.args(["-D", "20", "-c", "2", "-m", "4", &srv.url("/")]);
    let good = std::thread::spawn(move || run(good, Duration::from_secs(90)));
    std::thread::sleep(Duration::from_secs(1));
    // (attack, expected GOAWAY code: 11 ENHANCE_YOUR_CALM, 3 FLOW_CONTROL_ERROR)
    let attacks = [
        ("rapid_reset", "goaway=11"),
        ("made_you_reset", "goaway=11"),
        ("continuation_flood", "goaway=11"),
        ("hpack_bomb", "goaway=11"),
        ("ping_flood", "goaway=11"),
        ("settings_flood", "goaway=11"),
        ("empty_frames", "goaway=11"),
        ("window_overflow", "goaway=3"),
        (
            "zero_window",
            "goaway=0 rst=50 closed=1 refused=50 debug=send_timeout",
        ),
        (
            "idle",
            "goaway=0 rst=0 closed=1 refused=0 debug=idle_timeout",
        ),
    ];
    for (a, want) in attacks {
        let o = run(
            {
                let mut c = srv.client("/usr/bin/python3");
                c.arg(scripts().join("attacks.py"))
                    .arg(srv.addr().to_string())
                    .arg(PORT.to_string())
                    .arg(a);
                c
            },
            Duration::from_secs(60),
        );
        let t = text(&o);
        println!("{}", t.trim());
        assert!(t.contains(&format!("ATTACK {a} {want}")), "{a}: {t}");
        if want.starts_with("goaway=") {
            assert!(t.contains("closed=1"), "{a}: the server closed it: {t}");
        }
    }
    let g = good.join().unwrap();
    let t = text(&g);
    let (total, ok, failed) = h2load_counts(&t);
    assert!(total > 0 && ok == total && failed == 0, "good client: {t}");
    // And a checked reply after it all.
    let o = run(
        {
            let mut c = srv.client("nghttp");
            c.arg(srv.url("/"));
            c
        },
        Duration::from_secs(30),
    );
    assert_eq!(o.stdout, b"hello from luna over HTTP/2\n", "{}", text(&o));
    let c = srv.stop();
    let n = |k: &str| c.get(k).copied().unwrap_or(0);
    // Rapid reset, MadeYouReset, the ping, settings and empty-frame floods.
    assert_eq!(n("h2_goaway_flood"), 5, "{c:?}");
    assert_eq!(n("h2_goaway_header_block"), 1, "{c:?}");
    assert_eq!(n("h2_goaway_header_list"), 1, "{c:?}");
    assert_eq!(n("h2_goaway_window_overflow"), 1, "{c:?}");
    assert_eq!(n("h2_rst_refused"), 50, "{c:?}");
    assert!(n("h2_rst_zero_window_update") > 0, "{c:?}");
    // The timers: the zero-window reader by the send timeout, the idle one by the idle
    // timeout, each with GOAWAY NO_ERROR; no other connection timed out.
    assert_eq!(n("h2_goaway_send_timeout"), 1, "{c:?}");
    assert_eq!(n("h2_goaway_idle_timeout"), 1, "{c:?}");
    assert_eq!(n("timeout_send"), 1, "{c:?}");
    assert_eq!(n("timeout_idle"), 1, "{c:?}");
    assert_eq!(n("abandoned"), 0, "{c:?}");
    assert_eq!(c["attached"], c["detached"], "{c:?}");
    // Memory under the attacks: the most any one connection held (the session's
    // high-water marks, msgsched::proto::h2::Mark), against luna-h2's bounds
    // (H2Config's defaults, --max-streams 100; docs/reliability.md).
    const KIB: u64 = 1024;
    // The zero-window reader fills every slot and gets no more.
    assert_eq!(n("h2_hwm_streams"), 100, "{c:?}");
    // HPACK bomb (one ~8 KB block) and CONTINUATION flood (cut at 32 frames).
    let block = n("h2_hwm_header_block_bytes");
    assert!(block > 0 && block <= 64 * KIB, "max_header_block: {c:?}");
    // Bodies wait at most max_buffered (4 MiB) plus the connection window (1 MiB).
    assert!(n("h2_hwm_buffered_bytes") <= 5 * 1024 * KIB, "{c:?}");
    // The zero-window reader's 64 KiB `/big` replies: held, at most one per slot.
    let held = n("h2_hwm_held_reply_bytes");
    assert!(
        (64 * KIB..=100 * 64 * KIB).contains(&held),
        "replies held for window: {c:?}"
    );
    // Input is read only while under max_input (64 KiB): at most one received segment
    // beyond it. Output: frames stop being processed at max_output (256 KiB); one
    // frame's answer or a small reply may add to it (no attack here opens a window
    // onto held replies).
    assert!(n("h2_hwm_input_bytes") <= 128 * KIB, "{c:?}");
    let out = n("h2_hwm_output_bytes");
    assert!(out > 0 && out <= 320 * KIB, "{c:?}");
    // Answered: h2load's requests, the last GET, and the few attack streams whose reply
    // went out before their reset arrived (at most one concurrency window of each).
    let extra = n("h2_responses") - (ok + 1).min(n("h2_responses"));
    assert!(
        n("h2_responses") > ok && extra <= 300,
        "responses {} for {} good requests: {c:?}",
        n("h2_responses"),
        ok + 1
    );
}
