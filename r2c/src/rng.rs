//! The per-core CSPRNG. It keys the stack's ISNs (RFC 6528) and SYN cookies, so it must be
//! unpredictable: ChaCha20 seeded from the OS (`getrandom`).

use chacha20::ChaCha20Rng;
use core::fmt;
use rand_core::{Rng as _, SeedableRng};

/// The OS refused to provide a seed.
#[derive(Debug, Clone)]
pub struct SeedError(pub String);

impl fmt::Display for SeedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot seed the CSPRNG from the OS (getrandom): {}",
            self.0
        )
    }
}

impl std::error::Error for SeedError {}

/// ChaCha20, one per core.
pub struct CoreRng(ChaCha20Rng);

impl CoreRng {
    /// Seeded from the OS.
    pub fn from_os() -> Result<Self, SeedError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| SeedError(e.to_string()))?;
        Ok(CoreRng(ChaCha20Rng::from_seed(seed)))
    }

    /// A fixed seed: reproducible runs in tests. Never use it in production: ISNs and SYN
    /// cookies become predictable.
    pub fn from_seed(seed: [u8; 32]) -> Self {
        CoreRng(ChaCha20Rng::from_seed(seed))
    }
}

impl fmt::Debug for CoreRng {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CoreRng(ChaCha20)")
    }
}

impl luna_stack::context::Rng for CoreRng {
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.0.fill_bytes(dest);
    }

    fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }

    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use luna_stack::context::Rng;

    #[test]
    fn os_seeded_generators_differ_and_fixed_seeds_repeat() {
        let (mut a, mut b) = (CoreRng::from_os().unwrap(), CoreRng::from_os().unwrap());
        assert_ne!(a.next_u64(), b.next_u64());
        let (mut c, mut d) = (CoreRng::from_seed([7; 32]), CoreRng::from_seed([7; 32]));
        let mut x = [0u8; 40];
        let mut y = [0u8; 40];
        c.fill_bytes(&mut x);
        d.fill_bytes(&mut y);
        assert_eq!(x, y);
        assert_ne!(x, [0u8; 40]);
    }
}
