//! TCP header (RFC 9293 §3.1) and options (RFC 9293 §3.2, RFC 7323, RFC 2018).
//!
//! [`TcpPacket`] is the zero-copy view, [`TcpRepr`] the parsed header (the payload stays in
//! the frame buffer: slice it with [`TcpPacket::payload`]). On transmit the header may be
//! written into its own buffer with [`TcpRepr::emit_header`] and the checksum completed
//! over payload chunks that live elsewhere with [`TcpPacket::fill_checksum_split`].

use super::checksum::{self, Accumulator};
use super::{ChecksumCaps, Error, Result};
use core::fmt;
use core::net::Ipv4Addr;
use core::ops::{BitOr, BitOrAssign};

mod seq;
#[cfg(test)]
pub(crate) use seq::fnv1a;
pub use seq::SeqNum;

/// The TCP control bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TcpFlags(pub u8);

impl TcpFlags {
    /// No more data from sender.
    pub const FIN: TcpFlags = TcpFlags(0x01);
    /// Synchronize sequence numbers.
    pub const SYN: TcpFlags = TcpFlags(0x02);
    /// Reset the connection.
    pub const RST: TcpFlags = TcpFlags(0x04);
    /// Push function.
    pub const PSH: TcpFlags = TcpFlags(0x08);
    /// Acknowledgment field is significant.
    pub const ACK: TcpFlags = TcpFlags(0x10);
    /// Urgent pointer field is significant.
    pub const URG: TcpFlags = TcpFlags(0x20);
    /// ECN-Echo (RFC 3168).
    pub const ECE: TcpFlags = TcpFlags(0x40);
    /// Congestion Window Reduced (RFC 3168).
    pub const CWR: TcpFlags = TcpFlags(0x80);
    /// No flags.
    pub const EMPTY: TcpFlags = TcpFlags(0);

    /// Whether every flag in `other` is set.
    pub fn contains(self, other: TcpFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any flag in `other` is set.
    pub fn intersects(self, other: TcpFlags) -> bool {
        self.0 & other.0 != 0
    }

    /// SYN set.
    pub fn syn(self) -> bool {
        self.contains(Self::SYN)
    }
    /// ACK set.
    pub fn ack(self) -> bool {
        self.contains(Self::ACK)
    }
    /// FIN set.
    pub fn fin(self) -> bool {
        self.contains(Self::FIN)
    }
    /// RST set.
    pub fn rst(self) -> bool {
        self.contains(Self::RST)
    }
    /// PSH set.
    pub fn psh(self) -> bool {
        self.contains(Self::PSH)
    }
}

impl BitOr for TcpFlags {
    type Output = TcpFlags;
    fn bitor(self, rhs: TcpFlags) -> TcpFlags {
        TcpFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for TcpFlags {
    fn bitor_assign(&mut self, rhs: TcpFlags) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for TcpFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(TcpFlags, char); 8] = [
            (TcpFlags::SYN, 'S'),
            (TcpFlags::FIN, 'F'),
            (TcpFlags::RST, 'R'),
            (TcpFlags::PSH, 'P'),
            (TcpFlags::ACK, '.'),
            (TcpFlags::URG, 'U'),
            (TcpFlags::ECE, 'E'),
            (TcpFlags::CWR, 'W'),
        ];
        for (flag, c) in NAMES {
            if self.contains(flag) {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

/// The timestamps option (RFC 7323 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Timestamps {
    /// TSval: the sender's timestamp clock.
    pub tsval: u32,
    /// TSecr: the echoed TSval (meaningful when ACK is set).
    pub tsecr: u32,
}

/// Up to four SACK blocks (RFC 2018 §3: at most 4 fit in 40 option bytes, 3 with timestamps).
#[derive(Clone, Copy, Default)]
pub struct SackBlocks {
    blocks: [(SeqNum, SeqNum); 4],
    len: u8,
}

impl SackBlocks {
    /// Most blocks one header can carry.
    pub const MAX: usize = 4;

    /// No blocks.
    pub const fn new() -> Self {
        SackBlocks {
            blocks: [(SeqNum(0), SeqNum(0)); 4],
            len: 0,
        }
    }

    /// Append a block `[left, right)`; returns false (and ignores it) when full.
    pub fn push(&mut self, left: SeqNum, right: SeqNum) -> bool {
        let i = usize::from(self.len);
        if i >= Self::MAX {
            return false;
        }
        self.blocks[i] = (left, right);
        self.len += 1;
        true
    }

    /// The blocks, in header order (first = most recently changed, RFC 2018 §4).
    pub fn as_slice(&self) -> &[(SeqNum, SeqNum)] {
        &self.blocks[..usize::from(self.len)]
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// No blocks.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keep at most `n` blocks.
    pub fn truncate(&mut self, n: usize) {
        if n < self.len() {
            self.len = n as u8;
        }
    }
}

// Equality looks at the used blocks only: slots past `len` (left over by `truncate`) are
// not part of the value.
impl PartialEq for SackBlocks {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for SackBlocks {}

impl fmt::Debug for SackBlocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// The TCP options luna understands. Unknown options are skipped by length on parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpOptions {
    /// Maximum segment size (kind 2), only meaningful on SYN.
    pub mss: Option<u16>,
    /// Window scale shift (kind 3), only meaningful on SYN. Values above 14 are clamped to
    /// 14 by the core (RFC 7323 §2.3), not by the parser.
    pub window_scale: Option<u8>,
    /// SACK-permitted (kind 4), only meaningful on SYN.
    pub sack_permitted: bool,
    /// Timestamps (kind 8).
    pub timestamps: Option<Timestamps>,
    /// SACK blocks (kind 5).
    pub sack_blocks: SackBlocks,
}

/// A parsed TCP header. The payload is not part of the repr: the caller slices it out of the
/// frame buffer (zero copy) using the header length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number of the first octet (or the ISN on SYN).
    pub seq: SeqNum,
    /// Acknowledgment number; meaningful only when `flags` has ACK.
    pub ack: SeqNum,
    /// Control bits.
    pub flags: TcpFlags,
    /// Window field as sent (unscaled).
    pub window: u16,
    /// Urgent pointer (luna never sends urgent data; RFC 9293 §3.8.5 lets it be ignored on
    /// receive beyond delivering the bytes in sequence).
    pub urgent: u16,
    /// Options.
    pub options: TcpOptions,
}

impl SackBlocks {
    /// Blocks from a slice; `None` if it holds more than [`SackBlocks::MAX`].
    pub fn from_slice(blocks: &[(SeqNum, SeqNum)]) -> Option<Self> {
        let mut s = SackBlocks::new();
        for &(l, r) in blocks {
            if !s.push(l, r) {
                return None;
            }
        }
        Some(s)
    }
}

/// IP protocol number of TCP.
pub const PROTOCOL: u8 = 6;

mod field {
    use core::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const SEQ_NUM: Range<usize> = 4..8;
    pub const ACK_NUM: Range<usize> = 8..12;
    pub const DATA_OFF: usize = 12;
    pub const FLAGS: usize = 13;
    pub const WIN_SIZE: Range<usize> = 14..16;
    pub const CHECKSUM: Range<usize> = 16..18;
    pub const URGENT: Range<usize> = 18..20;
}

/// Length of a header without options.
pub const HEADER_LEN: usize = 20;
/// Largest header: data offset 15 (RFC 9293 §3.1).
pub const MAX_HEADER_LEN: usize = 60;
/// Largest options area.
pub const MAX_OPTIONS_LEN: usize = MAX_HEADER_LEN - HEADER_LEN;

/// Bytes of the timestamps-only option block (NOP, NOP, kind, length, TSval, TSecr).
const TS_TEMPLATE_LEN: usize = 12;

/// Option kinds (RFC 9293 §3.2, RFC 7323 §2-3, RFC 2018 §2-3).
pub mod kind {
    /// End of option list.
    pub const EOL: u8 = 0;
    /// No-operation (padding).
    pub const NOP: u8 = 1;
    /// Maximum segment size.
    pub const MSS: u8 = 2;
    /// Window scale.
    pub const WINDOW_SCALE: u8 = 3;
    /// SACK permitted.
    pub const SACK_PERMITTED: u8 = 4;
    /// SACK blocks.
    pub const SACK: u8 = 5;
    /// Timestamps.
    pub const TIMESTAMPS: u8 = 8;
}

/// A view of a TCP segment (header + payload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TcpPacket<T> {
    /// Wrap without checking; accessors may panic until [`check_len`](Self::check_len) passes.
    pub const fn new_unchecked(buffer: T) -> Self {
        TcpPacket { buffer }
    }

    /// Wrap and validate the lengths.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Validate the header length.
    ///
    /// RFC 9293 §3.1 "Data Offset": the header is DO×4 bytes, at least 20; a data offset
    /// below 5 or past the end of the segment is malformed (reading options or payload
    /// through it is the "bad data offset" bug class).
    pub fn check_len(&self) -> Result<()> {
        let len = self.b().len();
        if len < HEADER_LEN {
            return Err(Error);
        }
        let hlen = self.header_len();
        if hlen < HEADER_LEN || hlen > len {
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

    fn u32_at(&self, r: core::ops::Range<usize>) -> u32 {
        let b = &self.b()[r];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        self.u16_at(field::SRC_PORT)
    }

    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        self.u16_at(field::DST_PORT)
    }

    /// Sequence number.
    pub fn seq_number(&self) -> SeqNum {
        SeqNum(self.u32_at(field::SEQ_NUM))
    }

    /// Acknowledgment number.
    pub fn ack_number(&self) -> SeqNum {
        SeqNum(self.u32_at(field::ACK_NUM))
    }

    /// Header length in bytes (data offset × 4).
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[field::DATA_OFF] >> 4) * 4
    }

    /// Control bits (CWR ECE URG ACK PSH RST SYN FIN).
    pub fn flags(&self) -> TcpFlags {
        TcpFlags(self.b()[field::FLAGS])
    }

    /// Window field (unscaled).
    pub fn window_len(&self) -> u16 {
        self.u16_at(field::WIN_SIZE)
    }

    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    /// Urgent pointer.
    pub fn urgent_at(&self) -> u16 {
        self.u16_at(field::URGENT)
    }

    /// The raw options area (header bytes past 20).
    pub fn options(&self) -> &[u8] {
        &self.b()[HEADER_LEN..self.header_len()]
    }

    /// Iterate over the options.
    pub fn option_iter(&self) -> TcpOptionIter<'_> {
        TcpOptionIter::new(self.options())
    }

    /// Payload length.
    pub fn payload_len(&self) -> usize {
        self.b().len() - self.header_len()
    }

    /// Sequence space the segment occupies: payload + SYN + FIN (RFC 9293 §3.4 SEG.LEN).
    pub fn segment_len(&self) -> usize {
        let f = self.flags();
        self.payload_len() + usize::from(f.syn()) + usize::from(f.fin())
    }

    /// RFC 9293 §3.1 "Checksum": the ones-complement sum over the pseudo-header, header and
    /// payload is all ones. The buffer must span exactly the segment (IP payload).
    pub fn verify_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        let b = self.b();
        let Ok(len) = u32::try_from(b.len()) else {
            return false;
        };
        let sum = checksum::add(
            checksum::pseudo_header_v4(src, dst, PROTOCOL, len),
            checksum::data(b),
        );
        sum == 0xffff
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> TcpPacket<&'a T> {
    /// The payload, borrowed from the underlying buffer.
    pub fn payload(&self) -> &'a [u8] {
        let b: &'a [u8] = self.buffer.as_ref();
        &b[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpPacket<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    fn set_u16_at(&mut self, r: core::ops::Range<usize>, v: u16) {
        self.bm()[r].copy_from_slice(&v.to_be_bytes());
    }

    /// Set the source port.
    pub fn set_src_port(&mut self, v: u16) {
        self.set_u16_at(field::SRC_PORT, v);
    }

    /// Set the destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        self.set_u16_at(field::DST_PORT, v);
    }

    /// Set the sequence number.
    pub fn set_seq_number(&mut self, v: SeqNum) {
        self.bm()[field::SEQ_NUM].copy_from_slice(&v.0.to_be_bytes());
    }

    /// Set the acknowledgment number.
    pub fn set_ack_number(&mut self, v: SeqNum) {
        self.bm()[field::ACK_NUM].copy_from_slice(&v.0.to_be_bytes());
    }

    /// Set the header length in bytes (a multiple of 4, 20..=60); clears the reserved bits.
    pub fn set_header_len(&mut self, len: usize) {
        self.bm()[field::DATA_OFF] = ((len / 4) as u8) << 4;
    }

    /// Set the control bits.
    pub fn set_flags(&mut self, f: TcpFlags) {
        self.bm()[field::FLAGS] = f.0;
    }

    /// Set the window field.
    pub fn set_window_len(&mut self, v: u16) {
        self.set_u16_at(field::WIN_SIZE, v);
    }

    /// Set the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        self.set_u16_at(field::CHECKSUM, v);
    }

    /// Set the urgent pointer.
    pub fn set_urgent_at(&mut self, v: u16) {
        self.set_u16_at(field::URGENT, v);
    }

    /// The options area, mutably.
    pub fn options_mut(&mut self) -> &mut [u8] {
        let hlen = self.header_len();
        &mut self.bm()[HEADER_LEN..hlen]
    }

    /// The payload, mutably.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hlen = self.header_len();
        &mut self.bm()[hlen..]
    }

    /// Compute the checksum over the whole buffer (header + contiguous payload).
    pub fn fill_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        self.set_checksum(0);
        let mut acc = Accumulator::new();
        acc.add_bytes(self.b());
        self.finish_checksum(src, dst, acc);
    }

    /// Compute the checksum when this buffer holds only the header (its first
    /// `header_len()` bytes) and the payload lives elsewhere: `payload` is an accumulator
    /// fed with the payload chunks in order (odd chunk lengths are fine).
    pub fn fill_checksum_split(&mut self, src: Ipv4Addr, dst: Ipv4Addr, payload: &Accumulator) {
        self.set_checksum(0);
        let hlen = self.header_len();
        let mut acc = Accumulator::new();
        acc.add_bytes(&self.b()[..hlen]);
        // The header length is a multiple of 4, so the payload starts even-aligned.
        acc.add_sum(payload.sum(), payload.len());
        self.finish_checksum(src, dst, acc);
    }

    /// Store only the pseudo-header sum (not complemented), as NICs with TCP checksum
    /// offload expect (e.g. DPDK `RTE_MBUF_F_TX_TCP_CKSUM`): the device adds header and
    /// payload.
    pub fn fill_pseudo_header_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr, tcp_len: usize) {
        let len = u32::try_from(tcp_len).unwrap_or(u32::MAX);
        self.set_checksum(checksum::pseudo_header_v4(src, dst, PROTOCOL, len));
    }

    /// [`fill_checksum_split`](Self::fill_checksum_split) with the pseudo-header's address
    /// and protocol part precomputed: `pseudo_no_len` is
    /// `checksum::pseudo_header_v4(src, dst, 6, 0)` (a connection's constant); the TCP
    /// length is added here. Same result as `fill_checksum_split(src, dst, payload)`.
    pub fn fill_checksum_split_pseudo(&mut self, pseudo_no_len: u16, payload: &Accumulator) {
        self.set_checksum(0);
        let hlen = self.header_len();
        let mut acc = Accumulator::new();
        acc.add_bytes(&self.b()[..hlen]);
        acc.add_sum(payload.sum(), payload.len());
        let len = u32::try_from(acc.len()).unwrap_or(u32::MAX);
        acc.add_word_sum(checksum::add(
            checksum::add(pseudo_no_len, (len >> 16) as u16),
            len as u16,
        ));
        self.set_checksum(acc.checksum());
    }

    fn finish_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr, mut acc: Accumulator) {
        let len = u32::try_from(acc.len()).unwrap_or(u32::MAX);
        acc.add_word_sum(checksum::pseudo_header_v4(src, dst, PROTOCOL, len));
        self.set_checksum(acc.checksum());
    }
}

/// One option as found on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpOption<'a> {
    /// Kind 0: the rest of the options area is padding.
    EndOfList,
    /// Kind 1.
    NoOperation,
    /// Kind 2 (RFC 9293 §3.7.1).
    MaxSegmentSize(u16),
    /// Kind 3 (RFC 7323 §2.2), the shift count as sent.
    WindowScale(u8),
    /// Kind 4 (RFC 2018 §2).
    SackPermitted,
    /// Kind 5 (RFC 2018 §3).
    Sack(SackBlocks),
    /// Kind 8 (RFC 7323 §3.2).
    Timestamps(Timestamps),
    /// Any other kind, skipped by its length (RFC 9293 §3.1).
    Unknown {
        /// Kind.
        kind: u8,
        /// The option's data (after kind and length).
        data: &'a [u8],
    },
}

/// Iterator over an options area. Yields `Err` once for a malformed option and then stops;
/// stops after EOL. Every step consumes at least one byte, so it always terminates.
#[derive(Debug, Clone)]
pub struct TcpOptionIter<'a> {
    rest: &'a [u8],
    done: bool,
}

impl<'a> TcpOptionIter<'a> {
    /// Iterate over `options` (the header bytes past 20).
    pub fn new(options: &'a [u8]) -> Self {
        TcpOptionIter {
            rest: options,
            done: false,
        }
    }

    fn next_option(&mut self) -> Result<TcpOption<'a>> {
        let b = self.rest;
        let kind = b[0];
        match kind {
            kind::EOL => {
                // RFC 9293 §3.1: EOL ends the list; what follows is padding.
                self.done = true;
                self.rest = &[];
                return Ok(TcpOption::EndOfList);
            }
            kind::NOP => {
                self.rest = &b[1..];
                return Ok(TcpOption::NoOperation);
            }
            _ => {}
        }
        // RFC 9293 §3.1 / MUST-64: every other option has a length octet that counts kind
        // and length; a length below 2 (the zero-length-option infinite-loop bug class) or
        // past the end of the header is malformed.
        let len = usize::from(*b.get(1).ok_or(Error)?);
        if len < 2 || len > b.len() {
            return Err(Error);
        }
        let data = &b[2..len];
        self.rest = &b[len..];
        let be16 = |d: &[u8]| u16::from_be_bytes([d[0], d[1]]);
        let be32 = |d: &[u8]| u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
        Ok(match kind {
            // RFC 9293 §3.2: MSS length is 4.
            kind::MSS if len == 4 => TcpOption::MaxSegmentSize(be16(data)),
            // RFC 7323 §2.2: window scale length is 3.
            kind::WINDOW_SCALE if len == 3 => TcpOption::WindowScale(data[0]),
            // RFC 2018 §2: SACK-permitted length is 2.
            kind::SACK_PERMITTED if len == 2 => TcpOption::SackPermitted,
            // RFC 2018 §3: SACK length is 2 + 8n with n ≥ 1 (at most 4 fit in 40 bytes).
            kind::SACK if len >= 10 && (len - 2) % 8 == 0 => {
                let mut blocks = SackBlocks::new();
                for blk in data.chunks_exact(8) {
                    if !blocks.push(SeqNum(be32(&blk[..4])), SeqNum(be32(&blk[4..]))) {
                        return Err(Error);
                    }
                }
                TcpOption::Sack(blocks)
            }
            // RFC 7323 §3.2: timestamps length is 10.
            kind::TIMESTAMPS if len == 10 => TcpOption::Timestamps(Timestamps {
                tsval: be32(&data[..4]),
                tsecr: be32(&data[4..]),
            }),
            kind::MSS
            | kind::WINDOW_SCALE
            | kind::SACK_PERMITTED
            | kind::SACK
            | kind::TIMESTAMPS => return Err(Error),
            _ => TcpOption::Unknown { kind, data },
        })
    }
}

impl<'a> Iterator for TcpOptionIter<'a> {
    type Item = Result<TcpOption<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.rest.is_empty() {
            return None;
        }
        let r = self.next_option();
        if r.is_err() {
            self.done = true;
        }
        Some(r)
    }
}

impl core::iter::FusedIterator for TcpOptionIter<'_> {}

// Emission layout, 4-byte aligned as Linux sends it so receivers' fast paths match
// (NOP NOP TS at the start of an established segment):
//   MSS(4) | SACK_PERM+TS (12) or NOP NOP TS (12) or NOP NOP SACK_PERM (4) | NOP WS (4)
//   | NOP NOP SACK 2+8n
const SACK_HEADER: usize = 4;
const SACK_BLOCK: usize = 8;

impl TcpOptions {
    /// Parse an options area. Unknown options are skipped; malformed ones reject the whole
    /// area. A repeated option keeps its last value.
    #[inline]
    pub fn parse(options: &[u8]) -> Result<Self> {
        // RFC 7323 Appendix A: established segments carry <NOP,NOP,TS> as the only option;
        // recognise that layout without walking the list.
        if let [kind::NOP, kind::NOP, kind::TIMESTAMPS, 10, v0, v1, v2, v3, e0, e1, e2, e3] =
            *options
        {
            return Ok(TcpOptions {
                timestamps: Some(Timestamps {
                    tsval: u32::from_be_bytes([v0, v1, v2, v3]),
                    tsecr: u32::from_be_bytes([e0, e1, e2, e3]),
                }),
                ..TcpOptions::default()
            });
        }
        Self::parse_list(options)
    }

    /// The general option walk behind [`parse`](Self::parse).
    #[inline(never)]
    fn parse_list(options: &[u8]) -> Result<Self> {
        let mut out = TcpOptions::default();
        for opt in TcpOptionIter::new(options) {
            match opt? {
                TcpOption::MaxSegmentSize(v) => out.mss = Some(v),
                TcpOption::WindowScale(v) => out.window_scale = Some(v),
                TcpOption::SackPermitted => out.sack_permitted = true,
                TcpOption::Sack(b) => out.sack_blocks = b,
                TcpOption::Timestamps(t) => out.timestamps = Some(t),
                TcpOption::EndOfList | TcpOption::NoOperation | TcpOption::Unknown { .. } => {}
            }
        }
        Ok(out)
    }

    fn fixed_len(&self) -> usize {
        let mut n = 0;
        if self.mss.is_some() {
            n += 4;
        }
        n += match (self.sack_permitted, self.timestamps.is_some()) {
            (_, true) => 12,
            (true, false) => 4,
            (false, false) => 0,
        };
        if self.window_scale.is_some() {
            n += 4;
        }
        n
    }

    /// How many SACK blocks fit beside the other options set (RFC 2018 §3: at most 4, and 3
    /// with timestamps). [`emit`](Self::emit) sends at most this many, the first ones.
    pub fn sack_capacity(&self) -> usize {
        let avail = MAX_OPTIONS_LEN - self.fixed_len();
        if avail < SACK_HEADER + SACK_BLOCK {
            0
        } else {
            ((avail - SACK_HEADER) / SACK_BLOCK).min(SackBlocks::MAX)
        }
    }

    /// Bytes [`emit`](Self::emit) writes: a multiple of 4, at most 40.
    pub fn buffer_len(&self) -> usize {
        if self.sack_blocks.is_empty() {
            // The common data segment: no capacity to work out.
            return self.fixed_len();
        }
        let n = self.sack_blocks.len().min(self.sack_capacity());
        self.fixed_len()
            + if n > 0 {
                SACK_HEADER + SACK_BLOCK * n
            } else {
                0
            }
    }

    /// Write the options into `buf` (at least [`buffer_len`](Self::buffer_len) bytes);
    /// returns the bytes written.
    ///
    /// # Panics
    /// If `buf` is shorter than `buffer_len()` (a caller bug).
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        if self.mss.is_none()
            && self.window_scale.is_none()
            && !self.sack_permitted
            && self.sack_blocks.is_empty()
        {
            // Every in-order data segment and ACK of a connection with timestamps: the
            // 12-byte template NOP, NOP, TS, 10 with the two values filled in, one store
            // (the same bytes the general path below lays out).
            let Some(ts) = self.timestamps else {
                return 0;
            };
            let (v, e) = (ts.tsval.to_be_bytes(), ts.tsecr.to_be_bytes());
            buf[..TS_TEMPLATE_LEN].copy_from_slice(&[
                kind::NOP,
                kind::NOP,
                kind::TIMESTAMPS,
                10,
                v[0],
                v[1],
                v[2],
                v[3],
                e[0],
                e[1],
                e[2],
                e[3],
            ]);
            return TS_TEMPLATE_LEN;
        }
        self.emit_general(buf)
    }

    /// [`emit`](Self::emit) for any other set of options (SYNs, SACK blocks), walked one
    /// option at a time.
    #[inline(never)]
    fn emit_general(&self, buf: &mut [u8]) -> usize {
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            buf[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        if let Some(mss) = self.mss {
            let m = mss.to_be_bytes();
            put(&[kind::MSS, 4, m[0], m[1]]);
        }
        match (self.sack_permitted, self.timestamps) {
            (sp, Some(ts)) => {
                if sp {
                    put(&[kind::SACK_PERMITTED, 2]);
                } else {
                    put(&[kind::NOP, kind::NOP]);
                }
                put(&[kind::TIMESTAMPS, 10]);
                put(&ts.tsval.to_be_bytes());
                put(&ts.tsecr.to_be_bytes());
            }
            (true, None) => put(&[kind::NOP, kind::NOP, kind::SACK_PERMITTED, 2]),
            (false, None) => {}
        }
        if let Some(ws) = self.window_scale {
            put(&[kind::NOP, kind::WINDOW_SCALE, 3, ws]);
        }
        let n = self.sack_blocks.len().min(self.sack_capacity());
        if n > 0 {
            put(&[kind::NOP, kind::NOP, kind::SACK, (2 + SACK_BLOCK * n) as u8]);
            for &(l, r) in &self.sack_blocks.as_slice()[..n] {
                put(&l.0.to_be_bytes());
                put(&r.0.to_be_bytes());
            }
        }
        at
    }
}

impl TcpRepr {
    /// Parse a segment; `packet` must span exactly the IP payload (bounded by the IPv4
    /// Total Length). Verifies the checksum unless offloaded (RFC 9293 §3.1) and rejects
    /// malformed options.
    pub fn parse<T: AsRef<[u8]>>(
        packet: &TcpPacket<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        caps: &ChecksumCaps,
    ) -> Result<Self> {
        let b = packet.b();
        // One bounds check for the fixed header; the fields are read at constant offsets of
        // it. RFC 9293 §3.1 "Data Offset" as in `check_len`: 20 <= DO*4 <= the segment.
        let Some(h) = b.first_chunk::<HEADER_LEN>() else {
            return Err(Error);
        };
        let hlen = usize::from(h[field::DATA_OFF] >> 4) * 4;
        if hlen < HEADER_LEN || hlen > b.len() {
            return Err(Error);
        }
        if caps.tcp.rx() && !packet.verify_checksum(src, dst) {
            return Err(Error);
        }
        Ok(TcpRepr {
            src_port: u16::from_be_bytes([h[0], h[1]]),
            dst_port: u16::from_be_bytes([h[2], h[3]]),
            seq: SeqNum(u32::from_be_bytes([h[4], h[5], h[6], h[7]])),
            ack: SeqNum(u32::from_be_bytes([h[8], h[9], h[10], h[11]])),
            flags: TcpFlags(h[field::FLAGS]),
            window: u16::from_be_bytes([h[14], h[15]]),
            urgent: u16::from_be_bytes([h[18], h[19]]),
            options: TcpOptions::parse(&b[HEADER_LEN..hlen])?,
        })
    }

    /// Header length this repr emits: 20 + options, a multiple of 4, at most 60.
    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.options.buffer_len()
    }

    /// Header plus payload length.
    pub fn buffer_len(&self, payload_len: usize) -> usize {
        self.header_len() + payload_len
    }

    /// Sequence space of a segment with this header and `payload_len` bytes: payload + SYN
    /// + FIN (RFC 9293 §3.4 SEG.LEN).
    pub fn segment_len(&self, payload_len: usize) -> usize {
        payload_len + usize::from(self.flags.syn()) + usize::from(self.flags.fin())
    }

    /// The repr as it reads back after emit: SACK blocks beyond
    /// [`TcpOptions::sack_capacity`] are dropped.
    pub fn emitted(&self) -> TcpRepr {
        let mut r = *self;
        let cap = r.options.sack_capacity();
        r.options.sack_blocks.truncate(cap);
        r
    }

    /// Write the header fields and options; the checksum field is set to zero.
    ///
    /// # Panics
    /// If the buffer is shorter than [`header_len`](Self::header_len) (a caller bug).
    pub fn emit_header<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut TcpPacket<T>) {
        let hlen = self.header_len();
        packet.set_src_port(self.src_port);
        packet.set_dst_port(self.dst_port);
        packet.set_seq_number(self.seq);
        packet.set_ack_number(self.ack);
        packet.set_header_len(hlen);
        packet.set_flags(self.flags);
        packet.set_window_len(self.window);
        packet.set_checksum(0);
        packet.set_urgent_at(self.urgent);
        let written = self.options.emit(packet.options_mut());
        debug_assert_eq!(HEADER_LEN + written, hlen);
    }

    /// Write the header into a buffer whose payload (`payload_len` bytes) is already in
    /// place after it, then the checksum (or, when offloaded, the pseudo-header sum the NIC
    /// completes).
    ///
    /// # Panics
    /// If the buffer is shorter than `buffer_len(payload_len)` (a caller bug).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut TcpPacket<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        payload_len: usize,
        caps: &ChecksumCaps,
    ) {
        self.emit_header(packet);
        let total = self.buffer_len(payload_len);
        if caps.tcp.tx() {
            let mut seg = TcpPacket::new_unchecked(&mut packet.buffer.as_mut()[..total]);
            seg.fill_checksum(src, dst);
        } else {
            packet.fill_pseudo_header_checksum(src, dst, total);
        }
    }

    /// Write the header into its own buffer when the payload lives elsewhere (zero-copy TX):
    /// `payload` has been fed the payload chunks in order.
    ///
    /// # Panics
    /// If the buffer is shorter than [`header_len`](Self::header_len) (a caller bug).
    pub fn emit_split<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut TcpPacket<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        payload: &Accumulator,
        caps: &ChecksumCaps,
    ) {
        self.emit_header(packet);
        if caps.tcp.tx() {
            packet.fill_checksum_split(src, dst, payload);
        } else {
            packet.fill_pseudo_header_checksum(src, dst, self.header_len() + payload.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SRC: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    const DST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

    // A SYN as Linux sends it: 198.18.0.1:40000 -> 198.18.0.2:80, ISN 0x3ade68b1, window
    // 64240, options MSS 1460, SACK_PERM, TS 0x00a1b2c3/0, NOP, WS 7. Checksum computed
    // with an independent RFC 1071 implementation.
    const SYN: [u8; 40] = [
        0x9c, 0x40, 0x00, 0x50, 0x3a, 0xde, 0x68, 0xb1, 0x00, 0x00, 0x00, 0x00, 0xa0, 0x02, 0xfa,
        0xf0, 0x00, 0x00, 0x00, 0x00, // checksum patched below
        0x02, 0x04, 0x05, 0xb4, 0x04, 0x02, 0x08, 0x0a, 0x00, 0xa1, 0xb2, 0xc3, 0x00, 0x00, 0x00,
        0x00, 0x01, 0x03, 0x03, 0x07,
    ];
    const SYN_CHECKSUM: u16 = 0xcd62;

    fn syn() -> [u8; 40] {
        let mut b = SYN;
        b[16..18].copy_from_slice(&SYN_CHECKSUM.to_be_bytes());
        b
    }

    fn syn_repr() -> TcpRepr {
        TcpRepr {
            src_port: 40000,
            dst_port: 80,
            seq: SeqNum(0x3ade_68b1),
            ack: SeqNum(0),
            flags: TcpFlags::SYN,
            window: 64240,
            urgent: 0,
            options: TcpOptions {
                mss: Some(1460),
                window_scale: Some(7),
                sack_permitted: true,
                timestamps: Some(Timestamps {
                    tsval: 0x00a1_b2c3,
                    tsecr: 0,
                }),
                sack_blocks: SackBlocks::new(),
            },
        }
    }

    /// A header with the given options area, data offset fixed up, checksum filled.
    fn segment(options: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut b = SYN[..20].to_vec();
        b.extend_from_slice(options);
        while b.len() % 4 != 0 {
            b.push(0);
        }
        let hlen = b.len();
        b.extend_from_slice(payload);
        let mut p = TcpPacket::new_unchecked(&mut b[..]);
        p.set_header_len(hlen);
        p.fill_checksum(SRC, DST);
        b
    }

    fn parse(b: &[u8]) -> Result<TcpRepr> {
        TcpPacket::new_checked(b)
            .and_then(|p| TcpRepr::parse(&p, SRC, DST, &ChecksumCaps::software()))
    }

    #[test]
    fn parse_linux_syn() {
        let b = syn();
        let p = TcpPacket::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum(SRC, DST));
        assert_eq!(p.header_len(), 40);
        assert_eq!(p.segment_len(), 1);
        assert_eq!(
            TcpRepr::parse(&p, SRC, DST, &ChecksumCaps::software()),
            Ok(syn_repr())
        );
        // Emitting the repr reproduces the bytes exactly (same option layout as Linux).
        let r = syn_repr();
        assert_eq!(r.header_len(), 40);
        let mut out = [0u8; 40];
        r.emit(
            &mut TcpPacket::new_unchecked(&mut out[..]),
            SRC,
            DST,
            0,
            &ChecksumCaps::software(),
        );
        assert_eq!(out, b);
    }

    #[test]
    fn rfc9293_3_1_bad_checksum_rejected_unless_offloaded() {
        let mut b = syn();
        b[5] ^= 0x40;
        let p = TcpPacket::new_checked(&b[..]).unwrap();
        assert_eq!(
            TcpRepr::parse(&p, SRC, DST, &ChecksumCaps::software()),
            Err(Error)
        );
        assert!(TcpRepr::parse(&p, SRC, DST, &ChecksumCaps::offloaded()).is_ok());
        // The pseudo-header is covered: the right bytes from another source fail too.
        let good = syn();
        let p = TcpPacket::new_checked(&good[..]).unwrap();
        let other = Ipv4Addr::new(198, 18, 0, 9);
        assert_eq!(
            TcpRepr::parse(&p, other, DST, &ChecksumCaps::software()),
            Err(Error)
        );
    }

    #[test]
    fn rfc9293_3_1_bad_data_offset_rejected() {
        for off in 0..5u8 {
            let mut b = syn();
            b[12] = off << 4;
            assert_eq!(TcpPacket::new_checked(&b[..]), Err(Error), "offset {off}");
        }
        // Data offset 15 (60 bytes) in a 40-byte segment.
        let mut b = syn();
        b[12] = 0xf0;
        assert_eq!(TcpPacket::new_checked(&b[..]), Err(Error));
        // Data offset 11 (44 bytes) one word past the end.
        b[12] = 0xb0;
        assert_eq!(TcpPacket::new_checked(&b[..]), Err(Error));
    }

    #[test]
    fn rfc9293_3_1_zero_length_option_rejected() {
        // Unknown kind 30 with length 0: the classic infinite-loop bug.
        assert_eq!(parse(&segment(&[30, 0, 1, 1], &[])), Err(Error));
        // Length 1 is equally malformed.
        assert_eq!(parse(&segment(&[30, 1, 1, 1], &[])), Err(Error));
        // A known kind with length 0.
        assert_eq!(parse(&segment(&[2, 0, 5, 0xb4], &[])), Err(Error));
        // Kind with no length byte at the end of the area.
        assert_eq!(parse(&segment(&[1, 1, 1, 30], &[])), Err(Error));
    }

    #[test]
    fn rfc9293_3_1_option_overflowing_header_rejected() {
        assert_eq!(parse(&segment(&[30, 5, 0, 0], &[1, 2, 3, 4])), Err(Error));
        assert_eq!(
            parse(&segment(&[8, 10, 0, 0, 0, 0, 0, 0], &[0; 8])),
            Err(Error)
        );
    }

    #[test]
    fn rfc9293_3_2_wrong_fixed_length_rejected() {
        assert_eq!(parse(&segment(&[2, 3, 5, 1], &[])), Err(Error)); // MSS len 3
        assert_eq!(parse(&segment(&[3, 4, 7, 0], &[])), Err(Error)); // WS len 4
        assert_eq!(parse(&segment(&[4, 3, 0, 1], &[])), Err(Error)); // SACK_PERM len 3
        let mut ts = vec![8, 8];
        ts.extend_from_slice(&[0; 6]);
        assert_eq!(parse(&segment(&ts, &[])), Err(Error)); // TS len 8
    }

    #[test]
    fn rfc2018_3_sack_bad_length_rejected() {
        for len in [2u8, 3, 9, 11, 17, 19] {
            let mut o = vec![1, 1, 5, len];
            o.resize(4 + 32, 0);
            assert_eq!(parse(&segment(&o, &[])), Err(Error), "sack len {len}");
        }
    }

    #[test]
    fn rfc2018_3_sack_blocks_parsed() {
        let mut o = vec![1, 1, 5, 18];
        for v in [100u32, 200, 300, 400] {
            o.extend_from_slice(&v.to_be_bytes());
        }
        let r = parse(&segment(&o, &[])).unwrap();
        assert_eq!(
            r.options.sack_blocks.as_slice(),
            &[(SeqNum(100), SeqNum(200)), (SeqNum(300), SeqNum(400))]
        );
    }

    #[test]
    fn rfc9293_3_1_unknown_options_skipped_and_eol_ends_list() {
        // Unknown kind 99 len 4, then MSS, then EOL followed by garbage that must be ignored.
        let o = [99, 4, 0xde, 0xad, 2, 4, 0x02, 0x18, 0, 77, 0, 1];
        let r = parse(&segment(&o, &[])).unwrap();
        assert_eq!(r.options.mss, Some(536));
        let p_bytes = segment(&o, &[]);
        let p = TcpPacket::new_checked(&p_bytes[..]).unwrap();
        let opts: Vec<_> = p.option_iter().collect();
        assert_eq!(
            opts,
            vec![
                Ok(TcpOption::Unknown {
                    kind: 99,
                    data: &[0xde, 0xad]
                }),
                Ok(TcpOption::MaxSegmentSize(536)),
                Ok(TcpOption::EndOfList)
            ]
        );
    }

    #[test]
    fn rfc7323_appendix_a_aligned_timestamps_fast_path_matches_walk() {
        let mut o = vec![1, 1, 8, 10];
        o.extend_from_slice(&0x0102_0304u32.to_be_bytes());
        o.extend_from_slice(&0x0506_0708u32.to_be_bytes());
        let fast = TcpOptions::parse(&o).unwrap();
        assert_eq!(fast, TcpOptions::parse_list(&o).unwrap());
        assert_eq!(
            fast.timestamps,
            Some(Timestamps {
                tsval: 0x0102_0304,
                tsecr: 0x0506_0708
            })
        );
        // Same length, different layout: the general walk decides.
        o[1] = 30;
        assert_eq!(TcpOptions::parse(&o), Err(Error));
    }

    #[test]
    fn option_iter_stops_after_error() {
        let mut it = TcpOptionIter::new(&[1, 30, 0, 1, 1]);
        assert_eq!(it.next(), Some(Ok(TcpOption::NoOperation)));
        assert_eq!(it.next(), Some(Err(Error)));
        assert_eq!(it.next(), None);
    }

    #[test]
    fn payload_and_segment_len() {
        let b = segment(&[], b"hello");
        let p = TcpPacket::new_checked(&b[..]).unwrap();
        assert_eq!(p.payload(), b"hello");
        assert_eq!(p.segment_len(), 6); // SYN + 5
        let mut r = TcpRepr::parse(&p, SRC, DST, &ChecksumCaps::software()).unwrap();
        assert_eq!(r.segment_len(5), 6);
        r.flags = TcpFlags::ACK | TcpFlags::FIN;
        assert_eq!(r.segment_len(5), 6);
        r.flags = TcpFlags::ACK;
        assert_eq!(r.segment_len(0), 0);
    }

    #[test]
    fn rfc7323_rfc2018_at_most_three_sack_blocks_with_timestamps() {
        let mut r = syn_repr();
        r.flags = TcpFlags::ACK;
        r.options.mss = None;
        r.options.window_scale = None;
        r.options.sack_permitted = false;
        for i in 0..4u32 {
            r.options
                .sack_blocks
                .push(SeqNum(i * 100), SeqNum(i * 100 + 50));
        }
        assert_eq!(r.options.sack_capacity(), 3);
        assert_eq!(r.header_len(), 20 + 12 + 4 + 24);
        let mut buf = vec![0u8; r.buffer_len(0)];
        r.emit(
            &mut TcpPacket::new_unchecked(&mut buf[..]),
            SRC,
            DST,
            0,
            &ChecksumCaps::software(),
        );
        // Aligned timestamps first (NOP NOP TS), as receivers' fast paths expect.
        assert_eq!(&buf[20..24], &[1, 1, 8, 10]);
        let back = parse(&buf).unwrap();
        assert_eq!(back.options.sack_blocks.len(), 3);
        assert_eq!(back, r.emitted());
        // Without timestamps all four fit.
        r.options.timestamps = None;
        assert_eq!(r.options.sack_capacity(), 4);
        assert_eq!(r.header_len(), 20 + 4 + 32);
    }

    #[test]
    fn timestamps_only_template_is_the_rfc7323_layout() {
        // The fast path of `TcpOptions::emit` (timestamps alone): RFC 7323 Appendix A's
        // NOP, NOP, TS (8), length 10, TSval, TSecr, big endian; and it reads back.
        let opts = TcpOptions {
            timestamps: Some(Timestamps {
                tsval: 0x0102_0304,
                tsecr: 0xa0b0_c0d0,
            }),
            ..TcpOptions::default()
        };
        let mut buf = [0xee; 40];
        assert_eq!(opts.buffer_len(), 12);
        assert_eq!(opts.emit(&mut buf), 12);
        assert_eq!(
            &buf[..13],
            &[1, 1, 8, 10, 1, 2, 3, 4, 0xa0, 0xb0, 0xc0, 0xd0, 0xee]
        );
        assert_eq!(TcpOptions::parse(&buf[..12]).unwrap(), opts);
        assert_eq!(TcpOptions::default().emit(&mut buf), 0);
        assert_eq!(TcpOptions::default().buffer_len(), 0);
    }

    #[test]
    fn sack_blocks_equality_ignores_truncated_slots() {
        // Regression: derived equality compared stale slots left by truncate().
        let mut a =
            SackBlocks::from_slice(&[(SeqNum(1), SeqNum(2)), (SeqNum(3), SeqNum(4))]).unwrap();
        a.truncate(1);
        let b = SackBlocks::from_slice(&[(SeqNum(1), SeqNum(2))]).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, SackBlocks::new());
        assert!(SackBlocks::from_slice(&[(SeqNum(0), SeqNum(0)); 5]).is_none());
    }

    #[test]
    fn header_len_never_exceeds_60() {
        let mut r = syn_repr();
        for i in 0..4u32 {
            r.options.sack_blocks.push(SeqNum(i), SeqNum(i + 1));
        }
        assert!(r.header_len() <= MAX_HEADER_LEN);
        assert_eq!(r.options.sack_capacity(), 2);
    }

    #[test]
    fn split_payload_checksum_matches_contiguous() {
        let mut r = syn_repr();
        r.flags = TcpFlags::ACK | TcpFlags::PSH;
        let payload: Vec<u8> = (0..1001u32).map(|i| (i * 7) as u8).collect();
        let mut whole = vec![0u8; r.buffer_len(payload.len())];
        let hlen = r.header_len();
        whole[hlen..].copy_from_slice(&payload);
        r.emit(
            &mut TcpPacket::new_unchecked(&mut whole[..]),
            SRC,
            DST,
            payload.len(),
            &ChecksumCaps::software(),
        );

        let mut header = vec![0u8; hlen];
        let mut acc = Accumulator::new();
        for chunk in [
            &payload[..1],
            &payload[1..333],
            &payload[333..334],
            &payload[334..],
        ] {
            acc.add_bytes(chunk);
        }
        r.emit_split(
            &mut TcpPacket::new_unchecked(&mut header[..]),
            SRC,
            DST,
            &acc,
            &ChecksumCaps::software(),
        );
        assert_eq!(&header[..], &whole[..hlen]);
        assert!(TcpPacket::new_checked(&whole[..])
            .unwrap()
            .verify_checksum(SRC, DST));
    }

    #[test]
    fn offload_writes_pseudo_header_sum() {
        let r = syn_repr();
        let mut buf = vec![0u8; r.buffer_len(0)];
        r.emit(
            &mut TcpPacket::new_unchecked(&mut buf[..]),
            SRC,
            DST,
            0,
            &ChecksumCaps::offloaded(),
        );
        let p = TcpPacket::new_checked(&buf[..]).unwrap();
        assert_eq!(p.checksum(), checksum::pseudo_header_v4(SRC, DST, 6, 40));
        // Completing it the way a NIC does (sum over the segment, complement) verifies.
        let c = !checksum::data(&buf);
        let mut p = TcpPacket::new_unchecked(&mut buf[..]);
        p.set_checksum(c);
        assert!(p.verify_checksum(SRC, DST));
    }

    #[test]
    fn truncated_every_length() {
        let b = syn();
        for n in 0..b.len() {
            assert_eq!(parse(&b[..n]), Err(Error), "len {n}");
        }
        assert!(parse(&b).is_ok());
    }

    fn arb_repr() -> impl Strategy<Value = TcpRepr> {
        let opts = (
            proptest::option::of(any::<u16>()),
            proptest::option::of(any::<u8>()),
            any::<bool>(),
            proptest::option::of((any::<u32>(), any::<u32>())),
            proptest::collection::vec((any::<u32>(), any::<u32>()), 0..=4),
        )
            .prop_map(|(mss, ws, sp, ts, sacks)| {
                let mut sack_blocks = SackBlocks::new();
                for (l, r) in sacks {
                    sack_blocks.push(SeqNum(l), SeqNum(r));
                }
                TcpOptions {
                    mss,
                    window_scale: ws,
                    sack_permitted: sp,
                    timestamps: ts.map(|(tsval, tsecr)| Timestamps { tsval, tsecr }),
                    sack_blocks,
                }
            });
        (
            any::<u16>(),
            any::<u16>(),
            any::<u32>(),
            any::<u32>(),
            any::<u8>(),
            any::<u16>(),
            any::<u16>(),
            opts,
        )
            .prop_map(
                |(sp, dp, seq, ack, flags, window, urgent, options)| TcpRepr {
                    src_port: sp,
                    dst_port: dp,
                    seq: SeqNum(seq),
                    ack: SeqNum(ack),
                    flags: TcpFlags(flags),
                    window,
                    urgent,
                    options,
                },
            )
    }

    proptest! {
        #[test]
        fn roundtrip(repr in arb_repr(), payload in proptest::collection::vec(any::<u8>(), 0..200),
                     src in any::<[u8; 4]>(), dst in any::<[u8; 4]>()) {
            let (src, dst) = (Ipv4Addr::from(src), Ipv4Addr::from(dst));
            let hlen = repr.header_len();
            prop_assert!(hlen <= MAX_HEADER_LEN && hlen % 4 == 0);
            let mut buf = vec![0u8; repr.buffer_len(payload.len())];
            buf[hlen..].copy_from_slice(&payload);
            repr.emit(&mut TcpPacket::new_unchecked(&mut buf[..]), src, dst, payload.len(),
                      &ChecksumCaps::software());
            let p = TcpPacket::new_checked(&buf[..]).unwrap();
            let back = TcpRepr::parse(&p, src, dst, &ChecksumCaps::software()).unwrap();
            prop_assert_eq!(back, repr.emitted());
            prop_assert_eq!(p.payload(), &payload[..]);
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(p) = TcpPacket::new_checked(&bytes[..]) {
                let _ = TcpRepr::parse(&p, SRC, DST, &ChecksumCaps::offloaded());
                for _ in p.option_iter() {}
            }
        }
    }
}
