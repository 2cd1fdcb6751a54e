//! Atomics and the bounded queue of the reply path, mapped to loom under `cfg(loom)` so the
//! staging protocol (the pending count and the drain loop) is model-checked (tests/loom_reply.rs).
//!
//! Outside loom the queue is crossbeam's lock-free `ArrayQueue` (a well-kept crate we
//! trust); under loom it is a mutex around a `VecDeque` with the same bounded API, since
//! what loom checks is our protocol around the queue, not the queue itself.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering as AtomicOrdering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as AtomicOrdering};

/// A bounded multi-producer multi-consumer FIFO.
#[cfg(not(loom))]
pub(crate) struct BoundedQueue<T>(crossbeam_queue::ArrayQueue<T>);

#[cfg(not(loom))]
impl<T> BoundedQueue<T> {
    pub(crate) fn new(capacity: usize) -> Self {
        BoundedQueue(crossbeam_queue::ArrayQueue::new(capacity))
    }
    pub(crate) fn push(&self, v: T) -> Result<(), T> {
        self.0.push(v)
    }
    pub(crate) fn pop(&self) -> Option<T> {
        self.0.pop()
    }
}

/// A bounded multi-producer multi-consumer FIFO (loom model).
#[cfg(loom)]
pub(crate) struct BoundedQueue<T> {
    q: loom::sync::Mutex<std::collections::VecDeque<T>>,
    cap: usize,
}

#[cfg(loom)]
impl<T> BoundedQueue<T> {
    pub(crate) fn new(capacity: usize) -> Self {
        BoundedQueue {
            q: loom::sync::Mutex::new(std::collections::VecDeque::new()),
            cap: capacity,
        }
    }
    pub(crate) fn push(&self, v: T) -> Result<(), T> {
        let mut q = self.q.lock().unwrap();
        if q.len() >= self.cap {
            return Err(v);
        }
        q.push_back(v);
        Ok(())
    }
    pub(crate) fn pop(&self) -> Option<T> {
        self.q.lock().unwrap().pop_front()
    }
}
