//! A hostile-client model of the message path, one thread, seeded: connections pipeline
//! requests in random pieces, some end in garbage or an oversized message, the test
//! closes some mid-flight and attaches their handles again (ABA), pauses and resumes
//! them, and "workers" (the test, through the worker sockets) take messages and complete
//! them in random order — reply, finish, drop unanswered, or reply and close. After every
//! step: each reply belongs to the live attachment of its handle, none twice, ordered
//! ones in request order. At the end (everything fed, taken and completed): every
//! connection still attached has been answered completely, every closed one was closed
//! for a reason, and `messages = replies + finished + abandoned + closed_in_flight`.
#![cfg(not(loom))]

use msgsched::framer::FramerConfig;
use msgsched::parser::knb::{Header, KnbParser, RESPONSE};
use msgsched::parser::{Ordering, ParseError, Parser};
use msgsched::sched::{Model, SchedConfig};
use msgsched::socket::{group, IoEvent, Message, MsgIo, MsgSocket};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zbuf::{IoVec, Zbuf};

/// knb framing, with MARK-flagged requests exclusive (they run alone, as memcached's
/// writes) and a farewell after a framing error.
struct P(KnbParser);

const FAREWELL: &[u8] = b"BYE";

impl Parser for P {
    fn parse(&mut self, buf: &IoVec, max: usize) -> Result<usize, ParseError> {
        self.0.parse(buf, max)
    }
    fn ordering(&self) -> Ordering {
        self.0.ordering()
    }
    fn stream(&self, msg: &IoVec) -> Option<u64> {
        self.0.stream(msg)
    }
    fn exclusive(&self, msg: &IoVec) -> bool {
        Header::read(msg)
            .ok()
            .flatten()
            .is_some_and(|h| h.flags & MARK != 0)
    }
    fn farewell(&mut self, _err: &ParseError, _buf: &IoVec) -> Option<Zbuf> {
        Some(Zbuf::copy_from_slice(FAREWELL))
    }
}

const MARK: u16 = 8;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Reply,
    Finish,
    Abandon,
    Close,
}

/// One attachment of a handle.
#[derive(Default)]
struct Att {
    gen: u64,
    /// Bytes still to feed.
    rest: Vec<u8>,
    /// Ids of the whole requests in the stream, in order, and where each ends.
    ids: Vec<u64>,
    ends: Vec<usize>,
    /// Bytes fed so far.
    fed: usize,
    /// The stream ends in a framing error.
    bad_tail: bool,
    acts: HashMap<u64, Act>,
    wire: Vec<u64>,
    /// Shut down by the I/O side (reply that closes, framing error).
    shut: Option<Option<msgsched::parser::ParseErrorKind>>,
    /// The farewell was sent (nothing may follow it).
    farewell: bool,
    /// Exclusive messages at a worker / any message at a worker (exclusive ones run alone).
    out_excl: usize,
    out_any: usize,
    paused: bool,
}

const MAX_MESSAGE: usize = 2048;

fn build(rng: &mut Rng, gen: u64) -> Att {
    let n = 1 + rng.below(24);
    let mut a = Att {
        gen,
        ..Att::default()
    };
    for i in 0..n as u64 {
        let id = (gen << 32) | i;
        let len = rng.below(200) as u32;
        let flags = if rng.one_in(5) { MARK } else { 0 };
        a.rest.extend(Header { id, len, flags }.bytes());
        a.rest.extend((0..len).map(|k| k as u8));
        a.ids.push(id);
        a.ends.push(a.rest.len());
    }
    match rng.below(6) {
        0 => {
            a.rest.extend(b"GET / HTTP/1.1\r\n\r\n");
            a.bad_tail = true;
        }
        1 => {
            let id = (gen << 32) | n as u64;
            a.rest.extend(
                Header {
                    id,
                    len: MAX_MESSAGE as u32,
                    flags: 0,
                }
                .bytes(),
            );
            a.bad_tail = true;
        }
        _ => {}
    }
    a
}

fn reply_for(m: &Message<u32>) -> IoVec {
    let h = Header::read(&m.body).unwrap().unwrap();
    let mut v = IoVec::new();
    v.push(Zbuf::copy_from_slice(
        &Header {
            flags: RESPONSE,
            len: 0,
            ..h
        }
        .bytes(),
    ));
    v
}

struct World {
    io: MsgIo<u32, P>,
    sockets: Vec<MsgSocket<u32>>,
    ordering: Ordering,
    atts: HashMap<u32, Att>,
    /// Handles attached now.
    live: HashSet<u32>,
    next_gen: u64,
    /// Messages taken by a worker and not yet completed.
    out: Vec<(usize, Message<u32>)>,
    /// Handles the driver stopped reading (`wait_input`) until `poll_resumed` names them.
    blocked: HashSet<u32>,
    seed: u64,
    /// Worker threads' record of what they did with each message (threaded runs).
    shared_acts: Option<Arc<Mutex<HashMap<u64, Act>>>>,
}

impl World {
    fn attach(&mut self, rng: &mut Rng, h: u32) {
        self.next_gen += 1;
        let a = build(rng, self.next_gen);
        self.io.attach(h, P(KnbParser::new(self.ordering))).unwrap();
        self.atts.insert(h, a);
        self.live.insert(h);
    }

    fn feed(&mut self, rng: &mut Rng, h: u32) {
        let Some(a) = self.atts.get_mut(&h) else {
            return;
        };
        if !self.live.contains(&h) || a.rest.is_empty() || self.blocked.contains(&h) {
            return;
        }
        if !self.io.wants_input(h) {
            // r2c's contract: stop reading it until it is reported resumed.
            self.io.wait_input(h);
            self.blocked.insert(h);
            return;
        }
        let n = (1 + rng.below(300)).min(a.rest.len());
        let rest = a.rest.split_off(n);
        let piece = std::mem::replace(&mut a.rest, rest);
        a.fed += piece.len();
        self.io.on_data(h, Zbuf::copy_from_slice(&piece));
    }

    fn take(&mut self, w: usize) -> bool {
        match self.sockets[w].try_recv() {
            Some(m) => {
                let hd = Header::read(&m.body).unwrap().unwrap();
                let seed = self.seed;
                if let Some(a) = self.atts.get_mut(&m.origin.conn()) {
                    if a.gen == hd.id >> 32 {
                        let excl = hd.flags & MARK != 0;
                        assert!(
                            a.out_excl == 0 && (!excl || a.out_any == 0),
                            "seed {seed}: {:#x} (exclusive {excl}) runs beside {} others ({} exclusive)",
                            hd.id,
                            a.out_any,
                            a.out_excl
                        );
                        a.out_any += 1;
                        a.out_excl += usize::from(excl);
                    }
                }
                self.out.push((w, m));
                true
            }
            None => false,
        }
    }

    fn complete(&mut self, rng: &mut Rng, i: usize) {
        let (w, m) = self.out.swap_remove(i);
        let id = Header::read(&m.body).unwrap().unwrap().id;
        let h = m.origin.conn();
        let act = match rng.below(20) {
            0..=1 => Act::Finish,
            2..=3 => Act::Abandon,
            4 => Act::Close,
            _ => Act::Reply,
        };
        let excl = Header::read(&m.body).unwrap().unwrap().flags & MARK != 0;
        if let Some(a) = self.atts.get_mut(&h) {
            if a.gen == id >> 32 {
                a.out_any -= 1;
                a.out_excl -= usize::from(excl);
                assert!(
                    a.acts.insert(id, act).is_none(),
                    "seed {}: message {id:#x} taken twice",
                    self.seed
                );
            }
        }
        let s = &mut self.sockets[w];
        match act {
            Act::Reply => {
                let r = reply_for(&m);
                s.reply(m.origin, r);
            }
            Act::Finish => {
                s.finish(m.origin);
            }
            Act::Abandon => drop(m),
            Act::Close => {
                let r = reply_for(&m);
                s.reply_and_close(m.origin, r);
            }
        }
    }

    fn poll(&mut self) {
        let (atts, live, ordering, seed) = (&mut self.atts, &self.live, self.ordering, self.seed);
        self.io.poll_replies(|h, r| {
            let a = atts
                .get_mut(&h)
                .expect("a reply for a handle never attached");
            assert!(
                !a.farewell,
                "seed {seed}: handle {h}: bytes after the farewell"
            );
            if r.to_vec() == FAREWELL {
                assert!(
                    a.bad_tail,
                    "seed {seed}: handle {h}: farewell without an error"
                );
                a.farewell = true;
                return;
            }
            let hd = Header::read(&r).unwrap().unwrap();
            assert_eq!(hd.flags, RESPONSE);
            assert!(
                live.contains(&h),
                "seed {seed}: reply {:#x} on detached handle {h}",
                hd.id
            );
            assert_eq!(
                hd.id >> 32,
                a.gen,
                "seed {seed}: reply {:#x} of an old attachment on handle {h}",
                hd.id
            );
            assert!(
                !a.wire.contains(&hd.id),
                "seed {seed}: reply {:#x} sent twice",
                hd.id
            );
            if ordering == Ordering::Ordered {
                if let Some(&last) = a.wire.last() {
                    assert!(last < hd.id, "seed {seed}: {:#x} after {last:#x}", hd.id);
                }
            }
            a.wire.push(hd.id);
        });
        while let Some(ev) = self.io.poll_event() {
            match ev {
                IoEvent::Shutdown { conn, reason } => {
                    assert!(
                        self.live.remove(&conn),
                        "seed {seed}: shutdown of {conn} twice"
                    );
                    self.atts.get_mut(&conn).unwrap().shut = Some(reason);
                }
                IoEvent::Close { conn, .. } => panic!("seed {seed}: MsgIo reset {conn}"),
            }
        }
        while let Some(h) = self.io.poll_resumed() {
            self.blocked.remove(&h);
        }
    }

    /// Threaded runs: copy the workers' record into each attachment.
    fn sync_acts(&mut self, ended: &mut [(u32, Att)]) {
        let Some(acts) = &self.shared_acts else {
            return;
        };
        let acts = acts.lock().unwrap();
        for a in self
            .atts
            .values_mut()
            .chain(ended.iter_mut().map(|(_, a)| a))
        {
            for id in &a.ids {
                if let Some(&act) = acts.get(id) {
                    a.acts.insert(*id, act);
                }
            }
        }
    }

    /// r2c closes a half-closed connection once `in_flight` is 0: that must mean every
    /// request received so far has been served (none waits unframed or unplaced).
    /// The memory budget's total is the sum over the connections.
    fn check_mem(&self) {
        let sum: usize = (0..5).filter_map(|h| self.io.mem(h)).sum();
        assert_eq!(self.io.mem_held(), sum, "seed {}", self.seed);
    }

    fn check_idle_means_done(&self) {
        for &h in &self.live {
            let a = &self.atts[&h];
            if a.paused || self.io.in_flight(h) != Some(0) {
                continue;
            }
            for (id, &end) in a.ids.iter().zip(&a.ends) {
                assert!(
                    end > a.fed || a.acts.contains_key(id),
                    "seed {}: handle {h} has nothing in flight but {id:#x} was received and never served",
                    self.seed
                );
            }
        }
    }

    /// The expected wire of attachment `a` that ran to its end.
    fn check_finished(&self, h: u32, a: &Att) {
        let seed = self.seed;
        let close_at = a
            .ids
            .iter()
            .position(|id| a.acts.get(id) == Some(&Act::Close));
        let answered: Vec<u64> = match self.ordering {
            Ordering::Ordered => {
                let upto = close_at.map_or(a.ids.len(), |i| i + 1);
                a.ids[..upto]
                    .iter()
                    .copied()
                    .filter(|id| matches!(a.acts.get(id), Some(Act::Reply | Act::Close)))
                    .collect()
            }
            // Each as it completes; after a reply that closes, nothing.
            Ordering::Unordered => a
                .ids
                .iter()
                .copied()
                .filter(|id| matches!(a.acts.get(id), Some(Act::Reply | Act::Close)))
                .collect(),
        };
        if self.ordering == Ordering::Ordered {
            assert_eq!(a.wire, answered, "seed {seed}: handle {h} gen {}", a.gen);
        } else {
            let mut wire = a.wire.clone();
            wire.sort_unstable();
            if close_at.is_none() {
                assert_eq!(wire, answered, "seed {seed}: handle {h} gen {}", a.gen);
            } else {
                assert!(
                    wire.iter().all(|id| answered.contains(id)),
                    "seed {seed}: handle {h}: {wire:?} not all answered"
                );
            }
        }
        match (a.shut, close_at, a.bad_tail) {
            (None, None, false) => {
                // Still attached: every request taken and completed, none left.
                for id in &a.ids {
                    assert!(
                        a.acts.contains_key(id),
                        "seed {seed}: handle {h}: request {id:#x} never reached a worker"
                    );
                }
                assert_eq!(self.io.in_flight(h), Some(0), "seed {seed}: handle {h}");
            }
            (Some(None), Some(_), _) => {}
            (Some(Some(_)), None, true) => {
                assert!(
                    a.farewell,
                    "seed {seed}: handle {h}: closed without its farewell"
                );
                for id in &a.ids {
                    assert!(
                        a.acts.contains_key(id),
                        "seed {seed}: handle {h}: request {id:#x} before the garbage never served"
                    );
                }
            }
            other => panic!("seed {seed}: handle {h}: unexpected end {other:?}"),
        }
    }
}

fn run(seed: u64, model: Model, ordering: Ordering) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let sched = SchedConfig {
        model,
        workers: 3,
        queue_capacity: 1 + rng.below(3),
        seed,
    };
    let framer = FramerConfig {
        max_message: MAX_MESSAGE,
        max_in_flight: 1 + rng.below(6),
        ..FramerConfig::default()
    };
    let (io, sockets) = group::<u32, P>(&sched, framer).unwrap();
    let mut w = World {
        io,
        sockets,
        ordering,
        atts: HashMap::new(),
        live: HashSet::new(),
        next_gen: 0,
        out: Vec::new(),
        blocked: HashSet::new(),
        seed,
        shared_acts: None,
    };
    const HANDLES: u32 = 5;
    let steps = 200 + rng.below(1500);
    for h in 0..HANDLES {
        w.attach(&mut rng, h);
    }
    // Ended attachments (closed by the test mid-flight need no check of their wire
    // beyond the per-reply checks; the others are checked when they end).
    let mut ended: Vec<(u32, Att)> = Vec::new();
    for _ in 0..steps {
        let h = rng.below(HANDLES as usize) as u32;
        match rng.below(16) {
            0..=4 => w.feed(&mut rng, h),
            5..=7 => {
                let k = rng.below(w.sockets.len());
                w.take(k);
            }
            8..=10 if !w.out.is_empty() => {
                let i = rng.below(w.out.len());
                w.complete(&mut rng, i);
            }
            11..=12 => w.poll(),
            13 if w.live.contains(&h) && rng.one_in(3) => {
                // The peer goes (RST) with messages in flight; the handle comes back.
                w.io.detach(h);
                w.live.remove(&h);
                w.blocked.remove(&h);
                w.atts.remove(&h);
                w.attach(&mut rng, h);
            }
            14 if w.live.contains(&h) => {
                let a = w.atts.get_mut(&h).unwrap();
                a.paused = !a.paused;
                w.io.pause(h, a.paused);
            }
            15 if !w.live.contains(&h) => {
                // Shut down by the I/O side: check what it sent, then a new peer.
                let a = w.atts.remove(&h).unwrap();
                ended.push((h, a));
                w.blocked.remove(&h);
                w.attach(&mut rng, h);
            }
            _ => {}
        }
        w.check_idle_means_done();
        w.check_mem();
    }
    // The end: unpause, feed everything, take and complete everything.
    for h in 0..HANDLES {
        if w.live.contains(&h) {
            w.atts.get_mut(&h).unwrap().paused = false;
            w.io.pause(h, false);
        }
    }
    let mut idle_rounds = 0;
    while idle_rounds < 5 {
        let mut progress = false;
        for h in 0..HANDLES {
            let before = w.atts[&h].rest.len();
            w.feed(&mut rng, h);
            progress |= w.atts[&h].rest.len() != before;
        }
        for k in 0..w.sockets.len() {
            while w.take(k) {
                progress = true;
            }
        }
        while !w.out.is_empty() {
            let i = rng.below(w.out.len());
            w.complete(&mut rng, i);
            progress = true;
        }
        w.poll();
        idle_rounds = if progress { 0 } else { idle_rounds + 1 };
    }
    for (h, a) in &ended {
        w.check_finished(*h, a);
    }
    for h in 0..HANDLES {
        let a = &w.atts[&h];
        if w.live.contains(&h) {
            assert!(
                a.rest.is_empty(),
                "seed {seed}: handle {h} stopped taking input with {} bytes left (blocked {}, in flight {:?}, acts {})",
                a.rest.len(),
                w.blocked.contains(&h),
                w.io.in_flight(h),
                a.acts.len()
            );
        }
        w.check_finished(h, a);
    }
    let f: HashMap<_, _> = w.io.counters().fields().into_iter().collect();
    assert_eq!(
        f["messages"],
        f["replies"] + f["finished"] + f["abandoned"] + f["closed_in_flight"],
        "seed {seed}: {f:?}"
    );
    assert_eq!(f["sequence_errors"], 0, "seed {seed}: {f:?}");
    w.check_mem();
    for h in 0..HANDLES {
        w.io.detach(h);
    }
    assert_eq!(w.io.mem_held(), 0, "seed {seed}: held after every detach");
}

/// The same hostile clients against real worker threads (they reply, finish, drop or
/// reply-and-close after a random pause), so stage-versus-close races happen for real.
fn run_threaded(seed: u64, model: Model, ordering: Ordering) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let sched = SchedConfig {
        model,
        workers: 3,
        queue_capacity: 1 + rng.below(3),
        seed,
    };
    let framer = FramerConfig {
        max_message: MAX_MESSAGE,
        max_in_flight: 1 + rng.below(6),
        ..FramerConfig::default()
    };
    let (io, sockets) = group::<u32, P>(&sched, framer).unwrap();
    let acts = Arc::new(Mutex::new(HashMap::new()));
    let threads: Vec<_> = sockets
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            let acts = Arc::clone(&acts);
            let mut rng =
                Rng(((seed << 8) | (i as u64 + 1)).wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
            std::thread::spawn(move || loop {
                let m = match s.recv_timeout(Duration::from_millis(5)) {
                    Ok(m) => m,
                    Err(msgsched::sched::RecvError::Timeout) => continue,
                    Err(msgsched::sched::RecvError::Disconnected) => return,
                };
                let id = Header::read(&m.body).unwrap().unwrap().id;
                let act = match rng.below(20) {
                    0..=1 => Act::Finish,
                    2..=3 => Act::Abandon,
                    4 => Act::Close,
                    _ => Act::Reply,
                };
                if rng.one_in(4) {
                    std::thread::sleep(Duration::from_micros(rng.below(300) as u64));
                }
                assert!(
                    acts.lock().unwrap().insert(id, act).is_none(),
                    "seed {seed}: {id:#x} taken twice"
                );
                match act {
                    Act::Reply => {
                        let r = reply_for(&m);
                        s.reply(m.origin, r);
                    }
                    Act::Finish => {
                        s.finish(m.origin);
                    }
                    Act::Abandon => drop(m),
                    Act::Close => {
                        let r = reply_for(&m);
                        s.reply_and_close(m.origin, r);
                    }
                }
            })
        })
        .collect();
    let mut w = World {
        io,
        sockets: Vec::new(),
        ordering,
        atts: HashMap::new(),
        live: HashSet::new(),
        next_gen: 0,
        out: Vec::new(),
        blocked: HashSet::new(),
        seed,
        shared_acts: Some(acts),
    };
    const HANDLES: u32 = 5;
    for h in 0..HANDLES {
        w.attach(&mut rng, h);
    }
    let mut ended: Vec<(u32, Att)> = Vec::new();
    for _ in 0..200 + rng.below(800) {
        let h = rng.below(HANDLES as usize) as u32;
        match rng.below(12) {
            0..=5 => w.feed(&mut rng, h),
            6..=8 => w.poll(),
            9 if w.live.contains(&h) && rng.one_in(3) => {
                w.io.detach(h);
                w.live.remove(&h);
                w.blocked.remove(&h);
                w.atts.remove(&h);
                w.attach(&mut rng, h);
            }
            10 if w.live.contains(&h) => {
                let a = w.atts.get_mut(&h).unwrap();
                a.paused = !a.paused;
                w.io.pause(h, a.paused);
            }
            11 if !w.live.contains(&h) => {
                let a = w.atts.remove(&h).unwrap();
                ended.push((h, a));
                w.blocked.remove(&h);
                w.attach(&mut rng, h);
            }
            _ => {}
        }
        if rng.one_in(8) {
            std::thread::yield_now();
        }
        w.sync_acts(&mut ended);
        w.check_idle_means_done();
    }
    for h in 0..HANDLES {
        if w.live.contains(&h) {
            w.atts.get_mut(&h).unwrap().paused = false;
            w.io.pause(h, false);
        }
    }
    // The end: feed everything and wait until every live connection is served or shut.
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        for h in 0..HANDLES {
            w.feed(&mut rng, h);
        }
        w.poll();
        let done = (0..HANDLES).all(|h| {
            !w.live.contains(&h) || (w.atts[&h].rest.is_empty() && w.io.in_flight(h) == Some(0))
        });
        let f: HashMap<_, _> = w.io.counters().fields().into_iter().collect();
        let counted = f["replies"] + f["finished"] + f["abandoned"] + f["closed_in_flight"];
        if done && counted == f["messages"] {
            break;
        }
        assert!(
            Instant::now() < until,
            "seed {seed}: stalled: {f:?} live {:?} in flight {:?}",
            w.live,
            (0..HANDLES).map(|h| w.io.in_flight(h)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    w.sync_acts(&mut ended);
    for (h, a) in &ended {
        w.check_finished(*h, a);
    }
    for h in 0..HANDLES {
        w.check_finished(h, &w.atts[&h]);
    }
    let f: HashMap<_, _> = w.io.counters().fields().into_iter().collect();
    assert_eq!(f["sequence_errors"], 0, "seed {seed}: {f:?}");
    drop(w);
    for t in threads {
        t.join().unwrap();
    }
}

/// `MODEL_SEEDS=n` runs more seeds (the review ran 300 in release).
#[test]
fn hostile_clients_against_worker_threads() {
    let seeds: u64 = std::env::var("MODEL_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    for seed in 1..=seeds {
        for model in [Model::Ms, Model::Cs, Model::Cp] {
            for ordering in [Ordering::Ordered, Ordering::Unordered] {
                run_threaded(seed, model, ordering);
            }
        }
    }
}

/// `MODEL_SEEDS=n` runs more seeds (the review ran 3,000 in release).
#[test]
fn hostile_clients_get_every_reply_once_in_order_and_every_message_is_counted() {
    let seeds: u64 = std::env::var("MODEL_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    for seed in 1..=seeds {
        for model in [Model::Ms, Model::Cs, Model::Cp] {
            for ordering in [Ordering::Ordered, Ordering::Unordered] {
                run(seed, model, ordering);
            }
        }
    }
}
