//! CPU use of a process per thread, from /proc: `schedstat` (ns on CPU), `stat` (user/sys
//! ticks and the CPU the thread last ran on), `status` (involuntary context switches: how
//! often something else took the thread's CPU) and `comm` (the thread's name, e.g. DPDK's
//! `eal-intr-thread`); and the host's steal time per CPU from `/proc/stat` (time a
//! hypervisor gave this VM's virtual CPU to another tenant).
//!
//! Pids are global (network namespaces share /proc's pid view), so the client samples the
//! server too.

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// One thread at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadSample {
    /// Nanoseconds on CPU.
    pub run_ns: u64,
    /// User ticks.
    pub utime: u64,
    /// System ticks.
    pub stime: u64,
    /// CPU it last ran on.
    pub cpu: u32,
    /// `nonvoluntary_ctxt_switches`: times the thread was preempted.
    pub nvcsw: u64,
    /// The thread's name (`comm`), empty if unreadable.
    pub name: String,
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

/// `nonvoluntary_ctxt_switches` from a `/proc/.../status` text.
pub fn parse_nvcsw(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
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
        let nvcsw = std::fs::read_to_string(base.join("status"))
            .ok()
            .as_deref()
            .and_then(parse_nvcsw)
            .unwrap_or(0);
        let name = std::fs::read_to_string(base.join("comm"))
            .map(|s| s.trim_end().to_string())
            .unwrap_or_default();
        out.threads.insert(
            tid,
            ThreadSample {
                run_ns,
                utime,
                stime,
                cpu,
                nvcsw,
                name,
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
/// `{cores, user, sys, nvcsw, threads: [{tid, name, cpu, util, nvcsw}]}` (1.0 = one core
/// busy; `nvcsw`: involuntary context switches in the window, summed and per thread).
/// Threads below 0.5% of a CPU and without involuntary switches are left out.
pub fn usage(a: &Sample, b: &Sample, secs: f64) -> Value {
    let hz = ticks_per_sec();
    let mut threads = Vec::new();
    let (mut cores, mut user, mut sys, mut nvcsw) = (0.0, 0.0, 0.0, 0u64);
    for (tid, y) in &b.threads {
        // A thread born in the window counts from zero.
        let (run0, u0, s0, n0) = a
            .threads
            .get(tid)
            .map_or((0, 0, 0, 0), |x| (x.run_ns, x.utime, x.stime, x.nvcsw));
        let util = y.run_ns.saturating_sub(run0) as f64 / 1e9 / secs;
        let nv = y.nvcsw.saturating_sub(n0);
        cores += util;
        nvcsw += nv;
        user += y.utime.saturating_sub(u0) as f64 / hz / secs;
        sys += y.stime.saturating_sub(s0) as f64 / hz / secs;
        if util >= 0.005 || nv > 0 {
            threads.push(json!({"tid": tid, "name": y.name, "cpu": y.cpu,
                "util": round3(util), "nvcsw": nv}));
        }
    }
    json!({"cores": round3(cores), "user": round3(user), "sys": round3(sys),
        "nvcsw": nvcsw, "threads": threads})
}

/// One CPU's `/proc/stat` times (clock ticks): all of them and the stolen part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTimes {
    /// user + nice + system + idle + iowait + irq + softirq + steal (guest time is
    /// already inside user and nice).
    pub total: u64,
    /// The steal column: time the hypervisor ran something else on this virtual CPU.
    pub steal: u64,
}

/// Per-CPU times from a `/proc/stat` text, by CPU number (the `cpu` total line is left
/// out). Kernels without a steal column report 0 steal.
pub fn parse_proc_stat(s: &str) -> BTreeMap<u32, CpuTimes> {
    let mut out = BTreeMap::new();
    for l in s.lines() {
        let mut f = l.split_whitespace();
        let Some(n) = f
            .next()
            .and_then(|h| h.strip_prefix("cpu"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let v: Vec<u64> = f.map_while(|x| x.parse().ok()).take(8).collect();
        if v.len() < 4 {
            continue;
        }
        out.insert(
            n,
            CpuTimes {
                total: v.iter().sum(),
                steal: v.get(7).copied().unwrap_or(0),
            },
        );
    }
    out
}

/// The host's per-CPU times now; empty if `/proc/stat` is unreadable.
pub fn host_times() -> BTreeMap<u32, CpuTimes> {
    std::fs::read_to_string("/proc/stat")
        .map(|s| parse_proc_stat(&s))
        .unwrap_or_default()
}

/// Steal between two host samples on `cpus`, as JSON: `{share, per_cpu: {"N": share}}`,
/// share = stolen / all time of those CPUs (0 = no other tenant took them). `share` is
/// null when no listed CPU advanced (unreadable `/proc/stat`).
pub fn steal(a: &BTreeMap<u32, CpuTimes>, b: &BTreeMap<u32, CpuTimes>, cpus: &[usize]) -> Value {
    let (mut st, mut tot) = (0u64, 0u64);
    let mut per = serde_json::Map::new();
    let mut seen: Vec<u32> = Vec::new();
    for &c in cpus {
        let c = c as u32;
        if seen.contains(&c) {
            continue;
        }
        seen.push(c);
        let (Some(x), Some(y)) = (a.get(&c), b.get(&c)) else {
            continue;
        };
        let (ds, dt) = (
            y.steal.saturating_sub(x.steal),
            y.total.saturating_sub(x.total),
        );
        if dt == 0 {
            continue;
        }
        st += ds;
        tot += dt;
        per.insert(c.to_string(), json!(round3(ds as f64 / dt as f64)));
    }
    let share = (tot > 0).then(|| round3(st as f64 / tot as f64));
    json!({"share": share, "per_cpu": per})
}

/// A measured window of this process (the "client") and optionally a peer process (the
/// "server"), with the host's steal: [`Window::start`] at the window's start,
/// [`Window::finish`] at its end. Used by `knb raw`'s initiator (its peer: the reflector).
pub struct Window {
    me: Sample,
    peer_pid: Option<u32>,
    peer: Option<Sample>,
    host: BTreeMap<u32, CpuTimes>,
    at: std::time::Instant,
}

impl Window {
    /// Samples now; None if this process's /proc is unreadable.
    pub fn start(peer_pid: Option<u32>) -> Option<Window> {
        let host = host_times();
        Some(Window {
            me: sample(std::process::id())?,
            peer: peer_pid.and_then(sample),
            peer_pid,
            host,
            at: std::time::Instant::now(),
        })
    }

    /// `{client, server, per_core, steal}` like an RPC run's `cpu` (server null when the
    /// peer was not sampled), over the time since [`Window::start`].
    pub fn finish(self) -> Value {
        let host = host_times();
        let secs = self.at.elapsed().as_secs_f64().max(1e-9);
        let Some(me) = sample(std::process::id()) else {
            return Value::Null;
        };
        let client = usage(&self.me, &me, secs);
        let server = match (self.peer, self.peer_pid.and_then(sample)) {
            (Some(a), Some(b)) => usage(&a, &b, secs),
            _ => Value::Null,
        };
        let per_core = per_core(&[&client, &server]);
        let all: Vec<usize> = host.keys().map(|&c| c as usize).collect();
        let steal = steal(&self.host, &host, &all);
        json!({"client": client, "server": server, "per_core": per_core, "steal": steal})
    }
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
    fn parses_status_and_proc_stat() {
        let st = "Name:\tknb\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t345\n";
        assert_eq!(parse_nvcsw(st), Some(345));
        assert_eq!(parse_nvcsw("Name: x\n"), None);
        let ps = "cpu  10 0 10 100 0 0 0 5 0 0\ncpu0 4 0 4 40 0 0 0 2 0 0\n\
                  cpu1 6 0 6 60 0 0 0 3 0 0\ncpu2 x\nintr 1 2 3\n";
        let m = parse_proc_stat(ps);
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!(
            m[&0],
            CpuTimes {
                total: 50,
                steal: 2
            }
        );
        assert_eq!(
            m[&1],
            CpuTimes {
                total: 75,
                steal: 3
            }
        );
        // An old kernel without the steal column.
        assert_eq!(
            parse_proc_stat("cpu0 1 2 3 4\n")[&0],
            CpuTimes {
                total: 10,
                steal: 0
            }
        );
    }

    #[test]
    fn steal_share_over_the_used_cpus() {
        let t = |total, steal| CpuTimes { total, steal };
        let a: BTreeMap<u32, CpuTimes> = [(0, t(100, 0)), (1, t(100, 10)), (2, t(0, 0))].into();
        let b: BTreeMap<u32, CpuTimes> =
            [(0, t(200, 10)), (1, t(200, 40)), (2, t(100, 100))].into();
        let v = steal(&a, &b, &[0, 1, 1]);
        // (10 + 30) / (100 + 100); CPU 2 is not ours.
        assert_eq!(v["share"], json!(0.2), "{v}");
        assert_eq!(v["per_cpu"]["0"], json!(0.1));
        assert_eq!(v["per_cpu"]["1"], json!(0.3));
        assert_eq!(steal(&a, &a, &[0])["share"], Value::Null);
        assert_eq!(steal(&a, &b, &[7])["share"], Value::Null);
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
