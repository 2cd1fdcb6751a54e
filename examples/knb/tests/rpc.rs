//! `knb rpc`, `bulk`, `compare`, `sweep`, `server`, `client` end to end.
//!
//! The stack runs need root (namespaces, hugepages) like the rest of the workspace's
//! integration tests; they are short (about a second measured) and check behaviour —
//! validated responses, sane and complete JSON — never timing. The loopback tests drive
//! `knb server` / `knb client` against hand-written peers that break the protocol.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

const KNB: &str = env!("CARGO_BIN_EXE_knb");

/// The machine has 2 CPUs: one busy-polling run at a time.
static HEAVY: Mutex<()> = Mutex::new(());

fn heavy() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|p| p.into_inner())
}

fn run(args: &[&str], limit: Duration) -> Output {
    run_env(args, &[], limit)
}

fn run_env(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
    let mut child = Command::new(KNB)
        .args(args)
        // The caller's experiment knobs do not leak into the tests' expectations.
        .env_remove("KNB_LUNA_TX_COPY_MAX")
        .env_remove("KNB_LUNA_TLP_US")
        .env_remove("KNB_LUNA_SLAB_MB")
        .env_remove("KNB_LUNA_SERVER_SLAB_MB")
        .env_remove("KNB_LUNA_SERVER_ALLOC_FAIL")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn knb");
    // Drain the pipes while waiting so a chatty child cannot block.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let to = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let te = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("knb {args:?} did not stop within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: to.join().unwrap(),
        stderr: te.join().unwrap(),
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("lkb-test-{}-{name}", std::process::id()))
}

fn read_json(p: &std::path::Path) -> Value {
    let v = serde_json::from_str(&std::fs::read_to_string(p).expect("json written"))
        .expect("valid json");
    let _ = std::fs::remove_file(p);
    v
}

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut x = v;
    for k in path {
        x = &x[*k];
    }
    x.as_f64()
        .unwrap_or_else(|| panic!("{path:?} missing or not a number in {v:#}"))
}

/// The keys every RPC report has, with sane values.
fn check_rpc_report(v: &Value, stack: &str) {
    assert_eq!(v["knb"], "rpc");
    assert_eq!(v["stack"], stack);
    assert!(
        v["errors"].as_array().is_some_and(|e| e.is_empty()),
        "{v:#}"
    );
    let rpcs = num(v, &["rpcs"]);
    assert!(rpcs > 0.0, "no RPC completed: {v:#}");
    assert!(num(v, &["rps"]) > 0.0);
    for k in ["total", "client_to_server", "server_to_client"] {
        assert!(num(v, &["gbps", k]) > 0.0, "gbps.{k}: {v:#}");
    }
    let g = &v["gbps"];
    let sum = g["client_to_server"].as_f64().unwrap() + g["server_to_client"].as_f64().unwrap();
    assert!((sum - g["total"].as_f64().unwrap()).abs() < 1e-9, "{g}");
    let q: Vec<f64> = ["min", "p50", "p90", "p99", "p999", "max"]
        .iter()
        .map(|k| num(v, &["latency_us", k]))
        .collect();
    assert!(q[0] > 0.0 && q.windows(2).all(|w| w[0] <= w[1]), "{q:?}");
    let cdf = v["cdf"].as_array().expect("cdf");
    assert!(cdf.len() > 10);
    for k in ["client", "server"] {
        let c = num(v, &["cpu", k, "cores"]);
        assert!(c > 0.0 && c < 64.0, "cpu.{k}.cores = {c}");
    }
    assert!(v["cpu"]["per_core"].is_object());
    // Contention evidence: involuntary switches per side, host steal, the verdict.
    for k in ["client", "server"] {
        assert!(v["cpu"][k]["nvcsw"].is_u64(), "cpu.{k}.nvcsw: {v:#}");
    }
    let steal = num(v, &["cpu", "steal", "share"]);
    assert!((0.0..=1.0).contains(&steal), "{steal}");
    assert!(v["contention"]["contended"].is_boolean(), "{v:#}");
    assert!(v["contention"]["client_cpu"].as_f64().is_some(), "{v:#}");
    // The server answered at least every RPC the client counted.
    assert!(num(v, &["server", "requests"]) >= rpcs, "{v:#}");
    assert!(v["server"]["errors"]
        .as_array()
        .is_some_and(|e| e.is_empty()));
    assert!(v["commands"]["server"]
        .as_str()
        .is_some_and(|s| s.contains(" server ")));
}

fn rpc_run(stack: &str, extra: &[&str]) -> Value {
    let _g = heavy();
    let json = tmp(&format!("{stack}.json"));
    let csv = tmp(&format!("{stack}.csv"));
    let (j, c) = (
        json.to_string_lossy().into_owned(),
        csv.to_string_lossy().into_owned(),
    );
    let mut args = vec![
        "rpc",
        "--stack",
        stack,
        "--duration",
        "1",
        "--warmup",
        "0.3",
        "--verify",
        "--json",
        &j,
        "--csv",
        &c,
    ];
    args.extend_from_slice(extra);
    let o = run(&args, Duration::from_secs(120));
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("RPC/s") && out.contains("p99 us"), "{out}");
    let csv_text = std::fs::read_to_string(&csv).expect("csv written");
    let _ = std::fs::remove_file(&csv);
    let lines: Vec<&str> = csv_text.lines().collect();
    assert_eq!(lines.len(), 2, "{csv_text}");
    assert!(lines[0].starts_with("stack,mode,req_size"));
    assert!(lines[1].starts_with(&format!("{stack},")));
    read_json(&json)
}

#[test]
fn kernel_rpc_run_validates_and_reports() {
    let v = rpc_run(
        "kernel",
        &[
            "--iodepth",
            "4",
            "--connections",
            "2",
            "--req-size",
            "1000",
            "--resp-size",
            "3000",
        ],
    );
    check_rpc_report(&v, "kernel");
    assert_eq!(v["topology"], "veth");
    assert_eq!(v["config"]["req_size"], 1000);
    assert_eq!(v["config"]["resp_size"], 3000);
    assert_eq!(v["config"]["iodepth"], 4);
    assert_eq!(v["config"]["connections"], 2);
    // Payload rates follow the sizes: 3x more bytes back than forth.
    let r = num(&v, &["gbps", "server_to_client"]) / num(&v, &["gbps", "client_to_server"]);
    assert!((r - 3.0).abs() < 1e-6, "{r}");
}

#[test]
fn kernel_two_threads_and_open_loop() {
    let v = rpc_run(
        "kernel",
        &[
            "--threads",
            "2",
            "--connections",
            "2",
            "--client-cpus",
            "0,1",
            "--server-cpus",
            "1,0",
            "--rate",
            "2000",
        ],
    );
    check_rpc_report(&v, "kernel");
    assert_eq!(v["config"]["threads"], 2);
    assert_eq!(num(&v, &["open_loop", "offered_rps"]), 2000.0);
    assert!(num(&v, &["open_loop", "arrivals"]) > 0.0);
    assert!(v["open_loop"]["dropped_arrivals"].is_u64());
}

#[test]
fn smoltcp_rpc_run_validates_and_reports() {
    let v = rpc_run("smoltcp", &["--iodepth", "4", "--connections", "2"]);
    check_rpc_report(&v, "smoltcp");
    assert_eq!(v["topology"], "memif");
    assert!(num(&v, &["server", "extra", "frames_rx"]) > 0.0, "{v:#}");
    assert_eq!(num(&v, &["server", "extra", "tx_nombuf"]), 0.0);
}

fn bulk_run(stack: &str) {
    let _g = heavy();
    let json = tmp(&format!("{stack}-bulk.json"));
    let j = json.to_string_lossy().into_owned();
    let o = run(
        &[
            "bulk",
            "--stack",
            stack,
            "--duration",
            "1",
            "--warmup",
            "0.3",
            "--verify",
            "--json",
            &j,
        ],
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "{}", text(&o));
    let v = read_json(&json);
    assert_eq!(v["config"]["mode"], "bulk");
    assert_eq!(v["rps"], Value::Null);
    assert_eq!(v["bulk"]["validated"], true, "{v:#}");
    assert!(num(&v, &["bulk", "payload_sent"]) > 0.0);
    assert_eq!(v["bulk"]["payload_sent"], v["bulk"]["payload_received"]);
    if num(&v, &["bulk", "receiver_window_s"]) > 0.0 {
        assert!(num(&v, &["bulk", "receiver_gbps"]) > 0.0);
    } else {
        // A starved receiver read the MARK and the SYNC in one batch: its rate is not
        // measurable, and knb must say so (null) rather than report 0 Gbit/s.
        assert_eq!(v["bulk"]["receiver_gbps"], Value::Null, "{v:#}");
        eprintln!("{stack} bulk: receiver window not measurable (starved round)");
    }
    assert!(num(&v, &["bulk", "sender_gbps"]) > 0.0);
    assert!(String::from_utf8_lossy(&o.stdout).contains("bulk: receiver"));
}

#[test]
fn kernel_bulk_stream_is_counted_end_to_end() {
    bulk_run("kernel");
}

#[test]
fn smoltcp_bulk_stream_is_counted_end_to_end() {
    bulk_run("smoltcp");
}

#[test]
fn luna_rpc_run_validates_and_reports() {
    let v = rpc_run(
        "luna",
        &[
            "--iodepth",
            "4",
            "--connections",
            "2",
            "--req-size",
            "1000",
            "--resp-size",
            "3000",
        ],
    );
    check_rpc_report(&v, "luna");
    assert_eq!(v["topology"], "memif");
    let r = num(&v, &["gbps", "server_to_client"]) / num(&v, &["gbps", "client_to_server"]);
    assert!((r - 3.0).abs() < 1e-6, "{r}");
    // Replies the server handed to its stack but had not sent when the client stopped
    // (iodepth 4 × 2 connections × 3000 B at most).
    const IN_FLIGHT: f64 = 8.0 * 3000.0;
    // Both sides report their r2c core and device counters. On memif in copy mode r2c
    // sends every frame as one flat copy, so each
    // side copied at least the payload the other side received (retransmissions are
    // copied too), and no more than its frames' bytes.
    let ex = &v["server"]["extra"];
    assert!(num(ex, &["frames_rx"]) > 0.0, "{v:#}");
    let copied = num(ex, &["copied_bytes"]);
    assert!(
        copied >= num(&v, &["server", "tx_payload"]) - IN_FLIGHT
            && copied <= num(ex, &["core", "tx_bytes"]),
        "{v:#}"
    );
    assert_eq!(num(ex, &["core", "accepted"]), 2.0, "{v:#}");
    let c = &v["client_extra"][0];
    assert!(num(c, &["frames_tx"]) > 0.0, "{v:#}");
    let copied = num(c, &["copied_bytes"]);
    assert!(
        copied >= num(&v, &["server", "rx_payload"]) && copied <= num(c, &["core", "tx_bytes"]),
        "{v:#}"
    );
    assert_eq!(num(c, &["core", "connected"]), 2.0, "{v:#}");
}

/// Jumbo frames copied flat: at MTU 9000 a 4 KiB message is one frame, longer than a
/// standard mbuf holds. By default on memif in copy mode, and with the copy threshold
/// above it (`KNB_LUNA_TX_COPY_MAX`), r2c copies each such frame whole into one mbuf of
/// its copy pool; with 0 it chains the payload zero copy. All keep every byte
/// (`--verify`), and the copy shows in the counters: before the copy pool, a threshold
/// above 2 KiB silently chained instead.
#[test]
fn luna_jumbo_frames_go_whole_copied_or_chained_and_keep_every_byte() {
    let args = [
        "--mtu",
        "9000",
        "--verify",
        "--iodepth",
        "4",
        "--req-size",
        "4096",
        "--resp-size",
        "4096",
        "--duration",
        "1",
        "--warmup",
        "0.2",
    ];
    for copy_max in ["16384", "0", "default"] {
        let env: &[(&str, &str)] = match copy_max {
            "default" => &[],
            v => &[("KNB_LUNA_TX_COPY_MAX", v)],
        };
        let v = luna_json_run("jumbo", &args, env);
        check_rpc_report(&v, "luna");
        // Bytes each side copied into frames, against the payload the other received.
        let sides = [
            (&v["server"]["extra"], num(&v, &["server", "tx_payload"])),
            (&v["client_extra"][0], num(&v, &["server", "rx_payload"])),
        ];
        for (ex, payload) in sides {
            let copied = num(ex, &["copied_bytes"]);
            if copy_max == "0" {
                assert_eq!(copied, 0.0, "chains only: {v:#}");
            } else {
                // (Replies still unsent at the client's end: iodepth 4 × 4 KiB.)
                assert!(
                    copied >= payload - 4.0 * 4096.0,
                    "{copied} < {payload}: {v:#}"
                );
            }
        }
    }
}

#[test]
fn luna_two_lanes_and_open_loop() {
    let v = rpc_run(
        "luna",
        &[
            "--threads",
            "2",
            "--connections",
            "4",
            "--client-cpus",
            "0,1",
            "--server-cpus",
            "1,0",
            "--rate",
            "2000",
        ],
    );
    check_rpc_report(&v, "luna");
    assert_eq!(v["config"]["threads"], 2);
    assert!(num(&v, &["open_loop", "arrivals"]) > 0.0);
    // One r2c core per lane on each side, two connections each (memif pairs queue i
    // with queue i).
    let lanes = v["client_extra"].as_array().expect("client lanes");
    assert_eq!(lanes.len(), 2, "{v:#}");
    for l in lanes {
        assert_eq!(num(l, &["core", "connected"]), 2.0, "{v:#}");
    }
    assert_eq!(num(&v, &["server", "extra", "core", "accepted"]), 4.0);
}

/// `knb rpc --stack luna <args> --json <file>` with `env`: must succeed; its report.
fn luna_json_run(name: &str, args: &[&str], env: &[(&str, &str)]) -> Value {
    let _g = heavy();
    let json = tmp(name);
    let j = json.to_string_lossy().into_owned();
    let mut all = vec!["rpc", "--stack", "luna", "--json", &j];
    all.extend_from_slice(args);
    let o = run_env(&all, env, Duration::from_secs(180));
    assert!(o.status.success(), "{}", text(&o));
    read_json(&json)
}

/// Overload must slow luna's knb server down, not fail it: 5,000 connections offered far
/// more than the pair can answer (open loop), the server's zbuf memory cut to 48 MiB
/// (`KNB_LUNA_SERVER_SLAB_MB`). The server used to abort each connection whose answers
/// found no free buffer (the client then saw resets: 2 of 5 runs at the default memory
/// failed), and, once it waited instead, to count as its own failure a client that reset
/// a connection whose answers were still waiting. Now it waits for buffers as the client
/// does, counts the refused tries, and leaves a reset connection to `on_closed`.
#[test]
fn luna_server_overloaded_past_its_buffers_waits_instead_of_failing() {
    // Far past what the pair answers in either build (an unoptimised knb answers ~10k
    // RPC/s here, an optimised one ~400k); the debug client offered 500k spends its
    // iterations generating arrivals and barely reads, so it gets less.
    let rate = if cfg!(debug_assertions) {
        "50000"
    } else {
        "500000"
    };
    let v = luna_json_run(
        "luna-overload.json",
        &[
            "--connections",
            "5000",
            "--duration",
            "3",
            "--warmup",
            "1",
            "--rate",
            rate,
        ],
        &[("KNB_LUNA_SERVER_SLAB_MB", "48")],
    );
    assert_eq!(v["server"]["errors"], serde_json::json!([]), "{v:#}");
    assert!(num(&v, &["open_loop", "arrivals"]) > 0.0);
    // Whether the server's buffers run out in a given run depends on the two loops'
    // timing (they did in every release run and in most debug runs); the next test
    // makes them run out in every run.
    assert!(v["server"]["extra"]["tx_memory_waits"].is_u64(), "{v:#}");
    assert!(v["rps"].as_f64().is_some_and(|r| r > 0.0), "{v:#}");
}

/// The server's back pressure path keeps every answer, in order: every 5th buffer
/// allocation of its packs fails as an exhausted slab would (`KNB_LUNA_SERVER_ALLOC_FAIL`),
/// so connections wait in its `starved` queue and are retried, in every run; `--verify`
/// checks every byte and every id of every answer at the client.
#[test]
fn luna_server_answers_everything_in_order_when_buffers_run_out() {
    let v = luna_json_run(
        "luna-alloc-fail.json",
        &[
            "--connections",
            "64",
            "--iodepth",
            "4",
            "--duration",
            "1",
            "--warmup",
            "0.3",
            "--verify",
        ],
        &[("KNB_LUNA_SERVER_ALLOC_FAIL", "5")],
    );
    check_rpc_report(&v, "luna");
    assert!(
        num(&v, &["server", "extra", "tx_memory_waits"]) > 0.0,
        "no pack failed: {v:#}"
    );
}

/// luna in r2c's message mode: four workers scheduled by msgsched (MS, then CS with
/// unordered replies), service-time tags applied by the workers, every response checked.
#[test]
fn luna_message_mode_serves_scheduled_workers() {
    for extra in [
        &["--server-model", "ms"][..],
        &[
            "--server-model",
            "cs",
            "--unordered",
            "--service-mode",
            "sleep",
        ][..],
        &["--server-model", "cp"][..],
    ] {
        let mut args = vec![
            "--iodepth",
            "4",
            "--connections",
            "6",
            "--workers",
            "4",
            "--req-size",
            "64",
            "--resp-size",
            "3000",
            "--service",
            "bimodal:20us",
        ];
        args.extend_from_slice(extra);
        let v = rpc_run("luna", &args);
        check_rpc_report(&v, "luna");
        let m = &v["server"]["extra"]["msgsched"];
        assert_eq!(num(m, &["attached"]), 6.0, "{v:#}");
        assert_eq!(num(m, &["detached"]), 6.0, "{v:#}");
        assert!(num(m, &["replies"]) >= num(&v, &["rpcs"]), "{v:#}");
        for k in [
            "parse_malformed",
            "parse_too_large",
            "parse_bad_field",
            "memory_pressure",
            "sequence_errors",
        ] {
            assert_eq!(num(m, &[k]), 0.0, "{k}: {v:#}");
        }
        assert_eq!(v["server"]["extra"]["server_model"], extra[1], "{v:#}");
    }
}

#[test]
fn a_server_model_the_stack_lacks_is_a_usage_error() {
    for (stack, model) in [("luna", "pool"), ("kernel", "ms"), ("smoltcp", "ms")] {
        let o = run(
            &[
                "rpc",
                "--stack",
                stack,
                "--server-model",
                model,
                "--workers",
                "2",
            ],
            Duration::from_secs(20),
        );
        assert_eq!(o.status.code(), Some(2), "{stack} {model}: {}", text(&o));
        assert!(
            text(&o).contains("not available on --stack"),
            "{}",
            text(&o)
        );
    }
}

/// memif zero-copy mode (`--memif-zero-copy`): the client's vdev shares its EAL memory
/// with the server, which copies straight into and out of the client's buffers (luna's
/// client takes its zbuf zones from EAL memzones). Bytes are checked end to end, and
/// both sides must exit cleanly: a teardown crash (DPDK memif's disconnect callback
/// racing our close, docs/benchmarks.md "Teardown SIGSEGV") fails the run.
#[test]
fn memif_zero_copy_rpcs_validate_for_luna_and_smoltcp() {
    for stack in ["luna", "smoltcp"] {
        let v = rpc_run(
            stack,
            &[
                "--memif-zero-copy",
                "--iodepth",
                "4",
                "--connections",
                "2",
                "--req-size",
                "3000",
                "--resp-size",
                "4096",
            ],
        );
        check_rpc_report(&v, stack);
        assert_eq!(v["config"]["memif_zero_copy"], true, "{v:#}");
        let client = v["commands"]["client"].as_str().unwrap_or_default();
        assert!(
            client.contains("zero-copy=yes") && client.contains("--single-file-segments"),
            "{client}"
        );
        let server = v["commands"]["server"].as_str().unwrap_or_default();
        assert!(!server.contains("zero-copy=yes"), "{server}");
        if stack == "luna" {
            // --verify's patterned payloads are heap buffers, outside the EAL memory the
            // peer can see: the zero-copy client copies them (and only them) on transmit
            // and attaches the rest (no flat copies on a zero-copy client); the server
            // (copy mode on its side) sends its frames as flat copies.
            let c = &v["client_extra"][0];
            assert!(num(c, &["frames_rx"]) > 0.0, "{v:#}");
            let copied = num(c, &["copied_bytes"]);
            // Request bytes the server got (warm-up included), plus what was in flight
            // or retransmitted at the end.
            let sent = num(&v, &["server", "rx_payload"]) * 1.5 + 16.0 * 3000.0;
            assert!(copied > 0.0 && copied <= sent, "{copied} vs {sent}: {v:#}");
            let copied = num(&v, &["server", "extra", "copied_bytes"]);
            assert!(
                copied >= num(&v, &["server", "tx_payload"]) - 8.0 * 4096.0,
                "{v:#}"
            );
        }
    }
}

/// memif zero-copy with the client's ring full of chains (256 connections × 3 frames of
/// header + payload: 1,536 descriptors for a 1,024-slot ring). DPDK 22.11's zero-copy
/// transmit, handed more than four chains in one call, overwrote descriptors the server
/// had not read yet ("bad magic 0x0000", replies to the wrong request, a client
/// SIGSEGV); r2c now hands them over four at a time (`TxQueue::limit_burst`). Every byte
/// is checked (--verify).
#[test]
fn memif_zero_copy_keeps_every_byte_with_the_ring_full() {
    let v = rpc_run(
        "luna",
        &[
            "--memif-zero-copy",
            "--connections",
            "256",
            "--req-size",
            "4096",
            "--resp-size",
            "4096",
        ],
    );
    check_rpc_report(&v, "luna");
    let c = &v["client_extra"][0];
    // The ring was full: frames waited for room (the case that corrupted).
    assert!(num(c, &["core", "tx_retries"]) > 0.0, "{v:#}");
    // 4 KiB messages are three segments: sent as bursts, received as coalesced runs.
    for side in [c, &v["server"]["extra"]] {
        assert!(num(side, &["stack_burst_frames"]) > 0.0, "{v:#}");
        assert!(num(side, &["stack_coalesced_segments"]) > 0.0, "{v:#}");
    }
}

#[test]
fn luna_bulk_stream_is_counted_end_to_end() {
    bulk_run("luna");
}

/// luna's server answers smoltcp's client and the reverse, byte-checked (--verify): two
/// independent TCP implementations over the same memif link.
#[test]
fn luna_and_smoltcp_interoperate_both_ways() {
    for (server, client) in [("luna", "smoltcp"), ("smoltcp", "luna")] {
        let v = rpc_run(
            server,
            &[
                "--client-stack",
                client,
                "--iodepth",
                "4",
                "--req-size",
                "3000",
                "--resp-size",
                "700",
            ],
        );
        check_rpc_report(&v, server);
        assert_eq!(v["client_stack"], client, "{v:#}");
    }
}

#[test]
fn compare_writes_every_ratio() {
    let _g = heavy();
    let json = tmp("compare.json");
    let j = json.to_string_lossy().into_owned();
    let o = run(
        &[
            "compare",
            "--stacks",
            "kernel,smoltcp,luna",
            "--rounds",
            "1",
            "--duration",
            "0.5",
            "--warmup",
            "0.2",
            "--json",
            &j,
        ],
        Duration::from_secs(240),
    );
    assert!(o.status.success(), "{}", text(&o));
    let v = read_json(&json);
    assert_eq!(v["knb"], "compare");
    // On this shared machine a round may be contended: then its ratios are null and
    // `too_busy` says so; otherwise every ratio is a number.
    let busy: Vec<String> = v["too_busy"]
        .as_array()
        .expect("too_busy")
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut measured = Vec::new();
    for k in [
        "luna_vs_kernel_rps",
        "luna_vs_kernel_p99",
        "luna_vs_smoltcp_rps",
        "luna_vs_raw_rps",
        "smoltcp_vs_kernel_rps",
        "smoltcp_vs_kernel_p99",
        "kernel_vs_raw_rps",
        "smoltcp_vs_raw_rps",
    ] {
        let explained = busy.iter().any(|m| m.contains(&format!("measure {k}:")));
        match v[k].as_f64() {
            Some(x) => {
                assert!(x > 0.0 && !explained, "{k}: {v:#}");
                measured.push(k);
            }
            None => {
                assert!(explained, "{k} is null without a reason: {v:#}");
                assert!(out.contains("TOO BUSY") && out.contains(k), "{out}");
            }
        }
        assert_eq!(v["ratio_rounds"][k]["measured"], 1, "{k}: {v:#}");
        // One round is never a fast-mode median (that needs two rounds where both ran fast).
        assert!(v["fast_mode"][k]["value"].is_null(), "{k}: {v:#}");
        assert!(
            v["fast_mode"][k]["rounds"].as_u64() <= Some(1),
            "{k}: {v:#}"
        );
    }
    assert!(out.contains("fast-mode ratios"), "{out}");
    assert_eq!(v["verdict"] == "ok", busy.is_empty(), "{v:#}");
    assert_eq!(v["stacks"]["luna"]["available"], true);
    assert_eq!(v["runs"].as_array().unwrap().len(), 3);
    for s in ["kernel", "smoltcp", "luna", "raw"] {
        let e = &v["stacks"][s];
        assert_eq!(e["measured_rounds"], 1, "{s}: {e:#}");
        assert!(
            e["contended"][0].is_boolean() && e["unstable"][0] == false,
            "{e:#}"
        );
        // A clean stack has a median; a contended one has none (null, not a starved value).
        assert_eq!(
            e["median_rps"].as_f64().is_some(),
            e["contended"][0] == false,
            "{s}: {e:#}"
        );
    }
    // The ratios are computed from the stored per-round values.
    let med = |s: &str, k: &str| num(&v, &["stacks", s, k]);
    if measured.contains(&"smoltcp_vs_kernel_rps") {
        let r = med("smoltcp", "median_rps") / med("kernel", "median_rps");
        assert!((num(&v, &["smoltcp_vs_kernel_rps"]) - r).abs() < 1e-9);
    }
    if measured.contains(&"luna_vs_kernel_rps") {
        let r = med("luna", "median_rps") / med("kernel", "median_rps");
        assert!((num(&v, &["luna_vs_kernel_rps"]) - r).abs() < 1e-9);
    }
    if measured.contains(&"luna_vs_kernel_p99") {
        let r = med("luna", "median_p99_us") / med("kernel", "median_p99_us");
        assert!((num(&v, &["luna_vs_kernel_p99"]) - r).abs() < 1e-9);
    }
}

/// `knb sweep ARGS` with short rounds into a fresh directory named after `name`; asserts
/// success and returns the directory and the output.
fn short_sweep(name: &str, args: &[&str]) -> (std::path::PathBuf, Output) {
    let dir = tmp(name);
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_string_lossy().into_owned();
    let mut a = vec!["sweep"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--duration", "0.3", "--warmup", "0.1", "--out-dir", &d]);
    let o = run(&a, Duration::from_secs(300));
    assert!(o.status.success(), "{}", text(&o));
    (dir, o)
}

#[test]
fn sweep_writes_csv_and_svg_figures() {
    let _g = heavy();
    let (dir, _) = short_sweep(
        "sweep",
        &[
            "--stacks",
            "kernel,smoltcp",
            "--figures",
            "msgsize,cdf",
            "--sizes",
            "64,4k",
        ],
    );
    let csv = std::fs::read_to_string(dir.join("fig9-msgsize.csv")).unwrap();
    // Header + 2 sizes x (kernel, smoltcp, raw).
    assert_eq!(csv.lines().count(), 7, "{csv}");
    for stack in ["kernel", "smoltcp", "raw"] {
        assert_eq!(
            csv.lines()
                .filter(|l| l.contains(&format!(",{stack},")))
                .count(),
            2,
            "{csv}"
        );
    }
    let svg = std::fs::read_to_string(dir.join("fig9-msgsize.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.matches("<polyline").count() == 3,
        "{svg}"
    );
    let cdf = std::fs::read_to_string(dir.join("fig11-cdf.csv")).unwrap();
    assert!(cdf.lines().any(|l| l.starts_with("kernel,0.99,")), "{cdf}");
    assert!(cdf.lines().any(|l| l.starts_with("smoltcp,0.5,")), "{cdf}");
    assert!(std::fs::read_to_string(dir.join("fig11-cdf.svg"))
        .unwrap()
        .contains("<polyline"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// fig10 with luna and the kernel: the `series` column, and LUNA's claims read off the
/// points into figs-claims.csv (a ratio, or on a busy machine the reason there is none).
/// Copy mode only, to keep it short: zero-copy runs are checked by
/// `memif_zero_copy_rpcs_validate_for_luna_and_smoltcp`; `make figures` sweeps both.
#[test]
fn sweep_with_luna_writes_the_claims() {
    let _g = heavy();
    let (dir, o) = short_sweep(
        "sweep-claims",
        &[
            "--stacks",
            "kernel,luna",
            "--memif-modes",
            "copy",
            "--figures",
            "iodepth",
            "--iodepths",
            "1,16",
            "--no-raw",
        ],
    );
    let csv = std::fs::read_to_string(dir.join("fig10-iodepth.csv")).unwrap();
    let header = csv.lines().next().unwrap_or_default();
    assert!(header.starts_with("sweep_point,series,stack,"), "{csv}");
    assert_eq!(
        csv.lines()
            .filter(|l| l.starts_with("iodepth=16,luna,luna,"))
            .count(),
        1,
        "{csv}"
    );
    let claims = std::fs::read_to_string(dir.join("figs-claims.csv")).unwrap();
    let rows: Vec<&str> = claims.lines().collect();
    assert_eq!(
        rows[0], "claim,series,luna,kernel,luna_vs_kernel,paper,note",
        "{claims}"
    );
    assert_eq!(rows.len(), 5, "four claims for one luna series: {claims}");
    for r in &rows[1..] {
        let c: Vec<&str> = r.split(',').collect();
        assert_eq!(c.len(), 7, "{r}");
        assert_eq!(c[1], "luna", "{r}");
        // A ratio, or (contended on a busy machine) the reason why not.
        assert!(!c[4].is_empty() || c[6] == "a point was contended", "{r}");
    }
    assert!(text(&o).contains("LUNA's claims"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_cli_arguments_exit_2_with_a_clear_message() {
    let nodir = tmp("no-such-dir");
    let nd = nodir.to_string_lossy().into_owned();
    for (args, needle) in [
        (&["rpc", "--stack", "quic"][..], "invalid value 'quic'"),
        (&["rpc"][..], "--stack <STACK>"),
        (
            &["rpc", "--stack", "kernel", "--req-size", "2m"][..],
            "above the largest message",
        ),
        (
            &["rpc", "--stack", "kernel", "--req-size", "big"][..],
            "is not a size",
        ),
        (
            &["rpc", "--stack", "kernel", "--iodepth", "0"][..],
            "not in 1..=4096",
        ),
        (
            &["rpc", "--stack", "kernel", "--connections", "0"][..],
            "not in 1..=16384",
        ),
        (
            &[
                "rpc",
                "--stack",
                "kernel",
                "--threads",
                "3",
                "--connections",
                "2",
            ][..],
            "needs at least as many --connections",
        ),
        (
            &["rpc", "--stack", "kernel", "--duration", "0"][..],
            "--duration must be > 0",
        ),
        (
            &["rpc", "--stack", "kernel", "--duration", "soon"][..],
            "is not a number of seconds",
        ),
        (
            &["rpc", "--stack", "kernel", "--rate=-5"][..],
            "is outside [0.001, 1e9]",
        ),
        (
            &["bulk", "--stack", "kernel", "--rate", "10"][..],
            "applies to --mode rpc",
        ),
        (
            &["rpc", "--stack", "kernel", "--client-cpus", "4096"][..],
            "does not exist",
        ),
        (
            &["rpc", "--stack", "kernel", "--server-cpus", "x"][..],
            "is not a CPU number",
        ),
        (
            &["rpc", "--stack", "kernel", "--prefix", "Bad-Prefix"][..],
            "--prefix",
        ),
        (
            &["rpc", "--stack", "kernel", "--port", "0"][..],
            "not in 1..=65535",
        ),
        (&["compare", "--rounds", "0"][..], "not in 1..=50"),
        (&["compare", "--mode", "bulk"][..], "use `knb bulk`"),
        (&["sweep", "--out-dir", &nd][..], "is not a directory"),
        (
            &["sweep", "--figures", "fig99"][..],
            "invalid value 'fig99'",
        ),
        (
            &["server", "--stack", "kernel", "--ip", "not-an-ip"][..],
            "invalid value 'not-an-ip'",
        ),
        (
            &["rpc", "--stack", "luna", "--client-stack", "kernel"][..],
            "an interop run needs one topology",
        ),
    ] {
        let o = run(args, Duration::from_secs(20));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(needle), "{args:?}: {}", text(&o));
        assert!(!text(&o).contains("panicked"), "{args:?}: {}", text(&o));
    }
}

// ------------------------------------------------ protocol errors (loopback) ---

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn connect_retry(port: u16) -> TcpStream {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(e) if Instant::now() > end => panic!("server did not listen: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

#[test]
fn server_reports_garbage_from_a_client_and_exits() {
    let port = free_port();
    let p = port.to_string();
    let t = std::thread::spawn(move || {
        let mut s = connect_retry(port);
        // A header with the wrong magic.
        let _ = s.write_all(&[0xab; 16]);
        let mut buf = [0u8; 64];
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let _ = s.read(&mut buf);
    });
    let o = run(
        &[
            "server",
            "--stack",
            "kernel",
            "--ip",
            "127.0.0.1",
            "--port",
            &p,
            "--cpus",
            "0",
            "--lifetime",
            "15",
        ],
        Duration::from_secs(30),
    );
    t.join().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("bad magic"), "{}", text(&o));
}

/// A fake server that answers each 16-byte-header request with `reply(header)`.
fn fake_server(reply: fn(&[u8; 16]) -> Vec<u8>) -> (u16, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let mut hdr = [0u8; 16];
        if s.read_exact(&mut hdr).is_ok() {
            let len = u32::from_le_bytes(hdr[8..12].try_into().unwrap()) as usize;
            let mut body = vec![0u8; len];
            let _ = s.read_exact(&mut body);
            let _ = s.write_all(&reply(&hdr));
        }
        let mut sink = [0u8; 4096];
        while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
    });
    (port, h)
}

fn client_against(port: u16) -> Output {
    let p = port.to_string();
    run(
        &[
            "client",
            "--stack",
            "kernel",
            "--ip",
            "127.0.0.1",
            "--server-ip",
            "127.0.0.1",
            "--port",
            &p,
            "--cpus",
            "0",
            "--req-size",
            "64",
            "--resp-size",
            "64",
            "--duration",
            "1",
            "--warmup",
            "0",
        ],
        Duration::from_secs(30),
    )
}

#[test]
fn client_rejects_a_response_with_the_wrong_id() {
    let (port, h) = fake_server(|req| {
        let mut r = req.to_vec();
        r[0] ^= 1; // id + 1
        r[12] = 1; // RESPONSE
        r.resize(16 + 64, 0);
        r
    });
    let o = client_against(port);
    h.join().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("response id 1, expected 0"),
        "{}",
        text(&o)
    );
}

#[test]
fn client_rejects_a_short_response_and_garbage() {
    let (port, h) = fake_server(|req| {
        let mut r = req.to_vec();
        r[12] = 1;
        r[8..12].copy_from_slice(&10u32.to_le_bytes());
        r.resize(16 + 10, 0);
        r
    });
    let o = client_against(port);
    h.join().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("response of 10 B, expected 64 B"),
        "{}",
        text(&o)
    );

    let (port, h) = fake_server(|_| b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec());
    let o = client_against(port);
    h.join().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("bad magic"), "{}", text(&o));
}

#[test]
fn client_reports_a_server_that_is_not_there() {
    let o = client_against(free_port());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("connect to 127.0.0.1"), "{}", text(&o));
}

// ------------------------------------- service emulation and kernel server models ---

/// Each kernel server model answers a short open-loop run with service times (bimodal,
/// sleep mode): every RPC validated, the honesty counters reported, the model in the
/// server's report. Checks behaviour, never timing.
#[test]
fn kernel_server_models_answer_with_service_times() {
    for (model, extra) in [
        ("cp", &[][..]),
        ("cs", &[][..]),
        ("pool", &[][..]),
        ("pool", &["--unordered"][..]),
    ] {
        let mut args = vec![
            "--server-model",
            model,
            "--workers",
            "3",
            "--connections",
            "6",
            "--req-size",
            "64",
            "--resp-size",
            "100",
            "--service",
            "bimodal:50us",
            "--service-mode",
            "sleep",
            "--rate",
            "3000",
        ];
        args.extend_from_slice(extra);
        let v = rpc_run("kernel", &args);
        check_rpc_report(&v, "kernel");
        assert_eq!(v["server"]["extra"]["server_model"], model, "{v:#}");
        assert_eq!(num(&v, &["server", "extra", "workers"]), 3.0);
        assert_eq!(v["config"]["emu"]["service"]["dist"], "bimodal");
        assert_eq!(v["config"]["emu"]["unordered"], !extra.is_empty());
        let o = &v["open_loop"];
        for k in [
            "sent",
            "behind_schedule",
            "sent_not_answered",
            "unsent_at_end",
            "dropped_arrivals",
        ] {
            assert!(o[k].is_u64(), "{k}: {v:#}");
        }
        assert!(num(o, &["sent"]) > 0.0, "{v:#}");
        assert!(num(o, &["p99_us"]) >= num(o, &["p50_us"]));
        assert_eq!(num(o, &["behind_schedule_threshold_us"]), 10.0);
        assert_eq!(o["latency_from"], "scheduled send time");
    }
}

/// Without --server-model the kernel server applies the service time inline (closed loop),
/// and an unordered closed-loop client works against it.
#[test]
fn kernel_inline_service_and_unordered_closed_loop() {
    let v = rpc_run(
        "kernel",
        &[
            "--service",
            "fixed:20us",
            "--unordered",
            "--iodepth",
            "4",
            "--req-size",
            "8",
            "--resp-size",
            "8",
        ],
    );
    check_rpc_report(&v, "kernel");
    assert_eq!(v["config"]["emu"]["service"]["mean_us"], 20.0);
}

#[test]
fn bad_service_arguments_exit_2_with_a_clear_message() {
    for (args, needle) in [
        (
            &["rpc", "--stack", "kernel", "--service", "pareto:10us"][..],
            "unknown distribution",
        ),
        (
            &["rpc", "--stack", "kernel", "--service", "fixed:10"][..],
            "needs a unit",
        ),
        (
            &["rpc", "--stack", "kernel", "--service", "bimodal"][..],
            "expected fixed:MEAN",
        ),
        (
            &[
                "rpc",
                "--stack",
                "kernel",
                "--service",
                "fixed:20us",
                "--req-size",
                "4",
            ][..],
            "--req-size >= 8",
        ),
        (
            &[
                "rpc",
                "--stack",
                "kernel",
                "--server-model",
                "cp",
                "--workers",
                "0",
            ][..],
            "not in 1..=1024",
        ),
        (
            &["rpc", "--stack", "kernel", "--workers", "4"][..],
            "applies to --server-model",
        ),
        (
            &["bulk", "--stack", "kernel", "--unordered"][..],
            "--unordered applies to --mode rpc",
        ),
        (
            &["rpc", "--stack", "smoltcp", "--server-model", "cs"][..],
            "--server-model cs is not available on --stack smoltcp",
        ),
        (
            &["rpc", "--stack", "kernel", "--server-model", "kcm"][..],
            "invalid value 'kcm'",
        ),
        (
            &["sweep", "--figure", "slo"][..],
            "--figure slo needs --slo",
        ),
        (
            &["sweep", "--figure", "slo", "--slo", "fast"][..],
            "or a multiple of the mean, e.g. 10x",
        ),
        (
            &["service-check", "--modes", "nap"][..],
            "invalid value 'nap'",
        ),
    ] {
        let o = run(args, Duration::from_secs(20));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(needle), "{args:?}: {}", text(&o));
        assert!(!text(&o).contains("panicked"), "{args:?}: {}", text(&o));
    }
}

#[test]
fn service_check_reports_every_mode() {
    let json = tmp("service-check.json");
    let j = json.to_string_lossy().into_owned();
    let o = run(
        &[
            "service-check",
            "--means",
            "20us",
            "--samples",
            "50",
            "--json",
            &j,
        ],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", text(&o));
    let v = read_json(&json);
    let rows = v["rows"].as_array().unwrap();
    let modes: Vec<&str> = rows.iter().filter_map(|r| r["mode"].as_str()).collect();
    assert_eq!(modes, ["spin", "sleep", "timer"], "{v:#}");
    for r in rows {
        // Never earlier than requested.
        assert!(num(r, &["err_p50_us"]) >= 0.0, "{v:#}");
        assert!(num(r, &["err_p999_us"]) >= num(r, &["err_p50_us"]));
    }
    assert!(num(&v, &["margin_us"]) > 0.0);
}

/// lunactl's view of a live knb luna server (r2c's control socket, opened by
/// `KNB_LUNA_SERVER_CONTROL`) agrees with what knb itself counts: as many accepted and
/// ESTABLISHED connections as the client opened, each from the client's address to the
/// server's port, and the core's counters never ahead of the final ones knb reports.
#[test]
fn lunactl_sees_a_live_knb_luna_server() {
    use r2c::control::{request, Command as Ctl};
    let _g = heavy();
    let sock = tmp("ctl.sock");
    let _ = std::fs::remove_file(&sock);
    let json = tmp("ctl.json");
    let (s, j) = (
        sock.to_string_lossy().into_owned(),
        json.to_string_lossy().into_owned(),
    );
    let knb = std::thread::spawn(move || {
        run_env(
            &[
                "rpc",
                "--stack",
                "luna",
                "--connections",
                "3",
                "--iodepth",
                "2",
                "--duration",
                "3",
                "--warmup",
                "0.3",
                "--verify",
                "--json",
                &j,
            ],
            &[("KNB_LUNA_SERVER_CONTROL", &s)],
            Duration::from_secs(120),
        )
    });
    // Poll the server until it shows the three connections (bounded).
    let end = Instant::now() + Duration::from_secs(60);
    let seen = loop {
        assert!(
            Instant::now() < end,
            "the server never showed 3 ESTABLISHED connections"
        );
        if let Ok(r) = request(&sock, &Ctl::Conns, Duration::from_secs(2)) {
            let est: Vec<_> = r
                .cores
                .iter()
                .flat_map(|c| c.conns.iter())
                .filter(|c| c.state == "ESTABLISHED")
                .cloned()
                .collect();
            if r.ok && est.len() == 3 {
                break r;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let o = knb.join().expect("knb thread");
    assert!(o.status.success(), "{}", text(&o));
    let v = read_json(&json);
    check_rpc_report(&v, "luna");
    let accepted: u64 = seen.cores.iter().map(|c| c.stats["accepted"]).sum();
    assert_eq!(
        accepted as f64,
        num(&v, &["server", "extra", "core", "accepted"])
    );
    assert_eq!(accepted, 3);
    let listeners: Vec<_> = seen.cores.iter().flat_map(|c| c.listeners.iter()).collect();
    assert_eq!(listeners.len(), 1, "{listeners:?}");
    let port = listeners[0].local.rsplit(':').next().unwrap().to_owned();
    for c in seen.cores.iter().flat_map(|c| c.conns.iter()) {
        assert!(c.local.ends_with(&format!(":{port}")), "{c:?}");
    }
    // A lossless link: no timeout, and nothing resent but a tail loss probe (which a
    // scheduling stall longer than the probe timeout sets off on this VM).
    let extra = &v["server"]["extra"];
    assert_eq!(num(extra, &["rtos"]), 0.0, "{extra}");
    assert!(
        num(extra, &["retransmits"]) <= num(extra, &["tlp_probes"]),
        "{extra}"
    );
    let rx_live: u64 = seen.cores.iter().map(|c| c.stats["rx_frames"]).sum();
    let rx_final = num(&v, &["server", "extra", "frames_rx"]);
    assert!(
        rx_live > 0 && (rx_live as f64) <= rx_final,
        "{rx_live} vs {rx_final}"
    );
    // The server is gone: so is its socket file, and lunactl's request says so.
    assert!(request(&sock, &Ctl::Stats, Duration::from_secs(1)).is_err());
}

/// `--exception` (kernel coexistence) is luna's, one inline lane: anything else is a usage
/// error (exit 2) naming the reason, before any port is opened.
#[test]
fn server_exception_is_refused_off_luna_and_with_lanes() {
    for (args, want) in [
        (
            &[
                "server",
                "--stack",
                "kernel",
                "--ip",
                "198.18.0.2",
                "--exception",
                "1:cxtap",
            ][..],
            "has none",
        ),
        (
            &[
                "server",
                "--stack",
                "luna",
                "--threads",
                "2",
                "--connections",
                "2",
                "--ip",
                "198.18.0.2",
                "--exception",
                "1:cxtap",
            ][..],
            "one inline lane",
        ),
    ] {
        let o = run(args, Duration::from_secs(20));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(want), "{args:?}: {}", text(&o));
    }
}

/// `KNB_LUNA_TX_COPY_MAX` that is not a byte count stops the run with the variable named,
/// instead of silently choosing a transmit path.
#[test]
fn a_bad_tx_copy_max_is_a_clear_error() {
    let _g = heavy();
    let out = run_env(
        &[
            "rpc",
            "--stack",
            "luna",
            "--duration",
            "0.5",
            "--warmup",
            "0.1",
        ],
        &[("KNB_LUNA_TX_COPY_MAX", "off")],
        Duration::from_secs(120),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("KNB_LUNA_TX_COPY_MAX=\"off\" is not a byte count"),
        "{err}"
    );
}

/// A receive-burst knob out of range stops the run before either side starts, with the
/// variable named as the whole error (it came after the client's failure to reach the
/// server that refused it).
#[test]
fn a_bad_burst_knob_is_refused_before_the_run() {
    for (stack, var, val) in [
        ("luna", "KNB_LUNA_BURST", "0"),
        ("luna", "KNB_LUNA_RX_SPLIT", "x"),
        ("luna", "KNB_LUNA_DEFER_FREES", "yes"),
        ("smoltcp", "KNB_SMOLTCP_BURST", "513"),
    ] {
        let out = run_env(
            &[
                "rpc",
                "--stack",
                stack,
                "--duration",
                "0.5",
                "--warmup",
                "0.1",
            ],
            &[(var, val)],
            Duration::from_secs(60),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{var}: {err}");
        assert!(err.contains(&format!("{var}={val:?} is not")), "{err}");
        assert!(!err.contains("memif"), "refused before set-up: {err}");
    }
}
