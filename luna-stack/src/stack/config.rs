//! Interface configuration: [`StackConfig`], its validation errors and the host-address check.

use super::RstLimit;
use crate::tables::neighbour::NeighbourConfig;
use crate::tcp::TcpConfig;
use crate::time::Duration;
use crate::wire::{ChecksumCaps, EthernetAddress, Ipv4Cidr};
use core::net::Ipv4Addr;

/// How an interface is configured.
#[derive(Debug, Clone)]
pub struct StackConfig {
    /// Our MAC address.
    pub mac: EthernetAddress,
    /// Our IPv4 address and the on-link prefix.
    pub addr: Ipv4Cidr,
    /// Default gateway, if any.
    pub gateway: Option<Ipv4Addr>,
    /// IP MTU of the link (1500 for Ethernet).
    pub mtu: u16,
    /// TCP defaults for every connection.
    pub tcp: TcpConfig,
    /// Checksum offload of the device.
    pub caps: ChecksumCaps,
    /// Local ports `connect` picks from when none is given (LUNA reserves 61440-65535 for
    /// the stack; bifurcation partitions them further per application, queue and thread).
    pub ephemeral_ports: (u16, u16),
    /// Most connections (including TIME-WAIT and half-open ones).
    pub max_connections: usize,
    /// When a listener answers SYNs with cookies instead of keeping state.
    pub syn_cookies: SynCookieMode,
    /// Answer ARP requests for our address (off when the kernel owns ARP and netlink
    /// mirrors its table).
    pub answer_arp: bool,
    /// Answer ICMP echo requests.
    pub answer_ping: bool,
    /// Neighbour table sizing and timeouts.
    pub neighbour: NeighbourConfig,
    /// Interval between ARP requests for an unresolved neighbour.
    pub arp_retry: Duration,
    /// Rate limit of the RSTs sent in reply to segments that match no connection (a closed
    /// port, or a bad ACK to a listener); RSTs of connections are not limited by it.
    /// Default 200/s, burst 200 (FreeBSD's `net.inet.icmp.icmplim`);
    /// [`RstLimit::UNLIMITED`] answers every one.
    pub rst_limit: RstLimit,
    /// Test knob: every connection this stack opens or accepts (not through a SYN cookie,
    /// whose ISN is the cookie) starts its sequence space at this ISN instead of RFC 6528's
    /// keyed hash. Predictable ISNs help off-path attackers (RFC 6528 §1): only for tests
    /// that need a known sequence space, e.g. data crossing 2^32 within its first bytes
    /// (the attack suite's `seq_wrap` phase). `None`, the default, in production.
    pub fixed_isn: Option<u32>,
    /// TTL of every datagram the stack sends (RFC 9293 §3.9.2.1 MUST-49: configurable;
    /// RFC 1122 §3.2.1.7: never 0). Default 64, as Linux's `ip_default_ttl`.
    pub ttl: u8,
    /// The most receive memory all connections together may hold (bytes of truesize:
    /// each held buffer's whole object plus its metadata, as
    /// `Connection::recv_mem` counts it; Linux's `tcp_mem` hard limit). Received payload
    /// is held zero copy in the NIC's receive buffers, so what connections hold comes out
    /// of the receive pool that ARP, ACKs and every other connection's segments need too:
    /// each connection's own bound (twice `TcpConfig::rcv_buf`) does not stop a dozen
    /// applications that do not read from emptying it. Its top third
    /// ([`rcv_mem_reserve`](StackConfig::rcv_mem_reserve)) is kept for connections whose
    /// applications read, each up to its floor (`TcpConfig::rcv_mem_min`). Past what a
    /// connection may take, it takes only an in-order segment when it has nothing left
    /// to read (so every reading application makes progress); other data is dropped
    /// before it is acknowledged (`DropReason::RcvMemoryGlobal`) and the peer retransmits
    /// it. Default [`DEFAULT_RCV_MEM_TOTAL`]; at least [`MIN_RCV_MEM_TOTAL`]. r2c sets it
    /// from the device's receive pool (half of it for a DPDK port).
    pub rcv_mem_total: usize,
}

/// The default [`StackConfig::rcv_mem_total`]: 8 MiB, about half of a receive pool of
/// 8,191 2 KiB buffers (r2c's DPDK default) at 2,176 bytes of truesize each, so a stack
/// that is not told its pool leaves the other half of the common one to the rings and
/// to control traffic.
pub const DEFAULT_RCV_MEM_TOTAL: usize = 8 << 20;

/// The least [`StackConfig::rcv_mem_total`]: 64 KiB, about 30 full-sized segments in 2 KiB
/// buffers. Any positive bound would keep its promise (an in-order segment to a
/// connection with nothing left to read is always taken), but below a few dozen segments
/// even one reading connection would have most of every flight dropped.
pub const MIN_RCV_MEM_TOTAL: usize = 64 << 10;

/// When a listener answers a SYN with a SYN cookie (RFC 4987 §3.6) instead of a
/// connection in SYN-RECEIVED (Linux's `net.ipv4.tcp_syncookies` 0 / 1 / 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SynCookieMode {
    /// Never: a SYN to a full backlog is dropped (counted as `backlog_full`).
    Off,
    /// Only when the listener's backlog (or the connection table) is full.
    #[default]
    WhenFull,
    /// For every SYN (a listener keeps no half-open state at all; also how tests make
    /// real clients go through the cookie path without a flood).
    Always,
}

impl StackConfig {
    /// A configuration for `mac` at `addr` with defaults for everything else.
    pub fn new(mac: EthernetAddress, addr: Ipv4Cidr) -> Self {
        StackConfig {
            mac,
            addr,
            gateway: None,
            mtu: 1500,
            tcp: TcpConfig::default(),
            caps: ChecksumCaps::default(),
            ephemeral_ports: (61440, 65535),
            max_connections: 65536,
            syn_cookies: SynCookieMode::WhenFull,
            answer_arp: true,
            answer_ping: true,
            neighbour: NeighbourConfig::default(),
            arp_retry: Duration::from_secs(1),
            rst_limit: RstLimit::default(),
            fixed_isn: None,
            ttl: 64,
            rcv_mem_total: DEFAULT_RCV_MEM_TOTAL,
        }
    }

    /// The part of [`rcv_mem_total`](StackConfig::rcv_mem_total) kept for connections
    /// holding less than their floor (`TcpConfig::rcv_mem_min`, Linux's `tcp_rmem[0]`)
    /// whose applications read: its top third, as Linux's default `tcp_mem` puts the
    /// pressure threshold, above which only sockets under `tcp_rmem[0]` are sure to get
    /// memory, at two thirds of the hard limit. The other connections stop below it.
    /// None when `tcp.rcv_mem_min` is 0 (every connection may take the whole bound).
    pub fn rcv_mem_reserve(&self) -> usize {
        if self.tcp.rcv_mem_min == 0 {
            0
        } else {
            self.rcv_mem_total / 3
        }
    }
}

/// Why a [`StackConfig`] was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// MTU below 576 (RFC 791) or above 9216.
    Mtu(u16),
    /// The MAC is multicast or broadcast.
    Mac,
    /// The ephemeral port range is empty or includes port 0.
    PortRange,
    /// `max_connections` is zero.
    MaxConnections,
    /// A TCP setting is invalid.
    Tcp(String),
    /// The gateway is not on the interface's prefix.
    Gateway,
    /// The interface address cannot be a host's own address.
    Address(Ipv4Cidr, AddressError),
    /// `ttl` is 0 (RFC 1122 §3.2.1.7: a host never sends a datagram with TTL 0).
    Ttl,
    /// `rcv_mem_total` is below [`MIN_RCV_MEM_TOTAL`].
    RcvMemTotal(usize),
}

/// Why an address cannot be an interface's own unicast address (see [`check_host_address`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressError {
    /// 0.0.0.0: "any", not a host.
    Unspecified,
    /// In 0.0.0.0/8 ("this network").
    ThisNetwork,
    /// In 127.0.0.0/8.
    Loopback,
    /// In 224.0.0.0/4.
    Multicast,
    /// 255.255.255.255.
    LimitedBroadcast,
    /// In 240.0.0.0/4 (reserved, not routable).
    Reserved,
    /// Host bits all zero: the prefix itself.
    NetworkAddress,
    /// Host bits all one: the prefix's directed broadcast.
    DirectedBroadcast,
}

impl core::fmt::Display for AddressError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            AddressError::Unspecified => "the unspecified address (it means \"any\", not a host)",
            AddressError::ThisNetwork => "in 0.0.0.0/8 (\"this network\", never a host's address)",
            AddressError::Loopback => "a loopback address (127.0.0.0/8 never leaves a host)",
            AddressError::Multicast => {
                "a multicast address (224.0.0.0/4 names a group, not a host)"
            }
            AddressError::LimitedBroadcast => "the limited broadcast address",
            AddressError::Reserved => "in the reserved block 240.0.0.0/4",
            AddressError::NetworkAddress => {
                "the network address of its prefix (host bits all zero)"
            }
            AddressError::DirectedBroadcast => {
                "the broadcast address of its prefix (host bits all one)"
            }
        })
    }
}

/// Checks that `addr` can be an interface's own address: a unicast host address that is
/// neither its prefix's network nor its broadcast address. The one check behind
/// [`Stack::new`](super::Stack::new), r2c's configuration and knb's `--ip`.
// RFC 1122 §3.2.1.3: 0/8, 127/8, class D/E, limited and directed broadcast, and a host
// number of all zeros are never a host's own source address. RFC 3021: a /31 has no network
// or broadcast address (both are hosts); a /32 is a single host.
pub fn check_host_address(addr: Ipv4Cidr) -> Result<(), ConfigError> {
    let a = addr.address();
    let o = a.octets();
    let why = if a.is_unspecified() {
        Some(AddressError::Unspecified)
    } else if o[0] == 0 {
        Some(AddressError::ThisNetwork)
    } else if a.is_loopback() {
        Some(AddressError::Loopback)
    } else if a.is_multicast() {
        Some(AddressError::Multicast)
    } else if a.is_broadcast() {
        Some(AddressError::LimitedBroadcast)
    } else if o[0] >= 240 {
        Some(AddressError::Reserved)
    } else if addr.prefix_len() <= 30 && a == addr.network().address() {
        Some(AddressError::NetworkAddress)
    } else if addr.prefix_len() <= 30 && a == addr.broadcast() {
        Some(AddressError::DirectedBroadcast)
    } else {
        None
    };
    why.map_or(Ok(()), |w| Err(ConfigError::Address(addr, w)))
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ConfigError::Mtu(m) => write!(f, "MTU {m} is outside 576..=9216"),
            ConfigError::Mac => f.write_str("the interface MAC must be a unicast address"),
            ConfigError::PortRange => {
                f.write_str("the ephemeral port range is empty or contains port 0")
            }
            ConfigError::MaxConnections => f.write_str("max_connections must be at least 1"),
            ConfigError::Tcp(why) => write!(f, "invalid TCP configuration: {why}"),
            ConfigError::Gateway => f.write_str("the gateway is not on the interface's prefix"),
            ConfigError::Ttl => f.write_str("ttl must be at least 1"),
            ConfigError::RcvMemTotal(n) => write!(
                f,
                "rcv_mem_total {n} is below the minimum {MIN_RCV_MEM_TOTAL} bytes"
            ),
            ConfigError::Address(addr, why) => write!(
                f,
                "{} cannot be the interface address: it is {why}; use a unicast host address",
                addr.address()
            ),
        }
    }
}

impl std::error::Error for ConfigError {}
