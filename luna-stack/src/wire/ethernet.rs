//! Ethernet II frames (IEEE 802.3 §3.1.1, the DIX framing RFC 894 carries IPv4 in).
//!
//! No VLAN support: an 802.1Q tag (TPID 0x8100) parses as [`EtherType::Unknown`] and the
//! caller drops it.

use super::{Error, Result};
use core::fmt;
use core::str::FromStr;

/// A 48-bit MAC address.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EthernetAddress(pub [u8; 6]);

impl EthernetAddress {
    /// ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: EthernetAddress = EthernetAddress([0xff; 6]);

    /// The address in `bytes`, which must be exactly 6 bytes long.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let a: [u8; 6] = bytes.try_into().map_err(|_| Error)?;
        Ok(EthernetAddress(a))
    }

    /// The six octets.
    pub const fn as_bytes(&self) -> &[u8; 6] {
        &self.0
    }

    /// All ones.
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// Group bit set (IEEE 802 §8.2: least significant bit of the first octet). Broadcast
    /// is a multicast address too.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }

    /// Individual (group bit clear).
    pub fn is_unicast(&self) -> bool {
        !self.is_multicast()
    }

    /// Locally administered (second least significant bit of the first octet).
    pub fn is_local(&self) -> bool {
        self.0[0] & 0x02 != 0
    }
}

impl fmt::Display for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for EthernetAddress {
    type Err = Error;

    /// Parses `aa:bb:cc:dd:ee:ff` (or with `-` separators), hex digits of either case.
    fn from_str(s: &str) -> Result<Self> {
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for o in out.iter_mut() {
            let p = parts.next().ok_or(Error)?;
            if p.is_empty() || p.len() > 2 {
                return Err(Error);
            }
            *o = u8::from_str_radix(p, 16).map_err(|_| Error)?;
        }
        if parts.next().is_some() {
            return Err(Error);
        }
        Ok(EthernetAddress(out))
    }
}

/// The EtherType field. Unknown values (including 802.1Q tags and 802.3 length fields)
/// pass through as [`EtherType::Unknown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EtherType {
    /// 0x0800.
    Ipv4,
    /// 0x0806.
    Arp,
    /// 0x86DD.
    Ipv6,
    /// Any other value.
    Unknown(u16),
}

impl From<u16> for EtherType {
    fn from(v: u16) -> Self {
        match v {
            0x0800 => EtherType::Ipv4,
            0x0806 => EtherType::Arp,
            0x86dd => EtherType::Ipv6,
            other => EtherType::Unknown(other),
        }
    }
}

impl From<EtherType> for u16 {
    fn from(t: EtherType) -> u16 {
        match t {
            EtherType::Ipv4 => 0x0800,
            EtherType::Arp => 0x0806,
            EtherType::Ipv6 => 0x86dd,
            EtherType::Unknown(v) => v,
        }
    }
}

mod field {
    use core::ops::{Range, RangeFrom};
    pub const DESTINATION: Range<usize> = 0..6;
    pub const SOURCE: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
    pub const PAYLOAD: RangeFrom<usize> = 14..;
}

/// Length of the Ethernet II header.
pub const HEADER_LEN: usize = field::PAYLOAD.start;

/// Shortest frame on the wire without FCS (IEEE 802.3 §4.4.2: 64 bytes with FCS). Received
/// frames may carry padding up to this length; upper layers bound their payload by their
/// own length fields. Transmit padding is left to the NIC.
pub const MIN_FRAME_LEN: usize = 60;

/// A view of an Ethernet II frame (without FCS, as NICs deliver it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wrap without checking; accessors may panic until [`check_len`](Self::check_len) passes.
    pub const fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }

    /// Wrap and validate the length.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let f = Self::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// The buffer holds at least the 14-byte header.
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

    /// Header length (always 14).
    pub const fn header_len() -> usize {
        HEADER_LEN
    }

    /// Frame length for a payload of `payload_len` bytes.
    pub const fn buffer_len(payload_len: usize) -> usize {
        HEADER_LEN + payload_len
    }

    /// Destination address.
    pub fn dst_addr(&self) -> EthernetAddress {
        let b = &self.buffer.as_ref()[field::DESTINATION];
        EthernetAddress([b[0], b[1], b[2], b[3], b[4], b[5]])
    }

    /// Source address.
    pub fn src_addr(&self) -> EthernetAddress {
        let b = &self.buffer.as_ref()[field::SOURCE];
        EthernetAddress([b[0], b[1], b[2], b[3], b[4], b[5]])
    }

    /// EtherType.
    pub fn ethertype(&self) -> EtherType {
        let b = &self.buffer.as_ref()[field::ETHERTYPE];
        EtherType::from(u16::from_be_bytes([b[0], b[1]]))
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> EthernetFrame<&'a T> {
    /// The payload (may include Ethernet padding: upper layers bound it by their own length).
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[field::PAYLOAD]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Set the destination address.
    pub fn set_dst_addr(&mut self, a: EthernetAddress) {
        self.buffer.as_mut()[field::DESTINATION].copy_from_slice(&a.0);
    }

    /// Set the source address.
    pub fn set_src_addr(&mut self, a: EthernetAddress) {
        self.buffer.as_mut()[field::SOURCE].copy_from_slice(&a.0);
    }

    /// Set the EtherType.
    pub fn set_ethertype(&mut self, t: EtherType) {
        self.buffer.as_mut()[field::ETHERTYPE].copy_from_slice(&u16::from(t).to_be_bytes());
    }

    /// The payload, mutably.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PAYLOAD]
    }
}

/// A parsed Ethernet II header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    /// Source address.
    pub src_addr: EthernetAddress,
    /// Destination address.
    pub dst_addr: EthernetAddress,
    /// EtherType.
    pub ethertype: EtherType,
}

impl EthernetRepr {
    /// Parse a checked frame. Never fails after `check_len`; kept fallible for uniformity.
    pub fn parse<T: AsRef<[u8]>>(frame: &EthernetFrame<T>) -> Result<Self> {
        // One bounds check for the header, the fields at constant offsets of it.
        let Some(h) = frame.buffer.as_ref().first_chunk::<HEADER_LEN>() else {
            return Err(Error);
        };
        let (dst, rest) = h.split_first_chunk::<6>().ok_or(Error)?;
        let (src, ty) = rest.split_first_chunk::<6>().ok_or(Error)?;
        let ty = ty.first_chunk::<2>().ok_or(Error)?;
        Ok(EthernetRepr {
            src_addr: EthernetAddress(*src),
            dst_addr: EthernetAddress(*dst),
            ethertype: EtherType::from(u16::from_be_bytes(*ty)),
        })
    }

    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the header.
    ///
    /// # Panics
    /// If the frame buffer is shorter than [`HEADER_LEN`] (a caller bug, never peer input).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, frame: &mut EthernetFrame<T>) {
        frame.set_src_addr(self.src_addr);
        frame.set_dst_addr(self.dst_addr);
        frame.set_ethertype(self.ethertype);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // An ARP request broadcast, as captured on a LAN (first 14 bytes: Ethernet header).
    const FRAME: [u8; 16] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x06, 0x00,
        0x01,
    ];

    #[test]
    fn parse_frame() {
        let f = EthernetFrame::new_checked(&FRAME[..]).unwrap();
        let r = EthernetRepr::parse(&f).unwrap();
        assert_eq!(r.dst_addr, EthernetAddress::BROADCAST);
        assert_eq!(
            r.src_addr,
            EthernetAddress([0x52, 0x54, 0, 0x12, 0x34, 0x56])
        );
        assert_eq!(r.ethertype, EtherType::Arp);
        assert_eq!(f.payload(), &[0x00, 0x01]);
    }

    #[test]
    fn vlan_tag_is_unknown_not_error() {
        let mut b = FRAME;
        b[12] = 0x81;
        b[13] = 0x00;
        let f = EthernetFrame::new_checked(&b[..]).unwrap();
        assert_eq!(f.ethertype(), EtherType::Unknown(0x8100));
        assert_eq!(u16::from(f.ethertype()), 0x8100);
    }

    #[test]
    fn truncated_every_length() {
        for n in 0..HEADER_LEN {
            assert_eq!(EthernetFrame::new_checked(&FRAME[..n]), Err(Error));
        }
        assert!(EthernetFrame::new_checked(&FRAME[..HEADER_LEN]).is_ok());
    }

    #[test]
    fn address_kinds_and_display() {
        let a = EthernetAddress([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
        assert!(a.is_unicast() && a.is_local() && !a.is_multicast() && !a.is_broadcast());
        assert_eq!(a.to_string(), "52:54:00:12:34:56");
        assert_eq!("52:54:00:12:34:56".parse::<EthernetAddress>(), Ok(a));
        assert_eq!("52-54-00-12-34-56".parse::<EthernetAddress>(), Ok(a));
        assert!("52:54:00:12:34".parse::<EthernetAddress>().is_err());
        assert!("52:54:00:12:34:56:78".parse::<EthernetAddress>().is_err());
        assert!("52:54:00:12:34:5g".parse::<EthernetAddress>().is_err());
        assert!("52:54:00:12:34:".parse::<EthernetAddress>().is_err());
        let m = EthernetAddress([0x01, 0x00, 0x5e, 0, 0, 1]);
        assert!(m.is_multicast() && !m.is_unicast() && !m.is_broadcast());
        assert!(EthernetAddress::BROADCAST.is_multicast());
        assert!(EthernetAddress::from_bytes(&[1, 2, 3]).is_err());
        assert_eq!(EthernetAddress::from_bytes(a.as_bytes()), Ok(a));
    }

    #[test]
    fn ethertype_values() {
        for v in [0x0800u16, 0x0806, 0x86dd, 0x8100, 0x05dc, 0] {
            assert_eq!(u16::from(EtherType::from(v)), v);
        }
        assert_eq!(EtherType::from(0x86dd), EtherType::Ipv6);
    }

    proptest! {
        #[test]
        fn roundtrip(src in any::<[u8; 6]>(), dst in any::<[u8; 6]>(), et in any::<u16>(),
                     payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let repr = EthernetRepr {
                src_addr: EthernetAddress(src),
                dst_addr: EthernetAddress(dst),
                ethertype: EtherType::from(et),
            };
            let mut buf = vec![0u8; EthernetFrame::<&[u8]>::buffer_len(payload.len())];
            let mut f = EthernetFrame::new_unchecked(&mut buf[..]);
            repr.emit(&mut f);
            f.payload_mut().copy_from_slice(&payload);
            let f = EthernetFrame::new_checked(&buf[..]).unwrap();
            prop_assert_eq!(EthernetRepr::parse(&f).unwrap(), repr);
            prop_assert_eq!(f.payload(), &payload[..]);
        }
    }
}
