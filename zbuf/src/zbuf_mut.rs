//! [`ZbufMut`]: a unique, writable buffer with headroom, body and tailroom.
#![forbid(unsafe_code)]

use std::fmt;
use std::ops::{Deref, DerefMut};

use crate::error::{check_pos, NoRoom, OutOfBounds};
use crate::obj::UniqueObj;
use crate::stats::count_copy;
use crate::zbuf::Zbuf;

/// The only reference to a buffer object, laid out like an mbuf:
///
/// ```text
/// |<- headroom ->|<---- body (len) ---->|<- tailroom ->|
/// 0             head               head+len           capacity
/// ```
///
/// Deref gives the body. [`ZbufMut::prepend`] grows the body into the headroom (protocol
/// headers), [`ZbufMut::append`]/[`ZbufMut::extend_from_slice`] into the tailroom;
/// neither ever reallocates. [`ZbufMut::freeze`] turns it into a shareable [`Zbuf`]
/// without copying. `Send + Sync` (it owns its object exclusively).
///
/// Bytes in head- and tailroom of a slab buffer have unspecified (previously used)
/// contents: `prepend`/`append` hand them out for the caller to overwrite.
///
/// After `freeze` the `ZbufMut` is gone, so the bytes cannot change under readers:
///
/// ```compile_fail,E0382
/// let mut m = zbuf::ZbufMut::heap(16, 64);
/// m.extend_from_slice(b"abc").unwrap();
/// let z = m.freeze();
/// m[0] = b'x'; // error: borrow of moved value `m`
/// # drop(z);
/// ```
///
/// and it cannot be duplicated:
///
/// ```compile_fail,E0599
/// let m = zbuf::ZbufMut::heap(16, 64);
/// let n = m.clone(); // error: no method `clone`
/// ```
pub struct ZbufMut {
    obj: UniqueObj,
    head: usize,
    len: usize,
}

impl ZbufMut {
    pub(crate) fn from_unique(obj: UniqueObj, headroom: usize) -> ZbufMut {
        ZbufMut::from_parts(obj, headroom, 0)
    }

    pub(crate) fn from_parts(obj: UniqueObj, head: usize, len: usize) -> ZbufMut {
        debug_assert!(head + len <= obj.cap());
        ZbufMut { obj, head, len }
    }

    /// A heap-backed buffer with `headroom` bytes of headroom, an empty body and
    /// `capacity` bytes of tailroom (all zeroed). For tests and slow paths; needs no slab.
    ///
    /// # Panics
    /// Like `vec![0; n]`, if the heap cannot provide `headroom + capacity` bytes.
    pub fn heap(headroom: usize, capacity: usize) -> ZbufMut {
        let total = headroom.saturating_add(capacity);
        ZbufMut::from_parts(UniqueObj::from_vec(vec![0; total]), headroom, 0)
    }

    /// Takes a `Vec<u8>` without copying: the body is the vector's bytes, no headroom,
    /// no tailroom.
    pub fn from_vec(v: Vec<u8>) -> ZbufMut {
        let len = v.len();
        ZbufMut::from_parts(UniqueObj::from_vec(v), 0, len)
    }

    /// Body length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` if the body is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Free bytes in front of the body.
    pub fn headroom(&self) -> usize {
        self.head
    }

    /// Free bytes after the body.
    pub fn tailroom(&self) -> usize {
        self.obj.cap() - self.head - self.len
    }

    /// Size of the whole object (headroom + body + tailroom).
    pub fn capacity(&self) -> usize {
        self.obj.cap()
    }

    /// IOVA of the first body byte.
    pub fn iova(&self) -> u64 {
        self.obj.iova(self.head)
    }

    /// Grows the body by `n` bytes at the front (into the headroom) and returns them.
    pub fn prepend(&mut self, n: usize) -> Result<&mut [u8], NoRoom> {
        if n > self.head {
            return Err(NoRoom {
                requested: n,
                available: self.head,
            });
        }
        self.head -= n;
        self.len += n;
        Ok(self.obj.bytes_mut(self.head, n))
    }

    /// Grows the body by `n` bytes at the end (into the tailroom) and returns them.
    pub fn append(&mut self, n: usize) -> Result<&mut [u8], NoRoom> {
        let room = self.tailroom();
        if n > room {
            return Err(NoRoom {
                requested: n,
                available: room,
            });
        }
        let at = self.head + self.len;
        self.len += n;
        Ok(self.obj.bytes_mut(at, n))
    }

    /// Copies `data` to the end of the body (counted in [`crate::copy_stats`]).
    pub fn extend_from_slice(&mut self, data: &[u8]) -> Result<(), NoRoom> {
        self.append(data.len())?.copy_from_slice(data);
        count_copy(data.len());
        Ok(())
    }

    /// Moves the start of the body forward by `n` bytes (they become headroom),
    /// e.g. to strip a parsed header.
    ///
    /// # Panics
    /// If `n > len`.
    #[track_caller]
    pub fn advance(&mut self, n: usize) {
        self.try_advance(n)
            .unwrap_or_else(|e| panic!("ZbufMut::advance: {e}"))
    }

    /// Checked [`ZbufMut::advance`].
    pub fn try_advance(&mut self, n: usize) -> Result<(), OutOfBounds> {
        check_pos(n, self.len)?;
        self.head += n;
        self.len -= n;
        Ok(())
    }

    /// Keeps the first `n` body bytes (the rest becomes tailroom); no effect if `n >= len`.
    pub fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
    }

    /// Empties the body, keeping the headroom where it is.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Makes the buffer shareable: a [`Zbuf`] over the body, no copy.
    pub fn freeze(self) -> Zbuf {
        let ZbufMut { obj, head, len } = self;
        Zbuf::from_parts(obj.into_shared(), head, len)
    }
}

// The way back from `freeze` lives here too, so both conversions between the two handles
// are in one file and `zbuf.rs` does not import this one.
impl Zbuf {
    /// Turns the view back into a writable buffer if it is the only reference to a
    /// writable object (slab or `Vec` backed). Head- and tailroom are the bytes of the
    /// object before and after the view. Gives `self` back otherwise.
    pub fn try_into_mut(self) -> Result<ZbufMut, Zbuf> {
        let (obj, off, len) = self.into_parts();
        match obj.try_unique() {
            Ok(u) => Ok(ZbufMut::from_parts(u, off, len)),
            Err(obj) => Err(Zbuf::from_parts(obj, off, len)),
        }
    }
}

impl Deref for ZbufMut {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.obj.bytes(self.head, self.len)
    }
}

impl DerefMut for ZbufMut {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.obj.bytes_mut(self.head, self.len)
    }
}

impl AsRef<[u8]> for ZbufMut {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsMut<[u8]> for ZbufMut {
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl fmt::Debug for ZbufMut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZbufMut")
            .field("headroom", &self.head)
            .field("len", &self.len)
            .field("tailroom", &self.tailroom())
            .finish()
    }
}
