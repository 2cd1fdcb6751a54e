//! Service-time emulation (Rakaia-style experiments): per-request service-time tags drawn by
//! the client, and a server worker occupied for that long before it replies.
//!
//! * `--service fixed:MEAN|exp:MEAN|bimodal:MEAN` (MEAN like `20us`, `100us`, `1ms`; bimodal =
//!   90% at 0.5 × MEAN, 10% at 5.5 × MEAN): the client draws one service time per request
//!   from a seeded RNG and carries it in the request ([`crate::proto::flags::SERVICE`] plus
//!   the first 8 payload bytes = nanoseconds, little endian).
//! * `--service-mode spin|sleep`: how the server occupies the worker ([`occupy`]). `spin`
//!   keeps the CPU busy until the deadline; `sleep` sleeps until the deadline minus a margin
//!   measured at start-up ([`margin`]: p99 overshoot of a few hundred short sleeps, with the
//!   timer slack set to 1 ns), then spins the rest, so many workers share few CPUs and the
//!   occupation is still precise. `timer`: *virtual workers* — the `--workers` message
//!   sockets (real msgsched workers: CP/CS/MS placement, handoff, stealing unchanged) are
//!   advanced by the server's I/O core itself, in each iteration of its busy-polling
//!   loop, which keeps each occupied worker as a deadline ([`msgsched::virt::VirtualPool`];
//!   r2c's [`r2c::msg::Runtime::spawn_msg_virtual`]): a worker that took a request takes
//!   nothing until its deadline, then its reply goes out. Occupancy costs no CPU per
//!   worker and the server is one thread, so 20 workers fit on one CPU. luna
//!   (`--server-model cp|cs|ms`) only; the kernel baselines keep real threads (spin or
//!   sleep).
//! * `--unordered`, `--server-model cp|cs|pool`, `--workers N`: see [`Emu`].

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde_json::{json, Value};

/// Service-time distribution of the tags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dist {
    /// Every request takes the mean.
    Fixed,
    /// Exponential with the mean.
    Exp,
    /// 90% at 0.5 × mean, 10% at 5.5 × mean (SCV 2.25, the Rakaia paper's).
    Bimodal,
}

impl Dist {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Dist::Fixed => "fixed",
            Dist::Exp => "exp",
            Dist::Bimodal => "bimodal",
        }
    }
}

/// A service-time spec: distribution and mean.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceSpec {
    /// Distribution.
    pub dist: Dist,
    /// Mean in nanoseconds (> 0).
    pub mean_ns: u64,
}

/// Largest mean accepted (1 s): an emulated service time is a benchmark, not a sleep.
const MAX_MEAN_NS: u64 = 1_000_000_000;

/// Parses a duration: `20us`, `0.5ms`, `100ns`, `1s`, `20µs`.
pub fn parse_duration_ns(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mul) = if let Some(n) = t.strip_suffix("ns") {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix("us").or_else(|| t.strip_suffix("µs")) {
        (n, 1e3)
    } else if let Some(n) = t.strip_suffix("ms") {
        (n, 1e6)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1e9)
    } else {
        return Err(format!(
            "{s:?} needs a unit (ns, us, ms or s), e.g. 20us or 0.1ms"
        ));
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 20us, 100us, 1ms)"))?;
    let ns = v * mul;
    if !(ns.is_finite() && ns >= 1.0) {
        return Err(format!("{s:?}: a duration must be at least 1 ns"));
    }
    Ok(ns.round() as u64)
}

/// Parses `fixed:MEAN`, `exp:MEAN` or `bimodal:MEAN`.
pub fn parse_service(s: &str) -> Result<ServiceSpec, String> {
    let (d, m) = s.split_once(':').ok_or_else(|| {
        format!(
            "--service {s:?}: expected fixed:MEAN, exp:MEAN or bimodal:MEAN (e.g. bimodal:100us)"
        )
    })?;
    let dist = match d.trim().to_ascii_lowercase().as_str() {
        "fixed" => Dist::Fixed,
        "exp" => Dist::Exp,
        "bimodal" => Dist::Bimodal,
        other => {
            return Err(format!(
                "--service {s:?}: unknown distribution {other:?} (fixed, exp or bimodal)"
            ))
        }
    };
    let mean_ns = parse_duration_ns(m).map_err(|e| format!("--service {s:?}: {e}"))?;
    if mean_ns > MAX_MEAN_NS {
        return Err(format!("--service {s:?}: the mean is above 1 s"));
    }
    Ok(ServiceSpec { dist, mean_ns })
}

impl ServiceSpec {
    /// The spec as given on the command line (`bimodal:100000ns`).
    pub fn to_arg(self) -> String {
        format!("{}:{}ns", self.dist.name(), self.mean_ns)
    }

    /// Mean in seconds.
    pub fn mean_s(self) -> f64 {
        self.mean_ns as f64 / 1e9
    }

    /// One service time in ns (>= 1), drawn with `rng`.
    pub fn draw(self, rng: &mut Rng) -> u64 {
        let m = self.mean_ns as f64;
        let v = match self.dist {
            Dist::Fixed => m,
            Dist::Exp => -rng.next_f64().ln() * m,
            Dist::Bimodal => {
                if rng.next_f64() <= 0.9 {
                    0.5 * m
                } else {
                    5.5 * m
                }
            }
        };
        (v.round() as u64).max(1)
    }

    /// As the simulator's distribution.
    pub fn sim_service(self) -> msgsched::sim::Service {
        match self.dist {
            Dist::Fixed => msgsched::sim::Service::Fixed,
            Dist::Exp => msgsched::sim::Service::Exp,
            Dist::Bimodal => msgsched::sim::Service::Bimodal,
        }
    }
}

/// xorshift64*, seeded; 53-bit uniforms in (0, 1].
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value; 0 is remapped).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// A uniform in (0, 1].
    pub fn next_f64(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
        ((r >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

/// Bytes of a service tag at the start of a request's payload.
pub const TAG_LEN: usize = 8;

/// The tag bytes of `ns`.
pub fn encode_tag(ns: u64) -> [u8; TAG_LEN] {
    ns.to_le_bytes()
}

/// The service time a tag carries.
pub fn decode_tag(b: &[u8; TAG_LEN]) -> u64 {
    u64::from_le_bytes(*b)
}

/// How a server worker is occupied for a request's service time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, ValueEnum)]
pub enum ServiceMode {
    /// Busy CPU until the deadline.
    #[default]
    Spin,
    /// Sleep to the deadline minus a measured margin, then spin the rest (the worker is
    /// occupied but yields the CPU most of the time).
    Sleep,
    /// Virtual workers: the I/O core keeps every occupied worker as a deadline (luna's
    /// message mode only).
    Timer,
}

impl ServiceMode {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            ServiceMode::Spin => "spin",
            ServiceMode::Sleep => "sleep",
            ServiceMode::Timer => "timer",
        }
    }
}

/// Server models of the kernel baselines (`--server-model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ServerModel {
    /// N epoll threads, each owning a partition of the connections (hash of the connection).
    Cp,
    /// N threads sharing all connections through one epoll with EPOLLONESHOT.
    Cs,
    /// One I/O thread feeding a bounded queue consumed by N worker threads.
    Pool,
    /// Messages shared (luna only: r2c's message mode over msgsched, where `cp` and `cs`
    /// are msgsched's CP and CS models).
    Ms,
}

impl ServerModel {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            ServerModel::Cp => "cp",
            ServerModel::Cs => "cs",
            ServerModel::Pool => "pool",
            ServerModel::Ms => "ms",
        }
    }
}

/// The emulation options every RPC subcommand shares (flattened into
/// [`crate::workload::Workload`]).
#[derive(Args, Debug, Clone, PartialEq)]
pub struct Emu {
    /// Per-request service time, drawn by the client and carried in the request:
    /// fixed:MEAN, exp:MEAN or bimodal:MEAN (90% at 0.5×MEAN, 10% at 5.5×MEAN), e.g.
    /// bimodal:100us. Needs --req-size >= 8 (the tag is the first 8 payload bytes).
    #[arg(long, value_parser = parse_service)]
    pub service: Option<ServiceSpec>,
    /// How the server occupies a worker for a request's service time: spin (busy CPU),
    /// sleep (sleep to the deadline minus a measured margin, then spin) or timer
    /// (virtual workers: the I/O core keeps occupied workers as deadlines; luna
    /// --server-model cp|cs|ms only).
    #[arg(long, value_enum, default_value = "spin")]
    pub service_mode: ServiceMode,
    /// Match responses by id: a request may complete out of order (rpc only).
    #[arg(long)]
    pub unordered: bool,
    /// Server model. Kernel: cp (partitioned epoll threads), cs (shared epoll,
    /// EPOLLONESHOT) or pool (one I/O thread + a worker pool). luna: cp, cs or ms, r2c's
    /// message mode (parsers on the I/O core, messages scheduled over --workers threads
    /// by msgsched).
    #[arg(long, value_enum)]
    pub server_model: Option<ServerModel>,
    /// Worker threads of --server-model (they share the --server-cpus).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub workers: u32,
}

impl Default for Emu {
    fn default() -> Emu {
        Emu {
            service: None,
            service_mode: ServiceMode::Spin,
            unordered: false,
            server_model: None,
            workers: 1,
        }
    }
}

impl Emu {
    /// Cross-field checks (`req_size`, `bulk`: the workload's).
    pub fn validate(&self, req_size: u32, bulk: bool) -> Result<(), String> {
        if self.service.is_some() && (req_size as usize) < TAG_LEN {
            return Err(format!(
                "--service needs --req-size >= {TAG_LEN}: the service-time tag is the first \
                 {TAG_LEN} payload bytes (got --req-size {req_size})"
            ));
        }
        if bulk && self.unordered {
            return Err("--unordered applies to --mode rpc, not bulk".into());
        }
        if bulk && self.service.is_some() {
            return Err("--service applies to --mode rpc, not bulk".into());
        }
        if self.workers != 1 && self.server_model.is_none() {
            return Err(format!(
                "--workers {} applies to --server-model (cp|cs|pool on the kernel, cp|cs|ms on luna)",
                self.workers
            ));
        }
        if self.service_mode == ServiceMode::Timer
            && !matches!(
                self.server_model,
                Some(ServerModel::Cp | ServerModel::Cs | ServerModel::Ms)
            )
        {
            return Err(
                "--service-mode timer runs virtual workers in luna's message mode: it needs \
                 --stack luna --server-model cp|cs|ms (the kernel baselines keep real \
                 threads: use spin or sleep there)"
                    .into(),
            );
        }
        if bulk && self.server_model.is_some() {
            return Err("--server-model applies to --mode rpc, not bulk".into());
        }
        Ok(())
    }

    /// Arguments that reproduce these options on a child's command line.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if let Some(s) = self.service {
            a.push(format!("--service={}", s.to_arg()));
        }
        if self.service_mode != ServiceMode::Spin {
            a.push(format!("--service-mode={}", self.service_mode.name()));
        }
        if self.unordered {
            a.push("--unordered".into());
        }
        if let Some(m) = self.server_model {
            a.push(format!("--server-model={}", m.name()));
        }
        if self.workers != 1 {
            a.push(format!("--workers={}", self.workers));
        }
        a
    }

    /// As JSON (part of a report's `config`).
    pub fn to_json(&self) -> Value {
        json!({
            "service": self.service.map(|s| json!({
                "dist": s.dist.name(), "mean_us": s.mean_ns as f64 / 1e3,
            })),
            "service_mode": self.service_mode.name(),
            "unordered": self.unordered,
            "server_model": self.server_model.map(|m| m.name()),
            "workers": self.workers,
        })
    }
}

// ------------------------------------------------------------------ occupy ---

/// Sleep margin used by [`occupy`] in sleep mode, measured once ([`margin`]).
static MARGIN: OnceLock<Duration> = OnceLock::new();

/// Sets the calling thread's timer slack to 1 ns (PR_SET_TIMERSLACK), so sleeps are not
/// rounded up by the default 50 µs slack. Best effort (the margin absorbs a failure).
pub fn set_timer_slack() {
    let _ = nix::sys::prctl::set_timerslack(1);
}

/// Sleeps shorter than this are not worth it: spin instead.
const MIN_SLEEP: Duration = Duration::from_micros(5);

/// The sleep margin: the p99 overshoot of 300 sleeps of 20 µs (timer slack 1 ns), plus
/// 2 µs, capped at 1 ms. Measured on first use and kept for the process.
pub fn margin() -> Duration {
    *MARGIN.get_or_init(|| measure_margin(300, Duration::from_micros(20)))
}

/// Measures the p99 overshoot of `n` sleeps of `d` (+ 2 µs, capped at 1 ms).
pub fn measure_margin(n: usize, d: Duration) -> Duration {
    set_timer_slack();
    let mut over: Vec<Duration> = (0..n.max(1))
        .map(|_| {
            let t = Instant::now();
            std::thread::sleep(d);
            t.elapsed().saturating_sub(d)
        })
        .collect();
    over.sort();
    let p99 = over[(over.len() * 99).div_ceil(100).clamp(1, over.len()) - 1];
    (p99 + Duration::from_micros(2)).min(Duration::from_millis(1))
}

/// Occupies the calling thread for `d` (from now) in `mode`; returns when done.
pub fn occupy(d: Duration, mode: ServiceMode) {
    occupy_until(Instant::now() + d, mode);
}

/// Occupies the calling thread until `deadline` in `mode`. Timer mode occupies no
/// thread (virtual workers keep deadlines instead) and the argument checks keep it away
/// from code that occupies a thread; were it asked here, it spins like `spin`.
pub fn occupy_until(deadline: Instant, mode: ServiceMode) {
    if mode == ServiceMode::Sleep {
        let m = margin();
        let left = deadline.saturating_duration_since(Instant::now());
        if left > m + MIN_SLEEP {
            std::thread::sleep(left - m);
        }
    }
    while Instant::now() < deadline {
        std::hint::spin_loop();
    }
}

/// Mode used by engines that occupy inline ([`crate::proto::ServerConn`] outside the
/// server models): set once by the server process from its arguments.
static INLINE_MODE: OnceLock<ServiceMode> = OnceLock::new();

/// Sets the inline mode (first call wins) and, in sleep mode, measures the margin now.
pub fn set_inline_mode(mode: ServiceMode) {
    let _ = INLINE_MODE.set(mode);
    if mode == ServiceMode::Sleep {
        let _ = margin();
    }
}

/// The inline mode (spin unless set).
pub fn inline_mode() -> ServiceMode {
    INLINE_MODE.get().copied().unwrap_or_default()
}

// --------------------------------------------------------- service-check ---

/// Arguments of `knb service-check`.
#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// Means to check (each is a fixed service time), e.g. 20us,100us.
    #[arg(long, value_delimiter = ',', default_value = "20us,100us", value_parser = parse_duration_ns)]
    pub means: Vec<u64>,
    /// Modes to check.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "spin,sleep,timer"
    )]
    pub modes: Vec<ServiceMode>,
    /// Occupations per (mean, mode).
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u32).range(10..=10_000_000))]
    pub samples: u32,
    /// Pin to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Timer mode: virtual workers kept busy back to back by one busy-polling loop, as
    /// the I/O core drives them (each occupation is one sample).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub virtual_workers: u32,
    /// Also write the result as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// `knb service-check`: the emulation error (actual − requested) of [`occupy`].
pub fn check(a: CheckArgs) -> crate::workload::Res<()> {
    use crate::workload::Error;
    if let Some(c) = a.cpu {
        crate::backend::pin(c).map_err(Error::Usage)?;
    }
    set_timer_slack();
    let m = margin();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "sleep margin {:.1} us (p99 overshoot of 300 x 20 us sleeps + 2 us); loadavg {}",
        m.as_secs_f64() * 1e6,
        load.trim()
    );
    println!(
        "{:>10} {:>6} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "mean us", "mode", "samples", "p50 us", "p99 us", "p99.9 us", "max us"
    );
    let mut rows = Vec::new();
    for &mean in &a.means {
        for &mode in &a.modes {
            let d = Duration::from_nanos(mean);
            let mut err: Vec<i64> = Vec::with_capacity(a.samples as usize);
            if mode == ServiceMode::Timer {
                err.extend(timer_errors(
                    mean,
                    a.samples as usize,
                    a.virtual_workers as usize,
                ));
            } else {
                for _ in 0..a.samples {
                    let t = Instant::now();
                    occupy(d, mode);
                    err.push(t.elapsed().as_nanos() as i64 - mean as i64);
                }
            }
            err.sort_unstable();
            let q = |p: f64| {
                let r = ((p * err.len() as f64).ceil() as usize).clamp(1, err.len());
                err[r - 1] as f64 / 1e3
            };
            let max = *err.last().unwrap_or(&0) as f64 / 1e3;
            println!(
                "{:>10.1} {:>6} {:>8} {:>9.2} {:>9.2} {:>9.2} {:>9.1}",
                mean as f64 / 1e3,
                mode.name(),
                a.samples,
                q(0.5),
                q(0.99),
                q(0.999),
                max
            );
            let vw = (mode == ServiceMode::Timer).then_some(a.virtual_workers);
            rows.push(json!({"mean_us": mean as f64 / 1e3, "mode": mode.name(),
                "virtual_workers": vw,
                "samples": a.samples, "err_p50_us": q(0.5), "err_p99_us": q(0.99),
                "err_p999_us": q(0.999), "err_max_us": max}));
        }
    }
    if let Some(p) = &a.json {
        let doc = json!({"knb": "service-check", "margin_us": m.as_secs_f64() * 1e6,
            "loadavg": load.trim(), "rows": rows});
        crate::report::write_file(
            p,
            &(serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"),
        )?;
    }
    Ok(())
}

/// Timer mode's emulation error: `workers` virtual workers on this thread, each
/// occupied for `mean` ns back to back (a freed worker starts its next occupation at
/// once), driven as r2c's I/O core drives them ([`msgsched::virt::VirtualWorkers`] checked
/// on every turn of a busy-polling loop, never yielding); `samples` occupations, each
/// error = achieved − requested occupancy in ns. The loop here does nothing else, so
/// this is the emulation's floor; in a real run each turn also polls the NIC.
pub fn timer_errors(mean: u64, samples: usize, workers: usize) -> Vec<i64> {
    let epoch = Instant::now();
    let now = || u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let mut vw: msgsched::virt::VirtualWorkers<()> =
        msgsched::virt::VirtualWorkers::new(workers.max(1));
    let mut started = 0;
    let mut err = Vec::with_capacity(samples);
    // Stagger the first starts over one mean, as an open-loop arrival stream would.
    let step = mean / vw.len() as u64;
    for w in 0..vw.len().min(samples) {
        let _ = vw.start(w, now() + w as u64 * step, mean, ());
        started += 1;
    }
    while err.len() < samples {
        let t = now();
        let mut work = false;
        while let Some(d) = vw.pop_due(t) {
            err.push(d.late() as i64);
            work = true;
            if started < samples {
                let _ = vw.start(d.worker, now(), mean, ());
                started += 1;
            }
        }
        if !work {
            if vw.next_deadline().is_none() {
                break;
            }
            std::hint::spin_loop();
        }
    }
    err
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_mode_occupies_every_virtual_worker_at_least_its_time() {
        let e = timer_errors(50_000, 200, 8);
        assert_eq!(e.len(), 200);
        assert!(e.iter().all(|&x| x >= 0), "an occupation ended early");
        let timer = Emu {
            service: Some(parse_service("fixed:20us").unwrap()),
            service_mode: ServiceMode::Timer,
            ..Emu::default()
        };
        assert!(timer
            .validate(64, false)
            .unwrap_err()
            .contains("--server-model cp|cs|ms"));
        let pool = Emu {
            server_model: Some(ServerModel::Pool),
            workers: 4,
            ..timer.clone()
        };
        assert!(pool.validate(64, false).is_err());
        let ms = Emu {
            server_model: Some(ServerModel::Ms),
            workers: 20,
            ..timer
        };
        assert!(ms.validate(64, false).is_ok());
    }

    #[test]
    fn service_specs_parse_and_reject_garbage() {
        assert_eq!(
            parse_service("fixed:20us"),
            Ok(ServiceSpec {
                dist: Dist::Fixed,
                mean_ns: 20_000
            })
        );
        assert_eq!(parse_service("exp:0.1ms").unwrap().mean_ns, 100_000);
        assert_eq!(parse_service("bimodal:100us").unwrap().dist, Dist::Bimodal);
        assert_eq!(parse_service("BIMODAL:250ns").unwrap().mean_ns, 250);
        let s = parse_service("bimodal:100us").unwrap();
        assert_eq!(parse_service(&s.to_arg()), Ok(s));
        for (bad, needle) in [
            ("bimodal", "expected fixed:MEAN"),
            ("pareto:10us", "unknown distribution"),
            ("fixed:10", "needs a unit"),
            ("fixed:xus", "is not a duration"),
            ("fixed:0us", "at least 1 ns"),
            ("fixed:-5us", "at least 1 ns"),
            ("fixed:2s", "above 1 s"),
        ] {
            let e = parse_service(bad).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }

    #[test]
    fn tags_round_trip() {
        for ns in [1u64, 20_000, 550_000, u64::MAX] {
            assert_eq!(decode_tag(&encode_tag(ns)), ns);
        }
        assert_eq!(
            encode_tag(0x0102),
            [2, 1, 0, 0, 0, 0, 0, 0],
            "little endian"
        );
    }

    #[test]
    fn payload_too_small_for_the_tag_is_a_usage_error() {
        let e = Emu {
            service: Some(parse_service("fixed:20us").unwrap()),
            ..Emu::default()
        };
        assert!(e.validate(8, false).is_ok());
        assert!(e
            .validate(7, false)
            .unwrap_err()
            .contains("--req-size >= 8"));
        let u = Emu {
            unordered: true,
            ..Emu::default()
        };
        assert!(u.validate(0, true).unwrap_err().contains("not bulk"));
        assert!(Emu::default().validate(0, true).is_ok());
        let w = Emu {
            workers: 4,
            ..Emu::default()
        };
        assert!(w
            .validate(64, false)
            .unwrap_err()
            .contains("--server-model"));
    }

    fn mean_of(spec: &str, n: usize) -> (f64, Vec<u64>) {
        let s = parse_service(spec).unwrap();
        let mut rng = Rng::new(42);
        let v: Vec<u64> = (0..n).map(|_| s.draw(&mut rng)).collect();
        (v.iter().sum::<u64>() as f64 / n as f64, v)
    }

    #[test]
    fn draws_have_their_means() {
        let n = 200_000;
        let (m, v) = mean_of("fixed:20us", n);
        assert_eq!(m, 20_000.0);
        assert!(v.iter().all(|&x| x == 20_000));
        // Exponential: sd of the sample mean = mean / sqrt(n) = 0.22%; allow 2%.
        let (m, _) = mean_of("exp:100us", n);
        assert!((m / 100_000.0 - 1.0).abs() < 0.02, "{m}");
        // Bimodal: two values only, 10% long ones, mean within 2%.
        let (m, v) = mean_of("bimodal:100us", n);
        assert!((m / 100_000.0 - 1.0).abs() < 0.02, "{m}");
        assert!(v.iter().all(|&x| x == 50_000 || x == 550_000));
        let long = v.iter().filter(|&&x| x == 550_000).count() as f64 / n as f64;
        assert!((long - 0.1).abs() < 0.005, "{long}");
        // Seeded: the same seed gives the same sequence.
        assert_eq!(mean_of("exp:100us", 1000).1, mean_of("exp:100us", 1000).1);
    }

    #[test]
    fn occupy_takes_at_least_the_time() {
        for mode in [ServiceMode::Spin, ServiceMode::Sleep] {
            let t = Instant::now();
            occupy(Duration::from_micros(200), mode);
            assert!(t.elapsed() >= Duration::from_micros(200));
        }
        assert!(margin() <= Duration::from_millis(1));
    }

    #[test]
    fn emu_args_round_trip_through_clap() {
        use clap::Parser;
        #[derive(Parser)]
        struct P {
            #[command(flatten)]
            e: Emu,
        }
        let e = Emu {
            service: Some(parse_service("bimodal:100us").unwrap()),
            service_mode: ServiceMode::Sleep,
            unordered: true,
            server_model: Some(ServerModel::Pool),
            workers: 4,
        };
        let mut args = vec!["p".to_string()];
        args.extend(e.to_args());
        assert_eq!(P::parse_from(args).e, e);
        assert_eq!(P::parse_from(["p"]).e, Emu::default());
    }
}
