//! SessionIo driving HTTP/2 sessions with real worker threads (no network): one
//! connection's streams are answered by several workers under MS, control frames are
//! answered without a worker, a GOAWAY-ending session is a Shutdown event, and a
//! connection detached with requests at workers counts their replies as closed in flight.

use msgsched::framer::FramerConfig;
use msgsched::proto::h2::frame::{self, flag, kind, ErrorCode, FrameHeader, HEADER_LEN, PREFACE};
use msgsched::proto::h2::hpack::{Decoder, Encoder, HpackLimits};
use msgsched::proto::h2::{H2Config, H2Session, Request, Response};
use msgsched::proto::io::session_group;
use msgsched::sched::{Model, RecvError, SchedConfig};
use msgsched::socket::IoEvent;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zbuf::{IoVec, Zbuf};

fn get(enc: &mut Encoder, out: &mut Vec<u8>, id: u32, path: &str) {
    let mut b = Vec::new();
    enc.encode(
        [
            (&b":method"[..], &b"GET"[..]),
            (b":scheme", b"http"),
            (b":path", path.as_bytes()),
            (b":authority", b"t"),
        ],
        &mut b,
    );
    frame::put(
        out,
        kind::HEADERS,
        flag::END_HEADERS | flag::END_STREAM,
        id,
        &b,
    );
}

fn frames(bytes: &[u8]) -> Vec<(FrameHeader, Vec<u8>)> {
    let mut v = Vec::new();
    let mut at = 0;
    while at + HEADER_LEN <= bytes.len() {
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&bytes[at..at + HEADER_LEN]);
        let f = FrameHeader::parse(&h);
        let end = at + HEADER_LEN + f.len as usize;
        assert!(end <= bytes.len(), "whole frames only");
        v.push((f, bytes[at + HEADER_LEN..end].to_vec()));
        at = end;
    }
    v
}

#[test]
fn one_connections_streams_spread_over_workers_and_come_back_as_frames() {
    let sched = SchedConfig {
        model: Model::Ms,
        workers: 4,
        queue_capacity: 64,
        seed: 7,
    };
    let (mut io, sockets) = session_group::<u32>(&sched, FramerConfig::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(Mutex::new(HashSet::new()));
    let handles: Vec<_> = sockets
        .into_iter()
        .map(|mut s| {
            let (stop, served) = (Arc::clone(&stop), Arc::clone(&served));
            std::thread::spawn(move || loop {
                match s.recv_timeout(Duration::from_millis(5)) {
                    Ok(m) => {
                        let r = Request::parse(&m.body).unwrap();
                        // Some requests take longer, so replies complete out of order.
                        if r.stream % 5 == 1 {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        served.lock().unwrap().insert(s.index());
                        let body = IoVec::from(Zbuf::from_vec(r.path().to_vec()));
                        s.reply(m.origin, Response::new(200).body(body).into_iovec());
                    }
                    Err(RecvError::Timeout) if stop.load(Ordering::Relaxed) => return,
                    Err(RecvError::Timeout) => {}
                    Err(RecvError::Disconnected) => return,
                }
            })
        })
        .collect();
    assert!(io.attach(1, Box::new(H2Session::new(H2Config::default()))));
    assert!(!io.attach(1, Box::new(H2Session::new(H2Config::default()))));
    let mut enc = Encoder::new();
    let mut input = PREFACE.to_vec();
    frame::settings(&mut input, &[]);
    frame::put(&mut input, kind::PING, 0, 0, b"pingpong");
    const N: u32 = 60;
    for i in 0..N {
        get(&mut enc, &mut input, 1 + 2 * i, &format!("/p{i}"));
    }
    // Cut anywhere: the session does not care where TCP segments end.
    for piece in input.chunks(37) {
        assert!(io.wants_input(1));
        io.on_data(1, Zbuf::copy_from_slice(piece));
    }
    let mut out = Vec::new();
    let end = Instant::now() + Duration::from_secs(30);
    let mut dec = Decoder::new(HpackLimits::default());
    let mut bodies: HashMap<u32, Vec<u8>> = HashMap::new();
    let mut ended = 0;
    while ended < N {
        assert!(Instant::now() < end, "replies did not arrive: {ended}");
        io.poll_replies(|c, b| {
            assert_eq!(c, 1);
            out.extend(b.to_vec());
        });
        let fs = frames(&out);
        ended = 0;
        bodies.clear();
        for (h, p) in &fs {
            if h.kind == kind::DATA {
                bodies.entry(h.stream).or_default().extend(p);
                ended += u32::from(h.flags & flag::END_STREAM != 0);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let fs = frames(&out);
    assert_eq!(fs[0].0.kind, kind::SETTINGS, "our SETTINGS first");
    assert!(fs
        .iter()
        .any(|(h, p)| h.kind == kind::PING && h.flags == flag::ACK && p == b"pingpong"));
    for (h, p) in &fs {
        if h.kind == kind::HEADERS {
            let list = dec.decode(p).unwrap();
            assert_eq!(list[0], (b":status".to_vec(), b"200".to_vec()));
        }
    }
    for i in 0..N {
        assert_eq!(bodies[&(1 + 2 * i)], format!("/p{i}").into_bytes());
    }
    assert!(
        served.lock().unwrap().len() > 1,
        "MS spread one connection's streams"
    );
    let c = io.counters();
    assert_eq!(c.messages.load(Ordering::Relaxed), u64::from(N));
    assert_eq!(c.replies.load(Ordering::Relaxed), u64::from(N));
    assert_eq!(io.in_flight(1), Some(0));

    // The peer's GOAWAY with every stream answered: a clean Shutdown.
    let mut g = Vec::new();
    frame::goaway(&mut g, 0, ErrorCode::NoError, b"");
    io.on_data(1, Zbuf::from_vec(g));
    io.poll_replies(|_, _| {});
    assert_eq!(
        io.poll_event(),
        Some(IoEvent::Shutdown {
            conn: 1,
            reason: None
        })
    );
    assert!(!io.is_attached(1));

    // A protocol error: GOAWAY sent, then a Shutdown with the counted reason.
    assert!(io.attach(2, Box::new(H2Session::new(H2Config::default()))));
    io.on_data(2, Zbuf::copy_from_slice(b"GET / HTTP/1.1\r\n\r\n"));
    let mut bytes = Vec::new();
    io.poll_replies(|_, b| bytes.extend(b.to_vec()));
    let fs = frames(&bytes);
    assert_eq!(fs.last().unwrap().0.kind, kind::GOAWAY);
    assert!(matches!(
        io.poll_event(),
        Some(IoEvent::Shutdown {
            conn: 2,
            reason: Some(_)
        })
    ));

    // Detached with a request at a worker: its reply is counted, not sent.
    assert!(io.attach(3, Box::new(H2Session::new(H2Config::default()))));
    let mut input = PREFACE.to_vec();
    frame::settings(&mut input, &[]);
    get(&mut Encoder::new(), &mut input, 1, "/late");
    io.on_data(3, Zbuf::from_vec(input));
    io.detach(3);
    let end = Instant::now() + Duration::from_secs(10);
    while io.counters().closed_in_flight.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < end, "the late reply was never counted");
        io.poll_replies(|c, _| assert_ne!(c, 3, "nothing is sent to a detached conn"));
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    drop(io);
    for h in handles {
        h.join().unwrap();
    }
}

/// The driver's timers (the session has none): an idle session told `Timeout::Idle`
/// sends GOAWAY NO_ERROR and ends cleanly; a peer with zero windows holding a reply is
/// `busy`, and `Timeout::Send` ends it the same way although no DATA can go out.
#[test]
fn timed_out_sessions_say_goaway_no_error_and_end_cleanly() {
    use msgsched::proto::Timeout;
    let sched = SchedConfig {
        model: Model::Cs,
        workers: 1,
        queue_capacity: 8,
        seed: 1,
    };
    let (mut io, sockets) = session_group::<u32>(&sched, FramerConfig::default()).unwrap();
    let mut s = sockets.into_iter().next().unwrap();
    let worker = std::thread::spawn(move || loop {
        match s.recv_timeout(Duration::from_millis(5)) {
            Ok(m) => {
                let body = IoVec::from(Zbuf::from_vec(vec![7u8; 1000]));
                s.reply(m.origin, Response::new(200).body(body).into_iovec());
            }
            Err(RecvError::Timeout) => {}
            Err(RecvError::Disconnected) => return,
        }
    });
    let goaway_of = |bytes: &[u8]| {
        let fs = frames(bytes);
        let (h, p) = fs.last().unwrap().clone();
        assert_eq!(h.kind, kind::GOAWAY, "GOAWAY last");
        (
            u32::from_be_bytes([p[4], p[5], p[6], p[7]]),
            p[8..].to_vec(),
        )
    };

    // Idle: preface and SETTINGS, nothing else.
    assert!(io.attach(1, Box::new(H2Session::new(H2Config::default()))));
    let mut input = PREFACE.to_vec();
    frame::settings(&mut input, &[]);
    io.on_data(1, Zbuf::from_vec(input));
    io.poll_replies(|_, _| {});
    assert!(!io.busy(1), "an idle session is not busy");
    io.time_out(1, Timeout::Idle);
    let mut out = Vec::new();
    io.poll_replies(|_, b| out.extend(b.to_vec()));
    assert_eq!(goaway_of(&out), (0, b"idle_timeout".to_vec()));
    assert_eq!(
        io.poll_event(),
        Some(IoEvent::Shutdown {
            conn: 1,
            reason: None
        })
    );
    assert_eq!(io.counters().timeout_idle.load(Ordering::Relaxed), 1);

    // Zero window: the reply is held, the session is busy until the send timer fires.
    assert!(io.attach(2, Box::new(H2Session::new(H2Config::default()))));
    let mut input = PREFACE.to_vec();
    frame::settings(&mut input, &[(frame::setting::INITIAL_WINDOW_SIZE, 0)]);
    get(&mut Encoder::new(), &mut input, 1, "/big");
    io.on_data(2, Zbuf::from_vec(input));
    let end = Instant::now() + Duration::from_secs(30);
    while io.counters().replies.load(Ordering::Relaxed) < 1 {
        assert!(Instant::now() < end, "no reply");
        io.poll_replies(|_, _| {});
        std::thread::sleep(Duration::from_millis(1));
    }
    io.poll_replies(|_, _| {});
    assert_eq!(io.in_flight(2), Some(0));
    assert!(
        io.busy(2),
        "a reply held by a zero window keeps the session busy"
    );
    io.time_out(2, Timeout::Send);
    let mut out = Vec::new();
    io.poll_replies(|_, b| out.extend(b.to_vec()));
    assert!(
        frames(&out).iter().all(|(h, _)| h.kind != kind::DATA),
        "no DATA past a zero window"
    );
    assert_eq!(goaway_of(&out), (0, b"send_timeout".to_vec()));
    assert_eq!(
        io.poll_event(),
        Some(IoEvent::Shutdown {
            conn: 2,
            reason: None
        })
    );
    assert_eq!(io.counters().timeout_send.load(Ordering::Relaxed), 1);
    drop(io);
    worker.join().unwrap();
}

/// A request the scheduler had no room for is still ours to answer: it counts in
/// `in_flight` (as a stalled message does in `MsgIo`), so a driver that closes a
/// half-closed peer once nothing is in flight, or that spares a connection with work
/// at the workers its send timeout, does neither while the request waits for room.
/// Once placed and answered, it leaves `in_flight`.
#[test]
fn a_request_waiting_for_the_scheduler_counts_in_flight() {
    let sched = SchedConfig {
        model: Model::Ms,
        workers: 1,
        queue_capacity: 1,
        seed: 7,
    };
    let (mut io, mut sockets) = session_group::<u32>(&sched, FramerConfig::default()).unwrap();
    let mut w = sockets.pop().unwrap();
    let request = |path: &str| {
        let mut input = PREFACE.to_vec();
        frame::settings(&mut input, &[]);
        get(&mut Encoder::new(), &mut input, 1, path);
        Zbuf::from_vec(input)
    };
    for c in [1, 2] {
        assert!(io.attach(c, Box::new(H2Session::new(H2Config::default()))));
    }
    // Connection 1's request fills the only FIFO; connection 2's waits for room.
    io.on_data(1, request("/one"));
    io.on_data(2, request("/two"));
    assert_eq!(io.counters().messages.load(Ordering::Relaxed), 1);
    assert!(!io.wants_input(2), "stalled: not read");
    assert_eq!(io.in_flight(1), Some(1));
    assert_eq!(
        io.in_flight(2),
        Some(1),
        "its request waits for the scheduler"
    );
    let mut out: HashMap<u32, Vec<u8>> = HashMap::new();
    for path in ["/one", "/two"] {
        let m = w.try_recv().expect("a request");
        assert_eq!(Request::parse(&m.body).unwrap().path(), path.as_bytes());
        let body = IoVec::from(Zbuf::from_vec(path.as_bytes().to_vec()));
        assert!(w.reply(m.origin, Response::new(200).body(body).into_iovec()));
        io.poll_replies(|c, b| out.entry(c).or_default().extend(b.to_vec()));
    }
    for c in [1, 2] {
        assert_eq!(io.in_flight(c), Some(0), "connection {c}");
        let ended = frames(&out[&c])
            .iter()
            .any(|(h, _)| h.kind == kind::DATA && h.flags & flag::END_STREAM != 0);
        assert!(ended, "connection {c} answered");
    }
}
