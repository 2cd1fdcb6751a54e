//! [`IoVec`]: a scatter-gather list of [`Zbuf`]s.
#![forbid(unsafe_code)]

use std::fmt;
use std::ops::RangeBounds;

use smallvec::SmallVec;

use crate::error::{check_pos, resolve_range, OutOfBounds};
use crate::stats::count_copy;
use crate::zbuf::Zbuf;

/// Segments stored inline before spilling to the heap.
const INLINE: usize = 4;

/// A byte sequence made of [`Zbuf`] segments, sliced and split without copying.
///
/// Invariant: no segment is empty (empty pushes are ignored), and a pushed segment that
/// continues the last one in the same object is merged into it. Up to four segments are
/// stored inline. `Send + Sync`, like `Zbuf`.
///
/// Bounds follow [`Zbuf`]: out-of-range positions panic, `try_` variants return
/// [`OutOfBounds`], `truncate` never panics. Only [`IoVec::copy_to_slice`] and
/// [`IoVec::to_vec`] copy bytes (counted in [`crate::copy_stats`]).
#[derive(Clone, Default)]
pub struct IoVec {
    segs: SmallVec<[Zbuf; INLINE]>,
    len: usize,
}

impl IoVec {
    /// An empty io-vector.
    pub fn new() -> IoVec {
        IoVec::default()
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` if there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The segments, in order, none empty.
    pub fn segments(&self) -> &[Zbuf] {
        &self.segs
    }

    /// Number of segments.
    pub fn num_segments(&self) -> usize {
        self.segs.len()
    }

    /// The bytes, one slice per segment.
    pub fn chunks(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.segs.iter().map(|z| z.as_slice())
    }

    /// Appends a segment (no copy).
    pub fn push(&mut self, z: Zbuf) {
        if z.is_empty() {
            return;
        }
        self.len += z.len();
        let z = match self.segs.last_mut() {
            Some(last) => match last.try_unsplit(z) {
                Ok(()) => return,
                Err(z) => z,
            },
            None => z,
        };
        self.segs.push(z);
    }

    /// Appends all of `other` (concatenation, no copy).
    pub fn append(&mut self, other: IoVec) {
        for z in other.segs {
            self.push(z);
        }
    }

    /// Splits off and returns `[0, n)`; `self` keeps `[n, len)`.
    ///
    /// # Panics
    /// If `n > len`.
    #[track_caller]
    pub fn split_to(&mut self, n: usize) -> IoVec {
        self.try_split_to(n)
            .unwrap_or_else(|e| panic!("IoVec::split_to: {e}"))
    }

    /// Checked [`IoVec::split_to`].
    pub fn try_split_to(&mut self, n: usize) -> Result<IoVec, OutOfBounds> {
        check_pos(n, self.len)?;
        if n == self.len {
            // All of it (a framer's buffer holding exactly one message): a move, not a
            // drain of every segment into a new vector.
            return Ok(core::mem::take(self));
        }
        let (whole, part) = self.locate(n);
        // (No drain when no whole segment moves: the common cut inside the first one.)
        let mut head = IoVec::new();
        if whole > 0 {
            head.segs = self.segs.drain(..whole).collect();
        }
        if part > 0 {
            head.segs.push(self.segs[0].split_to(part));
        }
        head.len = n;
        self.len -= n;
        Ok(head)
    }

    /// Splits off and returns `[n, len)`; `self` keeps `[0, n)`.
    ///
    /// # Panics
    /// If `n > len`.
    #[track_caller]
    pub fn split_off(&mut self, n: usize) -> IoVec {
        self.try_split_off(n)
            .unwrap_or_else(|e| panic!("IoVec::split_off: {e}"))
    }

    /// Checked [`IoVec::split_off`].
    pub fn try_split_off(&mut self, n: usize) -> Result<IoVec, OutOfBounds> {
        check_pos(n, self.len)?;
        let (whole, part) = self.locate(n);
        let mut tail = IoVec::new();
        if part > 0 {
            tail.segs.push(self.segs[whole].split_off(part));
            // (No drain when the cut is in the last segment.)
            if whole + 1 < self.segs.len() {
                tail.segs.extend(self.segs.drain(whole + 1..));
            }
        } else {
            tail.segs.extend(self.segs.drain(whole..));
        }
        tail.len = self.len - n;
        self.len = n;
        Ok(tail)
    }

    /// Drops the first `n` bytes.
    ///
    /// # Panics
    /// If `n > len`.
    #[track_caller]
    pub fn advance(&mut self, n: usize) {
        self.try_advance(n)
            .unwrap_or_else(|e| panic!("IoVec::advance: {e}"))
    }

    /// Checked [`IoVec::advance`].
    pub fn try_advance(&mut self, n: usize) -> Result<(), OutOfBounds> {
        check_pos(n, self.len)?;
        let (whole, part) = self.locate(n);
        self.segs.drain(..whole);
        if part > 0 {
            self.segs[0].advance(part);
        }
        self.len -= n;
        Ok(())
    }

    /// Keeps the first `n` bytes; no effect if `n >= len`.
    pub fn truncate(&mut self, n: usize) {
        if n >= self.len {
            return;
        }
        let (whole, part) = self.locate(n);
        if part > 0 {
            self.segs[whole].truncate(part);
            self.segs.truncate(whole + 1);
        } else {
            self.segs.truncate(whole);
        }
        self.len = n;
    }

    /// A new io-vector over `range` (references, no copy).
    ///
    /// # Panics
    /// If the range is out of bounds or decreasing.
    #[track_caller]
    pub fn slice(&self, range: impl RangeBounds<usize>) -> IoVec {
        self.try_slice(range)
            .unwrap_or_else(|e| panic!("IoVec::slice: {e}"))
    }

    /// Checked [`IoVec::slice`].
    pub fn try_slice(&self, range: impl RangeBounds<usize>) -> Result<IoVec, OutOfBounds> {
        let (start, end) = resolve_range(range, self.len)?;
        let mut out = IoVec::new();
        let mut pos = 0;
        for z in &self.segs {
            let (s, e) = (pos, pos + z.len());
            pos = e;
            if e <= start {
                continue;
            }
            if s >= end {
                break;
            }
            let from = start.saturating_sub(s);
            let to = end.min(e) - s;
            out.push(z.slice(from..to));
        }
        Ok(out)
    }

    /// Copies the first `min(len, dst.len())` bytes into `dst`; returns how many.
    pub fn copy_to_slice(&self, dst: &mut [u8]) -> usize {
        let mut done = 0;
        for c in self.chunks() {
            if done == dst.len() {
                break;
            }
            let n = c.len().min(dst.len() - done);
            dst[done..done + n].copy_from_slice(&c[..n]);
            done += n;
        }
        count_copy(done);
        done
    }

    /// All bytes in one `Vec` (a copy).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for c in self.chunks() {
            v.extend_from_slice(c);
        }
        count_copy(v.len());
        v
    }

    /// Segment index and offset inside it of byte `n` (`n <= len`): `whole` segments
    /// lie entirely before `n`, and `part` bytes of the next one.
    fn locate(&self, n: usize) -> (usize, usize) {
        let mut rest = n;
        for (i, z) in self.segs.iter().enumerate() {
            if rest < z.len() {
                return (i, rest);
            }
            rest -= z.len();
        }
        (self.segs.len(), 0)
    }
}

impl From<Zbuf> for IoVec {
    /// The io-vector of one buffer (none if `z` is empty): what `new` + `push` make,
    /// without `push`'s merge attempt (there is nothing before `z` to merge with).
    #[inline]
    fn from(z: Zbuf) -> IoVec {
        if z.is_empty() {
            return IoVec::new();
        }
        let len = z.len();
        let mut segs = SmallVec::new();
        segs.push(z);
        IoVec { segs, len }
    }
}

impl FromIterator<Zbuf> for IoVec {
    fn from_iter<I: IntoIterator<Item = Zbuf>>(iter: I) -> IoVec {
        let mut v = IoVec::new();
        v.extend(iter);
        v
    }
}

impl Extend<Zbuf> for IoVec {
    fn extend<I: IntoIterator<Item = Zbuf>>(&mut self, iter: I) {
        for z in iter {
            self.push(z);
        }
    }
}

impl IntoIterator for IoVec {
    type Item = Zbuf;
    type IntoIter = smallvec::IntoIter<[Zbuf; INLINE]>;
    fn into_iter(self) -> Self::IntoIter {
        self.segs.into_iter()
    }
}

impl<'a> IntoIterator for &'a IoVec {
    type Item = &'a Zbuf;
    type IntoIter = std::slice::Iter<'a, Zbuf>;
    fn into_iter(self) -> Self::IntoIter {
        self.segs.iter()
    }
}

impl PartialEq for IoVec {
    /// Byte-wise equality, whatever the segmentation.
    fn eq(&self, other: &IoVec) -> bool {
        self.len == other.len
            && self
                .chunks()
                .flat_map(|c| c.iter())
                .eq(other.chunks().flat_map(|c| c.iter()))
    }
}

impl Eq for IoVec {}

impl fmt::Debug for IoVec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoVec")
            .field("len", &self.len)
            .field("segments", &self.segs.len())
            .finish()
    }
}
