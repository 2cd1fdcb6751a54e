//! One HTTP/2 connection's server session (RFC 9113), sans-IO and deterministic.
//!
//! Bytes in ([`Session::push`]), whole requests out ([`Session::poll_request`]), replies
//! in ([`Session::complete`]), bytes out ([`Session::poll_transmit`]). Everything a
//! connection needs that is not a request — the preface, SETTINGS and their ACK, PING
//! ACKs, WINDOW_UPDATEs, RST_STREAM, GOAWAY — is answered here, on the I/O core.
//!
//! Bounds and defences (each counted by [`Reason`] in [`H2Counters`]; no timers, all
//! by count, so tests are deterministic):
//! - **Concurrency**: a stream counts against our SETTINGS_MAX_CONCURRENT_STREAMS from
//!   its HEADERS until its reply has gone *and* its worker has finished — a stream the
//!   peer resets (or makes us reset) while a worker still runs it keeps its slot, so
//!   rapid reset (CVE-2023-44487) and MadeYouReset (CVE-2025-8671) cannot make more
//!   work run than the limit; streams over the limit are refused (RST_STREAM
//!   REFUSED_STREAM).
//! - **Flood budget**: frames that make no progress (PING, SETTINGS, PRIORITY,
//!   RST_STREAM either way, refused streams, empty DATA / header fragments, frames on
//!   closed streams, unknown types) each cost one unit of a per-connection budget; each
//!   completed response earns some back. An exhausted budget is GOAWAY
//!   ENHANCE_YOUR_CALM (the CVE-2019-9512…9518 floods, rapid reset's reset stream).
//! - **Header blocks**: HEADERS + CONTINUATION bytes and frame count bounded (the
//!   CONTINUATION flood, CVE-2024-27316 class); the decoded list bounded in size and
//!   count ([`super::hpack`]): both GOAWAY ENHANCE_YOUR_CALM.
//! - **Memory**: a request body is bounded (`max_body`; answered with
//!   [`H2Config::too_large`], 413 by default), the
//!   bodies buffered before dispatch are bounded (`max_buffered`: the connection window
//!   is not reopened until they drain; when unfinished bodies alone fill it with the window
//!   spent, the newest of those streams are refused so the others can finish), input is taken only while the output queue is
//!   small, and replies wait for the peer's windows (a zero-window peer holds at most
//!   its streams' replies, within the concurrency limit).
//! - **Stream ids** (RFC 9113 §5.1, §5.1.1): frames on idle streams (above every id
//!   opened, or even) and a HEADERS opening a lower id are connection errors
//!   PROTOCOL_ERROR; a frame on a closed stream is judged by how it closed, remembered
//!   for the last 512 ids (`History`): after both END_STREAMs, connection error
//!   STREAM_CLOSED; after the peer's RST_STREAM, stream error STREAM_CLOSED; after ours
//!   (or forgotten), ignored at a cost, since it may have been in flight.
//! - **Flow control**: data beyond our window is FLOW_CONTROL_ERROR; a WINDOW_UPDATE or
//!   SETTINGS_INITIAL_WINDOW_SIZE that pushes a window above 2^31-1 is
//!   FLOW_CONTROL_ERROR (connection: GOAWAY; stream: RST_STREAM).
//!
//! What a session holds is measured as well as bounded: [`Mark`] high-water marks (the
//! most any one session held: streams, header-block bytes, buffered bodies, replies
//! waiting for window, unprocessed input, queued output) in [`H2Counters::hwm`], so a
//! test or a benchmark can check the bounds under attack (docs/reliability.md).

use super::frame::{self, flag, kind, setting, ErrorCode, FrameHeader, HEADER_LEN};
use super::hpack::{self, Decoder, Encoder, Field, HpackError, HpackLimits};
use super::{Request, Response};
use crate::framer::{merge_tail, truesize, Spill, BUF_OVERHEAD, SPILL_PIECES};
use crate::parser::{peek, ParseError, ParseErrorKind};
use crate::proto::{Session, SessionRequest, SessionState, Timeout};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use zbuf::{IoVec, Zbuf};

/// Why a connection got a GOAWAY or a stream a RST_STREAM (counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The client preface was wrong, or its first frame was not SETTINGS.
    BadPreface,
    /// A frame the protocol forbids where it came (bad stream id, bad state, PUSH_PROMISE).
    Protocol,
    /// A frame of the wrong size.
    FrameSize,
    /// An undecodable header block.
    Compression,
    /// More DATA than our window allowed.
    FlowControl,
    /// A WINDOW_UPDATE or INITIAL_WINDOW_SIZE pushing a window above 2^31-1.
    WindowOverflow,
    /// A WINDOW_UPDATE of 0.
    ZeroWindowUpdate,
    /// A SETTINGS value out of range.
    BadSetting,
    /// The decoded header list over its size or field-count bound (HPACK bomb).
    HeaderList,
    /// A header block over its byte or CONTINUATION-count bound (CONTINUATION flood).
    HeaderBlock,
    /// The flood budget ran out (control-frame, empty-frame, reset floods).
    Flood,
    /// A request malformed as HTTP (missing pseudo-headers, connection-specific fields).
    Malformed,
    /// DATA or HEADERS on a stream that had ended its side.
    StreamClosed,
    /// A stream over MAX_CONCURRENT_STREAMS.
    Refused,
    /// The worker's reply did not parse, or the worker gave none.
    BadReply,
    /// The peer reset the stream (received, not sent).
    PeerReset,
    /// The driver's idle timeout ([`Timeout::Idle`]): GOAWAY NO_ERROR.
    IdleTimeout,
    /// The driver's send timeout ([`Timeout::Send`]): GOAWAY NO_ERROR.
    SendTimeout,
    /// Unfinished request bodies filled `max_buffered` with the connection window shut:
    /// the newest such stream refused (REFUSED_STREAM) so that the others can finish.
    BufferFull,
    /// A stream id the peer may not use (RFC 9113 §5.1, §5.1.1): a frame other than
    /// HEADERS or PRIORITY on an idle stream (above every id opened, or even: a client
    /// opens odd ids and we push none), a HEADERS on an even id, or a new stream whose id
    /// is not above every earlier one.
    StreamId,
    /// The I/O side's receive-memory budget was spent and nothing in flight could release
    /// any ([`Session::shed`]): the largest partial request refused (RST_STREAM
    /// REFUSED_STREAM, safe to retry), or the connection ended (GOAWAY ENHANCE_YOUR_CALM)
    /// when what it holds is not a stream's.
    MemoryPressure,
}

impl Reason {
    /// Every reason, in counter order.
    pub const ALL: [Reason; 21] = [
        Reason::BadPreface,
        Reason::Protocol,
        Reason::FrameSize,
        Reason::Compression,
        Reason::FlowControl,
        Reason::WindowOverflow,
        Reason::ZeroWindowUpdate,
        Reason::BadSetting,
        Reason::HeaderList,
        Reason::HeaderBlock,
        Reason::Flood,
        Reason::Malformed,
        Reason::StreamClosed,
        Reason::Refused,
        Reason::BadReply,
        Reason::PeerReset,
        Reason::IdleTimeout,
        Reason::SendTimeout,
        Reason::BufferFull,
        Reason::StreamId,
        Reason::MemoryPressure,
    ];

    /// Short name for counters.
    pub fn name(self) -> &'static str {
        match self {
            Reason::BadPreface => "bad_preface",
            Reason::Protocol => "protocol",
            Reason::FrameSize => "frame_size",
            Reason::Compression => "compression",
            Reason::FlowControl => "flow_control",
            Reason::WindowOverflow => "window_overflow",
            Reason::ZeroWindowUpdate => "zero_window_update",
            Reason::BadSetting => "bad_setting",
            Reason::HeaderList => "header_list",
            Reason::HeaderBlock => "header_block",
            Reason::Flood => "flood",
            Reason::Malformed => "malformed",
            Reason::StreamClosed => "stream_closed",
            Reason::Refused => "refused",
            Reason::BadReply => "bad_reply",
            Reason::PeerReset => "peer_reset",
            Reason::IdleTimeout => "idle_timeout",
            Reason::SendTimeout => "send_timeout",
            Reason::BufferFull => "buffer_full",
            Reason::StreamId => "stream_id",
            Reason::MemoryPressure => "memory_pressure",
        }
    }

    fn index(self) -> usize {
        Reason::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }

    fn parse_kind(self) -> ParseErrorKind {
        match self {
            Reason::HeaderList | Reason::HeaderBlock | Reason::Flood | Reason::BufferFull => {
                ParseErrorKind::TooLarge
            }
            Reason::FlowControl
            | Reason::WindowOverflow
            | Reason::ZeroWindowUpdate
            | Reason::BadSetting => ParseErrorKind::BadField,
            Reason::MemoryPressure => ParseErrorKind::Memory,
            _ => ParseErrorKind::Malformed,
        }
    }
}

/// A quantity a session holds in memory, tracked as a high-water mark
/// ([`H2Counters::hwm`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Streams holding a concurrency slot (at most `max_concurrent_streams`).
    Streams,
    /// Bytes of one header block being assembled (at most `max_header_block`).
    HeaderBlock,
    /// Request-body bytes buffered before dispatch (at most `max_buffered` plus the
    /// connection window, which is not reopened past `max_buffered`).
    Buffered,
    /// Reply-body bytes waiting for the peer's flow-control window (at most
    /// `max_concurrent_streams` replies: the application's reply size bounds it).
    HeldReplies,
    /// Received bytes not yet processed (at most `max_input` plus what the driver
    /// pushed after [`Session::wants_input`] said no).
    Input,
    /// Bytes queued for transmission: frames stop being processed at `max_output`,
    /// and one frame's answer or the reply data a window opening releases can add to it.
    Output,
}

impl Mark {
    /// Every mark, in counter order.
    pub const ALL: [Mark; 6] = [
        Mark::Streams,
        Mark::HeaderBlock,
        Mark::Buffered,
        Mark::HeldReplies,
        Mark::Input,
        Mark::Output,
    ];

    /// Short name for counters.
    pub fn name(self) -> &'static str {
        match self {
            Mark::Streams => "streams",
            Mark::HeaderBlock => "header_block_bytes",
            Mark::Buffered => "buffered_bytes",
            Mark::HeldReplies => "held_reply_bytes",
            Mark::Input => "input_bytes",
            Mark::Output => "output_bytes",
        }
    }
}

/// Counters shared by every HTTP/2 session of a server.
#[derive(Debug, Default)]
pub struct H2Counters {
    /// Sessions created.
    pub sessions: AtomicU64,
    /// Requests handed to workers.
    pub requests: AtomicU64,
    /// Responses sent to their end.
    pub responses: AtomicU64,
    /// PINGs answered.
    pub pings: AtomicU64,
    /// SETTINGS frames acknowledged.
    pub settings: AtomicU64,
    /// GOAWAYs sent, by error code (index = code value).
    pub goaway: [AtomicU64; 14],
    /// GOAWAYs sent, by [`Reason`] (index = position in [`Reason::ALL`]).
    pub goaway_reasons: [AtomicU64; Reason::ALL.len()],
    /// RST_STREAMs sent, by [`Reason`].
    pub rst_sent: [AtomicU64; Reason::ALL.len()],
    /// RST_STREAMs received.
    pub rst_received: AtomicU64,
    /// Replies that arrived for a stream already reset (dropped).
    pub replies_dropped: AtomicU64,
    /// CONNECT requests, answered 501 by the session (nothing here can run a tunnel).
    pub connect: AtomicU64,
    /// Requests whose body was over `max_body` (by its content-length or its DATA),
    /// answered with [`H2Config::too_large`] by the session.
    pub too_large: AtomicU64,
    /// High-water marks, the most any one session held (index = position in
    /// [`Mark::ALL`]).
    pub hwm: [AtomicU64; Mark::ALL.len()],
}

impl H2Counters {
    /// GOAWAYs sent with `code`.
    pub fn goaway(&self, code: ErrorCode) -> u64 {
        self.goaway[code as usize].load(Ordering::Relaxed)
    }

    /// GOAWAYs sent for `r`.
    pub fn goaway_for(&self, r: Reason) -> u64 {
        self.goaway_reasons[r.index()].load(Ordering::Relaxed)
    }

    /// RST_STREAMs sent for `r`.
    pub fn rst_for(&self, r: Reason) -> u64 {
        self.rst_sent[r.index()].load(Ordering::Relaxed)
    }

    /// The most any one session has held of `m`.
    pub fn hwm(&self, m: Mark) -> u64 {
        self.hwm[m as usize].load(Ordering::Relaxed)
    }

    /// `name=value` pairs of every non-zero counter (for reports).
    pub fn fields(&self) -> Vec<(String, u64)> {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut v = vec![
            ("sessions".to_string(), l(&self.sessions)),
            ("requests".to_string(), l(&self.requests)),
            ("responses".to_string(), l(&self.responses)),
            ("pings".to_string(), l(&self.pings)),
            ("settings".to_string(), l(&self.settings)),
            ("rst_received".to_string(), l(&self.rst_received)),
            ("replies_dropped".to_string(), l(&self.replies_dropped)),
            ("connect_501".to_string(), l(&self.connect)),
            ("too_large".to_string(), l(&self.too_large)),
        ];
        for r in Reason::ALL {
            v.push((format!("goaway_{}", r.name()), self.goaway_for(r)));
            v.push((format!("rst_{}", r.name()), self.rst_for(r)));
        }
        for m in Mark::ALL {
            v.push((format!("hwm_{}", m.name()), self.hwm(m)));
        }
        v
    }
}

/// Per-connection settings and bounds.
#[derive(Debug, Clone)]
pub struct H2Config {
    /// SETTINGS_MAX_CONCURRENT_STREAMS we advertise and enforce.
    pub max_concurrent_streams: u32,
    /// Largest header block (HEADERS + CONTINUATION payload bytes).
    pub max_header_block: usize,
    /// Most CONTINUATION frames in one header block.
    pub max_continuations: usize,
    /// Decoded header-list bounds (and the dynamic table size we allow).
    pub hpack: HpackLimits,
    /// Huffman-code the string literals of the header blocks we send when that is
    /// not longer (RFC 7541 §5.2); default [`hpack::HUFFMAN_DEFAULT`].
    pub huffman: bool,
    /// Largest request body.
    pub max_body: usize,
    /// The answer to a request whose body is over `max_body` — known from its
    /// content-length, or when its DATA pass it — sent by the session itself as one HEADERS
    /// frame with END_STREAM (headers, then trailers if any: gRPC's Trailers-Only form;
    /// a body is ignored), then RST_STREAM NO_ERROR if the request has not ended. Default
    /// 413 Content Too Large (RFC 9110 §15.5.14); gRPC servers set RESOURCE_EXHAUSTED
    /// ([`crate::proto::grpc::limit_messages`]). Not REFUSED_STREAM: that tells the client
    /// the request was not processed and may be retried (RFC 9113 §8.7), which a body too
    /// large for this server will never be; REFUSED_STREAM stays for the streams refused
    /// to relieve a full buffer ([`Reason::BufferFull`]), which may be retried.
    pub too_large: Response,
    /// Most request-body bytes buffered before dispatch, over all streams.
    pub max_buffered: usize,
    /// Our connection receive window.
    pub conn_window: u32,
    /// The flood budget (units; see the module docs).
    pub flood_budget: u32,
    /// Budget earned back per completed response.
    pub flood_refund: u32,
    /// Input bytes buffered unprocessed before the session stops taking more.
    pub max_input: usize,
    /// Output bytes queued before the session stops processing input.
    pub max_output: usize,
    /// Counters shared by every session of the server.
    pub counters: Arc<H2Counters>,
}

impl Default for H2Config {
    fn default() -> Self {
        H2Config {
            max_concurrent_streams: 100,
            max_header_block: 64 << 10,
            max_continuations: 32,
            hpack: HpackLimits::default(),
            huffman: hpack::HUFFMAN_DEFAULT,
            max_body: 1 << 20,
            too_large: Response::new(413),
            max_buffered: 4 << 20,
            conn_window: 1 << 20,
            flood_budget: 1000,
            flood_refund: 10,
            max_input: 64 << 10,
            max_output: 256 << 10,
            counters: Arc::new(H2Counters::default()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fail {
    Conn(ErrorCode, Reason),
    Stream(u32, ErrorCode, Reason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Preface,
    FirstSettings,
    Frames,
    Closing(ParseError),
}

struct Out {
    body: IoVec,
    trailers: Option<Vec<Field>>,
}

/// A request body as it arrives: slices of the received DATA frames (zero copy) up to
/// [`SPILL_MIN`](crate::framer::SPILL_MIN) bytes; past that, heap chunks it is copied into
/// as its DATA arrives, the received buffers released. Held zero copy until END_STREAM, a
/// body pinned one NIC receive buffer per TCP segment, and three connections uploading
/// 100 × 60 KB at once took a server's whole receive pool (an outside test, 2026-12-07);
/// the framer does the same for framed protocols. The chunks are of at most
/// [`SPILL_CHUNK`](crate::framer::SPILL_CHUNK), allocated as the bytes come (the last one
/// no larger than what the content-length says is left), so that what a body holds
/// follows what arrived, not what was announced (one heap buffer grown by doubling held
/// up to twice its bytes).
#[derive(Default)]
struct Body {
    /// Zero copy: slices of the received DATA frames (empty once spilled).
    frames: IoVec,
    /// Past the thresholds: the heap chunks (boxed: the rare path keeps `Stream` small).
    spill: Option<Box<Spill>>,
    /// Truesize ([`truesize`]): the slices' buffers, or the chunks (the one being filled
    /// at its capacity).
    mem: usize,
}

impl Body {
    fn len(&self) -> usize {
        self.frames.len() + self.spill.as_ref().map_or(0, |sp| sp.len())
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Zero copy while the body is small in bytes and in pieces: past `SPILL_MIN` bytes, or
    /// past `SPILL_PIECES` pieces (a body in 1-byte DATA frames would otherwise pin one
    /// receive buffer per byte until END_STREAM), it is copied into heap chunks and the
    /// receive buffers go (the framer's rule, `crate::framer`). `want`: the body's
    /// content-length, if the request gave one.
    fn append(&mut self, data: IoVec, want: Option<usize>) {
        if self.spill.is_none()
            && self.frames.len() + data.len() <= crate::framer::SPILL_MIN
            && self.frames.num_segments() + data.num_segments() <= SPILL_PIECES
        {
            self.frames.append(data);
            self.mem = truesize(&self.frames);
            return;
        }
        let frames = std::mem::take(&mut self.frames);
        let sp = self.spill.get_or_insert_with(Box::default);
        for c in frames.chunks().chain(data.chunks()) {
            sp.extend(c, want);
        }
        self.mem = self.recount();
    }

    /// [`Body::mem`] counted over what is held.
    fn recount(&self) -> usize {
        truesize(&self.frames) + self.spill.as_ref().map_or(0, |sp| sp.mem())
    }

    fn take(&mut self) -> IoVec {
        self.mem = 0;
        match self.spill.take() {
            None => std::mem::take(&mut self.frames),
            Some(sp) => sp.finish(),
        }
    }
}

/// Memory a decoded header list holds: RFC 9113 §6.5.2's measure (name, value and 32
/// bytes per field), what SETTINGS_MAX_HEADER_LIST_SIZE bounds.
fn list_mem(fields: &[Field]) -> usize {
    fields.iter().map(|(n, v)| n.len() + v.len() + 32).sum()
}

struct Stream {
    /// The peer's side ended (END_STREAM received).
    remote_done: bool,
    headers: Vec<Field>,
    /// [`list_mem`] of `headers` (0 once handed to a worker).
    hmem: usize,
    body: Body,
    /// Stream credit withheld while the I/O side said no ([`Session::set_mem`]): the
    /// DATA bytes received since, granted back when it says yes.
    owed: u32,
    /// What the peer may still send on this stream.
    recv_window: i64,
    /// What we may still send on this stream.
    send_window: i64,
    /// Handed to a worker, completion not yet back.
    at_worker: bool,
    /// Reset (by either side): nothing more is sent or accepted; kept only while the
    /// worker still runs it (it holds its concurrency slot).
    reset: bool,
    /// A reply waiting for flow-control window.
    out: Option<Out>,
    /// The request is a HEAD: its response carries no content (RFC 9110 §9.3.2), so it
    /// ends with its HEADERS whatever body the worker gave.
    head: bool,
    /// The request's content-length: its DATA must add up to it (RFC 9113 §8.1.1).
    content_length: Option<u64>,
}

/// How a stream below the highest id opened ended, as far as the peer's later frames on
/// it are concerned (RFC 9113 §5.1, "closed").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// Never opened: skipped by the peer, so implicitly closed (§5.1.1).
    Unused = 0,
    /// Both sides sent END_STREAM: the peer knows it is closed (only WINDOW_UPDATE and
    /// RST_STREAM may still be in flight).
    Done = 1,
    /// We sent RST_STREAM (or ignored the stream): the peer may not have seen it yet, so
    /// anything it sent meanwhile is ignored (§5.1: "MUST ignore").
    ResetHere = 2,
    /// The peer sent RST_STREAM: it sends nothing more but PRIORITY.
    ResetThere = 3,
}

/// What became of the last [`History::IDS`] odd stream ids up to the highest one the peer
/// opened: 2 bits each in a ring indexed by id, 128 bytes per session, O(1) per stream.
/// Older ids are forgotten; a frame on one is treated as on a stream we reset (ignored at
/// a cost), the one reading that never breaks a connection for a frame in flight, as
/// nghttp2 and HAProxy do for streams they no longer remember.
#[derive(Default)]
struct History {
    bits: [u64; History::IDS * 2 / 64],
}

impl History {
    /// Odd ids remembered.
    const IDS: usize = 512;

    fn at(id: u32) -> (usize, u32) {
        let slot = (id as usize >> 1) & (Self::IDS - 1);
        (slot / 32, (slot % 32) as u32 * 2)
    }

    /// `id` is one of the remembered ids below or at `last`.
    fn covers(last: u32, id: u32) -> bool {
        id % 2 == 1 && id <= last && ((last - id) as usize) < 2 * Self::IDS
    }

    /// The highest id opened moved from `old` to `new`: the ids in between enter the
    /// window unused.
    fn advance(&mut self, old: u32, new: u32) {
        if (new - old) as usize >= 2 * Self::IDS {
            self.bits = [0; Self::IDS * 2 / 64];
            return;
        }
        let mut id = (old + 1) | 1;
        while id <= new {
            let (w, b) = Self::at(id);
            self.bits[w] &= !(3 << b);
            id += 2;
        }
    }

    fn set(&mut self, last: u32, id: u32, e: Ended) {
        if Self::covers(last, id) {
            let (w, b) = Self::at(id);
            self.bits[w] = (self.bits[w] & !(3 << b)) | ((e as u64) << b);
        }
    }

    fn get(&self, last: u32, id: u32) -> Option<Ended> {
        if !Self::covers(last, id) {
            return None;
        }
        let (w, b) = Self::at(id);
        Some(match (self.bits[w] >> b) & 3 {
            0 => Ended::Unused,
            1 => Ended::Done,
            2 => Ended::ResetHere,
            _ => Ended::ResetThere,
        })
    }
}

struct Block {
    stream: u32,
    end_stream: bool,
    /// Its priority fields make the stream depend on itself (a stream error once the
    /// block is decoded).
    self_dependent: bool,
    buf: Vec<u8>,
    continuations: usize,
}

/// One HTTP/2 server connection.
pub struct H2Session {
    cfg: H2Config,
    phase: Phase,
    input: IoVec,
    tx: IoVec,
    /// Small frames being gathered into one zbuf of `tx`.
    ctl: Vec<u8>,
    decoder: Decoder,
    encoder: Encoder,
    streams: HashMap<u32, Stream>,
    /// Highest stream id the peer has opened.
    last_stream: u32,
    /// How the streams below `last_stream` ended.
    history: History,
    /// Streams whose request is complete, in arrival order.
    ready: VecDeque<u32>,
    /// Streams with reply data waiting for window, round robin.
    sending: VecDeque<u32>,
    block: Option<Block>,
    conn_recv_window: i64,
    conn_send_window: i64,
    /// Connection credit consumed and not yet returned with a WINDOW_UPDATE.
    unreturned: u64,
    buffered: usize,
    peer_initial_window: i64,
    peer_max_frame: usize,
    budget: i64,
    peer_goaway: bool,
    /// Ended by the driver's timer: a clean end ([`SessionState::Done`]) once the
    /// GOAWAY is queued, not a protocol error.
    timed_out: bool,
    /// Reply-body bytes of `Stream::out`, waiting for window.
    held: usize,
    /// This session's high-water marks ([`Mark`] order), and what of them the shared
    /// counters have seen (published only when one grows: no atomics otherwise).
    marks: [usize; Mark::ALL.len()],
    published: [usize; Mark::ALL.len()],
    /// Segments pushed into `input` since it was last merged (`framer::merge_tail`).
    input_loose: usize,
    /// What the streams hold before dispatch, in truesize: their decoded headers
    /// ([`list_mem`]) and bodies ([`Body::mem`]). [`Session::mem`] adds `input` and the
    /// header block being assembled.
    streams_mem: usize,
    /// [`Session::mem`] may grow up to this before header blocks stop being decoded
    /// ([`Session::set_mem`]'s room); `usize::MAX` when nobody bounds it.
    mem_limit: usize,
    /// Processing stopped at a header block for lack of room.
    stopped_for_mem: bool,
    /// Flow-control credit may be granted ([`Session::set_mem`]).
    credit_open: bool,
    /// Sum of the streams' `owed`.
    owed: u64,
}

impl H2Session {
    /// A session for a new connection; its SETTINGS go out with the first transmit.
    pub fn new(cfg: H2Config) -> Self {
        cfg.counters.sessions.fetch_add(1, Ordering::Relaxed);
        let mut ctl = Vec::new();
        frame::settings(
            &mut ctl,
            &[
                (setting::MAX_CONCURRENT_STREAMS, cfg.max_concurrent_streams),
                (setting::HEADER_TABLE_SIZE, cfg.hpack.max_table_size as u32),
                (
                    setting::MAX_HEADER_LIST_SIZE,
                    cfg.hpack.max_list_size as u32,
                ),
            ],
        );
        let conn_window =
            i64::from(cfg.conn_window).clamp(frame::DEFAULT_WINDOW, frame::MAX_WINDOW);
        if conn_window > frame::DEFAULT_WINDOW {
            frame::window_update(&mut ctl, 0, (conn_window - frame::DEFAULT_WINDOW) as u32);
        }
        H2Session {
            decoder: Decoder::new(cfg.hpack),
            encoder: Encoder::with_huffman(cfg.huffman),
            budget: i64::from(cfg.flood_budget),
            cfg,
            phase: Phase::Preface,
            input: IoVec::new(),
            tx: IoVec::new(),
            ctl,
            streams: HashMap::new(),
            last_stream: 0,
            history: History::default(),
            ready: VecDeque::new(),
            sending: VecDeque::new(),
            block: None,
            conn_recv_window: conn_window,
            conn_send_window: frame::DEFAULT_WINDOW,
            unreturned: 0,
            buffered: 0,
            peer_initial_window: frame::DEFAULT_WINDOW,
            peer_max_frame: frame::DEFAULT_MAX_FRAME as usize,
            peer_goaway: false,
            timed_out: false,
            held: 0,
            marks: [0; Mark::ALL.len()],
            published: [0; Mark::ALL.len()],
            input_loose: 0,
            streams_mem: 0,
            mem_limit: usize::MAX,
            stopped_for_mem: false,
            credit_open: true,
            owed: 0,
        }
    }

    /// Raises this session's mark `m` to `v` if higher.
    fn mark(&mut self, m: Mark, v: usize) {
        let i = m as usize;
        if v > self.marks[i] {
            self.marks[i] = v;
        }
    }

    /// Marks what can only have grown since the last call, then hands the marks that
    /// grew to the shared counters. Called at the end of every entry point that can
    /// add to what the session holds.
    fn publish(&mut self) {
        self.mark(Mark::Streams, self.streams.len());
        self.mark(Mark::Buffered, self.buffered);
        self.mark(Mark::HeldReplies, self.held);
        self.mark(Mark::Output, self.out_len());
        for m in Mark::ALL {
            let i = m as usize;
            if self.marks[i] > self.published[i] {
                self.cfg.counters.hwm[i].fetch_max(self.marks[i] as u64, Ordering::Relaxed);
                self.published[i] = self.marks[i];
            }
        }
    }

    /// Reply-body bytes waiting for the peer's window.
    pub fn held_replies(&self) -> usize {
        self.held
    }

    /// Streams holding a concurrency slot.
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Request-body bytes buffered before dispatch.
    pub fn buffered(&self) -> usize {
        self.buffered
    }

    fn flush_ctl(&mut self) {
        if !self.ctl.is_empty() {
            self.tx.push(Zbuf::from_vec(std::mem::take(&mut self.ctl)));
        }
    }

    fn out_len(&self) -> usize {
        self.tx.len() + self.ctl.len()
    }

    fn cost(&mut self, n: i64) -> Result<(), Fail> {
        self.budget -= n;
        if self.budget < 0 {
            return Err(Fail::Conn(ErrorCode::EnhanceYourCalm, Reason::Flood));
        }
        Ok(())
    }

    fn counters(&self) -> &H2Counters {
        &self.cfg.counters
    }

    /// Ends the connection: GOAWAY with `code`, nothing more is read.
    fn goaway(&mut self, code: ErrorCode, reason: Reason) {
        if matches!(self.phase, Phase::Closing(_)) {
            return;
        }
        let c = self.counters();
        c.goaway[code as usize].fetch_add(1, Ordering::Relaxed);
        c.goaway_reasons[reason.index()].fetch_add(1, Ordering::Relaxed);
        frame::goaway(
            &mut self.ctl,
            self.last_stream,
            code,
            reason.name().as_bytes(),
        );
        self.flush_ctl();
        self.phase = Phase::Closing(ParseError::new(reason.parse_kind(), reason.name()));
        self.input = IoVec::new();
        self.block = None;
    }

    /// Resets `id` (our side): RST_STREAM, the stream keeps its slot while at a worker.
    fn reset(&mut self, id: u32, code: ErrorCode, reason: Reason) -> Result<(), Fail> {
        self.counters().rst_sent[reason.index()].fetch_add(1, Ordering::Relaxed);
        frame::rst_stream(&mut self.ctl, id, code);
        self.history.set(self.last_stream, id, Ended::ResetHere);
        self.close_stream(id);
        self.cost(1)
    }

    /// Forgets `id`, or marks it reset while its worker still runs it.
    fn close_stream(&mut self, id: u32) {
        if let Some(s) = self.streams.get_mut(&id) {
            // Only a stream not yet dispatched holds body bytes and headers.
            self.buffered -= s.body.len();
            self.streams_mem -= s.body.mem + s.hmem;
            s.body = Body::default();
            s.headers = Vec::new();
            s.hmem = 0;
            self.owed -= u64::from(s.owed);
            s.owed = 0;
            self.held -= s.out.as_ref().map_or(0, |o| o.body.len());
            if s.at_worker {
                s.reset = true;
                s.out = None;
            } else {
                self.streams.remove(&id);
            }
        }
    }

    /// Removes `id` (its request done, or never dispatched), releasing what it held.
    fn remove_stream(&mut self, id: u32) {
        if let Some(s) = self.streams.remove(&id) {
            self.buffered -= s.body.len();
            self.streams_mem -= s.body.mem + s.hmem;
            self.owed -= u64::from(s.owed);
            self.held -= s.out.as_ref().map_or(0, |o| o.body.len());
        }
    }

    /// [`Self::streams_mem`] counted over the streams (debug checks).
    fn recount_streams(&self) -> usize {
        self.streams
            .values()
            .map(|s| {
                debug_assert_eq!(s.hmem, list_mem(&s.headers));
                debug_assert_eq!(s.body.mem, s.body.recount());
                s.hmem + s.body.mem
            })
            .sum()
    }

    /// What [`Session::mem`] reports: unprocessed input, the header block being
    /// assembled, and the streams' headers and bodies before dispatch.
    fn mem_now(&self) -> usize {
        debug_assert_eq!(self.streams_mem, self.recount_streams());
        let block = self
            .block
            .as_ref()
            .map_or(0, |b| b.buf.capacity() + BUF_OVERHEAD);
        truesize(&self.input) + block + self.streams_mem
    }

    /// Credit may be granted again: the streams still receiving get what they are owed
    /// (oldest first), and the connection its unreturned credit.
    #[cold]
    #[inline(never)]
    fn give_owed(&mut self) {
        if self.owed > 0 {
            let mut ids: Vec<u32> = self
                .streams
                .iter()
                .filter(|(_, s)| s.owed > 0)
                .map(|(&id, _)| id)
                .collect();
            ids.sort_unstable();
            for id in ids {
                let Some(s) = self.streams.get_mut(&id) else {
                    continue;
                };
                let n = std::mem::take(&mut s.owed);
                self.owed -= u64::from(n);
                if !s.remote_done && !s.reset {
                    s.recv_window += i64::from(n);
                    frame::window_update(&mut self.ctl, id, n);
                }
            }
        }
        self.return_credit();
        self.flush_ctl();
    }

    /// The largest partial request (not ended by the peer, not dispatched, not reset)
    /// holding memory: (what it holds, its id). Ties: the newest.
    fn largest_partial(&self) -> Option<(usize, u32)> {
        self.streams
            .iter()
            .filter(|(_, s)| !s.remote_done && !s.reset && !s.at_worker)
            .map(|(&id, s)| (s.hmem + s.body.mem, id))
            .filter(|&(m, _)| m > 0)
            .max()
    }

    fn process(&mut self) {
        self.stopped_for_mem = false;
        while self.out_len() < self.cfg.max_output {
            let r = match self.phase {
                Phase::Closing(_) => return,
                Phase::Preface => self.preface(),
                Phase::FirstSettings | Phase::Frames => self.one_frame(),
            };
            match r {
                Ok(true) => continue,
                Ok(false) => break,
                Err(Fail::Conn(code, reason)) => {
                    self.goaway(code, reason);
                    return;
                }
                Err(Fail::Stream(id, code, reason)) => {
                    if let Err(Fail::Conn(c, r)) = self.reset(id, code, reason) {
                        self.goaway(c, r);
                        return;
                    }
                }
            }
        }
        if let Err(Fail::Conn(c, r)) = self.relieve() {
            self.goaway(c, r);
            return;
        }
        self.return_credit();
        self.flush_ctl();
    }

    /// Keeps the connection live when unfinished bodies hold its window shut. Past
    /// `max_buffered` the connection window is not reopened ([`Self::return_credit`]);
    /// if then no body has ended (one waiting for dispatch would free its bytes) and less
    /// than a frame of connection window is left, no stream can finish and nothing frees a
    /// byte: the connection would hang until a timeout (RFC 9113 §6.9: credit must not be
    /// withheld so that a peer within its limits deadlocks — six 1 MB uploads on one
    /// connection did, and gRPC calls ran into their deadlines). The newest streams still
    /// receiving a body are refused (REFUSED_STREAM: not processed, safe to retry, RFC 9113
    /// §8.7) until the rest fits under `max_buffered`, and counted (`buffer_full`).
    fn relieve(&mut self) -> Result<(), Fail> {
        if self.buffered <= self.cfg.max_buffered
            || self.conn_recv_window >= i64::from(frame::DEFAULT_MAX_FRAME)
            || matches!(self.phase, Phase::Closing(_))
        {
            return Ok(());
        }
        let dispatchable = self.ready.iter().any(|id| {
            self.streams
                .get(id)
                .is_some_and(|s| !s.reset && !s.at_worker)
        });
        if dispatchable {
            return Ok(());
        }
        while self.buffered > self.cfg.max_buffered {
            let newest = self
                .streams
                .iter()
                .filter(|(_, s)| !s.remote_done && !s.reset && !s.body.is_empty())
                .map(|(&id, _)| id)
                .max();
            let Some(id) = newest else { break };
            self.reset(id, ErrorCode::RefusedStream, Reason::BufferFull)?;
        }
        Ok(())
    }

    fn return_credit(&mut self) {
        if self.unreturned > 0
            && self.credit_open
            && self.buffered <= self.cfg.max_buffered
            && !matches!(self.phase, Phase::Closing(_))
        {
            let n = self.unreturned.min(frame::MAX_WINDOW as u64);
            frame::window_update(&mut self.ctl, 0, n as u32);
            self.conn_recv_window += n as i64;
            self.unreturned -= n;
        }
    }

    fn preface(&mut self) -> Result<bool, Fail> {
        let n = self.input.len().min(frame::PREFACE.len());
        let mut got = vec![0u8; n];
        peek(&self.input, 0, &mut got);
        if got[..] != frame::PREFACE[..n] {
            return Err(Fail::Conn(ErrorCode::Protocol, Reason::BadPreface));
        }
        if n < frame::PREFACE.len() {
            return Ok(false);
        }
        self.input.advance(n);
        self.phase = Phase::FirstSettings;
        Ok(true)
    }

    fn one_frame(&mut self) -> Result<bool, Fail> {
        let mut hb = [0u8; HEADER_LEN];
        if !peek(&self.input, 0, &mut hb) {
            return Ok(false);
        }
        let h = FrameHeader::parse(&hb);
        if h.len > frame::DEFAULT_MAX_FRAME {
            // We never raise SETTINGS_MAX_FRAME_SIZE above the default.
            return Err(Fail::Conn(ErrorCode::FrameSize, Reason::FrameSize));
        }
        let total = HEADER_LEN + h.len as usize;
        if self.input.len() < total {
            return Ok(false);
        }
        if matches!(h.kind, kind::HEADERS | kind::CONTINUATION)
            && h.flags & flag::END_HEADERS != 0
            && self.mem_limit != usize::MAX
            && self.mem_now() >= self.mem_limit
        {
            // Decoding may turn a few bytes into a header list of max_list_size: not
            // past the I/O side's memory budget. The frame waits for room.
            self.stopped_for_mem = true;
            return Ok(false);
        }
        let mut f = self.input.split_to(total);
        f.advance(HEADER_LEN);
        if self.phase == Phase::FirstSettings {
            if h.kind != kind::SETTINGS || h.flags & flag::ACK != 0 {
                return Err(Fail::Conn(ErrorCode::Protocol, Reason::BadPreface));
            }
            self.phase = Phase::Frames;
        }
        if let Some(b) = &self.block {
            if h.kind != kind::CONTINUATION || h.stream != b.stream {
                return Err(Fail::Conn(ErrorCode::Protocol, Reason::Protocol));
            }
        }
        match h.kind {
            kind::DATA => self.on_data(h, f)?,
            kind::HEADERS => self.on_headers(h, f)?,
            kind::CONTINUATION => self.on_continuation(h, f)?,
            kind::PRIORITY => {
                if h.stream == 0 {
                    return Err(Fail::Conn(ErrorCode::Protocol, Reason::Protocol));
                }
                // PRIORITY may name an idle stream, but a RST_STREAM may not (RFC 9113
                // §6.4): its errors there end the connection instead.
                let idle = h.stream > self.last_stream || h.stream % 2 == 0;
                let error = |code, reason| match idle {
                    true => Fail::Conn(code, reason),
                    false => Fail::Stream(h.stream, code, reason),
                };
                if h.len != 5 {
                    return Err(error(ErrorCode::FrameSize, Reason::FrameSize));
                }
                self.cost(1)?;
                if Self::depends_on_itself(&h, &f) {
                    return Err(error(ErrorCode::Protocol, Reason::Protocol));
                }
            }
            kind::RST_STREAM => self.on_rst(h, f)?,
            kind::SETTINGS => self.on_settings(h, f)?,
            kind::PUSH_PROMISE => {
                return Err(Fail::Conn(ErrorCode::Protocol, Reason::Protocol));
            }
            kind::PING => {
                if h.stream != 0 {
                    return Err(Fail::Conn(ErrorCode::Protocol, Reason::Protocol));
                }
                if h.len != 8 {
                    return Err(Fail::Conn(ErrorCode::FrameSize, Reason::FrameSize));
                }
                // Every PING costs, an ACK too: the session sends no PING, so an ACK is
                // unsolicited (200,000 of them were taken for free).
                self.cost(1)?;
                if h.flags & flag::ACK == 0 {
                    let mut p = [0u8; 8];
                    f.copy_to_slice(&mut p);
                    frame::put(&mut self.ctl, kind::PING, flag::ACK, 0, &p);
                    self.counters().pings.fetch_add(1, Ordering::Relaxed);
                }
            }
            kind::GOAWAY => {
                if h.stream != 0 {
                    return Err(Fail::Conn(ErrorCode::Protocol, Reason::Protocol));
                }
                if h.len < 8 {
                    return Err(Fail::Conn(ErrorCode::FrameSize, Reason::FrameSize));
                }
                self.peer_goaway = true;
            }
            kind::WINDOW_UPDATE => self.on_window_update(h, f)?,
            _ => self.cost(1)?,
        }
        Ok(true)
    }

    /// Strips padding: the payload without its pad-length byte and padding.
    fn unpad(h: &FrameHeader, mut f: IoVec) -> Result<IoVec, Fail> {
        if h.flags & flag::PADDED == 0 {
            return Ok(f);
        }
        let mut p = [0u8; 1];
        if !peek(&f, 0, &mut p) {
            return Err(Fail::Conn(ErrorCode::FrameSize, Reason::FrameSize));
        }
        let pad = p[0] as usize;
        if pad >= f.len() {
            return Err(Fail::Conn(ErrorCode::Protocol, Reason::Protocol));
        }
        f.advance(1);
        f.truncate(f.len() - pad);
        Ok(f)
    }

    /// The stream-dependency field at the start of `f` names the frame's own stream: a
    /// stream error PROTOCOL_ERROR (RFC 9113 §5.3.1, still required of the deprecated
    /// priority fields).
    fn depends_on_itself(h: &FrameHeader, f: &IoVec) -> bool {
        let mut d = [0u8; 4];
        peek(f, 0, &mut d) && u32::from_be_bytes(d) & 0x7fff_ffff == h.stream
    }

    fn on_data(&mut self, h: FrameHeader, f: IoVec) -> Result<(), Fail> {
        if h.stream == 0 {
            return Err(Fail::Conn(ErrorCode::Protocol, Reason::Protocol));
        }
        self.not_idle(h.stream)?;
        let flen = i64::from(h.len);
        self.conn_recv_window -= flen;
        if self.conn_recv_window < 0 {
            return Err(Fail::Conn(ErrorCode::FlowControl, Reason::FlowControl));
        }
        self.unreturned += u64::from(h.len);
        let data = Self::unpad(&h, f)?;
        let end = h.flags & flag::END_STREAM != 0;
        let max_body = self.cfg.max_body;
        let Some(s) = self.streams.get_mut(&h.stream).filter(|s| !s.reset) else {
            return self.on_closed(h.stream, None);
        };
        if s.remote_done {
            return Err(Fail::Stream(
                h.stream,
                ErrorCode::StreamClosed,
                Reason::StreamClosed,
            ));
        }
        s.recv_window -= flen;
        if s.recv_window < 0 {
            return Err(Fail::Stream(
                h.stream,
                ErrorCode::FlowControl,
                Reason::FlowControl,
            ));
        }
        let total = (s.body.len() + data.len()) as u64;
        if s.content_length
            .is_some_and(|l| total > l || (end && total != l))
        {
            // Malformed (RFC 9113 §8.1.1): found as soon as the DATA passes it.
            return Err(Fail::Stream(
                h.stream,
                ErrorCode::Protocol,
                Reason::Malformed,
            ));
        }
        if s.body.len() + data.len() > max_body {
            return self.too_large(h.stream, end);
        }
        let dlen = data.len();
        let was = s.body.mem;
        s.body.append(data, s.content_length.map(|l| l as usize));
        self.streams_mem = self.streams_mem - was + s.body.mem;
        self.buffered += dlen;
        // Marked here: a reset later in the same input frees it before `publish`.
        let b = &mut self.marks[Mark::Buffered as usize];
        *b = (*b).max(self.buffered);
        if end {
            s.remote_done = true;
            self.owed -= u64::from(std::mem::take(&mut s.owed));
            self.ready.push_back(h.stream);
        } else if h.len > 0 {
            if self.credit_open {
                s.recv_window += flen;
                frame::window_update(&mut self.ctl, h.stream, h.len);
            } else {
                // The I/O side's memory is tight: the peer gets this back later.
                s.owed += h.len;
                self.owed += u64::from(h.len);
            }
        }
        if h.len == 0 && !end {
            self.cost(1)?;
        }
        Ok(())
    }

    fn on_headers(&mut self, h: FrameHeader, f: IoVec) -> Result<(), Fail> {
        if h.stream == 0 {
            return Err(Fail::Conn(ErrorCode::Protocol, Reason::Protocol));
        }
        let mut frag = Self::unpad(&h, f)?;
        let mut self_dependent = false;
        if h.flags & flag::PRIORITY != 0 {
            if frag.len() < 5 {
                // Padding that leaves no room for the priority fields is PROTOCOL_ERROR
                // (RFC 9113 §6.2); a frame too short for them anyway, FRAME_SIZE_ERROR.
                return Err(if h.flags & flag::PADDED != 0 {
                    Fail::Conn(ErrorCode::Protocol, Reason::Protocol)
                } else {
                    Fail::Conn(ErrorCode::FrameSize, Reason::FrameSize)
                });
            }
            self_dependent = Self::depends_on_itself(&h, &frag);
            frag.advance(5);
        }
        if frag.is_empty() && h.flags & flag::END_HEADERS == 0 {
            self.cost(1)?;
        }
        let b = Block {
            stream: h.stream,
            end_stream: h.flags & flag::END_STREAM != 0,
            self_dependent,
            buf: frag.to_vec(),
            continuations: 0,
        };
        if b.buf.len() > self.cfg.max_header_block {
            return Err(Fail::Conn(ErrorCode::EnhanceYourCalm, Reason::HeaderBlock));
        }
        self.mark(Mark::HeaderBlock, b.buf.len());
        if h.flags & flag::END_HEADERS != 0 {
            self.on_block(b)
        } else {
            self.block = Some(b);
            Ok(())
        }
    }

    fn on_continuation(&mut self, h: FrameHeader, f: IoVec) -> Result<(), Fail> {
        let Some(mut b) = self.block.take() else {
            return Err(Fail::Conn(ErrorCode::Protocol, Reason::Protocol));
        };
        b.continuations += 1;
        if b.continuations > self.cfg.max_continuations
            || b.buf.len() + f.len() > self.cfg.max_header_block
        {
            return Err(Fail::Conn(ErrorCode::EnhanceYourCalm, Reason::HeaderBlock));
        }
        if f.is_empty() && h.flags & flag::END_HEADERS == 0 {
            self.cost(1)?;
        }
        b.buf.extend_from_slice(&f.to_vec());
        self.mark(Mark::HeaderBlock, b.buf.len());
        if h.flags & flag::END_HEADERS != 0 {
            self.on_block(b)
        } else {
            self.block = Some(b);
            Ok(())
        }
    }

    fn on_block(&mut self, b: Block) -> Result<(), Fail> {
        // Decode first whatever becomes of the stream: the dynamic table must follow
        // the peer's encoder.
        let fields = match self.decoder.decode(&b.buf) {
            Ok(f) => f,
            Err(HpackError::Malformed(_)) => {
                return Err(Fail::Conn(ErrorCode::Compression, Reason::Compression))
            }
            Err(HpackError::ListTooLarge | HpackError::TooManyFields) => {
                return Err(Fail::Conn(ErrorCode::EnhanceYourCalm, Reason::HeaderList))
            }
        };
        let id = b.stream;
        if id % 2 == 0 {
            // Idle forever: a client opens odd ids, and we push nothing (§5.1.1).
            return Err(Fail::Conn(ErrorCode::Protocol, Reason::StreamId));
        }
        if let Some(s) = self.streams.get_mut(&id) {
            if s.reset {
                return self.on_closed(id, Some(&fields));
            }
            if s.remote_done {
                return Err(Fail::Stream(
                    id,
                    ErrorCode::StreamClosed,
                    Reason::StreamClosed,
                ));
            }
            if b.self_dependent {
                return Err(Fail::Stream(id, ErrorCode::Protocol, Reason::Protocol));
            }
            // Trailers: they must end the stream, carry no pseudo-headers (RFC 9113
            // §8.1) and only valid fields, and the body must have its content-length.
            let body_len = s.body.len() as u64;
            if !b.end_stream
                || !fields.iter().all(|(n, v)| valid_field(n, v))
                || s.content_length.is_some_and(|l| l != body_len)
            {
                return Err(Fail::Stream(id, ErrorCode::Protocol, Reason::Malformed));
            }
            let m = list_mem(&fields);
            s.headers.extend(fields);
            s.hmem += m;
            self.streams_mem += m;
            s.remote_done = true;
            self.owed -= u64::from(std::mem::take(&mut s.owed));
            self.ready.push_back(id);
            return Ok(());
        }
        if id <= self.last_stream {
            return self.on_closed(id, Some(&fields));
        }
        self.history.advance(self.last_stream, id);
        self.last_stream = id;
        if self.peer_goaway {
            // Not served; its frames are ignored like those of a stream we reset.
            self.history.set(id, id, Ended::ResetHere);
            return self.cost(1);
        }
        if b.self_dependent {
            return Err(Fail::Stream(id, ErrorCode::Protocol, Reason::Protocol));
        }
        if self.streams.len() >= self.cfg.max_concurrent_streams as usize {
            return Err(Fail::Stream(id, ErrorCode::RefusedStream, Reason::Refused));
        }
        let info = check_request(&fields)
            .filter(|i| !(b.end_stream && i.content_length.is_some_and(|l| l != 0)));
        let Some(info) = info else {
            return Err(Fail::Stream(id, ErrorCode::Protocol, Reason::Malformed));
        };
        let hmem = list_mem(&fields);
        self.streams_mem += hmem;
        self.streams.insert(
            id,
            Stream {
                remote_done: b.end_stream,
                head: info.head,
                content_length: info.content_length,
                headers: fields,
                hmem,
                owed: 0,
                body: Body::default(),
                recv_window: frame::DEFAULT_WINDOW,
                send_window: self.peer_initial_window,
                at_worker: false,
                reset: false,
                out: None,
            },
        );
        // Marked here: rapid reset frees the slot again within the same input.
        self.mark(Mark::Streams, self.streams.len());
        if info.connect {
            // A tunnel needs a stream's DATA both ways as it comes; workers get whole
            // requests. So CONNECT is a method this server does not implement, for any
            // target: 501 (RFC 9110 §9.3.6, §15.6.2), and a RST_STREAM NO_ERROR if the
            // client's side is still open (the tunnel data is not wanted).
            self.counters().connect.fetch_add(1, Ordering::Relaxed);
            return self.respond_now(id, Response::new(501));
        }
        if info
            .content_length
            .is_some_and(|l| l > self.cfg.max_body as u64)
        {
            // Answered now rather than after max_body bytes of DATA.
            return self.too_large(id, false);
        }
        if b.end_stream {
            self.ready.push_back(id);
        }
        Ok(())
    }

    /// A DATA, WINDOW_UPDATE or RST_STREAM on an idle stream — above every id the peer
    /// opened, or even (a client opens odd ids; we push nothing) — is a connection error
    /// PROTOCOL_ERROR (RFC 9113 §5.1, "idle").
    fn not_idle(&self, id: u32) -> Result<(), Fail> {
        if id > self.last_stream || id % 2 == 0 {
            return Err(Fail::Conn(ErrorCode::Protocol, Reason::StreamId));
        }
        Ok(())
    }

    /// A DATA (`headers` None) or HEADERS (its decoded fields) on odd stream `id` at or
    /// below the highest id opened, on a stream that is closed or reset. RFC 9113 §5.1 and
    /// §5.1.1, by how the stream ended:
    /// - never opened (the peer skipped it): HEADERS opens a stream with a lower id than
    ///   an earlier one, connection error PROTOCOL_ERROR; DATA, connection error
    ///   STREAM_CLOSED;
    /// - both sides sent END_STREAM: the peer knows it is closed, connection error
    ///   STREAM_CLOSED;
    /// - the peer reset it: stream error STREAM_CLOSED (§6.1 for DATA);
    /// - we reset it: the peer may have sent these before our RST_STREAM reached it
    ///   ("MUST ignore"): ignored, at a cost (the flood budget); DATA still counted
    ///   against the connection window and HPACK state updated, by the callers;
    /// - forgotten (older than [`History::IDS`] ids): as if we had reset it, except that
    ///   a request's header block (pseudo-header fields: not trailers) can only be a
    ///   reused id, PROTOCOL_ERROR.
    fn on_closed(&mut self, id: u32, headers: Option<&[Field]>) -> Result<(), Fail> {
        let stream_closed = Fail::Conn(ErrorCode::StreamClosed, Reason::StreamClosed);
        match self.history.get(self.last_stream, id) {
            Some(Ended::Unused) if headers.is_some() => {
                Err(Fail::Conn(ErrorCode::Protocol, Reason::StreamId))
            }
            Some(Ended::Unused | Ended::Done) => Err(stream_closed),
            Some(Ended::ResetThere) => Err(Fail::Stream(
                id,
                ErrorCode::StreamClosed,
                Reason::StreamClosed,
            )),
            None if headers.is_some_and(|f| f.iter().any(|(n, _)| n.first() == Some(&b':'))) => {
                Err(Fail::Conn(ErrorCode::Protocol, Reason::StreamId))
            }
            Some(Ended::ResetHere) | None => self.cost(1),
        }
    }

    fn on_rst(&mut self, h: FrameHeader, _f: IoVec) -> Result<(), Fail> {
        if h.stream == 0 {
            return Err(Fail::Conn(ErrorCode::Protocol, Reason::Protocol));
        }
        self.not_idle(h.stream)?;
        if h.len != 4 {
            return Err(Fail::Conn(ErrorCode::FrameSize, Reason::FrameSize));
        }
        self.counters().rst_received.fetch_add(1, Ordering::Relaxed);
        // A stream already closed keeps what ended it: a reset crossing ours, or one in
        // flight after both END_STREAMs, is allowed (§5.1) and changes nothing.
        if self.streams.get(&h.stream).is_some_and(|s| !s.reset) {
            self.history
                .set(self.last_stream, h.stream, Ended::ResetThere);
        }
        self.close_stream(h.stream);
        self.cost(1)
    }

    fn on_settings(&mut self, h: FrameHeader, f: IoVec) -> Result<(), Fail> {
        if h.stream != 0 {
            return Err(Fail::Conn(ErrorCode::Protocol, Reason::Protocol));
        }
        if h.flags & flag::ACK != 0 {
            if h.len != 0 {
                return Err(Fail::Conn(ErrorCode::FrameSize, Reason::FrameSize));
            }
            // One is owed for our SETTINGS; a flood of them makes no progress.
            return self.cost(1);
        }
        if h.len % 6 != 0 {
            return Err(Fail::Conn(ErrorCode::FrameSize, Reason::FrameSize));
        }
        self.cost(1)?;
        let p = f.to_vec();
        for e in p.chunks(6) {
            let id = u16::from_be_bytes([e[0], e[1]]);
            let v = u32::from_be_bytes([e[2], e[3], e[4], e[5]]);
            match id {
                setting::HEADER_TABLE_SIZE => self.encoder.set_peer_table_size(v as usize),
                setting::ENABLE_PUSH if v > 1 => {
                    return Err(Fail::Conn(ErrorCode::Protocol, Reason::BadSetting))
                }
                setting::INITIAL_WINDOW_SIZE => {
                    let v = i64::from(v);
                    if v > frame::MAX_WINDOW {
                        return Err(Fail::Conn(ErrorCode::FlowControl, Reason::WindowOverflow));
                    }
                    let delta = v - self.peer_initial_window;
                    for s in self.streams.values_mut() {
                        s.send_window += delta;
                        if s.send_window > frame::MAX_WINDOW {
                            return Err(Fail::Conn(ErrorCode::FlowControl, Reason::WindowOverflow));
                        }
                    }
                    self.peer_initial_window = v;
                    self.requeue_all();
                }
                setting::MAX_FRAME_SIZE => {
                    if !(frame::DEFAULT_MAX_FRAME..=frame::MAX_MAX_FRAME).contains(&v) {
                        return Err(Fail::Conn(ErrorCode::Protocol, Reason::BadSetting));
                    }
                    self.peer_max_frame = v as usize;
                }
                _ => {}
            }
        }
        frame::put(&mut self.ctl, kind::SETTINGS, flag::ACK, 0, &[]);
        self.counters().settings.fetch_add(1, Ordering::Relaxed);
        self.send_data();
        Ok(())
    }

    fn on_window_update(&mut self, h: FrameHeader, f: IoVec) -> Result<(), Fail> {
        if h.len != 4 {
            return Err(Fail::Conn(ErrorCode::FrameSize, Reason::FrameSize));
        }
        let mut b = [0u8; 4];
        f.copy_to_slice(&mut b);
        let inc = i64::from(u32::from_be_bytes(b) & 0x7fff_ffff);
        if h.stream == 0 {
            if inc == 0 {
                return Err(Fail::Conn(ErrorCode::Protocol, Reason::ZeroWindowUpdate));
            }
            self.conn_send_window += inc;
            if self.conn_send_window > frame::MAX_WINDOW {
                return Err(Fail::Conn(ErrorCode::FlowControl, Reason::WindowOverflow));
            }
            self.send_data();
            return Ok(());
        }
        self.not_idle(h.stream)?;
        // A stream that has ended (a WINDOW_UPDATE in flight is normal after our
        // END_STREAM or RST_STREAM, a flood is not), at a cost.
        let Some(s) = self.streams.get_mut(&h.stream) else {
            return self.cost(1);
        };
        if s.reset {
            return self.cost(1);
        }
        if inc == 0 {
            return Err(Fail::Stream(
                h.stream,
                ErrorCode::Protocol,
                Reason::ZeroWindowUpdate,
            ));
        }
        s.send_window += inc;
        if s.send_window > frame::MAX_WINDOW {
            return Err(Fail::Stream(
                h.stream,
                ErrorCode::FlowControl,
                Reason::WindowOverflow,
            ));
        }
        if s.out.is_some() && !self.sending.contains(&h.stream) {
            self.sending.push_back(h.stream);
        }
        self.send_data();
        Ok(())
    }

    fn requeue_all(&mut self) {
        let mut ids: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| s.out.is_some())
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        for id in ids {
            if !self.sending.contains(&id) {
                self.sending.push_back(id);
            }
        }
    }

    /// Sends reply data while the windows allow, round robin over the streams.
    fn send_data(&mut self) {
        let mut rounds = self.sending.len();
        while rounds > 0 && self.conn_send_window > 0 {
            rounds -= 1;
            let Some(id) = self.sending.pop_front() else {
                break;
            };
            let max_frame = self.peer_max_frame;
            let Some(s) = self.streams.get_mut(&id) else {
                continue;
            };
            let Some(out) = s.out.as_mut() else {
                continue;
            };
            let mut finished = false;
            loop {
                if out.body.is_empty() {
                    if let Some(t) = out.trailers.take() {
                        let mut block = Vec::new();
                        self.encoder
                            .encode(t.iter().map(|(n, v)| (&n[..], &v[..])), &mut block);
                        frame::headers(&mut self.ctl, id, &block, true, max_frame);
                    }
                    finished = true;
                    break;
                }
                let room = s.send_window.min(self.conn_send_window);
                if room <= 0 {
                    break;
                }
                let n = out.body.len().min(room as usize).min(max_frame);
                let chunk = out.body.split_to(n);
                let end = out.body.is_empty() && out.trailers.is_none();
                let fh = FrameHeader {
                    len: n as u32,
                    kind: kind::DATA,
                    flags: if end { flag::END_STREAM } else { 0 },
                    stream: id,
                };
                self.ctl.extend_from_slice(&fh.bytes());
                self.tx.push(Zbuf::from_vec(std::mem::take(&mut self.ctl)));
                self.tx.append(chunk);
                self.held -= n;
                s.send_window -= n as i64;
                self.conn_send_window -= n as i64;
                if end {
                    finished = true;
                    break;
                }
            }
            if finished {
                s.out = None;
                self.finish_stream(id);
            } else if s.send_window > 0 || self.conn_send_window <= 0 {
                // Blocked by the connection window, or by nothing: keep its turn.
                self.sending.push_back(id);
            }
            // Blocked by its own window only: requeued by its WINDOW_UPDATE.
        }
    }

    /// Our side of `id` has ended.
    fn finish_stream(&mut self, id: u32) {
        self.counters().responses.fetch_add(1, Ordering::Relaxed);
        self.budget =
            (self.budget + i64::from(self.cfg.flood_refund)).min(i64::from(self.cfg.flood_budget));
        if let Some(s) = self.streams.get(&id) {
            if s.remote_done && !s.at_worker {
                self.remove_stream(id);
                self.history.set(self.last_stream, id, Ended::Done);
            } else if !s.remote_done {
                // Replied before the request ended: the rest of it is not wanted.
                self.counters().rst_sent[Reason::StreamClosed.index()]
                    .fetch_add(1, Ordering::Relaxed);
                frame::rst_stream(&mut self.ctl, id, ErrorCode::NoError);
                self.history.set(self.last_stream, id, Ended::ResetHere);
                self.close_stream(id);
            }
        }
    }

    /// Answers `id` from the session itself, in one HEADERS frame with END_STREAM: the
    /// headers, `content-length: 0` unless given or there are trailers, then the trailers
    /// (gRPC's Trailers-Only form). The body is ignored. Not flow controlled, so the stream
    /// ends at once (with a RST_STREAM NO_ERROR if the request has not ended). A request
    /// answered here made no progress for the application: it costs one unit of the flood
    /// budget and earns nothing back (else a stream of such requests would refill it).
    fn respond_now(&mut self, id: u32, resp: Response) -> Result<(), Fail> {
        let status = resp.status.to_string();
        let mut fields: Vec<(&[u8], &[u8])> = vec![(b":status", status.as_bytes())];
        fields.extend(resp.headers.iter().map(|(n, v)| (&n[..], &v[..])));
        let has_len = resp.headers.iter().any(|(n, _)| n == b"content-length");
        match &resp.trailers {
            Some(t) => fields.extend(t.iter().map(|(n, v)| (&n[..], &v[..]))),
            None if !has_len => fields.push((b"content-length", b"0")),
            None => {}
        }
        let mut block = Vec::new();
        self.encoder.encode(fields, &mut block);
        frame::headers(&mut self.ctl, id, &block, true, self.peer_max_frame);
        let budget = self.budget;
        self.finish_stream(id);
        self.budget = budget;
        self.cost(1)
    }

    /// `id`'s body is over `max_body` (`ended`: the DATA that showed it had END_STREAM):
    /// its bytes are dropped and it gets [`H2Config::too_large`].
    fn too_large(&mut self, id: u32, ended: bool) -> Result<(), Fail> {
        self.counters().too_large.fetch_add(1, Ordering::Relaxed);
        if let Some(s) = self.streams.get_mut(&id) {
            self.buffered -= s.body.len();
            self.streams_mem -= s.body.mem;
            s.body = Body::default();
            s.remote_done |= ended;
        }
        self.respond_now(id, self.cfg.too_large.clone())
    }

    fn respond(&mut self, id: u32, reply: Option<IoVec>) {
        let parsed = reply.map(|r| Response::parse(&r));
        let resp = match parsed {
            Some(Ok(r)) => r,
            _ => {
                let _ = self.reset(id, ErrorCode::Internal, Reason::BadReply);
                return;
            }
        };
        let mut fields: Vec<(&[u8], &[u8])> = Vec::with_capacity(resp.headers.len() + 2);
        let status = resp.status.to_string();
        fields.push((b":status", status.as_bytes()));
        let clen = resp.body.len().to_string();
        let has_len = resp.headers.iter().any(|(n, _)| n == b"content-length");
        for (n, v) in &resp.headers {
            fields.push((n, v));
        }
        if !has_len && resp.trailers.is_none() {
            fields.push((b"content-length", clen.as_bytes()));
        }
        let mut block = Vec::new();
        self.encoder.encode(fields, &mut block);
        // A HEAD response ends with its HEADERS: content-length says what a GET would
        // get, no DATA follows (RFC 9110 §9.3.2; clients reset a stream that has some).
        let head = self.streams.get(&id).is_some_and(|s| s.head);
        let end = head || (resp.body.is_empty() && resp.trailers.is_none());
        frame::headers(&mut self.ctl, id, &block, end, self.peer_max_frame);
        if end {
            self.finish_stream(id);
            return;
        }
        if let Some(s) = self.streams.get_mut(&id) {
            self.held += resp.body.len();
            s.out = Some(Out {
                body: resp.body,
                trailers: resp.trailers,
            });
            self.sending.push_back(id);
        }
        self.send_data();
    }
}

/// What the session keeps of a valid request's header list.
struct ReqInfo {
    /// `:method` HEAD.
    head: bool,
    /// `:method` CONNECT (well formed: `:authority` only).
    connect: bool,
    /// `content-length`.
    content_length: Option<u64>,
}

/// The bytes of an RFC 9110 token (§5.6.2), letters lower case only: a field name
/// (RFC 9113 §8.2: upper case is malformed; §8.2.1's minimum forbids 0x00-0x20, 0x41-0x5a,
/// 0x7f-0xff, and `:` outside a pseudo-header's first byte, all of which this excludes).
static NAME_BYTE: [bool; 256] = byte_table(true);
/// The bytes of a field value (RFC 9110 §5.5: VCHAR, obs-text, SP, HTAB): no NUL, CR or
/// LF (RFC 9113 §8.2.1's minimum) nor other control bytes.
static VALUE_BYTE: [bool; 256] = byte_table(false);

const fn byte_table(name: bool) -> [bool; 256] {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        t[i] = if name {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || matches!(
                    b,
                    b'!' | b'#'
                        | b'$'
                        | b'%'
                        | b'&'
                        | b'\''
                        | b'*'
                        | b'+'
                        | b'-'
                        | b'.'
                        | b'^'
                        | b'_'
                        | b'`'
                        | b'|'
                        | b'~'
                )
        } else {
            (b >= 0x20 && b != 0x7f) || b == b'\t'
        };
        i += 1;
    }
    t
}

/// A field value RFC 9113 §8.2.1 allows: valid bytes, no leading or trailing SP/HTAB.
fn valid_value(v: &[u8]) -> bool {
    let ws = |b: &u8| *b == b' ' || *b == b'\t';
    v.iter().all(|&b| VALUE_BYTE[b as usize])
        && !v.first().is_some_and(ws)
        && !v.last().is_some_and(ws)
}

/// A regular (not pseudo-header) field of a request or its trailers: a lower-case token
/// name, a valid value, not connection-specific (RFC 9113 §8.2.2: `te` only as
/// `trailers`).
fn valid_field(n: &[u8], v: &[u8]) -> bool {
    !n.is_empty()
        && n.iter().all(|&b| NAME_BYTE[b as usize])
        && valid_value(v)
        && !matches!(
            n,
            b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding" | b"upgrade"
        )
        && (n != b"te" || v == b"trailers")
}

/// `content-length`: 1*DIGIT (RFC 9110 §8.6), no overflow.
fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.iter().try_fold(0u64, |a, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        a.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// Whether authorities `a` and `b` (`host[:port]`) name the same entity under `scheme`
/// (RFC 3986 §6.2.2-6.2.3: host case-insensitive, the scheme's default port as good as
/// none).
fn same_authority(scheme: &[u8], a: &[u8], b: &[u8]) -> bool {
    let default: &[u8] = match scheme {
        b"http" => b":80",
        b"https" => b":443",
        _ => b"",
    };
    strip_port(a, default).eq_ignore_ascii_case(strip_port(b, default))
}

/// `x` without the suffix `port` (`:80`), if it has it and `port` is not empty.
fn strip_port<'a>(x: &'a [u8], port: &[u8]) -> &'a [u8] {
    match x.strip_suffix(port) {
        Some(h) if !port.is_empty() => h,
        _ => x,
    }
}

/// RFC 9113 §8.1-8.5 checks on a request's header list, one pass over the fields HPACK
/// decoded; `None` if malformed (a stream error PROTOCOL_ERROR):
/// - pseudo-headers (§8.3): only `:method`, `:scheme`, `:path`, `:authority` (no
///   `:status`, no `:protocol`: extended CONNECT is not advertised), each at most once,
///   all before the regular fields; `:method`, `:scheme` and a non-empty `:path` present,
///   `:authority` non-empty if present (§8.3.1); CONNECT with `:authority` and without
///   `:scheme` and `:path` (§8.5); `:method` a token;
/// - every field (§8.2): names lower-case tokens, values without control bytes (NUL, CR,
///   LF: §8.2.1) or leading/trailing whitespace; no connection-specific field (§8.2.2);
/// - `content-length` digits only, repeated only with the same value;
/// - a `host` field naming another authority than `:authority` (§8.3.1's SHOULD),
///   compared as RFC 3986 §6.2 normalises them: case-insensitively, a scheme's default
///   port the same as none.
fn check_request(fields: &[Field]) -> Option<ReqInfo> {
    let mut regular = false;
    let mut method: Option<&[u8]> = None;
    let (mut scheme, mut path, mut authority) = (false, false, false);
    let (mut scheme_v, mut authority_v, mut host): (&[u8], &[u8], Option<&[u8]>) = (b"", b"", None);
    let mut content_length = None;
    for (n, v) in fields {
        if n.first() == Some(&b':') {
            if regular || !valid_value(v) {
                return None;
            }
            let again = match &n[..] {
                b":method" => method.replace(v).is_some(),
                b":scheme" => {
                    scheme_v = v;
                    std::mem::replace(&mut scheme, true)
                }
                b":path" => std::mem::replace(&mut path, true) || v.is_empty(),
                b":authority" => {
                    authority_v = v;
                    std::mem::replace(&mut authority, true) || v.is_empty()
                }
                _ => true,
            };
            if again {
                return None;
            }
            continue;
        }
        regular = true;
        if !valid_field(n, v) {
            return None;
        }
        if &n[..] == b"content-length" {
            let l = parse_length(v)?;
            if content_length.replace(l).is_some_and(|o| o != l) {
                return None;
            }
        } else if &n[..] == b"host" && host.replace(v).is_some() {
            // Two Host fields (RFC 9110 §7.2: a request has at most one).
            return None;
        }
    }
    if let Some(h) = host.filter(|_| authority) {
        if !same_authority(scheme_v, authority_v, h) {
            return None;
        }
    }
    let method = method.filter(|m| {
        !m.is_empty() && m.iter().all(|b| NAME_BYTE[b.to_ascii_lowercase() as usize])
    })?;
    let connect = method == b"CONNECT";
    let ok = if connect {
        authority && !scheme && !path
    } else {
        scheme && path
    };
    ok.then_some(ReqInfo {
        head: method == b"HEAD",
        connect,
        content_length,
    })
}

impl Session for H2Session {
    fn push(&mut self, data: Zbuf) {
        if matches!(self.phase, Phase::Closing(_)) {
            return;
        }
        self.input.push(data);
        self.input_loose += 1;
        if self.input.num_segments() > SPILL_PIECES {
            // A frame in tiny segments would pin one receive buffer per segment until it
            // is whole: the framer's rule, at most SPILL_PIECES of them uncopied.
            merge_tail(&mut self.input, self.input_loose);
            self.input_loose = 0;
        }
        self.mark(Mark::Input, self.input.len());
        self.process();
        self.publish();
    }

    fn wants_input(&self) -> bool {
        !matches!(self.phase, Phase::Closing(_))
            && !self.stopped_for_mem
            && self.input.len() < self.cfg.max_input
            && self.out_len() < self.cfg.max_output
    }

    fn poll_request(&mut self) -> Option<SessionRequest> {
        while let Some(id) = self.ready.pop_front() {
            let Some(s) = self.streams.get_mut(&id) else {
                continue;
            };
            if s.reset || s.at_worker {
                continue;
            }
            s.at_worker = true;
            self.streams_mem -= s.body.mem + s.hmem;
            s.hmem = 0;
            let body = s.body.take();
            let headers = std::mem::take(&mut s.headers);
            self.buffered -= body.len();
            self.counters().requests.fetch_add(1, Ordering::Relaxed);
            let msg = Request::encode(id, &headers, body);
            self.return_credit();
            self.flush_ctl();
            return Some(SessionRequest {
                id: u64::from(id),
                body: msg,
            });
        }
        None
    }

    fn complete(&mut self, id: u64, reply: Option<IoVec>) {
        let Ok(id) = u32::try_from(id) else {
            return;
        };
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if !s.at_worker {
            return;
        }
        s.at_worker = false;
        if s.reset {
            self.remove_stream(id);
            self.counters()
                .replies_dropped
                .fetch_add(1, Ordering::Relaxed);
        } else if !matches!(self.phase, Phase::Closing(_)) {
            self.respond(id, reply);
        }
        self.flush_ctl();
        self.publish();
    }

    fn poll_transmit(&mut self) -> Option<IoVec> {
        if self.tx.is_empty() && self.ctl.is_empty() {
            // The output queue drained: process input that waited for it.
            self.process();
            self.publish();
        }
        self.flush_ctl();
        if self.tx.is_empty() {
            None
        } else {
            Some(std::mem::take(&mut self.tx))
        }
    }

    fn state(&self) -> SessionState {
        match self.phase {
            Phase::Closing(_) if self.timed_out => SessionState::Done,
            Phase::Closing(e) => SessionState::Closing(e),
            _ if self.peer_goaway && self.streams.is_empty() => SessionState::Done,
            _ => SessionState::Open,
        }
    }

    fn busy(&self) -> bool {
        !matches!(self.phase, Phase::Closing(_))
            && (!self.streams.is_empty() || self.out_len() > 0 || self.block.is_some())
    }

    fn timed_out(&mut self, timer: Timeout) {
        if matches!(self.phase, Phase::Closing(_)) {
            return;
        }
        let reason = match timer {
            Timeout::Idle => Reason::IdleTimeout,
            Timeout::Send => Reason::SendTimeout,
        };
        // GOAWAY is not flow controlled: it goes out even to a peer whose windows are
        // zero. Streams still open are abandoned with the connection (RFC 9113 §6.8:
        // NO_ERROR with last-stream-id tells the peer which ones were processed).
        self.goaway(ErrorCode::NoError, reason);
        self.timed_out = true;
        self.publish();
    }

    fn mem(&self) -> usize {
        self.mem_now()
    }

    fn set_mem(&mut self, limit: usize, credit: bool) {
        self.mem_limit = limit;
        let reopened = credit && !self.credit_open;
        self.credit_open = credit;
        if reopened && !matches!(self.phase, Phase::Closing(_)) {
            self.give_owed();
        }
    }

    fn mem_waits(&self) -> bool {
        if matches!(self.phase, Phase::Closing(_)) {
            return false;
        }
        self.stopped_for_mem
            || (!self.credit_open
                && (self.owed > 0
                    || (self.unreturned > 0 && self.buffered <= self.cfg.max_buffered)))
    }

    fn has_request(&self) -> bool {
        self.ready.iter().any(|id| {
            self.streams
                .get(id)
                .is_some_and(|s| !s.reset && !s.at_worker)
        })
    }

    fn lacks(&self) -> Option<usize> {
        if matches!(self.phase, Phase::Closing(_)) {
            return None;
        }
        self.streams
            .values()
            .filter(|s| !s.remote_done && !s.reset && !s.at_worker)
            .filter_map(|s| {
                let lack = usize::try_from(s.content_length?)
                    .ok()?
                    .checked_sub(s.body.len())?;
                // Sendable without more credit: maybe in TCP already.
                let l = i64::try_from(lack).ok()?;
                (l <= s.recv_window && l <= self.conn_recv_window).then_some(lack)
            })
            .min()
    }

    fn shed_size(&self) -> usize {
        match self.largest_partial() {
            Some((m, _)) => m,
            None => self.mem_now(),
        }
    }

    /// The largest partial request is refused: RST_STREAM REFUSED_STREAM (RFC 9113 §8.7:
    /// no processing happened, the client may retry it), not charged to the peer's flood
    /// budget (the pressure is ours). With no partial request holding memory (what the
    /// session holds is unprocessed input or a header block being assembled, which
    /// cannot be dropped alone: HPACK state depends on every block), GOAWAY
    /// ENHANCE_YOUR_CALM.
    fn shed(&mut self) -> bool {
        if matches!(self.phase, Phase::Closing(_)) {
            return true;
        }
        if let Some((_, id)) = self.largest_partial() {
            self.counters().rst_sent[Reason::MemoryPressure.index()]
                .fetch_add(1, Ordering::Relaxed);
            frame::rst_stream(&mut self.ctl, id, ErrorCode::RefusedStream);
            self.history.set(self.last_stream, id, Ended::ResetHere);
            self.close_stream(id);
            self.flush_ctl();
            self.publish();
            return false;
        }
        self.goaway(ErrorCode::EnhanceYourCalm, Reason::MemoryPressure);
        self.publish();
        true
    }
}

#[cfg(test)]
mod tests;
