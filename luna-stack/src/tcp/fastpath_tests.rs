//! Header prediction (the ESTABLISHED fast path, `Connection::header_predicted`) must be
//! invisible: the same inputs give the same segments, events, timers and final state with
//! it on or off. Two kinds of tests prove it:
//!
//! - a randomized two-endpoint simulation (bulk and RPC; loss, duplication, reordering,
//!   replays of old segments, receive windows opening and closing, timestamp clocks that
//!   wrap) run twice, with `TcpConfig::header_prediction` on and off, comparing everything;
//! - per-rule unit tests: each case the prediction excludes goes the full way (the hit
//!   counter does not move) and each case it accepts is taken (the counter moves), both with
//!   the same result as with prediction off.

use super::*;
use crate::context::testutil::FakeRng;
use crate::context::Rng;
use crate::tcp::config::{CcAlgorithm, TcpConfig};
use crate::wire::tcp::fnv1a;
use core::net::Ipv4Addr;

const ISS_A: u32 = 0xFFFF_F000; // wraps during every transfer
const ISS_B: u32 = 0x7FFF_FF00;

fn tuple(a_is_local: bool) -> FourTuple {
    let a = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 40000);
    let b = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 7000);
    if a_is_local {
        FourTuple {
            local: a,
            remote: b,
        }
    } else {
        FourTuple {
            local: b,
            remote: a,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Randomized differential simulation
// ---------------------------------------------------------------------------------------------

/// One simulated network and workload, fully determined by its fields.
#[derive(Debug, Clone)]
struct Scenario {
    seed: u64,
    cfg: TcpConfig,
    /// B's receive buffer (small ones close the window).
    rcv_buf_b: u32,
    /// Per-mille probabilities per segment.
    loss: u32,
    dup: u32,
    replay: u32,
    /// One-way delay and the random extra delay that reorders.
    delay_us: u64,
    jitter_us: u64,
    /// Timestamp clock offsets (near 2^32 so they wrap during the run).
    ts_a: u32,
    ts_b: u32,
    /// RPC (request/response) instead of bulk A->B.
    rpc: bool,
    bytes: usize,
    /// Per-mille chance per step that B's application reads (slow readers shrink the window).
    read_chance: u32,
    /// Per-mille chance per step that B's application stops reading for up to 800 ms (zero
    /// windows, persist probes with backoff).
    stall: u32,
    /// Per-mille chance that a delivered segment's TSval is made 1 or 2 ticks older (PAWS
    /// tolerance and drops).
    ts_skew: u32,
}

impl Scenario {
    fn random(seed: u64) -> Scenario {
        let mut r = FakeRng::new(seed.wrapping_mul(0x9E37_79B9) ^ 0x5EED);
        let mut pick = |n: u32| r.next_u32() % n;
        let cfg = TcpConfig {
            mss: [536, 1000, 1460][pick(3) as usize],
            timestamps: pick(4) != 0,
            sack: pick(4) != 0,
            window_scaling: pick(3) != 0,
            delayed_ack: if pick(3) == 0 {
                Some(Duration::from_millis(1 + u64::from(pick(20))))
            } else {
                None
            },
            cc: if pick(2) == 0 {
                CcAlgorithm::NewReno
            } else {
                CcAlgorithm::Cubic
            },
            snd_buf: 64 << 10,
            rcv_buf: 256 << 10,
            nagle: pick(5) == 0,
            time_wait: Duration::from_millis(50),
            keepalive: (pick(3) == 0).then_some(crate::tcp::config::KeepaliveConfig {
                // Probes during idle periods and reader stalls; the interval exceeds the
                // peer's `oow_ack_interval`, so every probe is answered.
                idle: Duration::from_millis(20),
                interval: Duration::from_millis(600),
                probes: 8,
            }),
            ..TcpConfig::default()
        };
        Scenario {
            seed,
            rcv_buf_b: [4 << 10, 16 << 10, 256 << 10][pick(3) as usize],
            loss: [0, 5, 20, 50][pick(4) as usize],
            dup: [0, 10, 30][pick(3) as usize],
            replay: [0, 5, 20][pick(3) as usize],
            delay_us: 50 + u64::from(pick(500)),
            jitter_us: [0, 20, 300][pick(3) as usize],
            // The 1 ms clocks wrap within the first 40 ms of the run.
            ts_a: u32::MAX - pick(40),
            ts_b: u32::MAX - pick(40),
            rpc: pick(2) == 0,
            bytes: 20_000 + pick(120_000) as usize,
            read_chance: [50, 300, 1000][pick(3) as usize],
            stall: [0, 2, 10][pick(3) as usize],
            ts_skew: [0, 0, 30][pick(3) as usize],
            cfg,
        }
    }
}

struct InFlight {
    at: Instant,
    id: u64,
    to_b: bool,
    repr: TcpRepr,
    payload: Vec<u8>,
}

/// Everything observable from one run.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    /// Every segment sent, event raised and timer armed, in order.
    trace: Vec<String>,
    /// Final state digests of both connections.
    final_a: String,
    final_b: String,
    /// Header prediction hits (A, B).
    hits: (u64, u64),
    segs_in: (u64, u64),
    /// Bytes B's application read.
    delivered_b: usize,
}

struct Sim {
    sc: Scenario,
    a: Connection,
    b: Option<Connection>,
    now: Instant,
    wire: Vec<InFlight>,
    next_id: u64,
    rng: FakeRng,
    trace: Vec<String>,
    history: Vec<(bool, TcpRepr, Vec<u8>)>,
}

impl Sim {
    fn new(sc: &Scenario, prediction: bool) -> Sim {
        let cfg = TcpConfig {
            header_prediction: prediction,
            ..sc.cfg.clone()
        };
        let now = Instant::from_millis(1);
        Sim {
            a: Connection::connect(now, tuple(true), cfg, SeqNum(ISS_A), sc.ts_a),
            b: None,
            now,
            wire: Vec::new(),
            next_id: 0,
            rng: FakeRng::new(sc.seed),
            trace: Vec::new(),
            history: Vec::new(),
            sc: sc.clone(),
        }
    }

    fn chance(&mut self, per_mille: u32) -> bool {
        per_mille > 0 && self.rng.next_u32() % 1000 < per_mille
    }

    fn put_on_wire(&mut self, to_b: bool, repr: TcpRepr, payload: Vec<u8>) {
        let jitter = if self.sc.jitter_us > 0 {
            u64::from(self.rng.next_u32()) % self.sc.jitter_us
        } else {
            0
        };
        let at = self.now + Duration::from_micros(self.sc.delay_us + jitter);
        self.wire.push(InFlight {
            at,
            id: self.next_id,
            to_b,
            repr,
            payload,
        });
        self.next_id += 1;
    }

    fn send_all(&mut self) {
        // Per side: `Connection::nothing_to_send` after the last segment; when it says so,
        // the next `poll_segment` must find nothing.
        let mut hint_idle = [false; 2];
        for from_a in [true, false] {
            for _ in 0..10_000 {
                let conn = if from_a {
                    &mut self.a
                } else {
                    match self.b.as_mut() {
                        Some(b) => b,
                        None => break,
                    }
                };
                let Some(s) = conn.poll_segment(self.now) else {
                    break;
                };
                if hint_idle[usize::from(!from_a)] {
                    panic!(
                        "seed {}: nothing_to_send() was true, then poll_segment sent {:?}",
                        self.sc.seed, s.repr
                    );
                }
                hint_idle[usize::from(!from_a)] = conn.nothing_to_send();
                let payload = s.payload.to_vec();
                self.trace.push(format!(
                    "{:?} {} {:?} len={} fnv={:x}",
                    self.now,
                    if from_a { "A>" } else { "B>" },
                    s.repr,
                    payload.len(),
                    fnv1a(&payload)
                ));
                if self.history.len() < 256 {
                    self.history.push((from_a, s.repr, payload.clone()));
                } else {
                    let i = self.rng.next_u32() as usize % self.history.len();
                    self.history[i] = (from_a, s.repr, payload.clone());
                }
                if self.chance(self.sc.loss) {
                    continue;
                }
                if self.chance(self.sc.dup) {
                    self.put_on_wire(from_a, s.repr, payload.clone());
                }
                self.put_on_wire(from_a, s.repr, payload);
                // An old segment from earlier in the connection shows up again.
                if !self.history.is_empty() && self.chance(self.sc.replay) {
                    let i = self.rng.next_u32() as usize % self.history.len();
                    let (to_b, repr, p) = self.history[i].clone();
                    self.put_on_wire(to_b, repr, p);
                }
            }
        }
    }

    fn deliver(&mut self, mut f: InFlight) {
        let payload = Zbuf::copy_from_slice(&f.payload);
        if self.chance(self.sc.ts_skew) {
            let back = 1 + self.rng.next_u32() % 2;
            if let Some(t) = f.repr.options.timestamps.as_mut() {
                t.tsval = t.tsval.wrapping_sub(back);
            }
        }
        if f.to_b {
            match self.b.as_mut() {
                Some(b) => {
                    b.on_segment(self.now, &f.repr, payload);
                }
                None if f.repr.flags == TcpFlags::SYN => {
                    let cfg = TcpConfig {
                        rcv_buf: self.sc.rcv_buf_b,
                        ..self.a_cfg()
                    };
                    let info = SynInfo {
                        seq: f.repr.seq,
                        window: f.repr.window,
                        options: f.repr.options,
                    };
                    self.b = Some(Connection::accept_syn(
                        self.now,
                        tuple(false),
                        cfg,
                        SeqNum(ISS_B),
                        self.sc.ts_b,
                        &info,
                    ));
                }
                None => {}
            }
        } else {
            self.a.on_segment(self.now, &f.repr, payload);
        }
    }

    fn a_cfg(&self) -> TcpConfig {
        TcpConfig::clone(&self.a.cfg)
    }

    /// Advance to the next delivery or timer; false when nothing is left to happen.
    fn step(&mut self) -> bool {
        self.send_all();
        let next_wire = self.wire.iter().map(|f| f.at).min();
        let ta = self.a.poll_timeout();
        let tb = self.b.as_ref().and_then(|b| b.poll_timeout());
        let next = [next_wire, ta, tb].into_iter().flatten().min();
        let Some(next) = next else {
            // Nothing in flight and no timer: the applications get another turn 1 ms later.
            self.now += Duration::from_millis(1);
            return false;
        };
        self.now = self.now.max(next);
        // Deliver what is due, in (time, send order).
        let mut due: Vec<InFlight> = Vec::new();
        let mut i = 0;
        while i < self.wire.len() {
            if self.wire[i].at <= self.now {
                due.push(self.wire.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|f| (f.at, f.id));
        for f in due {
            self.deliver(f);
        }
        if self.a.poll_timeout().is_some_and(|t| t <= self.now) {
            self.a.on_timeout(self.now);
        }
        if let Some(b) = self.b.as_mut() {
            if b.poll_timeout().is_some_and(|t| t <= self.now) {
                b.on_timeout(self.now);
            }
        }
        true
    }

    fn note_events(&mut self) {
        let ea = self.a.take_events();
        let eb = self.b.as_mut().map(|b| b.take_events());
        let tb = self.b.as_ref().and_then(|b| b.poll_timeout());
        self.trace.push(format!(
            "{:?} ev A{:?} B{:?} timers A{:?} B{:?}",
            self.now,
            ea,
            eb,
            self.a.poll_timeout(),
            tb
        ));
    }

    /// Reads up to `max` bytes; returns whether the stream ended (the peer's FIN was read).
    fn read(conn: &mut Connection, into: &mut Vec<u8>, max: usize) -> bool {
        match conn.recv_iovec(max) {
            Ok(iov) => {
                into.extend_from_slice(&iov.to_vec());
                false
            }
            Err(e) => e == RecvError::Finished,
        }
    }

    /// Run the workload, then close both sides; returns what each side read.
    fn run(mut self) -> (Outcome, Vec<u8>, Vec<u8>) {
        let data_a: Vec<u8> = (0..self.sc.bytes)
            .map(|i| (i as u8).wrapping_mul(7) ^ 0x5a)
            .collect();
        let data_b: Vec<u8> = (0..self.sc.bytes)
            .map(|i| (i as u8).wrapping_mul(13) ^ 0xa5)
            .collect();
        let src_a = Zbuf::copy_from_slice(&data_a);
        let src_b = Zbuf::copy_from_slice(&data_b);
        let (mut sent_a, mut sent_b) = (0usize, 0usize);
        let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
        // One side closes when the data is done, the other when it reads the end of stream,
        // so FINs arrive in ESTABLISHED as well as in FIN-WAIT-1.
        let a_first = self.sc.seed % 2 == 0;
        let (mut a_closed, mut b_closed) = (false, false);
        let mut closed = false;
        let mut idle = 0;
        let mut stall_until = Instant::ZERO;
        for step in 0..200_000usize {
            // A's application: bulk writes everything it can; RPC writes one request of a
            // random size once the previous response has been read in full.
            let want_a = if self.sc.rpc {
                let req = 512 + (self.rng.next_u32() % 6000) as usize;
                if got_a.len() >= sent_a && sent_b >= sent_a {
                    (sent_a + req).min(data_a.len())
                } else {
                    sent_a
                }
            } else {
                data_a.len()
            };
            if want_a > sent_a {
                if let Ok(n) = self.a.send(&src_a.slice(sent_a..want_a)) {
                    sent_a += n;
                }
            }
            if self.now >= stall_until && self.chance(self.sc.stall) {
                stall_until =
                    self.now + Duration::from_millis(u64::from(self.rng.next_u32() % 800));
            }
            let reading = self.now >= stall_until;
            if let Some(b) = self.b.as_mut() {
                if reading && self.rng.next_u32() % 1000 < self.sc.read_chance {
                    let max = 1 + (self.rng.next_u32() % 20_000) as usize;
                    if Self::read(b, &mut got_b, max) && closed && !b_closed {
                        b.close();
                        b_closed = true;
                    }
                }
                // B's application answers each request byte with a response byte.
                if self.sc.rpc && got_b.len() > sent_b {
                    if let Ok(n) = b.send(&src_b.slice(sent_b..got_b.len())) {
                        sent_b += n;
                    }
                }
            }
            if Self::read(&mut self.a, &mut got_a, usize::MAX) && closed && !a_closed {
                self.a.close();
                a_closed = true;
            }
            let done_data = got_b.len() == data_a.len() && (!self.sc.rpc || got_a.len() == sent_b);
            if done_data && !closed {
                if let Some(b) = self.b.as_mut() {
                    if a_first {
                        self.a.close();
                        a_closed = true;
                    } else {
                        b.close();
                        b_closed = true;
                    }
                    closed = true;
                }
            }
            if self.step() {
                idle = 0;
            } else {
                idle += 1;
                if idle > 5000 {
                    break;
                }
            }
            if step % 8 == 0 || closed {
                self.note_events();
            }
            if closed && self.a.is_closed() && self.b.as_ref().is_some_and(|b| b.is_closed()) {
                break;
            }
        }
        self.note_events();
        let b = self.b.as_ref().expect("handshake completed");
        let outcome = Outcome {
            final_a: self.a.digest(),
            final_b: b.digest(),
            hits: (self.a.counters.fast_path_hits, b.counters.fast_path_hits),
            segs_in: (self.a.counters.segs_in, b.counters.segs_in),
            delivered_b: got_b.len(),
            trace: self.trace,
        };
        (outcome, got_a, got_b)
    }
}

/// Runs `sc` with prediction on and off and returns the index of the first differing trace
/// line (or a final-state mismatch) as an error.
fn compare(sc: &Scenario) -> Result<(Outcome, Outcome), String> {
    let (on, a_on, b_on) = Sim::new(sc, true).run();
    let (off, a_off, b_off) = Sim::new(sc, false).run();
    if let Some(e) = difference(sc.seed, &on, &off) {
        return Err(e);
    }
    if a_on != a_off || b_on != b_off {
        return Err(format!("seed {}: delivered bytes differ", sc.seed));
    }
    Ok((on, off))
}

/// The first difference between two runs: a trace line or a final state.
fn difference(seed: u64, x: &Outcome, y: &Outcome) -> Option<String> {
    if let Some(i) =
        (0..x.trace.len().max(y.trace.len())).find(|&i| x.trace.get(i) != y.trace.get(i))
    {
        return Some(format!(
            "seed {seed}: trace differs at line {i}:\n  on:  {:?}\n  off: {:?}",
            x.trace.get(i),
            y.trace.get(i)
        ));
    }
    if x.final_a != y.final_a || x.final_b != y.final_b {
        return Some(format!(
            "seed {seed}: final state differs\n  on:  {}\n  off: {}\n  on:  {}\n  off: {}",
            x.final_a, y.final_a, x.final_b, y.final_b
        ));
    }
    None
}

#[test]
fn header_prediction_is_invisible_in_randomized_runs() {
    let mut total_hits = 0;
    let mut total_in = 0;
    for seed in 0..256u64 {
        let sc = Scenario::random(seed);
        let (on, off) = compare(&sc).unwrap_or_else(|e| panic!("{e}\nscenario: {sc:?}"));
        assert_eq!(
            off.hits,
            (0, 0),
            "seed {seed}: prediction off takes no hits"
        );
        assert_eq!(
            on.delivered_b, sc.bytes,
            "seed {seed}: A->B stream complete"
        );
        assert!(on.trace.len() > 20, "seed {seed}: the run did something");
        total_hits += on.hits.0 + on.hits.1;
        total_in += on.segs_in.0 + on.segs_in.1;
    }
    // The randomized runs exercise both paths.
    eprintln!("header prediction: {total_hits} of {total_in} segments");
    assert!(
        total_hits > 0 && total_hits < total_in,
        "hits {total_hits} of {total_in}"
    );
}

/// The pure-ACK fast path of the output (`Connection::poll_pure_ack`) is invisible too:
/// the randomized runs give the same segments, in the same order, and the same final
/// states with it on and off.
#[test]
fn the_pure_ack_fast_path_is_invisible_in_randomized_runs() {
    use super::{PURE_ACK_FAST_PATH, PURE_ACK_HITS};
    let mut taken = 0;
    for seed in 0..128u64 {
        let sc = Scenario::random(seed);
        let hits = PURE_ACK_HITS.with(core::cell::Cell::get);
        let (fast, a_fast, b_fast) = Sim::new(&sc, true).run();
        taken += PURE_ACK_HITS.with(core::cell::Cell::get) - hits;
        PURE_ACK_FAST_PATH.with(|c| c.set(false));
        let (general, a_gen, b_gen) = Sim::new(&sc, true).run();
        PURE_ACK_FAST_PATH.with(|c| c.set(true));
        if let Some(e) = difference(seed, &fast, &general) {
            panic!("pure-ACK fast path: {e}\nscenario: {sc:?}");
        }
        assert!(
            a_fast == a_gen && b_fast == b_gen,
            "seed {seed}: delivered bytes differ"
        );
    }
    assert!(taken > 0, "the fast path sent no ACK");
}

#[test]
fn randomized_runs_deliver_every_byte() {
    for seed in [3u64, 11, 29] {
        let sc = Scenario::random(seed);
        let (_, got_a, got_b) = Sim::new(&sc, true).run();
        let want_b: Vec<u8> = (0..sc.bytes)
            .map(|i| (i as u8).wrapping_mul(7) ^ 0x5a)
            .collect();
        assert_eq!(got_b.len(), want_b.len(), "seed {seed}: A->B stream length");
        assert!(got_b == want_b, "seed {seed}: A->B stream content");
        if sc.rpc {
            assert_eq!(got_a.len(), sc.bytes, "seed {seed}: B->A stream");
        }
    }
}

#[test]
fn equivalence_check_detects_a_behaviour_difference() {
    // The comparison is not vacuous: a run whose connections do behave differently (here a
    // delayed-ACK timer instead of immediate ACKs) is reported.
    let sc = Scenario {
        cfg: TcpConfig {
            delayed_ack: None,
            ..Scenario::random(1).cfg
        },
        loss: 0,
        ..Scenario::random(1)
    };
    let (a, _, _) = Sim::new(&sc, true).run();
    let mut other = sc.clone();
    other.cfg.delayed_ack = Some(Duration::from_millis(5));
    let (b, _, _) = Sim::new(&other, true).run();
    assert!(difference(sc.seed, &a, &b).is_some());
}

#[test]
fn steady_state_bulk_and_rpc_take_the_fast_path() {
    for rpc in [false, true] {
        let sc = Scenario {
            seed: 7,
            cfg: TcpConfig {
                snd_buf: 64 << 10,
                ..TcpConfig::default()
            },
            rcv_buf_b: 256 << 10,
            loss: 0,
            dup: 0,
            replay: 0,
            delay_us: 100,
            jitter_us: 0,
            ts_a: 10,
            ts_b: 20,
            rpc,
            bytes: 200_000,
            read_chance: 1000,
            stall: 0,
            ts_skew: 0,
        };
        let (on, _) = compare(&sc).unwrap_or_else(|e| panic!("{e}"));
        let hits = on.hits.0 + on.hits.1;
        let segs = on.segs_in.0 + on.segs_in.1;
        // Everything but the handshake, the FIN exchange and the odd window-zero transition.
        assert!(
            hits * 10 >= segs * 9,
            "rpc={rpc}: {hits} of {segs} segments predicted"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Per-rule tests: excluded cases go the full way, accepted ones are taken, same result
// ---------------------------------------------------------------------------------------------

const PEER: u32 = 5000;
const ISS: u32 = 1000;

fn t(ms: u64) -> Instant {
    Instant::from_millis(ms)
}

fn ts(tsval: u32, tsecr: u32) -> TcpOptions {
    TcpOptions {
        timestamps: Some(Timestamps { tsval, tsecr }),
        ..TcpOptions::default()
    }
}

/// A connection in ESTABLISHED with SACK and timestamps negotiated (TS.Recent = 100), 3000
/// bytes sent and unacknowledged, the peer's window 65535 (no scaling).
fn fixture(prediction: bool, cfg: TcpConfig) -> Connection {
    let cfg = TcpConfig {
        header_prediction: prediction,
        window_scaling: false,
        ..cfg
    };
    let mut c = Connection::connect(t(0), tuple(true), cfg, SeqNum(ISS), 0);
    while c.poll_segment(t(0)).is_some() {}
    let synack = TcpRepr {
        src_port: 7000,
        dst_port: 40000,
        seq: SeqNum(PEER),
        ack: SeqNum(ISS + 1),
        flags: TcpFlags::SYN | TcpFlags::ACK,
        window: 65535,
        urgent: 0,
        options: TcpOptions {
            mss: Some(1460),
            sack_permitted: true,
            ..ts(100, 0)
        },
    };
    c.on_segment(t(1), &synack, Zbuf::copy_from_slice(&[]));
    assert_eq!(c.state(), State::Established);
    c.send(&Zbuf::copy_from_slice(&[9u8; 3000])).unwrap();
    while c.poll_segment(t(1)).is_some() {}
    c.take_events();
    c
}

fn peer_seg(flags: TcpFlags, seq: u32, ack: u32, window: u16, options: TcpOptions) -> TcpRepr {
    TcpRepr {
        src_port: 7000,
        dst_port: 40000,
        seq: SeqNum(seq),
        ack: SeqNum(ack),
        flags,
        window,
        urgent: 0,
        options,
    }
}

/// Prepares a fixture, feeds it `seg` (with `len` payload bytes), drains its output, with
/// prediction on and off: returns the hit count of the "on" run after asserting both runs
/// end identical (state, output, events).
fn run_case(cfg: TcpConfig, prep: impl Fn(&mut Connection), seg: TcpRepr, len: usize) -> u64 {
    let mut res = Vec::new();
    let mut hits = 0;
    for prediction in [true, false] {
        let mut c = fixture(prediction, cfg.clone());
        prep(&mut c);
        let before = c.counters.fast_path_hits;
        c.on_segment(t(5), &seg, Zbuf::copy_from_slice(&vec![3u8; len]));
        if prediction {
            hits = c.counters.fast_path_hits - before;
        }
        let ev = c.take_events();
        let mut out = Vec::new();
        while let Some(s) = c.poll_segment(t(5)) {
            out.push(format!("{:?} {}", s.repr, s.payload.len()));
        }
        res.push((c.digest(), out, ev, c.poll_timeout()));
    }
    assert_eq!(res[0], res[1], "prediction on and off differ");
    hits
}

fn taken(seg: TcpRepr, len: usize) -> u64 {
    run_case(TcpConfig::default(), |_| {}, seg, len)
}

const ACKED: u32 = ISS + 1 + 1460;
const SND_MAX: u32 = ISS + 1 + 3000;

#[test]
fn rfc9293_3_10_7_4_in_order_pure_ack_and_data_are_predicted() {
    // Pure ACK of new data: SND.UNA < SEG.ACK =< SND.MAX.
    let ack = peer_seg(TcpFlags::ACK, PEER + 1, ACKED, 65535, ts(101, 5));
    assert_eq!(taken(ack, 0), 1);
    // ACK of everything.
    let ack = peer_seg(TcpFlags::ACK, PEER + 1, SND_MAX, 65535, ts(101, 5));
    assert_eq!(taken(ack, 0), 1);
    // In-order data with ACK = SND.UNA, and with PSH.
    let data = peer_seg(TcpFlags::ACK, PEER + 1, ISS + 1, 65535, ts(100, 5));
    assert_eq!(taken(data, 500), 1);
    let data = peer_seg(
        TcpFlags::ACK | TcpFlags::PSH,
        PEER + 1,
        ISS + 1,
        65535,
        ts(100, 5),
    );
    assert_eq!(taken(data, 500), 1);
    // RFC 5681 §2: a window update at SEG.ACK = SND.UNA is not a duplicate ACK.
    let upd = peer_seg(TcpFlags::ACK, PEER + 1, ISS + 1, 40000, ts(101, 5));
    assert_eq!(taken(upd, 0), 1);
    // In-order data that also acknowledges new data, with a changed (open) window.
    let data = peer_seg(TcpFlags::ACK, PEER + 1, ACKED, 30000, ts(102, 5));
    assert_eq!(taken(data, 800), 1);
}

#[test]
fn rfc7323_4_3_predicted_segment_updates_ts_recent_across_the_wrap() {
    // Walk TS.Recent up to just below 2^32 (steps under 2^31, each newer), then a TSval past
    // the wrap: newer in serial arithmetic though numerically smaller.
    let prep = |c: &mut Connection| {
        for (i, tsval) in [0x7000_0000u32, 0xE000_0000, u32::MAX - 2]
            .into_iter()
            .enumerate()
        {
            let seq = PEER + 1 + i as u32;
            let seg = peer_seg(TcpFlags::ACK, seq, ISS + 1, 65535, ts(tsval, 5));
            c.on_segment(t(2), &seg, Zbuf::copy_from_slice(&[1]));
            while c.poll_segment(t(2)).is_some() {}
        }
        assert_eq!(c.ts.unwrap().recent, u32::MAX - 2);
    };
    let seg = peer_seg(TcpFlags::ACK, PEER + 4, ISS + 1, 65535, ts(3, 5));
    assert_eq!(run_case(TcpConfig::default(), prep, seg, 100), 1);
    let mut c = fixture(true, TcpConfig::default());
    prep(&mut c);
    c.on_segment(t(5), &seg, Zbuf::copy_from_slice(&[1u8; 100]));
    let out = c.poll_segment(t(5)).expect("ACK");
    assert_eq!(
        out.repr.options.timestamps.unwrap().tsecr,
        3,
        "TS.Recent moved"
    );
}

#[test]
fn rfc9293_3_10_7_4_control_flags_take_the_full_path() {
    for flags in [
        TcpFlags::ACK | TcpFlags::FIN,
        TcpFlags::ACK | TcpFlags::RST,
        TcpFlags::ACK | TcpFlags::SYN,
        TcpFlags::ACK | TcpFlags::URG,
        TcpFlags::ACK | TcpFlags::ECE,
        TcpFlags::ACK | TcpFlags::CWR,
        TcpFlags::PSH,
        TcpFlags::EMPTY,
    ] {
        let seg = peer_seg(flags, PEER + 1, ACKED, 65535, ts(101, 5));
        assert_eq!(taken(seg, 10), 0, "{flags:?}");
    }
}

#[test]
fn rfc9293_3_10_7_4_out_of_sequence_takes_the_full_path() {
    // Beyond RCV.NXT (out of order), and below it (a retransmission overlapping old data).
    let seg = peer_seg(TcpFlags::ACK, PEER + 1 + 100, ISS + 1, 65535, ts(101, 5));
    assert_eq!(taken(seg, 100), 0);
    let seg = peer_seg(TcpFlags::ACK, PEER, ISS + 1, 65535, ts(101, 5));
    assert_eq!(taken(seg, 100), 0);
}

#[test]
fn rfc9293_3_10_7_4_other_states_take_the_full_path() {
    // FIN-WAIT-1 (we closed) and CLOSE-WAIT (the peer closed).
    let seg = peer_seg(TcpFlags::ACK, PEER + 1, ACKED, 65535, ts(101, 5));
    assert_eq!(run_case(TcpConfig::default(), |c| c.close(), seg, 0), 0);
    let prep = |c: &mut Connection| {
        let fin = peer_seg(
            TcpFlags::ACK | TcpFlags::FIN,
            PEER + 1,
            ISS + 1,
            65535,
            ts(100, 5),
        );
        c.on_segment(t(2), &fin, Zbuf::copy_from_slice(&[]));
        assert_eq!(c.state(), State::CloseWait);
    };
    let seg = peer_seg(TcpFlags::ACK, PEER + 2, ACKED, 65535, ts(101, 5));
    assert_eq!(run_case(TcpConfig::default(), prep, seg, 0), 0);
}

#[test]
fn rfc7323_3_2_and_5_3_timestamp_cases_take_the_full_path() {
    // RFC 7323 §3.2: no timestamps although negotiated (dropped on the full path).
    let seg = peer_seg(TcpFlags::ACK, PEER + 1, ACKED, 65535, TcpOptions::default());
    assert_eq!(taken(seg, 0), 0);
    // RFC 7323 §5.3: TSval one tick older than TS.Recent (accepted by the tolerance) and much
    // older (PAWS drop).
    for tsval in [99, 50] {
        let seg = peer_seg(TcpFlags::ACK, PEER + 1, ACKED, 65535, ts(tsval, 5));
        assert_eq!(taken(seg, 0), 0, "tsval {tsval}");
    }
    // Timestamps not negotiated but present.
    let cfg = TcpConfig {
        timestamps: false,
        ..TcpConfig::default()
    };
    let seg = peer_seg(TcpFlags::ACK, PEER + 1, ACKED, 65535, ts(101, 5));
    assert_eq!(run_case(cfg.clone(), |_| {}, seg, 0), 0);
    // ...and absent: predicted.
    let seg = peer_seg(TcpFlags::ACK, PEER + 1, ACKED, 65535, TcpOptions::default());
    assert_eq!(run_case(cfg, |_| {}, seg, 0), 1);
}

#[test]
fn rfc2018_sack_blocks_and_scoreboard_state_take_the_full_path() {
    // A segment carrying a SACK block.
    let mut opts = ts(101, 5);
    opts.sack_blocks
        .push(SeqNum(ISS + 1 + 2000), SeqNum(SND_MAX));
    let seg = peer_seg(TcpFlags::ACK, PEER + 1, ISS + 1, 65535, opts);
    assert_eq!(taken(seg, 0), 0);
    // A plain ACK while the scoreboard holds SACKed ranges (RFC 2018 §8 renege check).
    let prep = |c: &mut Connection| {
        c.on_segment(t(2), &seg, Zbuf::copy_from_slice(&[]));
        assert!(!c.sb.ranges().is_empty());
    };
    let ack = peer_seg(TcpFlags::ACK, PEER + 1, ACKED, 65535, ts(101, 5));
    assert_eq!(run_case(TcpConfig::default(), prep, ack, 0), 0);
}

#[test]
fn rfc5681_2_duplicate_and_unacceptable_acks_take_the_full_path() {
    // RFC 5681 §2: a duplicate ACK (ACK = SND.UNA, no data, data outstanding).
    let seg = peer_seg(TcpFlags::ACK, PEER + 1, ISS + 1, 65535, ts(101, 5));
    assert_eq!(taken(seg, 0), 0);
    // RFC 5961 §5.2: an ACK beyond SND.MAX, with and without data.
    let seg = peer_seg(TcpFlags::ACK, PEER + 1, SND_MAX + 1, 65535, ts(101, 5));
    assert_eq!(taken(seg, 0), 0);
    assert_eq!(taken(seg, 10), 0);
    // An ACK below SND.UNA on data.
    let prep = |c: &mut Connection| {
        let a = peer_seg(TcpFlags::ACK, PEER + 1, ACKED, 65535, ts(101, 5));
        c.on_segment(t(2), &a, Zbuf::copy_from_slice(&[]));
    };
    let seg = peer_seg(TcpFlags::ACK, PEER + 1, ISS + 1, 65535, ts(101, 5));
    assert_eq!(run_case(TcpConfig::default(), prep, seg, 10), 0);
}

#[test]
fn rfc6582_and_rfc6298_recovery_and_rto_take_the_full_path() {
    // Loss recovery (three duplicate ACKs, RFC 5681 §3.2 / RFC 6582 §3.2).
    let prep = |c: &mut Connection| {
        for _ in 0..3 {
            let d = peer_seg(TcpFlags::ACK, PEER + 1, ISS + 1, 65535, ts(101, 5));
            c.on_segment(t(2), &d, Zbuf::copy_from_slice(&[]));
        }
        assert!(c.in_recovery());
        while c.poll_segment(t(2)).is_some() {}
    };
    let seg = peer_seg(TcpFlags::ACK, PEER + 1, ACKED, 65535, ts(101, 5));
    assert_eq!(run_case(TcpConfig::default(), prep, seg, 0), 0);
    // RFC 6298 §5.4: after an RTO SND.NXT is rewound below SND.MAX (no tail loss probe
    // first: the case is the RTO's).
    let prep = |c: &mut Connection| {
        let at = c.poll_timeout().expect("RTO armed");
        c.on_timeout(at);
        assert!(c.snd_nxt != c.snd_max);
    };
    let no_tlp = TcpConfig {
        tlp: None,
        ..TcpConfig::default()
    };
    assert_eq!(run_case(no_tlp, prep, seg, 0), 0);
}

#[test]
fn rfc9293_3_8_6_1_zero_windows_take_the_full_path() {
    // The peer closes its window.
    let seg = peer_seg(TcpFlags::ACK, PEER + 1, ACKED, 0, ts(101, 5));
    assert_eq!(taken(seg, 0), 0);
    // The peer's window was zero and reopens.
    let prep = |c: &mut Connection| {
        c.on_segment(t(2), &seg, Zbuf::copy_from_slice(&[]));
        assert_eq!(c.send_window(), 0);
    };
    let open = peer_seg(TcpFlags::ACK, PEER + 1, SND_MAX, 65535, ts(102, 5));
    assert_eq!(run_case(TcpConfig::default(), prep, open, 0), 0);
}

#[test]
fn rfc9293_3_10_7_4_data_beyond_the_window_or_after_a_gap_takes_the_full_path() {
    // More than the advertised window (trimmed on the full path).
    let cfg = TcpConfig {
        rcv_buf: 2000,
        ..TcpConfig::default()
    };
    let seg = peer_seg(TcpFlags::ACK, PEER + 1, ISS + 1, 65535, ts(101, 5));
    assert_eq!(run_case(cfg.clone(), |_| {}, seg, 2500), 0);
    assert_eq!(run_case(cfg, |_| {}, seg, 1500), 1);
    // RFC 5681 §4.2: out-of-order data is queued; the segment filling the gap is ACKed at
    // once and takes the full path.
    let prep = |c: &mut Connection| {
        let ooo = peer_seg(TcpFlags::ACK, PEER + 1 + 100, ISS + 1, 65535, ts(101, 5));
        c.on_segment(t(2), &ooo, Zbuf::copy_from_slice(&[4u8; 100]));
        while c.poll_segment(t(2)).is_some() {}
    };
    assert_eq!(run_case(TcpConfig::default(), prep, seg, 100), 0);
}

#[test]
fn rfc9293_3_6_1_orphan_data_takes_the_full_path() {
    let prep = |c: &mut Connection| c.set_orphaned();
    let seg = peer_seg(TcpFlags::ACK, PEER + 1, ISS + 1, 65535, ts(101, 5));
    assert_eq!(run_case(TcpConfig::default(), prep, seg, 10), 0);
}

#[test]
fn prediction_off_never_counts_a_hit() {
    let mut c = fixture(false, TcpConfig::default());
    let seg = peer_seg(TcpFlags::ACK, PEER + 1, ACKED, 65535, ts(101, 5));
    c.on_segment(t(5), &seg, Zbuf::copy_from_slice(&[]));
    assert_eq!(c.counters.fast_path_hits, 0);
    assert_eq!(c.snd_una(), SeqNum(ACKED));
}

/// Receive coalescing (`Connection::on_segment_run`, fed by `Stack::handle_frames`) leaves
/// the connection exactly as one `on_segment` per segment does: state (digest), output,
/// events and timers — for a run prediction takes (with and without a delayed-ACK timer,
/// whose full-sized-segment rule counts segments, and an ACK of new data or none) and for
/// runs it declines (out of order: each segment then goes the full way).
#[test]
fn a_run_of_segments_ends_where_one_call_per_segment_ends() {
    let delayed = TcpConfig {
        delayed_ack: Some(crate::time::Duration::from_millis(40)),
        ..TcpConfig::default()
    };
    let cases: Vec<(TcpConfig, u32, u32, usize, bool)> = vec![
        // (config, first seq, ack, segments, prediction takes it)
        (TcpConfig::default(), PEER + 1, ACKED, 3, true),
        (TcpConfig::default(), PEER + 1, ISS + 1, 4, true),
        (delayed.clone(), PEER + 1, ACKED, 3, true),
        (delayed.clone(), PEER + 1, SND_MAX, 5, true),
        (TcpConfig::default(), PEER + 1 + 1448, ACKED, 3, false),
        (delayed, PEER + 1 + 100, SND_MAX, 2, false),
    ];
    for (cfg, seq, ack, n, predicted) in cases {
        let mut res = Vec::new();
        for run in [false, true] {
            let mut c = fixture(true, cfg.clone());
            let before = c.counters.fast_path_hits;
            let mut seg = peer_seg(TcpFlags::ACK, seq, ack, 60000, ts(101, 5));
            let pieces: Vec<Zbuf> = (0..n)
                .map(|i| Zbuf::copy_from_slice(&vec![i as u8; 1448]))
                .collect();
            if run {
                let mut v = pieces;
                let mut readable = 0;
                let (d, p) = c.on_segment_run(t(5), &mut seg, &mut v, &mut readable, isize::MAX);
                // Taken runs deliver every segment; the declined ones here are out of
                // order (held, nothing readable).
                assert_eq!(readable, if predicted { n as u32 } else { 0 });
                assert_eq!((d, p), (Disposition::Keep, predicted), "seq {seq} n {n}");
                assert!(v.is_empty());
            } else {
                for p in pieces {
                    let len = p.len();
                    c.on_segment(t(5), &seg, p);
                    seg.seq += len;
                }
            }
            let hits = c.counters.fast_path_hits - before;
            let ev = c.take_events();
            let mut out = Vec::new();
            while let Some(s) = c.poll_segment(t(5)) {
                out.push(format!("{:?} {}", s.repr, s.payload.len()));
            }
            let mut got = Vec::new();
            while let Ok(Some(z)) = c.recv() {
                got.extend_from_slice(&z);
            }
            res.push((c.digest(), out, ev, c.poll_timeout(), hits, got));
        }
        assert_eq!(
            res[0], res[1],
            "seq {seq} ack {ack} n {n}: a run and per-segment differ"
        );
    }
}
