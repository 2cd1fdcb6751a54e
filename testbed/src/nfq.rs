//! User-space netem over NFQUEUE, for kernels without sch_netem.
//!
//! The engine binds NFQUEUE `impair::QUEUE_NUM` in the network namespace of the thread
//! that binds it, receives each queued IPv4 packet (full copy), and decides in netem's
//! order: drop (loss), clone (duplicate), flip one bit (corrupt), then hold it for
//! `delay ± jitter` unless it is picked for reorder, which releases it at once. Held
//! packets get their ACCEPT verdict when due; duplicates are sent at the same moment
//! through a raw IPv4 socket carrying `impair::ENGINE_MARK` so the NFQUEUE rule lets
//! them pass.
//!
//! Corruption and checksums. Locally generated TCP is `CHECKSUM_PARTIAL` at POSTROUTING
//! (the TCP checksum field holds only the pseudo-header seed; the device or
//! `skb_checksum_help` completes it at transmit). A queue bound without `NFQA_CFG_F_GSO`,
//! as this one is, never sees that state: `nfqnl_build_packet` calls `skb_checksum_help`
//! before it copies a `CHECKSUM_PARTIAL` packet to user space, so the engine receives a
//! complete checksum, and `nfqnl_mangle` marks a packet whose payload the verdict replaces
//! `CHECKSUM_NONE`, so the kernel sends the engine's bytes as they are. A flipped bit then
//! leaves a checksum that cannot verify (one flipped bit always changes the ones'
//! complement sum, RFC 1071). The engine checks this instead of trusting it: a TCP packet
//! picked for corruption whose checksum does not verify on arrival is counted
//! (`partial_checksums`) and its checksum completed before the flip, so the rule holds
//! either way. `testbed/tests/impair.rs` (`corrupt_tcp_is_caught_by_the_receivers_checksum`)
//! proves it end to end: every corrupted segment is a `TcpInCsumErrors` at the receiver
//! and the data arrives intact.
//!
//! Where the bit goes: in a TCP packet, anywhere in the TCP segment except the 4-bit data
//! offset. Every receiver checks the TCP checksum of such a segment before it acts on
//! any field, so each corrupted packet is one checksum drop. A flipped data offset is
//! different: Linux discards a segment whose header length is below 20 bytes or beyond
//! the segment before it checksums it (`tcp_v4_rcv`: `TcpInErrs` or no counter at all),
//! and tshark reports a bogus header length instead of a bad checksum, so counts could not
//! be matched exactly. IP header flips are left out for the same reason (Linux counts a
//! broken version or header length as `InHdrErrors` before the header checksum). Other
//! packets (ICMP) get the bit anywhere in the IPv4 packet, as netem does.
//!
//! Wire format (linux/netfilter/nfnetlink_queue.h): nlmsghdr (host order) + nfgenmsg
//! (res_id = queue number, big-endian) + attributes (host-order headers, big-endian
//! payload fields).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::error::{Error, Result};
use crate::impair::{Impairment, ENGINE_MARK, QUEUE_NUM};

const AF_INET: u8 = 2;
const AF_NETLINK: i32 = 16;
const NETLINK_NETFILTER: i32 = 12;
const IPPROTO_RAW: i32 = 255;
const ENOBUFS: i32 = 105;

const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = NFNL_SUBSYS_QUEUE << 8;
const NFQNL_MSG_VERDICT: u16 = (NFNL_SUBSYS_QUEUE << 8) | 1;
const NFQNL_MSG_CONFIG: u16 = (NFNL_SUBSYS_QUEUE << 8) | 2;

const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_PAYLOAD: u16 = 10;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_PACKET: u8 = 2;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;

/// Packets the kernel may hold for us: enough for 100 ms of delay at ~80 kpps.
const QUEUE_MAXLEN: u32 = 8192;

/// Counters of what the engine did, shared with whoever started it.
#[derive(Debug, Default)]
pub struct Counters {
    seen: AtomicU64,
    dropped: AtomicU64,
    duplicated: AtomicU64,
    corrupted: AtomicU64,
    partial_checksums: AtomicU64,
    delayed: AtomicU64,
    reordered: AtomicU64,
    errors: AtomicU64,
}

/// A snapshot of [`Counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineStats {
    /// Packets received from the queue.
    pub seen: u64,
    /// Dropped (loss).
    pub dropped: u64,
    /// Sent twice.
    pub duplicated: u64,
    /// Sent with a flipped bit (whose checksum cannot verify).
    pub corrupted: u64,
    /// TCP packets picked for corruption whose checksum did not verify as received (a
    /// `CHECKSUM_PARTIAL` seed): completed by the engine before the flip. 0 on the
    /// kernels tested (see the module docs).
    #[serde(default)]
    pub partial_checksums: u64,
    /// Held for a delay.
    pub delayed: u64,
    /// Sent at once ahead of delayed ones.
    pub reordered: u64,
    /// Netlink or injection errors (ENOBUFS overruns included).
    pub errors: u64,
}

impl Counters {
    /// Reads all counters.
    pub fn snapshot(&self) -> EngineStats {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        EngineStats {
            seen: r(&self.seen),
            dropped: r(&self.dropped),
            duplicated: r(&self.duplicated),
            corrupted: r(&self.corrupted),
            partial_checksums: r(&self.partial_checksums),
            delayed: r(&self.delayed),
            reordered: r(&self.reordered),
            errors: r(&self.errors),
        }
    }
    fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// xorshift64*: impairment choices need speed and a seed, not cryptographic strength.
struct Rng(u64);

impl Rng {
    fn new(seed: Option<u64>) -> Rng {
        let s = seed.unwrap_or_else(|| {
            let t = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1);
            t ^ (u64::from(std::process::id()) << 32)
        });
        Rng(s | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn chance(&mut self, percent: f64) -> bool {
        percent > 0.0 && self.unit() * 100.0 < percent
    }
}

struct Held {
    due: Instant,
    seq: u64,
    id: u32,
    payload: Option<Vec<u8>>,
    duplicate: Option<Vec<u8>>,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.seq) == (o.due, o.seq)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.due, self.seq).cmp(&(o.due, o.seq))
    }
}

/// A bound NFQUEUE with its impairment. Create it in the target namespace, then [`run`].
///
/// [`run`]: Engine::run
pub struct Engine {
    nl: Socket,
    raw: Socket,
    imp: Impairment,
    rng: Rng,
    seq: u64,
    held: BinaryHeap<Reverse<Held>>,
    counters: Arc<Counters>,
}

fn push_attr(buf: &mut Vec<u8>, ty: u16, data: &[u8]) {
    let len = 4 + data.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(data);
    while buf.len() % 4 != 0 {
        buf.push(0);
    }
}

fn nfnl_msg(ty: u16, flags: u16, seq: u32, family: u8, attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut b = vec![0u8; 16];
    b.push(family);
    b.push(0); // NFNETLINK_V0
    b.extend_from_slice(&QUEUE_NUM.to_be_bytes());
    for (t, d) in attrs {
        push_attr(&mut b, *t, d);
    }
    let len = b.len() as u32;
    b[0..4].copy_from_slice(&len.to_ne_bytes());
    b[4..6].copy_from_slice(&ty.to_ne_bytes());
    b[6..8].copy_from_slice(&flags.to_ne_bytes());
    b[8..12].copy_from_slice(&seq.to_ne_bytes());
    b
}

/// Iterates over netlink messages in `buf`: (type, payload after nlmsghdr).
fn nl_messages(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut off = 0usize;
    std::iter::from_fn(move || {
        if off + 16 > buf.len() {
            return None;
        }
        let len = u32::from_ne_bytes(buf[off..off + 4].try_into().ok()?) as usize;
        let ty = u16::from_ne_bytes(buf[off + 4..off + 6].try_into().ok()?);
        if len < 16 || off + len > buf.len() {
            return None;
        }
        let body = &buf[off + 16..off + len];
        off += (len + 3) & !3;
        Some((ty, body))
    })
}

/// Iterates over netlink attributes: (type without flag bits, data).
fn nl_attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let ty = u16::from_ne_bytes([buf[2], buf[3]]) & 0x3fff;
        if len < 4 || len > buf.len() {
            return None;
        }
        let data = &buf[4..len];
        buf = &buf[((len + 3) & !3).min(buf.len())..];
        Some((ty, data))
    })
}

/// Ones' complement sum of `data` (RFC 1071), added to `sum`, unfolded.
fn ones_sum(mut sum: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    sum
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The TCP segment of an IPv4 packet: (IP header length, TCP length), if `pkt` is an
/// unfragmented IPv4 TCP packet with a whole TCP header.
fn tcp_segment(pkt: &[u8]) -> Option<(usize, usize)> {
    if pkt.len() < 20 || pkt[0] >> 4 != 4 || pkt[9] != 6 {
        return None;
    }
    let ihl = usize::from(pkt[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([pkt[2], pkt[3]]));
    let frag = u16::from_be_bytes([pkt[6], pkt[7]]) & 0x3fff;
    if ihl < 20 || total > pkt.len() || total < ihl + 20 || frag != 0 {
        return None;
    }
    Some((ihl, total - ihl))
}

/// The ones' complement sum of a TCP segment with its pseudo-header (RFC 9293 §3.1):
/// 0xffff when its checksum verifies.
fn tcp_sum(pkt: &[u8], ihl: usize, len: usize) -> u16 {
    let mut s = ones_sum(0, &pkt[12..20]);
    s += 6 + len as u32;
    fold(ones_sum(s, &pkt[ihl..ihl + len]))
}

/// Flips one bit of `pkt` (an IPv4 packet) chosen by `r` so that the receiver's checksum
/// must catch it (module docs): in a TCP packet one bit of the segment outside the data
/// offset, after completing the checksum if it did not verify; else any bit. Returns
/// whether the checksum had to be completed, `None` if nothing was flipped (empty).
fn corrupt(pkt: &mut [u8], r: u64) -> Option<bool> {
    if pkt.is_empty() {
        return None;
    }
    let Some((ihl, len)) = tcp_segment(pkt) else {
        let bit = (r % (pkt.len() as u64 * 8)) as usize;
        pkt[bit / 8] ^= 1 << (bit % 8);
        return Some(false);
    };
    let partial = tcp_sum(pkt, ihl, len) != 0xffff;
    if partial {
        // RFC 9293 §3.1: the checksum is the complement of the sum with the field zero.
        pkt[ihl + 16..ihl + 18].fill(0);
        let c = !tcp_sum(pkt, ihl, len);
        pkt[ihl + 16..ihl + 18].copy_from_slice(&c.to_be_bytes());
    }
    // Bits of the segment except the data offset (the high nibble of byte 12).
    let bits = len as u64 * 8 - 4;
    let mut bit = (r % bits) as usize;
    if bit >= 12 * 8 {
        bit += 4;
    }
    // Bit numbering within a byte: 0 is the most significant, so byte 12's bits 0..4
    // are the data offset.
    pkt[ihl + bit / 8] ^= 0x80 >> (bit % 8);
    Some(partial)
}

impl Engine {
    /// Opens the netlink and raw sockets in the calling thread's network namespace and
    /// binds the queue. Fails if another listener holds the queue.
    pub fn bind(imp: Impairment, counters: Arc<Counters>) -> Result<Engine> {
        let io = |what: &str| {
            let what = what.to_string();
            move |e| Error::io(what, e)
        };
        let nl = Socket::new(
            Domain::from(AF_NETLINK),
            Type::RAW,
            Some(Protocol::from(NETLINK_NETFILTER)),
        )
        .map_err(io("opening NETLINK_NETFILTER socket"))?;
        let _ = nl.set_recv_buffer_size(8 << 20);
        let raw = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(IPPROTO_RAW)))
            .map_err(io("opening raw IPv4 socket for duplicates"))?;
        raw.set_mark(ENGINE_MARK)
            .map_err(io("setting SO_MARK on the duplicate socket"))?;
        let rng = Rng::new(imp.seed);
        let mut e = Engine {
            nl,
            raw,
            imp,
            rng,
            seq: 0,
            held: BinaryHeap::new(),
            counters,
        };
        let bind = [NFQNL_CFG_CMD_BIND, 0, 0, AF_INET];
        e.config(1, &[(NFQA_CFG_CMD, &bind)])?;
        let mut params = 0xffffu32.to_be_bytes().to_vec();
        params.push(NFQNL_COPY_PACKET);
        e.config(2, &[(NFQA_CFG_PARAMS, &params)])?;
        e.config(3, &[(NFQA_CFG_QUEUE_MAXLEN, &QUEUE_MAXLEN.to_be_bytes())])?;
        e.nl.set_nonblocking(true)
            .map_err(io("making the netlink socket non-blocking"))?;
        Ok(e)
    }

    /// Sends one config message and waits for the kernel's ack.
    fn config(&mut self, seq: u32, attrs: &[(u16, &[u8])]) -> Result<()> {
        let msg = nfnl_msg(
            NFQNL_MSG_CONFIG,
            NLM_F_REQUEST | NLM_F_ACK,
            seq,
            AF_INET,
            attrs,
        );
        (&self.nl)
            .write_all(&msg)
            .map_err(|e| Error::io("sending NFQUEUE config", e))?;
        self.nl
            .set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| Error::io("setting netlink timeout", e))?;
        let mut buf = vec![0u8; 8192];
        let n = (&self.nl)
            .read(&mut buf)
            .map_err(|e| Error::io("reading NFQUEUE config ack", e))?;
        for (ty, body) in nl_messages(&buf[..n]) {
            if ty == NLMSG_ERROR && body.len() >= 4 {
                let code = i32::from_ne_bytes([body[0], body[1], body[2], body[3]]);
                if code == 0 {
                    return Ok(());
                }
                let err = std::io::Error::from_raw_os_error(-code);
                let hint = if -code == 16 {
                    " (queue already bound: another impairment engine runs in this namespace)"
                } else {
                    ""
                };
                return Err(Error::Engine(format!(
                    "kernel refused NFQUEUE config step {seq}: {err}{hint}"
                )));
            }
        }
        Err(Error::Engine(format!(
            "no ack for NFQUEUE config step {seq} (is nfnetlink_queue in the kernel?)"
        )))
    }

    fn verdict(&mut self, id: u32, verdict: u32, payload: Option<&[u8]>) {
        let mut hdr = verdict.to_be_bytes().to_vec();
        hdr.extend_from_slice(&id.to_be_bytes());
        let mut attrs: Vec<(u16, &[u8])> = vec![(NFQA_VERDICT_HDR, &hdr)];
        if let Some(p) = payload {
            attrs.push((NFQA_PAYLOAD, p));
        }
        let msg = nfnl_msg(NFQNL_MSG_VERDICT, NLM_F_REQUEST, 0, 0, &attrs);
        if (&self.nl).write_all(&msg).is_err() {
            Counters::inc(&self.counters.errors);
        }
    }

    fn inject(&mut self, pkt: &[u8]) {
        // Only IPv4 reaches this queue (the rule is in iptables, not ip6tables).
        if pkt.len() < 20 || pkt[0] >> 4 != 4 {
            return;
        }
        let dst = Ipv4Addr::new(pkt[16], pkt[17], pkt[18], pkt[19]);
        let addr = SockAddr::from(SocketAddrV4::new(dst, 0));
        match self.raw.send_to(pkt, &addr) {
            Ok(_) => Counters::inc(&self.counters.duplicated),
            Err(_) => Counters::inc(&self.counters.errors),
        }
    }

    fn release(&mut self, h: Held) {
        self.verdict(h.id, NF_ACCEPT, h.payload.as_deref());
        if let Some(d) = h.duplicate {
            self.inject(&d);
        }
    }

    fn on_packet(&mut self, body: &[u8], now: Instant) {
        // body = nfgenmsg (4 bytes) + attributes.
        let Some(attrs) = body.get(4..) else { return };
        let mut id = None;
        let mut payload: &[u8] = &[];
        for (ty, data) in nl_attrs(attrs) {
            match ty {
                NFQA_PACKET_HDR if data.len() >= 4 => {
                    id = Some(u32::from_be_bytes([data[0], data[1], data[2], data[3]]));
                }
                NFQA_PAYLOAD => payload = data,
                _ => {}
            }
        }
        let Some(id) = id else {
            Counters::inc(&self.counters.errors);
            return;
        };
        Counters::inc(&self.counters.seen);
        if self.rng.chance(self.imp.loss) {
            Counters::inc(&self.counters.dropped);
            self.verdict(id, NF_DROP, None);
            return;
        }
        let duplicate = self
            .rng
            .chance(self.imp.duplicate)
            .then(|| payload.to_vec());
        let mut modified = None;
        if !payload.is_empty() && self.rng.chance(self.imp.corrupt) {
            let mut p = payload.to_vec();
            let r = self.rng.next();
            if let Some(partial) = corrupt(&mut p, r) {
                if partial {
                    Counters::inc(&self.counters.partial_checksums);
                }
                Counters::inc(&self.counters.corrupted);
                modified = Some(p);
            }
        }
        let mut due = now;
        if !self.imp.delay.is_zero() {
            if self.rng.chance(self.imp.reorder) {
                Counters::inc(&self.counters.reordered);
            } else {
                let j = self.imp.jitter.as_secs_f64();
                let d = self.imp.delay.as_secs_f64() + (self.rng.unit() * 2.0 - 1.0) * j;
                due = now + Duration::from_secs_f64(d.max(0.0));
                Counters::inc(&self.counters.delayed);
            }
        }
        self.seq += 1;
        let h = Held {
            due,
            seq: self.seq,
            id,
            payload: modified,
            duplicate,
        };
        if due <= now {
            self.release(h);
        } else {
            self.held.push(Reverse(h));
        }
    }

    fn release_due(&mut self, now: Instant) {
        while self.held.peek().is_some_and(|Reverse(h)| h.due <= now) {
            if let Some(Reverse(h)) = self.held.pop() {
                self.release(h);
            }
        }
    }

    /// Processes packets until `stop` is set; then releases everything still held.
    pub fn run(mut self, stop: &AtomicBool) -> Result<()> {
        let mut buf = vec![0u8; 256 * 1024];
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            self.release_due(now);
            let wait = self
                .held
                .peek()
                .map(|Reverse(h)| h.due.saturating_duration_since(now))
                .unwrap_or(Duration::from_millis(50))
                .min(Duration::from_millis(50));
            {
                let mut fds = [nix::poll::PollFd::new(
                    self.nl.as_fd(),
                    nix::poll::PollFlags::POLLIN,
                )];
                let ts = nix::sys::time::TimeSpec::from_duration(wait);
                match nix::poll::ppoll(&mut fds, Some(ts), None) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => return Err(Error::Engine(format!("ppoll: {e}"))),
                }
            }
            loop {
                match (&self.nl).read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let now = Instant::now();
                        let msgs: Vec<(u16, Vec<u8>)> = nl_messages(&buf[..n])
                            .map(|(t, b)| (t, b.to_vec()))
                            .collect();
                        for (ty, body) in msgs {
                            if ty == NFQNL_MSG_PACKET {
                                self.on_packet(&body, now);
                            }
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    // The socket overran: the kernel dropped some queue messages. Count
                    // it; those packets are lost, as on a congested link.
                    Err(e) if e.raw_os_error() == Some(ENOBUFS) => {
                        Counters::inc(&self.counters.errors)
                    }
                    Err(e) => return Err(Error::io("reading NFQUEUE", e)),
                }
            }
        }
        while let Some(Reverse(h)) = self.held.pop() {
            self.release(h);
        }
        Ok(())
    }
}

/// Moves the calling thread into network namespace `netns` (`/run/netns/<netns>`).
pub fn enter_netns(netns: &str) -> Result<()> {
    let path = format!("/run/netns/{netns}");
    let f = File::open(&path).map_err(|e| Error::io(format!("opening {path}"), e))?;
    nix::sched::setns(f.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| Error::Engine(format!("setns into {netns}: {e}")))
}

/// An engine running on its own thread inside a namespace; stops on [`stop`] or drop.
///
/// [`stop`]: EngineThread::stop
pub struct EngineThread {
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    join: Option<std::thread::JoinHandle<Result<()>>>,
}

impl EngineThread {
    /// Starts the engine in `netns` and returns once the queue is bound.
    pub fn spawn(netns: &str, imp: Impairment) -> Result<EngineThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let ns = netns.to_string();
        let (s2, c2) = (stop.clone(), counters.clone());
        let join = std::thread::Builder::new()
            .name(format!("impair-{netns}"))
            .spawn(move || {
                let bound = enter_netns(&ns).and_then(|()| Engine::bind(imp, c2));
                match bound {
                    Ok(engine) => {
                        let _ = tx.send(Ok(()));
                        engine.run(&s2)
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        let _ = tx.send(Err(e));
                        Err(Error::Engine(msg))
                    }
                }
            })
            .map_err(|e| Error::io("spawning impairment thread", e))?;
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Ok(())) => Ok(EngineThread {
                stop,
                counters,
                join: Some(join),
            }),
            Ok(Err(e)) => {
                let _ = join.join();
                Err(e)
            }
            Err(_) => Err(Error::Timeout {
                what: format!("the impairment engine in {netns} to bind its queue"),
                after: Duration::from_secs(5),
                hint:
                    "check that nfnetlink_queue is available (/proc/net/netfilter/nfnetlink_queue)",
            }),
        }
    }

    /// The engine's counters so far.
    pub fn stats(&self) -> EngineStats {
        self.counters.snapshot()
    }

    /// Stops the engine (held packets are released) and reports how it ended.
    pub fn stop(mut self) -> Result<EngineStats> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<EngineStats> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(j) = self.join.take() {
            match j.join() {
                Ok(r) => r?,
                Err(_) => return Err(Error::Engine("impairment thread panicked".into())),
            }
        }
        Ok(self.counters.snapshot())
    }
}

impl Drop for EngineThread {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_well_formed_messages() {
        let m = nfnl_msg(
            NFQNL_MSG_CONFIG,
            NLM_F_REQUEST,
            7,
            AF_INET,
            &[(1, &[1, 0, 0, 2])],
        );
        assert_eq!(m.len(), 16 + 4 + 8);
        assert_eq!(
            u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize,
            m.len()
        );
        assert_eq!(&m[18..20], &QUEUE_NUM.to_be_bytes());
        let parsed: Vec<_> = nl_messages(&m).collect();
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].0, NFQNL_MSG_CONFIG);
        let attrs: Vec<_> = nl_attrs(&parsed[0].1[4..]).collect();
        assert_eq!(attrs, vec![(1u16, &[1u8, 0, 0, 2][..])]);
    }

    #[test]
    fn truncated_netlink_input_is_ignored_not_panicking() {
        let m = nfnl_msg(NFQNL_MSG_PACKET, 0, 1, AF_INET, &[(NFQA_PAYLOAD, &[9; 33])]);
        for cut in 0..m.len() {
            let _ = nl_messages(&m[..cut]).count();
            let _ = nl_attrs(&m[..cut]).count();
        }
        // An attribute claiming more bytes than there are ends iteration.
        let bad = [200u8, 0, 10, 0, 1, 2];
        assert_eq!(nl_attrs(&bad).count(), 0);
    }

    /// An IPv4 TCP packet (20-byte IP header, 32-byte TCP header, `data` bytes) with a
    /// valid TCP checksum, or the pseudo-header seed only when `partial`.
    fn tcp_packet(data: usize, partial: bool) -> Vec<u8> {
        let total = 20 + 32 + data;
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[8] = 64;
        p[9] = 6;
        p[12..16].copy_from_slice(&[198, 18, 0, 1]);
        p[16..20].copy_from_slice(&[198, 18, 0, 2]);
        p[20..22].copy_from_slice(&7101u16.to_be_bytes());
        p[22..24].copy_from_slice(&61440u16.to_be_bytes());
        p[32] = 8 << 4; // data offset: 32 bytes
        p[33] = 0x10;
        for (i, b) in p[52..].iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let len = total - 20;
        let mut seed = ones_sum(0, &p[12..20]);
        seed += 6 + len as u32;
        let c = if partial {
            fold(seed) // what CHECKSUM_PARTIAL leaves in the field
        } else {
            !tcp_sum(&p, 20, len)
        };
        p[36..38].copy_from_slice(&c.to_be_bytes());
        p
    }

    #[test]
    fn corrupted_tcp_never_verifies_and_keeps_ip_header_and_data_offset() {
        for data in [0usize, 1, 100, 1448] {
            let good = tcp_packet(data, false);
            assert_eq!(tcp_sum(&good, 20, good.len() - 20), 0xffff);
            for r in 0..20_000u64 {
                let mut p = good.clone();
                assert_eq!(
                    corrupt(&mut p, r.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                    Some(false)
                );
                assert_eq!(&p[..20], &good[..20], "IP header untouched");
                assert_eq!(p[32] >> 4, 8, "data offset untouched");
                let flipped: u32 = p.iter().zip(&good).map(|(a, b)| (a ^ b).count_ones()).sum();
                assert_eq!(flipped, 1);
                assert_ne!(tcp_sum(&p, 20, p.len() - 20), 0xffff, "r={r} data={data}");
            }
        }
    }

    #[test]
    fn a_partial_checksum_is_completed_before_the_flip() {
        let good = tcp_packet(100, false);
        let mut p = tcp_packet(100, true);
        assert_ne!(tcp_sum(&p, 20, p.len() - 20), 0xffff);
        assert_eq!(corrupt(&mut p, 12345), Some(true));
        assert_ne!(tcp_sum(&p, 20, p.len() - 20), 0xffff);
        // One bit away from the packet with the complete checksum.
        let flipped: u32 = p.iter().zip(&good).map(|(a, b)| (a ^ b).count_ones()).sum();
        assert_eq!(flipped, 1);
    }

    #[test]
    fn other_packets_get_the_bit_anywhere_and_empty_ones_none() {
        let mut icmp = vec![0x45u8, 0, 0, 28, 0, 0, 0, 0, 64, 1];
        icmp.resize(28, 0);
        let orig = icmp.clone();
        assert_eq!(corrupt(&mut icmp, 3), Some(false));
        assert_ne!(icmp, orig);
        assert_eq!(corrupt(&mut [], 3), None);
        // A truncated TCP packet is not taken for a segment.
        let mut short = tcp_packet(0, false);
        short.truncate(30);
        assert_eq!(tcp_segment(&short), None);
        assert_eq!(corrupt(&mut short, 9), Some(false));
    }

    #[test]
    fn rng_chances_track_percentages() {
        let mut r = Rng::new(Some(42));
        let hits = (0..100_000).filter(|_| r.chance(10.0)).count();
        assert!((9_000..11_000).contains(&hits), "{hits}");
        assert!(!(0..1000).any(|_| r.chance(0.0)));
        assert!((0..1000).all(|_| r.chance(100.0)));
    }
}
