//! Shared test fixtures: two runtimes joined by a MemPair.
#![allow(dead_code)]

use bifurcation::{AppSpec, PartitionPlan, PortRange, Share};
use core::net::{Ipv4Addr, SocketAddrV4};
use luna_stack::stack::StackConfig;
use luna_stack::time::Duration;
use luna_stack::wire::{EthernetAddress, Ipv4Cidr};
use r2c::device::mem::{MemConfig, MemDevice, MemPair};
use r2c::{CoreOptions, CoreSetup, IdleStrategy};
use std::time::Instant as StdInstant;

pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
pub const SERVER_MAC: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x0a]);
pub const CLIENT_MAC: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x0b]);

pub fn server_addr(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(SERVER_IP, port)
}

/// Options for tests: yield when idle (the CI machine has 2 CPUs), no pinning,
/// fixed RNG seed, short shutdown grace.
pub fn opts() -> CoreOptions {
    CoreOptions {
        idle: IdleStrategy::Yield,
        pin: false,
        stats_interval: 64,
        rng_seed: Some([42; 32]),
        shutdown_grace: Duration::from_secs(2),
        ..CoreOptions::default()
    }
}

pub fn stack_cfg(mac: EthernetAddress, ip: Ipv4Addr) -> StackConfig {
    let mut c = StackConfig::new(mac, Ipv4Cidr::new(ip, 24).unwrap());
    // Loss tests need quick recovery; datacenter-style RTO floor.
    c.tcp.rtt.min_rto = Duration::from_millis(5);
    c.tcp.rtt.initial_rto = Duration::from_millis(50);
    c.tcp.time_wait = Duration::from_millis(100);
    c
}

/// Core setups for one side: one queue per core, static neighbour for the peer, each core
/// its own partition of the reserved range.
pub fn setups(
    devices: Vec<MemDevice>,
    mac: EthernetAddress,
    ip: Ipv4Addr,
    peer: (Ipv4Addr, EthernetAddress),
) -> Vec<CoreSetup<MemDevice>> {
    let n = devices.len() as u16;
    let plan =
        PartitionPlan::build(PortRange::RESERVED, &[AppSpec::new("test", Share::Rest, n)]).unwrap();
    devices
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let mut s = CoreSetup::new(i, vec![d], stack_cfg(mac, ip));
            s.neighbours.push(peer);
            s.ports = plan.ports_of("test", i as u16);
            s
        })
        .collect()
}

/// (server setups, client setups) over a MemPair with `server_q`/`client_q` queues.
pub fn pair(
    server_q: u16,
    client_q: u16,
    tweak: impl FnOnce(&mut MemConfig),
) -> (Vec<CoreSetup<MemDevice>>, Vec<CoreSetup<MemDevice>>) {
    let mut cfg = MemConfig {
        queues_a: server_q,
        queues_b: client_q,
        mac_a: SERVER_MAC,
        mac_b: CLIENT_MAC,
        ..MemConfig::default()
    };
    tweak(&mut cfg);
    let (a, b) = MemPair::build(&cfg).unwrap();
    (
        setups(a, SERVER_MAC, SERVER_IP, (CLIENT_IP, CLIENT_MAC)),
        setups(b, CLIENT_MAC, CLIENT_IP, (SERVER_IP, SERVER_MAC)),
    )
}

/// Wait until `done()` or a generous deadline (a hang guard, not a timing assertion).
pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = StdInstant::now();
    while !done() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// A message that names its sender, so crossed wires show.
pub fn message(core: usize, idx: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ (core as u8).wrapping_mul(7) ^ (idx as u8))
        .collect()
}
