//! Wire formats: zero-copy `Packet` views and `Repr` high-level forms (smoltcp style).
//!
//! A `Packet<T: AsRef<[u8]>>` wraps a buffer; after `check_len` succeeds no accessor panics.
//! `Repr::parse` validates and converts, `Repr::emit` writes, `Repr::buffer_len` sizes.
//! Checksum work is governed by [`ChecksumCaps`] so NIC offload can skip software sums.

use core::fmt;

pub mod tcp;

pub use tcp::{SackBlocks, TcpFlags, TcpOptions, TcpRepr, Timestamps};

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
