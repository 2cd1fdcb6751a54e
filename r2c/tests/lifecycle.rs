//! Graceful shutdown, stats read while running, lossy links, bad input, start errors.

mod common;

use common::*;
use r2c::{Conn, CoreError, Ctx, InlineApp, Runtime};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use zbuf::Zbuf;

/// Server that reads and discards; closes when the peer finishes; records how each
/// connection ended (`None` = end of stream, `Some(reason)` = closed by the stack).
struct Hold {
    closed: Arc<Mutex<Vec<Option<luna_stack::tcp::CloseReason>>>>,
}

impl InlineApp for Hold {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        ctx.listen(7, 64).unwrap();
    }
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        loop {
            match ctx.recv(conn) {
                Ok(Some(_)) => {}
                Ok(None) => return,
                Err(luna_stack::stack::RecvError::Finished) => {
                    self.closed.lock().unwrap().push(None);
                    return ctx.close(conn);
                }
                Err(_) => return,
            }
        }
    }
    fn on_closed(&mut self, _: &mut Ctx<'_>, _: Conn, r: Option<luna_stack::tcp::CloseReason>) {
        self.closed.lock().unwrap().push(r);
    }
}

/// Client that opens connections and keeps them.
struct Opener {
    n: usize,
    up: Arc<AtomicUsize>,
}

impl InlineApp for Opener {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        for _ in 0..self.n {
            ctx.connect(server_addr(7)).unwrap();
        }
    }
    fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        ctx.send_all(conn, Zbuf::from_static(b"hello")).unwrap();
        self.up.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn graceful_shutdown_closes_connections_with_fin_and_reports_final_stats() {
    let (server, client) = pair(1, 1, |_| {});
    let closed = Arc::new(Mutex::new(Vec::new()));
    let c2 = closed.clone();
    let srv = Runtime::spawn_inline(server, opts(), move |_| Hold { closed: c2.clone() }).unwrap();
    let up = Arc::new(AtomicUsize::new(0));
    let u2 = up.clone();
    let cli = Runtime::spawn_inline(client, opts(), move |_| Opener {
        n: 5,
        up: u2.clone(),
    })
    .unwrap();
    wait_for("connections", || up.load(Ordering::SeqCst) == 5);
    wait_for("server sees them", || srv.stats()[0].open_connections == 5);
    // Stopping the client closes its connections with FIN (no reset): the server reads end
    // of stream on each and closes too, so the client's shutdown completes within grace.
    cli.stop();
    let reports = cli.join().unwrap();
    assert_eq!(reports[0].stats.stopped, 1);
    assert_eq!(reports[0].stats.open_connections, 0);
    assert_eq!(reports[0].stats.shutdown_aborts, 0);
    wait_for("server sees end of stream", || {
        closed.lock().unwrap().len() == 5
    });
    assert!(closed.lock().unwrap().iter().all(Option::is_none));
    srv.stop();
    let s = srv.join().unwrap();
    assert_eq!(s[0].stats.stopped, 1);
    assert_eq!(s[0].stats.shutdown_aborts, 0);
    assert_eq!(s[0].stack.drops(luna_stack::stack::StackDrop::NoSocket), 0);
}

#[test]
fn shutdown_resets_connections_that_do_not_close_in_time() {
    // A server that never closes: the client's FIN leaves it in CLOSE-WAIT, so the client
    // sits in FIN-WAIT-2 until the grace period ends and then resets.
    struct Mute;
    impl InlineApp for Mute {
        fn on_start(&mut self, ctx: &mut Ctx<'_>) {
            ctx.listen(7, 64).unwrap();
        }
    }
    let (server, client) = pair(1, 1, |_| {});
    let srv = Runtime::spawn_inline(server, opts(), |_| Mute).unwrap();
    let up = Arc::new(AtomicUsize::new(0));
    let u2 = up.clone();
    let o = r2c::CoreOptions {
        shutdown_grace: luna_stack::time::Duration::from_millis(100),
        ..opts()
    };
    let cli = Runtime::spawn_inline(client, o, move |_| Opener {
        n: 2,
        up: u2.clone(),
    })
    .unwrap();
    wait_for("connections", || up.load(Ordering::SeqCst) == 2);
    cli.stop();
    let r = cli.join().unwrap();
    assert_eq!(r[0].stats.shutdown_aborts, 2);
    srv.stop();
    srv.join().unwrap();
}

#[test]
fn stats_are_readable_while_running() {
    let (server, client) = pair(1, 1, |_| {});
    let closed = Arc::new(Mutex::new(Vec::new()));
    let srv = Runtime::spawn_inline(server, opts(), move |_| Hold {
        closed: closed.clone(),
    })
    .unwrap();
    let up = Arc::new(AtomicUsize::new(0));
    let u2 = up.clone();
    let cli = Runtime::spawn_inline(client, opts(), move |_| Opener {
        n: 3,
        up: u2.clone(),
    })
    .unwrap();
    let reader = srv.stats_reader(0).unwrap();
    // From another thread, while the cores run: snapshots advance and are consistent.
    let watcher = std::thread::spawn(move || {
        let mut last = reader.read();
        let mut advances = 0;
        while advances < 5 {
            let s = reader.read();
            assert!(s.iterations >= last.iterations);
            assert!(s.idle_iterations <= s.iterations);
            if s.iterations > last.iterations {
                advances += 1;
            }
            last = s;
            std::thread::yield_now();
        }
        last
    });
    let seen = watcher.join().unwrap();
    assert_eq!(seen.stopped, 0);
    wait_for("accepts visible", || srv.stats()[0].accepted == 3);
    assert!(reader_gen(&srv) > 0);
    cli.stop();
    srv.stop();
    cli.join().unwrap();
    srv.join().unwrap();
}

fn reader_gen(rt: &Runtime) -> u64 {
    rt.stats_reader(0).unwrap().generation()
}

#[test]
fn malformed_frames_are_counted_not_fatal() {
    let (mut server, client) = pair(1, 1, |_| {});
    let closed = Arc::new(Mutex::new(Vec::new()));
    let srv_dev_setup = server.remove(0);
    let srv = Runtime::spawn_inline(vec![srv_dev_setup], opts(), move |_| Hold {
        closed: closed.clone(),
    })
    .unwrap();
    // The client side's device injects garbage towards the server.
    let dev = &client[0].devices[0];
    for len in [0usize, 1, 13, 14, 40, 60, 1514] {
        let mut f = vec![0xa5u8; len];
        if len >= 14 {
            f[..6].copy_from_slice(&SERVER_MAC.0);
            f[12] = 0x08; // IPv4 with a garbage header
        }
        assert!(dev.inject(Zbuf::from_vec(f)));
    }
    wait_for("drops counted", || srv.stats()[0].stack_drops >= 7);
    srv.stop();
    let r = srv.join().unwrap();
    assert_eq!(r[0].stats.rx_frames, 7);
}

#[test]
fn start_errors_are_reported_not_panics() {
    // No device.
    let (mut server, _client) = pair(1, 1, |_| {});
    server[0].devices.clear();
    let e = Runtime::spawn_inline(server, opts(), |_| Hold {
        closed: Arc::default(),
    })
    .unwrap_err();
    assert!(matches!(e.error, CoreError::NoDevice(0)), "{e}");
    // A bad stack configuration (gateway off the prefix).
    let (mut server, _client) = pair(1, 1, |_| {});
    server[0].stack.gateway = Some("203.0.113.1".parse().unwrap());
    let e = Runtime::spawn_inline(server, opts(), |_| Hold {
        closed: Arc::default(),
    })
    .unwrap_err();
    assert!(matches!(e.error, CoreError::Stack(_)), "{e}");
    assert!(e.to_string().contains("gateway"));
    // Pinning to a CPU that does not exist.
    let (mut server, _client) = pair(1, 1, |_| {});
    server[0].cpu = Some(100_000);
    let o = r2c::CoreOptions {
        pin: true,
        ..opts()
    };
    let e = Runtime::spawn_inline(server, o, |_| Hold {
        closed: Arc::default(),
    })
    .unwrap_err();
    assert!(
        matches!(e.error, CoreError::Pin { cpu: 100_000, .. }),
        "{e}"
    );
}

/// Publishes what its core's live counters say about 1 ms loop stalls.
struct StallWatcher {
    seen_1ms: Arc<AtomicUsize>,
}

impl InlineApp for StallWatcher {
    fn on_poll(&mut self, ctx: &mut Ctx<'_>) {
        let n = ctx.stats().loop_gaps_1ms as usize;
        self.seen_1ms.store(n, Ordering::SeqCst);
    }
}

#[test]
fn a_jump_of_the_core_clock_is_counted_as_a_loop_stall() {
    use luna_stack::time::Duration;
    let (server, _client) = pair(1, 1, |_| {});
    let clock = r2c::clock::ManualClock::new();
    let o = r2c::CoreOptions {
        clock: r2c::clock::ClockSource::Manual(clock.clone()),
        ..opts()
    };
    let seen_1ms = Arc::new(AtomicUsize::new(0));
    let s2 = seen_1ms.clone();
    let srv = Runtime::spawn_inline(server, o, move |_| StallWatcher {
        seen_1ms: s2.clone(),
    })
    .unwrap();
    // The loop runs on a clock that does not move: no gap at all.
    wait_for("two publishes", || reader_gen(&srv) >= 2);
    assert_eq!(srv.stats()[0].loop_gaps_100us, 0);
    // The clock jumps between two iterations' readings: one 3 ms stall.
    clock.advance(Duration::from_millis(3));
    wait_for("the 3 ms gap published", || {
        srv.stats()[0].loop_gaps_1ms == 1
    });
    clock.advance(Duration::from_micros(200));
    wait_for("the 200 us gap published", || {
        srv.stats()[0].loop_gaps_100us == 2
    });
    // A gap under the threshold is not a stall.
    clock.advance(Duration::from_micros(99));
    let before = reader_gen(&srv);
    wait_for("a publish after the 99 us gap", || {
        reader_gen(&srv) >= before + 2
    });
    srv.stop();
    let s = srv.join().unwrap()[0].stats;
    assert_eq!(
        (
            s.loop_gaps_100us,
            s.loop_gaps_500us,
            s.loop_gaps_1ms,
            s.loop_gaps_2ms,
            s.loop_gaps_5ms
        ),
        (2, 1, 1, 1, 0)
    );
    assert_eq!(s.loop_gap_ns, 3_200_000);
    assert_eq!(s.loop_gap_1ms_ns, 3_000_000);
    assert_eq!(s.loop_gap_max_ns, 3_000_000);
    // The application read the same count live, through its context.
    assert_eq!(seen_1ms.load(Ordering::SeqCst), 1);
}

/// A client that opens one connection, sends a few bytes on it and records how it ended.
struct Watch {
    closed: Arc<Mutex<Vec<Option<luna_stack::tcp::CloseReason>>>>,
    up: Arc<AtomicUsize>,
}

impl InlineApp for Watch {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        ctx.connect(server_addr(7)).unwrap();
    }
    fn on_connected(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        ctx.send_all(conn, Zbuf::from_static(b"hello")).unwrap();
        self.up.fetch_add(1, Ordering::SeqCst);
    }
    fn on_closed(&mut self, _: &mut Ctx<'_>, _: Conn, r: Option<luna_stack::tcp::CloseReason>) {
        self.closed.lock().unwrap().push(r);
    }
}

/// Starts a [`Watch`] client on `client`: its runtime, the close reasons it saw and
/// whether it connected.
#[allow(clippy::type_complexity)]
fn spawn_watch(
    client: Vec<r2c::CoreSetup<r2c::device::mem::MemDevice>>,
) -> (
    Runtime,
    Arc<Mutex<Vec<Option<luna_stack::tcp::CloseReason>>>>,
    Arc<AtomicUsize>,
) {
    let closed = Arc::new(Mutex::new(Vec::new()));
    let (c2, up) = (closed.clone(), Arc::new(AtomicUsize::new(0)));
    let u2 = up.clone();
    let cli = Runtime::spawn_inline(client, opts(), move |_| Watch {
        closed: c2.clone(),
        up: u2.clone(),
    })
    .unwrap();
    (cli, closed, up)
}

/// Waits up to 10 s for the client to see its connection reset. Without it the client
/// would wait forever: nothing is in flight and keepalive is off.
fn wait_for_reset(closed: &Mutex<Vec<Option<luna_stack::tcp::CloseReason>>>) {
    let start = std::time::Instant::now();
    while closed.lock().unwrap().is_empty() && start.elapsed() < std::time::Duration::from_secs(10)
    {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(
        *closed.lock().unwrap(),
        [Some(luna_stack::tcp::CloseReason::Reset)],
        "the peer was told (RST) that the stopped core dropped its connection"
    );
}

/// Shutdown closes a connection whose received data was never read with a reset
/// (RFC 9293 §3.6.1), which leaves it CLOSED at once: the core must still send that reset
/// before it exits. It used to count the connection as finished and stop in the same
/// iteration, the reset unsent, so the peer kept a connection nobody held.
#[test]
fn shutdown_sends_the_reset_of_a_connection_closed_with_unread_data() {
    struct Deaf(Arc<AtomicUsize>);
    impl InlineApp for Deaf {
        fn on_start(&mut self, ctx: &mut Ctx<'_>) {
            ctx.listen(7, 64).unwrap();
        }
        fn on_readable(&mut self, _: &mut Ctx<'_>, _: Conn) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let (server, client) = pair(1, 1, |_| {});
    let heard = Arc::new(AtomicUsize::new(0));
    let h2 = heard.clone();
    let srv = Runtime::spawn_inline(server, opts(), move |_| Deaf(h2.clone())).unwrap();
    let (cli, closed, _up) = spawn_watch(client);
    wait_for("the server holds unread data", || {
        heard.load(Ordering::SeqCst) > 0
    });
    srv.stop();
    let r = srv.join().unwrap();
    assert_eq!(r[0].stats.tx_dropped, 0);
    wait_for_reset(&closed);
    cli.stop();
    cli.join().unwrap();
}

/// A connection that waits in a listener's accept queue when the core stops is reset by
/// the unlisten: that reset goes out before the core exits (with no connection of the
/// application's open, the core used to stop in the same iteration, the reset unsent).
#[test]
fn shutdown_sends_the_reset_of_a_connection_never_accepted() {
    use r2c::batch::{Interest, Sockets};
    struct NeverAccepts;
    impl r2c::batch::BatchApp for NeverAccepts {
        fn on_start(&mut self, s: &mut Sockets<'_>) {
            let fd = s.socket();
            s.bind(fd, 7).unwrap();
            s.listen(fd, 64).unwrap();
            s.register(fd, Interest::READABLE).unwrap();
        }
        fn on_poll(&mut self, _: &mut Sockets<'_>) {}
    }
    let (server, client) = pair(1, 1, |_| {});
    let srv = Runtime::spawn_batch(server, opts(), |_| NeverAccepts).unwrap();
    let (cli, closed, up) = spawn_watch(client);
    wait_for("connected", || up.load(Ordering::SeqCst) == 1);
    wait_for("the server has the data", || srv.stats()[0].rx_bytes > 100);
    srv.stop();
    srv.join().unwrap();
    wait_for_reset(&closed);
    cli.stop();
    cli.join().unwrap();
}

/// An application that panics on one core stops the runtime: the other cores shut down
/// gracefully and `join` reports the panic, instead of waiting for cores that nothing
/// will stop (the panicked core's application was the one to request the stop).
#[test]
fn a_panic_on_one_core_stops_the_runtime_and_join_reports_it() {
    /// Core 1 panics at start; core 0 would run until someone stops it.
    struct Fragile;
    impl InlineApp for Fragile {
        fn on_start(&mut self, ctx: &mut Ctx<'_>) {
            assert!(ctx.core() != 1, "application bug on core 1");
        }
    }
    let (server, _client) = pair(2, 1, |_| {});
    let rt = Runtime::spawn_inline(server, opts(), |_| Fragile).unwrap();
    let stop = rt.stop_handle();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(rt.join());
    });
    let joined = rx.recv_timeout(std::time::Duration::from_secs(10));
    // Clean up either way (the join thread holds the runtime).
    stop.stop();
    let r = joined.expect("join returned without a stop request");
    let e = r.expect_err("the panic is reported");
    assert_eq!(e.core, 1);
    assert!(
        matches!(&e.error, CoreError::Panicked(m) if m.contains("application bug on core 1")),
        "{e}"
    );
    assert!(stop.is_stopped());
}
