//! Ethernet ports: lookup, configuration (queues, RSS, offloads, MTU),
//! start/stop, link, stats, MAC, promiscuous mode, and per-queue burst I/O.
//!
//! Threading: a [`Port`] is the control handle (`Send`, not `Sync`: DPDK's
//! control API is not thread-safe). Each queue has one [`RxQueue`] /
//! [`TxQueue`] handle (`Send`, not `Sync`, not `Clone`): a queue belongs to
//! one thread (lcore) at a time, which DPDK requires for lock-free bursts.
//! The device is closed when the port handle and every queue and flow handle
//! are gone; `stop` and `configure` refuse while queue handles exist.

use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::eal::{Eal, IntrHold, INTR_HOLD_WAIT};
use crate::error::{Error, ErrorKind, Result};
use crate::ffi;
use crate::mbuf::Mbuf;
use crate::mempool::Mempool;

static OPEN_PORTS: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

fn open_ports() -> std::sync::MutexGuard<'static, Option<HashSet<u16>>> {
    OPEN_PORTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Ports EAL knows: `(port id, device name)`.
pub fn ports(_eal: &Eal) -> Vec<(u16, String)> {
    let mut v = Vec::new();
    // SAFETY: EAL is initialised; rte_eth_find_next returns RTE_MAX_ETHPORTS past the end.
    let mut id = unsafe { ffi::rte_eth_find_next(0) };
    while (id as u32) < ffi::RTE_MAX_ETHPORTS {
        v.push((id, port_name(id).unwrap_or_default()));
        // SAFETY: as above.
        id = unsafe { ffi::rte_eth_find_next(id + 1) };
    }
    v
}

fn port_name(id: u16) -> Option<String> {
    let mut buf = [0 as std::ffi::c_char; ffi::RTE_ETH_NAME_MAX_LEN as usize];
    // SAFETY: buf has RTE_ETH_NAME_MAX_LEN bytes as the API requires.
    let ret = unsafe { ffi::rte_eth_dev_get_name_by_port(id, buf.as_mut_ptr()) };
    (ret == 0).then(|| {
        // SAFETY: on success DPDK wrote a NUL-terminated name into buf.
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    })
}

/// What a device supports (subset of `rte_eth_dev_info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevInfo {
    /// PMD name, e.g. `net_memif`.
    pub driver_name: String,
    /// Kernel interface index, 0 if none.
    pub if_index: u32,
    /// Maximum rx queues.
    pub max_rx_queues: u16,
    /// Maximum tx queues.
    pub max_tx_queues: u16,
    /// Smallest and largest MTU.
    pub min_mtu: u16,
    /// Largest MTU.
    pub max_mtu: u16,
    /// Largest frame the device receives.
    pub max_rx_pktlen: u32,
    /// Smallest rx buffer.
    pub min_rx_bufsize: u32,
    /// `RTE_ETH_RX_OFFLOAD_*` supported.
    pub rx_offload_capa: u64,
    /// `RTE_ETH_TX_OFFLOAD_*` supported.
    pub tx_offload_capa: u64,
    /// `RTE_ETH_RSS_*` hash types supported.
    pub flow_type_rss_offloads: u64,
    /// RSS redirection table size.
    pub reta_size: u16,
    /// RSS key length.
    pub hash_key_size: u8,
    /// Descriptor limits (max, min) for rx and tx rings.
    pub rx_desc_max: u16,
    /// Minimum rx descriptors.
    pub rx_desc_min: u16,
    /// Maximum tx descriptors.
    pub tx_desc_max: u16,
    /// Minimum tx descriptors.
    pub tx_desc_min: u16,
}

/// Port configuration for [`Port::configure`].
#[derive(Debug, Clone)]
pub struct PortConf {
    /// Rx queues (≥ 1).
    pub rx_queues: u16,
    /// Tx queues (≥ 1).
    pub tx_queues: u16,
    /// Rx ring size per queue (adjusted to the device limits).
    pub rx_desc: u16,
    /// Tx ring size per queue (adjusted to the device limits).
    pub tx_desc: u16,
    /// Requested RSS hash types (`RTE_ETH_RSS_*`); masked with what the
    /// device supports. RSS is enabled when more than one rx queue is
    /// configured and the masked set is not empty.
    pub rss_hf: u64,
    /// Required rx offloads (`RTE_ETH_RX_OFFLOAD_*`); unsupported → error.
    pub rx_offloads: u64,
    /// Required tx offloads (`RTE_ETH_TX_OFFLOAD_*`); unsupported → error.
    pub tx_offloads: u64,
    /// MTU to configure, `None` for the device default.
    pub mtu: Option<u16>,
}

impl Default for PortConf {
    fn default() -> Self {
        PortConf {
            rx_queues: 1,
            tx_queues: 1,
            rx_desc: 1024,
            tx_desc: 1024,
            rss_hf: 0,
            rx_offloads: 0,
            tx_offloads: 0,
            mtu: None,
        }
    }
}

/// Link state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// Link is up.
    pub up: bool,
    /// Speed in Mbit/s (0 if unknown).
    pub speed_mbps: u32,
    /// Full duplex.
    pub full_duplex: bool,
    /// Autonegotiated.
    pub autoneg: bool,
}

/// Basic port counters (`rte_eth_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packets received.
    pub ipackets: u64,
    /// Packets sent.
    pub opackets: u64,
    /// Bytes received.
    pub ibytes: u64,
    /// Bytes sent.
    pub obytes: u64,
    /// Rx packets dropped by the device (ring full).
    pub imissed: u64,
    /// Rx errors.
    pub ierrors: u64,
    /// Tx errors.
    pub oerrors: u64,
    /// Rx mbuf allocation failures.
    pub rx_nombuf: u64,
}

pub(crate) struct PortShared {
    pub(crate) id: u16,
    pub(crate) name: String,
    queues_out: AtomicUsize,
    started: AtomicBool,
    rx_taken: Mutex<Vec<bool>>,
    tx_taken: Mutex<Vec<bool>>,
    pools: Mutex<Vec<Mempool>>,
    _eal: Eal,
}

impl PortShared {
    /// For a memif port, holds the EAL interrupt thread (parked in a callback of ours)
    /// so that a stop or close of this port cannot run while memif's own callbacks do.
    /// DPDK 22.11 memif handles its control channel on that thread, and the peer's
    /// DISCONNECT (or the channel's EOF) makes it tear the link down there
    /// (memif_intr_handler → memif_msg_receive → memif_disconnect: regions unmapped,
    /// queues reset), with no lock against a dev_stop/dev_close of the same port on
    /// another thread: our dev_stop then finds the callback active and only defers the
    /// channel's release, and dev_close → rte_eth_dev_release_port zeroes the port's data
    /// under the running callback, whose memif_disconnect reads dev_private == NULL
    /// (SIGSEGV; both peers close within a millisecond after their quiescence
    /// rendezvous, so the peer's DISCONNECT arrives just then). EAL runs interrupt
    /// callbacks one at a time, so with the thread parked in ours, memif's has either
    /// returned or not begun, and once our stop has unregistered the channel it never
    /// runs for this port. Reproduction: testbed/repro/memif-teardown.sh. `None` for
    /// other PMDs, or (said on stderr) if the thread did not come within
    /// `INTR_HOLD_WAIT`.
    fn memif_hold(&self, what: &str) -> Option<IntrHold> {
        if !self.name.starts_with("net_memif") {
            return None;
        }
        IntrHold::new(INTR_HOLD_WAIT)
            .map_err(|e| {
                eprintln!(
                    "dpdk-sys: port {}: {what} without holding the interrupt thread ({e}): \
                     memif's disconnect handling may race with it",
                    self.name
                );
            })
            .ok()
    }
}

impl Drop for PortShared {
    fn drop(&mut self) {
        let stop = self.started.load(Ordering::SeqCst);
        // memif: stop and close with the EAL interrupt thread held (see `memif_hold`).
        let hold = self.memif_hold("close");
        // SAFETY: last owner: no queue or flow handle of this port exists,
        // so no burst can run concurrently; stop/close on a valid port id.
        unsafe {
            if stop {
                ffi::rte_eth_dev_stop(self.id);
            }
            ffi::rte_eth_dev_close(self.id);
        }
        drop(hold);
        // Pools drop after close, which returned the rx rings' mbufs.
        self.pools.lock().unwrap_or_else(|p| p.into_inner()).clear();
        if let Some(set) = open_ports().as_mut() {
            set.remove(&self.id);
        }
    }
}

/// Control handle of one ethdev port. See the module docs for threading.
pub struct Port {
    shared: Arc<PortShared>,
    rss_hf: u64,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("id", &self.shared.id)
            .field("name", &self.shared.name)
            .finish()
    }
}

impl Port {
    /// Opens the port with this device name (e.g. `net_memif0`, or the
    /// `--vdev` name). One handle per port per process.
    pub fn by_name(eal: &Eal, name: &str) -> Result<Port> {
        let step = format!("find port {name:?}");
        let c = CString::new(name).map_err(|_| {
            Error::new(
                ErrorKind::InvalidArgument,
                step.clone(),
                "name contains NUL",
            )
        })?;
        let mut id = 0u16;
        // SAFETY: EAL is initialised; c is NUL-terminated; id is a valid out pointer.
        let ret = unsafe { ffi::rte_eth_dev_get_port_by_name(c.as_ptr(), &mut id) };
        if ret != 0 {
            let known = ports(eal);
            let list = if known.is_empty() {
                "no ports exist".to_owned()
            } else {
                known
                    .iter()
                    .map(|(i, n)| format!("{i}:{n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            // A vdev whose probe failed does not fail EAL init; say why it is missing.
            let probe_log: Vec<String> = eal
                .init_log()
                .iter()
                .filter(|l| l.contains(name))
                .cloned()
                .collect();
            let (cause, fix) = if probe_log.is_empty() {
                (
                    format!("no such port (known: {list})"),
                    "use one of the known names, or add the device with --vdev=<name>,... to the EAL arguments",
                )
            } else {
                let devargs = eal
                    .args()
                    .iter()
                    .filter_map(|a| {
                        a.strip_prefix("--vdev=")
                            .or_else(|| a.strip_prefix("--vdev "))
                    })
                    .find(|v| v.split(',').next() == Some(name))
                    .unwrap_or(name);
                (
                    format!("no such port: its driver failed to probe `{devargs}` at EAL init (known: {list})"),
                    "fix the device arguments named in the DPDK log lines below (e.g. the iface= or socket= value)",
                )
            };
            return Err(Error::new(ErrorKind::PortNotFound, step, cause)
                .with_fix(fix)
                .with_log(probe_log));
        }
        Port::open(eal, id, name.to_owned())
    }

    /// Opens the port with this id.
    pub fn by_id(eal: &Eal, id: u16) -> Result<Port> {
        // SAFETY: EAL is initialised; any id value is accepted.
        if unsafe { ffi::rte_eth_dev_is_valid_port(id) } == 0 {
            return Err(Error::new(
                ErrorKind::PortNotFound,
                format!("find port {id}"),
                "no such port id",
            )
            .with_fix(format!("known ports: {:?}", ports(eal))));
        }
        Port::open(eal, id, port_name(id).unwrap_or_default())
    }

    fn open(eal: &Eal, id: u16, name: String) -> Result<Port> {
        let mut g = open_ports();
        let set = g.get_or_insert_with(HashSet::new);
        if !set.insert(id) {
            return Err(Error::new(
                ErrorKind::PortBusy,
                format!("open port {name:?}"),
                "a Port handle for it already exists in this process",
            )
            .with_fix("keep one Port per device and hand out its queues"));
        }
        drop(g);
        Ok(Port {
            shared: Arc::new(PortShared {
                id,
                name,
                queues_out: AtomicUsize::new(0),
                started: AtomicBool::new(false),
                rx_taken: Mutex::new(Vec::new()),
                tx_taken: Mutex::new(Vec::new()),
                pools: Mutex::new(Vec::new()),
                _eal: eal.clone(),
            }),
            rss_hf: 0,
            _not_sync: PhantomData,
        })
    }

    pub(crate) fn shared(&self) -> &Arc<PortShared> {
        &self.shared
    }

    /// Port id.
    pub fn id(&self) -> u16 {
        self.shared.id
    }

    /// Device name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    fn step(&self, what: &str) -> String {
        format!("{what} port {} ({})", self.shared.name, self.shared.id)
    }

    /// Device capabilities.
    pub fn info(&self) -> Result<DevInfo> {
        let raw = self.raw_info()?;
        let driver_name = if raw.driver_name.is_null() {
            String::new()
        } else {
            // SAFETY: driver_name points to the PMD's static NUL-terminated name.
            unsafe { CStr::from_ptr(raw.driver_name) }
                .to_string_lossy()
                .into_owned()
        };
        Ok(DevInfo {
            driver_name,
            if_index: raw.if_index,
            max_rx_queues: raw.max_rx_queues,
            max_tx_queues: raw.max_tx_queues,
            min_mtu: raw.min_mtu,
            max_mtu: raw.max_mtu,
            max_rx_pktlen: raw.max_rx_pktlen,
            min_rx_bufsize: raw.min_rx_bufsize,
            rx_offload_capa: raw.rx_offload_capa,
            tx_offload_capa: raw.tx_offload_capa,
            flow_type_rss_offloads: raw.flow_type_rss_offloads,
            reta_size: raw.reta_size,
            hash_key_size: raw.hash_key_size,
            rx_desc_max: raw.rx_desc_lim.nb_max,
            rx_desc_min: raw.rx_desc_lim.nb_min,
            tx_desc_max: raw.tx_desc_lim.nb_max,
            tx_desc_min: raw.tx_desc_lim.nb_min,
        })
    }

    fn raw_info(&self) -> Result<ffi::rte_eth_dev_info> {
        // SAFETY: all-zero is a valid rte_eth_dev_info (integers and null pointers).
        let mut raw: ffi::rte_eth_dev_info = unsafe { std::mem::zeroed() };
        // SAFETY: valid port id; raw is a valid out pointer.
        let ret = unsafe { ffi::rte_eth_dev_info_get(self.shared.id, &mut raw) };
        if ret != 0 {
            return Err(Error::dpdk(
                ErrorKind::PortQuery,
                self.step("get info of"),
                ret,
            ));
        }
        Ok(raw)
    }

    fn check_idle(&self, what: &str) -> Result<()> {
        let n = self.shared.queues_out.load(Ordering::SeqCst);
        if n != 0 {
            return Err(Error::new(
                ErrorKind::PortState,
                self.step(what),
                format!("{n} queue handle(s) are still in use"),
            )
            .with_fix(
                "drop every RxQueue/TxQueue of the port first (bursts must not run during this)",
            ));
        }
        Ok(())
    }

    /// Configures the device and sets up all rx queues (taking mbufs from
    /// `pool`) and tx queues. The port must be stopped.
    pub fn configure(&mut self, conf: &PortConf, pool: &Mempool) -> Result<()> {
        self.check_idle("configure")?;
        if self.shared.started.load(Ordering::SeqCst) {
            return Err(Error::new(
                ErrorKind::PortState,
                self.step("configure"),
                "port is started",
            )
            .with_fix("stop it first"));
        }
        let step = self.step("configure");
        if conf.rx_queues == 0 || conf.tx_queues == 0 {
            return Err(
                Error::new(ErrorKind::InvalidArgument, step, "0 rx or tx queues")
                    .with_fix("configure at least one rx and one tx queue"),
            );
        }
        let raw = self.raw_info()?;
        let info = self.info()?;
        let bad_rx = conf.rx_offloads & !raw.rx_offload_capa;
        let bad_tx = conf.tx_offloads & !raw.tx_offload_capa;
        if bad_rx != 0 || bad_tx != 0 {
            return Err(Error::new(
                ErrorKind::PortConfigure,
                step,
                format!(
                    "driver {} does not support rx offloads {bad_rx:#x} / tx offloads {bad_tx:#x} \
                     (capabilities rx {:#x}, tx {:#x})",
                    info.driver_name, raw.rx_offload_capa, raw.tx_offload_capa
                ),
            )
            .with_fix("request only offloads in Port::info().rx_offload_capa / tx_offload_capa"));
        }

        // SAFETY: all-zero rte_eth_conf is DPDK's documented default.
        let mut c: ffi::rte_eth_conf = unsafe { std::mem::zeroed() };
        // Only hash types the device supports; asking for others fails configure.
        let rss = conf.rss_hf & raw.flow_type_rss_offloads;
        if conf.rx_queues > 1 && rss != 0 {
            c.rxmode.mq_mode = ffi::rte_eth_rx_mq_mode::RTE_ETH_MQ_RX_RSS;
            c.rx_adv_conf.rss_conf.rss_hf = rss;
            self.rss_hf = rss;
        } else {
            self.rss_hf = 0;
        }
        c.rxmode.offloads = conf.rx_offloads;
        c.txmode.offloads = conf.tx_offloads;
        if let Some(mtu) = conf.mtu {
            c.rxmode.mtu = mtu as u32;
        }
        let limits = format!(
            "driver {} supports ≤ {} rx / {} tx queues, MTU {}..={}, frames ≤ {} B",
            info.driver_name,
            info.max_rx_queues,
            info.max_tx_queues,
            info.min_mtu,
            info.max_mtu,
            info.max_rx_pktlen
        );
        crate::log::clear();
        // SAFETY: valid port, stopped, no queue handles; c outlives the call.
        let ret = unsafe {
            ffi::rte_eth_dev_configure(self.shared.id, conf.rx_queues, conf.tx_queues, &c)
        };
        if ret != 0 {
            return Err(
                Error::dpdk(ErrorKind::PortConfigure, step, ret).with_fix(format!(
                    "asked for {} rx / {} tx queues{}; {limits}",
                    conf.rx_queues,
                    conf.tx_queues,
                    conf.mtu.map(|m| format!(", MTU {m}")).unwrap_or_default()
                )),
            );
        }
        let (mut nrx, mut ntx) = (conf.rx_desc, conf.tx_desc);
        // SAFETY: valid configured port; in/out pointers to our locals.
        let ret =
            unsafe { ffi::rte_eth_dev_adjust_nb_rx_tx_desc(self.shared.id, &mut nrx, &mut ntx) };
        if ret != 0 {
            return Err(Error::dpdk(
                ErrorKind::PortConfigure,
                self.step("adjust descriptors of"),
                ret,
            ));
        }
        // SAFETY: valid port id.
        let socket = unsafe { ffi::rte_eth_dev_socket_id(self.shared.id) };
        let socket = if socket < 0 {
            ffi::SOCKET_ID_ANY
        } else {
            socket as u32
        };
        for q in 0..conf.rx_queues {
            // SAFETY: configured port, q < rx_queues; null conf = defaults;
            // the pool is kept alive in `pools` until the port is closed.
            let ret = unsafe {
                ffi::rte_eth_rx_queue_setup(
                    self.shared.id,
                    q,
                    nrx,
                    socket,
                    std::ptr::null(),
                    pool.as_ptr(),
                )
            };
            if ret != 0 {
                return Err(Error::dpdk(ErrorKind::PortConfigure, self.step(&format!("set up rx queue {q} of")), ret)
                    .with_fix(format!(
                        "{nrx} descriptors from pool {} ({} mbufs of {} B data room); the pool must \
                         hold more mbufs than all rx rings together and its data room must be ≥ {} B",
                        pool.name(),
                        pool.size(),
                        pool.data_room(),
                        info.min_rx_bufsize
                    )));
            }
        }
        for q in 0..conf.tx_queues {
            // SAFETY: configured port, q < tx_queues; null conf = defaults.
            let ret = unsafe {
                ffi::rte_eth_tx_queue_setup(self.shared.id, q, ntx, socket, std::ptr::null())
            };
            if ret != 0 {
                return Err(Error::dpdk(
                    ErrorKind::PortConfigure,
                    self.step(&format!("set up tx queue {q} of")),
                    ret,
                )
                .with_fix(format!(
                    "{ntx} descriptors; device limit {}..={}",
                    info.tx_desc_min, info.tx_desc_max
                )));
            }
        }
        self.shared
            .pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(pool.clone());
        *self
            .shared
            .rx_taken
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = vec![false; conf.rx_queues as usize];
        *self
            .shared
            .tx_taken
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = vec![false; conf.tx_queues as usize];
        Ok(())
    }

    /// RSS hash types in effect after [`configure`](Self::configure) (0 = no RSS).
    pub fn rss_hf(&self) -> u64 {
        self.rss_hf
    }

    /// Starts the device.
    pub fn start(&mut self) -> Result<()> {
        if self.shared.started.load(Ordering::SeqCst) {
            return Ok(());
        }
        crate::log::clear();
        // SAFETY: valid, configured port.
        let ret = unsafe { ffi::rte_eth_dev_start(self.shared.id) };
        if ret != 0 {
            return Err(
                Error::dpdk(ErrorKind::PortState, self.step("start"), ret).with_fix(
                    "configure the port (queues set up) before starting; see the DPDK log lines",
                ),
            );
        }
        self.shared.started.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Stops the device. Refuses while queue handles exist.
    pub fn stop(&mut self) -> Result<()> {
        self.check_idle("stop")?;
        if !self.shared.started.load(Ordering::SeqCst) {
            return Ok(());
        }
        let hold = self.shared.memif_hold("stop");
        // SAFETY: valid started port; no queue handle exists, so no burst runs.
        let ret = unsafe { ffi::rte_eth_dev_stop(self.shared.id) };
        drop(hold);
        if ret != 0 {
            return Err(Error::dpdk(ErrorKind::PortState, self.step("stop"), ret));
        }
        self.shared.started.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Whether [`start`](Self::start) succeeded and no stop followed.
    pub fn is_started(&self) -> bool {
        self.shared.started.load(Ordering::SeqCst)
    }

    fn take_queue(&mut self, rx: bool, q: u16) -> Result<()> {
        let kind = if rx { "rx" } else { "tx" };
        let list = if rx {
            &self.shared.rx_taken
        } else {
            &self.shared.tx_taken
        };
        let mut taken = list.lock().unwrap_or_else(|p| p.into_inner());
        match taken.get_mut(q as usize) {
            None => Err(Error::new(
                ErrorKind::InvalidArgument,
                self.step(&format!("take {kind} queue {q} of")),
                format!("only {} {kind} queue(s) are configured", taken.len()),
            )
            .with_fix("configure the port with enough queues first")),
            Some(true) => Err(Error::new(
                ErrorKind::PortBusy,
                self.step(&format!("take {kind} queue {q} of")),
                "its handle is already taken",
            )
            .with_fix("a queue has one owner (one lcore); pass its handle instead")),
            Some(t) => {
                *t = true;
                self.shared.queues_out.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        }
    }

    /// The handle of rx queue `q` (one handle per queue at a time).
    pub fn rx_queue(&mut self, q: u16) -> Result<RxQueue> {
        self.take_queue(true, q)?;
        Ok(RxQueue {
            shared: self.shared.clone(),
            queue: q,
            _not_sync: PhantomData,
        })
    }

    /// The handle of tx queue `q` (one handle per queue at a time).
    pub fn tx_queue(&mut self, q: u16) -> Result<TxQueue> {
        self.take_queue(false, q)?;
        Ok(TxQueue {
            max_burst: u16::MAX,
            shared: self.shared.clone(),
            queue: q,
            _not_sync: PhantomData,
        })
    }

    /// Link state without waiting.
    pub fn link(&self) -> Result<Link> {
        let mut l = ffi::dpdk_sys_link::default();
        // SAFETY: valid port; l is a valid out pointer.
        let ret = unsafe { ffi::dpdk_sys_eth_link_get_nowait(self.shared.id, &mut l) };
        if ret != 0 {
            return Err(Error::dpdk(
                ErrorKind::PortQuery,
                self.step("get link of"),
                ret,
            ));
        }
        Ok(Link {
            up: l.up != 0,
            speed_mbps: l.speed_mbps,
            full_duplex: l.full_duplex != 0,
            autoneg: l.autoneg != 0,
        })
    }

    /// Polls the link until it is up or `timeout` passes.
    pub fn wait_link_up(&self, timeout: Duration) -> Result<Link> {
        let end = Instant::now() + timeout;
        loop {
            let l = self.link()?;
            if l.up {
                return Ok(l);
            }
            if Instant::now() >= end {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    self.step("wait for link of"),
                    format!("link still down after {timeout:?}"),
                )
                .with_fix("check the peer (memif: is the other side running with the same socket? tap: is the interface up?)"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the port and waits for link up; if the link stays down for
    /// `retry_every`, stops and starts it again, until `timeout`.
    ///
    /// For memif clients: a client connects once, at start, and a server
    /// that is not started yet refuses it for good, so the client must
    /// restart to reconnect. Harmless for other PMDs.
    pub fn start_until_link_up(
        &mut self,
        timeout: Duration,
        retry_every: Duration,
    ) -> Result<Link> {
        let end = Instant::now() + timeout;
        loop {
            let started = self.start();
            if started.is_ok() {
                let wait = retry_every.min(end.saturating_duration_since(Instant::now()));
                if let Ok(l) = self.wait_link_up(wait) {
                    return Ok(l);
                }
            }
            if Instant::now() >= end {
                started?;
                return self.wait_link_up(Duration::ZERO);
            }
            if self.is_started() {
                self.stop()?;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the port and waits up to `timeout` for link up, never stopping it once
    /// started (only a start that failed is tried again, every 20 ms).
    ///
    /// For DPDK 22.11 memif clients in zero-copy mode, where
    /// [`start_until_link_up`](Self::start_until_link_up)'s restarts are unsafe: their
    /// regions are EAL's own memory-segment-list files, and memif closes those EAL file
    /// descriptors once it has used them (`memif_connect`, `memif_free_regions`), so
    /// after a stop the next start hands the server stale or reused descriptor numbers
    /// (its mmap fails with ENODEV and its interrupt thread panics). Such a client
    /// connects once, to a server that is already started.
    pub fn start_once_until_link_up(&mut self, timeout: Duration) -> Result<Link> {
        let end = Instant::now() + timeout;
        loop {
            match self.start() {
                Ok(()) => return self.wait_link_up(end.saturating_duration_since(Instant::now())),
                Err(e) if Instant::now() >= end => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Basic counters.
    pub fn stats(&self) -> Result<Stats> {
        // SAFETY: zeroed rte_eth_stats is valid (plain integers).
        let mut s: ffi::rte_eth_stats = unsafe { std::mem::zeroed() };
        // SAFETY: valid port; s is a valid out pointer.
        let ret = unsafe { ffi::rte_eth_stats_get(self.shared.id, &mut s) };
        if ret != 0 {
            return Err(Error::dpdk(
                ErrorKind::PortQuery,
                self.step("get stats of"),
                ret,
            ));
        }
        Ok(Stats {
            ipackets: s.ipackets,
            opackets: s.opackets,
            ibytes: s.ibytes,
            obytes: s.obytes,
            imissed: s.imissed,
            ierrors: s.ierrors,
            oerrors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
        })
    }

    /// Resets basic counters.
    pub fn reset_stats(&self) -> Result<()> {
        // SAFETY: valid port.
        let ret = unsafe { ffi::rte_eth_stats_reset(self.shared.id) };
        if ret != 0 {
            return Err(Error::dpdk(
                ErrorKind::PortQuery,
                self.step("reset stats of"),
                ret,
            ));
        }
        Ok(())
    }

    /// Extended counters as `(name, value)`.
    pub fn xstats(&self) -> Result<Vec<(String, u64)>> {
        let step = self.step("get xstats of");
        // SAFETY: valid port; a null array with size 0 asks for the count.
        let n = unsafe { ffi::rte_eth_xstats_get_names(self.shared.id, std::ptr::null_mut(), 0) };
        if n < 0 {
            return Err(Error::dpdk(ErrorKind::PortQuery, step, n));
        }
        let mut names = vec![ffi::rte_eth_xstat_name::default(); n as usize];
        let mut vals = vec![ffi::rte_eth_xstat::default(); n as usize];
        // SAFETY: both arrays hold n entries.
        let got_names =
            unsafe { ffi::rte_eth_xstats_get_names(self.shared.id, names.as_mut_ptr(), n as u32) };
        // SAFETY: as above.
        let got_vals =
            unsafe { ffi::rte_eth_xstats_get(self.shared.id, vals.as_mut_ptr(), n as u32) };
        if got_names < 0 || got_vals < 0 || got_names > n || got_vals > n {
            return Err(Error::dpdk(
                ErrorKind::PortQuery,
                step,
                got_names.min(got_vals).min(-1),
            ));
        }
        let names: Vec<String> = names[..got_names as usize]
            .iter()
            .map(|x| {
                // SAFETY: DPDK NUL-terminates each name within its fixed array.
                unsafe { CStr::from_ptr(x.name.as_ptr()) }
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        Ok(vals[..got_vals as usize]
            .iter()
            .filter_map(|v| names.get(v.id as usize).map(|n| (n.clone(), v.value)))
            .collect())
    }

    /// The port's MAC address.
    pub fn mac(&self) -> Result<[u8; 6]> {
        let mut a = ffi::rte_ether_addr::default();
        // SAFETY: valid port; a is a valid out pointer.
        let ret = unsafe { ffi::rte_eth_macaddr_get(self.shared.id, &mut a) };
        if ret != 0 {
            return Err(Error::dpdk(
                ErrorKind::PortQuery,
                self.step("get MAC of"),
                ret,
            ));
        }
        Ok(a.addr_bytes)
    }

    /// Enables or disables promiscuous mode.
    pub fn set_promiscuous(&self, on: bool) -> Result<()> {
        // SAFETY: valid port.
        let ret = unsafe {
            if on {
                ffi::rte_eth_promiscuous_enable(self.shared.id)
            } else {
                ffi::rte_eth_promiscuous_disable(self.shared.id)
            }
        };
        if ret != 0 {
            return Err(Error::dpdk(
                ErrorKind::PortConfigure,
                self.step("set promiscuous mode of"),
                ret,
            ));
        }
        Ok(())
    }

    /// Whether promiscuous mode is on.
    pub fn promiscuous(&self) -> bool {
        // SAFETY: valid port.
        unsafe { ffi::rte_eth_promiscuous_get(self.shared.id) == 1 }
    }

    /// Current MTU.
    pub fn mtu(&self) -> Result<u16> {
        let mut m = 0u16;
        // SAFETY: valid port; m is a valid out pointer.
        let ret = unsafe { ffi::rte_eth_dev_get_mtu(self.shared.id, &mut m) };
        if ret != 0 {
            return Err(Error::dpdk(
                ErrorKind::PortQuery,
                self.step("get MTU of"),
                ret,
            ));
        }
        Ok(m)
    }

    /// Sets the MTU.
    pub fn set_mtu(&self, mtu: u16) -> Result<()> {
        // SAFETY: valid port.
        let ret = unsafe { ffi::rte_eth_dev_set_mtu(self.shared.id, mtu) };
        if ret != 0 {
            return Err(Error::dpdk(
                ErrorKind::PortConfigure,
                self.step(&format!("set MTU {mtu} on")),
                ret,
            ));
        }
        Ok(())
    }
}

/// Receive side of one queue. `Send`, not `Sync`: owned by one thread at a time.
pub struct RxQueue {
    shared: Arc<PortShared>,
    queue: u16,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

/// Transmit side of one queue. `Send`, not `Sync`: owned by one thread at a time.
pub struct TxQueue {
    shared: Arc<PortShared>,
    queue: u16,
    /// Packets per `rte_eth_tx_burst` call at most ([`TxQueue::limit_burst`]).
    max_burst: u16,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

fn release(shared: &PortShared, rx: bool, q: u16) {
    let list = if rx {
        &shared.rx_taken
    } else {
        &shared.tx_taken
    };
    if let Some(t) = list
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_mut(q as usize)
    {
        *t = false;
    }
    shared.queues_out.fetch_sub(1, Ordering::SeqCst);
}

impl Drop for RxQueue {
    fn drop(&mut self) {
        release(&self.shared, true, self.queue);
    }
}

impl Drop for TxQueue {
    fn drop(&mut self) {
        release(&self.shared, false, self.queue);
    }
}

impl RxQueue {
    /// Port id.
    pub fn port_id(&self) -> u16 {
        self.shared.id
    }

    /// Queue id.
    pub fn queue_id(&self) -> u16 {
        self.queue
    }

    /// Receives up to `max` packets and appends them to `out`. Returns how
    /// many arrived. Reuse `out` so the fast path does not allocate.
    pub fn rx_burst(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        let max = max.min(u16::MAX as usize);
        out.reserve(max);
        let spare = out.spare_capacity_mut();
        // SAFETY: spare has room for `max` pointers; Mbuf is a transparent
        // NonNull<rte_mbuf>; this queue is set up and owned by this handle.
        let n = unsafe { self.rx_burst_raw(spare.as_mut_ptr().cast(), max as u16) } as usize;
        // SAFETY: the PMD wrote n non-null mbufs, each one owned reference.
        unsafe { out.set_len(out.len() + n) };
        n
    }

    /// Raw `rte_eth_rx_burst` on this queue.
    ///
    /// # Safety
    /// `pkts` must be valid for writing `n` pointers; the caller takes
    /// ownership of the returned mbufs (free each exactly once).
    pub unsafe fn rx_burst_raw(&mut self, pkts: *mut *mut ffi::rte_mbuf, n: u16) -> u16 {
        // SAFETY: forwarded; &mut self makes this the queue's only user.
        unsafe { ffi::dpdk_sys_eth_rx_burst(self.shared.id, self.queue, pkts, n) }
    }
}

impl TxQueue {
    /// The [`TxQueue::limit_burst`] bound for a DPDK 22.11 memif zero-copy client.
    pub const MEMIF_ZERO_COPY_BURST: u16 = 4;

    /// Port id.
    pub fn port_id(&self) -> u16 {
        self.shared.id
    }

    /// Queue id.
    pub fn queue_id(&self) -> u16 {
        self.queue
    }

    /// Sends packets from the front of `pkts`; the sent ones are removed
    /// (the PMD owns and frees them), the rest stay in `pkts`, in order, for
    /// a retry or to be dropped. Returns how many were sent.
    pub fn tx_burst(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        let total = pkts.len().min(u16::MAX as usize);
        let mut sent = 0;
        while sent < total {
            let n = (total - sent).min(self.max_burst as usize) as u16;
            // SAFETY: elements sent..sent + n are owned mbufs laid out as rte_mbuf *.
            let took = unsafe { self.tx_burst_raw(pkts[sent..].as_mut_ptr().cast(), n) };
            // No more than it was given: memif's zero-copy transmit returns -1 (65535 as
            // u16) when its interrupt eventfd is missing, after placing what it could.
            // Taken as all n (those it did not place leak), never past `pkts`.
            let took = took.min(n);
            sent += took as usize;
            if took < n {
                break;
            }
        }
        // The PMD took ownership of the first `sent`: remove them without freeing.
        pkts.drain(..sent).for_each(std::mem::forget);
        sent
    }

    /// Hands [`TxQueue::tx_burst`]'s packets to the PMD at most `n` (≥ 1) per
    /// `rte_eth_tx_burst` call.
    ///
    /// For memif clients in zero-copy mode (DPDK 22.11.11, and unchanged upstream since):
    /// the PMD's transmit (`eth_memif_tx_zc`) places packets four at a time while more
    /// than four ring slots are free, and `memif_tx_one_zc` checks for a free slot
    /// before every segment of a packet but its first. With two-segment chains and six
    /// free slots the fourth packet's first segment overwrites the descriptor (and the
    /// stored mbuf) of a slot the server has not read yet: the server reads another
    /// frame's bytes, or zeros, and an mbuf is freed twice or never; a one-segment
    /// packet in that place even wraps the free count and overwrites the rest of the
    /// ring. With at most four packets per call the PMD only takes its
    /// one-at-a-time loop, which checks for a free slot before every packet, whatever
    /// the chains' lengths.
    pub fn limit_burst(&mut self, n: u16) {
        self.max_burst = n.max(1);
    }

    /// Raw `rte_eth_tx_burst` on this queue.
    ///
    /// # Safety
    /// `pkts` must hold `n` valid owned mbufs; ownership of the first
    /// `returned` ones passes to the PMD, the rest stay with the caller.
    pub unsafe fn tx_burst_raw(&mut self, pkts: *mut *mut ffi::rte_mbuf, n: u16) -> u16 {
        // SAFETY: forwarded; &mut self makes this the queue's only user.
        unsafe { ffi::dpdk_sys_eth_tx_burst(self.shared.id, self.queue, pkts, n) }
    }
}

/// Waits until a memif server listens on `socket` (the `socket=` devarg;
/// abstract by default, as in 22.11/23.11), so a memif client port can be
/// started without racing the server process. Reads /proc/net/unix.
pub fn wait_memif_listener(socket: &str, timeout: Duration) -> Result<()> {
    let end = Instant::now() + timeout;
    let abstract_name = format!("@{socket}");
    loop {
        let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
        // Columns: Num RefCount Protocol Flags Type St Inode Path; St 01 = listening.
        let listening = table.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 8 && f[5] == "01" && (f[7] == abstract_name || f[7] == socket)
        });
        if listening {
            return Ok(());
        }
        if Instant::now() >= end {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!("wait for memif server on {socket}"),
                format!("nothing listens on it after {timeout:?}"),
            )
            .with_fix("start the memif server (role=server) process with the same socket= first"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
