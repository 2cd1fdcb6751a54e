//! Counters per connection; the stack sums them and adds its own drop reasons.

/// Why a segment (or frame) was dropped. Every drop is counted under exactly one reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DropReason {
    /// Failed sequence acceptability (RFC 9293 §3.10.7.4 first check).
    OutOfWindow,
    /// Failed PAWS (RFC 7323 §5).
    Paws,
    /// ACK of data never sent or too old (RFC 5961 §5).
    BadAck,
    /// Segment without ACK in a synchronized state.
    NoAck,
    /// RST that did not exactly match RCV.NXT and was out of window (RFC 5961 §3).
    BadRst,
    /// Anything but a valid SYN-ACK or RST in SYN-SENT.
    SynSentInvalid,
    /// Out-of-order queue full.
    OooFull,
    /// Receive buffer full: data beyond the window.
    RcvBufFull,
    /// Data arrived after the application shut down reading, or after FIN.
    DataAfterFin,
    /// Receive memory: the buffers behind the held segments stayed at their bound
    /// (`TcpConfig::rcv_buf`, twice) after collapsing; the new segment was dropped before
    /// it was acknowledged, a loss the peer repairs (Linux: TCPRcvQDrop, TCPOFODrop).
    RcvMemory,
    /// Receive memory across connections: the segment fitted the connection's own bound
    /// but the stack's connections together held `StackConfig::rcv_mem_total`, and it
    /// was not an in-order segment for a connection with nothing left to read (which is
    /// always taken); dropped before it was acknowledged, a loss the peer repairs once
    /// applications read (Linux: `tcp_mem` over its hard limit, TCPRcvQDrop).
    RcvMemoryGlobal,
}

impl DropReason {
    /// Every reason, in a fixed order (for reports).
    pub const ALL: [DropReason; 11] = [
        DropReason::OutOfWindow,
        DropReason::Paws,
        DropReason::BadAck,
        DropReason::NoAck,
        DropReason::BadRst,
        DropReason::SynSentInvalid,
        DropReason::OooFull,
        DropReason::RcvBufFull,
        DropReason::DataAfterFin,
        DropReason::RcvMemory,
        DropReason::RcvMemoryGlobal,
    ];

    /// A short stable name for reports.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::OutOfWindow => "out_of_window",
            DropReason::Paws => "paws",
            DropReason::BadAck => "bad_ack",
            DropReason::NoAck => "no_ack",
            DropReason::BadRst => "bad_rst",
            DropReason::SynSentInvalid => "syn_sent_invalid",
            DropReason::OooFull => "ooo_full",
            DropReason::RcvBufFull => "rcv_buf_full",
            DropReason::DataAfterFin => "data_after_fin",
            DropReason::RcvMemory => "rcv_memory",
            DropReason::RcvMemoryGlobal => "rcv_memory_global",
        }
    }

    fn index(self) -> usize {
        DropReason::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

/// Counters of one connection. `#[repr(C)]`: the five every segment updates come first and
/// share a cache line (issue 13: the connection's lines are what 5,000 connections miss).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[repr(C)]
pub struct ConnCounters {
    /// Segments received and processed (including dropped ones).
    pub segs_in: u64,
    /// Segments sent.
    pub segs_out: u64,
    /// Payload bytes delivered in order.
    pub bytes_in: u64,
    /// Payload bytes sent, including retransmissions.
    pub bytes_out: u64,
    /// Segments handled by header prediction (the ESTABLISHED fast path) instead of the full
    /// RFC 9293 §3.10.7.4 processing. Included in `segs_in`.
    pub fast_path_hits: u64,
    /// Segments retransmitted (any cause).
    pub retransmits: u64,
    /// Retransmission timeouts.
    pub rtos: u64,
    /// Fast retransmits (dupack or SACK triggered).
    pub fast_retransmits: u64,
    /// Loss recoveries entered with SACK information (RFC 6675).
    pub sack_recoveries: u64,
    /// Challenge ACKs sent (RFC 5961).
    pub challenge_acks: u64,
    /// Challenge ACKs suppressed by the per-connection rate limit.
    pub challenge_acks_suppressed: u64,
    /// ACKs not sent in reply to unacceptable segments without data (rate limit).
    pub oow_acks_suppressed: u64,
    /// D-SACKs received (RFC 2883).
    pub dsacks: u64,
    /// Recoveries found spurious (every retransmission D-SACKed, RFC 3708) and undone.
    pub spurious_recoveries: u64,
    /// Times the peer reneged on SACKed data (RFC 2018 §8) and the scoreboard was cleared.
    pub sack_renegings: u64,
    /// Zero-window probes sent.
    pub window_probes: u64,
    /// Keepalive probes sent.
    pub keepalive_probes: u64,
    /// Tail loss probes sent (RFC 8985 §7).
    pub tlp_probes: u64,
    /// Losses found by RACK-TLP (RFC 8985) before DupThresh or the RTO found them: fast
    /// recoveries started by the reordering timer (§6.2: data SACKed above a hole for
    /// longer than the reordering window) or by a SACKed tail loss probe, and losses a
    /// retransmitted probe repaired itself (§7.4). Each reduced the congestion window.
    pub rack_recoveries: u64,
    /// Receive buffers released by copying the bytes held in them into compact buffers,
    /// when the memory behind the held segments reached its bound (tiny segments, each in
    /// a whole receive buffer; Linux: TCPRcvCollapsed). Full-sized segments never are.
    pub rcv_collapsed: u64,
    /// Bytes copied doing so.
    pub rcv_collapsed_bytes: u64,
    /// Out-of-order bytes given up (highest first) so that an in-order segment could be
    /// held when collapsing did not make room for it (Linux: OfoPruned). They had been
    /// SACKed: reneging, which RFC 2018 §8 permits; the peer sends them again.
    pub rcv_pruned: u64,
    /// Drops by reason, indexed like [`DropReason::ALL`].
    pub drops: [u64; DropReason::ALL.len()],
}

impl ConnCounters {
    /// Count one drop.
    pub fn drop(&mut self, reason: DropReason) {
        self.drops[reason.index()] += 1;
    }

    /// Drops counted under `reason`.
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason.index()]
    }

    /// Add another connection's counters into these.
    pub fn accumulate(&mut self, o: &ConnCounters) {
        self.segs_in += o.segs_in;
        self.segs_out += o.segs_out;
        self.bytes_in += o.bytes_in;
        self.bytes_out += o.bytes_out;
        self.retransmits += o.retransmits;
        self.rtos += o.rtos;
        self.fast_retransmits += o.fast_retransmits;
        self.sack_recoveries += o.sack_recoveries;
        self.challenge_acks += o.challenge_acks;
        self.challenge_acks_suppressed += o.challenge_acks_suppressed;
        self.oow_acks_suppressed += o.oow_acks_suppressed;
        self.dsacks += o.dsacks;
        self.spurious_recoveries += o.spurious_recoveries;
        self.sack_renegings += o.sack_renegings;
        self.window_probes += o.window_probes;
        self.keepalive_probes += o.keepalive_probes;
        self.tlp_probes += o.tlp_probes;
        self.rack_recoveries += o.rack_recoveries;
        self.rcv_collapsed += o.rcv_collapsed;
        self.rcv_collapsed_bytes += o.rcv_collapsed_bytes;
        self.rcv_pruned += o.rcv_pruned;
        self.fast_path_hits += o.fast_path_hits;
        for (a, b) in self.drops.iter_mut().zip(o.drops.iter()) {
            *a += b;
        }
    }
}
