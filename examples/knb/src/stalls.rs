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
        Stalls {
            gaps,
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
}
