//! Per-core caches: the allocation fast path on top of the slab, and the functions that
//! allocate from the calling thread's current cache. The thread-local registration
//! itself lives in `slab.rs`, which reads it when an object is released.

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::error::{AllocError, SlabError};
use crate::slab::{clear_current, current_slot, set_current_if_none, CoreStats, Slab, SlabInner};
use crate::zbuf_mut::ZbufMut;

/// A core's allocation cache: the fast path of the slab.
///
/// Allocation pops from a free list only this core touches, and buffers released on this
/// core go straight back to it; buffers released on other cores come home through a
/// lock-free queue that this cache drains when its list runs dry (or on
/// [`CoreCache::drain_remote`]). No shared cache line is written on the fast path.
///
/// `CoreCache` is neither `Send` nor `Sync`: its free lists are unsynchronized and tied
/// to the thread that registered it.
///
/// ```compile_fail,E0277
/// use zbuf::{HugepageMode, Slab, SlabConfig};
/// let slab = Slab::new(SlabConfig::new().hugepages(HugepageMode::Never)).unwrap();
/// let cache = slab.core_cache(0).unwrap();
/// std::thread::spawn(move || drop(cache)); // error: `CoreCache` cannot be sent
/// ```
pub struct CoreCache {
    inner: NonNull<SlabInner>,
    core: usize,
    _not_send: PhantomData<*const ()>,
}

impl CoreCache {
    pub(crate) fn new(slab: &Slab, core: usize) -> Result<CoreCache, SlabError> {
        let inner = slab.inner();
        if core >= inner.max_cores() {
            return Err(SlabError::CoreOutOfRange {
                core,
                max: inner.max_cores(),
            });
        }
        if !inner.claim_slot(core) {
            return Err(SlabError::CoreTaken(core));
        }
        inner.acquire_ref();
        set_current_if_none(slab.inner_ptr(), core);
        Ok(CoreCache {
            inner: slab.inner_ptr(),
            core,
            _not_send: PhantomData,
        })
    }

    fn inner(&self) -> &SlabInner {
        // SAFETY: the cache holds a slab reference (taken in `new`, given up in `drop`),
        // so the `SlabInner` is not freed while `self` lives.
        unsafe { self.inner.as_ref() }
    }

    /// `true` if this is the calling thread's current cache (the first one registered
    /// on it and still alive): [`crate::alloc`] uses it, and buffers of this core
    /// released on this thread skip the return queue.
    pub fn is_current(&self) -> bool {
        current_slot() == Some((self.inner, self.core))
    }

    /// The core id this cache owns.
    pub fn core(&self) -> usize {
        self.core
    }

    /// A handle to the slab.
    pub fn slab(&self) -> Slab {
        self.inner().acquire_ref();
        // SAFETY: live, and the reference just taken goes to the handle.
        unsafe { Slab::from_inner(self.inner) }
    }

    /// A writable buffer with the slab's default headroom, an empty body and at least
    /// `len` bytes of tailroom, from the smallest class that fits headroom + `len`.
    /// The bytes in head- and tailroom are not cleared.
    pub fn alloc(&self, len: usize) -> Result<ZbufMut, AllocError> {
        self.alloc_with_headroom(self.inner().headroom(), len)
    }

    /// As [`CoreCache::alloc`] with an explicit headroom.
    pub fn alloc_with_headroom(&self, headroom: usize, len: usize) -> Result<ZbufMut, AllocError> {
        // SAFETY: this thread owns slot `core` (the cache is !Send and alive).
        let obj = unsafe { self.inner().alloc(self.core, headroom, len)? };
        Ok(ZbufMut::from_unique(obj, headroom))
    }

    /// Takes in the buffers other cores released to this one; returns how many. Allocation
    /// does this by itself when the local list is empty; a poll loop may call it too.
    pub fn drain_remote(&self) -> usize {
        // SAFETY: this thread owns slot `core`.
        unsafe { self.inner().drain_home(self.core) }
    }

    /// This core's counters.
    pub fn stats(&self) -> CoreStats {
        self.inner().core_stats_of(self.core)
    }
}

impl Slab {
    /// Claims core id `core` for the calling thread and returns its cache. The first
    /// cache registered on a thread becomes its *current* cache, used by [`crate::alloc`]
    /// and by releases on this thread (a thread may hold more caches, e.g. of several
    /// slabs; those work through their own methods). Fails if the core id is out of
    /// range or owned by another live cache.
    pub fn core_cache(&self, core: usize) -> Result<CoreCache, SlabError> {
        CoreCache::new(self, core)
    }
}

impl Drop for CoreCache {
    fn drop(&mut self) {
        clear_current(self.inner, self.core);
        // SAFETY: this thread owns the slot and stops using it now.
        unsafe { self.inner().release_slot(self.core) };
        // SAFETY: the cache's reference is given up here.
        unsafe { SlabInner::release_ref(self.inner) };
    }
}

impl fmt::Debug for CoreCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoreCache")
            .field("core", &self.core)
            .finish()
    }
}

/// Allocates from the calling thread's cache (see [`CoreCache::alloc`]), like heap memory:
/// works on any thread that registered a cache with [`Slab::core_cache`], and returns
/// [`AllocError::NoCache`] elsewhere.
pub fn alloc(len: usize) -> Result<ZbufMut, AllocError> {
    let (inner, _) = current_slot().ok_or(AllocError::NoCache)?;
    // SAFETY: the current slot is set only while this thread's CoreCache is alive, and
    // that cache holds a slab reference.
    let headroom = unsafe { inner.as_ref() }.headroom();
    alloc_with_headroom(headroom, len)
}

/// As [`alloc`] with an explicit headroom.
pub fn alloc_with_headroom(headroom: usize, len: usize) -> Result<ZbufMut, AllocError> {
    let (inner, core) = current_slot().ok_or(AllocError::NoCache)?;
    // SAFETY: the current slot is set only while this thread's CoreCache for it is
    // alive, so the slab is live and this thread owns slot `core`.
    let obj = unsafe { inner.as_ref().alloc(core, headroom, len)? };
    Ok(ZbufMut::from_unique(obj, headroom))
}

/// The core id of the calling thread's cache, if it has one.
pub fn current_core() -> Option<usize> {
    current_slot().map(|(_, core)| core)
}
