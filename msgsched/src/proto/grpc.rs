//! gRPC over the HTTP/2 session (the gRPC-over-HTTP/2 wire protocol): the worker's side.
//!
//! A gRPC call arrives as one HTTP/2 request message ([`Request`]): `:method POST`,
//! `content-type: application/grpc[+proto|...]`, `:path /Service/Method`, and a body of
//! length-prefixed messages (1 byte compressed flag, 4 bytes big-endian length, the
//! message). The session assembled the body from however many DATA frames the client
//! used, so message boundaries have nothing to do with DATA boundaries; [`messages`] cuts
//! the body into messages as slices of it (zero copy). Replies are HEADERS (`:status 200`,
//! `content-type: application/grpc`), DATA with the length-prefixed reply, and trailers
//! with `grpc-status` and `grpc-message` ([`reply`], [`error`]).
//!
//! Size: [`limit_messages`] makes the HTTP/2 session itself answer a call whose body is
//! over the message limit with RESOURCE_EXHAUSTED, as gRPC servers do, without buffering
//! it or waking a worker.
//!
//! Compression: a request message with the compressed flag under `grpc-encoding: gzip`
//! is decompressed ([`gunzip`], bounded by the message limit); any other encoding is
//! UNIMPLEMENTED, and replies advertise `grpc-accept-encoding: identity,gzip`. Replies
//! are sent uncompressed (identity), which gRPC allows whatever the request used.

use crate::parser::peek;
use crate::proto::h2::{H2Config, Request, Response};
use std::fmt;
use zbuf::{IoVec, Zbuf};

/// gRPC status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    /// OK.
    Ok = 0,
    /// CANCELLED.
    Cancelled = 1,
    /// UNKNOWN.
    Unknown = 2,
    /// INVALID_ARGUMENT.
    InvalidArgument = 3,
    /// DEADLINE_EXCEEDED.
    DeadlineExceeded = 4,
    /// NOT_FOUND.
    NotFound = 5,
    /// ALREADY_EXISTS.
    AlreadyExists = 6,
    /// PERMISSION_DENIED.
    PermissionDenied = 7,
    /// RESOURCE_EXHAUSTED.
    ResourceExhausted = 8,
    /// FAILED_PRECONDITION.
    FailedPrecondition = 9,
    /// ABORTED.
    Aborted = 10,
    /// OUT_OF_RANGE.
    OutOfRange = 11,
    /// UNIMPLEMENTED.
    Unimplemented = 12,
    /// INTERNAL.
    Internal = 13,
    /// UNAVAILABLE.
    Unavailable = 14,
    /// DATA_LOSS.
    DataLoss = 15,
    /// UNAUTHENTICATED.
    Unauthenticated = 16,
}

/// A gRPC error: a status code and a message for `grpc-message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The code.
    pub code: Code,
    /// The message (percent-encoded on the wire).
    pub message: String,
}

impl Status {
    /// A status with `code` and `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Status {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "grpc {:?}: {}", self.code, self.message)
    }
}

impl std::error::Error for Status {}

/// One length-prefixed message.
#[derive(Debug, Clone)]
pub struct GrpcMessage {
    /// The compressed flag.
    pub compressed: bool,
    /// The message bytes (a slice of the request body).
    pub data: IoVec,
}

/// A checked unary call: its method path and its one request message.
#[derive(Debug, Clone)]
pub struct Call {
    /// `:path`, e.g. `/luna.Kv/Get`.
    pub method: Vec<u8>,
    /// The request message (uncompressed: zero copy, else decompressed).
    pub message: IoVec,
    /// Whether it arrived compressed (`grpc-encoding: gzip`).
    pub compressed: bool,
}

/// Cuts `body` into length-prefixed messages, each at most `max` bytes.
pub fn messages(body: &IoVec, max: usize) -> Result<Vec<GrpcMessage>, Status> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let mut h = [0u8; 5];
        if !peek(body, at, &mut h) {
            return Err(Status::new(Code::Internal, "truncated message prefix"));
        }
        let compressed = match h[0] {
            0 => false,
            1 => true,
            _ => return Err(Status::new(Code::Internal, "bad compressed flag")),
        };
        let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
        if len > max {
            return Err(Status::new(
                Code::ResourceExhausted,
                format!("message of {len} bytes above the limit of {max}"),
            ));
        }
        let start = at + 5;
        let end = start
            .checked_add(len)
            .filter(|&e| e <= body.len())
            .ok_or_else(|| Status::new(Code::Internal, "truncated message"))?;
        out.push(GrpcMessage {
            compressed,
            data: body.slice(start..end),
        });
        at = end;
    }
    Ok(out)
}

/// Why a request is not a call this server runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not gRPC at all (its content-type): answered at the HTTP level, 415.
    NotGrpc,
    /// A gRPC error.
    Status(Status),
}

impl Refusal {
    /// The reply for this refusal.
    pub fn response(&self) -> Response {
        match self {
            Refusal::NotGrpc => Response::new(415).header("content-type", "text/plain"),
            Refusal::Status(s) => error(s),
        }
    }
}

/// Checks a request as a unary gRPC call.
pub fn unary(req: &Request, max: usize) -> Result<Call, Refusal> {
    let ct = req.header("content-type").unwrap_or_default();
    if !ct.starts_with(b"application/grpc") {
        return Err(Refusal::NotGrpc);
    }
    let refuse = |code, m: String| Err(Refusal::Status(Status::new(code, m)));
    if req.method() != b"POST" {
        return refuse(Code::Unimplemented, "gRPC needs POST".into());
    }
    let encoding = req.header("grpc-encoding").unwrap_or(b"identity");
    let mut ms = messages(&req.body, max).map_err(Refusal::Status)?;
    if ms.len() != 1 {
        let m = format!("unary call with {} request messages", ms.len());
        return refuse(Code::Unimplemented, m);
    }
    let m = ms.remove(0);
    let message = if !m.compressed {
        m.data
    } else {
        match encoding {
            b"gzip" => gunzip(&m.data, max).map_err(Refusal::Status)?,
            // The flag says compressed, the header says not: a protocol violation.
            b"identity" => {
                return refuse(
                    Code::Internal,
                    "compressed flag without grpc-encoding".into(),
                )
            }
            other => {
                let what = String::from_utf8_lossy(other).into_owned();
                return refuse(
                    Code::Unimplemented,
                    format!("grpc-encoding {what} not supported (accepted: {ACCEPT_ENCODING})"),
                );
            }
        }
    };
    Ok(Call {
        method: req.path().to_vec(),
        message,
        compressed: m.compressed,
    })
}

/// The message encodings this server decodes (sent as `grpc-accept-encoding`).
pub const ACCEPT_ENCODING: &str = "identity,gzip";

/// Decompresses a gzip message (`grpc-encoding: gzip`) into a new buffer of at most
/// `max` bytes: the one copy of this module (the compressed bytes are gathered once, the
/// output is new), bounded so a decompression bomb costs at most `max` + one read buffer
/// (RESOURCE_EXHAUSTED past it); corrupt data is INTERNAL (gRPC's rule for a message
/// that cannot be decompressed). flate2 (miniz_oxide backend, pure Rust).
pub fn gunzip(data: &IoVec, max: usize) -> Result<IoVec, Status> {
    use std::io::Read;
    let input = data.to_vec();
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(&input[..])
        .take(max as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| Status::new(Code::Internal, format!("bad gzip message: {e}")))?;
    if out.len() > max {
        return Err(Status::new(
            Code::ResourceExhausted,
            format!("decompressed message above the limit of {max}"),
        ));
    }
    Ok(IoVec::from(Zbuf::from_vec(out)))
}

/// Percent-encodes `grpc-message` (gRPC's rule: bytes outside 0x20..=0x7e and `%`).
pub fn percent_encode(s: &str) -> Vec<u8> {
    let mut o = Vec::with_capacity(s.len());
    for &b in s.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            o.push(b);
        } else {
            o.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    o
}

fn trailers(code: Code, message: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut t = vec![(
        b"grpc-status".to_vec(),
        (code as u8).to_string().into_bytes(),
    )];
    if !message.is_empty() {
        t.push((b"grpc-message".to_vec(), percent_encode(message)));
    }
    t
}

/// A successful unary reply carrying `message` (its zbufs follow a 5-byte prefix).
pub fn reply(message: IoVec) -> Response {
    let mut prefix = vec![0u8];
    prefix.extend_from_slice(&(message.len() as u32).to_be_bytes());
    let mut body = IoVec::from(Zbuf::from_vec(prefix));
    body.append(message);
    Response::new(200)
        .header("content-type", "application/grpc")
        .header("grpc-accept-encoding", ACCEPT_ENCODING)
        .body(body)
        .trailers(trailers(Code::Ok, ""))
}

/// Sets up `cfg` for unary calls whose request message is at most `max_message` bytes:
/// the session takes a body of at most the message and its 5-byte prefix (`max_body`),
/// and answers a longer one itself with [`too_large`] (`H2Config::too_large`), as soon
/// as its DATA pass the limit, and a RST_STREAM NO_ERROR to stop the upload. That is
/// what grpc-go and grpc-java servers answer a message over their receive limit
/// (RESOURCE_EXHAUSTED in a Trailers-Only response). Before, a body over the session's
/// default 1 MiB got RST_STREAM REFUSED_STREAM, which clients report as UNAVAILABLE and
/// retry policies resend. A body of several messages adding up to more than one is
/// RESOURCE_EXHAUSTED too (unary calls take one message).
pub fn limit_messages(cfg: &mut H2Config, max_message: usize) {
    cfg.max_body = max_message.saturating_add(5);
    cfg.too_large = too_large(max_message);
}

/// The reply to a call whose request message is over `max_message` bytes:
/// RESOURCE_EXHAUSTED with a `grpc-message`.
pub fn too_large(max_message: usize) -> Response {
    error(&Status::new(
        Code::ResourceExhausted,
        format!("grpc: received message larger than max ({max_message} bytes)"),
    ))
}

/// An error reply: HEADERS, then the trailers with the status (no message).
pub fn error(status: &Status) -> Response {
    Response::new(200)
        .header("content-type", "application/grpc")
        .header("grpc-accept-encoding", ACCEPT_ENCODING)
        .trailers(trailers(status.code, &status.message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lpm(data: &[u8]) -> Vec<u8> {
        let mut v = vec![0];
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn messages_are_found_whatever_the_data_frame_boundaries() {
        let wire = [lpm(b"hello"), lpm(b""), lpm(&[7u8; 300])].concat();
        for cut in 1..wire.len() {
            let body: IoVec = [&wire[..cut], &wire[cut..]]
                .iter()
                .map(|p| Zbuf::copy_from_slice(p))
                .collect();
            let ms = messages(&body, 1000).unwrap();
            assert_eq!(ms.len(), 3, "cut {cut}");
            assert_eq!(ms[0].data.to_vec(), b"hello");
            assert!(ms[1].data.is_empty());
            assert_eq!(ms[2].data.to_vec(), vec![7u8; 300]);
        }
    }

    #[test]
    fn bad_prefixes_map_to_status_codes() {
        let one = |b: &[u8]| messages(&IoVec::from(Zbuf::copy_from_slice(b)), 100);
        assert_eq!(one(&[0, 0, 0]).unwrap_err().code, Code::Internal);
        assert_eq!(one(&[0, 0, 0, 0, 9, 1]).unwrap_err().code, Code::Internal);
        assert_eq!(one(&[2, 0, 0, 0, 0]).unwrap_err().code, Code::Internal);
        assert_eq!(
            one(&[0, 0xff, 0xff, 0xff, 0xff]).unwrap_err().code,
            Code::ResourceExhausted
        );
    }

    fn request(headers: &[(&str, &str)], body: &[u8]) -> Request {
        let hs: Vec<_> = headers
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        let m = Request::encode(1, &hs, IoVec::from(Zbuf::copy_from_slice(body)));
        Request::parse(&m).unwrap()
    }

    const GRPC: [(&str, &str); 3] = [
        (":method", "POST"),
        (":path", "/luna.Echo/Echo"),
        ("content-type", "application/grpc"),
    ];

    #[test]
    fn unary_calls_are_checked() {
        let c = unary(&request(&GRPC, &lpm(b"x")), 100).unwrap();
        assert_eq!(
            (&c.method[..], c.message.to_vec()),
            (&b"/luna.Echo/Echo"[..], b"x".to_vec())
        );
        let two = [lpm(b"a"), lpm(b"b")].concat();
        let code = |r: Refusal| match r {
            Refusal::Status(s) => s.code,
            Refusal::NotGrpc => panic!("not a status"),
        };
        let e = unary(&request(&GRPC, &two), 100).unwrap_err();
        assert_eq!(code(e), Code::Unimplemented);
        let mut z = lpm(b"a");
        z[0] = 1;
        // Compressed flag, no grpc-encoding: INTERNAL; an unknown one: UNIMPLEMENTED.
        let e = unary(&request(&GRPC, &z), 100).unwrap_err();
        assert_eq!(code(e), Code::Internal);
        let mut br = GRPC.to_vec();
        br.push(("grpc-encoding", "br"));
        let e = unary(&request(&br, &z), 100).unwrap_err();
        assert_eq!(code(e), Code::Unimplemented);
        let not = [
            (":method", "POST"),
            (":path", "/x"),
            ("content-type", "text/plain"),
        ];
        let r = unary(&request(&not, b""), 100).unwrap_err();
        assert_eq!(r, Refusal::NotGrpc);
        assert_eq!(r.response().status, 415);
    }

    fn gz(data: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn gzip_messages_are_decoded_within_the_limit() {
        let mut hs = GRPC.to_vec();
        hs.push(("grpc-encoding", "gzip"));
        let plain: Vec<u8> = (0..5000u32).map(|i| (i % 7) as u8).collect();
        let mut m = lpm(&gz(&plain));
        m[0] = 1;
        let c = unary(&request(&hs, &m), 10_000).unwrap();
        assert_eq!(c.message.to_vec(), plain);
        assert!(c.compressed);
        // A bomb: 1 MB of zeros compresses to about 1 KB; the limit holds.
        let mut bomb = lpm(&gz(&vec![0u8; 1 << 20]));
        bomb[0] = 1;
        assert!(bomb.len() < 4096);
        match unary(&request(&hs, &bomb), 10_000) {
            Err(Refusal::Status(s)) => assert_eq!(s.code, Code::ResourceExhausted),
            other => panic!("{other:?}"),
        }
        // Not gzip at all: INTERNAL.
        let mut junk = lpm(b"not gzip");
        junk[0] = 1;
        match unary(&request(&hs, &junk), 10_000) {
            Err(Refusal::Status(s)) => assert_eq!(s.code, Code::Internal),
            other => panic!("{other:?}"),
        }
        // An uncompressed message under grpc-encoding gzip is fine (the flag decides).
        let c = unary(&request(&hs, &lpm(b"raw")), 100).unwrap();
        assert_eq!(c.message.to_vec(), b"raw");
    }

    #[test]
    fn replies_carry_status_trailers() {
        let r = reply(IoVec::from(Zbuf::copy_from_slice(b"ok")));
        assert_eq!(r.body.to_vec(), lpm(b"ok"));
        assert_eq!(
            r.trailers.as_ref().unwrap()[0],
            (b"grpc-status".to_vec(), b"0".to_vec())
        );
        let e = error(&Status::new(Code::NotFound, "no key 100%\n"));
        let t = e.trailers.unwrap();
        assert_eq!(t[0].1, b"5");
        assert_eq!(t[1].1, b"no key 100%25%0A");
        assert!(e.body.is_empty());
    }
}
