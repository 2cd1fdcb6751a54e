//! LUNA's client port model: TCP source ports 61440–65535 are reserved for the user-space
//! stack (the kernel's `ip_local_port_range` must exclude them) and divided among
//! applications, receive queues and threads. A [`PartitionPlan`] maps every reserved port
//! to exactly one (application, queue, thread); a [`PortChooser`] picks a thread's ports
//! for `connect()` so the peer's replies land on the calling thread's queue.

use crate::toeplitz::{ipv4_tcp_input, toeplitz, RssConfig};
use core::fmt;
use core::net::{Ipv4Addr, SocketAddrV4};

/// An inclusive range of ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortRange {
    first: u16,
    last: u16,
}

impl PortRange {
    /// The range LUNA reserves for the user-space stack.
    pub const RESERVED: PortRange = PortRange {
        first: 61440,
        last: 65535,
    };

    /// `first..=last`; `None` if empty or if it contains port 0.
    pub const fn new(first: u16, last: u16) -> Option<PortRange> {
        if first == 0 || first > last {
            None
        } else {
            Some(PortRange { first, last })
        }
    }

    /// First port.
    pub const fn first(self) -> u16 {
        self.first
    }

    /// Last port (inclusive).
    pub const fn last(self) -> u16 {
        self.last
    }

    /// Number of ports.
    pub const fn len(self) -> u32 {
        self.last as u32 - self.first as u32 + 1
    }

    /// Never true (ranges are non-empty by construction); for clippy's sake.
    pub const fn is_empty(self) -> bool {
        false
    }

    /// Whether `port` is in the range.
    pub const fn contains(self, port: u16) -> bool {
        self.first <= port && port <= self.last
    }

    /// Whether the two ranges share a port.
    pub const fn overlaps(self, other: PortRange) -> bool {
        self.first <= other.last && other.first <= self.last
    }

    /// Whether `other` lies inside this range.
    pub const fn covers(self, other: PortRange) -> bool {
        self.first <= other.first && other.last <= self.last
    }

    /// The ports, in order.
    pub fn iter(self) -> impl Iterator<Item = u16> {
        self.first..=self.last
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// One thread of an application and the receive queue it polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ThreadSlot {
    /// Thread index within the application.
    pub thread: u16,
    /// Receive queue the thread polls.
    pub queue: u16,
}

/// How many ports an application gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// An equal part of what the other applications leave.
    Rest,
    /// This many ports, carved from the free space in order.
    Count(u32),
    /// Exactly this range.
    Range(PortRange),
}

/// An application sharing the reserved range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppSpec {
    /// Unique name.
    pub name: String,
    /// Its share of the range.
    pub share: Share,
    /// Its threads; the app's ports are split evenly among them.
    pub threads: Vec<ThreadSlot>,
}

impl AppSpec {
    /// An application with `threads` threads, thread `i` polling queue `i`.
    pub fn new(name: impl Into<String>, share: Share, threads: u16) -> Self {
        AppSpec {
            name: name.into(),
            share,
            threads: (0..threads)
                .map(|i| ThreadSlot {
                    thread: i,
                    queue: i,
                })
                .collect(),
        }
    }
}

/// One contiguous block of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// Index of the application in the spec list.
    pub app: usize,
    /// The thread (and queue) owning the block.
    pub slot: ThreadSlot,
    /// The ports.
    pub ports: PortRange,
}

/// Why a plan could not be built. Every message says what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// No applications were given.
    NoApps,
    /// Two applications share a name.
    DuplicateApp(String),
    /// An application has no threads.
    NoThreads(String),
    /// An application lists the same thread twice.
    DuplicateThread {
        /// Application.
        app: String,
        /// Thread index.
        thread: u16,
    },
    /// An explicit range leaves the reserved range.
    OutsideReserved {
        /// Application.
        app: String,
        /// Its range.
        range: PortRange,
        /// The reserved range.
        reserved: PortRange,
    },
    /// Two explicit ranges overlap.
    Overlap {
        /// First application.
        a: String,
        /// Second application.
        b: String,
    },
    /// An application would get fewer ports than it has threads.
    TooFewPorts {
        /// Application.
        app: String,
        /// Ports it would get.
        ports: u32,
        /// Its threads.
        threads: usize,
    },
    /// Counted shares ask for more ports than are free.
    Overcommitted {
        /// Application whose count did not fit.
        app: String,
        /// Ports it asked for.
        wanted: u32,
        /// Ports still free.
        free: u32,
    },
    /// Ports are left over and no application takes the rest.
    Unassigned(u32),
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::NoApps => f.write_str("no applications share the port range; add one"),
            PlanError::DuplicateApp(n) => {
                write!(f, "application `{n}` is listed twice; give each a unique name")
            }
            PlanError::NoThreads(n) => write!(f, "application `{n}` has no threads; give it at least one"),
            PlanError::DuplicateThread { app, thread } => {
                write!(f, "application `{app}` lists thread {thread} twice")
            }
            PlanError::OutsideReserved { app, range, reserved } => write!(
                f,
                "application `{app}` asks for ports {range} outside the reserved range {reserved}; pick ports inside it"
            ),
            PlanError::Overlap { a, b } => write!(
                f,
                "the port ranges of `{a}` and `{b}` overlap; every port belongs to one application"
            ),
            PlanError::TooFewPorts { app, ports, threads } => write!(
                f,
                "application `{app}` gets {ports} ports for {threads} threads; give it at least one port per thread"
            ),
            PlanError::Overcommitted { app, wanted, free } => write!(
                f,
                "application `{app}` asks for {wanted} ports but only {free} contiguous are free; lower its count"
            ),
            PlanError::Unassigned(n) => write!(
                f,
                "{n} reserved ports belong to no application; give one application `rest` (no count) or raise the counts"
            ),
        }
    }
}

impl std::error::Error for PlanError {}

/// The partition of the reserved range: every port to exactly one (app, queue, thread).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionPlan {
    reserved: PortRange,
    apps: Vec<AppSpec>,
    /// Sorted by first port, disjoint, covering `reserved`.
    blocks: Vec<Assignment>,
}

impl PartitionPlan {
    /// Build the plan: explicit ranges first, then counts carved from the free space in
    /// order, then `Rest` applications share what is left equally. Each application's
    /// ports are split among its threads in contiguous chunks, in thread order.
    pub fn build(reserved: PortRange, apps: &[AppSpec]) -> Result<Self, PlanError> {
        Self::build_aligned(reserved, apps, 0.0)
    }

    /// Like [`PartitionPlan::build`], but each application's split among its threads
    /// moves the boundaries by up to `balance` × (ports per thread) / 2 so that they fall
    /// on power-of-two aligned ports, which minimises the number of value/mask rules
    /// needed to steer each thread's ports (see [`crate::rules`]). Every thread still
    /// gets between (1 − `balance`) and (1 + `balance`) times its even share. `balance`
    /// is clamped to 0..=0.5; 0 is the exact even split of `build`.
    pub fn build_aligned(
        reserved: PortRange,
        apps: &[AppSpec],
        balance: f64,
    ) -> Result<Self, PlanError> {
        let balance = if balance.is_finite() {
            balance.clamp(0.0, 0.5)
        } else {
            0.0
        };
        if apps.is_empty() {
            return Err(PlanError::NoApps);
        }
        for (i, a) in apps.iter().enumerate() {
            if apps[..i].iter().any(|b| b.name == a.name) {
                return Err(PlanError::DuplicateApp(a.name.clone()));
            }
            if a.threads.is_empty() {
                return Err(PlanError::NoThreads(a.name.clone()));
            }
            for (j, t) in a.threads.iter().enumerate() {
                if a.threads[..j].iter().any(|u| u.thread == t.thread) {
                    return Err(PlanError::DuplicateThread {
                        app: a.name.clone(),
                        thread: t.thread,
                    });
                }
            }
        }
        // Free space as sorted disjoint intervals.
        let mut free = vec![reserved];
        let mut owned: Vec<Vec<PortRange>> = vec![Vec::new(); apps.len()];
        for (i, a) in apps.iter().enumerate() {
            if let Share::Range(r) = a.share {
                if !reserved.covers(r) {
                    return Err(PlanError::OutsideReserved {
                        app: a.name.clone(),
                        range: r,
                        reserved,
                    });
                }
                if let Some(j) =
                    (0..i).find(|&j| matches!(apps[j].share, Share::Range(o) if o.overlaps(r)))
                {
                    return Err(PlanError::Overlap {
                        a: apps[j].name.clone(),
                        b: a.name.clone(),
                    });
                }
                free = subtract(&free, r);
                owned[i].push(r);
            }
        }
        for (i, a) in apps.iter().enumerate() {
            if let Share::Count(n) = a.share {
                let fits = free.iter().position(|r| r.len() >= n && n > 0);
                let Some(k) = fits else {
                    return Err(PlanError::Overcommitted {
                        app: a.name.clone(),
                        wanted: n,
                        free: free.iter().map(|r| r.len()).max().unwrap_or(0),
                    });
                };
                let r = free[k];
                let take = PortRange {
                    first: r.first,
                    last: (u32::from(r.first) + n - 1) as u16,
                };
                free = subtract(&free, take);
                owned[i].push(take);
            }
        }
        let rest: Vec<usize> = (0..apps.len())
            .filter(|&i| apps[i].share == Share::Rest)
            .collect();
        let left: u32 = free.iter().map(|r| r.len()).sum();
        if rest.is_empty() && left > 0 {
            return Err(PlanError::Unassigned(left));
        }
        if !rest.is_empty() {
            let sizes = even_split(left, rest.len());
            let mut cursor = Cursor::new(&free);
            for (&i, n) in rest.iter().zip(sizes) {
                owned[i] = cursor.take(n);
            }
        }
        let mut blocks = Vec::new();
        for (i, a) in apps.iter().enumerate() {
            let total: u32 = owned[i].iter().map(|r| r.len()).sum();
            if (total as usize) < a.threads.len() {
                return Err(PlanError::TooFewPorts {
                    app: a.name.clone(),
                    ports: total,
                    threads: a.threads.len(),
                });
            }
            if balance > 0.0 && owned[i].len() == 1 {
                let parts = aligned_split(owned[i][0], a.threads.len(), balance);
                for (slot, ports) in a.threads.iter().zip(parts) {
                    blocks.push(Assignment {
                        app: i,
                        slot: *slot,
                        ports,
                    });
                }
                continue;
            }
            let mut cursor = Cursor::new(&owned[i]);
            for (slot, n) in a.threads.iter().zip(even_split(total, a.threads.len())) {
                for ports in cursor.take(n) {
                    blocks.push(Assignment {
                        app: i,
                        slot: *slot,
                        ports,
                    });
                }
            }
        }
        blocks.sort_by_key(|b| b.ports.first);
        Ok(PartitionPlan {
            reserved,
            apps: apps.to_vec(),
            blocks,
        })
    }

    /// The reserved range the plan covers.
    pub fn reserved(&self) -> PortRange {
        self.reserved
    }

    /// The applications, in spec order.
    pub fn apps(&self) -> &[AppSpec] {
        &self.apps
    }

    /// All blocks, sorted by port.
    pub fn assignments(&self) -> &[Assignment] {
        &self.blocks
    }

    /// Who owns `port`; `None` outside the reserved range.
    pub fn owner(&self, port: u16) -> Option<&Assignment> {
        let i = self.blocks.partition_point(|b| b.ports.last < port);
        self.blocks.get(i).filter(|b| b.ports.contains(port))
    }

    /// The ports of one thread of an application (empty if unknown).
    pub fn ports_of(&self, app: &str, thread: u16) -> Vec<PortRange> {
        let Some(i) = self.apps.iter().position(|a| a.name == app) else {
            return Vec::new();
        };
        self.blocks
            .iter()
            .filter(|b| b.app == i && b.slot.thread == thread)
            .map(|b| b.ports)
            .collect()
    }
}

/// `total` split into `parts` sizes differing by at most one (larger ones first).
fn even_split(total: u32, parts: usize) -> Vec<u32> {
    let parts32 = parts as u32;
    (0..parts32)
        .map(|i| total / parts32 + u32::from(i < total % parts32))
        .collect()
}

/// `range` split into `parts` contiguous pieces whose boundaries stay within
/// ±`balance`/2 of a share of the even boundaries and, among those, minimise the total
/// number of value/mask rules (dynamic programming over the candidate boundaries).
/// Needs `range.len() >= parts` (checked by the caller).
fn aligned_split(range: PortRange, parts: usize, balance: f64) -> Vec<PortRange> {
    let first = u32::from(range.first);
    let total = range.len();
    let share = f64::from(total) / parts as f64;
    // Half the tolerance on each boundary keeps every piece within ±balance of `share`;
    // below `share / 2` so that boundaries stay strictly increasing. The window is capped
    // so the DP stays small (parts × window² rule counts), which may cost a few rules.
    let mut w = ((share * balance) / 2.0).floor() as u32;
    w = w.min(((share / 2.0).floor() as u32).saturating_sub(1));
    // At most ~2M candidate pairs in all: (2w+1)² per boundary.
    let cap = (((2_000_000.0 / parts as f64).sqrt() - 1.0) / 2.0).max(0.0) as u32;
    w = w.min(cap);
    let ideal = |i: usize| first + ((i as f64) * share).round() as u32;
    // cands[i]: candidate boundaries for the start of piece i (i = 0 and i = parts fixed).
    let cands: Vec<Vec<u32>> = (0..=parts)
        .map(|i| {
            if i == 0 {
                vec![first]
            } else if i == parts {
                vec![first + total]
            } else {
                let c = ideal(i);
                (c - w..=c + w).collect()
            }
        })
        .collect();
    // best[i][k]: (cost, back pointer) of reaching candidate k of boundary i.
    let mut best: Vec<Vec<(u32, usize)>> = vec![vec![(0, 0)]];
    for i in 1..=parts {
        let row: Vec<(u32, usize)> = cands[i]
            .iter()
            .map(|&b| {
                cands[i - 1]
                    .iter()
                    .enumerate()
                    .filter(|&(_, &a)| a < b)
                    .map(|(j, &a)| (best[i - 1][j].0 + crate::rules::cover_len(a, b - 1), j))
                    .min()
                    .unwrap_or((u32::MAX / 2, 0))
            })
            .collect();
        best.push(row);
    }
    let mut bounds = vec![first + total];
    let mut k = 0;
    for i in (1..=parts).rev() {
        k = best[i][k].1;
        bounds.push(cands[i - 1][k]);
    }
    bounds.reverse();
    bounds
        .windows(2)
        .map(|p| PortRange {
            first: p[0] as u16,
            last: (p[1] - 1) as u16,
        })
        .collect()
}

/// Sorted disjoint intervals minus `r`.
fn subtract(free: &[PortRange], r: PortRange) -> Vec<PortRange> {
    let mut out = Vec::with_capacity(free.len() + 1);
    for &f in free {
        if !f.overlaps(r) {
            out.push(f);
            continue;
        }
        if f.first < r.first {
            out.push(PortRange {
                first: f.first,
                last: r.first - 1,
            });
        }
        if f.last > r.last {
            out.push(PortRange {
                first: r.last + 1,
                last: f.last,
            });
        }
    }
    out
}

/// Hands out consecutive ports from a list of intervals.
struct Cursor<'a> {
    ranges: &'a [PortRange],
    idx: usize,
    next: u32,
}

impl<'a> Cursor<'a> {
    fn new(ranges: &'a [PortRange]) -> Self {
        Cursor {
            ranges,
            idx: 0,
            next: ranges.first().map_or(0, |r| u32::from(r.first)),
        }
    }

    fn take(&mut self, mut n: u32) -> Vec<PortRange> {
        let mut out = Vec::new();
        while n > 0 && self.idx < self.ranges.len() {
            let r = self.ranges[self.idx];
            let avail = u32::from(r.last) - self.next + 1;
            let k = avail.min(n);
            out.push(PortRange {
                first: self.next as u16,
                last: (self.next + k - 1) as u16,
            });
            n -= k;
            self.next += k;
            if self.next > u32::from(r.last) {
                self.idx += 1;
                self.next = self.ranges.get(self.idx).map_or(0, |r| u32::from(r.first));
            }
        }
        out
    }
}

/// Why no port could be chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChooseError {
    /// Every port of the partition is in use towards this destination.
    Exhausted,
    /// Free ports exist, but none hashes to this thread's queues for this destination.
    NoPortForQueue,
}

impl fmt::Display for ChooseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChooseError::Exhausted => f.write_str("every port of this thread's partition is in use towards that destination"),
            ChooseError::NoPortForQueue => f.write_str(
                "no free port of this thread's partition hashes (RSS) to its queue for that destination; give the thread more ports",
            ),
        }
    }
}

impl std::error::Error for ChooseError {}

/// RSS steering of the calling thread: the device's RSS setup and the queues it polls.
#[derive(Debug, Clone)]
pub struct Steering {
    /// The device's key and redirection table.
    pub rss: RssConfig,
    /// The queues the calling thread polls.
    pub queues: Vec<u16>,
}

/// Picks local ports for `connect()` from one thread's partition.
///
/// With [`Steering`] a port is taken only if the peer's replies (source = peer, destination
/// = us) hash to one of the thread's queues, so the whole connection stays on the calling
/// core (F-Stack's `ff_rss_check`, Seastar's `hash2cpu`). Without it (memif, tap, single
/// queue) any free port of the partition is taken. Ports are tried round robin from where
/// the last choice stopped.
#[derive(Debug, Clone)]
pub struct PortChooser {
    ports: Vec<u16>,
    /// Toeplitz contribution of each port in `ports` as a destination port (see
    /// [`PortChooser::choose`]); empty without steering.
    port_hash: Vec<u32>,
    steering: Option<Steering>,
    next: usize,
}

impl PortChooser {
    /// A chooser over `ranges` (a thread's blocks from [`PartitionPlan::ports_of`]).
    pub fn new(ranges: &[PortRange], steering: Option<Steering>) -> Self {
        let ports: Vec<u16> = ranges.iter().flat_map(|r| r.iter()).collect();
        let port_hash = match &steering {
            Some(s) => ports
                .iter()
                .map(|&p| {
                    let zero = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);
                    toeplitz(
                        s.rss.key(),
                        &ipv4_tcp_input(zero, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, p)),
                    )
                })
                .collect(),
            None => Vec::new(),
        };
        PortChooser {
            ports,
            port_hash,
            steering,
            next: 0,
        }
    }

    /// Starts the search at the port `r` picks (`r` modulo the partition's size), so that
    /// a process's first connections do not always leave from the partition's first ports
    /// (RFC 6056: ephemeral ports should not be predictable; the search then goes on in
    /// turn, as its sequential algorithms from a random offset). From a fixed first port, every run of a client
    /// reused the 4-tuples of the run before, which a server that closed first still
    /// holds in TIME-WAIT (its SYN answered by the old connection's ACK, the connection
    /// up only after the SYN's retransmission), and the ports were predictable.
    pub fn start_at(&mut self, r: u32) {
        if !self.ports.is_empty() {
            self.next = r as usize % self.ports.len();
        }
    }

    /// Number of ports in the partition.
    pub fn len(&self) -> usize {
        self.ports.len()
    }

    /// Whether the partition is empty.
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty()
    }

    /// The steering, if any.
    pub fn steering(&self) -> Option<&Steering> {
        self.steering.as_ref()
    }

    /// Whether `port` belongs to this partition.
    pub fn owns(&self, port: u16) -> bool {
        self.ports.contains(&port)
    }

    /// A free local port for a connection from `local_ip` to `remote`. `in_use(port)` says
    /// whether the 4-tuple with that local port is taken (the stack's `tuple_in_use`).
    pub fn choose(
        &mut self,
        local_ip: Ipv4Addr,
        remote: SocketAddrV4,
        mut in_use: impl FnMut(u16) -> bool,
    ) -> Result<u16, ChooseError> {
        let n = self.ports.len();
        // The hash of a reply (remote -> local_ip:port) is linear in its input, so it is the
        // hash with port 0 XOR the port's own contribution, precomputed per port.
        let base = self.steering.as_ref().map(|s| {
            toeplitz(
                s.rss.key(),
                &ipv4_tcp_input(remote, SocketAddrV4::new(local_ip, 0)),
            )
        });
        let mut any_free = false;
        for k in 0..n {
            let i = (self.next + k) % n;
            let port = self.ports[i];
            if in_use(port) {
                continue;
            }
            any_free = true;
            if let (Some(s), Some(base)) = (&self.steering, base) {
                let q = s.rss.queue_of_hash(base ^ self.port_hash[i]);
                if !s.queues.contains(&q) {
                    continue;
                }
            }
            self.next = (i + 1) % n;
            return Ok(port);
        }
        Err(if any_free {
            ChooseError::NoPortForQueue
        } else {
            ChooseError::Exhausted
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toeplitz::MICROSOFT_KEY;

    fn r(a: u16, b: u16) -> PortRange {
        PortRange::new(a, b).unwrap()
    }

    fn every_port_once(plan: &PartitionPlan) {
        let reserved = plan.reserved();
        let mut count = vec![0u32; reserved.len() as usize];
        for b in plan.assignments() {
            for p in b.ports.iter() {
                count[usize::from(p - reserved.first())] += 1;
            }
        }
        assert!(
            count.iter().all(|&c| c == 1),
            "every reserved port maps to exactly one thread"
        );
        for p in reserved.iter() {
            let o = plan.owner(p).expect("owned");
            assert!(o.ports.contains(p));
        }
    }

    #[test]
    fn every_reserved_port_maps_to_exactly_one_thread() {
        let specs = [
            vec![AppSpec::new("one", Share::Rest, 1)],
            vec![AppSpec::new("knb", Share::Rest, 3)],
            vec![
                AppSpec::new("a", Share::Range(r(61440, 62463)), 2),
                AppSpec::new("b", Share::Count(1000), 3),
                AppSpec::new("c", Share::Rest, 5),
                AppSpec::new("d", Share::Rest, 7),
            ],
            vec![
                AppSpec::new("mid", Share::Range(r(63000, 63099)), 1),
                AppSpec::new("x", Share::Rest, 4),
            ],
        ];
        for apps in specs {
            let plan = PartitionPlan::build(PortRange::RESERVED, &apps).unwrap();
            every_port_once(&plan);
            // Each thread's share differs from its siblings' by at most one port.
            for (i, a) in apps.iter().enumerate() {
                let sizes: Vec<u32> = a
                    .threads
                    .iter()
                    .map(|t| {
                        plan.ports_of(&apps[i].name, t.thread)
                            .iter()
                            .map(|r| r.len())
                            .sum()
                    })
                    .collect();
                let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(hi - lo <= 1, "{sizes:?}");
            }
        }
    }

    #[test]
    fn explicit_and_counted_shares_are_honoured() {
        let apps = [
            AppSpec::new("a", Share::Range(r(65000, 65535)), 2),
            AppSpec::new("b", Share::Count(100), 1),
            AppSpec::new("c", Share::Rest, 1),
        ];
        let plan = PartitionPlan::build(PortRange::RESERVED, &apps).unwrap();
        assert_eq!(plan.ports_of("a", 0), vec![r(65000, 65267)]);
        assert_eq!(plan.ports_of("a", 1), vec![r(65268, 65535)]);
        assert_eq!(plan.ports_of("b", 0), vec![r(61440, 61539)]);
        assert_eq!(plan.ports_of("c", 0), vec![r(61540, 64999)]);
        assert_eq!(plan.owner(61439), None);
        assert_eq!(plan.owner(65100).unwrap().app, 0);
    }

    #[test]
    fn bad_plans_are_refused_with_a_reason() {
        let e = |apps: &[AppSpec]| PartitionPlan::build(PortRange::RESERVED, apps).unwrap_err();
        assert_eq!(e(&[]), PlanError::NoApps);
        assert!(matches!(
            e(&[
                AppSpec::new("a", Share::Range(r(61440, 62000)), 1),
                AppSpec::new("b", Share::Range(r(61900, 63000)), 1),
                AppSpec::new("c", Share::Rest, 1),
            ]),
            PlanError::Overlap { .. }
        ));
        assert!(matches!(
            e(&[AppSpec::new("a", Share::Range(r(1024, 2048)), 1)]),
            PlanError::OutsideReserved { .. }
        ));
        assert!(matches!(
            e(&[AppSpec::new("a", Share::Count(5000), 1)]),
            PlanError::Overcommitted { .. }
        ));
        assert_eq!(
            e(&[AppSpec::new("a", Share::Count(10), 1)]),
            PlanError::Unassigned(4086)
        );
        assert!(matches!(
            e(&[
                AppSpec::new("a", Share::Range(r(61440, 61441)), 3),
                AppSpec::new("b", Share::Rest, 1)
            ]),
            PlanError::TooFewPorts { .. }
        ));
        assert_eq!(
            e(&[
                AppSpec::new("a", Share::Rest, 1),
                AppSpec::new("a", Share::Rest, 1)
            ]),
            PlanError::DuplicateApp("a".into())
        );
        assert_eq!(
            e(&[AppSpec::new("a", Share::Rest, 0)]),
            PlanError::NoThreads("a".into())
        );
        for err in [PlanError::NoApps, PlanError::Unassigned(3)] {
            assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn connect_lands_on_the_calling_queue() {
        let queues = 4u16;
        let rss = RssConfig::round_robin(&MICROSOFT_KEY, 128, queues).unwrap();
        let plan = PartitionPlan::build(
            PortRange::RESERVED,
            &[AppSpec::new("app", Share::Rest, queues)],
        )
        .unwrap();
        let local = Ipv4Addr::new(198, 18, 0, 1);
        for t in 0..queues {
            let mut chooser = PortChooser::new(
                &plan.ports_of("app", t),
                Some(Steering {
                    rss: rss.clone(),
                    queues: vec![t],
                }),
            );
            let mut used = std::collections::HashSet::new();
            for i in 0..50u16 {
                let remote =
                    SocketAddrV4::new(Ipv4Addr::new(198, 18, 1, (i % 7) as u8 + 1), 7000 + i % 3);
                let port = chooser
                    .choose(local, remote, |p| used.contains(&(remote, p)))
                    .unwrap();
                assert!(plan.ports_of("app", t).iter().any(|r| r.contains(port)));
                // The reply (remote -> us) is hashed by the NIC onto thread t's queue.
                assert_eq!(
                    rss.queue_of_ipv4_tcp(remote, SocketAddrV4::new(local, port)),
                    t
                );
                used.insert((remote, port));
            }
        }
    }

    #[test]
    fn chooser_without_rss_uses_the_partition_and_reports_exhaustion() {
        let mut c = PortChooser::new(&[r(61440, 61442)], None);
        c.start_at(3);
        let remote: SocketAddrV4 = "198.18.0.2:7".parse().unwrap();
        let local = Ipv4Addr::new(198, 18, 0, 1);
        let mut used = Vec::new();
        for _ in 0..3 {
            let p = c.choose(local, remote, |p| used.contains(&p)).unwrap();
            used.push(p);
        }
        used.sort();
        assert_eq!(used, vec![61440, 61441, 61442]);
        assert_eq!(
            c.choose(local, remote, |p| used.contains(&p)),
            Err(ChooseError::Exhausted)
        );
    }

    /// The search starts where `start_at` put it (modulo the partition, which also spans
    /// several blocks), then goes round: a fresh chooser is not pinned to the first port.
    #[test]
    fn the_search_starts_at_the_random_start_and_wraps() {
        let remote: SocketAddrV4 = "198.18.0.2:7".parse().unwrap();
        let local = Ipv4Addr::new(198, 18, 0, 1);
        let blocks = [r(61440, 61442), r(62000, 62001)];
        for (start, first) in [(0, 61440), (1, 61441), (3, 62000), (4, 62001), (5, 61440)] {
            let mut c = PortChooser::new(&blocks, None);
            c.start_at(start);
            assert_eq!(
                c.choose(local, remote, |_| false),
                Ok(first),
                "start {start}"
            );
        }
        let mut c = PortChooser::new(&blocks, None);
        c.start_at(u32::MAX);
        let mut seen: Vec<u16> = (0..5)
            .map(|_| c.choose(local, remote, |_| false).unwrap())
            .collect();
        assert_eq!(
            seen[0],
            [61440, 61441, 61442, 62000, 62001][u32::MAX as usize % 5]
        );
        seen.sort();
        assert_eq!(
            seen,
            vec![61440, 61441, 61442, 62000, 62001],
            "round once, in turn"
        );
        let mut empty = PortChooser::new(&[], None);
        empty.start_at(7);
        assert_eq!(
            empty.choose(local, remote, |_| false),
            Err(ChooseError::Exhausted)
        );
    }

    #[test]
    fn chooser_reports_when_no_port_steers_to_the_queue() {
        // One port: it hashes to exactly one of two queues; ask for the other one.
        let rss = RssConfig::round_robin(&MICROSOFT_KEY, 128, 2).unwrap();
        let local = Ipv4Addr::new(198, 18, 0, 1);
        let remote: SocketAddrV4 = "198.18.0.2:7".parse().unwrap();
        let q = rss.queue_of_ipv4_tcp(remote, SocketAddrV4::new(local, 61440));
        let mut c = PortChooser::new(
            &[r(61440, 61440)],
            Some(Steering {
                rss,
                queues: vec![1 - q],
            }),
        );
        assert_eq!(
            c.choose(local, remote, |_| false),
            Err(ChooseError::NoPortForQueue)
        );
    }
}
