//! Unit tests: placement rules, back pressure, idle/handoff, CS gating, disconnect.

use super::*;
use std::thread;
use std::time::{Duration, Instant};

fn cfg(model: Model, workers: usize, queue_capacity: usize) -> SchedConfig {
    SchedConfig {
        model,
        workers,
        queue_capacity,
        seed: 7,
    }
}

fn sched<T: Send>(model: Model, workers: usize, cap: usize) -> (Dispatcher<T>, Vec<Worker<T>>) {
    scheduler(&cfg(model, workers, cap)).unwrap()
}

/// Waits (bounded) until worker `w` has announced idle.
fn wait_idle<T: Send>(d: &Dispatcher<T>, w: usize) {
    let until = Instant::now() + Duration::from_secs(10);
    while !d.stats().workers[w].idle {
        assert!(Instant::now() < until, "worker {w} never went idle");
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn config_errors_are_reported() {
    let e = |c: SchedConfig| scheduler::<u32>(&c).err().unwrap();
    assert_eq!(e(cfg(Model::Ms, 0, 4)), SchedConfigError::NoWorkers);
    assert_eq!(e(cfg(Model::Ms, 2, 0)), SchedConfigError::ZeroCapacity);
    let too_many = e(cfg(Model::Cs, MAX_WORKERS + 1, 4));
    assert_eq!(
        too_many,
        SchedConfigError::TooManyWorkers {
            workers: MAX_WORKERS + 1,
            max: MAX_WORKERS
        }
    );
    assert_eq!(
        too_many.to_string(),
        format!(
            "{} workers requested, at most {MAX_WORKERS} supported",
            MAX_WORKERS + 1
        )
    );
    assert!(SchedConfigError::NoWorkers
        .to_string()
        .contains("at least one"));
    assert!(scheduler::<u32>(&cfg(Model::Cp, MAX_WORKERS, 1)).is_ok());
}

#[test]
fn model_parses_and_displays() {
    for (s, m) in [("cp", Model::Cp), ("cs", Model::Cs), ("ms", Model::Ms)] {
        assert_eq!(s.parse::<Model>().unwrap(), m);
        assert_eq!(m.to_string(), s);
    }
    // One enum with the simulator's: names are case-insensitive.
    assert_eq!("MS".parse::<Model>().unwrap(), Model::Ms);
    let err = "fifo".parse::<Model>().unwrap_err();
    assert_eq!(err, ParseModelError("fifo".into()));
    assert!(err.to_string().contains("cp, cs or ms"));
}

#[test]
fn p2c_picks_the_shorter_queue() {
    let (mut d, mut w) = sched::<u32>(Model::Ms, 2, 16);
    for i in 0..4 {
        assert!(matches!(d.dispatch(i, i as u32), Ok(Placed::Queued(_))));
    }
    // With two workers both are always compared: the queues stay level.
    let q: Vec<_> = d.stats().workers.iter().map(|w| w.queued).collect();
    assert_eq!(q, [2, 2]);
    // Worker 1 empties its own FIFO (own FIFO first, no steal needed).
    assert!(w[1].try_recv().is_some());
    assert!(w[1].try_recv().is_some());
    assert_eq!(d.stats().workers[1].queued, 0);
    assert_eq!(d.stats().steals, 0);
    // Now worker 1 is shorter whichever pair order the PRNG draws.
    assert_eq!(d.dispatch(10, 10), Ok(Placed::Queued(1)));
    assert_eq!(d.dispatch(11, 11), Ok(Placed::Queued(1)));
    assert_eq!(d.stats().p2c, 6);
}

#[test]
fn p2c_falls_back_to_any_queue_with_room_then_rejects_with_the_same_message() {
    let (mut d, _w) = sched::<String>(Model::Ms, 3, 1);
    for i in 0..3 {
        assert!(d.dispatch(i, format!("m{i}")).is_ok());
    }
    assert!(d.stats().workers.iter().all(|w| w.queued == 1));
    let r = d.dispatch(99, "kept".to_string()).unwrap_err();
    assert_eq!(r.key, 99);
    assert_eq!(r.into_inner(), "kept");
    assert_eq!(d.stats().rejected, 1);
}

#[test]
fn handoff_to_an_idle_worker() {
    let (mut d, mut w) = sched::<u64>(Model::Ms, 3, 4);
    let mut w2 = w.remove(2);
    let t = thread::spawn(move || w2.recv_timeout(Duration::from_secs(20)));
    wait_idle(&d, 2);
    assert_eq!(d.dispatch(5, 500), Ok(Placed::Handoff(2)));
    assert_eq!(t.join().unwrap(), Ok(500));
    let st = d.stats();
    assert_eq!((st.handoffs, st.p2c), (1, 0));
    assert_eq!(st.workers[2].taken, 1);
    assert!(!st.workers[2].idle);
}

#[test]
fn recv_timeout_times_out_and_withdraws() {
    let (d, mut w) = sched::<u64>(Model::Ms, 2, 4);
    assert_eq!(
        w[0].recv_timeout(Duration::from_millis(5)),
        Err(RecvError::Timeout)
    );
    assert!(!d.stats().workers[0].idle);
    assert_eq!(w[0].try_recv(), None);
}

#[test]
fn ms_worker_steals_from_a_busy_worker() {
    let (mut d, mut w) = sched::<u64>(Model::Ms, 2, 8);
    for i in 0..6 {
        d.dispatch(i, i).unwrap();
    }
    let mut got: Vec<_> = std::iter::from_fn(|| w[0].try_recv()).collect();
    got.sort();
    assert_eq!(got, (0..6).collect::<Vec<_>>());
    assert_eq!(d.stats().steals, 3);
    assert_eq!(w[1].try_recv(), None);
}

#[test]
fn cp_maps_a_key_to_one_worker_and_never_steals() {
    let (mut d, mut w) = sched::<u64>(Model::Cp, 4, 64);
    for key in 0..40u64 {
        let home = d.worker_of(key);
        assert!(home < 4);
        for _ in 0..2 {
            assert_eq!(d.dispatch(key, key), Ok(Placed::Queued(home)));
        }
    }
    // Keys do spread over workers.
    let q: Vec<_> = d.stats().workers.iter().map(|w| w.queued).collect();
    assert!(q.iter().all(|&n| n > 0), "{q:?}");
    for (i, wk) in w.iter_mut().enumerate() {
        let mut last = None;
        while let Some(key) = wk.try_recv() {
            assert_eq!(d.worker_of(key), i, "worker {i} got key {key}");
            assert!(last <= Some(key), "per-worker FIFO order");
            last = Some(key);
        }
    }
    assert_eq!(d.stats().steals, 0);
    assert_eq!(d.stats().partitioned, 80);
}

#[test]
fn cp_wakes_the_keys_worker_when_idle() {
    let (mut d, mut w) = sched::<u64>(Model::Cp, 2, 4);
    let key = (0..).find(|&k| d.worker_of(k) == 1).unwrap();
    let mut w1 = w.remove(1);
    let t = thread::spawn(move || w1.recv_timeout(Duration::from_secs(20)));
    wait_idle(&d, 1);
    assert_eq!(d.dispatch(key, 42), Ok(Placed::Queued(1)));
    assert_eq!(t.join().unwrap(), Ok(42));
    assert_eq!(d.stats().handoffs, 0);
}

#[test]
fn cs_holds_a_busy_key_and_releases_in_key_order() {
    let (mut d, mut w) = sched::<(u64, u32)>(Model::Cs, 2, 8);
    assert!(matches!(d.dispatch(1, (1, 0)), Ok(Placed::Queued(_))));
    assert_eq!(d.dispatch(1, (1, 1)), Ok(Placed::Held));
    assert_eq!(d.dispatch(1, (1, 2)), Ok(Placed::Held));
    assert!(matches!(d.dispatch(2, (2, 0)), Ok(Placed::Queued(_))));
    assert_eq!(d.held(), 2);
    let mut first: Vec<_> = std::iter::from_fn(|| w[0].try_recv()).collect();
    first.sort();
    assert_eq!(first, [(1, 0), (2, 0)]);
    // Nothing of key 1 reaches a worker before its completion.
    assert_eq!(w[1].try_recv(), None);
    assert!(d.complete(1));
    assert_eq!(w[1].try_recv(), Some((1, 1)));
    assert_eq!(w[1].try_recv(), None);
    // The worker-side completion path.
    w[1].finish(1);
    assert_eq!(d.poll(), 1);
    assert_eq!(w[0].try_recv(), Some((1, 2)));
    assert!(d.complete(1));
    assert!(!d.complete(1), "stray completion");
    assert!(d.complete(2));
    assert_eq!(d.held(), 0);
    // An idle key is placed at once again.
    assert!(matches!(d.dispatch(1, (1, 3)), Ok(Placed::Queued(_))));
    assert_eq!(d.stats().held, 2);
}

#[test]
fn cs_release_waits_for_room_then_poll_places_it() {
    let (mut d, mut w) = sched::<u32>(Model::Cs, 1, 1);
    assert_eq!(d.dispatch(1, 10), Ok(Placed::Queued(0)));
    assert_eq!(d.dispatch(1, 11), Ok(Placed::Held));
    assert_eq!(w[0].try_recv(), Some(10));
    assert_eq!(d.dispatch(2, 20), Ok(Placed::Queued(0)));
    // Key 1 completes, but the only FIFO is full: 11 stays held.
    assert!(d.complete(1));
    assert_eq!(d.held(), 1);
    // Its held FIFO (capacity 1 here) is full too: back pressure on key 1.
    assert_eq!(d.dispatch(1, 12).unwrap_err().msg, 12);
    assert_eq!(w[0].try_recv(), Some(20));
    d.poll();
    assert_eq!(d.dispatch(1, 12), Ok(Placed::Held));
    assert_eq!(w[0].try_recv(), Some(11));
    assert_eq!(w[0].try_recv(), None);
    assert!(d.complete(1));
    assert_eq!(w[0].try_recv(), Some(12));
}

/// A key forgotten (its connection gone) with messages held, one of them waiting for
/// room after its completion: they are handed back, none is placed later, and the
/// key's state is gone (its next message is placed, not held behind a completion
/// that will never come).
#[test]
fn cs_forget_hands_back_the_held_messages_and_drops_the_key() {
    let (mut d, mut w) = sched::<u32>(Model::Cs, 1, 2);
    assert_eq!(d.dispatch(1, 10), Ok(Placed::Queued(0)));
    assert_eq!(d.dispatch(1, 11), Ok(Placed::Held));
    assert_eq!(d.dispatch(1, 12), Ok(Placed::Held));
    assert_eq!(d.dispatch(2, 20), Ok(Placed::Queued(0)));
    assert_eq!(w[0].try_recv(), Some(10));
    assert_eq!(d.dispatch(3, 30), Ok(Placed::Queued(0)));
    // Key 1 completes; the FIFO is full, so 11 waits in the ready line.
    assert!(d.complete(1));
    assert_eq!(d.held(), 2);
    assert_eq!(d.forget(1), [11, 12]);
    assert_eq!(d.held(), 0);
    assert!(d.forget(1).is_empty());
    assert!(!d.complete(1), "nothing in service any more");
    assert_eq!(w[0].try_recv(), Some(20));
    d.poll(); // the ready line no longer names key 1
    assert_eq!(w[0].try_recv(), Some(30));
    assert_eq!(w[0].try_recv(), None);
    assert_eq!(d.dispatch(1, 13), Ok(Placed::Queued(0)));
    assert!(d.forget(2).len() + d.forget(3).len() == 0);
}

#[test]
fn cs_held_fifo_is_bounded_and_rejects_with_the_message() {
    let (mut d, _w) = sched::<u32>(Model::Cs, 1, 2);
    d.dispatch(1, 0).unwrap();
    assert_eq!(d.dispatch(1, 1), Ok(Placed::Held));
    assert_eq!(d.dispatch(1, 2), Ok(Placed::Held));
    let r = d.dispatch(1, 3).unwrap_err();
    assert_eq!((r.key, r.msg), (1, 3));
}

#[test]
fn finish_is_a_no_op_outside_cs() {
    let (mut d, w) = sched::<u32>(Model::Ms, 1, 2);
    w[0].finish(1);
    assert_eq!(d.poll(), 0);
}

#[test]
fn disconnect_drains_queues_then_reports_disconnected() {
    let (mut d, mut w) = sched::<u64>(Model::Ms, 2, 8);
    for i in 0..5 {
        d.dispatch(i, i).unwrap();
    }
    drop(d);
    assert!(w[1].is_disconnected());
    let mut got = Vec::new();
    while let Ok(m) = w[1].recv_timeout(Duration::from_secs(5)) {
        got.push(m);
    }
    got.sort();
    assert_eq!(got, [0, 1, 2, 3, 4]);
    assert_eq!(w[1].recv(), Err(RecvError::Disconnected));
    assert_eq!(w[0].recv(), Err(RecvError::Disconnected));
}

#[test]
fn dropping_the_dispatcher_unparks_parked_workers() {
    let (d, w) = sched::<u64>(Model::Cs, 3, 8);
    let threads: Vec<_> = w
        .into_iter()
        .map(|mut w| thread::spawn(move || w.recv()))
        .collect();
    for i in 0..3 {
        wait_idle(&d, i);
    }
    drop(d);
    for t in threads {
        assert_eq!(t.join().unwrap(), Err(RecvError::Disconnected));
    }
}

#[test]
fn cp_stuck_worker_is_detected_by_its_progress_counter() {
    let (mut d, mut w) = sched::<u64>(Model::Cp, 2, 8);
    let k0 = (0..).find(|&k| d.worker_of(k) == 0).unwrap();
    let k1 = (0..).find(|&k| d.worker_of(k) == 1).unwrap();
    d.dispatch(k0, 1).unwrap();
    d.dispatch(k1, 2).unwrap();
    d.dispatch(k1, 3).unwrap();
    let before = d.stats();
    assert_eq!(w[1].try_recv(), Some(2));
    // Worker 0 never takes; worker 1 progressed.
    let after = d.stats();
    assert_eq!(after.stuck_since(&before), [0]);
    assert_eq!(w[1].try_recv(), Some(3));
    assert_eq!(
        w[1].try_recv(),
        None,
        "CP never steals the stuck worker's queue"
    );
}

#[test]
fn supports_hundreds_of_workers() {
    let n = 300;
    let (mut d, mut w) = sched::<u64>(Model::Ms, n, 4);
    for i in 0..1000 {
        d.dispatch(i, i).unwrap();
    }
    let last = w.last_mut().unwrap();
    let mut got: Vec<_> = std::iter::from_fn(|| last.try_recv()).collect();
    got.sort();
    assert_eq!(got, (0..1000).collect::<Vec<_>>());
    assert!(d.stats().steals >= 996);
    // Handoff to a high-index worker.
    let mut w299 = w.pop().unwrap();
    let t = thread::spawn(move || w299.recv_timeout(Duration::from_secs(20)));
    wait_idle(&d, n - 1);
    assert_eq!(d.dispatch(1, 7), Ok(Placed::Handoff(n - 1)));
    assert_eq!(t.join().unwrap(), Ok(7));
}

#[test]
fn partition_stays_in_range() {
    for n in [1, 2, 3, 7, 256, MAX_WORKERS] {
        for key in (0..10_000u64).chain([u64::MAX, u64::MAX - 1]) {
            assert!(partition(key, n) < n);
        }
    }
}

// ------------------------------------------------- poll (virtual workers) ---

#[test]
fn poll_announces_idle_without_parking_and_takes_the_handoff() {
    let (mut d, mut w) = sched::<u32>(Model::Ms, 3, 8);
    // Nothing yet: Empty, and the worker is announced idle (not parked: we are here).
    assert_eq!(w[1].poll(), Err(TryRecvError::Empty));
    assert!(w[1].is_announced());
    assert!(d.stats().workers[1].idle);
    // The only idle worker gets the message directly.
    assert_eq!(d.dispatch(5, 50), Ok(Placed::Handoff(1)));
    assert_eq!(w[1].poll(), Ok(50));
    // Having taken it, the worker is busy: not idle, not announced.
    assert!(!w[1].is_announced());
    assert!(!d.stats().workers[1].idle);
    // Nobody announced: the next message is queued, not handed off.
    assert!(matches!(d.dispatch(6, 60), Ok(Placed::Queued(_))));
}

#[test]
fn a_worker_that_does_not_poll_is_busy_gets_no_handoff_and_steals_nothing() {
    let (mut d, mut w) = sched::<u32>(Model::Ms, 2, 8);
    assert_eq!(w[0].poll(), Err(TryRecvError::Empty));
    assert_eq!(w[1].poll(), Err(TryRecvError::Empty));
    // Both idle: two handoffs, one each.
    let a = d.dispatch(1, 10).unwrap();
    let b = d.dispatch(2, 20).unwrap();
    let mut got = [a, b];
    got.sort_by_key(|p| match p {
        Placed::Handoff(i) => *i,
        _ => 99,
    });
    assert_eq!(got, [Placed::Handoff(0), Placed::Handoff(1)]);
    let m0 = w[0].poll().unwrap();
    let m1 = w[1].poll().unwrap();
    assert_eq!(m0 + m1, 30);
    // Both occupied (not polling): messages queue up.
    for i in 0..4 {
        assert!(matches!(d.dispatch(3, 100 + i), Ok(Placed::Queued(_))));
    }
    let queued: u64 = d.stats().workers.iter().map(|x| x.queued as u64).sum();
    assert_eq!(queued, 4);
    // Worker 0 is done and polls: it takes from its own FIFO or steals worker 1's,
    // while worker 1 (still occupied) takes nothing.
    let mut mine = Vec::new();
    loop {
        match w[0].poll() {
            Ok(m) => mine.push(m),
            Err(TryRecvError::Empty) => break,
            Err(e) => panic!("{e}"),
        }
    }
    mine.sort_unstable();
    assert_eq!(mine, [100, 101, 102, 103]);
    assert_eq!(d.stats().workers[1].taken, 1);
    assert!(d.stats().workers[0].idle);
}

#[test]
fn poll_sees_work_queued_while_it_was_announced() {
    // CP: no handoff, the key's FIFO; the announced worker must find it on its next poll.
    let (mut d, mut w) = sched::<u32>(Model::Cp, 2, 8);
    let k = (0..100).find(|&k| d.worker_of(k) == 1).unwrap();
    assert_eq!(w[1].poll(), Err(TryRecvError::Empty));
    assert_eq!(d.dispatch(k, 7), Ok(Placed::Queued(1)));
    assert_eq!(w[1].poll(), Ok(7));
    // The other CP worker never steals it.
    assert_eq!(d.dispatch(k, 8), Ok(Placed::Queued(1)));
    assert_eq!(w[0].poll(), Err(TryRecvError::Empty));
    assert_eq!(w[0].poll(), Err(TryRecvError::Empty));
    assert_eq!(w[1].poll(), Ok(8));
}

#[test]
fn poll_then_blocking_or_try_recv_keeps_the_mailbox_invariant() {
    let (mut d, mut w) = sched::<u32>(Model::Ms, 2, 8);
    // Announced by poll, then claimed: recv_timeout returns the handed-off message.
    assert_eq!(w[0].poll(), Err(TryRecvError::Empty));
    assert_eq!(d.dispatch(1, 11), Ok(Placed::Handoff(0)));
    assert_eq!(w[0].recv_timeout(Duration::from_secs(5)), Ok(11));
    // Announced by poll, then withdrawn by try_recv: no longer idle, no handoff.
    assert_eq!(w[1].poll(), Err(TryRecvError::Empty));
    assert!(d.stats().workers[1].idle);
    assert_eq!(w[1].try_recv(), None);
    assert!(!w[1].is_announced());
    assert!(!d.stats().workers[1].idle);
    assert!(matches!(d.dispatch(2, 22), Ok(Placed::Queued(_))));
    // Announced, claimed, then try_recv: the mailbox message.
    let x = w[1].try_recv().or_else(|| w[0].try_recv());
    assert_eq!(x, Some(22));
    assert_eq!(w[1].poll(), Err(TryRecvError::Empty));
    assert_eq!(d.dispatch(3, 33), Ok(Placed::Handoff(1)));
    assert_eq!(w[1].try_recv(), Some(33));
}

#[test]
fn poll_drains_after_disconnect_then_reports_it() {
    let (mut d, mut w) = sched::<u32>(Model::Ms, 2, 8);
    assert_eq!(w[0].poll(), Err(TryRecvError::Empty));
    assert_eq!(w[1].poll(), Err(TryRecvError::Empty));
    assert_eq!(w[0].try_recv(), None); // withdraw 0
    assert_eq!(w[1].try_recv(), None); // withdraw 1
    for i in 0..3 {
        d.dispatch(i, i as u32).unwrap();
    }
    drop(d);
    let mut got = Vec::new();
    loop {
        match w[0].poll() {
            Ok(m) => got.push(m),
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => panic!("empty after disconnect"),
        }
    }
    assert_eq!(w[1].poll(), Err(TryRecvError::Disconnected));
    got.sort_unstable();
    assert_eq!(got, [0, 1, 2]);
}

/// One thread polls 8 virtual workers (each occupied for a few polls after taking a
/// message) while another dispatches: every message is delivered exactly once, and a
/// worker never takes a message while occupied.
#[test]
fn one_thread_polling_many_workers_delivers_every_message_once() {
    for model in [Model::Ms, Model::Cs, Model::Cp] {
        let (mut d, mut w) = sched::<u64>(model, 8, 4);
        let n = 5_000u64;
        let poller = thread::spawn(move || {
            let mut seen = vec![0u32; n as usize];
            let mut busy = [0u32; 8];
            let mut done = false;
            let until = Instant::now() + Duration::from_secs(60);
            while !done {
                assert!(Instant::now() < until, "{model}: poller stuck");
                done = true;
                for (i, wk) in w.iter_mut().enumerate() {
                    if busy[i] > 0 {
                        busy[i] -= 1;
                        done = false;
                        continue;
                    }
                    match wk.poll() {
                        Ok(m) => {
                            seen[m as usize] += 1;
                            wk.finish(m % 16);
                            busy[i] = (m % 3) as u32;
                            done = false;
                        }
                        Err(TryRecvError::Empty) => done = false,
                        Err(TryRecvError::Disconnected) => {}
                    }
                }
            }
            seen
        });
        let until = Instant::now() + Duration::from_secs(60);
        for i in 0..n {
            let mut m = i;
            loop {
                match d.dispatch(i % 16, m) {
                    Ok(_) => break,
                    Err(r) => {
                        assert!(Instant::now() < until, "{model}: dispatcher stuck");
                        m = r.into_inner();
                        d.poll();
                        thread::yield_now();
                    }
                }
            }
        }
        // CS: release what is held before disconnecting.
        while d.held() > 0 {
            assert!(Instant::now() < until, "{model}: held stuck");
            d.poll();
            thread::yield_now();
        }
        drop(d);
        let seen = poller.join().unwrap();
        assert!(seen.iter().all(|&c| c == 1), "{model}: lost or duplicated");
    }
}

/// A worker socket dropped while `poll` left it announced idle (a driver that shrinks its
/// pool, or a thread that ends after an empty poll): the dispatcher must not hand it a
/// message nobody will ever take (under MS and CS the others serve what it leaves).
#[test]
fn a_worker_dropped_while_announced_idle_strands_no_message() {
    for model in [Model::Ms, Model::Cs] {
        let (mut d, mut w) = sched::<u32>(model, 2, 4);
        let w1 = w.pop().unwrap();
        let mut w0 = w.pop().unwrap();
        assert_eq!(w0.poll(), Err(TryRecvError::Empty));
        assert!(w0.is_announced());
        drop(w0);
        let mut w1 = w1;
        for k in 0..3u64 {
            d.dispatch(k, k as u32).unwrap();
        }
        let mut got: Vec<u32> = std::iter::from_fn(|| w1.try_recv()).collect();
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2], "{model:?}: the survivor gets every message");
    }
}

/// The same, claimed first: a dispatcher handed it a message, then it was dropped before
/// its next poll. The message goes to a worker that can take it.
#[test]
fn a_worker_dropped_after_a_handoff_passes_the_message_on() {
    for model in [Model::Ms, Model::Cs] {
        let (mut d, mut w) = sched::<u32>(model, 2, 4);
        let mut w1 = w.pop().unwrap();
        let mut w0 = w.pop().unwrap();
        assert_eq!(w0.poll(), Err(TryRecvError::Empty));
        assert_eq!(d.dispatch(1, 7), Ok(Placed::Handoff(0)));
        drop(w0);
        assert_eq!(w1.try_recv(), Some(7), "{model:?}");
    }
}
