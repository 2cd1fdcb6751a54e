//! ARP over Ethernet for IPv4 (RFC 826).
//!
//! The view handles any hardware/protocol address lengths so a foreign packet is bounded
//! correctly; [`ArpRepr::parse`] accepts only Ethernet (1) / IPv4 (0x0800) with 6/4-byte
//! addresses and rejects the rest.

use super::ethernet::{EtherType, EthernetAddress};
use super::{Error, Result};
use core::net::Ipv4Addr;

/// ARP hardware type for Ethernet (RFC 826, `ar$hrd`).
pub const HTYPE_ETHERNET: u16 = 1;

/// The ARP opcode (`ar$op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArpOperation {
    /// 1: request.
    Request,
    /// 2: reply.
    Reply,
    /// Anything else (RARP, InARP, ...), passed through for the caller to drop.
    Unknown(u16),
}

impl From<u16> for ArpOperation {
    fn from(v: u16) -> Self {
        match v {
            1 => ArpOperation::Request,
            2 => ArpOperation::Reply,
            other => ArpOperation::Unknown(other),
        }
    }
}

impl From<ArpOperation> for u16 {
    fn from(op: ArpOperation) -> u16 {
        match op {
            ArpOperation::Request => 1,
            ArpOperation::Reply => 2,
            ArpOperation::Unknown(v) => v,
        }
    }
}

mod field {
    use core::ops::Range;
    pub const HTYPE: Range<usize> = 0..2;
    pub const PTYPE: Range<usize> = 2..4;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: Range<usize> = 6..8;
    pub const FIXED_END: usize = 8;

    // Variable layout after the fixed part: SHA, SPA, THA, TPA.
    pub const fn sha(hlen: u8, _plen: u8) -> Range<usize> {
        let s = FIXED_END;
        s..s + hlen as usize
    }
    pub const fn spa(hlen: u8, plen: u8) -> Range<usize> {
        let s = sha(hlen, plen).end;
        s..s + plen as usize
    }
    pub const fn tha(hlen: u8, plen: u8) -> Range<usize> {
        let s = spa(hlen, plen).end;
        s..s + hlen as usize
    }
    pub const fn tpa(hlen: u8, plen: u8) -> Range<usize> {
        let s = tha(hlen, plen).end;
        s..s + plen as usize
    }
}

/// Length of an Ethernet/IPv4 ARP packet.
pub const ETHERNET_IPV4_LEN: usize = 28;

/// A view of an ARP packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    /// Wrap without checking; accessors may panic until [`check_len`](Self::check_len) passes.
    pub const fn new_unchecked(buffer: T) -> Self {
        ArpPacket { buffer }
    }

    /// Wrap and validate the length.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// The buffer holds the fixed part and all four addresses of the lengths it declares.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < field::FIXED_END {
            return Err(Error);
        }
        let end = field::tpa(b[field::HLEN], b[field::PLEN]).end;
        if b.len() < end {
            return Err(Error);
        }
        Ok(())
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn u16_at(&self, r: core::ops::Range<usize>) -> u16 {
        let b = &self.buffer.as_ref()[r];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// Hardware type (`ar$hrd`).
    pub fn hardware_type(&self) -> u16 {
        self.u16_at(field::HTYPE)
    }

    /// Protocol type (`ar$pro`), an EtherType value.
    pub fn protocol_type(&self) -> EtherType {
        EtherType::from(self.u16_at(field::PTYPE))
    }

    /// Hardware address length (`ar$hln`).
    pub fn hardware_len(&self) -> u8 {
        self.buffer.as_ref()[field::HLEN]
    }

    /// Protocol address length (`ar$pln`).
    pub fn protocol_len(&self) -> u8 {
        self.buffer.as_ref()[field::PLEN]
    }

    /// Opcode (`ar$op`).
    pub fn operation(&self) -> ArpOperation {
        ArpOperation::from(self.u16_at(field::OPER))
    }

    /// Sender hardware address bytes (`ar$sha`).
    pub fn sender_hardware_addr(&self) -> &[u8] {
        &self.buffer.as_ref()[field::sha(self.hardware_len(), self.protocol_len())]
    }

    /// Sender protocol address bytes (`ar$spa`).
    pub fn sender_protocol_addr(&self) -> &[u8] {
        &self.buffer.as_ref()[field::spa(self.hardware_len(), self.protocol_len())]
    }

    /// Target hardware address bytes (`ar$tha`).
    pub fn target_hardware_addr(&self) -> &[u8] {
        &self.buffer.as_ref()[field::tha(self.hardware_len(), self.protocol_len())]
    }

    /// Target protocol address bytes (`ar$tpa`).
    pub fn target_protocol_addr(&self) -> &[u8] {
        &self.buffer.as_ref()[field::tpa(self.hardware_len(), self.protocol_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ArpPacket<T> {
    fn set_u16_at(&mut self, r: core::ops::Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }

    /// Set the hardware type.
    pub fn set_hardware_type(&mut self, v: u16) {
        self.set_u16_at(field::HTYPE, v);
    }

    /// Set the protocol type.
    pub fn set_protocol_type(&mut self, v: EtherType) {
        self.set_u16_at(field::PTYPE, v.into());
    }

    /// Set the hardware address length.
    pub fn set_hardware_len(&mut self, v: u8) {
        self.buffer.as_mut()[field::HLEN] = v;
    }

    /// Set the protocol address length.
    pub fn set_protocol_len(&mut self, v: u8) {
        self.buffer.as_mut()[field::PLEN] = v;
    }

    /// Set the opcode.
    pub fn set_operation(&mut self, op: ArpOperation) {
        self.set_u16_at(field::OPER, op.into());
    }

    /// Set the sender hardware address (length must equal `hardware_len`).
    pub fn set_sender_hardware_addr(&mut self, a: &[u8]) {
        let r = field::sha(self.hardware_len(), self.protocol_len());
        self.buffer.as_mut()[r].copy_from_slice(a);
    }

    /// Set the sender protocol address (length must equal `protocol_len`).
    pub fn set_sender_protocol_addr(&mut self, a: &[u8]) {
        let r = field::spa(self.hardware_len(), self.protocol_len());
        self.buffer.as_mut()[r].copy_from_slice(a);
    }

    /// Set the target hardware address (length must equal `hardware_len`).
    pub fn set_target_hardware_addr(&mut self, a: &[u8]) {
        let r = field::tha(self.hardware_len(), self.protocol_len());
        self.buffer.as_mut()[r].copy_from_slice(a);
    }

    /// Set the target protocol address (length must equal `protocol_len`).
    pub fn set_target_protocol_addr(&mut self, a: &[u8]) {
        let r = field::tpa(self.hardware_len(), self.protocol_len());
        self.buffer.as_mut()[r].copy_from_slice(a);
    }
}

/// A parsed Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpRepr {
    /// Opcode.
    pub operation: ArpOperation,
    /// Sender MAC.
    pub sender_hardware_addr: EthernetAddress,
    /// Sender IPv4 address.
    pub sender_protocol_addr: Ipv4Addr,
    /// Target MAC (ignored in requests, conventionally zero).
    pub target_hardware_addr: EthernetAddress,
    /// Target IPv4 address.
    pub target_protocol_addr: Ipv4Addr,
}

fn ipv4(b: &[u8]) -> Result<Ipv4Addr> {
    let a: [u8; 4] = b.try_into().map_err(|_| Error)?;
    Ok(Ipv4Addr::from(a))
}

impl ArpRepr {
    /// Parse; only Ethernet/IPv4 ARP is accepted.
    pub fn parse<T: AsRef<[u8]>>(packet: &ArpPacket<T>) -> Result<Self> {
        packet.check_len()?;
        // RFC 826 "Packet Reception": a packet whose ar$hrd / ar$pro we do not speak is
        // discarded; the lengths must match the types.
        if packet.hardware_type() != HTYPE_ETHERNET
            || packet.protocol_type() != EtherType::Ipv4
            || packet.hardware_len() != 6
            || packet.protocol_len() != 4
        {
            return Err(Error);
        }
        Ok(ArpRepr {
            operation: packet.operation(),
            sender_hardware_addr: EthernetAddress::from_bytes(packet.sender_hardware_addr())?,
            sender_protocol_addr: ipv4(packet.sender_protocol_addr())?,
            target_hardware_addr: EthernetAddress::from_bytes(packet.target_hardware_addr())?,
            target_protocol_addr: ipv4(packet.target_protocol_addr())?,
        })
    }

    /// Bytes needed to emit (28).
    pub const fn buffer_len(&self) -> usize {
        ETHERNET_IPV4_LEN
    }

    /// Write the packet.
    ///
    /// # Panics
    /// If the buffer is shorter than [`buffer_len`](Self::buffer_len) (a caller bug).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut ArpPacket<T>) {
        packet.set_hardware_type(HTYPE_ETHERNET);
        packet.set_protocol_type(EtherType::Ipv4);
        packet.set_hardware_len(6);
        packet.set_protocol_len(4);
        packet.set_operation(self.operation);
        packet.set_sender_hardware_addr(&self.sender_hardware_addr.0);
        packet.set_sender_protocol_addr(&self.sender_protocol_addr.octets());
        packet.set_target_hardware_addr(&self.target_hardware_addr.0);
        packet.set_target_protocol_addr(&self.target_protocol_addr.octets());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // "Who has 198.18.0.2? Tell 198.18.0.1" from 52:54:00:12:34:56.
    const REQUEST: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 198,
        18, 0, 1, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 198, 18, 0, 2,
    ];

    #[test]
    fn parse_request() {
        let p = ArpPacket::new_checked(&REQUEST[..]).unwrap();
        let r = ArpRepr::parse(&p).unwrap();
        assert_eq!(r.operation, ArpOperation::Request);
        assert_eq!(r.sender_hardware_addr.to_string(), "52:54:00:12:34:56");
        assert_eq!(r.sender_protocol_addr, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(r.target_hardware_addr, EthernetAddress([0; 6]));
        assert_eq!(r.target_protocol_addr, Ipv4Addr::new(198, 18, 0, 2));
        let mut out = [0u8; 28];
        r.emit(&mut ArpPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, REQUEST);
    }

    #[test]
    fn ethernet_padding_after_packet_is_ignored() {
        let mut b = REQUEST.to_vec();
        b.extend_from_slice(&[0u8; 18]); // padded to the 46-byte minimum payload
        let p = ArpPacket::new_checked(&b[..]).unwrap();
        assert!(ArpRepr::parse(&p).is_ok());
    }

    #[test]
    fn rfc826_reject_other_types() {
        for (idx, val) in [(1usize, 6u8), (2, 0x86), (4, 8), (5, 16)] {
            let mut b = REQUEST;
            b[idx] = val;
            let res = ArpPacket::new_checked(&b[..]).and_then(|p| ArpRepr::parse(&p));
            assert_eq!(res, Err(Error), "byte {idx} = {val}");
        }
    }

    #[test]
    fn foreign_lengths_are_bounded() {
        // hlen 255, plen 255: the view must not read past the buffer.
        let mut b = REQUEST;
        b[4] = 255;
        b[5] = 255;
        assert_eq!(ArpPacket::new_checked(&b[..]), Err(Error));
    }

    #[test]
    fn unknown_operation_passes_through() {
        let mut b = REQUEST;
        b[7] = 3; // RARP request
        let r = ArpRepr::parse(&ArpPacket::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.operation, ArpOperation::Unknown(3));
    }

    #[test]
    fn truncated_every_length() {
        for n in 0..REQUEST.len() {
            let res = ArpPacket::new_checked(&REQUEST[..n]).and_then(|p| ArpRepr::parse(&p));
            assert_eq!(res, Err(Error), "len {n}");
        }
    }

    proptest! {
        #[test]
        fn roundtrip(op in any::<u16>(), sha in any::<[u8; 6]>(), spa in any::<[u8; 4]>(),
                     tha in any::<[u8; 6]>(), tpa in any::<[u8; 4]>()) {
            let repr = ArpRepr {
                operation: op.into(),
                sender_hardware_addr: EthernetAddress(sha),
                sender_protocol_addr: spa.into(),
                target_hardware_addr: EthernetAddress(tha),
                target_protocol_addr: tpa.into(),
            };
            let mut buf = vec![0u8; repr.buffer_len()];
            repr.emit(&mut ArpPacket::new_unchecked(&mut buf[..]));
            let p = ArpPacket::new_checked(&buf[..]).unwrap();
            prop_assert_eq!(ArpRepr::parse(&p).unwrap(), repr);
        }
    }
}
