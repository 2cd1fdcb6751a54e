//! Topologies built from network namespaces, addresses from 198.18.0.0/15 only.
//!
//! | kind | namespaces | what it joins | subnet |
//! |---|---|---|---|
//! | `memif` | `<p>-memif` | DPDK server ⇄ DPDK client over net_memif | 198.18.3.0/24 |
//! | `tap` | `<p>-tap` | DPDK (net_tap) ⇄ kernel host on the tap | 198.18.0.0/24 |
//! | `afpacket` | `<p>-afp-dut`, `<p>-afp-host` | DPDK (net_af_packet on a veth end) ⇄ kernel host | 198.18.1.0/24 |
//! | `veth` | `<p>-k1`, `<p>-k2` | kernel host ⇄ kernel host, MTU 1500 (the baseline) | 198.18.2.0/24 |
//! | `coexist` | `<p>-cx-host`, `<p>-cx-wire` | luna (net_af_packet on a veth end) and the kernel (exception tap) on one "NIC" ⇄ kernel clients | 198.18.4.0/24 |
//!
//! Every name is derived from the prefix, so [`Topology::up`] is idempotent and
//! [`crate::sweep()`] finds whatever a crash left behind.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fmt;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::impair::{self, Backend, Impairment};
use crate::nfq::{EngineStats, EngineThread};
use crate::prefix::Prefix;
use crate::sys;

/// The topologies the testbed can build.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Kind {
    /// Two DPDK processes over net_memif.
    Memif,
    /// A DPDK process on net_tap, the kernel host on the tap's kernel side.
    Tap,
    /// A DPDK process on net_af_packet over a veth pair to a kernel host.
    AfPacket,
    /// Two kernel hosts over veth: the kernel baseline.
    Veth,
    /// Kernel coexistence (issue 11): a host namespace whose "NIC" is a veth end bound by
    /// DPDK's net_af_packet, facing a wire namespace with kernel clients; the DPDK
    /// process also creates the exception tap in the host namespace, which carries the
    /// NIC's MAC and luna's IP in the kernel.
    Coexist,
}

impl Kind {
    /// All kinds, in a stable order.
    pub const ALL: [Kind; 5] = [
        Kind::Memif,
        Kind::Tap,
        Kind::AfPacket,
        Kind::Veth,
        Kind::Coexist,
    ];

    /// The name used on the command line and in state files.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Memif => "memif",
            Kind::Tap => "tap",
            Kind::AfPacket => "afpacket",
            Kind::Veth => "veth",
            Kind::Coexist => "coexist",
        }
    }

    /// The links of this kind that can carry an impairment (kernel-side interfaces).
    pub fn links(self) -> &'static [&'static str] {
        match self {
            Kind::Memif => &[],
            Kind::Tap => &["tap"],
            Kind::AfPacket => &["host"],
            Kind::Veth => &["k1", "k2"],
            Kind::Coexist => &["wire"],
        }
    }

    /// The kind that owns impairable link `link` (link names are unique across kinds).
    pub fn of_link(link: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.links().contains(&link))
    }

    /// Comma-separated names of all kinds, for messages.
    pub fn valid_names() -> String {
        Kind::ALL.map(Kind::name).join(", ")
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| Error::UnknownTopology {
                given: s.to_string(),
                valid: Kind::valid_names(),
            })
    }
}

/// An Ethernet address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// Locally administered MACs `02:00:00:00:<subnet>:<host>`, deterministic per topology.
const fn mac(subnet: u8, host: u8) -> MacAddr {
    MacAddr([0x02, 0, 0, 0, subnet, host])
}

const fn addr(subnet: u8, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, subnet, host)
}

/// Prefix length of every topology subnet.
pub const PREFIX_LEN: u8 = 24;
/// MTU of every link the testbed creates (the kernel baseline's).
pub const MTU: u32 = 1500;

/// DPDK EAL arguments for one process. Fields are public so a caller can adjust them
/// (more lcores, more memory) before building the command line with [`EalArgs::args`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EalArgs {
    /// `--file-prefix`: unique per process, starts with the testbed prefix.
    pub file_prefix: String,
    /// `-l`: lcore list, e.g. `0` or `0,1`.
    pub lcores: String,
    /// `-m`: hugepage memory in MiB.
    pub memory_mb: u32,
    /// `--vdev`: the virtual device string.
    pub vdev: String,
    /// Appended verbatim.
    pub extra: Vec<String>,
}

impl EalArgs {
    /// The EAL argument vector, without `argv[0]` and without the `--` that ends it.
    ///
    /// `--huge-unlink` removes hugepage files once mapped, so a killed process leaks no
    /// hugepages; `--no-pci` because there is no NIC.
    pub fn args(&self) -> Vec<String> {
        let mut a = vec![
            "--file-prefix".to_string(),
            self.file_prefix.clone(),
            "--no-pci".into(),
            "--huge-unlink".into(),
            "-m".into(),
            self.memory_mb.to_string(),
            "-l".into(),
            self.lcores.clone(),
            "--vdev".into(),
            self.vdev.clone(),
        ];
        a.extend(self.extra.iter().cloned());
        a
    }
}

/// One DPDK endpoint: where it runs, its addresses, its peer's, and its EAL arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DpdkPort {
    /// The namespace the DPDK process must run in (see [`DpdkPort::command`]).
    pub netns: String,
    /// The stack's IPv4 address on this port.
    pub ip: Ipv4Addr,
    /// Prefix length of `ip`.
    pub prefix_len: u8,
    /// The port's MAC (set by the vdev arguments or the veth end it binds).
    pub mac: MacAddr,
    /// The peer's IPv4 address.
    pub peer_ip: Ipv4Addr,
    /// The peer's MAC.
    pub peer_mac: MacAddr,
    /// EAL arguments.
    pub eal: EalArgs,
}

impl DpdkPort {
    /// `ip netns exec <netns> <program> <EAL args>`: add `--` and application arguments.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = sys::netns_command(&self.netns, program);
        c.args(self.eal.args());
        c
    }
}

/// A kernel TCP/IP host: one interface in one namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelHost {
    /// Its namespace.
    pub netns: String,
    /// Its interface.
    pub iface: String,
    /// Its IPv4 address.
    pub ip: Ipv4Addr,
    /// Prefix length of `ip`.
    pub prefix_len: u8,
    /// Its MAC.
    pub mac: MacAddr,
    /// Interface MTU.
    pub mtu: u32,
}

impl KernelHost {
    /// A `Command` running `program` in this host's namespace.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        sys::netns_command(&self.netns, program)
    }

    /// A `Command` running `program` in this host's namespace pinned to `core` (taskset).
    pub fn pinned_command(&self, core: usize, program: impl AsRef<OsStr>) -> Command {
        sys::netns_command_pinned(&self.netns, core, program)
    }

    /// Adds a permanent neighbour entry (no ARP needed to reach `ip`).
    pub fn set_static_neighbor(&self, ip: Ipv4Addr, mac: MacAddr) -> Result<()> {
        let (ip, mac) = (ip.to_string(), mac.to_string());
        sys::ip_in(
            &self.netns,
            &[
                "neigh",
                "replace",
                &ip,
                "lladdr",
                &mac,
                "dev",
                &self.iface,
                "nud",
                "permanent",
            ],
        )
        .map(|_| ())
    }

    /// Sets MAC, MTU and address and brings the interface up (idempotent).
    fn configure(&self) -> Result<()> {
        let ns = &self.netns;
        let (mac, mtu) = (self.mac.to_string(), self.mtu.to_string());
        let cidr = format!("{}/{}", self.ip, self.prefix_len);
        sys::sysctl_in(
            ns,
            &format!("net.ipv6.conf.{}.disable_ipv6", self.iface),
            "1",
        )?;
        if sys::ip_in(ns, &["link", "set", "dev", &self.iface, "address", &mac]).is_err() {
            // Some drivers refuse a MAC change while up.
            sys::ip_in(ns, &["link", "set", "dev", &self.iface, "down"])?;
            sys::ip_in(ns, &["link", "set", "dev", &self.iface, "address", &mac])?;
        }
        sys::ip_in(ns, &["link", "set", "dev", &self.iface, "mtu", &mtu])?;
        sys::ip_in(ns, &["addr", "replace", &cidr, "dev", &self.iface])?;
        sys::ip_in(ns, &["link", "set", "dev", &self.iface, "up"])?;
        Ok(())
    }
}

/// `memif`: two DPDK processes over shared memory; the socket lives in the state dir.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Memif {
    /// Namespace both processes run in (keeps them findable by `sweep`).
    pub netns: String,
    /// The memif control socket (filesystem, not abstract).
    pub socket: PathBuf,
    /// role=server, 198.18.3.1, lcore 0.
    pub server: DpdkPort,
    /// role=client, 198.18.3.2, lcore 1.
    pub client: DpdkPort,
}

/// `tap`: DPDK creates the tap inside `host.netns`; that namespace's kernel is the host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tap {
    /// The kernel side: the tap interface DPDK creates, 198.18.0.1.
    pub host: KernelHost,
    /// The DPDK side, 198.18.0.2, same namespace.
    pub dpdk: DpdkPort,
}

impl Tap {
    /// Waits up to `timeout` for the DPDK process to create the tap, then sets the kernel
    /// side's MAC, address and MTU and brings it up. Call after starting DPDK.
    pub fn configure_host(&self, timeout: Duration) -> Result<()> {
        let h = &self.host;
        if !configure_tap_host(h, &self.dpdk.eal.vdev, timeout)? {
            return Err(Error::Timeout {
                what: format!("tap interface {} in namespace {}, started by DPDK", h.iface, h.netns),
                after: timeout,
                hint: "is the DPDK process running in that namespace with the testbed's vdev (net_tap, iface=...) and its port started? check its output",
            });
        }
        Ok(())
    }
}

/// `afpacket`: DPDK binds `dut_iface` (no kernel address) in `dpdk.netns`; its veth peer
/// is the kernel host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AfPacket {
    /// The kernel host, 198.18.1.1.
    pub host: KernelHost,
    /// The DPDK side, 198.18.1.2 (MAC of `dut_iface`).
    pub dpdk: DpdkPort,
    /// The veth end DPDK's net_af_packet binds.
    pub dut_iface: String,
}

/// `veth`: two kernel hosts, the baseline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Veth {
    /// 198.18.2.1.
    pub k1: KernelHost,
    /// 198.18.2.2.
    pub k2: KernelHost,
}

/// `coexist`: luna and the kernel share one "NIC" (see [`Kind::Coexist`]).
///
/// The NIC is `nic_iface` in `dpdk.netns` (no kernel address, ARP off, and its IPv4 input
/// dropped by an iptables raw rule, so only DPDK's packet socket sees its frames; the
/// kernel's view of the NIC is the exception tap). The DPDK process opens the NIC as
/// `dpdk.eal.vdev` and the exception tap as `exception_vdev` (already in
/// `dpdk.eal.extra`); after it started, [`Coexist::configure_exception`] gives the tap
/// the NIC's MAC and luna's IP.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coexist {
    /// The kernel client side, 198.18.4.1, in its own namespace.
    pub wire: KernelHost,
    /// luna on the NIC, 198.18.4.2 (MAC of `nic_iface`), in the host namespace.
    pub dpdk: DpdkPort,
    /// The veth end DPDK's net_af_packet binds (the NIC).
    pub nic_iface: String,
    /// The exception interface as the kernel sees it: the tap DPDK creates, with the
    /// NIC's MAC and the same IP as luna.
    pub exception: KernelHost,
    /// The `--vdev` of the exception port (net_tap).
    pub exception_vdev: String,
    /// Its DPDK port name.
    pub exception_port: String,
    /// A luna client in the wire namespace beside the kernel clients: net_af_packet on
    /// the wire veth (`wire.iface`, whose MAC it shares; the kernel keeps its own
    /// address there), with its own IP, 198.18.4.4, that the wire kernel does not own.
    /// The topology drops that IP's IPv4 input in the wire kernel (iptables raw; a
    /// packet socket sees the frames before that), so only luna acts on them; luna
    /// answers ARP for it. lcore 0, its own file prefix.
    pub wire_dpdk: DpdkPort,
}

impl Coexist {
    /// Waits up to `timeout` for the DPDK process to create the exception tap, then
    /// configures it (MAC, MTU, luna's address, up).
    pub fn configure_exception(&self, timeout: Duration) -> Result<()> {
        let h = &self.exception;
        if !configure_tap_host(h, &self.exception_vdev, timeout)? {
            return Err(Error::Timeout {
                what: format!("exception tap {} in namespace {}, started by DPDK", h.iface, h.netns),
                after: timeout,
                hint: "is the DPDK process running with the topology's exception vdev (net_tap) and its port started? check its output",
            });
        }
        Ok(())
    }
}

/// Waits up to `timeout` until DPDK's net_tap has created `h`'s interface and started
/// the port, then configures the host side so that it stays configured.
///
/// net_tap gives the kernel netdev the port's MAC (the vdev's `mac=`) twice: when it
/// creates it (`eth_dev_tap_create`), and again when the port starts — ethdev's
/// `rte_eth_dev_start` brings the netdev up (`tap_link_set_up`) and then replays the
/// port's MAC (`eth_dev_mac_restore` → `tap_mac_set`, which rewrites the netdev's MAC
/// when it differs). A host configured before that lost its MAC to the port's, and with
/// both ends on one MAC the DPDK side drops every frame from the kernel as its own: ARP
/// never resolved (the preload tests' intermittent connect timeout and "No route to
/// host"). So: wait for the netdev to be up with the port's MAC (started), configure,
/// and check a little later that the MAC held, configuring again if the replay came
/// after all. An interface that already has the host's MAC was configured before
/// (configuring is idempotent). A vdev without `mac=` (DPDK picks one at random) waits for
/// the interface only.
fn configure_tap_host(h: &KernelHost, vdev: &str, timeout: Duration) -> Result<bool> {
    let deadline = std::time::Instant::now() + timeout;
    let Some(port_mac) = vdev_mac(vdev) else {
        if !sys::wait_until(timeout, || sys::link_exists(Some(&h.netns), &h.iface)) {
            return Ok(false);
        }
        h.configure()?;
        return Ok(true);
    };
    let host_mac = h.mac.to_string();
    let started = sys::wait_until(timeout, || {
        sys::link_state(&h.netns, &h.iface).is_some_and(|(up, mac)| {
            let mac = mac.unwrap_or_default();
            (up && mac == port_mac) || mac == host_mac
        })
    });
    if !started {
        return Ok(false);
    }
    loop {
        h.configure()?;
        std::thread::sleep(Duration::from_millis(100));
        let mac = sys::link_state(&h.netns, &h.iface).and_then(|(_, m)| m);
        if mac.as_deref() == Some(host_mac.as_str()) {
            return Ok(true);
        }
        if std::time::Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: format!(
                    "tap interface {} in namespace {} keeping MAC {host_mac} (it has {})",
                    h.iface,
                    h.netns,
                    mac.as_deref().unwrap_or("none")
                ),
                after: timeout,
                hint: "something keeps setting the tap's MAC: is a second DPDK process using it?",
            });
        }
    }
}

/// The `mac=` argument of a vdev string, lower case; `None` without one or when it is not
/// an address (net_tap's `mac=fixed`).
fn vdev_mac(vdev: &str) -> Option<String> {
    vdev.split(',')
        .find_map(|kv| kv.strip_prefix("mac="))
        .filter(|m| {
            m.len() == 17
                && m.split(':')
                    .all(|b| b.len() == 2 && u8::from_str_radix(b, 16).is_ok())
        })
        .map(str::to_ascii_lowercase)
}

/// What a topology provides, by kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Details {
    /// See [`Memif`].
    Memif(Memif),
    /// See [`Tap`].
    Tap(Tap),
    /// See [`AfPacket`].
    AfPacket(AfPacket),
    /// See [`Veth`].
    Veth(Veth),
    /// See [`Coexist`].
    Coexist(Coexist),
}

fn dpdk_port(
    netns: &str,
    (ip, mac): (Ipv4Addr, MacAddr),
    (peer_ip, peer_mac): (Ipv4Addr, MacAddr),
    file_prefix: String,
    lcores: &str,
    vdev: String,
) -> DpdkPort {
    DpdkPort {
        netns: netns.to_string(),
        ip,
        prefix_len: PREFIX_LEN,
        mac,
        peer_ip,
        peer_mac,
        eal: EalArgs {
            file_prefix,
            lcores: lcores.to_string(),
            memory_mb: 256,
            vdev,
            extra: Vec::new(),
        },
    }
}

fn host(netns: String, iface: String, ip: Ipv4Addr, mac: MacAddr) -> KernelHost {
    KernelHost {
        netns,
        iface,
        ip,
        prefix_len: PREFIX_LEN,
        mac,
        mtu: MTU,
    }
}

impl Details {
    /// The names and addresses `kind` uses under `prefix` (pure: creates nothing).
    pub fn of(kind: Kind, p: &Prefix) -> Details {
        match kind {
            Kind::Memif => {
                let netns = p.name("memif");
                let socket = p.state_dir().join("memif.sock");
                let (s, c) = ((addr(3, 1), mac(3, 1)), (addr(3, 2), mac(3, 2)));
                let vdev = |role: &str, m: MacAddr| {
                    format!(
                        "net_memif0,role={role},id=0,socket={},socket-abstract=no,mac={m}",
                        socket.display()
                    )
                };
                Details::Memif(Memif {
                    server: dpdk_port(
                        &netns,
                        s,
                        c,
                        p.name("memif-server"),
                        "0",
                        vdev("server", s.1),
                    ),
                    client: dpdk_port(
                        &netns,
                        c,
                        s,
                        p.name("memif-client"),
                        "1",
                        vdev("client", c.1),
                    ),
                    netns,
                    socket,
                })
            }
            Kind::Tap => {
                let netns = p.name("tap");
                let iface = p.name("tap");
                let (h, d) = ((addr(0, 1), mac(0, 1)), (addr(0, 2), mac(0, 2)));
                let vdev = format!("net_tap0,iface={iface},mac={}", d.1);
                Details::Tap(Tap {
                    dpdk: dpdk_port(&netns, d, h, p.name("tap-dpdk"), "0", vdev),
                    host: host(netns, iface, h.0, h.1),
                })
            }
            Kind::AfPacket => {
                let dut_ns = p.name("afp-dut");
                let dut_iface = p.name("afd");
                let (h, d) = ((addr(1, 1), mac(1, 1)), (addr(1, 2), mac(1, 2)));
                let vdev = format!("net_af_packet0,iface={dut_iface},qpairs=1");
                Details::AfPacket(AfPacket {
                    dpdk: dpdk_port(&dut_ns, d, h, p.name("afp-dpdk"), "0", vdev),
                    host: host(p.name("afp-host"), p.name("afh"), h.0, h.1),
                    dut_iface,
                })
            }
            Kind::Veth => Details::Veth(Veth {
                k1: host(p.name("k1"), p.name("k1v"), addr(2, 1), mac(2, 1)),
                k2: host(p.name("k2"), p.name("k2v"), addr(2, 2), mac(2, 2)),
            }),
            Kind::Coexist => {
                let host_ns = p.name("cx-host");
                let nic_iface = p.name("cxn");
                let exc_iface = p.name("cxx");
                let (w, d) = ((addr(4, 1), mac(4, 1)), (addr(4, 2), mac(4, 2)));
                let vdev = format!("net_af_packet0,iface={nic_iface},qpairs=1");
                // The DPDK side of the tap gets its own MAC; the kernel side the NIC's.
                let exception_vdev = format!("net_tap1,iface={exc_iface},mac={}", mac(4, 3));
                let mut dpdk = dpdk_port(&host_ns, d, w, p.name("cx-dpdk"), "0", vdev);
                dpdk.eal.extra = vec!["--vdev".into(), exception_vdev.clone()];
                let wire_iface = p.name("cxw");
                let wire_dpdk = dpdk_port(
                    &p.name("cx-wire"),
                    (addr(4, 4), w.1),
                    d,
                    p.name("cx-wdpdk"),
                    "0",
                    format!("net_af_packet0,iface={wire_iface},qpairs=1"),
                );
                Details::Coexist(Coexist {
                    wire: host(p.name("cx-wire"), wire_iface, w.0, w.1),
                    exception: host(host_ns, exc_iface, d.0, d.1),
                    wire_dpdk,
                    dpdk,
                    nic_iface,
                    exception_vdev,
                    exception_port: "net_tap1".into(),
                })
            }
        }
    }

    /// The kind.
    pub fn kind(&self) -> Kind {
        match self {
            Details::Memif(_) => Kind::Memif,
            Details::Tap(_) => Kind::Tap,
            Details::AfPacket(_) => Kind::AfPacket,
            Details::Veth(_) => Kind::Veth,
            Details::Coexist(_) => Kind::Coexist,
        }
    }

    /// Namespaces this topology creates.
    pub fn namespaces(&self) -> Vec<String> {
        match self {
            Details::Memif(m) => vec![m.netns.clone()],
            Details::Tap(t) => vec![t.host.netns.clone()],
            Details::AfPacket(a) => vec![a.dpdk.netns.clone(), a.host.netns.clone()],
            Details::Veth(v) => vec![v.k1.netns.clone(), v.k2.netns.clone()],
            Details::Coexist(c) => vec![c.dpdk.netns.clone(), c.wire.netns.clone()],
        }
    }

    /// DPDK `--file-prefix`es this topology hands out.
    pub fn dpdk_file_prefixes(&self) -> Vec<String> {
        match self {
            Details::Memif(m) => vec![
                m.server.eal.file_prefix.clone(),
                m.client.eal.file_prefix.clone(),
            ],
            Details::Tap(t) => vec![t.dpdk.eal.file_prefix.clone()],
            Details::AfPacket(a) => vec![a.dpdk.eal.file_prefix.clone()],
            Details::Veth(_) => vec![],
            Details::Coexist(c) => vec![
                c.dpdk.eal.file_prefix.clone(),
                c.wire_dpdk.eal.file_prefix.clone(),
            ],
        }
    }

    /// (namespace, interface) of impairable link `link`.
    pub fn link_target(&self, link: &str) -> Result<(String, String)> {
        let found = match (self, link) {
            (Details::Veth(v), "k1") => Some(&v.k1),
            (Details::Veth(v), "k2") => Some(&v.k2),
            (Details::Tap(t), "tap") => Some(&t.host),
            (Details::AfPacket(a), "host") => Some(&a.host),
            (Details::Coexist(c), "wire") => Some(&c.wire),
            _ => None,
        };
        found
            .map(|h| (h.netns.clone(), h.iface.clone()))
            .ok_or_else(|| {
                let links = self.kind().links();
                Error::UnknownLink {
                    scope: format!("topology {}", self.kind().name()),
                    given: link.to_string(),
                    valid: if links.is_empty() {
                        "none (memif is shared memory: there is no kernel side to impair)".into()
                    } else {
                        links.join(", ")
                    },
                }
            })
    }

    fn state_file(&self, p: &Prefix) -> PathBuf {
        p.state_dir().join(format!("{}.json", self.kind().name()))
    }
}

enum Active {
    Netem,
    Nfqueue(Option<EngineThread>),
}

/// A live topology. Dropping it tears it down (namespaces, the processes inside them,
/// interfaces, impairments, its state files) unless [`Topology::detach`] was called.
pub struct Topology {
    prefix: Prefix,
    details: Details,
    impairments: BTreeMap<String, (Impairment, Active)>,
    keep: bool,
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Topology")
            .field("prefix", &self.prefix)
            .field("details", &self.details)
            .field(
                "impaired_links",
                &self.impairments.keys().collect::<Vec<_>>(),
            )
            .finish()
    }
}

fn ensure_state_dir(p: &Prefix) -> Result<PathBuf> {
    let dir = p.state_dir();
    std::fs::create_dir_all(&dir).map_err(|e| Error::io_path("creating state dir", &dir, e))?;
    Ok(dir)
}

impl Topology {
    /// Builds `kind` under `prefix`, or completes/adopts an existing one (idempotent).
    ///
    /// The value owns the topology: dropping it tears everything down, even if another
    /// value (or `testbed up`) brought it up first; [`detach`](Self::detach) the extra ones.
    pub fn up(kind: Kind, prefix: &Prefix) -> Result<Topology> {
        sys::preflight()?;
        let details = Details::of(kind, prefix);
        ensure_state_dir(prefix)?;
        let t = Topology {
            prefix: prefix.clone(),
            details,
            impairments: BTreeMap::new(),
            keep: false,
        };
        // On error `t` drops and removes what was half built.
        t.build()?;
        t.write_state()?;
        Ok(t)
    }

    /// Adopts a topology that is already up (e.g. from `testbed up`), without building.
    /// Dropping the result tears it down unless it is detached again.
    pub fn attach(kind: Kind, prefix: &Prefix) -> Result<Topology> {
        sys::preflight()?;
        let details = Details::of(kind, prefix);
        if !details.namespaces().iter().all(|n| sys::netns_exists(n)) {
            return Err(Error::NotUp {
                topology: kind.name(),
                prefix: prefix.to_string(),
            });
        }
        Ok(Topology {
            prefix: prefix.clone(),
            details,
            impairments: BTreeMap::new(),
            keep: false,
        })
    }

    /// Whether `kind` is up under `prefix` (all its namespaces exist).
    pub fn is_up(kind: Kind, prefix: &Prefix) -> bool {
        Details::of(kind, prefix)
            .namespaces()
            .iter()
            .all(|n| sys::netns_exists(n))
    }

    fn build(&self) -> Result<()> {
        for ns in self.details.namespaces() {
            sys::netns_ensure(&ns)?;
        }
        match &self.details {
            Details::Memif(m) => {
                let len = m.socket.as_os_str().len();
                if len >= 108 {
                    return Err(Error::Config(format!(
                        "memif socket path {} is {len} bytes; unix sockets allow 107. Fix: a shorter LUNA_TESTBED_STATE_ROOT",
                        m.socket.display()
                    )));
                }
                // A socket left by a killed server makes the next one fail to bind.
                if m.socket.exists() && sys::netns_pids(&m.netns).is_empty() {
                    std::fs::remove_file(&m.socket)
                        .map_err(|e| Error::io_path("removing stale memif socket", &m.socket, e))?;
                }
            }
            Details::Tap(_) => {} // DPDK creates the interface; see Tap::configure_host.
            Details::AfPacket(a) => {
                let (dut_ns, host_ns) = (&a.dpdk.netns, &a.host.netns);
                veth_pair(dut_ns, &a.dut_iface, host_ns, &a.host.iface)?;
                let dmac = a.dpdk.mac.to_string();
                let mtu = MTU.to_string();
                sys::sysctl_in(
                    dut_ns,
                    &format!("net.ipv6.conf.{}.disable_ipv6", a.dut_iface),
                    "1",
                )?;
                // No kernel address on the DUT end: its kernel must ignore the traffic
                // DPDK owns.
                sys::ip_in(
                    dut_ns,
                    &[
                        "link",
                        "set",
                        "dev",
                        &a.dut_iface,
                        "address",
                        &dmac,
                        "mtu",
                        &mtu,
                        "up",
                    ],
                )?;
                a.host.configure()?;
            }
            Details::Veth(v) => {
                veth_pair(&v.k1.netns, &v.k1.iface, &v.k2.netns, &v.k2.iface)?;
                v.k1.configure()?;
                v.k2.configure()?;
                // Two kernel hosts that load generators drive: a client opening 5,000
                // connections per run leaves 5,000 sockets in TIME-WAIT for 60 s, so a sweep
                // of runs exhausted the default ephemeral range (32768-60999) within a
                // minute ("connect: Cannot assign requested address"). Reuse TIME-WAIT
                // ports for new outgoing connections when the timestamps allow it (RFC
                // 6191's rule, net.ipv4.tcp_tw_reuse = 1), as load testers do; the sysctl
                // is per namespace and touches nothing outside.
                for ns in [&v.k1.netns, &v.k2.netns] {
                    sys::sysctl_in(ns, "net.ipv4.tcp_tw_reuse", "1")?;
                }
            }
            Details::Coexist(c) => {
                let ns = &c.dpdk.netns;
                veth_pair(ns, &c.nic_iface, &c.wire.netns, &c.wire.iface)?;
                let (nmac, mtu) = (c.dpdk.mac.to_string(), MTU.to_string());
                sys::sysctl_in(
                    ns,
                    &format!("net.ipv6.conf.{}.disable_ipv6", c.nic_iface),
                    "1",
                )?;
                // The kernel of the host namespace must not act on the NIC's frames: only
                // DPDK's packet socket (which sees them before the IP layer) may. No ARP,
                // no IPv4 input on it; the kernel's path is the exception tap.
                sys::ip_in(
                    ns,
                    &[
                        "link",
                        "set",
                        "dev",
                        &c.nic_iface,
                        "address",
                        &nmac,
                        "mtu",
                        &mtu,
                        "arp",
                        "off",
                        "up",
                    ],
                )?;
                let rule = [
                    "-t",
                    "raw",
                    "-C",
                    "PREROUTING",
                    "-i",
                    &c.nic_iface,
                    "-j",
                    "DROP",
                ];
                if sys::exec_in(ns, "iptables", &rule).is_err() {
                    let mut add = rule;
                    add[2] = "-A";
                    sys::exec_in(ns, "iptables", &add)?;
                }
                c.wire.configure()?;
                // A veth leaves TCP/UDP checksums to a NIC that does not exist
                // (CHECKSUM_PARTIAL); a packet socket hands them over unfinished, and
                // neither luna nor the kernel behind the tap would accept them.
                sys::exec_in(
                    &c.wire.netns,
                    "ethtool",
                    &["-K", &c.wire.iface, "tx", "off"],
                )?;
                // The wire's luna client shares the wire veth with the kernel there but
                // has its own IP: the kernel must neither answer nor forward what comes
                // for it (with forwarding off it would only count it, but no rule of
                // the namespace's sysctls is left to chance). The packet socket DPDK
                // opens sees the frames before this rule.
                let wns = &c.wire.netns;
                sys::sysctl_in(wns, "net.ipv4.ip_forward", "0")?;
                let luna_ip = c.wire_dpdk.ip.to_string();
                let rule = [
                    "-t",
                    "raw",
                    "-C",
                    "PREROUTING",
                    "-i",
                    &c.wire.iface,
                    "-d",
                    &luna_ip,
                    "-j",
                    "DROP",
                ];
                if sys::exec_in(wns, "iptables", &rule).is_err() {
                    let mut add = rule;
                    add[2] = "-A";
                    sys::exec_in(wns, "iptables", &add)?;
                }
            }
        }
        Ok(())
    }

    fn write_state(&self) -> Result<()> {
        let path = self.details.state_file(&self.prefix);
        let json = serde_json::to_string_pretty(&self.details)
            .map_err(|e| Error::Engine(format!("serialising state: {e}")))?;
        std::fs::write(&path, json).map_err(|e| Error::io_path("writing", &path, e))
    }

    /// The kind.
    pub fn kind(&self) -> Kind {
        self.details.kind()
    }

    /// The prefix.
    pub fn prefix(&self) -> &Prefix {
        &self.prefix
    }

    /// The prefix's state directory (memif socket, state files, impairment pid files).
    pub fn state_dir(&self) -> PathBuf {
        self.prefix.state_dir()
    }

    /// Names and addresses of everything in the topology.
    pub fn details(&self) -> &Details {
        &self.details
    }

    /// The memif details, if this is a memif topology.
    pub fn memif(&self) -> Option<&Memif> {
        match &self.details {
            Details::Memif(m) => Some(m),
            _ => None,
        }
    }

    /// The tap details, if this is a tap topology.
    pub fn tap(&self) -> Option<&Tap> {
        match &self.details {
            Details::Tap(t) => Some(t),
            _ => None,
        }
    }

    /// The af_packet details, if this is an afpacket topology.
    pub fn afpacket(&self) -> Option<&AfPacket> {
        match &self.details {
            Details::AfPacket(a) => Some(a),
            _ => None,
        }
    }

    /// The veth details, if this is a veth topology.
    pub fn veth(&self) -> Option<&Veth> {
        match &self.details {
            Details::Veth(v) => Some(v),
            _ => None,
        }
    }

    /// The coexistence details, if this is a coexist topology.
    pub fn coexist(&self) -> Option<&Coexist> {
        match &self.details {
            Details::Coexist(c) => Some(c),
            _ => None,
        }
    }

    /// Namespaces of this topology.
    pub fn namespaces(&self) -> Vec<String> {
        self.details.namespaces()
    }

    /// Impairable links of this topology.
    pub fn links(&self) -> &'static [&'static str] {
        self.kind().links()
    }

    /// Puts `imp` on the egress of `link` (replacing what was there); returns the backend
    /// used. The nfqueue engine, if needed, runs on a thread of this process until
    /// [`clear_impairment`](Self::clear_impairment) or drop.
    pub fn set_impairment(&mut self, link: &str, imp: &Impairment) -> Result<Backend> {
        imp.validate()?;
        let (ns, iface) = self.details.link_target(link)?;
        self.clear_impairment(link)?;
        let backend = Backend::select(&ns)?;
        let active = match backend {
            Backend::Netem => {
                impair::set_qdisc(&ns, &iface, backend, imp)?;
                Active::Netem
            }
            Backend::Nfqueue => {
                impair::set_qdisc(&ns, &iface, backend, imp)?;
                let engine = if imp.needs_engine() {
                    // Bind the queue before the rule exists: a rule without a listener
                    // drops everything.
                    let e = EngineThread::spawn(&ns, imp.clone())?;
                    if let Err(err) = impair::install_nfqueue_rule(&ns, &iface) {
                        let _ = impair::clear_qdisc(&ns, &iface);
                        return Err(err);
                    }
                    Some(e)
                } else {
                    None
                };
                Active::Nfqueue(engine)
            }
        };
        self.impairments
            .insert(link.to_string(), (imp.clone(), active));
        Ok(backend)
    }

    /// Removes any impairment from `link` (no error if there was none).
    pub fn clear_impairment(&mut self, link: &str) -> Result<()> {
        self.stop_impairment(link).map(|_| ())
    }

    /// [`clear_impairment`](Self::clear_impairment), returning the nfqueue engine's final
    /// counters (None on the netem backend or unimpaired): taken after the engine released
    /// every packet it held, so each packet they count as corrupted has been sent.
    pub fn stop_impairment(&mut self, link: &str) -> Result<Option<EngineStats>> {
        let (ns, iface) = self.details.link_target(link)?;
        let mut stats = None;
        if let Some((_, Active::Nfqueue(engine))) = self.impairments.remove(link) {
            // Rule first, so no packet is queued to a queue nobody reads.
            impair::remove_nfqueue_rule(&ns, &iface)?;
            if let Some(e) = engine {
                stats = Some(e.stop()?);
            }
        }
        impair::clear_qdisc(&ns, &iface)?;
        Ok(stats)
    }

    /// The impairment currently set on `link` by this value, if any.
    pub fn impairment(&self, link: &str) -> Option<&Impairment> {
        self.impairments.get(link).map(|(i, _)| i)
    }

    /// Counters of the nfqueue engine on `link` (None on the netem backend or unimpaired).
    pub fn impairment_stats(&self, link: &str) -> Option<EngineStats> {
        match self.impairments.get(link) {
            Some((_, Active::Nfqueue(Some(e)))) => Some(e.stats()),
            _ => None,
        }
    }

    /// Leaves the topology up when this value drops (for `testbed up`); `testbed down`
    /// or [`crate::sweep()`] removes it. In-process impairment engines still stop.
    pub fn detach(mut self) {
        self.keep = true;
    }

    /// Tears down now, reporting errors (drop does the same but ignores them).
    pub fn down(mut self) -> Result<()> {
        self.keep = true; // teardown below; Drop must not repeat it
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        let links: Vec<String> = self.impairments.keys().cloned().collect();
        let mut first_err = None;
        for l in links {
            if let Err(e) = self.clear_impairment(&l) {
                first_err.get_or_insert(e);
            }
        }
        if let Err(e) = teardown_kind(self.kind(), &self.prefix) {
            first_err.get_or_insert(e);
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        if self.keep {
            // Engines on this process's threads cannot outlive it: stop them cleanly.
            let links: Vec<String> = self.impairments.keys().cloned().collect();
            for l in links {
                if matches!(
                    self.impairments.get(&l),
                    Some((_, Active::Nfqueue(Some(_))))
                ) {
                    let _ = self.clear_impairment(&l);
                }
            }
            return;
        }
        let _ = self.teardown();
    }
}

/// Creates veth `a_if`@`a_ns` ⇄ `b_if`@`b_ns` unless it exists. Both ends are created
/// directly in their namespaces, so nothing ever appears in the root namespace.
fn veth_pair(a_ns: &str, a_if: &str, b_ns: &str, b_if: &str) -> Result<()> {
    if sys::link_exists(Some(a_ns), a_if) && sys::link_exists(Some(b_ns), b_if) {
        return Ok(());
    }
    // A half pair cannot exist (deleting one end deletes both), but a same-named stray
    // interface could: remove it.
    if sys::link_exists(Some(a_ns), a_if) {
        sys::ip_in(a_ns, &["link", "del", a_if])?;
    }
    if sys::link_exists(Some(b_ns), b_if) {
        sys::ip_in(b_ns, &["link", "del", b_if])?;
    }
    sys::ip(&[
        "link", "add", a_if, "netns", a_ns, "type", "veth", "peer", "name", b_if, "netns", b_ns,
    ])
    .map(|_| ())
}

/// Removes DPDK runtime leftovers for `file_prefix`: `/var/run/dpdk/<fp>` and hugepage files.
pub(crate) fn remove_dpdk_files(file_prefix_start: &str) -> usize {
    let mut n = 0;
    for dir in ["/var/run/dpdk", "/dev/hugepages"] {
        let Ok(rd) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name();
            if name.to_string_lossy().starts_with(file_prefix_start) {
                let p = e.path();
                let r = if p.is_dir() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
                if r.is_ok() {
                    n += 1;
                }
            }
        }
    }
    n
}

/// Tears down `kind` under `prefix` whether or not a `Topology` value exists for it.
pub fn teardown_kind(kind: Kind, prefix: &Prefix) -> Result<()> {
    sys::preflight()?;
    let d = Details::of(kind, prefix);
    let mut first_err = None;
    for link in kind.links() {
        crate::records::stop_impair_daemon(prefix, link);
    }
    for ns in d.namespaces() {
        if let Err(e) = sys::netns_delete(&ns) {
            first_err.get_or_insert(e);
        }
    }
    for fp in d.dpdk_file_prefixes() {
        remove_dpdk_files(&fp);
    }
    let dir = prefix.state_dir();
    let _ = std::fs::remove_file(d.state_file(prefix));
    if let Details::Memif(m) = &d {
        let _ = std::fs::remove_file(&m.socket);
    }
    // Last topology of this prefix gone: remove the state dir too.
    let _ = std::fs::remove_dir(&dir);
    first_err.map_or(Ok(()), Err)
}

/// Reads the state file `testbed up` wrote for `kind` under `prefix`, if any.
pub fn read_state(kind: Kind, prefix: &Prefix) -> Option<Details> {
    let path = prefix.state_dir().join(format!("{}.json", kind.name()));
    let s = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&s).ok()
}

/// The path of `prefix`'s state file for `kind`.
pub fn state_file(kind: Kind, prefix: &Prefix) -> PathBuf {
    Details::of(kind, prefix).state_file(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tap_port_mac_is_read_from_the_vdev() {
        let p = Prefix::new("vm").unwrap();
        let tap = match Details::of(Kind::Tap, &p) {
            Details::Tap(t) => t,
            _ => unreachable!(),
        };
        assert_eq!(vdev_mac(&tap.dpdk.eal.vdev), Some(tap.dpdk.mac.to_string()));
        assert_eq!(
            vdev_mac("net_tap1,iface=x,mac=02:AB:00:00:00:03"),
            Some("02:ab:00:00:00:03".into())
        );
        assert_eq!(vdev_mac("net_tap0,iface=x"), None);
        assert_eq!(vdev_mac("net_tap0,iface=x,mac=fixed"), None);
    }

    #[test]
    fn unknown_topology_lists_valid_names() {
        let e = "ring".parse::<Kind>().unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown topology `ring`; valid topologies: memif, tap, afpacket, veth, coexist"
        );
        for k in Kind::ALL {
            assert_eq!(k.name().parse::<Kind>().unwrap(), k);
        }
    }

    #[test]
    fn names_fit_ifnamsiz_and_addresses_stay_in_benchmark_range() {
        let p = Prefix::new("abcdefghij").unwrap();
        for k in Kind::ALL {
            let d = Details::of(k, &p);
            let mut ips = vec![];
            let mut ifaces = vec![];
            match &d {
                Details::Memif(m) => ips.extend([m.server.ip, m.client.ip]),
                Details::Tap(t) => {
                    ips.extend([t.host.ip, t.dpdk.ip]);
                    ifaces.push(t.host.iface.clone());
                }
                Details::AfPacket(a) => {
                    ips.extend([a.host.ip, a.dpdk.ip]);
                    ifaces.extend([a.host.iface.clone(), a.dut_iface.clone()]);
                }
                Details::Veth(v) => {
                    ips.extend([v.k1.ip, v.k2.ip]);
                    ifaces.extend([v.k1.iface.clone(), v.k2.iface.clone()]);
                }
                Details::Coexist(c) => {
                    ips.extend([c.wire.ip, c.dpdk.ip, c.exception.ip]);
                    ifaces.extend([
                        c.wire.iface.clone(),
                        c.nic_iface.clone(),
                        c.exception.iface.clone(),
                    ]);
                    assert_eq!(c.exception.ip, c.dpdk.ip, "the kernel carries luna's IP");
                    assert_eq!(c.exception.mac, c.dpdk.mac, "and the NIC's MAC");
                    assert!(c.dpdk.eal.args().join(" ").contains(&c.exception_vdev));
                }
            }
            for ip in ips {
                let o = ip.octets();
                assert!(o[0] == 198 && (o[1] == 18 || o[1] == 19), "{ip}");
            }
            for i in ifaces {
                assert!(i.len() <= 15, "{i}");
                assert!(i.starts_with("abcdefghij-"));
            }
            for n in d.namespaces() {
                assert!(n.starts_with("abcdefghij-"));
            }
        }
    }

    #[test]
    fn memif_eal_args_pair_server_and_client() {
        let p = Prefix::new("ltbu").unwrap();
        let Details::Memif(m) = Details::of(Kind::Memif, &p) else {
            unreachable!()
        };
        let s = m.server.eal.args().join(" ");
        let c = m.client.eal.args().join(" ");
        let sock = m.socket.display().to_string();
        assert!(s.contains("role=server") && s.contains(&sock), "{s}");
        assert!(c.contains("role=client") && c.contains(&sock), "{c}");
        assert!(s.contains("--file-prefix ltbu-memif-server"));
        assert!(c.contains("--file-prefix ltbu-memif-client"));
        assert!(s.contains("--no-pci") && s.contains("socket-abstract=no"));
        assert_eq!(m.server.peer_mac, m.client.mac);
        assert_eq!(m.client.peer_ip, m.server.ip);
        assert_ne!(m.server.eal.lcores, m.client.eal.lcores);
    }

    #[test]
    fn memif_has_no_impairable_link() {
        let p = Prefix::new("ltbu").unwrap();
        let e = Details::of(Kind::Memif, &p)
            .link_target("k1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("valid links: none"), "{e}");
        let e = Details::of(Kind::Veth, &p)
            .link_target("k3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("valid links: k1, k2"), "{e}");
        assert_eq!(Kind::of_link("host"), Some(Kind::AfPacket));
        assert_eq!(Kind::of_link("nope"), None);
    }
}
