//! Frames on the wire: building the script's inbound segments (exact option bytes, correct
//! checksums) and decoding luna's outbound ones with luna-stack's `wire` module.

use super::script::{flag, Opt};
use luna_stack::tcp::SeqNum;
use luna_stack::wire::{
    ChecksumCaps, EtherType, EthernetAddress, EthernetFrame, EthernetRepr, IpProtocol, Ipv4Addr,
    Ipv4Packet, Ipv4Repr, TcpOption, TcpPacket,
};
use std::fmt::Write as _;

const ETH_LEN: usize = 14;
const IP_LEN: usize = 20;

/// Addresses of the two ends of the scripted link.
#[derive(Debug, Clone, Copy)]
pub struct Ends {
    pub luna_mac: EthernetAddress,
    pub peer_mac: EthernetAddress,
    pub luna_ip: Ipv4Addr,
    pub peer_ip: Ipv4Addr,
}

/// The header fields of one segment, with concrete (wire) numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub win: u16,
    pub urg: u16,
    /// Options in wire order (NOPs included).
    pub options: Vec<Opt>,
    pub payload: Vec<u8>,
}

fn option_bytes(opts: &[Opt]) -> Vec<u8> {
    let mut b = Vec::new();
    for o in opts {
        match o {
            Opt::Nop => b.push(1),
            Opt::Eol => b.push(0),
            Opt::Mss(v) => {
                b.extend_from_slice(&[2, 4]);
                b.extend_from_slice(&v.to_be_bytes());
            }
            Opt::WScale(v) => b.extend_from_slice(&[3, 3, *v]),
            Opt::SackOk => b.extend_from_slice(&[4, 2]),
            Opt::Sack(blocks) => {
                b.extend_from_slice(&[5, (2 + 8 * blocks.len()) as u8]);
                for (l, r) in blocks {
                    b.extend_from_slice(&l.to_be_bytes());
                    b.extend_from_slice(&r.to_be_bytes());
                }
            }
            Opt::Ts { val, ecr } => {
                b.extend_from_slice(&[8, 10]);
                b.extend_from_slice(&val.to_be_bytes());
                b.extend_from_slice(&ecr.to_be_bytes());
            }
            Opt::Unknown(kind, len) => {
                b.push(*kind);
                b.push(*len as u8);
                b.extend(std::iter::repeat_n(0, len.saturating_sub(2)));
            }
        }
    }
    b
}

/// An Ethernet/IPv4/TCP frame from the peer to luna, options laid out exactly as given.
pub fn build_inbound(ends: &Ends, seg: &Segment) -> Result<Vec<u8>, String> {
    let opts = option_bytes(&seg.options);
    if opts.len() % 4 != 0 {
        return Err(format!(
            "the options take {} bytes, not a multiple of 4: pad them with nop",
            opts.len()
        ));
    }
    if opts.len() > 40 {
        return Err(format!(
            "the options take {} bytes; a TCP header holds 40",
            opts.len()
        ));
    }
    let tcp_hlen = 20 + opts.len();
    let tcp_len = tcp_hlen + seg.payload.len();
    let mut buf = vec![0u8; ETH_LEN + IP_LEN + tcp_len];
    EthernetRepr {
        src_addr: ends.peer_mac,
        dst_addr: ends.luna_mac,
        ethertype: EtherType::Ipv4,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut buf[..]));
    let ip = Ipv4Repr::new(ends.peer_ip, ends.luna_ip, IpProtocol::Tcp, tcp_len);
    ip.emit(
        &mut Ipv4Packet::new_unchecked(&mut buf[ETH_LEN..ETH_LEN + IP_LEN]),
        &ChecksumCaps::software(),
    );
    let tcp_buf = &mut buf[ETH_LEN + IP_LEN..];
    tcp_buf[tcp_hlen..].copy_from_slice(&seg.payload);
    let mut tcp = TcpPacket::new_unchecked(tcp_buf);
    tcp.set_src_port(seg.src_port);
    tcp.set_dst_port(seg.dst_port);
    tcp.set_seq_number(SeqNum(seg.seq));
    tcp.set_ack_number(SeqNum(seg.ack));
    tcp.set_header_len(tcp_hlen);
    tcp.set_flags(luna_stack::wire::TcpFlags(seg.flags));
    tcp.set_window_len(seg.win);
    tcp.set_urgent_at(seg.urg);
    tcp.options_mut()[..opts.len()].copy_from_slice(&opts);
    tcp.fill_checksum(ends.peer_ip, ends.luna_ip);
    Ok(buf)
}

/// Decode a frame luna sent. Anything but a well-formed, correctly checksummed IPv4/TCP
/// segment from luna to the peer is an error describing the frame.
pub fn decode_outbound(ends: &Ends, frame: &[u8]) -> Result<Segment, String> {
    let eth = EthernetFrame::new_checked(frame).map_err(|_| "a truncated Ethernet frame")?;
    let eth = EthernetRepr::parse(&eth).map_err(|_| "a malformed Ethernet frame")?;
    match eth.ethertype {
        EtherType::Ipv4 => {}
        EtherType::Arp => return Err("an ARP frame".into()),
        other => return Err(format!("a frame of ethertype {other:?}")),
    }
    if eth.src_addr != ends.luna_mac || eth.dst_addr != ends.peer_mac {
        return Err(format!(
            "a frame with MACs {} -> {} (expected luna -> peer)",
            mac(&eth.src_addr),
            mac(&eth.dst_addr)
        ));
    }
    let ipp = Ipv4Packet::new_checked(&frame[ETH_LEN..]).map_err(|_| "a truncated IPv4 packet")?;
    let ip = Ipv4Repr::parse(&ipp, &ChecksumCaps::software())
        .map_err(|_| "an IPv4 packet with a bad header or checksum")?;
    if ip.protocol != IpProtocol::Tcp {
        return Err(format!("an IPv4 packet of protocol {:?}", ip.protocol));
    }
    if ip.src_addr != ends.luna_ip || ip.dst_addr != ends.peer_ip {
        return Err(format!("an IPv4 packet {} -> {}", ip.src_addr, ip.dst_addr));
    }
    if ip.is_fragment() {
        return Err("an IPv4 fragment".into());
    }
    let l4 = ETH_LEN + ipp.header_len();
    let seg = &frame[l4..l4 + ip.payload_len];
    let tcp = TcpPacket::new_checked(seg).map_err(|_| "a truncated TCP segment")?;
    if !tcp.verify_checksum(ip.src_addr, ip.dst_addr) {
        return Err("a TCP segment with a bad checksum".into());
    }
    let mut options = Vec::new();
    for o in tcp.option_iter() {
        options.push(
            match o.map_err(|_| "a TCP segment with malformed options")? {
                TcpOption::EndOfList => Opt::Eol,
                TcpOption::NoOperation => Opt::Nop,
                TcpOption::MaxSegmentSize(v) => Opt::Mss(v),
                TcpOption::WindowScale(v) => Opt::WScale(v),
                TcpOption::SackPermitted => Opt::SackOk,
                TcpOption::Sack(b) => {
                    Opt::Sack(b.as_slice().iter().map(|(l, r)| (l.0, r.0)).collect())
                }
                TcpOption::Timestamps(t) => Opt::Ts {
                    val: t.tsval,
                    ecr: t.tsecr,
                },
                TcpOption::Unknown { kind, data } => Opt::Unknown(kind, data.len() + 2),
            },
        );
    }
    Ok(Segment {
        src_port: tcp.src_port(),
        dst_port: tcp.dst_port(),
        seq: tcp.seq_number().0,
        ack: tcp.ack_number().0,
        flags: tcp.flags().0,
        win: tcp.window_len(),
        urg: tcp.urgent_at(),
        options,
        payload: tcp.payload().to_vec(),
    })
}

fn mac(m: &EthernetAddress) -> String {
    m.as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Flags in packetdrill's letters (`S.`, `P.`, `F.`...).
pub fn flags_str(f: u8) -> String {
    let mut s = String::new();
    for (bit, c) in [
        (flag::FIN, 'F'),
        (flag::SYN, 'S'),
        (flag::RST, 'R'),
        (flag::PSH, 'P'),
        (flag::ACK, '.'),
        (flag::URG, 'U'),
        (flag::ECE, 'E'),
        (flag::CWR, 'W'),
    ] {
        if f & bit != 0 {
            s.push(c);
        }
    }
    if s.is_empty() {
        s.push('-');
    }
    s
}

/// A packet line as packetdrill prints it, from already script-relative numbers.
#[allow(clippy::too_many_arguments)]
pub fn describe(
    flags: u8,
    seq: u32,
    len: u32,
    ack: Option<u32>,
    win: Option<u16>,
    options: Option<&[Opt]>,
    any_options: bool,
    ports: Option<(u16, u16)>,
) -> String {
    let mut s = format!(
        "{} {}:{}({})",
        flags_str(flags),
        seq,
        seq.wrapping_add(len),
        len
    );
    if let Some(a) = ack {
        let _ = write!(s, " ack {a}");
    }
    if let Some(w) = win {
        let _ = write!(s, " win {w}");
    }
    if any_options {
        s.push_str(" <...>");
    } else if let Some(opts) = options {
        if !opts.is_empty() {
            let list: Vec<String> = opts.iter().map(ToString::to_string).collect();
            let _ = write!(s, " <{}>", list.join(","));
        }
    }
    if let Some((l, r)) = ports {
        let _ = write!(s, " lport {l} rport {r}");
    }
    s
}
