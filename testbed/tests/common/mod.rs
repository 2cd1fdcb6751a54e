//! Helpers shared by the testbed's integration tests (they need root).
#![allow(dead_code)]

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use testbed::{DpdkPort, Prefix};

fn base36(mut n: u32) -> String {
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(digits[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap()
}

/// A prefix unique to one test in this process: `lt<tag>p<pid base36>` (at most 10 chars),
/// so concurrent `make test` runs on a shared machine never touch each other's topologies.
/// Leftovers of earlier test processes that died are swept first.
pub fn prefix(tag: &str) -> Prefix {
    assert_eq!(tag.len(), 2, "test tags are two characters");
    sweep_dead_test_prefixes();
    Prefix::new(&format!("lt{tag}p{}", base36(std::process::id()))).expect("valid test prefix")
}

/// Sweeps `lt<tag>p<pid>` prefixes whose process no longer exists.
fn sweep_dead_test_prefixes() {
    let Ok(list) = testbed::sys::netns_list() else {
        return;
    };
    let mut dead = std::collections::BTreeSet::new();
    for ns in list {
        let Some((p, _)) = ns.split_once('-') else {
            continue;
        };
        // Only `lt<tag>p<pid>`: other names (other people's namespaces) are never touched.
        if p.len() < 6 || !p.starts_with("lt") || p.as_bytes()[4] != b'p' {
            continue;
        }
        let Ok(pid) = u32::from_str_radix(&p[5..], 36) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            dead.insert(p.to_string());
        }
    }
    for p in dead {
        if let Ok(p) = Prefix::new(&p) {
            let _ = testbed::sweep(&p);
        }
    }
}

/// Fails the test listing whatever carries `prefix`.
pub fn assert_nothing_left(prefix: &Prefix) {
    let left = testbed::leftovers(prefix).expect("listing leftovers");
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The `testbed` binary built for these tests.
pub fn cli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_testbed"))
}

/// Runs the CLI with `args`, returning its output.
pub fn cli_run(args: &[&str]) -> Output {
    cli()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running testbed")
}

/// A dpdk-testpmd process on one testbed DPDK port; killed on drop.
pub struct Testpmd {
    child: Child,
    pub log: PathBuf,
}

impl Testpmd {
    /// Starts testpmd on `port` in forwarding `mode` (icmpecho, rxonly, txonly, ...).
    /// testpmd needs a forwarding lcore besides the main one, hence `-l 0,1`.
    pub fn spawn(port: &DpdkPort, mode: &str, tag: &str) -> Testpmd {
        let mut port = port.clone();
        port.eal.lcores = "0,1".into();
        let log =
            std::env::temp_dir().join(format!("testbed-testpmd-{tag}-{}.log", std::process::id()));
        let f = File::create(&log).expect("log file");
        let child = port
            .command("dpdk-testpmd")
            .args([
                "--",
                "--no-mlockall",
                "--total-num-mbufs=2048",
                &format!("--forward-mode={mode}"),
                "--auto-start",
                // With a stats period testpmd runs until signalled instead of reading stdin.
                "--stats-period",
                "1",
            ])
            .stdin(Stdio::null())
            .stdout(f.try_clone().expect("dup"))
            .stderr(f)
            .spawn()
            .expect("spawning dpdk-testpmd (package dpdk-dev; run `make setup`)");
        Testpmd { child, log }
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether testpmd is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits until the log contains `needle`, or panics with the log after `timeout`.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.output().contains(needle) {
                return;
            }
            if !self.running() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("testpmd never printed {needle:?}; log:\n{}", self.output());
    }

    /// Stops testpmd (SIGINT for a clean exit, SIGKILL if it hangs) and returns its log.
    pub fn stop(mut self) -> String {
        self.shutdown();
        self.output()
    }

    fn shutdown(&mut self) {
        use nix::sys::signal::{kill, Signal};
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Testpmd {
    fn drop(&mut self) {
        self.shutdown();
        // Keep the log only when the test failed.
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}
