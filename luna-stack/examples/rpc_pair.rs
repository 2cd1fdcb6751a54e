//! A deterministic workload for instruction counting: two stacks exchange 4 KiB RPCs over
//! an in-memory wire (client request, server response, closed loop, `--conns` connections,
//! one outstanding RPC each). Nothing is timed: run it under
//! `valgrind --tool=callgrind` and compare instruction counts before and after a change
//! (per RPC = (Ir(2N) − Ir(N)) / N, which cancels setup).
//!
//! `cargo build --release -p luna-stack --example rpc_pair`
//! `valgrind --tool=callgrind target/release/examples/rpc_pair <rpcs> [conns] [mtu] [offload] [wire] [order]`
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
//!
//! `order` is when the applications run:
//! - `quiet` (the default, the original harness): both stacks exchange frames until
//!   neither has anything to send, then the application reads and answers. The server's
//!   stack has by then acknowledged the three-segment request on its own (the
//!   every-second-segment rule), and the client's the response: eight frames per RPC.
//! - `loop`: each side runs one iteration of r2c's run-to-completion loop in turn —
//!   the received burst into the stack, the application (read, answer or send the next
//!   request), then everything the stack has to send — so the acknowledgement leaves
//!   with the answer or the next request, as it does in r2c: six frames per RPC. Only
//!   the order of the calls differs; the stack code run per frame is the same.

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

/// One side's iteration of r2c's loop: `rx` into the stack, the application (`app`, told
/// which connections became readable), then every frame the stack sends, onto `tx`.
fn iteration(
    now: Instant,
    s: &mut Stack<FakeRng>,
    (rx, tx): (&mut VecDeque<Zbuf>, &mut VecDeque<Zbuf>),
    kind: Wire,
    mut app: impl FnMut(&mut Stack<FakeRng>, SocketHandle),
) {
    if !rx.is_empty() {
        s.handle_frames(now, rx.drain(..));
    }
    while let Some(ev) = s.poll_event() {
        if let Event::Readable(h) = ev {
            app(s, h);
        }
    }
    while let Some(t) = s.poll_transmit(now) {
        tx.push_back(materialize(kind, &t));
    }
}

/// `rpcs` RPCs in r2c's order (see the module doc): every connection starts with one
/// request outstanding; the server answers a whole request in the iteration that
/// received it, the client sends the next one in the iteration that completed the
/// answer, until `rpcs` answers arrived.
fn run_loop(
    rpcs: usize,
    (a, b): (&mut Stack<FakeRng>, &mut Stack<FakeRng>),
    (clients, servers): (&[SocketHandle], &[SocketHandle]),
    (got_a, got_b): (&mut [usize], &mut [usize]),
    msg: &Zbuf,
    kind: Wire,
    now: &mut Instant,
) {
    // Each side's handles in order, with their connection numbers: a lookup per
    // Readable event in O(log conns) (one compare at one connection).
    let sorted = |hs: &[SocketHandle]| {
        let mut v: Vec<(SocketHandle, usize)> = hs.iter().copied().zip(0..).collect();
        v.sort_unstable();
        v
    };
    let (by_client, by_server) = (sorted(clients), sorted(servers));
    let index = |hs: &[(SocketHandle, usize)], h| {
        hs[hs.binary_search_by(|(x, _)| x.cmp(&h)).expect("ours")].1
    };
    let request = |s: &mut Stack<FakeRng>, h| {
        let mut v = IoVec::new();
        v.push(msg.clone());
        s.send_iovec(h, &v).expect("send");
    };
    let (mut to_b, mut to_a) = (VecDeque::new(), VecDeque::new());
    let mut started = 0;
    let mut done = 0;
    for &h in clients.iter().take(rpcs) {
        request(a, h);
        started += 1;
    }
    while let Some(t) = a.poll_transmit(*now) {
        to_b.push_back(materialize(kind, &t));
    }
    // An iteration pair completes an RPC on some connection, or lets a timer fire (the
    // clock advances 5 µs each): a bound far beyond that, so a stack that stops answering
    // fails the run instead of spinning under callgrind.
    let limit = rpcs.saturating_mul(1_000).max(1_000_000);
    for spins in 0.. {
        if done >= rpcs {
            break;
        }
        assert!(spins < limit, "no progress: {done} of {rpcs} RPCs answered");
        *now += luna_stack::time::Duration::from_micros(5);
        iteration(*now, b, (&mut to_b, &mut to_a), kind, |s, h| {
            let c = index(&by_server, h);
            let before = got_b[c] / MSG;
            got_b[c] += drain(s, h);
            for _ in before..got_b[c] / MSG {
                s.send(h, msg).expect("respond");
            }
        });
        iteration(*now, a, (&mut to_a, &mut to_b), kind, |s, h| {
            let c = index(&by_client, h);
            let before = got_a[c] / MSG;
            got_a[c] += drain(s, h);
            for _ in before..got_a[c] / MSG {
                done += 1;
                if started < rpcs {
                    request(s, h);
                    started += 1;
                }
            }
        });
        b.handle_timeouts(*now);
        a.handle_timeouts(*now);
    }
}

fn drain(s: &mut Stack<FakeRng>, h: SocketHandle) -> usize {
    let mut n = 0;
    while let Ok(Some(z)) = s.recv(h) {
        n += z.len();
    }
    n
}

/// A usage error: what was wrong and the usage line, exit status 2 (no panic).
fn usage(what: &str) -> ! {
    eprintln!("rpc_pair: {what}\nusage: rpc_pair [rpcs] [conns] [mtu] [offload 0|1] [vec|slab] [quiet|loop]");
    std::process::exit(2)
}

/// Positional argument `i` as a number, `default` when absent.
fn num_arg<T: std::str::FromStr>(args: &[String], i: usize, name: &str, default: T) -> T {
    match args.get(i) {
        None => default,
        Some(a) => a
            .parse()
            .unwrap_or_else(|_| usage(&format!("{name}: not a number: {a}"))),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rpcs: usize = num_arg(&args, 1, "rpcs", 10_000);
    let conns: usize = num_arg(&args, 2, "conns", 1);
    let mtu: u16 = num_arg(&args, 3, "mtu", 1500);
    if rpcs == 0 || conns == 0 || mtu < 576 {
        usage("rpcs and conns must be at least 1, mtu at least 576");
    }
    let off = match args.get(4).map(String::as_str) {
        None | Some("0") => false,
        Some("1") => true,
        Some(other) => usage(&format!("offload must be 0 or 1, not {other}")),
    };
    let kind = match args.get(5).map(String::as_str) {
        None | Some("vec") => Wire::Vec,
        Some("slab") => Wire::Slab,
        Some(other) => usage(&format!("wire must be vec or slab, not {other}")),
    };
    let in_loop = match args.get(6).map(String::as_str) {
        None | Some("quiet") => false,
        Some("loop") => true,
        Some(other) => usage(&format!("order must be quiet or loop, not {other}")),
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
    if in_loop {
        run_loop(
            rpcs,
            (&mut a, &mut b),
            (&clients, &servers),
            (&mut got_a, &mut got_b),
            &msg,
            kind,
            &mut now,
        );
    }
    for i in (0..rpcs).filter(|_| !in_loop) {
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
    let order = if in_loop { "loop" } else { "quiet" };
    println!(
        "rpcs={rpcs} conns={conns} mtu={mtu} offload={off} wire={wire_name} order={order} bytes={total}"
    );
}
