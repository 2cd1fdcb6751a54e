//! The memcached binary protocol: framing, request decoding and reply headers.
//!
//! A request is a 24-byte header (magic `0x80`, opcode, key length u16, extras length
//! u8, data type, vbucket, body length u32, opaque u32, CAS u64; big endian) and a body
//! of extras, key and value. The body length is checked against the key and extras
//! lengths before anything is read (CVE-2016-8704/8705/8706: memcached computed the
//! value length as `bodylen - keylen - extlen` unchecked and overflowed).

use super::{Frame, KEY_MAX};
use crate::parser::{peek, ParseError, ParseErrorKind};
use zbuf::IoVec;

/// Header length.
pub const HDR_LEN: usize = 24;
/// Request magic.
pub const REQ_MAGIC: u8 = 0x80;
/// Response magic.
pub const RES_MAGIC: u8 = 0x81;

/// Opcodes.
pub mod op {
    #![allow(missing_docs)]
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    pub const VERBOSITY: u8 = 0x1b;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;
}

/// Whether `opcode` only reads the store (or nothing): such requests may run side by
/// side ([`crate::parser::Parser::exclusive`]).
pub(crate) fn is_read(opcode: u8) -> bool {
    matches!(
        opcode,
        op::GET | op::GETQ | op::GETK | op::GETKQ | op::NOOP | op::VERSION | op::STAT
    )
}

/// Response status codes.
pub mod status {
    #![allow(missing_docs)]
    pub const OK: u16 = 0x00;
    pub const KEY_ENOENT: u16 = 0x01;
    pub const KEY_EEXISTS: u16 = 0x02;
    pub const E2BIG: u16 = 0x03;
    pub const EINVAL: u16 = 0x04;
    pub const NOT_STORED: u16 = 0x05;
    pub const DELTA_BADVAL: u16 = 0x06;
    pub const UNKNOWN_COMMAND: u16 = 0x81;
    pub const ENOMEM: u16 = 0x82;
}

/// Whether `opcode` is a storage command (its value may be swallowed when too large).
pub fn is_storage(opcode: u8) -> bool {
    matches!(
        opcode,
        op::SET
            | op::ADD
            | op::REPLACE
            | op::APPEND
            | op::PREPEND
            | op::SETQ
            | op::ADDQ
            | op::REPLACEQ
            | op::APPENDQ
            | op::PREPENDQ
    )
}

/// Whether `opcode` is a quiet command (no reply on success; `getq`/`getkq`/`gatq`/
/// `gatkq`: no reply on a miss).
pub fn is_quiet(opcode: u8) -> bool {
    matches!(
        opcode,
        op::GETQ
            | op::GETKQ
            | op::SETQ
            | op::ADDQ
            | op::REPLACEQ
            | op::DELETEQ
            | op::INCREMENTQ
            | op::DECREMENTQ
            | op::QUITQ
            | op::FLUSHQ
            | op::APPENDQ
            | op::PREPENDQ
            | op::GATQ
            | op::GATKQ
    )
}

/// A request or response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// [`REQ_MAGIC`] or [`RES_MAGIC`].
    pub magic: u8,
    /// The command.
    pub opcode: u8,
    /// Key length.
    pub keylen: u16,
    /// Extras length.
    pub extlen: u8,
    /// vbucket (request) or status (response).
    pub status: u16,
    /// Extras + key + value length.
    pub bodylen: u32,
    /// Echoed in the reply.
    pub opaque: u32,
    /// CAS value.
    pub cas: u64,
}

impl Header {
    /// A request header (for clients and tests).
    pub fn request(opcode: u8, keylen: u16, extlen: u8, bodylen: u32, opaque: u32) -> Header {
        Header {
            magic: REQ_MAGIC,
            opcode,
            keylen,
            extlen,
            status: 0,
            bodylen,
            opaque,
            cas: 0,
        }
    }

    /// Reads the first [`HDR_LEN`] bytes of `buf`; `None` if fewer have arrived.
    pub fn read(buf: &IoVec) -> Option<Header> {
        let mut h = [0u8; HDR_LEN];
        if !peek(buf, 0, &mut h) {
            return None;
        }
        let mut cas = [0u8; 8];
        cas.copy_from_slice(&h[16..24]);
        Some(Header {
            magic: h[0],
            opcode: h[1],
            keylen: u16::from_be_bytes([h[2], h[3]]),
            extlen: h[4],
            status: u16::from_be_bytes([h[6], h[7]]),
            bodylen: u32::from_be_bytes([h[8], h[9], h[10], h[11]]),
            opaque: u32::from_be_bytes([h[12], h[13], h[14], h[15]]),
            cas: u64::from_be_bytes(cas),
        })
    }

    /// The header's 24 bytes (data type 0).
    pub fn bytes(&self) -> [u8; HDR_LEN] {
        let mut h = [0u8; HDR_LEN];
        h[0] = self.magic;
        h[1] = self.opcode;
        h[2..4].copy_from_slice(&self.keylen.to_be_bytes());
        h[4] = self.extlen;
        h[6..8].copy_from_slice(&self.status.to_be_bytes());
        h[8..12].copy_from_slice(&self.bodylen.to_be_bytes());
        h[12..16].copy_from_slice(&self.opaque.to_be_bytes());
        h[16..24].copy_from_slice(&self.cas.to_be_bytes());
        h
    }

    /// The response header to this request: same opcode and opaque, `status`, and a
    /// body of `extlen` + `keylen` + `vlen` bytes.
    pub fn response(&self, status: u16, extlen: u8, keylen: u16, vlen: usize, cas: u64) -> Header {
        Header {
            magic: RES_MAGIC,
            opcode: self.opcode,
            keylen,
            extlen,
            status,
            bodylen: (usize::from(extlen) + usize::from(keylen) + vlen) as u32,
            opaque: self.opaque,
            cas,
        }
    }
}

/// Frames the message at the head of a binary stream.
pub(crate) fn frame(buf: &IoVec, max: usize) -> Result<Frame, ParseError> {
    let Some(h) = Header::read(buf) else {
        return Ok(Frame::MORE);
    };
    if h.magic != REQ_MAGIC {
        return Err(ParseError::new(
            ParseErrorKind::Malformed,
            "memcached binary: bad request magic",
        ));
    }
    if usize::from(h.keylen) > KEY_MAX {
        return Err(ParseError::new(
            ParseErrorKind::BadField,
            "memcached binary: key longer than 250 bytes",
        ));
    }
    let head = u64::from(h.keylen) + u64::from(h.extlen);
    // CVE-2016-8704/5/6: the body must hold the key and the extras.
    if head > u64::from(h.bodylen) {
        return Err(ParseError::new(
            ParseErrorKind::BadField,
            "memcached binary: body length below key + extras length",
        ));
    }
    let total = HDR_LEN as u64 + u64::from(h.bodylen);
    if total <= max as u64 {
        return Ok(Frame::msg(total as usize));
    }
    if is_storage(h.opcode) && HDR_LEN as u64 + head <= max as u64 {
        // memcached: E2BIG, then the value is swallowed.
        return Ok(Frame {
            len: HDR_LEN + head as usize,
            swallow: u64::from(h.bodylen) - head,
        });
    }
    Err(ParseError::new(
        ParseErrorKind::TooLarge,
        "memcached binary: request above the message cap",
    ))
}

/// What to write before closing a binary connection whose stream failed with `err`,
/// `buf` holding the bad request at its head (memcached 1.6 does the same): an EINVAL
/// reply ("Invalid arguments") for inconsistent lengths, E2BIG ("Too large.") for a
/// request above the cap, each with the request's opcode and `opaque`; nothing for a bad
/// magic (there is no request to answer).
pub(crate) fn farewell(err: &ParseError, buf: &IoVec) -> Option<Vec<u8>> {
    let h = Header::read(buf)?;
    let (code, text): (u16, &[u8]) = match err.kind() {
        ParseErrorKind::BadField => (status::EINVAL, b"Invalid arguments"),
        ParseErrorKind::TooLarge => (status::E2BIG, b"Too large."),
        ParseErrorKind::Memory => (status::ENOMEM, b"Out of memory"),
        _ => return None,
    };
    if h.magic != REQ_MAGIC {
        return None;
    }
    let mut out = h.response(code, 0, 0, text.len(), 0).bytes().to_vec();
    out.extend_from_slice(text);
    Some(out)
}

/// A decoded binary request: its header and the body's parts (zero copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The header.
    pub header: Header,
    /// The extras.
    pub extras: IoVec,
    /// The key (copied: at most 250 bytes).
    pub key: Vec<u8>,
    /// The value (zero copy).
    pub value: IoVec,
    /// The value was above the cap and is being swallowed (answer E2BIG).
    pub truncated: bool,
}

impl Request {
    /// Decodes one framed binary message; `None` if it is not one (the framer never
    /// yields such a message).
    pub fn decode(msg: &IoVec) -> Option<Request> {
        let header = Header::read(msg)?;
        let e = HDR_LEN + usize::from(header.extlen);
        let k = e + usize::from(header.keylen);
        if header.magic != REQ_MAGIC || msg.len() < k {
            return None;
        }
        let mut key = vec![0u8; usize::from(header.keylen)];
        peek(msg, e, &mut key);
        Some(Request {
            header,
            extras: msg.slice(HDR_LEN..e),
            key,
            value: msg.slice(k..),
            truncated: msg.len() < HDR_LEN + header.bodylen as usize,
        })
    }

    /// The extras as bytes (at most 255).
    pub fn extras_bytes(&self) -> Vec<u8> {
        self.extras.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zbuf::Zbuf;

    fn iov(b: &[u8]) -> IoVec {
        b.chunks(5).map(Zbuf::copy_from_slice).collect()
    }

    fn req(opcode: u8, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut v = Header::request(
            opcode,
            key.len() as u16,
            extras.len() as u8,
            (extras.len() + key.len() + value.len()) as u32,
            0xdead_beef,
        )
        .bytes()
        .to_vec();
        v.extend(extras);
        v.extend(key);
        v.extend(value);
        v
    }

    #[test]
    fn a_request_is_framed_by_its_header_and_decoded_without_copying_the_value() {
        let m = req(op::SET, &[0, 0, 0, 5, 0, 0, 0, 0], b"key", b"value!");
        for cut in 0..m.len() {
            let f = frame(&iov(&m[..cut]), 1 << 20).unwrap();
            let want = if cut < HDR_LEN {
                Frame::MORE
            } else {
                Frame::msg(m.len())
            };
            assert_eq!(f, want, "cut {cut}");
        }
        let r = Request::decode(&iov(&m)).unwrap();
        assert_eq!(r.header.opcode, op::SET);
        assert_eq!(r.header.opaque, 0xdead_beef);
        assert_eq!(r.extras_bytes(), [0, 0, 0, 5, 0, 0, 0, 0]);
        assert_eq!(r.key, b"key");
        assert_eq!(r.value.to_vec(), b"value!");
        assert!(!r.truncated);
    }

    #[test]
    fn bodylen_below_key_plus_extras_closes_the_connection() {
        // CVE-2016-8704/5/6: keylen + extlen > bodylen.
        let mut h = Header::request(op::SET, 10, 8, 17, 0);
        assert_eq!(
            frame(&iov(&h.bytes()), 1 << 20).unwrap_err().kind(),
            ParseErrorKind::BadField
        );
        h.bodylen = 18;
        assert_eq!(frame(&iov(&h.bytes()), 1 << 20), Ok(Frame::msg(42)));
        let h = Header::request(op::APPEND, 200, 255, 100, 0);
        assert_eq!(
            frame(&iov(&h.bytes()), 1 << 20).unwrap_err().kind(),
            ParseErrorKind::BadField
        );
        let h = Header::request(op::GET, 251, 0, 251, 0);
        assert_eq!(
            frame(&iov(&h.bytes()), 1 << 20).unwrap_err().kind(),
            ParseErrorKind::BadField
        );
        let mut bad = Header::request(op::GET, 0, 0, 0, 0).bytes();
        bad[0] = 0x81;
        assert_eq!(
            frame(&iov(&bad), 1 << 20).unwrap_err().kind(),
            ParseErrorKind::Malformed
        );
    }

    #[test]
    fn huge_bodies_are_swallowed_for_storage_and_close_otherwise() {
        let h = Header::request(op::SETQ, 3, 8, u32::MAX, 0);
        assert_eq!(
            frame(&iov(&h.bytes()), 1 << 20),
            Ok(Frame {
                len: HDR_LEN + 11,
                swallow: u64::from(u32::MAX) - 11
            })
        );
        let h = Header::request(op::GET, 3, 0, u32::MAX, 0);
        assert_eq!(
            frame(&iov(&h.bytes()), 1 << 20).unwrap_err().kind(),
            ParseErrorKind::TooLarge
        );
        let mut m = h.bytes().to_vec();
        m.extend(b"abc");
        let r = Request::decode(&iov(&m)).unwrap();
        assert!(r.truncated);
    }

    #[test]
    fn response_header_echoes_opcode_and_opaque() {
        let q = Header::request(op::GETK, 3, 0, 3, 42);
        let r = q.response(status::OK, 4, 3, 10, 9);
        let b = r.bytes();
        assert_eq!(b[0], RES_MAGIC);
        assert_eq!(b[1], op::GETK);
        assert_eq!(Header::read(&iov(&b)), Some(r));
        assert_eq!(r.bodylen, 17);
        assert_eq!(r.opaque, 42);
        assert!(is_quiet(op::GETKQ) && !is_quiet(op::GETK));
    }
}
