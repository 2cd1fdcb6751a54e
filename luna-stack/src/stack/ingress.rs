//! Ingress: Ethernet demux, ARP reception, IPv4 validation, ICMP, and TCP demux to a
//! connection (or to a listener, or a RST).

use super::{Owner, Stack, StackDrop, ETH_LEN};
use crate::context::Rng;
use crate::tcp::conn::{Connection, Disposition, FourTuple};
use crate::tcp::{SeqNum, State};
use crate::time::Instant;
use crate::wire::{
    ArpOperation, ArpPacket, ArpRepr, ChecksumCaps, EtherType, EthernetAddress, EthernetFrame,
    EthernetRepr, Icmpv4DstUnreachable, Icmpv4Packet, Icmpv4Repr, IpProtocol, Ipv4Packet, Ipv4Repr,
    TcpFlags, TcpOptions, TcpPacket, TcpRepr,
};
use core::net::{Ipv4Addr, SocketAddrV4};
use zbuf::{IoVec, Zbuf};

impl<R: Rng> Stack<R> {
    // ---------------------------------------------------------------------------------------
    // Receive path
    // ---------------------------------------------------------------------------------------

    /// Process one received Ethernet frame. Anything malformed is dropped and counted.
    pub fn handle_frame(&mut self, now: Instant, frame: Zbuf) {
        self.counters.frames_in += 1;
        // Header prediction below TCP: a frame whose Ethernet and IPv4 fields are those of
        // the last TCP frame that passed every check here and in `on_ipv4` passes them
        // again (see `RxPrefix`), so it goes straight to TCP.
        if let Some((src, dst, l4_end)) = self.rx_prefix.matches(&frame, &self.cfg.caps) {
            let src_mac = self.rx_prefix.src_mac();
            // And above it, inside `handle_frames`: a segment whose TCP header is the held
            // run's next (see `RunHead`) joins the run as `on_tcp` would join it.
            if self.rx_run.count != 0 {
                let at = (src, dst, l4_end, src_mac);
                if let Some(flags) = self.rx_run.continued_by(&frame, at, &self.cfg.caps) {
                    let mut payload = frame;
                    payload.truncate(l4_end);
                    payload.advance(RX_L4 + RunHead::LEN);
                    self.rx_run.push_flags(flags, payload);
                    return;
                }
            }
            return self.on_tcp(now, (src, dst), frame, RX_L4, l4_end, src_mac);
        }
        // `parse` checks the length (as `new_checked` would).
        let eth = EthernetFrame::new_unchecked(&frame[..]);
        let Ok(eth_repr) = EthernetRepr::parse(&eth) else {
            return self.counters.drop(StackDrop::Malformed);
        };
        // Broadcast and multicast frames are taken for ARP (broadcast only) and for IPv4,
        // which must see the link-layer flag to discard them (RFC 1122 §3.3.6).
        let l2_multicast = eth_repr.dst_addr.is_multicast();
        if eth_repr.dst_addr != self.cfg.mac && !l2_multicast {
            return self.counters.drop(StackDrop::NotForUs);
        }
        // A group address is never a frame's source (IEEE 802): a reply would go to the
        // group, and the address would be learnt as a neighbour's (RFC 1812 §3.3.2).
        // Dropped like any other non-unicast source. Our own MAC as the source is a frame
        // we sent, seen again (a loop, or on a NIC shared with the kernel, the kernel's
        // own broadcasts): not for us.
        if !eth_repr.src_addr.is_unicast() {
            return self.counters.drop(StackDrop::NonUnicast);
        }
        if eth_repr.src_addr == self.cfg.mac {
            return self.counters.drop(StackDrop::NotForUs);
        }
        match eth_repr.ethertype {
            EtherType::Arp if eth_repr.dst_addr.is_broadcast() || !l2_multicast => {
                self.settle_rx_run(now);
                self.on_arp(now, &frame[ETH_LEN..])
            }
            EtherType::Arp => self.counters.drop(StackDrop::NotForUs),
            EtherType::Ipv4 => self.on_ipv4(now, frame, eth_repr.src_addr, l2_multicast),
            _ => self.counters.drop(StackDrop::UnknownEthertype),
        }
    }

    /// [`handle_frame`](Self::handle_frame) for a burst of frames, in order, with receive
    /// coalescing (as Linux's GRO, in software): consecutive in-order data segments of one
    /// connection with the same ACK, window and options are taken by one pass of its
    /// input processing when header prediction accepts them all (the send-side twin of
    /// [`TcpConfig::send_burst`](crate::tcp::TcpConfig::send_burst)). Every frame is
    /// still parsed and checked on its own; what the connection does — the bytes it
    /// delivers, the ACKs and windows it sends, its timers — is what frame-by-frame
    /// input gives (each segment still counts for the delayed-ACK rule, and is announced
    /// with its own `Readable`). [`StackCounters::coalesced_segments`] counts the segments
    /// taken after a run's first.
    ///
    /// [`StackCounters::coalesced_segments`]: super::StackCounters::coalesced_segments
    pub fn handle_frames<I>(&mut self, now: Instant, frames: I)
    where
        I: IntoIterator<Item = Zbuf>,
        I::IntoIter: ExactSizeIterator,
    {
        let mut frames = frames.into_iter();
        while let Some(f) = frames.next() {
            // A run starts only where another frame follows (one alone gains nothing).
            self.rx_coalesce = frames.len() != 0;
            self.handle_frame(now, f);
        }
        self.rx_coalesce = false;
        self.settle_rx_run(now);
    }

    /// Hands a held run (only inside `handle_frames`) to its connection before input that
    /// is not its continuation: ARP and ICMP here, other TCP segments in `on_tcp` (frames
    /// dropped as malformed change nothing and leave it held).
    #[inline]
    fn settle_rx_run(&mut self, now: Instant) {
        if self.rx_run.count != 0 {
            self.flush_rx_run(now);
        }
    }

    /// Hands the held run of received segments to its connection: one pass of header
    /// prediction's processing for all of them, or (prediction declined) one ordinary
    /// pass per segment, as frame-by-frame input would have.
    #[inline(never)]
    pub(super) fn flush_rx_run(&mut self, now: Instant) {
        let r = &mut self.rx_run;
        let (count, idx, src, mac, delivered) = (r.count, r.idx, r.src_ip, r.src_mac, r.bytes);
        r.count = 0;
        let mut seg = r.seg;
        let mut pieces = core::mem::take(&mut r.pieces);
        if count == 1 {
            let payload = pieces.pop().expect("one piece");
            self.rx_run.pieces = pieces;
            return self.conn_input(now, idx, src, mac, delivered, |c, room| {
                c.on_segment_path(now, &seg, payload, room)
            });
        }
        let (mut merged, mut readable) = (false, 0);
        self.conn_input(now, idx, src, mac, delivered, |c, room| {
            let r = c.on_segment_run(now, &mut seg, &mut pieces, &mut readable, room);
            merged = r.1;
            r
        });
        if merged {
            self.counters.coalesced_segments += u64::from(count - 1);
        }
        // One `Readable` per segment that made the connection readable, as frame-by-frame
        // input announces them (the activity above routed the first): an application
        // that reads one buffer per event still gets every one.
        if readable > 1 {
            let slot = &self.slots[idx as usize];
            if slot.entry.as_deref().is_some_and(|e| e.owner == Owner::App) {
                let h = super::SocketHandle { idx, gen: slot.gen };
                for _ in 1..readable {
                    self.events.push_back(super::Event::Readable(h));
                }
            }
        }
        // The vector's storage goes back for the next run.
        pieces.clear();
        self.rx_run.pieces = pieces;
    }

    /// A neighbour resolved outside the stack — netlink-sync mirroring the kernel's
    /// table when the kernel owns ARP: stores `ip` → `mac` as a permanent entry and
    /// wakes the connections parked on `ip` at once, as an ARP reply would (changing the
    /// table through [`Stack::neighbours_mut`] leaves them parked until their next
    /// timer). `Err` when the table is full.
    pub fn neighbour_resolved(
        &mut self,
        ip: Ipv4Addr,
        mac: EthernetAddress,
    ) -> Result<(), crate::tables::TableFull> {
        let r = self.nb_update(ip, |t| t.insert_permanent(ip, mac));
        self.arp_sent.remove(&ip);
        if let Some(waiting) = self.arp_wait.remove(&ip) {
            for idx in waiting {
                self.mark_dirty(idx);
            }
        }
        r
    }

    /// The counterpart of [`Stack::neighbour_resolved`]: the kernel dropped `ip`'s entry
    /// (aged out, failed, deleted); connections using it resolve it again.
    pub fn neighbour_removed(&mut self, ip: Ipv4Addr) {
        self.nb_update(ip, |t| {
            t.remove(ip);
        });
    }

    /// The route table changed (netlink-sync mirroring the kernel's routes through
    /// [`Stack::routes_mut`]): every connection looks its next hop up again. A
    /// connection whose route now goes through another next hop sends its next segment
    /// there (its cached MAC is dropped; parked on the old next hop, it is woken and
    /// resolves the new one). A connection whose destination has no route any more keeps
    /// its next hop (TCP's timers decide its fate, as for a kernel socket whose route
    /// vanished). Returns how many connections moved.
    pub fn routes_changed(&mut self) -> usize {
        let mut moved = 0;
        for idx in 0..self.slots.len() {
            let Some(e) = self.slots[idx].entry.as_deref_mut() else {
                continue;
            };
            let dst = *e.conn.tuple().remote.ip();
            let Some((hop, _)) = self.routes.next_hop(dst) else {
                continue;
            };
            if hop == e.next_hop {
                continue;
            }
            let old = core::mem::replace(&mut e.next_hop, hop);
            e.hop_mac = None;
            let parked = e.held.is_some();
            moved += 1;
            // It waits for the old next hop no more (parked there, or still listed after
            // it was released some other way): off its list, and its ARP retry clock goes
            // when no one else waits there; or an answer from it would wake whatever
            // reuses the slot, and the maps would keep every next hop ever left this way
            // (`free_slot` only looks at the current one).
            if let Some(w) = self.arp_wait.get_mut(&old) {
                w.retain(|&x| x != idx as u32);
                if w.is_empty() {
                    self.arp_wait.remove(&old);
                    self.arp_sent.remove(&old);
                }
            }
            if parked {
                self.mark_dirty(idx as u32);
            }
        }
        moved
    }

    pub(super) fn on_arp(&mut self, now: Instant, data: &[u8]) {
        let Ok(pkt) = ArpPacket::new_checked(data) else {
            return self.counters.drop(StackDrop::Malformed);
        };
        let Ok(arp) = ArpRepr::parse(&pkt) else {
            return self.counters.drop(StackDrop::Malformed);
        };
        // Any of our addresses is a target we answer for (and a sender no one else may use).
        let me = arp.target_protocol_addr;
        let for_us = self.addrs.contains(me);
        if self.addrs.contains(arp.sender_protocol_addr) || !arp.sender_hardware_addr.is_unicast() {
            return self.counters.drop(StackDrop::Malformed);
        }
        // RFC 826 "Packet Reception": merge the sender into the table; create an entry only
        // when we are the target. A sender address that is no host's is not merged: an RFC
        // 5227 probe's is 0.0.0.0 precisely so that no cache learns it (§2.1.1), and a
        // broadcast or multicast one names no neighbour (the probe is still answered).
        let sender = arp.sender_protocol_addr;
        let sha = arp.sender_hardware_addr;
        let host = !(is_martian(sender) || self.addrs.is_invalid_source(sender));
        if host {
            let learned = self.nb_update(sender, |t| match arp.operation {
                ArpOperation::Reply if for_us => t.confirm(sender, sha, now),
                _ => t.learn(sender, sha, now, for_us),
            });
            if learned.is_err() {
                self.counters.drop(StackDrop::TableFull);
            }
        }
        self.arp_sent.remove(&sender);
        if let Some(waiting) = self.arp_wait.remove(&sender) {
            for idx in waiting {
                self.mark_dirty(idx);
            }
        }
        if arp.operation == ArpOperation::Request && for_us && self.cfg.answer_arp {
            let reply = ArpRepr {
                operation: ArpOperation::Reply,
                sender_hardware_addr: self.cfg.mac,
                sender_protocol_addr: me,
                target_hardware_addr: arp.sender_hardware_addr,
                target_protocol_addr: sender,
            };
            if self.queue_arp(reply, arp.sender_hardware_addr) {
                self.counters.arp_replies += 1;
            }
        }
    }

    /// `l2_multicast`: the frame was sent to a link-layer broadcast or multicast address.
    /// An IPv4 datagram in `frame` (owned: TCP narrows it to the payload in place).
    pub(super) fn on_ipv4(
        &mut self,
        now: Instant,
        frame: Zbuf,
        src_mac: EthernetAddress,
        l2_multicast: bool,
    ) {
        // `parse` checks every length `new_checked` would (the header, IHL, Total Length).
        let pkt = Ipv4Packet::new_unchecked(&frame[ETH_LEN..]);
        let Ok(ip) = Ipv4Repr::parse(&pkt, &self.cfg.caps) else {
            return self.counters.drop(StackDrop::Malformed);
        };
        // RFC 1122 §3.2.1.3: a datagram whose source is a broadcast or multicast address,
        // {0, host} (0/8: only legal while a host learns its address, which luna never
        // answers), a subnet's network address, or loopback (127/8 never appears on a wire)
        // MUST be discarded silently; so is one from our own address (a spoofed LAND
        // packet: Linux's martian source).
        // RFC 1122 §4.2.3.10: a SYN to a broadcast or multicast address MUST be discarded
        // (luna has nothing else that takes broadcasts): no SYN-ACK, no RST, no echo reply
        // (RFC 1122 §3.2.2.6 lets broadcast echoes go unanswered; answering one, or a forged
        // broadcast source, would make luna a smurf amplifier).
        let src = ip.src_addr;
        if is_martian(src) || self.addrs.is_invalid_source(src) || self.is_non_unicast(ip.dst_addr)
        {
            return self.counters.drop(StackDrop::NonUnicast);
        }
        if !self.addrs.contains(ip.dst_addr) {
            return self.counters.drop(StackDrop::NotForUs);
        }
        // RFC 1122 §3.3.6: a datagram received in a link-layer broadcast (or multicast) frame
        // without an IP broadcast or multicast destination SHOULD be discarded silently; for
        // TCP that is RFC 1122 §4.2.3.10's rule again.
        if l2_multicast {
            return self.counters.drop(StackDrop::NonUnicast);
        }
        // RFC 1122 §3.2.2.6 and §4.2.3.8: replies to a source-routed datagram MUST take the
        // route reversed, and luna interprets no options; with the route not complete we
        // are not even its destination (RFC 1122 §3.3.5). Dropped, as RFC 7126 §4.3.3 /
        // §4.4.3 recommend (Linux: `accept_source_route = 0`); options are rare, so the
        // common header pays one compare.
        if pkt.header_len() > crate::wire::ipv4::HEADER_LEN {
            match pkt.source_routed() {
                Ok(false) => {}
                Ok(true) => return self.counters.drop(StackDrop::SourceRouted),
                Err(_) => return self.counters.drop(StackDrop::Malformed),
            }
        }
        if ip.is_fragment() {
            // Reassembly is not implemented: TCP never sends fragments (DF + PMTU), so a
            // fragment is counted and dropped rather than buffered.
            return self.counters.drop(StackDrop::Fragment);
        }
        let l4 = ETH_LEN + pkt.header_len();
        let l4_end = l4 + ip.payload_len;
        match ip.protocol {
            IpProtocol::Tcp => {
                if l4 == RX_L4 {
                    self.rx_prefix.learn(&frame);
                }
                self.on_tcp(now, (ip.src_addr, ip.dst_addr), frame, l4, l4_end, src_mac)
            }
            IpProtocol::Icmp => {
                self.settle_rx_run(now);
                self.on_icmp(now, &ip, &frame, l4, l4_end, src_mac)
            }
            _ => self.counters.drop(StackDrop::UnknownProtocol),
        }
    }

    /// A broadcast (limited, or one of our subnets' for prefixes of /30 or shorter: a /31 has no
    /// broadcast address, RFC 3021) or multicast address.
    pub(super) fn is_non_unicast(&self, a: Ipv4Addr) -> bool {
        a.is_broadcast() || a.is_multicast() || self.addrs.is_subnet_broadcast(a)
    }

    pub(super) fn on_icmp(
        &mut self,
        now: Instant,
        ip: &Ipv4Repr,
        frame: &Zbuf,
        l4: usize,
        l4_end: usize,
        src_mac: EthernetAddress,
    ) {
        let data = &frame[l4..l4_end];
        let Ok(pkt) = Icmpv4Packet::new_checked(data) else {
            return self.counters.drop(StackDrop::Malformed);
        };
        let Ok(repr) = Icmpv4Repr::parse(&pkt, &self.cfg.caps) else {
            return self.counters.drop(StackDrop::Malformed);
        };
        match repr {
            Icmpv4Repr::EchoRequest {
                ident,
                seq_no,
                data: echo,
            } if self.cfg.answer_ping => {
                // The echo data is sent back by reference to the received frame.
                let off = l4 + 8;
                let payload = frame.slice(off..off + echo.len());
                // The reply comes from the address the request was sent to.
                if self.queue_echo_reply(ip.dst_addr, ip.src_addr, src_mac, ident, seq_no, payload)
                {
                    self.counters.icmp_echo_replies += 1;
                }
            }
            Icmpv4Repr::DstUnreachable {
                reason,
                next_hop_mtu,
                quote,
            } => {
                use Icmpv4DstUnreachable::{FragRequired, PortUnreachable, ProtoUnreachable};
                // Hard errors (RFC 1122 §4.2.3.9: protocol and port unreachable) and
                // frag-needed (RFC 1191 §4) are acted on; the soft ones (net and host
                // unreachable, ...) MUST NOT abort (RFC 9293 MUST-56): they are only
                // recorded for the application (SHLD-25), below.
                let hard = matches!(reason, FragRequired | PortUnreachable | ProtoUnreachable);
                // RFC 5927 §4.1 validation: the quoted segment must belong to a connection
                // and carry an in-flight sequence number (each handler checks the latter).
                let (Some((sport, dport)), Some(seq)) = (quote.ports(), quote.tcp_seq()) else {
                    return self.counters.drop(StackDrop::IcmpIgnored);
                };
                let tuple = FourTuple {
                    local: SocketAddrV4::new(quote.header.src_addr, sport),
                    remote: SocketAddrV4::new(quote.header.dst_addr, dport),
                };
                let Some(idx) = self.by_tuple.get(&tuple).copied() else {
                    return self.counters.drop(StackDrop::IcmpIgnored);
                };
                let e = self.slots[idx as usize]
                    .entry
                    .as_deref_mut()
                    .expect("tuple map is consistent");
                if !hard {
                    // Counted as ignored: the connection's behaviour does not change.
                    e.conn.on_icmp_soft_error(seq, reason);
                    return self.counters.drop(StackDrop::IcmpIgnored);
                }
                if reason == FragRequired {
                    if e.conn.on_path_mtu(seq, next_hop_mtu) {
                        self.counters.pmtu_updates += 1;
                        self.mark_dirty(idx);
                    } else {
                        self.counters.drop(StackDrop::IcmpIgnored);
                    }
                } else {
                    // A half-open passive connection goes back to LISTEN silently (as for
                    // a RST in SYN-RECEIVED, RFC 9293 §3.10.7.4): its slot is free now.
                    let embryonic = e.conn.state() == State::SynReceived && e.conn.is_passive();
                    if !e.conn.on_icmp_hard_error(seq) {
                        return self.counters.drop(StackDrop::IcmpIgnored);
                    }
                    self.counters.icmp_aborts += 1;
                    if embryonic {
                        self.free_slot(idx);
                    } else {
                        self.after_activity(idx, now);
                    }
                }
            }
            _ => self.counters.drop(StackDrop::IcmpIgnored),
        }
    }

    /// A TCP segment at `frame[l4..l4_end]`. The frame is taken by value and narrowed to
    /// the payload in place: a `slice` of a borrowed frame took a reference (an atomic
    /// increment) that the caller's drop of the frame then gave back, on every segment.
    pub(super) fn on_tcp(
        &mut self,
        now: Instant,
        (src_ip, dst_ip): (Ipv4Addr, Ipv4Addr),
        mut frame: Zbuf,
        l4: usize,
        l4_end: usize,
        src_mac: EthernetAddress,
    ) {
        // `parse` checks the header and data offset (as `new_checked` would).
        let pkt = TcpPacket::new_unchecked(&frame[l4..l4_end]);
        let Ok(seg) = TcpRepr::parse(&pkt, src_ip, dst_ip, &self.cfg.caps) else {
            return self.counters.drop(StackDrop::Malformed);
        };
        // `parse` checked l4 + header length <= l4_end; the IPv4 parse, l4_end <= len.
        let start = l4 + pkt.header_len();
        frame.truncate(l4_end);
        frame.advance(start);
        let payload = frame;
        let tuple = FourTuple {
            local: SocketAddrV4::new(dst_ip, seg.dst_port),
            remote: SocketAddrV4::new(src_ip, seg.src_port),
        };
        let mut hit = match self.last_hit {
            Some((t, idx)) if t == tuple => Some(idx),
            _ => {
                let found = self.by_tuple.get(&tuple).copied();
                self.last_hit = found.map(|idx| (tuple, idx));
                found
            }
        };
        if self.rx_run.count != 0 {
            // Inside `handle_frames`: the held run takes this segment if it continues it,
            // or is handed to its connection before this segment is handled.
            if hit == Some(self.rx_run.idx) && self.rx_run.joins(&seg, payload.len(), src_mac) {
                self.rx_run.push(&seg, payload);
                return;
            }
            self.flush_rx_run(now);
            // (Its connection may be gone now, and the demux cache with it.)
            hit = self.by_tuple.get(&tuple).copied();
        }
        if let Some(idx) = hit {
            let slot = &mut self.slots[idx as usize];
            let e = slot.entry.as_deref_mut().expect("tuple map is consistent");
            if e.conn.state() == State::Closed {
                // RFC 9293 §3.10.7.1: a CLOSED connection is no connection. One the
                // application still holds (to read its close reason) must not swallow the
                // segment: the tuple is freed and the segment goes to a listener or gets a
                // RST below.
                self.unmap(idx);
                return self.on_tcp_unmatched(now, tuple, &seg, payload, src_mac);
            }
            // RFC 9293 §3.10.7.4 with RFC 6191: a new SYN may reopen a TIME-WAIT tuple when
            // its timestamp shows it is new (`Connection::accepts_new_syn`); any other SYN
            // gets the connection's rate-limited challenge ACK (RFC 5961 §4.2).
            let reuse =
                e.conn.accepts_new_syn(&seg) && self.listener_by_port.contains_key(&seg.dst_port);
            if !reuse {
                // A new run (inside `handle_frames`): a data segment of an established
                // connection, ACK (and PSH) only; whether prediction takes it is decided
                // when it is flushed.
                if self.rx_coalesce
                    && RxRun::may_start(&seg, payload.len())
                    && e.conn.state() == State::Established
                {
                    self.rx_run
                        .start(idx, (src_ip, dst_ip), src_mac, &seg, payload);
                    return;
                }
                let delivered = payload.len() as u32;
                return self.conn_input(now, idx, src_ip, src_mac, delivered, |c, room| {
                    c.on_segment_path(now, &seg, payload, room)
                });
            }
            if e.owner == Owner::App {
                // The application's handle stays valid; only the tuple is taken over.
                self.unmap(idx);
            } else {
                self.free_slot(idx);
            }
            self.counters.time_wait_reuses += 1;
        }
        self.on_tcp_unmatched(now, tuple, &seg, payload, src_mac);
    }

    /// A segment (or a run of them, `delivered` payload bytes) for live connection `idx`
    /// from `src_ip` at `src_mac`: `input` runs the connection's processing; around it,
    /// the neighbour learnt or confirmed from the segment, the stack's accounting, the
    /// connection's events, output mark and timer. `input` also gets the receive memory
    /// the stack-wide budget has left ([`Stack::rcv_mem_room`]), computed once per
    /// segment or run.
    fn conn_input(
        &mut self,
        now: Instant,
        idx: u32,
        src_ip: Ipv4Addr,
        src_mac: EthernetAddress,
        delivered: u32,
        input: impl FnOnce(&mut Connection, isize) -> (Disposition, bool),
    ) {
        // (`held` is exact here: every change to a connection is synced as it happens.)
        let room = self.rcv_mem_room();
        let slot = &mut self.slots[idx as usize];
        let gen = slot.gen;
        let Some(e) = slot.entry.as_deref_mut() else {
            return;
        };
        // The peer's MAC is learned from its segments: no ARP round trip is needed to
        // answer a connection the kernel-side neighbour table does not know yet (a
        // known MAC only changes below, once the segment proved acceptable).
        // Skipped while the connection's cached entry says it would change nothing.
        let cached = e.next_hop == src_ip
            && e.hop_mac
                .is_some_and(|c| c.epoch == self.nb_epoch && now < c.until && c.mac == src_mac);
        // (The entry stays in hand when nothing is learnt: no second lookup.)
        let e = if cached {
            e
        } else {
            let (hop, src) = (e.next_hop, src_ip);
            self.learn_from_ip(now, hop, src, src_mac);
            self.slots[idx as usize]
                .entry
                .as_deref_mut()
                .expect("tuple map is consistent")
        };
        let (una, nxt) = (e.conn.snd_una(), e.conn.rcv_nxt());
        let rcvq_mem = e.conn.rcvq_mem();
        let (disp, predicted) = input(&mut e.conn, room);
        let hw = &mut self.counters.high_water;
        super::slots::rcvq_mem_moved(&mut self.held, hw, rcvq_mem, e.conn.rcvq_mem());
        if disp == Disposition::Remove {
            self.free_slot(idx);
            return;
        }
        // RFC 4861 §7.3.1 (as Linux's dst_confirm): an ACK of new data proves
        // forward progress, so the peer is reachable at the MAC it sent from. The
        // entry becomes Reachable and the connection caches it, which then skips
        // the per-segment learn above and the lookup on transmit.
        let progressed = e.conn.snd_una() != una;
        if predicted {
            let hw = &mut self.counters.high_water;
            super::slots::predicted_account(&mut self.held, hw, e, delivered, progressed);
        }
        let direct = e.next_hop == src_ip;
        // A segment that advanced RCV.NXT was acceptable (in the window: what a blind
        // spoofer must guess, RFC 5961): a peer that moved to another MAC is followed
        // (Stale: data in does not confirm the forward path, RFC 4861 §7.3.1).
        let follow = !progressed && direct && !cached && e.conn.rcv_nxt() != nxt;
        if progressed && direct && !cached {
            let src = src_ip;
            let _ = self.nb_update(src, |t| t.confirm(src, src_mac, now));
            let fresh = self.hop_mac_of(src, now);
            if let Some(e) = self.slots[idx as usize].entry.as_deref_mut() {
                e.hop_mac = fresh;
            }
            self.after_activity(idx, now);
            return;
        }
        // `after_activity` on the entry in hand.
        let act = super::slots::entry_activity(
            &mut self.dirty,
            &mut self.timers,
            &mut self.held,
            &mut self.counters,
            e,
            idx,
            gen,
            predicted,
        );
        self.finish_activity(act);
        if follow {
            let src = src_ip;
            let _ = self.nb_update(src, |t| t.learn(src, src_mac, now, false));
        }
    }

    /// A segment that matched no live connection: a listener's, or a RST.
    pub(super) fn on_tcp_unmatched(
        &mut self,
        now: Instant,
        tuple: FourTuple,
        seg: &TcpRepr,
        payload: Zbuf,
        src_mac: EthernetAddress,
    ) {
        match self.listener_by_port.get(&seg.dst_port).copied() {
            Some(l) => self.on_listen_segment(now, l, tuple, seg, payload, src_mac),
            None => {
                self.queue_rst_for(now, StackDrop::NoSocket, seg, payload.len(), tuple, src_mac)
            }
        }
    }

    /// RFC 9293 §3.10.7.1: a segment for no connection gets a RST (unless it is one). The
    /// segment is counted as a drop under `reason`, or under [`StackDrop::RstLimited`] when
    /// the stack-wide RST bucket (`StackConfig::rst_limit`) is empty and no RST is sent.
    pub(super) fn queue_rst_for(
        &mut self,
        now: Instant,
        reason: StackDrop,
        seg: &TcpRepr,
        payload_len: usize,
        tuple: FourTuple,
        dst_mac: EthernetAddress,
    ) {
        if seg.flags.rst() {
            return self.counters.drop(reason);
        }
        if !self.ctl_room() {
            return;
        }
        if !self.rst_bucket.take(now) {
            return self.counters.drop(StackDrop::RstLimited);
        }
        self.counters.drop(reason);
        let (seq, ack, flags) = if seg.flags.ack() {
            (seg.ack, SeqNum(0), TcpFlags::RST)
        } else {
            let len = payload_len as u32 + u32::from(seg.flags.syn()) + u32::from(seg.flags.fin());
            (SeqNum(0), seg.seq + len, TcpFlags::RST | TcpFlags::ACK)
        };
        let repr = TcpRepr {
            src_port: tuple.local.port(),
            dst_port: tuple.remote.port(),
            seq,
            ack,
            flags,
            window: 0,
            urgent: 0,
            options: TcpOptions::default(),
        };
        let t = self.build_tcp(&repr, IoVec::new(), tuple, dst_mac);
        self.ctl.push_back(t);
        self.counters.rsts_sent += 1;
    }
}

/// A source address no host on any link has: 0/8 ({0, host}, RFC 1122 §3.2.1.3),
/// loopback (127/8), multicast, the limited broadcast.
#[inline]
pub(super) fn is_martian(a: Ipv4Addr) -> bool {
    let first = a.octets()[0];
    first == 0 || first == 127 || a.is_multicast() || a.is_broadcast()
}

/// Where TCP starts in a frame whose IPv4 header has no options.
const RX_L4: usize = ETH_LEN + crate::wire::ipv4::HEADER_LEN;

/// The Ethernet and IPv4 header of the last TCP frame that passed every check of
/// `handle_frame` and `on_ipv4` (header prediction below TCP, as Linux's early demux
/// remembers a socket's route): both MACs, the EtherType, version and IHL (5: no options),
/// the protocol and both addresses. Each of those checks is a function of these fields and
/// of the stack's MAC and local addresses alone, so a frame carrying the same ones passes
/// them again; what else the checks read is checked again here: the length fields, the
/// fragment bits and (when not offloaded) the header checksum. The stack's MAC never
/// changes; a change of its addresses forgets the prefix ([`RxPrefix::forget`]).
#[derive(Default)]
pub(super) struct RxPrefix {
    /// Frame bytes 0..8 and 7..15 (destination and source MAC, EtherType, version and
    /// IHL), as two overlapping words: two compares instead of a 15-byte one.
    head: [u64; 2],
    /// Frame bytes 26..34: source and destination address (the protocol, byte 23, is TCP).
    proto_addrs: u64,
    /// Frame bytes 6..12, the source MAC.
    src_mac: [u8; 6],
    valid: bool,
}

/// The native-endian word at `b[at..at + 8]` (`at + 8 <= N`, checked when compiled).
#[inline(always)]
fn word<const N: usize>(b: &[u8; N], at: usize) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(w)
}

impl RxPrefix {
    /// Remembers `frame`'s prefix (a TCP frame without IP options that passed every check).
    #[inline]
    pub(super) fn learn(&mut self, frame: &[u8]) {
        if let Some(h) = frame.first_chunk::<RX_L4>() {
            self.head = [word(h, 0), word(h, 7)];
            self.proto_addrs = word(h, 26);
            self.src_mac.copy_from_slice(&h[6..12]);
            self.valid = h[23] == u8::from(IpProtocol::Tcp);
        }
    }

    /// The addresses change: nothing is remembered.
    pub(super) fn forget(&mut self) {
        self.valid = false;
    }

    /// The source MAC of the remembered prefix.
    #[inline]
    pub(super) fn src_mac(&self) -> EthernetAddress {
        EthernetAddress(self.src_mac)
    }

    /// `(source, destination, end of the IPv4 payload)` when `frame` carries the
    /// remembered prefix and would pass `handle_frame`'s and `on_ipv4`'s checks: a whole
    /// header, Total Length within the frame and at least the header, not a fragment
    /// (MF clear, offset 0), and a valid header checksum unless offloaded.
    #[inline]
    pub(super) fn matches(
        &self,
        frame: &[u8],
        caps: &ChecksumCaps,
    ) -> Option<(Ipv4Addr, Ipv4Addr, usize)> {
        if !self.valid {
            return None;
        }
        let h = frame.first_chunk::<RX_L4>()?;
        if word(h, 0) != self.head[0]
            || word(h, 7) != self.head[1]
            || h[23] != u8::from(IpProtocol::Tcp)
            || word(h, 26) != self.proto_addrs
        {
            return None;
        }
        let total = usize::from(u16::from_be_bytes([h[16], h[17]]));
        let flags = u16::from_be_bytes([h[20], h[21]]);
        if total < crate::wire::ipv4::HEADER_LEN
            || frame.len() - ETH_LEN < total
            || flags & 0x3fff != 0
            || (caps.ipv4.rx() && crate::wire::checksum::data(&h[ETH_LEN..]) != 0xffff)
        {
            return None;
        }
        let src = Ipv4Addr::new(h[26], h[27], h[28], h[29]);
        let dst = Ipv4Addr::new(h[30], h[31], h[32], h[33]);
        Some((src, dst, ETH_LEN + total))
    }
}

/// Most segments one received run takes (`Stack::handle_frames`).
const RX_RUN_MAX: u32 = 64;

/// Consecutive in-order data segments of one connection held during
/// [`Stack::handle_frames`] for one pass of its input processing: they continue each other
/// exactly and carry the same ACK, window and options (PSH on any of them).
pub(super) struct RxRun {
    /// Segments held; 0 = no run.
    pub(super) count: u32,
    /// The connection's slot.
    pub(super) idx: u32,
    pub(super) src_ip: Ipv4Addr,
    dst_ip: Ipv4Addr,
    pub(super) src_mac: EthernetAddress,
    /// The first segment's header (its flags gather the others' PSH).
    pub(super) seg: TcpRepr,
    /// The TCP header bytes a segment continuing the run carries (`None`: the run's
    /// segments have no timestamps; they all go through `on_tcp`).
    head: Option<RunHead>,
    /// Tests: `continued_by` never answers (every segment goes through `on_tcp`).
    #[cfg(test)]
    pub(super) no_head: bool,
    /// The payloads, in order.
    pub(super) pieces: Vec<Zbuf>,
    /// Their bytes.
    pub(super) bytes: u32,
    /// The sequence number the next segment must start at.
    next: SeqNum,
}

impl Default for RxRun {
    fn default() -> Self {
        RxRun {
            count: 0,
            idx: 0,
            src_ip: Ipv4Addr::UNSPECIFIED,
            dst_ip: Ipv4Addr::UNSPECIFIED,
            src_mac: EthernetAddress::default(),
            seg: TcpRepr::default(),
            head: None,
            #[cfg(test)]
            no_head: false,
            pieces: Vec::new(),
            bytes: 0,
            next: SeqNum(0),
        }
    }
}

impl RxRun {
    /// Whether `seg` with `len` payload bytes can be in a run: data, ACK and PSH only, no
    /// option but timestamps.
    #[inline]
    pub(super) fn may_start(seg: &TcpRepr, len: usize) -> bool {
        let o = &seg.options;
        len > 0
            && seg.flags.0 & !TcpFlags::PSH.0 == TcpFlags::ACK.0
            && o.sack_blocks.is_empty()
            && o.mss.is_none()
            && o.window_scale.is_none()
            && !o.sack_permitted
    }

    pub(super) fn start(
        &mut self,
        idx: u32,
        (src_ip, dst_ip): (Ipv4Addr, Ipv4Addr),
        src_mac: EthernetAddress,
        seg: &TcpRepr,
        payload: Zbuf,
    ) {
        debug_assert_eq!(self.count, 0);
        self.count = 1;
        self.idx = idx;
        self.src_ip = src_ip;
        self.dst_ip = dst_ip;
        self.src_mac = src_mac;
        self.seg = *seg;
        self.head = RunHead::of(seg);
        self.bytes = payload.len() as u32;
        self.next = seg.seq + payload.len();
        self.pieces.push(payload);
    }

    /// Whether `seg` (`len` payload bytes, from `src_mac`, for this run's connection)
    /// continues the run.
    #[inline]
    pub(super) fn joins(&self, seg: &TcpRepr, len: usize, src_mac: EthernetAddress) -> bool {
        // (The run's first segment passed `may_start`: equal timestamps and `may_start`
        // here make the options equal.)
        seg.seq == self.next
            && seg.ack == self.seg.ack
            && seg.window == self.seg.window
            && seg.options.timestamps == self.seg.options.timestamps
            && Self::may_start(seg, len)
            && self.count < RX_RUN_MAX
            && src_mac == self.src_mac
            && self.bytes.checked_add(len as u32).is_some()
    }

    /// `frame` (a frame with the remembered Ethernet and IPv4 prefix, `at`: its source
    /// and destination address, the end of its IPv4 payload and its source MAC)
    /// carries a segment that `on_tcp` would add to this held run: its flags, else
    /// `None` (then `on_tcp` decides). The TCP header is the run's `RunHead` with the
    /// next sequence number (PSH may differ, the urgent pointer and the checksum are
    /// not compared), from the same addresses and MAC, with payload; the checksum is
    /// verified unless offloaded, as `TcpRepr::parse` does. Such a segment parses to
    /// the run's ports, ACK, window and timestamps, so `joins` takes it; the demux cache
    /// still names this connection (set when the run started; whatever changed it since
    /// handed the run over first).
    #[inline]
    pub(super) fn continued_by(
        &self,
        frame: &[u8],
        (src, dst, l4_end, src_mac): (Ipv4Addr, Ipv4Addr, usize, EthernetAddress),
        caps: &ChecksumCaps,
    ) -> Option<TcpFlags> {
        #[cfg(test)]
        if self.no_head {
            return None;
        }
        let head = self.head.as_ref()?;
        let tcp = frame.get(RX_L4..l4_end)?;
        let h = tcp.first_chunk::<{ RunHead::LEN }>()?;
        let len = tcp.len() - RunHead::LEN;
        let seq = SeqNum(u32::from_be_bytes([h[4], h[5], h[6], h[7]]));
        let same = head.matches(h)
            && seq == self.next
            && len > 0
            && src == self.src_ip
            && dst == self.dst_ip
            && src_mac == self.src_mac
            && self.count < RX_RUN_MAX
            && self.bytes.checked_add(len as u32).is_some()
            && (!caps.tcp.rx() || TcpPacket::new_unchecked(tcp).verify_checksum(src, dst));
        same.then_some(TcpFlags(h[13]))
    }

    pub(super) fn push(&mut self, seg: &TcpRepr, payload: Zbuf) {
        self.push_flags(seg.flags, payload);
    }

    /// [`push`](Self::push) of a segment with these flags.
    #[inline]
    pub(super) fn push_flags(&mut self, flags: TcpFlags, payload: Zbuf) {
        self.count += 1;
        self.seg.flags = TcpFlags(self.seg.flags.0 | flags.0);
        self.bytes += payload.len() as u32;
        self.next += payload.len();
        self.pieces.push(payload);
    }
}

/// The TCP header of a held run's segments when timestamps are their only option (the
/// established connection's usual 32 bytes: RFC 7323 Appendix A's <NOP,NOP,TS>), as the
/// words `RxRun::continued_by` compares: the ports, then the ACK, data offset, flags
/// (PSH masked) and window, then the options. Bytes that equal these parse to the same
/// ports, ACK, flags (but PSH), window and timestamps, and to no other option.
#[derive(Clone, Copy)]
pub(super) struct RunHead {
    ports: u32,
    ack_to_window: u64,
    options: [u64; 2],
}

impl RunHead {
    /// Header length: 20 bytes and <NOP, NOP, TS>.
    pub(super) const LEN: usize = 32;
    /// Byte 13 (the flags) of the ACK-to-window word without PSH.
    const NO_PSH: u64 = u64::from_ne_bytes([0xff, 0xff, 0xff, 0xff, 0xff, !0x08, 0xff, 0xff]);

    /// The header of a run's first segment `seg` (ACK and PSH only, no option but
    /// timestamps: `RxRun::may_start`), when it has timestamps.
    fn of(seg: &TcpRepr) -> Option<RunHead> {
        let ts = seg.options.timestamps?;
        let mut h = [0u8; Self::LEN];
        h[0..2].copy_from_slice(&seg.src_port.to_be_bytes());
        h[2..4].copy_from_slice(&seg.dst_port.to_be_bytes());
        h[8..12].copy_from_slice(&seg.ack.0.to_be_bytes());
        h[12] = ((Self::LEN / 4) as u8) << 4;
        h[13] = seg.flags.0;
        h[14..16].copy_from_slice(&seg.window.to_be_bytes());
        h[20..24].copy_from_slice(&[1, 1, 8, 10]);
        h[24..28].copy_from_slice(&ts.tsval.to_be_bytes());
        h[28..32].copy_from_slice(&ts.tsecr.to_be_bytes());
        Some(RunHead {
            ports: Self::ports(&h),
            ack_to_window: word(&h, 8) & Self::NO_PSH,
            options: [word(&h, 20), word(&h, 24)],
        })
    }

    #[inline(always)]
    fn ports(h: &[u8; Self::LEN]) -> u32 {
        u32::from_ne_bytes([h[0], h[1], h[2], h[3]])
    }

    /// Whether header `h` carries these bytes (PSH, the sequence number, the checksum and
    /// the urgent pointer aside).
    #[inline(always)]
    fn matches(&self, h: &[u8; Self::LEN]) -> bool {
        Self::ports(h) == self.ports
            && word(h, 8) & Self::NO_PSH == self.ack_to_window
            && word(h, 20) == self.options[0]
            && word(h, 24) == self.options[1]
    }
}
