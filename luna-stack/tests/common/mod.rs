//! Shared pieces of the integration tests: a smoltcp host on the simulated link, an
//! endpoint-agnostic socket trait, and the bulk and request/response workloads.
#![allow(dead_code)]

use luna_stack::stack::{Event, ListenerHandle, SocketHandle};
use luna_stack::stack::{RecvError, SendError};
use luna_stack::testutil::{pattern, Endpoint, FakeRng, LunaHost, StreamCheck};
use luna_stack::time::Instant;
use smoltcp::iface::{Config, Interface, SocketHandle as SmolHandle, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::wire::{EthernetAddress as SmolMac, HardwareAddress, IpAddress, IpCidr};
use std::cell::Cell;
use std::collections::VecDeque;
use zbuf::Zbuf;

pub use luna_stack::context::Rng as _;

thread_local! {
    /// Virtual milliseconds for smoltcp's timestamp generator (a plain `fn() -> u32`).
    static VIRTUAL_MS: Cell<u32> = const { Cell::new(0) };
}

fn virtual_tsval() -> u32 {
    VIRTUAL_MS.with(Cell::get)
}

pub fn to_smol(t: Instant) -> smoltcp::time::Instant {
    smoltcp::time::Instant::from_micros(t.as_micros() as i64)
}

pub fn from_smol(t: smoltcp::time::Instant) -> Instant {
    Instant::from_micros(t.total_micros().max(0) as u64)
}

/// The in-memory device smoltcp polls.
pub struct SimDevice {
    pub rx: VecDeque<Vec<u8>>,
    pub tx: Vec<Vec<u8>>,
    /// Largest frame including the Ethernet header (smoltcp's convention).
    pub max_frame: usize,
}

impl Default for SimDevice {
    fn default() -> Self {
        SimDevice {
            rx: VecDeque::new(),
            tx: Vec::new(),
            max_frame: 1514,
        }
    }
}

pub struct RxTok(Vec<u8>);
pub struct TxTok<'a>(&'a mut Vec<Vec<u8>>);

impl phy::RxToken for RxTok {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for TxTok<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = vec![0u8; len];
        let r = f(&mut buf);
        self.0.push(buf);
        r
    }
}

impl phy::Device for SimDevice {
    type RxToken<'a> = RxTok;
    type TxToken<'a> = TxTok<'a>;

    fn receive(&mut self, _t: smoltcp::time::Instant) -> Option<(RxTok, TxTok<'_>)> {
        let f = self.rx.pop_front()?;
        Some((RxTok(f), TxTok(&mut self.tx)))
    }

    fn transmit(&mut self, _t: smoltcp::time::Instant) -> Option<TxTok<'_>> {
        Some(TxTok(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.max_frame;
        caps
    }
}

/// A smoltcp interface with its sockets on the simulated link.
pub struct SmolHost {
    pub iface: Interface,
    pub dev: SimDevice,
    pub sockets: SocketSet<'static>,
    /// Frames that arrived with a bad checksum (smoltcp has no counters; the link told us).
    pub frames_in: u64,
}

impl SmolHost {
    pub fn new(mac: [u8; 6], ip: [u8; 4], seed: u64) -> SmolHost {
        SmolHost::with_mtu(mac, ip, seed, 1500)
    }

    /// A host whose device carries IP packets of up to `mtu` bytes.
    pub fn with_mtu(mac: [u8; 6], ip: [u8; 4], seed: u64, mtu: usize) -> SmolHost {
        let mut dev = SimDevice {
            max_frame: mtu + 14,
            ..SimDevice::default()
        };
        let mut cfg = Config::new(HardwareAddress::Ethernet(SmolMac(mac)));
        cfg.random_seed = seed;
        let mut iface = Interface::new(cfg, &mut dev, smoltcp::time::Instant::from_micros(0));
        iface.update_ip_addrs(|a| {
            a.push(IpCidr::new(IpAddress::v4(ip[0], ip[1], ip[2], ip[3]), 24))
                .expect("one address fits");
        });
        SmolHost {
            iface,
            dev,
            sockets: SocketSet::new(Vec::new()),
            frames_in: 0,
        }
    }

    /// A TCP socket with `buf` bytes of buffer each way; timestamps on when `ts`.
    pub fn socket(&mut self, buf: usize, ts: bool) -> SmolHandle {
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; buf]),
            tcp::SocketBuffer::new(vec![0u8; buf]),
        );
        if ts {
            s.set_tsval_generator(Some(virtual_tsval));
        }
        self.sockets.add(s)
    }

    pub fn tcp(&mut self, h: SmolHandle) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket>(h)
    }

    pub fn listen(&mut self, port: u16, buf: usize, ts: bool) -> SmolHandle {
        let h = self.socket(buf, ts);
        self.tcp(h).listen(port).expect("listen");
        h
    }

    pub fn connect(
        &mut self,
        ip: [u8; 4],
        port: u16,
        local: u16,
        buf: usize,
        ts: bool,
    ) -> SmolHandle {
        let h = self.socket(buf, ts);
        let remote = (IpAddress::v4(ip[0], ip[1], ip[2], ip[3]), port);
        let sock = self.sockets.get_mut::<tcp::Socket>(h);
        sock.connect(self.iface.context(), remote, local)
            .expect("connect");
        h
    }
}

impl Endpoint for SmolHost {
    fn receive(&mut self, _now: Instant, frame: Vec<u8>) {
        self.frames_in += 1;
        self.dev.rx.push_back(frame);
    }

    fn poll(&mut self, now: Instant, out: &mut Vec<Vec<u8>>) {
        VIRTUAL_MS.with(|c| c.set((now.as_nanos() / 1_000_000) as u32));
        self.iface
            .poll(to_smol(now), &mut self.dev, &mut self.sockets);
        out.append(&mut self.dev.tx);
    }

    fn next_wakeup(&mut self, now: Instant) -> Option<Instant> {
        if !self.dev.rx.is_empty() {
            return Some(now);
        }
        self.iface
            .poll_at(to_smol(now), &self.sockets)
            .map(|t| from_smol(t).max(now))
    }
}

/// What a non-blocking read found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadStatus {
    /// Nothing more now.
    Pending,
    /// The peer finished its stream and everything was read.
    Eof,
}

/// The socket operations the workloads need, for luna and smoltcp alike.
pub trait Sockets {
    type H: Copy + std::fmt::Debug;
    /// Queue as much of `data` as fits; bytes taken.
    fn send(&mut self, h: Self::H, data: &[u8]) -> Result<usize, String>;
    /// Read everything available into `sink`.
    fn read(
        &mut self,
        h: Self::H,
        sink: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<ReadStatus, String>;
    /// Shut down the sending side (FIN after the queued data).
    fn shutdown(&mut self, h: Self::H);
    /// A one-line description of the socket for failure reports.
    fn describe(&self, h: Self::H) -> String;
}

impl Sockets for LunaHost<FakeRng> {
    type H = SocketHandle;

    fn send(&mut self, h: SocketHandle, data: &[u8]) -> Result<usize, String> {
        match self.stack.send(h, &Zbuf::copy_from_slice(data)) {
            Ok(n) => Ok(n),
            Err(SendError::WouldBlock) => Ok(0),
            Err(e) => Err(format!("luna send: {e:?}")),
        }
    }

    fn read(
        &mut self,
        h: SocketHandle,
        sink: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<ReadStatus, String> {
        loop {
            match self.stack.recv(h) {
                Ok(Some(z)) => sink(&z)?,
                Ok(None) => return Ok(ReadStatus::Pending),
                Err(RecvError::Finished) => return Ok(ReadStatus::Eof),
                Err(e) => return Err(format!("luna recv: {e:?} ({})", self.describe(h))),
            }
        }
    }

    fn shutdown(&mut self, h: SocketHandle) {
        self.stack.shutdown(h);
    }

    fn describe(&self, h: SocketHandle) -> String {
        match self.stack.connection(h) {
            Some(c) => format!(
                "luna {c:?} close_reason {:?} counters {:?}",
                c.close_reason(),
                c.counters
            ),
            None => "luna: stale handle".into(),
        }
    }
}

impl Sockets for SmolHost {
    type H = SmolHandle;

    fn send(&mut self, h: SmolHandle, data: &[u8]) -> Result<usize, String> {
        let s = self.tcp(h);
        if !s.may_send() {
            return if matches!(
                s.state(),
                tcp::State::Listen | tcp::State::SynSent | tcp::State::SynReceived
            ) {
                Ok(0)
            } else {
                Err(format!("smoltcp send in state {}", s.state()))
            };
        }
        s.send_slice(data)
            .map_err(|e| format!("smoltcp send: {e:?}"))
    }

    fn read(
        &mut self,
        h: SmolHandle,
        sink: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<ReadStatus, String> {
        let s = self.sockets.get_mut::<tcp::Socket>(h);
        let mut buf = [0u8; 16384];
        loop {
            match s.recv_slice(&mut buf) {
                Ok(0) => return Ok(ReadStatus::Pending),
                Ok(n) => sink(&buf[..n])?,
                Err(tcp::RecvError::Finished) => return Ok(ReadStatus::Eof),
                Err(tcp::RecvError::InvalidState) => {
                    return if matches!(
                        s.state(),
                        tcp::State::Listen | tcp::State::SynSent | tcp::State::SynReceived
                    ) {
                        Ok(ReadStatus::Pending)
                    } else {
                        Err(format!("smoltcp recv in state {}", s.state()))
                    }
                }
            }
        }
    }

    fn shutdown(&mut self, h: SmolHandle) {
        self.tcp(h).close();
    }

    fn describe(&self, h: SmolHandle) -> String {
        let s = self.sockets.get::<tcp::Socket>(h);
        format!(
            "smoltcp state {} send_queue {} recv_queue {}",
            s.state(),
            s.send_queue(),
            s.recv_queue()
        )
    }
}

/// Accept connections from a luna listener as they become ready.
pub fn luna_accept(host: &mut LunaHost<FakeRng>, l: ListenerHandle) -> Option<SocketHandle> {
    while let Some(ev) = host.stack.poll_event() {
        let _ = ev;
    }
    host.stack.accept(l)
}

/// Drain luna events (the workloads poll sockets directly).
pub fn drain_events(host: &mut LunaHost<FakeRng>) -> Vec<Event> {
    std::iter::from_fn(|| host.stack.poll_event()).collect()
}

/// A full-duplex bulk transfer on one connection: each side sends `len` bytes of its own
/// stream, then shuts down, and checks the peer's stream until end of stream.
#[derive(Debug, Clone)]
pub struct Bulk {
    tx_salt: u64,
    tx_len: u64,
    tx_done: u64,
    shut: bool,
    rx: StreamCheck,
    rx_len: u64,
    chunk: usize,
    pending: Vec<u8>,
}

impl Bulk {
    pub fn new(tx_salt: u64, tx_len: u64, rx_salt: u64, rx_len: u64) -> Bulk {
        Bulk {
            tx_salt,
            tx_len,
            tx_done: 0,
            shut: false,
            rx: StreamCheck::new(rx_salt),
            rx_len,
            chunk: 16384,
            pending: Vec::new(),
        }
    }

    /// Make progress; errors are byte mismatches or socket failures.
    pub fn poll<S: Sockets>(&mut self, s: &mut S, h: S::H) -> Result<(), String> {
        while self.tx_done < self.tx_len {
            // The chunk is generated once and kept until the socket has taken all of it.
            if self.pending.is_empty() {
                let n = (self.tx_len - self.tx_done).min(self.chunk as u64) as usize;
                self.pending = pattern(self.tx_salt, self.tx_done, n);
            }
            let took = s.send(h, &self.pending)?;
            self.tx_done += took as u64;
            self.pending.drain(..took);
            if !self.pending.is_empty() {
                break;
            }
        }
        if self.tx_done == self.tx_len && !self.shut {
            s.shutdown(h);
            self.shut = true;
        }
        if !self.rx.eof {
            let rx = &mut self.rx;
            if s.read(h, &mut |d| rx.feed(d))? == ReadStatus::Eof {
                if rx.received != self.rx_len {
                    return Err(format!(
                        "end of stream after {} of {} bytes",
                        rx.received, self.rx_len
                    ));
                }
                rx.eof = true;
            }
        }
        if self.rx.received > self.rx_len {
            return Err(format!(
                "received {} > {} bytes",
                self.rx.received, self.rx_len
            ));
        }
        Ok(())
    }

    pub fn done(&self) -> bool {
        self.shut && self.rx.eof
    }

    pub fn progress(&self) -> String {
        format!(
            "bulk sent {}/{} received {}/{} eof {}",
            self.tx_done, self.tx_len, self.rx.received, self.rx_len, self.rx.eof
        )
    }
}

/// The RPC schedule both sides derive from one seed: (request size, response size).
pub fn rpc_schedule(seed: u64, count: usize, min: usize, max: usize) -> Vec<(usize, usize)> {
    let mut r = FakeRng::new(seed ^ 0x5EED_0F4C);
    let span = (max - min + 1) as u32;
    (0..count)
        .map(|_| {
            (
                min + (r.next_u32() % span) as usize,
                min + (r.next_u32() % span) as usize,
            )
        })
        .collect()
}

/// Request/response: the client sends request i only after response i-1 arrived in full;
/// the server answers each request once all of it arrived. Both streams are checked.
#[derive(Debug, Clone)]
pub struct Rpc {
    schedule: Vec<(usize, usize)>,
    client: bool,
    /// Index of the RPC in progress.
    idx: usize,
    /// Bytes of the current outgoing message still to send.
    tx_pending: usize,
    tx_off: u64,
    tx_salt: u64,
    /// Bytes of the current incoming message received.
    rx_msg: usize,
    rx: StreamCheck,
    shut: bool,
    eof: bool,
}

impl Rpc {
    pub fn new(schedule: Vec<(usize, usize)>, client: bool, salt: u64) -> Rpc {
        let (tx_salt, rx_salt) = if client {
            (salt, salt + 1)
        } else {
            (salt + 1, salt)
        };
        let first = if client {
            schedule.first().map_or(0, |r| r.0)
        } else {
            0
        };
        Rpc {
            schedule,
            client,
            idx: 0,
            tx_pending: first,
            tx_off: 0,
            tx_salt,
            rx_msg: 0,
            rx: StreamCheck::new(rx_salt),
            shut: false,
            eof: false,
        }
    }

    fn rx_want(&self) -> usize {
        match self.schedule.get(self.idx) {
            Some(&(req, resp)) => {
                if self.client {
                    resp
                } else {
                    req
                }
            }
            None => 0,
        }
    }

    pub fn poll<S: Sockets>(&mut self, s: &mut S, h: S::H) -> Result<(), String> {
        loop {
            // Send what is pending of the current outgoing message.
            while self.tx_pending > 0 {
                let data = pattern(self.tx_salt, self.tx_off, self.tx_pending);
                let took = s.send(h, &data)?;
                self.tx_pending -= took;
                self.tx_off += took as u64;
                if self.tx_pending > 0 {
                    return self.read_some(s, h);
                }
            }
            if self.idx >= self.schedule.len() {
                if !self.shut && (self.client || self.eof) {
                    s.shutdown(h);
                    self.shut = true;
                }
                if !self.eof {
                    self.read_some(s, h)?;
                }
                return Ok(());
            }
            // Receive the current incoming message (requests never overlap: the peer sends
            // the next only after our answer).
            let before = self.rx_msg;
            self.read_some(s, h)?;
            if self.rx_msg < self.rx_want() {
                return Ok(());
            }
            if self.rx_msg > self.rx_want() {
                return Err(format!(
                    "rpc {}: {} bytes, expected {}",
                    self.idx,
                    self.rx_msg,
                    self.rx_want()
                ));
            }
            let _ = before;
            // Message complete.
            self.rx_msg = 0;
            let (_, resp) = self.schedule[self.idx];
            if self.client {
                self.idx += 1;
                if let Some(&(req, _)) = self.schedule.get(self.idx) {
                    self.tx_pending = req;
                }
            } else {
                self.tx_pending = resp;
                self.idx += 1;
            }
        }
    }

    /// Read at most the rest of the current incoming message (more would be a protocol
    /// violation by the peer, reported by the caller).
    fn read_some<S: Sockets>(&mut self, s: &mut S, h: S::H) -> Result<(), String> {
        if self.eof {
            return Ok(());
        }
        let rx = &mut self.rx;
        let msg = &mut self.rx_msg;
        if s.read(h, &mut |d| {
            *msg += d.len();
            rx.feed(d)
        })? == ReadStatus::Eof
        {
            if self.idx < self.schedule.len() {
                return Err(format!("end of stream during rpc {}", self.idx));
            }
            self.eof = true;
        }
        Ok(())
    }

    pub fn done(&self) -> bool {
        self.idx >= self.schedule.len() && self.shut && self.eof && self.tx_pending == 0
    }

    pub fn progress(&self) -> String {
        format!(
            "rpc {}/{} rx_msg {} tx_pending {} shut {} eof {}",
            self.idx,
            self.schedule.len(),
            self.rx_msg,
            self.tx_pending,
            self.shut,
            self.eof
        )
    }
}
