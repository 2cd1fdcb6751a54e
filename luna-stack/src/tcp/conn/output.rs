//! Segment generation: what `poll_segment` sends next (control segments, retransmissions
//! per RFC 6675 NextSeg, new data under the windows and Nagle, window probes, ACKs).

use super::*;

/// What a retransmission is for (RFC 6675 §4 treats the rescue retransmission apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rexmit {
    /// NextSeg rules 1 and 3, fast retransmit, partial ACK: HighRxt moves.
    Normal,
    /// NextSeg rule 4: HighRxt stays.
    Rescue,
    /// A tail loss probe (RFC 8985 §7.3, outside recovery): HighRxt stays, and no
    /// recovery episode watches it for D-SACK undo (`tlp.rs` does).
    Probe,
}

#[cfg(test)]
thread_local! {
    /// Whether [`Connection::poll_pure_ack`] may take its fast path: tests turn it off to
    /// compare it with the general path.
    pub(crate) static PURE_ACK_FAST_PATH: core::cell::Cell<bool> = const { core::cell::Cell::new(true) };
    /// How many ACKs the fast path sent on this thread (tests).
    pub(crate) static PURE_ACK_HITS: core::cell::Cell<u64> = const { core::cell::Cell::new(0) };
}

/// Header bytes of the timestamps option as emitted (NOP, NOP, kind, length, 8 bytes).
const TS_OPTION_LEN: u32 = 12;

/// Bytes a set of options occupies in the header, exactly as the emitter lays them out
/// (NOP-aligned, RFC 9293 §3.1). Counting them without the NOPs undercounted TS + SACK by 4
/// and produced frames 4 bytes over the MTU during loss recovery.
pub(super) fn options_len(opts: &TcpOptions) -> u32 {
    opts.buffer_len() as u32
}

impl Connection {
    /// The next segment to send, or `None` when there is nothing (more) to send now. The stack
    /// calls this until it returns `None` (or the device is full) after every input.
    #[must_use]
    pub fn poll_segment(&mut self, now: Instant) -> Option<OutSegment> {
        let mut out = OutSegment::default();
        self.poll_segment_into(now, &mut out).then_some(out)
    }

    /// [`poll_segment`](Self::poll_segment) writing into a caller's slot: on `true` the next
    /// segment is in `out` (its previous payload is dropped); on `false` there is nothing to
    /// send and `out` is untouched. The segment is built where the caller keeps it, so its
    /// header and io-vector are not moved on the way out.
    #[must_use]
    pub fn poll_segment_into(&mut self, now: Instant, out: &mut OutSegment) -> bool {
        self.poll_burst_into(now, out, 1)
    }

    /// Whether the connection's only output is the ACK that is due: what `next_segment`
    /// tests before it reaches `ack_segment_if_due`, for the ESTABLISHED state with
    /// nothing but the ACK to send; and `data_options` adds no SACK blocks. (New data
    /// first: a response that carries the ACK it owes fails here.)
    #[inline]
    pub(crate) fn owes_pure_ack(&self) -> bool {
        self.ack_now
            && !self.sndq.end().gt(self.snd_nxt)
            && self.state == State::Established
            && self.snd_nxt == self.snd_max
            && !self.fin_queued
            && self.rst_pending.is_none()
            && self.dupacks_owed == 0
            && self.rexmit_now.is_none()
            && !self.send_window_probe
            && !self.send_keepalive
            && !self.send_tlp
            && self.recovery.is_none()
            && !(self.sack_ok && self.ooo.has_sack_info())
    }

    /// The pure-ACK fast path of [`poll_burst_into`](Self::poll_burst_into): when an
    /// established connection's only output is the ACK that is due (no data, FIN, RST,
    /// retransmission, probe, duplicate ACK or SACK information to send), writes that
    /// ACK's header into `out.repr`, with what `poll_burst_into` does after it, and returns
    /// true; `out` must hold no payload and no burst (a fresh [`OutSegment`]). It is the
    /// segment the general path would send, by the same steps: after it
    /// [`nothing_to_send`](Self::nothing_to_send) is true. Otherwise it returns false and
    /// changes nothing.
    #[inline]
    pub(crate) fn poll_pure_ack(&mut self, now: Instant, out: &mut OutSegment) -> bool {
        debug_assert!(out.payload.is_empty() && out.burst_piece == 0);
        #[cfg(test)]
        if !PURE_ACK_FAST_PATH.with(core::cell::Cell::get) {
            return false;
        }
        if !self.owes_pure_ack() {
            return false;
        }
        #[cfg(test)]
        PURE_ACK_HITS.with(|c| c.set(c.get() + 1));
        // `segment`: the options, the window, the header.
        let timestamps = self.ts.map(|ts| Timestamps {
            tsval: self.ts_clock(now, ts.offset),
            tsecr: ts.recent,
        });
        let window = self.advertise_window(false);
        out.repr = TcpRepr {
            src_port: self.tuple.local.port(),
            dst_port: self.tuple.remote.port(),
            seq: self.seq_for_control(),
            ack: self.rcv_nxt,
            flags: TcpFlags::ACK,
            window,
            urgent: 0,
            options: TcpOptions {
                timestamps,
                ..TcpOptions::default()
            },
        };
        // `poll_burst_into` after a pure ACK (no sequence space, no SACK blocks, no
        // duplicate ACK owed).
        self.counters.segs_out += 1;
        self.ack_now = false;
        self.timers.clear(Timer::DelayedAck);
        self.last_ack_sent = self.rcv_nxt;
        self.arm_timers(now);
        true
    }

    /// [`poll_segment_into`](Self::poll_segment_into) that may return a burst of up to
    /// `max_segs` segments of new data from one send decision ([`TcpConfig::send_burst`]
    /// is what the stack passes): then `out.burst_piece()` is the payload bytes per
    /// segment and the caller cuts the segments (the stack's software segmentation).
    /// The segments are those that as many calls with `max_segs` 1 would return at this
    /// instant; a burst is never a retransmission, never sent in loss recovery and never
    /// carries SACK blocks.
    ///
    /// [`TcpConfig::send_burst`]: crate::tcp::TcpConfig::send_burst
    #[must_use]
    pub fn poll_burst_into(&mut self, now: Instant, out: &mut OutSegment, max_segs: u32) -> bool {
        out.burst_piece = 0;
        if out.payload.is_empty() && self.poll_pure_ack(now, out) {
            return true;
        }
        self.poll_burst_general(now, out, max_segs)
    }

    /// [`poll_burst_into`](Self::poll_burst_into) without the pure-ACK fast path (the
    /// stack tries [`poll_pure_ack`](Self::poll_pure_ack) first itself).
    #[inline]
    pub(crate) fn poll_burst_general(
        &mut self,
        now: Instant,
        out: &mut OutSegment,
        max_segs: u32,
    ) -> bool {
        out.burst_piece = 0;
        if !self.next_segment(now, out, max_segs) {
            self.arm_timers(now);
            return false;
        }
        let seg = &*out;
        // Data, SYN or FIN: the segment occupies sequence space (and is no pure ACK).
        let occupies = !seg.payload.is_empty() || seg.repr.flags.syn() || seg.repr.flags.fin();
        self.counters.segs_out += match seg.burst_piece {
            0 => 1,
            piece => (seg.payload.len() as u64).div_ceil(u64::from(piece)),
        };
        self.counters.bytes_out += seg.payload.len() as u64;
        if let Some(&first) = seg.repr.options.sack_blocks.as_slice().first() {
            // RFC 2883 §4: the D-SACK is reported once, by a segment that goes out.
            self.ooo.on_dsack_sent(first);
        }
        if seg.repr.flags.ack() {
            self.ack_now = false;
            self.timers.clear(Timer::DelayedAck);
            self.last_ack_sent = seg.repr.ack;
            // Only a pure ACK is a duplicate ACK at the sender (RFC 5681 §2).
            if !occupies {
                self.dupacks_owed = self.dupacks_owed.saturating_sub(1);
            }
        }
        if occupies {
            self.last_send = now;
        }
        self.arm_timers(now);
        true
    }

    /// Whether [`poll_segment`](Self::poll_segment) would return `None` now, with nothing
    /// for it to change: a cheap and conservative test (`false` means "maybe"). A driver
    /// may drop the connection from its transmit list after the last segment of a burst
    /// instead of polling it once more; what `poll_segment` does on a `None` (arming the
    /// retransmission and persist timers) it has already done after that segment.
    ///
    /// It mirrors `next_segment`'s sources in order: a pending RST, a retransmission, a
    /// window probe, a keepalive, a loss probe, SACK recovery, new data or a FIN under the windows
    /// (none when SND.NXT = SND.MAX and nothing is queued beyond it), an ACK that is due.
    #[must_use]
    pub fn nothing_to_send(&self) -> bool {
        let data_end = self.sndq.end();
        self.state.is_synchronized()
            && self.rst_pending.is_none()
            && self.rexmit_now.is_none()
            && !self.send_window_probe
            && !self.send_keepalive
            && !self.send_tlp
            && self.recovery.is_none()
            && !self.ack_now
            && self.dupacks_owed == 0
            && self.snd_nxt == self.snd_max
            && !data_end.gt(self.snd_nxt)
            && !(self.fin_queued && self.snd_nxt == data_end)
    }

    #[inline]
    pub(super) fn next_segment(&mut self, now: Instant, out: &mut OutSegment, burst: u32) -> bool {
        if let Some(seq) = self.rst_pending.take() {
            self.rst_segment(seq, out);
            return true;
        }
        match self.state {
            State::Closed => return false,
            State::SynSent | State::SynReceived => {
                if self.snd_nxt == self.iss {
                    self.syn_segment(now, out);
                    return true;
                }
                // Data may not go out before the handshake completes.
                return self.ack_segment_if_due(now, out);
            }
            State::TimeWait => return self.ack_segment_if_due(now, out),
            _ => {}
        }
        // Duplicate ACKs owed for out-of-order segments go out first, as pure ACKs (RFC
        // 5681 §4.2: an immediate duplicate ACK per out-of-order segment; Linux sends them
        // while processing the input). A segment carrying data is not a duplicate ACK at
        // the sender (RFC 5681 §2 (b)), so data or retransmissions cannot stand in for them:
        // without SACK the sender would never reach DupThresh.
        if self.dupacks_owed > 0 {
            return self.ack_segment_if_due(now, out);
        }
        if let Some(seq) = self.rexmit_now.take() {
            if seq.ge(self.snd_una)
                && seq.lt(self.snd_max)
                && self.retransmit_at(now, seq, u32::MAX, Rexmit::Normal, out)
            {
                return true;
            }
        }
        if core::mem::take(&mut self.send_window_probe) && self.window_probe(now, out) {
            return true;
        }
        if core::mem::take(&mut self.send_keepalive) {
            // RFC 9293 §3.8.4: a keepalive is an ACK with SEG.SEQ = SND.NXT - 1 and no data.
            let seq = self.snd_nxt - 1u32;
            self.segment(now, seq, TcpFlags::ACK, IoVec::new(), out);
            return true;
        }
        if core::mem::take(&mut self.send_tlp) && self.loss_probe(now, out) {
            return true;
        }
        if self.recovery.is_some() && self.sack_ok {
            // RFC 6675 §5 (C): while pipe < cwnd, send what NextSeg chooses.
            if self.sb.pipe() >= self.cc.cwnd() {
                return self.ack_segment_if_due(now, out);
            }
            let can_send_new = self.sndq.end().gt(self.snd_nxt)
                && (self.snd_una + self.snd_wnd).gt(self.snd_nxt)
                && self.snd_nxt == self.snd_max;
            match self.sb.next_seg(can_send_new) {
                Some(NextSeg::Retransmit { start, len }) => {
                    if self.retransmit_at(now, start, len, Rexmit::Normal, out) {
                        return true;
                    }
                }
                Some(NextSeg::NewData) => {}
                None => {
                    // RFC 6675 §4 rule 4: one rescue retransmission per recovery.
                    if let Some((start, len)) = self.sb.rescue_seg() {
                        if self.retransmit_at(now, start, len, Rexmit::Rescue, out) {
                            if let Some(recover) = self.recovery {
                                self.sb.set_rescue_rxt(recover);
                            }
                            return true;
                        }
                    }
                    return self.ack_segment_if_due(now, out);
                }
            }
        }
        if self.next_data_segment(now, out, burst, false) {
            return true;
        }
        self.ack_segment_if_due(now, out)
    }

    /// Options for a non-SYN segment: timestamps and, when we hold out-of-order data or a
    /// duplicate to report, SACK blocks (RFC 2018 §4, RFC 2883). Inlined: the options are
    /// built where the segment's header takes them.
    #[inline]
    pub(super) fn data_options(&mut self, now: Instant) -> TcpOptions {
        self.data_options_inlined(now)
    }

    /// [`data_options`](Self::data_options), always inlined: new data's options are
    /// built where its segment's header takes them.
    #[inline(always)]
    fn data_options_inlined(&mut self, now: Instant) -> TcpOptions {
        let mut opts = TcpOptions::default();
        if let Some(ts) = self.ts {
            opts.timestamps = Some(Timestamps {
                tsval: self.ts_clock(now, ts.offset),
                tsecr: ts.recent,
            });
        }
        // Without out-of-order data, a pending D-SACK or blocks still being reported the scan
        // would find nothing and change nothing: skip it (the common, in-order case).
        if self.sack_ok && self.ooo.has_sack_info() {
            // With timestamps at most 3 blocks fit in 40 bytes of options.
            let max = if opts.timestamps.is_some() {
                3
            } else {
                SackBlocks::MAX
            };
            let mut buf = [(SeqNum(0), SeqNum(0)); SackBlocks::MAX];
            // The D-SACK stays pending until a segment carrying it is sent (poll_segment):
            // options are also built for segments that end up not being sent.
            let n = self
                .ooo
                .sack_blocks_keeping_dsack(self.rcv_nxt, &mut buf[..max]);
            for &(l, r) in &buf[..n] {
                opts.sack_blocks.push(l, r);
            }
        }
        opts
    }

    /// RFC 7323 §5.4: a 1 ms timestamp clock with a random per-connection offset.
    pub(super) fn ts_clock(&self, now: Instant, offset: u32) -> u32 {
        ((now.as_nanos() / 1_000_000) as u32).wrapping_add(offset)
    }

    /// The window to advertise, never moving the right edge left (RFC 9293 §3.8.6.2.2,
    /// RFC 7323 §2.4) and growing it only in steps of min(rcv_buf/2, MSS) (receiver SWS
    /// avoidance, RFC 9293 §3.8.6.2.2).
    #[inline(always)]
    pub(super) fn advertise_window(&mut self, syn: bool) -> u16 {
        if self.wnd_nomem == WndNoMem::Pending {
            return self.advertise_zero_window();
        }
        let cur_edge = self.rcv_nxt + self.rcv_wnd();
        let threshold = (self.cfg.rcv_buf / 2).min(self.snd_mss).max(1);
        let mut edge = if self.rcv_adv.lt(self.rcv_nxt)
            || (cur_edge.gt(self.rcv_adv) && cur_edge - self.rcv_adv >= threshold)
        {
            cur_edge
        } else {
            self.rcv_adv
        };
        // RFC 9293 §3.8.6.2.2 / RFC 7323 §2.4: the right edge only stops; where it would
        // move, it goes no further than receive memory holds (`rcv_wnd_mem`), with the
        // SWS threshold of that smaller buffer. One compare while memory is plentiful.
        // (Where the byte window does not move the edge the memory window, never larger,
        // moves it by less; only with a threshold below the byte one, a few dozen bytes
        // of memory window, could it have moved it: the next segment or probe does.)
        if edge != self.rcv_adv && self.rcvq_mem >= self.rcv_mem_easy {
            let (wnd, thr) = self.rcv_wnd_mem();
            let mem_edge = self.rcv_nxt + wnd;
            edge = if self.rcv_adv.lt(self.rcv_nxt)
                || (mem_edge.gt(self.rcv_adv) && mem_edge - self.rcv_adv >= thr)
            {
                mem_edge
            } else {
                self.rcv_adv
            };
        }
        let wnd = edge - self.rcv_nxt;
        if syn {
            // RFC 7323 §2.2: the window in a SYN or SYN-ACK is never scaled.
            let field = wnd.min(u32::from(u16::MAX));
            self.rcv_adv = self.rcv_nxt + field;
            return field as u16;
        }
        let shift = self.rcv_wscale;
        // RFC 7323 §2.4: the scaled field is rounded down, so the announced right edge never
        // passes the buffer's free space. Rounding up let RCV.ADV creep past it by up to
        // 2^shift - 1 octets on every ACK after RCV.NXT moved by a non-multiple of 2^shift,
        // and the peer filled the receive queue beyond rcv_buf. When this shows an edge a
        // little left of RCV.ADV (the window seems to shrink by < 2^shift), RCV.ADV stays:
        // RFC 7323 §2.4 (1) "the receiver MUST honor, as in window, any segment that would
        // have been in window for any ACK sent by the receiver".
        let field = (wnd >> shift).min(u32::from(u16::MAX));
        let announced = self.rcv_nxt + (field << shift);
        if announced.gt(self.rcv_adv) || self.rcv_adv.lt(self.rcv_nxt) {
            self.rcv_adv = announced;
        }
        debug_assert!(
            !self.rcv_adv.gt(self.rcv_nxt) || self.rcv_adv - self.rcv_nxt <= self.rcv_wnd(),
            "RCV.ADV beyond the receive buffer"
        );
        field as u16
    }

    /// A zero window after a segment was refused for receive memory ([`WndNoMem`]).
    /// RCV.ADV stays where it was: data in the window already announced is still
    /// acceptable (RFC 7323 §2.4 (1)), only not taken while memory is short; the peer
    /// stops sending new data and probes (RFC 9293 §3.8.6.1).
    #[cold]
    #[inline(never)]
    fn advertise_zero_window(&mut self) -> u16 {
        self.wnd_nomem = WndNoMem::Sent;
        0
    }

    /// Build a segment with ACK, window and options filled in, into `out`.
    pub(super) fn segment(
        &mut self,
        now: Instant,
        seq: SeqNum,
        flags: TcpFlags,
        payload: IoVec,
        out: &mut OutSegment,
    ) {
        let options = self.data_options(now);
        self.segment_with(now, seq, flags, payload, options, out);
    }

    #[inline]
    pub(super) fn segment_with(
        &mut self,
        now: Instant,
        seq: SeqNum,
        flags: TcpFlags,
        payload: IoVec,
        options: TcpOptions,
        out: &mut OutSegment,
    ) {
        self.segment_with_inlined(now, seq, flags, payload, options, out);
    }

    /// [`segment_with`](Self::segment_with), always inlined: new data's segment is
    /// written where the stack keeps it.
    #[inline(always)]
    fn segment_with_inlined(
        &mut self,
        _now: Instant,
        seq: SeqNum,
        flags: TcpFlags,
        payload: IoVec,
        options: TcpOptions,
        out: &mut OutSegment,
    ) {
        let window = self.advertise_window(flags.syn());
        out.repr = TcpRepr {
            src_port: self.tuple.local.port(),
            dst_port: self.tuple.remote.port(),
            seq,
            ack: if flags.ack() { self.rcv_nxt } else { SeqNum(0) },
            flags,
            window,
            urgent: 0,
            options,
        };
        out.payload = payload;
    }

    pub(super) fn syn_segment(&mut self, now: Instant, out: &mut OutSegment) {
        let active = self.state == State::SynSent;
        let mut options = TcpOptions {
            mss: Some(self.cfg.mss),
            ..TcpOptions::default()
        };
        if active {
            if self.cfg.window_scaling {
                options.window_scale = Some(self.rcv_wscale);
            }
            options.sack_permitted = self.cfg.sack;
        } else {
            // RFC 7323 §1.3/§2.2, RFC 2018 §2: only answer options the peer offered.
            if self.wscale_ok {
                options.window_scale = Some(self.rcv_wscale);
            }
            options.sack_permitted = self.sack_ok;
        }
        if let Some(ts) = self.ts {
            let tsecr = if active { 0 } else { ts.recent };
            options.timestamps = Some(Timestamps {
                tsval: self.ts_clock(now, ts.offset),
                tsecr,
            });
        }
        let flags = if active {
            TcpFlags::SYN
        } else {
            TcpFlags::SYN | TcpFlags::ACK
        };
        self.segment_with(now, self.iss, flags, IoVec::new(), options, out);
        if self.retries == 0 && self.snd_max == self.iss {
            self.rtt_probe = Some((self.iss + 1u32, now));
        } else {
            // Karn: a retransmitted SYN gives no RTT sample.
            self.rtt_probe = None;
            self.counters.retransmits += 1;
        }
        self.snd_nxt = self.iss + 1u32;
        self.snd_max = self.snd_max.max(self.snd_nxt);
    }

    pub(super) fn rst_segment(&mut self, seq: SeqNum, out: &mut OutSegment) {
        out.repr = TcpRepr {
            src_port: self.tuple.local.port(),
            dst_port: self.tuple.remote.port(),
            seq,
            ack: SeqNum(0),
            flags: TcpFlags::RST,
            window: 0,
            urgent: 0,
            options: TcpOptions::default(),
        };
        out.payload = IoVec::new();
    }

    pub(super) fn ack_segment_if_due(&mut self, now: Instant, out: &mut OutSegment) -> bool {
        if !(self.ack_now || self.dupacks_owed > 0)
            || matches!(self.state, State::Closed | State::SynSent)
        {
            self.dupacks_owed = 0;
            return false;
        }
        let seq = self.seq_for_control();
        self.segment(now, seq, TcpFlags::ACK, IoVec::new(), out);
        true
    }

    /// Sequence number of segments without data (pure ACKs, RSTs). An RTO rewinds SND.NXT
    /// to SND.UNA (go-back-N) while the peer may already hold everything up to SND.MAX, so
    /// its RCV.NXT lies anywhere in [SND.UNA, SND.MAX]; a pure ACK below it fails the
    /// peer's acceptability test (RFC 9293 §3.10.7.4) and is dropped with its ACK field
    /// unread. SND.MAX is what RFC 9293 calls SND.NXT (BSD's tcp_output does the same for
    /// ACK-only segments). While probing a zero window the probe octet may not have been
    /// taken and the peer accepts only SEG.SEQ = RCV.NXT, so SND.NXT (= SND.UNA) is used.
    pub(super) fn seq_for_control(&self) -> SeqNum {
        if self.snd_wnd == 0 {
            self.snd_nxt
        } else {
            self.snd_max
        }
    }

    /// Largest payload that fits in one segment next to `opts`.
    #[inline(always)]
    pub(super) fn max_payload(&self, opts: &TcpOptions) -> u32 {
        // Data segments carry at most timestamps and SACK blocks; without blocks the length
        // is known without walking the options.
        let len = if opts.sack_blocks.is_empty() {
            if opts.timestamps.is_some() {
                TS_OPTION_LEN
            } else {
                0
            }
        } else {
            options_len(opts)
        };
        debug_assert_eq!(len, options_len(opts));
        self.snd_mss.saturating_sub(len).max(1)
    }

    /// Retransmit up to one MSS (and at most `limit` bytes) starting at `seq`.
    pub(super) fn retransmit_at(
        &mut self,
        now: Instant,
        seq: SeqNum,
        limit: u32,
        kind: Rexmit,
        out: &mut OutSegment,
    ) -> bool {
        let opts = self.data_options(now);
        let data_end = self.sndq.end();
        let max = self.max_payload(&opts).min(limit);
        let payload = self.sndq.slice(seq, max as usize);
        let len = payload.len() as u32;
        let fin = self.fin_queued && seq + len == data_end && self.snd_max.gt(data_end);
        if len == 0 && !fin {
            return false;
        }
        let mut flags = TcpFlags::ACK;
        if fin {
            flags |= TcpFlags::FIN;
        }
        if seq + len == data_end {
            flags |= TcpFlags::PSH;
        }
        // RFC 6675 §4 NextSeg rule 4: the rescue retransmission MUST NOT update HighRxt
        // (it is tracked by RescueRxt alone).
        if kind == Rexmit::Normal {
            self.sb.on_retransmit(seq, len + u32::from(fin));
        }
        if kind != Rexmit::Probe {
            self.undo.on_retransmit(seq, seq + len + u32::from(fin));
            if self.undo.active && self.undo.rxt_tsval.is_none() {
                self.undo.rxt_tsval = opts.timestamps.map(|t| t.tsval);
            }
        }
        self.rtt_probe = None;
        self.counters.retransmits += 1;
        self.segment_with(now, seq, flags, payload, opts, out);
        true
    }

    /// RFC 9293 §3.8.6.1: send one octet beyond a zero window (or the FIN if no data is left).
    pub(super) fn window_probe(&mut self, now: Instant, out: &mut OutSegment) -> bool {
        if self.snd_wnd != 0 {
            return false;
        }
        let opts = self.data_options(now);
        let payload = self.sndq.slice(self.snd_una, 1);
        if payload.is_empty() {
            return false;
        }
        self.counters.window_probes += 1;
        // The probe octet is sent outside the window without advancing SND.NXT: if the peer
        // takes it, its ACK advances SND.UNA; if not, sending resumes from SND.UNA when the
        // window opens, so the octet is never skipped.
        self.snd_nxt = self.snd_una;
        let probe_end = self.snd_una + 1u32;
        if probe_end.gt(self.snd_max) {
            self.snd_max = probe_end;
            self.sb.on_transmit(self.snd_max);
        }
        self.rtt_probe = None;
        let seq = self.snd_una;
        self.segment_with(now, seq, TcpFlags::ACK, payload, opts, out);
        true
    }

    /// Bytes considered in the network, for the congestion-window check.
    #[inline(always)]
    pub(super) fn flight(&self) -> u32 {
        match self.recovery {
            Some(_) if self.sack_ok => self.sb.pipe(),
            Some(_) => self.snd_max - self.snd_una,
            // RFC 6675 §5 (2) (limited transmit, RFC 3042, counted by pipe): before DupThresh
            // is reached, SACKed segments have left the network, so new data may go out while
            // cwnd - pipe >= 1 SMSS. Without it a window of a few segments with one loss
            // never collects DupThresh duplicate ACKs and waits for the RTO.
            None if self.sack_ok
                && self.snd_nxt == self.snd_max
                && self.sb.sacked_bytes() > 0
                && !self.sb.is_lost(self.snd_una) =>
            {
                self.sb.pipe()
            }
            // RFC 3042 / RFC 5681 §3.2 (1) without SACK: each of the first two duplicate
            // ACKs says a segment left the network, so one new segment may go out for each
            // (FlightSize up to cwnd + 2 SMSS); a retransmission is never sent this way.
            None if !self.sack_ok && self.dupacks > 0 && self.snd_nxt == self.snd_max => {
                let left = self.dupacks.min(2) * self.snd_mss;
                (self.snd_nxt - self.snd_una).saturating_sub(left)
            }
            None => self.snd_nxt - self.snd_una,
        }
    }

    /// New data (or the FIN) under the windows, SWS avoidance and Nagle, as one segment or
    /// a burst of up to `burst`. `probe`: a tail loss probe (`tlp.rs`), one segment that the
    /// congestion window does not gate (RFC 8985 §7.3) and after which no PTO is armed.
    /// Always inlined: with the probe as a second caller the compiler outlined it, which
    /// cost the hot call (`probe` = false) about 150 instructions per RPC in `rpc_pair`.
    #[inline(always)]
    pub(super) fn next_data_segment(
        &mut self,
        now: Instant,
        out: &mut OutSegment,
        burst: u32,
        probe: bool,
    ) -> bool {
        if !matches!(
            self.state,
            State::Established
                | State::CloseWait
                | State::FinWait1
                | State::LastAck
                | State::Closing
        ) {
            return false;
        }
        let data_end = self.sndq.end();
        // RFC 6675 §5.1: after an RTO, do not resend what the peer SACKed. RFC 2018 §8: the
        // left edge (SND.UNA) MUST be resent whether or not it is SACKed.
        if self.sack_ok && self.snd_nxt.lt(self.snd_max) && self.snd_nxt != self.snd_una {
            let nxt = self.snd_nxt;
            if let Some(&(_, end)) = self
                .sb
                .ranges()
                .iter()
                .find(|&&(s, e)| nxt.ge(s) && nxt.lt(e))
            {
                self.snd_nxt = end.min(self.snd_max);
            }
        }
        let unsent = if data_end.gt(self.snd_nxt) {
            data_end - self.snd_nxt
        } else {
            0
        };
        let fin_due = self.fin_queued && self.snd_nxt == data_end;
        if unsent == 0 && !fin_due {
            return false;
        }
        // NewReno recovery sends only new data beyond `recover` (RFC 6582 §3.2 step 4).
        if self.recovery.is_some() && !self.sack_ok && self.snd_nxt.lt(self.snd_max) {
            return false;
        }
        let flight = self.flight();
        // Data sent and not acknowledged, whatever limited transmit's `flight` counts: the
        // idle, SWS and Nagle tests below are about this.
        let unacked = self.snd_nxt != self.snd_una;
        // RFC 5681 §4.1: after an idle period longer than the RTO, restart from the
        // restart window. The congestion control is asked only then (in nanoseconds, what
        // its `idle > rto` test compares): otherwise `on_idle_restart` changes nothing.
        let idle_ns = now.as_nanos().saturating_sub(self.last_send.as_nanos());
        if !unacked && idle_ns > self.rtt.rto_nanos() {
            self.cc.on_idle_restart(
                now,
                now.saturating_duration_since(self.last_send),
                self.rto(),
            );
        }
        let cwnd = match self.recovery {
            Some(_) if !self.sack_ok => self.inflation.window(self.cc.cwnd(), self.snd_mss),
            _ => self.cc.cwnd(),
        };
        let cwnd_room = if probe {
            u32::MAX
        } else {
            cwnd.saturating_sub(flight)
        };
        let wnd_edge = self.snd_una + self.snd_wnd;
        let wnd_room = if wnd_edge.gt(self.snd_nxt) {
            wnd_edge - self.snd_nxt
        } else {
            0
        };
        let opts = self.data_options_inlined(now);
        let max_payload = self.max_payload(&opts);
        // A burst: new data only (going back N after an RTO, each segment skips what the
        // peer SACKed), outside recovery, and without SACK blocks (a D-SACK is reported
        // once, not once per segment).
        let seq = self.snd_nxt;
        let burst = if burst > 1
            && unsent > max_payload
            && seq == self.snd_max
            && self.recovery.is_none()
            && opts.sack_blocks.is_empty()
        {
            burst
        } else {
            1
        };
        let mut len = unsent
            .min(max_payload.saturating_mul(burst))
            .min(cwnd_room)
            .min(wnd_room);
        if len > max_payload && len % max_payload != 0 && (len < unsent || self.cfg.nagle) {
            // Whole segments only when the windows cut the burst short, or with Nagle's
            // algorithm on: one send decision per segment would have held that runt back
            // (sender SWS avoidance and Nagle, below, with data now unacknowledged), and
            // the next decision takes it up as its own first segment.
            len -= len % max_payload;
        }
        if len == 0 && !(fin_due && unsent == 0) {
            return false;
        }
        if len < unsent && len < max_payload {
            // RFC 9293 §3.8.6.2.1 sender SWS avoidance: with more data queued, a partial
            // segment waits for ACKs to open the window, unless it fills at least half the
            // largest window the peer ever offered. A byte-counted cwnd would otherwise leave
            // a runt at the end of every flight. With nothing outstanding no ACK is coming:
            // the persist timer (`arm_sws_override`) is the override timeout after which the
            // window is filled anyway. (Going back N after an RTO, the flight is empty but
            // data is outstanding: the RTO is the clock, and the window is filled at once.)
            let big_enough = len == wnd_room && len >= self.max_snd_wnd / 2;
            let idle = self.snd_max == self.snd_una;
            if !big_enough && (unacked || (idle && !self.sws_override)) {
                return false;
            }
        }
        self.sws_override = false;
        // RFC 9293 §3.7.4 Nagle (off by default): hold a small segment while data is unacked.
        if self.cfg.nagle && len < max_payload && unacked && !fin_due {
            return false;
        }
        let payload = self.sndq.slice(seq, len as usize);
        let fin = self.fin_queued && seq + len == data_end;
        let mut flags = TcpFlags::ACK;
        if seq + len == data_end && len > 0 {
            flags |= TcpFlags::PSH;
        }
        if fin {
            flags |= TcpFlags::FIN;
        }
        let is_rexmit = seq.lt(self.snd_max);
        self.snd_nxt = seq + len + u32::from(fin);
        if self.snd_nxt.gt(self.snd_max) {
            self.snd_max = self.snd_nxt;
            self.sb.on_transmit(self.snd_max);
        }
        if !is_rexmit && self.recovery.is_none() && self.dupacks > 0 {
            // Limited transmit (RFC 3042): kept out of the FlightSize that sets ssthresh.
            self.lt_bytes = self.lt_bytes.saturating_add(len);
        }
        if is_rexmit {
            self.sb.on_retransmit(seq, len + u32::from(fin));
            self.undo.on_retransmit(seq, seq + len + u32::from(fin));
            self.counters.retransmits += 1;
            self.rtt_probe = None;
        } else if self.rtt_probe.is_none() && self.retries == 0 {
            // The probe is the first segment (of a burst too), as one decision per
            // segment would have timed it.
            let first_end = if len > max_payload {
                seq + max_payload
            } else {
                self.snd_nxt
            };
            self.rtt_probe = Some((first_end, now));
        }
        if !is_rexmit && !probe {
            // RFC 8985 §7.2: new data sent restarts the probe timeout.
            self.arm_pto(now);
        }
        self.segment_with_inlined(now, seq, flags, payload, opts, out);
        if len > max_payload {
            out.burst_piece = max_payload;
        }
        true
    }
}
