//! The Internet checksum (RFC 1071) and its incremental update (RFC 1624).
//!
//! Sums here are *folded, not complemented*: a 16-bit ones-complement sum that callers
//! combine freely. The value that goes into a header is `!sum`. A header and a payload that
//! live in separate buffers (TX path: header in one buffer, payload in a chain of zero-copy
//! buffers) are summed with an [`Accumulator`], which handles chunks of odd length.

use core::net::Ipv4Addr;

/// Fold a wide ones-complement accumulator down to 16 bits.
///
/// RFC 1071 §2(C): carries out of bit 15 are added back in ("end-around carry"); because
/// 2^16 ≡ 1 (mod 2^16 - 1) a sum of 32- or 64-bit words folds to the same 16-bit sum.
#[inline]
fn fold(mut acc: u64) -> u16 {
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    acc as u16
}

/// Sum `bytes` as native-endian words into a wide accumulator.
///
/// RFC 1071 §2(B): the sum is byte-order independent up to a final byte swap, so we add
/// native-endian 32-bit words (which LLVM vectorizes) and swap once at the end. A u64
/// accumulator of u32 words cannot overflow below 16 GiB of input.
#[inline]
fn sum_native(bytes: &[u8]) -> u64 {
    let mut chunks = bytes.chunks_exact(4);
    let mut acc: u64 = 0;
    for c in &mut chunks {
        acc += u64::from(u32::from_ne_bytes([c[0], c[1], c[2], c[3]]));
    }
    let rest = chunks.remainder();
    let mut tail = [0u8; 4];
    tail[..rest.len()].copy_from_slice(rest);
    // RFC 1071 §4.1: an odd trailing byte is padded with a zero byte on the right.
    acc + u64::from(u32::from_ne_bytes(tail))
}

/// The folded (not complemented) ones-complement sum of `bytes` as big-endian 16-bit words.
///
/// An odd final byte is padded with zero (RFC 1071 §4.1).
pub fn data(bytes: &[u8]) -> u16 {
    let native = fold(sum_native(bytes));
    if cfg!(target_endian = "little") {
        native.swap_bytes()
    } else {
        native
    }
}

/// Ones-complement addition of two folded sums.
#[inline]
pub fn add(a: u16, b: u16) -> u16 {
    let (s, carry) = a.overflowing_add(b);
    s.wrapping_add(u16::from(carry))
}

/// Ones-complement sum of several folded sums (each of an even-length, even-aligned part).
pub fn combine(sums: &[u16]) -> u16 {
    sums.iter().fold(0, |acc, &s| add(acc, s))
}

/// The folded sum of the IPv4 pseudo-header (RFC 9293 §3.1, RFC 768): source, destination,
/// zero, protocol, and the transport length (header + payload).
pub fn pseudo_header_v4(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, length: u32) -> u16 {
    let s = src.octets();
    let d = dst.octets();
    let acc = u64::from(u16::from_be_bytes([s[0], s[1]]))
        + u64::from(u16::from_be_bytes([s[2], s[3]]))
        + u64::from(u16::from_be_bytes([d[0], d[1]]))
        + u64::from(u16::from_be_bytes([d[2], d[3]]))
        + u64::from(protocol)
        // The TCP/UDP length is 16 bits on the wire; larger values (not representable in an
        // IPv4 datagram anyway) are still summed consistently.
        + u64::from(length);
    fold(acc)
}

/// A streaming checksum over data that arrives in chunks of any length.
///
/// RFC 1071 §2(B): a chunk that starts at an odd offset of the whole message contributes
/// its own sum byte-swapped, so each chunk is summed independently and no bytes are copied
/// to re-align odd boundaries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Accumulator {
    sum: u16,
    len: usize,
}

impl Accumulator {
    /// An empty accumulator.
    pub const fn new() -> Self {
        Accumulator { sum: 0, len: 0 }
    }

    /// Append `bytes` to the message.
    pub fn add_bytes(&mut self, bytes: &[u8]) {
        self.add_sum(data(bytes), bytes.len());
    }

    /// Append a chunk of `len` bytes whose sum (as if it started at offset 0) is already
    /// known, e.g. cached with a zero-copy buffer at write time.
    pub fn add_sum(&mut self, sum: u16, len: usize) {
        let sum = if self.len % 2 == 1 {
            sum.swap_bytes()
        } else {
            sum
        };
        self.sum = add(self.sum, sum);
        self.len = self.len.wrapping_add(len);
    }

    /// Add a sum that is not part of the message bytes (e.g. the pseudo-header). Position
    /// independent: only even-aligned 16-bit quantities may be added this way.
    pub fn add_word_sum(&mut self, sum: u16) {
        self.sum = add(self.sum, sum);
    }

    /// Bytes of message appended so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No message bytes appended yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The folded, uncomplemented sum.
    pub fn sum(&self) -> u16 {
        self.sum
    }

    /// The value to store in a checksum field: the complement of the sum.
    pub fn checksum(&self) -> u16 {
        !self.sum
    }
}

/// Update a checksum after one 16-bit field changed from `old` to `new`, without summing
/// the packet again.
///
/// RFC 1624 §3 eqn. 3: `HC' = ~(~HC + ~m + m')`. Unlike eqn. 2 of RFC 1141 this never
/// produces the -0 (0x0000) result from a non-zero sum.
pub fn update16(checksum: u16, old: u16, new: u16) -> u16 {
    !add(add(!checksum, !old), new)
}

/// Update a checksum after one 32-bit field (e.g. an IPv4 address or a sequence number)
/// changed from `old` to `new` (RFC 1624 §3, applied to both halves).
pub fn update32(checksum: u16, old: u32, new: u32) -> u16 {
    let c = update16(checksum, (old >> 16) as u16, (new >> 16) as u16);
    update16(c, old as u16, new as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The obvious big-endian word-at-a-time reference, to check the fast path against.
    fn reference(bytes: &[u8]) -> u16 {
        let mut acc: u32 = 0;
        for pair in bytes.chunks(2) {
            let w = if pair.len() == 2 {
                u16::from_be_bytes([pair[0], pair[1]])
            } else {
                u16::from_be_bytes([pair[0], 0])
            };
            acc += u32::from(w);
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc as u16
    }

    #[test]
    fn rfc1071_3_example() {
        // RFC 1071 §3: bytes 00 01 f2 03 f4 f5 f6 f7 sum to ddf2.
        let bytes = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(data(&bytes), 0xddf2);
        assert_eq!(reference(&bytes), 0xddf2);
    }

    #[test]
    fn rfc1071_4_1_odd_byte_padded() {
        assert_eq!(data(&[0xab]), 0xab00);
        assert_eq!(data(&[0x01, 0x02, 0x03]), 0x0402);
        assert_eq!(data(&[]), 0);
    }

    #[test]
    fn known_ipv4_header_checksum() {
        // A classic example header (checksum field zeroed); its checksum is 0xb861.
        let hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(!data(&hdr), 0xb861);
    }

    #[test]
    fn pseudo_header_matches_bytes() {
        let src = Ipv4Addr::new(198, 18, 0, 1);
        let dst = Ipv4Addr::new(198, 18, 1, 2);
        let bytes = [198, 18, 0, 1, 198, 18, 1, 2, 0, 6, 0x05, 0xdc];
        assert_eq!(pseudo_header_v4(src, dst, 6, 1500), data(&bytes));
    }

    #[test]
    fn accumulator_odd_chunks_match_contiguous() {
        let msg: Vec<u8> = (0u8..=200).collect();
        let mut acc = Accumulator::new();
        acc.add_bytes(&msg[..3]);
        acc.add_bytes(&msg[3..4]);
        acc.add_bytes(&msg[4..101]);
        acc.add_bytes(&[]);
        acc.add_bytes(&msg[101..]);
        assert_eq!(acc.sum(), data(&msg));
        assert_eq!(acc.len(), msg.len());
        assert_eq!(acc.checksum(), !data(&msg));
    }

    #[test]
    fn rfc1624_update_matches_recompute() {
        // RFC 1624 §4 example: HC = 0xdd2f, m = 0x5555 -> m' = 0x3285 gives HC' = 0x0000
        // by eqn. 3 (eqn. 2 of RFC 1141 would give 0xffff).
        assert_eq!(update16(0xdd2f, 0x5555, 0x3285), 0x0000);
    }

    proptest! {
        #[test]
        fn fast_sum_matches_reference(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            prop_assert_eq!(data(&bytes), reference(&bytes));
        }

        #[test]
        fn chunked_sum_matches_contiguous(
            bytes in proptest::collection::vec(any::<u8>(), 0..600),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
            cuts.sort_unstable();
            let mut acc = Accumulator::new();
            let mut start = 0;
            for c in cuts {
                acc.add_bytes(&bytes[start..c]);
                start = c;
            }
            // Also exercise add_sum with a pre-computed chunk sum.
            acc.add_sum(data(&bytes[start..]), bytes.len() - start);
            prop_assert_eq!(acc.sum(), data(&bytes));
        }

        #[test]
        fn rfc1624_incremental_equals_full(
            words in proptest::collection::vec(any::<u16>(), 1..64),
            idx in any::<usize>(),
            new in any::<u16>(),
        ) {
            let idx = idx % words.len();
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
            let before = !data(&bytes);
            let mut changed = words.clone();
            let old = changed[idx];
            changed[idx] = new;
            let bytes2: Vec<u8> = changed.iter().flat_map(|w| w.to_be_bytes()).collect();
            let full = !data(&bytes2);
            let inc = update16(before, old, new);
            // RFC 1624 §3: 0x0000 and 0xffff are the two ones-complement zeros; both verify.
            prop_assert!(inc == full || (inc == 0 && full == 0xffff) || (inc == 0xffff && full == 0));
        }

        #[test]
        fn update32_equals_full(a in any::<u32>(), b in any::<u32>(), rest in any::<[u8; 6]>()) {
            let mut bytes = a.to_be_bytes().to_vec();
            bytes.extend_from_slice(&rest);
            let before = !data(&bytes);
            bytes[..4].copy_from_slice(&b.to_be_bytes());
            let full = !data(&bytes);
            let inc = update32(before, a, b);
            prop_assert!(inc == full || (inc == 0 && full == 0xffff) || (inc == 0xffff && full == 0));
        }
    }
}
