//! The stack: one interface's Ethernet/ARP/IPv4/ICMP/TCP endpoint, sans-IO.
//!
//! Contract (one instance per core, never shared):
//! - `handle_frame(now, frame)` for every received frame (a zero-copy [`Zbuf`]);
//! - `handle_timeouts(now)` when `poll_timeout()` has passed;
//! - application calls (`connect`, `listen`, `accept`, `send`, `recv`, `close`, ...);
//! - then `poll_transmit(now)` until it returns `None`, handing each [`Transmit`] to the
//!   device (header bytes + the payload's zero-copy io-vector);
//! - `poll_event()` for readiness events, in the order they happened.
//!
//! Everything is deterministic given the inputs and the [`Rng`].

use crate::context::Rng;
use crate::tables::neighbour::{NeighbourConfig, NeighbourState, NeighbourTable, Resolution};
use crate::tables::route::{NextHop, Route, RouteTable};
use crate::tcp::conn::{Connection, Disposition, Events, FourTuple, OutSegment, SynInfo};
use crate::tcp::isn::IsnGenerator;
use crate::tcp::syncookie::{self, SynCookieConfig, SynCookies};
use crate::tcp::{CloseReason, ConnCounters, RecvError, SendError, SeqNum, State, TcpConfig};
use crate::time::{Duration, Instant};
use crate::wire::checksum::Accumulator;
use crate::wire::{
    ArpOperation, ArpPacket, ArpRepr, ChecksumCaps, EtherType, EthernetAddress, EthernetFrame,
    EthernetRepr, Icmpv4DstUnreachable, Icmpv4Message, Icmpv4Packet, Icmpv4Repr, IpProtocol,
    Ipv4Cidr, Ipv4Packet, Ipv4Repr, TcpFlags, TcpOptions, TcpPacket, TcpRepr, Timestamps,
};
use core::hash::BuildHasher;
use core::net::{Ipv4Addr, SocketAddrV4};
use siphasher::sip::SipHasher13;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use zbuf::{IoVec, Zbuf};

mod counters;
pub use counters::{StackCounters, StackDrop};

#[cfg(test)]
mod tests;

/// Ethernet header length.
const ETH_LEN: usize = 14;
/// IPv4 header length (luna never sends IP options).
const IP_LEN: usize = 20;
/// Room for Ethernet + IPv4 + the largest TCP header.
pub const MAX_HEADER_LEN: usize = ETH_LEN + IP_LEN + 60;

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
}

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
/// [`Stack::new`], r2c's configuration and knb's `--ip`.
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
            ConfigError::Address(addr, why) => write!(
                f,
                "{} cannot be the interface address: it is {why}; use a unicast host address",
                addr.address()
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A connection, as the application names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SocketHandle {
    idx: u32,
    gen: u32,
}

/// A listening port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenerHandle {
    idx: u32,
    gen: u32,
}

/// Readiness events, delivered in order by [`Stack::poll_event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// An active open completed.
    Connected(SocketHandle),
    /// Data (or end of stream) is ready to read.
    Readable(SocketHandle),
    /// Send-buffer space was freed.
    Writable(SocketHandle),
    /// The connection ended; [`Stack::close_reason`] says how.
    Closed(SocketHandle),
    /// A listener has connections to accept.
    Acceptable(ListenerHandle),
}

/// Errors from [`Stack::connect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectError {
    /// No route to the destination.
    NoRoute,
    /// The destination is not a unicast address (or is our own).
    InvalidAddress,
    /// The requested local port is in use for this destination.
    AddrInUse,
    /// No free port in the ephemeral range for this destination.
    PortsExhausted,
    /// `max_connections` reached.
    TableFull,
}

/// Errors from [`Stack::listen`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenError {
    /// Port 0 or a port already listened on.
    AddrInUse,
    /// Backlog of zero.
    InvalidBacklog,
}

/// A frame ready for the device: `header()` bytes followed by `payload` (zero copy).
#[derive(Clone)]
pub struct Transmit {
    header: [u8; MAX_HEADER_LEN],
    header_len: u8,
    /// The payload: references into application or received buffers.
    pub payload: IoVec,
    /// Offload metadata for the device.
    pub offload: TxOffload,
}

impl core::fmt::Debug for Transmit {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Transmit")
            .field("header_len", &self.header_len)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

/// What the device must finish in hardware (when the stack left checksums to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TxOffload {
    /// Ethernet header length.
    pub l2_len: u8,
    /// IP header length (0 for ARP).
    pub l3_len: u8,
    /// TCP/ICMP header length.
    pub l4_len: u8,
    /// The device must fill the IPv4 header checksum.
    pub ipv4_checksum: bool,
    /// The device must fill the TCP checksum (the pseudo-header sum is already in place).
    pub tcp_checksum: bool,
}

impl Transmit {
    fn new() -> Self {
        Transmit {
            header: [0; MAX_HEADER_LEN],
            header_len: 0,
            payload: IoVec::new(),
            offload: TxOffload::default(),
        }
    }

    /// The header bytes (Ethernet, IP, TCP/ICMP/ARP).
    pub fn header(&self) -> &[u8] {
        &self.header[..usize::from(self.header_len)]
    }

    /// Frame length in bytes.
    pub fn len(&self) -> usize {
        usize::from(self.header_len) + self.payload.len()
    }

    /// Whether the frame is empty (never, for frames the stack emits).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole frame in one buffer. This copies: it is for tests and slow paths.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(self.header());
        for c in self.payload.chunks() {
            v.extend_from_slice(c);
        }
        v
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// The application holds the handle.
    App,
    /// Created by a listener; not yet accepted.
    Listener(u32),
    /// The application released the handle; reclaim when the connection is closed.
    Released,
}

struct Entry {
    conn: Connection,
    owner: Owner,
    dirty: bool,
    /// Earliest deadline pushed to the timer heap and not yet popped.
    timer_at: Option<Instant>,
    /// The link-layer next hop and our source address, from the route at creation.
    next_hop: Ipv4Addr,
    /// A segment polled while the next hop was unresolved (sent once it resolves).
    held: Option<OutSegment>,
    /// Counted in its listener's `half_open` (created by the listener, handshake not yet
    /// complete). The flag, not the state at reclaim time, decides the decrement: a
    /// SYN-RECEIVED connection that times out or is reset is Closed when it is freed.
    counted_half_open: bool,
    /// The next hop's MAC as last resolved (see [`NextHopMac`]).
    hop_mac: Option<NextHopMac>,
}

/// A connection's copy of its next hop's neighbour entry, taken while that entry was
/// `Reachable` or `Permanent`. Valid while the table is unchanged (`epoch`) and before
/// `until` (never past the entry's own expiry). While valid, a table `lookup` would
/// answer `mac` and a `learn` of `mac` from the peer's segments would change nothing, so
/// both are skipped: each walks the table, ~400 instructions per frame pair. The one
/// thing skipped for real is the entry's `last_used` stamp (eviction order), which
/// `until` bounds to lag by at most [`HOP_MAC_REFRESH`].
#[derive(Clone, Copy)]
struct NextHopMac {
    mac: EthernetAddress,
    epoch: u64,
    until: Instant,
}

/// Longest a connection trusts its [`NextHopMac`] before looking the entry up again.
const HOP_MAC_REFRESH: Duration = Duration::from_secs(1);

struct Slot {
    gen: u32,
    entry: Option<Box<Entry>>,
}

struct Listener {
    port: u16,
    backlog: usize,
    /// Connections in SYN-RECEIVED owned by this listener.
    half_open: usize,
    accept_queue: VecDeque<SocketHandle>,
    gen: u32,
}

/// A `BuildHasher` keyed from the stack's RNG: hash flooding resistance for the demux table
/// without depending on process-global randomness (the stack stays deterministic).
#[derive(Clone, Copy)]
struct KeyedHasher(u64, u64);

impl BuildHasher for KeyedHasher {
    type Hasher = SipHasher13;
    fn build_hasher(&self) -> SipHasher13 {
        SipHasher13::new_with_keys(self.0, self.1)
    }
}

/// The per-core stack.
pub struct Stack<R: Rng> {
    cfg: StackConfig,
    /// Every secret and offset is drawn from the `Rng` at construction (keys of the ISN,
    /// timestamp-offset, cookie and demux hashes; the first ephemeral port and IP id); per
    /// connection values are keyed hashes of the 4-tuple, not draws.
    _rng: core::marker::PhantomData<R>,
    neighbours: NeighbourTable,
    routes: RouteTable,
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
    by_tuple: HashMap<FourTuple, u32, KeyedHasher>,
    /// The demux answer for the last segment: a connection's segments come in bursts
    /// (a message is several segments), which then skip the keyed hash. Cleared whenever
    /// `by_tuple` changes.
    last_hit: Option<(FourTuple, u32)>,
    /// Bumped whenever a neighbour entry may have changed state or address, or entries
    /// came or went (and whenever the application takes the table): invalidates every
    /// connection's [`NextHopMac`].
    nb_epoch: u64,
    listeners: Vec<Option<Listener>>,
    listener_by_port: HashMap<u16, u32, KeyedHasher>,
    isn: IsnGenerator,
    cookies: SynCookies,
    timers: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    dirty: VecDeque<u32>,
    /// Connections parked until their next hop resolves, by next hop.
    arp_wait: HashMap<Ipv4Addr, Vec<u32>, KeyedHasher>,
    /// Last ARP request per unresolved neighbour.
    arp_sent: HashMap<Ipv4Addr, Instant, KeyedHasher>,
    ctl: VecDeque<Transmit>,
    events: VecDeque<Event>,
    next_port: u16,
    ip_ident: u16,
    counters: StackCounters,
    /// Counters of connections already reclaimed.
    retired: ConnCounters,
}

impl<R: Rng> Stack<R> {
    /// A stack for one interface. Fails with a precise reason on a bad configuration.
    pub fn new(cfg: StackConfig, mut rng: R) -> Result<Self, ConfigError> {
        check_host_address(cfg.addr)?;
        if !(576..=9216).contains(&cfg.mtu) {
            return Err(ConfigError::Mtu(cfg.mtu));
        }
        if !cfg.mac.is_unicast() {
            return Err(ConfigError::Mac);
        }
        let (lo, hi) = cfg.ephemeral_ports;
        if lo == 0 || lo > hi {
            return Err(ConfigError::PortRange);
        }
        if cfg.max_connections == 0 {
            return Err(ConfigError::MaxConnections);
        }
        cfg.tcp.validate().map_err(ConfigError::Tcp)?;
        if let Some(gw) = cfg.gateway {
            if !cfg.addr.contains_addr(gw) {
                return Err(ConfigError::Gateway);
            }
        }
        let mut routes = RouteTable::new(256);
        let on_link = Route {
            destination: cfg.addr.network(),
            next_hop: NextHop::Direct,
            source: cfg.addr.address(),
            interface: 0,
        };
        let _ = routes.insert(on_link);
        if let Some(gw) = cfg.gateway {
            let _ = routes.set_default(gw, cfg.addr.address(), 0);
        }
        let hasher = KeyedHasher(rng.next_u64(), rng.next_u64());
        let isn = IsnGenerator::new(&mut rng);
        let cookies = SynCookies::new(&mut rng, SynCookieConfig::default())
            .map_err(|e| ConfigError::Tcp(e.to_string()))?;
        let next_port = lo + (rng.next_u32() % (u32::from(hi - lo) + 1)) as u16;
        Ok(Stack {
            neighbours: NeighbourTable::new(cfg.neighbour),
            routes,
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            by_tuple: HashMap::with_hasher(hasher),
            last_hit: None,
            nb_epoch: 0,
            listeners: Vec::new(),
            listener_by_port: HashMap::with_hasher(hasher),
            isn,
            cookies,
            timers: BinaryHeap::new(),
            dirty: VecDeque::new(),
            arp_wait: HashMap::with_hasher(hasher),
            arp_sent: HashMap::with_hasher(hasher),
            ctl: VecDeque::new(),
            events: VecDeque::new(),
            next_port,
            ip_ident: rng.next_u32() as u16,
            counters: StackCounters::default(),
            retired: ConnCounters::default(),
            _rng: core::marker::PhantomData,
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &StackConfig {
        &self.cfg
    }

    /// Our IPv4 address.
    pub fn ipv4(&self) -> Ipv4Addr {
        self.cfg.addr.address()
    }

    /// The neighbour table, read only.
    pub fn neighbours(&self) -> &NeighbourTable {
        &self.neighbours
    }

    /// The neighbour table (filled by ARP, statically, or by netlink-sync).
    pub fn neighbours_mut(&mut self) -> &mut NeighbourTable {
        // The caller may change anything: connections look their next hop up again.
        self.nb_epoch += 1;
        &mut self.neighbours
    }

    /// Runs a neighbour-table operation about `ip` and invalidates the connections'
    /// cached next-hop MACs if it changed `ip`'s address or state, or added or removed
    /// entries (an insert may evict another entry). A refreshed expiry alone does not
    /// count: it only moves later, and a cache never outlives the expiry it was taken at.
    fn nb_update<T>(&mut self, ip: Ipv4Addr, f: impl FnOnce(&mut NeighbourTable) -> T) -> T {
        let key = |t: &NeighbourTable| (t.len(), t.get(ip).map(|n| (n.hardware_addr, n.state)));
        let before = key(&self.neighbours);
        let r = f(&mut self.neighbours);
        let after = key(&self.neighbours);
        if before != after {
            self.nb_epoch += 1;
        }
        r
    }

    /// A [`NextHopMac`] for `ip` if its entry is `Reachable` or `Permanent` at `now`.
    fn hop_mac_of(&self, ip: Ipv4Addr, now: Instant) -> Option<NextHopMac> {
        let n = self.neighbours.get(ip)?;
        let mac = n.hardware_addr?;
        let refresh = now + HOP_MAC_REFRESH;
        let until = match n.state {
            NeighbourState::Permanent => refresh,
            NeighbourState::Reachable => n.expires_at?.min(refresh),
            NeighbourState::Stale | NeighbourState::Incomplete => return None,
        };
        (now < until).then_some(NextHopMac {
            mac,
            epoch: self.nb_epoch,
            until,
        })
    }

    /// The route table.
    pub fn routes_mut(&mut self) -> &mut RouteTable {
        &mut self.routes
    }

    /// Stack-level counters.
    pub fn counters(&self) -> &StackCounters {
        &self.counters
    }

    /// TCP counters summed over every connection, live and reclaimed.
    pub fn tcp_counters(&self) -> ConnCounters {
        let mut sum = self.retired.clone();
        for slot in &self.slots {
            if let Some(e) = &slot.entry {
                sum.accumulate(&e.conn.counters);
            }
        }
        sum
    }

    /// Live connection objects (including TIME-WAIT and unaccepted ones).
    pub fn connection_count(&self) -> usize {
        self.live
    }

    // ---------------------------------------------------------------------------------------
    // Handles
    // ---------------------------------------------------------------------------------------

    fn entry(&self, h: SocketHandle) -> Option<&Entry> {
        let slot = self.slots.get(h.idx as usize)?;
        if slot.gen != h.gen {
            return None;
        }
        slot.entry.as_deref()
    }

    fn entry_mut(&mut self, h: SocketHandle) -> Option<&mut Entry> {
        let slot = self.slots.get_mut(h.idx as usize)?;
        if slot.gen != h.gen {
            return None;
        }
        slot.entry.as_deref_mut()
    }

    fn handle_of(&self, idx: u32) -> SocketHandle {
        SocketHandle {
            idx,
            gen: self.slots[idx as usize].gen,
        }
    }

    /// The connection behind a handle, for inspection.
    pub fn connection(&self, h: SocketHandle) -> Option<&Connection> {
        self.entry(h).map(|e| &e.conn)
    }

    /// The connection's state, `None` for a stale handle.
    pub fn state(&self, h: SocketHandle) -> Option<State> {
        self.connection(h).map(Connection::state)
    }

    /// Why the connection closed, once it has.
    pub fn close_reason(&self, h: SocketHandle) -> Option<CloseReason> {
        self.connection(h).and_then(Connection::close_reason)
    }

    fn alloc_slot(&mut self, entry: Entry) -> Option<u32> {
        if self.live >= self.cfg.max_connections {
            return None;
        }
        self.live += 1;
        let entry = Some(Box::new(entry));
        if let Some(idx) = self.free.pop() {
            self.slots[idx as usize].entry = entry;
            Some(idx)
        } else {
            let idx = u32::try_from(self.slots.len()).ok()?;
            self.slots.push(Slot { gen: 0, entry });
            Some(idx)
        }
    }

    /// Remove the connection's tuple from the demux table (if it still maps to it: a newer
    /// connection may own the tuple by now). The slot and its handle stay.
    fn unmap(&mut self, idx: u32) {
        if let Some(e) = self.slots[idx as usize].entry.as_deref() {
            let tuple = e.conn.tuple();
            if self.by_tuple.get(&tuple) == Some(&idx) {
                self.by_tuple.remove(&tuple);
                self.last_hit = None;
            }
        }
    }

    /// A connection that reached CLOSED stops owning its tuple at once, even while the
    /// application holds its handle: new connections may use the tuple, and segments for it
    /// are answered as for no connection (RFC 9293 §3.10.7.1).
    fn unmap_if_closed(&mut self, idx: u32) {
        if self.slots[idx as usize]
            .entry
            .as_deref()
            .is_some_and(|e| e.conn.state() == State::Closed)
        {
            self.unmap(idx);
        }
    }

    fn free_slot(&mut self, idx: u32) {
        self.unmap(idx);
        let slot = &mut self.slots[idx as usize];
        if let Some(e) = slot.entry.take() {
            self.retired.accumulate(&e.conn.counters);
            if let Owner::Listener(l) = e.owner {
                if let Some(Some(lst)) = self.listeners.get_mut(l as usize) {
                    if e.counted_half_open {
                        lst.half_open = lst.half_open.saturating_sub(1);
                    }
                    let h = SocketHandle { idx, gen: slot.gen };
                    lst.accept_queue.retain(|&x| x != h);
                }
            }
            slot.gen = slot.gen.wrapping_add(1);
            self.free.push(idx);
            self.live -= 1;
        }
    }

    // ---------------------------------------------------------------------------------------
    // Application API
    // ---------------------------------------------------------------------------------------

    /// Listen on `port` with room for `backlog` connections that are half-open or waiting to
    /// be accepted (beyond it, SYN cookies answer if enabled).
    pub fn listen(&mut self, port: u16, backlog: usize) -> Result<ListenerHandle, ListenError> {
        if backlog == 0 {
            return Err(ListenError::InvalidBacklog);
        }
        if port == 0 || self.listener_by_port.contains_key(&port) {
            return Err(ListenError::AddrInUse);
        }
        let l = Listener {
            port,
            backlog,
            half_open: 0,
            accept_queue: VecDeque::new(),
            gen: 0,
        };
        let idx = match self.listeners.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.listeners.push(None);
                self.listeners.len() - 1
            }
        };
        let gen = self.counters.listeners_opened as u32;
        self.counters.listeners_opened += 1;
        self.listeners[idx] = Some(Listener { gen, ..l });
        self.listener_by_port.insert(port, idx as u32);
        Ok(ListenerHandle {
            idx: idx as u32,
            gen,
        })
    }

    /// Stop listening. Connections already accepted are unaffected; unaccepted ones are reset.
    pub fn unlisten(&mut self, l: ListenerHandle) {
        let Some(Some(lst)) = self.listeners.get(l.idx as usize) else {
            return;
        };
        if lst.gen != l.gen {
            return;
        }
        let port = lst.port;
        self.listener_by_port.remove(&port);
        let owned: Vec<u32> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.entry
                    .as_ref()
                    .is_some_and(|e| e.owner == Owner::Listener(l.idx))
            })
            .map(|(i, _)| i as u32)
            .collect();
        self.listeners[l.idx as usize] = None;
        for idx in owned {
            if let Some(e) = self.slots[idx as usize].entry.as_deref_mut() {
                e.owner = Owner::Released;
                e.conn.abort();
                e.conn.set_orphaned();
            }
            self.mark_dirty(idx);
        }
    }

    /// Take one established connection from the listener's accept queue.
    pub fn accept(&mut self, l: ListenerHandle) -> Option<SocketHandle> {
        let lst = self.listeners.get_mut(l.idx as usize)?.as_mut()?;
        if lst.gen != l.gen {
            return None;
        }
        let h = lst.accept_queue.pop_front()?;
        let e = self.entry_mut(h)?;
        e.owner = Owner::App;
        // Data that arrived before accept is announced now.
        if e.conn.recv_available() > 0 || matches!(e.conn.state(), State::CloseWait | State::Closed)
        {
            self.events.push_back(Event::Readable(h));
        }
        Some(h)
    }

    /// Actively open a connection to `remote` (RFC 9293 §3.10.1). With `local_port` `None`
    /// a port from the ephemeral range is chosen.
    pub fn connect(
        &mut self,
        now: Instant,
        remote: SocketAddrV4,
        local_port: Option<u16>,
    ) -> Result<SocketHandle, ConnectError> {
        let dst = *remote.ip();
        if dst.is_unspecified()
            || dst.is_broadcast()
            || dst.is_multicast()
            || dst == self.ipv4()
            || remote.port() == 0
        {
            return Err(ConnectError::InvalidAddress);
        }
        let (next_hop, src) = match self.routes.next_hop(dst) {
            Some((hop, route)) => (hop, route.source),
            None => return Err(ConnectError::NoRoute),
        };
        let port = match local_port {
            Some(p) => {
                let t = FourTuple {
                    local: SocketAddrV4::new(src, p),
                    remote,
                };
                if p == 0 || self.by_tuple.contains_key(&t) {
                    return Err(ConnectError::AddrInUse);
                }
                p
            }
            None => self
                .pick_port(src, remote)
                .ok_or(ConnectError::PortsExhausted)?,
        };
        let tuple = FourTuple {
            local: SocketAddrV4::new(src, port),
            remote,
        };
        let iss = self.isn.isn(now, tuple.local, tuple.remote);
        let ts_offset = self.isn.ts_offset(tuple.local, tuple.remote);
        let conn = Connection::connect(now, tuple, self.tcp_config_for(dst), iss, ts_offset);
        let entry = Entry {
            conn,
            owner: Owner::App,
            dirty: false,
            timer_at: None,
            next_hop,
            held: None,
            counted_half_open: false,
            hop_mac: None,
        };
        let idx = self.alloc_slot(entry).ok_or(ConnectError::TableFull)?;
        self.by_tuple.insert(tuple, idx);
        self.last_hit = None;
        self.counters.active_opens += 1;
        self.after_activity(idx, now);
        Ok(self.handle_of(idx))
    }

    /// Whether a 4-tuple is in use (bifurcation's port choosers use this).
    pub fn tuple_in_use(&self, local: SocketAddrV4, remote: SocketAddrV4) -> bool {
        self.by_tuple.contains_key(&FourTuple { local, remote })
    }

    fn pick_port(&mut self, src: Ipv4Addr, remote: SocketAddrV4) -> Option<u16> {
        let (lo, hi) = self.cfg.ephemeral_ports;
        let span = u32::from(hi - lo) + 1;
        for _ in 0..span {
            let p = self.next_port;
            self.next_port = if self.next_port >= hi {
                lo
            } else {
                self.next_port + 1
            };
            let t = FourTuple {
                local: SocketAddrV4::new(src, p),
                remote,
            };
            if !self.by_tuple.contains_key(&t) && !self.listener_by_port.contains_key(&p) {
                return Some(p);
            }
        }
        None
    }

    /// TCP settings for a peer: the MSS is clamped to what the MTU allows (RFC 6691).
    fn tcp_config_for(&self, _dst: Ipv4Addr) -> TcpConfig {
        let mut tcp = self.cfg.tcp.clone();
        tcp.mss = tcp.mss.min(self.cfg.mtu - (IP_LEN as u16) - 20);
        tcp
    }

    /// Queue `data` on the connection without copying; returns the bytes accepted.
    pub fn send(&mut self, h: SocketHandle, data: &Zbuf) -> Result<usize, SendError> {
        let e = self.entry_mut(h).ok_or(SendError::InvalidHandle)?;
        let n = e.conn.send(data)?;
        self.mark_dirty(h.idx);
        Ok(n)
    }

    /// Queue an io-vector; returns the bytes accepted.
    pub fn send_iovec(&mut self, h: SocketHandle, data: &IoVec) -> Result<usize, SendError> {
        let e = self.entry_mut(h).ok_or(SendError::InvalidHandle)?;
        let n = e.conn.send_iovec(data)?;
        self.mark_dirty(h.idx);
        Ok(n)
    }

    /// Free send-buffer space.
    pub fn send_capacity(&self, h: SocketHandle) -> usize {
        self.connection(h).map_or(0, Connection::send_capacity)
    }

    /// The next received chunk (zero copy); see [`Connection::recv`].
    pub fn recv(&mut self, h: SocketHandle) -> Result<Option<Zbuf>, RecvError> {
        let e = self.entry_mut(h).ok_or(RecvError::InvalidHandle)?;
        let r = e.conn.recv();
        if matches!(r, Ok(Some(_))) {
            // Reading may open the window: a window update may be due.
            self.mark_dirty(h.idx);
        }
        r
    }

    /// Up to `max` received bytes as an io-vector (zero copy).
    pub fn recv_iovec(&mut self, h: SocketHandle, max: usize) -> Result<IoVec, RecvError> {
        let e = self.entry_mut(h).ok_or(RecvError::InvalidHandle)?;
        let r = e.conn.recv_iovec(max);
        if r.as_ref().is_ok_and(|v| !v.is_empty()) {
            self.mark_dirty(h.idx);
        }
        r
    }

    /// Shut down the sending side (FIN after queued data).
    pub fn shutdown(&mut self, h: SocketHandle) {
        if let Some(e) = self.entry_mut(h) {
            e.conn.close();
            self.mark_dirty(h.idx);
        }
    }

    /// Close: shut down sending and release the handle. The connection finishes its close
    /// (FIN exchange, TIME-WAIT) on its own and is reclaimed afterwards; a peer that never
    /// sends its FIN is reset after `TcpConfig::fin_timeout` in FIN-WAIT-2.
    pub fn close(&mut self, h: SocketHandle) {
        if let Some(e) = self.entry_mut(h) {
            if e.conn.recv_available() > 0 {
                // RFC 9293 §3.6.1 (SHLD-3): closing with received data unread loses it; a
                // RST tells the peer so, where a FIN would claim an orderly close.
                e.conn.abort();
            } else {
                e.conn.close();
            }
            e.conn.set_orphaned();
            e.owner = Owner::Released;
            self.mark_dirty(h.idx);
        }
    }

    /// Abort with RST and release the handle.
    pub fn abort(&mut self, h: SocketHandle) {
        if let Some(e) = self.entry_mut(h) {
            e.conn.abort();
            e.conn.set_orphaned();
            e.owner = Owner::Released;
            self.mark_dirty(h.idx);
        }
    }

    /// The next readiness event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    // ---------------------------------------------------------------------------------------
    // Bookkeeping after any change to a connection
    // ---------------------------------------------------------------------------------------

    fn mark_dirty(&mut self, idx: u32) {
        if let Some(e) = self.slots[idx as usize].entry.as_deref_mut() {
            if !e.dirty {
                e.dirty = true;
                self.dirty.push_back(idx);
            }
        }
    }

    fn schedule_timer(&mut self, idx: u32) {
        let gen = self.slots[idx as usize].gen;
        let Some(e) = self.slots[idx as usize].entry.as_deref_mut() else {
            return;
        };
        if let Some(t) = e.conn.poll_timeout() {
            if e.timer_at.is_none_or(|cur| t < cur) {
                e.timer_at = Some(t);
                self.timers.push(Reverse((t, idx, gen)));
            }
        }
    }

    /// Route events, schedule timers and mark for transmission after the connection changed.
    fn after_activity(&mut self, idx: u32, _now: Instant) {
        let gen = self.slots[idx as usize].gen;
        let h = SocketHandle { idx, gen };
        let Some(e) = self.slots[idx as usize].entry.as_deref_mut() else {
            return;
        };
        let ev = e.conn.take_events();
        let owner = e.owner;
        let closed = e.conn.state() == State::Closed;
        // The handshake completed: the connection leaves the listener's half-open count.
        let leaves_half_open = ev.connected && core::mem::take(&mut e.counted_half_open);
        self.route_events(h, owner, ev, leaves_half_open);
        if closed {
            self.unmap(idx);
        }
        self.mark_dirty(idx);
        self.schedule_timer(idx);
    }

    fn route_events(&mut self, h: SocketHandle, owner: Owner, ev: Events, leaves_half_open: bool) {
        match owner {
            Owner::App => {
                if ev.connected {
                    self.events.push_back(Event::Connected(h));
                }
                if ev.readable {
                    self.events.push_back(Event::Readable(h));
                }
                if ev.writable && !ev.connected {
                    self.events.push_back(Event::Writable(h));
                }
                if ev.closed {
                    self.events.push_back(Event::Closed(h));
                }
            }
            Owner::Listener(l) => {
                if ev.connected {
                    if let Some(Some(lst)) = self.listeners.get_mut(l as usize) {
                        if leaves_half_open {
                            lst.half_open = lst.half_open.saturating_sub(1);
                        }
                        lst.accept_queue.push_back(h);
                        let lh = ListenerHandle {
                            idx: l,
                            gen: lst.gen,
                        };
                        self.events.push_back(Event::Acceptable(lh));
                    }
                }
            }
            Owner::Released => {}
        }
    }

    // ---------------------------------------------------------------------------------------
    // Timers
    // ---------------------------------------------------------------------------------------

    /// When `handle_timeouts` next has work.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        while let Some(&Reverse((t, idx, gen))) = self.timers.peek() {
            let slot = &self.slots[idx as usize];
            match slot.entry.as_deref() {
                Some(e) if slot.gen == gen && e.timer_at == Some(t) => return Some(t),
                _ => {
                    self.timers.pop();
                }
            }
        }
        None
    }

    /// Run every timer due at `now`.
    pub fn handle_timeouts(&mut self, now: Instant) {
        while let Some(&Reverse((t, idx, gen))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let slot = &mut self.slots[idx as usize];
            if slot.gen != gen {
                continue;
            }
            let Some(e) = slot.entry.as_deref_mut() else {
                continue;
            };
            if e.timer_at != Some(t) {
                continue;
            }
            e.timer_at = None;
            if e.conn.poll_timeout().is_some_and(|d| d <= now) {
                e.conn.on_timeout(now);
            }
            self.after_activity(idx, now);
        }
    }

    // ---------------------------------------------------------------------------------------
    // Receive path
    // ---------------------------------------------------------------------------------------

    /// Process one received Ethernet frame. Anything malformed is dropped and counted.
    pub fn handle_frame(&mut self, now: Instant, frame: Zbuf) {
        self.counters.frames_in += 1;
        let Ok(eth) = EthernetFrame::new_checked(&frame[..]) else {
            return self.counters.drop(StackDrop::Malformed);
        };
        let Ok(eth_repr) = EthernetRepr::parse(&eth) else {
            return self.counters.drop(StackDrop::Malformed);
        };
        // Broadcast and multicast frames are taken for ARP (broadcast only) and for IPv4,
        // which must see the link-layer flag to discard them (RFC 1122 §3.3.6).
        let l2_multicast = eth_repr.dst_addr.is_multicast();
        if eth_repr.dst_addr != self.cfg.mac && !l2_multicast {
            return self.counters.drop(StackDrop::NotForUs);
        }
        match eth_repr.ethertype {
            EtherType::Arp if eth_repr.dst_addr.is_broadcast() || !l2_multicast => {
                self.on_arp(now, &frame[ETH_LEN..])
            }
            EtherType::Arp => self.counters.drop(StackDrop::NotForUs),
            EtherType::Ipv4 => self.on_ipv4(now, &frame, eth_repr.src_addr, l2_multicast),
            _ => self.counters.drop(StackDrop::UnknownEthertype),
        }
    }

    fn on_arp(&mut self, now: Instant, data: &[u8]) {
        let Ok(pkt) = ArpPacket::new_checked(data) else {
            return self.counters.drop(StackDrop::Malformed);
        };
        let Ok(arp) = ArpRepr::parse(&pkt) else {
            return self.counters.drop(StackDrop::Malformed);
        };
        let me = self.ipv4();
        let for_us = arp.target_protocol_addr == me;
        if arp.sender_protocol_addr == me || !arp.sender_hardware_addr.is_unicast() {
            return self.counters.drop(StackDrop::Malformed);
        }
        // RFC 826 "Packet Reception": merge the sender into the table; create an entry only
        // when we are the target.
        let sender = arp.sender_protocol_addr;
        let sha = arp.sender_hardware_addr;
        let learned = self.nb_update(sender, |t| match arp.operation {
            ArpOperation::Reply if for_us => t.confirm(sender, sha, now),
            _ => t.learn(sender, sha, now, for_us),
        });
        if learned.is_err() {
            self.counters.drop(StackDrop::TableFull);
        }
        self.arp_sent.remove(&sender);
        if let Some(waiting) = self.arp_wait.remove(&sender) {
            for idx in waiting {
                self.mark_dirty(idx);
            }
        }
        if arp.operation == ArpOperation::Request && for_us && self.cfg.answer_arp {
            let reply = ArpRepr {
                operation: ArpOperation::Reply,
                sender_hardware_addr: self.cfg.mac,
                sender_protocol_addr: me,
                target_hardware_addr: arp.sender_hardware_addr,
                target_protocol_addr: sender,
            };
            self.queue_arp(reply, arp.sender_hardware_addr);
            self.counters.arp_replies += 1;
        }
    }

    fn queue_arp(&mut self, arp: ArpRepr, dst: EthernetAddress) {
        let mut t = Transmit::new();
        let len = ETH_LEN + 28;
        {
            let buf = &mut t.header[..len];
            let mut eth = EthernetFrame::new_unchecked(&mut buf[..]);
            EthernetRepr {
                src_addr: self.cfg.mac,
                dst_addr: dst,
                ethertype: EtherType::Arp,
            }
            .emit(&mut eth);
            let mut pkt = ArpPacket::new_unchecked(&mut buf[ETH_LEN..]);
            arp.emit(&mut pkt);
        }
        t.header_len = len as u8;
        t.offload.l2_len = ETH_LEN as u8;
        self.ctl.push_back(t);
    }

    /// `l2_multicast`: the frame was sent to a link-layer broadcast or multicast address.
    fn on_ipv4(
        &mut self,
        now: Instant,
        frame: &Zbuf,
        src_mac: EthernetAddress,
        l2_multicast: bool,
    ) {
        let Ok(pkt) = Ipv4Packet::new_checked(&frame[ETH_LEN..]) else {
            return self.counters.drop(StackDrop::Malformed);
        };
        let Ok(ip) = Ipv4Repr::parse(&pkt, &self.cfg.caps) else {
            return self.counters.drop(StackDrop::Malformed);
        };
        // RFC 1122 §3.2.1.3: a datagram whose source is a broadcast or multicast address,
        // 0.0.0.0 (only legal while a host learns its address, which luna never answers)
        // or loopback (127/8 never appears on a wire) MUST be discarded silently.
        // RFC 1122 §4.2.3.10: a SYN to a broadcast or multicast address MUST be discarded
        // (luna has nothing else that takes broadcasts): no SYN-ACK, no RST, no echo reply
        // (RFC 1122 §3.2.2.6 lets broadcast echoes go unanswered; answering one, or a forged
        // broadcast source, would make luna a smurf amplifier).
        let src = ip.src_addr;
        if self.is_non_unicast(src)
            || src.is_unspecified()
            || src.is_loopback()
            || self.is_non_unicast(ip.dst_addr)
        {
            return self.counters.drop(StackDrop::NonUnicast);
        }
        if ip.dst_addr != self.ipv4() {
            return self.counters.drop(StackDrop::NotForUs);
        }
        // RFC 1122 §3.3.6: a datagram received in a link-layer broadcast (or multicast) frame
        // without an IP broadcast or multicast destination SHOULD be discarded silently; for
        // TCP that is RFC 1122 §4.2.3.10's rule again.
        if l2_multicast {
            return self.counters.drop(StackDrop::NonUnicast);
        }
        if ip.is_fragment() {
            // Reassembly is not implemented: TCP never sends fragments (DF + PMTU), so a
            // fragment is counted and dropped rather than buffered.
            return self.counters.drop(StackDrop::Fragment);
        }
        let l4 = ETH_LEN + pkt.header_len();
        let l4_end = l4 + ip.payload_len;
        match ip.protocol {
            IpProtocol::Tcp => self.on_tcp(now, &ip, frame, l4, l4_end, src_mac),
            IpProtocol::Icmp => self.on_icmp(now, &ip, frame, l4, l4_end, src_mac),
            _ => self.counters.drop(StackDrop::UnknownProtocol),
        }
    }

    /// A broadcast (limited, or our subnet's for prefixes of /30 or shorter: a /31 has no
    /// broadcast address, RFC 3021) or multicast address.
    fn is_non_unicast(&self, a: Ipv4Addr) -> bool {
        let subnet = self.cfg.addr;
        a.is_broadcast()
            || a.is_multicast()
            || (subnet.prefix_len() <= 30 && a == subnet.broadcast())
    }

    fn on_icmp(
        &mut self,
        _now: Instant,
        ip: &Ipv4Repr,
        frame: &Zbuf,
        l4: usize,
        l4_end: usize,
        src_mac: EthernetAddress,
    ) {
        let data = &frame[l4..l4_end];
        let Ok(pkt) = Icmpv4Packet::new_checked(data) else {
            return self.counters.drop(StackDrop::Malformed);
        };
        let Ok(repr) = Icmpv4Repr::parse(&pkt, &self.cfg.caps) else {
            return self.counters.drop(StackDrop::Malformed);
        };
        match repr {
            Icmpv4Repr::EchoRequest {
                ident,
                seq_no,
                data: echo,
            } if self.cfg.answer_ping => {
                // The echo data is sent back by reference to the received frame.
                let off = l4 + 8;
                let payload = frame.slice(off..off + echo.len());
                self.queue_echo_reply(ip.src_addr, src_mac, ident, seq_no, payload);
                self.counters.icmp_echo_replies += 1;
            }
            Icmpv4Repr::DstUnreachable {
                reason: Icmpv4DstUnreachable::FragRequired,
                next_hop_mtu,
                quote,
            } => {
                // RFC 1191 §4 with RFC 5927 §4.1 validation: the quoted segment must belong
                // to a connection and carry an in-flight sequence number.
                let (Some((sport, dport)), Some(seq)) = (quote.ports(), quote.tcp_seq()) else {
                    return self.counters.drop(StackDrop::IcmpIgnored);
                };
                let tuple = FourTuple {
                    local: SocketAddrV4::new(quote.header.src_addr, sport),
                    remote: SocketAddrV4::new(quote.header.dst_addr, dport),
                };
                match self.by_tuple.get(&tuple).copied() {
                    Some(idx) => {
                        let e = self.slots[idx as usize]
                            .entry
                            .as_deref_mut()
                            .expect("tuple map is consistent");
                        if e.conn.on_path_mtu(seq, next_hop_mtu) {
                            self.counters.pmtu_updates += 1;
                            self.mark_dirty(idx);
                        } else {
                            self.counters.drop(StackDrop::IcmpIgnored);
                        }
                    }
                    None => self.counters.drop(StackDrop::IcmpIgnored),
                }
            }
            _ => self.counters.drop(StackDrop::IcmpIgnored),
        }
    }

    fn queue_echo_reply(
        &mut self,
        dst: Ipv4Addr,
        dst_mac: EthernetAddress,
        ident: u16,
        seq_no: u16,
        payload: Zbuf,
    ) {
        let mut t = Transmit::new();
        let icmp_len = 8 + payload.len();
        let len = ETH_LEN + IP_LEN + 8;
        {
            let buf = &mut t.header[..len];
            let mut eth = EthernetFrame::new_unchecked(&mut buf[..]);
            EthernetRepr {
                src_addr: self.cfg.mac,
                dst_addr: dst_mac,
                ethertype: EtherType::Ipv4,
            }
            .emit(&mut eth);
            self.ip_ident = self.ip_ident.wrapping_add(1);
            let mut ip = Ipv4Repr::new(self.ipv4(), dst, IpProtocol::Icmp, icmp_len);
            ip.ident = self.ip_ident;
            let mut ip_pkt = Ipv4Packet::new_unchecked(&mut buf[ETH_LEN..ETH_LEN + IP_LEN]);
            ip.emit(&mut ip_pkt, &ChecksumCaps::software());
            let mut icmp = Icmpv4Packet::new_unchecked(&mut buf[ETH_LEN + IP_LEN..]);
            icmp.set_msg_type(Icmpv4Message::EchoReply);
            icmp.set_msg_code(0);
            icmp.set_echo_ident(ident);
            icmp.set_echo_seq_no(seq_no);
            icmp.set_checksum(0);
            let mut acc = Accumulator::new();
            acc.add_bytes(&buf[ETH_LEN + IP_LEN..len]);
            acc.add_bytes(&payload);
            let sum = acc.checksum();
            Icmpv4Packet::new_unchecked(&mut buf[ETH_LEN + IP_LEN..]).set_checksum(sum);
        }
        t.header_len = len as u8;
        t.payload.push(payload);
        t.offload = TxOffload {
            l2_len: ETH_LEN as u8,
            l3_len: IP_LEN as u8,
            l4_len: 8,
            ..TxOffload::default()
        };
        self.ctl.push_back(t);
    }

    fn on_tcp(
        &mut self,
        now: Instant,
        ip: &Ipv4Repr,
        frame: &Zbuf,
        l4: usize,
        l4_end: usize,
        src_mac: EthernetAddress,
    ) {
        let Ok(pkt) = TcpPacket::new_checked(&frame[l4..l4_end]) else {
            return self.counters.drop(StackDrop::Malformed);
        };
        let Ok(seg) = TcpRepr::parse(&pkt, ip.src_addr, ip.dst_addr, &self.cfg.caps) else {
            return self.counters.drop(StackDrop::Malformed);
        };
        let payload = frame.slice(l4 + pkt.header_len()..l4_end);
        let tuple = FourTuple {
            local: SocketAddrV4::new(ip.dst_addr, seg.dst_port),
            remote: SocketAddrV4::new(ip.src_addr, seg.src_port),
        };
        let hit = match self.last_hit {
            Some((t, idx)) if t == tuple => Some(idx),
            _ => {
                let found = self.by_tuple.get(&tuple).copied();
                self.last_hit = found.map(|idx| (tuple, idx));
                found
            }
        };
        if let Some(idx) = hit {
            let e = self.slots[idx as usize]
                .entry
                .as_deref_mut()
                .expect("tuple map is consistent");
            if e.conn.state() == State::Closed {
                // RFC 9293 §3.10.7.1: a CLOSED connection is no connection. One the
                // application still holds (to read its close reason) must not swallow the
                // segment: the tuple is freed and the segment goes to a listener or gets a
                // RST below.
                self.unmap(idx);
                return self.on_tcp_unmatched(now, tuple, &seg, payload, src_mac);
            }
            // RFC 9293 §3.10.7.4 with RFC 6191: a new SYN may reopen a TIME-WAIT tuple when
            // its timestamp shows it is new (`Connection::accepts_new_syn`); any other SYN
            // gets the connection's rate-limited challenge ACK (RFC 5961 §4.2).
            let reuse =
                e.conn.accepts_new_syn(&seg) && self.listener_by_port.contains_key(&seg.dst_port);
            if !reuse {
                // The peer's MAC is learned from its segments: no ARP round trip is needed to
                // answer a connection the kernel-side neighbour table does not know yet.
                // Skipped while the connection's cached entry says it would change nothing.
                let cached = e.next_hop == ip.src_addr
                    && e.hop_mac.is_some_and(|c| {
                        c.epoch == self.nb_epoch && now < c.until && c.mac == src_mac
                    });
                if !cached {
                    let src = ip.src_addr;
                    let _ = self.nb_update(src, |t| t.learn(src, src_mac, now, false));
                }
                let e = self.slots[idx as usize]
                    .entry
                    .as_deref_mut()
                    .expect("tuple map is consistent");
                let una = e.conn.snd_una();
                if e.conn.on_segment(now, &seg, payload) == Disposition::Remove {
                    self.free_slot(idx);
                    return;
                }
                // RFC 4861 §7.3.1 (as Linux's dst_confirm): an ACK of new data proves
                // forward progress, so the peer is reachable at the MAC it sent from. The
                // entry becomes Reachable and the connection caches it, which then skips
                // the per-segment learn above and the lookup on transmit.
                let progressed = e.conn.snd_una() != una;
                let direct = e.next_hop == ip.src_addr;
                if progressed && direct && !cached {
                    let src = ip.src_addr;
                    let _ = self.nb_update(src, |t| t.confirm(src, src_mac, now));
                    let fresh = self.hop_mac_of(src, now);
                    if let Some(e) = self.slots[idx as usize].entry.as_deref_mut() {
                        e.hop_mac = fresh;
                    }
                }
                self.after_activity(idx, now);
                return;
            }
            if e.owner == Owner::App {
                // The application's handle stays valid; only the tuple is taken over.
                self.unmap(idx);
            } else {
                self.free_slot(idx);
            }
            self.counters.time_wait_reuses += 1;
        }
        self.on_tcp_unmatched(now, tuple, &seg, payload, src_mac);
    }

    /// A segment that matched no live connection: a listener's, or a RST.
    fn on_tcp_unmatched(
        &mut self,
        now: Instant,
        tuple: FourTuple,
        seg: &TcpRepr,
        payload: Zbuf,
        src_mac: EthernetAddress,
    ) {
        match self.listener_by_port.get(&seg.dst_port).copied() {
            Some(l) => self.on_listen_segment(now, l, tuple, seg, payload, src_mac),
            None => {
                self.counters.drop(StackDrop::NoSocket);
                self.queue_rst_for(seg, payload.len(), tuple, src_mac);
            }
        }
    }

    /// RFC 9293 §3.10.7.1: a segment for no connection gets a RST (unless it is one).
    fn queue_rst_for(
        &mut self,
        seg: &TcpRepr,
        payload_len: usize,
        tuple: FourTuple,
        dst_mac: EthernetAddress,
    ) {
        if seg.flags.rst() {
            return;
        }
        let (seq, ack, flags) = if seg.flags.ack() {
            (seg.ack, SeqNum(0), TcpFlags::RST)
        } else {
            let len = payload_len as u32 + u32::from(seg.flags.syn()) + u32::from(seg.flags.fin());
            (SeqNum(0), seg.seq + len, TcpFlags::RST | TcpFlags::ACK)
        };
        let repr = TcpRepr {
            src_port: tuple.local.port(),
            dst_port: tuple.remote.port(),
            seq,
            ack,
            flags,
            window: 0,
            urgent: 0,
            options: TcpOptions::default(),
        };
        let t = self.build_tcp(&repr, IoVec::new(), tuple, dst_mac);
        self.ctl.push_back(t);
        self.counters.rsts_sent += 1;
    }

    /// RFC 9293 §3.10.7.2: SEGMENT ARRIVES in LISTEN.
    fn on_listen_segment(
        &mut self,
        now: Instant,
        l: u32,
        tuple: FourTuple,
        seg: &TcpRepr,
        payload: Zbuf,
        src_mac: EthernetAddress,
    ) {
        let flags = seg.flags;
        if flags.rst() {
            return self.counters.drop(StackDrop::ListenInvalid);
        }
        if flags.ack() {
            // Possibly the final ACK of a SYN-cookie handshake.
            if self.cfg.syn_cookies != SynCookieMode::Off && !flags.syn() {
                let tsecr = seg.options.timestamps.map(|t| t.tsecr);
                if let Ok(ok) =
                    self.cookies
                        .validate(now, tuple.local, tuple.remote, seg.seq, seg.ack, tsecr)
                {
                    return self.accept_cookie(now, l, tuple, seg, payload, ok, src_mac);
                }
            }
            // RFC 9293 §3.10.7.2 second: any acknowledgment is bad in LISTEN (a SYN-ACK too,
            // which must not open a connection): <SEQ=SEG.ACK><CTL=RST>.
            self.counters.drop(StackDrop::ListenInvalid);
            return self.queue_rst_for(seg, payload.len(), tuple, src_mac);
        }
        if !flags.syn() {
            return self.counters.drop(StackDrop::ListenInvalid);
        }
        // RFC 9293 §3.10.7.2 defines no SYN+FIN (a scan or an attack, never a connection
        // attempt): drop it silently, as Linux and BSD do, rather than open a connection
        // whose FIN would close it at once.
        if flags.fin() {
            return self.counters.drop(StackDrop::ListenInvalid);
        }
        let Some(Some(lst)) = self.listeners.get(l as usize) else {
            return;
        };
        let full = lst.half_open + lst.accept_queue.len() >= lst.backlog
            || self.live >= self.cfg.max_connections;
        let _ = self.nb_update(ip_of(&tuple.remote), |t| {
            t.learn(ip_of(&tuple.remote), src_mac, now, true)
        });
        match (self.cfg.syn_cookies, full) {
            (SynCookieMode::Always, _) | (SynCookieMode::WhenFull, true) => {
                return self.send_cookie_syn_ack(now, tuple, seg, src_mac);
            }
            (SynCookieMode::Off, true) => return self.counters.drop(StackDrop::BacklogFull),
            (_, false) => {}
        }
        let Some((next_hop, _)) = self.route(tuple.remote.ip()) else {
            return self.counters.drop(StackDrop::NoRoute);
        };
        let iss = self.isn.isn(now, tuple.local, tuple.remote);
        let ts_offset = self.isn.ts_offset(tuple.local, tuple.remote);
        let syn = SynInfo {
            seq: seg.seq,
            window: seg.window,
            options: seg.options,
        };
        let conn = Connection::accept_syn(
            now,
            tuple,
            self.tcp_config_for(*tuple.remote.ip()),
            iss,
            ts_offset,
            &syn,
        );
        let Some(idx) = self.insert_passive(l, tuple, conn, next_hop) else {
            return self.counters.drop(StackDrop::TableFull);
        };
        self.counters.passive_opens += 1;
        self.after_activity(idx, now);
    }

    /// Table a connection a listener created (SYN or valid cookie); it counts against the
    /// listener's half-open backlog until it is established or freed.
    fn insert_passive(
        &mut self,
        l: u32,
        tuple: FourTuple,
        conn: Connection,
        next_hop: Ipv4Addr,
    ) -> Option<u32> {
        let entry = Entry {
            conn,
            owner: Owner::Listener(l),
            dirty: false,
            timer_at: None,
            next_hop,
            held: None,
            counted_half_open: true,
            hop_mac: None,
        };
        let idx = self.alloc_slot(entry)?;
        self.by_tuple.insert(tuple, idx);
        self.last_hit = None;
        if let Some(Some(lst)) = self.listeners.get_mut(l as usize) {
            lst.half_open += 1;
        }
        Some(idx)
    }

    fn route(&self, dst: &Ipv4Addr) -> Option<(Ipv4Addr, Ipv4Addr)> {
        self.routes.next_hop(*dst).map(|(hop, r)| (hop, r.source))
    }

    fn send_cookie_syn_ack(
        &mut self,
        now: Instant,
        tuple: FourTuple,
        seg: &TcpRepr,
        dst_mac: EthernetAddress,
    ) {
        let info = syncookie::SynInfo {
            mss: seg.options.mss,
            wscale: seg.options.window_scale,
            sack_permitted: seg.options.sack_permitted,
            timestamps: seg.options.timestamps.is_some(),
        };
        // The connection re-created from the cookie continues this clock (accept_cookie).
        let ts_clock = ((now.as_nanos() / 1_000_000) as u32)
            .wrapping_add(self.isn.ts_offset(tuple.local, tuple.remote));
        let c = self
            .cookies
            .generate(now, tuple.local, tuple.remote, seg.seq, &info, ts_clock);
        let tcp = &self.cfg.tcp;
        let mut options = TcpOptions {
            mss: Some(tcp.mss.min(self.cfg.mtu - 40)),
            ..TcpOptions::default()
        };
        // The cookie carries window scale and SACK-permitted only in the timestamp
        // (tcp/syncookie.rs): without timestamps, offering them would leave the re-created
        // connection unscaled while the peer scales (RFC 7323 §2.2, RFC 2018 §2).
        let ts = seg.options.timestamps.is_some() && tcp.timestamps;
        if ts && tcp.window_scaling && seg.options.window_scale.is_some() {
            options.window_scale = Some(tcp.rcv_wscale());
        }
        options.sack_permitted = ts && tcp.sack && seg.options.sack_permitted;
        if let (Some(tsval), Some(peer)) = (c.tsval, seg.options.timestamps) {
            if tcp.timestamps {
                options.timestamps = Some(Timestamps {
                    tsval,
                    tsecr: peer.tsval,
                });
            }
        }
        let repr = TcpRepr {
            src_port: tuple.local.port(),
            dst_port: tuple.remote.port(),
            seq: c.isn,
            ack: seg.seq + 1u32,
            flags: TcpFlags::SYN | TcpFlags::ACK,
            // Connection::from_cookie assumes exactly this window was offered.
            window: u16::try_from(tcp.rcv_buf).unwrap_or(u16::MAX),
            urgent: 0,
            options,
        };
        let t = self.build_tcp(&repr, IoVec::new(), tuple, dst_mac);
        self.ctl.push_back(t);
        self.counters.syn_cookies_sent += 1;
    }

    #[allow(clippy::too_many_arguments)]
    fn accept_cookie(
        &mut self,
        now: Instant,
        l: u32,
        tuple: FourTuple,
        seg: &TcpRepr,
        payload: Zbuf,
        ok: syncookie::CookieAccepted,
        _src_mac: EthernetAddress,
    ) {
        let Some((next_hop, _)) = self.route(tuple.remote.ip()) else {
            return self.counters.drop(StackDrop::NoRoute);
        };
        let peer_opts = TcpOptions {
            mss: Some(ok.peer_mss),
            window_scale: ok.wscale,
            sack_permitted: ok.sack_permitted,
            timestamps: seg.options.timestamps.filter(|_| ok.timestamps),
            ..TcpOptions::default()
        };
        let mut cfg = self.tcp_config_for(*tuple.remote.ip());
        if !ok.timestamps {
            cfg.timestamps = false;
        }
        // The SYN-ACK's TSval came from this clock and the peer echoes it: a connection on
        // another clock would look 2^31 or more in the past to the peer's PAWS check about
        // half the time, and every later segment would be dropped.
        let ts_offset = self.isn.ts_offset(tuple.local, tuple.remote);
        let conn =
            Connection::from_cookie(now, tuple, cfg, ok.isn, ok.peer_isn, ts_offset, &peer_opts);
        let Some(idx) = self.insert_passive(l, tuple, conn, next_hop) else {
            return self.counters.drop(StackDrop::TableFull);
        };
        self.counters.syn_cookies_accepted += 1;
        let e = self.slots[idx as usize]
            .entry
            .as_deref_mut()
            .expect("just allocated");
        e.conn.on_segment(now, seg, payload);
        self.after_activity(idx, now);
    }

    // ---------------------------------------------------------------------------------------
    // Transmit path
    // ---------------------------------------------------------------------------------------

    /// The next frame to send, or `None`. Call until `None` after every batch of input.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        if let Some(t) = self.ctl.pop_front() {
            self.counters.frames_out += 1;
            return Some(t);
        }
        while let Some(&idx) = self.dirty.front() {
            let gen = self.slots[idx as usize].gen;
            let Some(e) = self.slots[idx as usize].entry.as_deref_mut() else {
                self.dirty.pop_front();
                continue;
            };
            let next_hop = e.next_hop;
            let seg = match e.held.take() {
                Some(s) => Some(s),
                None => e.conn.poll_segment(now),
            };
            let Some(seg) = seg else {
                e.dirty = false;
                self.dirty.pop_front();
                let reclaim = e.conn.is_closed() && e.owner != Owner::App;
                self.unmap_if_closed(idx);
                self.schedule_timer(idx);
                if reclaim {
                    self.free_slot(idx);
                }
                continue;
            };
            let _ = gen;
            let cached = e
                .hop_mac
                .filter(|c| c.epoch == self.nb_epoch && now < c.until)
                .map(|c| c.mac);
            let mac = match cached {
                Some(mac) => Some(mac),
                None => {
                    let mac = self.resolve(now, next_hop);
                    let fresh = self.hop_mac_of(next_hop, now);
                    if let Some(e) = self.slots[idx as usize].entry.as_deref_mut() {
                        e.hop_mac = fresh;
                    }
                    mac
                }
            };
            match mac {
                Some(mac) => {
                    let tuple = self.slots[idx as usize]
                        .entry
                        .as_deref()
                        .expect("present")
                        .conn
                        .tuple();
                    let t = self.build_tcp(&seg.repr, seg.payload, tuple, mac);
                    self.counters.frames_out += 1;
                    return Some(t);
                }
                None => {
                    // Park the connection (holding its segment) until ARP answers.
                    let e = self.slots[idx as usize]
                        .entry
                        .as_deref_mut()
                        .expect("present");
                    e.held = Some(seg);
                    e.dirty = false;
                    self.dirty.pop_front();
                    self.arp_wait.entry(next_hop).or_default().push(idx);
                    self.schedule_timer(idx);
                    if let Some(t) = self.ctl.pop_front() {
                        self.counters.frames_out += 1;
                        return Some(t);
                    }
                }
            }
        }
        None
    }

    /// The MAC for `ip`, sending an ARP request (rate limited) when it is unknown.
    fn resolve(&mut self, now: Instant, ip: Ipv4Addr) -> Option<EthernetAddress> {
        match self.nb_update(ip, |t| t.lookup(ip, now)) {
            Resolution::Resolved(mac) | Resolution::Stale(mac) => return Some(mac),
            Resolution::Pending | Resolution::Unknown => {}
        }
        let due = self
            .arp_sent
            .get(&ip)
            .is_none_or(|&at| now.saturating_duration_since(at) >= self.cfg.arp_retry);
        if due {
            let _ = self.nb_update(ip, |t| t.start_resolution(ip, now));
            self.arp_sent.insert(ip, now);
            let req = ArpRepr {
                operation: ArpOperation::Request,
                sender_hardware_addr: self.cfg.mac,
                sender_protocol_addr: self.ipv4(),
                target_hardware_addr: EthernetAddress([0; 6]),
                target_protocol_addr: ip,
            };
            self.queue_arp(req, EthernetAddress::BROADCAST);
            self.counters.arp_requests += 1;
        }
        None
    }

    /// Wrap a TCP segment in IPv4 and Ethernet. Only headers are written; the payload stays
    /// where it is.
    fn build_tcp(
        &mut self,
        repr: &TcpRepr,
        payload: IoVec,
        tuple: FourTuple,
        dst_mac: EthernetAddress,
    ) -> Transmit {
        let repr = repr.emitted();
        let tcp_hlen = repr.header_len();
        let tcp_len = tcp_hlen + payload.len();
        let len = ETH_LEN + IP_LEN + tcp_hlen;
        let caps = self.cfg.caps;
        let mut t = Transmit::new();
        {
            let buf = &mut t.header[..len];
            let mut eth = EthernetFrame::new_unchecked(&mut buf[..]);
            EthernetRepr {
                src_addr: self.cfg.mac,
                dst_addr: dst_mac,
                ethertype: EtherType::Ipv4,
            }
            .emit(&mut eth);
            self.ip_ident = self.ip_ident.wrapping_add(1);
            let mut ip = Ipv4Repr::new(
                *tuple.local.ip(),
                *tuple.remote.ip(),
                IpProtocol::Tcp,
                tcp_len,
            );
            ip.ident = self.ip_ident;
            // RFC 1191 §3: TCP sets DF for path MTU discovery.
            ip.dont_frag = true;
            let mut ip_pkt = Ipv4Packet::new_unchecked(&mut buf[ETH_LEN..ETH_LEN + IP_LEN]);
            ip.emit(&mut ip_pkt, &caps);
            let mut tcp = TcpPacket::new_unchecked(&mut buf[ETH_LEN + IP_LEN..]);
            repr.emit_header(&mut tcp);
            let (src, dst) = (*tuple.local.ip(), *tuple.remote.ip());
            if caps.tcp.tx() {
                let mut acc = Accumulator::new();
                for chunk in payload.chunks() {
                    acc.add_bytes(chunk);
                }
                tcp.fill_checksum_split(src, dst, &acc);
            } else {
                tcp.fill_pseudo_header_checksum(src, dst, tcp_len);
            }
        }
        t.header_len = len as u8;
        t.payload = payload;
        t.offload = TxOffload {
            l2_len: ETH_LEN as u8,
            l3_len: IP_LEN as u8,
            l4_len: tcp_hlen as u8,
            ipv4_checksum: !caps.ipv4.tx(),
            tcp_checksum: !caps.tcp.tx(),
        };
        t
    }
}

fn ip_of(a: &SocketAddrV4) -> Ipv4Addr {
    *a.ip()
}
