//! memcached, text and binary protocols on one port (the first byte of a connection
//! decides: `0x80` is binary, anything else text, as memcached does).
//!
//! Framing ([`McParser`], the I/O core) is sans-IO over the received io-vectors and copies
//! no payload: a text command line is found by its `\n` within the line cap (header
//! bytes, peeked), a storage command's data block is framed by the line's `<bytes>`
//! count (never by searching the data); a binary request by its 24-byte header's body
//! length, checked against the key and extras lengths (the CVE-2016-8704/5/6 class)
//! before anything else. Decoding a framed message for the server ([`text::Request`],
//! [`binary::Request`]) also only peeks header bytes; values are slices of the message.
//!
//! Errors follow the real server (memcached 1.6):
//! - bad binary magic, `keylen > 250`, `keylen + extlen > bodylen`, a text line with no
//!   `\n` within the line cap (and a multiget line over its cap): the connection is closed
//!   with a counted [`ParseErrorKind`] after the replies to every earlier request and a
//!   last word ([`Parser::farewell`]): EINVAL (E2BIG for a request over the cap) echoing
//!   the request's `opaque`, as memcached writes before it closes; `CLIENT_ERROR line
//!   too long` for a text line; nothing for a bad magic;
//! - a bad command line (unknown command, wrong token count, key over 250 bytes, bad
//!   numbers): the line alone is a message and the server answers `ERROR` /
//!   `CLIENT_ERROR ...`, the connection stays;
//! - a storage command whose value is above the cap: memcached answers
//!   `SERVER_ERROR object too large for cache` (binary: status E2BIG) and swallows the
//!   value. So do we: the command line (binary: header, extras, key) is framed as a
//!   message the server answers with that error, and the value is consumed in chunks of
//!   at most [`SWALLOW_CHUNK`] bytes tagged with stream [`SWALLOW`], which the server
//!   completes without a reply. Memory stays bounded by the framer's caps.
//!
//! Line endings: memcached accepts `\n` alone as well as `\r\n` at the end of a command
//! line (it strips one `\r` before the `\n`), and so do we; the data block of a storage
//! command must be followed by exactly `\r\n` (`<bytes>` counts only the data), else
//! the server answers `CLIENT_ERROR bad data chunk` having consumed `<bytes> + 2` bytes,
//! as memcached does. Tokens and keys are computed from the line without its ending in
//! both cases, so an LF-only line cannot shift a count by one (the CVE-2023-46853 class:
//! memcached's proxy miscounted the keys of `\n`-terminated multigets); tests pin both.
//!
//! Reply order: both protocols are [`Ordering::Ordered`]. memcached answers a
//! connection's requests in order, and binary clients depend on it: quiet commands
//! (`getq`, `getkq`, `setq`, ...) answer only on a miss or an error and a following
//! `noop` is the flush point that says every earlier request has been answered, which
//! holds only if no reply overtakes it.
//!
//! Execution order: memcached runs a connection's commands one after another, so a `get`
//! pipelined behind its `set` (or sent after a `noreply` set, pymemcache's default) sees
//! the value. Ordered replies alone do not give that when the scheduling model spreads
//! one connection's messages over workers (MS): so every command other than a read is
//! [`Parser::exclusive`] (it runs alone on its connection, after the ones before it and
//! before the ones after it), and reads (`get`, `gets`; binary `get`, `getq`, `getk`,
//! `getkq`, `noop`, `version`, `stat`) and swallowed chunks may still run side by side.

pub mod binary;
pub mod meta;
pub mod text;

use crate::parser::{peek, Ordering, ParseError, ParseErrorKind, Parser};
use zbuf::{IoVec, Zbuf};

/// Longest key, in bytes (memcached's `KEY_MAX_LENGTH`).
pub const KEY_MAX: usize = 250;
/// Stream tag of a swallowed chunk of a too-large value: the server completes it
/// without a reply.
pub const SWALLOW: u64 = u64::MAX;
/// Stream tag of a binary-protocol message (text messages have none). The replies are
/// ordered either way; the tag only tells the server how to read the message.
pub const BINARY: u64 = u64::MAX - 1;
/// Largest swallowed chunk.
pub const SWALLOW_CHUNK: usize = 64 << 10;

/// Per-connection limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest text command line (ending included), other than a retrieval command's.
    /// memcached closes a connection that sends 2048 bytes without a `\n`, except for
    /// `get`/`gets`, whose lines it lets grow without bound.
    pub line_max: usize,
    /// Longest `get`/`gets`/`gat`/`gats` line: memcached has no bound; ours is this one
    /// (and so at most `multiget_max / 2` keys per command).
    pub multiget_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            line_max: 2048,
            multiget_max: 64 << 10,
        }
    }
}

/// Which protocol a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// The ASCII protocol.
    Text,
    /// The binary protocol (first byte `0x80`).
    Binary,
}

/// What a framed message is, from its origin's stream tag (see [`McParser`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgKind {
    /// A text command (line and data block).
    Text,
    /// A binary request.
    Binary,
    /// A chunk of a too-large value being swallowed: complete it without a reply.
    Swallow,
}

/// The kind of a message whose origin carries `stream`.
pub fn kind(stream: Option<u64>) -> MsgKind {
    match stream {
        Some(SWALLOW) => MsgKind::Swallow,
        Some(BINARY) => MsgKind::Binary,
        _ => MsgKind::Text,
    }
}

/// The memcached parser of one connection: text or binary, chosen by its first byte.
#[derive(Debug, Clone, Default)]
pub struct McParser {
    limits: Limits,
    proto: Option<Protocol>,
    /// Bytes of a too-large value still to swallow.
    swallow: u64,
    /// The message just framed is a swallowed chunk.
    swallowing: bool,
    /// Head bytes known to hold no `\n` (text).
    scanned: usize,
}

impl McParser {
    /// A parser with `limits`.
    pub fn new(limits: Limits) -> Self {
        McParser {
            limits,
            ..McParser::default()
        }
    }

    /// The connection's protocol, once its first byte has arrived.
    pub fn protocol(&self) -> Option<Protocol> {
        self.proto
    }
}

impl Parser for McParser {
    fn parse(&mut self, buf: &IoVec, max: usize) -> Result<usize, ParseError> {
        self.swallowing = false;
        if self.swallow > 0 {
            let n = (self.swallow.min(SWALLOW_CHUNK as u64) as usize).min(max.max(1));
            self.swallow -= n as u64;
            self.swallowing = true;
            return Ok(n);
        }
        let proto = match self.proto {
            Some(p) => p,
            None => {
                let mut b = [0u8; 1];
                if !peek(buf, 0, &mut b) {
                    return Ok(0);
                }
                let p = if b[0] == binary::REQ_MAGIC {
                    Protocol::Binary
                } else {
                    Protocol::Text
                };
                self.proto = Some(p);
                p
            }
        };
        let f = match proto {
            Protocol::Text => text::frame(buf, max, &self.limits, &mut self.scanned)?,
            Protocol::Binary => binary::frame(buf, max)?,
        };
        self.swallow = f.swallow;
        Ok(f.len)
    }

    fn ordering(&self) -> Ordering {
        Ordering::Ordered
    }

    fn farewell(&mut self, err: &ParseError, buf: &IoVec) -> Option<Zbuf> {
        let bytes = match self.proto? {
            Protocol::Text if err.kind() == ParseErrorKind::TooLarge => {
                text::LINE_TOO_LONG.to_vec()
            }
            // memcached's own answer when it cannot buffer a value.
            Protocol::Text if err.kind() == ParseErrorKind::Memory => text::OUT_OF_MEMORY.to_vec(),
            Protocol::Text => return None,
            Protocol::Binary => binary::farewell(err, buf)?,
        };
        Some(Zbuf::copy_from_slice(&bytes))
    }

    fn exclusive(&self, msg: &IoVec) -> bool {
        if self.swallowing {
            return false;
        }
        match self.proto {
            Some(Protocol::Binary) => {
                let mut h = [0u8; 2];
                !(peek(msg, 0, &mut h) && binary::is_read(h[1]))
            }
            _ => {
                let mut head = [0u8; 16];
                let n = head.len().min(msg.len());
                peek(msg, 0, &mut head[..n]);
                !text::is_read(&head[..n])
            }
        }
    }

    fn stream(&self, _msg: &IoVec) -> Option<u64> {
        if self.swallowing {
            Some(SWALLOW)
        } else if self.proto == Some(Protocol::Binary) {
            Some(BINARY)
        } else {
            None
        }
    }
}

/// What a protocol's framing found at the head of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame {
    /// Length of the next message (0: need more bytes).
    pub len: usize,
    /// Bytes after it to swallow (a value above the cap).
    pub swallow: u64,
}

impl Frame {
    pub(crate) const MORE: Frame = Frame { len: 0, swallow: 0 };

    pub(crate) fn msg(len: usize) -> Frame {
        Frame { len, swallow: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framer::{Framer, FramerConfig};
    use crate::parser::ParseErrorKind;
    use zbuf::Zbuf;

    fn framer(max: usize) -> Framer<McParser> {
        Framer::new(
            McParser::new(Limits::default()),
            FramerConfig {
                max_message: max,
                max_in_flight: 1 << 16,
                ..FramerConfig::default()
            },
        )
        .unwrap()
    }

    /// Every message the framer yields for `input` pushed in pieces of `step` bytes.
    fn frames(
        input: &[u8],
        step: usize,
        max: usize,
    ) -> Result<Vec<(Vec<u8>, bool)>, ParseErrorKind> {
        let mut f = framer(max);
        let mut out = Vec::new();
        for c in input.chunks(step.max(1)) {
            f.push(Zbuf::copy_from_slice(c));
            loop {
                match f.next_message() {
                    Ok(Some(m)) => {
                        out.push((m.body.to_vec(), m.stream == Some(SWALLOW)));
                        f.reply_done();
                    }
                    Ok(None) => break,
                    Err(e) => return Err(e.kind()),
                }
            }
        }
        Ok(out)
    }

    #[test]
    fn first_byte_chooses_the_protocol() {
        let mut p = McParser::new(Limits::default());
        assert_eq!(p.parse(&IoVec::new(), 1 << 20), Ok(0));
        assert_eq!(p.protocol(), None);
        let b: IoVec = [Zbuf::copy_from_slice(&[0x80])].into_iter().collect();
        assert_eq!(p.parse(&b, 1 << 20), Ok(0));
        assert_eq!(p.protocol(), Some(Protocol::Binary));
        let mut p = McParser::new(Limits::default());
        let b: IoVec = [Zbuf::copy_from_slice(b"ver")].into_iter().collect();
        assert_eq!(p.parse(&b, 1 << 20), Ok(0));
        assert_eq!(p.protocol(), Some(Protocol::Text));
    }

    #[test]
    fn too_large_text_value_is_answered_and_swallowed_in_bounded_chunks() {
        let value = vec![b'x'; 200_000];
        let mut input = format!("set k 0 0 {}\r\n", value.len()).into_bytes();
        input.extend(&value);
        input.extend(b"\r\nget k\r\n");
        for step in [7usize, 1000, 1 << 20] {
            let got = frames(&input, step, 4096).unwrap();
            assert_eq!(
                got[0],
                (format!("set k 0 0 {}\r\n", value.len()).into_bytes(), false)
            );
            let swallowed: usize = got.iter().filter(|m| m.1).map(|m| m.0.len()).sum();
            assert_eq!(swallowed, value.len() + 2);
            assert!(got.iter().all(|m| m.0.len() <= SWALLOW_CHUNK.min(4096)));
            assert_eq!(got.last().unwrap(), &(b"get k\r\n".to_vec(), false));
        }
    }

    #[test]
    fn too_large_binary_value_is_answered_and_swallowed() {
        let key = b"kk";
        let mut m = binary::Header {
            magic: binary::REQ_MAGIC,
            opcode: binary::op::SET,
            keylen: 2,
            extlen: 8,
            status: 0,
            bodylen: 8 + 2 + 10_000,
            opaque: 7,
            cas: 0,
        }
        .bytes()
        .to_vec();
        m.extend([0u8; 8]);
        m.extend(key);
        m.extend(vec![1u8; 10_000]);
        let noop = binary::Header::request(binary::op::NOOP, 0, 0, 0, 9).bytes();
        m.extend(noop);
        let got = frames(&m, 999, 4096).unwrap();
        assert_eq!(got[0].0.len(), 24 + 8 + 2);
        assert!(!got[0].1);
        let swallowed: usize = got.iter().filter(|m| m.1).map(|m| m.0.len()).sum();
        assert_eq!(swallowed, 10_000);
        assert_eq!(got.last().unwrap().0, noop.to_vec());
    }

    /// Which framed messages must run alone: everything but reads and swallowed chunks.
    fn exclusives(input: &[u8]) -> Vec<bool> {
        let mut p = McParser::new(Limits::default());
        let mut buf: IoVec = [Zbuf::copy_from_slice(input)].into_iter().collect();
        let mut out = Vec::new();
        loop {
            let n = p.parse(&buf, 4096).unwrap();
            if n == 0 {
                return out;
            }
            let m = buf.split_to(n);
            out.push(p.exclusive(&m));
        }
    }

    #[test]
    fn writes_run_alone_and_reads_side_by_side() {
        for nl in ["\r\n", "\n"] {
            let s = format!(
                "get a{nl}gets a b{nl}set a 0 0 1{nl}x\r\ndelete a{nl}incr n 1{nl}touch a 1{nl}gat 1 a{nl}flush_all{nl}version{nl}bogus{nl}set big 0 0 5000{nl}{}\r\nget a{nl}",
                "z".repeat(5000)
            );
            let got = exclusives(s.as_bytes());
            // get, gets: reads; set .. bogus: alone (gat touches, version and unknown
            // commands are not worth telling apart); the too-large set alone, its two
            // swallowed chunks (4,096 + 906 bytes) not; the last get a read.
            let want = [
                false, false, true, true, true, true, true, true, true, true, true, false, false,
                false,
            ];
            assert_eq!(got, want, "{nl:?}");
        }
        // Every meta command changes its item (`h`, `l`, `T`, `N`, `R`): alone, an `ms`
        // with its data block as one message.
        assert_eq!(
            exclusives(b"mg a v\r\nms a 1 T0\r\nx\r\nmd a\r\nma a\r\nme a\r\nmn\r\n"),
            [true; 6]
        );
        let mut b = Vec::new();
        for opcode in [
            binary::op::GETKQ,
            binary::op::NOOP,
            binary::op::SETQ,
            binary::op::DELETE,
        ] {
            b.extend(binary::Header::request(opcode, 0, 0, 0, 1).bytes());
        }
        assert_eq!(exclusives(&b), [false, false, true, true]);
    }

    /// A meta stream, any segmentation: `ms` data blocks (holding `\r\n` and a whole
    /// command) framed by their count, bad `ms` lines alone, a too-large one swallowed.
    #[test]
    fn meta_framing_is_independent_of_segmentation() {
        let input = format!(
            "ms a 13 T0 q\r\nab\r\nmg x v\r\n!\r\nmg a v k O1\r\nms b x\r\nxy\r\nms c 2 Z\r\nzz\r\nms big 5000 T0\r\n{}\r\nmn\r\n",
            "z".repeat(5000)
        );
        let whole = frames(input.as_bytes(), input.len(), 1024).unwrap();
        for step in [1, 2, 3, 7, 64, 1000] {
            assert_eq!(
                frames(input.as_bytes(), step, 1024).unwrap(),
                whole,
                "{step}"
            );
        }
        let msgs: Vec<&[u8]> = whole.iter().filter(|m| !m.1).map(|m| &m.0[..]).collect();
        let want: [&[u8]; 7] = [
            b"ms a 13 T0 q\r\nab\r\nmg x v\r\n!\r\n",
            b"mg a v k O1\r\n",
            b"ms b x\r\n",
            b"xy\r\n",
            b"ms c 2 Z\r\nzz\r\n",
            b"ms big 5000 T0\r\n",
            b"mn\r\n",
        ];
        assert_eq!(msgs, want);
    }

    proptest::proptest! {
        /// Any segmentation of a mixed text stream gives the same messages.
        #[test]
        fn text_framing_is_independent_of_segmentation(step in 1usize..64, lf_only in proptest::bool::ANY) {
            let nl = if lf_only { "\n" } else { "\r\n" };
            let input = format!(
                "set a 1 0 5{nl}hello\r\nget a b c{nl}delete a{nl}incr n 5{nl}cas a 0 0 3 99 noreply{nl}x\ny\r\nversion{nl}set big 0 0 5000{nl}{}\r\nquit{nl}",
                "z".repeat(5000)
            );
            let whole = frames(input.as_bytes(), input.len(), 1024).unwrap();
            let split = frames(input.as_bytes(), step, 1024).unwrap();
            proptest::prop_assert_eq!(&whole, &split);
            let msgs: Vec<&[u8]> = whole.iter().filter(|m| !m.1).map(|m| &m.0[..]).collect();
            proptest::prop_assert_eq!(msgs.len(), 8);
            proptest::prop_assert_eq!(msgs[0].to_vec(), format!("set a 1 0 5{nl}hello\r\n").into_bytes());
            proptest::prop_assert_eq!(msgs[4].to_vec(), format!("cas a 0 0 3 99 noreply{nl}x\ny\r\n").into_bytes());
        }
    }
}
