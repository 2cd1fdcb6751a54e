//! The DPDK side of each topology, checked with a real DPDK application (dpdk-testpmd from
//! Debian's dpdk-dev): the testbed's EAL arguments must start DPDK, and the kernel host
//! must reach the DPDK port. Run as root with hugepages (`make setup`).

mod common;

use std::time::Duration;

use common::{assert_nothing_left, prefix, Testpmd};
use testbed::{Impairment, Kind, Topology};

const GAP: Duration = Duration::from_millis(200);
const WAIT: Duration = Duration::from_secs(1);
const START: Duration = Duration::from_secs(30);

#[test]
fn tap_kernel_host_pings_dpdk_through_net_tap() {
    let p = prefix("d1");
    {
        let mut t = Topology::up(Kind::Tap, &p).unwrap();
        let tap = t.tap().unwrap().clone();
        let mut pmd = Testpmd::spawn(&tap.dpdk, "icmpecho", "d1");
        tap.configure_host(START).unwrap();
        pmd.wait_for("Port 0: 02:00:00:00:00:02", START);
        // testpmd's icmpecho answers ARP and echo requests: the whole path works.
        let s = tap.host.ping(tap.dpdk.ip, 3, GAP, WAIT).unwrap();
        assert!(s.received >= 2, "{s:?}\n{}", pmd.output());
        // Impairments work on the tap's kernel side too.
        t.set_impairment(
            "tap",
            &Impairment {
                delay: Duration::from_millis(30),
                ..Default::default()
            },
        )
        .unwrap();
        let s = tap.host.ping(tap.dpdk.ip, 3, GAP, WAIT).unwrap();
        assert_eq!(s.received, 3, "{s:?}");
        assert!(s.rtt_min.unwrap() >= Duration::from_millis(25), "{s:?}");
        drop(pmd);
    }
    assert_nothing_left(&p);
}

#[test]
fn afpacket_kernel_host_pings_dpdk_through_net_af_packet() {
    let p = prefix("d2");
    {
        let t = Topology::up(Kind::AfPacket, &p).unwrap();
        let a = t.afpacket().unwrap().clone();
        let mut pmd = Testpmd::spawn(&a.dpdk, "icmpecho", "d2");
        pmd.wait_for("Port 0: 02:00:00:00:01:02", START);
        let s = a.host.ping(a.dpdk.ip, 3, GAP, WAIT).unwrap();
        assert!(s.received >= 2, "{s:?}\n{}", pmd.output());
    }
    assert_nothing_left(&p);
}

fn max_counter(log: &str, key: &str) -> u64 {
    log.lines()
        .filter_map(|l| l.split(key).nth(1))
        .filter_map(|r| r.split_whitespace().next()?.parse().ok())
        .max()
        .unwrap_or(0)
}

#[test]
fn memif_server_receives_what_the_client_sends() {
    let p = prefix("d3");
    {
        let t = Topology::up(Kind::Memif, &p).unwrap();
        let m = t.memif().unwrap().clone();
        let mut server = Testpmd::spawn(&m.server, "rxonly", "d3s");
        server.wait_for("Port 0: 02:00:00:00:03:01", START);
        let mut client = Testpmd::spawn(&m.client, "txonly", "d3c");
        client.wait_for("Port 0: 02:00:00:00:03:02", START);
        // Let the stats period (1 s) report traffic at least once.
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while max_counter(&server.output(), "RX-packets:") == 0
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(200));
        }
        let c = client.stop();
        let s = server.stop();
        let rx = max_counter(&s, "RX-packets:");
        assert!(
            rx > 0,
            "server received nothing over memif\nserver:\n{s}\nclient:\n{c}"
        );
        assert!(max_counter(&c, "TX-packets:") > 0, "{c}");
    }
    assert_nothing_left(&p);
}
