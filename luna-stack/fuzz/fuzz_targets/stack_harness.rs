//! Shared harness of the stack fuzz targets: decodes the fuzz input into a script of
//! operations (raw frames, TCP segments built with valid checksums and sequence/ACK numbers
//! near the live connection's, timer advances, application calls) and checks the stack's
//! resource bounds after every operation, that no connection's timer is missing from
//! the stack's timer queue, and that every connection marked for output is listed.
//!
//! Input format (every read past the end yields zeros, so any input is a valid script):
//! ```text
//! op u8, then by op % 8:
//!   0     raw frame: len u16 (mod 1600), bytes
//!   1..=4 TCP segment to the stack: flags u8, seq delta i16, ack delta i16, window u16,
//!         option mask u8 [mss u16][wscale u8][ts: tsval delta i16, tsecr u32]
//!         [sack: n u8, n x (left delta i16, len u16)], payload len u16 (mod 3000),
//!         and, with mask bit 6, a peer port u16 (else the tracked peer's port)
//!   5     advance time: ms u8, shift u8 (mod 12), then handle_timeouts
//!   6     application: what u8 (recv all / send n / shutdown / abort / recv_iovec n /
//!         hold ACKs / release ACKs, by what % 7; the connection by what >> 4);
//!         send n: n u16, then partial u8: with bit 7 set only partial & 7 frames are
//!         polled (a driver stopping mid-burst), the rest at the next drain. Hold and
//!         release are `Stack::hold_acks` / `release_acks` (r2c's split receive burst),
//!         here spanning any other ops; the script releases before it ends
//!   7     SYN burst: n u8 (mod 64) SYNs from distinct ports
//! ```
//! A TCP segment op with bit 7 set is queued instead: the queue goes to the stack in one
//! `handle_frames` call (receive coalescing) before the next other op and at the end.
#![allow(dead_code)]

use luna_stack::stack::{Event, ListenerHandle, SocketHandle, Stack, StackConfig};
use luna_stack::tcp::SeqNum;
use luna_stack::testutil::{
    build_tcp_frame, stack_config, FakeRng, Segment, IP_A, IP_B, MAC_A, MAC_B,
};
use luna_stack::time::{Duration, Instant};
use luna_stack::wire::{SackBlocks, TcpFlags, TcpOptions, TcpRepr, Timestamps};
use zbuf::Zbuf;

/// Most connections the stack may hold.
pub const MAX_CONNECTIONS: usize = 16;
/// Receive and send buffers.
pub const BUF: u32 = 64 * 1024;
/// `StackConfig::rcv_mem_total` here.
const RCV_MEM_TOTAL: usize = 160 * 1024;
/// Frames one operation may make the stack emit (a bound, not a tuning: a loop in
/// poll_transmit shows up here).
const MAX_FRAMES_PER_OP: usize = 4096;
/// A NIC receive buffer: frames arrive in their own 2 KiB object, as from an mbuf pool,
/// so that what a connection holds costs what it does on a real port (receive memory).
const RX_BUF: usize = 2048;

/// `frame` as the NIC hands it over: a view of its own receive buffer (bigger frames,
/// which no 1500-byte port delivers, get a buffer of their size).
fn rx(frame: &[u8]) -> Zbuf {
    let mut buf = vec![0u8; frame.len().max(RX_BUF)];
    buf[..frame.len()].copy_from_slice(frame);
    Zbuf::from_vec(buf).slice(..frame.len())
}

pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Input { data, pos: 0 }
    }
    pub fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = (self.pos + n).min(self.data.len());
        self.pos += n;
        &self.data[start..end]
    }
}

/// The scripted peer at IP_B: what it knows of the connection it talks on.
pub struct Harness {
    pub stack: Stack<FakeRng>,
    pub now: Instant,
    pub listener: Option<ListenerHandle>,
    /// Connections the application holds.
    pub handles: Vec<SocketHandle>,
    /// The peer's port and its next sequence number, and the stack's ISS + 1 (from the
    /// SYN-ACK) and the highest ACK it sent us.
    pub peer_port: u16,
    pub peer_seq: SeqNum,
    pub stack_seq: SeqNum,
    pub stack_ack: SeqNum,
    pub ts_recent: u32,
    frames_out: u64,
    /// Segments queued for one `handle_frames` call.
    batch: Vec<Zbuf>,
}

pub fn config() -> StackConfig {
    let mut cfg = stack_config(MAC_A, IP_A);
    cfg.max_connections = MAX_CONNECTIONS;
    cfg.tcp.rcv_buf = BUF;
    cfg.tcp.snd_buf = BUF;
    cfg.tcp.max_ooo_segments = 64;
    // The stack-wide receive-memory bound, above one connection's (twice BUF), below
    // two: one connection reaches its own bound first, two together reach this one.
    cfg.rcv_mem_total = RCV_MEM_TOTAL;
    // Tail loss probes (on by default; spelled out so that a change of the default does
    // not take them out of the fuzzing): the loss-detection timer's both uses (probe and
    // RACK's reordering timer) are reached.
    cfg.tcp.tlp = Some(luna_stack::tcp::TcpConfig::TLP_FLOOR);
    cfg
}

impl Harness {
    /// A stack listening on port 80 (backlog 4, SYN cookies beyond it); the peer's MAC is
    /// known so no ARP round trip is needed.
    pub fn listening() -> Harness {
        let mut stack = Stack::new(config(), FakeRng::new(7)).expect("valid config");
        let _ = stack
            .neighbours_mut()
            .learn(IP_B, MAC_B, Instant::ZERO, true);
        let listener = stack.listen(80, 4).ok();
        Harness {
            stack,
            now: Instant::from_millis(1),
            listener,
            handles: Vec::new(),
            peer_port: 40000,
            peer_seq: SeqNum(0x1000_0000),
            stack_seq: SeqNum(0),
            stack_ack: SeqNum(0),
            ts_recent: 0,
            frames_out: 0,
            batch: Vec::new(),
        }
    }

    /// A listening stack plus one connection established by a scripted handshake, with
    /// 20 kB queued by the application so data and ACKs are in flight.
    pub fn established() -> Harness {
        let mut h = Harness::listening();
        let syn = TcpRepr {
            src_port: h.peer_port,
            dst_port: 80,
            seq: h.peer_seq,
            ack: SeqNum(0),
            flags: TcpFlags::SYN,
            window: 65535,
            urgent: 0,
            options: TcpOptions {
                mss: Some(1460),
                window_scale: Some(7),
                sack_permitted: true,
                timestamps: Some(Timestamps {
                    tsval: 100,
                    tsecr: 0,
                }),
                ..TcpOptions::default()
            },
        };
        h.inject(&syn, &[]);
        h.peer_seq = h.peer_seq + 1u32;
        let ack = TcpRepr {
            src_port: h.peer_port,
            dst_port: 80,
            seq: h.peer_seq,
            ack: h.stack_seq,
            flags: TcpFlags::ACK,
            window: 1024,
            urgent: 0,
            options: TcpOptions {
                timestamps: Some(Timestamps {
                    tsval: 101,
                    tsecr: h.ts_recent,
                }),
                ..TcpOptions::default()
            },
        };
        h.inject(&ack, &[]);
        h.accept_all();
        assert_eq!(h.handles.len(), 1, "the scripted handshake completes");
        let data = Zbuf::from_vec(vec![0x42; 20_000]);
        let _ = h.stack.send(h.handles[0], &data);
        h.drain();
        h
    }

    /// Hand the queued segments to the stack in one call and collect what it sends back.
    pub fn flush_batch(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        self.stack.handle_frames(self.now, self.batch.drain(..));
        self.drain();
    }

    /// Hand a segment from the peer to the stack and collect what it sends back.
    pub fn inject(&mut self, tcp: &TcpRepr, payload: &[u8]) {
        let frame = build_tcp_frame(MAC_B, MAC_A, IP_B, IP_A, tcp, payload);
        self.stack.handle_frame(self.now, rx(&frame));
        self.drain();
    }

    pub fn raw(&mut self, frame: &[u8]) {
        self.stack.handle_frame(self.now, rx(frame));
        self.drain();
    }

    /// Poll everything the stack wants to send; learn the live connection's numbers from it.
    pub fn drain(&mut self) {
        self.drain_at_most(usize::MAX);
    }

    /// `drain`, stopping after `most` frames (a driver whose transmit queue filled up).
    pub fn drain_at_most(&mut self, most: usize) {
        let mut n = 0;
        while n < most {
            let Some(t) = self.stack.poll_transmit(self.now) else {
                break;
            };
            n += 1;
            assert!(n <= MAX_FRAMES_PER_OP, "poll_transmit does not run dry");
            self.frames_out += 1;
            let bytes = t.to_vec();
            if let Some(seg) = Segment::parse(&bytes) {
                if seg.tcp.dst_port == self.peer_port {
                    if seg.tcp.flags.syn() {
                        self.stack_seq = seg.tcp.seq + 1u32;
                    }
                    if seg.tcp.flags.ack() {
                        self.stack_ack = seg.tcp.ack;
                    }
                    if let Some(ts) = seg.tcp.options.timestamps {
                        self.ts_recent = ts.tsval;
                    }
                }
            }
        }
        self.check_bounds();
        self.check_timers();
        self.stack.check_transmit_list();
    }

    /// No timer is lost: the stack's next deadline is no later than any connection's own
    /// (the timer queue trusts what it was last told of each connection).
    pub fn check_timers(&mut self) {
        let own = self
            .handles
            .iter()
            .filter_map(|&h| self.stack.connection(h)?.poll_timeout())
            .min();
        if let Some(own) = own {
            let queued = self.stack.poll_timeout();
            assert!(
                queued.is_some_and(|q| q <= own),
                "a connection's deadline {own:?} is not in the timer queue (head {queued:?})"
            );
        }
    }

    pub fn accept_all(&mut self) {
        while let Some(ev) = self.stack.poll_event() {
            if let Event::Acceptable(l) = ev {
                while let Some(s) = self.stack.accept(l) {
                    self.handles.push(s);
                }
            }
        }
    }

    /// Resource bounds that must hold whatever the peer sends.
    pub fn check_bounds(&self) {
        assert!(self.stack.connection_count() <= MAX_CONNECTIONS);
        // The stack-wide receive memory is exactly what the connections hold (it is kept
        // by deltas: it must never drift), and within its bound plus one segment (at
        // most a 64 KiB frame's buffer with its metadata) per connection.
        let held = self.stack.held().rcv_mem;
        let sum: u64 = self
            .stack
            .connections()
            .map(|(_, c)| c.recv_mem() as u64)
            .sum();
        assert_eq!(held, sum, "Held::rcv_mem drifted from the connections' sum");
        let slack = self.stack.connection_count() as u64 * (65_536 + 128);
        assert!(
            held <= RCV_MEM_TOTAL as u64 + slack,
            "receive memory {held} over the stack-wide bound"
        );
        // Connections whose applications never took data stay below the bound's reserve
        // (kept for readers under their floor, `TcpConfig::rcv_mem_min`), but for the
        // progress rule's one segment each.
        let free = (RCV_MEM_TOTAL - self.stack.config().rcv_mem_reserve()) as u64;
        let never: Vec<u64> = self
            .stack
            .connections()
            .map(|(_, c)| c)
            .filter(|c| c.counters.bytes_in == c.recv_available() as u64)
            .map(|c| c.recv_mem() as u64)
            .collect();
        let theirs: u64 = never.iter().sum();
        assert!(
            theirs <= free + never.len() as u64 * (65_536 + 128),
            "connections that never read hold {theirs}, over {free} and a segment each"
        );
        for &h in &self.handles {
            if let Some(c) = self.stack.connection(h) {
                assert!(
                    c.recv_available() <= BUF as usize,
                    "receive queue over rcv_buf"
                );
                // Receive memory: the buffers behind what it holds stay within twice
                // rcv_buf plus the one buffer (at most a 64 KiB frame's, with its
                // metadata) a segment admitted at the bound adds.
                assert!(
                    c.recv_mem() <= c.rcv_mem_limit() + 65_536 + 128,
                    "receive memory {} over its bound {}",
                    c.recv_mem(),
                    c.rcv_mem_limit()
                );
                assert!(c.send_capacity() <= BUF as usize);
                assert!(c.cwnd() >= 1, "cwnd collapsed to zero");
            }
        }
    }

    fn segment(&mut self, inp: &mut Input, queued: bool) {
        let flags = TcpFlags(inp.u8());
        let seq = self.peer_seq + (inp.u16() as i16 as i32 as u32);
        let ack = self.stack_seq + (inp.u16() as i16 as i32 as u32);
        let window = inp.u16();
        let mask = inp.u8();
        let mut options = TcpOptions::default();
        if mask & 1 != 0 {
            options.mss = Some(inp.u16());
        }
        if mask & 2 != 0 {
            options.window_scale = Some(inp.u8());
        }
        options.sack_permitted = mask & 4 != 0;
        if mask & 8 != 0 {
            let tsval = 101u32.wrapping_add(inp.u16() as i16 as i32 as u32);
            options.timestamps = Some(Timestamps {
                tsval,
                tsecr: inp.u32(),
            });
        } else if mask & 0x80 == 0 {
            // Usually a plausible timestamp, so segments get past PAWS.
            options.timestamps = Some(Timestamps {
                tsval: 101 + (self.now.as_nanos() / 1_000_000) as u32,
                tsecr: self.ts_recent,
            });
        }
        if mask & 16 != 0 {
            let n = inp.u8() % 4;
            let mut blocks = SackBlocks::new();
            for _ in 0..n {
                let left = self.stack_seq + (inp.u16() as i16 as i32 as u32);
                let len = u32::from(inp.u16());
                blocks.push(left, left + len);
            }
            options.sack_blocks = blocks;
        }
        let payload_len = usize::from(inp.u16() % 3000);
        let port = if mask & 64 != 0 {
            inp.u16()
        } else {
            self.peer_port
        };
        let payload = vec![0xA5u8; payload_len];
        let tcp = TcpRepr {
            src_port: port,
            dst_port: 80,
            seq,
            ack,
            flags,
            window,
            urgent: 0,
            options,
        };
        if queued && self.batch.len() < 64 {
            let frame = build_tcp_frame(MAC_B, MAC_A, IP_B, IP_A, &tcp, &payload);
            self.batch.push(rx(&frame));
        } else {
            self.inject(&tcp, &payload);
        }
        if port == self.peer_port && !flags.rst() {
            // Keep the script near the live window: the peer "sent" this.
            let len = tcp.segment_len(payload_len) as u32;
            if seq == self.peer_seq {
                self.peer_seq = self.peer_seq + len;
            }
        }
    }

    fn app(&mut self, inp: &mut Input) {
        self.accept_all();
        let what = inp.u8();
        match what % 7 {
            5 => {
                self.stack.hold_acks();
                self.drain();
                return;
            }
            6 => {
                self.stack.release_acks();
                self.drain();
                return;
            }
            _ => {}
        }
        let Some(&h) = self
            .handles
            .get(usize::from(what >> 4) % self.handles.len().max(1))
        else {
            return;
        };
        match what % 7 {
            0 => while let Ok(Some(_)) = self.stack.recv(h) {},
            1 => {
                let n = usize::from(inp.u16());
                let _ = self.stack.send(h, &Zbuf::from_vec(vec![0x37; n]));
                let partial = inp.u8();
                if partial & 0x80 != 0 {
                    // The driver stops after a few frames (r2c with a full transmit
                    // queue); the rest goes out at the next drain.
                    self.drain_at_most(usize::from(partial & 7));
                    return;
                }
            }
            2 => self.stack.shutdown(h),
            3 => self.stack.abort(h),
            _ => {
                let _ = self.stack.recv_iovec(h, usize::from(inp.u16()));
            }
        }
        self.drain();
    }

    fn syn_burst(&mut self, inp: &mut Input) {
        let n = inp.u8() % 64;
        for i in 0..n {
            let tcp = TcpRepr {
                src_port: 50000 + u16::from(i),
                dst_port: 80,
                seq: SeqNum(u32::from(i) * 7919),
                ack: SeqNum(0),
                flags: TcpFlags::SYN,
                window: 1000,
                urgent: 0,
                options: TcpOptions {
                    mss: Some(536),
                    ..TcpOptions::default()
                },
            };
            self.inject(&tcp, &[]);
        }
    }

    /// Run the whole script.
    pub fn run(&mut self, data: &[u8]) {
        let mut inp = Input::new(data);
        let mut ops = 0;
        while !inp.done() && ops < 256 {
            ops += 1;
            let op = inp.u8();
            if op & 0x80 != 0 && matches!(op % 8, 1..=4) {
                self.segment(&mut inp, true);
                continue;
            }
            self.flush_batch();
            match op % 8 {
                0 => {
                    let len = usize::from(inp.u16() % 1600);
                    let bytes = inp.take(len);
                    self.raw(bytes);
                }
                1..=4 => self.segment(&mut inp, false),
                5 => {
                    let ms = u64::from(inp.u8()) << (inp.u8() % 12);
                    self.now += Duration::from_millis(ms);
                    self.stack.handle_timeouts(self.now);
                    self.drain();
                }
                6 => self.app(&mut inp),
                _ => self.syn_burst(&mut inp),
            }
            self.accept_all();
        }
        self.flush_batch();
        self.accept_all();
        // A poll loop always releases what it held: the held ACKs go now.
        self.stack.release_acks();
        self.drain();
        // Whatever happened, time heals: every timer eventually fires and the stack stays
        // within bounds; a connection never outlives max_retries of backed-off RTOs.
        for _ in 0..64 {
            let Some(t) = self.stack.poll_timeout() else {
                break;
            };
            self.now = self.now.max(t);
            self.stack.handle_timeouts(self.now);
            self.drain();
        }
    }
}
