//! RACK-TLP (RFC 8985) where RFC 6675's DupThresh cannot help.
//!
//! Tail loss probe (§7): when the last segments of a flight are lost, no later segment is
//! left to draw the duplicate ACKs or SACKs that fast recovery needs, and the sender waits
//! for the retransmission timer (at least `min_rto`, 200 ms by default: a three-segment
//! RPC reply losing its last segment took 200 ms instead of microseconds).
//! A probe timeout (PTO) of about two round trips sends one segment — new data if the
//! receive window allows, else the last segment again — so that the receiver's ACK shows
//! what is missing: a tail loss is repaired by the probe itself, other losses enter SACK
//! recovery on the ACK it draws.
//!
//! Contract (RFC 8985 §7.2-7.4, as Linux's `tcp_schedule_loss_probe` applies them):
//! - The PTO is (re)started after new data is sent and when an ACK acknowledges new data,
//!   only with SACK, outside loss recovery and RTO recovery, with nothing SACKed, the send
//!   window open and no probe outstanding. PTO = 2·SRTT, plus the peer's allowed ACK
//!   delay (`TcpConfig::tlp_ack_delay`, §7.2 `TLP.max_ack_delay`) when one segment is in
//!   flight, at least `TcpConfig::tlp` (the floor), 1 s before any RTT sample; never later
//!   than the RTO.
//! - When it fires: one probe, which congestion control does not gate (RFC 8985 §7.3), then
//!   the RTO is restarted; no second probe until the episode ends.
//! - Beyond the RFC: a probe the peer D-SACKs was needless (the round trip outgrew
//!   2·SRTT without a loss: a loaded or stalled peer), so the connection's next PTOs
//!   are doubled, up to three times (8×), until a probe finds a real loss.
//! - The episode ends when an ACK covers the probe: a probe of new data ends it; a
//!   retransmitted probe that is D-SACKed, or answered by a duplicate ACK at its end
//!   (§7.4.2 step 1), means the original arrived and nothing was lost; an ACK beyond the
//!   probe without such a D-SACK means the probe repaired a loss, and congestion control
//!   reduces the window as for a recovery entered and left at once (RFC 8985 §7.4). Fast
//!   recovery and the RTO end an episode too.
//! - No probe timeout in RTO recovery (until SND.UNA passes the RTO's `recover`), and none
//!   sent when the PTO fires after everything was acknowledged or the window closed.

use super::output::Rexmit;
use super::*;
use crate::tcp::rtt::nanos as ns;

/// An outstanding loss probe (RFC 8985 §7.1 `TLP.end_seq`, `TLP.is_retrans`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TlpEpisode {
    /// The probe's first sequence number (its D-SACK names it).
    pub(super) start: SeqNum,
    /// `TLP.end_seq`: SND.MAX after the probe was sent.
    pub(super) end: SeqNum,
    /// `TLP.is_retrans`: the probe sent the last segment again (no new data could go).
    pub(super) retrans: bool,
    /// FlightSize when the probe went out: what a loss it repaired reduces from.
    pub(super) flight: u32,
}

/// Most doublings of the probe timeout after needless (D-SACKed) probes.
const MAX_TLP_BACKOFF: u8 = 3;

/// RFC 8985 §7.2: the PTO before any RTT sample.
const UNSAMPLED_PTO: Duration = Duration::from_secs(1);

impl Connection {
    /// Whether a loss probe may be scheduled or sent now (RFC 8985 §7.2's conditions).
    fn may_probe(&self) -> bool {
        self.cfg.tlp.is_some()
            && self.sack_ok
            && self.tlp.is_none()
            && self.recovery.is_none()
            && self.retries == 0
            && self.snd_nxt == self.snd_max
            && self.snd_max != self.snd_una
            // RTO recovery lasts until SND.UNA passes what was outstanding at the timeout
            // (`on_rto` sets `last_recover`), not only until the first ACK resets `retries`.
            && self.snd_una.ge(self.last_recover)
            && self.snd_wnd != 0
            && self.state.is_synchronized()
            && self.state != State::TimeWait
            && self.sb.sacked_bytes() == 0
    }

    /// RFC 8985 §7.2: (re)start the PTO, after new data was sent or new data acknowledged,
    /// if a probe may be sent; otherwise leave the timer as it is (`on_pto` checks again).
    #[inline]
    pub(super) fn arm_pto(&mut self, now: Instant) {
        // `may_probe` also requires `cfg.tlp`: with probes off this is the one test the
        // hot path pays.
        let Some(floor) = self.cfg.tlp else {
            return;
        };
        if !self.may_probe() {
            return;
        }
        // In nanoseconds: this runs for every flight sent and every ACK of new data.
        let pto = match self.rtt.srtt_nanos() {
            Some(srtt) => {
                let mut pto = srtt.saturating_mul(2) << self.tlp_backoff;
                if self.snd_max - self.snd_una <= self.snd_mss {
                    // One segment in flight: its ACK may be delayed (TLP.max_ack_delay).
                    pto = pto.saturating_add(ns(self.cfg.tlp_ack_delay));
                }
                pto.max(ns(floor))
            }
            None => ns(UNSAMPLED_PTO),
        };
        // Never later than the RTO: then the probe goes out in its place.
        let rto_at = match self.timers.deadline(Timer::Rto) {
            Some(at) => at.as_nanos(),
            None => now.as_nanos().saturating_add(ns(self.rto())),
        };
        let at = now.as_nanos().saturating_add(pto).min(rto_at);
        self.timers.set(Timer::Pto, Instant::from_nanos(at));
    }

    /// Whether RACK's reordering timer applies (RFC 8985 §6.2): data is SACKed above a
    /// hole outside any recovery, a recovery may start (SND.UNA passed the previous
    /// `recover`, RFC 6582 §3.2 step 2), and no new data can go out to draw the duplicate
    /// ACKs DupThresh counts (nothing unsent, or the peer's window is full: RFC 5827's
    /// condition for early retransmit). With data to send, limited transmit keeps the
    /// SACKs coming and RFC 6675's rule decides, as before: under heavy reordering (the
    /// interop impairment, a quarter of the frames held back 2 ms on a 2 ms path) a timer
    /// on every bulk hole started three times as many needless recoveries. Disjoint from
    /// [`Connection::may_probe`] (which wants nothing SACKed): the two share the timer slot.
    fn may_mark_lost(&self) -> bool {
        let more_to_send =
            self.sndq.end().gt(self.snd_max) && (self.snd_una + self.snd_wnd).gt(self.snd_max);
        !more_to_send
            && self.cfg.rack
            && self.sack_ok
            && self.recovery.is_none()
            && self.retries == 0
            && self.snd_nxt == self.snd_max
            && self.state.is_synchronized()
            && self.state != State::TimeWait
            && self.sb.sacked_bytes() != 0
            && self.snd_una.ge(self.last_recover)
    }

    /// An ACK SACKed new data and recovery did not start (fewer than DupThresh segments
    /// above the hole): arm RACK's reordering timer (RFC 8985 §6.2-6.3). The hole was sent
    /// before the SACKed data, which has arrived, so once the reordering window passes
    /// with the hole still open it is lost. The window (§6.2 `RACK.reo_wnd`): `reo_mult`
    /// quarters of the minimum RTT, at most a smoothed RTT; D-SACKs (a retransmission
    /// proved needless: reordering) grow `reo_mult` (`rack_on_dsack`). Not pushed later by
    /// further SACKs; capped by the RTO.
    pub(super) fn arm_reordering_timer(&mut self, now: Instant) {
        if !self.may_mark_lost() {
            return;
        }
        let reo = match (self.rtt.min_rtt(), self.rtt.srtt()) {
            (Some(min), Some(srtt)) => (min / 4 * u32::from(self.reo_mult)).min(srtt),
            // Before any RTT sample (SACKs on the first flight), a quarter of the RTO.
            _ => self.rto() / 4,
        };
        let rto_at = self
            .timers
            .deadline(Timer::Rto)
            .unwrap_or_else(|| now + self.rto());
        let mut at = (now + reo).min(rto_at);
        if let Some(armed) = self.timers.deadline(Timer::Pto) {
            at = at.min(armed);
        }
        self.timers.set(Timer::Pto, at);
    }

    /// A round trip saw D-SACKs (RFC 8985 §6.2 step 4; `on_ack` calls this for the first
    /// D-SACK of a round, `RACK.dsack_round`): a retransmission was needless, so the
    /// network reorders more than the window allowed; widen it by a quarter of the minimum
    /// RTT, and keep it so for the next 16 recoveries.
    pub(super) fn rack_on_dsack(&mut self) {
        self.reo_mult = self.reo_mult.saturating_add(1).min(64);
        self.reo_persist = 16;
    }

    /// A fast or RTO recovery ended: one recovery less before the reordering window falls
    /// back to a quarter of the minimum RTT (§6.2 step 4, `RACK.reo_wnd_persist`, counted
    /// "if exiting Fast or RTO recovery": the window a D-SACK widened still holds during the
    /// recovery that uses up its persistence).
    pub(super) fn rack_on_recovery_exit(&mut self) {
        if self.reo_persist > 0 {
            self.reo_persist -= 1;
            if self.reo_persist == 0 {
                self.reo_mult = 1;
            }
        }
    }

    /// The loss-detection timer expired. With data SACKed above a hole it was RACK's
    /// reordering timer: the hole is lost and fast recovery starts (RFC 8985 §6.2).
    /// Otherwise it was the PTO (§7.3): a probe goes out at the next poll, if one still may,
    /// and the retransmission timer restarts (the probe takes the place of an RTO due now).
    pub(super) fn on_pto(&mut self, now: Instant) {
        if self.sb.sacked_bytes() != 0 {
            if self.may_mark_lost() {
                self.counters.rack_recoveries += 1;
                self.enter_recovery(now);
            }
            return;
        }
        if self.may_probe() {
            self.send_tlp = true;
            self.timers.set(Timer::Rto, now + self.rto());
        }
    }

    /// RFC 8985 §7.3: the probe. New data if there is some and the receive window takes it
    /// (congestion control does not gate the probe); otherwise the highest-sequence
    /// segment again: up to one SMSS ending at the last octet sent (the send queue keeps
    /// no segment boundaries, so it may reach into the segment before), with the FIN if
    /// that went last. The RTO restarts from now.
    pub(super) fn loss_probe(&mut self, now: Instant, out: &mut OutSegment) -> bool {
        // The PTO fired, but an ACK came before the poll: with nothing outstanding nothing
        // can have been lost (and the FIN is not sent again), and a closed window is the
        // persist timer's to probe.
        if self.snd_max == self.snd_una || self.snd_wnd == 0 {
            return false;
        }
        let flight = self.snd_max - self.snd_una;
        let episode = if self.next_data_segment(now, out, 1, true) {
            TlpEpisode {
                start: out.repr.seq,
                end: self.snd_max,
                retrans: false,
                flight,
            }
        } else {
            let data_end = self.sndq.end();
            let fin_sent = self.fin_queued && self.snd_max == data_end + 1u32;
            let hi = if fin_sent { data_end } else { self.snd_max };
            let avail = if hi.gt(self.snd_una) {
                hi - self.snd_una
            } else {
                0
            };
            let opts = self.data_options(now);
            let len = avail.min(self.max_payload(&opts));
            let start = hi - len;
            if !self.retransmit_at(now, start, len, Rexmit::Probe, out) {
                return false;
            }
            TlpEpisode {
                start,
                end: self.snd_max,
                retrans: true,
                flight,
            }
        };
        self.tlp = Some(episode);
        self.counters.tlp_probes += 1;
        self.timers.set(Timer::Rto, now + self.rto());
        true
    }

    /// A D-SACK arrived on an ACK of `ack`: if it names the retransmitted probe and the ACK
    /// covers the probe, the original arrived too and nothing was lost (RFC 8985 §7.4.2
    /// step 1 (2)). Below TLP.end_seq the ACK still shows a hole under the probe: the probe
    /// found a loss (`tlp_on_sack` starts the recovery), whatever became of its duplicate.
    pub(super) fn tlp_on_dsack(&mut self, l: SeqNum, r: SeqNum, ack: SeqNum) {
        if let Some(t) = self.tlp {
            if t.retrans && ack.ge(t.end) && l.lt(t.end) && r.gt(t.start) {
                self.tlp = None;
                // The probe was needless: the round trip outgrew two SRTTs without a loss
                // (a loaded peer, queueing). Wait twice as long before the next one, up to
                // 8× (three doublings; beyond that the RTO, which caps the PTO, comes first anyway).
                self.tlp_backoff = (self.tlp_backoff + 1).min(MAX_TLP_BACKOFF);
            }
        }
    }

    /// An ACK that did not move SND.UNA, while a retransmitted probe is outstanding. RFC 8985
    /// §7.4.2 step 1 (1): a duplicate ACK at TLP.end_seq (no data, no SYN or FIN, the same
    /// window) with no SACK above it is the probe's ACK after the original's: both arrived,
    /// nothing was lost (a peer that sends no D-SACK says so this way). As Linux's
    /// `tcp_process_tlp_ack`, also when nothing is left outstanding.
    pub(super) fn tlp_on_dup_ack(
        &mut self,
        ack: SeqNum,
        seg: &TcpRepr,
        payload_len: usize,
        blocks: &[(SeqNum, SeqNum)],
    ) {
        let Some(t) = self.tlp else {
            return;
        };
        if t.retrans
            && ack == t.end
            && payload_len == 0
            && !seg.flags.syn()
            && !seg.flags.fin()
            && seg.window == self.last_wnd_field
            && blocks.iter().all(|&(_, r)| r.le(t.end))
        {
            self.tlp = None;
        }
    }

    /// The probe was SACKed with data below it still missing: that data was sent before
    /// the probe, at least a PTO (two smoothed round trips) earlier, and the probe has
    /// arrived, so by RFC 8985 §6.2 (a segment is lost once one sent after it is delivered
    /// and more than an RTT plus the reordering window has passed since it was sent) it is
    /// lost: fast recovery starts now. Without this the one SACKed segment would stay
    /// below DupThresh and the holes would wait for the RTO.
    pub(super) fn tlp_on_sack(&mut self, now: Instant) {
        let Some(t) = self.tlp else {
            return;
        };
        if self.sack_ok
            && t.start.gt(self.snd_una)
            && self.sb.is_sacked(t.start)
            && self.snd_una.ge(self.last_recover)
        {
            self.tlp_backoff = 0;
            self.counters.rack_recoveries += 1;
            self.enter_recovery(now);
        }
    }

    /// An ACK moved SND.UNA to `ack`: the episode ends once the ACK covers the probe
    /// (RFC 8985 §7.4).
    #[inline]
    pub(super) fn tlp_on_new_ack(&mut self, now: Instant, ack: SeqNum) {
        let Some(t) = self.tlp else {
            return;
        };
        if ack.lt(t.end) {
            return;
        }
        if !t.retrans {
            // A probe of new data: any loss before it shows in the SACKs it drew.
            self.tlp = None;
        } else if ack.gt(t.end) {
            // Acknowledged beyond the probe and no D-SACK for it: the original was lost
            // and the probe repaired it. A loss is a congestion signal: reduce as a
            // recovery entered and left at once would.
            self.tlp = None;
            self.tlp_backoff = 0;
            self.counters.rack_recoveries += 1;
            self.cc.on_enter_recovery(now, t.flight);
            self.cc.on_exit_recovery(now, self.snd_max - self.snd_una);
            // As a new recovery or an RTO does, the reduction ends an undo episode still
            // open from an earlier recovery: the CC saved its state anew, and a late D-SACK
            // of that recovery must not undo this real loss's reduction.
            self.undo.active = false;
        }
        // ACK = TLP.end_seq: the original's ACK or the probe's; the probe's D-SACK, or an
        // ACK beyond, tells which.
    }
}
