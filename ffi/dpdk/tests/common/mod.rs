//! Shared helpers: spawn the scenario binary (one EAL per process) with a
//! hard timeout and parse its one-line verdict.
#![allow(dead_code)]

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_dpdk-sys-scenario");

/// Unique EAL file prefix for this test process and tag (prefix `ldp`).
pub fn prefix(tag: &str) -> String {
    format!("ldp-{}-{tag}", std::process::id())
}

/// EAL arguments every scenario gets: no PCI, no shared files, own prefix.
pub fn eal_base(tag: &str) -> Vec<String> {
    vec![
        "--no-pci".into(),
        "--in-memory".into(),
        "--no-telemetry".into(),
        format!("--file-prefix={}", prefix(tag)),
    ]
}

/// Removes EAL's runtime directory for a prefix when dropped (a child that
/// failed before cleanup leaves it behind).
pub struct RunDirGuard(pub String);

impl Drop for RunDirGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/{}", self.0));
    }
}

pub struct Running {
    child: Child,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
    what: String,
}

#[derive(Debug)]
pub struct Outcome {
    pub what: String,
    pub code: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
}

fn reader<R: Read + Send + 'static>(mut r: R) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = r.read_to_end(&mut b);
        String::from_utf8_lossy(&b).into_owned()
    })
}

/// `dpdk-sys-scenario <scenario args> -- <eal>`
pub fn scenario(args: &[&str], eal: &[String]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args).arg("--").args(eal);
    c
}

pub fn spawn(mut cmd: Command) -> Running {
    let what = format!("{cmd:?}");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {what}: {e}"));
    let out = child.stdout.take().map(reader);
    let err = child.stderr.take().map(reader);
    Running {
        child,
        out,
        err,
        what,
    }
}

impl Running {
    /// Waits up to `limit`; kills the child (by its own pid) if it overruns.
    pub fn wait(mut self, limit: Duration) -> Outcome {
        let end = Instant::now() + limit;
        let mut timed_out = false;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() >= end => {
                    timed_out = true;
                    let _ = self.child.kill();
                    break self.child.wait().ok();
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break None,
            }
        };
        Outcome {
            what: self.what,
            code: status.and_then(|s| s.code()),
            timed_out,
            stdout: self
                .out
                .take()
                .and_then(|h| h.join().ok())
                .unwrap_or_default(),
            stderr: self
                .err
                .take()
                .and_then(|h| h.join().ok())
                .unwrap_or_default(),
        }
    }
}

pub fn run(cmd: Command, limit: Duration) -> Outcome {
    spawn(cmd).wait(limit)
}

impl Outcome {
    fn verdict(&self) -> &str {
        self.stdout
            .lines()
            .rev()
            .find(|l| l.starts_with("OK ") || l.starts_with("ERROR "))
            .unwrap_or("")
    }

    fn context(&self) -> String {
        format!(
            "{}\nexit code {:?}, timed out {}\n--- stdout\n{}\n--- stderr\n{}",
            self.what, self.code, self.timed_out, self.stdout, self.stderr
        )
    }

    /// Asserts a clean success and returns the `OK` line.
    pub fn ok(&self) -> String {
        assert!(!self.timed_out, "timed out: {}", self.context());
        assert_eq!(self.code, Some(0), "expected success: {}", self.context());
        let v = self.verdict();
        assert!(v.starts_with("OK "), "no OK line: {}", self.context());
        v.to_owned()
    }

    /// Asserts a clean, reported failure of `kind` (exit 1, no panic, no
    /// signal, no hang) and returns the error text (with DPDK log lines).
    pub fn error(&self, kind: &str) -> String {
        assert!(!self.timed_out, "hung: {}", self.context());
        assert_eq!(
            self.code,
            Some(1),
            "expected a reported error (exit 1), not a crash/panic: {}",
            self.context()
        );
        assert!(
            !self.stderr.contains("panicked"),
            "panicked: {}",
            self.context()
        );
        let start = self
            .stdout
            .find("ERROR kind=")
            .unwrap_or_else(|| panic!("no ERROR line: {}", self.context()));
        let text = &self.stdout[start..];
        let want = format!("ERROR kind={kind}:");
        assert!(
            text.starts_with(&want),
            "expected {want}: {}",
            self.context()
        );
        text.to_owned()
    }
}
