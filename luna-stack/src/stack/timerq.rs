//! The stack's timer queue: each connection's next deadline, earliest first.
//!
//! A binary heap of `(deadline, slot, generation)` that is lazy in both directions, and a
//! dense per-slot record that the heap's entries are checked against:
//! - A deadline that moves *earlier* is pushed at once (`queued` records the earliest one
//!   the heap holds for the slot; any other entry for it is stale and skipped).
//! - A deadline that moves *later* or goes away (the common case: every ACK restarts the
//!   retransmission timer, every flight the loss probe) costs nothing until the old entry
//!   comes due; then `pop_due` finds in the record that the connection wants a later
//!   time and moves the entry there, without touching the connection. Before this record
//!   existed each such entry woke its connection, whose cold state was loaded only to
//!   learn it had nothing to do; with tail loss probes on (a deadline two round trips
//!   ahead, moved on every flight) that was a wake-up every two round trips per busy
//!   connection.
//! - A stale entry leaves the heap when it reaches the head, so entries stuck behind an
//!   earlier live deadline (another connection's keepalive) would pile up, one per RPC of
//!   a connection whose far keepalive is pushed in front of and moved back on every RPC.
//!   When the heap holds more than two entries per slot (+ 64), it is rebuilt from the
//!   records, one entry per slot (`compact`, amortised O(1) per push).
//!
//! The record is only as good as the last [`TimerQueue::schedule`] of the slot, which the
//! stack calls after every change to a connection: every input, timeout and application
//! call (`after_activity`), and every segment polled for transmission (a driver may stop
//! polling in the middle of a connection's burst). A deadline recorded earlier than the
//! connection's own is harmless (the connection is woken, finds nothing due and is
//! scheduled again); one recorded later is a missed timer. (The old heap, which woke the
//! connection at every queued time, hid such a gap when an older entry happened to come
//! due first.)

use crate::time::Instant;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// No deadline.
const NONE: u64 = u64::MAX;

/// The heap is rebuilt from the records (`TimerQueue::compact`) when it holds more than
/// this many entries per slot, plus [`COMPACT_SLACK`]: at most one per slot is live.
const COMPACT_FACTOR: usize = 2;
const COMPACT_SLACK: usize = 64;

/// One slot's record.
#[derive(Debug, Clone, Copy)]
struct SlotTimer {
    /// The generation the record is for (the slot table's: a reused slot starts afresh).
    gen: u32,
    /// The earliest deadline the heap holds for this slot and generation, or `NONE`.
    queued: u64,
    /// The connection's next deadline as last scheduled, or `NONE`.
    next: u64,
}

impl Default for SlotTimer {
    fn default() -> Self {
        SlotTimer {
            gen: 0,
            queued: NONE,
            next: NONE,
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct TimerQueue {
    heap: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    slots: Vec<SlotTimer>,
    /// Heap entries moved later by `pop_due` without waking their connection.
    moved: u64,
    /// Connections handed out as due by `pop_due`.
    woken: u64,
    /// Times the heap was rebuilt from the records (`compact`).
    compacted: u64,
}

impl TimerQueue {
    /// A connection took slot `idx` with generation `gen`: the heap's entries for the
    /// slot's earlier connections are stale from now on.
    pub(super) fn open(&mut self, idx: u32, gen: u32) {
        let i = idx as usize;
        if i >= self.slots.len() {
            self.slots.resize(i + 1, SlotTimer::default());
        }
        self.slots[i] = SlotTimer {
            gen,
            ..SlotTimer::default()
        };
    }

    /// Slot `idx` (opened with generation `gen`) now wants `next`. Pushes it if it is
    /// earlier than what the heap holds for the slot; otherwise only records it. Runs
    /// after every change to a connection: a store and a compare.
    #[inline(always)]
    pub(super) fn schedule(&mut self, idx: u32, gen: u32, next: Option<Instant>) {
        let n = next.map_or(NONE, Instant::as_nanos);
        debug_assert!(next.is_none() || n != NONE, "a deadline at the end of time");
        let Some(s) = self.slots.get_mut(idx as usize) else {
            debug_assert!(false, "slot {idx} scheduled before it was opened");
            return;
        };
        debug_assert_eq!(s.gen, gen, "slot {idx} scheduled for another generation");
        s.next = n;
        if n < s.queued {
            s.queued = n;
            self.heap.push(Reverse((Instant::from_nanos(n), idx, gen)));
            if self.heap.len() > COMPACT_FACTOR * self.slots.len() + COMPACT_SLACK {
                self.compact();
            }
        }
    }

    /// Rebuilds the heap from the records: one entry per slot with a queued deadline, the
    /// stale ones dropped. A stale entry leaves the heap only when it reaches the head, so
    /// one behind a live deadline stays until that deadline passes: a connection whose far
    /// deadline (a keepalive) is pushed in front of, and moved back to, on every RPC would
    /// otherwise leave one entry per RPC behind another connection's earlier one. Runs
    /// once per `slots.len()` pushes or more: amortized O(1) per push.
    #[cold]
    #[inline(never)]
    fn compact(&mut self) {
        let mut v = core::mem::take(&mut self.heap).into_vec();
        v.clear();
        v.extend(
            self.slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.queued != NONE)
                .map(|(i, s)| Reverse((Instant::from_nanos(s.queued), i as u32, s.gen))),
        );
        self.heap = BinaryHeap::from(v);
        self.compacted += 1;
    }

    /// Slot `idx` was freed: nothing of it stays live in the heap.
    pub(super) fn forget(&mut self, idx: u32) {
        if let Some(s) = self.slots.get_mut(idx as usize) {
            s.queued = NONE;
            s.next = NONE;
        }
    }

    /// The earliest deadline the heap holds for a live connection (stale entries are
    /// dropped): never later than any connection's own, and earlier only when that
    /// connection's deadline moved later since (then `pop_due` at that time moves it on
    /// and hands out nothing). Moving entries here instead would move the head on every
    /// poll of a busy stack, long before its time.
    pub(super) fn next(&mut self) -> Option<Instant> {
        self.live_head().map(|(t, _, _)| Instant::from_nanos(t))
    }

    /// The head entry once stale entries are dropped: (deadline, slot, generation).
    #[inline]
    fn live_head(&mut self) -> Option<(u64, u32, u32)> {
        while let Some(&Reverse((t, idx, gen))) = self.heap.peek() {
            let tn = t.as_nanos();
            match self.slots.get(idx as usize) {
                Some(s) if s.gen == gen && s.queued == tn => return Some((tn, idx, gen)),
                _ => {
                    self.heap.pop();
                }
            }
        }
        None
    }

    /// Whether nothing is due at `now`: the heap's first entry, live or stale, is later
    /// (or there is none), so [`pop_due`](Self::pop_due) would hand out nothing. Stale
    /// entries ahead of `now` stay until they come due or [`next`](Self::next) passes.
    #[inline]
    pub(super) fn nothing_due(&self, now: Instant) -> bool {
        self.heap
            .peek()
            .is_none_or(|&Reverse((t, _, _))| t.as_nanos() > now.as_nanos())
    }

    /// The next connection (slot, generation) whose deadline is due at `now`; its entry
    /// leaves the heap (the caller runs it and schedules it again). An entry that comes
    /// due for a connection that since wants a later time (or none) is moved there
    /// instead, without handing the connection out.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<(u32, u32)> {
        let now = now.as_nanos();
        loop {
            let (t, idx, gen) = self.live_head()?;
            if t > now {
                return None;
            }
            let s = &mut self.slots[idx as usize];
            if s.next > t {
                self.moved += 1;
                s.queued = s.next;
                if s.next != NONE {
                    // In place: one sift down instead of a pop and a push.
                    if let Some(mut top) = self.heap.peek_mut() {
                        *top = Reverse((Instant::from_nanos(s.next), idx, gen));
                    }
                } else {
                    self.heap.pop();
                }
                continue;
            }
            self.heap.pop();
            s.queued = NONE;
            self.woken += 1;
            return Some((idx, gen));
        }
    }

    /// Entries in the heap, stale ones included.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.heap.len()
    }

    /// Heap entries moved later without waking their connection, since the stack began.
    #[cfg(test)]
    pub(super) fn moved(&self) -> u64 {
        self.moved
    }

    /// Connections handed out as due, since the stack began.
    #[cfg(test)]
    pub(super) fn woken(&self) -> u64 {
        self.woken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ns: u64) -> Option<Instant> {
        Some(Instant::from_nanos(ns))
    }

    #[test]
    fn earliest_first_and_due_only_at_its_time() {
        let mut q = TimerQueue::default();
        for i in 0..4 {
            q.open(i, 0);
        }
        q.schedule(3, 0, at(300));
        q.schedule(1, 0, at(100));
        q.schedule(2, 0, at(200));
        assert_eq!(q.next(), at(100));
        assert_eq!(q.pop_due(Instant::from_nanos(99)), None);
        assert_eq!(q.pop_due(Instant::from_nanos(250)), Some((1, 0)));
        assert_eq!(q.pop_due(Instant::from_nanos(250)), Some((2, 0)));
        assert_eq!(q.pop_due(Instant::from_nanos(250)), None);
        assert_eq!(q.next(), at(300));
    }

    #[test]
    fn a_deadline_moved_earlier_is_due_at_the_earlier_time() {
        let mut q = TimerQueue::default();
        q.open(0, 0);
        q.schedule(0, 0, at(500));
        q.schedule(0, 0, at(100));
        assert_eq!(q.pop_due(Instant::from_nanos(100)), Some((0, 0)));
        // The entry at 500 is stale: nothing else is due, ever.
        assert_eq!(q.pop_due(Instant::from_nanos(1_000)), None);
        assert_eq!(q.next(), None);
    }

    #[test]
    fn a_deadline_moved_later_is_not_due_at_the_old_time() {
        let mut q = TimerQueue::default();
        q.open(0, 0);
        q.schedule(0, 0, at(100));
        q.schedule(0, 0, at(400));
        // Polled before its time, the old entry shows (harmlessly early); at its time it
        // is moved on, not handed out.
        assert_eq!(q.next(), at(100));
        assert_eq!(q.pop_due(Instant::from_nanos(100)), None);
        assert_eq!(q.moved(), 1);
        assert_eq!(q.next(), at(400));
        assert_eq!(q.pop_due(Instant::from_nanos(400)), Some((0, 0)));
        // Cancelled after it was pushed: never due.
        q.schedule(0, 0, at(600));
        q.schedule(0, 0, None);
        assert_eq!(q.pop_due(Instant::from_nanos(u64::MAX - 1)), None);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn a_freed_or_reused_slot_drops_its_old_deadlines() {
        let mut q = TimerQueue::default();
        q.open(0, 0);
        q.schedule(0, 0, at(100));
        q.forget(0);
        assert_eq!(q.pop_due(Instant::from_nanos(1_000)), None);
        q.open(1, 0);
        q.schedule(1, 0, at(100));
        // The slot's next connection (generation 1) wants a later time than its
        // predecessor's entry: the old entry neither fires nor blocks the new one.
        q.open(1, 1);
        q.schedule(1, 1, at(700));
        assert_eq!(q.pop_due(Instant::from_nanos(500)), None);
        assert_eq!(q.pop_due(Instant::from_nanos(700)), Some((1, 1)));
    }

    /// The latest deadline a connection can have (`u64::MAX - 1` ns, a saturated sum) is
    /// armed, not "none": queued, due at its time, and moved to like any other.
    #[test]
    fn a_deadline_at_the_end_of_time_is_not_none() {
        let end = u64::MAX - 1;
        let mut q = TimerQueue::default();
        q.open(0, 0);
        q.schedule(0, 0, at(end));
        assert_eq!(q.next(), at(end));
        assert_eq!(q.pop_due(Instant::from_nanos(end - 1)), None);
        assert_eq!(q.pop_due(Instant::from_nanos(end)), Some((0, 0)));
        q.schedule(0, 0, at(5));
        q.schedule(0, 0, at(end));
        assert_eq!(q.pop_due(Instant::from_nanos(5)), None);
        assert_eq!(q.next(), at(end));
        assert_eq!(q.pop_due(Instant::from_nanos(u64::MAX)), Some((0, 0)));
        assert_eq!(q.next(), None);
    }

    /// A slot whose deadline is always a far one (a keepalive) with an earlier one pushed
    /// in front of it now and then, the far one moving later each time: every far entry
    /// left behind is stale until its time comes, but the heap must not keep one per
    /// push (here 100 000 pass before the first far time).
    #[test]
    fn stale_far_entries_do_not_pile_up() {
        let mut q = TimerQueue::default();
        q.open(0, 0);
        q.open(1, 0);
        let far = 1_000_000_000_000u64;
        let mut now = 0u64;
        q.schedule(1, 0, at(far / 2));
        for _ in 0..100_000 {
            q.schedule(0, 0, at(now + far));
            q.schedule(0, 0, at(now + 10));
            q.schedule(0, 0, at(now + far + 1));
            now += 10;
            assert_eq!(q.pop_due(Instant::from_nanos(now)), None);
            assert!(q.len() <= 100, "{} entries for two slots", q.len());
        }
        assert_eq!(q.next(), at(far / 2));
        assert_eq!(q.pop_due(Instant::from_nanos(far / 2)), Some((1, 0)));
        // Slot 0's last deadline, `far + 1` after the last round began, and nothing else.
        assert_eq!(q.pop_due(Instant::from_nanos(now - 10 + far)), None);
        assert_eq!(
            q.pop_due(Instant::from_nanos(now - 10 + far + 1)),
            Some((0, 0))
        );
        assert_eq!(q.pop_due(Instant::from_nanos(u64::MAX - 1)), None);
    }

    /// Against a plain model: the due connections at each step are exactly those whose
    /// last scheduled deadline has passed, each once per scheduling.
    #[test]
    fn matches_a_model_under_random_rescheduling() {
        model_run(0x9e37_79b9_7f4a_7c15, 0);
    }

    /// As above with one deadline in four far ahead (a keepalive): stale entries pile up
    /// behind live ones and the heap is compacted, under the same model.
    #[test]
    fn matches_a_model_with_far_deadlines_and_compaction() {
        let q = model_run(0x2545_f491_4f6c_dd1d, 1_000_000);
        assert!(q.compacted > 0, "never compacted");
    }

    /// The model run of the two tests above: deadlines up to 1 000 ahead, and with `far`
    /// non-zero one in four up to `far` ahead. Returns the queue at the end.
    fn model_run(seed: u64, far: u64) -> TimerQueue {
        let mut rng = seed;
        let mut step = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut q = TimerQueue::default();
        let n = 16u32;
        let mut model: Vec<Option<u64>> = vec![None; n as usize];
        let mut gens = vec![0u32; n as usize];
        for i in 0..n {
            q.open(i, 0);
        }
        let mut now = 0u64;
        for _ in 0..20_000 {
            let idx = (step() % u64::from(n)) as u32;
            match step() % 8 {
                0 => {
                    // Freed and reused.
                    q.forget(idx);
                    gens[idx as usize] += 1;
                    q.open(idx, gens[idx as usize]);
                    model[idx as usize] = None;
                }
                1 => {
                    q.schedule(idx, gens[idx as usize], None);
                    model[idx as usize] = None;
                }
                m => {
                    let span = if far != 0 && m % 4 == 0 { far } else { 1_000 };
                    let t = now + step() % span;
                    q.schedule(idx, gens[idx as usize], at(t));
                    model[idx as usize] = Some(t);
                }
            }
            now += step() % 50;
            let mut due = Vec::new();
            while let Some((i, g)) = q.pop_due(Instant::from_nanos(now)) {
                assert_eq!(g, gens[i as usize], "a stale generation fired");
                due.push(i);
            }
            due.sort_unstable();
            let mut want: Vec<u32> = (0..n)
                .filter(|&i| model[i as usize].is_some_and(|t| t <= now))
                .collect();
            want.sort_unstable();
            assert_eq!(due, want, "at {now}");
            for &i in &due {
                // Run: a due connection is scheduled again by the stack; here, not at all.
                model[i as usize] = None;
                q.schedule(i, gens[i as usize], None);
            }
            // Never later than the earliest deadline wanted (no timer missed); earlier
            // only for deadlines moved later that have not come up yet.
            let earliest = model.iter().flatten().min().copied();
            if let Some(e) = earliest {
                let head = q.next().map(Instant::as_nanos);
                assert!(head.is_some_and(|h| h <= e), "head {head:?}, want {e}");
            }
            assert!(q.len() <= COMPACT_FACTOR * n as usize + COMPACT_SLACK);
        }
        q
    }
}
