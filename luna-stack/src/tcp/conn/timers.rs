//! Timers: retransmission (RFC 6298), loss detection (RFC 8985: the tail loss probe or
//! RACK's reordering timer, armed in `tlp.rs`), persist (RFC 9293 §3.8.6.1), delayed ACK,
//! TIME-WAIT, FIN-WAIT-2 of an orphan and keepalive (RFC 9293 §3.8.4).

use super::*;

impl Connection {
    // ---------------------------------------------------------------------------------------
    // Timers
    // ---------------------------------------------------------------------------------------

    /// The earliest instant at which `on_timeout` has work to do.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    pub(super) fn arm_keepalive(&mut self, now: Instant) {
        if let Some(ka) = self.cfg.keepalive {
            self.timers.set(Timer::Keepalive, now + ka.idle);
            self.keepalive = Keepalive { probes_sent: 0 };
        }
    }

    /// RFC 6298 §5.1-5.2 and RFC 9293 §3.8.6.1: keep exactly one of the retransmission and
    /// persist timers running while anything is outstanding or waiting for window.
    #[inline]
    pub(super) fn arm_timers(&mut self, now: Instant) {
        if self.state == State::Established && self.snd_wnd != 0 {
            // The data-transfer case, what the general rules below come to there (no
            // FIN-WAIT-2 limit, no zero window): the RTO runs while anything is outstanding,
            // and the persist timer, as the override timeout of sender SWS avoidance, while
            // data waits with nothing outstanding.
            if self.snd_max != self.snd_una {
                self.timers.clear(Timer::Persist);
                self.sws_override = false;
                if !self.timers.is_armed(Timer::Rto) {
                    self.timers.set(Timer::Rto, now + self.rtt.rto());
                }
            } else {
                self.timers.clear(Timer::Rto);
                self.arm_sws_override(now);
            }
            return;
        }
        if self.orphaned && self.state == State::FinWait2 && !self.timers.is_armed(Timer::FinWait2)
        {
            // RFC 9293 has no FIN-WAIT-2 timer: a peer that never sends its FIN keeps the
            // connection forever. With no application left to wait for it, give up after
            // `fin_timeout` (Linux tcp_fin_timeout).
            self.timers.set(Timer::FinWait2, now + self.cfg.fin_timeout);
        }
        if matches!(self.state, State::Closed | State::TimeWait) {
            self.timers.clear(Timer::Rto);
            self.timers.clear(Timer::Persist);
            return;
        }
        let outstanding = self.snd_max != self.snd_una;
        // Payload unacknowledged or unsent: a zero window means probing, not retransmitting.
        // (A lone FIN goes out regardless of the window and is covered by the RTO.)
        let data_pending = self.sndq.end().gt(self.snd_una);
        if self.state.is_synchronized() && self.snd_wnd == 0 && data_pending {
            self.timers.clear(Timer::Rto);
            self.sws_override = false;
            if !self.timers.is_armed(Timer::Persist) {
                self.timers
                    .set(Timer::Persist, now + self.persist_interval());
            }
        } else if self.state.is_synchronized() && !outstanding {
            self.timers.clear(Timer::Rto);
            self.arm_sws_override(now);
        } else {
            self.timers.clear(Timer::Persist);
            self.sws_override = false;
            if outstanding {
                if !self.timers.is_armed(Timer::Rto) {
                    self.timers.set(Timer::Rto, now + self.rto());
                }
            } else {
                self.timers.clear(Timer::Rto);
            }
        }
    }

    /// Nothing outstanding and a window open: if data still waits, only sender SWS
    /// avoidance holds it (the window is under one segment and under half the largest the
    /// peer offered), and no ACK will come to open it. RFC 9293 §3.8.6.2.1 (4): an override
    /// timeout sends it anyway; the persist timer is that timeout, as in Linux and the BSDs.
    fn arm_sws_override(&mut self, now: Instant) {
        if self.sndq.end().gt(self.snd_nxt) {
            if !self.timers.is_armed(Timer::Persist) {
                self.timers
                    .set(Timer::Persist, now + self.persist_interval());
            }
        } else {
            self.timers.clear(Timer::Persist);
            self.sws_override = false;
        }
    }

    /// RFC 9293 §3.8.6.1: probe intervals grow exponentially from the RTO.
    pub(super) fn persist_interval(&self) -> Duration {
        let base = self.rto();
        let max = self.cfg.rtt.max_rto;
        base.checked_mul(1u32 << self.persist_backoff.min(16))
            .map_or(max, |d| d.min(max))
    }

    /// Run the timers that expired by `now`.
    pub fn on_timeout(&mut self, now: Instant) {
        if self.timers.take_due(Timer::TimeWait, now) {
            // RFC 9293 §3.10.8: 2 MSL elapsed in TIME-WAIT.
            self.state = State::Closed;
            return;
        }
        if self.timers.take_due(Timer::FinWait2, now) {
            // An orphan's FIN-WAIT-2 expired: reset, so a peer stuck in CLOSE-WAIT learns.
            self.rst_pending = Some(self.seq_for_control());
            self.terminate(CloseReason::Timeout);
            return;
        }
        if self.timers.take_due(Timer::DelayedAck, now) {
            self.ack_now = true;
        }
        // RFC 8985 §7.2: a probe due no later than the RTO goes out in its place (it
        // restarts the retransmission timer).
        if self.timers.take_due(Timer::Pto, now) {
            self.on_pto(now);
        }
        if self.timers.take_due(Timer::Rto, now) {
            self.on_rto(now);
        }
        if self.timers.take_due(Timer::Persist, now) {
            if self.snd_wnd != 0 {
                // The override timeout of sender SWS avoidance (`arm_sws_override`): the
                // window is filled with new data, which the RTO covers from then on. Not a
                // probe: nothing counts against the peer's liveness, nothing backs off.
                self.sws_override = true;
            } else {
                self.retries += 1;
                if self.retries > self.cfg.max_retries {
                    // Unanswered probes: the peer is gone.
                    self.rst_pending = Some(self.seq_for_control());
                    self.terminate(CloseReason::Timeout);
                    return;
                }
                self.send_window_probe = true;
                self.persist_backoff = self.persist_backoff.saturating_add(1);
            }
        }
        if self.timers.is_due(Timer::Keepalive, now) {
            self.on_keepalive(now);
        }
        self.arm_timers(now);
    }

    pub(super) fn on_rto(&mut self, now: Instant) {
        self.retries += 1;
        let limit = match self.state {
            State::SynSent => self.cfg.syn_retries,
            State::SynReceived => self.cfg.synack_retries,
            _ => self.cfg.max_retries,
        };
        if self.retries > limit {
            // RFC 9293 §3.8.3 R2: give up.
            if self.state.is_synchronized() {
                self.rst_pending = Some(self.seq_for_control());
            }
            self.terminate(CloseReason::Timeout);
            return;
        }
        self.counters.rtos += 1;
        // A timeout is a loss signal of its own; an earlier recovery is no longer undone
        // (the CC saved its state anew), and if the raised DupThresh held back a fast
        // retransmit the default would have sent, the reordering estimate is reset.
        self.undo.active = false;
        self.lt_bytes = 0;
        if self.recovery.is_none() {
            self.sb.on_rto_outside_recovery();
        }
        // RFC 6298 §5.5: back off; §5.6: restart; RFC 5681 §3.1 eq. 4: loss window.
        self.rtt.on_timeout(&self.cfg.rtt);
        let in_flight = self.snd_max - self.snd_una;
        if self.state.is_synchronized() {
            self.cc.on_rto(now, in_flight);
        }
        // RFC 6582 §3.2 step 5: after an RTO, recover <- the highest sequence number sent, in
        // or out of recovery, so the duplicate ACKs of the go-back-N retransmissions cannot
        // start a fast retransmit below it (RFC 6675 §5.1 says the same for SACK recovery).
        self.recovery = None;
        self.last_recover = self.snd_max;
        self.dupacks = 0;
        self.rexmit_now = None;
        self.rtt_probe = None;
        // RFC 8985 §7: the timeout ends a probe episode (its loss is the RTO's now).
        self.tlp = None;
        self.send_tlp = false;
        // Go back N from SND.UNA (RFC 5681 §3.1); SACKed ranges above it are skipped when
        // resent (RFC 6675 §5.1), which is safe because reneging is detected on every ACK.
        self.snd_nxt = self.snd_una;
        self.sb.on_rto();
        if !self.state.is_synchronized() {
            self.syn_retransmitted = true;
        }
    }

    pub(super) fn on_keepalive(&mut self, now: Instant) {
        let Some(ka) = self.cfg.keepalive else {
            self.timers.clear(Timer::Keepalive);
            return;
        };
        if !matches!(self.state, State::Established | State::CloseWait) {
            self.timers.clear(Timer::Keepalive);
            return;
        }
        if self.snd_max != self.snd_una || self.sndq.end().gt(self.snd_una) {
            // RFC 1122 §4.2.3.6: probe only an idle connection. With data (or a FIN)
            // outstanding or queued, the retransmission or persist timer watches the peer;
            // and a probe at SND.NXT - 1 is an acceptable segment, left unanswered, to a
            // receiver still missing earlier data, so counting it would reset a live peer
            // (Linux tcp_keepalive_timer skips probing the same way).
            self.timers.set(Timer::Keepalive, now + ka.idle);
            return;
        }
        if self.keepalive.probes_sent >= ka.probes {
            // RFC 9293 §3.8.4: the peer is gone.
            self.rst_pending = Some(self.seq_for_control());
            self.terminate(CloseReason::Timeout);
            return;
        }
        self.keepalive.probes_sent += 1;
        self.timers.set(Timer::Keepalive, now + ka.interval);
        self.counters.keepalive_probes += 1;
        self.send_keepalive = true;
    }
}

/// One of a connection's timers: an index into its [`TimerTable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// Retransmission timer (RFC 6298).
    Rto,
    /// Zero-window probe (RFC 9293 §3.8.6.1); never armed together with `Rto`.
    Persist,
    /// Delayed ACK (RFC 9293 §3.8.6.3).
    DelayedAck,
    /// 2 MSL in TIME-WAIT (RFC 9293 §3.6.1).
    TimeWait,
    /// An orphan's FIN-WAIT-2 limit (`TcpConfig::fin_timeout`).
    FinWait2,
    /// Next keepalive probe (RFC 9293 §3.8.4).
    Keepalive,
    /// Loss detection (`conn/tlp.rs`): the tail loss probe (RFC 8985 §7) when nothing is
    /// SACKed, RACK's reordering timer (§6.2) when something is; armed only together with
    /// `Rto`, and never later than it.
    Pto,
}

impl Timer {
    const COUNT: usize = 7;
}

/// A connection's deadlines, one optional instant per [`Timer`]: `poll_timeout` is their
/// minimum and `on_timeout` fires the ones due, in a fixed order.
///
/// Stored as nanoseconds, a disarmed slot holding `u64::MAX`, so the minimum the stack asks
/// for after every segment is seven branch-free `min`s instead of a chain of `Option`
/// matches. An armed deadline is at most `u64::MAX - 1` ns (a saturated sum, 584 years
/// after the clock's origin, is stored one nanosecond early), which keeps it apart from
/// "disarmed" without a separate bit: the table is 56 bytes and ends the connection's
/// fourth hot line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TimerTable {
    at: [u64; Timer::COUNT],
}

/// A disarmed slot.
const DISARMED: u64 = u64::MAX;

impl Default for TimerTable {
    fn default() -> Self {
        TimerTable {
            at: [DISARMED; Timer::COUNT],
        }
    }
}

impl TimerTable {
    /// Arms (or re-arms) `t` for `at`.
    pub(super) fn set(&mut self, t: Timer, at: Instant) {
        self.at[t as usize] = at.as_nanos().min(DISARMED - 1);
    }

    /// Disarms `t`. Disarming the retransmission timer disarms the loss probe with it
    /// (the probe runs only while the retransmission timer does).
    #[inline]
    pub(super) fn clear(&mut self, t: Timer) {
        self.at[t as usize] = DISARMED;
        if matches!(t, Timer::Rto) {
            self.at[Timer::Pto as usize] = DISARMED;
        }
    }

    /// Whether `t` is armed.
    pub(super) fn is_armed(&self, t: Timer) -> bool {
        self.at[t as usize] != DISARMED
    }

    /// `t`'s deadline, if armed.
    pub(super) fn deadline(&self, t: Timer) -> Option<Instant> {
        self.is_armed(t)
            .then(|| Instant::from_nanos(self.at[t as usize]))
    }

    /// Whether `t` is armed and due at `now`.
    pub(super) fn is_due(&self, t: Timer, now: Instant) -> bool {
        self.is_armed(t) && self.at[t as usize] <= now.as_nanos()
    }

    /// Disarms `t` if it is due at `now`; returns whether it was.
    pub(super) fn take_due(&mut self, t: Timer, now: Instant) -> bool {
        let due = self.is_due(t, now);
        if due {
            self.clear(t);
        }
        due
    }

    /// The earliest armed deadline.
    pub(super) fn next(&self) -> Option<Instant> {
        // Called after every input by the stack: disarmed slots hold u64::MAX, so the
        // minimum over all slots is the minimum over the armed ones, and u64::MAX only
        // when none is armed.
        let m = self.at.iter().fold(DISARMED, |m, &a| m.min(a));
        (m != DISARMED).then(|| Instant::from_nanos(m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_table_min_and_arming() {
        let mut t = TimerTable::default();
        assert_eq!(t.next(), None);
        assert!(!t.is_armed(Timer::Rto));
        t.set(Timer::Keepalive, Instant::from_nanos(50));
        t.set(Timer::Rto, Instant::from_nanos(70));
        assert_eq!(t.next(), Some(Instant::from_nanos(50)));
        assert!(t.is_due(Timer::Keepalive, Instant::from_nanos(50)));
        assert!(!t.is_due(Timer::Rto, Instant::from_nanos(69)));
        assert!(t.take_due(Timer::Keepalive, Instant::from_nanos(60)));
        assert!(!t.is_armed(Timer::Keepalive));
        assert_eq!(t.next(), Some(Instant::from_nanos(70)));
        t.clear(Timer::Rto);
        assert_eq!(t.next(), None);
        // A saturated deadline is armed, not confused with a disarmed slot.
        t.set(Timer::TimeWait, Instant::from_nanos(u64::MAX));
        assert!(t.is_armed(Timer::TimeWait));
        assert_eq!(t.next(), Some(Instant::from_nanos(u64::MAX - 1)));
        assert!(t.is_due(Timer::TimeWait, Instant::from_nanos(u64::MAX)));
        assert!(!t.is_due(Timer::Persist, Instant::from_nanos(u64::MAX)));
        assert_eq!(t.deadline(Timer::Persist), None);
        t.set(Timer::Pto, Instant::from_nanos(7));
        assert_eq!(t.deadline(Timer::Pto), Some(Instant::from_nanos(7)));
        assert_eq!(t.next(), Some(Instant::from_nanos(7)));
    }
}
