//! The knb RPC framing and the sans-IO connection engines every stack shares.
//!
//! A message is a 16-byte header followed by `len` payload bytes:
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0..8 | id (u64 LE) | request id; a response repeats its request's id |
//! | 8..12 | len (u32 LE) | payload bytes that follow the header |
//! | 12..14 | flags (u16 LE) | [`flags`] |
//! | 14..16 | magic (u16 LE) | [`MAGIC`], catches a desynchronised stream |
//!
//! Flags: RESPONSE 1, VERIFY 2, NOREPLY 4, MARK 8, SYNC 16, SERVICE 32 ([`flags`]).
//! A request with SERVICE carries a service-time tag as its first 8 payload bytes:
//!
//! | payload bytes | field | meaning |
//! |---|---|---|
//! | 0..8 | service (u64 LE) | nanoseconds the server keeps a worker busy with this request before replying (`--service`, [`crate::service`]) |
//! | 8..len | payload | zeros, or the VERIFY pattern from offset 8 on |
//!
//! so `len >= 8` (a shorter SERVICE request is [`ProtoError::BadTag`]). Responses never carry
//! SERVICE. Without `--unordered` responses come in request order ([`ProtoError::IdMismatch`]
//! otherwise); with it, by id in any order ([`ProtoError::UnknownId`] for an id not
//! outstanding).
//!
//! The engines ([`ClientConn`], [`ServerConn`]) never touch a socket: a backend feeds
//! them received bytes (`on_rx`) and writes what they queue (`tx` / `consume_tx`). So
//! the kernel, smoltcp and luna backends differ only in how bytes move.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::time::Instant;

/// Header length in bytes.
pub const HDR_LEN: usize = 16;
/// The header's magic ("kn").
pub const MAGIC: u16 = 0x6e6b;
/// Largest payload accepted (1 MiB bounds what a peer can make us buffer).
pub const MAX_PAYLOAD: u32 = 1 << 20;

/// Header flag bits.
pub mod flags {
    /// The message is a response.
    pub const RESPONSE: u16 = 1;
    /// The payload carries the [`super::pattern_byte`] pattern and must be checked; the
    /// server answers with a patterned payload too.
    pub const VERIFY: u16 = 2;
    /// Bulk data: counted by the server, never answered.
    pub const NOREPLY: u16 = 4;
    /// Bulk: start of the measured window (server notes time and byte count).
    pub const MARK: u16 = 8;
    /// Bulk: end of the stream; the server answers with [`super::SyncReport`].
    pub const SYNC: u16 = 16;
    /// The request's first 8 payload bytes are its service time in ns (u64 LE): the server
    /// occupies a worker that long before replying.
    pub const SERVICE: u16 = 32;
    /// All bits defined.
    pub const ALL: u16 = RESPONSE | VERIFY | NOREPLY | MARK | SYNC | SERVICE;
}

/// What is wrong with a received stream. Any of these ends the connection's run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtoError {
    /// The magic did not match: the stream is not knb framing or lost sync.
    BadMagic(u16),
    /// Unknown flag bits.
    BadFlags(u16),
    /// `len` above [`MAX_PAYLOAD`].
    TooLong(u32),
    /// A response arrived with no request outstanding.
    Unsolicited(u64),
    /// A response's id is not the oldest outstanding request's.
    IdMismatch {
        /// The id expected (oldest outstanding).
        expected: u64,
        /// The id received.
        got: u64,
    },
    /// A response of the wrong size.
    WrongLength {
        /// Expected payload bytes.
        expected: u32,
        /// Received payload bytes.
        got: u32,
    },
    /// A request where a response was expected, or the reverse.
    WrongDirection(u64),
    /// A payload byte differs from the pattern (verify mode).
    Corrupt {
        /// Message id.
        id: u64,
        /// Offset in the payload.
        offset: u32,
    },
    /// A bulk SYNC report of the wrong size or with a byte count that differs from what
    /// the client sent.
    BulkMismatch {
        /// Payload bytes the client sent.
        sent: u64,
        /// Payload bytes the server says it received.
        received: u64,
    },
    /// Unordered mode: a response whose id matches no outstanding request.
    UnknownId(u64),
    /// A SERVICE request too short to hold its 8-byte tag.
    BadTag(u64),
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::BadMagic(m) => write!(f, "bad magic {m:#06x} (stream out of sync)"),
            ProtoError::BadFlags(x) => write!(f, "unknown flags {x:#06x}"),
            ProtoError::TooLong(n) => write!(f, "payload length {n} above {MAX_PAYLOAD}"),
            ProtoError::Unsolicited(id) => write!(f, "response {id} with no request outstanding"),
            ProtoError::IdMismatch { expected, got } => {
                write!(f, "response id {got}, expected {expected}")
            }
            ProtoError::WrongLength { expected, got } => {
                write!(f, "response of {got} B, expected {expected} B")
            }
            ProtoError::WrongDirection(id) => write!(f, "message {id} has the wrong direction"),
            ProtoError::Corrupt { id, offset } => {
                write!(f, "payload of message {id} corrupt at byte {offset}")
            }
            ProtoError::BulkMismatch { sent, received } => {
                write!(
                    f,
                    "bulk: sent {sent} payload bytes, server received {received}"
                )
            }
            ProtoError::UnknownId(id) => {
                write!(f, "response id {id} matches no outstanding request")
            }
            ProtoError::BadTag(id) => write!(
                f,
                "request {id} has the SERVICE flag but fewer than 8 payload bytes"
            ),
        }
    }
}

impl std::error::Error for ProtoError {}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Request id.
    pub id: u64,
    /// Payload length.
    pub len: u32,
    /// [`flags`] bits.
    pub flags: u16,
}

impl Header {
    /// The 16 header bytes.
    pub fn encode(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..14].copy_from_slice(&self.flags.to_le_bytes());
        b[14..16].copy_from_slice(&MAGIC.to_le_bytes());
        b
    }

    /// Parses and checks magic, flags and length.
    pub fn decode(b: &[u8; HDR_LEN]) -> Result<Header, ProtoError> {
        let magic = u16::from_le_bytes([b[14], b[15]]);
        if magic != MAGIC {
            return Err(ProtoError::BadMagic(magic));
        }
        let flags = u16::from_le_bytes([b[12], b[13]]);
        if flags & !flags::ALL != 0 {
            return Err(ProtoError::BadFlags(flags));
        }
        let len = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if len > MAX_PAYLOAD {
            return Err(ProtoError::TooLong(len));
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&b[0..8]);
        Ok(Header {
            id: u64::from_le_bytes(id),
            len,
            flags,
        })
    }
}

/// Salt of request payloads.
pub const SALT_REQ: u64 = 0x11;
/// Salt of response payloads (differs so an echoed request does not pass as a response).
pub const SALT_RESP: u64 = 0x5a;

/// Byte `offset` of the verify pattern of message `id`: depends on the id, so a
/// response to the wrong request or a shifted stream fails the check.
#[inline]
pub fn pattern_byte(id: u64, salt: u64, offset: u32) -> u8 {
    (id.wrapping_mul(131)
        .wrapping_add(salt)
        .wrapping_add(offset as u64)
        & 0xff) as u8
}

fn push_pattern(out: &mut Vec<u8>, id: u64, salt: u64, len: u32) {
    push_pattern_from(out, id, salt, 0, len);
}

fn push_pattern_from(out: &mut Vec<u8>, id: u64, salt: u64, from: u32, len: u32) {
    out.extend((from..len).map(|i| pattern_byte(id, salt, i)));
}

/// Incremental parser of a knb byte stream.
#[derive(Debug, Default)]
struct Parser {
    hdr: [u8; HDR_LEN],
    have: usize,
    cur: Option<Header>,
    off: u32,
}

enum Ev<'a> {
    /// Payload bytes of the current message at `offset`.
    Payload(Header, u32, &'a [u8]),
    /// The message is complete.
    Done(Header),
}

impl Parser {
    /// Feeds `data`; calls `on` for payload chunks and completed messages.
    fn feed(
        &mut self,
        mut data: &[u8],
        mut on: impl FnMut(Ev<'_>) -> Result<(), ProtoError>,
    ) -> Result<(), ProtoError> {
        while !data.is_empty() {
            let h = match self.cur {
                Some(h) => h,
                None => {
                    let n = (HDR_LEN - self.have).min(data.len());
                    self.hdr[self.have..self.have + n].copy_from_slice(&data[..n]);
                    self.have += n;
                    data = &data[n..];
                    if self.have < HDR_LEN {
                        return Ok(());
                    }
                    self.have = 0;
                    let h = Header::decode(&self.hdr)?;
                    self.cur = Some(h);
                    self.off = 0;
                    h
                }
            };
            let n = ((h.len - self.off) as usize).min(data.len());
            if n > 0 {
                on(Ev::Payload(h, self.off, &data[..n]))?;
                self.off += n as u32;
                data = &data[n..];
            }
            if self.off == h.len {
                self.cur = None;
                on(Ev::Done(h))?;
            }
        }
        Ok(())
    }
}

/// One piece of a message-mode [`TxBuf`]: what a zero-copy stack turns into buffers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// A message header.
    Header([u8; HDR_LEN]),
    /// Bytes to send as they are (verify patterns, SYNC reports).
    Bytes(Vec<u8>),
    /// This many zero bytes: the payload of a message without `--verify`, which a
    /// zero-copy stack sends from one preallocated buffer instead of writing it.
    Zeros(u32),
}

impl Piece {
    /// Bytes on the wire.
    pub fn len(&self) -> usize {
        match self {
            Piece::Header(_) => HDR_LEN,
            Piece::Bytes(v) => v.len(),
            Piece::Zeros(n) => *n as usize,
        }
    }

    /// True for a zero-length piece (never queued).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Bytes queued for sending, drained from the front.
///
/// Two modes: byte mode (default) keeps the stream in one `Vec<u8>` that a backend
/// writes from ([`TxBuf::pending`] / [`TxBuf::consume`]); message mode
/// ([`TxBuf::messages`]) keeps [`Piece`]s that a zero-copy backend takes with
/// [`TxBuf::pop_piece`], so payloads are never written out byte by byte.
#[derive(Debug, Default)]
pub struct TxBuf {
    buf: Vec<u8>,
    start: usize,
    /// Message mode: the pieces, unsent from `head` on (a `Vec` and an index rather than
    /// a `VecDeque`: the packer walks them as one slice, with no wrap-around code on the
    /// per-reply path).
    pieces: Option<Vec<Piece>>,
    head: usize,
    piece_bytes: usize,
}

impl TxBuf {
    /// An empty message-mode buffer.
    pub fn messages() -> TxBuf {
        TxBuf {
            pieces: Some(Vec::new()),
            ..TxBuf::default()
        }
    }

    /// True in message mode.
    pub fn is_messages(&self) -> bool {
        self.pieces.is_some()
    }

    /// The bytes not sent yet (byte mode; always empty in message mode).
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// Bytes not sent yet.
    pub fn len(&self) -> usize {
        if self.pieces.is_some() {
            self.piece_bytes
        } else {
            self.buf.len() - self.start
        }
    }

    /// True if nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Marks `n` bytes as sent (byte mode; in message mode pieces leave through
    /// [`TxBuf::pop_piece`] and this does nothing).
    pub fn consume(&mut self, n: usize) {
        if self.pieces.is_some() {
            return;
        }
        self.start = (self.start + n).min(self.buf.len());
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > 64 * 1024 && self.start * 2 > self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }

    /// The queued pieces, oldest first, without taking them (message mode; empty in
    /// byte mode).
    pub fn pieces(&self) -> &[Piece] {
        match &self.pieces {
            Some(v) => &v[self.head..],
            None => &[],
        }
    }

    /// The oldest piece (message mode; `None` in byte mode or when empty).
    pub fn pop_piece(&mut self) -> Option<Piece> {
        let v = self.pieces.as_mut()?;
        let slot = v.get_mut(self.head)?;
        let p = std::mem::replace(slot, Piece::Zeros(0));
        self.head += 1;
        if self.head == v.len() {
            v.clear();
            self.head = 0;
        }
        self.piece_bytes -= p.len();
        Some(p)
    }

    fn push_piece(&mut self, p: Piece) {
        if let Some(v) = &mut self.pieces {
            if !p.is_empty() {
                // A queue that never empties (a bulk sender) drops its sent prefix once
                // it is half the vector: amortised O(1) per piece.
                if self.head >= 64 && self.head * 2 >= v.len() {
                    v.drain(..self.head);
                    self.head = 0;
                }
                self.piece_bytes += p.len();
                v.push(p);
            }
        }
    }

    fn push_header(&mut self, h: Header) {
        if self.pieces.is_some() {
            self.push_piece(Piece::Header(h.encode()));
        } else {
            self.buf.extend_from_slice(&h.encode());
        }
    }

    fn push_bytes(&mut self, b: &[u8]) {
        if self.pieces.is_some() {
            self.push_piece(Piece::Bytes(b.to_vec()));
        } else {
            self.buf.extend_from_slice(b);
        }
    }

    #[cfg(test)]
    fn vec(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }
}

fn push_msg(out: &mut TxBuf, h: Header, salt: u64, verify: bool) {
    out.push_header(h);
    match (&mut out.pieces, verify) {
        (Some(_), false) => out.push_piece(Piece::Zeros(h.len)),
        (Some(_), true) => {
            let mut v = Vec::with_capacity(h.len as usize);
            push_pattern(&mut v, h.id, salt, h.len);
            out.push_piece(Piece::Bytes(v));
        }
        (None, true) => push_pattern(&mut out.buf, h.id, salt, h.len),
        (None, false) => out.buf.resize(out.buf.len() + h.len as usize, 0),
    }
}

/// A request with a service tag: the tag, then the rest of the payload from offset 8.
fn push_tagged(out: &mut TxBuf, h: Header, tag: [u8; crate::service::TAG_LEN], verify: bool) {
    let t = crate::service::TAG_LEN as u32;
    out.push_header(h);
    out.push_bytes(&tag);
    let rest = h.len.saturating_sub(t);
    match (&mut out.pieces, verify) {
        (Some(_), false) => out.push_piece(Piece::Zeros(rest)),
        (Some(_), true) => {
            let mut v = Vec::with_capacity(rest as usize);
            push_pattern_from(&mut v, h.id, SALT_REQ, t, h.len);
            out.push_piece(Piece::Bytes(v));
        }
        (None, true) => push_pattern_from(&mut out.buf, h.id, SALT_REQ, t, h.len),
        (None, false) => out.buf.resize(out.buf.len() + rest as usize, 0),
    }
}

/// A request the server parsed and has not answered yet (deferred mode,
/// [`ServerConn::deferred`]): the server models hand it to a worker, then
/// [`ServerConn::respond`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Request id.
    pub id: u64,
    /// Request flags.
    pub flags: u16,
    /// Service time from the tag (ns; 0 without SERVICE).
    pub service_ns: u64,
}

/// Bulk SYNC answer: what the server received on the connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// NOREPLY payload bytes received in total.
    pub total_bytes: u64,
    /// NOREPLY payload bytes received after the MARK message.
    pub window_bytes: u64,
    /// Nanoseconds from receiving MARK to receiving SYNC.
    pub window_ns: u64,
}

impl SyncReport {
    /// Payload length of a SYNC response.
    pub const LEN: u32 = 24;

    fn encode(&self) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[0..8].copy_from_slice(&self.total_bytes.to_le_bytes());
        b[8..16].copy_from_slice(&self.window_bytes.to_le_bytes());
        b[16..24].copy_from_slice(&self.window_ns.to_le_bytes());
        b
    }

    fn decode(b: &[u8; 24]) -> SyncReport {
        let n = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        SyncReport {
            total_bytes: n(0),
            window_bytes: n(8),
            window_ns: n(16),
        }
    }
}

/// Server-side counters of one connection.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ServerCounters {
    /// Requests answered.
    pub requests: u64,
    /// Request payload bytes received (RPC and bulk).
    pub rx_payload: u64,
    /// Response payload bytes queued.
    pub tx_payload: u64,
}

/// The server side of one connection: parses requests, queues responses.
#[derive(Debug)]
pub struct ServerConn {
    parser: Parser,
    resp_size: u32,
    tx: TxBuf,
    /// Counters.
    pub counters: ServerCounters,
    bulk_total: u64,
    mark: Option<(Instant, u64)>,
    tag: [u8; crate::service::TAG_LEN],
    deferred: Option<Vec<Request>>,
}

impl ServerConn {
    /// A connection answering every request with `resp_size` payload bytes.
    pub fn new(resp_size: u32) -> ServerConn {
        ServerConn {
            parser: Parser::default(),
            resp_size,
            tx: TxBuf::default(),
            counters: ServerCounters::default(),
            bulk_total: 0,
            mark: None,
            tag: [0; crate::service::TAG_LEN],
            deferred: None,
        }
    }

    /// The same connection collecting parsed requests instead of answering them
    /// ([`ServerConn::take_requests`], then [`ServerConn::respond`] each): for servers that
    /// apply service times on worker threads. Without it, a SERVICE request occupies the
    /// caller inline ([`crate::service::inline_mode`]) before its response is queued.
    pub fn deferred(mut self) -> ServerConn {
        self.deferred = Some(Vec::new());
        self
    }

    /// Deferred mode: the requests parsed since the last call, in arrival order.
    pub fn take_requests(&mut self, out: &mut Vec<Request>) {
        if let Some(v) = &mut self.deferred {
            out.append(v);
        }
    }

    /// Queues the response to `r` (deferred mode).
    pub fn respond(&mut self, r: &Request) {
        respond(&mut self.tx, &mut self.counters, self.resp_size, r);
    }

    /// The same connection with its responses queued as [`Piece`]s ([`TxBuf::messages`]),
    /// for zero-copy stacks.
    pub fn message_mode(mut self) -> ServerConn {
        self.tx = TxBuf::messages();
        self
    }

    /// Feeds received bytes; responses are queued in [`ServerConn::tx`].
    pub fn on_rx(&mut self, data: &[u8], now: Instant) -> Result<(), ProtoError> {
        let ServerConn {
            parser,
            resp_size,
            tx,
            counters,
            bulk_total,
            mark,
            tag,
            deferred,
        } = self;
        parser.feed(data, |ev| match ev {
            Ev::Payload(h, off, chunk) => {
                if h.flags & flags::RESPONSE != 0 {
                    return Err(ProtoError::WrongDirection(h.id));
                }
                let mut body = (off, chunk);
                if h.flags & flags::SERVICE != 0 && (off as usize) < tag.len() {
                    let n = (tag.len() - off as usize).min(chunk.len());
                    tag[off as usize..off as usize + n].copy_from_slice(&chunk[..n]);
                    body = (off + n as u32, &chunk[n..]);
                }
                if h.flags & flags::VERIFY != 0 {
                    check(h.id, SALT_REQ, body.0, body.1)?;
                }
                counters.rx_payload += chunk.len() as u64;
                if h.flags & flags::NOREPLY != 0 {
                    *bulk_total += chunk.len() as u64;
                }
                Ok(())
            }
            Ev::Done(h) => {
                if h.flags & flags::RESPONSE != 0 {
                    return Err(ProtoError::WrongDirection(h.id));
                }
                if h.flags & flags::MARK != 0 {
                    *mark = Some((now, *bulk_total));
                }
                if h.flags & flags::SYNC != 0 {
                    let (t, b) = mark.unwrap_or((now, *bulk_total));
                    let r = SyncReport {
                        total_bytes: *bulk_total,
                        window_bytes: *bulk_total - b,
                        window_ns: now.duration_since(t).as_nanos() as u64,
                    };
                    tx.push_header(Header {
                        id: h.id,
                        len: SyncReport::LEN,
                        flags: flags::RESPONSE | flags::SYNC,
                    });
                    tx.push_bytes(&r.encode());
                    counters.requests += 1;
                    return Ok(());
                }
                if h.flags & (flags::NOREPLY | flags::MARK) != 0 {
                    return Ok(());
                }
                let service_ns = if h.flags & flags::SERVICE != 0 {
                    if (h.len as usize) < tag.len() {
                        return Err(ProtoError::BadTag(h.id));
                    }
                    crate::service::decode_tag(tag)
                } else {
                    0
                };
                let r = Request {
                    id: h.id,
                    flags: h.flags,
                    service_ns,
                };
                match deferred {
                    Some(v) => v.push(r),
                    None => {
                        if service_ns > 0 {
                            crate::service::occupy(
                                std::time::Duration::from_nanos(service_ns),
                                crate::service::inline_mode(),
                            );
                        }
                        respond(tx, counters, *resp_size, &r);
                    }
                }
                Ok(())
            }
        })
    }

    /// Responses waiting to be sent.
    pub fn tx(&mut self) -> &mut TxBuf {
        &mut self.tx
    }
}

fn respond(tx: &mut TxBuf, counters: &mut ServerCounters, resp_size: u32, r: &Request) {
    let resp = Header {
        id: r.id,
        len: resp_size,
        flags: flags::RESPONSE | (r.flags & flags::VERIFY),
    };
    push_msg(tx, resp, SALT_RESP, r.flags & flags::VERIFY != 0);
    counters.requests += 1;
    counters.tx_payload += resp_size as u64;
}

fn check(id: u64, salt: u64, off: u32, chunk: &[u8]) -> Result<(), ProtoError> {
    for (i, &b) in chunk.iter().enumerate() {
        let o = off + i as u32;
        if b != pattern_byte(id, salt, o) {
            return Err(ProtoError::Corrupt { id, offset: o });
        }
    }
    Ok(())
}

/// Client-side counters of one connection.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ClientCounters {
    /// Requests queued.
    pub sent: u64,
    /// Responses received and validated.
    pub completed: u64,
}

/// The client side of one connection: queues requests, matches responses.
#[derive(Debug)]
pub struct ClientConn {
    parser: Parser,
    req_size: u32,
    resp_size: u32,
    verify: bool,
    next_id: u64,
    outstanding: VecDeque<(u64, Instant)>,
    /// `--unordered`: outstanding requests by id (then `outstanding` stays empty).
    unordered: Option<HashMap<u64, Instant>>,
    /// `--service`: the tag distribution and this connection's RNG.
    service: Option<(crate::service::ServiceSpec, crate::service::Rng)>,
    /// Bytes ever queued / handed to the stack, and the requests not fully handed over yet
    /// (end offset in the stream, scheduled time): for the behind-schedule count.
    queued_bytes: u64,
    sent_bytes: u64,
    unsent: VecDeque<(u64, Instant)>,
    tx: TxBuf,
    sync: Option<SyncReport>,
    sync_buf: Vec<u8>,
    /// Counters.
    pub counters: ClientCounters,
    /// Bulk NOREPLY payload bytes queued.
    pub bulk_sent: u64,
}

impl ClientConn {
    /// Connection number `index` (ids start at `index << 40` so they are unique per run).
    pub fn new(index: u32, req_size: u32, resp_size: u32, verify: bool) -> ClientConn {
        ClientConn {
            parser: Parser::default(),
            req_size,
            resp_size,
            verify,
            next_id: (index as u64) << 40,
            outstanding: VecDeque::new(),
            unordered: None,
            service: None,
            queued_bytes: 0,
            sent_bytes: 0,
            unsent: VecDeque::new(),
            tx: TxBuf::default(),
            sync: None,
            sync_buf: Vec::new(),
            counters: ClientCounters::default(),
            bulk_sent: 0,
        }
    }

    /// The same connection with its requests queued as [`Piece`]s ([`TxBuf::messages`]),
    /// for zero-copy stacks.
    pub fn message_mode(mut self) -> ClientConn {
        self.tx = TxBuf::messages();
        self
    }

    /// The same connection matching responses by id, in any order (`--unordered`).
    pub fn unordered(mut self) -> ClientConn {
        self.unordered = Some(HashMap::new());
        self
    }

    /// The same connection tagging each request with a service time drawn from `spec`
    /// with an RNG seeded by `seed` (`--service`; needs `req_size >= 8`).
    pub fn with_service(mut self, spec: crate::service::ServiceSpec, seed: u64) -> ClientConn {
        self.service = Some((spec, crate::service::Rng::new(seed)));
        self
    }

    /// Requests queued and not answered yet.
    pub fn outstanding(&self) -> usize {
        match &self.unordered {
            Some(m) => m.len(),
            None => self.outstanding.len(),
        }
    }

    /// Requests queued whose bytes the stack has not fully taken yet.
    pub fn unsent(&self) -> usize {
        self.unsent.len()
    }

    fn track(&mut self, id: u64, t0: Instant) {
        match &mut self.unordered {
            Some(m) => {
                m.insert(id, t0);
            }
            None => self.outstanding.push_back((id, t0)),
        }
    }

    /// Queues one request issued (or, open loop, scheduled) at `t0`.
    pub fn push_request(&mut self, t0: Instant) {
        let id = self.next_id;
        self.next_id += 1;
        let mut f = if self.verify { flags::VERIFY } else { 0 };
        let tag = self.service.as_mut().map(|(s, rng)| s.draw(rng));
        let h = Header {
            id,
            len: self.req_size,
            flags: f,
        };
        match tag {
            Some(ns) if self.req_size as usize >= crate::service::TAG_LEN => {
                f |= flags::SERVICE;
                let h = Header { flags: f, ..h };
                push_tagged(&mut self.tx, h, crate::service::encode_tag(ns), self.verify);
            }
            _ => push_msg(&mut self.tx, h, SALT_REQ, self.verify),
        }
        self.queued_bytes += (HDR_LEN + self.req_size as usize) as u64;
        self.unsent.push_back((self.queued_bytes, t0));
        self.track(id, t0);
        self.counters.sent += 1;
    }

    /// The stack took `n` more bytes: calls `sent(scheduled time)` for every request whose
    /// last byte is now handed over.
    pub fn on_sent(&mut self, n: usize, mut sent: impl FnMut(Instant)) {
        self.sent_bytes += n as u64;
        while let Some(&(end, t0)) = self.unsent.front() {
            if end > self.sent_bytes {
                break;
            }
            self.unsent.pop_front();
            sent(t0);
        }
    }

    /// Queues a bulk message (`NOREPLY`, plus `extra` flags such as MARK).
    pub fn push_bulk(&mut self, extra: u16) {
        let id = self.next_id;
        self.next_id += 1;
        let len = if extra & flags::MARK != 0 {
            0
        } else {
            self.req_size
        };
        let f = flags::NOREPLY | extra | if self.verify { flags::VERIFY } else { 0 };
        push_msg(
            &mut self.tx,
            Header { id, len, flags: f },
            SALT_REQ,
            self.verify,
        );
        self.queued_bytes += (HDR_LEN + len as usize) as u64;
        self.bulk_sent += len as u64;
    }

    /// Queues the bulk SYNC (end of stream) request.
    pub fn push_sync(&mut self, t0: Instant) {
        let id = self.next_id;
        self.next_id += 1;
        self.tx.push_header(Header {
            id,
            len: 0,
            flags: flags::SYNC,
        });
        self.queued_bytes += HDR_LEN as u64;
        self.track(id, t0);
    }

    /// The SYNC report, once it arrived.
    pub fn sync_report(&self) -> Option<SyncReport> {
        self.sync
    }

    /// Feeds received bytes; calls `done(t0)` for each validated response.
    pub fn on_rx(&mut self, data: &[u8], mut done: impl FnMut(Instant)) -> Result<(), ProtoError> {
        let ClientConn {
            parser,
            resp_size,
            verify,
            outstanding,
            unordered,
            counters,
            sync,
            sync_buf,
            bulk_sent,
            ..
        } = self;
        parser.feed(data, |ev| {
            let h = match &ev {
                Ev::Payload(h, ..) | Ev::Done(h) => *h,
            };
            if h.flags & flags::RESPONSE == 0 {
                return Err(ProtoError::WrongDirection(h.id));
            }
            let t0 = match unordered {
                Some(m) => *m.get(&h.id).ok_or(ProtoError::UnknownId(h.id))?,
                None => {
                    let &(id, t0) = outstanding.front().ok_or(ProtoError::Unsolicited(h.id))?;
                    if h.id != id {
                        return Err(ProtoError::IdMismatch {
                            expected: id,
                            got: h.id,
                        });
                    }
                    t0
                }
            };
            let is_sync = h.flags & flags::SYNC != 0;
            let want = if is_sync { SyncReport::LEN } else { *resp_size };
            if h.len != want {
                return Err(ProtoError::WrongLength {
                    expected: want,
                    got: h.len,
                });
            }
            match ev {
                Ev::Payload(_, off, chunk) => {
                    if is_sync {
                        sync_buf.extend_from_slice(chunk);
                    } else if *verify {
                        check(h.id, SALT_RESP, off, chunk)?;
                    }
                    Ok(())
                }
                Ev::Done(_) => {
                    match unordered {
                        Some(m) => {
                            m.remove(&h.id);
                        }
                        None => {
                            outstanding.pop_front();
                        }
                    }
                    if is_sync {
                        let mut b = [0u8; 24];
                        b.copy_from_slice(&sync_buf[..24]);
                        let r = SyncReport::decode(&b);
                        if r.total_bytes != *bulk_sent {
                            return Err(ProtoError::BulkMismatch {
                                sent: *bulk_sent,
                                received: r.total_bytes,
                            });
                        }
                        *sync = Some(r);
                    } else {
                        counters.completed += 1;
                    }
                    done(t0);
                    Ok(())
                }
            }
        })
    }

    /// Requests waiting to be sent.
    pub fn tx(&mut self) -> &mut TxBuf {
        &mut self.tx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pump(c: &mut ClientConn, s: &mut ServerConn, chunk: usize, now: Instant) -> u64 {
        let mut done = 0;
        let req = c.tx().pending().to_vec();
        c.tx().consume(req.len());
        for part in req.chunks(chunk) {
            s.on_rx(part, now).unwrap();
        }
        let resp = s.tx().pending().to_vec();
        s.tx().consume(resp.len());
        for part in resp.chunks(chunk) {
            c.on_rx(part, |_| done += 1).unwrap();
        }
        done
    }

    #[test]
    fn header_round_trips_and_rejects_garbage() {
        let h = Header {
            id: 0x0102_0304_0506_0708,
            len: 4096,
            flags: flags::VERIFY,
        };
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        let mut b = h.encode();
        b[15] ^= 1;
        assert!(matches!(Header::decode(&b), Err(ProtoError::BadMagic(_))));
        let mut b = h.encode();
        b[13] = 0x80;
        assert!(matches!(Header::decode(&b), Err(ProtoError::BadFlags(_))));
        let b = Header {
            len: MAX_PAYLOAD + 1,
            ..h
        }
        .encode();
        assert_eq!(
            Header::decode(&b),
            Err(ProtoError::TooLong(MAX_PAYLOAD + 1))
        );
    }

    #[test]
    fn requests_and_responses_flow_in_any_chunking() {
        for verify in [false, true] {
            for chunk in [1, 7, 16, 1000, 1 << 20] {
                let now = Instant::now();
                let mut c = ClientConn::new(3, 300, 4100, verify);
                let mut s = ServerConn::new(4100);
                for _ in 0..5 {
                    c.push_request(now);
                }
                assert_eq!(c.outstanding(), 5);
                assert_eq!(pump(&mut c, &mut s, chunk, now), 5);
                assert_eq!(c.outstanding(), 0);
                assert_eq!(c.counters.completed, 5);
                assert_eq!(s.counters.requests, 5);
                assert_eq!(s.counters.rx_payload, 1500);
                assert_eq!(s.counters.tx_payload, 5 * 4100);
            }
        }
    }

    #[test]
    fn zero_length_messages_work() {
        let now = Instant::now();
        let mut c = ClientConn::new(0, 0, 0, true);
        let mut s = ServerConn::new(0);
        c.push_request(now);
        c.push_request(now);
        assert_eq!(pump(&mut c, &mut s, 3, now), 2);
    }

    #[test]
    fn verify_catches_a_flipped_payload_byte() {
        let now = Instant::now();
        let mut c = ClientConn::new(0, 64, 64, true);
        let mut s = ServerConn::new(64);
        c.push_request(now);
        let mut req = c.tx().pending().to_vec();
        req[HDR_LEN + 10] ^= 0xff;
        assert_eq!(
            s.on_rx(&req, now),
            Err(ProtoError::Corrupt { id: 0, offset: 10 })
        );
        // And on the response side.
        let mut s = ServerConn::new(64);
        s.on_rx(c.tx().pending(), now).unwrap();
        let mut resp = s.tx().pending().to_vec();
        resp[HDR_LEN + 63] ^= 1;
        assert!(matches!(
            c.on_rx(&resp, |_| {}),
            Err(ProtoError::Corrupt { offset: 63, .. })
        ));
    }

    #[test]
    fn mismatched_responses_are_errors() {
        let now = Instant::now();
        let resp = |id: u64, len: u32, f: u16| {
            let mut v = Header { id, len, flags: f }.encode().to_vec();
            v.resize(HDR_LEN + len as usize, 0);
            v
        };
        let mut c = ClientConn::new(0, 8, 8, false);
        assert_eq!(
            c.on_rx(&resp(0, 8, flags::RESPONSE), |_| {}),
            Err(ProtoError::Unsolicited(0))
        );
        let mut c = ClientConn::new(0, 8, 8, false);
        c.push_request(now);
        c.push_request(now);
        assert_eq!(
            c.on_rx(&resp(1, 8, flags::RESPONSE), |_| {}),
            Err(ProtoError::IdMismatch {
                expected: 0,
                got: 1
            })
        );
        let mut c = ClientConn::new(0, 8, 8, false);
        c.push_request(now);
        assert_eq!(
            c.on_rx(&resp(0, 9, flags::RESPONSE), |_| {}),
            Err(ProtoError::WrongLength {
                expected: 8,
                got: 9
            })
        );
        let mut c = ClientConn::new(0, 8, 8, false);
        c.push_request(now);
        assert_eq!(
            c.on_rx(&resp(0, 8, 0), |_| {}),
            Err(ProtoError::WrongDirection(0))
        );
        // A server never accepts a response.
        let mut s = ServerConn::new(8);
        assert_eq!(
            s.on_rx(&resp(0, 8, flags::RESPONSE), now),
            Err(ProtoError::WrongDirection(0))
        );
    }

    #[test]
    fn bulk_stream_is_counted_and_synced() {
        let now = Instant::now();
        let mut c = ClientConn::new(0, 1000, 0, true);
        let mut s = ServerConn::new(0);
        c.push_bulk(0);
        c.push_bulk(flags::MARK);
        for _ in 0..10 {
            c.push_bulk(0);
        }
        c.push_sync(now);
        assert_eq!(c.bulk_sent, 11_000);
        let mut synced = 0;
        let req = c.tx().pending().to_vec();
        s.on_rx(&req, now).unwrap();
        let resp = s.tx().pending().to_vec();
        c.on_rx(&resp, |_| synced += 1).unwrap();
        assert_eq!(synced, 1);
        let r = c.sync_report().unwrap();
        assert_eq!(r.total_bytes, 11_000);
        assert_eq!(r.window_bytes, 10_000);
        assert_eq!(c.counters.completed, 0);
    }

    #[test]
    fn bulk_sync_detects_lost_bytes() {
        let now = Instant::now();
        let mut c = ClientConn::new(0, 100, 0, false);
        let mut s = ServerConn::new(0);
        c.push_bulk(0);
        let first = c.tx().pending().len();
        c.tx().consume(first); // "lost": never reaches the server
        c.push_sync(now);
        s.on_rx(c.tx().pending(), now).unwrap();
        let resp = s.tx().pending().to_vec();
        assert_eq!(
            c.on_rx(&resp, |_| {}),
            Err(ProtoError::BulkMismatch {
                sent: 100,
                received: 0
            })
        );
    }

    /// Drains a message-mode buffer into the byte stream it stands for.
    fn flatten(t: &mut TxBuf) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(p) = t.pop_piece() {
            match p {
                Piece::Header(h) => out.extend_from_slice(&h),
                Piece::Bytes(b) => out.extend_from_slice(&b),
                Piece::Zeros(n) => out.resize(out.len() + n as usize, 0),
            }
        }
        assert!(t.is_empty());
        out
    }

    #[test]
    fn message_mode_carries_the_same_stream_as_byte_mode() {
        let now = Instant::now();
        for verify in [false, true] {
            let mut bytes = ClientConn::new(1, 300, 4100, verify);
            let mut msgs = ClientConn::new(1, 300, 4100, verify).message_mode();
            assert!(msgs.tx().is_messages() && !bytes.tx().is_messages());
            for c in [&mut bytes, &mut msgs] {
                c.push_request(now);
                c.push_bulk(0);
                c.push_bulk(flags::MARK);
                c.push_sync(now);
            }
            let want = bytes.tx().pending().to_vec();
            assert_eq!(msgs.tx().len(), want.len());
            assert!(msgs.tx().pending().is_empty(), "no bytes in message mode");
            let got = flatten(msgs.tx());
            assert_eq!(got, want, "verify={verify}");
            // Server side: the same responses, SYNC report included.
            let mut sb = ServerConn::new(4100);
            let mut sm = ServerConn::new(4100).message_mode();
            sb.on_rx(&want, now).unwrap();
            sm.on_rx(&got, now).unwrap();
            let resp = sb.tx().pending().to_vec();
            assert_eq!(sm.tx().len(), resp.len());
            let mresp = flatten(sm.tx());
            assert_eq!(mresp, resp, "same `now`, so the same SYNC report too");
            let mut done = 0;
            msgs.on_rx(&mresp, |_| done += 1).unwrap();
            assert_eq!(done, 2, "the response and the SYNC report");
        }
    }

    /// A queue that never empties (a bulk sender popping a little less than it pushes)
    /// drops its sent prefix now and then; order, lengths and `pieces()` stay right.
    #[test]
    fn message_queue_that_never_empties_keeps_order_across_compaction() {
        let mut t = TxBuf::messages();
        let (mut pushed, mut popped) = (0u32, 0u32);
        for round in 0..200u32 {
            for _ in 0..3 {
                pushed += 1;
                t.push_piece(Piece::Zeros(pushed));
            }
            for _ in 0..2 {
                popped += 1;
                assert_eq!(t.pop_piece(), Some(Piece::Zeros(popped)), "round {round}");
            }
            let want: Vec<Piece> = (popped + 1..=pushed).map(Piece::Zeros).collect();
            assert_eq!(t.pieces(), &want[..]);
            let bytes: u32 = (popped + 1..=pushed).sum();
            assert_eq!(t.len(), bytes as usize);
        }
        assert!(t.head < 200, "the sent prefix was dropped: head {}", t.head);
        while t.pop_piece().is_some() {}
        assert!(t.is_empty() && t.pieces().is_empty());
    }

    #[test]
    fn message_mode_pieces_do_not_write_zero_payloads() {
        let now = Instant::now();
        let mut s = ServerConn::new(65536).message_mode();
        let req = {
            let mut c = ClientConn::new(0, 10, 65536, false);
            c.push_request(now);
            c.tx().pending().to_vec()
        };
        s.on_rx(&req, now).unwrap();
        assert!(matches!(s.tx().pop_piece(), Some(Piece::Header(_))));
        assert_eq!(s.tx().pop_piece(), Some(Piece::Zeros(65536)));
        assert_eq!(s.tx().pop_piece(), None);
        s.tx().consume(100); // a no-op in message mode
        assert!(s.tx().is_empty());
    }

    fn resp_bytes(id: u64, len: u32) -> Vec<u8> {
        let mut v = Header {
            id,
            len,
            flags: flags::RESPONSE,
        }
        .encode()
        .to_vec();
        v.resize(HDR_LEN + len as usize, 0);
        v
    }

    #[test]
    fn service_tags_travel_in_the_first_payload_bytes() {
        let now = Instant::now();
        let spec = crate::service::parse_service("bimodal:100us").unwrap();
        for verify in [false, true] {
            for msgs in [false, true] {
                let mut c = ClientConn::new(0, 64, 32, verify).with_service(spec, 9);
                if msgs {
                    c = c.message_mode();
                }
                for _ in 0..50 {
                    c.push_request(now);
                }
                let bytes = if msgs {
                    flatten(c.tx())
                } else {
                    let b = c.tx().pending().to_vec();
                    c.tx().consume(b.len());
                    b
                };
                assert_eq!(bytes.len(), 50 * (HDR_LEN + 64));
                // The wire format by hand: flag bit 32 and the tag, little endian.
                let h = Header::decode(bytes[..HDR_LEN].try_into().unwrap()).unwrap();
                assert_ne!(h.flags & flags::SERVICE, 0);
                let tag = u64::from_le_bytes(bytes[HDR_LEN..HDR_LEN + 8].try_into().unwrap());
                assert!(tag == 50_000 || tag == 550_000, "{tag}");
                let mut s = ServerConn::new(32).deferred();
                for part in bytes.chunks(5) {
                    s.on_rx(part, now).unwrap();
                }
                let mut reqs = Vec::new();
                s.take_requests(&mut reqs);
                assert_eq!(reqs.len(), 50);
                assert_eq!(reqs[0].service_ns, tag);
                assert!(reqs
                    .iter()
                    .all(|r| r.service_ns == 50_000 || r.service_ns == 550_000));
                assert!(s.tx().is_empty(), "deferred: nothing answered yet");
                for r in &reqs {
                    s.respond(r);
                }
                let resp = s.tx().pending().to_vec();
                let mut done = 0;
                c.on_rx(&resp, |_| done += 1).unwrap();
                assert_eq!(done, 50, "verify={verify} msgs={msgs}");
            }
        }
        // The wire format in the module table: a SERVICE request shorter than the tag is
        // rejected.
        let mut b = Header {
            id: 3,
            len: 4,
            flags: flags::SERVICE,
        }
        .encode()
        .to_vec();
        b.extend_from_slice(&[1, 2, 3, 4]);
        assert_eq!(
            ServerConn::new(8).on_rx(&b, now),
            Err(ProtoError::BadTag(3))
        );
    }

    #[test]
    fn inline_server_occupies_for_the_tagged_time() {
        let now = Instant::now();
        let spec = crate::service::parse_service("fixed:2ms").unwrap();
        let mut c = ClientConn::new(0, 8, 8, false).with_service(spec, 1);
        c.push_request(now);
        let mut s = ServerConn::new(8);
        let t = Instant::now();
        s.on_rx(c.tx().pending(), now).unwrap();
        assert!(t.elapsed() >= std::time::Duration::from_millis(2));
        assert_eq!(s.counters.requests, 1);
    }

    #[test]
    fn unordered_accepts_any_order_and_rejects_unknown_ids() {
        let now = Instant::now();
        let mut c = ClientConn::new(0, 8, 8, false).unordered();
        for _ in 0..3 {
            c.push_request(now);
        }
        let mut done = 0;
        for id in [2u64, 0, 1] {
            c.on_rx(&resp_bytes(id, 8), |_| done += 1).unwrap();
        }
        assert_eq!(done, 3);
        assert_eq!(c.outstanding(), 0);
        // An id answered twice, or never sent, is unknown.
        c.push_request(now);
        assert_eq!(
            c.on_rx(&resp_bytes(1, 8), |_| {}),
            Err(ProtoError::UnknownId(1))
        );
        let mut c = ClientConn::new(0, 8, 8, false).unordered();
        assert_eq!(
            c.on_rx(&resp_bytes(77, 8), |_| {}),
            Err(ProtoError::UnknownId(77))
        );
        // Ordered connections still insist on request order.
        let mut c = ClientConn::new(0, 8, 8, false);
        c.push_request(now);
        c.push_request(now);
        assert_eq!(
            c.on_rx(&resp_bytes(1, 8), |_| {}),
            Err(ProtoError::IdMismatch {
                expected: 0,
                got: 1
            })
        );
    }

    #[test]
    fn sent_tracking_reports_each_request_once_its_last_byte_left() {
        let t0 = Instant::now();
        let mut c = ClientConn::new(0, 100, 8, false);
        c.push_request(t0);
        c.push_request(t0 + std::time::Duration::from_micros(5));
        let mut got = Vec::new();
        c.on_sent(HDR_LEN + 99, |t| got.push(t));
        assert!(got.is_empty(), "one byte of the first request still queued");
        assert_eq!(c.unsent(), 2);
        c.on_sent(1 + HDR_LEN + 100, |t| got.push(t));
        assert_eq!(got, vec![t0, t0 + std::time::Duration::from_micros(5)]);
        assert_eq!(c.unsent(), 0);
        assert_eq!(c.outstanding(), 2, "sent is not answered");
    }

    #[test]
    fn txbuf_drains_and_compacts() {
        let mut t = TxBuf::default();
        t.vec().extend(std::iter::repeat_n(1u8, 200_000));
        t.consume(150_000);
        assert_eq!(t.len(), 50_000);
        assert!(t.pending().iter().all(|&b| b == 1));
        t.consume(1_000_000);
        assert!(t.is_empty());
    }
}
