//! Per-core counters, published for readers on other threads without slowing the core.
//!
//! The core counts in a plain local struct and every `stats_interval` iterations (and at
//! shutdown) copies it into a [`StatsCell`], a seqlock of relaxed atomics: the writer never
//! waits, readers retry while a publish is in progress. No counter is shared-written on
//! the data path.

use std::sync::atomic::{fence, AtomicU64, Ordering};

macro_rules! core_stats {
    ($( $(#[$m:meta])* $f:ident ),* $(,)?) => {
        /// A snapshot of one core's counters.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct CoreStats {
            $( $(#[$m])* pub $f: u64, )*
        }

        const FIELDS: usize = [$( stringify!($f) ),*].len();

        impl CoreStats {
            /// Field names in publication order (for reports).
            pub const NAMES: [&'static str; FIELDS] = [$( stringify!($f) ),*];

            fn to_array(self) -> [u64; FIELDS] {
                [$( self.$f ),*]
            }

            fn from_array(a: [u64; FIELDS]) -> Self {
                let mut it = a.into_iter();
                CoreStats { $( $f: it.next().unwrap_or(0), )* }
            }

            /// `(name, value)` pairs.
            pub fn fields(&self) -> impl Iterator<Item = (&'static str, u64)> {
                Self::NAMES.into_iter().zip(self.to_array())
            }

            /// Field-wise sum (gauges add up too: totals over cores), except
            /// `loop_gap_max_ns`, which stays the maximum.
            pub fn sum(&self, o: &CoreStats) -> CoreStats {
                let (a, b) = (self.to_array(), o.to_array());
                let mut c = [0u64; FIELDS];
                for i in 0..FIELDS {
                    c[i] = a[i].wrapping_add(b[i]);
                }
                let mut s = Self::from_array(c);
                s.loop_gap_max_ns = self.loop_gap_max_ns.max(o.loop_gap_max_ns);
                s
            }
        }
    };
}

core_stats! {
    /// Poll-loop iterations.
    iterations,
    /// Iterations that found no work.
    idle_iterations,
    /// Frames received from the device(s).
    rx_frames,
    /// Bytes received.
    rx_bytes,
    /// Frames handed to the device(s).
    tx_frames,
    /// Bytes handed to the device(s).
    tx_bytes,
    /// Iterations that ended with frames the device refused (retried next iteration).
    tx_retries,
    /// Frames dropped: a burst from the queue's head after `tx_retry_limit` refused tries,
    /// and what was queued when the shutdown grace ran out (the resets go instead).
    tx_dropped,
    /// Stack events handled (inline callbacks, batch readiness updates, split messages).
    events,
    /// Connections accepted.
    accepted,
    /// Active opens that completed.
    connected,
    /// Connections that ended (Closed events).
    closed,
    /// `connect()` calls that failed (no route, no port, table full).
    connect_errors,
    /// Ports refused by the chooser because no free port steers to this core.
    no_port_for_queue,
    /// Connections the application holds now (gauge).
    open_connections,
    /// Bytes waiting in send backlogs (gauge).
    backlog_bytes,
    /// Frames the stack dropped (all reasons).
    stack_drops,
    /// TCP segments retransmitted.
    retransmits,
    /// Connections reset because they had not closed when the shutdown grace ran out.
    shutdown_aborts,
    /// Split mode: messages to workers (counted as they enter a worker's ring).
    to_workers,
    /// Split mode: messages from workers.
    from_workers,
    /// Split mode: connections paused because their worker's ring was full.
    worker_ring_full,
    /// Device: frames lost on receive.
    rx_missed,
    /// Device: payload bytes copied.
    copied_bytes,
    /// Exception path: frames classified as luna's (0 without the exception path).
    exc_luna,
    /// Exception path: the kernel's frames written to the exception interface.
    exc_to_kernel,
    /// Exception path: the kernel's frames dropped, queue to the kernel full.
    exc_to_kernel_dropped,
    /// Exception path: frames the kernel sent, out through the main port.
    exc_from_kernel,
    /// Exception path: the kernel's frames dropped, main port's queue full.
    exc_from_kernel_dropped,
    /// Exception path: malformed frames the classifier dropped.
    exc_malformed_dropped,
    /// Exception path: unicast frames for another MAC.
    exc_not_for_us,
    /// Exception path (mirroring): luna's own ARP requests suppressed.
    exc_arp_suppressed,
    /// Exception path (mirroring): next hops the kernel was asked to resolve.
    exc_nudges,
    /// Exception path (mirroring): neighbour entries taken from the kernel's table.
    exc_neighbours_added,
    /// Exception path (mirroring): neighbour entries removed because the kernel did.
    exc_neighbours_removed,
    /// Exception path (mirroring): kernel neighbours the stack's table had no room for.
    exc_neighbour_table_full,
    /// Exception path (mirroring): 1 once the exception interface has disappeared.
    exc_interface_gone,
    /// Exception path (mirroring): the mirror version the stack's tables reflect (gauge).
    exc_table_version,
    /// Exception path (mirroring): the kernel's routes added to the stack.
    exc_routes_added,
    /// Exception path (mirroring): the stack's routes replaced by the kernel's.
    exc_routes_replaced,
    /// Exception path (mirroring): routes removed because the kernel did.
    exc_routes_removed,
    /// Exception path (mirroring): kernel routes the stack's table had no room for.
    exc_route_table_full,
    /// Exception path (mirroring): connections moved to a new next hop by a route change.
    exc_rerouted,
    /// Exception path (mirroring): addresses that appeared on the exception interface.
    exc_addresses_added,
    /// Exception path (mirroring): addresses that disappeared from it.
    exc_addresses_removed,
    /// Exception path (mirroring): 1 while the kernel does not hold luna's address.
    exc_address_missing,
    /// Exception path (mirroring): the netlink syncer's full re-dumps.
    exc_sync_resyncs,
    /// Exception path (mirroring): the netlink syncer's receive overruns (ENOBUFS).
    exc_sync_overruns,
    /// Exception path (mirroring): malformed netlink messages counted and skipped.
    exc_sync_malformed,
    /// Exception path (mirroring): the stack's local addresses, the primary included
    /// (gauge; the kernel's addresses of the exception interface are applied).
    exc_addresses,
    /// Exception path (mirroring): connections aborted because the kernel removed their
    /// local address.
    exc_address_aborts,
    /// Exception path (mirroring): kernel addresses the stack refused (set full, not a
    /// unicast host address, or the primary with another prefix).
    exc_address_refused,
    /// 1 when the NIC steers luna's traffic with rte_flow rules (hardware path), 0 when
    /// luna's poll loop classifies (software path, or no traffic model).
    steering_hw,
    /// 1 when hardware steering was tried at port bring-up and luna fell back to the
    /// software path (the reason is the one `bifurcation:` line on stderr).
    steering_fallbacks,
    /// Loop stalls: iterations that began at least 100 µs after the previous one began
    /// (the thread was descheduled or interrupted, or one iteration worked that long;
    /// `Backoff`'s own sleeps are not counted).
    loop_gaps_100us,
    /// Loop stalls: gaps of at least 500 µs.
    loop_gaps_500us,
    /// Loop stalls: gaps of at least 1 ms.
    loop_gaps_1ms,
    /// Loop stalls: gaps of at least 2 ms.
    loop_gaps_2ms,
    /// Loop stalls: gaps of at least 5 ms.
    loop_gaps_5ms,
    /// Loop stalls: nanoseconds in gaps of at least 100 µs (each whole gap).
    loop_gap_ns,
    /// Loop stalls: nanoseconds in gaps of at least 1 ms.
    loop_gap_1ms_ns,
    /// Loop stalls: the longest gap between two iterations (ns; a maximum, also in
    /// [`CoreStats::sum`]).
    loop_gap_max_ns,
    /// Nanoseconds on the core clock at the last publish.
    published_at_ns,
    /// 1 once the core has stopped (final stats).
    stopped,
    // Counters added later go here: `luna_stats_name` indexes follow this order.
    /// Inline mode: readiness events that repeated one already dispatched in the same
    /// pass and said nothing new (see `inline`), so no callback ran.
    events_coalesced,
    /// Feature `phases` only (0 otherwise): iterations that both received and sent
    /// frames, over which the `phase_*_ns` times below are summed. Their averages split
    /// a request's path through the core: device receive, stack input (and timers), the
    /// mode's callbacks (the application), stack output, device transmit.
    phase_iterations,
    /// Feature `phases`: time in the devices' receive bursts (ns, summed).
    phase_rx_ns,
    /// Feature `phases`: time in the stack's input and due timers (ns, summed).
    phase_input_ns,
    /// Feature `phases`: time in the mode's iteration, the application's callbacks
    /// included (ns, summed).
    phase_app_ns,
    /// Feature `phases`: time building the stack's frames (backlogs and
    /// `poll_transmit`; ns, summed).
    phase_output_ns,
    /// Feature `phases`: time in the devices' transmit bursts (ns, summed).
    phase_tx_ns,
}

/// A gap between two poll-loop iterations at least this long is a loop stall (counted
/// in the `loop_gap*` stats); shorter ones cost the loop a subtract and a compare.
pub const LOOP_GAP_MIN_NS: u64 = 100_000;

impl CoreStats {
    /// Counts a gap of `ns` between two iterations' clock readings; the caller has
    /// checked `ns >= LOOP_GAP_MIN_NS` (kept off the hot path).
    #[cold]
    #[inline(never)]
    pub(crate) fn record_loop_gap(&mut self, ns: u64) {
        self.loop_gaps_100us += 1;
        self.loop_gaps_500us += u64::from(ns >= 500_000);
        self.loop_gaps_1ms += u64::from(ns >= 1_000_000);
        self.loop_gaps_2ms += u64::from(ns >= 2_000_000);
        self.loop_gaps_5ms += u64::from(ns >= 5_000_000);
        self.loop_gap_ns += ns;
        if ns >= 1_000_000 {
            self.loop_gap_1ms_ns += ns;
        }
        self.loop_gap_max_ns = self.loop_gap_max_ns.max(ns);
    }
}

/// Adds the phases between six clock readings (ns: start, after receive, after input,
/// after the mode, after output, after transmit) to `spent`; a clock that went backwards
/// adds nothing rather than wrapping. A burst handled in two halves adds twice.
#[cfg_attr(not(feature = "phases"), allow(dead_code))]
pub(crate) fn add_phases(spent: &mut [u64; 5], marks: &[u64; 6]) {
    for (i, d) in spent.iter_mut().enumerate() {
        *d += marks[i + 1].saturating_sub(marks[i]);
    }
}

impl CoreStats {
    /// Adds one busy iteration's phases ([`add_phases`]). Called by the core loop only
    /// when built with feature `phases`.
    #[cfg_attr(not(feature = "phases"), allow(dead_code))]
    pub(crate) fn record_phases(&mut self, d: &[u64; 5]) {
        self.phase_iterations += 1;
        self.phase_rx_ns += d[0];
        self.phase_input_ns += d[1];
        self.phase_app_ns += d[2];
        self.phase_output_ns += d[3];
        self.phase_tx_ns += d[4];
    }
}

/// The published copy of a core's [`CoreStats`]: written by its core only, read by anyone.
#[derive(Debug)]
pub struct StatsCell {
    seq: AtomicU64,
    vals: [AtomicU64; FIELDS],
}

impl Default for StatsCell {
    fn default() -> Self {
        StatsCell {
            seq: AtomicU64::new(0),
            vals: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl StatsCell {
    /// Publish a snapshot. Only the owning core calls this (single writer).
    pub fn publish(&self, s: &CoreStats) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        // Orders the odd sequence before the field stores.
        fence(Ordering::Release);
        for (cell, v) in self.vals.iter().zip(s.to_array()) {
            cell.store(v, Ordering::Relaxed);
        }
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// A consistent snapshot (all fields from one publish).
    pub fn read(&self) -> CoreStats {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let mut a = [0u64; FIELDS];
            for (v, cell) in a.iter_mut().zip(&self.vals) {
                *v = cell.load(Ordering::Relaxed);
            }
            // Orders the field loads before the sequence re-check.
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s1 {
                return CoreStats::from_array(a);
            }
        }
    }

    /// Publishes so far.
    pub fn generation(&self) -> u64 {
        self.seq.load(Ordering::Acquire) / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn readers_never_see_a_torn_snapshot() {
        let cell = Arc::new(StatsCell::default());
        let w = Arc::clone(&cell);
        let writer = std::thread::spawn(move || {
            for i in 1..=20_000u64 {
                // Every field carries the same value: a torn read would mix two.
                w.publish(&CoreStats::from_array([i; FIELDS]));
            }
        });
        let mut last = 0;
        while last < 20_000 {
            let s = cell.read().to_array();
            assert!(s.iter().all(|&v| v == s[0]), "torn snapshot {s:?}");
            assert!(s[0] >= last, "snapshots go forward");
            last = s[0];
        }
        writer.join().unwrap();
        assert_eq!(cell.generation(), 20_000);
    }

    #[test]
    fn names_and_sum() {
        let a = CoreStats {
            rx_frames: 2,
            ..Default::default()
        };
        let b = CoreStats {
            rx_frames: 3,
            tx_frames: 1,
            ..Default::default()
        };
        let c = a.sum(&b);
        assert_eq!((c.rx_frames, c.tx_frames), (5, 1));
        assert!(c.fields().any(|(n, v)| n == "rx_frames" && v == 5));
    }

    #[test]
    fn loop_gaps_land_in_their_buckets_and_the_maximum_sums_as_a_maximum() {
        let mut a = CoreStats::default();
        for ns in [100_000, 499_999, 500_000, 1_000_000, 2_500_000, 7_000_000] {
            a.record_loop_gap(ns);
        }
        assert_eq!(a.loop_gaps_100us, 6);
        assert_eq!(a.loop_gaps_500us, 4);
        assert_eq!(a.loop_gaps_1ms, 3);
        assert_eq!(a.loop_gaps_2ms, 2);
        assert_eq!(a.loop_gaps_5ms, 1);
        assert_eq!(a.loop_gap_ns, 11_599_999);
        assert_eq!(a.loop_gap_1ms_ns, 10_500_000);
        assert_eq!(a.loop_gap_max_ns, 7_000_000);
        let mut b = CoreStats::default();
        b.record_loop_gap(3_000_000);
        let c = a.sum(&b);
        assert_eq!(c.loop_gap_max_ns, 7_000_000);
        assert_eq!((c.loop_gaps_1ms, c.loop_gap_1ms_ns), (4, 13_500_000));
    }

    /// Each phase is the difference of two neighbouring readings, summed per iteration;
    /// a clock that went backwards adds nothing rather than wrapping.
    #[test]
    fn phases_add_up_per_iteration() {
        let mut s = CoreStats::default();
        let mut one = [0; 5];
        add_phases(&mut one, &[100, 900, 1_150, 1_400, 1_550, 2_300]);
        s.record_phases(&one);
        // A burst in two halves: both halves' phases, one iteration.
        let mut two = [0; 5];
        add_phases(&mut two, &[0, 600, 700, 800, 850, 900]);
        add_phases(&mut two, &[900, 900, 1_000, 1_200, 1_250, 800]);
        s.record_phases(&two);
        assert_eq!(s.phase_iterations, 2);
        assert_eq!(
            [
                s.phase_rx_ns,
                s.phase_input_ns,
                s.phase_app_ns,
                s.phase_output_ns,
                s.phase_tx_ns
            ],
            [1_400, 450, 550, 250, 800]
        );
    }
}
