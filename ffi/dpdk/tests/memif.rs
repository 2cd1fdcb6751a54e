//! Two DPDK processes (memif server + client) exchange 1,000,000 frames in
//! each direction, 64..9000 B (jumbo ones as multi-segment mbufs); every
//! byte is checked against a pattern derived from the sequence number and
//! the mempool in-use count must return to its starting value.

mod common;

use std::time::Duration;

use common::*;

const FRAMES: &str = "1000000";
/// Hard limit per process; the run takes a few seconds on the 2-core box.
const LIMIT: Duration = Duration::from_secs(180);

#[test]
fn memif_two_processes_exchange_a_million_frames_each_way() {
    let sock = format!("/tmp/ldp-memif-{}.sock", std::process::id());
    // 22.11's memif mishandles frames spread over several ring descriptors,
    // so its buffers are sized for the largest (9000 B) frame.
    let vdev =
        |role: &str| format!("--vdev=net_memif0,role={role},socket={sock},bsize=16384,rsize=10");
    let mut server_eal = eal_base("memif-srv");
    server_eal.extend([vdev("server"), "--lcores=0@(0,1)".into()]);
    let mut client_eal = eal_base("memif-cli");
    client_eal.extend([vdev("client"), "--lcores=0@(0,1)".into()]);
    let _g = (
        RunDirGuard(prefix("memif-srv")),
        RunDirGuard(prefix("memif-cli")),
    );

    let timeout_ms = (LIMIT.as_millis() - 10_000).to_string();
    let args = |role: &'static str| {
        [
            "memif",
            "--role",
            role,
            "--frames",
            FRAMES,
            "--timeout-ms",
            &timeout_ms,
        ]
        .map(str::to_owned)
    };
    let server = spawn(scenario(
        &args("server").each_ref().map(String::as_str),
        &server_eal,
    ));
    let client = spawn(scenario(
        &args("client").each_ref().map(String::as_str),
        &client_eal,
    ));
    let c = client.wait(LIMIT);
    let s = server.wait(LIMIT);
    let _ = std::fs::remove_file(&sock);
    for (out, role) in [(&s, "server"), (&c, "client")] {
        let ok = out.ok();
        assert!(ok.contains(&format!("{role}: sent 1000000 frames")), "{ok}");
        assert!(ok.contains("received 1000000 frames"), "{ok}");
        assert!(ok.contains("all bytes verified"), "{ok}");
        // Frames above 2048 B arrive as chains.
        let multi: u64 = ok
            .split(" multi-segment")
            .next()
            .and_then(|s| s.rsplit(", ").next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(multi > 100_000, "expected many multi-segment frames: {ok}");
    }
}
