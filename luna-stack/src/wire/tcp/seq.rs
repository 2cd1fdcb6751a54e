//! TCP sequence numbers and their modulo-2^32 arithmetic.

use core::cmp::Ordering;
use core::fmt;
use core::ops::{Add, AddAssign, Sub};

/// A TCP sequence number.
///
/// RFC 9293 §3.4: sequence space is finite (0..2^32-1) and all arithmetic is modulo 2^32;
/// comparisons are only meaningful for numbers less than 2^31 apart, which is what
/// `PartialOrd` implements (serial-number arithmetic, RFC 1982). It deliberately does not
/// implement `Ord`: the order is not transitive over the whole space.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SeqNum(pub u32);

impl SeqNum {
    /// The signed distance `self - other`, valid when the two are within 2^31.
    pub fn diff(self, other: SeqNum) -> i32 {
        self.0.wrapping_sub(other.0) as i32
    }

    /// `self < other` in sequence space.
    pub fn lt(self, other: SeqNum) -> bool {
        self.diff(other) < 0
    }

    /// `self <= other` in sequence space.
    pub fn le(self, other: SeqNum) -> bool {
        self.diff(other) <= 0
    }

    /// `self > other` in sequence space.
    pub fn gt(self, other: SeqNum) -> bool {
        self.diff(other) > 0
    }

    /// `self >= other` in sequence space.
    pub fn ge(self, other: SeqNum) -> bool {
        self.diff(other) >= 0
    }

    /// The later of two sequence numbers.
    pub fn max(self, other: SeqNum) -> SeqNum {
        if self.ge(other) {
            self
        } else {
            other
        }
    }

    /// The earlier of two sequence numbers.
    pub fn min(self, other: SeqNum) -> SeqNum {
        if self.le(other) {
            self
        } else {
            other
        }
    }

    /// `start <= self < end` in sequence space (RFC 9293 §3.4 window tests).
    pub fn in_range(self, start: SeqNum, end: SeqNum) -> bool {
        self.ge(start) && self.lt(end)
    }
}

impl PartialOrd for SeqNum {
    fn partial_cmp(&self, other: &SeqNum) -> Option<Ordering> {
        Some(self.diff(*other).cmp(&0))
    }
}

impl Add<u32> for SeqNum {
    type Output = SeqNum;
    fn add(self, rhs: u32) -> SeqNum {
        SeqNum(self.0.wrapping_add(rhs))
    }
}

impl Add<usize> for SeqNum {
    type Output = SeqNum;
    fn add(self, rhs: usize) -> SeqNum {
        // Truncation is the intent: sequence space is modulo 2^32.
        SeqNum(self.0.wrapping_add(rhs as u32))
    }
}

impl AddAssign<u32> for SeqNum {
    fn add_assign(&mut self, rhs: u32) {
        *self = *self + rhs;
    }
}

impl AddAssign<usize> for SeqNum {
    fn add_assign(&mut self, rhs: usize) {
        *self = *self + rhs;
    }
}

impl Sub<u32> for SeqNum {
    type Output = SeqNum;
    fn sub(self, rhs: u32) -> SeqNum {
        SeqNum(self.0.wrapping_sub(rhs))
    }
}

impl Sub<SeqNum> for SeqNum {
    type Output = u32;
    /// The forward distance from `rhs` to `self` (modulo 2^32).
    fn sub(self, rhs: SeqNum) -> u32 {
        self.0.wrapping_sub(rhs.0)
    }
}

impl fmt::Debug for SeqNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for SeqNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// FNV-1a over `bytes`: a cheap content fingerprint for test digests.
#[cfg(test)]
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc9293_3_4_comparisons_wrap_around() {
        let a = SeqNum(0xFFFF_FFF0);
        let b = a + 0x20u32;
        assert_eq!(b.0, 0x10);
        assert!(a.lt(b) && b.gt(a));
        assert_eq!(b - a, 0x20);
        assert!(SeqNum(5).in_range(SeqNum(0xFFFF_FFFF), SeqNum(6)));
        assert!(!SeqNum(6).in_range(SeqNum(0xFFFF_FFFF), SeqNum(6)));
        assert_eq!(a.max(b), b);
        assert_eq!(a.min(b), a);
    }

    #[test]
    fn isn_ffffffff_does_not_overflow() {
        // Regression class from other stacks: ISN 0xFFFFFFFF + SYN must wrap to 0.
        let isn = SeqNum(u32::MAX);
        assert_eq!(isn + 1u32, SeqNum(0));
        assert!((isn + 1u32).gt(isn));
    }
}
