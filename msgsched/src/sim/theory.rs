//! Closed forms the simulator is validated against. Times are in units of `mean` (the mean
//! service time); `rho` is the per-server utilisation `λ · mean / c`.

/// Erlang C: probability that an arrival waits in M/M/c at utilisation `rho` (in [0, 1)).
/// Computed through the Erlang B recursion, which is stable for large `c`.
pub fn erlang_c(c: usize, rho: f64) -> f64 {
    let a = rho * c as f64; // offered load in Erlangs
    let mut b = 1.0;
    for k in 1..=c {
        b = a * b / (k as f64 + a * b);
    }
    b / (1.0 - rho * (1.0 - b))
}

/// `P(T > t)` for the M/M/c sojourn time `T` (FCFS) with mean service `mean`.
///
/// The wait is 0 with probability `1 - C` and otherwise exponential with rate
/// `a = c·μ·(1 - rho)`; the service is exponential with rate `μ`. So `T` is a mixture of
/// `Exp(μ)` and the hypoexponential `Exp(a) + Exp(μ)`, whose tail is
/// `(a·e^{-μt} - μ·e^{-at}) / (a - μ)` (or `(1 + μt)·e^{-μt}` when `a = μ`).
pub fn mmc_sojourn_tail(c: usize, rho: f64, mean: f64, t: f64) -> f64 {
    let mu = 1.0 / mean;
    let a = c as f64 * mu * (1.0 - rho);
    let pw = erlang_c(c, rho);
    let exp_tail = (-mu * t).exp();
    let hypo_tail = if ((a - mu) / mu).abs() < 1e-9 {
        (1.0 + mu * t) * exp_tail
    } else {
        (a * exp_tail - mu * (-a * t).exp()) / (a - mu)
    };
    (1.0 - pw) * exp_tail + pw * hypo_tail
}

/// The `q`-quantile of the M/M/c sojourn time, by bisection on [`mmc_sojourn_tail`]
/// (monotone decreasing in `t`). `q` in (0, 1), `rho` in [0, 1).
pub fn mmc_sojourn_quantile(c: usize, rho: f64, mean: f64, q: f64) -> f64 {
    let target = 1.0 - q;
    let mut hi = mean;
    while mmc_sojourn_tail(c, rho, mean, hi) > target {
        hi *= 2.0;
    }
    let mut lo = 0.0;
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mmc_sojourn_tail(c, rho, mean, mid) > target {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= 1e-12 * hi {
            break;
        }
    }
    0.5 * (lo + hi)
}

/// Mean M/M/c sojourn time: `mean + C / (c·μ·(1 - rho))`.
pub fn mmc_mean_sojourn(c: usize, rho: f64, mean: f64) -> f64 {
    mean + erlang_c(c, rho) * mean / (c as f64 * (1.0 - rho))
}

/// The `q`-quantile of the M/M/1 sojourn time, which is exponential with rate `μ - λ`:
/// `-ln(1 - q) · mean / (1 - rho)` (p99: `ln(100) / (μ - λ)`).
pub fn mm1_sojourn_quantile(rho: f64, mean: f64, q: f64) -> f64 {
    -(1.0 - q).ln() * mean / (1.0 - rho)
}

/// Pollaczek–Khinchine mean sojourn time of M/G/1 with service SCV `scv`:
/// `mean + rho · mean · (1 + scv) / (2 (1 - rho))`.
pub fn mg1_mean_sojourn(rho: f64, mean: f64, scv: f64) -> f64 {
    mean + rho * mean * (1.0 + scv) / (2.0 * (1.0 - rho))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erlang_c_known_values() {
        // One server: C = rho. Two servers: C = 2 rho^2 / (1 + rho).
        assert!((erlang_c(1, 0.3) - 0.3).abs() < 1e-12);
        assert!((erlang_c(2, 0.5) - 2.0 * 0.25 / 1.5).abs() < 1e-12);
    }

    #[test]
    fn mmc_p99_matches_reference_values() {
        // references.md "Queueing facts": M/M/20 p99 sojourn, units of the mean.
        for (rho, want) in [
            (0.5, 4.61),
            (0.7, 4.62),
            (0.8, 4.69),
            (0.9, 5.04),
            (0.95, 6.36),
        ] {
            let got = mmc_sojourn_quantile(20, rho, 1.0, 0.99);
            assert!((got - want).abs() < 0.006, "rho {rho}: {got} vs {want}");
        }
        for (rho, want) in [
            (0.5, 9.21),
            (0.7, 15.35),
            (0.8, 23.0),
            (0.9, 46.1),
            (0.95, 92.1),
        ] {
            let got = mm1_sojourn_quantile(rho, 1.0, 0.99);
            // Rounded to three or four significant figures in references.md.
            assert!(
                (got - want).abs() / want < 0.002,
                "rho {rho}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn one_server_mmc_is_mm1() {
        for rho in [0.2, 0.5, 0.9] {
            let a = mmc_sojourn_quantile(1, rho, 2.0, 0.99);
            let b = mm1_sojourn_quantile(rho, 2.0, 0.99);
            assert!((a - b).abs() / b < 1e-9, "{a} {b}");
            let m = mmc_mean_sojourn(1, rho, 2.0);
            assert!((m - 2.0 / (1.0 - rho)).abs() < 1e-9);
        }
    }
}
