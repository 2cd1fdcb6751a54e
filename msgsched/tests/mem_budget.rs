//! The I/O side's receive-memory budget (`FramerConfig::mem_budget`, socket.rs "Receive
//! memory"), deterministic and sans-IO: one thread plays TCP (each connection's received
//! segments, in 2 KiB receive buffers), the driver (read while `wants_input`, else
//! `wait_input` until `poll_resumed`) and the workers (`try_recv`, answered at once or
//! not at all). After every read and every step, what the counters say is held equals
//! the sum over the connections and stays within the budget plus one read's growth.
#![cfg(not(loom))]

use msgsched::framer::{FramerConfig, BUF_OVERHEAD, SPILL_CHUNK};
use msgsched::parser::knb::{Header, KnbParser};
use msgsched::parser::{Ordering, ParseErrorKind, Parser};
use msgsched::proto::memcached::McParser;
use msgsched::sched::{Model, SchedConfig};
use msgsched::socket::{group, IoEvent, MsgIo, MsgSocket, PASS_MAX};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::Ordering as AO;
use zbuf::{IoVec, Zbuf, ZbufMut};

/// A full-sized segment's payload.
const MSS: usize = 1448;
/// A receive buffer's object (a 2 KiB mbuf's data room).
const RX_OBJECT: usize = 2048;
/// What can be held past the budget: one read (the buffer read, and a heap chunk a
/// spill allocates for it; a spill's bytes replace the buffers they came from), and
/// what a pass lets one connection read to finish its head message (`PASS_MAX`).
const SLACK: usize = RX_OBJECT + BUF_OVERHEAD + SPILL_CHUNK + BUF_OVERHEAD + PASS_MAX;

fn req(id: u64, len: u32) -> Vec<u8> {
    let mut v = Header { id, len, flags: 0 }.bytes().to_vec();
    v.extend((0..len).map(|i| (i as u8).wrapping_add(id as u8)));
    v
}

/// `bytes` in a receive buffer of [`RX_OBJECT`] bytes, as a NIC delivers a segment.
fn rx(bytes: &[u8]) -> Zbuf {
    let mut m = ZbufMut::heap(0, RX_OBJECT.max(bytes.len()));
    m.extend_from_slice(bytes).unwrap();
    let z = m.freeze();
    assert_eq!(z.object_size(), RX_OBJECT.max(bytes.len()));
    z
}

/// A worker's reply: the message's first 8 bytes (a knb request's id).
fn reply_to(body: &IoVec) -> IoVec {
    let v = body.to_vec();
    IoVec::from(Zbuf::copy_from_slice(&v[..v.len().min(8)]))
}

/// TCP, the driver and the workers of one I/O core.
struct Net<P: Parser> {
    io: MsgIo<u32, P>,
    socks: Vec<MsgSocket<u32>>,
    budget: usize,
    /// What TCP holds for each connection, not read yet.
    tcp: BTreeMap<u32, VecDeque<Zbuf>>,
    /// Connections the driver stopped reading (`wait_input`).
    waiting: HashSet<u32>,
    /// Messages the workers got, per connection: (seq, bytes).
    got: BTreeMap<u32, Vec<(u64, Vec<u8>)>>,
    /// Bytes written to each connection (replies, farewells).
    sent: BTreeMap<u32, Vec<u8>>,
    shut: Vec<(u32, Option<ParseErrorKind>)>,
    /// Workers answer what they get (else they keep it).
    answer: bool,
    kept: Vec<msgsched::socket::Message<u32>>,
}

impl<P: Parser> Net<P> {
    fn new(budget: usize, max_in_flight: usize) -> Self {
        let sched = SchedConfig {
            model: Model::Ms,
            workers: 2,
            queue_capacity: 64,
            seed: 3,
        };
        let framer = FramerConfig {
            max_message: 1 << 20,
            max_in_flight,
            mem_budget: budget,
        };
        let (io, socks) = group::<u32, P>(&sched, framer).unwrap();
        Net {
            io,
            socks,
            budget,
            tcp: BTreeMap::new(),
            waiting: HashSet::new(),
            got: BTreeMap::new(),
            sent: BTreeMap::new(),
            shut: Vec::new(),
            answer: true,
            kept: Vec::new(),
        }
    }

    fn attach(&mut self, conn: u32, parser: P) {
        self.io.attach(conn, parser).unwrap();
        self.tcp.insert(conn, VecDeque::new());
    }

    /// The peer sends `bytes` (in full-sized segments).
    fn send(&mut self, conn: u32, bytes: &[u8]) {
        let q = self.tcp.get_mut(&conn).unwrap();
        q.extend(bytes.chunks(MSS).map(rx));
    }

    fn held(&self) -> usize {
        self.io.mem_held()
    }

    /// The counters agree with the connections, and the budget holds.
    fn check(&self) {
        let sum: usize = self.tcp.keys().filter_map(|&c| self.io.mem(c)).sum();
        assert_eq!(self.held(), sum, "held = the sum over the connections");
        assert!(
            self.held() <= self.budget + SLACK,
            "held {} past the budget {} + one read",
            self.held(),
            self.budget
        );
    }

    /// The driver reads `conn` while it takes input (r2c's `MsgMode::read`).
    fn read(&mut self, conn: u32) {
        if self.waiting.contains(&conn) || !self.io.is_attached(conn) {
            return;
        }
        loop {
            if !self.io.wants_input(conn) {
                self.io.wait_input(conn);
                self.waiting.insert(conn);
                return;
            }
            let Some(z) = self.tcp.get_mut(&conn).and_then(VecDeque::pop_front) else {
                return;
            };
            self.io.on_data(conn, z);
            self.check();
        }
    }

    /// One poll iteration: reads, workers, replies, events, resumed connections.
    fn step(&mut self) {
        let conns: Vec<u32> = self.tcp.keys().copied().collect();
        for c in conns {
            self.read(c);
        }
        for s in &mut self.socks {
            while let Some(m) = s.try_recv() {
                let conn = m.origin.conn();
                self.got
                    .entry(conn)
                    .or_default()
                    .push((m.origin.seq(), m.body.to_vec()));
                if self.answer {
                    let r = reply_to(&m.body);
                    assert!(s.reply(m.origin, r));
                } else {
                    self.kept.push(m);
                }
            }
        }
        let sent = &mut self.sent;
        self.io
            .poll_replies(|c, v| sent.entry(c).or_default().extend(v.to_vec()));
        while let Some(ev) = self.io.poll_event() {
            let IoEvent::Shutdown { conn, reason } = ev else {
                panic!("{ev:?}");
            };
            self.shut.push((conn, reason));
            self.tcp.remove(&conn);
        }
        while let Some(c) = self.io.poll_resumed() {
            self.waiting.remove(&c);
        }
        self.check();
        let published = self.io.counters().mem_held.load(AO::Relaxed) as usize;
        assert_eq!(published, self.held(), "published by poll_replies");
    }

    /// Workers answer what they kept.
    fn answer_kept(&mut self) {
        for m in std::mem::take(&mut self.kept) {
            let w = &mut self.socks[0];
            let r = reply_to(&m.body);
            assert!(w.reply(m.origin, r));
        }
    }

    fn detach_all(&mut self) {
        let conns: Vec<u32> = self.tcp.keys().copied().collect();
        for c in conns {
            self.io.detach(c);
            self.check();
        }
        self.tcp.clear();
    }

    fn killed(&self) -> u64 {
        self.io.counters().parse_errors(ParseErrorKind::Memory)
    }
}

fn knb() -> KnbParser {
    KnbParser::new(Ordering::Ordered)
}

/// 200 connections each send most of a 100 KB message and never the rest (slow loris:
/// 20 MB announced, 12 MB sent): what the I/O side holds never passes the budget (plus
/// one read), the rest waits in TCP, connections are refused and counted; with nothing at
/// the workers the largest holder is shut down, one per poll, each counted; detaching
/// every connection returns held memory to 0.
#[test]
fn partial_messages_cannot_push_held_memory_past_the_budget() {
    let budget = 512 << 10;
    let mut net = Net::new(budget, 4);
    for c in 0..200 {
        net.attach(c, knb());
        net.send(c, &req(u64::from(c), 100_000 - 16)[..60_000]);
    }
    let mut most = 0;
    for _ in 0..40 {
        net.step();
        most = most.max(net.held());
    }
    let c = net.io.counters();
    assert!(most > budget / 2, "the budget was used: {most}");
    assert!(c.mem_high_water.load(AO::Relaxed) as usize <= budget + SLACK);
    assert!(c.mem_refusals.load(AO::Relaxed) >= 100);
    // Pinned receive buffers: a partial message above SPILL_MIN is on the heap, so the
    // bytes still in TCP are the peers' (and luna-stack's bound), not ours.
    let unread: usize = net.tcp.values().map(VecDeque::len).sum();
    assert!(unread > 5_000, "{unread} segments left in TCP");
    // Deadlock: nothing at a worker, every holder partial: shut down one per poll.
    assert_eq!(net.killed(), net.shut.len() as u64);
    assert!(net.killed() >= 30, "{}", net.killed());
    assert!(net
        .shut
        .iter()
        .all(|&(_, r)| r == Some(ParseErrorKind::Memory)));
    net.detach_all();
    assert_eq!(net.held(), 0);
}

/// A connection whose next messages are already whole in what it holds (20 pipelined
/// requests in one segment, 2 at a time at the workers) is served to the end, in
/// order, while ten others hold the budget with partial messages and are refused; only
/// once nothing is at a worker is the largest of them shut down.
#[test]
fn held_whole_messages_are_served_in_order_while_others_hog_the_budget() {
    let budget = 256 << 10;
    let mut net = Net::new(budget, 2);
    let good = 100;
    net.attach(good, knb());
    let stream: Vec<u8> = (0..20).flat_map(|i| req(i, 50)).collect();
    net.send(good, &stream);
    net.answer = false;
    net.step(); // the good connection's first two messages go to the workers, 18 wait
    for c in 0..10 {
        net.attach(c, knb());
        net.send(c, &req(u64::from(c), 200_000)[..100_000]);
    }
    net.step();
    assert!(
        net.held() >= budget,
        "the hogs spent the budget: {}",
        net.held()
    );
    assert!(!net.io.wants_input(good), "no room for anybody's input");
    for _ in 0..30 {
        net.answer_kept();
        net.step();
        if net.got[&good].len() == 20 {
            break;
        }
    }
    // (Two workers take them in either order; the replies below are in request order.)
    let mut got = net.got[&good].clone();
    got.sort();
    assert_eq!(got.len(), 20, "all the good connection's messages");
    for (i, (seq, body)) in got.iter().enumerate() {
        assert_eq!(*seq, i as u64);
        assert_eq!(body, &req(i as u64, 50));
    }
    assert!(
        net.io.counters().mem_refusals.load(AO::Relaxed) > 0,
        "the hogs were refused"
    );
    assert!(
        net.shut.iter().all(|&(c, _)| c != good),
        "the good connection was never shut down"
    );
    net.answer_kept();
    net.step();
    let ids: Vec<u8> = (0..20u64).flat_map(u64::to_le_bytes).collect();
    assert_eq!(net.sent[&good], ids, "20 replies, in request order");
    assert!(net.io.is_attached(good));
    net.detach_all();
    assert_eq!(net.held(), 0);
}

/// Three connections hold partial messages that together spend the budget and nothing
/// is at a worker: exactly the largest holder is shut down (counted `memory_pressure`),
/// the others resume, finish their messages and are answered; held memory returns to 0.
#[test]
fn the_deadlock_breaker_shuts_down_exactly_the_largest_holder() {
    let budget = 256 << 10;
    let mut net = Net::new(budget, 4);
    let small = req(1, 40_000);
    let big = req(2, 400_000);
    let small2 = req(3, 40_000);
    for c in 0..3 {
        net.attach(c, knb());
    }
    net.send(0, &small[..30_000]);
    net.send(1, &big[..300_000]);
    net.send(2, &small2[..30_000]);
    // Reads 0, then 1 until the budget is spent; 2 is refused. The poll at the end of
    // the step finds nothing at a worker: 1 goes.
    net.step();
    assert_eq!(net.shut, vec![(1, Some(ParseErrorKind::Memory))]);
    assert_eq!(net.killed(), 1);
    let fields = net.io.counters().fields();
    assert!(fields.contains(&("memory_pressure", 1)), "{fields:?}");
    assert!(!net.io.is_attached(1));
    // The others finish.
    net.send(0, &small[30_000..]);
    net.send(2, &small2[30_000..]);
    for _ in 0..4 {
        net.step();
    }
    assert_eq!(net.got[&0], vec![(0, small.clone())]);
    assert_eq!(net.got[&2], vec![(0, small2.clone())]);
    assert_eq!(net.sent[&0], small[..8]);
    assert_eq!(net.sent[&2], small2[..8]);
    assert_eq!(net.killed(), 1, "nobody else");
    assert_eq!(net.held(), 0, "nothing held once the messages went");
    net.detach_all();
    assert_eq!(net.held(), 0);
}

/// memcached's answer when it cannot buffer a value: the connection shut down for the
/// budget is told `SERVER_ERROR out of memory storing object` after the replies to its
/// earlier requests, then closed.
#[test]
fn a_memcached_connection_shut_down_for_memory_is_told_so() {
    let budget = 128 << 10;
    let mut net = Net::<McParser>::new(budget, 4);
    net.attach(0, McParser::default());
    let mut stream = b"get a\r\nset k 0 0 500000\r\n".to_vec();
    stream.extend(std::iter::repeat_n(b'v', 200_000));
    net.send(0, &stream);
    for _ in 0..4 {
        net.step();
    }
    assert_eq!(net.shut, vec![(0, Some(ParseErrorKind::Memory))]);
    assert_eq!(
        net.sent[&0], b"get a\r\nSERVER_ERROR out of memory storing object\r\n",
        "the get's reply, then the farewell"
    );
    assert_eq!(net.held(), 0);
}

/// The common case: knb's 4 KiB RPCs (three segments each) read as they arrive hold
/// nothing between reads (each read to the end of a message dispatches it), so a small
/// budget never stops a reader.
#[test]
fn rpcs_read_to_their_end_hold_nothing_between_reads() {
    let mut net = Net::new(16 << 10, 64);
    for c in 0..10 {
        net.attach(c, knb());
        let stream: Vec<u8> = (0..5).flat_map(|i| req(i, 4096 - 16)).collect();
        net.send(c, &stream);
    }
    for _ in 0..4 {
        net.step();
        assert_eq!(net.held(), 0);
    }
    for c in 0..10 {
        assert_eq!(net.got[&c].len(), 5);
    }
    let counters = net.io.counters();
    assert_eq!(counters.mem_refusals.load(AO::Relaxed), 0);
    assert!(counters.mem_high_water.load(AO::Relaxed) <= 3 * 2176);
    assert_eq!(net.killed(), 0);
}

/// The pool-draining attack that remained after the per-connection bounds: many
/// connections each sending a message's first bytes in 1-byte segments, each segment in
/// its own 2 KiB receive buffer (16 of them uncopied per connection: 500 connections
/// took a pool of 8,191). Under a 256 KiB budget the receive buffers the I/O side pins
/// stay within the budget's worth (256 KiB / 2,176 bytes = 120) plus one read, however
/// many connections try; the rest of their bytes wait in TCP.
#[test]
fn tiny_segments_on_many_connections_pin_at_most_the_budgets_worth_of_receive_buffers() {
    let budget = 256 << 10;
    let mut net = Net::new(budget, 4);
    let mut all: Vec<Zbuf> = Vec::new();
    for c in 0..1_000 {
        net.attach(c, knb());
        // Its header, 16 bytes in 16 segments: SPILL_PIECES, so none is copied.
        let head = &req(u64::from(c), 4096 - 16)[..16];
        let segs: Vec<Zbuf> = head.iter().map(|b| rx(std::slice::from_ref(b))).collect();
        all.extend(segs.iter().cloned());
        net.tcp.get_mut(&c).unwrap().extend(segs);
    }
    let cap = budget / (RX_OBJECT + BUF_OVERHEAD) + 1;
    let mut most = 0;
    for _ in 0..5 {
        net.step();
        // Pinned: referenced by the I/O side (TCP's copies are in `net.tcp`).
        let in_tcp: usize = net.tcp.values().map(VecDeque::len).sum();
        let pinned = all.iter().filter(|z| z.ref_count() > 1).count() - in_tcp;
        most = most.max(pinned);
        assert!(pinned <= cap, "{pinned} receive buffers pinned, cap {cap}");
    }
    assert!(most > cap / 2, "the budget was used: {most}");
    assert!(net.io.counters().mem_refusals.load(AO::Relaxed) >= 900);
    net.detach_all();
    assert_eq!(net.held(), 0);
    assert_eq!(all.iter().filter(|z| z.ref_count() > 1).count(), 0);
}

/// Forty clients each send the first two segments of a 4 KiB request: 15 of them fill a
/// 64 KiB budget with partial requests and the rest are refused; then every client sends
/// its last segment, which the budget keeps in TCP. Nothing is at a worker, so the budget
/// is deadlocked, but the rest of each request is already in TCP: the waiter lacking the
/// fewest bytes gets a pass, finishes its request, and the line moves. Every request is
/// served, nobody is shut down.
#[test]
fn a_deadlock_of_small_requests_whose_rest_waits_in_tcp_ends_without_a_shutdown() {
    let budget = 64 << 10;
    let mut net = Net::new(budget, 4);
    let reqs: Vec<Vec<u8>> = (0..40).map(|c| req(c, 4096 - 16)).collect();
    for c in 0..40u32 {
        net.attach(c, knb());
        net.send(c, &reqs[c as usize][..2 * MSS]);
    }
    net.step();
    assert!(net.held() + 2 * (RX_OBJECT + BUF_OVERHEAD) >= budget);
    assert!(net.io.counters().mem_refusals.load(AO::Relaxed) > 20);
    for c in 0..40u32 {
        net.send(c, &reqs[c as usize][2 * MSS..]);
    }
    for _ in 0..200 {
        net.step();
        if net.got.values().map(Vec::len).sum::<usize>() == 40 {
            break;
        }
    }
    for c in 0..40u32 {
        assert_eq!(net.got[&c], vec![(0, reqs[c as usize].clone())], "{c}");
    }
    assert_eq!(net.killed(), 0, "no casualty");
    assert!(net.shut.is_empty());
    net.step();
    assert_eq!(net.held(), 0);
}
