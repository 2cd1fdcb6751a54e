//! Sender-side SACK scoreboard (RFC 6675, block processing per RFC 2018, D-SACK per RFC 2883).
//!
//! Contract:
//! - One per connection that negotiated SACK. The connection reports what it sent
//!   ([`Scoreboard::on_transmit`], [`Scoreboard::on_retransmit`]) and every ACK's cumulative
//!   acknowledgment and SACK blocks ([`Scoreboard::on_ack`], RFC 6675 `Update()`).
//! - It answers RFC 6675's queries: [`Scoreboard::is_lost`] (`IsLost`), [`Scoreboard::pipe`]
//!   (`SetPipe`), [`Scoreboard::next_seg`] (`NextSeg` rules 1-3) and
//!   [`Scoreboard::rescue_seg`] (rule 4), and keeps HighRxt/RescueRxt. The connection keeps
//!   RecoveryPoint, DupAcks, the send buffer and the receive window.
//! - "Retransmitted" marks are RFC 6675's single HighRxt pointer kept here: octets below
//!   [`Scoreboard::high_rxt`] count twice in `pipe`.
//! - Lost retransmissions (beyond RFC 6675, which can only leave them to the RTO): each
//!   retransmission is remembered with SND.MAX at the time it was sent, in at most
//!   `max_ranges` records. It is deemed lost when `IsLost`'s DupThresh criterion holds for
//!   SACKed data first sent after it (RFC 8985 §6.2's principle, with DupThresh standing in
//!   for the reordering window); `pipe` stops counting it and `next_seg` offers it again.
//! - DupThresh adapts to measured reordering (RFC 4653's idea, Linux `tcp_reordering`): the
//!   connection reports the extent of reordering a spurious recovery revealed
//!   ([`Scoreboard::note_reordering`]); the threshold [`Scoreboard::dup_thresh`] used by
//!   `IsLost` is raised to it, bounded by [`MAX_REORDERING`] and by the segments in flight (so
//!   a loss can always still be detected once everything above it is SACKed), and it falls
//!   back to the configured DupThresh once SND.MAX is SACKed (several holes).
//! - Sequence numbers are tracked as byte ranges; the sender's segmentation is unknown here,
//!   so "SACKed segments" in `IsLost` are counted as SMSS-sized chunks of each SACKed range
//!   (rounded up), and `NextSeg` returns up to SMSS bytes starting at the chosen octet.
//!
//! SACK blocks are peer-controlled, so (CVE-2019-11477/-11478 classes):
//! - blocks outside `[SND.UNA, SND.MAX]`, empty or inverted blocks are ignored and counted;
//!   only the first four blocks of an ACK are read;
//! - the number of disjoint SACKed ranges is capped (`max_ranges`): beyond it the highest range
//!   is forgotten (as if the receiver reneged, which RFC 2018 §8 permits, so it is always
//!   safe), so memory is bounded (`max_ranges` + 1 ranges and `max_ranges` + 2
//!   retransmission records, allocated on first use: a connection whose peer never SACKs
//!   holds none, issue 13) and every operation is O(max_ranges);
//! - nothing here moves SND.UNA backwards or past SND.MAX.

use crate::tcp::SeqNum;
use core::fmt;

/// Tunables of a [`Scoreboard`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoreboardConfig {
    /// Maximum number of disjoint SACKed ranges remembered. Default 64.
    pub max_ranges: usize,
    /// DupThresh (RFC 6675 §2, RFC 5681 §3.2). Default 3.
    pub dup_thresh: u32,
}

impl Default for ScoreboardConfig {
    fn default() -> Self {
        ScoreboardConfig {
            max_ranges: 64,
            dup_thresh: 3,
        }
    }
}

/// Why a [`ScoreboardConfig`] was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreboardConfigError {
    /// `max_ranges` must be in 1..=4096.
    MaxRanges,
    /// `dup_thresh` must be at least 1.
    DupThresh,
}

impl fmt::Display for ScoreboardConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ScoreboardConfigError::MaxRanges => "max_ranges must be between 1 and 4096",
            ScoreboardConfigError::DupThresh => "dup_thresh must be at least 1",
        })
    }
}

impl std::error::Error for ScoreboardConfigError {}

/// Largest DupThresh reordering can raise the threshold to (segments; Linux caps
/// `tcp_reordering` at 300 by default, a bound keeps the loss detection delay bounded).
pub const MAX_REORDERING: u32 = 127;

/// Largest outstanding window the scoreboard tracks (RFC 7323 §2.3: 2^30). Larger
/// transmissions are refused by `on_transmit`, keeping every comparison within 2^31.
const MAX_FLIGHT: u32 = 1 << 30;

/// What one ACK changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AckInfo {
    /// Bytes newly acknowledged by the cumulative ACK (SND.UNA advance).
    pub acked_bytes: u32,
    /// Bytes newly marked SACKed by this ACK's blocks.
    pub newly_sacked_bytes: u32,
    /// A D-SACK block (RFC 2883 §4): the first block, if it reports duplicate data.
    pub dsack: Option<(SeqNum, SeqNum)>,
    /// Blocks ignored as invalid (outside the window, empty, inverted, beyond the fourth).
    pub blocks_ignored: u8,
    /// SACKed ranges forgotten because `max_ranges` was exceeded.
    pub ranges_dropped: u32,
    /// The ACK acknowledged data never sent (SEG.ACK > SND.MAX): ignored entirely.
    pub ack_beyond_snd_max: bool,
}

/// What `NextSeg()` says to send next (RFC 6675 §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextSeg {
    /// Retransmit `len` (<= SMSS) bytes starting at `start` (rules 1 and 3). After sending,
    /// call [`Scoreboard::on_retransmit`].
    Retransmit {
        /// First octet.
        start: SeqNum,
        /// Length in bytes, at most SMSS, never covering SACKed data.
        len: u32,
    },
    /// Send up to SMSS bytes of new data at SND.MAX (rule 2).
    NewData,
}

/// Counters of peer misbehaviour and capping, for stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScoreboardStats {
    /// Invalid SACK blocks ignored.
    pub blocks_ignored: u64,
    /// D-SACK blocks seen.
    pub dsacks: u64,
    /// Ranges forgotten because of `max_ranges`.
    pub ranges_dropped: u64,
    /// ACKs beyond SND.MAX ignored.
    pub acks_beyond_snd_max: u64,
    /// Retransmissions below HighRxt: lost retransmissions sent again.
    pub lost_retransmissions: u64,
    /// Retransmission records forgotten because `max_ranges` was exceeded (those
    /// retransmissions are left to the RTO if lost, as in plain RFC 6675).
    pub rxt_records_dropped: u64,
    /// Times the reordering estimate was raised by a spurious recovery.
    pub reordering_raised: u64,
    /// Times the reordering estimate was reset because it delayed loss detection to an RTO.
    pub reordering_reset: u64,
}

/// Octets `[start, end)` were last retransmitted when SND.MAX was `sent_max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RxtRecord {
    start: SeqNum,
    end: SeqNum,
    sent_max: SeqNum,
}

/// RFC 6675 sender scoreboard. `#[repr(C)]`: what a cumulative ACK with SACK idle reads
/// (`on_ack`'s early return: both vectors' lengths, SND.UNA, SND.MAX, HighRxt) comes first,
/// in 64 bytes; the configuration and statistics last.
#[derive(Debug, Clone)]
#[repr(C)]
pub struct Scoreboard {
    /// Disjoint, non-adjacent SACKed ranges [start, end) inside (snd_una, snd_max], sorted.
    ranges: Vec<(SeqNum, SeqNum)>,
    /// Retransmissions of this recovery: disjoint, sorted, inside [snd_una, high_rxt).
    rxt: Vec<RxtRecord>,
    /// HighACK + 1 in RFC 6675 terms: the first unacknowledged octet.
    snd_una: SeqNum,
    /// HighData + 1: the octet after the highest transmitted.
    snd_max: SeqNum,
    /// HighRxt + 1: octets below this were retransmitted in the current recovery.
    high_rxt: SeqNum,
    sacked: u32,
    mss: u32,
    /// Reordering estimate in segments: DupThresh before the flight bound, at least
    /// `cfg.dup_thresh`, at most [`MAX_REORDERING`].
    reordering: u32,
    rescue_rxt: Option<SeqNum>,
    cfg: ScoreboardConfig,
    stats: ScoreboardStats,
}

/// Room for one more element in `v`: storage grows by doubling (from 4) but not past `cap`
/// elements, where `Vec`'s own growth would double past the bound.
fn reserve_one<T>(v: &mut Vec<T>, cap: usize) {
    if v.len() == v.capacity() {
        let want = (v.capacity() * 2).max(4).min(cap).max(v.len() + 1);
        v.reserve_exact(want - v.len());
    }
}

impl Scoreboard {
    /// A scoreboard for a connection whose first unacknowledged octet is `snd_una` (ISS + 1
    /// once the SYN is acknowledged) and SMSS `mss`.
    pub fn new(
        snd_una: SeqNum,
        mss: u32,
        cfg: ScoreboardConfig,
    ) -> Result<Self, ScoreboardConfigError> {
        if cfg.max_ranges == 0 || cfg.max_ranges > 4096 {
            return Err(ScoreboardConfigError::MaxRanges);
        }
        if cfg.dup_thresh == 0 {
            return Err(ScoreboardConfigError::DupThresh);
        }
        Ok(Self::build(snd_una, mss, cfg))
    }

    /// A scoreboard with the default configuration.
    pub fn with_defaults(snd_una: SeqNum, mss: u32) -> Self {
        Self::build(snd_una, mss, ScoreboardConfig::default())
    }

    fn build(snd_una: SeqNum, mss: u32, cfg: ScoreboardConfig) -> Self {
        Scoreboard {
            cfg,
            mss: mss.max(1),
            snd_una,
            snd_max: snd_una,
            // Allocated on first use, up to `max_ranges + 1` (`reserve_one`).
            ranges: Vec::new(),
            sacked: 0,
            high_rxt: snd_una,
            rescue_rxt: None,
            // Allocated on first use, up to `max_ranges + 2` (`reserve_one`).
            rxt: Vec::new(),
            reordering: cfg.dup_thresh,
            stats: ScoreboardStats::default(),
        }
    }

    /// Change SMSS (used by `IsLost` and `NextSeg`).
    pub fn set_mss(&mut self, mss: u32) {
        self.mss = mss.max(1);
    }

    /// The DupThresh in force: the reordering estimate, but never more than one less than the
    /// segments in flight (RFC 4653 also ties its threshold to the flight: with all data above
    /// a loss SACKed, waiting longer only leaves it to the RTO),
    /// and never less than the configured DupThresh (RFC 6675 §2, RFC 5681 §3.2).
    pub fn dup_thresh(&self) -> u32 {
        if self.reordering <= self.cfg.dup_thresh {
            return self.cfg.dup_thresh;
        }
        // RFC 4653 (DupThresh raised for reordering) waits for data sent later to be SACKed.
        // Once SND.MAX itself is SACKed none can come; with two or more holes the flight bound
        // below is never met and only the RTO would repair them, so the configured DupThresh
        // (RFC 6675 §2) applies.
        if self.highest_sacked() == Some(self.snd_max) {
            return self.cfg.dup_thresh;
        }
        let flight_segs = self.off(self.snd_max).div_ceil(self.mss);
        self.reordering
            .min(flight_segs.saturating_sub(1))
            .max(self.cfg.dup_thresh)
    }

    /// The reordering estimate (segments), before the flight bound.
    pub fn reordering(&self) -> u32 {
        self.reordering
    }

    /// A recovery proved spurious (RFC 3708 D-SACK detection): when the octet deemed lost
    /// arrived, the peer held data up to `extent` bytes from its start. Raise the reordering
    /// estimate so that much reordering no longer looks like a loss (RFC 4653's adaptation of
    /// DupThresh): DupThresh becomes the extent in SMSS-sized segments plus one, as Linux's
    /// `tcp_check_sack_reordering` measures it (the extent spans the late segment and its
    /// overtakers, so this leaves one segment of margin), bounded by [`MAX_REORDERING`].
    /// Returns the new estimate.
    pub fn note_reordering(&mut self, extent: u32) -> u32 {
        let segs = u64::from(extent).div_ceil(u64::from(self.mss)) + 1;
        let want = segs.min(u64::from(MAX_REORDERING)) as u32;
        if want > self.reordering {
            self.reordering = want;
            self.stats.reordering_raised += 1;
        }
        self.reordering
    }

    /// A retransmission timeout outside recovery while at least the configured DupThresh of
    /// segments were SACKed: the raised threshold held back a fast retransmit the default
    /// would have sent, so the estimate is reset (Linux `tcp_enter_loss`).
    pub fn on_rto_outside_recovery(&mut self) {
        if self.reordering > self.cfg.dup_thresh && self.sacked_segments() >= self.cfg.dup_thresh {
            self.reordering = self.cfg.dup_thresh;
            self.stats.reordering_reset += 1;
        }
    }

    /// SACKed data counted as RFC 6675 §4 counts it: SMSS-sized chunks of each range.
    fn sacked_segments(&self) -> u32 {
        self.ranges
            .iter()
            .map(|&(s, e)| (e - s).div_ceil(self.mss))
            .fold(0u32, u32::saturating_add)
    }

    /// Offset of `s` from SND.UNA. Meaningful for `s` in [snd_una, snd_una + 2^31).
    fn off(&self, s: SeqNum) -> u32 {
        s - self.snd_una
    }

    /// `s` lies in [snd_una, snd_max].
    fn in_window(&self, s: SeqNum) -> bool {
        s.ge(self.snd_una) && s.le(self.snd_max)
    }

    /// First unacknowledged octet (HighACK + 1).
    pub fn snd_una(&self) -> SeqNum {
        self.snd_una
    }

    /// Octet after the highest transmitted (HighData + 1).
    pub fn snd_max(&self) -> SeqNum {
        self.snd_max
    }

    /// Total SACKed bytes above SND.UNA.
    pub fn sacked_bytes(&self) -> u32 {
        self.sacked
    }

    /// The SACKed ranges `[start, end)`, ascending.
    pub fn ranges(&self) -> &[(SeqNum, SeqNum)] {
        &self.ranges
    }

    /// The octet after the highest SACKed one.
    pub fn highest_sacked(&self) -> Option<SeqNum> {
        self.ranges.last().map(|&(_, e)| e)
    }

    /// HighRxt + 1: octets below it were retransmitted in this recovery.
    pub fn high_rxt(&self) -> SeqNum {
        self.high_rxt
    }

    /// RescueRxt, if a rescue retransmission happened in this recovery.
    pub fn rescue_rxt(&self) -> Option<SeqNum> {
        self.rescue_rxt
    }

    /// Counters.
    pub fn stats(&self) -> ScoreboardStats {
        self.stats
    }

    /// Whether octet `s` is SACKed.
    pub fn is_sacked(&self, s: SeqNum) -> bool {
        self.in_window(s) && self.ranges.iter().any(|&(a, b)| s.ge(a) && s.lt(b))
    }

    /// SACKed bytes within `[start, end)` (clipped to the window).
    pub fn sacked_in(&self, start: SeqNum, end: SeqNum) -> u32 {
        let flight = self.off(self.snd_max);
        let clip = |s: SeqNum| {
            if s.lt(self.snd_una) {
                0
            } else {
                self.off(s).min(flight)
            }
        };
        let (a, b) = (clip(start), clip(end));
        if a >= b {
            return 0;
        }
        self.sacked_in_off(a, b)
    }

    fn sacked_in_off(&self, a: u32, b: u32) -> u32 {
        self.ranges
            .iter()
            .map(|&(s, e)| {
                let (s, e) = (self.off(s).max(a), self.off(e).min(b));
                e.saturating_sub(s)
            })
            .sum()
    }

    /// Data up to (excluding) `end` has been transmitted (RFC 6675 §5 (C.3): HighData is
    /// updated). Earlier or absurd values (more than 2^30 beyond SND.UNA) are ignored.
    pub fn on_transmit(&mut self, end: SeqNum) {
        if end.gt(self.snd_max) && self.off(end) <= MAX_FLIGHT {
            self.snd_max = end;
        }
    }

    /// `len` bytes at `start` were retransmitted (NextSeg rules 1 and 3, or RTO recovery):
    /// RFC 6675 §5 (C.2): HighRxt is set to the highest retransmitted octet. Do not call for a
    /// rescue retransmission (rule 4: HighRxt MUST NOT be updated).
    pub fn on_retransmit(&mut self, start: SeqNum, len: u32) {
        let end = start + len;
        if len == 0 || !start.ge(self.snd_una) || !end.le(self.snd_max) {
            return;
        }
        if start.lt(self.high_rxt) {
            self.stats.lost_retransmissions += 1;
        }
        if end.gt(self.high_rxt) {
            self.high_rxt = end;
        }
        self.record_rxt(start, end);
    }

    /// Remember that `[start, end)` (inside the window) was retransmitted now.
    fn record_rxt(&mut self, start: SeqNum, end: SeqNum) {
        let (lo, hi) = (self.off(start), self.off(end));
        let una = self.snd_una;
        let off = |s: SeqNum| s - una;
        // A record strictly containing the new one keeps its part above it separately.
        let mut upper = None;
        if let Some(r) = self
            .rxt
            .iter()
            .find(|r| off(r.start) < lo && off(r.end) > hi)
        {
            upper = Some(RxtRecord { start: end, ..*r });
        }
        // Clip or remove the overlapped records.
        self.rxt.retain_mut(|r| {
            let (a, b) = (off(r.start), off(r.end));
            if b <= lo || a >= hi {
                return true;
            }
            if a < lo {
                r.end = start;
                return true;
            }
            if b > hi {
                r.start = end;
                return true;
            }
            false
        });
        let new = RxtRecord {
            start,
            end,
            sent_max: self.snd_max,
        };
        for rec in [Some(new), upper].into_iter().flatten() {
            let at = self.rxt.partition_point(|r| off(r.start) < off(rec.start));
            // +2: a retransmission inside a record splits it before the cap is applied.
            reserve_one(&mut self.rxt, self.cfg.max_ranges + 2);
            self.rxt.insert(at, rec);
        }
        // Neighbours sent at the same SND.MAX are one record.
        let mut i = 1;
        while i < self.rxt.len() {
            let (p, r) = (self.rxt[i - 1], self.rxt[i]);
            if p.end == r.start && p.sent_max == r.sent_max {
                self.rxt[i - 1].end = r.end;
                self.rxt.remove(i);
            } else {
                i += 1;
            }
        }
        while self.rxt.len() > self.cfg.max_ranges {
            // Forget the highest: recovery repairs from SND.UNA upwards, and a forgotten
            // retransmission is only left to the RTO, as plain RFC 6675 would.
            self.rxt.pop();
            self.stats.rxt_records_dropped += 1;
        }
    }

    fn trim_rxt(&mut self, ack: SeqNum) {
        self.rxt.retain_mut(|r| {
            if r.end.le(ack) {
                return false;
            }
            if r.start.lt(ack) {
                r.start = ack;
            }
            true
        });
    }

    /// Loss recovery begins (RFC 6675 §5 step 4): the retransmission pointers restart at
    /// SND.UNA. Per step (4.3) the caller then retransmits the first segment and calls
    /// [`Scoreboard::on_retransmit`] and [`Scoreboard::set_rescue_rxt`] with its end.
    pub fn on_enter_recovery(&mut self) {
        self.high_rxt = self.snd_una;
        self.rescue_rxt = None;
        self.rxt.clear();
    }

    /// Record RescueRxt (RFC 6675 §4 rule 4: RescueRxt = RecoveryPoint; §5 step 4.3).
    pub fn set_rescue_rxt(&mut self, seq: SeqNum) {
        self.rescue_rxt = Some(seq);
    }

    /// A retransmission timeout (RFC 6675 §5.1): retransmission restarts at SND.UNA. SACK
    /// information is kept so the RTO recovery can skip SACKed data, as §5.1 recommends;
    /// call [`Scoreboard::clear_sacks`] too for RFC 2018 §8's stricter advice.
    pub fn on_rto(&mut self) {
        self.high_rxt = self.snd_una;
        self.rescue_rxt = None;
        self.rxt.clear();
    }

    /// Forget all SACK information (RFC 2018 §8: after a timeout the receiver may have
    /// reneged).
    pub fn clear_sacks(&mut self) {
        self.ranges.clear();
        self.sacked = 0;
    }

    /// RFC 6675 `Update()`: process one ACK's cumulative acknowledgment and SACK blocks.
    #[inline]
    pub fn on_ack(&mut self, ack: SeqNum, blocks: &[(SeqNum, SeqNum)]) -> AckInfo {
        // RFC 9293 §3.10.7.4: an ACK for data not yet sent is ignored (the connection sends
        // an ACK); its SACK blocks cannot be trusted either.
        if !ack.gt(self.snd_max) && blocks.is_empty() && self.ranges.is_empty() {
            // SACK idle (the common case, inlined into the caller): only the cumulative ACK
            // moves. Same result as the general path with nothing to trim and no block to
            // read.
            let mut info = AckInfo::default();
            if ack.gt(self.snd_una) {
                info.acked_bytes = ack - self.snd_una;
                self.snd_una = ack;
                if self.high_rxt.lt(ack) {
                    self.high_rxt = ack;
                }
                if !self.rxt.is_empty() {
                    self.trim_rxt(ack);
                }
            }
            return info;
        }
        self.on_ack_general(ack, blocks)
    }

    /// [`on_ack`](Self::on_ack) with SACK blocks or ranges held, or an ACK beyond SND.MAX.
    #[inline(never)]
    fn on_ack_general(&mut self, ack: SeqNum, blocks: &[(SeqNum, SeqNum)]) -> AckInfo {
        let mut info = AckInfo::default();
        if ack.gt(self.snd_max) {
            info.ack_beyond_snd_max = true;
            self.stats.acks_beyond_snd_max += 1;
            return info;
        }
        if ack.gt(self.snd_una) {
            info.acked_bytes = ack - self.snd_una;
            self.advance_una(ack);
        }
        // RFC 2018 §3: at most 4 blocks fit in the option; read no more.
        let ignored_tail = blocks.len().saturating_sub(4);
        let blocks = &blocks[..blocks.len().min(4)];
        let mut ignored = ignored_tail as u32;
        let before = self.sacked;
        for (i, &(l, r)) in blocks.iter().enumerate() {
            if i == 0 && self.is_dsack(ack, l, r, blocks.get(1).copied()) {
                info.dsack = Some((l, r));
                self.stats.dsacks += 1;
                continue;
            }
            // RFC 2018 §3: a block is [left edge, right edge); RFC 2018 §5 / RFC 6675 §4:
            // only blocks within the outstanding window carry information.
            if !l.lt(r) || r.gt(self.snd_max) || !r.gt(self.snd_una) || (r - l) > MAX_FLIGHT {
                ignored += 1;
                continue;
            }
            let l = l.max(self.snd_una);
            info.ranges_dropped += self.insert(l, r);
        }
        info.newly_sacked_bytes = self.sacked.saturating_sub(before);
        info.blocks_ignored = ignored.min(255) as u8;
        self.stats.blocks_ignored += u64::from(ignored);
        self.stats.ranges_dropped += u64::from(info.ranges_dropped);
        info
    }

    /// RFC 2883 §4: the first block is a D-SACK if it is covered by the cumulative ACK, or
    /// contained in the second block. Implausible D-SACKs (inverted, larger than 2^30, beyond
    /// SND.MAX or more than 2^30 below SND.UNA) are not reported.
    fn is_dsack(
        &self,
        ack: SeqNum,
        l: SeqNum,
        r: SeqNum,
        second: Option<(SeqNum, SeqNum)>,
    ) -> bool {
        if !l.lt(r) || (r - l) > MAX_FLIGHT || r.gt(self.snd_max) {
            return false;
        }
        if l.lt(self.snd_una) && (self.snd_una - l) > MAX_FLIGHT {
            return false;
        }
        // Covered by *this* ACK's cumulative acknowledgment, not the current SND.UNA: an
        // older, reordered ACK's ordinary SACK block lies below SND.UNA too (found by the
        // kernel interop run: 77,067 phantom D-SACKs against the kernel's 10,468).
        let below_ack = r.le(ack);
        let inside_second = second.is_some_and(|(l2, r2)| l2.lt(r2) && l.ge(l2) && r.le(r2));
        below_ack || inside_second
    }

    fn advance_una(&mut self, ack: SeqNum) {
        self.snd_una = ack;
        // Drop or trim ranges now below SND.UNA (one pass, order kept).
        let mut removed = 0u32;
        self.ranges.retain_mut(|(s, e)| {
            if (*e).le(ack) {
                removed += *e - *s;
                false
            } else {
                if (*s).lt(ack) {
                    removed += ack - *s;
                    *s = ack;
                }
                true
            }
        });
        self.sacked -= removed;
        if self.high_rxt.lt(ack) {
            self.high_rxt = ack;
        }
        self.trim_rxt(ack);
    }

    /// Mark [l, r) SACKed (both within the window, l < r); returns ranges dropped by the cap.
    fn insert(&mut self, l: SeqNum, r: SeqNum) -> u32 {
        let (lo, hi) = (self.off(l), self.off(r));
        // First range that ends at or after lo (touching ranges merge).
        let first = self
            .ranges
            .iter()
            .position(|&(_, e)| self.off(e) >= lo)
            .unwrap_or(self.ranges.len());
        let mut new_lo = lo;
        let mut new_hi = hi;
        let mut last = first;
        let mut covered = 0u32;
        while last < self.ranges.len() {
            let (s, e) = self.ranges[last];
            let (so, eo) = (self.off(s), self.off(e));
            if so > hi {
                break;
            }
            new_lo = new_lo.min(so);
            new_hi = new_hi.max(eo);
            covered += eo - so;
            last += 1;
        }
        let merged = (self.snd_una + new_lo, self.snd_una + new_hi);
        self.sacked = self.sacked - covered + (new_hi - new_lo);
        // +1: insertion may briefly exceed the cap before the highest range is dropped.
        reserve_one(&mut self.ranges, self.cfg.max_ranges + 1);
        self.ranges.splice(first..last, core::iter::once(merged));
        let mut dropped = 0;
        while self.ranges.len() > self.cfg.max_ranges {
            // Forget the highest range: recovery proceeds from SND.UNA upwards and the
            // receiver repeats its most recent blocks (RFC 2018 §4).
            if let Some((s, e)) = self.ranges.pop() {
                self.sacked -= e - s;
                dropped += 1;
            }
        }
        dropped
    }

    /// The lowest octet offset at or above which unSACKed data is *not* lost: an unSACKed
    /// octet is lost (IsLost) iff its offset is below this.
    fn lost_boundary(&self) -> u32 {
        let dup_thresh = self.dup_thresh();
        let thresh_bytes = u64::from(dup_thresh - 1) * u64::from(self.mss);
        let mut bytes = 0u64;
        let mut segs = 0u64;
        for &(s, e) in self.ranges.iter().rev() {
            let len = u64::from(e - s);
            bytes += len;
            segs += len.div_ceil(u64::from(self.mss));
            // RFC 6675 §4 IsLost: DupThresh discontiguous SACKed sequences, or more than
            // (DupThresh - 1) * SMSS SACKed bytes, above the octet.
            if segs >= u64::from(dup_thresh) || bytes > thresh_bytes {
                return self.off(s);
            }
        }
        0
    }

    /// RFC 6675 §4 IsLost's criterion for the data at or above offset `from`: DupThresh
    /// discontiguous SACKed sequences or more than (DupThresh - 1) * SMSS SACKed bytes.
    fn sacked_beyond_thresh(&self, from: u32) -> bool {
        let dup_thresh = self.dup_thresh();
        let thresh_bytes = u64::from(dup_thresh - 1) * u64::from(self.mss);
        let mut bytes = 0u64;
        let mut segs = 0u64;
        for &(s, e) in self.ranges.iter().rev() {
            let (so, eo) = (self.off(s).max(from), self.off(e));
            if eo <= so {
                break;
            }
            let len = u64::from(eo - so);
            bytes += len;
            segs += len.div_ceil(u64::from(self.mss));
            if segs >= u64::from(dup_thresh) || bytes > thresh_bytes {
                return true;
            }
        }
        false
    }

    /// RFC 8985 §6.2 (a segment is lost when data sent after it is delivered), with RFC 6675
    /// §4's DupThresh allowance for reordering: a retransmission is lost when IsLost's
    /// criterion holds for the SACKed data above SND.MAX at the time it was sent, all of
    /// which was first sent after it.
    fn rxt_lost(&self, r: &RxtRecord) -> bool {
        self.sacked_beyond_thresh(self.off(r.sent_max))
    }

    /// Unacknowledged octets that were retransmitted in this recovery and whose last
    /// retransmission is deemed lost (see `Scoreboard::rxt_lost`).
    pub fn is_retransmission_lost(&self, seq: SeqNum) -> bool {
        if !seq.ge(self.snd_una) || !seq.lt(self.snd_max) || self.is_sacked(seq) {
            return false;
        }
        self.rxt
            .iter()
            .any(|r| seq.ge(r.start) && seq.lt(r.end) && self.rxt_lost(r))
    }

    /// RFC 6675 §4 `IsLost(seq)`: whether unSACKed outstanding octet `seq` is deemed lost.
    /// SACKed or non-outstanding octets are never lost.
    pub fn is_lost(&self, seq: SeqNum) -> bool {
        if !seq.ge(self.snd_una) || !seq.lt(self.snd_max) || self.is_sacked(seq) {
            return false;
        }
        self.off(seq) < self.lost_boundary()
    }

    /// RFC 6675 §4 `SetPipe()`: octets in flight. Every unSACKed outstanding octet counts once
    /// if not lost, and once more if it was retransmitted (below HighRxt + 1).
    pub fn pipe(&self) -> u32 {
        let flight = self.off(self.snd_max);
        let lost = self.lost_boundary().min(flight);
        let rxt = self.off(self.high_rxt).min(flight);
        let unsacked = |a: u32, b: u32| (b - a) - self.sacked_in_off(a, b);
        let mut pipe = unsacked(lost, flight) + unsacked(0, rxt);
        if lost > 0 {
            // A lost retransmission has left the network too (its original is below the
            // lost boundary, so it counted once, as a retransmission).
            for r in self.rxt.iter().filter(|r| self.rxt_lost(r)) {
                let (a, b) = (self.off(r.start), self.off(r.end).min(rxt));
                if a < b {
                    pipe = pipe.saturating_sub(unsacked(a, b));
                }
            }
        }
        pipe
    }

    /// The first unSACKed octet offset at or after `from` and below the highest SACKed octet,
    /// with the end of its hole.
    fn first_hole_from(&self, from: u32) -> Option<(u32, u32)> {
        let mut prev_end = 0u32;
        for &(s, e) in &self.ranges {
            let (so, eo) = (self.off(s), self.off(e));
            let start = prev_end.max(from);
            if start < so {
                return Some((start, so));
            }
            prev_end = eo;
        }
        None
    }

    /// RFC 6675 §4 `NextSeg()` rules 1-3. `can_send_new` is rule 2's condition (unsent data
    /// exists and the receive window allows it), which only the connection knows. `None`
    /// means rules 1-3 failed; the caller may then try [`Scoreboard::rescue_seg`] (rule 4).
    pub fn next_seg(&self, can_send_new: bool) -> Option<NextSeg> {
        // Before rule 1: a lost retransmission (below HighRxt) is sent again, lowest first
        // (RFC 8985 §6.2; RFC 6675 alone would wait for the RTO).
        if !self.rxt.is_empty() && self.lost_boundary() > 0 {
            for r in self.rxt.iter().filter(|r| self.rxt_lost(r)) {
                let end = self.off(r.end);
                if let Some((s, e)) = self.first_hole_from(self.off(r.start)) {
                    if s < end {
                        return Some(self.retransmit(s, e.min(end)));
                    }
                }
            }
        }
        let from = self.off(self.high_rxt);
        let hole = self.first_hole_from(from);
        if let Some((s, e)) = hole {
            // Rule 1: the smallest unSACKed S2 > HighRxt, below the highest SACKed octet, with
            // IsLost(S2).
            if s < self.lost_boundary() {
                return Some(self.retransmit(s, e));
            }
        }
        // Rule 2: new data if available and the window allows.
        if can_send_new {
            return Some(NextSeg::NewData);
        }
        // Rule 3: the same candidate without the loss criterion (1.c).
        hole.map(|(s, e)| self.retransmit(s, e))
    }

    fn retransmit(&self, s: u32, e: u32) -> NextSeg {
        NextSeg::Retransmit {
            start: self.snd_una + s,
            len: (e - s).min(self.mss),
        }
    }

    /// RFC 6675 §4 `NextSeg()` rule 4, the rescue retransmission: when rules 1-3 fail, once per
    /// recovery (HighACK > RescueRxt, or RescueRxt undefined), one segment of up to SMSS that
    /// includes the highest outstanding unSACKed octet, unless this recovery already
    /// retransmitted that octet (it lies below HighRxt). The caller sends it, then calls
    /// [`Scoreboard::set_rescue_rxt`] with RecoveryPoint, and must not call `on_retransmit`.
    pub fn rescue_seg(&self) -> Option<(SeqNum, u32)> {
        if let Some(r) = self.rescue_rxt {
            if !self.snd_una.gt(r) {
                return None;
            }
        }
        let flight = self.off(self.snd_max);
        // Highest unSACKed hole: above the top range, or the gap below it.
        let mut hole = None;
        let mut prev_end = 0u32;
        for &(s, e) in &self.ranges {
            let so = self.off(s);
            if prev_end < so {
                hole = Some((prev_end, so));
            }
            prev_end = self.off(e);
        }
        if prev_end < flight {
            hole = Some((prev_end, flight));
        }
        let (lo, hi) = hole?;
        // Already retransmitted in this recovery (the octet lies below HighRxt): rule 3's
        // ground, and sending it again at once would only duplicate that retransmission.
        // The rescue is for a tail no retransmission has reached.
        if hi <= self.off(self.high_rxt) {
            return None;
        }
        let start = hi.saturating_sub(self.mss).max(lo);
        Some((self.snd_una + start, hi - start))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MSS: u32 = 100;

    fn sb(una: u32, sent: u32) -> Scoreboard {
        let mut s = Scoreboard::with_defaults(SeqNum(una), MSS);
        s.on_transmit(SeqNum(una) + sent);
        s
    }

    fn blk(a: u32, b: u32) -> (SeqNum, SeqNum) {
        (SeqNum(a), SeqNum(b))
    }

    #[test]
    fn rfc2018_3_blocks_mark_ranges_and_merge() {
        let mut s = sb(1000, 1000);
        let i = s.on_ack(SeqNum(1000), &[blk(1200, 1300)]);
        assert_eq!(i.newly_sacked_bytes, 100);
        s.on_ack(SeqNum(1000), &[blk(1400, 1500), blk(1200, 1300)]);
        assert_eq!(s.ranges(), &[blk(1200, 1300), blk(1400, 1500)]);
        // Adjacent and overlapping blocks merge.
        let i = s.on_ack(SeqNum(1000), &[blk(1300, 1450)]);
        assert_eq!(i.newly_sacked_bytes, 100);
        assert_eq!(s.ranges(), &[blk(1200, 1500)]);
        assert_eq!(s.sacked_bytes(), 300);
        assert!(s.is_sacked(SeqNum(1499)) && !s.is_sacked(SeqNum(1500)));
    }

    #[test]
    fn rfc6675_4_update_cumulative_ack_trims_scoreboard() {
        let mut s = sb(1000, 1000);
        s.on_ack(SeqNum(1000), &[blk(1200, 1300), blk(1400, 1500)]);
        let i = s.on_ack(SeqNum(1250), &[]);
        assert_eq!(i.acked_bytes, 250);
        assert_eq!(s.ranges(), &[blk(1250, 1300), blk(1400, 1500)]);
        assert_eq!(s.sacked_bytes(), 150);
        s.on_ack(SeqNum(1500), &[]);
        assert!(s.ranges().is_empty());
        assert_eq!(s.sacked_bytes(), 0);
    }

    #[test]
    fn sacked_in_clips_to_window() {
        let mut s = sb(1000, 1000);
        s.on_ack(SeqNum(1000), &[blk(1200, 1300), blk(1400, 1500)]);
        assert_eq!(s.sacked_in(SeqNum(900), SeqNum(1250)), 50);
        assert_eq!(s.sacked_in(SeqNum(1250), SeqNum(5000)), 150);
        assert_eq!(s.sacked_in(SeqNum(1300), SeqNum(1200)), 0);
        assert_eq!(s.sacked_in(SeqNum(0), SeqNum(10)), 0);
    }

    #[test]
    fn rfc2018_invalid_blocks_are_ignored_and_counted() {
        let mut s = sb(1000, 1000);
        let i = s.on_ack(
            SeqNum(1000),
            &[
                blk(1300, 1200),           // inverted
                blk(1500, 2500),           // beyond SND.MAX
                blk(3_000_000, 3_000_100), // far away
                blk(1100, 1100),           // empty
                blk(1200, 1300),           // fifth block: never read
            ],
        );
        assert_eq!(i.blocks_ignored, 5);
        assert_eq!(s.sacked_bytes(), 0);
        assert_eq!(s.stats().blocks_ignored, 5);
        // A block straddling SND.UNA is clipped to it.
        s.on_ack(SeqNum(1000), &[blk(1050, 1100), blk(900, 1020)]);
        assert_eq!(s.ranges(), &[blk(1000, 1020), blk(1050, 1100)]);
    }

    #[test]
    fn rfc9293_3_10_7_4_ack_beyond_snd_max_ignored_and_una_never_moves_back() {
        let mut s = sb(1000, 1000);
        let i = s.on_ack(SeqNum(2001), &[blk(1200, 1300)]);
        assert!(i.ack_beyond_snd_max);
        assert_eq!(s.snd_una(), SeqNum(1000));
        assert_eq!(s.sacked_bytes(), 0);
        s.on_ack(SeqNum(1500), &[]);
        let i = s.on_ack(SeqNum(1200), &[blk(1600, 1700)]);
        assert_eq!(i.acked_bytes, 0);
        assert_eq!(s.snd_una(), SeqNum(1500));
        // SACK info on an old ACK is still used.
        assert_eq!(s.sacked_bytes(), 100);
    }

    #[test]
    fn rfc2883_4_dsack_below_ack_or_inside_second_block() {
        let mut s = sb(1000, 1000);
        s.on_ack(SeqNum(1500), &[]);
        let i = s.on_ack(SeqNum(1500), &[blk(1100, 1200)]);
        assert_eq!(i.dsack, Some(blk(1100, 1200)));
        assert_eq!(s.sacked_bytes(), 0);
        let i = s.on_ack(SeqNum(1500), &[blk(1700, 1800), blk(1600, 1900)]);
        assert_eq!(i.dsack, Some(blk(1700, 1800)));
        assert_eq!(s.ranges(), &[blk(1600, 1900)]);
        // Only the first block can be a D-SACK.
        let i = s.on_ack(SeqNum(1500), &[blk(1950, 1960), blk(1100, 1200)]);
        assert_eq!(i.dsack, None);
        assert_eq!(i.blocks_ignored, 1);
        // Implausible D-SACKs are not reported.
        let i = s.on_ack(SeqNum(1500), &[blk(1500u32.wrapping_sub(1 << 31), 1400)]);
        assert_eq!(i.dsack, None);
        assert_eq!(s.stats().dsacks, 2);
    }

    #[test]
    fn rfc6675_4_islost_by_dupthresh_segments_or_bytes() {
        let mut s = sb(0, 1000);
        // Two SACKed segments above 0: not lost (DupThresh = 3).
        s.on_ack(SeqNum(0), &[blk(100, 200), blk(300, 400)]);
        assert!(!s.is_lost(SeqNum(0)));
        // Third discontiguous SACKed segment: octets below the lowest SACKed one are lost.
        s.on_ack(SeqNum(0), &[blk(500, 600)]);
        assert!(s.is_lost(SeqNum(0)) && s.is_lost(SeqNum(99)));
        assert!(
            !s.is_lost(SeqNum(200)),
            "only two SACKed segments above 200"
        );
        assert!(!s.is_lost(SeqNum(150)), "SACKed octets are never lost");
        // Bytes criterion: more than (DupThresh-1)*SMSS = 200 SACKed bytes above.
        let mut b = sb(0, 1000);
        b.on_ack(SeqNum(0), &[blk(100, 301)]);
        assert!(b.is_lost(SeqNum(50)));
        let mut c = sb(0, 1000);
        c.on_ack(SeqNum(0), &[blk(100, 300)]);
        assert!(
            !c.is_lost(SeqNum(50)),
            "exactly 200 bytes, 2 segments: not lost"
        );
        assert!(!c.is_lost(SeqNum(2000)), "not outstanding");
    }

    #[test]
    fn rfc6675_4_setpipe_counts_unlost_and_retransmitted() {
        let mut s = sb(0, 1000);
        s.on_ack(SeqNum(0), &[blk(100, 200), blk(300, 400), blk(500, 600)]);
        // Lost: [0,100). Not lost unSACKed: [200,300) + [400,500) + [600,1000) = 600.
        assert_eq!(s.pipe(), 600);
        s.on_enter_recovery();
        s.on_retransmit(SeqNum(0), 100);
        assert_eq!(s.high_rxt(), SeqNum(100));
        // The retransmission is in flight once.
        assert_eq!(s.pipe(), 700);
    }

    #[test]
    fn rfc6675_4_nextseg_rules_1_to_3() {
        let mut s = sb(0, 1000);
        s.on_ack(SeqNum(0), &[blk(100, 200), blk(300, 400), blk(500, 600)]);
        s.on_enter_recovery();
        // Rule 1: lost hole at 0.
        assert_eq!(
            s.next_seg(true),
            Some(NextSeg::Retransmit {
                start: SeqNum(0),
                len: 100
            })
        );
        s.on_retransmit(SeqNum(0), 100);
        // Hole [200,300) is not lost (only 2 SACKed segments above): rule 2 if possible...
        assert_eq!(s.next_seg(true), Some(NextSeg::NewData));
        // ...else rule 3.
        assert_eq!(
            s.next_seg(false),
            Some(NextSeg::Retransmit {
                start: SeqNum(200),
                len: 100
            })
        );
        s.on_retransmit(SeqNum(200), 100);
        s.on_retransmit(SeqNum(400), 100);
        // Nothing below the highest SACK remains: rules 1-3 fail without new data.
        assert_eq!(s.next_seg(false), None);
    }

    #[test]
    fn rfc8985_6_2_retransmission_lost_when_later_data_is_sacked_beyond_dupthresh() {
        let mut s = sb(0, 1000);
        s.on_ack(SeqNum(0), &[blk(100, 400)]);
        s.on_enter_recovery();
        s.on_retransmit(SeqNum(0), 100);
        assert_eq!(
            s.pipe(),
            700,
            "[0,100) once as a retransmission, [400,1000)"
        );
        s.on_transmit(SeqNum(1500));
        // Two segments sent after the retransmission SACKed: within the reordering allowance.
        s.on_ack(SeqNum(0), &[blk(1000, 1100), blk(1200, 1300)]);
        assert!(!s.is_retransmission_lost(SeqNum(0)));
        // The third (DupThresh): the retransmission is lost, leaves pipe, and is offered again
        // before anything above HighRxt.
        let pipe = s.pipe();
        s.on_ack(SeqNum(0), &[blk(1400, 1500)]);
        assert!(s.is_retransmission_lost(SeqNum(0)) && s.is_retransmission_lost(SeqNum(99)));
        assert!(!s.is_retransmission_lost(SeqNum(100)), "SACKed");
        assert!(
            !s.is_retransmission_lost(SeqNum(400)),
            "never retransmitted"
        );
        // Before: the retransmission, [400,1000), [1100,1200), [1300,1500). After: [400,1000)
        // is lost too, and only [1100,1200) and [1300,1400) remain in flight.
        assert_eq!(pipe, 100 + 600 + 100 + 200);
        assert_eq!(s.pipe(), 200);
        assert_eq!(
            s.next_seg(true),
            Some(NextSeg::Retransmit {
                start: SeqNum(0),
                len: MSS
            })
        );
        s.on_retransmit(SeqNum(0), 100);
        assert_eq!(s.stats().lost_retransmissions, 1);
        assert!(
            !s.is_retransmission_lost(SeqNum(0)),
            "sent again after the evidence"
        );
        assert_eq!(s.high_rxt(), SeqNum(100), "HighRxt unchanged");
        assert_eq!(
            s.next_seg(true),
            Some(NextSeg::Retransmit {
                start: SeqNum(400),
                len: MSS
            }),
            "rule 1 resumes above HighRxt"
        );
        // The records follow SND.UNA and end with the recovery.
        s.on_ack(SeqNum(50), &[]);
        assert!(!s.is_retransmission_lost(SeqNum(50)));
        s.on_rto();
        assert!(s.rxt.is_empty());
    }

    #[test]
    fn retransmission_records_split_merge_and_stay_bounded() {
        let cfg = ScoreboardConfig {
            max_ranges: 4,
            ..ScoreboardConfig::default()
        };
        let mut s = Scoreboard::new(SeqNum(0), MSS, cfg).unwrap();
        s.on_transmit(SeqNum(1000));
        assert_eq!(
            s.rxt.capacity(),
            0,
            "nothing allocated before a retransmission"
        );
        s.on_retransmit(SeqNum(0), 300);
        s.on_transmit(SeqNum(1100));
        // A retransmission inside a record splits it into three.
        s.on_retransmit(SeqNum(100), 100);
        let spans: Vec<_> = s
            .rxt
            .iter()
            .map(|r| (r.start.0, r.end.0, r.sent_max.0))
            .collect();
        assert_eq!(
            spans,
            vec![(0, 100, 1000), (100, 200, 1100), (200, 300, 1000)]
        );
        // Same SND.MAX and adjacent: merged.
        s.on_retransmit(SeqNum(300), 100);
        s.on_retransmit(SeqNum(400), 100);
        assert_eq!(s.rxt.len(), 4);
        assert_eq!(s.rxt[3].start, SeqNum(300));
        assert_eq!(s.rxt[3].end, SeqNum(500));
        for i in 0..20u32 {
            s.on_transmit(SeqNum(1200 + i));
            s.on_retransmit(SeqNum(500 + 10 * i), 10);
        }
        assert_eq!(s.rxt.len(), 4);
        assert!(s.rxt.capacity() <= 6, "storage beyond max_ranges + 2");
        assert_eq!(s.stats().rxt_records_dropped, 20);
        // Invalid retransmissions are not recorded.
        s.on_retransmit(SeqNum(1200), 500);
        s.on_retransmit(SeqNum(0), 0);
        assert_eq!(s.rxt.len(), 4);
    }

    #[test]
    fn rfc6675_4_nextseg_limits_to_smss_and_hole() {
        let mut s = sb(0, 2000);
        s.on_ack(SeqNum(0), &[blk(250, 300), blk(1500, 1900)]);
        assert_eq!(
            s.next_seg(false),
            Some(NextSeg::Retransmit {
                start: SeqNum(0),
                len: MSS
            })
        );
        s.on_retransmit(SeqNum(0), 100);
        s.on_retransmit(SeqNum(100), 100);
        assert_eq!(
            s.next_seg(false),
            Some(NextSeg::Retransmit {
                start: SeqNum(200),
                len: 50
            })
        );
    }

    #[test]
    fn rfc6675_4_rescue_retransmission_once_per_recovery() {
        let mut s = sb(0, 1000);
        s.on_ack(SeqNum(0), &[blk(100, 200)]);
        s.on_enter_recovery();
        // Highest outstanding unSACKed octet is 999: the segment [900, 1000).
        assert_eq!(s.rescue_seg(), Some((SeqNum(900), 100)));
        s.set_rescue_rxt(SeqNum(1000));
        assert_eq!(s.rescue_seg(), None);
        // Everything above SACKed: rescue covers the hole below the top range.
        let mut t = sb(0, 1000);
        t.on_ack(SeqNum(0), &[blk(950, 1000)]);
        assert_eq!(t.rescue_seg(), Some((SeqNum(850), 100)));
        // The highest unSACKed octet was already retransmitted in this recovery (a single
        // hole under everything SACKed): no rescue, which would send it twice at once.
        let mut h = sb(0, 1000);
        h.on_ack(SeqNum(0), &[blk(100, 1000)]);
        h.on_enter_recovery();
        h.on_retransmit(SeqNum(0), 100);
        assert_eq!(h.rescue_seg(), None);
        // Nothing outstanding unSACKed.
        let mut u = sb(0, 100);
        u.on_ack(SeqNum(0), &[blk(0, 100)]);
        assert_eq!(u.rescue_seg(), None);
    }

    #[test]
    fn rfc6675_5_1_rto_restarts_retransmission_at_una() {
        let mut s = sb(0, 1000);
        s.on_ack(SeqNum(0), &[blk(100, 200)]);
        s.on_enter_recovery();
        s.on_retransmit(SeqNum(0), 100);
        s.on_rto();
        assert_eq!(s.high_rxt(), SeqNum(0));
        assert_eq!(s.sacked_bytes(), 100, "SACK info kept (RFC 6675 §5.1)");
        s.clear_sacks();
        assert_eq!(s.sacked_bytes(), 0);
        assert!(s.ranges().is_empty());
    }

    #[test]
    fn cve_2019_11478_fragmenting_sacks_bounded_by_max_ranges() {
        let cfg = ScoreboardConfig {
            max_ranges: 8,
            ..ScoreboardConfig::default()
        };
        let mut s = Scoreboard::new(SeqNum(0), MSS, cfg).unwrap();
        s.on_transmit(SeqNum(1 << 20));
        assert_eq!(
            s.ranges.capacity(),
            0,
            "nothing allocated before the first SACK"
        );
        // Every other byte SACKed, thousands of ACKs.
        let mut cap = 0;
        for i in 0..5000u32 {
            s.on_ack(SeqNum(0), &[blk(2 * i + 1, 2 * i + 2)]);
            assert!(s.ranges.capacity() <= 9, "storage beyond max_ranges + 1");
            if i == 100 {
                cap = s.ranges.capacity();
            }
        }
        assert_eq!(s.ranges().len(), 8);
        assert_eq!(
            s.ranges.capacity(),
            cap,
            "no reallocation once at the bound"
        );
        assert_eq!(s.sacked_bytes(), 8);
        assert!(s.stats().ranges_dropped > 0);
        // The lowest ranges are the ones kept.
        assert_eq!(s.ranges()[0], blk(1, 2));
    }

    #[test]
    fn bad_config_rejected() {
        let e = Scoreboard::new(
            SeqNum(0),
            MSS,
            ScoreboardConfig {
                max_ranges: 0,
                ..ScoreboardConfig::default()
            },
        );
        assert_eq!(e.unwrap_err(), ScoreboardConfigError::MaxRanges);
        let e = Scoreboard::new(
            SeqNum(0),
            MSS,
            ScoreboardConfig {
                dup_thresh: 0,
                ..ScoreboardConfig::default()
            },
        );
        assert_eq!(e.unwrap_err(), ScoreboardConfigError::DupThresh);
        assert!(!ScoreboardConfigError::MaxRanges.to_string().is_empty());
    }

    #[test]
    fn rfc4653_dupthresh_follows_reordering_bounded_by_flight_and_max() {
        let mut s = sb(0, 2000);
        assert_eq!(s.dup_thresh(), 3);
        // Nine segments overtook the late one: extent 10 segments, DupThresh 11.
        assert_eq!(s.note_reordering(10 * MSS), 11);
        assert_eq!(s.dup_thresh(), 11);
        assert_eq!(s.stats().reordering_raised, 1);
        // Never lowered by a smaller extent; bounded by MAX_REORDERING.
        assert_eq!(s.note_reordering(2 * MSS), 11);
        assert_eq!(s.note_reordering(u32::MAX), MAX_REORDERING);
        // IsLost follows: 10 SACKed segments above octet 0 are not enough with 20 in flight...
        let mut t = sb(0, 2000);
        t.note_reordering(10 * MSS);
        t.on_ack(SeqNum(0), &[blk(100, 1100)]);
        assert!(!t.is_lost(SeqNum(0)), "10 SACKed segments, DupThresh 11");
        t.on_ack(SeqNum(0), &[blk(1100, 1101)]);
        assert!(
            t.is_lost(SeqNum(0)),
            "more than (DupThresh - 1) * SMSS bytes"
        );
        // ...but DupThresh never exceeds the segments in flight minus one: with 5 segments
        // outstanding and the 4 above the first SACKed, the first is lost.
        let mut u = sb(0, 500);
        u.note_reordering(10 * MSS);
        assert_eq!(u.dup_thresh(), 4);
        u.on_ack(SeqNum(0), &[blk(100, 400)]);
        assert!(!u.is_lost(SeqNum(0)));
        u.on_ack(SeqNum(0), &[blk(400, 500)]);
        assert!(u.is_lost(SeqNum(0)));
        // Never below the configured DupThresh, even with a tiny flight.
        let mut v = sb(0, 100);
        v.note_reordering(10 * MSS);
        assert_eq!(v.dup_thresh(), 3);
        // An RTO outside recovery with DupThresh segments SACKed resets the estimate.
        t.on_rto_outside_recovery();
        assert_eq!(t.reordering(), 3);
        assert_eq!(t.stats().reordering_reset, 1);
        // Without that evidence it is kept.
        let mut w = sb(0, 2000);
        w.note_reordering(10 * MSS);
        w.on_ack(SeqNum(0), &[blk(100, 300)]);
        w.on_rto_outside_recovery();
        assert_eq!(w.reordering(), 11);
    }

    #[test]
    fn absurd_transmit_is_ignored() {
        let mut s = sb(0, 100);
        s.on_transmit(SeqNum(1 << 31));
        assert_eq!(s.snd_max(), SeqNum(100));
        s.on_transmit(SeqNum(50));
        assert_eq!(s.snd_max(), SeqNum(100));
    }

    /// Sender (this scoreboard) and receiver (the assembler's SACK blocks) composed: RFC 6675
    /// recovery repairs several losses, including the last segment (rescue retransmission),
    /// delivers the stream byte-exact across the 2^32 wrap, and never retransmits SACKed data.
    #[test]
    fn rfc6675_5_recovery_against_assembler_receiver_is_exact() {
        use crate::tcp::assembler::{Assembler, AssemblerConfig};
        use std::collections::{BTreeSet, VecDeque};

        const N: u32 = 40;
        let base = SeqNum(u32::MAX - 1234);
        let stream: Vec<u8> = (0..N * MSS).map(|i| (i % 251) as u8).collect();
        let lost: BTreeSet<u32> = [3, 4, 10, 25, 39].into_iter().collect();
        let mut sb = Scoreboard::with_defaults(base, MSS);
        let mut rx: Assembler<Vec<u8>> = Assembler::new(AssemblerConfig::default()).unwrap();
        let mut rcv_nxt = base;
        let mut delivered = vec![];
        let mut acks: VecDeque<(SeqNum, Vec<(SeqNum, SeqNum)>)> = VecDeque::new();
        let mut arrive = |seq: SeqNum, len: u32, acks: &mut VecDeque<_>, rcv_nxt: &mut SeqNum| {
            let o = (seq - base) as usize;
            rx.insert(*rcv_nxt, seq, stream[o..o + len as usize].to_vec());
            while let Some(p) = rx.pop_ready(*rcv_nxt) {
                *rcv_nxt += p.len();
                delivered.extend_from_slice(&p);
            }
            let mut b = [(SeqNum(0), SeqNum(0)); 3];
            let n = rx.sack_blocks(*rcv_nxt, &mut b);
            acks.push_back((*rcv_nxt, b[..n].to_vec()));
        };
        // One flight; the network drops the segments in `lost` on first transmission.
        for k in 0..N {
            let seq = base + k * MSS;
            sb.on_transmit(seq + MSS);
            if !lost.contains(&k) {
                arrive(seq, MSS, &mut acks, &mut rcv_nxt);
            }
        }
        let cwnd = 10 * MSS;
        let mut in_recovery = false;
        let mut recovery_point = base;
        let mut retransmitted = 0u32;
        let mut dupacks = 0;
        for _ in 0..1000 {
            let Some((ack, blocks)) = acks.pop_front() else {
                break;
            };
            let info = sb.on_ack(ack, &blocks);
            assert_eq!(info.blocks_ignored, 0);
            assert!(info.dsack.is_none(), "no spurious retransmission");
            if info.acked_bytes == 0 && info.newly_sacked_bytes > 0 {
                dupacks += 1;
            }
            // RFC 6675 §5: enter recovery on DupThresh duplicates or IsLost(HighACK + 1).
            if !in_recovery && (dupacks >= 3 || sb.is_lost(sb.snd_una())) {
                in_recovery = true;
                recovery_point = sb.snd_max();
                sb.on_enter_recovery();
            }
            if in_recovery && !sb.snd_una().lt(recovery_point) {
                in_recovery = false;
            }
            // RFC 6675 §5 (C): send while pipe < cwnd.
            while in_recovery && sb.pipe() < cwnd {
                if let Some(NextSeg::Retransmit { start, len }) = sb.next_seg(false) {
                    assert!((0..len).all(|i| !sb.is_sacked(start + i)));
                    sb.on_retransmit(start, len);
                    retransmitted += len;
                    arrive(start, len, &mut acks, &mut rcv_nxt);
                } else if let Some((start, len)) = sb.rescue_seg() {
                    sb.set_rescue_rxt(recovery_point);
                    retransmitted += len;
                    arrive(start, len, &mut acks, &mut rcv_nxt);
                } else {
                    break;
                }
            }
        }
        assert_eq!(delivered, stream);
        assert_eq!(sb.snd_una(), sb.snd_max());
        assert_eq!(
            retransmitted,
            lost.len() as u32 * MSS,
            "exactly the lost bytes"
        );
        assert!(rx.is_empty());
    }

    // ---- Model-based property test -------------------------------------------------------

    const WIN: u32 = 200;
    const CAP: usize = 6;

    /// Byte-bitmap model of the scoreboard over a small window.
    struct Model {
        base: u32,
        una: u32, // offsets from base
        max: u32,
        sacked: Vec<bool>, // index = offset from base
        /// SND.MAX (offset) when the octet was last retransmitted.
        rxt_at: Vec<Option<u32>>,
    }

    impl Model {
        fn runs(&self) -> Vec<(u32, u32)> {
            let mut v = vec![];
            let mut i = self.una;
            while i < self.max {
                if self.sacked[i as usize] {
                    let s = i;
                    while i < self.max && self.sacked[i as usize] {
                        i += 1;
                    }
                    v.push((s, i));
                } else {
                    i += 1;
                }
            }
            v
        }

        fn ack(&mut self, ack: SeqNum, blocks: &[(SeqNum, SeqNum)]) {
            // Validity follows the spec's serial-number rules; the bitmap is the independent
            // part of the model.
            let una = SeqNum(self.base) + self.una;
            let max = SeqNum(self.base) + self.max;
            let off = |s: SeqNum| s - SeqNum(self.base);
            if ack.gt(max) {
                return;
            }
            if ack.gt(una) {
                for o in self.una..off(ack) {
                    self.sacked[o as usize] = false;
                }
                self.una = off(ack);
            }
            let una = SeqNum(self.base) + self.una;
            for (i, &(l, r)) in blocks.iter().take(4).enumerate() {
                let plausible = l.lt(r)
                    && (r - l) <= 1 << 30
                    && r.le(max)
                    && !(l.lt(una) && (una - l) > 1 << 30);
                if i == 0 && plausible {
                    let inside = blocks
                        .get(1)
                        .is_some_and(|&(l2, r2)| l2.lt(r2) && l.ge(l2) && r.le(r2));
                    if r.le(una) || inside {
                        continue; // D-SACK
                    }
                }
                if !l.lt(r) || r.gt(max) || !r.gt(una) || (r - l) > 1 << 30 {
                    continue;
                }
                for o in off(l.max(una))..off(r) {
                    self.sacked[o as usize] = true;
                }
                while self.runs().len() > CAP {
                    let (s, e) = *self.runs().last().unwrap();
                    for o in s..e {
                        self.sacked[o as usize] = false;
                    }
                }
            }
        }

        /// IsLost's criterion over the SACKed octets at or above `from`.
        fn beyond_thresh(&self, from: u32, mss: u32) -> bool {
            let mut bytes = 0;
            let mut segs = 0;
            for (s, e) in self.runs() {
                let s = s.max(from);
                if e > s {
                    bytes += e - s;
                    segs += (e - s).div_ceil(mss);
                }
            }
            segs >= 3 || bytes > 2 * mss
        }

        /// RFC 6675 IsLost, octet by octet.
        fn is_lost(&self, o: u32, mss: u32) -> bool {
            !self.sacked[o as usize] && self.beyond_thresh(o + 1, mss)
        }

        /// The octet's last retransmission (below HighRxt `rxt`) is lost.
        fn rxt_lost(&self, o: u32, rxt: u32, mss: u32) -> bool {
            o < rxt
                && !self.sacked[o as usize]
                && self.rxt_at[o as usize].is_some_and(|at| self.beyond_thresh(at, mss))
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Transmit(u32),
        Ack(u32, Vec<(u32, u32)>),
        AckRaw(u32, Vec<(u32, u32)>),
        Retransmit(u32, u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        let off = 0u32..WIN + 20;
        // Mostly short blocks (fragmentation), some arbitrary pairs (inverted, huge).
        let block = prop_oneof![
            3 => (0u32..WIN + 20, 0u32..12).prop_map(|(l, n)| (l, l + n)),
            1 => (0u32..WIN + 20, 0u32..WIN + 20),
        ];
        let blocks = proptest::collection::vec(block, 0..6);
        prop_oneof![
            (1u32..60).prop_map(Op::Transmit),
            (off.clone(), blocks.clone()).prop_map(|(a, b)| Op::Ack(a, b)),
            (
                any::<u32>(),
                proptest::collection::vec((any::<u32>(), any::<u32>()), 0..5)
            )
                .prop_map(|(a, b)| Op::AckRaw(a, b)),
            (0u32..WIN, 1u32..120).prop_map(|(s, l)| Op::Retransmit(s, l)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn rfc6675_scoreboard_matches_bitmap_model(
            base in prop_oneof![Just(u32::MAX - 100), Just(0u32), any::<u32>()],
            mss in 1u32..50,
            ops in proptest::collection::vec(op(), 1..40),
        ) {
            let cfg = ScoreboardConfig { max_ranges: CAP, dup_thresh: 3 };
            let mut s = Scoreboard::new(SeqNum(base), mss, cfg).unwrap();
            let mut m = Model {
                base, una: 0, max: 0,
                sacked: vec![false; WIN as usize + 64],
                rxt_at: vec![None; WIN as usize + 64],
            };
            for op in ops {
                match op {
                    Op::Transmit(n) => {
                        let end = (m.max + n).min(WIN);
                        s.on_transmit(SeqNum(base) + end);
                        m.max = end;
                    }
                    Op::Ack(a, b) => {
                        let b: Vec<_> = b.iter().map(|&(l, r)| (SeqNum(base) + l, SeqNum(base) + r)).collect();
                        let before = s.sacked_bytes();
                        let info = s.on_ack(SeqNum(base) + a, &b);
                        m.ack(SeqNum(base) + a, &b);
                        if info.ranges_dropped == 0 && info.acked_bytes == 0 {
                            prop_assert_eq!(info.newly_sacked_bytes, s.sacked_bytes() - before);
                        }
                    }
                    Op::AckRaw(a, b) => {
                        let b: Vec<_> = b.iter().map(|&(l, r)| (SeqNum(l), SeqNum(r))).collect();
                        s.on_ack(SeqNum(a), &b);
                        m.ack(SeqNum(a), &b);
                    }
                    Op::Retransmit(st, l) => {
                        s.on_retransmit(SeqNum(base) + st, l);
                        if st >= m.una && st + l <= m.max {
                            for o in st..st + l {
                                m.rxt_at[o as usize] = Some(m.max);
                            }
                        }
                    }
                }
                // Same SACKed set, same SND.UNA/SND.MAX.
                prop_assert_eq!(s.snd_una(), SeqNum(base) + m.una);
                prop_assert_eq!(s.snd_max(), SeqNum(base) + m.max);
                let runs: Vec<_> = m.runs().iter().map(|&(a, b)| (SeqNum(base) + a, SeqNum(base) + b)).collect();
                prop_assert_eq!(s.ranges(), &runs[..]);
                prop_assert_eq!(s.sacked_bytes() as usize, runs.iter().map(|&(a, b)| (b - a) as usize).sum::<usize>());
                prop_assert!(s.ranges().len() <= CAP);
                // IsLost, SetPipe and NextSeg rule 1 against their octet-by-octet definitions.
                // Retransmission records forgotten at the cap: those retransmissions are never
                // deemed lost, so pipe may only be larger and rule 0 a subset.
                let exact = s.stats().rxt_records_dropped == 0;
                let rxt = s.high_rxt() - SeqNum(base);
                let mut pipe = 0;
                for o in m.una..m.max {
                    let lost = m.is_lost(o, mss);
                    prop_assert_eq!(s.is_lost(SeqNum(base) + o), lost, "octet {}", o);
                    let rxt_lost = m.rxt_lost(o, rxt, mss);
                    if exact {
                        prop_assert_eq!(s.is_retransmission_lost(SeqNum(base) + o), rxt_lost);
                    } else if s.is_retransmission_lost(SeqNum(base) + o) {
                        prop_assert!(rxt_lost, "octet {}", o);
                    }
                    if !m.sacked[o as usize] {
                        pipe += u32::from(!lost) + u32::from(o < rxt && !rxt_lost);
                    }
                }
                if exact {
                    prop_assert_eq!(s.pipe(), pipe);
                } else {
                    prop_assert!(s.pipe() >= pipe);
                }
                let top = m.runs().last().map_or(0, |r| r.1);
                let rule0 = (m.una..rxt.max(m.una)).find(|&o| m.rxt_lost(o, rxt, mss));
                let rule1 = (rxt.max(m.una)..top).find(|&o| !m.sacked[o as usize] && m.is_lost(o, mss));
                match s.next_seg(true) {
                    Some(NextSeg::Retransmit { start, len }) => {
                        let o = start - SeqNum(base);
                        if exact {
                            prop_assert_eq!(Some(o), rule0.or(rule1));
                        }
                        if o < rxt {
                            // Rule 0: only octets whose retransmission is lost.
                            prop_assert!((o..o + len).all(|x| m.rxt_lost(x, rxt, mss)));
                        } else {
                            prop_assert_eq!(Some(o), rule1);
                        }
                        prop_assert!(len >= 1 && len <= mss);
                        prop_assert!(!s.is_sacked(start + (len - 1)));
                    }
                    _ => {
                        prop_assert_eq!(rule1, None);
                        if exact {
                            prop_assert_eq!(rule0, None);
                        }
                    }
                }
            }
        }
    }
}
