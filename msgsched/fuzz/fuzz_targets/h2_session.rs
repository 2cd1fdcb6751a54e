//! An HTTP/2 server session fed arbitrary bytes (after a valid preface, or not), cut into
//! pieces, with every request it yields answered (some with a reply, some without): no
//! panic, every request message parses, the output is a sequence of whole frames within
//! the frame size, and the bounds hold.
#![no_main]

use libfuzzer_sys::fuzz_target;
use msgsched::proto::h2::frame::{FrameHeader, DEFAULT_MAX_FRAME, HEADER_LEN, PREFACE};
use msgsched::proto::h2::{H2Config, H2Session, Request, Response};
use msgsched::proto::{Session, SessionState};
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
    let mut s = H2Session::new(cfg);
    let mut input = Vec::new();
    if ctl & 1 == 0 {
        input.extend_from_slice(PREFACE);
    }
    input.extend_from_slice(rest);
    let chunk = usize::from(ctl >> 1) + 1;
    let mut out = Vec::new();
    let mut pending = Vec::new();
    for (i, piece) in input.chunks(chunk).enumerate() {
        if s.wants_input() {
            s.push(Zbuf::copy_from_slice(piece));
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
    while let Some(t) = s.poll_transmit() {
        out.extend(t.to_vec());
    }
    // Whole frames only.
    let mut at = 0;
    while at < out.len() {
        assert!(at + HEADER_LEN <= out.len(), "partial frame header");
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&out[at..at + HEADER_LEN]);
        let f = FrameHeader::parse(&h);
        assert!(f.len <= DEFAULT_MAX_FRAME, "frame above the peer's max size");
        at += HEADER_LEN + f.len as usize;
    }
    assert_eq!(at, out.len(), "partial frame");
});
