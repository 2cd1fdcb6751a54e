//! An HTTP/2 server (cleartext, prior knowledge: `h2c`) on luna over the tap topology,
//! in r2c's message mode: the I/O core runs TCP and each connection's HTTP/2 session
//! (msgsched::proto::h2), the workers answer requests under the CP / CS / MS model.
//!
//! Routes: `/` a static text, `/echo` the request body back (zero copy: the reply's
//! DATA frames are slices of the request's), `/big` a static 64 KiB body, anything else
//! 404.
//!
//! ```sh
//! testbed up tap
//! cargo run -p r2c --example luna-h2 -- --model ms --workers 4 &
//! ip netns exec luna-tap nghttp -nv http://198.18.0.2:8080/
//! ip netns exec luna-tap h2load -n 1000 -c 4 -m 10 http://198.18.0.2:8080/
//! ```
//!
//! The process re-executes itself inside the tap topology's namespace (DPDK's tap
//! interface is created where the process runs), waits for the port and configures the
//! kernel side. It stops when `--stop-file` appears or after `--secs` (0: never), and
//! prints `OK key=value...` with the HTTP/2 and message counters.

use clap::Parser as _;
use msgsched::proto::h2::{H2Config, H2Counters, H2Session, Request, Response};
use msgsched::proto::Session;
use msgsched::sched::Model;
use msgsched::socket::Message;
use r2c::msg::{MsgCtx, MsgHandler};
use r2c::{Conn, Runtime};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use zbuf::{IoVec, Zbuf};

#[derive(clap::Parser, Debug, Clone)]
#[command(about = "HTTP/2 server on luna (tap topology, message mode)")]
struct Args {
    /// Testbed prefix of the tap topology (`testbed up tap --prefix P`).
    #[arg(long, default_value = "luna")]
    prefix: String,
    /// Scheduling model: cp, cs or ms.
    #[arg(long, default_value = "ms")]
    model: Model,
    /// Worker threads.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// TCP port.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Stop after this many seconds (0: run until --stop-file appears).
    #[arg(long, default_value_t = 0)]
    secs: u64,
    /// Stop when this file exists.
    #[arg(long)]
    stop_file: Option<PathBuf>,
    /// Write this file once the server listens (for scripts and tests).
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Keep this file holding the current `OK key=value...` counters line (rewritten
    /// atomically every 250 ms while serving), so a benchmark can diff them per phase.
    #[arg(long)]
    stats_file: Option<PathBuf>,
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    #[arg(long, default_value_t = 100)]
    max_streams: u32,
    /// Flood budget (see msgsched::proto::h2::session).
    #[arg(long, default_value_t = 1000)]
    flood_budget: u32,
    #[command(flatten)]
    timeouts: tap::TimeoutArgs,
    #[command(flatten)]
    service: service::ServiceArgs,
}

struct App {
    hello: Zbuf,
    big: Zbuf,
    /// Requests served, per worker (to show one connection's streams spread over them).
    served: Arc<Vec<AtomicU64>>,
    /// Per connection, the set of workers that served it (bit i: worker i).
    spread: Arc<Mutex<HashMap<Conn, u64>>>,
    /// Emulated service time (`--service`).
    service: service::Service,
}

impl MsgHandler for App {
    fn on_message(&mut self, ctx: &mut MsgCtx<'_>, m: Message<Conn>) {
        let Ok(req) = Request::parse(&m.body) else {
            // Dropping the origin resets the stream (counted).
            return;
        };
        self.service.occupy();
        let resp = match req.path() {
            b"/" => Response::new(200)
                .header("content-type", "text/plain")
                .body(IoVec::from(self.hello.clone())),
            b"/echo" => Response::new(200).body(req.body),
            b"/big" => Response::new(200).body(IoVec::from(self.big.clone())),
            _ => Response::new(404),
        };
        self.served[ctx.worker()].fetch_add(1, Ordering::Relaxed);
        if let Ok(mut s) = self.spread.lock() {
            *s.entry(m.origin.conn()).or_default() |= 1 << (ctx.worker() % 64);
        }
        ctx.reply(m.origin, resp.into_iovec());
    }
}

#[path = "common/tap.rs"]
mod tap;

#[path = "common/service.rs"]
mod service;

fn main() {
    let args = Args::parse();
    let what = format!(
        "HTTP/2 on port {}, model {:?}, {} workers",
        args.port, args.model, args.workers
    );
    let port = tap::enter("luna-h2", &args.prefix, args.ready_file.as_deref(), &what);
    serve(&args, &port);
}

fn serve(args: &Args, port: &testbed::DpdkPort) {
    let mut p = tap::open("luna-h2", port);
    let opts = tap::options(&p.slab);
    let mcfg = tap::msg_config(args.port, args.model, args.workers);
    let counters = Arc::new(H2Counters::default());
    let h2cfg = H2Config {
        max_concurrent_streams: args.max_streams,
        flood_budget: args.flood_budget,
        counters: Arc::clone(&counters),
        ..H2Config::default()
    };
    let hello = Zbuf::copy_from_slice(b"hello from luna over HTTP/2\n");
    let big = Zbuf::from_vec((0..64 << 10).map(|i| (i % 251) as u8).collect());
    let served: Arc<Vec<AtomicU64>> =
        Arc::new((0..args.workers).map(|_| AtomicU64::new(0)).collect());
    let served2 = Arc::clone(&served);
    let spread: Arc<Mutex<HashMap<Conn, u64>>> = Arc::default();
    let spread2 = Arc::clone(&spread);
    let svc = args.service.clone();
    let (rt, workers) = Runtime::spawn_msg_session_with_timeouts(
        p.core.take().expect("opened"),
        opts,
        mcfg,
        args.timeouts.timeouts(),
        move || Box::new(H2Session::new(h2cfg.clone())) as Box<dyn Session>,
        move |w| App {
            hello: hello.clone(),
            big: big.clone(),
            served: Arc::clone(&served2),
            spread: Arc::clone(&spread2),
            service: svc.for_worker(w),
        },
    )
    .unwrap_or_else(|e| tap::die("luna-h2", &format!("runtime: {e}")));
    let core = rt.stats_reader(0);
    // The I/O core's own progress (poll iterations, frames, retransmissions): a stalled
    // core shows as iterations not advancing between two reads.
    let line = || {
        let mut l = report(&counters, &workers, &served, &spread);
        if let Some(c) = &core {
            let c = c.read();
            l.push_str(&format!(
                " core_iterations={} core_rx_frames={} core_tx_frames={} core_retransmits={} \
                 core_stack_drops={} core_rx_missed={}",
                c.iterations, c.rx_frames, c.tx_frames, c.retransmits, c.stack_drops, c.rx_missed
            ));
        }
        l
    };
    // By the clock, not every n-th tick (`service::sleep_for` says why).
    let mut written = std::time::Instant::now();
    tap::run_until_stopped_with(rt, args.stop_file.as_ref(), args.secs, || {
        if let Some(f) = &args.stats_file {
            if written.elapsed() >= std::time::Duration::from_millis(250) {
                tap::write_stats(f, &line());
                written = std::time::Instant::now();
            }
        }
    });
    let line = line();
    if let Some(f) = &args.stats_file {
        tap::write_stats(f, &line);
    }
    println!("{line}");
}

/// The `OK key=value...` line: the HTTP/2 counters (non-zero ones, `h2_` prefix), the
/// message counters, requests per worker and the most workers one connection used.
fn report(
    counters: &H2Counters,
    workers: &r2c::msg::MsgWorkers,
    served: &[AtomicU64],
    spread: &Mutex<HashMap<Conn, u64>>,
) -> String {
    let mut line = String::from("OK");
    for (k, v) in counters.fields() {
        if v != 0 {
            line.push_str(&format!(" h2_{k}={v}"));
        }
    }
    for (k, v) in workers.counters().fields() {
        line.push_str(&format!(" {k}={v}"));
    }
    for (w, n) in served.iter().enumerate() {
        line.push_str(&format!(" served_w{w}={}", n.load(Ordering::Relaxed)));
    }
    let most = spread
        .lock()
        .map(|s| s.values().map(|m| m.count_ones()).max().unwrap_or(0))
        .unwrap_or(0);
    line.push_str(&format!(" max_workers_per_conn={most}"));
    line
}
