//! One TCP connection: the transmission control block (RFC 9293 §3.3.1) and its state
//! machine (RFC 9293 §3.10), with loss recovery (RFC 5681, 6582, 6675, and RACK-TLP of
//! RFC 8985 where DupThresh cannot help), RTO (RFC 6298),
//! window scaling/timestamps/PAWS (RFC 7323), SACK (RFC 2018, 2883) and the RFC 5961
//! blind-attack defences.
//!
//! The connection is sans-IO: the stack feeds it parsed segments (`on_segment`), timer
//! expiries (`on_timeout`) and application calls, and pulls segments to send with
//! `poll_segment` until it returns `None`; [`Connection`]'s type documentation holds the
//! contract. The code is split by direction, as `impl` blocks of the one type: `input`
//! (segment arrival), `output` (segment generation), `timers` (the timer table and what
//! fires from it), `tlp` (tail loss probes and RACK's reordering timer, RFC 8985) and
//! `undo` (spurious-recovery detection and undo).

use super::assembler::{Assembler, AssemblerConfig, Compactor, Payload};
use super::cc::{Cc, CongestionControl, RecoveryInflation};
use super::config::TcpConfig;
use super::counters::{ConnCounters, DropReason};
use super::rtt::{RttConfig, RttEstimator, SampleSource};
use super::scoreboard::{NextSeg, Scoreboard};
use super::sendq::SendQueue;
use super::SeqNum;
use crate::time::{Duration, Instant};
use crate::wire::{Icmpv4DstUnreachable, SackBlocks, TcpFlags, TcpOptions, TcpRepr, Timestamps};
use core::net::SocketAddrV4;
use std::collections::VecDeque;
use std::sync::Arc;
use zbuf::{IoVec, Zbuf};

/// RFC 9293 §3.7.1: without an MSS option the peer's MSS is 536.
pub const DEFAULT_PEER_MSS: u32 = 536;

/// The unit of `Connection::rcv_ratio`: one payload byte per byte of truesize.
const RCV_RATIO_SHIFT: u32 = 16;
const RCV_RATIO_ONE: u32 = 1 << RCV_RATIO_SHIFT;

/// The least truesize a sample of `Connection::rcv_ratio` covers: about eight 2 KiB
/// receive buffers, so that one odd segment does not swing it.
const RCV_RATIO_SAMPLE: u32 = 16 << 10;

/// Floor for the peer's MSS. A tiny or zero MSS would make us loop over zero-length or
/// one-byte segments (a bug class found in other stacks; CVE-2019-11479 is its resource
/// exhaustion variant). 88 leaves 48 payload bytes even with 40 bytes of options.
pub const MIN_SND_MSS: u32 = 88;

/// RFC 5681 §3.2: three duplicate ACKs trigger fast retransmit (RFC 6675 DupThresh).
const DUP_THRESH: u32 = 3;

/// Most duplicate ACKs sent for one burst of out-of-order segments.
const MAX_DUPACKS_OWED: u32 = 64;

/// Timestamp ticks a segment may lag TS.Recent before PAWS rejects it (Linux's
/// TCP_PAWS_WINDOW); see the PAWS check.
const PAWS_WINDOW: i32 = 1;

/// RFC 7323 §5.5: TS.Recent is invalid after 24 days of idleness.
const PAWS_IDLE: Duration = Duration::from_secs(24 * 24 * 3600);

/// The states of RFC 9293 §3.3.2 that a connection object can be in (LISTEN lives in the
/// listener).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// No connection (initial, or after reset/abort/timeout).
    Closed,
    /// Active open: SYN sent.
    SynSent,
    /// SYN received and SYN-ACK sent.
    SynReceived,
    /// Data transfer.
    Established,
    /// We closed; our FIN is not yet acknowledged.
    FinWait1,
    /// Our FIN is acknowledged; waiting for the peer's.
    FinWait2,
    /// The peer closed; we may still send.
    CloseWait,
    /// Both closed simultaneously; waiting for the ACK of our FIN.
    Closing,
    /// The peer closed first, then we did; waiting for the ACK of our FIN.
    LastAck,
    /// Both closed; lingering 2*MSL (RFC 9293 §3.6.1).
    TimeWait,
}

impl State {
    /// RFC 9293: a synchronized state is any after the handshake.
    pub fn is_synchronized(self) -> bool {
        !matches!(self, State::Closed | State::SynSent | State::SynReceived)
    }
}

/// The local and remote endpoints of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FourTuple {
    /// Our address and port.
    pub local: SocketAddrV4,
    /// The peer's address and port.
    pub remote: SocketAddrV4,
}

/// Why a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// Both sides closed in order.
    Normal,
    /// The peer reset the connection.
    Reset,
    /// The peer refused the connection (RST in SYN-SENT).
    Refused,
    /// Retransmissions or keepalives went unanswered.
    Timeout,
    /// The application aborted it.
    Aborted,
    /// The handshake's next hop did not answer address resolution
    /// ([`Connection::on_neighbour_unreachable`]).
    HostUnreachable,
}

/// Application-visible events, collected by the stack after each call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Events {
    /// The handshake completed.
    pub connected: bool,
    /// In-order data or the peer's FIN is ready to read.
    pub readable: bool,
    /// Send-buffer space was freed.
    pub writable: bool,
    /// The connection reached a terminal state.
    pub closed: bool,
}

impl Events {
    /// Whether any event is set.
    pub fn any(&self) -> bool {
        self.connected || self.readable || self.writable || self.closed
    }
}

/// What the stack should do with the connection after a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Keep it.
    Keep,
    /// Remove it silently (e.g. a passive SYN-RECEIVED connection reset by the peer, which
    /// RFC 9293 §3.10.7.4 returns to LISTEN).
    Remove,
}

/// A segment for the stack to wrap in IP and Ethernet and send.
#[derive(Debug, Clone, Default)]
pub struct OutSegment {
    /// The TCP header.
    pub repr: TcpRepr,
    /// The payload, as references into send-queue buffers.
    pub payload: IoVec,
    /// 0: one segment. Otherwise (only from [`Connection::poll_burst_into`]) a burst: the
    /// payload goes out as consecutive segments of `burst_piece` bytes, the last one
    /// shorter; each carries `repr` with its own sequence number, and only the last the
    /// PSH and FIN flags `repr` has.
    pub(crate) burst_piece: u32,
}

impl OutSegment {
    /// The payload bytes per segment when this is a burst of several segments
    /// ([`Connection::poll_burst_into`]), `None` for one segment.
    pub fn burst_piece(&self) -> Option<u32> {
        (self.burst_piece != 0).then_some(self.burst_piece)
    }
}

/// Errors from [`Connection::send`]: why the connection takes no bytes. (A stale handle is
/// the stack's error: [`crate::stack::SendError::InvalidHandle`].)
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The send buffer is full; retry after a writable event.
    #[error("the send buffer is full")]
    WouldBlock,
    /// The sending side was shut down.
    #[error("the sending side was shut down")]
    Shutdown,
    /// The connection is closed (see its close reason).
    #[error("the connection is closed")]
    Closed,
}

/// Errors from [`Connection::recv`]: why no bytes can come any more. (A stale handle is
/// the stack's error: [`crate::stack::RecvError::InvalidHandle`].)
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// The peer closed its side and every byte has been read (end of stream).
    #[error("end of stream: the peer closed and every byte was read")]
    Finished,
    /// The connection is closed before the stream ended (reset, timeout, abort).
    #[error("the connection closed before the end of the stream")]
    Closed,
}

#[derive(Debug, Clone, Copy)]
struct TsState {
    /// TS.Recent (RFC 7323 §4.3).
    recent: u32,
    /// When TS.Recent was last updated (for the 24-day rule).
    recent_at: Instant,
    /// Random per-connection offset of our timestamp clock (RFC 7323 §5.4).
    offset: u32,
}

#[derive(Debug, Clone, Copy, Default)]
struct Keepalive {
    /// Probes sent since the connection was last heard from (the deadline is
    /// [`Timer::Keepalive`] in the timer table).
    probes_sent: u32,
}

/// A TCP connection: one transmission control block and its state machine, sans-IO.
///
/// The stack owns every connection (one per 4-tuple) and is its only driver; tests drive
/// one directly. It reads no clock: `now` comes with each call.
///
/// # Method groups
///
/// - **Creation**: [`Connection::connect`] (active open, the SYN goes out at the first
///   poll), [`Connection::accept_syn`] (passive open from a listener's SYN, in
///   SYN-RECEIVED), [`Connection::from_cookie`] (re-created from a valid SYN cookie; the
///   caller then feeds it the ACK that carried the cookie).
/// - **Input**: [`Connection::on_segment`] for each segment of its 4-tuple (the payload
///   is a zero-copy slice of the frame); [`Disposition::Remove`] means the stack drops the
///   connection silently. [`Connection::on_path_mtu`] for a validated ICMP "fragmentation
///   needed". Before handing a SYN to a TIME-WAIT connection, [`Connection::accepts_new_syn`]
///   says whether it may open a new incarnation instead.
/// - **Timers**: [`Connection::poll_timeout`] is the earliest deadline of its timer table;
///   [`Connection::on_timeout`]`(now)` once it has passed (it runs only what is due).
/// - **Application calls**: [`Connection::send`] / [`Connection::send_iovec`] (partial:
///   they return how much the send buffer took), [`Connection::send_capacity`];
///   [`Connection::recv`] / [`Connection::recv_iovec`], [`Connection::recv_available`];
///   [`Connection::close`] (FIN after queued data), [`Connection::abort`] (RST);
///   [`Connection::set_orphaned`] when the application lets go of it.
/// - **Output**: [`Connection::poll_segment`]`(now)` until `None`, each [`OutSegment`]
///   for the stack to wrap in IPv4 and Ethernet; [`Connection::take_events`] for what the
///   application should hear about.
/// - **Inspection**: [`Connection::state`], [`Connection::close_reason`],
///   [`Connection::tuple`], [`Connection::is_closed`] (the stack may reclaim it), the
///   congestion and RTT state ([`Connection::cwnd`], [`Connection::rtt`], ...), and
///   [`Connection::counters`].
///
/// # Call order
///
/// Segments in ([`Connection::on_segment`]), due timers ([`Connection::on_timeout`]),
/// application calls; then [`Connection::poll_segment`] until `None` (it arms the
/// retransmission and persist timers for what it sent); then [`Connection::poll_timeout`]
/// for the next deadline and [`Connection::take_events`].
#[repr(C, align(64))]
pub struct Connection {
    // Hot: what every segment of an established connection reads or writes, in the first
    // lines (`#[repr(C)]` keeps this order; `hot_fields_share_the_first_cache_lines` checks
    // where they end). Eight-byte fields first, then four-, two- and one-byte ones: no padding.
    /// The settings, shared with every connection of the stack (read-only; negotiated
    /// per-connection choices such as `ts`, `sack_ok`, `wscale_ok` are fields here).
    cfg: Arc<TcpConfig>,
    rcvq_len: usize,
    last_send: Instant,
    last_rcv: Instant,
    ts: Option<TsState>,
    /// RFC 6582 `recover`: SND.MAX when loss recovery started; `Some` while recovering.
    recovery: Option<SeqNum>,
    /// A retransmission that must go out at the next opportunity (fast retransmit, partial ACK).
    rexmit_now: Option<SeqNum>,
    /// Sequence number of the peer's FIN, once seen (it may arrive out of order).
    fin_seq: Option<SeqNum>,
    /// Send a RST for (seq) at the next poll (abort).
    rst_pending: Option<SeqNum>,
    /// The segment being timed for an RTT sample: (end sequence, send time). Karn: cleared on
    /// any retransmission.
    rtt_probe: Option<(SeqNum, Instant)>,
    // Send and receive sequence space (RFC 9293 §3.3.1).
    snd_una: SeqNum,
    snd_nxt: SeqNum,
    /// Highest sequence number sent plus one (SND.MAX): SND.NXT rewinds on RTO, this doesn't.
    snd_max: SeqNum,
    snd_wnd: u32,
    max_snd_wnd: u32,
    snd_wl1: SeqNum,
    snd_wl2: SeqNum,
    /// Largest payload per segment before options are subtracted.
    snd_mss: u32,
    rcv_nxt: SeqNum,
    /// Right edge of the last window we advertised; it never moves left (RFC 9293 §3.8.6.2.2).
    rcv_adv: SeqNum,
    dupacks: u32,
    /// Duplicate ACKs owed for out-of-order segments received since the last poll: the
    /// stack processes a burst before polling, and coalescing them into one ACK would hide
    /// the loss from the sender's duplicate-ACK counter. Paid by pure ACKs only, sent
    /// before any data (a data segment is no duplicate ACK, RFC 5681 §2).
    dupacks_owed: u32,
    /// Sequence number our last ACK carried (RFC 7323 Last.ACK.sent).
    last_ack_sent: SeqNum,
    tuple: FourTuple,
    /// Window announced by the peer in the last ACK (RFC 5681 §2 duplicate-ACK definition).
    last_wnd_field: u16,
    state: State,
    /// The peer's window-scale shift, applied to windows it advertises.
    snd_wscale: u8,
    /// Our window-scale shift (0 unless both sides agreed).
    rcv_wscale: u8,
    ack_now: bool,
    /// The application shut down its sending side: a FIN follows the queued data.
    fin_queued: bool,
    /// The peer's FIN has been consumed in sequence.
    fin_rcvd: bool,
    /// The application released its handle: nobody reads or writes any more.
    orphaned: bool,
    sack_ok: bool,
    /// A segment was refused for receive memory ([`WndNoMem`]): the next ACK advertises
    /// a zero window, and the application's next read announces the real one.
    wnd_nomem: WndNoMem,
    /// A keepalive probe is due at the next poll.
    send_keepalive: bool,
    /// A zero-window probe is due at the next poll.
    send_window_probe: bool,
    /// The persist timer fired while sender SWS avoidance held data back with nothing in
    /// flight and a small window open: the next data segment may fill that window (RFC 9293
    /// §3.8.6.2.1, the override timeout).
    sws_override: bool,
    events: Events,
    /// Every deadline of the connection (retransmission, persist, delayed ACK, TIME-WAIT,
    /// an orphan's FIN-WAIT-2, keepalive): the one table `poll_timeout` reads.
    timers: TimerTable,

    // The per-segment counters come first in `ConnCounters` (`#[repr(C)]`).
    /// Counters for this connection.
    pub counters: ConnCounters,

    // Queues and the per-ACK state of loss recovery and congestion control, each hot part
    // line-aligned (checked by `hot_fields_share_the_first_cache_lines`): the counters end at
    // byte 520 (their cold tail, the drop reasons, reaches 8 bytes into the next line); the
    // receive queue, its memory and 16 cold bytes fill that line, the assembler's hot 48
    // bytes start the one after, and 8 cold bytes after the assembler align the send queue
    // and the scoreboard.
    rcvq: VecDeque<Zbuf>,
    /// The memory behind `rcvq` (each buffer's [`Payload::truesize`]): with the
    /// out-of-order queue's, bounded by [`Connection::rcv_mem_limit`].
    rcvq_mem: usize,
    /// NewReno's inflated window while recovering without SACK (RFC 6582 §3.2).
    inflation: RecoveryInflation,
    /// RFC 6582 `recover` of the previous recovery, to avoid entering twice for one window;
    /// once SND.UNA passes it, it follows SND.UNA (compared modulo 2^32, it must not fall
    /// 2^31 behind).
    last_recover: SeqNum,
    /// The truesize of the data delivered, as it arrived (before any collapse), modulo
    /// 2^32: with `counters.bytes_in`, the payload/truesize ratio of what arrives
    /// (`sample_rcv_ratio`). In the cold bytes of the receive queue's line: each
    /// delivery adds to it (header prediction once per segment or run).
    rcv_true_in: u32,
    ooo: Assembler<Zbuf>,
    retries: u32,
    keepalive: Keepalive,
    sndq: SendQueue,
    sb: Scoreboard,

    // Cold, 32 bytes: they fill the scoreboard's last line so that the RTT estimator (two
    // lines, nearly every field touched by each RTT sample) and the congestion controller
    // each start a line.
    /// When we last answered an unacceptable segment without data (rate limit).
    oow_ack_at: Option<Instant>,
    /// RFC 5961 §7 rate limit: (window start, challenge ACKs in this window).
    challenge: (Instant, u32),

    rtt: RttEstimator,
    cc: Cc,

    // The tail's per-ACK fields, together from the line the congestion controller
    // ends in (checked by `hot_fields_share_the_first_cache_lines`): the undo episode
    // (`active` is read by every ACK), what every new ACK clears, the probe state
    // (every send arms the PTO) and the receive-memory fast compare (every segment): 96
    // bytes, the congestion controller's last 32 and the next line.
    // Scattered over three lines, they cost 5,000 connections one more cache miss per
    // RPC on each side than together in two (`conn-cache-proxy.sh`).
    /// D-SACK detection of a spurious recovery (RFC 3708).
    undo: UndoEpisode,
    /// New data sent by limited transmit since the first duplicate ACK: RFC 5681 §3.2 step
    /// 2 leaves it out of the FlightSize that sets ssthresh.
    lt_bytes: u32,
    /// The last ICMP soft error quoting data in flight, until forward progress
    /// ([`Connection::soft_error`]).
    icmp_soft: Option<Icmpv4DstUnreachable>,
    /// The probe timeout fired: a loss probe is due at the next poll.
    send_tlp: bool,
    /// Doublings of the probe timeout after needless probes (`tlp.rs`).
    tlp_backoff: u8,
    /// Zero-window probing (RFC 9293 §3.8.6.1): backoff exponent of the persist timer.
    persist_backoff: u32,
    /// The outstanding tail loss probe (RFC 8985 §7), if any.
    tlp: Option<TlpEpisode>,
    /// While the receive queue's memory is below this, the memory left holds a whole
    /// `rcv_buf` at `rcv_ratio` and the window is the byte window alone (one compare
    /// where the right edge may move); from it on `rcv_wnd_mem` computes it. Recomputed
    /// there; 0 (always compute) while the stack-wide bound may limit the window or
    /// out-of-order data is held (not in the compare).
    rcv_mem_easy: usize,
    // Cold: the handshake, loss-recovery episodes and the receive-memory slow path.
    passive: bool,
    /// The SYN (or SYN-ACK) was retransmitted: RFC 6298 §5.7 applies once established.
    syn_retransmitted: bool,
    /// Window scaling was negotiated (read at the handshake only: it sits in padding
    /// here, leaving its hot byte to `wnd_nomem`).
    wscale_ok: bool,
    // ISS and IRS (RFC 9293 §3.3.1), read at the handshake: here rather than after the
    // receive queue, whose line they shared until the counters grew by a drop reason.
    iss: SeqNum,
    irs: SeqNum,
    /// The largest segment payload received while delaying ACKs (at least RFC 9293's
    /// default MSS, 536): the peer's full-sized segment (§3.8.6.3), its MSS less the options
    /// it sends.
    rcv_mss: u32,
    close_reason: Option<CloseReason>,
    /// SND.MAX when a D-SACK last widened the reordering window (§6.2 `RACK.dsack_round`):
    /// until SND.UNA passes it, further D-SACKs are of the same round and widen nothing.
    dsack_round: Option<SeqNum>,
    /// RACK's reordering window in quarters of the minimum RTT (RFC 8985 §6.2
    /// `RACK.reo_wnd_mult`): one, grown by D-SACKs.
    reo_mult: u8,
    /// Recoveries before `reo_mult` falls back to one (§6.2 `RACK.reo_wnd_persist`).
    reo_persist: u8,
    /// Payload bytes per byte of truesize of the data that arrives, in 1/2^16
    /// (`RCV_RATIO_ONE`): Linux's `scaling_ratio`. It turns receive memory left into the
    /// window it can hold (`rcv_wnd_mem`). Starts at 2/3, a full-sized segment in a
    /// 2 KiB receive buffer (Linux starts at 1/2 against a buffer sized for it; against
    /// luna's bound, twice `rcv_buf`, 1/2 would shrink the window by half of anything held
    /// before the first sample).
    rcv_ratio: u32,
    /// `counters.bytes_in` and `rcv_true_in` when `rcv_ratio` was last sampled.
    rcv_sample: (u64, u32),
    /// The stack-wide room (below the reserve, see `rcv_reserve`) and this connection's
    /// [`recv_mem`](Connection::recv_mem) before the last segment that recorded them, and
    /// RCV.NXT after it: what they let this connection hold (`rcv_mem_cap`) changes only
    /// with the other connections (and once with its application's first read). The full
    /// path records them for every segment, header prediction only when the free room is
    /// below the connection's own bound (`note_rcv_room`); valid while RCV.NXT has not
    /// moved since, else the bound is taken as not limiting.
    rcv_room: (isize, usize, SeqNum),
    /// The part of the stack-wide bound kept for connections under their floor whose
    /// application reads (`StackConfig::rcv_mem_reserve`): the room passed with a segment
    /// is what is left below it (see [`on_segment_path`](Connection::on_segment_path)).
    /// Set when the connection joins a stack; 0 (no reserve) on its own.
    rcv_reserve: usize,
}

/// A soft error condition (RFC 9293 §3.9.1.8 MUST-47): the connection goes on, but the
/// application may want to know of the delivery problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SoftError {
    /// An ICMP destination unreachable that does not abort (net, host, source route
    /// failed, prohibited...; RFC 9293 §3.9.2.2 SHLD-25) quoted data in flight.
    Unreachable(Icmpv4DstUnreachable),
    /// The same data went unacknowledged through this many timeouts in a row, at least
    /// [`Connection::R1`] (RFC 9293 §3.8.3 SHLD-9); R2 is `max_retries`.
    Retransmitting(u32),
}

impl core::fmt::Debug for Connection {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Connection")
            .field("tuple", &self.tuple)
            .field("state", &self.state)
            .field("snd_una", &self.snd_una)
            .field("snd_nxt", &self.snd_nxt)
            .field("snd_max", &self.snd_max)
            .field("snd_wnd", &self.snd_wnd)
            .field("rcv_nxt", &self.rcv_nxt)
            .field("cwnd", &self.cc.cwnd())
            .finish_non_exhaustive()
    }
}

/// The options of an incoming SYN a passive connection is created from.
#[derive(Debug, Clone, Copy)]
pub struct SynInfo {
    /// The peer's ISN.
    pub seq: SeqNum,
    /// The peer's window field (unscaled; SYN windows are never scaled).
    pub window: u16,
    /// The peer's options.
    pub options: TcpOptions,
}

impl Connection {
    fn blank(
        now: Instant,
        tuple: FourTuple,
        mut cfg: Arc<TcpConfig>,
        iss: SeqNum,
        ts_offset: u32,
    ) -> Self {
        // Invalid RTT settings fall back to the defaults; `TcpConfig::validate` reports them
        // to whoever built the config. The estimator reads the (shared) config's RTT
        // settings on every call, so such a connection gets a config of its own with the
        // default ones (the stack validates its config: only direct callers get here).
        let rtt = match RttEstimator::new(&cfg.rtt) {
            Ok(rtt) => rtt,
            Err(_) => {
                Arc::make_mut(&mut cfg).rtt = RttConfig::default();
                RttEstimator::default()
            }
        };
        let mss = u32::from(cfg.mss);
        let cc = Cc::new(cfg.cc, cfg.cc_config, mss);
        // RFC 9293 §3.10.7.4: in-window segments SHOULD be held. The segment bound must cover
        // the window we advertise, or a loss makes us drop (or renege on) in-window data the
        // peer then resends: allow two segments per MSS of receive buffer, at least
        // `max_ooo_segments` (found by the kernel interop run: 256 against a 1 MiB window).
        let window_segments = 2 * (cfg.rcv_buf as usize) / usize::from(cfg.mss.max(1));
        let ooo_cfg = AssemblerConfig {
            max_bytes: (cfg.rcv_buf as usize).max(1),
            max_segments: cfg.max_ooo_segments.max(window_segments).clamp(1, 1 << 16),
        };
        let ooo = Assembler::new(ooo_cfg).unwrap_or_else(|_| {
            Assembler::new(AssemblerConfig::default()).expect("default assembler config is valid")
        });
        let ts = cfg.timestamps.then_some(TsState {
            recent: 0,
            recent_at: now,
            offset: ts_offset,
        });
        Connection {
            tuple,
            state: State::Closed,
            passive: false,
            iss,
            snd_una: iss,
            snd_nxt: iss,
            snd_max: iss,
            snd_wnd: 0,
            max_snd_wnd: 0,
            snd_wl1: SeqNum(0),
            snd_wl2: SeqNum(0),
            snd_wscale: 0,
            snd_mss: DEFAULT_PEER_MSS.min(mss),
            sndq: SendQueue::new(iss + 1u32),
            fin_queued: false,
            irs: SeqNum(0),
            rcv_nxt: SeqNum(0),
            rcv_wscale: 0,
            rcv_adv: SeqNum(0),
            rcvq: VecDeque::new(),
            rcvq_len: 0,
            rcvq_mem: 0,
            ooo,
            fin_seq: None,
            fin_rcvd: false,
            rtt,
            cc,
            sb: Scoreboard::with_defaults(iss + 1u32, DEFAULT_PEER_MSS),
            dupacks: 0,
            recovery: None,
            last_recover: iss,
            inflation: RecoveryInflation::default(),
            undo: UndoEpisode::new(),
            tlp: None,
            send_tlp: false,
            reo_mult: 1,
            reo_persist: 0,
            dsack_round: None,
            tlp_backoff: 0,
            icmp_soft: None,
            rcv_true_in: 0,
            rcv_ratio: RCV_RATIO_ONE / 3 * 2,
            rcv_sample: (0, 0),
            rcv_mem_easy: 0,
            rcv_room: (isize::MAX, 0, SeqNum(0)),
            rcv_reserve: 0,
            rexmit_now: None,
            syn_retransmitted: false,
            rcv_mss: DEFAULT_PEER_MSS.min(mss),
            lt_bytes: 0,
            rtt_probe: None,
            timers: TimerTable::default(),
            persist_backoff: 0,
            retries: 0,
            last_send: now,
            last_rcv: now,
            last_wnd_field: 0,
            ack_now: false,
            wnd_nomem: WndNoMem::No,
            dupacks_owed: 0,
            last_ack_sent: SeqNum(0),
            ts,
            sack_ok: cfg.sack,
            challenge: (now, 0),
            oow_ack_at: None,
            keepalive: Keepalive::default(),
            send_keepalive: false,
            send_window_probe: false,
            sws_override: false,
            wscale_ok: false,
            orphaned: false,
            rst_pending: None,
            close_reason: None,
            events: Events::default(),
            counters: ConnCounters::default(),
            cfg,
        }
    }

    /// Active open (RFC 9293 §3.10.1): the SYN goes out at the next `poll_segment`.
    /// `iss` comes from the stack's RFC 6528 generator, `ts_offset` from its RNG.
    pub fn connect(
        now: Instant,
        tuple: FourTuple,
        cfg: impl Into<Arc<TcpConfig>>,
        iss: SeqNum,
        ts_offset: u32,
    ) -> Self {
        let mut c = Connection::blank(now, tuple, cfg.into(), iss, ts_offset);
        c.rcv_wscale = c.cfg.rcv_wscale();
        c.state = State::SynSent;
        c
    }

    /// Passive open from a SYN that matched a listener (RFC 9293 §3.10.7.2): the connection
    /// is in SYN-RECEIVED and the SYN-ACK goes out at the next `poll_segment`.
    pub fn accept_syn(
        now: Instant,
        tuple: FourTuple,
        cfg: impl Into<Arc<TcpConfig>>,
        iss: SeqNum,
        ts_offset: u32,
        syn: &SynInfo,
    ) -> Self {
        let mut c = Connection::blank(now, tuple, cfg.into(), iss, ts_offset);
        c.passive = true;
        c.state = State::SynReceived;
        c.irs = syn.seq;
        c.rcv_nxt = syn.seq + 1u32;
        c.last_ack_sent = c.rcv_nxt;
        c.rcv_adv = c.rcv_nxt;
        c.negotiate(&syn.options);
        // RFC 7323 §2.2: the window in a SYN is never scaled.
        c.snd_wnd = u32::from(syn.window);
        c.max_snd_wnd = c.snd_wnd;
        c.snd_wl1 = syn.seq;
        c.snd_wl2 = iss;
        c.update_ts_recent(now, &syn.options, syn.seq);
        c
    }

    /// A connection re-created from a valid SYN cookie (the handshake's final ACK): it starts
    /// ESTABLISHED with what the cookie encoded. The caller then feeds the ACK segment itself
    /// through `on_segment` so its data and window are processed.
    #[allow(clippy::too_many_arguments)]
    pub fn from_cookie(
        now: Instant,
        tuple: FourTuple,
        cfg: impl Into<Arc<TcpConfig>>,
        iss: SeqNum,
        irs: SeqNum,
        ts_offset: u32,
        peer_options: &TcpOptions,
    ) -> Self {
        let syn = SynInfo {
            seq: irs,
            window: 0,
            options: *peer_options,
        };
        let mut c = Connection::accept_syn(now, tuple, cfg, iss, ts_offset, &syn);
        c.snd_nxt = iss + 1u32;
        c.snd_max = c.snd_nxt;
        c.last_recover = c.snd_nxt;
        // The stack's cookie SYN-ACK offered min(rcv_buf, 65535), unscaled (RFC 7323 §2.2):
        // that is the window the peer may fill before our first ACK, and the right edge that
        // must not move left (RFC 9293 §3.8.6.2.2).
        c.rcv_adv = c.rcv_nxt + c.cfg.rcv_buf.min(u32::from(u16::MAX));
        c.state = State::SynReceived;
        c
    }

    /// Apply the options of the peer's SYN (or SYN-ACK) and what we offered.
    fn negotiate(&mut self, opts: &TcpOptions) {
        // RFC 6691 / RFC 9293 §3.7.1: send no more than the peer's MSS; 536 if absent.
        let peer_mss = opts
            .mss
            .map_or(DEFAULT_PEER_MSS, u32::from)
            .max(MIN_SND_MSS);
        self.snd_mss = peer_mss.min(u32::from(self.cfg.mss));
        self.cc.set_mss(self.snd_mss);
        self.sb.set_mss(self.snd_mss);
        // RFC 7323 §2.2: scaling is on only when both SYNs carry the option.
        match (self.cfg.window_scaling, opts.window_scale) {
            (true, Some(shift)) => {
                // RFC 7323 §2.3: a shift above 14 is treated as 14.
                self.snd_wscale = shift.min(14);
                self.rcv_wscale = self.cfg.rcv_wscale();
                self.wscale_ok = true;
            }
            _ => {
                self.snd_wscale = 0;
                self.rcv_wscale = 0;
                self.wscale_ok = false;
            }
        }
        // RFC 2018 §2: SACK only if both sides sent SACK-permitted.
        self.sack_ok = self.cfg.sack && opts.sack_permitted;
        // RFC 7323 §3.2: timestamps only if both SYNs carried them.
        if opts.timestamps.is_none() {
            self.ts = None;
        }
    }

    /// The connection's endpoints.
    pub fn tuple(&self) -> FourTuple {
        self.tuple
    }

    /// RCV.NXT: the next sequence number expected from the peer.
    pub fn rcv_nxt(&self) -> SeqNum {
        self.rcv_nxt
    }

    /// SND.UNA: the oldest unacknowledged sequence number.
    pub fn snd_una(&self) -> SeqNum {
        self.snd_una
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Why the connection closed, once it has.
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.close_reason
    }

    /// Whether the connection was created by a listener.
    pub fn is_passive(&self) -> bool {
        self.passive
    }

    /// Current congestion window in bytes.
    pub fn cwnd(&self) -> u32 {
        self.cc.cwnd()
    }

    /// Current slow-start threshold in bytes.
    pub fn ssthresh(&self) -> u32 {
        self.cc.ssthresh()
    }

    /// The RTT estimator (SRTT, RTTVAR, RTO).
    pub fn rtt(&self) -> &RttEstimator {
        &self.rtt
    }

    /// The current RTO (the estimator's cached value; debug builds check it against the
    /// computation from the shared config).
    #[inline]
    fn rto(&self) -> Duration {
        debug_assert_eq!(
            self.rtt.rto(),
            self.rtt.computed_rto(&self.cfg.rtt),
            "stale cached RTO"
        );
        self.rtt.rto()
    }

    /// Effective send MSS negotiated with the peer.
    pub fn mss(&self) -> u32 {
        self.snd_mss
    }

    /// The peer's window in bytes (scaled).
    pub fn send_window(&self) -> u32 {
        self.snd_wnd
    }

    /// Whether loss recovery is in progress.
    pub fn in_recovery(&self) -> bool {
        self.recovery.is_some()
    }

    /// Bytes sent and not yet acknowledged.
    pub fn bytes_in_flight(&self) -> u32 {
        self.snd_nxt - self.snd_una
    }

    /// RFC 9293 §3.10.7.4 (TIME-WAIT) with RFC 6191: whether `seg` is a SYN that may reopen
    /// this TIME-WAIT connection as a new incarnation. Anything else (a SYN this refuses
    /// included) goes through `on_segment`, where a SYN gets a challenge ACK (RFC 5961 §4.2).
    pub fn accepts_new_syn(&self, seg: &TcpRepr) -> bool {
        let f = seg.flags;
        // RFC 9293 §3.10.7.4: only a plain SYN opens a connection; a SYN+FIN (or with ACK or
        // RST) never reopens one.
        if self.state != State::TimeWait || !f.syn() || f.ack() || f.rst() || f.fin() {
            return false;
        }
        match (self.ts, seg.options.timestamps) {
            // RFC 6191 §2: with timestamps on both sides, the SYN is new iff its TSval is
            // newer than TS.Recent (an equal or older one is an old duplicate).
            (Some(ts), Some(t)) => (t.tsval.wrapping_sub(ts.recent) as i32) > 0,
            // RFC 6191 §2 falls back to RFC 1122 §4.2.2.13 (reopen if SEG.SEQ > RCV.NXT) when
            // timestamps cannot decide; that is opt-in (`time_wait_reopen_by_seq`), since a
            // delayed old SYN can pass it.
            _ => self.cfg.time_wait_reopen_by_seq && seg.seq.gt(self.rcv_nxt),
        }
    }

    /// RFC 1191 §6.3 / RFC 5927 §4.1: an ICMP "fragmentation needed" quoting sequence number
    /// `seq` lowers the MSS to fit `mtu`, if `seq` is in flight. Returns whether it applied.
    pub fn on_path_mtu(&mut self, seq: SeqNum, mtu: u16) -> bool {
        if !seq.ge(self.snd_una) || !seq.lt(self.snd_max) {
            return false;
        }
        // 68 is the IPv4 minimum MTU (RFC 791); below it the message is bogus.
        if mtu < 68 {
            return false;
        }
        let new_mss = (u32::from(mtu).saturating_sub(40)).max(MIN_SND_MSS);
        if new_mss >= self.snd_mss {
            return false;
        }
        self.snd_mss = new_mss;
        self.cc.set_mss(new_mss);
        self.sb.set_mss(new_mss);
        // Resend what is in flight at the new size (RFC 1191 §6.3: retransmit promptly).
        self.snd_nxt = self.snd_una;
        true
    }

    /// An ICMP hard error (destination unreachable: protocol or port, RFC 1122 §4.2.3.9)
    /// quoting sequence number `seq`. In SYN-SENT a quote of our SYN (RFC 5927 §4.1: a
    /// sequence number in flight, here the ISS a blind attacker would have to guess) aborts
    /// the attempt: nothing listens there (Linux and the BSDs report ECONNREFUSED). A
    /// passive SYN-RECEIVED connection quoted in the same way (our SYN-ACK) is dropped:
    /// the peer that sent the SYN is unreachable, and its half-open slot is freed at once
    /// instead of after the SYN-ACK retries (Linux's `tcp_req_err`; the stack removes it
    /// silently, as for a RST there). In every other state hard errors are treated as soft
    /// (RFC 5927 §5.2, as Linux and the BSDs do: acting on them would let a blind attacker
    /// reset connections). Returns whether the connection was aborted.
    pub fn on_icmp_hard_error(&mut self, seq: SeqNum) -> bool {
        let embryonic = self.state == State::SynReceived && self.passive;
        if !(self.state == State::SynSent || embryonic)
            || !seq.ge(self.snd_una)
            || !seq.lt(self.snd_max)
        {
            return false;
        }
        self.terminate(CloseReason::Refused);
        true
    }

    /// Whether SACK, timestamps and window scaling were negotiated.
    pub fn negotiated(&self) -> (bool, bool, Option<(u8, u8)>) {
        let ws = self.wscale_ok.then_some((self.snd_wscale, self.rcv_wscale));
        (self.sack_ok, self.ts.is_some(), ws)
    }

    /// Take the events accumulated since the last call.
    pub fn take_events(&mut self) -> Events {
        core::mem::take(&mut self.events)
    }

    /// RFC 9293 §3.8.3 R1: timeouts in a row after which the delivery problem is reported
    /// ([`SoftError::Retransmitting`]); SHLD-10 asks for at least 3.
    pub const R1: u32 = 3;

    /// The soft error the connection has now, if any (RFC 9293 §3.9.1.8 MUST-47): R1 or
    /// more timeouts in a row, else the last ICMP soft error quoting data in flight. Both
    /// clear when the peer acknowledges new data.
    pub fn soft_error(&self) -> Option<SoftError> {
        if self.retries >= Self::R1 && self.state != State::Closed {
            return Some(SoftError::Retransmitting(self.retries));
        }
        self.icmp_soft.map(SoftError::Unreachable)
    }

    /// An ICMP destination unreachable that does not abort (RFC 9293 §3.9.2.2: MUST-56)
    /// quoting sequence number `seq`: recorded for [`soft_error`](Self::soft_error) when
    /// `seq` is in flight (RFC 5927 §4.1). Returns whether it was.
    pub fn on_icmp_soft_error(&mut self, seq: SeqNum, code: Icmpv4DstUnreachable) -> bool {
        if self.state == State::Closed || !seq.ge(self.snd_una) || !seq.lt(self.snd_max) {
            return false;
        }
        self.icmp_soft = Some(code);
        true
    }

    /// The next hop's link-layer address could not be resolved: ARP got no answer for
    /// `NeighbourConfig::incomplete_time` (RFC 1122 §2.3.2.1). A connection attempt
    /// (SYN-SENT) ends with [`CloseReason::HostUnreachable`]; any other connection records
    /// it as a soft error, as for an ICMP host unreachable (RFC 9293 §3.9.1.8 SHLD-25), and
    /// goes on. The RFCs' rule that unreachable destinations are soft errors (RFC 1122
    /// §4.2.3.9, RFC 9293 MUST-56) is written for ICMP reports from the network; this is
    /// the host's own link layer giving up, and a handshake that cannot leave the host
    /// would otherwise retry its SYN for R2 (three minutes). Linux ends such a `connect`
    /// with `EHOSTUNREACH` after the same three seconds. Returns whether it was aborted.
    pub fn on_neighbour_unreachable(&mut self) -> bool {
        match self.state {
            State::SynSent => {
                self.terminate(CloseReason::HostUnreachable);
                true
            }
            State::Closed => false,
            _ => {
                self.icmp_soft = Some(Icmpv4DstUnreachable::HostUnreachable);
                false
            }
        }
    }

    /// Set R2 for this connection alone: data retransmissions (RTO expiries in a row)
    /// before it is aborted (RFC 9293 §3.8.3 MUST-21). The connection's settings become its
    /// own copy; the stack's other connections keep `TcpConfig::max_retries`.
    pub fn set_max_retries(&mut self, retries: u32) {
        if self.cfg.max_retries != retries {
            Arc::make_mut(&mut self.cfg).max_retries = retries;
        }
    }

    /// Turn Nagle's algorithm on or off for this connection alone (RFC 9293 §3.7.4
    /// MUST-17); the stack's other connections keep `TcpConfig::nagle`.
    pub fn set_nagle(&mut self, on: bool) {
        if self.cfg.nagle != on {
            Arc::make_mut(&mut self.cfg).nagle = on;
        }
    }

    /// The application released its handle (the stack calls this on close and abort). The
    /// states that wait on the peer without bound then get one: FIN-WAIT-2 ends after
    /// `fin_timeout`, and zero-window probing counts toward `max_retries` even when answered.
    pub fn set_orphaned(&mut self) {
        self.orphaned = true;
    }

    /// Whether the application released its handle.
    pub fn is_orphaned(&self) -> bool {
        self.orphaned
    }

    /// Whether the connection can be reclaimed by the stack.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed && self.rst_pending.is_none()
    }

    // ---------------------------------------------------------------------------------------
    // Application calls
    // ---------------------------------------------------------------------------------------

    /// Free send-buffer space in bytes.
    pub fn send_capacity(&self) -> usize {
        (self.cfg.snd_buf as usize).saturating_sub(self.sndq.len())
    }

    /// Queue `data` for sending without copying it (the queue keeps a reference until the
    /// peer acknowledges it). Accepts as much as the send buffer has room for and returns the
    /// number of bytes taken; a prefix is taken by slicing, never by copying.
    pub fn send(&mut self, data: &Zbuf) -> Result<usize, SendError> {
        let n = self.send_room(data.len())?;
        if n == data.len() {
            self.sndq.push(data.clone());
        } else {
            self.sndq.push(data.slice(0..n));
        }
        Ok(n)
    }

    /// [`send`](Self::send) of a buffer the caller gives away: the queue keeps `data`
    /// itself (or its first part, cut off it) instead of a new reference to it, so no
    /// reference is taken and dropped. Returns the bytes taken and the part of `data` not
    /// taken (`None` when all of it was); on an error `data` comes back whole with it.
    pub fn send_owned(
        &mut self,
        mut data: Zbuf,
    ) -> Result<(usize, Option<Zbuf>), (SendError, Zbuf)> {
        let n = match self.send_room(data.len()) {
            Ok(n) => n,
            Err(e) => return Err((e, data)),
        };
        if n == data.len() {
            self.sndq.push(data);
            return Ok((n, None));
        }
        self.sndq.push(data.split_to(n));
        Ok((n, Some(data)))
    }

    /// How many of `len` bytes [`send`](Self::send) takes now (0 for none offered), or why
    /// it takes none.
    #[inline]
    fn send_room(&self, len: usize) -> Result<usize, SendError> {
        match self.state {
            State::SynSent | State::SynReceived | State::Established | State::CloseWait => {}
            State::Closed => return Err(SendError::Closed),
            _ => return Err(SendError::Shutdown),
        }
        if self.fin_queued {
            return Err(SendError::Shutdown);
        }
        if len == 0 {
            return Ok(0);
        }
        let room = self.send_capacity();
        if room == 0 {
            return Err(SendError::WouldBlock);
        }
        Ok(room.min(len))
    }

    /// Queue every segment of an io-vector that fits; returns bytes taken.
    pub fn send_iovec(&mut self, data: &IoVec) -> Result<usize, SendError> {
        let mut total = 0;
        for seg in data.segments() {
            match self.send(seg) {
                Ok(n) => {
                    total += n;
                    if n < seg.len() {
                        break;
                    }
                }
                Err(SendError::WouldBlock) if total > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(total)
    }

    /// Bytes in the send queue: sent and unacknowledged, plus not yet sent.
    pub fn send_queued(&self) -> usize {
        self.sndq.len()
    }

    /// Bytes ready to read.
    pub fn recv_available(&self) -> usize {
        self.rcvq_len
    }

    /// Whether [`recv`](Self::recv) would return something now — data, the end of the
    /// stream or the error that closed the connection — rather than `Ok(None)`.
    pub fn recv_ready(&self) -> bool {
        self.rcvq_len > 0 || !matches!(self.stream_status(), Ok(None))
    }

    /// Payload bytes that arrived again: below RCV.NXT or over data already held out of
    /// order. The first copy is kept and these bytes discarded, whatever they contain
    /// (RFC 9293 §3.10.7.4: only new data is taken; an overlap attack's different bytes
    /// land here). Kept by the out-of-order queue, not in [`ConnCounters`], whose layout
    /// is fixed for the hot cache lines.
    pub fn dup_bytes_in(&self) -> u64 {
        self.ooo.stats().duplicate_bytes
    }

    /// Bytes held out of order (received beyond RCV.NXT, waiting for the gap to fill).
    pub fn ooo_bytes(&self) -> usize {
        self.ooo.len_bytes()
    }

    /// The memory behind the received data held, in order and out of order: each
    /// buffer's whole object (a slice of one byte keeps a 2 KiB receive buffer alive) plus
    /// its metadata (Linux's truesize). At most [`Connection::rcv_mem_limit`] plus one
    /// buffer.
    pub fn recv_mem(&self) -> usize {
        self.rcvq_mem + self.ooo.mem()
    }

    /// The receive queue's part of [`Connection::recv_mem`] (the stack accounts the two
    /// parts apart: reads and header-predicted segments change only this one).
    #[inline(always)]
    pub(crate) fn rcvq_mem(&self) -> usize {
        self.rcvq_mem
    }

    /// The out-of-order queue's part of [`Connection::recv_mem`].
    pub(crate) fn ooo_mem(&self) -> usize {
        self.ooo.mem()
    }

    /// The bound on [`Connection::recv_mem`]: twice `TcpConfig::rcv_buf`, as Linux sizes
    /// its receive buffer (rcvbuf) twice the window it offers (`tcp_adv_win_scale` 1).
    /// Full-sized segments in 2 KiB buffers (truesize about 1.5 times their bytes) fill
    /// the window well within it; tiny ones reach it and are collapsed.
    #[inline(always)]
    pub fn rcv_mem_limit(&self) -> usize {
        2 * self.cfg.rcv_buf as usize
    }

    /// Take the next in-order chunk of received payload (zero copy: the buffer the NIC wrote).
    /// `Ok(None)` means no data now; `Err(Finished)` means end of stream.
    #[inline]
    pub fn recv(&mut self) -> Result<Option<Zbuf>, RecvError> {
        match self.recv_chunk() {
            Some((buf, _)) => Ok(Some(buf)),
            None => self.stream_status(),
        }
    }

    /// [`recv`](Self::recv) when data is queued: the next chunk and the receive memory
    /// ([`rcvq_mem`](Self::rcvq_mem)) it released; `None` when nothing is queued (then
    /// [`stream_status`](Self::stream_status) says why).
    #[inline]
    pub(crate) fn recv_chunk(&mut self) -> Option<(Zbuf, usize)> {
        let buf = self.rcvq.pop_front()?;
        let mem = buf.truesize();
        self.rcvq_len -= buf.len();
        self.rcvq_mem -= mem;
        self.on_app_read();
        Some((buf, mem))
    }

    /// What a read finds when no data is queued: end of stream, an error, or nothing yet.
    pub(crate) fn stream_status(&self) -> Result<Option<Zbuf>, RecvError> {
        if self.fin_rcvd {
            return Err(RecvError::Finished);
        }
        match self.close_reason {
            Some(CloseReason::Normal) => Err(RecvError::Finished),
            Some(_) => Err(RecvError::Closed),
            None => Ok(None),
        }
    }

    /// Take up to `max` bytes of in-order payload as an io-vector (zero copy).
    pub fn recv_iovec(&mut self, max: usize) -> Result<IoVec, RecvError> {
        let mut out = IoVec::new();
        let mut left = max;
        while left > 0 {
            let Some(front) = self.rcvq.front_mut() else {
                break;
            };
            if front.len() <= left {
                let buf = self.rcvq.pop_front().expect("front exists");
                left -= buf.len();
                self.rcvq_len -= buf.len();
                self.rcvq_mem -= buf.truesize();
                out.push(buf);
            } else {
                let head = front.split_to(left);
                self.rcvq_len -= head.len();
                out.push(head);
                left = 0;
            }
        }
        if out.is_empty() {
            // `max == 0` with data queued asks for nothing: the data stays queued.
            if !self.rcvq.is_empty() {
                return Ok(out);
            }
            return self.stream_status().map(|_| out);
        }
        self.on_app_read();
        Ok(out)
    }

    /// Receiver-side SWS avoidance (RFC 9293 §3.8.6.2.2): announce a larger window only when
    /// it grows by at least min(half the buffer, one MSS).
    fn on_app_read(&mut self) {
        if !self.state.is_synchronized() || self.fin_rcvd {
            return;
        }
        if self.wnd_nomem != WndNoMem::No {
            // A zero window went out (or is about to) because memory ran out: what the
            // read freed opens it again at once, instead of at the peer's next probe.
            self.wnd_nomem = WndNoMem::No;
            self.ack_now = true;
            return;
        }
        if self.window_grew() {
            self.ack_now = true;
        }
    }

    /// Whether the window that can be offered now moves the right edge past RCV.ADV by
    /// the SWS threshold (RFC 9293 §3.8.6.2.2): memory was freed (a read, a collapse) and
    /// the peer should hear of it at once rather than at its next segment or timer.
    fn window_grew(&mut self) -> bool {
        let new_edge = self.rcv_nxt + self.rcv_wnd();
        if !new_edge.gt(self.rcv_adv)
            || new_edge - self.rcv_adv < (self.cfg.rcv_buf / 2).min(self.snd_mss)
        {
            return false;
        }
        // The byte window would move the edge: as far as memory lets it (see
        // `advertise_window`).
        if self.rcvq_mem >= self.rcv_mem_easy {
            let (wnd, threshold) = self.rcv_wnd_mem();
            let edge = self.rcv_nxt + wnd;
            return edge.gt(self.rcv_adv) && edge - self.rcv_adv >= threshold;
        }
        true
    }

    /// Shut down the sending side (RFC 9293 §3.10.4 CLOSE): a FIN follows queued data.
    pub fn close(&mut self) {
        match self.state {
            // RFC 9293 §3.10.4 (SYN-SENT): with nothing queued the TCB is deleted. Data the
            // application already handed over is not thrown away: like SYN-RECEIVED, the FIN
            // is queued for after the handshake, so send-then-close on a connecting socket
            // delivers everything.
            State::SynSent if self.sndq.len() == 0 => self.terminate(CloseReason::Normal),
            State::SynSent => self.fin_queued = true,
            // RFC 9293 §3.10.4 (SYN-RECEIVED): the FIN is queued until ESTABLISHED. (The RFC
            // lets a connection with nothing queued send it at once; waiting keeps the
            // SYN-ACK retransmittable by the RTO and costs at most one round trip.)
            State::SynReceived => self.fin_queued = true,
            State::Established => {
                self.fin_queued = true;
                self.state = State::FinWait1;
            }
            State::CloseWait => {
                self.fin_queued = true;
                self.state = State::LastAck;
            }
            _ => {}
        }
    }

    /// Abort (RFC 9293 §3.10.5): queued data is discarded, a RST is sent in synchronized states.
    pub fn abort(&mut self) {
        let send_rst = matches!(
            self.state,
            State::SynReceived
                | State::Established
                | State::FinWait1
                | State::FinWait2
                | State::CloseWait
        );
        if send_rst {
            self.rst_pending = Some(self.seq_for_control());
        }
        self.terminate(CloseReason::Aborted);
    }

    /// Abort without sending anything (the local address is gone: a RST from it would be
    /// spoofed). The close reason is [`CloseReason::Aborted`].
    pub fn abort_silently(&mut self) {
        self.rst_pending = None;
        self.terminate(CloseReason::Aborted);
    }

    fn terminate(&mut self, reason: CloseReason) {
        if self.state != State::Closed {
            self.state = State::Closed;
            self.close_reason.get_or_insert(reason);
            self.events.closed = true;
        }
        self.timers.clear(Timer::Rto);
        self.timers.clear(Timer::Persist);
        self.timers.clear(Timer::DelayedAck);
        self.timers.clear(Timer::TimeWait);
        self.timers.clear(Timer::FinWait2);
        self.ack_now = false;
        self.rexmit_now = None;
    }
}

/// A zero-window ACK for a segment refused for receive memory (Linux's `ICSK_ACK_NOMEM`,
/// since 6.5): the refused data is not acknowledged, and without a zero window its
/// sender would see only silence, back its retransmission timer off and give up after
/// R2 (`max_retries`) while the application simply had not read yet. A zero window turns
/// that into zero-window probing, which the answered probes keep alive (RFC 9293
/// §3.8.6.1), and the window reopens when the application reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WndNoMem {
    No,
    /// The next segment advertises a zero window.
    Pending,
    /// A zero window went out; the next read announces the real one.
    Sent,
}

mod input;
mod output;
#[cfg(test)]
pub(crate) use output::{PURE_ACK_FAST_PATH, PURE_ACK_HITS};
mod timers;
mod tlp;
mod undo;

#[cfg(test)]
use output::options_len;
use timers::{Timer, TimerTable};
use tlp::TlpEpisode;
use undo::UndoEpisode;

#[cfg(test)]
impl Connection {
    /// Every field of the connection (the fast-path counter left out) in one string: two
    /// connections with equal digests are in the same state. For the equivalence tests.
    pub(crate) fn digest(&self) -> String {
        let mut counters = self.counters.clone();
        counters.fast_path_hits = 0;
        let rcvq: Vec<(usize, u64)> = self
            .rcvq
            .iter()
            .map(|z| (z.len(), crate::wire::tcp::fnv1a(z)))
            .collect();
        let mut out = String::new();
        macro_rules! put {
            ($($f:expr),* $(,)?) => { $( out.push_str(&format!("{:?};", $f)); )* };
        }
        put!(
            self.tuple,
            self.state,
            self.passive,
            self.iss,
            self.snd_una,
            self.snd_nxt
        );
        put!(
            self.snd_max,
            self.snd_wnd,
            self.max_snd_wnd,
            self.snd_wl1,
            self.snd_wl2
        );
        put!(
            self.snd_wscale,
            self.snd_mss,
            self.sndq.digest(),
            self.fin_queued,
            self.irs
        );
        put!(
            self.rcv_nxt,
            self.rcv_wscale,
            self.rcv_adv,
            rcvq,
            self.rcvq_len,
            self.ooo.digest()
        );
        put!(
            self.fin_seq,
            self.fin_rcvd,
            self.rtt,
            self.cc,
            self.sb,
            self.dupacks
        );
        put!(
            self.recovery,
            self.last_recover,
            self.inflation,
            self.undo,
            self.rexmit_now
        );
        put!(self.syn_retransmitted, self.rtt_probe, self.timers);
        put!(
            self.persist_backoff,
            self.retries,
            self.last_send,
            self.last_rcv
        );
        put!(self.last_wnd_field, self.ack_now, self.dupacks_owed);
        put!(
            self.last_ack_sent,
            self.ts,
            self.sack_ok,
            self.challenge,
            self.oow_ack_at
        );
        put!(
            self.keepalive,
            self.send_keepalive,
            self.send_window_probe,
            self.sws_override,
            self.rcv_mss,
            self.lt_bytes,
            self.wscale_ok
        );
        // (`rcv_room` and `rcv_mem_easy` are left out: the full path records the room
        // for every segment, header prediction only under pressure, and the threshold is
        // a cache of the cold window computation.)
        put!(self.rcv_true_in, self.rcv_ratio, self.rcv_sample);
        put!(self.orphaned, self.rst_pending);
        put!(self.close_reason, self.events, counters);
        out
    }
}

#[cfg(test)]
#[path = "conn_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "fastpath_tests.rs"]
mod fastpath_tests;

#[cfg(test)]
#[path = "rcvmem_tests.rs"]
mod rcvmem_tests;
