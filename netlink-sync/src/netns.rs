//! A private two-namespace veth topology for the tests and `nl-latency` (needs root and
//! `ip`).
//!
//! `<prefix>-nl<pid>-<n>h` (the "host", where the syncer runs) holds `nl0` with
//! 198.18.0.1/24; `<prefix>-nl<pid>-<n>p` (a kernel peer) holds `nl1` with 198.18.0.2/24.
//! The prefix is the testbed's (`$LUNA_TESTBED_PREFIX`, default `luna`), so the testbed's
//! sweep finds leftovers. Both namespaces are deleted on drop, also when a test panics.

use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The host side's interface.
pub const HOST_IF: &str = "nl0";
/// The peer side's interface.
pub const PEER_IF: &str = "nl1";
/// The host's address.
pub const HOST_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The peer's address.
pub const PEER_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

/// Two network namespaces joined by a veth pair; removed on drop.
#[derive(Debug)]
pub struct TestNet {
    /// The host namespace's name.
    pub host: String,
    /// The peer namespace's name.
    pub peer: String,
}

fn prefix() -> String {
    match std::env::var("LUNA_TESTBED_PREFIX") {
        Ok(p) if !p.is_empty() => p,
        _ => "luna".to_string(),
    }
}

/// Runs `ip <args>`; an error carries its stderr.
pub fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl TestNet {
    /// Creates the namespaces, the veth pair, addresses, and brings the links up.
    pub fn new() -> io::Result<TestNet> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let base = format!("{}-nl{}-{}", prefix(), std::process::id(), n);
        let net = TestNet {
            host: format!("{base}h"),
            peer: format!("{base}p"),
        };
        // From here on, drop cleans up whatever was made.
        ip(&["netns", "add", &net.host])?;
        ip(&["netns", "add", &net.peer])?;
        net.host_ip(&[
            "link", "add", HOST_IF, "type", "veth", "peer", "name", PEER_IF, "netns", &net.peer,
        ])?;
        net.host_ip(&["addr", "add", "198.18.0.1/24", "dev", HOST_IF])?;
        net.peer_ip(&["addr", "add", "198.18.0.2/24", "dev", PEER_IF])?;
        for (ns, dev) in [(&net.host, HOST_IF), (&net.peer, PEER_IF)] {
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(net)
    }

    /// `ip -n <host> <args>`.
    pub fn host_ip(&self, args: &[&str]) -> io::Result<()> {
        let mut a = vec!["-n", self.host.as_str()];
        a.extend_from_slice(args);
        ip(&a)
    }

    /// `ip -n <peer> <args>`.
    pub fn peer_ip(&self, args: &[&str]) -> io::Result<()> {
        let mut a = vec!["-n", self.peer.as_str()];
        a.extend_from_slice(args);
        ip(&a)
    }

    /// The MAC address of the peer's interface.
    pub fn peer_mac(&self) -> io::Result<[u8; 6]> {
        let out = Command::new("ip")
            .args(["-n", &self.peer, "-br", "link", "show", PEER_IF])
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        // `nl1@if2  UP  72:8f:16:83:07:86 <BROADCAST,...>`
        let field = text
            .split_whitespace()
            .nth(2)
            .ok_or_else(|| io::Error::other(format!("no MAC in {text:?}")))?;
        let mut mac = [0u8; 6];
        let mut parts = field.split(':');
        for b in &mut mac {
            let part = parts
                .next()
                .ok_or_else(|| io::Error::other(format!("bad MAC {field:?}")))?;
            *b = u8::from_str_radix(part, 16)
                .map_err(|_| io::Error::other(format!("bad MAC {field:?}")))?;
        }
        Ok(mac)
    }

    /// `ip -n <host> -force -batch -` fed `commands` (one `ip` command per line).
    pub fn host_batch(&self, commands: &str) -> io::Result<()> {
        use std::io::Write;
        let mut child = Command::new("ip")
            .args(["-n", &self.host, "-force", "-batch", "-"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .ok_or_else(|| io::Error::other("no stdin"))?
            .write_all(commands.as_bytes())?;
        let out = child.wait_with_output()?;
        if out.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "ip -batch: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    /// Runs `f` on a new thread that has joined the host namespace (sockets it opens stay
    /// there wherever they are used later).
    pub fn in_host<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        in_netns(&self.host, f)
    }
}

/// Runs `f` on a new thread inside the named namespace (`/run/netns/<name>`).
pub fn in_netns<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    let file = File::open(format!("/run/netns/{name}"))?;
    std::thread::scope(|s| {
        s.spawn(move || {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(io::Error::from)?;
            Ok(f())
        })
        .join()
        .map_err(|_| io::Error::other("thread in namespace panicked"))?
    })
}

impl Drop for TestNet {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veth end and with it the pair.
        let _ = ip(&["netns", "del", &self.host]);
        let _ = ip(&["netns", "del", &self.peer]);
    }
}
