//! luna-kv's server process: luna on a testbed DPDK port (net_tap in the tap topology)
//! in r2c message mode, memcached parsers on the I/O core, the store's handler on the
//! workers.

use super::kv::{Kv, KvCounters, Store};
use super::service::{Service, ServiceArgs};
use dpdk_sys::Eal;
use luna_stack::stack::StackConfig;
use luna_stack::wire::Ipv4Cidr;
use msgsched::framer::FramerConfig;
use msgsched::proto::memcached::{kind, MsgKind};
use msgsched::proto::memcached::{Limits, McParser};
use msgsched::sched::{Model, SchedConfig};
use msgsched::socket::Message;
use r2c::device::dpdk::{from_testbed, DpdkDevice};
use r2c::device::Device;
use r2c::msg::MsgConfig;
use r2c::msg::{MsgCtx, MsgHandler};
use r2c::Conn;
use r2c::{CoreOptions, CoreSetup, IdleStrategy, Runtime};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testbed::DpdkPort;
use zbuf::dpdk::DmaRegistry;
use zbuf::{Slab, SlabConfig};

/// What to serve.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// CP / CS / MS.
    pub model: Model,
    /// Worker threads.
    pub workers: usize,
    /// TCP port.
    pub port: u16,
    /// Store memory limit.
    pub memory_mb: usize,
    /// Largest message (a value up to about this size can be stored).
    pub max_message: usize,
    /// Requests of one connection at workers at once.
    pub max_in_flight: usize,
    /// Stop after this long at the latest.
    pub limit: Duration,
    /// Emulated service time per request (`--service`), none by default.
    pub service: Option<ServiceArgs>,
    /// Keep this file holding the current counters (`key=value...`, rewritten
    /// atomically every 250 ms while serving), for benchmarks that diff them per phase.
    pub stats_file: Option<PathBuf>,
}

/// The store's handler behind an emulated service time (not for swallowed chunks).
struct Served {
    kv: Kv,
    service: Service,
}

impl MsgHandler for Served {
    fn on_message(&mut self, ctx: &mut MsgCtx<'_>, m: Message<Conn>) {
        if kind(m.origin.stream()) != MsgKind::Swallow {
            self.service.occupy();
        }
        self.kv.on_message(ctx, m);
    }
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            model: Model::Ms,
            workers: 4,
            port: 11211,
            memory_mb: 64,
            // memcached's default item size limit (1 MiB) plus a command line.
            max_message: (1 << 20) + 4096,
            max_in_flight: 64,
            limit: Duration::from_secs(3600),
            service: None,
            stats_file: None,
        }
    }
}

/// Serves on `port` until `stop` exists (or `cfg.limit`); `ready` is written once the
/// port is open. Returns a `key=value` report of the counters.
pub fn serve(port: &DpdkPort, cfg: &ServeConfig, ready: &Path, stop: &Path) -> String {
    let (args, dcfg) = from_testbed(port).expect("testbed port");
    let eal = Eal::init(args).unwrap_or_else(|e| panic!("EAL: {e}"));
    let registry = DmaRegistry::new(&eal);
    let slab =
        Slab::new(registry.slab_config(SlabConfig::new().max_memory(96 << 20))).expect("slab");
    let dev =
        DpdkDevice::open(&eal, &slab, &registry, &dcfg).unwrap_or_else(|e| panic!("open: {e}"));
    let mut sc = StackConfig::new(
        dev.mac(),
        Ipv4Cidr::new(port.ip, port.prefix_len).expect("cidr"),
    );
    sc.mtu = dev.mtu();
    sc.caps = dev.caps();
    let core = CoreSetup::new(0, vec![dev], sc);
    let _ = std::fs::remove_file(stop);
    std::fs::write(ready, b"open").expect("ready file");
    let opts = CoreOptions {
        idle: IdleStrategy::Yield,
        pin: false,
        slab: Some(slab.clone()),
        ..CoreOptions::default()
    };
    let mcfg = MsgConfig {
        listen: vec![(cfg.port, 1024)],
        sched: SchedConfig {
            model: cfg.model,
            workers: cfg.workers,
            queue_capacity: 256,
            seed: 11211,
        },
        framer: FramerConfig {
            max_message: cfg.max_message,
            max_in_flight: cfg.max_in_flight,
            ..FramerConfig::default()
        },
        worker_cpus: Vec::new(),
    };
    let store = Arc::new(Store::new(cfg.memory_mb << 20));
    let counters = Arc::new(KvCounters::default());
    let (st, kc) = (Arc::clone(&store), Arc::clone(&counters));
    let svc = cfg.service.clone();
    let (rt, workers) = Runtime::spawn_msg(
        core,
        opts,
        mcfg,
        || McParser::new(Limits::default()),
        move |w| Served {
            kv: Kv::new(Arc::clone(&st), Arc::clone(&kc)),
            service: match &svc {
                Some(a) => a.for_worker(w),
                None => Service::new(None, super::service::Mode::Spin, w),
            },
        },
    )
    .expect("message-mode runtime");
    let end = Instant::now() + cfg.limit;
    let mut hwm = 0;
    let mut store_hwm = 0;
    let live = |hwm: usize, store_hwm: usize| {
        let mut line = format!(
            "zbuf_objects_hwm={hwm} store_bytes_hwm={store_hwm} items={} text={} binary={} \
             errors={} swallowed={}",
            store.items(),
            counters.text.load(Ordering::Relaxed),
            counters.binary.load(Ordering::Relaxed),
            counters.errors.load(Ordering::Relaxed),
            counters.swallowed.load(Ordering::Relaxed),
        );
        for (k, v) in workers.counters().fields() {
            line += &format!(" {k}={v}");
        }
        // The I/O core's own progress: a stalled core shows as iterations standing still.
        if let Some(c) = rt.stats().first() {
            line += &format!(
                " core_iterations={} core_rx_frames={} core_tx_frames={} core_retransmits={} \
                 core_stack_drops={} core_rx_missed={}",
                c.iterations, c.rx_frames, c.tx_frames, c.retransmits, c.stack_drops, c.rx_missed
            );
        }
        line
    };
    // The stats file is rewritten by the clock, not every n-th sleep, and the sleep is one
    // that signals cannot stretch (`sleep_for`): on net_tap every received frame raises a
    // signal that lands on this thread (docs/reliability.md, "The stats file").
    let mut written = Instant::now();
    while !stop.exists() && Instant::now() < end && !rt.is_finished() {
        hwm = hwm.max(slab.leak_report().objects_in_use);
        store_hwm = store_hwm.max(store.bytes());
        super::service::sleep_for(Duration::from_millis(20));
        if let Some(f) = cfg.stats_file.as_deref() {
            if written.elapsed() >= STATS_EVERY {
                write_stats(f, &live(hwm, store_hwm));
                written = Instant::now();
            }
        }
    }
    if let Some(f) = cfg.stats_file.as_deref() {
        write_stats(f, &live(hwm, store_hwm));
    }
    let panicked = u64::from(rt.is_finished());
    rt.stop();
    let reports = rt.join().expect("runtime");
    let mut line = format!(
        "panicked={panicked} zbuf_objects_hwm={hwm} store_bytes_hwm={store_hwm} items={} \
         text={} binary={} errors={} swallowed={}",
        store.items(),
        counters.text.load(Ordering::Relaxed),
        counters.binary.load(Ordering::Relaxed),
        counters.errors.load(Ordering::Relaxed),
        counters.swallowed.load(Ordering::Relaxed),
    );
    for (k, v) in workers.counters().fields() {
        line += &format!(" {k}={v}");
    }
    line += &format!(" rsts_sent={}", reports[0].stack.rsts_sent);
    // The server side of "was a tail a loss?": luna's retransmissions and RTO expiries
    // (over every connection, closed ones included) and the device's drops.
    let (tcp, dev) = (&reports[0].tcp, &reports[0].device);
    line += &format!(
        " tcp_retransmits={} tcp_rtos={} dev_tx_dropped={} dev_rx_missed={}",
        tcp.retransmits, tcp.rtos, dev.tx_dropped, dev.rx_missed
    );
    drop(reports);
    line
}

/// How often the stats file is rewritten.
const STATS_EVERY: Duration = Duration::from_millis(240);

/// Writes `line` to `path` atomically (a temporary file renamed over it), so a reader
/// polling it sees a whole line.
fn write_stats(path: &Path, line: &str) {
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, format!("{line}\n")).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}
