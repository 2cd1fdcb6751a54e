//! Unmodified HTTP servers under `LD_PRELOAD=libluna-preload.so` on the tap topology,
//! fetched with `curl` from the kernel namespace:
//! * Debian's `nginx` (single process: `master_process off`) serving static files with its
//!   defaults' `sendfile on` and `tcp_nopush on`: small and large files byte for byte,
//!   keep-alive, ranges, a 404, many connections at once, and a request body;
//! * Python's `http.server.ThreadingHTTPServer` (a thread per connection, blocking
//!   sockets, `selectors` in `serve_forever`): many downloads at once.

mod common;

use common::{cannot_run, config, output, run, signal, spawn_under_shim};
use std::path::Path;
use std::time::{Duration, Instant};
use testbed::{Kind, Prefix, Tap, Topology};

const PORT: u16 = 8080;

/// `len` bytes no two runs of which repeat soon (a file whose every byte is checked).
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.max(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn nginx_conf(root: &Path, ip: &str) -> String {
    let d = root.display();
    format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log stderr info;\n\
         pid {d}/nginx.pid;\nevents {{ worker_connections 512; }}\nhttp {{\n\
         access_log off;\nsendfile on;\ntcp_nopush on;\nkeepalive_timeout 30;\n\
         client_body_temp_path {d}/body;\nproxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fcgi;\nuwsgi_temp_path {d}/uwsgi;\nscgi_temp_path {d}/scgi;\n\
         server {{\nlisten {ip}:{PORT};\nroot {d}/html;\n\
         location /upload {{ client_max_body_size 8m; client_body_in_file_only clean; \
         return 201 \"stored\\n\"; }}\n}}\n}}\n"
    )
}

/// curl in the kernel namespace; its stdout as bytes through a file (binary bodies).
fn curl(tap: &Tap, out: &Path, args: &[&str]) -> common::Out {
    let mut c = tap.host.command("curl");
    c.args(["-sS", "--max-time", "30", "-o"])
        .arg(out)
        .args(args);
    run(c, Duration::from_secs(60), "curl")
}

#[test]
fn nginx_on_luna_serves_files_with_sendfile() {
    if cannot_run(&["/usr/sbin/nginx", "/usr/bin/curl"]) {
        return;
    }
    let prefix = Prefix::new("lprngx").unwrap();
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let tap = topo.tap().expect("tap details").clone();
    let dir = topo.state_dir().join("nginx");
    let html = dir.join("html");
    std::fs::create_dir_all(&html).expect("html dir");
    let small = b"hello from nginx on luna\n".to_vec();
    let big = pattern(3 << 20, 7); // larger than the shim's 1 MiB send queue
    let odd = pattern(100_003, 9);
    std::fs::write(html.join("index.html"), &small).unwrap();
    std::fs::write(html.join("big.bin"), &big).unwrap();
    std::fs::write(html.join("odd.bin"), &odd).unwrap();
    let ip = tap.dpdk.ip.to_string();
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, nginx_conf(&dir, &ip)).unwrap();
    let cfg = topo.state_dir().join("luna-preload-nginx.toml");
    std::fs::write(&cfg, config(&tap)).expect("config");
    let conf_s = conf.display().to_string();
    let dir_s = dir.display().to_string();
    let server = spawn_under_shim(
        &tap,
        &cfg,
        "/usr/sbin/nginx",
        &["-c", &conf_s, "-p", &dir_s],
    );
    let base = format!("http://{ip}:{PORT}");
    let got = dir.join("got");
    let check = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tap.configure_host(Duration::from_secs(60)).expect("tap up");
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let o = curl(&tap, &got, &[&format!("{base}/index.html")]);
            if o.ok {
                break;
            }
            assert!(
                Instant::now() < end,
                "nginx on luna never answered: {}",
                o.err
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(std::fs::read(&got).unwrap(), small, "index.html");
        for (name, want) in [("big.bin", &big), ("odd.bin", &odd)] {
            let o = curl(&tap, &got, &[&format!("{base}/{name}")]);
            assert!(o.ok, "GET /{name}: {}", o.err);
            let body = std::fs::read(&got).unwrap();
            assert_eq!(body.len(), want.len(), "/{name}: length");
            assert!(body == *want, "/{name}: bytes differ");
        }
        // A range from the middle of the large file (sendfile from an offset).
        let o = curl(
            &tap,
            &got,
            &["-r", "1000000-1999999", &format!("{base}/big.bin")],
        );
        assert!(o.ok, "range: {}", o.err);
        assert!(
            std::fs::read(&got).unwrap() == big[1_000_000..2_000_000],
            "range bytes"
        );
        // Keep-alive: three files over one connection (curl reuses it).
        let mut c = tap.host.command("curl");
        c.args(["-sS", "-w", "%{num_connects} %{size_download}\n"]);
        for f in ["index.html", "odd.bin", "index.html"] {
            c.args(["-o", "/dev/null", &format!("{base}/{f}")]);
        }
        let o = run(c, Duration::from_secs(60), "curl keep-alive");
        assert!(o.ok, "keep-alive: {}", o.err);
        let want = format!("1 {n}\n0 {}\n0 {n}\n", odd.len(), n = small.len());
        assert_eq!(o.out, want, "one connection, three answers");
        // A miss.
        let mut c = tap.host.command("curl");
        c.args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("{base}/missing"),
        ]);
        let o = run(c, Duration::from_secs(60), "curl 404");
        assert_eq!(o.out.trim(), "404");
        // A request body (1 MiB upload).
        let up = dir.join("up.bin");
        std::fs::write(&up, pattern(1 << 20, 3)).unwrap();
        let mut c = tap.host.command("curl");
        c.args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--data-binary",
        ])
        .arg(format!("@{}", up.display()))
        .arg(format!("{base}/upload"));
        let o = run(c, Duration::from_secs(60), "curl upload");
        assert_eq!(o.out.trim(), "201", "upload: {}", o.err);
        // 32 connections at once, each fetching the large file.
        let mut c = tap.host.command("curl");
        c.args([
            "-sS",
            "--parallel",
            "--parallel-max",
            "32",
            "-w",
            "%{size_download}\n",
        ]);
        for _ in 0..32 {
            c.args(["-o", "/dev/null", &format!("{base}/big.bin")]);
        }
        let o = run(c, Duration::from_secs(120), "curl parallel");
        assert!(o.ok, "parallel: {}", o.err);
        let sizes: Vec<&str> = o.out.lines().collect();
        assert_eq!(sizes.len(), 32, "{}", o.out);
        assert!(
            sizes.iter().all(|s| *s == big.len().to_string()),
            "{}",
            o.out
        );
    }));
    // nginx ends on SIGQUIT (graceful) with status 0.
    signal(&server, libc::SIGQUIT);
    let o = output(server, Duration::from_secs(30), "nginx");
    println!("nginx:\n{}{}", o.out, o.err);
    drop(topo);
    if let Err(p) = check {
        std::panic::resume_unwind(p);
    }
    assert!(o.ok, "nginx did not exit cleanly");
    assert!(!o.err.contains("luna-preload:"), "shim errors: {}", o.err);
    // No call of nginx's was interrupted before its SIGQUIT: net_tap's receive signals
    // go to luna's poll thread, not to the application's (each interrupted
    // `epoll_wait` is logged at `info`).
    let before_quit = o.err.split("SIGQUIT").next().unwrap_or_default();
    assert_eq!(
        before_quit.matches("Interrupted system call").count(),
        0,
        "nginx's calls were interrupted: {before_quit}"
    );
    assert!(
        !o.err.contains("[alert]") && !o.err.contains("[crit]"),
        "nginx: {}",
        o.err
    );
}

/// Python's standard threading HTTP server: the listener polled by `selectors` in the main
/// thread, each connection served by its own thread with blocking reads and writes.
#[test]
fn python_threading_http_server_on_luna_serves_parallel_downloads() {
    if cannot_run(&["/usr/bin/python3", "/usr/bin/curl"]) {
        return;
    }
    let prefix = Prefix::new("lprpyh").unwrap();
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let tap = topo.tap().expect("tap details").clone();
    let html = topo.state_dir().join("pyhttp");
    std::fs::create_dir_all(&html).expect("dir");
    let big = pattern(2 << 20, 11);
    std::fs::write(html.join("big.bin"), &big).unwrap();
    let cfg = topo.state_dir().join("luna-preload-pyhttp.toml");
    std::fs::write(&cfg, config(&tap)).expect("config");
    let ip = tap.dpdk.ip.to_string();
    let script = format!(
        "import functools, http.server\n\
         h = functools.partial(http.server.SimpleHTTPRequestHandler, directory={:?})\n\
         http.server.ThreadingHTTPServer(({ip:?}, {PORT}), h).serve_forever()\n",
        html.display().to_string()
    );
    let server = spawn_under_shim(&tap, &cfg, "/usr/bin/python3", &["-c", &script]);
    let base = format!("http://{ip}:{PORT}");
    let got = html.join("got");
    let check = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tap.configure_host(Duration::from_secs(60)).expect("tap up");
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let o = curl(&tap, &got, &[&format!("{base}/big.bin")]);
            if o.ok {
                break;
            }
            assert!(
                Instant::now() < end,
                "python on luna never answered: {}",
                o.err
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(std::fs::read(&got).unwrap() == big, "big.bin bytes");
        // 16 connections at once, each served by its own thread.
        let mut c = tap.host.command("curl");
        c.args([
            "-sS",
            "--parallel",
            "--parallel-max",
            "16",
            "-w",
            "%{http_code} %{size_download}\n",
        ]);
        for _ in 0..16 {
            c.args(["-o", "/dev/null", &format!("{base}/big.bin")]);
        }
        let o = run(c, Duration::from_secs(120), "curl parallel");
        assert!(o.ok, "parallel: {}", o.err);
        let want = format!("200 {}", big.len());
        let lines: Vec<&str> = o.out.lines().collect();
        assert_eq!(lines.len(), 16, "{}", o.out);
        assert!(lines.iter().all(|l| *l == want), "{}", o.out);
    }));
    signal(&server, libc::SIGTERM);
    let o = output(server, Duration::from_secs(30), "python http.server");
    println!("python http.server:\n{}{}", o.out, o.err);
    drop(topo);
    if let Err(p) = check {
        std::panic::resume_unwind(p);
    }
    assert!(!o.err.contains("luna-preload:"), "shim errors: {}", o.err);
    assert!(!o.err.contains("Traceback"), "python: {}", o.err);
}

/// Python's asyncio serving a file with `loop.sendfile` (non-blocking `os.sendfile`:
/// partial sends and `EAGAIN`, completed through the event loop's writability).
#[test]
fn asyncio_sendfile_on_luna_serves_parallel_downloads() {
    if cannot_run(&["/usr/bin/python3", "/usr/bin/curl"]) {
        return;
    }
    let prefix = Prefix::new("lpraio").unwrap();
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let tap = topo.tap().expect("tap details").clone();
    let dir = topo.state_dir().join("aio");
    std::fs::create_dir_all(&dir).expect("dir");
    let big = pattern(5 << 20, 13);
    let file = dir.join("big.bin");
    std::fs::write(&file, &big).unwrap();
    let cfg = topo.state_dir().join("luna-preload-aio.toml");
    std::fs::write(&cfg, config(&tap)).expect("config");
    let ip = tap.dpdk.ip.to_string();
    let port = PORT.to_string();
    let file_s = file.display().to_string();
    let server = spawn_under_shim(
        &tap,
        &cfg,
        "/usr/bin/python3",
        &["-c", AIO, &ip, &port, &file_s],
    );
    let url = format!("http://{ip}:{PORT}/");
    let got = dir.join("got");
    let check = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tap.configure_host(Duration::from_secs(60)).expect("tap up");
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let o = curl(&tap, &got, &[&url]);
            if o.ok {
                break;
            }
            assert!(
                Instant::now() < end,
                "asyncio on luna never answered: {}",
                o.err
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(std::fs::read(&got).unwrap() == big, "bytes differ");
        let mut c = tap.host.command("curl");
        c.args([
            "-sS",
            "--parallel",
            "--parallel-max",
            "8",
            "-w",
            "%{http_code} %{size_download}\n",
        ]);
        for _ in 0..8 {
            c.args(["-o", "/dev/null", &url]);
        }
        let o = run(c, Duration::from_secs(120), "curl parallel");
        assert!(o.ok, "parallel: {}", o.err);
        let want = format!("200 {}", big.len());
        assert_eq!(o.out.lines().filter(|l| *l == want).count(), 8, "{}", o.out);
    }));
    signal(&server, libc::SIGTERM);
    let o = output(server, Duration::from_secs(30), "asyncio server");
    println!("asyncio server:\n{}{}", o.out, o.err);
    drop(topo);
    if let Err(p) = check {
        std::panic::resume_unwind(p);
    }
    assert!(!o.err.contains("luna-preload:"), "shim errors: {}", o.err);
}

/// An asyncio HTTP/1.1 server answering every request with the file `argv[3]` through
/// `loop.sendfile` without its read-and-write fallback (it must be `os.sendfile`).
const AIO: &str = r#"
import asyncio, os, sys
ip, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
size = os.path.getsize(path)
async def handle(reader, writer):
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            if line in (b"\r\n", b"\n"):
                break
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size)
        await writer.drain()
        with open(path, "rb") as f:
            await asyncio.get_running_loop().sendfile(writer.transport, f, fallback=False)
        await writer.drain()
    finally:
        writer.close()
async def main():
    srv = await asyncio.start_server(handle, ip, port)
    async with srv:
        await srv.serve_forever()
asyncio.run(main())
"#;

/// nghttp2's `nghttpd` (libev: epoll, and signalfd for its signals) serving HTTP/2 without
/// TLS to `h2load` in the kernel namespace: 20,000 requests over 8 connections, 10
/// streams each in flight, every one answered 2xx.
#[test]
fn nghttpd_on_luna_answers_h2load() {
    if cannot_run(&["/usr/sbin/nghttpd", "/usr/bin/h2load"]) {
        return;
    }
    let prefix = Prefix::new("lprh2").unwrap();
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let tap = topo.tap().expect("tap details").clone();
    let dir = topo.state_dir().join("h2");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("index.html"), pattern(4096, 17)).unwrap();
    let cfg = topo.state_dir().join("luna-preload-h2.toml");
    std::fs::write(&cfg, config(&tap)).expect("config");
    let ip = tap.dpdk.ip.to_string();
    let port = PORT.to_string();
    let dir_s = dir.display().to_string();
    let server = spawn_under_shim(
        &tap,
        &cfg,
        "/usr/sbin/nghttpd",
        &["--no-tls", "-a", &ip, "-d", &dir_s, &port],
    );
    let url = format!("http://{ip}:{PORT}/index.html");
    let check = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tap.configure_host(Duration::from_secs(60)).expect("tap up");
        let end = Instant::now() + Duration::from_secs(60);
        let o = loop {
            let mut c = tap.host.command("h2load");
            c.args(["-n", "20000", "-c", "8", "-m", "10", &url]);
            let o = run(c, Duration::from_secs(120), "h2load");
            if o.out.contains("succeeded") && o.out.contains("requests: 20000 total") {
                break o;
            }
            assert!(Instant::now() < end, "h2load: {}{}", o.out, o.err);
            std::thread::sleep(Duration::from_millis(300));
        };
        println!("h2load:\n{}", o.out);
        assert!(
            o.out
                .contains("20000 succeeded, 0 failed, 0 errored, 0 timeout"),
            "{}",
            o.out
        );
        assert!(o.out.contains("status codes: 20000 2xx"), "{}", o.out);
    }));
    signal(&server, libc::SIGTERM);
    let o = output(server, Duration::from_secs(30), "nghttpd");
    println!(
        "nghttpd:\n{}{}",
        o.out,
        &o.err[o.err.len().saturating_sub(3000)..]
    );
    drop(topo);
    if let Err(p) = check {
        std::panic::resume_unwind(p);
    }
    assert!(!o.err.contains("luna-preload:"), "shim errors: {}", o.err);
}
