//! Crash cleanup: removes everything carrying a prefix, whoever created it.

use crate::error::{Error, Result};
use crate::prefix::Prefix;
use crate::sys;
use crate::topology::remove_dpdk_files;

/// What [`sweep`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Namespaces deleted.
    pub namespaces: Vec<String>,
    /// Root-namespace interfaces deleted.
    pub links: Vec<String>,
    /// Processes killed (inside the namespaces, plus impairment daemons).
    pub processes: usize,
    /// DPDK runtime dirs and hugepage files removed.
    pub dpdk_files: usize,
    /// Whether the state dir existed and was removed.
    pub state_dir: bool,
}

impl SweepReport {
    /// True when nothing was left to remove.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.links.is_empty()
            && self.processes == 0
            && self.dpdk_files == 0
            && !self.state_dir
    }
}

/// Removes every namespace, root-namespace interface, process inside those namespaces,
/// impairment daemon, DPDK runtime file and state file that carries `prefix`.
/// Safe to run at any time; a no-op when nothing is left.
pub fn sweep(prefix: &Prefix) -> Result<SweepReport> {
    sys::preflight()?;
    let mut rep = SweepReport::default();
    let start = format!("{prefix}-");

    // Impairment daemons first (they also live in the namespaces, but a pid file may
    // point at one whose namespace is already gone).
    for r in crate::records::persistent_impairments(prefix) {
        if crate::records::stop_impair_daemon(prefix, &r.link) {
            rep.processes += 1;
        }
    }

    let mut first_err: Option<Error> = None;
    for ns in sys::netns_list()? {
        if ns.starts_with(&start) {
            rep.processes += sys::netns_pids(&ns).len();
            match sys::netns_delete(&ns) {
                Ok(()) => rep.namespaces.push(ns),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
    }
    for link in sys::link_names(None)? {
        if link.starts_with(&start) {
            match sys::ip(&["link", "del", &link]) {
                Ok(_) => rep.links.push(link),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
    }
    rep.dpdk_files = remove_dpdk_files(&start);
    let dir = prefix.state_dir();
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| Error::io_path("removing state dir", &dir, e))?;
        rep.state_dir = true;
    }
    first_err.map_or(Ok(rep), Err)
}

/// Everything with `prefix` that still exists: namespaces, root interfaces, state dir,
/// DPDK files. Empty after a successful [`sweep`].
pub fn leftovers(prefix: &Prefix) -> Result<Vec<String>> {
    let start = format!("{prefix}-");
    let mut v = Vec::new();
    for ns in sys::netns_list()? {
        if ns.starts_with(&start) {
            v.push(format!("namespace {ns}"));
        }
    }
    for l in sys::link_names(None)? {
        if l.starts_with(&start) {
            v.push(format!("interface {l}"));
        }
    }
    if prefix.state_dir().exists() {
        v.push(format!("state dir {}", prefix.state_dir().display()));
    }
    for dir in ["/var/run/dpdk", "/dev/hugepages"] {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(&start) {
                    v.push(format!("dpdk file {}", e.path().display()));
                }
            }
        }
    }
    Ok(v)
}
