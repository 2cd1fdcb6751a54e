//! The three models. MS and CP are FCFS, so a message's start time depends only on earlier
//! arrivals and each needs one recursion per message (Kiefer–Wolfowitz for c servers, Lindley
//! per worker). CS is not: a later arrival can make its connection ready before an earlier
//! message's connection rejoins the ready FIFO, so it runs as a proper event loop.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};

use super::rng::Rng;
use super::{Model, Service, SimConfig};

// Stream ids: one independent stream per random quantity (common random numbers across models).
const STREAM_ARRIVAL: u64 = 1;
const STREAM_CONNECTION: u64 = 2;
const STREAM_SERVICE: u64 = 3;

/// The messages of a run, in arrival order: time, connection, service time.
struct Source {
    arrivals: Rng,
    conns: Rng,
    services: Rng,
    interarrival_mean: f64,
    connections: usize,
    service: Service,
    mean: f64,
    now: f64,
}

#[derive(Clone, Copy, Debug)]
struct Msg {
    /// Arrival index (0-based, warm-up included).
    index: usize,
    arrival: f64,
    conn: usize,
    service: f64,
}

impl Source {
    fn new(cfg: &SimConfig) -> Self {
        Source {
            arrivals: Rng::new(cfg.seed, STREAM_ARRIVAL),
            conns: Rng::new(cfg.seed, STREAM_CONNECTION),
            services: Rng::new(cfg.seed, STREAM_SERVICE),
            interarrival_mean: 1.0 / cfg.arrival_rate(),
            connections: cfg.connections,
            service: cfg.service,
            mean: cfg.mean_service,
            now: 0.0,
        }
    }

    fn next(&mut self, index: usize) -> Msg {
        self.now += self.arrivals.exp(self.interarrival_mean);
        let conn = self.conns.below(self.connections);
        let service = match self.service {
            Service::Fixed => self.mean,
            Service::Exp => self.services.exp(self.mean),
            Service::Bimodal => {
                // 90% at 0.5 × mean, 10% at 5.5 × mean.
                if self.services.open01() <= 0.9 {
                    0.5 * self.mean
                } else {
                    5.5 * self.mean
                }
            }
        };
        Msg {
            index,
            arrival: self.now,
            conn,
            service,
        }
    }
}

/// Runs `cfg` (already validated) and returns the sojourn times of the measured messages,
/// indexed by arrival order after the warm-up.
pub(super) fn run(cfg: &SimConfig) -> Vec<f64> {
    match cfg.model {
        Model::Ms => run_ms(cfg),
        Model::Cp => run_cp(cfg),
        Model::Cs => run_cs(cfg),
    }
}

/// A time ordered by `total_cmp` (times are finite and non-negative), for the heaps.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Time(f64);
impl Eq for Time {}
impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Time {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

fn run_ms(cfg: &SimConfig) -> Vec<f64> {
    let mut src = Source::new(cfg);
    // Free times of the c workers; FCFS sends the head message to the worker free first.
    let mut free: BinaryHeap<Reverse<Time>> =
        (0..cfg.workers).map(|_| Reverse(Time(0.0))).collect();
    let mut out = Vec::with_capacity(cfg.requests);
    for i in 0..cfg.warmup + cfg.requests {
        let m = src.next(i);
        let mut slot = free.peek_mut().expect("workers >= 1");
        let start = slot.0 .0.max(m.arrival);
        let done = start + m.service;
        slot.0 = Time(done);
        drop(slot);
        if i >= cfg.warmup {
            out.push(done - m.arrival);
        }
    }
    out
}

fn run_cp(cfg: &SimConfig) -> Vec<f64> {
    let mut src = Source::new(cfg);
    let mut free = vec![0.0f64; cfg.workers];
    let mut out = Vec::with_capacity(cfg.requests);
    for i in 0..cfg.warmup + cfg.requests {
        let m = src.next(i);
        let w = m.conn % cfg.workers;
        let start = free[w].max(m.arrival);
        free[w] = start + m.service;
        if i >= cfg.warmup {
            out.push(free[w] - m.arrival);
        }
    }
    out
}

fn run_cs(cfg: &SimConfig) -> Vec<f64> {
    let mut src = Source::new(cfg);
    let total = cfg.warmup + cfg.requests;
    let mut out = vec![f64::NAN; cfg.requests];
    let mut recorded = 0usize;

    let mut queues: Vec<VecDeque<Msg>> = vec![VecDeque::new(); cfg.connections];
    // A connection is "scheduled" while it is being served or waits in `ready`; a message
    // arriving on a scheduled connection only joins its FIFO.
    let mut scheduled = vec![false; cfg.connections];
    let mut ready: VecDeque<usize> = VecDeque::new();
    let mut idle: Vec<usize> = (0..cfg.workers).rev().collect();
    let mut running: Running = BinaryHeap::new();

    let mut next_index = 0usize;
    let mut next = src.next(next_index);
    // Arrivals continue past the last measured message until it completes: in CS later
    // arrivals can delay earlier messages, so cutting them off would bias the last samples.
    while recorded < cfg.requests {
        let completion_first = running
            .peek()
            .is_some_and(|Reverse((t, ..))| t.0 <= next.arrival);
        if completion_first {
            let Reverse((t, worker, conn, index, arrival)) = running.pop().expect("peeked");
            if index >= cfg.warmup && index < total {
                out[index - cfg.warmup] = t.0 - arrival.0;
                recorded += 1;
            }
            if queues[conn].is_empty() {
                scheduled[conn] = false;
            } else {
                ready.push_back(conn);
            }
            match ready.pop_front() {
                Some(c) => start(&mut queues[c], &mut running, t.0, worker, c),
                None => idle.push(worker),
            }
        } else {
            let m = next;
            next_index += 1;
            next = src.next(next_index);
            queues[m.conn].push_back(m);
            if !scheduled[m.conn] {
                scheduled[m.conn] = true;
                match idle.pop() {
                    Some(w) => start(&mut queues[m.conn], &mut running, m.arrival, w, m.conn),
                    None => ready.push_back(m.conn),
                }
            }
        }
    }
    out
}

/// Messages in service, earliest completion first: (completion time, worker, connection,
/// message index, message arrival). Ties fall to the lower worker id: runs stay deterministic.
type Running = BinaryHeap<Reverse<(Time, usize, usize, usize, Time)>>;

/// Worker `worker` starts the head message of connection `conn` at `now`.
fn start(queue: &mut VecDeque<Msg>, running: &mut Running, now: f64, worker: usize, conn: usize) {
    let m = queue
        .pop_front()
        .expect("a scheduled connection has a queued message");
    running.push(Reverse((
        Time(now + m.service),
        worker,
        conn,
        m.index,
        Time(m.arrival),
    )));
}
