//! A small SVG line-plot writer (the house style of docs/*.svg): title, subtitle, framed plot
//! area, grid lines with tick labels, linear x axis, linear or log10 y axis, legend on the right.

use std::fmt::Write as _;

const W: f64 = 720.0;
const H: f64 = 440.0;
const X0: f64 = 80.0;
const X1: f64 = 550.0;
const Y0: f64 = 60.0;
const Y1: f64 = 380.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

/// One line of a plot.
#[derive(Clone, Debug, Default)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// `(x, y)` points in x order; non-finite points (and `y <= 0` on a log axis) are skipped.
    pub points: Vec<(f64, f64)>,
    /// Draw dashed (e.g. a second connection count of the same model).
    pub dashed: bool,
    /// Colour index into the palette (`None`: the series' position).
    pub color: Option<usize>,
}

/// A line plot.
#[derive(Clone, Debug, Default)]
pub struct Plot {
    /// Title, top centre.
    pub title: String,
    /// Smaller grey line under the title (how the data was produced).
    pub subtitle: String,
    /// X-axis label.
    pub x_label: String,
    /// Y-axis label.
    pub y_label: String,
    /// Log10 y axis.
    pub log_y: bool,
    /// X range (`None`: the data's).
    pub x_range: Option<(f64, f64)>,
    /// Y range (`None`: the data's, widened to whole decades on a log axis).
    pub y_range: Option<(f64, f64)>,
    /// Horizontal reference lines: `(y, label)`, drawn grey and dashed.
    pub hlines: Vec<(f64, String)>,
    /// The lines.
    pub series: Vec<Series>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Short tick label: 0.25, 5, 100, 2k, 1e+06.
fn label(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-3..1e6).contains(&a) {
        return format!("{v:e}");
    }
    if a >= 1e4 && (v / 1e3).fract() == 0.0 {
        return format!("{}k", v / 1e3);
    }
    let s = format!("{v:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

/// "Nice" linear ticks (steps of 1, 2 or 5 × 10^k), about 4 to 8 of them, inside [lo, hi].
fn linear_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(f64::MIN_POSITIVE);
    let raw = span / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 7.0)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 && out.len() < 50 {
        out.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    out
}

/// Log ticks: every decade, plus 2 and 5 when there are at most three decades.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    let mults: &[f64] = if b - a <= 3 { &[1.0, 2.0, 5.0] } else { &[1.0] };
    let mut out = Vec::new();
    for e in a..=b {
        for m in mults {
            let v = m * 10f64.powi(e);
            if v >= lo * (1.0 - 1e-9) && v <= hi * (1.0 + 1e-9) {
                out.push(v);
            }
        }
    }
    out
}

impl Plot {
    fn visible(&self, y: f64) -> bool {
        y.is_finite() && (!self.log_y || y > 0.0)
    }

    /// Renders the plot as a standalone SVG document.
    pub fn render(&self) -> String {
        let pts = || {
            self.series
                .iter()
                .flat_map(|s| s.points.iter())
                .filter(|(x, y)| x.is_finite() && self.visible(*y))
        };
        let (mut xlo, mut xhi) = self.x_range.unwrap_or_else(|| {
            pts().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
                (a.min(p.0), b.max(p.0))
            })
        });
        if !(xlo.is_finite() && xhi.is_finite()) {
            (xlo, xhi) = (0.0, 1.0);
        }
        if xhi <= xlo {
            xhi = xlo + 1.0;
        }
        let (mut ylo, mut yhi) = self.y_range.unwrap_or_else(|| {
            let (a, b) = pts()
                .map(|p| p.1)
                .chain(self.hlines.iter().map(|h| h.0).filter(|&y| self.visible(y)))
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| {
                    (a.min(y), b.max(y))
                });
            if self.log_y {
                (10f64.powf(a.log10().floor()), 10f64.powf(b.log10().ceil()))
            } else {
                (a.min(0.0), b + 0.05 * (b - a.min(0.0)))
            }
        });
        if !(ylo.is_finite() && yhi.is_finite()) || (self.log_y && ylo <= 0.0) {
            (ylo, yhi) = if self.log_y { (1.0, 10.0) } else { (0.0, 1.0) };
        }
        if yhi <= ylo {
            yhi = if self.log_y { ylo * 10.0 } else { ylo + 1.0 };
        }
        let sx = |x: f64| X0 + (x - xlo) / (xhi - xlo) * (X1 - X0);
        let sy = |y: f64| {
            let f = if self.log_y {
                (y.log10() - ylo.log10()) / (yhi.log10() - ylo.log10())
            } else {
                (y - ylo) / (yhi - ylo)
            };
            Y1 - f.clamp(-0.02, 1.02) * (Y1 - Y0)
        };

        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="360" y="22" font-size="16" text-anchor="middle">{}</text>"#,
            esc(&self.title)
        );
        if !self.subtitle.is_empty() {
            let _ = writeln!(
                s,
                r##"<text x="360" y="40" font-size="11" fill="#555" text-anchor="middle">{}</text>"##,
                esc(&self.subtitle)
            );
        }
        let _ = writeln!(
            s,
            r##"<rect x="{X0}" y="{Y0}" width="{}" height="{}" fill="none" stroke="#333"/>"##,
            X1 - X0,
            Y1 - Y0
        );
        let yt = if self.log_y {
            log_ticks(ylo, yhi)
        } else {
            linear_ticks(ylo, yhi)
        };
        for y in yt {
            let py = sy(y);
            let _ = writeln!(
                s,
                r##"<line x1="{X0}" x2="{X1}" y1="{py:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                X0 - 6.0,
                py + 4.0,
                label(y)
            );
        }
        for x in linear_ticks(xlo, xhi) {
            let px = sx(x);
            let _ = writeln!(
                s,
                r##"<line x1="{px:.1}" x2="{px:.1}" y1="{Y0}" y2="{Y1}" stroke="#eee"/><text x="{px:.1}" y="{}" text-anchor="middle">{}</text>"##,
                Y1 + 16.0,
                label(x)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            (X0 + X1) / 2.0,
            H - 18.0,
            esc(&self.x_label)
        );
        let _ = writeln!(
            s,
            r#"<text x="18" y="{0}" text-anchor="middle" transform="rotate(-90 18 {0})">{1}</text>"#,
            (Y0 + Y1) / 2.0,
            esc(&self.y_label)
        );
        for (y, name) in &self.hlines {
            if !self.visible(*y) {
                continue;
            }
            let py = sy(*y);
            let _ = writeln!(
                s,
                r##"<line x1="{X0}" x2="{X1}" y1="{py:.1}" y2="{py:.1}" stroke="#888" stroke-dasharray="2,3"/><text x="{}" y="{:.1}" font-size="10" fill="#555" text-anchor="end">{}</text>"##,
                X1 - 4.0,
                py - 3.0,
                esc(name)
            );
        }
        let mut legend_y = Y0 + 10.0;
        for (i, se) in self.series.iter().enumerate() {
            let color = COLORS[se.color.unwrap_or(i) % COLORS.len()];
            let dash = if se.dashed {
                r#" stroke-dasharray="6,4""#
            } else {
                ""
            };
            let visible: Vec<(f64, f64)> = se
                .points
                .iter()
                .copied()
                .filter(|&(x, y)| x.is_finite() && self.visible(y) && x >= xlo && x <= xhi)
                .collect();
            let coords: Vec<String> = visible
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
                coords.join(" ")
            );
            if visible.len() <= 30 {
                for &(x, y) in &visible {
                    let _ = writeln!(
                        s,
                        r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#,
                        sx(x),
                        sy(y)
                    );
                }
            }
            let _ = writeln!(
                s,
                r#"<line x1="{}" x2="{}" y1="{legend_y}" y2="{legend_y}" stroke="{color}" stroke-width="3"{dash}/><text x="{}" y="{}">{}</text>"#,
                X1 + 12.0,
                X1 + 36.0,
                X1 + 42.0,
                legend_y + 4.0,
                esc(&se.name)
            );
            legend_y += 20.0;
        }
        s.push_str("</svg>\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_and_labels() {
        assert_eq!(linear_ticks(0.0, 1.0).len(), 6); // 0, 0.2, ..., 1
        assert_eq!(
            log_ticks(1.0, 1000.0),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]
        );
        assert_eq!(label(0.25), "0.25");
        assert_eq!(label(20000.0), "20k");
        assert_eq!(label(5.0), "5");
    }

    #[test]
    fn renders_every_series_and_escapes() {
        let p = Plot {
            title: "a < b".into(),
            log_y: true,
            series: vec![
                Series {
                    name: "MS".into(),
                    points: vec![(0.1, 1.0), (0.5, 10.0), (0.9, f64::NAN)],
                    ..Default::default()
                },
                Series {
                    name: "CS".into(),
                    points: vec![(0.1, 2.0), (0.5, 0.0)],
                    dashed: true,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let svg = p.render();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("a &lt; b"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(!svg.contains("NaN"));
    }
}
