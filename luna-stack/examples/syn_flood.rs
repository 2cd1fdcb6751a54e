//! Per-segment cost of the attack suite's hostile traffic in luna-stack, for instruction
//! counting (docs/reliability.md, "Where the flood's cost goes"). A luna server listens on
//! port 7700 (SYN cookies `WhenFull`, as the tap attack server runs) and gets `n` frames of
//! one kind, built before the measured part; nothing is timed. Only [`stack_work`] (the
//! stack's receive, the application's reads and every frame the stack sends, dropped) is
//! meant to be counted:
//!
//! `valgrind --tool=callgrind --toggle-collect='syn_flood::stack_work' \
//!     target/release/examples/syn_flood <kind> <n>`
//!
//! and per segment = (Ir(2N) − Ir(N)) / N, which cancels setup and, for `syn`, the backlog's
//! first SYNs that are tabled as half-open connections before the cookies engage.
//! `luna-stack/benches/syn-flood-instructions.sh` runs every kind that way.
//!
//! Kinds:
//! * `syn`: SYNs from spoofed sources in the subnet, random ports and ISNs, options as
//!   Linux sends them (MSS, SACK-permitted, timestamps, window scale), as attack.py's
//!   `synflood` phase. The backlog (16) is full after the first 16: SYN cookies, one
//!   cookie SYN-ACK sent per SYN.
//! * `syn_nocookie`: the same SYNs with cookies `Off`: dropped as `backlog_full`; the
//!   cost of parsing and finding the listener alone.
//! * `stray_ack`: ACKs from random tuples to the listener port (rst_ack_storm's second
//!   half): cookie validation fails, the RST limiter answers or drops.
//! * `oow_rst`: RST+ACKs on an established connection with out-of-window sequence numbers
//!   (rst_ack_storm's first half): dropped, challenge-ACK limited.
//! * `data`: in-order data segments (`payload` bytes, default 1448) with timestamps on an
//!   established connection, read by the application and acknowledged: the established
//!   fast path the legitimate client uses, for comparison.
//!
//! Each run prints the server's counters so a profile can check what the stack did.

use luna_stack::stack::{Event, SocketHandle, Stack, StackDrop, SynCookieMode};
use luna_stack::testutil::{build_tcp_frame, parse_tcp_frame, stack_config, FakeRng};
use luna_stack::time::{Duration, Instant};
use luna_stack::wire::{
    EthernetAddress, Ipv4Addr, SackBlocks, SeqNum, TcpFlags, TcpOptions, TcpRepr, Timestamps,
};
use zbuf::Zbuf;

const PORT: u16 = 7700;
const SERVER_MAC: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x0b]);
const CLIENT_MAC: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x0a]);
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const CLIENT_PORT: u16 = 40000;
/// Virtual time between two hostile frames: 1 ms, so the flood runs at 1,000/s as
/// attack.py's (about 900 SYN/s) and the RST limiter's 200/s budget refills as there.
const GAP: Duration = Duration::from_millis(1);

/// SplitMix64: the attacker's randomness, fixed so every run counts the same frames.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn u32(&mut self) -> u32 {
        (self.next() >> 32) as u32
    }
    fn port(&mut self) -> u16 {
        1024 + (self.next() % (65536 - 1024)) as u16
    }
    fn spoofed(&mut self) -> Ipv4Addr {
        // attack.py: 64 sources in the subnet, never the server's or the client's.
        Ipv4Addr::new(198, 18, 0, 10 + (self.next() % 64) as u8)
    }
}

fn repr(src_port: u16, seq: u32, ack: u32, flags: TcpFlags, options: TcpOptions) -> TcpRepr {
    TcpRepr {
        src_port,
        dst_port: PORT,
        seq: SeqNum(seq),
        ack: SeqNum(ack),
        flags,
        window: 64240,
        urgent: 0,
        options,
    }
}

fn linux_syn_options(tsval: u32) -> TcpOptions {
    TcpOptions {
        mss: Some(1460),
        window_scale: Some(7),
        sack_permitted: true,
        timestamps: Some(Timestamps { tsval, tsecr: 0 }),
        sack_blocks: SackBlocks::default(),
    }
}

fn frame(src: Ipv4Addr, tcp: &TcpRepr, payload: &[u8]) -> Zbuf {
    Zbuf::from_vec(build_tcp_frame(
        CLIENT_MAC, SERVER_MAC, src, SERVER_IP, tcp, payload,
    ))
}

fn flat(t: &luna_stack::stack::Transmit) -> Vec<u8> {
    let mut v = t.header().to_vec();
    for c in t.payload.chunks() {
        v.extend_from_slice(c);
    }
    v
}

/// The measured part: every frame into the stack, the application's reads, and every
/// frame out of it (dropped). Returns the frames the stack sent.
#[inline(never)]
fn stack_work(
    s: &mut Stack<FakeRng>,
    now: &mut Instant,
    frames: Vec<Zbuf>,
    conn: Option<SocketHandle>,
) -> u64 {
    let mut sent = 0;
    for f in frames {
        *now += GAP;
        s.handle_frame(*now, f);
        if let Some(h) = conn {
            while let Ok(Some(z)) = s.recv(h) {
                std::hint::black_box(z);
            }
        }
        while let Some(t) = s.poll_transmit(*now) {
            std::hint::black_box(&t);
            sent += 1;
        }
        while s.poll_event().is_some() {}
    }
    s.handle_timeouts(*now);
    sent
}

/// A connection from CLIENT_IP:CLIENT_PORT with Linux's options, handshake done by hand;
/// returns (server's handle, client's next SEQ, server's next SEQ, client's next TSval).
fn establish(s: &mut Stack<FakeRng>, now: &mut Instant) -> (SocketHandle, u32, u32, u32) {
    let l = s.listen(PORT, 16).expect("listen");
    let (isn, ts0) = (1_000_000u32, 5_000u32);
    let syn = repr(CLIENT_PORT, isn, 0, TcpFlags::SYN, linux_syn_options(ts0));
    s.handle_frame(*now, frame(CLIENT_IP, &syn, &[]));
    let mut synack = None;
    while let Some(t) = s.poll_transmit(*now) {
        let v = flat(&t);
        if let Some((_, tcp, _)) = parse_tcp_frame(&v) {
            if tcp.flags.syn() && tcp.flags.ack() {
                synack = Some(tcp);
            }
        }
    }
    let sa = synack.expect("a SYN-ACK for the client's SYN");
    let tsecr = sa.options.timestamps.map_or(0, |t| t.tsval);
    let ack_opts = TcpOptions {
        timestamps: Some(Timestamps {
            tsval: ts0 + 1,
            tsecr,
        }),
        ..TcpOptions::default()
    };
    let srv = sa.seq.0.wrapping_add(1);
    let ack = repr(CLIENT_PORT, isn + 1, srv, TcpFlags::ACK, ack_opts);
    *now += GAP;
    s.handle_frame(*now, frame(CLIENT_IP, &ack, &[]));
    while s.poll_transmit(*now).is_some() {}
    let mut h = None;
    while let Some(ev) = s.poll_event() {
        if let Event::Acceptable(_) = ev {
            h = h.or_else(|| s.accept(l));
        }
    }
    (
        h.expect("the connection was accepted"),
        isn + 1,
        srv,
        ts0 + 2,
    )
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let usage = "usage: syn_flood <syn|syn_nocookie|stray_ack|oow_rst|data> <n> [payload 1448]";
    let kind = a.get(1).cloned().unwrap_or_else(|| panic!("{usage}"));
    let n: u32 = a
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{usage}"));
    let payload_len: usize = a.get(3).map_or(1448, |s| s.parse().expect("payload"));
    let mut cfg = stack_config(SERVER_MAC, SERVER_IP);
    cfg.syn_cookies = if kind == "syn_nocookie" {
        SynCookieMode::Off
    } else {
        SynCookieMode::WhenFull
    };
    let mut s = Stack::new(cfg, FakeRng::new(7)).expect("config");
    let mut now = Instant::from_millis(1_000);
    let mut rng = Mix(12);
    let mut frames = Vec::with_capacity(n as usize);
    let mut conn = None;
    match kind.as_str() {
        "syn" | "syn_nocookie" => {
            s.listen(PORT, 16).expect("listen");
            for _ in 0..n {
                let t = repr(
                    rng.port(),
                    rng.u32(),
                    0,
                    TcpFlags::SYN,
                    linux_syn_options(rng.u32()),
                );
                frames.push(frame(rng.spoofed(), &t, &[]));
            }
        }
        "stray_ack" => {
            s.listen(PORT, 16).expect("listen");
            for _ in 0..n {
                let t = repr(
                    rng.port(),
                    rng.u32(),
                    rng.u32(),
                    TcpFlags::ACK,
                    TcpOptions::default(),
                );
                frames.push(frame(rng.spoofed(), &t, &[]));
            }
        }
        "oow_rst" => {
            let (_h, seq, _srv, _) = establish(&mut s, &mut now);
            for _ in 0..n {
                // attack.py: SEQ 2,000,000 .. 4,000,000,000 ahead of RCV.NXT.
                let off = 2_000_000 + rng.u32() % 3_998_000_000;
                let t = repr(
                    CLIENT_PORT,
                    seq.wrapping_add(off),
                    rng.u32(),
                    TcpFlags::RST | TcpFlags::ACK,
                    TcpOptions::default(),
                );
                frames.push(frame(CLIENT_IP, &t, &[]));
            }
        }
        "data" => {
            let (h, mut seq, srv, mut ts) = establish(&mut s, &mut now);
            conn = Some(h);
            let body = vec![0x6b; payload_len];
            for _ in 0..n {
                let opts = TcpOptions {
                    timestamps: Some(Timestamps {
                        tsval: ts,
                        tsecr: 0,
                    }),
                    ..TcpOptions::default()
                };
                let t = repr(CLIENT_PORT, seq, srv, TcpFlags::ACK | TcpFlags::PSH, opts);
                frames.push(frame(CLIENT_IP, &t, &body));
                seq = seq.wrapping_add(payload_len as u32);
                ts = ts.wrapping_add(1);
            }
        }
        _ => panic!("{usage}"),
    }
    let out = stack_work(&mut s, &mut now, frames, conn);
    let c = s.counters();
    let tc = s.tcp_counters();
    println!(
        "kind={kind} frames={n} sent={out} cookies_sent={} passive_opens={} rsts_sent={} \
         challenge_acks={} challenge_acks_suppressed={} drop_backlog_full={} \
         drop_listen_invalid={} drop_rst_limited={} bytes_in={}",
        c.syn_cookies_sent,
        c.passive_opens,
        c.rsts_sent,
        tc.challenge_acks,
        tc.challenge_acks_suppressed,
        c.drops(StackDrop::BacklogFull),
        c.drops(StackDrop::ListenInvalid),
        c.drops(StackDrop::RstLimited),
        tc.bytes_in,
    );
    if let Some(h) = conn {
        println!("conn_state={:?}", s.state(h));
    }
}
