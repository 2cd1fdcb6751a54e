//! An in-memory Ethernet link: two endpoints joined by bounded lock-free rings, usable
//! across threads, with optional loss and latency. It lets the runtime (and CI) run without
//! DPDK.
//!
//! Each side has one or more queues. A frame sent from any queue of one side is steered to
//! a receive queue of the other side the way a NIC would: by the Toeplitz hash of its
//! IPv4/TCP 4-tuple through the receiver's redirection table ([`MemConfig::rss`]), other
//! frames (ARP, ICMP, fragments) to queue 0. Frames are copied once, on transmit (the
//! "DMA" of a header + payload io-vector into one receive buffer); the copy is counted in
//! [`DeviceStats::copied_bytes`].

use super::{Device, DeviceStats};
use bifurcation::{RssConfig, MICROSOFT_KEY};
use core::net::{Ipv4Addr, SocketAddrV4};
use crossbeam_queue::ArrayQueue;
use luna_stack::stack::Transmit;
use luna_stack::wire::EthernetAddress;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};
use zbuf::Zbuf;

/// How a [`MemPair`] is built.
#[derive(Debug, Clone)]
pub struct MemConfig {
    /// Queues of side A.
    pub queues_a: u16,
    /// Queues of side B.
    pub queues_b: u16,
    /// Frames each receive ring holds; a full ring refuses transmits (back pressure).
    pub ring_size: usize,
    /// MAC of side A.
    pub mac_a: EthernetAddress,
    /// MAC of side B.
    pub mac_b: EthernetAddress,
    /// Steer by RSS (Toeplitz over the 4-tuple with `rss_key`, round-robin table of 128
    /// entries). Off: every frame goes to queue 0 and `Device::rss` is `None`.
    pub rss: bool,
    /// The RSS key.
    pub rss_key: Vec<u8>,
    /// Probability that a frame is lost on the wire, each direction (0 = none).
    pub loss: f64,
    /// One-way delay before a frame can be received.
    pub latency: Duration,
    /// Seed of the loss decisions (deterministic per queue).
    pub seed: u64,
    /// IP MTU; longer frames are dropped at transmit and counted.
    pub mtu: u16,
}

impl Default for MemConfig {
    fn default() -> Self {
        MemConfig {
            queues_a: 1,
            queues_b: 1,
            ring_size: 1024,
            mac_a: EthernetAddress([0x02, 0, 0, 0, 0, 0x0a]),
            mac_b: EthernetAddress([0x02, 0, 0, 0, 0, 0x0b]),
            rss: true,
            rss_key: MICROSOFT_KEY.to_vec(),
            loss: 0.0,
            latency: Duration::ZERO,
            seed: 1,
            mtu: 1500,
        }
    }
}

/// Why a [`MemConfig`] was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum MemError {
    /// A side has no queues.
    NoQueues,
    /// `ring_size` is zero.
    RingSize,
    /// `loss` is not within 0..=1.
    Loss(f64),
    /// The RSS key is too short.
    Rss(String),
}

impl core::fmt::Display for MemError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            MemError::NoQueues => f.write_str("each side of a MemPair needs at least one queue"),
            MemError::RingSize => f.write_str("ring_size must be at least 1"),
            MemError::Loss(l) => write!(f, "loss {l} is not a probability in 0..=1"),
            MemError::Rss(e) => write!(f, "RSS: {e}"),
        }
    }
}

impl std::error::Error for MemError {}

struct InFlight {
    frame: Zbuf,
    due: Option<StdInstant>,
}

/// One direction: the receive rings of the receiving side.
struct Wire {
    rings: Vec<ArrayQueue<InFlight>>,
    rss: Option<RssConfig>,
    lost: AtomicU64,
    oversize: AtomicU64,
}

impl Wire {
    fn queue_of(&self, frame: &[u8]) -> usize {
        match &self.rss {
            Some(rss) if self.rings.len() > 1 => match tcp_tuple(frame) {
                Some((src, dst)) => usize::from(rss.queue_of_ipv4_tcp(src, dst)) % self.rings.len(),
                None => 0,
            },
            _ => 0,
        }
    }
}

/// The (source, destination) of an unfragmented IPv4/TCP frame.
fn tcp_tuple(f: &[u8]) -> Option<(SocketAddrV4, SocketAddrV4)> {
    if f.len() < 14 + 20 || f[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &f[14..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let frag = u16::from_be_bytes([ip[6], ip[7]]);
    // More-fragments flag or a fragment offset: NICs hash fragments on addresses only.
    if ip[0] >> 4 != 4 || ihl < 20 || ip[9] != 6 || frag & 0x3fff != 0 || ip.len() < ihl + 4 {
        return None;
    }
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let sp = u16::from_be_bytes([ip[ihl], ip[ihl + 1]]);
    let dp = u16::from_be_bytes([ip[ihl + 2], ip[ihl + 3]]);
    Some((SocketAddrV4::new(src, sp), SocketAddrV4::new(dst, dp)))
}

/// Constructor of linked endpoints.
pub struct MemPair;

impl MemPair {
    /// Two linked sides; each `Vec` holds one device per queue, in queue order.
    pub fn build(cfg: &MemConfig) -> Result<(Vec<MemDevice>, Vec<MemDevice>), MemError> {
        if cfg.queues_a == 0 || cfg.queues_b == 0 {
            return Err(MemError::NoQueues);
        }
        if cfg.ring_size == 0 {
            return Err(MemError::RingSize);
        }
        if !(0.0..=1.0).contains(&cfg.loss) {
            return Err(MemError::Loss(cfg.loss));
        }
        let rss_of = |queues: u16| -> Result<Option<RssConfig>, MemError> {
            if !cfg.rss {
                return Ok(None);
            }
            RssConfig::round_robin(&cfg.rss_key, 128, queues)
                .map(Some)
                .map_err(|e| MemError::Rss(e.to_string()))
        };
        let wire = |queues: u16, rss: Option<RssConfig>| {
            Arc::new(Wire {
                rings: (0..queues)
                    .map(|_| ArrayQueue::new(cfg.ring_size))
                    .collect(),
                rss,
                lost: AtomicU64::new(0),
                oversize: AtomicU64::new(0),
            })
        };
        let (rss_a, rss_b) = (rss_of(cfg.queues_a)?, rss_of(cfg.queues_b)?);
        let to_a = wire(cfg.queues_a, rss_a.clone());
        let to_b = wire(cfg.queues_b, rss_b.clone());
        let side =
            |n: u16, mac, rx: &Arc<Wire>, tx: &Arc<Wire>, rss: &Option<RssConfig>, salt: u64| {
                (0..n)
                    .map(|q| MemDevice {
                        rx: Arc::clone(rx),
                        tx: Arc::clone(tx),
                        queue: q,
                        mac,
                        rss: rss.clone(),
                        mtu: cfg.mtu,
                        loss: cfg.loss,
                        latency: cfg.latency,
                        rng: (cfg.seed ^ salt ^ (u64::from(q) << 32)) | 1,
                        staged: VecDeque::new(),
                        ring_size: cfg.ring_size,
                        stats: DeviceStats::default(),
                    })
                    .collect::<Vec<_>>()
            };
        let a = side(cfg.queues_a, cfg.mac_a, &to_a, &to_b, &rss_a, 0xa);
        let b = side(cfg.queues_b, cfg.mac_b, &to_b, &to_a, &rss_b, 0xb0b);
        Ok((a, b))
    }

    /// One queue on each side, default settings.
    pub fn single() -> (MemDevice, MemDevice) {
        let (mut a, mut b) =
            Self::build(&MemConfig::default()).expect("default MemConfig is valid");
        (a.remove(0), b.remove(0))
    }
}

/// One queue of one side of a [`MemPair`]. `Send`: move it to the core that polls it.
pub struct MemDevice {
    rx: Arc<Wire>,
    tx: Arc<Wire>,
    queue: u16,
    mac: EthernetAddress,
    rss: Option<RssConfig>,
    mtu: u16,
    loss: f64,
    latency: Duration,
    rng: u64,
    /// Frames taken from the ring but not yet due (latency).
    staged: VecDeque<InFlight>,
    ring_size: usize,
    stats: DeviceStats,
}

impl MemDevice {
    /// Frames lost on the wire towards this side's peer (loss) so far.
    pub fn lost(&self) -> u64 {
        self.tx.lost.load(Ordering::Relaxed)
    }

    /// Frames refused at transmit for exceeding the MTU.
    pub fn oversize(&self) -> u64 {
        self.tx.oversize.load(Ordering::Relaxed)
    }

    /// Queue a raw frame as if this side had sent it (tests inject malformed input this
    /// way). Returns `false` if the peer's ring is full.
    pub fn inject(&self, frame: Zbuf) -> bool {
        let q = self.tx.queue_of(&frame);
        self.tx.rings[q].push(InFlight { frame, due: None }).is_ok()
    }

    fn lose(&mut self) -> bool {
        if self.loss <= 0.0 {
            return false;
        }
        // xorshift64*: deterministic per queue; loss needs no cryptographic quality.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        let r = (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
        r < self.loss
    }

    fn materialize(t: &Transmit) -> Zbuf {
        let len = t.len();
        // From this core's zbuf cache when it has one (the normal case on a runtime
        // core), else from the heap.
        match zbuf::alloc(len) {
            Ok(mut z) => {
                if z.extend_from_slice(t.header()).is_ok()
                    && t.payload.chunks().all(|c| z.extend_from_slice(c).is_ok())
                {
                    return z.freeze();
                }
                Zbuf::from_vec(t.to_vec())
            }
            Err(_) => Zbuf::from_vec(t.to_vec()),
        }
    }
}

impl crate::exception::RawPort for MemDevice {
    fn tx_raw(&mut self, frames: &mut VecDeque<Zbuf>) -> usize {
        let mut n = 0;
        while let Some(f) = frames.front() {
            let len = f.len() as u64;
            if !self.inject(f.clone()) {
                break;
            }
            frames.pop_front();
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += len;
            n += 1;
        }
        n
    }
}

impl Device for MemDevice {
    fn rx_burst(&mut self, out: &mut Vec<Zbuf>, max: usize) -> usize {
        let ring = &self.rx.rings[usize::from(self.queue)];
        while self.staged.len() < self.ring_size {
            match ring.pop() {
                Some(f) => self.staged.push_back(f),
                None => break,
            }
        }
        let now = (!self.latency.is_zero()).then(StdInstant::now);
        let mut n = 0;
        while n < max {
            let due = match (self.staged.front(), now) {
                (None, _) => break,
                (Some(f), Some(now)) => f.due.is_none_or(|d| d <= now),
                (Some(_), None) => true,
            };
            if !due {
                break;
            }
            let f = self.staged.pop_front().expect("front exists");
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += f.frame.len() as u64;
            out.push(f.frame);
            n += 1;
        }
        n
    }

    fn tx_burst(&mut self, frames: &mut VecDeque<Transmit>) -> usize {
        let mut sent = 0;
        let max_frame = usize::from(self.mtu) + 14;
        while let Some(t) = frames.front() {
            if t.len() > max_frame {
                self.tx.oversize.fetch_add(1, Ordering::Relaxed);
                self.stats.tx_dropped += 1;
                frames.pop_front();
                continue;
            }
            let q = self.tx.queue_of(t.header());
            if self.tx.rings[q].is_full() {
                break;
            }
            let t = frames.pop_front().expect("front exists");
            sent += 1;
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += t.len() as u64;
            if self.lose() {
                self.tx.lost.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            self.stats.copied_bytes += t.payload.len() as u64;
            let frame = Self::materialize(&t);
            let due = (!self.latency.is_zero()).then(|| StdInstant::now() + self.latency);
            // Only this side pushes to the ring and it was not full: a racing push from a
            // sibling queue can still fill it, then the frame is counted as missed.
            if self.tx.rings[q].push(InFlight { frame, due }).is_err() {
                self.stats.tx_dropped += 1;
            }
        }
        sent
    }

    fn mac(&self) -> EthernetAddress {
        self.mac
    }

    fn stats(&self) -> DeviceStats {
        self.stats
    }

    fn rss(&self) -> Option<RssConfig> {
        self.rss.clone()
    }

    fn queue(&self) -> u16 {
        self.queue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_tcp(src: SocketAddrV4, dst: SocketAddrV4) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20];
        f[12] = 0x08;
        f[14] = 0x45;
        f[14 + 9] = 6;
        f[26..30].copy_from_slice(&src.ip().octets());
        f[30..34].copy_from_slice(&dst.ip().octets());
        f[34..36].copy_from_slice(&src.port().to_be_bytes());
        f[36..38].copy_from_slice(&dst.port().to_be_bytes());
        f
    }

    #[test]
    fn frames_cross_and_are_steered_by_rss() {
        let cfg = MemConfig {
            queues_b: 4,
            ..MemConfig::default()
        };
        let (a, mut b) = MemPair::build(&cfg).unwrap();
        let rss = b[0].rss().unwrap();
        let dst: SocketAddrV4 = "198.18.0.2:80".parse().unwrap();
        for port in 1000..1064u16 {
            let src = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), port);
            assert!(a[0].inject(Zbuf::from_vec(frame_tcp(src, dst))));
        }
        let mut seen = 0;
        for (q, dev) in b.iter_mut().enumerate() {
            let mut out = Vec::new();
            dev.rx_burst(&mut out, 64);
            for f in &out {
                let (s, d) = tcp_tuple(f).unwrap();
                assert_eq!(usize::from(rss.queue_of_ipv4_tcp(s, d)), q);
            }
            seen += out.len();
        }
        assert_eq!(seen, 64);
        // Non-TCP frames go to queue 0.
        assert!(a[0].inject(Zbuf::from_vec(vec![0xff; 60])));
        let mut out = Vec::new();
        assert_eq!(b[0].rx_burst(&mut out, 8), 1);
    }

    #[test]
    fn full_ring_refuses_and_loss_is_counted() {
        let cfg = MemConfig {
            ring_size: 2,
            ..MemConfig::default()
        };
        let (a, _b) = MemPair::build(&cfg).unwrap();
        assert!(a[0].inject(Zbuf::from_vec(vec![1; 60])));
        assert!(a[0].inject(Zbuf::from_vec(vec![2; 60])));
        assert!(!a[0].inject(Zbuf::from_vec(vec![3; 60])));
        // Loss 1.0: every frame is accepted by the device and lost on the wire.
        let cfg = MemConfig {
            loss: 1.0,
            ..MemConfig::default()
        };
        let (mut a, mut b) = MemPair::build(&cfg).unwrap();
        let mut frames = arp_requests(3);
        assert_eq!(a[0].tx_burst(&mut frames), 3);
        assert!(frames.is_empty());
        assert_eq!(a[0].lost(), 3);
        let mut out = Vec::new();
        assert_eq!(b[0].rx_burst(&mut out, 8), 0);
    }

    /// Real frames from a stack: ARP requests for `n` unresolved neighbours.
    fn arp_requests(n: u8) -> VecDeque<Transmit> {
        use luna_stack::context::testutil::FakeRng;
        use luna_stack::stack::{Stack, StackConfig};
        use luna_stack::time::Instant;
        let cfg = StackConfig::new(
            EthernetAddress([2, 0, 0, 0, 0, 1]),
            "198.18.0.1/24".parse().unwrap(),
        );
        let mut st = Stack::new(cfg, FakeRng::new(7)).unwrap();
        let mut out = VecDeque::new();
        for i in 0..n {
            let remote = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10 + i), 7);
            st.connect(Instant::ZERO, remote, None).unwrap();
            while let Some(t) = st.poll_transmit(Instant::ZERO) {
                out.push_back(t);
            }
        }
        out
    }

    #[test]
    fn latency_holds_frames_back_and_full_rings_refuse_transmits() {
        let cfg = MemConfig {
            ring_size: 2,
            latency: Duration::from_millis(20),
            ..MemConfig::default()
        };
        let (mut a, mut b) = MemPair::build(&cfg).unwrap();
        let mut frames = arp_requests(3);
        // The ring takes two; the third stays with the caller (retry later).
        assert_eq!(a[0].tx_burst(&mut frames), 2);
        assert_eq!(frames.len(), 1);
        let mut out = Vec::new();
        let start = StdInstant::now();
        while out.len() < 2 {
            b[0].rx_burst(&mut out, 8);
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "frames never delivered"
            );
        }
        // With an hour of latency nothing is due yet.
        let cfg = MemConfig {
            latency: Duration::from_secs(3600),
            ..MemConfig::default()
        };
        let (mut a2, mut b2) = MemPair::build(&cfg).unwrap();
        let mut frames = arp_requests(1);
        assert_eq!(a2[0].tx_burst(&mut frames), 1);
        assert_eq!(b2[0].rx_burst(&mut Vec::new(), 8), 0);
        assert_eq!(
            a[0].stats().copied_bytes,
            0,
            "ARP frames have no payload to copy"
        );
        assert_eq!(b[0].stats().rx_frames, 2);
    }

    #[test]
    fn bad_configs_are_refused() {
        let bad = |c: MemConfig| MemPair::build(&c).err().unwrap();
        assert_eq!(
            bad(MemConfig {
                queues_a: 0,
                ..MemConfig::default()
            }),
            MemError::NoQueues
        );
        assert_eq!(
            bad(MemConfig {
                ring_size: 0,
                ..MemConfig::default()
            }),
            MemError::RingSize
        );
        assert!(matches!(
            bad(MemConfig {
                loss: 2.0,
                ..MemConfig::default()
            }),
            MemError::Loss(_)
        ));
        assert!(matches!(
            bad(MemConfig {
                rss_key: vec![1; 4],
                queues_b: 2,
                ..MemConfig::default()
            }),
            MemError::Rss(_)
        ));
    }
}
