//! The runtime's configuration: a TOML file plus command-line overrides. Every bad value
//! gives one [`ConfigError`] naming the key, what is wrong and how to fix it.
//!
//! ```toml
//! eal = ["--no-pci", "--in-memory", "--file-prefix=app1"]
//!
//! [device]
//! kind = "dpdk"              # "dpdk" (needs `port`) or "mem" (in-memory, tests)
//! port = "net_memif0"
//! steering = "auto"          # with [traffic]: auto | hardware | software (rte_flow rules)
//! tx_copy_max = 2048         # frames up to this size sent as one flat copy; 0 = never
//!                            # (default: the device chooses, DpdkDeviceConfig::tx_copy_max)
//!
//! [cores]
//! list = [0, 1]              # CPUs, one r2c thread each
//! queues_per_core = 1
//!
//! [net]
//! ip = "198.18.0.1"
//! prefix_len = 24
//! mac = "02:00:00:00:00:01"  # default: the device's
//! gateway = "198.18.0.254"
//! mtu = 1500
//! routes = [{ dest = "198.19.0.0/16", via = "198.18.0.254" }]
//! neighbours = [{ ip = "198.18.0.2", mac = "02:00:00:00:00:02" }]
//!
//! [tcp]
//! mss = 1460
//! rcv_buf = 1048576
//! rcv_mem_total = 8388608    # receive memory (truesize) all of a core's connections may hold
//!                            # together, bytes, at least 65536 (MIN_RCV_MEM_TOTAL); default:
//!                            # half of the core's receive pools (Device::rx_mem_budget)
//! rcv_mem_min = 98304        # what a connection whose application reads may hold out of the
//!                            # top third of rcv_mem_total, kept for such connections (Linux's
//!                            # tcp_rmem[0]); 0 = no floor, no reserve; default 96 KiB
//! snd_buf = 1048576
//! cc = "newreno"             # or "cubic"
//! delayed_ack_us = 0         # 0 = ack every segment
//! rto_min_us = 5000
//! rto_max_us = 1000000
//! send_burst = 16            # segments per send decision (software segmentation); 1 = off
//! tlp_us = 10000             # tail loss probes (RFC 8985 §7) and their least timeout (the default); 0 = off
//! tlp_ack_delay_us = 40000    # the peer's ACK delay a one-segment probe timeout allows
//! rack = true                # RACK's reordering timer (RFC 8985 §6.2)
//!
//! [ports]
//! range = [61440, 65535]
//! app = "knb"                # which entry below is this process
//! apps = [{ name = "knb" }, { name = "other", ports = [61440, 62463], threads = 2 }]
//!
//! [runtime]
//! mode = "inline"            # inline | batch | split
//! idle = "busy"              # busy | yield | backoff
//! # backoff: sleep 2 µs doubling up to backoff_max_us (default 100) while idle, never
//! # past a timer; in split and message mode a worker's reply or command wakes the
//! # core at once (a doorbell: a fence and a load per reply while the core is busy;
//! # batch mode: threads feeding the application ring `Sockets::doorbell`).
//! backoff_max_us = 100
//! burst = 32                 # frames per receive burst
//! rx_split = 4               # a larger burst is handled in two halves; 0 = never
//!
//! # Kernel coexistence (docs/bifurcation.md). `[traffic]` is bifurcation's traffic
//! # model; it supersedes `[ports]` (only `ports.app` may remain, naming this process's
//! # entry) and is checked against the kernel's port settings (/proc) at load.
//! [traffic]
//! client_range = [61440, 65535]
//! listen_tcp = [7000]
//! apps = [{ name = "knb" }]    # default: one application named ports.app, one thread per core
//!
//! [exception]                  # the software exception path (crate docs: `exception`)
//! port = "net_tap1"            # DPDK port whose kernel netdev is the exception interface
//! iface = "luna-exc"           # that netdev's name (the kernel's view of the NIC)
//! mirror = false               # mirror the kernel's ARP/routes (netlink-sync); luna stops ARP
//! queue = 1024                 # bound of each direction's queue, frames
//!
//! [control]                    # the lunactl endpoint (crate docs: `control`); off without it
//! socket = "/run/luna/app.sock"
//! ```
//!
//! Overrides use dotted keys: `net.ip=198.18.0.2`, `cores.list=[2,3]`; values are TOML,
//! bare words are strings. [`CliOverrides`] maps friendly flags onto them.

use crate::clock::ClockSource;
use crate::core::{CoreOptions, CoreSetup, IdleStrategy};
use crate::device::steering::{SteeringMode, SteeringRequest};
use bifurcation::model::AppConfig;
use bifurcation::{
    AppSpec, KernelPorts, PartitionPlan, PortRange, Share, ThreadSlot, TrafficConfig, TrafficModel,
};
use core::fmt;
use core::net::Ipv4Addr;
use luna_stack::stack::{StackConfig, MIN_RCV_MEM_TOTAL};
use luna_stack::tables::{NextHop, Route};
use luna_stack::tcp::config::CcAlgorithm;
use luna_stack::tcp::TcpConfig;
use luna_stack::time::Duration;
use luna_stack::wire::{EthernetAddress, Ipv4Cidr};
use std::path::Path;
use toml::{Table, Value};

/// A configuration problem: the key, what is wrong, and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted key (`net.ip`), or `<file>` / `<toml>` for problems with the file itself.
    pub key: String,
    /// What is wrong.
    pub problem: String,
    /// How to fix it.
    pub fix: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "config `{}`: {}; fix: {}",
            self.key, self.problem, self.fix
        )
    }
}

impl std::error::Error for ConfigError {}

/// bifurcation's `ModelError` has the same shape.
fn model_err(e: bifurcation::ModelError) -> ConfigError {
    ConfigError {
        key: e.key,
        problem: e.problem,
        fix: e.fix,
    }
}

fn err(key: &str, problem: impl Into<String>, fix: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.to_string(),
        problem: problem.into(),
        fix: fix.into(),
    }
}

/// Where frames come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceKind {
    /// The in-memory link (tests).
    Mem,
    /// A DPDK ethdev port by name (`net_memif0`, `0000:3b:00.0`, ...).
    Dpdk {
        /// Port name.
        port: String,
    },
}

/// How applications run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunMode {
    /// Callbacks inside packet processing.
    #[default]
    Inline,
    /// Socket/epoll-like API once per iteration.
    Batch,
    /// I/O core + worker threads.
    Split,
}

/// Interface settings.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// Our address.
    pub ip: Ipv4Addr,
    /// On-link prefix length.
    pub prefix_len: u8,
    /// MAC override (default: the device's).
    pub mac: Option<EthernetAddress>,
    /// Default gateway.
    pub gateway: Option<Ipv4Addr>,
    /// IP MTU.
    pub mtu: u16,
    /// Extra routes.
    pub routes: Vec<Route>,
    /// Static neighbours.
    pub neighbours: Vec<(Ipv4Addr, EthernetAddress)>,
}

/// The client port model.
#[derive(Debug, Clone)]
pub struct PortsConfig {
    /// The reserved range.
    pub range: PortRange,
    /// This process's application name in `plan`.
    pub app: String,
    /// The partition of `range`.
    pub plan: PartitionPlan,
}

/// The `[exception]` section: the software exception path (see [`crate::exception`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExceptionSettings {
    /// DPDK port name of the exception port (e.g. `net_tap1`).
    pub port: String,
    /// The kernel netdev of that port (the exception interface).
    pub iface: String,
    /// Mirror the kernel's neighbours/routes with netlink-sync; luna stops doing ARP.
    pub mirror: bool,
    /// Bound of each direction's exception queue, in frames.
    pub queue: usize,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// EAL arguments.
    pub eal: Vec<String>,
    /// The device.
    pub device: DeviceKind,
    /// CPUs, one core thread each.
    pub cores: Vec<usize>,
    /// Device queues per core.
    pub queues_per_core: u16,
    /// Interface.
    pub net: NetConfig,
    /// TCP defaults.
    pub tcp: TcpConfig,
    /// `tcp.rcv_mem_total`: each core's stack-wide receive-memory bound
    /// (`StackConfig::rcv_mem_total`); `None`, the default, derives it from the core's
    /// receive pools (half of them, `Device::rx_mem_budget`).
    pub rcv_mem_total: Option<usize>,
    /// Ports.
    pub ports: PortsConfig,
    /// Run mode.
    pub mode: RunMode,
    /// Poll-loop options (no slab; add one in code).
    pub options: CoreOptions,
    /// Split mode: worker CPUs.
    pub workers: Vec<usize>,
    /// The traffic model from `[traffic]`, validated against the kernel (`None` without
    /// the section: luna owns the port).
    pub traffic: Option<TrafficModel>,
    /// The exception path from `[exception]`.
    pub exception: Option<ExceptionSettings>,
    /// `device.steering`: how a DPDK port steers the traffic model's flows (only with
    /// `[traffic]`; default `auto`: rte_flow rules when the PMD takes them, else
    /// software with one log line). See [`Config::steering_request`].
    pub steering: SteeringMode,
    /// `device.tx_copy_max`: frames up to this many bytes are transmitted as one flat
    /// copy instead of a zero-copy chain (0: never); `None`, the default, leaves it to the
    /// device ([`crate::device::dpdk::DpdkDeviceConfig::tx_copy_max`]).
    pub tx_copy_max: Option<usize>,
}

/// Consumes keys of one table; what is left over is unknown.
struct Walk {
    path: String,
    t: Table,
}

impl Walk {
    fn new(path: &str, t: Table) -> Self {
        Walk {
            path: path.to_string(),
            t,
        }
    }

    fn key(&self, k: &str) -> String {
        if self.path.is_empty() {
            k.to_string()
        } else {
            format!("{}.{k}", self.path)
        }
    }

    fn take(&mut self, k: &str) -> Option<(String, Value)> {
        self.t.remove(k).map(|v| (self.key(k), v))
    }

    fn table(&mut self, k: &str) -> Result<Option<Walk>, ConfigError> {
        match self.take(k) {
            None => Ok(None),
            Some((key, Value::Table(t))) => Ok(Some(Walk::new(&key, t))),
            Some((key, v)) => Err(err(
                &key,
                format!("expected a table, found {}", v.type_str()),
                format!("write it as a [{key}] section"),
            )),
        }
    }

    fn finish(self, known: &[&str]) -> Result<(), ConfigError> {
        if let Some(k) = self.t.keys().next() {
            return Err(err(
                &self.key(k),
                "unknown key",
                format!("remove it, or use one of: {}", known.join(", ")),
            ));
        }
        Ok(())
    }
}

fn int(key: &str, v: &Value, min: i64, max: i64) -> Result<i64, ConfigError> {
    match v {
        Value::Integer(i) if (min..=max).contains(i) => Ok(*i),
        Value::Integer(i) => Err(err(
            key,
            format!("{i} is out of range"),
            format!("use a value in {min}..={max}"),
        )),
        other => Err(err(
            key,
            format!("expected an integer, found {}", other.type_str()),
            format!("write a number in {min}..={max}"),
        )),
    }
}

fn string<'a>(key: &str, v: &'a Value, example: &str) -> Result<&'a str, ConfigError> {
    v.as_str().ok_or_else(|| {
        err(
            key,
            format!("expected a string, found {}", v.type_str()),
            format!("quote it, e.g. \"{example}\""),
        )
    })
}

fn boolean(key: &str, v: &Value) -> Result<bool, ConfigError> {
    v.as_bool().ok_or_else(|| {
        err(
            key,
            format!("expected true or false, found {}", v.type_str()),
            "write true or false",
        )
    })
}

fn ip(key: &str, v: &Value) -> Result<Ipv4Addr, ConfigError> {
    let s = string(key, v, "198.18.0.1")?;
    s.parse().map_err(|_| {
        err(
            key,
            format!("\"{s}\" is not an IPv4 address"),
            "write a dotted quad such as \"198.18.0.1\"",
        )
    })
}

fn mac(key: &str, v: &Value) -> Result<EthernetAddress, ConfigError> {
    let s = string(key, v, "02:00:00:00:00:01")?;
    let m: EthernetAddress = s.parse().map_err(|_| {
        err(
            key,
            format!("\"{s}\" is not a MAC address"),
            "write six hex bytes such as \"02:00:00:00:00:01\"",
        )
    })?;
    if !m.is_unicast() {
        return Err(err(
            key,
            format!("{s} is a multicast or broadcast address"),
            "use a unicast MAC (first byte even), e.g. \"02:00:00:00:00:01\"",
        ));
    }
    Ok(m)
}

fn array<'a>(key: &str, v: &'a Value, example: &str) -> Result<&'a Vec<Value>, ConfigError> {
    v.as_array().ok_or_else(|| {
        err(
            key,
            format!("expected an array, found {}", v.type_str()),
            format!("write an array, e.g. {example}"),
        )
    })
}

fn micros(key: &str, v: &Value, max: i64) -> Result<Duration, ConfigError> {
    Ok(Duration::from_micros(int(key, v, 0, max)? as u64))
}

/// CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    let mut ids: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    ids.sort_unstable();
    ids
}

fn cpu_list(key: &str, v: &Value) -> Result<Vec<usize>, ConfigError> {
    let allowed = allowed_cpus();
    let mut out = Vec::new();
    for (i, c) in array(key, v, "[0, 1]")?.iter().enumerate() {
        let k = format!("{key}[{i}]");
        let cpu = int(&k, c, 0, 4095)? as usize;
        if !allowed.is_empty() && !allowed.contains(&cpu) {
            return Err(err(
                &k,
                format!("CPU {cpu} is out of range: this process may use CPUs {allowed:?}"),
                "pick CPUs from that list (see `nproc` / taskset)",
            ));
        }
        if out.contains(&cpu) {
            return Err(err(
                &k,
                format!("CPU {cpu} is listed twice"),
                "list each CPU once",
            ));
        }
        out.push(cpu);
    }
    Ok(out)
}

/// Set `key` (dotted) in `t` to `value` (TOML, or a bare string).
fn set_override(t: &mut Table, key: &str, value: &str) -> Result<(), ConfigError> {
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(err(
            key,
            "empty key component",
            "write keys like net.ip=198.18.0.2",
        ));
    }
    let parsed = match format!("v = {value}").parse::<Table>() {
        Ok(mut tt) => tt.remove("v").unwrap_or(Value::String(value.to_string())),
        Err(_) => Value::String(value.to_string()),
    };
    let mut cur = t;
    for (i, p) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            cur.insert((*p).to_string(), parsed);
            return Ok(());
        }
        let entry = cur
            .entry((*p).to_string())
            .or_insert_with(|| Value::Table(Table::new()));
        cur = match entry {
            Value::Table(tt) => tt,
            _ => {
                return Err(err(
                    &parts[..=i].join("."),
                    "is a value, not a section",
                    "override the value itself, not a key below it",
                ))
            }
        };
    }
    Ok(())
}

impl Config {
    /// Parse and validate TOML text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        Self::parse_with_overrides(text, &[])
    }

    /// Read a file, apply `key=value` overrides, validate.
    pub fn load(path: &Path, overrides: &[(String, String)]) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            err(
                "<file>",
                format!("cannot read {}: {e}", path.display()),
                "check the path given to --config",
            )
        })?;
        Self::parse_with_overrides(&text, overrides)
    }

    /// Parse TOML text, apply overrides (in order), validate.
    pub fn parse_with_overrides(
        text: &str,
        overrides: &[(String, String)],
    ) -> Result<Config, ConfigError> {
        let mut t: Table = text.parse().map_err(|e: toml::de::Error| {
            err(
                "<toml>",
                format!("not valid TOML: {}", e.message()),
                match e.span() {
                    Some(s) => format!("fix the syntax near byte {}", s.start),
                    None => "fix the syntax".into(),
                },
            )
        })?;
        for (k, v) in overrides {
            set_override(&mut t, k, v)?;
        }
        let kernel = if t.contains_key("traffic") {
            Some(KernelPorts::from_proc().map_err(model_err)?)
        } else {
            None
        };
        Self::from_table(t, kernel.as_ref())
    }

    /// [`Config::parse`] with the kernel's port settings given instead of read from
    /// /proc (for tests and for checking a config meant for another host).
    pub fn parse_with_kernel(text: &str, kernel: &KernelPorts) -> Result<Config, ConfigError> {
        let t: Table = text.parse().map_err(|e: toml::de::Error| {
            err(
                "<toml>",
                format!("not valid TOML: {}", e.message()),
                "fix the syntax",
            )
        })?;
        Self::from_table(t, Some(kernel))
    }

    fn from_table(t: Table, kernel: Option<&KernelPorts>) -> Result<Config, ConfigError> {
        let mut root = Walk::new("", t);
        let eal = match root.take("eal") {
            None => Vec::new(),
            Some((k, v)) => array(&k, &v, "[\"--no-pci\"]")?
                .iter()
                .enumerate()
                .map(|(i, a)| string(&format!("{k}[{i}]"), a, "--no-pci").map(str::to_string))
                .collect::<Result<_, _>>()?,
        };
        let (device, steering, tx_copy_max) = Self::device(root.table("device")?)?;
        let (cores, queues_per_core) = Self::cores(root.table("cores")?)?;
        let net = Self::net(root.table("net")?)?;
        let (tcp, rcv_mem_total) = Self::tcp(root.table("tcp")?, net.mtu)?;
        let traffic_value = root.take("traffic");
        let ports_table = root.table("ports")?;
        let (ports, traffic) = match traffic_value {
            None => (Self::ports(ports_table, cores.len())?, None),
            Some((k, v)) => {
                let kernel = kernel.ok_or_else(|| {
                    err(
                        &k,
                        "no kernel port settings to check against",
                        "use Config::parse",
                    )
                })?;
                Self::traffic(&k, v, ports_table, cores.len(), kernel)?
            }
        };
        let exception = Self::exception(root.table("exception")?)?;
        let steering = match steering {
            Some(_) if traffic.is_none() => {
                return Err(err(
                    "device.steering",
                    "steering needs a traffic model: without [traffic] luna owns the port",
                    "add a [traffic] section, or remove device.steering",
                ))
            }
            Some(m) => m,
            None => SteeringMode::Auto,
        };
        if exception.is_some() && traffic.is_none() {
            return Err(err(
                "exception",
                "the exception path needs a traffic model to decide which frames are the kernel's",
                "add a [traffic] section (listen_tcp = [...] at least)",
            ));
        }
        let (mode, mut options, workers) = Self::runtime(root.table("runtime")?, &cores)?;
        options.control = Self::control(root.table("control")?)?;
        root.finish(&[
            "eal",
            "device",
            "cores",
            "net",
            "tcp",
            "ports",
            "traffic",
            "exception",
            "runtime",
            "control",
        ])?;
        Ok(Config {
            eal,
            device,
            cores,
            queues_per_core,
            net,
            tcp,
            rcv_mem_total,
            ports,
            mode,
            options,
            workers,
            traffic,
            exception,
            steering,
            tx_copy_max,
        })
    }

    /// What a DPDK port opened for this configuration is asked to steer
    /// (`DpdkDeviceConfig::steering`): the traffic model's compiled rules and
    /// `device.steering`, or `None` without `[traffic]` (luna owns the port).
    pub fn steering_request(&self) -> Option<SteeringRequest> {
        self.traffic.as_ref().map(|m| SteeringRequest {
            mode: self.steering,
            rules: bifurcation::compile(m),
        })
    }

    /// `[traffic]`: bifurcation's model, validated against `kernel`; its plan replaces
    /// `[ports]` (of which only `app` is allowed alongside).
    fn traffic(
        key: &str,
        v: Value,
        ports: Option<Walk>,
        threads: usize,
        kernel: &KernelPorts,
    ) -> Result<(PortsConfig, Option<TrafficModel>), ConfigError> {
        let mut app = "r2c".to_string();
        if let Some(mut w) = ports {
            if let Some((k, v)) = w.take("app") {
                app = string(&k, &v, "knb")?.to_string();
            }
            w.finish(&["app"]).map_err(|mut e| {
                e.problem = "[traffic] replaces [ports]: only ports.app may stay".into();
                e.fix = "move range/apps into [traffic] (client_range, apps)".into();
                e
            })?;
        }
        let mut tc: TrafficConfig = v.try_into().map_err(|e: toml::de::Error| {
            err(
                key,
                e.to_string().trim_end().replace('\n', " "),
                "see the [traffic] example in r2c's config docs",
            )
        })?;
        if tc.apps.is_empty() {
            tc.apps.push(AppConfig {
                name: app.clone(),
                ports: Default::default(),
                threads: Some(threads as u16),
                queues: None,
            });
        }
        let model = tc.validate(kernel).map_err(model_err)?;
        let plan = model.plan().clone();
        let Some(me) = plan.apps().iter().find(|a| a.name == app) else {
            return Err(err(
                "ports.app",
                format!("\"{app}\" is not among traffic.apps"),
                "name one of the traffic.apps entries in ports.app, or add an entry for it",
            ));
        };
        if me.threads.len() != threads {
            return Err(err(
                "traffic.apps",
                format!(
                    "application \"{app}\" has {} threads but cores.list has {threads}",
                    me.threads.len()
                ),
                "make its `threads` equal to the number of cores",
            ));
        }
        let range = plan.reserved();
        Ok((PortsConfig { range, app, plan }, Some(model)))
    }

    /// `[control]`: the control socket's path (bound when the runtime starts).
    fn control(w: Option<Walk>) -> Result<Option<crate::control::ControlConfig>, ConfigError> {
        let Some(mut w) = w else {
            return Ok(None);
        };
        let Some((k, v)) = w.take("socket") else {
            return Err(err(
                "control.socket",
                "missing",
                "set socket = \"/run/luna/app.sock\" (or remove [control] to turn it off)",
            ));
        };
        let path = string(&k, &v, "/run/luna/app.sock")?;
        if path.is_empty() {
            return Err(err(
                &k,
                "is empty",
                "give a path such as \"/run/luna/app.sock\"",
            ));
        }
        if path.len() > crate::control::MAX_SOCKET_PATH {
            return Err(err(
                &k,
                format!(
                    "is {} bytes; a unix socket path holds at most {}",
                    path.len(),
                    crate::control::MAX_SOCKET_PATH
                ),
                "use a shorter path",
            ));
        }
        if path.contains('\0') {
            return Err(err(&k, "contains a NUL byte", "remove it"));
        }
        w.finish(&["socket"])?;
        Ok(Some(crate::control::ControlConfig::new(path)))
    }

    fn exception(w: Option<Walk>) -> Result<Option<ExceptionSettings>, ConfigError> {
        let Some(mut w) = w else {
            return Ok(None);
        };
        let need = |w: &mut Walk, k: &str, ex: &str| match w.take(k) {
            Some((key, v)) => string(&key, &v, ex).map(str::to_string),
            None => Err(err(
                &format!("exception.{k}"),
                "missing",
                format!("set {k} = \"{ex}\""),
            )),
        };
        let port = need(&mut w, "port", "net_tap1")?;
        let iface = need(&mut w, "iface", "luna-exc")?;
        let mirror = match w.take("mirror") {
            Some((k, v)) => boolean(&k, &v)?,
            None => false,
        };
        let queue = match w.take("queue") {
            Some((k, v)) => int(&k, &v, 1, 1 << 20)? as usize,
            None => 1024,
        };
        w.finish(&["port", "iface", "mirror", "queue"])?;
        Ok(Some(ExceptionSettings {
            port,
            iface,
            mirror,
            queue,
        }))
    }

    #[allow(clippy::type_complexity)]
    fn device(
        w: Option<Walk>,
    ) -> Result<(DeviceKind, Option<SteeringMode>, Option<usize>), ConfigError> {
        let Some(mut w) = w else {
            return Err(err(
                "device",
                "no device is configured",
                "add a [device] section with kind = \"dpdk\" and port = \"<ethdev name>\", or kind = \"mem\"",
            ));
        };
        let kind = match w.take("kind") {
            None => {
                return Err(err(
                    "device.kind",
                    "missing",
                    "set kind = \"dpdk\" or kind = \"mem\"",
                ))
            }
            Some((k, v)) => (k.clone(), string(&k, &v, "dpdk")?.to_string()),
        };
        let port = match w.take("port") {
            Some((k, v)) => Some(string(&k, &v, "net_memif0")?.to_string()),
            None => None,
        };
        let steering = match w.take("steering") {
            Some((k, v)) => {
                let s = string(&k, &v, "auto")?;
                Some(SteeringMode::parse(s).ok_or_else(|| {
                    err(
                        &k,
                        format!("unknown steering {s:?}"),
                        "use \"auto\" (rte_flow when the NIC takes it, else software), \"hardware\" or \"software\"",
                    )
                })?)
            }
            None => None,
        };
        let tx_copy_max = match w.take("tx_copy_max") {
            Some((k, v)) => Some(int(&k, &v, 0, 65_535)? as usize),
            None => None,
        };
        w.finish(&["kind", "port", "steering", "tx_copy_max"])?;
        match (kind.1.as_str(), port) {
            ("mem", _) => Ok((DeviceKind::Mem, steering, tx_copy_max)),
            ("dpdk", Some(port)) if !port.is_empty() => {
                Ok((DeviceKind::Dpdk { port }, steering, tx_copy_max))
            }
            ("dpdk", _) => Err(err(
                "device.port",
                "a DPDK device needs a port name",
                "set port = \"net_memif0\" (the ethdev name, as given to --vdev or a PCI address)",
            )),
            (other, _) => Err(err(
                &kind.0,
                format!("unknown device kind \"{other}\""),
                "use \"dpdk\" or \"mem\"",
            )),
        }
    }

    fn cores(w: Option<Walk>) -> Result<(Vec<usize>, u16), ConfigError> {
        let Some(mut w) = w else {
            return Err(err(
                "cores",
                "no cores are configured",
                "add [cores] with list = [0] (CPUs to run on)",
            ));
        };
        let cores = match w.take("list") {
            Some((k, v)) => cpu_list(&k, &v)?,
            None => Vec::new(),
        };
        if cores.is_empty() {
            return Err(err(
                "cores.list",
                "no CPUs listed",
                "list at least one CPU, e.g. [0]",
            ));
        }
        let q = match w.take("queues_per_core") {
            Some((k, v)) => int(&k, &v, 1, 64)? as u16,
            None => 1,
        };
        w.finish(&["list", "queues_per_core"])?;
        Ok((cores, q))
    }

    fn net(w: Option<Walk>) -> Result<NetConfig, ConfigError> {
        let Some(mut w) = w else {
            return Err(err(
                "net",
                "no interface address",
                "add [net] with ip = \"198.18.0.1\"",
            ));
        };
        let (ip_key, ipaddr) = match w.take("ip") {
            Some((k, v)) => {
                let a = ip(&k, &v)?;
                (k, a)
            }
            None => return Err(err("net.ip", "missing", "set ip = \"198.18.0.1\"")),
        };
        let prefix_len = match w.take("prefix_len") {
            Some((k, v)) => int(&k, &v, 0, 32)? as u8,
            None => 24,
        };
        let cidr = Ipv4Cidr::new(ipaddr, prefix_len).expect("prefix checked");
        // The stack's own rule (Stack::new applies it too), reported here with the key.
        if let Err(e) = luna_stack::stack::check_host_address(cidr) {
            return Err(err(
                &ip_key,
                format!("{e} (prefix_len {prefix_len})"),
                "set ip to the interface's own unicast host address (or fix prefix_len)",
            ));
        }
        let if_mac = match w.take("mac") {
            Some((k, v)) => Some(mac(&k, &v)?),
            None => None,
        };
        let gateway = match w.take("gateway") {
            Some((k, v)) => {
                let g = ip(&k, &v)?;
                if !cidr.contains_addr(g) {
                    return Err(err(
                        &k,
                        format!("gateway {g} is not on {ipaddr}/{prefix_len}"),
                        "use a gateway inside the interface's prefix, or fix prefix_len",
                    ));
                }
                Some(g)
            }
            None => None,
        };
        let mtu = match w.take("mtu") {
            Some((k, v)) => int(&k, &v, 576, 9216)? as u16,
            None => 1500,
        };
        let mut routes = Vec::new();
        if let Some((k, v)) = w.take("routes") {
            for (i, r) in array(
                &k,
                &v,
                "[{ dest = \"198.19.0.0/16\", via = \"198.18.0.254\" }]",
            )?
            .iter()
            .enumerate()
            {
                let rk = format!("{k}[{i}]");
                let Some(t) = r.as_table() else {
                    return Err(err(
                        &rk,
                        "expected a table",
                        "write { dest = \"198.19.0.0/16\", via = \"198.18.0.254\" }",
                    ));
                };
                let mut rw = Walk::new(&rk, t.clone());
                let dest = match rw.take("dest") {
                    Some((dk, dv)) => {
                        let s = string(&dk, &dv, "198.19.0.0/16")?;
                        s.parse::<Ipv4Cidr>().map_err(|_| {
                            err(
                                &dk,
                                format!("\"{s}\" is not a prefix"),
                                "write address/length, e.g. \"198.19.0.0/16\"",
                            )
                        })?
                    }
                    None => {
                        return Err(err(
                            &format!("{rk}.dest"),
                            "missing",
                            "set dest = \"198.19.0.0/16\"",
                        ))
                    }
                };
                let next_hop = match rw.take("via") {
                    Some((vk, vv)) => {
                        let g = ip(&vk, &vv)?;
                        if !cidr.contains_addr(g) {
                            return Err(err(
                                &vk,
                                format!("next hop {g} is not on-link"),
                                "route via an address inside the interface's prefix",
                            ));
                        }
                        NextHop::Gateway(g)
                    }
                    None => NextHop::Direct,
                };
                rw.finish(&["dest", "via"])?;
                routes.push(Route {
                    destination: dest,
                    next_hop,
                    source: ipaddr,
                    interface: 0,
                });
            }
        }
        let mut neighbours = Vec::new();
        if let Some((k, v)) = w.take("neighbours") {
            for (i, n) in array(
                &k,
                &v,
                "[{ ip = \"198.18.0.2\", mac = \"02:00:00:00:00:02\" }]",
            )?
            .iter()
            .enumerate()
            {
                let nk = format!("{k}[{i}]");
                let Some(t) = n.as_table() else {
                    return Err(err(
                        &nk,
                        "expected a table",
                        "write { ip = \"198.18.0.2\", mac = \"02:00:00:00:00:02\" }",
                    ));
                };
                let mut nw = Walk::new(&nk, t.clone());
                let nip = match nw.take("ip") {
                    Some((a, b)) => ip(&a, &b)?,
                    None => {
                        return Err(err(
                            &format!("{nk}.ip"),
                            "missing",
                            "set ip = \"198.18.0.2\"",
                        ))
                    }
                };
                let nmac = match nw.take("mac") {
                    Some((a, b)) => mac(&a, &b)?,
                    None => {
                        return Err(err(
                            &format!("{nk}.mac"),
                            "missing",
                            "set mac = \"02:00:00:00:00:02\"",
                        ))
                    }
                };
                nw.finish(&["ip", "mac"])?;
                neighbours.push((nip, nmac));
            }
        }
        w.finish(&[
            "ip",
            "prefix_len",
            "mac",
            "gateway",
            "mtu",
            "routes",
            "neighbours",
        ])?;
        Ok(NetConfig {
            ip: ipaddr,
            prefix_len,
            mac: if_mac,
            gateway,
            mtu,
            routes,
            neighbours,
        })
    }

    /// `[tcp]`: the TCP settings, and `rcv_mem_total` (a stack setting, here with the
    /// receive buffer it bounds across connections).
    fn tcp(w: Option<Walk>, mtu: u16) -> Result<(TcpConfig, Option<usize>), ConfigError> {
        let mut c = TcpConfig::default();
        let Some(mut w) = w else {
            return Ok((c, None));
        };
        if let Some((k, v)) = w.take("mss") {
            c.mss = int(&k, &v, 88, i64::from(mtu) - 40)? as u16;
        }
        if let Some((k, v)) = w.take("rcv_buf") {
            c.rcv_buf = int(&k, &v, 1, 1 << 30)? as u32;
        }
        let mut rcv_mem_total = None;
        if let Some((k, v)) = w.take("rcv_mem_total") {
            let min = MIN_RCV_MEM_TOTAL as i64;
            let n = int(&k, &v, 0, 1 << 40)?;
            if n < min {
                return Err(err(
                    &k,
                    format!(
                        "{n} bytes is below the least the stack accepts, {min} (MIN_RCV_MEM_TOTAL)"
                    ),
                    format!("use at least {min}, or leave it out for half the receive pools"),
                ));
            }
            rcv_mem_total = Some(n as usize);
        }
        if let Some((k, v)) = w.take("rcv_mem_min") {
            c.rcv_mem_min = int(&k, &v, 0, 1 << 31)? as u32;
        }
        if let Some((k, v)) = w.take("snd_buf") {
            c.snd_buf = int(&k, &v, 1, 1 << 30)? as u32;
        }
        if let Some((k, v)) = w.take("cc") {
            c.cc = match string(&k, &v, "newreno")? {
                "newreno" => CcAlgorithm::NewReno,
                "cubic" => CcAlgorithm::Cubic,
                other => {
                    return Err(err(
                        &k,
                        format!("unknown congestion control \"{other}\""),
                        "use \"newreno\" or \"cubic\"",
                    ))
                }
            };
        }
        if let Some((k, v)) = w.take("delayed_ack_us") {
            // RFC 9293 §3.8.6.3: an ACK must not be delayed 0.5 s or more.
            let d = micros(&k, &v, 499_999)?;
            c.delayed_ack = (!d.is_zero()).then_some(d);
        }
        if let Some((k, v)) = w.take("rto_min_us") {
            c.rtt.min_rto = micros(&k, &v, 60_000_000)?;
        }
        if let Some((k, v)) = w.take("rto_max_us") {
            c.rtt.max_rto = micros(&k, &v, 600_000_000)?;
        }
        // Defaults of the initial and SYN-retransmit RTOs follow the bounds given; an
        // explicit rto_initial_us must lie within them.
        let (lo, hi) = (c.rtt.min_rto, c.rtt.max_rto.max(c.rtt.min_rto));
        c.rtt.initial_rto = c.rtt.initial_rto.clamp(lo, hi);
        c.rtt.syn_timeout_rto = c.rtt.syn_timeout_rto.clamp(lo, hi);
        if let Some((k, v)) = w.take("rto_initial_us") {
            c.rtt.initial_rto = micros(&k, &v, 60_000_000)?;
            if c.rtt.initial_rto < c.rtt.min_rto || c.rtt.initial_rto > c.rtt.max_rto {
                return Err(err(
                    &k,
                    "is outside [rto_min_us, rto_max_us]",
                    "pick a value between the two bounds",
                ));
            }
        }
        if let Some((k, v)) = w.take("time_wait_ms") {
            c.time_wait = Duration::from_millis(int(&k, &v, 0, 240_000)? as u64);
        }
        if let Some((k, v)) = w.take("send_burst") {
            c.send_burst = int(&k, &v, 1, 64)? as u16;
        }
        if let Some((k, v)) = w.take("tlp_ack_delay_us") {
            c.tlp_ack_delay = Duration::from_micros(int(&k, &v, 0, 60_000_000)? as u64);
        }
        if let Some((k, v)) = w.take("tlp_us") {
            let us = int(&k, &v, 0, 60_000_000)? as u64;
            c.tlp = (us != 0).then(|| Duration::from_micros(us));
        }
        for (name, field) in [
            ("nagle", &mut c.nagle),
            ("sack", &mut c.sack),
            ("timestamps", &mut c.timestamps),
            ("window_scaling", &mut c.window_scaling),
            ("rack", &mut c.rack),
        ] {
            if let Some((k, v)) = w.take(name) {
                *field = boolean(&k, &v)?;
            }
        }
        w.finish(&[
            "mss",
            "rcv_buf",
            "rcv_mem_total",
            "rcv_mem_min",
            "snd_buf",
            "cc",
            "delayed_ack_us",
            "rto_min_us",
            "rto_max_us",
            "rto_initial_us",
            "time_wait_ms",
            "send_burst",
            "tlp_us",
            "tlp_ack_delay_us",
            "nagle",
            "sack",
            "timestamps",
            "window_scaling",
            "rack",
        ])?;
        if c.rtt.min_rto > c.rtt.max_rto {
            return Err(err(
                "tcp.rto_min_us",
                "is above tcp.rto_max_us",
                "make rto_min_us <= rto_max_us",
            ));
        }
        if c.tlp_ack_delay > c.rtt.max_rto {
            return Err(err(
                "tcp.tlp_ack_delay_us",
                "is above tcp.rto_max_us",
                "make tlp_ack_delay_us <= rto_max_us",
            ));
        }
        if c.tlp.is_some_and(|floor| floor > c.rtt.max_rto) {
            return Err(err(
                "tcp.tlp_us",
                "is above tcp.rto_max_us",
                "make tlp_us <= rto_max_us, or 0 to turn tail loss probes off",
            ));
        }
        c.validate()
            .map_err(|e| err("tcp", e, "adjust the named TCP setting"))?;
        Ok((c, rcv_mem_total))
    }

    fn ports(w: Option<Walk>, threads: usize) -> Result<PortsConfig, ConfigError> {
        let mut range = PortRange::RESERVED;
        let mut app = "r2c".to_string();
        let mut apps = Vec::new();
        if let Some(mut w) = w {
            if let Some((k, v)) = w.take("range") {
                let a = array(&k, &v, "[61440, 65535]")?;
                if a.len() != 2 {
                    return Err(err(
                        &k,
                        "expected [first, last]",
                        "write range = [61440, 65535]",
                    ));
                }
                let (lo, hi) = (
                    int(&k, &a[0], 1, 65535)? as u16,
                    int(&k, &a[1], 1, 65535)? as u16,
                );
                range = PortRange::new(lo, hi).ok_or_else(|| {
                    err(
                        &k,
                        format!("{lo} > {hi}"),
                        "write [first, last] with first <= last",
                    )
                })?;
            }
            if let Some((k, v)) = w.take("app") {
                app = string(&k, &v, "knb")?.to_string();
            }
            if let Some((k, v)) = w.take("apps") {
                for (i, e) in array(&k, &v, "[{ name = \"knb\" }]")?.iter().enumerate() {
                    let ak = format!("{k}[{i}]");
                    let Some(t) = e.as_table() else {
                        return Err(err(
                            &ak,
                            "expected a table",
                            "write { name = \"knb\", ports = 1024 }",
                        ));
                    };
                    let mut aw = Walk::new(&ak, t.clone());
                    let name = match aw.take("name") {
                        Some((nk, nv)) => string(&nk, &nv, "knb")?.to_string(),
                        None => {
                            return Err(err(
                                &format!("{ak}.name"),
                                "missing",
                                "give the application a name",
                            ))
                        }
                    };
                    let share =
                        match aw.take("ports") {
                            None => Share::Rest,
                            Some((pk, Value::String(s))) if s == "rest" => {
                                let _ = pk;
                                Share::Rest
                            }
                            Some((pk, Value::Integer(n))) => {
                                Share::Count(int(&pk, &Value::Integer(n), 1, 65535)? as u32)
                            }
                            Some((pk, Value::Array(a))) if a.len() == 2 => {
                                let (lo, hi) = (
                                    int(&pk, &a[0], 1, 65535)? as u16,
                                    int(&pk, &a[1], 1, 65535)? as u16,
                                );
                                Share::Range(PortRange::new(lo, hi).ok_or_else(|| {
                                    err(
                                        &pk,
                                        format!("{lo} > {hi}"),
                                        "write [first, last] with first <= last",
                                    )
                                })?)
                            }
                            Some((pk, _)) => return Err(err(
                                &pk,
                                "expected \"rest\", a count or [first, last]",
                                "write ports = \"rest\", ports = 1024 or ports = [61440, 62463]",
                            )),
                        };
                    let n = match aw.take("threads") {
                        Some((tk, tv)) => int(&tk, &tv, 1, 4096)? as u16,
                        None if name == app => threads as u16,
                        None => 1,
                    };
                    aw.finish(&["name", "ports", "threads"])?;
                    apps.push(AppSpec::new(name, share, n));
                }
            }
            w.finish(&["range", "app", "apps"])?;
        }
        if apps.is_empty() {
            apps.push(AppSpec::new(app.clone(), Share::Rest, threads as u16));
        }
        let Some(me) = apps.iter_mut().find(|a| a.name == app) else {
            return Err(err(
                "ports.app",
                format!("\"{app}\" is not among ports.apps"),
                "name one of the ports.apps entries, or add an entry for it",
            ));
        };
        if me.threads.len() != threads {
            return Err(err(
                "ports.apps",
                format!(
                    "application \"{app}\" has {} threads but cores.list has {threads}",
                    me.threads.len()
                ),
                "drop its `threads` (it defaults to the number of cores) or make them equal",
            ));
        }
        me.threads = (0..threads as u16)
            .map(|t| ThreadSlot {
                thread: t,
                queue: t,
            })
            .collect();
        let plan = PartitionPlan::build(range, &apps).map_err(|e| {
            err(
                "ports.apps",
                e.to_string(),
                "see the message: every reserved port must belong to exactly one application",
            )
        })?;
        Ok(PortsConfig { range, app, plan })
    }

    fn runtime(
        w: Option<Walk>,
        cores: &[usize],
    ) -> Result<(RunMode, CoreOptions, Vec<usize>), ConfigError> {
        let mut o = CoreOptions::default();
        let mut mode = RunMode::Inline;
        let mut workers = Vec::new();
        let Some(mut w) = w else {
            return Ok((mode, o, workers));
        };
        if let Some((k, v)) = w.take("mode") {
            mode = match string(&k, &v, "inline")? {
                "inline" => RunMode::Inline,
                "batch" => RunMode::Batch,
                "split" => RunMode::Split,
                other => {
                    return Err(err(
                        &k,
                        format!("unknown mode \"{other}\""),
                        "use \"inline\", \"batch\" or \"split\"",
                    ))
                }
            };
        }
        if let Some((k, v)) = w.take("burst") {
            o.burst = int(&k, &v, 1, 512)? as usize;
        }
        if let Some((k, v)) = w.take("rx_split") {
            o.rx_split = int(&k, &v, 0, 512)? as usize;
        }
        let mut backoff_max = Duration::from_micros(100);
        if let Some((k, v)) = w.take("backoff_max_us") {
            backoff_max = micros(&k, &v, 1_000_000)?;
        }
        if let Some((k, v)) = w.take("idle") {
            o.idle = match string(&k, &v, "busy")? {
                "busy" => IdleStrategy::BusyPoll,
                "yield" => IdleStrategy::Yield,
                "backoff" => IdleStrategy::Backoff { max: backoff_max },
                other => {
                    return Err(err(
                        &k,
                        format!("unknown idle strategy \"{other}\""),
                        "use \"busy\", \"yield\" or \"backoff\"",
                    ))
                }
            };
        }
        if let Some((k, v)) = w.take("stats_interval") {
            o.stats_interval = int(&k, &v, 1, i64::MAX)? as u64;
        }
        if let Some((k, v)) = w.take("tx_retry_limit") {
            o.tx_retry_limit = int(&k, &v, 0, 1_000_000)? as u32;
        }
        if let Some((k, v)) = w.take("shutdown_grace_ms") {
            o.shutdown_grace = Duration::from_millis(int(&k, &v, 0, 600_000)? as u64);
        }
        if let Some((k, v)) = w.take("pin") {
            o.pin = boolean(&k, &v)?;
        }
        if let Some((k, v)) = w.take("clock") {
            o.clock = match string(&k, &v, "std")? {
                "std" => ClockSource::Std,
                // The rate comes from the EAL at start-up; 0 = not known yet.
                "tsc" => ClockSource::Tsc(0),
                other => {
                    return Err(err(
                        &k,
                        format!("unknown clock \"{other}\""),
                        "use \"std\" or \"tsc\"",
                    ))
                }
            };
        }
        if let Some((k, v)) = w.take("workers") {
            workers = cpu_list(&k, &v)?;
            if let Some(c) = workers.iter().find(|c| cores.contains(c)) {
                return Err(err(
                    &k,
                    format!("CPU {c} is also in cores.list"),
                    "give workers CPUs of their own",
                ));
            }
        }
        w.finish(&[
            "mode",
            "burst",
            "rx_split",
            "idle",
            "backoff_max_us",
            "stats_interval",
            "tx_retry_limit",
            "shutdown_grace_ms",
            "pin",
            "clock",
            "workers",
        ])?;
        if mode == RunMode::Split && workers.is_empty() {
            return Err(err(
                "runtime.workers",
                "split mode needs worker CPUs",
                "set workers = [2, 3]",
            ));
        }
        Ok((mode, o, workers))
    }

    /// The stack configuration (MAC from the config or the device).
    pub fn stack_config(&self, device_mac: EthernetAddress) -> StackConfig {
        let addr = Ipv4Cidr::new(self.net.ip, self.net.prefix_len).expect("validated");
        let mut s = StackConfig::new(self.net.mac.unwrap_or(device_mac), addr);
        s.gateway = self.net.gateway;
        s.mtu = self.net.mtu;
        s.tcp = self.tcp.clone();
        if let Some(n) = self.rcv_mem_total {
            s.rcv_mem_total = n;
        }
        let r = self.ports.range;
        s.ephemeral_ports = (r.first(), r.last());
        // With mirroring the kernel owns ARP: the exception path hands it every ARP frame.
        s.answer_arp = !self.exception.as_ref().is_some_and(|e| e.mirror);
        s
    }

    /// One setup per core from `devices[core]` (its `queues_per_core` queue handles).
    pub fn core_setups<D: crate::device::Device>(
        &self,
        devices: Vec<Vec<D>>,
    ) -> Result<Vec<CoreSetup<D>>, ConfigError> {
        if devices.len() != self.cores.len() {
            return Err(err(
                "cores.list",
                format!(
                    "{} cores but {} device queue sets",
                    self.cores.len(),
                    devices.len()
                ),
                "open one set of queues per core",
            ));
        }
        devices
            .into_iter()
            .enumerate()
            .map(|(i, devs)| {
                let mac = devs.first().map(|d| d.mac()).ok_or_else(|| {
                    err(
                        "device",
                        format!("core {i} got no queue"),
                        "open queues_per_core queues per core",
                    )
                })?;
                let mut s = CoreSetup::new(i, devs, self.stack_config(mac));
                s.rcv_mem_total_set = self.rcv_mem_total.is_some();
                s.cpu = Some(self.cores[i]);
                s.routes = self.net.routes.clone();
                s.neighbours = self.net.neighbours.clone();
                s.ports = self.ports.plan.ports_of(&self.ports.app, i as u16);
                Ok(s)
            })
            .collect()
    }
}

/// Command-line overrides, to `#[command(flatten)]` into an application's parser.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CliOverrides {
    /// TOML configuration file.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Override any key: `--set net.ip=198.18.0.2` (repeatable; values are TOML).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// EAL arguments, space separated (replaces `eal`).
    #[arg(long, allow_hyphen_values = true)]
    pub eal: Option<String>,
    /// CPUs, comma separated (replaces `cores.list`).
    #[arg(long)]
    pub cores: Option<String>,
    /// Queues per core.
    #[arg(long)]
    pub queues_per_core: Option<u16>,
    /// Interface address.
    #[arg(long)]
    pub ip: Option<String>,
    /// Prefix length.
    #[arg(long)]
    pub prefix_len: Option<u8>,
    /// MAC address.
    #[arg(long)]
    pub mac: Option<String>,
    /// Default gateway.
    #[arg(long)]
    pub gateway: Option<String>,
    /// Run mode: inline, batch or split.
    #[arg(long)]
    pub mode: Option<String>,
}

impl CliOverrides {
    /// The flags as `key=value` overrides, in a fixed order (`--set` last, so it wins).
    pub fn overrides(&self) -> Result<Vec<(String, String)>, ConfigError> {
        let q = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
        let mut o = Vec::new();
        if let Some(e) = &self.eal {
            let items: Vec<String> = e.split_whitespace().map(q).collect();
            o.push(("eal".into(), format!("[{}]", items.join(", "))));
        }
        if let Some(c) = &self.cores {
            o.push(("cores.list".into(), format!("[{c}]")));
        }
        if let Some(n) = self.queues_per_core {
            o.push(("cores.queues_per_core".into(), n.to_string()));
        }
        for (k, v) in [
            ("net.ip", &self.ip),
            ("net.mac", &self.mac),
            ("net.gateway", &self.gateway),
            ("runtime.mode", &self.mode),
        ] {
            if let Some(v) = v {
                o.push((k.into(), q(v)));
            }
        }
        if let Some(p) = self.prefix_len {
            o.push(("net.prefix_len".into(), p.to_string()));
        }
        for s in &self.set {
            let Some((k, v)) = s.split_once('=') else {
                return Err(err(
                    s,
                    "an override needs KEY=VALUE",
                    "write --set net.ip=198.18.0.2",
                ));
            };
            o.push((k.trim().to_string(), v.trim().to_string()));
        }
        Ok(o)
    }

    /// Load `--config` (or an empty file) and apply the overrides.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let o = self.overrides()?;
        match &self.config {
            Some(p) => Config::load(p, &o),
            None => Config::parse_with_overrides("", &o),
        }
    }
}
