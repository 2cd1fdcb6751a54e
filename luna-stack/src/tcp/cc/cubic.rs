//! CUBIC congestion control (RFC 9438).
//!
//! Contract: see [`super`]. Slow start, the RTO loss window and the restart window are shared
//! with NewReno; this module owns the congestion-avoidance growth function and the
//! multiplicative decrease. All arithmetic is integer (no floats, no libm): windows in bytes,
//! time in microseconds, the cube root by binary search, so traces are bit-identical on every
//! platform. The RFC counts windows in segments; here `W[segments] = W[bytes] / SMSS`, so
//! `W_cubic(t) = C * SMSS * (t - K)^3 + W_max` in bytes with t in seconds.
//!
//! Application-limited periods (RFC 9438 §5.8): when an ACK arrives while the sender was not
//! cwnd-limited the window is not grown and the epoch is ended, so the next cwnd-limited ACK
//! starts a new curve from the current window instead of jumping along a curve that kept
//! running while the application was idle.

use super::{CcConfig, CongestionControl, Window, MAX_CWND};
use crate::tcp::rtt::RttEstimator;
use crate::time::{Duration, Instant};

/// C = 0.4 (RFC 9438 §5), as a fraction.
const C_NUM: u128 = 4;
const C_DEN: u128 = 10;
/// beta_cubic = 0.7 (RFC 9438 §4.6), as a fraction.
const BETA_NUM: u64 = 7;
const BETA_DEN: u64 = 10;
/// alpha_cubic = 3 * (1 - beta) / (1 + beta) = 0.9 / 1.7 = 9/17 (RFC 9438 §4.3 eq. 5).
const ALPHA_NUM: u64 = 9;
const ALPHA_DEN: u64 = 17;
/// |t - K| is clamped to this many microseconds (~2.8 h) so (t-K)^3 fits i128 with room for
/// the SMSS factor; the window is clamped to MAX_CWND long before that anyway.
const MAX_DT_US: i128 = 10_000_000_000;
const US_PER_S3: u128 = 1_000_000_000_000_000_000; // (10^6)^3

/// Integer cube root: the largest r with r^3 <= x.
fn icbrt(x: u128) -> u64 {
    let (mut lo, mut hi) = (0u64, 1u64 << 42); // (2^42)^3 = 2^126 fits u128
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        let m = u128::from(mid);
        if m * m * m <= x {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// RFC 9438 §4.2 eq. 2: K = cbrt((W_max - cwnd_epoch) / C), in microseconds, for a window
/// deficit of `deficit` bytes at SMSS `mss`.
fn cubic_k_us(deficit: u32, mss: u32) -> u64 {
    // (deficit / mss) / C seconds^3 = deficit * C_DEN / (C_NUM * mss) * 10^18 us^3.
    let x = u128::from(deficit) * C_DEN * US_PER_S3 / (C_NUM * u128::from(mss.max(1)));
    icbrt(x)
}

/// RFC 9438 §4.2 eq. 1: W_cubic(t) = C * (t - K)^3 + W_max, in bytes, clamped to
/// [0, MAX_CWND].
fn w_cubic(t_us: u64, k_us: u64, w_max: u32, mss: u32) -> u32 {
    let d = (i128::from(t_us) - i128::from(k_us)).clamp(-MAX_DT_US, MAX_DT_US);
    let mss = i128::from(mss.min(super::MAX_MSS));
    let growth = (C_NUM as i128) * mss * d * d * d / (C_DEN as i128 * US_PER_S3 as i128);
    (i128::from(w_max) + growth).clamp(0, i128::from(MAX_CWND)) as u32
}

/// The part of CUBIC's state that undo restores (RFC 9438 §4.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct State {
    /// W_max in bytes: the window just before the last reduction (after fast convergence).
    w_max: u32,
    /// cwnd_prior: cwnd when ssthresh was last set by a loss.
    cwnd_prior: u32,
    /// K in microseconds for the current epoch.
    k_us: u64,
    /// Start of the current congestion-avoidance stage.
    epoch_start: Option<Instant>,
    /// W_est (Reno-friendly estimate) in bytes.
    w_est: u32,
    /// Remainder numerators carried between ACKs for exact byte arithmetic.
    est_rem: u64,
    inc_rem: u64,
    /// The next epoch is the first after a timeout (RFC 9438 §4.8: K = 0, W_max = cwnd).
    after_rto: bool,
}

/// RFC 9438 CUBIC.
#[derive(Debug, Clone)]
pub struct Cubic {
    w: Window,
    st: State,
    saved: Option<State>,
}

impl Cubic {
    /// A CUBIC controller with the initial window of `config` for SMSS `mss`.
    pub fn new(config: CcConfig, mss: u32) -> Self {
        Cubic {
            w: Window::new(config, mss),
            st: State::default(),
            saved: None,
        }
    }

    /// W_max in bytes (for tests, traces and stats).
    pub fn w_max(&self) -> u32 {
        self.st.w_max
    }

    /// K of the current epoch, if one is running.
    pub fn k(&self) -> Option<Duration> {
        self.st
            .epoch_start
            .map(|_| Duration::from_micros(self.st.k_us))
    }

    /// W_est (the Reno-friendly estimate) in bytes, if an epoch is running.
    pub fn w_est(&self) -> Option<u32> {
        self.st.epoch_start.map(|_| self.st.w_est)
    }

    fn start_epoch(&mut self, now: Instant) {
        let cwnd = self.w.cwnd;
        let st = &mut self.st;
        st.epoch_start = Some(now);
        if st.after_rto || st.w_max <= cwnd {
            // RFC 9438 §4.8: first CA stage after a timeout: K = 0 and W_max = cwnd at the
            // start of the stage. Also used for the first CA stage (no loss yet) and when the
            // window already exceeds W_max (e.g. after undo): the curve is in its convex part.
            st.w_max = cwnd;
            st.k_us = 0;
            st.after_rto = false;
        } else {
            // RFC 9438 §4.2 eq. 2 with cwnd_epoch = cwnd.
            st.k_us = cubic_k_us(st.w_max - cwnd, self.w.mss);
        }
        // RFC 9438 §4.3: W_est is set to cwnd_epoch at the start of the stage.
        st.w_est = cwnd;
        st.est_rem = 0;
        st.inc_rem = 0;
    }

    fn congestion_avoidance(&mut self, now: Instant, acked: u32, rtt: &RttEstimator) {
        if self.st.epoch_start.is_none() {
            self.start_epoch(now);
        }
        let mss = self.w.mss;
        let cwnd = self.w.cwnd;
        let start = self.st.epoch_start.unwrap_or(now);
        let t_us = (now - start).as_micros().min(u128::from(u64::MAX)) as u64;
        // RFC 9438 §4.2: RTT is the smoothed RTT.
        let rtt_us = rtt
            .srtt()
            .or_else(|| rtt.min_rtt())
            .map_or(0, |d| d.as_micros().min(u128::from(u64::MAX)) as u64);
        let st = &mut self.st;
        let w_t = w_cubic(t_us, st.k_us, st.w_max, mss);
        // RFC 9438 §4.2 eq. 3: target = W_cubic(t + RTT) clamped to [cwnd, 1.5 * cwnd].
        let target = w_cubic(t_us.saturating_add(rtt_us), st.k_us, st.w_max, mss)
            .clamp(cwnd, cwnd + cwnd / 2);

        // RFC 9438 §4.3 eq. 4: W_est += alpha_cubic * segments_acked / cwnd (in segments);
        // alpha_cubic SHOULD become 1 once W_est >= cwnd_prior.
        let (an, ad) = if st.w_est >= st.cwnd_prior {
            (1, 1)
        } else {
            (ALPHA_NUM, ALPHA_DEN)
        };
        let den = ad * u64::from(cwnd.max(1));
        st.est_rem += an * u64::from(mss) * u64::from(acked);
        let est_inc = st.est_rem / den;
        st.est_rem %= den;
        st.w_est = (u64::from(st.w_est) + est_inc).min(u64::from(MAX_CWND)) as u32;

        let new_cwnd = if w_t < st.w_est {
            // RFC 9438 §4.3: Reno-friendly region: cwnd SHOULD be set to W_est.
            st.inc_rem = 0;
            st.w_est.max(cwnd)
        } else {
            // RFC 9438 §4.4 (concave, cwnd < W_max) and §4.5 (convex, cwnd >= W_max): cwnd
            // MUST be incremented by (target - cwnd) / cwnd for each segment acknowledged.
            st.inc_rem += u64::from(target - cwnd) * u64::from(acked);
            let inc = st.inc_rem / u64::from(cwnd.max(1));
            st.inc_rem %= u64::from(cwnd.max(1));
            (u64::from(cwnd) + inc).min(u64::from(MAX_CWND)) as u32
        };
        self.w.cwnd = new_cwnd;
    }

    /// RFC 9438 §4.6: ssthresh = max(flight_size * beta_cubic, 2 segments).
    fn beta_ssthresh(&self, in_flight: u32) -> u32 {
        let s = u64::from(in_flight) * BETA_NUM / BETA_DEN;
        (s as u32).max(2 * self.w.mss).min(MAX_CWND)
    }
}

impl CongestionControl for Cubic {
    fn cwnd(&self) -> u32 {
        self.w.cwnd
    }

    fn ssthresh(&self) -> u32 {
        self.w.ssthresh
    }

    fn mss(&self) -> u32 {
        self.w.mss
    }

    fn on_ack(
        &mut self,
        now: Instant,
        acked_bytes: u32,
        rtt: &RttEstimator,
        in_flight_before: u32,
        app_limited: bool,
    ) {
        if acked_bytes == 0 {
            return;
        }
        self.w.note_ack();
        if !self.w.growth_allowed(in_flight_before, app_limited) {
            // See the module docs: freeze by ending the epoch.
            self.st.epoch_start = None;
            return;
        }
        // RFC 9438 §4.10: slow start as in RFC 5681 (HyStart++ not implemented).
        let rest = if self.in_slow_start() {
            self.w.slow_start(acked_bytes)
        } else {
            acked_bytes
        };
        if rest > 0 {
            self.congestion_avoidance(now, rest, rtt);
        }
    }

    fn on_enter_recovery(&mut self, _now: Instant, in_flight: u32) {
        self.saved = Some(self.st);
        self.w.save_for_undo();
        let cwnd = self.w.cwnd;
        // RFC 9438 §4.7 fast convergence: if cwnd < W_max, W_max = cwnd * (1 + beta) / 2;
        // otherwise W_max = cwnd.
        self.st.w_max = if self.w.cfg.fast_convergence && cwnd < self.st.w_max {
            (u64::from(cwnd) * (BETA_DEN + BETA_NUM) / (2 * BETA_DEN)) as u32
        } else {
            cwnd
        };
        // RFC 9438 §4.6: cwnd_prior = cwnd; ssthresh = max(flight_size * beta, 2);
        // cwnd = ssthresh.
        self.st.cwnd_prior = cwnd;
        self.w.ssthresh = self.beta_ssthresh(in_flight);
        self.w.cwnd = self.w.ssthresh;
        self.st.epoch_start = None;
    }

    fn on_exit_recovery(&mut self, _now: Instant, in_flight: u32) {
        self.w.exit_recovery(in_flight);
    }

    fn on_rto(&mut self, _now: Instant, in_flight: u32) {
        let before = self.st;
        let s = self.beta_ssthresh(in_flight);
        // RFC 9438 §4.8: on timeout cwnd follows RFC 5681 (1 SMSS) but ssthresh uses beta.
        if self.w.on_rto(s) {
            self.saved = Some(before);
        }
        self.st.epoch_start = None;
        self.st.after_rto = true;
    }

    fn on_idle_restart(&mut self, _now: Instant, idle: Duration, rto: Duration) -> bool {
        let restarted = self.w.idle_restart(idle, rto);
        if restarted {
            self.st.epoch_start = None;
        }
        restarted
    }

    fn set_mss(&mut self, mss: u32) {
        self.w.set_mss(mss);
    }

    fn on_handshake_loss(&mut self) {
        self.w.handshake_loss();
    }

    fn undo(&mut self) -> bool {
        // RFC 9438 §4.9: a spurious congestion event restores cwnd, ssthresh, cwnd_prior,
        // W_max, K and the epoch from before it.
        if !self.w.undo() {
            return false;
        }
        if let Some(s) = self.saved.take() {
            self.st = s;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::{cwnd_trace, Algorithm, InitialWindow, TraceScenario};
    use super::*;
    use crate::tcp::rtt::SampleSource;

    const MSS: u32 = 1000;

    fn cubic() -> Cubic {
        Cubic::new(
            CcConfig {
                initial_window: InitialWindow::Segments(10),
                ..CcConfig::default()
            },
            MSS,
        )
    }

    fn est(rtt: Duration) -> RttEstimator {
        let mut e = RttEstimator::default();
        e.on_sample(
            &crate::tcp::rtt::RttConfig::default(),
            Instant::ZERO,
            rtt,
            SampleSource::Fresh,
        );
        e
    }

    /// One round: the whole window acknowledged one segment at a time, spread over `rtt`.
    fn ack_round(cc: &mut Cubic, now: &mut Instant, rtt: Duration, est: &RttEstimator) {
        let w = cc.cwnd();
        let n = (w / MSS).max(1);
        let step = rtt / n;
        for i in 0..n {
            *now += step;
            let a = if i + 1 == n { w - (n - 1) * MSS } else { MSS };
            cc.on_ack(*now, a, est, w, false);
        }
    }

    /// Put a controller into congestion avoidance after a loss at `w` segments.
    fn after_loss_at(w: u32) -> Cubic {
        let mut cc = cubic();
        cc.w.cwnd = w * MSS;
        cc.on_enter_recovery(Instant::ZERO, w * MSS);
        cc.on_exit_recovery(Instant::ZERO, w * MSS);
        cc
    }

    #[test]
    fn icbrt_is_exact_floor() {
        for x in [0u128, 1, 7, 8, 26, 27, 1_000_000, 75 * US_PER_S3] {
            let r = u128::from(icbrt(x));
            assert!(r * r * r <= x && (r + 1) * (r + 1) * (r + 1) > x, "x={x}");
        }
        // The search range caps the root at 2^42 (cube 2^126), far above any real K.
        assert_eq!(icbrt(u128::MAX), 1 << 42);
    }

    #[test]
    fn rfc9438_4_2_k_matches_hand_computed_value() {
        // W_max = 100 segments, cwnd_epoch = 70: K = cbrt(30 / 0.4) = cbrt(75) = 4.217163 s.
        let k = cubic_k_us(30 * MSS, MSS);
        assert!((4_217_162..=4_217_164).contains(&k), "K = {k} us");
        // W_max = 1000 segments after beta: K = cbrt(300 / 0.4) = cbrt(750) = 9.085603 s.
        let k = cubic_k_us(300 * 1460, 1460);
        assert!((9_085_602..=9_085_604).contains(&k), "K = {k} us");
        assert_eq!(cubic_k_us(0, MSS), 0);
    }

    #[test]
    fn rfc9438_4_2_w_cubic_against_hand_computed_points() {
        let k = cubic_k_us(30 * MSS, MSS);
        let w_max = 100 * MSS;
        // t = 0: W = W_max - C K^3 = cwnd_epoch = 70 segments (within a byte of rounding).
        assert!(w_cubic(0, k, w_max, MSS).abs_diff(70 * MSS) <= 1);
        // t = K: W = W_max (the plateau).
        assert_eq!(w_cubic(k, k, w_max, MSS), w_max);
        // t = K + 1 s: W_max + 0.4 segments; t = K + 2 s: + 3.2 segments (convex).
        assert_eq!(w_cubic(k + 1_000_000, k, w_max, MSS), 100_400);
        assert_eq!(w_cubic(k + 2_000_000, k, w_max, MSS), 103_200);
        // t = K - 1 s: W_max - 0.4 segments (concave).
        assert_eq!(w_cubic(k - 1_000_000, k, w_max, MSS), 99_600);
        // Extremes clamp instead of overflowing.
        assert_eq!(w_cubic(u64::MAX, 0, w_max, u32::MAX), MAX_CWND);
        assert_eq!(w_cubic(0, u64::MAX, w_max, u32::MAX), 0);
    }

    #[test]
    fn rfc9438_4_6_multiplicative_decrease_by_beta() {
        let mut cc = cubic();
        cc.w.cwnd = 100 * MSS;
        cc.on_enter_recovery(Instant::ZERO, 100 * MSS);
        assert_eq!(cc.ssthresh(), 70 * MSS);
        assert_eq!(cc.cwnd(), 70 * MSS);
        assert_eq!(cc.w_max(), 100 * MSS);
        // Floor of 2 segments.
        let mut small = cubic();
        small.on_enter_recovery(Instant::ZERO, 2 * MSS);
        assert_eq!(small.ssthresh(), 2 * MSS);
    }

    #[test]
    fn rfc9438_4_7_fast_convergence_reduces_w_max() {
        let mut cc = after_loss_at(100);
        assert_eq!(cc.w_max(), 100 * MSS);
        // A second loss below W_max: W_max = cwnd * (1 + 0.7) / 2 = 0.85 * cwnd.
        cc.w.cwnd = 80 * MSS;
        cc.on_enter_recovery(Instant::ZERO, 80 * MSS);
        assert_eq!(cc.w_max(), 68 * MSS);
        // Without fast convergence W_max is the window at loss.
        let mut plain = Cubic::new(
            CcConfig {
                fast_convergence: false,
                ..CcConfig::default()
            },
            MSS,
        );
        plain.w.cwnd = 100 * MSS;
        plain.on_enter_recovery(Instant::ZERO, 100 * MSS);
        plain.w.cwnd = 80 * MSS;
        plain.on_enter_recovery(Instant::ZERO, 80 * MSS);
        assert_eq!(plain.w_max(), 80 * MSS);
    }

    #[test]
    fn rfc9438_4_3_reno_friendly_region_dominates_at_small_rtt() {
        // 100 us RTT: in 50 RTTs (5 ms) W_cubic moves ~0.1 segment, W_est ~26.5 segments.
        let rtt = Duration::from_micros(100);
        let e = est(rtt);
        let mut cc = after_loss_at(100);
        let mut now = Instant::ZERO;
        for _ in 0..50 {
            ack_round(&mut cc, &mut now, rtt, &e);
        }
        let segs = f64::from(cc.cwnd()) / f64::from(MSS);
        let reno_friendly = 70.0 + 50.0 * 9.0 / 17.0;
        assert!(
            (segs - reno_friendly).abs() < 2.0,
            "cwnd {segs} segments, expected ~{reno_friendly}"
        );
        assert_eq!(cc.w_est(), Some(cc.cwnd()));
        // The cubic curve alone would still be near cwnd_epoch.
        let k = cc.k().unwrap().as_micros() as u64;
        assert!(w_cubic(5_000, k, cc.w_max(), MSS) < 71 * MSS);
    }

    #[test]
    fn rfc9438_4_3_alpha_becomes_one_after_reaching_cwnd_prior() {
        let rtt = Duration::from_micros(100);
        let e = est(rtt);
        let mut cc = after_loss_at(20);
        let mut now = Instant::ZERO;
        // From 14 segments, alpha 9/17 takes ~11 RTTs to reach 20, then +1 per RTT.
        for _ in 0..12 {
            ack_round(&mut cc, &mut now, rtt, &e);
        }
        let before = cc.cwnd();
        assert!(before >= 20 * MSS, "{before}");
        for _ in 0..10 {
            ack_round(&mut cc, &mut now, rtt, &e);
        }
        let grown = (cc.cwnd() - before) / MSS;
        assert!(
            (9..=11).contains(&grown),
            "grew {grown} segments in 10 RTTs"
        );
    }

    #[test]
    fn rfc9438_4_4_concave_region_approaches_w_max_at_k() {
        // 100 ms RTT, W_max = 1000 segments: the cubic curve dominates Reno-friendliness.
        let rtt = Duration::from_millis(100);
        let e = est(rtt);
        let mut cc = after_loss_at(1000);
        let mut now = Instant::ZERO;
        let mut samples = vec![];
        while now < Instant::from_millis(9_000) {
            ack_round(&mut cc, &mut now, rtt, &e);
            samples.push((now, cc.cwnd()));
        }
        // Growth slows as cwnd approaches W_max (concave): the first second adds far more
        // than the second before K (~9.09 s).
        let at = |ms: u64| {
            samples
                .iter()
                .find(|(t, _)| *t >= Instant::from_millis(ms))
                .map(|&(_, c)| c)
                .unwrap()
        };
        let early = at(1_000) - at(100);
        let late = at(8_900) - at(8_000);
        assert!(early > 10 * late, "early {early} late {late}");
        let near_k = at(8_900);
        assert!(near_k > 990 * MSS && near_k <= 1000 * MSS, "{near_k}");
        // Tracks W_cubic(t + RTT) to within a few segments.
        let k = cc.k().unwrap().as_micros() as u64;
        let expect = w_cubic(4_000_000 + 100_000, k, 1000 * MSS, MSS);
        assert!(
            at(4_000).abs_diff(expect) < 5 * MSS,
            "{} vs {expect}",
            at(4_000)
        );
    }

    #[test]
    fn rfc9438_4_5_convex_region_growth_accelerates_past_w_max() {
        let rtt = Duration::from_millis(100);
        let e = est(rtt);
        let mut cc = after_loss_at(1000);
        let mut now = Instant::ZERO;
        let mut trace = vec![];
        while now < Instant::from_millis(14_000) {
            ack_round(&mut cc, &mut now, rtt, &e);
            trace.push(cc.cwnd());
        }
        let n = trace.len();
        // Past K (9.09 s) the per-round increments grow.
        let d1 = trace[n - 20] - trace[n - 21];
        let d2 = trace[n - 1] - trace[n - 2];
        assert!(trace[n - 1] > 1000 * MSS);
        assert!(d2 > d1, "convex: {d1} then {d2}");
    }

    #[test]
    fn rfc9438_4_2_target_clamped_to_one_and_a_half_cwnd() {
        let e = est(Duration::from_millis(10));
        let mut cc = after_loss_at(20);
        // Start the epoch, then jump far along the curve: one window of ACKs may grow cwnd
        // by at most 50%.
        cc.on_ack(Instant::ZERO, MSS, &e, cc.cwnd(), false);
        let w = cc.cwnd();
        let later = Instant::from_millis(100_000);
        cc.on_ack(later, w, &e, w, false);
        assert_eq!(cc.cwnd(), w + w / 2);
    }

    #[test]
    fn rfc9438_4_8_timeout_uses_beta_then_k_zero() {
        let e = est(Duration::from_millis(10));
        let mut cc = cubic();
        cc.w.cwnd = 100 * MSS;
        cc.on_rto(Instant::ZERO, 100 * MSS);
        assert_eq!(cc.cwnd(), MSS);
        assert_eq!(cc.ssthresh(), 70 * MSS);
        // Held on a repeated timeout.
        cc.on_rto(Instant::ZERO, MSS);
        assert_eq!(cc.ssthresh(), 70 * MSS);
        // Slow start to ssthresh, then the first CA epoch has K = 0 and W_max = cwnd.
        let mut now = Instant::ZERO;
        while cc.in_slow_start() {
            now += Duration::from_millis(1);
            cc.on_ack(now, 2 * MSS, &e, cc.cwnd(), false);
        }
        cc.on_ack(now, MSS, &e, cc.cwnd(), false);
        assert_eq!(cc.k(), Some(Duration::ZERO));
        assert_eq!(cc.w_max(), 70 * MSS);
    }

    #[test]
    fn rfc9438_4_9_undo_restores_state_after_spurious_loss() {
        let e = est(Duration::from_millis(10));
        let mut cc = after_loss_at(100);
        let mut now = Instant::ZERO;
        ack_round(&mut cc, &mut now, Duration::from_millis(10), &e);
        let (cwnd, ssthresh, w_max, k) = (cc.cwnd(), cc.ssthresh(), cc.w_max(), cc.k());
        cc.on_enter_recovery(now, cwnd);
        assert!(cc.w_max() < w_max, "fast convergence moved W_max");
        assert!(cc.undo());
        assert_eq!(
            (cc.cwnd(), cc.ssthresh(), cc.w_max(), cc.k()),
            (cwnd, ssthresh, w_max, k)
        );
        assert!(!cc.undo());
    }

    #[test]
    fn rfc9438_5_8_app_limited_does_not_grow_or_jump() {
        let rtt = Duration::from_millis(100);
        let e = est(rtt);
        let mut cc = after_loss_at(1000);
        cc.on_ack(Instant::ZERO, MSS, &e, cc.cwnd(), false);
        let w = cc.cwnd();
        // 20 s of application-limited ACKs: no growth.
        for s in 1..=20 {
            cc.on_ack(Instant::from_millis(s * 1000), MSS, &e, MSS, true);
        }
        assert_eq!(cc.cwnd(), w);
        // Back to cwnd-limited: a new epoch from the current window, no 1.5x jump.
        cc.on_ack(Instant::from_millis(20_100), MSS, &e, w, false);
        assert!(cc.cwnd() < w + 2 * MSS);
    }

    fn drops(t: &[(Instant, u32)]) -> Vec<(Instant, u32, u32)> {
        t.windows(2)
            .filter(|w| w[1].1 < w[0].1)
            .map(|w| (w[1].0, w[0].1, w[1].1))
            .collect()
    }

    #[test]
    fn fluid_simulation_cubic_sawtooth_plateaus_near_w_max() {
        // BDP + buffer of 1000 segments at 100 ms: cubic region (Reno-friendly growth would be
        // ~5 segments/s, the curve ~300 segments in K = 9.1 s).
        let s = TraceScenario {
            rtt: Duration::from_millis(100),
            mss: MSS,
            duration: Duration::from_secs(40),
            losses: vec![],
            capacity: Some(1000 * MSS),
            config: CcConfig {
                fast_convergence: false,
                ..CcConfig::default()
            },
        };
        let d = drops(&cwnd_trace(Algorithm::Cubic, &s));
        assert!(d.len() >= 4, "{d:?}");
        for &(_, before, after) in &d[1..] {
            let ratio = f64::from(after) / f64::from(before);
            assert!((0.69..=0.71).contains(&ratio), "beta: {ratio}");
            assert!(before > 1000 * MSS && before < 1010 * MSS, "peak {before}");
        }
        // Steady state: each loss happens just above 1000 segments, so W_max ~ 1000 and the
        // window creeps along the plateau: the period is about K = cbrt(0.3 * 1000 / 0.4) =
        // 9.09 s (minus the flat top the window crosses early, plus the RTT of recovery).
        for w in d[1..].windows(2) {
            let gap = w[1].0.as_nanos() - w[0].0.as_nanos();
            assert!(
                (7_600_000_000..=10_100_000_000).contains(&gap),
                "loss period {gap} ns"
            );
        }
        // Cubic's sawtooth is far shorter than NewReno's at this BDP (~50 s per sawtooth).
        let r = drops(&cwnd_trace(Algorithm::NewReno, &s));
        assert!(r.len() < d.len(), "{} vs {}", r.len(), d.len());

        // RFC 9438 §4.7: with fast convergence a loss below the previous W_max lowers W_max
        // to 0.85 * cwnd, so the next sawtooth is longer (K grows and the convex part is
        // needed to reach the capacity again).
        let fc = TraceScenario {
            config: CcConfig::default(),
            ..s
        };
        let f = drops(&cwnd_trace(Algorithm::Cubic, &fc));
        let longest = f
            .windows(2)
            .map(|w| w[1].0.as_nanos() - w[0].0.as_nanos())
            .max()
            .unwrap();
        assert!(longest > 12_000_000_000, "{f:?}");
    }
}
