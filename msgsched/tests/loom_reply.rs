//! loom model of the reply path's transmit delegation (`msgsched::reply::Staging`): two
//! workers stage replies for one connection while the I/O core drains on notification.
//! Invariant checked in every interleaving: once everyone is done, each reply has been
//! drained exactly once, or a notification for it is still pending (so the I/O core's
//! next drain sends it) — no reply is ever staged behind a flag nobody will clear.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p msgsched --test loom_reply --release`
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use msgsched::reply::{Staged, Staging};

#[test]
fn staged_replies_are_drained_or_notified() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let st = Arc::new(Staging::<u64>::new(4));
        let notified = Arc::new(AtomicUsize::new(0));
        let got = Arc::new(Mutex::new(Vec::new()));
        let workers: Vec<_> = (0..2u64)
            .map(|w| {
                let (st, notified) = (Arc::clone(&st), Arc::clone(&notified));
                loom::thread::spawn(move || {
                    if st.stage(w, Some(w)).unwrap() == Staged::Notify {
                        notified.fetch_add(1, Ordering::Release);
                    }
                })
            })
            .collect();
        // The I/O core drains concurrently, on the notifications it sees.
        let io = {
            let (st, notified, got) = (Arc::clone(&st), Arc::clone(&notified), Arc::clone(&got));
            loom::thread::spawn(move || {
                let mut handled = 0;
                for _ in 0..2 {
                    if notified.load(Ordering::Acquire) > handled {
                        handled += 1;
                        st.drain(|c| got.lock().unwrap().push(c));
                    } else {
                        loom::thread::yield_now();
                    }
                }
                handled
            })
        };
        for w in workers {
            w.join().unwrap();
        }
        let mut handled = io.join().unwrap();
        // Quiescent: every pending notification gets its drain.
        while notified.load(Ordering::Acquire) > handled {
            handled += 1;
            st.drain(|c| got.lock().unwrap().push(c));
        }
        let mut v = got.lock().unwrap().clone();
        v.sort();
        assert_eq!(v, vec![(0, Some(0)), (1, Some(1))]);
    });
}
