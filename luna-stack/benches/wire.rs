//! Micro-benchmarks of the wire layer: a full Ethernet/IPv4/TCP frame with timestamps
//! parsed and emitted, and the Internet checksum over common sizes.
//!
//! Run: `cargo bench -p luna-stack --bench wire`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use luna_stack::tcp::SeqNum;
use luna_stack::wire::{
    checksum, ChecksumCaps, EtherType, EthernetAddress, EthernetFrame, EthernetRepr, IpProtocol,
    Ipv4Addr, Ipv4Packet, Ipv4Repr, TcpFlags, TcpOptions, TcpPacket, TcpRepr, Timestamps,
};
use std::hint::black_box;

const SRC: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const DST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const PAYLOAD: usize = 1448;

fn reprs() -> (EthernetRepr, Ipv4Repr, TcpRepr) {
    let eth = EthernetRepr {
        src_addr: EthernetAddress([0x52, 0x54, 0, 0, 0, 1]),
        dst_addr: EthernetAddress([0x52, 0x54, 0, 0, 0, 2]),
        ethertype: EtherType::Ipv4,
    };
    let tcp = TcpRepr {
        src_port: 40000,
        dst_port: 80,
        seq: SeqNum(0x1234_5678),
        ack: SeqNum(0x9abc_def0),
        flags: TcpFlags::ACK | TcpFlags::PSH,
        window: 512,
        urgent: 0,
        options: TcpOptions {
            timestamps: Some(Timestamps { tsval: 1, tsecr: 2 }),
            ..TcpOptions::default()
        },
    };
    let ip = Ipv4Repr::new(SRC, DST, IpProtocol::Tcp, tcp.buffer_len(PAYLOAD));
    (eth, ip, tcp)
}

/// Build a frame of Ethernet + IPv4 + TCP(timestamps) + payload into `buf`.
fn emit_frame(
    buf: &mut [u8],
    eth: &EthernetRepr,
    ip: &Ipv4Repr,
    tcp: &TcpRepr,
    caps: &ChecksumCaps,
) -> usize {
    let mut frame = EthernetFrame::new_unchecked(&mut buf[..]);
    eth.emit(&mut frame);
    let mut ipp = Ipv4Packet::new_unchecked(frame.payload_mut());
    ip.emit(&mut ipp, caps);
    let mut tcpp = TcpPacket::new_unchecked(ipp.payload_mut());
    tcp.emit(&mut tcpp, SRC, DST, PAYLOAD, caps);
    14 + ip.buffer_len()
}

/// Parse the whole stack the way the RX path does; returns something to keep it alive.
fn parse_frame(buf: &[u8], caps: &ChecksumCaps) -> Option<(TcpRepr, usize)> {
    let frame = EthernetFrame::new_checked(buf).ok()?;
    let eth = EthernetRepr::parse(&frame).ok()?;
    if eth.ethertype != EtherType::Ipv4 {
        return None;
    }
    let ipp = Ipv4Packet::new_checked(frame.payload()).ok()?;
    let ip = Ipv4Repr::parse(&ipp, caps).ok()?;
    if ip.is_fragment() || ip.protocol != IpProtocol::Tcp {
        return None;
    }
    let tcpp = TcpPacket::new_checked(ipp.payload()).ok()?;
    let tcp = TcpRepr::parse(&tcpp, ip.src_addr, ip.dst_addr, caps).ok()?;
    Some((tcp, tcpp.payload().len()))
}

fn bench_frame(c: &mut Criterion) {
    let (eth, ip, tcp) = reprs();
    let mut buf = vec![0u8; 14 + ip.buffer_len()];
    for (i, b) in buf.iter_mut().enumerate() {
        *b = i as u8;
    }
    let len = emit_frame(&mut buf, &eth, &ip, &tcp, &ChecksumCaps::software());
    assert!(parse_frame(&buf[..len], &ChecksumCaps::software()).is_some());

    let mut g = c.benchmark_group("tcp_frame_1448");
    for (name, caps) in [
        ("sw_checksum", ChecksumCaps::software()),
        ("offload", ChecksumCaps::offloaded()),
    ] {
        g.bench_function(BenchmarkId::new("parse", name), |b| {
            b.iter(|| parse_frame(black_box(&buf[..len]), &caps))
        });
        let mut out = buf.clone();
        g.bench_function(BenchmarkId::new("emit", name), |b| {
            b.iter(|| emit_frame(black_box(&mut out), &eth, &ip, black_box(&tcp), &caps))
        });
    }
    // Header-only emit with the payload checksum pre-computed (zero-copy TX path).
    let payload_sum = {
        let mut acc = checksum::Accumulator::new();
        acc.add_bytes(&buf[14 + 20 + tcp.header_len()..len]);
        acc
    };
    let mut hdr = vec![0u8; tcp.header_len()];
    g.bench_function("emit_split_tcp_header_cached_payload_sum", |b| {
        b.iter(|| {
            let mut p = TcpPacket::new_unchecked(&mut hdr[..]);
            tcp.emit_split(
                &mut p,
                SRC,
                DST,
                black_box(&payload_sum),
                &ChecksumCaps::software(),
            );
        })
    });
    g.finish();
}

fn bench_checksum(c: &mut Criterion) {
    let mut g = c.benchmark_group("checksum");
    for size in [64usize, 1460, 4096] {
        let data: Vec<u8> = (0..size).map(|i| (i * 31) as u8).collect();
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &data, |b, d| {
            b.iter(|| checksum::data(black_box(d)))
        });
    }
    g.finish();
}

criterion_group!(benches, bench_frame, bench_checksum);
criterion_main!(benches);
