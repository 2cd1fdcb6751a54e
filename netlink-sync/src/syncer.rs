//! The I/O driver: a synchronous `NETLINK_ROUTE` socket that subscribes, dumps, then follows.
//!
//! Order (docs/netlink-sync.md): join `RTNLGRP_LINK`, `RTNLGRP_NEIGH`, `RTNLGRP_IPV4_IFADDR`
//! and `RTNLGRP_IPV4_ROUTE` first, then dump links, addresses, routes and neighbours one after the
//! other (the kernel runs one dump per socket at a time). Notifications that arrive during
//! the dumps are applied too; since every change is keyed and later messages on the socket
//! are newer, the result is the kernel's state. A (re-)dump fills a fresh [`Mirror`] while
//! readers keep the last complete snapshot; it replaces the tables when the last dump ends.
//!
//! Resync rule: `ENOBUFS` on `recv` (notifications were dropped), `NLMSG_OVERRUN`, a
//! datagram that did not fit the buffer or could not be walked, or a dump flagged
//! `NLM_F_DUMP_INTR`, and the interface going up or down (the kernel flushes IPv4 routes
//! of a downed interface without `RTM_DELROUTE`) each start a full re-dump, counted in
//! [`SyncCounters::resyncs`].

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLMSG_DONE, NLMSG_ERROR, NLM_F_DUMP,
    NLM_F_MULTIPART, NLM_F_REQUEST,
};
use netlink_packet_route::address::AddressMessage;
use netlink_packet_route::link::LinkMessage;
use netlink_packet_route::neighbour::NeighbourMessage;
use netlink_packet_route::route::RouteMessage;
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket};
use nix::poll::{PollFd, PollFlags, PollTimeout};

use crate::mirror::{Mirror, Outcome, SyncCounters};
use crate::snapshot::{Publisher, Reader, Snapshot};
use crate::trace::{SyncTrace, TraceEvent, TraceHandle};

const RTNLGRP_LINK: u32 = 1;
const RTNLGRP_NEIGH: u32 = 3;
const RTNLGRP_IPV4_IFADDR: u32 = 5;
const RTNLGRP_IPV4_ROUTE: u32 = 7;
/// Big enough for any dump datagram (the kernel sizes them at most 32 KiB).
const RECV_BUF: usize = 64 * 1024;
/// Datagrams read per poll before publishing, so a flood cannot delay publication forever.
const MAX_BATCH: usize = 256;

/// The interface to mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interface {
    /// By index.
    Index(u32),
    /// By name (resolved once, after subscribing).
    Name(String),
}

/// Settings of a [`Syncer`].
#[derive(Debug, Clone)]
pub struct SyncConfig {
    /// `SO_RCVBUF` of the netlink socket; `None` keeps the system default. A tiny value
    /// forces overruns (tests do that).
    pub rcvbuf: Option<usize>,
    /// How long [`Syncer::open`] waits for the initial dumps.
    pub dump_timeout: Duration,
    /// After an overrun the receive buffer is doubled, up to this many bytes
    /// (`SO_RCVBUFFORCE` with `CAP_NET_ADMIN`, else `SO_RCVBUF`, capped by `rmem_max`), so
    /// sustained churn does not re-dump forever. `0` disables growing.
    pub max_rcvbuf: usize,
}

impl Default for SyncConfig {
    fn default() -> Self {
        SyncConfig {
            rcvbuf: None,
            dump_timeout: Duration::from_secs(5),
            max_rcvbuf: 8 << 20,
        }
    }
}

/// Errors of the syncer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A socket call failed.
    #[error("netlink socket: {what}: {source}")]
    Socket {
        /// The call.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The interface does not exist (in this network namespace).
    #[error("no interface {0} in this network namespace")]
    NoSuchInterface(String),
    /// The kernel deleted the interface we mirror; the last snapshot says so too.
    #[error("interface {ifindex} disappeared (RTM_DELLINK)")]
    InterfaceGone {
        /// Its index.
        ifindex: u32,
    },
    /// The kernel answered a dump request with an error.
    #[error("kernel refused the {what} dump: errno {errno}")]
    DumpFailed {
        /// Which dump.
        what: &'static str,
        /// The (positive) errno.
        errno: i32,
    },
    /// The initial dumps did not end in time.
    #[error("initial dump did not complete within {0:?}")]
    DumpTimeout(Duration),
}

/// Result of the syncer.
pub type Result<T> = std::result::Result<T, Error>;

fn sock_err(what: &'static str) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::Socket { what, source }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dump {
    Links,
    Addresses,
    Routes,
    Neighbours,
}

impl Dump {
    fn name(self) -> &'static str {
        match self {
            Dump::Links => "link",
            Dump::Addresses => "address",
            Dump::Routes => "route",
            Dump::Neighbours => "neighbour",
        }
    }

    fn request(self) -> RouteNetlinkMessage {
        match self {
            Dump::Links => RouteNetlinkMessage::GetLink(LinkMessage::default()),
            Dump::Addresses => {
                let mut m = AddressMessage::default();
                m.header.family = AddressFamily::Inet;
                RouteNetlinkMessage::GetAddress(m)
            }
            Dump::Routes => {
                let mut m = RouteMessage::default();
                m.header.address_family = AddressFamily::Inet;
                RouteNetlinkMessage::GetRoute(m)
            }
            Dump::Neighbours => {
                let mut m = NeighbourMessage::default();
                m.header.family = AddressFamily::Inet;
                RouteNetlinkMessage::GetNeighbour(m)
            }
        }
    }
}

/// What one [`Syncer::poll`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollStatus {
    /// Datagrams read.
    pub datagrams: usize,
    /// A new snapshot was published.
    pub published: bool,
    /// A re-dump is in progress (readers see the last complete snapshot).
    pub resyncing: bool,
}

/// Follows the kernel's tables of one interface and publishes them to readers.
pub struct Syncer {
    sock: Socket,
    mirror: Mirror,
    /// The mirror being refilled by a (re-)dump.
    staging: Option<Mirror>,
    queued: VecDeque<Dump>,
    in_flight: Option<(Dump, u32)>,
    /// The dump in flight belongs to a re-dump that was started over (an overrun, a
    /// truncated datagram, an interrupted dump): its replies are awaited (one dump per
    /// socket) but not applied, since they may predate notifications the kernel lost.
    in_flight_abandoned: bool,
    /// An overrun happened and no recv has found the socket empty since: the kernel is
    /// still dropping this socket's notifications without a word (its congestion mark is
    /// cleared only by a recv that finds the queue empty), so a dump asked for now could
    /// miss a change made while it runs. The next request waits for that recv.
    await_empty: bool,
    seq: u32,
    dirty: bool,
    version: u64,
    publisher: Arc<Publisher>,
    buf: Vec<u8>,
    max_rcvbuf: usize,
    /// When the dump in flight was requested.
    in_flight_sent: Instant,
    trace: SyncTrace,
    trace_out: TraceHandle,
}

impl std::fmt::Debug for Syncer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Syncer")
            .field("ifindex", &self.mirror.ifindex())
            .field("version", &self.version)
            .field("resyncing", &self.staging.is_some())
            .finish()
    }
}

impl Syncer {
    /// Subscribes, resolves `iface`, dumps, and publishes the first snapshot. Uses the
    /// network namespace of the calling thread (the socket stays in it afterwards).
    pub fn open(iface: Interface, config: &SyncConfig) -> Result<Syncer> {
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(sock_err("socket"))?;
        if let Some(size) = config.rcvbuf {
            let size = i32::try_from(size).unwrap_or(i32::MAX);
            sock.set_rx_buf_sz(size).map_err(sock_err("SO_RCVBUF"))?;
        }
        let addr = sock.bind_auto().map_err(sock_err("bind"))?;
        // Subscribe before resolving and dumping, so no change falls in between.
        for g in [
            RTNLGRP_LINK,
            RTNLGRP_NEIGH,
            RTNLGRP_IPV4_IFADDR,
            RTNLGRP_IPV4_ROUTE,
        ] {
            sock.add_membership(g)
                .map_err(sock_err("NETLINK_ADD_MEMBERSHIP"))?;
        }
        sock.set_non_blocking(true)
            .map_err(sock_err("O_NONBLOCK"))?;
        let ifindex = resolve(&iface)?;
        let publisher = Arc::new(Publisher::new(Snapshot::empty(ifindex)));
        let mut s = Syncer {
            sock,
            mirror: Mirror::new(ifindex),
            staging: None,
            queued: VecDeque::new(),
            in_flight: None,
            in_flight_abandoned: false,
            await_empty: false,
            seq: 0,
            dirty: false,
            version: 0,
            publisher,
            buf: Vec::with_capacity(RECV_BUF),
            max_rcvbuf: config.max_rcvbuf,
            in_flight_sent: Instant::now(),
            trace: SyncTrace {
                port_id: addr.port_number(),
                ..SyncTrace::default()
            },
            trace_out: TraceHandle::default(),
        };
        s.trace.rcvbuf = s.sock.get_rx_buf_sz().unwrap_or(0);
        s.start_resync()?;
        let deadline = Instant::now() + config.dump_timeout;
        while s.staging.is_some() {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::DumpTimeout(config.dump_timeout));
            }
            s.poll((deadline - now).min(Duration::from_millis(100)))?;
        }
        Ok(s)
    }

    /// The mirrored interface index.
    pub fn ifindex(&self) -> u32 {
        self.mirror.ifindex()
    }

    /// A reader for one core (any number; each is `Send`).
    pub fn reader(&self) -> Reader {
        self.publisher.reader()
    }

    /// The publisher, to make readers after the syncer moved into its thread.
    pub fn publisher(&self) -> Arc<Publisher> {
        Arc::clone(&self.publisher)
    }

    /// The counters so far.
    pub fn counters(&self) -> SyncCounters {
        *self.mirror.counters()
    }

    /// What this syncer saw, refreshed at the end of every [`Syncer::poll`] (also after it
    /// moved into its thread): socket calls, datagrams by kind, the dump in flight, the
    /// live counters and the last events. For failure messages.
    pub fn trace(&self) -> TraceHandle {
        self.trace_out.clone()
    }

    /// Copies the live state into the trace handle.
    fn flush_trace(&mut self) {
        let t = &mut self.trace;
        t.in_flight = self
            .in_flight
            .map(|(dump, seq)| (dump.name(), seq, self.in_flight_sent));
        t.in_flight_abandoned = self.in_flight_abandoned;
        t.staging = self.staging.is_some();
        t.queued = self.queued.len();
        t.version = self.version;
        t.counters = *self.mirror.counters();
        self.trace_out.set(&self.trace);
    }

    /// Waits up to `timeout` for netlink messages, applies them, and publishes a snapshot if
    /// anything changed. Returns [`Error::InterfaceGone`] once the interface is deleted
    /// (after publishing a snapshot that says so), and on every call after.
    pub fn poll(&mut self, timeout: Duration) -> Result<PollStatus> {
        let r = self.poll_once(timeout);
        self.flush_trace();
        r
    }

    fn poll_once(&mut self, timeout: Duration) -> Result<PollStatus> {
        if self.mirror.interface_gone() {
            return Err(Error::InterfaceGone {
                ifindex: self.ifindex(),
            });
        }
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        {
            let mut fds = [PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
            self.trace.polls += 1;
            match nix::poll::poll(&mut fds, PollTimeout::from(ms)) {
                Ok(n) => self.trace.polls_readable += u64::from(n > 0),
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    return Err(Error::Socket {
                        what: "poll",
                        source: e.into(),
                    })
                }
            }
        }
        let mut status = PollStatus::default();
        while status.datagrams < MAX_BATCH {
            self.buf.clear();
            match self.sock.recv(&mut self.buf, libc::MSG_TRUNC) {
                Ok(n) => {
                    status.datagrams += 1;
                    if n > self.buf.len() {
                        // Truncated: part of a dump or some notifications are lost.
                        self.trace.datagrams += 1;
                        self.trace.event(TraceEvent::Truncated { len: n });
                        self.mirror.counters_mut().malformed += 1;
                        self.start_resync()?;
                        continue;
                    }
                    self.trace
                        .datagram(&self.buf, self.in_flight.map(|(_, seq)| seq));
                    self.on_datagram()?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.trace.would_block += 1;
                    if self.on_empty()? {
                        // The re-dump's request went out: read its first replies now.
                        continue;
                    }
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    self.trace.enobufs += 1;
                    self.trace.event(TraceEvent::RecvError {
                        errno: libc::ENOBUFS,
                    });
                    self.overrun()?
                }
                Err(e) => {
                    self.trace.event(TraceEvent::RecvError {
                        errno: e.raw_os_error().unwrap_or(0),
                    });
                    return Err(Error::Socket {
                        what: "recv",
                        source: e,
                    });
                }
            }
        }
        status.published = self.publish_if_dirty();
        status.resyncing = self.staging.is_some();
        if self.mirror.interface_gone() {
            return Err(Error::InterfaceGone {
                ifindex: self.ifindex(),
            });
        }
        Ok(status)
    }

    /// Polls until `stop` is set or an error (such as [`Error::InterfaceGone`]) ends it.
    pub fn run(mut self, stop: &AtomicBool) -> Result<()> {
        while !stop.load(Ordering::Relaxed) {
            self.poll(Duration::from_millis(50))?;
        }
        Ok(())
    }

    fn on_datagram(&mut self) -> Result<()> {
        if self.in_flight_abandoned && self.is_reply_of_in_flight() {
            // Parsed for its end (and errors) only; its tables go nowhere.
            let mut scratch = Mirror::new(self.ifindex());
            let out = scratch.apply_datagram(&self.buf);
            return self.after_dump_reply(&out);
        }
        let target = self.staging.as_mut().unwrap_or(&mut self.mirror);
        let out = target.apply_datagram(&self.buf);
        let gone = target.interface_gone();
        self.dirty |= out.changed;
        if gone && self.staging.is_some() {
            // Nothing to wait for: the interface is gone; say so now.
            self.finish_staging();
            return Ok(());
        }
        if out.overrun || out.truncated || out.dump_interrupted || out.link_flapped {
            if out.overrun {
                self.mirror.counters_mut().overruns += 1;
            }
            // Start over first: the dump in flight (if any) is abandoned, so its end in
            // this very datagram (the kernel often puts `NLMSG_DONE` after the last
            // entries) sends the re-dump's first request rather than finishing a staging
            // mirror that may miss what the kernel lost.
            self.start_resync()?;
            return self.after_dump_reply(&out);
        }
        self.after_dump_reply(&out)
    }

    /// Whether the datagram in `buf` is a reply to the dump in flight (its first message
    /// is a multipart dump message, `NLMSG_DONE` or `NLMSG_ERROR` with the dump's sequence
    /// number; notifications are never multipart).
    fn is_reply_of_in_flight(&self) -> bool {
        let Some((_, seq)) = self.in_flight else {
            return false;
        };
        let b = &self.buf;
        if b.len() < 16 {
            return false;
        }
        let kind = u16::from_ne_bytes([b[4], b[5]]);
        let flags = u16::from_ne_bytes([b[6], b[7]]);
        let s = u32::from_ne_bytes([b[8], b[9], b[10], b[11]]);
        s == seq && (flags & NLM_F_MULTIPART != 0 || kind == NLMSG_DONE || kind == NLMSG_ERROR)
    }

    /// Follows the dump in flight: retries on `EBUSY`, moves on at its `NLMSG_DONE`.
    fn after_dump_reply(&mut self, out: &Outcome) -> Result<()> {
        for (seq, code) in &out.errors {
            if let Some((dump, s)) = self.in_flight {
                if s == *seq {
                    let errno = -code;
                    if errno == libc::EBUSY || errno == libc::EINTR {
                        self.in_flight = None;
                        if !std::mem::take(&mut self.in_flight_abandoned) {
                            self.queued.push_front(dump);
                        }
                        self.send_next()?;
                        continue;
                    }
                    if errno == libc::ENOBUFS {
                        // The kernel could not fit the dump's first reply into our
                        // receive buffer (a burst of notifications filled it): an overrun
                        // like ENOBUFS on recv — grow the buffer and dump everything
                        // again. But the kernel has not given this dump up: it stays the
                        // socket's running dump and goes on (same sequence number, up to
                        // its NLMSG_DONE) once we read the buffer down. So it is abandoned,
                        // not ended: a request sent now would be refused with EBUSY, and
                        // that refusal is lost when the buffer is full again, leaving us
                        // waiting forever for a dump the kernel never ran. Its done sends
                        // the re-dump's first request.
                        return self.overrun();
                    }
                    if std::mem::take(&mut self.in_flight_abandoned) {
                        // A re-dump asks again anyway.
                        self.in_flight = None;
                        self.send_next()?;
                        continue;
                    }
                    return Err(Error::DumpFailed {
                        what: dump.name(),
                        errno,
                    });
                }
            }
        }
        if let Some((_, s)) = self.in_flight {
            if out.done.contains(&s) {
                self.in_flight = None;
                self.in_flight_abandoned = false;
                if self.queued.is_empty() {
                    self.finish_staging();
                } else {
                    self.send_next()?;
                }
            }
        }
        Ok(())
    }

    fn overrun(&mut self) -> Result<()> {
        self.mirror.counters_mut().overruns += 1;
        self.await_empty = true;
        self.grow_rcvbuf();
        self.start_resync()
    }

    /// A recv found the socket empty (which ends the kernel's congestion state for it):
    /// the request an overrun held back goes out. Whether one went.
    fn on_empty(&mut self) -> Result<bool> {
        if !std::mem::take(&mut self.await_empty) || self.in_flight.is_some() {
            return Ok(false);
        }
        self.send_next()?;
        Ok(self.in_flight.is_some())
    }

    /// The socket's receive buffer as the kernel reports it (twice the requested size).
    pub fn rcvbuf(&self) -> io::Result<usize> {
        self.sock.get_rx_buf_sz()
    }

    /// Doubles `SO_RCVBUF` up to `max_rcvbuf`; failures leave it as it is (the re-dump
    /// still repairs the mirror).
    fn grow_rcvbuf(&mut self) {
        let Ok(now) = self.sock.get_rx_buf_sz() else {
            return;
        };
        // The kernel reports twice what was set.
        let want = now.min(self.max_rcvbuf);
        if want <= now / 2 {
            return;
        }
        let want = i32::try_from(want).unwrap_or(i32::MAX) as usize;
        let forced =
            nix::sys::socket::setsockopt(&self.sock, nix::sys::socket::sockopt::RcvBufForce, &want);
        if forced.is_err() {
            let _ = self
                .sock
                .set_rx_buf_sz(i32::try_from(want).unwrap_or(i32::MAX));
        }
        let after = self.sock.get_rx_buf_sz().unwrap_or(0);
        if after > now {
            self.mirror.counters_mut().rcvbuf_grown += 1;
        }
        self.trace.rcvbuf = after;
        self.trace.event(TraceEvent::Rcvbuf { bytes: after });
    }

    /// Starts a full re-dump into a fresh mirror (the first dump too).
    fn start_resync(&mut self) -> Result<()> {
        if self.version > 0 || self.staging.is_some() {
            self.mirror.counters_mut().resyncs += 1;
        }
        self.trace.event(TraceEvent::Resync {
            abandoned: self.in_flight.map(|(_, seq)| seq),
        });
        if let Some(abandoned) = self.staging.take() {
            self.mirror.add_counts(&abandoned);
        }
        self.staging = Some(Mirror::new(self.ifindex()));
        self.queued = [Dump::Links, Dump::Addresses, Dump::Routes, Dump::Neighbours].into();
        if self.in_flight.is_none() {
            self.send_next()?;
        } else {
            // The next dump goes out when the one in flight ends (one dump per socket);
            // until then its replies are read and dropped.
            self.in_flight_abandoned = true;
        }
        Ok(())
    }

    fn send_next(&mut self) -> Result<()> {
        if self.await_empty {
            // After an overrun: sent once a recv finds the socket empty (`on_empty`).
            return Ok(());
        }
        let Some(dump) = self.queued.pop_front() else {
            return Ok(());
        };
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        header.sequence_number = self.seq;
        let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(dump.request()));
        msg.finalize();
        let mut bytes = vec![0u8; msg.buffer_len()];
        msg.serialize(&mut bytes);
        self.sock
            .send(&bytes, 0)
            .map_err(sock_err("send dump request"))?;
        self.in_flight = Some((dump, self.seq));
        self.in_flight_sent = Instant::now();
        self.trace.last_in_flight_reply = None;
        self.trace.requests += 1;
        self.trace.event(TraceEvent::Sent {
            dump: dump.name(),
            seq: self.seq,
        });
        Ok(())
    }

    fn finish_staging(&mut self) {
        if let Some(fresh) = self.staging.take() {
            self.mirror.replace_tables(fresh);
            self.dirty = true;
            self.publish_if_dirty();
        }
    }

    fn publish_if_dirty(&mut self) -> bool {
        if !self.dirty || self.staging.is_some() {
            return false;
        }
        self.dirty = false;
        self.version += 1;
        self.mirror.counters_mut().published += 1;
        self.publisher.publish(self.mirror.snapshot(self.version));
        self.trace.event(TraceEvent::Published {
            version: self.version,
        });
        true
    }
}

fn resolve(iface: &Interface) -> Result<u32> {
    match iface {
        Interface::Name(name) => nix::net::if_::if_nametoindex(name.as_str())
            .map_err(|_| Error::NoSuchInterface(name.clone())),
        Interface::Index(i) => {
            let all = nix::net::if_::if_nameindex().map_err(|e| Error::Socket {
                what: "if_nameindex",
                source: e.into(),
            })?;
            if all.iter().any(|x| x.index() == *i) {
                Ok(*i)
            } else {
                Err(Error::NoSuchInterface(format!("index {i}")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::craft::{done, emit, route};
    use netlink_packet_route::RouteNetlinkMessage as M;

    /// Feeds `bytes` to the syncer as if `recv` had returned them.
    fn feed(s: &mut Syncer, bytes: &[u8]) {
        s.buf.clear();
        s.buf.extend_from_slice(bytes);
        s.on_datagram().unwrap();
    }

    fn in_flight(s: &Syncer) -> (Dump, u32) {
        s.in_flight.expect("a dump in flight")
    }

    /// An overrun in the middle of the route dump: the kernel lost notifications, so the
    /// rest of that dump, still queued on the socket, may hold routes deleted since (their
    /// `RTM_DELROUTE` was among the lost). The re-dump only adds, so nothing of the
    /// abandoned dump may go into the fresh mirror: after the re-dump, whose route dump no
    /// longer has the route, the mirror must not have it either.
    #[test]
    fn an_abandoned_dump_does_not_leak_into_the_resync() {
        // Reads lo's tables of this namespace (no privileges, nothing changed); the
        // datagrams below are crafted and fed by hand, the kernel's replies never read.
        let mut s = Syncer::open(Interface::Name("lo".into()), &SyncConfig::default()).unwrap();
        let ifindex = s.ifindex();
        let gone = route(ifindex, "198.19.0.0".parse().unwrap(), 16, None, 0);
        s.start_resync().unwrap();
        // Links and addresses dumped (empty), the route dump in flight.
        for _ in 0..2 {
            let (_, seq) = in_flight(&s);
            feed(&mut s, &done(seq));
        }
        let (dump, stale) = in_flight(&s);
        assert_eq!(dump, Dump::Routes);
        // ENOBUFS: notifications lost; a re-dump starts while the route dump is in flight.
        s.overrun().unwrap();
        // The abandoned dump's tail, queued before the loss: a route deleted since.
        let mut tail = emit(M::NewRoute(gone), NLM_F_MULTIPART, stale);
        tail.extend(done(stale));
        feed(&mut s, &tail);
        // (A recv then finds the socket empty: the re-dump's request may go.)
        s.on_empty().unwrap();
        // The re-dump: nothing anywhere (the route is gone).
        for _ in 0..4 {
            let (_, seq) = in_flight(&s);
            feed(&mut s, &done(seq));
        }
        assert!(s.staging.is_none() && s.in_flight.is_none(), "re-dump done");
        let snap = s.reader().snapshot().clone();
        assert_eq!(
            s.mirror.route_count(),
            0,
            "a route of the abandoned dump survived the re-dump"
        );
        assert!(snap
            .routes()
            .lookup("198.19.0.1".parse().unwrap())
            .is_none());
    }

    /// The kernel's side of the dumps: one dump per socket; a request while one runs is
    /// refused with `EBUSY` (`__netlink_dump_start`).
    struct KernelDumps {
        running: Option<u32>,
        /// The last request seen.
        seen: u32,
    }

    impl KernelDumps {
        /// Takes the requests the syncer sent since the last call: each starts a dump, or
        /// is refused while one runs. Returns the refused ones.
        fn requests(&mut self, s: &Syncer) -> Vec<u32> {
            let mut refused = Vec::new();
            while self.seen != s.seq {
                self.seen = self.seen.wrapping_add(1);
                if self.running.is_some() {
                    refused.push(self.seen);
                } else {
                    self.running = Some(self.seen);
                }
            }
            refused
        }
    }

    /// A dump whose first reply does not fit the receive buffer (full of a burst of
    /// notifications) is answered with `ENOBUFS`, yet the kernel keeps it running: its
    /// replies and `NLMSG_DONE` follow once the buffer is read down. The syncer must wait
    /// for that done before it asks again: a request sent while the dump runs is refused
    /// with `EBUSY`, and when the buffer is full again that refusal is dropped too —
    /// the syncer then waits forever for a dump the kernel never ran, and publishes nothing
    /// more (seen in `r2c/tests/mirror_cores.rs`' overrun test under load, 5 in 800 runs).
    #[test]
    fn a_dump_refused_with_enobufs_is_waited_for_not_asked_again() {
        use crate::mirror::craft::error;
        let mut s = Syncer::open(Interface::Name("lo".into()), &SyncConfig::default()).unwrap();
        let version = s.version;
        let mut kernel = KernelDumps {
            running: None,
            seen: s.seq,
        };
        s.start_resync().unwrap();
        assert!(kernel.requests(&s).is_empty());
        let (_, first) = in_flight(&s);
        // The link dump's first reply did not fit: ENOBUFS. The dump stays running.
        feed(&mut s, &error(first, libc::ENOBUFS));
        assert_eq!(s.mirror.counters().overruns, 1, "ENOBUFS is an overrun");
        // Anything asked now is refused with EBUSY, and the refusal does not fit the
        // buffer either (it is never read).
        let refused = kernel.requests(&s);
        // The kernel's dump goes on to its end once the buffer is read.
        assert_eq!(kernel.running.take(), Some(first));
        feed(&mut s, &done(first));
        // (A recv then finds the socket empty: the re-dump's request may go.)
        s.on_empty().unwrap();
        // From here on every request is answered: the re-dump must run to its end.
        for _ in 0..8 {
            let refused = kernel.requests(&s);
            for seq in refused {
                feed(&mut s, &error(seq, libc::EBUSY));
            }
            match kernel.running.take() {
                Some(seq) => feed(&mut s, &done(seq)),
                None => break,
            }
        }
        assert!(
            s.staging.is_none(),
            "the re-dump never ended: the syncer waits for {:?}, requests refused while the \
             kernel's dump {first} ran: {refused:?}",
            s.in_flight
        );
        assert!(s.version > version, "published");
        assert!(refused.is_empty(), "asked while a dump ran: {refused:?}");
    }

    /// After an overrun the kernel drops this socket's notifications without another
    /// ENOBUFS until a recv finds the queue empty (`NETLINK_S_CONGESTED`, cleared in
    /// `netlink_rcv_wake`); a re-dump asked for before that could run while a change it
    /// no longer sees is dropped. Its first request waits for that recv.
    #[test]
    fn after_an_overrun_the_redump_waits_for_an_empty_socket() {
        let mut s = Syncer::open(Interface::Name("lo".into()), &SyncConfig::default()).unwrap();
        let version = s.version;
        assert!(s.in_flight.is_none() && s.staging.is_none());
        // ENOBUFS on recv, no dump running.
        s.overrun().unwrap();
        assert!(s.staging.is_some(), "a re-dump started");
        assert_eq!(s.in_flight, None, "asked before the socket was read empty");
        // A recv found the socket empty: the links dump goes, and the re-dump ends.
        assert!(s.on_empty().unwrap());
        let mut dumps = Vec::new();
        while let Some((dump, seq)) = s.in_flight {
            dumps.push(dump);
            feed(&mut s, &done(seq));
            assert!(dumps.len() <= 4, "{dumps:?}");
        }
        assert_eq!(
            dumps,
            [Dump::Links, Dump::Addresses, Dump::Routes, Dump::Neighbours]
        );
        assert!(s.staging.is_none() && s.version > version);
        // Without an overrun an empty socket asks for nothing.
        assert!(!s.on_empty().unwrap());
        assert_eq!(s.in_flight, None);
    }

    /// The last datagram of a dump flagged `NLM_F_DUMP_INTR` often carries the dump's
    /// `NLMSG_DONE` too. The re-dump it starts must not wait for that dump's end again:
    /// it completes and is published.
    #[test]
    fn an_interrupted_dump_ending_in_the_same_datagram_still_resyncs() {
        use netlink_packet_core::NLM_F_DUMP_INTR;
        let mut s = Syncer::open(Interface::Name("lo".into()), &SyncConfig::default()).unwrap();
        let ifindex = s.ifindex();
        let version = s.version;
        s.start_resync().unwrap();
        for _ in 0..2 {
            let (_, seq) = in_flight(&s);
            feed(&mut s, &done(seq));
        }
        let (_, seq) = in_flight(&s);
        let kept = route(ifindex, "198.19.0.0".parse().unwrap(), 16, None, 0);
        let mut last = emit(
            M::NewRoute(kept.clone()),
            NLM_F_MULTIPART | NLM_F_DUMP_INTR,
            seq,
        );
        last.extend(done(seq));
        feed(&mut s, &last);
        assert_eq!(s.mirror.counters().dumps_interrupted, 1);
        // The re-dump runs all four dumps and ends.
        let mut dumps = Vec::new();
        while let Some((dump, seq)) = s.in_flight {
            dumps.push(dump);
            let mut reply = Vec::new();
            if dump == Dump::Routes {
                reply = emit(M::NewRoute(kept.clone()), NLM_F_MULTIPART, seq);
            }
            reply.extend(done(seq));
            feed(&mut s, &reply);
            assert!(dumps.len() <= 4, "{dumps:?}");
        }
        assert_eq!(
            dumps,
            [Dump::Links, Dump::Addresses, Dump::Routes, Dump::Neighbours],
            "the re-dump never started: the syncer waits for a done it already read"
        );
        assert!(s.staging.is_none());
        assert!(s.version > version, "published");
        assert_eq!(s.mirror.route_count(), 1);
    }
}
