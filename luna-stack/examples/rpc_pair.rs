//! A deterministic workload for instruction counting: two stacks exchange 4 KiB RPCs over
//! an in-memory wire (client request, server response, closed loop, `--conns` connections,
//! one outstanding RPC each). Nothing is timed: run it under
//! `valgrind --tool=callgrind` and compare instruction counts before and after a change
//! (per RPC = (Ir(2N) − Ir(N)) / N, which cancels setup).
//!
//! `cargo build --release -p luna-stack --example rpc_pair`
//! `valgrind --tool=callgrind target/release/examples/rpc_pair <rpcs> [conns] [mtu] [offload] [wire]`
//!
//! The wire copies every frame into a fresh buffer (a constant cost on both sides of a
//! comparison). `offload` = 1 runs both stacks with checksum offload (a virtual link).
//! `wire` picks where that buffer comes from:
//! - `vec` (the default, the original harness): a `Vec` from the system allocator per frame,
//!   wrapped by `Zbuf::from_vec`; glibc malloc/free is then a large share of the count;
//! - `slab`: a zbuf object from this thread's `CoreCache` over a zbuf `Slab` (normal pages),
//!   filled with the header and payload bytes: what r2c's in-memory device does
//!   (`MemDevice::materialize`) and, in copy mode, what the memif PMD's receive copy into a
//!   zbuf-zone mbuf amounts to. The stack's work is the same in both; only the harness's
//!   allocator changes.

use luna_stack::stack::{Event, SocketHandle, Stack};
use luna_stack::testutil::{stack_config, FakeRng, IP_A, IP_B, MAC_A, MAC_B};
use luna_stack::time::Instant;
use luna_stack::wire::ChecksumCaps;
use std::collections::VecDeque;
use std::net::SocketAddrV4;
use zbuf::{HugepageMode, IoVec, Slab, SlabConfig, Zbuf};

const MSG: usize = 4096;

fn stack(
    mac: luna_stack::wire::EthernetAddress,
    ip: std::net::Ipv4Addr,
    mtu: u16,
    off: bool,
) -> Stack<FakeRng> {
    let mut cfg = stack_config(mac, ip);
    cfg.mtu = mtu;
    cfg.tcp.mss = mtu - 40;
    // The default client range (61440–65535) holds 4,096 ports: too few for the
    // 5,000-connection comparison against one server port.
    cfg.ephemeral_ports = (10_000, 65_535);
    if off {
        cfg.caps = ChecksumCaps::offloaded();
    }
    Stack::new(cfg, FakeRng::new(u64::from(mac.0[5]))).expect("config")
}

/// Where the wire's copy of a frame lives (see the module doc).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wire {
    Vec,
    Slab,
}

/// The frame `t` as the receiving side gets it: one contiguous copy.
fn materialize(wire: Wire, t: &luna_stack::stack::Transmit) -> Zbuf {
    if wire == Wire::Slab {
        if let Ok(mut z) = zbuf::alloc(t.len()) {
            if z.extend_from_slice(t.header()).is_ok()
                && t.payload.chunks().all(|c| z.extend_from_slice(c).is_ok())
            {
                return z.freeze();
            }
        }
        panic!("slab wire: no zbuf for a {}-byte frame", t.len());
    }
    Zbuf::from_vec(t.to_vec())
}

/// Moves every frame each stack has to the other, until both are quiet.
fn pump(
    now: Instant,
    a: &mut Stack<FakeRng>,
    b: &mut Stack<FakeRng>,
    wire: &mut VecDeque<Zbuf>,
    kind: Wire,
) {
    loop {
        let mut moved = false;
        while let Some(t) = a.poll_transmit(now) {
            wire.push_back(materialize(kind, &t));
        }
        // The burst in one call, as r2c hands over a received burst (`handle_frames`).
        if !wire.is_empty() {
            moved = true;
            b.handle_frames(now, wire.drain(..));
        }
        while let Some(t) = b.poll_transmit(now) {
            wire.push_back(materialize(kind, &t));
        }
        if !wire.is_empty() {
            moved = true;
            a.handle_frames(now, wire.drain(..));
        }
        if !moved {
            return;
        }
    }
}

fn drain(s: &mut Stack<FakeRng>, h: SocketHandle) -> usize {
    let mut n = 0;
    while let Ok(Some(z)) = s.recv(h) {
        n += z.len();
    }
    n
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rpcs: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let conns: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1);
    let mtu: u16 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(1500);
    let off = args.get(4).is_some_and(|a| a == "1");
    let kind = match args.get(5).map(String::as_str) {
        None | Some("vec") => Wire::Vec,
        Some("slab") => Wire::Slab,
        Some(other) => panic!("wire must be vec or slab, not {other}"),
    };
    // The slab and this thread's cache live for the whole run (buffers go home to it).
    let _cache = match kind {
        Wire::Slab => {
            let cfg = SlabConfig::new()
                .size_classes(&[2048, 16384])
                .headroom(0)
                .max_memory(64 << 20)
                .hugepages(HugepageMode::Never);
            let slab = Slab::new(cfg).expect("slab");
            Some(slab.core_cache(0).expect("core cache"))
        }
        Wire::Vec => None,
    };
    let mut a = stack(MAC_A, IP_A, mtu, off);
    let mut b = stack(MAC_B, IP_B, mtu, off);
    let t0 = Instant::from_millis(1);
    let _ = a.neighbours_mut().learn(IP_B, MAC_B, t0, true);
    let _ = b.neighbours_mut().learn(IP_A, MAC_A, t0, true);
    let l = b.listen(80, conns + 16).expect("listen");
    let mut wire = VecDeque::new();
    let mut clients = Vec::new();
    for _ in 0..conns {
        clients.push(
            a.connect(t0, SocketAddrV4::new(IP_B, 80), None)
                .expect("connect"),
        );
        pump(t0, &mut a, &mut b, &mut wire, kind);
    }
    let mut servers = Vec::new();
    while let Some(ev) = b.poll_event() {
        if let Event::Acceptable(_) = ev {
            while let Some(h) = b.accept(l) {
                servers.push(h);
            }
        }
    }
    while a.poll_event().is_some() {}
    assert_eq!(servers.len(), conns, "every connection accepted");
    let msg = Zbuf::from_vec(vec![0x5a; MSG]);
    let mut now = t0;
    let (mut got_a, mut got_b) = (vec![0usize; conns], vec![0usize; conns]);
    for i in 0..rpcs {
        let c = i % conns;
        now += luna_stack::time::Duration::from_micros(5);
        let mut v = IoVec::new();
        v.push(msg.clone());
        a.send_iovec(clients[c], &v).expect("send");
        pump(now, &mut a, &mut b, &mut wire, kind);
        while b.poll_event().is_some() {}
        got_b[c] += drain(&mut b, servers[c]);
        b.send(servers[c], &msg).expect("respond");
        pump(now, &mut a, &mut b, &mut wire, kind);
        while a.poll_event().is_some() {}
        got_a[c] += drain(&mut a, clients[c]);
        b.handle_timeouts(now);
        a.handle_timeouts(now);
    }
    pump(now, &mut a, &mut b, &mut wire, kind);
    let total: usize = got_a.iter().sum::<usize>() + got_b.iter().sum::<usize>();
    assert_eq!(total, 2 * rpcs * MSG, "every byte delivered");
    let wire_name = if kind == Wire::Slab { "slab" } else { "vec" };
    println!("rpcs={rpcs} conns={conns} mtu={mtu} offload={off} wire={wire_name} bytes={total}");
}
