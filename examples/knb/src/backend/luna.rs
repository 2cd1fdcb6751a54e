//! luna through the r2c runtime: two DPDK processes over the testbed's memif link, the
//! same placement as smoltcp (one queue pair, one core and one `luna_stack` `Stack` per
//! thread; memif pairs client queue *i* with server queue *i*).
//!
//! * Device: [`r2c::device::dpdk::DpdkDevice`]: received frames are zbuf zone objects
//!   handed to the stack as `Zbuf`s (no copy); on transmit, every frame is one flat copy
//!   on memif in copy mode (r2c's default there: the PMD copies every frame anyway;
//!   jumbo frames into r2c's copy pool), a zero-copy memif client's go out as
//!   external-buffer mbufs over the application's `Zbuf`s.
//! * Server: an inline-r2c app ([`r2c::InlineApp`]). Received `Zbuf`s are parsed in place
//!   by [`ServerConn`] (message mode); a response is its 16-byte header (written into a
//!   small buffer shared by the responses of one batch) followed by a slice of one
//!   preallocated zero buffer (a reference count, no per-RPC payload copy). With
//!   `--verify` the patterned payload is generated, as the protocol requires.
//! * Client: an inline-r2c app driving [`ClientWorker`] (message mode) from `on_poll`:
//!   requests are built the same way, responses are fed to the worker from the received
//!   `Zbuf`s. Closed loop, open loop and bulk all work; only the connections that
//!   completed RPCs or got new requests are visited per iteration, so 5,000
//!   connections cost what their traffic costs.
//! * Sending: both sides pack their queued pieces into `Zbuf`s while the connection's
//!   send buffer has room and hand them to r2c's all-or-nothing `Ctx::send_all`; the part
//!   of the last pack TCP cannot take yet waits in r2c's backlog (knb keeps no queue of
//!   its own), and nothing more is packed until it has drained. The server stops reading
//!   a connection while `Ctx::send_backlog` plus its unpacked answers reach
//!   `SERVER_TX_LIMIT`. A pack that finds no free buffer (the slab held by data not yet
//!   acknowledged: overload) takes nothing from the queue; on either side the connection
//!   then waits in its lane's `starved` queue, retried every iteration, and each refused
//!   try is counted (`tx_memory_waits`) — back pressure, never a failed connection. The memif
//!   placement, EAL lane registration and vdev parsing are shared with the smoltcp
//!   backend ([`super::memif`]).
//! * The poll-loop threads are registered with the EAL (mempool caches) and pinned to
//!   `--cpus`; the clock is the TSC; idle cores busy-poll. A full memif ring (the peer
//!   busy or descheduled) is waited out, never turned into drops.
//! * `--mtu` (workload) sets the stack's MTU and MSS and sizes the receive buffers to
//!   hold a whole frame; the orchestrator sizes the memif buffers (`bsize`) to match.
//!
//! * Checksums: memif is a virtual link, so the device reports them offloaded and
//!   nobody computes or verifies them (`DpdkDeviceConfig::virtual_link_checksums`), as
//!   the kernel on veth and the smoltcp backend; `KNB_SOFTWARE_CHECKSUMS=1` computes
//!   them in software on both memif stacks.
//!
//! Experiment knob (environment, read by both child processes):
//! `KNB_LUNA_TX_COPY_MAX=<bytes>` copies frames up to that size into one flat mbuf
//! instead of attaching the payload ([`DpdkDeviceConfig::tx_copy_max`]); `0` forces the
//! zero-copy chain. Unset, r2c chooses: memif copies every frame anyway, so in copy mode
//! every frame goes as one flat copy, which costs less than building and freeing a chain
//! (docs/benchmarks.md, "Flat transmit copy on memif by default", "Jumbo frames copied
//! flat"); a zero-copy client keeps the chain. The copied bytes show in `copied_bytes`.
//!
//! `KNB_LUNA_SLAB_MB=<MiB>` sets each process's zbuf memory (default 128 MiB, 48 to
//! 4,096; the device's receive buffers take 32 MiB of it), `KNB_LUNA_SERVER_SLAB_MB` the
//! server's alone: a small slab makes a side run out of buffers under load, which must
//! slow it down (`tx_memory_waits`), not fail connections.
//!
//! `KNB_LUNA_TLP_US=<us>` sets the tail loss probes' least timeout
//! ([`luna_stack::tcp::TcpConfig::tlp`]; `0` turns probing off; unset: the default).
//!
//! `KNB_LUNA_DELAYED_ACK_US=<us>` turns on delayed ACKs with that timeout
//! ([`luna_stack::tcp::TcpConfig::delayed_ack`]: at least every second full-sized
//! segment is still acknowledged at once; `0` or unset: every segment, the default).
//!
//! `KNB_VIRTUAL_START=taken` (timer mode) starts every virtual worker's occupation when
//! the I/O core's turn took its message, as before msgsched's start times; `ready` or
//! unset: when a real worker would have started it ([`msgsched::virt::VirtualPool`],
//! "Start times"). For comparison runs.
//!
//! Observability (environment, read by the server only):
//! `KNB_LUNA_SERVER_ALLOC_FAIL=<n>` (tests) fails every `n`-th buffer allocation of the
//! server's packs as an exhausted slab would, so its back pressure path runs in any run.
//!
//! `KNB_LUNA_SERVER_CONTROL=<path>` opens r2c's control socket at `path` in the server
//! (inline mode), so `lunactl -s <path> stats|conns|capture` can look inside it while it
//! runs (r2c/src/control.rs).

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bifurcation::PortRange;
use bifurcation::{KernelPorts, TrafficConfig};
use dpdk_sys::Eal;
use luna_stack::stack::{RecvError, StackConfig, StackDrop};
use luna_stack::tcp::{CloseReason, DropReason};
use luna_stack::wire::Ipv4Cidr;
use r2c::clock::ClockSource;
use r2c::device::dpdk::{memif_quiesce, port_name_from_vdev, DpdkDevice, DpdkDeviceConfig};
use r2c::device::steering::{SteeringMode, SteeringRequest};
use r2c::device::Device;
use r2c::exception::{ExceptionDevice, MirrorThread};
use r2c::{
    Conn, CoreOptions, CoreReport, CoreSetup, Ctx, IdleStrategy, InlineApp, ReleaseHook, Runtime,
};
use serde_json::{json, Map, Value};
use testbed::{Kind, Topology};
use zbuf::dpdk::DmaRegistry;
use zbuf::{IoVec, Slab, SlabConfig, Zbuf, ZbufMut};

use super::{
    memif, Backend, ClientPlan, ClientSpec, Endpoints, ExceptionSpec, ServerReport, ServerSpec,
};
use crate::engine::{ClientWorker, ThreadResult};
use crate::proto::{flags, Piece, ServerConn, TxBuf, HDR_LEN};
use crate::stalls::Stalls;
use crate::workload::{Stack, Workload};

/// How often the side's main thread checks on its r2c runtime (finished, deadline, the
/// client's results delivered). The main thread is pinned to the first core's CPU, so
/// each check preempts that busy-polling core: at 5 ms it was 200 preemptions a second
/// (visible as the core thread's involuntary context switches, `cpu.*.threads[].nvcsw`).
/// 50 ms keeps it to 20 and adds at most 50 ms to a run's end.
const SUPERVISE_STEP: Duration = Duration::from_millis(50);
/// How much earlier than the client's the server's stall window ends ([`StallWindow`]).
const END_MARGIN: Duration = Duration::from_millis(50);

/// How much earlier than the client's window a server's stall window ends: `END_MARGIN`,
/// at most a tenth of the window's `duration`.
fn end_margin(duration: Duration) -> Duration {
    END_MARGIN.min(duration / 10)
}
/// How often the server looks whether every connection has attached ([`StallWindow`]).
const ATTACH_STEP: Duration = Duration::from_millis(5);

/// The luna backend.
pub struct Luna;

/// Stop reading a connection while this many response bytes wait for send space.
const SERVER_TX_LIMIT: usize = 4 << 20;
/// Bytes of queued pieces turned into buffers at a time (bounds what waits outside
/// the TCP send buffer, so bulk senders feel its back pressure).
const PACK_BYTES: usize = 64 * 1024;
/// Pieces up to this size are copied into the batch's shared small buffer; larger
/// zero payloads are slices of the preallocated zero buffer.
const SMALL_PIECE: usize = 256;
// Headers always go into the shared small buffer.
const _: () = assert!(HDR_LEN <= SMALL_PIECE);
/// Room in one small buffer (a 2 KiB zbuf object minus its headroom).
const SMALL_BUF: usize = 1920;
/// Longest zero buffer (a 64 KiB zbuf class holds it); longer payloads are several
/// slices of it.
const MAX_ZEROS: usize = 32 * 1024;
/// How long client connections may take to establish.
const CONNECT_WAIT: Duration = Duration::from_secs(30);
/// Client ports: split evenly between the lanes.
const CLIENT_PORTS: (u16, u16) = (10_000, 65_535);
/// zbuf memory per process (receive buffers, small buffers, the zero buffer).
const SLAB_MEMORY: usize = 128 << 20;
/// zbuf size classes: zbuf's defaults (2, 4, 16, 64 KiB) plus 256 B for what is small
/// and many — a lone request's header and payload, a reply's 16-byte header (each with
/// the 128-byte headroom): in a 2 KiB object each, 5,000 connections' requests waiting
/// for an overloaded server filled the slab with 8× the memory they needed. And 512 B for
/// a pack of up to 24 headers (9 to 24 pipelined or queued replies): in a 2 KiB object
/// each, an open-loop overload (5,000 connections offered 500,000 RPC/s) ran the slab out
/// and the pair fell to 170–200k RPC/s; with the class it held 283–345k, waiting never.
const SLAB_CLASSES: [usize; 6] = [256, 512, 2048, 4096, 16384, 65536];

/// Maps keyed by connection handles, hashed by r2c's one-multiply handle hash.
type FxMap<K, V> = HashMap<K, V, r2c::HandleHashing>;

/// Turns a message-mode [`TxBuf`]'s pieces into `Zbuf`s without copying payload.
struct Packer {
    /// `MAX_ZEROS` (or fewer) zero bytes, sliced for every zero payload.
    zeros: Zbuf,
}

/// Where the packer gets writable buffers (the core's zbuf cache; the heap in tests).
type Alloc<'a> = dyn FnMut(usize) -> Result<ZbufMut, zbuf::AllocError> + 'a;

/// Why packing (and so sending) stopped short.
#[derive(Debug)]
enum PackError {
    /// No buffer free now (`AllocError::Exhausted`): the slab's memory is held by
    /// data TCP has not had acknowledged, e.g. thousands of connections' requests
    /// waiting for an overloaded server. Nothing was taken from the queue: back
    /// pressure, retried as buffers come back, not a failed run.
    NoMemory(String),
    /// The connection is closed (the peer reset it): nothing can go out any more, and
    /// `on_closed` follows.
    Closed,
    /// Anything else: the connection cannot go on.
    Failed(String),
}

impl std::fmt::Display for PackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PackError::NoMemory(e) | PackError::Failed(e) => f.write_str(e),
            PackError::Closed => f.write_str("send: the connection is closed"),
        }
    }
}

impl PackError {
    fn alloc(what: &str, e: zbuf::AllocError) -> PackError {
        let msg = format!("zbuf: {what}: {e}");
        match e {
            zbuf::AllocError::Exhausted { .. } => PackError::NoMemory(msg),
            _ => PackError::Failed(msg),
        }
    }
}

impl Packer {
    /// Allocates the zero buffer (on the core's thread, from its zbuf cache).
    fn new(alloc: &mut Alloc<'_>, w: &Workload) -> Result<Packer, String> {
        let n = (w.req_size.max(w.resp_size) as usize).clamp(1, MAX_ZEROS);
        let mut m = alloc(n).map_err(|e| format!("zbuf: zero buffer of {n} B: {e}"))?;
        m.append(n)
            .map_err(|e| format!("zbuf: zero buffer of {n} B: {e}"))?
            .fill(0);
        Ok(Packer { zeros: m.freeze() })
    }

    fn is_small(p: &Piece) -> bool {
        p.len() <= SMALL_PIECE
    }

    /// Moves up to about `PACK_BYTES` of `tx`'s pieces into `out`: small pieces are
    /// written once into one shared buffer (adjacent ones become one slice), zero
    /// payloads are slices of the zero buffer, large byte pieces are taken as they are.
    /// The batch is planned and its buffer allocated before any piece leaves `tx`, so a
    /// failed allocation takes nothing.
    fn pack(
        &mut self,
        alloc: &mut Alloc<'_>,
        tx: &mut TxBuf,
        out: &mut VecDeque<Zbuf>,
    ) -> Result<(), PackError> {
        debug_assert!(tx.is_messages(), "the luna backend queues pieces");
        let pieces = tx.pieces();
        let (mut bytes, mut small, mut take) = (0usize, 0usize, 0usize);
        for p in pieces {
            if bytes >= PACK_BYTES {
                break;
            }
            let n = p.len();
            if n <= SMALL_PIECE {
                if small + n > SMALL_BUF {
                    break;
                }
                small += n;
            }
            bytes += n;
            take += 1;
        }
        let mut shared = if small > 0 {
            // The message is formatted only on failure: this runs once per reply.
            let what = || format!("{small} B for headers");
            let mut m = alloc(small).map_err(|e| PackError::alloc(&what(), e))?;
            let buf = m
                .append(small)
                .map_err(|e| PackError::Failed(format!("zbuf: {}: {e}", what())))?;
            let mut at = 0;
            for p in &pieces[..take] {
                let n = p.len();
                if n > SMALL_PIECE {
                    continue;
                }
                match p {
                    Piece::Header(h) => buf[at..at + n].copy_from_slice(h),
                    Piece::Bytes(b) => buf[at..at + n].copy_from_slice(b),
                    Piece::Zeros(_) => buf[at..at + n].fill(0),
                }
                at += n;
            }
            Some(m.freeze())
        } else {
            None
        };
        // Emit in order, taking the pieces off the queue: each stretch of small pieces is
        // the next `run` bytes of the shared buffer (the last stretch is the rest of it).
        let mut run = 0usize;
        for _ in 0..take {
            let Some(p) = tx.pop_piece() else { break };
            if Self::is_small(&p) {
                run += p.len();
                continue;
            }
            if run > 0 {
                if let Some(mut s) = shared.take() {
                    if s.len() > run {
                        out.push_back(s.split_to(run));
                        shared = Some(s);
                    } else {
                        out.push_back(s);
                    }
                }
                run = 0;
            }
            match p {
                Piece::Zeros(mut n) => {
                    while n > 0 {
                        let k = (n as usize).min(self.zeros.len());
                        out.push_back(self.zeros.slice(..k));
                        n -= k as u32;
                    }
                }
                Piece::Bytes(b) => out.push_back(Zbuf::from_vec(b)),
                Piece::Header(_) => unreachable!("headers are small"),
            }
        }
        if let Some(s) = shared.filter(|s| !s.is_empty()) {
            out.push_back(s);
        }
        Ok(())
    }
}

/// Packs and sends `tx`'s pieces while the connection's send buffer has room, through
/// the runtime's all-or-nothing send: what the TCP send buffer cannot take of the last
/// pack waits in r2c's backlog (one pack, about `PACK_BYTES`, at most), and nothing more
/// is packed until the backlog has drained (`send_capacity` is 0 meanwhile), so bulk
/// senders still feel TCP's back pressure. Returns the bytes handed over, and why it
/// stopped short if it did: the connection cannot send any more, or no buffer was free
/// ([`PackError::NoMemory`]: the rest stays queued in `tx`).
fn send_packed(
    ctx: &mut Ctx<'_>,
    conn: Conn,
    packer: &mut Packer,
    tx: &mut TxBuf,
    batch: &mut VecDeque<Zbuf>,
    faults: &mut AllocFaults,
) -> (usize, Option<PackError>) {
    let mut handed = 0;
    while !tx.is_empty() && ctx.send_capacity(conn) > 0 {
        let mut alloc = |n| {
            if faults.fail_now() {
                Err(zbuf::AllocError::Exhausted { class_size: 0 })
            } else {
                ctx.alloc(n)
            }
        };
        if let Err(e) = packer.pack(&mut alloc, tx, batch) {
            return (handed, Some(e));
        }
        match hand_over(ctx, conn, batch) {
            Ok(n) => handed += n,
            Err((n, e)) => return (handed + n, Some(e)),
        }
    }
    (handed, None)
}

/// Hands a pack's buffers to the runtime in order (`Ctx::send_all`); on a refusal the rest
/// of the pack is dropped. Returns the bytes handed over (those of the refused buffer
/// included, as before).
fn hand_over(
    ctx: &mut Ctx<'_>,
    conn: Conn,
    batch: &mut VecDeque<Zbuf>,
) -> Result<usize, (usize, PackError)> {
    let mut handed = 0;
    while let Some(z) = batch.pop_front() {
        handed += z.len();
        if let Err(e) = ctx.send_all(conn, z) {
            batch.clear();
            let e = match e {
                luna_stack::stack::SendError::Closed => PackError::Closed,
                e => PackError::Failed(format!("send: {e:?}")),
            };
            return Err((handed, e));
        }
    }
    Ok(handed)
}

/// A server connection whose answers found no free buffer: queued once in `starved`
/// (retried every iteration), the refused try counted.
fn wait_for_buffers(c: &mut SConn, conn: Conn, starved: &mut VecDeque<Conn>, waits: &AtomicU64) {
    waits.fetch_add(1, Ordering::Relaxed);
    if !c.starved {
        c.starved = true;
        starved.push_back(conn);
    }
}

/// Fault injection for tests (`KNB_LUNA_SERVER_ALLOC_FAIL=<n>`, read by the server): every
/// `n`-th buffer allocation of a pack fails as an exhausted slab would, so the back
/// pressure path runs in every run, whatever the machine's speed. Off (`every == 0`)
/// otherwise.
#[derive(Debug, Default, Clone, Copy)]
struct AllocFaults {
    every: u64,
    count: u64,
}

impl AllocFaults {
    fn from_env(v: Option<&str>) -> Result<AllocFaults, String> {
        let Some(v) = v else {
            return Ok(AllocFaults::default());
        };
        v.trim()
            .parse::<u64>()
            .ok()
            .filter(|n| (1..=1_000_000).contains(n))
            .map(|every| AllocFaults { every, count: 0 })
            .ok_or_else(|| {
                format!("KNB_LUNA_SERVER_ALLOC_FAIL={v:?} is not a count from 1 to 1000000")
            })
    }

    /// Whether this allocation fails.
    fn fail_now(&mut self) -> bool {
        if self.every == 0 {
            return false;
        }
        self.count += 1;
        self.count % self.every == 0
    }
}

/// What every side needs: EAL, zbuf slab, DMA registry and one device per lane.
struct Env {
    eal: Eal,
    slab: Slab,
    _registry: DmaRegistry,
    devices: Vec<DpdkDevice>,
}

/// What a side runs its r2c runtime with: one core per lane.
struct Lanes {
    eal: Eal,
    slab: Slab,
    _registry: DmaRegistry,
    cores: Vec<CoreSetup<DpdkDevice>>,
    opts: CoreOptions,
    lanes: usize,
}

impl Env {
    /// One core per device on `ip/prefix_len` (see [`setups`]) and the runtime options.
    fn lanes(
        self,
        eal_args: &[String],
        ip: Ipv4Addr,
        prefix_len: u8,
        mtu: u16,
        cpus: &[usize],
    ) -> Result<Lanes, String> {
        let lanes = self.devices.len();
        let cores = setups(self.devices, ip, prefix_len, mtu, cpus)?;
        let mut opts = options(
            &self.eal,
            &self.slab,
            memif::vdev_of(eal_args).unwrap_or_default(),
            lanes,
        );
        if let Some(b) = super::env_burst("KNB_LUNA_BURST")? {
            opts.burst = b;
        }
        if let Some(s) = super::env_split("KNB_LUNA_RX_SPLIT")? {
            opts.rx_split = s;
        }
        if let Some(d) = super::env_switch("KNB_LUNA_DEFER_FREES")? {
            opts.defer_frees = d;
        }
        Ok(Lanes {
            eal: self.eal,
            slab: self.slab,
            _registry: self._registry,
            cores,
            opts,
            lanes,
        })
    }
}

fn open(
    server: bool,
    eal_args: &[String],
    lanes: u16,
    mtu: u16,
    link_timeout: Duration,
    started: &mut dyn FnMut(),
    steering: Option<SteeringRequest>,
) -> Result<Env, String> {
    let vdev = memif::vdev_of(eal_args).ok_or("no --vdev in the EAL arguments")?;
    let port = port_name_from_vdev(vdev).ok_or_else(|| format!("bad --vdev {vdev:?}"))?;
    let eal = Eal::builder()
        .args(eal_args.iter().cloned())
        .log_to_stderr(true)
        .init()
        .map_err(|e| format!("EAL init: {e}"))?;
    let registry = DmaRegistry::new(&eal);
    let knob = |k: &str| std::env::var(k).ok();
    let slab_memory = slab_memory_from_env(
        server
            .then(|| knob("KNB_LUNA_SERVER_SLAB_MB"))
            .flatten()
            .or_else(|| knob("KNB_LUNA_SLAB_MB"))
            .as_deref(),
    )?;
    let slab_cfg = SlabConfig::new()
        .size_classes(&SLAB_CLASSES)
        .max_memory(slab_memory);
    // memif zero-copy: the peer reads and writes our buffers, which must then be EAL memory.
    let slab_cfg = if memif::is_zero_copy(eal_args) {
        registry.dpdk_memory_slab_config(slab_cfg)
    } else {
        registry.slab_config(slab_cfg)
    };
    let slab = Slab::new(slab_cfg).map_err(|e| format!("zbuf slab: {e}"))?;
    let mut cfg = DpdkDeviceConfig::new(port);
    cfg.queues = lanes;
    cfg.rx_mbufs = 16383.max(2048 * u32::from(lanes) + 8192);
    cfg.link_timeout = link_timeout;
    cfg.pool_prefix = "lkb".into();
    // memif enforces no MTU (and ethdev refuses one above its 1518-byte frame limit):
    // the receive buffers (a zbuf size class) must hold a whole frame.
    let mut frame = usize::from(mtu) + 14 + 128;
    if !vdev.starts_with("net_memif") {
        // net_af_packet (the coexist topology's NIC) wants 2016 bytes of data room
        // for a 1500-byte MTU: the next size class up.
        frame = frame.max(2049);
    }
    (cfg.rx_buf_size, cfg.rx_mbufs) = match frame {
        0..=2048 => (2048, 16383.max(2048 * u32::from(lanes) + 8192)),
        2049..=4096 => (4096, 8191.max(1024 * u32::from(lanes) + 4096)),
        _ => (16384, 4095.max(1024 * u32::from(lanes) + 1024)),
    };
    // memif is shared memory: no checksums, like the kernel on veth and smoltcp here.
    cfg.virtual_link_checksums = super::virtual_link_checksums();
    cfg.tx_copy_max = match std::env::var("KNB_LUNA_TX_COPY_MAX") {
        Ok(v) => Some(v.trim().parse::<usize>().map_err(|_| {
            format!(
                "KNB_LUNA_TX_COPY_MAX={v:?} is not a byte count (0: zero-copy chains only; \
                 unset: r2c chooses)"
            )
        })?),
        Err(_) => None,
    };
    cfg.steering = steering;
    let devices = DpdkDevice::open_all_then(&eal, &slab, &registry, &cfg, started)
        .map_err(|e| format!("open {port}: {e}"))?;
    Ok(Env {
        eal,
        slab,
        _registry: registry,
        devices,
    })
}

/// `KNB_LUNA_SLAB_MB`'s value in bytes ([`SLAB_MEMORY`] when unset).
fn slab_memory_from_env(v: Option<&str>) -> Result<usize, String> {
    let Some(v) = v else {
        return Ok(SLAB_MEMORY);
    };
    v.trim()
        .parse::<usize>()
        .ok()
        .filter(|mb| (48..=4096).contains(mb))
        .map(|mb| mb << 20)
        .ok_or_else(|| format!("zbuf memory {v:?} (KNB_LUNA_SLAB_MB, KNB_LUNA_SERVER_SLAB_MB) is not MiB from 48 to 4096"))
}

/// `KNB_LUNA_TLP_US`'s value: `None` when unset (the stack's default), else the tail
/// loss probes' floor (`Some(None)`: off).
fn tlp_from_env(v: Option<&str>) -> Result<Option<Option<luna_stack::time::Duration>>, String> {
    v.map(|v| {
        micros_from_env(
            v,
            "KNB_LUNA_TLP_US",
            60_000_000,
            "up to 60 s (0: no tail loss probes)",
        )
    })
    .transpose()
}

/// `KNB_LUNA_DELAYED_ACK_US`'s value: the delayed-ACK timeout (`None`: unset or 0, an
/// ACK for every segment).
fn delayed_ack_from_env(v: Option<&str>) -> Result<Option<luna_stack::time::Duration>, String> {
    // RFC 9293 §3.8.6.3 (MUST-40): under 0.5 s, as `TcpConfig::validate` checks.
    let d = v.map(|v| {
        micros_from_env(
            v,
            "KNB_LUNA_DELAYED_ACK_US",
            499_999,
            "below 500 ms (0: no delayed ACKs)",
        )
    });
    Ok(d.transpose()?.flatten())
}

/// An environment knob's value `v` in microseconds, at most `max`: `None` for 0 (the
/// knob's "off"), else the duration; an error naming the knob and `range` otherwise.
fn micros_from_env(
    v: &str,
    knob: &str,
    max: u64,
    range: &str,
) -> Result<Option<luna_stack::time::Duration>, String> {
    let us: u64 = v
        .trim()
        .parse()
        .ok()
        .filter(|&us| us <= max)
        .ok_or_else(|| format!("{knob}={v:?} is not microseconds {range}"))?;
    Ok((us != 0).then(|| luna_stack::time::Duration::from_micros(us)))
}

/// One core per device, stack on `ip/prefix_len`, client ports split between lanes.
fn setups(
    devices: Vec<DpdkDevice>,
    ip: Ipv4Addr,
    prefix_len: u8,
    mtu: u16,
    cpus: &[usize],
) -> Result<Vec<CoreSetup<DpdkDevice>>, String> {
    let lanes = devices.len() as u32;
    let span = (u32::from(CLIENT_PORTS.1) - u32::from(CLIENT_PORTS.0) + 1) / lanes.max(1);
    let tlp = tlp_from_env(std::env::var("KNB_LUNA_TLP_US").ok().as_deref())?;
    let delayed_ack =
        delayed_ack_from_env(std::env::var("KNB_LUNA_DELAYED_ACK_US").ok().as_deref())?;
    devices
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let cidr = Ipv4Cidr::new(ip, prefix_len)
                .map_err(|e| format!("address {ip}/{prefix_len}: {e:?}"))?;
            let mut sc = StackConfig::new(d.mac(), cidr);
            // The workload's MTU (memif itself enforces none); MSS to match.
            sc.mtu = mtu;
            sc.tcp.mss = mtu - 40;
            if let Some(tlp) = tlp {
                sc.tcp.tlp = tlp;
            }
            sc.tcp.delayed_ack = delayed_ack;
            sc.caps = d.caps();
            let mut s = CoreSetup::new(i, vec![d], sc);
            s.cpu = Some(cpus[i % cpus.len()]);
            let first = u32::from(CLIENT_PORTS.0) + i as u32 * span;
            s.ports = vec![PortRange::new(first as u16, (first + span - 1) as u16)
                .ok_or("empty client port range")?];
            Ok(s)
        })
        .collect()
}

/// How long a side waits for its memif peer to stop polling before it closes anyway.
const QUIESCE_WAIT: Duration = Duration::from_secs(5);

/// Before any lane releases its device, both processes must have stopped polling
/// (`r2c::device::dpdk::memif_quiesce`: memif's disconnect races with a receive burst).
/// The last local lane to stop meets the peer; the others wait for it.
fn quiesce_hook(vdev: String, lanes: usize) -> ReleaseHook {
    let stopped = Arc::new(AtomicUsize::new(0));
    let met = Arc::new(AtomicBool::new(false));
    ReleaseHook(Arc::new(move |_core| {
        if stopped.fetch_add(1, Ordering::AcqRel) + 1 == lanes {
            match memif_quiesce(&vdev, QUIESCE_WAIT) {
                Ok(true) | Err(_) => {}
                Ok(false) => eprintln!(
                    "knb: the memif peer did not stop polling within {QUIESCE_WAIT:?}; closing anyway"
                ),
            }
            met.store(true, Ordering::Release);
        } else {
            let end = Instant::now() + QUIESCE_WAIT + Duration::from_secs(1);
            while !met.load(Ordering::Acquire) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }))
}

fn options(eal: &Eal, slab: &Slab, vdev: &str, lanes: usize) -> CoreOptions {
    CoreOptions {
        before_release: Some(quiesce_hook(vdev.to_owned(), lanes)),
        idle: IdleStrategy::BusyPoll,
        // Publishing walks every connection's counters: keep it rare.
        stats_interval: 1 << 14,
        // Core threads inherit the EAL main thread's one-CPU mask, which r2c's pinning
        // check reads as "the only CPU allowed": they pin themselves in `on_start`.
        pin: false,
        clock: ClockSource::Tsc(eal.tsc_hz()),
        slab: Some(slab.clone()),
        // Room for a server's last answers after the client's FIN (see `end_of_stream`).
        max_backlog: 2 * SERVER_TX_LIMIT,
        // A full memif ring means the peer process is busy or descheduled, not a lossy
        // link: wait (the core stops polling the stack meanwhile) instead of dropping
        // after a few microseconds of refusals, which turned bursts into RTOs.
        tx_retry_limit: 1 << 24,
        shutdown_grace: luna_stack::time::Duration::from_secs(1),
        ..CoreOptions::default()
    }
}

/// Counters of the cores' final reports, for `server.extra`.
fn core_counters(reports: &[CoreReport]) -> Value {
    let mut stats = Map::new();
    let mut sum = r2c::CoreStats::default();
    let (mut copied, mut dev_dropped, mut rx_missed, mut unsent) = (0, 0, 0, 0);
    let mut tcp = luna_stack::tcp::ConnCounters::default();
    let mut drops = 0;
    let mut stack_drops = [0u64; StackDrop::ALL.len()];
    let (mut burst_frames, mut coalesced) = (0, 0);
    for r in reports {
        burst_frames += r.stack.burst_frames;
        coalesced += r.stack.coalesced_segments;
        sum = sum.sum(&r.stats);
        copied += r.device.copied_bytes;
        dev_dropped += r.device.tx_dropped;
        rx_missed += r.device.rx_missed;
        unsent += r.device.tx_unsent;
        tcp.accumulate(&r.tcp);
        drops += r.stack.total_drops();
        for (sum, n) in stack_drops.iter_mut().zip(r.stack.drops) {
            *sum += n;
        }
    }
    for (k, v) in sum.fields() {
        if !matches!(k, "published_at_ns" | "stopped") {
            stats.insert(k.into(), json!(v));
        }
    }
    let stalls = Stalls::between(&r2c::CoreStats::default(), &sum, None);
    json!({
        "loop_stalls": stalls.to_json(),
        "frames_rx": sum.rx_frames,
        "frames_tx": sum.tx_frames,
        "copied_bytes": copied,
        "device_tx_dropped": dev_dropped,
        "device_tx_unsent": unsent,
        "rx_missed": rx_missed,
        "retransmits": tcp.retransmits,
        "rtos": tcp.rtos,
        "tlp_probes": tcp.tlp_probes,
        "rack_recoveries": tcp.rack_recoveries,
        // Receive memory: buffers copied out of tiny segments, out-of-order bytes given
        // up for in-order ones (luna-stack `admit_rcv_mem`; drops under rcv_memory, and
        // rcv_memory_global past the stack-wide bound, in tcp_drops_by_reason).
        "rcv_collapsed": tcp.rcv_collapsed,
        "rcv_pruned": tcp.rcv_pruned,
        "stack_drops": drops,
        "stack_drops_by_reason": stack_drops_by_reason(&stack_drops),
        // Software segmentation and receive coalescing at work: frames cut from a send
        // burst after its first, segments handed over in a run after its first.
        "stack_burst_frames": burst_frames,
        "stack_coalesced_segments": coalesced,
        "tcp_drops": tcp.drops.iter().sum::<u64>(),
        "tcp_drops_by_reason": tcp_drops_by_reason(&tcp),
        "core": stats,
    })
}

/// The non-zero stack drop counts (indexed like [`StackDrop::ALL`]) by reason name.
fn stack_drops_by_reason(drops: &[u64; StackDrop::ALL.len()]) -> Value {
    let m: Map<String, Value> = StackDrop::ALL
        .iter()
        .zip(drops)
        .filter(|(_, n)| **n != 0)
        .map(|(r, n)| (r.name().to_owned(), json!(n)))
        .collect();
    Value::Object(m)
}

/// The non-zero TCP (per-connection, summed) drop counts by reason name.
fn tcp_drops_by_reason(tcp: &luna_stack::tcp::ConnCounters) -> Value {
    let m: Map<String, Value> = DropReason::ALL
        .iter()
        .map(|r| (r.name(), tcp.drops(*r)))
        .filter(|(_, n)| *n != 0)
        .map(|(name, n)| (name.to_owned(), json!(n)))
        .collect();
    Value::Object(m)
}

// ------------------------------------------------------------------------------ server

/// An inline server lane's loop stalls over the client's measured window, read inside the
/// core (its own counters, exact): from `warmup` after the lane's last expected connection
/// arrived (the client starts its warm-up once all its connections are up) to
/// `duration` less [`END_MARGIN`] (at most a tenth of it) later, or to the first close,
/// whichever comes first (the client closes when its window ends; its connections'
/// tear-down is not the window's).
struct LaneWindow {
    warmup: Duration,
    span: Duration,
    attached_at: Option<luna_stack::time::Instant>,
    marks: Marks,
}

impl LaneWindow {
    fn new(warmup_s: f64, duration_s: f64) -> Self {
        let duration = Duration::from_secs_f64(duration_s);
        LaneWindow {
            warmup: Duration::from_secs_f64(warmup_s),
            span: duration - end_margin(duration),
            attached_at: None,
            marks: [None, None],
        }
    }

    /// The lane's last expected connection arrived.
    fn attached(&mut self, now: luna_stack::time::Instant) {
        self.attached_at.get_or_insert(now);
    }

    /// Once per iteration: takes the reading at an edge that has come.
    #[inline]
    fn poll(&mut self, stats: &r2c::CoreStats, now: luna_stack::time::Instant) {
        let Some(at) = self.attached_at else {
            return;
        };
        if self.marks[1].is_some() {
            return;
        }
        let begin = at + self.warmup;
        if self.marks[0].is_none() {
            if now >= begin {
                self.marks[0] = Some((*stats, now));
            }
        } else if now >= begin + self.span {
            self.marks[1] = Some((*stats, now));
        }
    }

    /// A connection closed: the window ends here if it began and has not ended.
    fn closing(&mut self, stats: &r2c::CoreStats, now: luna_stack::time::Instant) {
        if self.marks[0].is_some() && self.marks[1].is_none() {
            self.marks[1] = Some((*stats, now));
        }
    }

    fn stalls(&self) -> Option<Stalls> {
        marks_stalls(&self.marks)
    }
}

/// A core's readings at the start and end of a window (its own counters and clock).
type Marks = [Option<(r2c::CoreStats, luna_stack::time::Instant)>; 2];

/// The loop stalls between a window's two readings, once both were taken.
fn marks_stalls(marks: &Marks) -> Option<Stalls> {
    let [Some((a, ta)), Some((b, tb))] = marks else {
        return None;
    };
    let span = tb.saturating_duration_since(*ta).as_nanos();
    Some(Stalls::between(a, b, u64::try_from(span).ok()))
}

struct ServerShared {
    eal: Eal,
    report: Mutex<ServerReport>,
    /// Per lane: its loop stalls over the client's window ([`LaneWindow`]).
    stalls: Mutex<Vec<Option<Stalls>>>,
    lanes_done: AtomicUsize,
    /// The last lane to finish stops the runtime (false: the supervisor does, after
    /// `--exception-linger`).
    stop_when_done: bool,
    lanes: usize,
    /// Packs that found no free buffer (each waits in its lane's `starved`, not aborted).
    memory_waits: AtomicU64,
}

struct SConn {
    e: ServerConn,
    /// Waiting in `ServerApp::starved` for a free buffer.
    starved: bool,
    /// The client finished sending: close once the answers are out (`end_of_stream`).
    eof: bool,
}

struct ServerApp {
    lane: usize,
    cpu: usize,
    port: u16,
    workload: Workload,
    expected: usize,
    finished: usize,
    conns: FxMap<Conn, SConn>,
    packer: Option<Packer>,
    /// Buffers of the pack being handed to the runtime (kept to reuse its allocation).
    batch: VecDeque<Zbuf>,
    /// Connections whose answers found no free buffer, oldest first (each once:
    /// `SConn::starved`), retried every iteration until one stops again. Their answers
    /// stay queued: an overloaded server (the slab held by replies and requests not yet
    /// acknowledged) slows down; it does not abort connections.
    starved: VecDeque<Conn>,
    /// Test fault injection (`KNB_LUNA_SERVER_ALLOC_FAIL`).
    faults: AllocFaults,
    report: ServerReport,
    shared: Arc<ServerShared>,
    lane_done: bool,
    /// (std, core clock) at start: maps the core's per-iteration clock to `Instant`s.
    base: (Instant, luna_stack::time::Instant),
    /// Connections accepted so far.
    accepted: usize,
    window: LaneWindow,
}

impl ServerApp {
    /// Reads `conn` while its responses fit, answering as it goes. The connection is
    /// looked up once per pass (this runs once per received burst with data for it).
    fn serve(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        // Only bulk MARK/SYNC use the time (µs accuracy over seconds): the iteration's
        // clock, read anyway, saves a clock read per received segment.
        let now = self.base.0 + ctx.now().saturating_duration_since(self.base.1);
        loop {
            let Some(c) = self.conns.get_mut(&conn) else {
                return;
            };
            let mut limited = false;
            let failed = loop {
                if ctx.send_backlog(conn) + c.e.tx().len() >= SERVER_TX_LIMIT {
                    limited = true;
                    break None;
                }
                match ctx.recv(conn) {
                    Ok(Some(z)) => {
                        if let Err(e) = c.e.on_rx(&z, now) {
                            break Some(e.to_string());
                        }
                    }
                    Ok(None) => break None,
                    Err(RecvError::Finished) => return self.end_of_stream(ctx, conn),
                    // Reset: on_closed follows.
                    Err(_) => return,
                }
            };
            // The responses into buffers and on to the stack.
            let (mut no_memory, mut reset) = (false, false);
            let failed = failed.or_else(|| match self.packer.as_mut() {
                Some(p) => {
                    match send_packed(ctx, conn, p, c.e.tx(), &mut self.batch, &mut self.faults).1 {
                        None => None,
                        Some(PackError::NoMemory(_)) => {
                            no_memory = true;
                            None
                        }
                        Some(PackError::Closed) => {
                            reset = true;
                            None
                        }
                        Some(e) => Some(e.to_string()),
                    }
                }
                None => Some("no packer".to_string()),
            });
            if reset {
                // Reset by the client (one that stopped waiting for its answers):
                // on_closed follows; not the server's failure.
                return;
            }
            if no_memory {
                // Back pressure, not a failure: the answers stay queued; `on_poll` retries.
                wait_for_buffers(c, conn, &mut self.starved, &self.shared.memory_waits);
                return;
            }
            if let Some(e) = failed {
                self.report.errors.push(format!("connection {conn:?}: {e}"));
                ctx.abort(conn);
                return self.finish(ctx, conn);
            }
            // Read on if the responses went out; else on_writable resumes.
            if !(limited && ctx.send_backlog(conn) + c.e.tx().len() < SERVER_TX_LIMIT) {
                return;
            }
        }
    }

    /// The client is done: queue every answer (the runtime's backlog holds what the send
    /// buffer cannot), then close our side.
    fn end_of_stream(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        let mut failed = None;
        // Reset by the client meanwhile (it stopped waiting for these answers): not the
        // server's failure; on_closed follows.
        let mut reset = false;
        if let (Some(c), Some(packer)) = (self.conns.get_mut(&conn), self.packer.as_mut()) {
            c.eof = true;
            while !c.e.tx().is_empty() && failed.is_none() && !reset {
                match packer.pack(&mut |n| ctx.alloc(n), c.e.tx(), &mut self.batch) {
                    Ok(()) => {}
                    Err(PackError::NoMemory(_)) => {
                        // Nothing was taken from the queue: close once buffers come back
                        // (`retry_starved` calls this again).
                        wait_for_buffers(c, conn, &mut self.starved, &self.shared.memory_waits);
                        return;
                    }
                    Err(e) => {
                        failed = Some(e.to_string());
                        break;
                    }
                }
                match hand_over(ctx, conn, &mut self.batch) {
                    Ok(_) => {}
                    Err((_, PackError::Closed)) => reset = true,
                    Err((_, e)) => failed = Some(e.to_string()),
                }
            }
        }
        if let Some(e) = failed {
            self.report.errors.push(format!("connection {conn:?}: {e}"));
            ctx.abort(conn);
        } else if !reset {
            ctx.close(conn);
        }
        self.finish(ctx, conn);
    }

    /// Serves the connections whose answers found no free buffer, oldest first, until one
    /// finds none again (it keeps its turn for the next iteration).
    fn retry_starved(&mut self, ctx: &mut Ctx<'_>) {
        for _ in 0..self.starved.len() {
            let Some(conn) = self.starved.pop_front() else {
                return;
            };
            // Gone meanwhile (closed or reset): nothing to retry.
            let Some(c) = self.conns.get_mut(&conn) else {
                continue;
            };
            c.starved = false;
            if c.eof {
                self.end_of_stream(ctx, conn);
            } else {
                self.serve(ctx, conn);
            }
            if self.conns.get(&conn).is_some_and(|c| c.starved) {
                // Back at the tail: move it to the head, keeping its turn.
                if let Some(j) = self.starved.pop_back() {
                    self.starved.push_front(j);
                }
                return;
            }
        }
    }

    /// The connection is over (closed, reset or failed): count it.
    fn finish(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        let Some(c) = self.conns.remove(&conn) else {
            return;
        };
        self.report.add(&c.e.counters);
        self.finished += 1;
        if self.finished >= self.expected && !self.lane_done {
            self.lane_done = true;
            let done = self.shared.lanes_done.fetch_add(1, Ordering::AcqRel) + 1;
            if done >= self.shared.lanes && self.shared.stop_when_done {
                ctx.request_stop();
            }
        }
    }
}

impl InlineApp for ServerApp {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        let setup = memif::register_lane(&self.shared.eal, self.cpu)
            .and_then(|()| Packer::new(&mut |n| ctx.alloc(n), &self.workload));
        match setup {
            Ok(p) => self.packer = Some(p),
            Err(e) => {
                self.report.errors.push(format!("lane {}: {e}", self.lane));
                return ctx.request_stop();
            }
        }
        self.base = (Instant::now(), ctx.now());
        let backlog = (self.expected + 64).max(1024);
        if let Err(e) = ctx.listen(self.port, backlog) {
            self.report.errors.push(format!(
                "lane {}: listen on {}: {e:?}",
                self.lane, self.port
            ));
            ctx.request_stop();
        }
        if self.expected == 0 {
            self.lane_done = true;
            self.shared.lanes_done.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn on_accept(&mut self, ctx: &mut Ctx<'_>, conn: Conn, _l: r2c::Listener) {
        self.accepted += 1;
        if self.accepted == self.expected {
            self.window.attached(ctx.now());
        }
        self.conns.insert(
            conn,
            SConn {
                e: ServerConn::new(self.workload.resp_size).message_mode(),
                starved: false,
                eof: false,
            },
        );
    }

    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        self.serve(ctx, conn);
    }

    fn on_writable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        // Every ACK frees space: only a connection with responses waiting (or reading
        // paused because of them) has anything to do.
        if self
            .conns
            .get_mut(&conn)
            .is_some_and(|c| !c.e.tx().is_empty())
        {
            self.serve(ctx, conn);
        }
    }

    fn on_closed(&mut self, ctx: &mut Ctx<'_>, conn: Conn, _reason: Option<CloseReason>) {
        self.window.closing(ctx.stats(), ctx.now());
        self.finish(ctx, conn);
    }

    fn on_poll(&mut self, ctx: &mut Ctx<'_>) {
        self.window.poll(ctx.stats(), ctx.now());
        if !self.starved.is_empty() {
            self.retry_starved(ctx);
        }
    }

    fn on_stop(&mut self, _ctx: &mut Ctx<'_>) {
        // The runtime closes every connection next and releases its handle: nothing is
        // retried after this (a retry would find the sending side shut and reset it).
        self.starved.clear();
        let mut r = self.shared.report.lock().unwrap_or_else(|p| p.into_inner());
        for c in self.conns.values() {
            r.add(&c.e.counters);
        }
        r.add(&self.report.counters);
        r.errors.append(&mut self.report.errors);
        drop(r);
        let mut all = self.shared.stalls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = all.get_mut(self.lane) {
            *slot = self.window.stalls();
        }
    }
}

// ------------------------------------------------------------------------------ client

/// What a client lane hands back.
type LaneResult = Result<ThreadResult, String>;

struct ClientShared {
    eal: Eal,
    plan: Arc<ClientPlan>,
    results: Mutex<Vec<Option<LaneResult>>>,
    /// Per lane: its core's loop stalls over the measured window.
    stalls: Mutex<Vec<Option<Stalls>>>,
    delivered: AtomicUsize,
    /// Per lane: sends that stopped because no zbuf buffer was free (back pressure).
    memory_waits: Vec<AtomicU64>,
}

enum Phase {
    Connecting { until: Instant },
    Running(Box<ClientWorker>),
    Done,
}

struct ClientApp {
    lane: usize,
    cpu: usize,
    remote: SocketAddrV4,
    n: usize,
    workload: Workload,
    conns: Vec<Conn>,
    index: FxMap<Conn, usize>,
    connected: usize,
    /// Buffers of the pack being handed to the runtime (kept to reuse its allocation).
    batch: VecDeque<Zbuf>,
    packer: Option<Packer>,
    touched: Vec<usize>,
    /// Connections whose last send stopped for want of a free buffer, oldest first
    /// (each once: `is_starved`); retried every iteration until one stops again.
    starved: VecDeque<usize>,
    is_starved: Vec<bool>,
    phase: Phase,
    shared: Arc<ClientShared>,
    /// (std, core clock), re-read every [`REANCHOR`] while running: maps the core's
    /// per-iteration clock to `Instant`s.
    base: (Instant, luna_stack::time::Instant),
    /// The core's counters and clock when the measured window began and ended (loop
    /// stalls).
    marks: Marks,
}

/// How often the open-loop client re-reads the std clock against the core's clock
/// (bounds the gating error to the TSC rate's error over this span: < 1 µs).
const REANCHOR: Duration = Duration::from_micros(200);

impl ClientApp {
    fn deliver(&mut self, ctx: &mut Ctx<'_>, r: LaneResult) {
        self.phase = Phase::Done;
        if let Some(st) = marks_stalls(&self.marks) {
            let mut all = self.shared.stalls.lock().unwrap_or_else(|p| p.into_inner());
            all[self.lane] = Some(st);
        }
        for &c in &self.conns {
            ctx.close(c);
        }
        let mut all = self
            .shared
            .results
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        all[self.lane] = Some(r);
        self.shared.delivered.fetch_add(1, Ordering::AcqRel);
    }

    fn fail(&mut self, ctx: &mut Ctx<'_>, msg: String) {
        match &mut self.phase {
            Phase::Running(wk) => wk.fail(msg),
            Phase::Connecting { .. } => {
                self.shared.plan.fail(msg.clone());
                self.deliver(ctx, Err(msg));
            }
            Phase::Done => {}
        }
    }

    /// Moves connection `i`'s requests to the stack (what the send buffer cannot take of
    /// the last pack waits in the runtime's backlog; `on_writable` resumes). Returns
    /// false if it stopped for want of a free buffer: the connection then waits in
    /// `starved` (its requests stay queued, their send lag grows and is measured).
    fn pump(&mut self, ctx: &mut Ctx<'_>, i: usize, now: Instant) -> bool {
        let Phase::Running(wk) = &mut self.phase else {
            return true;
        };
        let Some(packer) = self.packer.as_mut() else {
            return true;
        };
        let conn = self.conns[i];
        let (n, stopped) = send_packed(
            ctx,
            conn,
            packer,
            wk.tx(i),
            &mut self.batch,
            &mut AllocFaults::default(),
        );
        // Handed to the runtime: in TCP's send buffer, or next in line for it.
        wk.on_sent(i, n, now);
        match stopped {
            None => true,
            Some(PackError::NoMemory(_)) => {
                // Buffers come back as the server acknowledges data, on any
                // connection: an overloaded server slows the client down, it does not
                // fail the run.
                self.shared.memory_waits[self.lane].fetch_add(1, Ordering::Relaxed);
                if !self.is_starved[i] {
                    self.is_starved[i] = true;
                    self.starved.push_back(i);
                }
                false
            }
            // The server closing a connection mid-run is a failure for the client.
            Some(e @ (PackError::Failed(_) | PackError::Closed)) => {
                wk.fail(format!("connection {i} of lane {}: {e}", self.lane));
                true
            }
        }
    }

    /// Sends for the connections that ran out of buffers, oldest first, until one runs
    /// out again (then the rest keep their turn for the next iteration).
    fn retry_starved(&mut self, ctx: &mut Ctx<'_>, now: Instant) {
        for _ in 0..self.starved.len() {
            let Some(i) = self.starved.pop_front() else {
                return;
            };
            self.is_starved[i] = false;
            if !self.pump(ctx, i, now) {
                // Back at the tail: move it to the head, keeping its turn.
                if let Some(j) = self.starved.pop_back() {
                    self.starved.push_front(j);
                }
                return;
            }
        }
    }
}

impl InlineApp for ClientApp {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        let setup = memif::register_lane(&self.shared.eal, self.cpu)
            .and_then(|()| Packer::new(&mut |n| ctx.alloc(n), &self.workload));
        match setup {
            Ok(p) => self.packer = Some(p),
            Err(e) => return self.fail(ctx, format!("lane {}: {e}", self.lane)),
        }
        self.base = (Instant::now(), ctx.now());
        self.is_starved = vec![false; self.n];
        for k in 0..self.n {
            match ctx.connect(self.remote) {
                Ok(c) => {
                    self.index.insert(c, k);
                    self.conns.push(c);
                }
                Err(e) => {
                    return self.fail(
                        ctx,
                        format!("lane {}: connect to {}: {e:?}", self.lane, self.remote),
                    )
                }
            }
        }
    }

    fn on_connected(&mut self, _ctx: &mut Ctx<'_>, _conn: Conn) {
        self.connected += 1;
    }

    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        let Some(&i) = self.index.get(&conn) else {
            return;
        };
        let Phase::Running(wk) = &mut self.phase else {
            return;
        };
        let now = Instant::now();
        loop {
            match ctx.recv(conn) {
                Ok(Some(z)) => wk.on_rx(i, &z, now),
                Ok(None) => break,
                Err(e) => {
                    wk.fail(format!(
                        "connection {i} of lane {}: closed by the server ({e:?})",
                        self.lane
                    ));
                    break;
                }
            }
        }
    }

    fn on_writable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        if let Some(&i) = self.index.get(&conn) {
            let waiting = match &mut self.phase {
                Phase::Running(wk) => !wk.tx(i).is_empty(),
                _ => false,
            };
            if waiting && !self.is_starved[i] {
                self.pump(ctx, i, Instant::now());
            }
        }
    }

    fn on_closed(&mut self, ctx: &mut Ctx<'_>, conn: Conn, reason: Option<CloseReason>) {
        let i = self.index.get(&conn).copied();
        self.fail(
            ctx,
            format!("connection {i:?} of lane {} closed ({reason:?})", self.lane),
        );
    }

    fn on_poll(&mut self, ctx: &mut Ctx<'_>) {
        match &mut self.phase {
            Phase::Done => {}
            Phase::Connecting { until } => {
                if self.connected == self.n {
                    match self.shared.plan.start_messages(self.lane as u32) {
                        Ok(wk) => self.phase = Phase::Running(Box::new(wk)),
                        Err(e) => self.deliver(ctx, Err(e)),
                    }
                } else if Instant::now() >= *until || self.shared.plan.failed() {
                    let msg = format!(
                        "luna: {} of {} connections to {} established within {CONNECT_WAIT:?}",
                        self.connected, self.n, self.remote
                    );
                    self.fail(ctx, msg);
                }
            }
            Phase::Running(_) => {
                // The iteration's own clock (read anyway) decides whether there is
                // anything to do; the precise clock stamps what is issued. The two are
                // re-anchored every REANCHOR: the EAL's TSC rate is an estimate (DPDK
                // rounds a measured rate to 10 MHz when the CPU does not report it, up
                // to 0.25% off), and a core clock running slow by that much, mapped
                // from one anchor at start, would see each arrival due milliseconds
                // late after a second — every request sent behind schedule.
                let core_now = ctx.now();
                if core_now.saturating_duration_since(self.base.1) > REANCHOR {
                    self.base = (Instant::now(), core_now);
                }
                let approx = self.base.0 + core_now.saturating_duration_since(self.base.1);
                if !self.starved.is_empty() {
                    self.retry_starved(ctx, Instant::now());
                }
                let Phase::Running(wk) = &mut self.phase else {
                    return;
                };
                let t = wk.timing();
                if self.marks[1].is_none() {
                    // The edges of the measured window, for the loop-stall counts.
                    if self.marks[0].is_none() && approx >= t.warm_end {
                        self.marks[0] = Some((*ctx.stats(), core_now));
                    }
                    if approx >= t.end {
                        self.marks[1] = Some((*ctx.stats(), core_now));
                    }
                }
                if !wk.has_work(approx) && !wk.finished(approx) {
                    return;
                }
                let now = Instant::now();
                if wk.finished(now) {
                    let Phase::Running(wk) = std::mem::replace(&mut self.phase, Phase::Done) else {
                        return;
                    };
                    self.shared.plan.finished();
                    self.deliver(ctx, Ok(wk.finish()));
                    return;
                }
                wk.tick(now);
                let mut touched = std::mem::take(&mut self.touched);
                wk.take_touched(&mut touched);
                for &i in &touched {
                    // A connection waiting for buffers keeps its place in `starved`.
                    if !self.is_starved[i] {
                        self.pump(ctx, i, now);
                    }
                }
                touched.clear();
                self.touched = touched;
            }
        }
    }
}

/// What the message-mode workers count (shared by them).
#[derive(Default)]
struct MsgServed {
    requests: AtomicU64,
    rx_payload: AtomicU64,
    tx_payload: AtomicU64,
    /// Reply buffers taken from the heap because the slab had none free (overload: the
    /// slab is held by replies not acknowledged yet). A reply is never skipped for want
    /// of memory: on an ordered connection that would break the client's stream.
    heap_replies: AtomicU64,
    errors: Mutex<Vec<String>>,
}

/// A message-mode worker: applies the request's service time (its tag), then answers
/// with `resp_size` bytes — the verify pattern when asked, else a zero payload shared by
/// every reply of this worker (zero copy).
struct MsgWorker {
    resp_size: u32,
    mode: crate::service::ServiceMode,
    zeros: Option<Zbuf>,
    served: Arc<MsgServed>,
}

impl MsgWorker {
    fn fail(&self, why: String) {
        let mut e = self.served.errors.lock().unwrap_or_else(|p| p.into_inner());
        if e.is_empty() {
            // Said at once too: the report comes only at the server's end, and a server
            // killed after a failed run (its client gone) never reports.
            eprintln!("knb: error: server worker: {why}");
        }
        if e.len() < 16 {
            e.push(why);
        }
    }

    /// `bytes` in a slab buffer, or on the heap (counted in `heap_replies`) when the
    /// slab has none free.
    fn buffer(&self, ctx: &mut r2c::msg::MsgCtx<'_>, bytes: &[u8]) -> Result<Zbuf, String> {
        match ctx.alloc(bytes.len()) {
            Ok(mut m) => {
                m.extend_from_slice(bytes)
                    .map_err(|e| format!("zbuf: {e:?}"))?;
                Ok(m.freeze())
            }
            Err(zbuf::AllocError::Exhausted { .. }) => {
                self.served.heap_replies.fetch_add(1, Ordering::Relaxed);
                Ok(Zbuf::from_vec(bytes.to_vec()))
            }
            Err(e) => Err(e.to_string()),
        }
    }

    fn payload(
        &mut self,
        ctx: &mut r2c::msg::MsgCtx<'_>,
        id: u64,
        verify: bool,
    ) -> Result<Zbuf, String> {
        let n = self.resp_size as usize;
        if verify {
            let bytes: Vec<u8> = (0..self.resp_size)
                .map(|i| crate::proto::pattern_byte(id, crate::proto::SALT_RESP, i))
                .collect();
            return self.buffer(ctx, &bytes);
        }
        if self.zeros.is_none() {
            self.zeros = Some(self.buffer(ctx, &vec![0u8; n])?);
        }
        Ok(self
            .zeros
            .clone()
            .unwrap_or_else(|| Zbuf::from_vec(vec![0; n])))
    }
}

impl r2c::msg::MsgHandler for MsgWorker {
    fn on_message(&mut self, ctx: &mut r2c::msg::MsgCtx<'_>, m: msgsched::socket::Message<Conn>) {
        if let Some((ns, origin, reply)) = self.build(ctx, m) {
            if ns > 0 {
                crate::service::occupy(Duration::from_nanos(ns), self.mode);
            }
            ctx.reply(origin, reply);
        }
    }
}

/// Timer mode: the same worker logic on virtual workers (advanced by the I/O core); the
/// request's service time occupies the virtual worker, then its reply goes out.
struct VirtWorker {
    w: MsgWorker,
    stats: Arc<Mutex<Option<msgsched::virt::VirtStats>>>,
    /// `KNB_VIRTUAL_START=taken`.
    when_taken: bool,
}

/// `KNB_VIRTUAL_START`'s value: whether occupations start when taken.
fn virtual_start_from_env(v: Option<&str>) -> Result<bool, String> {
    match v.map(str::trim) {
        None | Some("" | "ready") => Ok(false),
        Some("taken") => Ok(true),
        Some(v) => Err(format!(
            "KNB_VIRTUAL_START={v:?} is neither \"ready\" nor \"taken\""
        )),
    }
}

impl r2c::msg::VirtualHandler for VirtWorker {
    fn on_message(
        &mut self,
        ctx: &mut r2c::msg::MsgCtx<'_>,
        m: msgsched::socket::Message<Conn>,
    ) -> Option<r2c::msg::Occupied> {
        let (ns, origin, reply) = self.w.build(ctx, m)?;
        Some(r2c::msg::Occupied {
            service: Duration::from_nanos(ns),
            origin,
            reply,
        })
    }

    fn start_when_taken(&self) -> bool {
        self.when_taken
    }

    fn finished(&mut self, stats: &msgsched::virt::VirtStats) {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner()) = Some(stats.clone());
    }
}

/// What the virtual workers of timer mode did: achieved vs requested occupancy.
fn virt_json(s: &msgsched::virt::VirtStats) -> Value {
    let us = |ns: u64| ns as f64 / 1e3;
    serde_json::json!({
        "started": s.started, "ended": s.ended, "refused": s.refused,
        "requested_s": s.requested_ns as f64 / 1e9, "achieved_s": s.achieved_ns as f64 / 1e9,
        "occupancy_ratio": s.occupancy_ratio(),
        "late_mean_us": s.late.mean() / 1e3, "late_p50_us": us(s.late.quantile(0.5)),
        "late_p99_us": us(s.late.quantile(0.99)), "late_p999_us": us(s.late.quantile(0.999)),
        "late_max_us": us(s.late.max()),
        // Starts earlier than the turn that took the message (msgsched's start times).
        "credit_mean_us": s.credit.mean() / 1e3, "credit_p99_us": us(s.credit.quantile(0.99)),
        "credit_share": if s.requested_ns == 0 { 0.0 } else {
            s.credit.mean() * s.credit.count() as f64 / s.requested_ns as f64
        },
    })
}

impl MsgWorker {
    /// Checks and counts a request and builds its reply: (service ns, origin, reply),
    /// or `None` for a request that is not answered (counted as an error).
    fn build(
        &mut self,
        ctx: &mut r2c::msg::MsgCtx<'_>,
        m: msgsched::socket::Message<Conn>,
    ) -> Option<(u64, msgsched::socket::Origin<Conn>, IoVec)> {
        use msgsched::parser::knb::{
            Header as MHeader, HDR_LEN as MHDR, RESPONSE as MRESP, SERVICE,
        };
        let Ok(Some(h)) = MHeader::read(&m.body) else {
            // The parser framed it, so the header is whole: cannot happen.
            self.fail("message without a header".into());
            return None;
        };
        if h.flags & (flags::NOREPLY | flags::MARK | flags::SYNC) != 0 {
            self.fail(format!(
                "request {} is bulk traffic: message mode serves --mode rpc",
                h.id
            ));
            drop(m);
            return None;
        }
        self.served.requests.fetch_add(1, Ordering::Relaxed);
        self.served
            .rx_payload
            .fetch_add(u64::from(h.len), Ordering::Relaxed);
        let mut ns = 0;
        if h.flags & SERVICE != 0 {
            let mut tag = [0u8; crate::service::TAG_LEN];
            if !msgsched::parser::peek(&m.body, MHDR, &mut tag) {
                self.fail(format!("request {}: service tag cut short", h.id));
                return None;
            }
            ns = crate::service::decode_tag(&tag);
        }
        let verify = h.flags & flags::VERIFY != 0;
        let body = match self.payload(ctx, h.id, verify) {
            Ok(b) => b,
            Err(e) => {
                self.fail(e);
                return None;
            }
        };
        let hdr = MHeader {
            id: h.id,
            len: self.resp_size,
            flags: MRESP | (h.flags & flags::VERIFY),
        };
        let head = match self.buffer(ctx, &hdr.bytes()) {
            Ok(z) => z,
            Err(e) => {
                self.fail(e);
                return None;
            }
        };
        let mut reply = IoVec::from(head);
        reply.push(body);
        self.served
            .tx_payload
            .fetch_add(u64::from(self.resp_size), Ordering::Relaxed);
        Some((ns, m.origin, reply))
    }
}

/// Messages of one connection the message-mode server lets out to its workers at once:
/// closed loop, the client's `--iodepth` (it never has more outstanding); open loop
/// (`--rate`), [`OPEN_LOOP_IN_FLIGHT`]. An open-loop client has any number outstanding
/// on a connection, and a cap of `--iodepth` (1 in `knb sweep --figure slo`) would serve
/// each connection one message at a time — CS's rule — under every model, so MS could
/// never put a second worker on a busy connection.
fn msg_in_flight(w: &crate::workload::Workload) -> usize {
    if w.rate.is_some() {
        OPEN_LOOP_IN_FLIGHT
    } else {
        (w.iodepth as usize).clamp(1, MSG_QUEUE_CAPACITY)
    }
}

/// Open loop: messages of one connection out at workers at once. Each connection's
/// staging ring has this many slots, allocated at accept (tens of bytes each, so a
/// few KB per connection even at 5,000 connections; 1,024 would be tens of MB). At 9,000 RPC/s per connection (180,000 over 20) and a 1 ms
/// SLO about 9 are in flight; a connection past 64 is overloaded far beyond the SLO, and
/// its further requests wait in TCP (back pressure, no loss).
const OPEN_LOOP_IN_FLIGHT: usize = 64;

/// Per-worker FIFO capacity of the message-mode scheduler.
const MSG_QUEUE_CAPACITY: usize = 1024;

/// The luna server in r2c's message mode (`--server-model cp|cs|ms`): one I/O core runs
/// the memif port, TCP and knb's parser; `--workers` threads take whole requests through
/// msgsched's scheduler. Serves `--connections` connections, then returns.
/// Where [`StallWindow`] reads a core's published stats ([`r2c::StatsReader`]; a fake in
/// the tests).
trait StatsSource {
    /// How many snapshots the core has published.
    fn generation(&self) -> u64;
    /// The latest snapshot.
    fn read(&self) -> r2c::CoreStats;
}

impl StatsSource for r2c::StatsReader {
    fn generation(&self) -> u64 {
        r2c::StatsReader::generation(self)
    }
    fn read(&self) -> r2c::CoreStats {
        r2c::StatsReader::read(self)
    }
}

/// The server's loop stalls over the client's measured window. The server does not see
/// that window: it starts when the last connection has attached plus the warm-up (the
/// client starts its warm-up once all its connections are up) and lasts the duration.
/// The readings are the core's published stats (every `stats_interval` iterations): at
/// each edge the supervisor waits for the next publish, so both edges are late by up to
/// one publish interval (a few ms when busy-polling) and the window keeps its length
/// (`window_s` in the JSON is the span between the two publishes).
///
/// The server notices "all attached" up to one supervision step after the client began
/// its warm-up, so its end edge falls after the client's, and the client closes its
/// connections as soon as its window ends: the first connection to detach is the end
/// edge then, read from the last publish before it (not a fresh one, which would count
/// the tear-down of every connection as a stall of the window). To keep the race on
/// the server's side, its end edge is `END_MARGIN` (at most a tenth of the duration)
/// early, and "all attached" is watched every `ATTACH_STEP`: the window is a little
/// shorter than the client's (`window_s` says by how much) and inside it.
struct StallWindow<R = r2c::StatsReader> {
    reader: Option<R>,
    warmup: Duration,
    duration: Duration,
    attached_at: Option<Instant>,
    /// The publish generation seen at the edge being waited for.
    edge_gen: Option<u64>,
    start: Option<r2c::CoreStats>,
    end: Option<r2c::CoreStats>,
}

impl<R: StatsSource> StallWindow<R> {
    fn new(reader: Option<R>, w: &Workload) -> Self {
        StallWindow::with(reader, w.warmup, w.duration)
    }

    fn with(reader: Option<R>, warmup_s: f64, duration_s: f64) -> Self {
        StallWindow {
            reader,
            warmup: Duration::from_secs_f64(warmup_s),
            duration: Duration::from_secs_f64(duration_s),
            attached_at: None,
            edge_gen: None,
            start: None,
            end: None,
        }
    }

    /// At an edge: the first publish after it (None while waiting for it).
    fn fresh(&mut self) -> Option<r2c::CoreStats> {
        let reader = self.reader.as_ref()?;
        let g = reader.generation();
        match self.edge_gen {
            None => {
                self.edge_gen = Some(g);
                None
            }
            Some(e) if g > e => {
                self.edge_gen = None;
                Some(reader.read())
            }
            Some(_) => None,
        }
    }

    /// Takes the readings that are due; returns how long to sleep (up to the next edge).
    /// `closing`: a connection has detached (the client's window is over).
    fn step(&mut self, all_attached: bool, closing: bool, now: Instant) -> Duration {
        let Some(reader) = self.reader.as_ref() else {
            return SUPERVISE_STEP;
        };
        if closing && self.start.is_some() && self.end.is_none() {
            self.end = Some(reader.read());
            self.edge_gen = None;
            return SUPERVISE_STEP;
        }
        if all_attached && self.attached_at.is_none() {
            self.attached_at = Some(now);
        }
        let Some(at) = self.attached_at else {
            // (Noticed within this step of the client's start: less than the margin.)
            return ATTACH_STEP;
        };
        let end = at + self.warmup + self.duration - end_margin(self.duration);
        let begin = at + self.warmup;
        if self.start.is_none() && now >= begin {
            self.start = self.fresh();
        } else if self.start.is_some() && self.end.is_none() && now >= end {
            self.end = self.fresh();
        }
        if self.edge_gen.is_some() {
            return Duration::from_millis(1);
        }
        let next = if self.start.is_none() {
            begin
        } else if self.end.is_none() {
            end
        } else {
            return SUPERVISE_STEP;
        };
        next.saturating_duration_since(now)
            .clamp(Duration::from_millis(1), SUPERVISE_STEP)
    }

    /// The window's stalls, once both readings were taken.
    fn stalls(&self) -> Option<Stalls> {
        let (a, b) = (self.start.as_ref()?, self.end.as_ref()?);
        let span = b.published_at_ns.saturating_sub(a.published_at_ns);
        Some(Stalls::between(a, b, Some(span)))
    }
}

fn serve_msg(
    spec: &ServerSpec,
    model: crate::service::ServerModel,
    ready: &mut dyn FnMut(),
) -> Result<ServerReport, String> {
    use crate::service::ServerModel as M;
    let w = spec.workload.clone();
    if w.threads != 1 {
        return Err("--server-model on luna runs one I/O core: use --threads 1".into());
    }
    let sched_model = match model {
        M::Cp => msgsched::model::Model::Cp,
        M::Cs => msgsched::model::Model::Cs,
        M::Ms => msgsched::model::Model::Ms,
        M::Pool => {
            return Err("--server-model pool is a kernel baseline; luna has cp, cs, ms".into())
        }
    };
    if w.emu.service_mode == crate::service::ServiceMode::Sleep {
        // Measure the sleep margin once, before any worker needs it.
        let _ = crate::service::margin();
    }
    let deadline = Instant::now() + spec.lifetime;
    let Lanes {
        eal: _eal,
        slab,
        _registry,
        mut cores,
        mut opts,
        ..
    } = open(true, &spec.eal, 1, w.mtu, spec.lifetime, ready, None)?.lanes(
        &spec.eal,
        spec.ip,
        spec.prefix_len,
        w.mtu,
        &spec.cpus,
    )?;
    // The I/O core yields when it has nothing to do: its workers may share its CPU (on
    // this 2-CPU machine they must), and a busy-polling I/O core would starve them.
    // Timer mode has no worker threads (the I/O core advances the virtual workers in
    // each iteration): it busy-polls, so a deadline is noticed at once.
    opts.idle = if w.emu.service_mode == crate::service::ServiceMode::Timer {
        IdleStrategy::BusyPoll
    } else {
        IdleStrategy::Yield
    };
    let ordering = if w.emu.unordered {
        msgsched::parser::Ordering::Unordered
    } else {
        msgsched::parser::Ordering::Ordered
    };
    let cfg = r2c::msg::MsgConfig {
        listen: vec![(spec.port, 4096)],
        sched: msgsched::sched::SchedConfig {
            model: sched_model,
            workers: w.emu.workers as usize,
            queue_capacity: MSG_QUEUE_CAPACITY,
            seed: 0x6b6e62,
        },
        framer: msgsched::framer::FramerConfig {
            max_message: crate::proto::HDR_LEN + crate::proto::MAX_PAYLOAD as usize,
            max_in_flight: msg_in_flight(&w),
            ..msgsched::framer::FramerConfig::default()
        },
        worker_cpus: Vec::new(),
    };
    let served = Arc::new(MsgServed::default());
    let sv = Arc::clone(&served);
    let (resp_size, mode) = (w.resp_size, w.emu.service_mode);
    let vstats = Arc::new(Mutex::new(None));
    let parser = move || msgsched::parser::knb::KnbParser::new(ordering);
    let (rt, workers) = if mode == crate::service::ServiceMode::Timer {
        let h = VirtWorker {
            w: MsgWorker {
                resp_size,
                mode,
                zeros: None,
                served: Arc::clone(&sv),
            },
            stats: Arc::clone(&vstats),
            when_taken: virtual_start_from_env(std::env::var("KNB_VIRTUAL_START").ok().as_deref())?,
        };
        Runtime::spawn_msg_virtual(cores.remove(0), opts, cfg, parser, h)
    } else {
        Runtime::spawn_msg(cores.remove(0), opts, cfg, parser, move |_| {
            crate::service::set_timer_slack();
            MsgWorker {
                resp_size,
                mode,
                zeros: None,
                served: Arc::clone(&sv),
            }
        })
    }
    .map_err(|e| format!("r2c message mode: {e}"))?;
    let expected = u64::from(w.connections);
    let mut window = StallWindow::new(rt.stats_reader(0), &w);
    while !rt.is_finished() && super::serving(deadline) {
        let c = workers.counters();
        if c.attached.load(Ordering::Relaxed) >= expected
            && c.detached.load(Ordering::Relaxed) >= expected
        {
            break;
        }
        let all_attached = c.attached.load(Ordering::Relaxed) >= expected;
        let closing = c.detached.load(Ordering::Relaxed) > 0;
        std::thread::sleep(window.step(all_attached, closing, Instant::now()));
    }
    rt.stop();
    let reports = rt.join().map_err(|e| format!("r2c runtime: {e}"))?;
    let mut total = ServerReport {
        connections: workers.counters().attached.load(Ordering::Relaxed),
        ..ServerReport::default()
    };
    total.counters.requests = served.requests.load(Ordering::Relaxed);
    total.counters.rx_payload = served.rx_payload.load(Ordering::Relaxed);
    total.counters.tx_payload = served.tx_payload.load(Ordering::Relaxed);
    let heap_replies = served.heap_replies.load(Ordering::Relaxed);
    total.errors = std::mem::take(&mut *served.errors.lock().unwrap_or_else(|p| p.into_inner()));
    let mut extra = core_counters(&reports);
    if let Value::Object(o) = &mut extra {
        let msg: Map<String, Value> = workers
            .counters()
            .fields()
            .into_iter()
            .map(|(k, v)| (k.to_string(), Value::from(v)))
            .collect();
        o.insert("msgsched".into(), Value::Object(msg));
        o.insert("server_model".into(), Value::from(model.name()));
        o.insert("heap_replies".into(), Value::from(heap_replies));
        o.insert("service_mode".into(), Value::from(mode.name()));
        if let Some(v) = &*vstats.lock().unwrap_or_else(|p| p.into_inner()) {
            o.insert("virtual_workers".into(), virt_json(v));
        }
        if let Some(st) = window.stalls() {
            o.insert("loop_stalls".into(), st.to_json());
        }
    }
    total.extra = extra;
    drop(reports);
    drop(slab);
    Ok(total)
}

/// The inline server's runtime on `cores` (one per lane), until every lane served its
/// connections or `deadline`: plain lanes, or the coexistence lane's exception device.
fn run_server<D: Device + Send + 'static>(
    spec: &ServerSpec,
    eal: &Eal,
    cores: Vec<CoreSetup<D>>,
    opts: CoreOptions,
    lanes: usize,
    deadline: Instant,
    linger: Option<Duration>,
) -> Result<ServerReport, String> {
    let w = spec.workload.clone();
    let mut opts = opts;
    if let Some(path) = std::env::var_os("KNB_LUNA_SERVER_CONTROL") {
        opts.control = Some(r2c::control::ControlConfig::new(path));
    }
    let faults =
        AllocFaults::from_env(std::env::var("KNB_LUNA_SERVER_ALLOC_FAIL").ok().as_deref())?;
    let shared = Arc::new(ServerShared {
        eal: eal.clone(),
        report: Mutex::new(ServerReport::default()),
        stalls: Mutex::new(vec![None; lanes]),
        lanes_done: AtomicUsize::new(0),
        stop_when_done: linger.is_none(),
        lanes,
        memory_waits: AtomicU64::new(0),
    });
    let sh = shared.clone();
    let cpus = spec.cpus.clone();
    let port = spec.port;
    let rt = Runtime::spawn_inline(cores, opts, move |i| ServerApp {
        lane: i,
        cpu: cpus[i % cpus.len()],
        port,
        expected: w.conns_of(i as u32).1 as usize,
        workload: w.clone(),
        finished: 0,
        conns: FxMap::default(),
        packer: None,
        batch: VecDeque::new(),
        starved: VecDeque::new(),
        faults,
        report: ServerReport::default(),
        shared: sh.clone(),
        lane_done: false,
        base: (Instant::now(), luna_stack::time::Instant::from_nanos(0)),
        accepted: 0,
        window: LaneWindow::new(w.warmup, w.duration),
    })
    .map_err(|e| format!("r2c runtime: {e}"))?;
    let mut done_at = None;
    while !rt.is_finished() {
        if !super::serving(deadline) {
            rt.stop();
            break;
        }
        if let Some(l) = linger {
            // Beside the kernel: its sessions go through this process's NIC, so the
            // exception path stays up `l` after knb's own connections are done.
            if shared.lanes_done.load(Ordering::Acquire) >= lanes {
                let at = *done_at.get_or_insert_with(Instant::now);
                if at.elapsed() >= l {
                    break;
                }
            }
        }
        std::thread::sleep(SUPERVISE_STEP);
    }
    rt.stop();
    let reports = rt.join().map_err(|e| format!("r2c runtime: {e}"))?;
    let mut total = std::mem::take(&mut *shared.report.lock().unwrap_or_else(|p| p.into_inner()));
    total.connections = spec.workload.connections as u64;
    total.extra = core_counters(&reports);
    let stalls = std::mem::take(&mut *shared.stalls.lock().unwrap_or_else(|p| p.into_inner()));
    if let Value::Object(o) = &mut total.extra {
        let waits = shared.memory_waits.load(Ordering::Relaxed);
        o.insert("tx_memory_waits".into(), json!(waits));
        // Every lane's window read: the window's stalls replace the whole run's.
        let windowed: Option<Vec<Stalls>> = stalls.into_iter().collect();
        if let Some(st) = windowed.and_then(|v| v.into_iter().reduce(|a, b| a.combine(&b))) {
            o.insert("loop_stalls".into(), st.to_json());
        }
    }
    drop(reports);
    Ok(total)
}

/// The kernel-coexistence server (`--exception`, issue 11): one lane whose device is
/// r2c's [`ExceptionDevice`] over the NIC (the first `--vdev`) and the exception port.
/// The traffic model is knb's listening port (and luna's client range) on `--ip`;
/// everything else — ARP, ICMP, the kernel's own TCP and UDP — goes to the exception
/// interface, and the kernel's replies out through the NIC. The NIC is asked for
/// hardware steering (`auto`): on a PMD without a flow API the one `bifurcation:` line
/// says luna falls back to software, and `steering_fallbacks` counts it.
fn serve_coexist(
    spec: &ServerSpec,
    x: &ExceptionSpec,
    ready: &mut dyn FnMut(),
) -> Result<ServerReport, String> {
    let w = spec.workload.clone();
    if w.threads != 1 || w.emu.server_model.is_some() {
        return Err("--exception runs one inline lane: use --threads 1, no --server-model".into());
    }
    let deadline = Instant::now() + spec.lifetime;
    let model = TrafficConfig {
        listen_tcp: vec![spec.port],
        ip: Some(spec.ip),
        apps: vec![bifurcation::model::AppConfig {
            name: "knb".into(),
            ports: Default::default(),
            threads: Some(1),
            queues: None,
        }],
        ..TrafficConfig::default()
    }
    .validate(&KernelPorts::from_proc().map_err(|e| format!("kernel ports: {e}"))?)
    .map_err(|e| format!("traffic model: {e}"))?;
    let steering = SteeringRequest {
        mode: SteeringMode::Auto,
        rules: bifurcation::compile(&model),
    };
    let mut env = open(
        true,
        &spec.eal,
        1,
        w.mtu,
        spec.lifetime,
        &mut || {},
        Some(steering),
    )?;
    let mut ec = DpdkDeviceConfig::new(x.port.clone());
    ec.pool_prefix = "lkx".into();
    ec.rx_mbufs = 4095;
    // net_tap, like net_af_packet, wants more than a 2 KiB buffer's data room.
    ec.rx_buf_size = if usize::from(w.mtu) + 14 + 128 <= 4096 {
        4096
    } else {
        16384
    };
    ec.link_timeout = Duration::from_secs(10);
    let exc = DpdkDevice::open(&env.eal, &env.slab, &env._registry, &ec)
        .map_err(|e| format!("open the exception port {}: {e}", x.port))?;
    let nic = env.devices.remove(0);
    let memif_nic = memif::vdev_of(&spec.eal).is_some_and(|v| v.starts_with("net_memif"));
    let Lanes {
        eal,
        slab,
        _registry,
        mut cores,
        mut opts,
        ..
    } = Env {
        devices: vec![nic],
        ..env
    }
    .lanes(&spec.eal, spec.ip, spec.prefix_len, w.mtu, &spec.cpus)?;
    if !memif_nic {
        // The memif quiesce meeting is for memif peers only.
        opts.before_release = None;
    }
    // Both ports are open: the caller may configure the exception interface now.
    ready();
    let plain = cores.remove(0);
    let mut stack = plain.stack;
    stack.answer_arp = !x.mirror;
    let nic = plain.devices.into_iter().next().ok_or("no NIC device")?;
    let mut dev = ExceptionDevice::new(nic, exc, model, 1024);
    let mirror = if x.mirror {
        let m = MirrorThread::start(&x.iface).map_err(|e| format!("mirror {}: {e}", x.iface))?;
        dev = dev.with_mirror(m.for_core().map_err(|e| format!("mirror nudger: {e}"))?);
        Some(m)
    } else {
        None
    };
    let mut core = CoreSetup::new(0, vec![dev], stack);
    core.cpu = plain.cpu;
    core.ports = plain.ports;
    core.routes = plain.routes;
    core.neighbours = plain.neighbours;
    let r = run_server(spec, &eal, vec![core], opts, 1, deadline, Some(x.linger));
    if let Some(m) = mirror {
        if let Err(e) = m.stop() {
            eprintln!("knb: mirror of {} ended: {e}", x.iface);
        }
    }
    drop(slab);
    r
}

impl Backend for Luna {
    fn stack(&self) -> Stack {
        Stack::Luna
    }

    fn topology(&self) -> Kind {
        Kind::Memif
    }

    /// A bad receive-burst knob is refused here, before either side starts (in the
    /// children the server's error came after the client's failure to reach it).
    fn unavailable(&self) -> Option<String> {
        super::env_burst("KNB_LUNA_BURST")
            .and(super::env_split("KNB_LUNA_RX_SPLIT"))
            .and(super::env_switch("KNB_LUNA_DEFER_FREES"))
            .err()
    }

    fn endpoints(
        &self,
        topo: &Topology,
        server_cpus: &[usize],
        client_cpus: &[usize],
    ) -> Result<Endpoints, String> {
        memif::endpoints(topo, server_cpus, client_cpus, "luna")
    }

    fn serve(&self, spec: &ServerSpec, ready: &mut dyn FnMut()) -> Result<ServerReport, String> {
        if let Some(m) = spec.workload.emu.server_model {
            return serve_msg(spec, m, ready);
        }
        if let Some(x) = &spec.exception {
            return serve_coexist(spec, x, ready);
        }
        let w = spec.workload.clone();
        let deadline = Instant::now() + spec.lifetime;
        let Lanes {
            eal,
            slab,
            _registry,
            cores,
            opts,
            lanes,
        } = open(
            true,
            &spec.eal,
            w.threads as u16,
            w.mtu,
            spec.lifetime,
            ready,
            None,
        )?
        .lanes(&spec.eal, spec.ip, spec.prefix_len, w.mtu, &spec.cpus)?;
        let r = run_server(spec, &eal, cores, opts, lanes, deadline, None);
        drop(slab);
        r
    }

    fn run_client(
        &self,
        spec: &ClientSpec,
        plan: &Arc<ClientPlan>,
    ) -> Result<Vec<ThreadResult>, String> {
        let w = plan.workload().clone();
        let env = match open(
            false,
            &spec.eal,
            w.threads as u16,
            w.mtu,
            Duration::from_secs(30),
            &mut || {},
            None,
        ) {
            Ok(e) => e,
            Err(e) => {
                plan.fail(e.clone());
                return Err(e);
            }
        };
        let Lanes {
            eal,
            slab,
            _registry,
            cores,
            opts,
            lanes,
        } = env.lanes(&spec.eal, spec.ip, spec.prefix_len, w.mtu, &spec.cpus)?;
        let shared = Arc::new(ClientShared {
            eal: eal.clone(),
            plan: plan.clone(),
            results: Mutex::new((0..lanes).map(|_| None).collect()),
            stalls: Mutex::new(vec![None; lanes]),
            delivered: AtomicUsize::new(0),
            memory_waits: (0..lanes).map(|_| AtomicU64::new(0)).collect(),
        });
        let sh = shared.clone();
        let cpus = spec.cpus.clone();
        let remote = SocketAddrV4::new(spec.server_ip, spec.port);
        let limit = Instant::now()
            + CONNECT_WAIT
            + Duration::from_secs_f64(w.warmup + w.duration)
            + Duration::from_secs(30);
        let rt = Runtime::spawn_inline(cores, opts, move |i| ClientApp {
            lane: i,
            cpu: cpus[i % cpus.len()],
            remote,
            n: w.conns_of(i as u32).1 as usize,
            workload: w.clone(),
            conns: Vec::new(),
            index: FxMap::default(),
            connected: 0,
            batch: VecDeque::new(),
            packer: None,
            touched: Vec::new(),
            starved: VecDeque::new(),
            is_starved: Vec::new(),
            phase: Phase::Connecting {
                until: Instant::now() + CONNECT_WAIT,
            },
            shared: sh.clone(),
            base: (Instant::now(), luna_stack::time::Instant::from_nanos(0)),
            marks: [None; 2],
        })
        .map_err(|e| {
            let e = format!("r2c runtime: {e}");
            plan.fail(e.clone());
            e
        })?;
        while shared.delivered.load(Ordering::Acquire) < lanes && !rt.is_finished() {
            if Instant::now() >= limit {
                plan.fail("luna client: the run did not finish in time".into());
                break;
            }
            std::thread::sleep(SUPERVISE_STEP);
        }
        // Graceful stop: the lanes closed their connections; FINs go out now.
        rt.stop();
        let joined = rt.join();
        let results =
            std::mem::take(&mut *shared.results.lock().unwrap_or_else(|p| p.into_inner()));
        let stalls = std::mem::take(&mut *shared.stalls.lock().unwrap_or_else(|p| p.into_inner()));
        let reports = joined.map_err(|e| format!("r2c runtime: {e}"))?;
        drop(slab);
        results
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let mut r = r.unwrap_or_else(|| Err(format!("lane {i} delivered no result")))?;
                if let Some(rep) = reports.iter().find(|rep| rep.index == i) {
                    r.extra = core_counters(std::slice::from_ref(rep));
                    if let Some(st) = stalls.get(i).copied().flatten() {
                        r.extra["loop_stalls"] = st.to_json();
                    }
                }
                if let Value::Object(o) = &mut r.extra {
                    let waits = shared.memory_waits[i].load(Ordering::Relaxed);
                    o.insert("tx_memory_waits".into(), json!(waits));
                }
                Ok(r)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tlp_env_knob_parses_or_names_the_problem() {
        use luna_stack::time::Duration;
        assert_eq!(tlp_from_env(None), Ok(None));
        assert_eq!(tlp_from_env(Some("0")), Ok(Some(None)));
        assert_eq!(
            tlp_from_env(Some(" 2000")),
            Ok(Some(Some(Duration::from_millis(2))))
        );
        for bad in ["", "-1", "2ms", "60000001"] {
            let e = tlp_from_env(Some(bad)).unwrap_err();
            assert!(e.contains("KNB_LUNA_TLP_US"), "{e}");
        }
    }

    /// A core's published stats, by hand.
    #[derive(Default)]
    struct FakeStats {
        gen: std::cell::Cell<u64>,
        stats: std::cell::RefCell<r2c::CoreStats>,
    }

    impl FakeStats {
        /// The core publishes: `gaps` more gaps of 100 µs–500 µs, at `at_ns`.
        fn publish(&self, gaps: u64, at_ns: u64) {
            let mut s = self.stats.borrow_mut();
            s.loop_gaps_100us += gaps;
            s.loop_gap_ns += gaps * 200_000;
            s.loop_gap_max_ns = s.loop_gap_max_ns.max(200_000);
            s.published_at_ns = at_ns;
            self.gen.set(self.gen.get() + 1);
        }
    }

    impl StatsSource for &FakeStats {
        fn generation(&self) -> u64 {
            self.gen.get()
        }
        fn read(&self) -> r2c::CoreStats {
            *self.stats.borrow()
        }
    }

    #[test]
    fn the_servers_stall_window_is_the_clients_and_leaves_out_set_up_and_tear_down() {
        let core = FakeStats::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Warm-up 0.5 s, window 2 s.
        let mut w = StallWindow::with(Some(&core), 0.5, 2.0);
        // Set-up: connections attaching, the loop stalling (7 gaps), no edge yet.
        core.publish(7, 1);
        assert_eq!(w.step(false, false, at(0)), ATTACH_STEP);
        w.step(true, false, at(100));
        core.publish(0, 2);
        assert!(w.stalls().is_none());
        // The start edge (100 + 500 ms) waits for the next publish.
        w.step(true, false, at(600));
        assert!(w.stalls().is_none());
        core.publish(0, 600_000_000);
        w.step(true, false, at(601));
        // Three gaps inside the window.
        core.publish(3, 1_900_000_000);
        w.step(true, false, at(1_900));
        assert!(w.stalls().is_none(), "the window is not over");
        // The client ended its window and closes (before the server's own end edge at
        // 2,550 ms): the end is the last publish before the first detach ...
        w.step(true, true, at(2_500));
        // ... and the tear-down's gaps after it are not the window's.
        core.publish(40, 2_700_000_000);
        w.step(true, true, at(2_700));
        let st = w.stalls().expect("both edges read");
        assert_eq!(st.gaps[0], 3);
        assert_eq!(st.stall_ns, 3 * 200_000);
        assert_eq!(st.window_ns, Some(1_300_000_000));

        // Without an early close the end edge is the duration's less the margin (the
        // client's end, when it closes, is 2,500 ms), on a fresh publish.
        let core = FakeStats::default();
        let mut w = StallWindow::with(Some(&core), 0.5, 2.0);
        w.step(true, false, at(0));
        w.step(true, false, at(500));
        core.publish(1, 500_000_000);
        w.step(true, false, at(501));
        core.publish(2, 2_400_000_000);
        w.step(true, false, at(2_440));
        assert!(w.stalls().is_none(), "the end edge is at 2,450 ms");
        w.step(true, false, at(2_450));
        assert!(w.stalls().is_none(), "waits for the publish after the edge");
        core.publish(5, 2_460_000_000);
        w.step(true, false, at(2_461));
        let st = w.stalls().expect("both edges read");
        assert_eq!(st.gaps[0], 7);
        assert_eq!(st.window_ns, Some(1_960_000_000));
        // A close before the window began leaves it unread (the run's own counts stand).
        let core = FakeStats::default();
        let mut w = StallWindow::with(Some(&core), 0.5, 2.0);
        w.step(true, false, at(0));
        w.step(true, true, at(100));
        assert!(w.stalls().is_none());
    }

    #[test]
    fn an_inline_lanes_stall_window_begins_after_the_warm_up_and_ends_at_the_first_close() {
        use luna_stack::time::Instant as T;
        let ms = |m: u64| T::from_millis(m);
        let gaps = |n: u64| r2c::CoreStats {
            loop_gaps_100us: n,
            loop_gap_ns: n * 200_000,
            loop_gap_max_ns: 200_000,
            ..Default::default()
        };
        // Warm-up 0.5 s, window 2 s (the end edge 50 ms early: 1.95 s).
        let mut w = LaneWindow::new(0.5, 2.0);
        // Set-up: 9 gaps while connections arrive; nothing read before the last one.
        w.poll(&gaps(9), ms(0));
        w.closing(&gaps(9), ms(1));
        w.attached(ms(100));
        w.poll(&gaps(9), ms(599));
        assert!(w.marks[0].is_none());
        w.poll(&gaps(9), ms(600));
        // Four gaps in the window, then the client's first close; tear-down after it.
        w.poll(&gaps(13), ms(2_000));
        w.closing(&gaps(13), ms(2_500));
        w.poll(&gaps(60), ms(2_600));
        w.closing(&gaps(60), ms(2_601));
        let st = w.stalls().expect("both edges");
        assert_eq!(st.gaps[0], 4);
        assert_eq!(st.window_ns, Some(1_900_000_000));

        // No close before it: the edge ends the window; a second `attached` changes nothing.
        let mut w = LaneWindow::new(0.5, 2.0);
        w.attached(ms(0));
        w.attached(ms(300));
        w.poll(&gaps(1), ms(500));
        w.poll(&gaps(3), ms(2_449));
        assert!(w.stalls().is_none());
        w.poll(&gaps(3), ms(2_450));
        w.poll(&gaps(50), ms(2_600));
        let st = w.stalls().expect("both edges");
        assert_eq!(st.gaps[0], 2);
        assert_eq!(st.window_ns, Some(1_950_000_000));
    }

    #[test]
    fn virtual_start_env_knob_parses_or_names_the_problem() {
        assert_eq!(virtual_start_from_env(None), Ok(false));
        assert_eq!(virtual_start_from_env(Some("ready")), Ok(false));
        assert_eq!(virtual_start_from_env(Some(" taken ")), Ok(true));
        let e = virtual_start_from_env(Some("later")).unwrap_err();
        assert!(
            e.contains("KNB_VIRTUAL_START") && e.contains("later"),
            "{e}"
        );
    }

    #[test]
    fn delayed_ack_env_knob_parses_or_names_the_problem() {
        use luna_stack::time::Duration;
        assert_eq!(delayed_ack_from_env(None), Ok(None));
        assert_eq!(delayed_ack_from_env(Some("0")), Ok(None));
        assert_eq!(
            delayed_ack_from_env(Some(" 40000")),
            Ok(Some(Duration::from_millis(40)))
        );
        for bad in ["", "-1", "40ms", "500000"] {
            let e = delayed_ack_from_env(Some(bad)).unwrap_err();
            assert!(e.contains("KNB_LUNA_DELAYED_ACK_US"), "{e}");
        }
    }

    #[test]
    fn alloc_fault_knob_fails_every_nth_allocation() {
        let mut f = AllocFaults::from_env(Some("3")).unwrap();
        let hits: Vec<bool> = (0..6).map(|_| f.fail_now()).collect();
        assert_eq!(hits, [false, false, true, false, false, true]);
        let mut off = AllocFaults::from_env(None).unwrap();
        assert!((0..100).all(|_| !off.fail_now()));
        for bad in ["0", "", "x", "1000001"] {
            let e = AllocFaults::from_env(Some(bad)).unwrap_err();
            assert!(e.contains("KNB_LUNA_SERVER_ALLOC_FAIL"), "{e}");
        }
    }

    #[test]
    fn slab_env_knob_parses_or_names_the_problem() {
        assert_eq!(slab_memory_from_env(None), Ok(SLAB_MEMORY));
        assert_eq!(slab_memory_from_env(Some(" 64")), Ok(64 << 20));
        for bad in ["", "47", "4097", "64M", "-1"] {
            let e = slab_memory_from_env(Some(bad)).unwrap_err();
            assert!(e.contains("KNB_LUNA_SLAB_MB"), "{e}");
        }
    }

    /// A reliability report needs drops by reason, not only their total.
    #[test]
    fn core_counters_break_drops_down_by_reason_and_sum_bursts() {
        let report = |stack: &[(StackDrop, u64)], tcp: &[(DropReason, u64)]| {
            let mut r = CoreReport {
                index: 0,
                stats: Default::default(),
                device: Default::default(),
                stack: Default::default(),
                tcp: Default::default(),
            };
            for &(why, n) in stack {
                for _ in 0..n {
                    r.stack.drop(why);
                }
            }
            for &(why, n) in tcp {
                let i = DropReason::ALL.iter().position(|x| *x == why).unwrap();
                r.tcp.drops[i] = n;
            }
            r
        };
        let v = core_counters(&[
            report(&[(StackDrop::NoSocket, 2)], &[(DropReason::OutOfWindow, 5)]),
            report(
                &[(StackDrop::NoSocket, 1), (StackDrop::Malformed, 4)],
                &[(DropReason::Paws, 1)],
            ),
        ]);
        assert_eq!(v["stack_drops"], json!(7), "{v}");
        assert_eq!(
            v["stack_drops_by_reason"],
            json!({"no_socket": 3, "malformed": 4}),
            "only non-zero reasons, by name: {v}"
        );
        assert_eq!(v["tcp_drops"], json!(6), "{v}");
        assert_eq!(
            v["tcp_drops_by_reason"],
            json!({"out_of_window": 5, "paws": 1}),
            "{v}"
        );
        assert_eq!(v["stack_burst_frames"], json!(0), "{v}");
        let mut a = report(&[], &[]);
        a.stack.burst_frames = 5;
        a.stack.coalesced_segments = 7;
        let mut b = report(&[], &[]);
        b.stack.burst_frames = 1;
        b.stack.coalesced_segments = 2;
        let v = core_counters(&[a, b]);
        assert_eq!(v["stack_burst_frames"], json!(6), "summed over cores: {v}");
        assert_eq!(v["stack_coalesced_segments"], json!(9), "{v}");
        let none = core_counters(&[report(&[], &[])]);
        assert_eq!(none["stack_drops_by_reason"], json!({}), "{none}");
        assert_eq!(none["tcp_drops_by_reason"], json!({}), "{none}");
    }

    fn heap(n: usize) -> Result<ZbufMut, zbuf::AllocError> {
        Ok(ZbufMut::heap(128, n))
    }

    fn workload(req: u32, resp: u32) -> Workload {
        use clap::Parser;
        #[derive(Parser)]
        struct W {
            #[command(flatten)]
            w: Workload,
        }
        let mut w = W::parse_from(["w"]).w;
        w.req_size = req;
        w.resp_size = resp;
        w
    }

    /// Packs everything queued; returns the buffers.
    fn pack_all(p: &mut Packer, tx: &mut TxBuf) -> Vec<Zbuf> {
        let mut out = VecDeque::new();
        while !tx.is_empty() {
            p.pack(&mut heap, tx, &mut out).unwrap();
        }
        out.into()
    }

    #[test]
    fn packed_buffers_carry_the_stream_and_share_the_payload() {
        let now = Instant::now();
        for (size, verify) in [(4096, false), (64, false), (100_000, false), (300, true)] {
            let w = workload(size, size);
            let mut p = Packer::new(&mut heap, &w).unwrap();
            let mut bytes = crate::proto::ClientConn::new(0, size, size, verify);
            let mut msgs = crate::proto::ClientConn::new(0, size, size, verify).message_mode();
            for _ in 0..16 {
                bytes.push_request(now);
                msgs.push_request(now);
            }
            let want = bytes.tx().pending().to_vec();
            let got = pack_all(&mut p, msgs.tx());
            let flat: Vec<u8> = got.iter().flat_map(|z| z.iter().copied()).collect();
            assert_eq!(flat, want, "size {size} verify {verify}");
            if !verify && size as usize > SMALL_PIECE {
                // Every payload is a view of the one zero buffer: no per-message copy.
                let zero = got
                    .iter()
                    .filter(|z| z.len() > SMALL_PIECE)
                    .all(|z| z.same_object(&p.zeros));
                assert!(zero, "size {size}");
                // Headers of a batch share buffers: far fewer buffers than messages.
                let shared: Vec<&Zbuf> = got.iter().filter(|z| z.len() <= SMALL_PIECE).collect();
                assert_eq!(shared.len(), 16, "one header slice per message");
                let pairs = shared.windows(2).filter(|w| w[0].same_object(w[1])).count();
                if size == 4096 {
                    assert_eq!(pairs, 15, "one batch, one header buffer");
                }
            }
            if size == 64 {
                // Small messages coalesce: 16 × 80 B in one buffer.
                assert_eq!(
                    got.len(),
                    1,
                    "{:?}",
                    got.iter().map(Zbuf::len).collect::<Vec<_>>()
                );
            }
        }
    }

    #[test]
    fn packing_stops_at_the_batch_limit() {
        let w = workload(16 * 1024, 0);
        let mut p = Packer::new(&mut heap, &w).unwrap();
        let mut c = crate::proto::ClientConn::new(0, 16 * 1024, 0, false).message_mode();
        for _ in 0..20 {
            c.push_bulk(0);
        }
        let before = c.tx().len();
        let mut out = VecDeque::new();
        p.pack(&mut heap, c.tx(), &mut out).unwrap();
        let packed: usize = out.iter().map(Zbuf::len).sum();
        assert!((PACK_BYTES..PACK_BYTES + 16 * 1024 + HDR_LEN).contains(&packed));
        assert_eq!(c.tx().len(), before - packed);
    }

    #[test]
    fn allocation_failure_is_an_error_not_a_panic() {
        let w = workload(4096, 4096);
        let mut p = Packer::new(&mut heap, &w).unwrap();
        let mut c = crate::proto::ClientConn::new(0, 4096, 4096, false).message_mode();
        c.push_request(Instant::now());
        let mut none = |_n: usize| -> Result<ZbufMut, zbuf::AllocError> {
            Err(zbuf::AllocError::Exhausted { class_size: 2048 })
        };
        let e = p.pack(&mut none, c.tx(), &mut VecDeque::new()).unwrap_err();
        assert!(e.to_string().contains("zbuf"), "{e}");
        assert!(Packer::new(&mut none, &w).is_err());
    }

    /// A full slab (every buffer held by unacknowledged data, as with 5,000 connections'
    /// requests waiting for an overloaded server) is back pressure: the pack takes nothing
    /// from the queue, and a later pack sends the whole stream, in order. Any other
    /// allocation failure still fails the connection.
    #[test]
    fn an_exhausted_slab_takes_nothing_from_the_queue() {
        let w = workload(64, 64);
        let mut p = Packer::new(&mut heap, &w).unwrap();
        let mut c = crate::proto::ClientConn::new(0, 64, 64, false).message_mode();
        let mut want = crate::proto::ClientConn::new(0, 64, 64, false);
        let now = Instant::now();
        for _ in 0..5 {
            c.push_request(now);
            want.push_request(now);
        }
        let before = c.tx().len();
        let mut full = |_n: usize| -> Result<ZbufMut, zbuf::AllocError> {
            Err(zbuf::AllocError::Exhausted { class_size: 2048 })
        };
        let mut out = VecDeque::new();
        let e = p.pack(&mut full, c.tx(), &mut out).unwrap_err();
        assert!(matches!(e, PackError::NoMemory(_)), "{e}");
        assert_eq!(c.tx().len(), before, "nothing taken");
        assert!(out.is_empty());
        let got = pack_all(&mut p, c.tx());
        let flat: Vec<u8> = got.iter().flat_map(|z| z.iter().copied()).collect();
        assert_eq!(flat, want.tx().pending(), "every request, in order");
        c.push_request(now);
        let mut too_large = |n: usize| -> Result<ZbufMut, zbuf::AllocError> {
            Err(zbuf::AllocError::TooLarge {
                requested: n,
                largest: 1,
            })
        };
        let e = p.pack(&mut too_large, c.tx(), &mut out).unwrap_err();
        assert!(matches!(e, PackError::Failed(_)), "{e}");
    }
}
