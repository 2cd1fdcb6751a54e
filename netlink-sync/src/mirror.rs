//! The master copy of the kernel's tables for one interface, and the sans-IO function that
//! applies netlink datagrams to it.
//!
//! [`Mirror::apply_datagram`] takes the raw bytes of one `recv` on a `NETLINK_ROUTE` socket
//! (dump replies and multicast notifications alike) and updates the mirror. It never panics:
//! a message that does not parse is counted in [`SyncCounters::malformed`] and skipped, a
//! message of a kind or family we do not mirror is counted in [`SyncCounters::ignored`].
//! Applying the same message twice leaves the same state (every change is keyed, so a
//! notification that repeats what a dump already said is a no-op).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use luna_stack::tables::{NeighbourState, NextHop, Route, RouteTable};
use luna_stack::wire::{EthernetAddress, Ipv4Cidr};
use netlink_packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_DUMP_INTR, NLM_F_REPLACE};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage,
    NeighbourState as KernelState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use crate::snapshot::{LinkInfo, LocalAddress, MirroredNeighbour, Snapshot};

/// `nlmsghdr` is 16 bytes; messages are 4-byte aligned inside a datagram.
const NLMSG_HDRLEN: usize = 16;
const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const RTM_NEWNEIGH: u16 = 28;
const RTM_DELNEIGH: u16 = 29;

/// Counters of the sync, by reason. Published in every [`Snapshot`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncCounters {
    /// Netlink messages applied (of a kind we mirror, for our interface).
    pub applied: u64,
    /// Messages that did not parse (bad length, truncated header, bad attributes): skipped.
    pub malformed: u64,
    /// Well-formed messages we do not mirror: other interface, other family (IPv6), other
    /// route table, route types other than unicast, multipath routes, proxy neighbours.
    pub ignored: u64,
    /// Socket overruns (`ENOBUFS` on `recv`, or `NLMSG_OVERRUN`): notifications were lost.
    pub overruns: u64,
    /// Full re-dumps started after an overrun, a truncated datagram or an interrupted dump.
    pub resyncs: u64,
    /// Dumps the kernel flagged `NLM_F_DUMP_INTR` (the table changed during the dump).
    pub dumps_interrupted: u64,
    /// Snapshots published.
    pub published: u64,
    /// Times the socket's receive buffer was doubled after an overrun.
    pub rcvbuf_grown: u64,
}

/// A kernel neighbour state reduced to what luna can use.
///
/// The mapping (docs/netlink-sync.md): `REACHABLE` → `Reachable`; `STALE`, `DELAY`, `PROBE`
/// → `Stale` (the address is usable while the kernel re-confirms it); `PERMANENT`, `NOARP` →
/// `Permanent`; `INCOMPLETE`, `FAILED`, `NONE` and anything else → not usable: the entry is
/// removed from the mirror.
pub fn usable_state(state: KernelState) -> Option<NeighbourState> {
    match state {
        KernelState::Reachable => Some(NeighbourState::Reachable),
        KernelState::Stale | KernelState::Delay | KernelState::Probe => Some(NeighbourState::Stale),
        KernelState::Permanent | KernelState::Noarp => Some(NeighbourState::Permanent),
        KernelState::Incomplete | KernelState::Failed | KernelState::None => None,
        // The kernel reports one state at a time; a combination is not something we trust.
        _ => None,
    }
}

/// What one datagram told the driver of the sync (besides table changes).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The mirror changed: publish a new snapshot.
    pub changed: bool,
    /// Sequence numbers of dumps that ended (`NLMSG_DONE`) in this datagram.
    pub done: Vec<u32>,
    /// `NLMSG_ERROR` replies carrying an error: (sequence number, negative errno).
    pub errors: Vec<(u32, i32)>,
    /// A dump message carried `NLM_F_DUMP_INTR`: the dump must be redone.
    pub dump_interrupted: bool,
    /// The kernel said it lost messages (`NLMSG_OVERRUN`).
    pub overrun: bool,
    /// The datagram could not be walked to its end (bad `nlmsg_len`): messages may be lost.
    pub truncated: bool,
    /// The interface went up or down (`IFF_UP` / `IFF_LOWER_UP` changed). The kernel
    /// flushes IPv4 routes of a downed interface without `RTM_DELROUTE`, so the driver
    /// re-dumps.
    pub link_flapped: bool,
}

/// Identity of a kernel IPv4 route in the main table: (destination, length, TOS, metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct RouteKey {
    dst: u32,
    len: u8,
    tos: u8,
    priority: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KernelRoute {
    gateway: Option<Ipv4Addr>,
    prefsrc: Option<Ipv4Addr>,
}

/// The kernel's neighbours, main-table routes and addresses of one interface.
#[derive(Debug, Clone)]
pub struct Mirror {
    ifindex: u32,
    routes: BTreeMap<RouteKey, KernelRoute>,
    neighbours: BTreeMap<Ipv4Addr, MirroredNeighbour>,
    addresses: BTreeSet<LocalAddress>,
    link: Option<LinkInfo>,
    gone: bool,
    counters: SyncCounters,
}

impl Mirror {
    /// An empty mirror of interface `ifindex`.
    pub fn new(ifindex: u32) -> Mirror {
        Mirror {
            ifindex,
            routes: BTreeMap::new(),
            neighbours: BTreeMap::new(),
            addresses: BTreeSet::new(),
            link: None,
            gone: false,
            counters: SyncCounters::default(),
        }
    }

    /// The mirrored interface.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The kernel deleted the interface (`RTM_DELLINK`).
    pub fn interface_gone(&self) -> bool {
        self.gone
    }

    /// The counters so far.
    pub fn counters(&self) -> &SyncCounters {
        &self.counters
    }

    /// Mutable counters (the driver counts overruns and resyncs).
    pub fn counters_mut(&mut self) -> &mut SyncCounters {
        &mut self.counters
    }

    /// Replaces the tables with `other`'s (after a re-dump), keeping this mirror's counters
    /// plus what `other` counted while it was being filled.
    pub fn replace_tables(&mut self, other: Mirror) {
        self.add_counts(&other);
        self.routes = other.routes;
        self.neighbours = other.neighbours;
        self.addresses = other.addresses;
        self.link = other.link.or(self.link);
        self.gone |= other.gone;
    }

    /// Adds what `other` counted while applying messages (a re-dump that is abandoned for a
    /// newer one still counts).
    pub fn add_counts(&mut self, other: &Mirror) {
        let c = &other.counters;
        self.counters.applied += c.applied;
        self.counters.malformed += c.malformed;
        self.counters.ignored += c.ignored;
        self.counters.dumps_interrupted += c.dumps_interrupted;
    }

    /// Number of mirrored neighbours.
    pub fn neighbour_count(&self) -> usize {
        self.neighbours.len()
    }

    /// Number of mirrored kernel routes (before choosing one per prefix).
    pub fn route_count(&self) -> usize {
        self.routes.len()
    }

    /// Applies every netlink message in `datagram` (one `recv` worth of bytes).
    pub fn apply_datagram(&mut self, datagram: &[u8]) -> Outcome {
        let mut out = Outcome::default();
        let mut off = 0usize;
        while off < datagram.len() {
            let rest = &datagram[off..];
            if rest.len() < NLMSG_HDRLEN {
                self.counters.malformed += 1;
                out.truncated = true;
                break;
            }
            let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            if len < NLMSG_HDRLEN || len > rest.len() {
                self.counters.malformed += 1;
                out.truncated = true;
                break;
            }
            self.apply_message(&rest[..len], &mut out);
            off += (len + 3) & !3;
        }
        out
    }

    fn apply_message(&mut self, bytes: &[u8], out: &mut Outcome) {
        let kind = u16::from_ne_bytes([bytes[4], bytes[5]]);
        let flags = u16::from_ne_bytes([bytes[6], bytes[7]]);
        match kind {
            NLMSG_NOOP => return,
            NLMSG_OVERRUN => {
                out.overrun = true;
                return;
            }
            NLMSG_ERROR | NLMSG_DONE | RTM_NEWLINK | RTM_DELLINK | RTM_NEWADDR | RTM_DELADDR
            | RTM_NEWROUTE | RTM_DELROUTE | RTM_NEWNEIGH | RTM_DELNEIGH => {}
            _ => {
                self.counters.ignored += 1;
                return;
            }
        }
        if flags & NLM_F_DUMP_INTR != 0 && !out.dump_interrupted {
            out.dump_interrupted = true;
            self.counters.dumps_interrupted += 1;
        }
        let msg = match NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes) {
            Ok(m) => m,
            Err(_) => {
                self.counters.malformed += 1;
                return;
            }
        };
        let seq = msg.header.sequence_number;
        let changed = match msg.payload {
            NetlinkPayload::Done(_) => {
                out.done.push(seq);
                return;
            }
            NetlinkPayload::Error(e) => {
                if let Some(code) = e.code {
                    out.errors.push((seq, code.get()));
                }
                return;
            }
            NetlinkPayload::Overrun(_) => {
                out.overrun = true;
                return;
            }
            NetlinkPayload::Noop => return,
            NetlinkPayload::InnerMessage(m) => match m {
                RouteNetlinkMessage::NewNeighbour(n) => self.on_neighbour(&n, true),
                RouteNetlinkMessage::DelNeighbour(n) => self.on_neighbour(&n, false),
                RouteNetlinkMessage::NewRoute(r) => self.on_route(&r, true, flags),
                RouteNetlinkMessage::DelRoute(r) => self.on_route(&r, false, flags),
                RouteNetlinkMessage::NewAddress(a) => self.on_address(&a, true),
                RouteNetlinkMessage::DelAddress(a) => self.on_address(&a, false),
                RouteNetlinkMessage::DelLink(l) if l.header.index == self.ifindex => {
                    self.counters.applied += 1;
                    let was = self.gone;
                    self.gone = true;
                    Some(!was)
                }
                RouteNetlinkMessage::NewLink(l) if l.header.index == self.ifindex => {
                    self.on_link(&l, out)
                }
                RouteNetlinkMessage::NewLink(_) | RouteNetlinkMessage::DelLink(_) => None,
                _ => None,
            },
            _ => None,
        };
        match changed {
            Some(c) => out.changed |= c,
            None => self.counters.ignored += 1,
        }
    }

    fn on_link(&mut self, m: &LinkMessage, out: &mut Outcome) -> Option<bool> {
        let mut info = LinkInfo {
            up: m.header.flags.contains(LinkFlags::Up),
            lower_up: m.header.flags.contains(LinkFlags::LowerUp),
            mac: None,
            mtu: None,
        };
        for a in &m.attributes {
            match a {
                LinkAttribute::Address(v) if v.len() == 6 => {
                    let mut b = [0u8; 6];
                    b.copy_from_slice(v);
                    info.mac = Some(EthernetAddress(b));
                }
                LinkAttribute::Mtu(mtu) => info.mtu = Some(*mtu),
                _ => {}
            }
        }
        self.counters.applied += 1;
        if let Some(old) = self.link {
            if (old.up, old.lower_up) != (info.up, info.lower_up) {
                out.link_flapped = true;
            }
        }
        let changed = self.link != Some(info);
        self.link = Some(info);
        Some(changed)
    }

    /// `Some(changed)` when applied, `None` when ignored (counted by the caller), and
    /// counts malformed attributes itself (returning `Some(false)`).
    fn on_neighbour(&mut self, m: &NeighbourMessage, new: bool) -> Option<bool> {
        let h = &m.header;
        if h.family != AddressFamily::Inet
            || h.ifindex != self.ifindex
            || h.flags.contains(NeighbourFlags::Proxy)
        {
            return None;
        }
        let mut dst = None;
        let mut lladdr = None;
        for a in &m.attributes {
            match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => dst = Some(*ip),
                NeighbourAttribute::LinkLayerAddress(v) => lladdr = Some(v.as_slice()),
                _ => {}
            }
        }
        let Some(ip) = dst else {
            self.counters.malformed += 1;
            return Some(false);
        };
        self.counters.applied += 1;
        let entry = match (new, usable_state(h.state), lladdr) {
            (true, Some(state), Some(mac)) if mac.len() == 6 => {
                let mut b = [0u8; 6];
                b.copy_from_slice(mac);
                Some(MirroredNeighbour {
                    mac: EthernetAddress(b),
                    state,
                })
            }
            _ => None,
        };
        Some(match entry {
            Some(e) => self.neighbours.insert(ip, e) != Some(e),
            None => self.neighbours.remove(&ip).is_some(),
        })
    }

    /// Several interfaces may hold a route under one key (two interfaces on one subnet
    /// each get a connected route: the kernel appends the second, `NLM_F_APPEND`), so a
    /// message about another interface's route removes ours only when it replaced it
    /// (`NLM_F_REPLACE` on `RTM_NEWROUTE`); a deletion removes ours only when it names our
    /// interface (`RTA_OIF`), or names none and is not multipath.
    fn on_route(&mut self, m: &RouteMessage, new: bool, flags: u16) -> Option<bool> {
        let h: &RouteHeader = &m.header;
        if h.address_family != AddressFamily::Inet {
            return None;
        }
        let mut table = u32::from(h.table);
        let mut dst = Ipv4Addr::UNSPECIFIED;
        let mut gateway = None;
        let mut prefsrc = None;
        let mut oif = None;
        let mut priority = 0u32;
        let mut multipath = false;
        for a in &m.attributes {
            match a {
                RouteAttribute::Table(t) => table = *t,
                RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = *ip,
                RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gateway = Some(*ip),
                RouteAttribute::PrefSource(RouteAddress::Inet(ip)) => prefsrc = Some(*ip),
                RouteAttribute::Oif(i) => oif = Some(*i),
                RouteAttribute::Priority(p) => priority = *p,
                RouteAttribute::MultiPath(_) => multipath = true,
                _ => {}
            }
        }
        if table != u32::from(RouteHeader::RT_TABLE_MAIN) {
            return None;
        }
        let Ok(cidr) = Ipv4Cidr::new(dst, h.destination_prefix_length) else {
            self.counters.malformed += 1;
            return Some(false);
        };
        let key = RouteKey {
            dst: u32::from(cidr.address()) & cidr.mask_bits(),
            len: cidr.prefix_len(),
            tos: h.tos,
            priority,
        };
        if !new {
            // A deletion of another interface's route under the same key leaves ours.
            let ours = match oif {
                Some(i) => i == self.ifindex,
                None => !multipath,
            };
            if !ours {
                return None;
            }
            return match self.routes.remove(&key) {
                Some(_) => {
                    self.counters.applied += 1;
                    Some(true)
                }
                None => None,
            };
        }
        if h.kind != RouteType::Unicast || multipath || oif != Some(self.ifindex) {
            // Created or appended beside ours (or dumped): ours stays.
            if flags & NLM_F_REPLACE == 0 {
                return None;
            }
            // A replace may have moved this key to another interface or made it a
            // blackhole: whatever we held under it is no longer ours.
            return match self.routes.remove(&key) {
                Some(_) => {
                    self.counters.applied += 1;
                    Some(true)
                }
                None => None,
            };
        }
        self.counters.applied += 1;
        let r = KernelRoute { gateway, prefsrc };
        Some(self.routes.insert(key, r) != Some(r))
    }

    fn on_address(&mut self, m: &AddressMessage, new: bool) -> Option<bool> {
        let h = &m.header;
        if h.family != AddressFamily::Inet || h.index != self.ifindex {
            return None;
        }
        let mut local = None;
        let mut address = None;
        for a in &m.attributes {
            match a {
                AddressAttribute::Local(IpAddr::V4(ip)) => local = Some(*ip),
                AddressAttribute::Address(IpAddr::V4(ip)) => address = Some(*ip),
                _ => {}
            }
        }
        // IFA_LOCAL is the interface's own address; IFA_ADDRESS is the peer on
        // point-to-point links and equal to IFA_LOCAL otherwise.
        let Some(ip) = local.or(address) else {
            self.counters.malformed += 1;
            return Some(false);
        };
        if h.prefix_len > 32 {
            self.counters.malformed += 1;
            return Some(false);
        }
        self.counters.applied += 1;
        let a = LocalAddress {
            address: ip,
            prefix_len: h.prefix_len,
        };
        Some(if new {
            self.addresses.insert(a)
        } else {
            self.addresses.remove(&a)
        })
    }

    /// A read-only snapshot of the mirror, tagged `version`.
    ///
    /// Per prefix the route with the lowest metric (TOS 0) wins, as in the kernel's FIB;
    /// routes with a non-zero TOS are not used for lookups (luna does not route by TOS).
    pub fn snapshot(&self, version: u64) -> Snapshot {
        let mut table = RouteTable::new(self.routes.len().max(1));
        let mut last: Option<(u32, u8)> = None;
        for (k, r) in &self.routes {
            if k.tos != 0 || last == Some((k.dst, k.len)) {
                continue;
            }
            // BTreeMap order: same (dst, len) sorted by tos then priority, so the first
            // tos-0 entry of a prefix has the lowest metric.
            last = Some((k.dst, k.len));
            let Ok(destination) = Ipv4Cidr::new(Ipv4Addr::from(k.dst), k.len) else {
                continue;
            };
            let source = r
                .prefsrc
                .or_else(|| self.source_for(r.gateway.unwrap_or(Ipv4Addr::from(k.dst))))
                .unwrap_or(Ipv4Addr::UNSPECIFIED);
            let route = Route {
                destination,
                next_hop: match r.gateway {
                    Some(gw) => NextHop::Gateway(gw),
                    None => NextHop::Direct,
                },
                source,
                interface: self.ifindex,
            };
            // Capacity is the number of kernel routes, so this cannot be full.
            let _ = table.insert(route);
        }
        Snapshot {
            version,
            ifindex: self.ifindex,
            routes: table,
            neighbours: self.neighbours.iter().map(|(k, v)| (*k, *v)).collect(),
            addresses: self.addresses.iter().copied().collect(),
            link: self.link,
            gone: self.gone,
            counters: self.counters,
        }
    }

    /// The local address whose subnet holds `ip`, else the first local address.
    fn source_for(&self, ip: Ipv4Addr) -> Option<Ipv4Addr> {
        let ip = u32::from(ip);
        self.addresses
            .iter()
            .find(|a| {
                let mask = if a.prefix_len == 0 {
                    0
                } else {
                    u32::MAX << (32 - u32::from(a.prefix_len))
                };
                (u32::from(a.address) & mask) == (ip & mask)
            })
            .or_else(|| self.addresses.iter().next())
            .map(|a| a.address)
    }
}

/// Builders of well-formed netlink messages, for tests and fuzzing (here and in the
/// integration tests).
pub mod craft {
    use std::net::{IpAddr, Ipv4Addr};

    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
    use netlink_packet_route::address::{AddressAttribute, AddressMessage};
    use netlink_packet_route::link::LinkMessage;
    use netlink_packet_route::neighbour::{
        NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
    };
    use netlink_packet_route::route::{
        RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope,
        RouteType,
    };
    use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

    /// Serializes `payload` as one netlink message with `flags` and `seq`.
    pub fn emit(payload: RouteNetlinkMessage, flags: u16, seq: u32) -> Vec<u8> {
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = seq;
        let mut m = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(payload));
        m.finalize();
        let mut buf = vec![0; m.buffer_len()];
        m.serialize(&mut buf);
        buf
    }

    /// `NLMSG_DONE` for dump `seq`.
    pub fn done(seq: u32) -> Vec<u8> {
        let mut b = vec![0u8; 20];
        b[0..4].copy_from_slice(&20u32.to_ne_bytes());
        b[4..6].copy_from_slice(&3u16.to_ne_bytes());
        b[6..8].copy_from_slice(&2u16.to_ne_bytes());
        b[8..12].copy_from_slice(&seq.to_ne_bytes());
        b
    }

    /// `NLMSG_ERROR` answering request `seq` with `-errno` (the request's header echoed
    /// as zeros).
    pub fn error(seq: u32, errno: i32) -> Vec<u8> {
        let mut b = vec![0u8; 36];
        b[0..4].copy_from_slice(&36u32.to_ne_bytes());
        b[4..6].copy_from_slice(&2u16.to_ne_bytes());
        b[8..12].copy_from_slice(&seq.to_ne_bytes());
        b[16..20].copy_from_slice(&(-errno).to_ne_bytes());
        b[20..24].copy_from_slice(&16u32.to_ne_bytes());
        b[32..36].copy_from_slice(&seq.to_ne_bytes());
        b
    }

    /// A neighbour message for `ip` on `ifindex`.
    pub fn neighbour(
        ifindex: u32,
        ip: Ipv4Addr,
        mac: Option<[u8; 6]>,
        state: NeighbourState,
    ) -> NeighbourMessage {
        let mut m = NeighbourMessage::default();
        m.header.family = AddressFamily::Inet;
        m.header.ifindex = ifindex;
        m.header.state = state;
        m.attributes
            .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)));
        if let Some(mac) = mac {
            m.attributes
                .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
        }
        m
    }

    /// A main-table unicast route `dst/len` on `oif`, via `gateway` if given.
    pub fn route(
        oif: u32,
        dst: Ipv4Addr,
        len: u8,
        gateway: Option<Ipv4Addr>,
        priority: u32,
    ) -> RouteMessage {
        let mut m = RouteMessage::default();
        m.header.address_family = AddressFamily::Inet;
        m.header.destination_prefix_length = len;
        m.header.table = RouteHeader::RT_TABLE_MAIN;
        m.header.protocol = RouteProtocol::Static;
        m.header.scope = if gateway.is_some() {
            RouteScope::Universe
        } else {
            RouteScope::Link
        };
        m.header.kind = RouteType::Unicast;
        m.attributes
            .push(RouteAttribute::Table(u32::from(RouteHeader::RT_TABLE_MAIN)));
        if len > 0 {
            m.attributes
                .push(RouteAttribute::Destination(RouteAddress::Inet(dst)));
        }
        if let Some(gw) = gateway {
            m.attributes
                .push(RouteAttribute::Gateway(RouteAddress::Inet(gw)));
        }
        m.attributes.push(RouteAttribute::Oif(oif));
        if priority != 0 {
            m.attributes.push(RouteAttribute::Priority(priority));
        }
        m
    }

    /// An IPv4 address message.
    pub fn address(ifindex: u32, ip: Ipv4Addr, prefix_len: u8) -> AddressMessage {
        let mut m = AddressMessage::default();
        m.header.family = AddressFamily::Inet;
        m.header.prefix_len = prefix_len;
        m.header.index = ifindex;
        m.attributes.push(AddressAttribute::Local(IpAddr::V4(ip)));
        m.attributes.push(AddressAttribute::Address(IpAddr::V4(ip)));
        m
    }

    /// A link message for `ifindex`.
    pub fn link(ifindex: u32) -> LinkMessage {
        let mut m = LinkMessage::default();
        m.header.index = ifindex;
        m
    }
}

#[cfg(test)]
mod tests {
    use super::craft::*;
    use super::*;
    use crate::snapshot::Lookup;
    use netlink_packet_route::neighbour::NeighbourState as K;
    use netlink_packet_route::RouteNetlinkMessage as M;
    use proptest::prelude::*;

    const IF: u32 = 7;
    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 9];

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn apply(m: &mut Mirror, msg: M) -> Outcome {
        m.apply_datagram(&emit(msg, 0, 0))
    }

    #[test]
    fn neighbour_usable_states_are_kept_and_others_remove() {
        for (state, kept) in [
            (K::Reachable, Some(NeighbourState::Reachable)),
            (K::Stale, Some(NeighbourState::Stale)),
            (K::Delay, Some(NeighbourState::Stale)),
            (K::Probe, Some(NeighbourState::Stale)),
            (K::Permanent, Some(NeighbourState::Permanent)),
            (K::Noarp, Some(NeighbourState::Permanent)),
            (K::Incomplete, None),
            (K::Failed, None),
            (K::None, None),
        ] {
            let mut m = Mirror::new(IF);
            apply(
                &mut m,
                M::NewNeighbour(neighbour(IF, ip("198.18.0.2"), Some(MAC), K::Reachable)),
            );
            apply(
                &mut m,
                M::NewNeighbour(neighbour(IF, ip("198.18.0.2"), Some(MAC), state)),
            );
            let s = m.snapshot(1);
            assert_eq!(
                s.neighbour(ip("198.18.0.2")).map(|n| n.state),
                kept,
                "{state:?}"
            );
        }
    }

    #[test]
    fn neighbour_apply_is_idempotent_and_delete_removes() {
        let mut m = Mirror::new(IF);
        let msg = neighbour(IF, ip("198.18.0.2"), Some(MAC), K::Reachable);
        assert!(apply(&mut m, M::NewNeighbour(msg.clone())).changed);
        assert!(!apply(&mut m, M::NewNeighbour(msg.clone())).changed);
        assert_eq!(m.neighbour_count(), 1);
        assert!(apply(&mut m, M::DelNeighbour(msg.clone())).changed);
        assert!(!apply(&mut m, M::DelNeighbour(msg)).changed);
        assert_eq!(m.neighbour_count(), 0);
    }

    #[test]
    fn other_interface_and_ipv6_are_ignored() {
        let mut m = Mirror::new(IF);
        apply(
            &mut m,
            M::NewNeighbour(neighbour(IF + 1, ip("198.18.0.2"), Some(MAC), K::Reachable)),
        );
        apply(
            &mut m,
            M::NewRoute(route(IF + 1, ip("198.18.5.0"), 24, None, 0)),
        );
        let mut v6 = route(IF, ip("198.18.5.0"), 24, None, 0);
        v6.header.address_family = AddressFamily::Inet6;
        v6.attributes.clear();
        apply(&mut m, M::NewRoute(v6));
        assert_eq!(m.neighbour_count(), 0);
        assert_eq!(m.route_count(), 0);
        assert_eq!(m.counters().ignored, 3);
        assert_eq!(m.counters().malformed, 0);
    }

    #[test]
    fn neighbour_without_mac_or_with_bad_mac_is_not_usable() {
        let mut m = Mirror::new(IF);
        apply(
            &mut m,
            M::NewNeighbour(neighbour(IF, ip("198.18.0.2"), None, K::Reachable)),
        );
        let mut bad = neighbour(IF, ip("198.18.0.3"), None, K::Reachable);
        bad.attributes
            .push(NeighbourAttribute::LinkLayerAddress(vec![1, 2, 3]));
        apply(&mut m, M::NewNeighbour(bad));
        assert_eq!(m.neighbour_count(), 0);
    }

    #[test]
    fn longest_prefix_then_neighbour() {
        let mut m = Mirror::new(IF);
        apply(&mut m, M::NewAddress(address(IF, ip("198.18.0.1"), 24)));
        apply(
            &mut m,
            M::NewRoute(route(IF, ip("198.18.0.0"), 24, None, 0)),
        );
        apply(
            &mut m,
            M::NewRoute(route(IF, ip("0.0.0.0"), 0, Some(ip("198.18.0.254")), 0)),
        );
        apply(
            &mut m,
            M::NewRoute(route(IF, ip("198.19.0.0"), 16, Some(ip("198.18.0.200")), 0)),
        );
        apply(
            &mut m,
            M::NewNeighbour(neighbour(IF, ip("198.18.0.200"), Some(MAC), K::Stale)),
        );
        let s = m.snapshot(1);
        match s.next_hop(ip("198.19.3.4")) {
            Lookup::Resolved {
                next_hop,
                mac,
                route,
            } => {
                assert_eq!(next_hop, ip("198.18.0.200"));
                assert_eq!(mac.0, MAC);
                assert_eq!(route.source, ip("198.18.0.1"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            s.next_hop(ip("198.18.0.77")),
            Lookup::Unresolved { next_hop, .. } if next_hop == ip("198.18.0.77")
        ));
        assert!(matches!(
            s.next_hop(ip("198.20.0.1")),
            Lookup::Unresolved { next_hop, .. } if next_hop == ip("198.18.0.254")
        ));
        assert_eq!(s.next_hop(ip("198.18.0.1")), Lookup::Local);
        apply(
            &mut m,
            M::DelRoute(route(IF, ip("0.0.0.0"), 0, Some(ip("198.18.0.254")), 0)),
        );
        assert_eq!(m.snapshot(2).next_hop(ip("198.20.0.1")), Lookup::NoRoute);
    }

    #[test]
    fn lowest_metric_wins_per_prefix() {
        let mut m = Mirror::new(IF);
        apply(
            &mut m,
            M::NewRoute(route(IF, ip("198.19.0.0"), 16, Some(ip("198.18.0.9")), 200)),
        );
        apply(
            &mut m,
            M::NewRoute(route(IF, ip("198.19.0.0"), 16, Some(ip("198.18.0.8")), 100)),
        );
        let s = m.snapshot(1);
        let r = s.routes().lookup(ip("198.19.1.1")).unwrap();
        assert_eq!(r.next_hop, NextHop::Gateway(ip("198.18.0.8")));
        apply(
            &mut m,
            M::DelRoute(route(IF, ip("198.19.0.0"), 16, None, 100)),
        );
        let r = *m.snapshot(2).routes().lookup(ip("198.19.1.1")).unwrap();
        assert_eq!(r.next_hop, NextHop::Gateway(ip("198.18.0.9")));
    }

    #[test]
    fn replace_moving_a_route_away_removes_it() {
        let mut m = Mirror::new(IF);
        apply(
            &mut m,
            M::NewRoute(route(IF, ip("198.19.0.0"), 16, None, 0)),
        );
        // `ip route replace ... dev <other>`: the kernel flags it NLM_F_REPLACE.
        assert!(
            m.apply_datagram(&emit(
                M::NewRoute(route(IF + 1, ip("198.19.0.0"), 16, None, 0)),
                NLM_F_REPLACE,
                0
            ))
            .changed
        );
        assert_eq!(m.route_count(), 0);
        apply(
            &mut m,
            M::NewRoute(route(IF, ip("198.19.0.0"), 16, None, 0)),
        );
        let mut bh = route(IF, ip("198.19.0.0"), 16, None, 0);
        bh.header.kind = RouteType::BlackHole;
        m.apply_datagram(&emit(M::NewRoute(bh), NLM_F_REPLACE, 0));
        assert_eq!(m.route_count(), 0);
    }

    /// Two interfaces on one subnet each have a connected route with the same key
    /// (prefix, TOS, metric): the kernel appends the second (`NLM_F_APPEND`) and, when
    /// that address goes, deletes only the other interface's route (`RTA_OIF` = it).
    /// Neither message is about ours (flags as `ip monitor` shows them on this kernel).
    #[test]
    fn routes_of_other_interfaces_never_remove_ours() {
        use netlink_packet_core::{NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL};
        const CREATE_EXCL: u16 = NLM_F_CREATE | NLM_F_EXCL;
        const CREATE_APPEND: u16 = NLM_F_CREATE | NLM_F_APPEND;
        let mut m = Mirror::new(IF);
        m.apply_datagram(&emit(
            M::NewRoute(route(IF, ip("198.18.7.0"), 24, None, 0)),
            CREATE_EXCL,
            0,
        ));
        // The other interface's connected route, appended beside ours.
        let out = m.apply_datagram(&emit(
            M::NewRoute(route(IF + 1, ip("198.18.7.0"), 24, None, 0)),
            CREATE_APPEND,
            0,
        ));
        assert!(!out.changed);
        assert_eq!(m.route_count(), 1, "an appended route of another interface");
        // The same route in a dump (NLM_F_MULTI).
        m.apply_datagram(&emit(
            M::NewRoute(route(IF + 1, ip("198.18.7.0"), 24, None, 0)),
            2,
            1,
        ));
        assert_eq!(m.route_count(), 1, "a dumped route of another interface");
        // Its deletion (`ip addr del` on the other interface).
        let out = m.apply_datagram(&emit(
            M::DelRoute(route(IF + 1, ip("198.18.7.0"), 24, None, 0)),
            0,
            0,
        ));
        assert!(!out.changed);
        assert_eq!(m.route_count(), 1, "a deleted route of another interface");
        assert!(m.snapshot(1).routes().lookup(ip("198.18.7.9")).is_some());
        assert_eq!(m.counters().ignored, 3);
        // Our own deletion still removes it.
        m.apply_datagram(&emit(
            M::DelRoute(route(IF, ip("198.18.7.0"), 24, None, 0)),
            0,
            0,
        ));
        assert_eq!(m.route_count(), 0);
    }

    #[test]
    fn other_tables_are_ignored() {
        let mut m = Mirror::new(IF);
        let mut r = route(IF, ip("198.18.0.1"), 32, None, 0);
        r.attributes
            .retain(|a| !matches!(a, RouteAttribute::Table(_)));
        r.header.table = 255;
        apply(&mut m, M::NewRoute(r));
        assert_eq!(m.route_count(), 0);
    }

    #[test]
    fn addresses_follow_new_and_del() {
        let mut m = Mirror::new(IF);
        apply(&mut m, M::NewAddress(address(IF, ip("198.18.0.1"), 24)));
        apply(&mut m, M::NewAddress(address(IF, ip("198.18.1.1"), 24)));
        assert!(m.snapshot(1).is_local(ip("198.18.1.1")));
        apply(&mut m, M::DelAddress(address(IF, ip("198.18.1.1"), 24)));
        let s = m.snapshot(2);
        assert!(!s.is_local(ip("198.18.1.1")));
        assert_eq!(s.addresses().len(), 1);
    }

    #[test]
    fn dellink_of_our_interface_marks_it_gone() {
        let mut m = Mirror::new(IF);
        apply(
            &mut m,
            M::NewRoute(route(IF, ip("198.18.0.0"), 24, None, 0)),
        );
        assert!(!apply(&mut m, M::DelLink(link(IF + 1))).changed);
        assert!(apply(&mut m, M::DelLink(link(IF))).changed);
        let s = m.snapshot(1);
        assert!(s.interface_gone());
        assert_eq!(s.next_hop(ip("198.18.0.5")), Lookup::NoRoute);
    }

    #[test]
    fn link_state_is_tracked_and_a_flap_is_reported() {
        let mut m = Mirror::new(IF);
        let mut l = link(IF);
        l.header.flags = LinkFlags::Up | LinkFlags::LowerUp;
        l.attributes.push(LinkAttribute::Address(MAC.to_vec()));
        l.attributes.push(LinkAttribute::Mtu(1500));
        let first = apply(&mut m, M::NewLink(l.clone()));
        assert!(first.changed && !first.link_flapped);
        assert!(!apply(&mut m, M::NewLink(l.clone())).changed);
        let s = m.snapshot(1);
        let info = s.link().unwrap();
        assert_eq!(
            (info.up, info.lower_up, info.mac.map(|x| x.0), info.mtu),
            (true, true, Some(MAC), Some(1500))
        );
        l.header.flags = LinkFlags::empty();
        assert!(apply(&mut m, M::NewLink(l)).link_flapped);
        assert!(!m.snapshot(2).link().unwrap().up);
        // Other interfaces' links are ignored.
        assert!(!apply(&mut m, M::NewLink(link(IF + 1))).link_flapped);
    }

    #[test]
    fn several_messages_in_one_datagram_and_done() {
        let mut m = Mirror::new(IF);
        let mut d = emit(
            M::NewNeighbour(neighbour(IF, ip("198.18.0.2"), Some(MAC), K::Reachable)),
            2,
            5,
        );
        d.extend(emit(
            M::NewNeighbour(neighbour(IF, ip("198.18.0.3"), Some(MAC), K::Reachable)),
            2,
            5,
        ));
        d.extend(done(5));
        let out = m.apply_datagram(&d);
        assert!(out.changed);
        assert_eq!(out.done, vec![5]);
        assert_eq!(m.neighbour_count(), 2);
    }

    #[test]
    fn dump_intr_flag_is_reported() {
        let mut m = Mirror::new(IF);
        let d = emit(
            M::NewNeighbour(neighbour(IF, ip("198.18.0.2"), Some(MAC), K::Reachable)),
            2 | NLM_F_DUMP_INTR,
            5,
        );
        assert!(m.apply_datagram(&d).dump_interrupted);
        assert_eq!(m.counters().dumps_interrupted, 1);
    }

    #[test]
    fn malformed_length_is_counted_and_stops_the_datagram() {
        let mut m = Mirror::new(IF);
        let mut d = emit(
            M::NewNeighbour(neighbour(IF, ip("198.18.0.2"), Some(MAC), K::Reachable)),
            0,
            0,
        );
        d[0..4].copy_from_slice(&9999u32.to_ne_bytes());
        let out = m.apply_datagram(&d);
        assert!(out.truncated);
        assert_eq!(m.counters().malformed, 1);
        assert_eq!(m.neighbour_count(), 0);
        // A header shorter than 16 bytes.
        assert!(m.apply_datagram(&[1, 2, 3]).truncated);
        assert_eq!(m.counters().malformed, 2);
    }

    #[test]
    fn malformed_attribute_is_skipped_and_the_next_message_applies() {
        let mut m = Mirror::new(IF);
        let mut bad = emit(
            M::NewNeighbour(neighbour(IF, ip("198.18.0.2"), Some(MAC), K::Reachable)),
            0,
            0,
        );
        // First attribute (after 16 + 12 header bytes): claim a length past the end.
        bad[28..30].copy_from_slice(&200u16.to_ne_bytes());
        let good = emit(
            M::NewNeighbour(neighbour(IF, ip("198.18.0.3"), Some(MAC), K::Reachable)),
            0,
            0,
        );
        let mut d = bad;
        d.extend(good);
        m.apply_datagram(&d);
        assert_eq!(m.counters().malformed, 1);
        assert!(m.snapshot(1).neighbour(ip("198.18.0.3")).is_some());
        assert!(m.snapshot(1).neighbour(ip("198.18.0.2")).is_none());
    }

    #[test]
    fn impossible_prefix_lengths_and_addressless_addresses_are_malformed() {
        let mut m = Mirror::new(IF);
        let mut r = route(IF, ip("198.19.0.0"), 16, None, 0);
        r.header.destination_prefix_length = 33;
        apply(&mut m, M::NewRoute(r));
        let mut a = address(IF, ip("198.18.0.1"), 24);
        a.header.prefix_len = 40;
        apply(&mut m, M::NewAddress(a));
        let mut a = address(IF, ip("198.18.0.1"), 24);
        a.attributes.clear();
        apply(&mut m, M::NewAddress(a));
        assert_eq!(m.counters().malformed, 3);
        let snap = m.snapshot(1);
        assert!(snap.routes().is_empty() && snap.addresses().is_empty());
        // The mirror still applies good messages afterwards.
        apply(
            &mut m,
            M::NewRoute(route(IF, ip("198.19.0.0"), 16, None, 0)),
        );
        assert_eq!(m.snapshot(2).routes().len(), 1);
    }

    #[test]
    fn neighbour_without_destination_is_malformed() {
        let mut m = Mirror::new(IF);
        let mut n = neighbour(IF, ip("198.18.0.2"), Some(MAC), K::Reachable);
        n.attributes
            .retain(|a| !matches!(a, NeighbourAttribute::Destination(_)));
        apply(&mut m, M::NewNeighbour(n));
        assert_eq!(m.counters().malformed, 1);
    }

    #[test]
    fn error_and_unknown_types() {
        let mut m = Mirror::new(IF);
        // NLMSG_ERROR -ENOENT for seq 9: 16 header + 4 code + 16 original header.
        let mut e = vec![0u8; 36];
        e[0..4].copy_from_slice(&36u32.to_ne_bytes());
        e[4..6].copy_from_slice(&2u16.to_ne_bytes());
        e[8..12].copy_from_slice(&9u32.to_ne_bytes());
        e[16..20].copy_from_slice(&(-2i32).to_ne_bytes());
        assert_eq!(m.apply_datagram(&e).errors, vec![(9, -2)]);
        let mut u = done(1);
        u[4..6].copy_from_slice(&0x99u16.to_ne_bytes());
        m.apply_datagram(&u);
        assert_eq!(m.counters().ignored, 1);
    }

    fn valid_messages() -> Vec<Vec<u8>> {
        vec![
            emit(
                M::NewNeighbour(neighbour(IF, ip("198.18.0.2"), Some(MAC), K::Reachable)),
                0,
                1,
            ),
            emit(
                M::DelNeighbour(neighbour(IF, ip("198.18.0.2"), Some(MAC), K::Failed)),
                0,
                1,
            ),
            emit(
                M::NewRoute(route(IF, ip("198.19.0.0"), 16, Some(ip("198.18.0.9")), 5)),
                0,
                1,
            ),
            emit(M::DelRoute(route(IF, ip("198.19.0.0"), 16, None, 5)), 0, 1),
            emit(M::NewAddress(address(IF, ip("198.18.0.1"), 24)), 0, 1),
            emit(M::DelLink(link(IF)), 0, 1),
            emit(M::NewLink(link(IF)), 0, 1),
            done(1),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut m = Mirror::new(IF);
            let _ = m.apply_datagram(&bytes);
            let _ = m.snapshot(1).next_hop(ip("198.18.0.2"));
        }

        #[test]
        fn mutated_valid_messages_never_panic(
            which in 0usize..8,
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
            cut in any::<usize>(),
        ) {
            let mut d = valid_messages()[which].clone();
            for (pos, val) in flips {
                let i = pos % d.len();
                d[i] = val;
            }
            let keep = cut % (d.len() + 1);
            d.truncate(keep.max(16).min(d.len()));
            let mut m = Mirror::new(IF);
            let _ = m.apply_datagram(&d);
            let _ = m.snapshot(1).next_hop(ip("198.19.0.2"));
        }

        #[test]
        fn applying_twice_is_applying_once(order in proptest::collection::vec(0usize..8, 0..20)) {
            let msgs = valid_messages();
            let mut once = Mirror::new(IF);
            let mut twice = Mirror::new(IF);
            for i in order {
                once.apply_datagram(&msgs[i]);
                twice.apply_datagram(&msgs[i]);
                twice.apply_datagram(&msgs[i]);
            }
            let (a, b) = (once.snapshot(1), twice.snapshot(1));
            prop_assert_eq!(a.routes().iter().collect::<Vec<_>>(), b.routes().iter().collect::<Vec<_>>());
            let mut na: Vec<_> = a.neighbours().collect();
            let mut nb: Vec<_> = b.neighbours().collect();
            na.sort_by_key(|x| *x.0);
            nb.sort_by_key(|x| *x.0);
            prop_assert_eq!(na, nb);
            prop_assert_eq!(a.addresses(), b.addresses());
            prop_assert_eq!(a.interface_gone(), b.interface_gone());
        }
    }
}
