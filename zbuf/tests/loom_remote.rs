//! Model check of the cross-core return protocol (`src/remote.rs`, included verbatim).
//!
//! `cargo test -p zbuf --test loom_remote` runs bounded models (preemption bound 3).
//! `RUSTFLAGS="--cfg loom" cargo test -p zbuf --test loom_remote --release` explores
//! every interleaving (no preemption bound).
//!
//! The crossbeam queue is replaced by a loom mutex around a `VecDeque`: the model checks
//! our orderings (reference counts, claim flag, lifetime count), not crossbeam's.

#![allow(dead_code)]

mod sync {
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

    /// Like crossbeam's `SegQueue` where it matters here: push publishes with Release,
    /// pop acquires what it takes, and a pop that finds the queue empty writes nothing
    /// (so it does not synchronize with a later push).
    pub(crate) struct Queue<T> {
        items: loom::sync::Mutex<std::collections::VecDeque<T>>,
        len: AtomicUsize,
    }

    impl<T> Queue<T> {
        pub(crate) fn new() -> Self {
            Queue {
                items: loom::sync::Mutex::new(Default::default()),
                len: AtomicUsize::new(0),
            }
        }
        pub(crate) fn push(&self, item: T) {
            let mut q = self.items.lock().unwrap();
            q.push_back(item);
            self.len.fetch_add(1, Ordering::Release);
        }
        pub(crate) fn pop(&self) -> Option<T> {
            if self.len.load(Ordering::Acquire) == 0 {
                return None;
            }
            let mut q = self.items.lock().unwrap();
            let item = q.pop_front()?;
            self.len.fetch_sub(1, Ordering::Relaxed);
            Some(item)
        }
    }
}

#[path = "../src/remote.rs"]
mod remote;

use loom::cell::UnsafeCell;
use loom::sync::{Arc, Mutex};
use loom::thread;
use remote::{Home, RefCount, Refs};

/// Writes a loom cell; loom fails the model if this races with any other access.
fn write(cell: &UnsafeCell<u32>, v: u32) {
    // SAFETY: loom tracks causality of every cell access and panics on a data race,
    // which is exactly what these models test for.
    cell.with_mut(|p| unsafe { *p = v });
}

/// Reads a loom cell (checked like `write`).
fn read(cell: &UnsafeCell<u32>) -> u32 {
    // SAFETY: as in `write`.
    cell.with(|p| unsafe { *p })
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if !cfg!(loom) {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

/// A buffer object: its count and payload (the payload is an UnsafeCell so loom flags
/// any access not ordered by the protocol).
struct Obj {
    refs: RefCount,
    payload: UnsafeCell<u32>,
}

// SAFETY: the only non-Sync field is a loom UnsafeCell, whose accesses loom checks.
unsafe impl Sync for Obj {}

struct World {
    obj: Obj,
    home: Home<usize>,
    pool: Mutex<Vec<usize>>,
}

/// Two handles, one on the home core and one elsewhere, are dropped concurrently; the
/// object reaches the home exactly once and the remote writer's bytes happen-before
/// the home's reuse of the object.
#[test]
fn last_release_returns_object_once() {
    model(|| {
        let w = Arc::new(World {
            obj: Obj {
                refs: RefCount::new(2),
                payload: UnsafeCell::new(0),
            },
            home: Home::new(),
            pool: Mutex::new(Vec::new()),
        });
        assert!(w.home.try_claim());
        let w1 = w.clone();
        let t = thread::spawn(move || {
            // The remote core wrote the buffer while it was unique, then shared it.
            write(&w1.obj.payload, 7);
            if w1.obj.refs.release() {
                w1.home.push_remote(1, |o| w1.pool.lock().unwrap().push(o));
            }
        });
        let mut local = Vec::new();
        if w.obj.refs.release() {
            // Last reference on the home core: reuse at once, before any join.
            write(&w.obj.payload, 0);
            local.push(1);
        }
        // The home core polls its queue while the other core may still be running.
        if w.home.drain(|o| local.push(o)) == 1 {
            write(&w.obj.payload, 0);
        }
        t.join().unwrap();
        w.home.drain(|o| local.push(o));
        assert_eq!(local.len() + w.pool.lock().unwrap().len(), 1);
        assert!(
            w.pool.lock().unwrap().is_empty(),
            "home is claimed: nothing goes to the pool"
        );
    });
}

/// The home gives its slot up while another core returns an object: the object must
/// end up in the shared pool, never stranded in the queue of an unowned home.
#[test]
fn unclaim_racing_remote_free_strands_nothing() {
    model(|| {
        let w = Arc::new(World {
            obj: Obj {
                refs: RefCount::new(1),
                payload: UnsafeCell::new(0),
            },
            home: Home::new(),
            pool: Mutex::new(Vec::new()),
        });
        assert!(w.home.try_claim());
        let w1 = w.clone();
        let t = thread::spawn(move || {
            write(&w1.obj.payload, 1);
            if w1.obj.refs.release() {
                w1.home.push_remote(1, |o| w1.pool.lock().unwrap().push(o));
            }
        });
        let drained = w.home.unclaim(|o| w.pool.lock().unwrap().push(o));
        if drained == 1 {
            // Taken from the queue: usable at once.
            write(&w.obj.payload, 2);
        }
        t.join().unwrap();
        assert!(drained <= 1);
        assert_eq!(*w.pool.lock().unwrap(), vec![1]);
        assert_eq!(w.home.drain(|_| ()), 0, "nothing left in the queue");
    });
}

/// The slab's memory (here a cell) is freed only after the last remote releaser is done
/// with the home queue and pool, even when the last user handle is dropped concurrently.
#[test]
fn slab_outlives_remote_release() {
    struct Slab {
        refs: Refs,
        home: Home<usize>,
        pool: Mutex<Vec<usize>>,
        memory: UnsafeCell<u32>,
        frees: loom::sync::atomic::AtomicUsize,
    }
    // SAFETY: the only non-Sync field is a loom UnsafeCell, whose accesses loom checks.
    unsafe impl Sync for Slab {}
    fn free(s: &Slab) {
        write(&s.memory, 0xdead);
        s.frees.fetch_add(1, loom::sync::atomic::Ordering::Relaxed);
    }
    model(|| {
        // One user handle + one object outside the pool.
        let s = Arc::new(Slab {
            refs: Refs::new(2),
            home: Home::new(),
            pool: Mutex::new(Vec::new()),
            memory: UnsafeCell::new(1),
            frees: loom::sync::atomic::AtomicUsize::new(0),
        });
        let s1 = s.clone();
        let t = thread::spawn(move || {
            // Remote release of the last reference to the object (the home is unowned).
            s1.refs.acquire(1);
            s1.home.push_remote(1, |o| {
                assert_eq!(read(&s1.memory), 1);
                s1.pool.lock().unwrap().push(o);
                assert!(!s1.refs.release(1), "the releaser's own reference is held");
            });
            assert_eq!(read(&s1.memory), 1);
            if s1.refs.release(1) {
                free(&s1);
            }
        });
        if s.refs.release(1) {
            free(&s);
        }
        t.join().unwrap();
        assert_eq!(s.frees.load(loom::sync::atomic::Ordering::Relaxed), 1);
    });
}

/// Two other cores drop the last two handles while the home gives its slot up: exactly
/// one of them returns the object, and it lands in the pool exactly once.
#[test]
fn two_remote_releasers_and_unclaim() {
    model(|| {
        let w = Arc::new(World {
            obj: Obj {
                refs: RefCount::new(2),
                payload: UnsafeCell::new(0),
            },
            home: Home::new(),
            pool: Mutex::new(Vec::new()),
        });
        assert!(w.home.try_claim());
        let spawn_releaser = |w: Arc<World>| {
            thread::spawn(move || {
                assert_eq!(
                    read(&w.obj.payload),
                    0,
                    "readers see the bytes written before sharing"
                );
                if w.obj.refs.release() {
                    w.home.push_remote(1, |o| w.pool.lock().unwrap().push(o));
                }
            })
        };
        let (a, b) = (spawn_releaser(w.clone()), spawn_releaser(w.clone()));
        if w.home.unclaim(|o| w.pool.lock().unwrap().push(o)) == 1 {
            write(&w.obj.payload, 3);
        }
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(*w.pool.lock().unwrap(), vec![1]);
        assert_eq!(w.home.drain(|_| ()), 0);
    });
}
