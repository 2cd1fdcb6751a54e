//! SYN cookies: stateless SYN-ACKs for when the listen backlog is full (RFC 4987 §3.6).
//!
//! Contract: the listener calls [`SynCookies::generate`] for a SYN it cannot queue and sends a
//! SYN-ACK with the returned ISN (and TSval, if the SYN had timestamps). It keeps no state.
//! When an ACK arrives for no known connection, it calls [`SynCookies::validate`] with the
//! segment's SEQ/ACK (and TSecr); on success it creates the connection in ESTABLISHED with the
//! recovered parameters. Failures are counted by the caller and the segment dropped (or RST).
//!
//! Scheme (our ISN, 32 bits):
//! ```text
//!   ISN = H_mask(key, 4-tuple, peer ISN) + packed          (mod 2^32)
//!   packed = t mod 32 (bits 31..27) | MSS index (bits 26..24) | MAC (bits 23..0)
//!   MAC = H(key, 4-tuple, peer ISN, t, MSS index, options tag) mod 2^24
//! ```
//! `t` is a coarse counter, `now / period` (default 64 s); a cookie is accepted while
//! `t_now - t <= max_age` (default 2 periods, so 128-192 s). The MAC covers the full counter,
//! so the 5 visible bits only locate it. The MSS index picks the largest [`MSS_TABLE`] entry
//! not above the peer's MSS (peers announcing less than 536 get 536: RFC 9293 §3.7.1's default
//! send MSS, and RFC 1122 hosts must accept 576-byte datagrams; this trades exactness for a
//! 3-bit field, as Linux does). H and H_mask are SipHash-2-4 with independent inputs.
//!
//! Options: when the SYN carried timestamps, the low [`TS_OPT_BITS`] bits of our SYN-ACK's
//! TSval carry the peer's window scale (4 bits, 15 = none) and SACK-permitted (1 bit); the
//! peer echoes them in TSecr. The options tag in the MAC is those bits, so they are
//! authenticated too. Without timestamps, window scaling and SACK are not available on a
//! cookie connection (the classic limitation). Blind forgery succeeds with probability 2^-24
//! per guess per tuple; a captured cookie can be replayed within its lifetime, as with any
//! SYN-cookie scheme.

use crate::context::Rng;
use crate::tcp::isn::{fold32, tuple_hash};
use crate::tcp::SeqNum;
use crate::time::{Duration, Instant};
use core::fmt;
use core::net::SocketAddrV4;

/// Peer MSS values a cookie can carry (index = 3-bit field): RFC 9293 default, IPv6-minimum
/// and tunnel-friendly sizes, PPPoE, Ethernet, and 9000-byte jumbo frames.
pub const MSS_TABLE: [u16; 8] = [536, 1220, 1360, 1400, 1440, 1452, 1460, 8960];

/// TSval bits carrying options (wscale: 4 bits, SACK-permitted: 1 bit).
pub const TS_OPT_BITS: u32 = 5;
const TS_OPT_MASK: u32 = (1 << TS_OPT_BITS) - 1;
const WSCALE_NONE: u32 = 0xF;
const SACK_BIT: u32 = 1 << 4;
/// Options tag when the SYN had no timestamps (outside the 5-bit range).
const NO_TS_TAG: u8 = 0xFF;

const T_BITS: u32 = 5;
const MAC_MASK: u32 = 0x00FF_FFFF;

/// Cookie lifetime settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SynCookieConfig {
    /// Length of one counter period. Default 64 s.
    pub period: Duration,
    /// Oldest accepted counter age in periods (1..=31). Default 2.
    pub max_age: u32,
}

impl Default for SynCookieConfig {
    fn default() -> Self {
        SynCookieConfig {
            period: Duration::from_secs(64),
            max_age: 2,
        }
    }
}

/// Why a [`SynCookieConfig`] was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynCookieConfigError {
    /// `period` is below one millisecond.
    Period,
    /// `max_age` is not in 1..=31 (the counter has 5 visible bits).
    MaxAge,
}

impl fmt::Display for SynCookieConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SynCookieConfigError::Period => "period must be at least 1 ms",
            SynCookieConfigError::MaxAge => "max_age must be between 1 and 31 periods",
        })
    }
}

impl std::error::Error for SynCookieConfigError {}

/// What the SYN-ACK negotiates: the SYN's options that we answer (an option we do not use
/// is left out, so that the peer's ACK, which echoes only what the SYN-ACK carried, validates).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SynInfo {
    /// The peer's MSS option (None: RFC 9293 default 536).
    pub mss: Option<u16>,
    /// The peer's window scale option (already clamped to 14 by the caller or not; values
    /// above 14 are clamped here, RFC 7323 §2.3).
    pub wscale: Option<u8>,
    /// SACK-permitted was present.
    pub sack_permitted: bool,
    /// The SYN carried a timestamps option and the SYN-ACK answers it (TSval from `generate`).
    pub timestamps: bool,
}

/// What to put in the cookie SYN-ACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CookieSynAck {
    /// Our ISN (the cookie).
    pub isn: SeqNum,
    /// The peer MSS the cookie encodes (what we will send with).
    pub peer_mss: u16,
    /// Our TSval for the SYN-ACK when the SYN had timestamps (options encoded in its low bits,
    /// never above the `ts_clock` passed in).
    pub tsval: Option<u32>,
}

/// A validated cookie: the parameters to create the connection with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CookieAccepted {
    /// The peer's ISN (SEG.SEQ - 1 of the ACK).
    pub peer_isn: SeqNum,
    /// Our ISN (SEG.ACK - 1).
    pub isn: SeqNum,
    /// The peer's MSS (from [`MSS_TABLE`]).
    pub peer_mss: u16,
    /// The peer's window scale, if negotiated (only with timestamps).
    pub wscale: Option<u8>,
    /// SACK negotiated (only with timestamps).
    pub sack_permitted: bool,
    /// Timestamps negotiated.
    pub timestamps: bool,
}

/// Why an ACK's cookie was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CookieError {
    /// Older than `max_age` periods (or from the future).
    Expired,
    /// The MAC does not match: forged, corrupted or for another tuple.
    Invalid,
}

impl fmt::Display for CookieError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CookieError::Expired => "SYN cookie expired",
            CookieError::Invalid => "SYN cookie invalid",
        })
    }
}

impl std::error::Error for CookieError {}

/// SYN-cookie generator and validator with a secret key.
#[derive(Clone)]
pub struct SynCookies {
    key: [u8; 16],
    cfg: SynCookieConfig,
}

impl fmt::Debug for SynCookies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SynCookies")
            .field("key", &"<secret>")
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl SynCookies {
    /// A cookie jar with a fresh secret from `rng` (a CSPRNG in production).
    pub fn new<R: Rng + ?Sized>(
        rng: &mut R,
        cfg: SynCookieConfig,
    ) -> Result<Self, SynCookieConfigError> {
        let mut key = [0u8; 16];
        rng.fill_bytes(&mut key);
        Self::with_key(key, cfg)
    }

    /// A cookie jar with a fixed key (tests).
    pub fn with_key(key: [u8; 16], cfg: SynCookieConfig) -> Result<Self, SynCookieConfigError> {
        if cfg.period < Duration::from_millis(1) {
            return Err(SynCookieConfigError::Period);
        }
        if cfg.max_age == 0 || cfg.max_age >= 1 << T_BITS {
            return Err(SynCookieConfigError::MaxAge);
        }
        Ok(SynCookies { key, cfg })
    }

    /// Whether a cookie generated at `sent` may still validate at `now` (its counter is at
    /// most `max_age` periods old).
    pub fn may_still_be_valid(&self, sent: Instant, now: Instant) -> bool {
        self.counter(now).saturating_sub(self.counter(sent)) <= u64::from(self.cfg.max_age)
    }

    fn counter(&self, now: Instant) -> u64 {
        let p = u64::try_from(self.cfg.period.as_nanos()).unwrap_or(u64::MAX);
        now.as_nanos() / p.max(1)
    }

    fn mask(&self, local: SocketAddrV4, remote: SocketAddrV4, peer_isn: SeqNum) -> u32 {
        let mut extra = [0u8; 5];
        extra[0] = b'M';
        extra[1..].copy_from_slice(&peer_isn.0.to_be_bytes());
        fold32(tuple_hash(&self.key, local, remote, &extra))
    }

    fn mac(
        &self,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        peer_isn: SeqNum,
        t: u64,
        mss_idx: u32,
        opts_tag: u8,
    ) -> u32 {
        let mut extra = [0u8; 15];
        extra[0] = b'C';
        extra[1..5].copy_from_slice(&peer_isn.0.to_be_bytes());
        extra[5..13].copy_from_slice(&t.to_be_bytes());
        extra[13] = mss_idx as u8;
        extra[14] = opts_tag;
        fold32(tuple_hash(&self.key, local, remote, &extra)) & MAC_MASK
    }

    /// The MSS table index for a peer MSS: the largest entry not above it (index 0 if below
    /// all).
    pub fn mss_index(peer_mss: Option<u16>) -> usize {
        let mss = peer_mss.unwrap_or(MSS_TABLE[0]);
        MSS_TABLE.iter().rposition(|&m| m <= mss).unwrap_or(0)
    }

    /// Build the cookie SYN-ACK for a SYN from `remote` to `local` with ISN `peer_isn`.
    /// `ts_clock` is our current timestamp clock (used only if the SYN had timestamps).
    pub fn generate(
        &self,
        now: Instant,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        peer_isn: SeqNum,
        syn: &SynInfo,
        ts_clock: u32,
    ) -> CookieSynAck {
        let t = self.counter(now);
        let idx = Self::mss_index(syn.mss) as u32;
        let (tag, tsval) = if syn.timestamps {
            // RFC 7323 §2.3: shifts above 14 are treated as 14.
            let ws = syn.wscale.map_or(WSCALE_NONE, |w| u32::from(w.min(14)));
            let bits = ws | if syn.sack_permitted { SACK_BIT } else { 0 };
            let mut tsval = (ts_clock & !TS_OPT_MASK) | bits;
            if SeqNum(tsval).gt(SeqNum(ts_clock)) {
                // Never run ahead of our clock: later TSvals must not look older to PAWS
                // (RFC 7323 §5).
                tsval = tsval.wrapping_sub(1 << TS_OPT_BITS);
            }
            (bits as u8, Some(tsval))
        } else {
            (NO_TS_TAG, None)
        };
        let mac = self.mac(local, remote, peer_isn, t, idx, tag);
        let packed = ((t as u32 & ((1 << T_BITS) - 1)) << 27) | (idx << 24) | mac;
        CookieSynAck {
            isn: SeqNum(self.mask(local, remote, peer_isn).wrapping_add(packed)),
            peer_mss: MSS_TABLE[idx as usize],
            tsval,
        }
    }

    /// Validate the third segment of a cookie handshake: an ACK from `remote` to `local` with
    /// SEG.SEQ `seg_seq`, SEG.ACK `seg_ack` and, if present, the timestamps option's TSecr.
    pub fn validate(
        &self,
        now: Instant,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        seg_seq: SeqNum,
        seg_ack: SeqNum,
        tsecr: Option<u32>,
    ) -> Result<CookieAccepted, CookieError> {
        let peer_isn = seg_seq - 1u32;
        let isn = seg_ack - 1u32;
        let packed = isn.0.wrapping_sub(self.mask(local, remote, peer_isn));
        let t5 = u64::from(packed >> 27);
        let idx = (packed >> 24) & 0x7;
        let mac = packed & MAC_MASK;
        let t_now = self.counter(now);
        let age = (t_now.wrapping_sub(t5)) & ((1 << T_BITS) - 1);
        if age > u64::from(self.cfg.max_age) || age > t_now {
            return Err(CookieError::Expired);
        }
        let t = t_now - age;
        let check = |tag: u8| self.mac(local, remote, peer_isn, t, idx, tag) == mac;
        let (timestamps, bits) = match tsecr {
            Some(ecr) if check((ecr & TS_OPT_MASK) as u8) => (true, ecr & TS_OPT_MASK),
            // A cookie made without timestamps (the SYN had none, or we do not use them:
            // the caller then passes `timestamps: false`), whatever the ACK carries.
            _ if check(NO_TS_TAG) => (false, WSCALE_NONE),
            _ => return Err(CookieError::Invalid),
        };
        let ws = bits & 0xF;
        Ok(CookieAccepted {
            peer_isn,
            isn,
            peer_mss: MSS_TABLE[idx as usize],
            wscale: (timestamps && ws != WSCALE_NONE).then_some(ws.min(14) as u8),
            sack_permitted: timestamps && bits & SACK_BIT != 0,
            timestamps,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::Rng;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn rfc4987_3_6_round_trip_any_tuple_and_options(
            key in any::<[u8; 16]>(),
            (lip, lport, rip, rport) in (any::<u32>(), any::<u16>(), any::<u32>(), any::<u16>()),
            peer_isn in any::<u32>(),
            now_s in 0u64..1_000_000_000,
            later_s in 0u64..128,
            mss in proptest::option::of(any::<u16>()),
            wscale in proptest::option::of(any::<u8>()),
            sack_permitted in any::<bool>(),
            timestamps in any::<bool>(),
            ts_clock in any::<u32>(),
        ) {
            let j = SynCookies::with_key(key, SynCookieConfig::default()).unwrap();
            let l = SocketAddrV4::new(lip.into(), lport);
            let r = SocketAddrV4::new(rip.into(), rport);
            let s = SynInfo { mss, wscale, sack_permitted, timestamps };
            let now = Instant::from_millis(now_s * 1000);
            let c = j.generate(now, l, r, SeqNum(peer_isn), &s, ts_clock);
            prop_assert_eq!(c.tsval.is_some(), timestamps);
            if let Some(tsval) = c.tsval {
                prop_assert!(SeqNum(tsval).le(SeqNum(ts_clock)));
            }
            let ok = j.validate(
                now + Duration::from_secs(later_s), l, r,
                SeqNum(peer_isn) + 1u32, c.isn + 1u32, c.tsval,
            );
            let ok = ok.map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(ok.peer_isn, SeqNum(peer_isn));
            prop_assert_eq!(ok.peer_mss, c.peer_mss);
            prop_assert!(mss.map_or(c.peer_mss == 536, |m| c.peer_mss <= m.max(536)));
            prop_assert_eq!(ok.timestamps, timestamps);
            prop_assert_eq!(ok.sack_permitted, timestamps && sack_permitted);
            prop_assert_eq!(ok.wscale, if timestamps { wscale.map(|w| w.min(14)) } else { None });
            // Another remote port never validates (up to the 2^-24 MAC guess).
            let other = SocketAddrV4::new(rip.into(), rport.wrapping_add(1));
            prop_assert!(j.validate(now, l, other, SeqNum(peer_isn) + 1u32, c.isn + 1u32, c.tsval).is_err());
        }
    }
    use crate::context::testutil::FakeRng;
    use core::net::Ipv4Addr;

    fn addr(last: u8, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, last), port)
    }

    fn jar() -> SynCookies {
        SynCookies::new(&mut FakeRng::new(42), SynCookieConfig::default()).unwrap()
    }

    const L: u16 = 80;
    const R: u16 = 61_440;

    fn syn(mss: u16) -> SynInfo {
        SynInfo {
            mss: Some(mss),
            ..SynInfo::default()
        }
    }

    #[test]
    fn rfc4987_3_6_round_trip_without_timestamps() {
        let j = jar();
        let (l, r) = (addr(1, L), addr(2, R));
        let now = Instant::from_millis(1_000_000);
        let peer_isn = SeqNum(0xFFFF_FFFF); // ISN + 1 wraps
        let c = j.generate(now, l, r, peer_isn, &syn(1460), 0);
        assert_eq!(c.peer_mss, 1460);
        assert_eq!(c.tsval, None);
        let ok = j
            .validate(
                now + Duration::from_secs(1),
                l,
                r,
                peer_isn + 1u32,
                c.isn + 1u32,
                None,
            )
            .unwrap();
        assert_eq!(ok.peer_isn, peer_isn);
        assert_eq!(ok.isn, c.isn);
        assert_eq!(ok.peer_mss, 1460);
        assert_eq!(
            (ok.wscale, ok.sack_permitted, ok.timestamps),
            (None, false, false)
        );
    }

    #[test]
    fn rfc4987_3_6_each_mss_table_entry_round_trips() {
        let j = jar();
        let (l, r) = (addr(1, L), addr(2, R));
        let now = Instant::from_millis(5_000);
        for (i, &m) in MSS_TABLE.iter().enumerate() {
            for announced in [m, m.saturating_add(1)] {
                let c = j.generate(now, l, r, SeqNum(1000 + i as u32), &syn(announced), 0);
                assert_eq!(c.peer_mss, m, "announced {announced}");
                let ok = j
                    .validate(now, l, r, SeqNum(1001 + i as u32), c.isn + 1u32, None)
                    .unwrap();
                assert_eq!(ok.peer_mss, m);
            }
        }
        // Below the table and absent: 536 (RFC 9293 §3.7.1 default).
        assert_eq!(SynCookies::mss_index(Some(100)), 0);
        assert_eq!(SynCookies::mss_index(None), 0);
        assert_eq!(SynCookies::mss_index(Some(u16::MAX)), 7);
        assert_eq!(SynCookies::mss_index(Some(1459)), 5);
    }

    #[test]
    fn rfc7323_options_ride_in_tsval_and_are_authenticated() {
        let j = jar();
        let (l, r) = (addr(1, L), addr(2, R));
        let now = Instant::from_millis(77_000);
        let s = SynInfo {
            mss: Some(1460),
            wscale: Some(9),
            sack_permitted: true,
            timestamps: true,
        };
        let ts_clock = 0x1234_5670;
        let c = j.generate(now, l, r, SeqNum(5), &s, ts_clock);
        let tsval = c.tsval.unwrap();
        assert!(
            SeqNum(tsval).le(SeqNum(ts_clock)),
            "TSval never ahead of the clock"
        );
        assert!(ts_clock - tsval < 64);
        let ok = j
            .validate(now, l, r, SeqNum(6), c.isn + 1u32, Some(tsval))
            .unwrap();
        assert_eq!(
            (ok.wscale, ok.sack_permitted, ok.timestamps),
            (Some(9), true, true)
        );
        // A tampered TSecr (e.g. flipping SACK on) fails the MAC.
        let forged = j.validate(now, l, r, SeqNum(6), c.isn + 1u32, Some(tsval ^ SACK_BIT));
        assert_eq!(forged, Err(CookieError::Invalid));
        // Window scale 15+ is clamped to 14; none is encoded as 15.
        let s2 = SynInfo {
            wscale: Some(200),
            sack_permitted: false,
            ..s
        };
        let c2 = j.generate(now, l, r, SeqNum(9), &s2, 3);
        let tsval2 = c2.tsval.unwrap();
        assert!(SeqNum(tsval2).le(SeqNum(3)), "wraps below a tiny clock");
        let ok2 = j
            .validate(now, l, r, SeqNum(10), c2.isn + 1u32, Some(tsval2))
            .unwrap();
        assert_eq!((ok2.wscale, ok2.sack_permitted), (Some(14), false));
        let s3 = SynInfo { wscale: None, ..s };
        let c3 = j.generate(now, l, r, SeqNum(11), &s3, 1000);
        let ok3 = j
            .validate(now, l, r, SeqNum(12), c3.isn + 1u32, c3.tsval)
            .unwrap();
        assert_eq!(ok3.wscale, None);
    }

    #[test]
    fn rfc4987_3_6_cookie_expires_after_max_age() {
        let j = jar();
        let (l, r) = (addr(1, L), addr(2, R));
        let t0 = Instant::from_millis(64_000 * 100 + 10);
        let c = j.generate(t0, l, r, SeqNum(1), &syn(1460), 0);
        let at = |secs: u64| {
            j.validate(
                t0 + Duration::from_secs(secs),
                l,
                r,
                SeqNum(2),
                c.isn + 1u32,
                None,
            )
        };
        assert!(at(0).is_ok());
        assert!(at(128).is_ok(), "two periods later");
        assert_eq!(at(64 * 3), Err(CookieError::Expired));
        // 32 periods later the 5-bit counter matches again, but the MAC covers the full
        // counter.
        assert_eq!(at(64 * 32), Err(CookieError::Invalid));
        // From the future (clock went backwards / forged counter bits).
        let earlier = j.validate(
            Instant::from_millis(64_000 * 99),
            l,
            r,
            SeqNum(2),
            c.isn + 1u32,
            None,
        );
        assert_eq!(earlier, Err(CookieError::Expired));
        // Near the epoch the age cannot exceed the counter.
        let e = j.validate(Instant::ZERO, l, r, SeqNum(2), SeqNum(0xF000_0000), None);
        assert!(e.is_err());
    }

    #[test]
    fn rfc4987_3_6_forged_or_misdirected_cookies_rejected() {
        let j = jar();
        let (l, r) = (addr(1, L), addr(2, R));
        let now = Instant::from_millis(9_000_000);
        let c = j.generate(now, l, r, SeqNum(100), &syn(1460), 0);
        // Another tuple, another peer ISN, a bit flip, or another key.
        assert!(j
            .validate(now, l, addr(3, R), SeqNum(101), c.isn + 1u32, None)
            .is_err());
        assert!(j
            .validate(now, l, r, SeqNum(102), c.isn + 1u32, None)
            .is_err());
        assert!(j
            .validate(now, l, r, SeqNum(101), c.isn + 2u32, None)
            .is_err());
        // (FakeRng seeds differing only in bit 0 collide, so use 44.)
        let other = SynCookies::new(&mut FakeRng::new(44), SynCookieConfig::default()).unwrap();
        assert!(other
            .validate(now, l, r, SeqNum(101), c.isn + 1u32, None)
            .is_err());
        // Blind guessing: of many random ACK numbers essentially none pass.
        let mut rng = FakeRng::new(7);
        let accepted = (0..20_000)
            .filter(|_| {
                j.validate(now, l, r, SeqNum(101), SeqNum(rng.next_u32()), None)
                    .is_ok()
            })
            .count();
        assert!(accepted <= 1, "{accepted} forgeries accepted");
    }

    #[test]
    fn bad_config_rejected() {
        let k = [0; 16];
        let e = SynCookies::with_key(
            k,
            SynCookieConfig {
                period: Duration::ZERO,
                ..SynCookieConfig::default()
            },
        );
        assert_eq!(e.unwrap_err(), SynCookieConfigError::Period);
        for max_age in [0, 32] {
            let e = SynCookies::with_key(
                k,
                SynCookieConfig {
                    max_age,
                    ..SynCookieConfig::default()
                },
            );
            assert_eq!(e.unwrap_err(), SynCookieConfigError::MaxAge);
        }
        assert!(!SynCookieConfigError::MaxAge.to_string().is_empty());
        assert!(!CookieError::Invalid.to_string().is_empty());
        assert!(!format!("{:?}", jar()).contains("0x"));
    }
}
