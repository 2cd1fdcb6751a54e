//! The interface's local addresses: the configured primary address plus up to
//! [`MAX_LOCAL_ADDRS`]` - 1` more (netlink-sync mirroring the kernel's addresses of the
//! exception interface, or an application's `Stack::add_address`).
//!
//! The hot path asks [`LocalAddrs::contains`] for every received datagram: the primary
//! address is one compare, and the (usually empty) extra set is scanned only when it is
//! not the primary. A fixed array, no allocation.

use super::{check_host_address, ConnectError, Ipv4Addr, Owner, Rng, SocketAddrV4, Stack, State};
use crate::time::Instant;
use crate::wire::Ipv4Cidr;

/// Most local addresses of one stack, the primary included.
pub const MAX_LOCAL_ADDRS: usize = 8;

/// Why an address could not be added or removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LocalAddrError {
    /// The primary (configured) address cannot be removed or re-prefixed.
    #[error("{0} is the primary address from the configuration; it cannot be changed")]
    Primary(Ipv4Addr),
    /// The set already holds [`MAX_LOCAL_ADDRS`] addresses.
    #[error("the local address set is full ({MAX_LOCAL_ADDRS} addresses); {0} not added")]
    Full(Ipv4Addr),
    /// Not a unicast host address (see `check_host_address`).
    #[error("{0} cannot be a local address: not a unicast host address of its prefix")]
    Invalid(Ipv4Addr),
    /// Not in the set.
    #[error("{0} is not a local address")]
    Unknown(Ipv4Addr),
}

/// The local address set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalAddrs {
    primary: Ipv4Cidr,
    /// The primary prefix's directed broadcast address (`None` for a /31 or /32), worked
    /// out once: every received datagram's source and destination are checked against it.
    primary_bcast: Option<Ipv4Addr>,
    /// The primary prefix's network address (`None` for a /31 or /32), likewise.
    primary_net: Option<Ipv4Addr>,
    extra: [Option<Ipv4Cidr>; MAX_LOCAL_ADDRS - 1],
    n_extra: u8,
}

/// The directed broadcast address of `c`'s prefix; a /31 or /32 has none (RFC 3021).
fn subnet_broadcast(c: Ipv4Cidr) -> Option<Ipv4Addr> {
    (c.prefix_len() <= 30).then(|| c.broadcast())
}

/// The network address (host part all zeros) of `c`'s prefix; a /31's or /32's is a host.
fn subnet_network(c: Ipv4Cidr) -> Option<Ipv4Addr> {
    (c.prefix_len() <= 30).then(|| c.network().address())
}

impl LocalAddrs {
    /// The set holding only `primary`.
    pub fn new(primary: Ipv4Cidr) -> Self {
        LocalAddrs {
            primary,
            primary_bcast: subnet_broadcast(primary),
            primary_net: subnet_network(primary),
            extra: [None; MAX_LOCAL_ADDRS - 1],
            n_extra: 0,
        }
    }

    /// The primary address (the configuration's), with its prefix.
    pub fn primary(&self) -> Ipv4Cidr {
        self.primary
    }

    /// Whether `ip` is one of ours. One compare when it is the primary address.
    #[inline]
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        ip == self.primary.address() || (self.n_extra != 0 && self.find_extra(ip).is_some())
    }

    fn extras(&self) -> impl Iterator<Item = Ipv4Cidr> + '_ {
        self.extra[..usize::from(self.n_extra)]
            .iter()
            .flatten()
            .copied()
    }

    fn find_extra(&self, ip: Ipv4Addr) -> Option<usize> {
        self.extra[..usize::from(self.n_extra)]
            .iter()
            .position(|c| c.is_some_and(|c| c.address() == ip))
    }

    /// Every address, the primary first, then in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = Ipv4Cidr> + '_ {
        core::iter::once(self.primary).chain(self.extras())
    }

    /// How many addresses (at least 1).
    pub fn len(&self) -> usize {
        1 + usize::from(self.n_extra)
    }

    /// Never empty: the primary is always there.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The address to send from towards the on-link host `hop`: the first address
    /// (primary first) whose prefix contains it, else the primary.
    pub fn source_for(&self, hop: Ipv4Addr) -> Ipv4Addr {
        self.iter()
            .find(|c| c.contains_addr(hop))
            .unwrap_or(self.primary)
            .address()
    }

    /// Whether `ip` is the directed broadcast address of one of our prefixes (a /31 or
    /// /32 has none, RFC 3021).
    #[inline]
    pub fn is_subnet_broadcast(&self, ip: Ipv4Addr) -> bool {
        self.primary_bcast == Some(ip)
            || (self.n_extra != 0 && self.extras().any(|c| subnet_broadcast(c) == Some(ip)))
    }

    /// Whether `ip` cannot be a datagram's source on our links: one of our addresses, or
    /// the network or directed broadcast address of one of our prefixes of /30 or shorter
    /// (RFC 1122 §3.2.1.3; a /31's are hosts, RFC 3021). Three compares for the primary,
    /// worked out once: every received datagram's source is checked.
    #[inline]
    pub fn is_invalid_source(&self, ip: Ipv4Addr) -> bool {
        ip == self.primary.address()
            || self.primary_bcast == Some(ip)
            || self.primary_net == Some(ip)
            || (self.n_extra != 0
                && self.extras().any(|c| {
                    c.address() == ip
                        || subnet_broadcast(c) == Some(ip)
                        || subnet_network(c) == Some(ip)
                }))
    }

    /// Adds `addr`; `Ok(false)` when it was there already (its prefix is updated).
    pub fn add(&mut self, addr: Ipv4Cidr) -> Result<bool, LocalAddrError> {
        let ip = addr.address();
        if check_host_address(addr).is_err() {
            return Err(LocalAddrError::Invalid(ip));
        }
        if ip == self.primary.address() {
            return if addr.prefix_len() == self.primary.prefix_len() {
                Ok(false)
            } else {
                Err(LocalAddrError::Primary(ip))
            };
        }
        if let Some(i) = self.find_extra(ip) {
            self.extra[i] = Some(addr);
            return Ok(false);
        }
        let n = usize::from(self.n_extra);
        if n == self.extra.len() {
            return Err(LocalAddrError::Full(ip));
        }
        self.extra[n] = Some(addr);
        self.n_extra += 1;
        Ok(true)
    }

    /// Removes `ip` (never the primary).
    pub fn remove(&mut self, ip: Ipv4Addr) -> Result<(), LocalAddrError> {
        if ip == self.primary.address() {
            return Err(LocalAddrError::Primary(ip));
        }
        let i = self.find_extra(ip).ok_or(LocalAddrError::Unknown(ip))?;
        let n = usize::from(self.n_extra);
        self.extra.copy_within(i + 1..n, i);
        self.extra[n - 1] = None;
        self.n_extra -= 1;
        Ok(())
    }
}

impl<R: Rng> Stack<R> {
    /// The local addresses: the configured primary one and the added ones.
    pub fn addresses(&self) -> &LocalAddrs {
        &self.addrs
    }

    /// Adds a local address: from now on the stack takes TCP, ARP and ICMP for it,
    /// listeners accept on it, and connects whose route names it as source (or whose next
    /// hop is on its prefix) send from it. Routes are not touched (the mirror brings the
    /// kernel's on-link route of the address). `Ok(false)`: it was there already.
    pub fn add_address(&mut self, addr: Ipv4Cidr) -> Result<bool, LocalAddrError> {
        // The receive checks' verdicts depend on the addresses.
        self.rx_prefix.forget();
        self.addrs.add(addr)
    }

    /// Removes a local address and aborts every connection using it; returns how many.
    ///
    /// No RFC covers an address vanishing under a connection. Linux keeps such sockets
    /// until their retransmissions time out (it can no longer send from the address, and
    /// nothing for it is delivered), which only delays the inevitable; luna aborts them at
    /// once, without a RST (a RST from an address that is no longer ours would be a
    /// spoofed segment), as Linux's `ss -K` or Android's address-removal socket kill do.
    /// An application-owned connection gets [`super::Event::Closed`] with
    /// [`super::CloseReason::Aborted`]; unaccepted, released and TIME-WAIT ones are freed.
    /// Counted in [`super::StackCounters::address_aborts`].
    pub fn remove_address(&mut self, now: Instant, ip: Ipv4Addr) -> Result<usize, LocalAddrError> {
        self.addrs.remove(ip)?;
        self.rx_prefix.forget();
        // A connection's burst being cut into frames stops too: one decision per segment
        // would send nothing more from the address.
        self.run.cancel_from(ip);
        let mut aborted = 0;
        for idx in 0..self.slots.len() {
            let Some(e) = self.slots[idx].entry.as_deref_mut() else {
                continue;
            };
            if *e.conn.tuple().local.ip() != ip || e.conn.state() == State::Closed {
                continue;
            }
            e.conn.abort_silently();
            aborted += 1;
            if e.owner == Owner::App {
                // The application learns it from `Event::Closed` and closes the handle.
                self.after_activity(idx as u32, now);
            } else {
                self.free_slot(idx as u32);
            }
        }
        self.counters.address_aborts += aborted as u64;
        Ok(aborted)
    }

    /// Makes the added addresses exactly `extra` (the primary always stays; listing it is
    /// allowed when its prefix matches): removes the others (aborting their connections)
    /// and adds the new ones. Checked first, so nothing changes on an error. Returns how
    /// many connections were aborted.
    pub fn set_addresses(
        &mut self,
        now: Instant,
        extra: &[Ipv4Cidr],
    ) -> Result<usize, LocalAddrError> {
        let mut next = LocalAddrs::new(self.addrs.primary);
        for a in extra {
            next.add(*a)?;
        }
        let gone: Vec<Ipv4Addr> = self
            .addrs
            .extras()
            .map(|c| c.address())
            .filter(|ip| !next.contains(*ip))
            .collect();
        let mut aborted = 0;
        for ip in gone {
            aborted += self.remove_address(now, ip)?;
        }
        self.addrs = next;
        self.rx_prefix.forget();
        Ok(aborted)
    }

    /// The source address a connect to `dst` would use, `None` without a route.
    pub fn source_address(&self, dst: Ipv4Addr) -> Option<Ipv4Addr> {
        self.routes
            .next_hop(dst)
            .map(|(hop, r)| self.choose_source(r.source, hop))
    }

    /// The source address for a connection to `dst` through `next_hop`: the route's
    /// source when it is ours (the kernel's `prefsrc`, or the address netlink-sync chose),
    /// else the address on the next hop's prefix, else the primary.
    pub(super) fn choose_source(&self, route_source: Ipv4Addr, next_hop: Ipv4Addr) -> Ipv4Addr {
        if self.addrs.contains(route_source) {
            route_source
        } else {
            self.addrs.source_for(next_hop)
        }
    }

    /// Whether a connect to `dst` is refused as a local or non-unicast address: RFC 1122
    /// §4.2.3.10 (an active OPEN to a broadcast or multicast address, a subnet-directed
    /// broadcast of one of our prefixes included, MUST fail) and §3.2.1.3 ({0, host} and
    /// loopback never go on a wire); one of our addresses or a subnet's network address
    /// (ingress drops both as sources) names no other host either.
    pub(super) fn invalid_remote(&self, remote: SocketAddrV4) -> Result<(), ConnectError> {
        let dst = *remote.ip();
        if super::ingress::is_martian(dst)
            || self.is_non_unicast(dst)
            || self.addrs.is_invalid_source(dst)
            || remote.port() == 0
        {
            return Err(ConnectError::InvalidAddress);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str, p: u8) -> Ipv4Cidr {
        Ipv4Cidr::new(s.parse().unwrap(), p).unwrap()
    }

    #[test]
    fn primary_is_fixed_and_extras_come_and_go() {
        let mut a = LocalAddrs::new(cidr("198.18.0.1", 24));
        assert!(a.contains("198.18.0.1".parse().unwrap()));
        assert!(!a.contains("198.18.1.1".parse().unwrap()));
        assert_eq!(a.add(cidr("198.18.1.1", 24)), Ok(true));
        assert_eq!(a.add(cidr("198.18.1.1", 25)), Ok(false));
        assert!(a.contains("198.18.1.1".parse().unwrap()));
        assert_eq!(a.len(), 2);
        assert_eq!(
            a.remove("198.18.0.1".parse().unwrap()),
            Err(LocalAddrError::Primary("198.18.0.1".parse().unwrap()))
        );
        assert_eq!(
            a.add(cidr("198.18.0.1", 16)),
            Err(LocalAddrError::Primary("198.18.0.1".parse().unwrap()))
        );
        assert_eq!(a.add(cidr("198.18.0.1", 24)), Ok(false));
        assert_eq!(a.remove("198.18.1.1".parse().unwrap()), Ok(()));
        assert!(!a.contains("198.18.1.1".parse().unwrap()));
        assert_eq!(
            a.remove("198.18.1.1".parse().unwrap()),
            Err(LocalAddrError::Unknown("198.18.1.1".parse().unwrap()))
        );
        assert_eq!(
            a.add(cidr("198.18.1.255", 24)),
            Err(LocalAddrError::Invalid("198.18.1.255".parse().unwrap()))
        );
        assert_eq!(
            a.add(cidr("224.0.0.1", 32)),
            Err(LocalAddrError::Invalid("224.0.0.1".parse().unwrap()))
        );
    }

    #[test]
    fn the_set_is_bounded_and_removal_keeps_order() {
        let mut a = LocalAddrs::new(cidr("198.18.0.1", 24));
        for i in 1..MAX_LOCAL_ADDRS as u8 {
            assert_eq!(a.add(cidr(&format!("198.18.{i}.1"), 24)), Ok(true));
        }
        assert_eq!(
            a.add(cidr("198.19.0.1", 24)),
            Err(LocalAddrError::Full("198.19.0.1".parse().unwrap()))
        );
        a.remove("198.18.3.1".parse().unwrap()).unwrap();
        let list: Vec<String> = a.iter().map(|c| c.address().to_string()).collect();
        assert_eq!(
            list,
            [
                "198.18.0.1",
                "198.18.1.1",
                "198.18.2.1",
                "198.18.4.1",
                "198.18.5.1",
                "198.18.6.1",
                "198.18.7.1"
            ]
        );
        assert_eq!(a.add(cidr("198.19.0.1", 24)), Ok(true));
    }

    #[test]
    fn source_and_broadcast_follow_the_prefixes() {
        let mut a = LocalAddrs::new(cidr("198.18.0.1", 24));
        a.add(cidr("198.19.5.9", 16)).unwrap();
        a.add(cidr("198.18.9.1", 31)).unwrap();
        assert_eq!(
            a.source_for("198.19.200.1".parse().unwrap()),
            "198.19.5.9".parse::<Ipv4Addr>().unwrap()
        );
        assert_eq!(
            a.source_for("198.18.0.77".parse().unwrap()),
            "198.18.0.1".parse::<Ipv4Addr>().unwrap()
        );
        // Off every prefix: the primary.
        assert_eq!(
            a.source_for("10.0.0.1".parse().unwrap()),
            "198.18.0.1".parse::<Ipv4Addr>().unwrap()
        );
        assert!(a.is_subnet_broadcast("198.18.0.255".parse().unwrap()));
        assert!(a.is_subnet_broadcast("198.19.255.255".parse().unwrap()));
        // A /31 has no broadcast address.
        assert!(!a.is_subnet_broadcast("198.18.9.1".parse().unwrap()));
        assert!(!a.is_subnet_broadcast("198.18.9.0".parse().unwrap()));
    }
}
