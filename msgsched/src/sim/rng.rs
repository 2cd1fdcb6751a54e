//! A small seeded PRNG: xoshiro256** (Blackman and Vigna) seeded through splitmix64.
//! Not cryptographic; fast, 2^256 - 1 period, and stable across platforms, which is what
//! byte-identical simulator output needs.

/// One step of splitmix64: used to expand a 64-bit seed into xoshiro's 256-bit state.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// xoshiro256** generator.
#[derive(Clone, Debug)]
pub(crate) struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator for `(seed, stream)`: distinct streams give independent sequences, so
    /// arrivals, connection choice and service times each draw from their own stream and
    /// two models run with the same seed see the same messages (common random numbers).
    pub(crate) fn new(seed: u64, stream: u64) -> Self {
        let mut sm = seed ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03);
        let mut s = [0u64; 4];
        for w in &mut s {
            *w = splitmix64(&mut sm);
        }
        // An all-zero state is the one fixed point; splitmix64 cannot produce four zeros in a
        // row, but keep the guard so the invariant is local.
        if s == [0; 4] {
            s[0] = 1;
        }
        Rng { s }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform on (0, 1]: never 0, so `-ln(u)` is finite.
    pub(crate) fn open01(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Exponential with the given mean.
    pub(crate) fn exp(&mut self, mean: f64) -> f64 {
        -mean * self.open01().ln()
    }

    /// Uniform integer in `0..n` (multiply-shift; bias at most n / 2^64). `n > 0`.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4).map(|_| Rng::new(7, 0).next_u64()).collect();
        let mut r = Rng::new(7, 0);
        let b: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
        assert!(a.iter().all(|&x| x == b[0]));
        assert_ne!(b[0], b[1]);
        assert_ne!(Rng::new(7, 0).next_u64(), Rng::new(7, 1).next_u64());
        assert_ne!(Rng::new(7, 0).next_u64(), Rng::new(8, 0).next_u64());
    }

    #[test]
    fn uniform_and_exponential_moments() {
        let mut r = Rng::new(1, 2);
        let n = 200_000;
        let mut su = 0.0;
        let mut se = 0.0;
        let mut counts = [0usize; 5];
        for _ in 0..n {
            let u = r.open01();
            assert!(u > 0.0 && u <= 1.0);
            su += u;
            se += r.exp(2.0);
            counts[r.below(5)] += 1;
        }
        assert!((su / n as f64 - 0.5).abs() < 0.005);
        assert!((se / n as f64 - 2.0).abs() < 0.03);
        for c in counts {
            assert!((c as f64 / n as f64 - 0.2).abs() < 0.005, "{counts:?}");
        }
    }
}
