//! Virtual workers on a fake clock: the emulation (`msgsched::virt::VirtualPool` driving
//! real message sockets, as r2c's I/O core does each iteration) against the simulator.
//!
//! The driver below is an exact discrete-event loop: time jumps to the next arrival or
//! the next deadline, so the emulation has no error of its own (every occupation ends on
//! its deadline) and what remains is the scheduler: CP's hash partition, CS's one message
//! per connection, MS's handoff / power-of-two / stealing instead of one FIFO. Those must
//! reproduce the simulator's models: MS ≈ M/G/c, CS ≈ the simulator's CS, CP no better
//! than the simulator's CP, and the order MS < CS < CP where the simulator has it.

use msgsched::framer::FramerConfig;
use msgsched::model::Model;
use msgsched::parser::knb::{Header, KnbParser, HDR_LEN, SERVICE};
use msgsched::parser::{peek, Ordering};
use msgsched::sched::SchedConfig;
use msgsched::sim::{simulate, Service, SimConfig};
use msgsched::socket::{group, MsgIo};
use msgsched::virt::{Occupation, VirtualPool};
use zbuf::{IoVec, Zbuf};

const MEAN: u64 = 100_000; // ns

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// In (0, 1].
    fn f64(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

fn request(id: u64, service: u64) -> Zbuf {
    let h = Header {
        id,
        len: 8,
        flags: SERVICE,
    };
    let mut v = h.bytes().to_vec();
    v.extend_from_slice(&service.to_le_bytes());
    Zbuf::from_vec(v)
}

struct Run {
    /// Sojourn (arrival to reply handed to the transmit callback), in units of the mean,
    /// after the warm-up.
    sojourn: Vec<f64>,
    /// Replies per request id (must all be 1).
    answers: Vec<u32>,
    /// Per worker: (start, end) of each occupation.
    occupations: Vec<Vec<(u64, u64)>>,
    steals: u64,
    handoffs: u64,
    messages: u64,
    replies: u64,
    abandoned: u64,
    sequence_errors: u64,
    late_max: u64,
    refused: u64,
}

/// `total` Poisson arrivals at `load` of `workers` workers, each to a connection chosen
/// uniformly at random (as the simulator does), bimodal service (90% 0.5×, 10% 5.5× the
/// mean), unordered replies (the simulator's sojourn ends at completion).
fn run(model: Model, workers: usize, conns: usize, load: f64, total: usize, seed: u64) -> Run {
    let cfg = SchedConfig {
        model,
        workers,
        queue_capacity: 4096,
        seed: 0x6b6e62,
    };
    let framer = FramerConfig {
        max_message: 64,
        max_in_flight: 1024,
        ..FramerConfig::default()
    };
    let (mut io, sockets): (MsgIo<u32, KnbParser>, _) = group(&cfg, framer).unwrap();
    for c in 0..conns as u32 {
        io.attach(c, KnbParser::new(Ordering::Unordered)).unwrap();
    }
    let mut pool = VirtualPool::new(sockets);
    let mut rng = Rng(seed | 1);
    let rate = load * workers as f64 / MEAN as f64; // per ns
    let gap = |r: &mut Rng| (-r.f64().ln() / rate) as u64;
    let mut arrival = vec![0u64; total];
    let mut answers = vec![0u32; total];
    let mut occupations = vec![Vec::new(); workers];
    let mut sojourn = Vec::with_capacity(total);
    let mut epochs = Vec::new();
    let warmup = total / 10;
    let mut next = gap(&mut rng);
    let (mut issued, mut done) = (0usize, 0usize);
    let mut t = 0u64;
    loop {
        while issued < total && next <= t {
            let service = if rng.next() % 10 == 0 {
                MEAN * 11 / 2
            } else {
                MEAN / 2
            };
            let c = (rng.next() % conns as u64) as u32;
            arrival[issued] = next;
            io.on_data(c, request(issued as u64, service));
            issued += 1;
            next += gap(&mut rng).max(1);
        }
        pool.finish_due(t);
        io.poll_replies(|_, reply: IoVec| {
            let mut id = [0u8; 8];
            assert!(peek(&reply, 0, &mut id));
            let id = u64::from_le_bytes(id) as usize;
            answers[id] += 1;
            if id >= warmup {
                sojourn.push((t - arrival[id]) as f64 / MEAN as f64);
            }
            done += 1;
        });
        assert!(io.poll_event().is_none(), "no connection may close");
        // The epoch's clock read, as r2c's (exact here: the driver wakes at every event).
        assert_eq!(io.end_epoch() as usize, epochs.len());
        epochs.push(t);
        pool.take(
            || t,
            |socket, m| {
                let h = Header::read(&m.body).unwrap().unwrap();
                let mut tag = [0u8; 8];
                assert!(peek(&m.body, HDR_LEN, &mut tag));
                let service_ns = u64::from_le_bytes(tag);
                occupations[socket.index()].push((t, t + service_ns));
                let mut reply = IoVec::new();
                reply.push(Zbuf::from_vec(h.id.to_le_bytes().to_vec()));
                let ready_ns = Some(epochs[m.origin.epoch() as usize]);
                assert!(ready_ns <= Some(t));
                Some(Occupation {
                    service_ns,
                    ready_ns,
                    origin: m.origin,
                    reply,
                })
            },
        );
        if done == total {
            break;
        }
        let arrive = (issued < total).then_some(next);
        t = match (arrive, pool.next_deadline()) {
            (Some(a), Some(d)) => a.min(d),
            (Some(a), None) => a,
            (None, Some(d)) => d,
            (None, None) => {
                panic!("{model}: {done} of {total} answered, nothing pending: a message was lost")
            }
        };
    }
    let s = pool.socket(0).unwrap().sched_stats();
    let c = io.counters();
    let l = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    Run {
        sojourn,
        answers,
        occupations,
        steals: s.steals,
        handoffs: s.handoffs,
        messages: l(&c.messages),
        replies: l(&c.replies),
        abandoned: l(&c.abandoned),
        sequence_errors: l(&c.sequence_errors),
        late_max: pool.stats().late.max(),
        refused: pool.stats().refused,
    }
}

fn p99(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = ((0.99 * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn sim_p99(model: Model, workers: usize, conns: usize, load: f64, total: usize) -> f64 {
    let cfg = SimConfig {
        requests: total - total / 10,
        warmup: total / 10,
        seed: 7,
        ..SimConfig::new(model, workers, conns, Service::Bimodal, load)
    };
    simulate(&cfg).unwrap().p99
}

fn check_exact(model: Model, r: &Run, total: usize) {
    assert!(
        r.answers.iter().all(|&n| n == 1),
        "{model}: a request answered {} times",
        r.answers.iter().find(|&&n| n != 1).unwrap()
    );
    assert_eq!(
        (r.messages, r.replies, r.abandoned, r.sequence_errors),
        (total as u64, total as u64, 0, 0),
        "{model}"
    );
    // An exact clock: every occupation ended on its deadline, none refused.
    assert_eq!((r.late_max, r.refused), (0, 0), "{model}");
    for (w, occ) in r.occupations.iter().enumerate() {
        for pair in occ.windows(2) {
            assert!(
                pair[1].0 >= pair[0].1,
                "{model}: worker {w} took a message at {} while occupied until {}",
                pair[1].0,
                pair[0].1
            );
        }
    }
}

/// 4 workers, 8 connections, bimodal service, load 0.6: the simulator has
/// MS < CS < CP at p99; the emulation must have the same order, MS and CS within 10% of
/// the simulator, and CP (a hash partition instead of `i mod c`) no better than the
/// simulator's CP. Every request is answered exactly once and no busy worker takes work.
#[test]
fn emulated_models_reproduce_the_simulator() {
    let (workers, conns, load, total) = (4, 8, 0.6, 30_000);
    let mut got = Vec::new();
    for model in Model::ALL {
        let mut r = run(model, workers, conns, load, total, 11);
        check_exact(model, &r, total);
        match model {
            Model::Cp => assert_eq!(r.steals + r.handoffs, 0, "CP neither steals nor hands off"),
            Model::Ms => assert!(r.steals > 0 && r.handoffs > 0, "MS steals and hands off"),
            Model::Cs => assert!(r.handoffs > 0),
        }
        let emu = p99(&mut r.sojourn);
        let sim = sim_p99(model, workers, conns, load, total);
        eprintln!("{model}: emulated p99 {emu:.3}, simulated {sim:.3} (units of the mean)");
        got.push((model, emu, sim));
    }
    let [(_, cp, cp_sim), (_, cs, cs_sim), (_, ms, ms_sim)] = got[..] else {
        unreachable!()
    };
    assert!(ms_sim < cs_sim && cs_sim < cp_sim, "the simulator's order");
    assert!(
        ms < cs && cs < cp,
        "emulated order: ms {ms:.3} cs {cs:.3} cp {cp:.3}"
    );
    for (name, emu, sim) in [("ms", ms, ms_sim), ("cs", cs, cs_sim)] {
        assert!(
            (emu - sim).abs() <= 0.1 * sim,
            "{name}: emulated p99 {emu:.3} vs simulated {sim:.3}"
        );
    }
    assert!(
        cp >= 0.9 * cp_sim,
        "cp: emulated {cp:.3} vs simulated {cp_sim:.3}"
    );
}

/// The same run twice gives the same numbers (the emulation is deterministic).
#[test]
fn the_emulation_is_deterministic() {
    let a = run(Model::Ms, 4, 8, 0.7, 5_000, 3);
    let b = run(Model::Ms, 4, 8, 0.7, 5_000, 3);
    assert_eq!(a.sojourn, b.sojourn);
    assert_eq!(a.occupations, b.occupations);
    assert_eq!((a.steals, a.handoffs), (b.steals, b.handoffs));
}
