//! Message sockets end to end in one process: an I/O thread feeds connections' bytes into
//! `MsgIo`, worker threads answer through `MsgSocket`s, and the replies that come back
//! are checked for order, completeness and the counted reasons of bad input.
#![cfg(not(loom))]

use msgsched::framer::FramerConfig;
use msgsched::parser::knb::{Header, KnbParser, HDR_LEN, RESPONSE};
use msgsched::parser::{Ordering, ParseErrorKind};
use msgsched::sched::{Model, RecvError, SchedConfig};
use msgsched::socket::{group, IoEvent, Message, MsgIo, MsgSocket};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering as AO};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zbuf::{IoVec, Zbuf};

type Io = MsgIo<u32, KnbParser>;

fn req(id: u64, len: u32) -> Vec<u8> {
    let mut v = Header { id, len, flags: 0 }.bytes().to_vec();
    v.extend((0..len).map(|i| (i as u8).wrapping_add(id as u8)));
    v
}

fn cfg(model: Model, workers: usize) -> SchedConfig {
    SchedConfig {
        model,
        workers,
        queue_capacity: 64,
        seed: 7,
    }
}

/// The reply to a message: its header with RESPONSE set, then its payload (zero copy).
fn echo(m: &Message<u32>) -> IoVec {
    let h = Header::read(&m.body).unwrap().unwrap();
    let mut v = IoVec::new();
    v.push(Zbuf::copy_from_slice(
        &Header {
            flags: RESPONSE,
            ..h
        }
        .bytes(),
    ));
    v.append(m.body.slice(HDR_LEN..));
    v
}

fn id_of(m: &Message<u32>) -> u64 {
    Header::read(&m.body).unwrap().unwrap().id
}

/// Worker threads running `handle` until the I/O side is dropped.
fn spawn_workers(
    sockets: Vec<MsgSocket<u32>>,
    handle: impl Fn(&mut MsgSocket<u32>, Message<u32>) + Send + Sync + 'static,
) -> Vec<std::thread::JoinHandle<()>> {
    let handle = Arc::new(handle);
    sockets
        .into_iter()
        .map(|mut s| {
            let handle = Arc::clone(&handle);
            std::thread::spawn(move || loop {
                match s.recv_timeout(Duration::from_millis(50)) {
                    Ok(m) => handle(&mut s, m),
                    Err(RecvError::Timeout) => {}
                    Err(RecvError::Disconnected) => return,
                }
            })
        })
        .collect()
}

/// Bytes still to deliver per connection.
type Pending = HashMap<u32, Vec<u8>>;

/// Drives `io` (feeding `pending` in 1,000-byte pieces as it asks for input) until
/// `done(replies)`, with a 30 s guard; returns the reply ids per connection in wire
/// order and the events.
fn drive(
    io: &mut Io,
    mut pending: Pending,
    mut done: impl FnMut(&HashMap<u32, Vec<u64>>) -> bool,
) -> (HashMap<u32, Vec<u64>>, Vec<IoEvent<u32>>) {
    let mut replies: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut events = Vec::new();
    let end = Instant::now() + Duration::from_secs(30);
    while !done(&replies) {
        assert!(
            Instant::now() < end,
            "stalled: {replies:?} {:?}",
            io.counters().fields()
        );
        for (&conn, bytes) in pending.iter_mut() {
            while !bytes.is_empty() && io.wants_input(conn) {
                let n = 1000.min(bytes.len());
                let rest = bytes.split_off(n);
                io.on_data(conn, Zbuf::copy_from_slice(bytes));
                *bytes = rest;
            }
        }
        io.poll_replies(|c, r| {
            let h = Header::read(&r).unwrap().unwrap();
            assert_eq!(h.flags, RESPONSE);
            assert_eq!(r.len(), HDR_LEN + h.len as usize);
            replies.entry(c).or_default().push(h.id);
        });
        events.extend(std::iter::from_fn(|| io.poll_event()));
        std::thread::yield_now();
    }
    (replies, events)
}

fn stream(ids: std::ops::Range<u64>) -> Vec<u8> {
    ids.flat_map(|i| req(i, (i * 37 % 3000) as u32)).collect()
}

fn count(r: &HashMap<u32, Vec<u64>>, c: u32) -> usize {
    r.get(&c).map_or(0, Vec::len)
}

/// One slow request (id 0) among 40 on one connection, four workers: the reply ids in
/// wire order.
fn one_slow_first(ordering: Ordering, model: Model) -> Vec<u64> {
    let (mut io, sockets) =
        group::<u32, KnbParser>(&cfg(model, 4), FramerConfig::default()).unwrap();
    io.attach(1, KnbParser::new(ordering)).unwrap();
    let workers = spawn_workers(sockets, |s, m| {
        if id_of(&m) == 0 {
            std::thread::sleep(Duration::from_millis(100));
        }
        let r = echo(&m);
        assert!(s.reply(m.origin, r));
    });
    let (mut replies, _) = drive(&mut io, Pending::from([(1, stream(0..40))]), |r| {
        count(r, 1) == 40
    });
    assert_eq!(
        io.counters()
            .fields()
            .iter()
            .find(|f| f.0 == "replies")
            .unwrap()
            .1,
        40
    );
    drop(io);
    for w in workers {
        w.join().unwrap();
    }
    replies.remove(&1).unwrap()
}

#[test]
fn ordered_replies_leave_in_request_order_when_workers_finish_out_of_order() {
    for model in [Model::Ms, Model::Cp] {
        assert_eq!(
            one_slow_first(Ordering::Ordered, model),
            (0..40).collect::<Vec<_>>()
        );
    }
}

#[test]
fn unordered_replies_leave_as_they_complete() {
    let got = one_slow_first(Ordering::Unordered, Model::Ms);
    let mut sorted = got.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..40).collect::<Vec<_>>(),
        "each reply exactly once"
    );
    // The 100 ms request does not hold back the 39 others (other workers serve them).
    assert_ne!(got[0], 0, "the slow reply went first: {got:?}");
}

#[test]
fn a_parse_error_closes_only_its_connection_with_a_counted_reason() {
    let cap = FramerConfig {
        max_message: 100_000,
        ..FramerConfig::default()
    };
    let (mut io, sockets) = group::<u32, KnbParser>(&cfg(Model::Ms, 2), cap).unwrap();
    io.attach(1, KnbParser::new(Ordering::Ordered)).unwrap();
    io.attach(2, KnbParser::new(Ordering::Ordered)).unwrap();
    io.attach(3, KnbParser::new(Ordering::Ordered)).unwrap();
    let workers = spawn_workers(sockets, |s, m| {
        let r = echo(&m);
        s.reply(m.origin, r);
    });
    let mut garbage = req(0, 10);
    garbage.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
    let mut huge = stream(0..3);
    huge.extend(
        Header {
            id: 3,
            len: 200_000,
            flags: 0,
        }
        .bytes(),
    );
    let pending = Pending::from([(1, garbage), (2, stream(0..50)), (3, huge)]);
    // A broken stream is shut down once the requests before the bad one are answered
    // (they were valid): their replies go out, then FIN; nothing is dropped.
    let (replies, closed) = drive(&mut io, pending, |r| {
        count(r, 2) == 50 && count(r, 1) == 1 && count(r, 3) == 3
    });
    let end = Instant::now() + Duration::from_secs(30);
    let mut closed = closed;
    while closed.len() < 2 {
        assert!(Instant::now() < end, "{closed:?}");
        io.poll_replies(|c, _| panic!("a reply after the last on {c}"));
        closed.extend(std::iter::from_fn(|| io.poll_event()));
        std::thread::yield_now();
    }
    assert_eq!(replies[&2], (0..50).collect::<Vec<_>>());
    assert_eq!(replies[&1], vec![0]);
    assert_eq!(replies[&3], vec![0, 1, 2]);
    assert!(closed.contains(&IoEvent::Shutdown {
        conn: 1,
        reason: Some(ParseErrorKind::Malformed)
    }));
    assert!(closed.contains(&IoEvent::Shutdown {
        conn: 3,
        reason: Some(ParseErrorKind::TooLarge)
    }));
    assert_eq!(io.counters().closed_in_flight.load(AO::Relaxed), 0);
    assert_eq!(io.counters().parse_errors(ParseErrorKind::Malformed), 1);
    assert_eq!(io.counters().parse_errors(ParseErrorKind::TooLarge), 1);
    assert!(!io.is_attached(1) && !io.is_attached(3) && io.is_attached(2));
    drop(io);
    for w in workers {
        w.join().unwrap();
    }
}

#[test]
fn a_connection_closing_with_messages_in_flight_costs_no_other_connection_anything() {
    let (mut io, sockets) =
        group::<u32, KnbParser>(&cfg(Model::Ms, 2), FramerConfig::default()).unwrap();
    io.attach(1, KnbParser::new(Ordering::Ordered)).unwrap();
    io.attach(2, KnbParser::new(Ordering::Ordered)).unwrap();
    let gate = Arc::new(AtomicBool::new(false));
    let g = Arc::clone(&gate);
    let workers = spawn_workers(sockets, move |s, m| {
        // Connection 1's requests wait until it is detached.
        while m.origin.conn() == 1 && !g.load(AO::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(m.origin.is_closed(), m.origin.conn() == 1);
        let r = echo(&m);
        s.reply(m.origin, r);
    });
    for b in stream(0..2).chunks(1000) {
        io.on_data(1, Zbuf::copy_from_slice(b));
    }
    let end = Instant::now() + Duration::from_secs(10);
    while io.counters().messages.load(AO::Relaxed) < 2 {
        assert!(Instant::now() < end);
        std::thread::yield_now();
    }
    assert_eq!(io.detach(1), 2, "both were in flight");
    gate.store(true, AO::Release);
    let (replies, _) = drive(&mut io, Pending::from([(2, stream(0..30))]), |r| {
        count(r, 2) == 30
    });
    assert_eq!(replies[&2], (0..30).collect::<Vec<_>>());
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        io.poll_replies(|c, _| panic!("a reply for detached connection {c}"));
        let closed = io
            .counters()
            .fields()
            .iter()
            .find(|f| f.0 == "closed_in_flight")
            .unwrap()
            .1;
        if closed == 2 {
            break;
        }
        assert!(Instant::now() < end, "closed_in_flight {closed}");
        std::thread::yield_now();
    }
    drop(io);
    for w in workers {
        w.join().unwrap();
    }
}

#[test]
fn a_worker_that_stops_taking_messages_stalls_no_connection_under_ms() {
    let (mut io, mut sockets) =
        group::<u32, KnbParser>(&cfg(Model::Ms, 3), FramerConfig::default()).unwrap();
    // Worker 2 never calls recv; its queue is stolen by the others.
    let stuck = sockets.pop().unwrap();
    let workers = spawn_workers(sockets, |s, m| {
        let r = echo(&m);
        s.reply(m.origin, r);
    });
    let mut pending = Pending::new();
    for c in 0..8 {
        io.attach(c, KnbParser::new(Ordering::Ordered)).unwrap();
        pending.insert(c, stream(0..25));
    }
    let (replies, _) = drive(&mut io, pending, |r| (0..8).all(|c| count(r, c) == 25));
    for c in 0..8 {
        assert_eq!(replies[&c], (0..25).collect::<Vec<_>>());
    }
    let st = io.sched_stats();
    assert_eq!(
        st.workers[2].taken, 0,
        "the stuck worker took nothing: {st:?}"
    );
    drop(stuck);
    drop(io);
    for w in workers {
        w.join().unwrap();
    }
}

#[test]
fn an_unanswered_message_completes_without_a_reply_and_order_goes_on() {
    let (mut io, sockets) =
        group::<u32, KnbParser>(&cfg(Model::Ms, 2), FramerConfig::default()).unwrap();
    io.attach(1, KnbParser::new(Ordering::Ordered)).unwrap();
    let workers = spawn_workers(sockets, |s, m| {
        match id_of(&m) {
            // A handler that bails out: the origin is dropped unanswered.
            3 => drop(m),
            // A message without a reply.
            5 => {
                s.finish(m.origin);
            }
            _ => {
                let r = echo(&m);
                s.reply(m.origin, r);
            }
        }
    });
    let (replies, _) = drive(&mut io, Pending::from([(1, stream(0..10))]), |r| {
        count(r, 1) == 8
    });
    assert_eq!(replies[&1], vec![0, 1, 2, 4, 6, 7, 8, 9]);
    let f: HashMap<_, _> = io.counters().fields().into_iter().collect();
    assert_eq!((f["abandoned"], f["finished"], f["replies"]), (1, 1, 8));
    drop(io);
    for w in workers {
        w.join().unwrap();
    }
}

#[test]
fn the_in_flight_cap_pauses_reading_and_resumes_after_replies() {
    let cap = FramerConfig {
        max_message: 4096,
        max_in_flight: 2,
        ..FramerConfig::default()
    };
    let (mut io, sockets) = group::<u32, KnbParser>(&cfg(Model::Ms, 2), cap).unwrap();
    io.attach(1, KnbParser::new(Ordering::Ordered)).unwrap();
    let gate = Arc::new(AtomicBool::new(false));
    let g = Arc::clone(&gate);
    let workers = spawn_workers(sockets, move |s, m| {
        while !g.load(AO::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let r = echo(&m);
        s.reply(m.origin, r);
    });
    let small: Vec<u8> = (0..100).flat_map(|i| req(i, 100)).collect();
    let mut at = 0;
    while at < small.len() && io.wants_input(1) {
        io.on_data(1, Zbuf::copy_from_slice(&small[at..at + 116]));
        at += 116;
    }
    assert!(at < small.len(), "reading paused before the stream ended");
    assert!(
        at <= 2 * 116 + 4096 + 116,
        "at most the cap plus a message's worth: {at}"
    );
    gate.store(true, AO::Release);
    let (replies, _) = drive(&mut io, Pending::from([(1, small[at..].to_vec())]), |r| {
        count(r, 1) == 100
    });
    assert_eq!(replies[&1], (0..100).collect::<Vec<_>>());
    drop(io);
    for w in workers {
        w.join().unwrap();
    }
}

/// `reply_and_close` (memcached's `quit`): the replies before it and its own go out in
/// order, then the connection is shut down gracefully; replies to later messages are
/// dropped and counted, and another connection is unaffected.
#[test]
fn reply_and_close_shuts_down_after_the_earlier_replies() {
    // CS too: the messages held behind the closing one are dropped and counted.
    for model in [Model::Ms, Model::Cp, Model::Cs] {
        let (mut io, sockets) =
            group::<u32, KnbParser>(&cfg(model, 4), FramerConfig::default()).unwrap();
        io.attach(1, KnbParser::new(Ordering::Ordered)).unwrap();
        io.attach(2, KnbParser::new(Ordering::Ordered)).unwrap();
        let workers = spawn_workers(sockets, |s, m| {
            let id = id_of(&m);
            if id == 0 {
                // Later messages finish first and wait in the reorder slot.
                std::thread::sleep(Duration::from_millis(50));
            }
            let r = echo(&m);
            if id == 5 && m.origin.conn() == 1 {
                assert!(s.reply_and_close(m.origin, r));
            } else {
                s.reply(m.origin, r);
            }
        });
        let (replies, events) = drive(
            &mut io,
            Pending::from([(1, stream(0..20)), (2, stream(100..120))]),
            |r| count(r, 1) == 6 && count(r, 2) == 20,
        );
        assert_eq!(replies[&1], (0..6).collect::<Vec<_>>(), "{model:?}");
        assert_eq!(replies[&2], (100..120).collect::<Vec<_>>(), "{model:?}");
        assert_eq!(
            events,
            vec![IoEvent::Shutdown {
                conn: 1,
                reason: None
            }],
            "{model:?}"
        );
        assert!(!io.is_attached(1) && io.is_attached(2));
        let end = Instant::now() + Duration::from_secs(30);
        while io.counters().closed_in_flight.load(AO::Relaxed) < 14 {
            assert!(Instant::now() < end, "{:?}", io.counters().fields());
            io.poll_replies(|c, _| panic!("a reply after the close on {c}"));
            std::thread::yield_now();
        }
        assert_eq!(io.counters().closed_in_flight.load(AO::Relaxed), 14);
        drop(io);
        for w in workers {
            w.join().unwrap();
        }
    }
}

/// `pause` (a peer that does not read its replies): nothing more is framed or dispatched
/// while paused, the bytes stay buffered, and resuming serves them all in order.
#[test]
fn a_paused_connection_takes_no_messages_until_resumed() {
    let (mut io, sockets) =
        group::<u32, KnbParser>(&cfg(Model::Ms, 2), FramerConfig::default()).unwrap();
    io.attach(1, KnbParser::new(Ordering::Ordered)).unwrap();
    io.attach(2, KnbParser::new(Ordering::Ordered)).unwrap();
    let workers = spawn_workers(sockets, |s, m| {
        let r = echo(&m);
        s.reply(m.origin, r);
    });
    io.pause(1, true);
    assert!(!io.wants_input(1) && io.wants_input(2));
    io.on_data(1, Zbuf::copy_from_slice(&stream(0..10)));
    let (replies, _) = drive(&mut io, Pending::from([(2, stream(100..110))]), |r| {
        count(r, 2) == 10
    });
    assert_eq!(count(&replies, 1), 0);
    assert_eq!(io.counters().messages.load(AO::Relaxed), 10);
    io.pause(1, false);
    let (replies, _) = drive(&mut io, Pending::new(), |r| count(r, 1) == 10);
    assert_eq!(replies[&1], (0..10).collect::<Vec<_>>());
    io.pause(99, true); // not attached: ignored
    drop(io);
    for w in workers {
        w.join().unwrap();
    }
}

fn fields(io: &Io) -> HashMap<&'static str, u64> {
    io.counters().fields().into_iter().collect()
}

/// Every message ends in exactly one of `replies`, `finished`, `abandoned` and
/// `closed_in_flight`, also when its connection goes while it is at a worker: finished
/// and abandoned ones before the detach, after it, and after a reply that closes.
#[test]
fn every_message_is_counted_once_when_its_connection_closes() {
    let (mut io, mut sockets) =
        group::<u32, KnbParser>(&cfg(Model::Ms, 1), FramerConfig::default()).unwrap();
    let mut s = sockets.pop().unwrap();
    io.attach(1, KnbParser::new(Ordering::Ordered)).unwrap();
    io.attach(2, KnbParser::new(Ordering::Ordered)).unwrap();
    io.on_data(1, Zbuf::copy_from_slice(&stream(0..5)));
    io.on_data(2, Zbuf::copy_from_slice(&stream(0..3)));
    let mut m: HashMap<(u32, u64), Message<u32>> = HashMap::new();
    while let Some(x) = s.try_recv() {
        m.insert((x.origin.conn(), id_of(&x)), x);
    }
    assert_eq!(m.len(), 8);
    let mut take = |c, i| m.remove(&(c, i)).unwrap();
    // Connection 1: 0 finished, 1 abandoned, 2 answered (all staged, not yet drained),
    // then it goes; 3 is finished and 4 abandoned after it went.
    s.finish(take(1, 0).origin);
    drop(take(1, 1));
    let r = take(1, 2);
    let body = echo(&r);
    s.reply(r.origin, body);
    io.detach(1);
    s.finish(take(1, 3).origin);
    drop(take(1, 4));
    // Connection 2: 0 closes it, then 1 is finished and 2 abandoned.
    let r = take(2, 0);
    let body = echo(&r);
    assert!(s.reply_and_close(r.origin, body));
    s.finish(take(2, 1).origin);
    drop(take(2, 2));
    let mut sent = 0;
    io.poll_replies(|c, _| {
        assert_eq!(c, 2);
        sent += 1;
    });
    assert_eq!(sent, 1);
    let f = fields(&io);
    assert_eq!(f["messages"], 8, "{f:?}");
    assert_eq!(
        f["replies"] + f["finished"] + f["abandoned"] + f["closed_in_flight"],
        8,
        "{f:?}"
    );
    assert_eq!(f["replies"], 1, "{f:?}");
    assert_eq!(f["sequence_errors"], 0, "{f:?}");
}

/// CS: a connection detached with one message at a worker and more held behind it in
/// the dispatcher: the held ones are dropped and counted, none reaches a worker, and
/// nothing of the connection stays in the dispatcher.
#[test]
fn cs_a_detached_connections_held_messages_are_dropped_and_counted() {
    let (mut io, mut sockets) =
        group::<u32, KnbParser>(&cfg(Model::Cs, 1), FramerConfig::default()).unwrap();
    let mut s = sockets.pop().unwrap();
    io.attach(1, KnbParser::new(Ordering::Ordered)).unwrap();
    io.on_data(1, Zbuf::copy_from_slice(&stream(0..4)));
    let m0 = s.try_recv().unwrap();
    assert!(
        s.try_recv().is_none(),
        "CS: one message of a key in service"
    );
    assert_eq!(io.detach(1), 4);
    let body = echo(&m0);
    assert!(!s.reply(m0.origin, body));
    io.poll_replies(|c, _| panic!("a reply for detached connection {c}"));
    // The in-service completion never reaches the dispatcher (its connection has gone):
    // whatever was held behind it must not wait for it forever.
    let mut late = 0;
    while let Some(m) = s.try_recv() {
        assert!(m.origin.is_closed());
        late += 1;
        drop(m);
        io.poll_replies(|c, _| panic!("a reply for detached connection {c}"));
    }
    let f = fields(&io);
    assert_eq!(
        (f["messages"], f["closed_in_flight"]),
        (4, 4),
        "held messages dropped and counted (late {late}): {f:?}"
    );
    assert_eq!(f["abandoned"], 0, "{f:?}");
}

/// ABA on the connection handle: a connection detached with messages at a worker, and
/// its handle attached again for a new connection before their replies come back. The
/// late replies are dropped and counted; the new connection gets only its own, in its
/// own order (its sequence numbers start again at 0, as the old ones did).
#[test]
fn a_reused_handle_never_gets_the_old_connections_late_replies() {
    let (mut io, mut sockets) =
        group::<u32, KnbParser>(&cfg(Model::Ms, 1), FramerConfig::default()).unwrap();
    let mut s = sockets.pop().unwrap();
    io.attach(1, KnbParser::new(Ordering::Ordered)).unwrap();
    io.on_data(1, Zbuf::copy_from_slice(&stream(0..2)));
    let old: Vec<_> = std::iter::from_fn(|| s.try_recv()).collect();
    assert_eq!(old.len(), 2);
    // The first is answered before the close (staged, not yet drained).
    let mut old = old.into_iter();
    let m = old.next().unwrap();
    let r = echo(&m);
    s.reply(m.origin, r);
    io.detach(1);
    io.attach(1, KnbParser::new(Ordering::Ordered)).unwrap();
    io.on_data(1, Zbuf::copy_from_slice(&stream(100..102)));
    let new: Vec<_> = std::iter::from_fn(|| s.try_recv()).collect();
    assert_eq!(
        new.iter().map(|m| m.origin.seq()).collect::<Vec<_>>(),
        [0, 1]
    );
    // New connection's second, then the old one's second, then the new first.
    let mut new = new.into_iter();
    let (n0, n1) = (new.next().unwrap(), new.next().unwrap());
    let r = echo(&n1);
    assert!(s.reply(n1.origin, r));
    let m = old.next().unwrap();
    assert!(m.origin.is_closed());
    let r = echo(&m);
    assert!(!s.reply(m.origin, r));
    let mut got = Vec::new();
    io.poll_replies(|c, r| got.push((c, Header::read(&r).unwrap().unwrap().id)));
    assert!(
        got.is_empty(),
        "the new second waits for the new first: {got:?}"
    );
    let r = echo(&n0);
    assert!(s.reply(n0.origin, r));
    io.poll_replies(|c, r| got.push((c, Header::read(&r).unwrap().unwrap().id)));
    assert_eq!(got, [(1, 100), (1, 101)]);
    let f = fields(&io);
    assert_eq!(
        (
            f["messages"],
            f["replies"],
            f["closed_in_flight"],
            f["sequence_errors"]
        ),
        (4, 2, 2, 0),
        "{f:?}"
    );
}

/// A connection detached while the reorder slot holds replies that finished before an
/// earlier one (TCP closed, or a reply that closes released ahead of them): those held
/// replies are dropped with the slot and must be counted (`closed_in_flight`), so that
/// `messages = replies + finished + abandoned + closed_in_flight` still holds.
#[test]
fn replies_held_in_the_reorder_slot_are_counted_when_their_connection_closes() {
    let (mut io, mut sockets) =
        group::<u32, KnbParser>(&cfg(Model::Ms, 1), FramerConfig::default()).unwrap();
    let mut s = sockets.pop().unwrap();
    // Connection 1 is closed by TCP; connection 2 by a reply that closes.
    io.attach(1, KnbParser::new(Ordering::Ordered)).unwrap();
    io.attach(2, KnbParser::new(Ordering::Ordered)).unwrap();
    io.on_data(1, Zbuf::copy_from_slice(&stream(0..3)));
    io.on_data(2, Zbuf::copy_from_slice(&stream(0..4)));
    let mut m: HashMap<(u32, u64), Message<u32>> = HashMap::new();
    while let Some(x) = s.try_recv() {
        m.insert((x.origin.conn(), id_of(&x)), x);
    }
    assert_eq!(m.len(), 7);
    let mut take = |c, i| m.remove(&(c, i)).unwrap();
    let answer = |s: &mut MsgSocket<u32>, x: Message<u32>| {
        let r = echo(&x);
        assert!(s.reply(x.origin, r));
    };
    // 1: 1 and 2 finish before 0 and wait in the slot; then the connection goes.
    answer(&mut s, take(1, 1));
    answer(&mut s, take(1, 2));
    // 2: 3 finishes and waits in the slot behind 2; 0 answers and 1 closes.
    answer(&mut s, take(2, 3));
    io.poll_replies(|c, _| panic!("nothing may leave before 0 ({c})"));
    answer(&mut s, take(2, 0));
    let q = take(2, 1);
    let r = echo(&q);
    assert!(s.reply_and_close(q.origin, r));
    let mut sent = 0;
    io.poll_replies(|c, _| {
        assert_eq!(c, 2);
        sent += 1;
    });
    assert_eq!(sent, 2);
    assert!(!io.is_attached(2));
    io.detach(1);
    // The slow ones come back after their connections have gone.
    answer_late(&mut s, take(1, 0));
    answer_late(&mut s, take(2, 2));
    io.poll_replies(|c, _| panic!("a reply for detached connection {c}"));
    let f = fields(&io);
    assert_eq!(f["messages"], 7, "{f:?}");
    assert_eq!(f["replies"], 2, "{f:?}");
    assert_eq!(
        f["replies"] + f["finished"] + f["abandoned"] + f["closed_in_flight"],
        7,
        "every message counted once: {f:?}"
    );
    assert_eq!(f["sequence_errors"], 0, "{f:?}");
}

fn answer_late(s: &mut MsgSocket<u32>, x: Message<u32>) {
    assert!(x.origin.is_closed());
    let r = echo(&x);
    assert!(!s.reply(x.origin, r));
}
