//! memcached runs one connection's commands one after another: a `get` pipelined behind
//! its `set` sees the value. Under MS (one connection's messages spread over workers)
//! ordered replies alone did not give that: the `get` could run on another worker while
//! the `set` was still running, and answer a miss (the attack benchmark's
//! `lf_only_lines@normal` timed out on exactly that). The memcached parser marks every
//! command but reads exclusive (`Parser::exclusive`), so the framer holds the `get` until
//! the `set` is done; reads still run side by side.
#![cfg(not(loom))]

use msgsched::framer::FramerConfig;
use msgsched::proto::memcached::binary::{op, Header};
use msgsched::proto::memcached::McParser;
use msgsched::sched::{Model, RecvError, SchedConfig};
use msgsched::socket::{group, MsgIo, MsgSocket};
use std::sync::atomic::{AtomicBool, Ordering as AO};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zbuf::{IoVec, Zbuf};

type Io = MsgIo<u32, McParser>;

/// A one-key store's workers: a write (text `set`, binary `set`) sleeps 30 ms, so a
/// message that overtakes it runs while it is still at its worker, then marks the key
/// stored and answers `W;`; anything else answers `HIT;` or `MISS;`.
fn workers(
    sockets: Vec<MsgSocket<u32>>,
    stored: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    sockets
        .into_iter()
        .map(|mut s| {
            let stored = Arc::clone(stored);
            std::thread::spawn(move || loop {
                match s.recv_timeout(Duration::from_millis(20)) {
                    Ok(m) => {
                        let body = m.body.to_vec();
                        let write = body.starts_with(b"set ")
                            || (body.len() >= 2 && body[0] == 0x80 && body[1] == op::SET);
                        let reply: &[u8] = if write {
                            std::thread::sleep(Duration::from_millis(30));
                            stored.store(true, AO::SeqCst);
                            b"W;"
                        } else if stored.load(AO::SeqCst) {
                            b"HIT;"
                        } else {
                            b"MISS;"
                        };
                        let mut v = IoVec::new();
                        v.push(Zbuf::copy_from_slice(reply));
                        s.reply(m.origin, v);
                    }
                    Err(RecvError::Timeout) => {}
                    Err(RecvError::Disconnected) => return,
                }
            })
        })
        .collect()
}

/// `bytes` on connection 1 in one piece under MS with 3 workers; the messages taken at
/// once (before any reply), then everything sent back once `want` replies went out.
fn run(bytes: &[u8], want: u64) -> (u64, Vec<u8>) {
    let sched = SchedConfig {
        model: Model::Ms,
        workers: 3,
        queue_capacity: 64,
        seed: 1,
    };
    let (mut io, sockets): (Io, _) = group(&sched, FramerConfig::default()).unwrap();
    let stored = Arc::new(AtomicBool::new(false));
    let ws = workers(sockets, &stored);
    io.attach(1, McParser::default()).unwrap();
    io.on_data(1, Zbuf::copy_from_slice(bytes));
    let taken_at_once = io.counters().messages.load(AO::Relaxed);
    let mut out = Vec::new();
    let end = Instant::now() + Duration::from_secs(30);
    while io.counters().replies.load(AO::Relaxed) < want {
        assert!(Instant::now() < end, "stuck: {:?}", io.counters().fields());
        io.poll_replies(|_, r| {
            for z in r {
                out.extend_from_slice(&z);
            }
        });
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(io.in_flight(1), Some(0), "nothing left held or at workers");
    let _ = ws;
    (taken_at_once, out)
}

#[test]
fn a_get_pipelined_behind_its_set_runs_after_it() {
    for nl in ["\r\n", "\n"] {
        let s = format!("set k 0 0 2{nl}hi\r\nget k{nl}gets k{nl}");
        let (at_once, out) = run(s.as_bytes(), 3);
        assert_eq!(at_once, 1, "the gets wait for the set ({nl:?})");
        assert_eq!(out, b"W;HIT;HIT;", "{nl:?}");
    }
}

#[test]
fn reads_run_side_by_side_until_a_write_then_wait_for_it() {
    // The two reads are dispatched together (to any workers); the set waits for both,
    // the get after it waits for the set.
    let (at_once, out) = run(b"get k\r\nget k j\r\nset k 0 0 1\r\nx\r\nget k\r\n", 4);
    assert_eq!(at_once, 2, "both reads are taken before any reply");
    assert_eq!(out, b"MISS;MISS;W;HIT;");
}

#[test]
fn binary_set_then_get_runs_in_order() {
    // set "k" (extras 8, value "v"), then get "k", then noop: the get sees the set.
    let mut s = Header::request(op::SET, 1, 8, 8 + 1 + 1, 1)
        .bytes()
        .to_vec();
    s.extend([0u8; 8]);
    s.extend(b"kv");
    s.extend(Header::request(op::GET, 1, 0, 1, 2).bytes());
    s.push(b'k');
    s.extend(Header::request(op::NOOP, 0, 0, 0, 3).bytes());
    let (at_once, out) = run(&s, 3);
    assert_eq!(at_once, 1, "the get and the noop wait for the set");
    assert_eq!(out, b"W;HIT;HIT;");
}
