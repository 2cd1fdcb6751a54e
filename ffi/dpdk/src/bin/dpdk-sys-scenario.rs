//! Test helper for dpdk-sys: runs one scenario with its own EAL (EAL can
//! initialise only once per process, so tests/ spawn this binary per case).
//!
//! Usage: `dpdk-sys-scenario <scenario> [--key value]... -- <EAL args>`
//!
//! Prints `OK <details>` and exits 0, or `ERROR kind=<Kind>: <error>` and
//! exits 1. It never panics on a DPDK failure and every loop has a deadline.
//!
//! Scenarios:
//! * `eal-init`: initialise EAL and report.
//! * `double-init`: initialise twice; the second must fail cleanly.
//! * `eal-hold --ready-file F [--timeout-ms T]`: initialise EAL, write F, keep
//!   EAL up until F is removed (or T ms pass).
//! * `port --name N [--rxq Q --txq Q --mtu M]`: find, configure, start a port.
//! * `flow-validate --name N`: validate an eth/ipv4/udp → queue rule.
//! * `flow-create --name N`: create and destroy the same rule.
//! * `mbuf-api`: mbuf/mempool/burst behaviour on `net_ring0` (asserts inside).
//! * `memif --role server|client --frames N [--timeout-ms T]`: exchange
//!   N frames each way with a peer process over port `net_memif0`.
//! * `tap-ping --name N --iface I --local IP --peer IP --kernel-addr CIDR`:
//!   configure the kernel side of a tap, ARP for the peer, ping it.
//! * `tap-signal --name N`: configure and start net_tap port N, find its interface as
//!   r2c does (`tapsignal::port_iface`) and make a new thread the receiver of its queue
//!   files' signals; prints the interface and how many files were redirected.
//! * `intr-hold`: an alarm due while the EAL interrupt thread is held
//!   (`Eal::hold_interrupt_thread`) runs only after the release; a second holder
//!   waits for the first; EAL cleans up after (its drop parks the thread for good).
//! * `lcores`: 300 threads one after the other (more than `RTE_MAX_LCORE`) each
//!   register as an lcore (`Eal::register_thread`, twice: the same id, not the main
//!   lcore's, the thread's CPU pinning kept) and cycle mbufs through their mempool
//!   cache; then a thread without an lcore id (no cache) must get every mbuf of the
//!   pool: each exiting thread released its id and flushed its cache. 140 threads
//!   registered at once: those past `RTE_MAX_LCORE` get a named error, and ids are free
//!   again once they end.

#![warn(clippy::undocumented_unsafe_blocks)]

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use dpdk_sys::ffi;
use dpdk_sys::flow::{Ipv4Match, UdpMatch};
use dpdk_sys::{
    Eal, Error, FlowAction, FlowAttr, FlowItem, FlowRule, Mbuf, Mempool, PoolConfig, Port, PortConf,
};

enum Fail {
    Dpdk(Error),
    Check(String),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail::Dpdk(e)
    }
}

type R<T> = Result<T, Fail>;

fn check(msg: impl Into<String>) -> Fail {
    Fail::Check(msg.into())
}

struct Opts {
    kv: HashMap<String, String>,
    eal: Vec<String>,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Opts, String> {
        let mut kv = HashMap::new();
        let mut it = args.iter();
        let mut eal = Vec::new();
        while let Some(a) = it.next() {
            if a == "--" {
                eal.extend(it.by_ref().cloned());
                break;
            }
            let key = a
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument {a:?}"))?;
            let val = it.next().ok_or_else(|| format!("--{key} needs a value"))?;
            kv.insert(key.to_owned(), val.clone());
        }
        Ok(Opts { kv, eal })
    }

    fn get(&self, k: &str) -> R<&str> {
        self.kv
            .get(k)
            .map(String::as_str)
            .ok_or_else(|| check(format!("missing --{k}")))
    }

    fn num<T: std::str::FromStr>(&self, k: &str, default: T) -> R<T> {
        match self.kv.get(k) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| check(format!("--{k} {v:?} is not a number"))),
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(scenario) = args.first().cloned() else {
        println!(
            "ERROR kind=Usage: usage: dpdk-sys-scenario <scenario> [--key value]... -- <EAL args>"
        );
        return ExitCode::from(2);
    };
    let opts = match Opts::parse(&args[1..]) {
        Ok(o) => o,
        Err(e) => {
            println!("ERROR kind=Usage: {e}");
            return ExitCode::from(2);
        }
    };
    let res = match scenario.as_str() {
        "eal-init" => eal_init(&opts),
        "double-init" => double_init(&opts),
        "eal-hold" => eal_hold(&opts),
        "port" => port(&opts),
        "flow-validate" => flow(&opts, false),
        "flow-create" => flow(&opts, true),
        "memif" => memif(&opts),
        "mbuf-api" => mbuf_api(&opts),
        "tap-ping" => tap_ping(&opts),
        "intr-hold" => intr_hold(&opts),
        "tap-signal" => tap_signal(&opts),
        "tap-kick" => tap_kick(&opts),
        "lcores" => lcores(&opts),
        other => Err(check(format!("unknown scenario {other:?}"))),
    };
    match res {
        Ok(msg) => {
            println!("OK {msg}");
            ExitCode::SUCCESS
        }
        Err(Fail::Dpdk(e)) => {
            println!("ERROR kind={:?}: {e}", e.kind());
            ExitCode::from(1)
        }
        Err(Fail::Check(m)) => {
            println!("ERROR kind=Check: {m}");
            ExitCode::from(1)
        }
    }
}

fn eal_init(o: &Opts) -> R<String> {
    let preflight = o.kv.get("preflight").is_none_or(|v| v != "off");
    let eal = Eal::builder()
        .args(o.eal.clone())
        .preflight(preflight)
        .init()?;
    Ok(format!(
        "EAL up, {} ports, {}",
        dpdk_sys::ethdev::ports(&eal).len(),
        dpdk_sys::eal::version()
    ))
}

fn eal_hold(o: &Opts) -> R<String> {
    let ready = o.get("ready-file")?;
    let timeout = Duration::from_millis(o.num("timeout-ms", 60_000)?);
    let eal = Eal::init(o.eal.clone())?;
    std::fs::write(ready, b"up").map_err(|e| check(format!("write {ready}: {e}")))?;
    let end = Instant::now() + timeout;
    while std::path::Path::new(ready).exists() {
        if Instant::now() >= end {
            return Err(check(format!("{ready} was not removed within {timeout:?}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(eal);
    Ok("EAL held and released".into())
}

static ALARMS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

extern "C" fn count_alarm(_arg: *mut std::ffi::c_void) {
    ALARMS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// Waits up to 10 s for `cond`.
fn within_10s(mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(10);
    while !cond() {
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

fn intr_hold(o: &Opts) -> R<String> {
    use std::sync::atomic::Ordering::SeqCst;
    let eal = Eal::init(o.eal.clone())?;
    let wait = Duration::from_secs(10);
    let hold = eal.hold_interrupt_thread(wait)?;
    // SAFETY: EAL is up; count_alarm is a valid callback that ignores its argument.
    let ret = unsafe { ffi::rte_eal_alarm_set(1000, Some(count_alarm), std::ptr::null_mut()) };
    if ret != 0 {
        return Err(check(format!("rte_eal_alarm_set: {ret}")));
    }
    // Due after 1 ms; it would run within this sleep if the thread were not held.
    std::thread::sleep(Duration::from_millis(200));
    if ALARMS.load(SeqCst) != 0 {
        return Err(check("an alarm ran while the interrupt thread was held"));
    }
    drop(hold);
    if !within_10s(|| ALARMS.load(SeqCst) == 1) {
        return Err(check("the alarm did not run within 10 s of the release"));
    }
    // A second holder (another thread) waits for the first's release.
    let first = eal.hold_interrupt_thread(wait)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let e2 = eal.clone();
    let second = std::thread::spawn(move || {
        let h = e2.hold_interrupt_thread(Duration::from_secs(10));
        let _ = tx.send(h.is_ok());
    });
    if rx.recv_timeout(Duration::from_millis(200)).is_ok() {
        return Err(check("a second hold succeeded while the first was held"));
    }
    drop(first);
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(true) => {}
        Ok(false) => return Err(check("the second hold failed after the first's release")),
        Err(_) => {
            return Err(check(
                "the second hold did not come within 10 s of the release",
            ))
        }
    }
    let _ = second.join();
    drop(eal);
    Ok("alarm held back until the release; second holder waited; EAL cleaned up".into())
}

fn double_init(o: &Opts) -> R<String> {
    let eal = Eal::init(o.eal.clone())?;
    let second = Eal::init(o.eal.clone());
    drop(eal);
    let third = Eal::init(o.eal.clone());
    match (second, third) {
        (Err(a), Err(b)) => Ok(format!(
            "second init refused: {a}; init after cleanup refused: {b}"
        )),
        _ => Err(check("a second EAL init in one process succeeded")),
    }
}

fn pool(eal: &Eal, name: &str, size: u32) -> R<Mempool> {
    Ok(Mempool::create(eal, &PoolConfig::new(name, size))?)
}

/// Port `name` configured with one queue each way of 256 descriptors, buffers from a new
/// 1,023-mbuf pool `pool_name`, and started (the tap scenarios' port).
fn started_tap_port(eal: &Eal, name: &str, pool_name: &str) -> R<(Port, Mempool)> {
    let mut port = Port::by_name(eal, name)?;
    let mp = pool(eal, pool_name, 1023)?;
    port.configure(
        &PortConf {
            rx_desc: 256,
            tx_desc: 256,
            ..Default::default()
        },
        &mp,
    )?;
    port.start()?;
    Ok((port, mp))
}

fn port(o: &Opts) -> R<String> {
    let eal = Eal::init(o.eal.clone())?;
    let name = o.get("name")?;
    let mut port = Port::by_name(&eal, name)?;
    let mp = pool(&eal, "ldp_port", 4095)?;
    let conf = PortConf {
        rx_queues: o.num("rxq", 1)?,
        tx_queues: o.num("txq", 1)?,
        rx_desc: 256,
        tx_desc: 256,
        rss_hf: ffi::RTE_ETH_RSS_IP | ffi::RTE_ETH_RSS_TCP | ffi::RTE_ETH_RSS_UDP,
        mtu: o
            .kv
            .get("mtu")
            .map(|m| m.parse())
            .transpose()
            .map_err(|_| check("bad --mtu"))?,
        ..Default::default()
    };
    port.configure(&conf, &mp)?;
    port.start()?;
    let info = port.info()?;
    Ok(format!(
        "port {} ({}) started with {} rx / {} tx queues, rss_hf {:#x} (asked {:#x}, device {:#x})",
        port.name(),
        info.driver_name,
        conf.rx_queues,
        conf.tx_queues,
        port.rss_hf(),
        conf.rss_hf,
        info.flow_type_rss_offloads
    ))
}

fn flow(o: &Opts, create: bool) -> R<String> {
    let eal = Eal::init(o.eal.clone())?;
    let mut port = Port::by_name(&eal, o.get("name")?)?;
    let mp = pool(&eal, "ldp_flow", 1023)?;
    port.configure(
        &PortConf {
            rx_desc: 128,
            tx_desc: 128,
            ..Default::default()
        },
        &mp,
    )?;
    port.start()?;
    let rule = FlowRule {
        attr: FlowAttr::ingress(),
        pattern: vec![
            FlowItem::Eth {
                spec: None,
                mask: None,
            },
            FlowItem::Ipv4 {
                spec: Some(Ipv4Match {
                    dst: Ipv4Addr::new(198, 18, 0, 2),
                    proto: 17,
                    ..Default::default()
                }),
                mask: Some(Ipv4Match {
                    dst: Ipv4Addr::BROADCAST,
                    proto: 0xff,
                    ..Default::default()
                }),
            },
            FlowItem::Udp {
                spec: Some(UdpMatch {
                    dst_port: 4789,
                    src_port: 0,
                }),
                mask: Some(UdpMatch {
                    dst_port: 0xffff,
                    src_port: 0,
                }),
            },
        ],
        actions: vec![FlowAction::Queue(0)],
    };
    port.flow_validate(&rule)?;
    if create {
        let f = port.flow_create(&rule)?;
        f.destroy()?;
        return Ok("flow created and destroyed".into());
    }
    Ok("flow validated".into())
}

/// The calling thread's allowed CPUs.
fn affinity() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes at most
    // its size into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> bool {
    // SAFETY: as in `affinity`; CPU_SET stays inside the set for cpu < CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

fn lcores(o: &Opts) -> R<String> {
    const THREADS: usize = 300;
    const SIZE: u32 = 1023;
    let eal = Eal::init(o.eal.clone())?;
    let cfg = PoolConfig::new("ldp_lcores", SIZE);
    if cfg.cache_size == 0 {
        return Err(check("lcores: the pool has no per-lcore caches"));
    }
    let mp = Mempool::create(&eal, &cfg)?;
    let main = dpdk_sys::eal::lcore_id();
    let cpu = *affinity()
        .first()
        .ok_or_else(|| check("no CPU in the affinity"))?;
    let mut ids = std::collections::BTreeSet::new();
    for i in 0..THREADS {
        let one = std::thread::scope(|s| {
            s.spawn(|| -> Result<u32, String> {
                if dpdk_sys::eal::lcore_id().is_some() || !pin(cpu) {
                    return Err("a new thread is no lcore and can be pinned".into());
                }
                let id = eal.register_thread().map_err(|e| e.to_string())?;
                if eal.register_thread().map_err(|e| e.to_string())? != id
                    || Some(id) == main
                    || dpdk_sys::eal::lcore_id() != Some(id)
                {
                    return Err(format!("id {id}: not this thread's own, once"));
                }
                if affinity() != [cpu] {
                    return Err(format!("registering lost the pinning: {:?}", affinity()));
                }
                let mut held = Vec::new();
                if !mp.alloc_bulk(&mut held, 100) {
                    return Err("alloc_bulk(100)".into());
                }
                drop(held); // into this lcore's cache
                Ok(id)
            })
            .join()
        });
        match one {
            Ok(Ok(id)) => ids.insert(id),
            Ok(Err(e)) => return Err(check(format!("thread {i}: {e}"))),
            Err(_) => return Err(check(format!("thread {i} panicked"))),
        };
    }
    // More threads registered at once than there are lcore ids: the ones past the limit
    // get a named error (no panic), and the ids come back when the threads end.
    const AT_ONCE: usize = 140;
    let gate = std::sync::Barrier::new(AT_ONCE);
    let results: Vec<Result<u32, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..AT_ONCE)
            .map(|_| {
                s.spawn(|| {
                    let r = eal.register_thread().map_err(|e| e.to_string());
                    gate.wait(); // every thread holds its id until all have tried
                    r
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    });
    let refused: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    if refused.is_empty() || refused.iter().any(|e| !e.contains("RTE_MAX_LCORE")) {
        return Err(check(format!(
            "lcores: {AT_ONCE} at once: {} refused, errors {:?}",
            refused.len(),
            refused.first()
        )));
    }
    let again = std::thread::scope(|s| s.spawn(|| eal.register_thread().is_ok()).join());
    if !matches!(again, Ok(true)) {
        return Err(check("lcores: no id free again after the threads ended"));
    }
    let over = refused.len();
    // No lcore id, no cache: only what is back in the pool's ring can be had.
    let got = std::thread::scope(|s| {
        s.spawn(|| {
            let mut all = Vec::new();
            while let Some(m) = mp.alloc() {
                all.push(m);
            }
            all.len()
        })
        .join()
    })
    .map_err(|_| check("the cacheless thread panicked"))?;
    if got != SIZE as usize {
        return Err(check(format!(
            "lcores: a cacheless thread got {got} of {SIZE} mbufs: the rest stayed in caches"
        )));
    }
    Ok(format!(
        "{THREADS} threads registered (ids used: {ids:?}); {over} of {AT_ONCE} at once \
         refused by name; all {got} mbufs back in the ring"
    ))
}

fn ensure(cond: bool, what: &str) -> R<()> {
    if cond {
        Ok(())
    } else {
        Err(check(format!("mbuf-api: {what}")))
    }
}

fn mbuf_api(o: &Opts) -> R<String> {
    let eal = Eal::init(o.eal.clone())?;
    let mp = Mempool::create(
        &eal,
        &PoolConfig {
            cache_size: 0,
            ..PoolConfig::new("ldp_mbuf", 4095)
        },
    )?;
    ensure(
        mp.in_use_count() == 0 && mp.avail_count() == 4095,
        "fresh pool counts",
    )?;
    ensure(
        mp.seg_capacity() == 2048,
        "default data room is 2048 + headroom",
    )?;

    // Headroom/tailroom, append/prepend/adj/trim.
    let mut m = mp.alloc().ok_or_else(|| check("alloc"))?;
    ensure(
        m.headroom() == ffi::RTE_PKTMBUF_HEADROOM as usize && m.data_len() == 0,
        "fresh mbuf",
    )?;
    m.append(100).ok_or_else(|| check("append"))?.fill(0xaa);
    m.prepend(14).ok_or_else(|| check("prepend"))?.fill(0xbb);
    ensure(
        m.data_len() == 114 && m.data()[0] == 0xbb && m.data()[14] == 0xaa,
        "prepend/append layout",
    )?;
    ensure(
        m.prepend(ffi::RTE_PKTMBUF_HEADROOM as u16).is_none(),
        "prepend past headroom must fail",
    )?;
    ensure(m.append(4096).is_none(), "append past tailroom must fail")?;
    ensure(
        m.adj(14) && m.data()[0] == 0xaa && m.data_len() == 100,
        "adj",
    )?;
    ensure(m.trim(50) && m.data_len() == 50, "trim")?;
    ensure(
        !m.adj(51) && !m.trim(51),
        "adj/trim beyond the data must fail",
    )?;
    ensure(mp.in_use_count() == 1, "one in use")?;

    // Sharing makes both handles read-only; dropping one restores writes.
    let shared = m.share().ok_or_else(|| check("share"))?;
    ensure(m.refcnt() == 2 && !m.is_exclusive(), "refcnt 2 after share")?;
    ensure(
        m.data_mut().is_none() && m.append(1).is_none() && !m.trim(1),
        "shared mbuf must be read-only",
    )?;
    ensure(shared.data() == m.data(), "shared data identical")?;
    drop(shared);
    ensure(
        m.is_exclusive() && m.data_mut().is_some(),
        "exclusive again",
    )?;
    drop(m);
    ensure(mp.in_use_count() == 0, "freed on drop")?;

    // Chains: 5000 bytes over 3 segments, written and read across boundaries.
    let mut c = mp.alloc_chain(5000).ok_or_else(|| check("alloc_chain"))?;
    ensure(
        c.nb_segs() == 3 && c.pkt_len() == 5000 && c.data_len() == 2048,
        "chain shape",
    )?;
    let src: Vec<u8> = (0..5000u32).map(|i| (i * 13 % 256) as u8).collect();
    ensure(c.write(0, &src) == Some(5000), "write across segments")?;
    let mut back = vec![0u8; 3000];
    ensure(
        c.read(2000, &mut back) == 3000 && back[..] == src[2000..],
        "read across segments",
    )?;
    ensure(c.to_vec() == src, "to_vec")?;
    let tail = mp.alloc_chain(10).ok_or_else(|| check("alloc tail"))?;
    c.chain(tail).map_err(|_| check("chain"))?;
    ensure(c.nb_segs() == 4 && c.pkt_len() == 5010, "chain appended")?;
    ensure(mp.in_use_count() == 4, "4 segments in use")?;
    let raw = c.into_raw();
    // SAFETY: raw came from into_raw just above; ownership returns to the handle.
    let c = unsafe { Mbuf::from_raw(raw) }.ok_or_else(|| check("from_raw"))?;
    drop(c);
    ensure(mp.in_use_count() == 0, "chain freed as a whole")?;

    // Exhaustion: alloc_chain that cannot complete leaks nothing.
    let mut hold = Vec::new();
    ensure(mp.alloc_bulk(&mut hold, 4093), "bulk alloc")?;
    ensure(
        !mp.alloc_bulk(&mut hold, 10) && hold.len() == 4093,
        "bulk alloc is all-or-nothing",
    )?;
    ensure(
        mp.alloc_chain(3 * 2048).is_none(),
        "chain needing 3 of 2 free mbufs fails",
    )?;
    ensure(mp.in_use_count() == 4093, "failed chain returned its mbufs")?;
    hold.clear();
    ensure(mp.in_use_count() == 0, "bulk freed")?;

    // tx_burst keeps what it could not send (net_ring tx ring fills up).
    let mut port = Port::by_name(&eal, "net_ring0")?;
    port.configure(
        &PortConf {
            rx_desc: 1024,
            tx_desc: 1024,
            ..Default::default()
        },
        &mp,
    )?;
    port.start()?;
    let mut txq = port.tx_queue(0)?;
    let mut rxq = port.rx_queue(0)?;
    ensure(port.tx_queue(0).is_err(), "a queue handle is taken once")?;
    ensure(
        port.stop().is_err(),
        "stop refused while queue handles exist",
    )?;
    // Twice: as the PMD gets them, then at most four per rte_eth_tx_burst (memif
    // zero-copy's bound), where one call must still hand over chunk after chunk until the
    // ring is full and keep the rest in order.
    let mut sent = 0;
    for limit in [None, Some(dpdk_sys::TxQueue::MEMIF_ZERO_COPY_BURST)] {
        let pass = if limit.is_some() { "chunked" } else { "whole" };
        if let Some(n) = limit {
            txq.limit_burst(n);
        }
        let mut batch = Vec::new();
        ensure(mp.alloc_bulk(&mut batch, 3000), "alloc 3000")?;
        for (i, m) in batch.iter_mut().enumerate() {
            m.append(8)
                .ok_or_else(|| check("append"))?
                .copy_from_slice(&(i as u64).to_be_bytes());
        }
        // What the PMD is handed per rte_eth_tx_burst, seen by an ethdev tx callback.
        let mut seen = Box::new(ffi::dpdk_sys_tx_calls {
            calls: 0,
            max_pkts: 0,
        });
        let (port_id, queue_id) = (txq.port_id(), txq.queue_id());
        // SAFETY: a started port's queue; `seen` outlives the callback, which is removed
        // below before `seen` is read or dropped, and runs only inside tx_burst on this
        // thread.
        let cb = unsafe { ffi::dpdk_sys_tx_calls_watch(port_id, queue_id, &mut *seen) };
        ensure(!cb.is_null(), "tx callback registered")?;
        let first = txq.tx_burst(&mut batch);
        // SAFETY: `cb` came from dpdk_sys_tx_calls_watch on this queue.
        let removed = unsafe { ffi::dpdk_sys_tx_calls_unwatch(port_id, queue_id, cb) };
        ensure(removed == 0, "tx callback removed")?;
        ensure(first > 4, "one call fills the ring")?;
        let handed = match limit {
            None => seen.calls == 1 && seen.max_pkts == 3000,
            Some(n) => seen.max_pkts <= n && seen.calls >= (first as u64).div_ceil(n as u64),
        };
        ensure(
            handed,
            &format!(
                "{pass}: the PMD was handed {} call(s) of at most {} packets",
                seen.calls, seen.max_pkts
            ),
        )?;
        sent = first;
        for _ in 0..9 {
            sent += txq.tx_burst(&mut batch);
        }
        ensure(
            sent == first && !batch.is_empty() && sent + batch.len() == 3000,
            &format!("{pass}: a full ring takes no more; sent + unsent = all"),
        )?;
        ensure(
            mp.in_use_count() == 3000,
            "unsent still owned, sent sit in the ring",
        )?;
        let first_unsent = u64::from_be_bytes(batch[0].data().try_into().unwrap_or_default());
        ensure(
            first_unsent == sent as u64,
            &format!("{pass}: unsent keep their order"),
        )?;
        drop(batch);
        let mut got = Vec::new();
        while rxq.rx_burst(&mut got, 64) > 0 {}
        ensure(
            got.len() == sent
                && got
                    .iter()
                    .enumerate()
                    .all(|(i, m)| m.data() == (i as u64).to_be_bytes()),
            &format!("{pass}: everything sent is received, in order with data"),
        )?;
        drop(got);
        ensure(mp.in_use_count() == 0, "no leak after tx/rx")?;
    }
    drop((txq, rxq));
    port.stop()?;
    extbuf_pool(&eal)?;
    Ok(format!(
        "mbuf API checks passed ({sent} of 3000 sent before the ring filled)"
    ))
}

/// `Mempool::create_extbuf`: data buffers in caller memory, kept alive until the pool is
/// freed; bad descriptors are refused before DPDK is called.
fn extbuf_pool(eal: &Eal) -> R<()> {
    use dpdk_sys::ExtMem;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// Owns the external memory (never read, only kept) and records its release.
    struct Owner(#[allow(dead_code)] Vec<u8>, Arc<AtomicBool>);
    impl Drop for Owner {
        fn drop(&mut self) {
            self.1.store(true, Ordering::SeqCst);
        }
    }
    let mut mem = vec![0u8; 64 * 2048];
    let area = ExtMem {
        va: mem.as_mut_ptr(),
        iova: ffi::RTE_BAD_IOVA,
        len: mem.len(),
        elt_size: 2048,
    };
    let cfg = PoolConfig {
        cache_size: 0,
        priv_size: 64,
        data_room: 2048,
        ..PoolConfig::new("ldp_ext", 64)
    };
    let dropped = Arc::new(AtomicBool::new(false));
    let owner = Box::new(Owner(mem, dropped.clone()));
    // SAFETY: `area` is the heap buffer `owner` holds, alive while the pool needs it.
    let pool = unsafe { Mempool::create_extbuf(eal, &cfg, &[area], owner)? };
    ensure(pool.priv_size() == 64, "extbuf pool private area")?;
    let base = area.va as usize;
    let mut m = pool.alloc().ok_or_else(|| check("extbuf alloc"))?;
    m.append(10).ok_or_else(|| check("extbuf append"))?.fill(7);
    let at = m.data().as_ptr() as usize;
    ensure(
        at >= base && at + 10 <= base + area.len,
        "extbuf mbuf data lies in the external area",
    )?;
    let held = pool.clone();
    drop(pool);
    ensure(
        !dropped.load(Ordering::SeqCst),
        "memory kept while a handle lives",
    )?;
    drop(m);
    drop(held);
    ensure(
        dropped.load(Ordering::SeqCst),
        "memory released with the pool",
    )?;

    // Refused: element smaller than the data room, too little memory.
    let mut mem = vec![0u8; 4 * 2048];
    let small = ExtMem {
        va: mem.as_mut_ptr(),
        iova: ffi::RTE_BAD_IOVA,
        len: mem.len(),
        elt_size: 1024,
    };
    let bad = PoolConfig {
        data_room: 2048,
        ..PoolConfig::new("ldp_ext2", 4)
    };
    // SAFETY: refused before DPDK sees the area.
    let e = unsafe { Mempool::create_extbuf(eal, &bad, &[small], Box::new(())) };
    ensure(
        e.err().is_some_and(|e| e.to_string().contains("elt_size")),
        "elt_size below the data room is refused",
    )?;
    let few = ExtMem {
        elt_size: 2048,
        ..small
    };
    let big = PoolConfig {
        data_room: 2048,
        ..PoolConfig::new("ldp_ext3", 64)
    };
    // SAFETY: refused before DPDK sees the area.
    let e = unsafe { Mempool::create_extbuf(eal, &big, &[few], Box::new(())) };
    ensure(
        e.err()
            .is_some_and(|e| e.to_string().contains("hold 4 buffers")),
        "too little external memory is refused",
    )?;
    drop(mem);
    Ok(())
}

// ---------------------------------------------------------------- memif ---

const ETH_TEST: u16 = 0x88b5; // IEEE local experimental EtherType
const HDR: usize = 14 + 8 + 4; // eth + seq + len
const FIN_SEQ: u64 = u64::MAX;
const MAX_FRAME: usize = 9000;
const BURST: usize = 32;

/// Frame size for sequence number `seq`: mostly small, some MTU-sized,
/// some jumbo, all lengths 64..=9000 reachable.
fn frame_len(seq: u64) -> usize {
    let max = MAX_LEN.load(std::sync::atomic::Ordering::Relaxed);
    if max < 64 {
        return 64;
    }
    64 + (full_frame_len(seq) - 64) % (max - 63)
}

static MAX_LEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(MAX_FRAME);

fn full_frame_len(seq: u64) -> usize {
    let mut x = seq.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    let r = (x >> 8) as usize;
    match x % 100 {
        0..=49 => 64 + r % 64,
        50..=79 => 128 + r % (1518 - 128 + 1),
        80..=94 => 1519 + r % (4096 - 1519 + 1),
        _ => 4097 + r % (MAX_FRAME - 4097 + 1),
    }
}

struct Pattern {
    table: Vec<u8>,
}

impl Pattern {
    fn new() -> Self {
        Pattern {
            table: (0..251 + MAX_FRAME).map(|i| (i % 251) as u8).collect(),
        }
    }

    /// Expected bytes of frame `seq` from offset `off`, `n` long, written to `out`.
    fn fill(&self, hdr: &[u8; HDR], seq: u64, mut off: usize, out: &mut [u8]) {
        let mut done = 0;
        if off < HDR {
            let n = (HDR - off).min(out.len());
            out[..n].copy_from_slice(&hdr[off..off + n]);
            done = n;
            off += n;
        }
        if done < out.len() {
            let start = (seq.wrapping_mul(7) % 251) as usize + off - HDR;
            let n = out.len() - done;
            out[done..].copy_from_slice(&self.table[start..start + n]);
        }
    }

    /// Checks `got` against frame `seq` at offset `off`; returns the first bad offset.
    fn verify(&self, hdr: &[u8; HDR], seq: u64, off: usize, got: &[u8]) -> Option<usize> {
        let mut exp = [0u8; 2048];
        let mut pos = 0;
        while pos < got.len() {
            let n = (got.len() - pos).min(exp.len());
            self.fill(hdr, seq, off + pos, &mut exp[..n]);
            if exp[..n] != got[pos..pos + n] {
                let i = exp[..n]
                    .iter()
                    .zip(&got[pos..pos + n])
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                return Some(off + pos + i);
            }
            pos += n;
        }
        None
    }
}

fn header(src: [u8; 6], dst: [u8; 6], seq: u64, len: usize) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[0..6].copy_from_slice(&dst);
    h[6..12].copy_from_slice(&src);
    h[12..14].copy_from_slice(&ETH_TEST.to_be_bytes());
    h[14..22].copy_from_slice(&seq.to_be_bytes());
    h[22..26].copy_from_slice(&(len as u32).to_be_bytes());
    h
}

fn build_frame(mp: &Mempool, pat: &Pattern, src: [u8; 6], dst: [u8; 6], seq: u64) -> Option<Mbuf> {
    let len = if seq == FIN_SEQ { 64 } else { frame_len(seq) };
    let mut m = mp.alloc_chain(len)?;
    let hdr = header(src, dst, seq, len);
    let mut off = 0;
    for seg in m.segments_mut()? {
        pat.fill(&hdr, seq, off, seg);
        off += seg.len();
    }
    Some(m)
}

fn memif(o: &Opts) -> R<String> {
    let role = o.get("role")?.to_owned();
    let frames: u64 = o.num("frames", 1_000_000)?;
    let timeout = Duration::from_millis(o.num("timeout-ms", 60_000)?);
    MAX_LEN.store(
        o.num::<usize>("max-len", MAX_FRAME)?.min(MAX_FRAME),
        std::sync::atomic::Ordering::Relaxed,
    );
    let start = Instant::now();
    let deadline = start + timeout;
    let eal = Eal::init(o.eal.clone())?;
    let mut port = Port::by_name(
        &eal,
        o.kv.get("name").map(String::as_str).unwrap_or("net_memif0"),
    )?;
    let mp = pool(&eal, "ldp_memif", 8191)?;
    let info = port.info()?;
    port.configure(
        &PortConf {
            rx_desc: 1024,
            tx_desc: 1024,
            tx_offloads: info.tx_offload_capa & ffi::RTE_ETH_TX_OFFLOAD_MULTI_SEGS,
            ..Default::default()
        },
        &mp,
    )?;
    // A memif client's start fails until the server listens: wait for it.
    if role == "client" {
        let sock = o
            .eal
            .iter()
            .find_map(|a| a.split(',').find_map(|kv| kv.strip_prefix("socket=")))
            .ok_or_else(|| check("memif client needs socket= in its --vdev"))?;
        dpdk_sys::ethdev::wait_memif_listener(
            sock,
            deadline.saturating_duration_since(Instant::now()),
        )?;
    }
    // The client connects at start and a server that is not started yet
    // turns it away: restart the client until the link comes up. The server
    // never restarts (that would cut the client off).
    let left = deadline.saturating_duration_since(Instant::now());
    let retry = if role == "client" {
        Duration::from_millis(500)
    } else {
        left
    };
    port.start_until_link_up(left, retry)?;
    let (me, peer) = if role == "server" {
        ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
    } else {
        ([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1])
    };
    let base_in_use = mp.in_use_count();
    let mut rxq = port.rx_queue(0)?;
    let mut txq = port.tx_queue(0)?;
    let pat = Pattern::new();
    let traffic_start = Instant::now();

    let (mut next_tx, mut next_rx) = (0u64, 0u64);
    let (mut tx_bytes, mut rx_bytes, mut multiseg_rx) = (0u64, 0u64, 0u64);
    let mut pending: Vec<Mbuf> = Vec::with_capacity(BURST);
    let mut rx: Vec<Mbuf> = Vec::with_capacity(BURST);
    let (mut fin_sent, mut peer_fin) = (false, false);
    let mut done_at: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if now > deadline {
            return Err(check(format!(
                "{role}: timeout after {timeout:?}: sent {next_tx}/{frames}, received {next_rx}/{frames}, \
                 fin sent {fin_sent}, peer fin {peer_fin}"
            )));
        }
        // Refill the tx batch (frames, then our FIN once all peer frames arrived).
        while pending.len() < BURST && next_tx < frames {
            let Some(m) = build_frame(&mp, &pat, me, peer, next_tx) else {
                break;
            };
            tx_bytes += m.pkt_len() as u64;
            pending.push(m);
            next_tx += 1;
        }
        if !fin_sent && next_rx == frames && next_tx == frames && pending.len() < BURST {
            if let Some(m) = build_frame(&mp, &pat, me, peer, FIN_SEQ) {
                pending.push(m);
                fin_sent = true;
            }
        }
        txq.tx_burst(&mut pending);

        rx.clear();
        rxq.rx_burst(&mut rx, BURST);
        for m in rx.drain(..) {
            let mut h = [0u8; HDR];
            if m.read(0, &mut h) != HDR || h[12..14] != ETH_TEST.to_be_bytes() {
                return Err(check(format!(
                    "{role}: unexpected frame of {} bytes: {:02x?}",
                    m.pkt_len(),
                    &h
                )));
            }
            let seq = u64::from_be_bytes(h[14..22].try_into().unwrap_or_default());
            if seq == FIN_SEQ {
                peer_fin = true;
                continue;
            }
            if seq != next_rx {
                return Err(check(format!(
                    "{role}: frame {seq} arrived, expected {next_rx} (lost or reordered)"
                )));
            }
            let len = frame_len(seq);
            if m.pkt_len() != len {
                return Err(check(format!(
                    "{role}: frame {seq} has {} bytes, expected {len}",
                    m.pkt_len()
                )));
            }
            let hdr = header(peer, me, seq, len);
            let mut off = 0;
            for seg in m.segments() {
                if let Some(bad) = pat.verify(&hdr, seq, off, seg) {
                    return Err(check(format!(
                        "{role}: frame {seq} ({len} B, {} segs) differs at byte {bad}",
                        m.nb_segs()
                    )));
                }
                off += seg.len();
            }
            if m.nb_segs() > 1 {
                multiseg_rx += 1;
            }
            rx_bytes += len as u64;
            next_rx += 1;
        }

        let complete = next_rx == frames && fin_sent && pending.is_empty();
        if complete && peer_fin {
            // The peer has all our frames; stay a moment so it reads our FIN.
            let t = *done_at.get_or_insert(now);
            if now.duration_since(t) > Duration::from_millis(100) {
                break;
            }
        } else if complete && !port.link()?.up {
            // The peer left, which it does only after our FIN reached it.
            break;
        }
    }
    let elapsed = traffic_start.elapsed();
    drop(rx);
    let end_in_use = mp.in_use_count();
    if end_in_use != base_in_use {
        return Err(check(format!(
            "{role}: mbuf leak: {end_in_use} in use at the end, {base_in_use} at the start"
        )));
    }
    let st = port.stats()?;
    Ok(format!(
        "{role}: sent {frames} frames ({tx_bytes} B), received {frames} frames ({rx_bytes} B, {multiseg_rx} multi-segment) \
         all bytes verified in {:.2}s; mbufs in use {base_in_use} -> {end_in_use}; port stats ipackets={} opackets={}",
        elapsed.as_secs_f64(),
        st.ipackets,
        st.opackets
    ))
}

// ------------------------------------------------------------------ tap ---

fn parse_ip(s: &str) -> R<Ipv4Addr> {
    s.parse()
        .map_err(|_| check(format!("bad IPv4 address {s:?}")))
}

fn csum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in data.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn arp(
    op: u16,
    smac: [u8; 6],
    sip: Ipv4Addr,
    tmac: [u8; 6],
    tip: Ipv4Addr,
    dst: [u8; 6],
) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&smac);
    f.extend_from_slice(&0x0806u16.to_be_bytes());
    // RFC 826: htype 1 (Ethernet), ptype 0x0800, hlen 6, plen 4, op.
    f.extend_from_slice(&[0, 1, 8, 0, 6, 4]);
    f.extend_from_slice(&op.to_be_bytes());
    f.extend_from_slice(&smac);
    f.extend_from_slice(&sip.octets());
    f.extend_from_slice(&tmac);
    f.extend_from_slice(&tip.octets());
    f.resize(60, 0);
    f
}

fn icmp_echo(
    smac: [u8; 6],
    dmac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    id: u16,
    seq: u16,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dmac);
    f.extend_from_slice(&smac);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let total = 20 + 8 + payload.len();
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = 1; // ICMP
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    let mut icmp = vec![8u8, 0, 0, 0];
    icmp.extend_from_slice(&id.to_be_bytes());
    icmp.extend_from_slice(&seq.to_be_bytes());
    icmp.extend_from_slice(payload);
    let c = csum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&icmp);
    f
}

fn send(txq: &mut dpdk_sys::TxQueue, mp: &Mempool, frame: &[u8]) -> R<()> {
    let mut m = mp.alloc().ok_or_else(|| check("mempool empty"))?;
    m.append(frame.len() as u16)
        .ok_or_else(|| check("frame larger than one mbuf"))?
        .copy_from_slice(frame);
    let mut v = vec![m];
    let end = Instant::now() + Duration::from_secs(1);
    while !v.is_empty() {
        txq.tx_burst(&mut v);
        if Instant::now() > end {
            return Err(check("tx queue stays full"));
        }
    }
    Ok(())
}

fn run(cmd: &[&str]) -> R<()> {
    let out = std::process::Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .map_err(|e| check(format!("cannot run {cmd:?}: {e}")))?;
    if !out.status.success() {
        return Err(check(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

fn tap_signal(o: &Opts) -> R<String> {
    use dpdk_sys::tapsignal;
    let eal = Eal::init(o.eal.clone())?;
    let name = o.get("name")?;
    let (port, _mp) = started_tap_port(&eal, name, "ldp_tapsig")?;
    let info = port.info()?;
    let vdev = dpdk_sys::tapclaim::tap_iface_of(eal.args(), name);
    let iface = tapsignal::port_iface(&info.driver_name, info.if_index, vdev.as_deref())
        .ok_or_else(|| {
            check(format!(
                "no interface found for {name} ({})",
                info.driver_name
            ))
        })?;
    let (n, owned) = std::thread::spawn(move || {
        let n =
            tapsignal::direct_to_current_thread(&iface).map_err(|e| format!("redirect: {e}"))?;
        let me = tapsignal::current_tid();
        let owned = tapsignal::signalling_tun_fds(&iface)
            .into_iter()
            .all(|fd| tapsignal::signal_owner(fd).is_ok_and(|o| o == (true, me)));
        Ok::<_, String>((format!("iface={iface} redirected={n}"), owned))
    })
    .join()
    .map_err(|_| check("the thread panicked"))?
    .map_err(check)?;
    if !owned {
        return Err(check(format!("{n}: a queue file's signals go elsewhere")));
    }
    Ok(n)
}

/// net_tap after its receive pool ran dry: the kernel sends `count` UDP datagrams while
/// every free mbuf is held, the mbufs are released, the queue is polled for `quiet-ms`
/// without a kick and then again after [`dpdk_sys::tapsignal::kick`]. Prints the
/// datagrams received in each phase and the port's `rx_nombuf`.
fn tap_kick(o: &Opts) -> R<String> {
    use dpdk_sys::tapsignal;
    let iface = o.get("iface")?;
    let count: u64 = o.num("count", 20)?;
    let quiet = Duration::from_millis(o.num("quiet-ms", 300)?);
    let eal = Eal::init(o.eal.clone())?;
    let (mut port, mp) = started_tap_port(&eal, o.get("name")?, "ldp_tapkick")?;
    // No IPv6 on the link: its router solicitations and reports would arrive at random
    // and raise the signal the test is about.
    std::fs::write(format!("/proc/sys/net/ipv6/conf/{iface}/disable_ipv6"), "1")
        .map_err(|e| check(format!("disable IPv6 on {iface}: {e}")))?;
    run(&["ip", "addr", "add", o.get("kernel-addr")?, "dev", iface])?;
    run(&["ip", "link", "set", iface, "up"])?;
    let mac = port.mac()?;
    let mac_s = mac.map(|b| format!("{b:02x}")).join(":");
    let local = o.get("local")?;
    run(&[
        "ip",
        "neigh",
        "replace",
        local,
        "lladdr",
        &mac_s,
        "dev",
        iface,
        "nud",
        "permanent",
    ])?;
    tapsignal::direct_to_current_thread(iface).map_err(|e| check(format!("redirect: {e}")))?;
    let sig = tapsignal::receive_signal(iface)
        .ok_or_else(|| check(format!("{iface}: no receive signal")))?;
    let mut rxq = port.rx_queue(0)?;
    let mut rx = Vec::new();
    const DPORT: u16 = 47_111;
    // Datagrams to DPORT among the frames (the kernel also sends IPv6 and ARP traffic).
    let ours = |rx: &mut Vec<dpdk_sys::Mbuf>| {
        rx.drain(..)
            .filter(|m| {
                let f = m.to_vec();
                f.len() >= 42
                    && f[12..14] == [8, 0]
                    && f[23] == 17
                    && f[36..38] == DPORT.to_be_bytes()
            })
            .count() as u64
    };
    let poll_for = |rxq: &mut dpdk_sys::RxQueue, rx: &mut Vec<dpdk_sys::Mbuf>, d: Duration| {
        let end = Instant::now() + d;
        let mut n = 0;
        while Instant::now() < end {
            rxq.rx_burst(rx, 32);
            n += ours(rx);
        }
        n
    };
    // Settle: what the kernel sends when the link comes up.
    poll_for(&mut rxq, &mut rx, Duration::from_millis(200));
    port.reset_stats()?;
    let mut held = Vec::new();
    while let Some(m) = mp.alloc() {
        held.push(m);
    }
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").map_err(|e| check(format!("bind: {e}")))?;
    for i in 0..count {
        sock.send_to(&i.to_be_bytes(), (local, DPORT))
            .map_err(|e| check(format!("send: {e}")))?;
    }
    let dry = poll_for(&mut rxq, &mut rx, quiet);
    let nombuf = port.stats()?.rx_nombuf;
    let held_n = held.len();
    drop(held);
    let before = poll_for(&mut rxq, &mut rx, quiet);
    tapsignal::kick(sig).map_err(|e| check(format!("kick: {e}")))?;
    let after = poll_for(&mut rxq, &mut rx, quiet);
    Ok(format!(
        "held={held_n} dry={dry} nombuf={nombuf} before={before} after={after} sent={count}"
    ))
}

fn tap_ping(o: &Opts) -> R<String> {
    let timeout = Duration::from_millis(o.num("timeout-ms", 20_000)?);
    let deadline = Instant::now() + timeout;
    let local = parse_ip(o.get("local")?)?;
    let peer = parse_ip(o.get("peer")?)?;
    let iface = o.get("iface")?;
    let eal = Eal::init(o.eal.clone())?;
    let (mut port, mp) = started_tap_port(&eal, o.get("name")?, "ldp_tap")?;
    // The tap interface exists now (created at probe); give it the kernel's address.
    run(&["ip", "addr", "add", o.get("kernel-addr")?, "dev", iface])?;
    run(&["ip", "link", "set", iface, "up"])?;
    let mac = port.mac()?;
    let mut rxq = port.rx_queue(0)?;
    let mut txq = port.tx_queue(0)?;
    let mut rx = Vec::new();
    let (mut others, mut peer_mac, mut last_arp) = (0u64, None::<[u8; 6]>, None::<Instant>);
    // RFC 826: resolve the kernel's MAC, retrying while the interface comes up.
    while peer_mac.is_none() {
        if Instant::now() > deadline {
            return Err(check(format!(
                "no ARP reply from {peer} within {timeout:?} ({others} other frames seen)"
            )));
        }
        if last_arp.is_none_or(|t| t.elapsed() > Duration::from_millis(200)) {
            send(&mut txq, &mp, &arp(1, mac, local, [0; 6], peer, [0xff; 6]))?;
            last_arp = Some(Instant::now());
        }
        rx.clear();
        rxq.rx_burst(&mut rx, 32);
        for m in rx.drain(..) {
            let f = m.to_vec();
            if f.len() >= 42
                && f[12..14] == [8, 6]
                && f[20..22] == [0, 2]
                && f[28..32] == peer.octets()
                && f[38..42] == local.octets()
            {
                if f[0..6] != mac {
                    return Err(check(format!(
                        "ARP reply sent to {:02x?}, not to us {mac:02x?}",
                        &f[0..6]
                    )));
                }
                let mut sha = [0u8; 6];
                sha.copy_from_slice(&f[22..28]);
                peer_mac = Some(sha);
            } else {
                others += 1;
            }
        }
    }
    let peer_mac = peer_mac.unwrap_or_default();
    let payload: Vec<u8> = (0..56u8).collect();
    let (id, seq): (u16, u16) = (0x1d9, 1);
    let mut last_ping = None::<Instant>;
    loop {
        if Instant::now() > deadline {
            return Err(check(format!(
                "no ICMP echo reply from {peer} within {timeout:?}"
            )));
        }
        if last_ping.is_none_or(|t| t.elapsed() > Duration::from_millis(500)) {
            send(
                &mut txq,
                &mp,
                &icmp_echo(mac, peer_mac, local, peer, id, seq, &payload),
            )?;
            last_ping = Some(Instant::now());
        }
        rx.clear();
        rxq.rx_burst(&mut rx, 32);
        for m in rx.drain(..) {
            let f = m.to_vec();
            // Answer the kernel's ARP requests for our address.
            if f.len() >= 42
                && f[12..14] == [8, 6]
                && f[20..22] == [0, 1]
                && f[38..42] == local.octets()
            {
                let mut sha = [0u8; 6];
                sha.copy_from_slice(&f[22..28]);
                send(&mut txq, &mp, &arp(2, mac, local, sha, peer, sha))?;
                continue;
            }
            if f.len() < 42 || f[12..14] != [8, 0] || f[23] != 1 {
                continue;
            }
            let ihl = usize::from(f[14] & 0x0f) * 4;
            let ip = &f[14..14 + ihl];
            if ip[12..16] != peer.octets() || ip[16..20] != local.octets() {
                continue;
            }
            if csum(ip) != 0 {
                return Err(check("echo reply has a bad IPv4 header checksum"));
            }
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            let icmp = &f[14 + ihl..14 + total];
            // RFC 792: echo reply is type 0, code 0, same id/seq/data as the request.
            if icmp[0] != 0 || icmp[1] != 0 {
                continue;
            }
            if csum(icmp) != 0 {
                return Err(check("echo reply has a bad ICMP checksum"));
            }
            if icmp[4..6] != id.to_be_bytes()
                || icmp[6..8] != seq.to_be_bytes()
                || icmp[8..] != payload[..]
            {
                return Err(check("echo reply does not echo our id/seq/data"));
            }
            if f[0..6] != mac || f[6..12] != peer_mac {
                return Err(check("echo reply has unexpected MAC addresses"));
            }
            let st = port.stats()?;
            return Ok(format!(
                "ARP: {peer} is at {peer_mac:02x?}; ICMP echo reply from {peer} verified ({} data bytes); \
                 port stats ipackets={} opackets={}",
                payload.len(),
                st.ipackets,
                st.opackets
            ));
        }
    }
}
