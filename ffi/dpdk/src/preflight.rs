//! Hugepage / hugetlbfs checks made before `rte_eal_init`, so the most common
//! setup mistake gets a precise message instead of EAL's generic failure.
//!
//! The decision ([`check`]) is a pure function of the EAL arguments and a
//! [`HugeEnv`] snapshot; [`HugeEnv::probe`] reads the real system.

use std::path::{Path, PathBuf};

use crate::error::{Error, ErrorKind, Result};

const STEP: &str = "EAL preflight (hugepages)";
const RESERVE_FIX: &str = "reserve them: `make setup` or `echo 1024 > /proc/sys/vm/nr_hugepages`";
const MOUNT_FIX: &str =
    "mount one: `make setup` or `mkdir -p /dev/hugepages && mount -t hugetlbfs nodev /dev/hugepages`";
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

/// One hugepage size's pool (from /sys/kernel/mm/hugepages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HugePool {
    /// Page size in KiB.
    pub page_kib: u64,
    /// Reserved pages (nr_hugepages).
    pub total: u64,
    /// Free pages.
    pub free: u64,
}

/// What the system offers: hugetlbfs mounts and hugepage pools.
#[derive(Debug, Clone, Default)]
pub struct HugeEnv {
    /// Mount points of hugetlbfs from /proc/mounts.
    pub mounts: Vec<PathBuf>,
    /// Pools per page size.
    pub pools: Vec<HugePool>,
    /// For `--huge-dir D`: whether D is on hugetlbfs (statfs), filled by probe.
    pub huge_dir_is_hugetlbfs: Option<bool>,
}

impl HugeEnv {
    /// Reads /proc/mounts, /sys/kernel/mm/hugepages and statfs(--huge-dir).
    pub fn probe(args: &[String]) -> HugeEnv {
        let mounts = std::fs::read_to_string("/proc/mounts")
            .map(|s| parse_mounts(&s))
            .unwrap_or_default();
        let mut pools = Vec::new();
        if let Ok(dir) = std::fs::read_dir("/sys/kernel/mm/hugepages") {
            for ent in dir.flatten() {
                let name = ent.file_name().to_string_lossy().into_owned();
                let Some(kib) = name
                    .strip_prefix("hugepages-")
                    .and_then(|s| s.strip_suffix("kB"))
                    .and_then(|s| s.parse().ok())
                else {
                    continue;
                };
                let read = |f: &str| -> u64 {
                    std::fs::read_to_string(ent.path().join(f))
                        .ok()
                        .and_then(|s| s.trim().parse().ok())
                        .unwrap_or(0)
                };
                pools.push(HugePool {
                    page_kib: kib,
                    total: read("nr_hugepages"),
                    free: read("free_hugepages"),
                });
            }
        }
        pools.sort_by_key(|p| p.page_kib);
        let huge_dir_is_hugetlbfs =
            arg_value(args, "--huge-dir").map(|d| is_hugetlbfs(Path::new(&d)));
        HugeEnv {
            mounts,
            pools,
            huge_dir_is_hugetlbfs,
        }
    }

    fn free_bytes(&self) -> u64 {
        self.pools.iter().map(|p| p.free * p.page_kib * 1024).sum()
    }

    fn free_summary(&self) -> String {
        if self.pools.is_empty() {
            return "HugePages_Free=0, no hugepage sizes in /sys/kernel/mm/hugepages".into();
        }
        self.pools
            .iter()
            .map(|p| {
                format!(
                    "{} kB pages: HugePages_Free={} of {}",
                    p.page_kib, p.free, p.total
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn is_hugetlbfs(dir: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs writes into the zeroed struct we own; `c` is NUL-terminated.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == HUGETLBFS_MAGIC
    }
}

/// hugetlbfs mount points listed in a /proc/mounts text.
pub fn parse_mounts(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_dev, dir, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "hugetlbfs").then(|| PathBuf::from(dir.replace("\\040", " ")))
        })
        .collect()
}

/// Value of `--opt V` or `--opt=V` (last occurrence wins, as in getopt).
pub(crate) fn arg_value(args: &[String], opt: &str) -> Option<String> {
    let mut found = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == opt {
            found = it.next().cloned();
        } else if let Some(v) = a.strip_prefix(opt).and_then(|r| r.strip_prefix('=')) {
            found = Some(v.to_owned());
        }
    }
    found
}

fn has_flag(args: &[String], flag: &str) -> bool {
    args.iter().any(|a| a == flag)
}

/// Memory (MiB) the arguments ask EAL to preallocate: `-m N` or the sum of `--socket-mem`.
fn requested_mib(args: &[String]) -> Option<u64> {
    if let Some(m) = arg_value(args, "-m") {
        return m.trim().parse().ok();
    }
    arg_value(args, "--socket-mem").map(|s| {
        s.split(',')
            .filter_map(|x| x.trim().parse::<u64>().ok())
            .sum()
    })
}

/// Decides whether EAL can get hugepages with these arguments on this system.
pub fn check(args: &[String], env: &HugeEnv) -> Result<()> {
    if has_flag(args, "--no-huge") {
        return Ok(());
    }
    let in_memory = has_flag(args, "--in-memory");
    if let Some(dir) = arg_value(args, "--huge-dir") {
        if env.huge_dir_is_hugetlbfs != Some(true) {
            return Err(Error::new(
                ErrorKind::Preflight,
                STEP,
                format!("--huge-dir {dir} is not a hugetlbfs mount"),
            )
            .with_fix(format!(
                "point --huge-dir at a hugetlbfs mount ({}), or {MOUNT_FIX}",
                if env.mounts.is_empty() {
                    "none is mounted".to_owned()
                } else {
                    env.mounts
                        .iter()
                        .map(|m| m.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            )));
        }
    } else if env.mounts.is_empty() && !in_memory {
        return Err(Error::new(
            ErrorKind::Preflight,
            STEP,
            "no hugetlbfs is mounted (none in /proc/mounts)",
        )
        .with_fix(MOUNT_FIX));
    }
    let free = env.free_bytes();
    if free == 0 {
        return Err(Error::new(
            ErrorKind::Preflight,
            STEP,
            format!("no hugepages available ({})", env.free_summary()),
        )
        .with_fix(format!(
            "{RESERVE_FIX}; or pass --no-huge for a test without hugepages"
        )));
    }
    if let Some(mib) = requested_mib(args) {
        if mib * 1024 * 1024 > free {
            return Err(Error::new(
                ErrorKind::Preflight,
                STEP,
                format!(
                    "-m/--socket-mem asks for {mib} MiB but only {} MiB of hugepages are free ({})",
                    free / (1024 * 1024),
                    env.free_summary()
                ),
            )
            .with_fix(format!("ask for less memory, or {RESERVE_FIX}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn good_env() -> HugeEnv {
        HugeEnv {
            mounts: vec![PathBuf::from("/dev/hugepages")],
            pools: vec![HugePool {
                page_kib: 2048,
                total: 1024,
                free: 1000,
            }],
            huge_dir_is_hugetlbfs: None,
        }
    }

    #[test]
    fn mounts_are_parsed() {
        let text =
            "proc /proc proc rw 0 0\nnodev /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n\
                    none /mnt/huge\\0401G hugetlbfs rw 0 0\n";
        assert_eq!(
            parse_mounts(text),
            vec![
                PathBuf::from("/dev/hugepages"),
                PathBuf::from("/mnt/huge 1G")
            ]
        );
    }

    #[test]
    fn healthy_system_passes() {
        check(&s(&["--no-pci"]), &good_env()).unwrap();
    }

    #[test]
    fn zero_free_pages_names_the_fix() {
        let mut env = good_env();
        env.pools[0].free = 0;
        let e = check(&s(&[]), &env).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Preflight);
        let msg = e.to_string();
        assert!(msg.contains("HugePages_Free=0"), "{msg}");
        assert!(msg.contains("nr_hugepages"), "{msg}");
    }

    #[test]
    fn no_huge_skips_everything() {
        check(&s(&["--no-huge"]), &HugeEnv::default()).unwrap();
    }

    #[test]
    fn missing_mount_is_reported_unless_in_memory() {
        let mut env = good_env();
        env.mounts.clear();
        let e = check(&s(&[]), &env).unwrap_err();
        assert!(e.to_string().contains("mount -t hugetlbfs"), "{e}");
        check(&s(&["--in-memory"]), &env).unwrap();
    }

    #[test]
    fn huge_dir_must_be_hugetlbfs() {
        let mut env = good_env();
        env.huge_dir_is_hugetlbfs = Some(false);
        let e = check(&s(&["--huge-dir=/tmp/x"]), &env).unwrap_err();
        assert!(
            e.to_string()
                .contains("--huge-dir /tmp/x is not a hugetlbfs mount"),
            "{e}"
        );
        env.huge_dir_is_hugetlbfs = Some(true);
        check(&s(&["--huge-dir", "/tmp/x"]), &env).unwrap();
    }

    #[test]
    fn too_much_memory_requested() {
        let e = check(&s(&["-m", "4096"]), &good_env()).unwrap_err();
        assert!(e.to_string().contains("4096 MiB"), "{e}");
        check(&s(&["--socket-mem=512,512"]), &good_env()).unwrap();
    }

    #[test]
    fn arg_value_forms() {
        assert_eq!(arg_value(&s(&["-m", "64"]), "-m").as_deref(), Some("64"));
        assert_eq!(
            arg_value(&s(&["--huge-dir=/a", "--huge-dir", "/b"]), "--huge-dir").as_deref(),
            Some("/b")
        );
        assert_eq!(arg_value(&s(&["--huge-dir"]), "--huge-dir"), None);
    }
}
