//! Instructions per message on the I/O core's fast path, for callgrind (not a timing
//! benchmark): one connection, knb's 4 KiB requests arriving as three full-sized segments
//! in 2 KiB receive buffers, each taken by the one worker and answered at once; the I/O
//! side runs `on_data` per segment and `poll_replies` per message. Run twice with
//! different counts and divide the difference in instructions by the difference in
//! messages (the setup cancels):
//!
//! ```sh
//! cargo build --release -p msgsched --example fastpath_icount
//! for n in 10000 110000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$n \
//!     target/release/examples/fastpath_icount $n 2>&1 | grep Collected
//! done
//! ```
use msgsched::framer::FramerConfig;
use msgsched::parser::knb::{Header, KnbParser};
use msgsched::parser::Ordering;
use msgsched::sched::{Model, SchedConfig};
use msgsched::socket::group;
use zbuf::{IoVec, Zbuf, ZbufMut};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(100_000, |s| s.parse().expect("a message count"));
    let sched = SchedConfig {
        model: Model::Cp,
        workers: 1,
        queue_capacity: 64,
        seed: 1,
    };
    let (mut io, mut socks) = group::<u32, KnbParser>(&sched, FramerConfig::default()).unwrap();
    io.attach(0, KnbParser::new(Ordering::Ordered)).unwrap();
    let mut req = Header {
        id: 1,
        len: 4096 - 16,
        flags: 0,
    }
    .bytes()
    .to_vec();
    req.resize(4096, 7);
    let segs: Vec<Zbuf> = req
        .chunks(1448)
        .map(|c| {
            let mut m = ZbufMut::heap(0, 2048);
            m.extend_from_slice(c).unwrap();
            m.freeze()
        })
        .collect();
    let reply = IoVec::from(Zbuf::from_static(b"ok"));
    let mut replies = 0;
    for _ in 0..n {
        for s in &segs {
            io.on_data(0, s.clone());
        }
        let m = socks[0].try_recv().expect("dispatched");
        socks[0].reply(m.origin, reply.clone());
        replies += io.poll_replies(|_, _| {});
    }
    assert_eq!(replies, n);
}
