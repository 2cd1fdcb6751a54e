//! Synchronization primitives of the scheduler: std and crossbeam normally, loom under
//! `--cfg loom`.
//!
//! Under loom, `tests/loom_sched.rs` model-checks OUR protocol as written in this crate:
//! the idle and non-empty bitmaps, the idle claim, the 1-slot mailbox, park/unpark, the
//! steal path and disconnect. loom has no `ArrayQueue`, so the bounded FIFO is a loom
//! mutex around a `VecDeque` with the same API; crossbeam's queue itself is trusted (a
//! well-kept, separately tested crate), not checked here. Every queue operation takes the
//! mutex, which is at least as strong as crossbeam's orderings (its `push` publishes with
//! Release, `pop` and `len` read with Acquire/SeqCst), so what loom proves about our
//! fences holds for the real queue as well.

#[cfg(not(loom))]
mod imp {
    pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
    pub(crate) use std::sync::Arc;
    pub(crate) use std::thread::yield_now;

    /// Bounded lock-free MPMC FIFO.
    pub(crate) struct Queue<T>(crossbeam_queue::ArrayQueue<T>);

    impl<T> Queue<T> {
        pub(crate) fn new(capacity: usize) -> Self {
            Queue(crossbeam_queue::ArrayQueue::new(capacity))
        }
        pub(crate) fn push(&self, item: T) -> Result<(), T> {
            self.0.push(item)
        }
        pub(crate) fn pop(&self) -> Option<T> {
            self.0.pop()
        }
        pub(crate) fn len(&self) -> usize {
            self.0.len()
        }
        pub(crate) fn is_empty(&self) -> bool {
            self.0.is_empty()
        }
    }

    /// A worker's parking spot (token semantics: an `unpark` before `park` is not lost).
    pub(crate) struct Parker(crossbeam_utils::sync::Parker);

    /// The other end of a [`Parker`], held by the shared state.
    pub(crate) struct Unparker(crossbeam_utils::sync::Unparker);

    impl Parker {
        pub(crate) fn new() -> (Parker, Unparker) {
            let p = crossbeam_utils::sync::Parker::new();
            let u = p.unparker().clone();
            (Parker(p), Unparker(u))
        }
        pub(crate) fn park(&self) {
            self.0.park()
        }
        pub(crate) fn park_timeout(&self, timeout: std::time::Duration) {
            self.0.park_timeout(timeout)
        }
    }

    impl Unparker {
        pub(crate) fn unpark(&self) {
            self.0.unpark()
        }
    }
}

#[cfg(loom)]
mod imp {
    pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
    pub(crate) use loom::sync::Arc;
    use loom::sync::{Condvar, Mutex};
    pub(crate) use loom::thread::yield_now;
    use std::collections::VecDeque;

    /// Same bounded API as crossbeam's `ArrayQueue`, as a loom mutex around a `VecDeque`.
    pub(crate) struct Queue<T> {
        items: Mutex<VecDeque<T>>,
        capacity: usize,
    }

    impl<T> Queue<T> {
        pub(crate) fn new(capacity: usize) -> Self {
            Queue {
                items: Mutex::new(VecDeque::with_capacity(capacity)),
                capacity,
            }
        }
        pub(crate) fn push(&self, item: T) -> Result<(), T> {
            let mut q = self.items.lock().unwrap();
            if q.len() == self.capacity {
                return Err(item);
            }
            q.push_back(item);
            Ok(())
        }
        pub(crate) fn pop(&self) -> Option<T> {
            self.items.lock().unwrap().pop_front()
        }
        pub(crate) fn len(&self) -> usize {
            self.items.lock().unwrap().len()
        }
        pub(crate) fn is_empty(&self) -> bool {
            self.items.lock().unwrap().is_empty()
        }
    }

    struct Token {
        set: Mutex<bool>,
        cond: Condvar,
    }

    /// Token parker on a loom mutex and condvar (crossbeam's `Parker` is not loom-aware).
    pub(crate) struct Parker(Arc<Token>);

    /// The other end of a [`Parker`].
    pub(crate) struct Unparker(Arc<Token>);

    impl Parker {
        pub(crate) fn new() -> (Parker, Unparker) {
            let t = Arc::new(Token {
                set: Mutex::new(false),
                cond: Condvar::new(),
            });
            (Parker(t.clone()), Unparker(t))
        }
        pub(crate) fn park(&self) {
            let mut set = self.0.set.lock().unwrap();
            while !*set {
                set = self.0.cond.wait(set).unwrap();
            }
            *set = false;
        }
        /// loom has no timed wait: blocks like [`Parker::park`].
        pub(crate) fn park_timeout(&self, _timeout: std::time::Duration) {
            self.park()
        }
    }

    impl Unparker {
        pub(crate) fn unpark(&self) {
            *self.0.set.lock().unwrap() = true;
            self.0.cond.notify_one();
        }
    }
}

pub(crate) use imp::*;
