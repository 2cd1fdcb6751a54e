//! Receiver-side out-of-order queue (reassembly) with bounded memory, and the SACK/D-SACK
//! blocks the receiver reports (RFC 2018 §4, RFC 2883 §4).
//!
//! Contract:
//! - Generic over the payload type through [`Payload`] (zbuf's `Zbuf` implements it; `Vec<u8>`
//!   does here), so reassembly never copies bytes: it only splits and trims buffers.
//! - The connection checks segment acceptability against the receive window (RFC 9293
//!   §3.10.7.4) and handles SYN/FIN; it passes payload bytes to [`Assembler::insert`] with its
//!   current RCV.NXT, then drains in-order data with [`Assembler::pop_ready`]. Data entirely
//!   below RCV.NXT may be passed too (it is counted as duplicate and D-SACKed) or reported with
//!   [`Assembler::note_duplicate`]. Queued data the connection delivered itself (an in-order
//!   segment that repeated it) is discarded by the next call and D-SACKed too.
//! - Overlaps keep the data already queued and trim the new segment (RFC 9293 §3.10.7.4 allows
//!   either; keeping the old data means a stored buffer is never split or freed by a later
//!   arrival, so same-sequence segments of different lengths cannot corrupt or double-free
//!   anything: the new one is only trimmed to the gaps).
//! - Memory is bounded by `max_bytes` and `max_segments`. When an arrival does not fit, queued
//!   data *above* it is evicted (highest first) to make room, since lower data is what unblocks
//!   delivery; what still does not fit is dropped. Evicting SACKed data is reneging, which RFC
//!   2018 §8 permits. Both are counted.
//! - Storage is allocated lazily: none until the first out-of-order segment, grown by
//!   doubling but never beyond `max_segments` entries, and released when the queue drains
//!   (its last segment delivered or [`Assembler::clear`]). A connection that never sees
//!   reordering or loss holds no out-of-order storage (with the defaults the bound is
//!   ~1,400 entries, ~45 KiB per connection, which used to be reserved up front: 225 MB
//!   for 5,000 connections; issue 13).
//! - [`Assembler::sack_blocks`] fills the SACK option for the next outgoing ACK.

use crate::tcp::SeqNum;
use std::collections::VecDeque;

/// A buffer the assembler can hold: byte length, split and trim without copying.
pub trait Payload: Sized {
    /// Length in bytes.
    fn len(&self) -> usize;

    /// No bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Split off and return the first `at` bytes (`at <= len`); `self` keeps the rest.
    fn split_to(&mut self, at: usize) -> Self;

    /// Drop the first `n` bytes (`n <= len`).
    fn advance(&mut self, n: usize);

    /// Keep only the first `n` bytes.
    fn truncate(&mut self, n: usize);

    /// The memory this buffer keeps alive (Linux's truesize): for a slice of a receive
    /// buffer, the whole buffer. What [`Assembler::mem`] adds up; it must not change while
    /// the buffer is queued (`advance` keeps the buffer behind).
    fn truesize(&self) -> usize;

    /// Whether the memory behind the bytes is more than twice their length, so that
    /// copying them into a compact buffer (shared with their neighbours when they are tiny)
    /// would release much (Linux collapses such skbs, `tcp_collapse`). A full-sized segment
    /// in its receive buffer is not.
    fn sparse(&self) -> bool {
        self.truesize() > 2 * self.len()
    }

    /// Whether the bytes already have a buffer of their own length: copying them alone
    /// would release nothing (only merging with neighbours can).
    fn compact(&self) -> bool {
        self.truesize() <= self.len()
    }

    /// One compact buffer holding `parts`' bytes in order (the copy behind a collapse).
    fn concat(parts: &[Self]) -> Self;
}

impl Payload for Vec<u8> {
    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn split_to(&mut self, at: usize) -> Self {
        let rest = self.split_off(at.min(Vec::len(self)));
        core::mem::replace(self, rest)
    }

    fn advance(&mut self, n: usize) {
        self.drain(..n.min(Vec::len(self)));
    }

    fn truncate(&mut self, n: usize) {
        Vec::truncate(self, n);
    }

    /// The allocation, which `advance` (a drain) keeps: a stored payload's truesize must
    /// not change while it is queued.
    fn truesize(&self) -> usize {
        self.capacity()
    }

    fn compact(&self) -> bool {
        self.capacity() == Vec::len(self)
    }

    fn concat(parts: &[Self]) -> Self {
        parts.concat()
    }
}

/// Bounds of an [`Assembler`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AssemblerConfig {
    /// Most payload bytes queued. Default 1 MiB; set it to the receive buffer size.
    pub max_bytes: usize,
    /// Most separate segments queued (1..=65536). Default 256.
    pub max_segments: usize,
}

impl Default for AssemblerConfig {
    fn default() -> Self {
        AssemblerConfig {
            max_bytes: 1 << 20,
            max_segments: 256,
        }
    }
}

/// Why an [`AssemblerConfig`] was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssemblerConfigError {
    /// `max_bytes` is zero or above 2^30 (the largest TCP window).
    MaxBytes,
    /// `max_segments` is zero or above 65536.
    MaxSegments,
}

impl core::fmt::Display for AssemblerConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            AssemblerConfigError::MaxBytes => "max_bytes must be between 1 and 2^30",
            AssemblerConfigError::MaxSegments => "max_segments must be between 1 and 65536",
        })
    }
}

impl std::error::Error for AssemblerConfigError {}

/// Largest distance above RCV.NXT the assembler accepts data at (RFC 7323 §2.3: 2^30).
const MAX_SPAN: u32 = 1 << 30;

/// How many recently received blocks are remembered for SACK reporting (RFC 2018: at most 4
/// blocks fit in an option).
const RECENT: usize = 4;

/// What one [`Assembler::insert`] did with the segment's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InsertOutcome {
    /// Bytes newly queued.
    pub stored: usize,
    /// Bytes already received (below RCV.NXT or already queued).
    pub duplicate: usize,
    /// Bytes that did not fit the bounds, or were too far above RCV.NXT.
    pub dropped: usize,
    /// Previously queued bytes evicted to make room.
    pub evicted: usize,
}

impl Payload for zbuf::Zbuf {
    fn len(&self) -> usize {
        zbuf::Zbuf::len(self)
    }
    fn split_to(&mut self, at: usize) -> Self {
        zbuf::Zbuf::split_to(self, at)
    }
    fn advance(&mut self, n: usize) {
        zbuf::Zbuf::advance(self, n)
    }
    fn truncate(&mut self, n: usize) {
        zbuf::Zbuf::truncate(self, n)
    }
    /// The object behind the slice plus [`SEG_OVERHEAD`] for its metadata and queue entry,
    /// so that even a buffer copied to one byte is not free.
    #[inline]
    fn truesize(&self) -> usize {
        self.object_size() + SEG_OVERHEAD
    }
    fn compact(&self) -> bool {
        self.object_size() <= zbuf::Zbuf::len(self)
    }
    /// A heap buffer of exactly their length; the copy is counted in `zbuf::copy_stats`.
    /// Heap rather than the slab: it needs no core cache (sans-IO tests, any thread) and
    /// takes nothing from the pools a receive-buffer shortage drains.
    fn concat(parts: &[Self]) -> Self {
        let len = parts.iter().map(|p| p.len()).sum();
        let mut m = zbuf::ZbufMut::heap(0, len);
        for p in parts {
            m.extend_from_slice(p)
                .expect("the buffer was sized for every part");
        }
        m.freeze()
    }
}

/// What a held buffer costs besides its object: its metadata (one cache line) and its
/// queue entry, rounded up (Linux's truesize counts the `sk_buff` likewise).
pub const SEG_OVERHEAD: usize = 128;

/// Longest buffer a collapse copies small segments into: few entries per receive buffer
/// (64 for 1 MiB), and a partly read one keeps little memory alive.
pub const COLLAPSE_CHUNK: usize = 16 << 10;

/// What a collapse did ([`Assembler::collapse`], and the connection's receive queue).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Collapsed {
    /// Buffers whose bytes were copied: each released its reference to the buffer behind.
    pub buffers: usize,
    /// Bytes copied.
    pub bytes: usize,
}

/// Collects runs of sparse buffers into compact ones of at most [`COLLAPSE_CHUNK`] bytes
/// (a run of one is copied too, to its own length).
pub(crate) struct Compactor<P: Payload> {
    run: Vec<P>,
    run_len: usize,
    /// What the compacted buffers added up to before and after.
    pub(crate) freed: usize,
    pub(crate) added: usize,
    pub(crate) done: Collapsed,
}

impl<P: Payload> Compactor<P> {
    pub(crate) fn new() -> Self {
        Compactor {
            run: Vec::new(),
            run_len: 0,
            freed: 0,
            added: 0,
            done: Collapsed::default(),
        }
    }

    /// Whether `p` (sparse, contiguous with the run) still fits the run's buffer.
    pub(crate) fn fits(&self, p: &P) -> bool {
        self.run_len + p.len() <= COLLAPSE_CHUNK
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.run.is_empty()
    }

    pub(crate) fn push(&mut self, p: P) {
        self.run_len += p.len();
        self.run.push(p);
    }

    /// The run as one compact buffer (`None` if empty); a run of one buffer that is
    /// compact already is given back as it is.
    pub(crate) fn take(&mut self) -> Option<P> {
        if self.run.len() == 1 && self.run[0].compact() {
            self.run_len = 0;
            return self.run.pop();
        }
        if self.run.is_empty() {
            return None;
        }
        let merged = P::concat(&self.run);
        self.freed += self.run.iter().map(Payload::truesize).sum::<usize>();
        self.added += merged.truesize();
        self.done.buffers += self.run.len();
        self.done.bytes += merged.len();
        self.run.clear();
        self.run_len = 0;
        Some(merged)
    }
}

/// Cumulative counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AssemblerStats {
    /// Bytes received twice.
    pub duplicate_bytes: u64,
    /// Bytes dropped because of the bounds or the span limit.
    pub dropped_bytes: u64,
    /// Queued bytes evicted for lower data (reneging).
    pub evicted_bytes: u64,
}

/// The out-of-order queue.
/// `#[repr(C)]`: what `is_empty` and `has_sack_info` read for every segment sent or
/// received (the segment queue, the pending D-SACK, the recent-block count) fills the first
/// 48 bytes, so a connection can keep it in one cache line (issue 13).
#[derive(Debug, Clone)]
#[repr(C)]
pub struct Assembler<P: Payload> {
    /// Sorted, non-overlapping, non-empty segments.
    segs: VecDeque<(SeqNum, P)>,
    /// The pending D-SACK range (RFC 2883), reported once.
    dsack: Option<(SeqNum, SeqNum)>,
    /// How many of `recent` are valid (at most [`RECENT`]).
    recent_len: u32,
    /// Sequence numbers inside recently received data, most recent first (RFC 2018 §4).
    recent: [SeqNum; RECENT],
    bytes: usize,
    /// Sum of the queued payloads' [`Payload::truesize`] (a stored payload's never changes:
    /// trimming keeps its buffer).
    mem: usize,
    cfg: AssemblerConfig,
    stats: AssemblerStats,
}

impl<P: Payload> Assembler<P> {
    /// An empty queue with the given bounds.
    pub fn new(cfg: AssemblerConfig) -> Result<Self, AssemblerConfigError> {
        if cfg.max_bytes == 0 || cfg.max_bytes > MAX_SPAN as usize {
            return Err(AssemblerConfigError::MaxBytes);
        }
        if cfg.max_segments == 0 || cfg.max_segments > 65_536 {
            return Err(AssemblerConfigError::MaxSegments);
        }
        Ok(Assembler {
            cfg,
            segs: VecDeque::new(),
            bytes: 0,
            mem: 0,
            recent: [SeqNum(0); RECENT],
            recent_len: 0,
            dsack: None,
            stats: AssemblerStats::default(),
        })
    }

    /// Queued payload bytes.
    pub fn len_bytes(&self) -> usize {
        self.bytes
    }

    /// The memory behind the queued payloads ([`Payload::truesize`] summed).
    pub fn mem(&self) -> usize {
        self.mem
    }

    /// Copies runs of contiguous sparse payloads ([`Payload::sparse`]: tiny segments in
    /// large receive buffers) into compact buffers of at most [`COLLAPSE_CHUNK`] bytes,
    /// releasing the buffers behind them (Linux's `tcp_collapse_ofo_queue`). Nothing is
    /// dropped and the queued sequence space is unchanged, so SACK blocks stay true (no
    /// reneging, RFC 2018 §8). A payload with holes on both sides is copied alone.
    pub fn collapse(&mut self) -> Collapsed {
        if !self.segs.iter().any(|(_, p)| p.sparse()) {
            return Collapsed::default();
        }
        let old = core::mem::take(&mut self.segs);
        let mut out = VecDeque::with_capacity(old.len());
        let mut run = Compactor::new();
        let mut run_start = SeqNum(0);
        let mut run_end = SeqNum(0);
        for (s, p) in old {
            let joins = p.sparse() && !run.is_empty() && run_end == s && run.fits(&p);
            if !joins {
                if let Some(m) = run.take() {
                    out.push_back((run_start, m));
                }
            }
            if p.sparse() {
                if run.is_empty() {
                    run_start = s;
                }
                run_end = s + p.len();
                run.push(p);
            } else {
                out.push_back((s, p));
            }
        }
        if let Some(m) = run.take() {
            out.push_back((run_start, m));
        }
        self.segs = out;
        self.mem = self.mem - run.freed + run.added;
        run.done
    }

    /// Evicts queued segments that start above `above`, highest first, until the memory
    /// behind the queue is at most `mem` (Linux's `tcp_prune_ofo_queue`); returns the bytes
    /// evicted. Evicting SACKed data is reneging, which RFC 2018 §8 permits; the sender
    /// keeps it until it is cumulatively acknowledged.
    pub fn prune(&mut self, above: SeqNum, mem: usize) -> usize {
        let mut evicted = 0;
        while self.mem > mem {
            match self.segs.back() {
                Some(&(s, _)) if s.gt(above) => {}
                _ => break,
            }
            if let Some((_, p)) = self.segs.pop_back() {
                self.bytes -= p.len();
                self.mem -= p.truesize();
                evicted += p.len();
            }
        }
        self.stats.evicted_bytes += evicted as u64;
        self.release_if_empty();
        evicted
    }

    /// Queued segments.
    pub fn segment_count(&self) -> usize {
        self.segs.len()
    }

    /// Segments the queue has storage allocated for: 0 until the first out-of-order
    /// segment and again once the queue drains, never above `max_segments`.
    pub fn allocated_segments(&self) -> usize {
        self.segs.capacity()
    }

    /// Free the storage of an empty queue.
    fn release_if_empty(&mut self) {
        if self.segs.is_empty() && self.segs.capacity() != 0 {
            self.segs = VecDeque::new();
        }
    }

    /// Nothing queued.
    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// Whether [`sack_blocks_keeping_dsack`](Self::sack_blocks_keeping_dsack) could report
    /// a block or change state: false means it would return 0 and leave everything as is, so
    /// a caller may skip it.
    pub fn has_sack_info(&self) -> bool {
        !self.segs.is_empty() || self.dsack.is_some() || self.recent_len > 0
    }

    /// The bounds in force.
    pub fn config(&self) -> AssemblerConfig {
        self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> AssemblerStats {
        self.stats
    }

    /// Drop everything (connection reset), storage included.
    pub fn clear(&mut self) {
        self.segs = VecDeque::new();
        self.bytes = 0;
        self.mem = 0;
        self.recent_len = 0;
        self.dsack = None;
    }

    /// Queue `payload` received at `seq`, trimming what is below `rcv_nxt` or already queued.
    pub fn insert(&mut self, rcv_nxt: SeqNum, seq: SeqNum, mut payload: P) -> InsertOutcome {
        let mut out = InsertOutcome::default();
        self.trim_below(rcv_nxt);
        let len = payload.len();
        if len == 0 {
            return out;
        }
        // Absurd sizes, or data more than 2^30 below RCV.NXT (serial arithmetic cannot tell
        // it from data far above): drop, the caller's window check should have.
        if len > MAX_SPAN as usize || (seq.lt(rcv_nxt) && (rcv_nxt - seq) > MAX_SPAN) {
            out.dropped = len;
            self.stats.dropped_bytes += len as u64;
            return out;
        }
        let mut cur = seq;
        let end = seq + len;
        // Dup ranges found in this segment; the first contiguous one becomes the D-SACK.
        let mut dup: Option<(SeqNum, SeqNum)> = None;
        let mut note_dup = |a: SeqNum, b: SeqNum, out: &mut InsertOutcome| {
            out.duplicate += (b - a) as usize;
            match dup {
                None => dup = Some((a, b)),
                Some((da, db)) if db == a => dup = Some((da, b)),
                Some(_) => {}
            }
        };
        // RFC 9293 §3.10.7.4: data below RCV.NXT was already received; trim it.
        if cur.lt(rcv_nxt) {
            let n = (rcv_nxt - cur).min(len as u32);
            note_dup(cur, cur + n, &mut out);
            payload.advance(n as usize);
            cur += n;
        }
        if !payload.is_empty() && (end - rcv_nxt) > MAX_SPAN {
            // Far outside any window: the caller should have dropped it.
            out.dropped += payload.len();
            payload.truncate(0);
        }
        let first_stored_at = cur;
        // Walk the queued segments that overlap [cur, end), filling gaps with pieces of the
        // new payload and skipping (trimming) the overlapping parts.
        let mut i = self.segs.partition_point(|(s, p)| (*s + p.len()).le(cur));
        while !payload.is_empty() {
            let gap_end = match self.segs.get(i) {
                Some(&(s, _)) if s.lt(end) => s,
                _ => end,
            };
            if cur.lt(gap_end) {
                let n = (gap_end - cur) as usize;
                // split_to(len) takes everything and leaves `payload` empty.
                let piece = payload.split_to(n.min(payload.len()));
                let plen = piece.len();
                match self.store(i, cur, piece, &mut out) {
                    Some(stored) => {
                        out.stored += stored;
                        i += 1;
                        if stored < plen {
                            // Truncated by the byte bound: nothing above fits either.
                            out.dropped += plen - stored + payload.len();
                            break;
                        }
                    }
                    None => {
                        out.dropped += plen + payload.len();
                        break;
                    }
                }
                cur += n;
                continue;
            }
            // Overlap with queued segment i: keep the queued data, skip ours.
            let qend = {
                let (s, p) = &self.segs[i];
                *s + p.len()
            };
            let n = (qend.min(end) - cur) as usize;
            note_dup(cur, cur + n, &mut out);
            payload.advance(n.min(payload.len()));
            cur += n;
            i += 1;
        }
        if first_stored_at.lt(end) && out.dropped == 0 {
            // RFC 2018 §4: the first SACK block reports the block containing the segment that
            // triggered the ACK (all of its bytes at or above RCV.NXT are now queued, so any
            // of them identifies that block; if it was delivered, it is skipped later).
            self.push_recent(first_stored_at);
        }
        if let Some(d) = dup {
            // RFC 2883 §4: report the duplicate range (once) as the first block.
            self.dsack = Some(d);
        }
        self.stats.duplicate_bytes += out.duplicate as u64;
        self.stats.dropped_bytes += out.dropped as u64;
        self.stats.evicted_bytes += out.evicted as u64;
        out
    }

    /// Insert `piece` at index `i` (position `seq`) within the bounds, evicting higher data if
    /// needed. Returns bytes stored (possibly truncated), or `None` if nothing fits.
    fn store(
        &mut self,
        i: usize,
        seq: SeqNum,
        mut piece: P,
        out: &mut InsertOutcome,
    ) -> Option<usize> {
        let need = piece.len();
        while (self.segs.len() >= self.cfg.max_segments || self.bytes + need > self.cfg.max_bytes)
            && self.segs.len() > i
        {
            if let Some((_, p)) = self.segs.pop_back() {
                self.bytes -= p.len();
                self.mem -= p.truesize();
                out.evicted += p.len();
            }
        }
        if self.segs.len() >= self.cfg.max_segments {
            return None;
        }
        let room = self.cfg.max_bytes - self.bytes;
        if room == 0 {
            return None;
        }
        if need > room {
            piece.truncate(room);
        }
        let n = piece.len();
        self.bytes += n;
        self.mem += piece.truesize();
        if self.segs.len() == self.segs.capacity() {
            // Grow by doubling (from 4), capped at the bound: `insert` on a full deque
            // would double past it. Here len < max_segments (checked above).
            let want = (self.segs.capacity() * 2).max(4).min(self.cfg.max_segments);
            self.segs.reserve_exact(want - self.segs.len());
        }
        self.segs.insert(i, (seq, piece));
        Some(n)
    }

    /// Drop queued data below `rcv_nxt`: the connection delivered an in-order segment that
    /// repeated it, so those bytes arrived twice.
    fn trim_below(&mut self, rcv_nxt: SeqNum) {
        let mut dup: Option<(SeqNum, SeqNum)> = None;
        while let Some((s, p)) = self.segs.front_mut() {
            if !(*s).lt(rcv_nxt) {
                break;
            }
            let start = *s;
            let below = (rcv_nxt - start) as usize;
            let n = below.min(p.len());
            if below >= p.len() {
                self.bytes -= p.len();
                self.mem -= p.truesize();
                self.segs.pop_front();
            } else {
                p.advance(below);
                self.bytes -= below;
                *s = rcv_nxt;
            }
            self.stats.duplicate_bytes += n as u64;
            match dup {
                None => dup = Some((start, start + n)),
                Some((da, db)) if db == start => dup = Some((da, start + n)),
                Some(_) => {}
            }
        }
        if let Some(d) = dup {
            // RFC 2883 §4: the segment that advanced RCV.NXT repeated queued data: report
            // the (first contiguous) duplicate range as the D-SACK, although it now lies
            // below the cumulative ACK; only ordinary SACK blocks must stay above it.
            self.dsack = Some(d);
        }
    }

    /// The next in-order payload at `rcv_nxt`, if queued. Call repeatedly, advancing RCV.NXT by
    /// each returned length, until it returns `None`.
    /// The queue's storage is released once it is empty.
    pub fn pop_ready(&mut self, rcv_nxt: SeqNum) -> Option<P> {
        self.trim_below(rcv_nxt);
        let ready = match self.segs.front() {
            Some(&(s, _)) if s == rcv_nxt => self.segs.pop_front().map(|(_, p)| {
                self.bytes -= p.len();
                self.mem -= p.truesize();
                p
            }),
            _ => None,
        };
        self.release_if_empty();
        ready
    }

    /// The D-SACK range the next [`Assembler::sack_blocks`] will report first, if any (the
    /// connection may want to ACK immediately: RFC 2883 §4 expects prompt reporting).
    pub fn pending_dsack(&self) -> Option<(SeqNum, SeqNum)> {
        self.dsack
    }

    /// Record a duplicate range the connection discarded itself (e.g. a segment entirely below
    /// RCV.NXT), so the next ACK D-SACKs it (RFC 2883 §4).
    pub fn note_duplicate(&mut self, start: SeqNum, end: SeqNum) {
        if start.lt(end) && (end - start) <= MAX_SPAN {
            self.dsack = Some((start, end));
            self.stats.duplicate_bytes += u64::from(end - start);
        }
    }

    /// A segment whose first SACK block was `first` went out: the pending D-SACK, if that
    /// is it, has been reported.
    pub fn on_dsack_sent(&mut self, first: (SeqNum, SeqNum)) {
        if self.dsack == Some(first) {
            self.dsack = None;
        }
    }

    /// The valid prefix length of `recent`.
    fn recent_count(&self) -> usize {
        self.recent_len as usize
    }

    fn push_recent(&mut self, seq: SeqNum) {
        let n = self.recent_count().min(RECENT - 1);
        self.recent.copy_within(0..n, 1);
        self.recent[0] = seq;
        self.recent_len = (self.recent_count() + 1).min(RECENT) as u32;
    }

    /// The contiguous queued block containing `seq`.
    fn block_containing(&self, seq: SeqNum) -> Option<(SeqNum, SeqNum)> {
        let mut block: Option<(SeqNum, SeqNum)> = None;
        for (s, p) in &self.segs {
            let e = *s + p.len();
            block = match block {
                Some((bs, be)) if be == *s => Some((bs, e)),
                Some((bs, be)) if seq.ge(bs) && seq.lt(be) => return Some((bs, be)),
                _ => Some((*s, e)),
            };
        }
        block.filter(|&(bs, be)| seq.ge(bs) && seq.lt(be))
    }

    /// Fill `out` with SACK blocks for the next ACK (whose cumulative ACK is `rcv_nxt`) and
    /// return how many were written; pass a slice of the room the header has (4 blocks, 3 with timestamps). Order: a pending D-SACK
    /// (RFC 2883 §4, reported once), then the block holding the most recently received segment
    /// and the other recently reported ones (RFC 2018 §4), then any remaining blocks in
    /// ascending order.
    pub fn sack_blocks(&mut self, rcv_nxt: SeqNum, out: &mut [(SeqNum, SeqNum)]) -> usize {
        let n = self.sack_blocks_keeping_dsack(rcv_nxt, out);
        if n > 0 && Some(out[0]) == self.dsack {
            self.dsack = None;
        }
        n
    }

    /// Like [`Assembler::sack_blocks`], but a D-SACK written first stays pending until
    /// [`Assembler::on_dsack_sent`]: for a caller that builds options for a segment it may
    /// then not send (RFC 2883 §4: the D-SACK must reach the peer once).
    pub fn sack_blocks_keeping_dsack(
        &mut self,
        rcv_nxt: SeqNum,
        out: &mut [(SeqNum, SeqNum)],
    ) -> usize {
        // RFC 2018 §3: ordinary SACK blocks describe data above the cumulative ACK, so queued
        // data below RCV.NXT is dropped first (RFC 2883 §4: it becomes the D-SACK, which may
        // lie below the cumulative ACK).
        self.trim_below(rcv_nxt);
        if out.is_empty() {
            return 0;
        }
        let mut n = 0;
        if let Some(d) = self.dsack {
            out[0] = d;
            n = 1;
        }
        // RFC 2883 §4: the block containing the duplicate follows the D-SACK even if equal to
        // it, so distinctness is only checked among the SACK blocks proper.
        let first = n;
        let mut kept = 0;
        for k in 0..self.recent_count() {
            let seq = self.recent[k];
            let Some(b) = self.block_containing(seq) else {
                continue; // delivered or evicted
            };
            self.recent[kept] = seq;
            kept += 1;
            if n < out.len() && !out[first..n].contains(&b) {
                out[n] = b;
                n += 1;
            }
        }
        self.recent_len = kept as u32;
        // RFC 2018 §4: include as many distinct blocks as there is room for.
        let mut block: Option<(SeqNum, SeqNum)> = None;
        let mut iter = self.segs.iter().map(|(s, p)| (*s, *s + p.len())).peekable();
        while n < out.len() {
            let Some((s, e)) = iter.next() else { break };
            block = Some(match block {
                Some((bs, be)) if be == s => (bs, e),
                _ => (s, e),
            });
            let closes = iter.peek().is_none_or(|&(ns, _)| ns != e);
            if closes {
                if let Some(b) = block.take() {
                    if !out[first..n].contains(&b) {
                        out[n] = b;
                        n += 1;
                    }
                }
            }
        }
        n
    }
}

#[cfg(test)]
impl<P: Payload + core::ops::Deref<Target = [u8]>> Assembler<P> {
    /// The queue's state with payload contents hashed (not their addresses): for the
    /// equivalence tests.
    pub(crate) fn digest(&self) -> String {
        let segs: Vec<(SeqNum, usize, u64)> = self
            .segs
            .iter()
            .map(|(s, p)| (*s, p.len(), crate::wire::tcp::fnv1a(p)))
            .collect();
        format!(
            "ooo(segs={segs:?} bytes={} recent={:?} dsack={:?} stats={:?})",
            self.bytes,
            &self.recent[..self.recent_count()],
            self.dsack,
            self.stats
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Asm = Assembler<Vec<u8>>;

    fn asm(max_bytes: usize, max_segments: usize) -> Asm {
        Assembler::new(AssemblerConfig {
            max_bytes,
            max_segments,
        })
        .unwrap()
    }

    fn data(from: u8, n: usize) -> Vec<u8> {
        (0..n).map(|i| from.wrapping_add(i as u8)).collect()
    }

    /// Drain everything ready at `*rcv_nxt` into `out`.
    fn drain(a: &mut Asm, rcv_nxt: &mut SeqNum, out: &mut Vec<u8>) {
        while let Some(p) = a.pop_ready(*rcv_nxt) {
            assert!(!p.is_empty());
            *rcv_nxt += p.len();
            out.extend_from_slice(&p);
        }
    }

    fn sacks(a: &mut Asm, room: usize) -> Vec<(u32, u32)> {
        let mut buf = [(SeqNum(0), SeqNum(0)); 4];
        let n = a.sack_blocks(SeqNum(0), &mut buf[..room]);
        buf[..n].iter().map(|&(l, r)| (l.0, r.0)).collect()
    }

    #[test]
    fn rfc9293_3_10_7_4_out_of_order_segments_delivered_in_order() {
        let mut a = asm(1 << 16, 16);
        let mut nxt = SeqNum(100);
        let mut out = vec![];
        a.insert(nxt, SeqNum(110), data(10, 10));
        assert_eq!(a.pop_ready(nxt), None);
        a.insert(nxt, SeqNum(100), data(0, 10));
        drain(&mut a, &mut nxt, &mut out);
        assert_eq!(out, data(0, 20));
        assert_eq!(nxt, SeqNum(120));
        assert!(a.is_empty() && a.len_bytes() == 0);
    }

    #[test]
    fn rfc9293_3_10_7_4_overlap_keeps_queued_data_and_trims_new() {
        let mut a = asm(1 << 16, 16);
        let nxt = SeqNum(0);
        a.insert(nxt, SeqNum(10), vec![b'a'; 10]);
        // Overlaps both sides of the queued segment: only the gaps are stored.
        let o = a.insert(nxt, SeqNum(5), vec![b'b'; 20]);
        assert_eq!((o.stored, o.duplicate), (10, 10));
        assert_eq!(a.segment_count(), 3);
        let mut nxt = SeqNum(5);
        let mut out = vec![];
        drain(&mut a, &mut nxt, &mut out);
        let mut want = vec![b'b'; 5];
        want.extend([b'a'; 10]);
        want.extend([b'b'; 5]);
        assert_eq!(out, want, "queued data wins");
    }

    #[test]
    fn same_seq_different_length_segments_never_corrupt() {
        // Regression class from other stacks (use-after-free on same-seq segments).
        let mut a = asm(1 << 16, 16);
        let nxt = SeqNum(0);
        a.insert(nxt, SeqNum(10), data(10, 5));
        a.insert(nxt, SeqNum(10), data(10, 20));
        a.insert(nxt, SeqNum(10), data(10, 1));
        a.insert(nxt, SeqNum(10), data(10, 30));
        a.insert(nxt, SeqNum(0), data(0, 10));
        let mut nxt = SeqNum(0);
        let mut out = vec![];
        drain(&mut a, &mut nxt, &mut out);
        assert_eq!(out, data(0, 40));
    }

    #[test]
    fn rfc9293_3_10_7_4_data_below_rcv_nxt_is_trimmed_and_dsacked() {
        let mut a = asm(1 << 16, 16);
        let o = a.insert(SeqNum(100), SeqNum(90), data(0, 20));
        assert_eq!((o.duplicate, o.stored), (10, 10));
        assert_eq!(a.pop_ready(SeqNum(100)), Some(data(10, 10)));
        // RFC 2883 §4: D-SACK reports the duplicate range first, once.
        assert_eq!(sacks(&mut a, 4), vec![(90, 100)]);
        assert_eq!(sacks(&mut a, 4), vec![]);
        // Entirely old segment.
        let o = a.insert(SeqNum(110), SeqNum(0), data(0, 50));
        assert_eq!((o.duplicate, o.stored), (50, 0));
        assert_eq!(sacks(&mut a, 4), vec![(0, 50)]);
        a.note_duplicate(SeqNum(5), SeqNum(7));
        a.note_duplicate(SeqNum(9), SeqNum(7)); // inverted: ignored
        assert_eq!(sacks(&mut a, 4), vec![(5, 7)]);
    }

    #[test]
    fn rfc2883_4_dsack_kept_until_reported_sent() {
        let mut a = asm(1 << 16, 16);
        a.note_duplicate(SeqNum(5), SeqNum(7));
        let mut buf = [(SeqNum(0), SeqNum(0)); 4];
        for _ in 0..2 {
            let n = a.sack_blocks_keeping_dsack(SeqNum(10), &mut buf);
            assert_eq!(&buf[..n], &[(SeqNum(5), SeqNum(7))]);
        }
        a.on_dsack_sent((SeqNum(1), SeqNum(2)));
        assert!(a.pending_dsack().is_some(), "another block: still pending");
        a.on_dsack_sent((SeqNum(5), SeqNum(7)));
        assert_eq!(a.pending_dsack(), None);
        assert_eq!(a.sack_blocks_keeping_dsack(SeqNum(10), &mut buf), 0);
    }

    #[test]
    fn rfc2883_4_dsack_then_containing_block() {
        let mut a = asm(1 << 16, 16);
        let nxt = SeqNum(0);
        a.insert(nxt, SeqNum(100), data(0, 50));
        a.insert(nxt, SeqNum(300), data(0, 50));
        sacks(&mut a, 4);
        // Duplicate of part of the queued [100, 150) block.
        a.insert(nxt, SeqNum(110), data(10, 10));
        assert_eq!(sacks(&mut a, 4), vec![(110, 120), (100, 150), (300, 350)]);
        // Duplicate of a whole queued block: it is still repeated as the second block.
        a.insert(nxt, SeqNum(300), data(0, 50));
        assert_eq!(sacks(&mut a, 4), vec![(300, 350), (300, 350), (100, 150)]);
    }

    #[test]
    fn rfc2018_4_first_block_is_most_recent_then_recently_reported() {
        let mut a = asm(1 << 16, 16);
        let nxt = SeqNum(0);
        a.insert(nxt, SeqNum(100), data(0, 10));
        assert_eq!(sacks(&mut a, 4), vec![(100, 110)]);
        a.insert(nxt, SeqNum(300), data(0, 10));
        assert_eq!(sacks(&mut a, 4), vec![(300, 310), (100, 110)]);
        a.insert(nxt, SeqNum(200), data(0, 10));
        assert_eq!(sacks(&mut a, 4), vec![(200, 210), (300, 310), (100, 110)]);
        // A segment extending an existing block reports the merged block first.
        a.insert(nxt, SeqNum(110), data(0, 10));
        assert_eq!(sacks(&mut a, 4), vec![(100, 120), (200, 210), (300, 310)]);
        // Room for 3 blocks (timestamps in use): the oldest-reported is left out.
        a.insert(nxt, SeqNum(400), data(0, 10));
        assert_eq!(sacks(&mut a, 3), vec![(400, 410), (100, 120), (200, 210)]);
        // With no room nothing is written (and the D-SACK is kept for later).
        assert_eq!(sacks(&mut a, 0), vec![]);
        // Delivered blocks are no longer reported.
        a.insert(nxt, SeqNum(0), data(0, 100));
        let mut n = SeqNum(0);
        drain(&mut a, &mut n, &mut vec![]);
        assert_eq!(n, SeqNum(120));
        assert_eq!(sacks(&mut a, 4), vec![(400, 410), (200, 210), (300, 310)]);
    }

    #[test]
    fn rfc2018_3_ordinary_blocks_never_cover_data_below_rcv_nxt_rfc2883_4_dsack_may() {
        let mut a = asm(1 << 16, 16);
        a.insert(SeqNum(0), SeqNum(100), data(0, 50));
        // RCV.NXT moved to 120 by another path (an in-order segment the connection delivered
        // itself), so [100, 120) arrived twice. RFC 2883 §4: the D-SACK block, first, reports
        // it although it lies below the cumulative ACK. RFC 2018 §3: the ordinary SACK
        // blocks after it describe only data above RCV.NXT: [120, 150).
        let mut buf = [(SeqNum(0), SeqNum(0)); 4];
        let n = a.sack_blocks(SeqNum(120), &mut buf);
        assert_eq!(
            &buf[..n],
            &[(SeqNum(100), SeqNum(120)), (SeqNum(120), SeqNum(150))]
        );
        for &(l, _) in &buf[1..n] {
            assert!(l.ge(SeqNum(120)), "ordinary block below RCV.NXT");
        }
        // Reported once; then the ordinary blocks alone, never below RCV.NXT.
        let n = a.sack_blocks(SeqNum(120), &mut buf);
        assert_eq!(&buf[..n], &[(SeqNum(120), SeqNum(150))]);
        let n = a.sack_blocks(SeqNum(150), &mut buf);
        assert_eq!(
            &buf[..n],
            &[(SeqNum(120), SeqNum(150))],
            "D-SACK of [120, 150)"
        );
        let n = a.sack_blocks(SeqNum(150), &mut buf);
        assert_eq!(n, 0);
        assert!(a.is_empty());
    }

    #[test]
    fn rfc2883_4_in_order_segment_repeating_queued_data_is_dsacked() {
        let mut a = asm(1 << 16, 16);
        let nxt = SeqNum(100);
        a.insert(nxt, SeqNum(110), data(10, 10));
        a.insert(nxt, SeqNum(130), data(30, 10));
        a.insert(nxt, SeqNum(200), data(0, 10));
        assert_eq!(sacks(&mut a, 4).len(), 3);
        // The connection delivers the in-order segment [100, 135) whole; it repeats the
        // queued [110, 120) and [130, 135). RFC 2883 §4: the first contiguous duplicate is
        // reported once, then the ordinary blocks above RCV.NXT.
        assert_eq!(a.pop_ready(SeqNum(135)), Some(data(35, 5)));
        let mut buf = [(SeqNum(0), SeqNum(0)); 4];
        let n = a.sack_blocks(SeqNum(140), &mut buf);
        assert_eq!(
            &buf[..n],
            &[(SeqNum(110), SeqNum(120)), (SeqNum(200), SeqNum(210))]
        );
        assert_eq!(a.stats().duplicate_bytes, 15);
        let n = a.sack_blocks(SeqNum(140), &mut buf);
        assert_eq!(&buf[..n], &[(SeqNum(200), SeqNum(210))]);
    }

    #[test]
    fn rfc2018_4_more_blocks_than_recent_fill_ascending() {
        let mut a = asm(1 << 16, 16);
        for k in 0..6u32 {
            a.insert(SeqNum(0), SeqNum(100 * (k + 1)), data(0, 10));
        }
        sacks(&mut a, 4);
        // Recent: 600, 500, 400, 300; with 4 slots those are all that fit.
        assert_eq!(
            sacks(&mut a, 4),
            vec![(600, 610), (500, 510), (400, 410), (300, 310)]
        );
    }

    #[test]
    fn memory_bounds_drop_and_count_excess() {
        let mut a = asm(100, 4);
        for k in 0..10u32 {
            a.insert(SeqNum(0), SeqNum(1000 + 100 * k), data(0, 10));
        }
        assert_eq!(a.segment_count(), 4);
        assert_eq!(a.stats().dropped_bytes, 60);
        // Byte bound: a 200-byte segment above everything is truncated to the room left.
        let o = a.insert(SeqNum(0), SeqNum(5000), data(0, 200));
        assert_eq!(o.stored, 0, "segment bound reached, nothing above fits");
        let mut b = asm(100, 16);
        let o = b.insert(SeqNum(0), SeqNum(5000), data(0, 200));
        assert_eq!((o.stored, o.dropped), (100, 100));
        assert_eq!(b.len_bytes(), 100);
    }

    /// Issue 13: no storage until the first out-of-order segment, growth never past the
    /// segment bound, and the storage freed when the queue drains or is cleared.
    #[test]
    fn storage_is_lazy_bounded_and_released_when_drained() {
        let mut a = asm(1 << 20, 100);
        assert_eq!(a.allocated_segments(), 0, "nothing reserved up front");
        // In-order data passing through (a pop with nothing queued) allocates nothing.
        assert_eq!(a.pop_ready(SeqNum(0)), None);
        assert_eq!(a.allocated_segments(), 0);
        a.insert(SeqNum(0), SeqNum(1000), data(0, 10));
        assert!((1..=4).contains(&a.allocated_segments()));
        // 150 separate segments against a bound of 100: storage stops at the bound.
        for k in 1..150u32 {
            a.insert(SeqNum(0), SeqNum(1000 + 20 * k), data(0, 10));
            assert!(a.allocated_segments() <= 100, "{}", a.allocated_segments());
        }
        assert_eq!(a.segment_count(), 100);
        assert_eq!(a.allocated_segments(), 100);
        // The sender retransmits from RCV.NXT: the holes fill, everything drains in order
        // and the storage goes with the last segment.
        let mut nxt = SeqNum(0);
        let mut out = vec![];
        for _ in 0..1000 {
            if a.is_empty() {
                break;
            }
            assert!(
                a.allocated_segments() > 0,
                "storage kept while data is queued"
            );
            a.insert(nxt, nxt, data(0, 10));
            drain(&mut a, &mut nxt, &mut out);
        }
        assert!(a.is_empty(), "drained up to {nxt:?}");
        assert_eq!(a.allocated_segments(), 0, "storage released when drained");
        // A later episode allocates again; `clear` releases too.
        a.insert(nxt, nxt + 100u32, data(0, 10));
        assert!(a.allocated_segments() > 0);
        a.clear();
        assert_eq!(a.allocated_segments(), 0, "storage released by clear");
        // A queue with data stays allocated while a pop finds nothing ready.
        a.insert(nxt, nxt + 100u32, data(0, 10));
        assert_eq!(a.pop_ready(nxt), None);
        assert!(a.allocated_segments() > 0);
    }

    #[test]
    fn lower_data_evicts_higher_so_delivery_never_deadlocks() {
        let mut a = asm(100, 4);
        for k in 0..4u32 {
            a.insert(SeqNum(0), SeqNum(1000 + 100 * k), data(0, 25));
        }
        assert_eq!(a.len_bytes(), 100);
        // The in-order segment arrives: the highest queued data is evicted for it.
        let o = a.insert(SeqNum(0), SeqNum(0), data(0, 50));
        assert_eq!((o.stored, o.evicted), (50, 50));
        assert_eq!(a.pop_ready(SeqNum(0)), Some(data(0, 50)));
        assert_eq!(a.stats().evicted_bytes, 50);
    }

    #[test]
    fn pop_ready_trims_data_delivered_by_another_path() {
        let mut a = asm(1 << 16, 16);
        a.insert(SeqNum(0), SeqNum(10), data(10, 20));
        // The connection delivered [0, 15) itself.
        assert_eq!(a.pop_ready(SeqNum(15)), Some(data(15, 15)));
        a.insert(SeqNum(30), SeqNum(40), data(0, 10));
        assert_eq!(a.pop_ready(SeqNum(100)), None);
        assert!(a.is_empty());
        assert_eq!(a.len_bytes(), 0);
    }

    #[test]
    fn hostile_segments_far_away_or_empty_are_harmless() {
        let mut a = asm(1 << 16, 16);
        let o = a.insert(SeqNum(0), SeqNum(1 << 31), data(0, 10));
        assert_eq!((o.stored, o.dropped), (0, 10));
        assert_eq!(
            a.insert(SeqNum(0), SeqNum(5), vec![]),
            InsertOutcome::default()
        );
        // Wraparound: RCV.NXT just below 2^32.
        let mut nxt = SeqNum(u32::MAX - 5);
        a.insert(nxt, SeqNum(4), data(10, 6));
        a.insert(nxt, nxt, data(0, 10));
        let mut out = vec![];
        drain(&mut a, &mut nxt, &mut out);
        assert_eq!(out, data(0, 16));
        assert_eq!(nxt, SeqNum(10));
    }

    #[test]
    fn bad_config_rejected() {
        for (b, s, e) in [
            (0, 1, AssemblerConfigError::MaxBytes),
            ((1 << 30) + 1, 1, AssemblerConfigError::MaxBytes),
            (1, 0, AssemblerConfigError::MaxSegments),
            (1, 65_537, AssemblerConfigError::MaxSegments),
        ] {
            let r = Asm::new(AssemblerConfig {
                max_bytes: b,
                max_segments: s,
            });
            assert_eq!(r.unwrap_err(), e);
            assert!(!e.to_string().is_empty());
        }
    }

    // ---- Property tests ------------------------------------------------------------------

    /// Segments of a `len`-byte stream: a covering partition plus random extra slices
    /// (duplicates and overlaps), as (offset, length).
    fn segments(len: usize) -> impl Strategy<Value = Vec<(usize, usize)>> {
        let cuts = proptest::collection::vec(1usize..len, 0..24);
        let extras = proptest::collection::vec((0usize..len, 1usize..64), 0..24);
        (cuts, extras).prop_map(move |(mut cuts, extras)| {
            cuts.push(0);
            cuts.push(len);
            cuts.sort_unstable();
            cuts.dedup();
            let mut v: Vec<(usize, usize)> = cuts.windows(2).map(|w| (w[0], w[1] - w[0])).collect();
            v.extend(extras.into_iter().map(|(o, n)| (o, n.min(len - o))));
            v
        })
    }

    /// Maximal contiguous runs of queued data.
    fn runs_of(a: &Asm) -> Vec<(SeqNum, SeqNum)> {
        let mut v: Vec<(SeqNum, SeqNum)> = vec![];
        for (s, p) in &a.segs {
            let e = *s + p.len();
            match v.last_mut() {
                Some(last) if last.1 == *s => last.1 = e,
                _ => v.push((*s, e)),
            }
        }
        v
    }

    /// Queue invariants: sorted, non-overlapping, non-empty, byte count exact, within bounds.
    fn check_invariants(a: &Asm) -> Result<(), TestCaseError> {
        let mut total = 0;
        let mut prev_end: Option<SeqNum> = None;
        for (s, p) in &a.segs {
            prop_assert!(!p.is_empty());
            if let Some(e) = prev_end {
                prop_assert!(e.le(*s), "overlap at {:?}", s);
            }
            prev_end = Some(*s + p.len());
            total += p.len();
        }
        prop_assert_eq!(total, a.len_bytes());
        prop_assert!(a.len_bytes() <= a.cfg.max_bytes);
        prop_assert!(a.segment_count() <= a.cfg.max_segments);
        prop_assert!(a.allocated_segments() <= a.cfg.max_segments);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn conflicting_retransmissions_keep_first_received_bytes(
            base in any::<u32>(),
            segs_and_order in segments(300).prop_flat_map(|s| {
                let n = s.len();
                (Just(s), Just((0..n).collect::<Vec<_>>()).prop_shuffle())
            }),
        ) {
            // A hostile peer sends different bytes for the same sequence numbers; the queue
            // keeps whatever it received first and never mixes up buffers.
            let (segs, order) = segs_and_order;
            let content = |k: usize, o: usize| (k as u8).wrapping_mul(37).wrapping_add(o as u8);
            let mut first: Vec<Option<u8>> = vec![None; 300];
            let mut a = asm(1 << 16, 256);
            let mut nxt = SeqNum(base);
            let mut out = vec![];
            for (step, &k) in order.iter().enumerate() {
                let (o, n) = segs[k];
                for (i, f) in first[o..o + n].iter_mut().enumerate() {
                    f.get_or_insert(content(step, o + i));
                }
                let bytes: Vec<u8> = (o..o + n).map(|x| content(step, x)).collect();
                a.insert(nxt, SeqNum(base) + o, bytes);
                check_invariants(&a)?;
                drain(&mut a, &mut nxt, &mut out);
            }
            let want: Vec<u8> = first.iter().map_while(|b| *b).collect();
            prop_assert_eq!(out, want);
        }

        #[test]
        fn any_order_duplication_overlap_reassembles_byte_exact(
            base in prop_oneof![Just(u32::MAX - 300), any::<u32>()],
            stream in proptest::collection::vec(any::<u8>(), 2..600),
            segs_and_order in segments(600).prop_flat_map(|s| {
                let n = s.len();
                (Just(s), Just((0..n).collect::<Vec<_>>()).prop_shuffle())
            }),
        ) {
            let (segs, order) = segs_and_order;
            let len = stream.len();
            let mut a = asm(1 << 16, 128);
            let mut nxt = SeqNum(base);
            let mut out = vec![];
            for &k in &order {
                let (o, n) = segs[k];
                if o >= len { continue; }
                let n = n.min(len - o);
                a.insert(nxt, SeqNum(base) + o, stream[o..o + n].to_vec());
                check_invariants(&a)?;
                drain(&mut a, &mut nxt, &mut out);
                prop_assert!(stream.starts_with(&out));
            }
            // Segments are cut from a 600-byte plan; cover any tail beyond it.
            a.insert(nxt, SeqNum(base), stream.clone());
            drain(&mut a, &mut nxt, &mut out);
            prop_assert_eq!(&out, &stream);
            prop_assert!(a.is_empty());
            prop_assert_eq!(a.len_bytes(), 0);
        }

        #[test]
        fn memory_bound_holds_and_retransmission_completes(
            stream in proptest::collection::vec(any::<u8>(), 100..600),
            max_bytes in 1usize..200,
            max_segments in 1usize..8,
            segs_and_order in segments(600).prop_flat_map(|s| {
                let n = s.len();
                (Just(s), Just((0..n).collect::<Vec<_>>()).prop_shuffle())
            }),
        ) {
            let (segs, order) = segs_and_order;
            let len = stream.len();
            let mut a = asm(max_bytes, max_segments);
            let mut nxt = SeqNum(7);
            let mut out = vec![];
            for &k in &order {
                let (o, n) = segs[k];
                if o >= len { continue; }
                let n = n.min(len - o);
                a.insert(nxt, SeqNum(7) + o, stream[o..o + n].to_vec());
                check_invariants(&a)?;
                // SACK blocks: an optional D-SACK first, then distinct maximal runs of queued
                // data (RFC 2018 §4: each block is a contiguous, isolated block).
                let dsack = a.pending_dsack();
                let runs = runs_of(&a);
                let mut buf = [(SeqNum(0), SeqNum(0)); 4];
                let nb = a.sack_blocks(nxt, &mut buf);
                let mut rest = &buf[..nb];
                if let Some(d) = dsack {
                    prop_assert_eq!(rest.first(), Some(&d));
                    rest = &rest[1..];
                }
                prop_assert!(a.pending_dsack().is_none(), "D-SACK reported once");
                for (i, b) in rest.iter().enumerate() {
                    prop_assert!(runs.contains(b), "{:?} not a run of {:?}", b, runs);
                    prop_assert!(!rest[..i].contains(b));
                }
                prop_assert_eq!(rest.len(), runs.len().min(4 - usize::from(dsack.is_some())));
                drain(&mut a, &mut nxt, &mut out);
                prop_assert!(stream.starts_with(&out));
            }
            // The sender retransmits in order from RCV.NXT: delivery always completes.
            while out.len() < len {
                let o = out.len();
                let n = (len - o).min(max_bytes);
                a.insert(nxt, SeqNum(7) + o, stream[o..o + n].to_vec());
                let before = out.len();
                drain(&mut a, &mut nxt, &mut out);
                prop_assert!(out.len() > before, "no progress at {}", o);
            }
            prop_assert_eq!(&out, &stream);
        }
    }

    /// A byte in a 2 KiB buffer, as a tiny segment holds its receive buffer.
    fn sparse_byte(b: u8) -> Vec<u8> {
        let mut v = Vec::with_capacity(2048);
        v.push(b);
        v
    }

    /// Collapsing copies tiny segments into compact buffers (contiguous ones together, an
    /// isolated one alone), leaves full ones as they are, and changes neither the data
    /// nor the SACK blocks: the memory behind the queue falls, nothing is reneged.
    #[test]
    fn collapse_compacts_tiny_segments_and_keeps_the_data_and_sack_blocks() {
        let mut a = asm(1 << 20, 256);
        let nxt = SeqNum(0);
        for i in 10..20u32 {
            a.insert(nxt, SeqNum(i), sparse_byte(i as u8));
        }
        a.insert(nxt, SeqNum(30), sparse_byte(30));
        a.insert(nxt, SeqNum(40), data(40, 1000));
        let before = sacks(&mut a, 4);
        assert_eq!(a.mem(), 11 * 2048 + 1000);
        let done = a.collapse();
        assert_eq!(
            done,
            Collapsed {
                buffers: 11,
                bytes: 11
            },
            "the isolated byte alone"
        );
        assert_eq!(a.segment_count(), 3);
        assert_eq!(a.mem(), 10 + 1 + 1000, "{}", a.mem());
        assert_eq!(a.len_bytes(), 1011);
        assert_eq!(sacks(&mut a, 4), before);
        assert_eq!(
            a.collapse(),
            Collapsed::default(),
            "nothing left to compact"
        );
        let mut rcv = SeqNum(0);
        let mut out = vec![];
        a.insert(rcv, SeqNum(0), data(0, 10));
        drain(&mut a, &mut rcv, &mut out);
        assert_eq!(out, data(0, 20));
        assert_eq!(a.mem(), 1 + 1000);
    }

    /// Pruning gives up the highest segments first, only above the given sequence number,
    /// until the memory behind the queue fits.
    #[test]
    fn prune_evicts_from_the_top_down_to_the_memory_asked() {
        let mut a = asm(1 << 20, 256);
        let nxt = SeqNum(0);
        for i in 0..10u32 {
            a.insert(nxt, SeqNum(10 + 2 * i), sparse_byte(i as u8));
        }
        assert_eq!(a.prune(SeqNum(0), 5 * 2048), 5);
        assert_eq!((a.segment_count(), a.mem()), (5, 5 * 2048));
        assert_eq!(a.prune(SeqNum(15), 0), 2, "not at or below 15");
        assert_eq!(sacks(&mut a, 4).last(), Some(&(14, 15)));
        assert_eq!(a.stats().evicted_bytes, 7);
    }

    proptest! {
        /// Collapsing at any moment changes nothing a peer or the application can see:
        /// the same bytes come out, and the memory accounted matches the buffers held.
        #[test]
        fn collapse_anywhere_delivers_the_same_stream(
            segs in proptest::collection::vec((0u32..400, 1usize..40, any::<bool>(), any::<bool>()), 1..80),
        ) {
            let stream: Vec<u8> = (0..512u32).map(|i| (i * 13) as u8).collect();
            let mut a = asm(1 << 20, 64);
            let mut b = asm(1 << 20, 64);
            let (mut na, mut nb) = (SeqNum(0), SeqNum(0));
            let (mut oa, mut ob) = (vec![], vec![]);
            for &(off, len, tiny, collapse) in &segs {
                let o = off as usize;
                let bytes = &stream[o..(o + len).min(stream.len())];
                let mut p = Vec::with_capacity(if tiny { 2048 } else { bytes.len() });
                p.extend_from_slice(bytes);
                a.insert(na, SeqNum(off), p.clone());
                b.insert(nb, SeqNum(off), p);
                if collapse {
                    a.collapse();
                }
                drain(&mut a, &mut na, &mut oa);
                drain(&mut b, &mut nb, &mut ob);
                prop_assert_eq!(&oa, &ob);
                prop_assert_eq!(a.len_bytes(), b.len_bytes());
                prop_assert!(a.mem() <= b.mem());
                let held: usize = a.segs.iter().map(|(_, p)| p.capacity()).sum();
                prop_assert_eq!(a.mem(), held);
            }
        }
    }
}
