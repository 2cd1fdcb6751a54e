//! The load generator every client backend drives, and the per-thread results.
//!
//! A backend owns the sockets; per poll iteration it calls [`ClientWorker::tick`] (issue
//! requests), writes each connection's [`ClientWorker::tx`] bytes and reports how many the
//! stack took ([`ClientWorker::on_sent`]), and feeds received bytes to
//! [`ClientWorker::on_rx`]. It stops when [`ClientWorker::finished`] says so.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::proto::{flags, ClientConn, SyncReport, TxBuf, HDR_LEN};

/// Closed loop (a fixed number outstanding) or open loop (Poisson arrivals).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// RPCs.
    Rpc,
    /// One-way streaming (iperf-like), no responses until the final SYNC.
    Bulk,
}

/// The shared clock of a run.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Measurement starts.
    pub warm_end: Instant,
    /// No new requests after this.
    pub end: Instant,
}

impl Timing {
    /// Warm-up then measurement, starting now.
    pub fn starting_now(warmup: f64, duration: f64) -> Timing {
        let warm_end = Instant::now() + Duration::from_secs_f64(warmup);
        Timing {
            warm_end,
            end: warm_end + Duration::from_secs_f64(duration),
        }
    }
}

/// What one client thread does.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// Global index of this thread's first connection.
    pub first_conn: u32,
    /// Connections of this thread.
    pub conns: u32,
    /// Request payload bytes (bulk: bytes per write).
    pub req_size: u32,
    /// Response payload bytes.
    pub resp_size: u32,
    /// Requests outstanding per connection (closed loop).
    pub iodepth: u32,
    /// Open loop: this thread's arrival rate (RPC/s).
    pub rate: Option<f64>,
    /// Check payload patterns.
    pub verify: bool,
    /// RPC or bulk.
    pub mode: Mode,
    /// RNG seed (open loop).
    pub seed: u64,
    /// Queue requests as [`crate::proto::Piece`]s (zero-copy stacks).
    pub messages: bool,
    /// `--service`: tag every request with a drawn service time.
    pub service: Option<crate::service::ServiceSpec>,
    /// `--unordered`: match responses by id.
    pub unordered: bool,
}

/// Open loop: a request whose last byte reached the stack more than this after its
/// scheduled time was sent behind schedule (counted, as Perséphone's client does).
pub const BEHIND_SCHEDULE: Duration = Duration::from_micros(10);
/// Open loop: the client kept its schedule only if at most 1% of the requests of the
/// window left more than [`BEHIND_SCHEDULE`] late (p99 of the send lag <=
/// [`BEHIND_SCHEDULE`]); otherwise the round is flagged `client_behind`: its latencies
/// (from the scheduled times, so they include the client's own lag) say as much about
/// the client as about the server. `knb sweep --figure slo` applies its own bound,
/// relative to the SLO.
pub const CLIENT_BEHIND_QUANTILE: f64 = 0.99;
/// Open loop: after the end, keep receiving this long (at most) for answers to requests
/// sent in the window, so the latency of late answers is recorded, not dropped.
pub const OPEN_LOOP_DRAIN: Duration = Duration::from_millis(500);

/// Open loop: arrivals beyond this many outstanding per connection are dropped
/// (counted), so an overloaded stack cannot make the client buffer without bound.
const OPEN_LOOP_MAX_OUTSTANDING: usize = 4096;
/// Bulk: bytes kept queued ahead of the socket.
const BULK_BACKLOG: usize = 64 * 1024;
/// Bulk: how long the final SYNC may take before the run is declared failed.
const SYNC_TIMEOUT: Duration = Duration::from_secs(20);

/// xorshift64*: small, seeded, good enough for exponential inter-arrival times.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
        // 53 random bits in (0, 1].
        ((r >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

/// One client thread's state.
pub struct ClientWorker {
    spec: WorkerSpec,
    timing: Timing,
    conns: Vec<ClientConn>,
    hist: Histogram<u64>,
    completed: u64,
    tx_payload: u64,
    rx_payload: u64,
    wire_tx_window: u64,
    open: Option<(Rng, f64, Instant)>,
    rr: usize,
    offered: u64,
    dropped: u64,
    marked: bool,
    synced: bool,
    /// Open loop, window: requests handed to the stack, and those more than
    /// [`BEHIND_SCHEDULE`] after their scheduled time; the largest lag (ns).
    sent_window: u64,
    behind: u64,
    max_lag_ns: u64,
    /// Open loop, window: every request's send lag (ns).
    lag_hist: Histogram<u64>,
    progress: Arc<AtomicU64>,
    error: Option<String>,
    /// Closed loop: connections whose outstanding count dropped since the last tick
    /// (only they need new requests, so a tick costs O(completions), not O(conns)).
    refill: Vec<usize>,
    in_refill: Vec<bool>,
    /// Connections with newly queued data, each once ([`ClientWorker::take_touched`]),
    /// so a backend visits only those, not every connection, per iteration.
    touched: Vec<usize>,
    is_touched: Vec<bool>,
    /// Requests outstanding over all connections (the sum of their `outstanding()`), kept
    /// as requests are queued and answered: [`ClientWorker::finished`] runs every poll
    /// iteration of the drain, and summing 5,000 connections there cost a scan per
    /// iteration while late answers were being timed.
    outstanding: usize,
}

impl ClientWorker {
    /// The run's warm-up end and end.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// A worker for `spec` on the run's `timing`; `progress` counts completions.
    pub fn new(spec: WorkerSpec, timing: Timing, progress: Arc<AtomicU64>) -> ClientWorker {
        let conns = (0..spec.conns)
            .map(|i| {
                let mut c = ClientConn::new(
                    spec.first_conn + i,
                    spec.req_size,
                    spec.resp_size,
                    spec.verify,
                );
                if let Some(sv) = spec.service {
                    let seed = spec.seed
                        ^ (u64::from(spec.first_conn + i) + 1).wrapping_mul(0xa076_1d64_78bd_642f);
                    c = c.with_service(sv, seed);
                }
                if spec.unordered {
                    c = c.unordered();
                }
                if spec.messages {
                    c.message_mode()
                } else {
                    c
                }
            })
            .collect();
        let n = spec.conns as usize;
        let open = spec.rate.map(|r| (Rng(spec.seed | 1), r, Instant::now()));
        ClientWorker {
            timing,
            conns,
            hist: new_hist(),
            completed: 0,
            tx_payload: 0,
            rx_payload: 0,
            wire_tx_window: 0,
            open,
            rr: 0,
            offered: 0,
            dropped: 0,
            marked: false,
            synced: false,
            sent_window: 0,
            behind: 0,
            max_lag_ns: 0,
            lag_hist: new_hist(),
            progress,
            error: None,
            refill: (0..n).collect(),
            in_refill: vec![true; n],
            touched: Vec::new(),
            is_touched: vec![false; n],
            outstanding: 0,
            spec,
        }
    }

    fn touch(&mut self, i: usize) {
        if !self.is_touched[i] {
            self.is_touched[i] = true;
            self.touched.push(i);
        }
    }

    /// Appends the connections that got new data to send since the last call (each
    /// once) to `out`.
    pub fn take_touched(&mut self, out: &mut Vec<usize>) {
        for &i in &self.touched {
            self.is_touched[i] = false;
        }
        out.append(&mut self.touched);
    }

    /// Whether [`ClientWorker::tick`] at `now` would issue anything (so a busy-polling
    /// backend reads the precise clock only when it will): bulk always, closed loop when
    /// responses completed since the last tick, open loop when an arrival is due.
    pub fn has_work(&self, now: Instant) -> bool {
        if self.error.is_some() {
            return false;
        }
        match self.spec.mode {
            Mode::Bulk => true,
            Mode::Rpc => match &self.open {
                None => now < self.timing.end && !self.refill.is_empty(),
                Some((_, _, next)) => *next <= now && *next < self.timing.end,
            },
        }
    }

    /// Issues the requests due at `now`.
    pub fn tick(&mut self, now: Instant) {
        if self.error.is_some() {
            return;
        }
        let end = self.timing.end;
        match self.spec.mode {
            Mode::Bulk => self.tick_bulk(now),
            Mode::Rpc => match &mut self.open {
                None if now >= end => {}
                None => {
                    let depth = self.spec.iodepth as usize;
                    let mut refill = std::mem::take(&mut self.refill);
                    for &i in &refill {
                        self.in_refill[i] = false;
                        let c = &mut self.conns[i];
                        let before = c.outstanding();
                        while c.outstanding() < depth {
                            c.push_request(now);
                        }
                        if c.outstanding() > before {
                            self.outstanding += c.outstanding() - before;
                            self.touch(i);
                        }
                    }
                    refill.clear();
                    self.refill = refill;
                }
                Some((rng, rate, next)) => {
                    let n = self.conns.len();
                    // Every arrival scheduled before the end is issued, even by a client
                    // that gets to it after the end (late, its lag measured): skipping
                    // them hid a stalled client's lateness, and a client stalled through
                    // the whole window reported no arrival at all.
                    while *next <= now && *next < end {
                        let t0 = *next;
                        let gap = -rng.next_f64().ln() / *rate;
                        *next += Duration::from_secs_f64(gap);
                        if t0 >= self.timing.warm_end {
                            self.offered += 1;
                        }
                        let i = self.rr % n;
                        let c = &mut self.conns[i];
                        self.rr = self.rr.wrapping_add(1);
                        if c.outstanding() >= OPEN_LOOP_MAX_OUTSTANDING {
                            if t0 >= self.timing.warm_end {
                                self.dropped += 1;
                            }
                            continue;
                        }
                        c.push_request(t0);
                        self.outstanding += 1;
                        if !self.is_touched[i] {
                            self.is_touched[i] = true;
                            self.touched.push(i);
                        }
                    }
                }
            },
        }
    }

    fn tick_bulk(&mut self, now: Instant) {
        for i in 0..self.conns.len() {
            let c = &mut self.conns[i];
            let before = c.tx().len();
            let waiting = c.outstanding();
            if now >= self.timing.end {
                if !self.synced && c.outstanding() == 0 && c.sync_report().is_none() {
                    c.push_sync(now);
                }
            } else {
                if !self.marked && now >= self.timing.warm_end {
                    c.push_bulk(flags::MARK);
                }
                while c.tx().len() < BULK_BACKLOG {
                    c.push_bulk(0);
                }
            }
            self.outstanding = self.outstanding + c.outstanding() - waiting;
            if c.tx().len() > before {
                self.touch(i);
            }
        }
        if now >= self.timing.warm_end {
            self.marked = true;
        }
        if now >= self.timing.end {
            self.synced = true;
        }
    }

    /// Most bytes to hand the stack per send call: one message in bulk mode (so
    /// `--req-size 4k` means 4 KiB writes, like `iperf3 -l 4K`), unlimited for RPCs
    /// (a client with several requests ready writes them at once).
    pub fn send_chunk(&self) -> usize {
        match self.spec.mode {
            Mode::Bulk => self.spec.req_size as usize + HDR_LEN,
            Mode::Rpc => usize::MAX,
        }
    }

    /// Bulk before the end: the worker always has more to send.
    pub fn streaming(&self, now: Instant) -> bool {
        self.spec.mode == Mode::Bulk && now < self.timing.end && self.error.is_none()
    }

    /// When the next open-loop arrival is due (None in closed loop).
    pub fn next_arrival(&self) -> Option<Instant> {
        self.open.as_ref().map(|o| o.2)
    }

    /// Bytes connection `i` wants to send.
    pub fn tx(&mut self, i: usize) -> &mut TxBuf {
        self.conns[i].tx()
    }

    /// The stack took `n` bytes of connection `i` at `now`.
    pub fn on_sent(&mut self, i: usize, n: usize, now: Instant) {
        self.conns[i].tx().consume(n);
        if now >= self.timing.warm_end && now < self.timing.end {
            self.wire_tx_window += n as u64;
        }
        let (warm_end, end) = (self.timing.warm_end, self.timing.end);
        let (sent, behind, max_lag, lags) = (
            &mut self.sent_window,
            &mut self.behind,
            &mut self.max_lag_ns,
            &mut self.lag_hist,
        );
        self.conns[i].on_sent(n, |t0| {
            if t0 >= warm_end && t0 < end {
                *sent += 1;
                let lag = now.saturating_duration_since(t0);
                if lag > BEHIND_SCHEDULE {
                    *behind += 1;
                }
                let ns = lag.as_nanos() as u64;
                *max_lag = (*max_lag).max(ns);
                let _ = lags.record(ns.clamp(1, MAX_NS));
            }
        });
    }

    /// Bytes received on connection `i` at `now`.
    pub fn on_rx(&mut self, i: usize, data: &[u8], now: Instant) {
        if self.error.is_some() {
            return;
        }
        let in_window = now >= self.timing.warm_end && now < self.timing.end;
        let (hist, completed, progress) = (&mut self.hist, &mut self.completed, &self.progress);
        let (open, warm_end, end) = (self.open.is_some(), self.timing.warm_end, self.timing.end);
        let mut n = 0u64;
        let waiting = self.conns[i].outstanding();
        let r = self.conns[i].on_rx(data, |t0| {
            n += 1;
            if in_window {
                *completed += 1;
            }
            // Closed loop: RPCs completed in the window. Open loop: RPCs *scheduled* in the
            // window, whenever they complete (also during the drain), from the scheduled
            // time (wrk2's rule), so slow answers are not left out.
            let record = if open {
                t0 >= warm_end && t0 < end
            } else {
                in_window
            };
            if record {
                let ns = now.saturating_duration_since(t0).as_nanos() as u64;
                let _ = hist.record(ns.clamp(1, MAX_NS));
            }
        });
        self.outstanding = self.outstanding + self.conns[i].outstanding() - waiting;
        if n > 0 {
            progress.fetch_add(n, Ordering::Relaxed);
            if !self.in_refill[i] {
                self.in_refill[i] = true;
                self.refill.push(i);
            }
        }
        if in_window && self.spec.mode == Mode::Rpc {
            self.rx_payload += n * self.spec.resp_size as u64;
            self.tx_payload += n * self.spec.req_size as u64;
        }
        if let Err(e) = r {
            self.error = Some(format!(
                "connection {}: {e}",
                self.spec.first_conn as usize + i
            ));
        }
    }

    /// A protocol or transport error ends the run.
    pub fn fail(&mut self, msg: String) {
        if self.error.is_none() {
            self.error = Some(msg);
        }
    }

    /// The first error seen.
    #[cfg(test)]
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// True once the run is over for this thread (or failed).
    pub fn finished(&self, now: Instant) -> bool {
        if self.error.is_some() {
            return true;
        }
        match self.spec.mode {
            Mode::Rpc if self.open.is_some() => {
                now >= self.timing.end + OPEN_LOOP_DRAIN
                    || (now >= self.timing.end && self.outstanding == 0)
            }
            Mode::Rpc => now >= self.timing.end,
            Mode::Bulk => {
                self.conns.iter().all(|c| c.sync_report().is_some())
                    || now >= self.timing.end + SYNC_TIMEOUT
            }
        }
    }

    /// The thread's result.
    pub fn finish(mut self) -> ThreadResult {
        let bulk = if self.spec.mode == Mode::Bulk {
            let reports: Vec<SyncReport> =
                self.conns.iter().filter_map(|c| c.sync_report()).collect();
            if reports.len() != self.conns.len() && self.error.is_none() {
                self.error = Some(format!(
                    "bulk: no SYNC answer within {SYNC_TIMEOUT:?} after the run"
                ));
            }
            let sent: u64 = self.conns.iter().map(|c| c.bulk_sent).sum();
            let msg = (self.spec.req_size as usize + HDR_LEN) as f64;
            Some(BulkResult {
                payload_sent: sent,
                payload_received: reports.iter().map(|r| r.total_bytes).sum(),
                window_bytes: reports.iter().map(|r| r.window_bytes).sum(),
                window_ns: reports.iter().map(|r| r.window_ns).max().unwrap_or(0),
                sender_window_payload: (self.wire_tx_window as f64 * self.spec.req_size as f64
                    / msg) as u64,
            })
        } else {
            None
        };
        let honesty = Honesty {
            sent: self.sent_window,
            behind_schedule: self.behind,
            max_send_lag_ns: self.max_lag_ns,
            not_answered: self.conns.iter().map(|c| c.outstanding() as u64).sum(),
            unsent: self.conns.iter().map(|c| c.unsent() as u64).sum(),
        };
        ThreadResult {
            hist: self.hist,
            completed: self.completed,
            tx_payload: self.tx_payload,
            rx_payload: self.rx_payload,
            offered: self.offered,
            dropped: self.dropped,
            honesty,
            send_lag: self.lag_hist,
            bulk,
            error: self.error,
            extra: Value::Null,
        }
    }
}

/// Latencies above a minute are clamped (the histogram's range).
const MAX_NS: u64 = 60_000_000_000;

/// A latency histogram in ns, 3 significant digits.
pub fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_NS, 3).expect("static histogram bounds are valid")
}

/// Bulk counters of a thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct BulkResult {
    /// Payload bytes the client queued in total.
    pub payload_sent: u64,
    /// Payload bytes the server says it received in total (checked equal).
    pub payload_received: u64,
    /// Server side: payload bytes between MARK and SYNC.
    pub window_bytes: u64,
    /// Server side: ns between MARK and SYNC.
    pub window_ns: u64,
    /// Client side: payload bytes the stack accepted during the measured window.
    pub sender_window_payload: u64,
}

/// Open-loop honesty counters of a thread (wrk2 / Perséphone rules).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Honesty {
    /// Requests scheduled in the window and handed to the stack.
    pub sent: u64,
    /// Of those, handed over more than [`BEHIND_SCHEDULE`] after their scheduled time.
    pub behind_schedule: u64,
    /// Largest lag between scheduled time and hand-over (ns).
    pub max_send_lag_ns: u64,
    /// Requests queued and still unanswered at the end (after the drain), any time.
    pub not_answered: u64,
    /// Of those, requests whose bytes never fully left (the socket had no room).
    pub unsent: u64,
}

impl Honesty {
    fn add(&mut self, o: &Honesty) {
        self.sent += o.sent;
        self.behind_schedule += o.behind_schedule;
        self.max_send_lag_ns = self.max_send_lag_ns.max(o.max_send_lag_ns);
        self.not_answered += o.not_answered;
        self.unsent += o.unsent;
    }
}

/// What one client thread measured.
pub struct ThreadResult {
    /// RPC latencies in the window (ns).
    pub hist: Histogram<u64>,
    /// RPCs completed in the window.
    pub completed: u64,
    /// Request payload bytes of completed RPCs.
    pub tx_payload: u64,
    /// Response payload bytes of completed RPCs.
    pub rx_payload: u64,
    /// Open loop: arrivals in the window.
    pub offered: u64,
    /// Open loop: arrivals dropped (too many outstanding).
    pub dropped: u64,
    /// Open loop: honesty counters.
    pub honesty: Honesty,
    /// Open loop: send lag (scheduled time to hand-over) of the window's requests (ns).
    pub send_lag: Histogram<u64>,
    /// Bulk counters.
    pub bulk: Option<BulkResult>,
    /// First error.
    pub error: Option<String>,
    /// Backend counters of this thread's stack (device, TCP, poll loop), or null.
    pub extra: Value,
}

/// Quantiles reported for the latency CDF (fig. 11).
pub const CDF_QUANTILES: [f64; 21] = [
    0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999,
    0.9995, 0.9999, 0.99999, 1.0,
];

/// Merges thread results into the client's JSON report (`duration` = measured seconds).
pub fn merge(results: Vec<ThreadResult>, duration: f64, mode: Mode, rate: Option<f64>) -> Value {
    let mut hist = new_hist();
    let (mut rpcs, mut txp, mut rxp, mut offered, mut dropped) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut bulk: Option<BulkResult> = None;
    let mut errors = Vec::new();
    let mut extra = Vec::new();
    let mut hon = Honesty::default();
    let mut lag = new_hist();
    for r in results {
        hon.add(&r.honesty);
        let _ = lag.add(&r.send_lag);
        if !r.extra.is_null() {
            extra.push(r.extra);
        }
        let _ = hist.add(&r.hist);
        rpcs += r.completed;
        txp += r.tx_payload;
        rxp += r.rx_payload;
        offered += r.offered;
        dropped += r.dropped;
        if let Some(b) = r.bulk {
            let t = bulk.get_or_insert_with(BulkResult::default);
            t.payload_sent += b.payload_sent;
            t.payload_received += b.payload_received;
            t.window_bytes += b.window_bytes;
            t.window_ns = t.window_ns.max(b.window_ns);
            t.sender_window_payload += b.sender_window_payload;
        }
        if let Some(e) = r.error {
            errors.push(e);
        }
    }
    let gb = |bytes: u64| bytes as f64 * 8.0 / duration / 1e9;
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    // Open loop records the requests *scheduled* in the window, which may be none of
    // those completed in it (an overloaded server answering warm-up requests): no
    // latency then (null), never a p99 of 0 that would pass any SLO.
    let timed = !hist.is_empty();
    let lat = if timed {
        json!({
            "min": hist.min() as f64 / 1000.0,
            "mean": hist.mean() / 1000.0,
            "p50": us(0.5), "p90": us(0.9), "p99": us(0.99), "p999": us(0.999),
            "max": hist.max() as f64 / 1000.0,
        })
    } else {
        Value::Null
    };
    let cdf: Vec<Value> = if timed {
        CDF_QUANTILES.iter().map(|&q| json!([q, us(q)])).collect()
    } else {
        Vec::new()
    };
    let bulk_v = bulk.map(|b| {
        // The receiver's window runs from the MARK to the SYNC message as its reads saw
        // them: a receiver starved of CPU can read both in one batch (window 0), and then
        // its rate cannot be told — null (printed "-"), not a false 0 Gbit/s.
        let recv = if b.window_ns > 0 {
            json!(b.window_bytes as f64 * 8.0 / b.window_ns as f64)
        } else {
            Value::Null
        };
        json!({
            "payload_sent": b.payload_sent,
            "payload_received": b.payload_received,
            "validated": b.payload_sent == b.payload_received,
            "receiver_gbps": recv,
            "sender_gbps": gb(b.sender_window_payload),
            "receiver_window_s": b.window_ns as f64 / 1e9,
        })
    });
    let (rps, gbps) = match mode {
        Mode::Rpc => (
            json!(rpcs as f64 / duration),
            json!({
                "total": gb(txp + rxp),
                "client_to_server": gb(txp),
                "server_to_client": gb(rxp),
            }),
        ),
        Mode::Bulk => {
            let g = bulk_v
                .as_ref()
                .and_then(|b| b["receiver_gbps"].as_f64())
                .unwrap_or(0.0);
            (
                Value::Null,
                json!({"total": g, "client_to_server": g, "server_to_client": 0.0}),
            )
        }
    };
    json!({
        "duration_s": duration,
        "rpcs": rpcs,
        "rps": rps,
        "gbps": gbps,
        "latency_us": lat,
        "cdf": cdf,
        "open_loop": rate.map(|r| json!({
            "offered_rps": r,
            "arrivals": offered,
            "achieved_rps": rpcs as f64 / duration,
            "dropped_arrivals": dropped,
            "sent": hon.sent,
            "behind_schedule": hon.behind_schedule,
            "behind_schedule_threshold_us": BEHIND_SCHEDULE.as_secs_f64() * 1e6,
            "max_send_lag_us": hon.max_send_lag_ns as f64 / 1e3,
            "send_lag_us": send_lag_json(&lag),
            "client_behind": client_behind(&lag),
            "sent_not_answered": hon.not_answered,
            "unsent_at_end": hon.unsent,
            "drain_s": OPEN_LOOP_DRAIN.as_secs_f64(),
            "latency_from": "scheduled send time",
            "p50_us": if timed { json!(us(0.5)) } else { Value::Null },
            "p99_us": if timed { json!(us(0.99)) } else { Value::Null },
            "p999_us": if timed { json!(us(0.999)) } else { Value::Null },
        })),
        "bulk": bulk_v,
        "errors": errors,
        "client_extra": extra,
    })
}

/// Send lag quantiles (µs) of the window's requests; null if none was sent.
fn send_lag_json(lag: &Histogram<u64>) -> Value {
    if lag.is_empty() {
        return Value::Null;
    }
    let us = |q: f64| lag.value_at_quantile(q) as f64 / 1e3;
    json!({
        "p50": us(0.5), "p90": us(0.9), "p99": us(0.99), "p999": us(0.999),
        "max": lag.max() as f64 / 1e3,
    })
}

/// Whether the client fell behind its own schedule ([`CLIENT_BEHIND_QUANTILE`]).
fn client_behind(lag: &Histogram<u64>) -> bool {
    !lag.is_empty()
        && lag.value_at_quantile(CLIENT_BEHIND_QUANTILE) > BEHIND_SCHEDULE.as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ServerConn;

    fn spec(mode: Mode, rate: Option<f64>) -> WorkerSpec {
        WorkerSpec {
            first_conn: 0,
            conns: 2,
            req_size: 100,
            resp_size: 200,
            iodepth: 4,
            rate,
            verify: true,
            mode,
            seed: 7,
            messages: false,
            service: None,
            unordered: false,
        }
    }

    /// Moves every queued byte through in-memory servers.
    fn exchange(w: &mut ClientWorker, servers: &mut [ServerConn], now: Instant) {
        for (i, s) in servers.iter_mut().enumerate() {
            let b = w.tx(i).pending().to_vec();
            w.on_sent(i, b.len(), now);
            s.on_rx(&b, now).unwrap();
            let r = s.tx().pending().to_vec();
            s.tx().consume(r.len());
            w.on_rx(i, &r, now);
        }
    }

    #[test]
    fn closed_loop_keeps_iodepth_outstanding_and_counts_only_the_window() {
        let t = Instant::now();
        let timing = Timing {
            warm_end: t + Duration::from_millis(10),
            end: t + Duration::from_millis(20),
        };
        let p = Arc::new(AtomicU64::new(0));
        let mut w = ClientWorker::new(spec(Mode::Rpc, None), timing, p.clone());
        let mut s = [ServerConn::new(200), ServerConn::new(200)];
        assert!(w.has_work(t), "the first tick fills every connection");
        w.tick(t);
        assert_eq!(w.conns[0].outstanding(), 4);
        assert!(!w.has_work(t), "nothing completed: nothing to issue");
        exchange(&mut w, &mut s, t); // warm-up: not counted
        assert!(w.has_work(t), "completions make room");
        w.tick(t + Duration::from_millis(15));
        exchange(&mut w, &mut s, t + Duration::from_millis(15));
        assert!(!w.finished(t + Duration::from_millis(15)));
        w.tick(t + Duration::from_millis(20)); // end: nothing new
        assert_eq!(w.conns[0].outstanding(), 0);
        assert!(w.finished(t + Duration::from_millis(20)));
        assert_eq!(p.load(Ordering::Relaxed), 16);
        let r = w.finish();
        assert_eq!(r.completed, 8);
        assert_eq!(r.tx_payload, 800);
        assert_eq!(r.rx_payload, 1600);
        assert!(r.error.is_none());
        let v = merge(vec![r], 0.01, Mode::Rpc, None);
        assert_eq!(v["rpcs"], 8);
        assert!((v["rps"].as_f64().unwrap() - 800.0).abs() < 1e-9);
        assert!(v["latency_us"]["p99"].as_f64().unwrap() > 0.0);
    }

    #[test]
    fn open_loop_issues_poisson_arrivals_at_the_rate() {
        let t = Instant::now();
        let timing = Timing {
            warm_end: t,
            end: t + Duration::from_secs(10),
        };
        let mut w = ClientWorker::new(
            spec(Mode::Rpc, Some(10_000.0)),
            timing,
            Arc::new(AtomicU64::new(0)),
        );
        let start = w.next_arrival().unwrap();
        w.tick(start + Duration::from_millis(500));
        // 5,000 expected; Poisson sd ~ 71, so 4,600..5,400 is > 5 sd (and the seed is fixed).
        assert!((4_600..5_400).contains(&w.offered), "{}", w.offered);
        let queued = w.conns[0].outstanding() + w.conns[1].outstanding();
        assert_eq!(queued as u64, w.offered);
        // Round robin over the two connections.
        assert!(w.conns[0].outstanding().abs_diff(w.conns[1].outstanding()) <= 1);
    }

    /// The open-loop drain ends when every request is answered: judged from a running
    /// total kept as requests are queued and answered (it equals the connections' sum at
    /// every step), not from a scan of the connections in every poll iteration.
    #[test]
    fn open_loop_drain_ends_on_the_running_outstanding_total() {
        let t = Instant::now();
        let timing = Timing {
            warm_end: t,
            end: t + Duration::from_millis(50),
        };
        let mut w = ClientWorker::new(
            spec(Mode::Rpc, Some(20_000.0)),
            timing,
            Arc::new(AtomicU64::new(0)),
        );
        let sum = |w: &ClientWorker| w.conns.iter().map(|c| c.outstanding()).sum::<usize>();
        let mut s = [ServerConn::new(200), ServerConn::new(200)];
        let start = w.next_arrival().unwrap();
        w.tick(start + Duration::from_millis(10));
        assert!(w.outstanding > 100, "{}", w.outstanding);
        assert_eq!(w.outstanding, sum(&w));
        exchange(&mut w, &mut s, start + Duration::from_millis(10));
        assert_eq!(w.outstanding, 0);
        w.tick(t + Duration::from_millis(49));
        assert_eq!(w.outstanding, sum(&w));
        let end = t + Duration::from_millis(50);
        assert!(
            w.outstanding > 0 && !w.finished(end),
            "answers still owed: drain"
        );
        // Half of connection 0's answers: still owed on both connections.
        let b = w.tx(0).pending().to_vec();
        w.on_sent(0, b.len(), end);
        s[0].on_rx(&b, end).unwrap();
        let r = s[0].tx().pending().to_vec();
        s[0].tx().consume(r.len());
        let half = r.len() / 2 / (HDR_LEN + 200) * (HDR_LEN + 200);
        w.on_rx(0, &r[..half], end);
        assert_eq!(w.outstanding, sum(&w));
        assert!(!w.finished(end));
        w.on_rx(0, &r[half..], end);
        let b = w.tx(1).pending().to_vec();
        w.on_sent(1, b.len(), end);
        s[1].on_rx(&b, end).unwrap();
        let r = s[1].tx().pending().to_vec();
        w.on_rx(1, &r, end);
        assert_eq!((w.outstanding, sum(&w)), (0, 0));
        assert!(w.finished(end), "all answered: the drain is over");
        assert!(w.error.is_none());
    }

    /// Completions in the window of requests scheduled before it (an overloaded server
    /// answering the warm-up) are throughput, but no request of the window was timed: the
    /// latency is null, not a p99 of 0.
    #[test]
    fn an_open_loop_window_with_no_timed_request_has_no_latency() {
        let t = Instant::now();
        let timing = Timing {
            warm_end: t + Duration::from_millis(10),
            end: t + Duration::from_millis(20),
        };
        let mut w = ClientWorker::new(
            spec(Mode::Rpc, Some(20_000.0)),
            timing,
            Arc::new(AtomicU64::new(0)),
        );
        let mut s = [ServerConn::new(200), ServerConn::new(200)];
        w.tick(t + Duration::from_millis(9));
        assert!(w.offered == 0 && w.outstanding > 0, "warm-up arrivals only");
        exchange(&mut w, &mut s, t + Duration::from_millis(15));
        let r = w.finish();
        assert!(r.completed > 0);
        let v = merge(vec![r], 0.01, Mode::Rpc, Some(20_000.0));
        assert!(v["rpcs"].as_u64().unwrap() > 0);
        assert_eq!(v["latency_us"], Value::Null, "{}", v["latency_us"]);
        assert_eq!(v["open_loop"]["p99_us"], Value::Null);
    }

    /// A client that first gets to run after the end still issues every arrival of the
    /// window (offered, sent, its lag measured), none after the end.
    #[test]
    fn a_client_stalled_past_the_end_still_issues_the_windows_arrivals() {
        let t = Instant::now();
        let timing = Timing {
            warm_end: t,
            end: t + Duration::from_secs(1),
        };
        let mut sp = spec(Mode::Rpc, Some(1_000.0));
        sp.verify = false;
        let mut w = ClientWorker::new(sp, timing, Arc::new(AtomicU64::new(0)));
        let late = t + Duration::from_millis(1500);
        assert!(w.has_work(late));
        w.tick(late);
        // About 1,000 arrivals (Poisson sd ~32; fixed seed).
        assert!((850..1150).contains(&w.offered), "{}", w.offered);
        assert!(w.next_arrival().unwrap() >= timing.end);
        assert!(
            !w.has_work(late + Duration::from_secs(1)),
            "none after the end"
        );
        for i in 0..2 {
            let n = w.tx(i).len();
            w.on_sent(i, n, late);
        }
        assert_eq!(w.sent_window, w.offered);
        assert!(
            w.lag_hist.value_at_quantile(0.5) > 400_000_000,
            "late by ~1 s"
        );
    }

    #[test]
    fn open_loop_drops_arrivals_beyond_the_outstanding_cap() {
        let t = Instant::now();
        let timing = Timing {
            warm_end: t,
            end: t + Duration::from_secs(100),
        };
        let mut w = ClientWorker::new(
            spec(Mode::Rpc, Some(1_000_000.0)),
            timing,
            Arc::new(AtomicU64::new(0)),
        );
        w.tick(w.next_arrival().unwrap() + Duration::from_millis(20));
        assert!(w.dropped > 0);
        assert!(w.conns[0].outstanding() <= OPEN_LOOP_MAX_OUTSTANDING);
    }

    #[test]
    fn open_loop_honesty_counters_on_a_synthetic_schedule() {
        let t = Instant::now();
        let timing = Timing {
            warm_end: t,
            end: t + Duration::from_secs(1),
        };
        let mut sp = spec(Mode::Rpc, Some(1_000.0));
        sp.verify = false;
        let mut w = ClientWorker::new(sp, timing, Arc::new(AtomicU64::new(0)));
        let first = w.next_arrival().unwrap();
        // About 1,000 arrivals scheduled over the second; the client "runs" at 0.9 s.
        let late = t + Duration::from_millis(900);
        w.tick(late);
        let arrivals = w.offered;
        assert!(arrivals > 500, "{arrivals}");
        assert!(first >= t);
        // Connection 0's bytes leave at 0.9 s: every one of its requests scheduled more than
        // 10 us before is behind schedule. Connection 1 sends nothing.
        let n0 = w.tx(0).pending().len();
        w.on_sent(0, n0, late);
        let c0 = w.conns[0].outstanding() as u64;
        let c1 = w.conns[1].outstanding() as u64;
        assert_eq!(c0 + c1, arrivals);
        assert_eq!(w.sent_window, c0);
        assert!(w.behind >= c0 - 1 && w.behind <= c0, "{} of {c0}", w.behind);
        // Answer half of connection 0's requests, in order, at 0.95 s.
        let mut srv = ServerConn::new(200);
        let b = w.conns[0].tx().pending().to_vec();
        assert!(b.is_empty());
        let answered = c0 / 2;
        let mut resp = Vec::new();
        for k in 0..answered {
            let mut h = crate::proto::Header {
                id: k,
                len: 200,
                flags: flags::RESPONSE,
            }
            .encode()
            .to_vec();
            h.resize(16 + 200, 0);
            resp.extend(h);
        }
        let _ = &mut srv;
        w.on_rx(0, &resp, t + Duration::from_millis(950));
        assert!(w.error().is_none(), "{:?}", w.error());
        // Not finished at the end while answers are due (the drain), finished after it.
        assert!(!w.finished(t + Duration::from_secs(1)));
        assert!(w.finished(t + Duration::from_secs(1) + OPEN_LOOP_DRAIN));
        let r = w.finish();
        assert_eq!(r.completed, answered);
        assert_eq!(r.hist.len(), answered);
        // Latency from the scheduled time: at least 50 ms for every recorded answer.
        assert!(r.hist.min() >= 50_000_000, "{}", r.hist.min());
        assert_eq!(r.honesty.sent, c0);
        assert_eq!(r.honesty.not_answered, arrivals - answered);
        assert_eq!(r.honesty.unsent, c1);
        assert!(r.honesty.max_send_lag_ns >= 800_000_000);
        let v = merge(vec![r], 1.0, Mode::Rpc, Some(1_000.0));
        let o = &v["open_loop"];
        assert_eq!(o["sent_not_answered"], arrivals - answered);
        assert_eq!(o["unsent_at_end"], c1);
        assert_eq!(o["sent"], c0);
        assert!(o["behind_schedule"].as_u64().unwrap() >= c0 - 1);
        assert!(o["p99_us"].as_f64().unwrap() >= 50_000.0);
        assert_eq!(o["achieved_rps"], answered as f64);
        // How late: connection 0's requests left at 0.9 s, scheduled over [0, 0.9 s):
        // the median lag is about 0.45 s, the largest about 0.9 s; the round is flagged.
        let lag = &o["send_lag_us"];
        let p50 = lag["p50"].as_f64().unwrap();
        assert!((300_000.0..600_000.0).contains(&p50), "{lag}");
        assert!(lag["max"].as_f64().unwrap() >= 800_000.0, "{lag}");
        assert_eq!(o["client_behind"], true);
    }

    #[test]
    fn a_client_on_schedule_is_not_flagged() {
        let t = Instant::now();
        let timing = Timing {
            warm_end: t,
            end: t + Duration::from_secs(1),
        };
        let mut sp = spec(Mode::Rpc, Some(2_000.0));
        sp.verify = false;
        let mut w = ClientWorker::new(sp, timing, Arc::new(AtomicU64::new(0)));
        // Every arrival is handed over 2 us after its scheduled time.
        while let Some(next) = w.next_arrival().filter(|n| *n < t + Duration::from_secs(1)) {
            let at = next + Duration::from_micros(2);
            w.tick(at);
            for i in 0..2 {
                let n = w.tx(i).pending().len();
                if n > 0 {
                    w.on_sent(i, n, at);
                }
            }
        }
        let r = w.finish();
        assert!(r.honesty.sent > 1_000, "{}", r.honesty.sent);
        assert_eq!(r.honesty.behind_schedule, 0);
        let v = merge(vec![r], 1.0, Mode::Rpc, Some(2_000.0));
        let o = &v["open_loop"];
        assert_eq!(o["client_behind"], false);
        let p99 = o["send_lag_us"]["p99"].as_f64().unwrap();
        assert!((1.9..2.1).contains(&p99), "{p99}");
    }

    #[test]
    fn bulk_streams_marks_and_syncs() {
        let t = Instant::now();
        let timing = Timing {
            warm_end: t + Duration::from_millis(1),
            end: t + Duration::from_millis(2),
        };
        let mut sp = spec(Mode::Bulk, None);
        sp.conns = 1;
        let mut w = ClientWorker::new(sp, timing, Arc::new(AtomicU64::new(0)));
        let mut s = [ServerConn::new(0)];
        for ms in [0, 1, 2] {
            let now = t + Duration::from_millis(ms);
            w.tick(now);
            exchange(&mut w, &mut s, now);
        }
        assert!(w.finished(t + Duration::from_millis(2)));
        let r = w.finish();
        assert!(r.error.is_none(), "{:?}", r.error);
        let b = r.bulk.unwrap();
        assert!(b.payload_sent > 0);
        assert_eq!(b.payload_sent, b.payload_received);
        assert!(b.window_bytes > 0 && b.window_bytes < b.payload_sent);
    }

    #[test]
    fn a_bad_response_fails_the_worker() {
        let t = Instant::now();
        let timing = Timing {
            warm_end: t,
            end: t + Duration::from_secs(1),
        };
        let mut w = ClientWorker::new(spec(Mode::Rpc, None), timing, Arc::new(AtomicU64::new(0)));
        w.tick(t);
        w.on_rx(0, &[0u8; 16], t);
        assert!(w.finished(t));
        assert!(w.error().unwrap().contains("bad magic"), "{:?}", w.error());
    }
}
