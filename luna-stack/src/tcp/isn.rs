//! Initial sequence numbers (RFC 6528).
//!
//! Contract: `ISN = M + F(localip, localport, remoteip, remoteport, secretkey)` where M is a
//! 4-microsecond timer taken from the `now` the driver passes in, and F is SipHash-2-4 keyed
//! with a 128-bit secret drawn from [`Rng`] once at construction (the driver's `Rng` must be a
//! CSPRNG). The same generator serves every connection of a core; one per core is fine since
//! the key, not the generator, makes ISNs unpredictable. The secret is never exposed.
//!
//! For one 4-tuple the ISN advances with the clock (one per 4 µs, wrapping every ~4.77 h), so a
//! new incarnation of a connection starts above the old one's sequence space (RFC 6528 §3,
//! RFC 9293 §3.4.1); different tuples get unrelated offsets, so an off-path attacker cannot
//! predict one connection's ISN from another's (RFC 6528 §1).

use crate::context::Rng;
use crate::tcp::SeqNum;
use crate::time::Instant;
use core::hash::Hasher;
use core::net::SocketAddrV4;
use siphasher::sip::SipHasher24;

/// SipHash-2-4 of a 4-tuple and `extra` under `key`; shared with the SYN-cookie code.
pub(crate) fn tuple_hash(
    key: &[u8; 16],
    local: SocketAddrV4,
    remote: SocketAddrV4,
    extra: &[u8],
) -> u64 {
    // One `write` of the whole input: SipHash is defined over the byte string, so this is
    // the same hash as writing the fields one by one, for about half the instructions
    // (siphasher buffers every short write; a SYN cookie costs three of these hashes:
    // luna-stack/benches/syn-flood-instructions.sh).
    let mut buf = [0u8; TUPLE_LEN + EXTRA_INLINE];
    buf[0..4].copy_from_slice(&local.ip().octets());
    buf[4..6].copy_from_slice(&local.port().to_be_bytes());
    buf[6..10].copy_from_slice(&remote.ip().octets());
    buf[10..12].copy_from_slice(&remote.port().to_be_bytes());
    let mut h = SipHasher24::new_with_key(key);
    if let Some(dst) = buf.get_mut(TUPLE_LEN..TUPLE_LEN + extra.len()) {
        dst.copy_from_slice(extra);
        h.write(&buf[..TUPLE_LEN + extra.len()]);
    } else {
        h.write(&buf[..TUPLE_LEN]);
        h.write(extra);
    }
    h.finish()
}

/// Bytes of a 4-tuple in [`tuple_hash`]'s input.
const TUPLE_LEN: usize = 12;
/// Longest `extra` hashed in the same write as the tuple (the callers' are at most 15).
const EXTRA_INLINE: usize = 20;

/// Fold a 64-bit hash to 32 bits, keeping entropy from both halves.
pub(crate) fn fold32(h: u64) -> u32 {
    (h ^ (h >> 32)) as u32
}

/// RFC 6528 ISN generator.
#[derive(Clone)]
pub struct IsnGenerator {
    key: [u8; 16],
}

impl core::fmt::Debug for IsnGenerator {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Never print the secret.
        f.write_str("IsnGenerator { key: <secret> }")
    }
}

impl IsnGenerator {
    /// A generator with a fresh secret key from `rng` (RFC 6528 §3: the secret key SHOULD be
    /// random, e.g. generated at boot).
    pub fn new<R: Rng + ?Sized>(rng: &mut R) -> Self {
        let mut key = [0u8; 16];
        rng.fill_bytes(&mut key);
        IsnGenerator { key }
    }

    /// A generator with a fixed key (tests, reproducible simulations).
    #[cfg(test)]
    pub fn with_key(key: [u8; 16]) -> Self {
        IsnGenerator { key }
    }

    /// The ISN for a connection from `local` to `remote` at `now`.
    pub fn isn(&self, now: Instant, local: SocketAddrV4, remote: SocketAddrV4) -> SeqNum {
        // RFC 6528 §3: M is a 4-microsecond timer (truncation to 32 bits is the intended
        // modulo-2^32 wrap).
        let m = (now.as_micros() / 4) as u32;
        // RFC 6528 §3: F() is a pseudorandom function of the connection-id and a secret key;
        // it MUST NOT be computable from the outside.
        let f = fold32(tuple_hash(&self.key, local, remote, &[]));
        SeqNum(m.wrapping_add(f))
    }

    /// The offset of our RFC 7323 timestamp clock for the connection from `local` to
    /// `remote`: a keyed hash of the 4-tuple, independent of the ISN's (as Linux's
    /// `secure_tcp_ts_off`). RFC 7323 §5.4: the clock gets a random offset per connection
    /// so that TSvals reveal no uptime; deriving it from the tuple instead of drawing it
    /// keeps one clock per tuple, which a SYN-cookie connection needs (its SYN-ACK's TSval
    /// is computed before the connection exists, and the peer's PAWS check rejects every
    /// later segment if the connection's clock jumps 2^31 or more away from it) and which
    /// RFC 6191 needs across incarnations (a new SYN's TSval above the old connection's).
    pub fn ts_offset(&self, local: SocketAddrV4, remote: SocketAddrV4) -> u32 {
        fold32(tuple_hash(&self.key, local, remote, b"rfc7323-ts"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::testutil::FakeRng;
    use core::net::Ipv4Addr;

    fn addr(last: u8, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, last), port)
    }

    /// The field-by-field SipHash the single write must equal (ISNs and cookies keep
    /// their values across the change).
    fn streamed(key: &[u8; 16], local: SocketAddrV4, remote: SocketAddrV4, extra: &[u8]) -> u64 {
        let mut h = SipHasher24::new_with_key(key);
        h.write(&local.ip().octets());
        h.write(&local.port().to_be_bytes());
        h.write(&remote.ip().octets());
        h.write(&remote.port().to_be_bytes());
        h.write(extra);
        h.finish()
    }

    proptest::proptest! {
        #[test]
        fn tuple_hash_is_siphash_of_the_fields_in_order(
            key in proptest::prelude::any::<[u8; 16]>(),
            (l, lp, r, rp) in proptest::prelude::any::<(u32, u16, u32, u16)>(),
            extra in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..48),
        ) {
            let local = SocketAddrV4::new(Ipv4Addr::from(l), lp);
            let remote = SocketAddrV4::new(Ipv4Addr::from(r), rp);
            proptest::prop_assert_eq!(
                tuple_hash(&key, local, remote, &extra),
                streamed(&key, local, remote, &extra)
            );
        }
    }

    #[test]
    fn rfc6528_3_different_tuples_get_unrelated_isns() {
        let g = IsnGenerator::new(&mut FakeRng::new(1));
        let now = Instant::from_millis(1234);
        let base = g.isn(now, addr(1, 80), addr(2, 61_440));
        let others = [
            g.isn(now, addr(1, 80), addr(2, 61_441)),
            g.isn(now, addr(1, 81), addr(2, 61_440)),
            g.isn(now, addr(3, 80), addr(2, 61_440)),
            g.isn(now, addr(1, 80), addr(4, 61_440)),
            // Swapped direction is a different connection-id.
            g.isn(now, addr(2, 61_440), addr(1, 80)),
        ];
        for o in others {
            assert_ne!(o, base);
            // Not merely adjacent: the offsets are hash-spread.
            assert!(o.0.wrapping_sub(base.0) > 1_000_000 || base.0.wrapping_sub(o.0) > 1_000_000);
        }
    }

    #[test]
    fn rfc6528_3_isn_advances_every_4us_for_one_tuple() {
        let g = IsnGenerator::new(&mut FakeRng::new(2));
        let (l, r) = (addr(1, 80), addr(2, 61_440));
        let a = g.isn(Instant::from_micros(1_000_000), l, r);
        let b = g.isn(Instant::from_micros(1_000_004), l, r);
        let c = g.isn(Instant::from_micros(1_000_003), l, r);
        assert_eq!(b - a, 1);
        assert_eq!(c, a, "same 4 us tick");
        let mut prev = a;
        for ms in 1..1000u64 {
            let s = g.isn(Instant::from_micros(1_000_000 + ms * 1000), l, r);
            assert!(s.gt(prev), "monotonic in sequence space");
            assert_eq!(s - prev, 250);
            prev = s;
        }
    }

    #[test]
    fn rfc6528_3_deterministic_with_fixed_key_and_secret_dependent() {
        let (l, r) = (addr(1, 80), addr(2, 61_440));
        let now = Instant::from_millis(99);
        let a = IsnGenerator::with_key([7; 16]);
        let b = IsnGenerator::with_key([7; 16]);
        let c = IsnGenerator::with_key([8; 16]);
        assert_eq!(a.isn(now, l, r), b.isn(now, l, r));
        assert_ne!(a.isn(now, l, r), c.isn(now, l, r));
        // Keys from different RNG seeds differ.
        let d = IsnGenerator::new(&mut FakeRng::new(3));
        let e = IsnGenerator::new(&mut FakeRng::new(4));
        assert_ne!(d.isn(now, l, r), e.isn(now, l, r));
        assert!(!format!("{a:?}").contains('7'), "Debug hides the key");
    }

    #[test]
    fn isn_wraps_modulo_2_32_without_overflow() {
        let g = IsnGenerator::with_key([0; 16]);
        let (l, r) = (addr(1, 80), addr(2, 61_440));
        // Far future instants wrap M silently.
        let _ = g.isn(Instant::from_nanos(u64::MAX), l, r);
        let wrap = Instant::from_micros(4 * (1u64 << 32));
        assert_eq!(g.isn(wrap, l, r), g.isn(Instant::ZERO, l, r));
    }
}
