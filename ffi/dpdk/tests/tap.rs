//! A frame sent from DPDK through net_tap gets an answer from the kernel:
//! inside namespace `ldp-tap` the kernel side of `ldptap0` is 198.18.0.1/24,
//! DPDK is 198.18.0.2; the helper ARPs for the kernel and pings it.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

const NS: &str = "ldp-tap";

/// Creates the namespace and deletes it on drop, also when the test fails.
/// Kept small on purpose: the testbed crate's Topology API can replace it.
struct Netns(&'static str);

impl Netns {
    fn new(name: &'static str) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", name]).status();
        let st = Command::new("ip")
            .args(["netns", "add", name])
            .status()
            .expect("run ip");
        assert!(st.success(), "ip netns add {name} failed");
        let st = Command::new("ip")
            .args(["-n", name, "link", "set", "lo", "up"])
            .status()
            .expect("run ip");
        assert!(st.success());
        Netns(name)
    }
}

impl Netns {
    /// The scenario binary run inside this namespace with `args`, then `--` and the EAL
    /// arguments `eal`.
    fn scenario(&self, args: &[&str], eal: &[String]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.0, BIN])
            .args(args)
            .arg("--")
            .args(eal);
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", self.0]).status();
    }
}

#[test]
fn kernel_answers_arp_and_ping_through_net_tap() {
    let ns = Netns::new(NS);
    let mut eal = eal_base("tap");
    eal.push("--vdev=net_tap0,iface=ldptap0".into());
    let _g = RunDirGuard(prefix("tap"));
    let cmd = ns.scenario(
        &[
            "tap-ping",
            "--name",
            "net_tap0",
            "--iface",
            "ldptap0",
            "--local",
            "198.18.0.2",
            "--peer",
            "198.18.0.1",
            "--kernel-addr",
            "198.18.0.1/24",
            "--timeout-ms",
            "20000",
        ],
        &eal,
    );
    let ok = run(cmd, Duration::from_secs(60)).ok();
    assert!(ok.contains("ARP: 198.18.0.1 is at"), "{ok}");
    assert!(
        ok.contains("ICMP echo reply from 198.18.0.1 verified"),
        "{ok}"
    );
}

/// net_tap implements rte_flow through kernel TC; whether the kernel accepts
/// the rule depends on its modules (here sch_multiq is missing). Either the
/// rule is created and destroyed, or a clean `Flow` error comes back.
#[test]
fn flow_create_on_tap_succeeds_or_reports_cleanly() {
    let ns = Netns::new("ldp-tapflow");
    let mut eal = eal_base("tapflow");
    eal.push("--vdev=net_tap0,iface=ldptap1".into());
    let _g = RunDirGuard(prefix("tapflow"));
    let cmd = ns.scenario(&["flow-create", "--name", "net_tap0"], &eal);
    let out = run(cmd, Duration::from_secs(60));
    if out.code == Some(0) {
        assert!(out.ok().contains("flow created and destroyed"), "{out:?}");
    } else {
        let e = out.error("Flow");
        assert!(e.contains("flow on port net_tap0 failed"), "{e}");
    }
}

/// net_tap's receive signals go to the thread r2c's core runs on also for a vdev without
/// `iface=` (the kernel names it `dtap0`, ...) or with a pattern: the interface is the
/// one the port's `if_index` names (`tapsignal::port_iface`). With `iface=` alone, such a
/// port's signals stayed process-wide and ended the application's `epoll_wait`,
/// `nanosleep` and a lingering `close` with `EINTR` (the LD_PRELOAD shim).
#[test]
fn signals_of_a_tap_without_iface_go_to_the_polling_thread() {
    for (tag, vdev) in [
        ("tapsig", "--vdev=net_tap0"),
        ("tapsigp", "--vdev=net_tap0,iface=ldpsig%d"),
    ] {
        let ns = Netns::new(if tag == "tapsig" {
            "ldp-tapsig"
        } else {
            "ldp-tapsigp"
        });
        let mut eal = eal_base(tag);
        eal.push(vdev.into());
        let _g = RunDirGuard(prefix(tag));
        let cmd = ns.scenario(&["tap-signal", "--name", "net_tap0"], &eal);
        let ok = run(cmd, Duration::from_secs(60)).ok();
        let n: usize = ok
            .split("redirected=")
            .nth(1)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{vdev}: {ok}"));
        assert!(n > 0, "{vdev}: {ok}");
    }
}

/// net_tap after its receive pool ran dry: frames the kernel queued while no mbuf was free
/// are read once `tapsignal::kick` raises the tap's receive signal, without another frame
/// arriving (DPDK 22.11's `rx_burst` reads a queue only after a signal, and marks it seen
/// when it runs out of mbufs; r2c kicks a tap whose `rx_nombuf` moved).
#[test]
fn a_kick_makes_net_tap_read_what_queued_while_its_pool_was_empty() {
    let ns = Netns::new("ldp-tapkick");
    let mut eal = eal_base("tapkick");
    eal.push("--vdev=net_tap0,iface=ldpkick0".into());
    let _g = RunDirGuard(prefix("tapkick"));
    let sent = 20u64;
    let cmd = ns.scenario(
        &[
            "tap-kick",
            "--name",
            "net_tap0",
            "--iface",
            "ldpkick0",
            "--local",
            "198.18.0.2",
            "--kernel-addr",
            "198.18.0.1/24",
            "--count",
            &sent.to_string(),
        ],
        &eal,
    );
    let ok = run(cmd, Duration::from_secs(60)).ok();
    eprintln!("{ok}");
    let field = |k: &str| -> u64 {
        ok.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {ok}"))
    };
    assert!(field("held") > 0, "{ok}");
    assert_eq!(
        field("dry"),
        0,
        "nothing can be received without mbufs: {ok}"
    );
    assert!(field("nombuf") >= 1, "the empty pool was hit: {ok}");
    assert!(
        field("after") >= 1,
        "the kick read the queued datagrams: {ok}"
    );
    // Every datagram was received or counted as dropped for want of an mbuf.
    assert_eq!(
        field("before") + field("after") + field("nombuf"),
        sent,
        "{ok}"
    );
}
