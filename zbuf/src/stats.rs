//! Copy counters: every byte the crate's copying paths move is counted here, so a test
//! or a benchmark can prove a path is zero-copy.
//!
//! Each thread counts in counters of its own (one writer: a plain load and store, no
//! locked read-modify-write and no cache line shared with another core on the data
//! path); [`copy_stats`] sums every live thread's counters and what the threads that
//! ended had counted. A shared-nothing core that copies (a small-frame copy, the batch
//! API's `send` of bytes, a parser's gather) never writes a line another core writes.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Bytes copied and number of copy operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CopyStats {
    /// Bytes copied.
    pub bytes: u64,
    /// Copy operations (calls that copied at least one byte).
    pub copies: u64,
}

/// One thread's counters: written by that thread only, read by anyone.
#[derive(Default)]
struct Counters {
    bytes: AtomicU64,
    copies: AtomicU64,
}

impl Counters {
    fn get(&self) -> CopyStats {
        CopyStats {
            bytes: self.bytes.load(Ordering::Relaxed),
            copies: self.copies.load(Ordering::Relaxed),
        }
    }
}

/// The live threads' counters, and the sum of the ended threads' (and of copies made
/// while a thread's own counters were already gone, in its exit).
struct Registry {
    live: Vec<Arc<Counters>>,
    ended: CopyStats,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    live: Vec::new(),
    ended: CopyStats {
        bytes: 0,
        copies: 0,
    },
});

/// The registry, also after a panic in another thread while it held the lock (the data
/// are counters: nothing there can be left half-updated in a harmful way).
fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// A thread's registration: its counters are listed while it lives and folded into
/// `ended` when it exits (under the lock, so [`copy_stats`] never counts them twice or
/// misses them).
struct Local(Arc<Counters>);

impl Local {
    #[cold]
    fn register() -> Local {
        let c = Arc::new(Counters::default());
        registry().live.push(Arc::clone(&c));
        Local(c)
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        let mut r = registry();
        let s = self.0.get();
        r.ended.bytes += s.bytes;
        r.ended.copies += s.copies;
        r.live.retain(|c| !Arc::ptr_eq(c, &self.0));
    }
}

thread_local! {
    static LOCAL: Local = Local::register();
}

/// Records a copy of `n` bytes in the calling thread's counters.
#[inline]
pub(crate) fn count_copy(n: usize) {
    if n == 0 {
        return;
    }
    let counted = LOCAL.try_with(|l| {
        // Only this thread writes these: load and store, not a locked add.
        let c = &l.0;
        let b = c.bytes.load(Ordering::Relaxed);
        c.bytes.store(b + n as u64, Ordering::Relaxed);
        let k = c.copies.load(Ordering::Relaxed);
        c.copies.store(k + 1, Ordering::Relaxed);
    });
    if counted.is_err() {
        count_after_exit(n);
    }
}

/// A copy made while the calling thread exits, its counters gone: counted as an ended
/// thread's. Out of line, so the copy paths that inline [`count_copy`] stay small.
#[cold]
#[inline(never)]
fn count_after_exit(n: usize) {
    let mut r = registry();
    r.ended.bytes += n as u64;
    r.ended.copies += 1;
}

/// Copies made by this process so far: [`crate::Zbuf::copy_from_slice`],
/// [`crate::ZbufMut::extend_from_slice`], [`crate::IoVec::copy_to_slice`] and
/// [`crate::IoVec::to_vec`]. Another thread's copies are seen once something
/// synchronised with it (a join, a channel, a lock), as for any relaxed counter.
pub fn copy_stats() -> CopyStats {
    let r = registry();
    r.live.iter().fold(r.ended, |acc, c| {
        let s = c.get();
        CopyStats {
            bytes: acc.bytes + s.bytes,
            copies: acc.copies + s.copies,
        }
    })
}

/// Copies made by the calling thread so far (exact even while other threads copy).
pub fn thread_copy_stats() -> CopyStats {
    LOCAL.try_with(|l| l.0.get()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Other threads' copies, while they run and after they ended, are in the process's
    /// total, and never in this thread's; each is counted once.
    #[test]
    fn copies_of_live_and_ended_threads_are_counted_once() {
        let before = copy_stats();
        let mine = thread_copy_stats();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let live = std::thread::spawn(move || {
            count_copy(100);
            count_copy(0);
            done_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            count_copy(5);
        });
        done_rx.recv().unwrap();
        // Other tests run beside this one and copy too: at least ours, by the deltas.
        let mid = copy_stats();
        assert!(mid.bytes - before.bytes >= 100 && mid.copies - before.copies >= 1);
        go_tx.send(()).unwrap();
        live.join().unwrap();
        std::thread::spawn(|| count_copy(7)).join().unwrap();
        let after = copy_stats();
        assert!(after.bytes - before.bytes >= 112 && after.copies - before.copies >= 3);
        assert_eq!(
            thread_copy_stats(),
            mine,
            "other threads' copies are not this one's"
        );
        count_copy(3);
        let me = thread_copy_stats();
        assert_eq!((me.bytes - mine.bytes, me.copies - mine.copies), (3, 1));
    }

    /// An ended thread's counters leave the live list (no growth with thread churn) and
    /// its counts stay in the total.
    #[test]
    fn ended_threads_leave_the_live_list() {
        for _ in 0..50 {
            std::thread::spawn(|| count_copy(1)).join().unwrap();
        }
        // Live threads: this one, the harness's, and other tests' at most.
        assert!(
            registry().live.len() < 50,
            "{} listed",
            registry().live.len()
        );
    }
}
