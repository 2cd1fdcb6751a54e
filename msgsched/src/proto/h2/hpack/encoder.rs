//! The HPACK encoder (RFC 7541), ours: indexing strategy, dynamic table and Huffman.
//!
//! Strategy (the one RFC 7541 Appendix C's examples use, so they reproduce byte for
//! byte): a field found whole in a table is sent as its index; otherwise it is sent
//! as a literal *with incremental indexing*, its name by index when a table has the
//! name (the static table preferred), unless
//! - the entry would take more than 3/4 of the dynamic table (it would flush most of
//!   what the peer holds for us, for one field): literal without indexing;
//! - it is a credential (`authorization`, `proxy-authorization`): literal *never
//!   indexed* (RFC 7541 §7.1.3), so no intermediary re-indexes it either.
//!
//! Every string literal is Huffman coded when that is not longer than the raw octets
//! (ties go to Huffman, as RFC 7541 C.6's "307" does), unless the encoder was built
//! with Huffman off. The Huffman length is computed first and the code written
//! straight into the output: no scratch buffer.
//!
//! Allocation: none beyond the output `Vec`'s growth and one buffer per entry added to
//! the dynamic table (name and value in one allocation; the buffer of an evicted entry
//! is reused when it fits).

use std::collections::VecDeque;

use super::tables::{HUFFMAN_CODES, STATIC_TABLE};

/// Whether the encoder Huffman codes string literals unless told otherwise.
pub const HUFFMAN_DEFAULT: bool = true;

/// The HTTP/2 default dynamic table size, and the most we ever use.
const MAX_TABLE: usize = super::DEFAULT_TABLE_SIZE;

/// RFC 7541 §4.1: an entry's size is name + value + 32.
const ENTRY_OVERHEAD: usize = 32;

struct Entry {
    /// Name then value.
    bytes: Vec<u8>,
    name_len: usize,
}

impl Entry {
    fn name(&self) -> &[u8] {
        &self.bytes[..self.name_len]
    }
    fn value(&self) -> &[u8] {
        &self.bytes[self.name_len..]
    }
    fn size(&self) -> usize {
        self.bytes.len() + ENTRY_OVERHEAD
    }
}

/// The encoder's dynamic table (RFC 7541 §2.3.2), newest entry first.
struct DynTable {
    entries: VecDeque<Entry>,
    size: usize,
    max: usize,
    /// An evicted entry's buffer, reused by the next insertion it fits.
    spare: Option<Vec<u8>>,
}

impl DynTable {
    fn new(max: usize) -> Self {
        DynTable {
            entries: VecDeque::new(),
            size: 0,
            max,
            spare: None,
        }
    }

    /// RFC 7541 §4.4: evict from the end until `room` more octets fit.
    fn evict_for(&mut self, room: usize) {
        while self.size + room > self.max {
            let Some(e) = self.entries.pop_back() else {
                break;
            };
            self.size -= e.size();
            if self
                .spare
                .as_ref()
                .is_none_or(|s| s.capacity() < e.bytes.capacity())
            {
                self.spare = Some(e.bytes);
            }
        }
    }

    /// RFC 7541 §4.3: a smaller maximum evicts at once.
    fn set_max(&mut self, max: usize) {
        self.max = max;
        self.evict_for(0);
    }

    /// RFC 7541 §4.4: an entry larger than the table empties it and is not added.
    fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = name.len() + value.len() + ENTRY_OVERHEAD;
        if size > self.max {
            self.evict_for(self.max + 1);
            return;
        }
        self.evict_for(size);
        let mut bytes = match self.spare.take() {
            Some(b) if b.capacity() >= name.len() + value.len() => b,
            other => {
                self.spare = other;
                Vec::with_capacity(name.len() + value.len())
            }
        };
        bytes.clear();
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(value);
        self.entries.push_front(Entry {
            bytes,
            name_len: name.len(),
        });
        self.size += size;
    }
}

enum Found {
    /// Name and value at this index.
    Field(usize),
    /// The name (only) at this index.
    Name(usize),
    None,
}

/// One connection's HPACK encoder. Replies are encoded on the I/O core in the order
/// their HEADERS frames go on the wire, which is the order the peer decodes them in.
pub struct Encoder {
    table: DynTable,
    huffman: bool,
    /// The table size in force (what the peer's decoder must allow).
    table_size: usize,
    /// Size changes owed at the start of the next block (RFC 7541 §4.2): the smallest
    /// size reached since the last block, and the final one.
    pending_min: Option<usize>,
    pending_final: Option<usize>,
}

impl Default for Encoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Encoder {
    /// An encoder with the HTTP/2 default table size, Huffman per [`HUFFMAN_DEFAULT`].
    pub fn new() -> Self {
        Self::with_huffman(HUFFMAN_DEFAULT)
    }

    /// An encoder with the HTTP/2 default table size, Huffman on or off.
    pub fn with_huffman(huffman: bool) -> Self {
        Self::with_table_size(MAX_TABLE, huffman)
    }

    /// An encoder whose table size both ends already agree on (no size update sent):
    /// RFC 7541 Appendix C's 256-byte examples.
    pub(super) fn with_table_size(size: usize, huffman: bool) -> Self {
        let size = size.min(MAX_TABLE);
        Encoder {
            table: DynTable::new(size),
            huffman,
            table_size: size,
            pending_min: None,
            pending_final: None,
        }
    }

    /// Turns Huffman coding of string literals on or off (effective from the next field).
    pub fn set_huffman(&mut self, on: bool) {
        self.huffman = on;
    }

    /// Whether string literals are Huffman coded (when not longer).
    pub fn huffman(&self) -> bool {
        self.huffman
    }

    /// The peer's SETTINGS_HEADER_TABLE_SIZE. We never use more than the default 4096
    /// (a larger value is honoured by staying at 4096); a change shrinks (or regrows)
    /// the table and is signalled at the start of the next block.
    pub fn set_peer_table_size(&mut self, size: usize) {
        let size = size.min(MAX_TABLE);
        if size != self.table_size {
            self.table_size = size;
            self.table.set_max(size);
            self.pending_min = Some(self.pending_min.map_or(size, |m| m.min(size)));
            self.pending_final = Some(size);
        }
    }

    /// Appends the encoding of `fields` to `out`.
    pub fn encode<'a>(
        &mut self,
        fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
        out: &mut Vec<u8>,
    ) {
        let mut fields = fields.into_iter().peekable();
        // An empty block carries no update: a block that is only a size update is
        // refused by common decoders (loona-hpack: "size update at the end of a
        // block"), so the update waits for the next block that has a field.
        if fields.peek().is_some() {
            if let Some(last) = self.pending_final.take() {
                // RFC 7541 §4.2: when the size changed more than once between two
                // blocks, the smallest size is signalled first, then the final one. A
                // Dynamic Table Size Update is 001 + a 5-bit prefix integer (§6.3).
                if let Some(min) = self.pending_min.take().filter(|&m| m < last) {
                    put_int(out, min, 5, 0x20);
                }
                put_int(out, last, 5, 0x20);
            }
        }
        for (name, value) in fields {
            self.encode_field(name, value, out);
        }
    }

    fn find(&self, name: &[u8], value: &[u8]) -> Found {
        let mut name_at = None;
        for (i, (n, v)) in STATIC_TABLE.iter().enumerate() {
            if *n == name {
                if *v == value {
                    return Found::Field(i + 1);
                }
                name_at.get_or_insert(i + 1);
            }
        }
        for (i, e) in self.table.entries.iter().enumerate() {
            if e.name() == name {
                // RFC 7541 §2.3.3: dynamic entries follow the 61 static ones.
                let at = STATIC_TABLE.len() + 1 + i;
                if e.value() == value {
                    return Found::Field(at);
                }
                name_at.get_or_insert(at);
            }
        }
        name_at.map_or(Found::None, Found::Name)
    }

    fn encode_field(&mut self, name: &[u8], value: &[u8], out: &mut Vec<u8>) {
        let name_idx = match self.find(name, value) {
            // RFC 7541 §6.1: Indexed Header Field, 1 + 7-bit index.
            Found::Field(i) => return put_int(out, i, 7, 0x80),
            Found::Name(i) => i,
            Found::None => 0,
        };
        let sensitive = name.eq_ignore_ascii_case(b"authorization")
            || name.eq_ignore_ascii_case(b"proxy-authorization");
        let size = name.len() + value.len() + ENTRY_OVERHEAD;
        if sensitive {
            // RFC 7541 §6.2.3: Literal Header Field Never Indexed, 0001 + 4-bit index.
            put_int(out, name_idx, 4, 0x10);
        } else if size * 4 > self.table.max * 3 {
            // RFC 7541 §6.2.2: Literal Header Field without Indexing, 0000 + 4-bit index.
            put_int(out, name_idx, 4, 0x00);
        } else {
            // RFC 7541 §6.2.1: Literal Header Field with Incremental Indexing,
            // 01 + 6-bit index; the field is added to the table (§4.4).
            put_int(out, name_idx, 6, 0x40);
            if name_idx == 0 {
                self.put_string(name, out);
            }
            self.put_string(value, out);
            self.table.insert(name, value);
            return;
        }
        if name_idx == 0 {
            self.put_string(name, out);
        }
        self.put_string(value, out);
    }

    /// RFC 7541 §5.2: String Literal, H flag + 7-bit length, then the octets.
    fn put_string(&self, s: &[u8], out: &mut Vec<u8>) {
        if self.huffman {
            let len = huffman_len(s);
            if len <= s.len() {
                put_int(out, len, 7, 0x80);
                huffman_encode(s, out);
                return;
            }
        }
        put_int(out, s.len(), 7, 0x00);
        out.extend_from_slice(s);
    }
}

/// RFC 7541 §5.1: an integer with an N-bit prefix, `flags` in the bits above it.
fn put_int(out: &mut Vec<u8>, value: usize, prefix: u8, flags: u8) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    let mut v = value - max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// The Huffman-coded length of `s` in octets (RFC 7541 §5.2: padded to an octet).
pub(super) fn huffman_len(s: &[u8]) -> usize {
    let bits: usize = s
        .iter()
        .map(|&b| usize::from(HUFFMAN_CODES[usize::from(b)].1))
        .sum();
    bits.div_ceil(8)
}

/// Appends the Huffman code of `s` (RFC 7541 Appendix B), padded with the most
/// significant bits of EOS, i.e. ones (§5.2).
pub(super) fn huffman_encode(s: &[u8], out: &mut Vec<u8>) {
    // Pending bits, right-aligned: fewer than 8 between octets, so with a code of at
    // most 30 bits the accumulator never holds more than 37.
    let (mut acc, mut bits) = (0u64, 0u32);
    for &b in s {
        let (code, len) = HUFFMAN_CODES[usize::from(b)];
        acc = (acc << len) | u64::from(code);
        bits += u32::from(len);
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
        acc &= (1u64 << bits) - 1;
    }
    if bits > 0 {
        let pad = 8 - bits;
        out.push(((acc << pad) as u8) | ((1u8 << pad) - 1));
    }
}
