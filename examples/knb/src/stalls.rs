//! Loop stalls of a run (luna backend): the r2c core loop's own gap counters
//! (`loop_gaps_*`, `loop_gap*_ns` in `r2c::CoreStats`) over the measured window.
//!
//! The counters are cumulative; a window is the difference of a reading at its start and
//! one at its end. Counts and times difference exactly; the longest gap does not (r2c
//! keeps the maximum since start), so the window's maximum is a range: exact when the
//! maximum grew inside the window (the new maximum happened there), otherwise bounded by
//! the highest bucket with a gap in the window and by the maximum before it.

use serde_json::{json, Value};

/// The bucket thresholds of r2c's `loop_gaps_*` counters (ns), in field order.
pub const THRESHOLDS_NS: [u64; 5] = [100_000, 500_000, 1_000_000, 2_000_000, 5_000_000];
const NAMES: [&str; 5] = [
    "gaps_100us",
    "gaps_500us",
    "gaps_1ms",
    "gaps_2ms",
    "gaps_5ms",
];

/// A side's (or a point's) loop stalls over a window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stalls {
    /// Gaps of at least each of [`THRESHOLDS_NS`].
    pub gaps: [u64; 5],
    /// Time in gaps >= 100 µs (ns).
    pub stall_ns: u64,
    /// Time in gaps >= 1 ms (ns).
    pub stall_1ms_ns: u64,
    /// The window's longest gap is at least this (ns)...
    pub max_lo_ns: u64,
    /// ... and at most this (ns; `u64::MAX`: unbounded). Equal: exact.
    pub max_hi_ns: u64,
    /// How long apart the two readings were (ns): the measured window, or None for the
    /// whole run.
    pub window_ns: Option<u64>,
    /// Where the core's time went in its iterations that received and sent (r2c built
    /// with feature `phases`, knb's `phases`; all zero otherwise).
    pub phases: Phases,
}

/// r2c's `phase_*` counters over a window: iterations that both received and sent, and
/// the time summed per phase (receive, stack input, application, stack output,
/// transmit), in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Phases {
    /// Iterations that received and sent.
    pub iterations: u64,
    /// Summed ns per phase, in [`PHASE_NAMES`] order.
    pub ns: [u64; 5],
}

/// The phases' names in reports, in r2c's order.
pub const PHASE_NAMES: [&str; 5] = ["rx", "input", "app", "output", "tx"];

fn phase_sums(s: &r2c::CoreStats) -> (u64, [u64; 5]) {
    (
        s.phase_iterations,
        [
            s.phase_rx_ns,
            s.phase_input_ns,
            s.phase_app_ns,
            s.phase_output_ns,
            s.phase_tx_ns,
        ],
    )
}

impl Phases {
    /// Mean ns per iteration of each phase (None without iterations).
    pub fn means(&self) -> Option<[f64; 5]> {
        (self.iterations > 0).then(|| self.ns.map(|n| n as f64 / self.iterations as f64))
    }

    fn combine(&self, o: &Phases) -> Phases {
        Phases {
            iterations: self.iterations + o.iterations,
            ns: std::array::from_fn(|i| self.ns[i] + o.ns[i]),
        }
    }

    fn to_json(self) -> Option<Value> {
        let m = self.means()?;
        let mut v = json!({ "iterations": self.iterations });
        for (n, x) in PHASE_NAMES.iter().zip(m) {
            v[format!("{n}_ns")] = json!((x * 10.0).round() / 10.0);
        }
        Some(v)
    }

    fn from_json(v: &Value) -> Phases {
        let Some(iterations) = v["iterations"].as_u64() else {
            return Phases::default();
        };
        let ns = PHASE_NAMES.map(|n| {
            v[format!("{n}_ns")]
                .as_f64()
                .map_or(0, |x| (x * iterations as f64).round() as u64)
        });
        Phases { iterations, ns }
    }

    /// `rx 950, input 250, app 240, output 130, tx 800 ns (sum 2370) over 600,000`.
    pub fn describe(&self) -> Option<String> {
        let m = self.means()?;
        let parts: Vec<String> = PHASE_NAMES
            .iter()
            .zip(m)
            .map(|(n, x)| format!("{n} {x:.0}"))
            .collect();
        Some(format!(
            "{} ns (sum {:.0}) over {} iterations",
            parts.join(", "),
            m.iter().sum::<f64>(),
            self.iterations
        ))
    }
}

fn counts(s: &r2c::CoreStats) -> [u64; 5] {
    [
        s.loop_gaps_100us,
        s.loop_gaps_500us,
        s.loop_gaps_1ms,
        s.loop_gaps_2ms,
        s.loop_gaps_5ms,
    ]
}

impl Stalls {
    /// What happened between readings `a` and `b` of one core, `window_ns` apart (`a` all
    /// zero and `window_ns` None: the whole run).
    pub fn between(a: &r2c::CoreStats, b: &r2c::CoreStats, window_ns: Option<u64>) -> Stalls {
        let (ca, cb) = (counts(a), counts(b));
        let gaps: [u64; 5] = std::array::from_fn(|i| cb[i].saturating_sub(ca[i]));
        // The highest bucket with a gap bounds the maximum from below, the next threshold
        // from above (every gap of the window is under it).
        let top = gaps.iter().rposition(|&n| n > 0);
        let (mut lo, mut hi) = match top {
            None => (0, THRESHOLDS_NS[0] - 1),
            Some(k) => (
                THRESHOLDS_NS[k],
                THRESHOLDS_NS.get(k + 1).map_or(u64::MAX, |t| t - 1),
            ),
        };
        if b.loop_gap_max_ns > a.loop_gap_max_ns {
            // A new maximum: it happened between the readings and is the window's longest.
            lo = b.loop_gap_max_ns;
            hi = b.loop_gap_max_ns;
        } else if top.is_some() {
            hi = hi.min(a.loop_gap_max_ns);
        }
        let ((ia, na), (ib, nb)) = (phase_sums(a), phase_sums(b));
        let phases = Phases {
            iterations: ib.saturating_sub(ia),
            ns: std::array::from_fn(|i| nb[i].saturating_sub(na[i])),
        };
        Stalls {
            gaps,
            phases,
            stall_ns: b.loop_gap_ns.saturating_sub(a.loop_gap_ns),
            stall_1ms_ns: b.loop_gap_1ms_ns.saturating_sub(a.loop_gap_1ms_ns),
            max_lo_ns: lo,
            max_hi_ns: hi,
            window_ns,
        }
    }

    /// Both together (two sides of a point, or several lanes): counts and times add, the
    /// maximum is the larger.
    pub fn combine(&self, o: &Stalls) -> Stalls {
        Stalls {
            gaps: std::array::from_fn(|i| self.gaps[i] + o.gaps[i]),
            stall_ns: self.stall_ns + o.stall_ns,
            stall_1ms_ns: self.stall_1ms_ns + o.stall_1ms_ns,
            max_lo_ns: self.max_lo_ns.max(o.max_lo_ns),
            max_hi_ns: self.max_hi_ns.max(o.max_hi_ns),
            window_ns: self.window_ns.zip(o.window_ns).map(|(a, b)| a.max(b)),
            phases: self.phases.combine(&o.phases),
        }
    }

    /// The window's longest gap when known exactly (ns).
    pub fn max_ns(&self) -> Option<u64> {
        (self.max_lo_ns == self.max_hi_ns).then_some(self.max_lo_ns)
    }

    /// Whether a gap of at least `ns` happened: `None` when the buckets cannot tell.
    pub fn had_gap_of(&self, ns: u64) -> Option<bool> {
        if self.max_lo_ns >= ns {
            Some(true)
        } else if self.max_hi_ns < ns {
            Some(false)
        } else {
            None
        }
    }

    /// `"loop_stalls"` of a run's JSON.
    pub fn to_json(self) -> Value {
        let mut v = json!({
            "scope": if self.window_ns.is_some() { "window" } else { "run" },
            "window_s": self.window_ns.map(|n| n as f64 / 1e9),
            "stall_us": self.stall_ns as f64 / 1e3,
            "stall_1ms_us": self.stall_1ms_ns as f64 / 1e3,
            "max_us": self.max_ns().map(|n| n as f64 / 1e3),
            "max_at_least_us": self.max_lo_ns as f64 / 1e3,
            "max_at_most_us": (self.max_hi_ns != u64::MAX).then(|| self.max_hi_ns as f64 / 1e3),
        });
        for (n, c) in NAMES.iter().zip(self.gaps) {
            v[*n] = json!(c);
        }
        if let Some(p) = self.phases.to_json() {
            v["phases"] = p;
        }
        v
    }

    /// Back from [`Stalls::to_json`] (None when `v` is not one: another backend).
    pub fn from_json(v: &Value) -> Option<Stalls> {
        let ns = |k: &str| v[k].as_f64().map(|us| (us * 1e3).round() as u64);
        let mut gaps = [0; 5];
        for (g, n) in gaps.iter_mut().zip(NAMES) {
            *g = v[n].as_u64()?;
        }
        Some(Stalls {
            gaps,
            stall_ns: ns("stall_us")?,
            stall_1ms_ns: ns("stall_1ms_us")?,
            max_lo_ns: ns("max_at_least_us")?,
            max_hi_ns: ns("max_at_most_us").unwrap_or(u64::MAX),
            window_ns: v["window_s"].as_f64().map(|s| (s * 1e9).round() as u64),
            phases: Phases::from_json(&v["phases"]),
        })
    }

    /// `2 gaps >= 1 ms (4.1 ms in them), max 2.3 ms` for the text reports.
    pub fn describe(&self) -> String {
        let max = match self.max_ns() {
            Some(n) => format!("max {}", ms_or_us(n)),
            None if self.max_hi_ns == u64::MAX => format!("max >= {}", ms_or_us(self.max_lo_ns)),
            None => format!(
                "max {}-{}",
                ms_or_us(self.max_lo_ns),
                ms_or_us(self.max_hi_ns)
            ),
        };
        format!(
            "{} gaps >= 100 us, {} >= 1 ms ({} in them), {max}",
            self.gaps[0],
            self.gaps[2],
            ms_or_us(self.stall_1ms_ns)
        )
    }
}

fn ms_or_us(ns: u64) -> String {
    if ns >= 1_000_000 {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else {
        format!("{:.0} us", ns as f64 / 1e3)
    }
}

/// A run's stalls per side from its JSON: (server, client with its lanes combined).
pub fn of_run(r: &Value) -> (Option<Stalls>, Option<Stalls>) {
    let server = Stalls::from_json(&r["server"]["extra"]["loop_stalls"]);
    let client = r["client_extra"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| Stalls::from_json(&e["loop_stalls"]))
        .reduce(|a, b| a.combine(&b));
    (server, client)
}

/// `loop stalls (measured window): server ...; client ...` (None for other backends).
pub fn line(r: &Value) -> Option<String> {
    let (s, c) = of_run(r);
    if s.is_none() && c.is_none() {
        return None;
    }
    let scope = if s.iter().chain(c.iter()).all(|x| x.window_ns.is_some()) {
        "measured window"
    } else {
        "whole run"
    };
    let side = |x: Option<Stalls>| x.map_or("-".to_string(), |x| x.describe());
    Some(format!(
        "loop stalls ({scope}): server {}; client {}",
        side(s),
        side(c)
    ))
}

/// `iterations that received and sent: server rx ..., client ...` when the run's cores
/// timed their phases (knb built with feature `phases`), else None.
pub fn phases_line(r: &Value) -> Option<String> {
    let (s, c) = of_run(r);
    let side = |x: Option<Stalls>| x.and_then(|x| x.phases.describe());
    let (s, c) = (side(s), side(c));
    if s.is_none() && c.is_none() {
        return None;
    }
    let dash = || "-".to_string();
    Some(format!(
        "iterations that received and sent (phases): server {}; client {}",
        s.unwrap_or_else(dash),
        c.unwrap_or_else(dash)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(gaps: &[u64]) -> r2c::CoreStats {
        let mut s = r2c::CoreStats::default();
        for &g in gaps {
            // The same buckets as r2c's record_loop_gap (not public).
            s.loop_gaps_100us += 1;
            s.loop_gaps_500us += u64::from(g >= 500_000);
            s.loop_gaps_1ms += u64::from(g >= 1_000_000);
            s.loop_gaps_2ms += u64::from(g >= 2_000_000);
            s.loop_gaps_5ms += u64::from(g >= 5_000_000);
            s.loop_gap_ns += g;
            if g >= 1_000_000 {
                s.loop_gap_1ms_ns += g;
            }
            s.loop_gap_max_ns = s.loop_gap_max_ns.max(g);
        }
        s
    }

    #[test]
    fn a_window_is_the_difference_and_its_maximum_a_range_unless_it_grew() {
        // Before the window: a 3 ms gap. In it: 600 us and 1.5 ms.
        let a = reading(&[3_000_000]);
        let b = reading(&[3_000_000, 600_000, 1_500_000]);
        let w = Stalls::between(&a, &b, Some(1_000_000_000));
        assert_eq!(w.gaps, [2, 2, 1, 0, 0]);
        assert_eq!((w.stall_ns, w.stall_1ms_ns), (2_100_000, 1_500_000));
        // Between the 1 ms and the 2 ms threshold: not exact.
        assert_eq!((w.max_lo_ns, w.max_hi_ns), (1_000_000, 1_999_999));
        assert_eq!(w.max_ns(), None);
        assert_eq!(w.had_gap_of(500_000), Some(true));
        assert_eq!(w.had_gap_of(2_500_000), Some(false));
        assert_eq!(w.had_gap_of(1_200_000), None);
        // A new maximum inside the window is exact.
        let c = reading(&[3_000_000, 600_000, 4_000_000]);
        assert_eq!(
            Stalls::between(&a, &c, Some(1_000_000_000)).max_ns(),
            Some(4_000_000)
        );
        // No gap in the window: under 100 us whatever came before.
        let q = Stalls::between(&a, &a, Some(1_000_000_000));
        assert_eq!(q.had_gap_of(100_000), Some(false));
        assert_eq!(q.gaps, [0; 5]);
        // Since start: exact.
        let run = Stalls::between(&r2c::CoreStats::default(), &b, None);
        assert_eq!(run.max_ns(), Some(3_000_000));
    }

    #[test]
    fn json_round_trips_and_sides_combine() {
        let a = reading(&[200_000]);
        let b = reading(&[200_000, 7_000_000]);
        let w = Stalls::between(&a, &b, Some(1_000_000_000));
        assert_eq!(Stalls::from_json(&w.to_json()), Some(w));
        let open = Stalls::between(
            &reading(&[9_000_000]),
            &reading(&[9_000_000, 6_000_000]),
            Some(1_000_000_000),
        );
        // Over the top bucket and under the earlier maximum.
        assert_eq!((open.max_lo_ns, open.max_hi_ns), (5_000_000, 9_000_000));
        assert_eq!(Stalls::from_json(&open.to_json()), Some(open));
        let both = w.combine(&open);
        assert_eq!(both.gaps[2], 2);
        assert_eq!(both.max_lo_ns, 7_000_000);
        let r = json!({"server": {"extra": {"loop_stalls": w.to_json()}},
            "client_extra": [{"loop_stalls": open.to_json()}, {"loop_stalls": w.to_json()}]});
        let (s, c) = of_run(&r);
        assert_eq!(s, Some(w));
        assert_eq!(c.unwrap().gaps[0], 2);
        assert!(line(&r)
            .unwrap()
            .starts_with("loop stalls (measured window): server 1 gaps"));
        assert_eq!(line(&json!({"server": {"extra": {}}})), None);
        assert_eq!(Stalls::from_json(&Value::Null), None);
    }

    /// Phase times over a window are differences of the cumulative counters, reported as
    /// means per iteration, and survive the JSON round trip of the run's report; lanes
    /// combine by adding. Without phase counters (the default build) nothing is printed.
    #[test]
    fn phases_are_window_means_and_only_reported_when_timed() {
        let mut a = r2c::CoreStats {
            phase_iterations: 10,
            phase_rx_ns: 10_000,
            ..Default::default()
        };
        let mut b = a;
        b.phase_iterations += 4;
        b.phase_rx_ns += 4 * 800;
        b.phase_input_ns += 4 * 250;
        b.phase_app_ns += 4 * 300;
        b.phase_output_ns += 4 * 150;
        b.phase_tx_ns += 4 * 700;
        let w = Stalls::between(&a, &b, Some(1_000_000_000));
        assert_eq!(w.phases.iterations, 4);
        assert_eq!(w.phases.means(), Some([800.0, 250.0, 300.0, 150.0, 700.0]));
        let back = Stalls::from_json(&w.to_json()).expect("round trip");
        assert_eq!(back.phases, w.phases);
        let both = w.combine(&w);
        assert_eq!(both.phases.iterations, 8);
        assert_eq!(both.phases.means(), w.phases.means());
        let r = json!({"server": {"extra": {"loop_stalls": w.to_json()}},
            "client_extra": [{"loop_stalls": w.to_json()}]});
        let line = phases_line(&r).expect("timed");
        assert!(line.contains("server rx 800, input 250, app 300, output 150, tx 700 ns (sum 2200) over 4 iterations"), "{line}");
        // Untimed: no phases in the JSON, no line.
        a.phase_iterations = 0;
        let untimed = Stalls::between(&a, &a, None);
        assert!(untimed.to_json().get("phases").is_none());
        let r = json!({"server": {"extra": {"loop_stalls": untimed.to_json()}}});
        assert_eq!(phases_line(&r), None);
    }
}
