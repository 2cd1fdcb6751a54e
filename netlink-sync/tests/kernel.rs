//! The syncer against the real kernel, in a private network namespace (needs root).

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use luna_stack::tables::{NeighbourState, NextHop};
use netlink_sync::netns::{TestNet, HOST_ADDR, HOST_IF};
use netlink_sync::{Error, Interface, Lookup, Reader, Snapshot, SyncConfig, Syncer};

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x22];

/// Refreshes `r` until `pred` holds (at most 5 s).
fn wait_for(r: &mut Reader, what: &str, pred: impl Fn(&Snapshot) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        r.refresh();
        if pred(r.snapshot()) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

struct Running {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), Error>>>,
}

impl Running {
    fn start(syncer: Syncer) -> Running {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = Some(std::thread::spawn(move || syncer.run(&s)));
        Running { stop, thread }
    }

    fn join(mut self) -> Result<(), Error> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn open(net: &TestNet, config: SyncConfig) -> Syncer {
    net.in_host(|| Syncer::open(Interface::Name(HOST_IF.into()), &config))
        .unwrap()
        .unwrap()
}

#[test]
fn dump_sees_the_existing_state() {
    let net = TestNet::new().unwrap();
    net.host_ip(&["route", "add", "198.19.0.0/16", "via", "198.18.0.2"])
        .unwrap();
    net.host_ip(&[
        "neigh",
        "replace",
        "198.18.0.2",
        "lladdr",
        "02:00:00:00:00:22",
        "dev",
        HOST_IF,
        "nud",
        "permanent",
    ])
    .unwrap();
    let syncer = open(&net, SyncConfig::default());
    let r = syncer.reader();
    let s = r.snapshot();
    assert!(s.version() >= 1);
    assert!(s.is_local(HOST_ADDR));
    assert_eq!(s.addresses()[0].prefix_len, 24);
    let connected = s.routes().lookup(ip("198.18.0.9")).unwrap();
    assert_eq!(connected.next_hop, NextHop::Direct);
    assert_eq!(connected.source, HOST_ADDR);
    match s.next_hop(ip("198.19.4.4")) {
        Lookup::Resolved { next_hop, mac, .. } => {
            assert_eq!(next_hop, ip("198.18.0.2"));
            assert_eq!(mac.0, MAC);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        s.neighbour(ip("198.18.0.2")).unwrap().state,
        NeighbourState::Permanent
    );
    assert_eq!(s.counters().malformed, 0);
    assert_eq!(s.counters().resyncs, 0);
}

#[test]
fn follows_route_neighbour_and_address_changes() {
    let net = TestNet::new().unwrap();
    let syncer = open(&net, SyncConfig::default());
    let mut r = syncer.reader();
    let run = Running::start(syncer);

    net.host_ip(&["route", "add", "198.19.0.0/16", "via", "198.18.0.2"])
        .unwrap();
    wait_for(&mut r, "route add", |s| {
        s.routes()
            .lookup(ip("198.19.1.1"))
            .is_some_and(|r| r.next_hop == NextHop::Gateway(ip("198.18.0.2")))
    });
    assert!(matches!(
        r.snapshot().next_hop(ip("198.19.1.1")),
        Lookup::Unresolved { .. }
    ));

    net.host_ip(&[
        "neigh",
        "replace",
        "198.18.0.2",
        "lladdr",
        "02:00:00:00:00:22",
        "dev",
        HOST_IF,
        "nud",
        "reachable",
    ])
    .unwrap();
    wait_for(
        &mut r,
        "neigh replace",
        |s| matches!(s.next_hop(ip("198.19.1.1")), Lookup::Resolved { mac, .. } if mac.0 == MAC),
    );

    net.host_ip(&[
        "neigh",
        "replace",
        "198.18.0.2",
        "lladdr",
        "02:00:00:00:00:33",
        "dev",
        HOST_IF,
        "nud",
        "stale",
    ])
    .unwrap();
    wait_for(&mut r, "neigh replace (new MAC, stale)", |s| {
        s.neighbour(ip("198.18.0.2"))
            .is_some_and(|n| n.mac.0[5] == 0x33 && n.state == NeighbourState::Stale)
    });

    net.host_ip(&["neigh", "del", "198.18.0.2", "dev", HOST_IF])
        .unwrap();
    wait_for(&mut r, "neigh del", |s| {
        s.neighbour(ip("198.18.0.2")).is_none()
    });

    net.host_ip(&["route", "replace", "198.19.0.0/16", "via", "198.18.0.3"])
        .unwrap();
    wait_for(&mut r, "route replace", |s| {
        s.routes()
            .lookup(ip("198.19.1.1"))
            .is_some_and(|r| r.next_hop == NextHop::Gateway(ip("198.18.0.3")))
    });

    net.host_ip(&["route", "del", "198.19.0.0/16"]).unwrap();
    wait_for(&mut r, "route del", |s| {
        s.routes().lookup(ip("198.19.1.1")).is_none()
    });

    net.host_ip(&["addr", "add", "198.18.7.1/24", "dev", HOST_IF])
        .unwrap();
    wait_for(&mut r, "addr add", |s| s.is_local(ip("198.18.7.1")));
    net.host_ip(&["addr", "del", "198.18.7.1/24", "dev", HOST_IF])
        .unwrap();
    wait_for(&mut r, "addr del", |s| !s.is_local(ip("198.18.7.1")));

    let c = *r.snapshot().counters();
    assert_eq!(c.malformed, 0, "{c:?}");
    assert_eq!(c.resyncs, 0, "{c:?}");
    run.join().unwrap();
}

#[test]
fn interface_disappearing_is_a_clear_error() {
    let net = TestNet::new().unwrap();
    let syncer = open(&net, SyncConfig::default());
    let mut r = syncer.reader();
    let run = Running::start(syncer);
    net.host_ip(&["link", "del", HOST_IF]).unwrap();
    wait_for(&mut r, "interface gone", |s| s.interface_gone());
    assert_eq!(r.snapshot().next_hop(ip("198.18.0.2")), Lookup::NoRoute);
    match run.join() {
        Err(Error::InterfaceGone { .. }) => {}
        other => panic!("expected InterfaceGone, got {other:?}"),
    }
}

#[test]
fn missing_interface_is_a_clear_error() {
    let net = TestNet::new().unwrap();
    let res = net
        .in_host(|| Syncer::open(Interface::Name("nope0".into()), &SyncConfig::default()))
        .unwrap();
    assert!(matches!(res, Err(Error::NoSuchInterface(_))), "{res:?}");
    let res = net
        .in_host(|| Syncer::open(Interface::Index(999_999), &SyncConfig::default()))
        .unwrap();
    assert!(matches!(res, Err(Error::NoSuchInterface(_))), "{res:?}");
}

/// `ip -batch` lines adding `n` permanent neighbours 198.18.2.1.. with MACs 02:00:00:00:hi:lo.
fn neigh_burst(n: u32) -> String {
    let mut cmds = String::new();
    for i in 0..n {
        cmds.push_str(&format!(
            "neigh replace 198.18.{}.{} lladdr 02:00:00:00:{:02x}:{:02x} dev {HOST_IF} nud permanent\n",
            2 + i / 250,
            1 + i % 250,
            i / 256,
            i % 256
        ));
    }
    cmds
}

fn burst_addr(i: u32) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, (2 + i / 250) as u8, (1 + i % 250) as u8)
}

/// Subscribing before dumping: changes made while the syncer opens are all mirrored.
#[test]
fn changes_during_the_initial_dump_are_not_missed() {
    let net = TestNet::new().unwrap();
    let n = 400u32;
    let cmds = neigh_burst(n);
    let net = &net;
    std::thread::scope(|s| {
        let burst = s.spawn(|| net.host_batch(&cmds));
        let mut syncer = open(net, SyncConfig::default());
        burst.join().unwrap().unwrap();
        let mut r = syncer.reader();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            syncer.poll(Duration::from_millis(20)).unwrap();
            r.refresh();
            if r.snapshot().neighbours().count() == n as usize {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {n} neighbours mirrored",
                r.snapshot().neighbours().count()
            );
        }
        for i in 0..n {
            let e = r.snapshot().neighbour(burst_addr(i)).unwrap();
            assert_eq!(e.mac.0[4..], [(i / 256) as u8, (i % 256) as u8]);
        }
    });
}

#[test]
fn enobufs_overrun_resyncs_by_redumping() {
    let net = TestNet::new().unwrap();
    // The kernel doubles and floors this; any small value overruns on a burst.
    let mut syncer = open(
        &net,
        SyncConfig {
            rcvbuf: Some(1024),
            ..SyncConfig::default()
        },
    );
    let mut r = syncer.reader();
    let before = syncer.rcvbuf().unwrap();
    // A burst while nobody reads: the socket buffer overflows.
    let n = 300u32;
    let cmds = neigh_burst(n);
    // Addresses of 198.18.2.0/23 are off-link for nl0's /24; add the subnet first.
    net.host_ip(&["addr", "add", "198.18.2.1/23", "dev", HOST_IF])
        .unwrap();
    net.host_batch(&cmds).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        syncer.poll(Duration::from_millis(20)).unwrap();
        r.refresh();
        let s = r.snapshot();
        let c = *s.counters();
        if c.resyncs >= 1 && s.neighbours().count() >= n as usize {
            assert!(c.overruns >= 1, "{c:?}");
            assert!(c.rcvbuf_grown >= 1, "{c:?}");
            assert!(syncer.rcvbuf().unwrap() > before, "{c:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no resync: {c:?}, {} neighbours",
            s.neighbours().count()
        );
    }
    // The resynced mirror is the kernel's: every entry, with its MAC.
    let s = r.snapshot();
    for i in 0..n {
        let a = burst_addr(i);
        let e = s.neighbour(a).unwrap_or_else(|| panic!("{a} missing"));
        assert_eq!(e.mac.0, [2, 0, 0, 0, (i / 256) as u8, (i % 256) as u8]);
    }
}

#[test]
fn unresolved_next_hop_is_nudged_released_on_resolution_and_dropped_when_failed() {
    use netlink_sync::netns::PEER_ADDR;
    use netlink_sync::{Nudger, PendingConfig, PendingNextHops};

    let net = TestNet::new().unwrap();
    let peer_mac = net.peer_mac().unwrap();
    let syncer = open(&net, SyncConfig::default());
    let mut r = syncer.reader();
    let run = Running::start(syncer);
    let nudger = net.in_host(|| Nudger::new(Some(HOST_IF))).unwrap().unwrap();
    let mut pending = PendingNextHops::new(PendingConfig::default());
    let start = Instant::now();
    let now = || luna_stack::time::Instant::from_nanos(start.elapsed().as_nanos() as u64);

    let Lookup::Unresolved { next_hop, .. } = r.snapshot().next_hop(PEER_ADDR) else {
        panic!(
            "expected unresolved: {:?}",
            r.snapshot().next_hop(PEER_ADDR)
        );
    };
    assert_eq!(next_hop, PEER_ADDR);
    pending.enqueue(now(), next_hop, "first").unwrap();
    pending.enqueue(now(), next_hop, "second").unwrap();

    let mut sent = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while sent.len() < 2 {
        assert!(
            Instant::now() < deadline,
            "never resolved: {:?}",
            pending.counters()
        );
        if r.refresh() {
            pending.on_snapshot(r.snapshot(), |ip, mac, p| sent.push((ip, mac.0, p)));
        }
        while let Some(ip) = pending.poll_nudge(now()) {
            nudger.nudge(ip).unwrap();
        }
        pending.expire(now(), |ip, _| panic!("gave up on {ip}"));
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        sent,
        vec![
            (PEER_ADDR, peer_mac, "first"),
            (PEER_ADDR, peer_mac, "second")
        ]
    );
    assert!(pending.is_empty());
    assert!(pending.counters().nudges >= 1);

    // The kernel declares it failed: gone from the snapshot, so traffic queues again.
    net.host_ip(&[
        "neigh",
        "change",
        "198.18.0.2",
        "dev",
        HOST_IF,
        "nud",
        "failed",
    ])
    .unwrap();
    wait_for(&mut r, "neighbour failed", |s| {
        s.neighbour(PEER_ADDR).is_none()
    });
    assert!(matches!(
        r.snapshot().next_hop(PEER_ADDR),
        Lookup::Unresolved { .. }
    ));
    run.join().unwrap();
}

/// The benchmark's machinery, small: every change reaches every reader (no timing asserted).
#[test]
fn latency_run_sees_every_change_on_every_reader() {
    let report = netlink_sync::latency::run(40, 2).unwrap();
    assert_eq!(report.lost, 0, "{report:?}");
    assert_eq!(report.samples.len(), 40);
    assert!(report.quantile(0.99).is_some());
    assert_eq!(report.counters.malformed, 0);
}

/// The kernel flushes a downed interface's IPv4 routes without `RTM_DELROUTE`: the syncer
/// re-dumps on the link flap and drops them too.
#[test]
fn link_down_flushes_routes_silently_and_the_resync_drops_them() {
    let net = TestNet::new().unwrap();
    net.host_ip(&["route", "add", "198.19.0.0/16", "via", "198.18.0.2"])
        .unwrap();
    let syncer = open(&net, SyncConfig::default());
    let mut r = syncer.reader();
    let link = *r.snapshot().link().expect("link dumped");
    assert!(link.up && link.mac.is_some(), "{link:?}");
    assert!(r.snapshot().routes().lookup(ip("198.19.0.1")).is_some());
    let run = Running::start(syncer);
    net.host_ip(&["link", "set", HOST_IF, "down"]).unwrap();
    wait_for(&mut r, "route flushed by link down", |s| {
        s.routes().lookup(ip("198.19.0.1")).is_none() && s.link().is_some_and(|l| !l.up)
    });
    assert!(r.snapshot().counters().resyncs >= 1);
    net.host_ip(&["link", "set", HOST_IF, "up"]).unwrap();
    wait_for(&mut r, "link up, connected route back", |s| {
        s.link().is_some_and(|l| l.up) && s.routes().lookup(ip("198.18.0.9")).is_some()
    });
    run.join().unwrap();
}

/// A second interface on the same subnet gets a connected route under the same key as
/// ours (the kernel appends it); adding and then removing its address must leave our
/// connected route in the mirror, as it stays in the kernel.
#[test]
fn another_interface_on_our_subnet_leaves_our_connected_route() {
    let net = TestNet::new().unwrap();
    net.host_ip(&[
        "link", "add", "nlx0", "type", "veth", "peer", "name", "nlx1",
    ])
    .unwrap();
    for dev in ["nlx0", "nlx1"] {
        net.host_ip(&["link", "set", dev, "up"]).unwrap();
    }
    let syncer = open(&net, SyncConfig::default());
    let mut r = syncer.reader();
    assert!(r.snapshot().routes().lookup(ip("198.18.0.9")).is_some());
    let run = Running::start(syncer);
    net.host_ip(&["addr", "add", "198.18.0.5/24", "dev", "nlx0"])
        .unwrap();
    net.host_ip(&["addr", "del", "198.18.0.5/24", "dev", "nlx0"])
        .unwrap();
    // A marker on our interface: once it is mirrored, so is everything before it.
    net.host_ip(&["route", "add", "198.19.0.0/16", "via", "198.18.0.2"])
        .unwrap();
    wait_for(&mut r, "marker route", |s| {
        s.routes().lookup(ip("198.19.0.1")).is_some()
    });
    let s = r.snapshot();
    let connected = s.routes().lookup(ip("198.18.0.9"));
    assert_eq!(
        connected.map(|r| r.next_hop),
        Some(NextHop::Direct),
        "the kernel still has our connected route; the mirror lost it"
    );
    run.join().unwrap();
}
