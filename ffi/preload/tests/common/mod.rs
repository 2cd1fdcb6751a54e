//! What the tests that run an unmodified program under the shim on the tap topology share:
//! the skip rule, the shim's path, r2c's configuration for the tap port, and bounded child
//! processes with their output.

#![allow(dead_code)] // each test file uses its own part

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use testbed::Tap;

pub fn skip(why: &str) -> bool {
    eprintln!("SKIPPED: {why}");
    true
}

/// True (after saying why) when the test cannot run here: not root, or one of `tools`
/// (paths) missing.
pub fn cannot_run(tools: &[&str]) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip("needs root (namespaces, DPDK)");
    }
    for tool in tools {
        if !Path::new(tool).exists() {
            return skip(&format!(
                "{tool} is missing: run `make setup` (testbed/setup.sh installs it)"
            ));
        }
    }
    false
}

/// The `libluna_preload.so` cargo built for this test run (in `deps/`, next to the test
/// binary; `target/<profile>/` holds a copy only after `cargo build`).
pub fn shim() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let so = exe.parent().expect("deps dir").join("libluna_preload.so");
    assert!(
        so.exists(),
        "{} is missing: cargo builds it with this test",
        so.display()
    );
    so
}

/// r2c's configuration for the tap port: one poll thread, yielding when idle (shared CPUs).
pub fn config(tap: &Tap) -> String {
    let mut port = tap.dpdk.clone();
    port.eal.memory_mb = 128;
    let mut eal = port.eal.args();
    eal.push("--no-telemetry".into());
    let name = port
        .eal
        .vdev
        .split(',')
        .next()
        .expect("vdev name")
        .to_string();
    let eal: Vec<String> = eal.iter().map(|a| format!("{a:?}")).collect();
    format!(
        "eal = [{}]\n\n[device]\nkind = \"dpdk\"\nport = \"{name}\"\n\n[cores]\nlist = [0]\n\n\
         [net]\nip = \"{}\"\nprefix_len = {}\n\n[runtime]\nmode = \"batch\"\nidle = \"yield\"\npin = false\n",
        eal.join(", "),
        port.ip,
        port.prefix_len
    )
}

/// `program` with `args` under the shim in the tap topology's DPDK namespace, with
/// `config` as its `LUNA_CONFIG`; stdout and stderr piped.
pub fn spawn_under_shim(tap: &Tap, config: &Path, program: &str, args: &[&str]) -> Child {
    let mut cmd = testbed::netns_command(&tap.dpdk.netns, "env");
    cmd.arg(format!("LD_PRELOAD={}", shim().display()))
        .arg(format!("LUNA_CONFIG={}", config.display()))
        .arg(program)
        .args(args);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn()
        .unwrap_or_else(|e| panic!("spawn {program}: {e}"))
}

pub struct Out {
    pub ok: bool,
    pub out: String,
    pub err: String,
}

/// Waits for `c` at most `limit` (then kills it) and collects its output.
pub fn output(mut c: Child, limit: Duration, what: &str) -> Out {
    let mut so = c.stdout.take().expect("piped");
    let mut se = c.stderr.take().expect("piped");
    let t1 = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t2 = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let end = Instant::now() + limit;
    let status = loop {
        if let Ok(Some(s)) = c.try_wait() {
            break Some(s);
        }
        if Instant::now() > end {
            eprintln!("{what}: killed after {limit:?}");
            let _ = c.kill();
            let _ = c.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Out {
        ok: status.is_some_and(|s| s.success()),
        out: t1.join().unwrap_or_default(),
        err: t2.join().unwrap_or_default(),
    }
}

/// Runs `cmd` to its end (at most `limit`).
pub fn run(mut cmd: Command, limit: Duration, what: &str) -> Out {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let c = cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    output(c, limit, what)
}

/// Sends `sig` to `child` (a process of ours not yet waited for).
pub fn signal(child: &Child, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    // SAFETY: kill has no memory preconditions; the child is not reaped yet, so the pid
    // is still its.
    unsafe { libc::kill(pid, sig) };
}
