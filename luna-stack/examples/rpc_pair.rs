//! A deterministic workload for instruction counting: two stacks exchange 4 KiB RPCs over
//! an in-memory wire (client request, server response, closed loop, `--conns` connections,
//! one outstanding RPC each). Nothing is timed: run it under
//! `valgrind --tool=callgrind` and compare instruction counts before and after a change
//! (per RPC = (Ir(2N) − Ir(N)) / N, which cancels setup).
//!
//! `cargo build --release -p luna-stack --example rpc_pair`
//! `valgrind --tool=callgrind target/release/examples/rpc_pair <rpcs> [conns] [mtu] [offload]`
//!
//! The wire copies every frame into a fresh buffer (a constant cost on both sides of a
//! comparison). `offload` = 1 runs both stacks with checksum offload (a virtual link).

use luna_stack::stack::{Event, SocketHandle, Stack};
use luna_stack::testutil::{stack_config, FakeRng, IP_A, IP_B, MAC_A, MAC_B};
use luna_stack::time::Instant;
use luna_stack::wire::ChecksumCaps;
use std::collections::VecDeque;
use std::net::SocketAddrV4;
use zbuf::{IoVec, Zbuf};

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
    if off {
        cfg.caps = ChecksumCaps::offloaded();
    }
    Stack::new(cfg, FakeRng::new(u64::from(mac.0[5]))).expect("config")
}

/// Moves every frame each stack has to the other, until both are quiet.
fn pump(
    now: Instant,
    a: &mut Stack<FakeRng>,
    b: &mut Stack<FakeRng>,
    wire: &mut VecDeque<Vec<u8>>,
) {
    loop {
        let mut moved = false;
        while let Some(t) = a.poll_transmit(now) {
            wire.push_back(t.to_vec());
        }
        while let Some(f) = wire.pop_front() {
            b.handle_frame(now, Zbuf::from_vec(f));
            moved = true;
        }
        while let Some(t) = b.poll_transmit(now) {
            wire.push_back(t.to_vec());
        }
        while let Some(f) = wire.pop_front() {
            a.handle_frame(now, Zbuf::from_vec(f));
            moved = true;
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
        pump(t0, &mut a, &mut b, &mut wire);
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
        pump(now, &mut a, &mut b, &mut wire);
        while b.poll_event().is_some() {}
        got_b[c] += drain(&mut b, servers[c]);
        b.send(servers[c], &msg).expect("respond");
        pump(now, &mut a, &mut b, &mut wire);
        while a.poll_event().is_some() {}
        got_a[c] += drain(&mut a, clients[c]);
        b.handle_timeouts(now);
        a.handle_timeouts(now);
    }
    pump(now, &mut a, &mut b, &mut wire);
    let total: usize = got_a.iter().sum::<usize>() + got_b.iter().sum::<usize>();
    assert_eq!(total, 2 * rpcs * MSG, "every byte delivered");
    println!("rpcs={rpcs} conns={conns} mtu={mtu} offload={off} bytes={total}");
}
