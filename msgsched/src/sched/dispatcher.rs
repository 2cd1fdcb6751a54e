//! The dispatcher: placement on the I/O core (handoff, power-of-two choices, CP hash,
//! CS gating per key).

use super::stats::Stats;
use super::sync::{fence, Arc, Ordering};
use super::{partition, Model, Placed, Rejected, SchedConfig, Shared};
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;

/// The I/O core's end of the scheduler. `Send`, but used from one thread (`&mut self`).
/// Dropping it disconnects the workers: they drain what is queued, then get
/// [`super::RecvError::Disconnected`]. Messages still held under CS are dropped with it.
pub struct Dispatcher<T> {
    shared: Arc<Shared<T>>,
    rng: XorShift,
    /// Most messages held per key under CS.
    held_cap: usize,
    /// CS: keys with a message in service or held. Absent = idle key.
    keys: HashMap<u64, KeyState<T>>,
    /// CS: keys whose message in service completed but whose next held message found no
    /// room; retried, in order, by [`Dispatcher::poll`].
    ready: VecDeque<u64>,
    held_now: usize,
    /// The caller's current epoch ([`Dispatcher::end_epoch`]), given to `on_release`.
    epoch: u64,
    /// CS: applied to a held message when it is released ([`Dispatcher::stamp_releases`]).
    on_release: Option<fn(&mut T, u64)>,
}

struct KeyState<T> {
    in_service: bool,
    held: VecDeque<T>,
}

impl<T: Send> Dispatcher<T> {
    pub(super) fn new(shared: Arc<Shared<T>>, cfg: &SchedConfig) -> Self {
        Dispatcher {
            shared,
            rng: XorShift::new(cfg.seed),
            held_cap: cfg.queue_capacity,
            keys: HashMap::default(),
            ready: VecDeque::new(),
            held_now: 0,
            epoch: 0,
            on_release: None,
        }
    }

    /// The current epoch: the caller stamps what it places with it, and the
    /// [`Dispatcher::stamp_releases`] hook gets it for what is released.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Ends the current epoch and returns it; later placements and releases carry the
    /// next one (msgsched's `MsgIo::end_epoch`).
    pub fn end_epoch(&mut self) -> u64 {
        self.epoch += 1;
        self.epoch - 1
    }

    /// CS: `f(message, epoch)` runs on each held message as it is released to the workers
    /// (after its connection's previous message completed), with the current
    /// [`Dispatcher::epoch`]: a message held for a while becomes available only
    /// then, and the caller may record when (msgsched's `Origin::epoch`).
    pub fn stamp_releases(&mut self, f: fn(&mut T, u64)) {
        self.on_release = Some(f);
    }

    /// Places `msg` of connection `key` according to the model. Under CS, first drains
    /// the completion ring (as [`Dispatcher::poll`]). On `Err` the message comes back
    /// untouched: nothing was queued.
    pub fn dispatch(&mut self, key: u64, msg: T) -> Result<Placed, Rejected<T>> {
        let r = match self.shared.model {
            Model::Cp => self.place_cp(key, msg),
            Model::Ms => self.place_shared(msg),
            Model::Cs => {
                self.poll();
                self.dispatch_cs(key, msg)
            }
        };
        r.map_err(|msg| {
            self.shared.counters.bump(&self.shared.counters.rejected);
            Rejected { key, msg }
        })
    }

    /// CS: the message in service for `key` is done (its reply or completion reached the
    /// I/O core); the key's next held message, if any, is placed. Returns `false` if
    /// `key` had no message in service (a stray or duplicate completion, ignored).
    /// Does nothing under MS and CP (returns `false`).
    pub fn complete(&mut self, key: u64) -> bool {
        let Some(st) = self.keys.get_mut(&key) else {
            return false;
        };
        if !st.in_service {
            return false;
        }
        st.in_service = false;
        if !self.release(key) {
            self.ready.push_back(key);
        }
        true
    }

    /// Drains completions pushed by [`super::Worker::finish`] (CS), as if
    /// [`Dispatcher::complete`] were called for each, then retries held messages that
    /// found no room earlier. Returns the number of completions drained. Call it from
    /// the I/O core's loop; `dispatch` also calls it under CS.
    pub fn poll(&mut self) -> usize {
        let mut n = 0;
        while let Some(key) = self.shared.completions.pop() {
            self.complete(key);
            n += 1;
        }
        while let Some(&key) = self.ready.front() {
            if !self.release(key) {
                break;
            }
            self.ready.pop_front();
        }
        n
    }

    /// CS: connection `key` has gone. Its messages held behind the one in service are
    /// handed back (the caller drops them; none is placed), and the key is forgotten:
    /// the completion of its message in service, which will not come, is not waited
    /// for. Empty under MS and CP, and for an idle key.
    pub fn forget(&mut self, key: u64) -> VecDeque<T> {
        let Some(st) = self.keys.remove(&key) else {
            return VecDeque::new();
        };
        self.ready.retain(|&k| k != key);
        self.held_now -= st.held.len();
        st.held
    }

    /// CS: messages held in the dispatcher now.
    pub fn held(&self) -> usize {
        self.held_now
    }

    /// CP: the worker that serves `key` (the same under every model, but only CP uses it).
    pub fn worker_of(&self, key: u64) -> usize {
        partition(key, self.shared.slots.len())
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.shared.slots.len()
    }

    /// The queueing model.
    pub fn model(&self) -> Model {
        self.shared.model
    }

    /// Messages worker `w` has taken so far (its progress counter). The room a take
    /// frees in a FIFO is visible to every dispatch after a read that saw the take
    /// counted (Release/Acquire), so a caller holding messages that were refused may
    /// retry them only once some count has moved since the read before the refusal:
    /// under CP the key's worker's, under MS and CS any worker's (room can appear no
    /// other way).
    pub fn taken(&self, w: usize) -> u64 {
        self.shared.slots[w].taken.load(Ordering::Acquire)
    }

    /// CS: whether `key` has a message in service or held (its next message is held,
    /// [`Placed::Held`], and competes for no FIFO). False under MS and CP.
    pub fn holds(&self, key: u64) -> bool {
        self.keys.contains_key(&key)
    }

    /// A snapshot of the counters and per-worker gauges.
    pub fn stats(&self) -> Stats {
        Stats::snapshot(&self.shared)
    }

    fn dispatch_cs(&mut self, key: u64, msg: T) -> Result<Placed, T> {
        if let Some(st) = self.keys.get_mut(&key) {
            // Busy key: one message in service (or queued) per connection at a time.
            if st.held.len() >= self.held_cap {
                return Err(msg);
            }
            st.held.push_back(msg);
            self.held_now += 1;
            self.shared.counters.bump(&self.shared.counters.held);
            return Ok(Placed::Held);
        }
        let p = self.place_shared(msg)?;
        self.keys.insert(
            key,
            KeyState {
                in_service: true,
                held: VecDeque::new(),
            },
        );
        Ok(p)
    }

    /// Places the next held message of `key` (not in service). Returns `false` if it
    /// found no room (the message stays at the head of the key's FIFO).
    fn release(&mut self, key: u64) -> bool {
        let st = self.keys.get_mut(&key).expect("released key has state");
        debug_assert!(!st.in_service);
        let Some(mut msg) = st.held.pop_front() else {
            self.keys.remove(&key);
            return true;
        };
        if let Some(f) = self.on_release {
            f(&mut msg, self.epoch);
        }
        match place_shared(&self.shared, &mut self.rng, msg) {
            Ok(_) => {
                st.in_service = true;
                self.held_now -= 1;
                true
            }
            Err(msg) => {
                st.held.push_front(msg);
                false
            }
        }
    }

    /// CP: the key's worker FIFO, then wake that worker if it announced idle. No
    /// handoff (its mailbox would overtake its FIFO and reorder the connection).
    fn place_cp(&mut self, key: u64, msg: T) -> Result<Placed, T> {
        let s = &*self.shared;
        let w = partition(key, s.slots.len());
        s.slots[w].fifo.push(msg)?;
        s.publish();
        s.counters.bump(&s.counters.partitioned);
        // Pairs with the worker's fence after announcing idle: it sees the message in
        // its FIFO, or we see its idle bit.
        fence(Ordering::SeqCst);
        if s.idle.is_set(w) {
            s.slots[w].unparker.unpark();
            s.counters.bump(&s.counters.wakeups);
        }
        Ok(Placed::Queued(w))
    }

    fn place_shared(&mut self, msg: T) -> Result<Placed, T> {
        place_shared(&self.shared, &mut self.rng, msg)
    }
}

/// MS placement (also CS for a free key): handoff to an idle worker, else power-of-two
/// choices, else any FIFO with room.
fn place_shared<T>(s: &Shared<T>, rng: &mut XorShift, mut msg: T) -> Result<Placed, T> {
    let n = s.slots.len();
    let start = rng.below(n);
    for w in s.idle.iter_from(start) {
        // Claim: of everyone clearing this bit (us, or the worker withdrawing) exactly
        // one sees it set. Having claimed it, the mailbox is ours to fill (invariant in
        // worker.rs: the worker announced idle with an empty mailbox and nobody else
        // could claim it since).
        if !s.idle.clear(w) {
            continue;
        }
        let slot = &s.slots[w];
        match slot.mailbox.push(msg) {
            Ok(()) => {
                s.publish();
                slot.unparker.unpark();
                s.counters.bump(&s.counters.handoffs);
                return Ok(Placed::Handoff(w));
            }
            Err(m) => {
                // Unreachable while the invariant holds; the worker still finds the
                // mailbox message it was claimed for, so fall back to a FIFO.
                debug_assert!(false, "claimed worker {w} had a full mailbox");
                slot.unparker.unpark();
                msg = m;
                break;
            }
        }
    }
    let (a, b) = if n == 1 {
        (0, 0)
    } else {
        let a = rng.below(n);
        let mut b = rng.below(n - 1);
        if b >= a {
            b += 1;
        }
        (a, b)
    };
    let (first, second) = if s.slots[b].fifo.len() < s.slots[a].fifo.len() {
        (b, a)
    } else {
        (a, b)
    };
    let scan_start = rng.below(n);
    let candidates = [first, second]
        .into_iter()
        .chain((0..n).map(|k| (scan_start + k) % n));
    for w in candidates {
        match s.slots[w].fifo.push(msg) {
            Ok(()) => {
                s.counters.bump(&s.counters.p2c);
                s.mark_nonempty(w, start);
                return Ok(Placed::Queued(w));
            }
            Err(m) => msg = m,
        }
    }
    Err(msg)
}

impl<T> Drop for Dispatcher<T> {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.disconnected.store(true, Ordering::SeqCst);
        s.publish();
        // Pairs with the fence of a worker announcing idle: it sees the flag, or it
        // gets the unpark below.
        fence(Ordering::SeqCst);
        for slot in s.slots.iter() {
            slot.unparker.unpark();
        }
    }
}

/// xorshift64* (Vigna): placement randomness, not security.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        XorShift(if seed == 0 {
            0x853C_49E6_748F_EA9B
        } else {
            seed
        })
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform enough in `0..n` (multiply-shift of the high bits), `n >= 1`.
    fn below(&mut self, n: usize) -> usize {
        (((self.next() >> 32) * n as u64) >> 32) as usize
    }
}
