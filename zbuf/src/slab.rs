//! The slab: zones, per-class shared pools, per-core slots, recycling and statistics.
//!
//! Object flow: zone → class pool (mutex, batches) → core slot's local free list
//! (owner thread only) → handle → back to the local list when released on the home
//! core, or through the home's lock-free queue when released elsewhere.

use std::cell::{Cell, UnsafeCell};
use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crossbeam_utils::CachePadded;

use crate::config::{HugepageMode, IovaMode, SlabConfig, ZONE_SIZE};
use crate::error::{AllocError, SlabError};
use crate::mem::{self, Backing, Mapping};
use crate::obj::{ObjMeta, ObjPtr, UniqueObj};
use crate::remote::{Home, Refs};
use crate::zone_info::{IovaKind, ZoneInfo};

/// A zone and how many of its objects are referenced by handles right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneUsage {
    /// The zone.
    pub info: ZoneInfo,
    /// Objects with a reference count above zero.
    pub in_use: usize,
}

/// Per-class totals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassStats {
    /// Object size.
    pub object_size: usize,
    /// Zones mapped for this class.
    pub zones: usize,
    /// Objects in those zones.
    pub objects: usize,
    /// Objects referenced by handles.
    pub in_use: usize,
    /// Free objects in the shared pool (the rest of the free ones sit in core caches
    /// or on their way home).
    pub in_shared_pool: usize,
}

/// Per-core counters (written only by the owning core, except `remote_frees`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreStats {
    /// Core id.
    pub core: usize,
    /// A live [`CoreCache`](crate::CoreCache) owns this core id.
    pub active: bool,
    /// Successful allocations.
    pub allocs: u64,
    /// Failed allocations (every [`AllocError`] returned by this core's cache).
    pub alloc_failures: u64,
    /// Objects released on this core whose home is this core.
    pub local_frees: u64,
    /// Objects of this home released on another core (cross-core frees).
    pub remote_frees: u64,
}

/// Snapshot of a slab's state (racy while other threads allocate: each number is exact
/// at some instant during the call).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlabStats {
    /// Zones mapped.
    pub zones: usize,
    /// Of which backed by hugepages.
    pub hugepage_zones: usize,
    /// Bytes mapped.
    pub mapped_bytes: usize,
    /// Per size class, smallest first.
    pub classes: Vec<ClassStats>,
    /// Per core id that ever allocated, owns a cache or received frees.
    pub cores: Vec<CoreStats>,
}

impl SlabStats {
    /// Objects referenced by handles, all classes.
    pub fn in_use(&self) -> usize {
        self.classes.iter().map(|c| c.in_use).sum()
    }

    /// Allocation failures, all cores.
    pub fn alloc_failures(&self) -> u64 {
        self.cores.iter().map(|c| c.alloc_failures).sum()
    }

    /// Cross-core frees, all cores.
    pub fn remote_frees(&self) -> u64 {
        self.cores.iter().map(|c| c.remote_frees).sum()
    }
}

/// Objects still referenced, by zone: what leaked if the application is shutting down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakReport {
    /// Objects still referenced.
    pub objects_in_use: usize,
    /// Their total object size in bytes.
    pub bytes_in_use: usize,
    /// Zones with referenced objects.
    pub zones: Vec<ZoneUsage>,
}

impl LeakReport {
    /// `true` when no object is referenced.
    pub fn is_clean(&self) -> bool {
        self.objects_in_use == 0
    }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_clean() {
            return write!(f, "zbuf: no objects in use");
        }
        write!(
            f,
            "zbuf: {} objects ({} bytes) still in use",
            self.objects_in_use, self.bytes_in_use
        )?;
        for z in &self.zones {
            write!(
                f,
                "; zone {} (class {} B, va {:#x}): {}/{}",
                z.info.index, z.info.object_size, z.info.va, z.in_use, z.info.objects
            )?;
        }
        Ok(())
    }
}

struct Zone {
    slab: *const SlabInner,
    info: ZoneInfo,
    metas: Box<[ObjMeta]>,
    _mapping: Mapping,
}

impl Zone {
    fn in_use(&self) -> usize {
        self.metas.iter().filter(|m| m.refcnt.get() > 0).count()
    }
}

/// An owned zone at a fixed heap address: object metadata points at it, so it is
/// allocated once, written in place and never moved or mutably borrowed again.
struct ZoneBox(NonNull<Zone>);

// SAFETY: a `Zone` is immutable after construction apart from its objects' atomics;
// its raw pointers name the slab and the mapping, which are Send + Sync.
unsafe impl Send for ZoneBox {}
// SAFETY: shared access to a `Zone` only reads fields that never change after
// construction, or goes through its objects' atomics.
unsafe impl Sync for ZoneBox {}

impl ZoneBox {
    /// Allocates the zone's memory first so `build` can point object metadata at it.
    fn new(build: impl FnOnce(*const Zone) -> Zone) -> ZoneBox {
        let raw = Box::into_raw(Box::new(MaybeUninit::<Zone>::uninit())).cast::<Zone>();
        let zone = build(raw);
        // SAFETY: `raw` is a fresh, uninitialized allocation with Zone's layout.
        unsafe { raw.write(zone) };
        ZoneBox(NonNull::new(raw).expect("Box pointers are non-null"))
    }
}

impl std::ops::Deref for ZoneBox {
    type Target = Zone;
    fn deref(&self) -> &Zone {
        // SAFETY: initialized in `new`, freed only in `drop`.
        unsafe { self.0.as_ref() }
    }
}

impl Drop for ZoneBox {
    fn drop(&mut self) {
        // SAFETY: allocated by `Box` in `new` with the same layout; dropped once.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

struct ClassPool {
    size: usize,
    batch: usize,
    zones: AtomicUsize,
    free: Mutex<Vec<ObjPtr>>,
}

/// Free lists of one core; only the thread owning the slot touches them.
struct Local {
    free: Vec<Vec<ObjPtr>>,
}

pub(crate) struct CoreSlot {
    index: u32,
    home: Home<ObjPtr>,
    local: UnsafeCell<Local>,
    // Owner-written counters: plain load+store, no read-modify-write on the fast path.
    allocs: AtomicU64,
    failures: AtomicU64,
    local_frees: AtomicU64,
    used: AtomicBool,
}

impl CoreSlot {
    /// # Safety
    /// Only the thread that owns this slot (claimed it and holds its `CoreCache`) may
    /// call this, and it must not keep two results alive at once: every use is a short
    /// scope that calls no code able to drop a handle or allocate.
    #[allow(clippy::mut_from_ref)]
    unsafe fn local(&self) -> &mut Local {
        // SAFETY: exclusive per the contract.
        unsafe { &mut *self.local.get() }
    }

    fn bump(counter: &AtomicU64) {
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

pub(crate) struct SlabInner {
    /// Our own address as allocated (set once before sharing): zones point here, and the
    /// last reference frees through it.
    this: *mut SlabInner,
    refs: Refs,
    handles: AtomicUsize,
    cfg: SlabConfig,
    classes: Box<[ClassPool]>,
    zones: Mutex<Vec<ZoneBox>>,
    zone_limit: usize,
    zones_reserved: AtomicUsize,
    next_zone: AtomicUsize,
    slots: Box<[CachePadded<CoreSlot>]>,
    /// The zone mapped by the hugepage probe, used by the first zone.
    spare: Mutex<Option<Mapping>>,
    /// Hugepages worked at creation.
    huge_ok: bool,
    /// Bit `c` (classes above 63 share bit 63) is set when a core found class `c`
    /// exhausted. Until some core gets objects of it from the shared pool again, every
    /// core that frees locally also hands its cached free objects of that class (and
    /// its queued returns) to the pool. Only read on the local free path.
    pressure: CachePadded<AtomicU64>,
}

impl Drop for SlabInner {
    fn drop(&mut self) {
        // Undo registrations (the release hook) before the zones are unmapped, while the
        // configuration holding the hooks is still alive.
        let zones = std::mem::take(self.zones.get_mut().unwrap_or_else(|e| e.into_inner()));
        if let Some(hook) = &self.cfg.zone_release_hook {
            for z in &zones {
                hook(&z.info);
            }
        }
        drop(zones);
    }
}

// SAFETY: all shared state is atomics or mutexes, except each slot's `local`, which only
// the thread owning the slot touches (claim flag + thread-local registration).
unsafe impl Sync for SlabInner {}
// SAFETY: as above; nothing in it is tied to the creating thread.
unsafe impl Send for SlabInner {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves plain Vecs consistent: keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

static FALLBACK_WARNINGS: AtomicUsize = AtomicUsize::new(0);
static WARNED: AtomicBool = AtomicBool::new(false);

/// Warns once per process that zones use normal pages.
fn warn_fallback(reason: &str) {
    if WARNED.swap(true, Ordering::Relaxed) {
        return;
    }
    FALLBACK_WARNINGS.fetch_add(1, Ordering::Relaxed);
    let msg = format!(
        "zbuf: hugepages unavailable ({reason}); falling back to normal pages \
         (IOVA = virtual address, not physically contiguous). \
         Set require_hugepages to make this an error. This warning is shown once."
    );
    if log::max_level() >= log::LevelFilter::Warn {
        log::warn!("{msg}");
    } else {
        eprintln!("{msg}");
    }
}

/// How many hugepage-fallback warnings this process has emitted (0 or 1).
pub fn hugepage_fallback_warnings() -> usize {
    FALLBACK_WARNINGS.load(Ordering::Relaxed)
}

impl SlabInner {
    fn new(mut cfg: SlabConfig) -> Result<SlabInner, SlabError> {
        cfg.validate()?;
        cfg.size_classes.sort_unstable();
        let (huge_ok, spare) = match cfg.hugepages {
            _ if cfg.zone_source.is_some() => (false, None),
            HugepageMode::Never => (false, None),
            mode => match map_hugepage(&cfg) {
                Ok(m) => (true, Some(m)),
                Err(reason) if mode == HugepageMode::Require => {
                    return Err(SlabError::HugepagesUnavailable(reason))
                }
                Err(reason) => {
                    warn_fallback(&reason);
                    (false, None)
                }
            },
        };
        let classes = cfg
            .size_classes
            .iter()
            .map(|&size| ClassPool {
                size,
                batch: (cfg.cache_size / 2).clamp(1, ZONE_SIZE / size),
                zones: AtomicUsize::new(0),
                free: Mutex::new(Vec::new()),
            })
            .collect();
        let slots = (0..cfg.max_cores)
            .map(|i| {
                CachePadded::new(CoreSlot {
                    index: i as u32,
                    home: Home::new(),
                    local: UnsafeCell::new(Local {
                        free: vec![Vec::new(); cfg.size_classes.len()],
                    }),
                    allocs: AtomicU64::new(0),
                    failures: AtomicU64::new(0),
                    local_frees: AtomicU64::new(0),
                    used: AtomicBool::new(false),
                })
            })
            .collect();
        Ok(SlabInner {
            this: std::ptr::null_mut(),
            refs: Refs::new(1),
            handles: AtomicUsize::new(1),
            zone_limit: cfg.zone_limit(),
            cfg,
            classes,
            zones: Mutex::new(Vec::new()),
            zones_reserved: AtomicUsize::new(0),
            next_zone: AtomicUsize::new(0),
            slots,
            spare: Mutex::new(spare),
            huge_ok,
            pressure: CachePadded::new(AtomicU64::new(0)),
        })
    }

    pub(crate) fn headroom(&self) -> usize {
        self.cfg.headroom
    }

    pub(crate) fn max_cores(&self) -> usize {
        self.slots.len()
    }

    fn class_for(&self, need: usize) -> Option<usize> {
        self.classes.iter().position(|c| c.size >= need)
    }

    /// Allocates on the core owning `core`.
    ///
    /// # Safety
    /// The calling thread owns slot `core` (holds its live `CoreCache`).
    pub(crate) unsafe fn alloc(
        &self,
        core: usize,
        headroom: usize,
        len: usize,
    ) -> Result<UniqueObj, AllocError> {
        let slot = &self.slots[core];
        // SAFETY: the calling thread owns slot `core` (this function's contract), which
        // is all `alloc_obj` asks.
        let r = unsafe { self.alloc_obj(slot, headroom, len) };
        match r {
            Ok(obj) => {
                CoreSlot::bump(&slot.allocs);
                Ok(obj)
            }
            Err(e) => {
                CoreSlot::bump(&slot.failures);
                Err(e)
            }
        }
    }

    /// # Safety
    /// As [`SlabInner::alloc`].
    unsafe fn alloc_obj(
        &self,
        slot: &CoreSlot,
        headroom: usize,
        len: usize,
    ) -> Result<UniqueObj, AllocError> {
        let largest = self.classes.last().map_or(0, |c| c.size);
        let need = headroom.saturating_add(len);
        let class = self.class_for(need).ok_or(AllocError::TooLarge {
            requested: need,
            largest,
        })?;
        // SAFETY: owner thread; the borrow ends at the end of this statement.
        let popped = unsafe { slot.local() }.free[class].pop();
        let obj = match popped {
            Some(o) => o,
            // SAFETY: the calling thread owns `slot` (our contract), and the borrow of its
            // local lists above has ended.
            None => unsafe { self.refill(slot, class)? },
        };
        // SAFETY: `obj` came off our own free list, so we own it exclusively.
        Ok(unsafe { obj.into_unique(slot.index) })
    }

    /// Moves objects other cores returned into the local lists.
    ///
    /// # Safety
    /// The calling thread owns `slot`.
    pub(crate) unsafe fn drain_home(&self, slot_index: usize) -> usize {
        let slot = &self.slots[slot_index];
        // SAFETY: owner thread; draining only pops pointers (no handle drops, no allocation).
        let local = unsafe { slot.local() };
        slot.home
            .drain(|o| local.free[o.meta().class as usize].push(o))
    }

    /// # Safety
    /// The calling thread owns `slot`.
    unsafe fn refill(&self, slot: &CoreSlot, class: usize) -> Result<ObjPtr, AllocError> {
        // SAFETY: the calling thread owns `slot` (our contract); no borrow of its local
        // lists is alive here.
        unsafe { self.drain_home(slot.index as usize) };
        // SAFETY: owner thread, short borrow.
        if let Some(o) = unsafe { slot.local() }.free[class].pop() {
            return Ok(o);
        }
        let pool = &self.classes[class];
        loop {
            let batch: Vec<ObjPtr> = {
                let mut free = lock(&pool.free);
                let n = pool.batch.min(free.len());
                let at = free.len() - n;
                free.split_off(at)
            };
            if let Some((&first, rest)) = batch.split_first() {
                let bit = pressure_bit(class);
                if self.pressure.load(Ordering::Relaxed) & bit != 0 {
                    self.pressure.fetch_and(!bit, Ordering::Relaxed);
                }
                // Objects leaving the pool keep the slab alive (see `Refs`).
                self.refs.acquire(batch.len());
                // SAFETY: owner thread, short borrow, no calls out.
                unsafe { slot.local() }.free[class].extend_from_slice(rest);
                return Ok(first);
            }
            // Each turn maps one more zone or fails, so this ends.
            if let Err(e) = self.grow(class) {
                self.pressure
                    .fetch_or(pressure_bit(class), Ordering::Relaxed);
                return Err(e);
            }
        }
    }

    /// Moves free objects from a core's list to the shared pool.
    fn spill(&self, class: usize, objs: Vec<ObjPtr>) {
        let n = objs.len();
        lock(&self.classes[class].free).extend(objs);
        // The core's cache holds its own reference: never the last.
        self.refs.release(n);
    }

    /// Memory pressure: hands this core's free objects of the pressed classes, including
    /// those other cores returned to it, to the shared pool.
    ///
    /// # Safety
    /// The calling thread owns slot `core`; no borrow of its local state is in use.
    unsafe fn relieve(&self, core: usize, pressure: u64) {
        // SAFETY: the calling thread owns slot `core` and holds no borrow of its local
        // state (our contract).
        unsafe { self.drain_home(core) };
        for class in 0..self.classes.len() {
            if pressure & pressure_bit(class) != 0 {
                // SAFETY: owner thread, short borrow.
                let objs = std::mem::take(&mut unsafe { self.slots[core].local() }.free[class]);
                if !objs.is_empty() {
                    self.spill(class, objs);
                }
            }
        }
    }

    /// Returns a free object to its class pool.
    fn return_to_pool(&self, o: ObjPtr) {
        lock(&self.classes[o.meta().class as usize].free).push(o);
        // Cannot be the last reference: every caller holds one of its own.
        let last = self.refs.release(1);
        debug_assert!(!last);
    }

    /// Maps, registers and publishes one zone for `class`.
    fn grow(&self, class: usize) -> Result<(), AllocError> {
        let (_, objs) = self.add_zone(class)?;
        lock(&self.classes[class].free).extend(objs);
        Ok(())
    }

    /// Maps and registers one zone for `class` and records it; its objects are returned
    /// to the caller, free (count 0) and not in any pool yet.
    fn add_zone(&self, class: usize) -> Result<(ZoneInfo, Vec<ObjPtr>), AllocError> {
        let class_size = self.classes[class].size;
        let reserved = self
            .zones_reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.zone_limit).then_some(n + 1)
            });
        if reserved.is_err() {
            return Err(AllocError::Exhausted { class_size });
        }
        let unreserve = || {
            self.zones_reserved.fetch_sub(1, Ordering::AcqRel);
        };
        let mapping = match self.map_zone() {
            Ok(m) => m,
            Err(e) => {
                unreserve();
                return Err(e);
            }
        };
        let zone = self.build_zone(mapping, class);
        if let Some(hook) = &self.cfg.zone_hook {
            if let Err(reason) = hook(&zone.info) {
                drop(zone);
                unreserve();
                return Err(AllocError::ZoneRejected { reason });
            }
        }
        let objs: Vec<ObjPtr> = zone
            .metas
            .iter()
            .map(|m| ObjPtr(NonNull::from(m)))
            .collect();
        let info = zone.info.clone();
        lock(&self.zones).push(zone);
        self.classes[class].zones.fetch_add(1, Ordering::Relaxed);
        Ok((info, objs))
    }

    fn map_zone(&self) -> Result<Mapping, AllocError> {
        if let Some(source) = &self.cfg.zone_source {
            let z = source().map_err(|reason| AllocError::MapFailed { reason })?;
            if z.len() != ZONE_SIZE {
                return Err(AllocError::MapFailed {
                    reason: format!(
                        "the zone source gave {} bytes; a zone is {ZONE_SIZE}",
                        z.len()
                    ),
                });
            }
            return Ok(Mapping::provided(z));
        }
        if self.huge_ok {
            if let Some(m) = lock(&self.spare).take() {
                return Ok(m);
            }
            match map_hugepage(&self.cfg) {
                Ok(m) => return Ok(m),
                Err(reason) if self.cfg.hugepages == HugepageMode::Require => {
                    return Err(AllocError::MapFailed { reason })
                }
                Err(reason) => warn_fallback(&reason),
            }
        }
        Mapping::normal(ZONE_SIZE).map_err(|e| AllocError::MapFailed {
            reason: format!("mmap of {ZONE_SIZE} bytes: {e}"),
        })
    }

    fn build_zone(&self, mapping: Mapping, class: usize) -> ZoneBox {
        let size = self.classes[class].size;
        let va = mapping.as_ptr() as usize;
        let backing = mapping.backing();
        let phys = match (backing, self.cfg.iova_mode) {
            (Backing::Hugepage, IovaMode::Auto) => mem::physical_address(va),
            (Backing::Provided, _) => mapping.provided_iova(),
            _ => None,
        };
        let (iova, iova_kind) = match phys {
            Some(pa) => (pa, IovaKind::Physical),
            None => (va as u64, IovaKind::Virtual),
        };
        let objects = mapping.len() / size;
        let info = ZoneInfo {
            index: self.next_zone.fetch_add(1, Ordering::Relaxed),
            va,
            iova,
            len: mapping.len(),
            object_size: size,
            objects,
            iova_kind,
            backing,
        };
        let slab = self.this as *const SlabInner;
        ZoneBox::new(|zp| {
            let base = mapping.as_ptr();
            let metas = (0..objects)
                .map(|i| {
                    // `i * size < len`, so the address stays inside the mapping.
                    let p = NonNull::new(base.wrapping_add(i * size)).expect("mapping is non-null");
                    let at = iova + (i * size) as u64;
                    ObjMeta::slab(zp.cast(), p, at, size, i as u32, class as u8)
                })
                .collect();
            Zone {
                slab,
                info,
                metas,
                _mapping: mapping,
            }
        })
    }

    /// Gives slot `core` up: local lists and queued returns go to the shared pools.
    ///
    /// # Safety
    /// The calling thread owns the slot and stops using it.
    pub(crate) unsafe fn release_slot(&self, core: usize) {
        let slot = &self.slots[core];
        // SAFETY: owner thread; the lists are taken out before any lock is taken.
        let lists: Vec<Vec<ObjPtr>> = unsafe { slot.local() }
            .free
            .iter_mut()
            .map(std::mem::take)
            .collect();
        for (class, list) in lists.into_iter().enumerate() {
            if !list.is_empty() {
                let n = list.len();
                lock(&self.classes[class].free).extend(list);
                // The cache's own reference is still held: never the last.
                self.refs.release(n);
            }
        }
        slot.home.unclaim(|o| self.return_to_pool(o));
    }

    pub(crate) fn claim_slot(&self, core: usize) -> bool {
        let ok = self.slots[core].home.try_claim();
        if ok {
            self.slots[core].used.store(true, Ordering::Relaxed);
        }
        ok
    }

    pub(crate) fn acquire_ref(&self) {
        self.refs.acquire(1);
    }

    /// Drops one lifetime reference, freeing the slab if it was the last.
    ///
    /// # Safety
    /// `this` points to a live `SlabInner` and the caller owns one reference.
    pub(crate) unsafe fn release_ref(this: NonNull<SlabInner>) {
        // SAFETY: live per the contract.
        if unsafe { this.as_ref() }.refs.release(1) {
            // SAFETY: last reference: no handle, cache or object outside the pools is left.
            drop(unsafe { Box::from_raw(this.as_ptr()) });
        }
    }

    fn zone_usage(&self) -> Vec<ZoneUsage> {
        lock(&self.zones)
            .iter()
            .map(|z| ZoneUsage {
                info: z.info.clone(),
                in_use: z.in_use(),
            })
            .collect()
    }

    fn core_stats(&self, i: usize) -> CoreStats {
        let s = &self.slots[i];
        CoreStats {
            core: i,
            active: s.home.is_claimed(),
            allocs: s.allocs.load(Ordering::Relaxed),
            alloc_failures: s.failures.load(Ordering::Relaxed),
            local_frees: s.local_frees.load(Ordering::Relaxed),
            remote_frees: s.home.remote_frees(),
        }
    }

    pub(crate) fn core_stats_of(&self, core: usize) -> CoreStats {
        self.core_stats(core)
    }
}

fn pressure_bit(class: usize) -> u64 {
    1 << class.min(63)
}

/// Maps one hugepage zone as configured, or says why not.
fn map_hugepage(cfg: &SlabConfig) -> Result<Mapping, String> {
    match &cfg.hugetlbfs_path {
        Some(dir) => {
            mem::check_hugetlbfs(dir)?;
            Mapping::hugetlbfs_file(dir, &cfg.file_prefix, ZONE_SIZE).map_err(|e| {
                format!(
                    "mapping a 2 MiB file in {}: {e} (free hugepages?)",
                    dir.display()
                )
            })
        }
        None => Mapping::anon_hugepage(ZONE_SIZE).map_err(|e| {
            format!("MAP_HUGETLB mmap of 2 MiB: {e} (check /proc/sys/vm/nr_hugepages)")
        }),
    }
}

thread_local! {
    /// The slab and core slot this thread owns, if any: its *current* cache, which
    /// [`crate::alloc`] uses and releases on this thread go straight back to. Set only
    /// while that `CoreCache` lives on this thread (it holds a slab reference, so the
    /// pointer stays valid).
    static CURRENT: Cell<Option<(NonNull<SlabInner>, usize)>> = const { Cell::new(None) };
}

/// The slot the calling thread owns, if any.
pub(crate) fn current_slot() -> Option<(NonNull<SlabInner>, usize)> {
    // During thread teardown the key may be gone: then nothing is owned here any more.
    CURRENT.try_with(Cell::get).ok().flatten()
}

/// Makes slot `core` of `inner` the calling thread's current slot unless it has one.
/// The caller has just claimed the slot for a `CoreCache` on this thread.
pub(crate) fn set_current_if_none(inner: NonNull<SlabInner>, core: usize) {
    if current_slot().is_none() {
        CURRENT.with(|c| c.set(Some((inner, core))));
    }
}

/// Forgets the calling thread's current slot if it is slot `core` of `inner` (its
/// `CoreCache` is being dropped).
pub(crate) fn clear_current(inner: NonNull<SlabInner>, core: usize) {
    let _ = CURRENT.try_with(|c| {
        if c.get() == Some((inner, core)) {
            c.set(None)
        }
    });
}

/// Takes back a slab object whose last reference was just dropped.
///
/// # Safety
/// `obj` is a slab object whose count just dropped to zero; the caller gives up all use.
pub(crate) unsafe fn recycle(obj: ObjPtr) {
    let meta = obj.meta();
    // SAFETY: the owner of a slab object is the `Zone` `build_zone` made it in (the only
    // place slab metadata is created), and a counted object keeps its slab, and so its
    // zone, alive (`Refs`).
    let zone = unsafe { &*meta.owner.cast::<Zone>() };
    // SAFETY: a zone's `slab` is the `SlabInner` that built it, which frees its zones only
    // when its last reference goes, and this object's reference kept one until now.
    let inner = unsafe { &*zone.slab };
    let home = meta.home.load(Ordering::Relaxed) as usize;
    let class = meta.class as usize;
    let slot = &inner.slots[home];
    let this = NonNull::new(inner.this).expect("set at creation");
    if current_slot() == Some((this, home)) {
        // Home core: straight back to the local list.
        // SAFETY: the thread-local registration says this thread owns the slot; the
        // borrow is short and calls out only to take the class lock.
        let local = unsafe { slot.local() };
        let list = &mut local.free[class];
        list.push(obj);
        CoreSlot::bump(&slot.local_frees);
        if list.len() > inner.cfg.cache_size {
            let spill = list.split_off(list.len() / 2);
            inner.spill(class, spill);
        }
        let pressure = inner.pressure.load(Ordering::Relaxed);
        if pressure != 0 {
            // SAFETY: this thread owns the slot (as above), and `list`, the borrow of its
            // local state, is no longer used.
            unsafe { inner.relieve(home, pressure) };
        }
    } else {
        // Another core: keep the slab alive while we touch its queue, then go home.
        inner.acquire_ref();
        slot.home.push_remote(obj, |o| inner.return_to_pool(o));
        // SAFETY: we own the reference taken above.
        unsafe { SlabInner::release_ref(this) };
    }
}

/// A slab of zones over 2 MiB (huge)pages. Cheap to clone (a shared handle); `Send + Sync`.
///
/// Memory is mapped zone by zone on demand, up to the configured limit. The slab's memory
/// stays mapped until the last handle, core cache **and** buffer is gone, so dropping a
/// `Slab` while buffers are alive is safe (it warns with a leak report).
pub struct Slab {
    inner: NonNull<SlabInner>,
}

// SAFETY: `Slab` is a counted pointer to a `SlabInner`, which is Send + Sync.
unsafe impl Send for Slab {}
// SAFETY: `&Slab` only reaches the `SlabInner` through `&`, and `SlabInner` is Sync.
unsafe impl Sync for Slab {}

impl Slab {
    /// Creates a slab. With hugepages preferred or required, this maps one hugepage
    /// zone up front to find out whether hugepages work (it becomes the first zone).
    pub fn new(cfg: SlabConfig) -> Result<Slab, SlabError> {
        let raw = Box::into_raw(Box::new(SlabInner::new(cfg)?));
        // SAFETY: `raw` is a fresh allocation nobody else has seen yet.
        unsafe { (*raw).this = raw };
        Ok(Slab {
            inner: NonNull::new(raw).expect("Box pointers are non-null"),
        })
    }

    pub(crate) fn inner(&self) -> &SlabInner {
        // SAFETY: a handle holds a reference, so the inner is live.
        unsafe { self.inner.as_ref() }
    }

    pub(crate) fn inner_ptr(&self) -> NonNull<SlabInner> {
        self.inner
    }

    /// Makes a handle from a reference the caller already took.
    ///
    /// # Safety
    /// `inner` is live and the caller transfers one `refs` reference to the new handle.
    pub(crate) unsafe fn from_inner(inner: NonNull<SlabInner>) -> Slab {
        // SAFETY: live per the contract.
        unsafe { inner.as_ref() }
            .handles
            .fetch_add(1, Ordering::Relaxed);
        Slab { inner }
    }

    /// The configuration (size classes sorted).
    pub fn config(&self) -> &SlabConfig {
        &self.inner().cfg
    }

    /// `true` when new zones are mapped from hugepages.
    pub fn uses_hugepages(&self) -> bool {
        self.inner().huge_ok
    }

    /// Maps `zones` more zones for the class of `object_size` bytes now (e.g. before
    /// registering memory with a device). Returns how many were mapped before an error.
    pub fn reserve(&self, object_size: usize, zones: usize) -> Result<usize, AllocError> {
        let inner = self.inner();
        let largest = inner.classes.last().map_or(0, |c| c.size);
        let class = inner.class_for(object_size).ok_or(AllocError::TooLarge {
            requested: object_size,
            largest,
        })?;
        for done in 0..zones {
            if let Err(e) = inner.grow(class) {
                return if done == 0 { Err(e) } else { Ok(done) };
            }
        }
        Ok(zones)
    }

    /// Maps `zones` new zones for the class of `object_size` bytes and lends them whole
    /// to the caller, e.g. as the data buffers of a DPDK mempool: their objects never
    /// enter the free lists, count as in use (one reference each, held by the lease)
    /// and go back to the slab's shared pool when the [`ZoneLease`] drops. The zone
    /// hook sees them like any other zone. On error the zones mapped so far are
    /// returned to the pool.
    pub fn lease_zones(&self, object_size: usize, zones: usize) -> Result<ZoneLease, AllocError> {
        let inner = self.inner();
        let largest = inner.classes.last().map_or(0, |c| c.size);
        let class = inner.class_for(object_size).ok_or(AllocError::TooLarge {
            requested: object_size,
            largest,
        })?;
        let mut lease = ZoneLease {
            slab: self.clone(),
            class,
            zones: Vec::with_capacity(zones),
            objs: Vec::new(),
        };
        for _ in 0..zones {
            let (info, objs) = inner.add_zone(class)?;
            for o in &objs {
                o.meta().refcnt.init_one();
            }
            // Objects outside the pools keep the slab alive (see `Refs`).
            inner.refs.acquire(objs.len());
            lease.objs.extend(objs);
            lease.zones.push(info);
        }
        Ok(lease)
    }

    /// Every zone mapped so far, with VA, IOVA and length: what a device must register.
    /// New zones are announced through [`SlabConfig::zone_hook`].
    pub fn zones(&self) -> Vec<ZoneInfo> {
        lock(&self.inner().zones)
            .iter()
            .map(|z| z.info.clone())
            .collect()
    }

    /// Every zone with its count of referenced objects.
    pub fn zone_usage(&self) -> Vec<ZoneUsage> {
        self.inner().zone_usage()
    }

    /// Counters and occupancy.
    pub fn stats(&self) -> SlabStats {
        let inner = self.inner();
        let usage = inner.zone_usage();
        let classes = inner
            .classes
            .iter()
            .map(|c| {
                let zs = usage.iter().filter(|z| z.info.object_size == c.size);
                ClassStats {
                    object_size: c.size,
                    zones: c.zones.load(Ordering::Relaxed),
                    objects: zs.clone().map(|z| z.info.objects).sum(),
                    in_use: zs.map(|z| z.in_use).sum(),
                    in_shared_pool: lock(&c.free).len(),
                }
            })
            .collect();
        let cores = (0..inner.slots.len())
            .filter(|&i| {
                let s = &inner.slots[i];
                s.used.load(Ordering::Relaxed) || s.home.remote_frees() > 0
            })
            .map(|i| inner.core_stats(i))
            .collect();
        SlabStats {
            zones: usage.len(),
            hugepage_zones: usage
                .iter()
                .filter(|z| z.info.backing == Backing::Hugepage)
                .count(),
            mapped_bytes: usage.iter().map(|z| z.info.len).sum(),
            classes,
            cores,
        }
    }

    /// Objects still referenced, by zone.
    pub fn leak_report(&self) -> LeakReport {
        let zones: Vec<ZoneUsage> = self
            .inner()
            .zone_usage()
            .into_iter()
            .filter(|z| z.in_use > 0)
            .collect();
        LeakReport {
            objects_in_use: zones.iter().map(|z| z.in_use).sum(),
            bytes_in_use: zones.iter().map(|z| z.in_use * z.info.object_size).sum(),
            zones,
        }
    }
}

impl Clone for Slab {
    fn clone(&self) -> Self {
        self.inner().refs.acquire(1);
        // SAFETY: live, and we just took the reference the new handle owns.
        unsafe { Slab::from_inner(self.inner) }
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        let inner = self.inner();
        if inner.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            let report = self.leak_report();
            if !report.is_clean() {
                let msg = format!(
                    "{report}; the last Slab handle was dropped, memory stays mapped until they are released"
                );
                if log::max_level() >= log::LevelFilter::Warn {
                    log::warn!("{msg}");
                } else {
                    eprintln!("{msg}");
                }
            }
        }
        // SAFETY: this handle owns one reference and gives it up.
        unsafe { SlabInner::release_ref(self.inner) };
    }
}

impl fmt::Debug for Slab {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slab")
            .field("hugepages", &self.uses_hugepages())
            .field("zones", &lock(&self.inner().zones).len())
            .finish()
    }
}

/// Whole zones lent out of a slab by [`Slab::lease_zones`]. `Send + Sync`; the objects
/// return to the slab's shared pool when the lease drops, so whoever uses the memory
/// (a device's mempool) must be done with it by then.
pub struct ZoneLease {
    slab: Slab,
    class: usize,
    zones: Vec<ZoneInfo>,
    objs: Vec<ObjPtr>,
}

// SAFETY: the lease owns its objects exclusively (count 1, in no free list) and only
// touches them in `drop`; `&ZoneLease` exposes zone descriptions only.
unsafe impl Sync for ZoneLease {}

impl ZoneLease {
    /// The leased zones, in mapping order.
    pub fn zones(&self) -> &[ZoneInfo] {
        &self.zones
    }

    /// Object size of the leased zones' class.
    pub fn object_size(&self) -> usize {
        self.slab.inner().classes[self.class].size
    }

    /// Objects in all leased zones.
    pub fn objects(&self) -> usize {
        self.objs.len()
    }

    /// The slab the zones belong to.
    pub fn slab(&self) -> &Slab {
        &self.slab
    }
}

impl Drop for ZoneLease {
    fn drop(&mut self) {
        let inner = self.slab.inner();
        let objs = std::mem::take(&mut self.objs);
        let n = objs.len();
        for o in &objs {
            // The lease's reference is the only one: this brings the count to zero.
            let last = o.meta().refcnt.release();
            debug_assert!(last);
        }
        lock(&inner.classes[self.class].free).extend(objs);
        // The lease's own `Slab` handle is still held: never the last reference.
        inner.refs.release(n);
    }
}

impl fmt::Debug for ZoneLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZoneLease")
            .field("zones", &self.zones.len())
            .field("objects", &self.objs.len())
            .finish()
    }
}
