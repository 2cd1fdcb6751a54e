//! Discrete-event simulator of the CP / CS / MS queueing models: the ideal a real message
//! scheduler is measured against (Rakaia, OSDI'26, §simulation; ZygOS's "fraction of ideal").
//!
//! `c` workers, `N` connections, zero system overhead, Poisson open-loop arrivals at total
//! rate `λ = load · c / mean`, each arrival sent on a connection chosen uniformly at random.
//!
//! - [`Model::Cp`] (connection-partitioned): connection `i` belongs to worker `i mod c`; each
//!   worker serves its connections' messages in one FIFO. `c` independent M/G/1 queues.
//! - [`Model::Cs`] (connection-shared): a FIFO per connection and a shared FIFO of *ready*
//!   connections (those with a queued message and no worker). An idle worker takes the ready
//!   connection that has waited longest and serves **one** message of it; the connection then
//!   rejoins the tail of the ready FIFO if it has more. A connection is never served by two
//!   workers at once, so with `N <= c` this is `N` independent M/G/1 queues.
//! - [`Model::Ms`] (message-shared): one FIFO of messages over all workers, M/G/c.
//!
//! The sojourn time (arrival to completion) of every message after a warm-up is recorded and
//! the quantiles are exact order statistics of those samples (nearest rank: the q-quantile of
//! n samples is the `ceil(q·n)`-th smallest). Each random quantity has its own seeded stream
//! (see `rng`), so all models and all loads run with the same seed see the same messages, only
//! rescaled in time: comparisons use common random numbers, and the same config gives
//! bit-identical results. [`theory`] holds the closed forms the simulator is validated against;
//! [`throughput_under_slo`] searches the highest load whose p99 meets an SLO.
//!
//! Optionally the server pauses ([`Pauses`]: a machine that stalls, a descheduled I/O
//! core): during a pause nothing is dispatched, started or delivered. Arrivals queue; a
//! service already started completes, but its reply leaves at the pause's end; a worker
//! that becomes free in a pause starts its next message at the pause's end. Pauses are
//! their own seeded stream, in absolute time (the same pauses at every load), so a run
//! without pauses is bit-identical to one before pauses existed.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

mod engine;
pub mod plot;
mod rng;
mod slo;
pub mod theory;

pub use slo::{default_grid, throughput_under_slo, throughput_under_slos, SloOutcome, SloSearch};

pub use crate::model::Model;

/// Service-time distribution, scaled to the configured mean.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Service {
    /// Deterministic: every message takes exactly the mean (SCV 0).
    Fixed,
    /// Exponential (SCV 1).
    Exp,
    /// 90% at 0.5 × mean, 10% at 5.5 × mean (SCV 2.25), the paper's bimodal workload.
    Bimodal,
}

impl Service {
    /// Squared coefficient of variation (variance / mean²).
    pub fn scv(self) -> f64 {
        match self {
            Service::Fixed => 0.0,
            Service::Exp => 1.0,
            Service::Bimodal => 0.9 * 0.25 + 0.1 * 30.25 - 1.0,
        }
    }

    /// Lower-case name, as accepted by [`FromStr`].
    pub fn name(self) -> &'static str {
        match self {
            Service::Fixed => "fixed",
            Service::Exp => "exp",
            Service::Bimodal => "bimodal",
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for Service {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fixed" | "det" | "deterministic" => Ok(Service::Fixed),
            "exp" | "exponential" => Ok(Service::Exp),
            "bimodal" => Ok(Service::Bimodal),
            _ => Err(ParseError {
                what: "service distribution",
                got: s.to_string(),
                expected: "fixed, exp or bimodal",
            }),
        }
    }
}

/// An unknown [`Model`] or [`Service`] name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {got:?} (expected {expected})")]
pub struct ParseError {
    what: &'static str,
    got: String,
    expected: &'static str,
}

/// When the server pauses, in the time unit of [`SimConfig::mean_service`].
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pauses {
    /// Pauses arrive at `rate` per time unit (the gap from one pause's end to the next
    /// one's start is exponential with mean `1 / rate`, so pauses never overlap); each
    /// lasts `mean` (`exponential`: exponentially distributed with that mean).
    Poisson {
        /// Pauses per time unit (0: none).
        rate: f64,
        /// Mean duration.
        mean: f64,
        /// Exponential durations instead of fixed ones.
        exponential: bool,
    },
    /// Explicit pauses: (start, duration), sorted by start, not overlapping.
    List(Vec<(f64, f64)>),
}

impl Pauses {
    /// Checks the numbers (finite, non-negative, a list sorted and without overlaps).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        match self {
            Pauses::Poisson { rate, mean, .. } => {
                if !ok(*rate) || !ok(*mean) {
                    return Err(ConfigError::Pauses(
                        "rate and mean duration must be finite and >= 0",
                    ));
                }
            }
            Pauses::List(l) => {
                let mut end = 0.0f64;
                for &(start, d) in l {
                    if !ok(start) || !ok(d) {
                        return Err(ConfigError::Pauses(
                            "pause starts and durations must be finite and >= 0",
                        ));
                    }
                    if start < end {
                        return Err(ConfigError::Pauses(
                            "pauses must be sorted by start and must not overlap",
                        ));
                    }
                    end = start + d;
                }
            }
        }
        Ok(())
    }
}

/// A configuration the simulator refuses.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// `workers == 0`.
    #[error("workers must be at least 1")]
    ZeroWorkers,
    /// `connections == 0`.
    #[error("connections must be at least 1")]
    ZeroConnections,
    /// Load not in the open interval (0, 1): at 1 or above the queues grow without bound.
    #[error("load must be in (0, 1), got {0}")]
    Load(f64),
    /// Mean service time not finite and positive.
    #[error("mean service time must be finite and > 0, got {0}")]
    MeanService(f64),
    /// `requests == 0`.
    #[error("requests (measured messages) must be at least 1")]
    ZeroRequests,
    /// SLO not finite and positive.
    #[error("SLO must be finite and > 0, got {0}")]
    Slo(f64),
    /// Load grid empty, unsorted, or with a point outside (0, 1).
    #[error("load grid must be non-empty, strictly increasing and inside (0, 1)")]
    Grid,
    /// A pause process the simulator cannot run.
    #[error("pauses: {0}")]
    Pauses(&'static str),
}

/// One simulation run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimConfig {
    /// Queueing model.
    pub model: Model,
    /// Number of workers (servers), `c`.
    pub workers: usize,
    /// Number of connections, `N`.
    pub connections: usize,
    /// Service-time distribution.
    pub service: Service,
    /// Mean service time, the time unit of every result (1.0: results in units of the mean).
    pub mean_service: f64,
    /// Offered load as a fraction of the `c` workers, in (0, 1).
    pub load: f64,
    /// Messages whose sojourn time is recorded (after the warm-up).
    pub requests: usize,
    /// Messages simulated and discarded before recording starts.
    pub warmup: usize,
    /// Seed of every random stream.
    pub seed: u64,
    /// The server's pauses (None: it never pauses).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pauses: Option<Pauses>,
    /// What a pause stops ([`PauseScope::Server`]: everything).
    #[serde(skip_serializing_if = "PauseScope::is_server")]
    pub pause_scope: PauseScope,
}

/// What stops during a pause ([`SimConfig::pauses`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PauseScope {
    /// The whole server: nothing is dispatched, started or delivered; a worker freed in a
    /// pause starts its next message at its end.
    #[default]
    Server,
    /// The I/O side only (a stalled I/O core whose workers run on cores of their own, as
    /// r2c's virtual workers with start times): arrivals are dispatched and replies
    /// delivered at the pause's end, but a worker freed in a pause starts a message that
    /// was dispatched before it at once. MS and CP (CS's releases would need the I/O side
    /// modelled per connection; refused).
    Io,
}

impl PauseScope {
    fn is_server(&self) -> bool {
        *self == PauseScope::Server
    }
}

impl SimConfig {
    /// A config with mean service 1, 1,000,000 measured messages after a 100,000 warm-up,
    /// seed 1.
    pub fn new(
        model: Model,
        workers: usize,
        connections: usize,
        service: Service,
        load: f64,
    ) -> Self {
        SimConfig {
            model,
            workers,
            connections,
            service,
            mean_service: 1.0,
            load,
            requests: 1_000_000,
            warmup: 100_000,
            seed: 1,
            pauses: None,
            pause_scope: PauseScope::Server,
        }
    }

    /// Checks every field; [`simulate`] calls it first.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.workers == 0 {
            return Err(ConfigError::ZeroWorkers);
        }
        if self.connections == 0 {
            return Err(ConfigError::ZeroConnections);
        }
        if !(self.load > 0.0 && self.load < 1.0) {
            return Err(ConfigError::Load(self.load));
        }
        if !(self.mean_service.is_finite() && self.mean_service > 0.0) {
            return Err(ConfigError::MeanService(self.mean_service));
        }
        if self.requests == 0 {
            return Err(ConfigError::ZeroRequests);
        }
        if let Some(p) = &self.pauses {
            p.validate()?;
        }
        if self.pause_scope == PauseScope::Io && self.model == Model::Cs {
            return Err(ConfigError::Pauses(
                "I/O-side pauses are modelled under MS and CP only",
            ));
        }
        Ok(())
    }

    /// Total arrival rate `λ = load · c / mean`.
    pub fn arrival_rate(&self) -> f64 {
        self.load * self.workers as f64 / self.mean_service
    }
}

/// Sojourn-time statistics of one run, in the time unit of `mean_service`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimResult {
    /// The config that produced this result.
    pub config: SimConfig,
    /// Mean sojourn time.
    pub mean: f64,
    /// Median sojourn time.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest recorded sojourn time.
    pub max: f64,
}

/// Runs one simulation. Deterministic: the same config gives a bit-identical result.
pub fn simulate(cfg: &SimConfig) -> Result<SimResult, ConfigError> {
    cfg.validate()?;
    let mut samples = engine::run(cfg);
    let n = samples.len();
    let mean = samples.iter().sum::<f64>() / n as f64;
    let max = samples.iter().copied().fold(0.0, f64::max);
    Ok(SimResult {
        config: cfg.clone(),
        mean,
        p50: quantile(&mut samples, 0.5),
        p99: quantile(&mut samples, 0.99),
        p999: quantile(&mut samples, 0.999),
        max,
    })
}

/// Runs every config on up to `jobs` threads; results in input order, identical to running
/// them one by one. Fails on the first invalid config before simulating anything.
pub fn simulate_many(cfgs: &[SimConfig], jobs: usize) -> Result<Vec<SimResult>, ConfigError> {
    for c in cfgs {
        c.validate()?;
    }
    slo::par_map(cfgs, jobs, simulate).into_iter().collect()
}

/// Nearest-rank quantile (the `ceil(q·n)`-th smallest); reorders `samples`. `samples` non-empty.
fn quantile(samples: &mut [f64], q: f64) -> f64 {
    let n = samples.len();
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    let (_, v, _) = samples.select_nth_unstable_by(rank - 1, f64::total_cmp);
    *v
}

#[cfg(test)]
mod tests;
