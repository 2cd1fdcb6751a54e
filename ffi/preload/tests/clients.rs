//! Unmodified clients under `LD_PRELOAD=libluna-preload.so` on the tap topology, talking to
//! kernel servers in the other namespace: `curl` (libcurl: non-blocking connect, `poll`)
//! downloading from Python's HTTP server, `redis-benchmark` (its own event loop over
//! `epoll`, 20 connections) against `redis-server`, and `h2load` (libev) against nghttp2's
//! `nghttpd`.

mod common;

use common::{cannot_run, config, output, signal, spawn_under_shim};
use std::process::Stdio;
use std::time::Duration;
use testbed::{Kind, Prefix, Topology};

#[test]
fn curl_and_redis_benchmark_on_luna_talk_to_kernel_servers() {
    if cannot_run(&[
        "/usr/bin/curl",
        "/usr/bin/python3",
        "/usr/bin/redis-server",
        "/usr/bin/redis-benchmark",
        "/usr/bin/redis-cli",
        "/usr/sbin/nghttpd",
        "/usr/bin/h2load",
    ]) {
        return;
    }
    let prefix = Prefix::new("lprcli").unwrap();
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let tap = topo.tap().expect("tap details").clone();
    let dir = topo.state_dir().join("clients");
    std::fs::create_dir_all(&dir).unwrap();
    let body: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    std::fs::write(dir.join("f.bin"), &body).unwrap();
    std::fs::write(dir.join("h.bin"), &body[..16 << 10]).unwrap();
    let cfg = topo.state_dir().join("luna-preload-clients.toml");
    std::fs::write(&cfg, config(&tap)).expect("config");
    let kernel = tap.host.ip.to_string();

    // The kernel's servers, in the host namespace, on every address: its address on the
    // tap comes only once a luna process has made the tap (curl's first socket).
    let mut http = tap.host.command("python3");
    http.args([
        "-m",
        "http.server",
        "8000",
        "--bind",
        "0.0.0.0",
        "--directory",
    ])
    .arg(&dir)
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    let mut http = http.spawn().expect("python http.server");
    let mut redis = tap.host.command("redis-server");
    redis
        .args([
            "--port",
            "6390",
            "--bind",
            "0.0.0.0",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args([
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--unixsocket",
            "",
        ])
        .arg("--dir")
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut redis = redis.spawn().expect("redis-server");

    let mut h2 = tap.host.command("nghttpd");
    h2.args(["--no-tls", "-a", "0.0.0.0", "-d"])
        .arg(&dir)
        .arg("8001")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut h2 = h2.spawn().expect("nghttpd");

    let check = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // curl starts luna (its first socket); the tap's kernel side comes up meanwhile and
        // luna's SYN retransmissions find it.
        let got = dir.join("got.bin");
        let out = got.display().to_string();
        let url = format!("http://{kernel}:8000/f.bin");
        let c = spawn_under_shim(
            &tap,
            &cfg,
            "/usr/bin/curl",
            &["-sS", "--max-time", "60", "-o", &out, &url],
        );
        tap.configure_host(Duration::from_secs(60)).expect("tap up");
        let o = output(c, Duration::from_secs(90), "curl under the shim");
        assert!(o.ok, "curl: {}{}", o.out, o.err);
        assert!(
            std::fs::read(&got).unwrap() == body,
            "downloaded bytes differ"
        );

        let port = "6390";
        let b = spawn_under_shim(
            &tap,
            &cfg,
            "/usr/bin/redis-benchmark",
            &[
                "-h", &kernel, "-p", port, "-n", "20000", "-c", "20", "-t", "set,incr", "-q",
            ],
        );
        tap.configure_host(Duration::from_secs(60)).expect("tap up");
        let o = output(
            b,
            Duration::from_secs(120),
            "redis-benchmark under the shim",
        );
        println!("redis-benchmark:\n{}{}", o.out, o.err);
        assert!(o.ok, "redis-benchmark: {}{}", o.out, o.err);
        // Every INCR reached the kernel's redis (asked by redis-cli, also on luna: the tap
        // and its kernel side go with each luna process).
        let c = spawn_under_shim(
            &tap,
            &cfg,
            "/usr/bin/redis-cli",
            &["-h", &kernel, "-p", port, "get", "counter:__rand_int__"],
        );
        tap.configure_host(Duration::from_secs(60)).expect("tap up");
        let o = output(c, Duration::from_secs(60), "redis-cli under the shim");
        assert_eq!(o.out.trim(), "20000", "{}", o.err);

        // h2load (libev: epoll, eventfd, signalfd) on luna against the kernel's nghttpd:
        // HTTP/2 without TLS, 8 connections, 10 streams each in flight.
        let url = format!("http://{kernel}:8001/h.bin");
        let h = spawn_under_shim(
            &tap,
            &cfg,
            "/usr/bin/h2load",
            &["-n", "4000", "-c", "8", "-m", "10", &url],
        );
        tap.configure_host(Duration::from_secs(60)).expect("tap up");
        let o = output(h, Duration::from_secs(120), "h2load under the shim");
        println!("h2load:\n{}{}", o.out, o.err);
        assert!(
            o.out
                .contains("4000 succeeded, 0 failed, 0 errored, 0 timeout"),
            "{}{}",
            o.out,
            o.err
        );
        assert!(o.out.contains("status codes: 4000 2xx"), "{}", o.out);
    }));
    signal(&h2, libc::SIGTERM);
    let _ = h2.wait();
    signal(&http, libc::SIGTERM);
    signal(&redis, libc::SIGTERM);
    let _ = http.wait();
    let _ = redis.wait();
    drop(topo);
    if let Err(p) = check {
        std::panic::resume_unwind(p);
    }
}
