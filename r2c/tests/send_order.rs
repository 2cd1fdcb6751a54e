//! Mixing the all-or-nothing send (runtime backlog) with the partial send on one
//! connection keeps the bytes in the order they were handed over.
//!
//! Regression: the partial send used to go straight to the TCP send buffer while the
//! runtime still held earlier bytes in its backlog. In `on_readable` an ACK has freed
//! send-buffer space but the backlog is only flushed on the `Writable` event that follows,
//! so the later bytes overtook the backlogged ones.

mod common;

use common::*;
use r2c::{Conn, Ctx, InlineApp, Runtime};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use zbuf::Zbuf;

/// The client's TCP send buffer.
const SND_BUF: u32 = 16 * 1024;
/// Bytes handed over all-or-nothing first (many send buffers' worth, so most of them
/// wait in the runtime's backlog).
const HEAD: usize = 512 * 1024;
/// Bytes handed over one at a time with the partial send afterwards.
const TAIL: usize = 64;

struct Echo;

impl InlineApp for Echo {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        ctx.listen(7, 16).expect("port 7 is free");
    }
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        while let Ok(Some(buf)) = ctx.recv(conn) {
            if ctx.send_all(conn, buf).is_err() {
                return ctx.abort(conn);
            }
        }
    }
}

fn head() -> Vec<u8> {
    message(0, 1, HEAD)
}

fn tail() -> Vec<u8> {
    (0..TAIL).map(|i| 0x80 | i as u8).collect()
}

struct Mixer {
    conn: Option<Conn>,
    /// The head was handed to the all-or-nothing send (the tail comes after it).
    head_sent: bool,
    /// Tail bytes the partial send has taken so far.
    tail_sent: usize,
    got: Vec<u8>,
    result: Arc<Mutex<Option<Result<(), String>>>>,
    done: Arc<AtomicBool>,
}

impl Mixer {
    /// Offers the next tail byte to the partial send (it may take it or not).
    fn offer_tail(&mut self, ctx: &mut Ctx<'_>) {
        let Some(conn) = self.conn else { return };
        if !self.head_sent || self.tail_sent == TAIL {
            return;
        }
        let b = Zbuf::copy_from_slice(&tail()[self.tail_sent..=self.tail_sent]);
        if let Ok(n) = ctx.send(conn, &b) {
            self.tail_sent += n;
        }
    }

    fn report(&mut self, r: Result<(), String>) {
        let mut slot = self.result.lock().unwrap();
        if slot.is_none() {
            *slot = Some(r);
            self.done.store(true, Ordering::SeqCst);
        }
    }
}

impl InlineApp for Mixer {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        match ctx.connect(server_addr(7)) {
            Ok(c) => self.conn = Some(c),
            Err(e) => self.report(Err(format!("connect: {e:?}"))),
        }
    }
    fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        match ctx.send_all(conn, Zbuf::from_vec(head())) {
            Ok(()) => self.head_sent = true,
            Err(e) => self.report(Err(format!("send-all of the head: {e:?}"))),
        }
        self.offer_tail(ctx);
    }
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        while let Ok(Some(b)) = ctx.recv(conn) {
            self.got.extend_from_slice(&b);
        }
        // The echo's segments carry ACKs: space is free here, before `on_writable`.
        self.offer_tail(ctx);
        if self.got.len() >= HEAD + TAIL {
            let mut want = head();
            want.extend_from_slice(&tail());
            let r = match self.got.iter().zip(&want).position(|(a, b)| a != b) {
                None if self.got.len() == want.len() => Ok(()),
                None => Err(format!("{} bytes echoed, {} sent", self.got.len(), want.len())),
                Some(at) => Err(format!(
                    "the echo differs from what was sent at byte {at} of {}: got {:#04x}, sent {:#04x}",
                    want.len(),
                    self.got[at],
                    want[at]
                )),
            };
            ctx.close(conn);
            self.report(r);
        }
    }
    fn on_writable(&mut self, ctx: &mut Ctx<'_>, _conn: Conn) {
        self.offer_tail(ctx);
    }
    fn on_poll(&mut self, ctx: &mut Ctx<'_>) {
        self.offer_tail(ctx);
    }
    fn on_closed(
        &mut self,
        _ctx: &mut Ctx<'_>,
        _conn: Conn,
        reason: Option<luna_stack::tcp::CloseReason>,
    ) {
        self.report(Err(format!("closed early: {reason:?}")));
    }
}

#[test]
fn send_all_then_partial_send_keeps_byte_order() {
    let (server, mut client) = pair(1, 1, |_| {});
    // A small send buffer: most of the head waits in the runtime's backlog.
    client[0].stack.tcp.snd_buf = SND_BUF;
    let srv = Runtime::spawn_inline(server, opts(), |_| Echo).unwrap();
    let result = Arc::new(Mutex::new(None));
    let done = Arc::new(AtomicBool::new(false));
    let (r, d) = (result.clone(), done.clone());
    let cli = Runtime::spawn_inline(client, opts(), move |_| Mixer {
        conn: None,
        head_sent: false,
        tail_sent: 0,
        got: Vec::new(),
        result: r.clone(),
        done: d.clone(),
    })
    .unwrap();
    wait_for("the echo of head and tail", || done.load(Ordering::SeqCst));
    cli.stop();
    srv.stop();
    cli.join().unwrap();
    srv.join().unwrap();
    let r = result.lock().unwrap().clone();
    assert_eq!(r, Some(Ok(())));
}
