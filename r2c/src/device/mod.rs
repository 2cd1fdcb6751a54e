//! Devices: where frames come from and go to. The runtime polls a device in bursts.
//!
//! A device is owned by one core. Received frames are handed over as [`Zbuf`]s (zero copy
//! where the device allows: the buffer the NIC wrote); frames to send are
//! `luna_stack::stack::Transmit`s (header bytes + a zero-copy payload io-vector).
//!
//! No `unsafe` here: the DPDK and buffer unsafety lives in dpdk-sys and zbuf. The crate
//! denies `unsafe_code`; should a device ever need a block, it gets its own
//! `#[allow(unsafe_code)]` and a `// SAFETY:` comment at the block, not a module-wide allow.

pub mod dpdk;
pub mod mem;
pub mod steering;

pub use bifurcation::RssConfig;
use luna_stack::stack::Transmit;
use luna_stack::wire::{ChecksumCaps, EthernetAddress};
use std::collections::VecDeque;
use zbuf::Zbuf;

/// One change of the kernel's tables, mirrored by netlink-sync, for a core's stack
/// ([`Device::table_changes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableChange {
    /// The kernel has a usable entry for `ip` (new, or its MAC changed).
    NeighbourSet {
        /// The neighbour's address.
        ip: core::net::Ipv4Addr,
        /// Its hardware address.
        mac: EthernetAddress,
    },
    /// The kernel removed (aged out, failed, deleted) the entry of this address.
    NeighbourRemoved(core::net::Ipv4Addr),
    /// The first mirrored table replaces the stack's configured routes: remove them all
    /// (sent once, before the first route of the kernel's table).
    RoutesCleared,
    /// A route for a prefix the stack had no route for.
    RouteAdded(luna_stack::tables::Route),
    /// The route of a prefix changed (another gateway, source, on-link).
    RouteReplaced(luna_stack::tables::Route),
    /// The kernel removed the route of this prefix.
    RouteRemoved(luna_stack::wire::Ipv4Cidr),
    /// An address appeared on the interface.
    AddressAdded(netlink_sync::LocalAddress),
    /// An address disappeared from the interface.
    AddressRemoved(netlink_sync::LocalAddress),
    /// Every change of the kernel's tables up to this mirror version is in the list
    /// (the last change of a batch; the core publishes it as `exc_table_version`).
    Version(u64),
}

/// Counters every device keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Frames received.
    pub rx_frames: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Frames the device could not take (ring full) and that were dropped by the runtime.
    pub tx_dropped: u64,
    /// Frames lost on receive (ring overflow, no buffers), as far as the device knows.
    pub rx_missed: u64,
    /// Payload bytes copied on RX or TX (0 on a zero-copy device).
    pub copied_bytes: u64,
    /// Frames made ready for the ring (an mbuf chain built) and taken apart unsent: the
    /// queue changed under them (a frame the ring refuses waits built, so 0 normally).
    pub tx_unsent: u64,
}

/// A mempool's occupancy, for `lunactl`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolOccupancy {
    /// Pool name.
    pub name: String,
    /// Buffers in the pool.
    pub size: u64,
    /// Buffers allocated and not yet freed.
    pub in_use: u64,
}

/// What the control endpoint shows of one device queue ([`Device::observe`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceObservation {
    /// The port id ([`Device::port`]).
    pub port: u16,
    /// The queue.
    pub queue: u16,
    /// The device's counters ([`DeviceStats`]).
    pub stats: std::collections::BTreeMap<String, u64>,
    /// The port's extended statistics (DPDK xstats), reported by queue 0 only.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub xstats: std::collections::BTreeMap<String, u64>,
    /// Buffer pools the queue uses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolOccupancy>,
    /// The DPDK lcore id of the core thread polling the queue (its mempool caches are
    /// that lcore's); `None` on devices without one, or a DPDK core thread that could
    /// not be registered (every mbuf then goes through the pools' shared rings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lcore: Option<u32>,
}

impl DeviceStats {
    /// `(name, value)` pairs.
    pub fn fields(&self) -> [(&'static str, u64); 8] {
        [
            ("rx_frames", self.rx_frames),
            ("rx_bytes", self.rx_bytes),
            ("tx_frames", self.tx_frames),
            ("tx_bytes", self.tx_bytes),
            ("tx_dropped", self.tx_dropped),
            ("rx_missed", self.rx_missed),
            ("copied_bytes", self.copied_bytes),
            ("tx_unsent", self.tx_unsent),
        ]
    }
}

/// A frame source and sink owned by one core.
pub trait Device {
    /// Receive up to `max` frames, appending them to `out`; returns how many were added.
    fn rx_burst(&mut self, out: &mut Vec<Zbuf>, max: usize) -> usize;

    /// Send frames from the front of `frames`, removing the ones the device accepted;
    /// returns how many were accepted. Frames left in `frames` were not sent (ring full).
    /// Callers only append to `frames` or empty it between calls: a device may keep what
    /// it prepared for the frames it left (the DPDK device keeps their mbuf chains while
    /// the first frame is unchanged).
    fn tx_burst(&mut self, frames: &mut VecDeque<Transmit>) -> usize;

    /// The device's MAC address.
    fn mac(&self) -> EthernetAddress;

    /// Checksum offloads the device performs.
    fn caps(&self) -> ChecksumCaps {
        ChecksumCaps::software()
    }

    /// IP MTU of the link.
    fn mtu(&self) -> u16 {
        1500
    }

    /// Counters.
    fn stats(&self) -> DeviceStats;

    /// The device's RSS setup (key and redirection table), `None` when it does not spread
    /// flows over queues (memif, tap, a single queue). The port chooser uses it so that
    /// `connect()` picks ports whose replies land on the calling core's queue.
    fn rss(&self) -> Option<RssConfig> {
        None
    }

    /// The receive queue this device handle polls (0 on single-queue devices).
    fn queue(&self) -> u16 {
        0
    }

    /// The port this queue belongs to (the DPDK port id; 0 on devices without one). A
    /// capture of port N copies the frames of the cores that poll a queue of port N.
    fn port(&self) -> u16 {
        0
    }

    /// Counters, DPDK xstats and pool occupancy for the control endpoint; called on the
    /// core's thread, only when `lunactl` asks.
    fn observe(&self) -> DeviceObservation {
        DeviceObservation {
            port: self.port(),
            queue: self.queue(),
            stats: self
                .stats()
                .fields()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            ..DeviceObservation::default()
        }
    }

    /// The exception path's counters, when this device is an
    /// [`ExceptionDevice`](crate::exception::ExceptionDevice).
    fn exception(&self) -> Option<crate::exception::ExceptionStats> {
        None
    }

    /// The receive memory the stack of the core polling this queue may hold
    /// (`StackConfig::rcv_mem_total`, truesize bytes), when the device receives into a
    /// fixed pool that received payload, held zero copy, takes buffers from: `None` for
    /// devices without one (the stack's default then applies). The core sums it over its
    /// queues.
    fn rx_mem_budget(&self) -> Option<usize> {
        None
    }

    /// Changes of the kernel's mirrored tables (neighbours, routes, addresses) since the
    /// last call; the core applies them to its stack once per poll iteration. Nothing on
    /// devices without mirroring; with mirroring, one atomic load when nothing changed.
    fn table_changes(&mut self, _out: &mut Vec<TableChange>) {}

    /// Whether [`Device::table_changes`] can ever report anything (a device that mirrors
    /// the kernel's tables). Asked once when the core starts, so a core without mirroring
    /// pays nothing per poll iteration.
    fn mirrors_tables(&self) -> bool {
        false
    }

    /// How the port steers luna's traffic ([`steering::Steering`]), when the device was
    /// opened with a traffic model; `None` otherwise (luna owns the port).
    fn steering(&self) -> Option<steering::Steering> {
        None
    }

    /// Called once on the thread of the core that will poll the device, before its first
    /// iteration: binds to that thread what must not reach the application's threads (the
    /// DPDK device takes net_tap's receive signals, which would end the application's
    /// `epoll_wait` and `nanosleep` with `EINTR`). Nothing by default.
    fn on_core_thread(&mut self) {}

    /// Periodic upkeep on the core thread, at each stats publication (every
    /// `stats_interval` iterations): the DPDK device makes net_tap read what queued while
    /// its receive pool was empty ([`dpdk::TapKick`]). Nothing by default.
    fn maintain(&mut self) {}
}
