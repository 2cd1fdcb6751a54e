//! Minimal SVG line charts (no plotting crate): axes, ticks, one polyline with markers
//! per series, a legend. Linear or log axes.

use std::fmt::Write;

/// One line.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (x, y) points, drawn in x order.
    pub points: Vec<(f64, f64)>,
    /// x values of points measured in a contended round (`crate::contention`): drawn
    /// hollow and larger, and the chart says what hollow means.
    pub flagged: Vec<f64>,
}

/// A chart.
#[derive(Debug, Clone, Default)]
pub struct Chart {
    /// Title.
    pub title: String,
    /// Under the title (command, machine notes).
    pub subtitle: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Log scale on x.
    pub log_x: bool,
    /// Log scale on y.
    pub log_y: bool,
    /// Fixed x ticks (value, label); default: computed.
    pub x_ticks: Option<Vec<(f64, String)>>,
    /// y axis starts at 0 (linear y only).
    pub y_from_zero: bool,
    /// The lines.
    pub series: Vec<Series>,
}

const W: f64 = 720.0;
const H: f64 = 440.0;
const L: f64 = 80.0;
const R: f64 = 170.0;
const T: f64 = 60.0;
const B: f64 = 60.0;
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Short number label: 1.5k, 2M, 0.25.
pub fn label(v: f64) -> String {
    let a = v.abs();
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if a >= 1e6 {
        trim(format!("{:.2}", v / 1e6)) + "M"
    } else if a >= 1e3 {
        trim(format!("{:.2}", v / 1e3)) + "k"
    } else if a >= 1.0 || a == 0.0 {
        trim(format!("{v:.2}"))
    } else {
        trim(format!("{v:.3}"))
    }
}

/// "Nice" linear ticks covering [lo, hi].
fn lin_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(1e-12);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 6.0)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).floor() * step;
    let mut v = Vec::new();
    while t <= hi + step * 1e-9 {
        v.push(t);
        t += step;
    }
    v
}

fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut v = Vec::new();
    let mut t = 10f64.powf(lo.log10().floor());
    while t <= hi * 1.0001 {
        for m in [1.0, 2.0, 5.0] {
            let x = t * m;
            if x >= lo * 0.9999 && x <= hi * 1.0001 {
                v.push(x);
            }
        }
        t *= 10.0;
    }
    v
}

struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
    a: f64,
    b: f64,
}

impl Scale {
    fn new(lo: f64, hi: f64, log: bool, a: f64, b: f64) -> Scale {
        let (lo, hi) = if log {
            (lo.log10(), hi.log10())
        } else {
            (lo, hi)
        };
        let (lo, hi) = if hi - lo < 1e-12 {
            (lo - 0.5, hi + 0.5)
        } else {
            (lo, hi)
        };
        Scale { lo, hi, log, a, b }
    }
    fn map(&self, v: f64) -> f64 {
        let v = if self.log { v.log10() } else { v };
        self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a)
    }
}

/// Renders `c` as a standalone SVG document.
pub fn render(c: &Chart) -> String {
    let pts: Vec<(f64, f64)> = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|(x, y)| {
            x.is_finite() && y.is_finite() && (!c.log_x || *x > 0.0) && (!c.log_y || *y > 0.0)
        })
        .collect();
    let mut out = String::new();
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="{W}" height="{H}" fill="white"/>
<text x="{}" y="22" font-size="16" text-anchor="middle">{}</text>
<text x="{}" y="40" font-size="11" fill="#555" text-anchor="middle">{}</text>
"##,
        W / 2.0,
        esc(&c.title),
        W / 2.0,
        esc(&c.subtitle)
    );
    if pts.is_empty() {
        let _ = write!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">no data</text></svg>"#,
            W / 2.0,
            H / 2.0
        );
        return out;
    }
    let fold = |f: fn(f64, f64) -> f64, init: f64, g: fn(&(f64, f64)) -> f64| {
        pts.iter().map(g).fold(init, f)
    };
    let (xlo, xhi) = (
        fold(f64::min, f64::INFINITY, |p| p.0),
        fold(f64::max, f64::NEG_INFINITY, |p| p.0),
    );
    let (mut ylo, mut yhi) = (
        fold(f64::min, f64::INFINITY, |p| p.1),
        fold(f64::max, f64::NEG_INFINITY, |p| p.1),
    );
    if !c.log_y {
        if c.y_from_zero {
            ylo = ylo.min(0.0);
        }
        yhi += (yhi - ylo).abs() * 0.05;
    }
    let yt = if c.log_y {
        log_ticks(ylo, yhi)
    } else {
        lin_ticks(ylo, yhi)
    };
    if !c.log_y {
        ylo = ylo.min(yt[0]);
        yhi = yhi.max(*yt.last().unwrap_or(&yhi));
    }
    let xs = Scale::new(xlo, xhi, c.log_x, L, W - R);
    let ys = Scale::new(ylo, yhi, c.log_y, H - B, T);
    // Frame and grid.
    let _ = writeln!(
        out,
        r##"<rect x="{L}" y="{T}" width="{}" height="{}" fill="none" stroke="#333"/>"##,
        W - L - R,
        H - T - B
    );
    for v in yt.iter().filter(|v| **v >= ylo && **v <= yhi) {
        let y = ys.map(*v);
        let _ = writeln!(
            out,
            r##"<line x1="{L}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - R,
            L - 6.0,
            y + 4.0,
            label(*v)
        );
    }
    let xt: Vec<(f64, String)> = match &c.x_ticks {
        Some(t) => t.clone(),
        None if c.log_x => log_ticks(xlo, xhi)
            .into_iter()
            .map(|v| (v, label(v)))
            .collect(),
        None => lin_ticks(xlo, xhi)
            .into_iter()
            .filter(|v| *v >= xlo && *v <= xhi)
            .map(|v| (v, label(v)))
            .collect(),
    };
    for (v, l) in &xt {
        let x = xs.map(*v);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{T}" y2="{}" stroke="#eee"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
            H - B,
            H - B + 16.0,
            esc(l)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>
<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">{}</text>"#,
        (L + W - R) / 2.0,
        H - 18.0,
        esc(&c.x_label),
        (T + H - B) / 2.0,
        (T + H - B) / 2.0,
        esc(&c.y_label)
    );
    for (i, s) in c.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut p: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|(x, y)| {
                x.is_finite() && y.is_finite() && (!c.log_x || *x > 0.0) && (!c.log_y || *y > 0.0)
            })
            .collect();
        p.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = p
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", xs.map(*x), ys.map(*y)))
            .collect();
        if path.len() > 1 {
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
                path.join(" ")
            );
        }
        for ((px, _), xy) in p.iter().zip(&path) {
            let (x, y) = xy.split_once(',').unwrap_or(("0", "0"));
            if s.flagged.contains(px) {
                let _ = writeln!(
                    out,
                    r#"<circle cx="{x}" cy="{y}" r="5" fill="white" stroke="{color}" stroke-width="2" class="contended"/>"#
                );
            } else {
                let _ = writeln!(out, r#"<circle cx="{x}" cy="{y}" r="3" fill="{color}"/>"#);
            }
        }
        let ly = T + 10.0 + i as f64 * 20.0;
        let _ = writeln!(
            out,
            r#"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            W - R + 12.0,
            W - R + 36.0,
            W - R + 42.0,
            ly + 4.0,
            esc(&s.name)
        );
    }
    if c.series.iter().any(|s| !s.flagged.is_empty()) {
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" font-size="11">hollow: contended (a poller starved of CPU, or host steal)</text>"#,
            L,
            H - 4.0
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_series_points_and_legend() {
        let c = Chart {
            title: "t <1>".into(),
            x_label: "size".into(),
            y_label: "RPC/s".into(),
            log_x: true,
            series: vec![
                Series {
                    name: "kernel".into(),
                    points: vec![(64.0, 10.0), (4096.0, 5.0), (65536.0, 1.0)],
                    ..Default::default()
                },
                Series {
                    name: "smoltcp".into(),
                    points: vec![(64.0, 20.0), (f64::NAN, 1.0)],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let s = render(&c);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(
            s.matches("<polyline").count(),
            1,
            "one-point series has no line"
        );
        assert_eq!(s.matches("<circle").count(), 4, "NaN points are skipped");
        assert!(s.contains("t &lt;1&gt;") && s.contains(">kernel<") && s.contains(">smoltcp<"));
        assert!(!s.contains("contended"));
    }

    #[test]
    fn contended_points_are_hollow_and_explained() {
        let c = Chart {
            series: vec![Series {
                name: "luna".into(),
                points: vec![(1.0, 10.0), (2.0, 5.0), (4.0, 12.0)],
                flagged: vec![2.0],
            }],
            ..Default::default()
        };
        let s = render(&c);
        assert_eq!(s.matches(r#"class="contended""#).count(), 1, "{s}");
        assert_eq!(s.matches(r#"r="3""#).count(), 2, "{s}");
        assert!(s.contains("hollow: contended"), "{s}");
    }

    #[test]
    fn empty_chart_says_so() {
        assert!(render(&Chart::default()).contains("no data"));
    }

    #[test]
    fn ticks_are_nice() {
        assert_eq!(lin_ticks(0.0, 10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(
            log_ticks(1.0, 100.0),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(label(1500.0), "1.5k");
        assert_eq!(label(2_000_000.0), "2M");
        assert_eq!(label(0.25), "0.25");
    }
}
