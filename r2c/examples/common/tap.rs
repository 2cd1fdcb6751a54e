//! What the tap-topology server examples share: running inside the topology's
//! namespace, opening the DPDK port, and the bounded run loop.

use dpdk_sys::Eal;
use luna_stack::stack::StackConfig;
use luna_stack::wire::Ipv4Cidr;
use msgsched::framer::FramerConfig;
use msgsched::sched::Model;
use msgsched::sched::SchedConfig;
use r2c::device::dpdk::{from_testbed, DpdkDevice};
use r2c::device::Device;
use r2c::msg::{MsgConfig, MsgTimeouts};
use r2c::{CoreOptions, CoreSetup, IdleStrategy, Runtime};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use testbed::{DpdkPort, Kind, Prefix};
use zbuf::dpdk::DmaRegistry;
use zbuf::{Slab, SlabConfig};

const IN_NS: &str = "LUNA_EXAMPLE_IN_NETNS";

pub fn die(name: &str, m: &str) -> ! {
    eprintln!("{name}: {m}");
    std::process::exit(2);
}

/// In the parent (as started by the user): re-executes this program inside the tap
/// topology's namespace (DPDK creates the tap interface where it runs), waits for its
/// port, configures the kernel side, writes `ready_file`, waits for the child and exits
/// with its status. In the child: returns the DPDK port.
pub fn enter(name: &str, prefix: &str, ready_file: Option<&Path>, what: &str) -> DpdkPort {
    let p = Prefix::new(prefix).unwrap_or_else(|e| die(name, &format!("prefix: {e}")));
    let Some(testbed::Details::Tap(tap)) = testbed::read_state(Kind::Tap, &p) else {
        die(
            name,
            &format!("no tap topology with prefix {prefix}: run `testbed up tap --prefix {prefix}` first"),
        );
    };
    if std::env::var_os(IN_NS).is_some() {
        return tap.dpdk;
    }
    let ready = std::env::temp_dir().join(format!("{name}-{}-open", std::process::id()));
    let _ = std::fs::remove_file(&ready);
    let exe = std::env::current_exe().unwrap_or_else(|e| die(name, &format!("exe: {e}")));
    let mut cmd = testbed::netns_command(&tap.dpdk.netns, exe);
    cmd.args(std::env::args_os().skip(1)).env(IN_NS, &ready);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| die(name, &format!("spawn: {e}")));
    let end = Instant::now() + Duration::from_secs(60);
    while !ready.exists() {
        if Instant::now() > end || child.try_wait().ok().flatten().is_some() {
            let _ = child.kill();
            die(name, "the server did not open its port");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    tap.configure_host(Duration::from_secs(30))
        .unwrap_or_else(|e| die(name, &format!("tap host side: {e}")));
    let _ = std::fs::remove_file(&ready);
    eprintln!("{name}: listening on {} ({what})", tap.dpdk.ip);
    if let Some(f) = ready_file {
        let _ = std::fs::write(f, b"ready");
    }
    let st = child
        .wait()
        .unwrap_or_else(|e| die(name, &format!("wait: {e}")));
    std::process::exit(st.code().unwrap_or(1));
}

/// The opened port: keep it alive while the runtime runs.
pub struct Port {
    pub _eal: Eal,
    pub _registry: DmaRegistry,
    pub slab: Slab,
    pub core: Option<CoreSetup<DpdkDevice>>,
}

/// Opens the DPDK port (in the child) and tells the parent.
pub fn open(name: &str, port: &DpdkPort) -> Port {
    let mut port = port.clone();
    port.eal.memory_mb = 128;
    let (eal_args, cfg) = from_testbed(&port).unwrap_or_else(|e| die(name, &format!("port: {e}")));
    let eal = Eal::init(eal_args).unwrap_or_else(|e| die(name, &format!("EAL: {e}")));
    let registry = DmaRegistry::new(&eal);
    let slab = Slab::new(registry.slab_config(SlabConfig::new().max_memory(96 << 20)))
        .unwrap_or_else(|e| die(name, &format!("slab: {e}")));
    let dev = DpdkDevice::open(&eal, &slab, &registry, &cfg)
        .unwrap_or_else(|e| die(name, &format!("open: {e}")));
    let cidr = Ipv4Cidr::new(port.ip, port.prefix_len)
        .unwrap_or_else(|e| die(name, &format!("address: {e}")));
    let mut sc = StackConfig::new(dev.mac(), cidr);
    sc.mtu = dev.mtu();
    sc.caps = dev.caps();
    if let Some(ready) = std::env::var_os(IN_NS) {
        let _ = std::fs::write(ready, b"open");
    }
    Port {
        _eal: eal,
        _registry: registry,
        slab,
        core: Some(CoreSetup::new(0, vec![dev], sc)),
    }
}

/// Shared CPUs: no pinning, yield when idle.
/// The HTTP/2 examples' message-mode configuration: one listening port (backlog 1024),
/// `workers` under `model`, messages up to 1 MiB, 64 in flight per connection.
pub fn msg_config(port: u16, model: Model, workers: usize) -> MsgConfig {
    MsgConfig {
        listen: vec![(port, 1024)],
        sched: SchedConfig {
            model,
            workers,
            queue_capacity: 256,
            seed: 1,
        },
        framer: FramerConfig {
            max_message: 1 << 20,
            max_in_flight: 64,
            ..FramerConfig::default()
        },
        worker_cpus: Vec::new(),
    }
}

/// Message mode's timers from the command line (seconds, 0: off). Defaults: nginx's
/// (keepalive_timeout 75 s, send_timeout 60 s).
#[derive(clap::Args, Debug, Clone)]
pub struct TimeoutArgs {
    /// End a connection idle this long (seconds; 0: never).
    #[arg(long, default_value_t = 75)]
    pub idle_timeout: u64,
    /// End a connection whose owed output made no progress this long (seconds; 0: never).
    #[arg(long, default_value_t = 60)]
    pub send_timeout: u64,
}

impl TimeoutArgs {
    pub fn timeouts(&self) -> MsgTimeouts {
        let t = |s: u64| (s > 0).then(|| Duration::from_secs(s));
        MsgTimeouts {
            idle: t(self.idle_timeout),
            send: t(self.send_timeout),
        }
    }
}

pub fn options(slab: &Slab) -> CoreOptions {
    CoreOptions {
        idle: IdleStrategy::Yield,
        pin: false,
        slab: Some(slab.clone()),
        ..CoreOptions::default()
    }
}

/// Runs until `stop_file` exists or `secs` pass (0: no time limit), then stops `rt`.
#[allow(dead_code)] // luna-h2 uses the `_with` form
pub fn run_until_stopped(rt: Runtime, stop_file: Option<&PathBuf>, secs: u64) {
    run_until_stopped_with(rt, stop_file, secs, || {})
}

/// [`run_until_stopped`], calling `tick` every 50 ms while it runs (live statistics).
pub fn run_until_stopped_with(
    rt: Runtime,
    stop_file: Option<&PathBuf>,
    secs: u64,
    mut tick: impl FnMut(),
) {
    let start = Instant::now();
    loop {
        super::service::sleep_for(Duration::from_millis(50));
        tick();
        if stop_file.is_some_and(|f| f.exists())
            || (secs > 0 && start.elapsed() > Duration::from_secs(secs))
            || rt.is_finished()
        {
            break;
        }
    }
    rt.stop();
    let _ = rt.join();
}

/// Writes `line` to `path` atomically (a temporary file renamed over it), so a reader
/// polling the file sees either the previous line or this one, never half of one.
#[allow(dead_code)] // only the servers with --stats-file
pub fn write_stats(path: &Path, line: &str) {
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, format!("{line}\n")).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}
