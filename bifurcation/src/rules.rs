//! The rule compiler: luna's flows to luna's queues as rte_flow-style rules that match
//! the destination port by value and mask (sans-IO; [`crate::install`] turns them into
//! `rte_flow` calls).
//!
//! A NIC's flow table (mlx5 in DPDK 22.11) matches a port field with a bit mask, not a
//! range, so a thread's port range `[first, last]` needs one rule per *prefix-aligned*
//! block in its minimal cover: the greedy walk that, from `first`, takes the largest
//! block `2^k` that starts at a multiple of `2^k` and ends by `last` ([`mask_cover`]). A
//! range of `n` ports needs at most `2·log2(n)` blocks, exactly one when it is itself
//! aligned. [`compile`] emits, per thread, the blocks of its ranges, and for every
//! listening port one exact-match rule spread by RSS over the listeners' queues.
//!
//! The count depends on where the thread boundaries fall, so the plan matters as much
//! as the compiler: [`PartitionPlan::build`] splits exactly evenly (the "naive" plan the
//! table in docs/bifurcation.md compares against), while [`PartitionPlan::build_aligned`]
//! moves each boundary by a bounded amount onto aligned ports. Rule counts for both are
//! printed by `bifurcation rules`.

use crate::model::{TrafficModel, L4};
use crate::ports::{PartitionPlan, PortRange};
use core::fmt;
use core::net::Ipv4Addr;

/// One value/mask pair: port `p` matches when `p & mask == value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortMask {
    /// Value (its bits outside `mask` are zero).
    pub value: u16,
    /// Mask: the fixed high bits.
    pub mask: u16,
}

impl PortMask {
    /// Whether `port` matches.
    pub const fn matches(self, port: u16) -> bool {
        port & self.mask == self.value
    }

    /// The ports matched, as a range (a prefix mask always matches a contiguous block).
    pub fn range(self) -> PortRange {
        let last = self.value | !self.mask;
        // value 0 with a short mask would include port 0, which PortRange excludes; the
        // compiler never emits such a block because luna's ranges never contain port 0.
        PortRange::new(self.value.max(1), last).unwrap_or(PortRange::RESERVED)
    }

    /// Number of ports matched.
    pub const fn len(self) -> u32 {
        (!self.mask) as u32 + 1
    }

    /// Never true; for clippy's sake.
    pub const fn is_empty(self) -> bool {
        false
    }
}

impl fmt::Display for PortMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/0x{:04x}", self.value, self.mask)
    }
}

/// The minimal set of prefix-aligned blocks covering `first..=last` (as u32 so that
/// `last + 1 = 65536` needs no special case). Empty when `first > last`.
pub fn mask_cover_u32(first: u32, last: u32) -> Vec<PortMask> {
    let mut out = Vec::new();
    let mut a = first;
    while a <= last && a <= 0xffff {
        let mut size = 1u32;
        while a % (size * 2) == 0 && a + size * 2 - 1 <= last && size * 2 <= 0x1_0000 {
            size *= 2;
        }
        out.push(PortMask {
            value: a as u16,
            mask: !((size - 1) as u16),
        });
        a += size;
    }
    out
}

/// The minimal set of prefix-aligned blocks covering `range`.
pub fn mask_cover(range: PortRange) -> Vec<PortMask> {
    mask_cover_u32(range.first().into(), range.last().into())
}

/// Number of blocks in the minimal cover of `first..=last` (no allocation).
pub(crate) fn cover_len(first: u32, last: u32) -> u32 {
    let mut n = 0;
    let mut a = first;
    while a <= last && a <= 0xffff {
        let mut size = 1u32;
        while a % (size * 2) == 0 && a + size * 2 - 1 <= last && size * 2 <= 0x1_0000 {
            size *= 2;
        }
        n += 1;
        a += size;
    }
    n
}

/// Where a rule sends its packets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One receive queue (one thread of one application).
    Queue(u16),
    /// Spread by RSS over these queues (a listening port's connections).
    Rss(Vec<u16>),
}

/// Why a rule exists (for listings and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A block of a client thread's share of the reserved range.
    Client {
        /// Application index in the plan.
        app: usize,
        /// Thread within the application.
        thread: u16,
    },
    /// A listening port.
    Listener,
}

/// One rule: IPv4 (to `dst_ip` when set) / `proto` with destination port
/// `port.value`/`port.mask` → `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRule {
    /// Transport protocol.
    pub proto: L4,
    /// Destination IPv4 address to match, if the model names one.
    pub dst_ip: Option<Ipv4Addr>,
    /// Destination port value and mask.
    pub port: PortMask,
    /// Where matching packets go.
    pub target: Target,
    /// Why the rule exists.
    pub origin: Origin,
}

impl PortRule {
    /// Whether a packet of `proto` to `port` (at the model's address) matches.
    pub fn matches(&self, proto: L4, port: u16) -> bool {
        self.proto == proto && self.port.matches(port)
    }
}

/// A compiled rule set.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuleSet {
    /// The rules, client blocks in port order, then listeners.
    pub rules: Vec<PortRule>,
}

impl RuleSet {
    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rules matching a packet of `proto` to `port` (a correct set returns at most one).
    pub fn lookup(&self, proto: L4, port: u16) -> impl Iterator<Item = &PortRule> {
        self.rules.iter().filter(move |r| r.matches(proto, port))
    }
}

/// Rules for the client blocks of a plan (TCP), one per aligned block of each
/// thread's ranges, to that thread's queue.
pub fn compile_plan(plan: &PartitionPlan, dst_ip: Option<Ipv4Addr>) -> RuleSet {
    let mut rules = Vec::new();
    for a in plan.assignments() {
        for m in mask_cover(a.ports) {
            rules.push(PortRule {
                proto: L4::Tcp,
                dst_ip,
                port: m,
                target: Target::Queue(a.slot.queue),
                origin: Origin::Client {
                    app: a.app,
                    thread: a.slot.thread,
                },
            });
        }
    }
    RuleSet { rules }
}

/// Rules for a whole model: its plan's client blocks, then one exact-match rule per
/// listening TCP/UDP port spread over the queues of every thread of the plan.
pub fn compile(model: &TrafficModel) -> RuleSet {
    compile_for(model, None)
}

/// Rules for one application of the model (`Some(name)`), as installed on that
/// application's own port or SR-IOV VF: its client blocks only, and the listening ports
/// spread over its queues. `None` is [`compile`]. An unknown name gives an empty set.
pub fn compile_for(model: &TrafficModel, app: Option<&str>) -> RuleSet {
    let plan = model.plan();
    let index = match app {
        None => None,
        Some(name) => match plan.apps().iter().position(|a| a.name == name) {
            Some(i) => Some(i),
            None => return RuleSet::default(),
        },
    };
    let mut set = compile_plan(plan, model.ip());
    if let Some(i) = index {
        set.rules
            .retain(|r| matches!(r.origin, Origin::Client { app, .. } if app == i));
    }
    let mut queues: Vec<u16> = plan
        .apps()
        .iter()
        .enumerate()
        .filter(|(i, _)| index.is_none_or(|j| j == *i))
        .flat_map(|(_, a)| a.threads.iter().map(|t| t.queue))
        .collect();
    queues.sort_unstable();
    queues.dedup();
    for (proto, ports) in [(L4::Tcp, model.listen_tcp()), (L4::Udp, model.listen_udp())] {
        for &p in ports {
            set.rules.push(PortRule {
                proto,
                dst_ip: model.ip(),
                port: PortMask {
                    value: p,
                    mask: 0xffff,
                },
                target: Target::Rss(queues.clone()),
                origin: Origin::Listener,
            });
        }
    }
    set
}

/// Rule counts of the ways to steer one plan's client ports (see docs/bifurcation.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// One exact-match rule per port.
    pub per_port: u32,
    /// One range rule per thread block (needs range matching, which mlx5 lacks in 22.11).
    pub per_range: u32,
    /// Minimal value/mask cover of each block.
    pub masked: u32,
}

/// The three counts for a plan.
pub fn counts(plan: &PartitionPlan) -> Counts {
    let a = plan.assignments();
    Counts {
        per_port: a.iter().map(|b| b.ports.len()).sum(),
        per_range: a.len() as u32,
        masked: a
            .iter()
            .map(|b| cover_len(b.ports.first().into(), b.ports.last().into()))
            .sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::{AppSpec, Share};

    fn plan(threads: &[u16], balance: f64) -> PartitionPlan {
        let apps: Vec<AppSpec> = threads
            .iter()
            .enumerate()
            .map(|(i, &t)| AppSpec::new(format!("app{i}"), Share::Rest, t))
            .collect();
        PartitionPlan::build_aligned(PortRange::RESERVED, &apps, balance).unwrap()
    }

    #[test]
    fn aligned_range_is_one_rule() {
        let c = mask_cover(PortRange::RESERVED);
        assert_eq!(
            c,
            vec![PortMask {
                value: 61440,
                mask: 0xf000
            }]
        );
        assert_eq!(c[0].range(), PortRange::RESERVED);
    }

    #[test]
    fn cover_of_odd_range() {
        // 61441..=61446: 61441/1, 61442/2 (..43), 61444/2 (..45), 61446/1.
        let c = mask_cover(PortRange::new(61441, 61446).unwrap());
        let lens: Vec<u32> = c.iter().map(|m| m.len()).collect();
        assert_eq!(lens, vec![1, 2, 2, 1]);
        assert_eq!(cover_len(61441, 61446), 4);
    }

    #[test]
    fn cover_reaches_65535() {
        let c = mask_cover(PortRange::new(65534, 65535).unwrap());
        assert_eq!(
            c,
            vec![PortMask {
                value: 65534,
                mask: 0xfffe
            }]
        );
        assert_eq!(mask_cover_u32(1, 65535).len(), 16);
    }

    #[test]
    fn paper_case_counts() {
        // Two applications, 12 and 6 threads, sharing 61440–65535 evenly.
        let even = counts(&plan(&[12, 6], 0.0));
        assert_eq!(even.per_port, 4096);
        assert_eq!(even.per_range, 18);
        assert_eq!(even.masked, 126);
        let aligned = counts(&plan(&[12, 6], 0.125));
        assert!(aligned.masked < even.masked, "{aligned:?} vs {even:?}");
    }

    #[test]
    fn per_app_rules_for_its_own_vf() {
        use crate::model::{KernelPorts, TrafficConfig};
        let m = TrafficConfig::from_toml(
            "listen_tcp = [7000]\napps = [{ name = \"a\", threads = 4 }, { name = \"b\", threads = 2 }]",
        )
        .unwrap()
        .validate(&KernelPorts::linux_default())
        .unwrap();
        let all = compile(&m);
        let a = compile_for(&m, Some("a"));
        let b = compile_for(&m, Some("b"));
        assert_eq!(a.len() + b.len(), all.len() + 1, "the listener is in both");
        assert!(a.lookup(L4::Tcp, 65535).next().is_none());
        assert!(b.lookup(L4::Tcp, 61440).next().is_none());
        let l: Vec<_> = b.lookup(L4::Tcp, 7000).collect();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].target, Target::Rss(vec![4, 5]));
        assert!(compile_for(&m, Some("nope")).is_empty());
    }

    #[test]
    fn power_of_two_threads_need_one_rule_each() {
        for t in [1u16, 2, 4, 8, 16] {
            assert_eq!(counts(&plan(&[t], 0.0)).masked, u32::from(t));
        }
    }
}
