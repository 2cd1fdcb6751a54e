//! The luna child: a `Stack` over a `DpdkDevice` (net_tap) in a minimal poll loop with an
//! impairment stage on its egress, running the four phases against kernel peers:
//!
//! | phase | luna | kernel | data |
//! |---|---|---|---|
//! | `bulk-luna-client` | connects, sends `bulk` bytes | `k-bulk-server` checks, answers GOOD | luna -> kernel |
//! | `bulk-kernel-client` | listens, checks, answers GOOD | `k-bulk-client` sends | kernel -> luna |
//! | `rpc-luna-client` | `rpcs` requests, `depth` outstanding | `k-rpc-server` | both |
//! | `rpc-kernel-client` | serves | `k-rpc-client` | both |
//!
//! Each phase ends with an orderly close started by the client (its FIN first, then the
//! server's), and prints one `PHASE k=v...` line: sizes, time, luna's counters (`l_*`),
//! the kernel's (`k_*`, from `nstat` in the namespace), the options luna negotiated
//! (`neg_*`) and what `ss -tin` shows for the kernel's socket (`ss_*`).

use std::collections::{BTreeMap, VecDeque};
use std::io::Read;
use std::net::SocketAddrV4;
use std::path::Path;
use std::process::Command;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dpdk_sys::Eal;
use luna_stack::context::Rng;
use luna_stack::stack::{Event, ListenerHandle, SocketHandle, Stack, StackConfig, Transmit};
use luna_stack::stack::{RecvError, SendError};
use luna_stack::tcp::{CloseReason, State};
use luna_stack::time::Instant as StackInstant;
use luna_stack::wire::Ipv4Cidr;
use r2c::device::dpdk::{from_testbed, DpdkDevice};
use r2c::device::Device;
use testbed::DpdkPort;
use zbuf::dpdk::DmaRegistry;
use zbuf::{copy_stats, CoreCache, Slab, SlabConfig, Zbuf};

use super::impair::{Stage, StageStats};
use super::kernel::PeerArgs;
use super::proc::Proc;
use super::report::{kernel_delta, luna_delta, parse_nstat, parse_ss, ss_kv};
use super::*;

/// Paths of the start handshake with the parent.
pub const READY_ENV: &str = "LIO_READY";
pub const GO_ENV: &str = "LIO_GO";
/// Path the parent creates once it stopped the kernel-side impairment engine (after this
/// child printed `PHASES_DONE`): every frame the engine corrupted has been sent by then.
pub const DRAIN_ENV: &str = "LIO_DRAIN";

pub fn main(arg: &str) {
    let plan = Plan::decode(arg).unwrap_or_else(|e| panic!("plan: {e}"));
    let port: DpdkPort =
        serde_json::from_str(&std::env::var(PORT_ENV).expect("port json")).expect("port");
    let ready = std::env::var(READY_ENV).expect("ready path");
    let go = std::env::var(GO_ENV).expect("go path");
    let mut env = setup(&port, &plan);
    std::fs::write(&ready, b"open").expect("ready file");
    // The parent configures the kernel side of the tap and starts tcpdump meanwhile.
    let end = Instant::now() + Duration::from_secs(120);
    while !Path::new(&go).exists() {
        assert!(Instant::now() < end, "no go from the parent");
        env.node.poll();
    }
    let kernel = port.peer_ip;
    let phases: [(&str, u16, &str); 4] = [
        ("bulk-luna-client", PORT_BULK_LUNA_CLIENT, "k-bulk-server"),
        (
            "bulk-kernel-client",
            PORT_BULK_KERNEL_CLIENT,
            "k-bulk-client",
        ),
        ("rpc-luna-client", PORT_RPC_LUNA_CLIENT, "k-rpc-server"),
        ("rpc-kernel-client", PORT_RPC_KERNEL_CLIENT, "k-rpc-client"),
    ];
    for (name, p, peer) in phases {
        let mut app: Box<dyn App> = match name {
            "bulk-luna-client" => Box::new(BulkSend::new(SocketAddrV4::new(kernel, p), &plan)),
            "bulk-kernel-client" => Box::new(BulkRecv::new(p, &plan)),
            "rpc-luna-client" => Box::new(RpcClient::new(SocketAddrV4::new(kernel, p), &plan)),
            _ => Box::new(RpcServer::new(p, &plan)),
        };
        let kv = run_phase(&mut env, &plan, name, p, peer, app.as_mut(), port.ip);
        println!("{}", kv.line("PHASE"));
    }
    // Answer retransmitted FINs of the last phase before the tap goes away.
    let linger = Instant::now() + Duration::from_secs(1);
    while Instant::now() < linger {
        env.node.poll();
    }
    // The parent stops the engine on the kernel's egress (its held packets are released
    // then); what it sent meanwhile is read here, so luna's checksum drops can be compared
    // with the engine's final count.
    println!("PHASES_DONE");
    let drain = std::env::var(DRAIN_ENV).expect("drain path");
    let end = Instant::now() + Duration::from_secs(120);
    while !Path::new(&drain).exists() {
        assert!(Instant::now() < end, "no drain signal from the parent");
        env.node.poll();
    }
    let settle = Instant::now() + Duration::from_millis(300);
    while Instant::now() < settle {
        env.node.poll();
    }
    let unsent = env.node.flush();
    let mut kv = finish(env);
    kv.set("tx_unsent", unsent);
    println!("{}", kv.line("OK"));
}

// ---------------------------------------------------------------- the node

/// ISN/cookie randomness from the OS.
struct OsRng(std::fs::File);

impl Rng for OsRng {
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.0.read_exact(dest).expect("/dev/urandom");
    }
}

type Luna = Stack<OsRng>;

/// A Stack over a DpdkDevice: receive, timers, transmit through the impairment stage.
struct Node {
    dev: DpdkDevice,
    stack: Luna,
    epoch: Instant,
    rx: Vec<Zbuf>,
    tx: VecDeque<Transmit>,
    stage: Option<Stage<Transmit>>,
    /// Buffers for corrupted payload copies (and the apps' data).
    cache: CoreCache,
}

/// Flips one bit of `t`'s TCP segment chosen by `r`, outside the 4-bit data offset (a flip
/// there makes Linux discard the segment before its checksum, `tcp_v4_rcv`; see
/// testbed's nfq.rs), after luna computed the checksums, which stay as they were: the
/// receiver's TCP checksum must catch it. A payload bit is flipped in a copy (the
/// payload's buffers are shared with the retransmit queue). Returns false for a frame
/// that is not IPv4 TCP or when no buffer is free (then nothing changed).
fn corrupt_tcp(t: &mut Transmit, r: u64, cache: &CoreCache) -> bool {
    let h = t.header();
    if h.len() < 14 + 20 || h[12..14] != [0x08, 0x00] || h[14] >> 4 != 4 || h[14 + 9] != 6 {
        return false;
    }
    let tcp = 14 + usize::from(h[14] & 0x0f) * 4;
    if h.len() < tcp + 20 {
        return false;
    }
    let in_header = h.len() - tcp;
    let len = in_header + t.payload.len();
    let bits = len as u64 * 8 - 4;
    let mut bit = (r % bits) as usize;
    if bit >= 12 * 8 {
        bit += 4; // skip the data offset: the high nibble of TCP byte 12
    }
    let (byte, mask) = (bit / 8, 0x80u8 >> (bit % 8));
    if byte < in_header {
        t.header_mut()[tcp + byte] ^= mask;
        return true;
    }
    let n = t.payload.len();
    let Ok(mut m) = cache.alloc(n) else {
        return false;
    };
    let Ok(buf) = m.append(n) else {
        return false;
    };
    let mut at = 0;
    for c in t.payload.chunks() {
        buf[at..at + c.len()].copy_from_slice(c);
        at += c.len();
    }
    buf[byte - in_header] ^= mask;
    let mut v = zbuf::IoVec::new();
    v.push(m.freeze());
    t.payload = v;
    true
}

fn is_ipv4(t: &Transmit) -> bool {
    t.header().get(12..14) == Some(&[0x08, 0x00][..])
}

impl Node {
    fn now(&self) -> StackInstant {
        StackInstant::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    fn poll(&mut self) {
        let now = self.now();
        let ns = self.epoch.elapsed().as_nanos() as u64;
        let n = self.dev.rx_burst(&mut self.rx, 64);
        // The burst in one call, as r2c's poll loop (receive coalescing).
        self.stack.handle_frames(now, self.rx.drain(..));
        if self.stack.poll_timeout().is_some_and(|t| t <= now) {
            self.stack.handle_timeouts(now);
        }
        let mut sent = 0;
        loop {
            while self.tx.len() < 64 {
                match self.stack.poll_transmit(now) {
                    // Only IPv4 is impaired, as on the testbed engine (ARP passes).
                    Some(t) => match self.stage.as_mut() {
                        Some(s) if is_ipv4(&t) => {
                            let cache = &self.cache;
                            s.push_with(ns, t, &mut self.tx, |t, r| corrupt_tcp(t, r, cache))
                        }
                        _ => self.tx.push_back(t),
                    },
                    None => break,
                }
            }
            if let Some(s) = self.stage.as_mut() {
                s.release(ns, &mut self.tx);
            }
            if self.tx.is_empty() {
                break;
            }
            let k = self.dev.tx_burst(&mut self.tx);
            sent += k;
            if k == 0 {
                break; // ring full: the rest goes next iteration
            }
        }
        if n == 0 && sent == 0 {
            std::thread::yield_now();
        }
    }

    /// Sends everything the stage holds and every queued frame, without asking the stack
    /// for more (bounded: 1 s); returns the frames left unsent.
    fn flush(&mut self) -> usize {
        if let Some(s) = self.stage.as_mut() {
            s.release(u64::MAX, &mut self.tx);
        }
        let end = Instant::now() + Duration::from_secs(1);
        while !self.tx.is_empty() && Instant::now() < end {
            if self.dev.tx_burst(&mut self.tx) == 0 {
                std::thread::yield_now();
            }
        }
        self.tx.len()
    }

    fn stage_stats(&self) -> StageStats {
        self.stage.as_ref().map(|s| s.stats).unwrap_or_default()
    }
}

struct Env {
    _eal: Eal,
    slab: Slab,
    node: Node,
}

fn setup(port: &DpdkPort, plan: &Plan) -> Env {
    let (args, cfg) = from_testbed(port).expect("testbed port");
    let eal = Eal::init(args).unwrap_or_else(|e| panic!("EAL: {e}"));
    let reg = DmaRegistry::new(&eal);
    let slab = Slab::new(reg.slab_config(SlabConfig::new().max_memory(160 << 20))).expect("slab");
    let cache = slab.core_cache(0).expect("core cache");
    let dev = DpdkDevice::open(&eal, &slab, &reg, &cfg).unwrap_or_else(|e| panic!("open: {e}"));
    let mut sc = StackConfig::new(
        dev.mac(),
        Ipv4Cidr::new(port.ip, port.prefix_len).expect("cidr"),
    );
    sc.mtu = dev.mtu();
    sc.caps = dev.caps();
    let rng = OsRng(std::fs::File::open("/dev/urandom").expect("urandom"));
    let stack = Stack::new(sc, rng).expect("stack config");
    Env {
        _eal: eal,
        slab,
        node: Node {
            dev,
            stack,
            epoch: Instant::now(),
            rx: Vec::with_capacity(64),
            tx: VecDeque::new(),
            stage: plan.impair.map(|i| Stage::new(i, plan.seed)),
            cache,
        },
    }
}

fn finish(env: Env) -> Kv {
    let Env { _eal, slab, node } = env;
    let mut kv = Kv::default();
    let st = node.stage_stats();
    kv.set("stage_seen", st.seen);
    kv.set("stage_dropped", st.dropped);
    kv.set("stage_duplicated", st.duplicated);
    kv.set("stage_delayed", st.delayed);
    kv.set("stage_reordered", st.reordered);
    kv.set("stage_corrupted", st.corrupted);
    // Corruption is caught only if luna computed the checksums itself (net_tap: no
    // offload; a device finishing them would checksum the flipped bits).
    kv.set(
        "sw_checksums",
        u8::from(node.dev.caps() == luna_stack::wire::ChecksumCaps::software()),
    );
    let sc = node.stack.counters();
    kv.set("stack_frames_in", sc.frames_in);
    kv.set("stack_frames_out", sc.frames_out);
    kv.set("stack_burst_frames", sc.burst_frames);
    kv.set("stack_coalesced_segments", sc.coalesced_segments);
    kv.set("stack_drops", sc.total_drops());
    kv.set(
        "stack_malformed",
        sc.drops(luna_stack::stack::StackDrop::Malformed),
    );
    kv.set("stack_rsts_sent", sc.rsts_sent);
    let ds = node.dev.stats();
    let dd = node.dev.dpdk_stats();
    kv.set("dev_rx_frames", ds.rx_frames);
    kv.set("dev_tx_frames", ds.tx_frames);
    kv.set("dev_rx_missed", ds.rx_missed);
    kv.set("dev_copied", ds.copied_bytes);
    kv.set("dev_tx_invalid", dd.tx_invalid);
    kv.set("zbuf_copied", copy_stats().bytes);
    drop(node); // and its core cache
    kv.set("leaked", slab.leak_report().objects_in_use);
    kv
}

// ---------------------------------------------------------------- applications

/// One phase's luna side.
trait App {
    /// Before the kernel peer starts (a server listens here).
    fn prepare(&mut self, _s: &mut Luna) {}
    /// After the kernel peer is up (a client connects here).
    fn start(&mut self, _s: &mut Luna, _now: StackInstant) {}
    fn on_event(&mut self, _s: &mut Luna, _ev: Event) {}
    /// Moves data; an `Err` fails the phase.
    fn step(&mut self, s: &mut Luna, cache: &CoreCache) -> Result<(), String>;
    fn conn(&self) -> Option<SocketHandle>;
    /// Share of the work done, 0..=1.
    fn progress(&self) -> f64;
    /// Data exchanged and verified, and our FIN queued.
    fn done(&self) -> bool;
    /// Payload bytes moved (both directions).
    fn bytes(&self) -> u64;
    fn report(&self, kv: &mut Kv);
}

fn send_err(e: SendError) -> String {
    format!("send: {e:?}")
}

/// Sends what the connection takes from `q`, keeping the rest (zero copy: slices).
fn drain(s: &mut Luna, h: SocketHandle, q: &mut VecDeque<Zbuf>) -> Result<(), String> {
    while let Some(z) = q.pop_front() {
        match s.send(h, &z) {
            Ok(n) if n == z.len() => {}
            Ok(n) => {
                q.push_front(z.slice(n..));
                return Ok(());
            }
            Err(SendError::WouldBlock) => {
                q.push_front(z);
                return Ok(());
            }
            Err(e) => return Err(send_err(e)),
        }
    }
    Ok(())
}

fn accept_one(s: &mut Luna, l: ListenerHandle, h: &mut Option<SocketHandle>) {
    if h.is_none() {
        *h = s.accept(l);
    }
}

fn connected(s: &Luna, h: SocketHandle) -> Result<bool, String> {
    match s.state(h) {
        Some(State::Closed) => Err(format!(
            "connection closed before it was established: {:?}",
            s.close_reason(h)
        )),
        Some(st) => Ok(st.is_synchronized()),
        None => Err("stale handle".into()),
    }
}

/// A pattern stream produced in place in 16 KiB slab buffers.
struct Source {
    seed: u64,
    total: u64,
    made: u64,
    q: VecDeque<Zbuf>,
}

impl Source {
    fn new(seed: u64, total: u64) -> Self {
        Source {
            seed,
            total,
            made: 0,
            q: VecDeque::new(),
        }
    }

    fn pump(&mut self, s: &mut Luna, h: SocketHandle, cache: &CoreCache) -> Result<(), String> {
        loop {
            drain(s, h, &mut self.q)?;
            if !self.q.is_empty() || self.made == self.total {
                return Ok(());
            }
            let n = (self.total - self.made).min(16 * 1024 - 128) as usize;
            let mut m = cache.alloc(n).map_err(|e| format!("slab: {e:?}"))?;
            fill(self.seed, self.made, m.append(n).expect("room"));
            self.made += n as u64;
            self.q.push_back(m.freeze());
        }
    }

    fn done(&self) -> bool {
        self.made == self.total && self.q.is_empty()
    }
}

/// Reads and checks a pattern stream; `Ok(true)` at end of stream.
fn sink(s: &mut Luna, h: SocketHandle, seed: u64, got: &mut u64) -> Result<bool, String> {
    loop {
        match s.recv(h) {
            Ok(Some(z)) => {
                if let Some(at) = mismatch(seed, *got, &z) {
                    return Err(format!("received byte {at} differs from the pattern"));
                }
                *got += z.len() as u64;
            }
            Ok(None) => return Ok(false),
            Err(RecvError::Finished) => return Ok(true),
            Err(e) => {
                return Err(format!(
                    "recv: {e:?} after {got} bytes ({:?})",
                    s.close_reason(h)
                ))
            }
        }
    }
}

/// `bulk-luna-client`: luna sends, the kernel answers GOOD.
struct BulkSend {
    to: SocketAddrV4,
    h: Option<SocketHandle>,
    src: Source,
    verdict: Vec<u8>,
    shut: bool,
    eof: bool,
}

impl BulkSend {
    fn new(to: SocketAddrV4, plan: &Plan) -> Self {
        BulkSend {
            to,
            h: None,
            src: Source::new(SEED_BULK_UP, plan.bulk),
            verdict: Vec::new(),
            shut: false,
            eof: false,
        }
    }
}

impl App for BulkSend {
    fn start(&mut self, s: &mut Luna, now: StackInstant) {
        self.h = Some(s.connect(now, self.to, None).expect("connect"));
    }
    fn step(&mut self, s: &mut Luna, cache: &CoreCache) -> Result<(), String> {
        let h = self.h.expect("started");
        if !connected(s, h)? {
            return Ok(());
        }
        if !self.shut {
            self.src.pump(s, h, cache)?;
            if self.src.done() {
                s.shutdown(h);
                self.shut = true;
            }
        }
        while !self.eof {
            match s.recv(h) {
                Ok(Some(z)) => self.verdict.extend_from_slice(&z),
                Ok(None) => break,
                Err(RecvError::Finished) => {
                    self.eof = true;
                    if self.verdict != b"GOOD" {
                        return Err(format!("kernel verdict {:?}", self.verdict));
                    }
                }
                Err(e) => return Err(format!("recv verdict: {e:?} ({:?})", s.close_reason(h))),
            }
        }
        Ok(())
    }
    fn conn(&self) -> Option<SocketHandle> {
        self.h
    }
    fn progress(&self) -> f64 {
        self.src.made as f64 / self.src.total.max(1) as f64
    }
    fn done(&self) -> bool {
        self.shut && self.eof
    }
    fn bytes(&self) -> u64 {
        self.src.made
    }
    fn report(&self, kv: &mut Kv) {
        kv.set("bytes", self.src.made);
    }
}

/// `bulk-kernel-client`: the kernel sends, luna checks and answers GOOD.
struct BulkRecv {
    port: u16,
    total: u64,
    l: Option<ListenerHandle>,
    h: Option<SocketHandle>,
    got: u64,
    eof: bool,
    reply: VecDeque<Zbuf>,
    shut: bool,
}

impl BulkRecv {
    fn new(port: u16, plan: &Plan) -> Self {
        BulkRecv {
            port,
            total: plan.bulk,
            l: None,
            h: None,
            got: 0,
            eof: false,
            reply: VecDeque::new(),
            shut: false,
        }
    }
}

impl App for BulkRecv {
    fn prepare(&mut self, s: &mut Luna) {
        self.l = Some(s.listen(self.port, 4).expect("listen"));
    }
    fn on_event(&mut self, s: &mut Luna, ev: Event) {
        if let (Event::Acceptable(l), Some(mine)) = (ev, self.l) {
            if l == mine {
                accept_one(s, l, &mut self.h);
            }
        }
    }
    fn step(&mut self, s: &mut Luna, _cache: &CoreCache) -> Result<(), String> {
        let Some(h) = self.h else { return Ok(()) };
        if !self.eof && sink(s, h, SEED_BULK_DOWN, &mut self.got)? {
            self.eof = true;
            if self.got != self.total {
                return Err(format!("end of stream after {} bytes", self.got));
            }
            self.reply.push_back(Zbuf::from_static(b"GOOD"));
        }
        if self.eof && !self.shut {
            drain(s, h, &mut self.reply)?;
            if self.reply.is_empty() {
                s.shutdown(h);
                self.shut = true;
                if let Some(l) = self.l.take() {
                    s.unlisten(l);
                }
            }
        }
        Ok(())
    }
    fn conn(&self) -> Option<SocketHandle> {
        self.h
    }
    fn progress(&self) -> f64 {
        self.got as f64 / self.total.max(1) as f64
    }
    fn done(&self) -> bool {
        self.shut
    }
    fn bytes(&self) -> u64 {
        self.got
    }
    fn report(&self, kv: &mut Kv) {
        kv.set("bytes", self.got);
    }
}

/// `rpc-luna-client`: `depth` requests outstanding, every response checked.
struct RpcClient {
    to: SocketAddrV4,
    h: Option<SocketHandle>,
    n: u64,
    size: usize,
    depth: u64,
    issued: u64,
    resp_bytes: u64,
    q: VecDeque<Zbuf>,
    shut: bool,
    eof: bool,
}

impl RpcClient {
    fn new(to: SocketAddrV4, plan: &Plan) -> Self {
        RpcClient {
            to,
            h: None,
            n: plan.rpcs,
            size: plan.rpc_size,
            depth: plan.depth as u64,
            issued: 0,
            resp_bytes: 0,
            q: VecDeque::new(),
            shut: false,
            eof: false,
        }
    }

    fn completed(&self) -> u64 {
        self.resp_bytes / self.size as u64
    }
}

impl App for RpcClient {
    fn start(&mut self, s: &mut Luna, now: StackInstant) {
        self.h = Some(s.connect(now, self.to, None).expect("connect"));
    }
    fn step(&mut self, s: &mut Luna, cache: &CoreCache) -> Result<(), String> {
        let h = self.h.expect("started");
        if !connected(s, h)? {
            return Ok(());
        }
        let size = self.size as u64;
        while self.issued < self.n && self.issued - self.completed() < self.depth {
            let mut m = cache.alloc(self.size).map_err(|e| format!("slab: {e:?}"))?;
            fill(
                SEED_REQ,
                self.issued * size,
                m.append(self.size).expect("room"),
            );
            self.q.push_back(m.freeze());
            self.issued += 1;
        }
        drain(s, h, &mut self.q)?;
        if !self.eof && sink(s, h, SEED_RESP, &mut self.resp_bytes)? {
            self.eof = true;
            if !self.shut {
                return Err(format!(
                    "the server closed after {} responses",
                    self.completed()
                ));
            }
        }
        if self.resp_bytes > self.n * size {
            return Err(format!(
                "{} response bytes, more than asked",
                self.resp_bytes
            ));
        }
        if !self.shut && self.completed() == self.n {
            s.shutdown(h);
            self.shut = true;
        }
        Ok(())
    }
    fn conn(&self) -> Option<SocketHandle> {
        self.h
    }
    fn progress(&self) -> f64 {
        self.completed() as f64 / self.n.max(1) as f64
    }
    fn done(&self) -> bool {
        self.shut && self.eof
    }
    fn bytes(&self) -> u64 {
        self.issued * self.size as u64 + self.resp_bytes
    }
    fn report(&self, kv: &mut Kv) {
        kv.set("rpcs", self.completed());
        kv.set("bytes", self.bytes());
    }
}

/// `rpc-kernel-client`: a response for every complete (checked) request.
struct RpcServer {
    port: u16,
    n: u64,
    size: usize,
    l: Option<ListenerHandle>,
    h: Option<SocketHandle>,
    req_bytes: u64,
    served: u64,
    q: VecDeque<Zbuf>,
    eof: bool,
    shut: bool,
}

impl RpcServer {
    fn new(port: u16, plan: &Plan) -> Self {
        RpcServer {
            port,
            n: plan.rpcs,
            size: plan.rpc_size,
            l: None,
            h: None,
            req_bytes: 0,
            served: 0,
            q: VecDeque::new(),
            eof: false,
            shut: false,
        }
    }
}

impl App for RpcServer {
    fn prepare(&mut self, s: &mut Luna) {
        self.l = Some(s.listen(self.port, 4).expect("listen"));
    }
    fn on_event(&mut self, s: &mut Luna, ev: Event) {
        if let (Event::Acceptable(l), Some(mine)) = (ev, self.l) {
            if l == mine {
                accept_one(s, l, &mut self.h);
            }
        }
    }
    fn step(&mut self, s: &mut Luna, cache: &CoreCache) -> Result<(), String> {
        let Some(h) = self.h else { return Ok(()) };
        let size = self.size as u64;
        if !self.eof && sink(s, h, SEED_REQ, &mut self.req_bytes)? {
            self.eof = true;
            if self.req_bytes != self.n * size {
                return Err(format!(
                    "end of stream after {} request bytes",
                    self.req_bytes
                ));
            }
        }
        if self.req_bytes > self.n * size {
            return Err(format!(
                "{} request bytes, more than planned",
                self.req_bytes
            ));
        }
        while self.served < self.req_bytes / size {
            let mut m = cache.alloc(self.size).map_err(|e| format!("slab: {e:?}"))?;
            fill(
                SEED_RESP,
                self.served * size,
                m.append(self.size).expect("room"),
            );
            self.q.push_back(m.freeze());
            self.served += 1;
        }
        drain(s, h, &mut self.q)?;
        if self.eof && self.q.is_empty() && !self.shut {
            s.shutdown(h);
            self.shut = true;
            if let Some(l) = self.l.take() {
                s.unlisten(l);
            }
        }
        Ok(())
    }
    fn conn(&self) -> Option<SocketHandle> {
        self.h
    }
    fn progress(&self) -> f64 {
        self.served as f64 / self.n.max(1) as f64
    }
    fn done(&self) -> bool {
        self.shut
    }
    fn bytes(&self) -> u64 {
        self.req_bytes + self.served * self.size as u64
    }
    fn report(&self, kv: &mut Kv) {
        kv.set("rpcs", self.served);
        kv.set("bytes", self.bytes());
    }
}

// ---------------------------------------------------------------- phases

fn nstat() -> BTreeMap<String, u64> {
    // -a: absolute values, -s: leave the shared history file alone.
    let out = Command::new("nstat")
        .args(["-a", "-s", "-z"])
        .output()
        .expect("nstat (iproute2)");
    parse_nstat(&String::from_utf8_lossy(&out.stdout))
}

/// `ss -tino` (`-o` is what makes ss print `ts` and `sack`) for the kernel's end of the phase's connection, on a thread (the poll loop
/// must not stall).
fn ss_sample(port: u16) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let filter = format!("( sport = :{port} or dport = :{port} )");
        Command::new("ss")
            .args(["-tinoH", "state", "established", &filter])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    })
}

fn spawn_peer(role: &str, args: &PeerArgs) -> Proc {
    let exe = std::env::current_exe().expect("test binary");
    let mut c = Command::new(exe);
    c.args(["role_child", "--exact", "--ignored", "--nocapture"])
        .env(ROLE_ENV, role)
        .env(ARG_ENV, args.encode())
        .env_remove(PORT_ENV);
    Proc::spawn(c, role, false).unwrap_or_else(|e| panic!("{e}"))
}

#[allow(clippy::too_many_arguments)]
fn run_phase(
    env: &mut Env,
    plan: &Plan,
    name: &str,
    port: u16,
    peer_role: &str,
    app: &mut dyn App,
    luna_ip: std::net::Ipv4Addr,
) -> Kv {
    let mut kv = Kv::default();
    kv.set("name", name);
    let fail = |what: String, peer: Option<Proc>| -> ! {
        let dump = peer.map(|p| p.wait(Duration::from_secs(5)).dump());
        panic!("phase {name}: {what}\n{}", dump.unwrap_or_default());
    };
    let n0 = nstat();
    let c0 = env.node.stack.tcp_counters();
    let s0 = env.node.stage_stats();
    app.prepare(&mut env.node.stack);
    let args = PeerArgs {
        port,
        luna: luna_ip,
        bytes: plan.bulk,
        rpcs: plan.rpcs,
        rpc_size: plan.rpc_size,
        depth: plan.depth,
        limit: plan.phase_limit,
    };
    let mut peer = spawn_peer(peer_role, &args);
    if peer_role.ends_with("server") {
        let end = Instant::now() + Duration::from_secs(30);
        while peer.try_line("LISTENING").is_none() {
            if Instant::now() > end || peer.exited() {
                fail("the kernel server did not listen".into(), Some(peer));
            }
            env.node.poll();
        }
    }
    let started = Instant::now();
    let end = started + plan.phase_limit;
    let now = env.node.now();
    app.start(&mut env.node.stack, now);
    let mut ss: Option<JoinHandle<String>> = None;
    let mut negotiated = false;
    let mut peer_gone_at: Option<Instant> = None;
    let close = loop {
        env.node.poll();
        while let Some(ev) = env.node.stack.poll_event() {
            app.on_event(&mut env.node.stack, ev);
        }
        // While `ss` samples the kernel's socket, the application makes no progress (the
        // stack still answers): a transfer that finished before the `ss` process ran
        // (4 MiB in 0.2 s on the clean link) left nothing established to sample.
        let sampling = ss.as_ref().is_some_and(|t| !t.is_finished());
        if !sampling {
            if let Err(e) = app.step(&mut env.node.stack, &env.node.cache) {
                fail(e, Some(peer));
            }
        }
        let h = app.conn();
        let c = h.and_then(|h| env.node.stack.connection(h));
        if let (false, Some(c)) = (negotiated, c) {
            if c.state().is_synchronized() {
                negotiated = true;
                let (sack, ts, ws) = c.negotiated();
                kv.set("neg_sack", u8::from(sack));
                kv.set("neg_ts", u8::from(ts));
                if let Some((snd, rcv)) = ws {
                    kv.set("neg_snd_wscale", snd);
                    kv.set("neg_rcv_wscale", rcv);
                }
                kv.set("neg_mss", c.mss());
            }
        }
        if ss.is_none() && app.progress() >= 0.3 {
            ss = Some(ss_sample(port));
        }
        if app.done() {
            match c.map(|c| (c.state(), c.close_reason())) {
                Some((State::TimeWait, _)) => break "time_wait",
                Some((State::Closed, Some(CloseReason::Normal))) => break "closed",
                Some((State::Closed, r)) => fail(format!("closed with {r:?}"), Some(peer)),
                _ => {}
            }
        }
        if Instant::now() > end {
            let st = c.map(|c| c.state());
            fail(
                format!(
                    "timeout after {:?}: progress {:.3}, {} bytes, state {st:?}",
                    plan.phase_limit,
                    app.progress(),
                    app.bytes()
                ),
                Some(peer),
            );
        }
        // A peer that exited (failed) before we are done: give in-flight data a moment.
        if peer.exited() {
            let t = *peer_gone_at.get_or_insert_with(Instant::now);
            if t.elapsed() > Duration::from_secs(10) {
                fail("the kernel peer exited first".into(), Some(peer));
            }
        }
    };
    let secs = started.elapsed().as_secs_f64();
    let h = app.conn().expect("a connection");
    let c1 = env.node.stack.tcp_counters();
    let s1 = env.node.stage_stats();
    env.node.stack.close(h);
    // The kernel peer exits after its close; keep answering it meanwhile.
    let pend = Instant::now() + Duration::from_secs(30);
    while !peer.exited() && Instant::now() < pend {
        env.node.poll();
    }
    let out = peer.wait(Duration::from_secs(5));
    let Some(kline) = out.line("KPEER ok").map(Kv::parse) else {
        panic!("phase {name}: the kernel peer failed\n{}", out.dump());
    };
    for (k, v) in kline.0 {
        kv.0.insert(format!("kp_{k}"), v);
    }
    match ss.map(|t| t.join().unwrap_or_default()) {
        Some(text) => {
            if let Some(info) = parse_ss(&text) {
                ss_kv(&mut kv, &info);
            }
            let raw: Vec<&str> = text.split_whitespace().collect();
            kv.set("ss_raw", raw.join("_"));
        }
        None => kv.set("ss_raw", "not-sampled"),
    }
    app.report(&mut kv);
    kv.set("secs", format!("{secs:.3}"));
    kv.set(
        "goodput_mbit",
        format!("{:.1}", app.bytes() as f64 * 8.0 / secs / 1e6),
    );
    kv.set("close", close);
    luna_delta(&mut kv, &c0, &c1);
    kernel_delta(&mut kv, &n0, &nstat());
    kv.set("stage_dropped", s1.dropped - s0.dropped);
    kv.set("stage_duplicated", s1.duplicated - s0.duplicated);
    kv.set("stage_reordered", s1.reordered - s0.reordered);
    kv.set("stage_corrupted", s1.corrupted - s0.corrupted);
    kv
}
