//! An HTTP/2 server session fed arbitrary bytes (after a valid preface, or not), cut into
//! pieces, with every request it yields answered (some with a reply, some without): no
//! panic, every request message parses, the output is a sequence of whole frames within
//! the frame size, and the bounds hold.
//!
//! The input's last byte also drives the memory budget's side (`Session::set_mem`,
//! `Session::shed`, as `SessionIo` would): a small memory limit and credit closed on some
//! pieces, the largest part shed on others. The session's running memory sum is checked
//! against a recount on every call (debug assertions), it never grants more flow-control
//! credit than the DATA it was given (per stream, and for the connection beyond its
//! initial window), and once told there is room and credit it waits for nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use msgsched::proto::h2::frame::{
    kind, FrameHeader, DEFAULT_MAX_FRAME, DEFAULT_WINDOW, HEADER_LEN, PREFACE,
};
use msgsched::proto::h2::{H2Config, H2Session, Request, Response};
use msgsched::proto::{Session, SessionState};
use std::collections::HashMap;
use zbuf::{IoVec, Zbuf};

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let cfg = H2Config {
        max_concurrent_streams: 8,
        max_output: 8192,
        flood_budget: 300,
        max_body: 4096,
        ..H2Config::default()
    };
    let max_streams = cfg.max_concurrent_streams as usize;
    let max_body = cfg.max_body;
    let initial_grant = i64::from(cfg.conn_window) - DEFAULT_WINDOW;
    let mode = *data.last().unwrap_or(&0);
    let mut s = H2Session::new(cfg);
    let mut pushed = Vec::new();
    let mut input = Vec::new();
    if ctl & 1 == 0 {
        input.extend_from_slice(PREFACE);
    }
    input.extend_from_slice(rest);
    let chunk = usize::from(ctl >> 1) + 1;
    let mut out = Vec::new();
    let mut pending = Vec::new();
    for (i, piece) in input.chunks(chunk).enumerate() {
        if mode & 1 != 0 {
            // Bounded: a little room past what it holds, credit closed on some pieces.
            let room = usize::from((mode >> 2) & 7) * 4096;
            let credit = (i + usize::from(mode >> 5)) % 3 != 0;
            s.set_mem(s.mem() + room, credit);
        }
        if s.wants_input() {
            s.push(Zbuf::copy_from_slice(piece));
            pushed.extend_from_slice(piece);
        }
        let _ = s.mem();
        if mode & 2 != 0 && i % 4 == 3 && s.state() == SessionState::Open {
            s.shed();
        }
        while let Some(r) = s.poll_request() {
            let req = Request::parse(&r.body).expect("request messages parse");
            pending.push((r.id, req));
        }
        assert!(s.open_streams() <= max_streams);
        // Replies waiting for window: at most one echo (<= max_body) per slot; the
        // accounting (debug-checked subtractions) never goes below zero.
        assert!(s.held_replies() <= max_streams * max_body);
        // Answer some now, keep others for later (out of order completion).
        if i % 2 == 0 {
            for (id, req) in pending.drain(..) {
                let reply = match id % 3 {
                    0 => None,
                    1 => Some(Response::new(200).body(req.body).into_iovec()),
                    _ => Some(
                        Response::new(204)
                            .trailers(vec![(b"grpc-status".to_vec(), b"0".to_vec())])
                            .into_iovec(),
                    ),
                };
                s.complete(id, reply);
            }
        }
        while let Some(t) = s.poll_transmit() {
            out.extend(t.to_vec());
        }
        if matches!(s.state(), SessionState::Closing(_)) {
            break;
        }
    }
    for (id, _) in pending {
        s.complete(id, Some(IoVec::new()));
    }
    s.set_mem(usize::MAX, true);
    while let Some(t) = s.poll_transmit() {
        out.extend(t.to_vec());
    }
    if s.state() == SessionState::Open {
        assert!(
            !s.mem_waits(),
            "room and credit: nothing owed, nothing stopped"
        );
    }
    let _ = s.mem();
    // Whole frames only.
    let mut at = 0;
    while at < out.len() {
        assert!(at + HEADER_LEN <= out.len(), "partial frame header");
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&out[at..at + HEADER_LEN]);
        let f = FrameHeader::parse(&h);
        assert!(
            f.len <= DEFAULT_MAX_FRAME,
            "frame above the peer's max size"
        );
        at += HEADER_LEN + f.len as usize;
    }
    assert_eq!(at, out.len(), "partial frame");
    // Credit never exceeds the DATA received (what the session was given, parsed as it
    // would: frames after the preface).
    let mut got: HashMap<u32, i64> = HashMap::new();
    for (h, _) in frames(pushed.strip_prefix(&PREFACE[..]).unwrap_or(&[])) {
        if h.kind == kind::DATA {
            *got.entry(h.stream).or_default() += i64::from(h.len);
        }
    }
    let mut granted: HashMap<u32, i64> = HashMap::new();
    for (h, p) in frames(&out) {
        if h.kind == kind::WINDOW_UPDATE && p.len() == 4 {
            let inc = i64::from(u32::from_be_bytes([p[0], p[1], p[2], p[3]]));
            *granted.entry(h.stream).or_default() += inc;
        }
    }
    let data: i64 = got.values().sum();
    for (&id, &g) in &granted {
        if id == 0 {
            assert!(
                g <= data + initial_grant,
                "connection credit {g} for {data}"
            );
        } else {
            let d = got.get(&id).copied().unwrap_or(0);
            assert!(g <= d, "stream {id}: credit {g} for {d} bytes of DATA");
        }
    }
});

/// The whole frames at the start of `b`.
fn frames(b: &[u8]) -> Vec<(FrameHeader, &[u8])> {
    let mut v = Vec::new();
    let mut at = 0;
    while at + HEADER_LEN <= b.len() {
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&b[at..at + HEADER_LEN]);
        let f = FrameHeader::parse(&h);
        let end = at + HEADER_LEN + f.len as usize;
        if end > b.len() {
            break;
        }
        v.push((f, &b[at + HEADER_LEN..end]));
        at = end;
    }
    v
}
