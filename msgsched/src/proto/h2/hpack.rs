//! HPACK (RFC 7541) for the HTTP/2 session, bounded against decompression bombs.
//!
//! The decoder's table-driven core (static and dynamic tables, Huffman, integer and string
//! representations, dynamic table size updates) is the `loona-hpack` crate (MIT, the
//! maintained fork of the `hpack` crate used by the loona HTTP server; no I/O, decodes a
//! contiguous header block, which HTTP/2 needs anyway: HEADERS + CONTINUATION are
//! assembled before decoding). What this module adds is what a server facing untrusted
//! peers needs on top:
//! - the decoded header list is bounded in **size** (RFC 9113 §6.5.2's
//!   SETTINGS_MAX_HEADER_LIST_SIZE measure: name + value + 32 per field) **and** in
//!   **field count**, so a small block that indexes one big dynamic-table entry
//!   thousands of times (an HPACK bomb) is refused without materialising it: once over
//!   a limit nothing more is stored, the rest of the block is only walked so that the
//!   dynamic table stays in step with the peer's encoder;
//! - the peer cannot grow the dynamic table beyond what we advertised (a size update
//!   above it is a decoding error);
//!
//! The encoder is ours ([`encoder`]): loona-hpack's never Huffman codes and does not
//! index a field whose name is already known. Ours follows RFC 7541 Appendix C's
//! strategy (its examples reproduce byte for byte), Huffman codes every literal that
//! is not longer for it (switchable: [`HUFFMAN_DEFAULT`], [`Encoder::set_huffman`]),
//! and emits the dynamic table size updates RFC 7541 §4.2 requires when the peer
//! changes SETTINGS_HEADER_TABLE_SIZE.

use std::borrow::Cow;
use std::fmt;

pub mod encoder;
mod tables;

pub use encoder::{Encoder, HUFFMAN_DEFAULT};

/// One header field: name and value bytes.
pub type Field = (Vec<u8>, Vec<u8>);

/// The HTTP/2 default dynamic table size (SETTINGS_HEADER_TABLE_SIZE).
pub const DEFAULT_TABLE_SIZE: usize = 4096;

/// Bounds on one decoded header list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HpackLimits {
    /// Largest decoded list, counted as RFC 9113 §6.5.2 does (name + value + 32 per field).
    pub max_list_size: usize,
    /// Most fields in one list. The default, `max_list_size / 32`, is what the list size
    /// alone allows (each field counts 32 bytes besides its name and value), so a peer
    /// that keeps to the list size we advertise never meets it; it was 128, unadvertised,
    /// and ~120 small headers (1.5 KB, gRPC metadata) closed the whole connection.
    pub max_fields: usize,
    /// Largest dynamic table the peer's encoder may use (what we advertise).
    pub max_table_size: usize,
}

impl Default for HpackLimits {
    fn default() -> Self {
        HpackLimits {
            max_list_size: 16 << 10,
            max_fields: (16 << 10) / 32,
            max_table_size: DEFAULT_TABLE_SIZE,
        }
    }
}

/// Why a header block was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HpackError {
    /// Not valid HPACK (bad index, bad integer, bad Huffman, truncated, a size update
    /// above the advertised table size): a COMPRESSION_ERROR for the connection.
    Malformed(&'static str),
    /// The decoded list is larger than `max_list_size`.
    ListTooLarge,
    /// The decoded list has more than `max_fields` fields.
    TooManyFields,
}

impl fmt::Display for HpackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HpackError::Malformed(w) => write!(f, "hpack: {w}"),
            HpackError::ListTooLarge => f.write_str("hpack: decoded header list too large"),
            HpackError::TooManyFields => f.write_str("hpack: too many header fields"),
        }
    }
}

impl std::error::Error for HpackError {}

fn describe(e: loona_hpack::decoder::DecoderError) -> &'static str {
    use loona_hpack::decoder::DecoderError as E;
    match e {
        E::HeaderIndexOutOfBounds => "header index out of bounds",
        E::IntegerDecodingError(_) => "bad integer",
        E::StringDecodingError(_) => "bad string literal (truncated or bad Huffman)",
        E::InvalidMaxDynamicSize => "dynamic table size update above the advertised size",
        E::SizeUpdateAtEnd => "dynamic table size update at the end of a block",
        _ => "undecodable header block",
    }
}

/// One connection's HPACK decoder (the peer's encoder state mirrored).
pub struct Decoder {
    inner: loona_hpack::Decoder<'static>,
    limits: HpackLimits,
}

impl Decoder {
    /// A decoder bounded by `limits`.
    pub fn new(limits: HpackLimits) -> Self {
        let mut inner = loona_hpack::Decoder::new();
        inner.set_max_allowed_table_size(limits.max_table_size);
        Decoder { inner, limits }
    }

    /// Decodes one complete header block. On `ListTooLarge` / `TooManyFields` the block
    /// has still been walked to its end, so the dynamic table matches the peer's.
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<Field>, HpackError> {
        let mut out = Vec::new();
        let (mut size, mut count) = (0usize, 0usize);
        let mut over: Option<HpackError> = None;
        let limits = self.limits;
        self.inner
            .decode_with_cb(block, |n: Cow<[u8]>, v: Cow<[u8]>| {
                if over.is_some() {
                    return;
                }
                count += 1;
                size = size.saturating_add(n.len() + v.len() + 32);
                if count > limits.max_fields {
                    over = Some(HpackError::TooManyFields);
                } else if size > limits.max_list_size {
                    over = Some(HpackError::ListTooLarge);
                } else {
                    out.push((n.into_owned(), v.into_owned()));
                }
            })
            .map_err(|e| HpackError::Malformed(describe(e)))?;
        match over {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn fields(v: &[(&str, &str)]) -> Vec<Field> {
        v.iter()
            .map(|(n, x)| (n.as_bytes().to_vec(), x.as_bytes().to_vec()))
            .collect()
    }

    fn req1() -> Vec<Field> {
        fields(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ])
    }

    fn req2() -> Vec<Field> {
        let mut f = req1();
        f.extend(fields(&[("cache-control", "no-cache")]));
        f
    }

    fn req3() -> Vec<Field> {
        fields(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ])
    }

    fn resp(status: &str, date: &str) -> Vec<Field> {
        fields(&[
            (":status", status),
            ("cache-control", "private"),
            ("date", date),
            ("location", "https://www.example.com"),
        ])
    }

    fn resp3() -> Vec<Field> {
        let mut f = resp("200", "Mon, 21 Oct 2013 20:13:22 GMT");
        f.extend(fields(&[
            ("content-encoding", "gzip"),
            (
                "set-cookie",
                "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
            ),
        ]));
        f
    }

    type Blocks = Vec<(&'static str, Vec<Field>)>;

    /// RFC 7541 C.3: requests without Huffman coding (one connection).
    fn c3() -> Blocks {
        vec![
            ("828684410f7777772e6578616d706c652e636f6d", req1()),
            ("828684be58086e6f2d6361636865", req2()),
            (
                "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565",
                req3(),
            ),
        ]
    }

    /// RFC 7541 C.4: the same requests with Huffman coding.
    fn c4() -> Blocks {
        vec![
            ("828684418cf1e3c2e5f23a6ba0ab90f4ff", req1()),
            ("828684be5886a8eb10649cbf", req2()),
            ("828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf", req3()),
        ]
    }

    /// RFC 7541 C.5: responses without Huffman, a 256-byte table (so entries are evicted).
    fn c5() -> Blocks {
        vec![
            ("4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a323120474d546e1768747470733a2f2f7777772e6578616d706c652e636f6d", resp("302", "Mon, 21 Oct 2013 20:13:21 GMT")),
            ("4803333037c1c0bf", resp("307", "Mon, 21 Oct 2013 20:13:21 GMT")),
            ("88c1611d4d6f6e2c203231204f637420323031332032303a31333a323220474d54c05a04677a69707738666f6f3d4153444a4b48514b425a584f5157454f50495541585157454f49553b206d61782d6167653d333630303b2076657273696f6e3d31", resp3()),
        ]
    }

    /// RFC 7541 C.6: the same responses with Huffman coding.
    fn c6() -> Blocks {
        vec![
            ("488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff6e919d29ad171863c78f0b97c8e9ae82ae43d3", resp("302", "Mon, 21 Oct 2013 20:13:21 GMT")),
            ("4883640effc1c0bf", resp("307", "Mon, 21 Oct 2013 20:13:21 GMT")),
            ("88c16196d07abe941054d444a8200595040b8166e084a62d1bffc05a839bd9ab77ad94e7821dd7f2e6c7b335dfdfcd5b3960d5af27087f3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007", resp3()),
        ]
    }

    /// One connection's decoder, with a `table`-byte dynamic table agreed out of band.
    fn decode_all(table: usize, blocks: &Blocks) {
        let mut d = Decoder::new(HpackLimits {
            max_table_size: table,
            ..HpackLimits::default()
        });
        d.inner.set_max_table_size(table);
        for (i, (h, want)) in blocks.iter().enumerate() {
            assert_eq!(&d.decode(&hex(h)).unwrap(), want, "block {i}");
        }
    }

    /// One connection's encoder: every block byte for byte.
    fn encode_all(table: usize, huffman: bool, blocks: &Blocks) {
        let mut e = Encoder::with_table_size(table, huffman);
        for (i, (h, list)) in blocks.iter().enumerate() {
            let mut out = Vec::new();
            e.encode(list.iter().map(|(n, v)| (&n[..], &v[..])), &mut out);
            assert_eq!(out, hex(h), "block {i}");
        }
    }

    #[test]
    fn rfc7541_c3_requests_without_huffman() {
        decode_all(4096, &c3());
        encode_all(4096, false, &c3());
    }

    #[test]
    fn rfc7541_c4_requests_with_huffman() {
        decode_all(4096, &c4());
        encode_all(4096, true, &c4());
    }

    #[test]
    fn rfc7541_c5_responses_without_huffman_and_eviction() {
        decode_all(256, &c5());
        encode_all(256, false, &c5());
    }

    #[test]
    fn rfc7541_c6_responses_with_huffman_and_eviction() {
        decode_all(256, &c6());
        encode_all(256, true, &c6());
    }

    /// RFC 7541 C.4.1's "www.example.com", and every octet value through loona-hpack's
    /// (independent) Huffman decoder.
    #[test]
    fn huffman_codes_every_octet() {
        let mut out = Vec::new();
        encoder::huffman_encode(b"www.example.com", &mut out);
        assert_eq!(out, hex("f1e3c2e5f23a6ba0ab90f4ff"));
        assert_eq!(encoder::huffman_len(b"www.example.com"), 12);
        let all: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        for s in [&all[..], &all[..1], &all[255..258], b"", b"a"] {
            let mut out = Vec::new();
            encoder::huffman_encode(s, &mut out);
            assert_eq!(out.len(), encoder::huffman_len(s));
            let got = loona_hpack::huffman::HuffmanDecoder::new()
                .decode(&out)
                .unwrap();
            assert_eq!(got, s);
        }
    }

    fn encode(e: &mut Encoder, list: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        e.encode(list.iter().copied(), &mut out);
        out
    }

    #[test]
    fn huffman_only_when_not_longer() {
        // '~' is 13 bits, so "~~~" takes 5 octets coded: sent raw; "x-a" ties at 3: coded.
        let mut e = Encoder::new();
        assert_eq!(
            encode(&mut e, &[(b"x-a", b"~~~")]),
            hex("4083f2b0ff037e7e7e")
        );
        let mut e = Encoder::with_huffman(false);
        assert!(!e.huffman());
        assert_eq!(encode(&mut e, &[(b"x-a", b"b")]), hex("4003782d610162"));
        e.set_huffman(true);
        assert_eq!(encode(&mut e, &[(b"x-b", b"b")]), hex("4083f2b47f818f"));
    }

    #[test]
    fn credentials_are_never_indexed_and_big_fields_not_indexed() {
        let mut e = Encoder::with_huffman(false);
        // RFC 7541 C.2.3's never-indexed literal, with the static name index (23).
        let out = encode(&mut e, &[(b"authorization", b"secret")]);
        assert_eq!(out, hex("1f0806736563726574"));
        let again = encode(&mut e, &[(b"authorization", b"secret")]);
        assert_eq!(again, out, "not in the table");
        // 3/4 of 4096 is 3072: a 3100-byte field goes without indexing.
        let big = vec![b'v'; 3100];
        let out = encode(&mut e, &[(b"x-big", &big)]);
        assert_eq!(&out[..10], &hex("0005782d6269677f9d17")[..]);
        let mut d = Decoder::new(HpackLimits::default());
        assert_eq!(
            d.decode(&out).unwrap(),
            vec![(b"x-big".to_vec(), big.clone())]
        );
        assert_eq!(encode(&mut e, &[(b"x-big", &big)]), out, "not in the table");
    }

    #[test]
    fn size_updates_signal_the_minimum_then_the_final_size() {
        let mut e = Encoder::new();
        let mut d = Decoder::new(HpackLimits::default());
        let list: [(&[u8], &[u8]); 2] = [(b"x-one", b"1"), (b":status", b"200")];
        d.decode(&encode(&mut e, &list)).unwrap();
        e.set_peer_table_size(0);
        e.set_peer_table_size(100_000); // clamped to 4096
        let out = encode(&mut e, &list);
        // 0, then 4096 (31 + 4065 = 0x1f, 0xe1 0x1f), then x-one is a new literal again.
        assert_eq!(&out[..4], &hex("203fe11f"));
        assert_eq!(
            out[4], 0x40,
            "x-one re-sent as a literal: the table was emptied"
        );
        let want: Vec<Field> = list.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
        assert_eq!(d.decode(&out).unwrap(), want);
        // Nothing owed any more; the re-added entry is indexed (62).
        assert_eq!(encode(&mut e, &list), hex("be88"));
        e.set_peer_table_size(4096);
        assert_eq!(encode(&mut e, &list), hex("be88"), "no change, no update");
        // An empty block carries no update; the next block with a field does.
        e.set_peer_table_size(256);
        assert_eq!(encode(&mut e, &[]), b"");
        let out = encode(&mut e, &list);
        assert_eq!(&out[..3], &hex("3fe101"), "256 = 31 + 225");
        assert_eq!(d.decode(&out).unwrap(), want);
    }

    /// One literal inserted into the dynamic table, then indexed 2,000 times: 2 KB of
    /// input that would decode to megabytes. Refused by size, and by count.
    #[test]
    fn an_hpack_bomb_is_refused_by_size_and_by_count() {
        let mut block = vec![0x40, 0x01, b'x', 0x7f];
        // value length 1000 (7-bit prefix: 127 + 873 continued)
        let mut n = 1000 - 127;
        while n >= 128 {
            block.push((n % 128) as u8 | 0x80);
            n /= 128;
        }
        block.push(n as u8);
        block.extend(std::iter::repeat_n(b'a', 1000));
        block.extend(std::iter::repeat_n(0xbe, 2000)); // index 62: the new entry
        let mut d = Decoder::new(HpackLimits::default());
        assert_eq!(d.decode(&block), Err(HpackError::ListTooLarge));
        let mut d = Decoder::new(HpackLimits {
            max_list_size: usize::MAX,
            ..HpackLimits::default()
        });
        assert_eq!(d.decode(&block), Err(HpackError::TooManyFields));
        // The table stayed in step: the entry is still there for the next block.
        let mut d2 = Decoder::new(HpackLimits::default());
        let _ = d2.decode(&block);
        let next = d2.decode(&[0xbe]).unwrap();
        assert_eq!(next[0].0, b"x");
        assert_eq!(next[0].1.len(), 1000);
    }

    #[test]
    fn bad_blocks_are_malformed_not_panics() {
        let mut d = Decoder::new(HpackLimits::default());
        for bad in [
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f][..], // huge index
            &[0xc0],                                                     // index 64: empty slot
            &[0x80],                                                     // index 0
            &[0x41, 0x85, 0xff],                                         // truncated Huffman
            &[0x3f, 0xe1, 0x1f],                                         // size update 4096+
            &[0x20],                                                     // size update at end
        ] {
            assert!(
                matches!(d.decode(bad), Err(HpackError::Malformed(_))),
                "{bad:x?}"
            );
        }
        let mut d = Decoder::new(HpackLimits::default());
        let big_update = [0x3f, 0xe2, 0x1f, 0x82]; // 8192 > 4096 advertised
        assert!(matches!(
            d.decode(&big_update),
            Err(HpackError::Malformed(_))
        ));
    }

    #[test]
    fn encoder_round_trips_and_signals_a_smaller_table() {
        let mut e = Encoder::new();
        let mut d = Decoder::new(HpackLimits::default());
        let list = resp3();
        for _ in 0..3 {
            let mut out = Vec::new();
            e.encode(list.iter().map(|(n, v)| (&n[..], &v[..])), &mut out);
            assert_eq!(d.decode(&out).unwrap(), list);
        }
        e.set_peer_table_size(0);
        let mut out = Vec::new();
        e.encode(list.iter().map(|(n, v)| (&n[..], &v[..])), &mut out);
        assert_eq!(out[0], 0x20, "size update to 0 first");
        assert_eq!(d.decode(&out).unwrap(), list);
    }

    /// One step of a connection's header traffic.
    #[derive(Debug, Clone)]
    enum Step {
        Block(Vec<Field>),
        PeerTableSize(usize),
        Huffman(bool),
    }

    fn field() -> impl proptest::strategy::Strategy<Value = Field> {
        use proptest::prelude::*;
        let names = prop_oneof![
            Just(b":status".to_vec()),
            Just(b"content-type".to_vec()),
            Just(b"date".to_vec()),
            Just(b"authorization".to_vec()),
            Just(b"x-a".to_vec()),
            Just(b"x-b".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..20),
        ];
        let values = prop_oneof![
            Just(b"200".to_vec()),
            Just(b"".to_vec()),
            Just(b"text/html".to_vec()),
            Just(b"v".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..40),
            proptest::collection::vec(any::<u8>(), 900..3300),
        ];
        (names, values)
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            8 => proptest::collection::vec(field(), 0..8).prop_map(Step::Block),
            1 => prop_oneof![Just(0usize), Just(64), Just(256), Just(4096), 0..10_000usize]
                .prop_map(Step::PeerTableSize),
            1 => any::<bool>().prop_map(Step::Huffman),
        ]
    }

    proptest::proptest! {
        /// Whatever the fields, table size changes and Huffman switching, each block
        /// our encoder writes decodes (by loona-hpack, our decoder's core) to exactly
        /// its fields, in order, with both tables in step.
        #[test]
        fn encoder_round_trips_through_our_decoder(
            steps in proptest::collection::vec(step(), 1..40),
        ) {
            let mut e = Encoder::new();
            let mut d = Decoder::new(HpackLimits {
                max_list_size: usize::MAX,
                max_fields: usize::MAX,
                max_table_size: DEFAULT_TABLE_SIZE,
            });
            for s in steps {
                match s {
                    Step::Block(list) => {
                        let mut out = Vec::new();
                        e.encode(list.iter().map(|(n, v)| (&n[..], &v[..])), &mut out);
                        proptest::prop_assert_eq!(d.decode(&out).unwrap(), list);
                    }
                    Step::PeerTableSize(n) => e.set_peer_table_size(n),
                    Step::Huffman(on) => e.set_huffman(on),
                }
            }
        }
    }

    /// Any list within the advertised size decodes, however many fields it has: 400
    /// one-byte-name fields (32 + 2 bytes each, 13,600 in all) are under 16 KiB.
    #[test]
    fn a_list_within_the_advertised_size_is_never_refused_for_its_field_count() {
        let limits = HpackLimits::default();
        let mut block = Vec::new();
        for _ in 0..400 {
            // Literal without indexing, new name "a", value "b".
            block.extend_from_slice(&[0x00, 0x01, b'a', 0x01, b'b']);
        }
        let mut d = Decoder::new(limits);
        assert_eq!(d.decode(&block).map(|l| l.len()), Ok(400));
        assert!(400 * 34 <= limits.max_list_size);
        assert_eq!(limits.max_fields * 32, limits.max_list_size);
    }
}
