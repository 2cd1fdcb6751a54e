//! Per-core tables that turn r2c's connection and listener handles into the 64-bit ids C
//! sees (`luna_conn_t`, `luna_listener_t`), validate the ids C passes back (a stale or
//! made-up id is `EBADF`, never a wrong connection) and hold a `void *` per entry.

use std::collections::HashMap;
use std::ffi::c_void;
use std::hash::Hash;

struct Slot<T> {
    gen: u32,
    entry: Option<(T, *mut c_void)>,
}

/// Ids are `(generation << 32) | (slot + 1)`: never 0, and a reused slot gets a new
/// generation, so an id of a closed connection never names the next one.
pub(crate) struct Handles<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    ids: HashMap<T, u64>,
}

impl<T: Copy + Eq + Hash> Default for Handles<T> {
    fn default() -> Self {
        Handles {
            slots: Vec::new(),
            free: Vec::new(),
            ids: HashMap::new(),
        }
    }
}

fn split(id: u64) -> Option<(usize, u32)> {
    let slot = (id & 0xffff_ffff) as u32;
    (slot != 0).then(|| ((slot - 1) as usize, (id >> 32) as u32))
}

impl<T: Copy + Eq + Hash> Handles<T> {
    /// A new id for `t` (the existing one if `t` is already in).
    pub fn insert(&mut self, t: T) -> u64 {
        if let Some(&id) = self.ids.get(&t) {
            return id;
        }
        let idx = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                self.slots.push(Slot {
                    gen: 0,
                    entry: None,
                });
                self.slots.len() - 1
            }
        };
        let s = &mut self.slots[idx];
        s.gen = s.gen.wrapping_add(1);
        s.entry = Some((t, std::ptr::null_mut()));
        let id = (u64::from(s.gen) << 32) | (idx as u64 + 1);
        self.ids.insert(t, id);
        id
    }

    fn slot(&self, id: u64) -> Option<&(T, *mut c_void)> {
        let (idx, gen) = split(id)?;
        let s = self.slots.get(idx)?;
        (s.gen == gen).then_some(s.entry.as_ref()?)
    }

    /// The handle of `id`.
    pub fn get(&self, id: u64) -> Option<T> {
        self.slot(id).map(|e| e.0)
    }

    /// The id of `t`.
    pub fn id_of(&self, t: T) -> Option<u64> {
        self.ids.get(&t).copied()
    }

    /// The user pointer of `id`.
    pub fn user(&self, id: u64) -> Option<*mut c_void> {
        self.slot(id).map(|e| e.1)
    }

    /// Sets the user pointer of `id`; false for an unknown id.
    pub fn set_user(&mut self, id: u64, p: *mut c_void) -> bool {
        let Some((idx, gen)) = split(id) else {
            return false;
        };
        match self.slots.get_mut(idx) {
            Some(Slot {
                gen: g,
                entry: Some(e),
            }) if *g == gen => {
                e.1 = p;
                true
            }
            _ => false,
        }
    }

    /// Removes `id`; its handle.
    pub fn remove_id(&mut self, id: u64) -> Option<T> {
        let (idx, gen) = split(id)?;
        let s = self.slots.get_mut(idx)?;
        if s.gen != gen {
            return None;
        }
        let (t, _) = s.entry.take()?;
        self.ids.remove(&t);
        self.free.push(idx as u32);
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
}
