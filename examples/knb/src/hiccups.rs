//! `knb hiccups`: how calm is the machine? One thread pinned to each CPU spins reading
//! CLOCK_MONOTONIC (`std::time::Instant`, the vDSO) and records every gap between two
//! consecutive readings of at least 10 µs: time the thread did not run (preempted by
//! another thread, an interrupt, the hypervisor taking the vCPU). The same measurement as
//! a C spin loop, in knb so every sweep can say how calm its machine was
//! (examples/knb/msgsched-sweep.sh runs it before each stack's sweep).
//!
//! Counts are cumulative ("at least": a 3 ms gap is counted under 10 µs, ..., 2 ms), like
//! r2c's loop-stall counters.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};

use crate::report;
use crate::workload::{parse_cpus, Cpus, Error, Res};

/// Gap thresholds (ns) of the histogram.
pub const THRESHOLDS_NS: [u64; 7] = [
    10_000, 50_000, 100_000, 500_000, 1_000_000, 2_000_000, 5_000_000,
];
const LABELS: [&str; 7] = ["10us", "50us", "100us", "500us", "1ms", "2ms", "5ms"];

/// Arguments of `knb hiccups`.
#[derive(Args, Debug, Clone)]
pub struct HiccupsArgs {
    /// CPUs to measure, one spinning thread pinned to each.
    #[arg(long, default_value = "0,1", value_parser = parse_cpus)]
    pub cpus: Cpus,
    /// How long each thread spins (all CPUs at once).
    #[arg(long, default_value = "5", value_parser = parse_spin_secs)]
    pub seconds: f64,
    /// Also write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

fn parse_spin_secs(s: &str) -> Result<f64, String> {
    let v = crate::workload::parse_secs(s)?;
    if v <= 0.0 {
        return Err("--seconds must be > 0".into());
    }
    Ok(v)
}

/// One CPU's gaps.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Gaps {
    /// Gaps of at least each of [`THRESHOLDS_NS`].
    pub counts: [u64; 7],
    /// Time in gaps >= 10 µs (ns).
    pub lost_ns: u64,
    /// The longest gap (ns), whatever its length.
    pub max_ns: u64,
    /// How long the thread spun (ns).
    pub spun_ns: u64,
}

impl Gaps {
    /// Counts one gap of `ns` (the caller skips gaps under the first threshold).
    pub fn record(&mut self, ns: u64) {
        for (c, t) in self.counts.iter_mut().zip(THRESHOLDS_NS) {
            *c += u64::from(ns >= t);
        }
        if ns >= THRESHOLDS_NS[0] {
            self.lost_ns += ns;
        }
        self.max_ns = self.max_ns.max(ns);
    }

    /// Several CPUs together: counts, lost and spun time add, the maximum is the larger.
    pub fn combine(&self, o: &Gaps) -> Gaps {
        Gaps {
            counts: std::array::from_fn(|i| self.counts[i] + o.counts[i]),
            lost_ns: self.lost_ns + o.lost_ns,
            max_ns: self.max_ns.max(o.max_ns),
            spun_ns: self.spun_ns + o.spun_ns,
        }
    }

    /// Share of the spun time lost in gaps >= 10 µs.
    pub fn lost_fraction(&self) -> f64 {
        if self.spun_ns == 0 {
            0.0
        } else {
            self.lost_ns as f64 / self.spun_ns as f64
        }
    }

    fn to_json(self) -> Value {
        let mut gaps = serde_json::Map::new();
        for (l, c) in LABELS.iter().zip(self.counts) {
            gaps.insert(format!("at_least_{l}"), json!(c));
        }
        json!({
            "gaps": gaps,
            "max_us": self.max_ns as f64 / 1e3,
            "lost_us": self.lost_ns as f64 / 1e3,
            "lost_percent": 100.0 * self.lost_fraction(),
            "seconds": self.spun_ns as f64 / 1e9,
        })
    }

    /// `>=10us 812 >=50us 40 ... ; max 2.7 ms; 1.2% lost in gaps >= 10 us`.
    pub fn describe(&self) -> String {
        let counts: Vec<String> = LABELS
            .iter()
            .zip(self.counts)
            .map(|(l, c)| format!(">={l} {c}"))
            .collect();
        format!(
            "gaps {}; max {:.0} us; {:.2}% of the time in gaps >= 10 us",
            counts.join(" "),
            self.max_ns as f64 / 1e3,
            100.0 * self.lost_fraction()
        )
    }
}

/// Spins on `cpu` for `d`, recording gaps.
fn spin(cpu: usize, d: Duration) -> Result<Gaps, String> {
    crate::backend::pin(cpu)?;
    let mut g = Gaps::default();
    let start = Instant::now();
    let end = start + d;
    let mut prev = start;
    loop {
        let t = Instant::now();
        let gap = u64::try_from(t.duration_since(prev).as_nanos()).unwrap_or(u64::MAX);
        prev = t;
        if gap >= THRESHOLDS_NS[0] {
            g.record(gap);
        }
        if t >= end {
            g.spun_ns = u64::try_from(t.duration_since(start).as_nanos()).unwrap_or(u64::MAX);
            return Ok(g);
        }
    }
}

/// Measures every CPU of `cpus` at once for `seconds`.
pub fn measure(cpus: &Cpus, seconds: f64) -> Res<Vec<(usize, Gaps)>> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    if let Some(c) = cpus.0.iter().find(|c| **c >= n) {
        return Err(Error::Usage(format!(
            "CPU {c} does not exist (this machine has {n})"
        )));
    }
    let d = Duration::from_secs_f64(seconds);
    std::thread::scope(|s| {
        let hs: Vec<_> = cpus
            .0
            .iter()
            .map(|&c| (c, s.spawn(move || spin(c, d))))
            .collect();
        hs.into_iter()
            .map(|(c, h)| match h.join() {
                Ok(Ok(g)) => Ok((c, g)),
                Ok(Err(e)) => Err(Error::Run(e)),
                Err(_) => Err(Error::Run(format!("the thread on CPU {c} panicked"))),
            })
            .collect()
    })
}

/// The one line a sweep prints: every CPU together.
pub fn summary_line(per_cpu: &[(usize, Gaps)], seconds: f64) -> String {
    let all = per_cpu
        .iter()
        .map(|(_, g)| *g)
        .reduce(|a, b| a.combine(&b))
        .unwrap_or_default();
    let cpus: Vec<String> = per_cpu.iter().map(|(c, _)| c.to_string()).collect();
    format!(
        "hiccups: {seconds} s on CPUs {}: {} gaps >= 100 us, {} >= 1 ms, max {:.0} us, {:.2}% of the time in gaps >= 10 us",
        cpus.join(","),
        all.counts[2],
        all.counts[4],
        all.max_ns as f64 / 1e3,
        100.0 * all.lost_fraction()
    )
}

/// The JSON document of `--json`.
pub fn to_json(per_cpu: &[(usize, Gaps)], seconds: f64) -> Value {
    json!({
        "knb": "hiccups",
        "seconds": seconds,
        "thresholds_us": THRESHOLDS_NS.iter().map(|t| *t as f64 / 1e3).collect::<Vec<_>>(),
        "counts": "cumulative: a gap is counted under every threshold it reaches",
        "cpus": per_cpu
            .iter()
            .map(|(c, g)| {
                let mut v = g.to_json();
                v["cpu"] = json!(c);
                v
            })
            .collect::<Vec<_>>(),
    })
}

/// `knb hiccups`.
pub fn run(a: HiccupsArgs) -> Res<()> {
    if a.cpus.0.is_empty() {
        return Err(Error::Usage("--cpus needs at least one CPU".into()));
    }
    let per = measure(&a.cpus, a.seconds)?;
    for (c, g) in &per {
        println!("cpu {c}: {}", g.describe());
    }
    println!("{}", summary_line(&per, a.seconds));
    // The machine's other unknown: how far apart the host placed the CPUs (hostlink).
    for w in a.cpus.0.windows(2) {
        match crate::hostlink::round_trip_ns(w[0], w[1]) {
            Ok(ns) => println!(
                "cpus {} and {}: cache-line round trip {ns:.0} ns ({}; far from {:.0} ns)",
                w[0],
                w[1],
                crate::hostlink::Link::of_ns(ns).name(),
                crate::hostlink::FAR_NS
            ),
            Err(e) => println!("cpus {} and {}: no round trip: {e}", w[0], w[1]),
        }
    }
    if let Some(p) = &a.json {
        report::write_file(
            p,
            &(serde_json::to_string_pretty(&to_json(&per, a.seconds)).unwrap_or_default() + "\n"),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_count_under_every_threshold_they_reach() {
        let mut g = Gaps::default();
        for ns in [10_000, 49_999, 120_000, 1_000_000, 3_000_000] {
            g.record(ns);
        }
        assert_eq!(g.counts, [5, 3, 3, 2, 2, 1, 0]);
        assert_eq!(g.lost_ns, 4_179_999);
        assert_eq!(g.max_ns, 3_000_000);
        g.spun_ns = 1_000_000_000;
        assert!((g.lost_fraction() - 0.004179999).abs() < 1e-12);
        let mut h = Gaps {
            spun_ns: 1_000_000_000,
            ..Gaps::default()
        };
        h.record(6_000_000);
        let both = g.combine(&h);
        assert_eq!(both.counts, [6, 4, 4, 3, 3, 2, 1]);
        assert_eq!(both.max_ns, 6_000_000);
        let line = summary_line(&[(0, g), (1, h)], 1.0);
        assert_eq!(
            line,
            "hiccups: 1 s on CPUs 0,1: 4 gaps >= 100 us, 3 >= 1 ms, max 6000 us, 0.51% of the time in gaps >= 10 us"
        );
        let v = to_json(&[(1, h)], 1.0);
        assert_eq!(v["cpus"][0]["cpu"], 1);
        assert_eq!(v["cpus"][0]["gaps"]["at_least_5ms"], 1);
        assert_eq!(v["cpus"][0]["max_us"], 6000.0);
    }

    #[test]
    fn a_short_spin_reports_its_cpu_and_time() {
        let per = measure(&Cpus(vec![0]), 0.02).unwrap();
        assert_eq!(per.len(), 1);
        let (c, g) = per[0];
        assert_eq!(c, 0);
        assert!(g.spun_ns >= 20_000_000, "{g:?}");
        // Cumulative counts never grow with the threshold.
        assert!(g.counts.windows(2).all(|w| w[0] >= w[1]), "{g:?}");
        assert!(matches!(
            measure(&Cpus(vec![usize::MAX]), 0.01),
            Err(Error::Usage(_))
        ));
    }
}
