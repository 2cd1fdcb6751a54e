//! The luna -> kernel impairment stage: sits between `Stack::poll_transmit` and
//! `tx_burst` in the luna child's poll loop, with the testbed engine's (netem's)
//! semantics, so both directions see the same loss, duplication and reordering.
//!
//! Per packet, in netem's order: drop with `loss`%; otherwise clone with `duplicate`%
//! (the copy travels with the original); flip one bit of the original with `corrupt`%
//! (the caller's function picks the bit, see `luna::corrupt_tcp`; the copy stays clean,
//! as in the testbed engine); then either send at once (`reorder`%) or hold for
//! `delay ± jitter` (uniform). A corrupted packet is counted when it leaves the stage, so
//! `StageStats::corrupted` is what reached the device once the stage is flushed.
//!
//! Without jitter all held packets wait the same delay, so
//! the hold queue is FIFO and the packets sent at once overtake it: that is the
//! reordering; with jitter held packets also overtake each other (as in netem).

use std::collections::VecDeque;

use super::LinkImpair;

/// SplitMix64: small, seedable, good enough to draw percentages.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

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
}

/// What the stage did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageStats {
    pub seen: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub delayed: u64,
    pub reordered: u64,
    /// Corrupted packets that left the stage.
    pub corrupted: u64,
}

/// The stage over items of type `T` (the luna child uses `Transmit`; the unit tests
/// numbers). Time is nanoseconds on the caller's clock.
pub struct Stage<T> {
    cfg: LinkImpair,
    rng: SplitMix64,
    held: VecDeque<(u64, T, bool)>,
    pub stats: StageStats,
}

impl<T: Clone> Stage<T> {
    pub fn new(cfg: LinkImpair, seed: u64) -> Self {
        Stage {
            cfg,
            rng: SplitMix64::new(seed),
            held: VecDeque::new(),
            stats: StageStats::default(),
        }
    }

    /// Decides `item`'s fate at `now`: dropped, sent now (pushed to `out`) or held.
    pub fn push(&mut self, now: u64, item: T, out: &mut VecDeque<T>) {
        self.push_with(now, item, out, |_, _| false);
    }

    /// [`push`](Self::push) with corruption: `corrupt(item, r)` flips one bit of `item`
    /// chosen by the random `r` and says whether it did.
    pub fn push_with(
        &mut self,
        now: u64,
        mut item: T,
        out: &mut VecDeque<T>,
        mut corrupt: impl FnMut(&mut T, u64) -> bool,
    ) {
        self.stats.seen += 1;
        if self.rng.percent() < self.cfg.loss {
            self.stats.dropped += 1;
            return;
        }
        let dup = self.rng.percent() < self.cfg.duplicate;
        let copy = dup.then(|| item.clone());
        if dup {
            self.stats.duplicated += 1;
        }
        // Drawn only when asked for, so plans without corruption keep their sequence.
        let bad = self.cfg.corrupt > 0.0 && self.rng.percent() < self.cfg.corrupt && {
            let r = self.rng.next_u64();
            corrupt(&mut item, r)
        };
        let delay = self.cfg.delay.as_nanos() as u64;
        let jitter = (self.cfg.jitter.as_nanos() as u64).min(delay);
        if delay == 0 || self.rng.percent() < self.cfg.reorder {
            if delay > 0 {
                self.stats.reordered += 1;
            }
            self.stats.corrupted += u64::from(bad);
            out.push_back(item);
            out.extend(copy);
        } else {
            self.stats.delayed += 1;
            let due = if jitter == 0 {
                now + delay
            } else {
                // delay - jitter + U[0, 2 jitter]
                let r =
                    ((u128::from(self.rng.next_u64()) * u128::from(2 * jitter + 1)) >> 64) as u64;
                now + delay - jitter + r
            };
            // Kept sorted by due time (stable: equal times keep their order).
            let at = self.held.partition_point(|(d, _, _)| *d <= due);
            self.held.insert(at, (due, item, bad));
            if let Some(c) = copy {
                self.held.insert(at + 1, (due, c, false));
            }
        }
    }

    /// Moves every held item due at `now` to `out`, in order.
    pub fn release(&mut self, now: u64, out: &mut VecDeque<T>) {
        while self.held.front().is_some_and(|(due, _, _)| *due <= now) {
            if let Some((_, t, bad)) = self.held.pop_front() {
                self.stats.corrupted += u64::from(bad);
                out.push_back(t);
            }
        }
    }

    /// Items held for later.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn run(cfg: LinkImpair, seed: u64, n: u32) -> (Vec<u32>, StageStats) {
        let mut s = Stage::new(cfg, seed);
        let mut out = VecDeque::new();
        for i in 0..n {
            // One packet per 10 µs; the delay is in nanoseconds.
            s.push(u64::from(i) * 10_000, i, &mut out);
            s.release(u64::from(i) * 10_000, &mut out);
        }
        s.release(u64::MAX, &mut out);
        assert_eq!(s.held(), 0);
        (out.into_iter().collect(), s.stats)
    }

    #[test]
    fn no_impairment_passes_everything_in_order() {
        let cfg = LinkImpair {
            loss: 0.0,
            reorder: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
        };
        let (out, st) = run(cfg, 1, 1000);
        assert_eq!(out, (0..1000).collect::<Vec<_>>());
        assert_eq!(st.seen, 1000);
        assert_eq!(st.dropped + st.duplicated + st.delayed + st.reordered, 0);
    }

    #[test]
    fn acceptance_rates_are_close_to_the_configured_percentages() {
        let n = 200_000;
        let (out, st) = run(LinkImpair::acceptance(), 42, n);
        let pct = |x: u64| x as f64 * 100.0 / f64::from(n);
        assert!((pct(st.dropped) - 2.0).abs() < 0.2, "{st:?}");
        let kept = st.seen - st.dropped;
        let of_kept = |x: u64| x as f64 * 100.0 / kept as f64;
        assert!((of_kept(st.duplicated) - 1.0).abs() < 0.15, "{st:?}");
        assert!((of_kept(st.reordered) - 25.0).abs() < 0.6, "{st:?}");
        assert_eq!(st.reordered + st.delayed, kept);
        assert_eq!(out.len() as u64, kept + st.duplicated);
        // Reordered: some packet arrives before one sent earlier.
        let inversions = out.windows(2).filter(|w| w[1] < w[0]).count();
        assert!(inversions > 1000, "{inversions} inversions");
        // Every kept packet arrives, duplicates exactly twice.
        let mut sorted = out.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len() as u64, kept);
    }

    #[test]
    fn held_packets_wait_the_delay_and_keep_their_order() {
        let cfg = LinkImpair {
            loss: 0.0,
            reorder: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            delay: Duration::from_millis(1),
            jitter: Duration::ZERO,
        };
        let mut s = Stage::new(cfg, 3);
        let mut out = VecDeque::new();
        s.push(0, 1u32, &mut out);
        s.push(500_000, 2, &mut out);
        s.release(999_999, &mut out);
        assert!(out.is_empty());
        s.release(1_000_000, &mut out);
        assert_eq!(out, [1]);
        s.release(1_500_000, &mut out);
        assert_eq!(out, [1, 2]);
    }

    #[test]
    fn jitter_spreads_the_hold_time_and_reorders_held_packets() {
        let cfg = LinkImpair {
            loss: 0.0,
            reorder: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            delay: Duration::from_millis(1),
            jitter: Duration::from_micros(500),
        };
        let mut s = Stage::new(cfg, 5);
        let mut out = VecDeque::new();
        for i in 0..1000u32 {
            s.push(u64::from(i) * 10_000, i, &mut out);
        }
        assert!(out.is_empty(), "every packet is held");
        // Nothing is due before delay - jitter, everything by delay + jitter.
        s.release(500_000 - 1, &mut out);
        assert!(out.is_empty());
        s.release(999 * 10_000 + 1_500_000, &mut out);
        assert_eq!(s.held(), 0);
        let v: Vec<u32> = out.into_iter().collect();
        assert!(v.windows(2).filter(|w| w[1] < w[0]).count() > 50);
        let mut sorted = v.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn corruption_hits_the_original_only_and_is_counted_when_it_leaves() {
        let cfg = LinkImpair {
            loss: 1.0,
            reorder: 30.0,
            duplicate: 5.0,
            corrupt: 10.0,
            delay: Duration::from_millis(1),
            jitter: Duration::from_micros(300),
        };
        let mut s = Stage::new(cfg, 77);
        let mut out = VecDeque::new();
        // Corrupting marks the item: the high bit set.
        let flip = |x: &mut u32, _r: u64| {
            *x |= 1 << 31;
            true
        };
        let n = 50_000u32;
        for i in 0..n {
            s.push_with(u64::from(i) * 10_000, i, &mut out, flip);
            s.release(u64::from(i) * 10_000, &mut out);
        }
        // Held ones are not counted yet.
        let marked = |o: &VecDeque<u32>| o.iter().filter(|&&x| x >> 31 == 1).count() as u64;
        assert_eq!(s.stats.corrupted, marked(&out));
        assert!(s.held() > 0);
        s.release(u64::MAX, &mut out);
        let st = s.stats;
        assert_eq!(st.corrupted, marked(&out));
        let kept = st.seen - st.dropped;
        let pct = st.corrupted as f64 * 100.0 / kept as f64;
        assert!((pct - 10.0).abs() < 0.6, "{st:?}");
        // A duplicated packet that was corrupted has a clean copy.
        let clean: std::collections::BTreeSet<u32> =
            out.iter().filter(|&&x| x >> 31 == 0).copied().collect();
        let dup_of_bad = out
            .iter()
            .filter(|&&x| x >> 31 == 1 && clean.contains(&(x & !(1 << 31))))
            .count();
        assert!(dup_of_bad > 0, "{st:?}");
        assert_eq!(out.len() as u64, kept + st.duplicated);
        // A corrupt function that declines (nothing to flip) counts nothing.
        let mut s = Stage::new(cfg, 78);
        let mut out = VecDeque::new();
        for i in 0..5000u32 {
            s.push_with(0, i, &mut out, |_, _| false);
        }
        s.release(u64::MAX, &mut out);
        assert_eq!(s.stats.corrupted, 0);
    }

    #[test]
    fn the_same_seed_makes_the_same_decisions() {
        let a = run(LinkImpair::acceptance(), 9, 5000);
        let b = run(LinkImpair::acceptance(), 9, 5000);
        let c = run(LinkImpair::acceptance(), 10, 5000);
        assert_eq!(a, b);
        assert_ne!(a.0, c.0);
    }
}
