//! The route table: longest-prefix match over IPv4 prefixes (RFC 1812 §5.2.4.3).
//!
//! One route per prefix (inserting the same prefix replaces it; whoever mirrors several
//! kernel routes of one prefix picks the best first). Lookup walks only the prefix lengths
//! present, longest first, with a binary search in each: O(k log n) for k distinct lengths.
//! Results depend only on the contents, never on insertion order.

use super::TableFull;
use crate::wire::Ipv4Cidr;
use core::net::Ipv4Addr;

/// Where to send a datagram that matches a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NextHop {
    /// On-link: resolve the destination itself.
    Direct,
    /// Via this gateway (resolve the gateway's address).
    Gateway(Ipv4Addr),
}

/// One route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Route {
    /// The prefix (host bits are cleared on insert).
    pub destination: Ipv4Cidr,
    /// Direct or via a gateway.
    pub next_hop: NextHop,
    /// Source address to use for traffic on this route.
    pub source: Ipv4Addr,
    /// Interface (port) index.
    pub interface: u32,
}

impl Route {
    /// The address to resolve at the link layer for `dst`.
    pub fn next_hop_addr(&self, dst: Ipv4Addr) -> Ipv4Addr {
        match self.next_hop {
            NextHop::Direct => dst,
            NextHop::Gateway(gw) => gw,
        }
    }
}

/// A bounded longest-prefix-match table.
#[derive(Debug, Clone)]
pub struct RouteTable {
    // buckets[len] holds the /len routes sorted by network address.
    buckets: Vec<Vec<Route>>,
    // Bit `len` set when buckets[len] is non-empty.
    present: u64,
    len: usize,
    capacity: usize,
}

impl RouteTable {
    /// An empty table holding at most `capacity` routes.
    pub fn new(capacity: usize) -> Self {
        RouteTable {
            buckets: vec![Vec::new(); 33],
            present: 0,
            len: 0,
            capacity,
        }
    }

    /// Number of routes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No routes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most routes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn locate(&self, net: Ipv4Cidr) -> (usize, Result<usize, usize>) {
        let plen = usize::from(net.prefix_len());
        let key = net.address().to_bits();
        let pos =
            self.buckets[plen].binary_search_by_key(&key, |r| r.destination.address().to_bits());
        (plen, pos)
    }

    /// Add a route, replacing (and returning) any route for the same prefix.
    pub fn insert(&mut self, mut route: Route) -> Result<Option<Route>, TableFull> {
        route.destination = route.destination.network();
        let (plen, pos) = self.locate(route.destination);
        match pos {
            Ok(i) => Ok(Some(core::mem::replace(&mut self.buckets[plen][i], route))),
            Err(i) => {
                if self.len >= self.capacity {
                    return Err(TableFull);
                }
                self.buckets[plen].insert(i, route);
                self.present |= 1 << plen;
                self.len += 1;
                Ok(None)
            }
        }
    }

    /// Set the default route (0.0.0.0/0) via `gateway`.
    pub fn set_default(
        &mut self,
        gateway: Ipv4Addr,
        source: Ipv4Addr,
        interface: u32,
    ) -> Result<Option<Route>, TableFull> {
        let any = Ipv4Cidr::new(Ipv4Addr::UNSPECIFIED, 0).map_err(|_| TableFull)?;
        self.insert(Route {
            destination: any,
            next_hop: NextHop::Gateway(gateway),
            source,
            interface,
        })
    }

    /// Remove the route for exactly this prefix (host bits ignored).
    pub fn remove(&mut self, destination: Ipv4Cidr) -> Option<Route> {
        let (plen, pos) = self.locate(destination.network());
        let i = pos.ok()?;
        let r = self.buckets[plen].remove(i);
        if self.buckets[plen].is_empty() {
            self.present &= !(1 << plen);
        }
        self.len -= 1;
        Some(r)
    }

    /// Remove every route.
    pub fn clear(&mut self) {
        for b in &mut self.buckets {
            b.clear();
        }
        self.present = 0;
        self.len = 0;
    }

    /// The route for exactly this prefix.
    pub fn get(&self, destination: Ipv4Cidr) -> Option<&Route> {
        let (plen, pos) = self.locate(destination.network());
        pos.ok().map(|i| &self.buckets[plen][i])
    }

    /// The most specific route containing `dst` (RFC 1812 §5.2.4.3 longest match).
    pub fn lookup(&self, dst: Ipv4Addr) -> Option<&Route> {
        let mut lens = self.present;
        while lens != 0 {
            // Highest set bit = longest prefix length still to try.
            let plen = 63 - lens.leading_zeros() as usize;
            lens &= !(1u64 << plen);
            let mask = if plen == 0 {
                0
            } else {
                u32::MAX << (32 - plen)
            };
            let key = dst.to_bits() & mask;
            let bucket = &self.buckets[plen];
            if let Ok(i) = bucket.binary_search_by_key(&key, |r| r.destination.address().to_bits())
            {
                return Some(&bucket[i]);
            }
        }
        None
    }

    /// The route for `dst` and the address to resolve at the link layer.
    pub fn next_hop(&self, dst: Ipv4Addr) -> Option<(Ipv4Addr, &Route)> {
        self.lookup(dst).map(|r| (r.next_hop_addr(dst), r))
    }

    /// All routes, longest prefix first, then by network address.
    pub fn iter(&self) -> impl Iterator<Item = &Route> {
        self.buckets.iter().rev().flat_map(|b| b.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cidr(s: &str) -> Ipv4Cidr {
        s.parse().unwrap()
    }

    fn addr(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn route(net: &str, hop: NextHop, iface: u32) -> Route {
        Route {
            destination: cidr(net),
            next_hop: hop,
            source: addr("198.18.0.1"),
            interface: iface,
        }
    }

    #[test]
    fn rfc1812_5_2_4_3_longest_prefix_wins_over_overlaps() {
        let mut t = RouteTable::new(16);
        let gw = addr("198.18.0.254");
        t.set_default(gw, addr("198.18.0.1"), 0).unwrap();
        t.insert(route(
            "198.18.0.0/15",
            NextHop::Gateway(addr("198.18.0.253")),
            1,
        ))
        .unwrap();
        t.insert(route("198.18.0.0/24", NextHop::Direct, 2))
            .unwrap();
        t.insert(route("198.18.0.128/25", NextHop::Direct, 3))
            .unwrap();
        t.insert(route(
            "198.18.0.200/32",
            NextHop::Gateway(addr("198.18.0.252")),
            4,
        ))
        .unwrap();

        let iface = |s: &str| t.lookup(addr(s)).map(|r| r.interface);
        assert_eq!(iface("198.18.0.200"), Some(4)); // /32
        assert_eq!(iface("198.18.0.201"), Some(3)); // /25
        assert_eq!(iface("198.18.0.5"), Some(2)); // /24
        assert_eq!(iface("198.19.7.7"), Some(1)); // /15
        assert_eq!(iface("203.0.113.1"), Some(0)); // /0 default
        assert_eq!(
            t.next_hop(addr("198.18.0.5")).unwrap().0,
            addr("198.18.0.5")
        );
        assert_eq!(t.next_hop(addr("203.0.113.1")).unwrap().0, gw);
        assert_eq!(
            t.next_hop(addr("198.18.0.200")).unwrap().0,
            addr("198.18.0.252")
        );
    }

    #[test]
    fn no_default_no_match() {
        let mut t = RouteTable::new(4);
        t.insert(route("198.18.0.0/24", NextHop::Direct, 0))
            .unwrap();
        assert!(t.lookup(addr("198.18.1.1")).is_none());
        assert!(RouteTable::new(4).lookup(addr("1.2.3.4")).is_none());
    }

    #[test]
    fn slash_zero_and_slash_32_edges() {
        let mut t = RouteTable::new(4);
        t.insert(route("255.255.255.255/32", NextHop::Direct, 7))
            .unwrap();
        t.insert(route("0.0.0.0/32", NextHop::Direct, 8)).unwrap();
        assert_eq!(t.lookup(addr("255.255.255.255")).unwrap().interface, 7);
        assert_eq!(t.lookup(addr("0.0.0.0")).unwrap().interface, 8);
        assert!(t.lookup(addr("255.255.255.254")).is_none());
        // A /0 with host bits set is normalised and matches everything.
        t.insert(route("10.1.2.3/0", NextHop::Direct, 9)).unwrap();
        assert_eq!(t.lookup(addr("255.255.255.254")).unwrap().interface, 9);
        assert_eq!(
            t.get(cidr("0.0.0.0/0")).unwrap().destination,
            cidr("0.0.0.0/0")
        );
    }

    #[test]
    fn replace_remove_and_capacity() {
        let mut t = RouteTable::new(2);
        assert_eq!(
            t.insert(route("198.18.0.0/24", NextHop::Direct, 1)),
            Ok(None)
        );
        // Same prefix (host bits differ) replaces, needing no room.
        let old = t
            .insert(route("198.18.0.77/24", NextHop::Direct, 2))
            .unwrap();
        assert_eq!(old.map(|r| r.interface), Some(1));
        assert_eq!(t.len(), 1);
        t.insert(route("198.19.0.0/16", NextHop::Direct, 3))
            .unwrap();
        assert_eq!(
            t.insert(route("198.18.1.0/24", NextHop::Direct, 4)),
            Err(TableFull)
        );
        assert_eq!(
            t.remove(cidr("198.18.0.9/24")).map(|r| r.interface),
            Some(2)
        );
        assert!(t.remove(cidr("198.18.0.0/24")).is_none());
        assert!(t.lookup(addr("198.18.0.1")).is_none());
        t.insert(route("198.18.1.0/24", NextHop::Direct, 4))
            .unwrap();
        assert_eq!(t.len(), 2);
        t.clear();
        assert!(t.is_empty() && t.lookup(addr("198.18.1.1")).is_none());
    }

    #[test]
    fn iteration_is_deterministic() {
        let routes = [
            "198.18.0.0/24",
            "0.0.0.0/0",
            "198.18.0.0/16",
            "198.18.5.0/24",
        ];
        let mut a = RouteTable::new(8);
        let mut b = RouteTable::new(8);
        for (i, r) in routes.iter().enumerate() {
            a.insert(route(r, NextHop::Direct, i as u32)).unwrap();
        }
        for (i, r) in routes.iter().enumerate().rev() {
            b.insert(route(r, NextHop::Direct, i as u32)).unwrap();
        }
        let la: Vec<_> = a.iter().map(|r| r.destination.to_string()).collect();
        let lb: Vec<_> = b.iter().map(|r| r.destination.to_string()).collect();
        assert_eq!(la, lb);
        assert_eq!(
            la,
            vec![
                "198.18.0.0/24",
                "198.18.5.0/24",
                "198.18.0.0/16",
                "0.0.0.0/0"
            ]
        );
    }

    proptest! {
        /// LPM equals a brute-force scan for the longest containing prefix.
        #[test]
        fn lpm_matches_linear_scan(
            nets in proptest::collection::vec((any::<u32>(), 0u8..=32), 0..40),
            probes in proptest::collection::vec(any::<u32>(), 1..40),
        ) {
            let mut t = RouteTable::new(64);
            let mut list: Vec<Route> = Vec::new();
            for (i, (a, l)) in nets.iter().enumerate() {
                let r = Route {
                    destination: Ipv4Cidr::new(Ipv4Addr::from_bits(*a), *l).unwrap(),
                    next_hop: NextHop::Direct,
                    source: Ipv4Addr::UNSPECIFIED,
                    interface: i as u32,
                };
                t.insert(r).unwrap();
                let n = r.destination.network();
                list.retain(|x| x.destination != n);
                list.push(Route { destination: n, ..r });
            }
            prop_assert_eq!(t.len(), list.len());
            // Also probe inside each prefix so matches are common.
            let extra: Vec<u32> = nets.iter().map(|(a, _)| *a).collect();
            for p in probes.iter().chain(extra.iter()) {
                let dst = Ipv4Addr::from_bits(*p);
                let want = list
                    .iter()
                    .filter(|r| r.destination.contains_addr(dst))
                    .max_by_key(|r| r.destination.prefix_len());
                prop_assert_eq!(t.lookup(dst), want);
            }
        }
    }
}
