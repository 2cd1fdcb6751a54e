//! Micro-benchmarks of the `dpdk` feature against DPDK's own mbufs, single core (the EAL
//! main lcore, so both sides use their per-core caches). Results go to
//! docs/benchmarks-zbuf.md.
//!
//! `cargo bench -p zbuf --features dpdk --bench dpdk` (root, free hugepages)
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, Criterion};
use dpdk_sys::{Eal, Mempool, PoolConfig};
use zbuf::dpdk::{DmaRegistry, RxPool, RxPoolConfig, TxChains, TxConfig};
use zbuf::{IoVec, Slab, SlabConfig};

struct Env {
    eal: Eal,
    reg: DmaRegistry,
    slab: Slab,
}

fn env() -> &'static Env {
    static ENV: std::sync::OnceLock<Env> = std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        let eal = Eal::init([
            "--no-pci".to_string(),
            "--in-memory".into(),
            "--no-telemetry".into(),
            "-m".into(),
            "128".into(),
            "-l".into(),
            "0".into(),
            format!("--file-prefix=ldv-bench-{}", std::process::id()),
        ])
        .expect("EAL (root, hugepages)");
        let reg = DmaRegistry::new(&eal);
        let slab = Slab::new(reg.slab_config(SlabConfig::new().max_memory(64 << 20))).unwrap();
        Env { eal, reg, slab }
    })
}

/// Allocate one 2 KiB buffer and free it on the same core: zbuf's slab against
/// `rte_pktmbuf_alloc` / `rte_pktmbuf_free` (default 2048 + 128 data room, 256 cache).
fn alloc_free(c: &mut Criterion) {
    let e = env();
    let cache = e.slab.core_cache(0).unwrap();
    let pool = Mempool::create(&e.eal, &PoolConfig::new("ldv-bench-mb", 8191)).unwrap();
    let mut g = c.benchmark_group("alloc_free_2k_single_core");
    g.bench_function("zbuf", |b| {
        b.iter(|| black_box(cache.alloc(2048 - 128).unwrap()))
    });
    g.bench_function("rte_pktmbuf", |b| {
        b.iter(|| black_box(pool.alloc().unwrap()))
    });
    g.finish();
}

/// The per-frame cost the device adds: an rx mbuf turned into a Zbuf and released, and a
/// header + one payload segment built into an extbuf chain and freed (what the PMD does
/// after sending), against a plain mbuf alloc+free.
fn per_frame(c: &mut Criterion) {
    let e = env();
    let cache = e.slab.core_cache(1).unwrap();
    let rx = RxPool::new(
        &e.eal,
        &e.slab,
        Some(&e.reg),
        &RxPoolConfig::new("ldv-bench-rx", 4095),
    )
    .unwrap();
    let mut tx = TxChains::new(&e.eal, &TxConfig::new("ldv-bench-tx", 4095)).unwrap();
    let mut m = cache.alloc(1460).unwrap();
    m.append(1460).unwrap().fill(0x5a);
    let payload = IoVec::from(m.freeze());
    let header = [0u8; 54];
    let mut g = c.benchmark_group("per_frame");
    g.bench_function("rx_mbuf_alloc_free", |b| {
        b.iter(|| {
            let mut m = rx.mempool().alloc().unwrap();
            m.append(1514).unwrap();
            black_box(m)
        })
    });
    g.bench_function("rx_mbuf_to_zbuf_drop", |b| {
        b.iter(|| {
            let mut m = rx.mempool().alloc().unwrap();
            m.append(1514).unwrap();
            black_box(rx.to_zbuf(m).unwrap())
        })
    });
    g.bench_function("tx_chain_build_free", |b| {
        b.iter(|| black_box(tx.build(&header, &payload, None).unwrap()))
    });
    g.finish();
}

/// Allocate on this thread, free on another (a registered EAL lcore, so DPDK frees through
/// that lcore's mempool cache, as a second worker core would): zbuf's remote-free queue
/// against an mbuf returning to its pool from a foreign cache. Batches of 256 go across a
/// channel; only the alloc and free loops are timed.
fn cross_core(c: &mut Criterion) {
    use std::sync::mpsc;
    use std::time::Instant;
    const BATCH: usize = 256;
    fn run<T: Send + 'static>(
        iters: u64,
        freer_init: impl FnOnce() + Send + 'static,
        mut alloc: impl FnMut() -> T,
    ) -> Duration {
        let (to_b, from_a) = mpsc::channel::<Vec<T>>();
        let (to_a, from_b) = mpsc::channel::<Duration>();
        let freer = std::thread::spawn(move || {
            freer_init();
            for batch in from_a {
                let t = Instant::now();
                drop(batch);
                to_a.send(t.elapsed()).unwrap();
            }
        });
        let mut total = Duration::ZERO;
        let mut left = iters as usize;
        while left > 0 {
            let n = left.min(BATCH);
            let mut batch = Vec::with_capacity(BATCH);
            let t = Instant::now();
            for _ in 0..n {
                batch.push(alloc());
            }
            total += t.elapsed();
            to_b.send(batch).unwrap();
            total += from_b.recv().unwrap();
            left -= n;
        }
        drop(to_b);
        freer.join().unwrap();
        total
    }
    let e = env();
    let cache = e.slab.core_cache(1).unwrap();
    let pool = Mempool::create(&e.eal, &PoolConfig::new("ldv-bench-xc", 8191)).unwrap();
    let mut g = c.benchmark_group("alloc_free_2k_cross_core");
    g.bench_function("zbuf", |b| {
        b.iter_custom(|iters| run(iters, || {}, || cache.alloc(2048 - 128).unwrap().freeze()))
    });
    g.bench_function("rte_pktmbuf", |b| {
        b.iter_custom(|iters| {
            let eal = e.eal.clone();
            run(
                iters,
                move || {
                    eal.register_thread()
                        .expect("register the freeing thread as an EAL lcore");
                },
                || pool.alloc().unwrap(),
            )
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    targets = alloc_free, per_frame, cross_core
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    // The EAL lives in a static and is never cleaned up: remove its runtime directory.
    let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/ldv-bench-{}", std::process::id()));
}
