//! Many memcached connections under heavy back pressure (the proto_bench 5,000-connection
//! shape, scaled to a test): 3,000 closed-loop connections on 2 workers whose FIFOs hold
//! 4 messages each, so nearly every dispatch is refused at first and connections stall,
//! pause (a reply that "cannot go to TCP" for a few rounds, as r2c's driver does), and,
//! under CS, hold pipelined requests behind their key's message in service. Every
//! request must get exactly its reply, in order, for each model; and the counters must
//! balance (messages = replies, nothing closed in flight or abandoned).
#![cfg(not(loom))]

use msgsched::framer::FramerConfig;
use msgsched::proto::memcached::McParser;
use msgsched::sched::{Model, RecvError, SchedConfig};
use msgsched::socket::{group, MsgSocket};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};
use zbuf::{IoVec, Zbuf};

const CONNS: u32 = 3000;
/// Requests per connection.
const REQS: u32 = 6;

fn workers(sockets: Vec<MsgSocket<u32>>) -> Vec<std::thread::JoinHandle<()>> {
    sockets
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || loop {
                match s.recv_timeout(Duration::from_millis(20)) {
                    Ok(m) => {
                        // "R " + the request line: the client checks it is its own.
                        let mut v = IoVec::from(Zbuf::copy_from_slice(b"R "));
                        v.append(m.body.clone());
                        s.reply(m.origin, v);
                    }
                    Err(RecvError::Timeout) => {}
                    Err(RecvError::Disconnected) => return,
                }
            })
        })
        .collect()
}

/// A client connection: requests are sent in batches (1 to 3 pipelined gets), the next
/// batch once every reply of the last one is in.
struct Client {
    sent: u32,
    answered: u32,
    /// Bytes "in TCP": sent by the client, not yet read by the driver.
    tcp: Vec<u8>,
    /// Reply bytes received, not yet parsed.
    rx: Vec<u8>,
}

fn request(c: u32, i: u32) -> String {
    format!("get k{c}_{i}\r\n")
}

fn run(model: Model) {
    let sched = SchedConfig {
        model,
        workers: 2,
        queue_capacity: 4,
        seed: 7,
    };
    let framer = FramerConfig {
        max_in_flight: 4,
        ..FramerConfig::default()
    };
    let (mut io, sockets) = group::<u32, McParser>(&sched, framer).unwrap();
    let ws = workers(sockets);
    let mut clients: HashMap<u32, Client> = HashMap::new();
    for c in 0..CONNS {
        io.attach(c, McParser::default()).unwrap();
        clients.insert(
            c,
            Client {
                sent: 0,
                answered: 0,
                tcp: Vec::new(),
                rx: Vec::new(),
            },
        );
    }
    // Connections to read: new bytes in TCP (a readable event), bytes left by a
    // partial read, or reported by `poll_resumed` after `wait_input` (r2c's driver: no
    // scan of the connections that take no input).
    let mut unread: BTreeSet<u32> = BTreeSet::new();
    // Paused connections and the round they resume at (r2c: replies waiting for TCP).
    let mut paused: VecDeque<(u32, u64)> = VecDeque::new();
    let mut done = 0u32;
    let mut round = 0u64;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while done < CONNS {
        assert!(
            Instant::now() < deadline,
            "{model:?}: {done} of {CONNS} connections finished; stuck: {:?}; {:?}",
            clients
                .iter()
                .filter(|(_, k)| k.answered < REQS)
                .take(5)
                .map(|(c, k)| (*c, k.sent, k.answered, io.in_flight(*c), io.wants_input(*c)))
                .collect::<Vec<_>>(),
            io.counters().fields()
        );
        round += 1;
        // Clients whose batch is answered send the next one.
        for (&c, k) in clients.iter_mut() {
            if k.sent == k.answered && k.sent < REQS {
                let batch = (1 + c % 3).min(REQS - k.sent);
                for _ in 0..batch {
                    k.tcp.extend_from_slice(request(c, k.sent).as_bytes());
                    k.sent += 1;
                }
                unread.insert(c);
            }
        }
        // The driver reads the connections it was told about.
        let ready = std::mem::take(&mut unread);
        for c in ready {
            if clients[&c].tcp.is_empty() {
                continue;
            }
            if !io.wants_input(c) {
                io.wait_input(c);
                continue;
            }
            let k = clients.get_mut(&c).unwrap();
            // TCP hands over what it has, possibly a request split in two segments.
            let n = if k.tcp.len() > 8 && next() % 4 == 0 {
                k.tcp.len() / 2
            } else {
                k.tcp.len()
            };
            let bytes: Vec<u8> = k.tcp.drain(..n).collect();
            if !k.tcp.is_empty() {
                unread.insert(c);
            }
            io.on_data(c, Zbuf::from_vec(bytes));
        }
        while let Some(&(c, at)) = paused.front() {
            if at > round {
                break;
            }
            paused.pop_front();
            io.pause(c, false);
        }
        let mut got = Vec::new();
        io.poll_replies(|c, r| {
            for z in r {
                clients.get_mut(&c).unwrap().rx.extend_from_slice(&z);
            }
            got.push(c);
        });
        while let Some(c) = io.poll_resumed() {
            unread.insert(c);
        }
        for c in got {
            // One reply in 8 "did not fit in TCP": the connection pauses a few rounds.
            if next() % 8 == 0 {
                io.pause(c, true);
                paused.push_back((c, round + 1 + next() % 4));
            }
            let k = clients.get_mut(&c).unwrap();
            while let Some(end) = k.rx.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = k.rx.drain(..end + 2).collect();
                let want = format!("R {}", request(c, k.answered));
                assert_eq!(
                    String::from_utf8_lossy(&line),
                    want,
                    "{model:?}: connection {c}"
                );
                k.answered += 1;
                if k.answered == REQS {
                    done += 1;
                }
            }
        }
        assert!(io.poll_event().is_none(), "no connection ends");
        if round % 64 == 0 {
            std::thread::yield_now();
        }
    }
    let total = u64::from(CONNS * REQS);
    let f: HashMap<_, _> = io.counters().fields().into_iter().collect();
    assert_eq!(f["messages"], total, "{model:?} {f:?}");
    assert_eq!(f["replies"], total, "{model:?} {f:?}");
    for zero in [
        "closed_in_flight",
        "abandoned",
        "sequence_errors",
        "detached",
    ] {
        assert_eq!(f[zero], 0, "{model:?} {zero}: {f:?}");
    }
    // The test is about back pressure: it must have happened. How often depends on how
    // fast the worker threads drain (1,692 to several thousand here), so only > 0.
    assert!(f["backpressure"] > 0, "{model:?} {f:?}");
    let st = io.sched_stats();
    if model == Model::Cs {
        assert!(
            st.held > 0,
            "pipelined gets were held behind their key: {st:?}"
        );
    }
    drop(io);
    for w in ws {
        w.join().unwrap();
    }
}

#[test]
fn cs_every_request_of_3000_connections_is_answered_under_back_pressure() {
    run(Model::Cs);
}

#[test]
fn ms_every_request_of_3000_connections_is_answered_under_back_pressure() {
    run(Model::Ms);
}

#[test]
fn cp_every_request_of_3000_connections_is_answered_under_back_pressure() {
    run(Model::Cp);
}
