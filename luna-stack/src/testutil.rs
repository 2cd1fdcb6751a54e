//! Reusable simulation pieces for tests, fuzz targets, benchmarks and examples (feature
//! `testutils`): a seeded impaired in-memory Ethernet link, an endpoint driver for
//! [`Stack`], a two-endpoint simulator on virtual time and frame helpers for scripted peers.
//!
//! Everything runs on virtual time: nothing sleeps, and a run is fully determined by its
//! seeds.

use crate::context::Rng;
use crate::stack::{Stack, StackConfig};
use crate::tcp::SeqNum;
use crate::time::{Duration, Instant};
use crate::wire::{
    ChecksumCaps, EtherType, EthernetAddress, EthernetFrame, EthernetRepr, IpProtocol, Ipv4Addr,
    Ipv4Cidr, Ipv4Packet, Ipv4Repr, TcpPacket, TcpRepr,
};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt::Write as _;
use zbuf::Zbuf;

pub use crate::context::testutil::FakeRng;

/// MAC of endpoint A in the canned two-host setup.
pub const MAC_A: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x0a]);
/// MAC of endpoint B in the canned two-host setup.
pub const MAC_B: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x0b]);
/// Address of endpoint A (the benchmarking range, RFC 2544).
pub const IP_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// Address of endpoint B.
pub const IP_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

/// A stack configuration for `mac`/`ip` on 198.18.0.0/24 with defaults otherwise.
pub fn stack_config(mac: EthernetAddress, ip: Ipv4Addr) -> StackConfig {
    StackConfig::new(mac, Ipv4Cidr::new(ip, 24).expect("/24 is a valid prefix"))
}

/// Which way a frame travels on the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dir {
    /// From endpoint A to endpoint B.
    AtoB,
    /// From endpoint B to endpoint A.
    BtoA,
}

impl Dir {
    fn arrow(self) -> &'static str {
        match self {
            Dir::AtoB => "A->B",
            Dir::BtoA => "B->A",
        }
    }
}

/// Impairments of a [`SimLink`]. Probabilities are in parts per million, applied per frame
/// with the link's own seeded generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkConfig {
    /// One-way propagation delay.
    pub delay: Duration,
    /// Uniform random extra delay in `[0, jitter]` (small jitter keeps FIFO order mostly).
    pub jitter: Duration,
    /// Loss probability (ppm).
    pub loss_ppm: u32,
    /// Duplication probability (ppm): the copy arrives a little later.
    pub dup_ppm: u32,
    /// Reordering probability (ppm): the frame is held back by up to `reorder_delay`.
    pub reorder_ppm: u32,
    /// How long a reordered frame is held back at most.
    pub reorder_delay: Duration,
    /// Corruption probability (ppm) of IPv4 frames: one bit past the Ethernet header is
    /// flipped, which the IPv4 or TCP checksum must catch (ARP has no checksum and is never
    /// corrupted).
    pub corrupt_ppm: u32,
    /// Serialization rate in bytes per second (`None`: infinitely fast). With a rate, frames
    /// queue behind each other per direction.
    pub rate: Option<u64>,
    /// Drop-tail limit of the queue per direction in bytes when `rate` is set.
    pub queue_limit: Option<usize>,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            delay: Duration::from_micros(50),
            jitter: Duration::ZERO,
            loss_ppm: 0,
            dup_ppm: 0,
            reorder_ppm: 0,
            reorder_delay: Duration::ZERO,
            corrupt_ppm: 0,
            rate: None,
            queue_limit: None,
        }
    }
}

impl LinkConfig {
    /// A lossless link with one-way delay `delay`.
    pub fn clean(delay: Duration) -> Self {
        LinkConfig {
            delay,
            ..LinkConfig::default()
        }
    }

    /// Random impairments drawn from `seed`: up to 3% loss, 2% duplication, 3% reordering,
    /// 1% corruption, and 10-200 µs delay with jitter.
    pub fn impaired(seed: u64) -> Self {
        let mut r = FakeRng::new(seed ^ 0x11A7_11A7);
        let delay = Duration::from_micros(10 + u64::from(r.next_u32() % 190));
        LinkConfig {
            delay,
            jitter: Duration::from_micros(u64::from(r.next_u32() % 20)),
            loss_ppm: r.next_u32() % 30_000,
            dup_ppm: r.next_u32() % 20_000,
            reorder_ppm: r.next_u32() % 30_000,
            reorder_delay: delay * 2,
            corrupt_ppm: r.next_u32() % 10_000,
            rate: None,
            queue_limit: None,
        }
    }
}

/// What the link did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Delivered as sent.
    Sent,
    /// Lost at random.
    Lost,
    /// Dropped by the scripted drop rule.
    DroppedByRule,
    /// Dropped at the tail of a full queue.
    QueueFull,
    /// Delivered late (reordered).
    Reordered,
    /// Delivered twice.
    Duplicated,
    /// Delivered with one bit flipped.
    Corrupted,
}

/// Counters of a [`SimLink`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames offered, per direction (index 0: A→B).
    pub offered: [u64; 2],
    /// Frames delivered so far (duplicates included).
    pub delivered: [u64; 2],
    /// Frames lost at random or by rule or queue limit.
    pub lost: [u64; 2],
    /// Extra copies delivered.
    pub duplicated: [u64; 2],
    /// Frames held back.
    pub reordered: [u64; 2],
    /// Frames delivered corrupted (one flipped bit) so far, duplicate copies included.
    pub corrupted: [u64; 2],
}

fn dir_idx(d: Dir) -> usize {
    match d {
        Dir::AtoB => 0,
        Dir::BtoA => 1,
    }
}

/// A scripted drop rule: `(now, direction, frame, index of the frame in its direction)` →
/// drop it? It sees every frame offered, so it doubles as an observer.
pub type DropRule = Box<dyn FnMut(Instant, Dir, &[u8], u64) -> bool>;

/// One line of the link's trace.
#[derive(Debug, Clone)]
pub struct TraceEntry {
    /// When the frame was offered.
    pub at: Instant,
    /// Its direction.
    pub dir: Dir,
    /// What the link did.
    pub fate: Fate,
    /// The frame as sent (formatted only when the trace is dumped: formatting every frame
    /// would dominate a debug-build run).
    pub frame: Vec<u8>,
}

/// A frame on the wire: (deliver at, tie-break sequence, direction, frame, corrupted).
type InFlight = (Instant, u64, Dir, Vec<u8>, bool);

/// A seeded, impaired, in-memory Ethernet link between two endpoints.
pub struct SimLink {
    cfg: LinkConfig,
    rng: FakeRng,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    /// Per direction: when the serializer is free, and bytes queued (rate limiting).
    busy_until: [Instant; 2],
    in_queue: [VecDeque<(Instant, usize)>; 2],
    stats: LinkStats,
    rule: Option<DropRule>,
    trace: VecDeque<TraceEntry>,
    trace_len: usize,
}

impl SimLink {
    /// A link with impairments `cfg` driven by `seed`.
    pub fn new(cfg: LinkConfig, seed: u64) -> Self {
        SimLink {
            cfg,
            rng: FakeRng::new(seed),
            queue: BinaryHeap::new(),
            seq: 0,
            busy_until: [Instant::ZERO; 2],
            in_queue: [VecDeque::new(), VecDeque::new()],
            stats: LinkStats::default(),
            rule: None,
            trace: VecDeque::new(),
            trace_len: 64,
        }
    }

    /// The impairments.
    pub fn config(&self) -> &LinkConfig {
        &self.cfg
    }

    /// Change the impairments (e.g. heal the link to finish a run).
    pub fn set_config(&mut self, cfg: LinkConfig) {
        self.cfg = cfg;
    }

    /// Install a scripted drop rule, applied before the random impairments.
    pub fn set_drop_rule(&mut self, rule: DropRule) {
        self.rule = Some(rule);
    }

    /// Remove the scripted drop rule.
    pub fn clear_drop_rule(&mut self) {
        self.rule = None;
    }

    /// How many frames the trace keeps (default 64).
    pub fn set_trace_len(&mut self, n: usize) {
        self.trace_len = n;
    }

    /// The counters.
    pub fn stats(&self) -> LinkStats {
        self.stats
    }

    fn chance(&mut self, ppm: u32) -> bool {
        ppm > 0 && self.rng.next_u32() % 1_000_000 < ppm
    }

    fn rand_dur(&mut self, max: Duration) -> Duration {
        let n = max.as_nanos() as u64;
        if n == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.rng.next_u64() % (n + 1))
    }

    fn note(&mut self, at: Instant, dir: Dir, fate: Fate, frame: &[u8]) {
        if self.trace_len == 0 {
            return;
        }
        let mut buf = if self.trace.len() >= self.trace_len {
            self.trace.pop_front().map(|e| e.frame).unwrap_or_default()
        } else {
            Vec::new()
        };
        buf.clear();
        buf.extend_from_slice(frame);
        self.trace.push_back(TraceEntry {
            at,
            dir,
            fate,
            frame: buf,
        });
    }

    fn push(&mut self, at: Instant, dir: Dir, frame: Vec<u8>, corrupted: bool) {
        self.seq += 1;
        self.queue
            .push(Reverse((at, self.seq, dir, frame, corrupted)));
    }

    /// Offer a frame sent at `now` in direction `dir`.
    pub fn send(&mut self, now: Instant, dir: Dir, mut frame: Vec<u8>) {
        let d = dir_idx(dir);
        let index = self.stats.offered[d];
        self.stats.offered[d] += 1;
        if let Some(rule) = self.rule.as_mut() {
            if rule(now, dir, &frame, index) {
                self.stats.lost[d] += 1;
                self.note(now, dir, Fate::DroppedByRule, &frame);
                return;
            }
        }
        if self.chance(self.cfg.loss_ppm) {
            self.stats.lost[d] += 1;
            self.note(now, dir, Fate::Lost, &frame);
            return;
        }
        // Serialization and queueing.
        let mut depart = now;
        if let Some(rate) = self.cfg.rate.filter(|&r| r > 0) {
            let q = &mut self.in_queue[d];
            while q.front().is_some_and(|&(done, _)| done <= now) {
                q.pop_front();
            }
            let queued: usize = q.iter().map(|&(_, n)| n).sum();
            if self
                .cfg
                .queue_limit
                .is_some_and(|lim| queued + frame.len() > lim)
            {
                self.stats.lost[d] += 1;
                self.note(now, dir, Fate::QueueFull, &frame);
                return;
            }
            let start = self.busy_until[d].max(now);
            let tx = Duration::from_nanos(frame.len() as u64 * 1_000_000_000 / rate);
            depart = start + tx;
            self.busy_until[d] = depart;
            self.in_queue[d].push_back((depart, frame.len()));
        }
        let jitter = self.rand_dur(self.cfg.jitter);
        let mut at = depart + self.cfg.delay + jitter;
        let mut fate = Fate::Sent;
        if self.chance(self.cfg.reorder_ppm) {
            at += self.rand_dur(self.cfg.reorder_delay);
            self.stats.reordered[d] += 1;
            fate = Fate::Reordered;
        }
        let is_ipv4 = frame.len() > 14 && frame[12..14] == [0x08, 0x00];
        if is_ipv4 && self.chance(self.cfg.corrupt_ppm) {
            let bit = (self.rng.next_u64() % ((frame.len() as u64 - 14) * 8)) as usize;
            frame[14 + bit / 8] ^= 1 << (bit % 8);
            fate = Fate::Corrupted;
        }
        if self.chance(self.cfg.dup_ppm) {
            let later = at + self.rand_dur(self.cfg.delay.max(Duration::from_micros(1)));
            self.stats.duplicated[d] += 1;
            self.push(later, dir, frame.clone(), fate == Fate::Corrupted);
            if fate == Fate::Sent {
                fate = Fate::Duplicated;
            }
        }
        self.note(now, dir, fate, &frame);
        let corrupted = fate == Fate::Corrupted;
        self.push(at, dir, frame, corrupted);
    }

    /// When the next frame arrives.
    pub fn next_delivery(&self) -> Option<Instant> {
        self.queue.peek().map(|Reverse((at, ..))| *at)
    }

    /// The next frame due by `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<(Dir, Vec<u8>)> {
        if self.next_delivery()? > now {
            return None;
        }
        let Reverse((_, _, dir, frame, corrupted)) = self.queue.pop()?;
        let d = dir_idx(dir);
        self.stats.delivered[d] += 1;
        if corrupted {
            self.stats.corrupted[d] += 1;
        }
        Some((dir, frame))
    }

    /// Frames in flight.
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// The last frames offered, one per line, oldest first.
    pub fn trace_dump(&self) -> String {
        let mut s = String::new();
        for e in &self.trace {
            let _ = writeln!(
                s,
                "{:?} {} {:?} {}",
                e.at,
                e.dir.arrow(),
                e.fate,
                describe_frame(&e.frame)
            );
        }
        s
    }
}

/// A one-line description of an Ethernet frame: TCP fields when it is a TCP segment.
pub fn describe_frame(frame: &[u8]) -> String {
    match parse_tcp_frame(frame) {
        Some((ip, tcp, payload)) => {
            let f = tcp.flags;
            let mut flags = String::new();
            for (on, c) in [
                (f.syn(), 'S'),
                (f.fin(), 'F'),
                (f.rst(), 'R'),
                (f.psh(), 'P'),
                (f.ack(), '.'),
            ] {
                if on {
                    flags.push(c);
                }
            }
            let mut s = format!(
                "{}:{} > {}:{} [{}] seq {} ack {} win {} len {}",
                ip.src_addr,
                tcp.src_port,
                ip.dst_addr,
                tcp.dst_port,
                flags,
                tcp.seq.0,
                tcp.ack.0,
                tcp.window,
                payload.len()
            );
            if let Some(ts) = tcp.options.timestamps {
                let _ = write!(s, " ts {}/{}", ts.tsval, ts.tsecr);
            }
            for (l, r) in tcp.options.sack_blocks.as_slice() {
                let _ = write!(s, " sack {}-{}", l.0, r.0);
            }
            s
        }
        None if frame.len() >= 14 && frame[12..14] == [0x08, 0x06] => "ARP".to_string(),
        None => format!("non-TCP or invalid frame, {} bytes", frame.len()),
    }
}

/// Parse an Ethernet/IPv4/TCP frame with checksums verified: `None` if it is anything else
/// or invalid.
pub fn parse_tcp_frame(frame: &[u8]) -> Option<(Ipv4Repr, TcpRepr, &[u8])> {
    let caps = ChecksumCaps::software();
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if EthernetRepr::parse(&eth).ok()?.ethertype != EtherType::Ipv4 {
        return None;
    }
    let ipp = Ipv4Packet::new_checked(&frame[14..]).ok()?;
    let ip = Ipv4Repr::parse(&ipp, &caps).ok()?;
    if ip.protocol != IpProtocol::Tcp || ip.is_fragment() {
        return None;
    }
    let l4 = 14 + ipp.header_len();
    let seg = &frame[l4..l4 + ip.payload_len];
    let tcpp = TcpPacket::new_checked(seg).ok()?;
    let tcp = TcpRepr::parse(&tcpp, ip.src_addr, ip.dst_addr, &caps).ok()?;
    Some((ip, tcp, &seg[tcpp.header_len()..]))
}

/// Build an Ethernet/IPv4/TCP frame with correct checksums (for scripted peers and fuzzing).
pub fn build_tcp_frame(
    src_mac: EthernetAddress,
    dst_mac: EthernetAddress,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    tcp: &TcpRepr,
    payload: &[u8],
) -> Vec<u8> {
    let caps = ChecksumCaps::software();
    let tcp = tcp.emitted();
    let ip = Ipv4Repr::new(src, dst, IpProtocol::Tcp, tcp.buffer_len(payload.len()));
    let mut buf = vec![0u8; 14 + 20 + tcp.buffer_len(payload.len())];
    let mut eth = EthernetFrame::new_unchecked(&mut buf[..]);
    EthernetRepr {
        src_addr: src_mac,
        dst_addr: dst_mac,
        ethertype: EtherType::Ipv4,
    }
    .emit(&mut eth);
    {
        let mut ipp = Ipv4Packet::new_unchecked(&mut buf[14..]);
        ip.emit(&mut ipp, &caps);
    }
    let hlen = tcp.header_len();
    buf[34 + hlen..].copy_from_slice(payload);
    let mut tcpp = TcpPacket::new_unchecked(&mut buf[34..]);
    tcp.emit(&mut tcpp, src, dst, payload.len(), &caps);
    buf
}

fn pattern_word(salt: u64, word: u64) -> u64 {
    let mut x = word.wrapping_add(salt.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 32)
}

/// Deterministic stream contents: the byte at `offset` of stream `salt`. Receivers check
/// what they get against it without keeping a copy.
pub fn pattern_byte(salt: u64, offset: u64) -> u8 {
    pattern_word(salt, offset / 8).to_le_bytes()[(offset % 8) as usize]
}

/// Fill `buf` with stream `salt` from `offset` (eight bytes per hash: debug builds spend
/// their time here otherwise).
pub fn fill_pattern(salt: u64, offset: u64, buf: &mut [u8]) {
    let mut i = 0;
    while i < buf.len() {
        let off = offset + i as u64;
        let word = pattern_word(salt, off / 8).to_le_bytes();
        let start = (off % 8) as usize;
        let n = (8 - start).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&word[start..start + n]);
        i += n;
    }
}

/// `len` bytes of stream `salt` starting at `offset`.
pub fn pattern(salt: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_pattern(salt, offset, &mut v);
    v
}

/// Checks a received byte stream against [`pattern`].
#[derive(Debug, Clone)]
pub struct StreamCheck {
    salt: u64,
    /// Bytes received and verified so far.
    pub received: u64,
    /// Whether end of stream was seen.
    pub eof: bool,
}

impl StreamCheck {
    /// A checker for stream `salt`.
    pub fn new(salt: u64) -> Self {
        StreamCheck {
            salt,
            received: 0,
            eof: false,
        }
    }

    /// Check the next chunk; the error names the first wrong offset.
    pub fn feed(&mut self, data: &[u8]) -> Result<(), String> {
        let want = pattern(self.salt, self.received, data.len());
        if want != data {
            let i = want.iter().zip(data).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!(
                "stream {:#x}: byte {} is {:#04x}, expected {:#04x}",
                self.salt,
                self.received + i as u64,
                data[i],
                want[i]
            ));
        }
        self.received += data.len() as u64;
        Ok(())
    }
}

/// An endpoint on a [`SimLink`]: something that takes frames and emits frames on virtual time.
pub trait Endpoint {
    /// A frame arrived at `now`.
    fn receive(&mut self, now: Instant, frame: Vec<u8>);
    /// Run due timers and collect every frame ready to go at `now` into `out`.
    fn poll(&mut self, now: Instant, out: &mut Vec<Vec<u8>>);
    /// When the endpoint next needs `poll` without input.
    fn next_wakeup(&mut self, now: Instant) -> Option<Instant>;
}

/// The endpoint driver for a luna [`Stack`]: frames in through `handle_frame`, timers through
/// `handle_timeouts`, frames out through `poll_transmit`.
pub struct LunaHost<R: Rng = FakeRng> {
    /// The stack.
    pub stack: Stack<R>,
    /// Frames handed to the stack.
    pub frames_in: u64,
}

impl LunaHost<FakeRng> {
    /// A host at `mac`/`ip` with the given TCP settings and RNG seed.
    pub fn new(
        mac: EthernetAddress,
        ip: Ipv4Addr,
        tcp: crate::tcp::TcpConfig,
        seed: u64,
    ) -> LunaHost<FakeRng> {
        let mut cfg = stack_config(mac, ip);
        cfg.tcp = tcp;
        LunaHost::with_config(cfg, seed)
    }

    /// A host from a full stack configuration.
    pub fn with_config(cfg: StackConfig, seed: u64) -> LunaHost<FakeRng> {
        LunaHost {
            stack: Stack::new(cfg, FakeRng::new(seed)).expect("valid test stack config"),
            frames_in: 0,
        }
    }
}

impl<R: Rng> Endpoint for LunaHost<R> {
    fn receive(&mut self, now: Instant, frame: Vec<u8>) {
        self.frames_in += 1;
        self.stack.handle_frame(now, Zbuf::from_vec(frame));
    }

    fn poll(&mut self, now: Instant, out: &mut Vec<Vec<u8>>) {
        if self.stack.poll_timeout().is_some_and(|t| t <= now) {
            self.stack.handle_timeouts(now);
        }
        while let Some(t) = self.stack.poll_transmit(now) {
            out.push(t.to_vec());
        }
    }

    fn next_wakeup(&mut self, _now: Instant) -> Option<Instant> {
        self.stack.poll_timeout()
    }
}

/// Two endpoints on one [`SimLink`], on virtual time.
pub struct Sim<A: Endpoint, B: Endpoint> {
    /// Endpoint A.
    pub a: A,
    /// Endpoint B.
    pub b: B,
    /// The link between them.
    pub link: SimLink,
    /// Virtual time.
    pub now: Instant,
    /// Steps taken.
    pub steps: u64,
    out: Vec<Vec<u8>>,
}

impl<A: Endpoint, B: Endpoint> Sim<A, B> {
    /// A simulation starting at time zero.
    pub fn new(a: A, b: B, link: SimLink) -> Self {
        Sim {
            a,
            b,
            link,
            now: Instant::ZERO,
            steps: 0,
            out: Vec::new(),
        }
    }

    /// Poll both endpoints and put what they send on the link.
    pub fn flush(&mut self) {
        let now = self.now;
        let mut out = core::mem::take(&mut self.out);
        self.a.poll(now, &mut out);
        for f in out.drain(..) {
            self.link.send(now, Dir::AtoB, f);
        }
        self.b.poll(now, &mut out);
        for f in out.drain(..) {
            self.link.send(now, Dir::BtoA, f);
        }
        self.out = out;
    }

    /// The next instant anything happens, if anything will.
    pub fn next_event(&mut self) -> Option<Instant> {
        let now = self.now;
        [
            self.link.next_delivery(),
            self.a.next_wakeup(now),
            self.b.next_wakeup(now),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Flush, advance virtual time to the next event (never past `limit`), deliver what is
    /// due and flush again. Returns false when nothing is scheduled before `limit`.
    pub fn step_until(&mut self, limit: Instant) -> bool {
        self.steps += 1;
        self.flush();
        let Some(next) = self.next_event() else {
            return false;
        };
        if next > limit {
            self.now = self.now.max(limit);
            return false;
        }
        // Never move backwards; an endpoint asking for "now" again is polled again.
        self.now = self.now.max(next);
        while let Some((dir, frame)) = self.link.pop_due(self.now) {
            match dir {
                Dir::AtoB => self.b.receive(self.now, frame),
                Dir::BtoA => self.a.receive(self.now, frame),
            }
        }
        self.flush();
        true
    }

    /// One step without a time limit.
    pub fn step(&mut self) -> bool {
        self.step_until(Instant::from_nanos(u64::MAX))
    }

    /// Advance to exactly `t`, processing everything before it.
    pub fn advance_to(&mut self, t: Instant) {
        while self.step_until(t) {}
        self.now = self.now.max(t);
        self.flush();
    }
}

/// A TCP segment as a scripted peer sees it: header fields and payload.
#[derive(Debug, Clone)]
pub struct Segment {
    /// The header.
    pub tcp: TcpRepr,
    /// The payload.
    pub payload: Vec<u8>,
}

impl Segment {
    /// Parse a frame; `None` unless it is a valid TCP segment.
    pub fn parse(frame: &[u8]) -> Option<Segment> {
        let (_, tcp, payload) = parse_tcp_frame(frame)?;
        Some(Segment {
            tcp,
            payload: payload.to_vec(),
        })
    }

    /// Sequence number one past the segment (payload, SYN and FIN counted).
    pub fn end(&self) -> SeqNum {
        self.tcp.seq + self.tcp.segment_len(self.payload.len()) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::TcpConfig;

    #[test]
    fn link_is_deterministic_per_seed_and_counts_impairments() {
        let run = |seed| {
            let cfg = LinkConfig {
                loss_ppm: 20_000,
                dup_ppm: 20_000,
                reorder_ppm: 20_000,
                reorder_delay: Duration::from_micros(100),
                corrupt_ppm: 20_000,
                jitter: Duration::from_micros(5),
                ..LinkConfig::default()
            };
            let mut link = SimLink::new(cfg, seed);
            let mut got = Vec::new();
            for i in 0..2000u32 {
                let mut f = vec![0u8; 60];
                f[12] = 0x08;
                f[14..18].copy_from_slice(&i.to_be_bytes());
                link.send(Instant::from_micros(u64::from(i)), Dir::AtoB, f);
            }
            while let Some((_, f)) = link.pop_due(Instant::from_millis(100)) {
                got.push(f);
            }
            (got, link.stats())
        };
        let (a, sa) = run(1);
        let (b, sb) = run(1);
        let (c, _) = run(2);
        assert_eq!(a, b);
        assert_eq!(sa, sb);
        assert_ne!(a, c);
        assert_eq!(
            sa.delivered[0],
            sa.offered[0] - sa.lost[0] + sa.duplicated[0]
        );
        assert!(sa.lost[0] > 0 && sa.duplicated[0] > 0 && sa.corrupted[0] > 0);
    }

    #[test]
    fn pattern_fill_matches_bytewise_definition() {
        let v = pattern(9, 5, 37);
        for (i, &b) in v.iter().enumerate() {
            assert_eq!(b, pattern_byte(9, 5 + i as u64));
        }
        let mut c = StreamCheck::new(9);
        c.feed(&pattern(9, 0, 10)).unwrap();
        let mut bad = pattern(9, 10, 10);
        bad[3] ^= 1;
        assert!(c.feed(&bad).unwrap_err().contains("byte 13"));
    }

    #[test]
    fn rate_limited_link_queues_and_drops_at_the_tail() {
        let cfg = LinkConfig {
            rate: Some(1_000_000),
            queue_limit: Some(3000),
            ..LinkConfig::clean(Duration::from_micros(10))
        };
        let mut link = SimLink::new(cfg, 1);
        for _ in 0..5 {
            link.send(Instant::ZERO, Dir::AtoB, vec![0u8; 1000]);
        }
        // 1000 B at 1 MB/s is 1 ms each; three fit in the queue.
        assert_eq!(link.stats().lost[0], 2);
        assert_eq!(
            link.next_delivery(),
            Some(Instant::from_micros(1000) + Duration::from_micros(10))
        );
    }

    #[test]
    fn two_luna_hosts_exchange_data_on_the_sim() {
        let a = LunaHost::new(MAC_A, IP_A, TcpConfig::default(), 1);
        let b = LunaHost::new(MAC_B, IP_B, TcpConfig::default(), 2);
        let mut sim = Sim::new(a, b, SimLink::new(LinkConfig::default(), 3));
        let l = sim.b.stack.listen(80, 4).unwrap();
        let c = sim
            .a
            .stack
            .connect(sim.now, core::net::SocketAddrV4::new(IP_B, 80), None)
            .unwrap();
        let data = pattern(5, 0, 10_000);
        let mut sent = false;
        let mut check = StreamCheck::new(5);
        let mut server = None;
        for _ in 0..10_000 {
            if server.is_none() {
                server = sim.b.stack.accept(l);
            }
            if !sent && sim.a.stack.send(c, &Zbuf::copy_from_slice(&data)) == Ok(10_000) {
                sent = true;
            }
            if let Some(s) = server {
                while let Ok(Some(z)) = sim.b.stack.recv(s) {
                    check.feed(&z).unwrap();
                }
            }
            if check.received == 10_000 || !sim.step() {
                break;
            }
        }
        assert_eq!(check.received, 10_000);
        assert!(sim.link.trace_dump().contains("[S]"));
    }
}
