//! Egress: connections' segments and queued control frames out through `poll_transmit`,
//! next-hop resolution (ARP requests), and the header writers. Every frame's Ethernet and
//! IPv4 headers come from one place, [`Stack::emit_ethernet`] / [`Stack::emit_eth_ipv4`].

use super::StackDrop;
use super::{Owner, Stack, ETH_LEN, IP_LEN, MAX_HEADER_LEN};
use crate::context::Rng;
use crate::tables::neighbour::Resolution;
use crate::tcp::conn::{FourTuple, OutSegment};
use crate::time::Instant;
use crate::wire::checksum::{self, Accumulator};
use crate::wire::tcp::kind as tcp_kind;
use crate::wire::Timestamps;
use crate::wire::{
    ArpOperation, ArpPacket, ArpRepr, ChecksumCaps, EtherType, EthernetAddress, EthernetFrame,
    EthernetRepr, Icmpv4Message, Icmpv4Packet, IpProtocol, Ipv4Packet, Ipv4Repr, TcpFlags,
    TcpPacket, TcpRepr,
};
use core::net::Ipv4Addr;
use zbuf::{IoVec, Zbuf};

/// A frame ready for the device: `header()` bytes followed by `payload` (zero copy).
#[derive(Clone)]
pub struct Transmit {
    header: [u8; MAX_HEADER_LEN],
    header_len: u8,
    /// The payload: references into application or received buffers.
    pub payload: IoVec,
    /// Offload metadata for the device.
    pub offload: TxOffload,
}

impl core::fmt::Debug for Transmit {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Transmit")
            .field("header_len", &self.header_len)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

/// What the device must finish in hardware (when the stack left checksums to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TxOffload {
    /// Ethernet header length.
    pub l2_len: u8,
    /// IP header length (0 for ARP).
    pub l3_len: u8,
    /// TCP/ICMP header length.
    pub l4_len: u8,
    /// The device must fill the IPv4 header checksum.
    pub ipv4_checksum: bool,
    /// The device must fill the TCP checksum (the pseudo-header sum is already in place).
    pub tcp_checksum: bool,
}

impl Transmit {
    fn new() -> Self {
        Transmit {
            header: [0; MAX_HEADER_LEN],
            header_len: 0,
            payload: IoVec::new(),
            offload: TxOffload::default(),
        }
    }

    /// The header bytes (Ethernet, IP, TCP/ICMP/ARP).
    pub fn header(&self) -> &[u8] {
        &self.header[..usize::from(self.header_len)]
    }

    /// The header bytes, writable: for impairment stages and tests that alter a frame
    /// after the stack built it (the soak's corruption). Nothing is recomputed: a change
    /// after the stack filled its checksums leaves them wrong, which is the point there.
    pub fn header_mut(&mut self) -> &mut [u8] {
        &mut self.header[..usize::from(self.header_len)]
    }

    /// Frame length in bytes.
    pub fn len(&self) -> usize {
        usize::from(self.header_len) + self.payload.len()
    }

    /// Whether the frame is empty (never, for frames the stack emits).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole frame in one buffer. This copies: it is for tests and slow paths.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(self.header());
        for c in self.payload.chunks() {
            v.extend_from_slice(c);
        }
        v
    }
}

impl<R: Rng> Stack<R> {
    /// The IPv4 header of a datagram this stack sends (the configured TTL, RFC 9293
    /// MUST-49; the connection template's is set in [`HeaderTemplate::new`]).
    fn ipv4_out(&self, src: Ipv4Addr, dst: Ipv4Addr, proto: IpProtocol, len: usize) -> Ipv4Repr {
        let mut ip = Ipv4Repr::new(src, dst, proto, len);
        ip.ttl = self.cfg.ttl;
        ip
    }

    // ---------------------------------------------------------------------------------------
    // Transmit path
    // ---------------------------------------------------------------------------------------

    /// The next frame to send, or `None`. Call until `None` after every batch of input.
    ///
    /// Inlined test first: every burst ends with a call that finds nothing (and r2c's
    /// loop makes one on every idle iteration), which should not pay for the frame
    /// builder's prologue. The frames of a burst being cut come first, from a function of
    /// their own (no prologue of the frame builder either).
    #[must_use]
    #[inline]
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        if !self.run.is_idle() {
            return self.poll_run_frame();
        }
        if self.ctl.is_empty() && self.dirty.is_empty() {
            return None;
        }
        self.poll_transmit_slow(now)
    }

    /// [`poll_transmit`](Self::poll_transmit)'s next frame of the burst being cut.
    #[inline(never)]
    fn poll_run_frame(&mut self) -> Option<Transmit> {
        self.counters.frames_out += 1;
        self.counters.burst_frames += 1;
        Some(self.run.next_frame(&self.cfg.caps))
    }

    /// [`poll_transmit`](Self::poll_transmit) when a control frame or a connection waits
    /// (and no burst is being cut).
    #[inline(never)]
    fn poll_transmit_slow(&mut self, now: Instant) -> Option<Transmit> {
        debug_assert!(self.run.is_idle());
        if let Some(t) = self.ctl.pop_front() {
            self.counters.frames_out += 1;
            return Some(t);
        }
        let burst = u32::from(self.cfg.tcp.send_burst);
        while let Some(&idx) = self.dirty.front() {
            let gen = self.slots[idx as usize].gen;
            let Some(e) = self.slots[idx as usize].entry.as_deref_mut() else {
                self.dirty.pop_front();
                continue;
            };
            if self.holding_acks && e.held.is_none() && e.conn.owes_pure_ack() {
                // Its ACK waits for the rest of the burst (`hold_acks`). Unmarked: any
                // other output it gets before the release (data, a reset, a timer's)
                // lists it again and goes at once, carrying the ACK.
                e.dirty = false;
                self.dirty.pop_front();
                self.held_acks.push((idx, gen));
                continue;
            }
            let next_hop = e.next_hop;
            // The segment is built in this slot (no move of header and io-vector out of
            // the connection), or is the one parked for ARP.
            let mut seg = OutSegment::default();
            // (`held` is tested before it is taken: taking a `None` still moves the slot.)
            let parked = e.held.is_some();
            // An established connection's lone ACK (`poll_pure_ack`): after it the
            // connection has nothing to send (no `nothing_to_send` test below).
            let mut ack_only = false;
            let got = if parked && !e.conn.is_closed() {
                seg = e.held.take().expect("tested above");
                true
            } else {
                // A connection closed while parked (it gave up, or was aborted) sends
                // nothing more: its held segment goes, or it would wait for ARP forever,
                // never reclaimed.
                if parked {
                    e.held = None;
                }
                if e.conn.poll_pure_ack(now, &mut seg) {
                    ack_only = true;
                    true
                } else {
                    // Every retransmission is made here: the stack-wide total is kept as
                    // they are made, so reading it does not walk the connections.
                    let before = e.conn.counters.retransmits;
                    let got = e.conn.poll_burst_general(now, &mut seg, burst);
                    self.counters.tcp_retransmits += e.conn.counters.retransmits - before;
                    got
                }
            };
            if !got {
                e.dirty = false;
                self.dirty.pop_front();
                let reclaim = e.conn.is_closed() && e.owner != Owner::App;
                self.unmap_if_closed(idx);
                self.schedule_timer(idx);
                if reclaim {
                    self.free_slot(idx);
                }
                continue;
            }
            let cached = e
                .hop_mac
                .filter(|c| c.epoch == self.nb_epoch && now < c.until)
                .map(|c| c.mac);
            // The common case keeps the entry in hand (no second slot lookup); a next hop
            // without a fresh cached MAC is resolved first.
            let (e, mac) = match cached {
                Some(mac) => (e, mac),
                None => {
                    // A closed connection's last segment (its RST) is not worth an ARP
                    // request: it is dropped below when the MAC is unknown.
                    let mac = if e.conn.is_closed() {
                        self.lookup_mac(now, next_hop)
                    } else {
                        self.resolve(now, next_hop)
                    };
                    let fresh = self.hop_mac_of(next_hop, now);
                    let e = self.slots[idx as usize]
                        .entry
                        .as_deref_mut()
                        .expect("present");
                    e.hop_mac = fresh;
                    match mac {
                        Some(mac) => (e, mac),
                        None if e.conn.is_closed() => {
                            // A closed connection's last segment (its RST) does not wait
                            // for ARP: dropped (RSTs are never resent), and the connection,
                            // still first on the dirty list, is reclaimed on the next turn.
                            drop(seg);
                            continue;
                        }
                        None => {
                            // Park the connection (holding its segment) until ARP answers.
                            e.held = Some(seg);
                            e.dirty = false;
                            self.dirty.pop_front();
                            let w = self.arp_wait.entry(next_hop).or_default();
                            // Parked again by its own timer: listed once.
                            if !w.contains(&idx) {
                                w.push(idx);
                            }
                            self.schedule_timer(idx);
                            if !self.nb_failed.is_empty() {
                                self.fail_parked(now);
                            }
                            if let Some(t) = self.ctl.pop_front() {
                                self.counters.frames_out += 1;
                                return Some(t);
                            }
                            continue;
                        }
                    }
                }
            };
            self.counters.frames_out += 1;
            e.ip_ident = e.ip_ident.wrapping_add(1);
            let ident = e.ip_ident;
            // A burst: this call sends its first segment, the next calls the rest from
            // `self.run` (the IP identifications they take are reserved now).
            let piece = seg.burst_piece;
            if piece != 0 {
                let frames = (seg.payload.len() as u32).div_ceil(piece);
                e.ip_ident = e.ip_ident.wrapping_add((frames - 1) as u16);
            }
            // The connection's header template, (re)built when the next hop's MAC is not
            // the one it was made for.
            if e.tmpl.as_ref().is_none_or(|t| t.dst_mac() != mac) {
                let ip = (self.cfg.ttl, e.dscp);
                e.tmpl = Some(HeaderTemplate::new(self.cfg.mac, mac, e.conn.tuple(), ip));
            }
            // The last segment of the burst: leave the dirty list now rather than on one
            // more `poll_segment` that would find nothing (its timer work is done).
            if ack_only || e.conn.nothing_to_send() {
                debug_assert!(e.conn.nothing_to_send());
                e.dirty = false;
                self.dirty.pop_front();
            }
            // Sending armed the retransmission timer and the probe timeout: the timer
            // queue learns them now, even if the driver stops polling before this
            // connection's burst is out (r2c does when its transmit queue is full).
            super::slots::schedule_entry(&mut self.timers, e, idx, gen);
            let caps = self.cfg.caps;
            #[cfg(debug_assertions)]
            self.check_template(idx, &seg, mac, ident);
            #[cfg(debug_assertions)]
            let e = self.slots[idx as usize].entry.as_deref().expect("present");
            let tmpl = e.tmpl.as_ref().expect("built above");
            if piece != 0 {
                // (The payload moved out of `seg`: nothing of it is dropped after the
                // call, which then writes the frame into the return slot.)
                return Some(
                    self.run
                        .start(tmpl, &seg.repr, seg.payload, piece, ident, &caps),
                );
            }
            // Built in the return slot (no move of the frame).
            if ack_only && !caps.tcp.tx() {
                // The fast path's ACK has no option but timestamps (when they are on).
                if let Some(ts) = seg.repr.options.timestamps {
                    return Some(tmpl.build_ts(&seg.repr, ts, seg.payload, ident, &caps));
                }
            }
            return Some(tmpl.build(&seg.repr, seg.payload, ident, &caps));
        }
        // A control frame queued while the connections were served (none is, today) must
        // not wait behind a `None`: the driver stops polling at it.
        let t = self.ctl.pop_front()?;
        self.counters.frames_out += 1;
        Some(t)
    }

    /// Debug builds: the frame built from connection `idx`'s template is byte for byte
    /// (and in its offload metadata) the one [`Stack::build_tcp`] makes.
    #[cfg(debug_assertions)]
    fn check_template(&self, idx: u32, seg: &OutSegment, mac: EthernetAddress, ident: u16) {
        if let Some(piece) = seg.burst_piece() {
            // A burst: its first frame.
            let mut first = seg.clone();
            first.payload.truncate(piece as usize);
            first.repr.flags = burst_flags(seg.repr.flags);
            first.burst_piece = 0;
            return self.check_template(idx, &first, mac, ident);
        }
        let e = self.slots[idx as usize].entry.as_deref().expect("present");
        let tuple = e.conn.tuple();
        let tmpl = e.tmpl.as_ref().expect("built");
        let (payload, dscp) = (seg.payload.clone(), e.dscp);
        let reference = self.build_tcp_ident(&seg.repr, payload, tuple, mac, (ident, dscp));
        let t = tmpl.build(&seg.repr, seg.payload.clone(), ident, &self.cfg.caps);
        assert_eq!(t.to_vec(), reference.to_vec(), "template frame");
        assert_eq!(t.offload, reference.offload, "template offload");
    }

    /// The connections parked for next hops whose resolution just failed
    /// ([`Resolution::Failed`]) hear of it: a handshake ends (its application sees
    /// [`crate::tcp::CloseReason::HostUnreachable`]), others keep a soft error and wait on
    /// for the new resolution.
    #[cold]
    fn fail_parked(&mut self, now: Instant) {
        while let Some(ip) = self.nb_failed.pop() {
            let Some(mut waiting) = self.arp_wait.remove(&ip) else {
                continue;
            };
            waiting.retain(|&idx| {
                let Some(e) = self.slots[idx as usize].entry.as_deref_mut() else {
                    return false;
                };
                if !e.conn.on_neighbour_unreachable() {
                    return true;
                }
                self.counters.unreachable_aborts += 1;
                // Its segment stays parked until its next turn drops it (closed).
                self.after_activity(idx, now);
                false
            });
            if waiting.is_empty() {
                // No one waits for it any more: its ARP retry clock goes too (as when the
                // last parked connection is freed).
                self.arp_sent.remove(&ip);
            } else {
                self.arp_wait.insert(ip, waiting);
            }
        }
    }

    /// The MAC for `ip` if the neighbour table has one (no ARP request).
    fn lookup_mac(&mut self, now: Instant, ip: Ipv4Addr) -> Option<EthernetAddress> {
        match self.nb_update(ip, |t| t.lookup(ip, now)) {
            Resolution::Resolved(mac) | Resolution::Stale(mac) => Some(mac),
            Resolution::Pending | Resolution::Unknown => None,
            Resolution::Failed => {
                // The connections parked on `ip` learn it where they park
                // (`fail_parked`); the resolution starts over.
                self.counters.arp_failures += 1;
                self.nb_failed.push(ip);
                None
            }
        }
    }

    /// The MAC for `ip`, sending an ARP request (rate limited) when it is unknown.
    pub(super) fn resolve(&mut self, now: Instant, ip: Ipv4Addr) -> Option<EthernetAddress> {
        if let Some(mac) = self.lookup_mac(now, ip) {
            return Some(mac);
        }
        let due = self
            .arp_sent
            .get(&ip)
            .is_none_or(|&at| now.saturating_duration_since(at) >= self.cfg.arp_retry);
        if due {
            let _ = self.nb_update(ip, |t| t.start_resolution(ip, now));
            self.arp_sent.insert(ip, now);
            let req = ArpRepr {
                operation: ArpOperation::Request,
                sender_hardware_addr: self.cfg.mac,
                // RFC 826: the sender is one of our addresses; the one on the target's
                // subnet (Linux's `arp_announce = 1` choice), else the primary.
                sender_protocol_addr: self.addrs.source_for(ip),
                target_hardware_addr: EthernetAddress([0; 6]),
                target_protocol_addr: ip,
            };
            if self.queue_arp(req, EthernetAddress::BROADCAST) {
                self.counters.arp_requests += 1;
            }
        }
        None
    }

    /// Writes the Ethernet header, from our MAC to `dst_mac`, at the start of `buf`: the one
    /// link-layer header writer of every frame the stack sends.
    fn emit_ethernet(&self, buf: &mut [u8], dst_mac: EthernetAddress, ethertype: EtherType) {
        let mut eth = EthernetFrame::new_unchecked(buf);
        EthernetRepr {
            src_addr: self.cfg.mac,
            dst_addr: dst_mac,
            ethertype,
        }
        .emit(&mut eth);
    }

    /// Writes the Ethernet and IPv4 headers of a datagram into `buf[..ETH_LEN + IP_LEN]`:
    /// the next IP identification goes into `ip`, its header checksum as `caps` say (the
    /// device fills it when `caps.ipv4` is not done in software). The transport header and
    /// payload follow at `ETH_LEN + IP_LEN`.
    fn emit_eth_ipv4(
        &mut self,
        buf: &mut [u8],
        dst_mac: EthernetAddress,
        mut ip: Ipv4Repr,
        caps: &ChecksumCaps,
    ) {
        self.emit_ethernet(buf, dst_mac, EtherType::Ipv4);
        self.ip_ident = self.ip_ident.wrapping_add(1);
        ip.ident = self.ip_ident;
        let mut ip_pkt = Ipv4Packet::new_unchecked(&mut buf[ETH_LEN..ETH_LEN + IP_LEN]);
        ip.emit(&mut ip_pkt, caps);
    }

    /// Wrap a TCP segment of no connection (a RST, a SYN cookie's SYN-ACK) in IPv4 and
    /// Ethernet. Only headers are written; the payload stays where it is. Its IPv4
    /// identification is 0: the datagram has DF set, so the field has no use (RFC 6864
    /// §4.1), and a counter here would make luna an idle-scan zombie (RFC 7739 §5).
    #[inline]
    pub(super) fn build_tcp(
        &self,
        repr: &TcpRepr,
        payload: IoVec,
        tuple: FourTuple,
        dst_mac: EthernetAddress,
    ) -> Transmit {
        self.build_tcp_ident(repr, payload, tuple, dst_mac, (0, 0))
    }

    /// [`build_tcp`](Self::build_tcp) with the IP identification and DiffServ codepoint
    /// given (the reference the connections' [`HeaderTemplate`] frames are checked against
    /// in debug builds).
    fn build_tcp_ident(
        &self,
        repr: &TcpRepr,
        payload: IoVec,
        tuple: FourTuple,
        dst_mac: EthernetAddress,
        (ident, dscp): (u16, u8),
    ) -> Transmit {
        // No `repr.emitted()` copy: `header_len` and `emit_header` already send at most
        // `sack_capacity` blocks, which is all `emitted` would change.
        let tcp_hlen = repr.header_len();
        let tcp_len = tcp_hlen + payload.len();
        let len = ETH_LEN + IP_LEN + tcp_hlen;
        let caps = self.cfg.caps;
        let (src, dst) = (*tuple.local.ip(), *tuple.remote.ip());
        let mut ip = self.ipv4_out(src, dst, IpProtocol::Tcp, tcp_len);
        // RFC 1191 §3: TCP sets DF for path MTU discovery.
        ip.dont_frag = true;
        ip.ident = ident;
        ip.dscp = dscp;
        // Built in place: the payload moves into the frame once (no empty io-vector made
        // and dropped), and the header array is written where the caller receives it.
        let mut header = [0; MAX_HEADER_LEN];
        {
            let buf = &mut header[..len];
            self.emit_ethernet(buf, dst_mac, EtherType::Ipv4);
            let mut ip_pkt = Ipv4Packet::new_unchecked(&mut buf[ETH_LEN..ETH_LEN + IP_LEN]);
            ip.emit(&mut ip_pkt, &caps);
            let mut tcp = TcpPacket::new_unchecked(&mut buf[ETH_LEN + IP_LEN..]);
            repr.emit_header(&mut tcp);
            if caps.tcp.tx() {
                let mut acc = Accumulator::new();
                for chunk in payload.chunks() {
                    acc.add_bytes(chunk);
                }
                tcp.fill_checksum_split(src, dst, &acc);
            } else {
                tcp.fill_pseudo_header_checksum(src, dst, tcp_len);
            }
        }
        Transmit {
            header,
            header_len: len as u8,
            payload,
            offload: TxOffload {
                l2_len: ETH_LEN as u8,
                l3_len: IP_LEN as u8,
                l4_len: tcp_hlen as u8,
                ipv4_checksum: !caps.ipv4.tx(),
                tcp_checksum: !caps.tcp.tx(),
            },
        }
    }

    /// Whether one more control frame may be queued; if not, counted as
    /// [`StackDrop::CtlFull`].
    pub(super) fn ctl_room(&mut self) -> bool {
        if self.ctl.len() < super::CTL_QUEUE_MAX {
            return true;
        }
        self.counters.drop(StackDrop::CtlFull);
        false
    }

    /// Queues an ARP packet to `dst` as a control frame; false (counted) when the control
    /// queue is full.
    pub(super) fn queue_arp(&mut self, arp: ArpRepr, dst: EthernetAddress) -> bool {
        if !self.ctl_room() {
            return false;
        }
        let mut t = Transmit::new();
        let len = ETH_LEN + 28;
        {
            let buf = &mut t.header[..len];
            self.emit_ethernet(buf, dst, EtherType::Arp);
            let mut pkt = ArpPacket::new_unchecked(&mut buf[ETH_LEN..]);
            arp.emit(&mut pkt);
        }
        t.header_len = len as u8;
        t.offload.l2_len = ETH_LEN as u8;
        self.ctl.push_back(t);
        true
    }

    /// Queue an ICMP echo reply whose data is `payload`, by reference to the request; false
    /// (counted) when the control queue is full.
    pub(super) fn queue_echo_reply(
        &mut self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        dst_mac: EthernetAddress,
        ident: u16,
        seq_no: u16,
        payload: Zbuf,
    ) -> bool {
        if !self.ctl_room() {
            return false;
        }
        let mut t = Transmit::new();
        let icmp_len = 8 + payload.len();
        let len = ETH_LEN + IP_LEN + 8;
        let ip = self.ipv4_out(src, dst, IpProtocol::Icmp, icmp_len);
        {
            let buf = &mut t.header[..len];
            // The IPv4 checksum is always computed here: the echo reply's offload metadata
            // asks the device for nothing.
            self.emit_eth_ipv4(buf, dst_mac, ip, &ChecksumCaps::software());
            let mut icmp = Icmpv4Packet::new_unchecked(&mut buf[ETH_LEN + IP_LEN..]);
            icmp.set_msg_type(Icmpv4Message::EchoReply);
            icmp.set_msg_code(0);
            icmp.set_echo_ident(ident);
            icmp.set_echo_seq_no(seq_no);
            icmp.set_checksum(0);
            let mut acc = Accumulator::new();
            acc.add_bytes(&buf[ETH_LEN + IP_LEN..len]);
            acc.add_bytes(&payload);
            let sum = acc.checksum();
            Icmpv4Packet::new_unchecked(&mut buf[ETH_LEN + IP_LEN..]).set_checksum(sum);
        }
        t.header_len = len as u8;
        t.payload.push(payload);
        t.offload = TxOffload {
            l2_len: ETH_LEN as u8,
            l3_len: IP_LEN as u8,
            l4_len: 8,
            ..TxOffload::default()
        };
        self.ctl.push_back(t);
        true
    }
}

/// The frames of a burst still to send (`TcpConfig::send_burst`): a connection's
/// segment of several MSS cut into one frame per `poll_transmit`, each with the same
/// header but its own sequence number and IP identification; PSH and FIN only on the
/// last. It owns what it sends (the template and payload references), so the frames go
/// out as queued ones would whatever happens to the connection meanwhile.
#[derive(Default)]
pub(super) struct SegRun {
    tmpl: HeaderTemplate,
    /// The header of the segments; `seq` and `flags` are set per frame.
    repr: TcpRepr,
    /// Sequence number of the next frame's first byte.
    seq: crate::wire::SeqNum,
    /// Payload bytes still to send; the run is over when it is 0.
    left: usize,
    /// The payload still to send when it is one buffer (a message written at once, or
    /// the body after a header buffer the first frame took: the common cases): each
    /// frame's piece is cut off it, and its io-vector made, without the io-vector's
    /// locate and drain.
    one: Option<Zbuf>,
    /// Otherwise the payload still to send.
    rest: IoVec,
    /// Payload bytes per frame.
    piece: usize,
    /// The next frame's IP identification.
    ident: u16,
    /// The burst's flags, which the last frame carries.
    last_flags: TcpFlags,
    /// The segments' timestamps when they are of the template's kind
    /// ([`HeaderTemplate::build_ts`]).
    ts: Option<Timestamps>,
}

impl SegRun {
    /// Whether no burst is being sent.
    #[inline]
    pub(super) fn is_idle(&self) -> bool {
        self.left == 0
    }

    /// Takes the burst of header `repr` and payload `first` (of `piece` bytes per frame;
    /// the run is idle) and returns its first frame, with IP identification `ident`; the
    /// rest follow from [`next_frame`](Self::next_frame). Out of line: the one-segment
    /// path pays nothing for it.
    #[inline(never)]
    fn start(
        &mut self,
        tmpl: &HeaderTemplate,
        repr: &TcpRepr,
        mut first: IoVec,
        piece: u32,
        ident: u16,
        caps: &ChecksumCaps,
    ) -> Transmit {
        debug_assert!(self.is_idle(), "a burst while one is being sent");
        let piece = piece as usize;
        self.left = first.len() - piece;
        // The rest is one buffer when the first frame's cut lies in the payload's last
        // buffer: a message written at once, or a small header buffer and a body (the
        // reply of knb's server, and many others). The rest by reference to that buffer;
        // the first frame keeps the segments' own references.
        match first.segments() {
            // (One buffer tested first: through the general test below it cost 13
            // instructions more per burst; as it is, 2.)
            [z] => {
                self.one = Some(z.slice(piece..));
                first.truncate(piece);
            }
            [.., last] if piece >= first.len() - last.len() => {
                self.one = Some(last.slice(piece - (first.len() - last.len())..));
                first.truncate(piece);
            }
            _ => {
                self.one = None;
                self.rest = first.split_off(piece);
            }
        }
        self.last_flags = repr.flags;
        self.repr = *repr;
        self.repr.flags = burst_flags(self.last_flags);
        self.tmpl = *tmpl;
        self.seq = repr.seq + piece as u32;
        self.piece = piece;
        self.ident = ident.wrapping_add(1);
        self.ts = HeaderTemplate::ts_only(&self.repr, caps);
        match self.ts {
            Some(ts) => tmpl.build_ts(&self.repr, ts, first, ident, caps),
            None => tmpl.build(&self.repr, first, ident, caps),
        }
    }

    /// Drops the frames still to send if they come from local address `ip` (which is
    /// being removed: a frame from an address no longer ours would be spoofed).
    pub(super) fn cancel_from(&mut self, ip: Ipv4Addr) {
        if !self.is_idle() && self.tmpl.source() == ip {
            self.rest = IoVec::new();
            self.one = None;
            self.left = 0;
        }
    }

    /// The next frame; the caller checked that the run is not idle.
    fn next_frame(&mut self, caps: &ChecksumCaps) -> Transmit {
        let n = self.piece.min(self.left);
        let last = n == self.left;
        if last {
            self.repr.flags = self.last_flags;
        }
        self.left -= n;
        let payload = if last {
            match self.one.take() {
                Some(z) => IoVec::from(z),
                None => core::mem::take(&mut self.rest),
            }
        } else {
            match &mut self.one {
                Some(z) => IoVec::from(z.split_to(n)),
                None => self.rest.split_to(n),
            }
        };
        self.repr.seq = self.seq;
        self.seq += n as u32;
        let ident = self.ident;
        self.ident = ident.wrapping_add(1);
        match self.ts {
            Some(ts) => self.tmpl.build_ts(&self.repr, ts, payload, ident, caps),
            None => self.tmpl.build(&self.repr, payload, ident, caps),
        }
    }
}

/// The flags of a burst's frames before the last: PSH and FIN belong to the last.
fn burst_flags(flags: TcpFlags) -> TcpFlags {
    TcpFlags(flags.0 & !(TcpFlags::PSH.0 | TcpFlags::FIN.0))
}

/// Length of a [`HeaderTemplate`]'s Ethernet and IPv4 headers.
const TMPL_LEN: usize = ETH_LEN + IP_LEN;

/// Length of the TCP part of a [`HeaderTemplate`]: the fixed header and the timestamps
/// option (NOP, NOP, kind, length, two values), what every segment of a connection with
/// timestamps carries outside loss recovery.
const TCP_TMPL_LEN: usize = 20 + 12;

/// The whole template: Ethernet, IPv4 and TCP with the timestamps option.
const FULL_TMPL_LEN: usize = TMPL_LEN + TCP_TMPL_LEN;

/// A connection's Ethernet + IPv4 header, precomputed once its next hop's MAC is known:
/// addresses, EtherType, version/IHL, DSCP/ECN, DF, TTL and protocol are fixed for the
/// connection, so a segment copies these 34 bytes and patches the total length, the IP
/// identification and, when done in software, the header checksum, which is the fixed
/// part's sum plus those two words (RFC 1071 §2: the sum is commutative and associative).
/// The TCP pseudo-header sum's address and protocol part is kept too; only the TCP length
/// is added per segment. The TCP header follows in the same array, as far as it is fixed:
/// the ports, the data offset and the option kinds of a segment whose only option is
/// timestamps (any other option set is written over it). Rebuilt when the next hop's MAC
/// changes; our MAC, addresses and checksum capabilities do not change for a connection's
/// life. Every frame built from a template is compared with [`Stack::build_tcp`]'s in debug
/// builds (the test suite).
#[derive(Clone, Copy)]
pub(super) struct HeaderTemplate {
    /// The frame's first bytes; the Ethernet destination (bytes 0..6) is the next hop the
    /// template was built for ([`dst_mac`](Self::dst_mac)).
    bytes: [u8; FULL_TMPL_LEN],
    /// Folded sum of the IPv4 header with total length, ident and checksum zero.
    ip_sum: u16,
    /// Folded pseudo-header sum (addresses, protocol) with a zero TCP length.
    pseudo_sum: u16,
}

impl Default for HeaderTemplate {
    /// All zero: the placeholder of an idle [`SegRun`], never built from.
    fn default() -> Self {
        HeaderTemplate {
            bytes: [0; FULL_TMPL_LEN],
            ip_sum: 0,
            pseudo_sum: 0,
        }
    }
}

impl HeaderTemplate {
    /// The template for `tuple`'s segments from `src_mac` to `dst_mac`, sent with the TTL
    /// and DiffServ codepoint `(ttl, dscp)`.
    pub(super) fn new(
        src_mac: EthernetAddress,
        dst_mac: EthernetAddress,
        tuple: FourTuple,
        (ttl, dscp): (u8, u8),
    ) -> Self {
        let (src, dst) = (*tuple.local.ip(), *tuple.remote.ip());
        let mut bytes = [0u8; FULL_TMPL_LEN];
        EthernetRepr {
            src_addr: src_mac,
            dst_addr: dst_mac,
            ethertype: EtherType::Ipv4,
        }
        .emit(&mut EthernetFrame::new_unchecked(&mut bytes[..ETH_LEN]));
        let mut ip = Ipv4Repr::new(src, dst, IpProtocol::Tcp, 0);
        // RFC 1191 §3: TCP sets DF for path MTU discovery.
        ip.dont_frag = true;
        ip.ident = 0;
        ip.ttl = ttl;
        ip.dscp = dscp;
        let mut pkt = Ipv4Packet::new_unchecked(&mut bytes[ETH_LEN..TMPL_LEN]);
        ip.emit(&mut pkt, &ChecksumCaps::offloaded());
        pkt.set_total_len(0);
        let ip_sum = checksum::data(&bytes[ETH_LEN..TMPL_LEN]);
        // The TCP header of a segment with the timestamps option only; sequence and
        // acknowledgment numbers, flags, window, checksum and the option's values zero.
        const T: usize = TMPL_LEN;
        bytes[T..T + 2].copy_from_slice(&tuple.local.port().to_be_bytes());
        bytes[T + 2..T + 4].copy_from_slice(&tuple.remote.port().to_be_bytes());
        bytes[T + 12] = ((TCP_TMPL_LEN / 4) as u8) << 4;
        bytes[T + 20..T + 24].copy_from_slice(&TS_KINDS);
        HeaderTemplate {
            bytes,
            ip_sum,
            pseudo_sum: checksum::pseudo_header_v4(src, dst, u8::from(IpProtocol::Tcp), 0),
        }
    }

    /// The next hop the template was built for: its frames' Ethernet destination.
    #[inline]
    pub(super) fn dst_mac(&self) -> EthernetAddress {
        let mut m = [0; 6];
        m.copy_from_slice(&self.bytes[..6]);
        EthernetAddress(m)
    }

    /// The IPv4 source address of the template's frames.
    fn source(&self) -> Ipv4Addr {
        let at = ETH_LEN + 12;
        Ipv4Addr::new(
            self.bytes[at],
            self.bytes[at + 1],
            self.bytes[at + 2],
            self.bytes[at + 3],
        )
    }

    /// The frame of one segment with IP identification `ident`: the same bytes and offload
    /// metadata as [`Stack::build_tcp`] makes. Not inlined: as its own function it writes
    /// the frame into the caller's return slot. The usual segment (timestamps its only
    /// option, the TCP checksum left to the device) is built here with every write at a
    /// constant offset, so the header never lives in memory of its own (it is written
    /// where the caller receives it); any other goes to [`build_general`](Self::build_general).
    #[inline(never)]
    fn build(&self, repr: &TcpRepr, payload: IoVec, ident: u16, caps: &ChecksumCaps) -> Transmit {
        match Self::ts_only(repr, caps) {
            Some(ts) => self.build_ts_inlined(repr, ts, payload, ident, caps),
            None => self.build_general(repr, payload, ident, caps),
        }
    }

    /// [`build`](Self::build) of a segment known to be the template's kind (timestamps
    /// `ts` its only option, the TCP checksum left to the device): a burst's later frames
    /// and the pure-ACK fast path's ACK skip the test.
    #[inline(never)]
    fn build_ts(
        &self,
        repr: &TcpRepr,
        ts: Timestamps,
        payload: IoVec,
        ident: u16,
        caps: &ChecksumCaps,
    ) -> Transmit {
        debug_assert!(Self::ts_only(repr, caps) == Some(ts));
        self.build_ts_inlined(repr, ts, payload, ident, caps)
    }

    /// The timestamps of `repr` if it is a segment of the template's kind: timestamps its
    /// only option, the TCP checksum left to the device.
    #[inline(always)]
    fn ts_only(repr: &TcpRepr, caps: &ChecksumCaps) -> Option<Timestamps> {
        Self::ts_option_only(&repr.options).filter(|_| !caps.tcp.tx())
    }

    /// The timestamps of `opts` if they are its only option: the template's option set
    /// (`TcpOptions::emit`'s fast case).
    #[inline(always)]
    fn ts_option_only(opts: &crate::wire::TcpOptions) -> Option<Timestamps> {
        if opts.mss.is_none()
            && opts.window_scale.is_none()
            && !opts.sack_permitted
            && opts.sack_blocks.is_empty()
        {
            opts.timestamps
        } else {
            None
        }
    }

    /// Debug builds: `repr`'s ports are the template's, and it has no urgent data (luna
    /// sends none), so the template's fields stand for the segment's.
    #[inline(always)]
    fn debug_check_fixed_fields(&self, repr: &TcpRepr) {
        debug_assert_eq!(
            (repr.src_port, repr.dst_port, repr.urgent),
            (
                u16::from_be_bytes([self.bytes[TMPL_LEN], self.bytes[TMPL_LEN + 1]]),
                u16::from_be_bytes([self.bytes[TMPL_LEN + 2], self.bytes[TMPL_LEN + 3]]),
                0
            )
        );
    }

    /// The body of [`build`](Self::build) for the template's kind of segment.
    #[inline(always)]
    fn build_ts_inlined(
        &self,
        repr: &TcpRepr,
        ts: Timestamps,
        payload: IoVec,
        ident: u16,
        caps: &ChecksumCaps,
    ) -> Transmit {
        self.debug_check_fixed_fields(repr);
        let tcp_len = TCP_TMPL_LEN + payload.len();
        let total = u16::try_from(IP_LEN + tcp_len).expect("IPv4 datagram longer than 65535 bytes");
        let mut header = [0; MAX_HEADER_LEN];
        header[..FULL_TMPL_LEN].copy_from_slice(&self.bytes);
        // IPv4 total length, identification and (in software) checksum.
        const I: usize = ETH_LEN;
        header[I + 2..I + 4].copy_from_slice(&total.to_be_bytes());
        header[I + 4..I + 6].copy_from_slice(&ident.to_be_bytes());
        if caps.ipv4.tx() {
            let sum = checksum::add(checksum::add(self.ip_sum, total), ident);
            header[I + 10..I + 12].copy_from_slice(&(!sum).to_be_bytes());
        }
        // The TCP header (RFC 9293 §3.1): ports, data offset, option kinds and urgent
        // pointer come with the template.
        const T: usize = TMPL_LEN;
        header[T + 4..T + 8].copy_from_slice(&repr.seq.0.to_be_bytes());
        header[T + 8..T + 12].copy_from_slice(&repr.ack.0.to_be_bytes());
        header[T + 13] = repr.flags.0;
        header[T + 14..T + 16].copy_from_slice(&repr.window.to_be_bytes());
        // `tcp_len` < 65536 (checked above), so one word is the whole length.
        let sum = checksum::add(self.pseudo_sum, tcp_len as u16);
        header[T + 16..T + 18].copy_from_slice(&sum.to_be_bytes());
        header[T + 24..T + 28].copy_from_slice(&ts.tsval.to_be_bytes());
        header[T + 28..T + 32].copy_from_slice(&ts.tsecr.to_be_bytes());
        Transmit {
            header,
            header_len: FULL_TMPL_LEN as u8,
            payload,
            offload: TxOffload {
                l2_len: ETH_LEN as u8,
                l3_len: IP_LEN as u8,
                l4_len: TCP_TMPL_LEN as u8,
                ipv4_checksum: !caps.ipv4.tx(),
                tcp_checksum: true,
            },
        }
    }

    /// [`build`](Self::build) for any option set and checksum capabilities; inlined there
    /// (a separate call cost a software-checksum bulk sender about 30 instructions a frame).
    #[inline(always)]
    fn build_general(
        &self,
        repr: &TcpRepr,
        payload: IoVec,
        ident: u16,
        caps: &ChecksumCaps,
    ) -> Transmit {
        self.debug_check_fixed_fields(repr);
        let opts = &repr.options;
        let ts_only = Self::ts_option_only(opts);
        let tcp_hlen = if ts_only.is_some() {
            TCP_TMPL_LEN
        } else {
            repr.header_len()
        };
        let tcp_len = tcp_hlen + payload.len();
        let len = TMPL_LEN + tcp_hlen;
        let total = u16::try_from(IP_LEN + tcp_len).expect("IPv4 datagram longer than 65535 bytes");
        let mut header = [0; MAX_HEADER_LEN];
        header[..FULL_TMPL_LEN].copy_from_slice(&self.bytes);
        {
            let mut ip = Ipv4Packet::new_unchecked(&mut header[ETH_LEN..TMPL_LEN]);
            ip.set_total_len(total);
            ip.set_ident(ident);
            if caps.ipv4.tx() {
                let sum = checksum::add(checksum::add(self.ip_sum, total), ident);
                ip.set_checksum(!sum);
            }
        }
        // The TCP fixed header (RFC 9293 §3.1) at constant offsets of the fixed-size array
        // (no bounds checks per field), what `TcpRepr::emit_header` writes; ports and
        // urgent pointer come with the template, and the checksum field stays zero until
        // filled below.
        const T: usize = TMPL_LEN;
        header[T + 4..T + 8].copy_from_slice(&repr.seq.0.to_be_bytes());
        header[T + 8..T + 12].copy_from_slice(&repr.ack.0.to_be_bytes());
        header[T + 13] = repr.flags.0;
        header[T + 14..T + 16].copy_from_slice(&repr.window.to_be_bytes());
        if let Some(ts) = ts_only {
            // The option's kinds are in the template.
            header[T + 24..T + 28].copy_from_slice(&ts.tsval.to_be_bytes());
            header[T + 28..T + 32].copy_from_slice(&ts.tsecr.to_be_bytes());
        } else {
            header[T + 12] = ((tcp_hlen / 4) as u8) << 4;
            let written = opts.emit(&mut header[T + 20..len]);
            debug_assert_eq!(20 + written, tcp_hlen);
        }
        if caps.tcp.tx() {
            let mut acc = Accumulator::new();
            for chunk in payload.chunks() {
                acc.add_bytes(chunk);
            }
            TcpPacket::new_unchecked(&mut header[T..len])
                .fill_checksum_split_pseudo(self.pseudo_sum, &acc);
        } else {
            // `tcp_len` < 65536 (checked above), so one word is the whole length.
            let sum = checksum::add(self.pseudo_sum, tcp_len as u16);
            header[T + 16..T + 18].copy_from_slice(&sum.to_be_bytes());
        }
        Transmit {
            header,
            header_len: len as u8,
            payload,
            offload: TxOffload {
                l2_len: ETH_LEN as u8,
                l3_len: IP_LEN as u8,
                l4_len: tcp_hlen as u8,
                ipv4_checksum: !caps.ipv4.tx(),
                tcp_checksum: !caps.tcp.tx(),
            },
        }
    }
}

/// The timestamps option's first bytes as sent (RFC 7323 Appendix A's layout).
const TS_KINDS: [u8; 4] = [tcp_kind::NOP, tcp_kind::NOP, tcp_kind::TIMESTAMPS, 10];
