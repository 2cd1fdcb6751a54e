//! Unit tests of the unsafe core (object handles, slab recycling, lifetimes), kept small
//! so they also run under Miri: `cargo +nightly miri test -p zbuf --lib`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::resolve_range;
use crate::{AllocError, HugepageMode, IoVec, OutOfBounds, Slab, SlabConfig, Zbuf, ZbufMut};

fn small_slab() -> Slab {
    Slab::new(
        SlabConfig::new()
            .hugepages(HugepageMode::Never)
            .size_classes(&[64 * 1024])
            .headroom(64)
            .max_memory(2 << 20)
            .cache_size(4)
            .max_cores(4),
    )
    .unwrap()
}

#[test]
fn ranges_resolve_like_slices() {
    assert_eq!(resolve_range(.., 5), Ok((0, 5)));
    assert_eq!(resolve_range(1..=3, 5), Ok((1, 4)));
    assert_eq!(resolve_range(5.., 5), Ok((5, 5)));
    let (three, two) = (3, 2);
    assert_eq!(
        resolve_range(three..two, 5),
        Err(OutOfBounds {
            start: 3,
            end: 2,
            len: 5
        })
    );
    assert_eq!(
        resolve_range(0..6, 5),
        Err(OutOfBounds {
            start: 0,
            end: 6,
            len: 5
        })
    );
    assert!(resolve_range(0..=usize::MAX, 5).is_err());
    use std::ops::Bound::{Excluded, Unbounded};
    assert!(resolve_range((Excluded(usize::MAX), Unbounded), 5).is_err());
    assert_eq!(
        OutOfBounds {
            start: 0,
            end: 6,
            len: 5
        }
        .to_string(),
        "range 0..6 out of bounds for length 5"
    );
}

#[test]
fn heap_views_share_one_object() {
    let z = Zbuf::copy_from_slice(b"0123456789");
    let mut a = z.clone();
    assert_eq!(z.ref_count(), 2);
    let head = a.split_to(3);
    let tail = a.split_off(4);
    assert_eq!(
        (&head[..], &a[..], &tail[..]),
        (&b"012"[..], &b"3456"[..], &b"789"[..])
    );
    assert_eq!(z.ref_count(), 4);
    assert_eq!(a.iova(), z.iova() + 3);
    let mut h = head;
    assert!(h.try_unsplit(a).is_ok());
    assert_eq!(&h[..], b"0123456");
    assert!(h.try_unsplit(Zbuf::from_static(b"x")).is_err());
    drop((h, tail));
    assert_eq!(z.ref_count(), 1);
}

/// A receiver accounts the memory a slice keeps out of its pool: the whole object,
/// whatever the view's length.
#[test]
fn object_size_is_the_whole_object_behind_any_view() {
    let slab = small_slab();
    let _cache = slab.core_cache(0).unwrap();
    let mut m = crate::alloc(100).unwrap();
    m.extend_from_slice(&[7; 100]).unwrap();
    let z = m.freeze();
    let one = z.slice(10..11);
    assert_eq!(
        (one.len(), one.object_size()),
        (1, 64 * 1024),
        "the class size"
    );
    let heap = Zbuf::copy_from_slice(b"0123456789");
    assert_eq!(heap.slice(2..3).object_size(), 10, "a heap buffer's length");
    assert_eq!(ZbufMut::heap(4, 8).freeze().object_size(), 12);
}

#[test]
#[should_panic(expected = "Zbuf::split_to: position 11 out of bounds for length 10")]
fn out_of_bounds_split_panics_with_a_message() {
    let mut z = Zbuf::from_static(b"0123456789");
    let _ = z.split_to(11);
}

#[test]
fn heap_zbufmut_room_and_freeze() {
    let mut m = ZbufMut::heap(4, 8);
    assert_eq!(
        (m.headroom(), m.len(), m.tailroom(), m.capacity()),
        (4, 0, 8, 12)
    );
    m.extend_from_slice(b"body").unwrap();
    m.prepend(2).unwrap().copy_from_slice(b"h:");
    assert_eq!(&m[..], b"h:body");
    assert!(m.append(5).is_err());
    m.append(4).unwrap().copy_from_slice(b"tail");
    m.advance(2);
    let z = m.freeze();
    assert_eq!(&z[..], b"bodytail");
    let mut m = z.try_into_mut().unwrap();
    m[0] = b'B';
    m.clear();
    assert!(m.is_empty());
    assert_eq!(m.headroom(), 4, "prepend 2 then advance 2");
    assert_eq!(&ZbufMut::from_vec(vec![1, 2, 3])[..], &[1, 2, 3]);
}

#[test]
fn iovec_split_and_concat() {
    let mut v: IoVec = [
        Zbuf::from_static(b"abc"),
        Zbuf::from_static(b""),
        Zbuf::from_vec(b"defg".to_vec()),
    ]
    .into_iter()
    .collect();
    assert_eq!(v.num_segments(), 2, "empty segments are dropped");
    let head = v.split_to(4);
    assert_eq!(head.to_vec(), b"abcd");
    assert_eq!(v.to_vec(), b"efg");
    let mut all = head;
    all.append(v);
    assert_eq!(all.slice(2..6).to_vec(), b"cdef");
    let tail = all.split_off(5);
    assert_eq!(
        (all.to_vec(), tail.to_vec()),
        (b"abcde".to_vec(), b"fg".to_vec())
    );
    all.truncate(1);
    all.advance(1);
    assert!(all.is_empty());
    // Splitting off everything moves the segments as they are and leaves an empty vector
    // that still takes more.
    let mut v: IoVec = [Zbuf::from_static(b"xy"), Zbuf::from_vec(b"z".to_vec())]
        .into_iter()
        .collect();
    let head = v.split_to(3);
    assert_eq!((head.to_vec(), head.num_segments()), (b"xyz".to_vec(), 2));
    assert!(v.is_empty() && v.num_segments() == 0);
    v.push(Zbuf::from_static(b"w"));
    assert_eq!(v.split_to(1).to_vec(), b"w");
    assert!(v.split_to(0).is_empty());
}

#[test]
fn iovec_from_one_zbuf_is_new_plus_push() {
    let empty = IoVec::from(Zbuf::from_static(b""));
    assert!(empty.is_empty());
    assert_eq!(empty.num_segments(), 0, "an empty buffer makes no segment");
    let z = Zbuf::from_vec(b"payload".to_vec()).slice(1..5);
    let one = IoVec::from(z.clone());
    let mut pushed = IoVec::new();
    pushed.push(z);
    assert_eq!((one.len(), one.num_segments()), (4, 1));
    assert_eq!(one.to_vec(), pushed.to_vec());
    assert_eq!(one.to_vec(), b"aylo");
    // It grows like any io-vector: a contiguous neighbour merges into its one segment.
    let whole = Zbuf::from_vec(b"abcdef".to_vec());
    let mut v = IoVec::from(whole.slice(0..2));
    v.push(whole.slice(2..6));
    assert_eq!((v.to_vec(), v.num_segments()), (b"abcdef".to_vec(), 1));
}

#[test]
fn slab_objects_recycle_locally_remotely_and_after_the_slab_is_gone() {
    let slab = small_slab();
    let cache = slab.core_cache(0).unwrap();
    let objects = (2 << 20) / (64 * 1024);
    let mut held: Vec<Zbuf> = (0..objects)
        .map(|i| {
            let mut m = cache.alloc(8).unwrap();
            m.extend_from_slice(&(i as u64).to_le_bytes()).unwrap();
            m.freeze()
        })
        .collect();
    assert_eq!(
        cache.alloc(8).unwrap_err(),
        AllocError::Exhausted {
            class_size: 64 * 1024
        }
    );
    // Half go home from another thread.
    let remote: Vec<Zbuf> = held.drain(..objects / 2).collect();
    let s2 = slab.clone();
    std::thread::spawn(move || {
        let _c = s2.core_cache(1).unwrap();
        for (i, z) in remote.iter().enumerate() {
            assert_eq!(z[..], (i as u64).to_le_bytes());
        }
    })
    .join()
    .unwrap();
    assert_eq!(cache.stats().remote_frees, (objects / 2) as u64);
    // They are reusable here.
    let again: Vec<ZbufMut> = (0..objects / 2).map(|_| cache.alloc(8).unwrap()).collect();
    drop(again);
    assert_eq!(slab.leak_report().objects_in_use, objects - objects / 2);
    // Cache and slab go away first; the buffers keep the memory alive.
    drop(cache);
    drop(slab);
    for (i, z) in held.iter().enumerate() {
        assert_eq!(z[..], ((i + objects / 2) as u64).to_le_bytes());
    }
    std::thread::spawn(move || drop(held)).join().unwrap();
}

#[test]
fn external_free_runs_once() {
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    let data: &'static [u8] = b"ext";
    // SAFETY: static, never written.
    let z = unsafe {
        Zbuf::from_external(std::ptr::NonNull::from(data).cast(), 3, 0, move || {
            n2.fetch_add(1, Ordering::SeqCst);
        })
    };
    let c = z.clone();
    drop(z);
    assert_eq!(n.load(Ordering::SeqCst), 0);
    drop(c);
    assert_eq!(n.load(Ordering::SeqCst), 1);
}

/// Zone memory from a `zone_source`, like `ProvidedZone::new` allows: fresh, uninitialized
/// heap memory.
fn provided_slab() -> Slab {
    Slab::new(
        SlabConfig::new()
            .size_classes(&[1 << 20])
            .headroom(64)
            .max_memory(2 << 20)
            .cache_size(4)
            .max_cores(2)
            .zone_source(|| {
                let layout = std::alloc::Layout::from_size_align(crate::ZONE_SIZE, 64).unwrap();
                // SAFETY: non-zero size.
                let p = unsafe { std::alloc::alloc(layout) };
                let ptr = std::ptr::NonNull::new(p).ok_or("out of memory")?;
                let addr = p as usize;
                // SAFETY: fresh heap memory of ZONE_SIZE bytes, ours alone until `release`,
                // which frees it once.
                Ok(unsafe {
                    crate::ProvidedZone::new(ptr, crate::ZONE_SIZE, None, move || {
                        std::alloc::dealloc(addr as *mut u8, layout)
                    })
                })
            }),
    )
    .unwrap()
}

/// Safe code reads the head- and tailroom a slab buffer hands out (`append`, `prepend`,
/// `try_into_mut`): for a provided zone (whose contract does not promise initialized
/// memory) those bytes were uninitialized, a read of which Miri reports as UB.
#[test]
fn provided_zone_bytes_are_initialized_before_use() {
    let slab = provided_slab();
    let cache = slab.core_cache(0).unwrap();
    let mut m = cache.alloc(16).unwrap();
    let tail: Vec<u8> = m.append(16).unwrap().to_vec();
    let head: Vec<u8> = m.prepend(64).unwrap().to_vec();
    assert_eq!((tail, head), (vec![0; 16], vec![0; 64]));
    drop((m, cache, slab));
}
