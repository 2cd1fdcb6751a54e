//! What a mapped zone is: the description the slab hands to zone hooks, statistics and
//! devices. Plain data, below the slab and its configuration.

use crate::mem::Backing;

/// What a zone's IOVA is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IovaKind {
    /// Physical address (from `/proc/self/pagemap`); the zone is physically contiguous.
    Physical,
    /// The virtual address stands in for the IOVA (no hugepage, no permission to read
    /// PFNs, or [`crate::IovaMode::Va`]).
    Virtual,
}

/// Metadata of one zone: one 2 MiB region split into equal objects of one size class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneInfo {
    /// Zone number within its slab (unique, in creation order).
    pub index: usize,
    /// Virtual address of the first byte.
    pub va: usize,
    /// IOVA of the first byte; object `i` starts at `iova + i * object_size`.
    pub iova: u64,
    /// Length in bytes (2 MiB).
    pub len: usize,
    /// Object size of the zone's class.
    pub object_size: usize,
    /// Number of objects (`len / object_size`).
    pub objects: usize,
    /// Whether `iova` is physical or virtual.
    pub iova_kind: IovaKind,
    /// Hugepage or normal pages.
    pub backing: Backing,
}
