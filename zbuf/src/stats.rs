//! Copy counters: every byte the crate's copying paths move is counted here, so a test
//! or a benchmark can prove a path is zero-copy.
#![forbid(unsafe_code)]

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

static BYTES: AtomicU64 = AtomicU64::new(0);
static COPIES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static LOCAL: Cell<CopyStats> = const { Cell::new(CopyStats { bytes: 0, copies: 0 }) };
}

/// Bytes copied and number of copy operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CopyStats {
    /// Bytes copied.
    pub bytes: u64,
    /// Copy operations (calls that copied at least one byte).
    pub copies: u64,
}

/// Records a copy of `n` bytes (copy paths are slow paths; a shared counter is fine).
pub(crate) fn count_copy(n: usize) {
    if n == 0 {
        return;
    }
    BYTES.fetch_add(n as u64, Ordering::Relaxed);
    COPIES.fetch_add(1, Ordering::Relaxed);
    let _ = LOCAL.try_with(|c| {
        let s = c.get();
        c.set(CopyStats {
            bytes: s.bytes + n as u64,
            copies: s.copies + 1,
        });
    });
}

/// Copies made by this process so far: [`crate::Zbuf::copy_from_slice`],
/// [`crate::ZbufMut::extend_from_slice`], [`crate::IoVec::copy_to_slice`] and
/// [`crate::IoVec::to_vec`].
pub fn copy_stats() -> CopyStats {
    CopyStats {
        bytes: BYTES.load(Ordering::Relaxed),
        copies: COPIES.load(Ordering::Relaxed),
    }
}

/// Copies made by the calling thread so far (exact even while other threads copy).
pub fn thread_copy_stats() -> CopyStats {
    LOCAL.try_with(Cell::get).unwrap_or_default()
}
