//! Throughput under an SLO: the highest load whose p99 sojourn time stays within the SLO.
//!
//! Definition (noise makes p99 non-monotone in load near the answer, so it has to be explicit):
//! 1. simulate every grid load in increasing order, all with the same seed;
//! 2. let `L` be the highest grid load such that it **and every lower grid load** pass
//!    (`p99 <= slo`), and `H` the next grid load (the first one that fails);
//! 3. bisect `refine` times between `L` and `H` (a midpoint that passes becomes the new `L`);
//!    the answer is the final `L`.
//!
//! If the lowest grid load already fails, `L` starts at 0 (the answer may be 0: even an idle
//! system misses the SLO, e.g. bimodal service with an SLO below 5.5 × mean). If every grid
//! load passes, the answer is the highest grid load and [`SloOutcome::saturated`] is set.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::Serialize;

use super::{simulate, ConfigError, SimConfig};

/// A throughput-under-SLO search.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SloSearch {
    /// Everything but the load, which the search varies.
    pub base: SimConfig,
    /// The p99 target, in the time unit of `base.mean_service` (with mean 1: units of the mean).
    pub slo: f64,
    /// Loads to scan, strictly increasing, inside (0, 1).
    pub grid: Vec<f64>,
    /// Bisection steps between the last passing and the first failing grid load.
    pub refine: u32,
    /// Simulations run in parallel (threads); does not change the result.
    pub jobs: usize,
}

impl SloSearch {
    /// A search over [`default_grid`] with 5 bisection steps (resolution 0.01 / 32), one thread.
    pub fn new(base: SimConfig, slo: f64) -> Self {
        SloSearch {
            base,
            slo,
            grid: default_grid(),
            refine: 5,
            jobs: 1,
        }
    }
}

/// Loads 0.01, 0.02, …, 0.99.
pub fn default_grid() -> Vec<f64> {
    (1..=99).map(|i| f64::from(i) / 100.0).collect()
}

/// Result of a search for one SLO.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SloOutcome {
    /// The SLO searched for.
    pub slo: f64,
    /// Throughput under the SLO, as a fraction of the `c` workers (see the module docs).
    pub load: f64,
    /// The p99 measured at `load` (`None` when `load` is 0).
    pub p99_at_load: Option<f64>,
    /// First grid load that failed (`None`: every grid load passed).
    pub first_failing_grid_load: Option<f64>,
    /// Every grid load passed: the true answer may be higher than `load`.
    pub saturated: bool,
}

/// Throughput under `search.slo` (see the module docs for the exact definition).
pub fn throughput_under_slo(search: &SloSearch) -> Result<SloOutcome, ConfigError> {
    let mut v = throughput_under_slos(search, &[search.slo])?;
    Ok(v.remove(0))
}

/// Like [`throughput_under_slo`] for several SLOs at once (`search.slo` is ignored); the grid
/// is scanned once, up to the first load that fails the largest SLO. Outcomes follow `slos`.
pub fn throughput_under_slos(
    search: &SloSearch,
    slos: &[f64],
) -> Result<Vec<SloOutcome>, ConfigError> {
    let grid = &search.grid;
    if grid.is_empty()
        || grid.iter().any(|&l| !(l > 0.0 && l < 1.0))
        || grid.windows(2).any(|w| w[0] >= w[1])
    {
        return Err(ConfigError::Grid);
    }
    if let Some(&bad) = slos.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
        return Err(ConfigError::Slo(bad));
    }
    let at = |load: f64| SimConfig {
        load,
        ..search.base.clone()
    };
    at(grid[0]).validate()?;
    let jobs = search.jobs.max(1);
    let p99 = |load: f64| simulate(&at(load)).map(|r| r.p99);

    // Scan: first failing grid index per SLO.
    let mut first_fail: Vec<Option<usize>> = vec![None; slos.len()];
    let mut scanned: Vec<f64> = Vec::new();
    while scanned.len() < grid.len() && first_fail.iter().any(Option::is_none) {
        let batch: Vec<f64> = grid
            .iter()
            .skip(scanned.len())
            .take(jobs)
            .copied()
            .collect();
        for r in par_map(&batch, jobs, |&l| p99(l)) {
            let idx = scanned.len();
            let p = r?;
            scanned.push(p);
            for (f, &slo) in first_fail.iter_mut().zip(slos) {
                if f.is_none() && p > slo {
                    *f = Some(idx);
                }
            }
        }
    }

    // Refine each SLO by bisection; SLOs in parallel.
    let idx: Vec<usize> = (0..slos.len()).collect();
    par_map(&idx, jobs, |&i| {
        let slo = slos[i];
        let Some(k) = first_fail[i] else {
            let last = grid.len() - 1;
            return Ok(SloOutcome {
                slo,
                load: grid[last],
                p99_at_load: Some(scanned[last]),
                first_failing_grid_load: None,
                saturated: true,
            });
        };
        let (mut lo, mut lo_p99) = if k == 0 {
            (0.0, None)
        } else {
            (grid[k - 1], Some(scanned[k - 1]))
        };
        let mut hi = grid[k];
        for _ in 0..search.refine {
            let mid = 0.5 * (lo + hi);
            let p = p99(mid)?;
            if p <= slo {
                lo = mid;
                lo_p99 = Some(p);
            } else {
                hi = mid;
            }
        }
        Ok(SloOutcome {
            slo,
            load: lo,
            p99_at_load: lo_p99,
            first_failing_grid_load: Some(grid[k]),
            saturated: false,
        })
    })
    .into_iter()
    .collect()
}

/// `items.iter().map(f)` on up to `jobs` threads; results in input order.
pub(crate) fn par_map<T: Sync, R: Send>(
    items: &[T],
    jobs: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    if jobs <= 1 || items.len() <= 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..jobs.min(items.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                out.lock().expect("no worker panics while holding the lock")[i] = Some(r);
            });
        }
    });
    out.into_inner()
        .expect("no worker panicked")
        .into_iter()
        .map(|r| r.expect("every index was processed"))
        .collect()
}
