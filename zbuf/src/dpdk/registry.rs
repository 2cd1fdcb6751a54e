//! Zone registration with DPDK: `rte_extmem_register` for every zone, `rte_dev_dma_map`
//! for every port that DMAs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use dpdk_sys::{ffi, Eal};

use super::DpdkError;
use crate::config::SlabConfig;
use crate::mem::Backing;
use crate::zone_info::{IovaKind, ZoneInfo};
use crate::ZONE_SIZE;

/// Counters of a [`DmaRegistry`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistryStats {
    /// Zones registered with `rte_extmem_register`.
    pub registered: u64,
    /// Zones unregistered (their slab memory was freed).
    pub unregistered: u64,
    /// Successful `rte_dev_dma_map` calls (zone × port).
    pub dma_maps: u64,
    /// `rte_dev_dma_unmap` calls.
    pub dma_unmaps: u64,
    /// Registrations or mappings that failed (the zone was rejected).
    pub failures: u64,
}

struct Region {
    len: usize,
    /// IOVA of the first byte, `None` when DPDK got `RTE_BAD_IOVA` (no device may DMA).
    iova: Option<u64>,
    /// Ports this region is DMA-mapped for.
    mapped: Vec<u16>,
    /// EAL memory (a memzone from [`DmaRegistry::dpdk_memory_slab_config`]): DPDK knows
    /// and maps it already, so it is neither registered nor unregistered here.
    eal: bool,
}

struct State {
    regions: BTreeMap<usize, Region>,
    ports: Vec<u16>,
    stats: RegistryStats,
}

struct Inner {
    /// Registrations are undone before EAL may be cleaned up.
    _eal: Eal,
    /// EAL runs in IOVA-as-VA mode: a zone's virtual address is its IOVA.
    iova_va: bool,
    state: Mutex<State>,
}

/// Registers slab zones with DPDK so devices may use them (cheap to clone, `Send + Sync`).
///
/// Build the slab with [`DmaRegistry::slab_config`]: every new zone is then registered
/// (`rte_extmem_register`, with its IOVA when known) before any object of it is handed
/// out, DMA-mapped for every port added with [`DmaRegistry::add_port`], and unregistered
/// right before the slab unmaps it. A zone that cannot be registered is rejected, so the
/// allocation fails with [`crate::AllocError::ZoneRejected`] instead of handing out memory
/// a device cannot use.
///
/// * vdevs (memif, tap, af_packet, ring, null) copy with the CPU and use virtual
///   addresses: they need the registration only for DPDK's bookkeeping, and their bus
///   accepts `rte_dev_dma_map` as a no-op. A NIC behind VFIO gets real IOMMU mappings.
/// * Each zone becomes one DPDK memseg list; DPDK has `RTE_MAX_MEMSEG_LISTS` (128 in
///   Debian's 22.11 build) for everything, EAL's own hugepage lists included, so a slab
///   used with DPDK should stay below about 120 zones (240 MiB): set
///   [`SlabConfig::max_memory`] accordingly. Past that, registration fails with a clear
///   reason and the zone is rejected.
/// * When the zone's IOVA is unknown (normal pages while EAL runs in IOVA-as-PA mode)
///   DPDK gets `RTE_BAD_IOVA`: fine for vdevs, and no port is DMA-mapped for it.
#[derive(Clone)]
pub struct DmaRegistry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DmaRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("DmaRegistry")
            .field("regions", &st.regions.len())
            .field("ports", &st.ports)
            .field("iova_va", &self.inner.iova_va)
            .finish()
    }
}

/// # Safety
/// See [`crate::ProvidedZone::new`].
unsafe fn zbuf_provided(
    ptr: std::ptr::NonNull<u8>,
    iova: Option<u64>,
    release: impl FnOnce() + Send + Sync + 'static,
) -> crate::ProvidedZone {
    // SAFETY: forwarded from the caller.
    unsafe { crate::ProvidedZone::new(ptr, ZONE_SIZE, iova, release) }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

fn errno_text(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

impl DmaRegistry {
    /// A registry for this EAL instance (which it keeps initialised).
    pub fn new(eal: &Eal) -> DmaRegistry {
        DmaRegistry {
            inner: Arc::new(Inner {
                _eal: eal.clone(),
                iova_va: eal_iova_va(eal),
                state: Mutex::new(State {
                    regions: BTreeMap::new(),
                    ports: Vec::new(),
                    stats: RegistryStats::default(),
                }),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `cfg` with hooks that register each new zone and unregister it before it is
    /// unmapped. A zone hook already in `cfg` runs first; so does a release hook, last.
    pub fn slab_config(&self, mut cfg: SlabConfig) -> SlabConfig {
        let prev = cfg.zone_hook.take();
        let reg = self.clone();
        cfg = cfg.zone_hook(move |z| {
            if let Some(p) = &prev {
                p(z)?;
            }
            reg.register_zone(z).map_err(|e| e.to_string())
        });
        let prev_release = cfg.zone_release_hook.take();
        let reg = self.clone();
        cfg.zone_release_hook(move |z| {
            reg.unregister_zone(z);
            if let Some(p) = &prev_release {
                p(z);
            }
        })
    }

    /// [`DmaRegistry::slab_config`] with every zone taken from EAL memory (one 2 MiB
    /// `rte_memzone` per zone, cache-line aligned, freed with the slab) instead of mapped
    /// by the slab and
    /// registered as external memory. memif's zero-copy mode needs this: its client
    /// shares EAL's memory-segment lists with the server (and fails on external ones),
    /// so every buffer it receives into or sends from must lie in them. Needs
    /// `--single-file-segments` and enough EAL memory (`-m`, or hugepages the EAL may grow
    /// into) for the slab's zones; hugepage settings of `cfg` are ignored.
    pub fn dpdk_memory_slab_config(&self, cfg: SlabConfig) -> SlabConfig {
        let seq = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let cfg = cfg.zone_source(move || {
            let n = seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // Memzone names are global to the process (≤ 31 bytes).
            let name = format!("zbuf-{}-{n}", std::process::id());
            let cname = std::ffi::CString::new(name.clone()).map_err(|e| e.to_string())?;
            let mut addr: *mut libc::c_void = std::ptr::null_mut();
            let mut iova = 0u64;
            // SAFETY: EAL is initialised (the registry holds an Eal); the name is a valid C
            // string and the out pointers are live locals.
            let mz = unsafe {
                ffi::dpdk_sys_memzone_reserve(
                    cname.as_ptr(),
                    ZONE_SIZE,
                    // Cache-line aligned: 2 MiB alignment would waste almost a page per
                    // zone (the heap's element header precedes the data).
                    64,
                    &mut addr,
                    &mut iova,
                )
            };
            let ptr = std::ptr::NonNull::new(addr.cast::<u8>());
            let (false, Some(ptr)) = (mz.is_null(), ptr) else {
                // SAFETY: reads DPDK's thread-local errno.
                let errno = unsafe { ffi::dpdk_sys_errno() };
                return Err(format!(
                    "rte_memzone_reserve of {ZONE_SIZE} bytes ({name}): {} (EAL memory \
                     exhausted? raise -m or free hugepages)",
                    errno_text(errno)
                ));
            };
            let mz = mz as usize;
            let iova = (iova != ffi::RTE_BAD_IOVA).then_some(iova);
            let release = move || {
                // SAFETY: `mz` came from dpdk_sys_memzone_reserve and is freed once (the
                // slab runs a zone's release once).
                unsafe { ffi::dpdk_sys_memzone_free(mz as *const libc::c_void) };
            };
            // SAFETY: the memzone is ZONE_SIZE bytes of EAL memory reserved for us alone
            // until `release` frees it; the shim gives an IOVA only for a contiguous zone.
            Ok(unsafe { zbuf_provided(ptr, iova, release) })
        });
        self.slab_config(cfg)
    }

    /// Registers one zone (no-op if it is registered already) and DMA-maps it for every
    /// added port. On failure nothing stays registered.
    pub fn register_zone(&self, z: &ZoneInfo) -> Result<(), DpdkError> {
        let mut st = self.lock();
        if st.regions.contains_key(&z.va) {
            return Ok(());
        }
        if z.backing == Backing::Provided {
            // Only EAL memory is provided through this registry (a memzone): DPDK has it
            // in its memory-segment lists and DMA-maps it for devices itself.
            st.regions.insert(
                z.va,
                Region {
                    len: z.len,
                    iova: None,
                    mapped: Vec::new(),
                    eal: true,
                },
            );
            return Ok(());
        }
        let page = match z.backing {
            Backing::Hugepage => ZONE_SIZE,
            Backing::Normal | Backing::Provided => page_size(),
        };
        if z.len == 0 || z.len % page != 0 || z.va % page != 0 {
            st.stats.failures += 1;
            return Err(DpdkError::Register(format!(
                "zone {} (va {:#x}, {} bytes) is not a whole number of {page}-byte pages",
                z.index, z.va, z.len
            )));
        }
        let pages = z.len / page;
        let iova = zone_iova(z, self.inner.iova_va);
        let mut iovas: Vec<u64> = match iova {
            Some(base) => (0..pages).map(|i| base + (i * page) as u64).collect(),
            None => Vec::new(),
        };
        let iova_ptr = if iovas.is_empty() {
            std::ptr::null_mut()
        } else {
            iovas.as_mut_ptr()
        };
        // SAFETY: EAL is initialised; va..va+len is a live mapping owned by the slab
        // (unregistered in `unregister_zone` before it is unmapped); iova_ptr is null or
        // holds `pages` entries, read during the call only.
        let rc = unsafe {
            ffi::rte_extmem_register(z.va as *mut _, z.len, iova_ptr, pages as u32, page)
        };
        if rc != 0 {
            // SAFETY: reads DPDK's thread-local errno.
            let errno = unsafe { ffi::dpdk_sys_errno() };
            st.stats.failures += 1;
            let hint = match errno {
                libc::ENOSPC => format!(
                    "; DPDK's memory-segment lists are full ({} regions registered here, at most \
                     RTE_MAX_MEMSEG_LISTS=128 per process including EAL's own): lower the \
                     slab's max_memory",
                    st.regions.len()
                ),
                libc::EEXIST => "; the range is already registered with DPDK".into(),
                _ => String::new(),
            };
            return Err(DpdkError::Register(format!(
                "rte_extmem_register of zone {} (va {:#x}, {} bytes, {pages} pages of {page}) \
                 failed: {}{hint}",
                z.index,
                z.va,
                z.len,
                errno_text(errno)
            )));
        }
        let mut region = Region {
            len: z.len,
            iova,
            mapped: Vec::new(),
            eal: false,
        };
        let ports = st.ports.clone();
        for port in ports {
            if let Err(e) = map(&mut st.stats, z.va, &mut region, port) {
                unmap_all(&mut st.stats, z.va, &mut region);
                // SAFETY: registered above, no mapping left.
                unsafe { ffi::rte_extmem_unregister(z.va as *mut _, z.len) };
                st.stats.failures += 1;
                return Err(e);
            }
        }
        st.stats.registered += 1;
        st.regions.insert(z.va, region);
        Ok(())
    }

    /// Undoes [`DmaRegistry::register_zone`] (no-op for an unknown zone).
    pub fn unregister_zone(&self, z: &ZoneInfo) {
        let mut st = self.lock();
        let Some(mut region) = st.regions.remove(&z.va) else {
            return;
        };
        if region.eal {
            return;
        }
        unmap_all(&mut st.stats, z.va, &mut region);
        // SAFETY: registered by us with this va/len; no device mapping is left.
        let rc = unsafe { ffi::rte_extmem_unregister(z.va as *mut _, region.len) };
        if rc == 0 {
            st.stats.unregistered += 1;
        } else {
            st.stats.failures += 1;
        }
    }

    /// DMA-maps every registered zone, and every later one, for `port_id`
    /// (`rte_dev_dma_map` on the port's device; a no-op on vdev buses).
    pub fn add_port(&self, port_id: u16) -> Result<(), DpdkError> {
        let mut st = self.lock();
        if st.ports.contains(&port_id) {
            return Ok(());
        }
        // SAFETY: EAL is initialised; any id value is accepted.
        if unsafe { ffi::rte_eth_dev_is_valid_port(port_id) } == 0 {
            st.stats.failures += 1;
            return Err(DpdkError::Config(format!("no ethdev port {port_id}")));
        }
        let State { regions, stats, .. } = &mut *st;
        let mut done = Vec::new();
        for (&va, region) in regions.iter_mut() {
            if let Err(e) = map(stats, va, region, port_id) {
                stats.failures += 1;
                for va in done {
                    if let Some(r) = regions.get_mut(&va) {
                        unmap_one(stats, va, r, port_id);
                    }
                }
                return Err(e);
            }
            done.push(va);
        }
        st.ports.push(port_id);
        Ok(())
    }

    /// Undoes [`DmaRegistry::add_port`] (before the port is closed).
    pub fn remove_port(&self, port_id: u16) {
        let mut st = self.lock();
        st.ports.retain(|&p| p != port_id);
        let State { regions, stats, .. } = &mut *st;
        for (&va, region) in regions.iter_mut() {
            unmap_one(stats, va, region, port_id);
        }
    }

    /// Whether `addr..addr+len` lies inside one registered zone.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        let st = self.lock();
        st.regions
            .range(..=addr)
            .next_back()
            .is_some_and(|(&va, r)| addr - va <= r.len && len <= r.len - (addr - va))
    }

    /// Registered zones as `(va, len)`, by address.
    pub fn regions(&self) -> Vec<(usize, usize)> {
        self.lock()
            .regions
            .iter()
            .map(|(&va, r)| (va, r.len))
            .collect()
    }

    /// Counters.
    pub fn stats(&self) -> RegistryStats {
        self.lock().stats
    }
}

/// The IOVA DPDK should know for zone `z`: its physical address for a hugepage zone, its
/// virtual address in IOVA-as-VA mode, else none (`RTE_BAD_IOVA`).
pub(crate) fn zone_iova(z: &ZoneInfo, iova_va: bool) -> Option<u64> {
    match (z.iova_kind, z.backing) {
        // One physically contiguous hugepage.
        (IovaKind::Physical, Backing::Hugepage) if !iova_va => Some(z.iova),
        // What DPDK said when it gave the memzone.
        (IovaKind::Physical, Backing::Provided) => Some(z.iova),
        _ if iova_va => Some(z.va as u64),
        _ => None,
    }
}

/// Whether EAL runs in IOVA-as-VA mode.
pub(crate) fn eal_iova_va(_eal: &Eal) -> bool {
    // SAFETY: EAL is initialised (we hold an Eal); reads a global.
    unsafe { ffi::rte_eal_iova_mode() == ffi::rte_iova_mode::RTE_IOVA_VA }
}

fn map(stats: &mut RegistryStats, va: usize, r: &mut Region, port: u16) -> Result<(), DpdkError> {
    let Some(iova) = r.iova else {
        // RTE_BAD_IOVA: nothing to map; only CPU-copying vdevs can use this zone.
        return Ok(());
    };
    // SAFETY: va..va+len is registered with rte_extmem_register (required by DPDK).
    let rc = unsafe { ffi::dpdk_sys_port_dma_map(port, va as *mut _, iova, r.len) };
    if rc != 0 {
        return Err(DpdkError::Register(format!(
            "rte_dev_dma_map of {:#x}+{} (iova {iova:#x}) for port {port} failed: {}",
            va,
            r.len,
            errno_text(-rc)
        )));
    }
    stats.dma_maps += 1;
    r.mapped.push(port);
    Ok(())
}

fn unmap_one(stats: &mut RegistryStats, va: usize, r: &mut Region, port: u16) {
    if let (Some(iova), Some(i)) = (r.iova, r.mapped.iter().position(|&p| p == port)) {
        r.mapped.swap_remove(i);
        // SAFETY: mapped by `map` with the same arguments. A closed port answers ENODEV,
        // which leaves nothing behind either.
        unsafe { ffi::dpdk_sys_port_dma_unmap(port, va as *mut _, iova, r.len) };
        stats.dma_unmaps += 1;
    }
}

fn unmap_all(stats: &mut RegistryStats, va: usize, r: &mut Region) {
    for port in r.mapped.clone() {
        unmap_one(stats, va, r, port);
    }
}
