//! Connection state-machine tests: per-state fixtures driven by scripted peer segments, and a
//! two-endpoint pair over a lossy in-memory link. Each test names the rule it proves.

use super::*;
use crate::tcp::config::{CcAlgorithm, TcpConfig};
use core::net::Ipv4Addr;
use std::collections::VecDeque;

const ISS: u32 = 1000;
const PEER_ISS: u32 = 5000;

fn addr_a() -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 61440)
}
fn addr_b() -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 7000)
}
fn tuple_a() -> FourTuple {
    FourTuple {
        local: addr_a(),
        remote: addr_b(),
    }
}
fn tuple_b() -> FourTuple {
    FourTuple {
        local: addr_b(),
        remote: addr_a(),
    }
}

fn t(ms: u64) -> Instant {
    Instant::from_millis(ms)
}

fn zb(bytes: &[u8]) -> Zbuf {
    Zbuf::copy_from_slice(bytes)
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// A segment from the peer (B) to the connection under test (A).
fn seg(flags: TcpFlags, seq: u32, ack: u32, window: u16) -> TcpRepr {
    TcpRepr {
        src_port: addr_b().port(),
        dst_port: addr_a().port(),
        seq: SeqNum(seq),
        ack: SeqNum(ack),
        flags,
        window,
        urgent: 0,
        options: TcpOptions::default(),
    }
}

fn ack_seg(seq: u32, ack: u32, window: u16) -> TcpRepr {
    seg(TcpFlags::ACK, seq, ack, window)
}

fn poll_all(c: &mut Connection, now: Instant) -> Vec<OutSegment> {
    let mut out = Vec::new();
    while let Some(s) = c.poll_segment(now) {
        out.push(s);
        assert!(out.len() < 10_000, "poll_segment does not terminate");
    }
    out
}

fn plain_cfg() -> TcpConfig {
    // No options: keeps scripted segments small. Tests that need options turn them on.
    TcpConfig {
        timestamps: false,
        sack: false,
        window_scaling: false,
        ..TcpConfig::default()
    }
}

/// Active open to ESTABLISHED against a scripted peer (no options unless `cfg` asks and the
/// peer's SYN-ACK carries them).
fn established_with(cfg: TcpConfig, peer_opts: TcpOptions) -> Connection {
    let mut c = Connection::connect(t(0), tuple_a(), cfg, SeqNum(ISS), 0);
    let out = poll_all(&mut c, t(0));
    assert_eq!(out.len(), 1);
    assert!(out[0].repr.flags.syn());
    let mut synack = seg(TcpFlags::SYN | TcpFlags::ACK, PEER_ISS, ISS + 1, 65535);
    synack.options = peer_opts;
    synack.options.mss = synack.options.mss.or(Some(1460));
    c.on_segment(t(1), &synack, Zbuf::copy_from_slice(&[]));
    assert_eq!(c.state(), State::Established);
    let out = poll_all(&mut c, t(1));
    assert_eq!(out.len(), 1, "the handshake's final ACK");
    assert_eq!(out[0].repr.flags, TcpFlags::ACK);
    c.take_events();
    c
}

fn established() -> Connection {
    established_with(plain_cfg(), TcpOptions::default())
}

/// A passive connection in SYN-RECEIVED, made from the peer's SYN (ISN `PEER_ISS`).
fn syn_received(cfg: TcpConfig, window: u16, mss: Option<u16>) -> Connection {
    let syn = SynInfo {
        seq: SeqNum(PEER_ISS),
        window,
        options: TcpOptions {
            mss,
            ..Default::default()
        },
    };
    Connection::accept_syn(t(0), tuple_a(), cfg, SeqNum(ISS), 0, &syn)
}

// ---------------------------------------------------------------------------------------------
// Handshake
// ---------------------------------------------------------------------------------------------

#[test]
fn rfc9293_3_5_active_open_offers_options_and_completes() {
    let cfg = TcpConfig::default();
    let mut c = Connection::connect(t(0), tuple_a(), cfg.clone(), SeqNum(ISS), 77);
    let syn = c.poll_segment(t(0)).expect("SYN");
    assert_eq!(syn.repr.flags, TcpFlags::SYN);
    assert_eq!(syn.repr.seq, SeqNum(ISS));
    assert_eq!(syn.repr.options.mss, Some(cfg.mss));
    assert_eq!(syn.repr.options.window_scale, Some(cfg.rcv_wscale()));
    assert!(syn.repr.options.sack_permitted);
    assert!(syn.repr.options.timestamps.is_some());
    assert!(c.poll_segment(t(0)).is_none(), "one SYN only");

    let mut synack = seg(TcpFlags::SYN | TcpFlags::ACK, PEER_ISS, ISS + 1, 65535);
    synack.options = TcpOptions {
        mss: Some(1400),
        window_scale: Some(7),
        sack_permitted: true,
        timestamps: Some(Timestamps {
            tsval: 9,
            tsecr: syn.repr.options.timestamps.unwrap().tsval,
        }),
        ..TcpOptions::default()
    };
    c.on_segment(t(2), &synack, zb(&[]));
    assert_eq!(c.state(), State::Established);
    assert!(c.take_events().connected);
    assert_eq!(c.mss(), 1400);
    assert_eq!(c.negotiated(), (true, true, Some((7, cfg.rcv_wscale()))));
    let ack = c.poll_segment(t(2)).expect("ACK");
    assert_eq!(ack.repr.flags, TcpFlags::ACK);
    assert_eq!(ack.repr.ack, SeqNum(PEER_ISS + 1));
    assert_eq!(
        ack.repr.options.timestamps.unwrap().tsecr,
        9,
        "RFC 7323 §4.3: echo TS.Recent"
    );
}

#[test]
fn rfc7323_2_3_wscale_above_14_is_clamped() {
    let opts = TcpOptions {
        window_scale: Some(15),
        ..TcpOptions::default()
    };
    let cfg = TcpConfig {
        timestamps: false,
        sack: false,
        ..TcpConfig::default()
    };
    let mut c = established_with(cfg, opts);
    assert_eq!(c.negotiated().2.unwrap().0, 14);
    c.on_segment(t(2), &ack_seg(PEER_ISS + 1, ISS + 1, 1), zb(&[]));
    assert_eq!(c.send_window(), 1 << 14);
}

#[test]
fn rfc9293_3_10_7_3_syn_sent_drops_bare_ack_and_rst_without_ack() {
    let mut c = Connection::connect(t(0), tuple_a(), plain_cfg(), SeqNum(ISS), 0);
    poll_all(&mut c, t(0));
    // A bare ACK acknowledging our SYN but without SYN: not a handshake (known bug class).
    c.on_segment(t(1), &ack_seg(PEER_ISS, ISS + 1, 1000), zb(&[]));
    assert_eq!(c.state(), State::SynSent);
    assert!(poll_all(&mut c, t(1)).is_empty());
    // RST without ACK: ignored.
    c.on_segment(t(1), &seg(TcpFlags::RST, 0, 0, 0), zb(&[]));
    assert_eq!(c.state(), State::SynSent);
    assert_eq!(c.counters.drops(DropReason::SynSentInvalid), 2);
}

#[test]
fn rfc9293_3_10_7_3_syn_sent_unacceptable_ack_gets_rst() {
    let mut c = Connection::connect(t(0), tuple_a(), plain_cfg(), SeqNum(ISS), 0);
    poll_all(&mut c, t(0));
    c.on_segment(
        t(1),
        &seg(TcpFlags::SYN | TcpFlags::ACK, PEER_ISS, ISS + 50, 1000),
        zb(&[]),
    );
    assert_eq!(c.state(), State::SynSent);
    let out = poll_all(&mut c, t(1));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].repr.flags, TcpFlags::RST);
    assert_eq!(out[0].repr.seq, SeqNum(ISS + 50), "<SEQ=SEG.ACK><CTL=RST>");
}

#[test]
fn rfc9293_3_10_7_3_rst_with_acceptable_ack_refuses() {
    let mut c = Connection::connect(t(0), tuple_a(), plain_cfg(), SeqNum(ISS), 0);
    poll_all(&mut c, t(0));
    c.on_segment(
        t(1),
        &seg(TcpFlags::RST | TcpFlags::ACK, 0, ISS + 1, 0),
        zb(&[]),
    );
    assert_eq!(c.state(), State::Closed);
    assert_eq!(c.close_reason(), Some(CloseReason::Refused));
    assert!(c.take_events().closed);
    assert_eq!(c.send(&zb(b"x")), Err(SendError::Closed));
    assert_eq!(c.recv(), Err(RecvError::Closed));
}

/// Regression (found by the smoltcp differential test): `close()` in SYN-SENT deleted the
/// TCB even with data queued, so send-then-shutdown on a connecting socket lost the data and
/// still reported a normal close. RFC 9293 §3.10.4: the FIN is queued behind the data.
#[test]
fn close_in_syn_sent_with_queued_data_sends_data_then_fin() {
    let mut c = Connection::connect(t(0), tuple_a(), plain_cfg(), SeqNum(ISS), 0);
    poll_all(&mut c, t(0));
    assert_eq!(c.send(&zb(&pattern(3000, 1))), Ok(3000));
    c.close();
    assert_eq!(c.state(), State::SynSent, "the handshake goes on");
    assert_eq!(c.send(&zb(b"x")), Err(SendError::Shutdown));
    c.on_segment(
        t(1),
        &seg(TcpFlags::SYN | TcpFlags::ACK, PEER_ISS, ISS + 1, 65535),
        zb(&[]),
    );
    assert_eq!(c.state(), State::FinWait1);
    let out = poll_all(&mut c, t(1));
    let data: usize = out.iter().map(|s| s.payload.len()).sum();
    assert_eq!(data, 3000);
    let last = out.last().unwrap();
    assert!(last.repr.flags.fin(), "FIN after the data");
    assert_eq!(
        last.repr.seq + last.payload.len() as u32,
        SeqNum(ISS + 1 + 3000)
    );
    c.on_segment(t(2), &ack_seg(PEER_ISS + 1, ISS + 3002, 65535), zb(&[]));
    assert_eq!(c.state(), State::FinWait2);
    // With nothing queued, close in SYN-SENT still deletes the TCB (RFC 9293 §3.10.4).
    let mut c = Connection::connect(t(0), tuple_a(), plain_cfg(), SeqNum(ISS), 0);
    poll_all(&mut c, t(0));
    c.close();
    assert_eq!(c.state(), State::Closed);
}

#[test]
fn rfc9293_3_5_simultaneous_open() {
    let mut c = Connection::connect(t(0), tuple_a(), plain_cfg(), SeqNum(ISS), 0);
    poll_all(&mut c, t(0));
    c.on_segment(t(1), &seg(TcpFlags::SYN, PEER_ISS, 0, 8000), zb(&[]));
    assert_eq!(c.state(), State::SynReceived);
    let out = poll_all(&mut c, t(1));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].repr.flags, TcpFlags::SYN | TcpFlags::ACK);
    assert_eq!(out[0].repr.seq, SeqNum(ISS));
    assert_eq!(out[0].repr.ack, SeqNum(PEER_ISS + 1));
    c.on_segment(
        t(2),
        &seg(TcpFlags::SYN | TcpFlags::ACK, PEER_ISS, ISS + 1, 8000),
        zb(&[]),
    );
    // The peer's SYN-ACK: its SYN is old (challenge-ACKed), but its ACK is not processed
    // before the SYN check. A plain ACK completes the handshake.
    c.on_segment(t(2), &ack_seg(PEER_ISS + 1, ISS + 1, 8000), zb(&[]));
    assert_eq!(c.state(), State::Established);
}

#[test]
fn rfc9293_3_10_7_2_passive_open_and_reset_returns_to_listen() {
    let mut c = syn_received(plain_cfg(), 4000, Some(1000));
    assert_eq!(c.state(), State::SynReceived);
    let out = poll_all(&mut c, t(0));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].repr.flags, TcpFlags::SYN | TcpFlags::ACK);
    assert_eq!(out[0].repr.ack, SeqNum(PEER_ISS + 1));
    assert_eq!(out[0].repr.options.mss, Some(1460));
    assert!(
        !out[0].repr.options.sack_permitted,
        "not offered by the peer"
    );
    assert_eq!(c.mss(), 1000);
    // Retransmitted SYN: the SYN-ACK goes out again.
    c.on_segment(t(1), &seg(TcpFlags::SYN, PEER_ISS, 0, 4000), zb(&[]));
    let out = poll_all(&mut c, t(1));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].repr.flags, TcpFlags::SYN | TcpFlags::ACK);
    // RST at RCV.NXT: back to LISTEN, i.e. the stack removes this connection.
    let d = c.on_segment(t(2), &seg(TcpFlags::RST, PEER_ISS + 1, 0, 0), zb(&[]));
    assert_eq!(d, Disposition::Remove);
}

#[test]
fn rfc9293_3_10_7_4_syn_received_bad_ack_gets_rst() {
    let mut c = syn_received(plain_cfg(), 4000, None);
    poll_all(&mut c, t(0));
    c.on_segment(t(1), &ack_seg(PEER_ISS + 1, ISS + 77, 4000), zb(&[]));
    assert_eq!(c.state(), State::SynReceived);
    let out = poll_all(&mut c, t(1));
    assert_eq!(out[0].repr.flags, TcpFlags::RST);
    assert_eq!(out[0].repr.seq, SeqNum(ISS + 77));
    c.on_segment(t(1), &ack_seg(PEER_ISS + 1, ISS + 1, 4000), zb(&[]));
    assert_eq!(c.state(), State::Established);
    assert!(c.take_events().connected);
}

#[test]
fn rfc6298_syn_is_retransmitted_with_backoff_then_times_out() {
    let cfg = TcpConfig {
        syn_retries: 2,
        ..plain_cfg()
    };
    let mut c = Connection::connect(t(0), tuple_a(), cfg, SeqNum(ISS), 0);
    assert_eq!(poll_all(&mut c, t(0)).len(), 1);
    let first = c.poll_timeout().expect("RTO armed");
    c.on_timeout(first);
    let out = poll_all(&mut c, first);
    assert_eq!(out.len(), 1);
    assert!(out[0].repr.flags.syn());
    let second = c.poll_timeout().expect("RTO re-armed");
    assert!(
        second - first >= (first - t(0)) * 2 - Duration::from_millis(1),
        "RFC 6298 §5.5 backoff"
    );
    c.on_timeout(second);
    poll_all(&mut c, second);
    let third = c.poll_timeout().unwrap();
    c.on_timeout(third);
    assert_eq!(c.state(), State::Closed);
    assert_eq!(c.close_reason(), Some(CloseReason::Timeout));
}

/// Data segments of one flight after ESTABLISHED: what goes out before any ACK.
fn first_flight(c: &mut Connection, now: Instant) -> Vec<OutSegment> {
    assert_eq!(c.send(&zb(&pattern(20_000, 3))), Ok(20_000));
    poll_all(c, now)
        .into_iter()
        .filter(|s| !s.payload.is_empty())
        .collect()
}

#[test]
fn rfc5681_3_1_rfc6928_2_window_is_one_segment_after_a_lost_syn() {
    // Active open whose SYN the timer resent: one segment, not IW10, until it is ACKed.
    let mut c = Connection::connect(t(0), tuple_a(), plain_cfg(), SeqNum(ISS), 0);
    poll_all(&mut c, t(0));
    let rto = c.poll_timeout().expect("SYN timer");
    c.on_timeout(rto);
    assert!(poll_all(&mut c, rto)[0].repr.flags.syn(), "the SYN again");
    let at = rto + Duration::from_millis(5);
    let mut synack = seg(TcpFlags::SYN | TcpFlags::ACK, PEER_ISS, ISS + 1, 65535);
    synack.options.mss = Some(1000);
    c.on_segment(at, &synack, zb(&[]));
    assert_eq!(c.state(), State::Established);
    let flight = first_flight(&mut c, at);
    assert_eq!(flight.len(), 1, "RFC 6928 §2: one segment after a lost SYN");
    assert_eq!(flight[0].payload.len(), 1000);
    // Its ACK opens the window as slow start does.
    c.on_segment(
        at + Duration::from_millis(10),
        &ack_seg(PEER_ISS + 1, ISS + 1001, 65535),
        zb(&[]),
    );
    let next = poll_all(&mut c, at + Duration::from_millis(10));
    assert_eq!(next.iter().filter(|s| !s.payload.is_empty()).count(), 2);

    // The same handshake without the loss sends the initial window at once.
    let mut c = Connection::connect(t(0), tuple_a(), plain_cfg(), SeqNum(ISS), 0);
    poll_all(&mut c, t(0));
    c.on_segment(t(5), &synack, zb(&[]));
    assert_eq!(first_flight(&mut c, t(5)).len(), 10, "IW10 (RFC 6928)");
}

#[test]
fn rfc5681_3_1_rfc6928_2_window_is_one_segment_after_a_lost_syn_ack() {
    let mut c = syn_received(plain_cfg(), 65535, Some(1000));
    poll_all(&mut c, t(0));
    let rto = c.poll_timeout().expect("SYN-ACK timer");
    c.on_timeout(rto);
    assert_eq!(
        poll_all(&mut c, rto)[0].repr.flags,
        TcpFlags::SYN | TcpFlags::ACK
    );
    let at = rto + Duration::from_millis(5);
    c.on_segment(at, &ack_seg(PEER_ISS + 1, ISS + 1, 65535), zb(&[]));
    assert_eq!(c.state(), State::Established);
    assert_eq!(
        first_flight(&mut c, at).len(),
        1,
        "one segment after a lost SYN-ACK"
    );
}

#[test]
fn rfc9293_3_8_3_syn_is_retransmitted_for_at_least_three_minutes() {
    // MUST-23: R2 for a SYN provides retransmission for at least 3 minutes (defaults).
    let mut c = Connection::connect(t(0), tuple_a(), TcpConfig::default(), SeqNum(ISS), 0);
    let mut syns = vec![t(0)];
    poll_all(&mut c, t(0));
    while c.state() == State::SynSent {
        let at = c
            .poll_timeout()
            .expect("the SYN timer runs until it gives up");
        c.on_timeout(at);
        if poll_all(&mut c, at).iter().any(|s| s.repr.flags.syn()) {
            syns.push(at);
        }
        if c.state() == State::Closed {
            assert!(at >= t(180_000), "gave up after {at:?}");
            assert_eq!(c.close_reason(), Some(CloseReason::Timeout));
        }
        assert!(syns.len() < 20, "bounded");
    }
    assert_eq!(syns.len(), 8, "the SYN and 7 retransmissions: {syns:?}");
}

#[test]
fn a_half_open_passive_connection_gives_up_after_synack_retries() {
    // The SYN-ACK has its own limit (Linux tcp_synack_retries): 6 resends, then 123 s (the back-off is capped at the 60 s max RTO).
    let mut c = syn_received(TcpConfig::default(), 65535, None);
    let mut synacks = 0;
    let mut at = t(0);
    for _ in 0..20 {
        synacks += poll_all(&mut c, at)
            .iter()
            .filter(|s| s.repr.flags.syn())
            .count();
        if c.state() == State::Closed {
            break;
        }
        at = c.poll_timeout().expect("SYN-ACK timer");
        c.on_timeout(at);
    }
    assert_eq!(c.state(), State::Closed);
    assert_eq!(synacks, 7, "the SYN-ACK and 6 retransmissions");
    assert_eq!(at, t(123_000));
}

#[test]
fn rfc9293_3_10_7_4_an_ack_below_snd_una_does_not_update_the_window() {
    let mut c = established();
    assert_eq!(c.send(&zb(&pattern(3000, 1))), Ok(3000));
    poll_all(&mut c, t(2));
    c.on_segment(t(3), &ack_seg(PEER_ISS + 1, ISS + 2001, 30_000), zb(&[]));
    assert_eq!(c.snd_wnd, 30_000);
    // Newer in sequence space (in the window, past SND.WL1), older ACK (inside the RFC
    // 5961 §5.2 range, so not dropped): a duplicate, which must not close the window.
    c.on_segment(t(4), &ack_seg(PEER_ISS + 3, ISS + 1001, 0), zb(&[]));
    assert_eq!(c.snd_una, SeqNum(ISS + 2001));
    assert_eq!(
        c.snd_wnd, 30_000,
        "SND.UNA =< SEG.ACK is required for an update"
    );
    // A current ACK still updates it.
    c.on_segment(t(5), &ack_seg(PEER_ISS + 1, ISS + 2001, 20_000), zb(&[]));
    assert_eq!(c.snd_wnd, 20_000);
}

#[test]
fn isn_ffffffff_connection_transfers_across_wrap() {
    let mut c = Connection::connect(t(0), tuple_a(), plain_cfg(), SeqNum(u32::MAX), 0);
    poll_all(&mut c, t(0));
    c.on_segment(
        t(1),
        &seg(TcpFlags::SYN | TcpFlags::ACK, u32::MAX - 1, 0, 65535),
        zb(&[]),
    );
    assert_eq!(c.state(), State::Established);
    poll_all(&mut c, t(1));
    c.send(&zb(&pattern(3000, 1))).unwrap();
    let out = poll_all(&mut c, t(1));
    assert_eq!(out[0].repr.seq, SeqNum(0));
    let total: usize = out.iter().map(|s| s.payload.len()).sum();
    assert_eq!(total, 3000);
    c.on_segment(t(2), &ack_seg(u32::MAX, 3000, 65535), zb(&[]));
    assert_eq!(c.bytes_in_flight(), 0);
    // Peer data wrapping its sequence space too.
    c.on_segment(t(2), &ack_seg(u32::MAX, 3000, 65535), zb(b"abc"));
    assert_eq!(c.recv().unwrap().unwrap().as_ref(), b"abc");
}

/// RFC 9293 §3.10.7.4 (the overlap attack): segments repeating bytes the connection
/// already holds, with different contents (out of order or below RCV.NXT), never replace them: the application reads the first copy of every byte, and
/// `dup_bytes_in` counts each repeated byte once.
#[test]
fn rfc9293_3_10_7_4_overlapping_segments_with_different_bytes_keep_the_first_copy() {
    let mut c = established();
    let base = PEER_ISS + 1;
    let real = pattern(3000, 5);
    let forged = vec![b'X'; 3000];
    let data = |at: usize, len: usize, bytes: &[u8]| {
        (
            ack_seg(base + at as u32, ISS + 1, 65535),
            zb(&bytes[at..at + len]),
        )
    };
    // Out of order: [1000, 2000) first, then a forged copy inside it and one covering it
    // exactly.
    for (s, p) in [
        data(1000, 1000, &real),
        data(1200, 300, &forged),
        data(1000, 1000, &forged),
    ] {
        c.on_segment(t(2), &s, p);
    }
    assert_eq!(c.dup_bytes_in(), 1300);
    // In order [0, 1000): delivers up to 2000. Then a forged copy below RCV.NXT.
    c.on_segment(t(3), &data(0, 1000, &real).0, data(0, 1000, &real).1);
    c.on_segment(t(3), &data(100, 800, &forged).0, data(100, 800, &forged).1);
    assert_eq!(c.dup_bytes_in(), 2100);
    let mut got = Vec::new();
    while let Ok(Some(b)) = c.recv() {
        got.extend_from_slice(&b);
    }
    assert_eq!(got, real[..2000], "the first copy of every byte");
    assert_eq!(c.ooo_bytes(), 0);
}

#[test]
fn zero_mss_option_is_floored_and_data_still_flows() {
    let opts = TcpOptions {
        mss: Some(0),
        ..TcpOptions::default()
    };
    let mut c = established_with(plain_cfg(), opts);
    assert_eq!(c.mss(), MIN_SND_MSS);
    c.send(&zb(&pattern(500, 3))).unwrap();
    let out = poll_all(&mut c, t(2));
    assert!(out
        .iter()
        .all(|s| !s.payload.is_empty() && s.payload.len() as u32 <= MIN_SND_MSS));
    assert_eq!(out.iter().map(|s| s.payload.len()).sum::<usize>(), 500);
}

// ---------------------------------------------------------------------------------------------
// Data transfer
// ---------------------------------------------------------------------------------------------

#[test]
fn in_order_data_is_delivered_without_copy() {
    let mut c = established();
    let frame = zb(&pattern(1000, 9));
    let payload = frame.slice(0..1000);
    c.on_segment(t(2), &ack_seg(PEER_ISS + 1, ISS + 1, 65535), payload);
    assert!(c.take_events().readable);
    let got = c.recv().unwrap().unwrap();
    assert_eq!(
        got.as_ptr(),
        frame.as_ptr(),
        "the delivered buffer is the received one"
    );
    assert_eq!(got.as_ref(), &pattern(1000, 9)[..]);
    assert_eq!(c.recv(), Ok(None));
    let out = poll_all(&mut c, t(2));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].repr.ack, SeqNum(PEER_ISS + 1 + 1000));
}

/// Regression (found by the stack_listen fuzz target): `recv_iovec(0)` with data queued
/// fell through to `recv()`, which popped a buffer, and then hit `unreachable!` — a panic
/// reachable from the application API, and the popped data would have been lost.
#[test]
fn recv_iovec_with_max_zero_returns_empty_and_keeps_the_data() {
    let mut c = established();
    c.on_segment(t(2), &ack_seg(PEER_ISS + 1, ISS + 1, 65535), zb(b"hello"));
    let v = c.recv_iovec(0).unwrap();
    assert!(v.is_empty());
    assert_eq!(c.recv_available(), 5, "nothing was consumed");
    assert_eq!(c.recv_iovec(16).unwrap().to_vec(), b"hello");
    assert!(c.recv_iovec(0).unwrap().is_empty(), "no data: Ok(empty)");
    c.on_segment(
        t(3),
        &seg(TcpFlags::ACK | TcpFlags::FIN, PEER_ISS + 6, ISS + 1, 65535),
        zb(&[]),
    );
    assert_eq!(c.recv_iovec(0).unwrap_err(), RecvError::Finished);
}

#[test]
fn sent_data_references_the_application_buffer() {
    let mut c = established();
    let data = zb(&pattern(4000, 5));
    assert_eq!(c.send(&data), Ok(4000));
    let out = poll_all(&mut c, t(2));
    assert_eq!(out.len(), 3, "1460 + 1460 + 1080");
    assert_eq!(out[0].payload.segments()[0].as_ptr(), data.as_ptr());
    let bytes: Vec<u8> = out.iter().flat_map(|s| s.payload.to_vec()).collect();
    assert_eq!(bytes, pattern(4000, 5));
    assert!(out[2].repr.flags.psh());
}

#[test]
fn rfc9293_3_10_7_4_out_of_window_segment_is_acked_and_dropped() {
    let mut c = established();
    c.on_segment(
        t(2),
        &ack_seg(PEER_ISS + 1 + 70_000, ISS + 1, 65535),
        zb(b"late"),
    );
    assert_eq!(c.counters.drops(DropReason::OutOfWindow), 1);
    let out = poll_all(&mut c, t(2));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].repr.ack, SeqNum(PEER_ISS + 1));
    assert_eq!(c.recv_available(), 0);
}

#[test]
fn rfc9293_3_10_7_4_overlapping_retransmission_is_trimmed() {
    let mut c = established();
    c.on_segment(t(2), &ack_seg(PEER_ISS + 1, ISS + 1, 65535), zb(b"hello"));
    c.on_segment(
        t(2),
        &ack_seg(PEER_ISS + 1, ISS + 1, 65535),
        zb(b"hello world"),
    );
    let mut all = Vec::new();
    while let Ok(Some(b)) = c.recv() {
        all.extend_from_slice(&b);
    }
    assert_eq!(all, b"hello world");
}

#[test]
fn rfc2018_out_of_order_data_is_sacked_then_reassembled() {
    let cfg = TcpConfig {
        sack: true,
        ..plain_cfg()
    };
    let opts = TcpOptions {
        sack_permitted: true,
        ..TcpOptions::default()
    };
    let mut c = established_with(cfg, opts);
    let base = PEER_ISS + 1;
    c.on_segment(t(2), &ack_seg(base + 100, ISS + 1, 65535), zb(&[2u8; 100]));
    let out = poll_all(&mut c, t(2));
    assert_eq!(out.len(), 1, "RFC 5681 §4.2: immediate duplicate ACK");
    assert_eq!(out[0].repr.ack, SeqNum(base));
    assert_eq!(
        out[0].repr.options.sack_blocks.as_slice(),
        &[(SeqNum(base + 100), SeqNum(base + 200))]
    );
    assert_eq!(c.recv(), Ok(None));
    c.on_segment(t(3), &ack_seg(base, ISS + 1, 65535), zb(&[1u8; 100]));
    let mut all = Vec::new();
    while let Ok(Some(b)) = c.recv() {
        all.extend_from_slice(&b);
    }
    assert_eq!(all.len(), 200);
    assert!(all[..100].iter().all(|&b| b == 1) && all[100..].iter().all(|&b| b == 2));
    let out = poll_all(&mut c, t(3));
    assert_eq!(out.last().unwrap().repr.ack, SeqNum(base + 200));
    assert!(out.last().unwrap().repr.options.sack_blocks.is_empty());
}

/// Issue 13: a connection holds no out-of-order storage until a segment arrives out of
/// order (the bound, ~1,400 entries with the defaults, used to be reserved per connection),
/// and gives it back once the gap is filled and the queue drains.
#[test]
fn out_of_order_storage_is_allocated_on_reordering_and_released_after() {
    let mut c = established();
    assert_eq!(
        c.ooo.allocated_segments(),
        0,
        "nothing reserved at creation"
    );
    let base = PEER_ISS + 1;
    c.on_segment(t(2), &ack_seg(base, ISS + 1, 65535), zb(&[1u8; 100]));
    assert_eq!(
        c.ooo.allocated_segments(),
        0,
        "in-order data needs no queue"
    );
    // Three segments beyond a hole.
    for k in 2..5u32 {
        c.on_segment(
            t(2),
            &ack_seg(base + 100 * k, ISS + 1, 65535),
            zb(&[2u8; 100]),
        );
    }
    assert_eq!(c.ooo_bytes(), 300);
    let held = c.ooo.allocated_segments();
    assert!((3..=c.ooo.config().max_segments).contains(&held), "{held}");
    c.on_segment(t(3), &ack_seg(base + 100, ISS + 1, 65535), zb(&[3u8; 100]));
    assert_eq!(c.ooo_bytes(), 0);
    assert_eq!(c.recv_available(), 500);
    assert_eq!(c.ooo.allocated_segments(), 0, "released once drained");
}

#[test]
fn rfc9293_3_8_6_2_2_receiver_sws_opens_window_in_mss_steps() {
    let cfg = TcpConfig {
        rcv_buf: 8000,
        ..plain_cfg()
    };
    let mut c = established_with(cfg, TcpOptions::default());
    let base = PEER_ISS + 1;
    // 500-byte segments: each costs 628 bytes of receive memory (truesize), so the
    // memory bound (2 x rcv_buf) holds more than the buffer and the byte window rules.
    for i in 0..10 {
        c.on_segment(
            t(2),
            &ack_seg(base + i * 500, ISS + 1, 65535),
            zb(&[i as u8; 500]),
        );
    }
    let out = poll_all(&mut c, t(2));
    assert_eq!(out.last().unwrap().repr.window, 3000);
    // Reading 1000 bytes opens the window by less than one MSS (1460): no update.
    for _ in 0..2 {
        c.recv().unwrap().unwrap();
    }
    assert!(poll_all(&mut c, t(3)).is_empty());
    // Another 500 crosses the threshold: one update announcing all free space.
    c.recv().unwrap().unwrap();
    let out = poll_all(&mut c, t(3));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].repr.window, 4500);
    // The right edge never moves left: more data arrives, window shrinks only by what came.
    c.on_segment(
        t(4),
        &ack_seg(base + 5000, ISS + 1, 65535),
        zb(&[0u8; 1000]),
    );
    let out = poll_all(&mut c, t(4));
    assert_eq!(out[0].repr.window, 3500);
}

#[test]
fn rfc9293_3_8_6_1_zero_window_is_probed_with_backoff() {
    let mut c = established();
    let base = PEER_ISS + 1;
    c.on_segment(t(2), &ack_seg(base, ISS + 1, 0), zb(&[]));
    assert_eq!(c.send_window(), 0);
    c.send(&zb(&pattern(3000, 1))).unwrap();
    assert!(
        poll_all(&mut c, t(2)).is_empty(),
        "nothing goes into a zero window"
    );
    let p1 = c.poll_timeout().expect("persist timer");
    c.on_timeout(p1);
    let out = poll_all(&mut c, p1);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].payload.len(), 1, "one octet probe");
    assert_eq!(c.counters.window_probes, 1);
    // The peer still has no room: it ACKs without taking the octet.
    c.on_segment(p1, &ack_seg(base, ISS + 1, 0), zb(&[]));
    let p2 = c.poll_timeout().unwrap();
    assert!(p2 - p1 > p1 - t(2), "probe interval backs off");
    c.on_timeout(p2);
    assert_eq!(poll_all(&mut c, p2).len(), 1);
    assert_eq!(c.state(), State::Established, "answered probes never abort");
    // The window opens: the rest flows.
    c.on_segment(p2, &ack_seg(base, ISS + 1, 65535), zb(&[]));
    let out = poll_all(&mut c, p2);
    assert_eq!(out.iter().map(|s| s.payload.len()).sum::<usize>(), 3000);
    assert_eq!(out[0].repr.seq, SeqNum(ISS + 1));
}

#[test]
fn rfc9293_3_8_6_2_1_sender_sws_waits_with_nothing_in_flight_until_the_override_timeout() {
    let mut c = established();
    // The peer offered 65,535 bytes; with nothing in flight and 10,000 bytes queued it now
    // offers 500: a silly window, neither a full segment nor half the largest window.
    c.on_segment(t(2), &ack_seg(PEER_ISS + 1, ISS + 1, 500), zb(&[]));
    assert_eq!(c.send(&zb(&pattern(10_000, 1))), Ok(10_000));
    assert!(
        poll_all(&mut c, t(2)).is_empty(),
        "no 500-byte runt at once"
    );
    // No ACK will come: the persist timer is the override timeout (3.8.6.2.1 (4)).
    let at = c.poll_timeout().expect("override timer armed");
    assert!(at > t(2) && at <= t(2) + Duration::from_secs(2), "{at:?}");
    c.on_timeout(at);
    let out = poll_all(&mut c, at);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].repr.seq, SeqNum(ISS + 1));
    assert_eq!(
        out[0].payload.len(),
        500,
        "the window is filled after the timeout"
    );
    // Full segments go out at once, as before (the 1,080-byte rest of a 4,000-byte window
    // then waits for their ACKs).
    let later = at + Duration::from_millis(1);
    c.on_segment(later, &ack_seg(PEER_ISS + 1, ISS + 501, 4000), zb(&[]));
    let sizes: Vec<usize> = poll_all(&mut c, later)
        .iter()
        .map(|s| s.payload.len())
        .collect();
    assert_eq!(sizes, [1460, 1460]);
}

#[test]
fn rfc9293_3_7_4_nagle_holds_small_segments_when_enabled() {
    let mut c = established_with(
        TcpConfig {
            nagle: true,
            ..plain_cfg()
        },
        TcpOptions::default(),
    );
    c.send(&zb(b"a")).unwrap();
    assert_eq!(poll_all(&mut c, t(2)).len(), 1);
    c.send(&zb(b"b")).unwrap();
    assert!(
        poll_all(&mut c, t(2)).is_empty(),
        "held while 'a' is unacked"
    );
    c.on_segment(t(3), &ack_seg(PEER_ISS + 1, ISS + 2, 65535), zb(&[]));
    let out = poll_all(&mut c, t(3));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].payload.to_vec(), b"b");
    // Nagle off (the default): both go immediately.
    let mut d = established();
    d.send(&zb(b"a")).unwrap();
    poll_all(&mut d, t(2));
    d.send(&zb(b"b")).unwrap();
    assert_eq!(poll_all(&mut d, t(2)).len(), 1);
}

#[test]
fn send_buffer_limits_and_writable_event() {
    let mut c = established_with(
        TcpConfig {
            snd_buf: 3000,
            ..plain_cfg()
        },
        TcpOptions::default(),
    );
    assert_eq!(c.send(&zb(&pattern(5000, 0))), Ok(3000));
    assert_eq!(c.send(&zb(b"x")), Err(SendError::WouldBlock));
    poll_all(&mut c, t(2));
    c.on_segment(t(3), &ack_seg(PEER_ISS + 1, ISS + 1 + 1460, 65535), zb(&[]));
    assert!(c.take_events().writable);
    assert_eq!(c.send_capacity(), 1460);
}

/// `send_owned` takes what `send` takes, and gives back the rest: the same segments go
/// out of two connections fed the same buffers either way, whole, cut by the send
/// buffer, refused when it is full, and empty.
#[test]
fn send_owned_queues_what_send_queues_and_returns_the_rest() {
    let cfg = TcpConfig {
        snd_buf: 3000,
        ..plain_cfg()
    };
    let mut a = established_with(cfg.clone(), TcpOptions::default());
    let mut b = established_with(cfg, TcpOptions::default());
    let feed = [
        pattern(1200, 1),
        Vec::new(),
        pattern(2500, 2),
        pattern(7, 3),
    ];
    for data in &feed {
        let z = zb(data);
        let by_ref = a.send(&z);
        match (by_ref, b.send_owned(zb(data))) {
            (Ok(n), Ok((m, rest))) => {
                assert_eq!(n, m);
                let rest = rest.map(|r| r.to_vec()).unwrap_or_default();
                assert_eq!(rest, data[n..].to_vec(), "the part not taken");
            }
            (Err(e), Err((f, back))) => {
                assert_eq!(e, f);
                assert_eq!(back.to_vec(), *data, "refused data comes back whole");
            }
            (x, y) => panic!("send {x:?}, send_owned {:?}", y.map(|(n, _)| n)),
        }
    }
    assert_eq!(a.send_capacity(), 0);
    assert_eq!(
        b.send_owned(zb(b"x")).map(|(n, _)| n).map_err(|(e, _)| e),
        Err(SendError::WouldBlock)
    );
    let (sa, sb) = (poll_all(&mut a, t(2)), poll_all(&mut b, t(2)));
    assert_eq!(sa.len(), sb.len());
    for (x, y) in sa.iter().zip(&sb) {
        assert_eq!(x.repr, y.repr);
        assert_eq!(x.payload.to_vec(), y.payload.to_vec());
    }
    assert_eq!(sa.iter().map(|s| s.payload.len()).sum::<usize>(), 3000);
}

/// RFC 9293 §3.8.6.3 / RFC 1122 §4.2.3.2 (MUST-58, MUST-59): ACKs are aggregated, and all
/// queued segments are processed before one is sent. Three in-order segments and one that
/// fills nothing (out of order) handed in before the driver polls get a single ACK, of
/// everything in order; the out-of-order one is held (SHLD-31), not acknowledged past.
#[test]
fn rfc9293_3_8_6_3_segments_taken_before_a_poll_get_one_ack() {
    let mut c = established();
    let base = PEER_ISS + 1;
    for i in 0..3u32 {
        let s = ack_seg(base + i * 100, ISS + 1, 65535);
        c.on_segment(t(10), &s, zb(&pattern(100, i as u8)));
    }
    let ooo = ack_seg(base + 500, ISS + 1, 65535);
    c.on_segment(t(10), &ooo, zb(&pattern(100, 9)));
    let out = poll_all(&mut c, t(10));
    assert_eq!(out.len(), 1, "one ACK for the four segments: {out:?}");
    assert_eq!(out[0].repr.flags, TcpFlags::ACK);
    assert_eq!(out[0].repr.ack, SeqNum(base + 300));
    assert_eq!(c.recv_available(), 300);
    // The gap is filled: one ACK of everything, including the held segment.
    let fill = ack_seg(base + 300, ISS + 1, 65535);
    c.on_segment(t(11), &fill, zb(&pattern(200, 7)));
    let out = poll_all(&mut c, t(11));
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].repr.ack, SeqNum(base + 600));
}

/// ESTABLISHED with delayed ACKs of `ms` milliseconds (no options).
fn established_delayed_ack(ms: u64) -> Connection {
    let cfg = TcpConfig {
        delayed_ack: Some(Duration::from_millis(ms)),
        ..plain_cfg()
    };
    established_with(cfg, TcpOptions::default())
}

#[test]
fn rfc9293_3_8_6_3_delayed_ack_waits_then_fires() {
    let mut c = established_delayed_ack(5);
    c.on_segment(
        t(10),
        &ack_seg(PEER_ISS + 1, ISS + 1, 65535),
        zb(&[0u8; 100]),
    );
    assert!(poll_all(&mut c, t(10)).is_empty(), "ACK delayed");
    assert_eq!(c.poll_timeout(), Some(t(15)));
    // A reply written before the timer piggybacks the ACK.
    c.send(&zb(b"resp")).unwrap();
    let out = poll_all(&mut c, t(11));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].repr.ack, SeqNum(PEER_ISS + 101));
    assert_eq!(
        c.poll_timeout().map(|d| d > t(15)),
        Some(true),
        "delack cancelled; only RTO left"
    );
    // Two full segments are acknowledged at once (RFC 5681 §4.2).
    c.on_segment(
        t(12),
        &ack_seg(PEER_ISS + 101, ISS + 5, 65535),
        zb(&[0u8; 1460]),
    );
    c.on_segment(
        t(12),
        &ack_seg(PEER_ISS + 1561, ISS + 5, 65535),
        zb(&[0u8; 1460]),
    );
    assert_eq!(poll_all(&mut c, t(12)).len(), 1);
}

#[test]
fn rfc9293_3_8_6_3_every_second_full_sized_segment_as_the_peer_sends_them() {
    // The peer's MSS is 1,460 but its segments carry 12 bytes of timestamps: 1,448-byte
    // segments are its full-sized ones, and every second one is ACKed at once.
    let mut c = established_delayed_ack(40);
    let mut seq = PEER_ISS + 1;
    for pair in 0..3 {
        c.on_segment(t(10), &ack_seg(seq, ISS + 1, 65535), zb(&[1u8; 1448]));
        seq += 1448;
        assert!(
            poll_all(&mut c, t(10)).is_empty(),
            "pair {pair}: the first waits"
        );
        c.on_segment(t(10), &ack_seg(seq, ISS + 1, 65535), zb(&[2u8; 1448]));
        seq += 1448;
        let out = poll_all(&mut c, t(10));
        assert_eq!(out.len(), 1, "pair {pair}: the second is ACKed at once");
        assert_eq!(out[0].repr.ack, SeqNum(seq));
    }
}

// ---------------------------------------------------------------------------------------------
// RFC 5961 and PAWS
// ---------------------------------------------------------------------------------------------

#[test]
fn rfc5961_3_2_rst_must_match_rcv_nxt_exactly() {
    let mut c = established();
    c.on_segment(t(2), &seg(TcpFlags::RST, PEER_ISS + 10, 0, 0), zb(&[]));
    assert_eq!(c.state(), State::Established);
    assert_eq!(c.counters.challenge_acks, 1);
    let out = poll_all(&mut c, t(2));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].repr.flags, TcpFlags::ACK);
    // Out of window: silently dropped.
    c.on_segment(
        t(2),
        &seg(TcpFlags::RST, PEER_ISS + 1_000_000, 0, 0),
        zb(&[]),
    );
    assert!(poll_all(&mut c, t(2)).is_empty());
    // Exact: reset.
    c.on_segment(t(2), &seg(TcpFlags::RST, PEER_ISS + 1, 0, 0), zb(&[]));
    assert_eq!(c.state(), State::Closed);
    assert_eq!(c.close_reason(), Some(CloseReason::Reset));
}

#[test]
fn rfc5961_4_2_syn_in_established_gets_challenge_ack() {
    let mut c = established();
    c.on_segment(t(2), &seg(TcpFlags::SYN, PEER_ISS + 5, 0, 1000), zb(&[]));
    assert_eq!(c.state(), State::Established);
    let out = poll_all(&mut c, t(2));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].repr.flags, TcpFlags::ACK);
    assert_eq!(out[0].repr.ack, SeqNum(PEER_ISS + 1));
}

#[test]
fn rfc5961_7_challenge_acks_are_rate_limited_per_connection() {
    let mut c = established_with(
        TcpConfig {
            challenge_ack_limit: 3,
            ..plain_cfg()
        },
        TcpOptions::default(),
    );
    let mut sent = 0;
    for _ in 0..50 {
        c.on_segment(t(2), &seg(TcpFlags::SYN, PEER_ISS + 5, 0, 1000), zb(&[]));
        sent += poll_all(&mut c, t(2)).len();
    }
    assert_eq!(sent, 3);
    assert_eq!(c.counters.challenge_acks_suppressed, 47);
    // A new one-second window allows more: desynchronized peers cannot ping-pong forever,
    // and legitimate challenges still get through.
    c.on_segment(t(1003), &seg(TcpFlags::SYN, PEER_ISS + 5, 0, 1000), zb(&[]));
    assert_eq!(poll_all(&mut c, t(1003)).len(), 1);
}

#[test]
fn rfc5961_5_2_ack_of_unsent_data_is_dropped_and_acked() {
    let mut c = established();
    c.on_segment(t(2), &ack_seg(PEER_ISS + 1, ISS + 5000, 65535), zb(b"data"));
    assert_eq!(c.counters.drops(DropReason::BadAck), 1);
    assert_eq!(c.recv_available(), 0, "the segment's data is dropped too");
    assert_eq!(poll_all(&mut c, t(2)).len(), 1);
}

#[test]
fn rfc7323_5_3_paws_tolerates_one_tick_of_reordering() {
    let cfg = TcpConfig {
        timestamps: true,
        ..plain_cfg()
    };
    let opts = TcpOptions {
        timestamps: Some(Timestamps {
            tsval: 1000,
            tsecr: 0,
        }),
        ..TcpOptions::default()
    };
    let mut c = established_with(cfg, opts);
    let mut s = ack_seg(PEER_ISS + 1, ISS + 1, 65535);
    s.options.timestamps = Some(Timestamps {
        tsval: 1005,
        tsecr: 0,
    });
    c.on_segment(t(2), &s, zb(b"abc"));
    // Reordered by less than one tick of the peer's clock: accepted, as Linux does.
    let mut late = ack_seg(PEER_ISS + 4, ISS + 1, 65535);
    late.options.timestamps = Some(Timestamps {
        tsval: 1004,
        tsecr: 0,
    });
    c.on_segment(t(3), &late, zb(b"def"));
    assert_eq!(c.counters.drops(DropReason::Paws), 0);
    assert_eq!(c.recv_available(), 6);
    // Two ticks old: PAWS drops it.
    let mut old = ack_seg(PEER_ISS + 7, ISS + 1, 65535);
    old.options.timestamps = Some(Timestamps {
        tsval: 1003,
        tsecr: 0,
    });
    c.on_segment(t(4), &old, zb(b"ghi"));
    assert_eq!(c.counters.drops(DropReason::Paws), 1);
}

#[test]
fn rfc7323_5_3_paws_drops_old_timestamps() {
    let cfg = TcpConfig {
        timestamps: true,
        ..plain_cfg()
    };
    let opts = TcpOptions {
        timestamps: Some(Timestamps {
            tsval: 1000,
            tsecr: 0,
        }),
        ..TcpOptions::default()
    };
    let mut c = established_with(cfg, opts);
    let mut s = ack_seg(PEER_ISS + 1, ISS + 1, 65535);
    s.options.timestamps = Some(Timestamps {
        tsval: 1005,
        tsecr: 0,
    });
    c.on_segment(t(2), &s, zb(b"new"));
    assert_eq!(c.recv_available(), 3);
    let mut old = ack_seg(PEER_ISS + 4, ISS + 1, 65535);
    old.options.timestamps = Some(Timestamps {
        tsval: 990,
        tsecr: 0,
    });
    c.on_segment(t(3), &old, zb(b"old"));
    assert_eq!(c.counters.drops(DropReason::Paws), 1);
    assert_eq!(c.recv_available(), 3);
    let out = poll_all(&mut c, t(3));
    assert_eq!(
        out.last().unwrap().repr.options.timestamps.unwrap().tsecr,
        1005
    );
    // RFC 7323 §3.2: a segment without timestamps after negotiation is dropped.
    c.on_segment(t(3), &ack_seg(PEER_ISS + 4, ISS + 1, 65535), zb(b"nots"));
    assert_eq!(c.recv_available(), 3);
}

// ---------------------------------------------------------------------------------------------
// Closing
// ---------------------------------------------------------------------------------------------

#[test]
fn rfc9293_3_6_active_close_through_time_wait() {
    let mut c = established_with(
        TcpConfig {
            time_wait: Duration::from_secs(2),
            ..plain_cfg()
        },
        TcpOptions::default(),
    );
    c.send(&zb(b"bye")).unwrap();
    c.close();
    assert_eq!(c.state(), State::FinWait1);
    let out = poll_all(&mut c, t(2));
    assert_eq!(out.len(), 1, "FIN piggybacked on the data");
    assert!(out[0].repr.flags.fin());
    assert_eq!(c.send(&zb(b"more")), Err(SendError::Shutdown));
    c.on_segment(
        t(3),
        &ack_seg(PEER_ISS + 1, ISS + 1 + 3 + 1, 65535),
        zb(&[]),
    );
    assert_eq!(c.state(), State::FinWait2);
    c.on_segment(
        t(4),
        &seg(TcpFlags::FIN | TcpFlags::ACK, PEER_ISS + 1, ISS + 5, 65535),
        zb(b"ok"),
    );
    assert_eq!(c.state(), State::TimeWait);
    assert_eq!(c.recv().unwrap().unwrap().as_ref(), b"ok");
    assert_eq!(c.recv(), Err(RecvError::Finished));
    let out = poll_all(&mut c, t(4));
    assert_eq!(out[0].repr.ack, SeqNum(PEER_ISS + 1 + 2 + 1));
    // RFC 1337: RST in TIME-WAIT is ignored.
    c.on_segment(t(5), &seg(TcpFlags::RST, PEER_ISS + 4, 0, 0), zb(&[]));
    assert_eq!(c.state(), State::TimeWait);
    // A retransmitted FIN is re-acknowledged and restarts 2 MSL.
    c.on_segment(
        t(1000),
        &seg(TcpFlags::FIN | TcpFlags::ACK, PEER_ISS + 3, ISS + 5, 65535),
        zb(&[]),
    );
    assert_eq!(poll_all(&mut c, t(1000)).len(), 1);
    assert_eq!(c.poll_timeout(), Some(t(3000)));
    c.on_timeout(t(3000));
    assert_eq!(c.state(), State::Closed);
    assert!(c.is_closed());
}

#[test]
fn rfc9293_3_6_passive_close_through_last_ack() {
    let mut c = established();
    c.on_segment(
        t(2),
        &seg(TcpFlags::FIN | TcpFlags::ACK, PEER_ISS + 1, ISS + 1, 65535),
        zb(&[]),
    );
    assert_eq!(c.state(), State::CloseWait);
    assert_eq!(c.recv(), Err(RecvError::Finished));
    assert_eq!(poll_all(&mut c, t(2)).len(), 1);
    c.send(&zb(b"last words")).unwrap();
    c.close();
    assert_eq!(c.state(), State::LastAck);
    let out = poll_all(&mut c, t(3));
    assert!(out.last().unwrap().repr.flags.fin());
    c.on_segment(
        t(4),
        &ack_seg(PEER_ISS + 2, ISS + 1 + 10 + 1, 65535),
        zb(&[]),
    );
    assert_eq!(c.state(), State::Closed);
    assert_eq!(c.close_reason(), Some(CloseReason::Normal));
}

#[test]
fn rfc9293_3_6_simultaneous_close_through_closing() {
    let mut c = established_with(
        TcpConfig {
            time_wait: Duration::from_millis(100),
            ..plain_cfg()
        },
        TcpOptions::default(),
    );
    c.close();
    let fin = poll_all(&mut c, t(2));
    assert!(fin[0].repr.flags.fin());
    c.on_segment(
        t(3),
        &seg(TcpFlags::FIN | TcpFlags::ACK, PEER_ISS + 1, ISS + 1, 65535),
        zb(&[]),
    );
    assert_eq!(c.state(), State::Closing);
    c.on_segment(t(4), &ack_seg(PEER_ISS + 2, ISS + 2, 65535), zb(&[]));
    assert_eq!(c.state(), State::TimeWait);
}

#[test]
fn rfc9293_3_10_5_abort_sends_rst() {
    let mut c = established();
    c.send(&zb(b"discarded")).unwrap();
    c.abort();
    let out = poll_all(&mut c, t(2));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].repr.flags, TcpFlags::RST);
    assert!(c.is_closed());
    assert_eq!(c.close_reason(), Some(CloseReason::Aborted));
}

#[test]
fn out_of_order_fin_is_applied_when_the_hole_fills() {
    let mut c = established();
    c.on_segment(
        t(2),
        &seg(TcpFlags::FIN | TcpFlags::ACK, PEER_ISS + 6, ISS + 1, 65535),
        zb(b"world"),
    );
    assert_eq!(c.state(), State::Established);
    c.on_segment(t(2), &ack_seg(PEER_ISS + 1, ISS + 1, 65535), zb(b"hello"));
    assert_eq!(c.state(), State::CloseWait);
    let mut all = Vec::new();
    while let Ok(Some(b)) = c.recv() {
        all.extend_from_slice(&b);
    }
    assert_eq!(all, b"helloworld");
    assert_eq!(c.recv(), Err(RecvError::Finished));
}

// ---------------------------------------------------------------------------------------------
// Loss recovery
// ---------------------------------------------------------------------------------------------

/// Regression (found by the smoltcp differential test, seed 47): after an RTO rewound
/// SND.NXT to SND.UNA, pure ACKs carried SEG.SEQ = SND.NXT. The peer had already received
/// everything up to SND.MAX (only its ACKs were lost), so it found our ACKs out of window
/// and dropped them unread: both sides retransmitted old data forever and the connection
/// timed out. Pure ACKs and RSTs now carry SND.MAX (RFC 9293 §3.10.7.4 acceptability).
#[test]
fn pure_ack_after_rto_carries_snd_max_not_rewound_snd_nxt() {
    let mut c = established();
    c.send(&zb(&pattern(3000, 4))).unwrap();
    assert_eq!(poll_all(&mut c, t(2)).len(), 3);
    // The peer got all three segments; its ACKs are lost. The RTO goes back to SND.UNA.
    let rto = c.poll_timeout().unwrap();
    c.on_timeout(rto);
    let out = poll_all(&mut c, rto);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].repr.seq, SeqNum(ISS + 1), "go-back-N retransmission");
    // Data from the peer (acking nothing new) must be acknowledged with a sequence number
    // the peer accepts: its RCV.NXT is ISS + 3001.
    c.on_segment(rto, &ack_seg(PEER_ISS + 1, ISS + 1, 65535), zb(b"hello"));
    let out = poll_all(&mut c, rto);
    let ack = out
        .iter()
        .find(|s| s.payload.is_empty())
        .expect("a pure ACK");
    assert_eq!(ack.repr.ack, SeqNum(PEER_ISS + 6));
    assert_eq!(
        ack.repr.seq,
        SeqNum(ISS + 3001),
        "SND.MAX, not the rewound SND.NXT"
    );
    // Abort's RST likewise carries SND.MAX (RFC 5961 §3.2: the peer wants RCV.NXT exactly).
    c.abort();
    let rst = poll_all(&mut c, rto);
    assert_eq!(rst.len(), 1);
    assert!(rst[0].repr.flags.rst());
    assert_eq!(rst[0].repr.seq, SeqNum(ISS + 3001));
}

#[test]
fn rfc6298_5_rto_retransmits_from_snd_una_and_aborts_after_max_retries() {
    let mut c = established_with(
        TcpConfig {
            max_retries: 3,
            ..plain_cfg()
        },
        TcpOptions::default(),
    );
    c.send(&zb(&pattern(2000, 4))).unwrap();
    assert_eq!(poll_all(&mut c, t(2)).len(), 2);
    let cwnd_before = c.cwnd();
    let rto = c.poll_timeout().unwrap();
    c.on_timeout(rto);
    assert_eq!(c.counters.rtos, 1);
    assert!(c.cwnd() < cwnd_before, "RFC 5681 §3.1: loss window");
    let out = poll_all(&mut c, rto);
    assert_eq!(out.len(), 1, "cwnd = 1 MSS after RTO");
    assert_eq!(out[0].repr.seq, SeqNum(ISS + 1));
    for _ in 0..3 {
        let now = c.poll_timeout().unwrap();
        c.on_timeout(now);
        poll_all(&mut c, now);
    }
    assert_eq!(c.state(), State::Closed);
    assert_eq!(c.close_reason(), Some(CloseReason::Timeout));
}

/// RFC 9293 §3.8.3 (SHLD-11): with the default settings R2 is at least 100 seconds, even
/// from the smallest RTO (the 200 ms floor after a fast RTT sample): 15 timeouts backing
/// off to the 60 s cap.
#[test]
fn rfc9293_3_8_3_default_r2_is_at_least_100_seconds() {
    let mut c = established_with(TcpConfig::default(), TcpOptions::default());
    c.send(&zb(&pattern(1000, 4))).unwrap();
    let sent = t(2);
    poll_all(&mut c, sent);
    // A 1 ms RTT sample: the RTO falls to its floor.
    c.on_segment(t(3), &ack_seg(PEER_ISS + 1, ISS + 501, 65535), zb(&[]));
    poll_all(&mut c, t(3));
    let mut last = t(3);
    for _ in 0..100 {
        let Some(now) = c.poll_timeout() else { break };
        c.on_timeout(now);
        poll_all(&mut c, now);
        last = now;
        if c.state() == State::Closed {
            break;
        }
    }
    assert_eq!(c.close_reason(), Some(CloseReason::Timeout));
    assert!(
        last - sent >= Duration::from_secs(100),
        "gave up after {:?}",
        last - sent
    );
}

/// Regression (ACK war after RTO on both ends, found by r2c's memif RPC test): after an
/// RTO rewinds SND.NXT, a pure ACK must carry SND.MAX, or a peer that already received
/// the data finds it unacceptable (RFC 9293 §3.10.7.4) and answers with its own ACK.
#[test]
fn rfc9293_3_10_7_4_pure_ack_after_rto_carries_snd_max() {
    let mut c = established();
    c.send(&zb(&pattern(2000, 4))).unwrap();
    assert_eq!(poll_all(&mut c, t(2)).len(), 2);
    let rto = c.poll_timeout().unwrap();
    c.on_timeout(rto);
    let out = poll_all(&mut c, rto);
    assert_eq!(out.len(), 1, "go-back-N: the first segment again");
    assert_eq!(out[0].repr.seq, SeqNum(ISS + 1));
    // The peer's data arrives meanwhile (its ACK covers only the first segment): our
    // ACK for it must start at SND.MAX, where the peer expects our next byte.
    c.on_segment(rto, &ack_seg(PEER_ISS + 1, ISS + 1, 65535), zb(b"data"));
    let out = poll_all(&mut c, rto);
    let ack = out
        .iter()
        .find(|s| s.payload.is_empty())
        .expect("an ACK for the peer's data");
    assert_eq!(ack.repr.ack, SeqNum(PEER_ISS + 1 + 4));
    assert_eq!(ack.repr.seq, SeqNum(ISS + 1 + 2000), "SEG.SEQ = SND.MAX");
}

#[test]
fn rfc5681_3_2_three_dupacks_trigger_fast_retransmit_and_recovery_exits() {
    let mut c = established();
    c.send(&zb(&pattern(1460 * 8, 1))).unwrap();
    let out = poll_all(&mut c, t(2));
    assert_eq!(out.len(), 8);
    let una = ISS + 1;
    // Segment 1 lost; 2..4 arrive: three duplicate ACKs.
    for _ in 0..3 {
        c.on_segment(t(3), &ack_seg(PEER_ISS + 1, una, 65535), zb(&[]));
    }
    assert!(c.in_recovery());
    assert_eq!(c.counters.fast_retransmits, 1);
    let out = poll_all(&mut c, t(3));
    assert_eq!(
        out[0].repr.seq,
        SeqNum(una),
        "first unacknowledged segment retransmitted"
    );
    assert_eq!(out[0].payload.len(), 1460);
    // Full ACK of everything: recovery ends without an RTO.
    c.on_segment(t(4), &ack_seg(PEER_ISS + 1, una + 1460 * 8, 65535), zb(&[]));
    assert!(!c.in_recovery());
    assert_eq!(c.counters.rtos, 0);
}

/// RFC 5681 §4.1: data sent after an idle period longer than the RTO starts from the
/// restart window, min(IW, cwnd); after one of exactly the RTO the window is kept (the
/// sender asks the congestion control only past the RTO).
#[test]
fn rfc5681_4_1_the_window_restarts_only_after_an_idle_period_longer_than_the_rto() {
    for (extra_ns, restarts) in [(0u64, false), (1, true)] {
        let mut c = established();
        c.send(&zb(&pattern(1460 * 30, 1))).unwrap();
        let mut now = t(2);
        // Slow start beyond the initial window, then nothing outstanding.
        loop {
            let out = poll_all(&mut c, now);
            if out.is_empty() {
                break;
            }
            now += Duration::from_millis(1);
            c.on_segment(now, &ack_seg(PEER_ISS + 1, c.snd_max.0, 65535), zb(&[]));
        }
        assert_eq!(c.snd_una, c.snd_max, "everything acknowledged");
        let cwnd = c.cwnd();
        assert!(cwnd > 1460 * 10, "cwnd {cwnd} above IW10");
        c.send(&zb(&pattern(1460 * 30, 2))).unwrap();
        let at = Instant::from_nanos(c.last_send.as_nanos() + c.rtt.rto_nanos() + extra_ns);
        assert!(!poll_all(&mut c, at).is_empty());
        let want = if restarts { 1460 * 10 } else { cwnd };
        assert_eq!(c.cwnd(), want, "idle RTO + {extra_ns} ns");
    }
}

#[test]
fn rfc3042_limited_transmit_without_sack_sends_one_new_segment_per_dupack() {
    let mut c = established();
    assert!(!c.sack_ok);
    c.send(&zb(&pattern(1460 * 14, 1))).unwrap();
    assert_eq!(poll_all(&mut c, t(2)).len(), 10, "IW10");
    let una = ISS + 1;
    // The first two duplicate ACKs each let one new segment out (cwnd unchanged).
    let cwnd = c.cwnd();
    for k in 0..2u32 {
        c.on_segment(t(3), &ack_seg(PEER_ISS + 1, una, 65535), zb(&[]));
        let out = poll_all(&mut c, t(3));
        assert_eq!(out.len(), 1, "duplicate ACK {}", k + 1);
        assert_eq!(out[0].repr.seq, SeqNum(una + 1460 * (10 + k)), "new data");
        assert_eq!(c.cwnd(), cwnd);
    }
    // The third starts fast retransmit of the first segment; ssthresh is half of the
    // FlightSize without the two limited-transmit segments (RFC 5681 §3.2 step 2).
    c.on_segment(t(3), &ack_seg(PEER_ISS + 1, una, 65535), zb(&[]));
    assert!(c.in_recovery());
    assert_eq!(c.cc.ssthresh(), 1460 * 10 / 2);
    let out = poll_all(&mut c, t(3));
    assert_eq!(out[0].repr.seq, SeqNum(una));
}

#[test]
fn rfc6582_3_2_partial_ack_retransmits_next_hole() {
    let mut c = established();
    c.send(&zb(&pattern(1460 * 8, 1))).unwrap();
    poll_all(&mut c, t(2));
    let una = ISS + 1;
    for _ in 0..3 {
        c.on_segment(t(3), &ack_seg(PEER_ISS + 1, una, 65535), zb(&[]));
    }
    poll_all(&mut c, t(3));
    // Partial ACK: segment 1 repaired, segment 3 also lost.
    c.on_segment(t(4), &ack_seg(PEER_ISS + 1, una + 1460 * 2, 65535), zb(&[]));
    assert!(c.in_recovery());
    let out = poll_all(&mut c, t(4));
    assert_eq!(out[0].repr.seq, SeqNum(una + 1460 * 2));
    c.on_segment(t(5), &ack_seg(PEER_ISS + 1, una + 1460 * 8, 65535), zb(&[]));
    assert!(!c.in_recovery());
}

// ---------------------------------------------------------------------------------------------
// Two endpoints over an in-memory link
// ---------------------------------------------------------------------------------------------

/// Decides whether to drop the n-th data segment A sends.
type DropFn = Box<dyn FnMut(u64, &OutSegment) -> bool>;

/// Two connections joined by a link that can drop chosen segments. Deterministic.
struct Pair {
    a: Connection,
    b: Connection,
    now: Instant,
    delay: Duration,
    /// In flight: (arrival time, to_b, segment).
    wire: VecDeque<(Instant, bool, OutSegment)>,
    /// Decides whether to drop the n-th data segment sent by A.
    drop_a: DropFn,
    a_data_segs: u64,
}

impl Pair {
    fn new(cfg_a: TcpConfig, cfg_b: TcpConfig, delay: Duration) -> Pair {
        let now = t(0);
        let mut a = Connection::connect(now, tuple_a(), cfg_a, SeqNum(ISS), 11);
        let syn = a.poll_segment(now).unwrap();
        let info = SynInfo {
            seq: syn.repr.seq,
            window: syn.repr.window,
            options: syn.repr.options,
        };
        let b = Connection::accept_syn(now + delay, tuple_b(), cfg_b, SeqNum(PEER_ISS), 22, &info);
        let mut p = Pair {
            a,
            b,
            now: now + delay,
            delay,
            wire: VecDeque::new(),
            drop_a: Box::new(|_, _| false),
            a_data_segs: 0,
        };
        p.run_until(
            |p| p.a.state() == State::Established && p.b.state() == State::Established,
            1000,
        );
        p
    }

    fn to_zbuf(iov: &IoVec) -> Zbuf {
        Zbuf::copy_from_slice(&iov.to_vec())
    }

    fn flush(&mut self) {
        while let Some(s) = self.a.poll_segment(self.now) {
            if std::env::var_os("PAIR_TRACE").is_some() {
                eprintln!(
                    "{:?} A> {:?} seq={} ack={} len={} win={} sack={:?}",
                    self.now,
                    s.repr.flags,
                    s.repr.seq,
                    s.repr.ack,
                    s.payload.len(),
                    s.repr.window,
                    s.repr.options.sack_blocks
                );
            }
            if !s.payload.is_empty() {
                self.a_data_segs += 1;
                if (self.drop_a)(self.a_data_segs, &s) {
                    continue;
                }
            }
            self.wire.push_back((self.now + self.delay, true, s));
        }
        while let Some(s) = self.b.poll_segment(self.now) {
            if std::env::var_os("PAIR_TRACE").is_some() {
                eprintln!(
                    "{:?} B> {:?} seq={} ack={} len={} win={} sack={:?}",
                    self.now,
                    s.repr.flags,
                    s.repr.seq,
                    s.repr.ack,
                    s.payload.len(),
                    s.repr.window,
                    s.repr.options.sack_blocks
                );
            }
            self.wire.push_back((self.now + self.delay, false, s));
        }
    }

    /// Advance to the next event (delivery or timer) and process it.
    fn step(&mut self) -> bool {
        self.flush();
        let next_wire = self.wire.front().map(|w| w.0);
        let next_timer = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let next = match (next_wire, next_timer) {
            (Some(w), Some(tm)) => w.min(tm),
            (Some(w), None) => w,
            (None, Some(tm)) => tm,
            (None, None) => return false,
        };
        self.now = self.now.max(next);
        while self.wire.front().is_some_and(|w| w.0 <= self.now) {
            let (_, to_b, s) = self.wire.pop_front().unwrap();
            let payload = Self::to_zbuf(&s.payload);
            if to_b {
                self.b.on_segment(self.now, &s.repr, payload);
            } else {
                self.a.on_segment(self.now, &s.repr, payload);
            }
        }
        if self.a.poll_timeout().is_some_and(|x| x <= self.now) {
            self.a.on_timeout(self.now);
        }
        if self.b.poll_timeout().is_some_and(|x| x <= self.now) {
            self.b.on_timeout(self.now);
        }
        self.flush();
        true
    }

    fn run_until(&mut self, mut done: impl FnMut(&mut Pair) -> bool, max_steps: usize) {
        for _ in 0..max_steps {
            if done(self) {
                return;
            }
            if !self.step() {
                break;
            }
        }
        assert!(
            done(self),
            "condition not reached; a={:?} b={:?}",
            self.a,
            self.b
        );
    }

    /// Move `data` from A to B, reading at B as it arrives; returns what B read.
    fn transfer(&mut self, data: &[u8], max_steps: usize) -> Vec<u8> {
        let mut offset = 0;
        let mut got = Vec::new();
        let src = zb(data);
        for _ in 0..max_steps {
            if offset < data.len() {
                if let Ok(n) = self.a.send(&src.slice(offset..data.len())) {
                    offset += n;
                }
            }
            while let Ok(Some(b)) = self.b.recv() {
                got.extend_from_slice(&b);
            }
            if got.len() == data.len() && self.a.bytes_in_flight() == 0 {
                return got;
            }
            if !self.step() {
                break;
            }
        }
        got
    }
}

fn sack_cfg() -> TcpConfig {
    TcpConfig::default()
}

#[test]
fn pair_bulk_transfer_is_byte_exact() {
    let mut p = Pair::new(sack_cfg(), sack_cfg(), Duration::from_micros(50));
    let data = pattern(2 << 20, 7);
    let got = p.transfer(&data, 200_000);
    assert_eq!(got.len(), data.len());
    assert!(got == data);
    assert_eq!(p.a.counters.retransmits, 0);
}

#[test]
fn rfc6675_single_loss_is_repaired_by_sack_recovery_without_rto() {
    let mut p = Pair::new(sack_cfg(), sack_cfg(), Duration::from_micros(100));
    p.drop_a = Box::new(|n, _| n == 20);
    let data = pattern(400_000, 3);
    let got = p.transfer(&data, 200_000);
    assert!(got == data);
    assert_eq!(p.a.counters.rtos, 0, "no RTO");
    assert_eq!(p.a.counters.fast_retransmits, 1);
    assert_eq!(p.a.counters.sack_recoveries, 1);
    assert_eq!(p.a.counters.retransmits, 1, "exactly the lost segment");
}

#[test]
fn rfc6582_newreno_recovers_multiple_losses_without_sack() {
    let cfg = TcpConfig {
        sack: false,
        ..TcpConfig::default()
    };
    let mut p = Pair::new(cfg.clone(), cfg, Duration::from_micros(100));
    p.drop_a = Box::new(|n, _| n == 30 || n == 33);
    let data = pattern(400_000, 5);
    let got = p.transfer(&data, 200_000);
    assert!(got == data);
    assert_eq!(p.a.counters.rtos, 0);
    assert!(p.a.counters.retransmits >= 2);
}

#[test]
fn pair_random_loss_both_algorithms_complete() {
    for alg in [CcAlgorithm::NewReno, CcAlgorithm::Cubic] {
        for seed in 0..5u64 {
            let cfg = TcpConfig {
                cc: alg,
                ..TcpConfig::default()
            };
            let mut p = Pair::new(cfg.clone(), cfg, Duration::from_micros(200));
            let mut rng = crate::context::testutil::FakeRng::new(seed);
            p.drop_a = Box::new(move |_, _| {
                use crate::context::Rng;
                rng.next_u32() % 50 == 0
            });
            let data = pattern(300_000, seed as u8);
            let got = p.transfer(&data, 500_000);
            assert!(
                got == data,
                "{alg:?} seed {seed}: got {} of {}",
                got.len(),
                data.len()
            );
        }
    }
}

#[test]
fn pair_close_both_ways_reaches_closed() {
    let cfg = TcpConfig {
        time_wait: Duration::from_millis(10),
        ..TcpConfig::default()
    };
    let mut p = Pair::new(cfg.clone(), cfg, Duration::from_micros(100));
    p.a.close();
    p.run_until(|p| p.b.state() == State::CloseWait, 100);
    assert_eq!(p.b.recv(), Err(RecvError::Finished));
    p.b.close();
    p.run_until(|p| p.a.is_closed() && p.b.is_closed(), 1000);
    assert_eq!(p.a.close_reason(), Some(CloseReason::Normal));
    assert_eq!(p.b.close_reason(), Some(CloseReason::Normal));
}

/// An established connection with keepalive on.
fn with_keepalive(idle: Duration, interval: Duration, probes: u32) -> Connection {
    let ka = crate::tcp::config::KeepaliveConfig {
        idle,
        interval,
        probes,
    };
    established_with(
        TcpConfig {
            keepalive: Some(ka),
            ..plain_cfg()
        },
        TcpOptions::default(),
    )
}

#[test]
fn rfc9293_3_8_4_keepalive_detects_dead_peer() {
    let mut c = with_keepalive(Duration::from_secs(1), Duration::from_millis(100), 3);
    let mut probes = 0;
    for _ in 0..10 {
        let Some(at) = c.poll_timeout() else { break };
        c.on_timeout(at);
        for s in poll_all(&mut c, at) {
            if s.repr.flags == TcpFlags::ACK {
                assert_eq!(s.repr.seq, SeqNum(ISS), "SEG.SEQ = SND.NXT - 1");
                probes += 1;
            }
        }
        if c.state() == State::Closed {
            break;
        }
    }
    assert_eq!(probes, 3);
    assert_eq!(c.close_reason(), Some(CloseReason::Timeout));
}

/// RFC 1122 §4.2.3.6: keepalive probes go only to an idle connection. Found by the
/// randomized fast-path runs (50% loss): data outstanding behind a long RTO (3 s after a
/// retransmitted SYN, RFC 6298 §5.7) got keepalive probes at SND.NXT - 1, which the
/// receiver, still missing the data, accepted without answering; the probes ran out and
/// a live connection was reset before its RTO fired.
#[test]
fn rfc1122_4_2_3_6_no_keepalive_probes_while_data_is_outstanding() {
    let mut c = with_keepalive(Duration::from_millis(20), Duration::from_millis(10), 3);
    c.send(&Zbuf::copy_from_slice(&[7u8; 100])).unwrap();
    let sent = poll_all(&mut c, t(0));
    assert!(
        sent.iter().any(|s| s.payload.len() == 100),
        "the data goes out"
    );
    // Nothing comes back. Until the RTO the only thing sent is... nothing: no probe.
    let rto = c.poll_timeout().expect("a timer runs");
    let mut now = t(0);
    let mut retransmitted = false;
    for _ in 0..50 {
        let Some(at) = c.poll_timeout() else { break };
        now = at;
        c.on_timeout(now);
        for s in poll_all(&mut c, now) {
            assert!(
                !s.payload.is_empty(),
                "only retransmissions while data is outstanding, got {:?} at {now:?}",
                s.repr
            );
            retransmitted = true;
        }
        if retransmitted {
            break;
        }
    }
    assert!(retransmitted && now >= rto, "the RTO, not keepalive, acts");
    assert_eq!(c.state(), State::Established);
    assert_eq!(c.counters.keepalive_probes, 0);
}

/// Regression: options_len ignored the NOP padding the emitter writes, so TS + SACK was
/// counted as 20 bytes instead of 24 and loss-recovery segments overran the MTU by 4 bytes
/// (RFC 9293 §3.7.1: the segment must fit the MSS after options are subtracted).
#[test]
fn rfc9293_3_7_1_options_len_matches_emitted_header_with_ts_and_sack() {
    use crate::wire::{SackBlocks, Timestamps};
    let mut sack = SackBlocks::new();
    sack.push(SeqNum(10), SeqNum(20));
    let opts = TcpOptions {
        timestamps: Some(Timestamps { tsval: 1, tsecr: 2 }),
        sack_blocks: sack,
        ..TcpOptions::default()
    };
    let mut buf = [0u8; 40];
    assert_eq!(options_len(&opts) as usize, opts.emit(&mut buf));
    assert_eq!(options_len(&opts), 24);
}

// ---------------------------------------------------------------------------------------------
// Regressions from the RFC review of the TCP core
// ---------------------------------------------------------------------------------------------

fn ts_opts(tsval: u32) -> TcpOptions {
    TcpOptions {
        timestamps: Some(Timestamps { tsval, tsecr: 0 }),
        ..TcpOptions::default()
    }
}

/// Regression (TS.Recent poisoning): a blind segment with an in-window SEQ but an ACK beyond
/// SND.MAX is discarded (RFC 5961 §5.2) and must not update TS.Recent (RFC 7323 §4.3), or
/// PAWS would then drop every segment of the real peer.
#[test]
fn rfc5961_5_2_segment_with_unacceptable_ack_does_not_update_ts_recent() {
    let cfg = TcpConfig {
        timestamps: true,
        ..plain_cfg()
    };
    let mut c = established_with(cfg, ts_opts(100));
    let mut bad = ack_seg(PEER_ISS + 1, ISS + 1 + 1_000_000, 65535);
    bad.options = ts_opts(100 + (1 << 30));
    c.on_segment(t(2), &bad, zb(&[]));
    assert_eq!(c.counters.drops(DropReason::BadAck), 1);
    poll_all(&mut c, t(2));
    let mut good = ack_seg(PEER_ISS + 1, ISS + 1, 65535);
    good.options = ts_opts(101);
    c.on_segment(t(3), &good, zb(b"legit data"));
    assert_eq!(c.recv_available(), 10, "the real peer's data is accepted");
    assert_eq!(c.counters.drops(DropReason::Paws), 0);
    let out = poll_all(&mut c, t(3));
    assert_eq!(
        out.last().unwrap().repr.options.timestamps.unwrap().tsecr,
        101,
        "TS.Recent follows the real peer"
    );
}

/// Regression (reneging): the receiver SACKed segments 2-5, then acknowledged only segment 1
/// (it discarded the SACKed data, which RFC 2018 §8 allows). The SACKed range now starting at
/// SND.UNA used to be skipped by every RTO retransmission until the connection timed out;
/// RFC 2018 §8 requires the left edge to be resent.
#[test]
fn rfc2018_8_reneged_left_edge_is_retransmitted() {
    // Every timeout below is the RTO's: no tail loss probe first.
    let cfg = TcpConfig {
        sack: true,
        max_retries: 4,
        tlp: None,
        ..plain_cfg()
    };
    let peer = TcpOptions {
        sack_permitted: true,
        ..TcpOptions::default()
    };
    let mut c = established_with(cfg, peer);
    c.send(&zb(&vec![3u8; 1460 * 8])).unwrap();
    assert_eq!(poll_all(&mut c, t(2)).len(), 8);
    let una = ISS + 1;
    let mut a = ack_seg(PEER_ISS + 1, una, 65535);
    a.options
        .sack_blocks
        .push(SeqNum(una + 1460), SeqNum(una + 1460 * 5));
    c.on_segment(t(3), &a, zb(&[]));
    poll_all(&mut c, t(3));
    // Segment 1 arrives; the receiver reneged on 2..5 and acknowledges segment 1 only.
    c.on_segment(t(4), &ack_seg(PEER_ISS + 1, una + 1460, 65535), zb(&[]));
    assert_eq!(c.counters.sack_renegings, 1);
    let left_edge = |out: &[OutSegment]| {
        out.iter()
            .any(|s| s.repr.seq == SeqNum(una + 1460) && !s.payload.is_empty())
    };
    assert!(left_edge(&poll_all(&mut c, t(4))), "resent on detection");
    // And every RTO resends it too, never skipping it as SACKed.
    for _ in 0..2 {
        let now = c.poll_timeout().unwrap();
        c.on_timeout(now);
        let out = poll_all(&mut c, now);
        assert_eq!(out[0].repr.seq, SeqNum(una + 1460), "RTO starts at SND.UNA");
        assert!(left_edge(&out));
    }
    c.on_segment(
        t(9_000),
        &ack_seg(PEER_ISS + 1, una + 1460 * 8, 65535),
        zb(&[]),
    );
    assert_eq!(c.bytes_in_flight(), 0);
    assert_eq!(c.close_reason(), None);
}

/// Regression (rescue retransmission): the rescue retransmission moved HighRxt, so `pipe`
/// counted the tail twice and NextSeg searched above the rescued octets; the remaining hole
/// waited for the RTO. RFC 6675 §4 rule 4: HighRxt MUST NOT be updated by it.
#[test]
fn rfc6675_4_rescue_retransmission_leaves_high_rxt_and_recovery_continues() {
    let cfg = TcpConfig {
        sack: true,
        ..plain_cfg()
    };
    let peer = TcpOptions {
        sack_permitted: true,
        ..TcpOptions::default()
    };
    let mut c = established_with(cfg, peer);
    let m = 1460u32;
    c.send(&zb(&vec![5u8; (m * 10) as usize])).unwrap();
    assert_eq!(poll_all(&mut c, t(2)).len(), 10);
    let una = ISS + 1;
    // Segments 1, 2 acknowledged; 3 lost; 4..7 SACKed; 8, 9, 10 lost.
    c.on_segment(t(3), &ack_seg(PEER_ISS + 1, una + 2 * m, 65535), zb(&[]));
    poll_all(&mut c, t(3));
    let mut a = ack_seg(PEER_ISS + 1, una + 2 * m, 65535);
    a.options
        .sack_blocks
        .push(SeqNum(una + 3 * m), SeqNum(una + 7 * m));
    c.on_segment(t(3), &a, zb(&[]));
    assert!(c.in_recovery());
    let out = poll_all(&mut c, t(3));
    assert_eq!(out[0].repr.seq, SeqNum(una + 2 * m));
    // The retransmitted segment 3 arrives: partial ACK up to segment 8.
    c.on_segment(t(4), &ack_seg(PEER_ISS + 1, una + 7 * m, 65535), zb(&[]));
    let out = poll_all(&mut c, t(4));
    let seqs: Vec<u32> = out
        .iter()
        .filter(|s| !s.payload.is_empty())
        .map(|s| s.repr.seq.0 - una)
        .collect();
    assert_eq!(
        seqs,
        vec![9 * m],
        "rescue retransmission of the last segment"
    );
    assert_eq!(c.sb.rescue_rxt(), Some(SeqNum(una + 10 * m)));
    assert_eq!(
        c.sb.high_rxt(),
        SeqNum(una + 7 * m),
        "HighRxt is not moved by the rescue"
    );
    // The rescued segment is SACKed: segments 8 and 9 are holes below the highest SACK and
    // NextSeg resends them without waiting for the RTO.
    let mut a = ack_seg(PEER_ISS + 1, una + 7 * m, 65535);
    a.options
        .sack_blocks
        .push(SeqNum(una + 9 * m), SeqNum(una + 10 * m));
    c.on_segment(t(5), &a, zb(&[]));
    let out = poll_all(&mut c, t(5));
    let data: Vec<u32> = out
        .iter()
        .filter(|s| !s.payload.is_empty())
        .map(|s| s.repr.seq.0 - una)
        .collect();
    assert_eq!(data.first(), Some(&(7 * m)), "segment 8 resent: {data:?}");
    assert_eq!(c.counters.rtos, 0);
}

/// SACK connection against a scripted peer with a congestion window of `iw` segments.
fn sack_sender_with_iw(iw: u32) -> Connection {
    let cfg = TcpConfig {
        sack: true,
        cc_config: crate::tcp::cc::CcConfig {
            initial_window: crate::tcp::cc::InitialWindow::Segments(iw),
            ..Default::default()
        },
        ..plain_cfg()
    };
    let peer = TcpOptions {
        sack_permitted: true,
        ..TcpOptions::default()
    };
    established_with(cfg, peer)
}

/// An ACK from the scripted peer acknowledging `ack` and SACKing `[left, right)`.
fn sack_ack(ack: u32, left: u32, right: u32) -> TcpRepr {
    let mut a = ack_seg(PEER_ISS + 1, ack, 65535);
    a.options.sack_blocks.push(SeqNum(left), SeqNum(right));
    a
}

fn data_seqs(out: &[OutSegment], base: u32) -> Vec<u32> {
    out.iter()
        .filter(|s| !s.payload.is_empty())
        .map(|s| s.repr.seq.0 - base)
        .collect()
}

/// Regression (impaired bulk: most RTOs): with a window of three segments and the first one
/// lost, the two SACKs that follow are fewer than DupThresh and the SACKed data was still
/// counted as in flight, so nothing more could be sent and only the RTO repaired the loss.
/// RFC 6675 §5 (2): before DupThresh, send new data while cwnd - pipe >= 1 SMSS (limited
/// transmit, RFC 3042); the SACKs of that data make IsLost(HighACK + 1) true.
#[test]
fn rfc6675_5_2_limited_transmit_by_pipe_repairs_a_loss_in_a_small_window_without_rto() {
    let mut c = sack_sender_with_iw(3);
    let m = 1460u32;
    let una = ISS + 1;
    c.send(&zb(&vec![7u8; (m * 10) as usize])).unwrap();
    assert_eq!(data_seqs(&poll_all(&mut c, t(2)), una), vec![0, m, 2 * m]);
    // Segment 1 lost; segment 2 SACKed: one SACKed segment leaves pipe = 2 segments.
    c.on_segment(t(3), &sack_ack(una, una + m, una + 2 * m), zb(&[]));
    assert!(!c.in_recovery());
    assert_eq!(
        data_seqs(&poll_all(&mut c, t(3)), una),
        vec![3 * m],
        "limited transmit of one new segment"
    );
    c.on_segment(t(3), &sack_ack(una, una + m, una + 3 * m), zb(&[]));
    assert!(!c.in_recovery());
    assert_eq!(data_seqs(&poll_all(&mut c, t(3)), una), vec![4 * m]);
    // The limited-transmit segment's SACK: three SACKed segments above SND.UNA (IsLost).
    c.on_segment(t(4), &sack_ack(una, una + m, una + 4 * m), zb(&[]));
    assert!(c.in_recovery(), "RFC 6675 §5 (4): loss recovery");
    let out = data_seqs(&poll_all(&mut c, t(4)), una);
    assert_eq!(
        out.first(),
        Some(&0),
        "fast retransmit of segment 1: {out:?}"
    );
    c.on_segment(t(5), &ack_seg(PEER_ISS + 1, una + 5 * m, 65535), zb(&[]));
    assert!(!c.in_recovery());
    assert_eq!(c.counters.rtos, 0);
    assert_eq!(c.counters.retransmits, 1);
}

/// Regression (impaired bulk: the RTOs left after limited transmit): a fast retransmission
/// that is itself lost could only be repaired by the RTO, because RFC 6675's NextSeg never
/// looks below HighRxt. RFC 8985 §6.2: once data sent after the retransmission is SACKed
/// (DupThresh segments of it, as IsLost asks), the retransmission is lost and is sent again
/// within the same recovery.
#[test]
fn rfc8985_6_2_lost_retransmission_is_repaired_within_recovery_without_rto() {
    let mut c = sack_sender_with_iw(10);
    let m = 1460u32;
    let una = ISS + 1;
    c.send(&zb(&vec![9u8; (m * 30) as usize])).unwrap();
    assert_eq!(poll_all(&mut c, t(2)).len(), 10);
    // Segment 1 lost, 2-4 SACKed: fast retransmit.
    c.on_segment(t(3), &sack_ack(una, una + m, una + 4 * m), zb(&[]));
    assert!(c.in_recovery());
    assert_eq!(data_seqs(&poll_all(&mut c, t(3)), una), vec![0]);
    // The rest of the first flight arrives; pipe has room for new data (segments 11..).
    c.on_segment(t(4), &sack_ack(una, una + m, una + 10 * m), zb(&[]));
    let new = data_seqs(&poll_all(&mut c, t(4)), una);
    assert!(
        new.len() >= 3 && new.iter().all(|&s| s >= 10 * m),
        "{new:?}"
    );
    // The retransmission of segment 1 is lost; three segments sent after it are SACKed.
    c.on_segment(t(5), &sack_ack(una, una + m, una + 13 * m), zb(&[]));
    assert!(c.sb.is_retransmission_lost(SeqNum(una)));
    let out = data_seqs(&poll_all(&mut c, t(5)), una);
    assert_eq!(out.first(), Some(&0), "segment 1 sent again: {out:?}");
    assert_eq!(c.sb.stats().lost_retransmissions, 1);
    assert!(
        !c.sb.is_retransmission_lost(SeqNum(una)),
        "until new evidence"
    );
    c.on_segment(t(6), &ack_seg(PEER_ISS + 1, una + 13 * m, 65535), zb(&[]));
    assert!(
        !c.in_recovery(),
        "full acknowledgment of the recovery point"
    );
    assert_eq!(c.counters.rtos, 0);
}

/// Regression (review): with DupThresh raised by an earlier spurious recovery, its flight
/// bound (segments in flight minus one) only lets a *single* loss be detected. Two losses in
/// a flight of six left four SACKed segments against DupThresh 5: no fast retransmit, ever;
/// only the RTO (which the default DupThresh 3 would have avoided). RFC 4653 (adapted
/// DupThresh): once SND.MAX itself is SACKed no later data can bring more evidence, so the
/// configured DupThresh applies and the losses are repaired by SACK recovery.
#[test]
fn rfc4653_raised_dupthresh_still_repairs_two_losses_in_a_small_window_without_rto() {
    let mut c = sack_sender_with_iw(10);
    let m = 1460u32;
    let una = ISS + 1;
    c.send(&zb(&vec![3u8; (m * 6) as usize])).unwrap();
    assert_eq!(data_seqs(&poll_all(&mut c, t(2)), una).len(), 6);
    // As after a spurious recovery that revealed ten segments of reordering.
    assert_eq!(c.sb.note_reordering(10 * m), 11);
    // Segments 1 and 3 (offsets 0 and 2m) lost; 2, 4, 5 and 6 arrive and are SACKed.
    let sacks: [&[(u32, u32)]; 4] = [
        &[(1, 2)],
        &[(3, 4), (1, 2)],
        &[(3, 5), (1, 2)],
        &[(3, 6), (1, 2)],
    ];
    for blocks in sacks {
        let mut a = ack_seg(PEER_ISS + 1, una, 65535);
        for &(l, r) in blocks {
            a.options
                .sack_blocks
                .push(SeqNum(una + l * m), SeqNum(una + r * m));
        }
        c.on_segment(t(3), &a, zb(&[]));
    }
    assert!(
        c.in_recovery(),
        "RFC 6675 §5: four SACKed segments and nothing left to be SACKed (DupThresh {})",
        c.sb.dup_thresh()
    );
    let out = data_seqs(&poll_all(&mut c, t(3)), una);
    // (RFC 6675 §4 rule 4 may add its rescue copy of the highest hole after them.)
    assert_eq!(out[..2], [0, 2 * m], "both holes resent: {out:?}");
    c.on_segment(t(5), &ack_seg(PEER_ISS + 1, una + 6 * m, 65535), zb(&[]));
    assert!(!c.in_recovery());
    assert_eq!(c.counters.rtos, 0);
    assert_eq!(c.sb.reordering(), 11, "the estimate itself is kept");
}

/// Sends 30 segments' worth with a window of 10 and answers with SACKs of segments 2-6
/// (segment 1 missing): fast retransmit of segment 1. Returns the connection, cwnd and
/// ssthresh before the reduction, and the segment size.
fn spurious_candidate(cfg_ts: bool) -> (Connection, u32, u32, u32) {
    let mut c = if cfg_ts {
        let cfg = TcpConfig {
            sack: true,
            timestamps: true,
            cc_config: crate::tcp::cc::CcConfig {
                initial_window: crate::tcp::cc::InitialWindow::Segments(10),
                ..Default::default()
            },
            ..plain_cfg()
        };
        let peer = TcpOptions {
            sack_permitted: true,
            timestamps: Some(Timestamps {
                tsval: 100,
                tsecr: 0,
            }),
            ..TcpOptions::default()
        };
        established_with(cfg, peer)
    } else {
        sack_sender_with_iw(10)
    };
    let una = ISS + 1;
    c.send(&zb(&vec![5u8; 1460 * 30])).unwrap();
    let out = poll_all(&mut c, t(2));
    assert_eq!(out.len(), 10);
    let m = out[0].payload.len() as u32;
    let (cwnd, ssthresh) = (c.cwnd(), c.ssthresh());
    c.on_segment(
        t(3),
        &ts_ack(cfg_ts, sack_ack(una, una + m, una + 6 * m), 2),
        zb(&[]),
    );
    assert!(c.in_recovery());
    let out = poll_all(&mut c, t(3));
    assert_eq!(data_seqs(&out, una).first(), Some(&0), "fast retransmit");
    assert!(c.cwnd() < cwnd, "window reduced");
    assert_eq!(c.counters.retransmits, 1);
    (c, cwnd, ssthresh, m)
}

/// With `ts`, adds a timestamp option echoing `tsecr` (the scripted peer's TSval stays 100:
/// PAWS accepts equal values).
fn ts_ack(ts: bool, mut a: TcpRepr, tsecr: u32) -> TcpRepr {
    if ts {
        a.options.timestamps = Some(Timestamps { tsval: 100, tsecr });
    }
    a
}

/// RFC 3708 §3: segment 1 was only reordered. Its original arrives after the fast
/// retransmission (the ACK covers segments 1-10), then the retransmission is reported by a
/// D-SACK: every retransmission of the episode was D-SACKed, so the reduction is undone
/// (RFC 9438 §4.9) and DupThresh rises to the reordering seen (RFC 4653 idea):
/// nine segments overtook segment 1, so five SACKed segments no longer start a recovery.
#[test]
fn rfc3708_3_spurious_fast_retransmit_is_undone_by_dsack_and_dupthresh_adapts() {
    for ts in [false, true] {
        let (mut c, cwnd, ssthresh, m) = spurious_candidate(ts);
        let una = ISS + 1;
        // The original of segment 1 arrives (TSecr 2: the original's TSval, RFC 3522).
        c.on_segment(
            t(4),
            &ts_ack(ts, ack_seg(PEER_ISS + 1, una + 10 * m, 65535), 2),
            zb(&[]),
        );
        assert!(!c.in_recovery());
        assert_eq!(c.counters.spurious_recoveries, 0, "not before the D-SACK");
        poll_all(&mut c, t(4));
        // RFC 2883 §4: the retransmission arrives as a duplicate.
        let dsack = ts_ack(ts, sack_ack(una + 10 * m, una, una + m), 3);
        c.on_segment(t(5), &dsack, zb(&[]));
        assert_eq!(c.counters.dsacks, 1);
        assert_eq!(c.counters.spurious_recoveries, 1, "ts {ts}");
        assert!(c.cwnd() >= cwnd, "cwnd restored: {} < {cwnd}", c.cwnd());
        assert!(c.ssthresh() >= ssthresh);
        assert_eq!(
            c.sb.reordering(),
            11,
            "segment 1 and the nine that overtook it, plus one"
        );
        // The same D-SACK again does not undo twice.
        c.on_segment(t(5), &dsack, zb(&[]));
        assert_eq!(c.counters.spurious_recoveries, 1);
        // The next hole with three (even five) SACKed segments above it is not a loss yet.
        let out = poll_all(&mut c, t(5));
        assert!(data_seqs(&out, una).len() >= 5, "the restored window sends");
        assert!(c.sb.dup_thresh() > 5, "{}", c.sb.dup_thresh());
        let hole = una + 10 * m;
        c.on_segment(
            t(6),
            &ts_ack(ts, sack_ack(hole, hole + m, hole + 6 * m), 5),
            zb(&[]),
        );
        assert!(!c.in_recovery(), "reordering within the learned extent");
        assert_eq!(c.counters.sack_recoveries, 1);
        assert_eq!(c.counters.rtos, 0);
    }
}

/// RFC 3708 §3 (the other way): segment 1 was really lost; its retransmission fills the hole
/// and is never D-SACKed, so the reduction stands. A D-SACK for other data (a duplicated
/// original) does not count for the episode.
#[test]
fn rfc3708_3_real_loss_is_not_undone() {
    for ts in [false, true] {
        let (mut c, cwnd, _, m) = spurious_candidate(ts);
        let una = ISS + 1;
        // The retransmission (TSval 3) fills the hole.
        c.on_segment(
            t(5),
            &ts_ack(ts, ack_seg(PEER_ISS + 1, una + 10 * m, 65535), 3),
            zb(&[]),
        );
        assert!(!c.in_recovery());
        poll_all(&mut c, t(5));
        let reduced = c.cwnd();
        assert!(reduced < cwnd);
        // A network duplicate of segment 5 (never retransmitted) is D-SACKed.
        let dup = ts_ack(ts, sack_ack(una + 10 * m, una + 4 * m, una + 5 * m), 3);
        c.on_segment(t(6), &dup, zb(&[]));
        assert_eq!(c.counters.dsacks, 1);
        assert_eq!(c.counters.spurious_recoveries, 0, "ts {ts}");
        assert!(c.cwnd() < cwnd);
        assert_eq!(c.sb.reordering(), 3);
    }
}

/// RFC 3522 (Eifel detection) guarding RFC 3708: with timestamps, the ACK that filled the hole
/// echoed the retransmission's TSval, so the original was lost; a D-SACK of the
/// retransmission then only means the network duplicated it, and nothing is undone.
#[test]
fn rfc3522_duplicated_retransmission_of_a_lost_segment_is_not_undone() {
    let ts = true;
    let (mut c, cwnd, _, m) = spurious_candidate(ts);
    let una = ISS + 1;
    c.on_segment(
        t(5),
        &ts_ack(ts, ack_seg(PEER_ISS + 1, una + 10 * m, 65535), 3),
        zb(&[]),
    );
    poll_all(&mut c, t(5));
    // The retransmission's duplicate arrives: D-SACK of exactly what was retransmitted.
    c.on_segment(
        t(6),
        &ts_ack(ts, sack_ack(una + 10 * m, una, una + m), 3),
        zb(&[]),
    );
    assert_eq!(c.counters.dsacks, 1);
    assert_eq!(c.counters.spurious_recoveries, 0);
    assert!(c.cwnd() < cwnd);
    assert_eq!(c.sb.reordering(), 3);
}

/// RFC 6675 §4 rule 4 with nothing new to send: the one hole under everything SACKed is
/// resent once. The rescue retransmission is for a tail no retransmission reached; sending
/// the hole again at once duplicated it, and the undo episode, seeing data resent twice,
/// could never prove a reordering spurious (RFC 3708).
#[test]
fn rfc6675_4_a_single_hole_is_resent_once_and_its_reordering_undone() {
    let mut c = tlp_flight(plain_sack_cfg(), 5);
    let una = ISS + 1;
    let cwnd = c.cwnd();
    c.on_segment(t(3), &sack_ack(una, una + 1460, una + 7300), zb(&[]));
    assert!(c.in_recovery());
    assert_eq!(data_seqs(&poll_all(&mut c, t(3)), una), vec![0], "once");
    assert_eq!(c.counters.retransmits, 1);
    // Only reordered: the original arrives, then the retransmission as a duplicate.
    c.on_segment(t(4), &ack_seg(PEER_ISS + 1, una + 7300, 65535), zb(&[]));
    c.on_segment(t(4), &sack_ack(una + 7300, una, una + 1460), zb(&[]));
    assert_eq!(c.counters.spurious_recoveries, 1);
    assert!(c.cwnd() >= cwnd, "restored: {} < {cwnd}", c.cwnd());
}

/// A retransmission timeout ends the episode: a D-SACK arriving after it undoes nothing.
#[test]
fn rfc3708_rto_ends_the_undo_episode() {
    let (mut c, _, _, m) = spurious_candidate(false);
    // The timeout below is the RTO's: no tail loss probe first (nor the one armed).
    Arc::make_mut(&mut c.cfg).tlp = None;
    c.timers.clear(Timer::Pto);
    let una = ISS + 1;
    let rto = c.poll_timeout().unwrap();
    c.on_timeout(rto);
    assert_eq!(c.counters.rtos, 1);
    poll_all(&mut c, rto);
    c.on_segment(rto, &sack_ack(una + 10 * m, una, una + m), zb(&[]));
    assert_eq!(c.counters.dsacks, 1);
    assert_eq!(c.counters.spurious_recoveries, 0);
    assert!(c.cwnd() <= 3 * 1460, "not restored: {}", c.cwnd());
}

/// Regression (ACK ping-pong): two endpoints whose receive sides are desynchronized answered
/// each other's out-of-window pure ACKs forever. RFC 9293 §3.10.7.4 asks for an ACK to an
/// unacceptable segment; for segments without data those ACKs are now rate limited.
#[test]
fn rfc9293_3_10_7_4_acks_to_unacceptable_pure_acks_are_rate_limited() {
    let cfg = plain_cfg();
    let mut a = Connection::connect(t(0), tuple_a(), cfg.clone(), SeqNum(ISS), 1);
    let syn = a.poll_segment(t(0)).unwrap();
    let info = SynInfo {
        seq: syn.repr.seq,
        window: syn.repr.window,
        options: syn.repr.options,
    };
    let mut b = Connection::accept_syn(t(0), tuple_b(), cfg, SeqNum(PEER_ISS), 2, &info);
    let synack = b.poll_segment(t(0)).unwrap();
    a.on_segment(t(1), &synack.repr, zb(&[]));
    let ack = a.poll_segment(t(1)).unwrap();
    b.on_segment(t(1), &ack.repr, zb(&[]));
    assert_eq!(
        (a.state(), b.state()),
        (State::Established, State::Established)
    );
    // Desynchronize both receive sides (state loss in a middlebox, a buggy peer...).
    for c in [&mut a, &mut b] {
        c.rcv_nxt += 1u32 << 20;
        c.rcv_adv = c.rcv_nxt + 65535u32;
    }
    a.ack_now = true;
    let mut msgs = 0u32;
    let mut now_ms = 2u64;
    let mut from_a = poll_all(&mut a, t(now_ms));
    while !from_a.is_empty() && msgs < 10_000 {
        now_ms += 1;
        let mut from_b = Vec::new();
        for s in from_a.drain(..) {
            msgs += 1;
            b.on_segment(t(now_ms), &s.repr, zb(&[]));
            from_b.extend(poll_all(&mut b, t(now_ms)));
        }
        for s in from_b {
            msgs += 1;
            a.on_segment(t(now_ms), &s.repr, zb(&[]));
            from_a.extend(poll_all(&mut a, t(now_ms)));
        }
    }
    assert!(msgs <= 3, "the ACK loop stops at once: {msgs} segments");
    assert_eq!(
        a.counters.oow_acks_suppressed + b.counters.oow_acks_suppressed,
        1
    );
    // After the interval the next unacceptable pure ACK is answered again.
    let later = t(now_ms + 500);
    b.on_segment(later, &ack_seg(1, 1, 1000), zb(&[]));
    assert_eq!(poll_all(&mut b, later).len(), 1);
}

/// Unacceptable segments carrying data or a FIN are still acknowledged every time (RFC 9293
/// §3.10.7.4): the peer's retransmissions depend on those ACKs.
#[test]
fn rfc9293_3_10_7_4_unacceptable_data_and_fin_are_always_acked() {
    let mut c = established();
    c.on_segment(t(2), &ack_seg(PEER_ISS + 1, ISS + 1, 65535), zb(b"abc"));
    poll_all(&mut c, t(2));
    for k in 0..5 {
        // A retransmission of data already received: below RCV.NXT.
        c.on_segment(t(3 + k), &ack_seg(PEER_ISS + 1, ISS + 1, 65535), zb(b"abc"));
        assert_eq!(poll_all(&mut c, t(3 + k)).len(), 1, "data re-ACKed");
        let fin = seg(TcpFlags::ACK | TcpFlags::FIN, PEER_ISS + 1, ISS + 1, 65535);
        c.on_segment(t(3 + k), &fin, zb(&[]));
        assert_eq!(poll_all(&mut c, t(3 + k)).len(), 1, "FIN re-ACKed");
    }
    // Pure ACKs in the same span: one answer.
    let mut answers = 0;
    for k in 0..5 {
        c.on_segment(
            t(10 + k),
            &ack_seg(PEER_ISS + 999_999, ISS + 1, 65535),
            zb(&[]),
        );
        answers += poll_all(&mut c, t(10 + k)).len();
    }
    assert_eq!(answers, 1);
    assert_eq!(c.counters.oow_acks_suppressed, 4);
}

/// RFC 7323 §5.3 R1 (PAWS) with the same limit: an old-timestamp pure ACK is answered at most
/// once per interval, old-timestamp data every time.
#[test]
fn rfc7323_5_3_paws_failed_pure_acks_are_answered_once_per_interval() {
    let cfg = TcpConfig {
        timestamps: true,
        ..plain_cfg()
    };
    let mut c = established_with(cfg, ts_opts(1000));
    let mut answers = 0;
    for k in 0..5 {
        let mut old = ack_seg(PEER_ISS + 1, ISS + 1, 65535);
        old.options = ts_opts(900);
        c.on_segment(t(2 + k), &old, zb(&[]));
        answers += poll_all(&mut c, t(2 + k)).len();
    }
    assert_eq!(answers, 1);
    assert_eq!(c.counters.drops(DropReason::Paws), 5);
    let mut old = ack_seg(PEER_ISS + 1, ISS + 1, 65535);
    old.options = ts_opts(900);
    c.on_segment(t(9), &old, zb(b"data"));
    assert_eq!(poll_all(&mut c, t(9)).len(), 1);
}

/// RFC 5961 §4.2: a SYN outside the window gets a rate-limited challenge ACK like any other
/// SYN, not an unlimited ACK per segment.
#[test]
fn rfc5961_4_2_out_of_window_syns_get_rate_limited_challenge_acks() {
    let mut c = established();
    let mut answers = 0;
    for k in 0..50u32 {
        let syn = seg(TcpFlags::SYN, PEER_ISS + 100_000 + k * 70_000, 0, 1000);
        c.on_segment(t(2), &syn, zb(&[]));
        answers += poll_all(&mut c, t(2)).len();
    }
    assert_eq!(answers as u32, TcpConfig::default().challenge_ack_limit);
}

/// Regression (spurious second recovery): RFC 6582 §3.2 step 5 — after an RTO, `recover` is
/// set to the highest sequence number sent. It used to be set only for an RTO during
/// recovery, so the duplicate ACKs caused by the go-back-N retransmissions started a fast
/// retransmit (and another window reduction) below the RTO's HighData.
#[test]
fn rfc6582_3_2_step5_rto_outside_recovery_sets_recover() {
    let mut c = established();
    c.send(&zb(&vec![7u8; 1460 * 8])).unwrap();
    assert_eq!(poll_all(&mut c, t(2)).len(), 8);
    let rto = c.poll_timeout().unwrap();
    c.on_timeout(rto);
    assert!(!c.in_recovery());
    poll_all(&mut c, rto);
    // The receiver already held segments 2..8: the first retransmission is acknowledged, then
    // the go-back-N duplicates produce duplicate ACKs below the RTO's HighData.
    let una = ISS + 1;
    c.on_segment(rto, &ack_seg(PEER_ISS + 1, una + 1460, 65535), zb(&[]));
    poll_all(&mut c, rto);
    for _ in 0..3 {
        c.on_segment(rto, &ack_seg(PEER_ISS + 1, una + 1460, 65535), zb(&[]));
    }
    assert!(
        !c.in_recovery(),
        "no fast recovery below the RTO's recover point"
    );
    assert_eq!(c.counters.fast_retransmits, 0);
}

/// An established connection that closed first and reached TIME-WAIT (peer FIN at
/// PEER_ISS + 1, so RCV.NXT = PEER_ISS + 2).
fn time_wait() -> Connection {
    let mut c = established();
    c.close();
    poll_all(&mut c, t(2));
    let fin = seg(TcpFlags::ACK | TcpFlags::FIN, PEER_ISS + 1, ISS + 2, 65535);
    c.on_segment(t(3), &fin, zb(&[]));
    poll_all(&mut c, t(3));
    assert_eq!(c.state(), State::TimeWait);
    c
}

/// Regression (TIME-WAIT extended by junk): RFC 9293 §3.10.7.4 first check: an unacceptable
/// segment is only acknowledged; of those, only a retransmission of the remote FIN restarts
/// the 2 MSL timer. Any unacceptable segment used to restart it.
#[test]
fn rfc9293_3_10_7_4_time_wait_restarts_only_on_a_retransmitted_fin() {
    let mut c = time_wait();
    let first = c.poll_timeout().unwrap();
    assert_eq!(first, t(3) + TcpConfig::default().time_wait);
    // A stray or spoofed ACK with an arbitrary sequence number and a FIN far away: neither
    // restarts the timer.
    c.on_segment(
        t(59_000),
        &ack_seg(PEER_ISS + 123_456_789, 42, 1000),
        zb(&[]),
    );
    let far_fin = seg(
        TcpFlags::ACK | TcpFlags::FIN,
        PEER_ISS + 99_999,
        ISS + 2,
        65535,
    );
    c.on_segment(t(59_000), &far_fin, zb(&[]));
    assert_eq!(c.poll_timeout(), Some(first), "2 MSL not extended by junk");
    // The peer's FIN, retransmitted: ACKed, and the timer restarts.
    let rexmit = seg(TcpFlags::ACK | TcpFlags::FIN, PEER_ISS + 1, ISS + 2, 65535);
    c.on_segment(t(59_500), &rexmit, zb(&[]));
    let out = poll_all(&mut c, t(59_500));
    assert_eq!(out.last().unwrap().repr.ack, SeqNum(PEER_ISS + 2));
    assert_eq!(
        c.poll_timeout(),
        Some(t(59_500) + TcpConfig::default().time_wait)
    );
}

/// Regression (silent TIME-WAIT): an acceptable ACK in TIME-WAIT (SEG.SEQ = RCV.NXT + 1,
/// inside the window) was neither answered nor restarted the timer. RFC 9293 §3.10.7.4
/// fifth (TIME-WAIT): acknowledge it and restart the 2 MSL timeout; eighth: a FIN at RCV.NXT
/// restarts it too. (This test used to assert that such a FIN left the timer alone.)
#[test]
fn rfc9293_3_10_7_4_time_wait_acks_an_acceptable_segment_and_restarts_2msl() {
    let mut c = time_wait();
    let tw = TcpConfig::default().time_wait;
    c.on_segment(t(1_000), &ack_seg(PEER_ISS + 3, ISS + 2, 65535), zb(&[]));
    let out = poll_all(&mut c, t(1_000));
    assert_eq!(out.len(), 1, "the in-window ACK is acknowledged");
    assert_eq!(out[0].repr.flags, TcpFlags::ACK);
    assert_eq!(out[0].repr.seq, SeqNum(ISS + 2));
    assert_eq!(out[0].repr.ack, SeqNum(PEER_ISS + 2));
    assert_eq!(c.poll_timeout(), Some(t(1_000) + tw));
    assert_eq!(c.state(), State::TimeWait);
    // A FIN at RCV.NXT (RFC 9293 §3.10.7.4 eighth: remain, restart 2 MSL) is ACKed at once.
    let new_fin = seg(TcpFlags::ACK | TcpFlags::FIN, PEER_ISS + 2, ISS + 2, 65535);
    c.on_segment(t(1_100), &new_fin, zb(&[]));
    assert_eq!(poll_all(&mut c, t(1_100)).len(), 1);
    assert_eq!(c.poll_timeout(), Some(t(1_100) + tw));
    // Pure ACKs are answered under the out-of-window ACK limit (oow_ack_interval).
    c.on_segment(t(1_200), &ack_seg(PEER_ISS + 3, ISS + 2, 65535), zb(&[]));
    assert!(poll_all(&mut c, t(1_200)).is_empty(), "rate limited");
    assert_eq!(
        c.poll_timeout(),
        Some(t(1_200) + tw),
        "but the timer restarts"
    );
    c.on_timeout(t(1_200) + tw);
    assert_eq!(c.state(), State::Closed);
}

fn plain_time_wait(cfg: TcpConfig) -> Connection {
    let mut c = established_with(cfg, TcpOptions::default());
    c.close();
    poll_all(&mut c, t(2));
    let fin = seg(TcpFlags::ACK | TcpFlags::FIN, PEER_ISS + 1, ISS + 2, 65535);
    c.on_segment(t(3), &fin, zb(&[]));
    poll_all(&mut c, t(3));
    assert_eq!(c.state(), State::TimeWait);
    c
}

/// Regression (TIME-WAIT reopened without timestamps): RFC 9293 §3.10.7.4 with RFC 6191 §2:
/// without timestamps a SYN with SEG.SEQ > RCV.NXT cannot be told from an old duplicate, so
/// it does not reopen the tuple unless `time_wait_reopen_by_seq` (RFC 1122 §4.2.2.13) is
/// on; a SYN+FIN never does. Refused SYNs get a challenge ACK (RFC 5961 §4.2).
#[test]
fn rfc9293_3_10_7_4_time_wait_syn_reopens_only_by_timestamp_or_opt_in_seq_rule() {
    let syn = |seq: u32| seg(TcpFlags::SYN, seq, 0, 65535);
    let mut synfin = syn(PEER_ISS + 10_000);
    synfin.flags = TcpFlags::SYN | TcpFlags::FIN;
    let mut c = plain_time_wait(plain_cfg());
    assert!(!c.accepts_new_syn(&syn(PEER_ISS + 10_000)));
    assert!(!c.accepts_new_syn(&synfin));
    c.on_segment(t(10), &syn(PEER_ISS + 10_000), zb(&[]));
    let out = poll_all(&mut c, t(10));
    assert_eq!(out.len(), 1, "challenge ACK");
    assert_eq!(out[0].repr.flags, TcpFlags::ACK);
    assert_eq!(out[0].repr.ack, SeqNum(PEER_ISS + 2));
    assert_eq!(c.state(), State::TimeWait);

    let knob = TcpConfig {
        time_wait_reopen_by_seq: true,
        ..plain_cfg()
    };
    let c = plain_time_wait(knob);
    assert!(c.accepts_new_syn(&syn(PEER_ISS + 10_000)));
    assert!(!c.accepts_new_syn(&syn(PEER_ISS + 2)), "not beyond RCV.NXT");
    assert!(!c.accepts_new_syn(&synfin), "SYN+FIN never reopens");
}

/// RFC 6191 §2: with timestamps on both sides only a newer TSval reopens (whatever the
/// sequence number), never a SYN+FIN; a SYN without timestamps to a timestamped TIME-WAIT
/// connection is not silently dropped (RFC 7323 §3.2) but challenged (RFC 5961 §4.2).
#[test]
fn rfc6191_2_time_wait_syn_needs_a_newer_timestamp() {
    let cfg = TcpConfig {
        timestamps: true,
        time_wait_reopen_by_seq: true,
        ..plain_cfg()
    };
    let mut c = established_with(cfg, ts_opts(100));
    c.close();
    poll_all(&mut c, t(2));
    let mut fin = seg(TcpFlags::ACK | TcpFlags::FIN, PEER_ISS + 1, ISS + 2, 65535);
    fin.options = ts_opts(101);
    c.on_segment(t(3), &fin, zb(&[]));
    poll_all(&mut c, t(3));
    assert_eq!(c.state(), State::TimeWait);
    let syn = |seq: u32, ts: Option<u32>| {
        let mut s = seg(TcpFlags::SYN, seq, 0, 65535);
        if let Some(v) = ts {
            s.options = ts_opts(v);
        }
        s
    };
    assert!(c.accepts_new_syn(&syn(PEER_ISS, Some(102))), "newer TSval");
    assert!(
        !c.accepts_new_syn(&syn(PEER_ISS + 10_000, Some(101))),
        "equal"
    );
    assert!(
        !c.accepts_new_syn(&syn(PEER_ISS + 10_000, Some(50))),
        "older"
    );
    let mut synfin = syn(PEER_ISS + 10_000, Some(102));
    synfin.flags = TcpFlags::SYN | TcpFlags::FIN;
    assert!(!c.accepts_new_syn(&synfin));
    // Without timestamps in the SYN, the opt-in RFC 1122 rule decides.
    assert!(c.accepts_new_syn(&syn(PEER_ISS + 10_000, None)));
    c.on_segment(t(10), &syn(PEER_ISS + 10_000, None), zb(&[]));
    let out = poll_all(&mut c, t(10));
    assert_eq!(out.len(), 1, "challenge ACK, not a silent drop");
    assert_eq!(out[0].repr.ack, SeqNum(PEER_ISS + 2));
}

/// Regression (keepalive fooled by junk): the idle timer was re-armed by any segment, even one
/// dropped as unacceptable, so a stream of spoofed segments hid a dead peer (RFC 9293 §3.8.4:
/// probes start after the connection has been idle; dropped segments are not activity).
#[test]
fn rfc9293_3_8_4_keepalive_is_not_rearmed_by_an_unacceptable_segment() {
    let ka = crate::tcp::config::KeepaliveConfig {
        idle: Duration::from_secs(10),
        interval: Duration::from_secs(1),
        probes: 3,
    };
    let cfg = TcpConfig {
        keepalive: Some(ka),
        ..plain_cfg()
    };
    let mut c = established_with(cfg, TcpOptions::default());
    let first = c.poll_timeout().unwrap();
    c.on_segment(t(9_000), &ack_seg(PEER_ISS + 99_999_999, 7, 1), zb(&[]));
    c.on_segment(t(9_000), &ack_seg(PEER_ISS + 1, ISS + 500_000, 1), zb(&[]));
    assert_eq!(c.counters.drops(DropReason::OutOfWindow), 1);
    assert_eq!(c.counters.drops(DropReason::BadAck), 1);
    assert_eq!(c.poll_timeout(), Some(first), "idle timer kept");
    // A valid segment from the peer is activity.
    c.on_segment(t(9_500), &ack_seg(PEER_ISS + 1, ISS + 1, 65535), zb(&[]));
    assert_eq!(c.poll_timeout(), Some(t(9_500) + ka.idle));
}

/// Regression (immortal orphans): FIN-WAIT-2 had no timer, so a connection whose application
/// had closed it lived forever if the peer never sent its FIN. An orphan now gives up after
/// `fin_timeout` with a RST; a connection the application still holds waits (RFC 9293 has no
/// FIN-WAIT-2 timeout: the application may be reading a half-closed stream).
#[test]
fn orphaned_fin_wait_2_is_reset_after_fin_timeout() {
    let mut c = established();
    c.close();
    poll_all(&mut c, t(2));
    c.on_segment(t(3), &ack_seg(PEER_ISS + 1, ISS + 2, 65535), zb(&[]));
    assert_eq!(c.state(), State::FinWait2);
    poll_all(&mut c, t(3));
    assert_eq!(c.poll_timeout(), None, "held by the application: no timer");
    // The application releases it at t = 10 s.
    c.set_orphaned();
    poll_all(&mut c, t(10_000));
    let fin_timeout = TcpConfig::default().fin_timeout;
    assert_eq!(c.poll_timeout(), Some(t(10_000) + fin_timeout));
    // The peer keeps ACKing (a half-closed stream, no data), but the deadline stays.
    c.on_segment(t(20_000), &ack_seg(PEER_ISS + 1, ISS + 2, 65535), zb(&[]));
    poll_all(&mut c, t(20_000));
    assert_eq!(c.poll_timeout(), Some(t(10_000) + fin_timeout));
    let at = c.poll_timeout().unwrap();
    c.on_timeout(at);
    let out = poll_all(&mut c, at);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].repr.flags, TcpFlags::RST);
    assert_eq!(out[0].repr.seq, SeqNum(ISS + 2), "RST at SND.NXT");
    assert!(c.is_closed());
    assert_eq!(c.close_reason(), Some(CloseReason::Timeout));
}

/// RFC 9293 §3.6.1 (SHLD-3): data arriving after the application closed and released the
/// connection can never be read: the connection answers with RST instead of ACKing it.
#[test]
fn rfc9293_3_6_1_data_after_close_gets_rst() {
    let mut c = established();
    c.close();
    c.set_orphaned();
    poll_all(&mut c, t(2));
    c.on_segment(t(3), &ack_seg(PEER_ISS + 1, ISS + 2, 65535), zb(&[]));
    assert_eq!(c.state(), State::FinWait2);
    c.on_segment(t(4), &ack_seg(PEER_ISS + 1, ISS + 2, 65535), zb(b"lost"));
    let out = poll_all(&mut c, t(4));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].repr.flags, TcpFlags::RST);
    assert!(c.is_closed());
    assert_eq!(c.close_reason(), Some(CloseReason::Aborted));
}

/// An orphan that was released before its FIN was acknowledged starts the FIN-WAIT-2 clock
/// when it gets there; one that receives the peer's FIN in time goes to TIME-WAIT as usual.
#[test]
fn orphan_reaching_fin_wait_2_gets_the_timer_and_a_timely_fin_clears_it() {
    let mut c = established();
    c.close();
    c.set_orphaned();
    poll_all(&mut c, t(2));
    c.on_segment(t(5), &ack_seg(PEER_ISS + 1, ISS + 2, 65535), zb(&[]));
    assert_eq!(c.state(), State::FinWait2);
    let fin_timeout = TcpConfig::default().fin_timeout;
    assert_eq!(c.poll_timeout(), Some(t(5) + fin_timeout));
    let fin = seg(TcpFlags::ACK | TcpFlags::FIN, PEER_ISS + 1, ISS + 2, 65535);
    c.on_segment(t(6), &fin, zb(&[]));
    assert_eq!(c.state(), State::TimeWait);
    assert_eq!(
        c.poll_timeout(),
        Some(t(6) + TcpConfig::default().time_wait)
    );
}

/// Regression (orphan pinned by a zero window): a peer that keeps its window shut and
/// acknowledges every probe kept an orphaned FIN-WAIT-1 connection forever. RFC 6429 (folded
/// into RFC 9293 §3.8.6.1): answered probes do not stop an orphan from being reclaimed, so
/// they count toward max_retries; a connection the application holds keeps probing.
#[test]
fn rfc6429_orphan_zero_window_probing_is_bounded() {
    let run = |orphan: bool| {
        let cfg = TcpConfig {
            max_retries: 5,
            ..plain_cfg()
        };
        let mut c = established_with(cfg, TcpOptions::default());
        c.send(&zb(&pattern(5000, 1))).unwrap();
        poll_all(&mut c, t(2));
        // Everything acknowledged but 100 bytes; the window closes.
        c.on_segment(t(3), &ack_seg(PEER_ISS + 1, ISS + 1 + 4900, 0), zb(&[]));
        c.send(&zb(&pattern(100, 2))).unwrap_or(0);
        c.close();
        if orphan {
            c.set_orphaned();
        }
        poll_all(&mut c, t(3));
        let mut probes = 0;
        for _ in 0..30 {
            let Some(at) = c.poll_timeout() else { break };
            c.on_timeout(at);
            for s in poll_all(&mut c, at) {
                if s.payload.len() == 1 {
                    probes += 1;
                    // The peer answers each probe, window still shut, octet not taken.
                    c.on_segment(at, &ack_seg(PEER_ISS + 1, ISS + 1 + 4900, 0), zb(&[]));
                }
            }
            if c.state() == State::Closed {
                break;
            }
        }
        (probes, c.close_reason())
    };
    let (probes, reason) = run(true);
    assert_eq!(probes, 5, "max_retries answered probes");
    assert_eq!(reason, Some(CloseReason::Timeout));
    let (probes, reason) = run(false);
    assert_eq!(probes, 30, "an owned connection keeps probing");
    assert_eq!(reason, None);
}

/// Regression (close during the handshake): close() in SYN-RECEIVED (here after a
/// simultaneous open) jumped to FIN-WAIT-1, so the RTO sent a FIN at SEQ = ISS instead of
/// retransmitting the SYN-ACK. RFC 9293 §3.10.4: the FIN waits for ESTABLISHED.
#[test]
fn rfc9293_3_10_4_close_in_syn_received_keeps_the_handshake() {
    let mut c = Connection::connect(t(0), tuple_a(), plain_cfg(), SeqNum(ISS), 0);
    poll_all(&mut c, t(0));
    c.on_segment(t(1), &seg(TcpFlags::SYN, PEER_ISS, 0, 65535), zb(&[]));
    assert_eq!(c.state(), State::SynReceived);
    let out = poll_all(&mut c, t(1));
    assert_eq!(out[0].repr.flags, TcpFlags::SYN | TcpFlags::ACK);
    c.close();
    assert_eq!(c.state(), State::SynReceived);
    assert_eq!(c.send(&zb(b"x")), Err(SendError::Shutdown));
    let now = c.poll_timeout().unwrap();
    c.on_timeout(now);
    let out = poll_all(&mut c, now);
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].repr.flags,
        TcpFlags::SYN | TcpFlags::ACK,
        "SYN-ACK resent"
    );
    assert_eq!(out[0].repr.seq, SeqNum(ISS));
    // The peer's ACK completes the handshake; the FIN follows.
    c.on_segment(now, &ack_seg(PEER_ISS + 1, ISS + 1, 65535), zb(&[]));
    assert_eq!(c.state(), State::FinWait1);
    let out = poll_all(&mut c, now);
    assert_eq!(out.len(), 1);
    assert!(out[0].repr.flags.fin());
    assert_eq!(out[0].repr.seq, SeqNum(ISS + 1));
    c.on_segment(now, &ack_seg(PEER_ISS + 1, ISS + 2, 65535), zb(&[]));
    assert_eq!(c.state(), State::FinWait2);
}

/// Regression (passive side of RFC 6298 §5.7): after the SYN-ACK timed out, the RTO must be
/// re-initialized to 3 s once the handshake completes; the passive side kept the backed-off
/// 1 s RTO (2 s) while the active side applied the rule.
#[test]
fn rfc6298_5_7_passive_open_after_syn_ack_timeout_starts_with_3s_rto() {
    let info = SynInfo {
        seq: SeqNum(PEER_ISS),
        window: 65535,
        options: TcpOptions::default(),
    };
    let mut c = Connection::accept_syn(t(0), tuple_a(), plain_cfg(), SeqNum(ISS), 0, &info);
    poll_all(&mut c, t(0));
    let now = c.poll_timeout().unwrap();
    c.on_timeout(now);
    assert!(poll_all(&mut c, now)[0].repr.flags.syn());
    c.on_segment(t(2_500), &ack_seg(PEER_ISS + 1, ISS + 1, 65535), zb(&[]));
    assert_eq!(c.state(), State::Established);
    assert_eq!(c.rtt().rto(), Duration::from_secs(3));
    assert_eq!(
        c.rtt().srtt(),
        None,
        "Karn: no sample from a retransmitted SYN-ACK"
    );
}

fn sack_peer() -> Connection {
    let cfg = TcpConfig {
        sack: true,
        ..plain_cfg()
    };
    let peer = TcpOptions {
        sack_permitted: true,
        ..TcpOptions::default()
    };
    established_with(cfg, peer)
}

/// Regression (missing D-SACK): a segment entirely below RCV.NXT (a spurious
/// retransmission) takes the unacceptable path, which never recorded the duplicate, so its
/// ACK carried no D-SACK. RFC 2883 §4: report it.
#[test]
fn rfc2883_4_fully_duplicate_segment_is_dsacked() {
    let mut c = sack_peer();
    c.on_segment(
        t(2),
        &ack_seg(PEER_ISS + 1, ISS + 1, 65535),
        zb(&[1u8; 100]),
    );
    poll_all(&mut c, t(2));
    c.on_segment(
        t(3),
        &ack_seg(PEER_ISS + 1, ISS + 1, 65535),
        zb(&[1u8; 100]),
    );
    let out = poll_all(&mut c, t(3));
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].repr.options.sack_blocks.as_slice(),
        &[(SeqNum(PEER_ISS + 1), SeqNum(PEER_ISS + 101))]
    );
    // Reported once.
    c.on_segment(t(4), &ack_seg(PEER_ISS + 101, ISS + 1, 65535), zb(b"x"));
    let out = poll_all(&mut c, t(4));
    assert!(out[0].repr.options.sack_blocks.is_empty());
}

/// Regression (lost D-SACK): building options for a data segment that then was not sent
/// (cwnd-limited) consumed the pending D-SACK, so the ACK that did go out lacked it.
#[test]
fn rfc2883_4_pending_dsack_survives_a_segment_that_is_not_sent() {
    let mut c = sack_peer();
    // Fill cwnd (IW10) and keep more queued.
    c.send(&zb(&vec![0u8; 1460 * 20])).unwrap();
    assert_eq!(poll_all(&mut c, t(2)).len(), 10);
    c.on_segment(
        t(2),
        &ack_seg(PEER_ISS + 1, ISS + 1, 65535),
        zb(&[1u8; 100]),
    );
    poll_all(&mut c, t(2));
    // Partial duplicate: bytes 50..150 (50..100 already received).
    c.on_segment(
        t(3),
        &ack_seg(PEER_ISS + 1 + 50, ISS + 1, 65535),
        zb(&[1u8; 100]),
    );
    assert!(c.ooo.pending_dsack().is_some());
    let out = poll_all(&mut c, t(3));
    assert_eq!(out.len(), 1, "one ACK");
    assert!(out[0].payload.is_empty());
    assert_eq!(
        out[0].repr.options.sack_blocks.as_slice(),
        &[(SeqNum(PEER_ISS + 51), SeqNum(PEER_ISS + 101))]
    );
    assert!(c.ooo.pending_dsack().is_none());
}

/// Regression (delayed gap-fill ACK): with delayed ACKs on, the segment that filled a hole
/// was ACKed only when the delayed-ACK timer fired. RFC 5681 §4.2: it SHOULD be ACKed at once.
#[test]
fn rfc5681_4_2_segment_filling_a_gap_is_acked_immediately() {
    let mut c = established_delayed_ack(40);
    c.on_segment(
        t(2),
        &ack_seg(PEER_ISS + 1 + 100, ISS + 1, 65535),
        zb(&[1u8; 100]),
    );
    assert_eq!(
        poll_all(&mut c, t(2)).len(),
        1,
        "immediate dup ACK for OOO data"
    );
    c.on_segment(
        t(3),
        &ack_seg(PEER_ISS + 1, ISS + 1, 65535),
        zb(&[1u8; 100]),
    );
    assert_eq!(c.recv_available(), 200);
    let out = poll_all(&mut c, t(3));
    assert_eq!(out.len(), 1, "gap-filling segment ACKed at once");
    assert_eq!(out[0].repr.ack, SeqNum(PEER_ISS + 201));
    // In-order data with no gap is still delayed.
    c.on_segment(
        t(4),
        &ack_seg(PEER_ISS + 201, ISS + 1, 65535),
        zb(&[1u8; 100]),
    );
    assert!(poll_all(&mut c, t(4)).is_empty());
}

/// Regression (SYN-cookie window): a connection re-created from a SYN cookie set RCV.ADV to
/// RCV.NXT, i.e. a zero window, although the cookie SYN-ACK offered min(rcv_buf, 65535), so
/// in-window data that arrived before our first ACK (a reordered second segment) was dropped
/// as out of window.
#[test]
fn syn_cookie_connection_accepts_in_window_data_before_its_first_ack() {
    let peer = TcpOptions {
        mss: Some(1460),
        ..TcpOptions::default()
    };
    let mut c = Connection::from_cookie(
        t(0),
        tuple_a(),
        plain_cfg(),
        SeqNum(ISS),
        SeqNum(PEER_ISS),
        0,
        &peer,
    );
    // The cookie ACK (pure), then the peer's first two data segments, reordered.
    c.on_segment(t(1), &ack_seg(PEER_ISS + 1, ISS + 1, 65535), zb(&[]));
    assert_eq!(c.state(), State::Established);
    c.on_segment(
        t(1),
        &ack_seg(PEER_ISS + 1001, ISS + 1, 65535),
        zb(&[7u8; 1000]),
    );
    assert_eq!(c.counters.drops(DropReason::OutOfWindow), 0);
    c.on_segment(
        t(1),
        &ack_seg(PEER_ISS + 1, ISS + 1, 65535),
        zb(&[6u8; 1000]),
    );
    assert_eq!(c.recv_available(), 2000, "both segments delivered");
}

/// Regression (receive queue over rcv_buf, found by the `stack_established` fuzz target):
/// with window scaling the advertised field was rounded up, and because the rounding was
/// applied to RCV.ADV after RCV.NXT moved by a non-multiple of 2^shift, RCV.ADV crept one
/// unit further past the free space on every ACK. Both the full path (trim to the window,
/// RFC 9293 §3.10.7.4) and header prediction accept up to RCV.ADV, so a peer filling the
/// window with segments larger than the MSS left 65,546 bytes queued against 65,536.
/// RFC 7323 §2.4: round down; RCV.ADV never passes RCV.NXT plus the free space.
#[test]
fn rfc9293_3_10_7_4_receive_queue_never_exceeds_rcv_buf_with_window_scaling() {
    for fast in [true, false] {
        let cfg = TcpConfig {
            rcv_buf: 65536,
            window_scaling: true,
            header_prediction: fast,
            ..plain_cfg()
        };
        let peer = TcpOptions {
            window_scale: Some(7),
            ..TcpOptions::default()
        };
        let mut c = established_with(cfg, peer);
        assert_eq!(c.negotiated().2, Some((7, 1)));
        let sizes = [2280usize, 2775, 2500, 2331, 2612];
        for (k, &n) in sizes.iter().cycle().take(60).enumerate() {
            // In order, no application reads: the peer sends whatever it has, the window
            // trims it.
            let seq = PEER_ISS + 1 + c.recv_available() as u32;
            let now = t(2 + k as u64);
            c.on_segment(now, &ack_seg(seq, ISS + 1, 65535), zb(&vec![7u8; n]));
            let out = poll_all(&mut c, now);
            assert!(
                c.recv_available() <= 65536,
                "fast path {fast}: {} bytes queued",
                c.recv_available()
            );
            for o in &out {
                let edge = o.repr.ack + (u32::from(o.repr.window) << 1);
                assert!(
                    edge.le(SeqNum(PEER_ISS + 1 + 65536)),
                    "advertised beyond the buffer"
                );
            }
        }
        assert_eq!(c.recv_available(), 65536, "the window was filled exactly");
    }
}

/// One `TcpConfig` shared by every connection of a stack (issue 13: a 256-byte copy per
/// connection cost four cache lines each at 5,000 connections). What the config offers and
/// what a connection negotiated stay apart: a connection re-created from a SYN cookie that
/// did not encode timestamps must not send them, although the shared config offers them,
/// while a connection of the same config whose peer offered timestamps uses them
/// (RFC 7323 §3.2: timestamps only if both SYNs carried them).
#[test]
fn rfc7323_3_2_shared_config_keeps_timestamps_per_connection() {
    let shared = Arc::new(TcpConfig {
        timestamps: true,
        ..plain_cfg()
    });
    let no_ts = TcpOptions {
        mss: Some(1460),
        ..TcpOptions::default()
    };
    let mut cookie = Connection::from_cookie(
        t(0),
        tuple_a(),
        Arc::clone(&shared),
        SeqNum(ISS),
        SeqNum(PEER_ISS),
        0,
        &no_ts,
    );
    let with_ts = SynInfo {
        seq: SeqNum(PEER_ISS),
        window: 65535,
        options: TcpOptions {
            mss: Some(1460),
            timestamps: Some(Timestamps {
                tsval: 1000,
                tsecr: 0,
            }),
            ..TcpOptions::default()
        },
    };
    let mut passive = Connection::accept_syn(
        t(0),
        tuple_b(),
        Arc::clone(&shared),
        SeqNum(ISS),
        0,
        &with_ts,
    );
    assert_eq!(
        Arc::strong_count(&shared),
        3,
        "both connections share the one config"
    );
    cookie.on_segment(t(1), &ack_seg(PEER_ISS + 1, ISS + 1, 65535), zb(&[]));
    assert_eq!(cookie.state(), State::Established);
    cookie.send(&zb(&[1u8; 100])).unwrap();
    let out = poll_all(&mut cookie, t(1));
    assert!(!out.is_empty());
    assert!(
        out.iter().all(|o| o.repr.options.timestamps.is_none()),
        "the cookie connection negotiated no timestamps"
    );
    let synack = passive.poll_segment(t(1)).expect("SYN-ACK");
    assert!(synack.repr.flags.syn() && synack.repr.flags.ack());
    assert!(
        synack.repr.options.timestamps.is_some(),
        "the passive connection answers the peer's timestamps"
    );
    drop(cookie);
    drop(passive);
    assert_eq!(Arc::strong_count(&shared), 1);
}

/// Issue 13 (5,000 connections miss every line of a connection they touch): the fields the
/// established fast path reads and writes per segment lie in the connection's first four
/// cache lines, the per-segment counters in the fifth, and the connection starts on a line.
#[test]
fn hot_fields_share_the_first_cache_lines() {
    use core::mem::{align_of, offset_of, size_of};
    assert_eq!(align_of::<Connection>(), 64);
    let hot = [
        ("cfg", offset_of!(Connection, cfg)),
        ("rcvq_len", offset_of!(Connection, rcvq_len)),
        ("last_rcv", offset_of!(Connection, last_rcv)),
        ("ts", offset_of!(Connection, ts)),
        ("recovery", offset_of!(Connection, recovery)),
        ("rexmit_now", offset_of!(Connection, rexmit_now)),
        ("snd_una", offset_of!(Connection, snd_una)),
        ("snd_max", offset_of!(Connection, snd_max)),
        ("rcv_nxt", offset_of!(Connection, rcv_nxt)),
        ("last_ack_sent", offset_of!(Connection, last_ack_sent)),
        ("tuple", offset_of!(Connection, tuple)),
        ("state", offset_of!(Connection, state)),
        ("events", offset_of!(Connection, events)),
        ("timers", offset_of!(Connection, timers)),
    ];
    for (name, off) in hot {
        assert!(off < 256, "{name} at byte {off}, beyond the four hot lines");
    }
    assert!(
        offset_of!(Connection, timers) + size_of::<TimerTable>() <= 256,
        "the timer table ends beyond the hot lines"
    );
    let c = offset_of!(Connection, counters);
    assert_eq!(c, 256, "the counters start the fifth line");
    for (name, off) in [
        ("segs_in", offset_of!(ConnCounters, segs_in)),
        ("segs_out", offset_of!(ConnCounters, segs_out)),
        ("bytes_in", offset_of!(ConnCounters, bytes_in)),
        ("bytes_out", offset_of!(ConnCounters, bytes_out)),
        ("fast_path_hits", offset_of!(ConnCounters, fast_path_hits)),
    ] {
        assert!(
            off + 8 <= 64,
            "counter {name} outside the first counter line"
        );
    }
    let line = |off: usize| off / 64;
    // The assembler's first 48 bytes (queue, D-SACK, recent count) in one line.
    let ooo = offset_of!(Connection, ooo);
    assert_eq!(
        line(ooo),
        line(ooo + 47),
        "assembler hot part straddles a line"
    );
    let rcvq = offset_of!(Connection, rcvq);
    assert_eq!(line(rcvq), line(rcvq + size_of::<VecDeque<Zbuf>>() - 1));
    let sndq = offset_of!(Connection, sndq);
    assert_eq!(sndq % 64, 0, "send queue at byte {sndq}");
    assert!(size_of::<SendQueue>() <= 64);
    // The scoreboard's SACK-idle fields (its first 64 bytes) in one line.
    assert_eq!(offset_of!(Connection, sb) % 64, 0);
    // The RTT estimator (nearly every field touched by each RTT sample) in two whole lines,
    // and the congestion controller from the next line on.
    let rtt = offset_of!(Connection, rtt);
    assert_eq!(rtt % 64, 0, "RTT estimator at byte {rtt}");
    assert!(size_of::<RttEstimator>() <= 128);
    assert_eq!(offset_of!(Connection, cc) % 64, 0);
    // The tail's per-ACK fields in the congestion controller's last line and the next:
    // the undo episode (`active`), what a new ACK clears, the probe state (every send arms
    // the PTO) and the receive-memory fast compare (every segment).
    let cc_end = offset_of!(Connection, cc) + size_of::<Cc>();
    let first = line(cc_end - 1);
    for (name, off, len) in [
        (
            "undo",
            offset_of!(Connection, undo),
            size_of::<UndoEpisode>(),
        ),
        (
            "lt_bytes",
            offset_of!(Connection, lt_bytes),
            size_of::<u32>(),
        ),
        (
            "icmp_soft",
            offset_of!(Connection, icmp_soft),
            size_of::<Option<Icmpv4DstUnreachable>>(),
        ),
        (
            "send_tlp",
            offset_of!(Connection, send_tlp),
            size_of::<bool>(),
        ),
        (
            "tlp_backoff",
            offset_of!(Connection, tlp_backoff),
            size_of::<u8>(),
        ),
        (
            "persist_backoff",
            offset_of!(Connection, persist_backoff),
            size_of::<u32>(),
        ),
        (
            "tlp",
            offset_of!(Connection, tlp),
            size_of::<Option<TlpEpisode>>(),
        ),
        (
            "rcv_mem_easy",
            offset_of!(Connection, rcv_mem_easy),
            size_of::<usize>(),
        ),
    ] {
        assert!(
            line(off) >= first && line(off + len - 1) <= first + 1,
            "{name} at bytes {off}..{} is outside lines {first} and {}",
            off + len,
            first + 1
        );
    }
}

// ---------------------------------------------------------------------------------------
// Tail loss probes (RFC 8985 §7)
// ---------------------------------------------------------------------------------------

/// Established with SACK at t = 1 ms (one RTT sample of 1 ms: SRTT 1 ms, RTO 200 ms), with
/// `n` full segments sent at t = 2 ms and none acknowledged.
fn tlp_flight(cfg: TcpConfig, n: usize) -> Connection {
    let mut c = sack_established(cfg);
    c.send(&zb(&vec![7u8; 1460 * n])).unwrap();
    assert_eq!(poll_all(&mut c, t(2)).len(), n);
    c
}

/// Established at t = 1 ms with a peer that offered SACK.
fn sack_established(cfg: TcpConfig) -> Connection {
    let peer = TcpOptions {
        sack_permitted: true,
        ..TcpOptions::default()
    };
    established_with(cfg, peer)
}

/// [`sack_established`] with an initial window of `iw` segments and six segments queued,
/// the window's worth sent at t = 2 ms.
fn iw_limited(iw: u32) -> Connection {
    let cfg = TcpConfig {
        cc_config: crate::tcp::cc::CcConfig {
            initial_window: crate::tcp::cc::InitialWindow::Segments(iw),
            ..Default::default()
        },
        ..plain_sack_cfg()
    };
    let mut c = sack_established(cfg);
    c.send(&zb(&vec![7u8; 1460 * 6])).unwrap();
    assert_eq!(
        poll_all(&mut c, t(2)).len(),
        iw as usize,
        "the initial window"
    );
    c
}

/// SACK, and tail loss probes on (the default, spelled out: these tests are about them).
fn plain_sack_cfg() -> TcpConfig {
    TcpConfig {
        sack: true,
        tlp: Some(TcpConfig::TLP_FLOOR),
        ..plain_cfg()
    }
}

/// A whole flight lost (a burst loss at a queue): the probe goes out two round trips after
/// it (here the 10 ms floor), not after the 200 ms RTO; the last segment again, since no new
/// data waits. Its SACK shows the holes below it, which are lost (RFC 8985 §6.2: data sent
/// after them arrived): fast recovery resends SND.UNA at once. No RTO anywhere.
#[test]
fn rfc8985_7_a_lost_flight_is_probed_and_recovered_without_an_rto() {
    let mut c = tlp_flight(plain_sack_cfg(), 3);
    let una = ISS + 1;
    assert_eq!(c.poll_timeout(), Some(t(12)), "PTO = max(2 SRTT, 10 ms)");
    c.on_timeout(t(12));
    let probe = poll_all(&mut c, t(12));
    assert_eq!(probe.len(), 1, "one probe");
    assert_eq!(
        probe[0].repr.seq,
        SeqNum(una + 2 * 1460),
        "the last segment"
    );
    assert_eq!(probe[0].payload.len(), 1460);
    assert_eq!(c.counters.tlp_probes, 1);
    assert_eq!(c.counters.rtos, 0);
    assert_eq!(
        c.poll_timeout(),
        Some(t(212)),
        "the RTO restarts; no second probe"
    );
    // The probe arrives alone: the peer SACKs it.
    c.on_segment(t(13), &sack_ack(una, una + 2920, una + 4380), zb(&[]));
    assert!(c.in_recovery(), "the SACKed probe starts recovery");
    assert_eq!(c.counters.rack_recoveries, 1);
    let out = poll_all(&mut c, t(13));
    assert_eq!(out[0].repr.seq, SeqNum(una), "SND.UNA resent at once");
    c.on_segment(
        t(14),
        &sack_ack(una + 1460, una + 2920, una + 4380),
        zb(&[]),
    );
    let out = poll_all(&mut c, t(14));
    assert!(
        out.iter()
            .any(|s| s.repr.seq == SeqNum(una + 1460) && !s.payload.is_empty()),
        "the second hole follows"
    );
    c.on_segment(t(15), &ack_seg(PEER_ISS + 1, una + 4380, 65535), zb(&[]));
    assert!(!c.in_recovery());
    assert_eq!(c.counters.rtos, 0);
    assert_eq!(c.poll_timeout(), None, "all acknowledged");
}

/// One segment in flight (the last of three lost, the first two acknowledged): its ACK may
/// be delayed, so the PTO allows the peer's ACK delay (40 ms) on top of 2 SRTT: the probe
/// goes out long before the 200 ms RTO (no timeout, no collapse of the window). The ACK
/// that covers it leaves the episode open (original or probe?); an ACK beyond it without
/// a D-SACK proves the probe repaired a loss: the window is reduced (RFC 8985 §7.4).
#[test]
fn rfc8985_7_4_a_probe_that_repaired_the_last_segment_reduces_the_window() {
    let mut c = tlp_flight(plain_sack_cfg(), 3);
    let una = ISS + 1;
    c.on_segment(t(3), &ack_seg(PEER_ISS + 1, una + 2920, 65535), zb(&[]));
    let rto_at = c.poll_timeout().unwrap();
    assert_eq!(
        rto_at,
        t(3) + c.rtt.srtt().unwrap() * 2 + Duration::from_millis(40),
        "one segment: 2 SRTT + the peer's allowed ACK delay"
    );
    c.on_timeout(rto_at);
    let probe = poll_all(&mut c, rto_at);
    assert_eq!(probe.len(), 1);
    assert_eq!(probe[0].repr.seq, SeqNum(una + 2920));
    assert_eq!((c.counters.tlp_probes, c.counters.rtos), (1, 0));
    let cwnd = c.cwnd();
    let at = rto_at + Duration::from_millis(1);
    c.on_segment(at, &ack_seg(PEER_ISS + 1, una + 4380, 65535), zb(&[]));
    assert_eq!(c.counters.rack_recoveries, 0, "not yet decided");
    c.send(&zb(&[1u8; 100])).unwrap();
    assert_eq!(poll_all(&mut c, at).len(), 1);
    c.on_segment(at, &ack_seg(PEER_ISS + 1, una + 4480, 65535), zb(&[]));
    assert_eq!(c.counters.rack_recoveries, 1);
    assert!(c.cwnd() < cwnd, "reduced: {} -> {}", cwnd, c.cwnd());
    assert_eq!(c.counters.rtos, 0);
}

/// The §7.4 reduction is a loss response of its own: an undo episode still open from an
/// earlier fast recovery ends with it (as a new recovery or an RTO ends it). Left open, a
/// late D-SACK of that recovery's retransmission "undid" the probe's reduction: the
/// congestion state restored was the one saved when the probe's loss was found.
#[test]
fn rfc8985_7_4_the_probe_reduction_ends_an_earlier_undo_episode() {
    let mut c = tlp_flight(plain_sack_cfg(), 5);
    let una = ISS + 1;
    // Segment 1 missing, 2-5 SACKed: fast retransmit of segment 1.
    c.on_segment(t(3), &sack_ack(una, una + 1460, una + 7300), zb(&[]));
    assert!(c.in_recovery());
    assert_eq!(data_seqs(&poll_all(&mut c, t(3)), una), vec![0]);
    // Its original arrives: recovery ends; the retransmission's D-SACK is still to come.
    c.on_segment(t(4), &ack_seg(PEER_ISS + 1, una + 7300, 65535), zb(&[]));
    assert!(!c.in_recovery());
    assert!(c.undo.active);
    // A new flight of two; the second is lost and repaired by the probe.
    let base = una + 7300;
    c.send(&zb(&vec![7u8; 1460 * 2])).unwrap();
    assert_eq!(poll_all(&mut c, t(5)).len(), 2);
    c.on_segment(t(6), &ack_seg(PEER_ISS + 1, base + 1460, 65535), zb(&[]));
    let pto = c.poll_timeout().unwrap();
    c.on_timeout(pto);
    let probe = poll_all(&mut c, pto);
    assert_eq!(probe.len(), 1);
    assert_eq!(probe[0].repr.seq, SeqNum(base + 1460));
    let at = pto + Duration::from_millis(1);
    c.on_segment(at, &ack_seg(PEER_ISS + 1, base + 2920, 65535), zb(&[]));
    c.send(&zb(&[1u8; 100])).unwrap();
    assert_eq!(poll_all(&mut c, at).len(), 1);
    c.on_segment(at, &ack_seg(PEER_ISS + 1, base + 3020, 65535), zb(&[]));
    assert_eq!(c.counters.rack_recoveries, 1, "the probe repaired a loss");
    let reduced = c.cwnd();
    // The first recovery's retransmission reported duplicate, late.
    c.on_segment(at, &sack_ack(base + 3020, una, una + 1460), zb(&[]));
    assert_eq!(c.counters.dsacks, 1);
    assert_eq!(c.counters.spurious_recoveries, 0, "nothing undone");
    assert!(c.cwnd() <= reduced, "{} -> {}", reduced, c.cwnd());
}

/// The originals were only slow: the probe's duplicate is D-SACKed, nothing was lost and
/// the window stays.
#[test]
fn rfc8985_7_4_a_dsacked_probe_reduces_nothing() {
    let mut c = tlp_flight(plain_sack_cfg(), 3);
    let una = ISS + 1;
    c.on_timeout(t(12));
    assert_eq!(poll_all(&mut c, t(12)).len(), 1);
    let cwnd = c.cwnd();
    c.on_segment(t(13), &ack_seg(PEER_ISS + 1, una + 4380, 65535), zb(&[]));
    // D-SACK (RFC 2883): the block lies below the cumulative ACK.
    c.on_segment(
        t(13),
        &sack_ack(una + 4380, una + 2920, una + 4380),
        zb(&[]),
    );
    assert_eq!(c.counters.dsacks, 1);
    c.send(&zb(&[1u8; 100])).unwrap();
    assert_eq!(poll_all(&mut c, t(14)).len(), 1);
    c.on_segment(t(15), &ack_seg(PEER_ISS + 1, una + 4480, 65535), zb(&[]));
    assert_eq!(c.counters.rack_recoveries, 0);
    assert!(c.cwnd() >= cwnd, "kept: {} -> {}", cwnd, c.cwnd());
}

/// With new data waiting behind a full congestion window, the probe is new data, sent
/// past the window (RFC 8985 §7.3: congestion control does not gate the probe).
#[test]
fn rfc8985_7_3_the_probe_is_new_data_when_some_waits() {
    let mut c = iw_limited(4);
    let una = ISS + 1;
    c.on_timeout(t(12));
    let probe = poll_all(&mut c, t(12));
    assert_eq!(probe.len(), 1);
    assert_eq!(
        probe[0].repr.seq,
        SeqNum(una + 4 * 1460),
        "the fifth segment, new"
    );
    assert_eq!(c.counters.retransmits, 0);
    assert_eq!(c.counters.tlp_probes, 1);
}

/// No probe without SACK (the probe's SACK is what tells the sender what is missing) or
/// with probing turned off: the RTO is the only timer.
#[test]
fn rfc8985_7_2_no_probe_without_sack_or_when_off() {
    for cfg in [
        TcpConfig {
            tlp: Some(TcpConfig::TLP_FLOOR),
            ..plain_cfg()
        },
        TcpConfig {
            tlp: None,
            ..plain_sack_cfg()
        },
    ] {
        let mut c = tlp_flight(cfg, 3);
        let at = c.poll_timeout().unwrap();
        assert_eq!(at, t(202), "the RTO only");
        c.on_timeout(at);
        assert_eq!(c.counters.rtos, 1);
        assert_eq!(c.counters.tlp_probes, 0);
    }
}

/// RFC 8985 §6.2 (RACK's reordering timer): the second of three segments is lost; the ACK
/// of the first SACKs the third, one segment, under DupThresh. A quarter of the minimum RTT
/// later (1 ms here: 250 µs) the hole is still open and recovery resends it; no RTO.
#[test]
fn rfc8985_6_2_a_hole_under_dupthresh_is_recovered_after_the_reordering_window() {
    let mut c = tlp_flight(plain_sack_cfg(), 3);
    let una = ISS + 1;
    let sack = sack_ack(una + 1460, una + 2920, una + 4380);
    c.on_segment(t(3), &sack, zb(&[]));
    assert!(!c.in_recovery(), "one SACKed segment: under DupThresh");
    let at = c.poll_timeout().unwrap();
    assert_eq!(at, t(3) + Duration::from_micros(250), "min RTT / 4");
    c.on_timeout(at);
    assert!(c.in_recovery());
    assert_eq!(c.counters.rack_recoveries, 1);
    let out = poll_all(&mut c, at);
    assert_eq!(out[0].repr.seq, SeqNum(una + 1460), "the hole, at once");
    c.on_segment(t(4), &ack_seg(PEER_ISS + 1, una + 4380, 65535), zb(&[]));
    assert!(!c.in_recovery());
    assert_eq!((c.counters.rtos, c.counters.tlp_probes), (0, 0));
}

/// The hole is only late (reordered): it arrives inside the window, nothing is resent; and
/// D-SACKs widen the window (RFC 8985 §6.2 step 4).
#[test]
fn rfc8985_6_2_a_late_segment_inside_the_window_is_not_lost() {
    let mut c = tlp_flight(plain_sack_cfg(), 3);
    let una = ISS + 1;
    c.on_segment(t(3), &sack_ack(una + 1460, una + 2920, una + 4380), zb(&[]));
    let at = c.poll_timeout().unwrap();
    c.on_segment(
        Instant::from_nanos(at.as_nanos() - 1_000),
        &ack_seg(PEER_ISS + 1, una + 4380, 65535),
        zb(&[]),
    );
    assert_eq!(c.poll_timeout(), None, "all acknowledged: no timer left");
    assert_eq!((c.counters.rack_recoveries, c.counters.retransmits), (0, 0));

    // Each D-SACK (a needless retransmission: reordering) widens the window by a quarter
    // of the minimum RTT, up to a smoothed RTT.
    for (dsacks, want) in [
        (1, Duration::from_micros(500)),
        (8, Duration::from_millis(1)),
    ] {
        let mut c = tlp_flight(plain_sack_cfg(), 3);
        for _ in 0..dsacks {
            c.rack_on_dsack();
        }
        assert_eq!(c.rtt.srtt(), Some(Duration::from_millis(1)));
        c.on_segment(t(3), &sack_ack(una + 1460, una + 2920, una + 4380), zb(&[]));
        assert_eq!(c.poll_timeout(), Some(t(3) + want), "{dsacks} D-SACKs");
    }
}

/// RACK off: the same hole waits for the RTO (as RFC 6675 alone does).
#[test]
fn rfc8985_6_2_no_reordering_timer_when_off() {
    let cfg = TcpConfig {
        rack: false,
        ..plain_sack_cfg()
    };
    let mut c = tlp_flight(cfg, 3);
    let una = ISS + 1;
    c.on_segment(t(3), &sack_ack(una + 1460, una + 2920, una + 4380), zb(&[]));
    // (The probe timeout armed with the flight may still wake the connection; with data
    // SACKed it does nothing.)
    let mut at = c.poll_timeout().unwrap();
    while c.counters.rtos == 0 {
        assert!(!c.in_recovery() && at < t(1_000), "{at:?}");
        c.on_timeout(at);
        if c.counters.rtos == 0 {
            at = c.poll_timeout().unwrap();
        }
    }
    assert!(at >= t(200), "repaired by the RTO, at {at:?}");
    assert_eq!(c.counters.rack_recoveries, 0);
}

/// With data waiting to go out, the SACKs keep coming (limited transmit) and RFC 6675's
/// DupThresh decides: no reordering timer (RFC 5827's condition).
#[test]
fn rfc8985_6_2_no_reordering_timer_while_new_data_can_go() {
    let mut c = iw_limited(3);
    let una = ISS + 1;
    c.on_segment(t(3), &sack_ack(una + 1460, una + 2920, una + 4380), zb(&[]));
    let next = c.poll_timeout().unwrap();
    assert!(next > t(3) + Duration::from_millis(1), "{next:?}");
    assert!(
        !poll_all(&mut c, t(3)).is_empty(),
        "new data goes out instead"
    );
}

/// A needless probe (D-SACKed: the original had arrived, its ACK was only slow) doubles the
/// connection's next probe timeouts (beyond RFC 8985: a loaded peer's round trip outgrows
/// 2 SRTT without any loss).
#[test]
fn rfc8985_7_a_needless_probe_doubles_the_next_timeout() {
    let cfg = TcpConfig {
        tlp: Some(Duration::from_micros(1)),
        ..plain_sack_cfg()
    };
    let mut c = tlp_flight(cfg, 3);
    let una = ISS + 1;
    assert_eq!(c.poll_timeout(), Some(t(4)), "2 SRTT (1 ms)");
    c.on_timeout(t(4));
    assert_eq!(poll_all(&mut c, t(4)).len(), 1, "the probe");
    c.on_segment(t(5), &ack_seg(PEER_ISS + 1, una + 4380, 65535), zb(&[]));
    c.on_segment(t(5), &sack_ack(una + 4380, una + 2920, una + 4380), zb(&[]));
    assert_eq!(
        c.rtt.srtt(),
        Some(Duration::from_millis(1)),
        "Karn: no sample"
    );
    c.send(&zb(&vec![7u8; 1460 * 3])).unwrap();
    assert_eq!(poll_all(&mut c, t(6)).len(), 3);
    assert_eq!(c.poll_timeout(), Some(t(10)), "doubled: 4 SRTT");
}

/// RFC 8985 §7.4.2 step 1 (1): a duplicate ACK at TLP.end_seq with no SACK above it means
/// the original and the retransmitted probe both arrived (the peer does not send D-SACKs):
/// the episode ends without a loss. Left open, the next ACK beyond the probe was taken for
/// a repaired loss and the window was reduced for nothing.
#[test]
fn rfc8985_7_4_2_a_duplicate_ack_at_the_probe_end_ends_the_episode_without_a_loss() {
    let mut c = tlp_flight(plain_sack_cfg(), 3);
    let una = ISS + 1;
    c.on_timeout(t(12));
    assert_eq!(
        poll_all(&mut c, t(12)).len(),
        1,
        "the probe: the last segment"
    );
    // New data goes out behind the probe, so the ACKs below are RFC 5681 duplicates.
    c.send(&zb(&[1u8; 100])).unwrap();
    assert_eq!(poll_all(&mut c, t(12)).len(), 1);
    let cwnd = c.cwnd();
    // The original's ACK, then the probe's: a pure duplicate, no D-SACK.
    c.on_segment(t(13), &ack_seg(PEER_ISS + 1, una + 4380, 65535), zb(&[]));
    c.on_segment(t(13), &ack_seg(PEER_ISS + 1, una + 4380, 65535), zb(&[]));
    assert_eq!(c.tlp, None, "the episode is over");
    c.on_segment(t(14), &ack_seg(PEER_ISS + 1, una + 4480, 65535), zb(&[]));
    assert_eq!(c.counters.rack_recoveries, 0, "nothing was lost");
    assert!(c.cwnd() >= cwnd, "kept: {} -> {}", cwnd, c.cwnd());
}

/// The same with nothing left outstanding (the request-response tail, Linux's
/// `tcp_process_tlp_ack` on its no-queue path): the probe's pure ACK at TLP.end_seq ends the
/// episode, so the next flight gets its own probe timeout and no reduction.
#[test]
fn rfc8985_7_4_2_a_pure_ack_at_the_probe_end_frees_the_next_flight() {
    let mut c = tlp_flight(plain_sack_cfg(), 3);
    let una = ISS + 1;
    c.on_timeout(t(12));
    assert_eq!(poll_all(&mut c, t(12)).len(), 1);
    c.on_segment(t(13), &ack_seg(PEER_ISS + 1, una + 4380, 65535), zb(&[]));
    c.on_segment(t(13), &ack_seg(PEER_ISS + 1, una + 4380, 65535), zb(&[]));
    assert_eq!(c.tlp, None, "the episode is over");
    // The next request.
    c.send(&zb(&vec![7u8; 1460 * 3])).unwrap();
    assert_eq!(poll_all(&mut c, t(20)).len(), 3);
    assert_eq!(
        c.timers.deadline(Timer::Pto),
        Some(t(30)),
        "the next flight is probed"
    );
}

/// RFC 8985 §7.4.2 (2): only a D-SACK on an ACK that covers TLP.end_seq says the probe was
/// needless. Here the first segment is lost and the SACKs of the other two were lost: the
/// probe (the last segment again) draws an ACK still at the hole, with a D-SACK for the
/// probe inside the SACK of the two. The probe found a real loss: recovery starts at once
/// (`tlp_on_sack`), and the next probe timeouts are not doubled.
#[test]
fn rfc8985_7_4_2_a_dsacked_probe_below_a_hole_found_a_loss() {
    let mut c = tlp_flight(plain_sack_cfg(), 3);
    let una = ISS + 1;
    c.on_timeout(t(12));
    assert_eq!(poll_all(&mut c, t(12)).len(), 1);
    let mut a = ack_seg(PEER_ISS + 1, una, 65535);
    a.options
        .sack_blocks
        .push(SeqNum(una + 2920), SeqNum(una + 4380));
    a.options
        .sack_blocks
        .push(SeqNum(una + 1460), SeqNum(una + 4380));
    c.on_segment(t(13), &a, zb(&[]));
    assert_eq!(c.counters.dsacks, 1);
    assert!(c.in_recovery(), "the hole below the probe is lost");
    assert_eq!(c.tlp_backoff, 0, "the probe was not needless");
}

/// Moves `rounds` windows of 64000 bytes through `c` without loss, one millisecond per round
/// trip, from `start`; returns the time after the last ACK.
fn transfer_clean(c: &mut Connection, rounds: u64, start: Instant) -> Instant {
    let chunk = zb(&vec![3u8; 64_000]);
    let mut now = start;
    let mut out = OutSegment::default();
    for _ in 0..rounds {
        assert_eq!(c.send(&chunk).unwrap(), 64_000);
        while c.snd_una != c.sndq.end() {
            while c.poll_burst_into(now, &mut out, 64) {}
            now += Duration::from_millis(1);
            let ack = ack_seg(PEER_ISS + 1, c.snd_max.0, 65535);
            c.on_segment(now, &ack, zb(&[]));
            assert_eq!(c.snd_una, c.snd_max);
        }
    }
    assert_eq!(c.counters.retransmits, 0);
    now
}

/// RFC 8985 §6.2 after 2 GiB: `last_recover` (RFC 6582 `recover`) is only written by
/// recoveries and RTOs, and `snd_una.ge(last_recover)` compares modulo 2^32. Once a clean
/// transfer has moved SND.UNA 2^31 bytes past it, the comparison turns false and stays
/// so for the next 2 GiB: RACK's reordering timer (and the probe's SACK, and DupThresh
/// itself) can no longer start a recovery, and every such loss waits for the RTO.
#[test]
fn rfc8985_6_2_the_reordering_timer_still_works_after_2_gib() {
    let mut c = sack_established(plain_sack_cfg());
    // 33 555 rounds of 64 000 bytes: just over 2^31 bytes.
    let now = transfer_clean(&mut c, (1u64 << 31) / 64_000 + 1, t(2));
    let una = c.snd_una.0;
    c.send(&zb(&vec![7u8; 1460 * 3])).unwrap();
    assert_eq!(poll_all(&mut c, now).len(), 3);
    let at = now + Duration::from_millis(1);
    // The second segment is lost; the first is acknowledged, the third SACKed.
    let sack = sack_ack(una + 1460, una + 2920, una + 4380);
    c.on_segment(at, &sack, zb(&[]));
    assert!(!c.in_recovery(), "one SACKed segment: under DupThresh");
    assert_eq!(
        c.poll_timeout(),
        Some(at + Duration::from_micros(250)),
        "RACK's reordering timer: min RTT / 4"
    );
}

/// RFC 8985 §7.2: no probe timeout in RTO recovery. After the RTO, the go-back-N
/// retransmissions are acknowledged one by one; until SND.UNA passes what was outstanding at
/// the timeout (`recover`, RFC 6582 §3.2 step 5) the connection is still in RTO recovery
/// (Linux: CA_Loss until snd_una passes high_seq), and the PTO must not be armed.
#[test]
fn rfc8985_7_2_no_probe_timeout_in_rto_recovery() {
    let cfg = TcpConfig {
        tlp: None,
        ..plain_sack_cfg()
    };
    let mut c = tlp_flight(cfg, 3);
    // Probes on again after the flight (no probe before the RTO: the case is RTO recovery).
    c.cfg = Arc::new(plain_sack_cfg());
    let una = ISS + 1;
    c.on_timeout(t(202));
    assert_eq!(c.counters.rtos, 1);
    let out = poll_all(&mut c, t(202));
    assert_eq!(data_seqs(&out, una), vec![0], "loss window: one segment");
    c.on_segment(t(203), &ack_seg(PEER_ISS + 1, una + 1460, 65535), zb(&[]));
    let out = poll_all(&mut c, t(203));
    assert_eq!(data_seqs(&out, una), vec![1460, 2920], "the rest, again");
    c.on_segment(t(204), &ack_seg(PEER_ISS + 1, una + 2920, 65535), zb(&[]));
    assert!(c.snd_una.lt(c.last_recover), "still in RTO recovery");
    assert_eq!(
        c.timers.deadline(Timer::Pto),
        None,
        "no PTO in RTO recovery"
    );
}

/// RFC 8985 §6.2 step 4 (`RACK_update_reo_wnd`): the reordering window grows by one quarter
/// of the minimum RTT per round trip that sees D-SACKs (`RACK.dsack_round`), not per D-SACK:
/// three duplicates reported within one round widen it once.
#[test]
fn rfc8985_6_2_the_reordering_window_grows_once_per_round_of_dsacks() {
    let mut c = tlp_flight(plain_sack_cfg(), 5);
    let una = ISS + 1;
    // The first three segments arrived twice (a duplicating path): three D-SACKs, one
    // round trip.
    for i in 1..=3 {
        let end = una + i * 1460;
        c.on_segment(t(3), &sack_ack(end, end - 1460, end), zb(&[]));
    }
    assert_eq!(c.counters.dsacks, 3);
    // The fourth segment is missing, the fifth SACKed: RACK's reordering timer.
    c.on_segment(t(3), &sack_ack(una + 4380, una + 5840, una + 7300), zb(&[]));
    assert!(!c.in_recovery());
    assert_eq!(
        c.timers.deadline(Timer::Pto),
        Some(t(3) + Duration::from_micros(500)),
        "two quarters of the minimum RTT"
    );
}

/// RFC 8985 §6.2 step 4: a widened reordering window persists for 16 recoveries, counted
/// "if exiting Fast or RTO recovery". An RTO recovery uses one up (here the last), and the
/// window is back to a quarter of the minimum RTT once it ends, not before.
#[test]
fn rfc8985_6_2_a_widened_window_persists_until_the_end_of_recoveries_rto_ones_too() {
    let cfg = TcpConfig {
        tlp: None,
        ..plain_sack_cfg()
    };
    let mut c = tlp_flight(cfg, 3);
    let una = ISS + 1;
    c.rack_on_dsack();
    c.reo_persist = 1;
    c.on_timeout(t(202));
    assert_eq!(c.counters.rtos, 1);
    assert_eq!(c.reo_mult, 2, "still widened during the recovery");
    poll_all(&mut c, t(202));
    c.on_segment(t(203), &ack_seg(PEER_ISS + 1, una + 1460, 65535), zb(&[]));
    poll_all(&mut c, t(203));
    assert_eq!(c.reo_mult, 2, "RTO recovery not over");
    c.on_segment(t(204), &ack_seg(PEER_ISS + 1, una + 4380, 65535), zb(&[]));
    assert_eq!(
        (c.reo_mult, c.reo_persist),
        (1, 0),
        "the RTO recovery ended"
    );
    // The next flight's hole waits one quarter of the minimum RTT again.
    c.send(&zb(&vec![7u8; 1460 * 3])).unwrap();
    assert_eq!(poll_all(&mut c, t(205)).len(), 3);
    let base = una + 4380;
    c.on_segment(
        t(206),
        &sack_ack(base + 1460, base + 2920, base + 4380),
        zb(&[]),
    );
    assert!(!c.in_recovery());
    let min = c.rtt.min_rtt().unwrap();
    assert_eq!(c.timers.deadline(Timer::Pto), Some(t(206) + min / 4));
}

/// The same for fast recovery: entering it leaves the widened window in place (the RFC
/// counts the recovery as it ends).
#[test]
fn rfc8985_6_2_fast_recovery_counts_against_the_persistence_as_it_ends() {
    let mut c = tlp_flight(plain_sack_cfg(), 5);
    let una = ISS + 1;
    c.rack_on_dsack();
    c.reo_persist = 1;
    // The first segment lost, the other four SACKed: DupThresh, fast recovery.
    c.on_segment(t(3), &sack_ack(una, una + 1460, una + 7300), zb(&[]));
    assert!(c.in_recovery());
    assert_eq!((c.reo_mult, c.reo_persist), (2, 1));
    poll_all(&mut c, t(3));
    c.on_segment(t(4), &ack_seg(PEER_ISS + 1, una + 7300, 65535), zb(&[]));
    assert!(!c.in_recovery());
    assert_eq!((c.reo_mult, c.reo_persist), (1, 0));
}

/// RFC 8985 §7.3 (Linux `tcp_send_loss_probe` finds no segment to send): a probe is sent
/// only while something is outstanding to a window that is open. The PTO fired, then the
/// ACK of everything (the FIN too) arrived before the connection was polled: nothing is
/// lost, no probe goes out, no episode opens.
#[test]
fn rfc8985_7_3_no_probe_once_everything_is_acknowledged() {
    let mut c = sack_established(plain_sack_cfg());
    let una = ISS + 1;
    c.send(&zb(&vec![7u8; 1460 * 3])).unwrap();
    c.close();
    let out = poll_all(&mut c, t(2));
    assert!(out.last().unwrap().repr.flags.fin());
    c.on_timeout(t(12));
    c.on_segment(t(12), &ack_seg(PEER_ISS + 1, una + 4381, 65535), zb(&[]));
    assert_eq!(c.state(), State::FinWait2);
    let out = poll_all(&mut c, t(12));
    assert!(out.is_empty(), "nothing to probe: {:?}", out[0].repr);
    assert_eq!((c.counters.tlp_probes, c.tlp), (0, None));
}

/// Likewise when the peer's window closed before the probe went out: a zero-window peer
/// is probed by the persist timer, not sent a loss probe it must drop.
#[test]
fn rfc8985_7_3_no_loss_probe_to_a_closed_window() {
    let mut c = tlp_flight(plain_sack_cfg(), 3);
    let una = ISS + 1;
    c.on_timeout(t(12));
    c.on_segment(t(12), &ack_seg(PEER_ISS + 1, una + 1460, 0), zb(&[]));
    let out = poll_all(&mut c, t(12));
    assert!(out.is_empty(), "no probe: {:?}", out[0].repr);
    assert_eq!(c.counters.tlp_probes, 0);
}
