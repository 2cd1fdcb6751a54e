//! [`Zbuf`]: a shared, read-only view of a buffer object.
// The only unsafe here is `from_external`, whose contract is the caller's to keep.
#![deny(unsafe_code)]

use std::fmt;
use std::ops::{Deref, RangeBounds};
use std::ptr::NonNull;

use crate::error::{check_pos, resolve_range, OutOfBounds};
use crate::obj::{SharedObj, UniqueObj};
use crate::stats::count_copy;

/// A read-only view `(object, offset, len)` of a refcounted buffer object.
///
/// * `Clone` adds a reference; no byte is copied. The object is recycled when the last
///   `Zbuf`/`ZbufMut` referring to it is dropped.
/// * `Send + Sync`: the reference count is atomic and the bytes are immutable while
///   shared. Dropping the last reference on another core returns the object to its home
///   core through a lock-free queue.
/// * Positions and ranges out of bounds are programmer errors and **panic** with a
///   message, as slice indexing does; every such method has a `try_` variant returning
///   [`OutOfBounds`] instead. `truncate` never panics (like `Vec::truncate`).
///
/// A `Zbuf` cannot be written through:
///
/// ```compile_fail,E0594
/// let z = zbuf::Zbuf::copy_from_slice(b"abc");
/// z[0] = b'x'; // error: cannot assign through `Deref`
/// ```
///
/// and a borrow of its bytes cannot outlive it (so the object cannot be recycled under a
/// reader):
///
/// ```compile_fail,E0597
/// let s: &[u8];
/// {
///     let z = zbuf::Zbuf::copy_from_slice(b"abc");
///     s = &z[..]; // error: `z` does not live long enough
/// }
/// assert_eq!(s[0], b'a');
/// ```
///
/// Releasing twice is impossible, the handle is moved by the first drop:
///
/// ```compile_fail,E0382
/// let z = zbuf::Zbuf::copy_from_slice(b"abc");
/// drop(z);
/// drop(z); // error: use of moved value
/// ```
pub struct Zbuf {
    obj: SharedObj,
    off: usize,
    len: usize,
}

impl Zbuf {
    pub(crate) fn from_parts(obj: SharedObj, off: usize, len: usize) -> Zbuf {
        debug_assert!(off + len <= obj.cap());
        Zbuf { obj, off, len }
    }

    /// The object, offset and length of the view (`from_parts` undone).
    pub(crate) fn into_parts(self) -> (SharedObj, usize, usize) {
        let Zbuf { obj, off, len } = self;
        (obj, off, len)
    }

    /// Copies `data` into a new heap-backed buffer. Always works, without any slab or
    /// registration: this is the slow/test path, and it is counted in
    /// [`crate::copy_stats`].
    pub fn copy_from_slice(data: &[u8]) -> Zbuf {
        count_copy(data.len());
        Zbuf::from_vec(data.to_vec())
    }

    /// Takes a `Vec<u8>` without copying (heap-backed; IOVA is the virtual address).
    pub fn from_vec(v: Vec<u8>) -> Zbuf {
        let len = v.len();
        Zbuf::from_parts(UniqueObj::from_vec(v).into_shared(), 0, len)
    }

    /// Wraps a `'static` slice without copying.
    pub fn from_static(bytes: &'static [u8]) -> Zbuf {
        Zbuf::from_parts(SharedObj::from_static(bytes), 0, bytes.len())
    }

    /// Wraps memory owned elsewhere (for example a DPDK mbuf's data room); `free` runs
    /// once, on the thread that drops the last reference. The buffer is never writable
    /// through zbuf ([`Zbuf::try_into_mut`] refuses it).
    ///
    /// # Safety
    /// `ptr..ptr+len` must be initialized and readable, must not be written by anyone,
    /// and must stay valid until `free` is called. `free` must be callable on any thread.
    #[allow(unsafe_code)]
    pub unsafe fn from_external(
        ptr: NonNull<u8>,
        len: usize,
        iova: u64,
        free: impl FnOnce() + Send + 'static,
    ) -> Zbuf {
        // SAFETY: our caller keeps the same contract `SharedObj::from_external` asks
        // (readable, unwritten, valid until `free`); `free` is `Send`, so any thread may
        // run it.
        let obj = unsafe { SharedObj::from_external(ptr, len, iova, Box::new(free)) };
        Zbuf::from_parts(obj, 0, len)
    }

    /// Length of the view in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` if the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes of the whole object behind the view: a slab object's class size, a
    /// DPDK mbuf's data room, a heap buffer's length. Holding any view, however short,
    /// keeps all of it out of its pool, so this is what a receiver must account for a
    /// held slice (Linux's `truesize`, less the metadata). One load from the object's
    /// metadata.
    #[inline]
    pub fn object_size(&self) -> usize {
        self.obj.cap()
    }

    /// The bytes (same as deref).
    pub fn as_slice(&self) -> &[u8] {
        self.obj.bytes(self.off, self.len)
    }

    /// IOVA (device-visible address) of the first byte.
    pub fn iova(&self) -> u64 {
        self.obj.iova(self.off)
    }

    /// Virtual address of the first byte.
    pub fn addr(&self) -> usize {
        self.obj.addr(self.off)
    }

    /// A new view of `range` of this one (one more reference, no copy).
    ///
    /// # Panics
    /// If the range is out of bounds or decreasing.
    #[track_caller]
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Zbuf {
        self.try_slice(range)
            .unwrap_or_else(|e| panic!("Zbuf::slice: {e}"))
    }

    /// Checked [`Zbuf::slice`].
    pub fn try_slice(&self, range: impl RangeBounds<usize>) -> Result<Zbuf, OutOfBounds> {
        let (s, e) = resolve_range(range, self.len)?;
        Ok(Zbuf {
            obj: self.obj.clone(),
            off: self.off + s,
            len: e - s,
        })
    }

    /// Splits off and returns `[0, at)`; `self` keeps `[at, len)`.
    ///
    /// # Panics
    /// If `at > len`.
    #[track_caller]
    pub fn split_to(&mut self, at: usize) -> Zbuf {
        self.try_split_to(at)
            .unwrap_or_else(|e| panic!("Zbuf::split_to: {e}"))
    }

    /// Checked [`Zbuf::split_to`].
    pub fn try_split_to(&mut self, at: usize) -> Result<Zbuf, OutOfBounds> {
        check_pos(at, self.len)?;
        let head = Zbuf {
            obj: self.obj.clone(),
            off: self.off,
            len: at,
        };
        self.off += at;
        self.len -= at;
        Ok(head)
    }

    /// Splits off and returns `[at, len)`; `self` keeps `[0, at)`.
    ///
    /// # Panics
    /// If `at > len`.
    #[track_caller]
    pub fn split_off(&mut self, at: usize) -> Zbuf {
        self.try_split_off(at)
            .unwrap_or_else(|e| panic!("Zbuf::split_off: {e}"))
    }

    /// Checked [`Zbuf::split_off`].
    pub fn try_split_off(&mut self, at: usize) -> Result<Zbuf, OutOfBounds> {
        check_pos(at, self.len)?;
        let tail = Zbuf {
            obj: self.obj.clone(),
            off: self.off + at,
            len: self.len - at,
        };
        self.len = at;
        Ok(tail)
    }

    /// Drops the first `n` bytes from the view.
    ///
    /// # Panics
    /// If `n > len`.
    #[track_caller]
    pub fn advance(&mut self, n: usize) {
        self.try_advance(n)
            .unwrap_or_else(|e| panic!("Zbuf::advance: {e}"))
    }

    /// Checked [`Zbuf::advance`].
    pub fn try_advance(&mut self, n: usize) -> Result<(), OutOfBounds> {
        check_pos(n, self.len)?;
        self.off += n;
        self.len -= n;
        Ok(())
    }

    /// Keeps the first `n` bytes; no effect if `n >= len`.
    pub fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
    }

    /// Extends `self` with `other` if `other` starts right where `self` ends in the same
    /// object (undoes a split without copying); gives `other` back otherwise.
    pub fn try_unsplit(&mut self, other: Zbuf) -> Result<(), Zbuf> {
        if self.obj.ptr_eq(&other.obj) && self.off + self.len == other.off {
            self.len += other.len;
            Ok(())
        } else {
            Err(other)
        }
    }

    /// `true` if both views refer to the same object.
    pub fn same_object(&self, other: &Zbuf) -> bool {
        self.obj.ptr_eq(&other.obj)
    }

    /// References to the object right now (`Zbuf`s and `ZbufMut` together); racy,
    /// for tests and diagnostics.
    pub fn ref_count(&self) -> usize {
        self.obj.ref_count()
    }
}

impl Clone for Zbuf {
    fn clone(&self) -> Self {
        Zbuf {
            obj: self.obj.clone(),
            off: self.off,
            len: self.len,
        }
    }
}

impl Deref for Zbuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for Zbuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl PartialEq for Zbuf {
    fn eq(&self, other: &Zbuf) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Zbuf {}

impl PartialEq<[u8]> for Zbuf {
    fn eq(&self, other: &[u8]) -> bool {
        self.as_slice() == other
    }
}

impl fmt::Debug for Zbuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = &self.as_slice()[..self.len.min(16)];
        f.debug_struct("Zbuf")
            .field("len", &self.len)
            .field("iova", &format_args!("{:#x}", self.iova()))
            .field("head", &format_args!("{shown:02x?}"))
            .finish()
    }
}

impl From<Vec<u8>> for Zbuf {
    fn from(v: Vec<u8>) -> Zbuf {
        Zbuf::from_vec(v)
    }
}

impl From<&'static [u8]> for Zbuf {
    fn from(s: &'static [u8]) -> Zbuf {
        Zbuf::from_static(s)
    }
}
