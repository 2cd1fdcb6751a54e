//! The meta commands (`mg`, `ms`, `md`, `ma`, `me`) on the store, as memcached 1.6.18
//! carries them out, and their replies.
//!
//! Return flags are rendered in the order the client sent them; `t` shows the TTL at its
//! place in that order (`mg k t T30 t` answers the old TTL, then 30), as memcached
//! applies `T` and `N` while it walks the flags. Stale items (`X`) and the recache token
//! (`W` to the one client that wins it, `Z` to the others) follow memcached: a vivified
//! miss (`N`), a TTL below `R`'s, or the first fetch of a stale item wins the token.

use super::{expiry, now, cost, Answer, Comm, Item, Kv, Put, Reply, Store};
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
                    r.put(if e == ArithMiss::NotFound { b"NF" } else { b"EX" });
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
