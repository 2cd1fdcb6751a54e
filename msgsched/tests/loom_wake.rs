//! loom model of the I/O core's wakeable idle sleep (`msgsched::doorbell`): producers
//! publish work and ring while the sleeper announces, re-checks and parks.
//!
//! `RUSTFLAGS="--cfg loom" cargo test -p msgsched --test loom_wake --release`
//!
//! loom has no timed park (the parker's `park_timeout` blocks like `park` here), so a
//! lost wakeup — the sleeper parked with work published and nobody left to ring — is a
//! deadlock, which loom reports. The "queue" is a counter the producers bump with
//! Release and the sleeper reads with Acquire: no stronger than the real queues'
//! push and `is_empty` (crossbeam's `SegQueue` and `ArrayQueue`), so the fences the
//! protocol relies on are the doorbell's own.

#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use msgsched::doorbell::{doorbell, Sleeper};
use std::time::Duration;

fn model(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    b.check(f);
}

/// The I/O core's loop: take what is published, else sleep on the doorbell with the
/// re-check of the published count; until `want` items were taken.
fn sleeper_takes(sleeper: &mut Sleeper, work: &AtomicUsize, want: usize) {
    let mut taken = 0;
    while taken < want {
        let n = work.load(Ordering::Acquire);
        if n > taken {
            taken = n;
            continue;
        }
        sleeper.sleep(Duration::from_secs(1), || {
            work.load(Ordering::Acquire) > taken
        });
    }
}

/// Two producers each publish one item and ring, racing the sleeper's announcement,
/// re-check and park (and each other's claim of the wakeup).
#[test]
fn two_producers_never_leave_the_sleeper_parked_over_work() {
    model(3, || {
        let (bell, mut sleeper) = doorbell();
        let work = Arc::new(AtomicUsize::new(0));
        let producers: Vec<_> = (0..2)
            .map(|_| {
                let (bell, work) = (Arc::clone(&bell), Arc::clone(&work));
                thread::spawn(move || {
                    work.fetch_add(1, Ordering::Release);
                    bell.ring();
                })
            })
            .collect();
        sleeper_takes(&mut sleeper, &work, 2);
        for p in producers {
            p.join().unwrap();
        }
    });
}

/// One producer publishes twice, ringing after each, while the sleeper sleeps again
/// between them: a wakeup's stale token and the flag the sleeper clears itself must not
/// swallow the second ring.
#[test]
fn a_second_ring_after_a_wakeup_is_not_lost() {
    model(3, || {
        let (bell, mut sleeper) = doorbell();
        let work = Arc::new(AtomicUsize::new(0));
        let producer = {
            let (bell, work) = (Arc::clone(&bell), Arc::clone(&work));
            thread::spawn(move || {
                for _ in 0..2 {
                    work.fetch_add(1, Ordering::Release);
                    bell.ring();
                }
            })
        };
        sleeper_takes(&mut sleeper, &work, 2);
        producer.join().unwrap();
    });
}
