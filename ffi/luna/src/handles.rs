//! Per-core tables that turn r2c's connection and listener handles into the 64-bit ids C
//! sees (`luna_conn_t`, `luna_listener_t`), validate the ids C passes back (a stale or
//! made-up id, or one of another core, is `EBADF`, never a wrong connection) and hold a
//! `void *` per entry.

use std::collections::HashMap;
use std::ffi::c_void;
use std::hash::Hash;

/// Bits of an id that count the table's ids; the bits above name the core.
const SERIAL_BITS: u32 = 48;
const SERIAL_MASK: u64 = (1 << SERIAL_BITS) - 1;

/// Ids are `(core + 1) << 48 | serial`, the serial counting every id the core's table
/// handed out: never 0, never an id of another core (of the first 65,535), and an id of
/// a closed connection does not come back before 2^48 more (8.9 years at a million
/// connections a second on one core). A per-slot generation came back after 2^32 reuses
/// of one slot, and every core's first connection had the same id.
pub(crate) struct Handles<T> {
    tag: u64,
    serial: u64,
    entries: HashMap<u64, (T, *mut c_void)>,
    ids: HashMap<T, u64>,
}

impl<T: Copy + Eq + Hash> Default for Handles<T> {
    fn default() -> Self {
        Self::new(0)
    }
}

impl<T: Copy + Eq + Hash> Handles<T> {
    /// The table of core `core` (ids of other cores' tables are not valid in it).
    pub fn new(core: usize) -> Self {
        Handles {
            tag: ((core as u64 % 0xffff) + 1) << SERIAL_BITS,
            serial: 0,
            entries: HashMap::new(),
            ids: HashMap::new(),
        }
    }

    /// Test only: as if `n` more ids had been handed out and removed.
    #[cfg(test)]
    fn fast_forward(&mut self, n: u64) {
        self.serial = (self.serial + n) & SERIAL_MASK;
    }

    /// A new id for `t` (the existing one if `t` is already in).
    pub fn insert(&mut self, t: T) -> u64 {
        if let Some(&id) = self.ids.get(&t) {
            return id;
        }
        self.serial = (self.serial + 1) & SERIAL_MASK;
        if self.serial == 0 {
            self.serial = 1;
        }
        let id = self.tag | self.serial;
        self.entries.insert(id, (t, std::ptr::null_mut()));
        self.ids.insert(t, id);
        id
    }

    /// The handle of `id`.
    pub fn get(&self, id: u64) -> Option<T> {
        self.entries.get(&id).map(|e| e.0)
    }

    /// The id of `t`.
    pub fn id_of(&self, t: T) -> Option<u64> {
        self.ids.get(&t).copied()
    }

    /// The user pointer of `id`.
    pub fn user(&self, id: u64) -> Option<*mut c_void> {
        self.entries.get(&id).map(|e| e.1)
    }

    /// Sets the user pointer of `id`; false for an unknown id.
    pub fn set_user(&mut self, id: u64, p: *mut c_void) -> bool {
        match self.entries.get_mut(&id) {
            Some(e) => {
                e.1 = p;
                true
            }
            None => false,
        }
    }

    /// Removes `id`; its handle.
    pub fn remove_id(&mut self, id: u64) -> Option<T> {
        let (t, _) = self.entries.remove(&id)?;
        self.ids.remove(&t);
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_validated_and_never_reused() {
        let mut h: Handles<u32> = Handles::default();
        let a = h.insert(7);
        assert_ne!(a, 0);
        assert_eq!(h.get(a), Some(7));
        assert_eq!(h.insert(7), a, "the same handle keeps its id");
        assert!(h.set_user(a, 0x10 as *mut c_void));
        assert_eq!(h.user(a), Some(0x10 as *mut c_void));
        assert_eq!(h.remove_id(a), Some(7));
        assert_eq!(h.get(a), None, "a removed id is gone");
        let b = h.insert(8);
        assert_ne!(a, b, "a reused slot gets a new generation");
        assert_eq!(h.get(a), None);
        assert_eq!(
            h.user(b),
            Some(std::ptr::null_mut()),
            "fresh entries carry NULL"
        );
        for bad in [0u64, 1 << 32, u64::MAX, b + 1, b ^ (1 << 40)] {
            assert_eq!(h.get(bad), None, "{bad:#x}");
            assert!(!h.set_user(bad, std::ptr::null_mut()));
            assert_eq!(h.remove_id(bad), None);
        }
        assert_eq!(h.get(b), Some(8));
    }

    #[test]
    fn an_id_of_another_core_is_not_valid_here() {
        let mut c0: Handles<u32> = Handles::new(0);
        let mut c1: Handles<u32> = Handles::new(1);
        let a = c0.insert(7);
        let b = c1.insert(9);
        assert_ne!(a, b, "ids of two cores differ");
        assert_eq!(c1.get(a), None, "core 0's id names nothing on core 1");
        assert_eq!(c0.get(b), None);
        assert!(!c1.set_user(a, std::ptr::null_mut()));
        assert_eq!(c1.remove_id(a), None);
        assert_eq!(c1.get(b), Some(9));
    }

    #[test]
    fn an_id_is_not_reused_when_a_slot_has_been_reused_2_pow_32_times() {
        let mut h: Handles<u32> = Handles::new(0);
        let a = h.insert(7);
        assert_eq!(h.remove_id(a), Some(7));
        h.fast_forward(u64::from(u32::MAX));
        for t in 8..12 {
            let b = h.insert(t);
            assert_ne!(b, a, "the first connection's id named a later one");
            assert_eq!(h.get(a), None);
            h.remove_id(b);
        }
    }
}
