//! An unmodified Debian `iperf3 -s` (select(2) and poll(2) over a control connection and
//! data connections) under `LD_PRELOAD=libluna-preload.so` on the tap topology, measured
//! by the stock `iperf3` client in the kernel namespace: upload, download (`-R`), several
//! streams (`-P 4`), and the server's own report of the bytes it moved.

mod common;

use common::{cannot_run, config, output, run, signal, spawn_under_shim};
use std::time::{Duration, Instant};
use testbed::{Kind, Prefix, Topology};

/// Most bytes a run can leave in buffers when iperf3 stops counting (the Linux sender's
/// or receiver's autotuned socket buffer, a few MiB, plus luna's and the shim's).
const IN_FLIGHT: u64 = 16 << 20;

/// The bytes the client's JSON report says were sent and received in one run.
fn bytes(json: &str) -> (u64, u64) {
    let v: serde_json::Value = serde_json::from_str(json).expect("iperf3 JSON");
    let sum = |k: &str| v["end"][k]["bytes"].as_u64().unwrap_or(0);
    (sum("sum_sent"), sum("sum_received"))
}

#[test]
fn iperf3_server_on_luna_moves_every_byte() {
    if cannot_run(&["/usr/bin/iperf3"]) {
        return;
    }
    let prefix = Prefix::new("lprip3").unwrap();
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let tap = topo.tap().expect("tap details").clone();
    let cfg = topo.state_dir().join("luna-preload-iperf3.toml");
    std::fs::write(&cfg, config(&tap)).expect("config");
    let ip = tap.dpdk.ip.to_string();
    let server = spawn_under_shim(
        &tap,
        &cfg,
        "/usr/bin/iperf3",
        // JSON (-J): a client's --get-server-output then carries the server's own
        // figures, its TCP_INFO readings among them.
        &["-s", "-J", "-B", &ip, "-p", "5201"],
    );
    let check = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tap.configure_host(Duration::from_secs(60)).expect("tap up");
        let cases: [&[&str]; 5] = [
            &["-t", "2"],
            &["-t", "2", "-R"],
            &["-t", "2", "-P", "4"],
            &["-n", "3M", "-l", "1000"],
            &["-t", "1", "-R", "-Z"],
        ];
        for (i, extra) in cases.iter().enumerate() {
            let end = Instant::now() + Duration::from_secs(60);
            let o = loop {
                let mut c = tap.host.command("iperf3");
                c.args(["-c", &ip, "-p", "5201", "-J"]).args(*extra);
                let o = run(c, Duration::from_secs(60), "iperf3 client");
                // The first run may meet a server not yet listening.
                if o.ok || i > 0 || Instant::now() > end {
                    break o;
                }
                std::thread::sleep(Duration::from_millis(300));
            };
            assert!(o.ok, "iperf3 {extra:?}: {}{}", o.out, o.err);
            let (sent, received) = bytes(&o.out);
            println!("iperf3 {extra:?}: sent {sent} received {received}");
            assert!(received > 0, "iperf3 {extra:?}: nothing received");
            // iperf3's receiver stops counting at the test's end: what was still in the
            // buffers then (the sender's kernel socket, luna's TCP and the shim's 1 MiB
            // queues, or the reverse) is sent but not received. More than that is lost.
            assert!(
                received <= sent && sent - received <= IN_FLIGHT,
                "iperf3 {extra:?}: sent {sent}, received {received}"
            );
        }
        // The server sends (-R) and reads its stream's TCP_INFO each interval: RTT and
        // congestion window are luna's connection's, not the never-connected kernel
        // placeholder's (RTT 0 before the shim answered TCP_INFO itself).
        let mut c = tap.host.command("iperf3");
        c.args([
            "-c",
            &ip,
            "-p",
            "5201",
            "-J",
            "-t",
            "1",
            "-R",
            "--get-server-output",
        ]);
        let o = run(c, Duration::from_secs(60), "iperf3 client");
        assert!(o.ok, "iperf3 -R --get-server-output: {}{}", o.out, o.err);
        let v: serde_json::Value = serde_json::from_str(&o.out).expect("iperf3 JSON");
        let sender = &v["server_output_json"]["end"]["streams"][0]["sender"];
        let field = |k: &str| sender[k].as_u64().unwrap_or(0);
        println!(
            "server's TCP_INFO: max_rtt {} us, mean_rtt {} us, max_snd_cwnd {} B",
            field("max_rtt"),
            field("mean_rtt"),
            field("max_snd_cwnd")
        );
        assert!(
            (1..1_000_000).contains(&field("max_rtt")) && field("mean_rtt") > 0,
            "the server's RTT from TCP_INFO: {sender}"
        );
        assert!(
            field("max_snd_cwnd") > 10 * 1448,
            "a window that grew: {sender}"
        );
    }));
    signal(&server, libc::SIGTERM);
    let o = output(server, Duration::from_secs(30), "iperf3 -s");
    println!("iperf3 -s:\n{}{}", o.out, o.err);
    drop(topo);
    if let Err(p) = check {
        std::panic::resume_unwind(p);
    }
    assert!(!o.err.contains("luna-preload:"), "shim errors: {}", o.err);
}
