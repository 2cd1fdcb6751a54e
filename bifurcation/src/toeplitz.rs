//! Toeplitz hashing as NICs do it for Receive Side Scaling (Microsoft RSS specification,
//! "Verifying the RSS Hash Calculation"), and the redirection table that maps a hash to a
//! receive queue.
//!
//! The hash is linear over GF(2): `h(a ^ b) = h(a) ^ h(b)` for inputs of equal length. The
//! port chooser uses that to hash a 4-tuple once and then try many local ports with one XOR
//! each.

use core::fmt;
use core::net::{Ipv4Addr, SocketAddrV4};

/// The 40-byte key of the Microsoft RSS specification; many NICs ship it as their default.
pub const MICROSOFT_KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// Bytes of an IPv4 + TCP hash input: source address, destination address, source port,
/// destination port, all in network byte order.
pub const IPV4_TCP_INPUT_LEN: usize = 12;

/// The Toeplitz hash of `input` under `key`. Key bits past the end of `key` count as zero
/// (a key must be at least `input.len() + 4` bytes for every input bit to matter).
pub fn toeplitz(key: &[u8], input: &[u8]) -> u32 {
    let key_byte = |i: usize| u64::from(key.get(i).copied().unwrap_or(0));
    // The top 32 bits of `window` are the key bits aligned with the current input bit.
    let mut window = (0..8).fold(0u64, |w, i| (w << 8) | key_byte(i));
    let mut hash = 0u32;
    for (next, &byte) in (8..).zip(input) {
        for bit in 0..8 {
            if byte & (0x80 >> bit) != 0 {
                hash ^= (window >> 32) as u32;
            }
            window <<= 1;
        }
        window |= key_byte(next);
    }
    hash
}

/// The hash input of an IPv4/TCP packet from `src` to `dst`.
pub fn ipv4_tcp_input(src: SocketAddrV4, dst: SocketAddrV4) -> [u8; IPV4_TCP_INPUT_LEN] {
    let mut b = [0u8; IPV4_TCP_INPUT_LEN];
    b[0..4].copy_from_slice(&src.ip().octets());
    b[4..8].copy_from_slice(&dst.ip().octets());
    b[8..10].copy_from_slice(&src.port().to_be_bytes());
    b[10..12].copy_from_slice(&dst.port().to_be_bytes());
    b
}

/// The hash input of an IPv4 packet (addresses only, for non-TCP/UDP traffic).
pub fn ipv4_input(src: Ipv4Addr, dst: Ipv4Addr) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0..4].copy_from_slice(&src.octets());
    b[4..8].copy_from_slice(&dst.octets());
    b
}

/// Why an [`RssConfig`] was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RssError {
    /// The key is shorter than 16 bytes (an IPv4/TCP input needs 12 + 4).
    KeyTooShort(usize),
    /// The redirection table is empty.
    EmptyTable,
    /// No queues to spread over.
    NoQueues,
}

impl fmt::Display for RssError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RssError::KeyTooShort(n) => write!(
                f,
                "RSS key of {n} bytes is too short: IPv4/TCP hashing needs at least 16 (NICs use 40 or 52)"
            ),
            RssError::EmptyTable => f.write_str("the RSS redirection table is empty"),
            RssError::NoQueues => f.write_str("RSS needs at least one queue"),
        }
    }
}

impl std::error::Error for RssError {}

/// A device's RSS setup: the Toeplitz key and the redirection table (RETA) mapping
/// `hash % reta.len()` to a queue (for the power-of-two table sizes NICs use this is the
/// same as masking the low bits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RssConfig {
    key: Vec<u8>,
    reta: Vec<u16>,
}

impl RssConfig {
    /// RSS with `key` and an explicit redirection table.
    pub fn new(key: &[u8], reta: Vec<u16>) -> Result<Self, RssError> {
        if key.len() < IPV4_TCP_INPUT_LEN + 4 {
            return Err(RssError::KeyTooShort(key.len()));
        }
        if reta.is_empty() {
            return Err(RssError::EmptyTable);
        }
        Ok(RssConfig {
            key: key.to_vec(),
            reta,
        })
    }

    /// A `reta_size`-entry table filling queues `0..queues` round robin (what DPDK PMDs
    /// program by default).
    pub fn round_robin(key: &[u8], reta_size: usize, queues: u16) -> Result<Self, RssError> {
        if queues == 0 {
            return Err(RssError::NoQueues);
        }
        let reta = (0..reta_size)
            .map(|i| (i % usize::from(queues)) as u16)
            .collect();
        Self::new(key, reta)
    }

    /// The key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The redirection table.
    pub fn reta(&self) -> &[u16] {
        &self.reta
    }

    /// Queues the table names (highest + 1).
    pub fn queues(&self) -> u16 {
        self.reta.iter().copied().max().map_or(0, |q| q + 1)
    }

    /// The queue a hash is steered to.
    pub fn queue_of_hash(&self, hash: u32) -> u16 {
        self.reta[hash as usize % self.reta.len()]
    }

    /// The hash of a TCP/IPv4 packet from `src` to `dst`.
    pub fn hash_ipv4_tcp(&self, src: SocketAddrV4, dst: SocketAddrV4) -> u32 {
        toeplitz(&self.key, &ipv4_tcp_input(src, dst))
    }

    /// The queue a TCP/IPv4 packet from `src` to `dst` is received on.
    pub fn queue_of_ipv4_tcp(&self, src: SocketAddrV4, dst: SocketAddrV4) -> u16 {
        self.queue_of_hash(self.hash_ipv4_tcp(src, dst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddrV4 {
        s.parse().unwrap()
    }

    /// Microsoft RSS specification, "Verifying the RSS Hash Calculation", IPv4 table:
    /// (destination, source, IPv4-only hash, IPv4 with TCP hash) under [`MICROSOFT_KEY`].
    const VECTORS: [(&str, &str, u32, u32); 5] = [
        (
            "161.142.100.80:1766",
            "66.9.149.187:2794",
            0x323e_8fc2,
            0x51cc_c178,
        ),
        (
            "65.69.140.83:4739",
            "199.92.111.2:14230",
            0xd718_262a,
            0xc626_b0ea,
        ),
        (
            "12.22.207.184:38024",
            "24.19.198.95:12898",
            0xd2d0_a5de,
            0x5c2b_394a,
        ),
        (
            "209.142.163.6:2217",
            "38.27.205.30:48228",
            0x8298_9176,
            0xafc7_327f,
        ),
        (
            "202.188.127.2:1303",
            "153.39.163.191:44251",
            0x5d18_09c5,
            0x10e8_28a2,
        ),
    ];

    #[test]
    fn microsoft_rss_spec_ipv4_vectors() {
        for (dst, src, ip_hash, tcp_hash) in VECTORS {
            let (d, s) = (sa(dst), sa(src));
            assert_eq!(
                toeplitz(&MICROSOFT_KEY, &ipv4_input(*s.ip(), *d.ip())),
                ip_hash,
                "IPv4 {src} -> {dst}"
            );
            assert_eq!(
                toeplitz(&MICROSOFT_KEY, &ipv4_tcp_input(s, d)),
                tcp_hash,
                "TCP {src} -> {dst}"
            );
        }
    }

    #[test]
    fn hash_is_linear_over_xor() {
        let a = ipv4_tcp_input(sa("198.18.0.2:7"), sa("198.18.0.1:61440"));
        let b = ipv4_tcp_input(sa("0.0.0.0:0"), sa("0.0.0.0:4321"));
        let x: Vec<u8> = a.iter().zip(b).map(|(p, q)| p ^ q).collect();
        assert_eq!(
            toeplitz(&MICROSOFT_KEY, &x),
            toeplitz(&MICROSOFT_KEY, &a) ^ toeplitz(&MICROSOFT_KEY, &b)
        );
    }

    #[test]
    fn round_robin_table_and_bad_configs() {
        let r = RssConfig::round_robin(&MICROSOFT_KEY, 128, 3).unwrap();
        assert_eq!(r.queues(), 3);
        assert_eq!(&r.reta()[..4], &[0, 1, 2, 0]);
        assert_eq!(r.queue_of_hash(4), 1);
        assert_eq!(
            RssConfig::new(&MICROSOFT_KEY[..8], vec![0]),
            Err(RssError::KeyTooShort(8))
        );
        assert_eq!(
            RssConfig::new(&MICROSOFT_KEY, vec![]),
            Err(RssError::EmptyTable)
        );
        assert_eq!(
            RssConfig::round_robin(&MICROSOFT_KEY, 128, 0),
            Err(RssError::NoQueues)
        );
    }
}
