//! One TCP connection: the transmission control block (RFC 9293 §3.3.1) and its state
//! machine (RFC 9293 §3.10), with loss recovery (RFC 5681, 6582, 6675), RTO (RFC 6298),
//! window scaling/timestamps/PAWS (RFC 7323), SACK (RFC 2018, 2883) and the RFC 5961
//! blind-attack defences.
//!
//! The connection is sans-IO: the stack feeds it parsed segments (`on_segment`), timer
//! expiries (`on_timeout`) and application calls, and pulls segments to send with
//! `poll_segment` until it returns `None`. Order per poll iteration: segments in, timers,
//! application calls, then `poll_segment` until exhausted.

use super::assembler::{Assembler, AssemblerConfig};
use super::cc::{Cc, CongestionControl, RecoveryInflation};
use super::config::TcpConfig;
use super::counters::{ConnCounters, DropReason};
use super::rtt::{RttEstimator, SampleSource};
use super::scoreboard::{NextSeg, Scoreboard};
use super::sendq::SendQueue;
use super::SeqNum;
use crate::time::{Duration, Instant};
use crate::wire::{SackBlocks, TcpFlags, TcpOptions, TcpRepr, Timestamps};
use core::net::SocketAddrV4;
use std::collections::VecDeque;
use zbuf::{IoVec, Zbuf};

/// RFC 9293 §3.7.1: without an MSS option the peer's MSS is 536.
pub const DEFAULT_PEER_MSS: u32 = 536;

/// Floor for the peer's MSS. A tiny or zero MSS would make us loop over zero-length or
/// one-byte segments (a bug class found in other stacks; CVE-2019-11479 is its resource
/// exhaustion variant). 88 leaves 48 payload bytes even with 40 bytes of options.
pub const MIN_SND_MSS: u32 = 88;

/// RFC 5681 §3.2: three duplicate ACKs trigger fast retransmit (RFC 6675 DupThresh).
const DUP_THRESH: u32 = 3;

/// Most disjoint retransmitted ranges one recovery episode tracks for D-SACK undo; beyond
/// it the episode is simply not undone (bounded memory, conservative).
const MAX_UNDO_RANGES: usize = 8;

/// RFC 3708 §3 bookkeeping of the latest SACK recovery episode: which retransmissions have
/// not yet been reported duplicate by a D-SACK. Kept after the recovery ends (the D-SACKs of
/// its last retransmissions arrive about an RTT later) until the next recovery or RTO.
#[derive(Debug, Clone, PartialEq, Eq)]
struct UndoEpisode {
    /// An episode is being watched.
    active: bool,
    /// SND.UNA at entry: the octet whose presumed loss started the recovery.
    hole: SeqNum,
    /// Retransmitted ranges no D-SACK has covered yet: disjoint, sorted, at most
    /// `MAX_UNDO_RANGES` (capacity reserved once per connection).
    pending: Vec<(SeqNum, SeqNum)>,
    /// Retransmissions sent in the episode.
    retransmissions: u32,
    /// The episode can no longer be proven spurious: some data was retransmitted twice (its
    /// first retransmission was deemed lost), or too many ranges.
    tainted: bool,
    /// How far beyond `hole` the peer had received data when `hole` was first cumulatively
    /// acknowledged (bytes): the reordering extent if the episode proves spurious.
    extent: Option<u32>,
    /// TSval of the episode's first retransmission (timestamps in use).
    rxt_tsval: Option<u32>,
    /// RFC 3522 (Eifel detection): the ACK that first covered `hole` echoed a TSval older than the
    /// first retransmission's, so the original transmission arrived.
    original_arrived: bool,
}

impl UndoEpisode {
    fn new() -> Self {
        UndoEpisode {
            active: false,
            hole: SeqNum(0),
            pending: Vec::with_capacity(MAX_UNDO_RANGES + 1),
            retransmissions: 0,
            tainted: false,
            extent: None,
            rxt_tsval: None,
            original_arrived: false,
        }
    }

    fn start(&mut self, hole: SeqNum) {
        self.active = true;
        self.hole = hole;
        self.pending.clear();
        self.retransmissions = 0;
        self.tainted = false;
        self.extent = None;
        self.rxt_tsval = None;
        self.original_arrived = false;
    }

    /// `[start, end)` was retransmitted.
    fn on_retransmit(&mut self, start: SeqNum, end: SeqNum) {
        if !self.active || !start.lt(end) {
            return;
        }
        self.retransmissions = self.retransmissions.saturating_add(1);
        if self.pending.iter().any(|&(a, b)| start.lt(b) && a.lt(end)) {
            // Sent again: the first retransmission was deemed lost, so was (likely) the data.
            self.tainted = true;
            return;
        }
        let at = self.pending.partition_point(|&(a, _)| a.lt(start));
        if at > 0 && self.pending[at - 1].1 == start {
            self.pending[at - 1].1 = end;
        } else if at < self.pending.len() && self.pending[at].0 == end {
            self.pending[at].0 = start;
        } else if self.pending.len() < MAX_UNDO_RANGES {
            self.pending.insert(at, (start, end));
        } else {
            self.tainted = true;
        }
    }

    /// RFC 2883 §4: the peer received `[l, r)` twice; forget it from the pending ranges.
    fn on_dsack(&mut self, l: SeqNum, r: SeqNum) {
        if !self.active || self.tainted {
            return;
        }
        let mut i = 0;
        while i < self.pending.len() {
            let (a, b) = self.pending[i];
            if !(l.lt(b) && a.lt(r)) {
                i += 1;
                continue;
            }
            match (a.lt(l), r.lt(b)) {
                (true, true) => {
                    if self.pending.len() >= MAX_UNDO_RANGES {
                        self.tainted = true;
                        return;
                    }
                    self.pending[i].1 = l;
                    self.pending.insert(i + 1, (r, b));
                    i += 2;
                }
                (true, false) => {
                    self.pending[i].1 = l;
                    i += 1;
                }
                (false, true) => {
                    self.pending[i].0 = r;
                    i += 1;
                }
                (false, false) => {
                    self.pending.remove(i);
                }
            }
        }
    }

    /// RFC 3708 §3: every retransmission of the episode was D-SACKed.
    fn all_dsacked(&self) -> bool {
        self.active
            && !self.tainted
            && self.retransmissions > 0
            && self.pending.is_empty()
            && self.original_arrived
    }
}

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
#[derive(Debug, Clone)]
pub struct OutSegment {
    /// The TCP header.
    pub repr: TcpRepr,
    /// The payload, as references into send-queue buffers.
    pub payload: IoVec,
}

/// Errors from [`Connection::send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// The send buffer is full; retry after a writable event.
    WouldBlock,
    /// The sending side was shut down.
    Shutdown,
    /// The connection is closed (see its close reason).
    Closed,
    /// The handle does not name a live connection.
    InvalidHandle,
}

/// Errors from [`Connection::recv`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvError {
    /// The peer closed its side and every byte has been read (end of stream).
    Finished,
    /// The connection is closed before the stream ended (reset, timeout, abort).
    Closed,
    /// The handle does not name a live connection.
    InvalidHandle,
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
    /// When the next probe is due.
    at: Option<Instant>,
    probes_sent: u32,
}

/// A TCP connection.
pub struct Connection {
    tuple: FourTuple,
    state: State,
    cfg: TcpConfig,
    passive: bool,

    // Send sequence space (RFC 9293 §3.3.1).
    iss: SeqNum,
    snd_una: SeqNum,
    snd_nxt: SeqNum,
    /// Highest sequence number sent plus one (SND.MAX): SND.NXT rewinds on RTO, this doesn't.
    snd_max: SeqNum,
    snd_wnd: u32,
    max_snd_wnd: u32,
    snd_wl1: SeqNum,
    snd_wl2: SeqNum,
    /// The peer's window-scale shift, applied to windows it advertises.
    snd_wscale: u8,
    /// Largest payload per segment before options are subtracted.
    snd_mss: u32,
    sndq: SendQueue,
    /// The application shut down its sending side: a FIN follows the queued data.
    fin_queued: bool,

    // Receive sequence space.
    irs: SeqNum,
    rcv_nxt: SeqNum,
    /// Our window-scale shift (0 unless both sides agreed).
    rcv_wscale: u8,
    /// Right edge of the last window we advertised; it never moves left (RFC 9293 §3.8.6.2.2).
    rcv_adv: SeqNum,
    rcvq: VecDeque<Zbuf>,
    rcvq_len: usize,
    ooo: Assembler<Zbuf>,
    /// Sequence number of the peer's FIN, once seen (it may arrive out of order).
    fin_seq: Option<SeqNum>,
    /// The peer's FIN has been consumed in sequence.
    fin_rcvd: bool,

    // Loss recovery and congestion control.
    rtt: RttEstimator,
    cc: Cc,
    sb: Scoreboard,
    dupacks: u32,
    /// RFC 6582 `recover`: SND.MAX when loss recovery started; `Some` while recovering.
    recovery: Option<SeqNum>,
    /// RFC 6582 `recover` of the previous recovery, to avoid entering twice for one window.
    last_recover: SeqNum,
    /// NewReno's inflated window while recovering without SACK (RFC 6582 §3.2).
    inflation: RecoveryInflation,
    /// D-SACK detection of a spurious recovery (RFC 3708).
    undo: UndoEpisode,
    /// A retransmission that must go out at the next opportunity (fast retransmit, partial ACK).
    rexmit_now: Option<SeqNum>,
    /// The SYN (or SYN-ACK) was retransmitted: RFC 6298 §5.7 applies once established.
    syn_retransmitted: bool,
    /// The segment being timed for an RTT sample: (end sequence, send time). Karn: cleared on
    /// any retransmission.
    rtt_probe: Option<(SeqNum, Instant)>,
    rto_at: Option<Instant>,
    /// Zero-window probing (RFC 9293 §3.8.6.1): next probe time and backoff exponent.
    persist_at: Option<Instant>,
    persist_backoff: u32,
    retries: u32,
    last_send: Instant,
    last_rcv: Instant,
    /// Window announced by the peer in the last ACK (RFC 5681 §2 duplicate-ACK definition).
    last_wnd_field: u16,

    // ACK generation.
    ack_now: bool,
    /// Duplicate ACKs owed for out-of-order segments received since the last poll: the
    /// stack processes a burst before polling, and coalescing them into one ACK would hide
    /// the loss from the sender's duplicate-ACK counter.
    dupacks_owed: u32,
    ack_at: Option<Instant>,
    /// Sequence number our last ACK carried (RFC 7323 Last.ACK.sent).
    last_ack_sent: SeqNum,

    ts: Option<TsState>,
    sack_ok: bool,
    /// RFC 5961 §7 rate limit: (window start, challenge ACKs in this window).
    challenge: (Instant, u32),
    /// When we last answered an unacceptable segment without data (rate limit).
    oow_ack_at: Option<Instant>,
    keepalive: Keepalive,
    /// A keepalive probe is due at the next poll.
    send_keepalive: bool,
    /// A zero-window probe is due at the next poll.
    send_window_probe: bool,
    /// Window scaling was negotiated.
    wscale_ok: bool,
    tw_at: Option<Instant>,
    /// The application released its handle: nobody reads or writes any more.
    orphaned: bool,
    /// FIN-WAIT-2 deadline of an orphan (`fin_timeout`).
    fin_wait2_at: Option<Instant>,
    /// Send a RST for (seq) at the next poll (abort).
    rst_pending: Option<SeqNum>,
    close_reason: Option<CloseReason>,
    events: Events,
    /// Counters for this connection.
    pub counters: ConnCounters,
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
    fn blank(now: Instant, tuple: FourTuple, cfg: TcpConfig, iss: SeqNum, ts_offset: u32) -> Self {
        // Invalid RTT settings fall back to the defaults; `TcpConfig::validate` reports them
        // to whoever built the config.
        let rtt = RttEstimator::new(cfg.rtt).unwrap_or_default();
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
            rexmit_now: None,
            syn_retransmitted: false,
            rtt_probe: None,
            rto_at: None,
            persist_at: None,
            persist_backoff: 0,
            retries: 0,
            last_send: now,
            last_rcv: now,
            last_wnd_field: 0,
            ack_now: false,
            dupacks_owed: 0,
            ack_at: None,
            last_ack_sent: SeqNum(0),
            ts,
            sack_ok: cfg.sack,
            challenge: (now, 0),
            oow_ack_at: None,
            keepalive: Keepalive::default(),
            send_keepalive: false,
            send_window_probe: false,
            wscale_ok: false,
            tw_at: None,
            orphaned: false,
            fin_wait2_at: None,
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
        cfg: TcpConfig,
        iss: SeqNum,
        ts_offset: u32,
    ) -> Self {
        let mut c = Connection::blank(now, tuple, cfg, iss, ts_offset);
        c.rcv_wscale = c.cfg.rcv_wscale();
        c.state = State::SynSent;
        c
    }

    /// Passive open from a SYN that matched a listener (RFC 9293 §3.10.7.2): the connection
    /// is in SYN-RECEIVED and the SYN-ACK goes out at the next `poll_segment`.
    pub fn accept_syn(
        now: Instant,
        tuple: FourTuple,
        cfg: TcpConfig,
        iss: SeqNum,
        ts_offset: u32,
        syn: &SynInfo,
    ) -> Self {
        let mut c = Connection::blank(now, tuple, cfg, iss, ts_offset);
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
        cfg: TcpConfig,
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

    /// Whether SACK, timestamps and window scaling were negotiated.
    pub fn negotiated(&self) -> (bool, bool, Option<(u8, u8)>) {
        let ws = self.wscale_ok.then_some((self.snd_wscale, self.rcv_wscale));
        (self.sack_ok, self.ts.is_some(), ws)
    }

    /// Take the events accumulated since the last call.
    pub fn take_events(&mut self) -> Events {
        core::mem::take(&mut self.events)
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
        match self.state {
            State::SynSent | State::SynReceived | State::Established | State::CloseWait => {}
            State::Closed => return Err(SendError::Closed),
            _ => return Err(SendError::Shutdown),
        }
        if self.fin_queued {
            return Err(SendError::Shutdown);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let room = self.send_capacity();
        if room == 0 {
            return Err(SendError::WouldBlock);
        }
        let n = room.min(data.len());
        if n == data.len() {
            self.sndq.push(data.clone());
        } else {
            self.sndq.push(data.slice(0..n));
        }
        Ok(n)
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

    /// Bytes ready to read.
    pub fn recv_available(&self) -> usize {
        self.rcvq_len
    }

    /// Take the next in-order chunk of received payload (zero copy: the buffer the NIC wrote).
    /// `Ok(None)` means no data now; `Err(Finished)` means end of stream.
    pub fn recv(&mut self) -> Result<Option<Zbuf>, RecvError> {
        if let Some(buf) = self.rcvq.pop_front() {
            self.rcvq_len -= buf.len();
            self.on_app_read();
            return Ok(Some(buf));
        }
        self.stream_status()
    }

    /// What a read finds when no data is queued: end of stream, an error, or nothing yet.
    fn stream_status(&self) -> Result<Option<Zbuf>, RecvError> {
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
        let new_edge = self.rcv_nxt + self.rcv_wnd();
        if new_edge.gt(self.rcv_adv) {
            let grow = new_edge - self.rcv_adv;
            let threshold = (self.cfg.rcv_buf / 2).min(self.snd_mss);
            if grow >= threshold {
                self.ack_now = true;
            }
        }
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

    fn terminate(&mut self, reason: CloseReason) {
        if self.state != State::Closed {
            self.state = State::Closed;
            self.close_reason.get_or_insert(reason);
            self.events.closed = true;
        }
        self.rto_at = None;
        self.persist_at = None;
        self.ack_at = None;
        self.tw_at = None;
        self.fin_wait2_at = None;
        self.ack_now = false;
        self.rexmit_now = None;
    }

    // ---------------------------------------------------------------------------------------
    // Segment arrival (RFC 9293 §3.10.7)
    // ---------------------------------------------------------------------------------------

    /// Process one segment addressed to this connection. `payload` is the TCP payload, a
    /// zero-copy slice of the received frame.
    pub fn on_segment(&mut self, now: Instant, seg: &TcpRepr, payload: Zbuf) -> Disposition {
        self.counters.segs_in += 1;
        self.last_rcv = now;
        if self.cfg.header_prediction && self.header_predicted(seg, payload.len()) {
            self.on_segment_predicted(now, seg, payload);
            return Disposition::Keep;
        }
        match self.state {
            State::Closed => Disposition::Keep,
            State::SynSent => {
                self.on_segment_syn_sent(now, seg);
                self.arm_timers(now);
                Disposition::Keep
            }
            _ => self.on_segment_synchronized(now, seg, payload),
        }
    }

    /// Header prediction (Van Jacobson, "4BSD header prediction", 1990; BSD tcp_input, Linux
    /// tcp_rcv_established): whether `seg` is an in-order segment in ESTABLISHED for which the
    /// full processing of RFC 9293 §3.10.7.4 reduces to `on_segment_predicted`. Every
    /// condition below rules out a branch of `process`; anything else takes the full path.
    #[inline]
    fn header_predicted(&self, seg: &TcpRepr, payload_len: usize) -> bool {
        // RFC 9293 §3.10.7.4: the other states have their own ACK, text and FIN rules.
        if self.state != State::Established {
            return false;
        }
        // RFC 9293 §3.10.7.4 second to fifth checks (RST, SYN, no ACK) and eighth (FIN): only
        // ACK, optionally PSH (which needs nothing on receive, RFC 9293 §3.9.1). URG, ECE and
        // CWR go the full way too.
        if seg.flags.0 & !TcpFlags::PSH.0 != TcpFlags::ACK.0 {
            return false;
        }
        // RFC 9293 §3.10.7.4 first check: exactly in sequence (no trimming, no reassembly).
        if seg.seq != self.rcv_nxt {
            return false;
        }
        match (self.ts, seg.options.timestamps) {
            // RFC 7323 §5.3 R1 (PAWS): TSval not older than TS.Recent passes without the
            // one-tick tolerance the full path allows; RFC 7323 §4.3 TS.Recent is updated
            // below under the same rule as the full path.
            (Some(ts), Some(t)) if (t.tsval.wrapping_sub(ts.recent) as i32) >= 0 => {}
            // Neither side uses timestamps.
            (None, None) => {}
            // RFC 7323 §3.2: a segment without timestamps once negotiated is dropped; an
            // older TSval is PAWS' business; stray timestamps are left to the full path.
            _ => return false,
        }
        // RFC 2018 / RFC 6675: SACK blocks, or SACK state to keep (renege check), need the
        // scoreboard. RFC 6582 / RFC 6675: loss recovery has its own ACK processing.
        if !seg.options.sack_blocks.is_empty() || !self.sb.ranges().is_empty() {
            return false;
        }
        // RFC 6298 §5 / RFC 5681 §3.1: after an RTO SND.NXT rewinds below SND.MAX (go-back-N);
        // a fast or partial-ACK retransmission may be pending.
        if self.recovery.is_some() || self.snd_nxt != self.snd_max || self.rexmit_now.is_some() {
            return false;
        }
        // RFC 9293 §3.8.6.1 (zero window, persist timer) and §3.10.7.4 fifth (window update):
        // the send window is open and stays open. BSD's prediction demands an unchanged
        // window because it then skips the update; ours runs the full path's update rule
        // (SND.WL1/WL2), so only the zero-window transitions, which stop or start the
        // persist timer, are excluded. (Our own receiver keeps its right edge fixed while
        // data arrives, so the window field changes on most segments of a transfer.)
        if self.snd_wnd == 0 || seg.window == 0 {
            return false;
        }
        // RFC 9293 §3.6.1: an orphan's data is answered with RST.
        if self.orphaned {
            return false;
        }
        let ack = seg.ack;
        if payload_len == 0 {
            // A pure ACK acknowledges new data, SND.UNA < SEG.ACK =< SND.MAX (RFC 9293
            // §3.10.7.4 fifth; RFC 5961 §5.2), or is a window update at SEG.ACK = SND.UNA that
            // cannot be a duplicate ACK (RFC 5681 §2: nothing outstanding, or the window
            // changed; with no SACK blocks RFC 6675 §5 adds nothing). Duplicate ACKs and old
            // ACKs take the full path.
            ack.le(self.snd_max)
                && (ack.gt(self.snd_una)
                    || (ack == self.snd_una
                        && (self.snd_max == self.snd_una || seg.window != self.last_wnd_field)))
        } else {
            // Data: SND.UNA =< SEG.ACK =< SND.MAX (RFC 5961 §5.2; an ACK equal to SND.UNA on a
            // segment with data is not a duplicate ACK, RFC 5681 §2); the payload fits the
            // window we advertised (RFC 9293 §3.10.7.4: nothing to trim); nothing out of order
            // is queued (RFC 5681 §4.2: a gap-filling segment is ACKed at once) and no FIN
            // seen out of order waits (RFC 9293 §3.10.7.4 eighth).
            ack.ge(self.snd_una)
                && ack.le(self.snd_max)
                && payload_len as u64 <= u64::from(self.rcv_wnd_for_check())
                && self.ooo.is_empty()
                && self.fin_seq.is_none()
        }
    }

    /// The full processing of RFC 9293 §3.10.7.4 for a segment `header_predicted` accepted,
    /// with the branches it ruled out left away: the same state changes, in the same order.
    fn on_segment_predicted(&mut self, now: Instant, seg: &TcpRepr, payload: Zbuf) {
        self.counters.fast_path_hits += 1;
        let ack = seg.ack;
        let len = payload.len() as u32;
        // RFC 9293 §3.10.7.4 fifth: the ACK. The scoreboard sees it as on the full path (it
        // tracks SND.UNA); with no blocks and no ranges it only moves its SND.UNA.
        let info = self.sb.on_ack(ack, &[]);
        debug_assert!(info.dsack.is_none() && info.newly_sacked_bytes == 0);
        if ack.gt(self.snd_una) {
            self.on_new_ack(now, ack);
        }
        // RFC 9293 §3.10.7.4: window update if SND.WL1 < SEG.SEQ or (SND.WL1 = SEG.SEQ and
        // SND.WL2 =< SEG.ACK). Both windows are open (checked by the prediction), so the
        // persist timer is not involved.
        if self.snd_wl1.lt(seg.seq) || (self.snd_wl1 == seg.seq && self.snd_wl2.le(ack)) {
            let wnd = u32::from(seg.window) << self.snd_wscale;
            self.snd_wnd = wnd;
            self.max_snd_wnd = self.max_snd_wnd.max(wnd);
            self.snd_wl1 = seg.seq;
            self.snd_wl2 = ack;
        }
        self.last_wnd_field = seg.window;
        // RFC 7323 §4.3 (2): TS.Recent, after the ACK check as on the full path.
        self.update_ts_recent_checked(now, seg, len);
        // RFC 9293 §3.8.4: the peer is alive.
        if self.keepalive.at.is_some() {
            self.arm_keepalive(now);
        }
        // RFC 9293 §3.10.7.4 seventh: in-order text goes to the application.
        if len > 0 {
            self.deliver(payload);
            self.schedule_ack(now, true);
        }
        self.arm_timers(now);
    }

    /// RFC 9293 §3.10.7.3: SEGMENT ARRIVES in SYN-SENT.
    fn on_segment_syn_sent(&mut self, now: Instant, seg: &TcpRepr) {
        let flags = seg.flags;
        if flags.ack() {
            // RFC 9293 §3.10.7.3 first: an ACK outside (ISS, SND.NXT] is unacceptable.
            if seg.ack.le(self.iss) || seg.ack.gt(self.snd_max) {
                self.counters.drop(DropReason::SynSentInvalid);
                if !flags.rst() {
                    self.rst_pending = Some(seg.ack);
                }
                return;
            }
        }
        if flags.rst() {
            // RFC 9293 §3.10.7.3 second: RST is acceptable only with an acceptable ACK
            // (RFC 5961 §3.2 allows the same check).
            if flags.ack() {
                self.terminate(CloseReason::Refused);
            } else {
                self.counters.drop(DropReason::SynSentInvalid);
            }
            return;
        }
        if !flags.syn() {
            // Neither SYN nor RST: drop (accepting a bare ACK here is a known bug class).
            self.counters.drop(DropReason::SynSentInvalid);
            return;
        }
        // RFC 9293 §3.10.7.3 fourth: SYN.
        self.irs = seg.seq;
        self.rcv_nxt = seg.seq + 1u32;
        self.rcv_adv = self.rcv_nxt;
        self.negotiate(&seg.options);
        self.update_ts_recent(now, &seg.options, seg.seq);
        if flags.ack() {
            self.snd_una = seg.ack;
            self.sndq.ack_to(seg.ack);
            // RFC 7323 §2.2: the SYN-ACK's window is not scaled.
            self.snd_wnd = u32::from(seg.window);
            self.max_snd_wnd = self.snd_wnd;
            self.snd_wl1 = seg.seq;
            self.snd_wl2 = seg.ack;
            self.last_wnd_field = seg.window;
            self.take_rtt_sample(now, seg.ack);
            if self.syn_retransmitted {
                self.rtt.on_handshake_retransmitted();
            }
            self.rto_at = None;
            self.retries = 0;
            self.state = State::Established;
            self.events.connected = true;
            self.events.writable = true;
            self.ack_now = true;
            self.arm_keepalive(now);
            if self.fin_queued {
                // close() during SYN-SENT with data queued: the FIN follows the data.
                self.state = State::FinWait1;
            }
        } else {
            // RFC 9293 §3.10.7.3: simultaneous open — SYN-RECEIVED, send SYN-ACK.
            self.state = State::SynReceived;
            self.snd_wnd = u32::from(seg.window);
            self.max_snd_wnd = self.snd_wnd;
            self.snd_wl1 = seg.seq;
            self.snd_wl2 = self.iss;
            // Rewind so the SYN goes out again, now with ACK.
            self.snd_nxt = self.iss;
            self.rto_at = None;
        }
    }

    /// Segment length in sequence space: payload plus one each for SYN and FIN.
    fn seg_len(seg: &TcpRepr, payload_len: usize) -> u32 {
        payload_len as u32 + u32::from(seg.flags.syn()) + u32::from(seg.flags.fin())
    }

    /// The receive window we currently offer, in bytes, unrounded.
    fn rcv_wnd(&self) -> u32 {
        let free = (self.cfg.rcv_buf as usize).saturating_sub(self.rcvq_len);
        let max = u32::from(u16::MAX) << self.rcv_wscale;
        (free.min(u32::MAX as usize) as u32).min(max)
    }

    /// The window used for the acceptability test: what we advertised.
    fn rcv_wnd_for_check(&self) -> u32 {
        if self.rcv_adv.gt(self.rcv_nxt) {
            self.rcv_adv - self.rcv_nxt
        } else {
            0
        }
    }

    fn on_segment_synchronized(
        &mut self,
        now: Instant,
        seg: &TcpRepr,
        payload: Zbuf,
    ) -> Disposition {
        let disposition = self.process(now, seg, payload);
        self.arm_timers(now);
        disposition
    }

    fn process(&mut self, now: Instant, seg: &TcpRepr, mut payload: Zbuf) -> Disposition {
        let flags = seg.flags;

        // Our SYN-ACK was lost and the peer retransmitted its SYN: answer with the SYN-ACK
        // again rather than a bare ACK (RFC 9293 §3.10.7.4 would ACK; that stalls the peer
        // in SYN-SENT until our RTO).
        if self.state == State::SynReceived && flags.syn() && !flags.ack() && seg.seq == self.irs {
            self.snd_nxt = self.iss;
            return Disposition::Keep;
        }

        // RFC 1337 §3 (fix F1): in TIME-WAIT ignore RST, avoiding TIME-WAIT assassination.
        if self.state == State::TimeWait && flags.rst() {
            self.counters.drop(DropReason::BadRst);
            return Disposition::Keep;
        }

        // RFC 7323 §3.2: once negotiated, a non-RST segment without timestamps SHOULD be
        // dropped. Not a SYN: RFC 5961 §4.2 (and RFC 9293 §3.10.7.4 fourth) answer a SYN in
        // any synchronized state with a challenge ACK, whatever it carries. A SYN is no
        // segment of this connection's timestamp clock: a peer that restarted opens without
        // it, and dropping its SYN silently would leave both ends stuck, while the
        // challenge ACK lets it reset the stale connection (RFC 5961 §4). In TIME-WAIT such
        // a SYN cannot reopen the tuple (see `accepts_new_syn`).
        if let Some(ts) = self.ts {
            match seg.options.timestamps {
                None if !flags.rst() && !flags.syn() && self.state != State::SynReceived => {
                    self.counters.drop(DropReason::Paws);
                    return Disposition::Keep;
                }
                // RFC 7323 §5.3 R1: PAWS — TSval older than TS.Recent (and TS.Recent is
                // valid) makes a non-RST segment unacceptable: ACK and drop. Like Linux
                // (TCP_PAWS_WINDOW) we tolerate one tick: with a 1 ms clock, ordinary
                // reordering delivers segments one tick "old", and dropping them (20% of a
                // kernel peer's ACKs in the interop run) costs far more than it protects —
                // wrapped sequence numbers are 2^31 ticks apart, not one.
                Some(t)
                    if !flags.rst()
                        && (t.tsval.wrapping_sub(ts.recent) as i32) < -PAWS_WINDOW
                        && now.saturating_duration_since(ts.recent_at) < PAWS_IDLE =>
                {
                    self.counters.drop(DropReason::Paws);
                    self.ack_unacceptable(now, seg, payload.len());
                    return Disposition::Keep;
                }
                _ => {}
            }
        }

        // RFC 9293 §3.10.7.4 first: sequence number acceptability.
        let mut seq = seg.seq;
        let len = Self::seg_len(seg, payload.len());
        let wnd = self.rcv_wnd_for_check();
        let acceptable = if len == 0 {
            if wnd == 0 {
                seq == self.rcv_nxt
            } else {
                seq.in_range(self.rcv_nxt, self.rcv_nxt + wnd)
            }
        } else if wnd == 0 {
            // "special allowance should be made to accept valid ACKs, URGs, and RSTs":
            // a zero-window probe at RCV.NXT still has its ACK processed.
            seq == self.rcv_nxt
        } else {
            seq.in_range(self.rcv_nxt, self.rcv_nxt + wnd)
                || (seq + (len - 1)).in_range(self.rcv_nxt, self.rcv_nxt + wnd)
        };
        if !acceptable {
            self.counters.drop(DropReason::OutOfWindow);
            if !flags.rst() {
                // An old duplicate or a segment beyond the window: ACK it (this is also what
                // re-ACKs a retransmitted FIN in TIME-WAIT).
                self.note_old_duplicate(seg.seq, payload.len());
                self.ack_unacceptable(now, seg, payload.len());
                if self.is_fin_retransmission(seg, len) {
                    self.restart_time_wait(now);
                }
            }
            return Disposition::Keep;
        }

        // RFC 9293 §3.10.7.4 second: RST, with RFC 5961 §3.2 exact-match rule.
        if flags.rst() {
            if seq != self.rcv_nxt {
                self.counters.drop(DropReason::BadRst);
                self.challenge_ack(now);
                return Disposition::Keep;
            }
            if self.state == State::SynReceived && self.passive {
                // RFC 9293 §3.10.7.4: a passive SYN-RECEIVED connection returns to LISTEN.
                self.terminate(CloseReason::Reset);
                return Disposition::Remove;
            }
            let reason = match self.state {
                State::SynReceived => CloseReason::Refused,
                // RFC 9293 §3.10.7.4 second (CLOSING, LAST-ACK): enter CLOSED and delete the
                // TCB. The RFC signals no error there, but our FIN (and maybe data before it)
                // was never acknowledged, so the peer may not have received everything: the
                // close reason is a reset (ECONNRESET), as BSD and Linux report. (TIME-WAIT
                // ignored the RST above, RFC 1337.)
                _ => CloseReason::Reset,
            };
            self.sndq.ack_to(self.sndq.end());
            self.terminate(reason);
            return Disposition::Keep;
        }

        // RFC 9293 §3.10.7.4 fourth / RFC 5961 §4.2: a SYN in a synchronized state (or in
        // SYN-RECEIVED) gets a challenge ACK regardless of its sequence number.
        if flags.syn() {
            self.challenge_ack(now);
            return Disposition::Keep;
        }

        // RFC 9293 §3.10.7.4 fifth: segments without ACK are dropped.
        if !flags.ack() {
            self.counters.drop(DropReason::NoAck);
            return Disposition::Keep;
        }

        if self.state == State::SynReceived {
            // RFC 9293 §3.10.7.4: SND.UNA < SEG.ACK =< SND.NXT moves to ESTABLISHED.
            if seg.ack.gt(self.snd_una) && seg.ack.le(self.snd_max) {
                self.state = State::Established;
                self.snd_wnd = u32::from(seg.window) << self.snd_wscale;
                self.max_snd_wnd = self.max_snd_wnd.max(self.snd_wnd);
                self.snd_wl1 = seg.seq;
                self.snd_wl2 = seg.ack;
                self.last_wnd_field = seg.window;
                if self.syn_retransmitted {
                    // RFC 6298 §5.7: the SYN-ACK timed out, so the RTO is re-initialized to
                    // 3 s when data transmission begins (passive side of the same rule).
                    self.rtt.on_handshake_retransmitted();
                }
                self.events.connected = true;
                self.events.writable = true;
                self.arm_keepalive(now);
                if self.fin_queued {
                    // close() during SYN-RECEIVED: the FIN follows the queued data now.
                    self.state = State::FinWait1;
                }
            } else {
                // RFC 9293 §3.10.7.4: <SEQ=SEG.ACK><CTL=RST>.
                self.counters.drop(DropReason::BadAck);
                self.rst_pending = Some(seg.ack);
                return Disposition::Keep;
            }
        }

        let time_wait = self.state == State::TimeWait;
        if !self.on_ack(now, seg, payload.len()) {
            return Disposition::Keep;
        }
        if time_wait {
            // RFC 9293 §3.10.7.4 fifth (TIME-WAIT): "The only thing that can arrive in this
            // state is a retransmission of the remote FIN. Acknowledge it, and restart the
            // 2 MSL timeout." So any acceptable segment with an acceptable ACK (eighth, FIN:
            // restart too). Data cannot be delivered after the FIN (seventh). A pure ACK is
            // answered under the out-of-window ACK limit, as Linux does in TIME-WAIT
            // (tcp_timewait_check_oow_rate_limit): two desynchronized ends must not ACK
            // each other's ACKs forever.
            if !payload.is_empty() {
                self.counters.drop(DropReason::DataAfterFin);
            }
            self.update_ts_recent_checked(now, seg, len);
            self.ack_unacceptable(now, seg, payload.len());
            self.restart_time_wait(now);
            return Disposition::Keep;
        }
        // RFC 7323 §4.3 (2): TS.Recent takes SEG.TSval when the segment covers Last.ACK.sent.
        // Done after the ACK check rather than in the first check as RFC 7323 Appendix D
        // sketches: RFC 5961 §5.2 discards a segment whose ACK is unacceptable, and updating
        // earlier would let a blind segment with a guessed in-window SEQ poison TS.Recent so
        // that PAWS drops the real peer.
        self.update_ts_recent_checked(now, seg, len);
        // RFC 9293 §3.8.4: the peer is alive. Only a segment that passed the sequence and
        // ACK checks counts: dropped junk (spoofed or stale) must not postpone the probes.
        if matches!(self.state, State::Established | State::CloseWait)
            && self.keepalive.at.is_some()
        {
            self.arm_keepalive(now);
        }
        if self.snd_wnd == 0 && !self.orphaned {
            // The peer answers our zero-window probes: it is alive (RFC 9293 §3.8.6.1 MUST
            // NOT close the connection while probes are acknowledged). RFC 6429 / RFC 9293
            // §3.8.6.1: that does not stop reclaiming resources, so an orphan's probes keep
            // counting toward max_retries and a peer holding the window shut cannot pin it.
            self.retries = 0;
        }
        if self.state == State::Closed {
            return Disposition::Keep;
        }

        // RFC 9293 §3.10.7.4 seventh: segment text, in ESTABLISHED, FIN-WAIT-1, FIN-WAIT-2.
        let mut fin = flags.fin();
        if !payload.is_empty() || fin {
            match self.state {
                State::Established | State::FinWait1 | State::FinWait2 => {}
                _ => {
                    // CLOSE-WAIT, CLOSING, LAST-ACK (TIME-WAIT returned above): the peer
                    // already sent FIN.
                    if !payload.is_empty() {
                        self.counters.drop(DropReason::DataAfterFin);
                    }
                    self.ack_now = true;
                    return Disposition::Keep;
                }
            }
            // Trim what we already have (before RCV.NXT).
            if seq.lt(self.rcv_nxt) {
                let dup = (self.rcv_nxt - seq) as usize;
                if dup >= payload.len() {
                    // Only the FIN (or nothing) remains new.
                    if !payload.is_empty() {
                        // RFC 2883 §4: report the duplicate with a D-SACK.
                        self.ooo.note_duplicate(seq, seq + payload.len());
                    }
                    payload.advance(payload.len());
                } else {
                    self.ooo.note_duplicate(seq, self.rcv_nxt);
                    payload.advance(dup);
                }
                seq = self.rcv_nxt;
            }
            // Trim what lies beyond the window (RFC 9293 §3.10.7.4: "keep only the portion
            // within the window").
            let wnd = self.rcv_wnd_for_check().max(self.rcv_wnd());
            let room = (self.rcv_nxt + wnd) - seq;
            if payload.len() as u32 > room {
                self.counters.drop(DropReason::RcvBufFull);
                payload.truncate(room as usize);
                fin = false;
            }
            if fin {
                let fseq = seq + payload.len();
                self.fin_seq = Some(fseq);
            }
            if seq == self.rcv_nxt {
                // RFC 5681 §4.2: a segment that fills in all or part of a gap is ACKed at
                // once (the sender is in loss recovery and waits for it), not delayed.
                let fills_gap = !payload.is_empty() && !self.ooo.is_empty();
                self.deliver(payload);
                // Anything out of order that is now contiguous follows (RFC 9293 §3.10.7.4).
                while let Some(more) = self.ooo.pop_ready(self.rcv_nxt) {
                    self.deliver(more);
                }
                if fills_gap {
                    self.ack_now = true;
                } else {
                    self.schedule_ack(now, len > 0);
                }
            } else {
                // Out of order: queue it and send an immediate duplicate ACK with SACK
                // (RFC 5681 §4.2: an out-of-order segment SHOULD be acked immediately).
                if !payload.is_empty() {
                    let outcome = self.ooo.insert(self.rcv_nxt, seq, payload);
                    if outcome.dropped > 0 {
                        self.counters.drop(DropReason::OooFull);
                    }
                }
                self.ack_now = true;
                self.dupacks_owed = (self.dupacks_owed + 1).min(MAX_DUPACKS_OWED);
            }
            // RFC 9293 §3.10.7.4 eighth: FIN in sequence.
            if let Some(fseq) = self.fin_seq {
                if !self.fin_rcvd && fseq == self.rcv_nxt {
                    self.on_fin(now);
                }
            }
            // RFC 9293 §3.6.1 (SHLD-3): data received after the application closed (and
            // released) the connection can never be read: send a RST to show it was lost,
            // rather than ACK it and let the peer believe it was delivered.
            if self.orphaned && self.rcvq_len > 0 {
                self.abort();
            }
        }
        Disposition::Keep
    }

    fn deliver(&mut self, buf: Zbuf) {
        if buf.is_empty() {
            return;
        }
        self.rcv_nxt += buf.len();
        self.rcvq_len += buf.len();
        self.counters.bytes_in += buf.len() as u64;
        self.rcvq.push_back(buf);
        self.events.readable = true;
    }

    fn on_fin(&mut self, now: Instant) {
        self.fin_rcvd = true;
        self.rcv_nxt += 1u32;
        self.ack_now = true;
        self.events.readable = true;
        match self.state {
            State::SynReceived | State::Established => self.state = State::CloseWait,
            State::FinWait1 => {
                // Our FIN not yet acknowledged (else on_ack moved us to FIN-WAIT-2).
                self.state = State::Closing;
            }
            State::FinWait2 => self.enter_time_wait(now),
            _ => {}
        }
    }

    fn schedule_ack(&mut self, now: Instant, has_data: bool) {
        if !has_data {
            return;
        }
        match self.cfg.delayed_ack {
            // RFC 9293 §3.8.6.3 / RFC 5681 §4.2: ACK at least every second full-sized
            // segment and within the delayed-ACK timeout.
            Some(d) => {
                if self.rcv_nxt - self.last_ack_sent >= 2 * self.snd_mss.max(1) {
                    self.ack_now = true;
                } else if self.ack_at.is_none() {
                    self.ack_at = Some(now + d);
                }
            }
            None => self.ack_now = true,
        }
    }

    /// RFC 2883 §4: data entirely below RCV.NXT (a spurious retransmission) is reported with a
    /// D-SACK. Only plausible duplicates, within one receive buffer below RCV.NXT, are.
    fn note_old_duplicate(&mut self, seq: SeqNum, payload_len: usize) {
        let end = seq + payload_len;
        let reach = self.cfg.rcv_buf.max(u32::from(u16::MAX));
        if payload_len > 0 && end.le(self.rcv_nxt) && self.rcv_nxt - seq <= reach {
            self.ooo.note_duplicate(seq, end);
        }
    }

    /// The ACK owed for an unacceptable segment (RFC 9293 §3.10.7.4 first check, RFC 7323
    /// §5.3 PAWS). A segment with data or a FIN is acknowledged at once: the peer's
    /// retransmissions and a FIN repeated into TIME-WAIT depend on it. Anything else is a
    /// pure ACK (or a SYN): answering each one lets two desynchronized endpoints answer each
    /// other's ACKs forever, so those replies are rate limited per connection
    /// (`oow_ack_interval`), and a SYN gets a rate-limited challenge ACK (RFC 5961 §4.2:
    /// whatever its sequence number).
    fn ack_unacceptable(&mut self, now: Instant, seg: &TcpRepr, payload_len: usize) {
        if payload_len > 0 || seg.flags.fin() {
            self.ack_now = true;
            return;
        }
        if seg.flags.syn() {
            self.challenge_ack(now);
            return;
        }
        if self
            .oow_ack_at
            .is_some_and(|at| now.saturating_duration_since(at) < self.cfg.oow_ack_interval)
        {
            self.counters.oow_acks_suppressed += 1;
            return;
        }
        self.oow_ack_at = Some(now);
        self.ack_now = true;
    }

    /// RFC 5961 §7: challenge ACKs, rate limited per connection per second.
    fn challenge_ack(&mut self, now: Instant) {
        if now.saturating_duration_since(self.challenge.0) >= Duration::from_secs(1) {
            self.challenge = (now, 0);
        }
        if self.challenge.1 < self.cfg.challenge_ack_limit {
            self.challenge.1 += 1;
            self.counters.challenge_acks += 1;
            self.ack_now = true;
        } else {
            self.counters.challenge_acks_suppressed += 1;
        }
    }

    fn update_ts_recent(&mut self, now: Instant, opts: &TcpOptions, _seq: SeqNum) {
        if let (Some(ts), Some(t)) = (self.ts.as_mut(), opts.timestamps) {
            ts.recent = t.tsval;
            ts.recent_at = now;
        }
    }

    /// RFC 7323 §4.3: TS.Recent takes SEG.TSval when SEG.SEQ =< Last.ACK.sent < SEG.SEQ + len
    /// (with zero-length segments covering Last.ACK.sent when SEG.SEQ equals it).
    fn update_ts_recent_checked(&mut self, now: Instant, seg: &TcpRepr, len: u32) {
        let Some(t) = seg.options.timestamps else {
            return;
        };
        let Some(ts) = self.ts.as_mut() else { return };
        let covers = seg.seq.le(self.last_ack_sent) && self.last_ack_sent.le(seg.seq + len);
        if covers && (t.tsval.wrapping_sub(ts.recent) as i32) >= 0 {
            ts.recent = t.tsval;
            ts.recent_at = now;
        }
    }

    /// RFC 9293 §3.10.7.4 fifth: the ACK field. Returns false when the segment must be dropped.
    fn on_ack(&mut self, now: Instant, seg: &TcpRepr, payload_len: usize) -> bool {
        let ack = seg.ack;
        // RFC 5961 §5.2: acceptable iff SND.UNA - MAX.SND.WND =< SEG.ACK =< SND.NXT.
        if ack.gt(self.snd_max) {
            self.counters.drop(DropReason::BadAck);
            self.challenge_ack(now);
            return false;
        }
        if ack.lt(self.snd_una - self.max_snd_wnd.max(1)) {
            self.counters.drop(DropReason::BadAck);
            self.challenge_ack(now);
            return false;
        }

        let blocks: &[(SeqNum, SeqNum)] = if self.sack_ok {
            seg.options.sack_blocks.as_slice()
        } else {
            &[]
        };
        let high_before = self.sb.highest_sacked();
        let sack_info = self.sb.on_ack(ack, blocks);
        if let Some((l, r)) = sack_info.dsack {
            self.counters.dsacks += 1;
            self.undo.on_dsack(l, r);
        }
        if self.undo.active && self.undo.extent.is_none() && ack.gt(self.undo.hole) {
            // The presumed-lost octet arrived: everything the peer had beyond it came first
            // (the reordering extent, if the episode proves spurious).
            let high = [high_before, self.sb.highest_sacked()]
                .into_iter()
                .flatten()
                .fold(ack, |h, s| if s.gt(h) { s } else { h });
            self.undo.extent = Some(high - self.undo.hole);
            self.undo.original_arrived = match (self.undo.rxt_tsval, seg.options.timestamps) {
                (Some(rxt), Some(t)) => (t.tsecr.wrapping_sub(rxt) as i32) < 0,
                _ => self.ts.is_none(),
            };
        }
        // Before this ACK can start a new recovery (which replaces the episode).
        if self.recovery.is_none() && self.undo.all_dsacked() {
            self.undo_spurious_recovery();
        }

        if ack.gt(self.snd_una) {
            self.on_new_ack(now, ack);
        } else if ack == self.snd_una && self.snd_max.gt(self.snd_una) {
            // RFC 5681 §2 duplicate ACK: no data, no SYN/FIN, same window, data outstanding.
            // RFC 6675 §5: with SACK, an ACK that SACKs new data counts too.
            let classic_dup = payload_len == 0
                && !seg.flags.syn()
                && !seg.flags.fin()
                && seg.window == self.last_wnd_field
                && self.snd_wnd != 0;
            let sack_dup = sack_info.newly_sacked_bytes > 0;
            if classic_dup || sack_dup {
                // Bounded: a flood of duplicate ACKs cannot overflow the counter.
                self.dupacks = self.dupacks.saturating_add(1);
                if self.recovery.is_some() && !self.sack_ok {
                    // RFC 6582 §3.2 step 4: each further duplicate ACK inflates the window.
                    self.inflation.on_dup_ack(self.snd_mss);
                }
                if self.recovery.is_none() {
                    let lost = self.sack_ok && self.sb.is_lost(self.snd_una);
                    // RFC 6675 §5: DupThresh, adapted to measured reordering with SACK.
                    let dup_thresh = if self.sack_ok {
                        self.sb.dup_thresh()
                    } else {
                        DUP_THRESH
                    };
                    // RFC 6582 §3.2 step 2: only if SND.UNA passed the previous `recover`.
                    if (self.dupacks >= dup_thresh || lost) && self.snd_una.ge(self.last_recover) {
                        self.enter_recovery(now);
                    }
                }
            }
        }

        if self
            .sb
            .ranges()
            .first()
            .is_some_and(|&(s, _)| s.le(self.snd_una))
        {
            // RFC 2018 §8: the receiver may discard data it has SACKed. A SACKed range at
            // SND.UNA means the cumulative ACK stopped on data it reported holding: it
            // reneged. RFC 6675 §5.1 lets SACK information outlive an RTO only with such a
            // test, so forget it all, and resend the left edge now instead of waiting for
            // the RTO to find it.
            self.sb.clear_sacks();
            self.counters.sack_renegings += 1;
            self.rexmit_now = Some(self.snd_una);
        }

        if self.recovery.is_none() && self.undo.all_dsacked() {
            self.undo_spurious_recovery();
        }

        // RFC 9293 §3.10.7.4: window update if SND.WL1 < SEG.SEQ or (SND.WL1 = SEG.SEQ and
        // SND.WL2 =< SEG.ACK).
        if self.snd_wl1.lt(seg.seq) || (self.snd_wl1 == seg.seq && self.snd_wl2.le(ack)) {
            let wnd = u32::from(seg.window) << self.snd_wscale;
            if self.snd_wnd == 0 && wnd > 0 {
                self.persist_at = None;
                self.persist_backoff = 0;
            }
            self.snd_wnd = wnd;
            self.max_snd_wnd = self.max_snd_wnd.max(wnd);
            self.snd_wl1 = seg.seq;
            self.snd_wl2 = ack;
        }
        self.last_wnd_field = seg.window;

        // FIN acknowledgment transitions (RFC 9293 §3.10.7.4 fifth, per state).
        let fin_acked = self.fin_queued && self.snd_una == self.sndq.end() + 1u32;
        match self.state {
            State::FinWait1 if fin_acked => self.state = State::FinWait2,
            State::Closing if fin_acked => self.enter_time_wait(now),
            State::LastAck if fin_acked => {
                self.terminate(CloseReason::Normal);
                return false;
            }
            _ => {}
        }
        true
    }

    /// RFC 9293 §3.10.7.4 fifth, SND.UNA < SEG.ACK =< SND.NXT: new data acknowledged. Shared
    /// by the full path and header prediction.
    #[inline]
    fn on_new_ack(&mut self, now: Instant, ack: SeqNum) {
        let in_flight_before = self.snd_max - self.snd_una;
        let acked = ack - self.snd_una;
        // The SYN occupies the first sequence number; FIN the one after the data.
        self.sndq.ack_to(ack);
        self.snd_una = ack;
        if self.snd_nxt.lt(self.snd_una) {
            self.snd_nxt = self.snd_una;
        }
        self.retries = 0;
        self.persist_backoff = 0;
        self.keepalive.probes_sent = 0;
        self.take_rtt_sample(now, ack);
        self.events.writable = true;
        match self.recovery {
            Some(recover) if ack.ge(recover) => {
                // RFC 6582 §3.2 step 3 (full acknowledgment) / RFC 6675 §5: exit recovery.
                self.recovery = None;
                self.last_recover = recover;
                self.dupacks = 0;
                self.cc.on_exit_recovery(now, self.snd_max - self.snd_una);
            }
            Some(_) => {
                // RFC 6582 §3.2 step 3 (partial acknowledgment): retransmit the first
                // unacknowledged segment and deflate. With SACK, NextSeg drives
                // retransmissions.
                if !self.sack_ok {
                    self.rexmit_now = Some(self.snd_una);
                    self.inflation.on_partial_ack(acked, self.snd_mss);
                }
            }
            None => {
                self.dupacks = 0;
                let app_limited = self.sndq.end().le(self.snd_max) && !self.fin_queued;
                self.cc
                    .on_ack(now, acked, &self.rtt, in_flight_before, app_limited);
            }
        }
        // RFC 6298 §5.2/5.3: stop the timer when all is acknowledged, else restart it.
        if self.snd_una == self.snd_max {
            self.rto_at = None;
        } else {
            self.rto_at = Some(now + self.rtt.rto());
        }
    }

    fn enter_recovery(&mut self, now: Instant) {
        let in_flight = self.snd_max - self.snd_una;
        self.recovery = Some(self.snd_max);
        self.cc.on_enter_recovery(now, in_flight);
        self.sb.on_enter_recovery();
        self.inflation = RecoveryInflation::on_enter(self.snd_mss);
        // RFC 5681 §3.2 step 2 / RFC 6675 §5 (4.2): retransmit the first unacknowledged
        // segment now.
        self.rexmit_now = Some(self.snd_una);
        self.counters.fast_retransmits += 1;
        if self.sack_ok {
            self.counters.sack_recoveries += 1;
            // RFC 3708 §3: watch this episode's retransmissions for D-SACKs. A previous
            // episode not yet proven spurious can no longer be undone: the CC saved its state
            // anew for this reduction.
            self.undo.start(self.snd_una);
        } else {
            self.undo.active = false;
        }
    }

    /// RFC 3708 §3: the recovery episode is over and every retransmission in it was
    /// D-SACKed, so no data was lost: the reduction was spurious.
    fn undo_spurious_recovery(&mut self) {
        self.undo.active = false;
        // RFC 9438 §4.9: restore the congestion state from before the reduction (cwnd,
        // ssthresh, and CUBIC's W_max, K, epoch), as Linux does; RFC 4015's response would
        // restore more cautiously.
        if self.cc.undo() {
            self.counters.spurious_recoveries += 1;
        }
        // RFC 4653's idea (Linux tcp_reordering): the same reordering should not trigger the
        // next fast retransmit, so DupThresh rises to its extent (bounded in the scoreboard).
        if let Some(extent) = self.undo.extent {
            self.sb.note_reordering(extent);
        }
    }

    fn take_rtt_sample(&mut self, now: Instant, ack: SeqNum) {
        if let Some((end, sent)) = self.rtt_probe {
            if ack.ge(end) {
                self.rtt.on_sample(
                    now,
                    now.saturating_duration_since(sent),
                    SampleSource::Fresh,
                );
                self.rtt_probe = None;
            }
        }
    }

    fn enter_time_wait(&mut self, now: Instant) {
        self.state = State::TimeWait;
        self.rto_at = None;
        self.persist_at = None;
        self.fin_wait2_at = None;
        self.restart_time_wait(now);
        self.close_reason.get_or_insert(CloseReason::Normal);
        self.events.closed = true;
    }

    /// RFC 9293 §3.10.7.4 (TIME-WAIT): "The only thing that can arrive in this state is a
    /// retransmission of the remote FIN. Acknowledge it, and restart the 2 MSL timeout." A
    /// retransmitted FIN ends exactly at RCV.NXT, below the window, so it fails the first
    /// (sequence) check; of the other unacceptable segments none restarts the timer, so
    /// stray or spoofed ones cannot keep the tuple in TIME-WAIT (RFC 9293 §3.10.7.4 first:
    /// they are only acknowledged).
    fn is_fin_retransmission(&self, seg: &TcpRepr, len: u32) -> bool {
        self.state == State::TimeWait && seg.flags.fin() && seg.seq + len == self.rcv_nxt
    }

    fn restart_time_wait(&mut self, now: Instant) {
        if self.state == State::TimeWait {
            self.tw_at = Some(now + self.cfg.time_wait);
        }
    }

    // ---------------------------------------------------------------------------------------
    // Timers
    // ---------------------------------------------------------------------------------------

    /// The earliest instant at which `on_timeout` has work to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        // Called after every input by the stack: plain comparisons, no iterator chain.
        let mut at = earliest(self.rto_at, self.persist_at);
        at = earliest(at, self.ack_at);
        at = earliest(at, self.tw_at);
        at = earliest(at, self.fin_wait2_at);
        earliest(at, self.keepalive.at)
    }

    fn arm_keepalive(&mut self, now: Instant) {
        if let Some(ka) = self.cfg.keepalive {
            self.keepalive = Keepalive {
                at: Some(now + ka.idle),
                probes_sent: 0,
            };
        }
    }

    /// RFC 6298 §5.1-5.2 and RFC 9293 §3.8.6.1: keep exactly one of the retransmission and
    /// persist timers running while anything is outstanding or waiting for window.
    fn arm_timers(&mut self, now: Instant) {
        if self.orphaned && self.state == State::FinWait2 && self.fin_wait2_at.is_none() {
            // RFC 9293 has no FIN-WAIT-2 timer: a peer that never sends its FIN keeps the
            // connection forever. With no application left to wait for it, give up after
            // `fin_timeout` (Linux tcp_fin_timeout).
            self.fin_wait2_at = Some(now + self.cfg.fin_timeout);
        }
        if matches!(self.state, State::Closed | State::TimeWait) {
            self.rto_at = None;
            self.persist_at = None;
            return;
        }
        let outstanding = self.snd_max != self.snd_una;
        // Payload unacknowledged or unsent: a zero window means probing, not retransmitting.
        // (A lone FIN goes out regardless of the window and is covered by the RTO.)
        let data_pending = self.sndq.end().gt(self.snd_una);
        if self.state.is_synchronized() && self.snd_wnd == 0 && data_pending {
            self.rto_at = None;
            if self.persist_at.is_none() {
                self.persist_at = Some(now + self.persist_interval());
            }
        } else {
            self.persist_at = None;
            if outstanding {
                if self.rto_at.is_none() {
                    self.rto_at = Some(now + self.rtt.rto());
                }
            } else {
                self.rto_at = None;
            }
        }
    }

    /// RFC 9293 §3.8.6.1: probe intervals grow exponentially from the RTO.
    fn persist_interval(&self) -> Duration {
        let base = self.rtt.rto();
        let max = self.cfg.rtt.max_rto;
        base.checked_mul(1u32 << self.persist_backoff.min(16))
            .map_or(max, |d| d.min(max))
    }

    /// Run the timers that expired by `now`.
    pub fn on_timeout(&mut self, now: Instant) {
        if self.tw_at.is_some_and(|t| t <= now) {
            // RFC 9293 §3.10.8: 2 MSL elapsed in TIME-WAIT.
            self.tw_at = None;
            self.state = State::Closed;
            return;
        }
        if self.fin_wait2_at.is_some_and(|t| t <= now) {
            // An orphan's FIN-WAIT-2 expired: reset, so a peer stuck in CLOSE-WAIT learns.
            self.fin_wait2_at = None;
            self.rst_pending = Some(self.seq_for_control());
            self.terminate(CloseReason::Timeout);
            return;
        }
        if self.ack_at.is_some_and(|t| t <= now) {
            self.ack_at = None;
            self.ack_now = true;
        }
        if self.rto_at.is_some_and(|t| t <= now) {
            self.rto_at = None;
            self.on_rto(now);
        }
        if self.persist_at.is_some_and(|t| t <= now) {
            self.persist_at = None;
            self.retries += 1;
            if self.retries > self.cfg.max_retries {
                // Unanswered probes: the peer is gone.
                self.rst_pending = Some(self.seq_for_control());
                self.terminate(CloseReason::Timeout);
                return;
            }
            self.send_window_probe = true;
            self.persist_backoff = self.persist_backoff.saturating_add(1);
        }
        if self.keepalive.at.is_some_and(|t| t <= now) {
            self.on_keepalive(now);
        }
        self.arm_timers(now);
    }

    fn on_rto(&mut self, now: Instant) {
        self.retries += 1;
        let limit = match self.state {
            State::SynSent | State::SynReceived => self.cfg.syn_retries,
            _ => self.cfg.max_retries,
        };
        if self.retries > limit {
            // RFC 9293 §3.8.3 R2: give up.
            if self.state.is_synchronized() {
                self.rst_pending = Some(self.seq_for_control());
            }
            self.terminate(CloseReason::Timeout);
            return;
        }
        self.counters.rtos += 1;
        // A timeout is a loss signal of its own; an earlier recovery is no longer undone
        // (the CC saved its state anew), and if the raised DupThresh held back a fast
        // retransmit the default would have sent, the reordering estimate is reset.
        self.undo.active = false;
        if self.recovery.is_none() {
            self.sb.on_rto_outside_recovery();
        }
        // RFC 6298 §5.5: back off; §5.6: restart; RFC 5681 §3.1 eq. 4: loss window.
        self.rtt.on_timeout();
        let in_flight = self.snd_max - self.snd_una;
        if self.state.is_synchronized() {
            self.cc.on_rto(now, in_flight);
        }
        // RFC 6582 §3.2 step 5: after an RTO, recover <- the highest sequence number sent, in
        // or out of recovery, so the duplicate ACKs of the go-back-N retransmissions cannot
        // start a fast retransmit below it (RFC 6675 §5.1 says the same for SACK recovery).
        self.recovery = None;
        self.last_recover = self.snd_max;
        self.dupacks = 0;
        self.rexmit_now = None;
        self.rtt_probe = None;
        // Go back N from SND.UNA (RFC 5681 §3.1); SACKed ranges above it are skipped when
        // resent (RFC 6675 §5.1), which is safe because reneging is detected on every ACK.
        self.snd_nxt = self.snd_una;
        self.sb.on_rto();
        if !self.state.is_synchronized() {
            self.syn_retransmitted = true;
        }
    }

    fn on_keepalive(&mut self, now: Instant) {
        let Some(ka) = self.cfg.keepalive else {
            self.keepalive.at = None;
            return;
        };
        if !matches!(self.state, State::Established | State::CloseWait) {
            self.keepalive.at = None;
            return;
        }
        if self.snd_max != self.snd_una || self.sndq.end().gt(self.snd_una) {
            // RFC 1122 §4.2.3.6: probe only an idle connection. With data (or a FIN)
            // outstanding or queued, the retransmission or persist timer watches the peer;
            // and a probe at SND.NXT - 1 is an acceptable segment, left unanswered, to a
            // receiver still missing earlier data, so counting it would reset a live peer
            // (Linux tcp_keepalive_timer skips probing the same way).
            self.keepalive.at = Some(now + ka.idle);
            return;
        }
        if self.keepalive.probes_sent >= ka.probes {
            // RFC 9293 §3.8.4: the peer is gone.
            self.rst_pending = Some(self.seq_for_control());
            self.terminate(CloseReason::Timeout);
            return;
        }
        self.keepalive.probes_sent += 1;
        self.keepalive.at = Some(now + ka.interval);
        self.counters.keepalive_probes += 1;
        self.send_keepalive = true;
    }
}

// -------------------------------------------------------------------------------------------
// Segment generation
// -------------------------------------------------------------------------------------------

/// What a retransmission is for (RFC 6675 §4 treats the rescue retransmission apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rexmit {
    /// NextSeg rules 1 and 3, fast retransmit, partial ACK: HighRxt moves.
    Normal,
    /// NextSeg rule 4: HighRxt stays.
    Rescue,
}

/// The earlier of two optional deadlines.
#[inline]
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Header bytes of the timestamps option as emitted (NOP, NOP, kind, length, 8 bytes).
const TS_OPTION_LEN: u32 = 12;

/// Bytes a set of options occupies in the header, exactly as the emitter lays them out
/// (NOP-aligned, RFC 9293 §3.1). Counting them without the NOPs undercounted TS + SACK by 4
/// and produced frames 4 bytes over the MTU during loss recovery.
fn options_len(opts: &TcpOptions) -> u32 {
    opts.buffer_len() as u32
}

impl Connection {
    /// The next segment to send, or `None` when there is nothing (more) to send now. The stack
    /// calls this until it returns `None` (or the device is full) after every input.
    pub fn poll_segment(&mut self, now: Instant) -> Option<OutSegment> {
        let out = self.next_segment(now);
        if let Some(seg) = &out {
            self.counters.segs_out += 1;
            self.counters.bytes_out += seg.payload.len() as u64;
            if let Some(&first) = seg.repr.options.sack_blocks.as_slice().first() {
                // RFC 2883 §4: the D-SACK is reported once, by a segment that goes out.
                self.ooo.on_dsack_sent(first);
            }
            if seg.repr.flags.ack() {
                self.ack_now = false;
                self.ack_at = None;
                self.last_ack_sent = seg.repr.ack;
                self.dupacks_owed = self.dupacks_owed.saturating_sub(1);
            }
            if !seg.payload.is_empty() || seg.repr.flags.syn() || seg.repr.flags.fin() {
                self.last_send = now;
            }
        }
        self.arm_timers(now);
        out
    }

    fn next_segment(&mut self, now: Instant) -> Option<OutSegment> {
        if let Some(seq) = self.rst_pending.take() {
            return Some(self.rst_segment(seq));
        }
        match self.state {
            State::Closed => return None,
            State::SynSent | State::SynReceived => {
                if self.snd_nxt == self.iss {
                    return Some(self.syn_segment(now));
                }
                // Data may not go out before the handshake completes.
                return self.ack_segment_if_due(now);
            }
            State::TimeWait => return self.ack_segment_if_due(now),
            _ => {}
        }
        if let Some(seq) = self.rexmit_now.take() {
            if seq.ge(self.snd_una) && seq.lt(self.snd_max) {
                if let Some(seg) = self.retransmit_at(now, seq, u32::MAX, Rexmit::Normal) {
                    return Some(seg);
                }
            }
        }
        if core::mem::take(&mut self.send_window_probe) {
            if let Some(seg) = self.window_probe(now) {
                return Some(seg);
            }
        }
        if core::mem::take(&mut self.send_keepalive) {
            // RFC 9293 §3.8.4: a keepalive is an ACK with SEG.SEQ = SND.NXT - 1 and no data.
            let seq = self.snd_nxt - 1u32;
            return Some(self.segment(now, seq, TcpFlags::ACK, IoVec::new()));
        }
        if self.recovery.is_some() && self.sack_ok {
            // RFC 6675 §5 (C): while pipe < cwnd, send what NextSeg chooses.
            if self.sb.pipe() >= self.cc.cwnd() {
                return self.ack_segment_if_due(now);
            }
            let can_send_new = self.sndq.end().gt(self.snd_nxt)
                && (self.snd_una + self.snd_wnd).gt(self.snd_nxt)
                && self.snd_nxt == self.snd_max;
            match self.sb.next_seg(can_send_new) {
                Some(NextSeg::Retransmit { start, len }) => {
                    if let Some(seg) = self.retransmit_at(now, start, len, Rexmit::Normal) {
                        return Some(seg);
                    }
                }
                Some(NextSeg::NewData) => {}
                None => {
                    // RFC 6675 §4 rule 4: one rescue retransmission per recovery.
                    if let Some((start, len)) = self.sb.rescue_seg() {
                        if let Some(seg) = self.retransmit_at(now, start, len, Rexmit::Rescue) {
                            if let Some(recover) = self.recovery {
                                self.sb.set_rescue_rxt(recover);
                            }
                            return Some(seg);
                        }
                    }
                    return self.ack_segment_if_due(now);
                }
            }
        }
        if let Some(seg) = self.next_data_segment(now) {
            return Some(seg);
        }
        self.ack_segment_if_due(now)
    }

    /// Options for a non-SYN segment: timestamps and, when we hold out-of-order data or a
    /// duplicate to report, SACK blocks (RFC 2018 §4, RFC 2883).
    fn data_options(&mut self, now: Instant) -> TcpOptions {
        let mut opts = TcpOptions::default();
        if let Some(ts) = self.ts {
            opts.timestamps = Some(Timestamps {
                tsval: self.ts_clock(now, ts.offset),
                tsecr: ts.recent,
            });
        }
        // Without out-of-order data, a pending D-SACK or blocks still being reported the scan
        // would find nothing and change nothing: skip it (the common, in-order case).
        if self.sack_ok && self.ooo.has_sack_info() {
            // With timestamps at most 3 blocks fit in 40 bytes of options.
            let max = if opts.timestamps.is_some() {
                3
            } else {
                SackBlocks::MAX
            };
            let mut buf = [(SeqNum(0), SeqNum(0)); SackBlocks::MAX];
            // The D-SACK stays pending until a segment carrying it is sent (poll_segment):
            // options are also built for segments that end up not being sent.
            let n = self
                .ooo
                .sack_blocks_keeping_dsack(self.rcv_nxt, &mut buf[..max]);
            for &(l, r) in &buf[..n] {
                opts.sack_blocks.push(l, r);
            }
        }
        opts
    }

    /// RFC 7323 §5.4: a 1 ms timestamp clock with a random per-connection offset.
    fn ts_clock(&self, now: Instant, offset: u32) -> u32 {
        ((now.as_nanos() / 1_000_000) as u32).wrapping_add(offset)
    }

    /// The window to advertise, never moving the right edge left (RFC 9293 §3.8.6.2.2,
    /// RFC 7323 §2.4) and growing it only in steps of min(rcv_buf/2, MSS) (receiver SWS
    /// avoidance, RFC 9293 §3.8.6.2.2).
    fn advertise_window(&mut self, syn: bool) -> u16 {
        let cur_edge = self.rcv_nxt + self.rcv_wnd();
        let threshold = (self.cfg.rcv_buf / 2).min(self.snd_mss).max(1);
        let edge = if self.rcv_adv.lt(self.rcv_nxt)
            || (cur_edge.gt(self.rcv_adv) && cur_edge - self.rcv_adv >= threshold)
        {
            cur_edge
        } else {
            self.rcv_adv
        };
        let wnd = edge - self.rcv_nxt;
        if syn {
            // RFC 7323 §2.2: the window in a SYN or SYN-ACK is never scaled.
            let field = wnd.min(u32::from(u16::MAX));
            self.rcv_adv = self.rcv_nxt + field;
            return field as u16;
        }
        let shift = self.rcv_wscale;
        // RFC 7323 §2.4: the scaled field is rounded down, so the announced right edge never
        // passes the buffer's free space. Rounding up let RCV.ADV creep past it by up to
        // 2^shift - 1 octets on every ACK after RCV.NXT moved by a non-multiple of 2^shift,
        // and the peer filled the receive queue beyond rcv_buf. When this shows an edge a
        // little left of RCV.ADV (the window seems to shrink by < 2^shift), RCV.ADV stays:
        // RFC 7323 §2.4 (1) "the receiver MUST honor, as in window, any segment that would
        // have been in window for any ACK sent by the receiver".
        let field = (wnd >> shift).min(u32::from(u16::MAX));
        let announced = self.rcv_nxt + (field << shift);
        if announced.gt(self.rcv_adv) || self.rcv_adv.lt(self.rcv_nxt) {
            self.rcv_adv = announced;
        }
        debug_assert!(
            !self.rcv_adv.gt(self.rcv_nxt) || self.rcv_adv - self.rcv_nxt <= self.rcv_wnd(),
            "RCV.ADV beyond the receive buffer"
        );
        field as u16
    }

    /// Build a segment with ACK, window and options filled in.
    fn segment(
        &mut self,
        now: Instant,
        seq: SeqNum,
        flags: TcpFlags,
        payload: IoVec,
    ) -> OutSegment {
        let options = self.data_options(now);
        self.segment_with(now, seq, flags, payload, options)
    }

    fn segment_with(
        &mut self,
        _now: Instant,
        seq: SeqNum,
        flags: TcpFlags,
        payload: IoVec,
        options: TcpOptions,
    ) -> OutSegment {
        let window = self.advertise_window(flags.syn());
        let repr = TcpRepr {
            src_port: self.tuple.local.port(),
            dst_port: self.tuple.remote.port(),
            seq,
            ack: if flags.ack() { self.rcv_nxt } else { SeqNum(0) },
            flags,
            window,
            urgent: 0,
            options,
        };
        OutSegment { repr, payload }
    }

    fn syn_segment(&mut self, now: Instant) -> OutSegment {
        let active = self.state == State::SynSent;
        let mut options = TcpOptions {
            mss: Some(self.cfg.mss),
            ..TcpOptions::default()
        };
        if active {
            if self.cfg.window_scaling {
                options.window_scale = Some(self.rcv_wscale);
            }
            options.sack_permitted = self.cfg.sack;
        } else {
            // RFC 7323 §1.3/§2.2, RFC 2018 §2: only answer options the peer offered.
            if self.wscale_ok {
                options.window_scale = Some(self.rcv_wscale);
            }
            options.sack_permitted = self.sack_ok;
        }
        if let Some(ts) = self.ts {
            let tsecr = if active { 0 } else { ts.recent };
            options.timestamps = Some(Timestamps {
                tsval: self.ts_clock(now, ts.offset),
                tsecr,
            });
        }
        let flags = if active {
            TcpFlags::SYN
        } else {
            TcpFlags::SYN | TcpFlags::ACK
        };
        let seg = self.segment_with(now, self.iss, flags, IoVec::new(), options);
        if self.retries == 0 && self.snd_max == self.iss {
            self.rtt_probe = Some((self.iss + 1u32, now));
        } else {
            // Karn: a retransmitted SYN gives no RTT sample.
            self.rtt_probe = None;
            self.counters.retransmits += 1;
        }
        self.snd_nxt = self.iss + 1u32;
        self.snd_max = self.snd_max.max(self.snd_nxt);
        seg
    }

    fn rst_segment(&mut self, seq: SeqNum) -> OutSegment {
        let repr = TcpRepr {
            src_port: self.tuple.local.port(),
            dst_port: self.tuple.remote.port(),
            seq,
            ack: SeqNum(0),
            flags: TcpFlags::RST,
            window: 0,
            urgent: 0,
            options: TcpOptions::default(),
        };
        OutSegment {
            repr,
            payload: IoVec::new(),
        }
    }

    fn ack_segment_if_due(&mut self, now: Instant) -> Option<OutSegment> {
        if !(self.ack_now || self.dupacks_owed > 0)
            || matches!(self.state, State::Closed | State::SynSent)
        {
            self.dupacks_owed = 0;
            return None;
        }
        let seq = self.seq_for_control();
        Some(self.segment(now, seq, TcpFlags::ACK, IoVec::new()))
    }

    /// Sequence number of segments without data (pure ACKs, RSTs). An RTO rewinds SND.NXT
    /// to SND.UNA (go-back-N) while the peer may already hold everything up to SND.MAX, so
    /// its RCV.NXT lies anywhere in [SND.UNA, SND.MAX]; a pure ACK below it fails the
    /// peer's acceptability test (RFC 9293 §3.10.7.4) and is dropped with its ACK field
    /// unread. SND.MAX is what RFC 9293 calls SND.NXT (BSD's tcp_output does the same for
    /// ACK-only segments). While probing a zero window the probe octet may not have been
    /// taken and the peer accepts only SEG.SEQ = RCV.NXT, so SND.NXT (= SND.UNA) is used.
    fn seq_for_control(&self) -> SeqNum {
        if self.snd_wnd == 0 {
            self.snd_nxt
        } else {
            self.snd_max
        }
    }

    /// Largest payload that fits in one segment next to `opts`.
    fn max_payload(&self, opts: &TcpOptions) -> u32 {
        // Data segments carry at most timestamps and SACK blocks; without blocks the length
        // is known without walking the options.
        let len = if opts.sack_blocks.is_empty() {
            if opts.timestamps.is_some() {
                TS_OPTION_LEN
            } else {
                0
            }
        } else {
            options_len(opts)
        };
        debug_assert_eq!(len, options_len(opts));
        self.snd_mss.saturating_sub(len).max(1)
    }

    /// Retransmit up to one MSS (and at most `limit` bytes) starting at `seq`.
    fn retransmit_at(
        &mut self,
        now: Instant,
        seq: SeqNum,
        limit: u32,
        kind: Rexmit,
    ) -> Option<OutSegment> {
        let opts = self.data_options(now);
        let data_end = self.sndq.end();
        let max = self.max_payload(&opts).min(limit);
        let payload = self.sndq.slice(seq, max as usize);
        let len = payload.len() as u32;
        let fin = self.fin_queued && seq + len == data_end && self.snd_max.gt(data_end);
        if len == 0 && !fin {
            return None;
        }
        let mut flags = TcpFlags::ACK;
        if fin {
            flags |= TcpFlags::FIN;
        }
        if seq + len == data_end {
            flags |= TcpFlags::PSH;
        }
        // RFC 6675 §4 NextSeg rule 4: the rescue retransmission MUST NOT update HighRxt
        // (it is tracked by RescueRxt alone).
        if kind == Rexmit::Normal {
            self.sb.on_retransmit(seq, len + u32::from(fin));
        }
        self.undo.on_retransmit(seq, seq + len + u32::from(fin));
        if self.undo.active && self.undo.rxt_tsval.is_none() {
            self.undo.rxt_tsval = opts.timestamps.map(|t| t.tsval);
        }
        self.rtt_probe = None;
        self.counters.retransmits += 1;
        Some(self.segment_with(now, seq, flags, payload, opts))
    }

    /// RFC 9293 §3.8.6.1: send one octet beyond a zero window (or the FIN if no data is left).
    fn window_probe(&mut self, now: Instant) -> Option<OutSegment> {
        if self.snd_wnd != 0 {
            return None;
        }
        let opts = self.data_options(now);
        let payload = self.sndq.slice(self.snd_una, 1);
        if payload.is_empty() {
            return None;
        }
        self.counters.window_probes += 1;
        // The probe octet is sent outside the window without advancing SND.NXT: if the peer
        // takes it, its ACK advances SND.UNA; if not, sending resumes from SND.UNA when the
        // window opens, so the octet is never skipped.
        self.snd_nxt = self.snd_una;
        let probe_end = self.snd_una + 1u32;
        if probe_end.gt(self.snd_max) {
            self.snd_max = probe_end;
            self.sb.on_transmit(self.snd_max);
        }
        self.rtt_probe = None;
        let seq = self.snd_una;
        Some(self.segment_with(now, seq, TcpFlags::ACK, payload, opts))
    }

    /// Bytes considered in the network, for the congestion-window check.
    fn flight(&self) -> u32 {
        match self.recovery {
            Some(_) if self.sack_ok => self.sb.pipe(),
            Some(_) => self.snd_max - self.snd_una,
            // RFC 6675 §5 (2) (limited transmit, RFC 3042, counted by pipe): before DupThresh
            // is reached, SACKed segments have left the network, so new data may go out while
            // cwnd - pipe >= 1 SMSS. Without it a window of a few segments with one loss
            // never collects DupThresh duplicate ACKs and waits for the RTO.
            None if self.sack_ok
                && self.snd_nxt == self.snd_max
                && self.sb.sacked_bytes() > 0
                && !self.sb.is_lost(self.snd_una) =>
            {
                self.sb.pipe()
            }
            None => self.snd_nxt - self.snd_una,
        }
    }

    fn next_data_segment(&mut self, now: Instant) -> Option<OutSegment> {
        if !matches!(
            self.state,
            State::Established
                | State::CloseWait
                | State::FinWait1
                | State::LastAck
                | State::Closing
        ) {
            return None;
        }
        let data_end = self.sndq.end();
        // RFC 6675 §5.1: after an RTO, do not resend what the peer SACKed. RFC 2018 §8: the
        // left edge (SND.UNA) MUST be resent whether or not it is SACKed.
        if self.sack_ok && self.snd_nxt.lt(self.snd_max) && self.snd_nxt != self.snd_una {
            let nxt = self.snd_nxt;
            if let Some(&(_, end)) = self
                .sb
                .ranges()
                .iter()
                .find(|&&(s, e)| nxt.ge(s) && nxt.lt(e))
            {
                self.snd_nxt = end.min(self.snd_max);
            }
        }
        let unsent = if data_end.gt(self.snd_nxt) {
            data_end - self.snd_nxt
        } else {
            0
        };
        let fin_due = self.fin_queued && self.snd_nxt == data_end;
        if unsent == 0 && !fin_due {
            return None;
        }
        // NewReno recovery sends only new data beyond `recover` (RFC 6582 §3.2 step 4).
        if self.recovery.is_some() && !self.sack_ok && self.snd_nxt.lt(self.snd_max) {
            return None;
        }
        let flight = self.flight();
        // RFC 5681 §4.1: after an idle period longer than the RTO, restart from the
        // restart window.
        if flight == 0 {
            self.cc.on_idle_restart(
                now,
                now.saturating_duration_since(self.last_send),
                self.rtt.rto(),
            );
        }
        let cwnd = match self.recovery {
            Some(_) if !self.sack_ok => self.inflation.window(self.cc.cwnd(), self.snd_mss),
            _ => self.cc.cwnd(),
        };
        let cwnd_room = cwnd.saturating_sub(flight);
        let wnd_edge = self.snd_una + self.snd_wnd;
        let wnd_room = if wnd_edge.gt(self.snd_nxt) {
            wnd_edge - self.snd_nxt
        } else {
            0
        };
        let opts = self.data_options(now);
        let max_payload = self.max_payload(&opts);
        let len = unsent.min(max_payload).min(cwnd_room).min(wnd_room);
        if len == 0 && !(fin_due && unsent == 0) {
            return None;
        }
        if len < unsent && len < max_payload && flight > 0 {
            // RFC 9293 §3.8.6.2.1 sender SWS avoidance: with more data queued, a partial
            // segment waits for ACKs to open the window, unless it fills at least half the
            // largest window the peer ever offered. A byte-counted cwnd would otherwise leave
            // a runt at the end of every flight.
            let big_enough = len == wnd_room && len >= self.max_snd_wnd / 2;
            if !big_enough {
                return None;
            }
        }
        // RFC 9293 §3.7.4 Nagle (off by default): hold a small segment while data is unacked.
        if self.cfg.nagle && len < max_payload && flight > 0 && !fin_due {
            return None;
        }
        let seq = self.snd_nxt;
        let payload = self.sndq.slice(seq, len as usize);
        let fin = self.fin_queued && seq + len == data_end;
        let mut flags = TcpFlags::ACK;
        if seq + len == data_end && len > 0 {
            flags |= TcpFlags::PSH;
        }
        if fin {
            flags |= TcpFlags::FIN;
        }
        let is_rexmit = seq.lt(self.snd_max);
        self.snd_nxt = seq + len + u32::from(fin);
        if self.snd_nxt.gt(self.snd_max) {
            self.snd_max = self.snd_nxt;
            self.sb.on_transmit(self.snd_max);
        }
        if is_rexmit {
            self.sb.on_retransmit(seq, len + u32::from(fin));
            self.undo.on_retransmit(seq, seq + len + u32::from(fin));
            self.counters.retransmits += 1;
            self.rtt_probe = None;
        } else if self.rtt_probe.is_none() && self.retries == 0 {
            self.rtt_probe = Some((self.snd_nxt, now));
        }
        Some(self.segment_with(now, seq, flags, payload, opts))
    }
}

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
            .map(|z| (z.len(), super::seq::fnv1a(z)))
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
        put!(
            self.syn_retransmitted,
            self.rtt_probe,
            self.rto_at,
            self.persist_at
        );
        put!(
            self.persist_backoff,
            self.retries,
            self.last_send,
            self.last_rcv
        );
        put!(
            self.last_wnd_field,
            self.ack_now,
            self.dupacks_owed,
            self.ack_at
        );
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
            self.wscale_ok
        );
        put!(
            self.tw_at,
            self.orphaned,
            self.fin_wait2_at,
            self.rst_pending
        );
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
