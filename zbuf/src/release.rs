//! The end of an object's life: what dropping the last handle does, per [`Kind`]. This
//! is the one place that knows every owner of object memory (the heap, the slab's zones,
//! DPDK mbufs), so it sits above `obj` (the handles), `slab` and `dpdk`, and those do
//! not import each other.

use std::ptr::NonNull;

use crate::obj::{free_heap, Kind, ObjMeta, ObjPtr, SharedObj, UniqueObj};

impl Drop for SharedObj {
    fn drop(&mut self) {
        // SAFETY: a `SharedObj` owns one reference and gives it up here; the handle is
        // not used after `drop`.
        unsafe { release(self.meta_ptr()) }
    }
}

impl Drop for UniqueObj {
    fn drop(&mut self) {
        // SAFETY: a `UniqueObj` owns the only reference and gives it up here; the handle
        // is not used after `drop`.
        unsafe { release(self.meta_ptr()) }
    }
}

/// Drops one reference; frees or recycles the object when it was the last.
///
/// # Safety
/// `obj` is live and the caller owns one reference, which it must not use afterwards.
unsafe fn release(obj: NonNull<ObjMeta>) {
    // SAFETY: live per the contract.
    let meta = unsafe { obj.as_ref() };
    if !meta.refcnt.release() {
        return;
    }
    match meta.kind() {
        // SAFETY: a heap object whose last reference we just released; nobody uses it
        // after this.
        Kind::Heap => unsafe { free_heap(obj) },
        // SAFETY: last reference to a slab object; ownership passes to the slab.
        Kind::Slab => unsafe { crate::slab::recycle(ObjPtr(obj)) },
        // SAFETY: last reference to an mbuf-backed object (made by `SharedObj::init_mbuf`
        // in the mbuf's private area): the mbuf goes back to its pool.
        #[cfg(feature = "dpdk")]
        Kind::Mbuf => unsafe { crate::dpdk::release_mbuf_obj(obj) },
    }
}
