//! `nl-latency --changes 1000 [--readers 2]`: change → visible-on-every-reader latency of
//! `ip route add/del` and `ip neigh replace/del` in a private namespace (root). Prints
//! p50/p90/p99/max; the numbers are only meaningful on a quiet machine.

use std::process::ExitCode;
use std::time::Duration;

fn usage() -> ExitCode {
    eprintln!("usage: nl-latency [--changes N (1..=100000, default 1000)] [--readers K (1..=64, default 2)]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut changes = 1000usize;
    let mut readers = 2usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let value = args.next().and_then(|v| v.parse::<usize>().ok());
        match (a.as_str(), value) {
            ("--changes", Some(v)) if (1..=100_000).contains(&v) => changes = v,
            ("--readers", Some(v)) if (1..=64).contains(&v) => readers = v,
            _ => return usage(),
        }
    }
    let report = match netlink_sync::latency::run(changes, readers) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("nl-latency: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ms = |d: Option<Duration>| {
        d.map_or("-".to_string(), |d| format!("{:.3}", d.as_secs_f64() * 1e3))
    };
    println!(
        "changes {changes} readers {readers} visible {} lost {}",
        report.samples.len(),
        report.lost
    );
    println!(
        "latency_ms p50 {} p90 {} p99 {} max {}",
        ms(report.quantile(0.50)),
        ms(report.quantile(0.90)),
        ms(report.quantile(0.99)),
        ms(report.samples.last().copied())
    );
    let c = report.counters;
    println!(
        "sync applied {} published {} malformed {} ignored {} overruns {} resyncs {}",
        c.applied, c.published, c.malformed, c.ignored, c.overruns, c.resyncs
    );
    if report.lost > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
