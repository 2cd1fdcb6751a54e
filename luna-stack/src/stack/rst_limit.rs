//! A stack-wide token bucket for the RSTs sent in reply to segments that match no
//! connection (RFC 9293 §3.10.7.1), like FreeBSD's `badport_bandlim` (`net.inet.icmp.icmplim`,
//! 200 per second by default). Without it a flood of stray ACKs or SYN-ACKs to a closed port
//! (or a listener) makes luna send an equal flood of RSTs: a reflector for spoofed traffic.
//!
//! Deterministic: the bucket refills from the stack's `now` only. Written here rather than
//! taken from a crate because it is a dozen lines of integer arithmetic on luna's own clock
//! (the rate-limiting crates read the system clock).

use crate::time::Instant;

/// How many no-connection RSTs the stack may send: `per_sec` on average, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RstLimit {
    /// Sustained rate in RSTs per second; 0 means unlimited.
    pub per_sec: u32,
    /// Bucket size: RSTs that may go out back to back after a quiet period (at least 1 is
    /// used when `per_sec` is not 0).
    pub burst: u32,
}

impl RstLimit {
    /// No limit (every stray segment is answered, RFC 9293's letter).
    pub const UNLIMITED: RstLimit = RstLimit {
        per_sec: 0,
        burst: 0,
    };
}

impl Default for RstLimit {
    /// 200 per second with a burst of 200, FreeBSD's `icmplim` default.
    fn default() -> Self {
        RstLimit {
            per_sec: 200,
            burst: 200,
        }
    }
}

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// The bucket's state. Credit is kept in token-nanoseconds (one token is `NANOS_PER_SEC`)
/// so that no fraction of a token is lost between refills, whatever the rate.
#[derive(Debug, Clone)]
pub(super) struct RstBucket {
    limit: RstLimit,
    credit: u64,
    last: Option<Instant>,
}

impl RstBucket {
    /// A full bucket.
    pub(super) fn new(limit: RstLimit) -> Self {
        RstBucket {
            limit,
            credit: Self::cap(limit),
            last: None,
        }
    }

    fn cap(limit: RstLimit) -> u64 {
        u64::from(limit.burst.max(1)).saturating_mul(NANOS_PER_SEC)
    }

    /// Take one token at `now`: `true` if the RST may be sent.
    pub(super) fn take(&mut self, now: Instant) -> bool {
        if self.limit.per_sec == 0 {
            return true;
        }
        let cap = Self::cap(self.limit);
        if let Some(last) = self.last {
            // A clock that goes backwards refills nothing (saturating_duration_since is 0).
            let elapsed = now.as_nanos().saturating_sub(last.as_nanos());
            let gained = elapsed.saturating_mul(u64::from(self.limit.per_sec));
            self.credit = self.credit.saturating_add(gained).min(cap);
        }
        if self.last.is_none_or(|l| now > l) {
            self.last = Some(now);
        }
        if self.credit >= NANOS_PER_SEC {
            self.credit -= NANOS_PER_SEC;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Duration;

    fn sent(b: &mut RstBucket, now: Instant, n: u32) -> u32 {
        (0..n).filter(|_| b.take(now)).count() as u32
    }

    #[test]
    fn burst_then_rate() {
        let mut b = RstBucket::new(RstLimit::default());
        let t0 = Instant::from_millis(1_000);
        // A flood at one instant: exactly the burst goes out.
        assert_eq!(sent(&mut b, t0, 1_000), 200);
        // 100 ms later: 20 more tokens (200/s), no more.
        assert_eq!(sent(&mut b, t0 + Duration::from_millis(100), 1_000), 20);
        // 5 ms later: one.
        assert_eq!(sent(&mut b, t0 + Duration::from_millis(105), 10), 1);
        // A long quiet period refills only up to the burst.
        assert_eq!(sent(&mut b, t0 + Duration::from_secs(60), 1_000), 200);
    }

    #[test]
    fn fractions_are_not_lost() {
        // 3 per second, polled every 100 ms for 10 s: 30 tokens over the burst of 2 (0.3
        // of a token per poll; a burst of 2 keeps the bucket from overflowing in between).
        let mut b = RstBucket::new(RstLimit {
            per_sec: 3,
            burst: 2,
        });
        let t0 = Instant::from_millis(5);
        let mut n = sent(&mut b, t0, 5);
        for i in 1..=100u64 {
            n += sent(&mut b, t0 + Duration::from_millis(100 * i), 5);
        }
        assert_eq!(n, 2 + 30);
    }

    #[test]
    fn zero_rate_is_unlimited() {
        let mut b = RstBucket::new(RstLimit::UNLIMITED);
        assert_eq!(sent(&mut b, Instant::from_millis(1), 100_000), 100_000);
    }

    #[test]
    fn zero_burst_still_lets_the_rate_through() {
        let mut b = RstBucket::new(RstLimit {
            per_sec: 10,
            burst: 0,
        });
        let t0 = Instant::from_millis(0);
        assert_eq!(sent(&mut b, t0, 10), 1);
        assert_eq!(sent(&mut b, t0 + Duration::from_millis(100), 10), 1);
    }

    #[test]
    fn clock_going_backwards_refills_nothing() {
        let mut b = RstBucket::new(RstLimit {
            per_sec: 1_000,
            burst: 2,
        });
        let t0 = Instant::from_millis(10_000);
        assert_eq!(sent(&mut b, t0, 5), 2);
        assert_eq!(sent(&mut b, Instant::from_millis(1_000), 5), 0);
        // Back at t0 + 1 ms: one token, counted from t0, not from the earlier instant.
        assert_eq!(sent(&mut b, t0 + Duration::from_millis(1), 5), 1);
    }

    #[test]
    fn huge_values_saturate() {
        let mut b = RstBucket::new(RstLimit {
            per_sec: u32::MAX,
            burst: u32::MAX,
        });
        assert!(b.take(Instant::from_nanos(0)));
        assert!(b.take(Instant::from_nanos(u64::MAX)));
    }
}
