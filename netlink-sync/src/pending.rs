//! Packets waiting for the kernel to resolve their next hop (sans-IO).
//!
//! With mirroring on, luna never sends ARP itself. A packet whose next hop has no usable
//! neighbour entry ([`crate::Lookup::Unresolved`]) is queued here;
//! [`PendingNextHops::poll_nudge`] names the next hops the driver should make the kernel
//! resolve (with [`crate::nudge::Nudger`] or by sending through the exception interface);
//! when a snapshot with the entry arrives, [`PendingNextHops::on_snapshot`] hands the packets
//! back in arrival order with the MAC. A next hop that stays unresolved after
//! `max_nudges` nudges and one more `retry_interval` is given up: its packets are dropped
//! and counted (the kernel's own limit is 3 ARP probes, `mcast_solicit`).
//!
//! Driver order per poll iteration: `reader.refresh()` → if it changed, `on_snapshot` →
//! `poll_nudge` until `None` → `expire`; sleep no longer than `poll_timeout`.
//! Bounded: at most `per_next_hop` packets per next hop and `total` overall; a packet that
//! does not fit is returned to the caller (to free) and counted.

use std::collections::{BTreeMap, VecDeque};
use std::net::Ipv4Addr;

use luna_stack::time::{Duration, Instant};
use luna_stack::wire::EthernetAddress;

use crate::snapshot::{Lookup, Snapshot};

/// Bounds and timers of the pending queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingConfig {
    /// Packets queued per next hop (Linux `unres_qlen` is 101 packets by default).
    pub per_next_hop: usize,
    /// Packets queued over all next hops.
    pub total: usize,
    /// Time between nudges of one next hop.
    pub retry_interval: Duration,
    /// Nudges before giving up (after one more interval).
    pub max_nudges: u32,
}

impl Default for PendingConfig {
    fn default() -> Self {
        PendingConfig {
            per_next_hop: 64,
            total: 4096,
            retry_interval: Duration::from_secs(1),
            max_nudges: 3,
        }
    }
}

/// Counters of the pending queues.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PendingCounters {
    /// Packets queued.
    pub queued: u64,
    /// Packets handed back with a MAC.
    pub released: u64,
    /// Packets refused: the next hop's queue was full.
    pub dropped_hop_full: u64,
    /// Packets refused: the total bound was reached.
    pub dropped_total_full: u64,
    /// Packets refused by [`PendingNextHops::egress`]: no route (or the interface is gone).
    pub dropped_no_route: u64,
    /// Packets dropped because their next hop never resolved.
    pub dropped_unresolved: u64,
    /// Nudges asked for.
    pub nudges: u64,
}

/// What to do with an outgoing packet: the answer of [`PendingNextHops::egress`].
#[derive(Debug, PartialEq, Eq)]
pub enum Egress<P> {
    /// Send now to `mac`.
    Send {
        /// The next hop's hardware address.
        mac: EthernetAddress,
        /// The packet.
        packet: P,
    },
    /// Queued until the next hop resolves.
    Queued,
    /// The destination is the interface's own address: loop it back.
    Local(P),
    /// Drop it (free the packet): no route, or the pending queue is full (both counted).
    Drop(P),
}

#[derive(Debug)]
struct Hop<P> {
    packets: VecDeque<P>,
    /// When the next nudge is due, or (after the last nudge) when to give up.
    due: Instant,
    nudges: u32,
}

/// Per next hop FIFO queues of packets waiting for resolution.
#[derive(Debug)]
pub struct PendingNextHops<P> {
    config: PendingConfig,
    hops: BTreeMap<Ipv4Addr, Hop<P>>,
    total: usize,
    counters: PendingCounters,
}

impl<P> PendingNextHops<P> {
    /// Empty queues with `config`.
    pub fn new(config: PendingConfig) -> Self {
        PendingNextHops {
            config,
            hops: BTreeMap::new(),
            total: 0,
            counters: PendingCounters::default(),
        }
    }

    /// The counters.
    pub fn counters(&self) -> &PendingCounters {
        &self.counters
    }

    /// Packets queued now.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Nothing queued.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Next hops with packets waiting.
    pub fn next_hops(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.hops.keys().copied()
    }

    /// Queues `packet` until `next_hop` resolves. A new next hop is due for a nudge at once.
    /// When a bound is reached the packet comes back as `Err` (counted): free it.
    pub fn enqueue(&mut self, now: Instant, next_hop: Ipv4Addr, packet: P) -> Result<(), P> {
        if self.total >= self.config.total {
            self.counters.dropped_total_full += 1;
            return Err(packet);
        }
        let hop = self.hops.entry(next_hop).or_insert_with(|| Hop {
            packets: VecDeque::new(),
            due: now,
            nudges: 0,
        });
        if hop.packets.len() >= self.config.per_next_hop {
            self.counters.dropped_hop_full += 1;
            return Err(packet);
        }
        hop.packets.push_back(packet);
        self.total += 1;
        self.counters.queued += 1;
        Ok(())
    }

    /// The whole egress decision for `packet` to `dst`: look it up in `snap`; send it,
    /// loop it back, queue it behind its unresolved next hop, or drop it (counted).
    /// A packet to a next hop that already has packets waiting is queued behind them even
    /// if `snap` has just resolved it, so the order per next hop is kept; release the queue
    /// with [`PendingNextHops::on_snapshot`] first.
    pub fn egress(&mut self, snap: &Snapshot, now: Instant, dst: Ipv4Addr, packet: P) -> Egress<P> {
        match snap.next_hop(dst) {
            Lookup::Resolved { next_hop, mac, .. } => {
                if self.hops.contains_key(&next_hop) {
                    match self.enqueue(now, next_hop, packet) {
                        Ok(()) => Egress::Queued,
                        Err(p) => Egress::Drop(p),
                    }
                } else {
                    Egress::Send { mac, packet }
                }
            }
            Lookup::Unresolved { next_hop, .. } => match self.enqueue(now, next_hop, packet) {
                Ok(()) => Egress::Queued,
                Err(p) => Egress::Drop(p),
            },
            Lookup::Local => Egress::Local(packet),
            Lookup::NoRoute => {
                self.counters.dropped_no_route += 1;
                Egress::Drop(packet)
            }
        }
    }

    /// A next hop whose nudge is due at `now` (call until `None`).
    #[must_use]
    pub fn poll_nudge(&mut self, now: Instant) -> Option<Ipv4Addr> {
        let (ip, hop) = self
            .hops
            .iter_mut()
            .find(|(_, h)| h.due <= now && h.nudges < self.config.max_nudges)?;
        hop.nudges += 1;
        hop.due = now + self.config.retry_interval;
        self.counters.nudges += 1;
        Some(*ip)
    }

    /// Hands back, in arrival order, the packets of every next hop that `snap` resolves.
    /// Returns how many were released.
    pub fn on_snapshot(
        &mut self,
        snap: &Snapshot,
        mut send: impl FnMut(Ipv4Addr, EthernetAddress, P),
    ) -> usize {
        let resolved: Vec<(Ipv4Addr, EthernetAddress)> = self
            .hops
            .keys()
            .filter_map(|ip| snap.neighbour(*ip).map(|n| (*ip, n.mac)))
            .collect();
        let mut n = 0;
        for (ip, mac) in resolved {
            if let Some(hop) = self.hops.remove(&ip) {
                self.total -= hop.packets.len();
                for p in hop.packets {
                    n += 1;
                    send(ip, mac, p);
                }
            }
        }
        self.counters.released += n as u64;
        n
    }

    /// Gives up on next hops that used all their nudges and waited one more interval;
    /// their packets go to `drop` (counted). Returns how many packets were dropped.
    pub fn expire(&mut self, now: Instant, mut drop: impl FnMut(Ipv4Addr, P)) -> usize {
        let max = self.config.max_nudges;
        let dead: Vec<Ipv4Addr> = self
            .hops
            .iter()
            .filter(|(_, h)| h.nudges >= max && h.due <= now)
            .map(|(ip, _)| *ip)
            .collect();
        let mut n = 0;
        for ip in dead {
            if let Some(hop) = self.hops.remove(&ip) {
                self.total -= hop.packets.len();
                for p in hop.packets {
                    n += 1;
                    drop(ip, p);
                }
            }
        }
        self.counters.dropped_unresolved += n as u64;
        n
    }

    /// Drops everything (the interface is gone); counted as unresolved.
    pub fn clear(&mut self, mut drop: impl FnMut(Ipv4Addr, P)) -> usize {
        let mut n = 0;
        for (ip, hop) in std::mem::take(&mut self.hops) {
            for p in hop.packets {
                n += 1;
                drop(ip, p);
            }
        }
        self.total = 0;
        self.counters.dropped_unresolved += n as u64;
        n
    }

    /// When `poll_nudge` or `expire` next has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.hops.values().map(|h| h.due).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::craft::{emit, neighbour};
    use crate::mirror::Mirror;
    use netlink_packet_route::neighbour::NeighbourState as K;
    use netlink_packet_route::RouteNetlinkMessage as M;

    const A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
    const B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 3);
    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn t(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    fn cfg() -> PendingConfig {
        PendingConfig {
            per_next_hop: 2,
            total: 3,
            retry_interval: Duration::from_millis(100),
            max_nudges: 2,
        }
    }

    fn resolved(ip: Ipv4Addr) -> Snapshot {
        let mut m = Mirror::new(1);
        m.apply_datagram(&emit(
            M::NewNeighbour(neighbour(1, ip, Some(MAC), K::Reachable)),
            0,
            0,
        ));
        m.snapshot(1)
    }

    #[test]
    fn bounds_refuse_and_count() {
        let mut p = PendingNextHops::new(cfg());
        assert!(p.enqueue(t(0), A, 1).is_ok());
        assert!(p.enqueue(t(0), A, 2).is_ok());
        assert_eq!(p.enqueue(t(0), A, 3), Err(3));
        assert!(p.enqueue(t(0), B, 4).is_ok());
        assert_eq!(p.enqueue(t(0), B, 5), Err(5));
        let c = p.counters();
        assert_eq!(
            (c.queued, c.dropped_hop_full, c.dropped_total_full),
            (3, 1, 1)
        );
        assert_eq!(p.len(), 3);
    }

    #[test]
    fn nudges_are_paced_then_the_hop_is_given_up() {
        let mut p = PendingNextHops::new(cfg());
        p.enqueue(t(0), A, 1).unwrap();
        assert_eq!(p.poll_nudge(t(0)), Some(A));
        assert_eq!(p.poll_nudge(t(0)), None);
        assert_eq!(p.poll_timeout(), Some(t(100)));
        assert_eq!(p.poll_nudge(t(99)), None);
        assert_eq!(p.poll_nudge(t(100)), Some(A));
        // Out of nudges: nothing more, and expiry one interval after the last nudge.
        assert_eq!(p.poll_nudge(t(500)), None);
        let mut dropped = vec![];
        assert_eq!(p.expire(t(199), |_, x| dropped.push(x)), 0);
        assert_eq!(p.expire(t(200), |_, x| dropped.push(x)), 1);
        assert_eq!(dropped, vec![1]);
        assert!(p.is_empty());
        assert_eq!(p.counters().dropped_unresolved, 1);
        assert_eq!(p.counters().nudges, 2);
    }

    #[test]
    fn resolution_releases_in_order_with_the_mac() {
        let mut p = PendingNextHops::new(cfg());
        p.enqueue(t(0), A, 1).unwrap();
        p.enqueue(t(0), A, 2).unwrap();
        p.enqueue(t(0), B, 3).unwrap();
        let mut out = vec![];
        assert_eq!(
            p.on_snapshot(&resolved(A), |ip, mac, x| out.push((ip, mac.0, x))),
            2
        );
        assert_eq!(out, vec![(A, MAC, 1), (A, MAC, 2)]);
        assert_eq!(p.len(), 1);
        assert_eq!(p.next_hops().collect::<Vec<_>>(), vec![B]);
        assert_eq!(p.clear(|_, _| {}), 1);
        assert_eq!(p.counters().released, 2);
        assert_eq!(p.counters().dropped_unresolved, 1);
    }

    #[test]
    fn egress_sends_queues_loops_back_or_drops() {
        use crate::mirror::craft::{address, route};
        let mut m = Mirror::new(1);
        m.apply_datagram(&emit(
            M::NewAddress(address(1, Ipv4Addr::new(198, 18, 0, 1), 24)),
            0,
            0,
        ));
        m.apply_datagram(&emit(
            M::NewRoute(route(1, Ipv4Addr::new(198, 18, 0, 0), 24, None, 0)),
            0,
            0,
        ));
        let unresolved = m.snapshot(1);
        m.apply_datagram(&emit(
            M::NewNeighbour(neighbour(1, A, Some(MAC), K::Reachable)),
            0,
            0,
        ));
        let resolved = m.snapshot(2);
        let mut p = PendingNextHops::new(cfg());
        assert_eq!(p.egress(&unresolved, t(0), A, 1), Egress::Queued);
        // Resolved now, but 1 is still waiting: 2 goes behind it.
        assert_eq!(p.egress(&resolved, t(0), A, 2), Egress::Queued);
        let mut out = vec![];
        p.on_snapshot(&resolved, |_, _, x| out.push(x));
        assert_eq!(out, vec![1, 2]);
        assert_eq!(
            p.egress(&resolved, t(0), A, 3),
            Egress::Send {
                mac: EthernetAddress(MAC),
                packet: 3
            }
        );
        assert_eq!(
            p.egress(&resolved, t(0), Ipv4Addr::new(198, 18, 0, 1), 4),
            Egress::Local(4)
        );
        assert_eq!(
            p.egress(&resolved, t(0), Ipv4Addr::new(198, 20, 0, 1), 5),
            Egress::Drop(5)
        );
        assert_eq!(p.counters().dropped_no_route, 1);
    }

    proptest::proptest! {
        /// Every packet handed in is queued-then-released, refused, dropped, or still
        /// queued; the bounds always hold.
        #[test]
        fn packets_are_conserved_and_bounds_hold(
            ops in proptest::collection::vec((0u8..5, 0u8..4, 0u64..50), 0..200)
        ) {
            let mut p = PendingNextHops::new(cfg());
            let (mut now, mut handed, mut out) = (0u64, 0u64, 0u64);
            for (op, hop, dt) in ops {
                now += dt;
                let ip = Ipv4Addr::new(198, 18, 0, 2 + hop);
                match op {
                    0 | 1 => {
                        handed += 1;
                        if p.enqueue(t(now), ip, handed).is_err() {
                            out += 1;
                        }
                    }
                    2 => while p.poll_nudge(t(now)).is_some() {},
                    3 => out += p.on_snapshot(&resolved(ip), |_, _, _| {}) as u64,
                    _ => out += p.expire(t(now), |_, _| {}) as u64,
                }
                proptest::prop_assert!(p.len() <= cfg().total);
                for h in p.hops.values() {
                    proptest::prop_assert!(h.packets.len() <= cfg().per_next_hop);
                }
                proptest::prop_assert_eq!(handed, out + p.len() as u64);
            }
            let c = *p.counters();
            proptest::prop_assert_eq!(
                c.queued,
                c.released + c.dropped_unresolved + p.len() as u64
            );
        }
    }
}
