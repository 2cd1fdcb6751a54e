//! Slab behaviour: hugepage and fallback paths, configuration errors, exhaustion, core
//! caches, recycling, statistics, lifetimes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use zbuf::{
    AllocError, Backing, HugepageMode, IovaKind, NoRoom, Slab, SlabConfig, SlabError, Zbuf,
    ZbufMut, ZONE_SIZE,
};

const NEEDS_HUGEPAGES: &str =
    "this test needs free 2 MiB hugepages (sysctl vm.nr_hugepages) and hugetlbfs at /dev/hugepages";

fn normal() -> SlabConfig {
    SlabConfig::new()
        .hugepages(HugepageMode::Never)
        .max_memory(16 << 20)
}

/// Kernel page size of the mapping that starts at `va`, from /proc/self/smaps. Other
/// tests map and unmap concurrently, which can make one read of smaps miss an entry:
/// retry a few times.
fn kernel_page_size_kb(va: usize) -> Option<u64> {
    (0..5).find_map(|_| kernel_page_size_kb_once(va))
}

fn kernel_page_size_kb_once(va: usize) -> Option<u64> {
    // The mapping that contains `va`: normal-page zones are anonymous mappings the kernel
    // may merge with a neighbour (two slabs made back to back), so the zone need not start
    // its own line in smaps.
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let contains = |l: &str| {
        let range = l.split_whitespace().next()?;
        let (a, b) = range.split_once('-')?;
        let (a, b) = (
            usize::from_str_radix(a, 16).ok()?,
            usize::from_str_radix(b, 16).ok()?,
        );
        Some(a <= va && va < b)
    };
    let mut lines = smaps.lines().skip_while(|l| contains(l) != Some(true));
    lines.next()?;
    lines
        .take_while(|l| !l.contains('-') || l.contains(':'))
        .find(|l| l.starts_with("KernelPageSize:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

fn check_hugepage_zone(slab: &Slab) {
    let cache = slab.core_cache(0).unwrap();
    let mut m = cache.alloc(1000).unwrap();
    m.extend_from_slice(&[0x5a; 1000]).unwrap();
    let z = m.freeze();
    let zones = slab.zones();
    assert_eq!(zones.len(), 1);
    let zone = &zones[0];
    assert_eq!(zone.backing, Backing::Hugepage);
    assert_eq!(zone.len, ZONE_SIZE);
    assert_eq!(
        zone.va % ZONE_SIZE,
        0,
        "a hugepage mapping is 2 MiB aligned"
    );
    assert_eq!(
        kernel_page_size_kb(zone.va),
        Some(2048),
        "the kernel backs it with a 2 MiB page"
    );
    assert_eq!(zone.objects, ZONE_SIZE / 2048);
    // Object i's body starts at headroom 128 inside the object.
    let obj_index = (z.addr() - zone.va) / 2048;
    assert_eq!(z.addr() - zone.va - obj_index * 2048, 128);
    assert_eq!(z.iova(), zone.iova + (obj_index * 2048 + 128) as u64);
    if is_root() {
        assert_eq!(
            zone.iova_kind,
            IovaKind::Physical,
            "root can read PFNs from pagemap"
        );
        assert_eq!(
            zone.iova % ZONE_SIZE as u64,
            0,
            "a 2 MiB page is physically aligned"
        );
        assert_ne!(zone.iova, zone.va as u64);
    } else {
        assert_eq!(zone.iova_kind, IovaKind::Virtual);
    }
    assert!(z.iter().all(|&b| b == 0x5a));
    let st = slab.stats();
    assert_eq!(st.hugepage_zones, 1);
    assert_eq!(st.in_use(), 1);
}

#[test]
fn anonymous_hugepage_zone_is_a_real_hugepage() {
    let slab = Slab::new(
        SlabConfig::new()
            .require_hugepages(true)
            .max_memory(4 << 20),
    )
    .unwrap();
    assert!(slab.uses_hugepages());
    check_hugepage_zone(&slab);
}

#[test]
fn hugetlbfs_file_zone_is_a_real_hugepage_and_leaves_no_file() {
    let slab = Slab::new(
        SlabConfig::new()
            .require_hugepages(true)
            .hugetlbfs_path("/dev/hugepages")
            .file_prefix("lzb")
            .max_memory(4 << 20),
    )
    .expect(NEEDS_HUGEPAGES);
    check_hugepage_zone(&slab);
    let mine = format!("lzb-{}-", std::process::id());
    let left: Vec<_> = std::fs::read_dir("/dev/hugepages")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&mine))
        .collect();
    assert!(
        left.is_empty(),
        "hugetlbfs files are unlinked after mapping: {left:?}"
    );
}

#[test]
fn require_hugepages_refuses_missing_hugetlbfs_path() {
    let err = Slab::new(
        normal()
            .require_hugepages(true)
            .hugetlbfs_path("/nonexistent/lzb"),
    )
    .unwrap_err();
    match &err {
        SlabError::HugepagesUnavailable(msg) => assert!(msg.contains("/nonexistent/lzb"), "{msg}"),
        e => panic!("unexpected {e:?}"),
    }
    assert!(err
        .to_string()
        .contains("hugepages required but unavailable"));
}

#[test]
fn require_hugepages_refuses_a_directory_that_is_not_hugetlbfs() {
    let err = Slab::new(normal().require_hugepages(true).hugetlbfs_path("/proc")).unwrap_err();
    match err {
        SlabError::HugepagesUnavailable(msg) => assert!(msg.contains("not a hugetlbfs"), "{msg}"),
        e => panic!("unexpected {e:?}"),
    }
}

#[test]
fn prefer_falls_back_to_normal_pages_with_one_warning() {
    let cfg = SlabConfig::new()
        .hugepages(HugepageMode::Prefer)
        .hugetlbfs_path("/nonexistent/lzb");
    let a = Slab::new(cfg.clone()).unwrap();
    let b = Slab::new(cfg).unwrap();
    assert!(!a.uses_hugepages());
    assert_eq!(
        zbuf::hugepage_fallback_warnings(),
        1,
        "warned exactly once per process"
    );
    let cache = a.core_cache(0).unwrap();
    let m = cache.alloc(10).unwrap();
    let zone = &a.zones()[0];
    assert_eq!(zone.backing, Backing::Normal);
    assert_eq!(zone.iova_kind, IovaKind::Virtual);
    assert_eq!(zone.iova, zone.va as u64);
    let z = m.freeze();
    assert_eq!(z.iova(), z.addr() as u64, "VA stands in for the IOVA");
    assert_eq!((z.addr() - zone.va) % 2048, 128);
    assert_eq!(kernel_page_size_kb(zone.va), Some(4));
    drop((z, cache, b));
}

#[test]
fn never_mode_uses_normal_pages_without_warning_or_probe() {
    let slab = Slab::new(normal()).unwrap();
    assert!(!slab.uses_hugepages());
    assert!(
        slab.zones().is_empty(),
        "no zone is mapped before the first allocation"
    );
    let cache = slab.core_cache(0).unwrap();
    let _m = cache.alloc(10).unwrap();
    assert_eq!(slab.zones()[0].backing, Backing::Normal);
}

#[test]
fn bad_configs_are_rejected_with_a_message() {
    let bad = [
        normal().size_classes(&[]),
        normal().size_classes(&[100]),
        normal().size_classes(&[0]),
        normal().size_classes(&[4 << 20]),
        normal().size_classes(&[2048, 2048]),
        normal().size_classes(&[2048]).headroom(2048),
        normal().max_memory(ZONE_SIZE - 1),
        normal().max_zones(0),
        normal().max_cores(0),
        normal().max_cores(zbuf::MAX_CORES + 1),
        normal().cache_size(0),
        normal().file_prefix("a/b"),
        normal().file_prefix(""),
    ];
    for cfg in bad {
        match Slab::new(cfg.clone()) {
            Err(SlabError::Config(msg)) => assert!(!msg.is_empty()),
            other => panic!("{cfg:?} gave {other:?}"),
        }
    }
}

#[test]
fn size_classes_are_chosen_smallest_first_and_sorted() {
    let slab = Slab::new(normal().size_classes(&[4096, 2048, 16384])).unwrap();
    let cache = slab.core_cache(0).unwrap();
    assert_eq!(cache.alloc(100).unwrap().capacity(), 2048);
    assert_eq!(cache.alloc(2048 - 128).unwrap().capacity(), 2048);
    assert_eq!(cache.alloc(2048 - 127).unwrap().capacity(), 4096);
    assert_eq!(cache.alloc_with_headroom(0, 4096).unwrap().capacity(), 4096);
    assert_eq!(cache.alloc(9000).unwrap().capacity(), 16384);
    let m = cache.alloc(100).unwrap();
    assert_eq!((m.headroom(), m.len(), m.tailroom()), (128, 0, 2048 - 128));
}

#[test]
fn too_large_requests_fail_and_are_counted() {
    let slab = Slab::new(normal().size_classes(&[2048, 4096])).unwrap();
    let cache = slab.core_cache(0).unwrap();
    assert_eq!(
        cache.alloc(4096).unwrap_err(),
        AllocError::TooLarge {
            requested: 4096 + 128,
            largest: 4096
        }
    );
    assert!(matches!(
        cache.alloc_with_headroom(usize::MAX, 1),
        Err(AllocError::TooLarge { .. })
    ));
    assert_eq!(cache.stats().alloc_failures, 2);
    assert_eq!(slab.stats().alloc_failures(), 2);
}

#[test]
fn exhaustion_returns_an_error_and_recovers_after_free() {
    let slab = Slab::new(normal().size_classes(&[2048]).max_memory(ZONE_SIZE)).unwrap();
    let cache = slab.core_cache(0).unwrap();
    let mut held = Vec::new();
    let err = loop {
        match cache.alloc(1) {
            Ok(m) => held.push(m),
            Err(e) => break e,
        }
        assert!(
            held.len() <= ZONE_SIZE / 2048,
            "more objects than the limit allows"
        );
    };
    assert_eq!(err, AllocError::Exhausted { class_size: 2048 });
    assert_eq!(held.len(), ZONE_SIZE / 2048);
    assert_eq!(cache.alloc(1).unwrap_err(), err, "stays exhausted");
    let st = slab.stats();
    assert_eq!(st.zones, 1);
    assert_eq!(st.in_use(), 1024);
    assert_eq!(st.alloc_failures(), 2);
    held.pop();
    assert!(cache.alloc(1).is_ok(), "a freed object is reusable");
}

#[test]
fn exhausted_require_mode_zone_hook_rejection_is_an_error() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let slab = Slab::new(normal().zone_hook(move |z| {
        c.fetch_add(1, Ordering::SeqCst);
        if z.object_size == 4096 {
            Err(format!("refusing zone {} at {:#x}", z.index, z.va))
        } else {
            Ok(())
        }
    }))
    .unwrap();
    assert_eq!(slab.reserve(2048, 2), Ok(2));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let cache = slab.core_cache(0).unwrap();
    match cache.alloc(3000) {
        Err(AllocError::ZoneRejected { reason }) => assert!(reason.contains("refusing zone")),
        other => panic!("{other:?}"),
    }
    assert_eq!(slab.zones().len(), 2, "the rejected zone was unmapped");
    assert!(slab.zones().iter().all(|z| z.object_size == 2048));
    assert!(cache.alloc(100).is_ok());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "no new zone for the 2 KiB class"
    );
}

#[test]
fn reserve_stops_at_the_limit() {
    let slab = Slab::new(normal().max_memory(3 * ZONE_SIZE)).unwrap();
    assert_eq!(slab.reserve(2048, 5), Ok(3));
    assert_eq!(
        slab.reserve(2048, 1),
        Err(AllocError::Exhausted { class_size: 2048 })
    );
    assert_eq!(
        slab.reserve(1 << 30, 1),
        Err(AllocError::TooLarge {
            requested: 1 << 30,
            largest: 65536
        })
    );
}

#[test]
fn core_cache_registration_errors() {
    let slab = Slab::new(normal().max_cores(2)).unwrap();
    assert!(matches!(
        slab.core_cache(2),
        Err(SlabError::CoreOutOfRange { core: 2, max: 2 })
    ));
    let c0 = slab.core_cache(0).unwrap();
    assert_eq!(zbuf::current_core(), Some(0));
    let extra = slab.core_cache(1).unwrap();
    assert!(
        c0.is_current() && !extra.is_current(),
        "the first cache stays current"
    );
    assert_eq!(zbuf::current_core(), Some(0));
    let z = extra.alloc(5).unwrap().freeze();
    drop(extra);
    drop(z); // home core 1 is unowned now: straight to the pool
    let s2 = slab.clone();
    std::thread::spawn(move || {
        assert!(matches!(s2.core_cache(0), Err(SlabError::CoreTaken(0))));
        assert!(s2.core_cache(1).is_ok());
    })
    .join()
    .unwrap();
    drop(c0);
    assert_eq!(zbuf::current_core(), None);
    let c1 = slab.core_cache(1).unwrap();
    assert_eq!(c1.core(), 1);
}

#[test]
fn thread_local_alloc_works_only_on_registered_threads() {
    std::thread::spawn(|| assert_eq!(zbuf::alloc(10).unwrap_err(), AllocError::NoCache))
        .join()
        .unwrap();
    let slab = Slab::new(normal()).unwrap();
    let cache = slab.core_cache(3).unwrap();
    let mut m = zbuf::alloc(10).unwrap();
    m.extend_from_slice(b"0123456789").unwrap();
    assert_eq!(m.headroom(), 128);
    let h = zbuf::alloc_with_headroom(0, 10).unwrap();
    assert_eq!(h.headroom(), 0);
    assert_eq!(cache.stats().allocs, 2);
    drop((m, h));
    assert_eq!(cache.stats().local_frees, 2);
    drop(cache);
    assert_eq!(zbuf::alloc(10).unwrap_err(), AllocError::NoCache);
}

#[test]
fn local_free_is_reused_immediately() {
    let slab = Slab::new(normal()).unwrap();
    let cache = slab.core_cache(0).unwrap();
    let a = cache.alloc(10).unwrap().freeze();
    let addr = a.addr();
    let b = a.clone();
    drop(a);
    assert_eq!(cache.stats().local_frees, 0, "one reference left");
    drop(b);
    assert_eq!(cache.stats().local_frees, 1);
    assert_eq!(
        cache.alloc(10).unwrap().freeze().addr(),
        addr,
        "LIFO reuse of a hot object"
    );
}

#[test]
fn cross_core_free_goes_home_through_the_queue() {
    let slab = Slab::new(normal()).unwrap();
    let cache = slab.core_cache(0).unwrap();
    let mut m = cache.alloc(100).unwrap();
    m.extend_from_slice(&[7; 100]).unwrap();
    let z = m.freeze();
    let addr = z.addr();
    let other = slab.clone();
    std::thread::spawn(move || {
        let _c1 = other.core_cache(1).unwrap();
        assert_eq!(z.len(), 100);
        drop(z); // released on core 1, home is core 0
    })
    .join()
    .unwrap();
    assert_eq!(cache.stats().remote_frees, 1);
    assert_eq!(cache.stats().local_frees, 0);
    assert_eq!(slab.stats().remote_frees(), 1);
    assert_eq!(cache.drain_remote(), 1);
    assert_eq!(
        cache.alloc(100).unwrap().freeze().addr(),
        addr,
        "the object came home"
    );
}

#[test]
fn allocation_drains_the_return_queue_when_the_local_list_is_empty() {
    let slab = Slab::new(normal().size_classes(&[2048]).max_memory(ZONE_SIZE)).unwrap();
    let cache = slab.core_cache(0).unwrap();
    let all: Vec<ZbufMut> = (0..1024).map(|_| cache.alloc(1).unwrap()).collect();
    assert!(cache.alloc(1).is_err());
    std::thread::spawn(move || drop(all)).join().unwrap();
    assert_eq!(cache.stats().remote_frees, 1024);
    let again: Vec<ZbufMut> = (0..1024).map(|_| cache.alloc(1).unwrap()).collect();
    assert_eq!(again.len(), 1024);
}

#[test]
fn dropping_a_cache_returns_its_objects_to_the_shared_pool() {
    let slab = Slab::new(normal().size_classes(&[2048])).unwrap();
    let cache = slab.core_cache(0).unwrap();
    let keep = cache.alloc(1).unwrap().freeze();
    drop(cache);
    let st = slab.stats();
    assert_eq!(st.classes[0].in_shared_pool, 1023);
    assert_eq!(st.in_use(), 1);
    // Released on a thread without a cache, home unowned: straight to the pool.
    std::thread::spawn(move || drop(keep)).join().unwrap();
    let st = slab.stats();
    assert_eq!(st.classes[0].in_shared_pool, 1024);
    assert_eq!(st.in_use(), 0);
    assert!(slab.leak_report().is_clean());
}

#[test]
fn leak_report_names_zones_with_outstanding_objects() {
    let slab = Slab::new(normal()).unwrap();
    let cache = slab.core_cache(0).unwrap();
    let a = cache.alloc(10).unwrap();
    let b = cache.alloc(3000).unwrap().freeze();
    let b2 = b.clone();
    let report = slab.leak_report();
    assert_eq!(report.objects_in_use, 2);
    assert_eq!(report.bytes_in_use, 2048 + 4096);
    assert_eq!(report.zones.len(), 2);
    assert!(
        report
            .to_string()
            .contains("2 objects (6144 bytes) still in use"),
        "{report}"
    );
    let st = slab.stats();
    assert_eq!(
        st.classes
            .iter()
            .map(|c| (c.object_size, c.in_use))
            .collect::<Vec<_>>(),
        vec![(2048, 1), (4096, 1), (16384, 0), (65536, 0)]
    );
    drop((a, b, b2));
    assert!(slab.leak_report().is_clean());
    assert_eq!(slab.leak_report().to_string(), "zbuf: no objects in use");
}

#[test]
fn slab_dropped_while_buffers_are_alive_stays_mapped_until_they_go() {
    let slab = Slab::new(normal()).unwrap();
    let cache = slab.core_cache(0).unwrap();
    let mut m = cache.alloc(4).unwrap();
    m.extend_from_slice(b"live").unwrap();
    let z = m.freeze();
    let clone = z.clone();
    drop(cache);
    drop(slab); // warns: 1 object still in use
    assert_eq!(&z[..], b"live", "memory is still mapped");
    std::thread::spawn(move || {
        assert_eq!(&clone[..], b"live");
        drop(clone);
    })
    .join()
    .unwrap();
    assert_eq!(&z[..], b"live");
    drop(z); // the last reference unmaps the slab
}

#[test]
fn zbufmut_prepend_append_and_room_errors() {
    let slab = Slab::new(normal().size_classes(&[2048])).unwrap();
    let cache = slab.core_cache(0).unwrap();
    let mut m = cache.alloc(100).unwrap();
    m.extend_from_slice(b"payload").unwrap();
    m.prepend(4).unwrap().copy_from_slice(b"hdr:");
    assert_eq!(&m[..], b"hdr:payload");
    assert_eq!(m.headroom(), 124);
    assert_eq!(
        m.prepend(200).unwrap_err(),
        NoRoom {
            requested: 200,
            available: 124
        }
    );
    let tail = m.tailroom();
    assert_eq!(tail, 2048 - 128 - 7);
    assert_eq!(
        m.append(tail + 1).unwrap_err(),
        NoRoom {
            requested: tail + 1,
            available: tail
        }
    );
    m.append(3).unwrap().copy_from_slice(b"!!!");
    assert_eq!(&m[..], b"hdr:payload!!!");
    m[0] = b'H';
    m.advance(4);
    assert_eq!(&m[..], b"payload!!!");
    assert_eq!(m.headroom(), 128);
    m.truncate(7);
    let iova = m.iova();
    let z = m.freeze();
    assert_eq!(&z[..], b"payload");
    assert_eq!(z.iova(), iova);
}

#[test]
fn try_into_mut_only_for_unique_writable_buffers() {
    let slab = Slab::new(normal()).unwrap();
    let cache = slab.core_cache(0).unwrap();
    let mut m = cache.alloc(10).unwrap();
    m.extend_from_slice(b"0123456789").unwrap();
    let mut z = m.freeze();
    let tail = z.split_off(5);
    let z = z.try_into_mut().unwrap_err(); // `tail` shares the object
    drop(tail);
    let mut m = z.try_into_mut().unwrap();
    assert_eq!(&m[..], b"01234");
    assert_eq!(m.headroom(), 128);
    m[0] = b'x';
    assert_eq!(&m.freeze()[..], b"x1234");
    assert!(Zbuf::from_static(b"static").try_into_mut().is_err());
    assert!(Zbuf::from_vec(vec![1, 2]).try_into_mut().is_ok());
}

#[test]
fn external_buffers_call_free_once_on_the_last_drop() {
    static DATA: [u8; 8] = *b"mbufdata";
    let freed = Arc::new(AtomicUsize::new(0));
    let f = freed.clone();
    let ptr = std::ptr::NonNull::from(&DATA[..]).cast::<u8>();
    // SAFETY: DATA is static and never written.
    let z = unsafe {
        Zbuf::from_external(ptr, DATA.len(), 0x1000, move || {
            f.fetch_add(1, Ordering::SeqCst);
        })
    };
    assert_eq!(z.iova(), 0x1000);
    let mut a = z.clone();
    let b = a.split_off(4);
    assert_eq!(b.iova(), 0x1004);
    drop(z);
    drop(a);
    assert_eq!(freed.load(Ordering::SeqCst), 0);
    std::thread::spawn(move || {
        assert_eq!(&b[..], b"data");
        drop(b)
    })
    .join()
    .unwrap();
    assert_eq!(freed.load(Ordering::SeqCst), 1);
}

#[test]
fn copy_paths_are_counted_and_zero_copy_paths_are_not() {
    let before = zbuf::thread_copy_stats();
    let z = Zbuf::copy_from_slice(b"hello world");
    let mut iov = zbuf::IoVec::from(z.slice(0..5));
    iov.push(z.slice(5..));
    let mut c = z.clone();
    let _ = c.split_to(3);
    let _ = iov.slice(1..7);
    let _ = iov.clone().split_to(6);
    let mid = zbuf::thread_copy_stats();
    assert_eq!(mid.bytes - before.bytes, 11, "only copy_from_slice copied");
    assert_eq!(mid.copies - before.copies, 1);
    assert_eq!(iov.to_vec(), b"hello world");
    let mut buf = [0u8; 4];
    assert_eq!(iov.copy_to_slice(&mut buf), 4);
    let mut m = ZbufMut::heap(0, 8);
    m.extend_from_slice(b"abc").unwrap();
    let after = zbuf::thread_copy_stats();
    assert_eq!(after.bytes - mid.bytes, 11 + 4 + 3);
    assert_eq!(after.copies - mid.copies, 3);
    assert!(zbuf::copy_stats().bytes >= after.bytes - before.bytes);
}

#[test]
fn memory_pressure_makes_other_cores_give_back_cached_objects() {
    // One zone of 1024 objects; core 1 caches up to 512 free ones locally.
    let slab = Slab::new(
        normal()
            .size_classes(&[2048])
            .max_memory(ZONE_SIZE)
            .cache_size(512),
    )
    .unwrap();
    let (to_1, at_1) = std::sync::mpsc::channel::<()>();
    let (to_0, at_0) = std::sync::mpsc::channel::<()>();
    let s1 = slab.clone();
    let t = std::thread::spawn(move || {
        let c1 = s1.core_cache(1).unwrap();
        // Take 400 and free them: they stay in core 1's local list.
        let bufs: Vec<ZbufMut> = (0..400).map(|_| c1.alloc(1).unwrap()).collect();
        let keep = c1.alloc(1).unwrap();
        drop(bufs);
        to_0.send(()).unwrap();
        at_1.recv().unwrap(); // core 0 hit exhaustion
        drop(keep); // a local free under pressure returns the whole list
        to_0.send(()).unwrap();
        at_1.recv().unwrap();
    });
    let c0 = slab.core_cache(0).unwrap();
    at_0.recv().unwrap();
    let mut held = Vec::new();
    while let Ok(m) = c0.alloc(1) {
        held.push(m);
    }
    assert!(held.len() < 1024 - 400, "core 1 still caches its objects");
    to_1.send(()).unwrap();
    at_0.recv().unwrap();
    let more = (0..401).map(|_| c0.alloc(1)).filter(Result::is_ok).count();
    assert_eq!(more, 401, "core 1 gave its cached objects back");
    to_1.send(()).unwrap();
    t.join().unwrap();
}

#[test]
fn release_hook_sees_every_accepted_zone_once_before_unmapping() {
    let released = Arc::new(std::sync::Mutex::new(Vec::new()));
    let r = released.clone();
    let slab = Slab::new(
        normal()
            .zone_hook(|z| {
                if z.object_size == 4096 {
                    Err("no 4 KiB zones".into())
                } else {
                    Ok(())
                }
            })
            .zone_release_hook(move |z| {
                r.lock().unwrap().push((z.index, z.va, z.object_size));
            }),
    )
    .unwrap();
    assert_eq!(slab.reserve(2048, 2), Ok(2));
    assert!(slab.reserve(4096, 1).is_err(), "rejected zone");
    let cache = slab.core_cache(0).unwrap();
    let held = cache.alloc(100).unwrap().freeze();
    let zones = slab.zones();
    drop(cache);
    drop(slab);
    assert!(
        released.lock().unwrap().is_empty(),
        "a live buffer keeps the slab's memory (and registrations)"
    );
    drop(held);
    let mut got = released.lock().unwrap().clone();
    got.sort_unstable();
    let want: Vec<_> = zones
        .iter()
        .map(|z| (z.index, z.va, z.object_size))
        .collect();
    assert_eq!(got, want, "each accepted zone once; the rejected one never");
}

#[test]
fn leased_zones_are_whole_out_of_the_free_lists_and_come_back_on_drop() {
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let slab = Slab::new(normal().size_classes(&[2048, 16384]).zone_hook(move |_| {
        s.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }))
    .unwrap();
    let cache = slab.core_cache(0).unwrap();
    let lease = slab.lease_zones(2000, 2).unwrap();
    assert_eq!(lease.zones().len(), 2);
    assert_eq!(lease.object_size(), 2048);
    assert_eq!(lease.objects(), 2 * ZONE_SIZE / 2048);
    assert_eq!(
        seen.load(Ordering::SeqCst),
        2,
        "the zone hook saw the leased zones"
    );
    assert_eq!(slab.leak_report().objects_in_use, lease.objects());
    assert_eq!(slab.stats().classes[0].in_shared_pool, 0);
    // Allocation never hands out leased memory: it maps a third zone.
    let z = cache.alloc(100).unwrap().freeze();
    assert!(lease
        .zones()
        .iter()
        .all(|l| z.addr() < l.va || z.addr() >= l.va + l.len));
    assert_eq!(slab.zones().len(), 3);
    let pool_before = slab.stats().classes[0].in_shared_pool;
    drop(lease);
    assert_eq!(slab.leak_report().objects_in_use, 1, "only the buffer");
    assert_eq!(
        slab.stats().classes[0].in_shared_pool - pool_before,
        2 * ZONE_SIZE / 2048,
        "leased objects went back to the shared pool"
    );
    drop(z);
    // The slab outlives a lease's handle; the memory is reused.
    let many: Vec<_> = (0..1500).map(|_| cache.alloc(100).unwrap()).collect();
    assert_eq!(slab.zones().len(), 3, "returned objects were reused");
    drop(many);
    assert!(slab.leak_report().is_clean());
}

#[test]
fn lease_errors_return_partial_zones() {
    let slab = Slab::new(normal().max_zones(3)).unwrap();
    assert!(matches!(
        slab.lease_zones(1 << 20, 1),
        Err(AllocError::TooLarge { .. })
    ));
    match slab.lease_zones(2048, 5) {
        Err(AllocError::Exhausted { class_size: 2048 }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(slab.zones().len(), 3, "mapped before the limit");
    assert!(slab.leak_report().is_clean(), "and given back to the pool");
    let cache = slab.core_cache(0).unwrap();
    assert!(cache.alloc(100).is_ok(), "usable after the failed lease");
    let lease = slab.lease_zones(2048, 0).unwrap();
    assert_eq!(lease.objects(), 0, "an empty lease is fine");
}
