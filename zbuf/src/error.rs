//! Error types.

use std::fmt;

/// Why an allocation failed. Allocation never panics; every failure is also counted
/// in the allocating core's statistics ([`crate::CoreStats::alloc_failures`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// Headroom plus length exceeds the largest size class.
    #[error("zbuf: {requested} bytes (headroom included) exceed the largest size class ({largest} bytes)")]
    TooLarge {
        /// Headroom + length asked for.
        requested: usize,
        /// Largest object size of the slab.
        largest: usize,
    },
    /// The class has no free object and the slab may not map another zone
    /// (`max_memory` / `max_zones` reached).
    #[error("zbuf: size class {class_size} exhausted (memory limit of the slab reached)")]
    Exhausted {
        /// Object size of the exhausted class.
        class_size: usize,
    },
    /// Mapping a new zone failed (for example: no free hugepages left and
    /// `require_hugepages` is set).
    #[error("zbuf: mapping a new zone failed: {reason}")]
    MapFailed {
        /// What the kernel said.
        reason: String,
    },
    /// The zone hook (e.g. DMA registration) refused a new zone; the zone was unmapped.
    #[error("zbuf: the zone hook rejected a new zone: {reason}")]
    ZoneRejected {
        /// The hook's message.
        reason: String,
    },
    /// [`crate::alloc`] was called on a thread without a registered [`crate::CoreCache`].
    #[error("zbuf: this thread has no registered core cache (call Slab::core_cache first)")]
    NoCache,
}

/// Why a [`crate::Slab`] or [`crate::CoreCache`] could not be created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SlabError {
    /// The configuration is inconsistent.
    #[error("zbuf: invalid slab configuration: {0}")]
    Config(String),
    /// `require_hugepages` is set and hugepages cannot be used.
    #[error("zbuf: hugepages required but unavailable: {0}")]
    HugepagesUnavailable(String),
    /// The core id is not below `max_cores`.
    #[error("zbuf: core id {core} out of range (max_cores is {max})")]
    CoreOutOfRange {
        /// Requested core id.
        core: usize,
        /// Configured `max_cores`.
        max: usize,
    },
    /// Another live [`crate::CoreCache`] owns this core id.
    #[error("zbuf: core {0} already has a cache")]
    CoreTaken(usize),
}

/// Not enough headroom or tailroom in a [`crate::ZbufMut`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("zbuf: need {requested} bytes of room, {available} available")]
pub struct NoRoom {
    /// Bytes asked for.
    pub requested: usize,
    /// Bytes of head- or tailroom there were.
    pub available: usize,
}

/// A position or range outside a buffer (returned by the `try_` variants).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfBounds {
    /// Start of the offending range (or the position).
    pub start: usize,
    /// End of the offending range (equal to `start` for a position).
    pub end: usize,
    /// Length of the buffer.
    pub len: usize,
}

impl fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.start > self.end {
            write!(
                f,
                "range start {} is after its end {}",
                self.start, self.end
            )
        } else if self.start == self.end {
            write!(
                f,
                "position {} out of bounds for length {}",
                self.start, self.len
            )
        } else {
            write!(
                f,
                "range {}..{} out of bounds for length {}",
                self.start, self.end, self.len
            )
        }
    }
}

impl std::error::Error for OutOfBounds {}

/// Resolves a range against `len`, as slice indexing does.
pub(crate) fn resolve_range(
    range: impl std::ops::RangeBounds<usize>,
    len: usize,
) -> Result<(usize, usize), OutOfBounds> {
    use std::ops::Bound;
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1).ok_or(OutOfBounds {
            start: s,
            end: s,
            len,
        })?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1).ok_or(OutOfBounds { start, end: e, len })?,
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end || end > len {
        return Err(OutOfBounds { start, end, len });
    }
    Ok((start, end))
}

/// Checks a split/advance position.
pub(crate) fn check_pos(at: usize, len: usize) -> Result<(), OutOfBounds> {
    if at > len {
        Err(OutOfBounds {
            start: at,
            end: at,
            len,
        })
    } else {
        Ok(())
    }
}
