//! Scripted loss-recovery checks on virtual time: which segment is lost is chosen exactly,
//! and the test measures when the loss is detected and when the repair is acknowledged.
//!
//! - RFC 6675: one loss in a window is repaired by SACK recovery within about one RTT, no RTO.
//! - RFC 6582: without SACK, NewReno repairs several losses of one window via partial ACKs.
//! - RFC 6298 §5: a tail loss (no later segment to trigger duplicate ACKs) is repaired by the
//!   retransmission timer at the latest (with tail loss probes, on by default, a lone last
//!   segment is probed 2 SRTT + 40 ms after the last ACK, before the RTO).
//! - RFC 8985 §7: a lost tail of several segments is repaired by a tail loss probe and the
//!   fast recovery its SACK starts, long before the RTO.
//! - RFC 8985 §6.2: a loss inside a short flight (fewer than DupThresh segments SACKed above
//!   it, nothing more to send) is repaired after RACK's reordering window, not the RTO.
//! - RFC 7323 §5: timestamps and PAWS work while both the sequence space and the timestamp
//!   clock wrap.
//! - RFC 9293 §3.8.6.1: zero-window probing against smoltcp with a reader that stops and
//!   resumes, in both directions.

mod common;

use common::{SmolHost, Sockets};
use luna_stack::tcp::config::CcAlgorithm;
use luna_stack::tcp::conn::{Connection, FourTuple, OutSegment, State};
use luna_stack::tcp::{DropReason, SeqNum, TcpConfig};
use luna_stack::testutil::{
    pattern, Dir, LinkConfig, LunaHost, Segment, Sim, SimLink, StreamCheck, IP_A, IP_B, MAC_A,
    MAC_B,
};
use luna_stack::time::{Duration, Instant};
use luna_stack::wire::{TcpFlags, Timestamps};
use std::cell::RefCell;
use std::net::SocketAddrV4;
use std::rc::Rc;
use zbuf::Zbuf;

/// One-way delay of the scripted link: RTT 2 ms, far below the 200 ms minimum RTO, so an
/// RTO would stand out.
const DELAY: Duration = Duration::from_millis(1);
const RTT: Duration = Duration::from_millis(2);

/// What the observer saw of the A→B data stream and B→A ACKs (sequence numbers relative to
/// A's ISN + 1).
#[derive(Debug, Default)]
struct Observed {
    isn: Option<SeqNum>,
    /// End of the highest data sent so far (relative).
    high: u32,
    /// Index of the next first-transmission data segment.
    new_index: usize,
    /// Dropped first transmissions: (relative seq, len).
    dropped: Vec<(u32, u32)>,
    /// Every A→B data segment: (time, relative seq, len, is retransmission).
    sends: Vec<(Instant, u32, u32, bool)>,
    /// Every B→A ACK: (time offered, relative ack).
    acks: Vec<(Instant, u32)>,
}

/// Which first transmissions to drop: (index among new data segments, relative seq, len).
type Plan = Box<dyn FnMut(usize, u32, u32) -> bool>;

fn observe(link: &mut SimLink, mut plan: Plan) -> Rc<RefCell<Observed>> {
    let obs = Rc::new(RefCell::new(Observed::default()));
    let o = obs.clone();
    link.set_drop_rule(Box::new(move |now, dir, frame, _| {
        let Some(seg) = Segment::parse(frame) else {
            return false;
        };
        let mut o = o.borrow_mut();
        match dir {
            Dir::AtoB => {
                if seg.tcp.flags.syn() {
                    o.isn = Some(seg.tcp.seq);
                    return false;
                }
                let (Some(isn), false) = (o.isn, seg.payload.is_empty()) else {
                    return false;
                };
                let rel = seg.tcp.seq - (isn + 1u32);
                let len = seg.payload.len() as u32;
                let is_new = rel >= o.high;
                o.sends.push((now, rel, len, !is_new));
                if is_new {
                    o.high = rel + len;
                    let idx = o.new_index;
                    o.new_index += 1;
                    if plan(idx, rel, len) {
                        o.dropped.push((rel, len));
                        return true;
                    }
                }
                false
            }
            Dir::BtoA => {
                if let (Some(isn), true) = (o.isn, seg.tcp.flags.ack()) {
                    if !seg.tcp.flags.syn() {
                        o.acks.push((now, seg.tcp.ack - (isn + 1u32)));
                    }
                }
                false
            }
        }
    }));
    obs
}

/// Two luna stacks on a clean 1 ms link; A sends `len` bytes to B under `plan`. Returns the
/// sim (for counters) and what was observed.
fn bulk_a_to_b(
    tcp: TcpConfig,
    len: usize,
    plan: Plan,
) -> (Sim<LunaHost, LunaHost>, Rc<RefCell<Observed>>) {
    let mut link = SimLink::new(LinkConfig::clean(DELAY), 1);
    let obs = observe(&mut link, plan);
    let mut sim = Sim::new(
        LunaHost::new(MAC_A, IP_A, tcp.clone(), 1),
        LunaHost::new(MAC_B, IP_B, tcp, 2),
        link,
    );
    run_bulk(&mut sim, len, Instant::from_millis(60_000));
    (sim, obs)
}

/// Time from the retransmission of the lost segment (loss detected: the sender acts at once)
/// to the arrival at the sender of the first ACK covering it.
fn repair_time(o: &Observed, lost: (u32, u32)) -> (Instant, Duration) {
    let (seq, len) = lost;
    let rexmit = o
        .sends
        .iter()
        .find(|s| s.3 && s.1 <= seq && seq < s.1 + s.2)
        .unwrap_or_else(|| panic!("segment {seq} was never retransmitted: {o:?}"))
        .0;
    let acked = o
        .acks
        .iter()
        .find(|a| a.0 >= rexmit && a.1 >= seq + len)
        .expect("an ACK covers the repair")
        .0
        + DELAY;
    (rexmit, acked - rexmit)
}

#[test]
fn rfc6675_single_loss_is_repaired_by_sack_recovery_within_one_rtt_without_rto() {
    let (sim, obs) = bulk_a_to_b(
        TcpConfig::default(),
        300_000,
        Box::new(|idx, _, _| idx == 40),
    );
    let o = obs.borrow();
    assert_eq!(o.dropped.len(), 1);
    let (detected, repair) = repair_time(&o, o.dropped[0]);
    let tcp = sim.a.stack.tcp_counters();
    assert_eq!(tcp.rtos, 0, "no RTO: {tcp:?}");
    assert_eq!(tcp.sack_recoveries, 1, "{tcp:?}");
    assert_eq!(
        tcp.retransmits, 1,
        "only the lost segment is resent: {tcp:?}"
    );
    // One RTT for the retransmission and its ACK, plus processing slack.
    assert!(
        repair <= RTT + RTT / 2,
        "repair took {repair:?} (detected at {detected:?}), RTT {RTT:?}"
    );
    eprintln!("SACK single loss: detected at {detected:?}, repaired in {repair:?} (RTT {RTT:?})");
}

#[test]
fn rfc6582_newreno_without_sack_repairs_multiple_losses_via_partial_acks() {
    let tcp = TcpConfig {
        sack: false,
        cc: CcAlgorithm::NewReno,
        ..TcpConfig::default()
    };
    let (sim, obs) = bulk_a_to_b(
        tcp,
        300_000,
        Box::new(|idx, _, _| [40, 43, 47].contains(&idx)),
    );
    let o = obs.borrow();
    assert_eq!(o.dropped.len(), 3);
    let c = sim.a.stack.tcp_counters();
    assert_eq!(
        c.rtos, 0,
        "partial ACKs, not the timer, repair the later holes: {c:?}"
    );
    assert_eq!(c.sack_recoveries, 0);
    assert_eq!(
        c.fast_retransmits, 1,
        "one recovery episode for one window: {c:?}"
    );
    assert_eq!(
        c.retransmits, 3,
        "exactly the three holes are resent: {c:?}"
    );
    // RFC 6582 §3.2 step 3: each partial ACK retransmits the next hole, one RTT apart.
    let (first, _) = repair_time(&o, o.dropped[0]);
    let (_, last_repair) = repair_time(&o, o.dropped[2]);
    let (last_rexmit, _) = repair_time(&o, o.dropped[2]);
    let total = (last_rexmit + last_repair) - first;
    assert!(
        total <= RTT * 3 + RTT / 2,
        "three holes took {total:?}, expected about three RTTs"
    );
    for &(seq, len) in &o.dropped[1..] {
        let (rexmit, _) = repair_time(&o, (seq, len));
        let partial = o
            .acks
            .iter()
            .any(|a| a.0 >= first && a.0 < rexmit && a.1 == seq);
        assert!(
            partial,
            "hole {seq} was resent after a partial ACK reached it"
        );
    }
}

#[test]
fn rfc6298_tail_loss_is_repaired_by_the_retransmission_timer() {
    const LEN: u32 = 100_000;
    let (sim, obs) = bulk_a_to_b(
        TcpConfig::default(),
        LEN as usize,
        Box::new(|_, seq, len| seq + len == LEN),
    );
    let o = obs.borrow();
    assert_eq!(o.dropped.len(), 1, "the last segment was dropped");
    let lost = o.dropped[0];
    let first_send = o
        .sends
        .iter()
        .find(|s| !s.3 && s.1 == lost.0)
        .expect("first transmission")
        .0;
    let (rexmit, repair) = repair_time(&o, lost);
    let c = sim.a.stack.tcp_counters();
    assert!(c.rtos <= 1, "{c:?}");
    assert!(repair <= RTT + RTT / 2);
    // "RTO or better": resent no later than one RTO (200 ms floor) after it was first sent.
    let waited = rexmit - first_send;
    assert!(
        waited <= Duration::from_millis(200) + RTT * 2,
        "tail loss waited {waited:?}"
    );
    eprintln!(
        "tail loss: resent {waited:?} after the first transmission, RTOs {}",
        c.rtos
    );
}

/// RFC 8985 §7 (probes on, the default): the last two segments of a three-segment flight
/// are lost (a burst loss at a queue: no later segment draws a duplicate ACK). The probe
/// goes out one probe timeout after the flight (max(2 SRTT, 10 ms) here), its SACK starts
/// fast recovery, and both holes are repaired some 15 ms after the first transmission,
/// with no RTO. With probes off the same loss waits for the 200 ms RTO.
#[test]
fn rfc8985_7_a_lost_tail_is_probed_not_timed_out() {
    const LEN: u32 = 4000; // three segments
    let drop_tail: fn() -> Plan = || Box::new(|index, _, _| index >= 1);
    let on = TcpConfig::default();
    assert_eq!(
        on.tlp,
        Some(TcpConfig::TLP_FLOOR),
        "tail loss probes are on by default"
    );
    let (sim, obs) = bulk_a_to_b(on, LEN as usize, drop_tail());
    let o = obs.borrow();
    assert_eq!(
        o.dropped.len(),
        2,
        "the last two segments were dropped: {o:?}"
    );
    let first_send = o.sends.iter().find(|s| !s.3).expect("first transmission").0;
    let c = sim.a.stack.tcp_counters();
    assert_eq!(c.rtos, 0, "{c:?}");
    assert_eq!(c.tlp_probes, 1, "{c:?}");
    for &lost in &o.dropped {
        let (rexmit, _) = repair_time(&o, lost);
        let waited = rexmit - first_send;
        assert!(
            waited <= Duration::from_millis(10) + RTT * 4,
            "segment {lost:?} resent {waited:?} after the flight"
        );
    }
    let (_, last) = repair_time(&o, o.dropped[1]);
    eprintln!("tail of two lost: repaired with one probe, last repair ACKed {last:?} after its resend: {c:?}");
    drop(o);

    let off = TcpConfig {
        tlp: None,
        ..TcpConfig::default()
    };
    let (sim, obs) = bulk_a_to_b(off, LEN as usize, drop_tail());
    let o = obs.borrow();
    let c = sim.a.stack.tcp_counters();
    assert_eq!((c.rtos, c.tlp_probes), (1, 0), "{c:?}");
    let first_send = o.sends.iter().find(|s| !s.3).expect("first transmission").0;
    let (rexmit, _) = repair_time(&o, o.dropped[0]);
    assert!(
        rexmit - first_send >= Duration::from_millis(200),
        "the RTO's floor"
    );
}

/// RFC 8985 §6.2: one segment lost inside a three-segment flight (an RPC message), the
/// others SACKed: two SACKed segments, under DupThresh, and nothing more to send to draw a
/// third. RACK's reordering timer marks the hole lost a quarter of the minimum RTT after
/// the SACK and fast recovery repairs it within a few RTTs; with RACK off it waits for the
/// 200 ms RTO.
#[test]
fn rfc8985_6_2_a_loss_in_a_short_flight_is_repaired_without_an_rto() {
    const LEN: u32 = 4000; // three segments
    for first in [true, false] {
        let plan: Plan = if first {
            Box::new(|index, _, _| index == 0)
        } else {
            Box::new(|index, _, _| index == 1)
        };
        let (sim, obs) = bulk_a_to_b(TcpConfig::default(), LEN as usize, plan);
        let o = obs.borrow();
        assert_eq!(o.dropped.len(), 1, "{o:?}");
        let first_send = o.sends.iter().find(|s| !s.3).expect("first transmission").0;
        let c = sim.a.stack.tcp_counters();
        assert_eq!((c.rtos, c.rack_recoveries), (0, 1), "{c:?}");
        let (rexmit, _) = repair_time(&o, o.dropped[0]);
        let waited = rexmit - first_send;
        assert!(
            waited <= RTT * 3,
            "lost first={first}: resent after {waited:?}"
        );
        eprintln!("short flight, lost first={first}: resent {waited:?} after the flight");
    }
    let off = TcpConfig {
        rack: false,
        ..TcpConfig::default()
    };
    let (sim, obs) = bulk_a_to_b(off, LEN as usize, Box::new(|index, _, _| index == 0));
    let o = obs.borrow();
    let c = sim.a.stack.tcp_counters();
    assert_eq!(c.rtos, 1, "{c:?}");
    let first_send = o.sends.iter().find(|s| !s.3).expect("first transmission").0;
    let (rexmit, _) = repair_time(&o, o.dropped[0]);
    assert!(rexmit - first_send >= Duration::from_millis(200));
}

// ------------------------------------------------------------------------------------------
// RFC 7323: timestamps and PAWS across sequence and timestamp wrap
// ------------------------------------------------------------------------------------------

fn tuple(a: bool) -> FourTuple {
    let (x, y) = (SocketAddrV4::new(IP_A, 40000), SocketAddrV4::new(IP_B, 80));
    if a {
        FourTuple {
            local: x,
            remote: y,
        }
    } else {
        FourTuple {
            local: y,
            remote: x,
        }
    }
}

fn deliver(to: &mut Connection, now: Instant, seg: &OutSegment) {
    to.on_segment(now, &seg.repr, Zbuf::from_vec(seg.payload.to_vec()));
}

/// RFC 7323 §5.3 (PAWS) with both the sequence space and the timestamp clock wrapping during
/// the transfer: every segment is accepted across the wraps, and an old duplicate whose
/// sequence number lands in the current window (as after a 4 GiB wrap) is dropped because
/// its timestamp is older, even though the timestamps compared wrap as well.
#[test]
fn rfc7323_5_paws_and_timestamps_work_across_sequence_and_timestamp_wrap() {
    let cfg = TcpConfig::default();
    let iss_a = SeqNum(u32::MAX - 40_000);
    let iss_b = SeqNum(u32::MAX - 10);
    // Timestamp clocks 1 ms per tick, 5 ticks before wrapping.
    let mut a = Connection::connect(Instant::ZERO, tuple(true), cfg.clone(), iss_a, u32::MAX - 5);
    let syn = a.poll_segment(Instant::ZERO).unwrap();
    let info = luna_stack::tcp::conn::SynInfo {
        seq: syn.repr.seq,
        window: syn.repr.window,
        options: syn.repr.options,
    };
    let mut b =
        Connection::accept_syn(Instant::ZERO, tuple(false), cfg, iss_b, u32::MAX - 3, &info);
    let mut now = Instant::ZERO;
    let len = 200_000usize;
    let data = pattern(3, 0, len);
    let mut sent = 0;
    let mut check = StreamCheck::new(3);
    let mut early: Option<OutSegment> = None;
    let mut steps = 0;
    while check.received < len as u64 {
        steps += 1;
        assert!(steps < 100_000, "no progress");
        if a.state() == State::Established && sent < len {
            sent += a.send(&Zbuf::copy_from_slice(&data[sent..])).unwrap_or(0);
        }
        while let Some(s) = a.poll_segment(now) {
            if early.is_none() && !s.payload.is_empty() {
                early = Some(s.clone());
            }
            deliver(&mut b, now, &s);
        }
        while let Some(s) = b.poll_segment(now) {
            deliver(&mut a, now, &s);
        }
        while let Ok(Some(z)) = b.recv() {
            check.feed(&z).unwrap();
        }
        now += Duration::from_micros(250);
        for c in [&mut a, &mut b] {
            if c.poll_timeout().is_some_and(|t| t <= now) {
                c.on_timeout(now);
            }
        }
    }
    // Both wrapped: A's sequence numbers passed 2^32, and so did both timestamp clocks.
    let a_next = iss_a + 1u32 + len as u32;
    assert!(a_next.0 < iss_a.0, "the sequence space wrapped");
    let early = early.expect("a data segment");
    let old_ts = early.repr.options.timestamps.unwrap().tsval;
    assert!(
        old_ts >= u32::MAX - 5,
        "sent before the timestamp clock wrapped: {old_ts}"
    );
    assert_eq!(a.counters.rtos + b.counters.rtos, 0);
    assert_eq!(
        b.counters.drops(DropReason::Paws),
        0,
        "no false PAWS drops across the wrap"
    );

    // An old duplicate from "the previous wrap": its sequence number lies at RCV.NXT, its
    // timestamp is from before the timestamp clock wrapped, its bytes are garbage.
    let mut dup = early.clone();
    dup.repr.seq = a_next;
    dup.repr.ack = iss_b + 1u32;
    dup.repr.options.timestamps = Some(Timestamps {
        tsval: old_ts,
        tsecr: 0,
    });
    let garbage = vec![0xEEu8; early.payload.len()];
    b.on_segment(now, &dup.repr, Zbuf::copy_from_slice(&garbage));
    assert_eq!(b.counters.drops(DropReason::Paws), 1, "RFC 7323 §5.3 R1");
    assert_eq!(b.recv_available(), 0, "the old duplicate was not delivered");
    let reply = b.poll_segment(now).expect("PAWS drop is acknowledged");
    assert!(reply.repr.flags.contains(TcpFlags::ACK));
    assert_eq!(reply.repr.ack, a_next);
    // The live stream continues after it, byte-exact.
    let more = pattern(3, len as u64, 5000);
    a.send(&Zbuf::copy_from_slice(&more)).unwrap();
    now += Duration::from_millis(1);
    while let Some(s) = a.poll_segment(now) {
        deliver(&mut b, now, &s);
    }
    while let Ok(Some(z)) = b.recv() {
        check.feed(&z).unwrap();
    }
    assert_eq!(check.received, len as u64 + 5000);
}

// ------------------------------------------------------------------------------------------
// RFC 9293 §3.8.6.1: zero-window probing against smoltcp
// ------------------------------------------------------------------------------------------

/// `luna_sends`: luna (A) writes into smoltcp (B) whose reader pauses; else the reverse.
fn zero_window_with_pausing_reader(luna_sends: bool) {
    const LEN: usize = 400_000;
    const PAUSE: (u64, u64) = (5, 8_000); // reader stops at 5 ms, resumes at 8 s
    let tcp = TcpConfig {
        rcv_buf: 32 * 1024,
        ..TcpConfig::default()
    };
    let mut link = SimLink::new(LinkConfig::clean(DELAY), 1);
    // Count zero windows advertised by the receiver.
    let zero_wnds = Rc::new(RefCell::new(0u32));
    let z = zero_wnds.clone();
    let rcv_dir = if luna_sends { Dir::BtoA } else { Dir::AtoB };
    link.set_drop_rule(Box::new(move |_, dir, frame, _| {
        if dir == rcv_dir {
            if let Some(s) = Segment::parse(frame) {
                if s.tcp.window == 0 && !s.tcp.flags.rst() {
                    *z.borrow_mut() += 1;
                }
            }
        }
        false
    }));
    let mut sim = Sim::new(
        LunaHost::new(MAC_A, IP_A, tcp, 1),
        SmolHost::new(MAC_B.0, IP_B.octets(), 2),
        link,
    );
    let (luna_h, smol_h);
    if luna_sends {
        smol_h = sim.b.listen(80, 32 * 1024, true);
        luna_h = sim
            .a
            .stack
            .connect(sim.now, SocketAddrV4::new(IP_B, 80), None)
            .unwrap();
    } else {
        let l = sim.a.stack.listen(80, 4).unwrap();
        smol_h = sim.b.connect(IP_A.octets(), 80, 50000, 32 * 1024, true);
        let mut h = None;
        while h.is_none() {
            assert!(sim.step());
            while sim.a.stack.poll_event().is_some() {}
            h = sim.a.stack.accept(l);
        }
        luna_h = h.unwrap();
    }
    let data = pattern(7, 0, LEN);
    let mut sent = 0;
    let mut check = StreamCheck::new(7);
    let pause = Instant::from_millis(PAUSE.0)..Instant::from_millis(PAUSE.1);
    let mut probes_during_pause = 0;
    while check.received < LEN as u64 {
        let take = if luna_sends {
            sim.a.send(luna_h, &data[sent..(sent + 65536).min(LEN)])
        } else {
            sim.b.send(smol_h, &data[sent..(sent + 65536).min(LEN)])
        }
        .unwrap();
        sent += take;
        if !pause.contains(&sim.now) {
            let r = if luna_sends {
                sim.b.read(smol_h, &mut |d| check.feed(d))
            } else {
                sim.a.read(luna_h, &mut |d| check.feed(d))
            };
            r.unwrap();
        } else {
            probes_during_pause = sim.a.stack.tcp_counters().window_probes;
        }
        while sim.a.stack.poll_event().is_some() {}
        assert!(
            sim.now < Instant::from_millis(60_000) && sim.step(),
            "stalled at {:?}: {} of {LEN}\n{}",
            sim.now,
            check.received,
            sim.link.trace_dump()
        );
    }
    assert!(
        *zero_wnds.borrow() > 0,
        "the receiver advertised a zero window"
    );
    let c = sim.a.stack.tcp_counters();
    if luna_sends {
        // Probes back off exponentially from the RTO (~200 ms): several fit in 8 s, and the
        // connection survived all of them.
        assert!(
            probes_during_pause >= 3,
            "window probes {probes_during_pause}: {c:?}"
        );
        assert!(
            probes_during_pause <= 16,
            "probes back off: {probes_during_pause}"
        );
    }
    assert!(sim.a.stack.close_reason(luna_h).is_none(), "still open");
    eprintln!(
        "zero window (luna sends: {luna_sends}): {} zero-window ACKs, luna probes {}",
        zero_wnds.borrow(),
        c.window_probes
    );
}

#[test]
fn rfc9293_3_8_6_1_luna_probes_smoltcp_zero_window_until_reader_resumes() {
    zero_window_with_pausing_reader(true);
}

#[test]
fn rfc9293_3_8_6_1_smoltcp_probes_luna_zero_window_until_reader_resumes() {
    zero_window_with_pausing_reader(false);
}

// ------------------------------------------------------------------------------------------
// Lost retransmissions and small windows under the kernel-interop impairment
// ------------------------------------------------------------------------------------------

/// RFC 8985 §6.2: segment 40 is lost, and so is its fast retransmission. The data sent after
/// the retransmission is SACKed, which shows the retransmission lost: it is sent again within
/// the same recovery, without waiting for the RTO (RFC 6675 alone cannot see it).
#[test]
fn rfc8985_6_2_lost_fast_retransmission_is_repaired_without_rto() {
    let mut link = SimLink::new(LinkConfig::clean(DELAY), 1);
    let sends = Rc::new(RefCell::new(Vec::<Instant>::new()));
    let sn = sends.clone();
    let (mut isn, mut high, mut new_segs, mut lost) = (None, 0u32, 0, None);
    link.set_drop_rule(Box::new(move |now, dir, frame, _| {
        let Some(seg) = Segment::parse(frame) else {
            return false;
        };
        if dir != Dir::AtoB {
            return false;
        }
        if seg.tcp.flags.syn() {
            isn = Some(seg.tcp.seq + 1u32);
            return false;
        }
        let (Some(isn), false) = (isn, seg.payload.is_empty()) else {
            return false;
        };
        let rel = seg.tcp.seq - isn;
        if rel >= high {
            high = rel + seg.payload.len() as u32;
            new_segs += 1;
            if new_segs == 41 {
                lost = Some(rel);
            }
        }
        if Some(rel) != lost {
            return false;
        }
        // The first transmission and the first retransmission are lost.
        let mut sn = sn.borrow_mut();
        sn.push(now);
        sn.len() <= 2
    }));
    let len = 300_000usize;
    let tcp = TcpConfig::default();
    let mut sim = Sim::new(
        LunaHost::new(MAC_A, IP_A, tcp.clone(), 1),
        LunaHost::new(MAC_B, IP_B, tcp, 2),
        link,
    );
    let check = run_bulk(&mut sim, len, Instant::from_millis(60_000));
    assert_eq!(check, len as u64);
    let c = sim.a.stack.tcp_counters();
    let sends = sends.borrow();
    assert_eq!(sends.len(), 3, "sent three times: {sends:?}");
    assert_eq!(c.rtos, 0, "no RTO: {c:?}");
    assert_eq!(c.sack_recoveries, 1, "one recovery repaired both: {c:?}");
    // Both repairs within a few RTTs of the first transmission, far below the 200 ms RTO.
    let took = sends[2] - sends[0];
    assert!(took <= RTT * 4, "second repair after {took:?}");
    eprintln!("lost retransmission repaired {took:?} after the first transmission: {c:?}");
}

/// A luna → luna bulk transfer of `len` bytes on `sim` (A sends); returns the bytes checked.
fn run_bulk(sim: &mut Sim<LunaHost, LunaHost>, len: usize, limit: Instant) -> u64 {
    let l = sim.b.stack.listen(80, 4).unwrap();
    let c = sim
        .a
        .stack
        .connect(sim.now, SocketAddrV4::new(IP_B, 80), None)
        .unwrap();
    let data = pattern(1, 0, len);
    let mut sent = 0;
    let mut server = None;
    let mut check = StreamCheck::new(1);
    while check.received < len as u64 {
        if sent < len {
            let end = (sent + (1 << 20)).min(len);
            if let Ok(n) = sim
                .a
                .stack
                .send(c, &Zbuf::copy_from_slice(&data[sent..end]))
            {
                sent += n;
            }
        }
        while sim.b.stack.poll_event().is_some() {}
        while sim.a.stack.poll_event().is_some() {}
        if server.is_none() {
            server = sim.b.stack.accept(l);
        }
        if let Some(s) = server {
            while let Ok(Some(z)) = sim.b.stack.recv(s) {
                check.feed(&z).unwrap();
            }
        }
        assert!(
            sim.now < limit && sim.step(),
            "transfer stalled at {:?}: {} of {len} bytes\n{}",
            sim.now,
            check.received,
            sim.link.trace_dump()
        );
    }
    check.received
}

/// The kernel-interop impairment (docs/interop.md), both ways: loss 2%, duplication 1%,
/// reordering 25% (held back up to 2 ms) on a 1 ms one-way delay.
fn interop_impairment() -> LinkConfig {
    LinkConfig {
        delay: DELAY,
        loss_ppm: 20_000,
        dup_ppm: 10_000,
        reorder_ppm: 250_000,
        reorder_delay: Duration::from_millis(2),
        ..LinkConfig::default()
    }
}

/// RFC 3708 §3 / RFC 4653 idea: with reordering but no loss (25% of frames held back up to
/// 2 ms on a 1 ms link, nothing lost or duplicated), every fast retransmit is spurious. Its
/// retransmission is D-SACKed, the reduction is undone and DupThresh adapts, so the
/// transfer completes byte-exact without an RTO and with recoveries undone.
#[test]
fn rfc3708_pure_reordering_recoveries_are_undone() {
    const LEN: usize = 2 << 20;
    let link = LinkConfig {
        delay: DELAY,
        reorder_ppm: 250_000,
        reorder_delay: Duration::from_millis(2),
        ..LinkConfig::default()
    };
    for seed in [1u64, 2] {
        let tcp = TcpConfig::default();
        let mut sim = Sim::new(
            LunaHost::new(MAC_A, IP_A, tcp.clone(), 1),
            LunaHost::new(MAC_B, IP_B, tcp, 2),
            SimLink::new(link, seed),
        );
        let got = run_bulk(&mut sim, LEN, Instant::from_millis(600_000));
        assert_eq!(got, LEN as u64);
        let c = sim.a.stack.tcp_counters();
        let l = sim.link.stats();
        eprintln!(
            "pure reordering seed {seed}: {:.3} s simulated, SACK recoveries {}, undone {}, \
             D-SACKs {}, retransmits {}, RTOs {}; link reordered {} lost {}",
            sim.now.as_nanos() as f64 / 1e9,
            c.sack_recoveries,
            c.spurious_recoveries,
            c.dsacks,
            c.retransmits,
            c.rtos,
            l.reordered[0],
            l.lost[0]
        );
        assert_eq!(l.lost[0] + l.lost[1], 0, "the link loses nothing");
        assert!(
            c.sack_recoveries > 0,
            "reordering triggers fast retransmits"
        );
        assert!(c.spurious_recoveries > 0, "and they are undone: {c:?}");
        assert!(c.spurious_recoveries <= c.sack_recoveries);
        assert_eq!(c.rtos, 0, "{c:?}");
    }
}

/// Measurement (luna sends to luna under the interop impairment): RTOs, retransmissions and
/// simulated completion time of a 2 MiB bulk for three seeds, printed. In the kernel run most
/// of luna's send time was RTOs (1,802 in 1 GiB); here they were windows of a few segments
/// whose single loss could not collect DupThresh SACKs (RFC 6675 §5 (2) limited transmit now
/// sends on) and lost retransmissions (RFC 8985 §6.2). Asserted: byte-exact delivery and at
/// most one RTO per run on average (before both fixes: 17-20 per 4 MiB run).
#[test]
fn impaired_bulk_is_repaired_by_sack_recovery_not_by_rtos() {
    // LUNA_IMPAIRED_SEEDS=8 LUNA_IMPAIRED_MIB=4 reproduces the docs' 8 x 4 MiB measurement.
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let seeds: Vec<u64> = match env("LUNA_IMPAIRED_SEEDS") {
        Some(n) => (0..n.clamp(1, 64)).map(|i| 2 * i + 1).collect(),
        None => vec![1, 2, 4],
    };
    let mib = env("LUNA_IMPAIRED_MIB").unwrap_or(2).clamp(1, 64) as usize;
    let len = mib << 20;
    let mut rtos = 0;
    let mut total = (0.0, 0, 0, 0);
    for &seed in &seeds {
        let tcp = TcpConfig::default();
        let mut sim = Sim::new(
            LunaHost::new(MAC_A, IP_A, tcp.clone(), 1),
            LunaHost::new(MAC_B, IP_B, tcp, 2),
            SimLink::new(interop_impairment(), seed),
        );
        let got = run_bulk(&mut sim, len, Instant::from_millis(600_000));
        assert_eq!(got, len as u64);
        let c = sim.a.stack.tcp_counters();
        let l = sim.link.stats();
        let secs = sim.now.as_nanos() as f64 / 1e9;
        eprintln!(
            "impaired bulk seed {seed}: {secs:.3} s simulated ({:.1} Mbit/s), RTOs {}, \
             retransmits {}, SACK recoveries {}, undone {}, D-SACKs {}; link A->B lost {} \
             reordered {} duplicated {}",
            len as f64 * 8.0 / secs / 1e6,
            c.rtos,
            c.retransmits,
            c.sack_recoveries,
            c.spurious_recoveries,
            c.dsacks,
            l.lost[0],
            l.reordered[0],
            l.duplicated[0]
        );
        rtos += c.rtos;
        total.0 += secs;
        total.1 += c.sack_recoveries;
        total.2 += c.spurious_recoveries;
        total.3 += c.retransmits;
    }
    eprintln!(
        "impaired bulk total ({} x {mib} MiB): {:.2} s simulated, RTOs {rtos}, SACK recoveries \
         {}, undone {}, retransmits {}",
        seeds.len(),
        total.0,
        total.1,
        total.2,
        total.3
    );
    assert!(
        rtos <= seeds.len() as u64,
        "RTOs in {} impaired runs: {rtos}",
        seeds.len()
    );
}
