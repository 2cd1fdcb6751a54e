//! An I/O core asleep under `IdleStrategy::Backoff` is woken by its workers: a reply a
//! worker thread hands it goes out at once, not when the sleep (up to `max`) ends. In
//! message mode (a reply notice), split mode (the worker's `ToIo` ring) and batch mode
//! (an application whose replies another thread queues, as the LD_PRELOAD shim's
//! application threads queue commands).
//!
//! The server's core sleeps up to 50 ms; each request is answered by a worker after
//! holding it for 120 ms, long enough for the idle core to be in its longest sleeps
//! (1 µs doubling: 65 ms of sleeps to reach the cap). Without a wake each reply waited
//! for the sleep to end (about 45 ms here, the replies landing early in a 50 ms sleep);
//! with it, the reply reaches the client within the time the machine takes to
//! schedule the woken core. The bound asserted is a quarter of `max` on average over
//! ten RPCs (a loaded 2-CPU machine stays far below it), and the behaviour itself: the
//! workers' rings cut the core's sleeps short.

mod common;

use common::*;
use msgsched::framer::FramerConfig;
use msgsched::parser::knb::{Header, KnbParser, HDR_LEN, RESPONSE};
use msgsched::parser::Ordering as Order;
use msgsched::sched::{Model, SchedConfig};
use msgsched::socket::Message;
use r2c::batch::{BatchApp, Fd, Interest, PollEvent, Sockets};
use r2c::msg::{MsgConfig, MsgCtx, MsgHandler};
use r2c::split::{Handler, SplitConfig, ToWorker, WorkerCtx};
use r2c::{Conn, Ctx, IdleStrategy, InlineApp, Runtime};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use zbuf::{IoVec, Zbuf};

const PORT: u16 = 17;
const RPCS: usize = 10;
const MAX_SLEEP: Duration = Duration::from_millis(50);
const HOLD: Duration = Duration::from_millis(120);

/// The tests share two CPUs: one at a time, so neither's client starves the
/// other's woken core.
static SERIAL: Mutex<()> = Mutex::new(());

/// When the worker handed over the last reply; each reply's delay to the client.
#[derive(Default)]
struct Log {
    replied_at: Option<Instant>,
    delays: Vec<Duration>,
    bad: Vec<String>,
    done: bool,
}

fn request(id: u64) -> Zbuf {
    Zbuf::copy_from_slice(
        &Header {
            id,
            len: 0,
            flags: 0,
        }
        .bytes(),
    )
}

fn response(id: u64) -> Vec<u8> {
    Header {
        id,
        len: 0,
        flags: RESPONSE,
    }
    .bytes()
    .to_vec()
}

/// One connection, one request at a time; records each reply's delay since the
/// worker handed it over.
struct Client {
    log: Arc<Mutex<Log>>,
    next: u64,
    buf: Vec<u8>,
}

impl InlineApp for Client {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        ctx.connect(server_addr(PORT)).unwrap();
    }

    fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        ctx.send_all(conn, request(0)).unwrap();
    }

    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        while let Ok(Some(b)) = ctx.recv(conn) {
            self.buf.extend_from_slice(&b);
        }
        if self.buf.len() < HDR_LEN {
            return;
        }
        let now = Instant::now();
        let mut log = self.log.lock().unwrap();
        let got: Vec<u8> = self.buf.drain(..HDR_LEN).collect();
        if got != response(self.next) {
            log.bad.push(format!("reply {}: {got:?}", self.next));
        }
        match log.replied_at.take() {
            Some(t) => log.delays.push(now.saturating_duration_since(t)),
            None => log
                .bad
                .push(format!("reply {} before its worker sent it", self.next)),
        }
        self.next += 1;
        if self.next as usize == RPCS {
            log.done = true;
            ctx.close(conn);
        } else {
            ctx.send_all(conn, request(self.next)).unwrap();
        }
    }
}

fn server_opts() -> r2c::CoreOptions {
    r2c::CoreOptions {
        idle: IdleStrategy::Backoff { max: MAX_SLEEP },
        ..opts()
    }
}

/// Runs the client's RPCs against the server runtime `srv`, stops and joins both, and
/// checks the reply delays ([`check`]).
fn run_and_check(
    log: &Arc<Mutex<Log>>,
    client: Vec<r2c::CoreSetup<r2c::device::mem::MemDevice>>,
    srv: Runtime,
) {
    let l = Arc::clone(log);
    let cli = Runtime::spawn_inline(client, opts(), move |_| Client {
        log: Arc::clone(&l),
        next: 0,
        buf: Vec::new(),
    })
    .unwrap();
    wait_for("the RPCs", || {
        let g = log.lock().unwrap();
        g.done || !g.bad.is_empty()
    });
    cli.stop();
    srv.stop();
    cli.join().unwrap();
    srv.join().unwrap();
    check(log);
}

/// The workers' replies rang the sleeping core's doorbell (at least one RPC in two).
fn assert_rang(bell: Option<msgsched::doorbell::DoorbellStats>) {
    let bell = bell.expect("Backoff gives the core a doorbell");
    assert!(
        bell.wakes >= RPCS as u64 / 2,
        "the workers' replies woke the sleeping core: {bell:?}"
    );
}

/// The delays are short: a quarter of the sleep's cap on average (without the wake,
/// about 45 ms each here).
fn check(log: &Mutex<Log>) {
    let g = log.lock().unwrap();
    assert!(g.bad.is_empty(), "{:?}", g.bad);
    assert_eq!(g.delays.len(), RPCS);
    let total: Duration = g.delays.iter().sum();
    eprintln!("reply delays {:?} (total {total:?})", g.delays);
    assert!(
        total < MAX_SLEEP / 4 * RPCS as u32,
        "replies waited for the I/O core's sleep: {total:?} over {RPCS} RPCs, each {:?}",
        g.delays
    );
}

struct Hold {
    log: Arc<Mutex<Log>>,
}

impl MsgHandler for Hold {
    fn on_message(&mut self, ctx: &mut MsgCtx<'_>, m: Message<Conn>) {
        std::thread::sleep(HOLD);
        let h = Header::read(&m.body).unwrap().unwrap();
        let mut out = ctx.alloc(HDR_LEN).unwrap();
        out.extend_from_slice(&response(h.id)).unwrap();
        self.log.lock().unwrap().replied_at = Some(Instant::now());
        ctx.reply(m.origin, IoVec::from(out.freeze()));
    }
}

#[test]
fn message_mode_a_reply_wakes_the_sleeping_io_core() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (mut server, client) = pair(1, 1, |_| {});
    let cfg = MsgConfig {
        listen: vec![(PORT, 8)],
        sched: SchedConfig {
            model: Model::Ms,
            workers: 1,
            queue_capacity: 4,
            seed: 1,
        },
        framer: FramerConfig {
            max_message: 1024,
            max_in_flight: 1,
            ..FramerConfig::default()
        },
        worker_cpus: Vec::new(),
    };
    let log = Arc::new(Mutex::new(Log::default()));
    let l = Arc::clone(&log);
    let (srv, workers) = Runtime::spawn_msg(
        server.remove(0),
        server_opts(),
        cfg,
        || KnbParser::new(Order::Ordered),
        move |_| Hold {
            log: Arc::clone(&l),
        },
    )
    .unwrap();
    run_and_check(&log, client, srv);
    assert_rang(workers.doorbell());
}

struct SplitHold {
    log: Arc<Mutex<Log>>,
    buf: Vec<u8>,
}

impl Handler for SplitHold {
    fn on_message(&mut self, ctx: &mut WorkerCtx<'_>, msg: ToWorker) {
        let ToWorker::Data { conn, data } = msg else {
            return;
        };
        self.buf.extend_from_slice(&data);
        while self.buf.len() >= HDR_LEN {
            let req: Vec<u8> = self.buf.drain(..HDR_LEN).collect();
            let h = Header::read(&IoVec::from(Zbuf::copy_from_slice(&req)))
                .unwrap()
                .unwrap();
            std::thread::sleep(HOLD);
            let mut out = ctx.alloc(HDR_LEN).unwrap();
            out.extend_from_slice(&response(h.id)).unwrap();
            self.log.lock().unwrap().replied_at = Some(Instant::now());
            ctx.send(conn, out.freeze()).unwrap();
        }
    }
}

#[test]
fn split_mode_a_reply_wakes_the_sleeping_io_core() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (mut server, client) = pair(1, 1, |_| {});
    let split = SplitConfig {
        listen: vec![(PORT, 8)],
        workers: 1,
        ..SplitConfig::default()
    };
    let log = Arc::new(Mutex::new(Log::default()));
    let l = Arc::clone(&log);
    let (srv, workers) =
        Runtime::spawn_split(server.remove(0), server_opts(), split, move |_| SplitHold {
            log: Arc::clone(&l),
            buf: Vec::new(),
        })
        .unwrap();
    run_and_check(&log, client, srv);
    assert_rang(workers.doorbell());
}

/// What the batch server's helper thread hands its `on_poll` (the LD_PRELOAD shim's
/// shape: a locked queue and a flag, then the doorbell).
#[derive(Default)]
struct Handoff {
    replies: Mutex<Vec<(Fd, Vec<u8>)>>,
    has: AtomicBool,
}

/// A batch-mode server whose replies come from another thread: `on_poll` passes each
/// request to it, and it queues the reply after holding it, then rings the core.
struct BatchHold {
    log: Arc<Mutex<Log>>,
    handoff: Arc<Handoff>,
    to_helper: Option<mpsc::Sender<(Fd, u64)>>,
    lfd: Option<Fd>,
    events: Vec<PollEvent>,
    bufs: HashMap<Fd, Vec<u8>>,
    rings: Arc<AtomicBool>,
}

impl BatchApp for BatchHold {
    fn on_start(&mut self, s: &mut Sockets<'_>) {
        let fd = s.socket();
        s.bind(fd, PORT).unwrap();
        s.listen(fd, 8).unwrap();
        s.register(fd, Interest::READABLE).unwrap();
        self.lfd = Some(fd);
        let bell = s.doorbell();
        self.rings.store(bell.is_some(), Ordering::SeqCst);
        let (tx, rx) = mpsc::channel::<(Fd, u64)>();
        self.to_helper = Some(tx);
        let (handoff, log) = (Arc::clone(&self.handoff), Arc::clone(&self.log));
        std::thread::spawn(move || {
            // Ends when the core drops the app (the sender goes with it).
            while let Ok((fd, id)) = rx.recv() {
                std::thread::sleep(HOLD);
                handoff.replies.lock().unwrap().push((fd, response(id)));
                handoff.has.store(true, Ordering::Release);
                log.lock().unwrap().replied_at = Some(Instant::now());
                if let Some(b) = &bell {
                    b.ring();
                }
            }
        });
    }

    fn on_poll(&mut self, s: &mut Sockets<'_>) {
        s.poll(&mut self.events);
        for ev in std::mem::take(&mut self.events) {
            if Some(ev.fd) == self.lfd {
                while let Ok((c, _)) = s.accept(ev.fd) {
                    s.register(c, Interest::READABLE).unwrap();
                }
                continue;
            }
            let mut chunk = [0u8; 256];
            while let Ok(n) = s.recv(ev.fd, &mut chunk) {
                if n == 0 {
                    let _ = s.close(ev.fd);
                    break;
                }
                let buf = self.bufs.entry(ev.fd).or_default();
                buf.extend_from_slice(&chunk[..n]);
                while buf.len() >= HDR_LEN {
                    let req: Vec<u8> = buf.drain(..HDR_LEN).collect();
                    let h = Header::read(&IoVec::from(Zbuf::copy_from_slice(&req)))
                        .unwrap()
                        .unwrap();
                    if let Some(tx) = &self.to_helper {
                        tx.send((ev.fd, h.id)).unwrap();
                    }
                }
            }
        }
        if self.handoff.has.swap(false, Ordering::AcqRel) {
            let replies = std::mem::take(&mut *self.handoff.replies.lock().unwrap());
            for (fd, r) in replies {
                assert_eq!(s.send(fd, &r), Ok(r.len()));
            }
        }
    }

    fn pending(&self) -> bool {
        self.handoff.has.load(Ordering::Acquire)
    }
}

#[test]
fn batch_mode_work_queued_by_another_thread_wakes_the_sleeping_core() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (server, client) = pair(1, 1, |_| {});
    let log = Arc::new(Mutex::new(Log::default()));
    let rings = Arc::new(AtomicBool::new(false));
    let (l, r) = (Arc::clone(&log), Arc::clone(&rings));
    let srv = Runtime::spawn_batch(server, server_opts(), move |_| BatchHold {
        log: Arc::clone(&l),
        handoff: Arc::default(),
        to_helper: None,
        lfd: None,
        events: Vec::new(),
        bufs: HashMap::new(),
        rings: Arc::clone(&r),
    })
    .unwrap();
    run_and_check(&log, client, srv);
    assert!(
        rings.load(Ordering::SeqCst),
        "Backoff gives a batch core a doorbell"
    );
}
