//! batch-r2c: an epoll-style echo server and a client written against the socket API.

mod common;

use common::*;
use r2c::batch::{BatchApp, Fd, Interest, PollEvent, SockError, Sockets};
use r2c::Runtime;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The server loop an epoll program would have, with calls replaced one for one.
#[derive(Default)]
struct EchoServer {
    lfd: Option<Fd>,
    events: Vec<PollEvent>,
    buf: Vec<u8>,
}

impl BatchApp for EchoServer {
    fn on_start(&mut self, s: &mut Sockets<'_>) {
        let fd = s.socket(); // socket()
        s.bind(fd, 7).unwrap(); // bind()
        s.listen(fd, 1024).unwrap(); // listen()
        s.register(fd, Interest::READABLE).unwrap(); // epoll_ctl(ADD)
        self.lfd = Some(fd);
        self.buf = vec![0; 1000]; // small on purpose: recv loops over partial chunks
    }

    fn on_poll(&mut self, s: &mut Sockets<'_>) {
        s.poll(&mut self.events); // epoll_wait(.., 0)
        for ev in std::mem::take(&mut self.events) {
            if Some(ev.fd) == self.lfd {
                while let Ok((c, _peer)) = s.accept(ev.fd) {
                    s.register(c, Interest::READABLE).unwrap();
                }
                continue;
            }
            loop {
                match s.recv(ev.fd, &mut self.buf) {
                    Ok(0) => {
                        s.close(ev.fd).unwrap();
                        break;
                    }
                    Ok(n) => {
                        // A real server would keep what send() did not take; the test's
                        // buffers are large enough that it always takes everything.
                        assert_eq!(s.send(ev.fd, &self.buf[..n]), Ok(n));
                    }
                    Err(SockError::WouldBlock) => break,
                    Err(_) => {
                        s.close(ev.fd).unwrap();
                        break;
                    }
                }
            }
        }
    }
}

/// Connects, waits for writability, sends, reads the echo back, closes.
struct EchoClient {
    conns: usize,
    len: usize,
    started: bool,
    socks: HashMap<Fd, (usize, bool, Vec<u8>)>,
    events: Vec<PollEvent>,
    done: Arc<AtomicUsize>,
    bad: Arc<Mutex<Vec<String>>>,
}

impl BatchApp for EchoClient {
    fn on_poll(&mut self, s: &mut Sockets<'_>) {
        if !self.started {
            self.started = true;
            for i in 0..self.conns {
                let fd = s.socket();
                assert_eq!(s.connect(fd, server_addr(7)), Err(SockError::InProgress));
                s.register(fd, Interest::BOTH).unwrap();
                self.socks.insert(fd, (i, false, Vec::new()));
            }
        }
        s.poll(&mut self.events);
        let core = s.core();
        for ev in std::mem::take(&mut self.events) {
            if let Some(e) = ev.error {
                self.bad.lock().unwrap().push(format!("{e}"));
                continue;
            }
            let Some((idx, sent, got)) = self.socks.get_mut(&ev.fd) else {
                continue;
            };
            if ev.writable && !*sent {
                let msg = message(core, *idx, self.len);
                assert_eq!(s.send(ev.fd, &msg), Ok(self.len));
                *sent = true;
                s.register(ev.fd, Interest::READABLE).unwrap();
            }
            if ev.readable {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.recv(ev.fd, &mut buf) {
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                if got.len() >= self.len {
                    if *got != message(core, *idx, self.len) {
                        self.bad.lock().unwrap().push("echo differs".into());
                    }
                    s.close(ev.fd).unwrap();
                    self.socks.remove(&ev.fd);
                    self.done.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }
}

#[test]
fn batch_echo_two_cores_each_side() {
    let (server, client) = pair(2, 2, |_| {});
    let srv = Runtime::spawn_batch(server, opts(), |_| EchoServer::default()).unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let bad = Arc::new(Mutex::new(Vec::new()));
    let (d, b) = (done.clone(), bad.clone());
    let cli = Runtime::spawn_batch(client, opts(), move |_| EchoClient {
        conns: 8,
        len: 12_345,
        started: false,
        socks: HashMap::new(),
        events: Vec::new(),
        done: d.clone(),
        bad: b.clone(),
    })
    .unwrap();
    wait_for("batch echoes", || {
        done.load(Ordering::SeqCst) == 16 || !bad.lock().unwrap().is_empty()
    });
    assert!(bad.lock().unwrap().is_empty(), "{:?}", bad.lock().unwrap());
    cli.stop();
    srv.stop();
    let c = cli.join().unwrap();
    let s = srv.join().unwrap();
    assert_eq!(s.iter().map(|r| r.stats.accepted).sum::<u64>(), 16);
    assert_eq!(c.iter().map(|r| r.stats.connected).sum::<u64>(), 16);
}

/// Runs `calls` once on a one-core batch runtime (the server side of a pair whose peer
/// never answers), stops it, and returns what the calls returned.
fn calls_once<T: Send + 'static>(
    calls: impl Fn(&mut Sockets<'_>) -> Vec<T> + Send + Sync + 'static,
) -> Vec<T> {
    let (server, _client) = pair(1, 1, |_| {});
    let out = Arc::new(Mutex::new(Vec::new()));
    let o = out.clone();
    let calls = Arc::new(calls);
    let rt = Runtime::spawn_batch(server, opts(), move |_| {
        let (o, calls) = (o.clone(), calls.clone());
        let mut ran = false;
        move |s: &mut Sockets<'_>| {
            if !ran {
                ran = true;
                o.lock().unwrap().extend(calls(s));
                s.request_stop();
            }
        }
    })
    .unwrap();
    let _ = rt.join().unwrap();
    let mut out = out.lock().unwrap();
    std::mem::take(&mut *out)
}

#[test]
fn batch_api_errors() {
    // Calls on the wrong kind of socket answer with errno-style errors, never panic.
    let out = calls_once(|s| {
        let fd = s.socket();
        let mut r = Vec::new();
        r.push(s.listen(fd, 8)); // not bound
        r.push(s.send(fd, b"x").map(|_| ())); // not connected
        r.push(s.accept(fd).map(|_| ())); // not listening
        s.bind(fd, 80).unwrap();
        s.listen(fd, 8).unwrap();
        let fd2 = s.socket();
        s.bind(fd2, 80).unwrap();
        r.push(s.listen(fd2, 8)); // port taken
        r.push(s.accept(fd).map(|_| ())); // nothing pending
        r.push(s.close(Fd(999))); // bad fd
        let fd3 = s.socket();
        r.push(s.connect(fd3, "198.18.0.1:80".parse().unwrap())); // our own address
        r
    });
    assert_eq!(
        out,
        vec![
            Err(SockError::InvalidInput),
            Err(SockError::NotConnected),
            Err(SockError::InvalidInput),
            Err(SockError::AddrInUse),
            Err(SockError::WouldBlock),
            Err(SockError::BadFd),
            Err(SockError::InvalidInput),
        ]
    );
}

/// The per-connection calls a socket shim needs (`TCP_NODELAY`, `IP_TOS`, `bind` to an
/// address before `connect`, the close of a socket whose bytes are still queued, the
/// bytes not yet acknowledged): errno-style answers on a socket that is not connected
/// or a value out of range, and the address bound is the connection's.
#[test]
fn batch_connection_setters() {
    let out = calls_once(|s| {
        let mut r: Vec<Result<usize, SockError>> = Vec::new();
        let fd = s.socket();
        r.push(s.set_nagle(fd, true).map(|()| 0));
        r.push(s.set_dscp(fd, 46).map(|()| 0));
        r.push(s.orphan(fd).map(|()| 0));
        r.push(s.unacked(fd));
        let to = "198.18.0.2:80".parse().unwrap();
        // Not one of the stack's addresses.
        r.push(
            s.connect_from(fd, Some("198.18.0.77".parse().unwrap()), to)
                .map(|()| 0),
        );
        s.bind(fd, 4444).unwrap();
        // Nobody answers: SYN-SENT, where data may be queued.
        r.push(
            s.connect_from(fd, Some("198.18.0.1".parse().unwrap()), to)
                .map(|()| 0),
        );
        let local = s.addrs(fd).map(|(l, _)| l);
        r.push(Ok(usize::from(
            local == Ok("198.18.0.1:4444".parse().unwrap()),
        )));
        r.push(s.set_nagle(fd, true).map(|()| 0));
        r.push(s.set_dscp(fd, 64).map(|()| 0));
        r.push(s.set_dscp(fd, 46).map(|()| 0));
        r.push(s.send(fd, &[1u8; 100]));
        r.push(s.unacked(fd));
        r.push(s.orphan(fd).map(|()| 0));
        r
    });
    assert_eq!(
        out,
        vec![
            Err(SockError::NotConnected),
            Err(SockError::NotConnected),
            Err(SockError::NotConnected),
            Err(SockError::NotConnected),
            Err(SockError::InvalidInput),
            Err(SockError::InProgress),
            Ok(1),
            Ok(0),
            Err(SockError::InvalidInput),
            Ok(0),
            Ok(100),
            Ok(100),
            Ok(0),
        ]
    );
}

/// A send that finds no room takes nothing and says why from the socket's and the
/// connection's state (full buffer: `WouldBlock`; after `shutdown`: `BrokenPipe`), not by
/// offering the stack a dummy byte.
#[test]
fn batch_send_without_room_says_why() {
    let out = calls_once(|s| {
        let fd = s.socket();
        let mut r = Vec::new();
        // Nobody answers on the other side: the connection stays in SYN-SENT, where
        // data may already be queued.
        r.push(s.connect(fd, "198.18.0.2:80".parse().unwrap()).map(|_| 0));
        let big = vec![7u8; 4 << 20];
        let mut taken = 0;
        // Bounded: the 1 MiB send buffer is full long before 4 MiB went in.
        for _ in 0..64 {
            match s.send(fd, &big) {
                Ok(n) => taken += n,
                Err(e) => {
                    r.push(Err(e));
                    break;
                }
            }
        }
        r.push(Ok(usize::from(taken > 0 && taken < big.len())));
        r.push(s.shutdown(fd).map(|()| 0));
        r.push(s.send(fd, b"x"));
        r
    });
    assert_eq!(
        out,
        vec![
            Err(SockError::InProgress),
            Err(SockError::WouldBlock),
            Ok(1),
            Ok(0),
            Err(SockError::BrokenPipe),
        ]
    );
}

/// `poll` reports a socket once per call (as `epoll_wait` does), also when its descriptor
/// was closed and handed to a new connection between two calls: the closed socket's place
/// in the readiness list and the new one's registration used to list the descriptor twice,
/// so every later `poll` reported the new connection twice while it stayed ready.
#[test]
fn a_reused_descriptor_is_reported_once_per_poll() {
    use r2c::{Conn, Ctx, InlineApp};
    use std::sync::atomic::AtomicBool;

    /// Waits for `go`, then: closes the sockets whose peer finished, and only after them
    /// accepts one connection per poll (registered for both directions).
    struct Server {
        lfd: Option<Fd>,
        go: Arc<AtomicBool>,
        events: Vec<PollEvent>,
        /// Descriptors handed out by `accept`, in order.
        accepted: Arc<Mutex<Vec<Fd>>>,
        /// Polls that listed a descriptor more than once.
        dups: Arc<AtomicUsize>,
        polls: Arc<AtomicUsize>,
    }
    impl BatchApp for Server {
        fn on_start(&mut self, s: &mut Sockets<'_>) {
            let fd = s.socket();
            s.bind(fd, 7).unwrap();
            s.listen(fd, 64).unwrap();
            s.register(fd, Interest::READABLE).unwrap();
            self.lfd = Some(fd);
        }
        fn on_poll(&mut self, s: &mut Sockets<'_>) {
            if !self.go.load(Ordering::SeqCst) {
                return;
            }
            s.poll(&mut self.events);
            self.polls.fetch_add(1, Ordering::SeqCst);
            let mut fds: Vec<Fd> = self.events.iter().map(|e| e.fd).collect();
            fds.sort();
            fds.dedup();
            if fds.len() != self.events.len() {
                self.dups.fetch_add(1, Ordering::SeqCst);
            }
            let mut listener_ready = false;
            for ev in std::mem::take(&mut self.events) {
                if Some(ev.fd) == self.lfd {
                    listener_ready = true;
                    continue;
                }
                let mut buf = [0u8; 64];
                if ev.readable && s.recv(ev.fd, &mut buf) == Ok(0) {
                    s.close(ev.fd).unwrap();
                }
            }
            if listener_ready {
                if let Ok((c, _)) = s.accept(self.lfd.unwrap()) {
                    s.register(c, Interest::BOTH).unwrap();
                    self.accepted.lock().unwrap().push(c);
                }
            }
        }
    }

    /// Opens A; once it is up closes it (a FIN) and opens B.
    struct Client {
        a: Option<Conn>,
        b_up: Arc<AtomicBool>,
    }
    impl InlineApp for Client {
        fn on_start(&mut self, ctx: &mut Ctx<'_>) {
            self.a = Some(ctx.connect(server_addr(7)).unwrap());
        }
        fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
            if Some(conn) == self.a {
                ctx.close(conn);
                ctx.connect(server_addr(7)).unwrap();
            } else {
                self.b_up.store(true, Ordering::SeqCst);
            }
        }
    }

    let (server, client) = pair(1, 1, |_| {});
    let go = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let (dups, polls) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (g, a, d, p) = (go.clone(), accepted.clone(), dups.clone(), polls.clone());
    let srv = Runtime::spawn_batch(server, opts(), move |_| Server {
        lfd: None,
        go: g.clone(),
        events: Vec::new(),
        accepted: a.clone(),
        dups: d.clone(),
        polls: p.clone(),
    })
    .unwrap();
    let b_up = Arc::new(AtomicBool::new(false));
    let b2 = b_up.clone();
    let cli = Runtime::spawn_inline(client, opts(), move |_| Client {
        a: None,
        b_up: b2.clone(),
    })
    .unwrap();
    // A's FIN left before B's SYN: once B is up on the client (and the server has had a
    // moment for B's ACK), A has finished and both wait in the accept queue.
    wait_for("B connected", || b_up.load(Ordering::SeqCst));
    std::thread::sleep(std::time::Duration::from_millis(50));
    go.store(true, Ordering::SeqCst);
    // Poll 1 accepts A; poll 2 closes it (end of stream) and accepts B on A's descriptor.
    wait_for("B accepted", || accepted.lock().unwrap().len() == 2);
    let start = polls.load(Ordering::SeqCst);
    wait_for("polls with B ready", || {
        polls.load(Ordering::SeqCst) >= start + 10
    });
    let fds = accepted.lock().unwrap().clone();
    assert_eq!(fds[0], fds[1], "B got A's descriptor");
    assert_eq!(
        dups.load(Ordering::SeqCst),
        0,
        "polls listing a descriptor twice"
    );
    cli.stop();
    srv.stop();
    cli.join().unwrap();
    srv.join().unwrap();
}

/// `abort` (close with `SO_LINGER {1, 0}`) resets the connection: the peer sees a RST at
/// once (`CloseReason::Reset`) although bytes were still queued to it, where `close`
/// would have sent them and a FIN. The descriptor is free afterwards.
#[test]
fn abort_resets_the_connection_and_frees_the_descriptor() {
    use luna_stack::tcp::CloseReason;
    use r2c::{Conn, Ctx, InlineApp};

    struct Server {
        lfd: Option<Fd>,
        events: Vec<PollEvent>,
        after: Arc<Mutex<Vec<Result<(), SockError>>>>,
    }
    impl BatchApp for Server {
        fn on_start(&mut self, s: &mut Sockets<'_>) {
            let fd = s.socket();
            s.bind(fd, 7).unwrap();
            s.listen(fd, 8).unwrap();
            s.register(fd, Interest::READABLE).unwrap();
            self.lfd = Some(fd);
        }
        fn on_poll(&mut self, s: &mut Sockets<'_>) {
            let mut ev = std::mem::take(&mut self.events);
            s.poll(&mut ev);
            for e in &ev {
                if Some(e.fd) == self.lfd {
                    while let Ok((c, _)) = s.accept(e.fd) {
                        s.register(c, Interest::READABLE).unwrap();
                    }
                } else if e.readable {
                    // The request came: queue a large answer, then abort.
                    let mut buf = [0u8; 64];
                    let _ = s.recv(e.fd, &mut buf);
                    let _ = s.send(e.fd, &vec![1u8; 256 << 10]);
                    let mut r = self.after.lock().unwrap();
                    r.push(s.abort(e.fd));
                    r.push(s.send(e.fd, b"x").map(|_| ()));
                    r.push(s.abort(e.fd));
                }
            }
            self.events = ev;
        }
    }
    /// How the connection ended, and the bytes received before.
    type Ended = Arc<Mutex<Option<(Option<CloseReason>, usize)>>>;
    struct Client {
        got: usize,
        closed: Ended,
    }
    impl InlineApp for Client {
        fn on_start(&mut self, ctx: &mut Ctx<'_>) {
            ctx.connect(server_addr(7)).unwrap();
        }
        fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
            ctx.send(conn, &zbuf::Zbuf::copy_from_slice(b"request"))
                .unwrap();
        }
        fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
            while let Ok(Some(z)) = ctx.recv(conn) {
                self.got += z.len();
            }
        }
        fn on_closed(&mut self, _ctx: &mut Ctx<'_>, _conn: Conn, reason: Option<CloseReason>) {
            *self.closed.lock().unwrap() = Some((reason, self.got));
        }
    }

    let (server, client) = pair(1, 1, |_| {});
    let after = Arc::new(Mutex::new(Vec::new()));
    let a = after.clone();
    let srv = Runtime::spawn_batch(server, opts(), move |_| Server {
        lfd: None,
        events: Vec::new(),
        after: a.clone(),
    })
    .unwrap();
    let closed = Arc::new(Mutex::new(None));
    let c2 = closed.clone();
    let cli = Runtime::spawn_inline(client, opts(), move |_| Client {
        got: 0,
        closed: c2.clone(),
    })
    .unwrap();
    wait_for("the client saw its connection end", || {
        closed.lock().unwrap().is_some()
    });
    let (reason, got) = closed.lock().unwrap().unwrap();
    assert_eq!(reason, Some(CloseReason::Reset));
    assert!(
        got < 256 << 10,
        "the queued answer was dropped, {got} bytes came"
    );
    assert_eq!(
        *after.lock().unwrap(),
        vec![Ok(()), Err(SockError::BadFd), Err(SockError::BadFd)]
    );
    cli.stop();
    srv.stop();
    let s = srv.join().unwrap();
    cli.join().unwrap();
    assert_eq!(s.iter().map(|r| r.stats.accepted).sum::<u64>(), 1);
}
