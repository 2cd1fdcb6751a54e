//! ICMP lines: `< icmp unreachable frag_needed mtu N [start:end(len)]` and the other
//! destination-unreachable, time-exceeded, source-quench, redirect and parameter-problem
//! messages are injected quoting luna's segment (its IPv4 header and first 8 TCP octets);
//! luna acts on frag-needed (RFC 1191 PMTU) and must ignore or survive the rest.
//! `> icmp` lines skip the script: luna sends no ICMP errors for TCP.

use super::{Runner, ScriptError};
use crate::packetdrill::script::{Direction, IcmpSpec, Result};
use luna_stack::wire::{
    ChecksumCaps, EtherType, EthernetFrame, EthernetRepr, Icmpv4Message, Icmpv4Packet, IpProtocol,
    Ipv4Packet, Ipv4Repr,
};
use zbuf::Zbuf;

const UNREACHABLE_CODES: &[&str] = &[
    "net_unreachable",
    "host_unreachable",
    "protocol_unreachable",
    "port_unreachable",
    "frag_needed",
    "source_route_failed",
    "net_unknown",
    "host_unknown",
    "source_host_isolated",
    "net_prohibited",
    "host_prohibited",
    "net_unreachable_for_tos",
    "host_unreachable_for_tos",
    "packet_filtered",
    "precedence_violation",
    "precedence_cutoff",
];

/// (type, code) of an ICMP line's names.
fn type_code(kind: &str, code: &str) -> std::result::Result<(u8, u8), String> {
    let pos = |list: &[&str]| list.iter().position(|c| *c == code).map(|i| i as u8);
    let r = match kind {
        "unreachable" => (3, pos(UNREACHABLE_CODES)),
        "source_quench" => (4, code.is_empty().then_some(0)),
        "redirect" => (
            5,
            match code {
                "" | "net" => Some(0),
                "host" => Some(1),
                _ => None,
            },
        ),
        "time_exceeded" => (
            11,
            match code {
                "ttl_exceeded_in_transit" => Some(0),
                "frag_reass_exceeded" => Some(1),
                _ => None,
            },
        ),
        "parameter_problem" => (12, code.strip_prefix("code_").and_then(|n| n.parse().ok())),
        _ => return Err(format!("unknown ICMP type `{kind}`")),
    };
    match r {
        (t, Some(c)) => Ok((t, c)),
        (_, None) => Err(format!("unknown ICMP code `{code}` for `{kind}`")),
    }
}

impl Runner {
    pub(super) fn icmp(&mut self, spec: &IcmpSpec) -> Result<()> {
        if spec.dir == Direction::Outbound {
            return Err(ScriptError::skip(
                self.line,
                "`> icmp` lines: luna sends no ICMP errors for TCP",
            ));
        }
        let (ty, code) =
            type_code(&spec.kind, &spec.code).map_err(|e| ScriptError::new(self.line, e))?;
        if ty == 3 && code == 4 && spec.mtu.is_none() {
            return self.err("`icmp unreachable frag_needed` needs `mtu N`");
        }
        let ports = self.default_flow;
        let flow = self.flows.get(&ports).cloned().unwrap_or_default();
        let isn_off = flow.isn_off.unwrap_or(0);
        // The quoted segment: luna's, numbered as the script numbers luna's sequence space;
        // without a quote, the oldest unacknowledged octet.
        let seq = match spec.quote {
            Some((start, _)) => start.wrapping_add(isn_off),
            None => {
                let h = self.fds.values().find_map(|f| match (f.kind, f.flow) {
                    (super::FdKind::Conn(h), Some(fl)) if fl == ports => Some(h),
                    _ => None,
                });
                let stack = self.stack()?;
                h.and_then(|h| stack.connection(h))
                    .map_or(isn_off, |c| c.snd_una().0)
            }
        };
        let quoted_len = spec.quote.map_or(0, |(a, b)| b.wrapping_sub(a)) as usize;
        let inner_ip = Ipv4Repr::new(
            self.ends.luna_ip,
            self.ends.peer_ip,
            IpProtocol::Tcp,
            20 + quoted_len.min(1400),
        );
        let icmp_len = 8 + 20 + 8;
        let total = 14 + 20 + icmp_len;
        let mut buf = vec![0u8; total];
        EthernetRepr {
            src_addr: self.ends.peer_mac,
            dst_addr: self.ends.luna_mac,
            ethertype: EtherType::Ipv4,
        }
        .emit(&mut EthernetFrame::new_unchecked(&mut buf[..]));
        Ipv4Repr::new(
            self.ends.peer_ip,
            self.ends.luna_ip,
            IpProtocol::Icmp,
            icmp_len,
        )
        .emit(
            &mut Ipv4Packet::new_unchecked(&mut buf[14..34]),
            &ChecksumCaps::software(),
        );
        inner_ip.emit(
            &mut Ipv4Packet::new_unchecked(&mut buf[42..62]),
            &ChecksumCaps::software(),
        );
        buf[62..64].copy_from_slice(&ports.0.to_be_bytes());
        buf[64..66].copy_from_slice(&ports.1.to_be_bytes());
        buf[66..70].copy_from_slice(&seq.to_be_bytes());
        let mut icmp = Icmpv4Packet::new_unchecked(&mut buf[34..]);
        icmp.set_msg_type(Icmpv4Message::from(ty));
        icmp.set_msg_code(code);
        icmp.set_rest_of_header(0);
        if let Some(mtu) = spec.mtu {
            icmp.set_next_hop_mtu(mtu);
        }
        icmp.fill_checksum();
        if self.trace {
            eprintln!(
                "line {:>3}: < icmp {} {} (type {ty} code {code}) seq {seq}",
                self.line, spec.kind, spec.code
            );
        }
        let now = self.now;
        self.stack()?.handle_frame(now, Zbuf::from_vec(buf));
        self.out.frames_in += 1;
        self.drain()
    }
}
