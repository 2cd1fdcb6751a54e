//! TCP header (RFC 9293 §3.1) and options (RFC 9293 §3.2, RFC 7323, RFC 2018).

use crate::tcp::SeqNum;
use core::fmt;
use core::ops::{BitOr, BitOrAssign};

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
#[derive(Clone, Copy, PartialEq, Eq, Default)]
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
