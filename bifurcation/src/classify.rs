//! The software classifier: one frame in, luna's or the kernel's out (sans-IO, zero
//! copy: it reads the headers in place and never allocates).
//!
//! r2c's poll loop calls [`Classifier::classify`] on every received frame when the NIC
//! cannot steer in hardware (the exception path): [`Verdict::Luna`] frames go to the
//! stack, [`Verdict::Kernel`] frames to the exception interface, [`Verdict::Drop`]
//! frames are freed. Every verdict is counted by reason in [`Counters`].
//!
//! Malformed frames. A frame too short for an Ethernet header, an IPv4 header that is
//! inconsistent (version, IHL, total length beyond the frame) or a TCP/UDP header cut
//! short is **dropped and counted**, not handed to the kernel: the kernel would discard
//! it too (it validates the same fields), and forwarding garbage would let a flood of it
//! fill the exception queue that the kernel's ssh and ARP depend on. Well-formed frames
//! luna does not own go to the kernel — including IPv4 fragments after the first, which
//! carry no ports. A first fragment to one of luna's ports is luna's (its stack drops it:
//! luna does not reassemble); the kernel would reassemble it and reset luna's connection. IP options are skipped by IHL
//! (luna-stack does the same), so they do not change the verdict. Checksums are not
//! checked here: the stack (or the NIC's offload) does that.
//!
//! ICMP errors follow the flow they quote: one about a packet luna sent (its source port
//! is luna's) is luna's — PMTU discovery and hard errors — every other ICMP message is the
//! kernel's. The NIC rules of [`crate::rules`] cannot look inside ICMP, so with hardware
//! steering the kernel gets every ICMP message.

use crate::model::{PortOwner, TrafficModel, L4};
use core::fmt;
use core::net::Ipv4Addr;

/// Which of luna's flows a frame belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LunaTarget {
    /// A TCP port of a client thread's share: its owner and queue.
    Client {
        /// Application index in the plan.
        app: usize,
        /// Thread within the application.
        thread: u16,
        /// The thread's receive queue.
        queue: u16,
    },
    /// A listening port (any of luna's threads may own the connection).
    Listener {
        /// Protocol.
        proto: L4,
        /// Destination port.
        port: u16,
    },
}

macro_rules! reasons {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident => $s:literal,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $v,)* }
        impl $name {
            /// Every reason, in counter order.
            pub const ALL: &'static [$name] = &[$($name::$v,)*];
            /// Short name for counters and logs.
            pub const fn name(self) -> &'static str {
                match self { $($name::$v => $s,)* }
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

reasons! {
    /// Why a frame belongs to the kernel.
    KernelReason {
        /// ARP.
        Arp => "arp",
        /// IPv6.
        Ipv6 => "ipv6",
        /// 802.1Q / 802.1ad tagged.
        Vlan => "vlan",
        /// Any other EtherType (LLDP, ...).
        OtherEtherType => "other_ethertype",
        /// IPv4 to another address than the model's.
        OtherAddress => "other_address",
        /// IPv4 to a broadcast or multicast address.
        BroadcastOrMulticast => "broadcast_multicast",
        /// An IPv4 fragment without ports (offset > 0), or the first of a datagram to a
        /// port luna does not own (luna never fragments and does not reassemble).
        Fragment => "fragment",
        /// ICMP: queries, redirects, and errors that do not quote one of luna's flows.
        Icmp => "icmp",
        /// Another IP protocol (IGMP, SCTP, ...).
        OtherIpProto => "other_ip_proto",
        /// TCP to a port luna does not own (ssh, the kernel's servers and clients).
        TcpPort => "tcp_port",
        /// UDP to a port luna does not own.
        UdpPort => "udp_port",
    }
}

reasons! {
    /// Why a frame is dropped.
    DropReason {
        /// Shorter than an Ethernet header.
        Runt => "runt",
        /// IPv4 header inconsistent or cut short.
        BadIpv4 => "bad_ipv4",
        /// TCP or UDP header cut short.
        BadL4 => "bad_l4",
    }
}

/// The classifier's answer for one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Luna's: to the stack.
    Luna(LunaTarget),
    /// The kernel's: to the exception interface (or left to the kernel netdev).
    Kernel(KernelReason),
    /// Malformed: freed and counted.
    Drop(DropReason),
}

const ETH_LEN: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_QINQ: u16 = 0x88a8;

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Classifies one Ethernet frame against `model` (pure; see [`Classifier`] for counts).
pub fn classify(model: &TrafficModel, frame: &[u8]) -> Verdict {
    use KernelReason as K;
    if frame.len() < ETH_LEN {
        return Verdict::Drop(DropReason::Runt);
    }
    match be16(frame, 12) {
        ETHERTYPE_IPV4 => {}
        ETHERTYPE_ARP => return Verdict::Kernel(K::Arp),
        ETHERTYPE_IPV6 => return Verdict::Kernel(K::Ipv6),
        ETHERTYPE_VLAN | ETHERTYPE_QINQ => return Verdict::Kernel(K::Vlan),
        _ => return Verdict::Kernel(K::OtherEtherType),
    }
    let ip = &frame[ETH_LEN..];
    // RFC 791 §3.1: version 4, IHL >= 5 words, Total Length covers header and data; the
    // frame may be longer (Ethernet padding) but not shorter.
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return Verdict::Drop(DropReason::BadIpv4);
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(be16(ip, 2));
    if ihl < 20 || total < ihl || total > ip.len() {
        return Verdict::Drop(DropReason::BadIpv4);
    }
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    if dst.is_broadcast() || dst.is_multicast() {
        return Verdict::Kernel(K::BroadcastOrMulticast);
    }
    if !model.is_lunas_address(dst) {
        return Verdict::Kernel(K::OtherAddress);
    }
    // RFC 791 §3.2: a fragment has MF set or a non-zero offset. Only the first (offset 0)
    // carries the ports; later ones are the kernel's (see `first_fragment_owner`).
    let frag = be16(ip, 6) & 0x3fff;
    if frag & 0x1fff != 0 {
        return Verdict::Kernel(K::Fragment);
    }
    let l4 = &ip[ihl..total];
    if frag != 0 {
        return match first_fragment_owner(model, ip[9], l4) {
            Some(t) => Verdict::Luna(t),
            None => Verdict::Kernel(K::Fragment),
        };
    }
    let (proto, min, reason) = match ip[9] {
        6 => (L4::Tcp, 20, K::TcpPort),
        17 => (L4::Udp, 8, K::UdpPort),
        1 => {
            return match icmp_error_owner(model, l4) {
                Some(t) => Verdict::Luna(t),
                None => Verdict::Kernel(K::Icmp),
            }
        }
        _ => return Verdict::Kernel(K::OtherIpProto),
    };
    if l4.len() < min {
        return Verdict::Drop(DropReason::BadL4);
    }
    if proto == L4::Tcp && usize::from(l4[12] >> 4) * 4 < 20 {
        // RFC 9293 §3.1: Data Offset is at least 5 words.
        return Verdict::Drop(DropReason::BadL4);
    }
    match lunas_port(model, proto, be16(l4, 2)) {
        Some(t) => Verdict::Luna(t),
        None => Verdict::Kernel(reason),
    }
}

/// Where `port` of `proto` goes when it is luna's (a client port's owner or a listener).
fn lunas_port(model: &TrafficModel, proto: L4, port: u16) -> Option<LunaTarget> {
    match model.owner(proto, port) {
        PortOwner::Client { app, thread, queue } => Some(LunaTarget::Client { app, thread, queue }),
        PortOwner::Listener => Some(LunaTarget::Listener { proto, port }),
        PortOwner::Kernel => None,
    }
}

/// TCP or UDP by IP protocol number; `None` for anything else.
fn tcp_or_udp(ip_proto: u8) -> Option<L4> {
    match ip_proto {
        6 => Some(L4::Tcp),
        17 => Some(L4::Udp),
        _ => None,
    }
}

/// The owner of a first fragment (offset 0, MF set) when its destination port is luna's.
///
/// The datagram is then luna's: luna's stack counts and drops the fragment (it does not
/// reassemble; its TCP sets DF). Handed to the kernel, the kernel would reassemble it,
/// find no socket on the port and answer luna's peer with a RST (TCP) or a port
/// unreachable (UDP). Later fragments carry no ports: they go to the kernel, which,
/// without the first, reassembles nothing and discards them when its timer expires.
fn first_fragment_owner(model: &TrafficModel, ip_proto: u8, l4: &[u8]) -> Option<LunaTarget> {
    let proto = tcp_or_udp(ip_proto)?;
    if l4.len() < 4 {
        return None;
    }
    lunas_port(model, proto, be16(l4, 2))
}

/// The owner of an ICMP error's quoted flow, when it is luna's.
///
/// An ICMP error — destination unreachable (3, with fragmentation needed for PMTU
/// discovery), source quench (4), time exceeded (11), parameter problem (12) — quotes the
/// IPv4 header and the first 8 bytes of the packet that caused it (RFC 792, RFC 1122
/// §3.2.2). When that packet was luna's (sent from the model's address, or any address
/// when `ip` is unset, by a TCP or UDP port luna owns as a *source*), the error is
/// luna's: the kernel has no socket for it and would drop it, and luna's PMTU discovery
/// (RFC 1191) and hard-error handling (RFC 1122 §4.2.3.9) would never see it. Everything
/// else — queries, redirects, errors about the kernel's flows or that quote too little
/// — is the kernel's.
fn icmp_error_owner(model: &TrafficModel, icmp: &[u8]) -> Option<LunaTarget> {
    if icmp.len() < 8 || !matches!(icmp[0], 3 | 4 | 11 | 12) {
        return None;
    }
    let q = &icmp[8..];
    if q.len() < 20 || q[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(q[0] & 0x0f) * 4;
    // The quote must hold the ports, and only a first fragment (offset 0) carries them.
    if ihl < 20 || q.len() < ihl + 4 || be16(q, 6) & 0x1fff != 0 {
        return None;
    }
    let src = Ipv4Addr::new(q[12], q[13], q[14], q[15]);
    if !model.is_lunas_address(src) {
        return None;
    }
    lunas_port(model, tcp_or_udp(q[9])?, be16(q, ihl))
}

/// Counts of verdicts by reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Frames for luna's client ports.
    pub luna_client: u64,
    /// Frames for luna's listening ports.
    pub luna_listener: u64,
    /// Luna's frames that carried IPv4 options (informational; they are still luna's).
    pub luna_ip_options: u64,
    /// Luna's frames that were ICMP errors quoting its flows (informational; also
    /// counted as client or listener frames).
    pub luna_icmp_errors: u64,
    kernel: [u64; KernelReason::ALL.len()],
    drop: [u64; DropReason::ALL.len()],
}

impl Counters {
    /// Frames handed to the kernel for `r`.
    pub fn kernel(&self, r: KernelReason) -> u64 {
        self.kernel[r as usize]
    }

    /// Frames dropped for `r`.
    pub fn dropped(&self, r: DropReason) -> u64 {
        self.drop[r as usize]
    }

    /// All frames handed to the kernel.
    pub fn kernel_total(&self) -> u64 {
        self.kernel.iter().sum()
    }

    /// All dropped frames.
    pub fn drop_total(&self) -> u64 {
        self.drop.iter().sum()
    }

    /// All luna frames.
    pub fn luna_total(&self) -> u64 {
        self.luna_client + self.luna_listener
    }

    /// Every counter as (name, value), for stats output (`luna.client`, `kernel.arp`, ...).
    pub fn iter(&self) -> impl Iterator<Item = (String, u64)> + '_ {
        [
            ("luna.client".to_string(), self.luna_client),
            ("luna.listener".to_string(), self.luna_listener),
            ("luna.ip_options".to_string(), self.luna_ip_options),
            ("luna.icmp_errors".to_string(), self.luna_icmp_errors),
        ]
        .into_iter()
        .chain(
            KernelReason::ALL
                .iter()
                .map(|&r| (format!("kernel.{}", r.name()), self.kernel(r))),
        )
        .chain(
            DropReason::ALL
                .iter()
                .map(|&r| (format!("drop.{}", r.name()), self.dropped(r))),
        )
    }
}

/// A per-core classifier: the model plus its counters.
#[derive(Debug, Clone)]
pub struct Classifier {
    model: TrafficModel,
    counters: Counters,
}

impl Classifier {
    /// A classifier over `model`.
    pub fn new(model: TrafficModel) -> Self {
        Classifier {
            model,
            counters: Counters::default(),
        }
    }

    /// The model.
    pub fn model(&self) -> &TrafficModel {
        &self.model
    }

    /// The model, to follow the stack's addresses ([`TrafficModel::add_address`]).
    pub fn model_mut(&mut self) -> &mut TrafficModel {
        &mut self.model
    }

    /// Classifies `frame` and counts the verdict.
    pub fn classify(&mut self, frame: &[u8]) -> Verdict {
        let v = classify(&self.model, frame);
        match v {
            Verdict::Luna(t) => {
                match t {
                    LunaTarget::Client { .. } => self.counters.luna_client += 1,
                    LunaTarget::Listener { .. } => self.counters.luna_listener += 1,
                }
                // Only reached when the IPv4 header was checked: byte 14 is VER_IHL.
                if frame[ETH_LEN] & 0x0f > 5 {
                    self.counters.luna_ip_options += 1;
                }
                if frame[ETH_LEN + 9] == 1 {
                    self.counters.luna_icmp_errors += 1;
                }
            }
            Verdict::Kernel(r) => self.counters.kernel[r as usize] += 1,
            Verdict::Drop(r) => self.counters.drop[r as usize] += 1,
        }
        v
    }

    /// The counters so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::{KernelPorts, TrafficConfig};

    pub(crate) fn model() -> TrafficModel {
        TrafficConfig::from_toml(
            r#"
            listen_tcp = [7000]
            listen_udp = [7001]
            ip = "198.18.0.1"
            apps = [{ name = "ebs", threads = 12 }, { name = "oss", threads = 6 }]
            "#,
        )
        .unwrap()
        .validate(&KernelPorts::linux_default())
        .unwrap()
    }

    /// Ethernet + IPv4 (+ options of `opt_words` words) + an L4 header of `l4_len` bytes
    /// whose destination port is `dport`.
    pub(crate) fn ipv4(
        proto: u8,
        dst: [u8; 4],
        dport: u16,
        opt_words: u8,
        l4_len: usize,
    ) -> Vec<u8> {
        let ihl = 20 + usize::from(opt_words) * 4;
        let mut f = vec![0u8; 14 + ihl + l4_len];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip = &mut f[14..];
        ip[0] = 0x40 | (5 + opt_words);
        ip[2..4].copy_from_slice(&((ihl + l4_len) as u16).to_be_bytes());
        ip[6] = 0x40; // DF
        ip[8] = 64;
        ip[9] = proto;
        ip[12..16].copy_from_slice(&[198, 18, 0, 2]);
        ip[16..20].copy_from_slice(&dst);
        let l4 = &mut ip[ihl..];
        if l4.len() >= 4 {
            l4[0..2].copy_from_slice(&40000u16.to_be_bytes());
            l4[2..4].copy_from_slice(&dport.to_be_bytes());
        }
        if proto == 6 && l4.len() >= 13 {
            l4[12] = 5 << 4;
        }
        f
    }

    const ME: [u8; 4] = [198, 18, 0, 1];

    #[test]
    fn luna_flows() {
        let m = model();
        assert_eq!(
            classify(&m, &ipv4(6, ME, 7000, 0, 20)),
            Verdict::Luna(LunaTarget::Listener {
                proto: L4::Tcp,
                port: 7000
            })
        );
        assert_eq!(
            classify(&m, &ipv4(17, ME, 7001, 0, 8)),
            Verdict::Luna(LunaTarget::Listener {
                proto: L4::Udp,
                port: 7001
            })
        );
        assert!(matches!(
            classify(&m, &ipv4(6, ME, 61440, 0, 20)),
            Verdict::Luna(LunaTarget::Client {
                app: 0,
                thread: 0,
                queue: 0
            })
        ));
        assert!(matches!(
            classify(&m, &ipv4(6, ME, 65535, 2, 20)),
            Verdict::Luna(LunaTarget::Client {
                app: 1,
                thread: 5,
                queue: 17
            })
        ));
    }

    #[test]
    fn kernel_flows() {
        use KernelReason as K;
        let m = model();
        let k = |f: &[u8]| classify(&m, f);
        assert_eq!(k(&ipv4(6, ME, 22, 0, 20)), Verdict::Kernel(K::TcpPort));
        assert_eq!(k(&ipv4(17, ME, 61440, 0, 8)), Verdict::Kernel(K::UdpPort));
        assert_eq!(k(&ipv4(1, ME, 0, 0, 8)), Verdict::Kernel(K::Icmp));
        assert_eq!(k(&ipv4(2, ME, 0, 0, 8)), Verdict::Kernel(K::OtherIpProto));
        assert_eq!(
            k(&ipv4(6, [198, 18, 0, 9], 7000, 0, 20)),
            Verdict::Kernel(K::OtherAddress)
        );
        assert_eq!(
            k(&ipv4(17, [255, 255, 255, 255], 7001, 0, 8)),
            Verdict::Kernel(K::BroadcastOrMulticast)
        );
        assert_eq!(
            k(&ipv4(17, [224, 0, 0, 251], 7001, 0, 8)),
            Verdict::Kernel(K::BroadcastOrMulticast)
        );
        let mut frag = ipv4(6, ME, 22, 0, 20);
        frag[14 + 6] = 0x20; // MF
        assert_eq!(k(&frag), Verdict::Kernel(K::Fragment));
        let mut frag = ipv4(6, ME, 7000, 0, 20);
        frag[14 + 6] = 0x00;
        frag[14 + 7] = 0x10; // offset 16 × 8
        assert_eq!(k(&frag), Verdict::Kernel(K::Fragment));
        let mut f = vec![0u8; 60];
        f[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(k(&f), Verdict::Kernel(K::Arp));
        f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        assert_eq!(k(&f), Verdict::Kernel(K::Ipv6));
        f[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
        assert_eq!(k(&f), Verdict::Kernel(K::Vlan));
        f[12..14].copy_from_slice(&0x88ccu16.to_be_bytes());
        assert_eq!(k(&f), Verdict::Kernel(K::OtherEtherType));
    }

    /// The first fragment (offset 0, MF) carries the ports, so it has one owner. For one of
    /// luna's ports that is luna (whose stack counts and drops it: luna does not
    /// reassemble); given to the kernel, the kernel would reassemble the datagram, find no
    /// socket and answer luna's peer with a RST (TCP) or a port unreachable (UDP). Later
    /// fragments carry no ports and stay the kernel's (without the first it reassembles
    /// nothing and says nothing).
    #[test]
    fn the_first_fragment_of_a_luna_flow_is_lunas() {
        use KernelReason as K;
        let m = model();
        let k = |f: &[u8]| classify(&m, f);
        let first = |proto: u8, port: u16, l4: usize| {
            let mut f = ipv4(proto, ME, port, 0, l4);
            f[14 + 6] = 0x20; // MF, offset 0
            f
        };
        assert_eq!(
            k(&first(6, 61440, 20)),
            Verdict::Luna(LunaTarget::Client {
                app: 0,
                thread: 0,
                queue: 0
            })
        );
        assert_eq!(
            k(&first(6, 7000, 20)),
            Verdict::Luna(LunaTarget::Listener {
                proto: L4::Tcp,
                port: 7000
            })
        );
        assert_eq!(
            k(&first(17, 7001, 8)),
            Verdict::Luna(LunaTarget::Listener {
                proto: L4::Udp,
                port: 7001
            })
        );
        // The kernel's ports, a later fragment, a first fragment too short for ports.
        assert_eq!(k(&first(6, 22, 20)), Verdict::Kernel(K::Fragment));
        assert_eq!(k(&first(17, 61440, 8)), Verdict::Kernel(K::Fragment));
        let mut later = ipv4(6, ME, 61440, 0, 20);
        later[14 + 6] = 0x20;
        later[14 + 7] = 0x10;
        assert_eq!(k(&later), Verdict::Kernel(K::Fragment));
        assert_eq!(k(&first(6, 61440, 3)), Verdict::Kernel(K::Fragment));
    }

    /// An ICMP error (RFC 792) to `ME` quoting a packet of `proto` that `ME` sent from
    /// `sport` to 198.18.0.2:`dport` (its IPv4 header and 8 bytes of transport header).
    pub(crate) fn icmp_error(icmp_type: u8, proto: u8, sport: u16, dport: u16) -> Vec<u8> {
        let mut quote = vec![0u8; 20 + 8];
        quote[0] = 0x45;
        quote[2..4].copy_from_slice(&1500u16.to_be_bytes());
        quote[6] = 0x40;
        quote[8] = 64;
        quote[9] = proto;
        quote[12..16].copy_from_slice(&ME);
        quote[16..20].copy_from_slice(&[198, 18, 0, 2]);
        quote[20..22].copy_from_slice(&sport.to_be_bytes());
        quote[22..24].copy_from_slice(&dport.to_be_bytes());
        let mut f = ipv4(1, ME, 0, 0, 8 + quote.len());
        let icmp = &mut f[14 + 20..];
        icmp[0] = icmp_type;
        icmp[1] = if icmp_type == 3 { 4 } else { 0 }; // frag needed
        icmp[2..8].fill(0);
        icmp[6..8].copy_from_slice(&1400u16.to_be_bytes());
        icmp[8..].copy_from_slice(&quote);
        f
    }

    /// ICMP errors quoting one of luna's flows are luna's (its PMTU discovery and hard
    /// errors, RFC 1122 §4.2.3.9, RFC 1191); the kernel has no socket for them. Those
    /// quoting the kernel's flows, and ICMP queries, stay the kernel's.
    #[test]
    fn icmp_errors_go_to_the_owner_of_the_quoted_flow() {
        use KernelReason as K;
        let m = model();
        let k = |f: &[u8]| classify(&m, f);
        // Frag needed quoting luna's client connection from 61440 and from 65535.
        assert_eq!(
            k(&icmp_error(3, 6, 61440, 80)),
            Verdict::Luna(LunaTarget::Client {
                app: 0,
                thread: 0,
                queue: 0
            })
        );
        assert!(matches!(
            k(&icmp_error(3, 6, 65535, 80)),
            Verdict::Luna(LunaTarget::Client { app: 1, .. })
        ));
        // Port unreachable and time exceeded quoting luna's listener's segments.
        for t in [3, 11, 12] {
            assert_eq!(
                k(&icmp_error(t, 6, 7000, 40000)),
                Verdict::Luna(LunaTarget::Listener {
                    proto: L4::Tcp,
                    port: 7000
                }),
                "type {t}"
            );
        }
        assert_eq!(
            k(&icmp_error(3, 17, 7001, 40000)),
            Verdict::Luna(LunaTarget::Listener {
                proto: L4::Udp,
                port: 7001
            })
        );
        // The kernel's: its ssh, its ephemeral ports, UDP from the client range (luna's
        // client range is TCP only), a query, a redirect, a quote from another address.
        assert_eq!(k(&icmp_error(3, 6, 22, 40000)), Verdict::Kernel(K::Icmp));
        assert_eq!(k(&icmp_error(3, 6, 40000, 80)), Verdict::Kernel(K::Icmp));
        assert_eq!(k(&icmp_error(3, 17, 61440, 53)), Verdict::Kernel(K::Icmp));
        assert_eq!(k(&icmp_error(8, 6, 61440, 80)), Verdict::Kernel(K::Icmp));
        assert_eq!(k(&icmp_error(5, 6, 61440, 80)), Verdict::Kernel(K::Icmp));
        let mut other = icmp_error(3, 6, 61440, 80);
        other[14 + 28 + 12..14 + 28 + 16].copy_from_slice(&[198, 18, 0, 9]);
        assert_eq!(k(&other), Verdict::Kernel(K::Icmp));
        // A quote too short for the ports, or of a later fragment, says nothing: kernel.
        let mut short = icmp_error(3, 6, 61440, 80);
        short.truncate(14 + 20 + 8 + 20 + 3);
        short[16..18].copy_from_slice(&(20u16 + 8 + 20 + 3).to_be_bytes());
        assert_eq!(k(&short), Verdict::Kernel(K::Icmp));
        let mut frag = icmp_error(3, 6, 61440, 80);
        frag[14 + 28 + 7] = 0x10;
        assert_eq!(k(&frag), Verdict::Kernel(K::Icmp));
        let mut c = Classifier::new(m.clone());
        c.classify(&icmp_error(3, 6, 61440, 80));
        assert_eq!(c.counters().luna_icmp_errors, 1);
        assert_eq!(c.counters().luna_client, 1);
    }

    #[test]
    fn addresses_added_to_the_model_are_lunas_until_removed() {
        let mut c = Classifier::new(model());
        let extra = [198, 18, 0, 7];
        let other = Verdict::Kernel(KernelReason::OtherAddress);
        assert_eq!(c.classify(&ipv4(6, extra, 7000, 0, 20)), other);
        assert!(c.model_mut().add_address(Ipv4Addr::from(extra)));
        assert!(
            !c.model_mut().add_address(Ipv4Addr::from(ME)),
            "the model's own"
        );
        assert!(matches!(
            c.classify(&ipv4(6, extra, 7000, 0, 20)),
            Verdict::Luna(_)
        ));
        assert_eq!(
            c.classify(&ipv4(6, extra, 22, 0, 20)),
            Verdict::Kernel(KernelReason::TcpPort)
        );
        assert!(c.model_mut().remove_address(Ipv4Addr::from(extra)));
        assert!(!c.model_mut().remove_address(Ipv4Addr::from(ME)));
        assert_eq!(c.classify(&ipv4(6, extra, 7000, 0, 20)), other);
        assert!(matches!(
            c.classify(&ipv4(6, ME, 7000, 0, 20)),
            Verdict::Luna(_)
        ));
    }

    #[test]
    fn malformed_frames_are_dropped_by_reason() {
        use DropReason as D;
        let m = model();
        let k = |f: &[u8]| classify(&m, f);
        assert_eq!(k(&[0u8; 13]), Verdict::Drop(D::Runt));
        let good = ipv4(6, ME, 7000, 0, 20);
        assert_eq!(k(&good[..30]), Verdict::Drop(D::BadIpv4));
        let mut v6 = good.clone();
        v6[14] = 0x65;
        assert_eq!(k(&v6), Verdict::Drop(D::BadIpv4));
        let mut ihl = good.clone();
        ihl[14] = 0x44;
        assert_eq!(k(&ihl), Verdict::Drop(D::BadIpv4));
        let mut long = good.clone();
        long[16..18].copy_from_slice(&100u16.to_be_bytes());
        assert_eq!(k(&long), Verdict::Drop(D::BadIpv4));
        assert_eq!(k(&ipv4(6, ME, 7000, 0, 19)), Verdict::Drop(D::BadL4));
        assert_eq!(k(&ipv4(17, ME, 7001, 0, 7)), Verdict::Drop(D::BadL4));
        let mut doff = good.clone();
        doff[14 + 20 + 12] = 4 << 4;
        assert_eq!(k(&doff), Verdict::Drop(D::BadL4));
        // Ethernet padding beyond Total Length is fine.
        let mut padded = ipv4(6, ME, 7000, 0, 20);
        padded.extend_from_slice(&[0u8; 10]);
        assert!(matches!(k(&padded), Verdict::Luna(_)));
    }

    #[test]
    fn counters_count_every_verdict() {
        let mut c = Classifier::new(model());
        c.classify(&ipv4(6, ME, 7000, 0, 20));
        c.classify(&ipv4(6, ME, 62000, 1, 20));
        c.classify(&ipv4(6, ME, 22, 0, 20));
        c.classify(&ipv4(6, ME, 22, 0, 20));
        c.classify(&[1, 2, 3]);
        let n = c.counters();
        assert_eq!(n.luna_listener, 1);
        assert_eq!(n.luna_client, 1);
        assert_eq!(n.luna_ip_options, 1);
        assert_eq!(n.kernel(KernelReason::TcpPort), 2);
        assert_eq!(n.dropped(DropReason::Runt), 1);
        assert_eq!(n.luna_total() + n.kernel_total() + n.drop_total(), 5);
        let all: Vec<_> = n.iter().collect();
        assert!(all.contains(&("kernel.tcp_port".to_string(), 2)));
        assert_eq!(
            all.len(),
            4 + KernelReason::ALL.len() + DropReason::ALL.len()
        );
    }
}
