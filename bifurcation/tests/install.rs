//! rte_flow install on PMDs without a usable flow API falls back to software with one
//! clear line. Each case runs `bifurcation install` in its own process (one EAL per
//! process); needs root and hugepages (the testbed has both).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_bifurcation");

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `cmd` with a hard timeout (killed after it).
fn run(mut cmd: Command, limit: Duration) -> Out {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn bifurcation");
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let code = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st.code();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("bifurcation install timed out after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Out {
        code,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}

fn eal(tag: &str, vdev: String) -> Vec<String> {
    vec![
        "--no-pci".into(),
        "--in-memory".into(),
        "--no-telemetry".into(),
        format!("--file-prefix=bif-{}-{tag}", std::process::id()),
        vdev,
    ]
}

fn fallback_lines(o: &Out, port: &str) -> Vec<String> {
    let head = format!("bifurcation: port {port}: no hardware steering (");
    o.stderr
        .lines()
        .filter(|l| l.starts_with(&head))
        .map(str::to_owned)
        .collect()
}

#[test]
fn memif_has_no_flow_api_and_falls_back_with_one_line() {
    let sock = format!("/tmp/bif-install-{}.sock", std::process::id());
    let mut cmd = Command::new(BIN);
    cmd.args(["install", "--port", "net_memif0", "--threads", "1", "--"])
        .args(eal(
            "memif",
            format!("--vdev=net_memif0,role=server,socket={sock}"),
        ));
    let o = run(cmd, Duration::from_secs(60));
    let _ = std::fs::remove_file(&sock);
    assert_eq!(o.code, Some(0), "{}\n{}", o.stdout, o.stderr);
    let lines = fallback_lines(&o, "net_memif0");
    assert_eq!(lines.len(), 1, "exactly one fallback line:\n{}", o.stderr);
    assert!(lines[0].contains("rte_flow_isolate"), "{}", lines[0]);
    assert!(
        lines[0].contains("falling back to software"),
        "{}",
        lines[0]
    );
    assert!(
        o.stdout
            .contains("steering: software on net_memif0 (1 rules compiled, none installed)"),
        "{}",
        o.stdout
    );
}

/// net_tap accepts isolation but its flow API needs tc flower, which this kernel lacks:
/// rule creation fails, isolation is undone, and the port falls back. (On a kernel with
/// flower the rules may be created: then the hardware line is checked instead.)
#[test]
fn tap_without_flower_falls_back_and_undoes_isolation() {
    let ns = format!("bif-inst-{}", std::process::id());
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    let st = Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .expect("ip");
    assert!(st.success(), "ip netns add {ns}");
    struct Del(String);
    impl Drop for Del {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _del = Del(ns.clone());
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns, BIN])
        .args(["install", "--port", "net_tap0", "--threads", "2", "--"])
        .args(eal("tap", "--vdev=net_tap0,iface=bifinst0".into()));
    let o = run(cmd, Duration::from_secs(60));
    assert_eq!(o.code, Some(0), "{}\n{}", o.stdout, o.stderr);
    let lines = fallback_lines(&o, "net_tap0");
    if o.stdout.contains("steering: hardware") {
        assert!(lines.is_empty(), "{}", o.stderr);
        return;
    }
    assert_eq!(lines.len(), 1, "exactly one fallback line:\n{}", o.stderr);
    assert!(
        lines[0].contains("isolation turned off again"),
        "{}",
        lines[0]
    );
    assert!(
        o.stdout.contains("steering: software on net_tap0"),
        "{}",
        o.stdout
    );
}

#[test]
fn bad_config_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("bif-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("bad.toml");
    std::fs::write(
        &f,
        "[traffic]\nlisten_tcp = [22]\napps = [{ name = \"a\" }]\n",
    )
    .unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("check").arg(&f);
    let o = run(cmd, Duration::from_secs(30));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(o.code, Some(1));
    assert!(
        o.stderr.contains("traffic model `traffic.listen_tcp`"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("kernel's ports"), "{}", o.stderr);
}

/// After the fallback, the software path classifies what the kernel really sends out of
/// the tap: SYNs to luna's client and listening ports are luna's, the SYN to ssh and the
/// UDP datagram (UDP is not luna's on client ports) are the kernel's, nothing is dropped.
#[test]
fn tap_software_path_classifies_the_kernels_frames() {
    let ns = format!("bif-scn-{}", std::process::id());
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    let st = Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .expect("ip");
    assert!(st.success(), "ip netns add {ns}");
    struct Del(String);
    impl Drop for Del {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _del = Del(ns.clone());
    let mut cmd = Command::new("ip");
    cmd.args([
        "netns",
        "exec",
        &ns,
        env!("CARGO_BIN_EXE_bifurcation-scenario"),
        "tap-classify",
        "--iface",
        "bifscn0",
        "--kernel-addr",
        "198.18.0.1/24",
        "--luna-ip",
        "198.18.0.2",
        "--ms",
        "3000",
        "--",
    ])
    .args(eal("scn", "--vdev=net_tap0,iface=bifscn0".into()));
    let o = run(cmd, Duration::from_secs(60));
    assert_eq!(o.code, Some(0), "{}\n{}", o.stdout, o.stderr);
    let line = o
        .stdout
        .lines()
        .find(|l| l.starts_with("OK "))
        .unwrap_or("");
    let count = |k: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    if line.contains("steering software") {
        assert_eq!(fallback_lines(&o, "net_tap0").len(), 1, "{}", o.stderr);
    }
    assert!(count("luna.client") >= 1, "{line}");
    assert!(count("luna.listener") >= 1, "{line}");
    assert!(count("kernel.tcp_port") >= 1, "{line}");
    assert!(count("kernel.udp_port") >= 1, "{line}");
    assert!(!line.contains("drop."), "{line}");
}
