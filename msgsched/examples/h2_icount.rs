//! Instructions per request on the I/O core's HTTP/2 path, for callgrind (not a timing
//! benchmark): one connection under [`SessionIo`](msgsched::proto::io::SessionIo), POST
//! requests of a 3,000-byte body (HEADERS, HPACK-indexed after the first, then one DATA
//! with END_STREAM, about 3 KB) arriving as full-sized segments in 2 KiB receive buffers
//! (three per request), each taken by the one worker and answered at once with a 2-byte
//! body; the I/O side runs `on_data` per segment and `poll_replies` per request. Run twice
//! with different counts and divide the difference in instructions by the difference in
//! requests (the setup cancels):
//!
//! ```sh
//! cargo build --release -p msgsched --example h2_icount
//! for n in 10000 110000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$n \
//!     target/release/examples/h2_icount $n 2>&1 | grep Collected
//! done
//! ```
//!
//! The count includes the harness's own work (building each request's frames and
//! copying them into receive buffers), the same before and after a change.
use msgsched::framer::FramerConfig;
use msgsched::proto::h2::frame::{self, flag, kind, PREFACE};
use msgsched::proto::h2::hpack::Encoder;
use msgsched::proto::h2::{H2Config, H2Session, Response};
use msgsched::proto::io::session_group;
use msgsched::sched::{Model, SchedConfig};
use zbuf::{IoVec, Zbuf, ZbufMut};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(100_000, |s| s.parse().expect("a request count"));
    let sched = SchedConfig {
        model: Model::Cp,
        workers: 1,
        queue_capacity: 64,
        seed: 1,
    };
    let (mut io, mut socks) = session_group::<u32>(&sched, FramerConfig::default()).unwrap();
    assert!(io.attach(0, Box::new(H2Session::new(H2Config::default()))));
    let fields: [(&[u8], &[u8]); 5] = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/echo"),
        (b":authority", b"bench"),
        (b"content-length", b"3000"),
    ];
    let mut enc = Encoder::new();
    let (mut first, mut block) = (Vec::new(), Vec::new());
    enc.encode(fields, &mut first);
    // The same list again: every field indexed.
    enc.encode(fields, &mut block);
    let mut hello = PREFACE.to_vec();
    frame::settings(&mut hello, &[]);
    // Room for every reply's DATA on the connection.
    frame::window_update(&mut hello, 0, (1 << 31) - 1 - 65_535);
    io.on_data(0, Zbuf::from_vec(hello));
    let body = vec![7u8; 3000];
    let reply = Response::new(200)
        .body(IoVec::from(Zbuf::from_static(b"ok")))
        .into_iovec();
    let mut bytes = Vec::with_capacity(4096);
    let mut replies = 0;
    for i in 0..n {
        let id = 1 + 2 * i as u32;
        bytes.clear();
        let b = if i == 0 { &first } else { &block };
        frame::put(&mut bytes, kind::HEADERS, flag::END_HEADERS, id, b);
        frame::put(&mut bytes, kind::DATA, flag::END_STREAM, id, &body);
        for c in bytes.chunks(1448) {
            let mut m = ZbufMut::heap(0, 2048);
            m.extend_from_slice(c).unwrap();
            io.on_data(0, m.freeze());
        }
        let m = socks[0].try_recv().expect("dispatched");
        socks[0].reply(m.origin, reply.clone());
        replies += io.poll_replies(|_, _| {});
    }
    assert_eq!(replies, n);
}
