//! The stack: one interface's Ethernet/ARP/IPv4/ICMP/TCP endpoint, sans-IO.
//!
//! [`Stack`]'s type documentation holds the contract: its method groups and the order a
//! driver calls them in. Everything is deterministic given the inputs and the [`Rng`].
//!
//! The code is split by layer, as `impl` blocks of the one `Stack` type: `config` (the
//! interface configuration), `slots` (the connection table behind generation-checked
//! handles, per-connection bookkeeping), `timerq` (the timer queue), `ingress` (Ethernet,
//! ARP, IPv4, ICMP, TCP demux), `passive` (LISTEN and SYN cookies) and `egress`
//! (`poll_transmit`, next-hop resolution and the one Ethernet + IPv4 header writer).

use crate::context::Rng;
use crate::tables::neighbour::{NeighbourState, NeighbourTable};
use crate::tables::route::{NextHop, Route, RouteTable};
use crate::tcp::conn::{Connection, FourTuple};
use crate::tcp::isn::IsnGenerator;
use crate::tcp::syncookie::{SynCookieConfig, SynCookies};
use crate::tcp::{self, CloseReason, ConnCounters, SoftError, State, TcpConfig};
use crate::time::Instant;
use core::net::{Ipv4Addr, SocketAddrV4};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use zbuf::{IoVec, Zbuf};

mod addrs;
mod config;
mod counters;
mod egress;
mod ingress;
mod passive;
mod rst_limit;
mod slots;
mod timerq;

pub use addrs::{LocalAddrError, LocalAddrs, MAX_LOCAL_ADDRS};
pub use config::{
    check_host_address, AddressError, ConfigError, StackConfig, SynCookieMode,
    DEFAULT_RCV_MEM_TOTAL, MIN_RCV_MEM_TOTAL,
};
pub use counters::{Held, HighWater, StackCounters, StackDrop};
pub use egress::{Transmit, TxOffload};
use rst_limit::RstBucket;
pub use rst_limit::RstLimit;
use slots::{slot_entry, Entry, KeyedHasher, Listener, NextHopMac, Owner, Slot, HOP_MAC_REFRESH};

#[cfg(test)]
mod tests;

/// Ethernet header length.
const ETH_LEN: usize = 14;
/// IPv4 header length (luna never sends IP options).
const IP_LEN: usize = 20;
/// Room for Ethernet + IPv4 + the largest TCP header.
pub const MAX_HEADER_LEN: usize = ETH_LEN + IP_LEN + 60;
/// Control frames (ARP, ICMP echo replies, RSTs, SYN cookie SYN-ACKs) waiting for the
/// device at most. `poll_transmit` hands them out before any connection's segments, and
/// an echo reply holds the request's receive buffer: a flood answered faster than the
/// link takes the answers would otherwise grow the queue without bound and starve TCP.
/// Beyond it a new answer is not made and counted as [`StackDrop::CtlFull`].
pub const CTL_QUEUE_MAX: usize = 1024;

/// A connection, as the application names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SocketHandle {
    idx: u32,
    gen: u32,
}

/// A listening port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenerHandle {
    idx: u32,
    gen: u32,
}

/// One listener as [`Stack::listeners`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerInfo {
    /// The listening port.
    pub port: u16,
    /// Half-open plus unaccepted connections it has room for.
    pub backlog: usize,
    /// Connections in SYN-RECEIVED it owns.
    pub half_open: usize,
    /// Established connections waiting for `accept`.
    pub accept_queue: usize,
}

/// Readiness events, delivered in order by [`Stack::poll_event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// An active open completed.
    Connected(SocketHandle),
    /// Data (or end of stream) is ready to read.
    Readable(SocketHandle),
    /// Send-buffer space was freed.
    Writable(SocketHandle),
    /// The connection ended; [`Stack::close_reason`] says how.
    Closed(SocketHandle),
    /// A listener has connections to accept.
    Acceptable(ListenerHandle),
}

/// Errors from [`Stack::connect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// No route to the destination.
    #[error("no route to the destination")]
    NoRoute,
    /// The destination is not a unicast address (or is our own), or the local address
    /// given to [`Stack::connect_from`] is not one of ours.
    #[error(
        "the destination is not a unicast address of another host, or its port is 0, \
         or the local address is not ours"
    )]
    InvalidAddress,
    /// The requested local port is in use for this destination.
    #[error("the local port is in use for this destination")]
    AddrInUse,
    /// No free port in the ephemeral range for this destination.
    #[error("no free port in the ephemeral range for this destination")]
    PortsExhausted,
    /// `max_connections` reached.
    #[error("the connection table is full (max_connections)")]
    TableFull,
}

/// Errors from [`Stack::listen`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ListenError {
    /// Port 0 or a port already listened on.
    #[error("port 0, or a port already listened on")]
    AddrInUse,
    /// Backlog of zero.
    #[error("the backlog must be at least 1")]
    InvalidBacklog,
}

/// Errors from [`Stack::send`] and [`Stack::send_iovec`]: the handle's, or the connection's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The send buffer is full; retry after a writable event.
    #[error("the send buffer is full")]
    WouldBlock,
    /// The sending side was shut down.
    #[error("the sending side was shut down")]
    Shutdown,
    /// The connection is closed (see its close reason).
    #[error("the connection is closed")]
    Closed,
    /// The handle does not name a live connection (never was one, or was reclaimed).
    #[error("the handle does not name a live connection")]
    InvalidHandle,
}

impl From<tcp::SendError> for SendError {
    fn from(e: tcp::SendError) -> Self {
        match e {
            tcp::SendError::WouldBlock => SendError::WouldBlock,
            tcp::SendError::Shutdown => SendError::Shutdown,
            tcp::SendError::Closed => SendError::Closed,
        }
    }
}

/// Errors from [`Stack::recv`] and [`Stack::recv_iovec`]: the handle's, or the connection's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// The peer closed its side and every byte has been read (end of stream).
    #[error("end of stream: the peer closed and every byte was read")]
    Finished,
    /// The connection is closed before the stream ended (reset, timeout, abort).
    #[error("the connection closed before the end of the stream")]
    Closed,
    /// The handle does not name a live connection (never was one, or was reclaimed).
    #[error("the handle does not name a live connection")]
    InvalidHandle,
}

impl From<tcp::RecvError> for RecvError {
    fn from(e: tcp::RecvError) -> Self {
        match e {
            tcp::RecvError::Finished => RecvError::Finished,
            tcp::RecvError::Closed => RecvError::Closed,
        }
    }
}

/// The per-core stack: one interface's Ethernet/ARP/IPv4/ICMP/TCP endpoint.
///
/// One instance per core, never shared. It reads no clock and touches no device: the
/// driver (r2c's runtime, a test's simulated wire) passes `now` into every call that
/// needs time, hands it each received frame, and sends what it returns.
///
/// # Method groups
///
/// - **Setup**: [`Stack::new`] validates a [`StackConfig`]; the tables are filled through
///   [`Stack::neighbours_mut`] (static entries, netlink-sync) and [`Stack::routes_mut`].
/// - **Input**: [`Stack::handle_frame`] for every received frame (a zero-copy [`Zbuf`];
///   anything malformed is dropped and counted in [`Stack::counters`]), and
///   [`Stack::handle_timeouts`] once the instant [`Stack::poll_timeout`] gave has passed.
/// - **Application calls**: [`Stack::listen`], [`Stack::accept`], [`Stack::unlisten`];
///   [`Stack::connect`]; [`Stack::send`] / [`Stack::send_iovec`] (partial writes: they
///   return how many bytes the send buffer took, zero copy); [`Stack::recv`] /
///   [`Stack::recv_iovec`]; [`Stack::shutdown`], [`Stack::close`], [`Stack::abort`]. They
///   only change connection state and queue work; nothing is sent from inside them.
/// - **Output**: [`Stack::poll_transmit`] until it returns `None`, handing each
///   [`Transmit`] (header bytes + the payload's io-vector + offload metadata) to the
///   device; [`Stack::poll_event`] until `None` for readiness events ([`Event`]), in the
///   order they happened; [`Stack::poll_timeout`] for when to call `handle_timeouts`.
/// - **Inspection**: [`Stack::config`], [`Stack::ipv4`], [`Stack::counters`],
///   [`Stack::tcp_counters`], [`Stack::connection_count`], [`Stack::connection`],
///   [`Stack::connections`], [`Stack::listeners`],
///   [`Stack::state`], [`Stack::close_reason`], [`Stack::send_capacity`],
///   [`Stack::tuple_in_use`], [`Stack::neighbours`].
///
/// # Call order
///
/// One iteration of the driver's loop, with one `now` that never goes backwards:
///
/// 1. [`Stack::handle_frame`]`(now, frame)` for each frame of the received burst;
/// 2. [`Stack::handle_timeouts`]`(now)` if [`Stack::poll_timeout`] is at or before `now`;
/// 3. [`Stack::poll_event`] until `None`, and the application's calls in response (or at
///    any other time: they only queue work);
/// 4. [`Stack::poll_transmit`]`(now)` until `None`. Input, timers and application calls
///    only mark a connection dirty; its segments are built here, and its next deadline
///    is scheduled when it has nothing more to send;
/// 5. [`Stack::poll_timeout`], read after step 4, is when to wake up at the latest.
///
/// # Handles
///
/// [`SocketHandle`] and [`ListenerHandle`] are generation-checked: once a connection is
/// reclaimed its handle names nothing, never another connection. Such a stale handle gets
/// [`SendError::InvalidHandle`] / [`RecvError::InvalidHandle`] from the data calls, `None`
/// from the inspection calls (0 from `send_capacity`), and is ignored by `shutdown`, `close`, `abort` and
/// `unlisten`. After `close` or `abort` the application must not use the handle again: the
/// connection finishes on its own and is reclaimed.
pub struct Stack<R: Rng> {
    cfg: StackConfig,
    /// Our addresses: `cfg.addr` (the primary) and any added ones.
    addrs: LocalAddrs,
    /// Every secret and offset is drawn from the `Rng` at construction (keys of the ISN,
    /// timestamp-offset, cookie and demux hashes; the first ephemeral port and IP id); per
    /// connection values are keyed hashes of the 4-tuple, not draws.
    _rng: core::marker::PhantomData<R>,
    neighbours: NeighbourTable,
    routes: RouteTable,
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
    by_tuple: HashMap<FourTuple, u32, KeyedHasher>,
    /// The demux answer for the last segment: a connection's segments come in bursts
    /// (a message is several segments), which then skip the keyed hash. Cleared whenever
    /// `by_tuple` changes.
    last_hit: Option<(FourTuple, u32)>,
    /// Bumped whenever a neighbour entry may have changed state or address, or entries
    /// came or went (and whenever the application takes the table): invalidates every
    /// connection's [`NextHopMac`].
    nb_epoch: u64,
    listeners: Vec<Option<Listener>>,
    listener_by_port: HashMap<u16, u32, KeyedHasher>,
    isn: IsnGenerator,
    cookies: SynCookies,
    timers: timerq::TimerQueue,
    dirty: VecDeque<u32>,
    /// Between [`Stack::hold_acks`] and [`Stack::release_acks`]: connections (slot,
    /// generation) whose only output was a pure ACK, taken off `dirty` and unmarked (any
    /// other output they get meanwhile lists them again at once) until the rest of the
    /// burst has been read.
    held_acks: Vec<(u32, u32)>,
    holding_acks: bool,
    /// Connections parked until their next hop resolves, by next hop.
    arp_wait: HashMap<Ipv4Addr, Vec<u32>, KeyedHasher>,
    /// Next hops whose resolution failed since `fail_parked` last ran.
    nb_failed: Vec<Ipv4Addr>,
    /// Last ARP request per unresolved neighbour.
    arp_sent: HashMap<Ipv4Addr, Instant, KeyedHasher>,
    /// Control frames waiting for the device, at most [`CTL_QUEUE_MAX`].
    ctl: VecDeque<Transmit>,
    /// The rest of a connection's burst (`TcpConfig::send_burst`): its next frames, cut
    /// one per `poll_transmit` before anything else goes out (none while its payload is
    /// empty).
    run: egress::SegRun,
    /// Received segments of one connection held for one pass of its input
    /// ([`Stack::handle_frames`]; empty outside it).
    rx_run: ingress::RxRun,
    /// The headers below TCP of the last TCP frame taken (header prediction in
    /// `handle_frame`).
    rx_prefix: ingress::RxPrefix,
    /// Inside [`Stack::handle_frames`]: TCP input may be held in `rx_run`.
    rx_coalesce: bool,
    events: VecDeque<Event>,
    next_port: u16,
    ip_ident: u16,
    counters: StackCounters,
    /// What the connections hold now (each entry's share is its `Entry::acct`).
    held: Held,
    /// Budget of RSTs for segments that match no connection (`StackConfig::rst_limit`).
    rst_bucket: RstBucket,
    /// Counters of connections already reclaimed.
    retired: ConnCounters,
    /// The TCP settings every connection of this stack shares (`cfg.tcp` with the MSS
    /// clamped to the MTU, RFC 6691): one read-only copy instead of one per connection, so
    /// its cache lines stay hot across thousands of connections. What differs per
    /// connection (timestamps, SACK, window scaling as negotiated) lives in the connection.
    tcp_shared: Arc<TcpConfig>,
    /// [`StackConfig::rcv_mem_total`] less `rcv_mem_reserve`: what any connection may
    /// take (Linux's `tcp_mem` pressure threshold).
    rcv_mem_free: usize,
    /// The top third of [`StackConfig::rcv_mem_total`], kept for connections under their
    /// floor whose applications read (`TcpConfig::rcv_mem_min`; none when that is 0).
    rcv_mem_reserve: usize,
}

impl<R: Rng> Stack<R> {
    /// A stack for one interface. Fails with a precise reason on a bad configuration.
    pub fn new(cfg: StackConfig, mut rng: R) -> Result<Self, ConfigError> {
        check_host_address(cfg.addr)?;
        if !(576..=9216).contains(&cfg.mtu) {
            return Err(ConfigError::Mtu(cfg.mtu));
        }
        if !cfg.mac.is_unicast() {
            return Err(ConfigError::Mac);
        }
        let (lo, hi) = cfg.ephemeral_ports;
        if lo == 0 || lo > hi {
            return Err(ConfigError::PortRange);
        }
        if cfg.max_connections == 0 {
            return Err(ConfigError::MaxConnections);
        }
        if cfg.ttl == 0 {
            return Err(ConfigError::Ttl);
        }
        if cfg.rcv_mem_total < MIN_RCV_MEM_TOTAL {
            return Err(ConfigError::RcvMemTotal(cfg.rcv_mem_total));
        }
        cfg.tcp.validate().map_err(ConfigError::Tcp)?;
        if let Some(gw) = cfg.gateway {
            if !cfg.addr.contains_addr(gw) {
                return Err(ConfigError::Gateway);
            }
        }
        let mut routes = RouteTable::new(256);
        let on_link = Route {
            destination: cfg.addr.network(),
            next_hop: NextHop::Direct,
            source: cfg.addr.address(),
            interface: 0,
        };
        let _ = routes.insert(on_link);
        if let Some(gw) = cfg.gateway {
            let _ = routes.set_default(gw, cfg.addr.address(), 0);
        }
        let hasher = KeyedHasher(rng.next_u64(), rng.next_u64());
        let isn = IsnGenerator::new(&mut rng);
        let cookies = SynCookies::new(&mut rng, SynCookieConfig::default())
            .map_err(|e| ConfigError::Tcp(e.to_string()))?;
        let next_port = lo + (rng.next_u32() % (u32::from(hi - lo) + 1)) as u16;
        let mut tcp_shared = cfg.tcp.clone();
        // RFC 6691: the MSS is clamped to what the MTU allows.
        tcp_shared.mss = tcp_shared.mss.min(cfg.mtu - (IP_LEN as u16) - 20);
        let rcv_mem_reserve = cfg.rcv_mem_reserve();
        Ok(Stack {
            rcv_mem_free: cfg.rcv_mem_total - rcv_mem_reserve,
            rcv_mem_reserve,
            neighbours: NeighbourTable::new(cfg.neighbour),
            routes,
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            by_tuple: HashMap::with_hasher(hasher),
            last_hit: None,
            nb_epoch: 0,
            listeners: Vec::new(),
            listener_by_port: HashMap::with_hasher(hasher),
            isn,
            cookies,
            timers: timerq::TimerQueue::default(),
            dirty: VecDeque::new(),
            held_acks: Vec::new(),
            holding_acks: false,
            arp_wait: HashMap::with_hasher(hasher),
            nb_failed: Vec::new(),
            arp_sent: HashMap::with_hasher(hasher),
            ctl: VecDeque::new(),
            events: VecDeque::new(),
            next_port,
            ip_ident: rng.next_u32() as u16,
            counters: StackCounters::default(),
            held: Held::default(),
            rst_bucket: RstBucket::new(cfg.rst_limit),
            retired: ConnCounters::default(),
            _rng: core::marker::PhantomData,
            tcp_shared: Arc::new(tcp_shared),
            run: egress::SegRun::default(),
            rx_run: ingress::RxRun::default(),
            rx_prefix: ingress::RxPrefix::default(),
            rx_coalesce: false,
            addrs: LocalAddrs::new(cfg.addr),
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &StackConfig {
        &self.cfg
    }

    /// Our primary IPv4 address (the configuration's; [`Stack::addresses`] has all).
    pub fn ipv4(&self) -> Ipv4Addr {
        self.cfg.addr.address()
    }

    /// The neighbour table, read only.
    pub fn neighbours(&self) -> &NeighbourTable {
        &self.neighbours
    }

    /// The neighbour table (filled by ARP, statically, or by netlink-sync).
    pub fn neighbours_mut(&mut self) -> &mut NeighbourTable {
        // The caller may change anything: connections look their next hop up again.
        self.nb_epoch += 1;
        &mut self.neighbours
    }

    /// Runs a neighbour-table operation about `ip` and invalidates the connections'
    /// cached next-hop MACs if it changed `ip`'s address or state, or added or removed
    /// entries (an insert may evict another entry). A refreshed expiry alone does not
    /// count: it only moves later, and a cache never outlives the expiry it was taken at.
    fn nb_update<T>(&mut self, ip: Ipv4Addr, f: impl FnOnce(&mut NeighbourTable) -> T) -> T {
        let key = |t: &NeighbourTable| (t.len(), t.get(ip).map(|n| (n.hardware_addr, n.state)));
        let before = key(&self.neighbours);
        let r = f(&mut self.neighbours);
        let after = key(&self.neighbours);
        if before != after {
            self.nb_epoch += 1;
        }
        r
    }

    /// A [`NextHopMac`] for `ip` if its entry is `Reachable` or `Permanent` at `now`.
    fn hop_mac_of(&self, ip: Ipv4Addr, now: Instant) -> Option<NextHopMac> {
        let n = self.neighbours.get(ip)?;
        let mac = n.hardware_addr?;
        let refresh = now + HOP_MAC_REFRESH;
        let until = match n.state {
            NeighbourState::Permanent => refresh,
            NeighbourState::Reachable => n.expires_at?.min(refresh),
            NeighbourState::Stale | NeighbourState::Incomplete => return None,
        };
        (now < until).then_some(NextHopMac {
            mac,
            epoch: self.nb_epoch,
            until,
        })
    }

    /// The route table.
    pub fn routes_mut(&mut self) -> &mut RouteTable {
        &mut self.routes
    }

    /// Stack-level counters.
    pub fn counters(&self) -> &StackCounters {
        &self.counters
    }

    /// What the connections hold now: table entries, out-of-order, receive and send
    /// queue bytes (the peaks are in [`StackCounters::high_water`]).
    pub fn held(&self) -> Held {
        self.held
    }

    /// The receive memory any connection may still take under
    /// [`StackConfig::rcv_mem_total`] less its reserve ([`StackConfig::rcv_mem_reserve`],
    /// which only connections under their floor whose applications read may take):
    /// negative once the connections hold more. The bound can be passed by one segment
    /// per connection (see the field).
    #[inline]
    fn rcv_mem_room(&self) -> isize {
        self.rcv_mem_free as isize - self.held.rcv_mem as isize
    }

    /// Start a new high-water interval: every mark drops to what is held now (a report
    /// per phase of a run).
    pub fn reset_high_water(&mut self) {
        self.counters.high_water = HighWater::default();
        self.counters.high_water.raise(&self.held);
        let one = self
            .slots
            .iter()
            .filter_map(|s| s.entry.as_deref())
            .map(|e| e.conn.ooo_bytes() as u64)
            .max()
            .unwrap_or(0);
        self.counters.high_water.ooo_bytes_one_conn = one;
    }

    /// TCP counters summed over every connection, live and reclaimed.
    pub fn tcp_counters(&self) -> ConnCounters {
        let mut sum = self.retired.clone();
        for slot in &self.slots {
            if let Some(e) = &slot.entry {
                sum.accumulate(&e.conn.counters);
            }
        }
        sum
    }

    /// Live connection objects (including TIME-WAIT and unaccepted ones).
    pub fn connection_count(&self) -> usize {
        self.live
    }

    /// Every live connection object with its handle, in slot order (inspection: a
    /// netstat-like listing; includes TIME-WAIT and unaccepted connections).
    pub fn connections(&self) -> impl Iterator<Item = (SocketHandle, &Connection)> + '_ {
        self.slots.iter().enumerate().filter_map(|(i, slot)| {
            let e = slot.entry.as_deref()?;
            let h = SocketHandle {
                idx: i as u32,
                gen: slot.gen,
            };
            Some((h, &e.conn))
        })
    }

    /// Every open listener (inspection).
    pub fn listeners(&self) -> impl Iterator<Item = ListenerInfo> + '_ {
        self.listeners.iter().flatten().map(|l| ListenerInfo {
            port: l.port,
            backlog: l.backlog,
            half_open: l.half_open,
            accept_queue: l.accept_queue.len(),
        })
    }

    /// The connection behind a handle, for inspection.
    pub fn connection(&self, h: SocketHandle) -> Option<&Connection> {
        self.entry(h).map(|e| &e.conn)
    }

    /// The connection's state, `None` for a stale handle.
    pub fn state(&self, h: SocketHandle) -> Option<State> {
        self.connection(h).map(Connection::state)
    }

    /// Why the connection closed, once it has.
    pub fn close_reason(&self, h: SocketHandle) -> Option<CloseReason> {
        self.connection(h).and_then(Connection::close_reason)
    }

    // ---------------------------------------------------------------------------------------
    // Application API
    // ---------------------------------------------------------------------------------------

    /// Listen on `port` with room for `backlog` connections that are half-open or waiting to
    /// be accepted (beyond it, SYN cookies answer if enabled).
    pub fn listen(&mut self, port: u16, backlog: usize) -> Result<ListenerHandle, ListenError> {
        if backlog == 0 {
            return Err(ListenError::InvalidBacklog);
        }
        if port == 0 || self.listener_by_port.contains_key(&port) {
            return Err(ListenError::AddrInUse);
        }
        let l = Listener {
            port,
            backlog,
            half_open: 0,
            accept_queue: VecDeque::new(),
            gen: 0,
            last_cookie: None,
        };
        let idx = match self.listeners.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.listeners.push(None);
                self.listeners.len() - 1
            }
        };
        let gen = self.counters.listeners_opened as u32;
        self.counters.listeners_opened += 1;
        self.listeners[idx] = Some(Listener { gen, ..l });
        self.listener_by_port.insert(port, idx as u32);
        Ok(ListenerHandle {
            idx: idx as u32,
            gen,
        })
    }

    /// Stop listening. Connections already accepted are unaffected; unaccepted ones are reset.
    pub fn unlisten(&mut self, l: ListenerHandle) {
        let Some(Some(lst)) = self.listeners.get(l.idx as usize) else {
            return;
        };
        if lst.gen != l.gen {
            return;
        }
        let port = lst.port;
        self.listener_by_port.remove(&port);
        let owned: Vec<u32> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.entry
                    .as_ref()
                    .is_some_and(|e| e.owner == Owner::Listener(l.idx))
            })
            .map(|(i, _)| i as u32)
            .collect();
        self.listeners[l.idx as usize] = None;
        for idx in owned {
            if let Some(e) = self.slots[idx as usize].entry.as_deref_mut() {
                e.owner = Owner::Released;
                e.conn.abort();
                e.conn.set_orphaned();
            }
            self.mark_dirty(idx);
        }
    }

    /// Take one established connection from the listener's accept queue.
    pub fn accept(&mut self, l: ListenerHandle) -> Option<SocketHandle> {
        let lst = self.listeners.get_mut(l.idx as usize)?.as_mut()?;
        if lst.gen != l.gen {
            return None;
        }
        // (A queued connection that is freed leaves the queue then: `free_slot`.)
        let h = lst.accept_queue.pop_front()?;
        let e = slot_entry(&mut self.slots, h)?;
        e.owner = Owner::App;
        // Data that arrived before accept is announced now, and so is a close: while the
        // listener held the connection its close event went nowhere (a RST in the same
        // receive burst as the handshake's ACK), and the application learns of a close
        // only from that event.
        let closed = e.conn.state() == State::Closed;
        if e.conn.recv_available() > 0 || closed || e.conn.state() == State::CloseWait {
            self.events.push_back(Event::Readable(h));
        }
        if closed {
            self.events.push_back(Event::Closed(h));
        }
        Some(h)
    }

    /// Actively open a connection to `remote` (RFC 9293 §3.10.1). With `local_port` `None`
    /// a port from the ephemeral range is chosen.
    pub fn connect(
        &mut self,
        now: Instant,
        remote: SocketAddrV4,
        local_port: Option<u16>,
    ) -> Result<SocketHandle, ConnectError> {
        self.open(now, None, remote, local_port)
    }

    /// [`connect`](Self::connect) from the local address `local` (RFC 9293 §3.9.1.1
    /// MUST-43: OPEN's optional local IP address) instead of the route's source. `local`
    /// must be one of the stack's addresses (else `InvalidAddress`); the next hop is still
    /// the route's.
    pub fn connect_from(
        &mut self,
        now: Instant,
        local: Ipv4Addr,
        remote: SocketAddrV4,
        local_port: Option<u16>,
    ) -> Result<SocketHandle, ConnectError> {
        if !self.addrs.contains(local) {
            return Err(ConnectError::InvalidAddress);
        }
        self.open(now, Some(local), remote, local_port)
    }

    /// An active OPEN from `local` (or the route's source) to `remote`.
    fn open(
        &mut self,
        now: Instant,
        local: Option<Ipv4Addr>,
        remote: SocketAddrV4,
        local_port: Option<u16>,
    ) -> Result<SocketHandle, ConnectError> {
        let dst = *remote.ip();
        self.invalid_remote(remote)?;
        // RFC 1122 §3.3.4.3 / RFC 1812 §4.2.2.5 (as Linux's `prefsrc`): the route's
        // source address when it is ours, else the address on the next hop's subnet.
        let (next_hop, src) = match self.routes.next_hop(dst) {
            Some((hop, route)) => (
                hop,
                local.unwrap_or_else(|| self.choose_source(route.source, hop)),
            ),
            None => return Err(ConnectError::NoRoute),
        };
        let port = match local_port {
            Some(p) => {
                let t = FourTuple {
                    local: SocketAddrV4::new(src, p),
                    remote,
                };
                if p == 0 || self.by_tuple.contains_key(&t) {
                    return Err(ConnectError::AddrInUse);
                }
                p
            }
            None => self
                .pick_port(src, remote)
                .ok_or(ConnectError::PortsExhausted)?,
        };
        let tuple = FourTuple {
            local: SocketAddrV4::new(src, port),
            remote,
        };
        let iss = self.iss_for(now, tuple);
        let ts_offset = self.isn.ts_offset(tuple.local, tuple.remote);
        let conn = Connection::connect(now, tuple, self.tcp_config_for(dst), iss, ts_offset);
        let entry = Entry::new(conn, Owner::App, next_hop, self.ip_ident_seed(tuple));
        let idx = self.alloc_slot(entry).ok_or(ConnectError::TableFull)?;
        self.by_tuple.insert(tuple, idx);
        self.last_hit = None;
        self.counters.active_opens += 1;
        self.after_activity(idx, now);
        Ok(self.handle_of(idx))
    }

    /// The ISN of a new connection on `tuple`: RFC 6528's, or `StackConfig::fixed_isn`.
    fn iss_for(&self, now: Instant, tuple: FourTuple) -> tcp::SeqNum {
        match self.cfg.fixed_isn {
            Some(isn) => tcp::SeqNum(isn),
            None => self.isn.isn(now, tuple.local, tuple.remote),
        }
    }

    /// Whether a 4-tuple is in use (bifurcation's port choosers use this).
    pub fn tuple_in_use(&self, local: SocketAddrV4, remote: SocketAddrV4) -> bool {
        self.by_tuple.contains_key(&FourTuple { local, remote })
    }

    fn pick_port(&mut self, src: Ipv4Addr, remote: SocketAddrV4) -> Option<u16> {
        let (lo, hi) = self.cfg.ephemeral_ports;
        let span = u32::from(hi - lo) + 1;
        for _ in 0..span {
            let p = self.next_port;
            self.next_port = if self.next_port >= hi {
                lo
            } else {
                self.next_port + 1
            };
            let t = FourTuple {
                local: SocketAddrV4::new(src, p),
                remote,
            };
            if !self.by_tuple.contains_key(&t) && !self.listener_by_port.contains_key(&p) {
                return Some(p);
            }
        }
        None
    }

    /// TCP settings for a peer: the stack's shared copy, whose MSS is clamped to what the
    /// MTU allows (RFC 6691). A reference-count increment, not a copy.
    fn tcp_config_for(&self, _dst: Ipv4Addr) -> Arc<TcpConfig> {
        Arc::clone(&self.tcp_shared)
    }

    /// Queue `data` on the connection without copying; returns the bytes accepted.
    pub fn send(&mut self, h: SocketHandle, data: &Zbuf) -> Result<usize, SendError> {
        let e = slot_entry(&mut self.slots, h).ok_or(SendError::InvalidHandle)?;
        let n = e.conn.send(data)?;
        let hw = &mut self.counters.high_water;
        slots::queued(&mut self.dirty, &mut self.held, hw, e, h.idx, n);
        Ok(n)
    }

    /// [`send`](Self::send) of a buffer the caller gives away
    /// ([`Connection::send_owned`]): the send queue keeps `data` itself (or its first
    /// part), no new reference. Returns the bytes accepted and the part of `data` not
    /// taken (`None` when all of it was); on an error `data` comes back with it.
    pub fn send_owned(
        &mut self,
        h: SocketHandle,
        data: Zbuf,
    ) -> Result<(usize, Option<Zbuf>), (SendError, Zbuf)> {
        let Some(e) = slot_entry(&mut self.slots, h) else {
            return Err((SendError::InvalidHandle, data));
        };
        let (n, rest) = e
            .conn
            .send_owned(data)
            .map_err(|(e, data)| (SendError::from(e), data))?;
        let hw = &mut self.counters.high_water;
        slots::queued(&mut self.dirty, &mut self.held, hw, e, h.idx, n);
        Ok((n, rest))
    }

    /// Queue an io-vector; returns the bytes accepted.
    pub fn send_iovec(&mut self, h: SocketHandle, data: &IoVec) -> Result<usize, SendError> {
        let e = slot_entry(&mut self.slots, h).ok_or(SendError::InvalidHandle)?;
        let n = e.conn.send_iovec(data)?;
        let hw = &mut self.counters.high_water;
        slots::queued(&mut self.dirty, &mut self.held, hw, e, h.idx, n);
        Ok(n)
    }

    /// Free send-buffer space.
    pub fn send_capacity(&self, h: SocketHandle) -> usize {
        self.connection(h).map_or(0, Connection::send_capacity)
    }

    /// The next received chunk (zero copy); see [`Connection::recv`].
    pub fn recv(&mut self, h: SocketHandle) -> Result<Option<Zbuf>, RecvError> {
        let e = slot_entry(&mut self.slots, h).ok_or(RecvError::InvalidHandle)?;
        // `Connection::recv`, with the memory the chunk released at hand.
        if let Some((b, released)) = e.conn.recv_chunk() {
            // Reading may open the window: a window update may be due.
            slots::taken(&mut self.dirty, &mut self.held, e, h.idx, b.len(), released);
            return Ok(Some(b));
        }
        e.conn.stream_status().map_err(RecvError::from)
    }

    /// Up to `max` received bytes as an io-vector (zero copy).
    pub fn recv_iovec(&mut self, h: SocketHandle, max: usize) -> Result<IoVec, RecvError> {
        let e = slot_entry(&mut self.slots, h).ok_or(RecvError::InvalidHandle)?;
        let mem = e.conn.rcvq_mem();
        let r = e.conn.recv_iovec(max);
        if let Ok(v) = &r {
            if !v.is_empty() {
                let released = mem - e.conn.rcvq_mem();
                slots::taken(&mut self.dirty, &mut self.held, e, h.idx, v.len(), released);
            }
        }
        r.map_err(RecvError::from)
    }

    /// Shut down the sending side (FIN after queued data).
    pub fn shutdown(&mut self, h: SocketHandle) {
        if let Some(e) = self.entry_mut(h) {
            e.conn.close();
            self.mark_dirty(h.idx);
        }
    }

    /// Close: shut down sending and release the handle. The connection finishes its close
    /// (FIN exchange, TIME-WAIT) on its own and is reclaimed afterwards; a peer that never
    /// sends its FIN is reset after `TcpConfig::fin_timeout` in FIN-WAIT-2.
    pub fn close(&mut self, h: SocketHandle) {
        if let Some(e) = self.entry_mut(h) {
            if e.conn.recv_available() > 0 {
                // RFC 9293 §3.6.1 (SHLD-3): closing with received data unread loses it; a
                // RST tells the peer so, where a FIN would claim an orderly close.
                e.conn.abort();
            } else {
                e.conn.close();
            }
            e.conn.set_orphaned();
            e.owner = Owner::Released;
            self.mark_dirty(h.idx);
            self.account(h.idx);
        }
    }

    /// Set the DiffServ codepoint (0..=63) of the connection's segments from now on (RFC
    /// 9293 §3.9.1 MUST-48: the application specifies it; passed to IP unchanged, SHLD-22;
    /// changeable during the connection, SHLD-21). The ECN bits stay 0. Returns false for a
    /// stale handle or a value above 63.
    pub fn set_dscp(&mut self, h: SocketHandle, dscp: u8) -> bool {
        if dscp > 63 {
            return false;
        }
        let Some(e) = self.entry_mut(h) else {
            return false;
        };
        if e.dscp != dscp {
            e.dscp = dscp;
            // The header template carries it: rebuilt for the next segment.
            e.tmpl = None;
        }
        true
    }

    /// The connection's soft error, if any (RFC 9293 §3.9.1.8 MUST-47): R1 timeouts in a
    /// row (SHLD-9) or an ICMP net/host unreachable quoting data in flight (SHLD-25); the
    /// connection goes on, and forward progress clears it. `None` for a stale handle.
    pub fn soft_error(&self, h: SocketHandle) -> Option<SoftError> {
        self.connection(h)?.soft_error()
    }

    /// Set R2, the RTO expiries in a row before the connection is aborted (`Timeout`), for
    /// this connection alone (RFC 9293 §3.8.3 MUST-21). Returns false for a stale handle.
    pub fn set_max_retries(&mut self, h: SocketHandle, retries: u32) -> bool {
        let Some(e) = self.entry_mut(h) else {
            return false;
        };
        e.conn.set_max_retries(retries);
        true
    }

    /// Turn Nagle's algorithm on or off for this connection alone (RFC 9293 §3.7.4
    /// MUST-17: TCP_NODELAY). Returns false for a stale handle.
    pub fn set_nagle(&mut self, h: SocketHandle, on: bool) -> bool {
        let Some(e) = self.entry_mut(h) else {
            return false;
        };
        e.conn.set_nagle(on);
        // Data Nagle held may go now.
        self.mark_dirty(h.idx);
        true
    }

    /// The application closed the connection but still hands it the bytes it had queued
    /// (an LD_PRELOAD shim's send queue, which the stack's send buffer could not take at
    /// the close): the rules of a closed connection apply from now on while the handle
    /// stays valid for those sends and the final [`close`](Self::close). Above all, zero-
    /// window probes count toward R2 even when the peer answers them (RFC 9293 §3.8.6.1,
    /// RFC 6429: a peer holding its window shut cannot pin a closed connection; Linux's
    /// orphan limit), so such a connection ends with `Timeout` instead of waiting for
    /// ever; data that arrives is answered with RST, and FIN-WAIT-2 is bounded by
    /// `TcpConfig::fin_timeout`. Returns false for a stale handle.
    pub fn orphan(&mut self, h: SocketHandle) -> bool {
        let Some(e) = self.entry_mut(h) else {
            return false;
        };
        e.conn.set_orphaned();
        true
    }

    /// Abort with RST and release the handle.
    pub fn abort(&mut self, h: SocketHandle) {
        if let Some(e) = self.entry_mut(h) {
            e.conn.abort();
            e.conn.set_orphaned();
            e.owner = Owner::Released;
            self.mark_dirty(h.idx);
            self.account(h.idx);
        }
    }

    /// The next readiness event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Whether [`Stack::poll_event`] has an event (a cheap check for a poll loop's
    /// idle iterations).
    #[inline]
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Until [`release_acks`](Self::release_acks), [`poll_transmit`](Self::poll_transmit)
    /// skips a connection whose only output is a pure ACK: a poll loop that answers the
    /// first part of a receive burst before it reads the rest (r2c's `rx_split`) sends its
    /// replies early, while an ACK waits to cover the rest of the burst too, one ACK per
    /// burst as if it had been read whole. (A receiver of a bulk flow would otherwise
    /// send two, and its sender read twice as many.) A data segment still carries its
    /// ACK at once.
    pub fn hold_acks(&mut self) {
        self.holding_acks = true;
    }

    /// Ends [`hold_acks`](Self::hold_acks): the held connections are due again (their
    /// ACKs go out on the next [`poll_transmit`](Self::poll_transmit) calls). One that
    /// sent its ACK meanwhile (with data or a reset, which are never held), or whose slot
    /// was freed, is not listed again.
    pub fn release_acks(&mut self) {
        self.holding_acks = false;
        for (idx, gen) in self.held_acks.drain(..) {
            let slot = &mut self.slots[idx as usize];
            if slot.gen != gen {
                continue;
            }
            if let Some(e) = slot.entry.as_deref_mut() {
                if !e.dirty && !e.conn.nothing_to_send() {
                    e.dirty = true;
                    self.dirty.push_back(idx);
                }
            }
        }
    }

    /// Tests and fuzzing: panics unless every connection marked for output is on the
    /// transmit list, and no ACK is held while none may be ([`Stack::hold_acks`]).
    #[cfg(any(test, feature = "testutils"))]
    pub fn check_transmit_list(&self) {
        for (idx, slot) in self.slots.iter().enumerate() {
            if let Some(e) = slot.entry.as_deref() {
                assert!(
                    !e.dirty || self.dirty.contains(&(idx as u32)),
                    "connection {idx} is marked for output but not listed"
                );
            }
        }
        assert!(
            self.holding_acks || self.held_acks.is_empty(),
            "ACKs held after release_acks"
        );
    }

    /// Whether [`Stack::poll_transmit`] may have a frame: `false` means it certainly has
    /// none (no control frame queued, no connection marked for output, no burst being
    /// cut into frames), so a poll loop can skip the call on idle iterations.
    #[inline]
    pub fn may_transmit(&self) -> bool {
        !self.ctl.is_empty() || !self.dirty.is_empty() || !self.run.is_idle()
    }
}
