//! Message parsers: where one RPC ends in a connection's byte stream.
//!
//! Contract (Linux strparser's, which KCM and Rakaia use): given the unconsumed bytes at
//! the head of a connection, [`Parser::parse`] returns
//! - `Ok(n)` with `n > 0`: the next message is the first `n` bytes (they may not all have
//!   arrived yet; the framer waits for them);
//! - `Ok(0)`: not enough bytes to tell; call again when more arrive;
//! - `Err(e)`: the stream cannot be framed; the connection is closed and `e.kind()` counted.
//!
//! A parser only reads: bytes are never copied out of the zero-copy buffers except the
//! few header bytes it inspects ([`peek`]), and the message itself is a slice of them.
//! A parser also says whether its protocol's replies must go out in request order
//! ([`Ordering::Ordered`]: knb as a pipelined RPC, memcached text) or may go out as each
//! completes ([`Ordering::Unordered`]: replies carry the request's id, as knb
//! `--unordered`, HTTP/2 streams, memcached binary with `opaque`).

use core::fmt;
use zbuf::{IoVec, Zbuf};

/// Whether replies must leave in request order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    /// Replies go out in the order the requests arrived, whatever order workers finish
    /// them in (a bounded per-connection reorder slot holds early ones).
    Ordered,
    /// Each reply goes out as soon as it is complete.
    Unordered,
}

/// Why a stream could not be framed; each kind is counted separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ParseErrorKind {
    /// The bytes are not this protocol (bad magic, bad version, bad syntax).
    Malformed,
    /// A message larger than the configured cap (or the protocol's own limit).
    TooLarge,
    /// A field value the protocol forbids (unknown flags, inconsistent lengths).
    BadField,
    /// Not the peer's error: the I/O core's receive-memory budget was exhausted with
    /// nothing in flight to release any, and this connection held the most
    /// ([`crate::socket`], "Receive memory").
    Memory,
}

impl ParseErrorKind {
    /// Every kind, in counter order.
    pub const ALL: [ParseErrorKind; 4] = [
        ParseErrorKind::Malformed,
        ParseErrorKind::TooLarge,
        ParseErrorKind::BadField,
        ParseErrorKind::Memory,
    ];

    /// Short name for counters and logs.
    pub fn name(self) -> &'static str {
        match self {
            ParseErrorKind::Malformed => "malformed",
            ParseErrorKind::TooLarge => "too_large",
            ParseErrorKind::BadField => "bad_field",
            ParseErrorKind::Memory => "memory_pressure",
        }
    }
}

/// A framing error: its kind and a static description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseError {
    kind: ParseErrorKind,
    what: &'static str,
}

impl ParseError {
    /// An error of `kind` described by `what`.
    pub const fn new(kind: ParseErrorKind, what: &'static str) -> Self {
        ParseError { kind, what }
    }

    /// The counted kind.
    pub fn kind(&self) -> ParseErrorKind {
        self.kind
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.name(), self.what)
    }
}

impl std::error::Error for ParseError {}

/// One connection's message parser (one instance per connection; it may keep state).
pub trait Parser: Send {
    /// The length of the message at the head of `buf`, 0 if it cannot be told yet, or why
    /// the stream is broken (see the module docs). `max` is the configured message cap:
    /// a parser that learns a length above it returns [`ParseErrorKind::TooLarge`].
    fn parse(&mut self, buf: &IoVec, max: usize) -> Result<usize, ParseError>;

    /// Whether this protocol's replies go out in request order.
    fn ordering(&self) -> Ordering;

    /// The stream id of the message `msg` (as returned by the framer), where the protocol
    /// has streams or request ids that replies are matched by; `None` otherwise.
    fn stream(&self, _msg: &IoVec) -> Option<u64> {
        None
    }

    /// Whether the message `msg` (as returned by the framer, asked right after
    /// [`Parser::stream`]) must run alone on its connection: the framer holds it until
    /// every earlier message of the connection has completed and takes no later one until
    /// it has ([`crate::framer`]). For requests that act on state later requests of the
    /// connection may read (memcached's writes): without it, a model that spreads one
    /// connection's messages over workers (MS) may run a pipelined `get` before the `set`
    /// ahead of it. `false` (the default): messages are independent and may run side by
    /// side.
    fn exclusive(&self, _msg: &IoVec) -> bool {
        false
    }

    /// The bytes to write before closing a connection whose stream failed with `err`
    /// (memcached: `CLIENT_ERROR line too long`, a binary EINVAL reply echoing the bad
    /// request's `opaque`), or `None` to close without a word. `buf` holds the unconsumed
    /// bytes the error was found in (the bad request at its head). The message socket
    /// writes them after the replies to every earlier request of the connection, then
    /// closes it gracefully ([`crate::socket::IoEvent::Shutdown`] with the error's kind).
    fn farewell(&mut self, _err: &ParseError, _buf: &IoVec) -> Option<Zbuf> {
        None
    }
}

/// Copies `out.len()` bytes starting at `off` of `buf` into `out`; `false` (and `out`
/// unspecified) if `buf` is shorter. For header bytes only: not counted as a payload copy.
pub fn peek(buf: &IoVec, off: usize, out: &mut [u8]) -> bool {
    if off.checked_add(out.len()).is_none_or(|end| end > buf.len()) {
        return false;
    }
    let (mut skip, mut at) = (off, 0);
    for chunk in buf.chunks() {
        if at == out.len() {
            break;
        }
        if skip >= chunk.len() {
            skip -= chunk.len();
            continue;
        }
        let k = (chunk.len() - skip).min(out.len() - at);
        out[at..at + k].copy_from_slice(&chunk[skip..skip + k]);
        at += k;
        skip = 0;
    }
    at == out.len()
}

/// knb's RPC framing (examples/knb/src/proto.rs): a 16-byte header `id u64 | len u32 |
/// flags u16 | magic u16 = 0x6e6b` (little endian), then `len` payload bytes.
pub mod knb {
    use super::{peek, Ordering, ParseError, ParseErrorKind, Parser};
    use zbuf::IoVec;

    /// Header length.
    pub const HDR_LEN: usize = 16;
    /// The header's magic ("kn").
    pub const MAGIC: u16 = 0x6e6b;
    /// knb's own payload limit (1 MiB).
    pub const MAX_PAYLOAD: u32 = 1 << 20;
    /// Flag bits a request may carry: VERIFY 2, NOREPLY 4, MARK 8, SYNC 16, SERVICE 32
    /// (a service-time tag in the first 8 payload bytes; RESPONSE = 1 is not one of them).
    pub const REQUEST_FLAGS: u16 = 2 | 4 | 8 | 16 | 32;
    /// The SERVICE flag.
    pub const SERVICE: u16 = 32;
    /// The RESPONSE flag.
    pub const RESPONSE: u16 = 1;

    /// A parsed knb header.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Header {
        /// Request id (a reply repeats it).
        pub id: u64,
        /// Payload length.
        pub len: u32,
        /// Flag bits.
        pub flags: u16,
    }

    impl Header {
        /// Parse the first [`HDR_LEN`] bytes of `buf`; `Ok(None)` if fewer have arrived.
        pub fn read(buf: &IoVec) -> Result<Option<Header>, ParseError> {
            let mut h = [0u8; HDR_LEN];
            if !peek(buf, 0, &mut h) {
                return Ok(None);
            }
            if u16::from_le_bytes([h[14], h[15]]) != MAGIC {
                return Err(ParseError::new(
                    ParseErrorKind::Malformed,
                    "knb: bad magic (not knb framing, or the stream lost sync)",
                ));
            }
            let mut id = [0u8; 8];
            id.copy_from_slice(&h[..8]);
            Ok(Some(Header {
                id: u64::from_le_bytes(id),
                len: u32::from_le_bytes([h[8], h[9], h[10], h[11]]),
                flags: u16::from_le_bytes([h[12], h[13]]),
            }))
        }

        /// The header's 16 bytes.
        pub fn bytes(&self) -> [u8; HDR_LEN] {
            let mut h = [0u8; HDR_LEN];
            h[..8].copy_from_slice(&self.id.to_le_bytes());
            h[8..12].copy_from_slice(&self.len.to_le_bytes());
            h[12..14].copy_from_slice(&self.flags.to_le_bytes());
            h[14..16].copy_from_slice(&MAGIC.to_le_bytes());
            h
        }
    }

    /// The knb request parser. Ordered: replies in request order (knb's default client
    /// checks that); unordered: replies matched by id (`knb --unordered`).
    #[derive(Debug, Clone, Copy)]
    pub struct KnbParser {
        ordering: Ordering,
    }

    impl KnbParser {
        /// A parser for requests whose replies go out in `ordering`.
        pub fn new(ordering: Ordering) -> Self {
            KnbParser { ordering }
        }
    }

    impl Parser for KnbParser {
        fn parse(&mut self, buf: &IoVec, max: usize) -> Result<usize, ParseError> {
            let Some(h) = Header::read(buf)? else {
                return Ok(0);
            };
            if h.flags & !REQUEST_FLAGS != 0 {
                return Err(ParseError::new(
                    ParseErrorKind::BadField,
                    "knb: unknown flag bits or a RESPONSE where a request was expected",
                ));
            }
            if h.len > MAX_PAYLOAD {
                return Err(ParseError::new(
                    ParseErrorKind::TooLarge,
                    "knb: payload above knb's 1 MiB limit",
                ));
            }
            let total = HDR_LEN + h.len as usize;
            if total > max {
                return Err(ParseError::new(
                    ParseErrorKind::TooLarge,
                    "knb: message above the configured cap",
                ));
            }
            Ok(total)
        }

        fn ordering(&self) -> Ordering {
            self.ordering
        }

        fn stream(&self, msg: &IoVec) -> Option<u64> {
            match self.ordering {
                Ordering::Ordered => None,
                Ordering::Unordered => Header::read(msg).ok().flatten().map(|h| h.id),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::knb::{Header, KnbParser, HDR_LEN, MAGIC};
    use super::*;
    use zbuf::Zbuf;

    fn iov(parts: &[&[u8]]) -> IoVec {
        parts.iter().map(|p| Zbuf::copy_from_slice(p)).collect()
    }

    fn req(id: u64, len: u32, flags: u16) -> Vec<u8> {
        let mut v = Header { id, len, flags }.bytes().to_vec();
        v.extend((0..len).map(|i| i as u8));
        v
    }

    #[test]
    fn peek_reads_across_segments_and_refuses_short_buffers() {
        let b = iov(&[b"ab", b"", b"cde", b"f"]);
        let mut out = [0u8; 4];
        assert!(peek(&b, 1, &mut out));
        assert_eq!(&out, b"bcde");
        assert!(peek(&b, 5, &mut out[..1]));
        assert_eq!(out[0], b'f');
        assert!(!peek(&b, 3, &mut out));
        assert!(!peek(&b, usize::MAX, &mut out));
        assert!(peek(&b, 6, &mut []));
    }

    #[test]
    fn knb_header_split_over_segments_is_framed() {
        let m = req(7, 100, 0);
        let mut p = KnbParser::new(Ordering::Ordered);
        for cut in 0..HDR_LEN {
            let b = iov(&[&m[..cut]]);
            assert_eq!(p.parse(&b, 1 << 20), Ok(0), "cut {cut}");
        }
        let b = iov(&[&m[..3], &m[3..9], &m[9..17]]);
        assert_eq!(p.parse(&b, 1 << 20), Ok(HDR_LEN + 100));
    }

    #[test]
    fn knb_bad_input_is_an_error_of_the_right_kind() {
        let mut p = KnbParser::new(Ordering::Ordered);
        let mut bad = req(1, 0, 0);
        bad[14] ^= 0xff;
        assert_eq!(
            p.parse(&iov(&[&bad]), 1 << 20).unwrap_err().kind(),
            ParseErrorKind::Malformed
        );
        let resp = req(1, 0, knb::RESPONSE);
        assert_eq!(
            p.parse(&iov(&[&resp]), 1 << 20).unwrap_err().kind(),
            ParseErrorKind::BadField
        );
        let mut huge = Header {
            id: 1,
            len: u32::MAX,
            flags: 0,
        }
        .bytes()
        .to_vec();
        huge.push(0);
        assert_eq!(
            p.parse(&iov(&[&huge]), 1 << 20).unwrap_err().kind(),
            ParseErrorKind::TooLarge
        );
        let big = req(1, 4096, 0);
        assert_eq!(
            p.parse(&iov(&[&big]), 4096).unwrap_err().kind(),
            ParseErrorKind::TooLarge
        );
        assert_eq!(p.parse(&iov(&[&big]), 4096 + HDR_LEN), Ok(4096 + HDR_LEN));
        assert_eq!(MAGIC.to_le_bytes(), [0x6b, 0x6e]);
    }

    #[test]
    fn knb_unordered_messages_carry_their_id_as_stream() {
        let m = iov(&[&req(0xfeed, 3, 0)]);
        assert_eq!(KnbParser::new(Ordering::Unordered).stream(&m), Some(0xfeed));
        assert_eq!(KnbParser::new(Ordering::Ordered).stream(&m), None);
    }
}
