//! The records `testbed netem` leaves in a prefix's state dir for each link it impaired
//! (`impair-<link>.json`, plus the engine daemon's log), and stopping that daemon. Below
//! the topologies, whose teardown stops their links' daemons, and below `daemon`, which
//! writes the records; public through [`crate::daemon`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::impair::{Backend, Impairment};
use crate::prefix::Prefix;
use crate::sys;

/// What `testbed netem` recorded for one link.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PersistentImpairment {
    /// The link name (`k1`, `tap`, ...).
    pub link: String,
    /// What is applied.
    pub impairment: Impairment,
    /// How.
    pub backend: Backend,
    /// The engine daemon's pid (nfqueue backend with per-packet work).
    pub pid: Option<u32>,
}

/// The record of `link`'s impairment.
pub(crate) fn spec_file(prefix: &Prefix, link: &str) -> PathBuf {
    prefix.state_dir().join(format!("impair-{link}.json"))
}

/// Where `link`'s engine daemon writes its stderr.
pub(crate) fn log_file(prefix: &Prefix, link: &str) -> PathBuf {
    prefix.state_dir().join(format!("impair-{link}.log"))
}

fn is_our_daemon(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            let c = String::from_utf8_lossy(&c);
            c.contains("impaird")
        })
        .unwrap_or(false)
}

/// Stops daemon `pid`: SIGTERM, then SIGKILL after 2 s; returns within about 4 s.
pub(crate) fn terminate(pid: u32) {
    let p = Pid::from_raw(pid as i32);
    if kill(p, Signal::SIGTERM).is_err() {
        return;
    }
    let gone = || !Path::new(&format!("/proc/{pid}")).exists() || !is_our_daemon(pid);
    if !sys::wait_until(Duration::from_secs(2), gone) {
        let _ = kill(p, Signal::SIGKILL);
        sys::wait_until(Duration::from_secs(2), gone);
    }
}

/// Stops the daemon recorded for `link` (if it is still ours) and removes its files.
/// Returns whether a daemon was stopped.
pub fn stop_impair_daemon(prefix: &Prefix, link: &str) -> bool {
    let spec = spec_file(prefix, link);
    let rec: Option<PersistentImpairment> = std::fs::read_to_string(&spec)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok());
    let _ = std::fs::remove_file(&spec);
    let _ = std::fs::remove_file(log_file(prefix, link));
    match rec.and_then(|r| r.pid) {
        Some(pid) if is_our_daemon(pid) => {
            terminate(pid);
            true
        }
        _ => false,
    }
}

/// Impairments recorded by `testbed netem` under `prefix`.
pub fn persistent_impairments(prefix: &Prefix) -> Vec<PersistentImpairment> {
    let Ok(rd) = std::fs::read_dir(prefix.state_dir()) else {
        return Vec::new();
    };
    let mut v: Vec<PersistentImpairment> = rd
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("impair-") && n.ends_with(".json")
        })
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|s| serde_json::from_str(&s).ok())
        .collect();
    v.sort_by(|a, b| a.link.cmp(&b.link));
    v
}
