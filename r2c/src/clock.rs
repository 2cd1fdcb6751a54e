//! Monotonic clocks converted to the stack's [`Instant`].

use luna_stack::time::Instant;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// A monotonic time source.
pub trait Clock {
    /// The current time.
    fn now(&mut self) -> Instant;
}

/// One epoch for the whole process, so instants from different cores are comparable.
fn epoch() -> std::time::Instant {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

/// `std::time::Instant` (CLOCK_MONOTONIC through the vDSO): always available.
#[derive(Debug, Clone, Copy)]
pub struct StdClock {
    epoch: std::time::Instant,
}

impl StdClock {
    /// A clock on the process-wide epoch.
    pub fn new() -> Self {
        StdClock { epoch: epoch() }
    }
}

impl Default for StdClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for StdClock {
    fn now(&mut self) -> Instant {
        let ns = self.epoch.elapsed().as_nanos();
        Instant::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

/// The TSC read through DPDK (`rte_rdtsc`), converted with the EAL's calibrated rate.
/// Monotonic on CPUs with an invariant TSC (every x86 server DPDK supports).
#[derive(Debug, Clone, Copy)]
pub struct TscClock {
    base: u64,
    /// Nanoseconds per tick as a 32.32 fixed-point factor: a multiply per reading instead
    /// of a 128-bit division (the core reads the clock every iteration).
    mult: u128,
}

impl TscClock {
    /// A clock ticking at `hz` (from `dpdk_sys::eal::Eal::tsc_hz`); `None` if `hz` is 0.
    pub fn new(hz: u64) -> Option<Self> {
        (hz > 0).then(|| TscClock {
            base: dpdk_sys::eal::rdtsc(),
            mult: (1_000_000_000u128 << 32) / u128::from(hz),
        })
    }

    fn ns(&self, ticks: u64) -> u64 {
        // Relative error ≤ 2^-32 · hz / 1e9 (below 1e-8 for any real TSC).
        u64::try_from((u128::from(ticks) * self.mult) >> 32).unwrap_or(u64::MAX)
    }
}

impl Clock for TscClock {
    fn now(&mut self) -> Instant {
        let ticks = dpdk_sys::eal::rdtsc().saturating_sub(self.base);
        Instant::from_nanos(self.ns(ticks))
    }
}

/// A clock that only moves when told to (tests): clones share one time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: luna_stack::time::Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.0.fetch_add(ns, Ordering::Release);
    }

    /// The current time in nanoseconds.
    pub fn nanos(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

impl PartialEq for ManualClock {
    /// The same clock (not the same reading).
    fn eq(&self, o: &Self) -> bool {
        Arc::ptr_eq(&self.0, &o.0)
    }
}

impl Eq for ManualClock {}

impl Clock for ManualClock {
    fn now(&mut self) -> Instant {
        Instant::from_nanos(self.nanos())
    }
}

/// Which clock a core uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ClockSource {
    /// `std::time::Instant`.
    #[default]
    Std,
    /// The TSC at this rate (ticks per second, from `Eal::tsc_hz`).
    Tsc(u64),
    /// A [`ManualClock`] (tests: time moves only when the test moves it).
    Manual(ManualClock),
}

/// The clock a core runs on.
#[derive(Debug, Clone)]
pub enum CoreClock {
    /// See [`StdClock`].
    Std(StdClock),
    /// See [`TscClock`].
    Tsc(TscClock),
    /// See [`ManualClock`].
    Manual(ManualClock),
}

impl CoreClock {
    /// The clock for `src`; the TSC falls back to `std` with a zero rate.
    pub fn new(src: ClockSource) -> Self {
        match src {
            ClockSource::Tsc(hz) => match TscClock::new(hz) {
                Some(t) => CoreClock::Tsc(t),
                None => CoreClock::Std(StdClock::new()),
            },
            ClockSource::Manual(m) => CoreClock::Manual(m),
            ClockSource::Std => CoreClock::Std(StdClock::new()),
        }
    }
}

impl Clock for CoreClock {
    fn now(&mut self) -> Instant {
        match self {
            CoreClock::Std(c) => c.now(),
            CoreClock::Tsc(c) => c.now(),
            CoreClock::Manual(c) => c.now(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsc_conversion_matches_the_exact_division() {
        for hz in [
            1_000_000_000u64,
            2_100_000_000,
            2_994_375_000,
            3_700_000_001,
        ] {
            let c = TscClock {
                base: 0,
                mult: (1_000_000_000u128 << 32) / u128::from(hz),
            };
            for ticks in [0u64, 1, 12_345, hz, 3600 * hz, 86_400 * 365 * hz] {
                let exact = (u128::from(ticks) * 1_000_000_000 / u128::from(hz)) as u64;
                let got = c.ns(ticks);
                // Below 1e-8 relative (plus the truncation of one ns).
                assert!(
                    exact - got <= exact / 100_000_000 + 1,
                    "{hz} Hz, {ticks}: {got} vs {exact}"
                );
            }
        }
    }

    #[test]
    fn clocks_never_go_back() {
        let mut c = CoreClock::new(ClockSource::default());
        let mut last = c.now();
        for _ in 0..1000 {
            let t = c.now();
            assert!(t >= last);
            last = t;
        }
    }
}
