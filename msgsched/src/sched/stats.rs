//! Scheduler counters (Relaxed atomics: statistics, never used for synchronization;
//! the per-worker `taken` is read here as a statistic too).

use super::sync::{AtomicU64, Ordering};
use super::Shared;

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) handoffs: AtomicU64,
    pub(crate) p2c: AtomicU64,
    pub(crate) partitioned: AtomicU64,
    pub(crate) steals: AtomicU64,
    pub(crate) held: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) wakeups: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(&self, c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// A snapshot of the scheduler's counters ([`super::Dispatcher::stats`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Messages handed directly to an idle worker's mailbox.
    pub handoffs: u64,
    /// Messages appended to a worker FIFO by power-of-two choices (MS, CS), including the
    /// fallback scan when both choices were full.
    pub p2c: u64,
    /// Messages appended to their key's worker FIFO (CP).
    pub partitioned: u64,
    /// Messages a worker took from another worker's FIFO.
    pub steals: u64,
    /// CS: messages held in the dispatcher behind their key's message in service.
    pub held: u64,
    /// Dispatches refused for lack of room (the message was returned).
    pub rejected: u64,
    /// Idle workers woken to steal (MS, CS) or to serve their FIFO (CP).
    pub wakeups: u64,
    /// Per worker.
    pub workers: Vec<WorkerStats>,
}

/// One worker's gauges and progress counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct WorkerStats {
    /// Messages in its FIFO and mailbox now.
    pub queued: usize,
    /// Messages it has taken so far (its progress counter; a worker whose count stops
    /// moving while messages wait for it is stuck).
    pub taken: u64,
    /// Whether it has announced idle (it may be parked).
    pub idle: bool,
}

impl Stats {
    pub(super) fn snapshot<T>(s: &Shared<T>) -> Stats {
        let c = &s.counters;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            handoffs: r(&c.handoffs),
            p2c: r(&c.p2c),
            partitioned: r(&c.partitioned),
            steals: r(&c.steals),
            held: r(&c.held),
            rejected: r(&c.rejected),
            wakeups: r(&c.wakeups),
            workers: s
                .slots
                .iter()
                .enumerate()
                .map(|(i, slot)| WorkerStats {
                    queued: slot.fifo.len() + slot.mailbox.len(),
                    taken: r(&slot.taken),
                    idle: s.idle.is_set(i),
                })
                .collect(),
        }
    }

    /// Workers that look stuck between `earlier` and `self`: messages were waiting for
    /// them at both snapshots and their progress counter did not move. Under MS and CS
    /// other workers steal such a worker's FIFO (a worker that never asks for work is
    /// never handed a message), so only under CP do its connections stall.
    pub fn stuck_since(&self, earlier: &Stats) -> Vec<usize> {
        self.workers
            .iter()
            .zip(&earlier.workers)
            .enumerate()
            .filter(|(_, (now, then))| now.queued > 0 && then.queued > 0 && now.taken == then.taken)
            .map(|(i, _)| i)
            .collect()
    }
}
