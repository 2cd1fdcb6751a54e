//! The worker's end: taking work (mailbox, own FIFO, steal) and the idle protocol.
//!
//! # Idle protocol
//!
//! A worker that finds nothing to take:
//! 1. announces idle: sets its bit in the idle bitmap, then `fence(SeqCst)`;
//! 2. re-checks, without taking: its idle bit (cleared = claimed), its mailbox, its own
//!    FIFO, (MS, CS) the non-empty bitmap, and the disconnect flag;
//! 3. if it saw work it withdraws by clearing its own bit. If the bit was still set, it
//!    withdrew and goes back to taking. If the bit was already clear, a dispatcher
//!    claimed it first: the handed-off message is in the mailbox, or about to be (the
//!    dispatcher pushes then unparks), and the worker waits for it and returns it;
//! 4. otherwise it parks, and after every wake-up goes back to step 2.
//!
//! No lost wakeup: every producer of work publishes it, issues `fence(SeqCst)`, then reads
//! the idle bitmap and unparks what it finds (a dispatcher push, a popper re-setting a
//! non-empty bit, the disconnect). By the two fences either the worker's re-check sees the
//! work or the producer sees the idle bit and unparks; the parker keeps a token, so an
//! unpark that comes before `park` is not lost.
//!
//! # Mailbox invariant
//!
//! A claim only happens while the worker has announced idle with an empty mailbox, and
//! the 1-slot mailbox therefore never overflows:
//! - only a dispatcher that claimed the worker (cleared its set idle bit; of concurrent
//!   clears exactly one sees the bit set) pushes to the mailbox, once per claim;
//! - the worker sets its bit only right after taking found the mailbox empty, and a
//!   claimed worker returns the mailbox message before it can announce again;
//! - dispatches are sequential (`&mut Dispatcher`), so a claim's push completes before
//!   the next claim can start.

use super::stats::Stats;
use super::sync::{fence, yield_now, Arc, Ordering, Parker};
use super::{Model, RecvError, Shared};
use std::time::{Duration, Instant};

/// One worker thread's end of the scheduler. `Send`; use it from one thread.
pub struct Worker<T> {
    shared: Arc<Shared<T>>,
    index: usize,
    parker: Parker,
    /// Where the next steal scan starts (rotates so worker 0 is not always robbed).
    cursor: usize,
}

impl<T: Send> Worker<T> {
    pub(super) fn new(shared: Arc<Shared<T>>, index: usize, parker: Parker) -> Self {
        Worker {
            shared,
            index,
            parker,
            cursor: index + 1,
        }
    }

    /// This worker's index (`0..workers`).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Takes a message if one is available to this worker: its mailbox, its own FIFO,
    /// then (MS, CS) another worker's FIFO. Never blocks, never announces idle.
    pub fn try_recv(&mut self) -> Option<T> {
        self.take()
    }

    /// Waits up to `timeout` for a message, parked while idle. After the dispatcher is
    /// dropped, returns what is still queued, then [`RecvError::Disconnected`].
    /// A message handed to this worker as the timeout expires is returned, not lost.
    /// Under loom there is no timed park: this blocks like [`Worker::recv`].
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<T, RecvError> {
        let deadline = if cfg!(loom) {
            None
        } else {
            // A timeout too large to represent means no deadline.
            Instant::now().checked_add(timeout)
        };
        self.recv_until(deadline)
    }

    /// Waits for a message, parked while idle; [`RecvError::Disconnected`] once the
    /// dispatcher is dropped and nothing is left to take (never `Timeout`).
    pub fn recv(&mut self) -> Result<T, RecvError> {
        self.recv_until(None)
    }

    /// CS: the message of `key` this worker took is done; the dispatcher releases the
    /// key's next message when it drains the completion ring ([`super::Dispatcher::poll`],
    /// or its next `dispatch`). Use this or [`super::Dispatcher::complete`] (when the
    /// reply travels back to the I/O core anyway), not both. A completion is never
    /// dropped: if the ring is full this yields and retries until the dispatcher drains
    /// it (which it does without ever waiting for a worker); it returns at once if the
    /// dispatcher is gone. No-op under MS and CP.
    pub fn finish(&self, key: u64) {
        if self.shared.model != Model::Cs {
            return;
        }
        let mut key = key;
        while let Err(k) = self.shared.completions.push(key) {
            if self.shared.disconnected.load(Ordering::Acquire) {
                return;
            }
            key = k;
            yield_now();
        }
    }

    /// Whether the dispatcher has been dropped (queued messages may remain).
    pub fn is_disconnected(&self) -> bool {
        self.shared.disconnected.load(Ordering::Acquire)
    }

    /// A snapshot of the scheduler's counters.
    pub fn stats(&self) -> Stats {
        Stats::snapshot(&self.shared)
    }

    fn recv_until(&mut self, deadline: Option<Instant>) -> Result<T, RecvError> {
        let s = Arc::clone(&self.shared);
        let me = self.index;
        loop {
            // Read before taking: if the dispatcher was gone before we found nothing,
            // nothing can arrive any more.
            let gone = s.disconnected.load(Ordering::Acquire);
            if let Some(m) = self.take() {
                return Ok(m);
            }
            if gone {
                return self.drain_all().ok_or(RecvError::Disconnected);
            }
            // Announce idle. The mailbox is empty here (invariant in the module docs).
            s.idle.set(me);
            fence(Ordering::SeqCst);
            loop {
                if !s.idle.is_set(me) {
                    return Ok(self.claimed());
                }
                if self.has_work() {
                    if s.idle.clear(me) {
                        break; // withdrawn: take again
                    }
                    return Ok(self.claimed());
                }
                match deadline {
                    None => self.parker.park(),
                    Some(d) => {
                        let now = Instant::now();
                        if now >= d {
                            if s.idle.clear(me) {
                                return Err(RecvError::Timeout);
                            }
                            return Ok(self.claimed());
                        }
                        self.parker.park_timeout(d - now);
                    }
                }
            }
        }
    }

    /// We were claimed: the dispatcher has pushed, or is about to push, our mailbox
    /// message and unparks us after the push.
    fn claimed(&mut self) -> T {
        let slot = &self.shared.slots[self.index];
        loop {
            if let Some(m) = slot.mailbox.pop() {
                self.progress();
                return m;
            }
            self.parker.park();
        }
    }

    /// The re-check after announcing idle: looks, does not take.
    fn has_work(&self) -> bool {
        let s = &*self.shared;
        let slot = &s.slots[self.index];
        !slot.mailbox.is_empty()
            || !slot.fifo.is_empty()
            || (s.model != Model::Cp && s.nonempty.any_except(self.index))
            || s.disconnected.load(Ordering::Acquire)
    }

    fn take(&mut self) -> Option<T> {
        let s = Arc::clone(&self.shared);
        let me = self.index;
        let m = s.slots[me]
            .mailbox
            .pop()
            .or_else(|| s.pop_from(me, self.cursor))
            .or_else(|| match s.model {
                Model::Cp => None,
                Model::Ms | Model::Cs => self.steal(&s),
            });
        if m.is_some() {
            self.progress();
        }
        m
    }

    fn steal(&mut self, s: &Shared<T>) -> Option<T> {
        let n = s.slots.len();
        self.cursor = (self.cursor + 1) % n;
        let start = self.cursor;
        for j in s.nonempty.iter_from(start) {
            if j == self.index {
                continue;
            }
            if let Some(m) = s.pop_from(j, start) {
                s.counters.bump(&s.counters.steals);
                return Some(m);
            }
        }
        None
    }

    /// After disconnect: every FIFO this worker may serve, checked directly rather than
    /// through the non-empty bitmap, so a bit caught mid-update cannot end the drain early.
    fn drain_all(&mut self) -> Option<T> {
        let s = Arc::clone(&self.shared);
        let me = self.index;
        let m = s.slots[me].mailbox.pop().or_else(|| match s.model {
            Model::Cp => s.pop_from(me, me),
            Model::Ms | Model::Cs => (0..s.slots.len()).find_map(|j| {
                let m = s.pop_from(j, me);
                if m.is_some() && j != me {
                    s.counters.bump(&s.counters.steals);
                }
                m
            }),
        });
        if m.is_some() {
            self.progress();
        }
        m
    }

    fn progress(&self) {
        let c = &self.shared.slots[self.index].taken;
        c.fetch_add(1, Ordering::Relaxed);
    }
}
