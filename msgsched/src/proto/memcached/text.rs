//! The memcached text (ASCII) protocol: framing and request decoding.
//!
//! A message is one command line, plus for a storage command (`set`, `add`, `replace`,
//! `append`, `prepend`, `cas`, and the meta `ms`) its data block: exactly `<bytes>` bytes
//! and `\r\n`, framed by the count. See the [module docs](super) for errors, line endings
//! and caps, and [`super::meta`] for the meta commands.

use super::{meta, Frame, Limits, KEY_MAX};
use crate::parser::{peek, ParseError, ParseErrorKind};
use zbuf::IoVec;

/// The index of the first `\n` within the first `limit` bytes of `buf`, looking from
/// `from` on (the bytes before it are known to hold none). The segments before `from` are
/// skipped from the back, so a call costs the new segments, not all of them.
fn find_lf(buf: &IoVec, from: usize, limit: usize) -> Option<usize> {
    let segs = buf.segments();
    let (mut idx, mut at) = (segs.len(), buf.len());
    while idx > 0 && at > from {
        idx -= 1;
        at -= segs[idx].len();
    }
    for z in &segs[idx..] {
        if at >= limit {
            break;
        }
        let n = z.len().min(limit - at);
        let skip = from.saturating_sub(at).min(n);
        if let Some(i) = z[skip..n].iter().position(|&b| b == b'\n') {
            return Some(at + skip + i);
        }
        at += z.len();
    }
    None
}

/// Whether a line starting with `head` is a retrieval command (whose lines may be long).
fn is_retrieval(head: &[u8]) -> bool {
    let s = head.iter().position(|&b| b != b' ').unwrap_or(head.len());
    let h = &head[s..];
    ["get ", "gets ", "gat ", "gats "]
        .iter()
        .any(|c| h.starts_with(c.as_bytes()))
}

/// Whether a command line starting with `head` only reads the store (`get`, `gets`):
/// such commands may run side by side ([`crate::parser::Parser::exclusive`]).
pub(crate) fn is_read(head: &[u8]) -> bool {
    let s = head.iter().position(|&b| b != b' ').unwrap_or(head.len());
    let h = &head[s..];
    ["get ", "gets "]
        .iter()
        .any(|c| h.starts_with(c.as_bytes()))
}

/// The line without its `\n` and one `\r` before it.
fn strip_eol(line: &[u8]) -> &[u8] {
    let l = line.strip_suffix(b"\n").unwrap_or(line);
    l.strip_suffix(b"\r").unwrap_or(l)
}

/// memcached's tokenizer: words separated by one or more spaces.
fn tokens(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|&b| b == b' ').filter(|t| !t.is_empty())
}

fn num<T: core::str::FromStr>(t: &[u8]) -> Option<T> {
    core::str::from_utf8(t).ok()?.parse().ok()
}

/// Largest `<bytes>` memcached accepts (`INT_MAX - 2`).
const VLEN_MAX: i64 = i32::MAX as i64 - 2;

/// Storage command with a syntactically valid line: its `<bytes>`.
fn storage_bytes(line: &[u8]) -> Option<usize> {
    // Enough tokens to tell a meta line over its token limit.
    let t: Vec<&[u8]> = tokens(line).take(meta::TOKENS_MAX + 1).collect();
    let (cmd, n) = (*t.first()?, t.len());
    if cmd == b"ms" {
        return meta::set_bytes(&t);
    }
    let ok_count = match cmd {
        b"set" | b"add" | b"replace" | b"append" | b"prepend" => n == 5 || n == 6,
        b"cas" => n == 6 || n == 7,
        _ => false,
    };
    if !ok_count || t[1].len() > KEY_MAX {
        return None;
    }
    num::<u32>(t[2])?;
    num::<i64>(t[3])?;
    let v = num::<i64>(t[4])?;
    if !(0..=VLEN_MAX).contains(&v) {
        return None;
    }
    if cmd == b"cas" {
        num::<u64>(t[5])?;
    }
    Some(v as usize)
}

/// Frames the message at the head of a text stream. `scanned`: how many head bytes an
/// earlier call found without a `\n` (so a line arriving a byte at a time is scanned once,
/// not once per byte); reset when a message is framed.
pub(crate) fn frame(
    buf: &IoVec,
    max: usize,
    lim: &Limits,
    scanned: &mut usize,
) -> Result<Frame, ParseError> {
    let cap = lim.line_max.max(lim.multiget_max).min(max);
    let Some(lf) = find_lf(buf, *scanned, cap) else {
        *scanned = buf.len().min(cap);
        if buf.len() > lim.line_max.min(max) {
            let mut head = [0u8; 16];
            let n = head.len().min(buf.len());
            peek(buf, 0, &mut head[..n]);
            if !is_retrieval(&head[..n]) || buf.len() >= lim.multiget_max.min(max) {
                return Err(ParseError::new(
                    ParseErrorKind::TooLarge,
                    "memcached: command line without a newline within the line cap",
                ));
            }
        }
        return Ok(Frame::MORE);
    };
    *scanned = 0;
    let line_len = lf + 1;
    let mut line = vec![0u8; line_len.min(lim.line_max)];
    peek(buf, 0, &mut line);
    if line_len > lim.line_max {
        if !is_retrieval(&line) {
            return Err(ParseError::new(
                ParseErrorKind::TooLarge,
                "memcached: command line above the line cap",
            ));
        }
        return Ok(Frame::msg(line_len));
    }
    let Some(bytes) = storage_bytes(strip_eol(&line)) else {
        // Not a storage command, or a bad one: the line alone (the server answers it).
        return Ok(Frame::msg(line_len));
    };
    let total = line_len as u64 + bytes as u64 + 2;
    if total > max as u64 {
        // memcached: SERVER_ERROR object too large for cache, then swallows the value.
        return Ok(Frame {
            len: line_len,
            swallow: bytes as u64 + 2,
        });
    }
    Ok(Frame::msg(total as usize))
}

/// What to write before closing a text connection whose stream failed: every text
/// framing error is a line over its cap, answered `CLIENT_ERROR line too long`
/// (a `CLIENT_ERROR` line is the protocol's answer to input that does not conform;
/// memcached itself closes without it).
pub(crate) const LINE_TOO_LONG: &[u8] = b"CLIENT_ERROR line too long\r\n";

/// The farewell of a connection shut down for the I/O core's memory budget
/// ([`crate::parser::ParseErrorKind::Memory`]): memcached's words when it cannot store.
pub(crate) const OUT_OF_MEMORY: &[u8] = b"SERVER_ERROR out of memory storing object\r\n";

/// A storage command's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    /// Store unconditionally.
    Set,
    /// Store if absent.
    Add,
    /// Store if present.
    Replace,
    /// Append to a present value.
    Append,
    /// Prepend to a present value.
    Prepend,
    /// Store if the item's CAS value is the one given.
    Cas(u64),
}

/// A decoded text command. Keys are copied out of the line (at most 250 bytes each);
/// a storage value is a slice of the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `set|add|replace|append|prepend|cas <key> <flags> <exptime> <bytes> [cas] [noreply]`.
    Store {
        /// Which storage command.
        op: StoreOp,
        /// The key.
        key: Vec<u8>,
        /// Opaque client flags.
        flags: u32,
        /// Expiry as sent (0 never; up to 30 days relative seconds; else Unix time;
        /// negative: already expired).
        exptime: i64,
        /// The data block (zero copy).
        value: IoVec,
    },
    /// `get|gets <key>*` (`gets`: with CAS values); `gat|gats <exptime> <key>*` also
    /// touch.
    Get {
        /// The keys, in order.
        keys: Vec<Vec<u8>>,
        /// Whether to include CAS values.
        cas: bool,
        /// `gat`/`gats`: the new expiry.
        touch: Option<i64>,
    },
    /// `delete <key> [0] [noreply]`.
    Delete {
        /// The key.
        key: Vec<u8>,
    },
    /// `incr|decr <key> <delta> [noreply]`.
    Arith {
        /// The key.
        key: Vec<u8>,
        /// Increment (else decrement).
        incr: bool,
        /// The amount.
        delta: u64,
    },
    /// `touch <key> <exptime> [noreply]`.
    Touch {
        /// The key.
        key: Vec<u8>,
        /// The new expiry.
        exptime: i64,
    },
    /// `flush_all [delay] [noreply]`.
    FlushAll {
        /// Seconds until the flush (0: now).
        delay: i64,
    },
    /// `version`.
    Version,
    /// `verbosity <level> [noreply]`.
    Verbosity,
    /// `stats [group]`.
    Stats(StatsGroup),
    /// `mn`, the meta no-op: answered `MN`.
    MetaNoop,
    /// `mg`, `ms`, `md`, `ma`, `me`: see [`meta`].
    Meta(Box<meta::Meta>),
    /// `quit`: close the connection.
    Quit,
}

/// Which `stats` the client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsGroup {
    /// `stats`: the general counters.
    General,
    /// `stats items`: per-slab-class item counts (luna-kv: one class).
    Items,
    /// `stats reset [...]`: zero the counters, answered `RESET`.
    Reset,
    /// `stats detail dump`: the per-prefix counters (none kept: `END`).
    DetailDump,
    /// `stats detail on` (true) / `stats detail off` (false).
    Detail(bool),
    /// `stats detail` with anything else:
    /// `CLIENT_ERROR usage: stats detail on|off|dump`.
    DetailUsage,
}

/// A decoded text request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The command.
    pub cmd: Command,
    /// `noreply` was given: the server sends nothing back for this command (not even an
    /// error, as memcached).
    pub noreply: bool,
}

/// What the server answers a request it cannot carry out (the reply line; memcached's
/// exact strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// Unknown command or wrong number of tokens: `ERROR`.
    Unknown,
    /// A bad command line: `CLIENT_ERROR bad command line format`.
    BadFormat,
    /// `touch`, `gat`/`gats`, `flush_all` with an exptime that is not a number:
    /// `CLIENT_ERROR invalid exptime argument`.
    BadExptime,
    /// A storage command's data not followed by `\r\n`: `CLIENT_ERROR bad data chunk`.
    BadDataChunk,
    /// `incr`/`decr` with a bad delta: `CLIENT_ERROR invalid numeric delta argument`.
    BadDelta,
    /// `delete` with extra arguments.
    BadDelete,
    /// A value above the cap (the data was swallowed):
    /// `SERVER_ERROR object too large for cache`.
    TooLarge,
    /// `mg` with more than [`meta::TOKENS_MAX`] tokens.
    MetaGetFlagsTooLong,
    /// `ms`, `md`, `ma` with more than [`meta::TOKENS_MAX`] tokens.
    MetaFlagsTooLong,
    /// A meta flag given twice (or a byte above 126).
    MetaDuplicateFlag,
    /// An unknown meta flag.
    MetaInvalidFlag,
    /// `md`/`ma`: any bad flag.
    MetaBadFlag,
    /// `b` with a key that is not base64.
    MetaBadKey,
    /// `N`, `T`, `R` or `C` with a bad number.
    MetaBadToken,
    /// `M` with other than one character.
    MetaModeLength,
    /// `J` with a bad number.
    MetaBadInitial,
    /// `D` with a bad number.
    MetaBadDelta,
    /// An `O` token over 32 bytes.
    MetaOpaqueTooLong,
    /// `ms` with a mode other than `SEAPR`.
    MetaSetMode,
    /// `ma` with a mode other than `I+D-`.
    MetaArithMode,
}

impl Error {
    /// The reply line, `\r\n` included.
    pub fn reply(self) -> &'static [u8] {
        match self {
            Error::Unknown => b"ERROR\r\n",
            Error::BadFormat => b"CLIENT_ERROR bad command line format\r\n",
            Error::BadExptime => b"CLIENT_ERROR invalid exptime argument\r\n",
            Error::BadDataChunk => b"CLIENT_ERROR bad data chunk\r\n",
            Error::BadDelta => b"CLIENT_ERROR invalid numeric delta argument\r\n",
            Error::BadDelete => {
                b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"
            }
            Error::TooLarge => b"SERVER_ERROR object too large for cache\r\n",
            Error::MetaGetFlagsTooLong => b"CLIENT_ERROR options flags are too long\r\n",
            Error::MetaFlagsTooLong => b"CLIENT_ERROR options flags too long\r\n",
            Error::MetaDuplicateFlag => b"CLIENT_ERROR duplicate flag\r\n",
            Error::MetaInvalidFlag => b"CLIENT_ERROR invalid flag\r\n",
            Error::MetaBadFlag => b"CLIENT_ERROR invalid or duplicate flag\r\n",
            Error::MetaBadKey => b"CLIENT_ERROR error decoding key\r\n",
            Error::MetaBadToken => b"CLIENT_ERROR bad token in command line format\r\n",
            Error::MetaModeLength => b"CLIENT_ERROR incorrect length for M token\r\n",
            Error::MetaBadInitial => b"CLIENT_ERROR invalid numeric initial value\r\n",
            Error::MetaBadDelta => b"CLIENT_ERROR invalid numeric delta value\r\n",
            Error::MetaOpaqueTooLong => b"CLIENT_ERROR opaque token too long\r\n",
            Error::MetaSetMode => b"CLIENT_ERROR invalid mode for ms M token\r\n",
            Error::MetaArithMode => b"CLIENT_ERROR invalid mode for ma M token\r\n",
        }
    }
}

/// A decode failure: the error and whether the command asked for no reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejected {
    /// What to answer.
    pub error: Error,
    /// Whether the line ended in `noreply` (then nothing is sent).
    pub noreply: bool,
}

fn key_ok(k: &[u8]) -> bool {
    !k.is_empty() && k.len() <= KEY_MAX
}

impl Request {
    /// Decodes one framed text message (as [`super::McParser`] frames them).
    pub fn decode(msg: &IoVec) -> Result<Request, Rejected> {
        let line_len = find_lf(msg, 0, msg.len()).map_or(msg.len(), |i| i + 1);
        let mut head = vec![0u8; line_len];
        peek(msg, 0, &mut head);
        let line = strip_eol(&head[..line_len]);
        let t: Vec<&[u8]> = tokens(line).collect();
        let noreply = t.len() > 1 && t.last() == Some(&&b"noreply"[..]);
        // memcached reads `noreply` only in the handlers of commands that take it, after
        // their token count is checked: an unknown command or a wrong count always gets
        // its `ERROR`.
        let rej = |error| Rejected {
            error,
            noreply: noreply && error != Error::Unknown,
        };
        let Some(&cmd) = t.first() else {
            return Err(rej(Error::Unknown));
        };
        let n = t.len();
        let key = |i: usize| -> Result<Vec<u8>, Rejected> {
            let k = t[i];
            if key_ok(k) {
                Ok(k.to_vec())
            } else {
                Err(rej(Error::BadFormat))
            }
        };
        let done = |cmd| Ok(Request { cmd, noreply });
        match cmd {
            b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas" => {
                let is_cas = cmd == b"cas";
                let base = if is_cas { 6 } else { 5 };
                // memcached takes one token more than the command's, whatever it is: it
                // is `noreply` or ignored (`set k 0 0 1 foo` stores).
                if n != base && n != base + 1 {
                    return Err(rej(Error::Unknown));
                }
                let key = key(1)?;
                let (Some(flags), Some(exptime), Some(bytes)) =
                    (num::<u32>(t[2]), num::<i64>(t[3]), num::<i64>(t[4]))
                else {
                    return Err(rej(Error::BadFormat));
                };
                if !(0..=VLEN_MAX).contains(&bytes) {
                    return Err(rej(Error::BadFormat));
                }
                let op = match cmd {
                    b"set" => StoreOp::Set,
                    b"add" => StoreOp::Add,
                    b"replace" => StoreOp::Replace,
                    b"append" => StoreOp::Append,
                    b"prepend" => StoreOp::Prepend,
                    _ => StoreOp::Cas(num::<u64>(t[5]).ok_or(rej(Error::BadFormat))?),
                };
                let bytes = bytes as usize;
                if msg.len() == line_len {
                    // Framed alone: the value was above the cap and is being swallowed.
                    return Err(rej(Error::TooLarge));
                }
                if msg.len() != line_len + bytes + 2 {
                    return Err(rej(Error::BadFormat));
                }
                let mut end = [0u8; 2];
                peek(msg, line_len + bytes, &mut end);
                if &end != b"\r\n" {
                    return Err(rej(Error::BadDataChunk));
                }
                done(Command::Store {
                    op,
                    key,
                    flags,
                    exptime,
                    value: msg.slice(line_len..line_len + bytes),
                })
            }
            b"get" | b"gets" | b"gat" | b"gats" => {
                let touch = cmd.starts_with(b"gat");
                let first = if touch { 2 } else { 1 };
                // A retrieval command needs one token after its name: `get` alone is an
                // ERROR, `gat 100` (no key) an empty answer, `END`, as memcached.
                if n < 2 {
                    return Err(rej(Error::Unknown));
                }
                let exptime = if touch {
                    Some(num::<i64>(t[1]).ok_or(rej(Error::BadExptime))?)
                } else {
                    None
                };
                let mut keys = Vec::with_capacity(n.saturating_sub(first));
                for &k in &t[first..] {
                    if !key_ok(k) {
                        return Err(Rejected {
                            error: Error::BadFormat,
                            noreply: false,
                        });
                    }
                    keys.push(k.to_vec());
                }
                Ok(Request {
                    cmd: Command::Get {
                        keys,
                        cas: cmd.ends_with(b"s"),
                        touch: exptime,
                    },
                    noreply: false,
                })
            }
            b"delete" => {
                // memcached: `delete <key> [0] [noreply]`; anything else is a usage error.
                if !(2..=4).contains(&n) {
                    return Err(rej(Error::Unknown));
                }
                // `delete noreply` deletes the key "noreply" silently, as memcached.
                let extra = (n - 2).saturating_sub(usize::from(noreply));
                if extra > 1 || (extra == 1 && t[2] != b"0") {
                    return Err(rej(Error::BadDelete));
                }
                done(Command::Delete { key: key(1)? })
            }
            b"incr" | b"decr" => {
                // As for storage commands, one more token is `noreply` or ignored.
                if n != 3 && n != 4 {
                    return Err(rej(Error::Unknown));
                }
                let key = key(1)?;
                let delta = num::<u64>(t[2]).ok_or(rej(Error::BadDelta))?;
                done(Command::Arith {
                    key,
                    incr: cmd == b"incr",
                    delta,
                })
            }
            b"touch" => {
                if n != 3 && n != 4 {
                    return Err(rej(Error::Unknown));
                }
                let key = key(1)?;
                let exptime = num::<i64>(t[2]).ok_or(rej(Error::BadExptime))?;
                done(Command::Touch { key, exptime })
            }
            b"flush_all" => {
                // memcached: `flush_all [delay] [noreply]`, up to two tokens after the
                // name; unless the only one is `noreply`, the first is the delay.
                if n > 3 {
                    return Err(rej(Error::Unknown));
                }
                let delay = if n - 1 == usize::from(noreply) {
                    0
                } else {
                    num::<i64>(t[1]).ok_or(rej(Error::BadExptime))?
                };
                done(Command::FlushAll { delay })
            }
            // memcached 1.6 ignores extra tokens of these, `noreply` included
            // (`version noreply` is answered).
            b"version" | b"quit" => Ok(Request {
                cmd: if cmd == b"version" {
                    Command::Version
                } else {
                    Command::Quit
                },
                noreply: false,
            }),
            // Other statistics groups (`stats slabs`, `stats settings`, ...) are not
            // kept: ERROR, as memcached answers a group it does not know (and
            // `stats noreply`). memcached ignores tokens after a group's own.
            b"stats" => {
                let group = match (t.get(1).copied(), t.get(2).copied()) {
                    (None, _) => StatsGroup::General,
                    (Some(b"items"), _) => StatsGroup::Items,
                    (Some(b"reset"), _) => StatsGroup::Reset,
                    (Some(b"detail"), Some(b"dump")) => StatsGroup::DetailDump,
                    (Some(b"detail"), Some(b"on")) => StatsGroup::Detail(true),
                    (Some(b"detail"), Some(b"off")) => StatsGroup::Detail(false),
                    (Some(b"detail"), _) => StatsGroup::DetailUsage,
                    _ => return Err(rej(Error::Unknown)),
                };
                Ok(Request {
                    cmd: Command::Stats(group),
                    noreply: false,
                })
            }
            b"verbosity" if n == 2 || n == 3 => {
                // The level must be a number (`verbosity noreply` is a silent error).
                num::<u64>(t[1]).ok_or(rej(Error::BadFormat))?;
                done(Command::Verbosity)
            }
            // memcached answers `mn` whatever follows it.
            b"mn" => Ok(Request {
                cmd: Command::MetaNoop,
                noreply: false,
            }),
            // A meta command's errors are always answered (`q` only quiets nominal
            // replies, which the server decides).
            b"mg" | b"ms" | b"md" | b"ma" | b"me" => match meta::decode(&t, msg, line_len) {
                Ok(m) => Ok(Request {
                    cmd: Command::Meta(Box::new(m)),
                    noreply: false,
                }),
                Err(error) => Err(Rejected {
                    error,
                    noreply: false,
                }),
            },
            _ => Err(rej(Error::Unknown)),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use zbuf::Zbuf;

    /// `b` in three segments (also the meta commands' tests).
    pub(in crate::proto::memcached) fn iov(b: &[u8]) -> IoVec {
        // Three segments, so decoding crosses segment boundaries.
        let (a, rest) = b.split_at(b.len() / 3);
        let (m, c) = rest.split_at(rest.len() / 2);
        [a, m, c].iter().map(|p| Zbuf::copy_from_slice(p)).collect()
    }

    fn fr(b: &[u8], max: usize) -> Result<Frame, ParseErrorKind> {
        frame(&iov(b), max, &Limits::default(), &mut 0).map_err(|e| e.kind())
    }

    /// Regression (review): a multiget line arriving a byte at a time was rescanned from
    /// its start on every byte (quadratic work on the I/O core); the scan now resumes.
    #[test]
    fn a_line_arriving_byte_by_byte_is_scanned_once() {
        let line = format!("get {}\r\n", "k ".repeat(20_000));
        let lim = Limits::default();
        let mut scanned = 0;
        let mut buf = IoVec::new();
        for (i, b) in line.bytes().enumerate() {
            buf.push(Zbuf::copy_from_slice(&[b]));
            let f = frame(&buf, 1 << 20, &lim, &mut scanned).unwrap();
            if i + 1 < line.len() {
                assert_eq!(f, Frame::MORE);
                assert_eq!(scanned, i + 1);
            } else {
                assert_eq!(f, Frame::msg(line.len()));
                assert_eq!(scanned, 0);
            }
        }
    }

    #[test]
    fn storage_commands_are_framed_by_their_byte_count_not_by_searching() {
        // The data contains "\r\n" and a whole command: the count decides.
        let m = b"set k 0 0 12\r\nab\r\nget x\r\n!\r\n";
        assert_eq!(fr(m, 1 << 20), Ok(Frame::msg(m.len())));
        assert_eq!(fr(&m[..20], 1 << 20), Ok(Frame::msg(m.len())));
        assert_eq!(fr(b"set k 0 0 12", 1 << 20), Ok(Frame::MORE));
        let r = Request::decode(&iov(m)).unwrap();
        let Command::Store { value, op, .. } = r.cmd else {
            panic!()
        };
        assert_eq!(op, StoreOp::Set);
        assert_eq!(value.to_vec(), b"ab\r\nget x\r\n!");
    }

    #[test]
    fn lf_only_lines_frame_and_decode_like_crlf_lines() {
        // CVE-2023-46853 class: the ending must not shift the token or key count.
        for nl in ["\n", "\r\n"] {
            let g = format!("get a bb ccc{nl}");
            assert_eq!(fr(g.as_bytes(), 1 << 20), Ok(Frame::msg(g.len())));
            let r = Request::decode(&iov(g.as_bytes())).unwrap();
            assert_eq!(
                r.cmd,
                Command::Get {
                    keys: vec![b"a".to_vec(), b"bb".to_vec(), b"ccc".to_vec()],
                    cas: false,
                    touch: None
                }
            );
            let s = format!("set kk 5 0 2{nl}hi\r\n");
            assert_eq!(fr(s.as_bytes(), 1 << 20), Ok(Frame::msg(s.len())));
            let r = Request::decode(&iov(s.as_bytes())).unwrap();
            assert!(matches!(r.cmd, Command::Store { ref key, flags: 5, .. } if key == b"kk"));
        }
        // The data block itself must end in CRLF: an LF-only one is a bad data chunk, and
        // exactly <bytes> + 2 bytes were consumed either way.
        let s = b"set kk 0 0 2\nhi\nX";
        assert_eq!(fr(s, 1 << 20), Ok(Frame::msg(s.len())));
        assert_eq!(
            Request::decode(&iov(s)).unwrap_err().error,
            Error::BadDataChunk
        );
    }

    #[test]
    fn keys_over_250_bytes_get_client_error_and_no_data_is_swallowed() {
        let k = "k".repeat(251);
        let s = format!("set {k} 0 0 1\r\n");
        // The line alone: the data that follows is read as commands, as memcached does.
        assert_eq!(fr(s.as_bytes(), 1 << 20), Ok(Frame::msg(s.len())));
        assert_eq!(
            Request::decode(&iov(s.as_bytes())).unwrap_err().error,
            Error::BadFormat
        );
        let g = format!("get a {k}\r\n");
        assert_eq!(
            Request::decode(&iov(g.as_bytes())).unwrap_err().error,
            Error::BadFormat
        );
        let k250 = "k".repeat(250);
        let g = format!("get {k250}\r\n");
        assert!(Request::decode(&iov(g.as_bytes())).is_ok());
    }

    #[test]
    fn huge_or_negative_byte_counts_are_client_errors_not_allocations() {
        for b in ["-1", "2147483646", "99999999999999999999", "1x"] {
            let s = format!("set k 0 0 {b}\r\n");
            let f = fr(s.as_bytes(), 1 << 20).unwrap();
            // 2147483646 > INT_MAX - 2: a format error; the others do not parse.
            assert_eq!(f, Frame::msg(s.len()), "{b}");
            assert_eq!(
                Request::decode(&iov(s.as_bytes())).unwrap_err().error,
                Error::BadFormat,
                "{b}"
            );
        }
        // Valid but above the cap: the line, then the value is swallowed.
        let s = b"set k 0 0 2147483645\r\n";
        assert_eq!(
            fr(s, 1 << 20),
            Ok(Frame {
                len: s.len(),
                swallow: 2147483647
            })
        );
        assert_eq!(Request::decode(&iov(s)).unwrap_err().error, Error::TooLarge);
    }

    #[test]
    fn long_lines_close_and_long_multigets_are_bounded() {
        let lim = Limits::default();
        let junk = vec![b'a'; lim.line_max + 1];
        assert_eq!(fr(&junk, 1 << 20), Err(ParseErrorKind::TooLarge));
        let mut long = b"set ".to_vec();
        long.extend(vec![b'k'; lim.line_max]);
        long.extend(b"\r\n");
        assert_eq!(fr(&long, 1 << 20), Err(ParseErrorKind::TooLarge));
        // A multiget above line_max but below its own cap is fine ...
        let keys: Vec<String> = (0..2000).map(|i| format!("key{i}")).collect();
        let g = format!("get {}\r\n", keys.join(" "));
        assert!(g.len() > lim.line_max && g.len() < lim.multiget_max);
        assert_eq!(fr(&g.as_bytes()[..g.len() - 2], 1 << 20), Ok(Frame::MORE));
        assert_eq!(fr(g.as_bytes(), 1 << 20), Ok(Frame::msg(g.len())));
        let Command::Get { keys: k, .. } = Request::decode(&iov(g.as_bytes())).unwrap().cmd else {
            panic!()
        };
        assert_eq!(k.len(), 2000);
        // ... and one over it closes the connection.
        let big = format!("get {}", "k ".repeat(lim.multiget_max));
        assert_eq!(fr(big.as_bytes(), 1 << 20), Err(ParseErrorKind::TooLarge));
        let mut big = big.into_bytes();
        big.extend(b"\r\n");
        assert_eq!(fr(&big, 1 << 20), Err(ParseErrorKind::TooLarge));
    }

    #[test]
    fn commands_decode_with_noreply_and_errors_match_memcached() {
        let d = |s: &str| Request::decode(&iov(s.as_bytes()));
        assert_eq!(
            d("incr n 5 noreply\r\n").unwrap(),
            Request {
                cmd: Command::Arith {
                    key: b"n".to_vec(),
                    incr: true,
                    delta: 5
                },
                noreply: true
            }
        );
        assert_eq!(d("incr n x\r\n").unwrap_err().error, Error::BadDelta);
        assert_eq!(d("incr n -1\r\n").unwrap_err().error, Error::BadDelta);
        assert_eq!(
            d("delete a 0\r\n").unwrap().cmd,
            Command::Delete { key: b"a".to_vec() }
        );
        assert_eq!(d("delete a 5\r\n").unwrap_err().error, Error::BadDelete);
        assert_eq!(d("bogus\r\n").unwrap_err().error, Error::Unknown);
        assert_eq!(d("delete\r\n").unwrap_err().error, Error::Unknown);
        assert_eq!(
            d("delete noreply\r\n").unwrap(),
            Request {
                cmd: Command::Delete {
                    key: b"noreply".to_vec()
                },
                noreply: true
            }
        );
        assert_eq!(d("\r\n").unwrap_err().error, Error::Unknown);
        assert_eq!(d("get\r\n").unwrap_err().error, Error::Unknown);
        assert_eq!(d("set k 0 0\r\n").unwrap_err().error, Error::Unknown);
        assert_eq!(d("version\r\n").unwrap().cmd, Command::Version);
        // memccapable's expectations of a 1.6 server.
        assert_eq!(
            d("version noreply\r\n").unwrap(),
            Request {
                cmd: Command::Version,
                noreply: false
            }
        );
        assert_eq!(d("version foo bar\r\n").unwrap().cmd, Command::Version);
        assert_eq!(
            d("verbosity foo bar my\r\n").unwrap_err().error,
            Error::Unknown
        );
        assert_eq!(d("verbosity\r\n").unwrap_err().error, Error::Unknown);
        // memcached parses the level: `noreply` is not one, a CLIENT_ERROR it does not
        // send (the line asked for no reply).
        assert_eq!(
            d("verbosity noreply\r\n").unwrap_err(),
            Rejected {
                error: Error::BadFormat,
                noreply: true
            }
        );
        assert_eq!(d("delete a b c d e\r\n").unwrap_err().error, Error::Unknown);
        assert_eq!(d("stats noreply\r\n").unwrap_err().error, Error::Unknown);
        assert_eq!(
            d("stats\r\n").unwrap().cmd,
            Command::Stats(StatsGroup::General)
        );
        assert_eq!(d("quit\n").unwrap().cmd, Command::Quit);
        assert_eq!(
            d("flush_all noreply\r\n").unwrap(),
            Request {
                cmd: Command::FlushAll { delay: 0 },
                noreply: true
            }
        );
        assert_eq!(
            d("touch k 10\r\n").unwrap().cmd,
            Command::Touch {
                key: b"k".to_vec(),
                exptime: 10
            }
        );
        let r = d("cas k 1 2 1 77 noreply\r\nx\r\n").unwrap();
        assert!(r.noreply);
        assert!(matches!(
            r.cmd,
            Command::Store {
                op: StoreOp::Cas(77),
                flags: 1,
                exptime: 2,
                ..
            }
        ));
        let r = d("gats 100 a b\r\n").unwrap();
        assert_eq!(
            r.cmd,
            Command::Get {
                keys: vec![b"a".to_vec(), b"b".to_vec()],
                cas: true,
                touch: Some(100)
            }
        );
    }

    /// The replies of memcached 1.6.18 to the lines an outside differential test
    /// (docs/outside/2026-12-07, `mc_diff.py`) found luna answering otherwise.
    #[test]
    fn edge_cases_are_answered_as_memcached_1_6_18() {
        let d = |s: &str| Request::decode(&iov(s.as_bytes()));
        let reply = |s: &str| d(s).unwrap_err().error.reply();
        // One token more than a command takes is `noreply` or ignored: `set k 0 0 1 foo`
        // stores (memcached: STORED), its data block framed with it.
        let s = b"set k 0 0 1 foo\r\nx\r\n";
        assert_eq!(fr(s, 1 << 20), Ok(Frame::msg(s.len())));
        let r = Request::decode(&iov(s)).unwrap();
        assert!(!r.noreply);
        assert!(matches!(
            r.cmd,
            Command::Store {
                op: StoreOp::Set,
                ..
            }
        ));
        let r = d("cas k 0 0 1 5 foo\r\nx\r\n").unwrap();
        assert!(matches!(
            r.cmd,
            Command::Store {
                op: StoreOp::Cas(5),
                ..
            }
        ));
        assert_eq!(
            d("set k 0 0 1 foo bar\r\nx\r\n").unwrap_err().error,
            Error::Unknown
        );
        assert!(matches!(
            d("incr k 1 foo\r\n").unwrap().cmd,
            Command::Arith { delta: 1, .. }
        ));
        assert!(matches!(
            d("touch k 10 foo\r\n").unwrap().cmd,
            Command::Touch { exptime: 10, .. }
        ));
        // A bad exptime has its own message.
        for l in [
            "touch k abc\r\n",
            "gat abc k\r\n",
            "gats x k\r\n",
            "flush_all abc\r\n",
        ] {
            assert_eq!(
                reply(l),
                b"CLIENT_ERROR invalid exptime argument\r\n",
                "{l}"
            );
        }
        assert!(d("touch k abc noreply\r\n").unwrap_err().noreply);
        assert_eq!(
            d("flush_all 10 foo\r\n").unwrap().cmd,
            Command::FlushAll { delay: 10 }
        );
        assert_eq!(
            d("flush_all 10 noreply\r\n").unwrap(),
            Request {
                cmd: Command::FlushAll { delay: 10 },
                noreply: true
            }
        );
        assert_eq!(d("flush_all 1 2 3\r\n").unwrap_err().error, Error::Unknown);
        // verbosity takes a number.
        assert_eq!(
            reply("verbosity abc\r\n"),
            b"CLIENT_ERROR bad command line format\r\n"
        );
        assert_eq!(d("verbosity 1 foo\r\n").unwrap().cmd, Command::Verbosity);
        // `gat 100` without a key: no items, `END`; `gat` alone: ERROR.
        assert_eq!(
            d("gat 100\r\n").unwrap().cmd,
            Command::Get {
                keys: vec![],
                cas: false,
                touch: Some(100)
            }
        );
        assert_eq!(reply("gat\r\n"), b"ERROR\r\n");
        // stats groups.
        for (l, g) in [
            ("stats items\r\n", StatsGroup::Items),
            ("stats reset\r\n", StatsGroup::Reset),
            ("stats reset foo\r\n", StatsGroup::Reset),
            ("stats detail dump\r\n", StatsGroup::DetailDump),
            ("stats detail on\r\n", StatsGroup::Detail(true)),
            ("stats detail off\r\n", StatsGroup::Detail(false)),
            ("stats detail\r\n", StatsGroup::DetailUsage),
            ("stats detail x\r\n", StatsGroup::DetailUsage),
        ] {
            assert_eq!(d(l).unwrap().cmd, Command::Stats(g), "{l}");
        }
        assert_eq!(reply("stats slabs\r\n"), b"ERROR\r\n");
        // Meta: `mn` whatever follows; `mg` and the others decode (meta.rs tests them);
        // a two-letter command starting with `m` that is not one is an ERROR.
        assert_eq!(d("mn\r\n").unwrap().cmd, Command::MetaNoop);
        assert_eq!(d("mn foo\r\n").unwrap().cmd, Command::MetaNoop);
        assert!(matches!(d("mg k v\r\n").unwrap().cmd, Command::Meta(_)));
        assert_eq!(reply("mx k\r\n"), b"ERROR\r\n");
        // Kept: flags are 32 bits (memcached 1.6.18 truncates 2^32 to 0 and stores).
        let s = b"set k 4294967296 0 1\r\n";
        assert_eq!(fr(s, 1 << 20), Ok(Frame::msg(s.len())));
        assert_eq!(
            reply("set k 4294967296 0 1\r\n"),
            b"CLIENT_ERROR bad command line format\r\n"
        );
        // Kept: an exptime beyond 32 bits is kept whole (memcached truncates it).
        assert!(matches!(
            d("set k 0 99999999999 1\r\nx\r\n").unwrap().cmd,
            Command::Store {
                exptime: 99999999999,
                ..
            }
        ));
    }
}
