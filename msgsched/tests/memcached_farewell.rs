//! A memcached connection whose stream breaks after valid requests: the valid ones are
//! answered (in order, even when their workers are slow), then the parser's farewell
//! (`CLIENT_ERROR line too long`, binary EINVAL / E2BIG echoing the bad request's
//! `opaque`, nothing for a bad magic), then a graceful shutdown with the counted reason.
#![cfg(not(loom))]

use msgsched::framer::FramerConfig;
use msgsched::parser::ParseErrorKind;
use msgsched::proto::memcached::binary::{status, Header, HDR_LEN, RES_MAGIC};
use msgsched::proto::memcached::McParser;
use msgsched::sched::{Model, RecvError, SchedConfig};
use msgsched::socket::{group, IoEvent, MsgIo, MsgSocket};
use std::sync::atomic::Ordering as AO;
use std::time::{Duration, Instant};
use zbuf::{IoVec, Zbuf};

type Io = MsgIo<u32, McParser>;

/// Workers answer every message with `R<seq>;` after sleeping 30 ms (so a reply is still
/// at a worker when the bad bytes behind its request are framed).
fn workers(sockets: Vec<MsgSocket<u32>>) -> Vec<std::thread::JoinHandle<()>> {
    sockets
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || loop {
                match s.recv_timeout(Duration::from_millis(20)) {
                    Ok(m) => {
                        std::thread::sleep(Duration::from_millis(30));
                        let mut v = IoVec::new();
                        let seq = m.origin.seq();
                        v.push(Zbuf::copy_from_slice(format!("R{seq};").as_bytes()));
                        s.reply(m.origin, v);
                    }
                    Err(RecvError::Timeout) => {}
                    Err(RecvError::Disconnected) => return,
                }
            })
        })
        .collect()
}

/// Feeds `bytes` to connection 1 at once, then drives until it is shut down: the bytes
/// sent on it, in order, and the shutdown's reason.
fn run(bytes: &[u8]) -> (Vec<u8>, Option<ParseErrorKind>, Io) {
    let sched = SchedConfig {
        model: Model::Ms,
        workers: 3,
        queue_capacity: 64,
        seed: 1,
    };
    let (mut io, sockets) = group::<u32, McParser>(&sched, FramerConfig::default()).unwrap();
    let ws = workers(sockets);
    io.attach(1, McParser::default()).unwrap();
    io.on_data(1, Zbuf::copy_from_slice(bytes));
    let mut out = Vec::new();
    let end = Instant::now() + Duration::from_secs(30);
    let reason = loop {
        assert!(
            Instant::now() < end,
            "no shutdown: {:?}",
            io.counters().fields()
        );
        let failed: u64 = ParseErrorKind::ALL
            .iter()
            .map(|k| io.counters().parse_errors(*k))
            .sum();
        assert!(
            failed == 0 || !io.wants_input(1),
            "a failed stream is not read further"
        );
        io.poll_replies(|c, r| {
            assert_eq!(c, 1);
            for z in r {
                out.extend_from_slice(&z);
            }
        });
        match io.poll_event() {
            Some(IoEvent::Shutdown { conn: 1, reason }) => break reason,
            Some(e) => panic!("unexpected {e:?}"),
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    assert!(!io.is_attached(1));
    assert_eq!(io.counters().closed_in_flight.load(AO::Relaxed), 0);
    io.poll_replies(|c, _| panic!("a reply after the shutdown on {c}"));
    let _ = ws;
    (out, reason, io)
}

fn bin(opcode: u8, keylen: u16, extlen: u8, bodylen: u32, opaque: u32) -> Vec<u8> {
    Header::request(opcode, keylen, extlen, bodylen, opaque)
        .bytes()
        .to_vec()
}

#[test]
fn text_requests_before_a_too_long_line_are_answered_then_client_error_then_close() {
    // The set runs alone (a write: `Parser::exclusive`); the two reads after it are at
    // workers together when the long line behind them is framed.
    let mut s = b"set a 0 0 1\r\nx\r\nget a\r\ngets a\r\n".to_vec();
    s.extend(std::iter::repeat_n(b'z', 5000));
    let (out, reason, io) = run(&s);
    assert_eq!(out, b"R0;R1;R2;CLIENT_ERROR line too long\r\n");
    assert_eq!(reason, Some(ParseErrorKind::TooLarge));
    assert_eq!(io.counters().parse_errors(ParseErrorKind::TooLarge), 1);
    assert_eq!(io.counters().replies.load(AO::Relaxed), 3);
}

#[test]
fn binary_requests_before_bad_lengths_are_answered_then_einval_with_the_opaque() {
    // noop (opaque 5), get "k" (opaque 6), then bodylen 4 < key 10 + extras 8 (opaque 9).
    let mut s = bin(0x0a, 0, 0, 0, 5);
    s.extend(bin(0x00, 1, 0, 1, 6));
    s.push(b'k');
    s.extend(bin(0x01, 10, 8, 4, 9));
    let (out, reason, _io) = run(&s);
    assert_eq!(&out[..6], b"R0;R1;");
    let mut v = IoVec::new();
    v.push(Zbuf::copy_from_slice(&out[6..]));
    let h = Header::read(&v).unwrap();
    assert_eq!(
        (h.magic, h.opcode, h.status, h.opaque),
        (RES_MAGIC, 0x01, status::EINVAL, 9)
    );
    assert_eq!(&out[6 + HDR_LEN..], b"Invalid arguments");
    assert_eq!(h.bodylen as usize, out.len() - 6 - HDR_LEN);
    assert_eq!(reason, Some(ParseErrorKind::BadField));
}

#[test]
fn binary_request_over_the_cap_gets_e2big_and_bad_magic_gets_nothing() {
    // A get whose body is over the cap (not a storage command, so not swallowed).
    let mut s = bin(0x0a, 0, 0, 0, 1);
    s.extend(bin(0x00, 1, 0, 8 << 20, 0x77));
    let (out, reason, _io) = run(&s);
    assert_eq!(&out[..3], b"R0;");
    let mut v = IoVec::new();
    v.push(Zbuf::copy_from_slice(&out[3..]));
    let h = Header::read(&v).unwrap();
    assert_eq!((h.status, h.opaque), (status::E2BIG, 0x77));
    assert_eq!(&out[3 + HDR_LEN..], b"Too large.");
    assert_eq!(reason, Some(ParseErrorKind::TooLarge));

    let mut s = bin(0x0a, 0, 0, 0, 1);
    s.push(0x42);
    s.extend([0u8; 23]);
    let (out, reason, _io) = run(&s);
    assert_eq!(out, b"R0;");
    assert_eq!(reason, Some(ParseErrorKind::Malformed));
}
