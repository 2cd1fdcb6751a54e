//! `knb compare`: the stacks side by side, alternated A B A B … in one invocation, plus
//! the raw memif ceiling, and ratios as the median of the per-round ratios.
//!
//! The raw ceiling is `knb raw` over memif with one frame per message: frame size =
//! the larger message + knb header (16 B) + Ethernet/IPv4/TCP headers (54 B), capped
//! at 9000 B; raw iodepth = iodepth × connections. Its RTT is compared with RPC latency.
//!
//! Every round is judged ([`crate::contention`]): contended rounds (a busy-polling side
//! starved of CPU, or host steal) are shown and left out of the medians and ratios;
//! a ratio with too few clean rounds is null and the output says the machine was too
//! busy to measure it, and which side starved.

use std::collections::BTreeMap;

use clap::Args;
use serde_json::{json, Value};

use crate::backend;
use crate::contention::{self, Health, TrustArgs};
use crate::hostlink::{self, Link};
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
    #[command(flatten)]
    pub trust: TrustArgs,
    /// Before each run, wait up to this many seconds for the host to place the client's
    /// and the server's CPU near each other (a cache-line round trip under 200 ns,
    /// probed once a second; docs/benchmarks.md, "The two speeds explained"), then run
    /// either way: the run keeps its measured label. 0: do not wait.
    #[arg(long, default_value_t = 0.0, value_parser = parse_wait)]
    pub wait_near: f64,
}

pub(crate) fn parse_wait(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=3600.0).contains(&x) => Ok(x),
        _ => Err(format!("{s:?}: give seconds between 0 and 3600")),
    }
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
#[derive(Debug, Clone)]
struct Point {
    rps: f64,
    p50: f64,
    p99: f64,
    health: Health,
    /// Where the host ran the two CPUs ([`crate::hostlink`]; None: not probed).
    link: Option<Link>,
}

/// Per-round values of each stack (None = that round failed).
type Series = BTreeMap<&'static str, Vec<Option<Point>>>;

/// A ratio over the rounds where both stacks were measured and clean.
#[derive(Debug, Clone, PartialEq)]
struct Ratio {
    /// Median of the clean per-round ratios; None when there are too few of them.
    value: Option<f64>,
    /// Rounds used.
    kept: usize,
    /// Rounds where both stacks were measured (clean or not).
    measured: usize,
    /// `luna server got 0.55 of a CPU per poller (< 0.9) in round 2`, one per contended
    /// round side.
    starved: Vec<String>,
}

/// Whether a per-round figure (RPC/s, p99) can enter a ratio: finite and above 0.
fn has_value(x: f64) -> bool {
    x.is_finite() && x > 0.0
}

fn ratio(series: &Series, a: &str, b: &str, f: impl Fn(&Point) -> f64) -> Ratio {
    let mut r = Ratio {
        value: None,
        kept: 0,
        measured: 0,
        starved: Vec::new(),
    };
    let (Some(x), Some(y)) = (series.get(a), series.get(b)) else {
        return r;
    };
    let mut rs = Vec::new();
    for (i, (p, q)) in x.iter().zip(y).enumerate() {
        let (Some(p), Some(q)) = (p, q) else {
            continue;
        };
        r.measured += 1;
        if p.health.contended || q.health.contended {
            for (name, pt) in [(a, p), (b, q)] {
                for why in &pt.health.reasons {
                    r.starved.push(format!("{name} {why} in round {}", i + 1));
                }
            }
            continue;
        }
        // A stack that completed nothing in the window (rps 0, no latency) gives no
        // ratio, on either side of it: not kept (the median left it out before while
        // `kept` counted it, and only when it was the divisor).
        let mut valued = true;
        for (name, pt) in [(a, p), (b, q)] {
            if !has_value(f(pt)) {
                valued = false;
                r.starved
                    .push(format!("{name} measured no value in round {}", i + 1));
            }
        }
        if !valued {
            continue;
        }
        r.kept += 1;
        rs.push(f(p) / f(q));
    }
    if contention::enough_clean(r.kept, r.measured) {
        r.value = median(&rs);
    }
    r
}

/// Rounds where a stack ran in its fast mode: clean and within `factor` of its best clean
/// round. This machine switches between two speeds (docs/benchmarks.md, "The two-speed
/// mode"), often between one stack's run and the next one's in the same round, so a
/// median over all rounds can divide one stack's fast run by another's slow one.
fn fast_rounds(pts: &[Option<Point>], factor: f64) -> Vec<bool> {
    let clean = |p: &&Point| !p.health.contended && p.rps.is_finite();
    let best = pts
        .iter()
        .flatten()
        .filter(clean)
        .map(|p| p.rps)
        .fold(0.0, f64::max);
    pts.iter()
        .map(|p| {
            p.as_ref()
                .filter(clean)
                .is_some_and(|p| best > 0.0 && p.rps * factor >= best)
        })
        .collect()
}

/// The median of the per-round ratios `f(A) / f(B)` over the rounds where both stacks
/// were measured and `select` (per stack: which of its rounds count) chose both, from two
/// rounds up: `(median, rounds)`.
fn selected_ratio(
    series: &Series,
    (a, b): (&str, &str),
    select: impl Fn(&[Option<Point>]) -> Vec<bool>,
    f: impl Fn(&Point) -> f64,
) -> (Option<f64>, usize) {
    let (Some(x), Some(y)) = (series.get(a), series.get(b)) else {
        return (None, 0);
    };
    let (kx, ky) = (select(x), select(y));
    let rs: Vec<f64> = x
        .iter()
        .zip(y)
        .zip(kx.iter().zip(&ky))
        .filter_map(|((p, q), (&u, &v))| match (p, q) {
            (Some(p), Some(q)) if u && v && has_value(f(p)) && has_value(f(q)) => Some(f(p) / f(q)),
            _ => None,
        })
        .collect();
    let value = if rs.len() >= 2 { median(&rs) } else { None };
    (value, rs.len())
}

/// A [`selected_ratio`] selector: the clean rounds a stack ran with the two CPUs in the
/// placement `link` ([`crate::hostlink`]: measured, unlike the guess of
/// [`fast_rounds`], the other selector).
fn in_placement(link: Link) -> impl Fn(&[Option<Point>]) -> Vec<bool> {
    move |s| {
        s.iter()
            .map(|p| {
                p.as_ref()
                    .is_some_and(|p| !p.health.contended && p.link == Some(link))
            })
            .collect()
    }
}

/// A note when no round of a memif stack ran with the two CPUs near: the set then
/// measured memif's transfers between core complexes more than the stacks.
fn placement_note(series: &Series) -> Option<String> {
    let links: Vec<Link> = ["luna", "smoltcp", "raw"]
        .iter()
        .filter_map(|k| series.get(k))
        .flatten()
        .flatten()
        .filter_map(|p| p.link)
        .collect();
    (!links.is_empty() && !links.contains(&Link::Near)).then(|| {
        format!(
            "no memif round ran with the two CPUs near (cache-line round trip under {:.0} \
             ns): the host placed them apart, where memif's transfers dominate every DPDK \
             stack; the near ratios above are null. Rerun when `knb hiccups --cpus 0,1` \
             says near (docs/benchmarks.md, \"The two speeds explained\")",
            hostlink::FAR_NS
        )
    })
}

/// The ratios `knb compare` reports: (key, A, B, per-point value).
const RATIOS: [(&str, &str, &str, bool); 8] = [
    ("luna_vs_kernel_rps", "luna", "kernel", false),
    ("luna_vs_kernel_p99", "luna", "kernel", true),
    ("luna_vs_smoltcp_rps", "luna", "smoltcp", false),
    ("luna_vs_raw_rps", "luna", "raw", false),
    ("smoltcp_vs_kernel_rps", "smoltcp", "kernel", false),
    ("smoltcp_vs_kernel_p99", "smoltcp", "kernel", true),
    ("kernel_vs_raw_rps", "kernel", "raw", false),
    ("smoltcp_vs_raw_rps", "smoltcp", "raw", false),
];

/// The too-busy message of one ratio, or None when it could be measured (or had no
/// rounds at all: that is a failure or a stack not run, reported elsewhere).
fn too_busy(key: &str, r: &Ratio) -> Option<String> {
    if r.measured == 0 || contention::enough_clean(r.kept, r.measured) {
        return None;
    }
    Some(format!(
        "the machine was too busy to measure {key}: {} of {} rounds clean (need {} and at \
         least half); starved: {}",
        r.kept,
        r.measured,
        r.measured.min(2),
        if r.starved.is_empty() {
            "-".to_string()
        } else {
            r.starved.join("; ")
        }
    ))
}

/// The JSON `stacks.<name>` entry of one stack's rounds: per-round values and verdicts,
/// medians over clean rounds.
fn stack_entry(pts: &[Option<Point>], unstable_factor: f64) -> Value {
    let col = |f: &dyn Fn(&Point) -> Value| -> Vec<Value> {
        pts.iter()
            .map(|p| p.as_ref().map_or(Value::Null, f))
            .collect()
    };
    let clean: Vec<&Point> = pts
        .iter()
        .flatten()
        .filter(|p| !p.health.contended)
        .collect();
    let med = |f: &dyn Fn(&Point) -> f64| median(&clean.iter().map(|p| f(p)).collect::<Vec<_>>());
    let unstable = contention::unstable(
        &pts.iter()
            .map(|p| p.as_ref().map(|p| p.rps))
            .collect::<Vec<_>>(),
        unstable_factor,
    );
    json!({
        "available": true,
        "rps": col(&|p| json!(p.rps)),
        "p50_us": col(&|p| json!(p.p50)),
        "p99_us": col(&|p| json!(p.p99)),
        "contended": col(&|p| json!(p.health.contended)),
        "contention": col(&|p| p.health.to_json()),
        "unstable": unstable,
        "link": col(&|p| json!(p.link.map(Link::name))),
        "clean_rounds": clean.len(),
        "measured_rounds": pts.iter().flatten().count(),
        "median_rps": med(&|p| p.rps),
        "median_p50_us": med(&|p| p.p50),
        "median_p99_us": med(&|p| p.p99),
    })
}

/// One per-round cell of the table: `255084`, `111033 C` (contended), `190969 U`
/// (unstable), `119402 F` (the CPUs far apart), `X` (the placement changed during the
/// run), `?` (placement not measured), `failed`.
fn cell(rps: &Value, contended: &Value, unstable: &Value, link: &Value) -> String {
    match rps.as_f64() {
        None => "failed".into(),
        Some(x) => {
            let mut s = format!("{x:.0}");
            if contended == &Value::Bool(true) {
                s.push_str(" C");
            }
            if unstable == &Value::Bool(true) {
                s.push_str(" U");
            }
            match link.as_str().and_then(Link::parse) {
                Some(Link::Far) => s.push_str(" F"),
                Some(Link::Changed) => s.push_str(" X"),
                Some(Link::Near) => {}
                None => s.push_str(" ?"),
            }
            s
        }
    }
}

/// The `verdict` of a compare document: `ok`, or `too busy to measure <ratio keys>`.
fn verdict(busy_keys: &[&str]) -> String {
    if busy_keys.is_empty() {
        "ok".into()
    } else {
        format!("too busy to measure {}", busy_keys.join(" "))
    }
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
    let pair = (a.place.client_cpus.0[0], a.place.server_cpus()[0]);
    let mut waits = (0.0f64, 0u32, 0u32); // seconds waited, runs, runs started not near
    let mut wait = |what: &str| -> Option<f64> {
        if a.wait_near <= 0.0 {
            return None;
        }
        let (w, near) =
            hostlink::wait_before_run(a.wait_near, pair, &format!("knb compare: {what}"));
        waits.0 += w;
        waits.1 += 1;
        waits.2 += u32::from(!near);
        Some(w)
    };
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
            let waited = wait(s.name());
            let r = run::run_on(&topos[&b.topology()], b, &w, &a.place, progress);
            let p = match r {
                Ok(mut v) => {
                    if let Some(w) = waited {
                        v["host_link"]["waited_s"] = json!(w);
                    }
                    let health = contention::assess(&v, &a.trust);
                    v["contention"] = health.to_json();
                    v["round"] = json!(round + 1);
                    let p = Point {
                        rps: v["rps"].as_f64().unwrap_or(f64::NAN),
                        p50: v["latency_us"]["p50"].as_f64().unwrap_or(f64::NAN),
                        p99: v["latency_us"]["p99"].as_f64().unwrap_or(f64::NAN),
                        health,
                        link: hostlink::of_run(&v),
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
            wait("raw");
            let link = hostlink::Bracket::begin(Some((cpus.0 as usize, cpus.1 as usize)));
            // The steal window is the raw run's alone (the probes spin both CPUs).
            let before = crate::cpu::host_times();
            let measured = raw::measure(&args);
            let after = crate::cpu::host_times();
            let link = link.end();
            let p = match measured {
                Ok(v) => Some(Point {
                    rps: v["frames_per_sec"].as_f64().unwrap_or(f64::NAN),
                    p50: v["rtt_p50_us"].as_f64().unwrap_or(f64::NAN),
                    p99: v["rtt_p99_us"].as_f64().unwrap_or(f64::NAN),
                    health: contention::assess(&raw_run_view(&v, &before, &after, cpus), &a.trust),
                    link: hostlink::mode(&link),
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
    if waits.1 > 0 {
        notes.push(format!(
            "--wait-near {}: waited {:.0} s in all before {} runs; {} of them started with \
             the CPUs not near",
            a.wait_near, waits.0, waits.1, waits.2
        ));
    }
    if let Some(n) = placement_note(&series) {
        notes.push(n);
    }

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
        let mut e = stack_entry(pts, a.trust.unstable_factor);
        e["fast"] = json!(fast_rounds(pts, a.trust.unstable_factor));
        stacks.insert((*name).into(), e);
    }
    // Unstable marks go into the stored runs too (their CSV rows).
    for v in runs.iter_mut() {
        let (Some(name), Some(r)) = (v["stack"].as_str(), v["round"].as_u64()) else {
            continue;
        };
        let u = stacks
            .get(name)
            .and_then(|e| e["unstable"].get(r as usize - 1).cloned())
            .unwrap_or(Value::Null);
        v["contention"]["unstable"] = u;
    }
    let mut ratios = serde_json::Map::new();
    let mut kept = serde_json::Map::new();
    let mut fast = serde_json::Map::new();
    let mut by_link = serde_json::Map::new();
    let mut busy: Vec<String> = Vec::new();
    let mut busy_keys: Vec<&str> = Vec::new();
    for (key, x, y, tail) in RATIOS {
        let value: fn(&Point) -> f64 = if tail { |p| p.p99 } else { |p| p.rps };
        let r = ratio(&series, x, y, value);
        let (fv, fk) = selected_ratio(
            &series,
            (x, y),
            |s| fast_rounds(s, a.trust.unstable_factor),
            value,
        );
        fast.insert(key.into(), json!({"value": fv, "rounds": fk}));
        let mut l = serde_json::Map::new();
        for link in [Link::Near, Link::Far] {
            let (v, n) = selected_ratio(&series, (x, y), in_placement(link), value);
            l.insert(link.name().into(), json!({"value": v, "rounds": n}));
        }
        by_link.insert(key.into(), Value::Object(l));
        ratios.insert(key.into(), json!(r.value));
        kept.insert(key.into(), json!({"kept": r.kept, "measured": r.measured}));
        if let Some(m) = too_busy(key, &r) {
            busy.push(m);
            busy_keys.push(key);
        }
    }
    let mut doc = json!({
        "knb": "compare",
        "rounds": a.rounds,
        "order": order.iter().map(|s| s.name()).chain((!a.no_raw).then_some("raw")).collect::<Vec<_>>(),
        "config": a.workload.to_json(),
        "raw_frame_size": if a.no_raw { Value::Null } else { json!(frame) },
        "stacks": stacks,
        "thresholds": {"min_cpu": a.trust.min_cpu, "max_steal": a.trust.max_steal,
            "unstable_factor": a.trust.unstable_factor},
        "ratio_rounds": kept,
        "fast_mode": fast,
        "by_host_link": by_link,
        "host_link_far_ns": hostlink::FAR_NS,
        "too_busy": busy,
        "verdict": verdict(&busy_keys),
        "notes": notes,
        "runs": runs,
    });
    for (k, v) in ratios {
        doc[k.as_str()] = v;
    }
    doc["config"]["client_cpus"] = json!(a.place.client_cpus.0);
    doc["config"]["server_cpus"] = json!(a.place.server_cpus());

    print_doc(&doc, &a.trust);
    report::write_outputs(&a.out, &doc, &runs)?;
    if failures > 0 {
        return Err(Error::Run(format!(
            "{failures} run(s) failed (see the notes above)"
        )));
    }
    if a.trust.strict && !busy.is_empty() {
        return Err(Error::Run(format!(
            "--strict: {} (see above)",
            verdict(&busy_keys)
        )));
    }
    Ok(())
}

/// A raw round as a run report for [`contention::assess`]: the initiator's `cpu` (its own
/// and the reflector's threads and the host's steal over the measured window) when it
/// has one, else only the host's steal over the whole raw run (`before`, `after`).
pub(crate) fn raw_run_view(
    raw: &Value,
    before: &BTreeMap<u32, crate::cpu::CpuTimes>,
    after: &BTreeMap<u32, crate::cpu::CpuTimes>,
    cpus: (u32, u32),
) -> Value {
    let cpu = if raw["cpu"].is_object() {
        raw["cpu"].clone()
    } else {
        let used = [cpus.0 as usize, cpus.1 as usize];
        json!({"steal": crate::cpu::steal(before, after, &used)})
    };
    json!({
        "stack": "raw",
        "config": {"threads": 1, "client_cpus": [cpus.0], "server_cpus": [cpus.1]},
        "cpu": cpu,
    })
}

/// Prints the table, the ratios, what was left out and why, and the notes.
fn print_doc(doc: &Value, th: &TrustArgs) {
    println!(
        "{:<8} {:>12} {:>10} {:>10} {:>7}   per round RPC/s (C contended, U unstable, F CPUs \
         far apart, X placement changed, ? not probed)",
        "stack", "median RPC/s", "p50 us", "p99 us", "clean"
    );
    for (name, v) in doc["stacks"].as_object().into_iter().flatten() {
        if v["available"] == json!(false) {
            println!("{name:<8} not available");
            continue;
        }
        let f = |k: &str| v[k].as_f64().map_or("-".into(), |x| format!("{x:.1}"));
        let empty = Vec::new();
        let arr = |k: &str| v[k].as_array().unwrap_or(&empty).clone();
        let (rps, con, uns, link) = (arr("rps"), arr("contended"), arr("unstable"), arr("link"));
        let cells: Vec<String> = rps
            .iter()
            .enumerate()
            .map(|(i, r)| {
                cell(
                    r,
                    con.get(i).unwrap_or(&Value::Null),
                    uns.get(i).unwrap_or(&Value::Null),
                    link.get(i).unwrap_or(&Value::Null),
                )
            })
            .collect();
        println!(
            "{name:<8} {:>12} {:>10} {:>10} {:>7}   {}",
            f("median_rps"),
            f("median_p50_us"),
            f("median_p99_us"),
            format!("{}/{}", v["clean_rounds"], v["measured_rounds"]),
            cells.join(" / ")
        );
    }
    for (name, v) in doc["stacks"].as_object().into_iter().flatten() {
        for (i, c) in v["contention"].as_array().into_iter().flatten().enumerate() {
            if c["contended"] == json!(true) {
                let why: Vec<&str> = c["reasons"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                println!(
                    "  {name} round {}: contended, left out: {}",
                    i + 1,
                    why.join("; ")
                );
            }
        }
    }
    let unstable: Vec<String> = doc["stacks"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(name, v)| {
            let r: Vec<String> = v["unstable"]
                .as_array()?
                .iter()
                .enumerate()
                .filter(|(_, u)| **u == json!(true))
                .map(|(i, _)| (i + 1).to_string())
                .collect();
            (!r.is_empty()).then(|| format!("{name} round {}", r.join(",")))
        })
        .collect();
    if !unstable.is_empty() {
        println!(
            "  unstable (RPC/s beyond {}x of the stack's median: the machine's two-speed mode?): {}",
            th.unstable_factor,
            unstable.join("; ")
        );
    }
    println!(
        "ratios (median of per-round ratios over rounds where both were clean; p99 ratio < 1 \
         means lower latency):"
    );
    for (k, _, _, _) in RATIOS {
        let kept = &doc["ratio_rounds"][k];
        println!(
            "  {k:<22} {:>9}   ({}/{} rounds)",
            doc[k].as_f64().map_or("null".into(), |x| format!("{x:.3}")),
            kept["kept"],
            kept["measured"]
        );
    }
    println!(
        "fast-mode ratios (the same, over rounds where both stacks ran within {}x of their own \
         best round; fewer than two such rounds: null):",
        th.unstable_factor
    );
    for (k, _, _, _) in RATIOS {
        let f = &doc["fast_mode"][k];
        println!(
            "  {k:<22} {:>9}   ({} rounds)",
            f["value"]
                .as_f64()
                .map_or("null".into(), |x| format!("{x:.3}")),
            f["rounds"]
        );
    }
    println!(
        "ratios by the host's placement of the two CPUs (the same, over clean rounds where \
         both stacks ran near, or both far: a cache-line round trip under or over {:.0} ns \
         before and after each run):",
        hostlink::FAR_NS
    );
    for (k, _, _, _) in RATIOS {
        let l = &doc["by_host_link"][k];
        let one = |m: &str| {
            format!(
                "{} {:>9} ({} rounds)",
                m,
                l[m]["value"]
                    .as_f64()
                    .map_or("null".into(), |x| format!("{x:.3}")),
                l[m]["rounds"]
            )
        };
        println!("  {k:<22} {}   {}", one("near"), one("far"));
    }
    for m in doc["too_busy"].as_array().into_iter().flatten() {
        println!("TOO BUSY: {}", m.as_str().unwrap_or(""));
    }
    if doc["verdict"] != json!("ok") {
        println!(
            "knb compare: the machine was too busy to measure (contended rounds above); \
             the ratios marked null were not printed from starved rounds. Rerun when it is \
             quiet (load average, other tenants: docs/benchmarks.md)."
        );
    }
    for n in doc["notes"].as_array().into_iter().flatten() {
        println!("note: {}", n.as_str().unwrap_or(""));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_near_takes_bounded_seconds_only() {
        assert_eq!(parse_wait("0"), Ok(0.0));
        assert_eq!(parse_wait("30"), Ok(30.0));
        for bad in ["-1", "3601", "inf", "NaN", "soon"] {
            let e = parse_wait(bad).unwrap_err();
            assert!(e.contains("between 0 and 3600"), "{e}");
        }
    }

    #[test]
    fn median_of_rounds() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN]), None);
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn ratios_pair_rounds_and_skip_failures() {
        let mut s: Series = BTreeMap::new();
        s.insert("kernel", vec![p(100.0), p(200.0), p(100.0)]);
        s.insert("smoltcp", vec![p(300.0), None, p(500.0)]);
        // Rounds 1 and 3: 3.0 and 5.0 -> median 4.0.
        let r = ratio(&s, "smoltcp", "kernel", |p| p.rps);
        assert_eq!((r.value, r.kept, r.measured), (Some(4.0), 2, 2));
        assert_eq!(ratio(&s, "luna", "kernel", |p| p.rps).value, None);
        assert_eq!(too_busy("x", &ratio(&s, "luna", "kernel", |p| p.rps)), None);
    }

    /// A round where a stack completed no RPC in the window (rps 0, latency null) gives
    /// no per-round ratio (x/0, 0/x, NaN): it must not be counted among the rounds a
    /// ratio kept while the median silently leaves it out, and it must weigh the same
    /// whichever side of the ratio the stack is on.
    #[test]
    fn a_round_without_a_value_is_not_kept_on_either_side_of_a_ratio() {
        let zero = || {
            Some(Point {
                p50: f64::NAN,
                p99: f64::NAN,
                ..p(0.0).unwrap()
            })
        };
        let mut s: Series = BTreeMap::new();
        s.insert("kernel", vec![zero(), p(100.0), p(100.0)]);
        s.insert("luna", vec![p(300.0), p(300.0), p(500.0)]);
        for (a, b) in [("luna", "kernel"), ("kernel", "luna")] {
            let r = ratio(&s, a, b, |p| p.rps);
            assert_eq!((r.kept, r.measured), (2, 3), "{a}/{b}: {r:?}");
            assert!(
                r.starved.iter().any(|w| w.contains("round 1")),
                "{a}/{b}: {r:?}"
            );
            let t = ratio(&s, a, b, |p| p.p99);
            assert_eq!((t.kept, t.measured), (2, 3), "{a}/{b} p99: {t:?}");
        }
        let r = ratio(&s, "luna", "kernel", |p| p.rps);
        assert_eq!(r.value, median(&[3.0, 5.0]));
        let r = ratio(&s, "kernel", "luna", |p| p.rps);
        assert_eq!(r.value, median(&[1.0 / 3.0, 1.0 / 5.0]));
        // One valued round of two: too few, and said so.
        s.insert("kernel", vec![zero(), p(100.0)]);
        s.insert("luna", vec![p(300.0), p(300.0)]);
        let r = ratio(&s, "luna", "kernel", |p| p.rps);
        assert_eq!((r.value, r.kept, r.measured), (None, 1, 2), "{r:?}");
        assert!(too_busy("luna_vs_kernel_rps", &r).is_some());
        // The fast-mode and placement ratios count only the rounds their median used.
        s.insert("kernel", vec![zero(), p(100.0), p(100.0)]);
        s.insert("luna", vec![p(300.0), p(300.0), p(300.0)]);
        let all = |v: &[Option<Point>]| vec![true; v.len()];
        assert_eq!(
            selected_ratio(&s, ("luna", "kernel"), all, |p| p.rps),
            (Some(3.0), 2)
        );
        s.insert("kernel", vec![zero(), zero(), p(100.0)]);
        assert_eq!(
            selected_ratio(&s, ("kernel", "luna"), all, |p| p.rps),
            (None, 1)
        );
    }

    fn p(rps: f64) -> Option<Point> {
        Some(Point {
            rps,
            p50: 1.0,
            p99: rps / 10.0,
            health: Health::default(),
            link: None,
        })
    }

    /// A clean round of `rps` run in placement `link`.
    fn at(rps: f64, link: Link) -> Option<Point> {
        Some(Point {
            link: Some(link),
            ..p(rps).unwrap()
        })
    }

    /// The probe, not the RPC rate, decides which rounds compare: luna's fast round 1
    /// and smoltcp's slow one ran in the same near placement (a slow run with the CPUs
    /// near is the stack's own), round 3 changed placement during luna's run.
    #[test]
    fn ratios_by_placement_pair_rounds_run_in_the_same_one() {
        use Link::{Changed as X, Far as F, Near as N};
        let rounds = |v: &[(f64, Link)]| v.iter().map(|&(r, l)| at(r, l)).collect::<Vec<_>>();
        let mut s: Series = BTreeMap::new();
        s.insert(
            "luna",
            rounds(&[(300.0, N), (120.0, F), (200.0, X), (310.0, N), (125.0, F)]),
        );
        s.insert(
            "smoltcp",
            rounds(&[(150.0, N), (130.0, F), (330.0, N), (310.0, N), (330.0, N)]),
        );
        let (near, n) =
            selected_ratio(&s, ("luna", "smoltcp"), in_placement(Link::Near), |p| p.rps);
        assert_eq!(n, 2);
        assert_eq!(near, median(&[2.0, 1.0]));
        // One far round counts but is not a median (as the fast-mode ratio).
        let (far, n) = selected_ratio(&s, ("luna", "smoltcp"), in_placement(Link::Far), |p| p.rps);
        assert_eq!((far, n), (None, 1));
        s.get_mut("luna").unwrap()[4] = at(125.0, Link::Far);
        s.get_mut("smoltcp").unwrap()[4] = at(125.0, Link::Far);
        let (far, n) = selected_ratio(&s, ("luna", "smoltcp"), in_placement(Link::Far), |p| p.rps);
        assert_eq!((far, n), (median(&[120.0 / 130.0, 1.0]), 2));
        // A contended round never counts; unprobed rounds fall in neither placement.
        s.get_mut("luna").unwrap()[0] = judged("luna", 300.0, 0.4).map(|p| Point {
            link: Some(Link::Near),
            ..p
        });
        assert_eq!(
            selected_ratio(&s, ("luna", "smoltcp"), in_placement(Link::Near), |p| p.rps),
            (None, 1)
        );
        s.insert("kernel", vec![p(20.0); 5]);
        assert_eq!(
            selected_ratio(&s, ("luna", "kernel"), in_placement(Link::Near), |p| p.rps),
            (None, 0)
        );
        // Some round ran near: no note; none did: a note; none probed: no note.
        assert_eq!(placement_note(&s), None);
        let mut far: Series = BTreeMap::new();
        far.insert("luna", vec![at(120.0, Link::Far), at(130.0, Link::Changed)]);
        far.insert("kernel", vec![at(20.0, Link::Near), p(20.0)]);
        assert!(placement_note(&far).unwrap().contains("near"));
        far.insert("luna", vec![p(120.0)]);
        assert_eq!(placement_note(&far), None);
        // The table marks far and changed rounds.
        let c = |l: &str| cell(&json!(119402.0), &json!(false), &json!(false), &json!(l));
        assert_eq!(c("far"), "119402 F");
        assert_eq!(c("changed"), "119402 X");
        assert_eq!(c("near"), "119402");
        assert_eq!(
            cell(&json!(1.0), &json!(true), &json!(true), &Value::Null),
            "1 C U ?"
        );
    }

    /// A round whose `side` of `stack` got `cpu` of a CPU, judged as compare judges it.
    fn judged(stack: &str, rps: f64, server_cpu: f64) -> Option<Point> {
        let v = json!({"stack": stack, "config": {"threads": 1},
            "cpu": {"client": {"threads": [{"util": 0.99}]},
                    "server": {"threads": [{"util": server_cpu}]}}});
        Some(Point {
            health: contention::assess(&v, &TrustArgs::default()),
            ..p(rps).unwrap()
        })
    }

    /// The two-speed mode: luna fast in rounds 2-4, smoltcp in 1, 3 and 4. The median
    /// over all rounds mixes the speeds; the fast-mode ratio takes rounds 3 and 4 only.
    #[test]
    fn fast_mode_ratios_pair_rounds_where_both_ran_fast() {
        let mut s: Series = BTreeMap::new();
        s.insert("luna", vec![p(100.0), p(300.0), p(300.0), p(290.0)]);
        s.insert("smoltcp", vec![p(330.0), p(110.0), p(330.0), p(330.0)]);
        assert_eq!(fast_rounds(&s["luna"], 1.5), vec![false, true, true, true]);
        assert_eq!(
            fast_rounds(&s["smoltcp"], 1.5),
            vec![true, false, true, true]
        );
        let (v, n) = selected_ratio(&s, ("luna", "smoltcp"), |s| fast_rounds(s, 1.5), |p| p.rps);
        assert_eq!(n, 2);
        assert_eq!(v, median(&[300.0 / 330.0, 290.0 / 330.0]));
        // One both-fast round is not a median; a failed or contended round is never fast.
        s.insert("luna", vec![p(100.0), p(300.0), None, p(100.0)]);
        assert_eq!(
            selected_ratio(&s, ("luna", "smoltcp"), |s| fast_rounds(s, 1.5), |p| p.rps),
            (None, 0)
        );
        // A starved round (luna's server at 0.4 of a CPU) is neither fast nor the best.
        let starved = vec![judged("luna", 500.0, 0.4), judged("luna", 100.0, 0.99)];
        assert_eq!(fast_rounds(&starved, 1.5), vec![false, true]);
        assert_eq!(fast_rounds(&[], 1.5), Vec::<bool>::new());
    }

    #[test]
    fn ratios_exclude_contended_rounds() {
        let mut s: Series = BTreeMap::new();
        // Round 2: luna's server starved (and slow); round 4 clean.
        s.insert(
            "luna",
            vec![
                judged("luna", 250.0, 0.99),
                judged("luna", 110.0, 0.5),
                judged("luna", 260.0, 0.98),
                judged("luna", 255.0, 0.97),
            ],
        );
        s.insert(
            "smoltcp",
            vec![
                judged("smoltcp", 330.0, 0.99),
                judged("smoltcp", 320.0, 0.99),
                judged("smoltcp", 325.0, 0.99),
                judged("smoltcp", 340.0, 0.99),
            ],
        );
        let r = ratio(&s, "luna", "smoltcp", |p| p.rps);
        assert_eq!((r.kept, r.measured), (3, 4));
        // Median of 250/330, 260/325, 255/340 — the starved 110/320 is not among them.
        let want = median(&[250.0 / 330.0, 260.0 / 325.0, 255.0 / 340.0]).unwrap();
        assert_eq!(r.value, Some(want));
        assert_eq!(r.starved.len(), 1, "{r:?}");
        assert!(
            r.starved[0].starts_with("luna server (luna) got 0.50"),
            "{r:?}"
        );
        assert!(r.starved[0].ends_with("in round 2"), "{r:?}");
        assert_eq!(too_busy("luna_vs_smoltcp_rps", &r), None);
        // Medians per stack come from clean rounds only and count them.
        let e = stack_entry(&s["luna"], 1.5);
        assert_eq!(e["clean_rounds"], 3);
        assert_eq!(e["measured_rounds"], 4);
        assert_eq!(e["median_rps"], json!(255.0));
        assert_eq!(e["contended"], json!([false, true, false, false]));
        assert_eq!(e["unstable"], json!([false, true, false, false]));
        assert_eq!(
            cell(&json!(110.0), &json!(true), &json!(true), &json!("near")),
            "110 C U"
        );
        assert_eq!(
            cell(&json!(250.4), &json!(false), &json!(false), &json!("near")),
            "250"
        );
        assert_eq!(
            cell(&Value::Null, &Value::Null, &Value::Null, &Value::Null),
            "failed"
        );
    }

    #[test]
    fn too_few_clean_rounds_say_the_machine_was_too_busy() {
        let mut s: Series = BTreeMap::new();
        s.insert(
            "luna",
            vec![
                judged("luna", 250.0, 0.6),
                judged("luna", 110.0, 0.99),
                judged("luna", 260.0, 0.99),
            ],
        );
        s.insert("kernel", vec![p(20.0), p(20.0), p(20.0)]);
        // 2 of 3 clean: enough.
        assert!(ratio(&s, "luna", "kernel", |p| p.rps).value.is_some());
        s.get_mut("luna").unwrap()[1] = judged("luna", 110.0, 0.3);
        let r = ratio(&s, "luna", "kernel", |p| p.rps);
        assert_eq!((r.value, r.kept, r.measured), (None, 1, 3));
        let m = too_busy("luna_vs_kernel_rps", &r).expect("too busy");
        assert!(
            m.starts_with("the machine was too busy to measure luna_vs_kernel_rps: 1 of 3"),
            "{m}"
        );
        assert!(
            m.contains("luna server (luna) got 0.60") && m.contains("round 1"),
            "{m}"
        );
        assert!(m.contains("got 0.30") && m.contains("round 2"), "{m}");
        assert_eq!(
            verdict(&["luna_vs_kernel_rps", "luna_vs_raw_rps"]),
            "too busy to measure luna_vs_kernel_rps luna_vs_raw_rps"
        );
        assert_eq!(verdict(&[]), "ok");
        // One round, starved: too busy; one round, clean: measured.
        let mut one: Series = BTreeMap::new();
        one.insert("luna", vec![judged("luna", 100.0, 0.2)]);
        one.insert("kernel", vec![p(20.0)]);
        assert!(too_busy("k", &ratio(&one, "luna", "kernel", |p| p.rps)).is_some());
        one.insert("luna", vec![judged("luna", 100.0, 0.95)]);
        assert_eq!(ratio(&one, "luna", "kernel", |p| p.rps).value, Some(5.0));
    }

    #[test]
    fn raw_rounds_are_judged_by_steal() {
        let t = |total, steal| crate::cpu::CpuTimes { total, steal };
        let a: BTreeMap<u32, crate::cpu::CpuTimes> = [(0, t(100, 0)), (1, t(100, 0))].into();
        let quiet: BTreeMap<u32, crate::cpu::CpuTimes> = [(0, t(200, 1)), (1, t(200, 0))].into();
        let noisy: BTreeMap<u32, crate::cpu::CpuTimes> = [(0, t(200, 20)), (1, t(200, 10))].into();
        let th = TrustArgs::default();
        let old = json!({"frames_per_sec": 1.0});
        assert!(!contention::assess(&raw_run_view(&old, &a, &quiet, (0, 1)), &th).contended);
        let h = contention::assess(&raw_run_view(&old, &a, &noisy, (0, 1)), &th);
        assert!(h.contended && h.steal == Some(0.15), "{h:?}");
        // With the initiator's own samples: a starved reflector is caught.
        let sampled = json!({"cpu": {
            "client": {"threads": [{"util": 0.99}]},
            "server": {"threads": [{"util": 0.4}]},
            "steal": {"share": 0.0, "per_cpu": {"0": 0.0, "1": 0.0}}}});
        let h = contention::assess(&raw_run_view(&sampled, &a, &quiet, (0, 1)), &th);
        assert_eq!(h.starved, vec!["server"], "{h:?}");
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
