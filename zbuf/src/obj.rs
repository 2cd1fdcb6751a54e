//! Buffer objects: per-object metadata and the two owning handles built on it,
//! [`SharedObj`] (one counted reference, read-only) and [`UniqueObj`] (the only
//! reference, writable). The public handles are safe code on top of these.
//!
//! This layer knows what kinds of object exist but not the memory they come from:
//! dropping a handle is implemented in `release.rs`, above this module, the slab and the
//! DPDK glue, so that none of the three imports another.

use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use crate::remote::RefCount;
use crate::sync::{AtomicU32, Ordering};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// Lives in a slab zone; returned to its home core when released.
    Slab,
    /// A boxed [`HeapObj`]; freed when released.
    Heap,
    /// Metadata in the private area of a DPDK mbuf whose data buffer is the object;
    /// releasing frees the mbuf (`crate::dpdk`).
    #[cfg(feature = "dpdk")]
    Mbuf,
}

/// Out-of-band metadata of one object. Slab objects keep theirs in the zone's metadata
/// array (the payload stays fully usable and DMA-able); heap objects in a [`HeapObj`].
/// One cache line each so cores releasing neighbouring objects do not share a line.
#[repr(C, align(64))]
pub(crate) struct ObjMeta {
    pub(crate) refcnt: RefCount,
    /// Core slot of the cache that allocated the object (slab objects only). Written
    /// while the allocator owns the object exclusively, read by whoever releases it.
    pub(crate) home: AtomicU32,
    base: NonNull<u8>,
    iova: u64,
    cap: usize,
    pub(crate) index: u32,
    pub(crate) class: u8,
    kind: Kind,
    writable: bool,
    /// Slab objects: the slab's `Zone` that holds this metadata, set by the slab when it
    /// builds the zone and read back by it on release (untyped here so that this layer
    /// does not import the slab). Null for other kinds.
    pub(crate) owner: *const (),
}

// SAFETY: after construction every field is immutable except the atomics; the raw
// pointers are addresses of memory owned by the slab (or the HeapObj), which outlives
// every reference to the metadata.
unsafe impl Send for ObjMeta {}
// SAFETY: shared access only reads the fields that never change after construction, or
// goes through the atomics (`refcnt`, `home`).
unsafe impl Sync for ObjMeta {}

impl ObjMeta {
    /// Metadata of a free slab object (count 0) at `base`, in the zone `owner`.
    pub(crate) fn slab(
        owner: *const (),
        base: NonNull<u8>,
        iova: u64,
        cap: usize,
        index: u32,
        class: u8,
    ) -> Self {
        ObjMeta {
            refcnt: RefCount::new(0),
            home: AtomicU32::new(0),
            base,
            iova,
            cap,
            index,
            class,
            kind: Kind::Slab,
            writable: true,
            owner,
        }
    }

    /// Which kind of object this is: who takes it back after the last release.
    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }
}

/// Size of [`ObjMeta`]: what an mbuf's private area must hold for `Kind::Mbuf`.
#[cfg(feature = "dpdk")]
pub(crate) const META_SIZE: usize = std::mem::size_of::<ObjMeta>();
/// Alignment of [`ObjMeta`].
#[cfg(feature = "dpdk")]
pub(crate) const META_ALIGN: usize = std::mem::align_of::<ObjMeta>();

/// A raw pointer to slab object metadata, movable between threads (free lists, queues).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct ObjPtr(pub(crate) NonNull<ObjMeta>);

// SAFETY: `ObjMeta` is Sync; an `ObjPtr` is only a name for a free object, and whoever
// holds it in a free list or queue is its sole owner.
unsafe impl Send for ObjPtr {}

impl ObjPtr {
    pub(crate) fn meta(&self) -> &ObjMeta {
        // SAFETY: ObjPtrs point into zone metadata arrays, which live as long as the
        // slab, and the slab outlives every object held outside its pools (`Refs`).
        unsafe { self.0.as_ref() }
    }

    /// Hands the free object out as a writable buffer with one reference.
    ///
    /// # Safety
    /// The caller owns this free object exclusively (it came off a free list).
    pub(crate) unsafe fn into_unique(self, home: u32) -> UniqueObj {
        let m = self.meta();
        m.home.store(home, Ordering::Relaxed);
        m.refcnt.init_one();
        UniqueObj(self.0)
    }
}

enum Storage {
    /// Raw parts of a `Vec<u8>` whose pointer is `meta.base`.
    Vec { len: usize, cap: usize },
    /// Memory that lives forever.
    Static,
    /// Memory owned by someone else, given back through the callback.
    External(Option<Box<dyn FnOnce() + Send>>),
}

/// A heap-allocated object ([`Kind::Heap`]): metadata first (`repr(C)`) so `*mut HeapObj` and
/// `*mut ObjMeta` are the same address.
#[repr(C)]
struct HeapObj {
    meta: ObjMeta,
    storage: Storage,
}

impl Drop for HeapObj {
    fn drop(&mut self) {
        match &mut self.storage {
            Storage::Vec { len, cap } => {
                // SAFETY: base/len/cap are the raw parts taken from a Vec<u8> in
                // `from_vec`, which was never dropped; this is the only reconstruction.
                drop(unsafe { Vec::from_raw_parts(self.meta.base.as_ptr(), *len, *cap) });
            }
            Storage::Static => {}
            Storage::External(f) => {
                if let Some(f) = f.take() {
                    f()
                }
            }
        }
    }
}

fn heap(
    base: NonNull<u8>,
    cap: usize,
    iova: u64,
    writable: bool,
    storage: Storage,
) -> NonNull<ObjMeta> {
    let obj = Box::new(HeapObj {
        meta: ObjMeta {
            refcnt: RefCount::new(1),
            home: AtomicU32::new(0),
            base,
            iova,
            cap,
            index: 0,
            class: 0,
            kind: Kind::Heap,
            writable,
            owner: std::ptr::null(),
        },
        storage,
    });
    // `meta` is the first field of a repr(C) struct.
    NonNull::from(Box::leak(obj)).cast::<ObjMeta>()
}

/// Frees a [`Kind::Heap`] object whose last reference was just released.
///
/// # Safety
/// `obj` is a heap object (made by `heap`, so it is the first field of a leaked
/// `Box<HeapObj>`), its count just dropped to zero, and nobody uses it afterwards.
pub(crate) unsafe fn free_heap(obj: NonNull<ObjMeta>) {
    // SAFETY: per the contract this rebuilds the Box that `heap` leaked, once.
    drop(unsafe { Box::from_raw(obj.as_ptr().cast::<HeapObj>()) })
}

/// One counted reference to an object; the bytes are read-only while shared.
pub(crate) struct SharedObj(NonNull<ObjMeta>);

// SAFETY: the count is atomic, the bytes are never written while a SharedObj exists
// (writes need a UniqueObj, which only exists when the count is 1 and it is the handle),
// and releasing on any thread is supported (remote free).
unsafe impl Send for SharedObj {}
// SAFETY: `&SharedObj` only reads immutable bytes and metadata.
unsafe impl Sync for SharedObj {}

/// The only reference to an object; the bytes may be written.
pub(crate) struct UniqueObj(NonNull<ObjMeta>);

// SAFETY: unique ownership of plain bytes; releasing on any thread is supported.
unsafe impl Send for UniqueObj {}
// SAFETY: `&UniqueObj` only gives shared reads.
unsafe impl Sync for UniqueObj {}

impl SharedObj {
    fn meta(&self) -> &ObjMeta {
        // SAFETY: we hold a reference, so the object (and its metadata) is live.
        unsafe { self.0.as_ref() }
    }

    /// The metadata this handle counts a reference on.
    pub(crate) fn meta_ptr(&self) -> NonNull<ObjMeta> {
        self.0
    }

    /// Wraps a `'static` slice without copying.
    pub(crate) fn from_static(bytes: &'static [u8]) -> Self {
        let base = NonNull::from(bytes).cast::<u8>();
        SharedObj(heap(
            base,
            bytes.len(),
            base.as_ptr() as u64,
            false,
            Storage::Static,
        ))
    }

    /// Starts a `Kind::Mbuf` object: writes fresh metadata (count 1) at `meta`, which
    /// is the private area of an mbuf whose data buffer is `base..base+cap`.
    ///
    /// # Safety
    /// `meta` is valid for writing an `ObjMeta`, aligned, and not in use by any live
    /// handle; the mbuf is owned by the caller, who hands that ownership to the
    /// returned reference (released by `crate::dpdk::release_mbuf_obj`). `base..base+cap`
    /// is initialized, readable memory that nobody else writes while the object lives;
    /// when `writable`, a unique handle may also write it.
    #[cfg(feature = "dpdk")]
    pub(crate) unsafe fn init_mbuf(
        meta: NonNull<ObjMeta>,
        base: NonNull<u8>,
        cap: usize,
        iova: u64,
        writable: bool,
    ) -> SharedObj {
        // SAFETY: per the contract the slot is ours to overwrite; ObjMeta has no Drop.
        unsafe {
            meta.as_ptr().write(ObjMeta {
                refcnt: RefCount::new(1),
                home: AtomicU32::new(0),
                base,
                iova,
                cap,
                index: 0,
                class: 0,
                kind: Kind::Mbuf,
                writable,
                owner: std::ptr::null(),
            })
        };
        SharedObj(meta)
    }

    /// Wraps memory owned elsewhere.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be initialized, readable, not written by anyone, and stay so
    /// until `free` runs (on whatever thread drops the last reference).
    pub(crate) unsafe fn from_external(
        ptr: NonNull<u8>,
        len: usize,
        iova: u64,
        free: Box<dyn FnOnce() + Send>,
    ) -> Self {
        SharedObj(heap(ptr, len, iova, false, Storage::External(Some(free))))
    }

    pub(crate) fn cap(&self) -> usize {
        self.meta().cap
    }

    /// Bytes `off..off+len` of the object.
    pub(crate) fn bytes(&self, off: usize, len: usize) -> &[u8] {
        let m = self.meta();
        assert!(
            off <= m.cap && len <= m.cap - off,
            "zbuf: view outside its object"
        );
        // SAFETY: in bounds (checked); the object is live while `self` is; nobody writes
        // it while shared; bytes of zones and heap objects are initialized.
        unsafe { std::slice::from_raw_parts(m.base.as_ptr().add(off), len) }
    }

    /// Address of byte `off`, as seen by a device.
    pub(crate) fn iova(&self, off: usize) -> u64 {
        self.meta().iova.wrapping_add(off as u64)
    }

    /// Virtual address of byte `off`.
    pub(crate) fn addr(&self, off: usize) -> usize {
        self.meta().base.as_ptr() as usize + off
    }

    pub(crate) fn ptr_eq(&self, other: &SharedObj) -> bool {
        self.0 == other.0
    }

    pub(crate) fn ref_count(&self) -> usize {
        self.meta().refcnt.get() as usize
    }

    /// Becomes unique if this is the only reference to a writable object.
    pub(crate) fn try_unique(self) -> Result<UniqueObj, SharedObj> {
        let m = self.meta();
        if m.writable && m.refcnt.is_unique() {
            let this = ManuallyDrop::new(self);
            Ok(UniqueObj(this.0))
        } else {
            Err(self)
        }
    }
}

impl Clone for SharedObj {
    fn clone(&self) -> Self {
        self.meta().refcnt.acquire();
        SharedObj(self.0)
    }
}

impl UniqueObj {
    fn meta(&self) -> &ObjMeta {
        // SAFETY: we hold the only reference, so the object is live.
        unsafe { self.0.as_ref() }
    }

    /// The metadata this handle holds the only reference on.
    pub(crate) fn meta_ptr(&self) -> NonNull<ObjMeta> {
        self.0
    }

    /// Takes a `Vec<u8>` without copying; its length becomes the capacity.
    pub(crate) fn from_vec(mut v: Vec<u8>) -> Self {
        let len = v.len();
        let cap = v.capacity();
        // `as_mut_ptr` is non-null (dangling for an empty Vec, never dereferenced then).
        let base = NonNull::new(v.as_mut_ptr()).unwrap_or(NonNull::dangling());
        std::mem::forget(v);
        UniqueObj(heap(
            base,
            len,
            base.as_ptr() as u64,
            true,
            Storage::Vec { len, cap },
        ))
    }

    pub(crate) fn cap(&self) -> usize {
        self.meta().cap
    }

    pub(crate) fn bytes(&self, off: usize, len: usize) -> &[u8] {
        let m = self.meta();
        assert!(
            off <= m.cap && len <= m.cap - off,
            "zbuf: view outside its object"
        );
        // SAFETY: in bounds (checked), live, initialized; `&self` excludes writers.
        unsafe { std::slice::from_raw_parts(m.base.as_ptr().add(off), len) }
    }

    pub(crate) fn bytes_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        let m = self.meta();
        assert!(
            off <= m.cap && len <= m.cap - off,
            "zbuf: view outside its object"
        );
        debug_assert!(m.writable);
        // SAFETY: in bounds, live, initialized; this is the only handle to the object
        // (count 1, writable) and `&mut self` excludes other borrows of it.
        unsafe { std::slice::from_raw_parts_mut(m.base.as_ptr().add(off), len) }
    }

    pub(crate) fn iova(&self, off: usize) -> u64 {
        self.meta().iova.wrapping_add(off as u64)
    }

    pub(crate) fn into_shared(self) -> SharedObj {
        let this = ManuallyDrop::new(self);
        SharedObj(this.0)
    }
}
