//! `knb sweep`: the shape of LUNA's figures 9–12 on this machine, as CSV + SVG.
//!
//! | figure | x | y | fixed |
//! |---|---|---|---|
//! | fig9-msgsize | message size (req = resp) | Gbit/s (both directions) | iodepth 1 |
//! | fig10-iodepth | iodepth | RPC/s (and p99 in fig10-iodepth-p99) | `--size` |
//! | fig11-cdf | latency (µs) | fraction of RPCs | `--size`, iodepth 1 |
//! | fig12-cores | threads (cores) per side | RPC/s | `--size`, `--cores-iodepth` |
//!
//! One connection per thread, stacks alternated at every point, the raw memif
//! ceiling where one frame holds the message. Each point is one short `knb rpc` run.
//! `--memif-modes copy,zero-copy` runs each memif stack (luna, smoltcp) in both of memif's
//! modes, as two series (`luna`, `luna zero-copy`). The sweep ends with LUNA's three claims
//! read off the points it measured ([`claims`]; `figs-claims.csv`).

use std::path::PathBuf;

use clap::Args;
use serde_json::{json, Value};

use crate::backend;
use crate::compare::raw_frame;
use crate::contention;
use crate::raw;
use crate::report;
use crate::run::{self, Placement};
use crate::svg::{self, Chart, Series};
use crate::workload::{
    parse_cpus, parse_secs, parse_size, Cpus, Error, ModeArg, Res, Stack, Workload,
};

/// Which figures to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Figure {
    /// fig9: message size.
    Msgsize,
    /// fig10: iodepth.
    Iodepth,
    /// fig11: latency CDF.
    Cdf,
    /// fig12: cores.
    Cores,
    /// p99 vs achieved load of the kernel server models (open loop, service times),
    /// throughput under --slo ([`crate::slo`]); run on its own.
    Slo,
}

/// memif's two modes (docs/benchmarks.md, "memif zero-copy mode").
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MemifMode {
    /// The PMD copies every frame on both ends (the default of `knb rpc`).
    Copy,
    /// The client's memif is `zero-copy=yes` (`--memif-zero-copy`).
    ZeroCopy,
}

/// One series of the sweep: a stack, and for the memif stacks the memif mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    stack: Stack,
    zero_copy: bool,
}

impl Entry {
    /// The series' name in the figures and the CSVs' `series` column.
    fn name(self) -> &'static str {
        match (self.stack, self.zero_copy) {
            (Stack::Luna, true) => "luna zero-copy",
            (Stack::Smoltcp, true) => "smoltcp zero-copy",
            (s, _) => s.name(),
        }
    }
}

/// The series of a sweep: every stack in `stacks` order; the memif stacks once per mode in
/// `modes`, the kernel (veth) once.
fn entries(stacks: &[Stack], modes: &[MemifMode]) -> Vec<Entry> {
    let mut out = Vec::new();
    for &stack in stacks {
        let memif = stack != Stack::Kernel;
        let zcs: Vec<bool> = if memif {
            modes.iter().map(|m| *m == MemifMode::ZeroCopy).collect()
        } else {
            vec![false]
        };
        for zero_copy in zcs {
            let e = Entry { stack, zero_copy };
            if !out.contains(&e) {
                out.push(e);
            }
        }
    }
    out
}

/// Arguments of `knb sweep`.
#[derive(Args, Debug, Clone)]
pub struct SweepArgs {
    /// Stacks (unavailable ones are skipped with a note).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "kernel,smoltcp,luna"
    )]
    pub stacks: Vec<Stack>,
    /// Figures to make.
    #[arg(
        long,
        alias = "figure",
        value_enum,
        value_delimiter = ',',
        default_value = "msgsize,iodepth,cdf,cores"
    )]
    pub figures: Vec<Figure>,
    /// Message sizes of fig9.
    #[arg(long, value_delimiter = ',', default_value = "64,256,1k,4k,16k,64k", value_parser = parse_size)]
    pub sizes: Vec<u32>,
    /// Iodepths of fig10.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub iodepths: Vec<u32>,
    /// Threads (cores) per side of fig12.
    #[arg(long, value_delimiter = ',', default_value = "1,2", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub cores: Vec<u32>,
    /// Message size of fig10-12.
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    pub size: u32,
    /// Iodepth per connection of fig12.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub cores_iodepth: u32,
    /// Measured seconds per point.
    #[arg(long, default_value = "2", value_parser = parse_secs)]
    pub duration: f64,
    /// Warm-up seconds per point.
    #[arg(long, default_value = "0.5", value_parser = parse_secs)]
    pub warmup: f64,
    /// memif modes of the memif stacks (luna, smoltcp): each mode is its own series; the
    /// kernel is unaffected and the raw ceiling keeps copy mode.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "copy")]
    pub memif_modes: Vec<MemifMode>,
    /// Leave out the raw memif ceiling.
    #[arg(long)]
    pub no_raw: bool,
    /// Where the CSV and SVG files go.
    #[arg(long, default_value = "docs")]
    pub out_dir: PathBuf,
    /// Also write every run's report as one JSON document.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// CPUs: client threads on these (wrapping) [default: even CPUs].
    #[arg(long, value_parser = parse_cpus)]
    pub client_cpus: Option<Cpus>,
    /// CPUs: server threads on these [default: odd CPUs].
    #[arg(long, value_parser = parse_cpus)]
    pub server_cpus: Option<Cpus>,
    // An attribute, not a doc comment: rustdoc would read `<pid>` as an HTML tag.
    #[arg(long, help = "Testbed name prefix [default: lkb<pid>].")]
    pub prefix: Option<String>,
    /// Progress lines on stderr even when it is not a terminal.
    #[arg(long)]
    pub progress: bool,
    /// --figure slo: the p99 target, a multiple of the mean service time (10x) or a time
    /// (500us).
    #[arg(long, value_parser = crate::slo::parse_slo)]
    pub slo: Option<crate::slo::Slo>,
    /// --figure slo: also divide throughput under SLO by msgsched::sim's ideal MS.
    #[arg(long)]
    pub ideal: bool,
    /// --figure slo: the stack whose server models run (kernel: cp, cs, pool; luna: cp, cs,
    /// ms in r2c's message mode).
    #[arg(long, value_enum, default_value = "kernel")]
    pub slo_stack: Stack,
    /// --figure slo: server models to compare.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "cp,cs,pool")]
    pub models: Vec<crate::service::ServerModel>,
    /// --figure slo: offered loads as fractions of capacity (workers / mean service).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9"
    )]
    pub loads: Vec<f64>,
    /// --figure slo: service-time distribution and mean.
    #[arg(long, default_value = "bimodal:100us", value_parser = crate::service::parse_service)]
    pub service: crate::service::ServiceSpec,
    /// --figure slo: how workers are occupied.
    #[arg(long, value_enum, default_value = "sleep")]
    pub service_mode: crate::service::ServiceMode,
    /// --figure slo: server worker threads.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub workers: u32,
    /// --figure slo: client connections.
    #[arg(long = "connections", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=16384))]
    pub slo_connections: u32,
    /// --figure slo: request and response payload bytes (>= 8).
    #[arg(long, default_value = "64", value_parser = parse_size)]
    pub rpc_size: u32,
    /// --figure slo: the pool replies out of order (the client matches by id).
    #[arg(long)]
    pub unordered: bool,
    #[command(flatten)]
    pub trust: crate::contention::TrustArgs,
}

fn ncpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// One measured point.
struct Pt {
    /// The series ([`Entry::name`], or `raw`).
    stack: &'static str,
    x: f64,
    run: Value,
}

fn rpc_point(stack: &'static str, x: f64, r: &Value) -> Pt {
    Pt {
        stack,
        x,
        run: r.clone(),
    }
}

struct Sweeper<'a> {
    a: &'a SweepArgs,
    order: Vec<Entry>,
    topos: std::collections::BTreeMap<testbed::Kind, testbed::Topology>,
    notes: Vec<String>,
    runs: Vec<Value>,
    failures: usize,
    contended: usize,
    done: usize,
    total: usize,
}

impl Sweeper<'_> {
    /// The workload of a point; [`Self::stacks_at`] sets the memif mode per series.
    fn workload(&self, size: u32, iodepth: u32, threads: u32) -> Workload {
        Workload {
            req_size: size,
            resp_size: size,
            iodepth,
            connections: threads,
            threads,
            duration: self.a.duration,
            warmup: self.a.warmup,
            rate: None,
            verify: false,
            mode: ModeArg::Rpc,
            mtu: 1500,
            memif_zero_copy: false,
            emu: Default::default(),
        }
    }

    fn placement(&self, threads: u32) -> Placement {
        let n = ncpus();
        let cc = self
            .a
            .client_cpus
            .clone()
            .unwrap_or_else(|| Cpus((0..threads as usize).map(|i| (2 * i) % n).collect()));
        let sc = self
            .a
            .server_cpus
            .clone()
            .unwrap_or_else(|| Cpus((0..threads as usize).map(|i| (2 * i + 1) % n).collect()));
        Placement {
            client_cpus: cc,
            server_cpus: Some(sc),
            port: run::DEFAULT_PORT,
            prefix: None,
        }
    }

    fn step(&mut self, what: &str) {
        self.done += 1;
        eprintln!("knb sweep: [{}/{}] {what}", self.done, self.total);
    }

    /// Runs every stack at one point.
    fn stacks_at(&mut self, w: &Workload, x: f64, label: &str, out: &mut Vec<Pt>) {
        let place = self.placement(w.threads);
        for e in self.order.clone() {
            let name = e.name();
            self.step(&format!("{label} {name}"));
            let b = backend::backend(e.stack);
            let mut w = w.clone();
            w.memif_zero_copy = e.zero_copy;
            match run::run_on(&self.topos[&b.topology()], b, &w, &place, self.a.progress) {
                Ok(mut r) => {
                    r["sweep_point"] = json!(label);
                    r["series"] = json!(name);
                    let h = contention::assess(&r, &self.a.trust);
                    if h.contended {
                        self.contended += 1;
                        self.notes.push(format!("{label} {name}: {}", h.describe()));
                    }
                    r["contention"] = h.to_json();
                    out.push(rpc_point(name, x, &r));
                    self.runs.push(r);
                }
                Err(err) => {
                    self.failures += 1;
                    self.notes
                        .push(format!("{label} {name}: failed: {}", first_line(&err)));
                }
            }
        }
    }

    /// The raw ceiling at one point (None when one frame cannot hold the message).
    fn raw_at(&mut self, w: &Workload, x: f64, label: &str, out: &mut Vec<Pt>) {
        let (frame, capped) = raw_frame(w);
        if self.a.no_raw || capped {
            return;
        }
        self.step(&format!("{label} raw"));
        let place = self.placement(1);
        let cpus = (place.client_cpus.0[0] as u32, place.server_cpus()[0] as u32);
        let args = raw::RawArgs::memif_ceiling(
            frame,
            w.iodepth * w.connections,
            w.duration,
            w.warmup,
            cpus,
            format!("lkb-raw-{}-{}", std::process::id(), self.done),
        );
        let before = crate::cpu::host_times();
        match raw::measure(&args) {
            Ok(v) => {
                let h = contention::assess(
                    &crate::compare::raw_run_view(&v, &before, &crate::cpu::host_times(), cpus),
                    &self.a.trust,
                );
                if h.contended {
                    self.contended += 1;
                    self.notes.push(format!("{label} raw: {}", h.describe()));
                }
                let fps = v["frames_per_sec"].as_f64().unwrap_or(f64::NAN);
                let size = w.req_size as f64;
                let run = json!({
                    "stack": "raw", "series": "raw", "sweep_point": label,
                    "config": {"mode": "raw", "req_size": w.req_size, "resp_size": w.resp_size,
                        "iodepth": w.iodepth * w.connections, "connections": 1, "threads": 1},
                    "duration_s": v["duration_s"], "rpcs": v["round_trips"], "rps": fps,
                    "gbps": {"total": fps * 2.0 * size * 8.0 / 1e9,
                        "client_to_server": fps * size * 8.0 / 1e9,
                        "server_to_client": fps * size * 8.0 / 1e9},
                    "latency_us": {"p50": v["rtt_p50_us"], "p99": v["rtt_p99_us"],
                        "p999": v["rtt_p999_us"], "max": v["rtt_max_us"]},
                    "raw": v,
                    "contention": h.to_json(),
                });
                out.push(rpc_point("raw", x, &run));
                self.runs.push(run);
            }
            Err(e) => {
                self.failures += 1;
                self.notes
                    .push(format!("{label} raw: failed: {}", first_line(&e)));
            }
        }
    }
}

/// One of LUNA's claims (ATC'23) as this sweep measured it, luna against the kernel.
#[derive(Debug, Clone, PartialEq)]
struct Claim {
    /// What is compared (`RPC/s 4096 B iodepth 1`; no commas: a CSV cell).
    what: String,
    /// The luna series (`luna`, `luna zero-copy`).
    series: &'static str,
    /// luna's and the kernel's values.
    luna: Option<f64>,
    kernel: Option<f64>,
    /// luna / kernel; None when a point is missing or contended.
    ratio: Option<f64>,
    /// The paper's figure for the same ratio.
    paper: f64,
    /// Why there is no ratio.
    why_not: Option<String>,
}

/// LUNA's three claims read off a sweep's runs: RPC/s at `size` and iodepth 1 (3.5× the
/// kernel), RPC/s at iodepth 16 (2×), p99 at iodepth 16 (−70%: 0.3× the kernel's), plus
/// p99 at iodepth 1 (same paper figure). From fig9's `msgsize=<size>` point or fig10's
/// `iodepth=1`, and fig10's `iodepth=16`; a contended point gives no ratio.
fn claims(runs: &[Value], size: u32, series: &[&'static str]) -> Vec<Claim> {
    let find = |labels: &[String], name: &str| {
        labels.iter().find_map(|l| {
            runs.iter().find(|r| {
                r["sweep_point"].as_str() == Some(l) && r["series"].as_str() == Some(name)
            })
        })
    };
    let d1 = [
        format!("msgsize={}", size_label(size)),
        "iodepth=1".to_string(),
    ];
    let d16 = ["iodepth=16".to_string()];
    let specs: [(String, &[String], &str, f64); 4] = [
        (format!("RPC/s {} B iodepth 1", size), &d1, "rps", 3.5),
        (format!("RPC/s {} B iodepth 16", size), &d16, "rps", 2.0),
        (format!("p99 {} B iodepth 16", size), &d16, "p99", 0.3),
        (format!("p99 {} B iodepth 1", size), &d1, "p99", 0.3),
    ];
    let value = |r: &Value, key: &str| match key {
        "rps" => r["rps"].as_f64(),
        _ => r["latency_us"]["p99"].as_f64(),
    };
    let mut out = Vec::new();
    for (what, labels, key, paper) in specs.iter() {
        for &name in series {
            let (l, k) = (find(labels, name), find(labels, "kernel"));
            let lv = l.and_then(|r| value(r, key));
            let kv = k.and_then(|r| value(r, key));
            let contended =
                |r: Option<&Value>| r.is_some_and(|r| r["contention"]["contended"] == json!(true));
            let why_not = if l.is_none() || k.is_none() {
                Some(format!(
                    "no {name} or kernel point at {}",
                    labels.join(" / ")
                ))
            } else if contended(l) || contended(k) {
                Some("a point was contended".into())
            } else if lv.is_none() || kv.is_none() || kv == Some(0.0) {
                Some("no value".into())
            } else {
                None
            };
            out.push(Claim {
                what: what.clone(),
                series: name,
                luna: lv,
                kernel: kv,
                ratio: match (why_not.is_none(), lv, kv) {
                    (true, Some(a), Some(b)) => Some(a / b),
                    _ => None,
                },
                paper: *paper,
                why_not,
            });
        }
    }
    out
}

fn claims_csv(cs: &[Claim]) -> String {
    let f = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
    let mut s = String::from("claim,series,luna,kernel,luna_vs_kernel,paper,note\n");
    for c in cs {
        s.push_str(&format!(
            "{},{},{},{},{},{},{}\n",
            c.what,
            c.series,
            f(c.luna),
            f(c.kernel),
            f(c.ratio),
            c.paper,
            c.why_not.as_deref().unwrap_or("")
        ));
    }
    s
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").to_string()
}

fn series(pts: &[Pt], y: impl Fn(&Value) -> Option<f64>) -> Vec<Series> {
    let mut names: Vec<&str> = Vec::new();
    for p in pts {
        if !names.contains(&p.stack) {
            names.push(p.stack);
        }
    }
    names
        .into_iter()
        .map(|n| Series {
            name: n.to_string(),
            points: pts
                .iter()
                .filter(|p| p.stack == n)
                .filter_map(|p| Some((p.x, y(&p.run)?)))
                .collect(),
            flagged: pts
                .iter()
                .filter(|p| p.stack == n && p.run["contention"]["contended"] == json!(true))
                .map(|p| p.x)
                .collect(),
        })
        .collect()
}

fn size_label(b: u32) -> String {
    if b >= 1024 && b % 1024 == 0 {
        format!("{}K", b / 1024)
    } else {
        b.to_string()
    }
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> Res<()> {
    report::write_file(&dir.join(name), text)?;
    eprintln!("knb sweep: wrote {}", dir.join(name).display());
    Ok(())
}

fn csv(rows: &[&Value]) -> String {
    let mut s = format!("sweep_point,series,{}\n", report::CSV_HEADER);
    for r in rows {
        s.push_str(&format!(
            "{},{},{}\n",
            r["sweep_point"].as_str().unwrap_or(""),
            r["series"].as_str().or(r["stack"].as_str()).unwrap_or(""),
            report::csv_row(r)
        ));
    }
    s
}

/// `knb sweep`.
pub fn run(a: SweepArgs) -> Res<()> {
    let started = std::time::Instant::now();
    if a.duration <= 0.0 {
        return Err(Error::Usage("--duration must be > 0".into()));
    }
    if a.figures.contains(&Figure::Slo) {
        if a.figures.len() > 1 {
            return Err(Error::Usage(
                "--figure slo runs on its own (the kernel server models, open loop)".into(),
            ));
        }
        return crate::slo::run(&a);
    }
    if a.sizes.is_empty() || a.iodepths.is_empty() || a.cores.is_empty() || a.figures.is_empty() {
        return Err(Error::Usage(
            "--sizes, --iodepths, --cores and --figures need at least one value".into(),
        ));
    }
    let n = ncpus();
    for c in a
        .client_cpus
        .iter()
        .flat_map(|c| c.0.iter())
        .chain(a.server_cpus.iter().flat_map(|c| c.0.iter()))
    {
        if *c >= n {
            return Err(Error::Usage(format!(
                "CPU {c} does not exist (this machine has {n})"
            )));
        }
    }
    if !a.out_dir.is_dir() {
        return Err(Error::Usage(format!(
            "--out-dir {} is not a directory",
            a.out_dir.display()
        )));
    }
    let prefix = Placement {
        client_cpus: Cpus(vec![0]),
        server_cpus: None,
        port: run::DEFAULT_PORT,
        prefix: a.prefix.clone(),
    }
    .prefix()?;
    if a.memif_modes.is_empty() {
        return Err(Error::Usage("--memif-modes needs at least one mode".into()));
    }
    let mut notes = Vec::new();
    let mut avail = Vec::new();
    for s in &a.stacks {
        match backend::backend(*s).unavailable() {
            Some(why) => notes.push(format!("{}: {why}", s.name())),
            None if !avail.contains(s) => avail.push(*s),
            None => {}
        }
    }
    let order = entries(&avail, &a.memif_modes);
    if a.memif_modes.contains(&MemifMode::ZeroCopy) && !a.no_raw {
        notes.push("raw: the ceiling keeps memif's copy mode in every series".into());
    }
    if order.is_empty() {
        return Err(Error::Run(format!(
            "no available stack to sweep: {}",
            notes.join("; ")
        )));
    }
    run::sweep_stale();
    let mut topos = std::collections::BTreeMap::new();
    for s in &avail {
        let b = backend::backend(*s);
        if let std::collections::btree_map::Entry::Vacant(e) = topos.entry(b.topology()) {
            e.insert(run::topology_for(b, &prefix)?);
        }
    }
    let has = |f: Figure| a.figures.contains(&f);
    let ns = order.len();
    let raw_ok = |size: u32| !a.no_raw && (size as u64 + 70) <= 9000;
    let mut total = 0;
    if has(Figure::Msgsize) {
        total += a.sizes.len() * ns + a.sizes.iter().filter(|s| raw_ok(**s)).count();
    }
    if has(Figure::Iodepth) {
        total += a.iodepths.len() * (ns + usize::from(raw_ok(a.size)));
    }
    let cdf_free = has(Figure::Msgsize) && a.sizes.contains(&a.size)
        || has(Figure::Iodepth) && a.iodepths.contains(&1);
    if has(Figure::Cdf) && !cdf_free {
        total += ns;
    }
    if has(Figure::Cores) {
        total += a.cores.len() * ns;
    }
    let per = a.duration + a.warmup + 2.0;
    eprintln!(
        "knb sweep: {total} runs, about {:.0} s ({:.1} s measured + warm-up + set-up each)",
        total as f64 * per,
        a.duration
    );
    let mut sw = Sweeper {
        a: &a,
        order,
        topos,
        notes,
        runs: Vec::new(),
        failures: 0,
        contended: 0,
        done: 0,
        total,
    };
    let sub = format!(
        "{} s per point after {} s warm-up; one connection per thread; {} CPUs on this machine",
        a.duration, a.warmup, n
    );
    let dir = a.out_dir.clone();
    let mut cdf_src: Vec<Pt> = Vec::new();

    if has(Figure::Msgsize) {
        let mut pts = Vec::new();
        for &size in &a.sizes {
            let w = sw.workload(size, 1, 1);
            let label = format!("msgsize={}", size_label(size));
            let before = pts.len();
            sw.stacks_at(&w, size as f64, &label, &mut pts);
            if size == a.size {
                cdf_src.extend(
                    pts[before..]
                        .iter()
                        .map(|p| rpc_point(p.stack, 1.0, &p.run)),
                );
            }
            sw.raw_at(&w, size as f64, &label, &mut pts);
        }
        let rows: Vec<&Value> = pts.iter().map(|p| &p.run).collect();
        write(&dir, "fig9-msgsize.csv", &csv(&rows))?;
        let ticks = a.sizes.iter().map(|&s| (s as f64, size_label(s))).collect();
        let chart = Chart {
            title: "fig9: throughput vs message size (iodepth 1, 1 core per side)".into(),
            subtitle: sub.clone(),
            x_label: "message size (bytes, request = response)".into(),
            y_label: "Gbit/s (payload, both directions)".into(),
            log_x: true,
            x_ticks: Some(ticks),
            y_from_zero: true,
            series: series(&pts, |r| r["gbps"]["total"].as_f64()),
            ..Default::default()
        };
        write(&dir, "fig9-msgsize.svg", &svg::render(&chart))?;
    }
    if has(Figure::Iodepth) {
        let mut pts = Vec::new();
        for &d in &a.iodepths {
            let w = sw.workload(a.size, d, 1);
            let label = format!("iodepth={d}");
            let before = pts.len();
            sw.stacks_at(&w, d as f64, &label, &mut pts);
            if d == 1 && cdf_src.is_empty() {
                cdf_src.extend(
                    pts[before..]
                        .iter()
                        .map(|p| rpc_point(p.stack, 1.0, &p.run)),
                );
            }
            sw.raw_at(&w, d as f64, &label, &mut pts);
        }
        let rows: Vec<&Value> = pts.iter().map(|p| &p.run).collect();
        write(&dir, "fig10-iodepth.csv", &csv(&rows))?;
        let ticks: Vec<(f64, String)> = a
            .iodepths
            .iter()
            .map(|&d| (d as f64, d.to_string()))
            .collect();
        let base = Chart {
            subtitle: sub.clone(),
            x_label: "iodepth (outstanding RPCs, one connection)".into(),
            log_x: true,
            x_ticks: Some(ticks),
            ..Default::default()
        };
        let rps = Chart {
            title: format!(
                "fig10: RPC/s vs iodepth ({} B RPCs, 1 core per side)",
                a.size
            ),
            y_label: "RPC/s".into(),
            y_from_zero: true,
            series: series(&pts, |r| r["rps"].as_f64()),
            ..base.clone()
        };
        write(&dir, "fig10-iodepth.svg", &svg::render(&rps))?;
        let p99 = Chart {
            title: format!("fig10b: p99 latency vs iodepth ({} B RPCs)", a.size),
            y_label: "p99 latency (µs)".into(),
            log_y: true,
            series: series(&pts, |r| r["latency_us"]["p99"].as_f64()),
            ..base
        };
        write(&dir, "fig10-iodepth-p99.svg", &svg::render(&p99))?;
    }
    if has(Figure::Cdf) {
        if cdf_src.is_empty() {
            let w = sw.workload(a.size, 1, 1);
            sw.stacks_at(
                &w,
                1.0,
                &format!("cdf size={}", size_label(a.size)),
                &mut cdf_src,
            );
        }
        let mut s = String::from("stack,quantile,latency_us\n");
        let mut ser = Vec::new();
        for p in &cdf_src {
            let pts: Vec<(f64, f64)> = p.run["cdf"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|q| Some((q[1].as_f64()?, q[0].as_f64()?)))
                .collect();
            for (us, q) in &pts {
                s.push_str(&format!("{},{q},{us}\n", p.stack));
            }
            let contended = p.run["contention"]["contended"] == json!(true);
            ser.push(Series {
                name: if contended {
                    format!("{} (contended)", p.stack)
                } else {
                    p.stack.to_string()
                },
                points: pts,
                ..Default::default()
            });
        }
        write(&dir, "fig11-cdf.csv", &s)?;
        let chart = Chart {
            title: format!("fig11: latency CDF ({} B RPCs, iodepth 1)", a.size),
            subtitle: sub.clone(),
            x_label: "round-trip latency (µs)".into(),
            y_label: "fraction of RPCs".into(),
            log_x: true,
            y_from_zero: true,
            series: ser,
            ..Default::default()
        };
        write(&dir, "fig11-cdf.svg", &svg::render(&chart))?;
    }
    if has(Figure::Cores) {
        let mut pts = Vec::new();
        let mut over = Vec::new();
        for &c in &a.cores {
            if 2 * c as usize > n {
                over.push(c);
            }
            let w = sw.workload(a.size, a.cores_iodepth, c);
            sw.stacks_at(&w, c as f64, &format!("cores={c}"), &mut pts);
        }
        let rows: Vec<&Value> = pts.iter().map(|p| &p.run).collect();
        let mut text = csv(&rows);
        if !over.is_empty() {
            text.push_str(&format!(
                "# oversubscribed: cores {over:?} per side need {} CPUs, this machine has {n}\n",
                2 * over.iter().max().copied().unwrap_or(0)
            ));
            sw.notes.push(format!(
                "fig12: cores {over:?} per side oversubscribe the {n} CPUs (client and server threads share them)"
            ));
        }
        write(&dir, "fig12-cores.csv", &text)?;
        let chart = Chart {
            title: format!(
                "fig12: RPC/s vs cores per side ({} B, iodepth {} per connection)",
                a.size, a.cores_iodepth
            ),
            subtitle: if over.is_empty() {
                sub.clone()
            } else {
                format!("{sub}; cores {over:?} OVERSUBSCRIBED")
            },
            x_label: "threads (cores) per side, one connection each".into(),
            y_label: "RPC/s".into(),
            x_ticks: Some(a.cores.iter().map(|&c| (c as f64, c.to_string())).collect()),
            y_from_zero: true,
            series: series(&pts, |r| r["rps"].as_f64()),
            ..Default::default()
        };
        write(&dir, "fig12-cores.svg", &svg::render(&chart))?;
    }
    let Sweeper {
        topos,
        order,
        notes,
        runs,
        failures,
        contended,
        ..
    } = sw;
    drop(topos);
    let lunas: Vec<&'static str> = order
        .iter()
        .filter(|e| e.stack == Stack::Luna)
        .map(|e| e.name())
        .collect();
    let cl = if lunas.is_empty() || !order.iter().any(|e| e.stack == Stack::Kernel) {
        Vec::new()
    } else {
        claims(&runs, a.size, &lunas)
    };
    if !cl.is_empty() {
        write(&dir, "figs-claims.csv", &claims_csv(&cl))?;
        eprintln!("knb sweep: LUNA's claims (ATC'23) against this sweep, luna / kernel:");
        for c in &cl {
            match c.ratio {
                Some(r) => eprintln!(
                    "  {:<38} {:<15} {r:>7.3}  (paper {})",
                    c.what, c.series, c.paper
                ),
                None => eprintln!(
                    "  {:<38} {:<15} {:>7}  (paper {}): {}",
                    c.what,
                    c.series,
                    "-",
                    c.paper,
                    c.why_not.as_deref().unwrap_or("")
                ),
            }
        }
    }
    for n in &notes {
        eprintln!("note: {n}");
    }
    if contended > 0 {
        eprintln!(
            "knb sweep: {contended} point(s) contended (hollow in the SVGs, `contended` in the \
             CSVs): the machine was too busy for those; rerun when it is quiet"
        );
    }
    if let Some(p) = &a.json {
        let claims: Vec<Value> = cl
            .iter()
            .map(|c| {
                json!({"claim": c.what, "series": c.series, "luna": c.luna,
                    "kernel": c.kernel, "luna_vs_kernel": c.ratio, "paper": c.paper,
                    "note": c.why_not})
            })
            .collect();
        let doc = json!({"knb": "sweep", "notes": notes, "contended_points": contended,
            "elapsed_s": started.elapsed().as_secs_f64(), "claims": claims, "runs": runs});
        report::write_file(
            p,
            &(serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"),
        )?;
    }
    eprintln!(
        "knb sweep: done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    if failures > 0 {
        return Err(Error::Run(format!("{failures} sweep run(s) failed")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memif_stacks_get_one_series_per_mode_and_the_kernel_one() {
        let e = entries(
            &[Stack::Kernel, Stack::Smoltcp, Stack::Luna],
            &[MemifMode::Copy, MemifMode::ZeroCopy],
        );
        let names: Vec<&str> = e.iter().map(|e| e.name()).collect();
        assert_eq!(
            names,
            [
                "kernel",
                "smoltcp",
                "smoltcp zero-copy",
                "luna",
                "luna zero-copy"
            ]
        );
        let only_zc = entries(&[Stack::Luna, Stack::Kernel], &[MemifMode::ZeroCopy]);
        assert_eq!(
            only_zc,
            [
                Entry {
                    stack: Stack::Luna,
                    zero_copy: true
                },
                Entry {
                    stack: Stack::Kernel,
                    zero_copy: false
                }
            ]
        );
    }

    fn run(point: &str, series: &str, rps: f64, p99: f64, contended: bool) -> Value {
        json!({"sweep_point": point, "series": series, "rps": rps,
            "latency_us": {"p99": p99}, "contention": {"contended": contended}})
    }

    #[test]
    fn claims_are_ratios_of_clean_points_and_say_why_not() {
        let runs = vec![
            run("msgsize=4K", "kernel", 20_000.0, 70.0, false),
            run("msgsize=4K", "luna", 200_000.0, 7.0, false),
            run("iodepth=1", "luna", 1.0, 1.0, false), // msgsize=4K is preferred
            run("iodepth=16", "kernel", 200_000.0, 100.0, false),
            run("iodepth=16", "luna", 500_000.0, 25.0, true),
        ];
        let c = claims(&runs, 4096, &["luna", "luna zero-copy"]);
        assert_eq!(c.len(), 8);
        let get = |what: &str, s: &str| c.iter().find(|c| c.what == what && c.series == s).unwrap();
        let d1 = get("RPC/s 4096 B iodepth 1", "luna");
        assert_eq!(d1.ratio, Some(10.0));
        assert_eq!(d1.paper, 3.5);
        assert_eq!(get("p99 4096 B iodepth 1", "luna").ratio, Some(0.1));
        let d16 = get("RPC/s 4096 B iodepth 16", "luna");
        assert_eq!(d16.ratio, None, "a contended luna point gives no ratio");
        assert_eq!(d16.why_not.as_deref(), Some("a point was contended"));
        assert_eq!(d16.luna, Some(500_000.0), "the value is still shown");
        let zc = get("RPC/s 4096 B iodepth 1", "luna zero-copy");
        assert!(zc.ratio.is_none() && zc.why_not.as_deref().unwrap().contains("no luna zero-copy"));
        let text = claims_csv(&c);
        assert!(text.starts_with("claim,series,luna,kernel,luna_vs_kernel,paper,note\n"));
        assert!(text.contains("RPC/s 4096 B iodepth 1,luna,200000.000,20000.000,10.000,3.5,\n"));
    }
}
