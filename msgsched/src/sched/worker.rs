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
use super::{Model, RecvError, Shared, TryRecvError};
use std::time::{Duration, Instant};

/// An announcement by `poll` ended: free to take, or claimed by a dispatcher.
enum Settled<T> {
    Free,
    Claimed(Option<T>),
}

/// One worker thread's end of the scheduler. `Send`; use it from one thread.
pub struct Worker<T> {
    shared: Arc<Shared<T>>,
    index: usize,
    parker: Parker,
    /// Where the next steal scan starts (rotates so worker 0 is not always robbed).
    cursor: usize,
    /// [`Worker::poll`] left this worker announced idle (its bit set, or cleared by a
    /// dispatcher's claim whose mailbox message is still to be taken).
    announced: bool,
}

impl<T: Send> Worker<T> {
    pub(super) fn new(shared: Arc<Shared<T>>, index: usize, parker: Parker) -> Self {
        Worker {
            shared,
            index,
            parker,
            cursor: index + 1,
            announced: false,
        }
    }

    /// This worker's index (`0..workers`).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Takes a message if one is available to this worker: its mailbox, its own FIFO,
    /// then (MS, CS) another worker's FIFO. Never blocks, never announces idle (it
    /// withdraws an announcement left by [`Worker::poll`]).
    pub fn try_recv(&mut self) -> Option<T> {
        match self.settle() {
            Settled::Free => self.take(),
            Settled::Claimed(m) => m,
        }
    }

    /// Non-blocking receive that takes part in the idle protocol, for a driver that runs
    /// many workers on one thread (virtual workers, [`crate::virt`]): a worker that
    /// polls is idle, one that does not is busy. Takes what [`Worker::try_recv`] takes;
    /// when there is nothing, the worker stays *announced idle* until its next `poll`
    /// (or `try_recv` / `recv*`), so under MS and CS the dispatcher may hand it a
    /// message directly, which the next `poll` returns. Once `poll` has returned a
    /// message the worker is not idle: it gets no handoff and steals nothing until it
    /// polls again. Never parks or waits: if a dispatcher claimed this worker and has
    /// not yet filled its mailbox, this returns `Empty` and the next poll takes it.
    /// After the dispatcher is dropped: what is still queued, then `Disconnected`.
    pub fn poll(&mut self) -> Result<T, TryRecvError> {
        // `self.shared` is borrowed per use, not cloned: an `Arc` clone is two atomic
        // read-modify-writes on a count every worker shares, a cache line bouncing
        // between the workers' cores on every poll.
        let me = self.index;
        if self.announced {
            if !self.shared.idle.is_set(me) {
                return self.claimed_now();
            }
            if !self.has_work() {
                return Err(TryRecvError::Empty);
            }
            if !self.shared.idle.clear(me) {
                // Claimed between the two checks.
                return self.claimed_now();
            }
            self.announced = false;
        }
        // Read before taking: if the dispatcher was gone before we found nothing,
        // nothing can arrive any more.
        let gone = self.shared.disconnected.load(Ordering::Acquire);
        if let Some(m) = self.take() {
            return Ok(m);
        }
        if gone {
            return self.drain_all().ok_or(TryRecvError::Disconnected);
        }
        // Announce idle (the mailbox is empty: invariant in the module docs), then the
        // same re-check as a parking worker: work published before the announcement
        // is seen here; work published after it sees the bit (and the next poll's
        // `has_work` sees the work).
        self.shared.idle.set(me);
        fence(Ordering::SeqCst);
        self.announced = true;
        if !self.shared.idle.is_set(me) {
            return self.claimed_now();
        }
        if self.has_work() {
            if !self.shared.idle.clear(me) {
                return self.claimed_now();
            }
            self.announced = false;
            // Someone else may have taken it meanwhile: then this poll found nothing
            // and the next one announces again.
            return match self.take() {
                Some(m) => Ok(m),
                None if self.shared.disconnected.load(Ordering::Acquire) => {
                    self.drain_all().ok_or(TryRecvError::Disconnected)
                }
                None => Err(TryRecvError::Empty),
            };
        }
        Err(TryRecvError::Empty)
    }

    /// Whether [`Worker::poll`] left this worker announced idle.
    pub fn is_announced(&self) -> bool {
        self.announced
    }

    /// How many times the dispatcher has published so far (a message pushed to any FIFO
    /// or mailbox, or its disconnect; read with Acquire). If it has not moved since
    /// before a [`Worker::poll`] that found nothing, another poll finds nothing either
    /// (workers take, they do not publish; a worker dropped with a claimed message
    /// re-publishes it). A hint for a driver that polls many idle workers in turn (the
    /// virtual pool): it is no part of the idle protocol and wakes nobody.
    pub fn published(&self) -> u64 {
        self.shared.published.0.load(Ordering::Acquire)
    }

    /// Whether `other` is a worker of the same scheduler.
    pub(crate) fn same_scheduler(&self, other: &Worker<T>) -> bool {
        std::ptr::eq(&*self.shared, &*other.shared)
    }

    /// Claimed while announced by `poll`: the mailbox message, or `Empty` if the
    /// dispatcher has not pushed it yet (it will: the worker stays announced).
    fn claimed_now(&mut self) -> Result<T, TryRecvError> {
        match self.shared.slots[self.index].mailbox.pop() {
            Some(m) => {
                self.announced = false;
                self.progress();
                Ok(m)
            }
            None => Err(TryRecvError::Empty),
        }
    }

    /// Ends an announcement left by `poll` before taking any other way: withdrawn
    /// (`Free`), or claimed (`Claimed` with the mailbox message, or `None` while the
    /// dispatcher has not pushed it; the worker then stays announced).
    fn settle(&mut self) -> Settled<T> {
        if !self.announced {
            return Settled::Free;
        }
        if self.shared.idle.clear(self.index) {
            self.announced = false;
            return Settled::Free;
        }
        Settled::Claimed(self.claimed_now().ok())
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
        if self.announced {
            // Left announced by `poll`: withdraw, or take the claimed message.
            if !s.idle.clear(me) {
                self.announced = false;
                return Ok(self.claimed());
            }
            self.announced = false;
        }
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
        let me = self.index;
        let s = &*self.shared;
        let m = s.slots[me]
            .mailbox
            .pop()
            .or_else(|| s.pop_from(me, self.cursor))
            .or_else(|| match s.model {
                Model::Cp => None,
                Model::Ms | Model::Cs => steal(s, me, &mut self.cursor),
            });
        if m.is_some() {
            self.progress();
        }
        m
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

    /// Counts a take, after it: Release, so a dispatcher that reads the new count
    /// ([`super::Dispatcher::taken`]) sees the room the take made.
    fn progress(&self) {
        let c = &self.shared.slots[self.index].taken;
        c.fetch_add(1, Ordering::Release);
    }
}

/// MS, CS: one message from another worker's FIFO, scanning the non-empty bitmap from
/// the worker's rotating `cursor` (advanced first, so successive steals spread).
fn steal<T>(s: &Shared<T>, me: usize, cursor: &mut usize) -> Option<T> {
    let n = s.slots.len();
    *cursor = (*cursor + 1) % n;
    let start = *cursor;
    for j in s.nonempty.iter_from(start) {
        if j == me {
            continue;
        }
        if let Some(m) = s.pop_from(j, start) {
            s.counters.bump(&s.counters.steals);
            return Some(m);
        }
    }
    None
}

impl<T> Drop for Worker<T> {
    /// A worker dropped while [`Worker::poll`] left it announced idle must not keep a
    /// dispatcher's handoff nobody will take: it withdraws its idle bit, or, if a
    /// dispatcher claimed it first, passes the claimed message on through its own FIFO,
    /// which the others steal (claims happen under MS and CS only). With that FIFO full
    /// the message is dropped (a `MsgSocket`'s then completes unanswered, counted as
    /// abandoned) rather than stranded.
    fn drop(&mut self) {
        if !self.announced {
            return;
        }
        let s = &*self.shared;
        let me = self.index;
        if s.idle.clear(me) {
            return;
        }
        // Claimed: the dispatcher fills the mailbox right after its claim, inside the
        // same `dispatch` call, so this wait is short.
        let m = loop {
            if let Some(m) = s.slots[me].mailbox.pop() {
                break m;
            }
            yield_now();
        };
        if s.slots[me].fifo.push(m).is_ok() {
            s.mark_nonempty(me, me + 1);
        }
    }
}
