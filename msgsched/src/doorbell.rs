//! A wakeable idle sleep for a polling thread, with no lost wakeup.
//!
//! r2c's I/O core sleeps when idle under `IdleStrategy::Backoff` (1 µs doubling up to
//! a maximum). Work other threads hand it — a worker's reply notice
//! ([`crate::socket::Origin`]), split mode's commands — must not wait for that sleep
//! to end: the producer rings the [`Doorbell`] after publishing, which wakes the
//! sleeper only if it may be asleep.
//!
//! The protocol (the scheduler's idle protocol, `sched/worker.rs`, with one sleeper):
//! - the sleeper ([`Sleeper::sleep`]) stores `sleeping = true`, `fence(SeqCst)`, then
//!   re-checks its inputs (`pending`); work there: it clears the flag and returns
//!   without sleeping; else it parks (timed) and clears the flag when it wakes;
//! - a producer, after publishing its work: `fence(SeqCst)`, then loads `sleeping`;
//!   only when set does it claim the flag (`compare_exchange(true, false)`, so one of
//!   several producers makes the call) and unpark the sleeper.
//!
//! By the two fences either the sleeper's re-check sees the work or the producer sees
//! the flag; the parker keeps a token, so an unpark that lands before the park is not
//! lost (the park returns at once). A producer that finds the flag clear costs a fence
//! and one load of a line nobody writes while the sleeper is busy: no syscall, no
//! cache-line transfer. A stale token (an unpark after the sleeper already woke by
//! itself) only makes the next sleep return early once.
//!
//! Checked by loom (`tests/loom_wake.rs`): producers racing the sleeper's announce and
//! re-check never leave it parked with work published (loom has no timed park, so a
//! lost wakeup is a deadlock there).

use crate::sched::sync::{fence, Arc, AtomicBool, AtomicU64, Ordering, Parker, Unparker};
use std::time::Duration;

/// The producers' end: ring after publishing work for the sleeper.
pub struct Doorbell {
    /// Set by the sleeper from its announcement until it wakes (cleared by the producer
    /// that claims the wakeup, or by the sleeper itself).
    sleeping: AtomicBool,
    unparker: Unparker,
    /// Sleeps taken (parks), written by the sleeper only.
    sleeps: AtomicU64,
    /// Wakeups delivered by producers (unparks).
    wakes: AtomicU64,
    /// Sleeps given up because the re-check after the announcement found work.
    declined: AtomicU64,
}

/// The sleeping thread's end (one per [`Doorbell`]; `Send`, not shared).
pub struct Sleeper {
    parker: Parker,
    bell: Arc<Doorbell>,
}

/// How a [`Sleeper::sleep`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slept {
    /// The re-check after the announcement found work: no sleep.
    Declined,
    /// A producer rang (or a token was left from an earlier ring).
    Woken,
    /// The timeout passed (or the park returned spuriously) with no ring.
    TimedOut,
}

/// A doorbell's counters (Relaxed snapshots).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DoorbellStats {
    /// Sleeps taken.
    pub sleeps: u64,
    /// Sleeps cut short by a producer's ring (unparks delivered).
    pub wakes: u64,
    /// Sleeps given up because the re-check after the announcement found work.
    pub declined: u64,
}

/// A doorbell and its sleeper.
pub fn doorbell() -> (Arc<Doorbell>, Sleeper) {
    let (parker, unparker) = Parker::new();
    let bell = Arc::new(Doorbell {
        sleeping: AtomicBool::new(false),
        unparker,
        sleeps: AtomicU64::new(0),
        wakes: AtomicU64::new(0),
        declined: AtomicU64::new(0),
    });
    let sleeper = Sleeper {
        parker,
        bell: Arc::clone(&bell),
    };
    (bell, sleeper)
}

impl Doorbell {
    /// Call after publishing work for the sleeper (a push it will see in its
    /// `pending` re-check): wakes it if it may be asleep. Busy sleeper: a fence and a
    /// load.
    #[inline]
    pub fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            self.wake();
        }
    }

    #[cold]
    #[inline(never)]
    fn wake(&self) {
        // One of several producers makes the call; a sleeper that woke by itself
        // cleared the flag and re-checks before it parks again. A compare-exchange, not
        // a swap: a claim that lost writes nothing, so the flag's only stores are the
        // sleeper's and one claim per sleep. (With a swap, loom — whose modification
        // order is partial — let a later producer read a lost claim's `false` after the
        // sleeper's fenced announcement, a deadlock C11 forbids.)
        if self
            .sleeping
            .compare_exchange(true, false, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.wakes.fetch_add(1, Ordering::Relaxed);
            self.unparker.unpark();
        }
    }

    /// The counters.
    pub fn stats(&self) -> DoorbellStats {
        DoorbellStats {
            sleeps: self.sleeps.load(Ordering::Relaxed),
            wakes: self.wakes.load(Ordering::Relaxed),
            declined: self.declined.load(Ordering::Relaxed),
        }
    }
}

impl Sleeper {
    /// The producers' end.
    pub fn doorbell(&self) -> &Arc<Doorbell> {
        &self.bell
    }

    /// Sleeps up to `timeout` unless `pending()` — asked after the announcement, so it
    /// must look at everything producers ring for — finds work, or until a producer
    /// rings.
    pub fn sleep(&mut self, timeout: Duration, pending: impl FnOnce() -> bool) -> Slept {
        let bell = &*self.bell;
        bell.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if pending() {
            bell.sleeping.store(false, Ordering::Relaxed);
            bell.declined.fetch_add(1, Ordering::Relaxed);
            return Slept::Declined;
        }
        bell.sleeps.fetch_add(1, Ordering::Relaxed);
        self.parker.park_timeout(timeout);
        if bell.sleeping.swap(false, Ordering::Relaxed) {
            Slept::TimedOut
        } else {
            Slept::Woken
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Instant;

    #[test]
    fn a_ring_with_nobody_asleep_delivers_nothing() {
        let (bell, _s) = doorbell();
        bell.ring();
        assert_eq!(bell.stats(), DoorbellStats::default());
    }

    #[test]
    fn pending_work_declines_the_sleep() {
        let (bell, mut s) = doorbell();
        let t = Instant::now();
        assert_eq!(s.sleep(Duration::from_secs(10), || true), Slept::Declined);
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!(bell.stats().declined, 1);
        // The flag is clear again: a ring now costs nothing.
        bell.ring();
        assert_eq!(bell.stats().wakes, 0);
    }

    #[test]
    fn nothing_rings_the_sleep_times_out() {
        let (bell, mut s) = doorbell();
        assert_eq!(s.sleep(Duration::from_millis(5), || false), Slept::TimedOut);
        assert_eq!((bell.stats().sleeps, bell.stats().wakes), (1, 0));
    }

    /// A producer thread publishes work and rings; the sleeper, asleep for up to 10 s,
    /// sees every item long before that, whatever the interleaving.
    #[test]
    fn a_ring_wakes_the_sleeper_early() {
        let (bell, mut s) = doorbell();
        let work = std::sync::Arc::new(AtomicUsize::new(0));
        let (w, b) = (std::sync::Arc::clone(&work), Arc::clone(&bell));
        let producer = std::thread::spawn(move || {
            for _ in 0..20 {
                std::thread::sleep(Duration::from_millis(1));
                w.fetch_add(1, std::sync::atomic::Ordering::Release);
                b.ring();
            }
        });
        let t = Instant::now();
        let mut seen = 0;
        while seen < 20 {
            let now = work.load(std::sync::atomic::Ordering::Acquire);
            if now > seen {
                seen = now;
                continue;
            }
            s.sleep(Duration::from_secs(10), || {
                work.load(std::sync::atomic::Ordering::Acquire) > seen
            });
        }
        producer.join().unwrap();
        assert!(t.elapsed() < Duration::from_secs(9), "{:?}", t.elapsed());
        assert!(bell.stats().wakes >= 1, "{:?}", bell.stats());
    }
}
