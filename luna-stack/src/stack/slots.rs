//! The slot table: connection entries behind generation-checked handles, the demux map's
//! upkeep, the per-connection bookkeeping after every change (events, dirty list, timer queue)
//! and the stack's timers (`poll_timeout` / `handle_timeouts`, over the timer queue).

use super::{Event, Held, HighWater, ListenerHandle, SocketHandle, Stack, StackCounters};
use crate::context::Rng;
use crate::tcp::conn::{Connection, Events, OutSegment};
use crate::tcp::State;
use crate::time::{Duration, Instant};
use crate::wire::EthernetAddress;
use core::hash::BuildHasher;
use core::net::Ipv4Addr;
use siphasher::sip::SipHasher13;
use std::collections::VecDeque;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Owner {
    /// The application holds the handle.
    App,
    /// Created by a listener; not yet accepted.
    Listener(u32),
    /// The application released the handle; reclaim when the connection is closed.
    Released,
}

/// `repr(C)` for its layout: the connection, then the fields the per-segment paths touch
/// in two cache lines (the next-hop MAC cache, owner, queue shares, next hop, header
/// template, IP identification, dirty flag: 127 bytes from a line boundary, since
/// `Connection` is line-aligned and a whole number of lines), then the cold ones. At
/// thousands of connections each line is a cache miss per segment
/// (`hot_fields_of_an_entry_fill_two_cache_lines` pins it).
#[repr(C)]
pub(super) struct Entry {
    pub(super) conn: Connection,
    /// The next hop's MAC as last resolved (see [`NextHopMac`]).
    pub(super) hop_mac: Option<NextHopMac>,
    pub(super) owner: Owner,
    /// This connection's queue shares of [`Stack::held`] as last synced (the rest of
    /// its share is in `acct_rest`).
    pub(super) acct_q: AcctQueues,
    /// The link-layer next hop and our source address, from the route at creation.
    pub(super) next_hop: Ipv4Addr,
    /// The Ethernet + IPv4 header of this connection's segments, built for the next-hop
    /// MAC it names (see [`HeaderTemplate`](super::egress::HeaderTemplate)).
    pub(super) tmpl: Option<super::egress::HeaderTemplate>,
    /// The IPv4 identification of this connection's last segment. Per connection, from a
    /// keyed hash of the tuple: one stack-wide counter would tell anyone who sees two
    /// flows how much luna sends (RFC 7739 §5, the idle-scan zombie); every segment has
    /// DF set, so the value only has to be there (RFC 6864 §4.1).
    pub(super) ip_ident: u16,
    pub(super) dirty: bool,
    /// The DiffServ codepoint of this connection's segments, set by the application
    /// (RFC 9293 MUST-48; 0 until then).
    pub(super) dscp: u8,
    /// Counted in its listener's `half_open` (created by the listener, handshake not yet
    /// complete). The flag, not the state at reclaim time, decides the decrement: a
    /// SYN-RECEIVED connection that times out or is reset is Closed when it is freed.
    pub(super) counted_half_open: bool,
    /// The rest of this connection's share of [`Stack::held`] as last synced.
    acct_rest: AcctRest,
    /// A segment polled while the next hop was unresolved (sent once it resolves).
    pub(super) held: Option<OutSegment>,
}

impl Entry {
    /// A new connection's entry, not yet dirty or scheduled, its next hop unresolved. One
    /// made by a listener counts against its half-open backlog until established or freed.
    pub(super) fn new(conn: Connection, owner: Owner, next_hop: Ipv4Addr, ip_ident: u16) -> Self {
        Entry {
            conn,
            owner,
            dirty: false,
            next_hop,
            held: None,
            counted_half_open: matches!(owner, Owner::Listener(_)),
            hop_mac: None,
            tmpl: None,
            acct_q: AcctQueues::default(),
            acct_rest: AcctRest::default(),
            ip_ident,
            dscp: 0,
        }
    }

    /// Its share of [`Stack::held`] as last synced.
    fn acct(&self) -> Acct {
        let (q, r) = (self.acct_q, self.acct_rest);
        Acct {
            dup: r.dup,
            ooo: r.ooo,
            rcvq: q.rcvq,
            sndq: q.sndq,
            time_wait: r.time_wait,
            ooo_mem: r.ooo_mem,
        }
    }

    /// Records `a` as its share, synced; returns the share it replaces.
    fn replace_acct(&mut self, a: Acct) -> Acct {
        let old = self.acct();
        self.acct_q = AcctQueues {
            rcvq: a.rcvq,
            sndq: a.sndq,
        };
        self.acct_rest = AcctRest {
            dup: a.dup,
            ooo: a.ooo,
            time_wait: a.time_wait,
            ooo_mem: a.ooo_mem,
        };
        old
    }
}

/// The part of [`Acct`] the per-segment paths change: the queue shares.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(super) struct AcctQueues {
    rcvq: u32,
    sndq: u32,
}

/// The rest of [`Acct`], changed only by a full sync.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct AcctRest {
    dup: u64,
    ooo: u32,
    time_wait: bool,
    /// The out-of-order queue's memory (`Connection::ooo_mem`; at most twice
    /// `rcv_buf`, 2^31, plus one segment: it fits). The receive queue's part of
    /// `Held::rcv_mem` has no share: it is counted by the change as it happens (see
    /// [`Held::rcv_mem`]).
    ooo_mem: u32,
}

/// A connection's share of what the stack holds ([`Held`]), as last counted.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(super) struct Acct {
    /// `Connection::dup_bytes_in` as last added to `StackCounters::dup_bytes_in`.
    dup: u64,
    ooo: u32,
    rcvq: u32,
    sndq: u32,
    time_wait: bool,
    /// `Connection::ooo_mem`, in `Held::rcv_mem`.
    ooo_mem: u32,
}

impl Acct {
    fn of(c: &Connection) -> Acct {
        Acct {
            dup: c.dup_bytes_in(),
            ooo: c.ooo_bytes() as u32,
            rcvq: c.recv_available() as u32,
            sndq: c.send_queued() as u32,
            time_wait: c.state() == State::TimeWait,
            ooo_mem: c.ooo_mem() as u32,
        }
    }
}

/// Bring `held` up to date with all of `e`'s share (a delta against what `e` last
/// counted), then the high-water marks and the repeated-bytes count. For changes of any
/// kind (timers, the full segment path, opens and closes). The hot paths change one or
/// two queue lengths by amounts they know and count just those ([`predicted_account`],
/// [`queued`], [`taken`]): every mark is raised at the change that can exceed it, so all
/// stay at or above what `Stack::held` can return between calls into the stack.
#[inline(never)]
fn account_entry(held: &mut Held, counters: &mut StackCounters, e: &mut Entry) {
    let now = Acct::of(&e.conn);
    let old = e.replace_acct(now);
    counters.dup_bytes_in += now.dup - old.dup;
    held.ooo_bytes = held.ooo_bytes + u64::from(now.ooo) - u64::from(old.ooo);
    held.rcvq_bytes = held.rcvq_bytes + u64::from(now.rcvq) - u64::from(old.rcvq);
    held.sndq_bytes = held.sndq_bytes + u64::from(now.sndq) - u64::from(old.sndq);
    held.time_wait = held.time_wait + u64::from(now.time_wait) - u64::from(old.time_wait);
    held.rcv_mem = held.rcv_mem + u64::from(now.ooo_mem) - u64::from(old.ooo_mem);
    let hw = &mut counters.high_water;
    hw.raise(held);
    hw.ooo_bytes_one_conn = hw.ooo_bytes_one_conn.max(u64::from(now.ooo));
}

/// `n` bytes joined `e`'s receive or send queue (`rcvq`/`sndq` picks which share and
/// mark): both the share and the sum grow by `n`, and the mark follows the sum. For the
/// hot paths, which know what they added; the debug check holds them to it.
#[inline(always)]
fn grow(share: &mut u32, sum: &mut u64, mark: &mut u64, n: u32) {
    *share += n;
    *sum += u64::from(n);
    if *sum > *mark {
        *mark = *sum;
    }
}

/// `n` bytes left one of `e`'s queues (read, or acknowledged): no mark can rise.
#[inline(always)]
fn shrink(share: &mut u32, sum: &mut u64, n: u32) {
    *share -= n;
    *sum -= u64::from(n);
}

/// A connection's copy of its next hop's neighbour entry, taken while that entry was
/// `Reachable` or `Permanent`. Valid while the table is unchanged (`epoch`) and before
/// `until` (never past the entry's own expiry). While valid, a table `lookup` would
/// answer `mac` and a `learn` of `mac` from the peer's segments would change nothing, so
/// both are skipped: each walks the table, ~400 instructions per frame pair. The one
/// thing skipped for real is the entry's `last_used` stamp (eviction order), which
/// `until` bounds to lag by at most [`HOP_MAC_REFRESH`].
#[derive(Clone, Copy)]
pub(super) struct NextHopMac {
    pub(super) mac: EthernetAddress,
    pub(super) epoch: u64,
    pub(super) until: Instant,
}

/// Longest a connection trusts its [`NextHopMac`] before looking the entry up again.
pub(super) const HOP_MAC_REFRESH: Duration = Duration::from_secs(1);

pub(super) struct Slot {
    pub(super) gen: u32,
    pub(super) entry: Option<Box<Entry>>,
}

pub(super) struct Listener {
    pub(super) port: u16,
    pub(super) backlog: usize,
    /// Connections in SYN-RECEIVED owned by this listener.
    pub(super) half_open: usize,
    pub(super) accept_queue: VecDeque<SocketHandle>,
    pub(super) gen: u32,
    /// When this listener last answered a SYN with a cookie (`SynCookieMode::WhenFull`:
    /// an ACK is checked as a cookie only while one it sent may still be valid).
    pub(super) last_cookie: Option<Instant>,
}

/// A `BuildHasher` keyed from the stack's RNG: hash flooding resistance for the demux table
/// without depending on process-global randomness (the stack stays deterministic).
#[derive(Clone, Copy)]
pub(super) struct KeyedHasher(pub(super) u64, pub(super) u64);

impl BuildHasher for KeyedHasher {
    type Hasher = SipHasher13;
    fn build_hasher(&self) -> SipHasher13 {
        SipHasher13::new_with_keys(self.0, self.1)
    }
}

impl<R: Rng> Stack<R> {
    // ---------------------------------------------------------------------------------------
    // Handles
    // ---------------------------------------------------------------------------------------

    pub(super) fn entry(&self, h: SocketHandle) -> Option<&Entry> {
        let slot = self.slots.get(h.idx as usize)?;
        if slot.gen != h.gen {
            return None;
        }
        slot.entry.as_deref()
    }

    pub(super) fn entry_mut(&mut self, h: SocketHandle) -> Option<&mut Entry> {
        slot_entry(&mut self.slots, h)
    }

    pub(super) fn handle_of(&self, idx: u32) -> SocketHandle {
        SocketHandle {
            idx,
            gen: self.slots[idx as usize].gen,
        }
    }

    pub(super) fn alloc_slot(&mut self, mut entry: Entry) -> Option<u32> {
        if self.live >= self.cfg.max_connections {
            return None;
        }
        entry.conn.set_rcv_reserve(self.rcv_mem_reserve);
        self.live += 1;
        self.held.connections = self.live as u64;
        self.counters.high_water.raise(&self.held);
        let entry = Some(Box::new(entry));
        let idx = if let Some(idx) = self.free.pop() {
            self.slots[idx as usize].entry = entry;
            idx
        } else {
            let idx = u32::try_from(self.slots.len()).ok()?;
            self.slots.push(Slot { gen: 0, entry });
            idx
        };
        self.timers.open(idx, self.slots[idx as usize].gen);
        Some(idx)
    }

    /// Remove the connection's tuple from the demux table (if it still maps to it: a newer
    /// connection may own the tuple by now). The slot and its handle stay.
    pub(super) fn unmap(&mut self, idx: u32) {
        if let Some(e) = self.slots[idx as usize].entry.as_deref() {
            let tuple = e.conn.tuple();
            if self.by_tuple.get(&tuple) == Some(&idx) {
                self.by_tuple.remove(&tuple);
                self.last_hit = None;
            }
        }
    }

    /// A connection that reached CLOSED stops owning its tuple at once, even while the
    /// application holds its handle: new connections may use the tuple, and segments for it
    /// are answered as for no connection (RFC 9293 §3.10.7.1).
    pub(super) fn unmap_if_closed(&mut self, idx: u32) {
        if self.slots[idx as usize]
            .entry
            .as_deref()
            .is_some_and(|e| e.conn.state() == State::Closed)
        {
            self.unmap(idx);
        }
    }

    pub(super) fn free_slot(&mut self, idx: u32) {
        self.unmap(idx);
        let slot = &mut self.slots[idx as usize];
        if let Some(e) = slot.entry.take() {
            self.retired.accumulate(&e.conn.counters);
            // Its share of what the stack holds goes with it.
            let a = e.acct();
            let h = &mut self.held;
            h.ooo_bytes -= u64::from(a.ooo);
            h.rcvq_bytes -= u64::from(a.rcvq);
            h.sndq_bytes -= u64::from(a.sndq);
            h.time_wait -= u64::from(a.time_wait);
            // (The receive queue's part is what it holds now: see `Held::rcv_mem`.)
            h.rcv_mem -= u64::from(a.ooo_mem) + e.conn.rcvq_mem() as u64;
            if e.counted_half_open {
                h.half_open = h.half_open.saturating_sub(1);
            }
            h.connections = h.connections.saturating_sub(1);
            if let Owner::Listener(l) = e.owner {
                if let Some(Some(lst)) = self.listeners.get_mut(l as usize) {
                    if e.counted_half_open {
                        lst.half_open = lst.half_open.saturating_sub(1);
                    }
                    let h = SocketHandle { idx, gen: slot.gen };
                    lst.accept_queue.retain(|&x| x != h);
                }
            }
            // Parked on an unresolved next hop: no longer waiting. When no one waits for
            // that neighbour any more, its ARP retry clock goes too (both maps stay bounded
            // by the connections parked, not by every address ever tried).
            if !self.arp_wait.is_empty() {
                if let Some(w) = self.arp_wait.get_mut(&e.next_hop) {
                    w.retain(|&x| x != idx);
                    if w.is_empty() {
                        self.arp_wait.remove(&e.next_hop);
                        self.arp_sent.remove(&e.next_hop);
                    }
                }
            }
            slot.gen = slot.gen.wrapping_add(1);
            self.timers.forget(idx);
            self.free.push(idx);
            self.live -= 1;
        }
    }

    // ---------------------------------------------------------------------------------------
    // Bookkeeping after any change to a connection
    // ---------------------------------------------------------------------------------------

    /// Sync the connection's share of [`Stack::held`] (after an application call changed
    /// it in any way).
    #[inline]
    pub(super) fn account(&mut self, idx: u32) {
        if let Some(e) = self.slots[idx as usize].entry.as_deref_mut() {
            account_entry(&mut self.held, &mut self.counters, e);
        }
    }

    pub(super) fn mark_dirty(&mut self, idx: u32) {
        if let Some(e) = self.slots[idx as usize].entry.as_deref_mut() {
            mark_entry(&mut self.dirty, e, idx);
        }
    }

    #[inline]
    pub(super) fn schedule_timer(&mut self, idx: u32) {
        let gen = self.slots[idx as usize].gen;
        let Some(e) = self.slots[idx as usize].entry.as_deref_mut() else {
            return;
        };
        schedule_entry(&mut self.timers, e, idx, gen);
    }

    /// Route events, schedule timers and mark for transmission after the connection changed.
    /// One slot lookup: the dirty mark and the timer are `mark_dirty`'s and
    /// `schedule_timer`'s work on the entry in hand (neither routing events nor unmapping
    /// the tuple touches either).
    pub(super) fn after_activity(&mut self, idx: u32, _now: Instant) {
        let slot = &mut self.slots[idx as usize];
        let gen = slot.gen;
        let Some(e) = slot.entry.as_deref_mut() else {
            return;
        };
        let act = entry_activity(
            &mut self.dirty,
            &mut self.timers,
            &mut self.held,
            &mut self.counters,
            e,
            idx,
            gen,
            false,
        );
        self.finish_activity(act);
    }

    /// `after_activity`'s work that needs the whole stack: the events to their owner, the
    /// tuple unmapped when the connection closed.
    #[inline(always)]
    pub(super) fn finish_activity(&mut self, act: Activity) {
        if act.ev.any() {
            self.route_events(act.h, act.owner, act.ev, act.leaves_half_open);
        }
        if act.closed {
            self.unmap(act.h.idx);
        }
    }

    pub(super) fn route_events(
        &mut self,
        h: SocketHandle,
        owner: Owner,
        ev: Events,
        leaves_half_open: bool,
    ) {
        match owner {
            Owner::App => {
                if ev.connected {
                    self.events.push_back(Event::Connected(h));
                }
                if ev.readable {
                    self.events.push_back(Event::Readable(h));
                }
                if ev.writable && !ev.connected {
                    self.events.push_back(Event::Writable(h));
                }
                if ev.closed {
                    self.events.push_back(Event::Closed(h));
                }
            }
            Owner::Listener(l) => {
                if ev.connected {
                    if let Some(Some(lst)) = self.listeners.get_mut(l as usize) {
                        if leaves_half_open {
                            lst.half_open = lst.half_open.saturating_sub(1);
                        }
                        lst.accept_queue.push_back(h);
                        let lh = ListenerHandle {
                            idx: l,
                            gen: lst.gen,
                        };
                        self.events.push_back(Event::Acceptable(lh));
                    }
                }
            }
            Owner::Released => {}
        }
    }

    // ---------------------------------------------------------------------------------------
    // Timers
    // ---------------------------------------------------------------------------------------

    /// When `handle_timeouts` next has work.
    #[must_use]
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        self.timers.next()
    }

    /// Run every timer due at `now`.
    ///
    /// Inlined test first: a driver calls this on every turn of its loop, and most turns
    /// find the earliest deadline still ahead.
    #[inline]
    pub fn handle_timeouts(&mut self, now: Instant) {
        if self.timers.nothing_due(now) {
            return;
        }
        self.handle_due_timeouts(now);
    }

    /// [`handle_timeouts`](Self::handle_timeouts) when a deadline may be due.
    #[inline(never)]
    fn handle_due_timeouts(&mut self, now: Instant) {
        while let Some((idx, gen)) = self.timers.pop_due(now) {
            let slot = &mut self.slots[idx as usize];
            if slot.gen != gen {
                continue;
            }
            let Some(e) = slot.entry.as_deref_mut() else {
                continue;
            };
            if e.conn.poll_timeout().is_some_and(|d| d <= now) {
                e.conn.on_timeout(now);
            }
            self.after_activity(idx, now);
        }
    }
}

/// Sync `e`'s share after a segment that took header prediction, which changes the two
/// queues and nothing else accounted: `delivered` payload bytes joined the receive queue
/// (all of it, or none), and an ACK of new data (`acked`) shrank the send queue. (Their
/// memory was counted by `rcvq_mem_moved`.)
#[inline(always)]
pub(super) fn predicted_account(
    held: &mut Held,
    hw: &mut HighWater,
    e: &mut Entry,
    delivered: u32,
    acked: bool,
) {
    let a = &mut e.acct_q;
    if delivered > 0 {
        grow(
            &mut a.rcvq,
            &mut held.rcvq_bytes,
            &mut hw.held.rcvq_bytes,
            delivered,
        );
    }
    if acked {
        let gone = a.sndq - e.conn.send_queued() as u32;
        shrink(&mut a.sndq, &mut held.sndq_bytes, gone);
    }
    debug_assert_eq!(
        e.acct(),
        Acct::of(&e.conn),
        "a predicted segment changed more"
    );
}

/// What [`entry_activity`] leaves for [`Stack::finish_activity`].
pub(super) struct Activity {
    h: SocketHandle,
    owner: Owner,
    ev: Events,
    leaves_half_open: bool,
    closed: bool,
}

/// `after_activity`'s work on an entry the caller holds (slot `idx`, generation `gen`):
/// takes its events, puts it on the transmit list when it has something to send,
/// schedules its timer and syncs its share of [`Stack::held`] (unless the caller did:
/// `synced`). The caller then passes the result to `finish_activity`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn entry_activity(
    dirty: &mut VecDeque<u32>,
    timers: &mut super::timerq::TimerQueue,
    held: &mut Held,
    counters: &mut StackCounters,
    e: &mut Entry,
    idx: u32,
    gen: u32,
    synced: bool,
) -> Activity {
    let ev = e.conn.take_events();
    // The handshake completed: the connection leaves the listener's half-open count.
    let leaves_half_open = ev.connected && core::mem::take(&mut e.counted_half_open);
    // A connection with nothing to send stays off the transmit list: polling it would
    // only re-arm the timers its input already armed (`on_segment` and `on_timeout` end
    // with that), one empty `poll_segment` per pure ACK received.
    if !e.dirty && !e.conn.nothing_to_send() {
        e.dirty = true;
        dirty.push_back(idx);
    }
    schedule_entry(timers, e, idx, gen);
    if leaves_half_open {
        held.half_open = held.half_open.saturating_sub(1);
    }
    if !synced {
        // After the half-open count: a connection made from a cookie ACK was never
        // half-open, and must not raise the mark in passing.
        account_entry(held, counters, e);
    }
    Activity {
        h: SocketHandle { idx, gen },
        owner: e.owner,
        ev,
        leaves_half_open,
        closed: e.conn.state() == State::Closed,
    }
}

/// After `send`/`send_iovec` queued `n` bytes on `e`: mark it for transmission and
/// count the bytes (nothing else the stack accounts changes).
#[inline(always)]
pub(super) fn queued(
    dirty: &mut VecDeque<u32>,
    held: &mut Held,
    hw: &mut HighWater,
    e: &mut Entry,
    idx: u32,
    n: usize,
) {
    mark_entry(dirty, e, idx);
    grow(
        &mut e.acct_q.sndq,
        &mut held.sndq_bytes,
        &mut hw.held.sndq_bytes,
        n as u32,
    );
    debug_assert_eq!(
        e.acct(),
        Acct::of(&e.conn),
        "send changed more than its queue"
    );
}

/// After `recv`/`recv_iovec` took `n` bytes from `e` (`n > 0`), releasing `released`
/// bytes of receive memory (none when it took part of a buffer): mark it (a window
/// update may be due) and count the bytes.
#[inline(always)]
pub(super) fn taken(
    dirty: &mut VecDeque<u32>,
    held: &mut Held,
    e: &mut Entry,
    idx: u32,
    n: usize,
    released: usize,
) {
    mark_entry(dirty, e, idx);
    shrink(&mut e.acct_q.rcvq, &mut held.rcvq_bytes, n as u32);
    held.rcv_mem -= released as u64;
    debug_assert_eq!(
        e.acct(),
        Acct::of(&e.conn),
        "a read changed more than its queue"
    );
}

/// `Stack::entry_mut` on the slot table alone (the other fields stay free to borrow).
#[inline]
pub(super) fn slot_entry(slots: &mut [Slot], h: SocketHandle) -> Option<&mut Entry> {
    let slot = slots.get_mut(h.idx as usize)?;
    if slot.gen != h.gen {
        return None;
    }
    slot.entry.as_deref_mut()
}

/// `mark_dirty`'s work on an entry the caller holds (slot `idx`).
#[inline(always)]
fn mark_entry(dirty: &mut VecDeque<u32>, e: &mut Entry, idx: u32) {
    if !e.dirty {
        e.dirty = true;
        dirty.push_back(idx);
    }
}

/// `schedule_timer`'s work on an entry the caller holds (slot `idx`, generation `gen`): the
/// timer queue records the connection's next deadline (see [`super::timerq`]).
#[inline]
pub(super) fn schedule_entry(
    timers: &mut super::timerq::TimerQueue,
    e: &Entry,
    idx: u32,
    gen: u32,
) {
    timers.schedule(idx, gen, e.conn.poll_timeout());
}

/// Counts in `held` (and its mark) the change of a connection's receive-queue memory from
/// `before` to `after`, around the one call that changed it: segment input or a read.
/// That part of `Held::rcv_mem` has no per-entry share (the entry's hot lines have no
/// room for one); it stays exact because only those calls change it, and every one of
/// them is bracketed so (`held_is_the_recount_after_every_call_on_every_path` and the
/// fuzz harness check the total against the sum over the connections).
#[inline(always)]
pub(super) fn rcvq_mem_moved(held: &mut Held, hw: &mut HighWater, before: usize, after: usize) {
    held.rcv_mem = held.rcv_mem + after as u64 - before as u64;
    if held.rcv_mem > hw.held.rcv_mem {
        hw.held.rcv_mem = held.rcv_mem;
    }
}

#[cfg(test)]
mod layout_tests {
    use super::Entry;
    use core::mem::{align_of, offset_of, size_of};

    /// The fields the per-segment paths touch (receive: `hop_mac`, `owner`, `acct_q`,
    /// `next_hop`, `dirty`; transmit: `hop_mac`, `tmpl`, `ip_ident`, `dirty`) lie in the
    /// two cache lines after the connection, which ends on a line boundary; the cold ones
    /// come after them. One line more per segment is one more miss per segment when
    /// thousands of connections take turns.
    #[test]
    fn hot_fields_of_an_entry_fill_two_cache_lines() {
        let conn_end = size_of::<crate::tcp::conn::Connection>();
        assert_eq!(align_of::<Entry>() % 64, 0);
        assert_eq!(
            conn_end % 64,
            0,
            "the connection is a whole number of lines"
        );
        assert_eq!(
            offset_of!(Entry, hop_mac),
            conn_end,
            "the hot part starts the line"
        );
        let hot_end = offset_of!(Entry, dirty) + 1;
        for (name, at) in [
            ("owner", offset_of!(Entry, owner)),
            ("acct_q", offset_of!(Entry, acct_q)),
            ("next_hop", offset_of!(Entry, next_hop)),
            ("tmpl", offset_of!(Entry, tmpl)),
            ("ip_ident", offset_of!(Entry, ip_ident)),
        ] {
            assert!(at >= conn_end && at < hot_end, "{name} at {at}");
        }
        assert!(
            hot_end <= conn_end + 128,
            "the hot fields end at {hot_end}, more than two lines after {conn_end}"
        );
        for (name, at) in [
            ("dscp", offset_of!(Entry, dscp)),
            ("counted_half_open", offset_of!(Entry, counted_half_open)),
            ("acct_rest", offset_of!(Entry, acct_rest)),
            ("held", offset_of!(Entry, held)),
        ] {
            assert!(at >= hot_end, "cold {name} at {at} among the hot fields");
        }
    }
}
