//! Split mode: I/O core + worker threads over rings; replies arrive intact.

mod common;

use common::*;
use luna_stack::tcp::CloseReason;
use r2c::split::{Handler, SplitConfig, ToWorker, WorkerCtx, WouldBlock};
use r2c::{Conn, Ctx, InlineApp, Runtime};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use zbuf::Zbuf;

/// Uppercases each byte (a transform, so the reply provably passed through a worker)
/// and records which worker thread served each connection.
struct Upper {
    seen: Arc<Mutex<Vec<(usize, std::thread::ThreadId)>>>,
    /// Replies and closes the worker's full reply queue refused, in order.
    waiting: VecDeque<Out>,
}

enum Out {
    Send(Conn, Zbuf),
    Close(Conn),
}

impl Upper {
    /// Hands waiting replies to the I/O core until it refuses one (kept, in order).
    fn drain(&mut self, ctx: &mut WorkerCtx<'_>) {
        while let Some(o) = self.waiting.pop_front() {
            match o {
                Out::Send(conn, data) => {
                    if let Err(WouldBlock(data)) = ctx.send(conn, data) {
                        self.waiting.push_front(Out::Send(conn, data));
                        return;
                    }
                }
                Out::Close(conn) => ctx.close(conn),
            }
        }
    }
}

impl Handler for Upper {
    fn on_message(&mut self, ctx: &mut WorkerCtx<'_>, msg: ToWorker) {
        match msg {
            ToWorker::Accepted { .. } => self
                .seen
                .lock()
                .unwrap()
                .push((ctx.worker(), std::thread::current().id())),
            ToWorker::Data { conn, data } => {
                let mut out = ctx.alloc(data.len()).unwrap();
                out.extend_from_slice(&data.to_ascii_uppercase()).unwrap();
                self.waiting.push_back(Out::Send(conn, out.freeze()));
            }
            ToWorker::Eof { conn } => self.waiting.push_back(Out::Close(conn)),
            _ => {}
        }
        self.drain(ctx);
    }

    fn on_idle(&mut self, ctx: &mut WorkerCtx<'_>) {
        self.drain(ctx);
    }
}

struct Client {
    conns: usize,
    len: usize,
    got: HashMap<Conn, (usize, Vec<u8>)>,
    done: Arc<AtomicUsize>,
    bad: Arc<Mutex<Vec<String>>>,
}

fn lower_msg(core: usize, idx: usize, len: usize) -> Vec<u8> {
    message(core, idx, len)
        .into_iter()
        .map(|b| b'a' + b % 26)
        .collect()
}

impl InlineApp for Client {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        for i in 0..self.conns {
            let c = ctx.connect(server_addr(9)).unwrap();
            self.got.insert(c, (i, Vec::new()));
        }
    }
    fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        let idx = self.got[&conn].0;
        ctx.send_all(conn, Zbuf::from_vec(lower_msg(ctx.core(), idx, self.len)))
            .unwrap();
    }
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        while let Ok(Some(b)) = ctx.recv(conn) {
            self.got.get_mut(&conn).unwrap().1.extend_from_slice(&b);
        }
        let (idx, data) = &self.got[&conn];
        if data.len() >= self.len {
            let want = lower_msg(ctx.core(), *idx, self.len).to_ascii_uppercase();
            if *data != want {
                self.bad
                    .lock()
                    .unwrap()
                    .push(format!("conn {idx}: reply differs"));
            }
            ctx.close(conn);
            self.done.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[test]
fn split_mode_replies_arrive_intact_from_worker_threads() {
    let (mut server, client) = pair(1, 1, |_| {});
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let split = SplitConfig {
        listen: vec![(9, 1024)],
        workers: 3,
        // Small rings so back pressure (paused connections, overflow) is exercised.
        ring_size: 4,
        ..SplitConfig::default()
    };
    let slab = zbuf::Slab::new(
        zbuf::SlabConfig::new()
            .hugepages(zbuf::HugepageMode::Never)
            .max_memory(64 << 20),
    )
    .unwrap();
    let sopts = r2c::CoreOptions {
        slab: Some(slab.clone()),
        ..opts()
    };
    let (srv, workers) = Runtime::spawn_split(server.remove(0), sopts, split, move |_| Upper {
        seen: s2.clone(),
        waiting: VecDeque::new(),
    })
    .unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let bad = Arc::new(Mutex::new(Vec::new()));
    let (d, b) = (done.clone(), bad.clone());
    let cli = Runtime::spawn_inline(client, opts(), move |_| Client {
        conns: 24,
        len: 30_000,
        got: HashMap::new(),
        done: d.clone(),
        bad: b.clone(),
    })
    .unwrap();
    wait_for("split replies", || {
        done.load(Ordering::SeqCst) == 24 || !bad.lock().unwrap().is_empty()
    });
    assert!(bad.lock().unwrap().is_empty(), "{:?}", bad.lock().unwrap());
    // Readable while running: the I/O core published stats showing the ring traffic.
    wait_for("published stats", || srv.stats()[0].to_workers > 0);
    cli.stop();
    srv.stop();
    cli.join().unwrap();
    let reports = srv.join().unwrap();
    let st = reports[0].stats;
    assert_eq!(st.accepted, 24);
    assert!(st.to_workers >= 24 * 2 && st.from_workers >= 24, "{st:?}");
    // Handlers ran on worker threads, not the test thread or the I/O core, and the
    // steering hash used more than one worker.
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 24);
    assert!(seen.iter().all(|(_, t)| *t != std::thread::current().id()));
    let mut used: Vec<usize> = seen.iter().map(|(w, _)| *w).collect();
    used.sort();
    used.dedup();
    assert!(used.len() > 1, "{used:?}");
    let msgs: u64 = (0..workers.len())
        .map(|i| {
            workers
                .stats(i)
                .unwrap()
                .messages_in
                .load(Ordering::Relaxed)
        })
        .sum();
    assert!(msgs >= 48);
}

/// What a [`Tally`] worker saw of each connection.
#[derive(Default, Debug, Clone)]
struct Seen {
    bytes: usize,
    eofs: usize,
    data_after_eof: bool,
}

/// Counts each connection's bytes and ends; closes a connection at its end.
struct Tally {
    seen: Arc<Mutex<HashMap<Conn, Seen>>>,
}

impl Handler for Tally {
    fn on_message(&mut self, ctx: &mut WorkerCtx<'_>, msg: ToWorker) {
        let mut seen = self.seen.lock().unwrap();
        match msg {
            ToWorker::Data { conn, data } => {
                let s = seen.entry(conn).or_default();
                s.bytes += data.len();
                s.data_after_eof |= s.eofs > 0;
            }
            ToWorker::Eof { conn } => {
                seen.entry(conn).or_default().eofs += 1;
                ctx.close(conn);
            }
            _ => {}
        }
    }
}

/// Sends `len` bytes on each of `conns` connections, then closes at once (the data and
/// the FIN leave in one burst).
struct SendAndClose {
    conns: usize,
    len: usize,
    port: u16,
}

impl InlineApp for SendAndClose {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        for _ in 0..self.conns {
            ctx.connect(server_addr(self.port)).unwrap();
        }
    }
    fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        ctx.send_all(conn, Zbuf::from_vec(vec![b'x'; self.len]))
            .unwrap();
        ctx.close(conn);
    }
}

/// The end of a stream reaches the worker once. A request in several segments with the
/// FIN in one received burst raises one `Readable` per segment; the first pass reads
/// everything and the end, and every later `Readable` found the end again and sent
/// another `Eof` (the worker closed, or answered, the same connection several times).
#[test]
fn split_end_of_stream_reaches_the_worker_once() {
    const CONNS: usize = 16;
    const LEN: usize = 6000;
    let (mut server, client) = pair(1, 1, |_| {});
    let seen = Arc::new(Mutex::new(HashMap::new()));
    let s2 = seen.clone();
    let split = SplitConfig {
        listen: vec![(9, 1024)],
        workers: 2,
        ..SplitConfig::default()
    };
    let (srv, _workers) = Runtime::spawn_split(server.remove(0), opts(), split, move |_| Tally {
        seen: s2.clone(),
    })
    .unwrap();
    let cli = Runtime::spawn_inline(client, opts(), move |_| SendAndClose {
        conns: CONNS,
        len: LEN,
        port: 9,
    })
    .unwrap();
    wait_for("every end at the workers", || {
        let s = seen.lock().unwrap();
        s.len() == CONNS && s.values().all(|s| s.eofs > 0)
    });
    cli.stop();
    srv.stop();
    cli.join().unwrap();
    srv.join().unwrap();
    let seen = seen.lock().unwrap();
    let wrong: Vec<&Seen> = seen
        .values()
        .filter(|s| s.eofs != 1 || s.bytes != LEN || s.data_after_eof)
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {CONNS} connections: {wrong:?}",
        wrong.len()
    );
}

/// Asks for one connection to `to` when first idle once `go` is set, and records how the
/// worker learns what became of it.
struct Dialer {
    to: core::net::SocketAddrV4,
    go: Arc<std::sync::atomic::AtomicBool>,
    asked: bool,
    known: Vec<Conn>,
    /// Tokens answered (connected or failed), and closes of handles never announced.
    answers: Arc<Mutex<Vec<String>>>,
}

impl Handler for Dialer {
    fn on_message(&mut self, _ctx: &mut WorkerCtx<'_>, msg: ToWorker) {
        let note = match msg {
            ToWorker::Connected { conn, token } => {
                self.known.push(conn);
                format!("connected {token}")
            }
            ToWorker::ConnectFailed { token, .. } => format!("failed {token}"),
            ToWorker::Closed { conn, .. } if !self.known.contains(&conn) => {
                "closed a handle never announced".to_string()
            }
            _ => return,
        };
        self.answers.lock().unwrap().push(note);
    }
    fn on_idle(&mut self, ctx: &mut WorkerCtx<'_>) {
        if !self.asked && self.go.load(Ordering::SeqCst) {
            self.asked = true;
            ctx.connect(7, self.to);
        }
    }
}

/// Listens on nothing: its stack refuses every connection with a RST.
struct Nobody;
impl InlineApp for Nobody {}

/// A worker's connect that the peer refuses after the connect was accepted (a RST to the
/// SYN) is answered with its token. The worker knew the connection only by its token,
/// and got a `Closed` for a handle it had never been told of: the connect was never
/// answered and the worker could not tell which of its connects had ended.
#[test]
fn split_a_refused_connect_is_answered_with_its_token() {
    let (mut server, client) = pair(1, 1, |_| {});
    let answers = Arc::new(Mutex::new(Vec::new()));
    let a2 = answers.clone();
    let to = core::net::SocketAddrV4::new(CLIENT_IP, 4444);
    let split = SplitConfig {
        workers: 1,
        ..SplitConfig::default()
    };
    let (srv, _workers) = Runtime::spawn_split(server.remove(0), opts(), split, move |_| Dialer {
        to,
        go: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        asked: false,
        known: Vec::new(),
        answers: a2.clone(),
    })
    .unwrap();
    let cli = Runtime::spawn_inline(client, opts(), |_| Nobody).unwrap();
    wait_for("an answer", || !answers.lock().unwrap().is_empty());
    cli.stop();
    srv.stop();
    cli.join().unwrap();
    srv.join().unwrap();
    assert_eq!(*answers.lock().unwrap(), ["failed 7"]);
}

/// Panics on the first bytes it is given.
struct Panicky;
impl Handler for Panicky {
    fn on_message(&mut self, _ctx: &mut WorkerCtx<'_>, msg: ToWorker) {
        if let ToWorker::Data { .. } = msg {
            panic!("handler bug (deliberate)");
        }
    }
}

/// Sends one request and notes when the server ends the connection.
struct Asker {
    ended: Arc<std::sync::atomic::AtomicBool>,
}
impl InlineApp for Asker {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        ctx.connect(server_addr(9)).unwrap();
    }
    fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        ctx.send_all(conn, Zbuf::from_vec(b"request".to_vec()))
            .unwrap();
    }
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        loop {
            match ctx.recv(conn) {
                Ok(Some(_)) => {}
                Ok(None) => return,
                Err(_) => break,
            }
        }
        self.ended.store(true, Ordering::SeqCst);
        ctx.close(conn);
    }
    fn on_closed(&mut self, _ctx: &mut Ctx<'_>, _conn: Conn, _r: Option<CloseReason>) {
        self.ended.store(true, Ordering::SeqCst);
    }
}

/// A worker whose handler panics stops the runtime, as a core that panics does: the I/O
/// core closes the connections (the dead worker's too, which nobody would ever answer)
/// and `join` reports the panic. The I/O core went on without noticing; the client
/// waited for its answer for good, and so did a `join` nothing stopped.
#[test]
fn split_a_worker_that_panics_stops_the_runtime_and_its_connections_end() {
    let (mut server, client) = pair(1, 1, |_| {});
    let split = SplitConfig {
        listen: vec![(9, 16)],
        workers: 1,
        ..SplitConfig::default()
    };
    let (srv, _workers) =
        Runtime::spawn_split(server.remove(0), opts(), split, |_| Panicky).unwrap();
    let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let e2 = ended.clone();
    let cli = Runtime::spawn_inline(client, opts(), move |_| Asker { ended: e2.clone() }).unwrap();
    // Far longer than the shutdown grace (2 s): a hang guard, not a timing assertion.
    let start = std::time::Instant::now();
    while !(ended.load(Ordering::SeqCst) && srv.stop_handle().is_stopped()) {
        if start.elapsed() > std::time::Duration::from_secs(30) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let (stopped, ended) = (srv.stop_handle().is_stopped(), ended.load(Ordering::SeqCst));
    cli.stop();
    srv.stop();
    cli.join().unwrap();
    let joined = srv.join();
    assert!(
        stopped && ended,
        "runtime stopped by itself: {stopped}, client's connection ended: {ended}"
    );
    let e = joined.expect_err("the worker's panic is reported");
    assert!(e.to_string().contains("panicked"), "{e}");
}

/// Answers a connection's first bytes with one `len`-byte reply, then closes it.
struct BigReply {
    len: usize,
    answered: Vec<Conn>,
}

impl Handler for BigReply {
    fn on_message(&mut self, ctx: &mut WorkerCtx<'_>, msg: ToWorker) {
        if let ToWorker::Data { conn, .. } = msg {
            if !self.answered.contains(&conn) {
                self.answered.push(conn);
                let reply = Zbuf::from_vec((0..self.len).map(|i| (i % 251) as u8).collect());
                assert!(ctx.send(conn, reply).is_ok(), "the first send is taken");
                ctx.close(conn);
            }
        }
    }
}

/// Reads everything, checking the pattern, until the end of the stream.
struct Reader {
    got: usize,
    bad: bool,
    done: Arc<Mutex<Option<(usize, bool)>>>,
}

impl InlineApp for Reader {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        ctx.connect(server_addr(9)).unwrap();
    }
    fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        ctx.send_all(conn, Zbuf::from_vec(b"go".to_vec())).unwrap();
    }
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        loop {
            match ctx.recv(conn) {
                Ok(Some(b)) => {
                    for (k, &x) in b.iter().enumerate() {
                        self.bad |= x != ((self.got + k) % 251) as u8;
                    }
                    self.got += b.len();
                }
                Ok(None) => return,
                Err(_) => break,
            }
        }
        *self.done.lock().unwrap() = Some((self.got, self.bad));
        ctx.close(conn);
    }
}

/// A reply larger than the send buffer and the runtime's backlog together goes out as
/// the peer takes it. The I/O core offered it whole to the all-or-nothing `send_all`,
/// which can never take it: the reply stalled for good, and every later message of its
/// worker (for any connection) behind it.
#[test]
fn split_a_reply_larger_than_buffer_and_backlog_goes_out_whole() {
    const LEN: usize = 2 << 20;
    let (mut server, client) = pair(1, 1, |_| {});
    let split = SplitConfig {
        listen: vec![(9, 16)],
        workers: 1,
        ..SplitConfig::default()
    };
    // Send buffer 1 MiB (the stack's default) + backlog 64 KiB < the reply.
    let sopts = r2c::CoreOptions {
        max_backlog: 64 << 10,
        ..opts()
    };
    let (srv, _workers) = Runtime::spawn_split(server.remove(0), sopts, split, |_| BigReply {
        len: LEN,
        answered: Vec::new(),
    })
    .unwrap();
    let done = Arc::new(Mutex::new(None));
    let d2 = done.clone();
    let cli = Runtime::spawn_inline(client, opts(), move |_| Reader {
        got: 0,
        bad: false,
        done: d2.clone(),
    })
    .unwrap();
    // A hang guard, not a timing assertion (2 MiB over memory takes well under a second).
    let start = std::time::Instant::now();
    while done.lock().unwrap().is_none() && start.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let result = *done.lock().unwrap();
    cli.stop();
    srv.stop();
    cli.join().unwrap();
    srv.join().unwrap();
    assert_eq!(
        result,
        Some((LEN, false)),
        "(bytes, corrupted) the client read"
    );
}

/// The first connection's request is answered with `flood` 1 MiB replies and then reset
/// (a peer that does not read them); every later connection's with "ok" and a close.
struct FloodThenAbort {
    flood: usize,
    first: Option<Conn>,
}

impl Handler for FloodThenAbort {
    fn on_message(&mut self, ctx: &mut WorkerCtx<'_>, msg: ToWorker) {
        let ToWorker::Data { conn, .. } = msg else {
            return;
        };
        if self.first.is_none() {
            self.first = Some(conn);
            for _ in 0..self.flood {
                let r = ctx.send(conn, Zbuf::from_vec(vec![b'f'; 1 << 20]));
                assert!(r.is_ok(), "the worker's reply queue has room");
            }
            ctx.abort(conn);
        } else if self.first != Some(conn) {
            assert!(ctx.send(conn, Zbuf::from_vec(b"ok".to_vec())).is_ok());
            ctx.close(conn);
        }
    }
}

/// Connection 0 asks and never reads; connection 1 asks once connection 0 is reset,
/// and reads its answer.
#[derive(Default)]
struct Patient {
    conns: Vec<Conn>,
    /// Connection 0 was reset; connection 1's answer and whether its stream ended.
    out: Arc<Mutex<(bool, Vec<u8>, bool)>>,
}

impl InlineApp for Patient {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        self.conns.push(ctx.connect(server_addr(9)).unwrap());
    }
    fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        ctx.send_all(conn, Zbuf::from_vec(b"go".to_vec())).unwrap();
    }
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        if conn == self.conns[0] {
            return; // never reads
        }
        let mut out = self.out.lock().unwrap();
        loop {
            match ctx.recv(conn) {
                Ok(Some(b)) => out.1.extend_from_slice(&b),
                Ok(None) => return,
                Err(_) => break,
            }
        }
        out.2 = true;
        ctx.close(conn);
    }
    fn on_closed(&mut self, ctx: &mut Ctx<'_>, conn: Conn, reason: Option<CloseReason>) {
        if conn == self.conns[0] {
            self.out.lock().unwrap().0 = reason == Some(CloseReason::Reset);
            self.conns.push(ctx.connect(server_addr(9)).unwrap());
        }
    }
}

/// A worker's reset of a connection whose peer does not read takes effect: it overtakes
/// the replies still queued for that connection. It waited behind them in the worker's
/// ring, and they waited for room the peer never made: the connection was never reset,
/// and every later reply of the worker (another connection's here) stalled behind it.
#[test]
fn split_a_reset_overtakes_replies_a_peer_does_not_read() {
    let (mut server, client) = pair(1, 1, |_| {});
    let split = SplitConfig {
        listen: vec![(9, 16)],
        workers: 1,
        ..SplitConfig::default()
    };
    let sopts = r2c::CoreOptions {
        max_backlog: 64 << 10,
        ..opts()
    };
    // 4 MiB: more than the client's receive window, the server's send buffer (1 MiB)
    // and its backlog (64 KiB) together.
    let (srv, _workers) =
        Runtime::spawn_split(server.remove(0), sopts, split, |_| FloodThenAbort {
            flood: 4,
            first: None,
        })
        .unwrap();
    let out = Arc::new(Mutex::new((false, Vec::new(), false)));
    let o2 = out.clone();
    let cli = Runtime::spawn_inline(client, opts(), move |_| Patient {
        conns: Vec::new(),
        out: o2.clone(),
    })
    .unwrap();
    // A hang guard, not a timing assertion.
    let start = std::time::Instant::now();
    while !out.lock().unwrap().2 && start.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let got = out.lock().unwrap().clone();
    cli.stop();
    srv.stop();
    cli.join().unwrap();
    srv.join().unwrap();
    assert_eq!(got, (true, b"ok".to_vec(), true), "(reset, answer, ended)");
}

/// Takes a while over each request (`work`), then answers "done" and closes.
struct Slow {
    work: std::time::Duration,
    working: Arc<std::sync::atomic::AtomicBool>,
}

impl Handler for Slow {
    fn on_message(&mut self, ctx: &mut WorkerCtx<'_>, msg: ToWorker) {
        if let ToWorker::Data { conn, .. } = msg {
            self.working.store(true, Ordering::SeqCst);
            std::thread::sleep(self.work);
            assert!(ctx.send(conn, Zbuf::from_vec(b"done".to_vec())).is_ok());
            ctx.close(conn);
        }
    }
}

/// Sends a request and keeps what comes back until the end of the stream.
struct Requester {
    got: Vec<u8>,
    out: Arc<Mutex<Option<Vec<u8>>>>,
}

impl InlineApp for Requester {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        ctx.connect(server_addr(9)).unwrap();
    }
    fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        ctx.send_all(conn, Zbuf::from_vec(b"req".to_vec())).unwrap();
    }
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        loop {
            match ctx.recv(conn) {
                Ok(Some(b)) => self.got.extend_from_slice(&b),
                Ok(None) => return,
                Err(_) => break,
            }
        }
        *self.out.lock().unwrap() = Some(std::mem::take(&mut self.got));
        ctx.close(conn);
    }
    fn on_closed(&mut self, _ctx: &mut Ctx<'_>, _conn: Conn, _r: Option<CloseReason>) {
        let mut out = self.out.lock().unwrap();
        if out.is_none() {
            *out = Some(std::mem::take(&mut self.got));
        }
    }
}

/// A graceful stop lets the workers finish what they were given before it: a reply a
/// worker was computing when the stop came goes out before the FIN. The I/O core closed
/// every connection at once, and the reply, arriving a moment later, was refused (the
/// connection was shut) and dropped uncounted: the client got a FIN and no answer.
#[test]
fn split_a_graceful_stop_delivers_the_reply_a_worker_was_computing() {
    let (mut server, client) = pair(1, 1, |_| {});
    let split = SplitConfig {
        listen: vec![(9, 16)],
        workers: 1,
        ..SplitConfig::default()
    };
    let working = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let w2 = working.clone();
    // The work (200 ms) is well inside the shutdown grace (2 s).
    let (srv, _workers) = Runtime::spawn_split(server.remove(0), opts(), split, move |_| Slow {
        work: std::time::Duration::from_millis(200),
        working: w2.clone(),
    })
    .unwrap();
    let out = Arc::new(Mutex::new(None));
    let o2 = out.clone();
    let cli = Runtime::spawn_inline(client, opts(), move |_| Requester {
        got: Vec::new(),
        out: o2.clone(),
    })
    .unwrap();
    wait_for("the worker at work", || working.load(Ordering::SeqCst));
    srv.stop();
    wait_for("the client's connection to end", || {
        out.lock().unwrap().is_some()
    });
    cli.stop();
    cli.join().unwrap();
    srv.join().unwrap();
    assert_eq!(out.lock().unwrap().as_deref(), Some(&b"done"[..]));
}

/// Blocks in its first message until `release` is set (a worker far slower than its
/// peers).
struct Stuck {
    release: Arc<std::sync::atomic::AtomicBool>,
}

impl Handler for Stuck {
    fn on_message(&mut self, _ctx: &mut WorkerCtx<'_>, _msg: ToWorker) {
        while !self.release.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// Opens `conns` connections and resets each a moment after it is established (once
/// the server has accepted it).
struct ConnectReset {
    conns: usize,
    open: Vec<(Conn, std::time::Instant)>,
    reset: Arc<AtomicUsize>,
}

impl InlineApp for ConnectReset {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        for _ in 0..self.conns {
            ctx.connect(server_addr(9)).unwrap();
        }
    }
    fn on_connected(&mut self, _ctx: &mut Ctx<'_>, conn: Conn) {
        self.open.push((conn, std::time::Instant::now()));
    }
    fn on_poll(&mut self, ctx: &mut Ctx<'_>) {
        let since = std::time::Duration::from_millis(20);
        while self.open.first().is_some_and(|(_, t)| t.elapsed() > since) {
            ctx.abort(self.open.remove(0).0);
            self.reset.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// While a worker is stuck, connections steered to it that open and reset leave nothing
/// behind for it: the I/O core forgets the news of a connection its worker was never
/// told of. It kept an `Accepted` and a `Closed` per connection in the worker's overflow
/// queue, without bound (a peer looping connect and reset grew it for as long as the
/// worker was stuck), and the worker, once free, was told of 300 connections long gone.
#[test]
fn split_a_stuck_worker_is_not_told_of_connections_that_came_and_went() {
    const CONNS: usize = 300;
    let (mut server, client) = pair(1, 1, |_| {});
    let split = SplitConfig {
        listen: vec![(9, 1024)],
        workers: 1,
        ring_size: 4,
        ..SplitConfig::default()
    };
    let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r2 = release.clone();
    let (srv, workers) = Runtime::spawn_split(server.remove(0), opts(), split, move |_| Stuck {
        release: r2.clone(),
    })
    .unwrap();
    let reset = Arc::new(AtomicUsize::new(0));
    let r3 = reset.clone();
    let cli = Runtime::spawn_inline(client, opts(), move |_| ConnectReset {
        conns: CONNS,
        open: Vec::new(),
        reset: r3.clone(),
    })
    .unwrap();
    wait_for("every connection opened and reset", || {
        reset.load(Ordering::SeqCst) == CONNS && srv.stats()[0].closed as usize == CONNS
    });
    release.store(true, Ordering::SeqCst);
    let taken = || workers.stats(0).unwrap().messages_in.load(Ordering::SeqCst);
    // Until the worker has taken everything the I/O core counted, twice in a row.
    let mut last = u64::MAX;
    wait_for("the worker to drain its queue", || {
        let (to, n) = (srv.stats()[0].to_workers, taken());
        let steady = to == n && n == last;
        last = n;
        std::thread::sleep(std::time::Duration::from_millis(20));
        steady
    });
    let told = taken();
    cli.stop();
    srv.stop();
    cli.join().unwrap();
    srv.join().unwrap();
    // The connection the worker is stuck on and the ring's 4, each announced and closed.
    assert!(
        told <= 10,
        "the worker was told {told} things of {CONNS} connections gone"
    );
}

/// Answers a connection's request with 4 MiB (its peer does not read them), and asks for
/// one connection to `to` when first idle once `go` is set.
struct FloodAndDial {
    dial: Dialer,
}

impl Handler for FloodAndDial {
    fn on_message(&mut self, ctx: &mut WorkerCtx<'_>, msg: ToWorker) {
        if let ToWorker::Data { conn, .. } = &msg {
            for _ in 0..4 {
                let r = ctx.send(*conn, Zbuf::from_vec(vec![b'f'; 1 << 20]));
                assert!(r.is_ok(), "the worker's reply queue has room");
            }
            return;
        }
        self.dial.on_message(ctx, msg);
    }
    fn on_idle(&mut self, ctx: &mut WorkerCtx<'_>) {
        self.dial.on_idle(ctx);
    }
}

/// Listens on 4445 and holds what it accepts; asks the server on port 9 and never reads.
struct AskAndHold;

impl InlineApp for AskAndHold {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        ctx.listen(4445, 16).unwrap();
        ctx.connect(server_addr(9)).unwrap();
    }
    fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        ctx.send_all(conn, Zbuf::from_vec(b"go".to_vec())).unwrap();
    }
}

/// A connect a worker asks for once the runtime is stopping is refused
/// (`ConnectFailure::Stopping`). It was opened while shutdown went on (here a peer that
/// does not read holds the runtime in its grace): the worker was told `Connected`, and
/// the connection was reset when the grace ran out.
#[test]
fn split_a_connect_asked_during_shutdown_is_refused() {
    let (mut server, client) = pair(1, 1, |_| {});
    let answers = Arc::new(Mutex::new(Vec::new()));
    let a2 = answers.clone();
    let go = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let g2 = go.clone();
    let to = core::net::SocketAddrV4::new(CLIENT_IP, 4445);
    // Two workers: the one serving the client's connection is held up by its replies
    // (its connect waits behind them); the other's connect is answered.
    let split = SplitConfig {
        listen: vec![(9, 16)],
        workers: 2,
        ..SplitConfig::default()
    };
    let sopts = r2c::CoreOptions {
        max_backlog: 64 << 10,
        ..opts()
    };
    let (srv, _workers) =
        Runtime::spawn_split(server.remove(0), sopts, split, move |_| FloodAndDial {
            dial: Dialer {
                to,
                go: g2.clone(),
                asked: false,
                known: Vec::new(),
                answers: a2.clone(),
            },
        })
        .unwrap();
    let cli = Runtime::spawn_inline(client, opts(), |_| AskAndHold).unwrap();
    wait_for("the replies to stall", || srv.stats()[0].backlog_bytes > 0);
    srv.stop();
    // Published 128 iterations later (stats every 64): the core has seen the stop.
    let seen = srv.stats()[0].iterations + 128;
    wait_for("the core to see the stop", || {
        srv.stats()[0].iterations > seen
    });
    go.store(true, Ordering::SeqCst);
    srv.join().unwrap();
    cli.stop();
    cli.join().unwrap();
    // Each worker's connect (the held-up one's too, once shutdown dropped its replies).
    let answers = answers.lock().unwrap();
    assert!(
        !answers.is_empty() && answers.iter().all(|a| a == "failed 7"),
        "{answers:?}"
    );
}

/// Echoes every chunk as it arrives (many small sends), holding what its reply queue
/// refuses, in order; closes at the end of the stream.
#[derive(Default)]
struct Echo {
    waiting: VecDeque<Out>,
}

impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut WorkerCtx<'_>, msg: ToWorker) {
        match msg {
            ToWorker::Data { conn, data } => {
                // Split into small pieces: more messages, more chances to reorder.
                let mut rest = data;
                while !rest.is_empty() {
                    let piece = rest.split_to(rest.len().min(6000));
                    self.waiting.push_back(Out::Send(conn, piece));
                }
            }
            ToWorker::Eof { conn } => self.waiting.push_back(Out::Close(conn)),
            _ => {}
        }
        self.on_idle(ctx);
    }
    fn on_idle(&mut self, ctx: &mut WorkerCtx<'_>) {
        while let Some(o) = self.waiting.pop_front() {
            match o {
                Out::Send(conn, data) => {
                    if let Err(WouldBlock(data)) = ctx.send(conn, data) {
                        self.waiting.push_front(Out::Send(conn, data));
                        return;
                    }
                }
                Out::Close(conn) => ctx.close(conn),
            }
        }
    }
}

/// Sends `len` bytes on each of `conns` connections, reads the echo as it comes and
/// checks it byte for byte once it has `len` bytes (or the stream ended).
struct EchoClient {
    conns: usize,
    len: usize,
    state: HashMap<Conn, (usize, Vec<u8>)>,
    done: Arc<AtomicUsize>,
    bad: Arc<Mutex<Vec<String>>>,
}

impl InlineApp for EchoClient {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        for i in 0..self.conns {
            let c = ctx.connect(server_addr(9)).unwrap();
            self.state.insert(c, (i, Vec::new()));
        }
    }
    fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        let idx = self.state[&conn].0;
        ctx.send_all(conn, Zbuf::from_vec(message(0, idx, self.len)))
            .unwrap();
    }
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        let ended = loop {
            match ctx.recv(conn) {
                Ok(Some(b)) => self.state.get_mut(&conn).unwrap().1.extend_from_slice(&b),
                Ok(None) => break false,
                Err(_) => break true,
            }
        };
        let (idx, got) = &self.state[&conn];
        if ended || got.len() >= self.len {
            if *got != message(0, *idx, self.len) {
                let at = got
                    .iter()
                    .zip(message(0, *idx, self.len))
                    .position(|(a, b)| *a != b);
                self.bad.lock().unwrap().push(format!(
                    "conn {idx}: {} bytes, first difference at {at:?}",
                    got.len()
                ));
            }
            ctx.close(conn);
            self.done.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Each connection's echo comes back in order, byte for byte, while replies stall on
/// full backlogs (16 KiB, behind a 16 KiB send buffer), the worker's reply queue refuses (a ring of 4, a backlog of
/// 8) and the I/O core's rings to the workers fill: the stalled reply is retried before
/// any later one of its worker, and a connection's backlog goes before new bytes.
#[test]
fn split_echo_keeps_each_connections_byte_order_under_back_pressure() {
    const CONNS: usize = 12;
    const LEN: usize = 400_000;
    let (mut server, client) = pair(1, 1, |_| {});
    let split = SplitConfig {
        listen: vec![(9, 1024)],
        workers: 2,
        ring_size: 4,
        worker_backlog: 8,
        ..SplitConfig::default()
    };
    // Small buffers, so replies stall on full backlogs.
    server[0].stack.tcp.snd_buf = 16 << 10;
    let sopts = r2c::CoreOptions {
        max_backlog: 16 << 10,
        ..opts()
    };
    let (srv, workers) =
        Runtime::spawn_split(server.remove(0), sopts, split, |_| Echo::default()).unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let bad = Arc::new(Mutex::new(Vec::new()));
    let (d, b) = (done.clone(), bad.clone());
    let cli = Runtime::spawn_inline(client, opts(), move |_| EchoClient {
        conns: CONNS,
        len: LEN,
        state: HashMap::new(),
        done: d.clone(),
        bad: b.clone(),
    })
    .unwrap();
    wait_for("every echo", || done.load(Ordering::SeqCst) == CONNS);
    cli.stop();
    srv.stop();
    cli.join().unwrap();
    let reports = srv.join().unwrap();
    assert!(bad.lock().unwrap().is_empty(), "{:?}", bad.lock().unwrap());
    // The back pressure was there: connections paused on full rings, replies waited in
    // the workers.
    let full: u64 = (0..workers.len())
        .map(|w| workers.stats(w).unwrap().ring_full.load(Ordering::Relaxed))
        .sum();
    assert!(reports[0].stats.worker_ring_full > 0 && full > 0, "{full}");
}
