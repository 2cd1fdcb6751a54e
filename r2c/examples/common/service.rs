//! Service-time emulation for the protocol servers (luna-kv, luna-h2, luna-grpc), with
//! knb's semantics (examples/knb/src/service.rs) so MS vs CS vs CP can be compared under
//! a bimodal service:
//!
//! * `--service fixed:MEAN|exp:MEAN|bimodal:MEAN` (MEAN like `20us`, `100us`, `1ms`;
//!   bimodal = 90% at 0.5 × MEAN, 10% at 5.5 × MEAN, SCV 2.25, the Rakaia paper's). knb's
//!   client draws the time and tags the request with it; real clients (h2load, memcslap,
//!   grpcio) cannot, so here each worker draws one service time per request from its own
//!   seeded generator (splitmix64, seed = worker index): the same distribution, and the
//!   same sequence for a given worker on every run.
//! * `--service-mode spin|sleep`: `spin` keeps the CPU busy until the deadline; `sleep`
//!   sleeps until the deadline minus a margin measured at start-up (p99 overshoot of 200
//!   short sleeps) and spins the rest, so many workers can share few CPUs.
//!
//! The worker is occupied before it answers (after parsing), as knb's server does.

use std::time::{Duration, Instant};

/// Sleeps for `d` even under a storm of signals, for the servers' main threads.
///
/// On net_tap every received frame raises the PMD's receive-trigger signal, and the kernel
/// delivers a process-directed signal to the main thread first. `std::thread::sleep` is a
/// relative `nanosleep` that each handled signal ends early: it is called again with the
/// time left, computed from the timer's expiry *including* its slack (50 µs by default),
/// so at more than ~20,000 signals a second (about as many frames) it never gets shorter
/// and a 20 ms sleep lasted the whole of an attack phase (docs/reliability.md, "The
/// stats file"). `park_timeout` waits on a futex with an absolute deadline, which a
/// signal does not move; it may return early, so loop to the deadline.
pub fn sleep_for(d: Duration) {
    let until = Instant::now() + d;
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        if left.is_zero() {
            break;
        }
        std::thread::park_timeout(left);
    }
}

/// Service-time distribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dist {
    /// Every request takes the mean.
    Fixed,
    /// Exponential with the mean.
    Exp,
    /// 90% at 0.5 × mean, 10% at 5.5 × mean.
    Bimodal,
}

/// How a worker is occupied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Busy until the deadline.
    Spin,
    /// Sleep to the deadline minus the measured margin, then spin.
    Sleep,
}

/// A service-time spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spec {
    /// Distribution.
    pub dist: Dist,
    /// Mean, nanoseconds (1 ns ..= 1 s).
    pub mean_ns: u64,
}

/// Parses `fixed:20us`, `exp:0.1ms`, `bimodal:100us` (units ns, us, ms, s).
pub fn parse_spec(s: &str) -> Result<Spec, String> {
    let (d, m) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: want fixed:MEAN, exp:MEAN or bimodal:MEAN"))?;
    let dist = match d {
        "fixed" => Dist::Fixed,
        "exp" => Dist::Exp,
        "bimodal" => Dist::Bimodal,
        _ => return Err(format!("{d:?}: distribution must be fixed, exp or bimodal")),
    };
    let t = m.trim();
    let (num, mul) = if let Some(n) = t.strip_suffix("ns") {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix("us") {
        (n, 1e3)
    } else if let Some(n) = t.strip_suffix("ms") {
        (n, 1e6)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1e9)
    } else {
        return Err(format!("{m:?} needs a unit (ns, us, ms or s), e.g. 20us"));
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{m:?} is not a duration (e.g. 20us, 1ms)"))?;
    let ns = v * mul;
    if !(ns.is_finite() && (1.0..=1e9).contains(&ns)) {
        return Err(format!("{m:?}: the mean must be within 1 ns ..= 1 s"));
    }
    Ok(Spec {
        dist,
        mean_ns: ns.round() as u64,
    })
}

/// The servers' command-line flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ServiceArgs {
    /// Emulated service time per request: fixed:MEAN, exp:MEAN or bimodal:MEAN
    /// (e.g. bimodal:100us); none by default.
    #[arg(long, value_parser = parse_spec)]
    pub service: Option<Spec>,
    /// How a worker is occupied: spin (busy) or sleep (then spin the margin).
    #[arg(long, value_enum, default_value = "spin")]
    pub service_mode: Mode,
}

impl ServiceArgs {
    /// Worker `w`'s service.
    pub fn for_worker(&self, w: usize) -> Service {
        Service::new(self.service, self.service_mode, w)
    }
}

/// One worker's emulated service.
pub struct Service {
    spec: Option<Spec>,
    mode: Mode,
    rng: u64,
    margin: Duration,
    /// Requests occupied, and their total emulated time (ns).
    pub served: u64,
    /// Sum of the drawn service times, nanoseconds.
    pub total_ns: u64,
}

impl Service {
    /// Worker `worker`'s service (`spec` `None`: no emulation).
    pub fn new(spec: Option<Spec>, mode: Mode, worker: usize) -> Self {
        let margin = match (spec, mode) {
            (Some(_), Mode::Sleep) => measure_margin(),
            _ => Duration::ZERO,
        };
        Service {
            spec,
            mode,
            rng: 0x9E37_79B9_7F4A_7C15 ^ worker as u64,
            margin,
            served: 0,
            total_ns: 0,
        }
    }

    fn next_u64(&mut self) -> u64 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The next service time.
    pub fn draw(&mut self) -> Option<Duration> {
        let s = self.spec?;
        let m = s.mean_ns as f64;
        let ns = match s.dist {
            Dist::Fixed => m,
            Dist::Bimodal => {
                if self.next_u64() % 10 == 0 {
                    5.5 * m
                } else {
                    0.5 * m
                }
            }
            Dist::Exp => {
                // Uniform in (0, 1]: never ln(0). Capped at 20 means.
                let u = ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
                (-u.ln() * m).min(20.0 * m)
            }
        };
        Some(Duration::from_nanos(ns.round() as u64))
    }

    /// Occupies the worker for the next drawn service time (nothing without a spec).
    pub fn occupy(&mut self) {
        let Some(d) = self.draw() else {
            return;
        };
        self.served += 1;
        self.total_ns += d.as_nanos() as u64;
        let deadline = Instant::now() + d;
        if self.mode == Mode::Sleep && d > self.margin {
            std::thread::sleep(d - self.margin);
        }
        while Instant::now() < deadline {
            std::hint::spin_loop();
        }
    }
}

/// p99 overshoot of 200 sleeps of 10 µs, capped at 2 ms.
fn measure_margin() -> Duration {
    let mut over: Vec<Duration> = (0..200)
        .map(|_| {
            let t = Instant::now();
            std::thread::sleep(Duration::from_micros(10));
            t.elapsed().saturating_sub(Duration::from_micros(10))
        })
        .collect();
    over.sort_unstable();
    over[over.len() * 99 / 100].min(Duration::from_millis(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bimodal_draws_keep_the_mean() {
        assert_eq!(
            parse_spec("bimodal:100us"),
            Ok(Spec {
                dist: Dist::Bimodal,
                mean_ns: 100_000
            })
        );
        assert!(parse_spec("bimodal:100").is_err());
        assert!(parse_spec("uniform:1ms").is_err());
        assert!(parse_spec("fixed:2s").is_err());
        let mut s = Service::new(parse_spec("bimodal:100us").ok(), Mode::Spin, 3);
        let draws: Vec<u64> = (0..10_000)
            .map(|_| s.draw().unwrap().as_nanos() as u64)
            .collect();
        let long = draws.iter().filter(|&&d| d == 550_000).count();
        assert!(draws.iter().all(|&d| d == 50_000 || d == 550_000));
        assert!((800..1200).contains(&long), "{long} long of 10,000");
    }
}
