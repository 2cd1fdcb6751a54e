//! The three models. MS and CP are FCFS, so a message's start time depends only on earlier
//! arrivals and each needs one recursion per message (Kiefer–Wolfowitz for c servers, Lindley
//! per worker). CS is not: a later arrival can make its connection ready before an earlier
//! message's connection rejoins the ready FIFO, so it runs as a proper event loop.
//!
//! Pauses ([`super::Pauses`]) enter through [`PauseClock::hold`]: a start or a delivery that
//! falls inside a pause moves to its end. `hold` is monotone, so FCFS order and the
//! recursions stay valid. Under [`super::PauseScope::Io`] (MS and CP) only the dispatch of
//! an arrival and the delivery of a reply are held: a worker free in a pause starts a
//! message dispatched before it.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};

use super::rng::Rng;
use super::{Model, PauseScope, Pauses, Service, SimConfig};

// Stream ids: one independent stream per random quantity (common random numbers across models).
const STREAM_ARRIVAL: u64 = 1;
const STREAM_CONNECTION: u64 = 2;
const STREAM_SERVICE: u64 = 3;
const STREAM_PAUSE: u64 = 4;

/// The server's pauses as intervals `[start, end)`, generated on demand in time order.
struct PauseClock {
    spec: Option<Pauses>,
    rng: Rng,
    /// Pauses so far: (start, end), sorted, disjoint.
    list: Vec<(f64, f64)>,
    /// No more pauses will be generated.
    done: bool,
    /// Poisson: the end of the last generated pause.
    last_end: f64,
}

impl PauseClock {
    fn new(cfg: &SimConfig) -> Self {
        let mut c = PauseClock {
            spec: cfg.pauses.clone(),
            rng: Rng::new(cfg.seed, STREAM_PAUSE),
            list: Vec::new(),
            done: true,
            last_end: 0.0,
        };
        match &c.spec {
            None => {}
            Some(Pauses::List(l)) => {
                c.list = l
                    .iter()
                    .filter(|p| p.1 > 0.0)
                    .map(|&(s, d)| (s, s + d))
                    .collect();
            }
            Some(Pauses::Poisson { rate, mean, .. }) => c.done = *rate <= 0.0 || *mean <= 0.0,
        }
        c
    }

    /// `t`, or the end of the pause `t` falls in (`start <= t < end`).
    fn hold(&mut self, t: f64) -> f64 {
        if self.done && self.list.is_empty() {
            return t;
        }
        while !self.done && self.list.last().is_none_or(|p| p.0 <= t) {
            self.generate();
        }
        let i = self.list.partition_point(|p| p.0 <= t);
        match i.checked_sub(1).map(|i| self.list[i]) {
            Some((_, end)) if t < end => end,
            _ => t,
        }
    }

    fn generate(&mut self) {
        let Some(Pauses::Poisson {
            rate,
            mean,
            exponential,
        }) = self.spec
        else {
            self.done = true;
            return;
        };
        let start = self.last_end + self.rng.exp(1.0 / rate);
        let d = if exponential {
            self.rng.exp(mean)
        } else {
            mean
        };
        self.last_end = start + d;
        self.list.push((start, start + d));
    }
}

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
    let mut pauses = PauseClock::new(cfg);
    let mut out = Vec::with_capacity(cfg.requests);
    for i in 0..cfg.warmup + cfg.requests {
        let m = src.next(i);
        let mut slot = free.peek_mut().expect("workers >= 1");
        let start = match cfg.pause_scope {
            PauseScope::Server => pauses.hold(slot.0 .0.max(m.arrival)),
            PauseScope::Io => slot.0 .0.max(pauses.hold(m.arrival)),
        };
        let done = start + m.service;
        slot.0 = Time(done);
        drop(slot);
        if i >= cfg.warmup {
            out.push(pauses.hold(done) - m.arrival);
        }
    }
    out
}

fn run_cp(cfg: &SimConfig) -> Vec<f64> {
    let mut src = Source::new(cfg);
    let mut free = vec![0.0f64; cfg.workers];
    let mut pauses = PauseClock::new(cfg);
    let mut out = Vec::with_capacity(cfg.requests);
    for i in 0..cfg.warmup + cfg.requests {
        let m = src.next(i);
        let w = m.conn % cfg.workers;
        let start = match cfg.pause_scope {
            PauseScope::Server => pauses.hold(free[w].max(m.arrival)),
            PauseScope::Io => free[w].max(pauses.hold(m.arrival)),
        };
        free[w] = start + m.service;
        if i >= cfg.warmup {
            out.push(pauses.hold(free[w]) - m.arrival);
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
    let mut pauses = PauseClock::new(cfg);

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
            // Completed at `t`; in a pause the reply leaves, and the worker starts its
            // next message, at the pause's end.
            let t = Time(pauses.hold(t.0));
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
                    Some(w) => {
                        let now = pauses.hold(m.arrival);
                        start(&mut queues[m.conn], &mut running, now, w, m.conn)
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(model: Model, service: Service, load: f64, requests: usize) -> SimConfig {
        SimConfig {
            requests,
            warmup: 0,
            seed: 7,
            ..SimConfig::new(model, 20, 20, service, load)
        }
    }

    /// The arrival times of `cfg`'s messages (the same streams the engine draws).
    fn arrivals(cfg: &SimConfig) -> Vec<f64> {
        let mut src = Source::new(cfg);
        (0..cfg.warmup + cfg.requests)
            .map(|i| src.next(i).arrival)
            .collect()
    }

    #[test]
    fn without_pauses_every_model_is_unchanged() {
        for model in [Model::Ms, Model::Cp, Model::Cs] {
            let plain = cfg(model, Service::Bimodal, 0.8, 50_000);
            let want = run(&plain);
            for pauses in [
                Pauses::Poisson {
                    rate: 0.0,
                    mean: 5.0,
                    exponential: true,
                },
                Pauses::List(Vec::new()),
                // A pause of length zero is no pause.
                Pauses::List(vec![(100.0, 0.0)]),
            ] {
                let got = run(&SimConfig {
                    pauses: Some(pauses.clone()),
                    ..plain.clone()
                });
                assert!(got == want, "{model:?} {pauses:?}");
            }
        }
    }

    #[test]
    fn one_long_pause_at_low_load_delays_exactly_what_it_covers() {
        // MS, fixed service 1, load 0.01 (0.2 arrivals per unit on 20 workers): without
        // the pause nothing ever waits. A pause over [1000, 1020): an arrival inside it
        // starts at 1020; a message in service at 1000 completes inside it and leaves at
        // 1020; everything else is untouched.
        let plain = cfg(Model::Ms, Service::Fixed, 0.01, 2_000);
        let base = run(&plain);
        assert!(
            base.iter().all(|&s| (s - 1.0).abs() < 1e-9),
            "no queueing without the pause"
        );
        let (p, end) = (1000.0, 1020.0);
        let paused = SimConfig {
            pauses: Some(Pauses::List(vec![(p, end - p)])),
            ..plain.clone()
        };
        let got = run(&paused);
        let arr = arrivals(&plain);
        let (mut inside, mut spanning) = (0, 0);
        for (i, (&a, &s)) in arr.iter().zip(&got).enumerate() {
            let want = if (p..end).contains(&a) {
                inside += 1;
                end + 1.0 - a
            } else if a < p && a + 1.0 > p {
                spanning += 1;
                end - a
            } else {
                1.0
            };
            assert!((s - want).abs() < 1e-9, "message {i} at {a}: {s} vs {want}");
        }
        assert!(inside > 0 && inside < 20, "{inside} arrivals in the pause");
        assert!(spanning <= 1);
        // CP and CS: nothing inside the pause is delivered before its end.
        for model in [Model::Cp, Model::Cs] {
            let c = SimConfig {
                model,
                ..paused.clone()
            };
            for (&a, &s) in arr.iter().zip(&run(&c)) {
                if (p..end).contains(&a) {
                    assert!(
                        a + s >= end + 1.0 - 1e-9,
                        "{model:?}: {a} left at {}",
                        a + s
                    );
                }
            }
        }
    }

    /// I/O-side pauses hold dispatch and delivery only: per message, no pauses <= I/O
    /// pauses <= server pauses (MS and CP), strictly better than server pauses in sum at a
    /// load where a queue stands when a pause begins, and the same as no pauses when
    /// there are none; CS is refused.
    #[test]
    fn io_pauses_keep_the_workers_busy_through_a_pause() {
        for model in [Model::Ms, Model::Cp] {
            let plain = SimConfig {
                connections: 20,
                ..cfg(model, Service::Bimodal, 0.9, 20_000)
            };
            // 20,000 arrivals at 18 per unit: about 1,100 units.
            let list = Pauses::List(vec![(200.0, 30.0), (500.0, 8.0), (900.0, 60.0)]);
            let server = SimConfig {
                pauses: Some(list.clone()),
                ..plain.clone()
            };
            let io = SimConfig {
                pause_scope: PauseScope::Io,
                ..server.clone()
            };
            let (none, s, i) = (run(&plain), run(&server), run(&io));
            for (k, ((n, s), i)) in none.iter().zip(&s).zip(&i).enumerate() {
                assert!(
                    n - 1e-9 <= *i && *i <= s + 1e-9,
                    "{model:?} {k}: {n} {i} {s}"
                );
            }
            let (ss, si): (f64, f64) = (s.iter().sum(), i.iter().sum());
            assert!(si < ss * 0.999, "{model:?}: {si} vs {ss}");
            let no_pauses = SimConfig {
                pause_scope: PauseScope::Io,
                ..plain.clone()
            };
            assert!(run(&no_pauses) == none, "{model:?}");
        }
        let cs = SimConfig {
            pauses: Some(Pauses::List(vec![(10.0, 1.0)])),
            pause_scope: PauseScope::Io,
            ..cfg(Model::Cs, Service::Fixed, 0.5, 100)
        };
        assert!(matches!(
            cs.validate(),
            Err(super::super::ConfigError::Pauses(_))
        ));
    }

    #[test]
    fn poisson_pauses_give_the_p99_queueing_theory_says() {
        // Low load (no queueing of its own), fixed service 1, pauses of D = 20 at rate
        // r = 0.001 per unit of running time. A fraction f = rD / (1 + rD) of arrivals
        // lands in a pause and waits its uniform remainder: sojourn 1 + U(0, D); a
        // fraction g = r / (1 + rD) is in service when one starts: sojourn in (D, D + 1].
        // So P(sojourn > y) = f (D + 1 - y) / D + g for 1 < y <= D + 1, and the p99 solves
        // it = 0.01.
        let (r, d) = (0.001, 20.0);
        let c = SimConfig {
            pauses: Some(Pauses::Poisson {
                rate: r,
                mean: d,
                exponential: false,
            }),
            ..cfg(Model::Ms, Service::Fixed, 0.01, 400_000)
        };
        let f = r * d / (1.0 + r * d);
        let g = r / (1.0 + r * d);
        let want = d + 1.0 - (0.01 - g) * d / f;
        let got = crate::sim::simulate(&c).unwrap();
        assert!(
            (got.p99 - want).abs() / want < 0.05,
            "p99 {} vs theory {want}",
            got.p99
        );
        // And the p50 is untouched.
        assert!((got.p50 - 1.0).abs() < 1e-9, "{}", got.p50);
        // Deterministic: the same pauses again.
        assert_eq!(crate::sim::simulate(&c).unwrap(), got);
    }

    #[test]
    fn bad_pauses_are_refused() {
        let base = cfg(Model::Ms, Service::Fixed, 0.5, 10);
        for p in [
            Pauses::Poisson {
                rate: -1.0,
                mean: 1.0,
                exponential: false,
            },
            Pauses::Poisson {
                rate: 1.0,
                mean: f64::NAN,
                exponential: true,
            },
            Pauses::List(vec![(10.0, 5.0), (12.0, 1.0)]),
            Pauses::List(vec![(10.0, -1.0)]),
        ] {
            let c = SimConfig {
                pauses: Some(p.clone()),
                ..base.clone()
            };
            assert!(
                matches!(c.validate(), Err(super::super::ConfigError::Pauses(_))),
                "{p:?}"
            );
        }
    }
}
