//! ICMPv4 (RFC 792): echo, destination unreachable (incl. RFC 1191 fragmentation needed),
//! time exceeded. Other types pass through as [`Icmpv4Repr::Other`].
//!
//! Error messages carry the quoted original IPv4 header and the first bytes of its payload
//! ([`Icmpv4Quote`]) so the TCP layer can match them to a connection and validate the
//! quoted sequence number before acting (RFC 5927 §4.1).

use super::checksum;
use super::ipv4::{IpProtocol, Ipv4Packet, Ipv4Repr};
use super::tcp::SeqNum;
use super::{ChecksumCaps, Error, Result};

/// The ICMP message type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Icmpv4Message {
    /// 0.
    EchoReply,
    /// 3.
    DstUnreachable,
    /// 5.
    Redirect,
    /// 8.
    EchoRequest,
    /// 11.
    TimeExceeded,
    /// 12.
    ParamProblem,
    /// Any other value.
    Unknown(u8),
}

impl From<u8> for Icmpv4Message {
    fn from(v: u8) -> Self {
        match v {
            0 => Icmpv4Message::EchoReply,
            3 => Icmpv4Message::DstUnreachable,
            5 => Icmpv4Message::Redirect,
            8 => Icmpv4Message::EchoRequest,
            11 => Icmpv4Message::TimeExceeded,
            12 => Icmpv4Message::ParamProblem,
            other => Icmpv4Message::Unknown(other),
        }
    }
}

impl From<Icmpv4Message> for u8 {
    fn from(m: Icmpv4Message) -> u8 {
        match m {
            Icmpv4Message::EchoReply => 0,
            Icmpv4Message::DstUnreachable => 3,
            Icmpv4Message::Redirect => 5,
            Icmpv4Message::EchoRequest => 8,
            Icmpv4Message::TimeExceeded => 11,
            Icmpv4Message::ParamProblem => 12,
            Icmpv4Message::Unknown(v) => v,
        }
    }
}

/// Destination unreachable codes (RFC 792, RFC 1122 §3.2.2.1, RFC 1812 §5.2.7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Icmpv4DstUnreachable {
    /// 0.
    NetUnreachable,
    /// 1.
    HostUnreachable,
    /// 2.
    ProtoUnreachable,
    /// 3.
    PortUnreachable,
    /// 4: fragmentation needed and DF set; carries the next-hop MTU (RFC 1191 §4).
    FragRequired,
    /// 5.
    SrcRouteFailed,
    /// 13: administratively prohibited (RFC 1812).
    CommProhibited,
    /// Any other code.
    Other(u8),
}

impl From<u8> for Icmpv4DstUnreachable {
    fn from(v: u8) -> Self {
        match v {
            0 => Self::NetUnreachable,
            1 => Self::HostUnreachable,
            2 => Self::ProtoUnreachable,
            3 => Self::PortUnreachable,
            4 => Self::FragRequired,
            5 => Self::SrcRouteFailed,
            13 => Self::CommProhibited,
            other => Self::Other(other),
        }
    }
}

impl From<Icmpv4DstUnreachable> for u8 {
    fn from(c: Icmpv4DstUnreachable) -> u8 {
        match c {
            Icmpv4DstUnreachable::NetUnreachable => 0,
            Icmpv4DstUnreachable::HostUnreachable => 1,
            Icmpv4DstUnreachable::ProtoUnreachable => 2,
            Icmpv4DstUnreachable::PortUnreachable => 3,
            Icmpv4DstUnreachable::FragRequired => 4,
            Icmpv4DstUnreachable::SrcRouteFailed => 5,
            Icmpv4DstUnreachable::CommProhibited => 13,
            Icmpv4DstUnreachable::Other(v) => v,
        }
    }
}

/// Time exceeded codes (RFC 792).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Icmpv4TimeExceeded {
    /// 0: TTL exceeded in transit.
    TtlExpired,
    /// 1: fragment reassembly time exceeded.
    FragReassembly,
    /// Any other code.
    Other(u8),
}

impl From<u8> for Icmpv4TimeExceeded {
    fn from(v: u8) -> Self {
        match v {
            0 => Self::TtlExpired,
            1 => Self::FragReassembly,
            other => Self::Other(other),
        }
    }
}

impl From<Icmpv4TimeExceeded> for u8 {
    fn from(c: Icmpv4TimeExceeded) -> u8 {
        match c {
            Icmpv4TimeExceeded::TtlExpired => 0,
            Icmpv4TimeExceeded::FragReassembly => 1,
            Icmpv4TimeExceeded::Other(v) => v,
        }
    }
}

mod field {
    use core::ops::{Range, RangeFrom};
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: Range<usize> = 2..4;
    pub const REST: Range<usize> = 4..8;
    pub const ECHO_IDENT: Range<usize> = 4..6;
    pub const ECHO_SEQNO: Range<usize> = 6..8;
    // RFC 1191 §4: the low-order 16 bits of the unused field hold the next-hop MTU.
    pub const MTU: Range<usize> = 6..8;
    pub const DATA: RangeFrom<usize> = 8..;
}

/// Length of the ICMP header (type, code, checksum, 4 bytes of rest-of-header).
pub const HEADER_LEN: usize = 8;

/// Bytes of original payload an error message must quote (RFC 792: "64 bits of Original
/// Data Datagram").
pub const QUOTE_PAYLOAD_MIN: usize = 8;

/// A view of an ICMPv4 message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Icmpv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Icmpv4Packet<T> {
    /// Wrap without checking; accessors may panic until [`check_len`](Self::check_len) passes.
    pub const fn new_unchecked(buffer: T) -> Self {
        Icmpv4Packet { buffer }
    }

    /// Wrap and validate the length.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// The buffer holds the 8-byte header.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(Error)
        } else {
            Ok(())
        }
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn u16_at(&self, r: core::ops::Range<usize>) -> u16 {
        let b = &self.buffer.as_ref()[r];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// Message type.
    pub fn msg_type(&self) -> Icmpv4Message {
        Icmpv4Message::from(self.buffer.as_ref()[field::TYPE])
    }

    /// Message code.
    pub fn msg_code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }

    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    /// Echo identifier.
    pub fn echo_ident(&self) -> u16 {
        self.u16_at(field::ECHO_IDENT)
    }

    /// Echo sequence number.
    pub fn echo_seq_no(&self) -> u16 {
        self.u16_at(field::ECHO_SEQNO)
    }

    /// Next-hop MTU of a fragmentation-needed message (RFC 1191 §4; 0 from old routers).
    pub fn next_hop_mtu(&self) -> u16 {
        self.u16_at(field::MTU)
    }

    /// The four rest-of-header bytes, as a big-endian number.
    pub fn rest_of_header(&self) -> u32 {
        let b = &self.buffer.as_ref()[field::REST];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    /// RFC 792: the checksum is the ones-complement of the ones-complement sum of the whole
    /// ICMP message; a valid message sums to all ones.
    pub fn verify_checksum(&self) -> bool {
        checksum::data(self.buffer.as_ref()) == 0xffff
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Icmpv4Packet<&'a T> {
    /// The bytes after the 8-byte header.
    pub fn data(&self) -> &'a [u8] {
        &self.buffer.as_ref()[field::DATA]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Icmpv4Packet<T> {
    fn set_u16_at(&mut self, r: core::ops::Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }

    /// Set the type.
    pub fn set_msg_type(&mut self, t: Icmpv4Message) {
        self.buffer.as_mut()[field::TYPE] = t.into();
    }

    /// Set the code.
    pub fn set_msg_code(&mut self, c: u8) {
        self.buffer.as_mut()[field::CODE] = c;
    }

    /// Set the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        self.set_u16_at(field::CHECKSUM, v);
    }

    /// Set the echo identifier.
    pub fn set_echo_ident(&mut self, v: u16) {
        self.set_u16_at(field::ECHO_IDENT, v);
    }

    /// Set the echo sequence number.
    pub fn set_echo_seq_no(&mut self, v: u16) {
        self.set_u16_at(field::ECHO_SEQNO, v);
    }

    /// Set the next-hop MTU (also clears the unused upper half).
    pub fn set_next_hop_mtu(&mut self, v: u16) {
        self.set_rest_of_header(u32::from(v));
    }

    /// Set the four rest-of-header bytes.
    pub fn set_rest_of_header(&mut self, v: u32) {
        self.buffer.as_mut()[field::REST].copy_from_slice(&v.to_be_bytes());
    }

    /// The bytes after the header, mutably.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::DATA]
    }

    /// Compute and store the checksum over the whole buffer.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = !checksum::data(self.buffer.as_ref());
        self.set_checksum(c);
    }
}

/// The original datagram quoted in an ICMP error message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Icmpv4Quote<'a> {
    /// The original IPv4 header (its `payload_len` is the original datagram's).
    pub header: Ipv4Repr,
    /// The quoted start of the original payload, at least 8 bytes.
    pub payload: &'a [u8],
}

impl<'a> Icmpv4Quote<'a> {
    fn parse(data: &'a [u8]) -> Result<Self> {
        let (header, payload) = Ipv4Repr::parse_quoted(data)?;
        // RFC 792: the quote holds the IP header plus 64 bits of the original data; we need
        // them to identify the connection (ports) and validate the sequence number.
        if payload.len() < QUOTE_PAYLOAD_MIN {
            return Err(Error);
        }
        Ok(Icmpv4Quote { header, payload })
    }

    /// Source and destination port of a quoted TCP or UDP datagram (our ports as sent).
    pub fn ports(&self) -> Option<(u16, u16)> {
        match self.header.protocol {
            IpProtocol::Tcp | IpProtocol::Udp if self.payload.len() >= 4 => Some((
                u16::from_be_bytes([self.payload[0], self.payload[1]]),
                u16::from_be_bytes([self.payload[2], self.payload[3]]),
            )),
            _ => None,
        }
    }

    /// Sequence number of a quoted TCP segment, to be checked against SND.UNA..SND.NXT
    /// before the error is acted on (RFC 5927 §4.1).
    pub fn tcp_seq(&self) -> Option<SeqNum> {
        match self.header.protocol {
            IpProtocol::Tcp if self.payload.len() >= 8 => {
                let p = self.payload;
                Some(SeqNum(u32::from_be_bytes([p[4], p[5], p[6], p[7]])))
            }
            _ => None,
        }
    }

    fn buffer_len(&self) -> usize {
        self.header.header_len() + self.payload.len()
    }

    fn emit(&self, out: &mut [u8]) {
        let hlen = self.header.header_len();
        let mut ip = Ipv4Packet::new_unchecked(&mut out[..hlen]);
        self.header.emit(&mut ip, &ChecksumCaps::software());
        out[hlen..hlen + self.payload.len()].copy_from_slice(self.payload);
    }
}

/// A parsed ICMPv4 message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Icmpv4Repr<'a> {
    /// Type 8, code 0.
    EchoRequest {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq_no: u16,
        /// Data to echo back.
        data: &'a [u8],
    },
    /// Type 0, code 0.
    EchoReply {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq_no: u16,
        /// Echoed data.
        data: &'a [u8],
    },
    /// Type 3.
    DstUnreachable {
        /// Code.
        reason: Icmpv4DstUnreachable,
        /// Next-hop MTU; meaningful for [`Icmpv4DstUnreachable::FragRequired`] only
        /// (RFC 1191 §4), 0 when a pre-RFC 1191 router sent it.
        next_hop_mtu: u16,
        /// The offending datagram's header and first payload bytes.
        quote: Icmpv4Quote<'a>,
    },
    /// Type 11.
    TimeExceeded {
        /// Code.
        reason: Icmpv4TimeExceeded,
        /// The offending datagram's header and first payload bytes.
        quote: Icmpv4Quote<'a>,
    },
    /// Any other type (or an echo with a non-zero code), passed through uninterpreted.
    Other {
        /// Type.
        msg_type: Icmpv4Message,
        /// Code.
        code: u8,
        /// The four rest-of-header bytes.
        rest: u32,
        /// Everything after the header.
        data: &'a [u8],
    },
}

impl<'a> Icmpv4Repr<'a> {
    /// Parse a message; `packet` must span exactly the IP payload (the checksum covers it).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        packet: &Icmpv4Packet<&'a T>,
        caps: &ChecksumCaps,
    ) -> Result<Self> {
        packet.check_len()?;
        if caps.icmpv4.rx() && !packet.verify_checksum() {
            return Err(Error);
        }
        let data = packet.data();
        let code = packet.msg_code();
        Ok(match (packet.msg_type(), code) {
            (Icmpv4Message::EchoRequest, 0) => Icmpv4Repr::EchoRequest {
                ident: packet.echo_ident(),
                seq_no: packet.echo_seq_no(),
                data,
            },
            (Icmpv4Message::EchoReply, 0) => Icmpv4Repr::EchoReply {
                ident: packet.echo_ident(),
                seq_no: packet.echo_seq_no(),
                data,
            },
            (Icmpv4Message::DstUnreachable, _) => Icmpv4Repr::DstUnreachable {
                reason: code.into(),
                next_hop_mtu: packet.next_hop_mtu(),
                quote: Icmpv4Quote::parse(data)?,
            },
            (Icmpv4Message::TimeExceeded, _) => Icmpv4Repr::TimeExceeded {
                reason: code.into(),
                quote: Icmpv4Quote::parse(data)?,
            },
            (msg_type, code) => Icmpv4Repr::Other {
                msg_type,
                code,
                rest: packet.rest_of_header(),
                data,
            },
        })
    }

    /// The quoted datagram of an error message.
    pub fn quote(&self) -> Option<&Icmpv4Quote<'a>> {
        match self {
            Icmpv4Repr::DstUnreachable { quote, .. } | Icmpv4Repr::TimeExceeded { quote, .. } => {
                Some(quote)
            }
            _ => None,
        }
    }

    /// Bytes needed to emit.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN
            + match self {
                Icmpv4Repr::EchoRequest { data, .. }
                | Icmpv4Repr::EchoReply { data, .. }
                | Icmpv4Repr::Other { data, .. } => data.len(),
                Icmpv4Repr::DstUnreachable { quote, .. }
                | Icmpv4Repr::TimeExceeded { quote, .. } => quote.buffer_len(),
            }
    }

    /// Write the message (and its checksum unless offloaded) into a buffer of exactly
    /// [`buffer_len`](Self::buffer_len) bytes.
    ///
    /// # Panics
    /// If the buffer is shorter than `buffer_len()` (a caller bug).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut Icmpv4Packet<T>,
        caps: &ChecksumCaps,
    ) {
        let len = self.buffer_len();
        match *self {
            Icmpv4Repr::EchoRequest {
                ident,
                seq_no,
                data,
            }
            | Icmpv4Repr::EchoReply {
                ident,
                seq_no,
                data,
            } => {
                let t = if matches!(self, Icmpv4Repr::EchoRequest { .. }) {
                    Icmpv4Message::EchoRequest
                } else {
                    Icmpv4Message::EchoReply
                };
                packet.set_msg_type(t);
                packet.set_msg_code(0);
                packet.set_echo_ident(ident);
                packet.set_echo_seq_no(seq_no);
                packet.data_mut()[..data.len()].copy_from_slice(data);
            }
            Icmpv4Repr::DstUnreachable {
                reason,
                next_hop_mtu,
                quote,
            } => {
                packet.set_msg_type(Icmpv4Message::DstUnreachable);
                packet.set_msg_code(reason.into());
                packet.set_next_hop_mtu(next_hop_mtu);
                quote.emit(packet.data_mut());
            }
            Icmpv4Repr::TimeExceeded { reason, quote } => {
                packet.set_msg_type(Icmpv4Message::TimeExceeded);
                packet.set_msg_code(reason.into());
                packet.set_rest_of_header(0);
                quote.emit(packet.data_mut());
            }
            Icmpv4Repr::Other {
                msg_type,
                code,
                rest,
                data,
            } => {
                packet.set_msg_type(msg_type);
                packet.set_msg_code(code);
                packet.set_rest_of_header(rest);
                packet.data_mut()[..data.len()].copy_from_slice(data);
            }
        }
        if caps.icmpv4.tx() {
            packet.set_checksum(0);
            let c = !checksum::data(&packet.buffer.as_ref()[..len]);
            packet.set_checksum(c);
        } else {
            packet.set_checksum(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ipv4::Ipv4Addr;
    use proptest::prelude::*;

    // Echo request id 0x1234 seq 1, data "abcd"; checksum computed independently.
    const ECHO: [u8; 12] = [
        0x08, 0x00, 0x21, 0x04, 0x12, 0x34, 0x00, 0x01, b'a', b'b', b'c', b'd',
    ];

    // Fragmentation needed, next-hop MTU 1400, quoting a TCP segment 198.18.0.1:40000 ->
    // 198.18.0.2:80 with seq 0x01020304 (IP header + first 8 bytes of TCP).
    const FRAG_NEEDED: [u8; 36] = [
        0x03, 0x04, 0x00, 0x00, 0x00, 0x00, 0x05, 0x78, // type, code, cksum, unused, MTU
        0x45, 0x00, 0x05, 0xdc, 0x00, 0x01, 0x40, 0x00, 0x40, 0x06, 0x00, 0x00, 198, 18, 0, 1, 198,
        18, 0, 2, // quoted IP header, total length 1500
        0x9c, 0x40, 0x00, 0x50, 0x01, 0x02, 0x03, 0x04, // ports + seq
    ];

    fn with_checksum(b: &[u8]) -> Vec<u8> {
        let mut v = b.to_vec();
        Icmpv4Packet::new_unchecked(&mut v[..]).fill_checksum();
        v
    }

    #[test]
    fn parse_echo_request() {
        let p = Icmpv4Packet::new_checked(&ECHO[..]).unwrap();
        assert!(p.verify_checksum());
        let r = Icmpv4Repr::parse(&p, &ChecksumCaps::software()).unwrap();
        assert_eq!(
            r,
            Icmpv4Repr::EchoRequest {
                ident: 0x1234,
                seq_no: 1,
                data: b"abcd"
            }
        );
        let mut out = vec![0u8; r.buffer_len()];
        r.emit(
            &mut Icmpv4Packet::new_unchecked(&mut out[..]),
            &ChecksumCaps::software(),
        );
        assert_eq!(out, ECHO);
    }

    #[test]
    fn rfc792_bad_checksum_rejected_unless_offloaded() {
        let mut b = ECHO;
        b[9] ^= 0x20;
        let p = Icmpv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Icmpv4Repr::parse(&p, &ChecksumCaps::software()), Err(Error));
        assert!(Icmpv4Repr::parse(&p, &ChecksumCaps::offloaded()).is_ok());
    }

    #[test]
    fn rfc1191_4_frag_needed_exposes_mtu_and_quote() {
        let b = with_checksum(&FRAG_NEEDED);
        let p = Icmpv4Packet::new_checked(&b[..]).unwrap();
        let r = Icmpv4Repr::parse(&p, &ChecksumCaps::software()).unwrap();
        let Icmpv4Repr::DstUnreachable {
            reason,
            next_hop_mtu,
            quote,
        } = r
        else {
            panic!("not dst unreachable: {r:?}");
        };
        assert_eq!(reason, Icmpv4DstUnreachable::FragRequired);
        assert_eq!(next_hop_mtu, 1400);
        assert_eq!(quote.header.src_addr, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(quote.header.dst_addr, Ipv4Addr::new(198, 18, 0, 2));
        assert_eq!(quote.header.protocol, IpProtocol::Tcp);
        assert_eq!(quote.header.payload_len, 1480);
        // RFC 5927 §4.1: ports and sequence number are available for validation.
        assert_eq!(quote.ports(), Some((40000, 80)));
        assert_eq!(quote.tcp_seq(), Some(SeqNum(0x0102_0304)));
        assert_eq!(r.quote(), Some(&quote));
        let mut out = vec![0u8; r.buffer_len()];
        r.emit(
            &mut Icmpv4Packet::new_unchecked(&mut out[..]),
            &ChecksumCaps::software(),
        );
        let p2 = Icmpv4Packet::new_checked(&out[..]).unwrap();
        assert_eq!(Icmpv4Repr::parse(&p2, &ChecksumCaps::software()), Ok(r));
    }

    #[test]
    fn rfc792_quote_needs_64_bits_of_payload() {
        let short = with_checksum(&FRAG_NEEDED[..35]);
        let p = Icmpv4Packet::new_checked(&short[..]).unwrap();
        assert_eq!(Icmpv4Repr::parse(&p, &ChecksumCaps::software()), Err(Error));
    }

    #[test]
    fn quote_with_bad_ihl_rejected() {
        let mut b = FRAG_NEEDED;
        b[8] = 0x43;
        let b = with_checksum(&b);
        let p = Icmpv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Icmpv4Repr::parse(&p, &ChecksumCaps::software()), Err(Error));
    }

    #[test]
    fn time_exceeded() {
        let mut b = FRAG_NEEDED;
        b[0] = 11;
        b[1] = 0;
        b[6] = 0;
        b[7] = 0;
        let b = with_checksum(&b);
        let p = Icmpv4Packet::new_checked(&b[..]).unwrap();
        let r = Icmpv4Repr::parse(&p, &ChecksumCaps::software()).unwrap();
        assert!(matches!(
            r,
            Icmpv4Repr::TimeExceeded {
                reason: Icmpv4TimeExceeded::TtlExpired,
                ..
            }
        ));
        assert_eq!(r.quote().unwrap().ports(), Some((40000, 80)));
    }

    #[test]
    fn unknown_type_passes_as_value() {
        let b = with_checksum(&[42, 7, 0, 0, 1, 2, 3, 4, 9, 9]);
        let p = Icmpv4Packet::new_checked(&b[..]).unwrap();
        let r = Icmpv4Repr::parse(&p, &ChecksumCaps::software()).unwrap();
        assert_eq!(
            r,
            Icmpv4Repr::Other {
                msg_type: Icmpv4Message::Unknown(42),
                code: 7,
                rest: 0x0102_0304,
                data: &[9, 9]
            }
        );
        let mut out = vec![0u8; r.buffer_len()];
        r.emit(
            &mut Icmpv4Packet::new_unchecked(&mut out[..]),
            &ChecksumCaps::software(),
        );
        assert_eq!(out, b);
    }

    #[test]
    fn quote_of_udp_has_ports_but_no_seq() {
        let mut b = FRAG_NEEDED;
        b[17] = 17;
        let b = with_checksum(&b);
        let r = Icmpv4Repr::parse(
            &Icmpv4Packet::new_checked(&b[..]).unwrap(),
            &ChecksumCaps::software(),
        )
        .unwrap();
        let q = r.quote().unwrap();
        assert_eq!(q.ports(), Some((40000, 80)));
        assert_eq!(q.tcp_seq(), None);
    }

    #[test]
    fn truncated_every_length() {
        let ok_frag = with_checksum(&FRAG_NEEDED);
        for full in [&ECHO[..], &ok_frag[..]] {
            for n in 0..HEADER_LEN {
                assert_eq!(Icmpv4Packet::new_checked(&full[..n]), Err(Error));
            }
        }
        // Error messages truncated anywhere inside the quote are rejected even with a
        // valid checksum.
        for n in HEADER_LEN..FRAG_NEEDED.len() {
            let b = with_checksum(&FRAG_NEEDED[..n]);
            let p = Icmpv4Packet::new_checked(&b[..]).unwrap();
            assert_eq!(
                Icmpv4Repr::parse(&p, &ChecksumCaps::software()),
                Err(Error),
                "{n}"
            );
        }
    }

    fn arb_quote() -> impl Strategy<Value = (Ipv4Repr, Vec<u8>)> {
        (
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            any::<u8>(),
            proptest::collection::vec(any::<u8>(), 8..40),
            0usize..2000,
        )
            .prop_map(|(s, d, p, payload, extra)| {
                let mut h = Ipv4Repr::new(s.into(), d.into(), p.into(), payload.len() + extra);
                h.ident = 7;
                (h, payload)
            })
    }

    proptest! {
        #[test]
        fn roundtrip_echo(req in any::<bool>(), ident in any::<u16>(), seq_no in any::<u16>(),
                          data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let r = if req {
                Icmpv4Repr::EchoRequest { ident, seq_no, data: &data }
            } else {
                Icmpv4Repr::EchoReply { ident, seq_no, data: &data }
            };
            let mut out = vec![0u8; r.buffer_len()];
            r.emit(&mut Icmpv4Packet::new_unchecked(&mut out[..]), &ChecksumCaps::software());
            let p = Icmpv4Packet::new_checked(&out[..]).unwrap();
            prop_assert_eq!(Icmpv4Repr::parse(&p, &ChecksumCaps::software()).unwrap(), r);
        }

        #[test]
        fn roundtrip_errors(unreach in any::<bool>(), code in any::<u8>(), mtu in any::<u16>(),
                            (header, payload) in arb_quote()) {
            let quote = Icmpv4Quote { header, payload: &payload };
            let r = if unreach {
                Icmpv4Repr::DstUnreachable { reason: code.into(), next_hop_mtu: mtu, quote }
            } else {
                Icmpv4Repr::TimeExceeded { reason: code.into(), quote }
            };
            let mut out = vec![0u8; r.buffer_len()];
            r.emit(&mut Icmpv4Packet::new_unchecked(&mut out[..]), &ChecksumCaps::software());
            let p = Icmpv4Packet::new_checked(&out[..]).unwrap();
            prop_assert_eq!(Icmpv4Repr::parse(&p, &ChecksumCaps::software()).unwrap(), r);
        }

        #[test]
        fn roundtrip_other(t in any::<u8>(), code in any::<u8>(), rest in any::<u32>(),
                           data in proptest::collection::vec(any::<u8>(), 0..32)) {
            prop_assume!(!matches!(t, 0 | 3 | 8 | 11));
            let r = Icmpv4Repr::Other { msg_type: t.into(), code, rest, data: &data };
            let mut out = vec![0u8; r.buffer_len()];
            r.emit(&mut Icmpv4Packet::new_unchecked(&mut out[..]), &ChecksumCaps::software());
            let p = Icmpv4Packet::new_checked(&out[..]).unwrap();
            prop_assert_eq!(Icmpv4Repr::parse(&p, &ChecksumCaps::software()).unwrap(), r);
        }
    }
}
