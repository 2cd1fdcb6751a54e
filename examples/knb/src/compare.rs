//! `knb compare`: the stacks side by side, alternated A B A B … in one invocation, plus
//! the raw memif ceiling, and ratios as the median of the per-round ratios.
//!
//! The raw ceiling is `knb raw` over memif with one frame per message: frame size =
//! the larger message + knb header (16 B) + Ethernet/IPv4/TCP headers (54 B), capped
//! at 9000 B; raw iodepth = iodepth × connections. Its RTT is compared with RPC latency.

use std::collections::BTreeMap;

use clap::Args;
use serde_json::{json, Value};

use crate::backend;
use crate::raw;
use crate::report;
use crate::run::{self, Output, Placement};
use crate::workload::{Error, ModeArg, Res, Stack, Workload};

/// Arguments of `knb compare`.
#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// Stacks, run in this order each round.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "kernel,smoltcp,luna"
    )]
    pub stacks: Vec<Stack>,
    /// Rounds (each runs every stack once, then the raw ceiling).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub rounds: u32,
    /// Leave out the raw memif ceiling.
    #[arg(long)]
    pub no_raw: bool,
    #[command(flatten)]
    pub workload: Workload,
    #[command(flatten)]
    pub place: Placement,
    #[command(flatten)]
    pub out: Output,
}

/// Median (mean of the middle two for even counts); None when empty.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

/// Raw frame size for a workload (see the module docs).
pub fn raw_frame(w: &Workload) -> (u16, bool) {
    let want = w.req_size.max(w.resp_size) as u64 + 16 + 54;
    (want.clamp(64, 9000) as u16, want > 9000)
}

/// One measurement of one stack in one round.
#[derive(Debug, Clone, Copy)]
struct Point {
    rps: f64,
    p50: f64,
    p99: f64,
}

/// Per-round values of each stack (None = that round failed).
type Series = BTreeMap<&'static str, Vec<Option<Point>>>;

fn ratio(series: &Series, a: &str, b: &str, f: impl Fn(&Point) -> f64) -> Option<f64> {
    let (x, y) = (series.get(a)?, series.get(b)?);
    let rs: Vec<f64> = x
        .iter()
        .zip(y)
        .filter_map(|(p, q)| Some(f(p.as_ref()?) / f(q.as_ref()?)))
        .collect();
    median(&rs)
}

/// `knb compare`.
pub fn run(a: CompareArgs) -> Res<()> {
    a.workload.validate()?;
    a.place.validate()?;
    if a.workload.mode == ModeArg::Bulk {
        return Err(Error::Usage(
            "compare measures RPCs; use `knb bulk` per stack for streaming".into(),
        ));
    }
    if a.stacks.is_empty() {
        return Err(Error::Usage("--stacks is empty".into()));
    }
    let prefix = a.place.prefix()?;
    let mut notes: Vec<String> = Vec::new();
    let mut order: Vec<Stack> = Vec::new();
    for s in &a.stacks {
        if order.contains(s) {
            continue;
        }
        match backend::backend(*s).unavailable() {
            Some(why) => notes.push(format!("{}: {why}", s.name())),
            None => order.push(*s),
        }
    }
    if a.workload.mtu != 1500 {
        notes.push(format!(
            "--mtu {} applies to luna and smoltcp (memif); the kernel runs over veth at MTU \
             1500 with GSO/GRO",
            a.workload.mtu
        ));
    }
    if a.workload.memif_zero_copy {
        notes.push(
            "--memif-zero-copy applies to luna and smoltcp (memif client side); the raw \
             ceiling keeps memif's copy mode"
                .into(),
        );
    }
    if !a.stacks.contains(&Stack::Luna) {
        notes.push("luna: not requested (--stacks); luna ratios are null".into());
    }
    run::sweep_stale();
    // One topology per kind, reused by every round.
    let mut topos = BTreeMap::new();
    for s in &order {
        let b = backend::backend(*s);
        if let std::collections::btree_map::Entry::Vacant(e) = topos.entry(b.topology()) {
            e.insert(run::topology_for(b, &prefix)?);
        }
    }
    let (frame, capped) = raw_frame(&a.workload);
    if capped && !a.no_raw {
        notes.push(
            "raw: messages above 8930 B do not fit one frame; the ceiling uses 9000 B frames"
                .to_string(),
        );
    }
    let progress = a.out.show_progress();
    let mut series: Series = BTreeMap::new();
    let mut runs = Vec::new();
    let mut failures = 0;
    for round in 0..a.rounds {
        for s in &order {
            let b = backend::backend(*s);
            eprintln!(
                "knb compare: round {}/{}: {}",
                round + 1,
                a.rounds,
                s.name()
            );
            // --mtu sizes the memif link; the kernel's veth stays at 1500 (with GSO/GRO).
            let mut w = a.workload.clone();
            if b.topology() != testbed::Kind::Memif {
                w.mtu = 1500;
                w.memif_zero_copy = false;
            }
            let r = run::run_on(&topos[&b.topology()], b, &w, &a.place, progress);
            let p = match r {
                Ok(v) => {
                    let p = Point {
                        rps: v["rps"].as_f64().unwrap_or(f64::NAN),
                        p50: v["latency_us"]["p50"].as_f64().unwrap_or(f64::NAN),
                        p99: v["latency_us"]["p99"].as_f64().unwrap_or(f64::NAN),
                    };
                    runs.push(v);
                    Some(p)
                }
                Err(e) => {
                    failures += 1;
                    notes.push(format!("{} round {}: failed: {e}", s.name(), round + 1));
                    None
                }
            };
            series.entry(s.name()).or_default().push(p);
        }
        if !a.no_raw {
            eprintln!("knb compare: round {}/{}: raw", round + 1, a.rounds);
            let depth = a.workload.iodepth * a.workload.connections;
            let cpus = (
                a.place.client_cpus.0[0] as u32,
                a.place.server_cpus()[0] as u32,
            );
            let args = raw::RawArgs::memif_ceiling(
                frame,
                depth,
                a.workload.duration,
                a.workload.warmup,
                cpus,
                format!("lkb-raw-{}-{round}", std::process::id()),
            );
            let p = match raw::measure(&args) {
                Ok(v) => Some(Point {
                    rps: v["frames_per_sec"].as_f64().unwrap_or(f64::NAN),
                    p50: v["rtt_p50_us"].as_f64().unwrap_or(f64::NAN),
                    p99: v["rtt_p99_us"].as_f64().unwrap_or(f64::NAN),
                }),
                Err(e) => {
                    failures += 1;
                    notes.push(format!("raw round {}: failed: {e}", round + 1));
                    None
                }
            };
            series.entry("raw").or_default().push(p);
        }
    }
    drop(topos);

    let mut stacks = serde_json::Map::new();
    for s in &a.stacks {
        if !order.contains(s) {
            stacks.insert(
                s.name().into(),
                json!({"available": false, "note": backend::backend(*s).unavailable()}),
            );
        }
    }
    for (name, pts) in &series {
        let col = |f: &dyn Fn(&Point) -> f64| -> Vec<Value> {
            pts.iter()
                .map(|p| p.as_ref().map_or(Value::Null, |p| json!(f(p))))
                .collect()
        };
        let med =
            |f: &dyn Fn(&Point) -> f64| median(&pts.iter().flatten().map(f).collect::<Vec<_>>());
        stacks.insert(
            (*name).into(),
            json!({
                "available": true,
                "rps": col(&|p| p.rps),
                "p50_us": col(&|p| p.p50),
                "p99_us": col(&|p| p.p99),
                "median_rps": med(&|p| p.rps),
                "median_p50_us": med(&|p| p.p50),
                "median_p99_us": med(&|p| p.p99),
            }),
        );
    }
    let rps = |p: &Point| p.rps;
    let p99 = |p: &Point| p.p99;
    let mut doc = json!({
        "knb": "compare",
        "rounds": a.rounds,
        "order": order.iter().map(|s| s.name()).chain((!a.no_raw).then_some("raw")).collect::<Vec<_>>(),
        "config": a.workload.to_json(),
        "raw_frame_size": if a.no_raw { Value::Null } else { json!(frame) },
        "stacks": stacks,
        "luna_vs_kernel_rps": ratio(&series, "luna", "kernel", rps),
        "luna_vs_kernel_p99": ratio(&series, "luna", "kernel", p99),
        "luna_vs_smoltcp_rps": ratio(&series, "luna", "smoltcp", rps),
        "luna_vs_raw_rps": ratio(&series, "luna", "raw", rps),
        "smoltcp_vs_kernel_rps": ratio(&series, "smoltcp", "kernel", rps),
        "smoltcp_vs_kernel_p99": ratio(&series, "smoltcp", "kernel", p99),
        "kernel_vs_raw_rps": ratio(&series, "kernel", "raw", rps),
        "smoltcp_vs_raw_rps": ratio(&series, "smoltcp", "raw", rps),
        "notes": notes,
        "runs": runs,
    });
    doc["config"]["client_cpus"] = json!(a.place.client_cpus.0);
    doc["config"]["server_cpus"] = json!(a.place.server_cpus());

    println!(
        "{:<8} {:>12} {:>10} {:>10}   per round RPC/s",
        "stack", "median RPC/s", "p50 us", "p99 us"
    );
    for (name, v) in doc["stacks"].as_object().into_iter().flatten() {
        if v["available"] == json!(false) {
            println!("{name:<8} not available");
            continue;
        }
        let f = |k: &str| v[k].as_f64().map_or("-".into(), |x| format!("{x:.1}"));
        println!(
            "{name:<8} {:>12} {:>10} {:>10}   {}",
            f("median_rps"),
            f("median_p50_us"),
            f("median_p99_us"),
            v["rps"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|x| x.as_f64().map_or("failed".into(), |x| format!("{x:.0}")))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    println!("ratios (median of per-round ratios; p99 ratio < 1 means lower latency):");
    for k in [
        "luna_vs_kernel_rps",
        "luna_vs_kernel_p99",
        "luna_vs_smoltcp_rps",
        "luna_vs_raw_rps",
        "smoltcp_vs_kernel_rps",
        "smoltcp_vs_kernel_p99",
        "kernel_vs_raw_rps",
        "smoltcp_vs_raw_rps",
    ] {
        println!(
            "  {k:<22} {}",
            doc[k].as_f64().map_or("null".into(), |x| format!("{x:.3}"))
        );
    }
    for n in &notes {
        println!("note: {n}");
    }
    report::write_outputs(&a.out, &doc, &runs)?;
    if failures > 0 {
        return Err(Error::Run(format!(
            "{failures} run(s) failed (see the notes above)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_rounds() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN]), None);
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn ratios_pair_rounds_and_skip_failures() {
        let p = |rps| {
            Some(Point {
                rps,
                p50: 1.0,
                p99: rps / 10.0,
            })
        };
        let mut s: Series = BTreeMap::new();
        s.insert("kernel", vec![p(100.0), p(200.0), p(100.0)]);
        s.insert("smoltcp", vec![p(300.0), None, p(500.0)]);
        // Rounds 1 and 3: 3.0 and 5.0 -> median 4.0.
        assert_eq!(ratio(&s, "smoltcp", "kernel", |p| p.rps), Some(4.0));
        assert_eq!(ratio(&s, "luna", "kernel", |p| p.rps), None);
    }

    #[test]
    fn raw_frame_covers_the_message_and_headers() {
        let mut w = Workload {
            req_size: 4096,
            resp_size: 64,
            iodepth: 1,
            connections: 1,
            threads: 1,
            duration: 1.0,
            warmup: 0.0,
            rate: None,
            verify: false,
            mode: ModeArg::Rpc,
            mtu: 1500,
            memif_zero_copy: false,
            emu: Default::default(),
        };
        assert_eq!(raw_frame(&w), (4166, false));
        w.req_size = 1;
        w.resp_size = 1;
        assert_eq!(raw_frame(&w), (71, false));
        w.resp_size = 65536;
        assert_eq!(raw_frame(&w), (9000, true));
    }
}
