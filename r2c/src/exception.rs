//! The software exception path: luna and the kernel share one NIC port.
//!
//! [`ExceptionDevice`] wraps the main port `D` (the NIC) and the exception port `E` (a
//! DPDK port whose kernel netdev carries the NIC's MAC and IP: net_tap here) and is
//! itself a [`Device`], so every mode of the poll loop uses it unchanged. Per receive
//! burst, each frame from the main port goes through bifurcation's [`Classifier`]:
//!
//! * `Luna` — to the stack, the same buffer (no copy);
//! * `Kernel` — into a bounded queue towards the exception port (full: dropped and
//!   counted in `to_kernel_dropped`), written there whole. Without mirroring an ARP
//!   frame also goes to luna's stack (a reference to the same buffer, no copy), which
//!   learns its neighbours from it; with mirroring the kernel alone answers ARP;
//! * `Drop` (malformed) — freed and counted.
//!
//! Frames the kernel sends on the exception interface are received from `E` and go out
//! through the main port (bounded queue, `from_kernel_dropped` when full). Both
//! directions hand whole received buffers to the other port ([`RawPort::tx_raw`]); on
//! DPDK the received buffer is attached to the transmit mbuf, so r2c copies nothing. The
//! software PMDs (net_tap's `writev`, net_af_packet's ring) copy each frame once into the
//! kernel, as they do for every frame; a NIC would DMA it.
//!
//! A unicast frame for another MAC (net_af_packet also shows the port's own transmitted
//! frames) is neither luna's nor the kernel's and is counted in `not_for_us`.
//!
//! With mirroring ([`ExceptionDevice::with_mirror`]): the stack's own ARP requests are
//! not sent (`arp_suppressed`); the target is nudged instead (a kernel UDP datagram on the
//! exception interface makes the kernel resolve it), and the neighbours netlink-sync
//! mirrors from the exception interface are handed to the core's neighbour table
//! ([`Device::table_changes`]), removals included (entries the kernel aged out).
//! When the exception interface disappears ([`MirrorThread`] logs one line and ends with
//! `InterfaceGone`), the core keeps its last neighbours so luna's own traffic goes on,
//! sets `interface_gone`, and drops the kernel's frames, counted in `to_kernel_dropped`.

use crate::device::TableChange;
use crate::device::{Device, DeviceStats};
use bifurcation::{Classifier, KernelReason, TrafficModel, Verdict};
use core::net::Ipv4Addr;
use luna_stack::stack::Transmit;
use luna_stack::tables::Route;
use luna_stack::wire::{ChecksumCaps, EthernetAddress, Ipv4Cidr};
use std::collections::{HashMap, VecDeque};
use zbuf::Zbuf;

/// A device that can send received frames on as they are.
pub trait RawPort {
    /// Send whole frames from the front of `frames`, removing the ones the device took;
    /// returns how many. Frames left were not sent (ring full).
    fn tx_raw(&mut self, frames: &mut VecDeque<Zbuf>) -> usize;
}

/// Counters of the exception path (one per core).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExceptionStats {
    /// Frames classified as luna's.
    pub luna: u64,
    /// The kernel's frames written to the exception interface.
    pub to_kernel: u64,
    /// The kernel's frames dropped because the queue towards it was full.
    pub to_kernel_dropped: u64,
    /// Frames the kernel sent on the exception interface, out through the main port.
    pub from_kernel: u64,
    /// The kernel's frames dropped because the main port's queue was full.
    pub from_kernel_dropped: u64,
    /// Malformed frames dropped by the classifier.
    pub malformed_dropped: u64,
    /// Unicast frames for another MAC (not ours, not the kernel's).
    pub not_for_us: u64,
    /// ARP frames also given to luna's stack (mirroring off).
    pub arp_to_luna: u64,
    /// The stack's own ARP requests not sent (mirroring on: the kernel resolves).
    pub arp_suppressed: u64,
    /// Nudges that made the kernel resolve a next hop.
    pub nudges: u64,
    /// Neighbour entries handed to the stack from the mirror (added or changed).
    pub neighbours_added: u64,
    /// Neighbour entries removed because the kernel removed them.
    pub neighbours_removed: u64,
    /// 1 once the mirrored exception interface has disappeared.
    pub interface_gone: u64,
    /// The mirror version whose changes were last handed to the core (gauge).
    pub table_version: u64,
    /// Routes of the kernel handed to the stack for a new prefix.
    pub routes_added: u64,
    /// Routes of the kernel that replaced the stack's route of a prefix.
    pub routes_replaced: u64,
    /// Routes removed because the kernel removed them.
    pub routes_removed: u64,
    /// Addresses that appeared on the exception interface.
    pub addresses_added: u64,
    /// Addresses that disappeared from the exception interface.
    pub addresses_removed: u64,
    /// The syncer's full re-dumps (overrun, interrupted dump, link change), as of the
    /// last snapshot.
    pub sync_resyncs: u64,
    /// The syncer's netlink receive overruns (`ENOBUFS`), as of the last snapshot.
    pub sync_overruns: u64,
    /// Malformed netlink messages the syncer counted and skipped, as of the last snapshot.
    pub sync_malformed: u64,
}

/// What mirroring needs on a core.
pub struct Mirroring {
    /// This core's reader of the syncer's snapshots.
    pub reader: netlink_sync::Reader,
    /// Makes the kernel resolve a next hop (bound to the exception interface).
    pub nudger: Option<netlink_sync::Nudger>,
    applied: Applied,
    first: bool,
}

/// What a core's stack was last given from the mirror.
#[derive(Default)]
struct Applied {
    neighbours: HashMap<Ipv4Addr, EthernetAddress>,
    routes: HashMap<Ipv4Cidr, Route>,
    addresses: Vec<netlink_sync::LocalAddress>,
    routes_cleared: bool,
}

impl Mirroring {
    /// Mirroring from `reader`, nudging with `nudger`.
    pub fn new(reader: netlink_sync::Reader, nudger: Option<netlink_sync::Nudger>) -> Self {
        Mirroring {
            reader,
            nudger,
            applied: Applied::default(),
            first: true,
        }
    }
}

/// The control thread of mirroring: a netlink-sync [`Syncer`](netlink_sync::Syncer)
/// following the exception interface, and the publisher every core reads from.
pub struct MirrorThread {
    publisher: std::sync::Arc<netlink_sync::Publisher>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    join: Option<std::thread::JoinHandle<Result<(), netlink_sync::Error>>>,
    iface: String,
    trace: netlink_sync::TraceHandle,
}

impl MirrorThread {
    /// Dumps the kernel's tables of `iface` (in the calling thread's namespace) and
    /// follows them on a thread of its own. A missing interface is
    /// `Error::NoSuchInterface`.
    pub fn start(iface: &str) -> Result<MirrorThread, netlink_sync::Error> {
        Self::start_with(iface, &netlink_sync::SyncConfig::default())
    }

    /// [`MirrorThread::start`] with the syncer's settings (e.g. a small `SO_RCVBUF`).
    pub fn start_with(
        iface: &str,
        config: &netlink_sync::SyncConfig,
    ) -> Result<MirrorThread, netlink_sync::Error> {
        let syncer =
            netlink_sync::Syncer::open(netlink_sync::Interface::Name(iface.to_string()), config)?;
        let publisher = syncer.publisher();
        let trace = syncer.trace();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let st = stop.clone();
        let name = iface.to_string();
        let join = std::thread::Builder::new()
            .name("r2c-netlink".into())
            .spawn(move || {
                let r = syncer.run(&st);
                if let Err(e) = &r {
                    // The exception path's control plane is gone: say so once, clearly.
                    eprintln!(
                        "r2c: netlink mirror of exception interface {name} stopped: {e}; luna keeps its last neighbours and routes, the kernel's frames are dropped and counted"
                    );
                }
                r
            })
            .map_err(|source| netlink_sync::Error::Socket {
                what: "spawning the netlink thread",
                source,
            })?;
        Ok(MirrorThread {
            publisher,
            stop,
            join: Some(join),
            iface: iface.to_string(),
            trace,
        })
    }

    /// Mirroring for one core: a reader of this thread's snapshots and a nudger bound
    /// to the exception interface.
    pub fn for_core(&self) -> std::io::Result<Mirroring> {
        Ok(Mirroring::new(
            self.publisher.reader(),
            Some(netlink_sync::Nudger::new(Some(&self.iface))?),
        ))
    }

    /// A reader of the published snapshots (to watch the mirror itself, e.g. which
    /// version first holds a change).
    pub fn reader(&self) -> netlink_sync::Reader {
        self.publisher.reader()
    }

    /// What the syncer saw so far (socket calls, datagrams by kind, the dump in flight,
    /// live counters, last events), as of its last poll: for failure messages.
    pub fn trace(&self) -> netlink_sync::SyncTrace {
        self.trace.get()
    }

    /// Whether the thread has ended (the interface disappeared, or an error).
    pub fn is_finished(&self) -> bool {
        self.join.as_ref().is_none_or(|j| j.is_finished())
    }

    /// Stops the thread; returns how it ended (`Err(InterfaceGone)` if the exception
    /// interface disappeared).
    pub fn stop(mut self) -> Result<(), netlink_sync::Error> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        match self.join.take() {
            Some(j) => j.join().unwrap_or_else(|_| {
                Err(netlink_sync::Error::Socket {
                    what: "netlink thread",
                    source: std::io::Error::other("panicked"),
                })
            }),
            None => Ok(()),
        }
    }
}

impl Drop for MirrorThread {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

/// The main port with the exception path in front of the stack (see the module docs).
pub struct ExceptionDevice<D, E> {
    main: D,
    exc: E,
    classifier: Classifier,
    mac: EthernetAddress,
    limit: usize,
    burst: Vec<Zbuf>,
    to_kernel: VecDeque<Zbuf>,
    from_kernel: VecDeque<Zbuf>,
    mirror: Option<Mirroring>,
    stats: ExceptionStats,
}

const ETHERTYPE_ARP: [u8; 2] = [0x08, 0x06];

impl<D: Device + RawPort, E: Device + RawPort> ExceptionDevice<D, E> {
    /// `main` classified by `model`, the kernel's frames to and from `exc`; each
    /// direction queues at most `limit` frames.
    pub fn new(main: D, exc: E, model: TrafficModel, limit: usize) -> Self {
        let mac = main.mac();
        ExceptionDevice {
            main,
            exc,
            classifier: Classifier::new(model),
            mac,
            limit: limit.max(1),
            burst: Vec::with_capacity(64),
            to_kernel: VecDeque::new(),
            from_kernel: VecDeque::new(),
            mirror: None,
            stats: ExceptionStats::default(),
        }
    }

    /// Mirror the kernel's neighbours (see the module docs). The stack must be configured
    /// with `answer_arp = false`.
    pub fn with_mirror(mut self, m: Mirroring) -> Self {
        self.mirror = Some(m);
        self
    }

    /// The exception path's counters.
    pub fn exception_stats(&self) -> ExceptionStats {
        self.stats
    }

    /// The classifier's counters by reason (`luna.client`, `kernel.arp`, ...).
    pub fn classifier_counters(&self) -> &bifurcation::Counters {
        self.classifier.counters()
    }

    /// The main port.
    pub fn main(&self) -> &D {
        &self.main
    }

    /// The exception port.
    pub fn exception_port(&self) -> &E {
        &self.exc
    }

    fn is_for_us(&self, frame: &[u8]) -> bool {
        match frame.get(..6) {
            Some(dst) => dst[0] & 1 == 1 || dst == self.mac.0,
            None => true, // the classifier drops runts
        }
    }

    fn flush(&mut self) {
        if !self.to_kernel.is_empty() {
            let n = self.exc.tx_raw(&mut self.to_kernel);
            self.stats.to_kernel += n as u64;
        }
        if !self.from_kernel.is_empty() {
            let n = self.main.tx_raw(&mut self.from_kernel);
            self.stats.from_kernel += n as u64;
        }
    }

    fn poll_kernel(&mut self) {
        let room = self.limit.saturating_sub(self.from_kernel.len());
        // Read at least one burst so a full queue still drains the exception ring
        // (the excess is counted, never left to the PMD to lose silently).
        let want = room.clamp(1, 64);
        self.burst.clear();
        self.exc.rx_burst(&mut self.burst, want);
        for f in self.burst.drain(..) {
            if self.from_kernel.len() >= self.limit {
                self.stats.from_kernel_dropped += 1;
            } else {
                self.from_kernel.push_back(f);
            }
        }
    }
}

impl<D: Device + RawPort, E: Device + RawPort> Device for ExceptionDevice<D, E> {
    fn on_core_thread(&mut self) {
        self.main.on_core_thread();
        self.exc.on_core_thread();
    }

    fn rx_burst(&mut self, out: &mut Vec<Zbuf>, max: usize) -> usize {
        self.burst.clear();
        self.main.rx_burst(&mut self.burst, max);
        let mut n = 0;
        let mut frames = std::mem::take(&mut self.burst);
        for f in frames.drain(..) {
            match self.classifier.classify(&f) {
                Verdict::Luna(_) => {
                    self.stats.luna += 1;
                    out.push(f);
                    n += 1;
                }
                Verdict::Kernel(reason) => {
                    if !self.is_for_us(&f) {
                        self.stats.not_for_us += 1;
                        continue;
                    }
                    if reason == KernelReason::Arp && self.mirror.is_none() && n < max {
                        self.stats.arp_to_luna += 1;
                        out.push(f.clone());
                        n += 1;
                    }
                    if self.to_kernel.len() >= self.limit || self.stats.interface_gone == 1 {
                        // Full, or the mirror saw the exception interface deleted: no
                        // kernel to hand it to.
                        self.stats.to_kernel_dropped += 1;
                    } else {
                        self.to_kernel.push_back(f);
                    }
                }
                Verdict::Drop(_) => self.stats.malformed_dropped += 1,
            }
        }
        self.burst = frames;
        self.flush();
        self.poll_kernel();
        self.flush();
        n
    }

    fn tx_burst(&mut self, frames: &mut VecDeque<Transmit>) -> usize {
        if let Some(m) = &self.mirror {
            let before = frames.len();
            let mut suppressed = 0;
            let mut nudges = 0;
            frames.retain(|t| {
                let h = t.header();
                if h.get(12..14) != Some(&ETHERTYPE_ARP[..]) {
                    return true;
                }
                suppressed += 1;
                // ARP for IPv4 over Ethernet: target protocol address at 14 + 24.
                if let (Some(n), Some(ip)) = (&m.nudger, h.get(38..42)) {
                    let ip = Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]);
                    if n.nudge(ip).is_ok() {
                        nudges += 1;
                    }
                }
                false
            });
            self.stats.arp_suppressed += suppressed;
            self.stats.nudges += nudges;
            let removed = before - frames.len();
            return self.main.tx_burst(frames) + removed;
        }
        self.main.tx_burst(frames)
    }

    fn mac(&self) -> EthernetAddress {
        self.mac
    }

    fn caps(&self) -> ChecksumCaps {
        self.main.caps()
    }

    fn mtu(&self) -> u16 {
        self.main.mtu()
    }

    fn rx_mem_budget(&self) -> Option<usize> {
        // The exception queue's frames go to the kernel, not to the stack's connections.
        self.main.rx_mem_budget()
    }

    fn stats(&self) -> DeviceStats {
        let mut s = self.main.stats();
        let e = self.exc.stats();
        s.copied_bytes += e.copied_bytes;
        s.rx_missed += e.rx_missed;
        s
    }

    fn rss(&self) -> Option<bifurcation::RssConfig> {
        self.main.rss()
    }

    fn queue(&self) -> u16 {
        self.main.queue()
    }

    fn port(&self) -> u16 {
        self.main.port()
    }

    fn observe(&self) -> crate::device::DeviceObservation {
        self.main.observe()
    }

    fn exception(&self) -> Option<ExceptionStats> {
        Some(self.stats)
    }

    fn mirrors_tables(&self) -> bool {
        self.mirror.is_some()
    }

    fn steering(&self) -> Option<crate::device::steering::Steering> {
        self.main.steering()
    }

    fn table_changes(&mut self, out: &mut Vec<TableChange>) {
        let Some(m) = &mut self.mirror else {
            return;
        };
        if !m.reader.refresh() && !m.first {
            return;
        }
        m.first = false;
        let snap = m.reader.snapshot();
        let c = snap.counters();
        self.stats.sync_resyncs = c.resyncs;
        self.stats.sync_overruns = c.overruns;
        self.stats.sync_malformed = c.malformed;
        if snap.interface_gone() {
            // The kernel's tables are gone with the interface: keep the last neighbours
            // and routes (luna's own traffic goes on) and say so in the counters.
            self.stats.interface_gone = 1;
        } else {
            let from = out.len();
            diff_tables(&mut m.applied, snap, out, &mut self.stats);
            // The core gives the stack these addresses (its listeners accept on them,
            // connections may use them): luna's ports on them are luna's.
            let model = self.classifier.model_mut();
            for c in &out[from..] {
                match c {
                    TableChange::AddressAdded(a) => {
                        model.add_address(a.address);
                    }
                    TableChange::AddressRemoved(a) => {
                        model.remove_address(a.address);
                    }
                    _ => {}
                }
            }
        }
        self.stats.table_version = snap.version();
        out.push(TableChange::Version(snap.version()));
    }
}

/// The changes from what `m` last handed to the core to `snap`; `m` then holds `snap`'s
/// tables.
fn diff_tables(
    m: &mut Applied,
    snap: &netlink_sync::Snapshot,
    out: &mut Vec<TableChange>,
    stats: &mut ExceptionStats,
) {
    let mut now: HashMap<Ipv4Addr, EthernetAddress> = HashMap::new();
    for (ip, n) in snap.neighbours() {
        now.insert(*ip, n.mac);
    }
    for (ip, mac) in &now {
        if m.neighbours.get(ip) != Some(mac) {
            out.push(TableChange::NeighbourSet { ip: *ip, mac: *mac });
            stats.neighbours_added += 1;
        }
    }
    for ip in m.neighbours.keys() {
        if !now.contains_key(ip) {
            out.push(TableChange::NeighbourRemoved(*ip));
            stats.neighbours_removed += 1;
        }
    }
    m.neighbours = now;

    // Routes: the kernel's table replaces the stack's configured one from the first
    // snapshot that has a route (before the dump, or with the link down, it has none:
    // the configured routes stay until the kernel has some).
    if !m.routes_cleared && snap.routes().is_empty() {
        return diff_addresses(m, snap, out, stats);
    }
    if !m.routes_cleared {
        m.routes_cleared = true;
        out.push(TableChange::RoutesCleared);
    }
    let mut routes: HashMap<Ipv4Cidr, Route> = HashMap::with_capacity(snap.routes().len());
    for r in snap.routes().iter() {
        routes.insert(r.destination, *r);
        match m.routes.get(&r.destination) {
            None => {
                out.push(TableChange::RouteAdded(*r));
                stats.routes_added += 1;
            }
            Some(old) if old != r => {
                out.push(TableChange::RouteReplaced(*r));
                stats.routes_replaced += 1;
            }
            Some(_) => {}
        }
    }
    for dst in m.routes.keys() {
        if !routes.contains_key(dst) {
            out.push(TableChange::RouteRemoved(*dst));
            stats.routes_removed += 1;
        }
    }
    m.routes = routes;
    diff_addresses(m, snap, out, stats);
}

fn diff_addresses(
    m: &mut Applied,
    snap: &netlink_sync::Snapshot,
    out: &mut Vec<TableChange>,
    stats: &mut ExceptionStats,
) {
    let now = snap.addresses();
    for a in now {
        if !m.addresses.contains(a) {
            out.push(TableChange::AddressAdded(*a));
            stats.addresses_added += 1;
        }
    }
    for a in &m.addresses {
        if !now.contains(a) {
            out.push(TableChange::AddressRemoved(*a));
            stats.addresses_removed += 1;
        }
    }
    m.addresses = now.to_vec();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::mem::MemPair;
    use bifurcation::{KernelPorts, TrafficConfig};

    fn model() -> TrafficModel {
        model_with_ip(None)
    }

    /// One app, one thread, a listener on 7700, and `ip` as the model's address.
    fn model_with_ip(ip: Option<Ipv4Addr>) -> TrafficModel {
        let c = TrafficConfig {
            listen_tcp: vec![7700],
            ip,
            apps: vec![bifurcation::model::AppConfig {
                name: "t".into(),
                ports: Default::default(),
                threads: Some(1),
                queues: None,
            }],
            ..TrafficConfig::default()
        };
        c.validate(&KernelPorts::parse("32768 60999", "").unwrap())
            .unwrap()
    }

    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];

    fn eth(dst: [u8; 6], ethertype: u16, body: &[u8]) -> Vec<u8> {
        let mut f = dst.to_vec();
        f.extend_from_slice(&[2, 0, 0, 0, 0, 9]);
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(body);
        f
    }

    fn tcp_to(port: u16) -> Vec<u8> {
        tcp_to_addr([198, 18, 4, 2], port)
    }

    fn tcp_to_addr(dst: [u8; 4], port: u16) -> Vec<u8> {
        let mut ip = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0];
        ip.extend_from_slice(&[198, 18, 4, 1]);
        ip.extend_from_slice(&dst);
        let mut tcp = vec![0u8; 20];
        tcp[0..2].copy_from_slice(&1234u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&port.to_be_bytes());
        tcp[12] = 5 << 4;
        ip.extend_from_slice(&tcp);
        eth(MAC, 0x0800, &ip)
    }

    /// (wire side of main, wire side of exception, the device).
    fn rig(
        limit: usize,
    ) -> (
        crate::device::mem::MemDevice,
        crate::device::mem::MemDevice,
        ExceptionDevice<crate::device::mem::MemDevice, crate::device::mem::MemDevice>,
    ) {
        rig_with(limit, model())
    }

    fn rig_with(
        limit: usize,
        model: TrafficModel,
    ) -> (
        crate::device::mem::MemDevice,
        crate::device::mem::MemDevice,
        ExceptionDevice<crate::device::mem::MemDevice, crate::device::mem::MemDevice>,
    ) {
        let cfg = crate::device::mem::MemConfig {
            mac_a: EthernetAddress(MAC),
            ..Default::default()
        };
        let (mut a, mut wire) = MemPair::build(&cfg).unwrap();
        let (mut k, mut kernel) = MemPair::build(&cfg).unwrap();
        let dev = ExceptionDevice::new(a.remove(0), kernel.remove(0), model, limit);
        (wire.remove(0), k.remove(0), dev)
    }

    fn drain(d: &mut impl Device) -> Vec<Zbuf> {
        let mut v = Vec::new();
        d.rx_burst(&mut v, 64);
        v
    }

    #[test]
    fn luna_frames_reach_the_stack_and_the_kernels_go_to_the_exception_port() {
        let (wire, mut kernel, mut dev) = rig(16);
        assert!(wire.inject(Zbuf::from_vec(tcp_to(7700)))); // luna's listener
        assert!(wire.inject(Zbuf::from_vec(tcp_to(22)))); // ssh: the kernel's
        assert!(wire.inject(Zbuf::from_vec(eth([0xff; 6], 0x0806, &[0; 28])))); // ARP
        assert!(wire.inject(Zbuf::from_vec(tcp_to(22)[..20].to_vec()))); // cut short
        let mut other = tcp_to(22);
        other[5] = 0x77; // unicast to another MAC
        assert!(wire.inject(Zbuf::from_vec(other)));
        let got = drain(&mut dev);
        // The listener's frame, and the ARP frame (mirroring off: luna learns from it too).
        assert_eq!(got.len(), 2);
        assert_eq!(&got[0][..], &tcp_to(7700)[..]);
        let to_k = drain(&mut kernel);
        assert_eq!(to_k.len(), 2, "ssh and ARP to the kernel");
        assert_eq!(&to_k[0][..], &tcp_to(22)[..]);
        let s = dev.exception_stats();
        assert_eq!(
            (
                s.luna,
                s.to_kernel,
                s.malformed_dropped,
                s.not_for_us,
                s.arp_to_luna
            ),
            (1, 2, 1, 1, 1)
        );
        // The kernel's reply goes out through the main port, byte for byte.
        let reply = eth([2, 0, 0, 0, 0, 9], 0x0800, &[0x45; 40]);
        assert!(kernel.inject(Zbuf::from_vec(reply.clone())));
        let mut w = wire;
        assert!(drain(&mut dev).is_empty());
        let out = drain(&mut w);
        assert_eq!(out.len(), 1);
        assert_eq!(&out[0][..], &reply[..]);
        assert_eq!(dev.exception_stats().from_kernel, 1);
    }

    /// An ICMP error (fragmentation needed, type 3 code 4, next-hop MTU 1400) from a
    /// router, quoting a TCP segment this host sent from `sport` to 198.18.4.1:80.
    fn frag_needed_quoting(sport: u16) -> Vec<u8> {
        let mut quote = vec![0x45, 0, 0x05, 0xdc, 0, 0, 0x40, 0, 64, 6, 0, 0];
        quote.extend_from_slice(&[198, 18, 4, 2, 198, 18, 4, 1]);
        quote.extend_from_slice(&sport.to_be_bytes());
        quote.extend_from_slice(&80u16.to_be_bytes());
        quote.extend_from_slice(&[0; 4]);
        let mut icmp = vec![3, 4, 0, 0, 0, 0, 0x05, 0x78];
        icmp.extend_from_slice(&quote);
        let total = (20 + icmp.len()) as u16;
        let mut ip = vec![0x45, 0];
        ip.extend_from_slice(&total.to_be_bytes());
        ip.extend_from_slice(&[0, 0, 0, 0, 64, 1, 0, 0]);
        ip.extend_from_slice(&[198, 18, 4, 254, 198, 18, 4, 2]);
        ip.extend_from_slice(&icmp);
        eth(MAC, 0x0800, &ip)
    }

    /// PMTU discovery and hard errors of luna's connections need their ICMP errors: one
    /// quoting luna's client port goes to the stack (and not to the kernel, which has no
    /// socket for it); one quoting the kernel's ssh goes to the kernel.
    #[test]
    fn icmp_errors_about_lunas_flows_reach_the_stack() {
        let (wire, mut kernel, mut dev) = rig(16);
        assert!(wire.inject(Zbuf::from_vec(frag_needed_quoting(61440))));
        assert!(wire.inject(Zbuf::from_vec(frag_needed_quoting(22))));
        let got = drain(&mut dev);
        assert_eq!(got.len(), 1, "luna's ICMP error to the stack");
        assert_eq!(&got[0][..], &frag_needed_quoting(61440)[..]);
        let to_k = drain(&mut kernel);
        assert_eq!(to_k.len(), 1, "only the kernel's ICMP error to the kernel");
        assert_eq!(&to_k[0][..], &frag_needed_quoting(22)[..]);
        let s = dev.exception_stats();
        assert_eq!((s.luna, s.to_kernel), (1, 1));
        assert_eq!(dev.classifier_counters().luna_icmp_errors, 1);
    }

    /// With an `ip` in the model, an address the kernel adds to the exception interface
    /// goes into the stack's set (core.rs, `AddressAdded`: the stack then takes TCP for it
    /// and its listeners accept on it), so luna's ports on it are luna's too; once the
    /// kernel removes it (the stack aborts its connections), they are the kernel's again.
    #[test]
    fn luna_ports_on_a_mirrored_address_follow_the_stacks_address_set() {
        use netlink_packet_route::RouteNetlinkMessage as M;
        use netlink_sync::mirror::craft::{address, emit};
        let model = model_with_ip(Some(Ipv4Addr::new(198, 18, 4, 2)));
        let (wire, mut kernel, dev) = rig_with(16, model);
        let publisher = netlink_sync::Publisher::new(netlink_sync::Snapshot::empty(5));
        let mut dev = dev.with_mirror(Mirroring::new(publisher.reader(), None));
        let mut mirror = netlink_sync::Mirror::new(5);
        let extra = Ipv4Addr::new(198, 18, 4, 7);
        let mut changes = Vec::new();
        dev.table_changes(&mut changes);
        // Before: the address is not luna's.
        assert!(wire.inject(Zbuf::from_vec(tcp_to_addr(extra.octets(), 7700))));
        assert!(drain(&mut dev).is_empty());
        assert_eq!(drain(&mut kernel).len(), 1);
        mirror.apply_datagram(&emit(M::NewAddress(address(5, extra, 24)), 0, 0));
        publisher.publish(mirror.snapshot(1));
        changes.clear();
        dev.table_changes(&mut changes);
        assert!(changes
            .iter()
            .any(|c| matches!(c, TableChange::AddressAdded(_))));
        for port in [7700, 61440] {
            assert!(wire.inject(Zbuf::from_vec(tcp_to_addr(extra.octets(), port))));
        }
        assert!(wire.inject(Zbuf::from_vec(tcp_to_addr(extra.octets(), 22))));
        assert_eq!(
            drain(&mut dev).len(),
            2,
            "luna's listener and client port on the added address go to the stack"
        );
        assert_eq!(drain(&mut kernel).len(), 1, "ssh on it stays the kernel's");
        mirror.apply_datagram(&emit(M::DelAddress(address(5, extra, 24)), 0, 0));
        publisher.publish(mirror.snapshot(2));
        dev.table_changes(&mut changes);
        assert!(wire.inject(Zbuf::from_vec(tcp_to_addr(extra.octets(), 7700))));
        assert!(drain(&mut dev).is_empty());
        assert_eq!(drain(&mut kernel).len(), 1);
        // The primary stays luna's throughout.
        assert!(wire.inject(Zbuf::from_vec(tcp_to(7700))));
        assert_eq!(drain(&mut dev).len(), 1);
    }

    #[test]
    fn a_full_exception_queue_drops_and_counts() {
        // The kernel side never reads and its ring holds 4: the bounded queue (2) fills.
        let cfg = crate::device::mem::MemConfig {
            mac_a: EthernetAddress(MAC),
            ring_size: 4,
            ..Default::default()
        };
        let (mut a, mut wire) = MemPair::build(&cfg).unwrap();
        let (mut k, mut _kernel) = MemPair::build(&cfg).unwrap();
        let mut dev = ExceptionDevice::new(a.remove(0), k.remove(0), model(), 2);
        let wire = wire.remove(0);
        let mut sent = 0;
        for _ in 0..3 {
            for _ in 0..4 {
                if wire.inject(Zbuf::from_vec(tcp_to(22))) {
                    sent += 1;
                }
            }
            drain(&mut dev);
        }
        let s = dev.exception_stats();
        assert_eq!(s.to_kernel, 4, "the kernel's ring took 4");
        assert!(s.to_kernel_dropped > 0, "{s:?}");
        assert_eq!(
            s.to_kernel + s.to_kernel_dropped + dev.to_kernel.len() as u64,
            sent,
            "every frame is delivered, dropped and counted, or still queued: {s:?}"
        );
    }

    #[test]
    fn with_mirroring_the_stacks_arp_requests_are_not_sent() {
        use luna_stack::stack::{Stack, StackConfig};
        use luna_stack::time::Instant;
        use luna_stack::wire::Ipv4Cidr;
        let (mut wire, mut kernel, dev) = rig(16);
        let publisher = netlink_sync::Publisher::new(netlink_sync::Snapshot::empty(1));
        let mut dev = dev.with_mirror(Mirroring::new(publisher.reader(), None));
        // A stack that must resolve 198.18.4.1 emits an ARP request (and parks its SYN).
        let mut sc = StackConfig::new(
            EthernetAddress(MAC),
            Ipv4Cidr::new(Ipv4Addr::new(198, 18, 4, 2), 24).unwrap(),
        );
        sc.answer_arp = false;
        let mut stack = Stack::new(sc, crate::rng::CoreRng::from_seed([7; 32])).unwrap();
        let remote = core::net::SocketAddrV4::new(Ipv4Addr::new(198, 18, 4, 1), 7);
        stack.connect(Instant::ZERO, remote, Some(61440)).unwrap();
        let mut q: VecDeque<Transmit> =
            std::iter::from_fn(|| stack.poll_transmit(Instant::ZERO)).collect();
        assert!(
            q.iter()
                .any(|t| t.header().get(12..14) == Some(&ETHERTYPE_ARP[..])),
            "the stack asked for resolution"
        );
        let n = q.len();
        assert_eq!(dev.tx_burst(&mut q), n);
        assert!(q.is_empty());
        assert!(drain(&mut wire).is_empty(), "no ARP request on the wire");
        assert_eq!(dev.exception_stats().arp_suppressed, 1);
        // The (empty) first snapshot yields no table changes, only its version; an ARP
        // frame from the wire goes to the kernel only.
        let mut changes = Vec::new();
        dev.table_changes(&mut changes);
        assert_eq!(changes, vec![TableChange::Version(0)]);
        assert!(wire.inject(Zbuf::from_vec(eth([0xff; 6], 0x0806, &[0; 28]))));
        assert!(drain(&mut dev).is_empty(), "luna does not see ARP");
        assert_eq!(drain(&mut kernel).len(), 1);
        assert_eq!(dev.exception_stats().arp_to_luna, 0);
    }

    #[test]
    fn mirrored_routes_neighbours_and_addresses_become_typed_changes() {
        use luna_stack::tables::NextHop;
        use netlink_packet_route::neighbour::NeighbourState as K;
        use netlink_packet_route::RouteNetlinkMessage as M;
        use netlink_sync::mirror::craft::{address, emit, neighbour, route};
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        let (_wire, _kernel, dev) = rig(16);
        let publisher = netlink_sync::Publisher::new(netlink_sync::Snapshot::empty(5));
        let mut dev = dev.with_mirror(Mirroring::new(publisher.reader(), None));
        let mut mirror = netlink_sync::Mirror::new(5);
        let mut apply = |m: M| mirror.apply_datagram(&emit(m, 0, 0));
        let gw_mac = [2, 0, 0, 0, 0, 0x33];
        apply(M::NewAddress(address(5, ip("198.18.4.2"), 24)));
        apply(M::NewRoute(route(5, ip("198.18.4.0"), 24, None, 0)));
        apply(M::NewRoute(route(
            5,
            ip("0.0.0.0"),
            0,
            Some(ip("198.18.4.1")),
            0,
        )));
        apply(M::NewNeighbour(neighbour(
            5,
            ip("198.18.4.1"),
            Some(gw_mac),
            K::Reachable,
        )));
        publisher.publish(mirror.snapshot(1));
        let mut changes = Vec::new();
        dev.table_changes(&mut changes);
        // The configured routes are cleared before the kernel's are added; the version last.
        let cleared = changes
            .iter()
            .position(|c| *c == TableChange::RoutesCleared);
        let first_route = changes
            .iter()
            .position(|c| matches!(c, TableChange::RouteAdded(_)));
        assert!(cleared.is_some() && cleared < first_route, "{changes:?}");
        assert_eq!(changes.last(), Some(&TableChange::Version(1)));
        let added: Vec<(Ipv4Cidr, NextHop)> = changes
            .iter()
            .filter_map(|c| match c {
                TableChange::RouteAdded(r) => Some((r.destination, r.next_hop)),
                _ => None,
            })
            .collect();
        assert_eq!(added.len(), 2, "{changes:?}");
        assert!(added.contains(&(
            "0.0.0.0/0".parse().unwrap(),
            NextHop::Gateway(ip("198.18.4.1"))
        )));
        assert!(added.contains(&("198.18.4.0/24".parse().unwrap(), NextHop::Direct)));
        assert!(changes.contains(&TableChange::NeighbourSet {
            ip: ip("198.18.4.1"),
            mac: EthernetAddress(gw_mac),
        }));
        assert!(
            changes.contains(&TableChange::AddressAdded(netlink_sync::LocalAddress {
                address: ip("198.18.4.2"),
                prefix_len: 24,
            }))
        );
        assert_eq!(changes.len(), 6, "{changes:?}");

        // Nothing new: nothing at all (one atomic load).
        changes.clear();
        dev.table_changes(&mut changes);
        assert!(changes.is_empty());

        // The default route moves to a fresh gateway, the old one's entry and the
        // address go away.
        let mut apply = |m: M| mirror.apply_datagram(&emit(m, 0, 0));
        apply(M::DelRoute(route(
            5,
            ip("0.0.0.0"),
            0,
            Some(ip("198.18.4.1")),
            0,
        )));
        apply(M::NewRoute(route(
            5,
            ip("0.0.0.0"),
            0,
            Some(ip("198.18.4.3")),
            0,
        )));
        apply(M::DelNeighbour(neighbour(
            5,
            ip("198.18.4.1"),
            None,
            K::Reachable,
        )));
        apply(M::DelRoute(route(5, ip("198.18.4.0"), 24, None, 0)));
        apply(M::DelAddress(address(5, ip("198.18.4.2"), 24)));
        publisher.publish(mirror.snapshot(2));
        dev.table_changes(&mut changes);
        let replaced = changes.iter().find_map(|c| match c {
            TableChange::RouteReplaced(r) => Some(r.next_hop),
            _ => None,
        });
        assert_eq!(replaced, Some(NextHop::Gateway(ip("198.18.4.3"))));
        assert!(changes.contains(&TableChange::RouteRemoved("198.18.4.0/24".parse().unwrap())));
        assert!(changes.contains(&TableChange::NeighbourRemoved(ip("198.18.4.1"))));
        assert!(changes
            .iter()
            .any(|c| matches!(c, TableChange::AddressRemoved(_))));
        assert_eq!(changes.last(), Some(&TableChange::Version(2)));
        assert!(!changes.contains(&TableChange::RoutesCleared), "only once");
        assert_eq!(changes.len(), 5, "{changes:?}");
        let s = dev.exception_stats();
        assert_eq!(
            (
                s.routes_added,
                s.routes_replaced,
                s.routes_removed,
                s.addresses_added,
                s.addresses_removed,
                s.neighbours_added,
                s.neighbours_removed,
                s.table_version
            ),
            (2, 1, 1, 1, 1, 1, 1, 2)
        );
    }
}
