use super::*;
use crate::proto::h2::frame::PREFACE;

/// A client's side for the tests: frames out, frames parsed back.
struct Peer {
    enc: Encoder,
    dec: Decoder,
}

type Got = Vec<(FrameHeader, Vec<u8>)>;

impl Peer {
    fn new() -> Self {
        Peer {
            enc: Encoder::new(),
            dec: Decoder::new(HpackLimits::default()),
        }
    }

    fn block(&mut self, path: &str) -> Vec<u8> {
        let f: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"GET"),
            (b":scheme", b"http"),
            (b":path", path.as_bytes()),
            (b":authority", b"x"),
        ];
        let mut b = Vec::new();
        self.enc.encode(f, &mut b);
        b
    }

    /// A complete GET of `path` on `stream` (HEADERS with END_STREAM) with one more field
    /// after the pseudo-headers and no `:authority`, which a test may read back to see
    /// that the dynamic table the previous block filled was kept.
    fn get_with(&mut self, out: &mut Vec<u8>, stream: u32, path: &[u8], extra: (&[u8], &[u8])) {
        let mut block = Vec::new();
        self.enc.encode(
            vec![
                (&b":method"[..], &b"GET"[..]),
                (b":scheme", b"http"),
                (b":path", path),
                extra,
            ],
            &mut block,
        );
        frame::put(
            out,
            kind::HEADERS,
            flag::END_HEADERS | flag::END_STREAM,
            stream,
            &block,
        );
    }

    fn get(&mut self, out: &mut Vec<u8>, stream: u32, path: &str) {
        let b = self.block(path);
        frame::put(
            out,
            kind::HEADERS,
            flag::END_HEADERS | flag::END_STREAM,
            stream,
            &b,
        );
    }
}

fn parse(bytes: &[u8]) -> Got {
    let mut v = Vec::new();
    let mut at = 0;
    while at + HEADER_LEN <= bytes.len() {
        let mut b = [0u8; HEADER_LEN];
        b.copy_from_slice(&bytes[at..at + HEADER_LEN]);
        let h = FrameHeader::parse(&b);
        let end = at + HEADER_LEN + h.len as usize;
        v.push((h, bytes[at + HEADER_LEN..end].to_vec()));
        at = end;
    }
    v
}

fn drain(s: &mut H2Session) -> Got {
    let mut all = Vec::new();
    while let Some(t) = s.poll_transmit() {
        all.extend(t.to_vec());
    }
    parse(&all)
}

fn open() -> (H2Session, Peer, Arc<H2Counters>) {
    open_with(H2Config::default())
}

fn open_with(cfg: H2Config) -> (H2Session, Peer, Arc<H2Counters>) {
    let c = Arc::clone(&cfg.counters);
    let mut s = H2Session::new(cfg);
    let mut b = PREFACE.to_vec();
    frame::settings(&mut b, &[]);
    s.push(Zbuf::from_vec(b));
    let got = drain(&mut s);
    assert_eq!(got[0].0.kind, kind::SETTINGS);
    assert!(got
        .iter()
        .any(|(h, _)| h.kind == kind::SETTINGS && h.flags == flag::ACK));
    (s, Peer::new(), c)
}

fn send(s: &mut H2Session, b: Vec<u8>) -> Got {
    s.push(Zbuf::from_vec(b));
    drain(s)
}

fn goaway_code(got: &Got) -> Option<u32> {
    got.iter()
        .find(|(h, _)| h.kind == kind::GOAWAY)
        .map(|(_, p)| u32::from_be_bytes([p[4], p[5], p[6], p[7]]))
}

fn rst(got: &Got, stream: u32) -> Option<u32> {
    got.iter()
        .find(|(h, _)| h.kind == kind::RST_STREAM && h.stream == stream)
        .map(|(_, p)| u32::from_be_bytes([p[0], p[1], p[2], p[3]]))
}

fn closing(s: &H2Session) -> bool {
    matches!(s.state(), SessionState::Closing(_))
}

fn reply(s: &mut H2Session, id: u64, body: &[u8]) -> Got {
    let r = Response::new(200)
        .header("x", "y")
        .body(IoVec::from(Zbuf::copy_from_slice(body)));
    s.complete(id, Some(r.into_iovec()));
    drain(s)
}

#[test]
fn a_request_becomes_one_message_and_the_reply_goes_out_as_headers_and_data() {
    let (mut s, mut p, c) = open();
    let mut b = Vec::new();
    let block = p.block("/echo");
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 1, &block);
    frame::put(&mut b, kind::DATA, 0, 1, b"hello ");
    frame::put(&mut b, kind::DATA, flag::END_STREAM, 1, b"world");
    let got = send(&mut s, b);
    // Stream window reopened for the non-final DATA; connection credit returned.
    assert!(got
        .iter()
        .any(|(h, _)| h.kind == kind::WINDOW_UPDATE && h.stream == 1));
    assert!(got
        .iter()
        .any(|(h, _)| h.kind == kind::WINDOW_UPDATE && h.stream == 0));
    let req = s.poll_request().unwrap();
    assert_eq!(req.id, 1);
    assert!(s.poll_request().is_none());
    let r = Request::parse(&req.body).unwrap();
    assert_eq!(r.path(), b"/echo");
    assert_eq!(r.method(), b"GET");
    assert_eq!(r.body.to_vec(), b"hello world");
    assert_eq!(
        r.body.num_segments(),
        2,
        "DATA payloads are slices, not copies"
    );
    let got = reply(&mut s, 1, b"hi");
    assert_eq!(got[0].0.kind, kind::HEADERS);
    let hs = p.dec.decode(&got[0].1).unwrap();
    assert_eq!(hs[0], (b":status".to_vec(), b"200".to_vec()));
    assert!(hs.contains(&(b"content-length".to_vec(), b"2".to_vec())));
    assert_eq!(
        (got[1].0.kind, got[1].0.flags, &got[1].1[..]),
        (kind::DATA, flag::END_STREAM, &b"hi"[..])
    );
    assert_eq!(s.open_streams(), 0);
    assert_eq!(c.responses.load(Ordering::Relaxed), 1);
}

#[test]
fn a_bad_preface_or_first_frame_is_goaway_protocol_error() {
    let mut s = H2Session::new(H2Config::default());
    s.push(Zbuf::copy_from_slice(b"GET / HTTP/1.1\r\n\r\n"));
    let got = drain(&mut s);
    assert_eq!(goaway_code(&got), Some(ErrorCode::Protocol as u32));
    assert!(closing(&s));
    let mut s = H2Session::new(H2Config::default());
    let mut b = PREFACE.to_vec();
    frame::put(&mut b, kind::PING, 0, 0, &[0; 8]);
    s.push(Zbuf::from_vec(b));
    assert_eq!(
        goaway_code(&drain(&mut s)),
        Some(ErrorCode::Protocol as u32)
    );
    // A preface split anywhere is fine.
    let mut s = H2Session::new(H2Config::default());
    for ch in PREFACE.chunks(5) {
        s.push(Zbuf::copy_from_slice(ch));
    }
    assert!(!closing(&s));
}

#[test]
fn ping_is_answered_with_the_same_payload_and_bad_pings_are_errors() {
    let (mut s, _, c) = open();
    let mut b = Vec::new();
    frame::put(&mut b, kind::PING, 0, 0, b"12345678");
    frame::put(&mut b, kind::PING, flag::ACK, 0, b"abcdefgh");
    let got = send(&mut s, b);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].0.flags, &got[0].1[..]),
        (flag::ACK, &b"12345678"[..])
    );
    assert_eq!(c.pings.load(Ordering::Relaxed), 1);
    let mut b = Vec::new();
    frame::put(&mut b, kind::PING, 0, 0, b"1234567");
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::FrameSize as u32)
    );
    let (mut s, _, _) = open();
    let mut b = Vec::new();
    frame::put(&mut b, kind::PING, 0, 1, b"12345678");
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::Protocol as u32)
    );
}

#[test]
fn settings_are_validated_and_acknowledged() {
    for (vals, code) in [
        (vec![(setting::ENABLE_PUSH, 2)], ErrorCode::Protocol),
        (
            vec![(setting::INITIAL_WINDOW_SIZE, 1 << 31)],
            ErrorCode::FlowControl,
        ),
        (vec![(setting::MAX_FRAME_SIZE, 100)], ErrorCode::Protocol),
        (
            vec![(setting::MAX_FRAME_SIZE, 1 << 24)],
            ErrorCode::Protocol,
        ),
    ] {
        let (mut s, _, _) = open();
        let mut b = Vec::new();
        frame::settings(&mut b, &vals);
        assert_eq!(goaway_code(&send(&mut s, b)), Some(code as u32), "{vals:?}");
    }
    let (mut s, _, _) = open();
    let mut b = Vec::new();
    frame::put(&mut b, kind::SETTINGS, 0, 0, &[0; 5]);
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::FrameSize as u32)
    );
    let (mut s, _, _) = open();
    let mut b = Vec::new();
    frame::put(&mut b, kind::SETTINGS, flag::ACK, 0, &[0; 6]);
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::FrameSize as u32)
    );
    let (mut s, _, _) = open();
    let mut b = Vec::new();
    frame::put(&mut b, kind::SETTINGS, 0, 3, &[]);
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::Protocol as u32)
    );
}

#[test]
fn window_update_zero_and_overflow_are_errors_of_the_right_scope() {
    let (mut s, _, _) = open();
    let mut b = Vec::new();
    frame::window_update(&mut b, 0, 0);
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::Protocol as u32)
    );
    let (mut s, _, c) = open();
    let mut b = Vec::new();
    frame::window_update(&mut b, 0, (1 << 31) - 1);
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::FlowControl as u32)
    );
    assert!(c.goaway_for(Reason::WindowOverflow) >= 1);
    // On a stream: RST_STREAM, the connection lives.
    let (mut s, mut p, _) = open();
    let mut b = Vec::new();
    let block = p.block("/");
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 1, &block);
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 3, &block);
    frame::window_update(&mut b, 1, (1 << 31) - 1);
    frame::window_update(&mut b, 3, 0);
    let got = send(&mut s, b);
    assert_eq!(rst(&got, 1), Some(ErrorCode::FlowControl as u32));
    assert_eq!(rst(&got, 3), Some(ErrorCode::Protocol as u32));
    assert!(!closing(&s));
    // WINDOW_UPDATE on an idle stream.
    let mut b = Vec::new();
    frame::window_update(&mut b, 99, 1);
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::Protocol as u32)
    );
}

#[test]
fn replies_wait_for_the_peers_windows_both_stream_and_connection() {
    let (mut s, mut p, _) = open();
    let mut b = Vec::new();
    frame::settings(&mut b, &[(setting::INITIAL_WINDOW_SIZE, 10)]);
    p.get(&mut b, 1, "/");
    send(&mut s, b);
    let id = s.poll_request().unwrap().id;
    let got = reply(&mut s, id, &[7u8; 25]);
    let data: Vec<_> = got.iter().filter(|(h, _)| h.kind == kind::DATA).collect();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0].1.len(), 10, "stream window of 10");
    let mut b = Vec::new();
    frame::window_update(&mut b, 1, 10);
    let got = send(&mut s, b);
    assert_eq!(got[0].1.len(), 10);
    assert_eq!(got[0].0.flags, 0);
    // Raising the initial window reopens the stream.
    let mut b = Vec::new();
    frame::settings(&mut b, &[(setting::INITIAL_WINDOW_SIZE, 100)]);
    let got = send(&mut s, b);
    let d: Vec<_> = got.iter().filter(|(h, _)| h.kind == kind::DATA).collect();
    assert_eq!((d[0].1.len(), d[0].0.flags), (5, flag::END_STREAM));
    assert_eq!(s.open_streams(), 0);
}

#[test]
fn data_beyond_our_window_is_flow_control_error() {
    // The session re-credits each stream as its DATA arrives, so overrun the connection
    // window instead: 65,535 bytes, and no credit returned while bodies wait
    // (max_buffered 0): five 16,000-byte frames on five streams exceed it.
    let cfg = H2Config {
        conn_window: 65_535,
        max_buffered: 0,
        ..H2Config::default()
    };
    let (mut s, mut p, _) = open_with(cfg);
    let mut b = Vec::new();
    for id in [1u32, 3, 5, 7, 9] {
        let block = p.block("/");
        frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, id, &block);
        frame::put(&mut b, kind::DATA, 0, id, &[0u8; 16_000]);
    }
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::FlowControl as u32)
    );
}

#[test]
fn headers_and_continuation_are_assembled_and_bounded() {
    let (mut s, mut p, _) = open();
    let block = p.block("/split");
    let mut b = Vec::new();
    frame::put(&mut b, kind::HEADERS, flag::END_STREAM, 1, &block[..3]);
    frame::put(&mut b, kind::CONTINUATION, 0, 1, &block[3..6]);
    frame::put(
        &mut b,
        kind::CONTINUATION,
        flag::END_HEADERS,
        1,
        &block[6..],
    );
    send(&mut s, b);
    let r = Request::parse(&s.poll_request().unwrap().body).unwrap();
    assert_eq!(r.path(), b"/split");
    // Another frame in the middle of a block.
    let mut b = Vec::new();
    frame::put(&mut b, kind::HEADERS, flag::END_STREAM, 3, &block[..3]);
    frame::put(&mut b, kind::PING, 0, 0, &[0; 8]);
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::Protocol as u32)
    );
    // CONTINUATION flood: many frames, never END_HEADERS.
    let (mut s, _, c) = open();
    let mut b = Vec::new();
    frame::put(&mut b, kind::HEADERS, 0, 1, &[0x82]);
    for _ in 0..40 {
        frame::put(&mut b, kind::CONTINUATION, 0, 1, &[0x82]);
    }
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::EnhanceYourCalm as u32)
    );
    assert_eq!(c.goaway_for(Reason::HeaderBlock), 1);
    // A CONTINUATION with no block open.
    let (mut s, _, _) = open();
    let mut b = Vec::new();
    frame::put(&mut b, kind::CONTINUATION, flag::END_HEADERS, 1, &[0x82]);
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::Protocol as u32)
    );
}

#[test]
fn an_hpack_bomb_and_a_bad_block_end_the_connection() {
    let (mut s, _, c) = open();
    let mut block = vec![0x40, 0x01, b'x', 0x7f, 0xe9, 0x06];
    block.extend(std::iter::repeat_n(b'a', 1000));
    block.extend(std::iter::repeat_n(0xbe, 3000));
    let mut b = Vec::new();
    frame::headers(&mut b, 1, &block, true, 16_384);
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::EnhanceYourCalm as u32)
    );
    assert_eq!(c.goaway_for(Reason::HeaderList), 1);
    let (mut s, _, _) = open();
    let mut b = Vec::new();
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 1, &[0xc0]);
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::Compression as u32)
    );
}

#[test]
fn stream_ids_and_states_are_checked() {
    let (mut s, mut p, _) = open();
    let mut b = Vec::new();
    p.get(&mut b, 2, "/");
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::Protocol as u32)
    );
    let (mut s, _, _) = open();
    let mut b = Vec::new();
    frame::put(&mut b, kind::DATA, 0, 5, b"x");
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::Protocol as u32),
        "DATA on idle"
    );
    let (mut s, _, _) = open();
    let mut b = Vec::new();
    frame::put(&mut b, kind::DATA, 0, 0, b"x");
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::Protocol as u32),
        "DATA on 0"
    );
    let (mut s, _, _) = open();
    let mut b = Vec::new();
    frame::put(
        &mut b,
        kind::PUSH_PROMISE,
        flag::END_HEADERS,
        1,
        &[0, 0, 0, 2],
    );
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::Protocol as u32)
    );
    // DATA after END_STREAM: stream error STREAM_CLOSED.
    let (mut s, _, _) = open();
    let mut b = Vec::new();
    let mut p = Peer::new();
    p.get(&mut b, 1, "/");
    frame::put(&mut b, kind::DATA, 0, 1, b"x");
    let got = send(&mut s, b);
    assert_eq!(rst(&got, 1), Some(ErrorCode::StreamClosed as u32));
    assert!(!closing(&s));
    // Frame too large.
    let (mut s, _, _) = open();
    let mut b = Vec::new();
    frame::put(&mut b, kind::PING, 0, 0, &vec![0; 16_385]);
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::FrameSize as u32)
    );
}

#[test]
fn malformed_requests_are_reset_with_protocol_error() {
    let (mut s, _, c) = open();
    let mut enc = Encoder::new();
    let bads: Vec<Vec<(&[u8], &[u8])>> = vec![
        vec![(b":method", b"GET"), (b":scheme", b"http")],
        vec![
            (b":method", b"GET"),
            (b":path", b"/"),
            (b":scheme", b"http"),
            (b"Upper", b"x"),
        ],
        vec![
            (b":method", b"GET"),
            (b":path", b"/"),
            (b":scheme", b"http"),
            (b"connection", b"x"),
        ],
        vec![
            (b":method", b"GET"),
            (b":path", b"/"),
            (b"x", b"x"),
            (b":scheme", b"http"),
        ],
        vec![
            (b":method", b"GET"),
            (b":path", b"/"),
            (b":scheme", b"http"),
            (b":bogus", b"x"),
        ],
    ];
    let mut b = Vec::new();
    for (i, f) in bads.into_iter().enumerate() {
        let mut block = Vec::new();
        enc.encode(f, &mut block);
        frame::put(
            &mut b,
            kind::HEADERS,
            flag::END_HEADERS | flag::END_STREAM,
            1 + 2 * i as u32,
            &block,
        );
    }
    let got = send(&mut s, b);
    for i in 0..5 {
        assert_eq!(rst(&got, 1 + 2 * i), Some(ErrorCode::Protocol as u32));
    }
    assert!(s.poll_request().is_none());
    assert_eq!(c.rst_for(Reason::Malformed), 5);
}

#[test]
fn streams_over_the_limit_are_refused_and_reset_streams_keep_their_slot() {
    let cfg = H2Config {
        max_concurrent_streams: 2,
        ..H2Config::default()
    };
    let (mut s, mut p, c) = open_with(cfg);
    let mut b = Vec::new();
    p.get(&mut b, 1, "/");
    p.get(&mut b, 3, "/");
    send(&mut s, b);
    let r1 = s.poll_request().unwrap();
    let _r3 = s.poll_request().unwrap();
    // The peer resets both while the workers run them (rapid reset) ...
    let mut b = Vec::new();
    frame::rst_stream(&mut b, 1, ErrorCode::Cancel);
    frame::rst_stream(&mut b, 3, ErrorCode::Cancel);
    p.get(&mut b, 5, "/");
    let got = send(&mut s, b);
    // ... but they still hold their slots: stream 5 is refused.
    assert_eq!(rst(&got, 5), Some(ErrorCode::RefusedStream as u32));
    assert_eq!(c.rst_for(Reason::Refused), 1);
    // A worker finishing frees the slot; its reply is dropped.
    s.complete(r1.id, Some(Response::new(200).into_iovec()));
    assert!(drain(&mut s).is_empty());
    assert_eq!(c.replies_dropped.load(Ordering::Relaxed), 1);
    let mut b = Vec::new();
    p.get(&mut b, 7, "/");
    send(&mut s, b);
    assert_eq!(s.poll_request().unwrap().id, 7);
}

#[test]
fn rapid_reset_and_control_floods_exhaust_the_budget() {
    let cfg = H2Config {
        flood_budget: 50,
        ..H2Config::default()
    };
    let (mut s, mut p, c) = open_with(cfg.clone());
    let mut b = Vec::new();
    for i in 0..100u32 {
        let id = 1 + 2 * i;
        p.get(&mut b, id, "/");
        frame::rst_stream(&mut b, id, ErrorCode::Cancel);
    }
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::EnhanceYourCalm as u32)
    );
    assert_eq!(c.goaway_for(Reason::Flood), 1);
    for flood in 0..3 {
        let (mut s, _, _) = open_with(H2Config {
            counters: Arc::new(H2Counters::default()),
            ..cfg.clone()
        });
        let mut b = Vec::new();
        for _ in 0..100 {
            match flood {
                0 => frame::put(&mut b, kind::PING, 0, 0, &[1; 8]),
                1 => frame::settings(&mut b, &[]),
                _ => frame::put(&mut b, 0xfa, 0, 0, b"unknown"),
            }
        }
        assert_eq!(
            goaway_code(&send(&mut s, b)),
            Some(ErrorCode::EnhanceYourCalm as u32),
            "{flood}"
        );
    }
    // Empty DATA frames that never end the stream.
    let (mut s, mut p, _) = open_with(H2Config {
        counters: Arc::new(H2Counters::default()),
        ..cfg.clone()
    });
    let mut b = Vec::new();
    let block = p.block("/");
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 1, &block);
    for _ in 0..100 {
        frame::put(&mut b, kind::DATA, 0, 1, &[]);
    }
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::EnhanceYourCalm as u32)
    );
}

#[test]
fn completed_responses_earn_budget_back_so_busy_clients_are_not_cut_off() {
    let cfg = H2Config {
        flood_budget: 50,
        ..H2Config::default()
    };
    let (mut s, mut p, _) = open_with(cfg);
    for round in 0..200u32 {
        let id = 1 + 2 * round;
        let mut b = Vec::new();
        p.get(&mut b, id, "/");
        frame::put(&mut b, kind::PING, 0, 0, &[2; 8]);
        send(&mut s, b);
        let r = s.poll_request().unwrap();
        reply(&mut s, r.id, b"ok");
    }
    assert!(!closing(&s));
}

/// The status of the HEADERS the session sent on `id`, whether it ended the stream, and
/// its decoded fields.
fn answer(got: &Got, p: &mut Peer, id: u32) -> (bool, Vec<Field>) {
    let (h, blk) = got
        .iter()
        .find(|(h, _)| h.kind == kind::HEADERS && h.stream == id)
        .expect("a HEADERS");
    (h.flags & flag::END_STREAM != 0, p.dec.decode(blk).unwrap())
}

/// A body over `max_body` gets `H2Config::too_large` (413 by default) from the session, in
/// one HEADERS with END_STREAM, then RST_STREAM NO_ERROR while the client is still
/// sending; what it sent meanwhile is ignored; the connection goes on. It used to be
/// RST_STREAM REFUSED_STREAM, which says "not processed, retry" (RFC 9113 §8.7): a client
/// would resend a body this server never takes (outside test 2026-12-07, finding 6).
#[test]
fn a_body_over_the_cap_is_answered_413_and_the_connection_goes_on() {
    let cfg = H2Config {
        max_body: 10,
        ..H2Config::default()
    };
    let (mut s, mut p, c) = open_with(cfg);
    let mut b = Vec::new();
    let block = p.block("/");
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 1, &block);
    frame::put(&mut b, kind::DATA, 0, 1, &[0; 6]);
    frame::put(&mut b, kind::DATA, 0, 1, &[0; 6]);
    frame::put(&mut b, kind::DATA, flag::END_STREAM, 1, &[0; 6]);
    p.get(&mut b, 3, "/");
    let got = send(&mut s, b);
    let (end, hs) = answer(&got, &mut p, 1);
    assert!(end);
    assert_eq!(hs[0], (b":status".to_vec(), b"413".to_vec()));
    assert!(hs.contains(&(b"content-length".to_vec(), b"0".to_vec())));
    assert_eq!(rst(&got, 1), Some(ErrorCode::NoError as u32));
    assert!(!got.iter().any(|(h, _)| h.kind == kind::DATA));
    assert_eq!(goaway_code(&got), None);
    assert_eq!(c.too_large.load(Ordering::Relaxed), 1);
    assert_eq!(s.poll_request().unwrap().id, 3);
    assert!(s.poll_request().is_none());
    assert_eq!(s.buffered(), 0);
    // The DATA that passes the cap ends the stream: the answer, and no reset.
    let (mut s, mut p, _) = open_with(H2Config {
        max_body: 10,
        ..H2Config::default()
    });
    let mut b = Vec::new();
    let block = p.block("/");
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 1, &block);
    frame::put(&mut b, kind::DATA, flag::END_STREAM, 1, &[0; 11]);
    let got = send(&mut s, b);
    assert_eq!(answer(&got, &mut p, 1).1[0].1, b"413");
    assert_eq!(rst(&got, 1), None);
    assert_eq!(s.open_streams(), 0);
}

/// A content-length over `max_body` is answered at once, before any DATA is taken.
#[test]
fn a_content_length_over_the_cap_is_answered_before_the_body() {
    let (mut s, mut p, c) = open_with(H2Config {
        max_body: 10,
        ..H2Config::default()
    });
    let mut b = Vec::new();
    let mut block = Vec::new();
    p.enc.encode(
        vec![
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/echo"),
            (b"content-length", b"11"),
        ],
        &mut block,
    );
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 1, &block);
    let got = send(&mut s, b);
    assert_eq!(answer(&got, &mut p, 1).1[0].1, b"413");
    assert_eq!(rst(&got, 1), Some(ErrorCode::NoError as u32));
    assert_eq!(c.too_large.load(Ordering::Relaxed), 1);
    // Its body, sent before the client saw the answer, is ignored.
    let mut b = Vec::new();
    frame::put(&mut b, kind::DATA, flag::END_STREAM, 1, &[0; 11]);
    let got = send(&mut s, b);
    assert_eq!(goaway_code(&got), None);
    assert!(s.poll_request().is_none());
}

/// gRPC (`grpc::limit_messages`): a call whose message is over the limit gets
/// RESOURCE_EXHAUSTED (grpc-status 8 and a grpc-message) in one Trailers-Only HEADERS, as
/// grpc-go and grpc-java servers answer, then RST_STREAM NO_ERROR to stop the upload; a
/// message at the limit reaches a worker. Before: past the 1 MiB `max_body`, RST_STREAM
/// REFUSED_STREAM (UNAVAILABLE to the client, which retry policies resend). A flow-control
/// relief refusal stays REFUSED_STREAM (retrying it is right):
/// `unfinished_bodies_past_the_buffer_refuse_the_newest_so_the_rest_can_finish`.
#[test]
fn a_grpc_message_over_the_limit_is_resource_exhausted_not_refused() {
    use crate::proto::grpc;
    let max = 1000;
    let mut cfg = H2Config::default();
    grpc::limit_messages(&mut cfg, max);
    let (mut s, mut p, c) = open_with(cfg);
    let call = |p: &mut Peer, b: &mut Vec<u8>, id: u32, len: usize| {
        let mut block = Vec::new();
        p.enc.encode(
            vec![
                (&b":method"[..], &b"POST"[..]),
                (b":scheme", b"http"),
                (b":path", b"/luna.Echo/Echo"),
                (b"content-type", b"application/grpc"),
                (b"te", b"trailers"),
            ],
            &mut block,
        );
        frame::put(b, kind::HEADERS, flag::END_HEADERS, id, &block);
        let mut m = vec![0u8];
        m.extend_from_slice(&(len as u32).to_be_bytes());
        m.resize(5 + len, 7);
        let chunks: Vec<&[u8]> = m.chunks(400).collect();
        for (i, ch) in chunks.iter().enumerate() {
            let f = if i + 1 == chunks.len() {
                flag::END_STREAM
            } else {
                0
            };
            frame::put(b, kind::DATA, f, id, ch);
        }
    };
    let mut b = Vec::new();
    // Over by 500: the limit is passed by the third of four DATA frames.
    call(&mut p, &mut b, 1, max + 500);
    call(&mut p, &mut b, 3, max);
    let got = send(&mut s, b);
    let (end, hs) = answer(&got, &mut p, 1);
    assert!(end, "Trailers-Only: one HEADERS ends the stream");
    let field = |n: &str| {
        hs.iter()
            .find(|(k, _)| k == n.as_bytes())
            .map(|(_, v)| v.clone())
    };
    assert_eq!(field(":status").unwrap(), b"200");
    assert_eq!(field("content-type").unwrap(), b"application/grpc");
    assert_eq!(field("grpc-status").unwrap(), b"8");
    let msg = String::from_utf8(field("grpc-message").unwrap()).unwrap();
    assert!(msg.contains("larger than max (1000 bytes)"), "{msg}");
    assert_eq!(field("content-length"), None);
    assert_eq!(rst(&got, 1), Some(ErrorCode::NoError as u32));
    assert_eq!(
        c.rst_for(Reason::Refused) + c.rst_for(Reason::BufferFull),
        0
    );
    assert_eq!(c.too_large.load(Ordering::Relaxed), 1);
    let r = s.poll_request().unwrap();
    assert_eq!(r.id, 3);
    let req = Request::parse(&r.body).unwrap();
    let call = grpc::unary(&req, max).unwrap();
    assert_eq!(call.message.len(), max);
    assert_eq!(goaway_code(&got), None);
}

#[test]
fn an_abandoned_or_bad_reply_resets_the_stream() {
    let (mut s, mut p, c) = open();
    let mut b = Vec::new();
    p.get(&mut b, 1, "/");
    p.get(&mut b, 3, "/");
    send(&mut s, b);
    let (a, bb) = (s.poll_request().unwrap(), s.poll_request().unwrap());
    s.complete(a.id, None);
    s.complete(bb.id, Some(IoVec::from(Zbuf::copy_from_slice(b"junk"))));
    let got = drain(&mut s);
    assert_eq!(rst(&got, 1), Some(ErrorCode::Internal as u32));
    assert_eq!(rst(&got, 3), Some(ErrorCode::Internal as u32));
    assert_eq!(c.rst_for(Reason::BadReply), 2);
    assert_eq!(s.open_streams(), 0);
}

#[test]
fn trailers_and_big_replies_are_framed_within_max_frame_size() {
    let (mut s, mut p, _) = open();
    let mut b = Vec::new();
    p.get(&mut b, 1, "/");
    send(&mut s, b);
    let r = s.poll_request().unwrap();
    let resp = Response::new(200)
        .body(IoVec::from(Zbuf::from_vec(vec![1u8; 40_000])))
        .trailers(vec![(b"grpc-status".to_vec(), b"0".to_vec())]);
    s.complete(r.id, Some(resp.into_iovec()));
    let got = drain(&mut s);
    let sizes: Vec<_> = got
        .iter()
        .filter(|(h, _)| h.kind == kind::DATA)
        .map(|(h, _)| (h.len, h.flags))
        .collect();
    assert_eq!(sizes, vec![(16_384, 0), (16_384, 0), (7_232, 0)]);
    let last = got.last().unwrap();
    assert_eq!(
        (last.0.kind, last.0.flags),
        (kind::HEADERS, flag::END_HEADERS | flag::END_STREAM)
    );
    let _ = p.dec.decode(&got[0].1).unwrap();
    assert_eq!(
        p.dec.decode(&last.1).unwrap(),
        vec![(b"grpc-status".to_vec(), b"0".to_vec())]
    );
}

#[test]
fn the_peers_goaway_ends_the_session_once_its_streams_are_answered() {
    let (mut s, mut p, _) = open();
    let mut b = Vec::new();
    p.get(&mut b, 1, "/");
    frame::goaway(&mut b, 0, ErrorCode::NoError, b"");
    p.get(&mut b, 3, "/");
    send(&mut s, b);
    let r = s.poll_request().unwrap();
    assert!(s.poll_request().is_none(), "no new streams after GOAWAY");
    assert_eq!(s.state(), SessionState::Open);
    reply(&mut s, r.id, b"x");
    assert_eq!(s.state(), SessionState::Done);
}

/// Input is not processed while too much output waits: a PING flood from a peer that
/// does not read cannot grow the output queue beyond the bound.
#[test]
fn output_is_bounded_while_the_peer_does_not_read() {
    let cfg = H2Config {
        max_output: 1000,
        flood_budget: 1_000_000,
        ..H2Config::default()
    };
    let (mut s, _, _) = open_with(cfg);
    let mut b = Vec::new();
    for _ in 0..10_000 {
        frame::put(&mut b, kind::PING, 0, 0, &[3; 8]);
    }
    s.push(Zbuf::from_vec(b));
    assert!(s.out_len() < 1000 + 17);
    assert!(!s.wants_input());
    let mut total = 0;
    while let Some(t) = s.poll_transmit() {
        total += t.len();
    }
    assert_eq!(
        total,
        10_000 * 17,
        "every PING answered once the output drains"
    );
}

/// The high-water marks see what a session held at its peak, even when the same input
/// frees it again (a stream opened and reset, a body buffered and reset), and each
/// stays within its bound.
#[test]
fn high_water_marks_follow_what_a_session_holds() {
    // A CONTINUATION flood: 1 byte of HEADERS, then 1-byte CONTINUATIONs until the 33rd
    // is one too many (max_continuations 32): the block peaked at 33 bytes.
    let (mut s, _, c) = open();
    let mut b = Vec::new();
    frame::put(&mut b, kind::HEADERS, 0, 1, &[0x82]);
    for _ in 0..40 {
        frame::put(&mut b, kind::CONTINUATION, 0, 1, &[0x82]);
    }
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::EnhanceYourCalm as u32)
    );
    assert_eq!(c.hwm(Mark::HeaderBlock), 33);

    // Rapid reset within one input: a stream opened with 500 body bytes, then reset.
    let (mut s, mut p, c) = open();
    let mut b = Vec::new();
    let block = p.block("/echo");
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 1, &block);
    frame::put(&mut b, kind::DATA, 0, 1, &[1u8; 500]);
    frame::rst_stream(&mut b, 1, ErrorCode::Cancel);
    send(&mut s, b);
    assert_eq!((s.open_streams(), s.buffered()), (0, 0));
    assert_eq!(c.hwm(Mark::Streams), 1);
    assert_eq!(c.hwm(Mark::Buffered), 500);

    // Replies held by a zero window: 3 x 1,000 bytes, released by WINDOW_UPDATEs.
    let (mut s, mut p, c) = open();
    let mut b = Vec::new();
    frame::settings(&mut b, &[(setting::INITIAL_WINDOW_SIZE, 0)]);
    for id in [1, 3, 5] {
        p.get(&mut b, id, "/");
    }
    send(&mut s, b);
    while let Some(r) = s.poll_request() {
        reply(&mut s, r.id, &[9u8; 1000]);
    }
    assert_eq!(s.held_replies(), 3000);
    let mut b = Vec::new();
    for id in [1, 3, 5] {
        frame::window_update(&mut b, id, 1000);
    }
    let got = send(&mut s, b);
    let sent: usize = got
        .iter()
        .filter(|(h, _)| h.kind == kind::DATA)
        .map(|(_, p)| p.len())
        .sum();
    assert_eq!(sent, 3000);
    assert_eq!((s.held_replies(), s.open_streams()), (0, 0));
    assert_eq!(c.hwm(Mark::HeldReplies), 3000);
    assert_eq!(c.hwm(Mark::Streams), 3);
    assert!(c.hwm(Mark::Output) > 0 && c.hwm(Mark::Input) > 0);
    // Reported with the other counters.
    let f = c.fields();
    assert!(
        f.contains(&("hwm_held_reply_bytes".to_string(), 3000)),
        "{f:?}"
    );
}

#[test]
fn a_head_response_ends_with_its_headers_and_sends_no_data() {
    let (mut s, mut p, _c) = open();
    let f: Vec<(&[u8], &[u8])> = vec![
        (b":method", b"HEAD"),
        (b":scheme", b"http"),
        (b":path", b"/big"),
        (b":authority", b"x"),
    ];
    let mut block = Vec::new();
    p.enc.encode(f, &mut block);
    let mut b = Vec::new();
    frame::put(
        &mut b,
        kind::HEADERS,
        flag::END_HEADERS | flag::END_STREAM,
        1,
        &block,
    );
    send(&mut s, b);
    let r = s.poll_request().expect("the HEAD request");
    let got = reply(&mut s, r.id, &[7u8; 1000]);
    let h = got
        .iter()
        .find(|(h, _)| h.kind == kind::HEADERS && h.stream == 1)
        .expect("HEADERS");
    assert_ne!(
        h.0.flags & flag::END_STREAM,
        0,
        "HEAD response must end with HEADERS"
    );
    let fields = p.dec.decode(&h.1).unwrap();
    assert!(fields
        .iter()
        .any(|(n, v)| n == b"content-length" && v == b"1000"));
    assert!(
        !got.iter().any(|(h, _)| h.kind == kind::DATA),
        "no DATA for HEAD"
    );
    assert_eq!(s.open_streams(), 0);
    // The connection goes on: a GET afterwards gets its body.
    let mut b = Vec::new();
    p.get(&mut b, 3, "/");
    send(&mut s, b);
    let r = s.poll_request().expect("the GET");
    let got = reply(&mut s, r.id, b"abc");
    assert!(got.iter().any(|(h, d)| h.kind == kind::DATA && d == b"abc"));
}

/// Unfinished bodies over `max_buffered` with the connection window spent: before the
/// fix no stream could finish and no credit came back (six 1 MB uploads on one
/// connection hung until the send timeout). Now the newest unfinished streams are
/// refused until the rest fits, the window reopens, and the others complete; nothing is
/// refused while a finished body waits for dispatch (its dispatch frees the bytes).
#[test]
fn unfinished_bodies_past_the_buffer_refuse_the_newest_so_the_rest_can_finish() {
    let cfg = H2Config {
        conn_window: 65_535,
        max_buffered: 32_768,
        ..H2Config::default()
    };
    let (mut s, mut p, c) = open_with(cfg);
    let mut b = Vec::new();
    for id in [1u32, 3, 5, 7] {
        let block = p.block("/echo");
        frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, id, &block);
        frame::put(&mut b, kind::DATA, 0, id, &[id as u8; 16_000]);
    }
    let got = send(&mut s, b);
    assert_eq!(
        rst(&got, 7),
        Some(ErrorCode::RefusedStream as u32),
        "{got:?}"
    );
    assert_eq!(rst(&got, 5), Some(ErrorCode::RefusedStream as u32));
    assert_eq!(
        (rst(&got, 1), rst(&got, 3)),
        (None, None),
        "the oldest go on"
    );
    let credit: u32 = got
        .iter()
        .filter(|(h, _)| h.kind == kind::WINDOW_UPDATE && h.stream == 0)
        .map(|(_, p)| u32::from_be_bytes([p[0], p[1], p[2], p[3]]))
        .sum();
    assert_eq!(credit, 64_000, "the connection window reopens");
    assert_eq!(s.buffered(), 32_000);
    assert_eq!(c.rst_for(Reason::BufferFull), 2);
    let mut b = Vec::new();
    for id in [1u32, 3] {
        frame::put(&mut b, kind::DATA, flag::END_STREAM, id, &[id as u8; 1_000]);
    }
    send(&mut s, b);
    let mut bodies = Vec::new();
    while let Some(r) = s.poll_request() {
        bodies.push((r.id, Request::parse(&r.body).unwrap().body.len()));
    }
    bodies.sort();
    assert_eq!(bodies, vec![(1, 17_000), (3, 17_000)]);
    assert_eq!(s.buffered(), 0);

    // A finished body waiting for its dispatch: no refusal (dispatching it frees its
    // bytes and reopens the window). (A new configuration: its counters are new.)
    let (mut s, mut p, c) = open_with(H2Config {
        conn_window: 65_535,
        max_buffered: 32_768,
        ..H2Config::default()
    });
    let mut b = Vec::new();
    for id in [1u32, 3, 5, 7] {
        let block = p.block("/echo");
        frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, id, &block);
        let end = if id == 1 { flag::END_STREAM } else { 0 };
        frame::put(&mut b, kind::DATA, end, id, &[1u8; 16_000]);
    }
    let got = send(&mut s, b);
    assert!(
        got.iter().all(|(h, _)| h.kind != kind::RST_STREAM),
        "{got:?}"
    );
    assert_eq!(c.rst_for(Reason::BufferFull), 0);
    assert!(s.poll_request().is_some());
    assert_eq!(s.buffered(), 48_000);
}

/// A body past SPILL_MIN is copied out of the received buffers as its DATA arrives (held
/// zero copy until END_STREAM it pinned one NIC receive buffer per segment): the buffers
/// are released before the stream ends, and the worker gets the body whole and exact.
#[test]
fn a_large_body_releases_the_received_buffers_before_the_stream_ends() {
    let (mut s, mut p, _) = open();
    let block = p.block("/echo");
    let mut b = Vec::new();
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 1, &block);
    send(&mut s, b);
    let mut kept = Vec::new();
    let mut want = Vec::new();
    for i in 0..5u8 {
        let payload = vec![i; 10_000];
        want.extend_from_slice(&payload);
        let end = if i == 4 { flag::END_STREAM } else { 0 };
        let mut b = Vec::new();
        frame::put(&mut b, kind::DATA, end, 1, &payload);
        let z = Zbuf::from_vec(b);
        kept.push(z.clone());
        s.push(z);
        drain(&mut s);
        if i == 2 {
            let held: Vec<usize> = kept.iter().map(|z| z.ref_count()).collect();
            assert!(held.iter().all(|&n| n == 1), "pinned mid-stream: {held:?}");
            assert_eq!(s.buffered(), 30_000);
        }
    }
    let r = s.poll_request().unwrap();
    let req = Request::parse(&r.body).unwrap();
    assert_eq!(req.body.to_vec(), want);
    assert_eq!(s.buffered(), 0);
    // A small body stays zero copy: a slice of what was received.
    let mut b = Vec::new();
    let block = p.block("/echo");
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 3, &block);
    frame::put(&mut b, kind::DATA, flag::END_STREAM, 3, &[9u8; 100]);
    let z = Zbuf::from_vec(b);
    s.push(z.clone());
    drain(&mut s);
    let r = s.poll_request().unwrap();
    let req = Request::parse(&r.body).unwrap();
    assert!(req.body.segments().iter().all(|x| x.same_object(&z)));
}

/// A small body in many tiny DATA frames (each in its own receive buffer) pins at most
/// `framer::SPILL_PIECES` of them before its stream ends: past that it is copied out, as
/// a large one is, and arrives intact.
#[test]
fn a_body_in_tiny_data_frames_pins_a_bounded_number_of_received_buffers() {
    let (mut s, mut p, _) = open();
    let block = p.block("/echo");
    let mut b = Vec::new();
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 1, &block);
    send(&mut s, b);
    let (mut kept, mut want) = (Vec::new(), Vec::new());
    for i in 0..300u32 {
        let byte = [(i % 251) as u8];
        want.push(byte[0]);
        let end = if i == 299 { flag::END_STREAM } else { 0 };
        let mut b = Vec::new();
        frame::put(&mut b, kind::DATA, end, 1, &byte);
        let z = Zbuf::from_vec(b);
        kept.push(z.clone());
        s.push(z);
        drain(&mut s);
        if i < 299 {
            let pinned = kept.iter().filter(|z| z.ref_count() > 1).count();
            assert!(
                pinned <= crate::framer::SPILL_PIECES,
                "{pinned} buffers pinned after {} frames",
                i + 1
            );
        }
    }
    let r = s.poll_request().unwrap();
    let req = Request::parse(&r.body).unwrap();
    assert_eq!(req.body.to_vec(), want);
}

/// Frames that make no progress cost flood budget, PING and SETTINGS acknowledgements and
/// WINDOW_UPDATEs on ended streams included (an outside test sent 200,000 of each free).
#[test]
fn acks_and_window_updates_on_ended_streams_are_charged() {
    for flood in ["ping_ack", "settings_ack", "window_update_ended"] {
        let cfg = H2Config {
            flood_budget: 50,
            ..H2Config::default()
        };
        let (mut s, mut p, _) = open_with(cfg);
        let mut b = Vec::new();
        p.get(&mut b, 1, "/");
        send(&mut s, b);
        let r = s.poll_request().unwrap();
        reply(&mut s, r.id, b"ok");
        let mut b = Vec::new();
        for _ in 0..100 {
            match flood {
                "ping_ack" => frame::put(&mut b, kind::PING, flag::ACK, 0, &[0; 8]),
                "settings_ack" => frame::put(&mut b, kind::SETTINGS, flag::ACK, 0, &[]),
                _ => frame::window_update(&mut b, 1, 100),
            }
        }
        assert_eq!(
            goaway_code(&send(&mut s, b)),
            Some(ErrorCode::EnhanceYourCalm as u32),
            "{flood}"
        );
    }
}

/// RFC 9113 §5.1.1: a client opens odd ids, each above every id it opened before. A
/// HEADERS on a lower id it skipped, or on an even id (below or above the last one), is a
/// connection error PROTOCOL_ERROR, counted as `stream_id`. An outside test found the
/// lower id silently ignored (the client waited forever) and the even id below the last
/// one ignored too.
#[test]
fn headers_on_a_lower_or_an_even_id_is_a_connection_error() {
    for (ids, what) in [
        (&[5u32, 3][..], "lower id"),
        (&[5, 4][..], "even id below the last"),
        (&[5, 6][..], "even id above the last"),
        (&[1, 1201, 3][..], "lower id far below the last"),
    ] {
        let (mut s, mut p, c) = open();
        let mut b = Vec::new();
        for &id in ids {
            p.get(&mut b, id, "/");
        }
        let got = send(&mut s, b);
        assert_eq!(
            goaway_code(&got),
            Some(ErrorCode::Protocol as u32),
            "{what}"
        );
        assert_eq!(c.goaway_for(Reason::StreamId), 1, "{what}");
        // The earlier streams were still taken: GOAWAY's last-stream-id says so.
        let (_, p) = got.iter().find(|(h, _)| h.kind == kind::GOAWAY).unwrap();
        let last = ids.iter().copied().filter(|i| i % 2 == 1).max().unwrap();
        assert_eq!(u32::from_be_bytes([p[0], p[1], p[2], p[3]]), last, "{what}");
    }
}

/// DATA, WINDOW_UPDATE and RST_STREAM on an idle stream are connection errors
/// PROTOCOL_ERROR (RFC 9113 §5.1): above the highest id opened (already so), and on an
/// even id below it, which the client can never have opened (was ignored at a cost).
#[test]
fn frames_on_an_idle_even_stream_are_connection_errors() {
    for k in [kind::DATA, kind::WINDOW_UPDATE, kind::RST_STREAM] {
        let (mut s, mut p, c) = open();
        let mut b = Vec::new();
        p.get(&mut b, 5, "/");
        match k {
            kind::DATA => frame::put(&mut b, kind::DATA, 0, 2, b"x"),
            kind::WINDOW_UPDATE => frame::window_update(&mut b, 2, 10),
            _ => frame::rst_stream(&mut b, 2, ErrorCode::Cancel),
        }
        let got = send(&mut s, b);
        assert_eq!(goaway_code(&got), Some(ErrorCode::Protocol as u32), "{k}");
        assert_eq!(c.goaway_for(Reason::StreamId), 1, "{k}");
    }
    // PRIORITY may name any stream, idle ones included.
    let (mut s, mut p, _) = open();
    let mut b = Vec::new();
    p.get(&mut b, 5, "/");
    frame::put(&mut b, kind::PRIORITY, 0, 2, &[0, 0, 0, 0, 16]);
    frame::put(&mut b, kind::PRIORITY, 0, 9, &[0, 0, 0, 0, 16]);
    let got = send(&mut s, b);
    assert_eq!(goaway_code(&got), None);
}

/// RFC 9113 §5.1, "closed": what a frame on a closed stream gets depends on how the stream
/// closed. After both END_STREAMs the peer knows it is closed: HEADERS or DATA on it is a
/// connection error STREAM_CLOSED (an outside test saw a HEADERS reusing a completed id
/// ignored). After the peer's RST_STREAM: stream error STREAM_CLOSED. After ours: the
/// peer may have sent them before it saw the reset, so they are ignored (at a cost, and
/// the header block still decoded so HPACK stays in step). WINDOW_UPDATE and RST_STREAM
/// may be in flight after either END_STREAM or reset: ignored at a cost.
#[test]
fn frames_on_a_closed_stream_follow_how_it_closed() {
    // Completed: both END_STREAMs.
    let completed = |p: &mut Peer, s: &mut H2Session| {
        let mut b = Vec::new();
        p.get(&mut b, 1, "/");
        send(s, b);
        let r = s.poll_request().unwrap();
        reply(s, r.id, b"ok");
        assert_eq!(s.open_streams(), 0);
    };
    let (mut s, mut p, c) = open();
    completed(&mut p, &mut s);
    let mut b = Vec::new();
    p.get(&mut b, 1, "/again");
    let got = send(&mut s, b);
    assert_eq!(goaway_code(&got), Some(ErrorCode::StreamClosed as u32));
    assert_eq!(c.goaway_for(Reason::StreamClosed), 1);
    assert!(s.poll_request().is_none());
    let (mut s, mut p, _) = open();
    completed(&mut p, &mut s);
    let mut b = Vec::new();
    frame::put(&mut b, kind::DATA, flag::END_STREAM, 1, b"late");
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::StreamClosed as u32)
    );
    let (mut s, mut p, _) = open();
    completed(&mut p, &mut s);
    let mut b = Vec::new();
    frame::window_update(&mut b, 1, 100);
    frame::rst_stream(&mut b, 1, ErrorCode::Cancel);
    p.get(&mut b, 3, "/");
    let got = send(&mut s, b);
    assert_eq!(goaway_code(&got), None, "in flight after END_STREAM");
    assert_eq!(s.poll_request().unwrap().id, 3);

    // Reset by the peer: stream error, the connection goes on.
    let (mut s, mut p, c) = open();
    let mut b = Vec::new();
    let block = p.block("/echo");
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 1, &block);
    frame::rst_stream(&mut b, 1, ErrorCode::Cancel);
    frame::put(&mut b, kind::DATA, 0, 1, b"after its own reset");
    p.get(&mut b, 3, "/");
    let got = send(&mut s, b);
    assert_eq!(rst(&got, 1), Some(ErrorCode::StreamClosed as u32));
    assert_eq!(goaway_code(&got), None);
    assert_eq!(c.rst_for(Reason::StreamClosed), 1);
    assert_eq!(s.poll_request().unwrap().id, 3);

    // Reset by us (a body over the cap): the peer's DATA and trailers sent before it saw
    // the reset are ignored, the trailers' block still decoded.
    let cfg = H2Config {
        max_body: 4,
        ..H2Config::default()
    };
    let (mut s, mut p, c) = open_with(cfg);
    let mut b = Vec::new();
    let block = p.block("/echo");
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 1, &block);
    frame::put(&mut b, kind::DATA, 0, 1, b"too long");
    frame::put(&mut b, kind::DATA, 0, 1, b"more");
    let mut t = Vec::new();
    p.enc
        .encode(vec![(&b"x-trailer"[..], &b"indexed now"[..])], &mut t);
    frame::put(
        &mut b,
        kind::HEADERS,
        flag::END_HEADERS | flag::END_STREAM,
        1,
        &t,
    );
    // The next request refers to the trailer the dynamic table now holds.
    p.get_with(&mut b, 3, b"/next", (b"x-trailer", b"indexed now"));
    let got = send(&mut s, b);
    assert_eq!(goaway_code(&got), None);
    // One reset, the one after the 413; none for the frames that followed it.
    let resets: Vec<_> = got
        .iter()
        .filter(|(h, _)| h.kind == kind::RST_STREAM)
        .collect();
    assert_eq!(resets.len(), 1);
    assert_eq!(rst(&got, 1), Some(ErrorCode::NoError as u32));
    assert_eq!(c.too_large.load(Ordering::Relaxed), 1);
    let req = Request::parse(&s.poll_request().unwrap().body).unwrap();
    assert_eq!(req.path(), b"/next");
    assert_eq!(req.header("x-trailer"), Some(&b"indexed now"[..]));
    assert_eq!(s.buffered(), 0);
}

/// The history of closed streams is bounded (the last 512 ids): a frame on a stream
/// older than that is treated as on a stream we reset, ignored at a cost, never a
/// connection error for what may be in flight; but a request's header block there can
/// only reuse an id, PROTOCOL_ERROR.
#[test]
fn streams_older_than_the_history_are_ignored_unless_a_request_reuses_them() {
    let (mut s, mut p, _) = open();
    let mut b = Vec::new();
    p.get(&mut b, 1, "/");
    send(&mut s, b);
    let r = s.poll_request().unwrap();
    reply(&mut s, r.id, b"ok");
    let mut b = Vec::new();
    p.get(&mut b, 1025, "/");
    frame::put(&mut b, kind::DATA, 0, 1, b"old");
    let mut t = Vec::new();
    p.enc.encode(vec![(&b"x-t"[..], &b"1"[..])], &mut t);
    frame::put(
        &mut b,
        kind::HEADERS,
        flag::END_HEADERS | flag::END_STREAM,
        1,
        &t,
    );
    let got = send(&mut s, b);
    assert_eq!(goaway_code(&got), None);
    assert_eq!(s.poll_request().unwrap().id, 1025);
    let mut b = Vec::new();
    p.get(&mut b, 1, "/reused");
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::Protocol as u32)
    );
}

/// An edit of a header list: (index, None) removes the field there, (index, Some(field))
/// inserts one.
type Edit = (usize, Option<(&'static [u8], &'static [u8])>);

/// A header list with `:method GET`, `:scheme http`, `:path /`, `:authority x`, with
/// `edit` applied.
fn request_with(edit: &[Edit]) -> Vec<Field> {
    let mut f: Vec<Field> = [
        (&b":method"[..], &b"GET"[..]),
        (b":scheme", b"http"),
        (b":path", b"/"),
        (b":authority", b"x"),
    ]
    .iter()
    .map(|(n, v)| (n.to_vec(), v.to_vec()))
    .collect();
    for (at, e) in edit {
        match e {
            None => {
                f.remove(*at);
            }
            Some((n, v)) => f.insert(*at, (n.to_vec(), v.to_vec())),
        }
    }
    f
}

/// Sends each header list as a request (HEADERS with END_STREAM) on streams 1, 3, ...;
/// returns the frames and the ids of the requests handed to workers.
fn requests(s: &mut H2Session, lists: &[Vec<Field>]) -> (Got, Vec<u64>) {
    let mut enc = Encoder::new();
    let mut b = Vec::new();
    for (i, f) in lists.iter().enumerate() {
        let mut block = Vec::new();
        enc.encode(f.iter().map(|(n, v)| (&n[..], &v[..])), &mut block);
        let id = 1 + 2 * i as u32;
        frame::put(
            &mut b,
            kind::HEADERS,
            flag::END_HEADERS | flag::END_STREAM,
            id,
            &block,
        );
    }
    let got = send(s, b);
    let mut ids = Vec::new();
    while let Some(r) = s.poll_request() {
        ids.push(r.id);
    }
    (got, ids)
}

/// RFC 9113 §8.2, §8.2.1, §8.2.2, §8.3, §8.3.1, §8.5: each of these requests is malformed
/// and gets a stream error PROTOCOL_ERROR, never a worker. An outside test had CR/LF/NUL
/// in values, a space in a name, a duplicate `:authority` and CONNECT with `:path` and
/// `:scheme` served (the workers got the header values as they were).
#[test]
fn malformed_requests_per_rfc_9113_section_8_are_reset_not_served() {
    type E = &'static [Edit];
    let bads: &[(&str, E)] = &[
        ("space in a name", &[(4, Some((b"x a", b"1")))]),
        ("colon in a name", &[(4, Some((b"x:a", b"1")))]),
        ("upper case in a name", &[(4, Some((b"X-a", b"1")))]),
        ("empty name", &[(4, Some((b"", b"1")))]),
        ("DEL in a name", &[(4, Some((b"x\x7f", b"1")))]),
        (
            "CR LF in a value",
            &[(4, Some((b"x", b"1\r\nx-injected: 2")))],
        ),
        ("LF in a value", &[(4, Some((b"x", b"1\nx")))]),
        ("NUL in a value", &[(4, Some((b"x", b"1\0")))]),
        ("other control in a value", &[(4, Some((b"x", b"1\x01")))]),
        ("leading space", &[(4, Some((b"x", b" 1")))]),
        ("trailing tab", &[(4, Some((b"x", b"1\t")))]),
        (
            "CR LF in :path",
            &[(2, None), (2, Some((b":path", b"/\r\nx")))],
        ),
        ("connection", &[(4, Some((b"connection", b"close")))]),
        ("keep-alive", &[(4, Some((b"keep-alive", b"5")))]),
        (
            "proxy-connection",
            &[(4, Some((b"proxy-connection", b"x")))],
        ),
        (
            "transfer-encoding",
            &[(4, Some((b"transfer-encoding", b"chunked")))],
        ),
        ("upgrade", &[(4, Some((b"upgrade", b"h2c")))]),
        ("te other than trailers", &[(4, Some((b"te", b"gzip")))]),
        ("duplicate :authority", &[(4, Some((b":authority", b"y")))]),
        (
            "host differs from :authority",
            &[(4, Some((b"host", b"y")))],
        ),
        ("host with another port", &[(4, Some((b"host", b"x:8080")))]),
        (
            "two host fields",
            &[
                (3, None),
                (3, Some((b"host", b"x"))),
                (4, Some((b"host", b"x"))),
            ],
        ),
        ("duplicate :method", &[(1, Some((b":method", b"GET")))]),
        ("duplicate :path", &[(3, Some((b":path", b"/")))]),
        ("duplicate :scheme", &[(2, Some((b":scheme", b"http")))]),
        ("unknown pseudo-header", &[(4, Some((b":bogus", b"1")))]),
        ("response pseudo-header", &[(4, Some((b":status", b"200")))]),
        (
            "extended CONNECT not offered",
            &[(4, Some((b":protocol", b"ws")))],
        ),
        ("pseudo-header after a field", &[(3, Some((b"x", b"1")))]),
        ("missing :method", &[(0, None)]),
        ("missing :scheme", &[(1, None)]),
        ("missing :path", &[(2, None)]),
        ("empty :path", &[(2, None), (2, Some((b":path", b"")))]),
        (
            "empty :authority",
            &[(3, None), (3, Some((b":authority", b"")))],
        ),
        ("empty :method", &[(0, None), (0, Some((b":method", b"")))]),
        (
            "space in :method",
            &[(0, None), (0, Some((b":method", b"G T")))],
        ),
        (
            "CONNECT with :path and :scheme",
            &[(0, None), (0, Some((b":method", b"CONNECT")))],
        ),
        (
            "CONNECT with :path",
            &[(0, None), (0, Some((b":method", b"CONNECT"))), (1, None)],
        ),
        (
            "CONNECT without :authority",
            &[
                (0, None),
                (0, Some((b":method", b"CONNECT"))),
                (1, None),
                (1, None),
                (1, None),
            ],
        ),
        (
            "content-length not a number",
            &[(4, Some((b"content-length", b"1x")))],
        ),
        (
            "content-length negative",
            &[(4, Some((b"content-length", b"-1")))],
        ),
        (
            "content-length overflowing",
            &[(4, Some((b"content-length", b"99999999999999999999")))],
        ),
        (
            "two content-lengths",
            &[
                (4, Some((b"content-length", b"0"))),
                (5, Some((b"content-length", b"1"))),
            ],
        ),
        (
            "content-length with no DATA",
            &[(4, Some((b"content-length", b"3")))],
        ),
    ];
    let lists: Vec<Vec<Field>> = bads.iter().map(|(_, e)| request_with(e)).collect();
    let (mut s, _, c) = open();
    let (got, ids) = requests(&mut s, &lists);
    assert!(ids.is_empty(), "served: {ids:?}");
    for (i, (what, _)) in bads.iter().enumerate() {
        let id = 1 + 2 * i as u32;
        assert_eq!(rst(&got, id), Some(ErrorCode::Protocol as u32), "{what}");
    }
    assert_eq!(goaway_code(&got), None);
    assert_eq!(c.rst_for(Reason::Malformed), bads.len() as u64);
}

/// What the checks must let through: the fields real clients send.
#[test]
fn valid_requests_pass_the_field_checks() {
    type E = &'static [Edit];
    let goods: &[E] = &[
        &[],
        &[(3, None)],
        &[(4, Some((b"te", b"trailers")))],
        &[(4, Some((b"x", b"a b\tc")))],
        &[(4, Some((b"x", b"caf\xc3\xa9")))],
        &[(4, Some((b"x", b"")))],
        &[
            (4, Some((b"cookie", b"a=1"))),
            (5, Some((b"cookie", b"b=2"))),
        ],
        &[(4, Some((b"x-!#$%&'*+-.^_`|~09", b"1")))],
        &[(4, Some((b"content-length", b"0")))],
        &[
            (4, Some((b"content-length", b"0"))),
            (5, Some((b"content-length", b"0"))),
        ],
        &[(4, Some((b"grpc-trace-bin", b"AAEC/w==")))],
        &[(0, None), (0, Some((b":method", b"M-SEARCH")))],
        &[(2, None), (2, Some((b":path", b"*")))],
        // Host naming :authority's entity: case and the default port do not matter.
        &[(4, Some((b"host", b"X")))],
        &[(4, Some((b"host", b"x:80")))],
        &[
            (3, None),
            (3, Some((b":authority", b"x:80"))),
            (4, Some((b"host", b"x"))),
        ],
        // Without :authority, Host alone.
        &[(3, None), (3, Some((b"host", b"y")))],
    ];
    let lists: Vec<Vec<Field>> = goods.iter().map(|e| request_with(e)).collect();
    let (mut s, _, c) = open();
    let (got, ids) = requests(&mut s, &lists);
    assert_eq!(ids.len(), goods.len(), "{got:?}");
    assert_eq!(c.rst_for(Reason::Malformed), 0);
}

/// RFC 9113 §8.1.1: a request whose DATA do not add up to its content-length is
/// malformed (stream error PROTOCOL_ERROR), found as soon as the DATA pass it or the
/// stream ends short; padding does not count. An outside test had content-length 10
/// with 3 bytes of DATA echoed.
#[test]
fn the_body_must_match_its_content_length() {
    let cl = |p: &mut Peer, b: &mut Vec<u8>, id: u32, len: &str| {
        let mut block = Vec::new();
        p.enc.encode(
            vec![
                (&b":method"[..], &b"POST"[..]),
                (b":scheme", b"http"),
                (b":path", b"/echo"),
                (b"content-length", len.as_bytes()),
            ],
            &mut block,
        );
        frame::put(b, kind::HEADERS, flag::END_HEADERS, id, &block);
    };
    let (mut s, mut p, c) = open();
    let mut b = Vec::new();
    // Short: 3 of 10, then END_STREAM.
    cl(&mut p, &mut b, 1, "10");
    frame::put(&mut b, kind::DATA, flag::END_STREAM, 1, b"abc");
    // Long: 5 bytes for 3, no END_STREAM yet: found at once.
    cl(&mut p, &mut b, 3, "3");
    frame::put(&mut b, kind::DATA, 0, 3, b"abcde");
    // Short, ended by trailers.
    cl(&mut p, &mut b, 5, "4");
    frame::put(&mut b, kind::DATA, 0, 5, b"ab");
    let mut t = Vec::new();
    p.enc.encode(vec![(&b"x-t"[..], &b"1"[..])], &mut t);
    frame::put(
        &mut b,
        kind::HEADERS,
        flag::END_HEADERS | flag::END_STREAM,
        5,
        &t,
    );
    // Exact, over two DATA frames, one of them padded (padding does not count).
    cl(&mut p, &mut b, 7, "5");
    frame::put(&mut b, kind::DATA, 0, 7, b"ab");
    frame::put(
        &mut b,
        kind::DATA,
        flag::PADDED | flag::END_STREAM,
        7,
        b"\x04cde\0\0\0\0",
    );
    // Exact, then trailers.
    cl(&mut p, &mut b, 9, "2");
    frame::put(&mut b, kind::DATA, 0, 9, b"ab");
    frame::put(
        &mut b,
        kind::HEADERS,
        flag::END_HEADERS | flag::END_STREAM,
        9,
        &t,
    );
    let got = send(&mut s, b);
    for id in [1, 3, 5] {
        assert_eq!(
            rst(&got, id),
            Some(ErrorCode::Protocol as u32),
            "stream {id}"
        );
    }
    assert_eq!(c.rst_for(Reason::Malformed), 3);
    let r7 = Request::parse(&s.poll_request().unwrap().body).unwrap();
    assert_eq!((r7.stream, r7.body.to_vec()), (7, b"abcde".to_vec()));
    let r9 = Request::parse(&s.poll_request().unwrap().body).unwrap();
    assert_eq!((r9.stream, r9.body.to_vec()), (9, b"ab".to_vec()));
    assert!(s.poll_request().is_none());
    assert_eq!(s.buffered(), 0);
    assert_eq!(goaway_code(&got), None);
}

/// Trailers carry no pseudo-headers and only valid, not connection-specific, fields
/// (RFC 9113 §8.1, §8.2); otherwise the request is malformed.
#[test]
fn malformed_trailers_are_reset() {
    let bads: [(&[u8], &[u8]); 4] = [
        (b":path", b"/"),
        (b"x", b"1\r\n2"),
        (b"X-Upper", b"1"),
        (b"transfer-encoding", b"chunked"),
    ];
    let (mut s, mut p, c) = open();
    let mut b = Vec::new();
    for (i, (n, v)) in bads.iter().enumerate() {
        let id = 1 + 2 * i as u32;
        let block = p.block("/echo");
        frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, id, &block);
        frame::put(&mut b, kind::DATA, 0, id, b"x");
        let mut t = Vec::new();
        p.enc.encode(vec![(*n, *v)], &mut t);
        frame::put(
            &mut b,
            kind::HEADERS,
            flag::END_HEADERS | flag::END_STREAM,
            id,
            &t,
        );
    }
    let got = send(&mut s, b);
    for i in 0..bads.len() as u32 {
        assert_eq!(
            rst(&got, 1 + 2 * i),
            Some(ErrorCode::Protocol as u32),
            "{i}"
        );
    }
    assert!(s.poll_request().is_none());
    assert_eq!(c.rst_for(Reason::Malformed), bads.len() as u64);
}

/// A well-formed CONNECT (RFC 9113 §8.5: `:method` and `:authority` only) asks for a
/// tunnel, which needs DATA both ways as it comes; workers get whole requests, so this
/// server implements CONNECT for no target: the session answers 501 itself (RFC 9110
/// §15.6.2), with a RST_STREAM NO_ERROR when the client's side is still open, and ignores
/// the tunnel data that follows. No worker sees it. (An outside test's CONNECT without
/// `:authority` got 404 from the application.)
#[test]
fn a_well_formed_connect_is_answered_501_by_the_session() {
    let (mut s, mut p, c) = open();
    let mut b = Vec::new();
    let mut block = Vec::new();
    p.enc.encode(
        vec![
            (&b":method"[..], &b"CONNECT"[..]),
            (b":authority", b"example.com:443"),
        ],
        &mut block,
    );
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 1, &block);
    frame::put(&mut b, kind::DATA, 0, 1, b"tunnel bytes");
    p.get(&mut b, 3, "/");
    let got = send(&mut s, b);
    let (h, blk) = got
        .iter()
        .find(|(h, _)| h.kind == kind::HEADERS && h.stream == 1)
        .unwrap();
    assert_ne!(h.flags & flag::END_STREAM, 0);
    let hs = p.dec.decode(blk).unwrap();
    assert_eq!(hs[0], (b":status".to_vec(), b"501".to_vec()));
    assert_eq!(rst(&got, 1), Some(ErrorCode::NoError as u32));
    assert!(!got
        .iter()
        .any(|(h, _)| h.kind == kind::DATA && h.stream == 1));
    assert_eq!(goaway_code(&got), None);
    assert_eq!(
        s.poll_request().unwrap().id,
        3,
        "only the GET reaches a worker"
    );
    assert!(s.poll_request().is_none());
    assert_eq!(c.connect.load(Ordering::Relaxed), 1);
    assert_eq!(s.buffered(), 0);
}

/// RFC 9113 §5.3.1: a stream cannot depend on itself, stream error PROTOCOL_ERROR, by
/// PRIORITY or by HEADERS' priority fields (whose block is still decoded: the next request
/// uses the dynamic table it filled); on an idle stream, which a RST_STREAM may not name
/// (§6.4), a connection error. §6.2: padding that leaves no room for the priority fields
/// is PROTOCOL_ERROR (was FRAME_SIZE_ERROR). An outside test found all of them accepted.
#[test]
fn self_dependency_and_padding_over_the_priority_fields_are_protocol_errors() {
    let (mut s, mut p, _) = open();
    let mut b = Vec::new();
    // Stream 3 open (its body still coming), then a PRIORITY making it depend on itself.
    let block = p.block("/echo");
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 3, &block);
    frame::put(&mut b, kind::PRIORITY, 0, 3, &[0, 0, 0, 3, 16]);
    // Stream 5 opened by a HEADERS depending on itself.
    let mut block = vec![0, 0, 0, 5, 16];
    p.enc.encode(
        vec![
            (&b":method"[..], &b"GET"[..]),
            (b":scheme", b"http"),
            (b":path", b"/"),
            (b"x-new", b"to the table"),
        ],
        &mut block,
    );
    frame::put(
        &mut b,
        kind::HEADERS,
        flag::END_HEADERS | flag::END_STREAM | flag::PRIORITY,
        5,
        &block,
    );
    p.get_with(&mut b, 7, b"/next", (b"x-new", b"to the table"));
    let got = send(&mut s, b);
    assert_eq!(rst(&got, 3), Some(ErrorCode::Protocol as u32), "PRIORITY");
    assert_eq!(rst(&got, 5), Some(ErrorCode::Protocol as u32), "HEADERS");
    assert_eq!(goaway_code(&got), None);
    let r = Request::parse(&s.poll_request().unwrap().body).unwrap();
    assert_eq!(
        (r.stream, r.header("x-new")),
        (7, Some(&b"to the table"[..]))
    );
    assert!(s.poll_request().is_none());
    // On an idle stream: GOAWAY, not a RST_STREAM naming an idle stream.
    let (mut s, _, _) = open();
    let mut b = Vec::new();
    frame::put(&mut b, kind::PRIORITY, 0, 1, &[0, 0, 0, 1, 16]);
    let got = send(&mut s, b);
    assert_eq!(goaway_code(&got), Some(ErrorCode::Protocol as u32));
    assert_eq!(rst(&got, 1), None);
    // PADDED + PRIORITY, 4 bytes of payload after 3 of padding: no room.
    let (mut s, _, _) = open();
    let mut b = Vec::new();
    frame::put(
        &mut b,
        kind::HEADERS,
        flag::END_HEADERS | flag::PADDED | flag::PRIORITY,
        1,
        &[3, 0, 0, 0, 0, 0, 0, 0],
    );
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::Protocol as u32)
    );
    // Unpadded and too short for the priority fields: FRAME_SIZE_ERROR as before.
    let (mut s, _, _) = open();
    let mut b = Vec::new();
    frame::put(
        &mut b,
        kind::HEADERS,
        flag::END_HEADERS | flag::PRIORITY,
        1,
        &[0, 0, 0],
    );
    assert_eq!(
        goaway_code(&send(&mut s, b)),
        Some(ErrorCode::FrameSize as u32)
    );
}

/// A POST header block with `content-length: len` (if any).
fn post(p: &mut Peer, len: Option<usize>) -> Vec<u8> {
    let l = len.map(|l| l.to_string()).unwrap_or_default();
    let mut f: Vec<(&[u8], &[u8])> = vec![
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/up"),
        (b":authority", b"x"),
    ];
    if len.is_some() {
        f.push((b"content-length", l.as_bytes()));
    }
    let mut b = Vec::new();
    p.enc.encode(f, &mut b);
    b
}

fn window_updates(got: &Got, stream: u32) -> u32 {
    got.iter()
        .filter(|(h, _)| h.kind == kind::WINDOW_UPDATE && h.stream == stream)
        .map(|(_, p)| u32::from_be_bytes([p[0], p[1], p[2], p[3]]))
        .sum()
}

/// What a session holds of a request before dispatch is counted in truesize as it comes
/// and goes: the decoded headers (RFC 9113's measure), the DATA slices' whole buffers,
/// then heap chunks sized by what arrived (the last by what the content-length says is
/// left, not by doubling); nothing once the request is taken.
#[test]
fn memory_is_counted_as_a_request_arrives_and_released_when_it_is_taken() {
    let (mut s, mut p, _) = open();
    assert_eq!(Session::mem(&s), 0);
    let mut b = Vec::new();
    let block = post(&mut p, Some(40_000));
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 1, &block);
    send(&mut s, b);
    let headers = Session::mem(&s);
    // :method POST, :scheme http, :path /up, :authority x, content-length 40000.
    assert_eq!(
        headers,
        (7 + 4) + (7 + 4) + (5 + 3) + (10 + 1) + (14 + 5) + 5 * 32
    );
    // 10,000 bytes in one 12 KiB buffer: zero copy, the whole buffer counted.
    let mut b = Vec::new();
    frame::put(&mut b, kind::DATA, 0, 1, &[1; 10_000]);
    let mut z = zbuf::ZbufMut::heap(0, 12 << 10);
    z.extend_from_slice(&b).unwrap();
    s.push(z.freeze());
    drain(&mut s);
    assert_eq!(Session::mem(&s), headers + (12 << 10) + BUF_OVERHEAD);
    // Past SPILL_MIN: copied into a 40,000-byte chunk (the body's whole length, below
    // SPILL_CHUNK), the received buffer released.
    let mut b = Vec::new();
    frame::put(&mut b, kind::DATA, 0, 1, &[2; 10_000]);
    send(&mut s, b);
    assert_eq!(Session::mem(&s), headers + 40_000 + BUF_OVERHEAD);
    let mut b = Vec::new();
    frame::put(&mut b, kind::DATA, 0, 1, &[3; 16_000]);
    frame::put(&mut b, kind::DATA, flag::END_STREAM, 1, &[3; 4_000]);
    send(&mut s, b);
    let r = s.poll_request().unwrap();
    assert_eq!(Session::mem(&s), 0);
    let body = Request::parse(&r.body).unwrap().body.to_vec();
    assert_eq!(body.len(), 40_000);
    assert!(body[..10_000].iter().all(|&x| x == 1));
    assert!(body[20_000..].iter().all(|&x| x == 3));

    // Without a content-length: chunks of 32 KiB, then 64 KiB, as the bytes come.
    let mut b = Vec::new();
    let block = post(&mut p, None);
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 3, &block);
    for _ in 0..3 {
        frame::put(&mut b, kind::DATA, 0, 3, &[4; 12_000]);
    }
    send(&mut s, b);
    let hm = Session::mem(&s) - (32 << 10) - (64 << 10) - 2 * BUF_OVERHEAD;
    assert!(
        hm < 300,
        "the headers and the two chunks: {}",
        Session::mem(&s)
    );
}

/// Told no credit ([`Session::set_mem`]), the session grants none for the DATA it
/// receives, stream or connection, and says it waits; told yes, it grants what it owes.
#[test]
fn credit_withheld_while_memory_is_tight_is_granted_when_it_is_not() {
    let (mut s, mut p, _) = open();
    Session::set_mem(&mut s, usize::MAX, false);
    let mut b = Vec::new();
    let block = post(&mut p, None);
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 1, &block);
    frame::put(&mut b, kind::DATA, 0, 1, &[1; 5_000]);
    frame::put(&mut b, kind::DATA, 0, 1, &[1; 3_000]);
    let got = send(&mut s, b);
    assert_eq!(window_updates(&got, 1), 0, "{got:?}");
    assert_eq!(window_updates(&got, 0), 0, "{got:?}");
    assert!(Session::mem_waits(&s));
    Session::set_mem(&mut s, usize::MAX, true);
    assert!(!Session::mem_waits(&s));
    let got = drain(&mut s);
    assert_eq!(window_updates(&got, 1), 8_000);
    assert_eq!(window_updates(&got, 0), 8_000);
    // A stream that ended meanwhile is owed nothing more (it cannot receive).
    Session::set_mem(&mut s, usize::MAX, false);
    let mut b = Vec::new();
    frame::put(&mut b, kind::DATA, 0, 1, &[1; 2_000]);
    frame::put(&mut b, kind::DATA, flag::END_STREAM, 1, &[1; 1_000]);
    send(&mut s, b);
    assert!(s.poll_request().is_some());
    Session::set_mem(&mut s, usize::MAX, true);
    let got = drain(&mut s);
    assert_eq!(window_updates(&got, 1), 0);
    assert_eq!(
        window_updates(&got, 0),
        3_000,
        "the connection's credit comes back"
    );
}

/// A header block is not decoded while the session has no room left (decoding turns a
/// few bytes into a header list of up to max_list_size): it waits in the input, the
/// session takes no more, and it is decoded once the limit is raised.
#[test]
fn header_blocks_wait_for_room_and_are_decoded_when_there_is_some() {
    let (mut s, mut p, _) = open();
    Session::set_mem(&mut s, 0, true);
    let mut b = Vec::new();
    p.get(&mut b, 1, "/a");
    let got = send(&mut s, b);
    assert!(got.is_empty(), "{got:?}");
    assert!(s.poll_request().is_none());
    assert!(Session::mem_waits(&s));
    assert!(!s.wants_input());
    Session::set_mem(&mut s, usize::MAX, true);
    drain(&mut s);
    let r = s.poll_request().expect("decoded once there is room");
    assert_eq!(Request::parse(&r.body).unwrap().path(), b"/a");
    assert!(!Session::mem_waits(&s));
    assert!(s.wants_input());
}

/// The deadlock breaker's part ([`Session::shed`]): the largest partial request is
/// refused (RST_STREAM REFUSED_STREAM, not charged to the flood budget) and the
/// connection goes on; with no partial request holding memory, the session ends with
/// GOAWAY ENHANCE_YOUR_CALM (`memory_pressure`).
#[test]
fn shedding_refuses_the_largest_partial_stream_and_then_ends_the_session() {
    let (mut s, mut p, c) = open();
    let mut b = Vec::new();
    // Without content-lengths: stream 3 in a 32 KiB and a 64 KiB chunk, 5 in one 32 KiB
    // chunk, 1 zero copy.
    for (id, n) in [(1u32, 10_000), (3, 40_000), (5, 20_000)] {
        let block = post(&mut p, None);
        frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, id, &block);
        for chunk in vec![7u8; n].chunks(10_000) {
            frame::put(&mut b, kind::DATA, 0, id, chunk);
        }
    }
    send(&mut s, b);
    let before = Session::mem(&s);
    let big = Session::shed_size(&s);
    assert!(big > 96 << 10 && big < 100 << 10, "{big}");
    assert!(!Session::shed(&mut s), "the connection goes on");
    let got = drain(&mut s);
    assert_eq!(rst(&got, 3), Some(ErrorCode::RefusedStream as u32));
    assert_eq!(Session::mem(&s), before - big);
    assert_eq!(c.rst_for(Reason::MemoryPressure), 1);
    assert!(!closing(&s));
    // The others finish.
    let mut b = Vec::new();
    frame::put(&mut b, kind::DATA, flag::END_STREAM, 1, b"!");
    send(&mut s, b);
    let r = s.poll_request().unwrap();
    assert_eq!(Request::parse(&r.body).unwrap().body.len(), 10_001);
    // Stream 5 goes next, then a header block being assembled is no stream's: GOAWAY.
    assert!(!Session::shed(&mut s));
    assert_eq!(
        rst(&drain(&mut s), 5),
        Some(ErrorCode::RefusedStream as u32)
    );
    let mut b = Vec::new();
    frame::put(&mut b, kind::HEADERS, 0, 7, &[0x82; 5_000]);
    send(&mut s, b);
    assert!(Session::shed_size(&s) >= 5_000);
    assert!(Session::shed(&mut s), "the session ends");
    assert_eq!(
        goaway_code(&drain(&mut s)),
        Some(ErrorCode::EnhanceYourCalm as u32)
    );
    assert!(matches!(
        s.state(),
        SessionState::Closing(e) if e.kind() == ParseErrorKind::Memory
    ));
    assert_eq!(c.goaway_for(Reason::MemoryPressure), 1);
}

/// A frame sent in 1-byte segments, each in its own receive buffer, pins at most
/// SPILL_PIECES of them while it is incomplete (the input is merged past that, as the
/// framer's is), and arrives intact.
#[test]
fn a_frame_in_tiny_segments_pins_a_bounded_number_of_received_buffers() {
    let (mut s, mut p, _) = open();
    let mut b = Vec::new();
    let block = post(&mut p, Some(3_000));
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 1, &block);
    frame::put(&mut b, kind::DATA, flag::END_STREAM, 1, &[5; 3_000]);
    let mut kept = Vec::new();
    for byte in &b {
        let z = Zbuf::copy_from_slice(std::slice::from_ref(byte));
        kept.push(z.clone());
        s.push(z);
        let pinned = kept.iter().filter(|z| z.ref_count() > 1).count();
        assert!(pinned <= SPILL_PIECES, "{pinned} buffers pinned");
        assert!(Session::mem(&s) < 2 * SPILL_PIECES * (1 + BUF_OVERHEAD) + 8_000);
    }
    drain(&mut s);
    let r = s.poll_request().unwrap();
    assert_eq!(
        Request::parse(&r.body).unwrap().body.to_vec(),
        vec![5; 3_000]
    );
}

/// What a partial request lacks is known from its content-length, and offered for a pass
/// only when the peer may send it without more credit.
#[test]
fn what_a_partial_request_lacks_is_known_from_its_content_length() {
    let (mut s, mut p, _) = open();
    assert_eq!(Session::lacks(&s), None);
    let mut b = Vec::new();
    let block = post(&mut p, Some(50_000));
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 1, &block);
    frame::put(&mut b, kind::DATA, 0, 1, &[1; 10_000]);
    let block = post(&mut p, None);
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 3, &block);
    frame::put(&mut b, kind::DATA, 0, 3, &[1; 10_000]);
    send(&mut s, b);
    // 40,000 left, within the stream's window (refilled to 65,535).
    assert_eq!(Session::lacks(&s), Some(40_000));
    let mut b = Vec::new();
    let block = post(&mut p, Some(100_000));
    frame::put(&mut b, kind::HEADERS, flag::END_HEADERS, 5, &block);
    send(&mut s, b);
    assert_eq!(
        Session::lacks(&s),
        Some(40_000),
        "100,000 is past its window"
    );
    // With credit withheld, the window shrinks below what stream 1 lacks.
    Session::set_mem(&mut s, usize::MAX, false);
    let mut b = Vec::new();
    frame::put(&mut b, kind::DATA, 0, 1, &[1; 16_000]);
    frame::put(&mut b, kind::DATA, 0, 1, &[1; 14_000]);
    send(&mut s, b);
    assert_eq!(Session::lacks(&s), Some(10_000));
}
