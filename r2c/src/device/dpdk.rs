//! [`DpdkDevice`]: one queue pair of a DPDK ethdev port as a [`Device`], zero-copy both
//! ways (zbuf's `dpdk` feature), except where a copy costs less: see the flat copy below.
//!
//! * Receive: the port's rx queues take mbufs from a [`RxPool`] whose data buffers are
//!   zbuf zone objects; each received single-segment frame becomes a [`Zbuf`] over the
//!   mbuf (metadata in the mbuf's private area, no allocation, no copy). A frame that
//!   arrives as a chain (larger than one buffer) is flattened into one buffer: a copy,
//!   counted in [`DeviceStats::copied_bytes`].
//! * Transmit: each [`Transmit`] becomes a header mbuf (the header bytes are copied:
//!   they are not payload) chained to one external-buffer mbuf per payload segment
//!   ([`TxChains`]); the payload `Zbuf`s stay referenced until DPDK frees the mbufs.
//!   Frames up to [`DpdkDeviceConfig::tx_copy_max`] bytes are instead copied into one
//!   flat mbuf (counted in [`DeviceStats::copied_bytes`]): by default only on net_memif
//!   in copy mode, whose PMD copies every frame into its ring anyway. Frames longer than
//!   a standard mbuf (2 KiB) are copied into one mbuf of a per-queue copy pool sized for
//!   the largest frame received ([`copy_pool_room`]), made only when the threshold asks
//!   for such copies; when its mbufs are all out, the frame goes as a chain.
//! * Checksums: offloads are reported only when the hardware does them. The software
//!   PMDs (tap, af_packet, null, ...) report none — net_tap advertises checksum offloads
//!   but computes them in software inside the PMD, on a copy of the header, which gains
//!   nothing — and received checksums are always verified in software (DPDK flags them
//!   per packet, which the stack cannot be told).
//! * memif zero-copy (`zero-copy=yes` on a `role=client` vdev, EAL
//!   `--single-file-segments`): the client shares EAL's memory with the server, which
//!   copies frames straight into our receive buffers and out of our transmit mbufs, so
//!   one copy per frame is left on the link instead of two. The slab must then take its
//!   zones from EAL memory (`DmaRegistry::dpdk_memory_slab_config`; checked at open),
//!   and payload outside the slab (heap buffers) is copied on transmit, as for a NIC.
//! * Virtual links ([`DpdkDeviceConfig::virtual_link_checksums`], on by default): memif
//!   and ring ports move frames between processes through shared memory, which cannot
//!   corrupt them, so the device reports checksums as offloaded (computed and verified by
//!   nobody), as Linux does on veth (`CHECKSUM_PARTIAL` / `CHECKSUM_UNNECESSARY`). Both
//!   ends of such a link must agree: a peer that verifies checksums would drop our
//!   frames. Turn it off for that peer (or to measure the software checksum cost).
//!
//! # Threading rules (for the runtime)
//!
//! * A `DpdkDevice` is `Send`, not `Sync`: it owns its rx/tx queue, which DPDK requires
//!   to be polled by one thread at a time. Create it anywhere, move it to its core, poll
//!   it there. The core registers its thread as an EAL lcore
//!   ([`Device::on_core_thread`], `Eal::register_thread`; an EAL thread keeps its id) so
//!   its mempool operations use a per-lcore cache; `lunactl stats` shows the id
//!   (`lcore`). Other threads (an application's, polling the device directly) work
//!   too, through the mempool rings.
//! * Received `Zbuf`s may be dropped on any thread: the last reference frees the mbuf
//!   to its mempool (MT-safe). Holding them holds rx buffers: size `rx_mbufs` for the
//!   rx ring plus everything the stack and the application keep (receive windows).
//! * Transmitted payload is released by DPDK's free callback, on the thread that frees
//!   the mbuf: inside `tx_burst` for the software PMDs, later on the same queue for a
//!   NIC. Zbufs from any core may be sent; they go home through zbuf's remote-free path.
//! * Drop the device before its `Eal` is cleaned up (the device keeps an `Eal` handle,
//!   so this holds unless the process exits first).
// All DPDK and buffer unsafety lives in dpdk-sys and zbuf; this module needs none.
#![forbid(unsafe_code)]

use crate::device::steering::{Steering, SteeringPlan, SteeringRequest};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dpdk_sys::{
    ffi, Eal, Mbuf, Mempool, PoolConfig, Port, PortConf, RxQueue, TxOffloadFields, TxQueue,
};
use luna_stack::stack::{Transmit, MAX_HEADER_LEN};
use luna_stack::wire::{Checksum, ChecksumCaps, EthernetAddress};
use zbuf::dpdk::{
    mbuf_to_zbuf_copied, DmaRegistry, DpdkError, RxPool, RxPoolConfig, TxChains, TxConfig, TxError,
    TxOffloadRequest, TxStats,
};
use zbuf::{IoVec, Slab, Zbuf};

use super::{Device, DeviceObservation, DeviceStats, PoolOccupancy};

/// Frames per `rte_eth_rx_burst` / `rte_eth_tx_burst` call.
pub const BURST: usize = 32;

/// PMDs that move frames with the CPU: no real checksum offload, no DMA.
const SOFTWARE_PMDS: &[&str] = &[
    "net_memif",
    "net_tap",
    "net_af_packet",
    "net_ring",
    "net_null",
    "net_pcap",
    "net_vhost",
    "net_virtio_user",
    "net_af_xdp",
];

/// PMDs whose link is shared memory between processes on one host: a frame arrives as it
/// was written, so checksums protect nothing (see `virtual_link_checksums`).
const VIRTUAL_LINK_PMDS: &[&str] = &["net_memif", "net_ring"];

/// The flat-copy threshold [`DpdkDeviceConfig::tx_copy_max`]'s default gives net_memif in
/// copy mode: every frame. Up to 2 KiB into a standard mbuf; a jumbo frame whole into one
/// of the copy pool's ([`copy_pool_room`]), which beat its zero-copy chain by 5–7% in
/// RPC/s and 13% in bulk at MTU 9000 (the PMD copies a chain segment by segment, and an
/// attached payload behind a 66-byte header is misaligned for its copy loop;
/// docs/benchmarks.md, "Jumbo frames copied flat").
pub const SOFTWARE_COPY_TX_MAX: usize = usize::MAX;

/// Mbufs in a queue's copy pool ([`copy_pool_room`]): a flat copy lives until the PMD has
/// sent it (memif in copy mode: within the burst), so a few hundred cover every burst in
/// flight; when they are all out, frames go as zero-copy chains.
const COPY_POOL_MBUFS: u32 = 511;

/// The data room (without headroom) of a queue's copy pool, when flat copies may be longer
/// than a standard mbuf holds: the frames up to `tx_copy_max` bytes, at most the largest
/// frame the port receives (`rx_buf_size`: on the software links a receive buffer holds a
/// whole frame) and what an mbuf's 16-bit room allows. `None`: no pool (standard mbufs
/// hold every flat copy).
pub fn copy_pool_room(tx_copy_max: usize, rx_buf_size: usize) -> Option<usize> {
    let standard = (ffi::RTE_MBUF_DEFAULT_BUF_SIZE - ffi::RTE_PKTMBUF_HEADROOM) as usize;
    let room = tx_copy_max
        .min(rx_buf_size)
        .min(usize::from(u16::MAX) - ffi::RTE_PKTMBUF_HEADROOM as usize);
    (room > standard).then_some(room)
}

/// The flat-copy threshold when the configuration leaves it to the device: only net_memif
/// in copy mode, measured (its PMD copies each transmitted frame into the shared ring, so
/// the chain of attached payload saves no copy and costs a hold, a reference and two
/// more mbufs per frame). A memif zero-copy client hands the peer descriptors of its own
/// buffers, where a flat copy would be one copy more; NICs DMA the payload; the other
/// software PMDs were not measured and keep zero copy.
fn auto_tx_copy_max(driver: &str, zero_copy: bool) -> usize {
    if driver == "net_memif" && !zero_copy {
        SOFTWARE_COPY_TX_MAX
    } else {
        0
    }
}

/// [`Device::rx_mem_budget`] of each of a port's queues: half the port's receive pool, in
/// the stack's truesize (each buffer's object plus `SEG_OVERHEAD`), shared equally by the
/// queues (one stack per core polls each; they all draw on the one pool). Received
/// payload is held zero copy in these buffers, so what connections hold whose
/// applications do not read comes out of the pool everything else needs: the rx rings
/// must be refilled, and ARP, ACKs, FINs and the other connections' segments arrive in
/// the same buffers. Half leaves the rings (at most `rx_desc` per queue, and
/// `rx_mbufs` must exceed them all) and that traffic the other half.
/// (The pool's objects are the slab class that holds `rx_buf_size`, at least that: at
/// the budget at most half the buffers are held.)
fn rx_mem_budget(cfg: &DpdkDeviceConfig) -> usize {
    let truesize = cfg.rx_buf_size + luna_stack::tcp::SEG_OVERHEAD;
    let pool = cfg.rx_mbufs as usize * truesize;
    pool / 2 / usize::from(cfg.queues.max(1))
}

/// Configuration of [`DpdkDevice::open`].
#[derive(Debug, Clone)]
pub struct DpdkDeviceConfig {
    /// Port (device) name, e.g. `net_memif0`: the name part of the `--vdev` argument.
    pub port: String,
    /// Queue pairs to configure on the port; [`DpdkDevice::open_all`] returns one device
    /// per pair.
    pub queues: u16,
    /// Rx ring size per queue (adjusted to the device's limits).
    pub rx_desc: u16,
    /// Tx ring size per queue.
    pub tx_desc: u16,
    /// Receive buffers (shared by the port's queues): rings plus what the stack holds.
    pub rx_mbufs: u32,
    /// Receive buffer size, headroom included (a zbuf size class ≤ 32 KiB).
    pub rx_buf_size: usize,
    /// Transmit mbufs per queue (one per header plus one per payload segment in flight).
    pub tx_mbufs: u32,
    /// Payload attachments in flight per queue.
    pub tx_holds: u32,
    /// MTU to set, `None` to keep the device's.
    pub mtu: Option<u16>,
    /// How long to wait for the link at open.
    pub link_timeout: Duration,
    /// Prefix of the mempool names (unique per process, ≤ 16 bytes).
    pub pool_prefix: String,
    /// Use checksum offloads the hardware really has (never for software PMDs).
    pub checksum_offload: bool,
    /// Frames up to this many bytes are copied into one flat mbuf instead of being sent
    /// as a chain with the payload attached (`Some(0)`: never). `None`, the default,
    /// lets the device choose ([`DpdkDevice::tx_copy_max`]): [`SOFTWARE_COPY_TX_MAX`]
    /// (every frame) on net_memif in copy mode, whose PMD copies every frame into its ring
    /// anyway, so one flat copy costs less than building and freeing a chain
    /// (docs/benchmarks.md, "Flat transmit copy on memif by default" and "Jumbo frames
    /// copied flat"); 0 (zero copy)
    /// everywhere else, above all on NICs, which DMA the attached payload. Copied bytes
    /// are counted in `copied_bytes`.
    pub tx_copy_max: Option<usize>,
    /// On a virtual link (net_memif, net_ring: shared memory that cannot corrupt a
    /// frame) the stack neither computes nor verifies IPv4/TCP/ICMP checksums: the
    /// device reports them offloaded ([`ChecksumCaps::offloaded`]) while asking the PMD
    /// for nothing. On by default; ignored for every other PMD (tap, af_packet and NICs
    /// keep software checksums or real offloads). Both ends of the link must use the
    /// same setting.
    pub virtual_link_checksums: bool,
    /// Steer luna's traffic in the NIC (`[traffic]` model compiled to rte_flow rules,
    /// flow isolation before configure, rules after start), or `None`: luna owns the
    /// port. A PMD without a flow API falls back to software with one line on stderr
    /// ([`crate::device::steering`]); [`DpdkDevice::steering_outcome`] says which it got.
    pub steering: Option<SteeringRequest>,
}

impl DpdkDeviceConfig {
    /// Defaults for `port`: one queue pair, 1024-entry rings, 8191 receive buffers of
    /// 2 KiB, 4095 transmit mbufs, 30 s to link up.
    pub fn new(port: impl Into<String>) -> Self {
        DpdkDeviceConfig {
            port: port.into(),
            queues: 1,
            rx_desc: 1024,
            tx_desc: 1024,
            rx_mbufs: 8191,
            rx_buf_size: 2048,
            tx_mbufs: 4095,
            tx_holds: 4095,
            mtu: None,
            link_timeout: Duration::from_secs(30),
            pool_prefix: "r2c".into(),
            checksum_offload: true,
            tx_copy_max: None,
            virtual_link_checksums: true,
            steering: None,
        }
    }

    fn validate(&self) -> Result<(), DeviceError> {
        let bad = |m: String| Err(DeviceError::Config(m));
        if self.port.is_empty() {
            return bad("empty port name".into());
        }
        if self.queues == 0 {
            return bad("at least one queue pair is needed".into());
        }
        if self.pool_prefix.is_empty() || self.pool_prefix.len() > 16 {
            return bad(format!(
                "pool_prefix {:?} must be 1..=16 bytes (mempool names are ≤ 28)",
                self.pool_prefix
            ));
        }
        let ring = self.rx_desc as u64 * self.queues as u64;
        if (self.rx_mbufs as u64) <= ring {
            return bad(format!(
                "rx_mbufs {} must exceed the rx rings ({} queues × {} descriptors)",
                self.rx_mbufs, self.queues, self.rx_desc
            ));
        }
        if self.tx_mbufs < 2 || self.tx_holds == 0 {
            return bad("tx_mbufs must be ≥ 2 and tx_holds ≥ 1".into());
        }
        Ok(())
    }
}

/// The name of the device a `--vdev` argument creates: `net_memif0,role=server,...` →
/// `net_memif0`.
pub fn port_name_from_vdev(vdev: &str) -> Option<&str> {
    let name = vdev.split(',').next()?.trim();
    (!name.is_empty()).then_some(name)
}

/// The memif parameters of a `--vdev` string: control socket path and role.
fn memif_socket_role(vdev: &str) -> Option<(PathBuf, &str)> {
    let mut parts = vdev.split(',');
    if !parts.next()?.trim().starts_with("net_memif") {
        return None;
    }
    let (mut socket, mut role) = (None, "server");
    for kv in vdev_params(parts) {
        match kv {
            ("socket", v) => socket = Some(PathBuf::from(v)),
            ("socket-abstract", "yes") => return None,
            ("role", v) => role = v,
            _ => {}
        }
    }
    Some((socket?, role))
}

/// The `key=value` parameters after a `--vdev`'s device name, trimmed.
fn vdev_params<'a>(
    parts: impl Iterator<Item = &'a str>,
) -> impl Iterator<Item = (&'a str, &'a str)> {
    parts.filter_map(|kv| {
        let (k, v) = kv.trim().split_once('=')?;
        Some((k.trim(), v.trim()))
    })
}

/// Whether the EAL's `--vdev` for memif port `port` (matched by its exact name) makes it a
/// client, and a zero-copy one: `(client, zero_copy)`. DPDK's deprecated `role=slave` is
/// a client too; `zero-copy=yes` counts only on a client (the server ignores it).
fn memif_client_mode(args: &[String], port: &str) -> (bool, bool) {
    let vdev = args
        .iter()
        .map(|a| a.strip_prefix("--vdev=").unwrap_or(a))
        .find(|v| port_name_from_vdev(v) == Some(port));
    let Some(vdev) = vdev else {
        return (false, false);
    };
    let (mut client, mut zero_copy) = (false, false);
    for kv in vdev_params(vdev.split(',').skip(1)) {
        match kv {
            ("role", r) => client = matches!(r, "client" | "slave"),
            ("zero-copy", z) => zero_copy = z == "yes",
            _ => {}
        }
    }
    (client, client && zero_copy)
}

/// Marker file a memif peer creates once it has stopped polling.
fn quiet_marker(socket: &Path, role: &str) -> PathBuf {
    let mut name = socket.as_os_str().to_owned();
    name.push(format!(".quiet-{role}"));
    PathBuf::from(name)
}

/// Removes stale quiescence markers of the memif link whose control socket is `socket`
/// (call before a run, as for the socket itself).
pub fn memif_quiesce_reset(socket: &Path) {
    for role in ["server", "client"] {
        let _ = std::fs::remove_file(quiet_marker(socket, role));
    }
}

/// Rendezvous of two processes on a memif link before either closes its port.
///
/// DPDK's memif PMD (22.11) handles a peer's disconnect on its control thread by
/// unmapping the shared regions, with nothing that waits for a receive burst running on
/// a data-path thread: a process still polling when its peer closes can fault inside
/// `rte_eth_rx_burst` (seen here as a SIGSEGV in about 1 of 10 short knb runs). So each
/// side, once it has stopped polling, announces that with a marker file next to the
/// (filesystem) control socket and waits for the peer's marker before closing.
///
/// Returns `Ok(true)` when the peer was seen, `Ok(false)` after `timeout` (a peer that
/// died, or that does not take part) and `Err` when `vdev` is not a memif link with a
/// filesystem socket (nothing to do) or the marker cannot be written.
pub fn memif_quiesce(vdev: &str, timeout: Duration) -> Result<bool, String> {
    let (socket, role) = memif_socket_role(vdev)
        .ok_or_else(|| format!("{vdev:?} is not a memif link with a socket path"))?;
    let other = if role == "client" { "server" } else { "client" };
    let mine = quiet_marker(&socket, role);
    std::fs::write(&mine, b"").map_err(|e| format!("quiescence marker {}: {e}", mine.display()))?;
    let theirs = quiet_marker(&socket, other);
    let end = std::time::Instant::now() + timeout;
    while !theirs.exists() {
        if std::time::Instant::now() >= end {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(true)
}

/// Whether the memif peer of `vdev` has announced (see [`memif_quiesce`]) that it stopped
/// polling: nothing more will arrive on the link, so a side waiting for its connections
/// to end can stop too. `false` when `vdev` is not a memif link with a socket path.
pub fn memif_peer_quiet(vdev: &str) -> bool {
    memif_socket_role(vdev).is_some_and(|(socket, role)| {
        let other = if role == "client" { "server" } else { "client" };
        quiet_marker(&socket, other).exists()
    })
}

/// EAL arguments and device configuration for a testbed DPDK endpoint (the namespace,
/// addresses and MACs are in `port` itself). `--no-telemetry` is added: a test process
/// needs no telemetry socket.
#[cfg(feature = "testbed")]
pub fn from_testbed(
    port: &testbed::DpdkPort,
) -> Result<(Vec<String>, DpdkDeviceConfig), DeviceError> {
    let name = port_name_from_vdev(&port.eal.vdev).ok_or_else(|| {
        DeviceError::Config(format!(
            "testbed vdev {:?} has no device name",
            port.eal.vdev
        ))
    })?;
    let mut args = port.eal.args();
    args.push("--no-telemetry".into());
    Ok((args, DpdkDeviceConfig::new(name)))
}

/// Why a device could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// A DPDK call failed.
    #[error(transparent)]
    Dpdk(#[from] dpdk_sys::Error),
    /// Zone registration or pool setup failed.
    #[error(transparent)]
    Zbuf(#[from] DpdkError),
    /// The configuration is inconsistent.
    #[error("r2c dpdk device: {0}")]
    Config(String),
}

/// DPDK-specific counters of one device (beyond [`DeviceStats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DpdkStats {
    /// Frames handed over as zero-copy `Zbuf`s.
    pub rx_zero_copy: u64,
    /// Frames that arrived as mbuf chains and were flattened (copied).
    pub rx_flattened: u64,
    /// Frames that could not be turned into a chain (too large for the port) and were
    /// dropped.
    pub tx_invalid: u64,
    /// Transmit attempts that found the mbuf pool or the hold table empty.
    pub tx_no_buffers: u64,
    /// Times net_tap's receive signal was raised to read frames queued while the receive
    /// pool was empty (`TapKick`).
    pub tap_kicks: u64,
    /// The transmit path's own counters (attachments, frees, copies).
    pub tx: TxStats,
    /// Port-level counters (all queues).
    pub port: dpdk_sys::Stats,
}

/// The port, shared by the devices of its queues; unmapped from the registry when the
/// last one goes (queues first, so no burst is running).
struct PortHandle {
    /// The rte_flow rules of the hardware path; destroyed before the port closes.
    flows: Mutex<Vec<dpdk_sys::Flow>>,
    /// How luna's traffic is steered on this port.
    steering: Steering,
    port: Mutex<Port>,
    registry: DmaRegistry,
    id: u16,
}

impl Drop for PortHandle {
    fn drop(&mut self) {
        self.flows
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.registry.remove_port(self.id);
    }
}

/// One queue pair of a DPDK port (see the module docs for the threading rules).
pub struct DpdkDevice {
    // Field order is drop order: kept chains, queues, then the port, then the pools they
    // used.
    /// A net_tap / net_tun port's interface (`tapsignal::port_iface`): its queue files'
    /// receive signals go to the core thread ([`Device::on_core_thread`]).
    tap_iface: Option<String>,
    /// The receive-signal kick of a net_tap port whose signals this core thread owns.
    tap_kick: Option<TapKick>,
    /// Chains built for the front of the transmit queue that the ring has not taken yet.
    kept: Kept,
    /// The same for [`RawPort::tx_raw`](crate::exception::RawPort::tx_raw)'s queue.
    raw_kept: Kept,
    rxq: RxQueue,
    txq: TxQueue,
    port: Arc<PortHandle>,
    tx: TxChains,
    rx: Arc<RxPool>,
    queue: u16,
    mac: EthernetAddress,
    mtu: u16,
    caps: ChecksumCaps,
    offload: bool,
    tx_copy_max: usize,
    /// Mbufs with room for a whole frame above a standard mbuf's 2 KiB, for flat copies
    /// of such frames (`tx_copy_max` above 2 KiB; see [`copy_pool_room`]).
    copy_pool: Option<Mempool>,
    /// [`Device::rx_mem_budget`]: this queue's share of half the port's receive pool.
    rx_mem_budget: usize,
    stats: DeviceStats,
    dstats: DpdkStats,
    rx_copied: u64,
    tx_copied: u64,
    mbufs: Vec<Mbuf>,
    /// Registers the core thread as an lcore ([`Device::on_core_thread`]).
    eal: Eal,
}

impl std::fmt::Debug for DpdkDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DpdkDevice")
            .field("port", &self.port.id)
            .field("queue", &self.queue)
            .field("mac", &self.mac)
            .field("mtu", &self.mtu)
            .finish()
    }
}

/// The checksum offloads a port really performs on transmit. Receive checksums are left
/// to software (DPDK reports them per packet; the stack's capability is per device).
pub fn checksum_caps(driver: &str, tx_offload_capa: u64) -> ChecksumCaps {
    if SOFTWARE_PMDS.contains(&driver) {
        return ChecksumCaps::software();
    }
    let tx = |bit: u64| {
        if tx_offload_capa & bit != 0 {
            Checksum::Tx
        } else {
            Checksum::Both
        }
    };
    ChecksumCaps {
        ipv4: tx(ffi::RTE_ETH_TX_OFFLOAD_IPV4_CKSUM),
        tcp: tx(ffi::RTE_ETH_TX_OFFLOAD_TCP_CKSUM),
        udp: tx(ffi::RTE_ETH_TX_OFFLOAD_UDP_CKSUM),
        icmpv4: Checksum::Both,
    }
}

/// The checksum capabilities the stack gets and the ones the port is configured with:
/// equal, except on a virtual link, where the stack skips checksums and the port is asked
/// for nothing.
fn device_caps(
    driver: &str,
    tx_offload_capa: u64,
    checksum_offload: bool,
    virtual_link_checksums: bool,
) -> (ChecksumCaps, ChecksumCaps) {
    if virtual_link_checksums && VIRTUAL_LINK_PMDS.contains(&driver) {
        return (ChecksumCaps::offloaded(), ChecksumCaps::software());
    }
    let hw = if checksum_offload {
        checksum_caps(driver, tx_offload_capa)
    } else {
        ChecksumCaps::software()
    };
    (hw, hw)
}

fn tx_offloads_for(caps: &ChecksumCaps) -> u64 {
    let mut o = 0;
    if !caps.ipv4.tx() {
        o |= ffi::RTE_ETH_TX_OFFLOAD_IPV4_CKSUM;
    }
    if !caps.tcp.tx() {
        o |= ffi::RTE_ETH_TX_OFFLOAD_TCP_CKSUM;
    }
    if !caps.udp.tx() {
        o |= ffi::RTE_ETH_TX_OFFLOAD_UDP_CKSUM;
    }
    o
}

impl DpdkDevice {
    /// Opens `cfg.port` with one queue pair: configures it with an rx pool over `slab`
    /// zones (registered through `registry`, which `slab` must have been built with via
    /// [`DmaRegistry::slab_config`]), starts it and waits for the link.
    pub fn open(
        eal: &Eal,
        slab: &Slab,
        registry: &DmaRegistry,
        cfg: &DpdkDeviceConfig,
    ) -> Result<DpdkDevice, DeviceError> {
        let mut one = cfg.clone();
        one.queues = 1;
        let mut devs = DpdkDevice::open_all(eal, slab, registry, &one)?;
        Ok(devs.remove(0))
    }

    /// Opens `cfg.port` with `cfg.queues` queue pairs and returns one device per pair,
    /// in queue order (give each to its own core).
    pub fn open_all(
        eal: &Eal,
        slab: &Slab,
        registry: &DmaRegistry,
        cfg: &DpdkDeviceConfig,
    ) -> Result<Vec<DpdkDevice>, DeviceError> {
        Self::open_all_then(eal, slab, registry, cfg, &mut || {})
    }

    /// [`DpdkDevice::open_all`], calling `started` once the port is started and before
    /// waiting for the link. A memif server uses it to tell its peer to connect: its
    /// link comes up only when the client does, so waiting first would deadlock a
    /// caller that starts the client after hearing from the server. A memif client's
    /// start is retried until its link is up; `started` follows that.
    pub fn open_all_then(
        eal: &Eal,
        slab: &Slab,
        registry: &DmaRegistry,
        cfg: &DpdkDeviceConfig,
        started: &mut dyn FnMut(),
    ) -> Result<Vec<DpdkDevice>, DeviceError> {
        cfg.validate()?;
        let mut port = Port::by_name(eal, &cfg.port)?;
        let info = port.info()?;
        let (caps, hw_caps) = device_caps(
            &info.driver_name,
            info.tx_offload_capa,
            cfg.checksum_offload,
            cfg.virtual_link_checksums,
        );
        let multi_seg = info.tx_offload_capa & ffi::RTE_ETH_TX_OFFLOAD_MULTI_SEGS != 0;
        let dma = !SOFTWARE_PMDS.contains(&info.driver_name.as_str());
        let rx = Arc::new(RxPool::new(
            eal,
            slab,
            Some(registry),
            &RxPoolConfig {
                cache_size: 256.min(cfg.rx_mbufs * 2 / 3),
                object_size: cfg.rx_buf_size,
                ..RxPoolConfig::new(format!("{}-rx{}", cfg.pool_prefix, port.id()), cfg.rx_mbufs)
            },
        )?);
        let conf = PortConf {
            rx_queues: cfg.queues,
            tx_queues: cfg.queues,
            rx_desc: cfg.rx_desc,
            tx_desc: cfg.tx_desc,
            tx_offloads: tx_offloads_for(&hw_caps)
                | (info.tx_offload_capa & ffi::RTE_ETH_TX_OFFLOAD_MULTI_SEGS),
            mtu: cfg.mtu,
            ..PortConf::default()
        };
        let (memif_client, zero_copy) = if info.driver_name == "net_memif" {
            memif_client_mode(eal.args(), &cfg.port)
        } else {
            (false, false)
        };
        let tx_copy_max = cfg
            .tx_copy_max
            .unwrap_or_else(|| auto_tx_copy_max(&info.driver_name, zero_copy));
        if zero_copy {
            check_zero_copy_pool(&rx)?;
        }
        // Flow isolation must be asked for before rte_eth_dev_configure (bifurcation's
        // install module); the rules come after start.
        let plan = SteeringPlan::new(cfg.steering.as_ref());
        let isolation = plan
            .isolates()
            .then(|| bifurcation::install::isolate(&port));
        port.configure(&conf, rx.mempool())?;
        registry.add_port(port.id())?;
        let handle_id = port.id();
        if memif_client {
            if zero_copy {
                // A zero-copy client cannot restart (memif closes EAL's memory-segment
                // file descriptors after use): connect once; the server must be started.
                port.start_once_until_link_up(cfg.link_timeout)?;
            } else {
                // A memif client connects once, at start: restart until the server is there.
                port.start_until_link_up(cfg.link_timeout, Duration::from_millis(500))?;
            }
            started();
        } else {
            port.start()?;
            started();
            port.wait_link_up(cfg.link_timeout)?;
        }
        let (steering, flows) = match (&isolation, &cfg.steering) {
            (Some(iso), Some(req)) => {
                match bifurcation::install::install(&mut port, iso, &req.rules) {
                    bifurcation::install::Installed::Hardware { flows } => {
                        (plan.outcome(&cfg.port, Some(Ok(flows.len()))), flows)
                    }
                    bifurcation::install::Installed::Software { message } => {
                        (plan.outcome(&cfg.port, Some(Err(message))), Vec::new())
                    }
                }
            }
            _ => {
                let s = plan.outcome(&cfg.port, None);
                if let Ok(Steering::Software { message, .. }) = &s {
                    // Software by configuration: say so once, as the fallback does.
                    eprintln!("{message}");
                }
                (s, Vec::new())
            }
        };
        let steering = steering.map_err(DeviceError::Config)?;
        let mac = EthernetAddress(port.mac()?);
        let mtu = port.mtu()?;
        let mut queues = Vec::with_capacity(cfg.queues as usize);
        for q in 0..cfg.queues {
            let mut txq = port.tx_queue(q)?;
            if zero_copy {
                // DPDK 22.11's memif zero-copy transmit can overwrite a descriptor the
                // server has not read when handed more than four chains at once.
                txq.limit_burst(TxQueue::MEMIF_ZERO_COPY_BURST);
            }
            queues.push((port.rx_queue(q)?, txq));
        }
        let handle = Arc::new(PortHandle {
            flows: Mutex::new(flows),
            steering,
            port: Mutex::new(port),
            registry: registry.clone(),
            id: handle_id,
        });
        let tap_iface = dpdk_sys::tapsignal::port_iface(
            &info.driver_name,
            info.if_index,
            dpdk_sys::tapclaim::tap_iface_of(eal.args(), &cfg.port).as_deref(),
        );
        let mut devs = Vec::with_capacity(queues.len());
        for (q, (rxq, txq)) in queues.into_iter().enumerate() {
            let tx = TxChains::new(
                eal,
                &TxConfig {
                    name: format!("{}-tx{}-{q}", cfg.pool_prefix, handle_id),
                    mbufs: cfg.tx_mbufs,
                    cache_size: 256.min(cfg.tx_mbufs * 2 / 3),
                    data_room: ffi::RTE_MBUF_DEFAULT_BUF_SIZE as u16,
                    holds: cfg.tx_holds,
                    multi_seg,
                    // memif zero-copy hands the peer descriptors into our memory: payload
                    // outside the slab's zones (EAL memory) must be copied, as for DMA.
                    registry: (dma || zero_copy).then(|| registry.clone()),
                },
            )?;
            let copy_pool = copy_pool_room(tx_copy_max, cfg.rx_buf_size)
                .map(|room| {
                    Mempool::create(
                        eal,
                        &PoolConfig {
                            data_room: (room + ffi::RTE_PKTMBUF_HEADROOM as usize) as u16,
                            ..PoolConfig::new(
                                format!("{}-txc{}-{q}", cfg.pool_prefix, handle_id),
                                COPY_POOL_MBUFS,
                            )
                        },
                    )
                })
                .transpose()?;
            devs.push(DpdkDevice {
                tap_iface: tap_iface.clone(),
                tap_kick: None,
                rxq,
                txq,
                port: handle.clone(),
                tx,
                rx: rx.clone(),
                queue: q as u16,
                mac,
                mtu,
                caps,
                // Mbuf offload flags only for what the hardware does.
                offload: hw_caps != ChecksumCaps::software(),
                tx_copy_max,
                copy_pool,
                rx_mem_budget: rx_mem_budget(cfg),
                stats: DeviceStats::default(),
                dstats: DpdkStats::default(),
                rx_copied: 0,
                tx_copied: 0,
                mbufs: Vec::with_capacity(BURST),
                kept: Kept::default(),
                raw_kept: Kept::default(),
                eal: eal.clone(),
            });
        }
        Ok(devs)
    }

    /// Frames up to this many bytes are sent as one flat copy, not a chain: the
    /// configured [`DpdkDeviceConfig::tx_copy_max`], or the device's choice (0: never).
    pub fn tx_copy_max(&self) -> usize {
        self.tx_copy_max
    }

    /// How luna's traffic is steered on this port (hardware rules, software, or the
    /// port is luna's alone).
    pub fn steering_outcome(&self) -> &Steering {
        &self.port.steering
    }

    /// Port id.
    pub fn port_id(&self) -> u16 {
        self.port.id
    }

    /// Queue id of this device.
    pub fn queue(&self) -> u16 {
        self.queue
    }

    /// The receive pool (its zones hold every received frame).
    pub fn rx_pool(&self) -> &RxPool {
        &self.rx
    }

    /// DPDK-specific counters (reads the port's counters too).
    pub fn dpdk_stats(&self) -> DpdkStats {
        let mut s = self.dstats;
        s.tx = self.tx.stats();
        s.port = self
            .port
            .port
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stats()
            .unwrap_or_default();
        s
    }
}

/// The mbuf offload request for `t` (none unless the port offloads, `offload`).
fn offload_request(offload: bool, t: &Transmit) -> Option<TxOffloadRequest> {
    let o = &t.offload;
    (offload && (o.ipv4_checksum || o.tcp_checksum)).then_some(TxOffloadRequest {
        l2_len: o.l2_len,
        l3_len: o.l3_len as u16,
        l4_len: o.l4_len,
        ipv4_checksum: o.ipv4_checksum,
        tcp_checksum: o.tcp_checksum,
        udp_checksum: false,
    })
}

/// Chains built for the first frames of a transmit queue and not yet taken by the ring.
/// They wait here for the next call instead of being freed and built again: with a
/// standing queue (5,000 connections keep thousands of frames waiting) the ring is full
/// on most iterations, and building a burst of chains to send one or two frames, then
/// freeing the rest, was ~45% of a core's cycles. Each frame's chain is built once.
///
/// The caller only appends to its queue, or empties it (the core drops a queue the
/// device refused for too long); a kept chain is used only while the queue's first frame
/// is still the one it was built for (same header bytes and length), else it is freed.
struct Kept<C = Mbuf> {
    chains: Vec<C>,
    /// Length of each kept chain's frame.
    lens: Vec<usize>,
    /// The first kept frame's header bytes (`front_hdr` of them) and length.
    front: [u8; MAX_HEADER_LEN],
    front_hdr: usize,
    front_len: usize,
}

impl<C> Default for Kept<C> {
    fn default() -> Self {
        Kept {
            chains: Vec::with_capacity(BURST),
            lens: Vec::with_capacity(BURST),
            front: [0; MAX_HEADER_LEN],
            front_hdr: 0,
            front_len: 0,
        }
    }
}

impl<C> Kept<C> {
    /// Keeps the chains if the queue (`queued` frames, the first one's header bytes and
    /// length in `front`) still starts with the frames they were built for; else frees
    /// them and returns how many.
    fn check(&mut self, front: Option<(&[u8], usize)>, queued: usize) -> u64 {
        if self.chains.is_empty() {
            return 0;
        }
        let same = front.is_some_and(|(h, len)| {
            let h = &h[..h.len().min(MAX_HEADER_LEN)];
            len == self.front_len && same_bytes(h, &self.front[..self.front_hdr])
        });
        if same && queued >= self.chains.len() {
            return 0;
        }
        let n = self.chains.len() as u64;
        self.chains.clear();
        self.lens.clear();
        n
    }

    /// Notes the queue's first frame after a call that left chains kept.
    fn mark(&mut self, front: Option<(&[u8], usize)>) {
        if let (false, Some((h, len))) = (self.chains.is_empty(), front) {
            let n = h.len().min(MAX_HEADER_LEN);
            self.front[..n].copy_from_slice(&h[..n]);
            self.front_hdr = n;
            self.front_len = len;
        }
    }
}

/// `a == b`, eight bytes at a time and inline (a busy-polling core asks on every try
/// while the ring is full; the libc `memcmp` call was ~5% of its cycles).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    fn word(s: &[u8], at: usize) -> Option<u64> {
        let w: [u8; 8] = s.get(at..at + 8)?.try_into().ok()?;
        Some(u64::from_ne_bytes(w))
    }
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n < 8 {
        return a == b;
    }
    // Whole words, then the last eight bytes (overlapping the last whole word).
    (0..n / 8).all(|i| word(a, 8 * i) == word(b, 8 * i)) && word(a, n - 8) == word(b, n - 8)
}

/// Why a frame's chain was not built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    /// No mbuf or hold free: stop here, the frame stays queued.
    NoBuffers,
    /// The frame can never be sent (too large for the port): dropped in order.
    Invalid,
}

/// The steps of a transmit burst, for [`send_bursts`].
trait BurstPort {
    /// Chains built and not yet taken by the ring, for the queue's first frames.
    fn built(&self) -> usize;
    /// Builds the chain of queued frame `i` (the next after the built ones).
    fn build(&mut self, i: usize) -> Result<(), Refused>;
    /// Offers every built chain to the ring; the ones it takes leave the built ones,
    /// the rest stay built, in order. Returns how many it took.
    fn send(&mut self) -> usize;
}

/// What [`send_bursts`] did.
#[derive(Debug, Default, PartialEq, Eq)]
struct Bursts {
    /// Frames off the front of the queue: sent, or dropped as invalid.
    taken: usize,
    invalid: u64,
    no_buffers: u64,
}

/// Sends the first `queued` frames in bursts of up to [`BURST`] chains, counting the
/// chains already built. Stops at a full ring (what it did not take stays built), at a
/// lack of buffers, or when every frame is out.
fn send_bursts(queued: usize, port: &mut impl BurstPort) -> Bursts {
    let mut b = Bursts::default();
    loop {
        let mut invalid = false;
        while port.built() < BURST && b.taken + port.built() < queued {
            match port.build(b.taken + port.built()) {
                Ok(()) => {}
                Err(Refused::NoBuffers) => {
                    b.no_buffers += 1;
                    break;
                }
                Err(Refused::Invalid) => {
                    invalid = true;
                    break;
                }
            }
        }
        let built = port.built();
        let sent = port.send();
        b.taken += sent;
        if sent < built {
            break;
        }
        if invalid {
            // Dropped here, in order, once the chains before it are out.
            b.taken += 1;
            b.invalid += 1;
            continue;
        }
        if built < BURST || b.taken >= queued {
            break;
        }
    }
    b
}

/// A queue pair's [`BurstPort`]: `make(i)` builds frame `i`'s chain (and gives its length).
struct ChainPort<'a, M> {
    txq: &'a mut TxQueue,
    kept: &'a mut Kept,
    stats: &'a mut DeviceStats,
    make: M,
}

impl<M: FnMut(usize) -> Result<(Mbuf, usize), Refused>> BurstPort for ChainPort<'_, M> {
    fn built(&self) -> usize {
        self.kept.chains.len()
    }

    fn build(&mut self, i: usize) -> Result<(), Refused> {
        let (m, len) = (self.make)(i)?;
        self.kept.chains.push(m);
        self.kept.lens.push(len);
        Ok(())
    }

    fn send(&mut self) -> usize {
        let sent = self.txq.tx_burst(&mut self.kept.chains);
        for len in self.kept.lens.drain(..sent) {
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += len as u64;
        }
        sent
    }
}

/// The first frame's header and length, for [`Kept`].
fn frame_front(q: &VecDeque<Transmit>) -> Option<(&[u8], usize)> {
    q.front().map(|t| (t.header(), t.len()))
}

/// The first raw frame's leading bytes and length, for [`Kept`].
fn raw_front(q: &VecDeque<Zbuf>) -> Option<(&[u8], usize)> {
    q.front()
        .map(|z| (&z[..z.len().min(MAX_HEADER_LEN)], z.len()))
}

/// A build error as [`Refused`].
fn refused(e: TxError) -> Refused {
    match e {
        TxError::NoMbuf | TxError::NoHold => Refused::NoBuffers,
        _ => Refused::Invalid,
    }
}

/// memif's zero-copy client shares EAL's memory with its peer and describes every buffer
/// as an offset into it: receive buffers elsewhere (zones registered as external memory)
/// would make the peer write outside the shared region (DPDK even refuses to connect).
fn check_zero_copy_pool(rx: &RxPool) -> Result<(), DeviceError> {
    match rx
        .zones()
        .iter()
        .find(|z| z.backing != zbuf::Backing::Provided)
    {
        None => Ok(()),
        Some(z) => Err(DeviceError::Config(format!(
            "memif zero-copy=yes needs receive buffers in EAL memory, but zone {} ({:?}) is \
             not: build the slab with DmaRegistry::dpdk_memory_slab_config (and give the EAL \
             --single-file-segments), or drop zero-copy=yes from the vdev",
            z.index, z.backing
        ))),
    }
}

/// `t` copied into one mbuf from the transmit pool; `None` if it does not fit (or no
/// mbuf is free), so the caller builds a chain instead.
fn flat_copy(
    pool: &Mempool,
    copy_pool: Option<&Mempool>,
    t: &Transmit,
    req: Option<&TxOffloadRequest>,
) -> Option<Mbuf> {
    // A frame longer than a standard mbuf goes into one of the copy pool's, whole: one
    // segment is what makes the copy pay (a chain of standard mbufs cost memif as much
    // as the zero-copy chain: docs/benchmarks.md, "Jumbo frames copied flat").
    let from =
        if t.len() + ffi::RTE_PKTMBUF_HEADROOM as usize > ffi::RTE_MBUF_DEFAULT_BUF_SIZE as usize {
            copy_pool?
        } else {
            pool
        };
    // One call into DPDK for the mbuf, its length and its offload fields (a fresh mbuf
    // is writable: `Mbuf::append`'s checks and the separate calls cost ~65 instructions
    // a frame more).
    let offload = req.map(|o| {
        let mut ol_flags = ffi::RTE_MBUF_F_TX_IPV4;
        if o.ipv4_checksum {
            ol_flags |= ffi::RTE_MBUF_F_TX_IP_CKSUM;
        }
        if o.tcp_checksum {
            ol_flags |= ffi::RTE_MBUF_F_TX_TCP_CKSUM;
        }
        TxOffloadFields {
            ol_flags,
            l2_len: o.l2_len,
            l3_len: o.l3_len,
            l4_len: o.l4_len,
        }
    });
    let len = u16::try_from(t.len()).ok()?;
    from.alloc_frame(len, offload.as_ref(), |buf| {
        let (h, rest) = buf.split_at_mut(t.header().len());
        h.copy_from_slice(t.header());
        let mut at = 0;
        for c in t.payload.chunks() {
            rest[at..at + c.len()].copy_from_slice(c);
            at += c.len();
        }
    })
}

impl crate::exception::RawPort for DpdkDevice {
    /// Each frame becomes a chain of an empty head and the received buffer attached
    /// (no copy by r2c; a PMD without multi-segment support gets it copied into the head).
    fn tx_raw(&mut self, frames: &mut VecDeque<Zbuf>) -> usize {
        self.stats.tx_unsent += self.raw_kept.check(raw_front(frames), frames.len());
        let tx = &mut self.tx;
        let queued = &*frames;
        let mut port = ChainPort {
            txq: &mut self.txq,
            kept: &mut self.raw_kept,
            stats: &mut self.stats,
            make: |i: usize| {
                let z = &queued[i];
                let mut iov = IoVec::new();
                iov.push(z.clone());
                let m = tx.build(&[], &iov, None).map_err(refused)?;
                Ok((m, z.len()))
            },
        };
        let b = send_bursts(queued.len(), &mut port);
        self.count(&b);
        frames.drain(..b.taken);
        self.raw_kept.mark(raw_front(frames));
        b.taken
    }
}

/// Makes net_tap read the frames that queued in its tun file while the receive pool was
/// empty (`dpdk_sys::tapsignal::kick` says why it would not by itself): once the port's
/// `rx_nombuf` moves, the core raises the tap's receive signal at each upkeep, at most
/// once a millisecond, until an upkeep after a kick finds `rx_nombuf` unchanged (the
/// kick's reads then ran to the end of the queue or to a full burst, after which DPDK
/// reads on by itself). Costs nothing while the pool never runs dry.
pub(crate) struct TapKick {
    sig: std::ffi::c_int,
    /// `rx_nombuf` at the last upkeep.
    seen: Option<u64>,
    /// `rx_nombuf` moved and no kick has read the queue clean since.
    pending: bool,
    /// A kick since `rx_nombuf` last moved.
    kicked: bool,
    last_kick: Option<std::time::Instant>,
}

impl TapKick {
    /// Least time between kicks.
    const EVERY: std::time::Duration = std::time::Duration::from_millis(1);

    fn new(sig: std::ffi::c_int) -> Self {
        TapKick {
            sig,
            seen: None,
            pending: false,
            kicked: false,
            last_kick: None,
        }
    }

    /// One upkeep with the port's `rx_nombuf`: whether to kick now.
    fn on_maintain(&mut self, nombuf: u64, now: std::time::Instant) -> bool {
        match self.seen.replace(nombuf) {
            // The first reading is the baseline.
            None => return false,
            Some(before) if before != nombuf => {
                self.pending = true;
                self.kicked = false;
            }
            // Unchanged since the last upkeep, and a kick came after the last change: its
            // reads ran without running dry.
            Some(_) if self.kicked => {
                self.pending = false;
                self.kicked = false;
            }
            Some(_) => {}
        }
        if !self.pending
            || self
                .last_kick
                .is_some_and(|t| now.saturating_duration_since(t) < Self::EVERY)
        {
            return false;
        }
        self.last_kick = Some(now);
        self.kicked = true;
        true
    }
}

impl DpdkDevice {
    fn count(&mut self, b: &Bursts) {
        self.dstats.tx_no_buffers += b.no_buffers;
        self.dstats.tx_invalid += b.invalid;
        self.stats.tx_dropped += b.invalid;
    }
}

impl Device for DpdkDevice {
    fn on_core_thread(&mut self) {
        // An lcore id gives the core its per-lcore cache in every mempool: without one each
        // mbuf allocation and free is a compare-and-swap on the pool's shared ring (11% of a
        // message-mode I/O core at 5,000 connections). Until the thread exits; an EAL thread
        // or one the application registered keeps its id. Not fatal: the rings still work.
        if let Err(e) = self.eal.register_thread() {
            eprintln!("r2c: the core thread runs without mempool caches: {e}");
        }
        if let Some(iface) = &self.tap_iface {
            // Not fatal: the signals then keep interrupting the application's calls.
            match dpdk_sys::tapsignal::direct_to_current_thread(iface) {
                Err(e) => {
                    eprintln!("r2c: net_tap {iface}: receive signals stay process-wide: {e}")
                }
                // Kicks only where the signal is ours: raised elsewhere it would reach the
                // application's threads.
                Ok(_) => {
                    self.tap_kick = dpdk_sys::tapsignal::receive_signal(iface).map(TapKick::new)
                }
            }
        }
    }

    fn maintain(&mut self) {
        let Some(k) = &mut self.tap_kick else {
            return;
        };
        let nombuf = match self.port.port.lock() {
            Ok(p) => p.stats().map(|s| s.rx_nombuf),
            Err(e) => e.into_inner().stats().map(|s| s.rx_nombuf),
        };
        let Ok(nombuf) = nombuf else {
            return;
        };
        if k.on_maintain(nombuf, std::time::Instant::now()) {
            if let Err(e) = dpdk_sys::tapsignal::kick(k.sig) {
                // Not expected (the signal was the tap's a moment ago); stop trying.
                eprintln!("r2c: net_tap: cannot raise its receive signal: {e}");
                self.tap_kick = None;
            } else {
                self.dstats.tap_kicks += 1;
            }
        }
    }

    fn rx_burst(&mut self, out: &mut Vec<Zbuf>, max: usize) -> usize {
        let mut total = 0;
        while total < max {
            let want = (max - total).min(BURST);
            let n = self.rxq.rx_burst(&mut self.mbufs, want);
            if n == 0 {
                break;
            }
            for m in self.mbufs.drain(..) {
                let z = match self.rx.to_zbuf(m) {
                    Ok(z) => {
                        self.dstats.rx_zero_copy += 1;
                        z
                    }
                    Err(chain) => {
                        // Larger than one receive buffer: the stack takes one Zbuf per frame.
                        let z = mbuf_to_zbuf_copied(&chain);
                        self.dstats.rx_flattened += 1;
                        self.rx_copied += z.len() as u64;
                        z
                    }
                };
                self.stats.rx_frames += 1;
                self.stats.rx_bytes += z.len() as u64;
                out.push(z);
            }
            total += n;
            if n < want {
                break;
            }
        }
        total
    }

    fn tx_burst(&mut self, frames: &mut VecDeque<Transmit>) -> usize {
        self.stats.tx_unsent += self.kept.check(frame_front(frames), frames.len());
        let (tx, offload, copy_max) = (&mut self.tx, self.offload, self.tx_copy_max);
        let copy_pool = self.copy_pool.as_ref();
        let tx_copied = &mut self.tx_copied;
        let queued = &*frames;
        let mut port = ChainPort {
            txq: &mut self.txq,
            kept: &mut self.kept,
            stats: &mut self.stats,
            make: |i: usize| {
                let t = &queued[i];
                let req = offload_request(offload, t);
                if t.len() <= copy_max {
                    if let Some(m) = flat_copy(tx.mempool(), copy_pool, t, req.as_ref()) {
                        *tx_copied += t.payload.len() as u64;
                        return Ok((m, t.len()));
                    }
                }
                let m = tx
                    .build(t.header(), &t.payload, req.as_ref())
                    .map_err(refused)?;
                Ok((m, t.len()))
            },
        };
        let b = send_bursts(queued.len(), &mut port);
        self.count(&b);
        frames.drain(..b.taken);
        self.kept.mark(frame_front(frames));
        b.taken
    }

    fn mac(&self) -> EthernetAddress {
        self.mac
    }

    fn caps(&self) -> ChecksumCaps {
        self.caps
    }

    fn mtu(&self) -> u16 {
        self.mtu
    }

    fn rx_mem_budget(&self) -> Option<usize> {
        Some(self.rx_mem_budget)
    }

    fn stats(&self) -> DeviceStats {
        let mut s = self.stats;
        s.copied_bytes = self.rx_copied + self.tx_copied + self.tx.stats().copied_bytes;
        let port = self
            .port
            .port
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stats()
            .unwrap_or_default();
        s.rx_missed = port.imissed + port.rx_nombuf;
        s
    }

    fn port(&self) -> u16 {
        self.port.id
    }

    fn steering(&self) -> Option<Steering> {
        (self.port.steering != Steering::OwnPort).then(|| self.port.steering.clone())
    }

    fn observe(&self) -> DeviceObservation {
        let pool = |m: &dpdk_sys::Mempool| PoolOccupancy {
            name: m.name().to_string(),
            size: u64::from(m.size()),
            in_use: u64::from(m.in_use_count()),
        };
        let mut o = DeviceObservation {
            port: self.port.id,
            queue: self.queue,
            stats: self
                .stats()
                .fields()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            pools: [
                Some(self.rx.mempool()),
                Some(self.tx.mempool()),
                self.copy_pool.as_ref(),
            ]
            .into_iter()
            .flatten()
            .map(pool)
            .collect(),
            lcore: dpdk_sys::eal::lcore_id(),
            ..DeviceObservation::default()
        };
        if self.queue == 0 {
            let xs = self
                .port
                .port
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .xstats()
                .unwrap_or_default();
            o.xstats = xs.into_iter().collect();
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tap_is_kicked_from_an_empty_pool_until_a_kick_reads_clean() {
        use std::time::{Duration, Instant};
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut k = TapKick::new(40);
        // The baseline, then a pool that never runs dry: no kicks.
        assert!(!k.on_maintain(7, ms(0)));
        assert!(!k.on_maintain(7, ms(1)));
        // rx_nombuf moves: kick.
        assert!(k.on_maintain(9, ms(2)));
        // It moves again right away (the pool is still empty): kick, but not within 1 ms.
        assert!(!k.on_maintain(12, ms(2)));
        // Unchanged since, yet the last kick came before the change: still pending.
        assert!(k.on_maintain(12, ms(3)));
        // Unchanged after that kick: it read clean; no more kicks.
        assert!(!k.on_maintain(12, ms(5)));
        assert!(!k.on_maintain(12, ms(9)));
        // A later episode starts over.
        assert!(k.on_maintain(13, ms(20)));
        assert!(!k.on_maintain(13, ms(30)));
    }

    #[test]
    fn memif_client_mode_reads_the_ports_own_vdev() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let a = args(&[
            "--vdev",
            "net_memif10,role=client,zero-copy=yes,socket=/x",
            "--vdev=net_memif1,role=client,socket=/y",
        ]);
        // net_memif1 is not net_memif10: its own vdev says copy mode.
        assert_eq!(memif_client_mode(&a, "net_memif1"), (true, false));
        assert_eq!(memif_client_mode(&a, "net_memif10"), (true, true));
        assert_eq!(memif_client_mode(&a, "net_memif2"), (false, false));
        let srv = args(&["--vdev", "net_memif0,role=server,zero-copy=yes"]);
        assert_eq!(memif_client_mode(&srv, "net_memif0"), (false, false));
        let old = args(&["--vdev", "net_memif0, role=slave ,zero-copy=yes"]);
        assert_eq!(memif_client_mode(&old, "net_memif0"), (true, true));
        // No role: DPDK's default is the server.
        let none = args(&["--vdev", "net_memif0,socket=/z"]);
        assert_eq!(memif_client_mode(&none, "net_memif0"), (false, false));
    }

    #[test]
    fn a_copy_pool_only_when_flat_copies_outgrow_a_standard_mbuf() {
        // No flat copies, or none above 2 KiB: no pool.
        assert_eq!(copy_pool_room(0, 16384), None);
        assert_eq!(copy_pool_room(2048, 16384), None);
        // memif's default (every frame) with 2 KiB receive buffers (MTU 1500): none.
        assert_eq!(copy_pool_room(SOFTWARE_COPY_TX_MAX, 2048), None);
        // Jumbo frames: room for the largest frame the port receives, not more.
        assert_eq!(copy_pool_room(16384, 16384), Some(16384));
        assert_eq!(copy_pool_room(usize::MAX, 16384), Some(16384));
        assert_eq!(copy_pool_room(9014, 16384), Some(9014));
        // Receive buffers of 2 KiB: frames are no longer than a standard mbuf holds.
        assert_eq!(copy_pool_room(16384, 2048), None);
        // An mbuf's room is 16-bit.
        assert_eq!(
            copy_pool_room(usize::MAX, 1 << 20),
            Some(usize::from(u16::MAX) - ffi::RTE_PKTMBUF_HEADROOM as usize)
        );
    }

    #[test]
    fn flat_copy_by_default_only_on_memif_in_copy_mode() {
        assert_eq!(auto_tx_copy_max("net_memif", false), SOFTWARE_COPY_TX_MAX);
        // A zero-copy client hands its own buffers to the peer: a copy would be extra.
        assert_eq!(auto_tx_copy_max("net_memif", true), 0);
        // NICs DMA the attached payload; unmeasured software PMDs keep zero copy.
        for d in [
            "net_mlx5",
            "net_ice",
            "net_tap",
            "net_af_packet",
            "net_ring",
        ] {
            assert_eq!(auto_tx_copy_max(d, false), 0, "{d}");
        }
        // Every frame, jumbo ones included (measured: docs/benchmarks.md): at MTU 9000
        // (16 KiB receive buffers) memif's default makes a copy pool for them.
        let memif = auto_tx_copy_max("net_memif", false);
        assert_eq!(copy_pool_room(memif, 16384), Some(16384));
        assert_eq!(DpdkDeviceConfig::new("net_memif0").tx_copy_max, None);
    }

    /// A ring of `cap` slots the peer empties by hand; frames are numbered, some invalid,
    /// buffers may run out. Counts every chain built.
    struct FakeRing {
        cap: usize,
        used: usize,
        kept: usize,
        built: u64,
        sent: Vec<usize>,
        invalid: Vec<usize>,
        buffers: usize,
    }

    impl FakeRing {
        fn new(cap: usize, used: usize) -> Self {
            FakeRing {
                cap,
                used,
                kept: 0,
                built: 0,
                sent: Vec::new(),
                invalid: Vec::new(),
                buffers: usize::MAX,
            }
        }
    }

    impl BurstPort for FakeRing {
        fn built(&self) -> usize {
            self.kept
        }

        fn build(&mut self, i: usize) -> Result<(), Refused> {
            if self.invalid.contains(&i) {
                return Err(Refused::Invalid);
            }
            if self.buffers == 0 {
                return Err(Refused::NoBuffers);
            }
            self.buffers -= 1;
            self.built += 1;
            self.kept += 1;
            Ok(())
        }

        fn send(&mut self) -> usize {
            let n = self.kept.min(self.cap - self.used);
            self.used += n;
            self.kept -= n;
            self.sent.push(n);
            n
        }
    }

    /// 5,000 connections keep a standing queue and the ring is full on most iterations:
    /// every frame's chain is built once, however many tries it waits (the old loop
    /// built a burst of 32 per try and freed what the ring refused).
    #[test]
    fn a_full_ring_builds_each_frames_chain_once() {
        let mut ring = FakeRing::new(256, 256);
        let mut sent = 0u64;
        for it in 0..10_000usize {
            // The peer takes a few frames between our iterations (0 to 11).
            ring.used -= (it * 7 % 12).min(ring.used);
            // The queue stays 4,096 long (the stack refills it).
            sent += send_bursts(4096, &mut ring).taken as u64;
        }
        assert!(sent > 40_000, "sent {sent}");
        assert_eq!(ring.built, sent + ring.kept as u64);
        assert!(ring.kept <= BURST);
    }

    #[test]
    fn a_ring_with_room_takes_whole_bursts_and_a_full_one_waits_without_rebuilding() {
        let mut ring = FakeRing::new(4096, 0);
        let b = send_bursts(100, &mut ring);
        assert_eq!(b.taken, 100);
        assert_eq!(ring.sent, [32, 32, 32, 4]);
        ring.used = ring.cap;
        ring.sent.clear();
        for _ in 0..3 {
            assert_eq!(send_bursts(100, &mut ring).taken, 0);
        }
        assert_eq!((ring.built, ring.kept), (132, 32), "one burst built, kept");
        ring.used = ring.cap - 40;
        assert_eq!(send_bursts(100, &mut ring).taken, 40);
        assert_eq!(ring.sent, [0, 0, 0, 32, 8]);
        assert_eq!((ring.built, ring.kept), (164, 24));
    }

    #[test]
    fn invalid_frames_drop_in_order_and_no_buffers_stop() {
        let mut ring = FakeRing::new(4096, 0);
        ring.invalid = vec![3, 40];
        let b = send_bursts(50, &mut ring);
        assert_eq!((b.taken, b.invalid), (50, 2));
        assert_eq!(ring.built, 48);
        let mut ring = FakeRing::new(4096, 0);
        ring.buffers = 5;
        let b = send_bursts(50, &mut ring);
        assert_eq!((b.taken, b.no_buffers), (5, 1));
    }

    #[test]
    fn same_bytes_compares_every_byte() {
        let a: Vec<u8> = (0..94).collect();
        for n in [0, 7, 8, 54, 66, 94] {
            assert!(same_bytes(&a[..n], &a[..n]));
            for i in 0..n {
                let mut b = a[..n].to_vec();
                b[i] ^= 1;
                assert!(!same_bytes(&a[..n], &b), "byte {i} of {n}");
            }
        }
        assert!(!same_bytes(&a[..54], &a[..55]));
    }

    /// Kept chains serve only the frames they were built for: a queue whose first frame
    /// changed (emptied and refilled) or that got shorter frees them.
    #[test]
    fn kept_chains_follow_the_queue_front() {
        let mut k: Kept<u32> = Kept::default();
        let (a, b) = ([1u8; 54], [2u8; 54]);
        assert_eq!(k.check(Some((&a, 1500)), 10), 0, "nothing kept");
        k.chains.extend([7, 8, 9]);
        k.lens.extend([1500, 1500, 66]);
        k.mark(Some((&a, 1500)));
        assert_eq!(k.check(Some((&a, 1500)), 10), 0);
        assert_eq!(k.chains.len(), 3);
        assert_eq!(k.check(Some((&a, 1500)), 2), 3, "fewer frames than chains");
        assert!(k.chains.is_empty() && k.lens.is_empty());
        k.chains.push(7);
        k.lens.push(1500);
        k.mark(Some((&a, 1500)));
        assert_eq!(k.check(Some((&b, 1500)), 10), 1, "another frame");
        k.chains.push(7);
        k.lens.push(1500);
        k.mark(Some((&a, 1500)));
        assert_eq!(k.check(Some((&a, 1400)), 10), 1, "another length");
        k.chains.push(7);
        k.lens.push(1500);
        k.mark(Some((&a, 1500)));
        assert_eq!(k.check(None, 0), 1, "queue emptied");
    }

    /// The threading contract in the module docs, checked by the compiler: a device moves
    /// to its core (Send); it is not shared (no Sync needed, and queues are not Sync).
    #[test]
    fn device_is_send() {
        fn send<T: Send>() {}
        send::<DpdkDevice>();
    }

    #[test]
    fn vdev_names() {
        assert_eq!(
            port_name_from_vdev("net_memif0,role=server,socket=/x"),
            Some("net_memif0")
        );
        assert_eq!(port_name_from_vdev("net_tap0"), Some("net_tap0"));
        assert_eq!(port_name_from_vdev(",iface=x"), None);
        assert_eq!(port_name_from_vdev(""), None);
    }

    #[test]
    fn software_pmds_never_claim_checksum_offload() {
        let all = ffi::RTE_ETH_TX_OFFLOAD_IPV4_CKSUM
            | ffi::RTE_ETH_TX_OFFLOAD_TCP_CKSUM
            | ffi::RTE_ETH_TX_OFFLOAD_UDP_CKSUM;
        // net_tap advertises these but computes them in software.
        assert_eq!(checksum_caps("net_tap", all), ChecksumCaps::software());
        assert_eq!(checksum_caps("net_memif", 0), ChecksumCaps::software());
        let nic = checksum_caps("net_ice", all);
        assert!(
            !nic.tcp.tx() && !nic.ipv4.tx(),
            "a NIC fills them on transmit"
        );
        assert!(
            nic.tcp.rx() && nic.ipv4.rx(),
            "receive is still verified in software"
        );
        assert!(nic.icmpv4.tx());
        let partial = checksum_caps("net_ice", ffi::RTE_ETH_TX_OFFLOAD_IPV4_CKSUM);
        assert!(!partial.ipv4.tx() && partial.tcp.tx());
        assert_eq!(
            tx_offloads_for(&partial),
            ffi::RTE_ETH_TX_OFFLOAD_IPV4_CKSUM
        );
        assert_eq!(tx_offloads_for(&ChecksumCaps::software()), 0);
    }

    #[test]
    fn virtual_links_skip_checksums_unless_turned_off() {
        let all = ffi::RTE_ETH_TX_OFFLOAD_IPV4_CKSUM | ffi::RTE_ETH_TX_OFFLOAD_TCP_CKSUM;
        for pmd in ["net_memif", "net_ring"] {
            let (stack, hw) = device_caps(pmd, 0, true, true);
            assert_eq!(stack, ChecksumCaps::offloaded(), "{pmd}: nobody checksums");
            assert_eq!(
                hw,
                ChecksumCaps::software(),
                "{pmd}: the PMD is asked for nothing"
            );
            assert_eq!(tx_offloads_for(&hw), 0);
            let (stack, hw) = device_caps(pmd, 0, true, false);
            assert_eq!(
                (stack, hw),
                (ChecksumCaps::software(), ChecksumCaps::software())
            );
        }
        // Links that reach a kernel or a wire keep software checksums (or real offloads).
        for pmd in ["net_tap", "net_af_packet", "net_null"] {
            let (stack, hw) = device_caps(pmd, all, true, true);
            assert_eq!(
                (stack, hw),
                (ChecksumCaps::software(), ChecksumCaps::software())
            );
        }
        let (stack, hw) = device_caps("net_ice", all, true, true);
        assert_eq!(stack, hw);
        assert!(
            !stack.tcp.tx() && stack.tcp.rx(),
            "a NIC fills, software verifies"
        );
        let (stack, _) = device_caps("net_ice", all, false, true);
        assert_eq!(stack, ChecksumCaps::software());
    }

    #[test]
    fn memif_peers_rendezvous_before_closing() {
        let dir = std::env::temp_dir().join(format!("r2c-quiesce-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("memif.sock");
        let vdev = |role: &str| {
            format!(
                "net_memif0,role={role},id=0,socket={},socket-abstract=no",
                sock.display()
            )
        };
        let (server, client) = (vdev("server"), vdev("client"));
        memif_quiesce_reset(&sock);
        // Alone, a side waits out its timeout.
        assert!(!memif_peer_quiet(&client) && !memif_peer_quiet(&server));
        assert_eq!(memif_quiesce(&server, Duration::from_millis(20)), Ok(false));
        assert!(memif_peer_quiet(&client) && !memif_peer_quiet(&server));
        // With the server's marker present, the client passes at once; a fresh pair
        // meets whichever side comes first.
        assert_eq!(memif_quiesce(&client, Duration::from_secs(5)), Ok(true));
        memif_quiesce_reset(&sock);
        let c = std::thread::spawn(move || memif_quiesce(&client, Duration::from_secs(5)));
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(memif_quiesce(&server, Duration::from_secs(5)), Ok(true));
        assert_eq!(c.join().unwrap(), Ok(true));
        memif_quiesce_reset(&sock);
        // Not a memif link with a socket path: an error, nothing is written.
        assert!(memif_quiesce("net_tap0,iface=x", Duration::ZERO).is_err());
        assert!(memif_quiesce("net_memif0,socket=/x,socket-abstract=yes", Duration::ZERO).is_err());
        assert!(memif_quiesce("net_memif0,role=client", Duration::ZERO).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A port's queues share half its receive pool, counted as the stack counts held
    /// buffers: the default 8,191 buffers of 2 KiB give each of two queues a quarter.
    #[test]
    fn the_receive_memory_budget_is_half_the_pool_shared_by_the_queues() {
        let mut c = DpdkDeviceConfig::new("net_null0");
        let truesize = 2048 + luna_stack::tcp::SEG_OVERHEAD;
        assert_eq!(rx_mem_budget(&c), 8191 * truesize / 2);
        c.queues = 2;
        assert_eq!(rx_mem_budget(&c), 8191 * truesize / 4);
        // What the budget pins at most: half the pool's buffers.
        assert!(rx_mem_budget(&c) * 2 / truesize <= 8191 / 2);
    }

    #[test]
    fn config_errors_are_named() {
        let mut c = DpdkDeviceConfig::new("net_null0");
        assert!(c.validate().is_ok());
        c.queues = 0;
        assert!(c.validate().unwrap_err().to_string().contains("queue"));
        let mut c = DpdkDeviceConfig::new("net_null0");
        c.rx_mbufs = 1000;
        assert!(c.validate().unwrap_err().to_string().contains("rx_mbufs"));
        let mut c = DpdkDeviceConfig::new("");
        assert!(c.validate().is_err());
        c.port = "x".into();
        c.pool_prefix = "a-very-long-prefix-indeed".into();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("pool_prefix"));
    }
}
