//! Stress test of the scheduler: one dispatcher thread, 8 workers, every model.
//!
//! Each message has a unique id; every id must be delivered exactly once. Under CS, two
//! messages of one key are never in service at once and each key's messages are served
//! in dispatch order. Some workers sleep briefly now and then; one test keeps a worker
//! that never asks for work (MS and CS must still deliver everything, by stealing).
//! A watchdog fails the test instead of letting it hang.

#![cfg(not(loom))]

use msgsched::sched::{scheduler, Dispatcher, Model, RecvError, SchedConfig, Worker};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

const WORKERS: usize = 8;
const KEYS: u64 = 48;
const WATCHDOG: Duration = Duration::from_secs(120);

#[derive(Debug)]
struct Msg {
    id: usize,
    key: u64,
    /// Position of this message among its key's messages.
    seq: u64,
}

struct Check {
    model: Model,
    delivered: Vec<AtomicU8>,
    count: AtomicU64,
    in_service: Vec<AtomicBool>,
    next_seq: Vec<AtomicU64>,
    errors: std::sync::Mutex<Vec<String>>,
}

impl Check {
    fn new(model: Model, n: usize) -> Self {
        Check {
            model,
            delivered: (0..n).map(|_| AtomicU8::new(0)).collect(),
            count: AtomicU64::new(0),
            in_service: (0..KEYS).map(|_| AtomicBool::new(false)).collect(),
            next_seq: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
            errors: Default::default(),
        }
    }

    fn error(&self, e: String) {
        let mut v = self.errors.lock().unwrap();
        if v.len() < 10 {
            v.push(e);
        }
    }

    fn begin(&self, m: &Msg) {
        if self.delivered[m.id].fetch_add(1, Ordering::Relaxed) != 0 {
            self.error(format!("id {} delivered twice", m.id));
        }
        if self.model == Model::Cs {
            let k = m.key as usize;
            if self.in_service[k].swap(true, Ordering::AcqRel) {
                self.error(format!("key {} has two messages in service", m.key));
            }
            let want = self.next_seq[k].fetch_add(1, Ordering::Relaxed);
            if want != m.seq {
                self.error(format!("key {}: got seq {}, expected {want}", m.key, m.seq));
            }
        }
    }

    fn end(&self, m: &Msg) {
        if self.model == Model::Cs {
            self.in_service[m.key as usize].store(false, Ordering::Release);
        }
        self.count.fetch_add(1, Ordering::Release);
    }
}

/// Small deterministic PRNG for the test's own choices.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// How a worker reports a CS completion.
#[derive(Clone, Copy)]
enum Completion {
    /// `Worker::finish` (the completion ring).
    Finish,
    /// Back to the I/O core over a channel, which calls `Dispatcher::complete`.
    Reply,
}

fn run_worker(
    mut w: Worker<Msg>,
    check: Arc<Check>,
    replies: mpsc::Sender<u64>,
    how: Completion,
    sleepy: bool,
) {
    let mut rng = Rng(0x9E37_79B9 + w.index() as u64);
    let mut n = 0u64;
    loop {
        match w.recv_timeout(Duration::from_millis(50)) {
            Ok(m) => {
                check.begin(&m);
                n += 1;
                // Tiny random work; sleepy workers also sleep now and then.
                let spins = rng.next() % 64;
                for _ in 0..spins {
                    std::hint::spin_loop();
                }
                if sleepy && n % 256 == 0 {
                    thread::sleep(Duration::from_micros(200 + rng.next() % 300));
                }
                check.end(&m);
                if check.model == Model::Cs {
                    match how {
                        Completion::Finish => w.finish(m.key),
                        Completion::Reply => {
                            let _ = replies.send(m.key);
                        }
                    }
                }
            }
            Err(RecvError::Timeout) => continue,
            Err(RecvError::Disconnected) => return,
        }
    }
}

fn drain_replies(d: &mut Dispatcher<Msg>, rx: &mpsc::Receiver<u64>) {
    while let Ok(key) = rx.try_recv() {
        assert!(d.complete(key), "completion for key {key} not in service");
    }
    d.poll();
}

/// Dispatches `n` messages over `KEYS` keys, retrying rejected ones (the caller keeps
/// the message: back pressure), then waits for every delivery and drops the dispatcher.
fn run_dispatcher(
    mut d: Dispatcher<Msg>,
    n: usize,
    check: Arc<Check>,
    rx: mpsc::Receiver<u64>,
    seed: u64,
) -> msgsched::sched::Stats {
    let mut rng = Rng(seed | 1);
    let mut seqs = vec![0u64; KEYS as usize];
    for id in 0..n {
        let key = rng.next() % KEYS;
        let seq = seqs[key as usize];
        seqs[key as usize] += 1;
        let mut msg = Msg { id, key, seq };
        let mut tries = 0u64;
        loop {
            match d.dispatch(key, msg) {
                Ok(_) => break,
                Err(r) => {
                    msg = r.into_inner();
                    assert_eq!(msg.id, id, "rejected message is the one dispatched");
                    drain_replies(&mut d, &rx);
                    tries += 1;
                    assert!(tries < 50_000_000, "dispatch of {id} never found room");
                    thread::yield_now();
                }
            }
        }
        if id % 64 == 0 {
            drain_replies(&mut d, &rx);
        }
    }
    // CS: held messages are released only by completions.
    while check.count.load(Ordering::Acquire) < n as u64 {
        drain_replies(&mut d, &rx);
        thread::sleep(Duration::from_micros(100));
    }
    drain_replies(&mut d, &rx);
    assert_eq!(d.held(), 0);
    d.stats()
}

/// Runs one model under a watchdog. `stuck` workers are never run (never call recv).
fn stress(model: Model, n: usize, capacity: usize, stuck: &[usize]) -> msgsched::sched::Stats {
    let cfg = SchedConfig {
        model,
        workers: WORKERS,
        queue_capacity: capacity,
        seed: 0xC0FFEE ^ n as u64,
    };
    let (d, workers) = scheduler::<Msg>(&cfg).unwrap();
    let check = Arc::new(Check::new(model, n));
    let (done_tx, done_rx) = mpsc::channel();
    let c = check.clone();
    let stuck = stuck.to_vec();
    thread::spawn(move || {
        let (tx, rx) = mpsc::channel();
        let mut parked = Vec::new();
        let mut handles = Vec::new();
        for w in workers {
            let i = w.index();
            if stuck.contains(&i) {
                parked.push(w);
                continue;
            }
            let how = if i % 2 == 0 {
                Completion::Finish
            } else {
                Completion::Reply
            };
            let (c, tx) = (c.clone(), tx.clone());
            handles.push(thread::spawn(move || run_worker(w, c, tx, how, i % 3 == 1)));
        }
        let stats = run_dispatcher(d, n, c, rx, cfg.seed);
        for h in handles {
            h.join().unwrap();
        }
        drop(parked);
        let _ = done_tx.send(stats);
    });
    let stats = match done_rx.recv_timeout(WATCHDOG) {
        Ok(s) => s,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!(
            "{model}: watchdog: {} of {n} delivered after {WATCHDOG:?}",
            check.count.load(Ordering::Relaxed)
        ),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            panic!("{model}: a scheduler thread panicked")
        }
    };
    let errors = check.errors.lock().unwrap();
    assert!(errors.is_empty(), "{model}: {errors:?}");
    let lost: Vec<_> = (0..n)
        .filter(|&i| check.delivered[i].load(Ordering::Relaxed) != 1)
        .take(10)
        .collect();
    assert!(
        lost.is_empty(),
        "{model}: not delivered exactly once: {lost:?}"
    );
    stats
}

const N: usize = 200_000;

#[test]
fn ms_every_message_exactly_once() {
    let s = stress(Model::Ms, N, 64, &[]);
    assert!(s.handoffs + s.p2c >= N as u64, "{s:?}");
}

#[test]
fn cs_exactly_once_one_in_service_per_key_in_order() {
    let s = stress(Model::Cs, N, 64, &[]);
    assert!(s.held > 0, "CS never held a message: {s:?}");
}

#[test]
fn cp_every_message_exactly_once() {
    let s = stress(Model::Cp, N, 64, &[]);
    assert_eq!(s.partitioned, N as u64);
    assert_eq!(s.steals + s.handoffs, 0);
}

#[test]
fn ms_stuck_worker_queue_is_stolen() {
    let s = stress(Model::Ms, N / 4, 16, &[2, 5]);
    assert_eq!(s.workers[2].taken, 0);
    assert!(s.steals > 0, "{s:?}");
}

#[test]
fn cs_stuck_worker_queue_is_stolen() {
    let s = stress(Model::Cs, N / 4, 16, &[2]);
    assert_eq!(s.workers[2].taken, 0);
    assert!(s.steals > 0, "{s:?}");
}
