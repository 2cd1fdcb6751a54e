//! HTTP/2 (RFC 9113) with HPACK (RFC 7541) as a msgsched [`Session`](super::Session).
//!
//! - [`hpack`]: header compression, bounded (HPACK bombs);
//! - [`frame`]: the frame layer;
//! - [`session`]: one connection's state machine on the I/O core: preface, SETTINGS,
//!   PING, WINDOW_UPDATE answered in place; flow control both ways; HEADERS +
//!   CONTINUATION assembly; DATA per stream until END_STREAM = one request message;
//!   RST_STREAM, GOAWAY with the RFC's error codes; MAX_CONCURRENT_STREAMS; the
//!   defences against the known HTTP/2 denial-of-service attacks, each counted;
//! - [`Request`] and [`Response`]: what a worker receives and sends (below).
//!
//! **The worker's side.** A request message is an [`IoVec`]: one head segment with the
//! decoded header list (the only bytes the I/O core materialised, HPACK decodes them
//! anyway), then the request body as slices of the received buffers (zero copy).
//! [`Request::parse`] reads it. A reply is built with [`Response`] and turned into an
//! [`IoVec`] the same way (head segment, then the body's zbufs, never copied); the
//! session on the I/O core encodes it (HPACK state is per connection, so encoding
//! happens in wire order) and sends it as HEADERS, DATA within the peer's flow-control
//! windows, and trailers where there are any (gRPC's status).

pub mod frame;
pub mod hpack;
pub mod session;

pub use session::{H2Config, H2Counters, H2Session, Mark, Reason};

use crate::parser::peek;
use hpack::Field;
use std::fmt;
use zbuf::{IoVec, Zbuf};

/// A request or reply message whose head does not parse (a bug on the other side of
/// the I/O core / worker boundary; counted, never a panic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadMessage(pub &'static str);

impl fmt::Display for BadMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "h2 message: {}", self.0)
    }
}

impl std::error::Error for BadMessage {}

fn put_fields(out: &mut Vec<u8>, fields: &[Field]) {
    out.extend_from_slice(&(fields.len() as u32).to_le_bytes());
    for (n, v) in fields {
        out.extend_from_slice(&(n.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(n);
        out.extend_from_slice(v);
    }
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], BadMessage> {
        if self.b.len() < n {
            return Err(BadMessage("truncated head"));
        }
        let (a, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, BadMessage> {
        let a = self.take(4)?;
        Ok(u32::from_le_bytes([a[0], a[1], a[2], a[3]]))
    }
    fn fields(&mut self) -> Result<Vec<Field>, BadMessage> {
        let n = self.u32()? as usize;
        let mut v = Vec::with_capacity(n.min(self.b.len() / 8));
        for _ in 0..n {
            let (nl, vl) = (self.u32()? as usize, self.u32()? as usize);
            let name = self.take(nl)?.to_vec();
            let value = self.take(vl)?.to_vec();
            v.push((name, value));
        }
        Ok(v)
    }
}

/// Reads the head segment of `msg`: `u32` head length, then the head bytes.
fn read_head(msg: &IoVec) -> Result<(Vec<u8>, IoVec), BadMessage> {
    let mut l = [0u8; 4];
    if !peek(msg, 0, &mut l) {
        return Err(BadMessage("no head length"));
    }
    let hl = u32::from_le_bytes(l) as usize;
    let end = hl.checked_add(4).filter(|&e| e <= msg.len());
    let end = end.ok_or(BadMessage("head longer than the message"))?;
    let mut head = vec![0u8; hl];
    if !peek(msg, 4, &mut head) {
        return Err(BadMessage("truncated head"));
    }
    Ok((head, msg.slice(end..)))
}

fn with_len(head: Vec<u8>) -> Zbuf {
    let mut v = Vec::with_capacity(4 + head.len());
    v.extend_from_slice(&(head.len() as u32).to_le_bytes());
    v.extend_from_slice(&head);
    Zbuf::from_vec(v)
}

/// An HTTP/2 request as a worker sees it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The stream id.
    pub stream: u32,
    /// The decoded header list, pseudo-headers first, in the order received.
    pub headers: Vec<Field>,
    /// The request body (zero copy: slices of the received DATA frames).
    pub body: IoVec,
}

impl Request {
    /// The message the session hands to a worker for `headers` and `body`.
    pub fn encode(stream: u32, headers: &[Field], body: IoVec) -> IoVec {
        let mut head = stream.to_le_bytes().to_vec();
        put_fields(&mut head, headers);
        let mut m = IoVec::from(with_len(head));
        m.append(body);
        m
    }

    /// Reads a request message.
    pub fn parse(msg: &IoVec) -> Result<Request, BadMessage> {
        let (head, body) = read_head(msg)?;
        let mut r = Reader { b: &head };
        let s = r.take(4)?;
        let stream = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        let headers = r.fields()?;
        Ok(Request {
            stream,
            headers,
            body,
        })
    }

    /// The first value of header `name` (pseudo-headers too, e.g. `:path`).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name.as_bytes())
            .map(|(_, v)| &v[..])
    }

    /// `:method`.
    pub fn method(&self) -> &[u8] {
        self.header(":method").unwrap_or_default()
    }

    /// `:path`.
    pub fn path(&self) -> &[u8] {
        self.header(":path").unwrap_or_default()
    }
}

/// An HTTP/2 reply, built by a worker.
#[derive(Debug, Clone, Default)]
pub struct Response {
    /// `:status`.
    pub status: u16,
    /// Header fields (lower-case names; `content-length` is added when absent and
    /// there are no trailers).
    pub headers: Vec<Field>,
    /// The body (zero copy: its zbufs go out in DATA frames as they are).
    pub body: IoVec,
    /// Trailers, sent as a last HEADERS frame with END_STREAM (gRPC's status).
    pub trailers: Option<Vec<Field>>,
}

impl Response {
    /// A reply with `status` and no headers or body.
    pub fn new(status: u16) -> Self {
        Response {
            status,
            ..Response::default()
        }
    }

    /// Adds a header field.
    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.headers
            .push((name.as_bytes().to_vec(), value.as_ref().to_vec()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: IoVec) -> Self {
        self.body = body;
        self
    }

    /// Sets the trailers.
    pub fn trailers(mut self, trailers: Vec<Field>) -> Self {
        self.trailers = Some(trailers);
        self
    }

    /// The reply message for [`MsgSocket::reply`](crate::socket::MsgSocket::reply).
    pub fn into_iovec(self) -> IoVec {
        let mut head = self.status.to_le_bytes().to_vec();
        put_fields(&mut head, &self.headers);
        match &self.trailers {
            Some(t) => {
                head.push(1);
                put_fields(&mut head, t);
            }
            None => head.push(0),
        }
        let mut m = IoVec::from(with_len(head));
        m.append(self.body);
        m
    }

    /// Reads a reply message (the session's side).
    pub fn parse(msg: &IoVec) -> Result<Response, BadMessage> {
        let (head, body) = read_head(msg)?;
        let mut r = Reader { b: &head };
        let s = r.take(2)?;
        let status = u16::from_le_bytes([s[0], s[1]]);
        if !(100..=999).contains(&status) {
            return Err(BadMessage("status outside 100..=999"));
        }
        let headers = r.fields()?;
        let trailers = match r.take(1)?[0] {
            0 => None,
            1 => Some(r.fields()?),
            _ => return Err(BadMessage("bad trailers flag")),
        };
        Ok(Response {
            status,
            headers,
            body,
            trailers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_and_response_messages_round_trip_without_copying_the_body() {
        let body = Zbuf::copy_from_slice(b"hello world");
        let hs = vec![(b":path".to_vec(), b"/x".to_vec())];
        let m = Request::encode(5, &hs, IoVec::from(body.clone()));
        let r = Request::parse(&m).unwrap();
        assert_eq!((r.stream, r.path()), (5, &b"/x"[..]));
        assert!(r.body.segments()[0].same_object(&body));
        let resp = Response::new(200)
            .header("x", "y")
            .body(IoVec::from(body.clone()))
            .trailers(vec![(b"grpc-status".to_vec(), b"0".to_vec())]);
        let p = Response::parse(&resp.into_iovec()).unwrap();
        assert_eq!(p.status, 200);
        assert_eq!(p.headers, vec![(b"x".to_vec(), b"y".to_vec())]);
        assert_eq!(p.trailers.unwrap()[0].1, b"0");
        assert!(p.body.segments()[0].same_object(&body));
    }

    #[test]
    fn bad_heads_are_errors() {
        for bad in [&b""[..], &[9, 0, 0, 0, 1], &[0xff, 0xff, 0xff, 0xff]] {
            let m = IoVec::from(Zbuf::copy_from_slice(bad));
            assert!(Response::parse(&m).is_err());
            assert!(Request::parse(&m).is_err());
        }
        let m = Response::new(42).into_iovec();
        assert!(Response::parse(&m).is_err());
        // A field count far above what the head holds.
        let mut h = 200u16.to_le_bytes().to_vec();
        h.extend_from_slice(&u32::MAX.to_le_bytes());
        let m = IoVec::from(with_len(h));
        assert!(Response::parse(&m).is_err());
    }
}
