//! The cross-core return protocol: object reference counts, home slots with their
//! remote-free queues, and the slab's lifetime count.
//!
//! Everything here is safe code over atomics; `tests/loom_remote.rs` model-checks this file.

use crate::sync::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering, Queue};

/// Above this many references we abort, as `Arc` does: the count would otherwise wrap
/// and free an object that is still referenced.
const MAX_REFS: u32 = u32::MAX / 2;

/// Reference count of one buffer object.
pub(crate) struct RefCount(AtomicU32);

impl RefCount {
    pub(crate) fn new(n: u32) -> Self {
        RefCount(AtomicU32::new(n))
    }

    /// Marks a free object as held by one handle. The caller owns the object exclusively
    /// (it came off a free list), so no ordering is needed beyond what handed it over.
    pub(crate) fn init_one(&self) {
        self.0.store(1, Ordering::Relaxed);
    }

    /// One more handle. The caller already holds one, so the object cannot be freed
    /// concurrently (same reasoning as `Arc::clone`).
    pub(crate) fn acquire(&self) {
        let old = self.0.fetch_add(1, Ordering::Relaxed);
        if old > MAX_REFS {
            std::process::abort();
        }
    }

    /// Drops one handle; returns `true` when it was the last one. Then the caller owns
    /// the object and every access made through other handles happened before this return.
    ///
    /// AcqRel on the decrement rather than Release plus an Acquire fence on the last
    /// one: the same instruction on x86, and ThreadSanitizer understands it (it does not
    /// model fences, which std's `Arc` works around the same way).
    ///
    /// The caller's handle being the only one is the common case (a received frame, a
    /// sent segment once acknowledged): then no other handle exists that could clone or
    /// drop concurrently (cloning needs a handle), so the count is read and cleared
    /// without a locked read-modify-write. The Acquire load pairs with the other
    /// handles' AcqRel decrements exactly as the last `fetch_sub` would.
    pub(crate) fn release(&self) -> bool {
        if self.0.load(Ordering::Acquire) == 1 {
            self.0.store(0, Ordering::Relaxed);
            return true;
        }
        self.0.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// `true` when the caller's handle is the only one. Acquire pairs with the Release in
    /// [`RefCount::release`] so reads through the other (now dropped) handles are done.
    pub(crate) fn is_unique(&self) -> bool {
        self.0.load(Ordering::Acquire) == 1
    }

    /// Current count, for statistics only.
    pub(crate) fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The shared half of a per-core cache: ownership flag and the queue through which
/// other cores return objects whose home this is.
pub(crate) struct Home<T> {
    claimed: AtomicBool,
    queue: Queue<T>,
    remote_frees: AtomicU64,
}

impl<T> Home<T> {
    pub(crate) fn new() -> Self {
        Home {
            claimed: AtomicBool::new(false),
            queue: Queue::new(),
            remote_frees: AtomicU64::new(0),
        }
    }

    /// Becomes the owner; fails if another cache owns this home.
    pub(crate) fn try_claim(&self) -> bool {
        self.claimed
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    pub(crate) fn is_claimed(&self) -> bool {
        self.claimed.load(Ordering::Relaxed)
    }

    /// Takes every object returned so far (owner's side, or anyone's when unowned).
    pub(crate) fn drain(&self, mut f: impl FnMut(T)) -> usize {
        let mut n = 0;
        while let Some(item) = self.queue.pop() {
            f(item);
            n += 1;
        }
        n
    }

    /// The owner gives the home up; objects still queued go to `to_pool`.
    ///
    /// The swap and the read-modify-write in [`Home::push_remote`] are ordered on one
    /// location: either this swap reads the pusher's write (then the pusher's enqueue
    /// happened before our drain) or the pusher reads `false` and drains itself.
    pub(crate) fn unclaim(&self, to_pool: impl FnMut(T)) -> usize {
        self.claimed.swap(false, Ordering::AcqRel);
        self.drain(to_pool)
    }

    /// Returns `item` to this home from another core. If the home has no owner, the
    /// caller moves everything queued to `to_pool` so nothing is stranded.
    pub(crate) fn push_remote(&self, item: T, to_pool: impl FnMut(T)) {
        self.remote_frees.fetch_add(1, Ordering::Relaxed);
        self.queue.push(item);
        // A read-modify-write, not a load: it is ordered against `unclaim`'s swap.
        if !self.claimed.fetch_or(false, Ordering::AcqRel) {
            self.drain(to_pool);
        }
    }

    /// Objects returned to this home by other cores so far.
    pub(crate) fn remote_frees(&self) -> u64 {
        self.remote_frees.load(Ordering::Relaxed)
    }
}

/// Lifetime count of a slab: user handles, core caches, objects outside the shared
/// pools (counted in batches) and in-flight remote releases each hold references.
/// The slab's memory is unmapped when it drops to zero.
pub(crate) struct Refs(AtomicUsize);

impl Refs {
    pub(crate) fn new(n: usize) -> Self {
        Refs(AtomicUsize::new(n))
    }

    /// The caller holds a reference already, or holds an object counted here.
    pub(crate) fn acquire(&self, n: usize) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// Returns `true` when these were the last references: the caller must free the slab.
    pub(crate) fn release(&self, n: usize) -> bool {
        if n == 0 {
            return false;
        }
        // AcqRel for the same reason as `RefCount::release`.
        self.0.fetch_sub(n, Ordering::AcqRel) == n
    }

    #[allow(dead_code)] // used by tests and stats
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}
