//! One process per tap interface.
//!
//! net_tap opens `/dev/net/tun` with `IFF_MULTI_QUEUE` and the `iface=` name: if another
//! process already has that interface open, the kernel attaches the newcomer as extra
//! queues and spreads the traffic over both, which cuts the first process off. Before
//! `rte_eal_init` probes the vdevs, each `iface=` of a net_tap/net_tun vdev is claimed:
//!
//! * an exclusive `flock` on `/run/luna/tap-<netns inode>-<iface>.lock` (holding our pid),
//!   kept for the life of the process and released by the kernel when it dies, so a
//!   crashed process never blocks a restart;
//! * a look through `/proc/*/fdinfo` for a tun file of another process in the same network
//!   namespace attached to that interface (a DPDK program that is not ours, e.g. testpmd).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::eal::comm_of;
use crate::error::{Error, ErrorKind, Result};

/// Where the per-interface lock files live.
pub const LOCK_DIR: &str = "/run/luna";

/// Locks held for the life of the process (EAL cannot be initialised twice anyway).
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// The tap interface names the net_tap / net_tun vdevs in `args` open (`iface=`).
pub fn tap_ifaces(args: &[String]) -> Vec<String> {
    tap_vdevs(args)
        .into_iter()
        .map(|(_, iface)| iface)
        .collect()
}

/// The interface `port` (a net_tap / net_tun vdev's name, e.g. `net_tap0`) opens, when
/// its vdev in `args` names one (`iface=`).
pub fn tap_iface_of(args: &[String], port: &str) -> Option<String> {
    tap_vdevs(args)
        .into_iter()
        .find_map(|(name, iface)| (name == port).then_some(iface))
}

/// `(vdev name, iface)` of every net_tap / net_tun vdev in `args` with an `iface=`.
fn tap_vdevs(args: &[String]) -> Vec<(String, String)> {
    let mut vdevs = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix("--vdev=") {
            vdevs.push(v.to_owned());
        } else if a == "--vdev" {
            if let Some(v) = it.next() {
                vdevs.push(v.clone());
            }
        }
    }
    vdevs
        .iter()
        .filter_map(|v| {
            let mut parts = v.split(',');
            let name = parts.next()?;
            if !(name.starts_with("net_tap") || name.starts_with("net_tun")) {
                return None;
            }
            parts
                .find_map(|kv| kv.strip_prefix("iface="))
                .filter(|i| !i.is_empty())
                .map(|i| (name.to_owned(), i.to_owned()))
        })
        .collect()
}

fn netns_inode(pid: &str) -> Option<u64> {
    std::fs::metadata(format!("/proc/{pid}/ns/net"))
        .ok()
        .map(|m| m.ino())
}

/// Another live process in our network namespace with a tun file attached to `iface`.
fn tun_owner(iface: &str) -> Option<i32> {
    let me = std::process::id() as i32;
    let ns = netns_inode("self")?;
    let want = format!("iff:\t{iface}");
    for p in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me || netns_inode(&pid.to_string()) != Some(ns) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).ok().as_deref() != Some(Path::new("/dev/net/tun")) {
                continue;
            }
            let info = format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy());
            if std::fs::read_to_string(info).is_ok_and(|s| s.lines().any(|l| l == want)) {
                return Some(pid);
            }
        }
    }
    None
}

fn busy(iface: &str, pid: Option<i32>, how: &str) -> Error {
    let who = match pid {
        Some(p) => format!("process pid {p}{}", comm_of(p)),
        None => "another process".to_string(),
    };
    Error::new(
        ErrorKind::InterfaceBusy,
        format!("EAL init (net_tap iface={iface})"),
        format!(
            "tap interface {iface} is already open in {who} ({how}); a second process would take \
             it over and cut the first off"
        ),
    )
    .with_fix(
        "stop that process, or give this one another iface= (one DPDK process per tap interface)",
    )
}

fn lock_path(iface: &str) -> Option<PathBuf> {
    let ns = netns_inode("self")?;
    Some(Path::new(LOCK_DIR).join(format!("tap-{ns}-{iface}.lock")))
}

/// Claims every tap interface in `args` for this process, or fails naming the interface
/// and the process that has it.
pub(crate) fn claim(args: &[String]) -> Result<()> {
    for iface in tap_ifaces(args) {
        if let Some(path) = lock_path(&iface) {
            // No lock directory (not root): the /proc check below still runs.
            let file = std::fs::create_dir_all(LOCK_DIR).and_then(|_| {
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&path)
            });
            if let Ok(mut f) = file {
                // SAFETY: `f` is an open fd for the duration of the call.
                let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
                if r != 0 {
                    let mut s = String::new();
                    let _ = f.read_to_string(&mut s);
                    let pid = s.trim().parse().ok().or_else(|| tun_owner(&iface));
                    return Err(busy(&iface, pid, &format!("it holds {}", path.display())));
                }
                let _ = f.set_len(0);
                let _ = f.rewind();
                let _ = writeln!(f, "{}", std::process::id());
                HELD.lock().unwrap_or_else(|p| p.into_inner()).push(f);
            }
        }
        if let Some(pid) = tun_owner(&iface) {
            return Err(busy(&iface, Some(pid), "it has the tun device attached"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn tap_ifaces_from_both_vdev_spellings() {
        let args = v(&[
            "--vdev=net_tap0,iface=a0,mac=02:00:00:00:00:01",
            "--vdev",
            "net_tap1,mac=x,iface=b1",
            "--vdev=net_memif0,socket=/tmp/s",
            "--vdev=net_af_packet0,iface=c2",
            "--vdev=net_tap2",
            "--vdev=net_tun0,iface=d3",
        ]);
        assert_eq!(tap_ifaces(&args), v(&["a0", "b1", "d3"]));
        assert_eq!(tap_iface_of(&args, "net_tap1").as_deref(), Some("b1"));
        assert_eq!(tap_iface_of(&args, "net_memif0"), None);
    }
}
