//! Segment arrival (RFC 9293 §3.10.7): the fast path, SYN-SENT, the synchronized states,
//! ACK processing with loss recovery entry, and TIME-WAIT.

use super::*;

impl Connection {
    // ---------------------------------------------------------------------------------------
    // Segment arrival (RFC 9293 §3.10.7)
    // ---------------------------------------------------------------------------------------

    /// Process one segment addressed to this connection. `payload` is the TCP payload, a
    /// zero-copy slice of the received frame. No stack-wide receive-memory budget applies
    /// (only the connection's own bound, [`Connection::rcv_mem_limit`]).
    pub fn on_segment(&mut self, now: Instant, seg: &TcpRepr, payload: Zbuf) -> Disposition {
        self.on_segment_path(now, seg, payload, isize::MAX).0
    }

    /// [`Connection::on_segment`], and whether header prediction took the segment: then
    /// only the receive queue (in-order data) and the send queue (an ACK) changed; the
    /// state, the out-of-order queue and its counters did not (the stack's accounting
    /// relies on it).
    ///
    /// `room`: the receive memory (truesize) the stack's other connections leave to any
    /// connection beyond what it holds now: `StackConfig::rcv_mem_total` less its reserve
    /// (`rcv_reserve`), less the stack's total; negative once the connections hold more,
    /// `isize::MAX` for no bound. A connection under its floor whose application reads
    /// may take the reserve too ([`rcv_mem_cap`](Self::rcv_mem_cap)). A segment that would
    /// take more than it may is refused as [`DropReason::RcvMemoryGlobal`] unless it is in
    /// order and nothing is left to read (see [`admit_rcv_mem`](Self::admit_rcv_mem)).
    pub(crate) fn on_segment_path(
        &mut self,
        now: Instant,
        seg: &TcpRepr,
        payload: Zbuf,
        room: isize,
    ) -> (Disposition, bool) {
        self.counters.segs_in += 1;
        self.last_rcv = now;
        let mem = payload.truesize();
        if self.cfg.header_prediction && self.header_predicted(seg, payload.len(), mem, room) {
            if room < self.rcv_mem_limit() as isize && !payload.is_empty() {
                self.note_rcv_room(room, seg.seq + payload.len());
            }
            self.on_segment_predicted(now, seg, payload, mem);
            return (Disposition::Keep, true);
        }
        let d = match self.state {
            State::Closed => Disposition::Keep,
            State::SynSent => {
                self.on_segment_syn_sent(now, seg);
                self.arm_timers(now);
                Disposition::Keep
            }
            _ => {
                // The most this connection may hold under the stack-wide budget, fixed
                // for the whole segment (the full path only; nothing before the data
                // check changes the held memory).
                let held = self.recv_mem();
                let cap = self.rcv_mem_cap(held, room, true);
                let d = self.on_segment_synchronized(now, seg, payload, cap);
                // Kept for the window (`rcv_wnd_mem`): a bound below the connection's
                // own may limit it, so the one-compare shortcut is off until recomputed.
                self.rcv_room = (room, held, self.rcv_nxt);
                // (The callers compare the receive queue's memory only: out-of-order data
                // turns the shortcut off too. The free room is what may limit the window
                // of every connection; the reserve only adds to it.)
                if held.saturating_add(room.max(0) as usize) < self.rcv_mem_limit()
                    || !self.ooo.is_empty()
                {
                    self.rcv_mem_easy = 0;
                }
                d
            }
        };
        (d, false)
    }

    /// A run of received segments (`Stack::handle_frames`): consecutive in-order data
    /// segments with the same ACK, window and options, `seg` the first one's header (PSH
    /// if any had it) and `pieces` their payloads. When header prediction accepts the
    /// whole run, one pass of its processing takes them all (returns `(Keep, true)`);
    /// otherwise each segment goes through [`on_segment_path`](Self::on_segment_path) in
    /// turn (`seg.seq` advanced), as frame-by-frame input would. Either way the state
    /// afterwards is what one call per segment leaves. `pieces` is drained; `readable` is
    /// set to how many segments made the connection readable (the events frame-by-frame
    /// input would have announced). `room` is the stack-wide budget left, as for
    /// [`on_segment_path`](Self::on_segment_path), before the run.
    pub(crate) fn on_segment_run(
        &mut self,
        now: Instant,
        seg: &mut TcpRepr,
        pieces: &mut Vec<Zbuf>,
        readable: &mut u32,
        room: isize,
    ) -> (Disposition, bool) {
        let (total, mem) = pieces
            .iter()
            .fold((0, 0), |(n, m), p| (n + p.len(), m + p.truesize()));
        if self.cfg.header_prediction && self.header_predicted(seg, total, mem, room) {
            if room < self.rcv_mem_limit() as isize {
                self.note_rcv_room(room, seg.seq + total);
            }
            self.counters.segs_in += pieces.len() as u64;
            self.last_rcv = now;
            *readable = pieces.len() as u32;
            self.on_run_predicted(now, seg, total, mem, pieces);
            return (Disposition::Keep, true);
        }
        self.on_run_each(now, seg, pieces, readable, room)
    }

    /// [`on_segment_run`](Self::on_segment_run) when header prediction declined the run:
    /// one pass of [`on_segment_path`](Self::on_segment_path) per segment. Out of line, so
    /// that the predicted run's caller keeps its registers.
    #[inline(never)]
    fn on_run_each(
        &mut self,
        now: Instant,
        seg: &mut TcpRepr,
        pieces: &mut Vec<Zbuf>,
        readable: &mut u32,
        room: isize,
    ) -> (Disposition, bool) {
        // `readable`: how many of the segments made the connection readable, each of
        // which frame-by-frame input would have announced with its own event.
        let was = core::mem::take(&mut self.events.readable);
        let mut disposition = Disposition::Keep;
        // The stack-wide budget is the run's: what each segment takes (or a collapse
        // frees) moves what is left for the next, as frame-by-frame input would see it.
        let cap = (self.recv_mem() as isize).saturating_add(room);
        for p in pieces.drain(..) {
            let len = p.len();
            let room = cap.saturating_sub(self.recv_mem() as isize);
            let (d, _) = self.on_segment_path(now, seg, p, room);
            if core::mem::take(&mut self.events.readable) {
                *readable += 1;
            }
            if d == Disposition::Remove {
                // (The rest of the run is dropped with the drain: the connection is gone.)
                disposition = d;
                break;
            }
            seg.seq += len;
        }
        self.events.readable = was || *readable > 0;
        (disposition, false)
    }

    /// [`on_segment_predicted`](Self::on_segment_predicted) for a run of `total` bytes: what
    /// the per-segment calls would do, each rule applied once where repeating it changes
    /// nothing (the same ACK, window and timestamp) and per segment where it counts (the
    /// data delivered, the delayed-ACK rule).
    fn on_run_predicted(
        &mut self,
        now: Instant,
        seg: &TcpRepr,
        total: usize,
        mem: usize,
        pieces: &mut Vec<Zbuf>,
    ) {
        self.counters.fast_path_hits += pieces.len() as u64;
        let ack = seg.ack;
        let info = self.sb.on_ack(ack, &[]);
        debug_assert!(info.dsack.is_none() && info.newly_sacked_bytes == 0);
        if ack.gt(self.snd_una) {
            self.on_new_ack(now, ack);
        }
        // The window update rule per segment leaves the last segment's, if the rule
        // accepts it (it accepts a later segment whenever it accepted an earlier one).
        let last = seg.seq + (total - pieces.last().map_or(0, |p| p.len()));
        if self.snd_wl1.lt(last) || (self.snd_wl1 == last && self.snd_wl2.le(ack)) {
            let wnd = u32::from(seg.window) << self.snd_wscale;
            self.snd_wnd = wnd;
            self.max_snd_wnd = self.max_snd_wnd.max(wnd);
            self.snd_wl1 = last;
            self.snd_wl2 = ack;
        }
        self.last_wnd_field = seg.window;
        // RFC 7323 §4.3: the segment that covers Last.ACK.sent updates TS.Recent; the run
        // carries one TSval, so the run covering it does the same.
        self.update_ts_recent_checked(now, seg, total as u32);
        if self.timers.is_armed(Timer::Keepalive) {
            self.arm_keepalive(now);
        }
        for p in pieces.drain(..) {
            let len = p.len() as u32;
            self.deliver_inline(p);
            self.schedule_ack(now, true, len);
        }
        self.rcv_true_in = self.rcv_true_in.wrapping_add(mem as u32);
        self.arm_timers(now);
    }

    /// Header prediction takes data that moves RCV.NXT to `nxt` with `room` left under
    /// the stack-wide bound, less than the connection's own bound: the stack-wide one may
    /// limit the window, so it is kept for `rcv_wnd_mem` (as the full path keeps it).
    /// With more room than that nothing is kept: it cannot limit the window (the
    /// connection may hold no more than its own bound), and the RCV.NXT the data moves
    /// makes an older record void.
    #[cold]
    #[inline(never)]
    fn note_rcv_room(&mut self, room: isize, nxt: SeqNum) {
        // (The out-of-order queue is empty: header prediction takes the data.)
        self.rcv_room = (room, self.rcvq_mem, nxt);
        self.rcv_mem_easy = 0;
    }

    /// Header prediction (Van Jacobson, "4BSD header prediction", 1990; BSD tcp_input, Linux
    /// tcp_rcv_established): whether `seg` is an in-order segment in ESTABLISHED for which the
    /// full processing of RFC 9293 §3.10.7.4 reduces to `on_segment_predicted`. Every
    /// condition below rules out a branch of `process`; anything else takes the full path.
    #[inline(always)]
    pub(super) fn header_predicted(
        &self,
        seg: &TcpRepr,
        payload_len: usize,
        mem: usize,
        room: isize,
    ) -> bool {
        // RFC 9293 §3.10.7.4: the other states have their own ACK, text and FIN rules.
        if self.state != State::Established {
            return false;
        }
        // RFC 9293 §3.10.7.4 second to fifth checks (RST, SYN, no ACK) and eighth (FIN): only
        // ACK, optionally PSH (which needs nothing on receive, RFC 9293 §3.9.1). URG, ECE and
        // CWR go the full way too.
        if seg.flags.0 & !TcpFlags::PSH.0 != TcpFlags::ACK.0 {
            return false;
        }
        // RFC 9293 §3.10.7.4 first check: exactly in sequence (no trimming, no reassembly).
        if seg.seq != self.rcv_nxt {
            return false;
        }
        match (self.ts, seg.options.timestamps) {
            // RFC 7323 §5.3 R1 (PAWS): TSval not older than TS.Recent passes without the
            // one-tick tolerance the full path allows; RFC 7323 §4.3 TS.Recent is updated
            // below under the same rule as the full path.
            (Some(ts), Some(t)) if (t.tsval.wrapping_sub(ts.recent) as i32) >= 0 => {}
            // Neither side uses timestamps.
            (None, None) => {}
            // RFC 7323 §3.2: a segment without timestamps once negotiated is dropped; an
            // older TSval is PAWS' business; stray timestamps are left to the full path.
            _ => return false,
        }
        // RFC 2018 / RFC 6675: SACK blocks, or SACK state to keep (renege check), need the
        // scoreboard. RFC 6582 / RFC 6675: loss recovery has its own ACK processing.
        if !seg.options.sack_blocks.is_empty() || !self.sb.ranges().is_empty() {
            return false;
        }
        // RFC 6298 §5 / RFC 5681 §3.1: after an RTO SND.NXT rewinds below SND.MAX (go-back-N);
        // a fast or partial-ACK retransmission may be pending.
        if self.recovery.is_some() || self.snd_nxt != self.snd_max || self.rexmit_now.is_some() {
            return false;
        }
        // RFC 9293 §3.8.6.1 (zero window, persist timer) and §3.10.7.4 fifth (window update):
        // the send window is open and stays open. BSD's prediction demands an unchanged
        // window because it then skips the update; ours runs the full path's update rule
        // (SND.WL1/WL2), so only the zero-window transitions, which stop or start the
        // persist timer, are excluded. (Our own receiver keeps its right edge fixed while
        // data arrives, so the window field changes on most segments of a transfer.)
        if self.snd_wnd == 0 || seg.window == 0 {
            return false;
        }
        // RFC 9293 §3.6.1: an orphan's data is answered with RST.
        if self.orphaned {
            return false;
        }
        let ack = seg.ack;
        if payload_len == 0 {
            // A pure ACK acknowledges new data, SND.UNA < SEG.ACK =< SND.MAX (RFC 9293
            // §3.10.7.4 fifth; RFC 5961 §5.2), or is a window update at SEG.ACK = SND.UNA that
            // cannot be a duplicate ACK (RFC 5681 §2: nothing outstanding, or the window
            // changed; with no SACK blocks RFC 6675 §5 adds nothing). Duplicate ACKs and old
            // ACKs take the full path, and so does one that may end a loss probe's episode
            // (RFC 8985 §7.4.2: `tlp_on_dup_ack`).
            ack.le(self.snd_max)
                && (ack.gt(self.snd_una)
                    || (ack == self.snd_una
                        && ((self.snd_max == self.snd_una && self.tlp.is_none())
                            || seg.window != self.last_wnd_field)))
        } else {
            // Data: SND.UNA =< SEG.ACK =< SND.MAX (RFC 5961 §5.2; an ACK equal to SND.UNA on a
            // segment with data is not a duplicate ACK, RFC 5681 §2); the payload fits the
            // window we advertised (RFC 9293 §3.10.7.4: nothing to trim); nothing out of order
            // is queued (RFC 5681 §4.2: a gap-filling segment is ACKed at once) and no FIN
            // seen out of order waits (RFC 9293 §3.10.7.4 eighth).
            // The memory behind the held data stays within its bound with this segment's
            // (`mem`, its buffers' truesize): the out-of-order queue is empty, so the receive
            // queue's is all there is (else `admit_rcv_mem` decides, on the full path); and
            // within what the stack's other connections leave (`room`: one compare; the
            // reserve, for a connection under its floor, is the full path's).
            ack.ge(self.snd_una)
                && ack.le(self.snd_max)
                && payload_len as u64 <= u64::from(self.rcv_wnd_for_check())
                && self.ooo.is_empty()
                && self.fin_seq.is_none()
                && self.rcvq_mem + mem <= self.rcv_mem_limit()
                && mem as isize <= room
        }
    }

    /// The full processing of RFC 9293 §3.10.7.4 for a segment `header_predicted` accepted,
    /// with the branches it ruled out left away: the same state changes, in the same order.
    pub(super) fn on_segment_predicted(
        &mut self,
        now: Instant,
        seg: &TcpRepr,
        payload: Zbuf,
        mem: usize,
    ) {
        self.counters.fast_path_hits += 1;
        let ack = seg.ack;
        let len = payload.len() as u32;
        // RFC 9293 §3.10.7.4 fifth: the ACK. The scoreboard sees it as on the full path (it
        // tracks SND.UNA); with no blocks and no ranges it only moves its SND.UNA.
        let info = self.sb.on_ack(ack, &[]);
        debug_assert!(info.dsack.is_none() && info.newly_sacked_bytes == 0);
        if ack.gt(self.snd_una) {
            self.on_new_ack(now, ack);
        }
        // RFC 9293 §3.10.7.4: window update if SND.WL1 < SEG.SEQ or (SND.WL1 = SEG.SEQ and
        // SND.WL2 =< SEG.ACK). Both windows are open (checked by the prediction), so the
        // persist timer is not involved.
        if self.snd_wl1.lt(seg.seq) || (self.snd_wl1 == seg.seq && self.snd_wl2.le(ack)) {
            let wnd = u32::from(seg.window) << self.snd_wscale;
            self.snd_wnd = wnd;
            self.max_snd_wnd = self.max_snd_wnd.max(wnd);
            self.snd_wl1 = seg.seq;
            self.snd_wl2 = ack;
        }
        self.last_wnd_field = seg.window;
        // RFC 7323 §4.3 (2): TS.Recent, after the ACK check as on the full path.
        self.update_ts_recent_checked(now, seg, len);
        // RFC 9293 §3.8.4: the peer is alive.
        if self.timers.is_armed(Timer::Keepalive) {
            self.arm_keepalive(now);
        }
        // RFC 9293 §3.10.7.4 seventh: in-order text goes to the application.
        if len > 0 {
            self.deliver(payload);
            self.rcv_true_in = self.rcv_true_in.wrapping_add(mem as u32);
            self.schedule_ack(now, true, len);
        }
        self.arm_timers(now);
    }

    /// RFC 9293 §3.10.7.3: SEGMENT ARRIVES in SYN-SENT.
    pub(super) fn on_segment_syn_sent(&mut self, now: Instant, seg: &TcpRepr) {
        let flags = seg.flags;
        if flags.ack() {
            // RFC 9293 §3.10.7.3 first: an ACK outside (ISS, SND.NXT] is unacceptable.
            if seg.ack.le(self.iss) || seg.ack.gt(self.snd_max) {
                self.counters.drop(DropReason::SynSentInvalid);
                if !flags.rst() {
                    self.rst_pending = Some(seg.ack);
                }
                return;
            }
        }
        if flags.rst() {
            // RFC 9293 §3.10.7.3 second: RST is acceptable only with an acceptable ACK
            // (RFC 5961 §3.2 allows the same check).
            if flags.ack() {
                self.terminate(CloseReason::Refused);
            } else {
                self.counters.drop(DropReason::SynSentInvalid);
            }
            return;
        }
        if !flags.syn() {
            // Neither SYN nor RST: drop (accepting a bare ACK here is a known bug class).
            self.counters.drop(DropReason::SynSentInvalid);
            return;
        }
        // RFC 9293 §3.10.7.3 fourth: SYN.
        self.irs = seg.seq;
        self.rcv_nxt = seg.seq + 1u32;
        self.rcv_adv = self.rcv_nxt;
        self.negotiate(&seg.options);
        self.update_ts_recent(now, &seg.options, seg.seq);
        if flags.ack() {
            self.snd_una = seg.ack;
            self.sndq.ack_to(seg.ack);
            // RFC 7323 §2.2: the SYN-ACK's window is not scaled.
            self.snd_wnd = u32::from(seg.window);
            self.max_snd_wnd = self.snd_wnd;
            self.snd_wl1 = seg.seq;
            self.snd_wl2 = seg.ack;
            self.last_wnd_field = seg.window;
            self.take_rtt_sample(now, seg.ack);
            if self.syn_retransmitted {
                self.on_handshake_retransmitted();
            }
            self.timers.clear(Timer::Rto);
            self.retries = 0;
            self.state = State::Established;
            self.events.connected = true;
            self.events.writable = true;
            self.ack_now = true;
            self.arm_keepalive(now);
            if self.fin_queued {
                // close() during SYN-SENT with data queued: the FIN follows the data.
                self.state = State::FinWait1;
            }
        } else {
            // RFC 9293 §3.10.7.3: simultaneous open — SYN-RECEIVED, send SYN-ACK.
            self.state = State::SynReceived;
            self.snd_wnd = u32::from(seg.window);
            self.max_snd_wnd = self.snd_wnd;
            self.snd_wl1 = seg.seq;
            self.snd_wl2 = self.iss;
            // Rewind so the SYN goes out again, now with ACK.
            self.snd_nxt = self.iss;
            self.timers.clear(Timer::Rto);
        }
    }

    /// Segment length in sequence space: payload plus one each for SYN and FIN.
    pub(super) fn seg_len(seg: &TcpRepr, payload_len: usize) -> u32 {
        payload_len as u32 + u32::from(seg.flags.syn()) + u32::from(seg.flags.fin())
    }

    /// The receive window we currently offer, in bytes, unrounded.
    pub(super) fn rcv_wnd(&self) -> u32 {
        let free = (self.cfg.rcv_buf as usize).saturating_sub(self.rcvq_len);
        let max = u32::from(u16::MAX) << self.rcv_wscale;
        (free.min(u32::MAX as usize) as u32).min(max)
    }

    /// The window receive memory lets us offer and its SWS threshold, for when memory may
    /// hold less than the byte window (the receive queue's memory at least
    /// `rcv_mem_easy`, which the callers check; this recomputes it). Linux's
    /// `__tcp_select_window` with `tcp_space`: the memory left under the connection's bound
    /// ([`Connection::rcv_mem_limit`]) and under what the stack-wide one leaves it
    /// (`rcv_room`), in bytes at the ratio of payload to truesize the data arrives with
    /// (`rcv_ratio`). A peer sending 1-byte segments, each keeping a 2 KiB receive buffer,
    /// is offered what the memory holds of them rather than what the byte buffer does, so
    /// its flight is taken without collapsing or refusing any of it.
    ///
    /// Returns (the window, at most the byte window; the SWS threshold). RFC 9293
    /// §3.8.6.2.2's buffer is what the memory holds at the ratio (at most `rcv_buf`), so
    /// with little memory the threshold shrinks with it and the window still opens.
    #[cold]
    #[inline(never)]
    pub(super) fn rcv_wnd_mem(&mut self) -> (u32, u32) {
        self.sample_rcv_ratio();
        let r = u64::from(self.rcv_ratio);
        let at_ratio =
            |mem: usize| ((mem as u64 * r) >> RCV_RATIO_SHIFT).min(u64::from(u32::MAX)) as u32;
        let limit = self.rcv_mem_limit().min(self.rcv_wnd_cap());
        let mut wnd = at_ratio(limit.saturating_sub(self.recv_mem()));
        // An in-order segment is taken whatever it costs when nothing is left to read
        // (`admit_rcv_mem`, Linux's sk_forced_mem_schedule): one segment is always held.
        let one = self.one_rcv_segment();
        if self.rcvq.is_empty() && self.ooo.is_empty() {
            wnd = wnd.max(one);
        }
        let buf = at_ratio(limit).min(self.cfg.rcv_buf).max(one);
        let threshold = (buf / 2).min(self.snd_mss).max(1);
        // Below `easy` the memory left holds a whole rcv_buf at this ratio: the byte
        // window alone is right (checked with one compare by the callers).
        let need = (u64::from(self.cfg.rcv_buf) << RCV_RATIO_SHIFT).div_ceil(r.max(1));
        // (Out-of-order memory is not in the callers' compare: none while there is any.)
        self.rcv_mem_easy = match (limit as u64).checked_sub(need) {
            Some(e) if self.ooo.is_empty() => (e + 1).min(usize::MAX as u64) as usize,
            _ => 0,
        };
        (self.rcv_wnd().min(wnd), threshold)
    }

    /// The most receive memory this connection may hold under the stack-wide bound, for
    /// the window, as last recorded (`rcv_room`); unbounded once header prediction took
    /// data since without recording it (the bound could not limit this connection then).
    fn rcv_wnd_cap(&self) -> usize {
        let (room, held, at) = self.rcv_room;
        if at == self.rcv_nxt {
            self.rcv_mem_cap(held, room, false)
        } else {
            usize::MAX
        }
    }

    /// The most receive memory this connection may hold under the stack-wide bound,
    /// holding `held` with `room` left below the reserve (see
    /// [`on_segment_path`](Self::on_segment_path)): what it holds plus that room; and, if
    /// its application reads, up to its floor ([`TcpConfig::rcv_mem_min`],
    /// Linux's `tcp_rmem[0]`) out of the reserve. For a segment's admission (`admit`)
    /// the floor is checked before the segment, as Linux's `__sk_mem_raise_allocated`
    /// compares `sk_rmem_alloc` with it: a connection under it may take the segment
    /// whatever it costs (at most one segment past the floor) while the bound itself
    /// has room; for the window, it is the floor itself, so that a peer sending into the
    /// window offered never needs more (`rcv_wnd_mem`).
    ///
    /// Why only readers: a connection whose application never read (it may never read,
    /// or not yet) stops at the free room, so however many such connections there are
    /// they leave the reserve to the readers; those are the connections whose refused
    /// segments cost a retransmission timeout and an application waiting. A reader that
    /// stops reading keeps what it holds, at most its floor plus one segment: all such
    /// connections together are still within the bound (the reserve is part of it).
    pub(super) fn rcv_mem_cap(&self, held: usize, room: isize, admit: bool) -> usize {
        let free = held.saturating_add(room.max(0) as usize);
        if self.rcv_reserve == 0 {
            return free;
        }
        let floor = (self.cfg.rcv_mem_min as usize).min(self.rcv_mem_limit());
        if (admit && held >= floor) || !self.app_reads() {
            return free;
        }
        let to_bound = room.saturating_add(self.rcv_reserve.min(isize::MAX as usize) as isize);
        let to_bound = held.saturating_add(to_bound.max(0) as usize);
        free.max(if admit { to_bound } else { to_bound.min(floor) })
    }

    /// Sets the stack's reserve (`StackConfig::rcv_mem_reserve`; see `rcv_reserve`).
    pub(crate) fn set_rcv_reserve(&mut self, reserve: usize) {
        self.rcv_reserve = reserve;
    }

    /// Whether the application has taken data from this connection: fewer bytes are
    /// queued than were delivered (RCV.NXT past the IRS and the FIN; modulo 2^32, which
    /// may hide a read only after exactly a multiple of 4 GiB was delivered). Read off the
    /// sequence space, so the reads themselves pay nothing for it.
    fn app_reads(&self) -> bool {
        let delivered = (self.rcv_nxt - (self.irs + 1u32)).wrapping_sub(u32::from(self.fin_rcvd));
        self.state.is_synchronized() && delivered as usize > self.rcvq_len
    }

    /// One segment's payload at `rcv_ratio`: the MSS we announced in a buffer 1.5 times
    /// as large (a full-sized segment in a 2 KiB receive buffer), at least one byte. (The
    /// MSS, not the `rcv_mss` learnt: a window below the peer's segment size would wait
    /// on its sender SWS avoidance, RFC 9293 §3.8.6.2.1.)
    fn one_rcv_segment(&self) -> u32 {
        let mss = u32::from(self.cfg.mss).max(1);
        let buf = u64::from(mss) * 3 / 2;
        (((buf * u64::from(self.rcv_ratio)) >> RCV_RATIO_SHIFT) as u32).clamp(1, mss)
    }

    /// Linux's `scaling_ratio` (`tcp_measure_rcv_mss`), measured on all data rather than
    /// full-sized segments only: payload bytes over truesize of what was delivered since
    /// the last sample, once that covers `RCV_RATIO_SAMPLE` of truesize. Taken where the
    /// window is computed from memory, not per segment (a division).
    fn sample_rcv_ratio(&mut self) {
        let (b0, t0) = self.rcv_sample;
        let bytes = self.counters.bytes_in.wrapping_sub(b0);
        let mem = self.rcv_true_in.wrapping_sub(t0);
        // `rcv_true_in` counts modulo 2^32: over 256 KiB of payload its difference may
        // have wrapped (at 16 KiB of truesize per byte), so such a long interval is not
        // sampled, only restarted.
        if bytes >= 256 << 10 {
            self.rcv_sample = (self.counters.bytes_in, self.rcv_true_in);
            return;
        }
        if mem < RCV_RATIO_SAMPLE {
            return;
        }
        let r = (bytes << RCV_RATIO_SHIFT) / u64::from(mem);
        self.rcv_ratio = r.clamp(1, u64::from(RCV_RATIO_ONE)) as u32;
        self.rcv_sample = (self.counters.bytes_in, self.rcv_true_in);
    }

    /// The window used for the acceptability test: what we advertised.
    pub(super) fn rcv_wnd_for_check(&self) -> u32 {
        if self.rcv_adv.gt(self.rcv_nxt) {
            self.rcv_adv - self.rcv_nxt
        } else {
            0
        }
    }

    /// `cap`: the most receive memory this connection may hold under the stack-wide
    /// budget (see [`admit_rcv_mem`](Self::admit_rcv_mem)).
    pub(super) fn on_segment_synchronized(
        &mut self,
        now: Instant,
        seg: &TcpRepr,
        payload: Zbuf,
        cap: usize,
    ) -> Disposition {
        let disposition = self.process(now, seg, payload, cap);
        self.arm_timers(now);
        disposition
    }

    pub(super) fn process(
        &mut self,
        now: Instant,
        seg: &TcpRepr,
        mut payload: Zbuf,
        cap: usize,
    ) -> Disposition {
        let flags = seg.flags;

        // Our SYN-ACK was lost and the peer retransmitted its SYN: answer with the SYN-ACK
        // again rather than a bare ACK (RFC 9293 §3.10.7.4 would ACK; that stalls the peer
        // in SYN-SENT until our RTO).
        if self.state == State::SynReceived && flags.syn() && !flags.ack() && seg.seq == self.irs {
            self.snd_nxt = self.iss;
            return Disposition::Keep;
        }

        // RFC 1337 §3 (fix F1): in TIME-WAIT ignore RST, avoiding TIME-WAIT assassination.
        if self.state == State::TimeWait && flags.rst() {
            self.counters.drop(DropReason::BadRst);
            return Disposition::Keep;
        }

        // RFC 7323 §3.2: once negotiated, a non-RST segment without timestamps SHOULD be
        // dropped. Not a SYN: RFC 5961 §4.2 (and RFC 9293 §3.10.7.4 fourth) answer a SYN in
        // any synchronized state with a challenge ACK, whatever it carries. A SYN is no
        // segment of this connection's timestamp clock: a peer that restarted opens without
        // it, and dropping its SYN silently would leave both ends stuck, while the
        // challenge ACK lets it reset the stale connection (RFC 5961 §4). In TIME-WAIT such
        // a SYN cannot reopen the tuple (see `accepts_new_syn`).
        if let Some(ts) = self.ts {
            match seg.options.timestamps {
                None if !flags.rst() && !flags.syn() && self.state != State::SynReceived => {
                    self.counters.drop(DropReason::Paws);
                    return Disposition::Keep;
                }
                // RFC 7323 §5.3 R1: PAWS — TSval older than TS.Recent (and TS.Recent is
                // valid) makes a non-RST segment unacceptable: ACK and drop. Like Linux
                // (TCP_PAWS_WINDOW) we tolerate one tick: with a 1 ms clock, ordinary
                // reordering delivers segments one tick "old", and dropping them (20% of a
                // kernel peer's ACKs in the interop run) costs far more than it protects —
                // wrapped sequence numbers are 2^31 ticks apart, not one.
                Some(t)
                    if !flags.rst()
                        && (t.tsval.wrapping_sub(ts.recent) as i32) < -PAWS_WINDOW
                        && now.saturating_duration_since(ts.recent_at) < PAWS_IDLE =>
                {
                    self.counters.drop(DropReason::Paws);
                    self.ack_unacceptable(now, seg, payload.len());
                    return Disposition::Keep;
                }
                _ => {}
            }
        }

        // RFC 9293 §3.10.7.4 first: sequence number acceptability.
        let mut seq = seg.seq;
        let len = Self::seg_len(seg, payload.len());
        let wnd = self.rcv_wnd_for_check();
        let acceptable = if len == 0 {
            if wnd == 0 {
                seq == self.rcv_nxt
            } else {
                seq.in_range(self.rcv_nxt, self.rcv_nxt + wnd)
            }
        } else if wnd == 0 {
            // "special allowance should be made to accept valid ACKs, URGs, and RSTs":
            // a zero-window probe at RCV.NXT still has its ACK processed.
            seq == self.rcv_nxt
        } else {
            seq.in_range(self.rcv_nxt, self.rcv_nxt + wnd)
                || (seq + (len - 1)).in_range(self.rcv_nxt, self.rcv_nxt + wnd)
        };
        if !acceptable {
            self.counters.drop(DropReason::OutOfWindow);
            if !flags.rst() {
                // An old duplicate or a segment beyond the window: ACK it (this is also what
                // re-ACKs a retransmitted FIN in TIME-WAIT).
                self.note_old_duplicate(seg.seq, payload.len());
                self.ack_unacceptable(now, seg, payload.len());
                if self.is_fin_retransmission(seg, len) {
                    self.restart_time_wait(now);
                }
            }
            return Disposition::Keep;
        }

        // RFC 9293 §3.10.7.4 second: RST, with RFC 5961 §3.2 exact-match rule.
        if flags.rst() {
            if seq != self.rcv_nxt {
                self.counters.drop(DropReason::BadRst);
                self.challenge_ack(now);
                return Disposition::Keep;
            }
            if self.state == State::SynReceived && self.passive {
                // RFC 9293 §3.10.7.4: a passive SYN-RECEIVED connection returns to LISTEN.
                self.terminate(CloseReason::Reset);
                return Disposition::Remove;
            }
            let reason = match self.state {
                State::SynReceived => CloseReason::Refused,
                // RFC 9293 §3.10.7.4 second (CLOSING, LAST-ACK): enter CLOSED and delete the
                // TCB. The RFC signals no error there, but our FIN (and maybe data before it)
                // was never acknowledged, so the peer may not have received everything: the
                // close reason is a reset (ECONNRESET), as BSD and Linux report. (TIME-WAIT
                // ignored the RST above, RFC 1337.)
                _ => CloseReason::Reset,
            };
            self.sndq.ack_to(self.sndq.end());
            self.terminate(reason);
            return Disposition::Keep;
        }

        // RFC 9293 §3.10.7.4 fourth, SYN-RECEIVED: "If the connection was initiated with a
        // passive OPEN, then return this connection to the LISTEN state and return". The
        // embryonic connection is dropped silently (the listener lives on; a retransmission
        // of the original SYN, SEG.SEQ = IRS, was answered with the SYN-ACK above and never
        // gets here). Nothing is sent, as the RFC says: RFC 5961 §4's challenge ACK is for
        // the synchronized states. Linux's tcp_check_req drops the request too (it also
        // sends a RST; the corpus follows the RFC).
        if flags.syn() && self.state == State::SynReceived && self.passive {
            self.terminate(CloseReason::Reset);
            return Disposition::Remove;
        }

        // RFC 9293 §3.10.7.4 fourth / RFC 5961 §4.2: a SYN in a synchronized state (or in
        // an active SYN-RECEIVED, simultaneous open) gets a challenge ACK regardless of its
        // sequence number.
        if flags.syn() {
            self.challenge_ack(now);
            return Disposition::Keep;
        }

        // RFC 9293 §3.10.7.4 fifth: segments without ACK are dropped.
        if !flags.ack() {
            self.counters.drop(DropReason::NoAck);
            return Disposition::Keep;
        }

        if self.state == State::SynReceived {
            // RFC 9293 §3.10.7.4: SND.UNA < SEG.ACK =< SND.NXT moves to ESTABLISHED.
            if seg.ack.gt(self.snd_una) && seg.ack.le(self.snd_max) {
                self.state = State::Established;
                self.snd_wnd = u32::from(seg.window) << self.snd_wscale;
                self.max_snd_wnd = self.max_snd_wnd.max(self.snd_wnd);
                self.snd_wl1 = seg.seq;
                self.snd_wl2 = seg.ack;
                self.last_wnd_field = seg.window;
                if self.syn_retransmitted {
                    // The SYN-ACK timed out: the passive side of the same rules.
                    self.on_handshake_retransmitted();
                }
                self.events.connected = true;
                self.events.writable = true;
                self.arm_keepalive(now);
                if self.fin_queued {
                    // close() during SYN-RECEIVED: the FIN follows the queued data now.
                    self.state = State::FinWait1;
                }
            } else {
                // RFC 9293 §3.10.7.4: <SEQ=SEG.ACK><CTL=RST>.
                self.counters.drop(DropReason::BadAck);
                self.rst_pending = Some(seg.ack);
                return Disposition::Keep;
            }
        }

        let time_wait = self.state == State::TimeWait;
        if !self.on_ack(now, seg, payload.len()) {
            return Disposition::Keep;
        }
        if time_wait {
            // RFC 9293 §3.10.7.4 fifth (TIME-WAIT): "The only thing that can arrive in this
            // state is a retransmission of the remote FIN. Acknowledge it, and restart the
            // 2 MSL timeout." So any acceptable segment with an acceptable ACK (eighth, FIN:
            // restart too). Data cannot be delivered after the FIN (seventh). A pure ACK is
            // answered under the out-of-window ACK limit, as Linux does in TIME-WAIT
            // (tcp_timewait_check_oow_rate_limit): two desynchronized ends must not ACK
            // each other's ACKs forever.
            if !payload.is_empty() {
                self.counters.drop(DropReason::DataAfterFin);
            }
            self.update_ts_recent_checked(now, seg, len);
            self.ack_unacceptable(now, seg, payload.len());
            self.restart_time_wait(now);
            return Disposition::Keep;
        }
        // RFC 7323 §4.3 (2): TS.Recent takes SEG.TSval when the segment covers Last.ACK.sent.
        // Done after the ACK check rather than in the first check as RFC 7323 Appendix D
        // sketches: RFC 5961 §5.2 discards a segment whose ACK is unacceptable, and updating
        // earlier would let a blind segment with a guessed in-window SEQ poison TS.Recent so
        // that PAWS drops the real peer.
        self.update_ts_recent_checked(now, seg, len);
        // RFC 9293 §3.8.4: the peer is alive. Only a segment that passed the sequence and
        // ACK checks counts: dropped junk (spoofed or stale) must not postpone the probes.
        if matches!(self.state, State::Established | State::CloseWait)
            && self.timers.is_armed(Timer::Keepalive)
        {
            self.arm_keepalive(now);
        }
        if self.snd_wnd == 0 && !self.orphaned {
            // The peer answers our zero-window probes: it is alive (RFC 9293 §3.8.6.1 MUST
            // NOT close the connection while probes are acknowledged). RFC 6429 / RFC 9293
            // §3.8.6.1: that does not stop reclaiming resources, so an orphan's probes keep
            // counting toward max_retries and a peer holding the window shut cannot pin it.
            self.retries = 0;
        }
        if self.state == State::Closed {
            return Disposition::Keep;
        }

        // RFC 9293 §3.10.7.4 seventh: segment text, in ESTABLISHED, FIN-WAIT-1, FIN-WAIT-2.
        let mut fin = flags.fin();
        if !payload.is_empty() || fin {
            match self.state {
                State::Established | State::FinWait1 | State::FinWait2 => {}
                _ => {
                    // CLOSE-WAIT, CLOSING, LAST-ACK (TIME-WAIT returned above; a CLOSING
                    // connection whose FIN this segment acknowledged is now in TIME-WAIT
                    // too): the peer already sent FIN. RFC 9293 §3.10.7.4 seventh: "This
                    // should not occur since a FIN has been received from the remote side.
                    // Ignore the segment text" (eighth, FIN, likewise: the FIN was taken).
                    // The segment was acceptable (an unacceptable one was ACKed by the first
                    // check) and its ACK has been processed; nothing is sent for its text,
                    // as Linux stays silent (tcp_data_queue drops data after the FIN).
                    if !payload.is_empty() {
                        self.counters.drop(DropReason::DataAfterFin);
                        return Disposition::Keep;
                    }
                    // A bare FIN past the peer's FIN. CLOSING, fifth: "if the ACK
                    // acknowledges our FIN, then enter the TIME-WAIT state; otherwise,
                    // ignore the segment". CLOSE-WAIT and LAST-ACK (and the TIME-WAIT just
                    // entered, eighth) still acknowledge it: a FIN beyond RCV.NXT is out of
                    // order, and RFC 5681 §4.2's immediate duplicate ACK resynchronizes a
                    // peer that lost track of its own FIN.
                    if self.state != State::Closing {
                        self.ack_now = true;
                    }
                    return Disposition::Keep;
                }
            }
            // Trim what we already have (before RCV.NXT).
            if seq.lt(self.rcv_nxt) {
                let dup = (self.rcv_nxt - seq) as usize;
                if dup >= payload.len() {
                    // Only the FIN (or nothing) remains new.
                    if !payload.is_empty() {
                        // RFC 2883 §4: report the duplicate with a D-SACK.
                        self.ooo.note_duplicate(seq, seq + payload.len());
                    }
                    payload.advance(payload.len());
                } else {
                    self.ooo.note_duplicate(seq, self.rcv_nxt);
                    payload.advance(dup);
                }
                seq = self.rcv_nxt;
            }
            // Trim what lies beyond the window (RFC 9293 §3.10.7.4: "keep only the portion
            // within the window").
            let wnd = self.rcv_wnd_for_check().max(self.rcv_wnd());
            let room = (self.rcv_nxt + wnd) - seq;
            if payload.len() as u32 > room {
                self.counters.drop(DropReason::RcvBufFull);
                payload.truncate(room as usize);
                fin = false;
            }
            // Receive memory (Linux's tcp_try_rmem_schedule): a segment whose buffer would
            // take the held memory past its bound, or past what the stack-wide budget
            // leaves this connection (`cap`), is dropped before it is acknowledged, its
            // FIN with it, unless collapsing makes room; data already acknowledged is
            // never given up.
            if !payload.is_empty()
                && self.recv_mem() + payload.truesize() > self.rcv_mem_limit().min(cap)
                && !self.admit_rcv_mem(&mut payload, seq, cap)
            {
                return Disposition::Keep;
            }
            if fin {
                let fseq = seq + payload.len();
                self.fin_seq = Some(fseq);
            }
            if seq == self.rcv_nxt {
                // RFC 5681 §4.2: a segment that fills in all or part of a gap is ACKed at
                // once (the sender is in loss recovery and waits for it), not delayed.
                let fills_gap = !payload.is_empty() && !self.ooo.is_empty();
                let payload_len = payload.len() as u32;
                self.note_true_in(payload.truesize());
                self.deliver(payload);
                // Anything out of order that is now contiguous follows (RFC 9293 §3.10.7.4).
                while let Some(more) = self.ooo.pop_ready(self.rcv_nxt) {
                    self.note_true_in(more.truesize());
                    self.deliver(more);
                }
                if fills_gap {
                    self.ack_now = true;
                } else {
                    self.schedule_ack(now, len > 0, payload_len);
                }
            } else {
                // Out of order: queue it and send an immediate duplicate ACK with SACK
                // (RFC 5681 §4.2: an out-of-order segment SHOULD be acked immediately).
                if !payload.is_empty() {
                    let outcome = self.ooo.insert(self.rcv_nxt, seq, payload);
                    if outcome.dropped > 0 {
                        self.counters.drop(DropReason::OooFull);
                    }
                }
                self.ack_now = true;
                self.dupacks_owed = (self.dupacks_owed + 1).min(MAX_DUPACKS_OWED);
            }
            // RFC 9293 §3.10.7.4 eighth: FIN in sequence.
            if let Some(fseq) = self.fin_seq {
                if !self.fin_rcvd && fseq == self.rcv_nxt {
                    self.on_fin(now);
                }
            }
            // RFC 9293 §3.6.1 (SHLD-3): data received after the application closed (and
            // released) the connection can never be read: send a RST to show it was lost,
            // rather than ACK it and let the peer believe it was delivered.
            if self.orphaned && self.rcvq_len > 0 {
                self.abort();
            }
        }
        Disposition::Keep
    }

    /// Adds a delivered buffer's truesize to `rcv_true_in` (the callers of `deliver`:
    /// header prediction adds a segment's or a run's at once).
    fn note_true_in(&mut self, mem: usize) {
        self.rcv_true_in = self.rcv_true_in.wrapping_add(mem as u32);
    }

    pub(super) fn deliver(&mut self, buf: Zbuf) {
        self.deliver_inline(buf);
    }

    /// [`deliver`](Self::deliver), inlined into header prediction's loops (a call per
    /// segment cost more than its body).
    #[inline(always)]
    fn deliver_inline(&mut self, buf: Zbuf) {
        if buf.is_empty() {
            return;
        }
        self.rcv_nxt += buf.len();
        self.rcvq_len += buf.len();
        self.rcvq_mem += buf.truesize();
        self.counters.bytes_in += buf.len() as u64;
        self.rcvq.push_back(buf);
        self.events.readable = true;
    }

    /// `payload`, at `seq`, would take [`Connection::recv_mem`] past its bound, or past
    /// `cap`, what the stack-wide budget (`StackConfig::rcv_mem_total`) leaves this
    /// connection: make room as Linux's `tcp_prune_queue` does and say whether it may be
    /// queued now. First collapse: copy tiny segments out of their receive buffers into
    /// compact ones (both queues, then the payload itself); the data stays held. If an
    /// in-order segment still does not fit, out-of-order data is given up from the
    /// highest down (reneging, RFC 2018 §8: isolated tiny segments, each with its own
    /// small buffer, can still fill the bound), since in-order data is what lets the
    /// application make progress; an out-of-order one is dropped instead. An in-order
    /// segment with nothing left to read is taken whatever it costs, under either bound
    /// (Linux's `sk_forced_mem_schedule`: every reading application makes progress).
    /// Counted: `rcv_collapsed`, `rcv_collapsed_bytes`, `rcv_pruned`, and a refusal as
    /// [`DropReason::RcvMemory`] when the connection's own bound refused it, else
    /// [`DropReason::RcvMemoryGlobal`] (it would have fit its own bound: the stack-wide
    /// one refused it).
    #[cold]
    #[inline(never)]
    pub(super) fn admit_rcv_mem(&mut self, payload: &mut Zbuf, seq: SeqNum, cap: usize) -> bool {
        let arrived = payload.truesize();
        let ok = self.admit_rcv_mem_inner(payload, seq, cap);
        if ok {
            // The ratio is of the data as it arrives (`rcv_true_in`): a payload copied
            // here counts its receive buffer, not its copy.
            let copied = arrived.saturating_sub(payload.truesize());
            self.rcv_true_in = self.rcv_true_in.wrapping_add(copied as u32);
        }
        ok
    }

    fn admit_rcv_mem_inner(&mut self, payload: &mut Zbuf, seq: SeqNum, cap: usize) -> bool {
        let own = self.rcv_mem_limit();
        let limit = own.min(cap);
        self.collapse_rcv_mem();
        if self.recv_mem() + payload.truesize() <= limit {
            return true;
        }
        if !payload.compact() {
            let compact = <Zbuf as Payload>::concat(core::slice::from_ref(payload));
            self.counters.rcv_collapsed += 1;
            self.counters.rcv_collapsed_bytes += compact.len() as u64;
            *payload = compact;
            if self.recv_mem() + payload.truesize() <= limit {
                return true;
            }
        }
        if seq != self.rcv_nxt {
            self.refuse_rcv_mem(payload, own);
            return false;
        }
        let room = limit.saturating_sub(self.rcvq_mem + payload.truesize());
        self.counters.rcv_pruned += self.ooo.prune(seq, room) as u64;
        // Linux's sk_forced_mem_schedule: with nothing to read the application cannot
        // free anything, so the in-order segment is taken whatever it costs (at most one
        // buffer past the bound: all else held was pruned).
        if self.recv_mem() + payload.truesize() <= limit || self.rcvq.is_empty() {
            return true;
        }
        self.refuse_rcv_mem(payload, own);
        false
    }

    /// Counts the refusal of `payload`: under the connection's own bound (`own`) if it
    /// would not have fit there either, else under the stack-wide one; and has a zero
    /// window sent for it.
    fn refuse_rcv_mem(&mut self, payload: &Zbuf, own: usize) {
        let reason = if self.recv_mem() + payload.truesize() > own {
            DropReason::RcvMemory
        } else {
            DropReason::RcvMemoryGlobal
        };
        self.counters.drop(reason);
        // Answered at once with a zero window (see `WndNoMem`).
        self.wnd_nomem = WndNoMem::Pending;
        self.ack_now = true;
    }

    /// Copies the receive queue's and the out-of-order queue's sparse buffers (tiny
    /// segments in whole receive buffers) into compact ones, releasing the receive buffers.
    fn collapse_rcv_mem(&mut self) {
        let ooo = self.ooo.collapse();
        let mut run = Compactor::new();
        if self.rcvq.iter().any(Payload::sparse) {
            let old = core::mem::take(&mut self.rcvq);
            let mut out = VecDeque::with_capacity(old.len());
            for z in old {
                if z.sparse() && run.fits(&z) {
                    run.push(z);
                    continue;
                }
                if let Some(m) = run.take() {
                    out.push_back(m);
                }
                if z.sparse() {
                    run.push(z);
                } else {
                    out.push_back(z);
                }
            }
            if let Some(m) = run.take() {
                out.push_back(m);
            }
            // Shrunk to what it holds now (it may have grown to one entry per byte).
            self.rcvq = out;
            self.rcvq_mem = self.rcvq_mem - run.freed + run.added;
        }
        self.counters.rcv_collapsed += (ooo.buffers + run.done.buffers) as u64;
        self.counters.rcv_collapsed_bytes += (ooo.bytes + run.done.bytes) as u64;
        // The memory freed may open the window: say so now (as a read does).
        if ooo.buffers + run.done.buffers > 0
            && self.wnd_nomem == WndNoMem::No
            && self.window_grew()
        {
            self.ack_now = true;
        }
    }

    pub(super) fn on_fin(&mut self, now: Instant) {
        self.fin_rcvd = true;
        self.rcv_nxt += 1u32;
        self.ack_now = true;
        self.events.readable = true;
        match self.state {
            State::SynReceived | State::Established => self.state = State::CloseWait,
            State::FinWait1 => {
                // Our FIN not yet acknowledged (else on_ack moved us to FIN-WAIT-2).
                self.state = State::Closing;
            }
            State::FinWait2 => self.enter_time_wait(now),
            _ => {}
        }
    }

    /// The ACK owed for in-sequence text or a FIN (`has_data`); `payload_len` is the
    /// segment's payload.
    pub(super) fn schedule_ack(&mut self, now: Instant, has_data: bool, payload_len: u32) {
        if !has_data {
            return;
        }
        match self.cfg.delayed_ack {
            // RFC 9293 §3.8.6.3 / RFC 5681 §4.2: ACK at least every second full-sized
            // segment and within the delayed-ACK timeout. Full-sized as the peer sends them:
            // its segments carry options (1,448 bytes under a 1,460 MSS with timestamps), so
            // the size is learnt from the largest payload received (Linux's rcv_mss), not
            // taken from an MSS.
            Some(d) => {
                self.rcv_mss = self.rcv_mss.max(payload_len.min(u32::from(self.cfg.mss)));
                if self.rcv_nxt - self.last_ack_sent >= 2 * self.rcv_mss.max(1) {
                    self.ack_now = true;
                } else if !self.timers.is_armed(Timer::DelayedAck) {
                    self.timers.set(Timer::DelayedAck, now + d);
                }
            }
            None => self.ack_now = true,
        }
    }

    /// RFC 2883 §4: data entirely below RCV.NXT (a spurious retransmission) is reported with a
    /// D-SACK. Only plausible duplicates, within one receive buffer below RCV.NXT, are.
    pub(super) fn note_old_duplicate(&mut self, seq: SeqNum, payload_len: usize) {
        let end = seq + payload_len;
        let reach = self.cfg.rcv_buf.max(u32::from(u16::MAX));
        if payload_len > 0 && end.le(self.rcv_nxt) && self.rcv_nxt - seq <= reach {
            self.ooo.note_duplicate(seq, end);
        }
    }

    /// The ACK owed for an unacceptable segment (RFC 9293 §3.10.7.4 first check, RFC 7323
    /// §5.3 PAWS). A segment with data or a FIN is acknowledged at once: the peer's
    /// retransmissions and a FIN repeated into TIME-WAIT depend on it. Anything else is a
    /// pure ACK (or a SYN): answering each one lets two desynchronized endpoints answer each
    /// other's ACKs forever, so those replies are rate limited per connection
    /// (`oow_ack_interval`), and a SYN gets a rate-limited challenge ACK (RFC 5961 §4.2:
    /// whatever its sequence number).
    pub(super) fn ack_unacceptable(&mut self, now: Instant, seg: &TcpRepr, payload_len: usize) {
        if payload_len > 0 || seg.flags.fin() {
            self.ack_now = true;
            return;
        }
        if seg.flags.syn() {
            self.challenge_ack(now);
            return;
        }
        if self
            .oow_ack_at
            .is_some_and(|at| now.saturating_duration_since(at) < self.cfg.oow_ack_interval)
        {
            self.counters.oow_acks_suppressed += 1;
            return;
        }
        self.oow_ack_at = Some(now);
        self.ack_now = true;
    }

    /// RFC 5961 §7: challenge ACKs, rate limited per connection per second.
    pub(super) fn challenge_ack(&mut self, now: Instant) {
        if now.saturating_duration_since(self.challenge.0) >= Duration::from_secs(1) {
            self.challenge = (now, 0);
        }
        if self.challenge.1 < self.cfg.challenge_ack_limit {
            self.challenge.1 += 1;
            self.counters.challenge_acks += 1;
            self.ack_now = true;
        } else {
            self.counters.challenge_acks_suppressed += 1;
        }
    }

    pub(super) fn update_ts_recent(&mut self, now: Instant, opts: &TcpOptions, _seq: SeqNum) {
        if let (Some(ts), Some(t)) = (self.ts.as_mut(), opts.timestamps) {
            ts.recent = t.tsval;
            ts.recent_at = now;
        }
    }

    /// RFC 7323 §4.3: TS.Recent takes SEG.TSval when SEG.SEQ =< Last.ACK.sent < SEG.SEQ + len
    /// (with zero-length segments covering Last.ACK.sent when SEG.SEQ equals it).
    pub(super) fn update_ts_recent_checked(&mut self, now: Instant, seg: &TcpRepr, len: u32) {
        let Some(t) = seg.options.timestamps else {
            return;
        };
        let Some(ts) = self.ts.as_mut() else { return };
        let covers = seg.seq.le(self.last_ack_sent) && self.last_ack_sent.le(seg.seq + len);
        if covers && (t.tsval.wrapping_sub(ts.recent) as i32) >= 0 {
            ts.recent = t.tsval;
            ts.recent_at = now;
        }
    }

    /// RFC 9293 §3.10.7.4 fifth: the ACK field. Returns false when the segment must be dropped.
    pub(super) fn on_ack(&mut self, now: Instant, seg: &TcpRepr, payload_len: usize) -> bool {
        let ack = seg.ack;
        // RFC 5961 §5.2: acceptable iff SND.UNA - MAX.SND.WND =< SEG.ACK =< SND.NXT.
        if ack.gt(self.snd_max) {
            self.counters.drop(DropReason::BadAck);
            self.challenge_ack(now);
            return false;
        }
        if ack.lt(self.snd_una - self.max_snd_wnd.max(1)) {
            self.counters.drop(DropReason::BadAck);
            self.challenge_ack(now);
            return false;
        }

        let blocks: &[(SeqNum, SeqNum)] = if self.sack_ok {
            seg.options.sack_blocks.as_slice()
        } else {
            &[]
        };
        let high_before = self.sb.highest_sacked();
        let sack_info = self.sb.on_ack(ack, blocks);
        if let Some((l, r)) = sack_info.dsack {
            self.counters.dsacks += 1;
            self.undo.on_dsack(l, r);
            self.tlp_on_dsack(l, r, ack);
            // RFC 8985 §6.2 step 4: the window grows once per round trip that sees D-SACKs.
            // The round is still on while its end is outstanding (a round passed 2 GiB ago
            // must not look pending: compared modulo 2^32, `snd_una.ge(round)` would not say).
            let pending = self
                .dsack_round
                .is_some_and(|round| round.gt(self.snd_una) && round.le(self.snd_max));
            if !pending {
                self.dsack_round = Some(self.snd_max);
                self.rack_on_dsack();
            }
        }
        self.undo_on_ack(ack, high_before, seg);
        // Before this ACK can start a new recovery (which replaces the episode).
        if self.recovery.is_none() && self.undo.all_dsacked() {
            self.undo_spurious_recovery();
        }

        if ack == self.snd_una && self.tlp.is_some() {
            // Before the duplicate-ACK count below can start a recovery.
            self.tlp_on_dup_ack(ack, seg, payload_len, blocks);
        }
        if ack.gt(self.snd_una) {
            self.on_new_ack(now, ack);
        } else if ack == self.snd_una && self.snd_max.gt(self.snd_una) {
            // RFC 5681 §2 duplicate ACK: no data, no SYN/FIN, same window, data outstanding.
            // RFC 6675 §5: with SACK, an ACK that SACKs new data counts too.
            let classic_dup = payload_len == 0
                && !seg.flags.syn()
                && !seg.flags.fin()
                && seg.window == self.last_wnd_field
                && self.snd_wnd != 0;
            let sack_dup = sack_info.newly_sacked_bytes > 0;
            if classic_dup || sack_dup {
                // Bounded: a flood of duplicate ACKs cannot overflow the counter.
                self.dupacks = self.dupacks.saturating_add(1);
                if self.recovery.is_some() && !self.sack_ok {
                    // RFC 6582 §3.2 step 4: each further duplicate ACK inflates the window.
                    self.inflation.on_dup_ack(self.snd_mss);
                }
                if self.recovery.is_none() {
                    let lost = self.sack_ok && self.sb.is_lost(self.snd_una);
                    // RFC 6675 §5: DupThresh, adapted to measured reordering with SACK.
                    let dup_thresh = if self.sack_ok {
                        self.sb.dup_thresh()
                    } else {
                        DUP_THRESH
                    };
                    // RFC 6582 §3.2 step 2: only if SND.UNA passed the previous `recover`.
                    if (self.dupacks >= dup_thresh || lost) && self.snd_una.ge(self.last_recover) {
                        self.enter_recovery(now);
                    }
                }
            }
        }

        if self.recovery.is_none() && self.tlp.is_some() {
            self.tlp_on_sack(now);
        }
        if self.recovery.is_none() && sack_info.newly_sacked_bytes > 0 {
            self.arm_reordering_timer(now);
        }

        if self
            .sb
            .ranges()
            .first()
            .is_some_and(|&(s, _)| s.le(self.snd_una))
        {
            // RFC 2018 §8: the receiver may discard data it has SACKed. A SACKed range at
            // SND.UNA means the cumulative ACK stopped on data it reported holding: it
            // reneged. RFC 6675 §5.1 lets SACK information outlive an RTO only with such a
            // test, so forget it all, and resend the left edge now instead of waiting for
            // the RTO to find it.
            self.sb.clear_sacks();
            self.counters.sack_renegings += 1;
            self.rexmit_now = Some(self.snd_una);
        }

        if self.recovery.is_none() && self.undo.all_dsacked() {
            self.undo_spurious_recovery();
        }

        // RFC 9293 §3.10.7.4: window update if SND.UNA =< SEG.ACK and SND.WL1 < SEG.SEQ or
        // (SND.WL1 = SEG.SEQ and SND.WL2 =< SEG.ACK). An older ACK, which the RFC 5961 §5.2
        // range lets through, is a duplicate that updates nothing, not even the window that
        // RFC 5681 §2's duplicate test compares with (it would hide the next real one).
        if ack.ge(self.snd_una) {
            if self.snd_wl1.lt(seg.seq) || (self.snd_wl1 == seg.seq && self.snd_wl2.le(ack)) {
                let wnd = u32::from(seg.window) << self.snd_wscale;
                if self.snd_wnd == 0 && wnd > 0 {
                    self.timers.clear(Timer::Persist);
                    self.persist_backoff = 0;
                }
                self.snd_wnd = wnd;
                self.max_snd_wnd = self.max_snd_wnd.max(wnd);
                self.snd_wl1 = seg.seq;
                self.snd_wl2 = ack;
            }
            self.last_wnd_field = seg.window;
        }

        // FIN acknowledgment transitions (RFC 9293 §3.10.7.4 fifth, per state).
        let fin_acked = self.fin_queued && self.snd_una == self.sndq.end() + 1u32;
        match self.state {
            State::FinWait1 if fin_acked => self.state = State::FinWait2,
            State::Closing if fin_acked => self.enter_time_wait(now),
            State::LastAck if fin_acked => {
                self.terminate(CloseReason::Normal);
                return false;
            }
            _ => {}
        }
        true
    }

    /// RFC 9293 §3.10.7.4 fifth, SND.UNA < SEG.ACK =< SND.NXT: new data acknowledged. Shared
    /// by the full path and header prediction.
    #[inline]
    pub(super) fn on_new_ack(&mut self, now: Instant, ack: SeqNum) {
        let in_flight_before = self.snd_max - self.snd_una;
        let una_before = self.snd_una;
        let acked = ack - self.snd_una;
        // The SYN occupies the first sequence number; FIN the one after the data.
        self.sndq.ack_to(ack);
        self.snd_una = ack;
        if self.snd_nxt.lt(self.snd_una) {
            self.snd_nxt = self.snd_una;
        }
        self.retries = 0;
        self.icmp_soft = None;
        self.persist_backoff = 0;
        self.lt_bytes = 0;
        self.keepalive.probes_sent = 0;
        self.take_rtt_sample(now, ack);
        self.events.writable = true;
        match self.recovery {
            Some(recover) if ack.ge(recover) => {
                // RFC 6582 §3.2 step 3 (full acknowledgment) / RFC 6675 §5: exit recovery.
                self.recovery = None;
                self.last_recover = recover;
                self.dupacks = 0;
                self.rack_on_recovery_exit();
                self.cc.on_exit_recovery(now, self.snd_max - self.snd_una);
            }
            Some(_) => {
                // RFC 6582 §3.2 step 3 (partial acknowledgment): retransmit the first
                // unacknowledged segment and deflate. With SACK, NextSeg drives
                // retransmissions.
                if !self.sack_ok {
                    self.rexmit_now = Some(self.snd_una);
                    self.inflation.on_partial_ack(acked, self.snd_mss);
                }
            }
            None => {
                self.dupacks = 0;
                // RTO recovery (`on_rto` set `last_recover` to SND.MAX) ends once SND.UNA
                // passes it (RFC 8985 §6.2 step 4 counts it as fast recovery's end is).
                if una_before.lt(self.last_recover) && ack.ge(self.last_recover) {
                    self.rack_on_recovery_exit();
                }
                // `recover` is compared modulo 2^32 (SND.UNA >= it, RFC 6582 §3.2 step 2):
                // once passed, it follows SND.UNA, else 2 GiB later the test turns false and
                // no recovery could start for the next 2 GiB.
                if ack.gt(self.last_recover) {
                    self.last_recover = ack;
                }
                let app_limited = self.sndq.end().le(self.snd_max) && !self.fin_queued;
                self.cc
                    .on_ack(now, acked, &self.rtt, in_flight_before, app_limited);
            }
        }
        self.tlp_on_new_ack(now, ack);
        // RFC 6298 §5.2/5.3: stop the timer when all is acknowledged, else restart it;
        // RFC 8985 §7.2: the probe timeout with it.
        if self.snd_una == self.snd_max {
            self.timers.clear(Timer::Rto);
        } else {
            self.timers.set(Timer::Rto, now + self.rto());
            self.arm_pto(now);
        }
    }

    pub(super) fn enter_recovery(&mut self, now: Instant) {
        // RFC 5681 §3.2 step 2: what limited transmit sent MUST NOT count in FlightSize.
        let in_flight = (self.snd_max - self.snd_una).saturating_sub(self.lt_bytes);
        self.lt_bytes = 0;
        self.recovery = Some(self.snd_max);
        // RFC 8985 §7: recovery takes over from a probe episode (and reduces the window).
        self.tlp = None;
        self.send_tlp = false;
        self.cc.on_enter_recovery(now, in_flight);
        self.sb.on_enter_recovery();
        self.inflation = RecoveryInflation::on_enter(self.snd_mss);
        // RFC 5681 §3.2 step 2 / RFC 6675 §5 (4.2): retransmit the first unacknowledged
        // segment now.
        self.rexmit_now = Some(self.snd_una);
        self.counters.fast_retransmits += 1;
        if self.sack_ok {
            self.counters.sack_recoveries += 1;
            // RFC 3708 §3: watch this episode's retransmissions for D-SACKs. A previous
            // episode not yet proven spurious can no longer be undone: the CC saved its state
            // anew for this reduction.
            self.undo.start(self.snd_una);
        } else {
            self.undo.active = false;
        }
    }

    /// Entering ESTABLISHED after the timer retransmitted our SYN or SYN-ACK: RFC 6298
    /// §5.7 (an RTO under 3 s is re-initialised to 3 s when data transmission begins) and
    /// RFC 5681 §3.1 / RFC 6928 §2 (the window after a lost SYN or SYN-ACK is one segment).
    fn on_handshake_retransmitted(&mut self) {
        self.rtt.on_handshake_retransmitted(&self.cfg.rtt);
        self.cc.on_handshake_loss();
    }

    pub(super) fn take_rtt_sample(&mut self, now: Instant, ack: SeqNum) {
        if let Some((end, sent)) = self.rtt_probe {
            if ack.ge(end) {
                self.rtt.on_sample(
                    &self.cfg.rtt,
                    now,
                    now.saturating_duration_since(sent),
                    SampleSource::Fresh,
                );
                self.rtt_probe = None;
            }
        }
    }

    pub(super) fn enter_time_wait(&mut self, now: Instant) {
        self.state = State::TimeWait;
        self.timers.clear(Timer::Rto);
        self.timers.clear(Timer::Persist);
        self.timers.clear(Timer::FinWait2);
        self.restart_time_wait(now);
        self.close_reason.get_or_insert(CloseReason::Normal);
        self.events.closed = true;
    }

    /// RFC 9293 §3.10.7.4 (TIME-WAIT): "The only thing that can arrive in this state is a
    /// retransmission of the remote FIN. Acknowledge it, and restart the 2 MSL timeout." A
    /// retransmitted FIN ends exactly at RCV.NXT, below the window, so it fails the first
    /// (sequence) check; of the other unacceptable segments none restarts the timer, so
    /// stray or spoofed ones cannot keep the tuple in TIME-WAIT (RFC 9293 §3.10.7.4 first:
    /// they are only acknowledged).
    pub(super) fn is_fin_retransmission(&self, seg: &TcpRepr, len: u32) -> bool {
        self.state == State::TimeWait && seg.flags.fin() && seg.seq + len == self.rcv_nxt
    }

    pub(super) fn restart_time_wait(&mut self, now: Instant) {
        if self.state == State::TimeWait {
            self.timers.set(Timer::TimeWait, now + self.cfg.time_wait);
        }
    }
}
