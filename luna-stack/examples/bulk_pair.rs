//! A deterministic bulk workload for instruction counting: one connection streams `bytes`
//! one way in 4 KiB writes between two stacks in one process, luna-stack or smoltcp 0.14,
//! over an in-memory wire that copies every frame once. Nothing is timed: run it under
//! `valgrind --tool=callgrind` and take instructions per byte as
//! (Ir(2N) − Ir(N)) / N, which cancels setup, the handshake and the end of the stream.
//! `luna-stack/benches/bulk-instructions.sh` does that for both stacks at MTU 1500 and 9000
//! (`make bench` runs it; docs/benchmarks-stack.md, "Bulk: instructions per byte").
//!
//! `cargo build --release -p luna-stack --example bulk_pair`
//! `valgrind --tool=callgrind target/release/examples/bulk_pair <luna|smoltcp> <bytes> [mtu] [offload]`
//!
//! Both stacks run as knb runs them over memif: luna with its defaults (timestamps, SACK,
//! window scaling, an ACK per segment, 1 MiB buffers) and MTU/MSS set from `mtu`; smoltcp
//! with Nagle off, 1 MiB socket buffers, its default delayed ACK (an ACK every second
//! full-sized segment) and Reno. `offload` = 1 (the default, as knb on memif, a virtual
//! link) computes and verifies no checksums on either stack; 0 computes them in software.
//!
//! The applications are the cheapest each API allows: luna's sender queues a reference to
//! one preallocated 4 KiB buffer per write (zero copy) and its receiver drops the received
//! buffers; smoltcp's sender copies each write into its ring (`send_slice`) and its receiver
//! consumes the ring in place (`recv` with a closure that reads nothing).
//!
//! The wire is the same for both: one copy of each frame into a buffer from a free pool
//! (luna: a zbuf object of this thread's `CoreCache` over a normal-page `Slab`, as in
//! `rpc_pair`'s `slab` wire; smoltcp: a recycled `Vec` of the link's frame size), done in
//! [`wire_luna`] / [`wire_smoltcp`] so that a profile can subtract it.

use luna_stack::stack::{Event, SocketHandle, Stack};
use luna_stack::testutil::{stack_config, FakeRng, IP_A, IP_B, MAC_A, MAC_B};
use luna_stack::time::{Duration, Instant};
use luna_stack::wire::ChecksumCaps;
use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{self, ChecksumCapabilities, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::wire::{EthernetAddress as SmolMac, HardwareAddress, IpAddress, IpCidr};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::SocketAddrV4;
use std::rc::Rc;
use zbuf::{HugepageMode, Slab, SlabConfig, Zbuf};

/// Bytes per application write (knb bulk's `--req-size 4096`).
const WRITE: usize = 4096;
/// Socket buffers, each way, both stacks.
const BUF: usize = 1 << 20;
/// Virtual time per round of the pump.
const STEP: Duration = Duration::from_micros(10);
/// Rounds without progress before the run is declared stuck (far beyond any timer here).
const STUCK_ROUNDS: u32 = 100_000;

struct Args {
    stack: String,
    bytes: u64,
    mtu: u16,
    offload: bool,
}

fn args() -> Args {
    let a: Vec<String> = std::env::args().collect();
    let usage = "usage: bulk_pair <luna|smoltcp> <bytes> [mtu 1500] [offload 1|0]";
    let stack = a.get(1).cloned().unwrap_or_else(|| panic!("{usage}"));
    let bytes = a
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{usage}"));
    let mtu = a.get(3).map_or(1500, |s| s.parse().expect("mtu"));
    assert!((576..=9000).contains(&mtu), "mtu must be 576..=9000");
    let offload = a.get(4).is_none_or(|s| s == "1");
    Args {
        stack,
        bytes,
        mtu,
        offload,
    }
}

/// Frames of a run (data and pure ACKs alike), for the per-frame figures.
#[derive(Default)]
struct Frames {
    to_receiver: u64,
    to_sender: u64,
}

// ---- luna ----

fn luna_stack(
    mac: luna_stack::wire::EthernetAddress,
    ip: std::net::Ipv4Addr,
    a: &Args,
) -> Stack<FakeRng> {
    let mut cfg = stack_config(mac, ip);
    cfg.mtu = a.mtu;
    cfg.tcp.mss = a.mtu - 40;
    cfg.tcp.rcv_buf = BUF as u32;
    cfg.tcp.snd_buf = BUF as u32;
    if a.offload {
        cfg.caps = ChecksumCaps::offloaded();
    }
    Stack::new(cfg, FakeRng::new(u64::from(mac.0[5]))).expect("config")
}

/// The wire: the frame as the receiver gets it, one contiguous copy in a slab object.
#[inline(never)]
fn wire_luna(t: &luna_stack::stack::Transmit) -> Zbuf {
    let mut z = zbuf::alloc(t.len()).expect("slab wire: no buffer");
    z.extend_from_slice(t.header()).expect("fits");
    for c in t.payload.chunks() {
        z.extend_from_slice(c).expect("fits");
    }
    z.freeze()
}

/// Moves every frame `from` has to `to`; frames moved.
fn luna_move(
    now: Instant,
    from: &mut Stack<FakeRng>,
    to: &mut Stack<FakeRng>,
    q: &mut VecDeque<Zbuf>,
) -> u64 {
    while let Some(t) = from.poll_transmit(now) {
        q.push_back(wire_luna(&t));
    }
    let n = q.len() as u64;
    to.handle_frames(now, q.drain(..));
    n
}

fn run_luna(a: &Args) -> Frames {
    let slab = Slab::new(
        SlabConfig::new()
            .size_classes(&[2048, 16384])
            .headroom(0)
            .max_memory(256 << 20)
            .hugepages(HugepageMode::Never),
    )
    .expect("slab");
    let _cache = slab.core_cache(0).expect("core cache");
    let mut tx = luna_stack(MAC_A, IP_A, a);
    let mut rx = luna_stack(MAC_B, IP_B, a);
    let mut now = Instant::from_millis(1);
    let _ = tx.neighbours_mut().learn(IP_B, MAC_B, now, true);
    let _ = rx.neighbours_mut().learn(IP_A, MAC_A, now, true);
    let l = rx.listen(80, 4).expect("listen");
    let c = tx
        .connect(now, SocketAddrV4::new(IP_B, 80), None)
        .expect("connect");
    let mut q = VecDeque::new();
    let mut s: Option<SocketHandle> = None;
    let msg = Zbuf::from_vec(vec![0x5a; WRITE]);
    let (mut sent, mut got, mut idle) = (0u64, 0u64, 0u32);
    let mut fr = Frames::default();
    while got < a.bytes {
        now += STEP;
        while sent < a.bytes && tx.send_capacity(c) >= WRITE {
            let n = tx.send(c, &msg).expect("send");
            assert_eq!(n, WRITE, "a write that fits is taken whole");
            sent += WRITE as u64;
        }
        let m = luna_move(now, &mut tx, &mut rx, &mut q);
        fr.to_receiver += m;
        while let Some(ev) = rx.poll_event() {
            if let Event::Acceptable(_) = ev {
                s = s.or_else(|| rx.accept(l));
            }
        }
        let before = got;
        if let Some(h) = s {
            while let Ok(Some(z)) = rx.recv(h) {
                got += z.len() as u64;
            }
        }
        let k = luna_move(now, &mut rx, &mut tx, &mut q);
        fr.to_sender += k;
        while tx.poll_event().is_some() {}
        tx.handle_timeouts(now);
        rx.handle_timeouts(now);
        idle = if m + k == 0 && got == before {
            idle + 1
        } else {
            0
        };
        assert!(
            idle < STUCK_ROUNDS,
            "luna: no progress at {got} of {} bytes",
            a.bytes
        );
    }
    assert!(got >= a.bytes, "every byte delivered");
    fr
}

// ---- smoltcp ----

/// Free buffers of the wire, each the link's largest frame long (never shrunk, so taking
/// one writes no zeroes).
type Pool = Rc<RefCell<Vec<Vec<u8>>>>;

struct SmolDev {
    pool: Pool,
    frame: usize,
    rx: VecDeque<(Vec<u8>, usize)>,
    tx: Vec<(Vec<u8>, usize)>,
    offload: bool,
}

fn take(pool: &Pool, frame: usize) -> Vec<u8> {
    pool.borrow_mut().pop().unwrap_or_else(|| vec![0; frame])
}

struct RxTok {
    buf: Vec<u8>,
    len: usize,
    pool: Pool,
}

impl phy::RxToken for RxTok {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        let r = f(&self.buf[..self.len]);
        self.pool.borrow_mut().push(self.buf);
        r
    }
}

struct TxTok<'a> {
    tx: &'a mut Vec<(Vec<u8>, usize)>,
    pool: &'a Pool,
    frame: usize,
}

impl phy::TxToken for TxTok<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = take(self.pool, self.frame);
        let r = f(&mut buf[..len]);
        self.tx.push((buf, len));
        r
    }
}

impl phy::Device for SmolDev {
    type RxToken<'a> = RxTok;
    type TxToken<'a> = TxTok<'a>;

    fn receive(&mut self, _t: smoltcp::time::Instant) -> Option<(RxTok, TxTok<'_>)> {
        let (buf, len) = self.rx.pop_front()?;
        Some((
            RxTok {
                buf,
                len,
                pool: self.pool.clone(),
            },
            TxTok {
                tx: &mut self.tx,
                pool: &self.pool,
                frame: self.frame,
            },
        ))
    }

    fn transmit(&mut self, _t: smoltcp::time::Instant) -> Option<TxTok<'_>> {
        Some(TxTok {
            tx: &mut self.tx,
            pool: &self.pool,
            frame: self.frame,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = self.frame;
        if self.offload {
            c.checksum = ChecksumCapabilities::ignored();
        }
        c
    }
}

struct SmolHost {
    iface: Interface,
    dev: SmolDev,
    sockets: SocketSet<'static>,
}

fn smol_host(mac: [u8; 6], ip: [u8; 4], pool: &Pool, a: &Args) -> SmolHost {
    let mut dev = SmolDev {
        pool: pool.clone(),
        frame: usize::from(a.mtu) + 14,
        rx: VecDeque::new(),
        tx: Vec::new(),
        offload: a.offload,
    };
    let mut cfg = Config::new(HardwareAddress::Ethernet(SmolMac(mac)));
    cfg.random_seed = u64::from(mac[5]);
    let mut iface = Interface::new(cfg, &mut dev, smoltcp::time::Instant::from_micros(0));
    iface.update_ip_addrs(|v| {
        v.push(IpCidr::new(IpAddress::v4(ip[0], ip[1], ip[2], ip[3]), 24))
            .expect("one address fits");
    });
    SmolHost {
        iface,
        dev,
        sockets: SocketSet::new(Vec::new()),
    }
}

fn smol_socket() -> tcp::Socket<'static> {
    let mut s = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0u8; BUF]),
        tcp::SocketBuffer::new(vec![0u8; BUF]),
    );
    s.set_nagle_enabled(false);
    s.set_congestion_control(tcp::CongestionControl::Reno);
    s
}

/// The wire: each frame `from` sent, copied once into a pool buffer queued at `to`.
#[inline(never)]
fn wire_smoltcp(from: &mut SmolHost, to: &mut SmolHost) -> u64 {
    let n = from.dev.tx.len() as u64;
    for (buf, len) in from.dev.tx.drain(..) {
        let mut copy = take(&from.dev.pool, from.dev.frame);
        copy[..len].copy_from_slice(&buf[..len]);
        from.dev.pool.borrow_mut().push(buf);
        to.dev.rx.push_back((copy, len));
    }
    n
}

fn smol_poll(h: &mut SmolHost, now: Instant) {
    let t = smoltcp::time::Instant::from_micros(now.as_micros() as i64);
    h.iface.poll(t, &mut h.dev, &mut h.sockets);
}

fn run_smoltcp(a: &Args) -> Frames {
    let pool: Pool = Rc::new(RefCell::new(Vec::new()));
    let mut tx = smol_host([2, 0, 0, 0, 0, 1], [198, 18, 0, 1], &pool, a);
    let mut rx = smol_host([2, 0, 0, 0, 0, 2], [198, 18, 0, 2], &pool, a);
    let mut ls = smol_socket();
    ls.listen(80).expect("listen");
    let s = rx.sockets.add(ls);
    let mut cs = smol_socket();
    cs.connect(
        tx.iface.context(),
        (IpAddress::v4(198, 18, 0, 2), 80),
        49152,
    )
    .expect("connect");
    let c = tx.sockets.add(cs);
    let msg = vec![0x5a; WRITE];
    let mut now = Instant::from_millis(1);
    let (mut sent, mut got, mut idle) = (0u64, 0u64, 0u32);
    let mut fr = Frames::default();
    while got < a.bytes {
        now += STEP;
        {
            let sock = tx.sockets.get_mut::<tcp::Socket>(c);
            while sent < a.bytes
                && sock.may_send()
                && sock.send_capacity() - sock.send_queue() >= WRITE
            {
                let n = sock.send_slice(&msg).expect("send");
                assert_eq!(n, WRITE, "a write that fits is taken whole");
                sent += WRITE as u64;
            }
        }
        smol_poll(&mut tx, now);
        let m = wire_smoltcp(&mut tx, &mut rx);
        fr.to_receiver += m;
        smol_poll(&mut rx, now);
        let before = got;
        {
            let sock = rx.sockets.get_mut::<tcp::Socket>(s);
            while sock.can_recv() {
                match sock.recv(|b| (b.len(), b.len())) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n as u64,
                }
            }
        }
        // Reading opened the window: let the receiver say so in this round.
        smol_poll(&mut rx, now);
        let k = wire_smoltcp(&mut rx, &mut tx);
        fr.to_sender += k;
        idle = if m + k == 0 && got == before {
            idle + 1
        } else {
            0
        };
        assert!(
            idle < STUCK_ROUNDS,
            "smoltcp: no progress at {got} of {} bytes",
            a.bytes
        );
    }
    assert!(got >= a.bytes, "every byte delivered");
    fr
}

fn main() {
    let a = args();
    let fr = match a.stack.as_str() {
        "luna" => run_luna(&a),
        "smoltcp" => run_smoltcp(&a),
        other => panic!("stack must be luna or smoltcp, not {other}"),
    };
    println!(
        "stack={} bytes={} mtu={} offload={} frames_to_receiver={} frames_to_sender={}",
        a.stack, a.bytes, a.mtu, a.offload as u8, fr.to_receiver, fr.to_sender
    );
}
