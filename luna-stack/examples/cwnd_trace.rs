//! Congestion-window traces: a bulk transfer between two luna stacks over a simulated
//! bottleneck (rate-limited link) with a deterministic loss pattern, once with NewReno and
//! once with Cubic. Records (virtual time, cwnd, ssthresh) from `Connection::cwnd()` /
//! `ssthresh()` after every simulation step and writes a CSV and an SVG chart.
//!
//! ```text
//! cargo run -p luna-stack --release --example cwnd_trace -- [--secs 10] [--out-dir docs]
//! ```
//! writes `<out-dir>/cwnd-newreno-cubic.csv` and `<out-dir>/cwnd-newreno-cubic.svg`.

use luna_stack::tcp::config::CcAlgorithm;
use luna_stack::tcp::TcpConfig;
use luna_stack::testutil::{LinkConfig, LunaHost, Segment, Sim, SimLink, IP_A, IP_B, MAC_A, MAC_B};
use luna_stack::time::{Duration, Instant};
use std::fmt::Write as _;
use std::net::SocketAddrV4;
use zbuf::Zbuf;

/// Bottleneck: 100 Mbit/s, 5 ms one way (RTT 10 ms, BDP 125 kB), 256 kB drop-tail queue.
const RATE: u64 = 12_500_000;
const DELAY: Duration = Duration::from_millis(5);
const QUEUE: usize = 256 * 1024;
/// Deterministic loss: every `LOSS_EVERY`-th new data segment from the sender is dropped.
const LOSS_EVERY: u64 = 3000;

struct Sample {
    t: Instant,
    cwnd: u32,
    ssthresh: u32,
}

fn trace(cc: CcAlgorithm, secs: u64) -> (Vec<Sample>, String) {
    let tcp = TcpConfig {
        cc,
        rcv_buf: 4 << 20,
        snd_buf: 4 << 20,
        ..TcpConfig::default()
    };
    let mut link = SimLink::new(
        LinkConfig {
            rate: Some(RATE),
            queue_limit: Some(QUEUE),
            ..LinkConfig::clean(DELAY)
        },
        1,
    );
    link.set_trace_len(0);
    // Drop every LOSS_EVERY-th first transmission of A's data (by highest sequence seen).
    let mut high: Option<luna_stack::tcp::SeqNum> = None;
    let mut new_segs = 0u64;
    link.set_drop_rule(Box::new(move |_, dir, frame, _| {
        if dir != luna_stack::testutil::Dir::AtoB {
            return false;
        }
        let Some(s) = Segment::parse(frame) else {
            return false;
        };
        if s.payload.is_empty() {
            return false;
        }
        let end = s.end();
        if high.is_some_and(|h| !end.gt(h)) {
            return false; // a retransmission
        }
        high = Some(end);
        new_segs += 1;
        new_segs % LOSS_EVERY == 0
    }));
    let mut sim = Sim::new(
        LunaHost::new(MAC_A, IP_A, tcp.clone(), 1),
        LunaHost::new(MAC_B, IP_B, tcp, 2),
        link,
    );
    let l = sim.b.stack.listen(80, 4).expect("listen");
    let c = sim
        .a
        .stack
        .connect(sim.now, SocketAddrV4::new(IP_B, 80), None)
        .expect("connect");
    let chunk = Zbuf::from_vec(vec![0x5a; 256 * 1024]);
    let end = Instant::ZERO + Duration::from_secs(secs);
    let mut server = None;
    let mut samples: Vec<Sample> = Vec::new();
    let mut received = 0u64;
    while sim.now < end {
        while sim.a.stack.send_capacity(c) >= chunk.len() {
            sim.a.stack.send(c, &chunk).expect("send");
        }
        while sim.a.stack.poll_event().is_some() {}
        while sim.b.stack.poll_event().is_some() {}
        if server.is_none() {
            server = sim.b.stack.accept(l);
        }
        if let Some(s) = server {
            while let Ok(Some(z)) = sim.b.stack.recv(s) {
                received += z.len() as u64;
            }
        }
        if let Some(conn) = sim.a.stack.connection(c) {
            let (cwnd, ssthresh) = (conn.cwnd(), conn.ssthresh());
            // Every reduction and ssthresh change is kept; growth is sampled once per
            // millisecond so the CSV stays small (Cubic changes cwnd on every ACK).
            let keep = samples.last().is_none_or(|p| {
                p.ssthresh != ssthresh
                    || cwnd < p.cwnd
                    || (cwnd != p.cwnd && sim.now - p.t >= Duration::from_millis(1))
            });
            if keep {
                samples.push(Sample {
                    t: sim.now,
                    cwnd,
                    ssthresh,
                });
            }
        }
        if !sim.step_until(end) {
            break;
        }
    }
    let tc = sim.a.stack.tcp_counters();
    let stats = sim.link.stats();
    let summary = format!(
        "{cc:?}: {:.1} Mbit/s goodput, {} data frames dropped (loss pattern + drop-tail \
         queue), {} fast retransmits, {} RTOs, {} samples",
        received as f64 * 8.0 / secs as f64 / 1e6,
        stats.lost[0],
        tc.fast_retransmits,
        tc.rtos,
        samples.len()
    );
    (samples, summary)
}

/// One panel: cwnd (solid) and ssthresh (dashed) against time.
#[allow(clippy::too_many_arguments)]
fn panel(
    svg: &mut String,
    title: &str,
    samples: &[Sample],
    x0: f64,
    y0: f64,
    w: f64,
    h: f64,
    secs: f64,
    ymax_kb: f64,
) {
    let px = |t: Instant| x0 + t.as_nanos() as f64 / 1e9 / secs * w;
    let py = |bytes: u32| y0 + h - (f64::from(bytes) / 1024.0).min(ymax_kb) / ymax_kb * h;
    let _ = writeln!(
        svg,
        r#"<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" font-size="14" text-anchor="middle">{title}</text>"#,
        x0 + w / 2.0,
        y0 - 8.0
    );
    // Axes: ticks every second-ish and every quarter of the y range.
    let xstep = (secs / 10.0).ceil().max(1.0);
    let mut x = 0.0;
    while x <= secs + 1e-9 {
        let gx = x0 + x / secs * w;
        let _ = writeln!(
            svg,
            r##"<line x1="{gx}" y1="{}" x2="{gx}" y2="{}" stroke="#ddd"/><text x="{gx}" y="{}" font-size="11" text-anchor="middle">{x}</text>"##,
            y0,
            y0 + h,
            y0 + h + 14.0
        );
        x += xstep;
    }
    for i in 0..=4 {
        let v = ymax_kb * f64::from(i) / 4.0;
        let gy = y0 + h - h * f64::from(i) / 4.0;
        let _ = writeln!(
            svg,
            r##"<line x1="{x0}" y1="{gy}" x2="{}" y2="{gy}" stroke="#ddd"/><text x="{}" y="{}" font-size="11" text-anchor="end">{v:.0}</text>"##,
            x0 + w,
            x0 - 4.0,
            gy + 4.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">virtual time (s)</text>"#,
        x0 + w / 2.0,
        y0 + h + 30.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" font-size="12" text-anchor="middle" transform="rotate(-90 {} {})">KiB</text>"#,
        x0 - 40.0,
        y0 + h / 2.0,
        x0 - 40.0,
        y0 + h / 2.0
    );
    // Step-shaped polylines, thinned to at most one point per horizontal pixel.
    for (get, style) in [
        (
            (|s: &Sample| s.cwnd) as fn(&Sample) -> u32,
            r##"stroke="#1f77b4" stroke-width="1.5""##,
        ),
        (
            |s: &Sample| s.ssthresh,
            r##"stroke="#d62728" stroke-width="1" stroke-dasharray="5,3""##,
        ),
    ] {
        let mut pts = String::new();
        let mut last_x = f64::NEG_INFINITY;
        let mut prev_y: Option<f64> = None;
        for s in samples {
            let (x, y) = (px(s.t), py(get(s)));
            if let Some(py_) = prev_y {
                if x - last_x < 0.5 && (y - py_).abs() < 0.5 {
                    continue;
                }
                let _ = write!(pts, "{x:.1},{py_:.1} ");
            }
            let _ = write!(pts, "{x:.1},{y:.1} ");
            last_x = x;
            prev_y = Some(y);
        }
        if let Some(y) = prev_y {
            let _ = write!(pts, "{:.1},{y:.1}", x0 + w);
        }
        let _ = writeln!(svg, r#"<polyline fill="none" {style} points="{pts}"/>"#);
    }
}

fn main() {
    let mut secs = 10u64;
    let mut out_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs").to_string();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--secs" => {
                secs = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&s| s > 0)
                    .unwrap_or_else(|| fail("--secs needs a positive integer"))
            }
            "--out-dir" => {
                out_dir = args
                    .next()
                    .unwrap_or_else(|| fail("--out-dir needs a directory"))
            }
            _ => fail(&format!("unknown argument {a}")),
        }
    }
    let runs = [CcAlgorithm::NewReno, CcAlgorithm::Cubic].map(|cc| (cc, trace(cc, secs)));
    let mut csv = String::from("algorithm,time_s,cwnd_bytes,ssthresh_bytes\n");
    for (cc, (samples, summary)) in &runs {
        println!("{summary}");
        for s in samples {
            let _ = writeln!(
                csv,
                "{cc:?},{:.6},{},{}",
                s.t.as_nanos() as f64 / 1e9,
                s.cwnd,
                s.ssthresh
            );
        }
    }
    // A common y scale: a little above the largest cwnd seen.
    let max_cwnd = runs
        .iter()
        .flat_map(|(_, (s, _))| s.iter().map(|p| p.cwnd))
        .max()
        .unwrap_or(1);
    let ymax_kb = ((f64::from(max_cwnd) / 1024.0 * 1.1) / 100.0).ceil() * 100.0;
    let (w, h) = (900.0, 260.0);
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="1000" height="{}" font-family="sans-serif">
<rect width="100%" height="100%" fill="white"/>
<text x="500" y="22" font-size="15" text-anchor="middle">luna cwnd (solid) and ssthresh (dashed): 100 Mbit/s, RTT 10 ms, 256 KiB queue, 1 in {LOSS_EVERY} segments lost</text>
"#,
        2.0 * h + 150.0
    );
    for (i, (cc, (samples, _))) in runs.iter().enumerate() {
        let y0 = 55.0 + i as f64 * (h + 70.0);
        panel(
            &mut svg,
            &format!("{cc:?}"),
            samples,
            70.0,
            y0,
            w,
            h,
            secs as f64,
            ymax_kb,
        );
    }
    svg.push_str("</svg>\n");
    let csv_path = format!("{out_dir}/cwnd-newreno-cubic.csv");
    let svg_path = format!("{out_dir}/cwnd-newreno-cubic.svg");
    std::fs::write(&csv_path, csv).unwrap_or_else(|e| fail(&format!("{csv_path}: {e}")));
    std::fs::write(&svg_path, svg).unwrap_or_else(|e| fail(&format!("{svg_path}: {e}")));
    println!("wrote {csv_path} and {svg_path}");
}

fn fail(msg: &str) -> ! {
    eprintln!("cwnd_trace: {msg}");
    std::process::exit(2);
}
