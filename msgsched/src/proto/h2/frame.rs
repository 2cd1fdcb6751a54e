//! HTTP/2 frames (RFC 9113 §4, §6): the 9-byte header, type and flag values, error
//! codes, and encoders for the frames a server sends.

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Frame header length.
pub const HEADER_LEN: usize = 9;
/// The default and smallest SETTINGS_MAX_FRAME_SIZE.
pub const DEFAULT_MAX_FRAME: u32 = 16_384;
/// The largest SETTINGS_MAX_FRAME_SIZE.
pub const MAX_MAX_FRAME: u32 = (1 << 24) - 1;
/// The largest flow-control window (2^31 - 1).
pub const MAX_WINDOW: i64 = (1 << 31) - 1;
/// The initial flow-control window of a connection and of new streams.
pub const DEFAULT_WINDOW: i64 = 65_535;

/// Frame type codes.
pub mod kind {
    /// DATA.
    pub const DATA: u8 = 0;
    /// HEADERS.
    pub const HEADERS: u8 = 1;
    /// PRIORITY (deprecated, parsed and ignored).
    pub const PRIORITY: u8 = 2;
    /// RST_STREAM.
    pub const RST_STREAM: u8 = 3;
    /// SETTINGS.
    pub const SETTINGS: u8 = 4;
    /// PUSH_PROMISE (a client must not send it).
    pub const PUSH_PROMISE: u8 = 5;
    /// PING.
    pub const PING: u8 = 6;
    /// GOAWAY.
    pub const GOAWAY: u8 = 7;
    /// WINDOW_UPDATE.
    pub const WINDOW_UPDATE: u8 = 8;
    /// CONTINUATION.
    pub const CONTINUATION: u8 = 9;
}

/// Frame flag bits.
pub mod flag {
    /// END_STREAM (DATA, HEADERS).
    pub const END_STREAM: u8 = 0x1;
    /// ACK (SETTINGS, PING).
    pub const ACK: u8 = 0x1;
    /// END_HEADERS (HEADERS, CONTINUATION).
    pub const END_HEADERS: u8 = 0x4;
    /// PADDED (DATA, HEADERS).
    pub const PADDED: u8 = 0x8;
    /// PRIORITY (HEADERS).
    pub const PRIORITY: u8 = 0x20;
}

/// SETTINGS identifiers (RFC 9113 §6.5.2).
pub mod setting {
    /// SETTINGS_HEADER_TABLE_SIZE.
    pub const HEADER_TABLE_SIZE: u16 = 1;
    /// SETTINGS_ENABLE_PUSH.
    pub const ENABLE_PUSH: u16 = 2;
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub const MAX_CONCURRENT_STREAMS: u16 = 3;
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub const INITIAL_WINDOW_SIZE: u16 = 4;
    /// SETTINGS_MAX_FRAME_SIZE.
    pub const MAX_FRAME_SIZE: u16 = 5;
    /// SETTINGS_MAX_HEADER_LIST_SIZE.
    pub const MAX_HEADER_LIST_SIZE: u16 = 6;
}

/// HTTP/2 error codes (RFC 9113 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// NO_ERROR.
    NoError = 0,
    /// PROTOCOL_ERROR.
    Protocol = 1,
    /// INTERNAL_ERROR.
    Internal = 2,
    /// FLOW_CONTROL_ERROR.
    FlowControl = 3,
    /// SETTINGS_TIMEOUT.
    SettingsTimeout = 4,
    /// STREAM_CLOSED.
    StreamClosed = 5,
    /// FRAME_SIZE_ERROR.
    FrameSize = 6,
    /// REFUSED_STREAM.
    RefusedStream = 7,
    /// CANCEL.
    Cancel = 8,
    /// COMPRESSION_ERROR.
    Compression = 9,
    /// CONNECT_ERROR.
    Connect = 10,
    /// ENHANCE_YOUR_CALM.
    EnhanceYourCalm = 11,
    /// INADEQUATE_SECURITY.
    InadequateSecurity = 12,
    /// HTTP_1_1_REQUIRED.
    Http11Required = 13,
}

impl ErrorCode {
    /// Every code, in value order.
    pub const ALL: [ErrorCode; 14] = [
        ErrorCode::NoError,
        ErrorCode::Protocol,
        ErrorCode::Internal,
        ErrorCode::FlowControl,
        ErrorCode::SettingsTimeout,
        ErrorCode::StreamClosed,
        ErrorCode::FrameSize,
        ErrorCode::RefusedStream,
        ErrorCode::Cancel,
        ErrorCode::Compression,
        ErrorCode::Connect,
        ErrorCode::EnhanceYourCalm,
        ErrorCode::InadequateSecurity,
        ErrorCode::Http11Required,
    ];

    /// The code for a wire value (`None` for unknown codes, which peers may send).
    pub fn from_u32(v: u32) -> Option<ErrorCode> {
        ErrorCode::ALL.get(v as usize).copied()
    }
}

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Payload length (24 bits).
    pub len: u32,
    /// Type code ([`kind`]).
    pub kind: u8,
    /// Flag bits ([`flag`]).
    pub flags: u8,
    /// Stream id (the reserved bit cleared).
    pub stream: u32,
}

impl FrameHeader {
    /// Parses the 9 header bytes.
    pub fn parse(b: &[u8; HEADER_LEN]) -> FrameHeader {
        FrameHeader {
            len: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    /// The 9 header bytes.
    pub fn bytes(&self) -> [u8; HEADER_LEN] {
        let l = self.len.to_be_bytes();
        let s = self.stream.to_be_bytes();
        [
            l[1], l[2], l[3], self.kind, self.flags, s[0], s[1], s[2], s[3],
        ]
    }
}

/// Appends a whole frame with `payload` to `out`.
pub fn put(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let h = FrameHeader {
        len: payload.len() as u32,
        kind,
        flags,
        stream,
    };
    out.extend_from_slice(&h.bytes());
    out.extend_from_slice(payload);
}

/// A SETTINGS frame with `values`.
pub fn settings(out: &mut Vec<u8>, values: &[(u16, u32)]) {
    let mut p = Vec::with_capacity(values.len() * 6);
    for (id, v) in values {
        p.extend_from_slice(&id.to_be_bytes());
        p.extend_from_slice(&v.to_be_bytes());
    }
    put(out, kind::SETTINGS, 0, 0, &p);
}

/// A WINDOW_UPDATE frame.
pub fn window_update(out: &mut Vec<u8>, stream: u32, inc: u32) {
    put(out, kind::WINDOW_UPDATE, 0, stream, &inc.to_be_bytes());
}

/// A RST_STREAM frame.
pub fn rst_stream(out: &mut Vec<u8>, stream: u32, code: ErrorCode) {
    put(
        out,
        kind::RST_STREAM,
        0,
        stream,
        &(code as u32).to_be_bytes(),
    );
}

/// A GOAWAY frame.
pub fn goaway(out: &mut Vec<u8>, last_stream: u32, code: ErrorCode, debug: &[u8]) {
    let mut p = Vec::with_capacity(8 + debug.len());
    p.extend_from_slice(&last_stream.to_be_bytes());
    p.extend_from_slice(&(code as u32).to_be_bytes());
    p.extend_from_slice(debug);
    put(out, kind::GOAWAY, 0, 0, &p);
}

/// A header block as HEADERS + CONTINUATION frames of at most `max_frame` bytes each.
pub fn headers(out: &mut Vec<u8>, stream: u32, block: &[u8], end_stream: bool, max_frame: usize) {
    let max_frame = max_frame.max(1);
    let mut chunks = block.chunks(max_frame).peekable();
    let mut first = true;
    if block.is_empty() {
        let f = flag::END_HEADERS | if end_stream { flag::END_STREAM } else { 0 };
        put(out, kind::HEADERS, f, stream, &[]);
        return;
    }
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        let mut f = if last { flag::END_HEADERS } else { 0 };
        let k = if first {
            if end_stream {
                f |= flag::END_STREAM;
            }
            kind::HEADERS
        } else {
            kind::CONTINUATION
        };
        put(out, k, f, stream, c);
        first = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_drops_the_reserved_bit() {
        let h = FrameHeader {
            len: 0x123456,
            kind: kind::HEADERS,
            flags: 0x25,
            stream: 0x7fff_fffe,
        };
        assert_eq!(FrameHeader::parse(&h.bytes()), h);
        let mut b = h.bytes();
        b[5] |= 0x80;
        assert_eq!(FrameHeader::parse(&b).stream, 0x7fff_fffe);
    }

    #[test]
    fn a_big_header_block_is_split_into_continuations() {
        let mut out = Vec::new();
        headers(&mut out, 3, &[7u8; 40], true, 16);
        let mut at = 0;
        let mut seen = Vec::new();
        while at < out.len() {
            let mut b = [0u8; HEADER_LEN];
            b.copy_from_slice(&out[at..at + HEADER_LEN]);
            let h = FrameHeader::parse(&b);
            seen.push((h.kind, h.flags, h.len));
            at += HEADER_LEN + h.len as usize;
        }
        assert_eq!(
            seen,
            vec![
                (kind::HEADERS, flag::END_STREAM, 16),
                (kind::CONTINUATION, 0, 16),
                (kind::CONTINUATION, flag::END_HEADERS, 8)
            ]
        );
    }
}
