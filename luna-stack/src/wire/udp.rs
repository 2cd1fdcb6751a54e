//! UDP (RFC 768).

use super::checksum::{self, Accumulator};
use super::{ChecksumCaps, Error, Result};
use core::net::Ipv4Addr;

/// IP protocol number of UDP.
pub const PROTOCOL: u8 = 17;

mod field {
    use core::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const LENGTH: Range<usize> = 4..6;
    pub const CHECKSUM: Range<usize> = 6..8;
}

/// Length of the UDP header.
pub const HEADER_LEN: usize = 8;

/// A view of a UDP datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Wrap without checking; accessors may panic until [`check_len`](Self::check_len) passes.
    pub const fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
    }

    /// Wrap and validate the lengths.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// RFC 768 "Length": counts header and data, so it is at least 8, and it must not
    /// exceed the bytes the IP layer delivered. Bytes past it are ignored.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error);
        }
        let len = usize::from(self.len());
        if len < HEADER_LEN || len > b.len() {
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

    /// Source port.
    pub fn src_port(&self) -> u16 {
        self.u16_at(field::SRC_PORT)
    }

    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        self.u16_at(field::DST_PORT)
    }

    /// Length field (header + data).
    pub fn len(&self) -> u16 {
        self.u16_at(field::LENGTH)
    }

    /// No payload (Length field at most the header size).
    pub fn is_empty(&self) -> bool {
        usize::from(self.len()) <= HEADER_LEN
    }

    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    /// RFC 768: a zero checksum means the sender computed none; otherwise the sum over
    /// pseudo-header, header and data (bounded by the Length field) is all ones.
    pub fn verify_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        if self.checksum() == 0 {
            return true;
        }
        let len = self.len();
        let data = &self.buffer.as_ref()[..usize::from(len)];
        let sum = checksum::add(
            checksum::pseudo_header_v4(src, dst, PROTOCOL, u32::from(len)),
            checksum::data(data),
        );
        sum == 0xffff
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> UdpPacket<&'a T> {
    /// The payload, bounded by the Length field.
    pub fn payload(&self) -> &'a [u8] {
        let b: &'a [u8] = self.buffer.as_ref();
        &b[HEADER_LEN..usize::from(self.len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    fn set_u16_at(&mut self, r: core::ops::Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }

    /// Set the source port.
    pub fn set_src_port(&mut self, v: u16) {
        self.set_u16_at(field::SRC_PORT, v);
    }

    /// Set the destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        self.set_u16_at(field::DST_PORT, v);
    }

    /// Set the length field.
    pub fn set_len(&mut self, v: u16) {
        self.set_u16_at(field::LENGTH, v);
    }

    /// Set the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        self.set_u16_at(field::CHECKSUM, v);
    }

    /// The payload, mutably (bounded by the Length field).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let len = usize::from(self.len());
        &mut self.buffer.as_mut()[HEADER_LEN..len]
    }

    /// Compute the checksum over header + payload (Length field bytes, contiguous).
    pub fn fill_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        self.set_checksum(0);
        let mut acc = Accumulator::new();
        acc.add_bytes(&self.buffer.as_ref()[..usize::from(self.len())]);
        self.finish_checksum(src, dst, acc);
    }

    /// Compute the checksum when this buffer holds only the 8-byte header and the payload
    /// chunks were fed to `payload`.
    pub fn fill_checksum_split(&mut self, src: Ipv4Addr, dst: Ipv4Addr, payload: &Accumulator) {
        self.set_checksum(0);
        let mut acc = Accumulator::new();
        acc.add_bytes(&self.buffer.as_ref()[..HEADER_LEN]);
        acc.add_sum(payload.sum(), payload.len());
        self.finish_checksum(src, dst, acc);
    }

    fn finish_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr, mut acc: Accumulator) {
        let len = u32::try_from(acc.len()).unwrap_or(u32::MAX);
        acc.add_word_sum(checksum::pseudo_header_v4(src, dst, PROTOCOL, len));
        // RFC 768: a computed zero is sent as all ones; zero means "no checksum".
        let c = match acc.checksum() {
            0 => 0xffff,
            c => c,
        };
        self.set_checksum(c);
    }
}

/// A parsed UDP header (the payload stays in the buffer: [`UdpPacket::payload`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
}

impl UdpRepr {
    /// Parse; `packet` is the IP payload. Verifies a non-zero checksum unless offloaded.
    pub fn parse<T: AsRef<[u8]>>(
        packet: &UdpPacket<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        caps: &ChecksumCaps,
    ) -> Result<Self> {
        packet.check_len()?;
        if caps.udp.rx() && !packet.verify_checksum(src, dst) {
            return Err(Error);
        }
        Ok(UdpRepr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
        })
    }

    /// Header length (8).
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Header plus payload length.
    pub const fn buffer_len(&self, payload_len: usize) -> usize {
        HEADER_LEN + payload_len
    }

    /// Write the header for a payload of `payload_len` bytes already in place, then the
    /// checksum (or the pseudo-header sum when offloaded).
    ///
    /// # Panics
    /// If the buffer is shorter than `buffer_len(payload_len)` or that exceeds 65535
    /// (caller bugs).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut UdpPacket<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        payload_len: usize,
        caps: &ChecksumCaps,
    ) {
        let len = u16::try_from(self.buffer_len(payload_len)).expect("UDP datagram too long");
        packet.set_src_port(self.src_port);
        packet.set_dst_port(self.dst_port);
        packet.set_len(len);
        if caps.udp.tx() {
            packet.fill_checksum(src, dst);
        } else {
            packet.set_checksum(checksum::pseudo_header_v4(
                src,
                dst,
                PROTOCOL,
                u32::from(len),
            ));
        }
    }

    /// Write the header into its own 8-byte buffer; the payload chunks were fed to
    /// `payload`.
    ///
    /// # Panics
    /// If the buffer is shorter than 8 bytes or the datagram exceeds 65535 (caller bugs).
    pub fn emit_split<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut UdpPacket<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        payload: &Accumulator,
        caps: &ChecksumCaps,
    ) {
        let len = u16::try_from(self.buffer_len(payload.len())).expect("UDP datagram too long");
        packet.set_src_port(self.src_port);
        packet.set_dst_port(self.dst_port);
        packet.set_len(len);
        if caps.udp.tx() {
            packet.fill_checksum_split(src, dst, payload);
        } else {
            packet.set_checksum(checksum::pseudo_header_v4(
                src,
                dst,
                PROTOCOL,
                u32::from(len),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SRC: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    const DST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

    // 198.18.0.1:5353 -> 198.18.0.2:53, payload "luna!"; checksum computed independently.
    const DGRAM: [u8; 13] = [
        0x14, 0xe9, 0x00, 0x35, 0x00, 0x0d, 0x00, 0x00, b'l', b'u', b'n', b'a', b'!',
    ];
    const DGRAM_CHECKSUM: u16 = 0x62b7;

    fn dgram() -> [u8; 13] {
        let mut b = DGRAM;
        b[6..8].copy_from_slice(&DGRAM_CHECKSUM.to_be_bytes());
        b
    }

    #[test]
    fn parse_datagram() {
        let b = dgram();
        let p = UdpPacket::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum(SRC, DST));
        let r = UdpRepr::parse(&p, SRC, DST, &ChecksumCaps::software()).unwrap();
        assert_eq!(
            r,
            UdpRepr {
                src_port: 5353,
                dst_port: 53
            }
        );
        assert_eq!(p.payload(), b"luna!");
        let mut out = [0u8; 13];
        out[8..].copy_from_slice(b"luna!");
        r.emit(
            &mut UdpPacket::new_unchecked(&mut out[..]),
            SRC,
            DST,
            5,
            &ChecksumCaps::software(),
        );
        assert_eq!(out, b);
    }

    #[test]
    fn rfc768_zero_checksum_means_none() {
        let mut b = dgram();
        b[6] = 0;
        b[7] = 0;
        b[9] ^= 0xff; // corrupt data: still accepted, no checksum to check
        let p = UdpPacket::new_checked(&b[..]).unwrap();
        assert!(UdpRepr::parse(&p, SRC, DST, &ChecksumCaps::software()).is_ok());
    }

    #[test]
    fn rfc768_bad_checksum_rejected_unless_offloaded() {
        let mut b = dgram();
        b[9] ^= 0xff;
        let p = UdpPacket::new_checked(&b[..]).unwrap();
        assert_eq!(
            UdpRepr::parse(&p, SRC, DST, &ChecksumCaps::software()),
            Err(Error)
        );
        assert!(UdpRepr::parse(&p, SRC, DST, &ChecksumCaps::offloaded()).is_ok());
    }

    #[test]
    fn rfc768_length_bounds() {
        // Length below the header size.
        let mut b = dgram();
        b[5] = 7;
        assert_eq!(UdpPacket::new_checked(&b[..]), Err(Error));
        // Length beyond the buffer.
        b[5] = 14;
        assert_eq!(UdpPacket::new_checked(&b[..]), Err(Error));
        // Trailing bytes past Length (e.g. link padding) are not payload.
        let mut long = dgram().to_vec();
        long.extend_from_slice(&[0; 5]);
        let p = UdpPacket::new_checked(&long[..]).unwrap();
        assert_eq!(p.payload(), b"luna!");
        assert!(UdpRepr::parse(&p, SRC, DST, &ChecksumCaps::software()).is_ok());
    }

    #[test]
    fn rfc768_computed_zero_sent_as_ones() {
        // Find a payload whose checksum computes to zero, then check it is sent as 0xffff.
        let r = UdpRepr {
            src_port: 1,
            dst_port: 2,
        };
        let mut found = false;
        for v in 0..=u16::MAX {
            let mut b = [0u8; 10];
            b[8..].copy_from_slice(&v.to_be_bytes());
            r.emit(
                &mut UdpPacket::new_unchecked(&mut b[..]),
                SRC,
                DST,
                2,
                &ChecksumCaps::software(),
            );
            let p = UdpPacket::new_checked(&b[..]).unwrap();
            assert_ne!(p.checksum(), 0);
            assert!(p.verify_checksum(SRC, DST));
            if p.checksum() == 0xffff {
                found = true;
                break;
            }
        }
        assert!(found);
    }

    #[test]
    fn split_matches_contiguous() {
        let r = UdpRepr {
            src_port: 9,
            dst_port: 10,
        };
        let payload: Vec<u8> = (0..77u8).collect();
        let mut whole = vec![0u8; r.buffer_len(payload.len())];
        whole[8..].copy_from_slice(&payload);
        r.emit(
            &mut UdpPacket::new_unchecked(&mut whole[..]),
            SRC,
            DST,
            77,
            &ChecksumCaps::software(),
        );
        let mut acc = Accumulator::new();
        acc.add_bytes(&payload[..3]);
        acc.add_bytes(&payload[3..]);
        let mut header = [0u8; 8];
        r.emit_split(
            &mut UdpPacket::new_unchecked(&mut header[..]),
            SRC,
            DST,
            &acc,
            &ChecksumCaps::software(),
        );
        assert_eq!(&header[..], &whole[..8]);
    }

    #[test]
    fn truncated_every_length() {
        let b = dgram();
        for n in 0..b.len() {
            let res = UdpPacket::new_checked(&b[..n])
                .and_then(|p| UdpRepr::parse(&p, SRC, DST, &ChecksumCaps::software()));
            assert_eq!(res, Err(Error), "len {n}");
        }
    }

    proptest! {
        #[test]
        fn roundtrip(sp in any::<u16>(), dp in any::<u16>(),
                     payload in proptest::collection::vec(any::<u8>(), 0..300),
                     src in any::<[u8; 4]>(), dst in any::<[u8; 4]>()) {
            let (src, dst) = (Ipv4Addr::from(src), Ipv4Addr::from(dst));
            let r = UdpRepr { src_port: sp, dst_port: dp };
            let mut buf = vec![0u8; r.buffer_len(payload.len())];
            buf[8..].copy_from_slice(&payload);
            r.emit(&mut UdpPacket::new_unchecked(&mut buf[..]), src, dst, payload.len(),
                   &ChecksumCaps::software());
            let p = UdpPacket::new_checked(&buf[..]).unwrap();
            prop_assert_ne!(p.checksum(), 0);
            prop_assert_eq!(UdpRepr::parse(&p, src, dst, &ChecksumCaps::software()).unwrap(), r);
            prop_assert_eq!(p.payload(), &payload[..]);
        }
    }
}
