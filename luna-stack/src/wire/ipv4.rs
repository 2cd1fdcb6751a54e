//! IPv4 (RFC 791): header view, repr, protocol numbers and CIDR prefixes.
//!
//! Options are skipped by IHL, not interpreted. Fragments are not reassembled: the repr
//! exposes [`Ipv4Repr::is_fragment`] so the caller counts and drops them.

use super::checksum;
use super::{ChecksumCaps, Error, Result};
use core::fmt;
use core::str::FromStr;

pub use core::net::Ipv4Addr;

/// The IP protocol number (RFC 791 "Protocol"; IANA registry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpProtocol {
    /// 1.
    Icmp,
    /// 6.
    Tcp,
    /// 17.
    Udp,
    /// Anything else, passed through.
    Unknown(u8),
}

impl From<u8> for IpProtocol {
    fn from(v: u8) -> Self {
        match v {
            1 => IpProtocol::Icmp,
            6 => IpProtocol::Tcp,
            17 => IpProtocol::Udp,
            other => IpProtocol::Unknown(other),
        }
    }
}

impl From<IpProtocol> for u8 {
    fn from(p: IpProtocol) -> u8 {
        match p {
            IpProtocol::Icmp => 1,
            IpProtocol::Tcp => 6,
            IpProtocol::Udp => 17,
            IpProtocol::Unknown(v) => v,
        }
    }
}

mod field {
    use core::ops::Range;
    pub const VER_IHL: usize = 0;
    pub const DSCP_ECN: usize = 1;
    pub const LENGTH: Range<usize> = 2..4;
    pub const IDENT: Range<usize> = 4..6;
    pub const FLG_OFF: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SRC_ADDR: Range<usize> = 12..16;
    pub const DST_ADDR: Range<usize> = 16..20;
}

/// Length of a header without options.
pub const HEADER_LEN: usize = 20;

/// Largest header (IHL 15).
pub const MAX_HEADER_LEN: usize = 60;

// RFC 791 §3.1 "Flags": bit 1 DF, bit 2 MF; the low 13 bits are the fragment offset.
const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const OFFSET_MASK: u16 = 0x1fff;

/// A view of an IPv4 datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wrap without checking; accessors may panic until [`check_len`](Self::check_len) passes.
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    /// Wrap and validate the lengths.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Validate every length the accessors rely on.
    ///
    /// RFC 791 §3.1: IHL counts 32-bit words and is at least 5; Total Length covers header
    /// and data, so it is at least IHL*4. The buffer may be longer than Total Length
    /// (Ethernet pads frames to 60 bytes) but never shorter.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error);
        }
        let hlen = self.header_len();
        if hlen < HEADER_LEN || len < hlen {
            return Err(Error);
        }
        let total = usize::from(self.total_len());
        if total < hlen || len < total {
            return Err(Error);
        }
        Ok(())
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    fn u16_at(&self, r: core::ops::Range<usize>) -> u16 {
        let b = &self.b()[r];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// Version field (4 for IPv4).
    pub fn version(&self) -> u8 {
        self.b()[field::VER_IHL] >> 4
    }

    /// Header length in bytes (IHL × 4).
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[field::VER_IHL] & 0x0f) * 4
    }

    /// Differentiated Services Code Point (RFC 2474, upper 6 bits of the old TOS).
    pub fn dscp(&self) -> u8 {
        self.b()[field::DSCP_ECN] >> 2
    }

    /// ECN codepoint (RFC 3168 §5, lower 2 bits).
    pub fn ecn(&self) -> u8 {
        self.b()[field::DSCP_ECN] & 0x03
    }

    /// Total length (header + data) in bytes.
    pub fn total_len(&self) -> u16 {
        self.u16_at(field::LENGTH)
    }

    /// Identification.
    pub fn ident(&self) -> u16 {
        self.u16_at(field::IDENT)
    }

    /// Don't Fragment.
    pub fn dont_frag(&self) -> bool {
        self.u16_at(field::FLG_OFF) & FLAG_DF != 0
    }

    /// More Fragments.
    pub fn more_frags(&self) -> bool {
        self.u16_at(field::FLG_OFF) & FLAG_MF != 0
    }

    /// Fragment offset in bytes (the field counts 8-byte units).
    pub fn frag_offset(&self) -> u16 {
        (self.u16_at(field::FLG_OFF) & OFFSET_MASK) << 3
    }

    /// RFC 791 §3.2 "Fragmentation": a datagram is a fragment when MF is set or the offset
    /// is non-zero.
    pub fn is_fragment(&self) -> bool {
        self.more_frags() || self.frag_offset() != 0
    }

    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.b()[field::TTL]
    }

    /// Protocol of the payload.
    pub fn protocol(&self) -> IpProtocol {
        IpProtocol::from(self.b()[field::PROTOCOL])
    }

    /// Header checksum field.
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    /// Source address.
    pub fn src_addr(&self) -> Ipv4Addr {
        let b = &self.b()[field::SRC_ADDR];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// Destination address.
    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = &self.b()[field::DST_ADDR];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// RFC 791 §3.1 "Header Checksum": the ones-complement sum over the header (options
    /// included) is all ones.
    pub fn verify_checksum(&self) -> bool {
        checksum::data(&self.b()[..self.header_len()]) == 0xffff
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Ipv4Packet<&'a T> {
    /// The options bytes (between the fixed header and IHL×4), unparsed.
    pub fn options(&self) -> &'a [u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.header_len()]
    }

    /// Whether the options carry a loose or strict source route (RFC 791 §3.1, types 131
    /// and 137); `Err` for a malformed option list (an option's length below 2 or past
    /// the header). Walks the options, which are rare: check
    /// [`header_len`](Ipv4Packet::header_len) `> 20` first.
    pub fn source_routed(&self) -> Result<bool> {
        options_source_routed(self.options())
    }

    /// The payload, bounded by Total Length (link-layer padding excluded).
    pub fn payload(&self) -> &'a [u8] {
        let b = self.buffer.as_ref();
        &b[self.header_len()..usize::from(self.total_len())]
    }
}

/// RFC 791 §3.1 "Options": End of Option List (0) ends the list, No Operation (1) is one
/// byte, every other option is type, length (counting both, so at least 2) and data.
const OPT_EOL: u8 = 0;
const OPT_NOP: u8 = 1;
/// Loose Source and Record Route.
const OPT_LSRR: u8 = 131;
/// Strict Source and Record Route.
const OPT_SSRR: u8 = 137;

/// Whether an option list carries a loose or strict source route; `Err` when an option's
/// length is below 2 or runs past the list.
pub fn options_source_routed(opts: &[u8]) -> Result<bool> {
    let mut i = 0;
    let mut routed = false;
    while let Some(&kind) = opts.get(i) {
        match kind {
            OPT_EOL => break,
            OPT_NOP => i += 1,
            _ => {
                let len = usize::from(*opts.get(i + 1).ok_or(Error)?);
                if len < 2 || i + len > opts.len() {
                    return Err(Error);
                }
                routed |= kind == OPT_LSRR || kind == OPT_SSRR;
                i += len;
            }
        }
    }
    Ok(routed)
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    fn set_u16_at(&mut self, r: core::ops::Range<usize>, v: u16) {
        self.bm()[r].copy_from_slice(&v.to_be_bytes());
    }

    /// Set the version.
    pub fn set_version(&mut self, v: u8) {
        let b = self.bm();
        b[field::VER_IHL] = (b[field::VER_IHL] & 0x0f) | (v << 4);
    }

    /// Set the header length in bytes (a multiple of 4, 20..=60).
    pub fn set_header_len(&mut self, len: usize) {
        let b = self.bm();
        b[field::VER_IHL] = (b[field::VER_IHL] & 0xf0) | ((len / 4) as u8 & 0x0f);
    }

    /// Set the DSCP (6 bits).
    pub fn set_dscp(&mut self, v: u8) {
        let b = self.bm();
        b[field::DSCP_ECN] = (b[field::DSCP_ECN] & 0x03) | (v << 2);
    }

    /// Set the ECN codepoint (2 bits).
    pub fn set_ecn(&mut self, v: u8) {
        let b = self.bm();
        b[field::DSCP_ECN] = (b[field::DSCP_ECN] & 0xfc) | (v & 0x03);
    }

    /// Set the total length.
    pub fn set_total_len(&mut self, v: u16) {
        self.set_u16_at(field::LENGTH, v);
    }

    /// Set the identification.
    pub fn set_ident(&mut self, v: u16) {
        self.set_u16_at(field::IDENT, v);
    }

    /// Set flags and fragment offset (in bytes; must be a multiple of 8) at once.
    pub fn set_flags_and_offset(&mut self, dont_frag: bool, more_frags: bool, offset: u16) {
        let mut v = (offset >> 3) & OFFSET_MASK;
        if dont_frag {
            v |= FLAG_DF;
        }
        if more_frags {
            v |= FLAG_MF;
        }
        self.set_u16_at(field::FLG_OFF, v);
    }

    /// Set the TTL.
    pub fn set_ttl(&mut self, v: u8) {
        self.bm()[field::TTL] = v;
    }

    /// Set the protocol.
    pub fn set_protocol(&mut self, p: IpProtocol) {
        self.bm()[field::PROTOCOL] = p.into();
    }

    /// Set the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        self.set_u16_at(field::CHECKSUM, v);
    }

    /// Set the source address.
    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        self.bm()[field::SRC_ADDR].copy_from_slice(&a.octets());
    }

    /// Set the destination address.
    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        self.bm()[field::DST_ADDR].copy_from_slice(&a.octets());
    }

    /// Compute and store the header checksum.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hlen = self.header_len();
        let c = !checksum::data(&self.b()[..hlen]);
        self.set_checksum(c);
    }

    /// Decrement TTL and patch the checksum incrementally (RFC 1624 §3; RFC 1812 §5.3.1).
    /// Returns the new TTL.
    pub fn decrement_ttl(&mut self) -> u8 {
        let ttl = self.ttl();
        let new = ttl.saturating_sub(1);
        let proto = self.b()[field::PROTOCOL];
        let c = checksum::update16(
            self.checksum(),
            u16::from_be_bytes([ttl, proto]),
            u16::from_be_bytes([new, proto]),
        );
        self.set_ttl(new);
        self.set_checksum(c);
        new
    }

    /// The payload, mutably (bounded by Total Length).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (start, end) = (self.header_len(), usize::from(self.total_len()));
        &mut self.bm()[start..end]
    }
}

/// A parsed IPv4 header (options skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    /// Source address.
    pub src_addr: Ipv4Addr,
    /// Destination address.
    pub dst_addr: Ipv4Addr,
    /// Payload protocol.
    pub protocol: IpProtocol,
    /// Payload length (Total Length − IHL×4).
    pub payload_len: usize,
    /// Time to live.
    pub ttl: u8,
    /// DSCP (6 bits).
    pub dscp: u8,
    /// ECN codepoint (2 bits).
    pub ecn: u8,
    /// Identification.
    pub ident: u16,
    /// Don't Fragment (set by TCP for path MTU discovery, RFC 1191 §3).
    pub dont_frag: bool,
    /// More Fragments.
    pub more_frags: bool,
    /// Fragment offset in bytes (a multiple of 8).
    pub frag_offset: u16,
}

impl Ipv4Repr {
    /// A plain, unfragmented header with DF set, TTL 64 and no DSCP/ECN.
    pub fn new(src_addr: Ipv4Addr, dst_addr: Ipv4Addr, protocol: IpProtocol, len: usize) -> Self {
        Ipv4Repr {
            src_addr,
            dst_addr,
            protocol,
            payload_len: len,
            ttl: 64,
            dscp: 0,
            ecn: 0,
            ident: 0,
            dont_frag: true,
            more_frags: false,
            frag_offset: 0,
        }
    }

    /// Parse and validate a datagram header.
    ///
    /// Rejects a version other than 4, a bad checksum (unless offloaded) and inconsistent
    /// lengths. Fragments are returned, not rejected: check [`is_fragment`](Self::is_fragment)
    /// before handing the payload to a transport parser.
    pub fn parse<T: AsRef<[u8]>>(packet: &Ipv4Packet<T>, caps: &ChecksumCaps) -> Result<Self> {
        let b = packet.b();
        // One bounds check for the fixed header; every field is read at a constant offset
        // of it (the accessors would check each one). The length rules are `check_len`'s.
        let Some(h) = b.first_chunk::<HEADER_LEN>() else {
            return Err(Error);
        };
        let hlen = usize::from(h[field::VER_IHL] & 0x0f) * 4;
        let total = usize::from(u16::from_be_bytes([h[2], h[3]]));
        // RFC 791 §3.1: IHL >= 5 words, IHL*4 <= Total Length <= the buffer.
        if hlen < HEADER_LEN || total < hlen || b.len() < total {
            return Err(Error);
        }
        // RFC 791 §3.1 "Version": this is IPv4.
        if h[field::VER_IHL] >> 4 != 4 {
            return Err(Error);
        }
        if caps.ipv4.rx() && checksum::data(&b[..hlen]) != 0xffff {
            return Err(Error);
        }
        let flg = u16::from_be_bytes([h[6], h[7]]);
        Ok(Ipv4Repr {
            src_addr: Ipv4Addr::new(h[12], h[13], h[14], h[15]),
            dst_addr: Ipv4Addr::new(h[16], h[17], h[18], h[19]),
            protocol: IpProtocol::from(h[field::PROTOCOL]),
            payload_len: total - hlen,
            ttl: h[field::TTL],
            dscp: h[field::DSCP_ECN] >> 2,
            ecn: h[field::DSCP_ECN] & 0x03,
            ident: u16::from_be_bytes([h[4], h[5]]),
            dont_frag: flg & FLAG_DF != 0,
            more_frags: flg & FLAG_MF != 0,
            frag_offset: (flg & OFFSET_MASK) << 3,
        })
    }

    /// Parse the header quoted inside an ICMP error (RFC 792: "Internet Header + 64 bits of
    /// Original Data Datagram"). The quote is shorter than the original Total Length, so only
    /// the header itself is bounded; the checksum is not verified (routers quote the header
    /// as received). Returns the header and the quoted payload bytes.
    pub fn parse_quoted(data: &[u8]) -> Result<(Self, &[u8])> {
        if data.len() < HEADER_LEN {
            return Err(Error);
        }
        let p = Ipv4Packet::new_unchecked(data);
        let hlen = p.header_len();
        if p.version() != 4 || hlen < HEADER_LEN || data.len() < hlen {
            return Err(Error);
        }
        let total = usize::from(p.total_len());
        if total < hlen {
            return Err(Error);
        }
        let repr = Ipv4Repr {
            src_addr: p.src_addr(),
            dst_addr: p.dst_addr(),
            protocol: p.protocol(),
            payload_len: total - hlen,
            ttl: p.ttl(),
            dscp: p.dscp(),
            ecn: p.ecn(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
            more_frags: p.more_frags(),
            frag_offset: p.frag_offset(),
        };
        // Never quote more than the original datagram held.
        let end = data.len().min(total);
        Ok((repr, &data[hlen..end]))
    }

    /// RFC 791 §3.2: MF set or a non-zero offset. luna does not reassemble; count and drop.
    pub fn is_fragment(&self) -> bool {
        self.more_frags || self.frag_offset != 0
    }

    /// Emitted header length (no options).
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Header plus payload length.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN + self.payload_len
    }

    /// Write the header (IHL 5) and, unless offloaded, its checksum. The payload is not
    /// touched.
    ///
    /// # Panics
    /// If the buffer is shorter than 20 bytes or `payload_len + 20` exceeds 65535 (caller
    /// bugs).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut Ipv4Packet<T>,
        caps: &ChecksumCaps,
    ) {
        let total = u16::try_from(HEADER_LEN + self.payload_len)
            .expect("IPv4 datagram longer than 65535 bytes");
        packet.set_version(4);
        packet.set_header_len(HEADER_LEN);
        packet.set_dscp(self.dscp);
        packet.set_ecn(self.ecn);
        packet.set_total_len(total);
        packet.set_ident(self.ident);
        packet.set_flags_and_offset(self.dont_frag, self.more_frags, self.frag_offset);
        packet.set_ttl(self.ttl);
        packet.set_protocol(self.protocol);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
        if caps.ipv4.tx() {
            packet.fill_checksum();
        } else {
            packet.set_checksum(0);
        }
    }
}

/// An IPv4 address with a prefix length, e.g. `198.18.0.1/24`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ipv4Cidr {
    address: Ipv4Addr,
    prefix_len: u8,
}

impl Ipv4Cidr {
    /// `address/prefix_len`; fails if `prefix_len > 32`. Host bits are kept (an interface
    /// address); use [`network`](Self::network) for the prefix itself.
    pub const fn new(address: Ipv4Addr, prefix_len: u8) -> Result<Self> {
        if prefix_len > 32 {
            return Err(Error);
        }
        Ok(Ipv4Cidr {
            address,
            prefix_len,
        })
    }

    /// The address as given.
    pub const fn address(&self) -> Ipv4Addr {
        self.address
    }

    /// The prefix length (0..=32).
    pub const fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// The mask as a number (e.g. 0xffffff00 for /24).
    pub const fn mask_bits(&self) -> u32 {
        if self.prefix_len == 0 {
            0
        } else {
            u32::MAX << (32 - self.prefix_len)
        }
    }

    /// The netmask as an address.
    pub const fn netmask(&self) -> Ipv4Addr {
        Ipv4Addr::from_bits(self.mask_bits())
    }

    /// The prefix with host bits cleared.
    pub const fn network(&self) -> Ipv4Cidr {
        Ipv4Cidr {
            address: Ipv4Addr::from_bits(self.address.to_bits() & self.mask_bits()),
            prefix_len: self.prefix_len,
        }
    }

    /// The directed broadcast address (all host bits set).
    pub const fn broadcast(&self) -> Ipv4Addr {
        Ipv4Addr::from_bits(self.address.to_bits() | !self.mask_bits())
    }

    /// Whether `addr` is inside this prefix.
    pub const fn contains_addr(&self, addr: Ipv4Addr) -> bool {
        (addr.to_bits() ^ self.address.to_bits()) & self.mask_bits() == 0
    }

    /// Whether `other` is entirely inside this prefix.
    pub const fn contains_subnet(&self, other: &Ipv4Cidr) -> bool {
        self.prefix_len <= other.prefix_len && self.contains_addr(other.address)
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix_len)
    }
}

impl fmt::Debug for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Ipv4Cidr {
    type Err = Error;

    /// Parses `a.b.c.d/n`.
    fn from_str(s: &str) -> Result<Self> {
        let (a, n) = s.split_once('/').ok_or(Error)?;
        let address: Ipv4Addr = a.parse().map_err(|_| Error)?;
        if n.is_empty() || n.len() > 2 || !n.bytes().all(|c| c.is_ascii_digit()) {
            return Err(Error);
        }
        let prefix_len: u8 = n.parse().map_err(|_| Error)?;
        Ipv4Cidr::new(address, prefix_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // 198.18.0.1 -> 198.18.0.2, TCP, total length 40 (a bare ACK), DF, TTL 64, id 0x1c46,
    // checksum hand-computed with an independent RFC 1071 implementation.
    pub(crate) const HEADER: [u8; 20] = [
        0x45, 0x00, 0x00, 0x28, 0x1c, 0x46, 0x40, 0x00, 0x40, 0x06, 0x92, 0x62, 0xc6, 0x12, 0x00,
        0x01, 0xc6, 0x12, 0x00, 0x02,
    ];

    fn datagram() -> Vec<u8> {
        let mut b = HEADER.to_vec();
        b.extend_from_slice(&[0xaa; 20]);
        b
    }

    #[test]
    fn parse_header() {
        let b = datagram();
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum());
        let r = Ipv4Repr::parse(&p, &ChecksumCaps::software()).unwrap();
        assert_eq!(r.src_addr, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(r.dst_addr, Ipv4Addr::new(198, 18, 0, 2));
        assert_eq!(r.protocol, IpProtocol::Tcp);
        assert_eq!(r.payload_len, 20);
        assert_eq!(
            (r.ttl, r.ident, r.dont_frag, r.is_fragment()),
            (64, 0x1c46, true, false)
        );
        assert_eq!(p.payload(), &[0xaa; 20]);
        let mut out = vec![0u8; r.buffer_len()];
        r.emit(
            &mut Ipv4Packet::new_unchecked(&mut out[..]),
            &ChecksumCaps::software(),
        );
        assert_eq!(&out[..20], &HEADER[..]);
    }

    #[test]
    fn rfc791_3_1_bad_checksum_rejected_unless_offloaded() {
        let mut b = datagram();
        b[11] ^= 1;
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&p, &ChecksumCaps::software()), Err(Error));
        assert!(Ipv4Repr::parse(&p, &ChecksumCaps::offloaded()).is_ok());
    }

    #[test]
    fn rfc791_3_1_version_must_be_4() {
        let mut b = datagram();
        b[0] = 0x65;
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&p, &ChecksumCaps::offloaded()), Err(Error));
    }

    #[test]
    fn rfc791_3_1_ihl_below_5_rejected() {
        for ihl in 0..5u8 {
            let mut b = datagram();
            b[0] = 0x40 | ihl;
            assert_eq!(Ipv4Packet::new_checked(&b[..]), Err(Error), "ihl {ihl}");
        }
    }

    #[test]
    fn rfc791_3_1_total_length_below_header_rejected() {
        let mut b = datagram();
        b[0] = 0x46; // 24-byte header
        b[2] = 0;
        b[3] = 22; // total 22 < 24
        assert_eq!(Ipv4Packet::new_checked(&b[..]), Err(Error));
        b[3] = 19;
        b[0] = 0x45;
        assert_eq!(Ipv4Packet::new_checked(&b[..]), Err(Error));
    }

    #[test]
    fn total_length_beyond_buffer_rejected() {
        let b = datagram();
        assert_eq!(Ipv4Packet::new_checked(&b[..39]), Err(Error));
    }

    #[test]
    fn ihl_beyond_buffer_rejected() {
        let mut b = HEADER.to_vec();
        b[0] = 0x4f; // 60-byte header in a 20-byte buffer
        assert_eq!(Ipv4Packet::new_checked(&b[..]), Err(Error));
    }

    #[test]
    fn rfc791_3_1_source_route_options_found_and_bad_lengths_rejected() {
        let routed = |o: &[u8]| options_source_routed(o);
        assert_eq!(routed(&[]), Ok(false));
        assert_eq!(routed(&[1, 1, 1, 0]), Ok(false));
        // Record route (7), then EOL: whatever follows EOL is padding.
        assert_eq!(routed(&[7, 7, 4, 0, 0, 0, 0, 0, 131, 0, 0, 0]), Ok(false));
        assert_eq!(routed(&[131, 7, 4, 1, 2, 3, 4, 0]), Ok(true));
        assert_eq!(routed(&[1, 137, 7, 4, 1, 2, 3, 4]), Ok(true));
        // After another option.
        assert_eq!(routed(&[7, 3, 4, 131, 3, 4, 0, 0]), Ok(true));
        // A length below 2, past the list, or missing.
        assert_eq!(routed(&[68, 1, 0, 0]), Err(Error));
        assert_eq!(routed(&[68, 0, 0, 0]), Err(Error));
        assert_eq!(routed(&[7, 9, 4, 0]), Err(Error));
        assert_eq!(routed(&[1, 1, 1, 7]), Err(Error));
        let mut b = vec![
            0x46, 0, 0, 24, 0, 0, 0x40, 0, 64, 6, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8,
        ];
        b.extend_from_slice(&[137, 3, 4, 0]);
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.source_routed(), Ok(true));
    }

    #[test]
    fn ethernet_padding_excluded_from_payload() {
        // A 40-byte datagram padded to the 46-byte Ethernet minimum.
        let mut b = datagram();
        b.extend_from_slice(&[0u8; 6]);
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.payload().len(), 20);
        let r = Ipv4Repr::parse(&p, &ChecksumCaps::software()).unwrap();
        assert_eq!(r.payload_len, 20);
    }

    #[test]
    fn rfc791_3_1_options_skipped_by_ihl() {
        // IHL 6 with a 4-byte option (NOP NOP NOP EOL); payload starts after it.
        let mut b = HEADER.to_vec();
        b[0] = 0x46;
        b.extend_from_slice(&[1, 1, 1, 0]);
        b.extend_from_slice(&[0xbb; 16]);
        let mut p = Ipv4Packet::new_unchecked(&mut b[..]);
        p.fill_checksum();
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.header_len(), 24);
        assert_eq!(p.options(), &[1, 1, 1, 0]);
        assert_eq!(p.payload(), &[0xbb; 16]);
        let r = Ipv4Repr::parse(&p, &ChecksumCaps::software()).unwrap();
        assert_eq!(r.payload_len, 16);
    }

    #[test]
    fn rfc791_3_2_fragments_detected() {
        for (flg, off, frag) in [
            (0x40u8, 0u8, false),
            (0x20, 0, true),
            (0x00, 0xb9, true),
            (0x20, 0xb9, true),
        ] {
            let mut b = datagram();
            b[6] = flg;
            b[7] = off;
            let mut p = Ipv4Packet::new_unchecked(&mut b[..]);
            p.fill_checksum();
            let p = Ipv4Packet::new_checked(&b[..]).unwrap();
            let r = Ipv4Repr::parse(&p, &ChecksumCaps::software()).unwrap();
            assert_eq!(r.is_fragment(), frag);
            assert_eq!(p.is_fragment(), frag);
            assert_eq!(r.frag_offset, u16::from(off) * 8);
        }
    }

    #[test]
    fn dscp_ecn_fields() {
        let mut b = datagram();
        b[1] = (46 << 2) | 0b10; // EF, ECT(0)
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.dscp(), p.ecn()), (46, 2));
    }

    #[test]
    fn rfc1624_decrement_ttl_keeps_checksum_valid() {
        let mut b = datagram();
        let mut p = Ipv4Packet::new_unchecked(&mut b[..]);
        for expect in (0..64u8).rev() {
            assert_eq!(p.decrement_ttl(), expect);
            assert!(p.verify_checksum());
        }
    }

    #[test]
    fn truncated_every_length() {
        let b = datagram();
        for n in 0..b.len() {
            let res = Ipv4Packet::new_checked(&b[..n])
                .and_then(|p| Ipv4Repr::parse(&p, &ChecksumCaps::software()));
            assert_eq!(res, Err(Error), "len {n}");
        }
    }

    #[test]
    fn quoted_header_parse() {
        let b = datagram();
        // Only the header + 8 bytes are quoted.
        let (r, rest) = Ipv4Repr::parse_quoted(&b[..28]).unwrap();
        assert_eq!(r.payload_len, 20);
        assert_eq!(rest, &b[20..28]);
        // Quote longer than the original datagram is bounded by Total Length.
        let mut long = b.clone();
        long.extend_from_slice(&[0; 8]);
        assert_eq!(Ipv4Repr::parse_quoted(&long).unwrap().1.len(), 20);
        for n in 0..20 {
            assert!(Ipv4Repr::parse_quoted(&b[..n]).is_err());
        }
        let mut bad = b.clone();
        bad[0] = 0x44;
        assert!(Ipv4Repr::parse_quoted(&bad).is_err());
    }

    #[test]
    fn protocol_values() {
        for v in 0..=255u8 {
            assert_eq!(u8::from(IpProtocol::from(v)), v);
        }
    }

    #[test]
    fn cidr_basics() {
        let c: Ipv4Cidr = "198.18.3.7/22".parse().unwrap();
        assert_eq!(c.network().to_string(), "198.18.0.0/22");
        assert_eq!(c.netmask(), Ipv4Addr::new(255, 255, 252, 0));
        assert_eq!(c.broadcast(), Ipv4Addr::new(198, 18, 3, 255));
        assert!(c.contains_addr(Ipv4Addr::new(198, 18, 0, 1)));
        assert!(!c.contains_addr(Ipv4Addr::new(198, 18, 4, 0)));
        let any: Ipv4Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(any.contains_addr(Ipv4Addr::new(255, 255, 255, 255)));
        assert!(any.contains_subnet(&c));
        assert!(!c.contains_subnet(&any));
        let host = Ipv4Cidr::new(Ipv4Addr::new(198, 18, 0, 1), 32).unwrap();
        assert!(host.contains_addr(Ipv4Addr::new(198, 18, 0, 1)));
        assert!(!host.contains_addr(Ipv4Addr::new(198, 18, 0, 2)));
        assert!(Ipv4Cidr::new(Ipv4Addr::UNSPECIFIED, 33).is_err());
        for bad in [
            "198.18.0.0",
            "198.18.0.0/",
            "198.18.0.0/33",
            "198.18.0/8",
            "x/1",
            "1.2.3.4/+1",
        ] {
            assert!(bad.parse::<Ipv4Cidr>().is_err(), "{bad}");
        }
    }

    fn arb_repr() -> impl Strategy<Value = Ipv4Repr> {
        (
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            any::<u8>(),
            0usize..1500,
            any::<u8>(),
            0u8..64,
            0u8..4,
            any::<u16>(),
            any::<bool>(),
            any::<bool>(),
            0u16..0x2000,
        )
            .prop_map(
                |(s, d, p, len, ttl, dscp, ecn, ident, df, mf, off)| Ipv4Repr {
                    src_addr: s.into(),
                    dst_addr: d.into(),
                    protocol: p.into(),
                    payload_len: len,
                    ttl,
                    dscp,
                    ecn,
                    ident,
                    dont_frag: df,
                    more_frags: mf,
                    frag_offset: off << 3,
                },
            )
    }

    proptest! {
        #[test]
        fn roundtrip(repr in arb_repr()) {
            let mut buf = vec![0u8; repr.buffer_len()];
            repr.emit(&mut Ipv4Packet::new_unchecked(&mut buf[..]), &ChecksumCaps::software());
            let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
            prop_assert_eq!(Ipv4Repr::parse(&p, &ChecksumCaps::software()).unwrap(), repr);
            prop_assert_eq!(p.payload().len(), repr.payload_len);
        }

        #[test]
        fn cidr_contains_matches_network(a in any::<u32>(), b in any::<u32>(), len in 0u8..=32) {
            let c = Ipv4Cidr::new(Ipv4Addr::from_bits(a), len).unwrap();
            let inside = c.contains_addr(Ipv4Addr::from_bits(b));
            let same_net = Ipv4Cidr::new(Ipv4Addr::from_bits(b), len).unwrap().network() == c.network();
            prop_assert_eq!(inside, same_net);
        }
    }
}
