//! Passive open: SEGMENT ARRIVES in LISTEN (RFC 9293 §3.10.7.2), half-open connections
//! counted against the listener's backlog, and SYN cookies (RFC 4987 §3.6) both ways.

use super::{Entry, Owner, Stack, StackDrop, SynCookieMode};
use crate::context::Rng;
use crate::tcp::conn::{Connection, FourTuple, SynInfo};
use crate::tcp::syncookie;
use crate::time::Instant;
use crate::wire::{EthernetAddress, TcpFlags, TcpOptions, TcpRepr, Timestamps};
use core::net::{Ipv4Addr, SocketAddrV4};
use zbuf::{IoVec, Zbuf};

impl<R: Rng> Stack<R> {
    /// RFC 9293 §3.10.7.2: SEGMENT ARRIVES in LISTEN.
    pub(super) fn on_listen_segment(
        &mut self,
        now: Instant,
        l: u32,
        tuple: FourTuple,
        seg: &TcpRepr,
        payload: Zbuf,
        src_mac: EthernetAddress,
    ) {
        let flags = seg.flags;
        if flags.rst() {
            return self.counters.drop(StackDrop::ListenInvalid);
        }
        if flags.ack() {
            // Possibly the final ACK of a SYN-cookie handshake. With cookies only for a full
            // backlog, only while one this listener sent may still be valid (as Linux's
            // `tcp_synq_no_recent_overflow`): outside a flood no ACK is a cookie, and a blind
            // attacker gets no 2^-24 guesses at one.
            let cookie_recent = |s: &Self| match s.cfg.syn_cookies {
                SynCookieMode::Off => false,
                SynCookieMode::Always => true,
                SynCookieMode::WhenFull => s
                    .listeners
                    .get(l as usize)
                    .and_then(|x| x.as_ref())
                    .and_then(|x| x.last_cookie)
                    .is_some_and(|sent| s.cookies.may_still_be_valid(sent, now)),
            };
            if !flags.syn() && cookie_recent(self) {
                let tsecr = seg.options.timestamps.map(|t| t.tsecr);
                if let Ok(ok) =
                    self.cookies
                        .validate(now, tuple.local, tuple.remote, seg.seq, seg.ack, tsecr)
                {
                    return self.accept_cookie(now, l, tuple, seg, payload, ok, src_mac);
                }
            }
            // RFC 9293 §3.10.7.2 second: any acknowledgment is bad in LISTEN (a SYN-ACK too,
            // which must not open a connection): <SEQ=SEG.ACK><CTL=RST>.
            return self.queue_rst_for(
                now,
                StackDrop::ListenInvalid,
                seg,
                payload.len(),
                tuple,
                src_mac,
            );
        }
        if !flags.syn() {
            return self.counters.drop(StackDrop::ListenInvalid);
        }
        // RFC 9293 §3.10.7.2 defines no SYN+FIN (a scan or an attack, never a connection
        // attempt): drop it silently, as Linux and BSD do, rather than open a connection
        // whose FIN would close it at once.
        if flags.fin() {
            return self.counters.drop(StackDrop::ListenInvalid);
        }
        let Some(Some(lst)) = self.listeners.get(l as usize) else {
            return;
        };
        let full = lst.half_open + lst.accept_queue.len() >= lst.backlog
            || self.live >= self.cfg.max_connections;
        match (self.cfg.syn_cookies, full) {
            // RFC 4987 §3.6: a cookie SYN leaves no state, not even a neighbour entry (the
            // SYN-ACK goes to the frame's source MAC; accept_cookie learns it once the ACK
            // proves the peer real). Spoofed floods then neither evict real neighbours nor
            // pay for a table update per SYN (luna-stack/benches/syn-flood-instructions.sh).
            (SynCookieMode::Always, _) | (SynCookieMode::WhenFull, true) => {
                if let Some(Some(lst)) = self.listeners.get_mut(l as usize) {
                    lst.last_cookie = Some(now);
                }
                return self.send_cookie_syn_ack(now, tuple, seg, src_mac);
            }
            (SynCookieMode::Off, true) => return self.counters.drop(StackDrop::BacklogFull),
            (_, false) => {}
        }
        let Some((next_hop, _)) = self.route(tuple.remote.ip()) else {
            return self.counters.drop(StackDrop::NoRoute);
        };
        self.learn_from_ip(now, next_hop, ip_of(&tuple.remote), src_mac);
        let iss = self.iss_for(now, tuple);
        let ts_offset = self.isn.ts_offset(tuple.local, tuple.remote);
        let syn = SynInfo {
            seq: seg.seq,
            window: seg.window,
            options: seg.options,
        };
        let conn = Connection::accept_syn(
            now,
            tuple,
            self.tcp_config_for(*tuple.remote.ip()),
            iss,
            ts_offset,
            &syn,
        );
        let Some(idx) = self.insert_passive(l, tuple, conn, next_hop) else {
            return self.counters.drop(StackDrop::TableFull);
        };
        self.counters.passive_opens += 1;
        self.after_activity(idx, now);
    }

    /// Table a connection a listener created (SYN or valid cookie); it counts against the
    /// listener's half-open backlog until it is established or freed.
    pub(super) fn insert_passive(
        &mut self,
        l: u32,
        tuple: FourTuple,
        conn: Connection,
        next_hop: Ipv4Addr,
    ) -> Option<u32> {
        let entry = Entry::new(
            conn,
            Owner::Listener(l),
            next_hop,
            self.ip_ident_seed(tuple),
        );
        let idx = self.alloc_slot(entry)?;
        self.by_tuple.insert(tuple, idx);
        self.last_hit = None;
        if let Some(Some(lst)) = self.listeners.get_mut(l as usize) {
            lst.half_open += 1;
        }
        // (`counted_half_open` above: free_slot or the handshake's end takes it back; the
        // high-water mark follows in after_activity, once a cookie connection has left.)
        self.held.half_open += 1;
        Some(idx)
    }

    /// A neighbour learnt from an IP frame (`src` sent it from `src_mac`): only an on-link
    /// source (its own next hop), and only a MAC not known yet
    /// ([`learn_if_unknown`](crate::tables::neighbour::NeighbourTable::learn_if_unknown)).
    pub(super) fn learn_from_ip(
        &mut self,
        now: Instant,
        next_hop: Ipv4Addr,
        src: Ipv4Addr,
        src_mac: EthernetAddress,
    ) {
        if next_hop == src {
            let _ = self.nb_update(src, |t| t.learn_if_unknown(src, src_mac, now));
        }
    }

    /// Where a connection's IPv4 identification starts: a keyed hash of its tuple (the
    /// timestamp-offset hash, keyed and over the tuple reversed, so not that offset).
    pub(super) fn ip_ident_seed(&self, tuple: FourTuple) -> u16 {
        self.isn.ts_offset(tuple.remote, tuple.local) as u16
    }

    pub(super) fn route(&self, dst: &Ipv4Addr) -> Option<(Ipv4Addr, Ipv4Addr)> {
        self.routes.next_hop(*dst).map(|(hop, r)| (hop, r.source))
    }

    pub(super) fn send_cookie_syn_ack(
        &mut self,
        now: Instant,
        tuple: FourTuple,
        seg: &TcpRepr,
        dst_mac: EthernetAddress,
    ) {
        if !self.ctl_room() {
            return;
        }
        let tcp = &self.cfg.tcp;
        // The cookie encodes what this SYN-ACK negotiates (RFC 7323 §3.2, §2.2; RFC 2018
        // §2), not what the SYN offered: with our timestamps off the SYN-ACK carries none,
        // the peer's ACK echoes none, and a cookie whose MAC covered the options of a
        // timestamp never sent would fail every such handshake.
        let ts = seg.options.timestamps.is_some() && tcp.timestamps;
        let info = syncookie::SynInfo {
            mss: seg.options.mss,
            wscale: seg.options.window_scale.filter(|_| tcp.window_scaling),
            sack_permitted: seg.options.sack_permitted && tcp.sack,
            timestamps: ts,
        };
        // The connection re-created from the cookie continues this clock (accept_cookie).
        let ts_clock = ((now.as_nanos() / 1_000_000) as u32)
            .wrapping_add(self.isn.ts_offset(tuple.local, tuple.remote));
        let c = self
            .cookies
            .generate(now, tuple.local, tuple.remote, seg.seq, &info, ts_clock);
        let mut options = TcpOptions {
            mss: Some(tcp.mss.min(self.cfg.mtu - 40)),
            ..TcpOptions::default()
        };
        // The cookie carries window scale and SACK-permitted only in the timestamp
        // (tcp/syncookie.rs): without timestamps, offering them would leave the re-created
        // connection unscaled while the peer scales (RFC 7323 §2.2, RFC 2018 §2).
        if ts && tcp.window_scaling && seg.options.window_scale.is_some() {
            options.window_scale = Some(tcp.rcv_wscale());
        }
        options.sack_permitted = ts && tcp.sack && seg.options.sack_permitted;
        if let (Some(tsval), Some(peer)) = (c.tsval, seg.options.timestamps) {
            options.timestamps = Some(Timestamps {
                tsval,
                tsecr: peer.tsval,
            });
        }
        let repr = TcpRepr {
            src_port: tuple.local.port(),
            dst_port: tuple.remote.port(),
            seq: c.isn,
            ack: seg.seq + 1u32,
            flags: TcpFlags::SYN | TcpFlags::ACK,
            // Connection::from_cookie assumes exactly this window was offered.
            window: u16::try_from(tcp.rcv_buf).unwrap_or(u16::MAX),
            urgent: 0,
            options,
        };
        let t = self.build_tcp(&repr, IoVec::new(), tuple, dst_mac);
        self.ctl.push_back(t);
        self.counters.syn_cookies_sent += 1;
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn accept_cookie(
        &mut self,
        now: Instant,
        l: u32,
        tuple: FourTuple,
        seg: &TcpRepr,
        payload: Zbuf,
        ok: syncookie::CookieAccepted,
        src_mac: EthernetAddress,
    ) {
        let Some((next_hop, _)) = self.route(tuple.remote.ip()) else {
            return self.counters.drop(StackDrop::NoRoute);
        };
        // The cookie SYN left no neighbour entry (on_listen_segment); the valid ACK does.
        self.learn_from_ip(now, next_hop, ip_of(&tuple.remote), src_mac);
        let peer_opts = TcpOptions {
            mss: Some(ok.peer_mss),
            window_scale: ok.wscale,
            sack_permitted: ok.sack_permitted,
            timestamps: seg.options.timestamps.filter(|_| ok.timestamps),
            ..TcpOptions::default()
        };
        // The shared config offers timestamps; whether this connection uses them is its own
        // state: a cookie without the timestamps bit gives `peer_opts` no timestamps, and
        // RFC 7323 §3.2 negotiation (`Connection::negotiate`) then turns them off for it.
        let cfg = self.tcp_config_for(*tuple.remote.ip());
        // The SYN-ACK's TSval came from this clock and the peer echoes it: a connection on
        // another clock would look 2^31 or more in the past to the peer's PAWS check about
        // half the time, and every later segment would be dropped.
        let ts_offset = self.isn.ts_offset(tuple.local, tuple.remote);
        let conn =
            Connection::from_cookie(now, tuple, cfg, ok.isn, ok.peer_isn, ts_offset, &peer_opts);
        let Some(idx) = self.insert_passive(l, tuple, conn, next_hop) else {
            return self.counters.drop(StackDrop::TableFull);
        };
        self.counters.syn_cookies_accepted += 1;
        // (New: it holds nothing, so an in-order payload is taken whatever the budget.)
        let room = self.rcv_mem_room();
        let e = self.slots[idx as usize]
            .entry
            .as_deref_mut()
            .expect("just allocated");
        let before = e.conn.rcvq_mem();
        e.conn.on_segment_path(now, seg, payload, room);
        let hw = &mut self.counters.high_water;
        super::slots::rcvq_mem_moved(&mut self.held, hw, before, e.conn.rcvq_mem());
        self.after_activity(idx, now);
    }
}

fn ip_of(a: &SocketAddrV4) -> Ipv4Addr {
    *a.ip()
}
