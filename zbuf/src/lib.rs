//! Zbuf: a user-level slab over 2 MiB hugepages whose objects are shared, by reference
//! count, between the NIC, the TCP stack and the application, so no payload byte is
//! copied (LUNA's memory model).
//!
//! # Contract
//!
//! * A [`Slab`] maps *zones* of 2 MiB on demand, up to `max_memory`/`max_zones`. Each zone
//!   is one hugepage (anonymous `MAP_HUGETLB`, or a file in a hugetlbfs mount) split into
//!   equal objects of one size class (defaults 2, 4, 16 and 64 KiB). Without hugepages
//!   it falls back to normal pages with one warning per process;
//!   [`SlabConfig::require_hugepages`] turns that into [`SlabError::HugepagesUnavailable`].
//! * A thread allocates through its [`CoreCache`] ([`Slab::core_cache`]); afterwards
//!   [`alloc`] works on that thread like heap memory. Allocation picks the smallest class
//!   with room for headroom + length and returns a [`ZbufMut`] with an empty body.
//!   Failure is an [`AllocError`], counted, never a panic.
//! * [`ZbufMut`] is the unique writable handle (headroom | body | tailroom);
//!   [`ZbufMut::freeze`] makes it a [`Zbuf`], a read-only view whose clones share the
//!   object. [`IoVec`] is a list of `Zbuf`s with split/slice/concat, all without copying.
//! * The object goes back to its home core's cache when the last handle is dropped,
//!   wherever that happens. The TCP send queue simply keeps `Zbuf` clones until ACKed.
//! * Slabs outlive their buffers: the memory of a slab is unmapped only when the last
//!   `Slab` handle, `CoreCache` and buffer are all gone. Dropping the last `Slab` handle
//!   while buffers are out warns with a [`LeakReport`] (also available on demand from
//!   [`Slab::leak_report`]).
//! * Only [`Zbuf::copy_from_slice`], [`ZbufMut::extend_from_slice`],
//!   [`IoVec::copy_to_slice`] and [`IoVec::to_vec`] copy bytes; they are counted in
//!   [`copy_stats`]. `Zbuf::copy_from_slice`, [`Zbuf::from_vec`] and [`ZbufMut::heap`]
//!   need no slab at all (heap-backed, IOVA = VA): the test and slow path.
//!
//! # Memory layout
//!
//! ```text
//!  zone (2 MiB hugepage, va/iova 2 MiB-aligned)           zone metadata (heap)
//! +------------+------------+-----+------------+          +------------------------+
//! | object 0   | object 1   | ... | object n-1 |          | ZoneInfo: index, va,   |
//! | class size | class size |     |            |          | iova (+kind), len,     |
//! +------------+------------+-----+------------+          | object_size, objects   |
//!  ^ va + i*size, iova + i*size                           | ObjMeta[n], 64 B each: |
//!                                                         |  refcount, home core,  |
//!  one object as a ZbufMut:                               |  base, iova, index,    |
//!  |<- headroom ->|<--- body --->|<--- tailroom --->|     |  class                 |
//!  A Zbuf is (object, offset, len) over any part of it.   +------------------------+
//! ```
//!
//! Metadata is out of band: the whole object is payload and DMA-able, and the counts of
//! neighbouring objects do not share cache lines.
//!
//! # Threads: what is `Send` and why
//!
//! | type | Send | Sync | why |
//! |---|---|---|---|
//! | [`Slab`] | yes | yes | a counted handle; shared state is atomics and mutexes |
//! | [`CoreCache`] | **no** | **no** | unsynchronized per-core free lists, tied to the registering thread |
//! | [`Zbuf`] | yes | yes | atomic count, bytes immutable while shared; last drop anywhere goes home |
//! | [`ZbufMut`] | yes | yes | unique owner of its bytes |
//! | [`IoVec`] | yes | yes | a list of `Zbuf`s |
//!
//! Releasing the last reference on the home core pushes the object onto that core's free
//! list (no atomic read-modify-write besides the count). Releasing it elsewhere pushes it
//! onto the home's lock-free queue (crossbeam `SegQueue`), which the home drains when its
//! list runs dry; if the home has no cache any more the releasing thread moves it to the
//! shared pool. This protocol lives in `remote.rs` and is model-checked with loom.
//!
//! Each core keeps up to `cache_size` free objects per class. When a class runs out, the
//! slab flags memory pressure for it and every core that frees on its home core hands its
//! cached (and queued) free objects of that class back to the shared pool until some core
//! gets objects of the class again.
//!
//! # Not done yet
//!
//! * DPDK (cargo feature `dpdk`, module `dpdk`): zone registration, receive pools over
//!   leased zones with zero-copy mbuf → `Zbuf`, and extbuf transmit chains are done; per
//!   packet receive checksum flags and TSO are not.
//! * Free objects parked in the return queue of a core whose cache is alive but idle are
//!   not reachable by other cores until that core allocates or calls
//!   [`CoreCache::drain_remote`]; a slab can report exhaustion while such objects exist.
//! * Zones are never unmapped before the slab is dropped (no shrinking).

// The lints dpdk-sys has; Cargo.toml's `[lints]` sets the same levels for the tests and
// benches too.
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

mod cache;
mod config;
#[cfg(feature = "dpdk")]
pub mod dpdk;
mod error;
mod iovec;
mod mem;
mod obj;
mod release;
mod remote;
mod slab;
mod stats;
mod sync;
mod zbuf;
mod zbuf_mut;
mod zone_info;

pub use cache::{alloc, alloc_with_headroom, current_core, CoreCache};
pub use config::{
    HugepageMode, IovaMode, SlabConfig, ZoneHook, ZoneReleaseHook, ZoneSource, MAX_CORES, ZONE_SIZE,
};
pub use error::{AllocError, NoRoom, OutOfBounds, SlabError};
pub use iovec::IoVec;
pub use mem::{Backing, ProvidedZone};
pub use slab::{
    hugepage_fallback_warnings, ClassStats, CoreStats, LeakReport, Slab, SlabStats, ZoneLease,
    ZoneUsage,
};
pub use stats::{copy_stats, thread_copy_stats, CopyStats};
pub use zbuf::Zbuf;
pub use zbuf_mut::ZbufMut;
pub use zone_info::{IovaKind, ZoneInfo};

#[cfg(test)]
mod tests;
