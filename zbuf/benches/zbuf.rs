//! Micro-benchmarks: slab alloc+free against the heap, single- and cross-core, reference
//! clone+drop, io-vector splitting. Results go to docs/benchmarks-zbuf.md.
//!
//! `cargo bench -p zbuf --bench zbuf`
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use zbuf::{IoVec, Slab, SlabConfig, Zbuf};

const SIZES: [usize; 3] = [2048, 4096, 16384];
const HEADROOM: usize = 128;

fn slab() -> Slab {
    Slab::new(SlabConfig::new().max_memory(256 << 20)).expect("slab")
}

fn alloc_free_single_core(c: &mut Criterion) {
    let slab = slab();
    let cache = slab.core_cache(0).unwrap();
    let mut g = c.benchmark_group("alloc_free_single_core");
    for size in SIZES {
        g.bench_with_input(BenchmarkId::new("zbuf", size), &size, |b, &size| {
            b.iter(|| black_box(cache.alloc(size - HEADROOM).unwrap()))
        });
        g.bench_with_input(BenchmarkId::new("box_zeroed", size), &size, |b, &size| {
            b.iter(|| black_box(vec![0u8; size].into_boxed_slice()))
        });
        g.bench_with_input(BenchmarkId::new("vec_uninit", size), &size, |b, &size| {
            b.iter(|| black_box(Vec::<u8>::with_capacity(size)))
        });
    }
    g.finish();
}

/// Allocates on this thread, frees on another, in batches; returns the summed time of
/// both sides (the channel hand-off is not timed).
fn cross_core<T: Send + 'static>(iters: u64, mut alloc: impl FnMut() -> T) -> Duration {
    const BATCH: usize = 256;
    let (to_b, from_a) = mpsc::channel::<Vec<T>>();
    let (to_a, from_b) = mpsc::channel::<Duration>();
    let freer = std::thread::spawn(move || {
        for batch in from_a {
            let t = Instant::now();
            drop(batch);
            to_a.send(t.elapsed()).unwrap();
        }
    });
    let mut total = Duration::ZERO;
    let mut left = iters as usize;
    let mut batch = Vec::with_capacity(BATCH);
    while left > 0 {
        let n = left.min(BATCH);
        let t = Instant::now();
        for _ in 0..n {
            batch.push(alloc());
        }
        total += t.elapsed();
        to_b.send(std::mem::replace(&mut batch, Vec::with_capacity(BATCH)))
            .unwrap();
        total += from_b.recv().unwrap();
        left -= n;
    }
    drop(to_b);
    freer.join().unwrap();
    total
}

fn alloc_free_cross_core(c: &mut Criterion) {
    let slab = slab();
    let cache = slab.core_cache(0).unwrap();
    let mut g = c.benchmark_group("alloc_free_cross_core");
    for size in SIZES {
        g.bench_with_input(BenchmarkId::new("zbuf", size), &size, |b, &size| {
            b.iter_custom(|iters| cross_core(iters, || cache.alloc(size - HEADROOM).unwrap()))
        });
        g.bench_with_input(BenchmarkId::new("box_zeroed", size), &size, |b, &size| {
            b.iter_custom(|iters| cross_core(iters, || vec![0u8; size].into_boxed_slice()))
        });
    }
    g.finish();
}

fn clone_drop(c: &mut Criterion) {
    let slab = slab();
    let cache = slab.core_cache(0).unwrap();
    let mut m = cache.alloc(1460).unwrap();
    m.append(1460).unwrap();
    let z = m.freeze();
    let arc: Arc<[u8]> = vec![0u8; 1460].into();
    let mut g = c.benchmark_group("clone_drop");
    g.bench_function("zbuf", |b| b.iter(|| black_box(z.clone())));
    g.bench_function("zbuf_slice", |b| b.iter(|| black_box(z.slice(100..1000))));
    g.bench_function("arc_slice", |b| b.iter(|| black_box(arc.clone())));
    g.finish();
}

fn iovec_split(c: &mut Criterion) {
    let slab = slab();
    let cache = slab.core_cache(0).unwrap();
    // Eight 1460-byte segments, as eight received MSS-sized segments.
    let segs: Vec<Zbuf> = (0..8)
        .map(|_| {
            let mut m = cache.alloc(1460).unwrap();
            m.append(1460).unwrap().fill(7);
            m.freeze()
        })
        .collect();
    let iov: IoVec = segs.iter().cloned().collect();
    let flat: Vec<u8> = iov.to_vec();
    let mut g = c.benchmark_group("iovec_split");
    // Take a 4 KiB message off the front of an 11.7 KB stream.
    g.bench_function("iovec_split_to_4096", |b| {
        b.iter_batched_ref(
            || iov.clone(),
            |v| black_box(v.split_to(4096)),
            criterion::BatchSize::SmallInput,
        )
    });
    g.bench_function("iovec_slice_1000_9000", |b| {
        b.iter(|| black_box(iov.slice(1000..9000)))
    });
    g.bench_function("vec_copy_split_4096", |b| {
        b.iter_batched_ref(
            || flat.clone(),
            |v| {
                let head = v[..4096].to_vec();
                v.drain(..4096);
                black_box(head)
            },
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    targets = alloc_free_single_core, alloc_free_cross_core, clone_drop, iovec_split
}
criterion_main!(benches);
