//! The traffic model: one description of which flows are luna's, loaded from the
//! `[traffic]` section of r2c's TOML config and validated against the kernel's port
//! settings. Everything the model does not name as luna's belongs to the kernel.
//!
//! ```toml
//! [traffic]
//! client_range = [61440, 65535]  # luna's client (source) ports; the kernel must not use them
//! listen_tcp = [7000]            # luna's listening TCP ports
//! listen_udp = []                # luna's UDP ports
//! ip = "198.18.0.1"              # optional: only packets to this address are luna's
//! kernel_ports = [22]            # ports that always stay with the kernel (default [22])
//! allow_well_known = false       # luna may listen below 1024 only when true
//! balance = 0.0625               # thread shares may differ from even by ±6.25% to save rules
//! apps = [
//!   { name = "ebs", threads = 12 },                         # ports = "rest" by default
//!   { name = "oss", ports = 2048, threads = 6, queues = [12, 13, 14, 15, 16, 17] },
//! ]
//! ```
//!
//! `apps[].ports` is `"rest"`, a count, or `[first, last]` (as in r2c's `[ports]`);
//! `queues` defaults to thread `i` on queue `i` for the first application and continues
//! after the previous application's queues for the others.
//!
//! Luna's flows: TCP to a port of the client range (each port owned by one thread and
//! queue, [`PartitionPlan`]) or to a listening port, UDP to a listening UDP port, in
//! unfragmented IPv4 to the model's address (any unicast address when `ip` is unset).
//! ICMP errors quoting one of luna's flows are luna's too (the software classifier reads
//! the quote). The kernel's: ARP, every other ICMP message, IPv6, VLAN-tagged frames,
//! other EtherTypes, other IP protocols, IPv4 fragments, broadcast/multicast, other
//! addresses, every other port (ssh included).

use crate::ports::{AppSpec, PartitionPlan, PlanError, PortRange, Share, ThreadSlot};
use core::fmt;
use core::net::Ipv4Addr;
use serde::{Deserialize, Serialize};

/// Transport protocol of a rule or flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum L4 {
    /// TCP (IP protocol 6).
    Tcp,
    /// UDP (IP protocol 17).
    Udp,
}

impl fmt::Display for L4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            L4::Tcp => "tcp",
            L4::Udp => "udp",
        })
    }
}

/// An application's share as written in TOML: `"rest"`, a count, or `[first, last]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SharePorts {
    /// `"rest"`.
    Word(String),
    /// A number of ports.
    Count(u32),
    /// `[first, last]`.
    Range([u16; 2]),
}

impl Default for SharePorts {
    fn default() -> Self {
        SharePorts::Word("rest".into())
    }
}

/// One application of `[traffic].apps`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppConfig {
    /// Unique name.
    pub name: String,
    /// Its share of the client range.
    #[serde(default)]
    pub ports: SharePorts,
    /// Number of threads (default 1).
    #[serde(default)]
    pub threads: Option<u16>,
    /// The receive queue of each thread (default: consecutive, after the previous app's).
    #[serde(default)]
    pub queues: Option<Vec<u16>>,
}

fn default_range() -> [u16; 2] {
    [PortRange::RESERVED.first(), PortRange::RESERVED.last()]
}

fn default_kernel_ports() -> Vec<u16> {
    vec![22]
}

fn default_balance() -> f64 {
    0.0625
}

/// The `[traffic]` section as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficConfig {
    /// Luna's client port range, `[first, last]`.
    #[serde(default = "default_range")]
    pub client_range: [u16; 2],
    /// Applications sharing the client range.
    #[serde(default)]
    pub apps: Vec<AppConfig>,
    /// Luna's listening TCP ports.
    #[serde(default)]
    pub listen_tcp: Vec<u16>,
    /// Luna's UDP ports.
    #[serde(default)]
    pub listen_udp: Vec<u16>,
    /// Only packets to this address are luna's (unset: any unicast address).
    #[serde(default)]
    pub ip: Option<Ipv4Addr>,
    /// Ports that must stay with the kernel.
    #[serde(default = "default_kernel_ports")]
    pub kernel_ports: Vec<u16>,
    /// Whether luna may listen on ports below 1024.
    #[serde(default)]
    pub allow_well_known: bool,
    /// How far (as a fraction of the even share) a thread's share may move to save rules.
    #[serde(default = "default_balance")]
    pub balance: f64,
}

impl Default for TrafficConfig {
    fn default() -> Self {
        TrafficConfig {
            client_range: default_range(),
            apps: Vec::new(),
            listen_tcp: Vec::new(),
            listen_udp: Vec::new(),
            ip: None,
            kernel_ports: default_kernel_ports(),
            allow_well_known: false,
            balance: default_balance(),
        }
    }
}

/// The kernel's port settings the model is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelPorts {
    /// `net.ipv4.ip_local_port_range`: the kernel's ephemeral (client) ports.
    pub ephemeral: PortRange,
    /// `net.ipv4.ip_local_reserved_ports`: ports the kernel never picks as ephemeral.
    pub reserved: Vec<PortRange>,
    /// Ports of the kernel's own servers: TCP sockets in LISTEN and bound UDP sockets
    /// (`/proc/net/{tcp,tcp6,udp,udp6}`), sorted; luna must not claim them.
    pub listeners: Vec<(L4, u16)>,
}

impl KernelPorts {
    /// Linux's default (`32768 60999`, nothing reserved).
    pub fn linux_default() -> Self {
        KernelPorts {
            ephemeral: PortRange::new(32768, 60999).expect("non-empty"),
            reserved: Vec::new(),
            listeners: Vec::new(),
        }
    }

    /// Reads `/proc/sys/net/ipv4/ip_local_port_range` and `ip_local_reserved_ports`.
    pub fn from_proc() -> Result<Self, ModelError> {
        let read = |p: &str| {
            std::fs::read_to_string(p).map_err(|e| ModelError {
                key: p.into(),
                problem: format!("cannot read it: {e}"),
                fix: "run on Linux with /proc mounted, or pass the kernel's ranges explicitly"
                    .into(),
            })
        };
        let range = read("/proc/sys/net/ipv4/ip_local_port_range")?;
        let reserved = read("/proc/sys/net/ipv4/ip_local_reserved_ports").unwrap_or_default();
        let mut k = Self::parse(&range, &reserved)?;
        for (proto, file) in [
            (L4::Tcp, "/proc/net/tcp"),
            (L4::Tcp, "/proc/net/tcp6"),
            (L4::Udp, "/proc/net/udp"),
            (L4::Udp, "/proc/net/udp6"),
        ] {
            // tcp6/udp6 are absent when IPv6 is disabled: nothing listens there then.
            if let Ok(text) = std::fs::read_to_string(file) {
                k.listeners
                    .extend(parse_proc_net(proto, &text).into_iter().map(|p| (proto, p)));
            }
        }
        k.listeners.sort_unstable();
        k.listeners.dedup();
        Ok(k)
    }

    /// Parses the two files' contents: `"32768\t60999"` and `"8080,9000-9010"`.
    pub fn parse(port_range: &str, reserved: &str) -> Result<Self, ModelError> {
        let bad = |what: &str, text: &str| ModelError {
            key: what.into(),
            problem: format!("cannot parse {text:?}"),
            fix: "expected `first last` (port_range) and `p,a-b,...` (reserved_ports)".into(),
        };
        let nums: Vec<u16> = port_range
            .split_whitespace()
            .map(|w| w.parse::<u16>())
            .collect::<Result<_, _>>()
            .map_err(|_| bad("net.ipv4.ip_local_port_range", port_range))?;
        let [lo, hi] = nums[..] else {
            return Err(bad("net.ipv4.ip_local_port_range", port_range));
        };
        let ephemeral = PortRange::new(lo, hi)
            .ok_or_else(|| bad("net.ipv4.ip_local_port_range", port_range))?;
        let mut res = Vec::new();
        for part in reserved.trim().split(',').filter(|p| !p.trim().is_empty()) {
            let part = part.trim();
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            let r = match (a.trim().parse::<u16>(), b.trim().parse::<u16>()) {
                (Ok(a), Ok(b)) => PortRange::new(a, b),
                _ => None,
            };
            res.push(r.ok_or_else(|| bad("net.ipv4.ip_local_reserved_ports", reserved))?);
        }
        Ok(KernelPorts {
            ephemeral,
            reserved: res,
            listeners: Vec::new(),
        })
    }

    /// Whether the kernel may pick `port` as an ephemeral port.
    pub fn may_pick(&self, port: u16) -> bool {
        self.ephemeral.contains(port) && !self.reserved.iter().any(|r| r.contains(port))
    }
}

/// Local ports of the server sockets in one `/proc/net/{tcp,udp}[6]` table: TCP in
/// state LISTEN (`0A`), UDP in any state (a bound UDP socket receives). Lines that do not
/// parse are skipped (the header, or a future format).
pub fn parse_proc_net(proto: L4, text: &str) -> Vec<u16> {
    let mut out: Vec<u16> = text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let local = f.nth(1)?;
            let st = f.nth(1)?;
            let port = u16::from_str_radix(local.rsplit_once(':')?.1, 16).ok()?;
            let listening = match proto {
                L4::Tcp => st == "0A",
                // UDP client sockets use ephemeral ports; only count the fixed ones.
                L4::Udp => true,
            };
            (listening && port != 0).then_some(port)
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// A problem with the traffic model: the key, what is wrong, and the fix (shaped like
/// r2c's `ConfigError`, so r2c can map one onto the other).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelError {
    /// Dotted key (`traffic.listen_tcp`) or the sysctl concerned.
    pub key: String,
    /// What is wrong.
    pub problem: String,
    /// How to fix it.
    pub fix: String,
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "traffic model `{}`: {}; fix: {}",
            self.key, self.problem, self.fix
        )
    }
}

impl std::error::Error for ModelError {}

fn err(key: impl Into<String>, problem: impl Into<String>, fix: impl Into<String>) -> ModelError {
    ModelError {
        key: key.into(),
        problem: problem.into(),
        fix: fix.into(),
    }
}

/// A validated traffic model.
#[derive(Debug, Clone, PartialEq)]
pub struct TrafficModel {
    plan: PartitionPlan,
    listen_tcp: Vec<u16>,
    listen_udp: Vec<u16>,
    ip: Option<Ipv4Addr>,
    /// More addresses luna's stack owns besides `ip` (see [`TrafficModel::add_address`]).
    more_ips: Vec<Ipv4Addr>,
    kernel_ports: Vec<u16>,
}

impl TrafficConfig {
    /// Parses a `[traffic]` table's body (the keys, without the header).
    pub fn from_toml(text: &str) -> Result<Self, ModelError> {
        toml::from_str(text).map_err(|e| {
            err(
                "traffic",
                e.to_string().trim_end().replace('\n', " "),
                "see the example in bifurcation's model docs",
            )
        })
    }

    /// Parses a whole config file and takes its `[traffic]` section (defaults if absent;
    /// other sections are left to their owners).
    pub fn from_config_file_text(text: &str) -> Result<Self, ModelError> {
        let mut t: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| err("<toml>", e.to_string(), "fix the TOML syntax"))?;
        match t.remove("traffic") {
            None => Ok(TrafficConfig::default()),
            Some(v) => v.try_into().map_err(|e: toml::de::Error| {
                err(
                    "traffic",
                    e.to_string().trim_end().replace('\n', " "),
                    "see the example in bifurcation's model docs",
                )
            }),
        }
    }

    /// Checks the config against the kernel's port settings and builds the model.
    pub fn validate(&self, kernel: &KernelPorts) -> Result<TrafficModel, ModelError> {
        let [lo, hi] = self.client_range;
        let range = PortRange::new(lo, hi).ok_or_else(|| {
            err(
                "traffic.client_range",
                format!("[{lo}, {hi}] is empty or contains port 0"),
                "write [first, last] with 0 < first <= last, e.g. [61440, 65535]",
            )
        })?;
        if !self.balance.is_finite() || !(0.0..=0.5).contains(&self.balance) {
            return Err(err(
                "traffic.balance",
                format!("{} is outside 0..=0.5", self.balance),
                "use 0 for an exact even split, or a small fraction such as 0.0625",
            ));
        }
        if let Some(p) = range.iter().find(|&p| kernel.may_pick(p)) {
            return Err(err(
                "traffic.client_range",
                format!(
                    "luna's client range {range} overlaps the kernel's ephemeral range {} \
                     (port {p} and maybe more): the kernel could pick a port whose replies \
                     the NIC steers to luna",
                    kernel.ephemeral
                ),
                {
                    let (lo, hi) = if kernel.ephemeral.first() < range.first() {
                        (kernel.ephemeral.first(), range.first() - 1)
                    } else {
                        (32768, 60999)
                    };
                    format!(
                        "move the kernel's range off it (sysctl -w net.ipv4.ip_local_port_range=\"{lo} {hi}\"), \
                         or reserve it (sysctl -w net.ipv4.ip_local_reserved_ports={}-{})",
                        range.first(),
                        range.last()
                    )
                },
            ));
        }
        for &k in &self.kernel_ports {
            if range.contains(k) {
                return Err(err(
                    "traffic.kernel_ports",
                    format!("kernel port {k} lies inside luna's client range {range}"),
                    "move the client range or drop the port from kernel_ports",
                ));
            }
        }
        for &(proto, p) in &kernel.listeners {
            if proto == L4::Tcp && range.contains(p) {
                return Err(err(
                    "traffic.client_range",
                    format!(
                        "a kernel TCP server listens on port {p}, inside luna's client range {range}: \
                         its clients' packets would be steered to luna"
                    ),
                    "move that server to another port, or move luna's client range",
                ));
            }
        }
        let mut seen: Vec<(L4, u16)> = Vec::new();
        for (proto, key, ports) in [
            (L4::Tcp, "traffic.listen_tcp", &self.listen_tcp),
            (L4::Udp, "traffic.listen_udp", &self.listen_udp),
        ] {
            for &p in ports {
                if p == 0 {
                    return Err(err(key, "port 0", "listen on a port from 1 to 65535"));
                }
                if seen.contains(&(proto, p)) {
                    return Err(err(
                        key,
                        format!("{proto} port {p} is listed twice"),
                        "list each port once",
                    ));
                }
                seen.push((proto, p));
                if self.kernel_ports.contains(&p) {
                    return Err(err(
                        key,
                        format!("{proto} port {p} is one of the kernel's ports (kernel_ports)"),
                        "pick another port: the kernel keeps these (ssh is 22)",
                    ));
                }
                if kernel.listeners.contains(&(proto, p)) {
                    return Err(err(
                        key,
                        format!("a kernel socket already serves {proto} port {p}"),
                        "stop the kernel's server on that port, or give luna another port",
                    ));
                }
                if p < 1024 && !self.allow_well_known {
                    return Err(err(
                        key,
                        format!("{proto} port {p} is a well-known port (below 1024)"),
                        "pick a port >= 1024, or set allow_well_known = true if luna must serve it",
                    ));
                }
                if range.contains(p) {
                    return Err(err(
                        key,
                        format!("{proto} port {p} lies inside luna's client range {range}"),
                        "listen outside the client range: its ports are steered per thread",
                    ));
                }
                if kernel.may_pick(p) {
                    return Err(err(
                        key,
                        format!(
                            "{proto} port {p} lies in the kernel's ephemeral range {}: a kernel \
                             client could use it as its source port and lose its replies to luna",
                            kernel.ephemeral
                        ),
                        format!(
                            "pick a port outside it, or reserve it (sysctl -w net.ipv4.ip_local_reserved_ports={p})"
                        ),
                    ));
                }
            }
        }
        if self.apps.is_empty() {
            return Err(err(
                "traffic.apps",
                "no applications: the client range has no thread split",
                "add at least one, e.g. apps = [{ name = \"knb\", threads = 2 }]",
            ));
        }
        let mut specs = Vec::new();
        let mut next_queue: u32 = 0;
        let mut used_queues: Vec<(u16, String)> = Vec::new();
        for (i, a) in self.apps.iter().enumerate() {
            let key = format!("traffic.apps[{i}]");
            let share = match &a.ports {
                SharePorts::Word(w) if w == "rest" => Share::Rest,
                SharePorts::Word(w) => {
                    return Err(err(
                        format!("{key}.ports"),
                        format!("unknown word {w:?}"),
                        "write ports = \"rest\", ports = 1024 or ports = [61440, 62463]",
                    ))
                }
                SharePorts::Count(0) => {
                    return Err(err(
                        format!("{key}.ports"),
                        "0 ports",
                        "give the application at least one port per thread",
                    ))
                }
                SharePorts::Count(n) => Share::Count(*n),
                SharePorts::Range([a, b]) => {
                    Share::Range(PortRange::new(*a, *b).ok_or_else(|| {
                        err(
                            format!("{key}.ports"),
                            format!("[{a}, {b}] is empty or contains port 0"),
                            "write [first, last] with first <= last",
                        )
                    })?)
                }
            };
            let threads = a.threads.unwrap_or(1);
            if threads == 0 {
                return Err(err(
                    format!("{key}.threads"),
                    format!(
                        "application `{}` has 0 threads: an empty thread split",
                        a.name
                    ),
                    "give it at least one thread",
                ));
            }
            let queues: Vec<u16> = match &a.queues {
                Some(q) => {
                    if q.len() != usize::from(threads) {
                        return Err(err(
                            format!("{key}.queues"),
                            format!("{} queues for {threads} threads", q.len()),
                            "list one queue per thread, or drop `queues`",
                        ));
                    }
                    q.clone()
                }
                None => {
                    let last = next_queue + u32::from(threads) - 1;
                    if last > u32::from(u16::MAX) {
                        return Err(err(
                            format!("{key}.threads"),
                            "queue numbers beyond 65535",
                            "use fewer threads",
                        ));
                    }
                    (next_queue..=last).map(|q| q as u16).collect()
                }
            };
            for &q in &queues {
                if let Some((_, other)) = used_queues.iter().find(|(u, _)| *u == q) {
                    return Err(err(
                        format!("{key}.queues"),
                        format!("queue {q} is used by `{other}` and by `{}`", a.name),
                        "give every thread its own receive queue",
                    ));
                }
                used_queues.push((q, a.name.clone()));
                next_queue = next_queue.max(u32::from(q) + 1);
            }
            let mut spec = AppSpec::new(a.name.clone(), share, 0);
            spec.threads = queues
                .iter()
                .enumerate()
                .map(|(t, &queue)| ThreadSlot {
                    thread: t as u16,
                    queue,
                })
                .collect();
            specs.push(spec);
        }
        let plan = PartitionPlan::build_aligned(range, &specs, self.balance).map_err(|e| {
            let key = match e {
                PlanError::NoThreads(_) | PlanError::DuplicateThread { .. } => "traffic.apps",
                PlanError::OutsideReserved { .. } | PlanError::Overlap { .. } => {
                    "traffic.apps[].ports"
                }
                _ => "traffic.apps",
            };
            err(
                key,
                e.to_string(),
                "every client port must belong to exactly one application thread",
            )
        })?;
        let mut listen_tcp = self.listen_tcp.clone();
        let mut listen_udp = self.listen_udp.clone();
        listen_tcp.sort_unstable();
        listen_udp.sort_unstable();
        let mut kernel_ports = self.kernel_ports.clone();
        kernel_ports.sort_unstable();
        kernel_ports.dedup();
        if let Some(ip) = self.ip {
            if ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast() {
                return Err(err(
                    "traffic.ip",
                    format!("{ip} is not a unicast address"),
                    "give the host's unicast IPv4 address, or drop `ip`",
                ));
            }
        }
        Ok(TrafficModel {
            plan,
            listen_tcp,
            listen_udp,
            ip: self.ip,
            more_ips: Vec::new(),
            kernel_ports,
        })
    }
}

/// Who owns a transport port, according to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortOwner {
    /// A thread's share of the client range.
    Client {
        /// Application index in the plan.
        app: usize,
        /// Thread within the application.
        thread: u16,
        /// The thread's receive queue.
        queue: u16,
    },
    /// One of luna's listening ports (connections spread over threads by RSS).
    Listener,
    /// The kernel.
    Kernel,
}

impl TrafficModel {
    /// The client range's partition.
    pub fn plan(&self) -> &PartitionPlan {
        &self.plan
    }

    /// Luna's listening TCP ports, sorted.
    pub fn listen_tcp(&self) -> &[u16] {
        &self.listen_tcp
    }

    /// Luna's UDP ports, sorted.
    pub fn listen_udp(&self) -> &[u16] {
        &self.listen_udp
    }

    /// The address luna's packets must carry, if any.
    pub fn ip(&self) -> Option<Ipv4Addr> {
        self.ip
    }

    /// Whether packets to `dst` may be luna's: `dst` is the model's address or one added
    /// with [`TrafficModel::add_address`] (any address when the model has no `ip`).
    pub fn is_lunas_address(&self, dst: Ipv4Addr) -> bool {
        match self.ip {
            None => true,
            Some(ip) => dst == ip || self.more_ips.contains(&dst),
        }
    }

    /// Luna's stack owns `addr` too (an address the kernel added to the exception
    /// interface, mirrored by netlink-sync into every core's stack): luna's ports on it
    /// are luna's. No effect without an `ip` (every address is then luna's). Returns
    /// whether it was new.
    pub fn add_address(&mut self, addr: Ipv4Addr) -> bool {
        if self.ip.is_none() || self.is_lunas_address(addr) {
            return false;
        }
        self.more_ips.push(addr);
        true
    }

    /// Luna's stack no longer owns `addr` (added before); the model's own `ip` stays.
    /// Returns whether it was there.
    pub fn remove_address(&mut self, addr: Ipv4Addr) -> bool {
        let before = self.more_ips.len();
        self.more_ips.retain(|&a| a != addr);
        self.more_ips.len() != before
    }

    /// Ports that stay with the kernel, sorted.
    pub fn kernel_ports(&self) -> &[u16] {
        &self.kernel_ports
    }

    /// Who owns destination port `port` of `proto`.
    pub fn owner(&self, proto: L4, port: u16) -> PortOwner {
        match proto {
            L4::Tcp => {
                if self.listen_tcp.binary_search(&port).is_ok() {
                    return PortOwner::Listener;
                }
                match self.plan.owner(port) {
                    Some(a) => PortOwner::Client {
                        app: a.app,
                        thread: a.slot.thread,
                        queue: a.slot.queue,
                    },
                    None => PortOwner::Kernel,
                }
            }
            L4::Udp => {
                if self.listen_udp.binary_search(&port).is_ok() {
                    PortOwner::Listener
                } else {
                    PortOwner::Kernel
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel() -> KernelPorts {
        KernelPorts::linux_default()
    }

    fn model(text: &str) -> Result<TrafficModel, ModelError> {
        TrafficConfig::from_toml(text)?.validate(&kernel())
    }

    const GOOD: &str = r#"
        listen_tcp = [7000]
        listen_udp = [7001]
        ip = "198.18.0.1"
        apps = [{ name = "ebs", threads = 12 }, { name = "oss", threads = 6 }]
    "#;

    #[test]
    fn good_config_builds_the_model() {
        let m = model(GOOD).unwrap();
        assert_eq!(m.plan().apps().len(), 2);
        assert_eq!(m.plan().apps()[1].threads[0].queue, 12);
        assert_eq!(m.owner(L4::Tcp, 7000), PortOwner::Listener);
        assert_eq!(m.owner(L4::Udp, 7001), PortOwner::Listener);
        assert_eq!(m.owner(L4::Tcp, 22), PortOwner::Kernel);
        assert_eq!(m.owner(L4::Udp, 61440), PortOwner::Kernel);
        assert!(matches!(
            m.owner(L4::Tcp, 61440),
            PortOwner::Client {
                app: 0,
                thread: 0,
                queue: 0
            }
        ));
        assert!(matches!(
            m.owner(L4::Tcp, 65535),
            PortOwner::Client {
                app: 1,
                thread: 5,
                queue: 17
            }
        ));
    }

    #[test]
    fn whole_config_file_section() {
        let text = format!("eal = []\n[device]\nkind = \"mem\"\n[traffic]\n{GOOD}");
        let c = TrafficConfig::from_config_file_text(&text).unwrap();
        assert_eq!(c.listen_tcp, vec![7000]);
        assert_eq!(
            TrafficConfig::from_config_file_text("eal = []").unwrap(),
            TrafficConfig::default()
        );
    }

    #[test]
    fn client_range_overlapping_ephemeral_is_rejected() {
        let k = KernelPorts::parse("32768 65000", "").unwrap();
        let c = TrafficConfig::from_toml("apps = [{ name = \"a\" }]").unwrap();
        let e = c.validate(&k).unwrap_err();
        assert_eq!(e.key, "traffic.client_range");
        assert!(e.problem.contains("ephemeral"), "{e}");
        assert!(e.fix.contains("ip_local_port_range=\"32768 61439\""), "{e}");
        // Reserving the client range in the kernel makes it fine.
        let k = KernelPorts::parse("32768 65000", "61440-65535").unwrap();
        c.validate(&k).unwrap();
    }

    #[test]
    fn listen_port_in_ephemeral_range_is_rejected_unless_reserved() {
        let c =
            TrafficConfig::from_toml("listen_tcp = [40000]\napps = [{ name = \"a\" }]").unwrap();
        let e = c.validate(&kernel()).unwrap_err();
        assert_eq!(e.key, "traffic.listen_tcp");
        assert!(e.problem.contains("ephemeral"), "{e}");
        let k = KernelPorts::parse("32768\t60999\n", "8080,40000").unwrap();
        c.validate(&k).unwrap();
    }

    #[test]
    fn ssh_and_well_known_ports_are_rejected() {
        let e = model("listen_tcp = [22]\napps = [{ name = \"a\" }]").unwrap_err();
        assert!(e.problem.contains("kernel's ports"), "{e}");
        let e = model("listen_tcp = [80]\napps = [{ name = \"a\" }]").unwrap_err();
        assert!(e.problem.contains("well-known"), "{e}");
        model("listen_tcp = [80]\nallow_well_known = true\napps = [{ name = \"a\" }]").unwrap();
        let e = model("kernel_ports = [62000]\napps = [{ name = \"a\" }]").unwrap_err();
        assert_eq!(e.key, "traffic.kernel_ports");
    }

    #[test]
    fn overlapping_ranges_are_rejected() {
        let e = model(
            "apps = [{ name = \"a\", ports = [61440, 62000] }, { name = \"b\", ports = [61900, 65535] }]",
        )
        .unwrap_err();
        assert!(e.problem.contains("overlap"), "{e}");
        let e = model("listen_tcp = [61500]\napps = [{ name = \"a\" }]").unwrap_err();
        assert!(e.problem.contains("inside luna's client range"), "{e}");
        let e = model("listen_tcp = [7000, 7000]\napps = [{ name = \"a\" }]").unwrap_err();
        assert!(e.problem.contains("twice"), "{e}");
        let e = model("apps = [{ name = \"a\", ports = [1000, 2000] }]").unwrap_err();
        assert!(e.problem.contains("outside the reserved range"), "{e}");
    }

    #[test]
    fn empty_thread_split_is_rejected() {
        let e = model("listen_tcp = [7000]").unwrap_err();
        assert_eq!(e.key, "traffic.apps");
        assert!(e.problem.contains("no thread split"), "{e}");
        let e = model("apps = [{ name = \"a\", threads = 0 }]").unwrap_err();
        assert!(e.problem.contains("empty thread split"), "{e}");
        let e = model("apps = [{ name = \"a\", threads = 2, queues = [0] }]").unwrap_err();
        assert!(e.problem.contains("1 queues for 2 threads"), "{e}");
        let e = model(
            "apps = [{ name = \"a\", threads = 2 }, { name = \"b\", threads = 1, queues = [1] }]",
        )
        .unwrap_err();
        assert!(e.problem.contains("queue 1 is used by"), "{e}");
    }

    #[test]
    fn syntax_and_unknown_keys_are_clear_errors() {
        let e = TrafficConfig::from_toml("listen_tpc = [7000]").unwrap_err();
        assert!(e.problem.contains("listen_tpc"), "{e}");
        let e = TrafficConfig::from_toml("listen_tcp = [70000]").unwrap_err();
        assert_eq!(e.key, "traffic");
        let e = model("client_range = [65535, 61440]\napps = [{ name = \"a\" }]").unwrap_err();
        assert_eq!(e.key, "traffic.client_range");
        let e = model("balance = 2.0\napps = [{ name = \"a\" }]").unwrap_err();
        assert_eq!(e.key, "traffic.balance");
        let e = model("ip = \"224.0.0.1\"\napps = [{ name = \"a\" }]").unwrap_err();
        assert_eq!(e.key, "traffic.ip");
    }

    #[test]
    fn kernel_ports_parse() {
        let k = KernelPorts::parse("32768\t60999\n", "").unwrap();
        assert_eq!(k, KernelPorts::linux_default());
        assert!(KernelPorts::parse("60999", "").is_err());
        assert!(KernelPorts::parse("a b", "").is_err());
        assert!(KernelPorts::parse("1 2", "5-").is_err());
        let k = KernelPorts::parse("1024 65535", "22,61440-65535\n").unwrap();
        assert!(!k.may_pick(61440));
        assert!(k.may_pick(2000));
    }

    #[test]
    fn kernel_listeners_conflict_with_luna_ports() {
        let tcp = "  sl  local_address rem_address   st tx_queue ...\n\
           0: 00000000:1B58 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n\
           1: 0100007F:F230 0100007F:869B 06 00000000:00000000 03:0000032B 00000000     0        0 0 3\n\
           2: 00000000:F618 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1\n\
           garbage\n";
        // 0x1B58 = 7000 and 0xF618 = 63000 listen; 0xF230 is an established socket.
        assert_eq!(parse_proc_net(L4::Tcp, tcp), vec![7000, 63000]);
        let mut k = kernel();
        k.listeners = vec![(L4::Tcp, 7000)];
        let c = TrafficConfig::from_toml("listen_tcp = [7000]\napps = [{ name = \"a\" }]").unwrap();
        let e = c.validate(&k).unwrap_err();
        assert!(
            e.problem
                .contains("kernel socket already serves tcp port 7000"),
            "{e}"
        );
        // The same port in UDP is not a conflict.
        let c = TrafficConfig::from_toml("listen_udp = [7000]\napps = [{ name = \"a\" }]").unwrap();
        c.validate(&k).unwrap();
        k.listeners = vec![(L4::Tcp, 63000)];
        let c = TrafficConfig::from_toml("apps = [{ name = \"a\" }]").unwrap();
        let e = c.validate(&k).unwrap_err();
        assert_eq!(e.key, "traffic.client_range");
        assert!(e.problem.contains("listens on port 63000"), "{e}");
    }

    #[test]
    fn this_hosts_proc_is_readable() {
        // Whatever the host's settings are, they parse.
        KernelPorts::from_proc().unwrap();
    }
}
