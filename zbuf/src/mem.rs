//! Raw memory: zone mappings (anonymous hugepages, hugetlbfs files, normal pages) and
//! physical-address lookup. The crate's unsafe code is here (mmap, page lookup) and in
//! the object, slab, cache, release, buffer and DPDK modules, each block with its SAFETY
//! comment.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// `statfs.f_type` of hugetlbfs.
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

/// What a zone's memory is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// One 2 MiB hugepage: physically contiguous, one TLB entry.
    Hugepage,
    /// Normal pages (fallback): not physically contiguous, IOVA is the virtual address.
    Normal,
    /// Memory handed to the slab by a [`crate::SlabConfig::zone_source`] (e.g. DPDK
    /// memzones, which memif's zero-copy mode can share with its peer); its IOVA is what
    /// the source said.
    Provided,
}

/// Released by a [`ProvidedZone`] when the slab frees it.
type ZoneRelease = Box<dyn FnOnce() + Send + Sync>;

/// One zone's memory from a [`crate::SlabConfig::zone_source`].
pub struct ProvidedZone {
    ptr: NonNull<u8>,
    len: usize,
    iova: Option<u64>,
    release: Option<ZoneRelease>,
}

impl ProvidedZone {
    /// `len` bytes at `ptr` (the slab takes exactly [`crate::ZONE_SIZE`]), with the IOVA
    /// of the first byte if known; `release` runs once when the slab frees the zone. The
    /// slab zero-fills the bytes before using them (they need not be initialized).
    ///
    /// # Safety
    /// `ptr..ptr + len` must be readable and writable memory that nothing else uses
    /// until `release` runs (the slab hands its bytes out as buffers), and, when `iova`
    /// is given, contiguous in IOVA space from that address.
    pub unsafe fn new(
        ptr: NonNull<u8>,
        len: usize,
        iova: Option<u64>,
        release: impl FnOnce() + Send + Sync + 'static,
    ) -> ProvidedZone {
        ProvidedZone {
            ptr,
            len,
            iova,
            release: Some(Box::new(release)),
        }
    }

    /// Start address.
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the zone is empty (never accepted by the slab).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for ProvidedZone {
    fn drop(&mut self) {
        if let Some(r) = self.release.take() {
            r();
        }
    }
}

impl std::fmt::Debug for ProvidedZone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProvidedZone")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .field("iova", &self.iova)
            .finish()
    }
}

/// One owned zone of memory: an `mmap` region, unmapped on drop, or a provided zone,
/// released on drop.
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
    provided: Option<ProvidedZone>,
}

// SAFETY: the mapping is plain memory owned by this value; it has no thread affinity.
unsafe impl Send for Mapping {}
// SAFETY: a provided zone is plain memory owned by this value (its release closure is
// `Send + Sync`); it has no thread affinity.
unsafe impl Send for ProvidedZone {}
// SAFETY: `ProvidedZone` only hands out its address; it never reads or writes the memory.
unsafe impl Sync for ProvidedZone {}
// SAFETY: `Mapping` only hands out its address; it never reads or writes the memory.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Anonymous `MAP_HUGETLB` memory, populated so a missing hugepage fails here and
    /// not with SIGBUS on first touch.
    pub(crate) fn anon_hugepage(len: usize) -> io::Result<Mapping> {
        let flags = libc::MAP_PRIVATE
            | libc::MAP_ANONYMOUS
            | libc::MAP_HUGETLB
            | libc::MAP_HUGE_2MB
            | libc::MAP_POPULATE;
        Self::map(len, flags, -1, Backing::Hugepage)
    }

    /// Normal anonymous pages.
    pub(crate) fn normal(len: usize) -> io::Result<Mapping> {
        Self::map(
            len,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            Backing::Normal,
        )
    }

    /// A file in a hugetlbfs mount, mapped shared and unlinked at once.
    pub(crate) fn hugetlbfs_file(dir: &Path, prefix: &str, len: usize) -> io::Result<Mapping> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(name);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        // Unlink first: the mapping keeps the pages, and nothing is left behind on any exit.
        let _ = std::fs::remove_file(&path);
        file.set_len(len as u64)?;
        Self::map(
            len,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            file.as_raw_fd(),
            Backing::Hugepage,
        )
    }

    fn map(len: usize, flags: i32, fd: i32, backing: Backing) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping at an address of the kernel's choosing (addr = NULL)
        // cannot alias any Rust object; `fd` is either -1 (anonymous) or an open file.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(Mapping {
            ptr,
            len,
            backing,
            provided: None,
        })
    }

    /// A provided zone (released, not unmapped, on drop), zero-filled like a fresh
    /// mapping: the slab hands head- and tailroom bytes to safe code to read, so they must
    /// be initialized, and [`ProvidedZone::new`] does not ask its caller for that (e.g.
    /// memory from `std::alloc::alloc` or a reused DPDK memzone).
    pub(crate) fn provided(z: ProvidedZone) -> Mapping {
        // SAFETY: per `ProvidedZone::new`'s contract `ptr..ptr+len` is writable and used by
        // nobody else until the zone is released; no object of it is handed out yet.
        unsafe { std::ptr::write_bytes(z.ptr.as_ptr(), 0, z.len) };
        Mapping {
            ptr: z.ptr,
            len: z.len,
            backing: Backing::Provided,
            provided: Some(z),
        }
    }

    /// The IOVA a provided zone came with.
    pub(crate) fn provided_iova(&self) -> Option<u64> {
        self.provided.as_ref().and_then(|z| z.iova)
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn backing(&self) -> Backing {
        self.backing
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.provided.is_some() {
            // ProvidedZone's own drop releases it.
            return;
        }
        // SAFETY: `ptr/len` is exactly the region returned by mmap and owned by `self`;
        // the slab drops a mapping only when no object in it is referenced.
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        debug_assert_eq!(rc, 0, "munmap failed: {}", io::Error::last_os_error());
    }
}

/// Checks that `dir` exists and is a hugetlbfs mount.
pub(crate) fn check_hugetlbfs(dir: &Path) -> Result<(), String> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| format!("{} contains a NUL byte", dir.display()))?;
    // SAFETY: statfs only writes into `st`, a plain C struct for which all-zero is valid.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out pointer.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(format!(
            "hugetlbfs path {}: {}",
            dir.display(),
            io::Error::last_os_error()
        ));
    }
    if st.f_type as i64 != HUGETLBFS_MAGIC {
        return Err(format!("{} is not a hugetlbfs mount", dir.display()));
    }
    Ok(())
}

/// Physical address of `va` from `/proc/self/pagemap`, or `None` when the page is not
/// present or PFNs are hidden (no CAP_SYS_ADMIN: the kernel then reports PFN 0).
pub(crate) fn physical_address(va: usize) -> Option<u64> {
    const PFN_MASK: u64 = (1 << 55) - 1;
    const PRESENT: u64 = 1 << 63;
    let page = page_size();
    let file = File::open("/proc/self/pagemap").ok()?;
    let mut entry = [0u8; 8];
    file.read_exact_at(&mut entry, (va / page * 8) as u64)
        .ok()?;
    let e = u64::from_ne_bytes(entry);
    let pfn = e & PFN_MASK;
    if e & PRESENT == 0 || pfn == 0 {
        return None;
    }
    Some(pfn * page as u64 + (va % page) as u64)
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
