//! DPDK glue (cargo feature `dpdk`): the NIC reads and writes zbuf memory, nothing copies
//! payload.
//!
//! # Pieces
//!
//! * [`DmaRegistry`]: registers every zone of a slab with DPDK (`rte_extmem_register`)
//!   and DMA-maps it for the ports that need it (`rte_dev_dma_map`), through
//!   [`crate::SlabConfig::zone_hook`] / [`crate::SlabConfig::zone_release_hook`].
//! * [`RxPool`] (receive): a pktmbuf pool whose data buffers are objects of zones leased
//!   from the slab (`rte_pktmbuf_pool_create_extbuf` over [`crate::Slab::lease_zones`]).
//!   The PMD writes frames straight into zone memory; [`RxPool::to_zbuf`] turns a
//!   received mbuf into a [`Zbuf`](crate::Zbuf) without copying or allocating: the
//!   object metadata lives in the mbuf's private area, the `Zbuf` owns the mbuf, and
//!   dropping the last reference frees the mbuf back to its pool.
//! * [`TxChains`] (transmit): header bytes + a payload [`crate::IoVec`] become an mbuf
//!   chain: one header mbuf (headers are copied: they are not payload) and one mbuf per
//!   payload segment with the segment attached as an external buffer
//!   (`rte_pktmbuf_attach_extbuf`). Each attachment holds a `Zbuf` clone in a bounded
//!   hold table; DPDK's free callback drops it when the PMD is done with the mbuf, so a
//!   buffer the application filled is released only after transmission and after every
//!   other reference is gone.
//!
//! # Copies
//!
//! None on these paths: [`crate::copy_stats`] does not move. The slow paths that do copy
//! count there too: a multi-segment frame flattened by [`mbuf_to_zbuf_copied`], and on
//! transmit a segment outside registered memory (only for ports that DMA) or a chain
//! for a port without multi-segment support.
//!
//! # Threads and the cross-core story
//!
//! * A `Zbuf` made from an mbuf may be dropped on **any** thread: the last drop calls
//!   `rte_pktmbuf_free`, which is MT-safe for the default `ring_mp_mc` mempool ops. On an
//!   EAL lcore the mbuf goes to that lcore's mempool cache, on a non-EAL thread straight
//!   to the ring. Freeing far from the receiving core only costs cache misses.
//! * The TX free callback runs wherever DPDK frees the mbuf: inside `rte_eth_tx_burst`
//!   on the transmitting core for memif, tap and af_packet (they copy and free at once),
//!   at a later burst on the same queue for NICs that DMA, or on whichever thread drops
//!   an unsent chain. The hold table's free list is a lock-free LIFO stack (the hold freed
//!   last is reused first, its cache lines still hot), so any thread is fine. The
//!   builder's counters are plain integers: `TxChains::build` takes `&mut self`.
//! * [`RxPool`] and [`TxChains`] are `Send + Sync`; a queue (and so a device using them)
//!   belongs to one thread at a time (see `dpdk_sys::ethdev`).
//!
//! # Lifetimes
//!
//! Mempools with external buffers keep the leased zones alive (`keep_alive`): when mbufs
//! are still out as the pool's last handle drops, DPDK's pool and the lease are both
//! leaked rather than freed under them. A [`TxChains`] whose holds are still in flight
//! when dropped leaks its hold table for the same reason. Both warn.

mod defer;
mod error;
mod registry;
mod rx;
mod tx;

use std::ptr::NonNull;

pub use defer::{defer_mbuf_frees, deferred_mbufs, DeferredFrees, MAX_DEFERRED};
pub use error::DpdkError;
pub use registry::{DmaRegistry, RegistryStats};
pub use rx::{mbuf_to_zbuf, mbuf_to_zbuf_copied, RxPool, RxPoolConfig};
pub use tx::{TxChains, TxConfig, TxError, TxOffloadRequest, TxStats, MAX_HOLDS};

use crate::obj::ObjMeta;
use dpdk_sys::ffi;

/// Releases a `Kind::Mbuf` object whose count just dropped to zero: the mbuf goes back to
/// its pool.
///
/// # Safety
/// `obj` was made by `SharedObj::init_mbuf` in the private area of an mbuf the object owns,
/// and its last reference was just released.
pub(crate) unsafe fn release_mbuf_obj(obj: NonNull<ObjMeta>) {
    // The private area starts right after `struct rte_mbuf` (rte_mbuf_to_priv).
    let m = obj
        .as_ptr()
        .cast::<u8>()
        .wrapping_sub(ffi::MBUF_STRUCT_SIZE as usize)
        .cast::<ffi::rte_mbuf>();
    // SAFETY: `m` is not null: it lies one `struct rte_mbuf` below a live object.
    let m = unsafe { NonNull::new_unchecked(m) };
    // Inside a scope of deferred frees the scope's end frees it (`defer`).
    if defer::defer(m) {
        return;
    }
    // SAFETY: per the contract `m` is the owning mbuf, which nobody else references; this
    // is its one free. The metadata is dead from here on (no Drop).
    unsafe { ffi::dpdk_sys_pktmbuf_free(m.as_ptr()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_fits_the_rx_private_area() {
        // rx.rs reserves `priv_size` for the metadata; keep both in step.
        assert!(crate::obj::META_SIZE <= rx::PRIV_SIZE as usize);
        assert_eq!(rx::PRIV_SIZE as u32 % ffi::RTE_MBUF_PRIV_ALIGN, 0);
        // The private area starts one `struct rte_mbuf` (cache-line multiple) past an
        // mbuf, which mempools align to a cache line.
        assert_eq!(ffi::MBUF_STRUCT_SIZE as usize % crate::obj::META_ALIGN, 0);
    }
}
