//! Bounded multi-threaded stress: every thread allocates, writes a unique pattern,
//! shares buffers with its neighbour (which verifies and frees them: cross-core frees)
//! and keeps some locally; at the end nothing leaks and the counters add up.

use std::collections::VecDeque;
use std::sync::mpsc;

use zbuf::{AllocError, HugepageMode, IoVec, Slab, SlabConfig, Zbuf};

const THREADS: usize = 4;
const ITERS: u64 = 20_000;

fn tag(thread: usize, seq: u64) -> [u8; 16] {
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&(thread as u64).to_le_bytes());
    t[8..].copy_from_slice(&seq.to_le_bytes());
    t
}

/// Checks a buffer written by `fill`: a tag then bytes derived from it.
fn verify(z: &Zbuf) {
    assert!(z.len() >= 16);
    let seq = u64::from_le_bytes(z[8..16].try_into().unwrap());
    let fill = (seq as u8) ^ z[0];
    assert!(
        z[16..].iter().all(|&b| b == fill),
        "buffer contents changed under its owner"
    );
}

/// Returns the number of failed allocations.
fn run(slab: Slab) -> u64 {
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| mpsc::sync_channel::<Zbuf>(64)).unzip();
    let mut handles = Vec::new();
    for (i, rx) in rxs.into_iter().enumerate() {
        let tx = txs[(i + 1) % THREADS].clone();
        let slab = slab.clone();
        handles.push(std::thread::spawn(move || {
            let cache = slab.core_cache(i).unwrap();
            let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ i as u64;
            let mut ring: VecDeque<Zbuf> = VecDeque::new();
            let (mut ok, mut failed, mut received) = (0u64, 0u64, 0u64);
            for seq in 0..ITERS {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let len = 16 + (rng % 6000) as usize;
                match cache.alloc(len) {
                    Ok(mut m) => {
                        ok += 1;
                        let t = tag(i, seq);
                        m.extend_from_slice(&t).unwrap();
                        m.append(len - 16).unwrap().fill((seq as u8) ^ t[0]);
                        let z = m.freeze();
                        // A full neighbour queue means the buffer is freed here instead.
                        match rng % 4 {
                            0 => drop(tx.try_send(z)),
                            1 => {
                                // Share: the neighbour frees one view, we keep another.
                                drop(tx.try_send(z.slice(..)));
                                ring.push_back(z);
                            }
                            2 => ring.push_back(z),
                            _ => drop(z),
                        }
                    }
                    Err(AllocError::Exhausted { .. }) => {
                        failed += 1;
                        ring.clear();
                    }
                    Err(e) => panic!("unexpected {e}"),
                }
                while ring.len() > 64 {
                    let z = ring.pop_front().unwrap();
                    verify(&z);
                }
                while let Ok(z) = rx.try_recv() {
                    verify(&z);
                    // Split through an io-vector before freeing, as a stack would.
                    let mut v = IoVec::from(z);
                    let head = v.split_to(16);
                    assert_eq!(head.len() + v.len(), 16 + v.len());
                    received += 1;
                }
            }
            drop(tx);
            ring.iter().for_each(verify);
            drop(ring);
            let st = cache.stats();
            assert_eq!(st.allocs, ok);
            assert_eq!(st.alloc_failures, failed);
            // Drop the cache before draining: late buffers of ours are freed "remotely"
            // into an unowned home and must still reach the shared pool.
            drop(cache);
            for z in rx {
                verify(&z);
                received += 1;
            }
            (ok, failed, received)
        }));
    }
    drop(txs);
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let st = slab.stats();
    let allocs: u64 = results.iter().map(|r| r.0).sum();
    assert_eq!(st.cores.iter().map(|c| c.allocs).sum::<u64>(), allocs);
    assert_eq!(
        st.alloc_failures(),
        results.iter().map(|r| r.1).sum::<u64>()
    );
    assert!(st.remote_frees() > 0, "neighbours freed buffers: {st:?}");
    assert!(results.iter().map(|r| r.2).sum::<u64>() > 0);
    assert_eq!(st.in_use(), 0);
    assert!(slab.leak_report().is_clean(), "{}", slab.leak_report());
    // Every object is back in a shared pool: no cache is alive and no queue holds one.
    for c in &st.classes {
        assert_eq!(
            c.in_shared_pool, c.objects,
            "class {} stranded objects",
            c.object_size
        );
    }
    st.alloc_failures()
}

#[test]
fn concurrent_alloc_and_cross_core_free_normal_pages() {
    let cfg = SlabConfig::new()
        .hugepages(HugepageMode::Never)
        .size_classes(&[2048, 4096, 16384])
        .max_memory(24 << 20)
        .cache_size(64);
    run(Slab::new(cfg).unwrap());
}

#[test]
fn concurrent_alloc_and_cross_core_free_hugepages_with_exhaustion() {
    // Three 2 MiB hugepages for three classes and a small cache: some allocations
    // must fail with Exhausted, and recover.
    let cfg = SlabConfig::new()
        .require_hugepages(true)
        .size_classes(&[2048, 4096, 16384])
        .max_memory(3 << 21)
        .cache_size(32);
    let slab =
        Slab::new(cfg).expect("this test needs free 2 MiB hugepages (sysctl vm.nr_hugepages)");
    let failures = run(slab);
    eprintln!("allocation failures: {failures}");
    assert!(failures > 0, "the memory limit was reached");
}
