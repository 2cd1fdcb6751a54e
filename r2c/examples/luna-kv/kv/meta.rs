//! The meta commands (`mg`, `ms`, `md`, `ma`, `me`) on the store, as memcached 1.6.18
//! carries them out, and their replies.
//!
//! Return flags are rendered in the order the client sent them; `t` shows the TTL at its
//! place in that order (`mg k t T30 t` answers the old TTL, then 30), as memcached
//! applies `T` and `N` while it walks the flags. Stale items (`X`) and the recache token
//! (`W` to the one client that wins it, `Z` to the others) follow memcached: a vivified
//! miss (`N`), a TTL below `R`'s, or the first fetch of a stale item wins the token.

use super::{cost, expiry, now, Answer, Comm, Item, Kv, Put, Reply, Store};
use msgsched::proto::memcached::meta::{base64_encode, Meta, SetMode, Verb};
use std::sync::atomic::Ordering;
use zbuf::Zbuf;

/// Seconds left until `exp` (`-1`: never), as meta `t` reports it.
fn remaining(exp: u64, t: u64) -> i64 {
    if exp == 0 {
        -1
    } else {
        exp.saturating_sub(t) as i64
    }
}

/// What `mg` found (or vivified) and did to the item.
pub struct GetHit {
    value: Zbuf,
    flags: u32,
    cas: u64,
    /// The TTL at each `t` flag, in order.
    ttls: Vec<i64>,
    /// Seconds since the last access, before this one.
    la: u64,
    /// Fetched before this request.
    fetched: bool,
    /// The token had been sent before this request (`Z`).
    token_sent: bool,
    stale: bool,
    /// This request won the recache token (`W`).
    won: bool,
    key_b64: bool,
}

/// What `ma` did: the new value, its CAS and the TTL at each `t` flag.
pub struct ArithHit {
    value: u64,
    cas: u64,
    ttls: Vec<i64>,
}

/// Why `ma` did not apply its delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArithMiss {
    /// No such key (and no `N`): `NF`.
    NotFound,
    /// The `C` value did not match: `EX`.
    Exists,
    /// Not a number: `CLIENT_ERROR cannot increment or decrement non-numeric value`.
    NonNumeric,
    /// The memory limit.
    NoMemory,
}

/// What `me` reports.
pub struct Debug {
    key_b64: bool,
    /// memcached's `exp`: the current time minus the expiry (so minus the seconds
    /// left), `-1` for none.
    exp: i64,
    la: u64,
    cas: u64,
    fetched: bool,
    /// memcached 1.6.18's slab class and item size for this item with its default
    /// settings (luna has neither: it reports what memcached would).
    cls: u32,
    size: usize,
}

/// memcached 1.6.18's `ITEM_ntotal` with CAS on: the 48-byte header, the key and its
/// NUL, the value and its CRLF, the CAS, and the client flags if not 0.
fn mc_item_size(nkey: usize, nbytes: usize, flags: u32) -> usize {
    48 + nkey + 1 + nbytes + 2 + 8 + if flags != 0 { 4 } else { 0 }
}

/// memcached 1.6.18's slab class for an item of `size` bytes with its default settings
/// (`-n 48 -f 1.25`, 1 MiB pages, chunks up to 512 KiB).
fn mc_slab_class(size: usize) -> u32 {
    const CHUNK_MAX: usize = 512 * 1024;
    let mut class_size = 96usize;
    let mut id = 1;
    while (class_size as f64) < CHUNK_MAX as f64 / 1.25 {
        if class_size % 8 != 0 {
            class_size += 8 - class_size % 8;
        }
        if size <= class_size {
            return id;
        }
        id += 1;
        class_size = (class_size as f64 * 1.25) as usize;
    }
    id
}

impl Store {
    /// `mg`: the live item (or a new empty one if `N` was given), with `T`, `N` and `R`
    /// applied in the order sent; `None` for a miss. Bumps the item unless `u`.
    pub fn meta_get(&self, m: &Meta) -> Option<GetHit> {
        self.gets.fetch_add(1, Ordering::Relaxed);
        let (t, key) = (now(), &m.key[..]);
        let mut sh = self.shard(key);
        let live = sh.get(key).is_some_and(|it| self.live(it, t));
        let mut created = false;
        if !live {
            if let Some(it) = sh.remove(key) {
                self.charge(0, cost(key, it.value.len()));
            }
            m.vivify?;
            // memcached vivifies an empty item (flags 0, no expiry until `N` is
            // applied below); out of memory, a miss.
            if !self.charge(cost(key, 0), 0) {
                return None;
            }
            let it = Item::new(Zbuf::from_vec(Vec::new()), 0, 0, self.cas(), t);
            sh.insert(key.to_vec(), it);
            created = true;
        } else {
            self.hits.fetch_add(1, Ordering::Relaxed);
        }
        let it = sh.get_mut(key)?;
        let mut won = false;
        let mut ttls = Vec::new();
        for f in &m.flags {
            match f.c {
                b'T' => it.exp = expiry(m.ttl.unwrap_or(0)),
                b'N' if created => {
                    it.exp = expiry(m.vivify.unwrap_or(0));
                    won = true;
                }
                b'R' => {
                    let r = expiry(m.recache.unwrap_or(0));
                    if !it.token_sent && !created && it.exp != 0 && it.exp < r {
                        won = true;
                    }
                }
                b't' => ttls.push(remaining(it.exp, t)),
                _ => {}
            }
        }
        let token_sent = it.token_sent;
        if it.stale && !token_sent {
            won = true;
        }
        if won {
            it.token_sent = true;
        }
        let hit = GetHit {
            value: it.value.clone(),
            flags: it.flags,
            cas: it.cas,
            ttls,
            la: t.saturating_sub(it.atime),
            fetched: it.fetched,
            token_sent,
            stale: it.stale,
            won,
            key_b64: it.key_b64,
        };
        if !m.no_update {
            it.fetched = true;
            it.atime = t;
        }
        Some(hit)
    }

    /// `ms`: stores per its mode; a `C` value turns set and replace into a CAS store
    /// (and with `I`, a lower CAS stores a stale item). The new CAS value on success.
    pub fn meta_set(&self, m: &Meta) -> (Outcome, u64) {
        self.sets.fetch_add(1, Ordering::Relaxed);
        let comm = match (m.set_mode, m.cas.is_some()) {
            (SetMode::Set | SetMode::Replace, true) => Comm::Cas,
            (SetMode::Set, false) => Comm::Set,
            (SetMode::Replace, false) => Comm::Replace,
            (SetMode::Add, _) => Comm::Add,
            (SetMode::Append, _) => Comm::Append,
            (SetMode::Prepend, _) => Comm::Prepend,
        };
        let put = Put {
            comm,
            cas: m.cas.unwrap_or(0),
            stale_ok: m.invalidate,
            key: &m.key,
            flags: m.client_flags,
            exptime: m.ttl.unwrap_or(0),
            value: &m.data,
            key_b64: m.base64,
        };
        self.or_reclaim(|| self.try_store_full(&put), |r| r.0 == Outcome::NoMemory)
    }

    /// `md`: deletes, or with `I` marks the item stale (a new CAS, the `T` expiry if
    /// given, the token free to win again). `Stored` for `HD`.
    pub fn meta_delete(&self, m: &Meta) -> Outcome {
        let (t, key) = (now(), &m.key[..]);
        let mut sh = self.shard(key);
        let Some(it) = sh.get_mut(key).filter(|it| self.live(it, t)) else {
            if let Some(it) = sh.remove(key) {
                self.charge(0, cost(key, it.value.len()));
            }
            return Outcome::NotFound;
        };
        if m.cas.is_some_and(|c| c != it.cas) {
            return Outcome::Exists;
        }
        if m.invalidate {
            if let Some(e) = m.ttl {
                it.exp = expiry(e);
            }
            it.stale = true;
            it.token_sent = false;
            it.cas = self.cas();
        } else if let Some(it) = sh.remove(key) {
            self.charge(0, cost(key, it.value.len()));
        }
        Outcome::Stored
    }

    /// `ma`: incr/decr by `D` (a `C` of 0 compares nothing, as memcached), creating the
    /// item with `J` on a miss if `N` was given; `T` and `N` applied in the order sent.
    pub fn meta_arith(&self, m: &Meta) -> Result<ArithHit, ArithMiss> {
        let r = self.try_meta_arith(m);
        if r.as_ref().err() == Some(&ArithMiss::NoMemory) && self.reclaim() > 0 {
            return self.try_meta_arith(m);
        }
        r
    }

    fn try_meta_arith(&self, m: &Meta) -> Result<ArithHit, ArithMiss> {
        let (t, key) = (now(), &m.key[..]);
        let mut sh = self.shard(key);
        let cur = sh.get(key).filter(|it| self.live(it, t)).cloned();
        let (n, mut item, created) = match cur {
            None => {
                if m.vivify.is_none() {
                    return Err(ArithMiss::NotFound);
                }
                (m.initial, None, true)
            }
            Some(it) => {
                let c = m.cas.unwrap_or(0);
                if c != 0 && c != it.cas {
                    return Err(ArithMiss::Exists);
                }
                let v = super::parse_u64(&it.value).ok_or(ArithMiss::NonNumeric)?;
                let n = if m.incr {
                    v.wrapping_add(m.delta)
                } else {
                    v.saturating_sub(m.delta)
                };
                (n, Some(it), false)
            }
        };
        let bytes = n.to_string().into_bytes();
        let prev = sh.get(key).map_or(0, |it| cost(key, it.value.len()));
        if !self.charge(cost(key, bytes.len()), prev) {
            return Err(ArithMiss::NoMemory);
        }
        let cas = self.cas();
        let (flags, exp) = item.take().map_or((0, 0), |it| (it.flags, it.exp));
        let mut it = Item::new(Zbuf::from_vec(bytes), flags, exp, cas, t);
        let mut ttls = Vec::new();
        for f in &m.flags {
            match f.c {
                b'T' => it.exp = expiry(m.ttl.unwrap_or(0)),
                b'N' if created => it.exp = expiry(m.vivify.unwrap_or(0)),
                b't' => ttls.push(remaining(it.exp, t)),
                _ => {}
            }
        }
        sh.insert(key.to_vec(), it);
        Ok(ArithHit {
            value: n,
            cas,
            ttls,
        })
    }

    /// `me`: the item's internals, without bumping it.
    pub fn meta_debug(&self, key: &[u8]) -> Option<Debug> {
        let t = now();
        let sh = self.shard(key);
        let it = sh.get(key).filter(|it| self.live(it, t))?;
        let size = mc_item_size(key.len(), it.value.len(), it.flags);
        Some(Debug {
            key_b64: it.key_b64,
            exp: if it.exp == 0 {
                -1
            } else {
                -remaining(it.exp, t)
            },
            la: t.saturating_sub(it.atime),
            cas: it.cas,
            fetched: it.fetched,
            cls: mc_slab_class(size),
            size,
        })
    }
}

use super::Outcome;

/// ` k<key>`, base64-encoded and followed by ` b` if `b64`.
fn put_key(r: &mut Reply, key: &[u8], b64: bool) {
    r.put(b" k");
    if b64 {
        r.put(&base64_encode(key)).put(b" b");
    } else {
        r.put(key);
    }
}

/// The return flags every outcome carries: `O` and `k`, in the order sent.
fn put_opaque_and_key(r: &mut Reply, m: &Meta, key_b64: bool) {
    for f in &m.flags {
        match f.c {
            b'O' => {
                r.put(b" O").put(&f.token);
            }
            b'k' => put_key(r, &m.key, key_b64),
            _ => {}
        }
    }
}

impl Kv {
    /// The answer to a decoded meta command.
    pub(super) fn meta(&mut self, m: &Meta) -> Answer {
        let s = &self.store;
        let mut r = Reply::default();
        match m.verb {
            Verb::Get => match s.meta_get(m) {
                Some(h) => {
                    if m.value {
                        r.put(format!("VA {}", h.value.len()).as_bytes());
                    } else {
                        r.put(b"HD");
                    }
                    let mut ttls = h.ttls.iter();
                    for f in &m.flags {
                        match f.c {
                            b's' => r.put(format!(" s{}", h.value.len()).as_bytes()),
                            b't' => r.put(format!(" t{}", ttls.next().unwrap_or(&-1)).as_bytes()),
                            b'c' => r.put(format!(" c{}", h.cas).as_bytes()),
                            b'f' => r.put(format!(" f{}", h.flags).as_bytes()),
                            b'l' => r.put(format!(" l{}", h.la).as_bytes()),
                            b'h' => r.put(if h.fetched { b" h1" } else { b" h0" }),
                            b'O' => r.put(b" O").put(&f.token),
                            b'k' => {
                                put_key(&mut r, &m.key, h.key_b64);
                                &mut r
                            }
                            _ => &mut r,
                        };
                    }
                    if h.token_sent {
                        r.put(b" Z");
                    }
                    if h.stale {
                        r.put(b" X");
                    }
                    if h.won {
                        r.put(b" W");
                    }
                    r.put(b"\r\n");
                    if m.value {
                        r.value(h.value).put(b"\r\n");
                    }
                }
                // `q`: a miss is not answered.
                None if m.quiet => return Answer::Silent,
                None => {
                    r.put(b"EN");
                    put_opaque_and_key(&mut r, m, m.base64);
                    r.put(b"\r\n");
                }
            },
            Verb::Set => {
                let (outcome, cas) = s.meta_set(m);
                let code: &[u8] = match outcome {
                    Outcome::Stored if m.quiet => return Answer::Silent,
                    Outcome::Stored => b"HD",
                    Outcome::NotStored => b"NS",
                    Outcome::Exists => b"EX",
                    Outcome::NotFound => b"NF",
                    Outcome::NoMemory => {
                        self.counters.errors.fetch_add(1, Ordering::Relaxed);
                        r.put(b"SERVER_ERROR out of memory storing object\r\n");
                        return Answer::Reply(r.done());
                    }
                };
                r.put(code);
                for f in &m.flags {
                    match f.c {
                        b'O' => {
                            r.put(b" O").put(&f.token);
                        }
                        b'k' => put_key(&mut r, &m.key, m.base64),
                        // memcached returns 0 when nothing was stored.
                        b'c' => {
                            r.put(format!(" c{cas}").as_bytes());
                        }
                        _ => {}
                    }
                }
                r.put(b"\r\n");
            }
            Verb::Delete => {
                let code: &[u8] = match s.meta_delete(m) {
                    Outcome::Stored if m.quiet => return Answer::Silent,
                    Outcome::Stored => b"HD",
                    Outcome::Exists => b"EX",
                    _ => b"NF",
                };
                r.put(code);
                put_opaque_and_key(&mut r, m, m.base64);
                r.put(b"\r\n");
            }
            Verb::Arith => match s.meta_arith(m) {
                Ok(_) if m.quiet => return Answer::Silent,
                Ok(h) => {
                    let v = h.value.to_string();
                    if m.value {
                        r.put(format!("VA {}", v.len()).as_bytes());
                    } else {
                        r.put(b"HD");
                    }
                    let mut ttls = h.ttls.iter();
                    for f in &m.flags {
                        match f.c {
                            b'c' => {
                                r.put(format!(" c{}", h.cas).as_bytes());
                            }
                            b't' => {
                                r.put(format!(" t{}", ttls.next().unwrap_or(&-1)).as_bytes());
                            }
                            b'O' => {
                                r.put(b" O").put(&f.token);
                            }
                            b'k' => put_key(&mut r, &m.key, m.base64),
                            _ => {}
                        }
                    }
                    if m.value {
                        r.put(b"\r\n").put(v.as_bytes());
                    }
                    r.put(b"\r\n");
                }
                Err(e @ (ArithMiss::NotFound | ArithMiss::Exists)) => {
                    r.put(if e == ArithMiss::NotFound {
                        b"NF"
                    } else {
                        b"EX"
                    });
                    put_opaque_and_key(&mut r, m, m.base64);
                    r.put(b"\r\n");
                }
                Err(ArithMiss::NonNumeric) => {
                    self.counters.errors.fetch_add(1, Ordering::Relaxed);
                    r.put(b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n");
                }
                Err(ArithMiss::NoMemory) => {
                    self.counters.errors.fetch_add(1, Ordering::Relaxed);
                    r.put(b"SERVER_ERROR out of memory\r\n");
                }
            },
            Verb::Debug => match s.meta_debug(&m.key) {
                Some(d) => {
                    r.put(b"ME ");
                    if d.key_b64 {
                        r.put(&base64_encode(&m.key));
                    } else {
                        r.put(&m.key);
                    }
                    r.put(
                        format!(
                            " exp={} la={} cas={} fetch={} cls={} size={}\r\n",
                            d.exp,
                            d.la,
                            d.cas,
                            if d.fetched { "yes" } else { "no" },
                            d.cls,
                            d.size
                        )
                        .as_bytes(),
                    );
                }
                None => {
                    r.put(b"EN\r\n");
                }
            },
        }
        Answer::Reply(r.done())
    }
}

/// The meta commands' replies, byte for byte as memcached 1.6.18 answers the same input
/// on a fresh server (CAS values start at 1 in both; `l`/`la` are 0 here, memcached's
/// coarse clock may say 1); the differential test
/// docs/outside/2026-12-07/proto/mc_meta_diff.py runs the same kinds of cases.
#[cfg(test)]
mod tests {
    use super::super::reply_tests::{kv, text};
    use super::*;

    fn cases(k: &mut Kv, cases: &[(&str, &str)]) {
        for (input, want) in cases {
            assert_eq!(text(k, input), *want, "{input:?}");
        }
    }

    #[test]
    fn mg_returns_flags_in_order_and_q_silences_only_misses() {
        let mut k = kv();
        cases(
            &mut k,
            &[
                ("ms g 2 F7 T100\r\nhi\r\n", "HD\r\n"),
                (
                    "mg g s v f t c k O123 h l\r\n",
                    "VA 2 s2 f7 t100 c1 kg O123 h0 l0\r\nhi\r\n",
                ),
                ("mg g h\r\n", "HD h1\r\n"),
                ("mg g\r\n", "HD\r\n"),
                ("mg nope v\r\n", "EN\r\n"),
                ("mg nope k Oab v\r\n", "EN knope Oab\r\n"),
                ("mg nope q v\r\nmg nope q k\r\nmn\r\n", "MN\r\n"),
                ("mg g q v\r\nmn\r\n", "VA 2\r\nhi\r\nMN\r\n"),
                // Tokens after flags that take none are ignored.
                ("mg g vfoo sbar\r\n", "VA 2 s2\r\nhi\r\n"),
            ],
        );
    }

    #[test]
    fn mg_touch_applies_in_order_and_u_does_not_bump() {
        let mut k = kv();
        cases(
            &mut k,
            &[
                ("ms t 1 T100\r\nx\r\n", "HD\r\n"),
                ("mg t t T30\r\n", "HD t100\r\n"),
                ("mg t t\r\n", "HD t30\r\n"),
                ("ms u 1\r\nx\r\n", "HD\r\n"),
                (
                    "mg u u h\r\nmg u h\r\nmg u h\r\n",
                    "HD h0\r\nHD h0\r\nHD h1\r\n",
                ),
                // A classic get is a fetch too.
                (
                    "set c 0 0 1\r\nx\r\nget c\r\nmg c h\r\n",
                    "STORED\r\nVALUE c 0 1\r\nx\r\nEND\r\nHD h1\r\n",
                ),
                // A negative TTL expires the item at once.
                ("mg t T-1\r\nmg t v\r\n", "HD\r\nEN\r\n"),
                ("ms n 1 T-1\r\nx\r\nmg n v\r\n", "HD\r\nEN\r\n"),
            ],
        );
    }

    #[test]
    fn vivify_and_recache_hand_out_one_win_token() {
        let mut k = kv();
        cases(
            &mut k,
            &[
                (
                    "mg v N30 s t v c f h k\r\n",
                    "VA 0 s0 t30 c1 f0 h0 kv W\r\n\r\n",
                ),
                ("mg v h t v\r\n", "VA 0 h1 t30 Z\r\n\r\n"),
                // `t` before `N` sees the vivified item's no-expiry.
                ("mg v2 t N30\r\n", "HD t-1 W\r\n"),
                ("mg v2 t\r\n", "HD t30 Z\r\n"),
                ("ms r 1 T100\r\nx\r\n", "HD\r\n"),
                ("mg r R200 t\r\n", "HD t100 W\r\n"),
                ("mg r R200\r\nmg r R50\r\n", "HD Z\r\nHD Z\r\n"),
                ("ms r2 1 T100\r\nx\r\nmg r2 R30\r\n", "HD\r\nHD\r\n"),
                // No TTL: never a recache win.
                ("ms r3 1\r\nx\r\nmg r3 R30\r\n", "HD\r\nHD\r\n"),
            ],
        );
    }

    #[test]
    fn ms_modes_and_cas_follow_do_store_item() {
        let mut k = kv();
        cases(
            &mut k,
            &[
                ("ms a 1 c\r\nx\r\n", "HD c1\r\n"),
                // Nothing stored: `c0`.
                ("ms a 1 ME c\r\ny\r\n", "NS c0\r\n"),
                ("ms r 1 MR c k O9\r\ny\r\n", "NS c0 kr O9\r\n"),
                (
                    "ms a 1 MR F3\r\ny\r\nmg a v f\r\n",
                    "HD\r\nVA 1 f3\r\ny\r\n",
                ),
                ("ms add 1 ME\r\nx\r\n", "HD\r\n"),
                // Append and prepend keep the flags and TTL of the item.
                (
                    "ms p 2 F5 T100\r\nbb\r\nms p 1 MA F9\r\nc\r\nms p 1 MP\r\na\r\nmg p v f t\r\n",
                    "HD\r\nHD\r\nHD\r\nVA 4 f5 t100\r\nabbc\r\n",
                ),
                ("ms pm 1 MA\r\nx\r\nms pm 1 MP\r\nx\r\n", "NS\r\nNS\r\n"),
                ("mg a c\r\n", "HD c2\r\n"),
                ("ms a 1 C2 c\r\nz\r\n", "HD c7\r\n"),
                ("ms a 1 C2 c\r\nz\r\n", "EX c0\r\n"),
                // C0 compares against nothing: EX (NF for a missing key).
                ("ms a 1 C0\r\nz\r\n", "EX\r\n"),
                ("ms cm 1 C5\r\nx\r\n", "NF\r\n"),
                // q silences HD only.
                (
                    "ms a 1 q\r\nx\r\nms a 1 q ME\r\ny\r\nms a 1 q C1\r\ny\r\nmn\r\n",
                    "NS\r\nEX\r\nMN\r\n",
                ),
                // Add ignores a CAS value; append checks it.
                ("ms ac 1 ME C5\r\nx\r\n", "HD\r\n"),
                ("ms ac 1 MA C999\r\nx\r\n", "EX\r\n"),
                ("ms z 0\r\n\r\nmg z v s\r\n", "HD\r\nVA 0 s0\r\n\r\n"),
                (
                    "ms f 3 T0 F4294967295\r\nabc\r\nmg f v f t\r\n",
                    "HD\r\nVA 3 f4294967295 t-1\r\nabc\r\n",
                ),
            ],
        );
    }

    #[test]
    fn invalidation_marks_stale_and_a_lower_cas_stores_stale() {
        let mut k = kv();
        cases(
            &mut k,
            &[
                ("ms i 1 T100\r\nx\r\nms i 1\r\ny\r\n", "HD\r\nHD\r\n"),
                // CAS 1 is below the item's (2) and `I` is given: stored, stale, old TTL.
                ("ms i 1 C1 I\r\nz\r\n", "HD\r\n"),
                ("mg i v t\r\n", "VA 1 t-1 X W\r\nz\r\n"),
                ("mg i v\r\n", "VA 1 Z X\r\nz\r\n"),
                // Without C, I does nothing.
                (
                    "ms j 1\r\nx\r\nms j 1 I\r\ny\r\nmg j v\r\n",
                    "HD\r\nHD\r\nVA 1\r\ny\r\n",
                ),
                ("ms d 1 T100\r\nx\r\nmd d I T30\r\n", "HD\r\nHD\r\n"),
                (
                    "mg d v t\r\nmg d v t\r\n",
                    "VA 1 t30 X W\r\nx\r\nVA 1 t30 Z X\r\nx\r\n",
                ),
                (
                    "md d2 T30\r\nms d2 1\r\nx\r\nmd d2 I\r\nmg d2 t\r\n",
                    "NF\r\nHD\r\nHD\r\nHD t-1 X W\r\n",
                ),
            ],
        );
    }

    #[test]
    fn md_answers_hd_nf_ex() {
        let mut k = kv();
        cases(
            &mut k,
            &[
                (
                    "ms d 1\r\nx\r\nmd d k O5\r\nmd d k O5\r\nmg d v\r\n",
                    "HD\r\nHD kd O5\r\nNF kd O5\r\nEN\r\n",
                ),
                (
                    "ms q 1\r\nx\r\nmd q q\r\nmd q q\r\nmn\r\n",
                    "HD\r\nNF\r\nMN\r\n",
                ),
                (
                    "ms c 1\r\nx\r\nmd c C999\r\nmd c C0\r\nmg c v\r\n",
                    "HD\r\nEX\r\nEX\r\nVA 1\r\nx\r\n",
                ),
                ("mg c c\r\nmd c C3\r\nmg c v\r\n", "HD c3\r\nHD\r\nEN\r\n"),
            ],
        );
    }

    #[test]
    fn ma_counts_vivifies_and_checks_cas() {
        let mut k = kv();
        cases(
            &mut k,
            &[
                ("ma a\r\nma a O1 k\r\n", "NF\r\nNF O1 ka\r\n"),
                ("ma a N0 J10 v t c\r\n", "VA 2 t-1 c1\r\n10\r\n"),
                ("ma a v\r\nmg a v f t\r\n", "VA 2\r\n11\r\nVA 2 f0 t-1\r\n11\r\n"),
                ("ma b t N100 v\r\nmg b t\r\n", "VA 1 t-1\r\n0\r\nHD t100\r\n"),
                (
                    "ms d 2\r\n10\r\nma d MD D3 v\r\nma d M- D30 v\r\nma d M+ D5 v\r\nma d MI v\r\n",
                    "HD\r\nVA 1\r\n7\r\nVA 1\r\n0\r\nVA 1\r\n5\r\nVA 1\r\n6\r\n",
                ),
                ("ms t 1\r\n1\r\nma t t T50 v\r\nmg t t\r\n", "HD\r\nVA 1 t-1\r\n2\r\nHD t50\r\n"),
                ("ms q 1\r\n1\r\nma q q\r\nma q q v\r\nma qm q\r\nmn\r\nmg q v\r\n", "HD\r\nNF\r\nMN\r\nVA 1\r\n3\r\n"),
                // C0 compares nothing (unlike ms and md).
                ("ms c 1\r\n1\r\nma c C999 v\r\nma c C0 v\r\n", "HD\r\nEX\r\nVA 1\r\n2\r\n"),
                (
                    "ms n 1\r\nx\r\nma n\r\nma n q\r\n",
                    "HD\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
                ),
                ("ms w 20\r\n18446744073709551615\r\nma w v\r\n", "HD\r\nVA 1\r\n0\r\n"),
                ("ms f 1 F7\r\n1\r\nma f\r\nmg f f v\r\n", "HD\r\nHD\r\nVA 1 f7\r\n2\r\n"),
            ],
        );
    }

    #[test]
    fn base64_keys_round_trip_and_me_reports_memcacheds_fields() {
        let mut k = kv();
        // "\0\xffk": AP9r.
        cases(
            &mut k,
            &[
                ("ms AP9r 2 b k c\r\nhi\r\n", "HD kAP9r b c1\r\n"),
                ("mg AP9r b v k\r\n", "VA 2 kAP9r b\r\nhi\r\n"),
                ("mg AP9s b k\r\n", "EN kAP9s b\r\n"),
                (
                    "me AP9r b\r\n",
                    "ME AP9r exp=-1 la=0 cas=1 fetch=yes cls=1 size=64\r\n",
                ),
                (
                    "md AP9r b k\r\nmd AP9r b k\r\n",
                    "HD kAP9r b\r\nNF kAP9r b\r\n",
                ),
                // A key stored by a classic command is returned as stored.
                (
                    "set pk 0 0 1\r\nx\r\nmg cGs= b k v\r\n",
                    "STORED\r\nVA 1 kpk\r\nx\r\n",
                ),
                (
                    "ms me 2 F5 T0\r\nhi\r\nme me\r\n",
                    "HD\r\nME me exp=-1 la=0 cas=3 fetch=no cls=1 size=67\r\n",
                ),
                (
                    "ms mt 2 T100\r\nhi\r\nme mt\r\n",
                    "HD\r\nME mt exp=-100 la=0 cas=4 fetch=no cls=1 size=63\r\n",
                ),
                ("me nope\r\n", "EN\r\n"),
            ],
        );
        // memcached 1.6.18's slab classes with its defaults, as its `me` reported them.
        assert_eq!(mc_item_size(8, 100, 0), 167);
        assert_eq!(
            [96, 97, 167, 1067, 100067, 524288].map(mc_slab_class),
            [1, 2, 4, 12, 32, 39]
        );
    }

    #[test]
    fn every_error_leaves_the_connection_usable() {
        let mut k = kv();
        let long_opaque = format!("O{}", "x".repeat(32));
        let cases_owned: Vec<(String, &str)> = vec![
            ("mg\r\nmn\r\n".into(), "ERROR\r\nMN\r\n"),
            ("mg k x\r\nmn\r\n".into(), "CLIENT_ERROR invalid flag\r\nMN\r\n"),
            ("mg k b\r\nmn\r\n".into(), "CLIENT_ERROR error decoding key\r\nMN\r\n"),
            (format!("mg k {long_opaque}\r\nmn\r\n"), "CLIENT_ERROR opaque token too long\r\nMN\r\n"),
            // Flag errors swallow an ms data block ...
            ("ms k 2 Z\r\nmn\r\nmn\r\n".into(), "CLIENT_ERROR invalid flag\r\nMN\r\n"),
            ("ms k 1 MX\r\nx\r\nmn\r\n".into(), "CLIENT_ERROR invalid mode for ms M token\r\nMN\r\n"),
            // ... a bad line does not: its data is read as a command.
            ("ms k x\r\nab\r\nmn\r\n".into(), "CLIENT_ERROR bad command line format\r\nERROR\r\nMN\r\n"),
            ("ms k 1\r\nxyz\r\nmn\r\n".into(), "CLIENT_ERROR bad data chunk\r\nERROR\r\nMN\r\n"),
            ("ms k 1 q\r\nxyz\r\nmn\r\n".into(), "CLIENT_ERROR bad data chunk\r\nERROR\r\nMN\r\n"),
            ("md k x\r\nma k MX\r\nmn\r\n".into(), "CLIENT_ERROR invalid or duplicate flag\r\nCLIENT_ERROR invalid mode for ma M token\r\nMN\r\n"),
            ("mx k\r\nmn foo\r\n".into(), "ERROR\r\nMN\r\n"),
        ];
        for (input, want) in &cases_owned {
            assert_eq!(text(&mut k, input), *want, "{input:?}");
        }
        assert!(k.counters.errors.load(Ordering::Relaxed) >= 12);
    }

    /// Differences from memcached 1.6.18 kept on purpose (docs/msgsched-protocols.md,
    /// "Differences from memcached 1.6.18"); memcached's answers in the comments.
    #[test]
    fn kept_meta_differences_from_memcached() {
        let mut k = kv();
        let long = format!("O{}", "x".repeat(32));
        let input = format!(
            "ms f 1 F4294967296\r\nx\r\nmg f v\r\n\
             ms o 1 T100\r\n1\r\nmg o T30 {long}\r\nmg o t\r\nma o {long}\r\nmg o v\r\n"
        );
        assert_eq!(
            text(&mut k, &input),
            // memcached: HD, then VA 1 f0 (the flags truncated to 32 bits).
            "CLIENT_ERROR bad command line format\r\nEN\r\n\
             HD\r\n\
             CLIENT_ERROR opaque token too long\r\n\
             HD t100\r\n\
             CLIENT_ERROR opaque token too long\r\n\
             VA 1\r\n1\r\n" // memcached: the same errors, but HD t30 (T applied) and VA 1 / 2 (the
                            // delta applied) after them.
        );
        // `me` of a chunked item (over 512 KiB): memcached 1.6.18 reports class 39 and
        // its size, as luna does.
        let v = "z".repeat(600_000);
        assert_eq!(
            text(
                &mut k,
                &format!("ms bigme 600000 T0\r\n{v}\r\nme bigme\r\n")
            ),
            "HD\r\nME bigme exp=-1 la=0 cas=2 fetch=no cls=39 size=600064\r\n"
        );
    }

    #[test]
    fn quiet_pipelines_end_with_mn() {
        let mut k = kv();
        let mut input = String::new();
        for i in (0..10).step_by(2) {
            input += &format!("ms p{i} 1 q T0\r\n{}\r\n", i / 2);
        }
        for i in 0..10 {
            input += &format!("mg p{i} q v k O{i}\r\n");
        }
        input += "mn\r\n";
        let want: String = (0..10)
            .step_by(2)
            .map(|i| format!("VA 1 kp{i} O{i}\r\n{}\r\n", i / 2))
            .collect::<String>()
            + "MN\r\n";
        assert_eq!(text(&mut k, &input), want);
    }
}
