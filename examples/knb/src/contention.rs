//! Was the machine quiet enough for a round to count?
//!
//! A busy-polling stack (luna, smoltcp, the raw link) measures the stack only while its
//! threads own their CPUs. knb records, per round, the CPU each side's threads actually
//! got (`cpu.<side>.threads[].util`, from `schedstat`), their involuntary context
//! switches and the host's steal time on the CPUs in use ([`crate::cpu`]). A round is
//! **contended** when
//!
//! * a busy-polling side's pollers got less than [`MIN_POLLER_CPU`] of a CPU each
//!   (`--min-cpu`), or
//! * the hypervisor stole more than [`MAX_STEAL`] of the used CPUs' time (`--max-steal`)
//!   — other tenants of the host ran on our virtual CPUs.
//!
//! The kernel stack sleeps in epoll between RPCs, so its CPU share says nothing about
//! contention: only steal flags its rounds.
//!
//! A round is **unstable** when its RPC/s differ from the median of the stack's rounds by
//! more than [`UNSTABLE_FACTOR`] (`--unstable-factor`) either way: the machine's
//! two-speed mode (docs/benchmarks.md), which may hit a round without starving it.
//! Unstable rounds are shown, not dropped (with two speeds, which one is "right" is not
//! knb's call).
//!
//! Ratios use clean rounds only: a round counts for A/B when both A and B were clean in
//! it. A ratio needs [`enough_clean`] rounds, else it is not printed and `knb compare`
//! says the machine was too busy to measure it, and which side starved.
//!
//! Everything here is pure: it reads run reports (JSON) and returns verdicts.

use clap::Args;
use serde_json::{json, Value};

/// Share of a CPU below which a busy-polling thread counts as starved.
pub const MIN_POLLER_CPU: f64 = 0.9;
/// Share of the used CPUs' time stolen by the hypervisor above which a round is contended.
pub const MAX_STEAL: f64 = 0.05;
/// A round whose RPC/s is above median × this or below median / this is unstable.
pub const UNSTABLE_FACTOR: f64 = 1.5;

/// Thresholds of the round checks (`knb compare`, `knb sweep`).
#[derive(Args, Debug, Clone, Copy, PartialEq)]
pub struct TrustArgs {
    /// A busy-polling side whose threads got less than this share of a CPU each makes the
    /// round contended (0 turns the check off).
    #[arg(long, default_value_t = MIN_POLLER_CPU, value_parser = parse_share)]
    pub min_cpu: f64,
    /// Host steal time above this share of the used CPUs' time makes the round contended
    /// (1 turns the check off).
    #[arg(long, default_value_t = MAX_STEAL, value_parser = parse_share)]
    pub max_steal: f64,
    /// RPC/s further than this factor from the stack's median marks a round unstable.
    #[arg(long, default_value_t = UNSTABLE_FACTOR, value_parser = parse_factor)]
    pub unstable_factor: f64,
    /// Exit with status 1 when the machine was too busy to measure a ratio.
    #[arg(long)]
    pub strict: bool,
}

impl Default for TrustArgs {
    fn default() -> Self {
        TrustArgs {
            min_cpu: MIN_POLLER_CPU,
            max_steal: MAX_STEAL,
            unstable_factor: UNSTABLE_FACTOR,
            strict: false,
        }
    }
}

fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err(format!("{s:?}: give a share between 0 and 1, e.g. 0.9")),
    }
}

fn parse_factor(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 1.0 && x.is_finite() => Ok(x),
        _ => Err(format!("{s:?}: give a factor above 1, e.g. 1.5")),
    }
}

/// Whether `stack`'s threads busy-poll (so a CPU share below 1 means they were starved).
pub fn busy_polls(stack: &str) -> bool {
    matches!(stack, "luna" | "smoltcp" | "raw")
}

/// The CPU share each poller of a side got: the mean util of its `pollers` busiest
/// threads (a side runs one poller per `--threads`; helper threads such as knb's
/// monitor or DPDK's `eal-intr-thread` are nearly idle and fall out). None when the side
/// was not measured.
pub fn poller_cpu(side: &Value, pollers: usize) -> Option<f64> {
    let mut u: Vec<f64> = side["threads"]
        .as_array()?
        .iter()
        .filter_map(|t| t["util"].as_f64())
        .collect();
    let pollers = pollers.max(1);
    if u.is_empty() {
        return side["cores"].as_f64().map(|c| c / pollers as f64);
    }
    u.sort_by(|a, b| b.total_cmp(a));
    u.resize(pollers, 0.0);
    Some(u.iter().sum::<f64>() / pollers as f64)
}

/// Steal share over the CPUs the run used, from `cpu.steal.per_cpu` (the mean over
/// those CPUs; each CPU had the same wall time), else `cpu.steal.share`.
pub fn steal_share(run: &Value) -> Option<f64> {
    let st = &run["cpu"]["steal"];
    let cfg = &run["config"];
    let used: Vec<u64> = ["client_cpus", "server_cpus"]
        .iter()
        .flat_map(|k| cfg[*k].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c.as_u64())
        .collect();
    let mut seen = Vec::new();
    let mut v = Vec::new();
    for c in used {
        if seen.contains(&c) {
            continue;
        }
        seen.push(c);
        if let Some(x) = st["per_cpu"][c.to_string()].as_f64() {
            v.push(x);
        }
    }
    if v.is_empty() {
        st["share"].as_f64()
    } else {
        // Rounded like the per-CPU figures it averages.
        Some((v.iter().sum::<f64>() / v.len() as f64 * 1e4).round() / 1e4)
    }
}

/// The verdict on one round.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Health {
    /// Left out of ratios.
    pub contended: bool,
    /// Why, one phrase each (`server got 0.62 of a CPU (< 0.9)`, `host steal 8.0% (> 5.0%)`).
    pub reasons: Vec<String>,
    /// Busy-polling sides that got less than the threshold: `client` / `server`.
    pub starved: Vec<&'static str>,
    /// CPU share per poller of each side (None: not measured).
    pub client_cpu: Option<f64>,
    /// See `client_cpu`.
    pub server_cpu: Option<f64>,
    /// Host steal share on the used CPUs.
    pub steal: Option<f64>,
    /// Involuntary context switches of each side's process in the window.
    pub nvcsw: (Option<u64>, Option<u64>),
}

impl Health {
    /// As JSON (`contention` of a run report).
    pub fn to_json(&self) -> Value {
        json!({
            "contended": self.contended,
            "reasons": self.reasons,
            "starved": self.starved,
            "client_cpu": self.client_cpu,
            "server_cpu": self.server_cpu,
            "steal": self.steal,
            "nvcsw": {"client": self.nvcsw.0, "server": self.nvcsw.1},
        })
    }

    /// One line for tables: `clean`, or `contended: server got 0.62 of a CPU (< 0.9)`.
    pub fn describe(&self) -> String {
        if self.contended {
            format!("contended: {}", self.reasons.join("; "))
        } else {
            "clean".into()
        }
    }
}

/// Judges one run report (`knb rpc` JSON, or a raw run with `stack: "raw"` and only
/// `cpu.steal`).
pub fn assess(run: &Value, th: &TrustArgs) -> Health {
    let stack = run["stack"].as_str().unwrap_or("");
    let client_stack = run["client_stack"].as_str().unwrap_or(stack);
    let pollers = run["config"]["threads"].as_u64().unwrap_or(1) as usize;
    let cpu = &run["cpu"];
    let mut h = Health {
        client_cpu: poller_cpu(&cpu["client"], pollers),
        server_cpu: poller_cpu(&cpu["server"], pollers),
        steal: steal_share(run),
        nvcsw: (
            cpu["client"]["nvcsw"].as_u64(),
            cpu["server"]["nvcsw"].as_u64(),
        ),
        ..Health::default()
    };
    for (side, s, got) in [
        ("client", client_stack, h.client_cpu),
        ("server", stack, h.server_cpu),
    ] {
        if let Some(g) = got.filter(|&g| busy_polls(s) && g < th.min_cpu) {
            h.starved.push(side);
            h.reasons.push(format!(
                "{side} ({s}) got {g:.2} of a CPU per poller (< {})",
                th.min_cpu
            ));
        }
    }
    if let Some(st) = h.steal.filter(|&st| st > th.max_steal) {
        h.reasons.push(format!(
            "host steal {:.1}% of the CPUs' time (> {:.1}%): another tenant ran on them",
            st * 100.0,
            th.max_steal * 100.0
        ));
    }
    h.contended = !h.reasons.is_empty();
    h
}

/// Which rounds are unstable: RPC/s further than `factor` from the median of the
/// measured rounds (None = failed round, never unstable).
pub fn unstable(rps: &[Option<f64>], factor: f64) -> Vec<bool> {
    let ok: Vec<f64> = rps.iter().flatten().copied().collect();
    let Some(med) = crate::compare::median(&ok) else {
        return vec![false; rps.len()];
    };
    rps.iter()
        .map(|r| r.is_some_and(|x| med > 0.0 && (x > med * factor || x < med / factor)))
        .collect()
}

/// Whether `kept` clean rounds out of `measured` (both sides ran) are enough for a ratio:
/// at least half of them and at least two (or all, when fewer than two were measured).
pub fn enough_clean(kept: usize, measured: usize) -> bool {
    measured > 0 && kept >= measured.min(2) && 2 * kept >= measured
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run report as knb writes it: one poller per side with `c` / `s` of a CPU, a
    /// near-idle helper thread on the client, `steal` on CPUs 0 and 1.
    fn run(stack: &str, c: f64, s: f64, steal: f64) -> Value {
        json!({
            "stack": stack,
            "config": {"threads": 1, "client_cpus": [0], "server_cpus": [1]},
            "cpu": {
                "client": {"cores": c + 0.01, "nvcsw": 40, "threads": [
                    {"tid": 1, "name": "knb", "cpu": 0, "util": c, "nvcsw": 38},
                    {"tid": 2, "name": "knb-monitor", "cpu": 0, "util": 0.01, "nvcsw": 2}]},
                "server": {"cores": s, "nvcsw": 3, "threads": [
                    {"tid": 3, "name": "knb", "cpu": 1, "util": s, "nvcsw": 3}]},
                "steal": {"share": steal, "per_cpu": {"0": steal, "1": steal, "2": 0.9}},
            },
        })
    }

    #[test]
    fn a_starved_round_is_flagged_and_a_clean_one_is_not() {
        let th = TrustArgs::default();
        let clean = assess(&run("luna", 0.99, 0.97, 0.0), &th);
        assert!(!clean.contended, "{clean:?}");
        assert_eq!(clean.describe(), "clean");
        assert_eq!(clean.nvcsw, (Some(40), Some(3)));
        assert_eq!(clean.client_cpu, Some(0.99));

        let starved = assess(&run("luna", 0.98, 0.55, 0.0), &th);
        assert!(starved.contended);
        assert_eq!(starved.starved, vec!["server"]);
        assert!(
            starved
                .describe()
                .contains("server (luna) got 0.55 of a CPU"),
            "{}",
            starved.describe()
        );
        assert_eq!(starved.to_json()["contended"], true);
        // Just under the threshold counts; --min-cpu moves it.
        assert!(assess(&run("smoltcp", 0.89, 0.95, 0.0), &th).contended);
        let lax = TrustArgs { min_cpu: 0.5, ..th };
        assert!(!assess(&run("smoltcp", 0.89, 0.95, 0.0), &lax).contended);
    }

    #[test]
    fn the_kernel_sleeps_so_only_steal_flags_it() {
        let th = TrustArgs::default();
        assert!(!assess(&run("kernel", 0.3, 0.2, 0.01), &th).contended);
        let h = assess(&run("kernel", 0.3, 0.2, 0.08), &th);
        assert!(h.contended && h.starved.is_empty(), "{h:?}");
        assert!(h.describe().contains("host steal 8.0%"), "{}", h.describe());
        // Steal is averaged over the used CPUs only (CPU 2's 0.9 is not ours).
        assert_eq!(h.steal, Some(0.08));
        // Interop: the client side's own stack decides whether it busy-polls.
        let mut r = run("kernel", 0.3, 0.99, 0.0);
        r["client_stack"] = json!("smoltcp");
        assert_eq!(assess(&r, &th).starved, vec!["client"]);
    }

    #[test]
    fn pollers_are_the_busiest_threads() {
        let side = json!({"cores": 1.6, "threads": [
            {"util": 0.05}, {"util": 0.95}, {"util": 0.6}]});
        assert!((poller_cpu(&side, 2).unwrap() - 0.775).abs() < 1e-9);
        assert_eq!(poller_cpu(&side, 1), Some(0.95));
        // More pollers than threads seen: the missing ones got nothing.
        assert!((poller_cpu(&side, 4).unwrap() - 0.4).abs() < 1e-9);
        assert_eq!(
            poller_cpu(&json!({"cores": 1.8, "threads": []}), 2),
            Some(0.9)
        );
        assert_eq!(poller_cpu(&Value::Null, 1), None);
        // Not measured: not flagged (and not claimed clean by a CPU figure either).
        let h = assess(
            &json!({"stack": "luna", "config": {"threads": 1}}),
            &TrustArgs::default(),
        );
        assert!(!h.contended && h.client_cpu.is_none() && h.steal.is_none());
    }

    #[test]
    fn unstable_rounds_are_far_from_the_median() {
        let r = [Some(255.0), Some(260.0), Some(111.0), None, Some(258.0)];
        assert_eq!(unstable(&r, 1.5), vec![false, false, true, false, false]);
        assert_eq!(unstable(&r, 3.0), vec![false; 5]);
        assert_eq!(unstable(&[Some(100.0), Some(400.0)], 1.5), vec![true, true]);
        assert_eq!(unstable(&[None, None], 1.5), vec![false, false]);
    }

    #[test]
    fn enough_clean_rounds() {
        assert!(enough_clean(1, 1));
        assert!(!enough_clean(0, 1));
        assert!(enough_clean(2, 3));
        assert!(!enough_clean(1, 3));
        assert!(enough_clean(2, 4));
        assert!(!enough_clean(1, 2));
        assert!(!enough_clean(0, 0));
    }

    #[test]
    fn thresholds_parse() {
        assert_eq!(parse_share("0.9"), Ok(0.9));
        assert!(parse_share("1.5").is_err() && parse_share("x").is_err());
        assert_eq!(parse_factor("2"), Ok(2.0));
        assert!(parse_factor("1").is_err() && parse_factor("inf").is_err());
    }
}
