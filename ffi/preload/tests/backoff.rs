//! The shim under `idle = "backoff"` (the poll thread sleeps when idle, up to
//! `backoff_max_us`): a reader that takes from a full receive queue wakes it, so the bytes
//! the poll thread left in the stack follow at once instead of after its sleep.

mod common;

use common::{cannot_run, config, output};
use std::process::Stdio;
use std::time::Duration;
use testbed::{Kind, Prefix, Topology};

/// A luna client reads 3 MiB from a kernel server after a pause that let the shim's 1 MiB
/// receive queue fill and the poll thread's idle sleeps grow to `backoff_max_us` (1 s).
/// Draining the queue must wake it: the whole read takes a fraction of a second. Before,
/// nothing woke it and the read waited for its sleep to end (up to 1 s), three rounds.
#[test]
fn a_reader_draining_a_full_queue_wakes_the_sleeping_poll_thread() {
    if cannot_run(&["/usr/bin/python3"]) {
        return;
    }
    let prefix = Prefix::new("lprbo").unwrap();
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let tap = topo.tap().expect("tap details").clone();
    let cfg = topo.state_dir().join("luna-preload-backoff.toml");
    let text = config(&tap).replace(
        "idle = \"yield\"",
        "idle = \"backoff\"\nbackoff_max_us = 1000000",
    );
    assert!(text.contains("backoff_max_us"), "{text}");
    std::fs::write(&cfg, text).expect("config");
    let (kernel, port, rounds, n) = (tap.host.ip.to_string(), "7011", 3, 3 << 20);

    let server_py = format!(
        "import socket\n\
         s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         s.bind(('0.0.0.0',{port})); s.listen(4); s.settimeout(120)\n\
         for _ in range({rounds}):\n  c,_=s.accept(); c.sendall(b'x'*{n}); c.close()\n"
    );
    let mut server = tap.host.command("/usr/bin/python3");
    server
        .args(["-c", &server_py])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut server = server.spawn().expect("kernel server");

    let client_py = format!(
        "import socket,time\n\
         took=[]\n\
         for _ in range({rounds}):\n  end=time.time()+60\n  while True:\n    try:\n      \
         c=socket.create_connection(('{kernel}',{port}),timeout=5); break\n    \
         except OSError:\n      if time.time()>end: raise\n      time.sleep(0.2)\n  \
         c.settimeout(30); time.sleep(2.5); got=0; t0=time.time()\n  \
         while True:\n    d=c.recv(1<<20)\n    if not d: break\n    got+=len(d)\n  \
         took.append(time.time()-t0)\n  assert got=={n}, got\n  c.close()\n\
         print('OK', ' '.join('%.3f' % t for t in took), flush=True)\n"
    );
    let client = common::spawn_under_shim(&tap, &cfg, "/usr/bin/python3", &["-c", &client_py]);
    let up = tap.configure_host(Duration::from_secs(60));
    let o = output(client, Duration::from_secs(120), "python client");
    let _ = server.kill();
    let _ = server.wait();
    drop(topo);
    println!("client:\n{}{}", o.out, o.err);
    up.expect("tap up (did the client start luna?)");
    assert!(o.ok, "client failed");
    let took: Vec<f64> = o
        .out
        .lines()
        .find_map(|l| l.strip_prefix("OK "))
        .expect("OK line")
        .split(' ')
        .map(|t| t.parse().expect("seconds"))
        .collect();
    assert_eq!(took.len(), rounds);
    for t in &took {
        assert!(
            *t < 0.3,
            "a read of 3 MiB waited for the poll thread's sleep: {took:?} s"
        );
    }
}
