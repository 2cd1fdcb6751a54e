use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
static B: AtomicU64 = AtomicU64::new(0);
static C: AtomicU64 = AtomicU64::new(0);
thread_local! { static L: (AtomicU64, AtomicU64) = const { (AtomicU64::new(0), AtomicU64::new(0)) }; }
#[inline(never)] fn shared(n: u64) { B.fetch_add(n, Ordering::Relaxed); C.fetch_add(1, Ordering::Relaxed); }
#[inline(never)] fn local(n: u64) { L.with(|l| { l.0.store(l.0.load(Ordering::Relaxed)+n, Ordering::Relaxed); l.1.store(l.1.load(Ordering::Relaxed)+1, Ordering::Relaxed); }); }
fn run(f: fn(u64), threads: usize) -> f64 {
    const N: u64 = 20_000_000;
    let t = Instant::now();
    let hs: Vec<_> = (0..threads).map(|_| std::thread::spawn(move || for i in 0..N { f(std::hint::black_box(i & 63)) })).collect();
    for h in hs { h.join().unwrap(); }
    t.elapsed().as_secs_f64() * 1e9 / N as f64
}
fn main() { for _ in 0..3 { for th in [1usize, 2] { println!("threads {th}: shared {:.1} ns/op, per-thread {:.1} ns/op", run(shared, th), run(local, th)); } } }
