//! `knb raw`: Ethernet frames ping-ponged between two DPDK processes, no
//! TCP — the physical limit of a transport on this machine.
//!
//! Transports (both ends are always DPDK; what differs is the path):
//! * `memif`: shared-memory rings between the two processes (the fast link).
//! * `af_packet`: each process on one end of a veth pair (kernel veth path).
//! * `tap`: each process on a tap interface, the two taps joined by a Linux
//!   bridge (kernel tap + bridge path).
//!
//! tap and af_packet run inside a private network namespace that `knb raw`
//! creates and deletes. No IP addresses are used: the frames are raw
//! Ethernet with a local experimental EtherType.
//!
//! One `knb raw` command orchestrates the run: it spawns the reflector and
//! the initiator as child processes (each with its own EAL), collects the
//! initiator's result and prints it. `--role initiator|reflector` run one end
//! by hand (memif only needs the same `--run-id` on both).
//!
//! Metrics: a *round trip* is one frame sent by the initiator and echoed by
//! the reflector. frames/s counts round trips per second (each is one frame
//! in each direction), Gbit/s is frames/s × frame size × 8 (one direction),
//! RTT is measured with the TSC from build to receipt of the echo.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use dpdk_sys::{ffi, Eal, Mbuf, Mempool, PoolConfig, Port, PortConf};
use hdrhistogram::Histogram;
use serde_json::{json, Value};

/// Which path the frames take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// Shared-memory rings between the processes.
    Memif,
    /// net_tap on both ends, taps joined by a kernel bridge.
    Tap,
    /// net_af_packet on both ends of a veth pair.
    AfPacket,
}

/// Which part of the run this process does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// Orchestrate: set up, spawn reflector and initiator, report.
    Both,
    /// Send frames and measure.
    Initiator,
    /// Echo frames back.
    Reflector,
}

fn parse_secs(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim_end_matches('s')
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(0.0..=3600.0).contains(&v) {
        return Err(format!("{v} s is outside 0..=3600"));
    }
    Ok(v)
}

fn parse_cpus(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("{s:?}: expected two CPU numbers like 0,1"))?;
    let p = |x: &str| {
        x.trim()
            .parse::<u32>()
            .map_err(|_| format!("{x:?} is not a CPU number"))
    };
    Ok((p(a)?, p(b)?))
}

/// Arguments of `knb raw`.
#[derive(Args, Debug, Clone)]
pub struct RawArgs {
    /// Path the frames take.
    #[arg(long, value_enum, default_value = "memif")]
    transport: Transport,
    /// Ethernet frame size in bytes (without FCS); above 2048 frames are chained mbufs.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(64..=9000))]
    frame_size: u16,
    /// Frames per rx/tx burst.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=512))]
    burst: u16,
    /// A receive burst of more frames is handled in two halves, the first half's echoes
    /// (reflector) or next requests (initiator) sent before the second half is read:
    /// what luna's cores do (r2c's `rx_split`), so that one burst taking the peer's whole
    /// window does not put the two sides in lock-step. 0 = never split.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(0..=512))]
    rx_split: u16,
    /// Frames outstanding (sent, echo not yet received).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    iodepth: u32,
    /// Measured time in seconds (after warm-up).
    #[arg(long, default_value = "5", value_parser = parse_secs)]
    duration: f64,
    /// Warm-up time in seconds (not measured).
    #[arg(long, default_value = "1", value_parser = parse_secs)]
    warmup: f64,
    /// Also write the result as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Which part of the run this process does.
    #[arg(long, value_enum, default_value = "both")]
    role: Role,
    /// CPUs for the initiator and the reflector.
    #[arg(long, default_value = "0,1", value_parser = parse_cpus)]
    cpus: (u32, u32),
    /// Prefix for the EAL file prefix, memif socket and namespace names.
    #[arg(long, default_value = "knb")]
    name_prefix: String,
    /// Shared run id (set by the orchestrator; default `<prefix>-<pid>`).
    #[arg(long)]
    run_id: Option<String>,
    /// Internal: print the result as one `KNB_RESULT` JSON line.
    #[arg(long, hide = true)]
    child: bool,
    /// Internal: the reflector's pid, whose CPU the initiator samples with its own over
    /// the measured window (contention detection).
    #[arg(long, hide = true)]
    peer_pid: Option<u32>,
}

type Res<T> = Result<T, String>;

const ETH_KNB: u16 = 0x88b5; // IEEE local experimental EtherType
const MAGIC: u32 = 0x4b4e_4252; // "KNBR"
const KIND_DATA: u8 = 0;
const KIND_STOP: u8 = 1;
const HDR: usize = 14 + 4 + 4 + 8 + 8;
const INITIATOR_MAC: [u8; 6] = [0x02, 0x6b, 0x6e, 0x62, 0, 1];
const REFLECTOR_MAC: [u8; 6] = [0x02, 0x6b, 0x6e, 0x62, 0, 2];
/// No echo for this long → the outstanding frames are counted lost and resent.
const LOSS_TIMEOUT: Duration = Duration::from_millis(200);
const NS_IFACES: [&str; 2] = ["knbif0", "knbif1"];

impl RawArgs {
    fn run_id(&self) -> String {
        self.run_id
            .clone()
            .unwrap_or_else(|| format!("{}-{}", self.name_prefix, std::process::id()))
    }

    fn validate(&self) -> Res<()> {
        if self.duration <= 0.0 {
            return Err("--duration must be > 0".into());
        }
        let id = self.run_id();
        if id.is_empty()
            || id.len() > 40
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(format!(
                "run id {id:?} must be 1..=40 characters of [A-Za-z0-9_-] (check --name-prefix)"
            ));
        }
        if self.role == Role::Both && self.transport != Transport::Memif && !is_root() {
            return Err("--transport tap/af_packet create a network namespace: run as root".into());
        }
        Ok(())
    }

    /// Frame room per memif/af_packet buffer: one buffer per frame (22.11's
    /// memif corrupts frames spanning several descriptors).
    fn buf_size(&self) -> u32 {
        (self.frame_size as u32 + 128).next_power_of_two().max(2048)
    }

    fn eal_args(&self, role: Role) -> Res<Vec<String>> {
        let id = self.run_id();
        let (cpu, idx, role_name) = match role {
            Role::Reflector => (self.cpus.1, 1, "reflector"),
            _ => (self.cpus.0, 0, "initiator"),
        };
        let vdev = match self.transport {
            // The stacks' link: the same bytes of buffers per ring (`memif_ring_args`).
            Transport::Memif => format!(
                "net_memif0,role={},socket=/tmp/{id}.sock{}",
                if role == Role::Reflector {
                    "server"
                } else {
                    "client"
                },
                crate::workload::memif_ring_args(self.buf_size()).map_err(|e| e.to_string())?
            ),
            Transport::Tap => format!("net_tap0,iface={}", NS_IFACES[idx]),
            Transport::AfPacket => {
                let fs = self.buf_size();
                format!(
                    "net_af_packet0,iface={},framesz={fs},blocksz={},framecnt=1024",
                    NS_IFACES[idx],
                    fs.max(4096)
                )
            }
        };
        Ok(vec![
            "--no-pci".into(),
            "--in-memory".into(),
            "--no-telemetry".into(),
            format!("--file-prefix={id}-{role_name}"),
            format!("--lcores=0@{cpu}"),
            format!("--vdev={vdev}"),
        ])
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Entry point of `knb raw`.
pub fn run(a: RawArgs) -> Res<()> {
    a.validate()?;
    match a.role {
        Role::Both => {
            let r = orchestrate(&a)?;
            report(&a, &r)
        }
        Role::Reflector => reflector(&a),
        Role::Initiator => {
            let r = initiator(&a)?;
            if a.child {
                println!("KNB_RESULT {r}");
                return Ok(());
            }
            report(&a, &r)
        }
    }
}

// ------------------------------------------------------------ data path ---

struct Dev {
    eal: Eal,
    port: Port,
    pool: Mempool,
    rxq: dpdk_sys::RxQueue,
    txq: dpdk_sys::TxQueue,
}

fn open_dev(a: &RawArgs, role: Role) -> Res<Dev> {
    let eal = Eal::builder()
        .args(a.eal_args(role)?)
        .log_to_stderr(true)
        .init()
        .map_err(|e| e.to_string())?;
    let mut port = Port::by_name(
        &eal,
        match a.transport {
            Transport::Memif => "net_memif0",
            Transport::Tap => "net_tap0",
            Transport::AfPacket => "net_af_packet0",
        },
    )
    .map_err(|e| e.to_string())?;
    // af_packet copies each frame into one mbuf: give it room for a whole
    // frame. memif and tap chain mbufs of the default 2048 B data room.
    let mut pc = PoolConfig::new("knb_raw", 16383);
    if a.transport == Transport::AfPacket {
        pc.data_room = (a.buf_size() + ffi::RTE_PKTMBUF_HEADROOM) as u16;
        pc.size = 4095;
    }
    let pool = Mempool::create(&eal, &pc).map_err(|e| e.to_string())?;
    let info = port.info().map_err(|e| e.to_string())?;
    // net_tap drops tx frames above its MTU + 22 B and ethdev refuses MTUs
    // beyond max_rx_pktlen (1522 B in 22.11), so larger frames cannot pass.
    if a.transport == Transport::Tap && a.frame_size as u32 > info.max_rx_pktlen {
        return Err(format!(
            "net_tap ({}) carries frames of at most {} B; --frame-size {} needs --transport memif or af-packet",
            dpdk_sys::eal::version(),
            info.max_rx_pktlen,
            a.frame_size
        ));
    }
    let chained = a.frame_size as usize > pool.seg_capacity();
    let mut conf = PortConf {
        rx_desc: 1024,
        tx_desc: 1024,
        tx_offloads: info.tx_offload_capa & ffi::RTE_ETH_TX_OFFLOAD_MULTI_SEGS,
        ..Default::default()
    };
    if chained {
        conf.rx_offloads = info.rx_offload_capa & ffi::RTE_ETH_RX_OFFLOAD_SCATTER;
    }
    // Frames above 1514 B need a larger MTU where the device can take one
    // (memif and tap report a 1518/1522 B limit but pass larger frames).
    let mtu = (a.frame_size as u32).saturating_sub(14);
    if mtu > 1500 && info.max_rx_pktlen >= a.frame_size as u32 + 4 {
        conf.mtu = Some(mtu.min(info.max_mtu as u32) as u16);
    }
    port.configure(&conf, &pool).map_err(|e| e.to_string())?;
    if a.transport == Transport::Memif && role != Role::Reflector {
        let sock = format!("/tmp/{}.sock", a.run_id());
        dpdk_sys::ethdev::wait_memif_listener(&sock, Duration::from_secs(20))
            .map_err(|e| e.to_string())?;
    }
    // A memif client connects at start; a server not started yet turns it
    // away for good, so the client restarts until the link is up.
    // The server (reflector) never restarts: that would cut a client off.
    let retry = if role == Role::Reflector {
        Duration::from_secs(30)
    } else {
        Duration::from_millis(500)
    };
    port.start_until_link_up(Duration::from_secs(30), retry)
        .map_err(|e| e.to_string())?;
    let _ = port.set_promiscuous(true);
    let rxq = port.rx_queue(0).map_err(|e| e.to_string())?;
    let txq = port.tx_queue(0).map_err(|e| e.to_string())?;
    Ok(Dev {
        eal,
        port,
        pool,
        rxq,
        txq,
    })
}

fn build(pool: &Mempool, len: usize, kind: u8, seq: u64, tsc: u64) -> Option<Mbuf> {
    let mut m = pool.alloc_chain(len)?;
    let mut h = [0u8; HDR];
    h[0..6].copy_from_slice(&REFLECTOR_MAC);
    h[6..12].copy_from_slice(&INITIATOR_MAC);
    h[12..14].copy_from_slice(&ETH_KNB.to_be_bytes());
    h[14..18].copy_from_slice(&MAGIC.to_be_bytes());
    h[18] = kind;
    h[22..30].copy_from_slice(&seq.to_be_bytes());
    h[30..38].copy_from_slice(&tsc.to_be_bytes());
    m.write(0, &h)?;
    Some(m)
}

/// (kind, seq, tsc) of a knb frame, None for anything else.
fn parse(m: &Mbuf) -> Option<(u8, u64, u64)> {
    let mut h = [0u8; HDR];
    if m.read(0, &mut h) != HDR
        || h[12..14] != ETH_KNB.to_be_bytes()
        || h[14..18] != MAGIC.to_be_bytes()
    {
        return None;
    }
    let n = |r: std::ops::Range<usize>| u64::from_be_bytes(h[r].try_into().unwrap_or_default());
    Some((h[18], n(22..30), n(30..38)))
}

fn reflector(a: &RawArgs) -> Res<()> {
    let mut d = open_dev(a, Role::Reflector)?;
    let deadline = Instant::now() + Duration::from_secs_f64(a.warmup + a.duration + 60.0);
    let burst = a.burst as usize;
    let (mut rx, mut pending) = (
        Vec::with_capacity(burst),
        Vec::<Mbuf>::with_capacity(4 * burst),
    );
    let (mut echoed, mut dropped) = (0u64, 0u64);
    #[cfg(feature = "phases")]
    let mut phases = ReflectorPhases::default();
    let mut next_link_check = Instant::now();
    'outer: while Instant::now() < deadline {
        // memif: the initiator leaving takes the link down; stop even if
        // its STOP frames were lost.
        if a.transport == Transport::Memif && echoed > 0 && Instant::now() >= next_link_check {
            next_link_check = Instant::now() + Duration::from_millis(100);
            if !d.port.link().map(|l| l.up).unwrap_or(false) {
                break;
            }
        }
        rx.clear();
        #[cfg(feature = "phases")]
        let t0 = dpdk_sys::eal::rdtsc();
        if d.rxq.rx_burst(&mut rx, burst) == 0 && pending.is_empty() {
            continue;
        }
        #[cfg(feature = "phases")]
        let (t1, received) = (dpdk_sys::eal::rdtsc(), !rx.is_empty());
        // The first half's echoes leave before the second half is looked at (`rx_split`).
        let mut part = r2c::rx_split_first(rx.len(), usize::from(a.rx_split));
        let mut sent = 0;
        while !rx.is_empty() {
            for mut m in rx.drain(..part) {
                match parse(&m) {
                    Some((KIND_STOP, ..)) => break 'outer,
                    Some(_) => {}
                    None => continue, // not ours (kernel noise on tap/veth)
                }
                // Echo in place: swap MACs, send the same mbuf back.
                let Some(eth) = m.data_mut() else { continue };
                let mut tmp = [0u8; 6];
                tmp.copy_from_slice(&eth[0..6]);
                eth.copy_within(6..12, 0);
                eth[6..12].copy_from_slice(&tmp);
                if pending.len() < 8 * burst {
                    pending.push(m);
                } else {
                    dropped += 1;
                }
            }
            if !rx.is_empty() {
                sent += d.txq.tx_burst(&mut pending);
                part = rx.len();
            }
        }
        #[cfg(feature = "phases")]
        let t2 = dpdk_sys::eal::rdtsc();
        sent += d.txq.tx_burst(&mut pending);
        echoed += sent as u64;
        #[cfg(feature = "phases")]
        if received && sent > 0 {
            phases.record([t0, t1, t2, dpdk_sys::eal::rdtsc()]);
        }
    }
    #[cfg(feature = "phases")]
    println!("KNB_PHASES {}", phases.to_json(d.eal.tsc_hz()));
    drop(pending);
    let st = d.port.stats().map_err(|e| e.to_string())?;
    eprintln!("knb raw reflector: echoed {echoed} frames, dropped {dropped}, port {st:?}, mbufs in use {}", d.pool.in_use_count());
    Ok(())
}

/// Feature `phases`: the reflector's time per iteration that received and echoed, split
/// as r2c's `phase_*` counters split luna's (receive burst, the echo's own work, transmit
/// burst), in TSC ticks.
#[cfg(feature = "phases")]
#[derive(Default)]
struct ReflectorPhases {
    iterations: u64,
    ticks: [u64; 3],
}

#[cfg(feature = "phases")]
impl ReflectorPhases {
    fn record(&mut self, t: [u64; 4]) {
        self.iterations += 1;
        for i in 0..3 {
            self.ticks[i] += t[i + 1].saturating_sub(t[i]);
        }
    }

    fn to_json(&self, hz: u64) -> Value {
        let ns = |i: usize| {
            let n = self.iterations.max(1) as f64;
            (self.ticks[i] as f64 * 1e9 / hz.max(1) as f64 / n * 10.0).round() / 10.0
        };
        json!({"iterations": self.iterations, "rx_ns": ns(0), "app_ns": ns(1), "tx_ns": ns(2)})
    }
}

fn initiator(a: &RawArgs) -> Res<Value> {
    let mut d = open_dev(a, Role::Initiator)?;
    let hz = d.eal.tsc_hz();
    let len = a.frame_size as usize;
    let burst = a.burst as usize;
    let iodepth = a.iodepth as usize;
    let segs = len.div_ceil(d.pool.seg_capacity());
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).map_err(|e| e.to_string())?;
    let (mut rx, mut pending) = (Vec::with_capacity(burst), Vec::<Mbuf>::with_capacity(burst));
    let (mut next_seq, mut valid_from, mut inflight) = (0u64, 0u64, 0usize);
    let (mut frames, mut lost, mut late, mut nombuf) = (0u64, 0u64, 0u64, 0u64);
    let start = Instant::now();
    let warm_end = start + Duration::from_secs_f64(a.warmup);
    let end = warm_end + Duration::from_secs_f64(a.duration);
    let mut last_progress = start;
    let mut measuring = false;
    let mut measure_start = warm_end;
    let mut window = None;
    // The next requests (up to `iodepth` in flight, a burst at most), offered to the
    // device.
    macro_rules! send_more {
        () => {
            while inflight + pending.len() < iodepth && pending.len() < burst {
                match build(&d.pool, len, KIND_DATA, next_seq, dpdk_sys::eal::rdtsc()) {
                    Some(m) => {
                        pending.push(m);
                        next_seq += 1;
                    }
                    None => {
                        nombuf += 1;
                        break;
                    }
                }
            }
            inflight += d.txq.tx_burst(&mut pending);
        };
    }
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        if !measuring && now >= warm_end {
            measuring = true;
            measure_start = now;
            window = crate::cpu::Window::start(a.peer_pid);
        }
        send_more!();
        rx.clear();
        d.rxq.rx_burst(&mut rx, burst);
        if rx.is_empty() {
            if inflight > 0 && now.duration_since(last_progress) > LOSS_TIMEOUT {
                // Outstanding frames are gone (tap/veth drop under load): count and move on.
                lost += inflight as u64;
                inflight = 0;
                valid_from = next_seq;
                last_progress = now;
            }
            continue;
        }
        let t = dpdk_sys::eal::rdtsc();
        // The next requests for the first half's answers leave before the second half is
        // looked at (`rx_split`).
        let mut part = r2c::rx_split_first(rx.len(), usize::from(a.rx_split));
        while !rx.is_empty() {
            for m in rx.drain(..part) {
                let Some((KIND_DATA, seq, ts)) = parse(&m) else {
                    continue;
                };
                if seq < valid_from || seq >= next_seq {
                    late += 1;
                    continue;
                }
                inflight = inflight.saturating_sub(1);
                last_progress = now;
                if measuring {
                    frames += 1;
                    let ns = (t.saturating_sub(ts) as u128 * 1_000_000_000 / hz as u128) as u64;
                    let _ = hist.record(ns.max(1));
                }
            }
            if !rx.is_empty() {
                send_more!();
                part = rx.len();
            }
        }
    }
    let secs = Instant::now().duration_since(measure_start).as_secs_f64();
    // Before the stop frames: the reflector is still polling.
    let cpu = window.map_or(Value::Null, crate::cpu::Window::finish);
    // Tell the reflector to stop (a few times: tap/veth may drop one).
    for _ in 0..5 {
        if let Some(m) = build(&d.pool, 64, KIND_STOP, u64::MAX, 0) {
            let mut v = vec![m];
            d.txq.tx_burst(&mut v);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(pending);
    if frames == 0 {
        return Err(format!(
            "no echo received in {:.1} s of measurement ({lost} frames lost): is the reflector running on the same {:?} link?",
            a.duration, a.transport
        ));
    }
    let fps = frames as f64 / secs;
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok(json!({
        "transport": format!("{:?}", a.transport).to_lowercase(),
        "frame_size": len,
        "segments_per_frame": segs,
        "burst": burst,
        // The link's ring (memif only): which one a ceiling was measured on.
        "memif_ring": (a.transport == Transport::Memif)
            .then(|| crate::workload::memif_ring_args(a.buf_size()).ok())
            .flatten()
            .map(|r| r.trim_start_matches(',').to_string()),
        "iodepth": iodepth,
        "duration_s": secs,
        "warmup_s": a.warmup,
        "round_trips": frames,
        "frames_per_sec": fps,
        "gbit_per_sec": fps * len as f64 * 8.0 / 1e9,
        "cpu": cpu,
        "rtt_p50_us": us(0.5),
        "rtt_p99_us": us(0.99),
        "rtt_p999_us": us(0.999),
        "rtt_max_us": hist.max() as f64 / 1000.0,
        "lost": lost,
        "late": late,
        "mbuf_alloc_failures": nombuf,
        "dpdk": dpdk_sys::eal::version(),
    }))
}

// --------------------------------------------------------- orchestration ---

fn report(a: &RawArgs, r: &Value) -> Res<()> {
    let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    let u = |k: &str| r[k].as_u64().unwrap_or(0);
    println!(
        "{:<9} {:>6} {:>5} {:>7} {:>9} {:>12} {:>8} {:>9} {:>9} {:>9} {:>6}",
        "transport",
        "frame",
        "burst",
        "iodepth",
        "seconds",
        "frames/s",
        "Gbit/s",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "lost"
    );
    println!(
        "{:<9} {:>6} {:>5} {:>7} {:>9.2} {:>12.0} {:>8.3} {:>9.2} {:>9.2} {:>9.2} {:>6}",
        r["transport"].as_str().unwrap_or("?"),
        u("frame_size"),
        u("burst"),
        u("iodepth"),
        f("duration_s"),
        f("frames_per_sec"),
        f("gbit_per_sec"),
        f("rtt_p50_us"),
        f("rtt_p99_us"),
        f("rtt_p999_us"),
        u("lost")
    );
    let p = &r["reflector_phases"];
    if let Some(n) = p["iterations"].as_u64() {
        let ns = |k: &str| p[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "  reflector iterations that received and sent (phases): rx {:.0}, app {:.0}, tx {:.0} ns (sum {:.0}) over {n} iterations",
            ns("rx_ns"),
            ns("app_ns"),
            ns("tx_ns"),
            ns("rx_ns") + ns("app_ns") + ns("tx_ns")
        );
    }
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(r).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write --json {}: {e}", path.display()))?;
    }
    Ok(())
}

fn ip(args: &[&str]) -> Res<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// A network namespace for tap/af_packet, deleted on drop (also on error).
struct Netns(String);

impl Netns {
    fn create(name: &str, t: Transport) -> Res<Netns> {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        ip(&["netns", "add", name])?;
        let ns = Netns(name.to_owned());
        // No IPv6 autoconf chatter on the test links.
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                name,
                "sysctl",
                "-qw",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ])
            .output()
            .map_err(|e| format!("cannot run sysctl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "sysctl in {name} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        match t {
            Transport::AfPacket => {
                ip(&[
                    "-n",
                    name,
                    "link",
                    "add",
                    NS_IFACES[0],
                    "mtu",
                    "9000",
                    "type",
                    "veth",
                    "peer",
                    "name",
                    NS_IFACES[1],
                    "mtu",
                    "9000",
                ])?;
                for i in NS_IFACES {
                    ip(&["-n", name, "link", "set", i, "up"])?;
                }
            }
            Transport::Tap => {
                ip(&[
                    "-n", name, "link", "add", "knbbr0", "mtu", "9000", "type", "bridge",
                ])?;
                ip(&["-n", name, "link", "set", "knbbr0", "up"])?;
            }
            Transport::Memif => {}
        }
        Ok(ns)
    }

    /// Waits for a tap created by DPDK, then bridges it.
    fn attach_tap(&self, iface: &str, owner: &mut ChildProc, within: Duration) -> Res<()> {
        let end = Instant::now() + within;
        while Command::new("ip")
            .args(["-n", &self.0, "link", "show", iface])
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            if let Ok(Some(_)) = owner.child.try_wait() {
                return Err(format!(
                    "the {} exited before its tap {iface} appeared",
                    owner.name
                ));
            }
            if Instant::now() > end {
                return Err(format!(
                    "tap {iface} did not appear in namespace {} within {within:?}",
                    self.0
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        ip(&[
            "-n", &self.0, "link", "set", iface, "mtu", "9000", "master", "knbbr0", "up",
        ])
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

struct ChildProc {
    child: Child,
    name: &'static str,
    stdout: Option<std::thread::JoinHandle<String>>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

fn collect<R: Read + Send + 'static>(r: R) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            s.push_str(&line);
            s.push('\n');
        }
        s
    })
}

impl ChildProc {
    fn spawn(a: &RawArgs, role: Role, ns: Option<&Netns>, name: &'static str) -> Res<ChildProc> {
        let exe =
            std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns.0]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.arg("raw")
            .args([
                "--role",
                if role == Role::Reflector {
                    "reflector"
                } else {
                    "initiator"
                },
            ])
            .args([
                "--transport",
                a.transport
                    .to_possible_value()
                    .map(|v| v.get_name().to_owned())
                    .unwrap_or_default()
                    .as_str(),
            ])
            .args([
                "--frame-size",
                &a.frame_size.to_string(),
                "--burst",
                &a.burst.to_string(),
                "--rx-split",
                &a.rx_split.to_string(),
            ])
            .args(["--iodepth", &a.iodepth.to_string()])
            .args([
                "--duration",
                &a.duration.to_string(),
                "--warmup",
                &a.warmup.to_string(),
            ])
            .args([
                "--cpus",
                &format!("{},{}", a.cpus.0, a.cpus.1),
                "--run-id",
                &a.run_id(),
                "--child",
            ])
            .args(a.peer_pid.map(|p| format!("--peer-pid={p}")))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start the {name}: {e}"))?;
        let stdout = child.stdout.take().map(collect);
        let stderr = child.stderr.take().map(collect);
        Ok(ChildProc {
            child,
            name,
            stdout,
            stderr,
        })
    }

    /// Waits up to `limit` (kills the child past it); returns (success, stdout, stderr).
    fn finish(mut self, limit: Duration) -> (bool, String, String) {
        let end = Instant::now() + limit;
        let mut ok = false;
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) => {
                    ok = st.success();
                    break;
                }
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
            }
        }
        let out = self
            .stdout
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        let mut err = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        if !ok {
            err.push_str(&format!(
                "({} failed or did not finish within {limit:?})\n",
                self.name
            ));
        }
        (ok, out, err)
    }
}

impl RawArgs {
    /// A memif run for `knb compare`/`sweep`: the raw ceiling at `frame_size` and
    /// `iodepth`, initiator on `cpus.0`, reflector on `cpus.1`.
    pub fn memif_ceiling(
        frame_size: u16,
        iodepth: u32,
        duration: f64,
        warmup: f64,
        cpus: (u32, u32),
        run_id: String,
    ) -> RawArgs {
        RawArgs {
            transport: Transport::Memif,
            frame_size: frame_size.clamp(64, 9000),
            burst: 32,
            rx_split: 4,
            iodepth: iodepth.clamp(1, 4096),
            duration,
            warmup,
            json: None,
            role: Role::Both,
            cpus,
            name_prefix: "lkb".into(),
            run_id: Some(run_id),
            child: false,
            peer_pid: None,
        }
    }
}

/// Runs `a` (role both) and returns the initiator's result without printing.
pub fn measure(a: &RawArgs) -> Res<Value> {
    a.validate()?;
    orchestrate(a)
}

fn orchestrate(a: &RawArgs) -> Res<Value> {
    let id = a.run_id();
    let a = RawArgs {
        run_id: Some(id.clone()),
        ..a.clone()
    };
    let ns = match a.transport {
        Transport::Memif => None,
        t => Some(Netns::create(&id, t)?),
    };
    let mut reflector = ChildProc::spawn(&a, Role::Reflector, ns.as_ref(), "reflector")?;
    let attach = |i: usize, owner: &mut ChildProc| match (&ns, a.transport) {
        (Some(ns), Transport::Tap) => ns.attach_tap(NS_IFACES[i], owner, Duration::from_secs(20)),
        _ => Ok(()),
    };
    if let Err(e) = attach(1, &mut reflector) {
        let (_, _, rerr) = reflector.finish(Duration::from_secs(1));
        return Err(format!(
            "{e}\n  reflector:\n    {}",
            rerr.trim_end().replace('\n', "\n    ")
        ));
    }
    let ia = RawArgs {
        peer_pid: Some(reflector.child.id()),
        ..a.clone()
    };
    let mut initiator = ChildProc::spawn(&ia, Role::Initiator, ns.as_ref(), "initiator")?;
    if let Err(e) = attach(0, &mut initiator) {
        let (_, _, ierr) = initiator.finish(Duration::from_secs(1));
        let _ = reflector.finish(Duration::from_secs(1));
        return Err(format!(
            "{e}\n  initiator:\n    {}",
            ierr.trim_end().replace('\n', "\n    ")
        ));
    }
    let limit = Duration::from_secs_f64(a.warmup + a.duration + 60.0);
    let (iok, iout, ierr) = initiator.finish(limit);
    let (_rok, rout, rerr) = reflector.finish(Duration::from_secs(10));
    // A child killed on timeout leaves its EAL runtime directory behind.
    for role in ["initiator", "reflector"] {
        let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/{id}-{role}"));
    }
    let result = iout
        .lines()
        .find_map(|l| l.strip_prefix("KNB_RESULT "))
        .map(serde_json::from_str::<Value>);
    // Feature `phases`: the reflector's phase times, when it printed them.
    let phases = rout
        .lines()
        .find_map(|l| l.strip_prefix("KNB_PHASES "))
        .and_then(|l| serde_json::from_str::<Value>(l).ok());
    match (iok, result) {
        (true, Some(Ok(mut r))) => {
            if let Some(p) = phases {
                r["reflector_phases"] = p;
            }
            Ok(r)
        }
        _ => {
            let tail = |s: &str| {
                s.lines()
                    .rev()
                    .take(15)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n    ")
            };
            Err(format!(
                "the {:?} run failed.\n  initiator:\n    {}\n    {}\n  reflector:\n    {}",
                a.transport,
                tail(&iout),
                tail(&ierr),
                tail(&rerr)
            ))
        }
    }
}
