//! Context traits: the side effects the core needs, supplied by the driver.
//!
//! r2c implements these per core; tests use the fakes in [`testutil`].

/// A source of randomness. ISNs (RFC 6528) and SYN-cookie secrets are keyed from it, so
/// production drivers must back it with a CSPRNG (getrandom / RDRAND); tests use a seeded one.
pub trait Rng {
    /// Fill `dest` with random bytes.
    fn fill_bytes(&mut self, dest: &mut [u8]);

    /// A uniformly random `u32`.
    fn next_u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.fill_bytes(&mut b);
        u32::from_le_bytes(b)
    }

    /// A uniformly random `u64`.
    fn next_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.fill_bytes(&mut b);
        u64::from_le_bytes(b)
    }
}

/// Deterministic doubles for tests.
pub mod testutil {
    use super::Rng;

    /// A seeded xorshift64* generator: deterministic, NOT cryptographically secure.
    #[derive(Debug, Clone)]
    pub struct FakeRng(u64);

    impl FakeRng {
        /// A generator whose stream is fixed by `seed`.
        pub fn new(seed: u64) -> Self {
            // SplitMix64's finaliser spreads every seed bit over the state (distinct seeds,
            // distinct streams); zero is a fixed point of xorshift, so map it away.
            let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            FakeRng(if z == 0 { 1 } else { z })
        }
    }

    impl Rng for FakeRng {
        fn fill_bytes(&mut self, dest: &mut [u8]) {
            for chunk in dest.chunks_mut(8) {
                let v = self.next_u64();
                chunk.copy_from_slice(&v.to_le_bytes()[..chunk.len()]);
            }
        }

        fn next_u64(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn fake_rng_is_deterministic_per_seed() {
            let (mut a, mut b, mut c) = (FakeRng::new(1), FakeRng::new(1), FakeRng::new(2));
            let (x, y, z) = (a.next_u64(), b.next_u64(), c.next_u64());
            assert_eq!(x, y);
            assert_ne!(x, z);
            // Every seed its own stream (the first version mapped 2k and 2k+1 together).
            let firsts: std::collections::HashSet<u64> =
                (0..4096).map(|s| FakeRng::new(s).next_u64()).collect();
            assert_eq!(firsts.len(), 4096);
        }
    }
}
