//! Stack-level counters: frames in and out, drops by reason, control-plane activity.

/// Why the stack dropped a frame before it reached a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StackDrop {
    /// Truncated or invalid at some layer, or a bad checksum.
    Malformed,
    /// Not addressed to our MAC or IP.
    NotForUs,
    /// An EtherType we do not handle.
    UnknownEthertype,
    /// An IP protocol we do not handle.
    UnknownProtocol,
    /// An IP fragment (reassembly is not implemented).
    Fragment,
    /// TCP segment for no connection and no listener (answered with RST).
    NoSocket,
    /// A segment a listener cannot use (RST, bare ACK without a valid cookie, no SYN,
    /// SYN+FIN).
    ListenInvalid,
    /// Listen backlog full and SYN cookies off.
    BacklogFull,
    /// Connection or neighbour table full.
    TableFull,
    /// No route to the peer.
    NoRoute,
    /// ICMP message we do not act on (or failed RFC 5927 validation).
    IcmpIgnored,
    /// From a broadcast, multicast, 0.0.0.0 or loopback source, to a broadcast or
    /// multicast address, or in a link-layer broadcast/multicast frame (RFC 1122 §3.2.1.3,
    /// §3.3.6, §4.2.3.10): never answered, not even with a RST or an echo reply.
    NonUnicast,
    /// A segment for no connection (what `NoSocket` or a listener's bad ACK counts) that
    /// got no RST because the stack-wide RST rate limit was exceeded
    /// (`StackConfig::rst_limit`).
    RstLimited,
    /// A control frame (ARP, echo reply, RST, cookie SYN-ACK) not made because
    /// [`CTL_QUEUE_MAX`](super::CTL_QUEUE_MAX) of them already wait for the device: a
    /// flood answered faster than the link takes the answers.
    CtlFull,
    /// A datagram with a loose or strict source route option (RFC 791 §3.1): luna
    /// interprets no options, so it cannot answer along the reversed route RFC 1122
    /// §3.2.2.6 and §4.2.3.8 require, and with the route not complete it is not the
    /// datagram's destination; dropped as RFC 7126 §4.3.3 / §4.4.3 recommend (Linux's
    /// `accept_source_route = 0`).
    SourceRouted,
}

impl StackDrop {
    /// Every reason, in a fixed order.
    pub const ALL: [StackDrop; 15] = [
        StackDrop::Malformed,
        StackDrop::NotForUs,
        StackDrop::UnknownEthertype,
        StackDrop::UnknownProtocol,
        StackDrop::Fragment,
        StackDrop::NoSocket,
        StackDrop::ListenInvalid,
        StackDrop::BacklogFull,
        StackDrop::TableFull,
        StackDrop::NoRoute,
        StackDrop::IcmpIgnored,
        StackDrop::NonUnicast,
        StackDrop::RstLimited,
        StackDrop::CtlFull,
        StackDrop::SourceRouted,
    ];

    /// A short stable name for reports.
    pub fn name(self) -> &'static str {
        match self {
            StackDrop::Malformed => "malformed",
            StackDrop::NotForUs => "not_for_us",
            StackDrop::UnknownEthertype => "unknown_ethertype",
            StackDrop::UnknownProtocol => "unknown_protocol",
            StackDrop::Fragment => "fragment",
            StackDrop::NoSocket => "no_socket",
            StackDrop::ListenInvalid => "listen_invalid",
            StackDrop::BacklogFull => "backlog_full",
            StackDrop::TableFull => "table_full",
            StackDrop::NoRoute => "no_route",
            StackDrop::IcmpIgnored => "icmp_ignored",
            StackDrop::NonUnicast => "non_unicast",
            StackDrop::RstLimited => "rst_limited",
            StackDrop::CtlFull => "ctl_full",
            StackDrop::SourceRouted => "source_routed",
        }
    }

    fn index(self) -> usize {
        StackDrop::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

/// Counters of one stack instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StackCounters {
    /// Frames handed to `handle_frame`.
    pub frames_in: u64,
    /// Frames returned by `poll_transmit`.
    pub frames_out: u64,
    /// Of `frames_out`, TCP segments cut from a burst after its first
    /// ([`crate::tcp::TcpConfig::send_burst`]): each is one pass of the connection's
    /// output logic that software segmentation saved.
    pub burst_frames: u64,
    /// Received TCP segments taken into a run after its first ([`super::Stack::handle_frames`]):
    /// each is one pass of a connection's input processing that receive coalescing saved.
    pub coalesced_segments: u64,
    /// Drops by reason, indexed like [`StackDrop::ALL`].
    pub drops: [u64; StackDrop::ALL.len()],
    /// ARP requests sent.
    pub arp_requests: u64,
    /// Address resolutions that got no answer in time (the neighbour is unreachable).
    pub arp_failures: u64,
    /// Connection attempts (SYN-SENT) aborted because their next hop did not answer ARP
    /// ([`crate::tcp::CloseReason::HostUnreachable`]).
    pub unreachable_aborts: u64,
    /// ARP replies sent.
    pub arp_replies: u64,
    /// ICMP echo replies sent.
    pub icmp_echo_replies: u64,
    /// Path MTU reductions applied.
    pub pmtu_updates: u64,
    /// Connection attempts (SYN-SENT) aborted by an ICMP protocol or port unreachable
    /// quoting their SYN (RFC 1122 §4.2.3.9).
    pub icmp_aborts: u64,
    /// RSTs sent for segments with no connection.
    pub rsts_sent: u64,
    /// Connections opened actively.
    pub active_opens: u64,
    /// Connections opened from a listener.
    pub passive_opens: u64,
    /// SYN-ACKs answered with a cookie.
    pub syn_cookies_sent: u64,
    /// Connections created from a valid cookie.
    pub syn_cookies_accepted: u64,
    /// TIME-WAIT connections replaced by a new SYN (RFC 6191).
    pub time_wait_reuses: u64,
    /// Listeners opened (also their generation counter).
    pub listeners_opened: u64,
    /// Connections aborted because their local address was removed
    /// ([`super::Stack::remove_address`]).
    pub address_aborts: u64,
    /// Segments retransmitted by this stack's connections (any cause; live and
    /// reclaimed), counted as they are made: `tcp_counters().retransmits` without a walk
    /// over every connection (r2c publishes it every few thousand iterations).
    pub tcp_retransmits: u64,
    /// Payload bytes TCP connections received again (below RCV.NXT, or over data held out
    /// of order), summed over connections: the first copy kept, these discarded
    /// (`Connection::dup_bytes_in`; the overlap attack's forged bytes land here).
    pub dup_bytes_in: u64,
    /// The most the stack held at once since it started or since the last
    /// [`super::Stack::reset_high_water`] (memory under load or attack).
    pub high_water: HighWater,
}

/// What the stack's connections hold at one moment ([`super::Stack::held`]): the figures
/// that bound its memory. Kept up to date whenever a connection changes (the stack syncs
/// each connection's share after every segment, timer and application call).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// Connection objects in the table: open, half-open, unaccepted, closing, TIME-WAIT
    /// (what `StackConfig::max_connections` bounds).
    pub connections: u64,
    /// Of those, connections listeners created whose handshake is not complete
    /// (SYN-RECEIVED; what the backlogs bound).
    pub half_open: u64,
    /// Of those, connections in TIME-WAIT.
    pub time_wait: u64,
    /// Bytes held out of order (received beyond RCV.NXT), over every connection.
    pub ooo_bytes: u64,
    /// Bytes received in order and not yet read by the application.
    pub rcvq_bytes: u64,
    /// Bytes in send queues (sent and unacknowledged, and not yet sent).
    pub sndq_bytes: u64,
    /// The memory behind the received data held, in order and out of order, over every
    /// connection (the sum of `Connection::recv_mem`: truesize, each buffer's whole
    /// object plus its metadata): what `StackConfig::rcv_mem_total` bounds, give or take
    /// one segment per connection. The out-of-order part is synced like the other
    /// figures; the receive queue's part is counted around the only calls that change it
    /// (segment input and the application's reads), as the change they made.
    pub rcv_mem: u64,
}

/// The most the stack held at once ([`StackCounters::high_water`]): each field of
/// [`Held`] at its own peak, and the most one connection held out of order (what
/// `TcpConfig`'s out-of-order bound caps).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HighWater {
    /// Peaks of [`Held`]'s fields (each its own; not one moment's).
    pub held: Held,
    /// The most out-of-order bytes one connection held.
    pub ooo_bytes_one_conn: u64,
}

impl HighWater {
    /// Raise each mark to `now`'s value where it is higher.
    pub fn raise(&mut self, now: &Held) {
        let h = &mut self.held;
        h.connections = h.connections.max(now.connections);
        h.half_open = h.half_open.max(now.half_open);
        h.time_wait = h.time_wait.max(now.time_wait);
        h.ooo_bytes = h.ooo_bytes.max(now.ooo_bytes);
        h.rcvq_bytes = h.rcvq_bytes.max(now.rcvq_bytes);
        h.sndq_bytes = h.sndq_bytes.max(now.sndq_bytes);
        h.rcv_mem = h.rcv_mem.max(now.rcv_mem);
    }

    /// `(name, value)` of every mark, in a fixed order (reports).
    pub fn fields(&self) -> [(&'static str, u64); 8] {
        let h = &self.held;
        [
            ("conns_hwm", h.connections),
            ("half_open_hwm", h.half_open),
            ("time_wait_hwm", h.time_wait),
            ("ooo_bytes_hwm", h.ooo_bytes),
            ("ooo_bytes_one_conn_hwm", self.ooo_bytes_one_conn),
            ("rcvq_bytes_hwm", h.rcvq_bytes),
            ("sndq_bytes_hwm", h.sndq_bytes),
            ("rcv_mem_hwm", h.rcv_mem),
        ]
    }
}

impl StackCounters {
    /// Count one drop.
    pub fn drop(&mut self, reason: StackDrop) {
        self.drops[reason.index()] += 1;
    }

    /// Drops counted under `reason`.
    pub fn drops(&self, reason: StackDrop) -> u64 {
        self.drops[reason.index()]
    }

    /// All drops.
    pub fn total_drops(&self) -> u64 {
        self.drops.iter().sum()
    }
}
