//! The cross-thread message scheduler: RPC messages detached from their TCP connections
//! and placed on worker threads (Rakaia's CP / CS / MS models).
//!
//! One [`Dispatcher`] lives on the I/O core; one [`Worker`] per worker thread. They are
//! created together by [`scheduler`]. Every message carries the key of its connection.
//!
//! - [`Model::Ms`] (messages shared): one logical FIFO made of per-worker bounded FIFOs.
//!   A message goes straight to an idle worker's 1-slot mailbox if one is idle (direct
//!   handoff), else to the shorter of two random workers' FIFOs (power-of-two choices).
//!   A worker takes its mailbox, then its own FIFO, then steals from a non-empty FIFO
//!   found through a bitmap.
//! - [`Model::Cs`] (connections shared): as MS, but a connection has at most one message
//!   in service; later ones wait in the dispatcher ([`Placed::Held`]) until
//!   [`Dispatcher::complete`] (or [`Worker::finish`] + [`Dispatcher::poll`]) for that key.
//! - [`Model::Cp`] (connections partitioned): a fixed hash maps a key to one worker;
//!   no handoff, no stealing.
//!
//! Back pressure, never loss: a message that cannot be placed comes back in
//! [`Rejected`]; the caller keeps it and stops reading that connection.
//!
//! Idle workers park (they do not spin). The idle/handoff protocol and its invariant are
//! described in `worker.rs` and in docs/msgsched.md ("Idle protocol (no lost wakeup) and the
//! mailbox invariant").

mod bitmap;
mod dispatcher;
mod stats;
pub(crate) mod sync;
mod worker;

#[cfg(all(test, not(loom)))]
mod tests;

pub use dispatcher::Dispatcher;
pub use stats::{Stats, WorkerStats};
pub use worker::Worker;

use bitmap::Bitmap;
use std::fmt;
use sync::{Arc, AtomicBool, AtomicU64, Parker, Queue, Unparker};

/// The most workers a scheduler supports (bitmaps are arrays of 64-bit words).
pub const MAX_WORKERS: usize = 1024;

pub use crate::model::{Model, ParseModelError};

/// Scheduler configuration.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SchedConfig {
    /// Queueing model.
    pub model: Model,
    /// Number of worker threads (1..=[`MAX_WORKERS`]).
    pub workers: usize,
    /// Capacity of each worker's FIFO; under CS also the most messages held per key.
    pub queue_capacity: usize,
    /// Seed of the dispatcher's PRNG (power-of-two choices, scan starts).
    pub seed: u64,
}

/// Why a [`SchedConfig`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedConfigError {
    /// `workers == 0`.
    #[error("a scheduler needs at least one worker")]
    NoWorkers,
    /// `workers` above [`MAX_WORKERS`].
    #[error("{workers} workers requested, at most {max} supported")]
    TooManyWorkers {
        /// Requested.
        workers: usize,
        /// Supported.
        max: usize,
    },
    /// `queue_capacity == 0`.
    #[error("worker queue capacity must be at least 1")]
    ZeroCapacity,
}

impl SchedConfig {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), SchedConfigError> {
        if self.workers == 0 {
            return Err(SchedConfigError::NoWorkers);
        }
        if self.workers > MAX_WORKERS {
            return Err(SchedConfigError::TooManyWorkers {
                workers: self.workers,
                max: MAX_WORKERS,
            });
        }
        if self.queue_capacity == 0 {
            return Err(SchedConfigError::ZeroCapacity);
        }
        Ok(())
    }
}

/// Where [`Dispatcher::dispatch`] put a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placed {
    /// Handed directly to this idle worker (its mailbox), which was woken.
    Handoff(usize),
    /// Appended to this worker's FIFO (power-of-two choices under MS/CS, the key's
    /// worker under CP).
    Queued(usize),
    /// CS only: the key has a message in service; this one waits in the dispatcher.
    Held,
}

/// A message that could not be placed (every eligible queue full, or under CS the key's
/// held FIFO full). The message is returned, never dropped: keep it and stop reading
/// its connection until there is room.
#[derive(PartialEq, Eq)]
pub struct Rejected<T> {
    /// The connection key it was dispatched with.
    pub key: u64,
    /// The message.
    pub msg: T,
}

impl<T> Rejected<T> {
    /// The message back.
    pub fn into_inner(self) -> T {
        self.msg
    }
}

impl<T> fmt::Debug for Rejected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejected")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Display for Rejected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no room for a message of key {}", self.key)
    }
}

impl<T> std::error::Error for Rejected<T> {}

/// Why [`Worker::recv_timeout`] / [`Worker::recv`] returned without a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// Nothing arrived before the timeout.
    #[error("timed out waiting for a message")]
    Timeout,
    /// The dispatcher is gone and everything queued has been taken.
    #[error("dispatcher dropped and queues drained")]
    Disconnected,
}

/// Why [`Worker::poll`] returned without a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TryRecvError {
    /// Nothing to take now; the worker is announced idle until its next poll.
    #[error("no message now")]
    Empty,
    /// The dispatcher is gone and everything queued has been taken.
    #[error("dispatcher dropped and queues drained")]
    Disconnected,
}

/// Creates a dispatcher and `cfg.workers` workers sharing one scheduler.
pub fn scheduler<T: Send>(
    cfg: &SchedConfig,
) -> Result<(Dispatcher<T>, Vec<Worker<T>>), SchedConfigError> {
    cfg.validate()?;
    let mut parkers = Vec::with_capacity(cfg.workers);
    let slots = (0..cfg.workers)
        .map(|_| {
            let (p, u) = Parker::new();
            parkers.push(p);
            Slot {
                fifo: Queue::new(cfg.queue_capacity),
                mailbox: Queue::new(1),
                unparker: u,
                taken: AtomicU64::new(0),
            }
        })
        .collect();
    let shared = Arc::new(Shared {
        model: cfg.model,
        slots,
        idle: Bitmap::new(cfg.workers),
        nonempty: Bitmap::new(cfg.workers),
        disconnected: AtomicBool::new(false),
        published: Published(AtomicU64::new(0)),
        completions: Queue::new(completion_capacity(cfg)),
        counters: stats::Counters::default(),
    });
    let workers = parkers
        .into_iter()
        .enumerate()
        .map(|(i, p)| Worker::new(shared.clone(), i, p))
        .collect();
    Ok((Dispatcher::new(shared, cfg), workers))
}

/// Room for one completion per message that can be queued or in a mailbox at once, plus
/// one in hand per worker; more is possible (a worker may take several messages before
/// finishing them), and then [`Worker::finish`] waits for the dispatcher to drain.
fn completion_capacity(cfg: &SchedConfig) -> usize {
    cfg.workers * (cfg.queue_capacity + 2)
}

/// Multiplicative (Fibonacci) hash of a key, reduced to `0..n` by multiply-shift.
fn partition(key: u64, n: usize) -> usize {
    let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    ((h * n as u64) >> 32) as usize
}

/// What the dispatcher and the workers share.
struct Shared<T> {
    model: Model,
    slots: Box<[Slot<T>]>,
    /// Workers that announced idle and may be parked (see `worker.rs`).
    idle: Bitmap,
    /// FIFOs that may be non-empty: a bit is set after every push and cleared only by a
    /// popper that saw the FIFO empty and re-checked (see [`Shared::pop_from`]).
    nonempty: Bitmap,
    disconnected: AtomicBool,
    /// Publications: bumped (Release) after every message pushed to a FIFO or mailbox and
    /// after the disconnect. While it does not move, a worker whose poll found nothing
    /// finds nothing again ([`Worker::published`]; the virtual pool skips its idle
    /// workers' polls on it). Nothing waits on it: the idle protocol does not use it.
    /// A line of its own: the dispatcher writes it for every message, and worker threads
    /// read `disconnected` and the pointers beside it on every poll.
    published: Published,
    /// CS completions from [`Worker::finish`], drained by the dispatcher.
    completions: Queue<u64>,
    counters: stats::Counters,
}

/// [`Shared::published`], alone in its cache line.
#[repr(align(64))]
struct Published(AtomicU64);

struct Slot<T> {
    fifo: Queue<T>,
    /// Direct handoff from the dispatcher; filled only after claiming the idle bit.
    mailbox: Queue<T>,
    unparker: Unparker,
    /// Messages this worker has taken (its progress counter; incremented with Release
    /// after the take, read with Acquire by [`Dispatcher::taken`] to retry refused
    /// messages only once room may have appeared).
    taken: AtomicU64,
}

impl<T> Shared<T> {
    /// Pops from FIFO `j` and keeps its non-empty bit honest: a popper that sees the FIFO
    /// empty clears the bit, then re-checks, because a push may have landed between the
    /// pop and the clear (its set of the bit came before our clear); if so it sets the
    /// bit again, with the same wake-up as a dispatcher push.
    fn pop_from(&self, j: usize, start: usize) -> Option<T> {
        let fifo = &self.slots[j].fifo;
        let m = fifo.pop();
        if self.model != Model::Cp && fifo.is_empty() && self.nonempty.clear(j) {
            // The clear (AcqRel) read every set before it, so the pushes that preceded
            // those sets are visible to this check.
            if !fifo.is_empty() {
                self.mark_nonempty(j, start);
            }
        }
        m
    }

    /// Counts a publication (a push, or the disconnect), after it.
    fn publish(&self) {
        self.published.0.fetch_add(1, sync::Ordering::Release);
    }

    /// Publishes that FIFO `j` has work, then wakes an idle worker so it can steal.
    /// The fence pairs with the one a worker issues after announcing idle: either the
    /// worker's re-check sees this bit, or this scan sees the worker's idle bit.
    fn mark_nonempty(&self, j: usize, start: usize) {
        self.nonempty.set(j);
        // After the bit, not before: other workers find FIFO `j`'s message through the
        // bit, so a driver that reads the moved count (Acquire) must see it set.
        self.publish();
        sync::fence(sync::Ordering::SeqCst);
        if let Some(w) = self.idle.iter_from(start).next() {
            self.slots[w].unparker.unpark();
            self.counters.bump(&self.counters.wakeups);
        }
    }
}
