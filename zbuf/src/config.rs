//! Slab configuration.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::error::SlabError;
use crate::zone_info::ZoneInfo;

/// Size of one zone: one 2 MiB hugepage.
pub const ZONE_SIZE: usize = 2 * 1024 * 1024;

/// Upper bound for [`SlabConfig::max_cores`] (each core id costs a cache-line-padded slot).
pub const MAX_CORES: usize = 4096;

/// Whether zones are backed by hugepages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HugepageMode {
    /// Use hugepages; if they are unavailable use normal pages and warn once.
    #[default]
    Prefer,
    /// Use hugepages or fail ([`SlabError::HugepagesUnavailable`] at creation,
    /// [`crate::AllocError::MapFailed`] when a later zone cannot be mapped).
    Require,
    /// Normal 4 KiB pages only (tests, machines without hugepages).
    Never,
}

/// Which address a zone reports as its IOVA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IovaMode {
    /// Physical address from `/proc/self/pagemap` for hugepage zones when readable
    /// (needs CAP_SYS_ADMIN); otherwise the virtual address, flagged as such.
    #[default]
    Auto,
    /// Always the virtual address (DPDK `--iova-mode=va`, or an IOMMU mapping VA=IOVA).
    Va,
}

/// Called once for every new zone before any object of it is handed out; an `Err`
/// unmaps the zone and fails the allocation with [`crate::AllocError::ZoneRejected`].
/// This is where DMA registration (DPDK `rte_extmem_register`) will go. It runs on the
/// allocating thread and must not allocate from the same slab.
pub type ZoneHook = Arc<dyn Fn(&ZoneInfo) -> Result<(), String> + Send + Sync>;

/// Called once for every zone the hook accepted, right before the zone is unmapped (when
/// the slab's memory is freed): where DMA registrations are undone. Runs on the thread
/// that releases the slab's last reference.
pub type ZoneReleaseHook = Arc<dyn Fn(&ZoneInfo) + Send + Sync>;

/// Called for every new zone instead of mapping memory: returns exactly
/// [`ZONE_SIZE`] bytes (e.g. a DPDK memzone, see `zbuf::dpdk::DmaRegistry::dpdk_memory_slab_config`).
/// An `Err` fails the allocation with [`crate::AllocError::MapFailed`].
pub type ZoneSource = Arc<dyn Fn() -> Result<crate::ProvidedZone, String> + Send + Sync>;

/// Configuration of a [`crate::Slab`], built with chained setters:
///
/// ```
/// use zbuf::{HugepageMode, Slab, SlabConfig};
/// let cfg = SlabConfig::new()
///     .size_classes(&[2048, 4096, 16384])
///     .headroom(128)
///     .max_memory(64 << 20)
///     .hugepages(HugepageMode::Never);
/// let slab = Slab::new(cfg).unwrap();
/// # drop(slab);
/// ```
#[derive(Clone)]
pub struct SlabConfig {
    pub(crate) size_classes: Vec<usize>,
    pub(crate) headroom: usize,
    pub(crate) max_memory: usize,
    pub(crate) max_zones: usize,
    pub(crate) hugepages: HugepageMode,
    pub(crate) hugetlbfs_path: Option<PathBuf>,
    pub(crate) file_prefix: String,
    pub(crate) iova_mode: IovaMode,
    pub(crate) max_cores: usize,
    pub(crate) cache_size: usize,
    pub(crate) zone_hook: Option<ZoneHook>,
    pub(crate) zone_release_hook: Option<ZoneReleaseHook>,
    pub(crate) zone_source: Option<ZoneSource>,
}

impl Default for SlabConfig {
    fn default() -> Self {
        SlabConfig {
            size_classes: vec![2048, 4096, 16384, 65536],
            headroom: 128,
            max_memory: 1 << 30,
            max_zones: usize::MAX,
            hugepages: HugepageMode::Prefer,
            hugetlbfs_path: None,
            file_prefix: "zbuf".to_string(),
            iova_mode: IovaMode::Auto,
            max_cores: 64,
            cache_size: 256,
            zone_hook: None,
            zone_release_hook: None,
            zone_source: None,
        }
    }
}

impl fmt::Debug for SlabConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlabConfig")
            .field("size_classes", &self.size_classes)
            .field("headroom", &self.headroom)
            .field("max_memory", &self.max_memory)
            .field("max_zones", &self.max_zones)
            .field("hugepages", &self.hugepages)
            .field("hugetlbfs_path", &self.hugetlbfs_path)
            .field("file_prefix", &self.file_prefix)
            .field("iova_mode", &self.iova_mode)
            .field("max_cores", &self.max_cores)
            .field("cache_size", &self.cache_size)
            .field("zone_hook", &self.zone_hook.is_some())
            .field("zone_release_hook", &self.zone_release_hook.is_some())
            .field("zone_source", &self.zone_source.is_some())
            .finish()
    }
}

impl SlabConfig {
    /// Defaults: classes 2 KiB, 4 KiB, 16 KiB, 64 KiB; headroom 128 B; 1 GiB max;
    /// hugepages preferred; anonymous mappings; 64 cores; 256 cached objects per class per core.
    pub fn new() -> Self {
        Self::default()
    }

    /// Object sizes. Each must be a multiple of 64 between 64 and 2 MiB; they are sorted.
    pub fn size_classes(mut self, sizes: &[usize]) -> Self {
        self.size_classes = sizes.to_vec();
        self
    }

    /// Default headroom reserved in front of the body by [`crate::CoreCache::alloc`].
    pub fn headroom(mut self, bytes: usize) -> Self {
        self.headroom = bytes;
        self
    }

    /// Upper bound on mapped memory (rounded down to whole 2 MiB zones).
    pub fn max_memory(mut self, bytes: usize) -> Self {
        self.max_memory = bytes;
        self
    }

    /// Upper bound on the number of zones (applies together with `max_memory`).
    pub fn max_zones(mut self, zones: usize) -> Self {
        self.max_zones = zones;
        self
    }

    /// Hugepage policy.
    pub fn hugepages(mut self, mode: HugepageMode) -> Self {
        self.hugepages = mode;
        self
    }

    /// Shorthand: `true` is [`HugepageMode::Require`], `false` is [`HugepageMode::Prefer`].
    pub fn require_hugepages(self, require: bool) -> Self {
        self.hugepages(if require {
            HugepageMode::Require
        } else {
            HugepageMode::Prefer
        })
    }

    /// Map zones from files in this hugetlbfs mount (e.g. `/dev/hugepages`) instead of
    /// anonymous `MAP_HUGETLB` memory. The files are unlinked right after mapping.
    pub fn hugetlbfs_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.hugetlbfs_path = Some(path.into());
        self
    }

    /// Prefix of hugetlbfs file names (`<prefix>-<pid>-<n>`).
    pub fn file_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.file_prefix = prefix.into();
        self
    }

    /// IOVA policy.
    pub fn iova_mode(mut self, mode: IovaMode) -> Self {
        self.iova_mode = mode;
        self
    }

    /// Number of core ids (`0..max_cores`) that may own a [`crate::CoreCache`].
    pub fn max_cores(mut self, n: usize) -> Self {
        self.max_cores = n;
        self
    }

    /// Free objects a core keeps per class before it returns half to the shared pool.
    pub fn cache_size(mut self, n: usize) -> Self {
        self.cache_size = n;
        self
    }

    /// Hook run for each new zone (see [`ZoneHook`]).
    pub fn zone_hook(
        mut self,
        hook: impl Fn(&ZoneInfo) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self.zone_hook = Some(Arc::new(hook));
        self
    }

    /// Hook run for each accepted zone before it is unmapped (see [`ZoneReleaseHook`]).
    pub fn zone_release_hook(mut self, hook: impl Fn(&ZoneInfo) + Send + Sync + 'static) -> Self {
        self.zone_release_hook = Some(Arc::new(hook));
        self
    }

    /// Take every zone's memory from `source` instead of mapping it (hugepage settings
    /// are then ignored). See [`ZoneSource`].
    pub fn zone_source(
        mut self,
        source: impl Fn() -> Result<crate::ProvidedZone, String> + Send + Sync + 'static,
    ) -> Self {
        self.zone_source = Some(Arc::new(source));
        self
    }

    /// Zones this configuration allows.
    pub fn zone_limit(&self) -> usize {
        (self.max_memory / ZONE_SIZE).min(self.max_zones)
    }

    /// Checks the configuration; [`crate::Slab::new`] calls this.
    pub fn validate(&self) -> Result<(), SlabError> {
        let bad = |m: String| Err(SlabError::Config(m));
        if self.size_classes.is_empty() {
            return bad("no size classes".into());
        }
        for &s in &self.size_classes {
            if !(64..=ZONE_SIZE).contains(&s) || s % 64 != 0 {
                return bad(format!(
                    "size class {s} must be a multiple of 64 between 64 and {ZONE_SIZE}"
                ));
            }
        }
        let mut sorted = self.size_classes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != self.size_classes.len() {
            return bad("duplicate size classes".into());
        }
        if sorted.len() > u8::MAX as usize {
            return bad("at most 255 size classes".into());
        }
        if self.headroom >= *sorted.last().unwrap_or(&0) {
            return bad(format!(
                "headroom {} leaves no room in the largest class",
                self.headroom
            ));
        }
        if self.zone_limit() == 0 {
            return bad(format!(
                "max_memory {} / max_zones {} allow no 2 MiB zone",
                self.max_memory, self.max_zones
            ));
        }
        if !(1..=MAX_CORES).contains(&self.max_cores) {
            return bad(format!(
                "max_cores {} must be in 1..={MAX_CORES}",
                self.max_cores
            ));
        }
        if self.cache_size == 0 {
            return bad("cache_size must be at least 1".into());
        }
        if self.file_prefix.is_empty() || self.file_prefix.contains('/') {
            return bad(format!(
                "file_prefix {:?} must be non-empty without '/'",
                self.file_prefix
            ));
        }
        Ok(())
    }
}
