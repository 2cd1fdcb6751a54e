//! rte_flow rules from a small Rust description: validate, create, destroy.
//!
//! Supported pattern items: eth, ipv4, tcp, udp (spec + optional mask; a
//! `None` spec matches any packet of that protocol). Actions: queue, rss,
//! drop, passthru. Multi-byte fields are given in host order and converted.
//! [`Port::flow_isolate`] and [`Port::flow_flush`] wrap `rte_flow_isolate` and
//! `rte_flow_flush`.

use std::ffi::CStr;
use std::net::Ipv4Addr;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Result};
use crate::ethdev::{Port, PortShared};
use crate::ffi;
use crate::ffi::rte_flow_action_type as act;
use crate::ffi::rte_flow_item_type as item;

/// Rule attributes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowAttr {
    /// Group.
    pub group: u32,
    /// Priority within the group (lower = first).
    pub priority: u32,
    /// Applies to received traffic.
    pub ingress: bool,
    /// Applies to sent traffic.
    pub egress: bool,
    /// Applies at the switch (transfer) level.
    pub transfer: bool,
}

impl FlowAttr {
    /// Ingress rule in group 0, priority 0.
    pub fn ingress() -> Self {
        FlowAttr {
            ingress: true,
            ..Default::default()
        }
    }
}

/// Ethernet fields to match.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EthMatch {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// EtherType (host order).
    pub ether_type: u16,
}

/// IPv4 fields to match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Match {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// IP protocol number.
    pub proto: u8,
}

impl Default for Ipv4Match {
    fn default() -> Self {
        Ipv4Match {
            src: Ipv4Addr::UNSPECIFIED,
            dst: Ipv4Addr::UNSPECIFIED,
            proto: 0,
        }
    }
}

/// TCP fields to match.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpMatch {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// TCP flags byte.
    pub flags: u8,
}

/// UDP fields to match.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpMatch {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
}

/// One pattern item. `spec: None` matches any header of that protocol;
/// `mask: None` with a spec uses DPDK's default mask for the item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowItem {
    /// Ethernet header.
    Eth {
        /// Values.
        spec: Option<EthMatch>,
        /// Bits that must match.
        mask: Option<EthMatch>,
    },
    /// IPv4 header.
    Ipv4 {
        /// Values.
        spec: Option<Ipv4Match>,
        /// Bits that must match.
        mask: Option<Ipv4Match>,
    },
    /// TCP header.
    Tcp {
        /// Values.
        spec: Option<TcpMatch>,
        /// Bits that must match.
        mask: Option<TcpMatch>,
    },
    /// UDP header.
    Udp {
        /// Values.
        spec: Option<UdpMatch>,
        /// Bits that must match.
        mask: Option<UdpMatch>,
    },
}

/// One action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlowAction {
    /// Deliver to this rx queue.
    Queue(u16),
    /// Spread over these queues by RSS hash of `types` (`RTE_ETH_RSS_*`).
    Rss {
        /// Target queues.
        queues: Vec<u16>,
        /// Hash types.
        types: u64,
    },
    /// Drop.
    Drop,
    /// Continue to the next matching rule / default handling.
    Passthru,
}

/// A rule: attributes, pattern (END is implicit) and actions (END implicit).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlowRule {
    /// Attributes.
    pub attr: FlowAttr,
    /// Pattern items, outermost first.
    pub pattern: Vec<FlowItem>,
    /// Actions.
    pub actions: Vec<FlowAction>,
}

/// Storage the C rule points into (boxed so addresses are stable).
#[allow(dead_code)] // held only to keep the pointed-to memory alive
enum Store {
    Eth(Box<[ffi::rte_flow_item_eth; 2]>),
    Ipv4(Box<[ffi::rte_flow_item_ipv4; 2]>),
    Tcp(Box<[ffi::rte_flow_item_tcp; 2]>),
    Udp(Box<[ffi::rte_flow_item_udp; 2]>),
    Queue(Box<ffi::rte_flow_action_queue>),
    Rss(Box<ffi::rte_flow_action_rss>, Box<[u16]>),
}

struct CRule {
    attr: Box<ffi::rte_flow_attr>,
    items: Vec<ffi::rte_flow_item>,
    actions: Vec<ffi::rte_flow_action>,
    _store: Vec<Store>,
}

fn be16(v: u16) -> u16 {
    v.to_be()
}
fn be32(a: Ipv4Addr) -> u32 {
    u32::from(a).to_be()
}

/// Fills a pair `[spec, mask]` and returns (spec ptr, mask ptr).
fn pair<T, M: Copy>(
    spec: Option<M>,
    mask: Option<M>,
    fill: impl Fn(&mut T, &M),
    store: &mut [T; 2],
) -> (*const std::ffi::c_void, *const std::ffi::c_void) {
    let mut sp = std::ptr::null();
    let mut mp = std::ptr::null();
    if let Some(s) = spec {
        fill(&mut store[0], &s);
        sp = (&store[0] as *const T).cast();
        if let Some(m) = mask {
            fill(&mut store[1], &m);
            mp = (&store[1] as *const T).cast();
        }
    }
    (sp, mp)
}

fn fill_eth(p: &mut ffi::rte_flow_item_eth, v: &EthMatch) {
    // SAFETY: p is a valid item we own; dst/src are 6-byte arrays as the shim reads.
    unsafe {
        ffi::dpdk_sys_flow_item_eth_set(p, v.dst.as_ptr(), v.src.as_ptr(), be16(v.ether_type))
    }
}

fn fill_ipv4(p: &mut ffi::rte_flow_item_ipv4, v: &Ipv4Match) {
    // SAFETY: p is a valid item we own.
    unsafe { ffi::dpdk_sys_flow_item_ipv4_set(p, be32(v.src), be32(v.dst), v.proto) }
}

fn fill_tcp(p: &mut ffi::rte_flow_item_tcp, v: &TcpMatch) {
    // SAFETY: p is a valid item we own.
    unsafe { ffi::dpdk_sys_flow_item_tcp_set(p, be16(v.src_port), be16(v.dst_port), v.flags) }
}

fn fill_udp(p: &mut ffi::rte_flow_item_udp, v: &UdpMatch) {
    // SAFETY: p is a valid item we own.
    unsafe { ffi::dpdk_sys_flow_item_udp_set(p, be16(v.src_port), be16(v.dst_port)) }
}

impl CRule {
    fn build(rule: &FlowRule) -> CRule {
        let mut attr = Box::<ffi::rte_flow_attr>::default();
        let a = &rule.attr;
        // SAFETY: attr points to a valid rte_flow_attr we own.
        unsafe {
            ffi::dpdk_sys_flow_attr_set(
                &mut *attr,
                a.group,
                a.priority,
                a.ingress as i32,
                a.egress as i32,
                a.transfer as i32,
            )
        };
        let mut store = Vec::new();
        let mut items = Vec::new();
        for it in &rule.pattern {
            let (ty, spec, mask) = match *it {
                FlowItem::Eth { spec, mask } => {
                    let mut b = Box::<[ffi::rte_flow_item_eth; 2]>::default();
                    let (s, m) = pair(spec, mask, fill_eth, &mut b);
                    store.push(Store::Eth(b));
                    (item::RTE_FLOW_ITEM_TYPE_ETH, s, m)
                }
                FlowItem::Ipv4 { spec, mask } => {
                    let mut b = Box::<[ffi::rte_flow_item_ipv4; 2]>::default();
                    let (s, m) = pair(spec, mask, fill_ipv4, &mut b);
                    store.push(Store::Ipv4(b));
                    (item::RTE_FLOW_ITEM_TYPE_IPV4, s, m)
                }
                FlowItem::Tcp { spec, mask } => {
                    let mut b = Box::<[ffi::rte_flow_item_tcp; 2]>::default();
                    let (s, m) = pair(spec, mask, fill_tcp, &mut b);
                    store.push(Store::Tcp(b));
                    (item::RTE_FLOW_ITEM_TYPE_TCP, s, m)
                }
                FlowItem::Udp { spec, mask } => {
                    let mut b = Box::<[ffi::rte_flow_item_udp; 2]>::default();
                    let (s, m) = pair(spec, mask, fill_udp, &mut b);
                    store.push(Store::Udp(b));
                    (item::RTE_FLOW_ITEM_TYPE_UDP, s, m)
                }
            };
            items.push(ffi::rte_flow_item {
                type_: ty,
                spec,
                last: std::ptr::null(),
                mask,
            });
        }
        items.push(ffi::rte_flow_item {
            type_: item::RTE_FLOW_ITEM_TYPE_END,
            ..Default::default()
        });

        let mut actions = Vec::new();
        for ac in &rule.actions {
            let (ty, conf): (_, *const std::ffi::c_void) = match ac {
                FlowAction::Queue(q) => {
                    let b = Box::new(ffi::rte_flow_action_queue { index: *q });
                    let p = (&*b as *const ffi::rte_flow_action_queue).cast();
                    store.push(Store::Queue(b));
                    (act::RTE_FLOW_ACTION_TYPE_QUEUE, p)
                }
                FlowAction::Rss { queues, types } => {
                    let qs: Box<[u16]> = queues.clone().into_boxed_slice();
                    let b = Box::new(ffi::rte_flow_action_rss {
                        types: *types,
                        queue_num: qs.len() as u32,
                        queue: qs.as_ptr(),
                        ..Default::default()
                    });
                    let p = (&*b as *const ffi::rte_flow_action_rss).cast();
                    store.push(Store::Rss(b, qs));
                    (act::RTE_FLOW_ACTION_TYPE_RSS, p)
                }
                FlowAction::Drop => (act::RTE_FLOW_ACTION_TYPE_DROP, std::ptr::null()),
                FlowAction::Passthru => (act::RTE_FLOW_ACTION_TYPE_PASSTHRU, std::ptr::null()),
            };
            actions.push(ffi::rte_flow_action { type_: ty, conf });
        }
        actions.push(ffi::rte_flow_action {
            type_: act::RTE_FLOW_ACTION_TYPE_END,
            conf: std::ptr::null(),
        });
        CRule {
            attr,
            items,
            actions,
            _store: store,
        }
    }
}

fn flow_error(step: String, ret: i32, e: &ffi::rte_flow_error) -> Error {
    let msg = if e.message.is_null() {
        "no message".to_owned()
    } else {
        // SAFETY: PMDs set message to a static NUL-terminated string.
        unsafe { CStr::from_ptr(e.message) }
            .to_string_lossy()
            .into_owned()
    };
    let errno = if ret < 0 {
        -ret
    } else {
        crate::error::rte_errno()
    };
    let err = Error::dpdk(ErrorKind::Flow, step, errno);
    let cause = format!("{msg} (error type {}, {})", e.type_, err.cause());
    let fix = if errno == libc::ENOSYS || errno == libc::ENOTSUP {
        "this PMD does not implement rte_flow (or this rule); use a device that does, or steer in software"
    } else {
        "simplify the rule: check Port::info() capabilities and the item/action named above"
    };
    err.with_cause(cause).with_fix(fix)
}

/// A created flow rule; destroyed on drop (or with [`Flow::destroy`] to see errors).
pub struct Flow {
    shared: Arc<PortShared>,
    ptr: Option<NonNull<ffi::rte_flow>>,
}

// SAFETY: the rte_flow handle is an opaque token passed back to the control
// API of its port; it carries no thread affinity.
unsafe impl Send for Flow {}

impl Flow {
    /// Destroys the rule, reporting failure.
    pub fn destroy(mut self) -> Result<()> {
        self.destroy_inner()
    }

    fn destroy_inner(&mut self) -> Result<()> {
        let Some(p) = self.ptr.take() else {
            return Ok(());
        };
        let mut e = ffi::rte_flow_error::default();
        // SAFETY: p was returned by rte_flow_create on this port and is destroyed once.
        let ret = unsafe { ffi::rte_flow_destroy(self.shared.id, p.as_ptr(), &mut e) };
        if ret != 0 {
            return Err(flow_error(
                format!("destroy flow on port {}", self.shared.name),
                ret,
                &e,
            ));
        }
        Ok(())
    }
}

impl Drop for Flow {
    fn drop(&mut self) {
        if let Err(e) = self.destroy_inner() {
            eprintln!("dpdk-sys: {e}");
        }
    }
}

impl Port {
    /// Checks whether the device would accept `rule` (`rte_flow_validate`).
    pub fn flow_validate(&self, rule: &FlowRule) -> Result<()> {
        let c = CRule::build(rule);
        let mut e = ffi::rte_flow_error::default();
        crate::log::clear();
        // SAFETY: valid port; c's arrays are END-terminated and its pointers
        // target boxes alive for the call.
        let ret = unsafe {
            ffi::rte_flow_validate(
                self.id(),
                &*c.attr,
                c.items.as_ptr(),
                c.actions.as_ptr(),
                &mut e,
            )
        };
        if ret != 0 {
            return Err(flow_error(
                format!("validate flow on port {}", self.name()),
                ret,
                &e,
            ));
        }
        Ok(())
    }

    /// Turns flow isolation on or off (`rte_flow_isolate`): when on, the port
    /// receives only what flow rules send to it and everything else stays with
    /// the kernel netdev of a bifurcated driver (mlx5). DPDK requires this before
    /// the port is configured, so call it on a port that is not started.
    pub fn flow_isolate(&self, on: bool) -> Result<()> {
        let mut e = ffi::rte_flow_error::default();
        crate::log::clear();
        // SAFETY: valid port id; `e` is a valid out-parameter for the call.
        let ret = unsafe { ffi::rte_flow_isolate(self.id(), on as i32, &mut e) };
        if ret != 0 {
            return Err(flow_error(
                format!("isolate (set {on}) port {}", self.name()),
                ret,
                &e,
            ));
        }
        Ok(())
    }

    /// Destroys every rule of the port (`rte_flow_flush`), including ones
    /// whose [`Flow`] handles were leaked.
    pub fn flow_flush(&self) -> Result<()> {
        let mut e = ffi::rte_flow_error::default();
        crate::log::clear();
        // SAFETY: valid port id; `e` is a valid out-parameter for the call.
        let ret = unsafe { ffi::rte_flow_flush(self.id(), &mut e) };
        if ret != 0 {
            return Err(flow_error(
                format!("flush flows on port {}", self.name()),
                ret,
                &e,
            ));
        }
        Ok(())
    }

    /// Creates `rule` (`rte_flow_create`).
    pub fn flow_create(&self, rule: &FlowRule) -> Result<Flow> {
        let c = CRule::build(rule);
        let mut e = ffi::rte_flow_error::default();
        crate::log::clear();
        // SAFETY: as in flow_validate; the PMD copies what it keeps.
        let p = unsafe {
            ffi::rte_flow_create(
                self.id(),
                &*c.attr,
                c.items.as_ptr(),
                c.actions.as_ptr(),
                &mut e,
            )
        };
        match NonNull::new(p) {
            Some(p) => Ok(Flow {
                shared: self.shared().clone(),
                ptr: Some(p),
            }),
            None => Err(flow_error(
                format!("create flow on port {}", self.name()),
                0,
                &e,
            )),
        }
    }
}
