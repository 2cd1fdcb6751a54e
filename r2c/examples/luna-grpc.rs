//! A gRPC unary server (h2c, prior knowledge) on luna over the tap topology, in r2c's
//! message mode: the I/O core runs TCP and each connection's HTTP/2 session, workers
//! run the calls under the CP / CS / MS model. Messages are raw bytes (no protobuf):
//!
//! - `/luna.Echo/Echo`: the request message back (zero copy);
//! - `/luna.Kv/Put`: `key \0 value`, an empty reply; no `\0` is INVALID_ARGUMENT;
//! - `/luna.Kv/Get`: `key`, the value, or NOT_FOUND;
//! - anything else: UNIMPLEMENTED; not gRPC at all: HTTP 415.
//!
//! ```sh
//! testbed up tap
//! cargo run -p r2c --example luna-grpc -- --model ms --workers 4 &
//! ip netns exec luna-tap /usr/bin/python3 -c "import grpc; \
//!   c = grpc.insecure_channel('198.18.0.2:50051'); \
//!   print(c.unary_unary('/luna.Echo/Echo')(b'hi', timeout=5))"
//! ```

use clap::Parser as _;
use msgsched::proto::grpc::{self, Code, Status};
use msgsched::proto::h2::{H2Config, H2Counters, H2Session, Request};
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

#[path = "common/tap.rs"]
mod tap;

#[path = "common/service.rs"]
mod service;

#[derive(clap::Parser, Debug, Clone)]
#[command(about = "gRPC unary server on luna (tap topology, message mode)")]
struct Args {
    /// Testbed prefix of the tap topology.
    #[arg(long, default_value = "luna")]
    prefix: String,
    /// Scheduling model: cp, cs or ms.
    #[arg(long, default_value = "ms")]
    model: Model,
    /// Worker threads.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// TCP port.
    #[arg(long, default_value_t = 50051)]
    port: u16,
    /// Stop after this many seconds (0: run until --stop-file appears).
    #[arg(long, default_value_t = 0)]
    secs: u64,
    /// Stop when this file exists.
    #[arg(long)]
    stop_file: Option<PathBuf>,
    /// Write this file once the server listens.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    #[command(flatten)]
    timeouts: tap::TimeoutArgs,
    #[command(flatten)]
    service: service::ServiceArgs,
}

/// Largest request message.
const MAX_MESSAGE: usize = 256 << 10;

#[derive(Default)]
struct Stats {
    ok: AtomicU64,
    /// Calls whose request arrived gzip-compressed.
    gzip: AtomicU64,
    errors: [AtomicU64; 17],
}

struct App {
    kv: Arc<Mutex<HashMap<Vec<u8>, Zbuf>>>,
    stats: Arc<Stats>,
    /// Emulated service time (`--service`).
    service: service::Service,
}

impl App {
    fn call(&self, method: &[u8], msg: IoVec) -> Result<IoVec, Status> {
        match method {
            b"/luna.Echo/Echo" => Ok(msg),
            b"/luna.Kv/Put" => {
                let bytes = msg.to_vec();
                let Some(at) = bytes.iter().position(|&b| b == 0) else {
                    return Err(Status::new(
                        Code::InvalidArgument,
                        "put: no \\0 after the key",
                    ));
                };
                let value = Zbuf::from_vec(bytes[at + 1..].to_vec());
                let mut kv = self
                    .kv
                    .lock()
                    .map_err(|_| Status::new(Code::Internal, "kv"))?;
                kv.insert(bytes[..at].to_vec(), value);
                Ok(IoVec::new())
            }
            b"/luna.Kv/Get" => {
                let key = msg.to_vec();
                let kv = self
                    .kv
                    .lock()
                    .map_err(|_| Status::new(Code::Internal, "kv"))?;
                kv.get(&key)
                    .map(|v| IoVec::from(v.clone()))
                    .ok_or_else(|| Status::new(Code::NotFound, "no such key"))
            }
            _ => Err(Status::new(Code::Unimplemented, "unknown method")),
        }
    }
}

impl MsgHandler for App {
    fn on_message(&mut self, ctx: &mut MsgCtx<'_>, m: Message<Conn>) {
        let Ok(req) = Request::parse(&m.body) else {
            return;
        };
        self.service.occupy();
        let resp = match grpc::unary(&req, MAX_MESSAGE) {
            Ok(call) => {
                if call.compressed {
                    self.stats.gzip.fetch_add(1, Ordering::Relaxed);
                }
                match self.call(&call.method, call.message) {
                    Ok(reply) => {
                        self.stats.ok.fetch_add(1, Ordering::Relaxed);
                        grpc::reply(reply)
                    }
                    Err(s) => {
                        self.stats.errors[s.code as usize].fetch_add(1, Ordering::Relaxed);
                        grpc::error(&s)
                    }
                }
            }
            Err(r) => {
                if let grpc::Refusal::Status(s) = &r {
                    self.stats.errors[s.code as usize].fetch_add(1, Ordering::Relaxed);
                }
                r.response()
            }
        };
        ctx.reply(m.origin, resp.into_iovec());
    }
}

fn main() {
    let args = Args::parse();
    let what = format!(
        "gRPC on port {}, model {:?}, {} workers",
        args.port, args.model, args.workers
    );
    let port = tap::enter("luna-grpc", &args.prefix, args.ready_file.as_deref(), &what);
    let mut p = tap::open("luna-grpc", &port);
    let opts = tap::options(&p.slab);
    let mcfg = tap::msg_config(args.port, args.model, args.workers);
    let counters = Arc::new(H2Counters::default());
    let mut h2cfg = H2Config {
        counters: Arc::clone(&counters),
        ..H2Config::default()
    };
    // A call over the message limit is answered RESOURCE_EXHAUSTED by the session, as
    // its DATA pass the limit (not REFUSED_STREAM past a 1 MiB body, as before).
    grpc::limit_messages(&mut h2cfg, MAX_MESSAGE);
    let kv: Arc<Mutex<HashMap<Vec<u8>, Zbuf>>> = Arc::default();
    let stats = Arc::new(Stats::default());
    let st2 = Arc::clone(&stats);
    let svc = args.service.clone();
    let (rt, workers) = Runtime::spawn_msg_session_with_timeouts(
        p.core.take().expect("opened"),
        opts,
        mcfg,
        args.timeouts.timeouts(),
        move || Box::new(H2Session::new(h2cfg.clone())) as Box<dyn Session>,
        move |w| App {
            kv: Arc::clone(&kv),
            stats: Arc::clone(&st2),
            service: svc.for_worker(w),
        },
    )
    .unwrap_or_else(|e| tap::die("luna-grpc", &format!("runtime: {e}")));
    tap::run_until_stopped(rt, args.stop_file.as_ref(), args.secs);
    let mut line = format!(
        "OK grpc_ok={} grpc_gzip={}",
        stats.ok.load(Ordering::Relaxed),
        stats.gzip.load(Ordering::Relaxed)
    );
    for (code, n) in stats.errors.iter().enumerate() {
        let n = n.load(Ordering::Relaxed);
        if n > 0 {
            line.push_str(&format!(" grpc_status_{code}={n}"));
        }
    }
    for (k, v) in counters.fields() {
        if v != 0 {
            line.push_str(&format!(" h2_{k}={v}"));
        }
    }
    for (k, v) in workers.counters().fields() {
        line.push_str(&format!(" {k}={v}"));
    }
    println!("{line}");
}
