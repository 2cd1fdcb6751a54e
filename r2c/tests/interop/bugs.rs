//! luna-stack defects the kernel interop runs exposed, pinned as regression tests on
//! `luna_stack::tcp::conn::Connection` (sans-IO, no DPDK). Both are fixed; each test asserts
//! the correct behaviour and is named after the bug it pins.

use std::net::{Ipv4Addr, SocketAddrV4};

use luna_stack::tcp::{Connection, DropReason, FourTuple, RecvError, SeqNum, State, TcpConfig};
use luna_stack::time::Instant;
use luna_stack::wire::{TcpFlags, TcpOptions, TcpRepr};
use zbuf::Zbuf;

const ISS: u32 = 1000;
const PEER_ISS: u32 = 5000;
const MSS: usize = 1448;

fn tuple() -> FourTuple {
    FourTuple {
        local: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 61440),
        remote: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 7102),
    }
}

fn seg(flags: TcpFlags, seq: u32, options: TcpOptions) -> TcpRepr {
    TcpRepr {
        src_port: 7102,
        dst_port: 61440,
        seq: SeqNum(seq),
        ack: SeqNum(ISS + 1),
        flags,
        window: 65535,
        urgent: 0,
        options,
    }
}

/// An active open completed against a peer offering SACK and window scaling (no
/// timestamps: they play no part here and would have to be in every segment).
fn established(cfg: TcpConfig) -> Connection {
    let now = Instant::ZERO;
    let mut c = Connection::connect(now, tuple(), cfg, SeqNum(ISS), 0);
    assert!(c.poll_segment(now).is_some_and(|s| s.repr.flags.syn()));
    let opts = TcpOptions {
        mss: Some(1460),
        window_scale: Some(7),
        sack_permitted: true,
        ..TcpOptions::default()
    };
    c.on_segment(
        now,
        &seg(TcpFlags::SYN | TcpFlags::ACK, PEER_ISS, opts),
        Zbuf::from_static(b""),
    );
    assert_eq!(c.state(), State::Established);
    while c.poll_segment(now).is_some() {}
    c
}

fn data(i: usize) -> (TcpRepr, Zbuf) {
    let seq = PEER_ISS + 1 + (i * MSS) as u32;
    let bytes: Vec<u8> = (0..MSS).map(|j| (i * 7 + j) as u8).collect();
    (
        seg(TcpFlags::ACK, seq, TcpOptions::default()),
        Zbuf::copy_from_slice(&bytes),
    )
}

/// Seen in `bulk-kernel-client` under 2% loss / 25% reordering: luna advertises a 1 MiB
/// window (`rcv_buf`, ~724 full segments) but holds at most `max_ooo_segments` (256)
/// out-of-order segments, so after one loss the kernel's in-window flight beyond the
/// hole is dropped (`ooo_full`: 3,419 drops in 32 MiB) or evicted after being SACKed
/// (reneging, RFC 2018 §8: "discouraged, but may be used if the receiver runs out of
/// buffer space" — here the buffer has room, only the segment count runs out). The
/// kernel then retransmitted a third of all segments (7,735 of ~23,200) and took 16 RTOs.
/// RFC 9293 §3.10.7.4: in-window segments "SHOULD be held" for later processing.
#[test]
fn bug_ooo_queue_holds_less_than_the_advertised_window() {
    let cfg = TcpConfig::default();
    let mut c = established(cfg.clone());
    let now = Instant::from_millis(1);
    // Segment 0 is lost; 400 segments (579,200 bytes, well inside the window) follow.
    let n = 400;
    assert!(n * MSS < cfg.rcv_buf as usize);
    for i in 1..=n {
        let (s, p) = data(i);
        c.on_segment(now, &s, p);
        while c.poll_segment(now).is_some() {}
    }
    let ooo_full = c.counters.drops(DropReason::OooFull);
    // The retransmission of segment 0 fills the hole: every byte is readable in order.
    let (s, p) = data(0);
    c.on_segment(now, &s, p);
    let mut got = 0;
    loop {
        match c.recv() {
            Ok(Some(z)) => got += z.len(),
            Ok(None) | Err(RecvError::Finished) => break,
            Err(e) => panic!("recv: {e:?}"),
        }
    }
    assert_eq!(
        (ooo_full, got),
        (0, (n + 1) * MSS),
        "in-window out-of-order segments dropped (ooo_full), bytes readable after the hole filled"
    );
}

/// Control: the same sequence inside the out-of-order limit delivers everything, so the
/// failure above is the limit and not the test's segments.
#[test]
fn control_ooo_within_the_segment_limit_is_all_delivered() {
    let mut c = established(TcpConfig::default());
    let now = Instant::from_millis(1);
    let n = 200;
    for i in 1..=n {
        let (s, p) = data(i);
        c.on_segment(now, &s, p);
        while c.poll_segment(now).is_some() {}
    }
    assert_eq!(c.counters.drops(DropReason::OooFull), 0);
    let (s, p) = data(0);
    c.on_segment(now, &s, p);
    let mut got = 0;
    while let Ok(Some(z)) = c.recv() {
        got += z.len();
    }
    assert_eq!(got, (n + 1) * MSS);
}

/// Luna as a sender with `n` full segments in flight (no timestamps: the peer did not
/// offer them, so PAWS plays no part).
fn sending(n: usize) -> Connection {
    let mut c = established(TcpConfig::default());
    let now = Instant::from_millis(1);
    let sent = c.send(&Zbuf::copy_from_slice(&vec![7u8; n * MSS])).unwrap();
    assert_eq!(sent, n * MSS);
    let mut segs = 0;
    while let Some(s) = c.poll_segment(now) {
        segs += usize::from(!s.payload.is_empty());
    }
    assert_eq!(segs, n, "IW10 sends them all");
    c
}

/// An ACK from the peer: cumulative `ack` (offset into luna's stream) and SACK blocks.
fn ack(ack: usize, blocks: &[(usize, usize)]) -> TcpRepr {
    let at = |o: usize| SeqNum(ISS + 1 + o as u32);
    let b: Vec<(SeqNum, SeqNum)> = blocks.iter().map(|&(l, r)| (at(l), at(r))).collect();
    let opts = TcpOptions {
        sack_blocks: luna_stack::wire::SackBlocks::from_slice(&b).expect("≤ 4 blocks"),
        ..TcpOptions::default()
    };
    TcpRepr {
        ack: at(ack),
        ..seg(TcpFlags::ACK, PEER_ISS + 1, opts)
    }
}

/// Seen in every impaired phase where luna sends: luna counted 40,623 D-SACKs in
/// `bulk-luna-client` (full run) where the kernel sent 21,374 (`TcpExtTCPDSACKOldSent` +
/// `TcpExtTCPDSACKOfoSent`), and 77,067 vs 10,468 in `rpc-luna-client`. Cause: the
/// scoreboard (`Scoreboard::is_dsack`) compares the first SACK block with the *current*
/// SND.UNA, not with the cumulative ACK of the segment that carries it. A reordered older
/// ACK's ordinary SACK block, now below SND.UNA, is taken for a D-SACK. RFC 2883 §4: the
/// first block is a D-SACK when the cumulative acknowledgement field of that same ACK
/// covers it, or when it lies within its second block (Linux's `tcp_check_dsack` compares
/// with the ACK's own `ack_seq` too). Today only the `dsacks` counter is wrong;
/// any future use of D-SACK (spurious retransmission undo, RFC 3708; reordering
/// detection, RFC 4015) would act on phantom duplicates.
#[test]
fn bug_sack_block_of_a_reordered_ack_is_counted_as_dsack() {
    let mut c = sending(4);
    let now = Instant::from_millis(2);
    // Segment 0 is lost: the peer ACKs 0 with segment 1 SACKed; then segment 0's
    // retransmission arrives and the peer ACKs through segment 1. The network delivers
    // the second ACK first.
    let old = ack(0, &[(MSS, 2 * MSS)]);
    let new = ack(2 * MSS, &[]);
    c.on_segment(now, &new, Zbuf::from_static(b""));
    c.on_segment(now, &old, Zbuf::from_static(b""));
    assert_eq!(
        c.counters.dsacks, 0,
        "no duplicate was ever received by the peer"
    );
}

/// Control: a real D-SACK (first block below the same ACK's cumulative ACK) is counted.
#[test]
fn control_a_real_dsack_is_counted() {
    let mut c = sending(4);
    let now = Instant::from_millis(2);
    c.on_segment(now, &ack(2 * MSS, &[]), Zbuf::from_static(b""));
    c.on_segment(now, &ack(2 * MSS, &[(0, MSS)]), Zbuf::from_static(b""));
    assert_eq!(c.counters.dsacks, 1);
}
