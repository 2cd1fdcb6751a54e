//! The neighbour table: IPv4 → MAC with reachability state (RFC 826 translation table,
//! with RFC 1122 §2.3.2.1 cache timeouts and a Linux-like state model).
//!
//! States: `Incomplete` (request sent, no answer yet), `Reachable` (confirmed recently),
//! `Stale` (usable, but should be re-confirmed), `Permanent` (static, never expires or gets
//! evicted). Time is passed in; entries change state lazily when touched and in
//! [`NeighbourTable::expire`]. Frames waiting for resolution are queued by the caller.

use super::TableFull;
use crate::time::{Duration, Instant};
use crate::wire::EthernetAddress;
use core::net::Ipv4Addr;
use std::collections::BTreeMap;

/// Reachability of a neighbour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NeighbourState {
    /// Resolution in progress; no hardware address yet.
    Incomplete,
    /// Address usable but not confirmed recently; the caller should re-probe it.
    Stale,
    /// Address confirmed within the reachable time.
    Reachable,
    /// Static entry: never expires, never evicted, not overwritten by ARP.
    Permanent,
}

/// One table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neighbour {
    /// The hardware address; `None` only while `Incomplete`.
    pub hardware_addr: Option<EthernetAddress>,
    /// State.
    pub state: NeighbourState,
    /// When the current state ends (`None` for `Permanent`).
    pub expires_at: Option<Instant>,
    /// Last lookup or confirmation, for eviction.
    pub last_used: Instant,
}

/// Timeouts and size of a [`NeighbourTable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeighbourConfig {
    /// Most entries (permanent ones included).
    pub capacity: usize,
    /// How long a confirmation keeps an entry `Reachable` (Linux base_reachable_time 30 s;
    /// RFC 1122 §2.3.2.1 asks for a timeout on the order of a minute).
    pub reachable_time: Duration,
    /// How long a `Stale` entry is kept before it is removed.
    pub stale_time: Duration,
    /// How long an `Incomplete` entry waits for a reply (RFC 1122 §2.3.2.1: give up after
    /// a few retransmissions; the caller retransmits).
    pub incomplete_time: Duration,
}

impl Default for NeighbourConfig {
    fn default() -> Self {
        NeighbourConfig {
            capacity: 1024,
            reachable_time: Duration::from_secs(30),
            stale_time: Duration::from_secs(60),
            incomplete_time: Duration::from_secs(3),
        }
    }
}

/// The answer to a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Reachable or permanent: send to this address.
    Resolved(EthernetAddress),
    /// Stale: send to this address, and probe it to re-confirm.
    Stale(EthernetAddress),
    /// A request is outstanding; queue or drop the frame.
    Pending,
    /// No entry: start resolution.
    Unknown,
    /// Resolution got no answer within `incomplete_time` (RFC 1122 §2.3.2.1: give up):
    /// the neighbour is unreachable. Reported once; the entry is gone, so the next lookup
    /// is `Unknown` and a new resolution may start.
    Failed,
}

/// A bounded IPv4 → MAC table.
#[derive(Debug, Clone)]
pub struct NeighbourTable {
    entries: BTreeMap<Ipv4Addr, Neighbour>,
    config: NeighbourConfig,
}

impl NeighbourTable {
    /// An empty table.
    pub fn new(config: NeighbourConfig) -> Self {
        NeighbourTable {
            entries: BTreeMap::new(),
            config,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &NeighbourConfig {
        &self.config
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry for `ip` as stored (its state may be due to change at the next touch).
    pub fn get(&self, ip: Ipv4Addr) -> Option<&Neighbour> {
        self.entries.get(&ip)
    }

    /// All entries in address order.
    pub fn iter(&self) -> impl Iterator<Item = (&Ipv4Addr, &Neighbour)> {
        self.entries.iter()
    }

    /// Advance one entry's state to `now`; false if it has expired entirely.
    fn age(&self, n: &mut Neighbour, now: Instant) -> bool {
        let Some(exp) = n.expires_at else {
            return true;
        };
        if now < exp {
            return true;
        }
        match n.state {
            // A reachable entry past its time becomes stale (still usable) for stale_time.
            NeighbourState::Reachable => {
                n.state = NeighbourState::Stale;
                let stale_until = exp + self.config.stale_time;
                n.expires_at = Some(stale_until);
                now < stale_until
            }
            NeighbourState::Stale | NeighbourState::Incomplete => false,
            NeighbourState::Permanent => true,
        }
    }

    /// Look up the hardware address for `ip`, recording the use.
    pub fn lookup(&mut self, ip: Ipv4Addr, now: Instant) -> Resolution {
        let Some(mut n) = self.entries.get(&ip).copied() else {
            return Resolution::Unknown;
        };
        if !self.age(&mut n, now) {
            self.entries.remove(&ip);
            // (`age` leaves an expired Incomplete entry's state as it was.)
            return if n.state == NeighbourState::Incomplete {
                Resolution::Failed
            } else {
                Resolution::Unknown
            };
        }
        n.last_used = now;
        self.entries.insert(ip, n);
        match (n.state, n.hardware_addr) {
            (NeighbourState::Reachable | NeighbourState::Permanent, Some(mac)) => {
                Resolution::Resolved(mac)
            }
            (NeighbourState::Stale, Some(mac)) => Resolution::Stale(mac),
            _ => Resolution::Pending,
        }
    }

    /// Record that resolution of `ip` started. Returns true if a request should be sent
    /// now (no entry existed); false if one is outstanding or the address is known.
    pub fn start_resolution(&mut self, ip: Ipv4Addr, now: Instant) -> Result<bool, TableFull> {
        self.purge_if_expired(ip, now);
        if self.entries.contains_key(&ip) {
            return Ok(false);
        }
        self.make_room(now)?;
        self.entries.insert(
            ip,
            Neighbour {
                hardware_addr: None,
                state: NeighbourState::Incomplete,
                expires_at: Some(now + self.config.incomplete_time),
                last_used: now,
            },
        );
        Ok(true)
    }

    /// `ip` is confirmed at `mac` (an ARP reply to us, or netlink says REACHABLE): the entry
    /// becomes `Reachable` for `reachable_time`. Permanent entries are left alone.
    pub fn confirm(
        &mut self,
        ip: Ipv4Addr,
        mac: EthernetAddress,
        now: Instant,
    ) -> Result<(), TableFull> {
        self.insert(ip, mac, NeighbourState::Reachable, now)
    }

    /// Information from an ARP packet that is not an answer to us (RFC 826 "Packet
    /// Reception"): an existing entry gets the sender's address (merge); a new entry is
    /// created only when `create` (we were the target). A changed or newly learned address
    /// is `Stale` until confirmed; an unchanged reachable entry stays reachable.
    pub fn learn(
        &mut self,
        ip: Ipv4Addr,
        mac: EthernetAddress,
        now: Instant,
        create: bool,
    ) -> Result<(), TableFull> {
        self.purge_if_expired(ip, now);
        match self.entries.get(&ip).copied() {
            Some(n) if n.state == NeighbourState::Permanent => Ok(()),
            Some(n) if n.hardware_addr == Some(mac) && n.state == NeighbourState::Reachable => {
                Ok(())
            }
            Some(_) => self.insert(ip, mac, NeighbourState::Stale, now),
            None if create => self.insert(ip, mac, NeighbourState::Stale, now),
            None => Ok(()),
        }
    }

    /// What an IP frame from `ip` may teach (luna's extension: a peer is answered without
    /// an ARP round trip): its MAC when none is known (no entry, or one still waiting for
    /// ARP). A known MAC is never replaced this way: only ARP changes it (RFC 826), so a
    /// single spoofed frame cannot redirect a neighbour's traffic. The caller learns only
    /// from on-link sources.
    pub fn learn_if_unknown(
        &mut self,
        ip: Ipv4Addr,
        mac: EthernetAddress,
        now: Instant,
    ) -> Result<(), TableFull> {
        self.purge_if_expired(ip, now);
        match self.entries.get(&ip) {
            Some(n) if n.hardware_addr.is_some() => Ok(()),
            _ => self.insert(ip, mac, NeighbourState::Stale, now),
        }
    }

    /// A static entry (never expires, never evicted, ARP cannot change it).
    pub fn insert_permanent(
        &mut self,
        ip: Ipv4Addr,
        mac: EthernetAddress,
    ) -> Result<(), TableFull> {
        if !self.entries.contains_key(&ip) {
            self.make_room(Instant::ZERO)?;
        }
        let last_used = self.entries.get(&ip).map_or(Instant::ZERO, |n| n.last_used);
        self.entries.insert(
            ip,
            Neighbour {
                hardware_addr: Some(mac),
                state: NeighbourState::Permanent,
                expires_at: None,
                last_used,
            },
        );
        Ok(())
    }

    /// Set `ip` to `mac` in `state`, e.g. when mirroring the kernel's table. Reachable and
    /// Stale get that state's timeout but never overwrite a Permanent entry (remove it
    /// first); Permanent is [`insert_permanent`](Self::insert_permanent); Incomplete is
    /// stored as Stale, since an address is known (use
    /// [`start_resolution`](Self::start_resolution) for a pending entry).
    pub fn insert(
        &mut self,
        ip: Ipv4Addr,
        mac: EthernetAddress,
        state: NeighbourState,
        now: Instant,
    ) -> Result<(), TableFull> {
        let expires_at = match state {
            NeighbourState::Reachable => now + self.config.reachable_time,
            NeighbourState::Stale => now + self.config.stale_time,
            NeighbourState::Permanent => return self.insert_permanent(ip, mac),
            // An address is known, so it cannot be incomplete.
            NeighbourState::Incomplete => now + self.config.stale_time,
        };
        let state = if state == NeighbourState::Incomplete {
            NeighbourState::Stale
        } else {
            state
        };
        match self.entries.get_mut(&ip) {
            Some(n) if n.state == NeighbourState::Permanent => Ok(()),
            Some(n) => {
                *n = Neighbour {
                    hardware_addr: Some(mac),
                    state,
                    expires_at: Some(expires_at),
                    last_used: now,
                };
                Ok(())
            }
            None => {
                self.make_room(now)?;
                self.entries.insert(
                    ip,
                    Neighbour {
                        hardware_addr: Some(mac),
                        state,
                        expires_at: Some(expires_at),
                        last_used: now,
                    },
                );
                Ok(())
            }
        }
    }

    /// Remove the entry for `ip`.
    pub fn remove(&mut self, ip: Ipv4Addr) -> Option<Neighbour> {
        self.entries.remove(&ip)
    }

    /// Age every entry to `now`: reachable ones past their time become stale, expired
    /// stale and incomplete ones are removed. Returns how many were removed.
    pub fn expire(&mut self, now: Instant) -> usize {
        let before = self.entries.len();
        let mut entries = core::mem::take(&mut self.entries);
        entries.retain(|_, n| self.age(n, now));
        self.entries = entries;
        before - self.entries.len()
    }

    /// The earliest instant at which some entry changes state (for the caller's timer).
    pub fn next_expiry(&self) -> Option<Instant> {
        self.entries.values().filter_map(|n| n.expires_at).min()
    }

    fn purge_if_expired(&mut self, ip: Ipv4Addr, now: Instant) {
        if let Some(mut n) = self.entries.get(&ip).copied() {
            if self.age(&mut n, now) {
                self.entries.insert(ip, n);
            } else {
                self.entries.remove(&ip);
            }
        }
    }

    /// Make room for one new entry: drop expired entries, then evict the least valuable
    /// one. Eviction order: Incomplete before Stale before Reachable; within a state the
    /// least recently used; ties by lowest address. Permanent entries are never evicted.
    fn make_room(&mut self, now: Instant) -> Result<(), TableFull> {
        if self.entries.len() < self.config.capacity {
            return Ok(());
        }
        self.expire(now);
        if self.entries.len() < self.config.capacity {
            return Ok(());
        }
        let victim = self
            .entries
            .iter()
            .filter(|(_, n)| n.state != NeighbourState::Permanent)
            .min_by_key(|(ip, n)| (n.state, n.last_used, **ip))
            .map(|(ip, _)| *ip);
        match victim {
            Some(ip) => {
                self.entries.remove(&ip);
                Ok(())
            }
            None => Err(TableFull),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(n: u8) -> EthernetAddress {
        EthernetAddress([0x52, 0x54, 0, 0, 0, n])
    }

    fn ip(n: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, 0, n)
    }

    fn secs(s: u64) -> Instant {
        Instant::from_millis(s * 1000)
    }

    fn table(capacity: usize) -> NeighbourTable {
        NeighbourTable::new(NeighbourConfig {
            capacity,
            ..NeighbourConfig::default()
        })
    }

    #[test]
    fn resolution_lifecycle() {
        let mut t = table(8);
        assert_eq!(t.lookup(ip(1), secs(0)), Resolution::Unknown);
        assert_eq!(t.start_resolution(ip(1), secs(0)), Ok(true));
        assert_eq!(t.start_resolution(ip(1), secs(1)), Ok(false));
        assert_eq!(t.lookup(ip(1), secs(1)), Resolution::Pending);
        t.confirm(ip(1), mac(1), secs(2)).unwrap();
        assert_eq!(t.lookup(ip(1), secs(2)), Resolution::Resolved(mac(1)));
        assert_eq!(t.start_resolution(ip(1), secs(3)), Ok(false));
    }

    #[test]
    fn rfc1122_2_3_2_1_incomplete_times_out() {
        let mut t = table(8);
        t.start_resolution(ip(1), secs(0)).unwrap();
        assert_eq!(t.next_expiry(), Some(secs(3)));
        assert_eq!(t.lookup(ip(1), secs(2)), Resolution::Pending);
        assert_eq!(t.expire(secs(3)), 1);
        assert_eq!(t.lookup(ip(1), secs(3)), Resolution::Unknown);
        // A new resolution may start again.
        assert_eq!(t.start_resolution(ip(1), secs(4)), Ok(true));
        // Found expired by a lookup, the resolution reports its failure, once.
        assert_eq!(t.lookup(ip(1), secs(6)), Resolution::Pending);
        assert_eq!(t.lookup(ip(1), secs(7)), Resolution::Failed);
        assert_eq!(t.lookup(ip(1), secs(7)), Resolution::Unknown);
        // A stale entry that expires is gone, not failed.
        t.learn(ip(2), mac(2), secs(0), true).unwrap();
        assert_eq!(t.lookup(ip(2), secs(1000)), Resolution::Unknown);
    }

    #[test]
    fn rfc1122_2_3_2_1_reachable_goes_stale_then_expires() {
        let mut t = table(8);
        t.confirm(ip(1), mac(1), secs(0)).unwrap();
        assert_eq!(t.lookup(ip(1), secs(29)), Resolution::Resolved(mac(1)));
        assert_eq!(t.lookup(ip(1), secs(30)), Resolution::Stale(mac(1)));
        assert_eq!(t.get(ip(1)).unwrap().state, NeighbourState::Stale);
        // Re-confirmation makes it reachable again.
        t.confirm(ip(1), mac(1), secs(40)).unwrap();
        assert_eq!(t.lookup(ip(1), secs(41)), Resolution::Resolved(mac(1)));
        // Reachable until 70, stale until 130, then gone.
        assert_eq!(t.expire(secs(100)), 0);
        assert_eq!(t.get(ip(1)).unwrap().state, NeighbourState::Stale);
        assert_eq!(t.expire(secs(130)), 1);
        assert!(t.is_empty());
    }

    #[test]
    fn lazy_aging_removes_in_lookup() {
        let mut t = table(8);
        t.confirm(ip(1), mac(1), secs(0)).unwrap();
        assert_eq!(t.lookup(ip(1), secs(1000)), Resolution::Unknown);
        assert!(t.is_empty());
    }

    #[test]
    fn permanent_never_expires_or_changes() {
        let mut t = table(8);
        t.insert_permanent(ip(1), mac(1)).unwrap();
        t.confirm(ip(1), mac(9), secs(1)).unwrap();
        t.learn(ip(1), mac(9), secs(1), true).unwrap();
        assert_eq!(t.expire(secs(1_000_000)), 0);
        assert_eq!(
            t.lookup(ip(1), secs(1_000_000)),
            Resolution::Resolved(mac(1))
        );
        assert_eq!(t.next_expiry(), None);
    }

    #[test]
    fn rfc826_merge_and_create() {
        let mut t = table(8);
        // Not the target and unknown: nothing is created.
        t.learn(ip(1), mac(1), secs(0), false).unwrap();
        assert!(t.is_empty());
        // We are the target: created as stale.
        t.learn(ip(1), mac(1), secs(0), true).unwrap();
        assert_eq!(t.lookup(ip(1), secs(0)), Resolution::Stale(mac(1)));
        // Existing entries are merged even when we are not the target.
        t.confirm(ip(1), mac(1), secs(1)).unwrap();
        t.learn(ip(1), mac(1), secs(2), false).unwrap();
        assert_eq!(t.lookup(ip(1), secs(2)), Resolution::Resolved(mac(1)));
        t.learn(ip(1), mac(2), secs(3), false).unwrap();
        assert_eq!(t.lookup(ip(1), secs(3)), Resolution::Stale(mac(2)));
        // An incomplete entry learns the address.
        t.start_resolution(ip(2), secs(3)).unwrap();
        t.learn(ip(2), mac(2), secs(4), false).unwrap();
        assert_eq!(t.lookup(ip(2), secs(4)), Resolution::Stale(mac(2)));
    }

    #[test]
    fn eviction_prefers_incomplete_then_stale_then_lru() {
        let mut t = table(3);
        t.confirm(ip(1), mac(1), secs(0)).unwrap();
        t.learn(ip(2), mac(2), secs(1), true).unwrap(); // stale
        t.start_resolution(ip(3), secs(2)).unwrap(); // incomplete
        t.confirm(ip(4), mac(4), secs(3)).unwrap(); // evicts the incomplete .3
        assert!(t.get(ip(3)).is_none());
        t.confirm(ip(5), mac(5), secs(4)).unwrap(); // evicts the stale .2
        assert!(t.get(ip(2)).is_none());
        // All reachable now: least recently used goes (.1 used at 0, .4 at 3; touch .1).
        assert_eq!(t.lookup(ip(1), secs(5)), Resolution::Resolved(mac(1)));
        t.confirm(ip(6), mac(6), secs(6)).unwrap();
        assert!(t.get(ip(4)).is_none());
        assert_eq!(t.len(), 3);
        let keys: Vec<_> = t.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, vec![ip(1), ip(5), ip(6)]);
    }

    #[test]
    fn eviction_ties_broken_by_address() {
        let mut t = table(2);
        t.confirm(ip(9), mac(9), secs(0)).unwrap();
        t.confirm(ip(3), mac(3), secs(0)).unwrap();
        t.confirm(ip(5), mac(5), secs(0)).unwrap();
        assert!(t.get(ip(3)).is_none());
        assert!(t.get(ip(9)).is_some() && t.get(ip(5)).is_some());
    }

    #[test]
    fn expired_entries_make_room_before_eviction() {
        let mut t = table(2);
        t.confirm(ip(1), mac(1), secs(0)).unwrap();
        t.learn(ip(2), mac(2), secs(100), true).unwrap(); // stale, fresh
                                                          // .1 is stored as Reachable but fully expired at 90: it is purged first, so the
                                                          // fresh stale .2 (which plain eviction would pick) survives.
        t.confirm(ip(3), mac(3), secs(101)).unwrap();
        assert!(t.get(ip(1)).is_none());
        assert!(t.get(ip(2)).is_some());
    }

    #[test]
    fn full_of_permanent_entries_is_an_error() {
        let mut t = table(2);
        t.insert_permanent(ip(1), mac(1)).unwrap();
        t.insert_permanent(ip(2), mac(2)).unwrap();
        assert_eq!(t.confirm(ip(3), mac(3), secs(0)), Err(TableFull));
        assert_eq!(t.start_resolution(ip(3), secs(0)), Err(TableFull));
        assert_eq!(t.insert_permanent(ip(3), mac(3)), Err(TableFull));
        // Updating an existing entry needs no room.
        assert_eq!(t.insert_permanent(ip(2), mac(7)), Ok(()));
        assert_eq!(t.lookup(ip(2), secs(0)), Resolution::Resolved(mac(7)));
        assert_eq!(
            t.remove(ip(1)).map(|n| n.state),
            Some(NeighbourState::Permanent)
        );
        assert_eq!(t.confirm(ip(3), mac(3), secs(0)), Ok(()));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Confirm(u8, u8),
        Learn(u8, u8, bool),
        Start(u8),
        Permanent(u8, u8),
        Lookup(u8),
        Remove(u8),
        Expire,
    }

    fn arb_op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        let a = 0u8..12;
        prop_oneof![
            (a.clone(), any::<u8>()).prop_map(|(i, m)| Op::Confirm(i, m)),
            (a.clone(), any::<u8>(), any::<bool>()).prop_map(|(i, m, c)| Op::Learn(i, m, c)),
            a.clone().prop_map(Op::Start),
            (a.clone(), any::<u8>()).prop_map(|(i, m)| Op::Permanent(i, m)),
            a.clone().prop_map(Op::Lookup),
            a.prop_map(Op::Remove),
            Just(Op::Expire),
        ]
    }

    proptest::proptest! {
        /// Under any sequence of operations: the bound holds, permanent entries survive
        /// until removed, a successful confirm resolves at once, and nothing panics.
        #[test]
        fn model_invariants(
            ops in proptest::collection::vec((arb_op(), 0u64..20_000), 0..200),
            capacity in 1usize..6,
        ) {
            let mut t = table(capacity);
            let mut now = Instant::ZERO;
            let mut permanent = std::collections::BTreeMap::new();
            for (op, step_ms) in ops {
                now += Duration::from_millis(step_ms);
                match op {
                    Op::Confirm(i, m) => {
                        if t.confirm(ip(i), mac(m), now).is_ok() && !permanent.contains_key(&i) {
                            proptest::prop_assert_eq!(t.lookup(ip(i), now), Resolution::Resolved(mac(m)));
                        }
                    }
                    Op::Learn(i, m, c) => { let _ = t.learn(ip(i), mac(m), now, c); }
                    Op::Start(i) => { let _ = t.start_resolution(ip(i), now); }
                    Op::Permanent(i, m) => {
                        if t.insert_permanent(ip(i), mac(m)).is_ok() {
                            permanent.insert(i, m);
                        }
                    }
                    Op::Lookup(i) => { let _ = t.lookup(ip(i), now); }
                    Op::Remove(i) => {
                        t.remove(ip(i));
                        permanent.remove(&i);
                    }
                    Op::Expire => { t.expire(now); }
                }
                proptest::prop_assert!(t.len() <= capacity);
                for (&i, &m) in &permanent {
                    let n = t.get(ip(i)).copied();
                    proptest::prop_assert_eq!(n.map(|n| (n.state, n.hardware_addr)),
                        Some((NeighbourState::Permanent, Some(mac(m)))));
                }
                if let Some(e) = t.next_expiry() {
                    proptest::prop_assert!(t.iter().all(|(_, n)| n.expires_at.is_none_or(|x| x >= e)));
                }
            }
        }
    }

    #[test]
    fn zero_capacity_rejects_everything() {
        let mut t = table(0);
        assert_eq!(t.confirm(ip(1), mac(1), secs(0)), Err(TableFull));
        assert!(t.is_empty());
    }
}
