//! `msgsim`: command line of the CP / CS / MS queueing simulator (`msgsched::sim`).
//!
//! - `msgsim sweep`: p99 (and p50, p99.9) sojourn time against load, per model.
//! - `msgsim slo`: throughput under a p99 SLO per model and the MS/CS, MS/CP ratios.
//! - `msgsim validate`: MS-exp against M/M/c and CP-exp against M/M/1; fails above a tolerance.
//!
//! `--pauses` makes the server pause (a machine that stalls): `poisson:RATE:MEAN[:exp]` (RATE
//! per second, MEAN a duration) or `list:START+DURATION,...`, converted to the simulator's
//! time unit with `--unit` (how long one unit is, e.g. `100us` for a 100 µs mean service).
//!
//! Times are in units of `--mean` (default 1: units of the mean service time). Output is a
//! function of the arguments only (seeded; `--jobs` changes speed, not results). Bad input
//! exits with status 2, a failed validation with 1.

use std::fmt::Write as _;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use msgsched::sim::plot::{Plot, Series};
use msgsched::sim::{
    simulate_many, theory, throughput_under_slos, ConfigError, Model, PauseScope, Pauses, Service,
    SimConfig, SimResult, SloOutcome, SloSearch,
};
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "msgsim",
    about = "Queueing simulator of the CP / CS / MS message-scheduling models"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// p99 sojourn time against load, one line per model (and connection count).
    Sweep(SweepArgs),
    /// Throughput under a p99 SLO per model, and the MS/CS and MS/CP ratios.
    Slo(SloArgs),
    /// Simulation against closed forms: MS-exp vs M/M/c, CP-exp vs c x M/M/1.
    Validate(ValidateArgs),
}

#[derive(Args)]
struct Common {
    /// Models, comma-separated: cp, cs, ms.
    #[arg(long, value_delimiter = ',', default_value = "cp,cs,ms")]
    models: Vec<Model>,
    /// Workers (servers), c.
    #[arg(long, default_value_t = 20)]
    workers: usize,
    /// Connection counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "20")]
    connections: Vec<usize>,
    /// Service distribution: fixed, exp or bimodal.
    #[arg(long, default_value = "bimodal")]
    service: Service,
    /// Mean service time: the time unit of every output.
    #[arg(long, default_value_t = 1.0)]
    mean: f64,
    /// Measured messages per simulation.
    #[arg(long, default_value_t = 1_000_000)]
    requests: usize,
    /// Discarded warm-up messages per simulation [default: requests / 10].
    #[arg(long)]
    warmup: Option<usize>,
    /// Seed of every random stream.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Simulations run in parallel.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<String>,
    /// Write the results as CSV here.
    #[arg(long)]
    csv: Option<String>,
    /// Write an SVG plot here.
    #[arg(long)]
    svg: Option<String>,
    /// Server pauses: `poisson:RATE:MEAN` (RATE per second, MEAN a duration such as 2ms;
    /// fixed durations, `:exp` appended for exponential ones) or `list:START+DURATION,...`
    /// (durations from the start of the run). Needs --unit.
    #[arg(long)]
    pauses: Option<String>,
    /// How long one time unit is (e.g. 100us: the mean service time when --mean is 1), to
    /// convert --pauses.
    #[arg(long)]
    unit: Option<String>,
    /// What a pause stops: `server` (everything) or `io` (dispatch and delivery only: the
    /// workers keep working on what was dispatched before; MS and CP).
    #[arg(long, default_value = "server")]
    pause_scope: String,
}

#[derive(Args)]
struct SweepArgs {
    #[command(flatten)]
    common: Common,
    /// Loads: `start:end:step` (inclusive) or a comma-separated list, each in (0, 1).
    #[arg(long, default_value = "0.05:0.95:0.05")]
    loads: String,
}

#[derive(Args)]
struct SloArgs {
    #[command(flatten)]
    common: Common,
    /// p99 SLOs, comma-separated, in units of --mean.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "6,7,8,9,10,20",
        allow_negative_numbers = true
    )]
    slo: Vec<f64>,
    /// Load grid scanned before bisection: `start:end:step` or a list.
    #[arg(long, default_value = "0.01:0.99:0.01")]
    grid: String,
    /// Bisection steps between the last passing and the first failing grid load.
    #[arg(long, default_value_t = 5)]
    refine: u32,
    /// Also plot throughput under the SLO (per model) against the SLO here.
    #[arg(long)]
    svg_load: Option<String>,
}

#[derive(Args)]
struct ValidateArgs {
    /// Workers, c.
    #[arg(long, default_value_t = 20)]
    workers: usize,
    /// Loads: `start:end:step` or a comma-separated list.
    #[arg(long, default_value = "0.5,0.7,0.8,0.9,0.95")]
    loads: String,
    /// Measured messages per simulation.
    #[arg(long, default_value_t = 10_000_000)]
    requests: usize,
    /// Seed of every random stream.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Largest accepted relative error of the p99.
    #[arg(long, default_value_t = 0.05)]
    tolerance: f64,
    /// Simulations run in parallel.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// Write the rows as JSON here.
    #[arg(long)]
    json: Option<String>,
}

/// A failure: bad input (status 2) or an I/O error (status 1).
enum Failure {
    Usage(String),
    Io(String),
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Self {
        Failure::Usage(e.to_string())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse(); // clap reports its own errors with status 2
    let r = match cli.cmd {
        Cmd::Sweep(a) => sweep(a),
        Cmd::Slo(a) => slo(a),
        Cmd::Validate(a) => validate(a),
    };
    match r {
        Ok(code) => code,
        Err(Failure::Usage(m)) => {
            eprintln!("msgsim: error: {m}");
            ExitCode::from(2)
        }
        Err(Failure::Io(m)) => {
            eprintln!("msgsim: error: {m}");
            ExitCode::from(1)
        }
    }
}

/// `start:end:step` (inclusive, by step count so 0.05:0.99:0.01 has exactly 95 points) or a list.
fn parse_loads(spec: &str) -> Result<Vec<f64>, Failure> {
    let bad = |why: &str| Failure::Usage(format!("bad load list {spec:?}: {why}"));
    let num = |s: &str| {
        s.trim()
            .parse::<f64>()
            .map_err(|_| bad(&format!("{:?} is not a number", s.trim())))
    };
    let loads: Vec<f64> = if spec.contains(':') {
        let p: Vec<&str> = spec.split(':').collect();
        if p.len() != 3 {
            return Err(bad("expected start:end:step"));
        }
        let (a, b, step) = (num(p[0])?, num(p[1])?, num(p[2])?);
        if !(step > 0.0 && step.is_finite()) || b < a {
            return Err(bad("need step > 0 and end >= start"));
        }
        let n = ((b - a) / step + 1e-9).floor() as usize + 1;
        if n > 100_000 {
            return Err(bad("more than 100000 points"));
        }
        // Rounded to 1e-9 so 0.05 + 3 * 0.01 prints as 0.08.
        (0..n)
            .map(|i| ((a + i as f64 * step) * 1e9).round() / 1e9)
            .collect()
    } else {
        spec.split(',').map(num).collect::<Result<_, _>>()?
    };
    if loads.is_empty() {
        return Err(bad("empty"));
    }
    if let Some(l) = loads.iter().find(|l| !(**l > 0.0 && **l < 1.0)) {
        return Err(Failure::Usage(format!("load must be in (0, 1), got {l}")));
    }
    Ok(loads)
}

/// `2ms`, `500us`, `1.5s`, `800ns` in seconds.
fn parse_duration_s(s: &str) -> Result<f64, Failure> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ns") {
        (n, 1e-9)
    } else if let Some(n) = t.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(Failure::Usage(format!(
            "duration {s:?} needs a unit: ns, us, ms or s"
        )));
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v * scale),
        _ => Err(Failure::Usage(format!("bad duration {s:?}"))),
    }
}

/// `--pauses` in the simulator's time unit (`unit_s` seconds).
fn parse_pauses(spec: &str, unit_s: f64) -> Result<Pauses, Failure> {
    let bad = |why: &str| Failure::Usage(format!("--pauses {spec:?}: {why}"));
    if let Some(rest) = spec.strip_prefix("poisson:") {
        let p: Vec<&str> = rest.split(':').collect();
        let exponential = match p.get(2).copied() {
            None | Some("fixed") => false,
            Some("exp") => true,
            Some(_) => return Err(bad("the third field is fixed or exp")),
        };
        if p.len() < 2 || p.len() > 3 {
            return Err(bad("expected poisson:RATE:MEAN[:exp]"));
        }
        let rate: f64 = p[0]
            .trim()
            .trim_end_matches("/s")
            .parse()
            .map_err(|_| bad("RATE is a number of pauses per second"))?;
        let mean = parse_duration_s(p[1])?;
        return Ok(Pauses::Poisson {
            rate: rate * unit_s,
            mean: mean / unit_s,
            exponential,
        });
    }
    if let Some(rest) = spec.strip_prefix("list:") {
        let mut l = Vec::new();
        for item in rest.split(',').filter(|x| !x.trim().is_empty()) {
            let (a, d) = item
                .split_once('+')
                .ok_or_else(|| bad("list items are START+DURATION"))?;
            l.push((parse_duration_s(a)? / unit_s, parse_duration_s(d)? / unit_s));
        }
        return Ok(Pauses::List(l));
    }
    Err(bad(
        "expected poisson:RATE:MEAN[:exp] or list:START+DURATION,...",
    ))
}

/// The common arguments' pause process (None without --pauses).
fn pauses(c: &Common) -> Result<Option<Pauses>, Failure> {
    let Some(spec) = &c.pauses else {
        return Ok(None);
    };
    let unit = c.unit.as_deref().ok_or_else(|| {
        Failure::Usage("--pauses needs --unit (how long one time unit is, e.g. 100us)".into())
    })?;
    let unit_s = parse_duration_s(unit)?;
    if unit_s <= 0.0 {
        return Err(Failure::Usage("--unit must be > 0".into()));
    }
    let p = parse_pauses(spec, unit_s)?;
    p.validate()?;
    Ok(Some(p))
}

fn pauses_note(c: &Common) -> String {
    match (&c.pauses, &c.unit) {
        (Some(p), Some(u)) if c.pause_scope == "io" => {
            format!("; I/O-side pauses {p} (time unit {u})")
        }
        (Some(p), Some(u)) => format!("; server pauses {p} (time unit {u})"),
        _ => String::new(),
    }
}

fn check_common(c: &Common) -> Result<(), Failure> {
    if c.models.is_empty() {
        return Err(Failure::Usage("no model given".into()));
    }
    if c.connections.is_empty() {
        return Err(Failure::Usage("no connection count given".into()));
    }
    if c.jobs == 0 {
        return Err(Failure::Usage("jobs must be at least 1".into()));
    }
    if pause_scope(c)? == PauseScope::Io && c.models.contains(&Model::Cs) {
        // The simulator refuses it too, but `slo` would find out only after the models
        // before CS had run their searches.
        return Err(Failure::Usage(
            "--pause-scope io is modelled under MS and CP only: leave cs out of --models".into(),
        ));
    }
    Ok(())
}

/// `--pause-scope`.
fn pause_scope(c: &Common) -> Result<PauseScope, Failure> {
    match c.pause_scope.as_str() {
        "server" => Ok(PauseScope::Server),
        "io" => Ok(PauseScope::Io),
        other => Err(Failure::Usage(format!(
            "--pause-scope {other:?}: expected server or io"
        ))),
    }
}

fn base(
    c: &Common,
    pauses: &Option<Pauses>,
    model: Model,
    connections: usize,
    load: f64,
) -> SimConfig {
    SimConfig {
        mean_service: c.mean,
        requests: c.requests,
        warmup: c.warmup.unwrap_or(c.requests / 10),
        seed: c.seed,
        pauses: pauses.clone(),
        pause_scope: pause_scope(c).unwrap_or_default(),
        ..SimConfig::new(model, c.workers, connections, c.service, load)
    }
}

fn write(path: &Option<String>, body: &str) -> Result<(), Failure> {
    if let Some(p) = path {
        std::fs::write(p, body).map_err(|e| Failure::Io(format!("writing {p}: {e}")))?;
    }
    Ok(())
}

fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).expect("plain data serialises") + "\n"
}

fn model_label(m: Model) -> &'static str {
    match m {
        Model::Cp => "CP",
        Model::Cs => "CS",
        Model::Ms => "MS",
    }
}

fn model_color(m: Model) -> usize {
    match m {
        Model::Cp => 0,
        Model::Cs => 1,
        Model::Ms => 2,
    }
}

fn units(mean: f64) -> String {
    if mean == 1.0 {
        "× mean service time".into()
    } else {
        format!("time units, mean service {mean}")
    }
}

fn sweep(a: SweepArgs) -> Result<ExitCode, Failure> {
    let c = &a.common;
    check_common(c)?;
    let pz = pauses(c)?;
    let loads = parse_loads(&a.loads)?;
    let mut cfgs = Vec::new();
    for &n in &c.connections {
        for &m in &c.models {
            cfgs.extend(loads.iter().map(|&l| base(c, &pz, m, n, l)));
        }
    }
    let results = simulate_many(&cfgs, c.jobs)?;

    let mut out = String::new();
    let _ = writeln!(
        out,
        "# msgsim sweep: {} workers, {} service, {} measured messages per point, seed {}; sojourn in {}{}",
        c.workers,
        c.service,
        c.requests,
        c.seed,
        units(c.mean),
        pauses_note(c)
    );
    let _ = writeln!(
        out,
        "{:>5} {:>6} {:>6} {:>10} {:>10} {:>10} {:>10}",
        "model", "conns", "load", "mean", "p50", "p99", "p99.9"
    );
    let mut csv = String::from("model,workers,connections,service,load,mean,p50,p99,p999,max\n");
    for r in &results {
        let k = &r.config;
        let _ = writeln!(
            out,
            "{:>5} {:>6} {:>6.3} {:>10.4} {:>10.4} {:>10.4} {:>10.4}",
            k.model, k.connections, k.load, r.mean, r.p50, r.p99, r.p999
        );
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{}",
            k.model,
            k.workers,
            k.connections,
            k.service,
            k.load,
            r.mean,
            r.p50,
            r.p99,
            r.p999,
            r.max
        );
    }
    print!("{out}");
    write(&c.json, &json(&results))?;
    write(&c.csv, &csv)?;
    if c.svg.is_some() {
        let multi = c.connections.len() > 1;
        let series = c
            .connections
            .iter()
            .enumerate()
            .flat_map(|(ci, &n)| c.models.iter().map(move |&m| (ci, n, m)))
            .map(|(ci, n, m)| Series {
                name: if multi {
                    format!("{} {n} conn", model_label(m))
                } else {
                    model_label(m).to_string()
                },
                points: results
                    .iter()
                    .filter(|r| r.config.model == m && r.config.connections == n)
                    .map(|r| (r.config.load, r.p99))
                    .collect(),
                dashed: ci > 0,
                color: Some(model_color(m) + 3 * (ci / 2)),
            })
            .collect();
        let conns: Vec<String> = c.connections.iter().map(|n| n.to_string()).collect();
        let plot = Plot {
            title: format!(
                "p99 sojourn vs load: {} workers, {} conn, {} service",
                c.workers,
                conns.join("/"),
                c.service
            ),
            subtitle: format!(
                "msgsim sweep: Poisson open loop, zero overhead, {} messages per point, seed {}",
                c.requests, c.seed
            ),
            x_label: format!("load (fraction of {} workers)", c.workers),
            y_label: format!("p99 sojourn ({})", units(c.mean)),
            log_y: true,
            series,
            ..Default::default()
        };
        write(&c.svg, &plot.render())?;
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct SloRow {
    model: Model,
    workers: usize,
    connections: usize,
    service: Service,
    mean_service: f64,
    requests: usize,
    seed: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pauses: Option<Pauses>,
    /// Written only when not the default (as in a sweep's `config`).
    #[serde(skip_serializing_if = "is_server")]
    pause_scope: PauseScope,
    outcome: SloOutcome,
}

fn is_server(s: &PauseScope) -> bool {
    *s == PauseScope::Server
}

fn slo(a: SloArgs) -> Result<ExitCode, Failure> {
    let c = &a.common;
    check_common(c)?;
    let pz = pauses(c)?;
    if let Some(s) = a.slo.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
        return Err(Failure::Usage(format!(
            "SLO must be finite and > 0, got {s}"
        )));
    }
    if a.slo.is_empty() {
        return Err(Failure::Usage("no SLO given".into()));
    }
    let grid = parse_loads(&a.grid)?;
    let slos_abs: Vec<f64> = a.slo.iter().map(|s| s * c.mean).collect();
    let mut rows: Vec<SloRow> = Vec::new();
    for &n in &c.connections {
        for &m in &c.models {
            let search = SloSearch {
                grid: grid.clone(),
                refine: a.refine,
                jobs: c.jobs,
                ..SloSearch::new(base(c, &pz, m, n, grid[0]), slos_abs[0])
            };
            for o in throughput_under_slos(&search, &slos_abs)? {
                rows.push(SloRow {
                    model: m,
                    workers: c.workers,
                    connections: n,
                    service: c.service,
                    mean_service: c.mean,
                    requests: c.requests,
                    seed: c.seed,
                    pauses: pz.clone(),
                    pause_scope: search.base.pause_scope,
                    outcome: o,
                });
            }
        }
    }
    let load = |m: Model, n: usize, i: usize| {
        rows.iter()
            .filter(|r| r.model == m && r.connections == n)
            .nth(i)
            .map(|r| r.outcome.load)
    };
    let ratio = |num: Option<f64>, den: Option<f64>| match (num, den) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let fmt = |v: Option<f64>, sat: bool| match v {
        Some(x) => format!("{x:.3}{}", if sat { "+" } else { "" }),
        None => "-".into(),
    };

    let mut out = String::new();
    let _ = writeln!(
        out,
        "# msgsim slo: {} workers, {} service, {} measured messages per point, seed {}; SLO on p99 in {}{}",
        c.workers,
        c.service,
        c.requests,
        c.seed,
        units(c.mean),
        pauses_note(c)
    );
    let _ = writeln!(out, "# throughput under SLO = highest load (fraction of workers) with p99 <= SLO; '+' = every grid load passed");
    let mut head = format!("{:>6} {:>6}", "conns", "slo");
    for &m in &c.models {
        let _ = write!(head, " {:>7}", model_label(m));
    }
    head += "   MS/CS   MS/CP";
    let _ = writeln!(out, "{head}");
    let mut csv =
        String::from("connections,slo,model,load,saturated,p99_at_load,first_failing_grid_load\n");
    let mut ratio_csv = String::from("connections,slo,ms_over_cs,ms_over_cp\n");
    let mut ratio_series: Vec<Series> = Vec::new();
    let mut load_series: Vec<Series> = Vec::new();
    for (ci, &n) in c.connections.iter().enumerate() {
        let mut cs_ratio = Series {
            name: format!("MS/CS {n} conn"),
            color: Some(1 + 3 * ci),
            ..Default::default()
        };
        let mut cp_ratio = Series {
            name: format!("MS/CP {n} conn"),
            color: Some(3 * ci),
            dashed: true,
            ..Default::default()
        };
        for (i, &s) in a.slo.iter().enumerate() {
            let mut line = format!("{n:>6} {s:>6}");
            for &m in &c.models {
                let r = rows
                    .iter()
                    .filter(|r| r.model == m && r.connections == n)
                    .nth(i)
                    .expect("one row per (model, conns, slo)");
                let _ = write!(
                    line,
                    " {:>7}",
                    fmt(Some(r.outcome.load), r.outcome.saturated)
                );
                let _ = writeln!(
                    csv,
                    "{n},{s},{m},{},{},{},{}",
                    r.outcome.load,
                    r.outcome.saturated,
                    r.outcome
                        .p99_at_load
                        .map_or(String::new(), |p| (p / c.mean).to_string()),
                    r.outcome
                        .first_failing_grid_load
                        .map_or(String::new(), |l| l.to_string())
                );
            }
            let ms = load(Model::Ms, n, i);
            let (rcs, rcp) = (
                ratio(ms, load(Model::Cs, n, i)),
                ratio(ms, load(Model::Cp, n, i)),
            );
            let _ = writeln!(out, "{line} {:>7} {:>7}", fmt(rcs, false), fmt(rcp, false));
            let opt = |v: Option<f64>| v.map_or(String::new(), |x| x.to_string());
            let _ = writeln!(ratio_csv, "{n},{s},{},{}", opt(rcs), opt(rcp));
            if let Some(r) = rcs {
                cs_ratio.points.push((s, r));
            }
            if let Some(r) = rcp {
                cp_ratio.points.push((s, r));
            }
        }
        ratio_series.push(cs_ratio);
        ratio_series.push(cp_ratio);
        for &m in &c.models {
            load_series.push(Series {
                name: format!("{} {n} conn", model_label(m)),
                points: a
                    .slo
                    .iter()
                    .enumerate()
                    .filter_map(|(i, &s)| load(m, n, i).map(|l| (s, l)))
                    .collect(),
                dashed: ci > 0,
                color: Some(model_color(m) + 3 * (ci / 2)),
            });
        }
    }
    print!("{out}");
    write(&c.json, &json(&rows))?;
    write(&c.csv, &(csv + "\n" + &ratio_csv))?;
    let conns: Vec<String> = c.connections.iter().map(|n| n.to_string()).collect();
    let subtitle = format!(
        "msgsim slo: {} workers, {} service, {} messages per point, grid {} + {} bisections, seed {}",
        c.workers, c.service, c.requests, a.grid, a.refine, c.seed
    );
    if c.svg.is_some() {
        let plot = Plot {
            title: format!(
                "Throughput-under-SLO ratio vs SLO ({} conn)",
                conns.join("/")
            ),
            subtitle: subtitle.clone(),
            x_label: format!("p99 SLO ({})", units(c.mean)),
            y_label: "MS throughput / other model's throughput".into(),
            y_range: Some((
                0.0,
                ratio_series
                    .iter()
                    .flat_map(|s| s.points.iter().map(|p| p.1))
                    .fold(1.0, f64::max)
                    .ceil()
                    + 1.0,
            )),
            hlines: vec![(1.0, "1 (equal)".into())],
            series: ratio_series,
            ..Default::default()
        };
        write(&c.svg, &plot.render())?;
    }
    if a.svg_load.is_some() {
        let plot = Plot {
            title: format!("Throughput under p99 SLO ({} conn)", conns.join("/")),
            subtitle,
            x_label: format!("p99 SLO ({})", units(c.mean)),
            y_label: format!("highest load (fraction of {} workers)", c.workers),
            y_range: Some((0.0, 1.0)),
            series: load_series,
            ..Default::default()
        };
        write(&a.svg_load, &plot.render())?;
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct ValidateRow {
    model: Model,
    reference: &'static str,
    load: f64,
    theory_p99: f64,
    sim_p99: f64,
    rel_error: f64,
    pass: bool,
}

fn validate(a: ValidateArgs) -> Result<ExitCode, Failure> {
    let loads = parse_loads(&a.loads)?;
    if a.tolerance.is_nan() || a.tolerance <= 0.0 {
        return Err(Failure::Usage(format!(
            "tolerance must be > 0, got {}",
            a.tolerance
        )));
    }
    if a.jobs == 0 {
        return Err(Failure::Usage("jobs must be at least 1".into()));
    }
    let c = a.workers;
    let mk = |m, l| SimConfig {
        requests: a.requests,
        warmup: a.requests / 10,
        seed: a.seed,
        ..SimConfig::new(m, c, c, Service::Exp, l)
    };
    let cfgs: Vec<SimConfig> = [Model::Ms, Model::Cp]
        .iter()
        .flat_map(|&m| loads.iter().map(move |&l| mk(m, l)))
        .collect();
    let results: Vec<SimResult> = simulate_many(&cfgs, a.jobs)?;
    let mut rows = Vec::new();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# msgsim validate: exponential service, {c} workers, {c} connections, {} measured messages per point, seed {}; p99 sojourn in units of the mean",
        a.requests, a.seed
    );
    let _ = writeln!(
        out,
        "{:>5} {:>9} {:>6} {:>10} {:>10} {:>9}  ok",
        "model", "reference", "load", "theory", "sim", "rel.err"
    );
    for r in &results {
        let k = &r.config;
        let (reference, theory_p99) = match k.model {
            Model::Ms => ("M/M/c", theory::mmc_sojourn_quantile(c, k.load, 1.0, 0.99)),
            _ => ("M/M/1", theory::mm1_sojourn_quantile(k.load, 1.0, 0.99)),
        };
        let rel_error = (r.p99 - theory_p99) / theory_p99;
        let pass = rel_error.abs() <= a.tolerance;
        let _ = writeln!(
            out,
            "{:>5} {:>9} {:>6.2} {:>10.3} {:>10.3} {:>+8.2}%  {}",
            k.model,
            reference,
            k.load,
            theory_p99,
            r.p99,
            100.0 * rel_error,
            if pass { "ok" } else { "FAIL" }
        );
        rows.push(ValidateRow {
            model: k.model,
            reference,
            load: k.load,
            theory_p99,
            sim_p99: r.p99,
            rel_error,
            pass,
        });
    }
    let failed = rows.iter().filter(|r| !r.pass).count();
    let _ = writeln!(
        out,
        "{}",
        if failed == 0 {
            format!("all {} within {}%", rows.len(), 100.0 * a.tolerance)
        } else {
            format!("{failed} of {} beyond {}%", rows.len(), 100.0 * a.tolerance)
        }
    );
    print!("{out}");
    write(&a.json, &json(&rows))?;
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_parse_into_time_units() {
        // 100 us units: 5 pauses/s is 0.0005 per unit, 2 ms is 20 units.
        let p = parse_pauses("poisson:5:2ms:exp", 100e-6).ok().unwrap();
        let Pauses::Poisson {
            rate,
            mean,
            exponential,
        } = p
        else {
            panic!("{p:?}")
        };
        assert!((rate - 0.0005).abs() < 1e-12 && (mean - 20.0).abs() < 1e-9 && exponential);
        let l = parse_pauses("list:1s+3ms,2s+500us", 1e-3).ok().unwrap();
        let Pauses::List(v) = l else { panic!() };
        assert_eq!(v.len(), 2);
        assert!((v[0].0 - 1000.0).abs() < 1e-9 && (v[0].1 - 3.0).abs() < 1e-9);
        for bad in [
            "poisson:5",
            "poisson:x:2ms",
            "poisson:5:2:exp",
            "list:1s",
            "burst:1",
        ] {
            assert!(parse_pauses(bad, 1.0).is_err(), "{bad}");
        }
        assert!(parse_duration_s("2ms").is_ok_and(|d| (d - 0.002).abs() < 1e-15));
        assert!(parse_duration_s("-1ms").is_err());
    }

    #[test]
    fn pause_scope_parses_or_is_a_usage_error() {
        use clap::Parser;
        let scope = |args: &[&str]| {
            let mut v = vec!["msgsim", "sweep", "--models", "ms"];
            v.extend_from_slice(args);
            let Cmd::Sweep(a) = Cli::try_parse_from(v).unwrap().cmd else {
                panic!()
            };
            let r = pause_scope(&a.common);
            (r.as_ref().ok().copied(), check_common(&a.common).is_err())
        };
        assert_eq!(scope(&[]), (Some(PauseScope::Server), false));
        assert_eq!(
            scope(&["--pause-scope", "io"]),
            (Some(PauseScope::Io), false)
        );
        assert_eq!(scope(&["--pause-scope", "kernel"]), (None, true));
        // CS is refused up front (not after the other models' searches have run).
        assert_eq!(
            scope(&["--models", "cp,cs,ms", "--pause-scope", "io"]),
            (Some(PauseScope::Io), true)
        );
        assert_eq!(
            scope(&["--models", "cp,cs,ms", "--pause-scope", "server"]),
            (Some(PauseScope::Server), false)
        );
    }

    /// `msgsim slo --json` says which pauses its rows had: an I/O-side scope is written
    /// (a row without it reads as server pauses), the default scope is not (the JSON of
    /// runs without `--pause-scope` is unchanged).
    #[test]
    fn slo_json_rows_record_the_pause_scope() {
        use clap::Parser;
        let path = std::env::temp_dir().join(format!("msgsim-slo-{}.json", std::process::id()));
        let run = |scope: &str| {
            let p = path.to_str().unwrap();
            let args = [
                "msgsim",
                "slo",
                "--models",
                "ms",
                "--workers",
                "2",
                "--connections",
                "2",
                "--requests",
                "2000",
                "--slo",
                "20",
                "--grid",
                "0.3,0.5",
                "--refine",
                "0",
                "--pauses",
                "list:1ms+2ms",
                "--unit",
                "100us",
                "--pause-scope",
                scope,
                "--jobs",
                "1",
                "--json",
                p,
            ];
            let Cmd::Slo(a) = Cli::try_parse_from(args).unwrap().cmd else {
                panic!()
            };
            assert!(slo(a).is_ok());
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            std::fs::remove_file(&path).unwrap();
            v[0].get("pause_scope").cloned()
        };
        assert_eq!(run("io"), Some(serde_json::json!("io")));
        assert_eq!(run("server"), None);
    }
}
