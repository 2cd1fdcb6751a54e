//! Role children of the DPDK tests: the test binary re-executed inside a testbed
//! namespace with its role in the environment (the ignored `role_child` test of each
//! binary is the entry point), its output collected and its end awaited with a bound.
//! Each child prints an `OK key=value...` line.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testbed::DpdkPort;

/// The role a child plays (unset in the parent).
pub const ROLE: &str = "R2C_TEST_ROLE";
/// The child's `DpdkPort`, as JSON.
pub const PORT_JSON: &str = "R2C_TEST_PORT";
/// A role's argument.
pub const ARG: &str = "R2C_TEST_ARG";

/// This test binary as a role child inside `port`'s namespace.
pub fn role_command(role: &str, port: &DpdkPort, arg: &str) -> Command {
    // Hugepages are shared: the children's pools need far less than the testbed's default.
    let mut port = port.clone();
    port.eal.memory_mb = 64;
    let exe = std::env::current_exe().expect("test binary");
    let mut c = testbed::netns_command(&port.netns, exe);
    c.args(["role_child", "--exact", "--ignored", "--nocapture"])
        .env(ROLE, role)
        .env(PORT_JSON, serde_json::to_string(&port).expect("json"))
        .env(ARG, arg);
    c
}

pub struct Proc {
    child: std::process::Child,
    what: String,
    out: std::thread::JoinHandle<String>,
    err: std::thread::JoinHandle<String>,
}

fn reader(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = r.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    })
}

pub fn spawn(mut cmd: Command, what: &str) -> Proc {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let out = reader(child.stdout.take().expect("piped"));
    let err = reader(child.stderr.take().expect("piped"));
    Proc {
        child,
        what: what.into(),
        out,
        err,
    }
}

/// How a child process ended.
pub struct Outcome {
    pub what: String,
    pub ok: bool,
    pub out: String,
    pub err: String,
}

impl Proc {
    /// The child's pid (`ip netns exec` and `taskset` exec the program: it is the
    /// program's pid).
    #[allow(dead_code)] // only the attack suite reads it
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `limit`, then kills this child (by its pid).
    pub fn wait(mut self, limit: Duration) -> Outcome {
        let end = Instant::now() + limit;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() > end => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(_) => break None,
            }
        };
        Outcome {
            what: format!("{} (status {status:?})", self.what),
            ok: status.is_some_and(|s| s.success()),
            out: self.out.join().unwrap_or_default(),
            err: self.err.join().unwrap_or_default(),
        }
    }
}

/// The line starting with `want` from each outcome, in order; panics with every
/// process's output if one failed.
pub fn lines(all: &[(&Outcome, &str)]) -> Vec<String> {
    let found: Vec<Option<String>> = all
        .iter()
        .map(|(o, want)| {
            o.ok.then(|| {
                o.out
                    .lines()
                    .find(|l| l.starts_with(want))
                    .map(str::to_owned)
            })
            .flatten()
        })
        .collect();
    if found.iter().any(Option::is_none) {
        let mut msg = String::from("a process failed\n");
        for (o, _) in all {
            msg += &format!(
                "=== {}\n--- stdout\n{}\n--- stderr\n{}\n",
                o.what, o.out, o.err
            );
        }
        panic!("{msg}");
    }
    let found: Vec<String> = found.into_iter().flatten().collect();
    for (l, (o, _)) in found.iter().zip(all) {
        println!("{}: {l}", o.what);
    }
    found
}

/// The number after `key=` in an `OK` line.
pub fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line}"))
}

/// Starts role `role` (its argument: the path of a ready file) on the tap topology's
/// DPDK side, waits until the child has started its port (starting it resets the tap
/// interface; the child then writes the ready file) and configures the kernel side.
/// Removes the ready file again when the child is done ([`TapChild::wait`]).
pub fn spawn_on_tap(topo: &testbed::Topology, role: &str, what: &str) -> TapChild {
    let t = topo.tap().expect("tap details");
    let ready = topo.state_dir().join(format!("r2c-{role}-ready"));
    let _ = std::fs::remove_file(&ready);
    let proc = spawn(
        role_command(role, &t.dpdk, &ready.display().to_string()),
        what,
    );
    let end = Instant::now() + Duration::from_secs(60);
    while !ready.exists() {
        assert!(
            Instant::now() < end,
            "the DPDK process did not open its port"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    t.configure_host(Duration::from_secs(30))
        .expect("tap interface from the DPDK process");
    TapChild { proc, ready }
}

/// A role child on a tap topology (see [`spawn_on_tap`]).
pub struct TapChild {
    proc: Proc,
    ready: std::path::PathBuf,
}

impl TapChild {
    #[allow(dead_code)] // only the attack suite reads it
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    pub fn wait(self, limit: Duration) -> Outcome {
        let o = self.proc.wait(limit);
        let _ = std::fs::remove_file(&self.ready);
        o
    }
}
