//! Per-core counters (`r2c::CoreStats`) for C: as a struct or as name/value pairs.

use crate::env::{core_stats, luna_runtime_t};
use crate::error::{guard, null, Fail};
use r2c::CoreStats;
use std::ffi::{c_char, c_int, CString};
use std::sync::OnceLock;

/// One core's counters (all `uint64_t`; gauges say so). Fill with `luna_runtime_stats`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct luna_core_stats_t {
    /// Poll-loop iterations.
    pub iterations: u64,
    /// Iterations that found no work.
    pub idle_iterations: u64,
    /// Frames received from the device(s).
    pub rx_frames: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Frames handed to the device(s).
    pub tx_frames: u64,
    /// Bytes handed to the device(s).
    pub tx_bytes: u64,
    /// Iterations that ended with frames the device refused (retried next iteration).
    pub tx_retries: u64,
    /// Frames dropped: a burst from the queue's head after `tx_retry_limit` refused tries,
    /// and what was queued when the shutdown grace ran out (the resets go instead).
    pub tx_dropped: u64,
    /// Stack events handled (inline callbacks, batch readiness updates, split messages).
    pub events: u64,
    /// Connections accepted.
    pub accepted: u64,
    /// Active opens that completed.
    pub connected: u64,
    /// Connections that ended (Closed events).
    pub closed: u64,
    /// `connect()` calls that failed (no route, no port, table full).
    pub connect_errors: u64,
    /// Ports refused by the chooser because no free port steers to this core.
    pub no_port_for_queue: u64,
    /// Connections the application holds now (gauge).
    pub open_connections: u64,
    /// Bytes waiting in send backlogs (gauge).
    pub backlog_bytes: u64,
    /// Frames the stack dropped (all reasons).
    pub stack_drops: u64,
    /// TCP segments retransmitted.
    pub retransmits: u64,
    /// Connections reset because they had not closed when the shutdown grace ran out.
    pub shutdown_aborts: u64,
    /// Split mode: messages to workers.
    pub to_workers: u64,
    /// Split mode: messages from workers.
    pub from_workers: u64,
    /// Split mode: connections paused because their worker's ring was full.
    pub worker_ring_full: u64,
    /// Device: frames lost on receive.
    pub rx_missed: u64,
    /// Device: payload bytes copied.
    pub copied_bytes: u64,
    /// Exception path: frames classified as luna's (0 without the exception path).
    pub exc_luna: u64,
    /// Exception path: the kernel's frames written to the exception interface.
    pub exc_to_kernel: u64,
    /// Exception path: the kernel's frames dropped, queue to the kernel full.
    pub exc_to_kernel_dropped: u64,
    /// Exception path: frames the kernel sent, out through the main port.
    pub exc_from_kernel: u64,
    /// Exception path: the kernel's frames dropped, main port's queue full.
    pub exc_from_kernel_dropped: u64,
    /// Exception path: malformed frames the classifier dropped.
    pub exc_malformed_dropped: u64,
    /// Exception path: unicast frames for another MAC.
    pub exc_not_for_us: u64,
    /// Exception path (mirroring): luna's own ARP requests suppressed.
    pub exc_arp_suppressed: u64,
    /// Exception path (mirroring): next hops the kernel was asked to resolve.
    pub exc_nudges: u64,
    /// Exception path (mirroring): neighbour entries taken from the kernel's table.
    pub exc_neighbours_added: u64,
    /// Exception path (mirroring): neighbour entries removed because the kernel did.
    pub exc_neighbours_removed: u64,
    /// Exception path (mirroring): kernel neighbours the stack's table had no room for.
    pub exc_neighbour_table_full: u64,
    /// Exception path (mirroring): 1 once the exception interface has disappeared.
    pub exc_interface_gone: u64,
    /// Nanoseconds on the core clock at the last publish.
    pub published_at_ns: u64,
    /// 1 once the core has stopped (final stats).
    pub stopped: u64,
    // Counters added later go here, after `stopped`, so that no existing field's offset
    // moves.
    /// Exception path (mirroring): the mirror version the stack's tables reflect (gauge).
    pub exc_table_version: u64,
    /// Exception path (mirroring): the kernel's routes added to the stack.
    pub exc_routes_added: u64,
    /// Exception path (mirroring): the stack's routes replaced by the kernel's.
    pub exc_routes_replaced: u64,
    /// Exception path (mirroring): routes removed because the kernel did.
    pub exc_routes_removed: u64,
    /// Exception path (mirroring): kernel routes the stack's table had no room for.
    pub exc_route_table_full: u64,
    /// Exception path (mirroring): connections moved to a new next hop by a route change.
    pub exc_rerouted: u64,
    /// Exception path (mirroring): addresses that appeared on the exception interface.
    pub exc_addresses_added: u64,
    /// Exception path (mirroring): addresses that disappeared from it.
    pub exc_addresses_removed: u64,
    /// Exception path (mirroring): 1 while the kernel does not hold luna's address.
    pub exc_address_missing: u64,
    /// Exception path (mirroring): the netlink syncer's full re-dumps.
    pub exc_sync_resyncs: u64,
    /// Exception path (mirroring): the netlink syncer's receive overruns (ENOBUFS).
    pub exc_sync_overruns: u64,
    /// Exception path (mirroring): malformed netlink messages counted and skipped.
    pub exc_sync_malformed: u64,
    /// Exception path (mirroring): the stack's local addresses, the primary included
    /// (gauge; the kernel's addresses of the exception interface are applied).
    pub exc_addresses: u64,
    /// Exception path (mirroring): connections aborted because the kernel removed their
    /// local address.
    pub exc_address_aborts: u64,
    /// Exception path (mirroring): kernel addresses the stack refused (set full, not a
    /// unicast host address, or the primary with another prefix).
    pub exc_address_refused: u64,
    /// 1 when the NIC steers luna's traffic with rte_flow rules (hardware path), 0 when
    /// luna's poll loop classifies (software path, or no traffic model).
    pub steering_hw: u64,
    /// 1 when hardware steering was tried at port bring-up and luna fell back to the
    /// software path (the reason is the one `bifurcation:` line on stderr).
    pub steering_fallbacks: u64,
    /// Loop stalls: iterations that began at least 100 µs after the previous one began.
    pub loop_gaps_100us: u64,
    /// Loop stalls: gaps of at least 500 µs.
    pub loop_gaps_500us: u64,
    /// Loop stalls: gaps of at least 1 ms.
    pub loop_gaps_1ms: u64,
    /// Loop stalls: gaps of at least 2 ms.
    pub loop_gaps_2ms: u64,
    /// Loop stalls: gaps of at least 5 ms.
    pub loop_gaps_5ms: u64,
    /// Loop stalls: nanoseconds in gaps of at least 100 µs.
    pub loop_gap_ns: u64,
    /// Loop stalls: nanoseconds in gaps of at least 1 ms.
    pub loop_gap_1ms_ns: u64,
    /// Loop stalls: the longest gap between two iterations (ns).
    pub loop_gap_max_ns: u64,
    /// Inline mode: readiness events that repeated one already dispatched in the same
    /// pass and said nothing new, so no callback ran (one `on_readable` and one
    /// `on_writable` per connection per received burst).
    pub events_coalesced: u64,
    /// Only when r2c is built with its `phases` feature (0 otherwise): iterations that
    /// both received and sent, over which the `phase_*_ns` times are summed.
    pub phase_iterations: u64,
    /// `phases` feature: ns in the devices' receive bursts (summed).
    pub phase_rx_ns: u64,
    /// `phases` feature: ns in the stack's input and due timers (summed).
    pub phase_input_ns: u64,
    /// `phases` feature: ns in the mode's iteration, the application's callbacks
    /// included (summed).
    pub phase_app_ns: u64,
    /// `phases` feature: ns building the stack's frames (summed).
    pub phase_output_ns: u64,
    /// `phases` feature: ns in the devices' transmit bursts (summed).
    pub phase_tx_ns: u64,
}

/// Moves every field of r2c's `CoreStats` into the C struct. Exhaustive both ways: a
/// counter added to r2c (the destructuring) or to the C struct (the literal) fails to
/// compile here until the other side has it too (and so luna.h).
macro_rules! move_fields {
    ($s:expr => $($f:ident),* $(,)?) => {{
        let CoreStats { $($f),* } = $s;
        luna_core_stats_t { $($f),* }
    }};
}

impl From<CoreStats> for luna_core_stats_t {
    fn from(s: CoreStats) -> Self {
        move_fields!(s =>
            iterations,
            idle_iterations,
            rx_frames,
            rx_bytes,
            tx_frames,
            tx_bytes,
            tx_retries,
            tx_dropped,
            events,
            accepted,
            connected,
            closed,
            connect_errors,
            no_port_for_queue,
            open_connections,
            backlog_bytes,
            stack_drops,
            retransmits,
            shutdown_aborts,
            to_workers,
            from_workers,
            worker_ring_full,
            rx_missed,
            copied_bytes,
            exc_luna,
            exc_to_kernel,
            exc_to_kernel_dropped,
            exc_from_kernel,
            exc_from_kernel_dropped,
            exc_malformed_dropped,
            exc_not_for_us,
            exc_arp_suppressed,
            exc_nudges,
            exc_neighbours_added,
            exc_neighbours_removed,
            exc_neighbour_table_full,
            exc_interface_gone,
            published_at_ns,
            stopped,
            exc_table_version,
            exc_routes_added,
            exc_routes_replaced,
            exc_routes_removed,
            exc_route_table_full,
            exc_rerouted,
            exc_addresses_added,
            exc_addresses_removed,
            exc_address_missing,
            exc_sync_resyncs,
            exc_sync_overruns,
            exc_sync_malformed,
            exc_addresses,
            exc_address_aborts,
            exc_address_refused,
            steering_hw,
            steering_fallbacks,
            loop_gaps_100us,
            loop_gaps_500us,
            loop_gaps_1ms,
            loop_gaps_2ms,
            loop_gaps_5ms,
            loop_gap_ns,
            loop_gap_1ms_ns,
            loop_gap_max_ns,
            events_coalesced,
            phase_iterations,
            phase_rx_ns,
            phase_input_ns,
            phase_app_ns,
            phase_output_ns,
            phase_tx_ns,
        )
    }
}

/// The size of `luna_core_stats_t` in the first published header (its fields through
/// `stopped`). The struct only grows at its end, so a caller built against any header
/// passes at least this much.
pub const LUNA_CORE_STATS_SIZE_VER0: usize = 312;

/// Core `core`'s latest published counters (the final ones after `luna_runtime_join`)
/// into `*out`; `out_size` is `sizeof(luna_core_stats_t)` as the caller's header has it:
/// the struct only grows at its end, and a program built against an older header gets
/// the fields its struct has (at least `LUNA_CORE_STATS_SIZE_VER0` bytes; smaller is
/// `EINVAL`). Cores publish every `runtime.stats_interval` iterations and at exit;
/// reading never slows them. Any thread. 0, or -1 with `EINVAL` (NULL, core out of
/// range, size).
///
/// # Safety
/// `rt` is NULL or live; `out` is NULL or has `out_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn luna_runtime_stats(
    rt: *const luna_runtime_t,
    core: u32,
    out: *mut luna_core_stats_t,
    out_size: usize,
) -> c_int {
    guard(-1, || {
        if out.is_null() {
            return Err(null("out"));
        }
        if out_size < LUNA_CORE_STATS_SIZE_VER0 {
            return Err(Fail::new(
                libc::EINVAL,
                format!(
                    "out_size {out_size} < {LUNA_CORE_STATS_SIZE_VER0}, the smallest \
                     luna_core_stats_t (sizeof here: {})",
                    std::mem::size_of::<luna_core_stats_t>()
                ),
            ));
        }
        let s: luna_core_stats_t = core_stats(rt, core as usize)?.into();
        // Whole counters only, and no more than this struct has.
        let n = out_size.min(std::mem::size_of::<luna_core_stats_t>()) / 8 * 8;
        // SAFETY: `out` is non-NULL and has `out_size` ≥ `n` writable bytes (caller's
        // contract); `s` is a local of at least `n` bytes; byte copies need no alignment
        // and the two cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&s as *const luna_core_stats_t).cast::<u8>(),
                out.cast::<u8>(),
                n,
            )
        };
        Ok(0)
    })
}

fn names() -> &'static [CString] {
    static NAMES: OnceLock<Vec<CString>> = OnceLock::new();
    NAMES.get_or_init(|| {
        CoreStats::NAMES
            .iter()
            .map(|n| CString::new(*n).unwrap_or_default())
            .collect()
    })
}

/// Number of counters (`luna_stats_name` indexes, `luna_runtime_stats_values` slots).
#[no_mangle]
pub extern "C" fn luna_stats_count() -> usize {
    CoreStats::NAMES.len()
}

/// Name of counter `i` (static, e.g. `"rx_frames"`); NULL with `EINVAL` past the end.
#[no_mangle]
pub extern "C" fn luna_stats_name(i: usize) -> *const c_char {
    guard(std::ptr::null(), || {
        names().get(i).map(|c| c.as_ptr()).ok_or_else(|| {
            Fail::new(
                libc::EINVAL,
                format!("counter {i} out of range ({})", CoreStats::NAMES.len()),
            )
        })
    })
}

/// Core `core`'s counters as values in `luna_stats_name` order: writes up to `n`
/// (`luna_stats_count()` for all) into `values` and returns how many; -1 with `EINVAL`.
///
/// # Safety
/// `rt` is NULL or live; `values` has room for `n` values (NULL if `n` is 0).
#[no_mangle]
pub unsafe extern "C" fn luna_runtime_stats_values(
    rt: *const luna_runtime_t,
    core: u32,
    values: *mut u64,
    n: usize,
) -> c_int {
    guard(-1, || {
        let s = core_stats(rt, core as usize)?;
        let k = n.min(CoreStats::NAMES.len());
        if k == 0 {
            return Ok(0);
        }
        if values.is_null() {
            return Err(null("values"));
        }
        // SAFETY: `values` has room for `n` ≥ `k` values (caller's contract).
        let dst = unsafe { std::slice::from_raw_parts_mut(values, k) };
        for (d, (_, v)) in dst.iter_mut().zip(s.fields()) {
            *d = v;
        }
        Ok(k as c_int)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_and_pairs_agree() {
        let s = CoreStats {
            rx_frames: 5,
            stopped: 1,
            ..Default::default()
        };
        let c: luna_core_stats_t = s.into();
        assert_eq!((c.rx_frames, c.stopped), (5, 1));
        assert_eq!(
            LUNA_CORE_STATS_SIZE_VER0,
            std::mem::offset_of!(luna_core_stats_t, exc_table_version),
            "the first header's struct ends after `stopped`"
        );
        assert_eq!(
            std::mem::size_of::<luna_core_stats_t>(),
            8 * luna_stats_count(),
            "one u64 per counter, no padding"
        );
        for i in 0..luna_stats_count() {
            let p = luna_stats_name(i);
            assert!(!p.is_null());
            // SAFETY: a static NUL-terminated name.
            let n = unsafe { std::ffi::CStr::from_ptr(p) }.to_str().unwrap();
            assert_eq!(n, CoreStats::NAMES[i]);
        }
        assert!(luna_stats_name(luna_stats_count()).is_null());
        assert_eq!(errno::errno().0, libc::EINVAL);
    }
}
