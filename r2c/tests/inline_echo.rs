//! inline-r2c: an echo server and clients on several cores over an in-memory link.

mod common;

use common::*;
use r2c::{Conn, Ctx, InlineApp, Runtime};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use zbuf::Zbuf;

struct Echo;

impl InlineApp for Echo {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        ctx.listen(7, 1024).expect("port 7 is free");
    }
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        loop {
            match ctx.recv(conn) {
                Ok(Some(buf)) => {
                    if ctx.send_all(conn, buf).is_err() {
                        return ctx.abort(conn);
                    }
                }
                Ok(None) => return,
                Err(_) => return ctx.close(conn),
            }
        }
    }
}

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
        while let Ok(Some(b)) = ctx.recv(conn) {
            let e = self.got.get_mut(&conn).unwrap();
            e.1.extend_from_slice(&b);
        }
        let (idx, data) = &self.got[&conn];
        if data.len() >= self.len {
            if *data != message(self.core, *idx, self.len) {
                self.bad
                    .lock()
                    .unwrap()
                    .push(format!("core {} conn {idx}: echo differs", self.core));
            }
            ctx.close(conn);
            self.done.fetch_add(1, Ordering::SeqCst);
        }
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
    let srv = Runtime::spawn_inline(server, opts.clone(), |_| Echo).unwrap();
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
