//! CPU use of a process per thread, from /proc: `schedstat` (ns on CPU), `stat` (user/sys
//! ticks and the CPU the thread last ran on).
//!
//! Pids are global (network namespaces share /proc's pid view), so the client samples the
//! server too.

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// One thread at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadSample {
    /// Nanoseconds on CPU.
    pub run_ns: u64,
    /// User ticks.
    pub utime: u64,
    /// System ticks.
    pub stime: u64,
    /// CPU it last ran on.
    pub cpu: u32,
}

/// All threads of a process at one instant.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// By thread id.
    pub threads: BTreeMap<u32, ThreadSample>,
}

/// Parses a `/proc/.../stat` line: (utime, stime, processor).
pub fn parse_stat(s: &str) -> Option<(u64, u64, u32)> {
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime = field 14, stime = 15, processor = 39.
    let get = |n: usize| f.get(n - 3).and_then(|x| x.parse::<u64>().ok());
    Some((get(14)?, get(15)?, get(39)? as u32))
}

/// Samples every thread of `pid`; None if the process is gone.
pub fn sample(pid: u32) -> Option<Sample> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut out = Sample::default();
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let base = e.path();
        let Some((utime, stime, cpu)) = std::fs::read_to_string(base.join("stat"))
            .ok()
            .as_deref()
            .and_then(parse_stat)
        else {
            continue;
        };
        let run_ns = std::fs::read_to_string(base.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        out.threads.insert(
            tid,
            ThreadSample {
                run_ns,
                utime,
                stime,
                cpu,
            },
        );
    }
    Some(out)
}

fn ticks_per_sec() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|&t| t > 0)
        .unwrap_or(100) as f64
}

/// CPU use between two samples over `secs` wall seconds, as JSON:
/// `{cores, user, sys, threads: [{tid, cpu, util}]}` (1.0 = one core busy).
pub fn usage(a: &Sample, b: &Sample, secs: f64) -> Value {
    let hz = ticks_per_sec();
    let mut threads = Vec::new();
    let (mut cores, mut user, mut sys) = (0.0, 0.0, 0.0);
    for (tid, y) in &b.threads {
        let x = a.threads.get(tid).copied().unwrap_or(ThreadSample {
            run_ns: 0,
            utime: 0,
            stime: 0,
            cpu: y.cpu,
        });
        let util = y.run_ns.saturating_sub(x.run_ns) as f64 / 1e9 / secs;
        cores += util;
        user += y.utime.saturating_sub(x.utime) as f64 / hz / secs;
        sys += y.stime.saturating_sub(x.stime) as f64 / hz / secs;
        if util >= 0.005 {
            threads.push(json!({"tid": tid, "cpu": y.cpu, "util": round3(util)}));
        }
    }
    json!({"cores": round3(cores), "user": round3(user), "sys": round3(sys), "threads": threads})
}

/// Sum of thread utilisation per CPU over both sides' usage values.
pub fn per_core(sides: &[&Value]) -> Value {
    let mut m: BTreeMap<String, f64> = BTreeMap::new();
    for s in sides {
        for t in s["threads"].as_array().into_iter().flatten() {
            if let (Some(c), Some(u)) = (t["cpu"].as_u64(), t["util"].as_f64()) {
                *m.entry(c.to_string()).or_default() += u;
            }
        }
    }
    Value::Object(m.into_iter().map(|(k, v)| (k, json!(round3(v)))).collect())
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_command_names() {
        let mut line = String::from("42 (a) b (c)) R");
        for i in 4..=52 {
            line.push_str(&format!(" {i}"));
        }
        assert_eq!(parse_stat(&line), Some((14, 15, 39)));
        assert_eq!(parse_stat("42 (x) R 1 2"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn samples_this_process_and_computes_usage() {
        let pid = std::process::id();
        let a = sample(pid).expect("own /proc");
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed().as_millis() < 50 {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let b = sample(pid).expect("own /proc");
        let u = usage(&a, &b, t.elapsed().as_secs_f64());
        // A busy loop on one thread: clearly above zero, at most the threads present.
        let cores = u["cores"].as_f64().unwrap();
        assert!(cores > 0.1 && cores <= b.threads.len() as f64 + 0.1, "{u}");
        let pc = per_core(&[&u]);
        assert!(pc.as_object().is_some_and(|m| !m.is_empty()), "{pc}");
        assert!(sample(u32::MAX).is_none());
    }
}
