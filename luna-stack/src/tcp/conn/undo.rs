//! Recovery undo: D-SACK (RFC 2883, RFC 3708) and Eifel (RFC 3522) detection of a
//! spurious fast recovery, and the undo of its congestion-window reduction.

use super::*;

/// Most disjoint retransmitted ranges one recovery episode tracks for D-SACK undo; beyond
/// it the episode is simply not undone (bounded memory, conservative).
const MAX_UNDO_RANGES: usize = 8;

/// RFC 3708 §3 bookkeeping of the latest SACK recovery episode: which retransmissions have
/// not yet been reported duplicate by a D-SACK. Kept after the recovery ends (the D-SACKs of
/// its last retransmissions arrive about an RTT later) until the next recovery or RTO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct UndoEpisode {
    /// An episode is being watched.
    pub(super) active: bool,
    /// SND.UNA at entry: the octet whose presumed loss started the recovery.
    pub(super) hole: SeqNum,
    /// Retransmitted ranges no D-SACK has covered yet: disjoint, sorted, at most
    /// `MAX_UNDO_RANGES` (capacity reserved once per connection).
    pub(super) pending: Vec<(SeqNum, SeqNum)>,
    /// Retransmissions sent in the episode.
    pub(super) retransmissions: u32,
    /// The episode can no longer be proven spurious: some data was retransmitted twice (its
    /// first retransmission was deemed lost), or too many ranges.
    pub(super) tainted: bool,
    /// How far beyond `hole` the peer had received data when `hole` was first cumulatively
    /// acknowledged (bytes): the reordering extent if the episode proves spurious.
    pub(super) extent: Option<u32>,
    /// TSval of the episode's first retransmission (timestamps in use).
    pub(super) rxt_tsval: Option<u32>,
    /// RFC 3522 (Eifel detection): the ACK that first covered `hole` echoed a TSval older than the
    /// first retransmission's, so the original transmission arrived.
    pub(super) original_arrived: bool,
}

impl UndoEpisode {
    pub(super) fn new() -> Self {
        UndoEpisode {
            active: false,
            hole: SeqNum(0),
            pending: Vec::with_capacity(MAX_UNDO_RANGES + 1),
            retransmissions: 0,
            tainted: false,
            extent: None,
            rxt_tsval: None,
            original_arrived: false,
        }
    }

    pub(super) fn start(&mut self, hole: SeqNum) {
        self.active = true;
        self.hole = hole;
        self.pending.clear();
        self.retransmissions = 0;
        self.tainted = false;
        self.extent = None;
        self.rxt_tsval = None;
        self.original_arrived = false;
    }

    /// `[start, end)` was retransmitted.
    pub(super) fn on_retransmit(&mut self, start: SeqNum, end: SeqNum) {
        if !self.active || !start.lt(end) {
            return;
        }
        self.retransmissions = self.retransmissions.saturating_add(1);
        if self.pending.iter().any(|&(a, b)| start.lt(b) && a.lt(end)) {
            // Sent again: the first retransmission was deemed lost, so was (likely) the data.
            self.tainted = true;
            return;
        }
        let at = self.pending.partition_point(|&(a, _)| a.lt(start));
        if at > 0 && self.pending[at - 1].1 == start {
            self.pending[at - 1].1 = end;
        } else if at < self.pending.len() && self.pending[at].0 == end {
            self.pending[at].0 = start;
        } else if self.pending.len() < MAX_UNDO_RANGES {
            self.pending.insert(at, (start, end));
        } else {
            self.tainted = true;
        }
    }

    /// RFC 2883 §4: the peer received `[l, r)` twice; forget it from the pending ranges.
    pub(super) fn on_dsack(&mut self, l: SeqNum, r: SeqNum) {
        if !self.active || self.tainted {
            return;
        }
        let mut i = 0;
        while i < self.pending.len() {
            let (a, b) = self.pending[i];
            if !(l.lt(b) && a.lt(r)) {
                i += 1;
                continue;
            }
            match (a.lt(l), r.lt(b)) {
                (true, true) => {
                    if self.pending.len() >= MAX_UNDO_RANGES {
                        self.tainted = true;
                        return;
                    }
                    self.pending[i].1 = l;
                    self.pending.insert(i + 1, (r, b));
                    i += 2;
                }
                (true, false) => {
                    self.pending[i].1 = l;
                    i += 1;
                }
                (false, true) => {
                    self.pending[i].0 = r;
                    i += 1;
                }
                (false, false) => {
                    self.pending.remove(i);
                }
            }
        }
    }

    /// RFC 3708 §3: every retransmission of the episode was D-SACKed.
    pub(super) fn all_dsacked(&self) -> bool {
        self.active
            && !self.tainted
            && self.retransmissions > 0
            && self.pending.is_empty()
            && self.original_arrived
    }
}

impl Connection {
    /// RFC 3708 §3 with RFC 3522: on a cumulative ACK `ack`, the first time it covers the
    /// episode's presumed-lost octet, note how far beyond it the peer had received data
    /// (`high_before`: the highest SACKed octet before this ACK) and whether the original
    /// transmission arrived (Eifel: the ACK echoes a TSval older than the retransmission's).
    pub(super) fn undo_on_ack(&mut self, ack: SeqNum, high_before: Option<SeqNum>, seg: &TcpRepr) {
        if self.undo.active && self.undo.extent.is_none() && ack.gt(self.undo.hole) {
            // The presumed-lost octet arrived: everything the peer had beyond it came first
            // (the reordering extent, if the episode proves spurious).
            let high = [high_before, self.sb.highest_sacked()]
                .into_iter()
                .flatten()
                .fold(ack, |h, s| if s.gt(h) { s } else { h });
            self.undo.extent = Some(high - self.undo.hole);
            self.undo.original_arrived = match (self.undo.rxt_tsval, seg.options.timestamps) {
                (Some(rxt), Some(t)) => (t.tsecr.wrapping_sub(rxt) as i32) < 0,
                _ => self.ts.is_none(),
            };
        }
    }

    /// RFC 3708 §3: the recovery episode is over and every retransmission in it was
    /// D-SACKed, so no data was lost: the reduction was spurious.
    pub(super) fn undo_spurious_recovery(&mut self) {
        self.undo.active = false;
        // RFC 9438 §4.9: restore the congestion state from before the reduction (cwnd,
        // ssthresh, and CUBIC's W_max, K, epoch), as Linux does; RFC 4015's response would
        // restore more cautiously.
        if self.cc.undo() {
            self.counters.spurious_recoveries += 1;
        }
        // RFC 4653's idea (Linux tcp_reordering): the same reordering should not trigger the
        // next fast retransmit, so DupThresh rises to its extent (bounded in the scoreboard).
        if let Some(extent) = self.undo.extent {
            self.sb.note_reordering(extent);
        }
    }
}
