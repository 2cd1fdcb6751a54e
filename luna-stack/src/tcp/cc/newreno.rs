//! NewReno congestion control: RFC 5681 slow start and congestion avoidance with RFC 6582
//! recovery semantics.
//!
//! Contract: see [`super`]. Congestion avoidance is byte-counted (RFC 5681 §3.1, RFC 3465
//! §2.1): cwnd grows by exactly one SMSS per cwnd of acknowledged bytes, i.e. one SMSS per RTT
//! regardless of delayed ACKs. The partial-ACK deflation of RFC 6582 is applied by the
//! connection through [`super::RecoveryInflation`].

use super::{CcConfig, CongestionControl, Window, MAX_CWND};
use crate::tcp::rtt::RttEstimator;
use crate::time::{Duration, Instant};

/// RFC 5681 / RFC 6582 NewReno.
#[derive(Debug, Clone)]
pub struct NewReno {
    w: Window,
    /// Bytes acknowledged in congestion avoidance not yet turned into window growth.
    bytes_acked: u32,
}

impl NewReno {
    /// A NewReno controller with the initial window of `config` for SMSS `mss`.
    pub fn new(config: CcConfig, mss: u32) -> Self {
        NewReno {
            w: Window::new(config, mss),
            bytes_acked: 0,
        }
    }

    fn congestion_avoidance(&mut self, acked: u32) {
        // RFC 5681 §3.1 (byte counting, RFC 3465 §2.1): when bytes_acked >= cwnd,
        // bytes_acked -= cwnd and cwnd += SMSS -- one SMSS per RTT, at most one per ACK.
        self.bytes_acked = self.bytes_acked.saturating_add(acked);
        if self.bytes_acked >= self.w.cwnd {
            self.bytes_acked -= self.w.cwnd;
            self.w.cwnd = (self.w.cwnd + self.w.mss).min(MAX_CWND);
        }
        // A stretch ACK's surplus carries to the next ACK but never beyond one window.
        self.bytes_acked = self.bytes_acked.min(self.w.cwnd);
    }
}

impl CongestionControl for NewReno {
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
        _now: Instant,
        acked_bytes: u32,
        _rtt: &RttEstimator,
        in_flight_before: u32,
        app_limited: bool,
    ) {
        if acked_bytes == 0 {
            return;
        }
        self.w.note_ack();
        if !self.w.growth_allowed(in_flight_before, app_limited) {
            return;
        }
        let rest = if self.in_slow_start() {
            self.w.slow_start(acked_bytes)
        } else {
            acked_bytes
        };
        if rest > 0 {
            self.congestion_avoidance(rest);
        }
    }

    fn on_enter_recovery(&mut self, _now: Instant, in_flight: u32) {
        self.w.save_for_undo();
        // RFC 5681 §3.2 step 2 (eq. 4): ssthresh = max (FlightSize / 2, 2*SMSS).
        self.w.ssthresh = self.w.half_flight(in_flight);
        // RFC 6675 §5 step 4.2 / RFC 6582 §3.2: the reduced window is ssthresh; NewReno's
        // +3*SMSS inflation is RecoveryInflation's job.
        self.w.cwnd = self.w.ssthresh;
        self.bytes_acked = 0;
    }

    fn on_exit_recovery(&mut self, _now: Instant, in_flight: u32) {
        self.w.exit_recovery(in_flight);
    }

    fn on_rto(&mut self, _now: Instant, in_flight: u32) {
        let s = self.w.half_flight(in_flight);
        self.w.on_rto(s);
        self.bytes_acked = 0;
    }

    fn on_idle_restart(&mut self, _now: Instant, idle: Duration, rto: Duration) -> bool {
        self.w.idle_restart(idle, rto)
    }

    fn set_mss(&mut self, mss: u32) {
        self.w.set_mss(mss);
    }

    fn on_handshake_loss(&mut self) {
        self.w.handshake_loss();
    }

    fn undo(&mut self) -> bool {
        self.w.undo()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{cwnd_trace, Algorithm, InitialWindow, LossKind, TraceScenario};
    use super::*;
    use crate::tcp::rtt::SampleSource;

    const MSS: u32 = 1000;

    fn reno(iw_segs: u32) -> NewReno {
        NewReno::new(
            CcConfig {
                initial_window: InitialWindow::Segments(iw_segs),
                ..CcConfig::default()
            },
            MSS,
        )
    }

    fn rtt() -> RttEstimator {
        let mut e = RttEstimator::default();
        e.on_sample(
            &crate::tcp::rtt::RttConfig::default(),
            Instant::ZERO,
            Duration::from_millis(10),
            SampleSource::Fresh,
        );
        e
    }

    /// Acknowledge one full window, one ACK per segment.
    fn ack_round(cc: &mut NewReno, est: &RttEstimator) {
        let w = cc.cwnd();
        let mut left = w;
        while left > 0 {
            let a = left.min(MSS);
            cc.on_ack(Instant::ZERO, a, est, w, false);
            left -= a;
        }
    }

    #[test]
    fn rfc5681_3_1_slow_start_doubles_per_rtt() {
        let est = rtt();
        let mut cc = reno(10);
        assert!(cc.in_slow_start());
        for round in 0..5u32 {
            assert_eq!(cc.cwnd(), (10 * MSS) << round);
            ack_round(&mut cc, &est);
        }
    }

    #[test]
    fn rfc5681_3_1_abc_limits_increase_per_ack_to_l_smss() {
        let est = rtt();
        let mut cc = reno(10);
        // One stretch ACK for 8 segments grows cwnd by at most L*SMSS = 2*SMSS.
        cc.on_ack(Instant::ZERO, 8 * MSS, &est, 10 * MSS, false);
        assert_eq!(cc.cwnd(), 12 * MSS);
    }

    #[test]
    fn rfc5681_3_1_congestion_avoidance_adds_one_smss_per_rtt() {
        let est = rtt();
        let mut cc = reno(10);
        cc.on_enter_recovery(Instant::ZERO, 40 * MSS);
        cc.on_exit_recovery(Instant::ZERO, 40 * MSS);
        assert_eq!(cc.cwnd(), 20 * MSS);
        assert!(!cc.in_slow_start());
        for round in 0..10u32 {
            assert_eq!(cc.cwnd(), (20 + round) * MSS);
            ack_round(&mut cc, &est);
        }
    }

    #[test]
    fn rfc5681_3_1_slow_start_stops_at_ssthresh_and_carries_over() {
        let est = rtt();
        let mut cc = reno(10);
        cc.on_rto(Instant::ZERO, 24 * MSS); // ssthresh = 12 segments, cwnd = 1
        assert_eq!(cc.ssthresh(), 12 * MSS);
        // Grow to 11 segments.
        for _ in 0..5 {
            cc.on_ack(Instant::ZERO, 2 * MSS, &est, cc.cwnd(), false);
        }
        assert_eq!(cc.cwnd(), 11 * MSS);
        // 2 SMSS acked: 1 reaches ssthresh, 1 goes to CA (not enough for +SMSS).
        cc.on_ack(Instant::ZERO, 2 * MSS, &est, cc.cwnd(), false);
        assert_eq!(cc.cwnd(), 12 * MSS);
        assert_eq!(cc.bytes_acked, MSS);
    }

    #[test]
    fn rfc5681_3_2_loss_sets_ssthresh_half_flight_min_two_smss() {
        let mut cc = reno(10);
        cc.on_enter_recovery(Instant::ZERO, 30 * MSS);
        assert_eq!(cc.ssthresh(), 15 * MSS);
        assert_eq!(cc.cwnd(), 15 * MSS);
        let mut small = reno(10);
        small.on_enter_recovery(Instant::ZERO, 3 * MSS);
        assert_eq!(small.ssthresh(), 2 * MSS);
    }

    #[test]
    fn rfc6582_3_2_full_ack_exit_avoids_burst() {
        let mut cc = reno(10);
        cc.on_enter_recovery(Instant::ZERO, 30 * MSS);
        // Option 1: min(ssthresh, max(FlightSize, SMSS) + SMSS).
        cc.on_exit_recovery(Instant::ZERO, 2 * MSS);
        assert_eq!(cc.cwnd(), 3 * MSS);
        let mut full = reno(10);
        full.on_enter_recovery(Instant::ZERO, 30 * MSS);
        full.on_exit_recovery(Instant::ZERO, 30 * MSS);
        assert_eq!(full.cwnd(), 15 * MSS);
    }

    #[test]
    fn rfc5681_3_1_rto_sets_loss_window_and_holds_ssthresh_on_repeat() {
        let est = rtt();
        let mut cc = reno(10);
        cc.on_rto(Instant::ZERO, 40 * MSS);
        assert_eq!(cc.cwnd(), MSS);
        assert_eq!(cc.ssthresh(), 20 * MSS);
        // Second timeout of the same segment: ssthresh held (flight is tiny now).
        cc.on_rto(Instant::ZERO, MSS);
        assert_eq!(cc.ssthresh(), 20 * MSS);
        assert_eq!(cc.cwnd(), MSS);
        // After progress, a new timeout reduces again.
        cc.on_ack(Instant::ZERO, MSS, &est, MSS, false);
        cc.on_rto(Instant::ZERO, 10 * MSS);
        assert_eq!(cc.ssthresh(), 5 * MSS);
    }

    #[test]
    fn rfc5681_4_1_restart_window_after_idle_longer_than_rto() {
        let est = rtt();
        let mut cc = reno(10);
        for _ in 0..3 {
            ack_round(&mut cc, &est);
        }
        assert_eq!(cc.cwnd(), 80 * MSS);
        let rto = Duration::from_millis(200);
        assert!(!cc.on_idle_restart(Instant::ZERO, Duration::from_millis(100), rto));
        assert_eq!(cc.cwnd(), 80 * MSS);
        cc.w.ssthresh = 20 * MSS;
        assert!(cc.on_idle_restart(Instant::ZERO, Duration::from_millis(300), rto));
        assert_eq!(cc.cwnd(), 10 * MSS);
        // RFC 2861 §3: ssthresh keeps 3/4 of the old window.
        assert_eq!(cc.ssthresh(), 60 * MSS);
        // Already at IW: nothing to do.
        assert!(!cc.on_idle_restart(Instant::ZERO, Duration::from_secs(9), rto));
    }

    #[test]
    fn rfc7661_app_limited_ack_does_not_grow_window() {
        let est = rtt();
        let mut cc = reno(10);
        cc.on_ack(Instant::ZERO, MSS, &est, 2 * MSS, true);
        assert_eq!(cc.cwnd(), 10 * MSS);
        // If the window was full the flag does not matter.
        cc.on_ack(Instant::ZERO, MSS, &est, 10 * MSS, true);
        assert_eq!(cc.cwnd(), 11 * MSS);
    }

    #[test]
    fn set_mss_recomputes_initial_window_only_before_first_ack() {
        let est = rtt();
        let mut cc = NewReno::new(CcConfig::default(), 536);
        assert_eq!(cc.cwnd(), 5360);
        cc.set_mss(1460);
        assert_eq!(cc.cwnd(), 14_600);
        cc.on_ack(Instant::ZERO, 1460, &est, 14_600, false);
        cc.set_mss(9000);
        assert_eq!(cc.cwnd(), 14_600 + 1460);
        cc.on_rto(Instant::ZERO, 0);
        cc.set_mss(1000);
        assert_eq!(cc.cwnd(), 9000, "cwnd stays at least the old SMSS value");
    }

    #[test]
    fn undo_restores_window_after_spurious_recovery() {
        let mut cc = reno(10);
        let (c, s) = (cc.cwnd(), cc.ssthresh());
        cc.on_enter_recovery(Instant::ZERO, c);
        assert_eq!(cc.cwnd(), c / 2);
        assert!(cc.undo());
        assert_eq!((cc.cwnd(), cc.ssthresh()), (c, s));
        assert!(!cc.undo(), "nothing left to undo");
        cc.on_rto(Instant::ZERO, c);
        assert_eq!(cc.cwnd(), MSS);
        assert!(cc.undo());
        assert_eq!(cc.cwnd(), c);
    }

    #[test]
    fn fluid_simulation_sawtooth_halves_and_grows_linearly() {
        let s = TraceScenario {
            rtt: Duration::from_millis(10),
            mss: MSS,
            duration: Duration::from_secs(3),
            losses: vec![],
            capacity: Some(100 * MSS),
            config: CcConfig::default(),
        };
        let t = cwnd_trace(Algorithm::NewReno, &s);
        let drops: Vec<(u32, u32)> = t
            .windows(2)
            .filter(|w| w[1].1 < w[0].1)
            .map(|w| (w[0].1, w[1].1))
            .collect();
        assert!(drops.len() >= 3, "{drops:?}");
        // After slow start, each loss halves the window...
        for &(before, after) in &drops[1..] {
            assert_eq!(after, before / 2, "{drops:?}");
        }
        // ...and congestion avoidance regrows ~1 SMSS per 10 ms RTT: from 50 to 101 segments
        // takes ~51 RTTs, so consecutive losses are ~0.5 s apart.
        let loss_times: Vec<u64> = t
            .windows(2)
            .filter(|w| w[1].1 < w[0].1)
            .map(|w| w[1].0.as_nanos() / 1_000_000)
            .collect();
        let gap = loss_times[2] - loss_times[1];
        assert!((480..=560).contains(&gap), "gap {gap} ms, {loss_times:?}");
        // Scripted timeout: cwnd goes to 1 SMSS.
        let rto = TraceScenario {
            losses: vec![(Duration::from_millis(500), LossKind::Timeout)],
            capacity: None,
            ..s
        };
        let t = cwnd_trace(Algorithm::NewReno, &rto);
        assert!(t
            .iter()
            .any(|&(at, c)| c == MSS && at.as_nanos() >= 500_000_000));
    }
}
