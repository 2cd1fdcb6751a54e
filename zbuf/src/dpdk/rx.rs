//! Receive: mempools whose data buffers are zone objects, and mbuf -> Zbuf conversion.

use std::ptr::NonNull;

use dpdk_sys::{ffi, Eal, ExtMem, Mbuf, Mempool, PoolConfig};

use super::registry::{eal_iova_va, zone_iova};
use super::{DmaRegistry, DpdkError};
use crate::obj::{ObjMeta, SharedObj, META_ALIGN, META_SIZE};
use crate::zone_info::ZoneInfo;
use crate::{IoVec, Slab, Zbuf, ZbufMut, ZONE_SIZE};

/// Private area reserved per mbuf for the object metadata (`ObjMeta`, one cache line).
pub(crate) const PRIV_SIZE: u16 = 64;

/// Parameters of [`RxPool::new`].
#[derive(Debug, Clone)]
pub struct RxPoolConfig {
    /// Mempool name, unique in the EAL instance (≤ 28 bytes).
    pub name: String,
    /// Number of mbufs: enough for every rx ring plus what the application holds.
    pub mbufs: u32,
    /// Per-lcore mempool cache (≤ 512 and ≤ mbufs / 1.5).
    pub cache_size: u32,
    /// Data buffer size: the smallest slab size class of at least this many bytes is
    /// leased, and its object size (≤ 32 KiB) is each mbuf's data room, headroom included.
    pub object_size: usize,
}

impl RxPoolConfig {
    /// `mbufs` buffers of 2 KiB (a 1514-byte frame after the 128-byte headroom).
    pub fn new(name: impl Into<String>, mbufs: u32) -> Self {
        RxPoolConfig {
            name: name.into(),
            mbufs,
            cache_size: 256.min(mbufs * 2 / 3),
            object_size: 2048,
        }
    }
}

/// A pktmbuf pool whose data buffers are objects of slab zones (see the module docs).
///
/// The zones are leased from the slab ([`Slab::lease_zones`]) for the pool's lifetime and
/// registered with the [`DmaRegistry`] if one is given. `Send + Sync`.
pub struct RxPool {
    mempool: Mempool,
    zones: Vec<ZoneInfo>,
    data_room: u16,
}

impl std::fmt::Debug for RxPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxPool")
            .field("name", &self.mempool.name())
            .field("mbufs", &self.mempool.size())
            .field("zones", &self.zones.len())
            .field("data_room", &self.data_room)
            .finish()
    }
}

fn view(m: *const ffi::rte_mbuf) -> ffi::dpdk_sys_mbuf_view {
    let mut v = ffi::dpdk_sys_mbuf_view::default();
    // SAFETY: callers pass an mbuf they own a reference to; `v` is a valid out pointer.
    unsafe { ffi::dpdk_sys_mbuf_view(m, &mut v) };
    v
}

fn iova_or_va(iova: u64, va: usize) -> u64 {
    if iova == ffi::RTE_BAD_IOVA {
        va as u64
    } else {
        iova
    }
}

impl RxPool {
    /// Leases zones for `cfg.mbufs` buffers from `slab`, registers them with `registry`
    /// (if given; pass the one the slab was built with) and creates the pool.
    pub fn new(
        eal: &Eal,
        slab: &Slab,
        registry: Option<&DmaRegistry>,
        cfg: &RxPoolConfig,
    ) -> Result<RxPool, DpdkError> {
        let headroom = ffi::RTE_PKTMBUF_HEADROOM as usize;
        if cfg.mbufs == 0 {
            return Err(DpdkError::Config(
                "an rx pool needs at least one mbuf".into(),
            ));
        }
        if cfg.object_size <= headroom || cfg.object_size > 32 * 1024 {
            return Err(DpdkError::Config(format!(
                "rx object_size {} must be above the {headroom}-byte mbuf headroom and at most 32 KiB",
                cfg.object_size
            )));
        }
        let lease_size = slab
            .config()
            .size_classes
            .iter()
            .copied()
            .find(|&c| c >= cfg.object_size)
            .ok_or_else(|| {
                DpdkError::Config(format!(
                    "no size class of the slab holds {} bytes",
                    cfg.object_size
                ))
            })?;
        if lease_size > 32 * 1024 {
            return Err(DpdkError::Config(format!(
                "the slab's class for {} bytes is {lease_size} bytes; rx buffers must be at most 32 KiB \
                 (mbuf lengths are 16-bit): add a smaller size class",
                cfg.object_size
            )));
        }
        let per_zone = ZONE_SIZE / lease_size;
        let zones = (cfg.mbufs as usize).div_ceil(per_zone);
        let lease = slab.lease_zones(lease_size, zones)?;
        if let Some(reg) = registry {
            for z in lease.zones() {
                reg.register_zone(z)?;
            }
        }
        let iova_va = eal_iova_va(eal);
        let ext: Vec<ExtMem> = lease
            .zones()
            .iter()
            .map(|z| ExtMem {
                va: z.va as *mut u8,
                iova: zone_iova(z, iova_va).unwrap_or(ffi::RTE_BAD_IOVA),
                len: z.len,
                elt_size: lease_size as u16,
            })
            .collect();
        let zone_infos = lease.zones().to_vec();
        let data_room = lease_size as u16;
        let pc = PoolConfig {
            name: cfg.name.clone(),
            size: cfg.mbufs,
            cache_size: cfg.cache_size,
            priv_size: PRIV_SIZE,
            data_room,
            socket: None,
        };
        // SAFETY: the areas are whole leased zones: mapped, writable, used by nobody
        // else while the lease (moved into the pool as keep_alive) lives; their IOVAs are
        // what the registry told DPDK, or RTE_BAD_IOVA.
        let mempool = unsafe { Mempool::create_extbuf(eal, &pc, &ext, Box::new(lease))? };
        Ok(RxPool {
            mempool,
            zones: zone_infos,
            data_room,
        })
    }

    /// The mempool, for `Port::configure` / rx queue setup.
    pub fn mempool(&self) -> &Mempool {
        &self.mempool
    }

    /// The leased zones holding the data buffers.
    pub fn zones(&self) -> &[ZoneInfo] {
        &self.zones
    }

    /// Data room per mbuf (the object size, headroom included).
    pub fn data_room(&self) -> u16 {
        self.data_room
    }

    /// Whether `addr` lies in one of this pool's zones.
    pub fn contains(&self, addr: usize) -> bool {
        self.zones
            .iter()
            .any(|z| addr >= z.va && addr - z.va < z.len)
    }

    /// Turns a received single-segment mbuf into a [`Zbuf`] over its data, zero-copy.
    ///
    /// For an exclusively owned mbuf of this pool nothing is allocated: the object
    /// metadata is written into the mbuf's private area and the `Zbuf` owns the mbuf;
    /// the last reference frees it. The object is writable ([`Zbuf::try_into_mut`]
    /// works on the only reference, with the mbuf headroom as headroom). Other mbufs
    /// become a heap-wrapped read-only `Zbuf` ([`mbuf_to_zbuf`]), still without copying.
    /// A chain is handed back as `Err` (see [`RxPool::to_iovec`] and
    /// [`mbuf_to_zbuf_copied`]).
    pub fn to_zbuf(&self, m: Mbuf) -> Result<Zbuf, Mbuf> {
        let v = view(m.as_ptr());
        if v.nb_segs != 1 {
            return Err(m);
        }
        let priv_ptr = m
            .as_ptr()
            .cast::<u8>()
            .wrapping_add(ffi::MBUF_STRUCT_SIZE as usize);
        // `Mbuf::is_writable` of a single segment, from the same call's fields: the
        // segment owns its buffer (which refuses one shared with indirect mbufs: a
        // pinned-extbuf count above 1) and holds the only reference, then the Acquire
        // fence orders the reads of handles dropped before ours ahead of writes through
        // the object we make (zbuf/tests/dpdk.rs, `rx`: writable exactly when
        // `is_writable` says so).
        let ours = v.pool == self.mempool.as_ptr()
            && v.owns_buf != 0
            && v.refcnt == 1
            && v.priv_size as usize >= META_SIZE
            && (priv_ptr as usize) % META_ALIGN == 0;
        if ours {
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        }
        let Some(base) = NonNull::new(v.buf_addr.cast::<u8>()).filter(|_| ours) else {
            return mbuf_to_zbuf(m);
        };
        let raw = m.into_raw();
        let meta = NonNull::new(priv_ptr.cast::<ObjMeta>()).expect("mbuf pointers are non-null");
        let iova = iova_or_va(v.buf_iova, base.as_ptr() as usize);
        // SAFETY: `raw` is an mbuf of this pool (private area of PRIV_SIZE ≥ META_SIZE
        // bytes, aligned, checked above), referenced only by us (refcnt 1, owning its
        // buffer: `is_writable`), and its
        // ownership passes to the object, released by `release_mbuf_obj`; the private
        // area holds no live metadata (a previous object over it freed the mbuf). The
        // data buffer is zone memory the pool owns: initialized (zones are zero-filled
        // when mapped), written by nobody while we own the mbuf.
        let obj = unsafe { SharedObj::init_mbuf(meta, base, v.buf_len as usize, iova, true) };
        debug_assert_eq!(
            raw.cast::<u8>()
                .wrapping_add(ffi::MBUF_STRUCT_SIZE as usize),
            priv_ptr
        );
        Ok(Zbuf::from_parts(
            obj,
            v.data_off as usize,
            v.data_len as usize,
        ))
    }

    /// Turns a received mbuf chain into an [`IoVec`], one zero-copy [`Zbuf`] per segment
    /// (the chain is cut into single-segment mbufs, each owned by its `Zbuf`).
    pub fn to_iovec(&self, m: Mbuf) -> IoVec {
        let mut out = IoVec::new();
        let mut next = Some(m);
        while let Some(seg) = next.take() {
            let exclusive = seg.is_exclusive();
            if !exclusive {
                // A shared chain cannot be cut: wrap it whole, segment by segment views.
                push_shared_chain(&mut out, seg);
                break;
            }
            // SAFETY: the chain is exclusively ours (checked); unchaining leaves two valid
            // packets, each owned once: `seg` and the returned rest.
            let rest = unsafe { ffi::dpdk_sys_pktmbuf_unchain(seg.as_ptr()) };
            // SAFETY: `rest` is null or the owned remainder of the chain.
            next = unsafe { Mbuf::from_raw(rest) };
            match self.to_zbuf(seg) {
                Ok(z) => out.push(z),
                // Unreachable (single segment now), but never lose data.
                Err(m) => push_shared_chain(&mut out, m),
            }
        }
        out
    }
}

/// Wraps every segment of `m` as a view of one shared heap object that owns the chain.
fn push_shared_chain(out: &mut IoVec, m: Mbuf) {
    let segs: Vec<(usize, usize)> = m
        .segments()
        .map(|s| (s.as_ptr() as usize, s.len()))
        .collect();
    let owner = std::sync::Arc::new(m);
    for (addr, len) in segs {
        let Some(ptr) = NonNull::new(addr as *mut u8) else {
            continue;
        };
        let keep = owner.clone();
        // SAFETY: the bytes are a segment of `m`, which `keep` owns until the closure
        // runs; a shared chain is read-only for everyone.
        let z = unsafe { Zbuf::from_external(ptr, len, addr as u64, move || drop(keep)) };
        out.push(z);
    }
}

/// A single-segment mbuf of any pool as a read-only [`Zbuf`], zero-copy: a small heap
/// object owns the mbuf and frees it with the last reference. `Err` gives a chain back.
pub fn mbuf_to_zbuf(m: Mbuf) -> Result<Zbuf, Mbuf> {
    let v = view(m.as_ptr());
    if v.nb_segs != 1 {
        return Err(m);
    }
    let len = v.data_len as usize;
    // SAFETY: a valid mbuf's data pointer (buf_addr + data_off) addresses data_len bytes.
    let data = unsafe { ffi::dpdk_sys_pktmbuf_mtod(m.as_ptr()) }.cast::<u8>();
    let Some(ptr) = NonNull::new(data) else {
        return Err(m);
    };
    let iova = iova_or_va(v.buf_iova, v.buf_addr as usize).wrapping_add(v.data_off as u64);
    // SAFETY: the bytes belong to `m`, which the closure owns until it runs (last
    // reference); through zbuf they are read-only, and nobody else holds the mbuf
    // mutably (we own a reference; a shared mbuf is read-only by DPDK convention).
    Ok(unsafe { Zbuf::from_external(ptr, len, iova, move || drop(m)) })
}

/// The whole packet (any number of segments) copied into one new buffer: from the calling
/// thread's zbuf cache if it has one, else the heap. Counted in [`crate::copy_stats`].
pub fn mbuf_to_zbuf_copied(m: &Mbuf) -> Zbuf {
    let len = m.pkt_len();
    let mut buf = crate::alloc_with_headroom(0, len).unwrap_or_else(|_| ZbufMut::heap(0, len));
    for seg in m.segments() {
        // Room was reserved for pkt_len bytes, the sum of the segment lengths.
        if buf.extend_from_slice(seg).is_err() {
            break;
        }
    }
    buf.freeze()
}
