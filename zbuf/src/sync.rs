//! Synchronization primitives used by [`crate::remote`].
//!
//! `tests/loom_remote.rs` includes `remote.rs` verbatim next to its own version of this
//! module built on loom, so the cross-core return protocol is model-checked as written.

pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Unbounded lock-free MPMC queue (the remote-free queue of a home core).
pub(crate) struct Queue<T>(crossbeam_queue::SegQueue<T>);

impl<T> Queue<T> {
    pub(crate) fn new() -> Self {
        Queue(crossbeam_queue::SegQueue::new())
    }

    pub(crate) fn push(&self, item: T) {
        self.0.push(item)
    }

    pub(crate) fn pop(&self) -> Option<T> {
        self.0.pop()
    }
}
