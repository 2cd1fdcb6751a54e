//! `knb sweep --figure slo`: p99 vs achieved load for the kernel server models (open loop,
//! emulated service times), throughput under an SLO, and (`--ideal`) that throughput as a
//! fraction of the simulator's ideal MS (msgsched::sim) for the same workers, connections,
//! service distribution, mean and SLO.
//!
//! Throughput under SLO of measured points follows `msgsched::sim::throughput_under_slo`'s
//! grid rule without its bisection (a real run per bisection step is too expensive): scan
//! the offered loads upward; `L` is the highest offered load such that it **and every lower
//! one** pass (p99 <= SLO and no arrival dropped); the answer is the highest achieved load
//! among the passing prefix (0 if the lowest fails; flagged `saturated` if all pass).
//!
//! A point whose *client* fell behind its own schedule is flagged and does not pass:
//! latencies are measured from the scheduled send times (no coordinated omission), so a
//! late client inflates them, and such a point cannot say whether the server met the SLO.
//! The bound is [`CLIENT_LAG_SLO_FRACTION`] of the SLO on the p99 of the client's send lag
//! (scheduled time to hand-over to the stack).
//!
//! A point is flagged `STALLED` when the server's or the client's poll loop (luna: r2c's
//! loop-stall counters, [`crate::stalls`]) had a gap of at least half the SLO inside the
//! measured window: one such stall can hold every arrival behind it past the SLO. The
//! flag is information next to the verdict, never part of it: a stalled point passes
//! or fails like any other (the machine is part of what is measured).

use serde_json::{json, Value};

use crate::backend;
use crate::report;
use crate::run::{self, Placement};
use crate::service::{Emu, ServiceSpec};
use crate::svg::{self, Chart, Series};
use crate::sweep::SweepArgs;
use crate::workload::{Cpus, Error, ModeArg, Res, Workload};

/// An SLO: a multiple of the mean service time or an absolute time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Slo {
    /// `10x`: 10 × the mean service time.
    Times(f64),
    /// `500us`: absolute, in ns.
    Abs(u64),
}

/// Parses `10x` or a duration (`500us`, `1ms`).
pub fn parse_slo(s: &str) -> Result<Slo, String> {
    if let Some(x) = s.trim().strip_suffix('x') {
        let v: f64 = x
            .parse()
            .map_err(|_| format!("--slo {s:?}: expected e.g. 10x or 500us"))?;
        if !(v.is_finite() && v > 0.0) {
            return Err(format!("--slo {s:?}: the multiple must be > 0"));
        }
        return Ok(Slo::Times(v));
    }
    crate::service::parse_duration_ns(s)
        .map(Slo::Abs)
        .map_err(|e| format!("--slo: {e} (or a multiple of the mean, e.g. 10x)"))
}

impl Slo {
    /// The SLO in µs for mean service `mean_ns`.
    pub fn us(self, mean_ns: u64) -> f64 {
        match self {
            Slo::Times(x) => x * mean_ns as f64 / 1e3,
            Slo::Abs(ns) => ns as f64 / 1e3,
        }
    }
}

/// One measured point.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Offered load (fraction of capacity).
    pub offered: f64,
    /// Achieved load (completed RPC/s / capacity).
    pub achieved: f64,
    /// p99 latency (µs), None when no request scheduled in the window was answered.
    pub p99_us: Option<f64>,
    /// Arrivals dropped (the client had no room).
    pub dropped: u64,
    /// p99 of the client's send lag (µs), None when not reported.
    pub client_lag_p99_us: Option<f64>,
    /// Server's and client's loop stalls in the window combined, None when not reported.
    pub stalls: Option<crate::stalls::Stalls>,
    /// The run itself failed (no report): the point cannot pass, and the scan stops
    /// there instead of skipping it.
    pub failed: bool,
}

/// A point whose client's p99 send lag exceeds this fraction of the SLO is flagged
/// `client_behind` (module docs).
pub const CLIENT_LAG_SLO_FRACTION: f64 = 0.05;

impl Point {
    /// Whether the client fell behind its schedule by more than the SLO allows.
    pub fn client_behind(&self, slo_us: f64) -> bool {
        self.client_lag_p99_us
            .is_some_and(|l| l > CLIENT_LAG_SLO_FRACTION * slo_us)
    }

    /// Whether a loop stalled for at least half the SLO in the window (`Some(true)`:
    /// flag `STALLED`); None when not reported or the buckets cannot tell. Not part of
    /// [`Point::failure`].
    pub fn stalled(&self, slo_us: f64) -> Option<bool> {
        let half_ns = (slo_us * 1e3 / 2.0).round() as u64;
        self.stalls?.had_gap_of(half_ns)
    }

    /// The flag column: `CLIENT-BEHIND`, `STALLED` (`STALLED?` when undecided), both, or
    /// empty.
    pub fn flags(&self, slo_us: f64) -> String {
        let mut f = Vec::new();
        if self.client_behind(slo_us) {
            f.push("CLIENT-BEHIND");
        }
        match (self.stalls.is_some(), self.stalled(slo_us)) {
            (_, Some(true)) => f.push("STALLED"),
            (true, None) => f.push("STALLED?"),
            _ => {}
        }
        f.join(" ")
    }

    /// Why the point does not pass `slo_us`, or None if it does.
    pub fn failure(&self, slo_us: f64) -> Option<&'static str> {
        if self.failed {
            Some("the run failed")
        } else if self.client_behind(slo_us) {
            Some("client behind its schedule")
        } else if self.dropped > 0 {
            Some("arrivals dropped")
        } else {
            match self.p99_us {
                None => Some("no request of the window answered"),
                Some(q) if q > slo_us => Some("p99 above the SLO"),
                Some(_) => None,
            }
        }
    }
}

/// Throughput under SLO of measured points.
#[derive(Clone, Debug, PartialEq)]
pub struct Tus {
    /// Achieved load (fraction of capacity); 0 when the lowest point fails.
    pub load: f64,
    /// Every point passed: the true answer may be higher.
    pub saturated: bool,
    /// Offered load of the first failing point.
    pub first_failing: Option<f64>,
    /// Why it failed ([`Point::failure`]).
    pub first_failing_reason: Option<&'static str>,
}

/// Throughput under `slo_us` (module docs).
pub fn throughput_under_slo(points: &[Point], slo_us: f64) -> Tus {
    let mut p: Vec<&Point> = points.iter().collect();
    p.sort_by(|a, b| a.offered.total_cmp(&b.offered));
    let mut best = 0.0f64;
    for x in &p {
        if let Some(why) = x.failure(slo_us) {
            return Tus {
                load: best,
                saturated: false,
                first_failing: Some(x.offered),
                first_failing_reason: Some(why),
            };
        }
        best = best.max(x.achieved);
    }
    Tus {
        load: best,
        saturated: !p.is_empty(),
        first_failing: None,
        first_failing_reason: None,
    }
}

/// The simulator's throughput under SLO (fraction of the workers) for `model`.
pub fn ideal(
    model: msgsched::sim::Model,
    workers: u32,
    conns: u32,
    svc: ServiceSpec,
    slo_us: f64,
) -> Result<msgsched::sim::SloOutcome, String> {
    ideal_paused(model, workers, conns, svc, slo_us, None)
}

/// A sweep's measured stalls as a pause process: the server's and the client's loop gaps
/// of at least 1 ms over every point's window, as Poisson pauses (per second) with
/// exponential durations of their mean (ns).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MeasuredPauses {
    /// Gaps >= 1 ms per second of measured window (server and client added).
    pub rate_per_s: f64,
    /// Their mean length (ns).
    pub mean_ns: f64,
    /// How many gaps ...
    pub count: u64,
    /// ... in how many seconds of windows.
    pub seconds: f64,
}

impl MeasuredPauses {
    /// From the runs' stalls (`default_window_s` for a side that has no window length);
    /// None when no side had a gap of 1 ms or more.
    pub fn of(stalls: &[crate::stalls::Stalls], default_window_s: f64) -> Option<Self> {
        let (mut count, mut ns, mut secs) = (0u64, 0u64, 0f64);
        for s in stalls {
            count += s.gaps[2];
            ns += s.stall_1ms_ns;
            secs += s.window_ns.map_or(default_window_s, |n| n as f64 / 1e9);
        }
        (count > 0 && secs > 0.0).then(|| MeasuredPauses {
            rate_per_s: count as f64 / secs,
            mean_ns: ns as f64 / count as f64,
            count,
            seconds: secs,
        })
    }

    /// In the simulator's time unit (the mean service time `mean_ns`).
    pub fn sim(&self, mean_ns: u64) -> msgsched::sim::Pauses {
        let unit_s = mean_ns as f64 / 1e9;
        msgsched::sim::Pauses::Poisson {
            rate: self.rate_per_s * unit_s,
            mean: self.mean_ns / mean_ns as f64,
            exponential: true,
        }
    }
}

/// [`ideal`] on a server that pauses as `pauses` says.
pub fn ideal_paused(
    model: msgsched::sim::Model,
    workers: u32,
    conns: u32,
    svc: ServiceSpec,
    slo_us: f64,
    pauses: Option<msgsched::sim::Pauses>,
) -> Result<msgsched::sim::SloOutcome, String> {
    use msgsched::sim::{SimConfig, SloSearch};
    let (requests, coarse) = sim_requests(workers, pauses.as_ref());
    // The measured stalls stop the I/O side (dispatch and delivery; the client's stop
    // arrivals), while the workers keep working through them on what was dispatched
    // before, as r2c's virtual workers do since their start times (msgsched's
    // `VirtualPool`). CS's releases need the I/O side, which the simulator does not model
    // per connection: there a pause stops the whole server.
    let pause_scope = if model == msgsched::sim::Model::Cs {
        msgsched::sim::PauseScope::Server
    } else {
        msgsched::sim::PauseScope::Io
    };
    let base = SimConfig {
        requests,
        warmup: 20_000,
        pauses,
        pause_scope,
        ..SimConfig::new(
            model,
            workers as usize,
            conns as usize,
            svc.sim_service(),
            0.5,
        )
    };
    let mut s = SloSearch::new(base, slo_us * 1e3 / svc.mean_ns as f64);
    s.jobs = 2;
    if coarse {
        // Long runs: scan in steps of 0.05 (the bisection still resolves 0.05 / 32).
        s.grid = (1..=19).map(|i| f64::from(i) / 20.0).collect();
    }
    msgsched::sim::throughput_under_slo(&s).map_err(|e| e.to_string())
}

/// Pauses every run should see, in expectation, at the highest load scanned (0.95):
/// with fewer, whether a load passes depends on whether a pause happened to fall into
/// its run (200,000 messages at 20 workers and 100 us are ~1 s of simulated time, about
/// one pause at this machine's ~1 per second), and the reference says nothing.
const PAUSES_PER_RUN: f64 = 40.0;
/// Bounds on the messages per simulated load (8 M: a few seconds of simulation each).
const SIM_REQUESTS: (usize, usize) = (200_000, 8_000_000);

/// Messages per simulated load, and whether the scan should be coarse (long runs): enough
/// for [`PAUSES_PER_RUN`] pauses at load 0.95 when the server pauses at a Poisson rate.
fn sim_requests(workers: u32, pauses: Option<&msgsched::sim::Pauses>) -> (usize, bool) {
    let (lo, hi) = SIM_REQUESTS;
    match pauses {
        Some(msgsched::sim::Pauses::Poisson { rate, .. }) if *rate > 0.0 => {
            // Arrivals per time unit at load L are L * workers; a run of n messages spans
            // n / (L * workers) units and sees rate * that many pauses.
            let n = PAUSES_PER_RUN * 0.95 * f64::from(workers) / rate;
            let n = if n.is_finite() { n.ceil() as usize } else { hi };
            (n.clamp(lo, hi), n > lo)
        }
        _ => (lo, false),
    }
}

/// A run's server and client loop stalls combined (luna; None for other backends).
fn point_stalls(r: &Value) -> Option<crate::stalls::Stalls> {
    match crate::stalls::of_run(r) {
        (Some(s), Some(c)) => Some(s.combine(&c)),
        (s, c) => s.or(c),
    }
}

/// The longest gap: exact, or the range the buckets allow.
fn max_gap_text(s: &crate::stalls::Stalls) -> String {
    match s.max_ns() {
        Some(n) => format!("{:.0}", n as f64 / 1e3),
        None if s.max_hi_ns == u64::MAX => format!(">={:.0}", s.max_lo_ns as f64 / 1e3),
        None => format!(
            "{:.0}-{:.0}",
            s.max_lo_ns as f64 / 1e3,
            s.max_hi_ns as f64 / 1e3
        ),
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").to_string()
}

/// `knb sweep --figure slo`.
pub fn run(a: &SweepArgs) -> Res<()> {
    let svc = a.service;
    let slo = a
        .slo
        .ok_or_else(|| Error::Usage("--figure slo needs --slo (e.g. 10x or 500us)".into()))?;
    if a.models.is_empty() || a.loads.is_empty() {
        return Err(Error::Usage(
            "--models and --loads need at least one value".into(),
        ));
    }
    if let Some(l) = a.loads.iter().find(|l| !(**l > 0.0 && **l <= 2.0)) {
        return Err(Error::Usage(format!("--loads: {l} is outside (0, 2]")));
    }
    if (a.rpc_size as usize) < crate::service::TAG_LEN {
        return Err(Error::Usage(format!(
            "--rpc-size must be >= {} (the service tag)",
            crate::service::TAG_LEN
        )));
    }
    if !a.out_dir.is_dir() {
        return Err(Error::Usage(format!(
            "--out-dir {} is not a directory",
            a.out_dir.display()
        )));
    }
    let slo_us = slo.us(svc.mean_ns);
    let capacity = a.workers as f64 / svc.mean_s();
    let place = Placement {
        client_cpus: a.client_cpus.clone().unwrap_or(Cpus(vec![0])),
        server_cpus: a.server_cpus.clone(),
        port: run::DEFAULT_PORT,
        prefix: a.prefix.clone(),
    };
    place.validate()?;
    let prefix = place.prefix()?;
    for &m in &a.models {
        run::check_server_model(a.slo_stack, Some(m))?;
    }
    run::check_service_mode(a.slo_stack, a.service_mode)?;
    let b = backend::backend(a.slo_stack);
    if let Some(why) = b.unavailable() {
        return Err(Error::Usage(format!(
            "--slo-stack {}: {why}",
            a.slo_stack.name()
        )));
    }
    run::sweep_stale();
    let topo = run::topology_for(b, &prefix)?;
    let total = a.loads.len() * a.models.len();
    eprintln!(
        "knb sweep --figure slo: {total} runs of {} s (+{} s warm-up), capacity {:.0} RPC/s \
         ({} workers / {} us mean), SLO {slo_us} us",
        a.duration,
        a.warmup,
        capacity,
        a.workers,
        svc.mean_ns as f64 / 1e3
    );
    let mut rows: Vec<Value> = Vec::new();
    let mut notes = Vec::new();
    // Failed runs, with the whole error (the notes keep its first line).
    let mut failed: Vec<Value> = Vec::new();
    let mut failures = 0;
    let mut done = 0;
    let mut loads = a.loads.clone();
    loads.sort_by(f64::total_cmp);
    for &load in &loads {
        for &m in &a.models {
            done += 1;
            let w = Workload {
                req_size: a.rpc_size,
                resp_size: a.rpc_size,
                iodepth: 1,
                connections: a.slo_connections,
                threads: 1,
                duration: a.duration,
                warmup: a.warmup,
                rate: Some(load * capacity),
                verify: false,
                mode: ModeArg::Rpc,
                mtu: 1500,
                memif_zero_copy: false,
                emu: Emu {
                    service: Some(svc),
                    service_mode: a.service_mode,
                    unordered: a.unordered,
                    server_model: Some(m),
                    workers: a.workers,
                },
            };
            eprintln!(
                "knb sweep: [{done}/{total}] {} load {load:.2} ({:.0} RPC/s)",
                m.name(),
                load * capacity
            );
            match run::run_on(&topo, b, &w, &place, a.progress) {
                Ok(r) => {
                    let o = &r["open_loop"];
                    let ach = o["achieved_rps"].as_f64().unwrap_or(0.0);
                    let st = point_stalls(&r);
                    let load_avg = std::fs::read_to_string("/proc/loadavg")
                        .unwrap_or_default()
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .to_string();
                    rows.push(json!({
                        "stack": a.slo_stack.name(),
                        "model": m.name(), "offered_load": load, "offered_rps": load * capacity,
                        "achieved_rps": ach, "achieved_load": ach / capacity,
                        "p50_us": r["latency_us"]["p50"], "p99_us": r["latency_us"]["p99"],
                        "p999_us": r["latency_us"]["p999"],
                        "dropped_arrivals": o["dropped_arrivals"],
                        "behind_schedule": o["behind_schedule"], "sent": o["sent"],
                        "client_lag_p99_us": o["send_lag_us"]["p99"],
                        "client_lag_max_us": o["send_lag_us"]["max"],
                        "sent_not_answered": o["sent_not_answered"],
                        "cpu_client": r["cpu"]["client"]["cores"],
                        "cpu_server": r["cpu"]["server"]["cores"],
                        "loadavg_1m": load_avg,
                        "stall_1ms_us": st.map(|s| s.stall_1ms_ns as f64 / 1e3),
                        "stall_max_us": st.and_then(|s| s.max_ns()).map(|n| n as f64 / 1e3),
                        "stall_max_at_least_us": st.map(|s| s.max_lo_ns as f64 / 1e3),
                        "stalled": st.map(|s| s.had_gap_of((slo_us * 1e3 / 2.0).round() as u64)),
                        // Timer mode: how much the emulation credited its workers (start
                        // times) and how late their replies left; null otherwise.
                        "virtual_credit_share": r["server"]["extra"]["virtual_workers"]["credit_share"],
                        "virtual_late_p99_us": r["server"]["extra"]["virtual_workers"]["late_p99_us"],
                        "run": r,
                    }));
                }
                Err(e) => {
                    failures += 1;
                    notes.push(format!(
                        "{} load {load}: failed: {}",
                        m.name(),
                        first_line(&e)
                    ));
                    failed.push(json!({
                        "model": m.name(), "offered_load": load, "error": e,
                    }));
                }
            }
        }
    }
    drop(topo);
    // Per model: points, throughput under SLO, ideal.
    let ideal_ms = if a.ideal {
        Some(
            ideal(
                msgsched::sim::Model::Ms,
                a.workers,
                a.slo_connections,
                svc,
                slo_us,
            )
            .map_err(Error::Run)?,
        )
    } else {
        None
    };
    // Each side of each run once: the server's loop and the client's lanes, per window.
    let sides: Vec<crate::stalls::Stalls> = rows
        .iter()
        .flat_map(|r| {
            let (s, c) = crate::stalls::of_run(&r["run"]);
            s.into_iter().chain(c)
        })
        .collect();
    let measured = MeasuredPauses::of(&sides, a.duration);
    let ideal_stalled = match (a.ideal, measured) {
        (true, Some(m)) => Some(
            ideal_paused(
                msgsched::sim::Model::Ms,
                a.workers,
                a.slo_connections,
                svc,
                slo_us,
                Some(m.sim(svc.mean_ns)),
            )
            .map_err(Error::Run)?,
        ),
        _ => None,
    };
    let mut models = serde_json::Map::new();
    let mut series = Vec::new();
    println!(
        "{:<5} {:>7} {:>10} {:>10} {:>8} {:>9} {:>9} {:>9} {:>7} {:>7} {:>9} {:>9} {:>8} {:>11}  flag",
        "model",
        "offered",
        "offer/s",
        "achieved/s",
        "ach.load",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "dropped",
        "behind",
        "unanswrd",
        "lag99 us",
        "stall ms",
        "maxgap us"
    );
    for &m in &a.models {
        let mine: Vec<&Value> = rows.iter().filter(|r| r["model"] == m.name()).collect();
        let mut pts: Vec<Point> = mine
            .iter()
            .map(|r| Point {
                offered: r["offered_load"].as_f64().unwrap_or(0.0),
                achieved: r["achieved_load"].as_f64().unwrap_or(0.0),
                p99_us: r["p99_us"].as_f64(),
                dropped: r["dropped_arrivals"].as_u64().unwrap_or(0),
                client_lag_p99_us: r["client_lag_p99_us"].as_f64(),
                stalls: point_stalls(&r["run"]),
                failed: false,
            })
            .collect();
        let failed_here = failed
            .iter()
            .filter(|f| f["model"] == m.name())
            .map(|f| Point {
                offered: f["offered_load"].as_f64().unwrap_or(0.0),
                achieved: 0.0,
                p99_us: None,
                dropped: 0,
                client_lag_p99_us: None,
                stalls: None,
                failed: true,
            });
        let measured = pts.len();
        pts.extend(failed_here);
        for (r, pt) in mine.iter().zip(&pts[..measured]) {
            let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
            let (stall_ms, max_gap) = match &pt.stalls {
                Some(s) => (
                    format!("{:.1}", s.stall_1ms_ns as f64 / 1e6),
                    max_gap_text(s),
                ),
                None => ("-".into(), "-".into()),
            };
            println!(
                "{:<5} {:>7.2} {:>10.0} {:>10.0} {:>8.3} {:>9.1} {:>9.1} {:>9.1} {:>7} {:>7} {:>9} {:>9.1} {:>8} {:>11}  {}",
                m.name(),
                f("offered_load"),
                f("offered_rps"),
                f("achieved_rps"),
                f("achieved_load"),
                f("p50_us"),
                f("p99_us"),
                f("p999_us"),
                r["dropped_arrivals"],
                r["behind_schedule"],
                r["sent_not_answered"],
                f("client_lag_p99_us"),
                stall_ms,
                max_gap,
                pt.flags(slo_us)
            );
        }
        let t = throughput_under_slo(&pts, slo_us);
        let frac = ideal_ms.as_ref().map(|i| t.load / i.load);
        let frac_stalled = ideal_stalled
            .as_ref()
            .filter(|i| i.load > 0.0)
            .map(|i| t.load / i.load);
        models.insert(
            m.name().into(),
            json!({
                "throughput_under_slo_load": t.load,
                "throughput_under_slo_rps": t.load * capacity,
                "saturated": t.saturated,
                "first_failing_offered_load": t.first_failing,
                "first_failing_reason": t.first_failing_reason,
                "client_behind_offered_loads": pts
                    .iter()
                    .filter(|p| p.client_behind(slo_us))
                    .map(|p| p.offered)
                    .collect::<Vec<f64>>(),
                "fraction_of_ideal_ms": frac,
                "fraction_of_ideal_ms_under_measured_stalls": frac_stalled,
                "stalled_offered_loads": pts
                    .iter()
                    .filter(|p| p.stalled(slo_us) == Some(true))
                    .map(|p| p.offered)
                    .collect::<Vec<f64>>(),
            }),
        );
        series.push(Series {
            name: m.name().to_string(),
            points: mine
                .iter()
                .filter_map(|r| Some((r["achieved_rps"].as_f64()?, r["p99_us"].as_f64()?)))
                .collect(),
            ..Default::default()
        });
    }
    let max_x = rows
        .iter()
        .filter_map(|r| r["achieved_rps"].as_f64())
        .fold(capacity, f64::max);
    series.push(Series {
        name: format!("SLO {slo_us} us"),
        points: vec![(0.0, slo_us), (max_x, slo_us)],
        ..Default::default()
    });
    for (name, v) in &models {
        let t = &v["throughput_under_slo_rps"];
        let f = v["fraction_of_ideal_ms"]
            .as_f64()
            .map(|x| format!(", {:.2} of ideal MS", x))
            .unwrap_or_default();
        let why = match (
            v["first_failing_offered_load"].as_f64(),
            v["first_failing_reason"].as_str(),
        ) {
            (Some(l), Some(r)) => format!("; first failing offered load {l:.2}: {r}"),
            _ => String::new(),
        };
        println!(
            "throughput under SLO ({slo_us} us): {name} {:.0} RPC/s ({:.3} of capacity{}{f}){why}",
            t.as_f64().unwrap_or(0.0),
            v["throughput_under_slo_load"].as_f64().unwrap_or(0.0),
            if v["saturated"] == true {
                ", saturated: every load passed"
            } else {
                ""
            },
        );
    }
    if let Some(i) = &ideal_ms {
        println!(
            "ideal MS (msgsched::sim, {} workers, {} connections, {}): {:.3} of capacity ({:.0} RPC/s)",
            a.workers,
            a.slo_connections,
            svc.to_arg(),
            i.load,
            i.load * capacity
        );
    }
    if let (Some(i), Some(m)) = (&ideal_stalled, &measured) {
        println!(
            "second reference, not the goal's: ideal MS under this sweep's measured stalls \
             (server + client loop gaps >= 1 ms: {} in {:.1} s of windows = {:.2}/s, mean {:.2} ms, \
             as exponential pauses of the I/O side, the workers running through them; {} \
             simulated messages per load): {:.3} of capacity \
             ({:.0} RPC/s)",
            m.count,
            m.seconds,
            m.rate_per_s,
            m.mean_ns / 1e6,
            sim_requests(a.workers, Some(&m.sim(svc.mean_ns))).0,
            i.load,
            i.load * capacity
        );
    }
    let mode = a.service_mode.name();
    let chart = Chart {
        title: format!(
            "p99 vs achieved load: {} server models, {} workers, {} {} service",
            a.slo_stack.name(),
            a.workers,
            svc.to_arg(),
            mode
        ),
        subtitle: format!(
            "{} connections, {} B RPCs, open loop Poisson, {} s per point; SLO {slo_us} us",
            a.slo_connections, a.rpc_size, a.duration
        ),
        x_label: "achieved load (RPC/s)".into(),
        y_label: "p99 latency (µs, from scheduled send)".into(),
        log_y: true,
        series,
        ..Default::default()
    };
    let dir = &a.out_dir;
    report::write_file(&dir.join("fig-slo.svg"), &svg::render(&chart))?;
    let mut csv = String::from(
        "model,offered_load,offered_rps,achieved_rps,achieved_load,p50_us,p99_us,p999_us,dropped_arrivals,behind_schedule,client_lag_p99_us,sent_not_answered,cpu_client,cpu_server,loadavg_1m,stall_1ms_us,stall_max_us,stall_max_at_least_us,stalled,virtual_credit_share,virtual_late_p99_us\n",
    );
    for r in &rows {
        let cells: Vec<String> = [
            "model",
            "offered_load",
            "offered_rps",
            "achieved_rps",
            "achieved_load",
            "p50_us",
            "p99_us",
            "p999_us",
            "dropped_arrivals",
            "behind_schedule",
            "client_lag_p99_us",
            "sent_not_answered",
            "cpu_client",
            "cpu_server",
            "loadavg_1m",
            "stall_1ms_us",
            "stall_max_us",
            "stall_max_at_least_us",
            "stalled",
            "virtual_credit_share",
            "virtual_late_p99_us",
        ]
        .iter()
        .map(|k| match &r[*k] {
            Value::Null => String::new(),
            Value::String(s) => s.clone(),
            v => v.to_string(),
        })
        .collect();
        csv.push_str(&cells.join(","));
        csv.push('\n');
    }
    report::write_file(&dir.join("fig-slo.csv"), &csv)?;
    let doc = json!({
        "knb": "sweep-slo",
        "service": svc.to_arg(), "service_mode": mode, "workers": a.workers,
        "connections": a.slo_connections, "rpc_size": a.rpc_size,
        "capacity_rps": capacity, "slo_us": slo_us,
        "definition": "highest achieved load among the offered loads that, with every lower one, have p99 <= SLO, no dropped arrival and a client on schedule (p99 send lag <= 5% of the SLO) (msgsched::sim grid rule, no bisection)",
        "client_lag_slo_fraction": CLIENT_LAG_SLO_FRACTION,
        "stalled": "a server or client poll loop (luna) had a gap >= SLO/2 in the measured window (null: the buckets cannot tell); information, not part of the verdict",
        "virtual_credit_share": "timer mode: time the virtual workers' occupations started before the I/O core's turn took their messages (a real worker's start: its previous deadline or the message's arrival), over the requested occupancy (null: not timer mode); virtual_late_p99_us: how late the I/O core noticed the occupations' ends (the replies' emulation delay)",
        "ideal_ms": ideal_ms,
        "ideal_ms_under_measured_stalls": ideal_stalled.as_ref().zip(measured.as_ref()).map(|(i, m)| json!({
            "note": "a second reference (the goal's is ideal_ms): the simulator's MS with pauses of the I/O side (dispatch and delivery held, workers running through them on what was dispatched before) at the rate and mean of this sweep's server + client loop gaps >= 1 ms, exponential durations",
            "stalls": m.count, "window_s": m.seconds, "rate_per_s": m.rate_per_s,
            "mean_ms": m.mean_ns / 1e6, "outcome": i,
        })),
        "models": models, "notes": notes, "points": rows, "failed_runs": failed,
    });
    let jp = a.json.clone().unwrap_or_else(|| dir.join("fig-slo.json"));
    report::write_file(
        &jp,
        &(serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"),
    )?;
    eprintln!(
        "knb sweep: wrote {}, {}, {}",
        dir.join("fig-slo.svg").display(),
        dir.join("fig-slo.csv").display(),
        jp.display()
    );
    for n in &notes {
        eprintln!("note: {n}");
    }
    if failures > 0 {
        return Err(Error::Run(format!("{failures} sweep run(s) failed")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(offered: f64, achieved: f64, p99: f64) -> Point {
        Point {
            offered,
            achieved,
            p99_us: Some(p99),
            dropped: 0,
            client_lag_p99_us: Some(3.0),
            stalls: None,
            failed: false,
        }
    }

    /// Window stalls with one gap of `gap_ns` (0: none).
    fn stalls(gap_ns: u64) -> crate::stalls::Stalls {
        let mut b = r2c::CoreStats::default();
        if gap_ns > 0 {
            b.loop_gaps_100us = 1;
            b.loop_gaps_500us = u64::from(gap_ns >= 500_000);
            b.loop_gaps_1ms = u64::from(gap_ns >= 1_000_000);
            b.loop_gap_ns = gap_ns;
            b.loop_gap_1ms_ns = if gap_ns >= 1_000_000 { gap_ns } else { 0 };
            b.loop_gap_max_ns = gap_ns;
        }
        crate::stalls::Stalls::between(&r2c::CoreStats::default(), &b, Some(2_000_000_000))
    }

    #[test]
    fn a_point_with_a_long_stall_is_flagged_and_the_verdict_does_not_change() {
        let mut pts = vec![
            pt(0.1, 0.1, 300.0),
            pt(0.2, 0.2, 350.0),
            pt(0.3, 0.3, 1400.0),
        ];
        let before = throughput_under_slo(&pts, 1000.0);
        // 0.1: no stall; 0.2: a 200 us gap (under SLO/2 = 500 us); 0.3: a 1.7 ms gap.
        pts[0].stalls = Some(stalls(0));
        pts[1].stalls = Some(stalls(200_000));
        pts[2].stalls = Some(stalls(1_700_000));
        assert_eq!(pts[0].stalled(1000.0), Some(false));
        assert_eq!(pts[1].stalled(1000.0), Some(false));
        assert_eq!(pts[2].stalled(1000.0), Some(true));
        assert_eq!(pts[0].flags(1000.0), "");
        assert_eq!(pts[2].flags(1000.0), "STALLED");
        // The same 200 us gap is a stall against a 300 us SLO.
        assert_eq!(pts[1].stalled(300.0), Some(true));
        // Information only: a stalled point passes or fails as before.
        assert_eq!(throughput_under_slo(&pts, 1000.0), before);
        pts[1].stalls = Some(stalls(900_000));
        assert_eq!(pts[1].flags(1000.0), "STALLED");
        assert_eq!(throughput_under_slo(&pts, 1000.0), before);
        // Both flags; unknown stalls (another backend): no flag.
        pts[2].client_lag_p99_us = Some(60.0);
        assert_eq!(pts[2].flags(1000.0), "CLIENT-BEHIND STALLED");
        pts[2].stalls = None;
        assert_eq!(pts[2].stalled(1000.0), None);
        assert_eq!(pts[2].flags(1000.0), "CLIENT-BEHIND");
    }

    #[test]
    fn a_run_reports_its_stalls_in_the_point() {
        let s = stalls(1_200_000);
        let r = json!({"server": {"extra": {"loop_stalls": s.to_json()}},
            "client_extra": [{"loop_stalls": stalls(0).to_json()}]});
        let p = point_stalls(&r).unwrap();
        assert_eq!(p.max_ns(), Some(1_200_000));
        assert_eq!(p.stall_1ms_ns, 1_200_000);
        assert_eq!(max_gap_text(&p), "1200");
        assert_eq!(point_stalls(&json!({"server": {"extra": {}}})), None);
    }

    #[test]
    fn slo_specs_parse() {
        assert_eq!(parse_slo("10x"), Ok(Slo::Times(10.0)));
        assert_eq!(parse_slo("500us"), Ok(Slo::Abs(500_000)));
        assert_eq!(Slo::Times(10.0).us(100_000), 1000.0);
        assert_eq!(Slo::Abs(2_000_000).us(1), 2000.0);
        assert!(parse_slo("0x").is_err());
        assert!(parse_slo("fast").is_err());
    }

    #[test]
    fn throughput_under_slo_is_the_passing_prefix() {
        // Passing 0.1..0.5, failing at 0.6, passing again at 0.7 (noise): the answer stops
        // at the first failure, like msgsched::sim's grid rule.
        let pts = vec![
            pt(0.3, 0.29, 400.0),
            pt(0.1, 0.1, 300.0),
            pt(0.2, 0.2, 350.0),
            pt(0.5, 0.48, 900.0),
            pt(0.6, 0.55, 1500.0),
            pt(0.7, 0.6, 800.0),
        ];
        let t = throughput_under_slo(&pts, 1000.0);
        assert_eq!(t.load, 0.48);
        assert_eq!(t.first_failing, Some(0.6));
        assert!(!t.saturated);
        // All pass: saturated, highest achieved.
        let t = throughput_under_slo(&pts[..4], 1000.0);
        assert!(t.saturated && t.load == 0.48);
        // First fails: 0.
        let t = throughput_under_slo(&pts, 100.0);
        assert_eq!(t.load, 0.0);
        assert_eq!(t.first_failing, Some(0.1));
        // A point that dropped arrivals or completed nothing fails whatever its p99.
        let mut d = pts.clone();
        d[2].dropped = 1;
        assert_eq!(throughput_under_slo(&d, 1000.0).load, 0.1);
        d[2].dropped = 0;
        d[2].p99_us = None;
        assert_eq!(throughput_under_slo(&d, 1000.0).first_failing, Some(0.2));
        assert_eq!(throughput_under_slo(&[], 1.0).load, 0.0);
        assert_eq!(
            throughput_under_slo(&d, 1000.0).first_failing_reason,
            Some("no request of the window answered")
        );
    }

    #[test]
    fn a_point_whose_client_was_behind_does_not_pass() {
        let mut pts = vec![
            pt(0.1, 0.1, 300.0),
            pt(0.2, 0.2, 350.0),
            pt(0.3, 0.3, 400.0),
        ];
        // 5% of a 1 ms SLO: 50 us of p99 send lag is allowed, 51 is not, even though the
        // point's own p99 is under the SLO.
        pts[1].client_lag_p99_us = Some(50.0);
        assert!(throughput_under_slo(&pts, 1000.0).saturated);
        pts[1].client_lag_p99_us = Some(51.0);
        assert!(pts[1].client_behind(1000.0) && !pts[0].client_behind(1000.0));
        let t = throughput_under_slo(&pts, 1000.0);
        assert_eq!(t.load, 0.1);
        assert_eq!(t.first_failing, Some(0.2));
        assert_eq!(t.first_failing_reason, Some("client behind its schedule"));
        // Unknown lag (an older report): not flagged.
        pts[1].client_lag_p99_us = None;
        assert!(throughput_under_slo(&pts, 1000.0).saturated);
    }

    /// A point whose run failed (no report) stops the scan: the passing points above it
    /// do not count, as if it had passed.
    #[test]
    fn a_failed_run_stops_the_scan() {
        let mut pts = vec![pt(0.1, 0.1, 300.0), pt(0.3, 0.3, 400.0), pt(0.2, 0.0, 0.0)];
        pts[2] = Point {
            failed: true,
            p99_us: None,
            ..pts[2].clone()
        };
        let t = throughput_under_slo(&pts, 1000.0);
        assert_eq!((t.load, t.first_failing), (0.1, Some(0.2)));
        assert_eq!(t.first_failing_reason, Some("the run failed"));
    }

    #[test]
    fn measured_stalls_become_a_pause_process_and_lower_the_ideal() {
        // Two sides over 2 s windows: three gaps >= 1 ms in all, 6 ms in them.
        let mut a = stalls(2_000_000);
        a.window_ns = Some(2_000_000_000);
        let mut b = stalls(2_000_000).combine(&stalls(2_000_000));
        b.window_ns = None; // counted as the default 2 s
        let m = MeasuredPauses::of(&[a, b, stalls(200_000)], 2.0).unwrap();
        assert_eq!(m.count, 3);
        assert!((m.seconds - 6.0).abs() < 1e-9);
        assert!((m.rate_per_s - 0.5).abs() < 1e-12);
        assert!((m.mean_ns - 2e6).abs() < 1e-6);
        let msgsched::sim::Pauses::Poisson {
            rate,
            mean,
            exponential,
        } = m.sim(100_000)
        else {
            panic!()
        };
        assert!((rate - 0.5e-4).abs() < 1e-15 && (mean - 20.0).abs() < 1e-9 && exponential);
        assert_eq!(MeasuredPauses::of(&[stalls(300_000)], 2.0), None);
        // Frequent long pauses cost the ideal MS throughput under a 1 ms SLO.
        let svc = crate::service::parse_service("bimodal:100us").unwrap();
        let heavy = MeasuredPauses {
            rate_per_s: 20.0,
            mean_ns: 2e6,
            count: 1,
            seconds: 1.0,
        };
        let plain = ideal(msgsched::sim::Model::Ms, 4, 20, svc, 1000.0).unwrap();
        let paused = ideal_paused(
            msgsched::sim::Model::Ms,
            4,
            20,
            svc,
            1000.0,
            Some(heavy.sim(svc.mean_ns)),
        )
        .unwrap();
        assert!(paused.load < plain.load, "{paused:?} vs {plain:?}");
    }

    #[test]
    fn a_paused_ideal_simulates_long_enough_to_see_the_pauses() {
        use msgsched::sim::Pauses;
        // No pauses, or pauses so frequent that 200,000 messages see enough: the default.
        assert_eq!(sim_requests(20, None), (200_000, false));
        let often = Pauses::Poisson {
            rate: 0.01,
            mean: 20.0,
            exponential: true,
        };
        assert_eq!(sim_requests(20, Some(&often)), (200_000, false));
        // This machine's ~1 pause per second at a 100 us unit: 1e-4 per unit. 40 pauses at
        // load 0.95 with 20 workers need 40 * 0.95 * 20 / 1e-4 = 7.6 M messages.
        let measured = Pauses::Poisson {
            rate: 1e-4,
            mean: 26.0,
            exponential: true,
        };
        let (n, coarse) = sim_requests(20, Some(&measured));
        assert!(coarse && (7_600_000..=7_600_001).contains(&n), "{n}");
        // Rarer pauses are capped.
        let rare = Pauses::Poisson {
            rate: 1e-6,
            mean: 26.0,
            exponential: true,
        };
        assert_eq!(sim_requests(20, Some(&rare)), (8_000_000, true));
    }

    #[test]
    fn ideal_ms_beats_cp_with_few_connections() {
        let svc = crate::service::parse_service("bimodal:100us").unwrap();
        let ms = ideal(msgsched::sim::Model::Ms, 4, 20, svc, 1000.0).unwrap();
        let cp = ideal(msgsched::sim::Model::Cp, 4, 4, svc, 1000.0).unwrap();
        assert!(ms.load > cp.load, "{ms:?} {cp:?}");
        assert!(ms.load > 0.3 && ms.load < 1.0, "{ms:?}");
    }
}
