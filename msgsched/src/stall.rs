//! Connections whose next message the scheduler refused (back pressure), waiting in
//! line for room: shared by [`crate::socket::MsgIo`] and [`crate::proto::io::SessionIo`].
//!
//! Event-driven, so that an overloaded I/O core does not spend itself on retries:
//! - one FIFO line per *class* of room: under CP one per worker (a key's messages go to
//!   its worker's FIFO only), under MS and CS one for all (a refusal there means every
//!   FIFO is full);
//! - a line is retried only once a worker of its class has taken a message since the
//!   last look ([`crate::sched::Dispatcher::taken`]), head first, and the round stops at
//!   the first refusal: O(workers + messages placed) per poll, not O(stalled);
//! - fairness: while a line has connections waiting, a new message of its class does
//!   not try the scheduler but joins the line behind them, so a stalled connection is
//!   never overtaken (and a connection whose turn came places one message per turn).
//!
//! Entries are removed lazily (a detached key is skipped when it comes up); `live` counts
//! the real ones, so a line with only stale entries holds nobody back, and a line that
//! becomes mostly stale is compacted ([`Stalls::detached`]): one that does not move must
//! not grow with every connection that joins it and closes.

use crate::sched::{Dispatcher, Model};
use std::collections::VecDeque;
/// Connections a driver stopped reading ([`crate::socket::MsgIo::wait_input`],
/// [`crate::proto::io::SessionIo::wait_input`]) that take input again, in the order they
/// did: each wait is reported once. Shared by both I/O sides.
#[derive(Debug, Default)]
pub(crate) struct Resumed(VecDeque<u64>);

impl Resumed {
    /// `key`'s driver waits (`*blocked`); if it takes input now, report it once.
    pub(crate) fn check(&mut self, key: u64, blocked: &mut bool, takes_input: bool) {
        if *blocked && takes_input {
            *blocked = false;
            self.0.push_back(key);
        }
    }

    /// The next key reported (it may have been detached since: the caller skips it).
    pub(crate) fn pop(&mut self) -> Option<u64> {
        self.0.pop_front()
    }
}

pub(crate) struct Stalls {
    cp: bool,
    lines: Vec<VecDeque<u64>>,
    /// Connections really waiting per line (entries minus stale ones).
    live: Vec<usize>,
    /// Per worker, its progress count at the last look.
    seen: Vec<u64>,
    /// Sum of `live`.
    total: usize,
}

impl Stalls {
    pub(crate) fn new<T: Send>(d: &Dispatcher<T>) -> Self {
        let cp = d.model() == Model::Cp;
        let lines = if cp { d.workers() } else { 1 };
        Stalls {
            cp,
            lines: vec![VecDeque::new(); lines],
            live: vec![0; lines],
            seen: (0..d.workers()).map(|w| d.taken(w)).collect(),
            total: 0,
        }
    }

    /// The line a message of `key` waits in.
    pub(crate) fn class<T: Send>(&self, d: &Dispatcher<T>, key: u64) -> usize {
        if self.cp {
            d.worker_of(key)
        } else {
            0
        }
    }

    /// Whether connections wait in line `class` (a new message must join them).
    pub(crate) fn waiting(&self, class: usize) -> bool {
        self.live[class] > 0
    }

    /// `key` joins line `class`: at the back, or at the front when its turn was refused.
    pub(crate) fn push(&mut self, class: usize, key: u64, front: bool) {
        if self.live[class] == 0 {
            // Only stale entries left: drop them.
            self.lines[class].clear();
        }
        if front {
            self.lines[class].push_front(key);
        } else {
            self.lines[class].push_back(key);
        }
        self.live[class] += 1;
        self.total += 1;
    }

    /// The next entry of line `class` (possibly stale: the caller checks, and calls
    /// [`Stalls::left`] for a real one).
    pub(crate) fn pop(&mut self, class: usize) -> Option<u64> {
        if self.live[class] == 0 {
            self.lines[class].clear();
            return None;
        }
        self.lines[class].pop_front()
    }

    /// A connection really waiting in `class` left it (its turn came, or it was detached
    /// while waiting; its entry, if still there, is stale).
    pub(crate) fn left(&mut self, class: usize) {
        self.live[class] -= 1;
        self.total -= 1;
    }

    /// A connection really waiting in line `class` left it for good (detached): its
    /// entry stays, stale, and `true` says the line is now mostly stale entries and the
    /// caller should [`Stalls::compact`] it. So a line that does not move (CP, its worker
    /// stopped) holds at most about twice its waiting connections, however many joined
    /// it and closed, at O(1) amortized per detach.
    #[must_use]
    pub(crate) fn detached(&mut self, class: usize) -> bool {
        self.left(class);
        self.lines[class].len() > 2 * self.live[class] + 32
    }

    /// Drops the stale entries of line `class`: `waits(key)` says whether `key` really
    /// waits in it. The waiting ones keep their order.
    pub(crate) fn compact(&mut self, class: usize, waits: impl Fn(u64) -> bool) {
        self.lines[class].retain(|&k| waits(k));
        debug_assert_eq!(self.lines[class].len(), self.live[class]);
    }

    /// Entries in every line, stale ones included (tests: memory bounds).
    #[cfg(test)]
    pub(crate) fn entries(&self) -> usize {
        self.lines.iter().map(VecDeque::len).sum()
    }

    /// Lines to retry now: those with connections waiting in which a worker of the line
    /// has taken a message since the last look. The counts are read before the retries,
    /// so a take that lands after a refusal moves a count past this read and is seen at
    /// the next call.
    pub(crate) fn ready<T: Send>(&mut self, d: &Dispatcher<T>, out: &mut Vec<usize>) {
        out.clear();
        if self.total == 0 {
            return;
        }
        let mut any = false;
        for (w, seen) in self.seen.iter_mut().enumerate() {
            let t = d.taken(w);
            if t != *seen {
                *seen = t;
                any = true;
                if self.cp && self.live[w] > 0 {
                    out.push(w);
                }
            }
        }
        if !self.cp && any && self.live[0] > 0 {
            out.push(0);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sched::{scheduler, SchedConfig};

    fn dispatcher(model: Model) -> (Dispatcher<u32>, Vec<crate::sched::Worker<u32>>) {
        let cfg = SchedConfig {
            model,
            workers: 2,
            queue_capacity: 1,
            seed: 3,
        };
        scheduler(&cfg).unwrap()
    }

    #[test]
    fn a_line_of_stale_entries_holds_nobody_back_and_is_retried_only_after_a_take() {
        let (mut d, mut w) = dispatcher(Model::Ms);
        let mut st = Stalls::new(&d);
        let mut ready = Vec::new();
        st.push(0, 5, false);
        st.push(0, 6, false);
        assert!(st.waiting(0));
        // No worker took anything: nothing to retry.
        st.ready(&d, &mut ready);
        assert!(ready.is_empty());
        // Both leave (detached): their entries are stale, nobody waits.
        st.left(0);
        st.left(0);
        assert!(!st.waiting(0));
        assert_eq!(st.pop(0), None);
        // A take moves a count: a line with someone in it is retried.
        st.push(0, 7, false);
        d.dispatch(1, 1).unwrap();
        assert!(w[0].try_recv().or_else(|| w[1].try_recv()).is_some());
        st.ready(&d, &mut ready);
        assert_eq!(ready, [0]);
        assert_eq!(st.pop(0), Some(7));
        st.left(0);
        // Counts seen: no retry until the next take.
        st.push(0, 8, true);
        st.ready(&d, &mut ready);
        assert!(ready.is_empty());
    }

    /// Connections that join a line and close leave stale entries; once most entries are
    /// stale the line is compacted, and those still waiting keep their order.
    #[test]
    fn a_line_of_mostly_closed_connections_is_compacted_in_order() {
        let (d, _w) = dispatcher(Model::Ms);
        let mut st = Stalls::new(&d);
        for k in 0..1000 {
            st.push(0, k, false);
        }
        let mut closed = std::collections::HashSet::new();
        for k in (0..1000).filter(|k| k % 100 != 0) {
            closed.insert(k);
            if st.detached(0) {
                st.compact(0, |x| !closed.contains(&x));
            }
            assert!(st.entries() <= 2 * st.live[0] + 33, "{}", st.entries());
        }
        let mut got = Vec::new();
        while let Some(k) = st.pop(0) {
            if !closed.contains(&k) {
                st.left(0);
                got.push(k);
            }
        }
        assert_eq!(got, (0..10).map(|i| i * 100).collect::<Vec<_>>());
    }

    #[test]
    fn cp_lines_are_per_worker() {
        let (mut d, mut w) = dispatcher(Model::Cp);
        let mut st = Stalls::new(&d);
        let mut ready = Vec::new();
        let (a, b) = (0..64).fold((None, None), |(a, b), k| match d.worker_of(k) {
            0 if a.is_none() => (Some(k), b),
            1 if b.is_none() => (a, Some(k)),
            _ => (a, b),
        });
        let (a, b) = (a.unwrap(), b.unwrap());
        st.push(st.class(&d, a), a, false);
        st.push(st.class(&d, b), b, false);
        // Worker 1 takes: only its line is retried.
        d.dispatch(b, 0).unwrap();
        assert!(w[1].try_recv().is_some());
        st.ready(&d, &mut ready);
        assert_eq!(ready, [1]);
        assert_eq!(st.pop(1), Some(b));
    }
}
