//! The reply path: transmit delegation from workers to the I/O core, and request order
//! restored for ordered protocols.
//!
//! Rakaia's transmit delegation keeps worker threads from serialising on a connection's
//! TCP socket lock: each connection has a staging queue and a flag; a sender that finds
//! the flag set only enqueues; the one that finds it clear becomes the designated
//! transmitter, moves the staged replies into TCP and re-checks the queue before clearing
//! the flag. In luna the TCP state of a connection belongs to the I/O core (split mode),
//! so no worker ever touches TCP: [`Staging`] is the per-connection queue and flag, the
//! designated worker's only duty is to put the connection on the I/O core's
//! notification ring once ([`Staged::Notify`]), and the I/O core is the transmitter that
//! drains ([`Staging::drain`]). One notification per burst of replies instead of one
//! ring message per reply; workers never wait for each other or for the I/O core.
//!
//! The staging queue is bounded by the connection's in-flight cap (the framer never lets
//! more messages out), so staging cannot fail for a correct caller; a full queue is
//! reported, not hidden.
//!
//! [`Sequencer`] runs on the I/O core after the drain: for an ordered protocol it holds a
//! reply that finished early in a bounded reorder slot until every earlier one has gone
//! out; for an unordered one it passes each reply straight through.

use crate::parser::Ordering;
use crate::sync::{AtomicBool, AtomicOrdering, AtomicUsize, BoundedQueue};
use core::fmt;
use std::collections::VecDeque;

/// A finished message: its sequence number and the reply bytes (`None`: the message
/// completes without a reply, e.g. knb's NOREPLY bulk data).
pub type Completion<R> = (u64, Option<R>);

/// What [`Staging::stage`] asks of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "on Notify the caller must tell the I/O core, or the reply is never sent"]
pub enum Staged {
    /// This caller is the designated transmitter: put the connection on the I/O core's
    /// notification ring (exactly once).
    Notify,
    /// Another caller's notification covers this reply.
    Queued,
}

/// Why a reply could not be staged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageError<R> {
    /// The connection is gone; the reply is handed back (the caller counts it).
    Closed(Completion<R>),
    /// More replies than the connection's in-flight cap allows (a caller bug).
    Full(Completion<R>),
}

impl<R> fmt::Display for StageError<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StageError::Closed(_) => f.write_str("the connection closed before the reply"),
            StageError::Full(_) => f.write_str("more replies staged than messages in flight"),
        }
    }
}

impl<R: fmt::Debug> std::error::Error for StageError<R> {}

/// One connection's staging queue and transmit flag, shared by the workers (producers)
/// and the I/O core (the only consumer).
///
/// The flag is a count of staged, undrained replies: the worker whose increment finds it
/// at zero is the designated transmitter (it notifies); the drainer subtracts what it
/// took and keeps draining until its subtraction brings the count to zero. Every step is
/// a read-modify-write of one atomic, so they are totally ordered and each reads the
/// latest value: a reply staged while the I/O core drains is either taken by that drain
/// or, once the count has reached zero, notified again by its worker. (A version with a
/// boolean flag, a store and a re-check needs SeqCst fences around the queue; the loom
/// model of this module is what made us choose the count.)
pub struct Staging<R> {
    queue: BoundedQueue<Completion<R>>,
    /// Replies staged and not yet drained (non-zero: a notification is pending or the
    /// I/O core is draining).
    pending: AtomicUsize,
    closed: AtomicBool,
}

impl<R> Staging<R> {
    /// A staging queue for at most `capacity` replies (the connection's in-flight cap).
    pub fn new(capacity: usize) -> Self {
        Staging {
            queue: BoundedQueue::new(capacity.max(1)),
            pending: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        }
    }

    /// Worker side: stage the completion of message `seq`.
    pub fn stage(&self, seq: u64, reply: Option<R>) -> Result<Staged, StageError<R>> {
        if self.closed.load(AtomicOrdering::Acquire) {
            return Err(StageError::Closed((seq, reply)));
        }
        self.queue.push((seq, reply)).map_err(StageError::Full)?;
        // The push happens before this increment, so a drainer that reads the increment
        // (through the chain of read-modify-writes) finds the reply in the queue.
        if self.pending.fetch_add(1, AtomicOrdering::AcqRel) == 0 {
            Ok(Staged::Notify)
        } else {
            Ok(Staged::Queued)
        }
    }

    /// I/O core side, after a notification for this connection: hands every staged
    /// completion to `f` until the pending count reaches zero, so a reply staged during
    /// the drain is either drained here or notified again by its worker — never left.
    /// Returns how many completions were drained. (A drain without a notification is
    /// harmless.)
    pub fn drain(&self, mut f: impl FnMut(Completion<R>)) -> usize {
        let mut n = 0;
        let mut want = self.pending.load(AtomicOrdering::Acquire);
        let mut dry = false;
        while want > 0 {
            let mut took = 0;
            while took < want {
                let Some(c) = self.queue.pop() else { break };
                f(c);
                took += 1;
            }
            if took == 0 {
                // Counted replies are always in the queue (pushed before counted); reaching
                // here twice would mean that invariant broke: stop rather than spin.
                debug_assert!(!dry, "staging count ahead of its queue");
                if dry {
                    return n;
                }
                dry = true;
            }
            n += took;
            let prev = self.pending.fetch_sub(took, AtomicOrdering::AcqRel);
            want = prev - took;
        }
        n
    }

    /// I/O core side: the connection is gone. Later `stage` calls fail with `Closed`;
    /// hands what was staged and never drained to `f` (the caller counts it). A worker
    /// that staged just before the close still notifies; the drain that follows finds
    /// [`Staging::is_closed`] and counts its replies the same way.
    pub fn close(&self, f: impl FnMut(Completion<R>)) -> usize {
        self.closed.store(true, AtomicOrdering::Release);
        self.drain(f)
    }

    /// Whether [`Staging::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(AtomicOrdering::Acquire)
    }
}

/// Why a completion was refused by the [`Sequencer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceError {
    /// The message already completed (a duplicate reply).
    Duplicate(u64),
    /// Not a message of this connection in flight (beyond the reorder window).
    OutOfWindow(u64),
}

impl fmt::Display for SequenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SequenceError::Duplicate(s) => write!(f, "message {s} completed twice"),
            SequenceError::OutOfWindow(s) => write!(f, "message {s} is not in flight"),
        }
    }
}

impl std::error::Error for SequenceError {}

/// Request order for replies (I/O core side, one per connection).
pub struct Sequencer<R> {
    ordering: Ordering,
    /// Sequence number of the oldest message not yet released.
    next: u64,
    /// Reorder slot (ordered): index i holds message `next + i` once it has completed.
    held: VecDeque<Option<Option<R>>>,
    window: usize,
}

impl<R> Sequencer<R> {
    /// A sequencer for a connection whose framer lets at most `window` messages out.
    pub fn new(ordering: Ordering, window: usize) -> Self {
        Sequencer {
            ordering,
            next: 0,
            held: VecDeque::new(),
            window: window.max(1),
        }
    }

    /// Message `seq` completed with `reply`. Calls `out(reply)` for every completion that
    /// may now go out, in wire order (`None` replies are released without bytes: the
    /// caller still counts them as done); returns how many were released.
    pub fn complete(
        &mut self,
        seq: u64,
        reply: Option<R>,
        mut out: impl FnMut(Option<R>),
    ) -> Result<usize, SequenceError> {
        if self.ordering == Ordering::Unordered {
            // Each completion comes from consuming its message's origin, so it happens
            // once by construction; nothing to hold or check.
            out(reply);
            return Ok(1);
        }
        if seq < self.next {
            return Err(SequenceError::Duplicate(seq));
        }
        let at = usize::try_from(seq - self.next)
            .ok()
            .filter(|&i| i < self.window)
            .ok_or(SequenceError::OutOfWindow(seq))?;
        if self.held.len() <= at {
            self.held.resize_with(at + 1, || None);
        }
        if self.held[at].is_some() {
            return Err(SequenceError::Duplicate(seq));
        }
        self.held[at] = Some(reply);
        let mut n = 0;
        while matches!(self.held.front(), Some(Some(_))) {
            if let Some(Some(r)) = self.held.pop_front() {
                out(r);
            }
            self.next += 1;
            n += 1;
        }
        Ok(n)
    }

    /// Completions held back waiting for an earlier one.
    pub fn held(&self) -> usize {
        match self.ordering {
            Ordering::Ordered => self.held.iter().filter(|h| h.is_some()).count(),
            Ordering::Unordered => 0,
        }
    }

    /// The oldest message not yet released (ordered).
    pub fn next_seq(&self) -> u64 {
        self.next
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    proptest! {
        /// Whatever order workers finish in, an ordered connection's replies leave in
        /// request order, each exactly once.
        #[test]
        fn ordered_replies_leave_in_request_order(perm in Just((0u64..32).collect::<Vec<_>>()).prop_shuffle()) {
            let mut s = Sequencer::new(Ordering::Ordered, 32);
            let mut out = Vec::new();
            for &seq in &perm {
                s.complete(seq, Some(seq), |r| out.push(r)).unwrap();
            }
            prop_assert_eq!(out, (0..32).map(Some).collect::<Vec<_>>());
            prop_assert_eq!(s.held(), 0);
            prop_assert_eq!(s.next_seq(), 32);
        }

        /// An unordered connection's replies leave in completion order.
        #[test]
        fn unordered_replies_leave_as_they_complete(perm in Just((0u64..32).collect::<Vec<_>>()).prop_shuffle()) {
            let mut s = Sequencer::new(Ordering::Unordered, 32);
            let mut out = Vec::new();
            for &seq in &perm {
                s.complete(seq, Some(seq), |r| out.push(r.unwrap())).unwrap();
            }
            prop_assert_eq!(out, perm);
        }
    }

    #[test]
    fn a_slow_first_reply_holds_the_later_ones_back() {
        let mut s = Sequencer::new(Ordering::Ordered, 4);
        let mut out = Vec::new();
        assert_eq!(s.complete(1, Some("b"), |r| out.push(r)), Ok(0));
        assert_eq!(s.complete(2, None, |r| out.push(r)), Ok(0));
        assert_eq!(s.held(), 2);
        assert!(out.is_empty());
        assert_eq!(s.complete(0, Some("a"), |r| out.push(r)), Ok(3));
        assert_eq!(out, vec![Some("a"), Some("b"), None]);
    }

    #[test]
    fn duplicates_and_strangers_are_refused() {
        {
            let mut s = Sequencer::new(Ordering::Ordered, 4);
            s.complete(0, Some(0), |_| {}).unwrap();
            assert_eq!(
                s.complete(0, Some(0), |_| {}),
                Err(SequenceError::Duplicate(0))
            );
            s.complete(2, Some(2), |_| {}).unwrap();
            assert_eq!(
                s.complete(2, Some(2), |_| {}),
                Err(SequenceError::Duplicate(2))
            );
            assert_eq!(
                s.complete(5, Some(5), |_| {}),
                Err(SequenceError::OutOfWindow(5))
            );
            assert_eq!(
                s.complete(u64::MAX, None, |_| {}),
                Err(SequenceError::OutOfWindow(u64::MAX))
            );
        }
    }

    #[test]
    fn staging_notifies_once_per_drain() {
        let st = Staging::new(8);
        assert_eq!(st.stage(0, Some(10)), Ok(Staged::Notify));
        assert_eq!(st.stage(1, Some(11)), Ok(Staged::Queued));
        let mut got = Vec::new();
        assert_eq!(st.drain(|c| got.push(c)), 2);
        assert_eq!(got, vec![(0, Some(10)), (1, Some(11))]);
        assert_eq!(
            st.stage(2, None),
            Ok(Staged::Notify),
            "flag cleared by the drain"
        );
    }

    #[test]
    fn staging_refuses_after_close_and_when_over_capacity() {
        let st = Staging::new(1);
        assert_eq!(st.stage(0, Some(1)), Ok(Staged::Notify));
        assert_eq!(st.stage(1, Some(2)), Err(StageError::Full((1, Some(2)))));
        assert_eq!(st.close(|c| assert_eq!(c, (0, Some(1)))), 1);
        assert!(st.is_closed());
        assert_eq!(st.stage(2, Some(3)), Err(StageError::Closed((2, Some(3)))));
    }

    /// Many workers stage replies for one connection while the I/O core drains on
    /// notification: every reply arrives exactly once and no staged reply is left
    /// without a pending notification.
    #[test]
    fn staging_under_contention_loses_nothing() {
        const WORKERS: u64 = 4;
        const PER: u64 = 20_000;
        let st = Arc::new(Staging::new((WORKERS * PER) as usize));
        let ring = Arc::new(crossbeam_queue::ArrayQueue::new(1024));
        let producers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (st, ring) = (Arc::clone(&st), Arc::clone(&ring));
                std::thread::spawn(move || {
                    for i in 0..PER {
                        let seq = w * PER + i;
                        if st.stage(seq, Some(seq)).unwrap() == Staged::Notify {
                            while ring.push(()).is_err() {
                                std::thread::yield_now();
                            }
                        }
                    }
                })
            })
            .collect();
        let mut seen = vec![false; (WORKERS * PER) as usize];
        let mut n = 0u64;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while n < WORKERS * PER {
            assert!(std::time::Instant::now() < deadline, "stalled at {n}");
            if ring.pop().is_some() {
                st.drain(|(seq, r)| {
                    assert_eq!(Some(seq), r);
                    assert!(!std::mem::replace(&mut seen[seq as usize], true), "twice");
                    n += 1;
                });
            } else {
                std::thread::yield_now();
            }
        }
        for p in producers {
            p.join().unwrap();
        }
        assert!(seen.iter().all(|&s| s));
        // Nothing staged without a notification pending.
        assert!(ring.is_empty() || st.drain(|_| panic!("extra reply")) == 0);
    }
}
