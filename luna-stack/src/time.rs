//! Time as the core sees it: a monotonic instant passed in by the driver.

use core::fmt;
use core::ops::{Add, AddAssign, Sub};
pub use core::time::Duration;

/// A point on the driver's monotonic clock, in nanoseconds since an arbitrary epoch.
///
/// The core never reads a clock; r2c passes TSC-derived instants, tests pass fake ones.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The epoch of the driver's clock.
    pub const ZERO: Instant = Instant(0);

    /// An instant `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant(nanos)
    }

    /// An instant `micros` microseconds after the epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Instant(micros.saturating_mul(1_000))
    }

    /// An instant `millis` milliseconds after the epoch.
    pub const fn from_millis(millis: u64) -> Self {
        Instant(millis.saturating_mul(1_000_000))
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Microseconds since the epoch (truncated).
    pub const fn as_micros(self) -> u64 {
        self.0 / 1_000
    }

    /// Time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(nanos))
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    /// Saturating: an earlier minus a later instant is zero.
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:06}ms", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let a = Instant::from_millis(5);
        let b = a + Duration::from_micros(1500);
        assert_eq!(b.as_micros(), 6_500);
        assert_eq!(b - a, Duration::from_micros(1500));
        assert_eq!(a - b, Duration::ZERO);
        assert_eq!(
            Instant::from_nanos(u64::MAX) + Duration::from_secs(1),
            Instant::from_nanos(u64::MAX)
        );
    }
}
