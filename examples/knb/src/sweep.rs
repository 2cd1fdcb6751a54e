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
    order: Vec<Stack>,
    topos: std::collections::BTreeMap<testbed::Kind, testbed::Topology>,
    notes: Vec<String>,
    runs: Vec<Value>,
    failures: usize,
    contended: usize,
    done: usize,
    total: usize,
}

impl Sweeper<'_> {
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
        for s in self.order.clone() {
            self.step(&format!("{label} {}", s.name()));
            let b = backend::backend(s);
            match run::run_on(&self.topos[&b.topology()], b, w, &place, self.a.progress) {
                Ok(mut r) => {
                    r["sweep_point"] = json!(label);
                    let h = contention::assess(&r, &self.a.trust);
                    if h.contended {
                        self.contended += 1;
                        self.notes
                            .push(format!("{label} {}: {}", s.name(), h.describe()));
                    }
                    r["contention"] = h.to_json();
                    out.push(rpc_point(s.name(), x, &r));
                    self.runs.push(r);
                }
                Err(e) => {
                    self.failures += 1;
                    self.notes
                        .push(format!("{label} {}: failed: {}", s.name(), first_line(&e)));
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
                    "stack": "raw", "sweep_point": label,
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
    let mut s = format!("sweep_point,{}\n", report::CSV_HEADER);
    for r in rows {
        s.push_str(&format!(
            "{},{}\n",
            r["sweep_point"].as_str().unwrap_or(""),
            report::csv_row(r)
        ));
    }
    s
}

/// `knb sweep`.
pub fn run(a: SweepArgs) -> Res<()> {
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
    let mut notes = Vec::new();
    let mut order = Vec::new();
    for s in &a.stacks {
        match backend::backend(*s).unavailable() {
            Some(why) => notes.push(format!("{}: {why}", s.name())),
            None if !order.contains(s) => order.push(*s),
            None => {}
        }
    }
    if order.is_empty() {
        return Err(Error::Run(format!(
            "no available stack to sweep: {}",
            notes.join("; ")
        )));
    }
    run::sweep_stale();
    let mut topos = std::collections::BTreeMap::new();
    for s in &order {
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
        notes,
        runs,
        failures,
        contended,
        ..
    } = sw;
    drop(topos);
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
        let doc = json!({"knb": "sweep", "notes": notes, "contended_points": contended,
            "runs": runs});
        report::write_file(
            p,
            &(serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"),
        )?;
    }
    if failures > 0 {
        return Err(Error::Run(format!("{failures} sweep run(s) failed")));
    }
    Ok(())
}
