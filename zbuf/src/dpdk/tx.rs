//! Transmit: header + payload io-vector -> mbuf chain with the payload attached as
//! external buffers (no payload copy).

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use dpdk_sys::{ffi, Eal, Mbuf, Mempool, PoolConfig};

use super::{DmaRegistry, DpdkError};
use crate::stats::count_copy;
use crate::{IoVec, Zbuf};

/// Longest external buffer one mbuf can describe (`buf_len` is 16-bit).
const MAX_EXT_LEN: usize = u16::MAX as usize;

/// Largest hold table (the free-list head packs an index and two 20-bit counters).
pub const MAX_HOLDS: u32 = (1 << 20) - 1;

/// Parameters of [`TxChains::new`].
#[derive(Debug, Clone)]
pub struct TxConfig {
    /// Name of the mbuf pool (≤ 28 bytes, unique in the EAL instance).
    pub name: String,
    /// Mbufs in the pool: one per header plus one per attached payload segment in flight.
    pub mbufs: u32,
    /// Per-lcore mempool cache.
    pub cache_size: u32,
    /// Data room per mbuf, headroom included: headers go here, and so does the payload
    /// when it has to be copied (port without multi-segment support).
    pub data_room: u16,
    /// Attachments in flight at most (the bound on shared-info storage); at most
    /// [`MAX_HOLDS`].
    pub holds: u32,
    /// The port takes mbuf chains (`RTE_ETH_TX_OFFLOAD_MULTI_SEGS`); without it every
    /// frame is linearized into the header mbuf, a counted copy.
    pub multi_seg: bool,
    /// For ports that DMA: payload outside this registry's zones (heap buffers) is
    /// copied, counted, instead of attached. `None` for vdevs, which read any virtual
    /// address with the CPU.
    pub registry: Option<DmaRegistry>,
}

impl TxConfig {
    /// `mbufs` mbufs with default-sized data rooms, as many holds, chains allowed.
    pub fn new(name: impl Into<String>, mbufs: u32) -> Self {
        TxConfig {
            name: name.into(),
            mbufs,
            cache_size: 256.min(mbufs * 2 / 3),
            data_room: ffi::RTE_MBUF_DEFAULT_BUF_SIZE as u16,
            holds: mbufs,
            multi_seg: true,
            registry: None,
        }
    }
}

/// Checksum work the NIC should do (only ask when the port really offloads it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TxOffloadRequest {
    /// Ethernet header length.
    pub l2_len: u8,
    /// IP header length.
    pub l3_len: u16,
    /// L4 header length.
    pub l4_len: u8,
    /// Fill the IPv4 header checksum.
    pub ipv4_checksum: bool,
    /// Fill the TCP checksum (pseudo-header sum already in place).
    pub tcp_checksum: bool,
    /// Fill the UDP checksum (pseudo-header sum already in place).
    pub udp_checksum: bool,
}

/// Why a frame could not be turned into a chain (nothing leaks: what was built is freed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TxError {
    /// The mbuf pool is empty (mbufs are still in flight).
    #[error("zbuf-dpdk tx: mbuf pool exhausted")]
    NoMbuf,
    /// Every hold is in flight.
    #[error("zbuf-dpdk tx: all external-buffer holds are in flight")]
    NoHold,
    /// The header does not fit an mbuf's data room.
    #[error("zbuf-dpdk tx: {len}-byte header exceeds the {room}-byte mbuf room")]
    HeaderTooLarge {
        /// Header length.
        len: usize,
        /// Room in one mbuf.
        room: usize,
    },
    /// Without multi-segment support the frame must fit one mbuf, and it does not.
    #[error("zbuf-dpdk tx: {len}-byte frame exceeds the {room}-byte mbuf room (port without multi-segment tx)")]
    FrameTooLarge {
        /// Frame length.
        len: usize,
        /// Room in one mbuf.
        room: usize,
    },
    /// The chain would exceed 65535 segments.
    #[error("zbuf-dpdk tx: too many segments for one mbuf chain")]
    TooManySegments,
}

/// Counters of a [`TxChains`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TxStats {
    /// Chains built.
    pub chains: u64,
    /// Payload segments attached as external buffers.
    pub attaches: u64,
    /// Free callbacks run (attachments the PMD, or an unsent chain, released).
    pub frees: u64,
    /// Attachments in flight now (`attaches - frees`).
    pub in_flight: u64,
    /// Size of the hold table.
    pub hold_capacity: u64,
    /// Payload bytes copied (port without chains, or unregistered memory on a DMA port).
    pub copied_bytes: u64,
    /// Builds that failed for lack of an mbuf.
    pub no_mbuf: u64,
    /// Builds that failed for lack of a hold.
    pub no_hold: u64,
}

/// One attachment: DPDK's shared info (refcount, free callback) and the reference that
/// keeps the payload alive until the callback runs.
struct Hold {
    shinfo: UnsafeCell<ffi::rte_mbuf_ext_shared_info>,
    zbuf: UnsafeCell<Option<Zbuf>>,
    /// Next free hold while this one is on the free list.
    next: AtomicU32,
    idx: u32,
    table: *const HoldTable,
}

/// Fields of the free-list head word: the top hold's index, and how many pops and pushes
/// happened (mod 2^20). Every pop and push changes the word, so a stale compare-exchange
/// fails (no ABA), and `pops - pushes` is the number of holds in flight.
const IDX_BITS: u32 = 24;
const CNT_BITS: u32 = 20;
const NIL: u32 = (1 << IDX_BITS) - 1;
const IDX_MASK: u64 = (1 << IDX_BITS) - 1;
const CNT_MASK: u64 = (1 << CNT_BITS) - 1;
const POPS_SHIFT: u32 = IDX_BITS;
const PUSHES_SHIFT: u32 = IDX_BITS + CNT_BITS;

/// Fixed-size table of holds with a lock-free LIFO free list (a Treiber stack): bounded,
/// never reallocated (DPDK keeps pointers into it), safe to release from any thread.
/// LIFO because the hold freed last is the one whose cache lines are hot: with a FIFO
/// every attach touched the coldest hold of the table (see docs/benchmarks.md).
struct HoldTable {
    holds: Box<[Hold]>,
    head: AtomicU64,
}

impl HoldTable {
    /// `n` (1..=MAX_HOLDS) free holds, listed 0 -> 1 -> ... -> n-1: the first attaches use
    /// the first holds.
    fn new(n: u32) -> Arc<HoldTable> {
        Arc::new_cyclic(|weak| {
            let table = weak.as_ptr();
            HoldTable {
                holds: (0..n)
                    .map(|idx| Hold {
                        shinfo: UnsafeCell::new(ffi::rte_mbuf_ext_shared_info::default()),
                        zbuf: UnsafeCell::new(None),
                        next: AtomicU32::new(if idx + 1 == n { NIL } else { idx + 1 }),
                        idx,
                        table,
                    })
                    .collect(),
                head: AtomicU64::new(0),
            }
        })
    }

    fn pop(&self) -> Option<u32> {
        let mut h = self.head.load(Ordering::Acquire);
        loop {
            let idx = (h & IDX_MASK) as u32;
            if idx == NIL {
                return None;
            }
            // A racing pop may change `next` under us; the compare-exchange then fails
            // (the word moved on), so a stale value is never installed.
            let next = self.holds[idx as usize].next.load(Ordering::Relaxed);
            let pops = ((h >> POPS_SHIFT).wrapping_add(1)) & CNT_MASK;
            let new = (h & !(IDX_MASK | (CNT_MASK << POPS_SHIFT)))
                | u64::from(next)
                | (pops << POPS_SHIFT);
            match self
                .head
                .compare_exchange_weak(h, new, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => return Some(idx),
                Err(cur) => h = cur,
            }
        }
    }

    fn push(&self, idx: u32) {
        let hold = &self.holds[idx as usize];
        let mut h = self.head.load(Ordering::Relaxed);
        loop {
            hold.next.store((h & IDX_MASK) as u32, Ordering::Relaxed);
            let pushes = ((h >> PUSHES_SHIFT).wrapping_add(1)) & CNT_MASK;
            let new = (h & (CNT_MASK << POPS_SHIFT)) | u64::from(idx) | (pushes << PUSHES_SHIFT);
            match self
                .head
                .compare_exchange_weak(h, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(cur) => h = cur,
            }
        }
    }

    /// Holds popped and not yet pushed back.
    fn in_flight(&self) -> u64 {
        let h = self.head.load(Ordering::Relaxed);
        ((h >> POPS_SHIFT).wrapping_sub(h >> PUSHES_SHIFT)) & CNT_MASK
    }
}

// SAFETY: a hold's cells are touched only by whoever owns the hold: the builder between
// popping its index from the free list and attaching it, then the single free callback
// (DPDK runs it once, when the shared-info count drops to zero), which pushes the index
// back. The head's acquire/release compare-exchanges order those accesses. The raw
// `table` pointer names the enclosing table, which outlives every attachment (see
// `TxChains::drop`).
unsafe impl Send for HoldTable {}
// SAFETY: shared access is the protocol above: a hold's cells are touched only by its
// current owner, and ownership moves through the head's compare-exchanges.
unsafe impl Sync for HoldTable {}

/// DPDK's free callback for attached payload: drops the hold's `Zbuf` and returns the hold.
///
/// # Safety
/// Called by DPDK only, once per attachment made by `attach`, with that attachment's
/// `Hold` as `opaque`.
unsafe extern "C" fn hold_free(_addr: *mut c_void, opaque: *mut c_void) {
    // SAFETY: `opaque` is the `Hold` this callback was registered with in `attach`; its
    // table is alive (leaked rather than freed while attachments are in flight).
    let hold = unsafe { &*opaque.cast::<Hold>() };
    // SAFETY: the hold is ours: DPDK calls this once per attachment, after the last
    // mbuf referencing it was freed, and the builder is done with it.
    let z = unsafe { (*hold.zbuf.get()).take() };
    // SAFETY: `hold.table` is the table this hold lives in, alive for the same reason
    // as the hold itself (first comment above).
    let table = unsafe { &*hold.table };
    table.push(hold.idx);
    // Release the payload last; this may recycle the buffer to its zbuf home core.
    drop(z);
}

/// Builds transmit chains: header mbuf + one external-buffer mbuf per payload segment.
///
/// `Send + Sync`; `build` takes `&mut self` (one transmit queue, one thread: its counters
/// are plain integers). The free callback may run on any thread (see the module docs).
pub struct TxChains {
    pool: Mempool,
    holds: Arc<HoldTable>,
    multi_seg: bool,
    registry: Option<DmaRegistry>,
    chains: u64,
    attaches: u64,
    copied: u64,
    no_mbuf: u64,
    no_hold: u64,
}

impl std::fmt::Debug for TxChains {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxChains")
            .field("pool", &self.pool.name())
            .field("multi_seg", &self.multi_seg)
            .field("stats", &self.stats())
            .finish()
    }
}

impl TxChains {
    /// Creates the mbuf pool and the hold table.
    pub fn new(eal: &Eal, cfg: &TxConfig) -> Result<TxChains, DpdkError> {
        if cfg.holds == 0 || cfg.holds > MAX_HOLDS {
            return Err(DpdkError::Config(format!(
                "tx holds {} must be in 1..={MAX_HOLDS}",
                cfg.holds
            )));
        }
        if (cfg.data_room as u32) <= ffi::RTE_PKTMBUF_HEADROOM {
            return Err(DpdkError::Config(format!(
                "tx data_room {} leaves no room after the {}-byte headroom",
                cfg.data_room,
                ffi::RTE_PKTMBUF_HEADROOM
            )));
        }
        let pool = Mempool::create(
            eal,
            &PoolConfig {
                name: cfg.name.clone(),
                size: cfg.mbufs,
                cache_size: cfg.cache_size,
                priv_size: 0,
                data_room: cfg.data_room,
                socket: None,
            },
        )?;
        let holds = HoldTable::new(cfg.holds);
        Ok(TxChains {
            pool,
            holds,
            multi_seg: cfg.multi_seg,
            registry: cfg.registry.clone(),
            chains: 0,
            attaches: 0,
            copied: 0,
            no_mbuf: 0,
            no_hold: 0,
        })
    }

    /// The mbuf pool (headers and attachment mbufs).
    pub fn mempool(&self) -> &Mempool {
        &self.pool
    }

    /// Counters.
    pub fn stats(&self) -> TxStats {
        let in_flight = self.holds.in_flight();
        TxStats {
            chains: self.chains,
            attaches: self.attaches,
            frees: self.attaches.saturating_sub(in_flight),
            in_flight,
            hold_capacity: self.holds.holds.len() as u64,
            copied_bytes: self.copied,
            no_mbuf: self.no_mbuf,
            no_hold: self.no_hold,
        }
    }

    fn alloc(&mut self) -> Result<Mbuf, TxError> {
        self.pool.alloc().ok_or_else(|| {
            self.no_mbuf += 1;
            TxError::NoMbuf
        })
    }

    /// Builds the chain for one frame: `header` copied into a fresh mbuf, every payload
    /// segment attached without copying (split at 64 KiB), offload flags as requested.
    /// The payload `Zbuf`s stay referenced until DPDK frees their mbufs.
    pub fn build(
        &mut self,
        header: &[u8],
        payload: &IoVec,
        offload: Option<&TxOffloadRequest>,
    ) -> Result<Mbuf, TxError> {
        let mut head = self.alloc()?;
        let room = head.tailroom();
        if header.len() > room {
            return Err(TxError::HeaderTooLarge {
                len: header.len(),
                room,
            });
        }
        if !header.is_empty() {
            head.append(header.len() as u16)
                .ok_or(TxError::HeaderTooLarge {
                    len: header.len(),
                    room,
                })?
                .copy_from_slice(header);
        }
        if !self.multi_seg {
            let total = header.len() + payload.len();
            if payload.len() > head.tailroom() {
                return Err(TxError::FrameTooLarge { len: total, room });
            }
            for chunk in payload.chunks() {
                self.copy_into(&mut head, chunk)?;
            }
        } else {
            for z in payload.segments() {
                let unregistered = self
                    .registry
                    .as_ref()
                    .is_some_and(|r| !r.contains(z.addr(), z.len()));
                if unregistered {
                    self.copy_chain(&mut head, z)?;
                    continue;
                }
                let mut off = 0;
                while off < z.len() {
                    let n = (z.len() - off).min(MAX_EXT_LEN);
                    let seg = self.attach(z.slice(off..off + n))?;
                    head.chain(seg).map_err(|_| TxError::TooManySegments)?;
                    off += n;
                }
            }
        }
        if let Some(o) = offload {
            let mut flags = ffi::RTE_MBUF_F_TX_IPV4;
            if o.ipv4_checksum {
                flags |= ffi::RTE_MBUF_F_TX_IP_CKSUM;
            }
            if o.tcp_checksum {
                flags |= ffi::RTE_MBUF_F_TX_TCP_CKSUM;
            } else if o.udp_checksum {
                flags |= ffi::RTE_MBUF_F_TX_UDP_CKSUM;
            }
            head.set_ol_flags(flags);
            head.set_tx_offload(o.l2_len, o.l3_len, o.l4_len, 0);
        }
        self.chains += 1;
        Ok(head)
    }

    /// Copies `bytes` to the end of `m`'s last segment (room checked by the caller).
    fn copy_into(&mut self, m: &mut Mbuf, bytes: &[u8]) -> Result<(), TxError> {
        if bytes.is_empty() {
            return Ok(());
        }
        let room = m.tailroom();
        m.append(bytes.len() as u16)
            .ok_or(TxError::FrameTooLarge {
                len: bytes.len(),
                room,
            })?
            .copy_from_slice(bytes);
        count_copy(bytes.len());
        self.copied += bytes.len() as u64;
        Ok(())
    }

    /// Copies `z` into fresh mbufs chained to `head` (memory a DMA device cannot reach).
    fn copy_chain(&mut self, head: &mut Mbuf, z: &Zbuf) -> Result<(), TxError> {
        let mut rest: &[u8] = z;
        while !rest.is_empty() {
            let mut seg = self.alloc()?;
            let n = rest.len().min(seg.tailroom());
            self.copy_into(&mut seg, &rest[..n])?;
            head.chain(seg).map_err(|_| TxError::TooManySegments)?;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// An mbuf with `z` (≤ 64 KiB) attached as its external data buffer.
    fn attach(&mut self, z: Zbuf) -> Result<Mbuf, TxError> {
        let Some(idx) = self.holds.pop() else {
            self.no_hold += 1;
            return Err(TxError::NoHold);
        };
        let mut m = match self.alloc() {
            Ok(m) => m,
            Err(e) => {
                self.holds.push(idx);
                return Err(e);
            }
        };
        let hold = &self.holds.holds[idx as usize];
        let (addr, iova, len) = (z.addr(), z.iova(), z.len());
        // SAFETY: we popped `idx`, so nobody else touches this hold until its callback.
        unsafe { *hold.zbuf.get() = Some(z) };
        // SAFETY: the shared info is ours (as above) and lives in the table, which outlives
        // the attachment; the callback and its argument stay valid as long.
        unsafe {
            ffi::dpdk_sys_ext_shinfo_init(
                hold.shinfo.get(),
                Some(hold_free),
                (hold as *const Hold).cast_mut().cast(),
            )
        };
        self.attaches += 1;
        // SAFETY: `m` is a fresh, exclusive, direct one-segment mbuf with no data;
        // addr..addr+len is the bytes of the `Zbuf` the hold keeps alive until the free
        // callback runs; PMDs only read transmit data (checksum offload writes into the
        // header, which is in the head mbuf); the shared info is initialised with count 1
        // for this single attachment. `iova` is the zone's device address (its VA for
        // heap buffers, which only CPU-copying vdevs get: see `TxConfig::registry`).
        unsafe { m.attach_extbuf(addr as *mut u8, iova, len as u16, hold.shinfo.get()) };
        // Mark the attached bytes as data. Not through `Mbuf::append`, which would hand out
        // `&mut` to the payload (shared, read-only bytes: other handles may be reading
        // them) and refuses external buffers for that reason.
        // SAFETY: `m` is a valid one-segment mbuf we own exclusively; appending only moves
        // its length fields (DPDK returns a pointer we do not dereference).
        let grown = unsafe { ffi::dpdk_sys_pktmbuf_append(m.as_ptr(), len as u16) };
        // Cannot fail: after the attach the tailroom is exactly `len`.
        if grown.is_null() {
            return Err(TxError::TooManySegments);
        }
        Ok(m)
    }
}

impl Drop for TxChains {
    fn drop(&mut self) {
        let st = self.stats();
        if st.in_flight != 0 {
            let msg = format!(
                "zbuf-dpdk: TxChains dropped with {} attachment(s) in flight; keeping the hold \
                 table (and their buffers) alive until the process exits",
                st.in_flight
            );
            if log::max_level() >= log::LevelFilter::Warn {
                log::warn!("{msg}");
            } else {
                eprintln!("{msg}");
            }
            // DPDK still points at holds: they must outlive this value.
            std::mem::forget(self.holds.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_free_list_is_lifo_and_counts_in_flight() {
        let t = HoldTable::new(4);
        assert_eq!(t.in_flight(), 0);
        let a = t.pop().unwrap();
        let b = t.pop().unwrap();
        assert_eq!((a, b), (0, 1));
        assert_eq!(t.in_flight(), 2);
        t.push(a);
        // The hold freed last comes back first (its cache lines are the hot ones).
        assert_eq!(t.pop(), Some(a));
        let c = t.pop().unwrap();
        let d = t.pop().unwrap();
        assert_eq!((c, d), (2, 3));
        assert_eq!(t.pop(), None, "every hold in flight");
        assert_eq!(t.in_flight(), 4);
        for i in [b, d, a, c] {
            t.push(i);
        }
        assert_eq!(t.in_flight(), 0);
        assert_eq!(t.pop(), Some(c));
    }

    #[test]
    fn hold_counters_wrap_without_losing_in_flight() {
        // More than 2^20 pops and pushes: the packed counters wrap, the difference holds.
        let t = HoldTable::new(3);
        let keep = t.pop().unwrap();
        for _ in 0..(1u32 << 20) + 5 {
            let i = t.pop().unwrap();
            assert_eq!(t.in_flight(), 2);
            t.push(i);
        }
        assert_eq!(t.in_flight(), 1);
        t.push(keep);
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn hold_free_list_survives_concurrent_pop_and_push() {
        // Four threads take and return holds; none is ever handed out twice at once.
        let t = HoldTable::new(64);
        let owner: Arc<Vec<AtomicU32>> = Arc::new((0..64).map(|_| AtomicU32::new(0)).collect());
        std::thread::scope(|s| {
            for id in 1..=4u32 {
                let (t, owner) = (t.clone(), owner.clone());
                s.spawn(move || {
                    let mut mine = Vec::new();
                    for round in 0..20_000u32 {
                        if round % 3 != 2 {
                            if let Some(i) = t.pop() {
                                let prev = owner[i as usize].swap(id, Ordering::Relaxed);
                                assert_eq!(prev, 0, "hold {i} handed out twice");
                                mine.push(i);
                            }
                        } else if let Some(i) = mine.pop() {
                            owner[i as usize].store(0, Ordering::Relaxed);
                            t.push(i);
                        }
                    }
                    for i in mine {
                        owner[i as usize].store(0, Ordering::Relaxed);
                        t.push(i);
                    }
                });
            }
        });
        assert_eq!(t.in_flight(), 0);
        let mut all: Vec<u32> = std::iter::from_fn(|| t.pop()).collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..64).collect::<Vec<_>>(),
            "every hold back exactly once"
        );
    }
}
