//! Reader-side cost per poll iteration and per packet (criterion):
//! `cargo bench -p netlink-sync --bench lookup`.

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{criterion_group, criterion_main, Criterion};
use netlink_packet_route::neighbour::NeighbourState;
use netlink_packet_route::RouteNetlinkMessage as M;
use netlink_sync::mirror::craft::{address, emit, neighbour, route};
use netlink_sync::{Mirror, Publisher, Snapshot};

/// 1 address, 1 connected /16, 100 /24 routes via gateways, a default route, 1,000 neighbours.
fn tables() -> Mirror {
    let mut m = Mirror::new(1);
    m.apply_datagram(&emit(
        M::NewAddress(address(1, Ipv4Addr::new(198, 18, 0, 1), 16)),
        0,
        0,
    ));
    m.apply_datagram(&emit(
        M::NewRoute(route(1, Ipv4Addr::new(198, 18, 0, 0), 16, None, 0)),
        0,
        0,
    ));
    m.apply_datagram(&emit(
        M::NewRoute(route(
            1,
            Ipv4Addr::UNSPECIFIED,
            0,
            Some(Ipv4Addr::new(198, 18, 0, 254)),
            0,
        )),
        0,
        0,
    ));
    for i in 0..100u8 {
        let gw = Ipv4Addr::new(198, 18, 1, i);
        m.apply_datagram(&emit(
            M::NewRoute(route(1, Ipv4Addr::new(198, 19, i, 0), 24, Some(gw), 0)),
            0,
            0,
        ));
    }
    for i in 0..1000u32 {
        let ip = Ipv4Addr::new(198, 18, (i / 250) as u8 + 1, (i % 250) as u8);
        let mac = [2, 0, 0, 0, (i >> 8) as u8, i as u8];
        m.apply_datagram(&emit(
            M::NewNeighbour(neighbour(1, ip, Some(mac), NeighbourState::Reachable)),
            0,
            0,
        ));
    }
    m
}

fn bench(c: &mut Criterion) {
    let m = tables();
    let publisher = Publisher::new(Snapshot::empty(1));
    publisher.publish(m.snapshot(1));
    let mut reader = publisher.reader();
    c.bench_function("reader_refresh_unchanged", |b| {
        b.iter(|| black_box(reader.refresh()))
    });
    let dsts: Vec<Ipv4Addr> = (0..64u8).map(|i| Ipv4Addr::new(198, 19, i, 7)).collect();
    c.bench_function("next_hop_64_dsts", |b| {
        b.iter(|| {
            for d in &dsts {
                black_box(reader.snapshot().next_hop(*d));
            }
        })
    });
    c.bench_function("snapshot_build_1100_entries", |b| {
        b.iter(|| black_box(m.snapshot(2)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
