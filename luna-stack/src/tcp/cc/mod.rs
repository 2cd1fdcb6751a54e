//! Congestion control: the window algorithms the connection consults, chosen per connection.
//!
//! Division of labour (contract):
//! - The **connection** owns loss detection and recovery bookkeeping: duplicate-ACK counting,
//!   the NewReno `recover` point and partial-ACK handling (RFC 6582), the SACK scoreboard and
//!   `pipe` (RFC 6675), the choice of what to retransmit, and the decision whether the sender
//!   is application-limited.
//! - The **CC module** owns only `cwnd`/`ssthresh` (bytes) and its private state, and reacts to
//!   events: [`CongestionControl::on_ack`] for new data acknowledged *outside* recovery,
//!   [`CongestionControl::on_enter_recovery`] / [`CongestionControl::on_exit_recovery`] around
//!   fast recovery, [`CongestionControl::on_rto`] for a retransmission timeout, and
//!   [`CongestionControl::on_idle_restart`] before sending after quiescence.
//! - During recovery `cwnd()` is the *reduced* window (= `ssthresh`). With SACK the connection
//!   sends while `pipe < cwnd` (RFC 6675 §5). Without SACK it uses NewReno's artificially
//!   inflated window, which the connection keeps in a [`RecoveryInflation`] helper from this
//!   module (RFC 6582 §3.2 steps 3, 4 and the partial-ACK deflation of step 5): the inflation
//!   is recovery bookkeeping, so it lives with the connection, not in the CC state.
//! - No ACK is passed to `on_ack` while in recovery: windows do not grow during recovery
//!   (RFC 5681 §3.2, RFC 6675 §5). PRR (RFC 6937) is not implemented.
//!
//! [`Cc`] is the per-connection enum (static dispatch, no `Box`); [`cwnd_trace`] runs a
//! deterministic fluid model to plot an algorithm's sawtooth.

pub mod cubic;
pub mod newreno;

pub use cubic::Cubic;
pub use newreno::NewReno;

use crate::tcp::rtt::{RttConfig, RttEstimator, SampleSource};
use crate::time::{Duration, Instant};

/// The smallest SMSS the CC accepts; smaller values are raised to it so that a zero or tiny MSS
/// can never cause a division by zero or a window of zero segments (cf. CVE-2019-11479, where a
/// peer-chosen MSS of 48 made the sender burn CPU; the connection should refuse such MSS, this
/// is the last line of defence).
pub const MIN_MSS: u32 = 48;

/// The largest SMSS the CC accepts (the MSS option is 16 bits, RFC 9293 §3.7.1).
pub const MAX_MSS: u32 = 65_535;

/// Largest window the CC ever reports: 2^30 bytes, the largest window RFC 7323 §2.3 can
/// advertise (65535 << 14). Keeps all byte arithmetic far from `u32` overflow.
pub const MAX_CWND: u32 = 1 << 30;

/// The initial window rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitialWindow {
    /// RFC 5681 §3.1 eq. 3: 2, 3 or 4 segments depending on SMSS (at most 4380 bytes).
    Rfc5681,
    /// RFC 6928 §2 (IW10): min(10*SMSS, max(2*SMSS, 14600)).
    Rfc6928,
    /// A fixed number of segments (datacenter tuning); at least 1.
    Segments(u32),
}

impl InitialWindow {
    /// The initial window in bytes for the given SMSS.
    pub fn bytes(self, mss: u32) -> u32 {
        let mss = mss.clamp(MIN_MSS, MAX_MSS);
        let w = match self {
            // RFC 5681 §3.1: IW = 2*SMSS if SMSS > 2190, 3*SMSS if SMSS > 1095, else 4*SMSS.
            InitialWindow::Rfc5681 => {
                if mss > 2190 {
                    2 * mss
                } else if mss > 1095 {
                    3 * mss
                } else {
                    4 * mss
                }
            }
            // RFC 6928 §2: IW = min (10*MSS, max (2*MSS, 14600)).
            InitialWindow::Rfc6928 => (10 * mss).min((2 * mss).max(14_600)),
            InitialWindow::Segments(n) => mss.saturating_mul(n.max(1)),
        };
        w.min(MAX_CWND)
    }
}

/// Settings shared by all algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CcConfig {
    /// Initial (and restart) window rule. Default: IW10 (RFC 6928).
    pub initial_window: InitialWindow,
    /// Appropriate Byte Counting limit L in segments for slow start (RFC 3465 §2.2, RFC 5681
    /// §3.1 allows cwnd += min(N, SMSS); ABC with L = 2 is the default here).
    pub abc_limit: u32,
    /// Cubic fast convergence (RFC 9438 §4.7). Default on.
    pub fast_convergence: bool,
}

impl Default for CcConfig {
    fn default() -> Self {
        CcConfig {
            initial_window: InitialWindow::Rfc6928,
            abc_limit: 2,
            fast_convergence: true,
        }
    }
}

/// The events a congestion controller reacts to. All sizes are bytes.
pub trait CongestionControl {
    /// The congestion window.
    fn cwnd(&self) -> u32;

    /// The slow-start threshold.
    fn ssthresh(&self) -> u32;

    /// The SMSS the window is counted against.
    fn mss(&self) -> u32;

    /// Whether the sender is in slow start (RFC 5681 §3.1: cwnd < ssthresh).
    fn in_slow_start(&self) -> bool {
        self.cwnd() < self.ssthresh()
    }

    /// New data (`acked_bytes`, cumulatively or by SACK) was acknowledged outside recovery.
    /// `in_flight_before` is the flight size before this ACK; `app_limited` says the sender
    /// did not fill the window because it had nothing to send. The window only grows when the
    /// sender was cwnd-limited (`!app_limited || in_flight_before >= cwnd`), after RFC 7661.
    fn on_ack(
        &mut self,
        now: Instant,
        acked_bytes: u32,
        rtt: &RttEstimator,
        in_flight_before: u32,
        app_limited: bool,
    );

    /// Loss detected by fast retransmit or SACK (RFC 5681 §3.2 step 2, RFC 6675 §5 step 4):
    /// reduce ssthresh and set cwnd to it. `in_flight` is FlightSize at detection.
    fn on_enter_recovery(&mut self, now: Instant, in_flight: u32);

    /// Recovery ended with a full ACK (RFC 6582 §3.2 step 3). `in_flight` is FlightSize after
    /// that ACK; cwnd becomes min(ssthresh, max(FlightSize, SMSS) + SMSS) to avoid a burst.
    fn on_exit_recovery(&mut self, now: Instant, in_flight: u32);

    /// The retransmission timer expired (RFC 5681 §3.1 eq. 4, RFC 9438 §4.8): ssthresh is
    /// reduced (held if this is a repeated timeout without progress) and cwnd = 1 SMSS.
    fn on_rto(&mut self, now: Instant, in_flight: u32);

    /// The connection is about to send after `idle` without sending. If `idle > rto`,
    /// cwnd = min(IW, cwnd) (RFC 5681 §4.1). Returns whether the window was reduced.
    fn on_idle_restart(&mut self, now: Instant, idle: Duration, rto: Duration) -> bool;

    /// The SMSS changed (MSS negotiation, PMTU). Before any data was acknowledged the initial
    /// window is recomputed; afterwards cwnd is only kept at least one SMSS.
    fn set_mss(&mut self, mss: u32);

    /// The last reduction (recovery or RTO) was spurious (D-SACK, Eifel/timestamps): restore
    /// the state saved before it. Returns whether there was something to undo.
    fn undo(&mut self) -> bool;

    /// The SYN or SYN-ACK was retransmitted by the timer: the handshake lost a segment,
    /// so the window after it is one segment, not the initial window (RFC 5681 §3.1,
    /// RFC 6928 §2: "MUST be one segment"). Called once, on entering ESTABLISHED, after
    /// the MSS is known; slow start proceeds from there (ssthresh is untouched).
    fn on_handshake_loss(&mut self);
}

/// Which algorithm a connection uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algorithm {
    /// RFC 5681 + RFC 6582.
    NewReno,
    /// RFC 9438.
    #[default]
    Cubic,
}

/// A connection's congestion controller: an enum so the hot path dispatches statically.
#[derive(Debug, Clone)]
pub enum Cc {
    /// NewReno.
    NewReno(NewReno),
    /// Cubic.
    Cubic(Cubic),
}

impl Cc {
    /// A controller of `algorithm` for a connection with SMSS `mss`.
    pub fn new(algorithm: Algorithm, config: CcConfig, mss: u32) -> Cc {
        match algorithm {
            Algorithm::NewReno => Cc::NewReno(NewReno::new(config, mss)),
            Algorithm::Cubic => Cc::Cubic(Cubic::new(config, mss)),
        }
    }

    /// Which algorithm this is.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Cc::NewReno(_) => Algorithm::NewReno,
            Cc::Cubic(_) => Algorithm::Cubic,
        }
    }
}

macro_rules! delegate {
    ($self:ident, $c:ident => $e:expr) => {
        match $self {
            Cc::NewReno($c) => $e,
            Cc::Cubic($c) => $e,
        }
    };
}

impl CongestionControl for Cc {
    fn cwnd(&self) -> u32 {
        delegate!(self, c => c.cwnd())
    }
    fn ssthresh(&self) -> u32 {
        delegate!(self, c => c.ssthresh())
    }
    fn mss(&self) -> u32 {
        delegate!(self, c => c.mss())
    }
    fn on_ack(
        &mut self,
        now: Instant,
        acked_bytes: u32,
        rtt: &RttEstimator,
        in_flight_before: u32,
        app_limited: bool,
    ) {
        delegate!(self, c => c.on_ack(now, acked_bytes, rtt, in_flight_before, app_limited))
    }
    fn on_enter_recovery(&mut self, now: Instant, in_flight: u32) {
        delegate!(self, c => c.on_enter_recovery(now, in_flight))
    }
    fn on_exit_recovery(&mut self, now: Instant, in_flight: u32) {
        delegate!(self, c => c.on_exit_recovery(now, in_flight))
    }
    fn on_rto(&mut self, now: Instant, in_flight: u32) {
        delegate!(self, c => c.on_rto(now, in_flight))
    }
    fn on_idle_restart(&mut self, now: Instant, idle: Duration, rto: Duration) -> bool {
        delegate!(self, c => c.on_idle_restart(now, idle, rto))
    }
    fn set_mss(&mut self, mss: u32) {
        delegate!(self, c => c.set_mss(mss))
    }
    fn undo(&mut self) -> bool {
        delegate!(self, c => c.undo())
    }
    fn on_handshake_loss(&mut self) {
        delegate!(self, c => c.on_handshake_loss())
    }
}

/// The window state and rules both algorithms share: slow start, the RTO loss window, the
/// restart window, recovery exit and undo of cwnd/ssthresh.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    pub(crate) cfg: CcConfig,
    pub(crate) mss: u32,
    pub(crate) cwnd: u32,
    pub(crate) ssthresh: u32,
    /// No ACK, loss or timeout yet: `set_mss` may recompute the initial window.
    pristine: bool,
    /// A timeout happened and no new data was acknowledged since: a further timeout holds
    /// ssthresh (RFC 5681 §3.1, note to eq. 4).
    rto_pending: bool,
    /// (cwnd, ssthresh) before the last reduction, for undo.
    saved: Option<(u32, u32)>,
}

impl Window {
    pub(crate) fn new(cfg: CcConfig, mss: u32) -> Window {
        let mss = mss.clamp(MIN_MSS, MAX_MSS);
        Window {
            cfg,
            mss,
            cwnd: cfg.initial_window.bytes(mss),
            // RFC 5681 §3.1: the initial ssthresh SHOULD be arbitrarily high.
            ssthresh: MAX_CWND,
            pristine: true,
            rto_pending: false,
            saved: None,
        }
    }

    /// RFC 7661 spirit: only a cwnd-limited sender may grow the window.
    pub(crate) fn growth_allowed(&self, in_flight_before: u32, app_limited: bool) -> bool {
        !app_limited || in_flight_before >= self.cwnd
    }

    /// Note an ACK of new data (before any growth decision).
    pub(crate) fn note_ack(&mut self) {
        self.pristine = false;
        self.rto_pending = false;
    }

    /// Slow start on `acked` bytes; returns the bytes left over once cwnd reached ssthresh,
    /// which the caller feeds to congestion avoidance.
    pub(crate) fn slow_start(&mut self, acked: u32) -> u32 {
        // RFC 5681 §3.1 eq. 2 with RFC 3465 §2.2 ABC: cwnd += min(N, L*SMSS), L = abc_limit.
        let limit = self.mss.saturating_mul(self.cfg.abc_limit.max(1));
        let inc = acked.min(limit);
        let room = self.ssthresh.saturating_sub(self.cwnd);
        if inc < room {
            self.cwnd = (self.cwnd + inc).min(MAX_CWND);
            0
        } else {
            // Stop at ssthresh; the rest of this ACK counts for congestion avoidance.
            self.cwnd = self.ssthresh.min(MAX_CWND);
            acked - room
        }
    }

    /// Save (cwnd, ssthresh) for undo and mark the state non-pristine.
    pub(crate) fn save_for_undo(&mut self) {
        self.pristine = false;
        self.saved = Some((self.cwnd, self.ssthresh));
    }

    /// RFC 5681 §3.1 eq. 4: ssthresh = max (FlightSize / 2, 2*SMSS).
    pub(crate) fn half_flight(&self, in_flight: u32) -> u32 {
        (in_flight / 2).max(2 * self.mss).min(MAX_CWND)
    }

    /// Timeout handling shared by both algorithms; `new_ssthresh` is the algorithm's
    /// reduction. Returns whether ssthresh was reduced (false when held).
    pub(crate) fn on_rto(&mut self, new_ssthresh: u32) -> bool {
        let reduce = !self.rto_pending;
        if reduce {
            self.save_for_undo();
            // RFC 5681 §3.1 eq. 4 on the first timeout; held for a segment already
            // retransmitted by the timer ("ssthresh is held constant").
            self.ssthresh = new_ssthresh;
        }
        // RFC 5681 §3.1: upon a timeout cwnd MUST be set to no more than the loss window,
        // LW = 1 full-sized segment.
        self.cwnd = self.mss;
        self.rto_pending = true;
        reduce
    }

    /// RFC 6582 §3.2 step 3 (full ACK), option 1: cwnd = min (ssthresh, max (FlightSize,
    /// SMSS) + SMSS), which avoids a burst when little data is in flight.
    pub(crate) fn exit_recovery(&mut self, in_flight: u32) {
        let w = in_flight.max(self.mss).saturating_add(self.mss);
        self.cwnd = self.ssthresh.min(w).max(self.mss);
    }

    /// RFC 5681 §4.1 restart window; returns whether it applied.
    pub(crate) fn idle_restart(&mut self, idle: Duration, rto: Duration) -> bool {
        // RFC 5681 §4.1: when TCP has not sent data in an interval exceeding the RTO, cwnd is
        // reduced to RW = min (IW, cwnd) before transmission.
        if idle <= rto {
            return false;
        }
        let rw = self.cfg.initial_window.bytes(self.mss).min(self.cwnd);
        if rw == self.cwnd {
            return false;
        }
        // RFC 2861 §3: remember most of the old window in ssthresh so slow start regains it.
        self.ssthresh = self.ssthresh.max(self.cwnd / 4 * 3);
        self.cwnd = rw;
        true
    }

    pub(crate) fn set_mss(&mut self, mss: u32) {
        self.mss = mss.clamp(MIN_MSS, MAX_MSS);
        if self.pristine {
            self.cwnd = self.cfg.initial_window.bytes(self.mss);
        }
        self.cwnd = self.cwnd.max(self.mss);
    }

    /// The handshake lost a segment: cwnd is one SMSS and stays so when the MSS changes
    /// (no longer the pristine initial window).
    pub(crate) fn handshake_loss(&mut self) {
        self.pristine = false;
        self.cwnd = self.mss;
    }

    /// Restore the saved (cwnd, ssthresh), never lowering either.
    pub(crate) fn undo(&mut self) -> bool {
        match self.saved.take() {
            Some((c, s)) => {
                self.cwnd = self.cwnd.max(c);
                self.ssthresh = self.ssthresh.max(s);
                self.rto_pending = false;
                true
            }
            None => false,
        }
    }
}

/// NewReno's artificially inflated window for recovery *without* SACK (RFC 6582 §3.2). The
/// connection owns it (it is recovery bookkeeping) and sends while
/// `FlightSize < inflation.window(cc.cwnd())`. With SACK use the RFC 6675 pipe instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecoveryInflation {
    /// Signed byte adjustment on top of the CC's reduced cwnd (= ssthresh).
    extra: i64,
}

impl RecoveryInflation {
    /// Entering fast recovery after DupThresh duplicate ACKs: RFC 6582 §3.2 step 2 / RFC 5681
    /// §3.2 step 4: cwnd = ssthresh + 3*SMSS (the three segments that left the network).
    pub fn on_enter(mss: u32) -> Self {
        RecoveryInflation {
            extra: 3 * i64::from(mss),
        }
    }

    /// RFC 6582 §3.2 step 4 (RFC 5681 §3.2 step 5): each further duplicate ACK inflates cwnd by
    /// SMSS. Bounded so a flood of duplicate ACKs cannot overflow (the connection should also
    /// cap dupacks at the flight size).
    pub fn on_dup_ack(&mut self, mss: u32) {
        self.extra = (self.extra + i64::from(mss)).min(i64::from(MAX_CWND));
    }

    /// RFC 6582 §3.2 step 5 partial ACK: deflate by the amount of new data acknowledged, and
    /// add back SMSS if at least SMSS was acknowledged.
    pub fn on_partial_ack(&mut self, acked_bytes: u32, mss: u32) {
        self.extra -= i64::from(acked_bytes);
        if acked_bytes >= mss {
            self.extra += i64::from(mss);
        }
        self.extra = self.extra.max(-i64::from(MAX_CWND));
    }

    /// The usable window given the CC's (reduced) cwnd; never below one SMSS.
    pub fn window(&self, cwnd: u32, mss: u32) -> u32 {
        let w = (i64::from(cwnd) + self.extra).clamp(i64::from(mss), i64::from(MAX_CWND));
        w as u32
    }
}

/// How a scripted loss in [`cwnd_trace`] is detected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossKind {
    /// Fast retransmit: recovery for one RTT.
    FastRetransmit,
    /// Retransmission timeout: the sender stalls for one RTO, then restarts from 1 SMSS.
    Timeout,
}

/// The fluid model [`cwnd_trace`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceScenario {
    /// Constant path RTT.
    pub rtt: Duration,
    /// SMSS.
    pub mss: u32,
    /// Simulated time.
    pub duration: Duration,
    /// Scripted losses: (time since start, kind), in any order.
    pub losses: Vec<(Duration, LossKind)>,
    /// Bottleneck capacity plus buffer in bytes: a round whose window exceeds it ends in a
    /// fast-retransmit loss (automatic sawtooth). `None` = no capacity losses.
    pub capacity: Option<u32>,
    /// CC settings.
    pub config: CcConfig,
}

/// Run `algorithm` through a deterministic fluid model of `scenario` and return the
/// `(time, cwnd)` points at which cwnd changed (starting with the initial window).
///
/// Model: each round the sender sends a full window; its ACKs return evenly over the next
/// RTT, each acknowledging an equal share. When cwnd exceeds `capacity`, or at a scripted
/// fast-retransmit time, the sender enters recovery for one RTT (no growth, pipe kept full)
/// and then exits with FlightSize = cwnd. A scripted timeout stalls the sender for one RTO and
/// restarts it from 1 SMSS. Work is bounded (at most 2^20 ACK events and 4096 ACKs per
/// round), so any scenario terminates.
pub fn cwnd_trace(algorithm: Algorithm, scenario: &TraceScenario) -> Vec<(Instant, u32)> {
    const MAX_EVENTS: u32 = 1 << 20;
    const MAX_ACKS_PER_ROUND: u32 = 4096;
    let rtt_ns = u64::try_from(scenario.rtt.as_nanos())
        .unwrap_or(u64::MAX)
        .max(1);
    let end = Instant::ZERO + scenario.duration;
    let mut cc = Cc::new(algorithm, scenario.config, scenario.mss);
    let mut est = RttEstimator::default();
    let mut losses: Vec<(Instant, LossKind)> = scenario
        .losses
        .iter()
        .map(|&(d, k)| (Instant::ZERO + d, k))
        .collect();
    losses.sort_by_key(|&(t, _)| t);
    let mut losses = losses.into_iter().peekable();
    let mut trace = vec![(Instant::ZERO, cc.cwnd())];
    let record = |t: Instant, c: &Cc, trace: &mut Vec<(Instant, u32)>| {
        if trace.last().map(|&(_, w)| w) != Some(c.cwnd()) {
            trace.push((t, c.cwnd()));
        }
    };
    let mut now = Instant::ZERO;
    let mut events = 0u32;
    let mut recovery_until: Option<Instant> = None;
    'rounds: while now < end && events < MAX_EVENTS {
        let window = cc.cwnd();
        let n = (window / cc.mss()).clamp(1, MAX_ACKS_PER_ROUND);
        let round_start = now;
        let mut acked_total = 0u32;
        for i in 0..n {
            events += 1;
            let t = Instant::from_nanos(
                round_start.as_nanos() + rtt_ns.saturating_mul(u64::from(i) + 1) / u64::from(n),
            );
            if t >= end {
                break 'rounds;
            }
            now = t;
            while let Some((_, kind)) = losses.next_if(|&(lt, _)| lt <= t) {
                match kind {
                    LossKind::FastRetransmit if recovery_until.is_none() => {
                        cc.on_enter_recovery(t, cc.cwnd());
                        recovery_until = Some(t + scenario.rtt);
                    }
                    LossKind::FastRetransmit => {}
                    LossKind::Timeout => {
                        recovery_until = None;
                        cc.on_rto(t, cc.cwnd());
                        est.on_timeout(&RttConfig::default());
                        record(t, &cc, &mut trace);
                        now = t + est.rto();
                        continue 'rounds;
                    }
                }
            }
            let acked = if i + 1 == n {
                window - acked_total
            } else {
                window / n
            };
            acked_total += acked;
            match recovery_until {
                Some(until) if t < until => {}
                Some(_) => {
                    recovery_until = None;
                    cc.on_exit_recovery(t, cc.cwnd());
                }
                None => {
                    est.on_sample(&RttConfig::default(), t, scenario.rtt, SampleSource::Fresh);
                    cc.on_ack(t, acked, &est, window - (acked_total - acked), false);
                    record(t, &cc, &mut trace);
                    if scenario.capacity.is_some_and(|cap| cc.cwnd() > cap) {
                        cc.on_enter_recovery(t, cc.cwnd());
                        recovery_until = Some(t + scenario.rtt);
                    }
                }
            }
            record(t, &cc, &mut trace);
        }
    }
    trace
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Ev {
        Ack {
            dt_us: u64,
            back: bool,
            acked: u32,
            in_flight: u32,
            app_limited: bool,
            rtt_us: u64,
        },
        Enter(u32),
        Exit(u32),
        Rto(u32),
        Idle(u64, u64),
        Mss(u32),
        Undo,
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            6 => (0u64..2_000_000, any::<bool>(), any::<u32>(), any::<u32>(), any::<bool>(),
                  0u64..10_000_000)
                .prop_map(|(dt_us, back, acked, in_flight, app_limited, rtt_us)| Ev::Ack {
                    dt_us,
                    back: back && dt_us % 7 == 0,
                    acked,
                    in_flight,
                    app_limited,
                    rtt_us,
                }),
            1 => any::<u32>().prop_map(Ev::Enter),
            1 => any::<u32>().prop_map(Ev::Exit),
            1 => any::<u32>().prop_map(Ev::Rto),
            1 => (any::<u64>(), any::<u64>()).prop_map(|(a, b)| Ev::Idle(a, b)),
            1 => any::<u32>().prop_map(Ev::Mss),
            1 => Just(Ev::Undo),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// ACK sizes, flight sizes and RTTs derive from peer input: no event sequence may
        /// panic or push the window outside [SMSS, MAX_CWND].
        #[test]
        fn cc_bounds_hold_under_arbitrary_events(
            cubic in any::<bool>(),
            mss in any::<u32>(),
            events in proptest::collection::vec(ev(), 1..150),
        ) {
            let alg = if cubic { Algorithm::Cubic } else { Algorithm::NewReno };
            let mut cc = Cc::new(alg, CcConfig::default(), mss);
            let mut est = RttEstimator::default();
            let mut now = Instant::from_millis(1_000_000);
            for e in events {
                match e {
                    Ev::Ack { dt_us, back, acked, in_flight, app_limited, rtt_us } => {
                        now = if back {
                            Instant::from_nanos(now.as_nanos().saturating_sub(dt_us * 1000))
                        } else {
                            now + Duration::from_micros(dt_us)
                        };
                        est.on_sample(
                            &RttConfig::default(),
                            now,
                            Duration::from_micros(rtt_us),
                            SampleSource::Timestamp,
                        );
                        cc.on_ack(now, acked, &est, in_flight, app_limited);
                    }
                    Ev::Enter(f) => cc.on_enter_recovery(now, f),
                    Ev::Exit(f) => cc.on_exit_recovery(now, f),
                    Ev::Rto(f) => cc.on_rto(now, f),
                    Ev::Idle(i, r) => {
                        cc.on_idle_restart(now, Duration::from_nanos(i), Duration::from_nanos(r));
                    }
                    Ev::Mss(m) => cc.set_mss(m),
                    Ev::Undo => {
                        cc.undo();
                    }
                }
                prop_assert!((MIN_MSS..=MAX_MSS).contains(&cc.mss()));
                prop_assert!(cc.cwnd() >= cc.mss(), "cwnd {} < mss {}", cc.cwnd(), cc.mss());
                prop_assert!(cc.cwnd() <= MAX_CWND);
                prop_assert!(cc.ssthresh() <= MAX_CWND);
                prop_assert!(cc.ssthresh() >= 2 * MIN_MSS);
            }
        }
    }

    #[test]
    fn rfc5681_3_1_initial_window_by_smss() {
        assert_eq!(InitialWindow::Rfc5681.bytes(1460), 3 * 1460);
        assert_eq!(InitialWindow::Rfc5681.bytes(536), 4 * 536);
        assert_eq!(InitialWindow::Rfc5681.bytes(1095), 4 * 1095);
        assert_eq!(InitialWindow::Rfc5681.bytes(2190), 3 * 2190);
        assert_eq!(InitialWindow::Rfc5681.bytes(8960), 2 * 8960);
    }

    #[test]
    fn rfc6928_2_iw10_bounded_by_14600() {
        assert_eq!(InitialWindow::Rfc6928.bytes(1460), 14_600);
        assert_eq!(InitialWindow::Rfc6928.bytes(536), 5_360);
        assert_eq!(InitialWindow::Rfc6928.bytes(8960), 2 * 8960);
        assert_eq!(InitialWindow::Segments(0).bytes(1000), 1000);
        assert_eq!(InitialWindow::Segments(u32::MAX).bytes(1000), MAX_CWND);
    }

    #[test]
    fn zero_mss_is_raised_to_minimum() {
        for alg in [Algorithm::NewReno, Algorithm::Cubic] {
            let mut cc = Cc::new(alg, CcConfig::default(), 0);
            assert_eq!(cc.mss(), MIN_MSS);
            assert!(cc.cwnd() >= MIN_MSS);
            cc.set_mss(0);
            assert_eq!(cc.mss(), MIN_MSS);
            cc.on_rto(Instant::ZERO, 0);
            assert_eq!(cc.cwnd(), MIN_MSS);
        }
    }

    #[test]
    fn rfc6582_3_2_inflation_and_partial_ack_deflation() {
        let mss = 1000;
        let ssthresh = 10_000;
        let mut inf = RecoveryInflation::on_enter(mss);
        // Step 2: ssthresh + 3*SMSS.
        assert_eq!(inf.window(ssthresh, mss), 13_000);
        // Step 4: +SMSS per additional duplicate ACK.
        inf.on_dup_ack(mss);
        inf.on_dup_ack(mss);
        assert_eq!(inf.window(ssthresh, mss), 15_000);
        // Step 5: partial ACK of 4000 bytes deflates by 4000 and adds back SMSS.
        inf.on_partial_ack(4000, mss);
        assert_eq!(inf.window(ssthresh, mss), 12_000);
        // A partial ACK of less than SMSS gets nothing back.
        inf.on_partial_ack(500, mss);
        assert_eq!(inf.window(ssthresh, mss), 11_500);
        // Huge partial ACKs cannot push the window below one SMSS.
        inf.on_partial_ack(u32::MAX, mss);
        assert_eq!(inf.window(ssthresh, mss), mss);
        for _ in 0..10_000 {
            inf.on_dup_ack(u32::MAX);
        }
        assert_eq!(inf.window(ssthresh, mss), MAX_CWND);
    }

    #[test]
    fn cc_enum_delegates_to_chosen_algorithm() {
        let a = Cc::new(Algorithm::NewReno, CcConfig::default(), 1460);
        let b = Cc::new(Algorithm::Cubic, CcConfig::default(), 1460);
        assert_eq!(a.algorithm(), Algorithm::NewReno);
        assert_eq!(b.algorithm(), Algorithm::Cubic);
        let mut a2 = a.clone();
        let mut b2 = b.clone();
        a2.on_enter_recovery(Instant::ZERO, 100_000);
        b2.on_enter_recovery(Instant::ZERO, 100_000);
        // NewReno halves, Cubic multiplies by 0.7.
        assert_eq!(a2.ssthresh(), 50_000);
        assert_eq!(b2.ssthresh(), 70_000);
    }

    fn scenario(losses: Vec<(Duration, LossKind)>, capacity: Option<u32>) -> TraceScenario {
        TraceScenario {
            rtt: Duration::from_millis(10),
            mss: 1000,
            duration: Duration::from_secs(4),
            losses,
            capacity,
            config: CcConfig::default(),
        }
    }

    #[test]
    fn trace_is_deterministic_and_bounded() {
        let s = scenario(vec![(Duration::from_millis(200), LossKind::Timeout)], None);
        for alg in [Algorithm::NewReno, Algorithm::Cubic] {
            let a = cwnd_trace(alg, &s);
            let b = cwnd_trace(alg, &s);
            assert_eq!(a, b);
            assert!(a.windows(2).all(|w| w[0].0 <= w[1].0), "time ordered");
            assert!(a.iter().any(|&(_, c)| c == 1000), "RTO hits 1 SMSS");
        }
        // A pathological scenario still terminates.
        let huge = TraceScenario {
            rtt: Duration::from_nanos(1),
            duration: Duration::from_secs(3600),
            ..s
        };
        assert!(!cwnd_trace(Algorithm::Cubic, &huge).is_empty());
    }

    #[test]
    fn trace_newreno_vs_cubic_sawtooth_under_capacity() {
        let s = scenario(vec![], Some(200_000));
        for alg in [Algorithm::NewReno, Algorithm::Cubic] {
            let t = cwnd_trace(alg, &s);
            let peak = t.iter().map(|&(_, c)| c).max().unwrap();
            assert!(peak > 200_000 && peak < 500_000, "{alg:?} peak {peak}");
            // Count the reductions: the capacity produces repeated sawteeth.
            let drops = t.windows(2).filter(|w| w[1].1 < w[0].1).count();
            assert!(drops >= 2, "{alg:?} drops {drops}");
        }
    }
}
