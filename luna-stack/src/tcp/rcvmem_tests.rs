//! Receive memory: what a connection holds is bounded by the memory behind its segments
//! (the NIC receive buffers their payload slices keep alive), not only by their bytes. A
//! peer sending tiny segments must not pin one receive buffer per byte.
//!
//! The payloads here are built as the NIC hands them over: a slice of a 2 KiB receive
//! buffer ([`rx`]), so each held segment keeps a whole buffer alive until it is released;
//! the test keeps one clone of every buffer and counts those the connection still holds.

use super::*;
use crate::tcp::config::TcpConfig;
use core::net::Ipv4Addr;

const ISS: u32 = 1000;
const PEER_ISS: u32 = 5000;
/// A NIC receive buffer (2 KiB mbuf data room / slab object).
const RX_BUF: usize = 2048;
/// Where the payload starts in a frame: Ethernet, IPv4 and a TCP header with timestamps.
const RX_OFF: usize = 66;

fn t(ms: u64) -> Instant {
    Instant::from_millis(ms)
}

fn tuple() -> FourTuple {
    FourTuple {
        local: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 61440),
        remote: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 7000),
    }
}

/// A peer's data segment (ACK, no options).
fn data_seg(seq: u32, len: usize) -> TcpRepr {
    TcpRepr {
        src_port: 7000,
        dst_port: 61440,
        seq: SeqNum(seq),
        ack: SeqNum(ISS + 1),
        flags: TcpFlags::ACK | if len > 0 { TcpFlags::PSH } else { TcpFlags(0) },
        window: 65535,
        urgent: 0,
        options: TcpOptions::default(),
    }
}

/// The receive buffers handed to the connection, to count those it still holds.
#[derive(Default)]
struct Nic {
    bufs: Vec<Zbuf>,
}

impl Nic {
    /// `payload` as a received frame's payload: a slice of its own 2 KiB receive buffer.
    fn rx(&mut self, payload: &[u8]) -> Zbuf {
        let mut frame = vec![0u8; RX_BUF];
        frame[RX_OFF..RX_OFF + payload.len()].copy_from_slice(payload);
        let buf = Zbuf::from_vec(frame);
        self.bufs.push(buf.clone());
        buf.slice(RX_OFF..RX_OFF + payload.len())
    }

    /// Receive buffers someone besides this test still references.
    fn pinned(&self) -> usize {
        self.bufs.iter().filter(|b| b.ref_count() > 1).count()
    }
}

fn cfg(rcv_buf: u32) -> TcpConfig {
    TcpConfig {
        rcv_buf,
        timestamps: false,
        window_scaling: false,
        delayed_ack: None,
        ..TcpConfig::default()
    }
}

/// Active open against a scripted peer that offers SACK (so out-of-order data is SACKed).
fn established(cfg: TcpConfig) -> Connection {
    let mut c = Connection::connect(t(0), tuple(), cfg.clone(), SeqNum(ISS), 0);
    while c.poll_segment(t(0)).is_some() {}
    let mut synack = data_seg(PEER_ISS, 0);
    synack.flags = TcpFlags::SYN | TcpFlags::ACK;
    synack.options.mss = Some(1460);
    synack.options.sack_permitted = true;
    synack.options.window_scale = cfg.window_scaling.then_some(7);
    c.on_segment(t(1), &synack, Zbuf::copy_from_slice(&[]));
    assert_eq!(c.state(), State::Established);
    while c.poll_segment(t(1)).is_some() {}
    c
}

/// Sends everything the connection has to send; returns the highest ACK it carried.
fn acks(c: &mut Connection, now: Instant, high: &mut u32) {
    while let Some(s) = c.poll_segment(now) {
        let a = s.repr.ack.0.wrapping_sub(PEER_ISS + 1);
        *high = (*high).max(a);
    }
}

/// Reads everything queued.
fn read_all(c: &mut Connection) -> Vec<u8> {
    let mut got = Vec::new();
    while let Ok(Some(z)) = c.recv() {
        got.extend_from_slice(&z);
    }
    got
}

fn stream(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// The memory a connection may hold: twice the receive buffer (Linux's rcvbuf against a
/// window of about half of it), plus the one buffer a segment admitted at the bound adds.
fn bound(rcv_buf: u32) -> usize {
    2 * rcv_buf as usize + RX_BUF
}

/// A peer sends thousands of 1-byte segments in order to an application that does not
/// read: without accounting each held one receive buffer (10,000 of 8,191 in a pool).
/// The connection holds at most its bound's worth of buffers, and every byte it
/// acknowledged is read back later, in order and intact.
#[test]
fn tiny_in_order_segments_pin_a_bounded_number_of_receive_buffers() {
    let rcv_buf = 16 << 10;
    let mut c = established(cfg(rcv_buf));
    let mut nic = Nic::default();
    let data = stream(10_000);
    let mut acked = 0;
    let mut most_pinned = 0;
    for (i, b) in data.iter().enumerate() {
        let seq = PEER_ISS + 1 + i as u32;
        c.on_segment(t(2), &data_seg(seq, 1), nic.rx(&[*b]));
        acks(&mut c, t(2), &mut acked);
        most_pinned = most_pinned.max(nic.pinned());
        assert!(c.recv_mem() <= bound(rcv_buf), "{} held", c.recv_mem());
    }
    assert!(
        most_pinned * RX_BUF <= bound(rcv_buf),
        "{most_pinned} receive buffers pinned"
    );
    assert_eq!(acked as usize, data.len(), "every byte was acknowledged");
    let k = &c.counters;
    assert!(k.rcv_collapsed > 9_000, "{k:?}");
    assert_eq!((k.drops(DropReason::RcvMemory), k.rcv_pruned), (0, 0));
    assert_eq!(read_all(&mut c), data, "in order and intact");
    assert_eq!(nic.pinned(), 0);
    assert_eq!(c.recv_mem(), 0);
}

/// The same through receive coalescing (`Stack::handle_frames` hands a connection runs
/// of in-order segments): a run whose buffers would pass the bound takes the full path,
/// segment by segment.
#[test]
fn tiny_in_order_segments_in_runs_pin_a_bounded_number_of_receive_buffers() {
    let rcv_buf = 16 << 10;
    let mut c = established(cfg(rcv_buf));
    let mut nic = Nic::default();
    let data = stream(10_000);
    let mut acked = 0;
    let mut most_pinned = 0;
    for (k, run) in data.chunks(32).enumerate() {
        let mut seg = data_seg(PEER_ISS + 1 + 32 * k as u32, 1);
        let mut pieces: Vec<Zbuf> = run.iter().map(|b| nic.rx(&[*b])).collect();
        let mut readable = 0;
        let _ = c.on_segment_run(t(2), &mut seg, &mut pieces, &mut readable, isize::MAX);
        acks(&mut c, t(2), &mut acked);
        most_pinned = most_pinned.max(nic.pinned());
        assert!(c.recv_mem() <= bound(rcv_buf), "{} held", c.recv_mem());
    }
    assert!(
        most_pinned * RX_BUF <= bound(rcv_buf),
        "{most_pinned} receive buffers pinned"
    );
    assert_eq!(acked as usize, data.len());
    assert_eq!(read_all(&mut c), data, "in order and intact");
    assert_eq!(nic.pinned(), 0);
}

/// The same with holes: tiny segments above RCV.NXT (every other byte, then a contiguous
/// run) are held out of order; once the holes fill, every byte comes out in order.
#[test]
fn tiny_out_of_order_segments_pin_a_bounded_number_of_receive_buffers() {
    let rcv_buf = 16 << 10;
    let mut c = established(cfg(rcv_buf));
    let mut nic = Nic::default();
    let data = stream(4_000);
    let mut acked = 0;
    let mut most_pinned = 0;
    let base = PEER_ISS + 1;
    // Isolated bytes (a hole on each side), then a contiguous run above a hole.
    let odd = (1..2_000).step_by(2);
    let run = 2_001..4_000;
    for i in odd.chain(run) {
        c.on_segment(t(2), &data_seg(base + i as u32, 1), nic.rx(&data[i..=i]));
        acks(&mut c, t(2), &mut acked);
        most_pinned = most_pinned.max(nic.pinned());
        assert!(c.recv_mem() <= bound(rcv_buf), "{} held", c.recv_mem());
    }
    assert_eq!(acked, 0, "nothing in order yet");
    // The peer retransmits from the cumulative ACK on, one byte per segment, as a sender
    // repairing holes does; what is already held is trimmed.
    let mut next = 0;
    for _ in 0..100_000 {
        if acked as usize == data.len() {
            break;
        }
        c.on_segment(
            t(3),
            &data_seg(base + next as u32, 1),
            nic.rx(&data[next..=next]),
        );
        acks(&mut c, t(3), &mut acked);
        most_pinned = most_pinned.max(nic.pinned());
        assert!(c.recv_mem() <= bound(rcv_buf), "{} held", c.recv_mem());
        next = (acked as usize).max(next + 1);
        if next >= data.len() {
            next = acked as usize;
        }
    }
    assert!(
        most_pinned * RX_BUF <= bound(rcv_buf),
        "{most_pinned} receive buffers pinned"
    );
    assert_eq!(acked as usize, data.len());
    let k = &c.counters;
    assert!(k.rcv_collapsed > 0, "{k:?}");
    assert_eq!(read_all(&mut c), data, "in order and intact");
    assert_eq!(nic.pinned(), 0);
}

/// Full-sized segments, each in its own 2 KiB receive buffer (truesize about 1.5 times
/// the bytes), never trigger a collapse: a whole 1 MiB window of them in order to an
/// application that does not read, then a window with its first segment lost (the rest
/// held out of order until the retransmission fills the hole). Everything stays zero
/// copy: what the application reads is the NIC's buffers.
#[test]
fn full_sized_segments_fill_the_window_without_a_collapse() {
    let rcv_buf = 1 << 20;
    let cfg = TcpConfig {
        window_scaling: true,
        ..cfg(rcv_buf)
    };
    let mut c = established(cfg);
    let mut nic = Nic::default();
    let mss = 1448;
    let window = rcv_buf as usize / mss;
    let data = stream(2 * window * mss);
    let mut acked = 0;
    let send = |c: &mut Connection, nic: &mut Nic, i: usize, acked: &mut u32| {
        let off = i * mss;
        let seq = PEER_ISS + 1 + off as u32;
        c.on_segment(t(2), &data_seg(seq, mss), nic.rx(&data[off..off + mss]));
        acks(c, t(2), acked);
    };
    for i in 0..window {
        send(&mut c, &mut nic, i, &mut acked);
    }
    assert_eq!(acked as usize, window * mss);
    assert_eq!(
        c.counters.fast_path_hits, window as u64,
        "every in-order segment took header prediction"
    );
    let mut got = Vec::new();
    while let Ok(Some(z)) = c.recv() {
        assert!(
            nic.bufs.iter().any(|b| b.same_object(&z)),
            "zero copy: a slice of a receive buffer"
        );
        got.extend_from_slice(&z);
    }
    // The window update the reads made, then the next window, its first segment lost and
    // sent again last.
    acks(&mut c, t(2), &mut acked);
    for i in window + 1..2 * window {
        send(&mut c, &mut nic, i, &mut acked);
    }
    assert_eq!(acked as usize, window * mss, "a hole at the cumulative ACK");
    assert!(c.ooo_bytes() > (rcv_buf as usize) * 9 / 10);
    send(&mut c, &mut nic, window, &mut acked);
    assert_eq!(acked as usize, data.len());
    while let Ok(Some(z)) = c.recv() {
        assert!(nic.bufs.iter().any(|b| b.same_object(&z)));
        got.extend_from_slice(&z);
    }
    assert_eq!(got, data);
    let k = &c.counters;
    assert_eq!(
        (k.rcv_collapsed, k.rcv_pruned, k.drops.iter().sum::<u64>()),
        (0, 0, 0),
        "{k:?}"
    );
}

/// The stack-wide bound as the connection sees it (`room`, what the stack's other
/// connections leave): a segment that does not fit is refused before it is acknowledged,
/// under its own drop reason, and answered at once with a zero window (so its sender
/// probes rather than backing off until it gives up); the window already announced still
/// counts. The application's read announces the window again at once, and an in-order
/// segment to a connection with nothing left to read is taken with no room at all
/// (every reading application makes progress), while an out-of-order one is not.
#[test]
fn a_segment_over_the_stack_wide_bound_is_refused_with_a_zero_window() {
    let mut c = established(cfg(64 << 10));
    let mut nic = Nic::default();
    let data = stream(3000);
    let seg = |i: usize| data_seg(PEER_ISS + 1 + (i * 1000) as u32, 1000);
    let piece = |nic: &mut Nic, i: usize| nic.rx(&data[i * 1000..(i + 1) * 1000]);
    let window_of = |c: &mut Connection| {
        let mut w = Vec::new();
        while let Some(s) = c.poll_segment(t(2)) {
            w.push((s.repr.ack.0.wrapping_sub(PEER_ISS + 1), s.repr.window));
        }
        w
    };
    // Room for it: taken by header prediction.
    let p = piece(&mut nic, 0);
    let _ = c.on_segment_path(t(2), &seg(0), p, isize::MAX);
    assert_eq!(c.counters.fast_path_hits, 1);
    let w = window_of(&mut c);
    assert!(w.iter().all(|&(a, wnd)| a == 1000 && wnd > 0), "{w:?}");
    // No room, data still unread: refused, counted apart, and a zero window at once.
    let p = piece(&mut nic, 1);
    let (_, predicted) = c.on_segment_path(t(2), &seg(1), p, 0);
    assert!(!predicted);
    assert_eq!(c.counters.drops(DropReason::RcvMemoryGlobal), 1);
    assert_eq!(c.counters.drops(DropReason::RcvMemory), 0);
    assert_eq!(
        window_of(&mut c),
        vec![(1000, 0)],
        "not acknowledged, zero window"
    );
    // Out of order, no room: refused too (nothing to prune but itself).
    let p = piece(&mut nic, 2);
    let _ = c.on_segment_path(t(2), &seg(2), p, 0);
    assert_eq!(c.counters.drops(DropReason::RcvMemoryGlobal), 2);
    assert_eq!(c.ooo_bytes(), 0);
    assert_eq!(window_of(&mut c), vec![(1000, 0)]);
    assert_eq!(read_all(&mut c), &data[..1000]);
    let w = window_of(&mut c);
    assert!(
        w.len() == 1 && w[0].0 == 1000 && w[0].1 > 0,
        "the read reopens the window at once: {w:?}"
    );
    // Nothing left to read: the in-order segment is taken with no room (and the next
    // one after it: the window announced before the zero one still counts, RFC 7323
    // §2.4).
    let p = piece(&mut nic, 1);
    let _ = c.on_segment_path(t(2), &seg(1), p, 0);
    assert_eq!(c.counters.drops(DropReason::RcvMemoryGlobal), 2);
    let w = window_of(&mut c);
    assert!(w.iter().any(|&(a, wnd)| a == 2000 && wnd > 0), "{w:?}");
    let p = piece(&mut nic, 2);
    let _ = c.on_segment_path(t(2), &seg(2), p, isize::MAX);
    assert_eq!(read_all(&mut c), &data[1000..]);
}

/// The floor (`TcpConfig::rcv_mem_min`, Linux's `tcp_rmem[0]`): with the stack-wide
/// bound's free part used up (`room` below 0), a connection whose application reads may
/// still take segments out of the reserve while it holds less than its floor, in order
/// or not (so the SACKs of what arrives after a refused segment repair it by fast
/// retransmit), and offers the window its floor holds. One whose application has not
/// read gets only the progress rule's segment, and nobody gets more than the reserve.
#[test]
fn the_floor_takes_a_reading_connections_segments_out_of_the_reserve() {
    let floor = 16 << 10;
    let mut c = established(TcpConfig {
        rcv_mem_min: floor,
        ..cfg(64 << 10)
    });
    let reserve = 64 << 10;
    c.set_rcv_reserve(reserve);
    let mut nic = Nic::default();
    // Segments of 1,400 bytes: not sparse in their 2 KiB buffers (nothing is collapsed).
    const SZ: usize = 1400;
    let data = stream(40 * SZ);
    let seg = |i: usize| data_seg(PEER_ISS + 1 + (i * SZ) as u32, SZ);
    let mut piece = |i: usize| nic.rx(&data[i * SZ..(i + 1) * SZ]);
    let refused = |c: &Connection| c.counters.drops(DropReason::RcvMemoryGlobal);
    let truesize = (RX_BUF + crate::tcp::SEG_OVERHEAD) as u32;
    // The free part is used up: other connections hold 1 KiB of the reserve.
    let room = -(1 << 10);
    // Not read yet: the first in-order segment (the progress rule), nothing from the
    // reserve.
    let _ = c.on_segment_path(t(2), &seg(0), piece(0), room);
    let _ = c.on_segment_path(t(2), &seg(1), piece(1), room);
    assert_eq!(refused(&c), 1);
    assert_eq!(read_all(&mut c), &data[..SZ]);
    // It reads: out of order (a hole at 1) and in order, while it holds less than its
    // floor; then refused, at most one segment past it.
    let _ = c.on_segment_path(t(3), &seg(2), piece(2), room);
    assert_eq!((refused(&c), c.ooo_bytes()), (1, SZ), "taken out of order");
    let mut i = 1;
    while refused(&c) == 1 {
        let _ = c.on_segment_path(t(3), &seg(i), piece(i), room);
        i += if i == 1 { 2 } else { 1 };
    }
    let held = c.recv_mem() as u32;
    assert!(held >= floor && held < floor + truesize, "{held} held");
    assert_eq!(read_all(&mut c).len(), (i - 2) * SZ);
    // Nothing held: the window is what the floor holds at the ratio the data comes with
    // (about 2/3: 1,400 bytes in 2,176 of truesize), not the 64 KiB of the byte window.
    let (wnd, _) = c.rcv_wnd_mem();
    assert!(wnd >= floor / 2 && wnd <= floor * 3 / 4, "window {wnd}");
    // The reserve nearly used up too: the progress rule only, floor or not.
    let room = 1000 - reserve as isize;
    let before = refused(&c);
    let _ = c.on_segment_path(t(4), &seg(i - 1), piece(i - 1), room);
    let _ = c.on_segment_path(t(4), &seg(i), piece(i), room);
    assert_eq!(refused(&c), before + 1);
    assert_eq!(read_all(&mut c), &data[(i - 1) * SZ..i * SZ]);
    // No reserve (a connection on its own, or a floor of 0): the bound as it was, under
    // the floor or not.
    c.set_rcv_reserve(0);
    let _ = c.on_segment_path(t(5), &seg(i), piece(i), -1);
    let _ = c.on_segment_path(t(5), &seg(i + 1), piece(i + 1), -1);
    assert_eq!(refused(&c), before + 2);
    assert_eq!(read_all(&mut c), &data[i * SZ..(i + 1) * SZ]);
}

/// A simulated peer for the window tests: it sends 1-byte segments (each in its own
/// 2 KiB receive buffer) up to the right edge the connection last offered, at most
/// `burst` per millisecond, and keeps a retransmission timer and a persist timer as a
/// sender does. What it was offered is checked as it goes: the right edge never moves left.
struct TinyPeer {
    /// Bytes acknowledged, sent, and the right edge offered (offsets from the stream's
    /// start).
    una: u32,
    nxt: u32,
    edge: u32,
    /// When `una` last moved (or data was first sent unacknowledged).
    progress_at: u64,
    /// Retransmissions on the retransmission timer, and zero-window stalls that only the
    /// persist timer would have ended.
    rto_rexmits: u32,
    persist_stalls: u32,
    /// The windows offered in the connection's ACKs.
    windows: Vec<u16>,
    /// ACKs that acknowledged nothing new but moved the right edge: window updates.
    updates: u32,
}

impl TinyPeer {
    const RTO_MS: u64 = 200;

    fn new(c: &mut Connection) -> Self {
        let mut p = TinyPeer {
            una: 0,
            nxt: 0,
            edge: 0,
            progress_at: 0,
            rto_rexmits: 0,
            persist_stalls: 0,
            windows: Vec::new(),
            updates: 0,
        };
        // The window of the handshake's ACK.
        p.edge = u32::from(c.rcv_wnd_for_check().min(u32::from(u16::MAX)) as u16);
        p
    }

    /// Takes every segment the connection sends.
    fn hear(&mut self, c: &mut Connection, ms: u64) {
        while let Some(s) = c.poll_segment(t(ms)) {
            let ack = s.repr.ack.0.wrapping_sub(PEER_ISS + 1);
            let edge = ack + u32::from(s.repr.window);
            assert!(
                edge >= self.edge || ack < self.una,
                "the right edge moved left: {} after {}",
                edge,
                self.edge
            );
            if ack > self.una {
                self.una = ack;
                self.progress_at = ms;
            } else if ack == self.una && edge > self.edge {
                self.updates += 1;
            }
            self.edge = self.edge.max(edge);
            self.windows.push(s.repr.window);
        }
    }

    /// One millisecond: the timers, then up to `burst` new bytes (or the retransmission).
    fn send(
        &mut self,
        c: &mut Connection,
        nic: &mut Nic,
        data: &[u8],
        ms: u64,
        burst: usize,
        room: impl Fn(&Connection) -> usize,
    ) {
        if self.una < self.nxt && ms - self.progress_at >= Self::RTO_MS {
            // RFC 6298 §5.4: the timer expired, go back to SND.UNA.
            self.rto_rexmits += 1;
            self.nxt = self.una;
            self.progress_at = ms;
        }
        if self.una == self.nxt && self.edge <= self.nxt && (self.nxt as usize) < data.len() {
            if ms - self.progress_at >= Self::RTO_MS {
                // RFC 9293 §3.8.6.1: only a window probe would reopen it.
                self.persist_stalls += 1;
                self.progress_at = ms;
            }
            return;
        }
        let mut sent = 0;
        while sent < burst && self.nxt < self.edge && (self.nxt as usize) < data.len() {
            let i = self.nxt as usize;
            if self.una == self.nxt {
                self.progress_at = ms;
            }
            let seg = data_seg(PEER_ISS + 1 + self.nxt, 1);
            let r = room(c).min(isize::MAX as usize) as isize;
            let _ = c.on_segment_path(t(ms), &seg, nic.rx(&data[i..=i]), r);
            self.nxt += 1;
            sent += 1;
            self.hear(c, ms);
        }
    }
}

/// The window a connection offers is what its receive memory holds, at the ratio of
/// payload to truesize its data arrives with (Linux's `tcp_win_from_space`), under its
/// own bound (twice `rcv_buf`) and under what the stack-wide bound leaves it (`room`).
/// A peer sending 1-byte segments, each keeping a 2 KiB receive buffer, to an
/// application that reads every millisecond: once the window of the handshake is used
/// up, the window offered shrinks to the few bytes the memory holds of such segments
/// (16 KiB buffer: 32 KiB of memory, 15 of them), the right edge never moves left, the
/// reads' window updates go out at once (no zero window that only a probe would
/// reopen), and nothing is refused, so the peer never retransmits on its timer: the
/// stream arrives at the pace memory allows, with no collapse after the first window.
#[test]
fn rfc9293_3_8_6_2_2_the_window_follows_receive_memory_for_one_byte_segments() {
    for budget in [None, Some(8 << 10)] {
        let rcv_buf = 16 << 10;
        let mut c = established(cfg(rcv_buf));
        let mut nic = Nic::default();
        let data = stream(20_000);
        let mut peer = TinyPeer::new(&mut c);
        let room =
            |c: &Connection| budget.map_or(usize::MAX, |b: usize| b.saturating_sub(c.recv_mem()));
        let mut got = Vec::new();
        let mut collapsed_after_first_window = None;
        // The windows offered once the handshake's is used up (and the ratio learnt).
        let mut late_from = None;
        let mut ms = 2;
        while (peer.una as usize) < data.len() {
            assert!(
                ms < 60_000,
                "stalled at {} of {} bytes",
                peer.una,
                data.len()
            );
            peer.send(&mut c, &mut nic, &data, ms, 64, room);
            got.extend(read_all(&mut c));
            peer.hear(&mut c, ms);
            if peer.una >= rcv_buf && collapsed_after_first_window.is_none() {
                collapsed_after_first_window = Some(c.counters.rcv_collapsed);
                late_from = Some((peer.windows.len(), ms));
            }
            ms += 1;
        }
        assert_eq!(got, data, "in order and intact");
        assert_eq!(
            (peer.rto_rexmits, peer.persist_stalls),
            (0, 0),
            "budget {budget:?}: no retransmission timeout, no stall"
        );
        let k = &c.counters;
        assert_eq!(
            (
                k.drops(DropReason::RcvMemory),
                k.drops(DropReason::RcvMemoryGlobal)
            ),
            (0, 0),
            "nothing refused: {k:?}"
        );
        assert_eq!(
            Some(k.rcv_collapsed),
            collapsed_after_first_window,
            "after the first window the flight fits the memory uncollapsed"
        );
        // What 32 KiB (or the 8 KiB budget) holds of 1-byte segments in 2,176-byte
        // buffers: 15 (3); the window is never more, once the handshake's is used up.
        let holds = budget.unwrap_or(2 * rcv_buf as usize) / (RX_BUF + crate::tcp::SEG_OVERHEAD);
        let (late_from, late_ms) = late_from.unwrap();
        let late = &peer.windows[late_from..];
        assert!(
            late.iter().all(|&w| usize::from(w) <= holds),
            "budget {budget:?}: windows offered {:?}",
            &late[..late.len().min(40)]
        );
        assert!(late.iter().any(|&w| w > 0));
        // The reads' window updates: what reopened the window each time the peer had
        // filled it.
        assert!(peer.updates as usize >= (data.len() - rcv_buf as usize) / holds / 2);
        // The pace memory allows: about the window's worth per read (1 ms), where a
        // retransmission timer would take 200 ms.
        let rest = (data.len() - rcv_buf as usize) as u64;
        assert!(
            ms - late_ms <= 2 * rest / holds as u64,
            "{} ms for the last {rest} bytes",
            ms - late_ms
        );
    }
}

/// Full-sized segments (truesize about 1.5 times their bytes, a ratio above 1/2) keep
/// the whole window: the memory bound (twice `rcv_buf`) holds more than the buffer, so
/// an application that reads is offered all of `rcv_buf` after each read, and every
/// in-order segment takes header prediction.
#[test]
fn full_sized_segments_keep_the_whole_window() {
    let rcv_buf = 64 << 10;
    let mut c = established(cfg(rcv_buf));
    let mut nic = Nic::default();
    let mss = 1448;
    let data = stream(40 * mss);
    let mut acked = 0;
    for (k, chunk) in data.chunks(mss).enumerate() {
        let seq = PEER_ISS + 1 + (k * mss) as u32;
        c.on_segment(t(2), &data_seg(seq, mss), nic.rx(chunk));
        acks(&mut c, t(2), &mut acked);
        if k % 8 == 7 {
            read_all(&mut c);
            let mut w = Vec::new();
            while let Some(s) = c.poll_segment(t(2)) {
                w.push(s.repr.window);
            }
            assert_eq!(w, vec![65535], "the read reopens the whole window");
        }
    }
    assert_eq!(c.counters.fast_path_hits, 40);
    assert_eq!(c.counters.rcv_collapsed, 0);
}
