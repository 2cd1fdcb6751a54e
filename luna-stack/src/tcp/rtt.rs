//! Round-trip time estimation and the retransmission timeout (RFC 6298).
//!
//! Contract:
//! - The connection measures RTT samples (from an un-retransmitted segment's send time, or from
//!   the timestamps option, RFC 7323 §4) and feeds them to [`RttEstimator::on_sample`] with a
//!   [`SampleSource`] saying which; Karn's algorithm (RFC 6298 §3) is applied here, so the
//!   caller may pass every sample it has.
//! - When the retransmission timer fires the connection calls [`RttEstimator::on_timeout`]
//!   (RFC 6298 §5.5 back-off) and re-arms the timer with [`RttEstimator::rto`].
//! - The estimator never reads a clock; `now` only timestamps `min_rtt` samples.
//! - It holds no copy of its [`RttConfig`]: the methods that need the tunables take the
//!   config the estimator was created with (a connection passes its stack's shared
//!   `TcpConfig::rtt`), so 5,000 connections read one copy instead of 5,000 (issue 13).
//!   That config must pass [`RttConfig::validate`]; an invalid one still never panics.
//! - All arithmetic is integer nanoseconds, saturating: a hostile timestamp echo can produce an
//!   absurd sample but never a panic or an RTO outside `[min_rto, max_rto]`.
//!
//! Deviation from RFC 6298 §2.4 (explicit in [`RttConfig`]): the RTO floor defaults to 200 ms
//! (as Linux) instead of 1 s, and can be lowered further for datacenter RTTs.

use crate::time::{Duration, Instant};
use core::fmt;

/// Largest RTT sample accepted, in nanoseconds (~13 days). Larger samples are clamped so that
/// `8 * srtt` cannot overflow; anything this large is a bogus timestamp echo anyway.
const MAX_SAMPLE_NS: u64 = 1 << 50;

/// Tunables of the RTO computation. All are explicit so that datacenter deployments can lower
/// them knowingly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RttConfig {
    /// RTO before the first sample. RFC 6298 §2.1: 1 s. Default 1 s.
    pub initial_rto: Duration,
    /// Floor of the RTO. RFC 6298 §2.4 says 1 s; default 200 ms (Linux `TCP_RTO_MIN`).
    pub min_rto: Duration,
    /// Ceiling of the RTO, also caps back-off. RFC 6298 §2.5 allows a maximum of at least
    /// 60 s; default 60 s.
    pub max_rto: Duration,
    /// Clock granularity G of RFC 6298 §2.2/§2.3. Default 1 ms.
    pub granularity: Duration,
    /// RTO to fall back to when the handshake's SYN or SYN-ACK was retransmitted and no sample
    /// exists (RFC 6298 §5.7: 3 s). Default 3 s.
    pub syn_timeout_rto: Duration,
    /// Window of the windowed minimum RTT filter. Default 300 s (Linux `tcp_min_rtt_wlen`).
    pub min_rtt_window: Duration,
}

impl Default for RttConfig {
    fn default() -> Self {
        RttConfig {
            initial_rto: Duration::from_secs(1),
            min_rto: Duration::from_millis(200),
            max_rto: Duration::from_secs(60),
            granularity: Duration::from_millis(1),
            syn_timeout_rto: Duration::from_secs(3),
            min_rtt_window: Duration::from_secs(300),
        }
    }
}

/// Why an [`RttConfig`] was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RttConfigError {
    /// `min_rto` is zero or above `max_rto`.
    MinAboveMax,
    /// `initial_rto` or `syn_timeout_rto` lies outside `[min_rto, max_rto]`.
    InitialOutOfRange,
    /// `min_rtt_window` is zero.
    ZeroMinRttWindow,
}

impl fmt::Display for RttConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RttConfigError::MinAboveMax => "min_rto must be non-zero and not above max_rto",
            RttConfigError::InitialOutOfRange => {
                "initial_rto and syn_timeout_rto must lie within [min_rto, max_rto]"
            }
            RttConfigError::ZeroMinRttWindow => "min_rtt_window must be non-zero",
        })
    }
}

impl std::error::Error for RttConfigError {}

impl RttConfig {
    /// Check the invariants [`RttEstimator`] relies on.
    pub fn validate(&self) -> Result<(), RttConfigError> {
        if self.min_rto.is_zero() || self.min_rto > self.max_rto {
            return Err(RttConfigError::MinAboveMax);
        }
        let range = self.min_rto..=self.max_rto;
        if !range.contains(&self.initial_rto) || !range.contains(&self.syn_timeout_rto) {
            return Err(RttConfigError::InitialOutOfRange);
        }
        if self.min_rtt_window.is_zero() {
            return Err(RttConfigError::ZeroMinRttWindow);
        }
        Ok(())
    }
}

/// Where an RTT sample came from; decides whether Karn's algorithm discards it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleSource {
    /// Timed from a segment that was transmitted exactly once.
    Fresh,
    /// Timed from a segment that was retransmitted: ambiguous, discarded (RFC 6298 §3, Karn).
    Retransmitted,
    /// Computed from an echoed timestamp (RFC 7323 §4): unambiguous even for retransmissions.
    Timestamp,
}

/// Saturating conversion of a duration to nanoseconds: `d.as_nanos()` clamped to
/// `u64::MAX`, in 64-bit arithmetic (`as_nanos` multiplies in 128 bits).
#[inline]
pub(crate) fn nanos(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(d.subsec_nanos()))
}

/// A windowed minimum over (time, value) samples: the best, second-best and third-best
/// candidates from successive sub-windows, so that the minimum expires after `window` without
/// storing every sample (Kathleen Nichols' algorithm, as used for BBR/RACK min_rtt).
#[derive(Debug, Clone, Copy, Default)]
struct WindowedMin {
    s: [(u64, u64); 3],
    valid: bool,
}

impl WindowedMin {
    fn get(&self) -> Option<u64> {
        self.valid.then_some(self.s[0].1)
    }

    fn update(&mut self, now: u64, val: u64, win: u64) {
        let fresh = (now, val);
        if !self.valid || val <= self.s[0].1 || now.saturating_sub(self.s[2].0) > win {
            self.s = [fresh; 3];
            self.valid = true;
            return;
        }
        if val <= self.s[1].1 {
            self.s[1] = fresh;
            self.s[2] = fresh;
        } else if val <= self.s[2].1 {
            self.s[2] = fresh;
        }
        let dt = now.saturating_sub(self.s[0].0);
        if dt > win {
            // The best expired: promote the runners-up.
            self.s = [self.s[1], self.s[2], fresh];
            if now.saturating_sub(self.s[0].0) > win {
                self.s = [self.s[1], self.s[2], fresh];
            }
        } else if self.s[1].0 == self.s[0].0 && dt > win / 4 {
            // A quarter window passed with no second choice: take one.
            self.s[1] = fresh;
            self.s[2] = fresh;
        } else if self.s[2].0 == self.s[1].0 && dt > win / 2 {
            self.s[2] = fresh;
        }
    }
}

/// RFC 6298 RTT estimator and RTO calculator with exponential back-off.
///
/// The per-connection state only (128 bytes, two cache lines); the tunables are the
/// [`RttConfig`] passed to the methods that need them (see the module documentation).
#[derive(Debug, Clone)]
pub struct RttEstimator {
    /// SRTT and RTTVAR in nanoseconds; meaningful once `has_sample`.
    srtt: u64,
    rttvar: u64,
    /// `rto()` in nanoseconds, recomputed by every method that changes its inputs (the
    /// stack asks for it on every send after idle and every RTO arm; the clamp and
    /// back-off arithmetic over `Duration`s cost more than the lookup).
    rto_ns: u64,
    /// RTO before any sample (initial or SYN-timeout fallback).
    unsampled_rto: u64,
    latest: Option<u64>,
    lifetime_min: Option<u64>,
    min_filter: WindowedMin,
    backoff: u32,
    has_sample: bool,
}

impl Default for RttEstimator {
    /// An estimator for [`RttConfig::default`] (pass that config to its methods).
    fn default() -> Self {
        Self::with_valid_config(&RttConfig::default())
    }
}

impl RttEstimator {
    /// An estimator with no samples: `rto()` is `initial_rto` (RFC 6298 §2.1). `cfg` is
    /// not kept: pass the same config to the methods that take one.
    pub fn new(cfg: &RttConfig) -> Result<Self, RttConfigError> {
        cfg.validate()?;
        Ok(Self::with_valid_config(cfg))
    }

    fn with_valid_config(cfg: &RttConfig) -> Self {
        RttEstimator {
            srtt: 0,
            rttvar: 0,
            has_sample: false,
            latest: None,
            min_filter: WindowedMin::default(),
            lifetime_min: None,
            unsampled_rto: nanos(cfg.initial_rto),
            backoff: 0,
            rto_ns: 0,
        }
        .with_rto(cfg)
    }

    fn with_rto(mut self, cfg: &RttConfig) -> Self {
        self.refresh_rto(cfg);
        self
    }

    /// Recompute the cached `rto()` after SRTT, RTTVAR, the unsampled RTO or the back-off
    /// changed.
    #[inline]
    fn refresh_rto(&mut self, cfg: &RttConfig) {
        self.rto_ns = self.computed_rto_ns(cfg);
    }

    /// Feed one RTT measurement taken at `now`. Returns whether it was used: samples from
    /// retransmitted segments are discarded (Karn), unless they come from timestamps.
    pub fn on_sample(
        &mut self,
        cfg: &RttConfig,
        now: Instant,
        rtt: Duration,
        source: SampleSource,
    ) -> bool {
        // RFC 6298 §3: RTT samples MUST NOT be made using segments that were retransmitted
        // (Karn's algorithm) -- unless the timestamps option disambiguates them (RFC 7323 §4).
        if source == SampleSource::Retransmitted {
            return false;
        }
        let r = nanos(rtt).min(MAX_SAMPLE_NS);
        if self.has_sample {
            // RFC 6298 §2.3: RTTVAR <- (1 - 1/4) * RTTVAR + 1/4 * |SRTT - R'|, then
            // SRTT <- (1 - 1/8) * SRTT + 1/8 * R' (RTTVAR first: it uses the old SRTT).
            let err = self.srtt.abs_diff(r);
            self.rttvar = (3 * self.rttvar + err) / 4;
            self.srtt = (7 * self.srtt + r) / 8;
        } else {
            // RFC 6298 §2.2: first measurement R: SRTT <- R, RTTVAR <- R/2.
            self.srtt = r;
            self.rttvar = r / 2;
            self.has_sample = true;
        }
        self.latest = Some(r);
        self.lifetime_min = Some(self.lifetime_min.map_or(r, |m| m.min(r)));
        self.min_filter
            .update(now.as_nanos(), r, nanos(cfg.min_rtt_window));
        // RFC 6298 §5.7 / Karn: a valid sample ends the backed-off state; the RTO is
        // recomputed from SRTT/RTTVAR.
        self.backoff = 0;
        self.refresh_rto(cfg);
        true
    }

    /// The retransmission timer expired: double the RTO (RFC 6298 §5.5), capped at `max_rto`.
    pub fn on_timeout(&mut self, cfg: &RttConfig) {
        // Once the cap is reached further doubling changes nothing; stop counting at 32 so the
        // shift below can never overflow.
        if self.backoff < 32 {
            self.backoff += 1;
        }
        self.refresh_rto(cfg);
    }

    /// The handshake's SYN (or SYN-ACK) was retransmitted and data transfer now begins. If no
    /// sample exists and the RTO is below `syn_timeout_rto`, RFC 6298 §5.7 says it MUST be
    /// re-initialised to 3 s (configurable as `syn_timeout_rto`). Also clears back-off.
    pub fn on_handshake_retransmitted(&mut self, cfg: &RttConfig) {
        // RFC 6298 §5.7: SYN timed out and RTO < 3 s: RTO <- 3 s when data transmission begins.
        if !self.has_sample {
            self.unsampled_rto = self.unsampled_rto.max(nanos(cfg.syn_timeout_rto));
        }
        self.backoff = 0;
        self.refresh_rto(cfg);
    }

    /// The RTO before back-off: SRTT + max(G, 4 * RTTVAR) clamped to `[min_rto, max_rto]`.
    pub fn base_rto(&self, cfg: &RttConfig) -> Duration {
        Duration::from_nanos(self.base_rto_ns(cfg))
    }

    /// [`base_rto`](Self::base_rto) in nanoseconds.
    #[inline]
    fn base_rto_ns(&self, cfg: &RttConfig) -> u64 {
        let raw = if self.has_sample {
            // RFC 6298 §2.3: RTO <- SRTT + max (G, K*RTTVAR), K = 4.
            let var = nanos(cfg.granularity).max(self.rttvar.saturating_mul(4));
            self.srtt.saturating_add(var)
        } else {
            self.unsampled_rto
        };
        // RFC 6298 §2.4: RTO below the floor is rounded up (1 s in the RFC; configurable floor
        // for datacenter RTTs). §2.5: a maximum may be placed on RTO (at least 60 s).
        // (`max` then `min`, not `clamp`: an invalid config with min_rto > max_rto must not
        // panic; it gets max_rto.)
        raw.max(nanos(cfg.min_rto)).min(nanos(cfg.max_rto))
    }

    /// The current retransmission timeout, including back-off (cached: equal to
    /// [`computed_rto`](Self::computed_rto) for the estimator's config).
    #[inline]
    pub fn rto(&self) -> Duration {
        Duration::from_nanos(self.rto_ns)
    }

    /// [`rto`](Self::rto) in nanoseconds.
    #[inline]
    pub fn rto_nanos(&self) -> u64 {
        self.rto_ns
    }

    /// `rto()` computed from the estimator's state and `cfg` (RFC 6298 §5.5 back-off, §2.5
    /// cap), not from the cache: for checking the cache (the connection compares the two
    /// on every RTO read in debug builds).
    pub fn computed_rto(&self, cfg: &RttConfig) -> Duration {
        Duration::from_nanos(self.computed_rto_ns(cfg))
    }

    /// [`computed_rto`](Self::computed_rto) in nanoseconds (no `Duration` round trips:
    /// the cache is refreshed on every RTT sample).
    #[inline]
    fn computed_rto_ns(&self, cfg: &RttConfig) -> u64 {
        let base = self.base_rto_ns(cfg);
        let max = nanos(cfg.max_rto);
        // RFC 6298 §5.5: RTO <- RTO * 2 per expiry; §2.5: capped at the maximum.
        if self.backoff >= 64 || base.leading_zeros() < self.backoff {
            max
        } else {
            (base << self.backoff).min(max)
        }
    }

    /// Number of consecutive timeouts since the last valid sample.
    pub fn backoff_count(&self) -> u32 {
        self.backoff
    }

    /// Smoothed RTT, once a sample exists.
    pub fn srtt(&self) -> Option<Duration> {
        self.has_sample.then(|| Duration::from_nanos(self.srtt))
    }

    /// Smoothed RTT in nanoseconds, once a sample exists (for per-segment arithmetic).
    #[inline]
    pub fn srtt_nanos(&self) -> Option<u64> {
        self.has_sample.then_some(self.srtt)
    }

    /// RTT variation, once a sample exists.
    pub fn rttvar(&self) -> Option<Duration> {
        self.has_sample.then(|| Duration::from_nanos(self.rttvar))
    }

    /// The most recent accepted sample.
    pub fn latest_rtt(&self) -> Option<Duration> {
        self.latest.map(Duration::from_nanos)
    }

    /// Minimum RTT over the last `min_rtt_window` (approximately; see [`RttConfig`]).
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_filter.get().map(Duration::from_nanos)
    }

    /// Minimum RTT over the connection's lifetime.
    pub fn lifetime_min_rtt(&self) -> Option<Duration> {
        self.lifetime_min.map(Duration::from_nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An estimator with the config it was made for, passed to every call; `rto()` checks
    /// the cache against the computation each time (a stale cache fails the test).
    struct Est {
        e: RttEstimator,
        cfg: RttConfig,
    }

    impl Est {
        fn new(cfg: RttConfig) -> Self {
            Est {
                e: RttEstimator::new(&cfg).unwrap(),
                cfg,
            }
        }
        fn default() -> Self {
            Est::new(RttConfig::default())
        }
        fn on_sample(&mut self, now: Instant, rtt: Duration, source: SampleSource) -> bool {
            self.e.on_sample(&self.cfg, now, rtt, source)
        }
        fn on_timeout(&mut self) {
            self.e.on_timeout(&self.cfg);
        }
        fn on_handshake_retransmitted(&mut self) {
            self.e.on_handshake_retransmitted(&self.cfg);
        }
        fn rto(&self) -> Duration {
            let rto = self.e.rto();
            assert_eq!(rto, self.e.computed_rto(&self.cfg), "stale cached RTO");
            rto
        }
        fn base_rto(&self) -> Duration {
            self.e.base_rto(&self.cfg)
        }
    }

    impl core::ops::Deref for Est {
        type Target = RttEstimator;
        fn deref(&self) -> &RttEstimator {
            &self.e
        }
    }

    /// `nanos` in 64 bits is the 128-bit `as_nanos` clamped to `u64::MAX`.
    #[test]
    fn nanos_is_as_nanos_saturated() {
        let wide = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let max_secs = u64::MAX / 1_000_000_000;
        let mut cases = vec![
            Duration::ZERO,
            Duration::MAX,
            Duration::from_nanos(u64::MAX),
        ];
        for secs in [
            0,
            1,
            max_secs - 1,
            max_secs,
            max_secs + 1,
            u64::MAX / 2,
            u64::MAX,
        ] {
            for sub in [0, 1, 709_551_615, 709_551_616, 999_999_999] {
                cases.push(Duration::new(secs, sub));
            }
        }
        for d in cases {
            assert_eq!(nanos(d), wide(d), "{d:?}");
        }
    }

    proptest! {
        /// `nanos` agrees with the 128-bit conversion for any duration.
        #[test]
        fn nanos_agrees_with_as_nanos(secs in any::<u64>(), sub in 0u32..1_000_000_000) {
            let d = Duration::new(secs, sub);
            prop_assert_eq!(nanos(d), u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        }

        /// Samples can come from peer timestamps: any sequence keeps the RTO within
        /// [min_rto, max_rto] (RFC 6298 §2.4, §2.5) and never panics.
        #[test]
        fn rfc6298_2_4_rto_always_within_bounds(
            min_ms in 1u64..1000,
            span_ms in 0u64..100_000,
            ops in proptest::collection::vec((any::<u64>(), 0u8..4), 1..100),
        ) {
            let cfg = RttConfig {
                min_rto: Duration::from_millis(min_ms),
                max_rto: Duration::from_millis(min_ms + span_ms),
                initial_rto: Duration::from_millis(min_ms),
                syn_timeout_rto: Duration::from_millis(min_ms),
                ..RttConfig::default()
            };
            let mut e = Est::new(cfg);
            for (i, (v, kind)) in ops.into_iter().enumerate() {
                let now = Instant::from_millis(i as u64);
                match kind {
                    0 => { e.on_sample(now, Duration::from_nanos(v), SampleSource::Fresh); }
                    1 => { e.on_sample(now, Duration::from_nanos(v), SampleSource::Timestamp); }
                    2 => e.on_timeout(),
                    _ => e.on_handshake_retransmitted(),
                }
                let rto = e.rto();
                prop_assert!(rto >= cfg.min_rto && rto <= cfg.max_rto, "{:?}", rto);
                prop_assert!(e.base_rto() <= rto);
                if let (Some(m), Some(l)) = (e.min_rtt(), e.lifetime_min_rtt()) {
                    prop_assert!(l <= m);
                }
            }
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn at(n: u64) -> Instant {
        Instant::from_millis(n)
    }

    #[test]
    fn rfc6298_2_1_initial_rto_is_configured_value() {
        let e = Est::default();
        assert_eq!(e.rto(), Duration::from_secs(1));
        assert_eq!(e.srtt(), None);
        let dc = Est::new(RttConfig {
            initial_rto: ms(5),
            min_rto: ms(1),
            ..RttConfig::default()
        });
        assert_eq!(dc.rto(), ms(5));
    }

    #[test]
    fn rfc6298_2_2_first_sample_sets_srtt_and_half_rttvar() {
        let mut e = Est::default();
        assert!(e.on_sample(at(0), ms(100), SampleSource::Fresh));
        assert_eq!(e.srtt(), Some(ms(100)));
        assert_eq!(e.rttvar(), Some(ms(50)));
        // RTO = 100 + max(1, 4*50) = 300 ms.
        assert_eq!(e.rto(), ms(300));
    }

    #[test]
    fn rfc6298_2_3_subsequent_samples_use_alpha_eighth_beta_quarter() {
        let mut e = Est::default();
        e.on_sample(at(0), ms(100), SampleSource::Fresh);
        e.on_sample(at(1), ms(200), SampleSource::Fresh);
        // RTTVAR = 3/4*50 + 1/4*|100-200| = 62.5; SRTT = 7/8*100 + 1/8*200 = 112.5.
        assert_eq!(e.rttvar(), Some(Duration::from_micros(62_500)));
        assert_eq!(e.srtt(), Some(Duration::from_micros(112_500)));
        assert_eq!(e.rto(), Duration::from_micros(112_500 + 250_000));
        assert_eq!(e.latest_rtt(), Some(ms(200)));
    }

    #[test]
    fn rfc6298_2_3_granularity_bounds_variance_term() {
        let cfg = RttConfig {
            min_rto: Duration::from_micros(1),
            granularity: ms(10),
            ..RttConfig::default()
        };
        let mut e = Est::new(cfg);
        for i in 0..200 {
            e.on_sample(at(i), ms(1), SampleSource::Fresh);
        }
        // RTTVAR decays towards 0, so RTO = SRTT + G.
        assert_eq!(e.srtt(), Some(ms(1)));
        assert!(e.rttvar().unwrap() < Duration::from_micros(10));
        assert_eq!(e.rto(), ms(11));
    }

    #[test]
    fn rfc6298_2_4_rto_floor_is_configurable() {
        let mut e = Est::default();
        for i in 0..100 {
            e.on_sample(at(i), Duration::from_micros(50), SampleSource::Fresh);
        }
        assert_eq!(e.rto(), ms(200), "Linux-like default floor");
        let mut dc = Est::new(RttConfig {
            min_rto: ms(2),
            ..RttConfig::default()
        });
        for i in 0..100 {
            dc.on_sample(at(i), Duration::from_micros(50), SampleSource::Fresh);
        }
        assert_eq!(dc.rto(), ms(2));
    }

    #[test]
    fn rfc6298_2_5_rto_ceiling_caps_huge_samples() {
        let mut e = Est::default();
        // A hostile timestamp echo can claim an RTT of days.
        e.on_sample(
            at(0),
            Duration::from_secs(u64::MAX / 2),
            SampleSource::Timestamp,
        );
        assert_eq!(e.rto(), Duration::from_secs(60));
        e.on_timeout();
        assert_eq!(e.rto(), Duration::from_secs(60));
    }

    #[test]
    fn rfc6298_3_karn_discards_retransmitted_samples_but_not_timestamps() {
        let mut e = Est::default();
        assert!(!e.on_sample(at(0), ms(100), SampleSource::Retransmitted));
        assert_eq!(e.srtt(), None);
        // RFC 7323 §4: timestamps make the sample unambiguous.
        assert!(e.on_sample(at(0), ms(100), SampleSource::Timestamp));
        assert_eq!(e.srtt(), Some(ms(100)));
    }

    #[test]
    fn rfc6298_5_5_backoff_doubles_and_caps_at_max() {
        let mut e = Est::default();
        e.on_sample(at(0), ms(100), SampleSource::Fresh);
        assert_eq!(e.rto(), ms(300));
        e.on_timeout();
        assert_eq!(e.rto(), ms(600));
        e.on_timeout();
        assert_eq!(e.rto(), ms(1200));
        for _ in 0..100 {
            e.on_timeout();
        }
        assert_eq!(e.rto(), Duration::from_secs(60));
        assert_eq!(e.backoff_count(), 32);
    }

    #[test]
    fn rfc6298_5_5_karn_keeps_backoff_until_valid_sample() {
        let mut e = Est::default();
        e.on_sample(at(0), ms(100), SampleSource::Fresh);
        e.on_timeout();
        e.on_timeout();
        assert_eq!(e.rto(), ms(1200));
        // The ACK of the retransmission is ambiguous: back-off stays.
        e.on_sample(at(1), ms(100), SampleSource::Retransmitted);
        assert_eq!(e.rto(), ms(1200));
        e.on_sample(at(2), ms(100), SampleSource::Fresh);
        assert_eq!(e.backoff_count(), 0);
        assert!(e.rto() < ms(400));
    }

    #[test]
    fn rfc6298_5_7_syn_timeout_reinitialises_rto_to_3s() {
        let mut e = Est::default();
        e.on_timeout();
        assert_eq!(e.rto(), Duration::from_secs(2));
        e.on_handshake_retransmitted();
        assert_eq!(e.rto(), Duration::from_secs(3));
        // With a sample the measured RTO wins.
        let mut s = Est::default();
        s.on_sample(at(0), ms(10), SampleSource::Timestamp);
        s.on_handshake_retransmitted();
        assert_eq!(s.rto(), ms(200));
    }

    #[test]
    fn min_rtt_tracks_window_and_lifetime() {
        let cfg = RttConfig {
            min_rtt_window: Duration::from_secs(10),
            ..RttConfig::default()
        };
        let mut e = Est::new(cfg);
        assert_eq!(e.min_rtt(), None);
        e.on_sample(at(0), ms(5), SampleSource::Fresh);
        e.on_sample(at(1_000), ms(20), SampleSource::Fresh);
        assert_eq!(e.min_rtt(), Some(ms(5)));
        // The 5 ms sample ages out after the window; a later, larger minimum takes over.
        for t in (2_000..30_000).step_by(1_000) {
            e.on_sample(at(t), ms(20 + t / 1_000), SampleSource::Fresh);
        }
        let m = e.min_rtt().unwrap();
        // The true minimum over the last 10 s is 39 ms; the 3-sample filter reports the
        // minimum of a recent sub-window, never an expired one.
        assert!(m >= ms(39) && m <= ms(49), "windowed min {m:?}");
        assert_eq!(e.lifetime_min_rtt(), Some(ms(5)));
        // A new lower value is taken at once.
        e.on_sample(at(30_000), ms(3), SampleSource::Fresh);
        assert_eq!(e.min_rtt(), Some(ms(3)));
    }

    /// Issue 13: the estimator keeps no copy of its config (the connection passes the shared
    /// one), so it fits two cache lines.
    #[test]
    fn estimator_holds_no_config_copy() {
        assert!(
            core::mem::size_of::<RttEstimator>() <= 128,
            "{} bytes",
            core::mem::size_of::<RttEstimator>()
        );
        assert!(
            core::mem::size_of::<RttConfig>() >= 96,
            "the copy it no longer holds"
        );
    }

    /// A config that fails `validate` passed to the methods (the contract says it must not
    /// be) gives RTOs capped at `max_rto`, never a panic (`clamp` would panic for min > max).
    #[test]
    fn invalid_config_at_call_time_does_not_panic() {
        let bad = RttConfig {
            min_rto: Duration::from_secs(120),
            ..RttConfig::default()
        };
        assert!(bad.validate().is_err());
        let mut e = RttEstimator::default();
        e.on_sample(&bad, at(0), ms(10), SampleSource::Fresh);
        e.on_timeout(&bad);
        e.on_handshake_retransmitted(&bad);
        assert_eq!(e.base_rto(&bad), bad.max_rto);
        assert_eq!(e.rto(), bad.max_rto);
        assert_eq!(e.computed_rto(&bad), bad.max_rto);
    }

    #[test]
    fn bad_config_is_rejected_with_reason() {
        let base = RttConfig::default();
        let cases = [
            (
                RttConfig {
                    min_rto: Duration::ZERO,
                    ..base
                },
                RttConfigError::MinAboveMax,
            ),
            (
                RttConfig {
                    min_rto: Duration::from_secs(120),
                    ..base
                },
                RttConfigError::MinAboveMax,
            ),
            (
                RttConfig {
                    initial_rto: ms(10),
                    ..base
                },
                RttConfigError::InitialOutOfRange,
            ),
            (
                RttConfig {
                    syn_timeout_rto: Duration::from_secs(100),
                    ..base
                },
                RttConfigError::InitialOutOfRange,
            ),
            (
                RttConfig {
                    min_rtt_window: Duration::ZERO,
                    ..base
                },
                RttConfigError::ZeroMinRttWindow,
            ),
        ];
        for (cfg, want) in cases {
            assert_eq!(RttEstimator::new(&cfg).unwrap_err(), want);
            assert!(!want.to_string().is_empty());
        }
    }
}
