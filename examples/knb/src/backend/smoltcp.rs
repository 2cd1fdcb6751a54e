//! smoltcp 0.14 on DPDK: two DPDK processes over the testbed's memif link.
//!
//! [`DpdkPhy`] is a smoltcp `phy::Device` over one dpdk-sys rx/tx queue pair: received
//! mbufs are handed to smoltcp in place (copied only if chained), transmitted frames are
//! built in fresh mbufs and sent in bursts. Each thread ("lane") owns one queue pair and
//! its own smoltcp `Interface` with the same address: memif pairs queue *i* of the
//! client with queue *i* of the server, so the connections of client thread *i* stay on
//! server lane *i*. memif is a virtual link (shared memory, no corruption): like the
//! kernel on veth and luna on memif, smoltcp neither computes nor verifies checksums
//! there (`ChecksumCapabilities::ignored`); `KNB_SOFTWARE_CHECKSUMS=1` computes them in
//! software on every stack instead.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dpdk_sys::{Mbuf, Mempool, RxQueue, TxQueue};
use serde_json::json;
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{Device, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};
use testbed::{Kind, Topology};

use r2c::device::dpdk::{memif_peer_quiet, memif_quiesce};

use super::memif;
use super::{Backend, ClientPlan, ClientSpec, Endpoints, ServerReport, ServerSpec};
use crate::engine::ThreadResult;
use crate::proto::ServerConn;
use crate::workload::{Stack, Workload};

/// The smoltcp backend.
pub struct Smoltcp;

/// Frames buffered for transmit before the device refuses more (ring full).
const TX_BATCH: usize = 32;
const TX_LIMIT: usize = 256;
/// Stop reading a connection while this many response bytes wait.
const SERVER_TX_LIMIT: usize = 4 << 20;
/// First local port of the client's connections.
const CLIENT_PORT_BASE: u16 = 49152;
/// How long a side waits for its memif peer to stop polling before it closes anyway.
const QUIESCE_WAIT: Duration = Duration::from_secs(5);
/// How often a server lane looks for the client's "stopped polling" marker.
const PEER_CHECK: Duration = Duration::from_millis(10);

/// Device counters.
#[derive(Debug, Default, Clone, Copy)]
pub struct PhyStats {
    /// Frames received.
    pub rx: u64,
    /// Frames sent.
    pub tx: u64,
    /// Received frames that spanned several mbufs (copied to linearise).
    pub rx_chained: u64,
    /// Frames smoltcp built that could not get an mbuf (dropped).
    pub tx_nombuf: u64,
    /// Server poll-loop iterations (for per-iteration cost accounting in profiles).
    pub iterations: u64,
}

/// A smoltcp device over one DPDK queue pair.
pub struct DpdkPhy {
    rxq: RxQueue,
    txq: TxQueue,
    pool: Mempool,
    /// Received, not yet handed to smoltcp; reversed so `pop` takes the oldest.
    rx: Vec<Mbuf>,
    tx: Vec<Mbuf>,
    /// IP MTU.
    mtu: u16,
    /// Skip checksums (virtual link, see the module docs).
    no_checksums: bool,
    /// Counters.
    pub stats: PhyStats,
    /// Frames per receive burst (`KNB_SMOLTCP_BURST`, default [`TX_BATCH`]).
    pub rx_burst: usize,
}

impl DpdkPhy {
    /// A device on `rxq`/`txq` with IP MTU `mtu`, allocating transmit frames from `pool`.
    pub fn new(rxq: RxQueue, txq: TxQueue, pool: Mempool, mtu: u16) -> DpdkPhy {
        DpdkPhy {
            rxq,
            txq,
            pool,
            rx: Vec::with_capacity(TX_BATCH),
            tx: Vec::with_capacity(TX_LIMIT),
            mtu,
            no_checksums: super::virtual_link_checksums(),
            stats: PhyStats::default(),
            rx_burst: TX_BATCH,
        }
    }

    /// Sends what smoltcp queued (what the ring does not take stays for the next call).
    pub fn flush(&mut self) {
        self.stats.tx += self.txq.tx_burst(&mut self.tx) as u64;
    }
}

/// Receive token: owns the mbuf.
pub struct PhyRx(Mbuf);

/// Transmit token: borrows the device's pool and transmit list.
pub struct PhyTx<'a> {
    pool: &'a Mempool,
    tx: &'a mut Vec<Mbuf>,
    stats: &'a mut PhyStats,
}

impl smoltcp::phy::RxToken for PhyRx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        if self.0.nb_segs() == 1 {
            f(self.0.data())
        } else {
            f(&self.0.to_vec())
        }
    }
}

impl smoltcp::phy::TxToken for PhyTx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        match self.pool.alloc_chain(len) {
            Some(mut m) if m.nb_segs() == 1 => {
                let r = match m.data_mut() {
                    Some(d) => f(d),
                    None => f(&mut vec![0u8; len]),
                };
                self.tx.push(m);
                r
            }
            Some(mut m) => {
                let mut v = vec![0u8; len];
                let r = f(&mut v);
                let _ = m.write(0, &v);
                self.tx.push(m);
                r
            }
            None => {
                // Out of mbufs: smoltcp still needs a buffer to build into; the frame
                // is dropped (counted) and TCP retransmits it.
                self.stats.tx_nombuf += 1;
                f(&mut vec![0u8; len])
            }
        }
    }
}

impl Device for DpdkPhy {
    type RxToken<'a> = PhyRx;
    type TxToken<'a> = PhyTx<'a>;

    fn receive(
        &mut self,
        _: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        if self.rx.is_empty() {
            let n = self.rxq.rx_burst(&mut self.rx, self.rx_burst);
            if n == 0 {
                return None;
            }
            self.stats.rx += n as u64;
            self.rx.reverse();
        }
        let m = self.rx.pop()?;
        if m.nb_segs() > 1 {
            self.stats.rx_chained += 1;
        }
        Some((
            PhyRx(m),
            PhyTx {
                pool: &self.pool,
                tx: &mut self.tx,
                stats: &mut self.stats,
            },
        ))
    }

    fn transmit(&mut self, _: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        if self.tx.len() >= TX_BATCH {
            self.flush();
            if self.tx.len() >= TX_LIMIT {
                return None;
            }
        }
        Some(PhyTx {
            pool: &self.pool,
            tx: &mut self.tx,
            stats: &mut self.stats,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = usize::from(self.mtu) + 14;
        if self.no_checksums {
            c.checksum = smoltcp::phy::ChecksumCapabilities::ignored();
        }
        c
    }
}

/// One thread's stack: device, interface, sockets.
struct Lane {
    phy: DpdkPhy,
    iface: Interface,
    sockets: SocketSet<'static>,
    handles: Vec<SocketHandle>,
    base: Instant,
}

fn ts(base: Instant, now: Instant) -> smoltcp::time::Instant {
    smoltcp::time::Instant::from_micros(now.duration_since(base).as_micros() as i64)
}

/// Socket buffer: room for the whole iodepth of messages twice, 64 KiB..4 MiB.
fn sock_buf(w: &Workload) -> usize {
    let msg = w.req_size.max(w.resp_size) as usize + crate::proto::HDR_LEN;
    (2 * w.iodepth as usize * msg).clamp(64 * 1024, 4 << 20)
}

impl Lane {
    fn new(
        rxq: RxQueue,
        txq: TxQueue,
        pool: Mempool,
        mac: [u8; 6],
        cidr: (std::net::Ipv4Addr, u8),
        seed: u64,
        mtu: u16,
    ) -> Lane {
        let mut phy = DpdkPhy::new(rxq, txq, pool, mtu);
        let base = Instant::now();
        let mut cfg = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac)));
        cfg.random_seed = seed;
        let mut iface = Interface::new(cfg, &mut phy, ts(base, base));
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(IpAddress::Ipv4(cidr.0), cidr.1));
        });
        Lane {
            phy,
            iface,
            sockets: SocketSet::new(Vec::new()),
            handles: Vec::new(),
            base,
        }
    }

    fn add_socket(&mut self, w: &Workload) -> SocketHandle {
        let n = sock_buf(w);
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; n]),
            tcp::SocketBuffer::new(vec![0u8; n]),
        );
        s.set_nagle_enabled(false);
        let h = self.sockets.add(s);
        self.handles.push(h);
        h
    }

    fn poll(&mut self, now: Instant) {
        let t = ts(self.base, now);
        self.iface.poll(t, &mut self.phy, &mut self.sockets);
        self.phy.flush();
    }

    fn sock(&mut self, i: usize) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket>(self.handles[i])
    }
}

/// Runs `body(lane_index, lane)` on one thread per lane: lane 0 on the calling (EAL
/// main) thread, the others pinned to their CPUs and registered with the EAL.
fn run_lanes<T: Send>(
    dev: memif::MemifDev,
    cidr: (std::net::Ipv4Addr, u8),
    cpus: &[usize],
    body: &(dyn Fn(usize, Lane) -> Result<T, String> + Sync),
) -> Result<Vec<T>, String> {
    let memif::MemifDev {
        eal,
        port,
        pool,
        queues,
        mac,
        mtu,
        vdev,
    } = dev;
    let seed = std::process::id() as u64 ^ 0x5eed;
    let burst = super::env_burst("KNB_SMOLTCP_BURST")?.unwrap_or(TX_BATCH);
    let results: Vec<Result<T, String>> = std::thread::scope(|s| {
        let mut hs = Vec::new();
        let mut first = None;
        for (i, (rxq, txq)) in queues.into_iter().enumerate() {
            let pool = pool.clone();
            if i == 0 {
                first = Some((rxq, txq, pool));
                continue;
            }
            let cpu = cpus[i % cpus.len()];
            let eal = &eal;
            hs.push(s.spawn(move || {
                memif::register_lane(eal, cpu)?;
                let mut lane = Lane::new(rxq, txq, pool, mac, cidr, seed + i as u64, mtu);
                lane.phy.rx_burst = burst;
                body(i, lane)
            }));
        }
        let mut out = Vec::new();
        if let Some((rxq, txq, pool)) = first {
            let mut lane = Lane::new(rxq, txq, pool, mac, cidr, seed, mtu);
            lane.phy.rx_burst = burst;
            out.push(body(0, lane));
        }
        out.extend(hs.into_iter().map(|h| {
            h.join()
                .unwrap_or_else(|_| Err("lane thread panicked".into()))
        }));
        out
    });
    // Every lane has stopped polling (their queues are gone; `port` keeps the device
    // open): meet the peer before closing, as luna's cores do
    // (`r2c::device::dpdk::memif_quiesce`: memif's disconnect races with a burst).
    if let Ok(false) = memif_quiesce(&vdev, QUIESCE_WAIT) {
        eprintln!(
            "knb: the memif peer did not stop polling within {QUIESCE_WAIT:?}; closing anyway"
        );
    }
    drop(port);
    results.into_iter().collect()
}

impl Backend for Smoltcp {
    fn stack(&self) -> Stack {
        Stack::Smoltcp
    }

    fn topology(&self) -> Kind {
        Kind::Memif
    }

    /// A bad receive-burst knob is refused before either side starts.
    fn unavailable(&self) -> Option<String> {
        super::env_burst("KNB_SMOLTCP_BURST").err()
    }

    fn endpoints(
        &self,
        topo: &Topology,
        server_cpus: &[usize],
        client_cpus: &[usize],
    ) -> Result<Endpoints, String> {
        memif::endpoints(topo, server_cpus, client_cpus, "smoltcp")
    }

    fn serve(&self, spec: &ServerSpec, ready: &mut dyn FnMut()) -> Result<ServerReport, String> {
        let w = &spec.workload;
        let deadline = Instant::now() + spec.lifetime;
        let dev = memif::open(
            &spec.eal,
            true,
            w.threads as u16,
            w.mtu,
            spec.lifetime,
            ready,
        )?;
        let cidr = (spec.ip, spec.prefix_len);
        let vdev = memif::vdev_of(&spec.eal).unwrap_or_default();
        let reports = run_lanes(dev, cidr, &spec.cpus, &|i, lane| {
            let (_, n) = w.conns_of(i as u32);
            server_lane(lane, n as usize, spec.port, w, deadline, vdev)
        })?;
        let mut total = ServerReport {
            connections: w.connections as u64,
            ..Default::default()
        };
        let mut extra = PhyStats::default();
        for (r, st) in reports {
            total.add(&r.counters);
            total.errors.extend(r.errors);
            extra.rx += st.rx;
            extra.tx += st.tx;
            extra.rx_chained += st.rx_chained;
            extra.tx_nombuf += st.tx_nombuf;
            extra.iterations += st.iterations;
        }
        total.extra = json!({"frames_rx": extra.rx, "frames_tx": extra.tx,
            "rx_chained": extra.rx_chained, "tx_nombuf": extra.tx_nombuf,
            "iterations": extra.iterations});
        Ok(total)
    }

    fn run_client(
        &self,
        spec: &ClientSpec,
        plan: &Arc<ClientPlan>,
    ) -> Result<Vec<ThreadResult>, String> {
        let w = plan.workload();
        let dev = match memif::open(
            &spec.eal,
            false,
            w.threads as u16,
            w.mtu,
            Duration::from_secs(30),
            &mut || {},
        ) {
            Ok(d) => d,
            Err(e) => {
                plan.fail(e.clone());
                return Err(e);
            }
        };
        let cidr = (spec.ip, spec.prefix_len);
        run_lanes(dev, cidr, &spec.cpus, &|i, lane| {
            let r = client_lane(lane, i as u32, spec, plan);
            if let Err(e) = &r {
                plan.fail(e.clone());
            }
            r
        })
    }
}

fn server_lane(
    mut lane: Lane,
    n: usize,
    port: u16,
    w: &Workload,
    deadline: Instant,
    vdev: &str,
) -> Result<(ServerReport, PhyStats), String> {
    let mut conns = Vec::new();
    for _ in 0..n {
        let h = lane.add_socket(w);
        lane.sockets
            .get_mut::<tcp::Socket>(h)
            .listen(port)
            .map_err(|e| format!("smoltcp listen on {port}: {e}"))?;
        conns.push((ServerConn::new(w.resp_size), false, false));
    }
    let mut report = ServerReport::default();
    let mut done = 0;
    let mut peer_check = Instant::now() + PEER_CHECK;
    let mut peer_quiet = false;
    while done < n && super::serving(deadline) {
        let now = Instant::now();
        if now >= peer_check {
            // The client has stopped polling (and waits for us before closing): what
            // it sent is in the ring, nothing more comes. One last pass, then stop,
            // instead of polling until the deadline for a FIN or RST that never comes.
            peer_check = now + PEER_CHECK;
            peer_quiet = memif_peer_quiet(vdev);
        }
        lane.phy.stats.iterations += 1;
        lane.poll(now);
        for (i, (e, established, finished)) in conns.iter_mut().enumerate() {
            if *finished {
                continue;
            }
            let s = lane.sock(i);
            if s.state() == tcp::State::Established {
                *established = true;
            }
            for _ in 0..4 {
                if !e.tx().is_empty() && s.can_send() {
                    if let Ok(k) = s.send_slice(e.tx().pending()) {
                        e.tx().consume(k);
                    }
                }
                if e.tx().len() >= SERVER_TX_LIMIT || !s.can_recv() {
                    break;
                }
                let r = s.recv(|b| (b.len(), e.on_rx(b, now)));
                match r {
                    Ok(Ok(())) => {}
                    Ok(Err(pe)) => {
                        report.errors.push(format!("connection {i}: {pe}"));
                        s.abort();
                        break;
                    }
                    Err(_) => break,
                }
            }
            if *established && s.state() == tcp::State::CloseWait {
                s.close();
            }
            if *established && !s.is_open() {
                *finished = true;
                done += 1;
                report.add(&e.counters);
            }
        }
        if peer_quiet {
            break;
        }
    }
    for (e, _, finished) in &conns {
        if !finished {
            report.add(&e.counters);
        }
    }
    Ok((report, lane.phy.stats))
}

fn client_lane(
    mut lane: Lane,
    t: u32,
    spec: &ClientSpec,
    plan: &ClientPlan,
) -> Result<ThreadResult, String> {
    let w = plan.workload();
    let (first, n) = w.conns_of(t);
    let remote = (IpAddress::Ipv4(spec.server_ip), spec.port);
    for i in 0..n {
        let h = lane.add_socket(w);
        let local = CLIENT_PORT_BASE + (first + i) as u16;
        let cx = lane.iface.context();
        lane.sockets
            .get_mut::<tcp::Socket>(h)
            .connect(cx, remote, local)
            .map_err(|e| format!("smoltcp connect: {e}"))?;
    }
    // Handshakes (and ARP) over the lane.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let now = Instant::now();
        lane.poll(now);
        if (0..n as usize).all(|i| lane.sock(i).state() == tcp::State::Established) {
            break;
        }
        if now >= until || plan.failed() {
            return Err(format!(
                "smoltcp: connections to {}:{} not established within 10 s (states: {:?})",
                spec.server_ip,
                spec.port,
                (0..n as usize)
                    .map(|i| lane.sock(i).state())
                    .collect::<Vec<_>>()
            ));
        }
    }
    let mut wk = plan.start(t)?;
    loop {
        let now = Instant::now();
        if wk.finished(now) {
            break;
        }
        lane.phy.stats.iterations += 1;
        lane.poll(now);
        let now = Instant::now();
        wk.tick(now);
        for i in 0..n as usize {
            let s = lane.sockets.get_mut::<tcp::Socket>(lane.handles[i]);
            while s.can_recv() {
                match s.recv(|b| {
                    wk.on_rx(i, b, now);
                    (b.len(), b.len())
                }) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            if !s.may_recv() && s.state() != tcp::State::Established {
                wk.fail(format!(
                    "connection {}: closed by the server ({})",
                    first as usize + i,
                    s.state()
                ));
            }
            let chunk = wk.send_chunk();
            while !wk.tx(i).is_empty() && s.can_send() {
                let p = wk.tx(i).pending();
                match s.send_slice(&p[..p.len().min(chunk)]) {
                    Ok(k) if k > 0 => wk.on_sent(i, k, now),
                    _ => break,
                }
            }
        }
    }
    plan.finished();
    // Close, give the FINs a moment, then abort what is left so the server sees the end.
    for i in 0..n as usize {
        lane.sock(i).close();
    }
    let until = Instant::now() + Duration::from_millis(200);
    while Instant::now() < until
        && (0..n as usize).any(|i| {
            lane.sock(i).state() != tcp::State::Closed
                && lane.sock(i).state() != tcp::State::TimeWait
        })
    {
        lane.poll(Instant::now());
    }
    for i in 0..n as usize {
        lane.sock(i).abort();
    }
    lane.poll(Instant::now());
    let st = lane.phy.stats;
    let mut r = wk.finish();
    r.extra = json!({"frames_rx": st.rx, "frames_tx": st.tx, "rx_chained": st.rx_chained,
        "tx_nombuf": st.tx_nombuf, "iterations": st.iterations});
    Ok(r)
}
