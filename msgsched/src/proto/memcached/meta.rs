//! memcached's meta commands (`mg`, `ms`, `md`, `ma`, `me`; `mn` is decoded in
//! [`super::text`]): request decoding, as memcached 1.6.18 decodes them.
//!
//! A meta command is `<verb> <key> [<datalen>] <flag>*`: each flag is one character,
//! possibly followed by a token (`T30`, `Oabc`). Flags are checked in the order sent; a
//! repeated or unknown flag ends the check at once, a flag with a bad token is remembered
//! and the check goes on (the last bad token names the error), as memcached's
//! `_meta_flag_preparse`. Every flag is accepted by every verb, and a verb ignores the
//! flags that do not concern it (`mg k D5` is a plain miss or hit). The server renders the
//! return flags (`k`, `O`, `c`, `t`, ...) in the order they were sent, so [`Meta::flags`]
//! keeps them.
//!
//! Errors are [`Error`]s of the text protocol; a meta command's error reply is always sent,
//! `q` or not (memcached's `out_errstring`).

use super::text::Error;
use super::KEY_MAX;
use zbuf::IoVec;

/// Most tokens a meta line may have, its verb included (memcached: 20 counting the
/// tokenizer's terminal token).
pub const TOKENS_MAX: usize = 19;
/// Longest opaque (`O`) token, its `O` included.
pub const OPAQUE_MAX: usize = 32;
/// Largest `ms` `<datalen>` (`INT_MAX - 2`, as for the storage commands).
const VLEN_MAX: i64 = i32::MAX as i64 - 2;

/// Which meta command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// `mg <key> <flag>*`: get, touch, vivify.
    Get,
    /// `ms <key> <datalen> <flag>*` and a data block.
    Set,
    /// `md <key> <flag>*`: delete or invalidate.
    Delete,
    /// `ma <key> <flag>*`: increment or decrement.
    Arith,
    /// `me <key> [b]`: the item's internals.
    Debug,
}

/// `ms`'s mode (`M` flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetMode {
    /// `MS` (the default): store.
    Set,
    /// `ME`: add (store if absent).
    Add,
    /// `MA`: append to a present value.
    Append,
    /// `MP`: prepend to a present value.
    Prepend,
    /// `MR`: replace a present value.
    Replace,
}

/// One flag as sent: its character and the token after it (empty for most).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flag {
    /// The flag character.
    pub c: u8,
    /// The bytes after the character (`T30`: `30`; the whole `O` token is `O` + this).
    pub token: Vec<u8>,
}

/// A decoded meta command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    /// Which command.
    pub verb: Verb,
    /// The key, base64-decoded if `b` was given (at most 250 bytes before decoding).
    pub key: Vec<u8>,
    /// `b`: the key was sent base64-encoded (returned keys are encoded too).
    pub base64: bool,
    /// Every flag, in the order sent.
    pub flags: Vec<Flag>,
    /// `q`: suppress the nominal reply (`EN` for `mg`, `HD` for `ms`/`md`, `HD`/`VA` for
    /// `ma`).
    pub quiet: bool,
    /// `v`: return the value.
    pub value: bool,
    /// `u`: do not bump the item (it stays unfetched, its access time unchanged).
    pub no_update: bool,
    /// `I`: invalidate (`md`: mark stale; `ms` with `C`: a lower CAS stores a stale item).
    pub invalidate: bool,
    /// `T`: the new expiry (the protocol's exptime rule).
    pub ttl: Option<i64>,
    /// `N`: vivify on a miss with this expiry.
    pub vivify: Option<i64>,
    /// `R`: win the recache token if the remaining TTL is below this.
    pub recache: Option<i64>,
    /// `F`: client flags to store (0 if absent).
    pub client_flags: u32,
    /// `C`: compare this CAS value.
    pub cas: Option<u64>,
    /// `ms`'s mode.
    pub set_mode: SetMode,
    /// `ma`'s mode: increment (`MI`, `M+`, default) or decrement (`MD`, `M-`).
    pub incr: bool,
    /// `J`: `ma`'s initial value on vivify.
    pub initial: u64,
    /// `D`: `ma`'s delta (default 1).
    pub delta: u64,
    /// `ms`'s data block (zero copy; empty for the other verbs).
    pub data: IoVec,
}

impl Meta {
    fn new(verb: Verb, key: &[u8]) -> Meta {
        Meta {
            verb,
            key: key.to_vec(),
            base64: false,
            flags: Vec::new(),
            quiet: false,
            value: false,
            no_update: false,
            invalidate: false,
            ttl: None,
            vivify: None,
            recache: None,
            client_flags: 0,
            cas: None,
            set_mode: SetMode::Set,
            incr: true,
            initial: 0,
            delta: 1,
            data: IoVec::new(),
        }
    }
}

fn num<T: core::str::FromStr>(t: &[u8]) -> Option<T> {
    core::str::from_utf8(t).ok()?.parse().ok()
}

/// memcached's base64 decoding of a key (`base64_decode`): bytes outside the alphabet
/// are skipped, the rest (`=` included) must be a non-zero multiple of 4, and decoding
/// stops after the first block with padding; `None` where memcached returns 0 (nothing
/// decoded, a bad count, three or four `=` in a block).
pub fn base64_decode(src: &[u8]) -> Option<Vec<u8>> {
    fn val(b: u8) -> Option<u8> {
        match b {
            b'A'..=b'Z' => Some(b - b'A'),
            b'a'..=b'z' => Some(b - b'a' + 26),
            b'0'..=b'9' => Some(b - b'0' + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            b'=' => Some(0),
            _ => None,
        }
    }
    let count = src.iter().filter(|&&b| val(b).is_some()).count();
    if count == 0 || count % 4 != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(count / 4 * 3);
    let (mut block, mut n, mut pad) = ([0u8; 4], 0, 0);
    for &b in src {
        let Some(v) = val(b) else { continue };
        pad += usize::from(b == b'=');
        block[n] = v;
        n += 1;
        if n == 4 {
            out.push((block[0] << 2) | (block[1] >> 4));
            out.push((block[1] << 4) | (block[2] >> 2));
            out.push((block[2] << 6) | block[3]);
            n = 0;
            if pad > 0 {
                if pad > 2 {
                    return None;
                }
                out.truncate(out.len() - pad);
                break;
            }
        }
    }
    if out.is_empty() {
        return None;
    }
    Some(out)
}

/// Standard base64 with padding (how memcached returns a binary key).
pub fn base64_encode(src: &[u8]) -> Vec<u8> {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(src.len().div_ceil(3) * 4);
    for c in src.chunks(3) {
        let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
        out.push(T[usize::from(b[0] >> 2)]);
        out.push(T[usize::from(((b[0] & 3) << 4) | (b[1] >> 4))]);
        out.push(if c.len() > 1 {
            T[usize::from(((b[1] & 0xf) << 2) | (b[2] >> 6))]
        } else {
            b'='
        });
        out.push(if c.len() > 2 {
            T[usize::from(b[2] & 0x3f)]
        } else {
            b'='
        });
    }
    out
}

/// `ms`'s `<datalen>` if the line is one whose data block memcached reads (stores or
/// swallows): a key of at most 250 bytes, at most [`TOKENS_MAX`] tokens, a length in
/// `0..=INT_MAX - 2`. Other bad `ms` lines are answered alone, their data then read as
/// commands, as memcached does.
pub(crate) fn set_bytes(t: &[&[u8]]) -> Option<usize> {
    if t.len() < 3 || t.len() > TOKENS_MAX || t[1].len() > KEY_MAX {
        return None;
    }
    let v = num::<i64>(t[2])?;
    (0..=VLEN_MAX).contains(&v).then_some(v as usize)
}

/// memcached's check of the flags (`_meta_flag_preparse`) into `m`: `Err` with the reply.
fn preparse(m: &mut Meta, flags: &[&[u8]]) -> Result<(), Error> {
    let mut seen = [false; 128];
    let mut err = None;
    for &f in flags {
        let c = f[0];
        // A byte above 126 is reported as a duplicate, as memcached does.
        if c >= 127 || seen[usize::from(c)] {
            return Err(Error::MetaDuplicateFlag);
        }
        seen[usize::from(c)] = true;
        let tok = &f[1..];
        match c {
            b'b' => {
                m.base64 = true;
                match base64_decode(&m.key) {
                    Some(k) => m.key = k,
                    None => {
                        m.key.clear();
                        err = Some(Error::MetaBadKey);
                    }
                }
            }
            b'N' | b'T' | b'R' => match num::<i64>(tok) {
                Some(e) => {
                    let slot = match c {
                        b'N' => &mut m.vivify,
                        b'T' => &mut m.ttl,
                        _ => &mut m.recache,
                    };
                    *slot = Some(e);
                }
                None => err = Some(Error::MetaBadToken),
            },
            b'l' | b'O' | b'P' | b'L' | b'k' | b's' | b't' | b'c' | b'f' | b'h' => {}
            b'v' => m.value = true,
            b'u' => m.no_update = true,
            b'q' => m.quiet = true,
            // memcached keeps the message of an earlier bad token (or the generic one).
            b'F' => match num::<u32>(tok) {
                Some(v) => m.client_flags = v,
                None => err = Some(err.unwrap_or(Error::BadFormat)),
            },
            b'C' => match num::<u64>(tok) {
                Some(v) => m.cas = Some(v),
                None => err = Some(Error::MetaBadToken),
            },
            b'M' => {
                if tok.len() != 1 {
                    err = Some(Error::MetaModeLength);
                } else {
                    match (m.verb, tok[0]) {
                        (Verb::Set, b'S') => m.set_mode = SetMode::Set,
                        (Verb::Set, b'E') => m.set_mode = SetMode::Add,
                        (Verb::Set, b'A') => m.set_mode = SetMode::Append,
                        (Verb::Set, b'P') => m.set_mode = SetMode::Prepend,
                        (Verb::Set, b'R') => m.set_mode = SetMode::Replace,
                        (Verb::Arith, b'I' | b'+') => m.incr = true,
                        (Verb::Arith, b'D' | b'-') => m.incr = false,
                        // A bad mode is reported after the flags ([`bad_mode`]); `mg` and
                        // `md` ignore the mode.
                        _ => {}
                    }
                }
            }
            b'J' => match num::<u64>(tok) {
                Some(v) => m.initial = v,
                None => err = Some(Error::MetaBadInitial),
            },
            b'D' => match num::<u64>(tok) {
                Some(v) => m.delta = v,
                None => err = Some(Error::MetaBadDelta),
            },
            b'I' => m.invalidate = true,
            _ => return Err(Error::MetaInvalidFlag),
        }
        m.flags.push(Flag {
            c,
            token: tok.to_vec(),
        });
    }
    err.map_or(Ok(()), Err)
}

/// The `M` flag's mode character if it is not one `verb` knows (`ms`: `SEAPR`; `ma`:
/// `I+D-`).
fn bad_mode(m: &Meta) -> bool {
    let Some(f) = m.flags.iter().find(|f| f.c == b'M') else {
        return false;
    };
    match m.verb {
        Verb::Set => !matches!(f.token[..], [b'S' | b'E' | b'A' | b'P' | b'R']),
        Verb::Arith => !matches!(f.token[..], [b'I' | b'+' | b'D' | b'-']),
        _ => false,
    }
}

fn opaque_too_long(m: &Meta) -> bool {
    m.flags
        .iter()
        .any(|f| f.c == b'O' && f.token.len() + 1 > OPAQUE_MAX)
}

/// What decoding a meta line gives: the command, or the error to answer.
pub(crate) type Decoded = Result<Meta, Error>;

/// Decodes a meta line's tokens `t` (`t[0]` is the verb: `mg`, `ms`, `md`, `ma` or `me`).
/// `msg` is the framed message and `line_len` the length of its command line (an `ms`
/// data block follows it).
pub(crate) fn decode(t: &[&[u8]], msg: &IoVec, line_len: usize) -> Decoded {
    let verb = match t[0] {
        b"mg" => Verb::Get,
        b"ms" => Verb::Set,
        b"md" => Verb::Delete,
        b"ma" => Verb::Arith,
        b"me" => Verb::Debug,
        _ => return Err(Error::Unknown),
    };
    if verb == Verb::Debug {
        // memcached's `me` has no flag parser: only `b` as the first token after the key.
        if t.len() < 2 || t[1].len() > KEY_MAX {
            return Err(Error::BadFormat);
        }
        let mut m = Meta::new(verb, t[1]);
        if t.len() >= 3 && t[2] == b"b" {
            m.key = base64_decode(t[1]).ok_or(Error::BadFormat)?;
            m.base64 = true;
        }
        return Ok(m);
    }
    if t.len() < 2 {
        return Err(Error::Unknown);
    }
    if t[1].len() > KEY_MAX {
        return Err(Error::BadFormat);
    }
    let mut m = Meta::new(verb, t[1]);
    match verb {
        Verb::Set => {
            if t.len() == 2 {
                return Err(Error::BadFormat);
            }
            if t.len() > TOKENS_MAX {
                return Err(Error::MetaFlagsTooLong);
            }
            let Some(bytes) = set_bytes(t) else {
                return Err(Error::BadFormat);
            };
            // From here memcached reads the data block whatever the outcome.
            preparse(&mut m, &t[3..])?;
            if bad_mode(&m) {
                return Err(Error::MetaSetMode);
            }
            if opaque_too_long(&m) {
                return Err(Error::MetaOpaqueTooLong);
            }
            if msg.len() == line_len {
                // Framed alone: the value was above the cap and is being swallowed.
                return Err(Error::TooLarge);
            }
            if msg.len() != line_len + bytes + 2 {
                return Err(Error::BadFormat);
            }
            let mut end = [0u8; 2];
            crate::parser::peek(msg, line_len + bytes, &mut end);
            if &end != b"\r\n" {
                return Err(Error::BadDataChunk);
            }
            m.data = msg.slice(line_len..line_len + bytes);
        }
        Verb::Get => {
            if t.len() > TOKENS_MAX {
                return Err(Error::MetaGetFlagsTooLong);
            }
            preparse(&mut m, &t[2..])?;
            if opaque_too_long(&m) {
                return Err(Error::MetaOpaqueTooLong);
            }
        }
        Verb::Delete | Verb::Arith => {
            if t.len() > TOKENS_MAX {
                return Err(Error::MetaFlagsTooLong);
            }
            // memcached answers every bad flag of `md` and `ma` with one message.
            preparse(&mut m, &t[2..]).map_err(|_| Error::MetaBadFlag)?;
            if bad_mode(&m) {
                return Err(Error::MetaArithMode);
            }
            if opaque_too_long(&m) {
                return Err(Error::MetaOpaqueTooLong);
            }
        }
        Verb::Debug => {}
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::super::text::tests::iov;
    use super::super::text::{Command, Request};
    use super::*;

    fn meta(s: &[u8]) -> Result<Meta, Error> {
        match Request::decode(&iov(s)) {
            Ok(Request {
                cmd: Command::Meta(m),
                noreply,
            }) => {
                assert!(!noreply, "meta commands carry q, not noreply");
                Ok(*m)
            }
            Ok(r) => panic!("not meta: {r:?}"),
            Err(rej) => {
                // A meta command's errors are always answered.
                assert!(!rej.noreply);
                Err(rej.error)
            }
        }
    }

    fn err(s: &str) -> &'static [u8] {
        meta(s.as_bytes()).unwrap_err().reply()
    }

    fn chars(m: &Meta) -> Vec<u8> {
        m.flags.iter().map(|f| f.c).collect()
    }

    #[test]
    fn mg_decodes_every_flag_in_order() {
        let m = meta(b"mg key s v f t c k O123 h l q u T30 N-1 R+5 P L\r\n").unwrap();
        assert_eq!(m.verb, Verb::Get);
        assert_eq!(m.key, b"key");
        assert_eq!(chars(&m), b"svftckOhlquTNRPL");
        assert!(m.value && m.quiet && m.no_update && !m.base64);
        assert_eq!((m.ttl, m.vivify, m.recache), (Some(30), Some(-1), Some(5)));
        let o = m.flags.iter().find(|f| f.c == b'O').unwrap();
        assert_eq!(o.token, b"123");
        // Tokens after a flag that takes none are ignored; mg ignores ms/ma flags.
        let m = meta(b"mg k vfoo D5 J1 I C7 F3 MZ\r\n").unwrap();
        assert!(m.value && m.invalidate);
        assert_eq!(
            (m.delta, m.initial, m.cas, m.client_flags),
            (5, 1, Some(7), 3)
        );
        // No flags at all; LF-only and extra spaces.
        assert!(meta(b"mg k\r\n").unwrap().flags.is_empty());
        assert_eq!(chars(&meta(b"mg   k   v   k  \n").unwrap()), b"vk");
    }

    #[test]
    fn flag_errors_are_memcached_1_6_18s() {
        assert_eq!(err("mg k x\r\n"), b"CLIENT_ERROR invalid flag\r\n");
        // 1.6.18 has no `E` (explicit CAS) flag yet.
        assert_eq!(err("mg k E5\r\n"), b"CLIENT_ERROR invalid flag\r\n");
        assert_eq!(err("mg k v v\r\n"), b"CLIENT_ERROR duplicate flag\r\n");
        assert_eq!(err("mg k \u{c3}\r\n"), b"CLIENT_ERROR duplicate flag\r\n");
        for l in [
            "mg k Tx\r\n",
            "mg k T\r\n",
            "mg k N1x\r\n",
            "mg k R-\r\n",
            "mg k Cz\r\n",
        ] {
            assert_eq!(
                err(l),
                b"CLIENT_ERROR bad token in command line format\r\n",
                "{l}"
            );
        }
        // A bad token is remembered and the check goes on: a duplicate after it wins,
        // a bad F keeps the earlier message (or the generic one).
        assert_eq!(err("mg k Tx v v\r\n"), b"CLIENT_ERROR duplicate flag\r\n");
        assert_eq!(
            err("mg k Tx Fz\r\n"),
            b"CLIENT_ERROR bad token in command line format\r\n"
        );
        assert_eq!(
            err("mg k Fz\r\n"),
            b"CLIENT_ERROR bad command line format\r\n"
        );
        assert_eq!(
            err("mg k F4294967296\r\n"),
            b"CLIENT_ERROR bad command line format\r\n"
        );
        assert_eq!(
            err("mg k MSS\r\n"),
            b"CLIENT_ERROR incorrect length for M token\r\n"
        );
        assert_eq!(
            err("mg k Jz\r\n"),
            b"CLIENT_ERROR invalid numeric initial value\r\n"
        );
        assert_eq!(
            err("mg k Dz\r\n"),
            b"CLIENT_ERROR invalid numeric delta value\r\n"
        );
        assert_eq!(
            err("ms k 1 Mxx Dx\r\nx\r\n"),
            b"CLIENT_ERROR invalid numeric delta value\r\n"
        );
        // md and ma answer every flag error alike.
        for l in [
            "md k x\r\n",
            "md k q q\r\n",
            "md k Cx\r\n",
            "ma k Dx\r\n",
            "ma k Jx\r\n",
            "ma k x\r\n",
            "ma k D-1\r\n",
        ] {
            assert_eq!(err(l), b"CLIENT_ERROR invalid or duplicate flag\r\n", "{l}");
        }
        // Opaque tokens up to 32 bytes, O included.
        let ok = format!("mg k O{}\r\n", "x".repeat(31));
        assert!(meta(ok.as_bytes()).is_ok());
        for v in ["mg k", "md k", "ma k", "ms k 1"] {
            let l = format!("{v} O{}\r\nx\r\n", "x".repeat(32));
            assert_eq!(err(&l), b"CLIENT_ERROR opaque token too long\r\n", "{v}");
        }
    }

    #[test]
    fn token_count_and_key_limits() {
        let flags = "v s t c f h k l q u O1 P L N1 R1 T1 M1";
        assert!(meta(format!("mg k {flags}\r\n").as_bytes()).is_ok());
        let l = format!("mg k {flags} I\r\n");
        assert_eq!(err(&l), b"CLIENT_ERROR options flags are too long\r\n");
        let l = "md k a b c d e f g h i j k l m n o p q r\r\n";
        assert_eq!(err(l), b"CLIENT_ERROR options flags too long\r\n");
        assert_eq!(
            err(&l.replace("md", "ma")),
            b"CLIENT_ERROR options flags too long\r\n"
        );
        // The verb alone: ERROR (me: a format error).
        for v in ["mg", "ms", "md", "ma"] {
            assert_eq!(err(&format!("{v}\r\n")), b"ERROR\r\n", "{v}");
        }
        assert_eq!(err("me\r\n"), b"CLIENT_ERROR bad command line format\r\n");
        let k251 = "a".repeat(251);
        for v in ["mg", "md", "ma", "me"] {
            let l = format!("{v} {k251} v\r\n");
            assert_eq!(err(&l), b"CLIENT_ERROR bad command line format\r\n", "{v}");
        }
        let l = format!("mg {} v\r\n", "a".repeat(250));
        assert!(meta(l.as_bytes()).is_ok());
    }

    #[test]
    fn base64_keys_decode_as_memcached_does() {
        assert_eq!(base64_decode(b"AP9r"), Some(vec![0, 0xff, b'k']));
        assert_eq!(base64_decode(b"QQ=="), Some(b"A".to_vec()));
        assert_eq!(base64_decode(b"QUI="), Some(b"AB".to_vec()));
        // Bytes outside the alphabet are skipped; decoding stops at the first padding.
        assert_eq!(base64_decode(b"Q!Q=="), Some(b"A".to_vec()));
        assert_eq!(base64_decode(b"QQ==QUJD"), Some(b"A".to_vec()));
        for bad in [&b"k"[..], b"k=", b"Q===", b"====", b"", b"!!!!"] {
            assert_eq!(base64_decode(bad), None, "{bad:?}");
        }
        for v in [&b""[..], b"\0", b"ab", b"abc", b"\xff\xfe\xfd\xfc"] {
            assert_eq!(base64_decode(&base64_encode(v)).unwrap_or_default(), v);
        }
        assert_eq!(base64_encode(b"\0\xffk"), b"AP9r");
        let m = meta(b"mg AP9r b k v\r\n").unwrap();
        assert_eq!((m.key, m.base64), (vec![0, 0xff, b'k'], true));
        assert_eq!(err("mg k b\r\n"), b"CLIENT_ERROR error decoding key\r\n");
        assert_eq!(
            err("md k b\r\n"),
            b"CLIENT_ERROR invalid or duplicate flag\r\n"
        );
        assert_eq!(
            err("me k b\r\n"),
            b"CLIENT_ERROR bad command line format\r\n"
        );
        // me: `b` only right after the key, other tokens ignored.
        let m = meta(b"me AP9r b\r\n").unwrap();
        assert_eq!(
            (m.verb, m.key, m.base64),
            (Verb::Debug, vec![0, 0xff, b'k'], true)
        );
        assert!(!meta(b"me k x b\r\n").unwrap().base64);
    }

    #[test]
    fn ms_frames_its_data_block_and_decodes_modes() {
        let s = b"ms k 5 T10 F7 C3 I MA c k Oab q\r\nhe\r\no\r\n";
        let m = meta(s).unwrap();
        assert_eq!(m.verb, Verb::Set);
        assert_eq!(m.data.to_vec(), b"he\r\no");
        assert_eq!((m.ttl, m.client_flags, m.cas), (Some(10), 7, Some(3)));
        assert!(m.invalidate && m.quiet);
        assert_eq!(m.set_mode, SetMode::Append);
        for (c, mode) in [
            ('S', SetMode::Set),
            ('E', SetMode::Add),
            ('A', SetMode::Append),
            ('P', SetMode::Prepend),
            ('R', SetMode::Replace),
        ] {
            let l = format!("ms k 1 M{c}\r\nx\r\n");
            assert_eq!(meta(l.as_bytes()).unwrap().set_mode, mode);
        }
        assert_eq!(
            err("ms k 1 MX\r\nx\r\n"),
            b"CLIENT_ERROR invalid mode for ms M token\r\n"
        );
        // A bad mode is named before a long opaque.
        let l = format!("ms k 1 O{} MZ\r\nx\r\n", "x".repeat(32));
        assert_eq!(err(&l), b"CLIENT_ERROR invalid mode for ms M token\r\n");
        assert_eq!(meta(b"ms k 0\r\n\r\n").unwrap().data.len(), 0);
        assert_eq!(meta(b"ms k +1\r\nx\r\n").unwrap().data.to_vec(), b"x");
        // As framed: the line and <datalen> + 2 bytes.
        assert_eq!(err("ms k 1\r\nxyz"), b"CLIENT_ERROR bad data chunk\r\n");
        assert_eq!(err("ms k 1 q\r\nx\nz"), b"CLIENT_ERROR bad data chunk\r\n");
    }

    fn frame_len(s: &[u8]) -> Result<super::super::Frame, crate::parser::ParseErrorKind> {
        super::super::text::frame(&iov(s), 1 << 20, &super::super::Limits::default(), &mut 0)
            .map_err(|e| e.kind())
    }

    #[test]
    fn ms_lines_memcached_reads_no_data_for_are_framed_alone() {
        use super::super::Frame;
        // The data block is framed (stored or swallowed) once the line has a key, a
        // length and at most 19 tokens ...
        for s in [
            &b"ms k 2 Z\r\nab\r\n"[..],
            b"ms k 2 T1 T2\r\nab\r\n",
            b"ms k 2 b\r\nab\r\n",
            b"ms k 2\r\nab\r\n",
        ] {
            assert_eq!(frame_len(s), Ok(Frame::msg(s.len())), "{s:?}");
        }
        assert_eq!(err("ms k 2 Z\r\nab\r\n"), b"CLIENT_ERROR invalid flag\r\n");
        assert_eq!(
            err("ms k 2 b\r\nab\r\n"),
            b"CLIENT_ERROR error decoding key\r\n"
        );
        // ... otherwise the line alone, its data then read as commands.
        let k251 = format!("ms {} 1\r\n", "a".repeat(251));
        let many = "ms k 1 a b c d e f g h i j k l m n o p q\r\n";
        for s in [
            "ms k\r\n",
            "ms k x\r\n",
            "ms k -1\r\n",
            "ms k 2147483646\r\n",
            &k251,
            many,
        ] {
            assert_eq!(frame_len(s.as_bytes()), Ok(Frame::msg(s.len())), "{s}");
        }
        assert_eq!(err("ms k\r\n"), b"CLIENT_ERROR bad command line format\r\n");
        assert_eq!(
            err("ms k x\r\n"),
            b"CLIENT_ERROR bad command line format\r\n"
        );
        assert_eq!(
            err("ms k 2147483646\r\n"),
            b"CLIENT_ERROR bad command line format\r\n"
        );
        assert_eq!(err(many), b"CLIENT_ERROR options flags too long\r\n");
        // Above the message cap: answered, and the value swallowed.
        let s = b"ms k 2147483645 T0\r\n";
        assert_eq!(
            frame_len(s),
            Ok(Frame {
                len: s.len(),
                swallow: 2147483647
            })
        );
        assert_eq!(
            err("ms k 2147483645 T0\r\n"),
            b"SERVER_ERROR object too large for cache\r\n"
        );
    }

    #[test]
    fn md_and_ma_decode_their_flags() {
        let m = meta(b"md k C5 I T30 q k O1 b2\r\n");
        // `b2` is `b` with a token: the key "k" is not base64.
        assert_eq!(m.unwrap_err(), Error::MetaBadFlag);
        let m = meta(b"md k C5 I T30 q k O1\r\n").unwrap();
        assert_eq!((m.verb, m.cas, m.ttl), (Verb::Delete, Some(5), Some(30)));
        assert!(m.invalidate && m.quiet);
        // md ignores a mode.
        assert!(meta(b"md k MZ\r\n").is_ok());
        let m = meta(b"ma k\r\n").unwrap();
        assert_eq!(
            (m.verb, m.incr, m.delta, m.initial),
            (Verb::Arith, true, 1, 0)
        );
        let m = meta(b"ma k N0 J10 D18446744073709551615 MD v t c\r\n").unwrap();
        assert_eq!(
            (m.vivify, m.initial, m.delta, m.incr),
            (Some(0), 10, u64::MAX, false)
        );
        for (c, incr) in [('I', true), ('+', true), ('D', false), ('-', false)] {
            assert_eq!(
                meta(format!("ma k M{c}\r\n").as_bytes()).unwrap().incr,
                incr
            );
        }
        assert_eq!(
            err("ma k MX\r\n"),
            b"CLIENT_ERROR invalid mode for ma M token\r\n"
        );
        assert_eq!(
            err("ma k D18446744073709551616\r\n"),
            b"CLIENT_ERROR invalid or duplicate flag\r\n"
        );
    }

    /// Regression: every meta line in the differential test decodes without a panic,
    /// whatever is cut from its end.
    #[test]
    fn truncated_meta_lines_never_panic() {
        let lines: &[&[u8]] = &[
            b"ms k 5 T10 F7 C3 I MA c k Oab q\r\nhe\r\no\r\n",
            b"mg AP9r b k v N30 R5 T-1 t\r\n",
            b"ma k N0 J10 D5 MD v t c q O1 k b\r\n",
            b"me AP9r b\r\n",
            b"md k C5 I T30 q k O1\r\n",
        ];
        for l in lines {
            for n in 0..=l.len() {
                let _ = Request::decode(&iov(&l[..n]));
            }
        }
    }
}
