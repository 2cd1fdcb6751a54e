//! Micro-benchmarks of the TCP algorithm hot paths: the receive assembler and the SACK
//! scoreboard. Results and the command that produced them: docs/benchmarks-tcpalg.md.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use luna_stack::tcp::assembler::{Assembler, AssemblerConfig, Payload};
use luna_stack::tcp::scoreboard::Scoreboard;
use luna_stack::tcp::SeqNum;
use std::hint::black_box;

/// A payload that is only a length: measures the assembler's bookkeeping, not memcpy or
/// allocation (a real Zbuf split is a refcount bump and two integer updates).
#[derive(Debug)]
struct Len(usize);

impl Payload for Len {
    fn len(&self) -> usize {
        self.0
    }
    fn split_to(&mut self, at: usize) -> Self {
        let at = at.min(self.0);
        self.0 -= at;
        Len(at)
    }
    fn advance(&mut self, n: usize) {
        self.0 -= n.min(self.0);
    }
    fn truncate(&mut self, n: usize) {
        self.0 = self.0.min(n);
    }
    /// No buffer behind it: never collapsed.
    fn truesize(&self) -> usize {
        0
    }
    fn concat(parts: &[Self]) -> Self {
        Len(parts.iter().map(|p| p.0).sum())
    }
}

const MSS: u32 = 1448;

fn assembler(c: &mut Criterion) {
    let mut g = c.benchmark_group("assembler");
    g.bench_function("in_order_insert_pop", |b| {
        let mut a: Assembler<Len> = Assembler::new(AssemblerConfig::default()).unwrap();
        let mut nxt = SeqNum(0xFFFF_0000);
        b.iter(|| {
            a.insert(nxt, nxt, Len(MSS as usize));
            let p = a.pop_ready(nxt).unwrap();
            nxt += p.len();
            black_box(p);
        });
    });
    g.bench_function("ooo_8_segments_then_fill", |b| {
        let mut a: Assembler<Len> = Assembler::new(AssemblerConfig::default()).unwrap();
        let mut nxt = SeqNum(0);
        let mut blocks = [(SeqNum(0), SeqNum(0)); 4];
        b.iter(|| {
            // Segment 0 lost, 1..=8 arrive (each ACK carries SACK blocks), then 0 arrives.
            for k in 1..=8u32 {
                a.insert(nxt, nxt + k * MSS, Len(MSS as usize));
                black_box(a.sack_blocks(nxt, &mut blocks[..3]));
            }
            a.insert(nxt, nxt, Len(MSS as usize));
            while let Some(p) = a.pop_ready(nxt) {
                nxt += p.len();
            }
        });
    });
    g.finish();
}

/// A scoreboard with `holes` alternating lost/SACKed segments outstanding.
fn fragmented(holes: u32) -> Scoreboard {
    let mut s = Scoreboard::with_defaults(SeqNum(1000), MSS);
    s.on_transmit(SeqNum(1000) + 4 * holes * MSS);
    for k in 0..holes {
        let l = SeqNum(1000) + (2 * k + 1) * MSS;
        s.on_ack(SeqNum(1000), &[(l, l + MSS)]);
    }
    s
}

fn scoreboard(c: &mut Criterion) {
    let mut g = c.benchmark_group("scoreboard");
    g.bench_function("on_ack_3_blocks_32_ranges", |b| {
        b.iter_batched(
            || fragmented(32),
            |mut s| {
                // Cumulative ACK of one segment plus 3 blocks that each fill a hole.
                let base = SeqNum(1000);
                let blocks = [
                    (base + 20 * MSS, base + 21 * MSS),
                    (base + 12 * MSS, base + 13 * MSS),
                    (base + 4 * MSS, base + 5 * MSS),
                ];
                black_box(s.on_ack(base + MSS, &blocks));
                s
            },
            BatchSize::SmallInput,
        );
    });
    g.bench_function("steady_sack_stream_3_blocks", |b| {
        // One loss at SND.UNA, then every ACK extends the SACKed block by one segment and
        // repeats two older blocks: the common single-loss recovery pattern.
        let mut s = Scoreboard::with_defaults(SeqNum(0), MSS);
        let mut high = SeqNum(0) + 2 * MSS;
        s.on_transmit(SeqNum(0) + (1u32 << 29));
        b.iter(|| {
            high += MSS;
            if (high - SeqNum(0)) > (1u32 << 29) - MSS {
                s = Scoreboard::with_defaults(SeqNum(0), MSS);
                s.on_transmit(SeqNum(0) + (1u32 << 29));
                high = SeqNum(0) + 2 * MSS;
            }
            let blocks = [
                (SeqNum(0) + MSS, high),
                (SeqNum(0) + MSS, SeqNum(0) + 2 * MSS),
                (SeqNum(0) + MSS, SeqNum(0) + 2 * MSS),
            ];
            black_box(s.on_ack(SeqNum(0), &blocks));
        });
    });
    g.bench_function("pipe_and_next_seg_32_ranges", |b| {
        let s = fragmented(32);
        b.iter(|| black_box((black_box(&s).pipe(), s.next_seg(false))));
    });
    g.finish();
}

criterion_group!(benches, assembler, scoreboard);
criterion_main!(benches);
