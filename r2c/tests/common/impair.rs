//! An impairment stage as a [`Device`] wrapper, for luna <-> luna runs over an in-memory
//! link (the soak, `tests/soak.rs`): what the inner device receives is dropped,
//! duplicated, corrupted, delayed with jitter or reordered before the stack sees it.
//!
//! Semantics follow netem (and the testbed's NFQUEUE engine, `testbed/src/nfq.rs`), per
//! received frame and in this order: drop with `loss`%; otherwise deliver one copy, two
//! with `duplicate`%; each copy is corrupted with `corrupt`% (one random bit flipped inside
//! the IPv4 payload, i.e. the TCP header or data, which the TCP checksum covers: a stack
//! that verifies checksums drops every such frame and delivers none of it); then each copy
//! is either delivered at once (`reorder`%, overtaking held frames) or held for
//! `delay ± jitter` (uniform), so jitter reorders too. Decisions come from a seeded
//! SplitMix64: the same seed makes the same decisions for the same frame sequence (when a
//! held frame becomes due depends on the wall clock).
//!
//! Counters are shared atomics ([`FaultCounters`]) so the test reads them after the device
//! has moved to its core's thread.
#![allow(dead_code)]

use luna_stack::stack::Transmit;
use luna_stack::wire::{ChecksumCaps, EthernetAddress};
use r2c::device::{Device, DeviceStats, RssConfig};
use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};
use zbuf::Zbuf;

/// What the stage does to received frames. Percentages are 0–100.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Faults {
    /// Percent of frames dropped.
    pub loss: f64,
    /// Percent of (kept) frames delivered twice.
    pub duplicate: f64,
    /// Percent of delivered copies with one bit flipped in the IPv4 payload.
    pub corrupt: f64,
    /// Percent of copies delivered at once, overtaking the held ones (needs `delay`).
    pub reorder: f64,
    /// Hold time of the other copies.
    pub delay: Duration,
    /// Uniform jitter of the hold time: `delay ± jitter` (at most `delay`).
    pub jitter: Duration,
}

impl Faults {
    /// No impairment.
    pub const NONE: Faults = Faults {
        loss: 0.0,
        duplicate: 0.0,
        corrupt: 0.0,
        reorder: 0.0,
        delay: Duration::ZERO,
        jitter: Duration::ZERO,
    };

    /// Refuses percentages outside 0–100 and a jitter above the delay.
    pub fn validate(&self) -> Result<(), String> {
        for (n, v) in [
            ("loss", self.loss),
            ("duplicate", self.duplicate),
            ("corrupt", self.corrupt),
            ("reorder", self.reorder),
        ] {
            if !(0.0..=100.0).contains(&v) {
                return Err(format!("{n} {v}% is outside 0–100%"));
            }
        }
        if self.jitter > self.delay {
            return Err(format!(
                "jitter {:?} exceeds delay {:?}",
                self.jitter, self.delay
            ));
        }
        Ok(())
    }
}

impl std::fmt::Display for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "loss {}% duplicate {}% corrupt {}% reorder {}% delay {} µs ± {} µs",
            self.loss,
            self.duplicate,
            self.corrupt,
            self.reorder,
            self.delay.as_micros(),
            self.jitter.as_micros()
        )
    }
}

/// What the stage did, shared with the test thread.
#[derive(Debug, Default)]
pub struct FaultCounters {
    /// Frames taken from the inner device.
    pub seen: AtomicU64,
    /// Frames dropped.
    pub dropped: AtomicU64,
    /// Frames delivered twice.
    pub duplicated: AtomicU64,
    /// Copies delivered at once past held ones.
    pub reordered: AtomicU64,
    /// Copies held for `delay ± jitter`.
    pub delayed: AtomicU64,
    /// Corrupted copies handed to the stack (counted on delivery).
    pub corrupted: AtomicU64,
    /// Copies handed to the stack.
    pub delivered: AtomicU64,
}

/// A plain snapshot of [`FaultCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub seen: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub delayed: u64,
    pub corrupted: u64,
    pub delivered: u64,
}

impl FaultCounters {
    pub fn snapshot(&self) -> FaultStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FaultStats {
            seen: g(&self.seen),
            dropped: g(&self.dropped),
            duplicated: g(&self.duplicated),
            reordered: g(&self.reordered),
            delayed: g(&self.delayed),
            corrupted: g(&self.corrupted),
            delivered: g(&self.delivered),
        }
    }
}

impl std::ops::Add for FaultStats {
    type Output = FaultStats;
    fn add(self, o: FaultStats) -> FaultStats {
        FaultStats {
            seen: self.seen + o.seen,
            dropped: self.dropped + o.dropped,
            duplicated: self.duplicated + o.duplicated,
            reordered: self.reordered + o.reordered,
            delayed: self.delayed + o.delayed,
            corrupted: self.corrupted + o.corrupted,
            delivered: self.delivered + o.delivered,
        }
    }
}

/// SplitMix64: small, seedable, good enough to draw percentages.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 100).
    pub fn percent(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 100.0
    }

    /// Uniform in [0, n) (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// A held copy, ordered by due time then arrival (a min-heap through reversed `Ord`).
struct Held {
    due: StdInstant,
    seq: u64,
    frame: Zbuf,
    corrupt: bool,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.seq) == (o.due, o.seq)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> CmpOrdering {
        (o.due, o.seq).cmp(&(self.due, self.seq))
    }
}

/// The byte range a bit flip may hit: the IPv4 payload of an unfragmented IPv4 frame
/// (`None` for anything else: ARP, a truncated frame). Ethernet padding past the IP total
/// length is outside: no checksum covers it.
pub fn ipv4_payload(f: &[u8]) -> Option<std::ops::Range<usize>> {
    if f.len() < 14 + 20 || f[12..14] != [0x08, 0x00] || f[14] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(f[14] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
    let end = 14 + total;
    (ihl >= 20 && total > ihl && end <= f.len()).then_some(14 + ihl..end)
}

/// A device whose received frames pass through the impairment stage first.
pub struct ImpairDevice<D> {
    inner: D,
    faults: Faults,
    rng: SplitMix64,
    held: BinaryHeap<Held>,
    ready: VecDeque<(Zbuf, bool)>,
    seq: u64,
    scratch: Vec<Zbuf>,
    counters: Arc<FaultCounters>,
}

impl<D: Device> ImpairDevice<D> {
    /// Wraps `inner`; panics on invalid `faults` (a test's own configuration).
    pub fn new(inner: D, faults: Faults, seed: u64) -> Self {
        faults.validate().expect("valid faults");
        ImpairDevice {
            inner,
            faults,
            rng: SplitMix64(seed),
            held: BinaryHeap::new(),
            ready: VecDeque::new(),
            seq: 0,
            scratch: Vec::new(),
            counters: Arc::default(),
        }
    }

    /// The counters, to read from another thread.
    pub fn counters(&self) -> Arc<FaultCounters> {
        Arc::clone(&self.counters)
    }

    /// Frames held or waiting for delivery.
    pub fn pending(&self) -> usize {
        self.held.len() + self.ready.len()
    }

    fn corrupt(&mut self, f: &Zbuf) -> Option<Zbuf> {
        let range = ipv4_payload(f)?;
        let bits = (range.len() * 8) as u64;
        let bit = self.rng.below(bits);
        let mut v = f.to_vec();
        v[range.start + (bit / 8) as usize] ^= 1 << (bit % 8);
        Some(Zbuf::from_vec(v))
    }

    fn jittered(&mut self) -> Duration {
        let j = self.faults.jitter.as_nanos() as u64;
        let d = self.faults.delay.as_nanos() as u64;
        if j == 0 {
            return self.faults.delay;
        }
        // delay - jitter + U[0, 2 jitter]
        Duration::from_nanos(d - j + self.rng.below(2 * j + 1))
    }

    fn stage(&mut self, f: Zbuf, now: StdInstant) {
        let c = &self.counters;
        c.seen.fetch_add(1, Ordering::Relaxed);
        if self.rng.percent() < self.faults.loss {
            c.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let copies = if self.rng.percent() < self.faults.duplicate {
            c.duplicated.fetch_add(1, Ordering::Relaxed);
            2
        } else {
            1
        };
        for _ in 0..copies {
            let (frame, corrupt) = if self.rng.percent() < self.faults.corrupt {
                match self.corrupt(&f) {
                    Some(bad) => (bad, true),
                    None => (f.clone(), false),
                }
            } else {
                (f.clone(), false)
            };
            if self.faults.delay.is_zero() || self.rng.percent() < self.faults.reorder {
                if !self.faults.delay.is_zero() {
                    self.counters.reordered.fetch_add(1, Ordering::Relaxed);
                }
                self.ready.push_back((frame, corrupt));
            } else {
                self.counters.delayed.fetch_add(1, Ordering::Relaxed);
                let due = now + self.jittered();
                self.seq += 1;
                self.held.push(Held {
                    due,
                    seq: self.seq,
                    frame,
                    corrupt,
                });
            }
        }
    }
}

impl<D: Device> Device for ImpairDevice<D> {
    fn rx_burst(&mut self, out: &mut Vec<Zbuf>, max: usize) -> usize {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        self.inner.rx_burst(&mut scratch, max);
        let now = StdInstant::now();
        for f in scratch.drain(..) {
            self.stage(f, now);
        }
        self.scratch = scratch;
        while self.held.peek().is_some_and(|h| h.due <= now) {
            let h = self.held.pop().expect("peeked");
            self.ready.push_back((h.frame, h.corrupt));
        }
        let mut n = 0;
        while n < max {
            let Some((f, corrupt)) = self.ready.pop_front() else {
                break;
            };
            if corrupt {
                self.counters.corrupted.fetch_add(1, Ordering::Relaxed);
            }
            self.counters.delivered.fetch_add(1, Ordering::Relaxed);
            out.push(f);
            n += 1;
        }
        n
    }

    fn tx_burst(&mut self, frames: &mut VecDeque<Transmit>) -> usize {
        self.inner.tx_burst(frames)
    }

    fn mac(&self) -> EthernetAddress {
        self.inner.mac()
    }

    fn caps(&self) -> ChecksumCaps {
        self.inner.caps()
    }

    fn mtu(&self) -> u16 {
        self.inner.mtu()
    }

    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }

    fn rss(&self) -> Option<RssConfig> {
        self.inner.rss()
    }

    fn queue(&self) -> u16 {
        self.inner.queue()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use r2c::device::mem::MemPair;

    /// An IPv4/TCP-looking frame of `payload` bytes after a 20-byte IP header, padded.
    fn frame(id: u16, payload: usize) -> Zbuf {
        let total = 20 + payload;
        let mut f = vec![0u8; (14 + total).max(60)];
        f[12] = 0x08;
        f[14] = 0x45;
        f[16..18].copy_from_slice(&(total as u16).to_be_bytes());
        f[18..20].copy_from_slice(&id.to_be_bytes());
        f[14 + 9] = 6;
        Zbuf::from_vec(f)
    }

    fn id_of(f: &[u8]) -> u16 {
        u16::from_be_bytes([f[18], f[19]])
    }

    /// Pushes `n` frames through a MemPair into a stage with `faults`; returns what
    /// came out (ids) and the counters.
    fn run(faults: Faults, n: u16, payload: usize) -> (Vec<Zbuf>, FaultStats) {
        let (a, b) = MemPair::single();
        let mut dev = ImpairDevice::new(b, faults, 99);
        let mut out = Vec::new();
        for i in 0..n {
            assert!(a.inject(frame(i, payload)));
            dev.rx_burst(&mut out, 64);
        }
        let end = StdInstant::now() + Duration::from_secs(10);
        while dev.pending() > 0 {
            dev.rx_burst(&mut out, 64);
            assert!(StdInstant::now() < end, "held frames never became due");
        }
        (out, dev.counters.snapshot())
    }

    #[test]
    fn the_rates_and_the_counts_add_up() {
        let faults = Faults {
            loss: 3.0,
            duplicate: 2.0,
            corrupt: 5.0,
            reorder: 25.0,
            delay: Duration::from_micros(200),
            jitter: Duration::from_micros(150),
        };
        let n = 20_000;
        let (out, st) = run(faults, n, 100);
        assert_eq!(st.seen, u64::from(n));
        let kept = st.seen - st.dropped;
        assert_eq!(st.delivered, kept + st.duplicated);
        assert_eq!(out.len() as u64, st.delivered);
        assert_eq!(st.reordered + st.delayed, st.delivered);
        let pct = |x: u64, of: u64| x as f64 * 100.0 / of as f64;
        assert!((pct(st.dropped, st.seen) - 3.0).abs() < 0.5, "{st:?}");
        assert!((pct(st.duplicated, kept) - 2.0).abs() < 0.5, "{st:?}");
        assert!(
            (pct(st.corrupted, st.delivered) - 5.0).abs() < 0.7,
            "{st:?}"
        );
        assert!(
            (pct(st.reordered, st.delivered) - 25.0).abs() < 1.5,
            "{st:?}"
        );
        // Frames arrive out of order, each id at most twice.
        let ids: Vec<u16> = out.iter().map(|f| id_of(f)).collect();
        assert!(ids.windows(2).filter(|w| w[1] < w[0]).count() > 100);
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len() as u64, kept);
        // Exactly `corrupted` frames differ from the original, each by one bit inside the
        // IP payload, never in the padding or the headers.
        let mut flipped = 0;
        for f in &out {
            let orig = frame(id_of(f), 100);
            let diff: u32 = f
                .iter()
                .zip(orig.iter())
                .map(|(x, y)| (x ^ y).count_ones())
                .sum();
            if diff > 0 {
                assert_eq!(diff, 1);
                let at = f.iter().zip(orig.iter()).position(|(x, y)| x != y).unwrap();
                assert!((34..34 + 100).contains(&at), "bit flipped at byte {at}");
                flipped += 1;
            }
        }
        assert_eq!(flipped, st.corrupted);
    }

    #[test]
    fn no_faults_pass_everything_in_order_and_non_ip_is_never_corrupted() {
        let (out, st) = run(Faults::NONE, 500, 10);
        assert_eq!(st.delivered, 500);
        let ids: Vec<u16> = out.iter().map(|f| id_of(f)).collect();
        assert_eq!(ids, (0..500).collect::<Vec<_>>());
        // ARP (not IPv4): delivered untouched even at corrupt 100%.
        let (a, b) = MemPair::single();
        let all = Faults {
            corrupt: 100.0,
            ..Faults::NONE
        };
        let mut dev = ImpairDevice::new(b, all, 1);
        let mut arp = vec![0u8; 60];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(a.inject(Zbuf::from_vec(arp.clone())));
        let mut got = Vec::new();
        assert_eq!(dev.rx_burst(&mut got, 8), 1);
        assert_eq!(&got[0][..], &arp[..]);
        assert_eq!(dev.counters.snapshot().corrupted, 0);
        assert!(ipv4_payload(&[0u8; 10]).is_none());
    }

    #[test]
    fn bad_faults_are_refused() {
        let bad = Faults {
            loss: 101.0,
            ..Faults::NONE
        };
        assert!(bad.validate().unwrap_err().contains("loss"));
        let bad = Faults {
            delay: Duration::from_micros(1),
            jitter: Duration::from_micros(2),
            ..Faults::NONE
        };
        assert!(bad.validate().unwrap_err().contains("jitter"));
    }
}
