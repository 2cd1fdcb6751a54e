//! Established fast path, per segment: luna-stack vs smoltcp 0.14, side by side in one run.
//!
//! - RX: `handle_frame` of an in-order data segment, `recv` of its payload, and the ACK the
//!   stack emits (both stacks ACK every segment here: luna's default, smoltcp with
//!   `set_ack_delay(None)`). smoltcp: the frame is queued on its device, `Interface::poll`
//!   processes it and emits the ACK, `recv` dequeues without copying out.
//! - TX: `send` of one segment's payload and the frame the stack emits for it (luna:
//!   `poll_transmit`, header bytes + zero-copy payload; smoltcp: `send_slice` copies into its
//!   ring and `poll` writes the frame into the device buffer). The peer's ACKs are fed
//!   outside the timed region.
//!
//! Payloads 64 B, 1460 B and 4096 B; MTU 9000 so 4 KiB is one jumbo segment (MSS 8960) for
//! both stacks. No TCP timestamps (so 1460 B is exactly one standard MSS); checksums in
//! software on both sides. Frames are built outside the timed region in chunks of 256.
//!
//! Run: `cargo bench -p luna-stack --bench stack` (results in docs/benchmarks-stack.md).
//! `make bench` also counts each case's instructions per segment under callgrind
//! (`LUNA_BENCH_COUNT`, see [`count`]; testbed/bench.sh, docs/benchmarks.md).

#[path = "../tests/common/mod.rs"]
#[allow(unused_imports)]
mod common;

use common::SmolHost;
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use luna_stack::stack::{Event, SocketHandle, Stack};
use luna_stack::tcp::cc::{CcConfig, InitialWindow};
use luna_stack::tcp::SeqNum;
use luna_stack::testutil::{
    build_tcp_frame, stack_config, FakeRng, Segment, IP_A, IP_B, MAC_A, MAC_B,
};
use luna_stack::time::{Duration, Instant};
use luna_stack::wire::{
    ArpOperation, ArpPacket, ArpRepr, EtherType, EthernetFrame, EthernetRepr, TcpFlags, TcpOptions,
    TcpRepr,
};
use smoltcp::iface::SocketHandle as SmolHandle;
use smoltcp::socket::tcp;
use std::hint::black_box;
use zbuf::Zbuf;

const MTU: u16 = 9000;
const MSS: u16 = MTU - 40;
const CHUNK: usize = 256;
const SIZES: [usize; 3] = [64, 1460, 4096];
const PEER_PORT: u16 = 40000;
const NOW: Instant = Instant::from_millis(1);

/// The scripted peer's view of a connection: its next sequence number and the stack's.
struct Peer {
    seq: SeqNum,
    stack_seq: SeqNum,
}

fn peer_segment(p: &Peer, flags: TcpFlags, payload: &[u8], options: TcpOptions) -> Vec<u8> {
    let tcp = TcpRepr {
        src_port: PEER_PORT,
        dst_port: 80,
        seq: p.seq,
        ack: p.stack_seq,
        flags,
        window: 65535,
        urgent: 0,
        options,
    };
    build_tcp_frame(MAC_B, MAC_A, IP_B, IP_A, &tcp, payload)
}

fn syn_options() -> TcpOptions {
    TcpOptions {
        mss: Some(MSS),
        window_scale: Some(7),
        ..TcpOptions::default()
    }
}

/// Handshake frames: the SYN, then (given the SYN-ACK) the ACK.
fn handshake(mut send: impl FnMut(Vec<u8>), mut recv_synack: impl FnMut() -> Segment) -> Peer {
    let mut p = Peer {
        seq: SeqNum(1_000_000),
        stack_seq: SeqNum(0),
    };
    send(peer_segment(&p, TcpFlags::SYN, &[], syn_options()));
    let synack = recv_synack();
    assert!(synack.tcp.flags.syn() && synack.tcp.flags.ack(), "SYN-ACK");
    p.seq += 1u32;
    p.stack_seq = synack.tcp.seq + 1u32;
    send(peer_segment(&p, TcpFlags::ACK, &[], TcpOptions::default()));
    p
}

// ---------------------------------------------------------------------------------------------
// luna
// ---------------------------------------------------------------------------------------------

struct Luna {
    stack: Stack<FakeRng>,
    h: SocketHandle,
    peer: Peer,
}

fn luna() -> Luna {
    let mut cfg = stack_config(MAC_A, IP_A);
    cfg.mtu = MTU;
    cfg.tcp.mss = MSS;
    cfg.tcp.timestamps = false;
    cfg.tcp.rcv_buf = 4 << 20;
    cfg.tcp.snd_buf = 4 << 20;
    // The window, not cwnd, bounds the TX benchmark's bursts.
    cfg.tcp.cc_config = CcConfig {
        initial_window: InitialWindow::Segments(4096),
        ..CcConfig::default()
    };
    let mut stack = Stack::new(cfg, FakeRng::new(1)).expect("config");
    let _ = stack.neighbours_mut().learn(IP_B, MAC_B, NOW, true);
    let l = stack.listen(80, 4).expect("listen");
    let stack = std::cell::RefCell::new(stack);
    let peer = handshake(
        |f| stack.borrow_mut().handle_frame(NOW, Zbuf::from_vec(f)),
        || {
            let t = stack.borrow_mut().poll_transmit(NOW).expect("SYN-ACK");
            Segment::parse(&t.to_vec()).expect("TCP")
        },
    );
    let mut stack = stack.into_inner();
    let mut h = None;
    while let Some(ev) = stack.poll_event() {
        if let Event::Acceptable(l2) = ev {
            assert_eq!(l2, l);
            h = stack.accept(l);
        }
    }
    Luna {
        stack,
        h: h.expect("accepted"),
        peer,
    }
}

fn luna_rx(luna: &mut Luna, size: usize, iters: u64) -> Duration {
    let payload = vec![0x5a; size];
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        let frames: Vec<Zbuf> = (0..n)
            .map(|_| {
                let f = peer_segment(
                    &luna.peer,
                    TcpFlags::ACK | TcpFlags::PSH,
                    &payload,
                    TcpOptions::default(),
                );
                luna.peer.seq += size as u32;
                Zbuf::from_vec(f)
            })
            .collect();
        let start = std::time::Instant::now();
        counted_region_luna_rx(luna, frames);
        total += start.elapsed();
        left -= n as u64;
    }
    assert_eq!(
        luna.stack.tcp_counters().bytes_in % size as u64,
        0,
        "every segment was taken in order"
    );
    total
}

/// The measured part of an RX iteration (a named, never-inlined function so that
/// `make bench` can count its instructions alone with callgrind's `--toggle-collect`).
#[inline(never)]
fn counted_region_luna_rx(luna: &mut Luna, frames: Vec<Zbuf>) {
    for f in frames {
        luna.stack.handle_frame(NOW, f);
        while let Ok(Some(z)) = luna.stack.recv(luna.h) {
            black_box(z);
        }
        let ack = luna
            .stack
            .poll_transmit(NOW)
            .expect("luna ACKs every segment");
        black_box(ack);
        debug_assert!(luna.stack.poll_transmit(NOW).is_none());
    }
}

/// The measured part of a TX iteration (see [`counted_region_luna_rx`]).
#[inline(never)]
fn counted_region_luna_tx(luna: &mut Luna, payload: &Zbuf, n: usize) {
    let size = payload.len();
    for _ in 0..n {
        let took = luna.stack.send(luna.h, payload).expect("send");
        debug_assert_eq!(took, size);
        let t = luna.stack.poll_transmit(NOW).expect("a segment per send");
        assert_eq!(t.payload.len(), size, "one whole segment per send");
        black_box(t);
    }
}

fn luna_tx(luna: &mut Luna, size: usize, iters: u64) -> Duration {
    let payload = Zbuf::from_vec(vec![0x5a; size]);
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        let start = std::time::Instant::now();
        counted_region_luna_tx(luna, &payload, n);
        total += start.elapsed();
        left -= n as u64;
        // The peer acknowledges everything (untimed).
        luna.peer.stack_seq += (n * size) as u32;
        let ack = peer_segment(&luna.peer, TcpFlags::ACK, &[], TcpOptions::default());
        luna.stack.handle_frame(NOW, Zbuf::from_vec(ack));
        while luna.stack.poll_transmit(NOW).is_some() {}
        while luna.stack.poll_event().is_some() {}
    }
    total
}

// ---------------------------------------------------------------------------------------------
// smoltcp
// ---------------------------------------------------------------------------------------------

struct Smol {
    host: SmolHost,
    h: SmolHandle,
    peer: Peer,
}

fn smol_now() -> smoltcp::time::Instant {
    common::to_smol(NOW)
}

fn smol() -> Smol {
    let mut host = SmolHost::with_mtu(MAC_A.0, IP_A.octets(), 1, usize::from(MTU));
    // A ring size that is a multiple of every payload size, so no segment is split at the
    // ring's wrap (smoltcp sends the contiguous part first).
    let h = host.listen(80, 2 * 365 * 4096, false);
    host.tcp(h).set_ack_delay(None);
    // Like luna's huge initial window here: no congestion window limits the bursts (the
    // differential tests run smoltcp with Reno, its default once the feature is on).
    host.tcp(h)
        .set_congestion_control(tcp::CongestionControl::None);
    host.tcp(h).set_nagle_enabled(false);
    let host = std::cell::RefCell::new(host);
    let peer = handshake(
        |f| {
            let mut hst = host.borrow_mut();
            hst.dev.rx.push_back(f);
            let SmolHost {
                iface,
                dev,
                sockets,
                ..
            } = &mut *hst;
            iface.poll(smol_now(), dev, sockets);
        },
        || {
            let mut hst = host.borrow_mut();
            // smoltcp resolves the peer by ARP before it answers: reply, then poll again.
            if hst.dev.tx.iter().any(|f| f[12..14] == [0x08, 0x06]) {
                hst.dev.tx.clear();
                hst.dev.rx.push_back(arp_reply());
                let SmolHost {
                    iface,
                    dev,
                    sockets,
                    ..
                } = &mut *hst;
                iface.poll(smol_now(), dev, sockets);
            }
            let f = hst.dev.tx.drain(..).find_map(|f| Segment::parse(&f));
            f.expect("smoltcp answered the SYN")
        },
    );
    let mut host = host.into_inner();
    host.dev.tx.clear();
    assert_eq!(host.tcp(h).state(), tcp::State::Established);
    Smol { host, h, peer }
}

/// The peer's ARP reply to smoltcp.
fn arp_reply() -> Vec<u8> {
    let mut f = vec![0u8; 14 + 28];
    EthernetRepr {
        src_addr: MAC_B,
        dst_addr: MAC_A,
        ethertype: EtherType::Arp,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut f[..]));
    ArpRepr {
        operation: ArpOperation::Reply,
        sender_hardware_addr: MAC_B,
        sender_protocol_addr: IP_B,
        target_hardware_addr: MAC_A,
        target_protocol_addr: IP_A,
    }
    .emit(&mut ArpPacket::new_unchecked(&mut f[14..]));
    f
}

fn smol_poll(s: &mut Smol) {
    let SmolHost {
        iface,
        dev,
        sockets,
        ..
    } = &mut s.host;
    iface.poll(smol_now(), dev, sockets);
}

fn smol_rx(s: &mut Smol, size: usize, iters: u64) -> Duration {
    let payload = vec![0x5a; size];
    let mut total = Duration::ZERO;
    let mut left = iters;
    let mut got = 0usize;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        let frames: Vec<Vec<u8>> = (0..n)
            .map(|_| {
                let f = peer_segment(
                    &s.peer,
                    TcpFlags::ACK | TcpFlags::PSH,
                    &payload,
                    TcpOptions::default(),
                );
                s.peer.seq += size as u32;
                f
            })
            .collect();
        let start = std::time::Instant::now();
        got += counted_region_smol_rx(s, frames);
        total += start.elapsed();
        left -= n as u64;
    }
    assert_eq!(
        got,
        iters as usize * size,
        "smoltcp took every segment in order"
    );
    total
}

/// The measured part of smoltcp's RX iteration; returns the payload bytes received.
#[inline(never)]
fn counted_region_smol_rx(s: &mut Smol, frames: Vec<Vec<u8>>) -> usize {
    let mut got = 0;
    for f in frames {
        s.host.dev.rx.push_back(f);
        smol_poll(s);
        while let Ok(k) = s.host.tcp(s.h).recv(|b| (b.len(), b.len())) {
            if k == 0 {
                break;
            }
            got += k;
        }
        let acks = s.host.dev.tx.drain(..).count();
        assert_eq!(acks, 1, "smoltcp ACKs every segment (ack delay off)");
    }
    got
}

/// The measured part of smoltcp's TX iteration.
#[inline(never)]
fn counted_region_smol_tx(s: &mut Smol, payload: &[u8], n: usize) {
    let size = payload.len();
    for i in 0..n {
        let took = s.host.tcp(s.h).send_slice(payload).expect("send");
        debug_assert_eq!(took, size);
        smol_poll(s);
        let f = s.host.dev.tx.pop().expect("a frame per send");
        if f.len() != 54 + size {
            let sock = s.host.tcp(s.h);
            panic!(
                "smoltcp sent {} bytes for a {size} B send (segment {i} of the chunk, \
                 send queue {}, {}): {}",
                f.len() - 54,
                sock.send_queue(),
                sock.state(),
                luna_stack::testutil::describe_frame(&f)
            );
        }
        assert!(s.host.dev.tx.is_empty());
        black_box(f);
    }
}

fn smol_tx(s: &mut Smol, size: usize, iters: u64) -> Duration {
    let payload = vec![0x5a; size];
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        let start = std::time::Instant::now();
        counted_region_smol_tx(s, &payload, n);
        total += start.elapsed();
        left -= n as u64;
        s.peer.stack_seq += (n * size) as u32;
        let ack = peer_segment(&s.peer, TcpFlags::ACK, &[], TcpOptions::default());
        s.host.dev.rx.push_back(ack);
        smol_poll(s);
        s.host.dev.tx.clear();
    }
    total
}

// ---------------------------------------------------------------------------------------------

fn bench(c: &mut Criterion) {
    for (dir, luna_fn, smol_fn) in [
        (
            "rx",
            luna_rx as fn(&mut Luna, usize, u64) -> Duration,
            smol_rx as fn(&mut Smol, usize, u64) -> Duration,
        ),
        ("tx", luna_tx, smol_tx),
    ] {
        let mut g = c.benchmark_group(format!("established_{dir}"));
        for size in SIZES {
            g.throughput(Throughput::Elements(1));
            let mut l = luna();
            g.bench_with_input(BenchmarkId::new("luna", size), &size, |b, &size| {
                b.iter_custom(|iters| luna_fn(&mut l, size, iters))
            });
            let mut s = smol();
            g.bench_with_input(BenchmarkId::new("smoltcp", size), &size, |b, &size| {
                b.iter_custom(|iters| smol_fn(&mut s, size, iters))
            });
        }
        g.finish();
    }
}

/// Segments per case in counting mode (`LUNA_BENCH_COUNT`).
const COUNT_SEGMENTS: u64 = 1024;

/// Counting mode for `make bench`: `LUNA_BENCH_COUNT=<rx|tx>/<luna|smoltcp>/<size>` runs
/// that one case for [`COUNT_SEGMENTS`] segments, no criterion, and prints how many;
/// under `valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*counted_region_*'`
/// the collected instructions divided by that are the case's instructions per segment
/// (setup and frame building are outside the counted functions).
fn count(case: &str) {
    let parts: Vec<&str> = case.split('/').collect();
    let size = parts.get(2).and_then(|s| s.parse::<usize>().ok());
    let (Some(dir), Some(stack), Some(size)) = (parts.first(), parts.get(1), size) else {
        eprintln!("LUNA_BENCH_COUNT={case:?}: give <rx|tx>/<luna|smoltcp>/<payload bytes>");
        std::process::exit(2);
    };
    match (*dir, *stack) {
        ("rx", "luna") => {
            let _ = luna_rx(&mut luna(), size, COUNT_SEGMENTS);
        }
        ("tx", "luna") => {
            let _ = luna_tx(&mut luna(), size, COUNT_SEGMENTS);
        }
        ("rx", "smoltcp") => {
            let _ = smol_rx(&mut smol(), size, COUNT_SEGMENTS);
        }
        ("tx", "smoltcp") => {
            let _ = smol_tx(&mut smol(), size, COUNT_SEGMENTS);
        }
        _ => {
            eprintln!("LUNA_BENCH_COUNT={case:?}: unknown direction or stack");
            std::process::exit(2);
        }
    }
    println!("counted {COUNT_SEGMENTS} segments: {case}");
}

criterion_group!(benches, bench);

fn main() {
    match std::env::var("LUNA_BENCH_COUNT") {
        Ok(case) => count(&case),
        Err(_) => {
            benches();
            Criterion::default().configure_from_args().final_summary();
        }
    }
}
