//! The `dpdk` feature against a real EAL: zone registration, receive into zone memory,
//! zero-copy mbuf <-> Zbuf, extbuf transmit chains, and an end-to-end exchange between
//! two DPDK processes over net_memif.
//!
//! EAL initialises once per process, so every scenario runs in a child process: this
//! test binary re-executes itself with `LDV_ZBUF_SCENARIO=<name>` and runs the ignored
//! `scenario_child` test, which prints `OK ...` on success (any failed assertion in the
//! child panics: a non-zero exit). Needs root and free 2 MiB hugepages.
#![cfg(feature = "dpdk")]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dpdk_sys::{ffi, Eal, Mbuf, Mempool, PoolConfig, Port, PortConf};
use zbuf::dpdk::{
    mbuf_to_zbuf, mbuf_to_zbuf_copied, DmaRegistry, RxPool, RxPoolConfig, TxChains, TxConfig,
    TxError, TxOffloadRequest,
};
use zbuf::{
    copy_stats, AllocError, HugepageMode, IoVec, Slab, SlabConfig, Zbuf, ZoneInfo, ZONE_SIZE,
};

const ENV: &str = "LDV_ZBUF_SCENARIO";
const ENV_EAL: &str = "LDV_ZBUF_EAL";
const ENV_ARG: &str = "LDV_ZBUF_ARG";
/// Hard limit per child process.
const LIMIT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------- parent side

fn prefix(tag: &str) -> String {
    format!("ldv-{}-{tag}", std::process::id())
}

fn eal_base(tag: &str) -> Vec<String> {
    vec![
        "--no-pci".into(),
        "--in-memory".into(),
        "--no-telemetry".into(),
        "-m".into(),
        "64".into(),
        "--lcores=0@(0,1)".into(),
        format!("--file-prefix={}", prefix(tag)),
    ]
}

struct Child {
    child: std::process::Child,
    what: String,
}

fn spawn(scenario: &str, eal: &[String], arg: &str) -> Child {
    let exe = std::env::current_exe().expect("test binary path");
    let child = Command::new(exe)
        .args(["scenario_child", "--exact", "--ignored", "--nocapture"])
        .env(ENV, scenario)
        .env(ENV_EAL, eal.join("\u{1f}"))
        .env(ENV_ARG, arg)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the test binary");
    Child {
        child,
        what: format!("{scenario} {arg}"),
    }
}

impl Child {
    /// Waits (killing the child past `LIMIT`) and returns its `OK` line.
    fn ok(mut self) -> String {
        let end = Instant::now() + LIMIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break Some(s);
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = self.child.wait_with_output().expect("output");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let ok = stdout
            .lines()
            .find(|l| l.starts_with("OK "))
            .map(str::to_owned);
        match (status, ok) {
            (Some(s), Some(line)) if s.success() => {
                println!("{}: {line}", self.what);
                line
            }
            _ => panic!(
                "scenario {} failed (status {status:?})\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
                self.what
            ),
        }
    }
}

fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line}"))
}

#[test]
fn registry_registers_every_zone_and_unregisters_it_with_the_slab() {
    let ok = spawn("registry", &eal_base("reg"), "").ok();
    assert!(ok.contains("registry ok"), "{ok}");
}

#[test]
fn dpdk_memory_slab_takes_its_zones_from_eal_memzones() {
    let ok = spawn("dpdk-memory", &eal_base("dmem"), "").ok();
    assert!(ok.contains("dpdk memory ok"), "{ok}");
}

#[test]
fn registration_beyond_dpdk_memseg_lists_is_a_clean_rejection() {
    let ok = spawn("registry-limit", &eal_base("reglim"), "").ok();
    assert!(field(&ok, "registered") >= 32, "{ok}");
    assert!(ok.contains("RTE_MAX_MEMSEG_LISTS"), "{ok}");
}

#[test]
fn rx_pool_buffers_are_zone_objects_and_convert_without_copying() {
    let ok = spawn("rx", &eal_base("rx"), "").ok();
    assert!(ok.contains("rx ok"), "{ok}");
}

#[test]
fn tx_chains_attach_payload_and_release_it_once_per_segment() {
    let ok = spawn("tx", &eal_base("tx"), "").ok();
    assert!(ok.contains("tx ok"), "{ok}");
}

/// Two processes over memif: every received payload byte lies in a zone of the
/// receiver's slab, nothing is copied, the sender's buffers are released exactly once
/// per attached segment and only after transmission, the receiver's buffers go back to
/// the mempool only when the consumer drops them, and nothing leaks on either side.
/// A built chain's attached payload segments are the application's `Zbuf` bytes, shared
/// and read-only: safe `Mbuf` write access must not reach them (it would write under
/// live `&[u8]` borrows of the same bytes, or into read-only `'static` memory).
#[test]
fn tx_chain_payload_is_not_writable_through_the_mbuf() {
    let ok = spawn("tx-shared", &eal_base("txsh"), "").ok();
    assert!(ok.contains("tx shared ok"), "{ok}");
}

#[test]
fn memif_end_to_end_zero_copy() {
    let sock = format!("/tmp/ldv-zbuf-memif-{}.sock", std::process::id());
    let vdev =
        |role: &str| format!("--vdev=net_memif0,role={role},socket={sock},socket-abstract=no");
    let mut server = eal_base("memif-rx");
    server.push(vdev("server"));
    let mut client = eal_base("memif-tx");
    client.push(vdev("client"));
    let rx = spawn("memif-rx", &server, &sock);
    let tx = spawn("memif-tx", &client, &sock);
    let tx_ok = tx.ok();
    let rx_ok = rx.ok();
    let _ = std::fs::remove_file(&sock);
    assert_eq!(field(&rx_ok, "frames"), FRAMES as u64, "{rx_ok}");
    assert_eq!(field(&rx_ok, "copied"), 0, "{rx_ok}");
    assert_eq!(field(&tx_ok, "copied"), 0, "{tx_ok}");
    assert_eq!(field(&tx_ok, "attaches"), field(&tx_ok, "frees"), "{tx_ok}");
    assert_eq!(field(&tx_ok, "attaches"), 2 * FRAMES as u64, "{tx_ok}");
}

// ---------------------------------------------------------------- child side

/// Entry point of the child processes (ignored in normal runs; see the module docs).
#[test]
#[ignore = "child-process entry point, run by the other tests"]
fn scenario_child() {
    let Ok(name) = std::env::var(ENV) else {
        return;
    };
    let eal_args: Vec<String> = std::env::var(ENV_EAL)
        .unwrap_or_default()
        .split('\u{1f}')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let arg = std::env::var(ENV_ARG).unwrap_or_default();
    let eal = Eal::init(eal_args).unwrap_or_else(|e| panic!("EAL init: {e}"));
    let msg = match name.as_str() {
        "registry" => registry(&eal),
        "registry-limit" => registry_limit(&eal),
        "dpdk-memory" => dpdk_memory(&eal),
        "rx" => rx(&eal),
        "tx" => tx(&eal),
        "tx-shared" => tx_shared(&eal),
        "memif-rx" => memif_rx(&eal, &arg),
        "memif-tx" => memif_tx(&eal, &arg),
        other => panic!("unknown scenario {other}"),
    };
    println!("OK {msg}");
}

fn slab_cfg() -> SlabConfig {
    SlabConfig::new()
        .max_memory(64 << 20)
        .hugepages(HugepageMode::Require)
}

fn in_zones(zones: &[ZoneInfo], addr: usize, len: usize) -> bool {
    zones
        .iter()
        .any(|z| addr >= z.va && addr + len <= z.va + z.len)
}

fn dpdk_knows(addr: usize) -> bool {
    // SAFETY: EAL is initialised; the lookup only reads DPDK's memory configuration.
    !unsafe { ffi::rte_mem_virt2memseg_list(addr as *const _) }.is_null()
}

fn registry(eal: &Eal) -> String {
    let reg = DmaRegistry::new(eal);
    let slab = Slab::new(reg.slab_config(slab_cfg())).unwrap();
    let cache = slab.core_cache(0).unwrap();
    let a = cache.alloc(1000).unwrap().freeze();
    let b = cache.alloc(10_000).unwrap().freeze();
    assert_eq!(slab.zones().len(), 2);
    assert_eq!(reg.stats().registered, 2);
    for z in slab.zones() {
        assert!(reg.contains(z.va, z.len), "zone {z:?} registered");
        assert!(
            dpdk_knows(z.va + 4096),
            "DPDK resolves addresses in zone {z:?}"
        );
    }
    assert!(reg.contains(a.addr(), 1000) && reg.contains(b.addr(), 10_000));
    let heap = Zbuf::from_vec(vec![1; 64]);
    assert!(!reg.contains(heap.addr(), heap.len()));
    assert!(!dpdk_knows(heap.addr()));
    // A port: DMA-mapping is a no-op on the vdev bus and is counted per zone.
    reg.add_port(u16::MAX).expect_err("no such port");
    // Registering twice is idempotent.
    reg.register_zone(&slab.zones()[0]).unwrap();
    assert_eq!(reg.stats().registered, 2);
    // Zones live until the slab's memory goes: then they are unregistered.
    let zones = slab.zones();
    drop((a, b, cache, slab));
    let st = reg.stats();
    assert_eq!(st.unregistered, 2, "{st:?}");
    assert_eq!(st.failures, 1, "the bad port is counted: {st:?}");
    for z in &zones {
        assert!(!reg.contains(z.va, 1));
        assert!(!dpdk_knows(z.va + 4096), "DPDK forgot zone {z:?}");
    }
    "registry ok".into()
}

/// Whether `addr` lies in one of EAL's own (not external) memory-segment lists.
fn in_eal_memory(addr: usize) -> bool {
    // SAFETY: EAL is initialised; the lookup only reads DPDK's memory configuration and
    // the list it returns lives as long as EAL.
    let msl = unsafe { ffi::rte_mem_virt2memseg_list(addr as *const _) };
    // SAFETY: non-null: a live rte_memseg_list (above).
    !msl.is_null() && unsafe { (*msl).external } == 0
}

/// memif zero-copy's layout: every zone of the slab is an EAL memzone (no external
/// registration), the rx pool's buffers and a payload zbuf live there, and the registry
/// forgets the zones when the slab goes.
fn dpdk_memory(eal: &Eal) -> String {
    let reg = DmaRegistry::new(eal);
    let slab = Slab::new(reg.dpdk_memory_slab_config(slab_cfg().max_memory(16 << 20))).unwrap();
    let cache = slab.core_cache(0).unwrap();
    let a = cache.alloc(1000).unwrap().freeze();
    let pool = RxPool::new(eal, &slab, Some(&reg), &RxPoolConfig::new("dmem-rx", 1023)).unwrap();
    let zones = slab.zones();
    assert!(zones.len() >= 2, "{zones:?}");
    for z in &zones {
        assert_eq!(z.backing, zbuf::Backing::Provided, "{z:?}");
        assert_eq!((z.len, z.va % 64), (ZONE_SIZE, 0), "{z:?}");
        assert!(
            reg.contains(z.va, z.len),
            "zone {z:?} known to the registry"
        );
        assert!(
            in_eal_memory(z.va) && in_eal_memory(z.va + z.len - 1),
            "{z:?}"
        );
    }
    assert_eq!(
        reg.stats().registered,
        0,
        "no rte_extmem_register for EAL memory"
    );
    assert!(in_eal_memory(a.addr()) && reg.contains(a.addr(), a.len()));
    let m = pool.mempool().alloc().expect("an rx mbuf");
    let z = pool.to_zbuf(m).expect("a zone mbuf converts");
    assert!(in_eal_memory(z.addr()), "rx buffers are EAL memory");
    drop((a, z, pool, cache, slab));
    let st = reg.stats();
    assert_eq!((st.unregistered, st.failures), (0, 0), "{st:?}");
    for z in &zones {
        assert!(!reg.contains(z.va, 1), "zone {z:?} forgotten with the slab");
    }
    format!("dpdk memory ok zones={}", zones.len())
}

fn registry_limit(eal: &Eal) -> String {
    let reg = DmaRegistry::new(eal);
    // Normal pages: the limit is on DPDK's side, not hugepages.
    let cfg = SlabConfig::new()
        .hugepages(HugepageMode::Never)
        .size_classes(&[2048])
        .max_zones(200)
        .max_memory(400 << 20);
    let slab = Slab::new(reg.slab_config(cfg)).unwrap();
    let err = loop {
        match slab.reserve(2048, 1) {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    let AllocError::ZoneRejected { reason } = &err else {
        panic!("expected a rejected zone, got {err:?}");
    };
    let registered = reg.stats().registered;
    assert_eq!(
        slab.zones().len() as u64,
        registered,
        "rejected zones are unmapped"
    );
    // The slab still works from the registered zones.
    let cache = slab.core_cache(0).unwrap();
    let z = cache.alloc(100).unwrap().freeze();
    assert!(reg.contains(z.addr(), 100));
    drop((z, cache));
    drop(slab);
    assert_eq!(reg.stats().unregistered, registered);
    format!("registered={registered} reason: {reason}")
}

/// Allocates an mbuf of `pool` the way a PMD does and writes `data` into it.
fn fake_rx(pool: &Mempool, data: &[u8]) -> Mbuf {
    let mut m = pool.alloc().expect("mbuf");
    m.append(data.len() as u16)
        .expect("room")
        .copy_from_slice(data);
    m
}

fn rx(eal: &Eal) -> String {
    let reg = DmaRegistry::new(eal);
    let slab = Slab::new(reg.slab_config(slab_cfg())).unwrap();
    let copies0 = copy_stats();
    let rxp = RxPool::new(eal, &slab, Some(&reg), &RxPoolConfig::new("ldv-rx", 1500)).unwrap();
    // 1500 buffers of 2 KiB need two zones (1024 per zone), leased whole.
    assert_eq!(rxp.zones().len(), 2);
    assert_eq!(rxp.data_room(), 2048);
    assert_eq!(
        slab.leak_report().objects_in_use,
        2048,
        "leased objects count as in use"
    );
    let pool = rxp.mempool().clone();
    assert_eq!(pool.in_use_count(), 0);

    // One frame: the Zbuf views the mbuf's data, inside a slab zone, no copy.
    let frame: Vec<u8> = (0..1514u32).map(|i| (i * 7 + 3) as u8).collect();
    let m = fake_rx(&pool, &frame);
    let data_addr = m.data().as_ptr() as usize;
    let z = rxp.to_zbuf(m).expect("single segment");
    assert_eq!(&z[..], &frame[..]);
    assert_eq!(z.addr(), data_addr, "same bytes, not a copy");
    assert!(in_zones(&slab.zones(), z.addr(), z.len()));
    assert!(rxp.contains(z.addr()));
    assert!(reg.contains(z.addr(), z.len()));
    assert_eq!(pool.in_use_count(), 1);
    // The mbuf returns only with the last reference.
    let c = z.clone();
    let s = z.slice(14..100);
    drop(z);
    drop(c);
    assert_eq!(pool.in_use_count(), 1, "a slice still holds the mbuf");
    assert_eq!(s[0], frame[14]);
    drop(s);
    assert_eq!(pool.in_use_count(), 0, "last reference freed the mbuf");

    // Cross-thread release (non-EAL thread: straight to the ring).
    let z = rxp.to_zbuf(fake_rx(&pool, &frame)).unwrap();
    std::thread::spawn(move || drop(z)).join().unwrap();
    assert_eq!(pool.in_use_count(), 0);

    // Deferred frees: inside a scope this thread's last releases queue their mbufs and
    // the scope's end frees them; other threads and nested scopes change nothing.
    let scope = zbuf::dpdk::defer_mbuf_frees();
    let held: Vec<Zbuf> = (0..4)
        .map(|_| rxp.to_zbuf(fake_rx(&pool, &frame)).unwrap())
        .collect();
    let s = held[0].slice(..10);
    drop(held);
    assert_eq!(pool.in_use_count(), 4, "held back by the scope");
    assert_eq!(zbuf::dpdk::deferred_mbufs(), 3, "the slice still holds one");
    drop(s);
    assert_eq!(zbuf::dpdk::deferred_mbufs(), 4);
    let z = rxp.to_zbuf(fake_rx(&pool, &frame)).unwrap();
    std::thread::spawn(move || drop(z)).join().unwrap();
    assert_eq!(pool.in_use_count(), 4, "another thread frees at once");
    drop(zbuf::dpdk::defer_mbuf_frees());
    assert_eq!(
        pool.in_use_count(),
        4,
        "a nested scope does not free the outer's"
    );
    drop(scope);
    assert_eq!(
        pool.in_use_count(),
        0,
        "the scope's end freed every mbuf once"
    );
    assert_eq!(zbuf::dpdk::deferred_mbufs(), 0);
    // Bounded: past MAX_DEFERRED a release frees at once.
    let scope = zbuf::dpdk::defer_mbuf_frees();
    let n = zbuf::dpdk::MAX_DEFERRED + 10;
    let held: Vec<Zbuf> = (0..n)
        .map(|_| rxp.to_zbuf(fake_rx(&pool, &frame[..64])).unwrap())
        .collect();
    drop(held);
    assert_eq!(pool.in_use_count() as usize, zbuf::dpdk::MAX_DEFERRED);
    drop(scope);
    assert_eq!(pool.in_use_count(), 0);
    // A panic inside the scope still frees what it held (the scope drops unwinding).
    let z = rxp.to_zbuf(fake_rx(&pool, &frame)).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _scope = zbuf::dpdk::defer_mbuf_frees();
        drop(z);
        assert_eq!(zbuf::dpdk::deferred_mbufs(), 1);
        panic!("unwinding with a deferred free");
    }));
    assert!(r.is_err());
    assert_eq!(pool.in_use_count(), 0);
    assert_eq!(zbuf::dpdk::deferred_mbufs(), 0);
    // Without a scope nothing waits.
    drop(rxp.to_zbuf(fake_rx(&pool, &frame)).unwrap());
    assert_eq!(pool.in_use_count(), 0);

    // The only reference is writable: reuse the receive buffer for a reply.
    let m = fake_rx(&pool, &frame);
    assert!(m.is_writable(), "to_zbuf's test is is_writable's");
    let z = rxp.to_zbuf(m).unwrap();
    let mut w = z
        .try_into_mut()
        .expect("unique mbuf-backed buffer is writable");
    assert_eq!(w.headroom(), ffi::RTE_PKTMBUF_HEADROOM as usize);
    w[0] = 0xee;
    w.prepend(4).unwrap().copy_from_slice(&[1, 2, 3, 4]);
    let z = w.freeze();
    assert_eq!(&z[..5], &[1, 2, 3, 4, 0xee]);
    let shared = z.clone();
    assert!(shared.try_into_mut().is_err(), "two references: read-only");
    drop(z);
    assert_eq!(pool.in_use_count(), 0);

    // An mbuf another handle shares is not this pool's to take over: a read-only view.
    let m = fake_rx(&pool, &frame);
    let mut other = m.share().unwrap();
    assert!(!m.is_writable(), "to_zbuf's test is is_writable's");
    let z = rxp.to_zbuf(m).unwrap();
    assert!(z.clone().try_into_mut().is_err());
    let z = match z.try_into_mut() {
        Ok(_) => panic!("a shared mbuf became writable"),
        Err(z) => z,
    };
    assert!(
        other.data_mut().is_none(),
        "the other handle cannot write either"
    );
    assert_eq!(&z[..], &frame[..]);
    drop((z, other));
    assert_eq!(pool.in_use_count(), 0);

    // A burst held by a slow consumer: the pool gets them back one by one.
    let held: Vec<Zbuf> = (0..100)
        .map(|i| rxp.to_zbuf(fake_rx(&pool, &frame[..64 + i])).unwrap())
        .collect();
    assert_eq!(pool.in_use_count(), 100);
    for (i, z) in held.into_iter().enumerate() {
        assert_eq!(z.len(), 64 + i);
        drop(z);
        assert_eq!(pool.in_use_count() as usize, 99 - i);
    }

    // Chains: refused as one Zbuf, split zero-copy into an IoVec, or flattened (counted).
    let mut head = fake_rx(&pool, &frame[..1000]);
    head.chain(fake_rx(&pool, &frame[1000..])).unwrap();
    let head = rxp.to_zbuf(head).expect_err("a chain is not one Zbuf");
    let before = copy_stats();
    let flat = mbuf_to_zbuf_copied(&head);
    assert_eq!(&flat[..], &frame[..]);
    let after = copy_stats();
    assert_eq!(
        after.bytes - before.bytes,
        frame.len() as u64,
        "flattening is counted"
    );
    drop(flat);
    let iov = rxp.to_iovec(head);
    assert_eq!(iov.num_segments(), 2);
    assert!(iov.chunks().flatten().eq(frame.iter()), "segments in order");
    for seg in iov.segments() {
        assert!(in_zones(&slab.zones(), seg.addr(), seg.len()));
    }
    assert_eq!(pool.in_use_count(), 2);
    drop(iov);
    assert_eq!(pool.in_use_count(), 0);

    // Mbufs of a foreign pool: zero-copy through a heap wrapper, read-only.
    let other = Mempool::create(eal, &PoolConfig::new("ldv-other", 64)).unwrap();
    let m = fake_rx(&other, b"foreign");
    let a = m.data().as_ptr() as usize;
    let z = rxp.to_zbuf(m).unwrap();
    assert_eq!(z.addr(), a);
    assert_eq!(&z[..], b"foreign");
    assert_eq!(other.in_use_count(), 1);
    let z = z.try_into_mut().expect_err("foreign mbufs are read-only");
    drop(z);
    assert_eq!(other.in_use_count(), 0);
    let m = fake_rx(&other, b"x");
    assert!(mbuf_to_zbuf(m).is_ok());
    assert_eq!(other.in_use_count(), 0);

    // Bad input: configuration errors, never panics.
    let e = RxPool::new(eal, &slab, None, &RxPoolConfig::new("ldv-rx0", 0)).unwrap_err();
    assert!(e.to_string().contains("at least one mbuf"), "{e}");
    let mut big = RxPoolConfig::new("ldv-rxbig", 16);
    big.object_size = 65536;
    let e = RxPool::new(eal, &slab, None, &big).unwrap_err();
    assert!(e.to_string().contains("32 KiB"), "{e}");
    let e = RxPool::new(eal, &slab, None, &RxPoolConfig::new("ldv-rx", 16)).unwrap_err();
    assert!(e.to_string().contains("ldv-rx"), "duplicate pool name: {e}");
    // The failed creation returned its leased zone.
    assert_eq!(slab.leak_report().objects_in_use, 2048);

    // Everything back: pool freed, lease returned, nothing in use, nothing copied
    // on the zero-copy paths (only the one counted flattening).
    drop(pool);
    drop(rxp);
    assert!(slab.leak_report().is_clean(), "{}", slab.leak_report());
    assert_eq!(
        copy_stats().bytes - copies0.bytes,
        frame.len() as u64,
        "only the explicit flattening copied"
    );
    "rx ok".into()
}

fn tx(eal: &Eal) -> String {
    let reg = DmaRegistry::new(eal);
    let slab = Slab::new(reg.slab_config(slab_cfg())).unwrap();
    let cache = slab.core_cache(0).unwrap();
    let mut cfg = TxConfig::new("ldv-tx", 64);
    cfg.holds = 8;
    let mut tx = TxChains::new(eal, &cfg).unwrap();
    let copies0 = copy_stats();

    let fill = |n: usize, seed: u8| {
        let mut m = cache.alloc(n).unwrap();
        for (i, b) in m.append(n).unwrap().iter_mut().enumerate() {
            *b = seed.wrapping_add(i as u8);
        }
        m.freeze()
    };
    let a = fill(1000, 1);
    let b = fill(400, 9);
    let heap = Zbuf::from_vec(vec![0x77; 100]);
    let header = [0xabu8; 54];
    let mut payload = IoVec::new();
    payload.push(a.clone());
    payload.push(b.clone());
    payload.push(heap.clone());
    let chain = tx.build(&header, &payload, None).unwrap();
    drop(payload);
    assert_eq!(chain.nb_segs(), 4);
    assert_eq!(chain.pkt_len(), 54 + 1000 + 400 + 100);
    let mut want = header.to_vec();
    want.extend_from_slice(&a);
    want.extend_from_slice(&b);
    want.extend_from_slice(&heap);
    assert_eq!(chain.to_vec(), want);
    // The segments are the Zbufs' own bytes.
    let segs: Vec<usize> = chain.segments().map(|s| s.as_ptr() as usize).collect();
    assert_eq!(&segs[1..], &[a.addr(), b.addr(), heap.addr()]);
    assert_eq!(a.ref_count(), 2, "the hold keeps a reference");
    let st = tx.stats();
    assert_eq!((st.attaches, st.frees, st.in_flight), (3, 0, 3));
    assert_eq!(copy_stats(), copies0, "no payload copy");
    // Freed (as a PMD does once it has sent it): one callback per segment.
    drop(chain);
    let st = tx.stats();
    assert_eq!((st.attaches, st.frees, st.in_flight), (3, 3, 0));
    assert_eq!(a.ref_count(), 1);
    assert_eq!(heap.ref_count(), 1);
    assert_eq!(tx.mempool().in_use_count(), 0);

    // Freed on another thread: the callback runs there, still exactly once.
    let chain = tx.build(&header, &IoVec::from(a.clone()), None).unwrap();
    std::thread::spawn(move || drop(chain)).join().unwrap();
    assert_eq!(tx.stats().frees, 4);
    assert_eq!(a.ref_count(), 1);

    // Bounded holds: the ninth attachment in flight is refused, nothing leaks.
    let mut chains = Vec::new();
    for _ in 0..8 {
        chains.push(tx.build(&header, &IoVec::from(b.clone()), None).unwrap());
    }
    assert_eq!(b.ref_count(), 9);
    let e = tx
        .build(&header, &IoVec::from(b.clone()), None)
        .unwrap_err();
    assert_eq!(e, TxError::NoHold);
    assert_eq!(b.ref_count(), 9, "the refused frame holds nothing");
    assert_eq!(tx.mempool().in_use_count(), 8 * 2);
    drop(chains);
    assert_eq!(b.ref_count(), 1);
    assert_eq!(tx.stats().no_hold, 1);

    // Large segments are split at 64 KiB - 1 per mbuf.
    let big = Zbuf::from_vec((0..70_000u32).map(|i| i as u8).collect());
    let chain = tx.build(&[], &IoVec::from(big.clone()), None).unwrap();
    assert_eq!(chain.nb_segs(), 3, "empty header + two pieces");
    assert_eq!(&chain.to_vec()[..], &big[..]);
    drop(chain);

    // Offload request: flags and lengths land on the head mbuf.
    let off = TxOffloadRequest {
        l2_len: 14,
        l3_len: 20,
        l4_len: 20,
        ipv4_checksum: true,
        tcp_checksum: true,
        udp_checksum: false,
    };
    let chain = tx
        .build(&header, &IoVec::from(a.clone()), Some(&off))
        .unwrap();
    let f = chain.ol_flags();
    assert_ne!(f & ffi::RTE_MBUF_F_TX_TCP_CKSUM, 0);
    assert_ne!(f & ffi::RTE_MBUF_F_TX_IP_CKSUM, 0);
    drop(chain);

    // Bad input: header too large for an mbuf.
    let e = tx.build(&[0; 4096], &IoVec::new(), None).unwrap_err();
    assert!(
        matches!(e, TxError::HeaderTooLarge { len: 4096, .. }),
        "{e:?}"
    );
    assert_eq!(copy_stats(), copies0, "still no payload copy");

    // A port that DMAs: heap payload (not registered) is copied, zone payload attached.
    let mut dcfg = TxConfig::new("ldv-txdma", 64);
    dcfg.registry = Some(reg.clone());
    let mut dma = TxChains::new(eal, &dcfg).unwrap();
    let mut p = IoVec::new();
    p.push(a.clone());
    p.push(heap.clone());
    let chain = dma.build(&header, &p, None).unwrap();
    assert_eq!(chain.to_vec()[54..], [&a[..], &heap[..]].concat()[..]);
    let st = dma.stats();
    assert_eq!((st.attaches, st.copied_bytes), (1, 100));
    assert_eq!(
        copy_stats().bytes - copies0.bytes,
        100,
        "the copy is counted"
    );
    drop(chain);

    // A port without chains: linearized into the head mbuf (counted), or refused if too big.
    let mut lcfg = TxConfig::new("ldv-txlin", 16);
    lcfg.multi_seg = false;
    let mut lin = TxChains::new(eal, &lcfg).unwrap();
    let chain = lin.build(&header, &p, None).unwrap();
    assert_eq!(chain.nb_segs(), 1);
    assert_eq!(chain.to_vec()[54..], [&a[..], &heap[..]].concat()[..]);
    drop(chain);
    let e = lin
        .build(&header, &IoVec::from(big.clone()), None)
        .unwrap_err();
    assert!(matches!(e, TxError::FrameTooLarge { .. }), "{e:?}");
    assert_eq!(lin.mempool().in_use_count(), 0);

    // Pool exhaustion is an error, not a hang or a leak.
    let mut scfg = TxConfig::new("ldv-txsmall", 3);
    scfg.cache_size = 0;
    let mut small = TxChains::new(eal, &scfg).unwrap();
    let mut p3 = IoVec::new();
    for _ in 0..3 {
        p3.push(a.clone());
        p3.push(b.clone()); // distinct objects: no merging
    }
    assert_eq!(
        small.build(&header, &p3, None).unwrap_err(),
        TxError::NoMbuf
    );
    assert_eq!(small.mempool().in_use_count(), 0);
    assert_eq!(small.stats().in_flight, 0);
    drop(p3);

    let e = TxChains::new(eal, &{
        let mut c = TxConfig::new("ldv-txbad", 8);
        c.holds = 0;
        c
    })
    .unwrap_err();
    assert!(e.to_string().contains("holds"), "{e}");
    let e = TxChains::new(eal, &{
        let mut c = TxConfig::new("ldv-txbad", 8);
        c.holds = zbuf::dpdk::MAX_HOLDS + 1;
        c
    })
    .unwrap_err();
    assert!(e.to_string().contains("holds"), "{e}");

    drop((p, a, b, heap, big, cache));
    assert!(slab.leak_report().is_clean(), "{}", slab.leak_report());
    "tx ok".into()
}

fn tx_shared(eal: &Eal) -> String {
    let slab = Slab::new(slab_cfg()).unwrap();
    let cache = slab.core_cache(0).unwrap();
    let mut cfg = TxConfig::new("ldv-txsh", 16);
    cfg.holds = 8;
    let mut tx = TxChains::new(eal, &cfg).unwrap();
    let mut m = cache.alloc(8).unwrap();
    m.extend_from_slice(b"payload!").unwrap();
    let payload = m.freeze();
    let header = [0xabu8; 14];
    let mut chain = tx
        .build(&header, &IoVec::from(payload.clone()), None)
        .unwrap();
    assert_eq!(chain.nb_segs(), 2);
    // The application still reads its buffer; the chain's mbufs each have refcnt 1.
    let seen: &[u8] = &payload;
    assert!(
        chain.segments_mut().is_none(),
        "writable views of an external (shared) payload segment"
    );
    assert_eq!(
        chain.write(14, b"XXXX"),
        None,
        "wrote into the shared payload"
    );
    assert!(
        chain.append(1).is_none(),
        "append into the attached payload's room"
    );
    assert_eq!(seen, b"payload!");
    // Headers stay writable through the head mbuf alone (a direct one).
    let mut head_only = tx.build(&header, &IoVec::new(), None).unwrap();
    assert_eq!(head_only.write(0, b"\x01"), Some(1));
    assert!(head_only.append(2).is_some());
    // Static payload: writing it would fault.
    let st = Zbuf::from_static(b"static payload");
    let mut chain2 = tx.build(&header, &IoVec::from(st.clone()), None).unwrap();
    assert_eq!(chain2.write(14, b"X"), None);
    assert_eq!(&st[..], b"static payload");
    drop((chain, chain2, head_only));
    assert_eq!(payload.ref_count(), 1);
    drop((payload, st, cache));
    assert!(slab.leak_report().is_clean(), "{}", slab.leak_report());
    "tx shared ok".into()
}

// ---------------------------------------------------------------- memif end to end

const FRAMES: usize = 4000;
const ETHERTYPE: [u8; 2] = [0x88, 0xb5];
const FIN: [u8; 2] = [0x88, 0xb6];
const FIN_ACK: [u8; 2] = [0x88, 0xb7];
const HDR: usize = 14 + 8;

/// Payload byte `i` of frame `seq`.
fn pattern(seq: u32, i: usize) -> u8 {
    (seq as usize * 31 + i * 7 + (i >> 8)) as u8
}

fn seg_lens(seq: u32) -> (usize, usize) {
    let a = 64 + (seq as usize * 37) % 900;
    let b = 1 + (seq as usize * 101) % 500;
    (a, b)
}

fn open_port(eal: &Eal, pool: &Mempool, client: bool, sock: &str) -> Port {
    let mut port = Port::by_name(eal, "net_memif0").unwrap();
    let info = port.info().unwrap();
    let conf = PortConf {
        rx_desc: 1024,
        tx_desc: 1024,
        tx_offloads: info.tx_offload_capa & ffi::RTE_ETH_TX_OFFLOAD_MULTI_SEGS,
        ..PortConf::default()
    };
    port.configure(&conf, pool).unwrap();
    if client {
        dpdk_sys::ethdev::wait_memif_listener(sock, Duration::from_secs(30)).unwrap();
        port.start_until_link_up(Duration::from_secs(30), Duration::from_millis(500))
            .unwrap();
    } else {
        port.start().unwrap();
        port.wait_link_up(Duration::from_secs(30)).unwrap();
    }
    port
}

fn memif_rx(eal: &Eal, sock: &str) -> String {
    let reg = DmaRegistry::new(eal);
    let slab = Slab::new(reg.slab_config(slab_cfg())).unwrap();
    let rxp = RxPool::new(eal, &slab, Some(&reg), &RxPoolConfig::new("ldv-mrx", 4095)).unwrap();
    let pool = rxp.mempool().clone();
    let mut port = open_port(eal, &pool, false, sock);
    reg.add_port(port.id()).unwrap();
    let mut rxq = port.rx_queue(0).unwrap();
    let copies0 = copy_stats();
    let zones = slab.zones();
    let base_in_use = pool.in_use_count();

    let mut burst = Vec::with_capacity(32);
    let mut next = 0u32;
    let mut held: Vec<Zbuf> = Vec::new();
    let mut slow_consumer_checked = false;
    let end = Instant::now() + Duration::from_secs(60);
    let mut fin = false;
    while !fin {
        assert!(Instant::now() < end, "timed out at frame {next}");
        rxq.rx_burst(&mut burst, 32);
        for m in burst.drain(..) {
            let z = rxp.to_zbuf(m).expect("frames fit one buffer");
            assert!(
                in_zones(&zones, z.addr(), z.len()),
                "payload lies in a zbuf zone"
            );
            if z[12..14] == FIN {
                fin = true;
                continue;
            }
            assert_eq!(z[12..14], ETHERTYPE);
            let seq = u32::from_be_bytes(z[14..18].try_into().unwrap());
            assert_eq!(seq, next, "in order over memif");
            let (a, b) = seg_lens(seq);
            assert_eq!(z.len(), HDR + a + b);
            for (i, &byte) in z[HDR..].iter().enumerate() {
                assert_eq!(byte, pattern(seq, i), "frame {seq} byte {i}");
            }
            next += 1;
            // The consumer keeps the first 200 frames: their mbufs stay out of the pool.
            if !slow_consumer_checked && held.len() < 200 {
                held.push(z);
            }
        }
        if held.len() == 200 && !slow_consumer_checked {
            let in_use = pool.in_use_count();
            assert!(in_use as usize >= 200, "held buffers are in use ({in_use})");
            let clone = held[7].clone();
            drop(std::mem::take(&mut held));
            assert_eq!(
                in_use - pool.in_use_count(),
                199,
                "dropping the consumer's Zbufs returns their mbufs, one still cloned"
            );
            drop(clone);
            assert_eq!(in_use - pool.in_use_count(), 200);
            slow_consumer_checked = true;
        }
    }
    assert!(slow_consumer_checked);
    assert_eq!(next as usize, FRAMES);
    // Tell the sender everything arrived, so it may close the link.
    let mut tx = TxChains::new(eal, &TxConfig::new("ldv-mrxack", 64)).unwrap();
    let mut txq = port.tx_queue(0).unwrap();
    let mut ack = [0u8; 60];
    ack[12..14].copy_from_slice(&FIN_ACK);
    let mut out = vec![tx.build(&ack, &IoVec::new(), None).unwrap()];
    let end = Instant::now() + Duration::from_secs(10);
    while !out.is_empty() {
        assert!(Instant::now() < end, "could not send the FIN-ACK");
        txq.tx_burst(&mut out);
    }
    // This side is the memif server: its shared memory goes away when it exits, and with it a
    // FIN-ACK the client has not read yet. Repeat the FIN-ACK until the client disconnects.
    let linger = Instant::now() + Duration::from_secs(20);
    while Instant::now() < linger && port.link().is_ok_and(|l| l.up) {
        std::thread::sleep(Duration::from_millis(50));
        let mut again = vec![tx.build(&ack, &IoVec::new(), None).unwrap()];
        txq.tx_burst(&mut again);
    }
    drop(txq);
    let copied = copy_stats().bytes - copies0.bytes;
    assert_eq!(
        pool.in_use_count(),
        base_in_use,
        "every mbuf back in the pool"
    );
    drop(rxq);
    reg.remove_port(port.id());
    drop(port);
    drop(pool);
    drop(rxp);
    assert!(slab.leak_report().is_clean(), "{}", slab.leak_report());
    drop(slab);
    let st = reg.stats();
    assert_eq!(st.registered, st.unregistered, "{st:?}");
    format!("frames={next} copied={copied}")
}

fn memif_tx(eal: &Eal, sock: &str) -> String {
    let reg = DmaRegistry::new(eal);
    let slab = Slab::new(reg.slab_config(slab_cfg())).unwrap();
    let cache = slab.core_cache(0).unwrap();
    // The port needs an rx pool too (unused by this side).
    let rxp = RxPool::new(
        eal,
        &slab,
        Some(&reg),
        &RxPoolConfig::new("ldv-mtxrx", 1100),
    )
    .unwrap();
    let mut port = open_port(eal, rxp.mempool(), true, sock);
    reg.add_port(port.id()).unwrap();
    let mut txq = port.tx_queue(0).unwrap();
    let mut tx = TxChains::new(eal, &TxConfig::new("ldv-mtx", 4095)).unwrap();
    let copies0 = copy_stats();
    let in_use0 = slab.stats().in_use();

    let header = |seq: u32, kind: [u8; 2]| {
        let mut h = [0u8; HDR];
        h[..6].copy_from_slice(&[0x02, 0, 0, 0, 3, 1]);
        h[6..12].copy_from_slice(&[0x02, 0, 0, 0, 3, 2]);
        h[12..14].copy_from_slice(&kind);
        h[14..18].copy_from_slice(&seq.to_be_bytes());
        h
    };
    let fill = |seq: u32, from: usize, n: usize| {
        let mut m = cache.alloc(n).unwrap();
        for (i, b) in m.append(n).unwrap().iter_mut().enumerate() {
            *b = pattern(seq, from + i);
        }
        m.freeze()
    };
    let send_all = |txq: &mut dpdk_sys::TxQueue, chains: &mut Vec<Mbuf>| {
        let end = Instant::now() + Duration::from_secs(30);
        while !chains.is_empty() {
            assert!(Instant::now() < end, "memif ring stayed full");
            if txq.tx_burst(chains) == 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    };

    // Frame 0 in slow motion: the payload is held until memif has sent the chain.
    let (a, b) = seg_lens(0);
    let (za, zb) = (fill(0, 0, a), fill(0, a, b));
    let mut p = IoVec::new();
    p.push(za.clone());
    p.push(zb.clone());
    let chain = tx.build(&header(0, ETHERTYPE), &p, None).unwrap();
    drop(p);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(za.ref_count(), 2, "held by the in-flight chain");
    assert_eq!((tx.stats().attaches, tx.stats().frees), (2, 0));
    send_all(&mut txq, &mut vec![chain]);
    // memif copies into the shared ring and frees the chain inside tx_burst.
    assert_eq!((tx.stats().attaches, tx.stats().frees), (2, 2));
    assert_eq!(za.ref_count(), 1, "released after transmission");
    assert_eq!(zb.ref_count(), 1);
    drop((za, zb));

    let mut pending: Vec<Mbuf> = Vec::with_capacity(32);
    let mut frees_seen = tx.stats().frees;
    for seq in 1..FRAMES as u32 {
        let (a, b) = seg_lens(seq);
        let mut p = IoVec::new();
        p.push(fill(seq, 0, a));
        p.push(fill(seq, a, b));
        pending.push(tx.build(&header(seq, ETHERTYPE), &p, None).unwrap());
        if pending.len() == 32 {
            send_all(&mut txq, &mut pending);
        }
        let st = tx.stats();
        assert!(st.frees <= st.attaches && st.frees >= frees_seen);
        frees_seen = st.frees;
    }
    send_all(&mut txq, &mut pending);
    let fin = tx.build(&header(0, FIN), &IoVec::new(), None).unwrap();
    send_all(&mut txq, &mut vec![fin]);
    let st = tx.stats();
    let copied = copy_stats().bytes - copies0.bytes;
    assert_eq!(st.in_flight, 0, "{st:?}");
    assert_eq!(slab.stats().in_use(), in_use0, "every sent buffer released");
    // Wait for the receiver's FIN-ACK before the link goes away.
    let mut rxq = port.rx_queue(0).unwrap();
    let mut burst = Vec::new();
    let end = Instant::now() + Duration::from_secs(60);
    'ack: loop {
        assert!(Instant::now() < end, "no FIN-ACK from the receiver");
        rxq.rx_burst(&mut burst, 32);
        for m in burst.drain(..) {
            if m.data().get(12..14) == Some(&FIN_ACK[..]) {
                break 'ack;
            }
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    drop(rxq);
    drop(txq);
    reg.remove_port(port.id());
    drop(port);
    drop(tx);
    drop(rxp);
    drop(cache);
    assert!(slab.leak_report().is_clean(), "{}", slab.leak_report());
    format!(
        "attaches={} frees={} copied={copied}",
        st.attaches, st.frees
    )
}
