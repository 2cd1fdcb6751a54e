//! One connection's receive side: bytes in, whole messages out (sans-IO).
//!
//! The I/O core pushes the connection's received [`Zbuf`]s in order and takes messages
//! while [`Framer::next_message`] yields them. Each message is a slice of the received buffers
//! (zero copy) with its per-connection sequence number, which the reply path uses to put
//! ordered replies back in request order ([`crate::reply::Sequencer`]).
//!
//! Bounds (so one connection cannot make the I/O core buffer without limit, KCM's
//! SO_RCVBUF rule): a message larger than `max_message`, or `max_message` bytes buffered
//! with no message boundary found, is a [`ParseErrorKind::TooLarge`] error; at most
//! `max_in_flight` messages of a connection are out at workers at once — past that,
//! `next_message` yields nothing until a reply completes, and [`Framer::wants_input`] turns false
//! once a message's worth is buffered, so the rest waits in TCP's receive buffer and the
//! window closes (back pressure, never loss).
//!
//! Receive memory: a message is handed over as slices of the received buffers (zero copy)
//! — the NIC's receive buffers on a DPDK port, one per TCP segment. A message longer than
//! [`SPILL_MIN`] that has not fully arrived would pin one of those per segment until its
//! last byte came (a 1 MiB memcached `set` pins about 720 of them; ten such half-sent
//! values took all of a server's 8,191 and it received nothing more, its peers' FINs
//! included: found by an outside test on 2026-12-07). Such a message is instead copied,
//! as its length becomes known and then as its bytes arrive, into heap chunks of at most
//! [`SPILL_CHUNK`] allocated as the bytes come (so what the framer holds grows with what
//! was received, not with what the header announced), and each received buffer is
//! released as soon as it was copied ([`Framer::spilled`]).
//! Bytes are not the only measure: a peer sending tiny segments makes even a short
//! message pin one buffer per segment (a 16 KiB message in 1-byte segments, 16,384). So
//! the framer never holds more than [`SPILL_PIECES`] received buffers it has not copied:
//! past that, an unfinished message whose length is known is copied out as above, and
//! anything else (a message whose length the parser does not know yet, or whole
//! messages waiting for the in-flight cap) has its newest buffers merged into one heap
//! buffer, which also absorbs earlier merged buffers no longer than itself (so a byte is
//! copied again only into a buffer at least twice as long: O(log n) copies per byte; the
//! merged buffers left are strictly longer than the next, at most √(2n) of n bytes, a
//! few in practice). Messages up to [`SPILL_MIN`] that arrive in at most
//! [`SPILL_PIECES`] buffers stay zero copy: full-sized segments (1,448 bytes) carry
//! SPILL_MIN in 12, knb's 4 KiB RPCs in 3. (What TCP's receive queue holds before the
//! framer reads it is bounded per connection by luna-stack, by the memory behind it.)
//!
//! What a framer holds is measured in the stack's truesize ([`Framer::mem`], [`truesize`]:
//! each buffer's whole object plus [`BUF_OVERHEAD`]), so that the I/O core can bound what
//! all its connections hold together ([`FramerConfig::mem_budget`], enforced by
//! [`crate::socket::MsgIo`]: back pressure first, the largest holder shut down when
//! nothing else can free memory).
//!
//! Exclusive messages ([`Parser::exclusive`]): a message the parser says must run alone
//! is held here until every earlier message of the connection has completed, and no
//! later message is taken until it has. So a protocol whose requests act on shared state
//! in request order (memcached: a `get` pipelined behind its `set` must see the value)
//! keeps that order under any scheduling model, MS included (which spreads one
//! connection's messages over workers); messages that are not exclusive (memcached's
//! reads) still run side by side.

use crate::parser::{Ordering, ParseError, ParseErrorKind, Parser};
use core::fmt;
use zbuf::{IoVec, Zbuf};

/// Messages longer than this are copied out of the received buffers while they arrive
/// (module docs): up to it, a partial message pins at most a dozen receive buffers.
pub const SPILL_MIN: usize = 16 << 10;

/// Most received buffers the framer holds uncopied (module docs). 16: a message of up to
/// [`SPILL_MIN`] in full-sized segments (12 of them) stays zero copy with room to spare
/// for the next message's first pieces, and a connection pins at most 16 of a server's
/// receive buffers here (8,191 of them: 500 connections before the pool runs dry,
/// rather than one). Fewer would copy ordinary pipelined RPCs; more would buy nothing
/// but pinned buffers.
pub const SPILL_PIECES: usize = 16;

/// Largest heap chunk a spilled message is copied into: a chunk is allocated only when
/// the bytes to fill it arrive, so a header announcing 1 MiB costs what was sent, and a
/// 1 MiB message comes out in 16 chunks. Larger would hold more heap per announced but
/// unsent message; smaller, more segments per message.
pub const SPILL_CHUNK: usize = 64 << 10;

/// What holding a buffer costs besides its object: its metadata and queue entry. The same
/// as luna-stack's `tcp::SEG_OVERHEAD` (r2c checks they agree), so that the message
/// layer's budget and the stack's `rcv_mem_total` are in one unit, Linux's truesize.
pub const BUF_OVERHEAD: usize = 128;

/// Default [`FramerConfig::mem_budget`]: a quarter of r2c's default DPDK receive pool
/// (8,191 buffers of 2 KiB, at 2,048 + [`BUF_OVERHEAD`] bytes each), about 4.25 MiB. The
/// stack's default `rcv_mem_total` is half of that pool; the other quarter is left to
/// the rx rings, ARP, ACKs and FINs.
pub const DEFAULT_MEM_BUDGET: usize = 8191 * (2048 + BUF_OVERHEAD) / 4;

/// Memory behind `v` in truesize: each segment's whole object ([`Zbuf::object_size`]: a
/// 1-byte slice of a 2 KiB receive buffer holds all 2 KiB) plus [`BUF_OVERHEAD`].
pub fn truesize(v: &IoVec) -> usize {
    cost(v.segments())
}

fn cost(segs: &[Zbuf]) -> usize {
    segs.iter().map(|z| z.object_size() + BUF_OVERHEAD).sum()
}

/// Copies the last `loose` segments of `buf` (received buffers), and the segments before
/// them no longer than what is merged so far, into one heap buffer that replaces them
/// (module docs: a byte is copied again only into a buffer at least twice as long).
/// Returns the bytes copied. Shared by the framer and the HTTP/2 session's input.
pub(crate) fn merge_tail(buf: &mut IoVec, loose: usize) -> usize {
    let segs = buf.segments();
    let mut k = segs.len() - loose.min(segs.len());
    let mut merged: usize = segs[k..].iter().map(Zbuf::len).sum();
    while k > 0 && segs[k - 1].len() <= merged {
        k -= 1;
        merged += segs[k].len();
    }
    let tail = buf.split_off(buf.len() - merged);
    // `IoVec::to_vec` is zbuf's counted copy.
    let bytes = tail.to_vec();
    let n = bytes.len();
    buf.push(Zbuf::from_vec(bytes));
    n
}

/// Per-connection bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FramerConfig {
    /// Largest message, in bytes, headers included.
    pub max_message: usize,
    /// Most messages of one connection at workers (or waiting for their reply's turn).
    pub max_in_flight: usize,
    /// Bytes, in truesize ([`truesize`]), that all the connections of one I/O side
    /// ([`crate::socket::MsgIo`]) may hold together before their messages go to workers:
    /// received buffers not yet framed, spilled and merged heap buffers, messages held
    /// for their turn. Not per connection: one budget per `MsgIo`. Below
    /// `max_message` a message of that size can only complete alone.
    pub mem_budget: usize,
}

impl Default for FramerConfig {
    fn default() -> Self {
        FramerConfig {
            max_message: (1 << 20) + 64,
            max_in_flight: 64,
            mem_budget: DEFAULT_MEM_BUDGET,
        }
    }
}

/// A [`FramerConfig`] that cannot work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FramerConfigError {
    /// `max_message` is 0.
    MaxMessage,
    /// `max_in_flight` is 0 or above 65,536.
    MaxInFlight,
    /// `mem_budget` is 0.
    MemBudget,
}

impl fmt::Display for FramerConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FramerConfigError::MaxMessage => f.write_str("max_message must be at least 1 byte"),
            FramerConfigError::MaxInFlight => f.write_str("max_in_flight must be in 1..=65536"),
            FramerConfigError::MemBudget => f.write_str("mem_budget must be at least 1 byte"),
        }
    }
}

impl std::error::Error for FramerConfigError {}

impl FramerConfig {
    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), FramerConfigError> {
        if self.max_message == 0 {
            return Err(FramerConfigError::MaxMessage);
        }
        if self.max_in_flight == 0 || self.max_in_flight > 1 << 16 {
            return Err(FramerConfigError::MaxInFlight);
        }
        if self.mem_budget == 0 {
            return Err(FramerConfigError::MemBudget);
        }
        Ok(())
    }
}

/// A whole message taken from a connection.
#[derive(Debug, Clone)]
pub struct Framed {
    /// Position of the message in its connection (0, 1, 2, ...).
    pub seq: u64,
    /// The parser's stream or request id, where the protocol has one.
    pub stream: Option<u64>,
    /// The message bytes (zero copy).
    pub body: IoVec,
}

/// One connection's framing state.
pub struct Framer<P> {
    parser: P,
    cfg: FramerConfig,
    buf: IoVec,
    /// Length of the message at the head, once the parser has told it.
    want: usize,
    next_seq: u64,
    in_flight: usize,
    /// An exclusive message framed while others were in flight: taken once they are done.
    held: Option<Framed>,
    /// The last message taken was exclusive (nothing else is taken while it is in flight).
    exclusive_out: bool,
    failed: Option<ParseError>,
    /// What the parser asked to write before the connection closes on `failed`.
    farewell: Option<Zbuf>,
    /// The head message (of `want` bytes, above [`SPILL_MIN`] or past [`SPILL_PIECES`]
    /// received buffers) being copied out of the received buffers as it arrives; `buf` is
    /// empty meanwhile.
    spill: Option<Spill>,
    /// Bytes copied into spills and merged buffers.
    spilled: u64,
    /// At least the number of received buffers (never copied) at the end of `buf`: the
    /// buffers pushed since the last copy; before them `buf` holds only heap buffers the
    /// framer made.
    loose: usize,
    /// [`Framer::mem`]: kept as buffers come and go on the fast path (a push adds one,
    /// a message taken removes its whole ones), recounted on the slow ones.
    mem: usize,
}

/// A message being copied out of the received buffers, in heap chunks of at most
/// [`SPILL_CHUNK`] allocated as its bytes arrive. Shared with the HTTP/2 session's
/// request bodies (`proto::h2`).
#[derive(Default)]
pub(crate) struct Spill {
    /// Full chunks.
    done: IoVec,
    /// The chunk being filled (allocated at its full capacity).
    cur: Vec<u8>,
}

impl Spill {
    pub(crate) fn len(&self) -> usize {
        self.done.len() + self.cur.len()
    }

    /// Appends `bytes` of a message of `want` bytes when known (never more than it
    /// lacks): each chunk is at most [`SPILL_CHUNK`] and what the message still lacks.
    /// Unknown (or exceeded) length: a first chunk of twice [`SPILL_MIN`], then full ones.
    pub(crate) fn extend(&mut self, mut bytes: &[u8], want: Option<usize>) {
        while !bytes.is_empty() {
            if self.cur.len() == self.cur.capacity() {
                let full = std::mem::take(&mut self.cur);
                if !full.is_empty() {
                    self.done.push(Zbuf::from_vec(full));
                }
                let have = self.done.len();
                let cap = match want {
                    Some(w) if w > have => SPILL_CHUNK.min(w - have),
                    _ if have == 0 => 2 * SPILL_MIN,
                    _ => SPILL_CHUNK,
                };
                self.cur = Vec::with_capacity(cap);
            }
            let k = (self.cur.capacity() - self.cur.len()).min(bytes.len());
            self.cur.extend_from_slice(&bytes[..k]);
            bytes = &bytes[k..];
        }
    }

    /// Truesize: the chunks, the one being filled at its capacity.
    pub(crate) fn mem(&self) -> usize {
        let cur = match self.cur.capacity() {
            0 => 0,
            c => c + BUF_OVERHEAD,
        };
        truesize(&self.done) + cur
    }

    /// The whole message.
    pub(crate) fn finish(mut self) -> IoVec {
        if !self.cur.is_empty() {
            self.done.push(Zbuf::from_vec(self.cur));
        }
        self.done
    }
}

impl<P: Parser> Framer<P> {
    /// A framer for a new connection.
    pub fn new(parser: P, cfg: FramerConfig) -> Result<Self, FramerConfigError> {
        cfg.validate()?;
        Ok(Framer {
            parser,
            cfg,
            buf: IoVec::new(),
            want: 0,
            next_seq: 0,
            in_flight: 0,
            held: None,
            exclusive_out: false,
            failed: None,
            farewell: None,
            spill: None,
            spilled: 0,
            loose: 0,
            mem: 0,
        })
    }

    /// Received bytes, in stream order. While the head message is being copied out
    /// (module docs), its bytes are copied and `data` is released at once (what follows
    /// the message is kept zero copy).
    pub fn push(&mut self, data: Zbuf) {
        if self.failed.is_some() {
            return;
        }
        let Some(sp) = &mut self.spill else {
            let segs = self.buf.num_segments();
            let cost = data.object_size() + BUF_OVERHEAD;
            self.buf.push(data);
            // A slice that continues the last one in its object joins it: counted once.
            if self.buf.num_segments() > segs {
                self.mem += cost;
            }
            self.loose += 1;
            if self.loose > SPILL_PIECES {
                self.copy_out();
            }
            return;
        };
        let k = (self.want - sp.len()).min(data.len());
        sp.extend(&data[..k], Some(self.want));
        self.spilled += k as u64;
        if sp.len() == self.want {
            let mut b = self.spill.take().expect("spilling").finish();
            if k < data.len() {
                b.push(data.slice(k..));
                self.loose = 1;
            }
            self.buf = b;
        }
        self.mem = self.recount();
    }

    /// More than [`SPILL_PIECES`] received buffers are held: copy them out (module docs).
    fn copy_out(&mut self) {
        if self.want > 0 && self.buf.len() < self.want {
            // The head message's length is known and `buf` holds only its beginning.
            self.start_spill();
            return;
        }
        self.spilled += merge_tail(&mut self.buf, self.loose) as u64;
        self.loose = 0;
        self.mem = self.recount();
    }

    /// Starts copying the head message (of `want` bytes, not all arrived) into heap
    /// chunks: what arrived now, the rest as it comes (`push`).
    fn start_spill(&mut self) {
        let mut sp = Spill::default();
        for c in self.buf.chunks() {
            sp.extend(c, Some(self.want));
        }
        self.spilled += sp.len() as u64;
        self.buf = IoVec::new();
        self.loose = 0;
        self.spill = Some(sp);
        self.mem = self.recount();
    }

    /// Bytes of unframed input held: the spill and the received buffers.
    fn unframed(&self) -> usize {
        self.spill.as_ref().map_or(0, Spill::len) + self.buf.len()
    }

    /// What this connection holds, in truesize ([`truesize`]): the received and merged
    /// buffers not framed yet, the spill (its last chunk at its capacity), a held
    /// exclusive message. Not the messages taken. O(1): a running sum (a push adds the
    /// buffer unless it joined the last segment, a message taken subtracts the buffers
    /// it took whole; the slow paths recount), checked against a recount in debug
    /// builds.
    pub fn mem(&self) -> usize {
        debug_assert_eq!(self.mem, self.recount());
        self.mem
    }

    /// [`Framer::mem`] counted over what is held.
    fn recount(&self) -> usize {
        let mut m = truesize(&self.buf);
        if let Some(sp) = &self.spill {
            m += sp.mem();
        }
        if let Some(h) = &self.held {
            m += truesize(&h.body);
        }
        m
    }

    /// Bytes the head message still lacks, once the parser has told its length (`None`
    /// before that, and after an error).
    pub fn missing(&self) -> Option<usize> {
        (self.failed.is_none() && self.want > 0).then(|| self.want.saturating_sub(self.unframed()))
    }

    /// Ends the connection because the I/O core's memory budget is exhausted
    /// ([`ParseErrorKind::Memory`]; [`crate::socket::MsgIo`] decides): as a framing error,
    /// what was buffered is dropped, the parser's farewell kept
    /// ([`Framer::take_farewell`]), and [`Framer::next_message`] returns the error from
    /// now on. A framer that failed already keeps its error.
    pub fn fail_memory(&mut self) -> ParseError {
        if let Some(e) = self.failed {
            return e;
        }
        self.fail(ParseError::new(
            ParseErrorKind::Memory,
            "receive memory budget exhausted",
        ))
    }

    /// Whether the I/O core should read more of this connection now (false once a whole
    /// message's worth waits, or after an error).
    pub fn wants_input(&self) -> bool {
        self.failed.is_none() && self.unframed() <= self.cfg.max_message
    }

    /// The next whole message, `Ok(None)` if it has not fully arrived, `max_in_flight`
    /// messages are out, or an exclusive message waits for (or is) one in flight; or the
    /// error that ends the connection (returned again on every later call).
    pub fn next_message(&mut self) -> Result<Option<Framed>, ParseError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        if self.in_flight >= self.cfg.max_in_flight {
            return Ok(None);
        }
        if self.exclusive_out && self.in_flight > 0 {
            return Ok(None);
        }
        if let Some(m) = self.held.take() {
            if self.in_flight > 0 {
                self.held = Some(m);
                return Ok(None);
            }
            self.mem -= truesize(&m.body);
            self.exclusive_out = true;
            self.in_flight += 1;
            return Ok(Some(m));
        }
        if self.want == 0 {
            match self.parser.parse(&self.buf, self.cfg.max_message) {
                Ok(0) if self.buf.len() > self.cfg.max_message => {
                    return Err(self.fail(ParseError::new(
                        ParseErrorKind::TooLarge,
                        "no message boundary within max_message bytes",
                    )));
                }
                Ok(0) => return Ok(None),
                Ok(n) if n > self.cfg.max_message => {
                    return Err(self.fail(ParseError::new(
                        ParseErrorKind::TooLarge,
                        "message above max_message",
                    )));
                }
                Ok(n) => self.want = n,
                Err(e) => return Err(self.fail(e)),
            }
        }
        if self.unframed() < self.want {
            if self.spill.is_none() && self.want > SPILL_MIN {
                self.start_spill();
            }
            return Ok(None);
        }
        let segs = self.buf.num_segments();
        let body = self.buf.split_to(self.want);
        // The buffers that left `buf` whole are the message's first ones (one cut in two
        // stays counted in `buf`).
        self.mem -= cost(&body.segments()[..segs - self.buf.num_segments()]);
        // What is left is a suffix of what was held.
        self.loose = self.loose.min(self.buf.num_segments());
        self.want = 0;
        let seq = self.next_seq;
        self.next_seq += 1;
        let m = Framed {
            seq,
            stream: self.parser.stream(&body),
            body,
        };
        let exclusive = self.parser.exclusive(&m.body);
        if exclusive && self.in_flight > 0 {
            self.mem += truesize(&m.body);
            self.held = Some(m);
            return Ok(None);
        }
        self.exclusive_out = exclusive;
        self.in_flight += 1;
        Ok(Some(m))
    }

    fn fail(&mut self, e: ParseError) -> ParseError {
        self.failed = Some(e);
        self.farewell = self.parser.farewell(&e, &self.buf);
        self.buf = IoVec::new();
        self.loose = 0;
        self.spill = None;
        self.mem = self.recount();
        e
    }

    /// After [`Framer::next_message`] returned an error: the bytes the parser wants
    /// written before the connection closes ([`Parser::farewell`]), once.
    pub fn take_farewell(&mut self) -> Option<Zbuf> {
        self.farewell.take()
    }

    /// One message's reply (or completion without a reply) has gone out: one more may be
    /// taken. Extra calls are ignored (never below zero).
    pub fn reply_done(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Messages out at workers (or waiting for their reply's turn), plus an exclusive
    /// one held until they are done.
    pub fn in_flight(&self) -> usize {
        self.in_flight + usize::from(self.held.is_some())
    }

    /// Bytes received but not yet part of a taken message (a held one included).
    pub fn buffered(&self) -> usize {
        self.unframed() + self.held.as_ref().map_or(0, |m| m.body.len())
    }

    /// Bytes copied out of the received buffers so far (messages above [`SPILL_MIN`], and
    /// buffers past [`SPILL_PIECES`]).
    pub fn spilled(&self) -> u64 {
        self.spilled
    }

    /// Messages taken so far.
    pub fn taken(&self) -> u64 {
        self.next_seq - u64::from(self.held.is_some())
    }

    /// The protocol's reply order.
    pub fn ordering(&self) -> Ordering {
        self.parser.ordering()
    }

    /// The configured bounds.
    pub fn config(&self) -> &FramerConfig {
        &self.cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parser::knb::{Header, KnbParser, HDR_LEN};
    use proptest::prelude::*;

    fn req(id: u64, len: u32) -> Vec<u8> {
        let mut v = Header { id, len, flags: 0 }.bytes().to_vec();
        v.extend((0..len).map(|i| (i as u8) ^ (id as u8)));
        v
    }

    fn framer(max_message: usize, max_in_flight: usize) -> Framer<KnbParser> {
        Framer::new(
            KnbParser::new(Ordering::Ordered),
            FramerConfig {
                max_message,
                max_in_flight,
                ..FramerConfig::default()
            },
        )
        .unwrap()
    }

    proptest! {
        /// However the stream is cut into buffers, the same messages come out, in order,
        /// byte for byte, numbered 0, 1, 2, ... (large ones copied out as they arrive).
        #[test]
        fn messages_survive_any_segmentation(
            lens in proptest::collection::vec(prop_oneof![4 => 0u32..3000, 1 => 15_000u32..40_000], 1..20),
            cuts in proptest::collection::vec(prop_oneof![4 => 1usize..700, 1 => 1usize..20_000], 1..200),
        ) {
            // Messages on both sides of SPILL_MIN (zero copy, and copied as they arrive).
            let stream: Vec<u8> = lens.iter().enumerate().flat_map(|(i, &l)| req(i as u64, l)).collect();
            let mut f = framer(1 << 16, 1 << 16);
            let mut got = Vec::new();
            let (mut at, mut k) = (0, 0);
            while at < stream.len() {
                let n = cuts[k % cuts.len()].min(stream.len() - at);
                f.push(Zbuf::copy_from_slice(&stream[at..at + n]));
                prop_assert_eq!(f.mem, f.recount(), "memory kept as counted");
                at += n;
                k += 1;
                while let Some(m) = f.next_message().unwrap() {
                    got.push(m);
                    prop_assert_eq!(f.mem, f.recount());
                }
            }
            prop_assert_eq!(got.len(), lens.len());
            for (i, m) in got.iter().enumerate() {
                prop_assert_eq!(m.seq, i as u64);
                prop_assert_eq!(m.body.to_vec(), req(i as u64, lens[i]));
            }
            prop_assert_eq!(f.buffered(), 0);
        }
    }

    #[test]
    fn the_in_flight_cap_holds_messages_back_until_replies_complete() {
        let mut f = framer(1 << 16, 2);
        for i in 0..4 {
            f.push(Zbuf::copy_from_slice(&req(i, 10)));
        }
        assert_eq!(f.next_message().unwrap().unwrap().seq, 0);
        assert_eq!(f.next_message().unwrap().unwrap().seq, 1);
        assert!(f.next_message().unwrap().is_none(), "cap of 2 reached");
        assert_eq!(f.in_flight(), 2);
        f.reply_done();
        assert_eq!(f.next_message().unwrap().unwrap().seq, 2);
        assert!(f.next_message().unwrap().is_none());
        f.reply_done();
        f.reply_done();
        f.reply_done();
        f.reply_done();
        assert_eq!(f.in_flight(), 0, "never below zero");
        assert_eq!(f.next_message().unwrap().unwrap().seq, 3);
    }

    #[test]
    fn a_message_above_the_cap_is_too_large_and_the_error_sticks() {
        let mut f = framer(HDR_LEN + 100, 8);
        f.push(Zbuf::copy_from_slice(&req(0, 100)));
        f.push(Zbuf::copy_from_slice(&req(1, 101)));
        assert!(f.next_message().unwrap().is_some());
        let e = f.next_message().unwrap_err();
        assert_eq!(e.kind(), ParseErrorKind::TooLarge);
        assert_eq!(f.next_message().unwrap_err(), e);
        assert!(!f.wants_input());
        f.push(Zbuf::copy_from_slice(&req(2, 1)));
        assert_eq!(f.buffered(), 0, "nothing is kept after an error");
    }

    /// One-byte messages; `W` must run alone ([`Parser::exclusive`]), `r` need not.
    struct Bytes;
    impl Parser for Bytes {
        fn parse(&mut self, buf: &IoVec, _: usize) -> Result<usize, ParseError> {
            Ok(usize::from(!buf.is_empty()))
        }
        fn ordering(&self) -> Ordering {
            Ordering::Ordered
        }
        fn exclusive(&self, msg: &IoVec) -> bool {
            msg.to_vec() == b"W"
        }
    }

    #[test]
    fn an_exclusive_message_waits_for_the_earlier_ones_and_runs_alone() {
        let cfg = FramerConfig {
            max_message: 64,
            max_in_flight: 8,
            ..FramerConfig::default()
        };
        let mut f = Framer::new(Bytes, cfg).unwrap();
        f.push(Zbuf::copy_from_slice(b"rrWrWW"));
        let next = |f: &mut Framer<Bytes>| f.next_message().unwrap().map(|m| m.seq);
        assert_eq!(next(&mut f), Some(0));
        assert_eq!(next(&mut f), Some(1));
        assert_eq!(next(&mut f), None, "W waits for the two reads");
        // Held, not taken: counted as in flight (so a half-closed peer is not closed
        // before it) and as buffered bytes.
        assert_eq!((f.in_flight(), f.taken(), f.buffered()), (3, 2, 4));
        f.reply_done();
        assert_eq!(next(&mut f), None, "one read still out");
        f.reply_done();
        assert_eq!(next(&mut f), Some(2), "W once nothing is out");
        assert_eq!(next(&mut f), None, "nothing beside W");
        assert_eq!((f.in_flight(), f.taken(), f.buffered()), (1, 3, 3));
        f.reply_done();
        assert_eq!(next(&mut f), Some(3));
        assert_eq!(next(&mut f), None, "W after a read waits");
        f.reply_done();
        assert_eq!(next(&mut f), Some(4));
        f.reply_done();
        assert_eq!(next(&mut f), Some(5), "W after W");
        f.reply_done();
        assert_eq!((next(&mut f), f.in_flight(), f.buffered()), (None, 0, 0));
    }

    /// A parser that never finds a boundary (a line protocol fed no newline).
    struct Endless;
    impl Parser for Endless {
        fn parse(&mut self, _: &IoVec, _: usize) -> Result<usize, ParseError> {
            Ok(0)
        }
        fn ordering(&self) -> Ordering {
            Ordering::Ordered
        }
    }

    #[test]
    fn no_boundary_within_the_cap_is_too_large_and_input_stops_before() {
        let mut f = Framer::new(
            Endless,
            FramerConfig {
                max_message: 1000,
                max_in_flight: 4,
                ..FramerConfig::default()
            },
        )
        .unwrap();
        for _ in 0..10 {
            assert!(f.wants_input());
            f.push(Zbuf::copy_from_slice(&[b'x'; 100]));
            assert!(f.next_message().unwrap().is_none());
        }
        assert!(
            f.wants_input(),
            "exactly max_message buffered: one more read decides"
        );
        f.push(Zbuf::copy_from_slice(b"x"));
        assert_eq!(
            f.next_message().unwrap_err().kind(),
            ParseErrorKind::TooLarge
        );
    }

    #[test]
    fn bad_configs_are_refused() {
        let p = || KnbParser::new(Ordering::Ordered);
        let c = |max_message, max_in_flight| FramerConfig {
            max_message,
            max_in_flight,
            ..FramerConfig::default()
        };
        assert_eq!(
            Framer::new(p(), c(0, 1)).err(),
            Some(FramerConfigError::MaxMessage)
        );
        assert_eq!(
            Framer::new(p(), c(1, 0)).err(),
            Some(FramerConfigError::MaxInFlight)
        );
        assert_eq!(
            Framer::new(p(), c(1, (1 << 16) + 1)).err(),
            Some(FramerConfigError::MaxInFlight)
        );
        assert!(Framer::new(p(), c(1, 1 << 16)).is_ok());
    }

    #[test]
    fn messages_are_slices_of_the_received_buffers() {
        let before = zbuf::thread_copy_stats().bytes;
        let data = Zbuf::copy_from_slice(&[req(0, 4000), req(1, 10)].concat());
        let mut f = framer(1 << 16, 8);
        f.push(data.clone());
        let m0 = f.next_message().unwrap().unwrap();
        let m1 = f.next_message().unwrap().unwrap();
        assert!(m0.body.segments()[0].same_object(&data));
        assert!(m1.body.segments()[0].same_object(&data));
        // copy_from_slice above counted its own copy; framing added none.
        assert_eq!(zbuf::thread_copy_stats().bytes - before, data.len() as u64);
    }

    /// A message above SPILL_MIN that arrives in segments is copied out as it comes: each
    /// received buffer is released once copied (it was held until the message was whole:
    /// a 1 MiB value pinned ~720 NIC receive buffers), the message comes out whole and
    /// exact (in SPILL_CHUNK heap chunks), and the next message's bytes that shared the
    /// last segment stay zero copy.
    #[test]
    fn a_large_message_is_copied_out_of_the_receive_buffers_as_it_arrives() {
        let big = req(0, 100_000);
        let small = req(1, 10);
        let stream = [big.clone(), small.clone()].concat();
        let mut f = framer(1 << 20, 8);
        let mut kept = Vec::new();
        let mut out = Vec::new();
        for c in stream.chunks(1448) {
            let z = Zbuf::copy_from_slice(c);
            kept.push(z.clone());
            f.push(z);
            while let Some(m) = f.next_message().unwrap() {
                out.push(m);
            }
        }
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].body.to_vec(), big);
        assert_eq!(
            out[0].body.num_segments(),
            big.len().div_ceil(SPILL_CHUNK),
            "heap chunks"
        );
        assert_eq!(out[1].body.to_vec(), small);
        let last = kept.last().unwrap();
        assert!(
            out[1].body.segments().iter().all(|z| z.same_object(last)),
            "the next message stays a slice of what was received"
        );
        assert!(f.spilled() >= big.len() as u64 - 1448, "{}", f.spilled());
        // Every received buffer but the last was released by the framer as it was copied
        // (the test holds the only other reference); the last is the small message's.
        let held: Vec<usize> = kept[..kept.len() - 1]
            .iter()
            .map(|z| z.ref_count())
            .collect();
        assert!(held.iter().all(|&n| n == 1), "pinned: {held:?}");
        assert_eq!(f.buffered(), 0);
    }

    /// The received buffers the framer holds: those of `kept` someone else references
    /// (the newest thousand, and all of them every thousandth call: linear, not quadratic).
    fn pinned(kept: &[Zbuf]) -> usize {
        let from = if kept.len() % 1000 == 0 {
            0
        } else {
            kept.len().saturating_sub(1000)
        };
        kept[from..].iter().filter(|z| z.ref_count() > 1).count()
    }

    /// One byte per received buffer (one per TCP segment), as a peer sending 1-byte
    /// segments makes them.
    fn tiny(b: u8) -> Zbuf {
        Zbuf::from_vec(vec![b])
    }

    /// A 16 KiB message (not above SPILL_MIN) sent in 1-byte segments held one receive
    /// buffer per byte until it completed (16,384 of a server's 8,191): the framer holds at
    /// most SPILL_PIECES of them, and the message comes out whole and exact, followed by
    /// the next one.
    #[test]
    fn a_message_in_tiny_segments_pins_a_bounded_number_of_receive_buffers() {
        let big = req(0, (SPILL_MIN - HDR_LEN) as u32);
        let small = req(1, 10);
        let stream = [big.clone(), small.clone()].concat();
        let mut f = framer(1 << 20, 8);
        let mut kept = Vec::new();
        let mut out = Vec::new();
        let mut most = 0;
        for &b in &stream {
            let z = tiny(b);
            kept.push(z.clone());
            f.push(z);
            while let Some(m) = f.next_message().unwrap() {
                out.push(m);
            }
            most = most.max(pinned(&kept));
        }
        assert!(most <= SPILL_PIECES, "{most} receive buffers held");
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].body.to_vec(), big);
        assert_eq!(out[1].body.to_vec(), small);
        assert!(f.spilled() >= (big.len() - SPILL_PIECES) as u64);
        assert_eq!(f.buffered(), 0);
    }

    /// The same before the parser knows the message's length (a line protocol's long
    /// line): the newest buffers are merged, the merged ones absorbed into longer ones, so
    /// at most SPILL_PIECES receive buffers and a few heap buffers are held, and each byte
    /// is copied O(log n) times.
    #[test]
    fn tiny_segments_without_a_boundary_pin_a_bounded_number_of_receive_buffers() {
        let mut f = Framer::new(
            Endless,
            FramerConfig {
                max_message: 1 << 20,
                max_in_flight: 4,
                ..FramerConfig::default()
            },
        )
        .unwrap();
        let n = 50_000usize;
        let mut kept = Vec::new();
        let mut most = 0;
        for i in 0..n {
            let z = tiny(i as u8);
            kept.push(z.clone());
            f.push(z);
            assert!(f.next_message().unwrap().is_none());
            most = most.max(pinned(&kept));
            assert!(
                f.buf.num_segments() <= SPILL_PIECES + 20,
                "{}",
                f.buf.num_segments()
            );
        }
        assert!(most <= SPILL_PIECES, "{most} receive buffers held");
        let expect: Vec<u8> = (0..n).map(|i| i as u8).collect();
        assert_eq!(f.buf.to_vec(), expect, "the bytes, in order");
        let log2 = usize::BITS - n.leading_zeros();
        assert!(
            f.spilled() <= (n as u64) * u64::from(log2 + 1),
            "{} bytes copied",
            f.spilled()
        );
    }

    /// Ordinary RPCs stay zero copy: knb's 4 KiB requests in full-sized segments (three
    /// each), back to back, the stream cut wherever a segment ends.
    #[test]
    fn rpcs_in_full_sized_segments_stay_zero_copy() {
        let stream: Vec<u8> = (0..100).flat_map(|i| req(i, 4096)).collect();
        let mut f = framer(1 << 20, 64);
        let mut kept = Vec::new();
        let mut out = Vec::new();
        for c in stream.chunks(1448) {
            let z = Zbuf::copy_from_slice(c);
            kept.push(z.clone());
            f.push(z);
            while let Some(m) = f.next_message().unwrap() {
                out.push(m);
                f.reply_done();
            }
        }
        assert_eq!(out.len(), 100);
        assert_eq!(f.spilled(), 0);
        for (i, m) in out.iter().enumerate() {
            assert_eq!(m.body.to_vec(), req(i as u64, 4096));
            assert!(m.body.num_segments() <= 4);
            assert!(m
                .body
                .segments()
                .iter()
                .all(|z| kept.iter().any(|k| k.same_object(z))));
        }
    }

    /// What a framer holds is measured in truesize (each buffer's object plus
    /// BUF_OVERHEAD), and a spill grows with what arrived, not with what its header
    /// announced: a 1 MiB message with 20 KB sent holds one chunk, not 1 MiB.
    #[test]
    fn mem_follows_what_arrived_not_what_was_announced() {
        let mut f = framer(2 << 20, 8);
        assert_eq!(f.mem(), 0);
        let big = req(0, 1 << 20);
        f.push(Zbuf::copy_from_slice(&big[..20_000]));
        assert_eq!(f.mem(), 20_000 + BUF_OVERHEAD, "the buffer as received");
        assert!(f.next_message().unwrap().is_none());
        assert_eq!(f.mem(), SPILL_CHUNK + BUF_OVERHEAD, "one chunk");
        f.push(Zbuf::copy_from_slice(&big[20_000..100_000]));
        assert_eq!(f.mem(), 2 * (SPILL_CHUNK + BUF_OVERHEAD));
        f.push(Zbuf::copy_from_slice(&big[100_000..]));
        let m = f.next_message().unwrap().unwrap();
        assert_eq!(m.body.to_vec(), big);
        assert_eq!(f.mem(), 0, "a message taken is the worker's");
        // A 2 KiB receive buffer holding one byte costs the whole buffer.
        let mut rx = zbuf::ZbufMut::heap(0, 2048);
        rx.extend_from_slice(&[0]).unwrap();
        f.push(rx.freeze());
        assert_eq!(f.mem(), 2048 + BUF_OVERHEAD);
    }

    #[test]
    fn failing_for_memory_drops_what_is_held_and_sticks() {
        let mut f = framer(1 << 20, 8);
        f.push(Zbuf::copy_from_slice(&req(0, 50_000)[..30_000]));
        assert!(f.next_message().unwrap().is_none());
        assert!(f.mem() > 30_000);
        let e = f.fail_memory();
        assert_eq!(e.kind(), ParseErrorKind::Memory);
        assert_eq!((f.mem(), f.buffered()), (0, 0));
        assert!(!f.wants_input());
        assert_eq!(f.next_message().unwrap_err(), e);
        assert_eq!(f.fail_memory(), e, "the first error stays");
    }

    #[test]
    fn a_zero_memory_budget_is_refused() {
        let cfg = FramerConfig {
            mem_budget: 0,
            ..FramerConfig::default()
        };
        assert_eq!(
            Framer::new(KnbParser::new(Ordering::Ordered), cfg).err(),
            Some(FramerConfigError::MemBudget)
        );
    }

    /// While a large message is being copied, what the framer holds counts as buffered
    /// (reading stops at max_message as before), and a message at the cap completes.
    #[test]
    fn a_spilling_message_counts_as_buffered_and_completes_at_the_cap() {
        let big = req(7, 50_000);
        let mut f = framer(1 << 20, 8);
        f.push(Zbuf::copy_from_slice(&big[..20_000]));
        assert!(f.next_message().unwrap().is_none());
        f.push(Zbuf::copy_from_slice(&big[20_000..30_000]));
        assert!(f.next_message().unwrap().is_none());
        assert_eq!(f.buffered(), 30_000);
        assert!(f.wants_input());
        f.push(Zbuf::copy_from_slice(&big[30_000..]));
        let m = f.next_message().unwrap().unwrap();
        assert_eq!(m.body.to_vec(), big);
        // A message at the cap (30,016 bytes of 40,000), in two pushes.
        let mut f = framer(40_000, 8);
        f.push(Zbuf::copy_from_slice(&req(1, 30_000)[..20_000]));
        assert!(f.next_message().unwrap().is_none());
        assert!(f.spilled() > 0);
        f.push(Zbuf::copy_from_slice(&[0u8; 10_016]));
        assert!(f.next_message().unwrap().is_some(), "the message completes");
        assert_eq!(f.buffered(), 0);
    }
}
