//! Read-only snapshots of the mirror and their lock-free publication to every core.
//!
//! The syncer thread builds a new immutable [`Snapshot`] after each batch of changes and
//! [`Publisher::publish`]es it: an `arc_swap::ArcSwap` store followed by a `Release` store of
//! the version counter. Each core owns a [`Reader`] that keeps an `Arc` of the snapshot it
//! uses; once per poll iteration it calls [`Reader::refresh`], which is one `Acquire` load of
//! the counter while nothing changed, and an `ArcSwap::load_full` (lock-free) when it did.
//! Per packet the core reads through [`Reader::snapshot`]: plain memory, no atomics, no lock.
//! An old snapshot is freed by whichever holder drops the last `Arc` (usually a core at its
//! next refresh), which is rare and bounded by the table size.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use luna_stack::tables::{NeighbourState, Route, RouteTable};
use luna_stack::wire::EthernetAddress;

use crate::mirror::SyncCounters;

/// A neighbour the kernel can send to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MirroredNeighbour {
    /// Its hardware address.
    pub mac: EthernetAddress,
    /// The kernel state, reduced by [`crate::mirror::usable_state`].
    pub state: NeighbourState,
}

/// An IPv4 address of the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LocalAddress {
    /// The address.
    pub address: Ipv4Addr,
    /// Its prefix length.
    pub prefix_len: u8,
}

/// The interface as the kernel last described it (`RTM_NEWLINK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkInfo {
    /// `IFF_UP`: administratively up.
    pub up: bool,
    /// `IFF_LOWER_UP`: carrier.
    pub lower_up: bool,
    /// Its hardware address.
    pub mac: Option<EthernetAddress>,
    /// Its MTU.
    pub mtu: Option<u32>,
}

/// The answer of [`Snapshot::next_hop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// Send to `mac`; `next_hop` is the resolved address (the gateway or the destination).
    Resolved {
        /// The route that matched.
        route: &'a Route,
        /// The next hop's address.
        next_hop: Ipv4Addr,
        /// The next hop's hardware address.
        mac: EthernetAddress,
    },
    /// A route matched but the kernel has no usable neighbour entry for `next_hop` (yet):
    /// queue in [`crate::pending::PendingNextHops`] and nudge the kernel.
    Unresolved {
        /// The route that matched.
        route: &'a Route,
        /// The address to resolve.
        next_hop: Ipv4Addr,
    },
    /// The destination is one of the interface's own addresses.
    Local,
    /// No route on this interface (or the interface is gone): drop and count.
    NoRoute,
}

/// An immutable view of the kernel's tables for one interface.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub(crate) version: u64,
    pub(crate) ifindex: u32,
    pub(crate) routes: RouteTable,
    pub(crate) neighbours: HashMap<Ipv4Addr, MirroredNeighbour>,
    pub(crate) addresses: Vec<LocalAddress>,
    pub(crate) link: Option<LinkInfo>,
    pub(crate) gone: bool,
    pub(crate) counters: SyncCounters,
}

impl Snapshot {
    /// An empty snapshot, version 0 (what readers see before the first dump completes).
    pub fn empty(ifindex: u32) -> Snapshot {
        Snapshot {
            version: 0,
            ifindex,
            routes: RouteTable::new(1),
            neighbours: HashMap::new(),
            addresses: Vec::new(),
            link: None,
            gone: false,
            counters: SyncCounters::default(),
        }
    }

    /// Version: strictly increases with every publication.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The mirrored interface.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The kernel deleted the interface: every lookup answers [`Lookup::NoRoute`].
    pub fn interface_gone(&self) -> bool {
        self.gone
    }

    /// The interface's flags, MAC and MTU (from the link dump and `RTM_NEWLINK`).
    pub fn link(&self) -> Option<&LinkInfo> {
        self.link.as_ref()
    }

    /// The sync's counters when this snapshot was built.
    pub fn counters(&self) -> &SyncCounters {
        &self.counters
    }

    /// The route table (one route per prefix, longest-prefix match).
    pub fn routes(&self) -> &RouteTable {
        &self.routes
    }

    /// The neighbour entry of `ip`, if the kernel has a usable one.
    pub fn neighbour(&self, ip: Ipv4Addr) -> Option<&MirroredNeighbour> {
        self.neighbours.get(&ip)
    }

    /// All usable neighbours.
    pub fn neighbours(&self) -> impl Iterator<Item = (&Ipv4Addr, &MirroredNeighbour)> {
        self.neighbours.iter()
    }

    /// The interface's addresses.
    pub fn addresses(&self) -> &[LocalAddress] {
        &self.addresses
    }

    /// `ip` is one of the interface's addresses.
    pub fn is_local(&self, ip: Ipv4Addr) -> bool {
        self.addresses.iter().any(|a| a.address == ip)
    }

    /// Where to send a datagram to `dst`: longest-prefix match, then the neighbour entry of
    /// the next hop.
    pub fn next_hop(&self, dst: Ipv4Addr) -> Lookup<'_> {
        if self.gone {
            return Lookup::NoRoute;
        }
        if self.is_local(dst) {
            return Lookup::Local;
        }
        let Some((next_hop, route)) = self.routes.next_hop(dst) else {
            return Lookup::NoRoute;
        };
        match self.neighbours.get(&next_hop) {
            Some(n) => Lookup::Resolved {
                route,
                next_hop,
                mac: n.mac,
            },
            None => Lookup::Unresolved { route, next_hop },
        }
    }
}

struct Shared {
    current: ArcSwap<Snapshot>,
    version: AtomicU64,
}

/// The writing side: owned by the syncer thread.
pub struct Publisher {
    shared: Arc<Shared>,
}

impl Publisher {
    /// Starts with `initial` (usually [`Snapshot::empty`]).
    pub fn new(initial: Snapshot) -> Publisher {
        let version = initial.version;
        Publisher {
            shared: Arc::new(Shared {
                current: ArcSwap::from_pointee(initial),
                version: AtomicU64::new(version),
            }),
        }
    }

    /// Makes `snap` the current snapshot for every reader. Its version must be higher than
    /// the current one (the mirror numbers them).
    pub fn publish(&self, snap: Snapshot) {
        let v = snap.version;
        self.shared.current.store(Arc::new(snap));
        // Release: a reader that sees `v` also sees the store above.
        self.shared.version.store(v, Ordering::Release);
    }

    /// The currently published snapshot.
    pub fn current(&self) -> Arc<Snapshot> {
        self.shared.current.load_full()
    }

    /// A reader for one core.
    pub fn reader(&self) -> Reader {
        let cached = self.shared.current.load_full();
        Reader {
            seen: cached.version,
            cached,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// One core's handle: caches the current snapshot, checks the version once per poll.
#[derive(Clone)]
pub struct Reader {
    shared: Arc<Shared>,
    cached: Arc<Snapshot>,
    seen: u64,
}

impl Reader {
    /// Picks up a newer snapshot if one was published; returns whether it did. Call once per
    /// poll iteration (one atomic load when nothing changed).
    pub fn refresh(&mut self) -> bool {
        if self.shared.version.load(Ordering::Acquire) == self.seen {
            return false;
        }
        self.cached = self.shared.current.load_full();
        self.seen = self.cached.version;
        true
    }

    /// The snapshot this core uses until its next [`Reader::refresh`].
    pub fn snapshot(&self) -> &Snapshot {
        &self.cached
    }

    /// The version of [`Reader::snapshot`].
    pub fn version(&self) -> u64 {
        self.seen
    }
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("version", &self.seen)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::craft::{address, emit};
    use crate::mirror::Mirror;
    use netlink_packet_route::RouteNetlinkMessage as M;

    #[test]
    fn reader_sees_nothing_new_until_published_then_the_latest() {
        let p = Publisher::new(Snapshot::empty(1));
        let mut r = p.reader();
        assert!(!r.refresh());
        assert_eq!(r.version(), 0);
        let mut m = Mirror::new(1);
        m.apply_datagram(&emit(
            M::NewAddress(address(1, Ipv4Addr::new(198, 18, 0, 1), 24)),
            0,
            0,
        ));
        p.publish(m.snapshot(1));
        p.publish(m.snapshot(2));
        assert!(r.refresh());
        assert_eq!(r.version(), 2);
        assert!(r.snapshot().is_local(Ipv4Addr::new(198, 18, 0, 1)));
        assert!(!r.refresh());
    }

    /// Readers on other threads see versions only grow, each snapshot whole (its content
    /// matches its version), and finally the last one.
    #[test]
    fn concurrent_readers_see_monotonic_whole_snapshots() {
        const N: u64 = 300;
        let p = Publisher::new(Snapshot::empty(1));
        let readers: Vec<Reader> = (0..2).map(|_| p.reader()).collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = readers
                .into_iter()
                .map(|mut r| {
                    s.spawn(move || {
                        let mut last = 0;
                        while last < N {
                            r.refresh();
                            let snap = r.snapshot();
                            assert!(snap.version() >= last);
                            last = snap.version();
                            // Version v holds exactly v addresses.
                            assert_eq!(snap.addresses().len() as u64, last);
                            std::thread::yield_now();
                        }
                    })
                })
                .collect();
            let mut m = Mirror::new(1);
            for v in 1..=N {
                let a = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + v as u32);
                m.apply_datagram(&emit(M::NewAddress(address(1, a, 32)), 0, 0));
                p.publish(m.snapshot(v));
            }
            for h in handles {
                h.join().unwrap();
            }
        });
    }
}
