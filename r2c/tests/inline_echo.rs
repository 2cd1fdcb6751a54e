//! inline-r2c: an echo server and clients on several cores over an in-memory link.

mod common;
#[path = "common/echo.rs"]
mod echo;

use common::*;
use r2c::{Conn, Ctx, InlineApp, Runtime};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use zbuf::Zbuf;

/// Opens `conns` connections, sends one message on each, checks the echo byte for byte.
pub struct Client {
    pub conns: usize,
    pub len: usize,
    pub core: usize,
    pub got: HashMap<Conn, (usize, Vec<u8>)>,
    pub next: usize,
    pub done: Arc<AtomicUsize>,
    pub bad: Arc<Mutex<Vec<String>>>,
    pub connected_on: Arc<Mutex<Vec<(usize, u16)>>>,
}

impl InlineApp for Client {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        self.core = ctx.core();
        for _ in 0..self.conns {
            match ctx.connect(server_addr(7)) {
                Ok(c) => {
                    self.got.insert(c, (self.next, Vec::new()));
                    self.next += 1;
                }
                Err(e) => self.bad.lock().unwrap().push(format!("connect: {e:?}")),
            }
        }
    }
    fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        let (local, _) = ctx.addrs(conn).unwrap();
        self.connected_on
            .lock()
            .unwrap()
            .push((ctx.core(), local.port()));
        let idx = self.got[&conn].0;
        let msg = message(self.core, idx, self.len);
        ctx.send_all(conn, Zbuf::from_vec(msg)).unwrap();
    }
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        self.take_echo(ctx, conn, 0);
    }
    fn on_closed(
        &mut self,
        _ctx: &mut Ctx<'_>,
        conn: Conn,
        reason: Option<luna_stack::tcp::CloseReason>,
    ) {
        self.bad
            .lock()
            .unwrap()
            .push(format!("conn {conn:?} closed early: {reason:?}"));
    }
}

impl Client {
    /// Reads what `conn` has; once `skip` bytes of preamble and the whole message are in,
    /// checks the message byte for byte, closes and counts the connection done.
    fn take_echo(&mut self, ctx: &mut Ctx<'_>, conn: Conn, skip: usize) {
        while let Ok(Some(b)) = ctx.recv(conn) {
            let e = self.got.get_mut(&conn).unwrap();
            e.1.extend_from_slice(&b);
        }
        let (idx, data) = &self.got[&conn];
        if data.len() >= skip + self.len {
            if data[skip..] != message(self.core, *idx, self.len) {
                self.bad
                    .lock()
                    .unwrap()
                    .push(format!("core {} conn {idx}: echo differs", self.core));
            }
            ctx.close(conn);
            self.done.fetch_add(1, Ordering::SeqCst);
        }
    }
}

pub fn run_echo(
    server_q: u16,
    client_q: u16,
    conns: usize,
    len: usize,
    tweak: impl FnOnce(&mut r2c::device::mem::MemConfig),
) {
    run_echo_opts(server_q, client_q, conns, len, tweak, opts());
}

/// [`run_echo`] with explicit core options.
pub fn run_echo_opts(
    server_q: u16,
    client_q: u16,
    conns: usize,
    len: usize,
    tweak: impl FnOnce(&mut r2c::device::mem::MemConfig),
    opts: r2c::CoreOptions,
) {
    let (server, client) = pair(server_q, client_q, tweak);
    let srv = Runtime::spawn_inline(server, opts.clone(), |_| echo::Echo {
        port: 7,
        backlog: 1024,
    })
    .unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let bad = Arc::new(Mutex::new(Vec::new()));
    let connected_on = Arc::new(Mutex::new(Vec::new()));
    let (d, b, c) = (done.clone(), bad.clone(), connected_on.clone());
    let cli = Runtime::spawn_inline(client, opts, move |core| Client {
        conns,
        len,
        core,
        got: HashMap::new(),
        next: 0,
        done: d.clone(),
        bad: b.clone(),
        connected_on: c.clone(),
    })
    .unwrap();
    let total = conns * usize::from(client_q);
    wait_for("all echoes", || {
        done.load(Ordering::SeqCst) == total || !bad.lock().unwrap().is_empty()
    });
    assert!(bad.lock().unwrap().is_empty(), "{:?}", bad.lock().unwrap());
    // Every connection completed on the core that opened it.
    assert_eq!(connected_on.lock().unwrap().len(), total);
    cli.stop();
    srv.stop();
    let creports = cli.join().unwrap();
    let sreports = srv.join().unwrap();
    let accepted: u64 = sreports.iter().map(|r| r.stats.accepted).sum();
    assert_eq!(accepted, total as u64);
    for r in creports.iter().chain(&sreports) {
        assert_eq!(r.stats.stopped, 1);
        assert_eq!(r.stats.tx_dropped, 0, "{r:?}");
    }
    if server_q > 1 {
        // RSS spread the connections: more than one server core accepted some.
        assert!(
            sreports.iter().filter(|r| r.stats.accepted > 0).count() > 1,
            "{sreports:?}"
        );
    }
}

#[test]
fn inline_echo_one_core_each() {
    run_echo(1, 1, 4, 3000, |_| {});
}

#[test]
fn inline_echo_two_server_cores_two_client_cores() {
    run_echo(2, 2, 16, 20_000, |_| {});
}

/// Regression (5,000 knb connections closing at once): a full transmit queue stops the
/// core from polling the stack instead of emitting frames and dropping them.
#[test]
fn inline_echo_a_full_tx_queue_holds_frames_in_the_stack() {
    let o = r2c::CoreOptions {
        tx_queue_limit: 2,
        ..opts()
    };
    run_echo_opts(1, 1, 16, 20_000, |_| {}, o);
}

#[test]
fn inline_echo_survives_a_lossy_link() {
    // 5% loss each way: TCP retransmits (with SACK), every byte still arrives.
    run_echo(1, 1, 4, 50_000, |c| {
        c.loss = 0.05;
        c.seed = 7;
    });
}

#[test]
fn inline_echo_with_latency_two_server_queues() {
    run_echo(2, 1, 4, 8000, |c| {
        c.latency = std::time::Duration::from_micros(200);
    });
}

/// An echo server that counts its `on_readable` calls and reads at most `per_call`
/// buffers in each (usize::MAX: until `recv` says `None`). With `greet` it sends one byte
/// when it accepts a connection (its clients send only after that byte, so no data
/// arrives before the accept).
struct CountingEcho {
    per_call: usize,
    greet: bool,
    calls: Arc<AtomicUsize>,
}

impl InlineApp for CountingEcho {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        ctx.listen(7, 1024).expect("port 7 is free");
    }
    fn on_accept(&mut self, ctx: &mut Ctx<'_>, conn: Conn, _l: r2c::Listener) {
        if self.greet && ctx.send_all(conn, Zbuf::from_vec(vec![b'!'])).is_err() {
            ctx.abort(conn);
        }
    }
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        echo::echo_up_to(ctx, conn, self.per_call);
    }
}

/// [`Client`] for a greeting server: sends its message once the greeting byte arrived
/// and expects it back after that byte.
struct GreetedClient(Client);

impl InlineApp for GreetedClient {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        self.0.on_start(ctx);
    }
    fn on_connected(&mut self, _ctx: &mut Ctx<'_>, _conn: Conn) {}
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        let c = &mut self.0;
        let greeted = c.got.get(&conn).is_some_and(|(_, d)| !d.is_empty());
        if !greeted {
            match ctx.recv(conn) {
                Ok(Some(b)) if b.len() == 1 && b[0] == b'!' => {
                    let idx = c.got[&conn].0;
                    c.got.get_mut(&conn).unwrap().1.push(b'!');
                    let msg = message(c.core, idx, c.len);
                    ctx.send_all(conn, Zbuf::from_vec(msg)).unwrap();
                }
                Ok(None) => return,
                other => {
                    let what =
                        format!("{conn:?}: greeting {:?}", other.map(|b| b.map(|b| b.len())));
                    c.bad.lock().unwrap().push(what);
                    return;
                }
            }
        }
        c.take_echo(ctx, conn, 1);
    }
    fn on_closed(
        &mut self,
        ctx: &mut Ctx<'_>,
        conn: Conn,
        r: Option<luna_stack::tcp::CloseReason>,
    ) {
        self.0.on_closed(ctx, conn, r);
    }
}

/// Runs `conns` greeted echo clients of `len` bytes against a [`CountingEcho`]; returns the
/// server's `on_readable` calls, its received frames and its coalesced events.
fn run_counting(per_call: usize, conns: usize, len: usize) -> (usize, u64, u64) {
    let (server, client_dev) = pair(1, 1, |_| {});
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = calls.clone();
    let srv = Runtime::spawn_inline(server, opts(), move |_| CountingEcho {
        per_call,
        greet: true,
        calls: c2.clone(),
    })
    .unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let bad = Arc::new(Mutex::new(Vec::new()));
    let (d, b) = (done.clone(), bad.clone());
    let client = move |core| Client {
        conns,
        len,
        core,
        got: HashMap::new(),
        next: 0,
        done: d.clone(),
        bad: b.clone(),
        connected_on: Arc::new(Mutex::new(Vec::new())),
    };
    let cli =
        Runtime::spawn_inline(client_dev, opts(), move |core| GreetedClient(client(core))).unwrap();
    wait_for("all echoes", || {
        done.load(Ordering::SeqCst) == conns || !bad.lock().unwrap().is_empty()
    });
    assert!(bad.lock().unwrap().is_empty(), "{:?}", bad.lock().unwrap());
    cli.stop();
    srv.stop();
    cli.join().unwrap();
    let s = srv.join().unwrap();
    let rx: u64 = s.iter().map(|r| r.stats.rx_frames).sum();
    let coalesced: u64 = s.iter().map(|r| r.stats.events_coalesced).sum();
    (calls.load(Ordering::SeqCst), rx, coalesced)
}

/// A burst of one connection's segments is one `on_readable` for an application that
/// reads what is there (an edge-triggered reader), not one per segment: 4 × 60 kB arrive
/// in bursts of up to 32 frames, and the server is called far fewer times than it
/// received frames. (Dispatching after each frame, as this mode once did, calls it once
/// per data segment: the assertion fails.)
#[test]
fn inline_readable_events_coalesce_per_burst() {
    let (calls, rx, coalesced) = run_counting(usize::MAX, 4, 60_000);
    // 240 kB at MSS 1460 is at least 165 data segments.
    assert!(rx >= 165, "{rx} frames received");
    assert!(
        coalesced > 0,
        "no event coalesced ({calls} calls, {rx} frames)"
    );
    assert!(
        (calls as u64) * 2 < rx,
        "{calls} on_readable calls for {rx} received frames"
    );
}

/// An application that reads one buffer per `on_readable` (a level-triggered habit) is
/// called again in the same pass while unread data remains: a burst of segments is still
/// one call per segment for it, and no byte is stranded. (Data that arrived before the
/// accept or that an out-of-order fill made readable is announced once, in every mode:
/// such an application has to read until `None`; the greeting keeps this test's data
/// after the accept.)
#[test]
fn inline_one_read_per_event_still_gets_every_byte() {
    let (calls, rx, _) = run_counting(1, 4, 60_000);
    assert!(calls > 0 && rx >= 165, "{calls} calls, {rx} frames");
}

/// The end of the stream is announced once per pass: an application that read to
/// `Finished` and keeps the connection (it answers a half-close) is not called again in
/// that pass for the burst's other segments, as the coalescing contract says
/// (`on_readable` again only while something it has not read remains). It was called
/// once more per segment the burst held, each time reading `Finished` again, and an
/// application answering the end of the stream without remembering it answered that
/// many times.
#[test]
fn inline_end_of_stream_is_announced_once_per_pass() {
    /// Reads everything; on end of stream answers `bye` and keeps the connection. Counts
    /// the calls in one dispatch pass (the same iteration, the same side of `on_poll`)
    /// for a connection whose end it already read in that pass.
    struct Answer {
        pass: (u64, bool),
        ended_in_pass: std::collections::HashSet<Conn>,
        again: Arc<AtomicUsize>,
        eofs: Arc<AtomicUsize>,
    }
    impl Answer {
        fn enter(&mut self, ctx: &Ctx<'_>, after_poll: bool) {
            let pass = (ctx.stats().iterations, after_poll);
            if pass != self.pass {
                self.pass = pass;
                self.ended_in_pass.clear();
            }
        }
    }
    impl InlineApp for Answer {
        fn on_start(&mut self, ctx: &mut Ctx<'_>) {
            ctx.listen(7, 64).unwrap();
        }
        fn on_poll(&mut self, ctx: &mut Ctx<'_>) {
            self.enter(ctx, true);
        }
        fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
            let after_poll = self.pass.0 == ctx.stats().iterations && self.pass.1;
            self.enter(ctx, after_poll);
            if self.ended_in_pass.contains(&conn) {
                self.again.fetch_add(1, Ordering::SeqCst);
            }
            loop {
                match ctx.recv(conn) {
                    Ok(Some(_)) => {}
                    Ok(None) => return,
                    Err(luna_stack::stack::RecvError::Finished) => {
                        if self.ended_in_pass.insert(conn) {
                            self.eofs.fetch_add(1, Ordering::SeqCst);
                            let _ = ctx.send_all(conn, Zbuf::from_static(b"bye"));
                        }
                        return;
                    }
                    Err(_) => return ctx.close(conn),
                }
            }
        }
    }
    /// Sends `len` bytes on each of `n` connections and closes them (FIN after the data).
    struct Burst {
        n: usize,
        len: usize,
    }
    impl InlineApp for Burst {
        fn on_start(&mut self, ctx: &mut Ctx<'_>) {
            for _ in 0..self.n {
                ctx.connect(server_addr(7)).unwrap();
            }
        }
        fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
            ctx.send_all(conn, Zbuf::from_vec(vec![7; self.len]))
                .unwrap();
            ctx.close(conn);
        }
    }
    let (server, client) = pair(1, 1, |_| {});
    let (again, eofs) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (a2, e2) = (again.clone(), eofs.clone());
    let srv = Runtime::spawn_inline(server, opts(), move |_| Answer {
        pass: (0, false),
        ended_in_pass: Default::default(),
        again: a2.clone(),
        eofs: e2.clone(),
    })
    .unwrap();
    let n = 16;
    let cli = Runtime::spawn_inline(client, opts(), move |_| Burst { n, len: 20_000 }).unwrap();
    wait_for("every end of stream", || eofs.load(Ordering::SeqCst) >= n);
    cli.stop();
    srv.stop();
    cli.join().unwrap();
    srv.join().unwrap();
    assert_eq!(
        again.load(Ordering::SeqCst),
        0,
        "on_readable calls in a pass after its end of stream was read"
    );
}
