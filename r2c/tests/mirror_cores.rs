//! The kernel's tables through r2c's cores (issue 11): netlink-sync's syncer
//! ([`MirrorThread`]) follows `nl0` of a private namespace pair (netlink-sync's `TestNet`),
//! and every core of a runtime — each on an [`ExceptionDevice`] over in-memory ports —
//! takes the changes into its stack and publishes the mirror version its stack reflects
//! (`exc_table_version`, through its stats seqlock). Needs root (namespaces); no DPDK.
//!
//! * `every_change_reaches_every_cores_stack`: 40 `ip route add/del` + `ip neigh
//!   replace/del` changes, each visible on every core (the reduced form of the benchmark);
//! * `netlink_overrun_resyncs_and_shows_in_the_cores_stats`: a tiny `SO_RCVBUF` and a
//!   burst of 300 `ip neigh replace`: `ENOBUFS`, a re-dump, and every core's counters say
//!   so — and every entry reaches every core;
//! * `kernel_addresses_are_applied_on_every_core`: `ip addr add/del` of a second address
//!   on `nl0`: every core's stack takes TCP for it while the kernel has it (a SYN to it
//!   gets the stack's RST out of that core's port), and not before or after;
//! * `nl_latency_r2c` (ignored, the benchmark): 1,000 changes (`NL_CHANGES`), p50/p99/max
//!   of change → visible in every core's stack; `make nl-latency-r2c`.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use bifurcation::{KernelPorts, TrafficConfig};
use luna_stack::stack::StackConfig;
use luna_stack::wire::{EthernetAddress, Ipv4Cidr};
use netlink_sync::netns::{TestNet, HOST_ADDR, HOST_IF};
use netlink_sync::{Reader, Snapshot, SyncConfig};
use r2c::device::mem::{MemConfig, MemDevice, MemPair};
use r2c::exception::{ExceptionDevice, MirrorThread};
use r2c::{CoreOptions, CoreSetup, IdleStrategy, InlineApp, Runtime};

/// A change not in every core's stack within this long is counted lost.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(1);

struct Idle;
impl InlineApp for Idle {}

/// The runtime, the mirror thread, and the ports' other ends (kept alive).
struct Rig {
    rt: Runtime,
    mirror: MirrorThread,
    /// Per core: the wire end of its port, then the kernel end of its exception port.
    ends: Vec<MemDevice>,
}

fn model() -> bifurcation::TrafficModel {
    let c = TrafficConfig {
        listen_tcp: vec![7700],
        apps: vec![bifurcation::model::AppConfig {
            name: "t".into(),
            ports: Default::default(),
            threads: Some(1),
            queues: None,
        }],
        ..TrafficConfig::default()
    };
    c.validate(&KernelPorts::parse("32768 60999", "").unwrap())
        .unwrap()
}

/// `cores` cores, each mirroring `nl0` of `net`'s host namespace.
fn rig(net: &TestNet, cores: usize, sync: SyncConfig) -> Rig {
    let (mirror, mirrorings) = net
        .in_host(|| {
            let m = MirrorThread::start_with(HOST_IF, &sync).expect("mirror nl0");
            let per_core: Vec<_> = (0..cores).map(|_| m.for_core().expect("nudger")).collect();
            (m, per_core)
        })
        .expect("host namespace");
    let mac = EthernetAddress([2, 0, 0, 0, 0, 1]);
    let cfg = MemConfig {
        mac_a: mac,
        ..Default::default()
    };
    let mut ends = Vec::new();
    let mut setups = Vec::new();
    for (i, m) in mirrorings.into_iter().enumerate() {
        let (mut a, b) = MemPair::build(&cfg).unwrap();
        let (mut k, kb) = MemPair::build(&cfg).unwrap();
        ends.extend(b);
        ends.extend(kb);
        let dev = ExceptionDevice::new(a.remove(0), k.remove(0), model(), 64).with_mirror(m);
        let mut sc = StackConfig::new(mac, Ipv4Cidr::new(HOST_ADDR, 24).unwrap());
        sc.answer_arp = false;
        setups.push(CoreSetup::new(i, vec![dev], sc));
    }
    let opts = CoreOptions {
        idle: IdleStrategy::Yield,
        pin: false,
        stats_interval: 8,
        ..CoreOptions::default()
    };
    let rt = Runtime::spawn_inline(setups, opts, |_| Idle).expect("runtime");
    Rig { rt, mirror, ends }
}

// The cycle of changes is nl-latency's own (neighbour replace, route add, route del,
// neighbour del), so both benchmarks measure the same transitions.
use netlink_sync::latency::{change, Check};

/// What a run of [`measure`] saw.
struct Measured {
    /// Change → in every core's stack, sorted.
    samples: Vec<Duration>,
    lost: usize,
}

fn quantile(s: &[Duration], q: f64) -> Duration {
    if s.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

/// Waits until `f` holds for the mirror's snapshot; returns the version it held at.
fn visible_at(reader: &mut Reader, f: &Check, until: Instant) -> Option<u64> {
    loop {
        reader.refresh();
        if f(reader.snapshot()) {
            return Some(reader.snapshot().version());
        }
        if Instant::now() > until {
            return None;
        }
        std::thread::yield_now();
    }
}

/// Waits until every core's stack reflects mirror version `v`.
fn all_cores_at(rt: &Runtime, v: u64, until: Instant) -> bool {
    loop {
        if rt.stats().iter().all(|s| s.exc_table_version >= v) {
            return true;
        }
        if Instant::now() > until {
            return false;
        }
        std::thread::yield_now();
    }
}

/// `changes` changes, one at a time, through `ip -batch -` in the host namespace; the
/// latency of one runs from just before its line is written until every core's published
/// `exc_table_version` reaches the first mirror version that holds it.
fn measure(net: &TestNet, rig: &Rig, changes: usize) -> Measured {
    use std::io::Write;
    let mut reader = rig.mirror.reader();
    let mut child = std::process::Command::new("ip")
        .args(["-n", &net.host, "-force", "-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("ip -batch");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut samples = Vec::with_capacity(changes);
    let mut lost = 0;
    for i in 0..changes {
        let (cmd, check) = change(i);
        let t0 = Instant::now();
        stdin.write_all(cmd.as_bytes()).expect("write");
        stdin.flush().expect("flush");
        let until = t0 + CHANGE_TIMEOUT;
        let ok =
            visible_at(&mut reader, &check, until).is_some_and(|v| all_cores_at(&rig.rt, v, until));
        if ok {
            samples.push(t0.elapsed());
        } else {
            lost += 1;
        }
    }
    drop(stdin);
    let _ = child.wait();
    samples.sort();
    Measured { samples, lost }
}

fn finish(rig: Rig) -> Vec<r2c::CoreStats> {
    let Rig { rt, mirror, ends } = rig;
    drop(ends);
    let last = rt.stats();
    rt.stop();
    rt.join().expect("runtime");
    let _ = mirror.stop();
    last
}

#[test]
fn every_change_reaches_every_cores_stack() {
    let net = TestNet::new().expect("test namespaces (root)");
    let rig = rig(&net, 2, SyncConfig::default());
    let n = 40;
    let m = measure(&net, &rig, n);
    let stats = finish(rig);
    assert_eq!(m.lost, 0, "changes not in every core within 1 s");
    assert_eq!(m.samples.len(), n);
    for s in &stats {
        // Every route add and del reached the stack (each waited for before the next),
        // plus the connected route of 198.18.0.0/24 that replaced the configured table.
        assert_eq!(s.exc_routes_added, (n / 4) as u64 + 1, "{s:?}");
        assert_eq!(s.exc_routes_removed, (n / 4) as u64, "{s:?}");
        assert!(s.exc_neighbours_added >= (n / 4) as u64, "{s:?}");
        assert!(s.exc_neighbours_removed >= (n / 4) as u64, "{s:?}");
        assert_eq!(s.exc_addresses_added, 1, "198.18.0.1/24: {s:?}");
        assert_eq!(s.exc_route_table_full, 0, "{s:?}");
        assert_eq!(s.exc_address_missing, 0, "{s:?}");
        assert_eq!(s.exc_addresses, 1, "the primary only: {s:?}");
        assert_eq!(s.exc_address_refused, 0, "{s:?}");
    }
}

#[test]
fn netlink_overrun_resyncs_and_shows_in_the_cores_stats() {
    let net = TestNet::new().expect("test namespaces (root)");
    let sync = SyncConfig {
        rcvbuf: Some(1024),
        ..SyncConfig::default()
    };
    let rig = rig(&net, 2, sync);
    let mut reader = rig.mirror.reader();
    // Bursts of 300 replacements until the socket overran (at most 5 bursts): the syncer
    // thread reads all the time, so one burst may fit on a quiet machine.
    let mut bursts = 0;
    let mut overran = false;
    while bursts < 5 && !overran {
        let mut cmds = String::new();
        for j in 0..300u32 {
            cmds += &format!(
                "neigh replace 198.18.{}.{} lladdr 02:00:00:{:02x}:{:02x}:{:02x} dev {HOST_IF} nud permanent\n",
                j / 250,
                1 + j % 250,
                bursts,
                j >> 8,
                j & 0xff
            );
        }
        net.host_batch(&cmds).expect("ip -batch");
        bursts += 1;
        // Generous: the re-dump of 300 entries through a tiny buffer is slow on a
        // loaded machine (one run under load did not finish within 5 s).
        let until = Instant::now() + Duration::from_secs(20);
        let want = bursts as u8 - 1;
        // The last entry of the burst visible in the mirror: the syncer caught up.
        let all = Box::new(move |s: &Snapshot| {
            (0..300u32).all(|j| {
                let ip = Ipv4Addr::new(198, 18, (j / 250) as u8, (1 + j % 250) as u8);
                s.neighbour(ip)
                    .is_some_and(|n| n.mac.0 == [2, 0, 0, want, (j >> 8) as u8, j as u8])
            })
        }) as Check;
        let Some(v) = visible_at(&mut reader, &all, until) else {
            let snap = reader.snapshot();
            // What the syncer itself saw (its published counters stop while a re-dump is
            // in progress), and the kernel's view of its socket (Rmem, Dump, Drops).
            let trace = rig.mirror.trace();
            let kernel = net
                .in_host(|| netlink_sync::kernel_socket_line(trace.port_id))
                .ok()
                .flatten();
            panic!(
                "not every entry of burst {bursts} in the mirror after 20 s: {} neighbours, version {}, {:?}, mirror thread ended: {}\n{trace}\nkernel: {kernel:?}",
                snap.neighbours().count(),
                snap.version(),
                snap.counters(),
                rig.mirror.is_finished()
            );
        };
        assert!(
            all_cores_at(&rig.rt, v, until),
            "every core reflects version {v}"
        );
        overran = rig.rt.stats().iter().all(|s| s.exc_sync_overruns > 0);
    }
    let stats = finish(rig);
    println!("bursts={bursts} stats: {:?}", stats[0]);
    assert!(overran, "no ENOBUFS in {bursts} bursts of 300 changes");
    for s in &stats {
        assert!(s.exc_sync_overruns >= 1, "{s:?}");
        assert!(s.exc_sync_resyncs >= 1, "overrun without a re-dump: {s:?}");
        // Every entry of every burst reached this core's stack (the re-dump found the
        // ones the overrun lost), counted once per new MAC.
        assert!(s.exc_neighbours_added >= 300, "{s:?}");
        assert_eq!(s.exc_neighbour_table_full, 0, "{s:?}");
    }
}

/// Internet checksum (RFC 1071) of `data`, starting from `sum`.
fn csum(mut sum: u32, data: &[u8]) -> u16 {
    for c in data.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A TCP SYN from 198.18.5.9:40000 (MAC 02:..:99) to `dst`:7700, luna's listening port.
fn syn_to(dst: Ipv4Addr) -> Vec<u8> {
    let src = Ipv4Addr::new(198, 18, 5, 9);
    let mut f = vec![0u8; 54];
    f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0x99]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&40u16.to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let c = csum(0, &f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    let tcp = &mut f[34..54];
    tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
    tcp[2..4].copy_from_slice(&7700u16.to_be_bytes());
    tcp[4..8].copy_from_slice(&1234u32.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = 0x02; // SYN
    tcp[14..16].copy_from_slice(&8192u16.to_be_bytes());
    let mut pseudo = 0u32;
    for w in [&src.octets()[..], &dst.octets()[..]] {
        pseudo += u32::from(u16::from_be_bytes([w[0], w[1]]))
            + u32::from(u16::from_be_bytes([w[2], w[3]]));
    }
    pseudo += 6 + 20;
    let c = csum(pseudo, &f[34..54]);
    f[50..52].copy_from_slice(&c.to_be_bytes());
    f
}

/// Sends a SYN to `dst` into every core's port; returns, per core, whether a RST from
/// `dst` came back within `wait`.
fn rst_from_every_core(rig: &mut Rig, dst: Ipv4Addr, wait: Duration) -> Vec<bool> {
    use r2c::device::Device;
    let cores = rig.ends.len() / 2;
    for i in 0..cores {
        assert!(rig.ends[2 * i].inject(zbuf::Zbuf::copy_from_slice(&syn_to(dst))));
    }
    let until = Instant::now() + wait;
    let mut got = vec![false; cores];
    while Instant::now() < until && !got.iter().all(|g| *g) {
        for (i, g) in got.iter_mut().enumerate() {
            let mut out = Vec::new();
            rig.ends[2 * i].rx_burst(&mut out, 16);
            *g |= out.iter().any(|f| {
                f.len() >= 54
                    && f[12..14] == [0x08, 0x00]
                    && f[23] == 6
                    && f[26..30] == dst.octets()
                    && f[47] & 0x04 != 0
            });
        }
        std::thread::yield_now();
    }
    got
}

/// Waits until every core publishes `n` local addresses.
fn all_cores_have_addresses(rt: &Runtime, n: u64, until: Instant) -> bool {
    loop {
        if rt.stats().iter().all(|s| s.exc_addresses == n) {
            return true;
        }
        if Instant::now() > until {
            return false;
        }
        std::thread::yield_now();
    }
}

#[test]
fn kernel_addresses_are_applied_on_every_core() {
    let net = TestNet::new().expect("test namespaces (root)");
    let mut rig = rig(&net, 2, SyncConfig::default());
    let extra = Ipv4Addr::new(198, 18, 5, 1);
    let t = |s| Instant::now() + Duration::from_secs(s);
    assert!(
        all_cores_have_addresses(&rig.rt, 1, t(5)),
        "{:?}",
        rig.rt.stats()
    );
    // Not ours yet: dropped as not for us, no RST.
    let got = rst_from_every_core(&mut rig, extra, Duration::from_millis(300));
    assert_eq!(
        got,
        [false, false],
        "a RST from an address luna does not have"
    );
    net.host_batch(&format!(
        "addr add {extra}/24 dev {HOST_IF}
"
    ))
    .expect("ip addr add");
    assert!(
        all_cores_have_addresses(&rig.rt, 2, t(5)),
        "{:?}",
        rig.rt.stats()
    );
    let got = rst_from_every_core(&mut rig, extra, Duration::from_secs(5));
    assert_eq!(got, [true, true], "every core's stack answers for {extra}");
    // The primary's own address goes on answering too.
    let got = rst_from_every_core(&mut rig, HOST_ADDR, Duration::from_secs(5));
    assert_eq!(got, [true, true]);
    net.host_batch(&format!(
        "addr del {extra}/24 dev {HOST_IF}
"
    ))
    .expect("ip addr del");
    assert!(
        all_cores_have_addresses(&rig.rt, 1, t(5)),
        "{:?}",
        rig.rt.stats()
    );
    let got = rst_from_every_core(&mut rig, extra, Duration::from_millis(300));
    assert_eq!(got, [false, false], "{extra} removed from every core");
    let stats = finish(rig);
    for s in &stats {
        assert_eq!(s.exc_addresses_added, 2, "primary and {extra}: {s:?}");
        assert_eq!(s.exc_addresses_removed, 1, "{s:?}");
        assert_eq!(s.exc_address_refused, 0, "{s:?}");
        assert_eq!(s.exc_address_missing, 0, "{s:?}");
        // No connection ever used the address (SYNs to a port no one listens on).
        assert_eq!(s.exc_address_aborts, 0, "{s:?}");
    }
}

/// The benchmark: `NL_CHANGES` (1,000) changes, `NL_CORES` (2) cores. Prints
/// `latency_ms p50 .. p99 .. max ..` and `visible .. lost ..`; the numbers are for a
/// quiet machine (`make nl-latency-r2c`).
#[test]
#[ignore = "benchmark (root): make nl-latency-r2c"]
fn nl_latency_r2c() {
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (changes, cores) = (env("NL_CHANGES", 1000), env("NL_CORES", 2));
    let net = TestNet::new().expect("test namespaces (root)");
    let rig = rig(&net, cores, SyncConfig::default());
    let m = measure(&net, &rig, changes);
    let stats = finish(rig);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "changes {changes} cores {cores} visible {} lost {}",
        m.samples.len(),
        m.lost
    );
    println!(
        "latency_ms p50 {:.3} p90 {:.3} p99 {:.3} max {:.3}",
        ms(quantile(&m.samples, 0.5)),
        ms(quantile(&m.samples, 0.9)),
        ms(quantile(&m.samples, 0.99)),
        ms(m.samples.last().copied().unwrap_or_default())
    );
    let s = &stats[0];
    println!(
        "core0 routes_added {} routes_removed {} neighbours_added {} neighbours_removed {} resyncs {} overruns {} malformed {}",
        s.exc_routes_added,
        s.exc_routes_removed,
        s.exc_neighbours_added,
        s.exc_neighbours_removed,
        s.exc_sync_resyncs,
        s.exc_sync_overruns,
        s.exc_sync_malformed
    );
    assert_eq!(m.lost, 0, "changes not in every core's stack within 1 s");
}
