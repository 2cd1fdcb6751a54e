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
}

impl StackDrop {
    /// Every reason, in a fixed order.
    pub const ALL: [StackDrop; 13] = [
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
    /// Drops by reason, indexed like [`StackDrop::ALL`].
    pub drops: [u64; StackDrop::ALL.len()],
    /// ARP requests sent.
    pub arp_requests: u64,
    /// ARP replies sent.
    pub arp_replies: u64,
    /// ICMP echo replies sent.
    pub icmp_echo_replies: u64,
    /// Path MTU reductions applied.
    pub pmtu_updates: u64,
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
