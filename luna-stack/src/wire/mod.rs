//! Wire formats: zero-copy `Packet` views and `Repr` high-level forms (smoltcp style).
//!
//! A `Packet<T: AsRef<[u8]>>` wraps a buffer; after `check_len` succeeds no accessor panics.
//! `Repr::parse` validates and converts, `Repr::emit` writes, `Repr::buffer_len` sizes.
//! Checksum work is governed by [`ChecksumCaps`] so NIC offload can skip software sums.
//!
//! Layering contract: each `Repr::parse` expects its packet buffer to span exactly that
//! layer's bytes as bounded by the layer below (the IPv4 payload is bounded by Total Length,
//! not by the frame, so Ethernet padding never reaches TCP/UDP/ICMP). IPv4 fragments are
//! detected, not reassembled: drop them before parsing the transport header.
//!
//! Implemented: Ethernet II, ARP (Ethernet/IPv4), IPv4 (options skipped), ICMPv4 (echo,
//! destination unreachable, time exceeded; others passed through), TCP with MSS, window
//! scale, SACK-permitted, SACK and timestamps, UDP. Omitted: VLAN tags, IPv6, IPv4 option
//! interpretation, fragment reassembly, TCP-AO/MD5 and other options (skipped by length).
//!
//! ```
//! use luna_stack::wire::SeqNum;
//! use luna_stack::wire::*;
//!
//! let caps = ChecksumCaps::software();
//! let (src, dst) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
//!
//! // TX, zero-copy style: headers in one buffer, payload elsewhere.
//! let payload = b"hello";
//! let tcp = TcpRepr { src_port: 40000, dst_port: 80, seq: SeqNum(1), ack: SeqNum(0),
//!                     flags: TcpFlags::SYN, window: 1024, ..TcpRepr::default() };
//! let ip = Ipv4Repr::new(src, dst, IpProtocol::Tcp, tcp.buffer_len(payload.len()));
//! let mut hdr = vec![0u8; ethernet::HEADER_LEN + ip.header_len() + tcp.header_len()];
//! let mut frame = EthernetFrame::new_unchecked(&mut hdr[..]);
//! EthernetRepr { src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
//!                dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
//!                ethertype: EtherType::Ipv4 }.emit(&mut frame);
//! let ip_hdr = &mut frame.payload_mut()[..];
//! ip.emit(&mut Ipv4Packet::new_unchecked(&mut ip_hdr[..20]), &caps);
//! let mut sum = checksum::Accumulator::new();
//! sum.add_bytes(payload); // one call per payload chunk
//! tcp.emit_split(&mut TcpPacket::new_unchecked(&mut ip_hdr[20..]), src, dst, &sum, &caps);
//!
//! // RX: each layer bounds the next.
//! let wire_bytes = [&hdr[..], &payload[..]].concat();
//! let frame = EthernetFrame::new_checked(&wire_bytes[..]).unwrap();
//! assert_eq!(EthernetRepr::parse(&frame).unwrap().ethertype, EtherType::Ipv4);
//! let ipp = Ipv4Packet::new_checked(frame.payload()).unwrap();
//! let ip_rx = Ipv4Repr::parse(&ipp, &caps).unwrap();
//! assert!(!ip_rx.is_fragment());
//! let tcpp = TcpPacket::new_checked(ipp.payload()).unwrap();
//! let tcp_rx = TcpRepr::parse(&tcpp, ip_rx.src_addr, ip_rx.dst_addr, &caps).unwrap();
//! assert_eq!(tcp_rx, tcp);
//! assert_eq!(tcpp.payload(), b"hello");
//! ```

use core::fmt;

pub mod arp;
pub mod checksum;
pub mod ethernet;
pub mod icmpv4;
pub mod ipv4;
pub mod tcp;
pub mod udp;

#[cfg(test)]
mod captured_tests;

pub use arp::{ArpOperation, ArpPacket, ArpRepr};
pub use ethernet::{EtherType, EthernetAddress, EthernetFrame, EthernetRepr};
pub use icmpv4::{
    Icmpv4DstUnreachable, Icmpv4Message, Icmpv4Packet, Icmpv4Quote, Icmpv4Repr, Icmpv4TimeExceeded,
};
pub use ipv4::{IpProtocol, Ipv4Addr, Ipv4Cidr, Ipv4Packet, Ipv4Repr};
pub use tcp::{
    SackBlocks, SeqNum, TcpFlags, TcpOption, TcpOptionIter, TcpOptions, TcpPacket, TcpRepr,
    Timestamps,
};
pub use udp::{UdpPacket, UdpRepr};

/// A malformed or truncated packet. Deliberately opaque: callers drop and count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Error;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("malformed packet")
    }
}

impl std::error::Error for Error {}

/// Result of wire parsing.
pub type Result<T> = core::result::Result<T, Error>;

/// What the software must do about one checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Checksum {
    /// Verify on receive and compute on transmit (no offload).
    #[default]
    Both,
    /// The NIC verified it on receive; still compute on transmit.
    Rx,
    /// The NIC fills it on transmit; still verify on receive.
    Tx,
    /// The NIC does both.
    None,
}

impl Checksum {
    /// Whether software verifies this checksum on receive.
    pub fn rx(self) -> bool {
        matches!(self, Checksum::Both | Checksum::Tx)
    }

    /// Whether software computes this checksum on transmit.
    pub fn tx(self) -> bool {
        matches!(self, Checksum::Both | Checksum::Rx)
    }
}

/// Checksum offload capabilities of the device, per protocol.
///
/// When transmit is offloaded, emit leaves what the NIC expects in the field (the DPDK
/// convention): 0 for the IPv4 header checksum, the folded pseudo-header sum for TCP and
/// UDP, 0 for ICMPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChecksumCaps {
    /// IPv4 header checksum.
    pub ipv4: Checksum,
    /// TCP checksum.
    pub tcp: Checksum,
    /// UDP checksum.
    pub udp: Checksum,
    /// ICMPv4 checksum.
    pub icmpv4: Checksum,
}

impl ChecksumCaps {
    /// Software does all checksums (no offload).
    pub fn software() -> Self {
        Self::default()
    }

    /// The device does all checksums: software neither verifies nor computes.
    pub fn offloaded() -> Self {
        ChecksumCaps {
            ipv4: Checksum::None,
            tcp: Checksum::None,
            udp: Checksum::None,
            icmpv4: Checksum::None,
        }
    }
}
