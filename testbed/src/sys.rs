//! Thin wrappers over iproute2, sysctl and friends. Every external command goes through
//! one private `run` helper, so failures carry the command line and its stderr.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Fails with [`Error::NotRoot`] unless the effective uid is 0.
pub fn require_root() -> Result<()> {
    if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err(Error::NotRoot)
    }
}

/// Finds `tool` in PATH, or fails naming the Debian `package` that ships it.
pub fn find_tool(tool: &'static str, package: &'static str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(tool))
        .find(|p| is_executable(p))
        .ok_or(Error::MissingTool { tool, package })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The checks every state-changing entry point makes first: root, and `ip` present.
pub fn preflight() -> Result<()> {
    require_root()?;
    find_tool("ip", "iproute2")?;
    Ok(())
}

/// A `Command` that runs `program` inside network namespace `netns` (`ip netns exec`).
/// Add arguments, then spawn it as usual.
pub fn netns_command(netns: &str, program: impl AsRef<OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", netns]).arg(program);
    c
}

/// Like [`netns_command`], pinned to one CPU core with `taskset -c <core>`.
pub fn netns_command_pinned(netns: &str, core: usize, program: impl AsRef<OsStr>) -> Command {
    let mut c = netns_command(netns, "taskset");
    c.arg("-c").arg(core.to_string()).arg(program);
    c
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` to completion; returns its stdout, or an error with its stderr.
pub(crate) fn run(cmd: &mut Command) -> Result<String> {
    let line = describe(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::io(format!("spawning `{line}`"), e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Command {
            cmd: line,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// `ip <args>` in the root namespace.
pub(crate) fn ip(args: &[&str]) -> Result<String> {
    run(Command::new("ip").args(args))
}

/// `ip -n <netns> <args>`.
pub(crate) fn ip_in(netns: &str, args: &[&str]) -> Result<String> {
    run(Command::new("ip").args(["-n", netns]).args(args))
}

/// `<program> <args>` inside `netns`.
pub(crate) fn exec_in(netns: &str, program: &str, args: &[&str]) -> Result<String> {
    run(netns_command(netns, program).args(args))
}

/// Names of all network namespaces (`ip netns list`).
pub fn netns_list() -> Result<Vec<String>> {
    let out = ip(&["netns", "list"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// Whether network namespace `name` exists.
pub fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// Creates `name` unless it exists, brings its loopback up and silences IPv6 autoconf.
pub(crate) fn netns_ensure(name: &str) -> Result<()> {
    if !netns_exists(name) {
        ip(&["netns", "add", name])?;
    }
    // IPv6 off by default for every interface created later in this namespace (the DPDK
    // tap included), so captures show only what the test sent.
    for key in [
        "net.ipv6.conf.default.disable_ipv6",
        "net.ipv6.conf.all.disable_ipv6",
    ] {
        sysctl_in(name, key, "1")?;
    }
    ip_in(name, &["link", "set", "lo", "up"])?;
    Ok(())
}

/// `sysctl -w key=value` inside `netns`; a key the kernel lacks (no IPv6) is not an error.
pub(crate) fn sysctl_in(netns: &str, key: &str, value: &str) -> Result<()> {
    let proc_path = format!("/proc/sys/{}", key.replace('.', "/"));
    match exec_in(netns, "sysctl", &["-q", "-w", &format!("{key}={value}")]) {
        Ok(_) => Ok(()),
        Err(_) if !Path::new(&proc_path).exists() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Deletes network namespace `name` after killing every process still inside it.
pub(crate) fn netns_delete(name: &str) -> Result<()> {
    if !netns_exists(name) {
        return Ok(());
    }
    kill_netns_pids(name);
    match ip(&["netns", "del", name]) {
        Ok(_) => Ok(()),
        Err(_) if !netns_exists(name) => Ok(()),
        Err(e) => Err(e),
    }
}

/// SIGKILLs the processes living in `netns` and waits briefly for them to go.
pub(crate) fn kill_netns_pids(netns: &str) {
    let pids = netns_pids(netns);
    if pids.is_empty() {
        return;
    }
    for &pid in &pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline
        && pids
            .iter()
            .any(|p| Path::new(&format!("/proc/{p}")).exists())
    {
        thread::sleep(Duration::from_millis(20));
    }
}

/// Pids of processes whose network namespace is `netns` (`ip netns pids`).
pub fn netns_pids(netns: &str) -> Vec<i32> {
    ip(&["netns", "pids", netns])
        .map(|out| {
            out.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether interface `name` exists in `netns` (or the root namespace for `None`).
pub(crate) fn link_exists(netns: Option<&str>, name: &str) -> bool {
    let r = match netns {
        Some(ns) => ip_in(ns, &["link", "show", "dev", name]),
        None => ip(&["link", "show", "dev", name]),
    };
    r.is_ok()
}

/// Interface `name` in `netns` as `ip -o link show` reports it: whether it is
/// administratively up (`UP` among its flags) and its MAC (`link/ether …`, lower case;
/// `None` without one). `None` when the interface is missing.
pub(crate) fn link_state(netns: &str, name: &str) -> Option<(bool, Option<String>)> {
    let out = ip_in(netns, &["-o", "link", "show", "dev", name]).ok()?;
    let flags = out.split_once('<')?.1.split_once('>')?.0;
    let up = flags.split(',').any(|f| f == "UP");
    let mut words = out.split_whitespace();
    let mac = words
        .find(|w| *w == "link/ether")
        .and_then(|_| words.next())
        .map(str::to_ascii_lowercase);
    Some((up, mac))
}

/// Interface names in `netns` (or the root namespace for `None`).
pub fn link_names(netns: Option<&str>) -> Result<Vec<String>> {
    let out = match netns {
        Some(ns) => ip_in(ns, &["-o", "link", "show"])?,
        None => ip(&["-o", "link", "show"])?,
    };
    // Lines look like `7: name@peer: <FLAGS> ...`.
    Ok(out
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .collect())
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes.
pub(crate) fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}
