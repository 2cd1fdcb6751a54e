//! Packet-mbuf pools.

use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::eal::{Eal, LEAKED_POOLS};
use crate::error::{rte_errno, Error, ErrorKind, Result};
use crate::ffi;
use crate::mbuf::Mbuf;

/// rte_mempool names are at most RTE_MEMPOOL_NAMESIZE - 1 = 28 bytes.
const MAX_NAME: usize = 28;

/// Parameters of [`Mempool::create`].
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Name, unique within the EAL instance (≤ 28 bytes).
    pub name: String,
    /// Number of mbufs (a power of two minus one uses memory best).
    pub size: u32,
    /// Per-lcore cache (0 to disable; ≤ 512 and ≤ size / 1.5).
    pub cache_size: u32,
    /// Private area per mbuf, bytes (multiple of 8).
    pub priv_size: u16,
    /// Data room per mbuf including RTE_PKTMBUF_HEADROOM
    /// (default RTE_MBUF_DEFAULT_BUF_SIZE = 2048 + 128).
    pub data_room: u16,
    /// NUMA socket, `None` for any.
    pub socket: Option<i32>,
}

impl PoolConfig {
    /// A pool of `size` default-sized mbufs with a 256-entry cache.
    pub fn new(name: impl Into<String>, size: u32) -> Self {
        PoolConfig {
            name: name.into(),
            size,
            cache_size: 256.min(size * 2 / 3),
            priv_size: 0,
            data_room: ffi::RTE_MBUF_DEFAULT_BUF_SIZE as u16,
            socket: None,
        }
    }
}

/// A pktmbuf mempool. Cloning shares the pool.
///
/// `Send + Sync`: the default mempool ops are multi-producer/multi-consumer.
/// The pool is freed when the last clone drops *and* no mbuf is out; if mbufs
/// are still in use then, it is leaked (with a message) rather than freed
/// under them.
#[derive(Clone)]
pub struct Mempool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    ptr: NonNull<ffi::rte_mempool>,
    name: String,
    size: u32,
    /// Owner of external data buffers ([`Mempool::create_extbuf`]): dropped only after
    /// the pool is freed, leaked with it when mbufs are still out.
    keep_alive: Option<Box<dyn Send + Sync>>,
    _eal: Eal,
}

/// One area of external memory for [`Mempool::create_extbuf`]
/// (`struct rte_pktmbuf_extmem`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtMem {
    /// Virtual address of the area.
    pub va: *mut u8,
    /// Its IO address, or `RTE_BAD_IOVA` (vdevs that copy need none).
    pub iova: u64,
    /// Length in bytes.
    pub len: usize,
    /// Bytes per mbuf data buffer (≥ the pool's data room); the area holds
    /// `len / elt_size` buffers.
    pub elt_size: u16,
}

// SAFETY: rte_mempool with the default ring_mp_mc ops is safe to use from any
// thread; the pointer is only freed in Drop of the last owner.
unsafe impl Send for PoolInner {}
// SAFETY: as above; all methods taking &self are MT-safe DPDK calls.
unsafe impl Sync for PoolInner {}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // SAFETY: ptr is a live pool created by rte_pktmbuf_pool_create.
        let in_use = unsafe { ffi::rte_mempool_in_use_count(self.ptr.as_ptr()) };
        if in_use != 0 {
            eprintln!(
                "dpdk-sys: mempool {} dropped with {in_use} mbuf(s) still in use; leaking it",
                self.name
            );
            LEAKED_POOLS.fetch_add(1, Ordering::SeqCst);
            // Mbufs still point into the external buffers: they must stay valid.
            std::mem::forget(self.keep_alive.take());
            return;
        }
        // SAFETY: no mbuf is out and no other handle exists (last Arc), and
        // ports using it for rx hold a clone, so they are closed already.
        unsafe { ffi::rte_mempool_free(self.ptr.as_ptr()) }
        // Only now may the external data buffers go.
        drop(self.keep_alive.take());
    }
}

impl Mempool {
    /// Creates a pktmbuf pool (`rte_pktmbuf_pool_create`).
    pub fn create(eal: &Eal, cfg: &PoolConfig) -> Result<Mempool> {
        Mempool::create_inner(eal, cfg, None)
    }

    /// Creates a pktmbuf pool whose data buffers are `ext` memory owned by the caller
    /// (`rte_pktmbuf_pool_create_extbuf`, "pinned external buffers"): mbuf `i` keeps
    /// the `i`-th `elt_size` slice of the areas for its whole life. `cfg.data_room`
    /// (including headroom) must fit in every `elt_size`, and the areas must hold at
    /// least `cfg.size` buffers. `keep_alive` owns the memory: it is dropped after
    /// `rte_mempool_free`, or leaked together with the pool if mbufs are still out
    /// when the last handle drops. Registering the memory for DMA
    /// (`rte_extmem_register`, `rte_dev_dma_map`) is the caller's job.
    ///
    /// # Safety
    /// Every area must be valid, writable memory of `len` bytes that nothing else uses
    /// while `keep_alive` lives, and `iova` must be its IO address or `RTE_BAD_IOVA`.
    pub unsafe fn create_extbuf(
        eal: &Eal,
        cfg: &PoolConfig,
        ext: &[ExtMem],
        keep_alive: Box<dyn Send + Sync>,
    ) -> Result<Mempool> {
        Mempool::create_inner(eal, cfg, Some((ext, keep_alive)))
    }

    fn create_inner(
        eal: &Eal,
        cfg: &PoolConfig,
        ext: Option<(&[ExtMem], Box<dyn Send + Sync>)>,
    ) -> Result<Mempool> {
        let step = format!("create mempool {:?}", cfg.name);
        let bad = |cause: String, fix: &str| {
            Err(Error::new(ErrorKind::InvalidArgument, step.clone(), cause).with_fix(fix))
        };
        if cfg.name.is_empty() || cfg.name.len() > MAX_NAME {
            return bad(
                format!("name must be 1..={MAX_NAME} bytes"),
                "use a shorter name",
            );
        }
        if cfg.size == 0 {
            return bad("size 0".into(), "ask for at least one mbuf");
        }
        if cfg.cache_size > ffi::RTE_MEMPOOL_CACHE_MAX_SIZE
            || cfg.cache_size as u64 * 3 > cfg.size as u64 * 2
        {
            return bad(
                format!(
                    "cache_size {} too large for size {}",
                    cfg.cache_size, cfg.size
                ),
                "cache_size must be ≤ 512 and ≤ size / 1.5",
            );
        }
        if (cfg.data_room as u32) < ffi::RTE_PKTMBUF_HEADROOM {
            return bad(
                format!(
                    "data_room {} is below the headroom {}",
                    cfg.data_room,
                    ffi::RTE_PKTMBUF_HEADROOM
                ),
                "data_room includes RTE_PKTMBUF_HEADROOM",
            );
        }
        let name = CString::new(cfg.name.as_bytes()).map_err(|_| {
            Error::new(
                ErrorKind::InvalidArgument,
                step.clone(),
                "name contains NUL",
            )
        })?;
        if cfg.priv_size as u32 % ffi::RTE_MBUF_PRIV_ALIGN != 0 {
            return bad(
                format!("priv_size {} is not a multiple of 8", cfg.priv_size),
                "round priv_size up to a multiple of RTE_MBUF_PRIV_ALIGN (8)",
            );
        }
        let socket = cfg.socket.unwrap_or(ffi::SOCKET_ID_ANY as i32);
        let (ext, keep_alive) = match ext {
            Some((areas, keep)) => (Some(areas), Some(keep)),
            None => (None, None),
        };
        let raw_ext: Vec<ffi::rte_pktmbuf_extmem> = match ext {
            None => Vec::new(),
            Some(areas) => {
                let mut buffers = 0usize;
                for a in areas {
                    if a.va.is_null() || a.len == 0 || a.elt_size == 0 {
                        return bad(
                            format!("external area {a:?} is empty"),
                            "give every area an address, a length and an element size",
                        );
                    }
                    if a.elt_size < cfg.data_room {
                        return bad(
                            format!(
                                "external elt_size {} is below the data room {}",
                                a.elt_size, cfg.data_room
                            ),
                            "use a data room no larger than the external buffers",
                        );
                    }
                    buffers += a.len / a.elt_size as usize;
                }
                if buffers < cfg.size as usize {
                    return bad(
                        format!(
                            "external areas hold {buffers} buffers, the pool needs {}",
                            cfg.size
                        ),
                        "give more external memory or make the pool smaller",
                    );
                }
                areas
                    .iter()
                    .map(|a| ffi::rte_pktmbuf_extmem {
                        buf_ptr: a.va.cast(),
                        buf_iova: a.iova,
                        buf_len: a.len,
                        elt_size: a.elt_size,
                    })
                    .collect()
            }
        };
        crate::log::clear();
        let p = if ext.is_some() {
            // SAFETY: EAL is initialised; name is NUL-terminated; raw_ext describes
            // memory the caller vouches for (see `create_extbuf`) and is only read
            // during the call.
            unsafe {
                ffi::dpdk_sys_pktmbuf_pool_create_extbuf(
                    name.as_ptr(),
                    cfg.size,
                    cfg.cache_size,
                    cfg.priv_size,
                    cfg.data_room,
                    socket,
                    raw_ext.as_ptr(),
                    raw_ext.len() as u32,
                )
            }
        } else {
            // SAFETY: EAL is initialised (we hold an Eal); name is NUL-terminated.
            unsafe {
                ffi::rte_pktmbuf_pool_create(
                    name.as_ptr(),
                    cfg.size,
                    cfg.cache_size,
                    cfg.priv_size,
                    cfg.data_room,
                    socket,
                )
            }
        };
        let Some(ptr) = NonNull::new(p) else {
            let errno = rte_errno();
            let e = Error::dpdk(ErrorKind::Mempool, step, errno);
            let mib = (cfg.size as u64 * (cfg.data_room as u64 + cfg.priv_size as u64 + 256)) >> 20;
            return Err(match errno {
                libc::EEXIST => e.with_fix("mempool names are global in the EAL instance; pick an unused name"),
                libc::ENOMEM => e.with_fix(format!(
                    "not enough hugepage memory for ~{mib} MiB: reserve more hugepages (`make setup`), \
                     lower -m limits, or make the pool smaller"
                )),
                _ => e.with_fix("check the pool parameters"),
            });
        };
        Ok(Mempool {
            inner: Arc::new(PoolInner {
                ptr,
                name: cfg.name.clone(),
                size: cfg.size,
                keep_alive,
                _eal: eal.clone(),
            }),
        })
    }

    /// Pool name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Number of mbufs in the pool.
    pub fn size(&self) -> u32 {
        self.inner.size
    }

    /// Free mbufs (ring + per-lcore caches).
    pub fn avail_count(&self) -> u32 {
        // SAFETY: live pool.
        unsafe { ffi::rte_mempool_avail_count(self.inner.ptr.as_ptr()) }
    }

    /// Mbufs allocated and not yet freed.
    pub fn in_use_count(&self) -> u32 {
        // SAFETY: live pool.
        unsafe { ffi::rte_mempool_in_use_count(self.inner.ptr.as_ptr()) }
    }

    /// Private area per mbuf in bytes (between `struct rte_mbuf` and the data).
    pub fn priv_size(&self) -> u16 {
        // SAFETY: live pktmbuf pool; reads its private header.
        unsafe { ffi::dpdk_sys_pktmbuf_priv_size(self.inner.ptr.as_ptr()) }
    }

    /// Data room per mbuf, including headroom.
    pub fn data_room(&self) -> u16 {
        // SAFETY: live pktmbuf pool (created by rte_pktmbuf_pool_create).
        unsafe { ffi::dpdk_sys_pktmbuf_data_room_size(self.inner.ptr.as_ptr()) }
    }

    /// Bytes of payload one freshly allocated mbuf holds (data room minus headroom).
    pub fn seg_capacity(&self) -> usize {
        self.data_room() as usize - ffi::RTE_PKTMBUF_HEADROOM as usize
    }

    /// Raw pointer for FFI (e.g. `rte_eth_rx_queue_setup`). Valid while `self` lives.
    pub fn as_ptr(&self) -> *mut ffi::rte_mempool {
        self.inner.ptr.as_ptr()
    }

    /// Allocates one mbuf (`rte_pktmbuf_alloc`), `None` if the pool is empty.
    pub fn alloc(&self) -> Option<Mbuf> {
        // SAFETY: live pktmbuf pool; a non-null result is a fresh mbuf we own.
        let m = unsafe { ffi::dpdk_sys_pktmbuf_alloc(self.as_ptr()) };
        // SAFETY: a non-null m is an mbuf with one reference, owned by us.
        unsafe { Mbuf::from_raw(m) }
    }

    /// A fresh mbuf holding `len` bytes that `fill` writes (it is given all of them, not
    /// initialised before: stale bytes of the buffer's last use), with the transmit offload
    /// `offload` (flags and header lengths) when given: what [`alloc`](Self::alloc),
    /// [`Mbuf::append`], [`Mbuf::set_ol_flags`] and [`Mbuf::set_tx_offload`] do, in one
    /// call into DPDK and without their checks, which a fresh mbuf passes (one reference,
    /// its own buffer). `None` if the pool is empty or `len` is more than one mbuf's
    /// tailroom (nothing is called then).
    #[inline]
    pub fn alloc_frame(
        &self,
        len: u16,
        offload: Option<&TxOffloadFields>,
        fill: impl FnOnce(&mut [u8]),
    ) -> Option<Mbuf> {
        let o = offload.copied().unwrap_or_default();
        let mut data: *mut core::ffi::c_char = core::ptr::null_mut();
        // SAFETY: live pktmbuf pool; `data` is a valid place for the data pointer. The
        // header lengths are masked to the mbuf's bitfields (7 and 9 bits), as
        // `Mbuf::set_tx_offload` does.
        let m = unsafe {
            ffi::dpdk_sys_pktmbuf_alloc_frame(
                self.as_ptr(),
                len,
                o.ol_flags,
                u64::from(o.l2_len) & 0x7f,
                u64::from(o.l3_len) & 0x1ff,
                u64::from(o.l4_len),
                &mut data,
            )
        };
        // SAFETY: a non-null m is a fresh mbuf with one reference, owned by us (freed by
        // the handle's drop if `fill` panics).
        let m = unsafe { Mbuf::from_raw(m) }?;
        // SAFETY: the shim set `data` to the first of the mbuf's `len` data bytes, in its
        // own buffer (a fresh direct mbuf, or a pinned external buffer nobody else is
        // attached to), which nothing else references while `m` is ours; the slice lives
        // only for `fill`, within `m`'s life.
        let buf = unsafe { std::slice::from_raw_parts_mut(data.cast::<u8>(), usize::from(len)) };
        fill(buf);
        Some(m)
    }

    /// Appends `n` fresh mbufs to `out`, all or nothing (`rte_pktmbuf_alloc_bulk`).
    /// Returns false (and leaves `out` as it was) if the pool has fewer than `n`.
    pub fn alloc_bulk(&self, out: &mut Vec<Mbuf>, n: usize) -> bool {
        out.reserve(n);
        let spare = out.spare_capacity_mut();
        // SAFETY: spare has room for n pointers; Mbuf is repr(transparent)
        // over NonNull<rte_mbuf>, so the array layout matches rte_mbuf *[n].
        let ret = unsafe {
            ffi::dpdk_sys_pktmbuf_alloc_bulk(self.as_ptr(), spare.as_mut_ptr().cast(), n as u32)
        };
        if ret != 0 {
            return false;
        }
        // SAFETY: on success DPDK wrote n non-null mbuf pointers we now own.
        unsafe { out.set_len(out.len() + n) };
        true
    }

    /// Allocates a frame of `len` bytes as a chain of as many mbufs as needed
    /// (each filled to [`seg_capacity`](Self::seg_capacity)); contents are
    /// uninitialised-but-valid bytes (whatever the buffer held). `None` if the
    /// pool runs dry (nothing leaks) or the chain would exceed 65535 segments.
    pub fn alloc_chain(&self, len: usize) -> Option<Mbuf> {
        let cap = self.seg_capacity().max(1);
        let mut head = self.alloc()?;
        let first = len.min(cap);
        head.append(first as u16)?;
        let mut left = len - first;
        while left > 0 {
            let mut seg = self.alloc()?;
            let n = left.min(cap);
            seg.append(n as u16)?;
            head.chain(seg).ok()?;
            left -= n;
        }
        Some(head)
    }
}

/// The transmit offload of a fresh mbuf ([`Mempool::alloc_frame`]): `ol_flags`
/// (`RTE_MBUF_F_TX_*`) and the header lengths the device needs for them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxOffloadFields {
    /// `RTE_MBUF_F_TX_*` flags; 0 for no offload (the lengths are not written then).
    pub ol_flags: u64,
    /// Ethernet header length (7 bits).
    pub l2_len: u8,
    /// IP header length (9 bits).
    pub l3_len: u16,
    /// TCP/UDP header length.
    pub l4_len: u8,
}
