//! `knb raw` end to end: a short memif run produces the JSON keys `make demo`
//! reads, and bad arguments give clear errors (exit 2 from the parser, exit 1
//! for setups the transport cannot do), never a panic or a hang.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

const KNB: &str = env!("CARGO_BIN_EXE_knb");

fn run(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(KNB)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn knb");
    let end = Instant::now() + limit;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            panic!("knb {args:?} did not stop within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn memif_run_reports_table_and_json() {
    let json = std::env::temp_dir().join(format!("ldp-knb-{}.json", std::process::id()));
    let j = json.to_string_lossy().into_owned();
    let o = run(
        &[
            "raw",
            "--transport",
            "memif",
            "--frame-size",
            "4096",
            "--iodepth",
            "4",
            "--duration",
            "0.5",
            "--warmup",
            "0.2",
            "--name-prefix",
            "ldp-knbt",
            "--json",
            &j,
        ],
        Duration::from_secs(90),
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("frames/s") && out.contains("p99 us") && out.contains("memif"),
        "{out}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written"))
            .expect("valid json");
    let _ = std::fs::remove_file(&json);
    for k in ["frames_per_sec", "gbit_per_sec", "rtt_p50_us", "rtt_p99_us"] {
        let x = v[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} missing in {v}"));
        assert!(x > 0.0, "{k} = {x}");
    }
    assert!(v["rtt_p50_us"].as_f64() <= v["rtt_p99_us"].as_f64(), "{v}");
    assert_eq!(
        v["segments_per_frame"], 2,
        "4 KiB frames are two chained mbufs: {v}"
    );
    let gbit = v["frames_per_sec"].as_f64().unwrap() * 4096.0 * 8.0 / 1e9;
    assert!(
        (gbit - v["gbit_per_sec"].as_f64().unwrap()).abs() < 1e-6,
        "{v}"
    );
}

#[test]
fn bad_cli_arguments_are_rejected_clearly() {
    for (args, needle) in [
        (&["raw", "--frame-size", "10000"][..], "not in 64..=9000"),
        (&["raw", "--frame-size", "63"][..], "not in 64..=9000"),
        (&["raw", "--burst", "0"][..], "not in 1..=512"),
        (&["raw", "--iodepth", "0"][..], "not in 1..=4096"),
        (
            &["raw", "--duration", "soon"][..],
            "is not a number of seconds",
        ),
        (&["raw", "--cpus", "0"][..], "expected two CPU numbers"),
        (
            &["raw", "--transport", "infiniband"][..],
            "invalid value 'infiniband'",
        ),
    ] {
        let o = run(args, Duration::from_secs(10));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(needle), "{args:?}: {}", text(&o));
    }
    let o = run(
        &["raw", "--duration", "0", "--name-prefix", "ldp-knbt"],
        Duration::from_secs(10),
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("--duration must be > 0"), "{}", text(&o));
}

#[test]
fn tap_refuses_frames_it_cannot_carry() {
    let o = run(
        &[
            "raw",
            "--transport",
            "tap",
            "--frame-size",
            "4096",
            "--duration",
            "0.5",
            "--warmup",
            "0",
            "--name-prefix",
            "ldp-knbt",
        ],
        Duration::from_secs(90),
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("carries frames of at most 1522 B"),
        "{}",
        text(&o)
    );
}
