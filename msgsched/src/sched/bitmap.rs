//! A fixed-size bitmap of atomics, one bit per worker (idle workers, non-empty FIFOs).

use super::sync::{AtomicU64, Ordering};

/// One bit per worker, in words of 64. Read-modify-writes are AcqRel so that a bit set
/// after a push carries the push to whoever clears or reads the bit; the Dekker-style
/// checks that need more (announce idle vs. push) add a `fence(SeqCst)` at the call site.
pub(crate) struct Bitmap {
    words: Box<[AtomicU64]>,
    len: usize,
}

impl Bitmap {
    pub(crate) fn new(len: usize) -> Self {
        Bitmap {
            words: (0..len.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            len,
        }
    }

    /// Sets bit `i`; returns whether it was already set.
    pub(crate) fn set(&self, i: usize) -> bool {
        let m = 1u64 << (i % 64);
        self.words[i / 64].fetch_or(m, Ordering::AcqRel) & m != 0
    }

    /// Clears bit `i`; returns whether it was set (i.e. whether this call cleared it: of
    /// concurrent callers exactly one gets `true`).
    pub(crate) fn clear(&self, i: usize) -> bool {
        let m = 1u64 << (i % 64);
        self.words[i / 64].fetch_and(!m, Ordering::AcqRel) & m != 0
    }

    pub(crate) fn is_set(&self, i: usize) -> bool {
        self.words[i / 64].load(Ordering::Acquire) & (1u64 << (i % 64)) != 0
    }

    /// Whether any bit other than `except` is set.
    pub(crate) fn any_except(&self, except: usize) -> bool {
        self.words.iter().enumerate().any(|(w, word)| {
            let mut v = word.load(Ordering::Acquire);
            if w == except / 64 {
                v &= !(1u64 << (except % 64));
            }
            v != 0
        })
    }

    /// The set bits, in order starting at `start` and wrapping around (a snapshot, one
    /// load per word), so repeated scans with a moving start do not favour bit 0.
    pub(crate) fn iter_from(&self, start: usize) -> impl Iterator<Item = usize> + '_ {
        let start = if self.len == 0 { 0 } else { start % self.len };
        let nw = self.words.len();
        let first = start / 64;
        // Word `first` is visited twice: its bits >= start first, its bits < start last.
        (0..=nw).flat_map(move |k| {
            let w = (first + k) % nw.max(1);
            let mut v = if nw == 0 {
                0
            } else {
                self.words[w].load(Ordering::Acquire)
            };
            let low = (1u64 << (start % 64)) - 1;
            if k == 0 {
                v &= !low;
            } else if k == nw {
                v &= low;
            }
            std::iter::from_fn(move || {
                if v == 0 {
                    return None;
                }
                let b = v.trailing_zeros() as usize;
                v &= v - 1;
                Some(w * 64 + b)
            })
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn set_clear_report_previous_state() {
        let b = Bitmap::new(300);
        assert!(!b.set(257));
        assert!(b.set(257));
        assert!(b.is_set(257));
        assert!(b.clear(257));
        assert!(!b.clear(257));
        assert!(!b.is_set(257));
    }

    #[test]
    fn iter_from_wraps_and_visits_each_bit_once() {
        let b = Bitmap::new(256);
        for i in [0, 5, 63, 64, 130, 255] {
            b.set(i);
        }
        let v: Vec<_> = b.iter_from(64).collect();
        assert_eq!(v, [64, 130, 255, 0, 5, 63]);
        let v: Vec<_> = b.iter_from(6).collect();
        assert_eq!(v, [63, 64, 130, 255, 0, 5]);
        let v: Vec<_> = b.iter_from(0).collect();
        assert_eq!(v, [0, 5, 63, 64, 130, 255]);
        let v: Vec<_> = b.iter_from(256 + 5).collect();
        assert_eq!(v, [5, 63, 64, 130, 255, 0]);
    }

    #[test]
    fn any_except_ignores_one_bit() {
        let b = Bitmap::new(70);
        b.set(66);
        assert!(!b.any_except(66));
        assert!(b.any_except(1));
        b.set(3);
        assert!(b.any_except(66));
    }
}
