//! Virtual workers: the deadline bookkeeping that lets ONE thread stand in for `c`
//! occupied workers (service-time emulation without a CPU per worker; issue 9's "keep
//! the occupied workers as deadlines on a timer wheel").
//!
//! Each virtual worker is a real [`crate::sched::Worker`] / [`crate::socket::MsgSocket`]
//! — placement, handoff and stealing are the scheduler's, unchanged. [`VirtualPool`]
//! owns the `c` sockets and their [`VirtualWorkers`] and is advanced by its driver's
//! loop (r2c's I/O core, once per iteration, right after its NIC poll; `knb
//! service-check`; the fake-clock tests), in two phases:
//! 1. [`VirtualPool::finish_due`]: each worker whose deadline has passed is free again
//!    and the reply it was holding is staged on its socket (the I/O side's
//!    [`crate::socket::MsgIo::poll_replies`] sends it and, under CS, releases the
//!    connection's next message);
//! 2. [`VirtualPool::take`]: every free worker polls its socket without blocking
//!    ([`crate::sched::Worker::poll`], which keeps it announced idle while it finds
//!    nothing, so the dispatcher's handoff and the idle bitmap see it as idle); a message
//!    taken goes to the driver's handler, which answers at once or returns an
//!    [`Occupation`]: the worker is occupied for the service time from when a real
//!    worker would have started it (its previous deadline or the message's arrival,
//!    whichever is later; [`VirtualPool`], "Start times"); a busy worker never polls,
//!    so it takes, steals and is handed nothing — exactly a real worker occupied by its
//!    request.
//!
//! The driver never waits inside the pool: it calls both phases every turn of its loop
//! and may use [`VirtualPool::next_deadline`] to decide how long it may look away.
//!
//! This module is sans-IO and deterministic: time is the caller's, in nanoseconds on any
//! monotonic scale (a fake clock in tests). It records the emulation error — how much
//! later than its deadline each occupation ended ([`VirtStats`]) — so a run reports
//! achieved vs requested occupancy.

use crate::sched::TryRecvError;
use crate::socket::{Message, MsgSocket, Origin};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use zbuf::IoVec;

/// One occupation that has ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done<T> {
    /// The virtual worker, free again.
    pub worker: usize,
    /// What the driver parked with it (the reply to send).
    pub item: T,
    /// When the occupation started (ns).
    pub started: u64,
    /// When it was due to end (ns): `started + service`.
    pub deadline: u64,
    /// When the driver noticed it ended (ns, >= `deadline`).
    pub ended: u64,
}

impl<T> Done<T> {
    /// Requested occupancy (ns).
    pub fn requested(&self) -> u64 {
        self.deadline - self.started
    }

    /// Achieved occupancy (ns): from start to when the worker was freed.
    pub fn achieved(&self) -> u64 {
        self.ended - self.started
    }

    /// Emulation error (ns): achieved − requested.
    pub fn late(&self) -> u64 {
        self.ended - self.deadline
    }
}

/// Why [`VirtualWorkers::start`] refused; the item comes back.
#[derive(PartialEq, Eq)]
pub enum StartError<T> {
    /// The worker is occupied already (a driver bug: a busy worker must not take work).
    Busy(T),
    /// No such worker.
    NoSuchWorker(T),
}

impl<T> StartError<T> {
    /// The item back.
    pub fn into_inner(self) -> T {
        match self {
            StartError::Busy(t) | StartError::NoSuchWorker(t) => t,
        }
    }
}

impl<T> fmt::Debug for StartError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StartError::Busy(_) => "Busy(..)",
            StartError::NoSuchWorker(_) => "NoSuchWorker(..)",
        })
    }
}

impl<T> fmt::Display for StartError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StartError::Busy(_) => "virtual worker is occupied",
            StartError::NoSuchWorker(_) => "no such virtual worker",
        })
    }
}

impl<T> std::error::Error for StartError<T> {}

/// A log-linear histogram of nanosecond values: exact below 64 ns, then 32 buckets per
/// power of two (a quantile is the lower bound of its bucket: at most 1/32 ≈ 3% low).
#[derive(Clone, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
    sum: u128,
}

const SUB_BITS: u32 = 5;
const SUB: usize = 1 << SUB_BITS;
const EXACT: usize = 64;
const BUCKETS: usize = EXACT + (64 - 6) * SUB;

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
            max: 0,
            sum: 0,
        }
    }
}

impl fmt::Debug for Histogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.total)
            .field("p50", &self.quantile(0.5))
            .field("p99", &self.quantile(0.99))
            .field("max", &self.max)
            .finish()
    }
}

impl Histogram {
    fn index(v: u64) -> usize {
        if (v as usize) < EXACT && v < EXACT as u64 {
            return v as usize;
        }
        let e = 63 - v.leading_zeros(); // >= 6
        let sub = ((v >> (e - SUB_BITS)) as usize) & (SUB - 1);
        EXACT + (e as usize - 6) * SUB + sub
    }

    fn lower(i: usize) -> u64 {
        if i < EXACT {
            return i as u64;
        }
        let e = ((i - EXACT) / SUB + 6) as u32;
        let sub = ((i - EXACT) % SUB) as u64;
        (1u64 << e) | (sub << (e - SUB_BITS))
    }

    /// Records `v`.
    pub fn record(&mut self, v: u64) {
        self.counts[Self::index(v)] += 1;
        self.total += 1;
        self.max = self.max.max(v);
        self.sum += u128::from(v);
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Largest value recorded (exact), 0 if none.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Mean (exact), 0 if none.
    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        self.sum as f64 / self.total as f64
    }

    /// The `q` quantile (`q` clamped to [0, 1]; nearest rank), 0 if empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let q = if q.is_nan() { 1.0 } else { q.clamp(0.0, 1.0) };
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::lower(i).min(self.max);
            }
        }
        self.max
    }
}

/// What the emulation did: occupations started and ended, requested and achieved
/// occupancy, and the lateness of each end (the emulation error).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VirtStats {
    /// Occupations started.
    pub started: u64,
    /// Occupations ended.
    pub ended: u64,
    /// Sum of requested occupancy of the ended ones (ns).
    pub requested_ns: u128,
    /// Sum of achieved occupancy of the ended ones (ns).
    pub achieved_ns: u128,
    /// Achieved − requested per ended occupation (ns). An occupation already over when
    /// taken ([`VirtualWorkers::start_or_end`]) is measured at the take, and its reply
    /// leaves at the driver's next reply pass, up to one turn later than this says.
    pub late: Histogram,
    /// Per started occupation, how much earlier than the pass that took its message it
    /// started (ns; 0 for most): the time a real worker would not have lost between its
    /// deadline and the driver noticing it ([`VirtualPool`], "Start times").
    pub credit: Histogram,
    /// Refused starts (a busy or unknown worker: driver bugs, counted, not panics).
    pub refused: u64,
}

impl VirtStats {
    fn record_end<T>(&mut self, done: &Done<T>) {
        self.ended += 1;
        self.requested_ns += u128::from(done.requested());
        self.achieved_ns += u128::from(done.achieved());
        self.late.record(done.late());
    }

    /// Achieved / requested occupancy over the ended occupations (1.0 if none).
    pub fn occupancy_ratio(&self) -> f64 {
        if self.requested_ns == 0 {
            return 1.0;
        }
        self.achieved_ns as f64 / self.requested_ns as f64
    }
}

struct Busy<T> {
    item: T,
    started: u64,
    deadline: u64,
}

/// `c` virtual workers: which are occupied, until when, and what each holds.
pub struct VirtualWorkers<T> {
    slots: Vec<Option<Busy<T>>>,
    /// (deadline, worker) of every occupied worker; earliest first.
    heap: BinaryHeap<Reverse<(u64, usize)>>,
    stats: VirtStats,
}

impl<T> fmt::Debug for VirtualWorkers<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VirtualWorkers")
            .field("workers", &self.slots.len())
            .field("busy", &self.heap.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl<T> VirtualWorkers<T> {
    /// `workers` virtual workers, all free.
    pub fn new(workers: usize) -> Self {
        VirtualWorkers {
            slots: (0..workers).map(|_| None).collect(),
            heap: BinaryHeap::with_capacity(workers),
            stats: VirtStats::default(),
        }
    }

    /// Number of virtual workers.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether worker `w` is occupied (false for an unknown worker).
    pub fn is_busy(&self, w: usize) -> bool {
        self.slots.get(w).is_some_and(|s| s.is_some())
    }

    /// Occupied workers.
    pub fn busy(&self) -> usize {
        self.heap.len()
    }

    /// Occupies worker `w` from `now` for `service` ns, holding `item` until then.
    /// Returns the deadline. A busy or unknown worker is refused (counted) and the item
    /// comes back.
    pub fn start(
        &mut self,
        w: usize,
        now: u64,
        service: u64,
        item: T,
    ) -> Result<u64, StartError<T>> {
        self.start_from(w, now, now, service, item)
    }

    /// [`VirtualWorkers::start`] with the occupation starting at `from` (clamped to
    /// `now`), earlier than the `now` at which it is recorded: the worker is busy until
    /// `from + service`, and `now − from` is recorded as credit.
    pub fn start_from(
        &mut self,
        w: usize,
        from: u64,
        now: u64,
        service: u64,
        item: T,
    ) -> Result<u64, StartError<T>> {
        let Some(slot) = self.slots.get_mut(w) else {
            self.stats.refused += 1;
            return Err(StartError::NoSuchWorker(item));
        };
        if slot.is_some() {
            self.stats.refused += 1;
            return Err(StartError::Busy(item));
        }
        let from = from.min(now);
        let deadline = from.saturating_add(service);
        *slot = Some(Busy {
            item,
            started: from,
            deadline,
        });
        self.heap.push(Reverse((deadline, w)));
        self.stats.started += 1;
        self.stats.credit.record(now - from);
        Ok(deadline)
    }

    /// [`VirtualWorkers::start_from`], except that an occupation already over at `now`
    /// (`from + service <= now`) is not kept: it is counted as started and as ended at
    /// `now` (late by `now − deadline`) and comes back as `Err(done)`, the worker free —
    /// a real worker would be on its next message by now. `Ok(deadline)` otherwise.
    pub fn start_or_end(
        &mut self,
        w: usize,
        from: u64,
        now: u64,
        service: u64,
        item: T,
    ) -> Result<Result<u64, Done<T>>, StartError<T>> {
        let from = from.min(now);
        let deadline = from.saturating_add(service);
        if deadline > now || !matches!(self.slots.get(w), Some(None)) {
            return self.start_from(w, from, now, service, item).map(Ok);
        }
        let done = Done {
            worker: w,
            item,
            started: from,
            deadline,
            ended: now,
        };
        self.stats.started += 1;
        self.stats.credit.record(now - from);
        self.stats.record_end(&done);
        Ok(Err(done))
    }

    /// The earliest deadline of an occupied worker.
    pub fn next_deadline(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((d, _))| *d)
    }

    /// The next occupation due at `now` (earliest deadline first; ties by worker index):
    /// the worker is free again and its item is returned. `None` if none is due.
    pub fn pop_due(&mut self, now: u64) -> Option<Done<T>> {
        let &Reverse((deadline, w)) = self.heap.peek()?;
        if deadline > now {
            return None;
        }
        self.heap.pop();
        // Every heap entry has its slot (start pushes both, only this pops).
        let b = self.slots[w].take()?;
        let done = Done {
            worker: w,
            item: b.item,
            started: b.started,
            deadline: b.deadline,
            ended: now.max(b.deadline),
        };
        self.stats.record_end(&done);
        Some(done)
    }

    /// Free workers, in index order.
    pub fn free(&self) -> impl Iterator<Item = usize> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_none())
            .map(|(i, _)| i)
    }

    /// What the emulation did so far.
    pub fn stats(&self) -> &VirtStats {
        &self.stats
    }
}

/// A message a virtual worker's handler did not answer at once: the worker stays
/// occupied for `service_ns`, then `reply` goes out on `origin`.
pub struct Occupation<C> {
    /// How long the worker stays occupied (ns), from its start ([`VirtualPool`], "Start
    /// times").
    pub service_ns: u64,
    /// By when the message was available to the worker, on the pool's clock (ns), if
    /// the driver knows: at the latest, the clock read after the
    /// [`crate::socket::MsgIo::end_epoch`] of the message's [`Origin::epoch`]. `None`:
    /// the occupation starts when the worker took the message.
    pub ready_ns: Option<u64>,
    /// The message to answer when the occupation ends.
    pub origin: Origin<C>,
    /// The reply then sent.
    pub reply: IoVec,
}

impl<C: fmt::Debug + Copy> fmt::Debug for Occupation<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Occupation")
            .field("service_ns", &self.service_ns)
            .field("ready_ns", &self.ready_ns)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// `c` virtual workers on their real message sockets (see the module docs): one
/// thread advances them with [`VirtualPool::finish_due`] and [`VirtualPool::take`].
///
/// # Start times
///
/// The driver notices a deadline only when it next calls `finish_due`, and a free
/// worker polls only when it next calls `take`: with a driver whose loop turns take
/// `δ`, a worker would lose up to `δ` of capacity per occupation (at 5,000 connections
/// r2c's turns are long enough that the emulated workers lost 5–37% of theirs, and the
/// lost capacity lengthened the queue, which lengthened the turns). A real worker
/// thread loses none of it: at its deadline it takes the next message that is there.
/// So an occupation starts at the latest of
/// - the worker's previous deadline (it was busy until then; 0 if it never was),
/// - when its message became available ([`Occupation::ready_ns`]; the driver's upper
///   bound: r2c reads its clock at each [`crate::socket::MsgIo::end_epoch`]),
///
/// and never later than the clock read after the handler. An occupation already over by
/// then (a turn longer than the service) ends in the same pass, its reply staged, and the
/// worker polls again: a real worker would have taken its next message at that deadline.
/// Each bound is one a real
/// worker could not have beaten, so no occupation starts before a real worker could
/// have started it, and none overlaps the worker's previous one; the credit (how much
/// earlier than that clock read) is in [`VirtStats::credit`]. The reply still goes out
/// only when the driver notices the deadline, as a real worker's waits for the I/O
/// core's next turn. [`VirtualPool::set_start_when_taken`] restores starts at the
/// clock read (for comparison).
pub struct VirtualPool<C> {
    sockets: Vec<MsgSocket<C>>,
    workers: VirtualWorkers<(Origin<C>, IoVec)>,
    /// Each worker's last deadline (0: never occupied).
    free_since: Vec<u64>,
    /// Occupations start when taken, not when the worker could have taken them.
    when_taken: bool,
    /// Every occupation started, in order: (worker, start, deadline) (tests).
    #[cfg(test)]
    log: Vec<(usize, u64, u64)>,
    /// Sockets that reported `Disconnected` (polled no more).
    gone: Vec<bool>,
    live: usize,
    /// The dispatcher's publication count ([`crate::sched::Worker::published`]) read
    /// before the last [`VirtualPool::take`] pass, after which every free worker had
    /// found nothing; `None` once a worker was freed since (it has not polled yet). While
    /// the count stays there, a pass would find nothing again: `take` skips it (20 idle
    /// polls cost the I/O core ~2,000 instructions per loop turn).
    quiet: Option<u64>,
    /// Per worker, the same for its own last poll: the count read before the pass in
    /// which it found nothing (`None`: it has not polled since it was freed). A worker
    /// whose count has not moved is skipped within a pass: after one worker's occupation
    /// ends only that worker polls, not the other idle ones (~40 instructions each).
    seen: Vec<Option<u64>>,
    /// The sockets are one group's (one scheduler): `quiet` and `seen` apply.
    one_group: bool,
}

impl<C> fmt::Debug for VirtualPool<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VirtualPool")
            .field("workers", &self.workers)
            .field("live", &self.live)
            .finish()
    }
}

impl<C: Copy + Send> VirtualPool<C> {
    /// Virtual workers on `sockets` (a group's sockets, [`crate::socket::group`]), all
    /// free.
    pub fn new(sockets: Vec<MsgSocket<C>>) -> Self {
        let n = sockets.len();
        // One scheduler's publication count covers every worker only in one group.
        let one_group = sockets
            .iter()
            .all(|s| s.worker.same_scheduler(&sockets[0].worker));
        VirtualPool {
            sockets,
            workers: VirtualWorkers::new(n),
            free_since: vec![0; n],
            when_taken: false,
            #[cfg(test)]
            log: Vec::new(),
            gone: vec![false; n],
            live: n,
            quiet: None,
            seen: vec![None; n],
            one_group,
        }
    }

    /// Number of virtual workers.
    pub fn len(&self) -> usize {
        self.sockets.len()
    }

    /// Whether every occupation starts at the clock read after its handler (the
    /// emulation before "Start times", kept to measure what the credit changes).
    pub fn set_start_when_taken(&mut self, on: bool) {
        self.when_taken = on;
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.sockets.is_empty()
    }

    /// Phase 1: ends every occupation due at `now` (earliest deadline first) and stages
    /// its reply on the worker's socket (a reply for a connection that has gone is
    /// dropped and counted there). Returns how many ended.
    pub fn finish_due(&mut self, now: u64) -> usize {
        let mut n = 0;
        while let Some(d) = self.workers.pop_due(now) {
            self.free_since[d.worker] = d.deadline;
            self.seen[d.worker] = None;
            let (origin, reply) = d.item;
            self.sockets[d.worker].reply(origin, reply);
            n += 1;
        }
        if n > 0 {
            self.quiet = None;
        }
        n
    }

    /// Phase 2: every free worker polls its socket. A message taken goes to
    /// `handler(socket, message)`, which answers it at once through the socket
    /// (`None`: the worker stays free and polls again) or returns the [`Occupation`]:
    /// the worker is busy for its service time from the later of its previous deadline
    /// and [`Occupation::ready_ns`], but no later than `clock()`, read when the handler
    /// has returned (so the handler's own time is not counted as occupancy); see
    /// "Start times". Returns messages taken. Never blocks (a worker's poll does not
    /// park).
    pub fn take<N, F>(&mut self, mut clock: N, mut handler: F) -> usize
    where
        N: FnMut() -> u64,
        F: FnMut(&mut MsgSocket<C>, Message<C>) -> Option<Occupation<C>>,
    {
        // Read before the pass: a publication during it moves the count, so the next pass
        // polls again.
        let published = self
            .sockets
            .first()
            .filter(|_| self.one_group)
            .map(|s| s.worker.published());
        if published.is_some() && published == self.quiet {
            return 0;
        }
        let mut taken = 0;
        for w in 0..self.sockets.len() {
            if published.is_some() && self.seen[w] == published {
                // Found nothing at this count already (and still free: a worker
                // occupied since was freed through `finish_due`, which forgets it).
                continue;
            }
            // A worker answering at once takes its next message in the same turn, as a
            // real one would; each pass takes a message, so this ends.
            while !self.gone[w] && !self.workers.is_busy(w) {
                match self.sockets[w].poll() {
                    Ok(m) => {
                        taken += 1;
                        let Some(o) = handler(&mut self.sockets[w], m) else {
                            continue;
                        };
                        let now = clock();
                        let from = match o.ready_ns {
                            Some(ready) if !self.when_taken => ready.max(self.free_since[w]),
                            _ => now,
                        };
                        let item = (o.origin, o.reply);
                        let started = if self.when_taken {
                            self.workers
                                .start_from(w, from, now, o.service_ns, item)
                                .map(Ok)
                        } else {
                            self.workers.start_or_end(w, from, now, o.service_ns, item)
                        };
                        #[cfg(test)]
                        if let Ok(r) = &started {
                            let (from, deadline) = match r {
                                Ok(d) => (d - o.service_ns.min(*d), *d),
                                Err(done) => (done.started, done.deadline),
                            };
                            self.log.push((w, from, deadline));
                        }
                        match started {
                            Ok(Ok(_deadline)) => {}
                            // Over already (a turn longer than the service): the reply is
                            // staged and the worker polls again, as a real one would have
                            // at its deadline.
                            Ok(Err(done)) => {
                                self.free_since[w] = done.deadline;
                                let (origin, reply) = done.item;
                                self.sockets[w].reply(origin, reply);
                            }
                            // A free worker cannot be busy (counted in the stats if it
                            // were): answer at once rather than lose the reply.
                            Err(e) => {
                                let (origin, reply) = e.into_inner();
                                self.sockets[w].reply(origin, reply);
                            }
                        }
                    }
                    Err(TryRecvError::Empty) => {
                        self.seen[w] = published;
                        break;
                    }
                    Err(TryRecvError::Disconnected) => {
                        self.gone[w] = true;
                        self.live -= 1;
                    }
                }
            }
        }
        // Every free worker's last poll found nothing (or it is gone).
        self.quiet = published;
        taken
    }

    /// Both phases at `now` (a clock that stands still): [`VirtualPool::finish_due`],
    /// then [`VirtualPool::take`]. Returns occupations ended + messages taken.
    pub fn advance<F>(&mut self, now: u64, handler: F) -> usize
    where
        F: FnMut(&mut MsgSocket<C>, Message<C>) -> Option<Occupation<C>>,
    {
        self.finish_due(now) + self.take(|| now, handler)
    }

    /// The earliest deadline of an occupied worker.
    pub fn next_deadline(&self) -> Option<u64> {
        self.workers.next_deadline()
    }

    /// Occupied workers.
    pub fn busy(&self) -> usize {
        self.workers.busy()
    }

    /// Whether worker `w` is occupied.
    pub fn is_busy(&self, w: usize) -> bool {
        self.workers.is_busy(w)
    }

    /// Every socket disconnected (the I/O side is gone and nothing is left) and no
    /// occupation pending.
    pub fn is_finished(&self) -> bool {
        self.live == 0 && self.workers.busy() == 0
    }

    /// Worker `w`'s socket (its scheduler counters, the group's counters).
    pub fn socket(&self, w: usize) -> Option<&MsgSocket<C>> {
        self.sockets.get(w)
    }

    /// What the emulation did so far.
    pub fn stats(&self) -> &VirtStats {
        self.workers.stats()
    }
}

/// The driver's clock at the end of each of the last epochs
/// ([`crate::socket::MsgIo::end_epoch`]): by then every message of the epoch was
/// available, so it bounds [`Occupation::ready_ns`] from above. A ring of the last
/// `keep` epochs; an older epoch reads as the oldest kept (later than its own end, so
/// still an upper bound).
#[derive(Debug, Clone)]
pub struct EpochTimes {
    times: Box<[u64]>,
    last: Option<u64>,
}

impl EpochTimes {
    /// A ring of `keep` epochs (rounded up to a power of two, at least 1).
    pub fn new(keep: usize) -> Self {
        EpochTimes {
            times: vec![0; keep.max(1).next_power_of_two()].into_boxed_slice(),
            last: None,
        }
    }

    fn slot(&self, epoch: u64) -> usize {
        (epoch & (self.times.len() as u64 - 1)) as usize
    }

    /// Epoch `epoch` ended at `t`. Epochs skipped since the last one recorded get `t`
    /// too (so do those before the first one recorded: they had ended by then); an
    /// epoch not after the last one recorded is ignored.
    pub fn record(&mut self, epoch: u64, t: u64) {
        let oldest = epoch.saturating_sub(self.times.len() as u64 - 1);
        let from = match self.last {
            Some(l) if epoch <= l => return,
            Some(l) => (l + 1).max(oldest),
            None => oldest,
        };
        for e in from..=epoch {
            let i = self.slot(e);
            self.times[i] = t;
        }
        self.last = Some(epoch);
    }

    /// When epoch `epoch` had ended, at the latest; `None` if it has not been recorded.
    pub fn ready(&self, epoch: u64) -> Option<u64> {
        let last = self.last?;
        if epoch > last {
            return None;
        }
        let keep = self.times.len() as u64;
        let e = if last - epoch >= keep {
            last - (keep - 1)
        } else {
            epoch
        };
        Some(self.times[self.slot(e)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_is_busy_exactly_until_its_deadline() {
        let mut v = VirtualWorkers::new(3);
        assert_eq!(v.start(1, 1_000, 500, "a"), Ok(1_500));
        assert!(v.is_busy(1) && !v.is_busy(0) && !v.is_busy(2) && !v.is_busy(9));
        assert_eq!(v.busy(), 1);
        assert_eq!(v.free().collect::<Vec<_>>(), [0, 2]);
        // Not due one ns early.
        assert_eq!(v.pop_due(1_499), None);
        assert!(v.is_busy(1));
        let d = v.pop_due(1_520).unwrap();
        assert_eq!((d.worker, d.item), (1, "a"));
        assert_eq!((d.requested(), d.achieved(), d.late()), (500, 520, 20));
        assert!(!v.is_busy(1));
        assert_eq!(v.pop_due(u64::MAX), None);
        let s = v.stats();
        assert_eq!((s.started, s.ended, s.refused), (1, 1, 0));
        assert_eq!((s.requested_ns, s.achieved_ns), (500, 520));
        assert!((s.occupancy_ratio() - 1.04).abs() < 1e-12);
    }

    #[test]
    fn a_busy_or_unknown_worker_is_refused_and_the_item_comes_back() {
        let mut v = VirtualWorkers::new(2);
        v.start(0, 0, 10, 1u32).unwrap();
        assert_eq!(v.start(0, 5, 10, 2).unwrap_err().into_inner(), 2);
        assert!(matches!(
            v.start(7, 5, 10, 3),
            Err(StartError::NoSuchWorker(3))
        ));
        assert_eq!(v.stats().refused, 2);
        // The first occupation is unchanged.
        assert_eq!(v.next_deadline(), Some(10));
        assert_eq!(v.pop_due(10).unwrap().item, 1);
        // Free again: may start.
        assert_eq!(v.start(0, 10, 0, 4), Ok(10));
        assert_eq!(v.pop_due(10).unwrap().late(), 0);
    }

    #[test]
    fn due_workers_come_out_earliest_deadline_first() {
        let mut v = VirtualWorkers::new(5);
        for (w, (start, svc)) in [(0, 50), (10, 5), (0, 30), (3, 12), (1, 30)]
            .into_iter()
            .enumerate()
        {
            v.start(w, start, svc, w).unwrap();
        }
        assert_eq!(v.next_deadline(), Some(15));
        let mut order = Vec::new();
        while let Some(d) = v.pop_due(100) {
            assert_eq!(d.ended, 100);
            order.push((d.deadline, d.worker));
        }
        // Deadlines 50, 15, 30, 15, 31: ties by index.
        assert_eq!(order, [(15, 1), (15, 3), (30, 2), (31, 4), (50, 0)]);
        assert_eq!(v.busy(), 0);
        assert_eq!(v.next_deadline(), None);
    }

    /// A deterministic random stream for the schedule tests: `rnd(n)` in `0..n`.
    fn xorshift(seed: u64) -> impl FnMut(u64) -> u64 {
        let mut x = seed;
        move |n| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        }
    }

    /// A knb test handler: the request's id, and its answer — at once (the worker stays
    /// free) for a service tag of 0, else the occupation (`ready_ns` its availability)
    /// holding a reply that carries the id.
    fn knb_answer(
        socket: &mut MsgSocket<u32>,
        m: Message<u32>,
        ready_ns: Option<u64>,
    ) -> (u64, Option<Occupation<u32>>) {
        use crate::parser::knb::{Header, HDR_LEN};
        let h = Header::read(&m.body).unwrap().unwrap();
        let mut tag = [0u8; 8];
        assert!(crate::parser::peek(&m.body, HDR_LEN, &mut tag));
        let service_ns = u64::from_le_bytes(tag);
        let mut reply = IoVec::new();
        reply.push(zbuf::Zbuf::from_vec(h.id.to_le_bytes().to_vec()));
        if service_ns == 0 {
            socket.reply(m.origin, reply);
            return (h.id, None);
        }
        let o = Occupation {
            service_ns,
            ready_ns,
            origin: m.origin,
            reply,
        };
        (h.id, Some(o))
    }

    /// A knb-framed message-socket group of `workers` under `model` (FIFOs of
    /// `queue_capacity`, scheduler seed `seed`), `conns` connections attached (reply
    /// order `ordering`, `max_in_flight` each), and its sockets as a pool.
    fn knb_pool(
        model: crate::model::Model,
        workers: usize,
        conns: u32,
        queue_capacity: usize,
        max_in_flight: usize,
        ordering: crate::parser::Ordering,
        seed: u64,
    ) -> (
        crate::socket::MsgIo<u32, crate::parser::knb::KnbParser>,
        VirtualPool<u32>,
    ) {
        use crate::framer::FramerConfig;
        use crate::parser::knb::KnbParser;
        use crate::sched::SchedConfig;
        let cfg = SchedConfig {
            model,
            workers,
            queue_capacity,
            seed,
        };
        let framer = FramerConfig {
            max_message: 64,
            max_in_flight,
            ..FramerConfig::default()
        };
        let (mut io, sockets) = crate::socket::group(&cfg, framer).unwrap();
        for c in 0..conns {
            io.attach(c, KnbParser::new(ordering)).unwrap();
        }
        (io, VirtualPool::new(sockets))
    }

    /// One random schedule of dispatches, deadlines, replies and take passes (several
    /// passes per step, most of them with nothing new) on a pool, under `model`; returns
    /// what every pass took and every reply, in order. `skip` false turns off the skip of
    /// quiet passes (`one_group`), so both runs must agree exactly.
    fn quiet_schedule(model: crate::model::Model, seed: u64, skip: bool) -> Vec<(u64, u64)> {
        use crate::parser::knb::{Header, SERVICE};
        use crate::parser::{peek, Ordering};
        use zbuf::Zbuf;
        let (mut io, mut pool) = knb_pool(model, 4, 6, 64, 16, Ordering::Ordered, 7);
        assert!(pool.one_group);
        pool.one_group = skip;
        let mut rnd = xorshift(seed | 1);
        let mut log = Vec::new();
        let (mut t, mut id) = (0u64, 0u64);
        for _ in 0..3_000 {
            // Sometimes a message arrives (a publication), sometimes nothing does.
            if rnd(3) == 0 {
                let h = Header {
                    id,
                    len: 8,
                    flags: SERVICE,
                };
                let mut v = h.bytes().to_vec();
                // Service 0 (answered at once), short or long.
                v.extend_from_slice(&[0u64, 5, 40][rnd(3) as usize].to_le_bytes());
                io.on_data(rnd(6) as u32, Zbuf::from_vec(v));
                id += 1;
            }
            pool.finish_due(t);
            io.poll_replies(|c, r: IoVec| {
                let mut b = [0u8; 8];
                assert!(peek(&r, 0, &mut b));
                log.push((u64::from(c), u64::from_le_bytes(b)));
            });
            for _ in 0..1 + rnd(3) {
                let n = pool.take(|| t, |socket, m| knb_answer(socket, m, None).1);
                log.push((u64::MAX, n as u64));
            }
            t += rnd(10);
        }
        log
    }

    /// Skipping the passes in which nothing was published and no worker was freed changes
    /// nothing but their cost: the same schedule with and without the skip takes the
    /// same messages in the same passes and answers in the same order, in every model.
    #[test]
    fn skipping_quiet_passes_takes_the_same_messages_in_the_same_passes() {
        use crate::model::Model;
        for model in [Model::Cp, Model::Cs, Model::Ms] {
            for seed in [1u64, 2, 3] {
                let with = quiet_schedule(model, seed, true);
                let without = quiet_schedule(model, seed, false);
                let replies = with.iter().filter(|e| e.0 != u64::MAX).count();
                assert!(replies > 500, "{model}: {replies} replies");
                assert_eq!(with, without, "{model}, seed {seed}");
            }
        }
    }

    /// A driver stepping every `step` ns over a pool of `workers` under `model`: at each
    /// step it hands in the messages due (`arrivals`: time, connection, service ns; knb
    /// framing with a service tag), ends the due occupations, sends replies, ends the
    /// epoch (its clock read recorded as the epoch's time, as r2c does) and lets free
    /// workers take. Returns each occupation as (worker, start, deadline, ready) in the
    /// order taken, and the pool.
    #[allow(clippy::type_complexity)]
    fn stepped_pool(
        model: crate::model::Model,
        workers: usize,
        step: u64,
        arrivals: &[(u64, u32, u64)],
        when_taken: bool,
    ) -> (Vec<(usize, u64, u64, u64)>, VirtualPool<u32>, u64) {
        use crate::parser::knb::{Header, SERVICE};
        use crate::parser::{peek, Ordering};
        use zbuf::Zbuf;
        let (mut io, mut pool) = knb_pool(model, workers, 4, 256, 256, Ordering::Unordered, 3);
        pool.set_start_when_taken(when_taken);
        let mut epochs = Vec::new();
        let mut taken = Vec::new();
        let (mut t, mut next, mut answered, mut last_reply) = (0u64, 0usize, 0usize, 0u64);
        while answered < arrivals.len() {
            assert!(t < 10_000_000, "the run does not end");
            while next < arrivals.len() && arrivals[next].0 <= t {
                let (_, conn, service) = arrivals[next];
                let h = Header {
                    id: next as u64,
                    len: 8,
                    flags: SERVICE,
                };
                let mut v = h.bytes().to_vec();
                v.extend_from_slice(&service.to_le_bytes());
                io.on_data(conn, Zbuf::from_vec(v));
                next += 1;
            }
            pool.finish_due(t);
            answered += io.poll_replies(|_, _| {});
            last_reply = t;
            let e = io.end_epoch();
            assert_eq!(e as usize, epochs.len());
            epochs.push(t);
            let mut took = Vec::new();
            pool.take(
                || t,
                |socket, m| {
                    let mut tag = [0u8; 8];
                    assert!(peek(&m.body, crate::parser::knb::HDR_LEN, &mut tag));
                    let ready = epochs[m.origin.epoch() as usize];
                    took.push((socket.index(), ready));
                    let mut reply = IoVec::new();
                    reply.push(Zbuf::from_vec(vec![1]));
                    Some(Occupation {
                        service_ns: u64::from_le_bytes(tag),
                        ready_ns: Some(ready),
                        origin: m.origin,
                        reply,
                    })
                },
            );
            let log = &pool.log[pool.log.len() - took.len()..];
            for ((w, ready), &(lw, start, deadline)) in took.into_iter().zip(log) {
                assert_eq!(w, lw);
                taken.push((w, start, deadline, ready));
            }
            t += step;
        }
        (taken, pool, last_reply)
    }

    /// A driver that notices deadlines late loses the workers no capacity: each worker's
    /// next occupation starts at its previous deadline when the message was there, and
    /// never before the message was (its epoch's clock read) nor before the deadline.
    #[test]
    fn a_late_driver_costs_the_workers_no_capacity() {
        use crate::model::Model;
        // 40 messages of 100 ns at once on 2 workers, then 4 more long after.
        let mut arrivals: Vec<(u64, u32, u64)> = (0..40).map(|i| (0, i % 4, 100)).collect();
        arrivals.extend((0..4).map(|i| (5_000, i, 100)));
        for model in [Model::Ms, Model::Cp] {
            let (taken, pool, _) = stepped_pool(model, 2, 37, &arrivals, false);
            assert_eq!(taken.len(), 44);
            let mut last = [0u64; 2];
            for &(w, start, deadline, ready) in &taken {
                assert_eq!(deadline - start, 100);
                assert!(
                    start >= last[w],
                    "{model}: overlaps the previous occupation"
                );
                assert!(start >= ready, "{model}: starts before its message arrived");
                last[w] = deadline;
            }
            // Back to back from 0: the first 40 end at 2,000 exactly though the driver
            // looked only every 37 ns.
            let first: Vec<u64> = taken[..40].iter().map(|o| o.2).collect();
            assert_eq!(first.iter().max(), Some(&2_000), "{model}");
            // The late batch starts when it arrived (the step at or after 5,000), not at
            // the workers' last deadlines.
            for o in &taken[40..] {
                assert!(o.1 >= 5_000, "{model}: {o:?}");
            }
            let s = pool.stats();
            assert_eq!(s.started, 44);
            assert!(s.credit.max() > 0 && s.credit.max() < 37, "{:?}", s.credit);
            // The same run starting each occupation when taken loses capacity.
            let (old, _, _) = stepped_pool(model, 2, 37, &arrivals, true);
            let end = old[..40].iter().map(|o| o.2).max().unwrap();
            assert!(end > 2_000 + 37, "{model}: {end}");
        }
    }

    /// A turn longer than a service: an occupation already over when taken ends in the
    /// same pass and the worker takes the next message, so 40 × 100 ns on 2 workers
    /// still end at 2,000 ns with the driver looking every 150 ns, and the last reply
    /// goes out at the first turn after that (one per worker per turn would take ~3,000).
    #[test]
    fn occupations_shorter_than_a_turn_chain_within_it() {
        use crate::model::Model;
        let arrivals: Vec<(u64, u32, u64)> = (0..40).map(|i| (0, i % 4, 100)).collect();
        for model in [Model::Ms, Model::Cp] {
            let (taken, pool, last) = stepped_pool(model, 2, 150, &arrivals, false);
            assert_eq!(taken.len(), 40);
            let mut per_worker = [0u64; 2];
            for &(w, start, deadline, ready) in &taken {
                assert!(
                    start >= per_worker[w] && start >= ready,
                    "{model}: {taken:?}"
                );
                per_worker[w] = deadline;
            }
            assert_eq!(per_worker, [2_000, 2_000], "{model}");
            assert_eq!(last, 2_100, "{model}: last reply");
            let s = pool.stats();
            assert_eq!((s.started, s.ended), (40, 40));
            // Starting when taken, one occupation per worker per turn.
            let (_, _, old) = stepped_pool(model, 2, 150, &arrivals, true);
            assert!(old >= 20 * 150, "{model}: {old}");
        }
    }

    /// Under CS a connection's next message becomes available only when its previous
    /// one's completion reaches the I/O side: it is not credited back to the deadline.
    #[test]
    fn a_message_held_under_cs_starts_no_earlier_than_its_release() {
        use crate::model::Model;
        // One connection, 6 messages at once, 3 workers: one in service at a time.
        let arrivals: Vec<(u64, u32, u64)> = (0..6).map(|_| (0, 0, 100)).collect();
        let (taken, _, _) = stepped_pool(Model::Cs, 3, 37, &arrivals, false);
        assert_eq!(taken.len(), 6);
        // Each starts at the step that noticed the previous deadline (the release),
        // a multiple of 37 after it, not at the previous deadline itself.
        for pair in taken.windows(2) {
            let (prev, next) = (pair[0], pair[1]);
            assert_eq!(next.1, next.3, "starts at its release: {pair:?}");
            assert!(next.1 >= prev.2 && next.1 < prev.2 + 37, "{pair:?}");
            assert_eq!(next.1 % 37, 0, "{pair:?}");
        }
    }

    /// A random schedule like `quiet_schedule`, with what it leaves out: start times
    /// (occupations already over when taken end in the pass and the worker polls again),
    /// small FIFOs and in-flight caps (refusals, retries, CS releases that find no room),
    /// connections that go away with messages queued, and the I/O side dropped with
    /// messages still queued (the workers drain them). Returns every take (pass, worker,
    /// message) and every reply, in order; `skip` false turns off both skips.
    fn stress_schedule(
        model: crate::model::Model,
        workers: usize,
        cap: usize,
        seed: u64,
        skip: bool,
    ) -> Vec<(u64, u64, u64)> {
        use crate::parser::knb::{Header, SERVICE};
        use crate::parser::{peek, Ordering};
        use zbuf::Zbuf;
        let conns = 7u32;
        let (io, mut pool) = knb_pool(model, workers, conns, cap, 3, Ordering::Ordered, seed);
        let mut io = Some(io);
        pool.one_group = skip;
        let mut rnd = xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut log = Vec::new();
        let mut epochs = EpochTimes::new(64);
        let (mut t, mut id, mut pass, mut due) = (0u64, 0u64, 0u64, 0u64);
        let mut attached = vec![true; conns as usize];
        for step in 0..4_000u64 {
            if step == 3_500 {
                // The I/O side goes with messages still queued.
                io = None;
            }
            if let Some(io) = io.as_mut() {
                for _ in 0..rnd(3) {
                    let c = rnd(u64::from(conns)) as u32;
                    if !attached[c as usize] {
                        continue;
                    }
                    let h = Header {
                        id,
                        len: 8,
                        flags: SERVICE,
                    };
                    let mut v = h.bytes().to_vec();
                    v.extend_from_slice(&[0u64, 3, 9, 30, 120][rnd(5) as usize].to_le_bytes());
                    io.on_data(c, Zbuf::from_vec(v));
                    id += 1;
                }
                if rnd(200) == 0 {
                    // A connection goes (its queued messages stay queued) and comes back.
                    let c = rnd(u64::from(conns)) as usize;
                    if attached[c] {
                        io.detach(c as u32);
                        attached[c] = false;
                    } else {
                        io.attach(
                            c as u32,
                            crate::parser::knb::KnbParser::new(Ordering::Ordered),
                        )
                        .unwrap();
                        attached[c] = true;
                    }
                }
            }
            if rnd(3) != 0 {
                due += pool.finish_due(t) as u64;
            }
            if let Some(io) = io.as_mut() {
                io.poll_replies(|c, r: IoVec| {
                    let mut b = [0u8; 8];
                    assert!(peek(&r, 0, &mut b));
                    log.push((u64::MAX, u64::from(c), u64::from_le_bytes(b)));
                });
                epochs.record(io.end_epoch(), t);
            }
            for _ in 0..1 + rnd(3) {
                pass += 1;
                let mut ticks = 0u64;
                pool.take(
                    || {
                        ticks += 1;
                        t + ticks
                    },
                    |socket, m| {
                        let ready = epochs.ready(m.origin.epoch());
                        let w = socket.index() as u64;
                        let (id, o) = knb_answer(socket, m, ready);
                        log.push((pass, w, id));
                        o
                    },
                );
            }
            t += [1, 5, 20, 60][rnd(4) as usize];
        }
        // Everything ends: the workers drain what was queued when the I/O side went.
        while !pool.is_finished() {
            assert!(t < 100_000_000, "the pool does not finish");
            t += 50;
            due += pool.finish_due(t) as u64;
            pass += 1;
            pool.take(
                || t,
                |socket, m| {
                    let h = Header::read(&m.body).unwrap().unwrap();
                    log.push((pass, socket.index() as u64, h.id));
                    None
                },
            );
        }
        // Some occupations were over when taken and ended in their pass.
        assert!(pool.stats().ended > due, "{due} {:?}", pool.stats());
        log
    }

    /// The skips change nothing but their cost, also with start times chaining
    /// occupations within a pass, back pressure, connections going and the I/O side
    /// dropped: the same takes in the same passes by the same workers, the same replies.
    #[test]
    fn skips_take_the_same_messages_under_back_pressure_and_start_times() {
        use crate::model::Model;
        for model in [Model::Cp, Model::Cs, Model::Ms] {
            for (workers, cap) in [(3usize, 1usize), (4, 2), (8, 4)] {
                for seed in 1..=3u64 {
                    let with = stress_schedule(model, workers, cap, seed, true);
                    let without = stress_schedule(model, workers, cap, seed, false);
                    let takes = with.iter().filter(|e| e.0 != u64::MAX).count();
                    assert!(takes > 1_000, "{model}: {takes} takes");
                    assert_eq!(
                        with, without,
                        "{model}, {workers} workers, cap {cap}, seed {seed}"
                    );
                }
            }
        }
    }

    /// Sockets of two groups (two schedulers): one publication count does not cover
    /// them, so the pool never skips.
    #[test]
    fn a_pool_over_two_groups_never_skips() {
        use crate::framer::FramerConfig;
        use crate::parser::knb::KnbParser;
        use crate::sched::SchedConfig;
        use crate::socket::{group, MsgIo};
        let cfg = SchedConfig {
            model: crate::model::Model::Ms,
            workers: 2,
            queue_capacity: 8,
            seed: 1,
        };
        let (_a, mut sa): (MsgIo<u32, KnbParser>, _) =
            group(&cfg, FramerConfig::default()).unwrap();
        let (_b, sb): (MsgIo<u32, KnbParser>, _) = group(&cfg, FramerConfig::default()).unwrap();
        assert!(VirtualPool::new(std::mem::take(&mut sa)).one_group);
        let (_a, sa): (MsgIo<u32, KnbParser>, _) = group(&cfg, FramerConfig::default()).unwrap();
        let mixed: Vec<_> = sa.into_iter().chain(sb).collect();
        assert!(!VirtualPool::new(mixed).one_group);
    }

    #[test]
    fn epoch_times_bound_every_epoch_from_above() {
        let mut e = EpochTimes::new(3); // 4 kept
        assert_eq!(e.ready(0), None);
        e.record(0, 10);
        e.record(1, 20);
        assert_eq!(
            (e.ready(0), e.ready(1), e.ready(2)),
            (Some(10), Some(20), None)
        );
        // Skipped epochs 2 and 3 get the time of 4.
        e.record(4, 50);
        assert_eq!(
            (e.ready(2), e.ready(3), e.ready(4)),
            (Some(50), Some(50), Some(50))
        );
        // Not after the last: ignored.
        e.record(3, 1);
        assert_eq!(e.ready(3), Some(50));
        e.record(5, 60);
        e.record(6, 70);
        // 0 and 1 fell out of the ring: they read as the oldest kept (3: 50), later
        // than their own ends.
        assert_eq!(
            (e.ready(0), e.ready(1), e.ready(3)),
            (Some(50), Some(50), Some(50))
        );
        assert_eq!(e.ready(6), Some(70));
        // A jump longer than the ring fills it once.
        e.record(1_000, 99);
        assert_eq!((e.ready(997), e.ready(6)), (Some(99), Some(99)));
    }

    /// An epoch before the first one recorded (a driver that starts recording late) had
    /// ended by the first record too: it reads as that record's time, never as an
    /// unwritten slot's 0 (which would let an occupation start before its message was
    /// there).
    #[test]
    fn epochs_before_the_first_record_read_as_its_time() {
        let mut e = EpochTimes::new(4);
        e.record(5, 50);
        // 2..=5 are in the ring; 0 and 1 are older than it.
        for old in 0..=5 {
            assert_eq!(e.ready(old), Some(50), "epoch {old}");
        }
        e.record(6, 60);
        assert_eq!(
            (e.ready(0), e.ready(3), e.ready(6)),
            (Some(50), Some(50), Some(60))
        );
        // The last epoch a u64 can count: no overflow reading an old one.
        let mut e = EpochTimes::new(4);
        e.record(u64::MAX, 7);
        assert_eq!((e.ready(0), e.ready(u64::MAX)), (Some(7), Some(7)));
    }

    /// One message taken by a virtual worker: its id, connection, worker, start,
    /// deadline and epoch time, the step it arrived at, the step it was placed at (if the
    /// driver could tell) and the step its reply was sent at.
    #[derive(Debug, Clone, Copy, Default)]
    struct Took {
        conn: u32,
        worker: usize,
        start: u64,
        deadline: u64,
        ready: u64,
        arrived: u64,
        placed: Option<u64>,
        replied: Option<u64>,
    }

    /// A random driver over a pool (small FIFOs and in-flight caps: back pressure and
    /// stalled retries; services of 0 answered at once): every step hands in what
    /// arrived, ends the due occupations, sends replies, ends the epoch at its clock
    /// read and lets free workers take. With one connection (and not CS, where a held
    /// message is counted when held) the k-th placement counted is message k: the step
    /// each message was placed at is then known. Returns every message by id.
    fn random_drive(
        model: crate::model::Model,
        workers: usize,
        conns: u32,
        queue_capacity: usize,
        max_in_flight: usize,
        seed: u64,
    ) -> Vec<Took> {
        use crate::parser::knb::{Header, KnbParser, SERVICE};
        use crate::parser::{peek, Ordering};
        use crate::socket::MsgIo;
        use std::sync::atomic::Ordering as AtomicOrdering;
        use zbuf::Zbuf;
        let (mut io, mut pool) = knb_pool(
            model,
            workers,
            conns,
            queue_capacity,
            max_in_flight,
            Ordering::Ordered,
            seed,
        );
        let mut rnd = xorshift(seed | 1);
        let track = conns == 1 && model != crate::model::Model::Cs;
        let mut msgs: Vec<Took> = Vec::new();
        let mut epochs = EpochTimes::new(8);
        let mut counted = 0u64;
        let (mut t, mut answered, total) = (0u64, 0usize, 600usize);
        let mut placed = |io: &MsgIo<u32, KnbParser>, msgs: &mut Vec<Took>, t: u64| {
            let now = io.counters().messages.load(AtomicOrdering::Relaxed);
            for k in counted..now {
                assert!(msgs[k as usize].placed.is_none());
                msgs[k as usize].placed = Some(t);
            }
            counted = now;
        };
        while answered < total {
            assert!(t < 100_000_000, "the run does not end");
            for _ in 0..rnd(4) {
                if msgs.len() == total {
                    break;
                }
                let conn = rnd(u64::from(conns)) as u32;
                let h = Header {
                    id: msgs.len() as u64,
                    len: 8,
                    flags: SERVICE,
                };
                let mut v = h.bytes().to_vec();
                v.extend_from_slice(&[0u64, 7, 30, 200][rnd(4) as usize].to_le_bytes());
                msgs.push(Took {
                    conn,
                    arrived: t,
                    ..Took::default()
                });
                io.on_data(conn, Zbuf::from_vec(v));
                if track {
                    placed(&io, &mut msgs, t);
                }
            }
            pool.finish_due(t);
            answered += io.poll_replies(|_, r: IoVec| {
                let mut b = [0u8; 8];
                assert!(peek(&r, 0, &mut b));
                let m = &mut msgs[u64::from_le_bytes(b) as usize];
                assert!(m.replied.is_none(), "answered twice: {m:?}");
                m.replied = Some(t);
            });
            if track {
                placed(&io, &mut msgs, t);
            }
            epochs.record(io.end_epoch(), t);
            let mut took = Vec::new();
            pool.take(
                || t,
                |socket, m| {
                    let ready = epochs.ready(m.origin.epoch()).expect("recorded");
                    let w = socket.index();
                    let (id, o) = knb_answer(socket, m, Some(ready));
                    if o.is_some() {
                        took.push((id as usize, w, ready));
                    }
                    o
                },
            );
            let log = &pool.log[pool.log.len() - took.len()..];
            for ((id, w, ready), &(lw, start, deadline)) in took.into_iter().zip(log) {
                assert_eq!(w, lw);
                let m = &mut msgs[id];
                (m.worker, m.start, m.deadline, m.ready) = (w, start, deadline, ready);
            }
            // Often late, sometimes at once.
            t += [1, 13, 50, 400][rnd(4) as usize];
        }
        msgs
    }

    /// Conservative start times under back pressure, at random: no occupation starts
    /// before its message was placed (a message refused by a full FIFO and retried
    /// later carries the epoch of its retry), before its epoch's time, or before the
    /// worker's previous occupation ended; under CS none before its connection's
    /// previous reply reached the I/O side; every message answered exactly once.
    #[test]
    fn no_occupation_starts_before_its_message_was_placed() {
        use crate::model::Model;
        for model in [Model::Cp, Model::Ms, Model::Cs] {
            for (conns, cap, in_flight) in
                [(1u32, 1usize, 4usize), (1, 2, 16), (5, 1, 3), (5, 4, 8)]
            {
                for seed in 1..=4u64 {
                    let msgs = random_drive(model, 3, conns, cap, in_flight, seed);
                    let ctx = format!("{model}, {conns} conns, cap {cap}, seed {seed}");
                    let mut last = std::collections::HashMap::<usize, (u64, u64)>::new();
                    let mut occupied: Vec<_> = msgs
                        .iter()
                        .enumerate()
                        .filter(|(_, m)| m.deadline > 0)
                        .collect();
                    assert!(occupied.len() > 200, "{ctx}");
                    occupied.sort_by_key(|(_, m)| (m.worker, m.start, m.deadline));
                    for (id, m) in &occupied {
                        assert!(m.replied.is_some(), "{ctx}: {id} {m:?}");
                        assert!(
                            m.start >= m.arrived && m.start >= m.ready,
                            "{ctx}: {id} {m:?}"
                        );
                        if let Some(p) = m.placed {
                            assert!(m.start >= p, "{ctx}: starts before placed: {id} {m:?}");
                        }
                        if let Some(&(_, d)) = last.get(&m.worker) {
                            assert!(m.start >= d, "{ctx}: overlaps: {id} {m:?}");
                        }
                        last.insert(m.worker, (m.start, m.deadline));
                    }
                    if conns == 1 && model != Model::Cs {
                        assert!(msgs.iter().all(|m| m.placed.is_some()), "{ctx}");
                        // Back pressure happened: some message was placed after it arrived.
                        assert!(msgs.iter().any(|m| m.placed > Some(m.arrived)), "{ctx}");
                    }
                    if model == Model::Cs {
                        // A connection's next message starts once the previous reply
                        // reached the I/O side (replies in request order per connection).
                        for c in 0..conns {
                            let mine: Vec<&Took> = msgs.iter().filter(|m| m.conn == c).collect();
                            for p in mine.windows(2) {
                                if p[1].deadline > 0 {
                                    assert!(p[1].start >= p[0].replied.unwrap(), "{ctx}: {:?}", p);
                                }
                            }
                        }
                    }
                    assert!(msgs.iter().all(|m| m.replied.is_some()), "{ctx}");
                }
            }
        }
    }

    #[test]
    fn deadlines_saturate_instead_of_wrapping() {
        let mut v = VirtualWorkers::new(1);
        assert_eq!(v.start(0, u64::MAX - 3, 10, ()), Ok(u64::MAX));
        assert!(v.pop_due(u64::MAX - 1).is_none());
        assert_eq!(v.pop_due(u64::MAX).unwrap().requested(), 3);
    }

    #[test]
    fn histogram_quantiles_are_within_a_bucket() {
        let mut h = Histogram::default();
        assert_eq!((h.quantile(0.5), h.max(), h.mean()), (0, 0, 0.0));
        for v in 0..64 {
            assert_eq!(Histogram::lower(Histogram::index(v)), v);
        }
        for v in [64u64, 100, 1_000, 20_000, 123_456_789, u64::MAX] {
            let lo = Histogram::lower(Histogram::index(v));
            assert!(lo <= v && (v - lo) as f64 <= v as f64 / 32.0, "{v}: {lo}");
        }
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        assert_eq!(h.count(), 1000);
        assert_eq!(h.max(), 1_000_000);
        assert!((h.mean() - 500_500.0).abs() < 1e-6);
        for (q, want) in [(0.5, 500_000.0), (0.99, 990_000.0), (1.0, 1_000_000.0)] {
            let got = h.quantile(q) as f64;
            assert!(
                got <= want && got >= want * (1.0 - 1.0 / 32.0),
                "q{q}: {got}"
            );
        }
        assert_eq!(h.quantile(0.0), 1_000 - 8);
        assert_eq!(h.quantile(f64::NAN), h.quantile(1.0));
    }

    /// A simulated driver: c virtual workers fed from one FIFO, time stepped by the
    /// driver; the achieved occupancy equals the requested one when the driver wakes at
    /// every deadline, and at most one step late when it steps coarsely.
    #[test]
    fn a_stepped_driver_occupies_each_worker_for_its_service_time() {
        let services: Vec<u64> = (0..200).map(|i| 50 + (i * 37) % 500).collect();
        for step in [1u64, 7] {
            let mut v = VirtualWorkers::new(4);
            let mut queue = services.iter().copied().enumerate();
            let mut now = 0;
            let mut done = Vec::new();
            let mut next = queue.next();
            while done.len() < services.len() {
                while let Some(d) = v.pop_due(now) {
                    done.push(d);
                }
                let free: Vec<usize> = v.free().collect();
                for w in free {
                    if let Some((i, s)) = next {
                        v.start(w, now, s, i).unwrap();
                        next = queue.next();
                    }
                }
                // Never more busy workers than workers.
                assert!(v.busy() <= v.len());
                now = if step == 1 {
                    v.next_deadline().unwrap_or(now + 1)
                } else {
                    now + step
                };
            }
            let mut seen: Vec<usize> = done.iter().map(|d| d.item).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..services.len()).collect::<Vec<_>>());
            for d in &done {
                assert_eq!(d.requested(), services[d.item]);
                assert!(d.late() < step, "late {} with step {step}", d.late());
            }
            let s = v.stats();
            assert_eq!(s.started, services.len() as u64);
            assert_eq!(
                s.requested_ns,
                services.iter().map(|&x| u128::from(x)).sum()
            );
            if step == 1 {
                assert_eq!(s.achieved_ns, s.requested_ns);
                assert_eq!(s.late.max(), 0);
            }
        }
    }
}
