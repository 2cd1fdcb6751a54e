//! Installing a compiled [`RuleSet`] on a DPDK port through `rte_flow`, with flow
//! isolation, or falling back to the software classifier — never silently.
//!
//! Order (DPDK requires isolation before `rte_eth_dev_configure`):
//! 1. [`isolate`] on the stopped, unconfigured port: on a bifurcated driver (mlx5) the
//!    port then receives only what rules send to it, and the kernel netdev keeps the rest.
//! 2. configure and start the port as usual.
//! 3. [`install`]: every rule is validated (`rte_flow_validate`) and then created
//!    (`rte_flow_create`). Any failure — isolation unavailable, a rule the PMD refuses,
//!    no flow API at all (memif, af_packet; net_tap here, whose flow API needs the tc
//!    flower classifier this kernel lacks) — destroys what was created and returns
//!    [`Installed::Software`], after printing one line to stderr that says why and what
//!    happens instead: luna's poll loop classifies every frame
//!    ([`crate::classify::Classifier`]) and the kernel's go out the exception interface.
//!
//! Why all-or-nothing: with some rules in hardware and some not, the missing ports would
//! land on the kernel netdev (isolated) and their connections would silently stall.

use crate::model::L4;
use crate::rules::{PortRule, RuleSet, Target};
use dpdk_sys::flow::{Ipv4Match, TcpMatch, UdpMatch};
use dpdk_sys::{Flow, FlowAction, FlowAttr, FlowItem, FlowRule, Port};
use std::net::Ipv4Addr;

/// Outcome of [`isolate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Isolation {
    /// The port receives only what flow rules send to it.
    On,
    /// The PMD refused; the reason.
    Unavailable(String),
}

/// Turns on flow isolation; call before configuring the port.
pub fn isolate(port: &Port) -> Isolation {
    match port.flow_isolate(true) {
        Ok(()) => Isolation::On,
        Err(e) => Isolation::Unavailable(format!("rte_flow_isolate: {e}")),
    }
}

/// How luna's traffic is steered on a port.
pub enum Installed {
    /// In the NIC: the created rules (destroyed when this is dropped).
    Hardware {
        /// One handle per rule of the set, in order.
        flows: Vec<Flow>,
    },
    /// In luna's poll loop.
    Software {
        /// The one-line message printed when falling back.
        message: String,
    },
}

impl Installed {
    /// Whether the NIC steers.
    pub fn is_hardware(&self) -> bool {
        matches!(self, Installed::Hardware { .. })
    }
}

impl std::fmt::Debug for Installed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Installed::Hardware { flows } => write!(f, "Hardware({} rules)", flows.len()),
            Installed::Software { message } => write!(f, "Software({message:?})"),
        }
    }
}

/// The rte_flow rule for one compiled rule: ETH / IPV4 (dst when set, protocol) /
/// TCP|UDP (dst port value and mask) → QUEUE or RSS.
pub fn flow_rule(rule: &PortRule) -> FlowRule {
    let proto = match rule.proto {
        L4::Tcp => 6,
        L4::Udp => 17,
    };
    let (dst, dst_mask) = match rule.dst_ip {
        Some(ip) => (ip, Ipv4Addr::BROADCAST),
        None => (Ipv4Addr::UNSPECIFIED, Ipv4Addr::UNSPECIFIED),
    };
    let l4 = match rule.proto {
        L4::Tcp => FlowItem::Tcp {
            spec: Some(TcpMatch {
                dst_port: rule.port.value,
                ..Default::default()
            }),
            mask: Some(TcpMatch {
                dst_port: rule.port.mask,
                ..Default::default()
            }),
        },
        L4::Udp => FlowItem::Udp {
            spec: Some(UdpMatch {
                dst_port: rule.port.value,
                src_port: 0,
            }),
            mask: Some(UdpMatch {
                dst_port: rule.port.mask,
                src_port: 0,
            }),
        },
    };
    let action = match &rule.target {
        Target::Queue(q) => FlowAction::Queue(*q),
        Target::Rss(qs) => FlowAction::Rss {
            queues: qs.clone(),
            // RTE_ETH_RSS_IPV4 | RTE_ETH_RSS_NONFRAG_IPV4_TCP | RTE_ETH_RSS_NONFRAG_IPV4_UDP.
            types: (1 << 2) | (1 << 4) | (1 << 5),
        },
    };
    FlowRule {
        attr: FlowAttr::ingress(),
        pattern: vec![
            FlowItem::Eth {
                spec: None,
                mask: None,
            },
            FlowItem::Ipv4 {
                spec: Some(Ipv4Match {
                    dst,
                    proto,
                    ..Default::default()
                }),
                mask: Some(Ipv4Match {
                    dst: dst_mask,
                    proto: 0xff,
                    ..Default::default()
                }),
            },
            l4,
        ],
        actions: vec![action],
    }
}

fn fallback(port: &mut Port, isolation: &Isolation, why: String) -> Installed {
    // Isolated with no rules, the port would receive nothing: undo isolation. mlx5 only
    // changes it on a stopped port, so retry around a stop/start.
    let undo = match isolation {
        Isolation::Unavailable(_) => String::new(),
        Isolation::On => match port.flow_isolate(false) {
            Ok(()) => "; isolation turned off again".to_string(),
            Err(first) if port.is_started() => {
                let r = port
                    .stop()
                    .and_then(|()| port.flow_isolate(false))
                    .and_then(|()| port.start());
                match r {
                    Ok(()) => "; isolation turned off again (port restarted)".to_string(),
                    Err(e) => format!(
                        "; ISOLATION IS STILL ON ({first}; after a stop: {e}): reconfigure the port without isolation or it receives nothing"
                    ),
                }
            }
            Err(e) => format!(
                "; ISOLATION IS STILL ON ({e}): reconfigure the port without isolation or it receives nothing"
            ),
        },
    };
    let message = format!(
        "bifurcation: port {}: no hardware steering ({why}){undo}; falling back to software: \
         luna classifies every frame in its poll loop and hands the kernel's to the exception interface",
        port.name()
    );
    eprintln!("{message}");
    Installed::Software { message }
}

/// Installs `rules` on a started port (all or nothing; see the module docs). On
/// fallback, isolation set by [`isolate`] is turned off again so that the port receives
/// every frame for the software classifier.
pub fn install(port: &mut Port, isolation: &Isolation, rules: &RuleSet) -> Installed {
    if let Isolation::Unavailable(why) = isolation {
        return fallback(port, isolation, why.clone());
    }
    let flows: Vec<FlowRule> = rules.rules.iter().map(flow_rule).collect();
    for (i, (f, r)) in flows.iter().zip(&rules.rules).enumerate() {
        if let Err(e) = port.flow_validate(f) {
            let why = format!(
                "rte_flow_validate refused rule {i} ({} dst port {}): {e}",
                r.proto, r.port
            );
            return fallback(port, isolation, why);
        }
    }
    let mut made = Vec::with_capacity(flows.len());
    for (i, (f, r)) in flows.iter().zip(&rules.rules).enumerate() {
        match port.flow_create(f) {
            Ok(h) => made.push(h),
            Err(e) => {
                drop(made);
                let why = format!(
                    "rte_flow_create failed for rule {i} ({} dst port {}): {e}",
                    r.proto, r.port
                );
                return fallback(port, isolation, why);
            }
        }
    }
    Installed::Hardware { flows: made }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{Origin, PortMask};

    #[test]
    fn rule_translation() {
        let r = PortRule {
            proto: L4::Tcp,
            dst_ip: Some(Ipv4Addr::new(198, 18, 0, 1)),
            port: PortMask {
                value: 61440,
                mask: 0xff00,
            },
            target: Target::Queue(3),
            origin: Origin::Listener,
        };
        let f = flow_rule(&r);
        assert!(f.attr.ingress);
        assert_eq!(f.actions, vec![FlowAction::Queue(3)]);
        assert_eq!(
            f.pattern[2],
            FlowItem::Tcp {
                spec: Some(TcpMatch {
                    dst_port: 61440,
                    ..Default::default()
                }),
                mask: Some(TcpMatch {
                    dst_port: 0xff00,
                    ..Default::default()
                }),
            }
        );
        match f.pattern[1] {
            FlowItem::Ipv4 {
                spec: Some(s),
                mask: Some(m),
            } => {
                assert_eq!((s.dst, s.proto), (Ipv4Addr::new(198, 18, 0, 1), 6));
                assert_eq!((m.dst, m.proto), (Ipv4Addr::BROADCAST, 0xff));
            }
            ref other => panic!("{other:?}"),
        }
        let u = PortRule {
            proto: L4::Udp,
            dst_ip: None,
            target: Target::Rss(vec![0, 1]),
            ..r
        };
        let f = flow_rule(&u);
        assert!(matches!(&f.actions[0], FlowAction::Rss { queues, .. } if queues == &[0, 1]));
        assert!(matches!(f.pattern[2], FlowItem::Udp { .. }));
    }
}
