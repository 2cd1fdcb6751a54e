//! Deferred mbuf frees: a poll loop's way to keep buffer recycling off its critical path.
//!
//! A run-to-completion core that answers a request frees the request's receive buffers
//! while it works on the answer: the application drops the last `Zbuf` of the request,
//! and `rte_pktmbuf_free` (the mempool put, a cache line of the mbuf) runs before the
//! answer is handed to the device. At iodepth 1 that time is on the round trip. Inside a
//! [`DeferredFrees`] scope, the last release of an mbuf-backed `Zbuf` **on this thread**
//! queues the mbuf instead, and the scope's end frees the queue in one
//! `rte_pktmbuf_free_bulk`: r2c opens the scope when a burst arrives and closes it after
//! the iteration's transmit burst, so the frees run while the peer works.
//!
//! What does not change: every buffer is freed exactly once, on the thread that released
//! it, before that thread's scope ends (the scope's drop frees them, also when unwinding);
//! other threads free at once as before. At most [`MAX_DEFERRED`] mbufs wait: past that a
//! release frees at once, so a scope never holds more than a burst's worth of a pool.
//! A release that runs while the queue is being freed (a free callback dropping a `Zbuf`)
//! frees at once too.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::ptr::NonNull;

use dpdk_sys::ffi;

/// Most mbufs one thread's scope holds back; later releases free at once.
pub const MAX_DEFERRED: usize = 256;

struct Deferred {
    /// A scope is open on this thread.
    active: Cell<bool>,
    /// Mbufs whose last reference was released inside the scope.
    mbufs: RefCell<Vec<NonNull<ffi::rte_mbuf>>>,
}

thread_local! {
    static DEFERRED: Deferred = const {
        Deferred {
            active: Cell::new(false),
            mbufs: RefCell::new(Vec::new()),
        }
    };
}

/// An open scope of deferred frees on this thread (see the module docs); its drop frees
/// what it held. Scopes nest: only the outermost one frees. Not `Send`: it belongs to
/// the thread that opened it.
#[must_use = "the frees are deferred until this scope drops"]
pub struct DeferredFrees {
    outer: bool,
    _thread: PhantomData<*const ()>,
}

/// Opens a scope of deferred mbuf frees on this thread.
pub fn defer_mbuf_frees() -> DeferredFrees {
    let outer = DEFERRED
        .try_with(|d| !d.active.replace(true))
        .unwrap_or(false);
    DeferredFrees {
        outer,
        _thread: PhantomData,
    }
}

/// Mbufs this thread's open scope holds now (0 without a scope).
pub fn deferred_mbufs() -> usize {
    DEFERRED
        .try_with(|d| d.mbufs.try_borrow().map_or(0, |v| v.len()))
        .unwrap_or(0)
}

impl Drop for DeferredFrees {
    fn drop(&mut self) {
        if !self.outer {
            return;
        }
        let _ = DEFERRED.try_with(|d| {
            // Closed first: a release during the bulk free (a free callback) frees at once.
            d.active.set(false);
            let mut v = d.mbufs.take();
            if !v.is_empty() {
                // SAFETY: each pointer is an mbuf whose last reference this thread
                // released inside the scope (`defer`), queued once and freed nowhere else;
                // the queue is emptied right after, so none is freed twice.
                unsafe { ffi::dpdk_sys_pktmbuf_free_bulk(v.as_mut_ptr().cast(), v.len() as u32) };
                v.clear();
            }
            // Keep the capacity for the next scope.
            *d.mbufs.borrow_mut() = v;
        });
    }
}

/// Queues `m` for the open scope's end: true if it did, false (the caller frees it now)
/// without an open scope on this thread, with the queue full or being freed.
pub(crate) fn defer(m: NonNull<ffi::rte_mbuf>) -> bool {
    DEFERRED
        .try_with(|d| {
            if !d.active.get() {
                return false;
            }
            match d.mbufs.try_borrow_mut() {
                Ok(mut v) if v.len() < MAX_DEFERRED => {
                    if v.capacity() == 0 {
                        v.reserve_exact(MAX_DEFERRED);
                    }
                    v.push(m);
                    true
                }
                _ => false,
            }
        })
        .unwrap_or(false)
}
