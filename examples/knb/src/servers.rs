//! Kernel baseline server models (`knb rpc --stack kernel --server-model cp|cs|pool
//! --workers N`), the Rakaia paper's TCP-CP, TCP-CS and Worker Pool programs:
//!
//! | model | threads | who serves a connection | reply order |
//! |---|---|---|---|
//! | cp | N epoll threads, each with its own epoll | the worker `hash(conn) % N` (msgsched's `worker_of` hash), always | per connection, naturally |
//! | cs | N threads on one shared epoll, EPOLLONESHOT | whichever thread gets the event; it reads once, serves what it read, re-arms | per connection, naturally |
//! | pool | 1 I/O thread (epoll) + N workers | the I/O thread reads whole messages into a bounded queue (Mutex + Condvar); a worker applies the service time and sends the reply back through a channel + an eventfd that wakes the I/O thread's epoll | per connection (a reorder buffer) unless `--unordered` |
//!
//! Every worker applies the request's service time ([`crate::service::occupy`]) in the
//! chosen `--service-mode`. Sockets are blocking with TCP_NODELAY and only read after epoll
//! says they are readable (one thread at a time per socket), so a read never blocks; a
//! reply is written as soon as its service ends. Linux KCM is not a model here: this
//! machine's kernel has no KCM (no `AF_KCM` support), and it is not faked.

use std::collections::{BTreeMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use serde_json::json;

use crate::backend::{pin, serving, ServerReport, ServerSpec};
use crate::proto::{Request, ServerConn};
use crate::service::{self, ServerModel, ServiceMode};

const READ_BUF: usize = 64 * 1024;
/// Pool: capacity of the shared request queue.
const QUEUE_CAP: usize = 4096;
/// Epoll waits wake this often to check the deadline (ms).
const TICK_MS: u16 = 50;

/// One connection of a server model.
struct Conn {
    s: TcpStream,
    e: ServerConn,
    reqs: Vec<Request>,
}

/// What reading a connection gave.
enum Read1 {
    /// Bytes parsed (maybe no complete request yet).
    Data,
    /// The peer closed (or reset): not an error.
    Closed,
    /// A protocol error: closes the connection, reported.
    Error(String),
}

impl Conn {
    fn new(s: TcpStream, resp: u32) -> Conn {
        Conn {
            s,
            e: ServerConn::new(resp).deferred(),
            reqs: Vec::new(),
        }
    }

    /// One read (the socket is readable), parsed into `self.reqs`.
    fn read_once(&mut self, buf: &mut [u8]) -> Read1 {
        loop {
            match self.s.read(buf) {
                Ok(0) => return Read1::Closed,
                Ok(n) => {
                    if let Err(e) = self.e.on_rx(&buf[..n], Instant::now()) {
                        return Read1::Error(e.to_string());
                    }
                    self.e.take_requests(&mut self.reqs);
                    return Read1::Data;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Read1::Data,
                Err(_) => return Read1::Closed,
            }
        }
    }

    /// Writes everything queued; false when the peer is gone.
    fn flush(&mut self) -> bool {
        let ok = self.s.write_all(self.e.tx().pending()).is_ok();
        let n = self.e.tx().len();
        self.e.tx().consume(n);
        ok
    }

    /// Serves every parsed request in order: occupy, reply, write. False: peer gone.
    fn serve_all(&mut self, mode: ServiceMode) -> bool {
        let reqs = std::mem::take(&mut self.reqs);
        for r in &reqs {
            occupy(r, mode);
            self.e.respond(r);
            if !self.flush() {
                return false;
            }
        }
        self.reqs = reqs;
        self.reqs.clear();
        true
    }
}

fn occupy(r: &Request, mode: ServiceMode) {
    if r.service_ns > 0 {
        service::occupy(Duration::from_nanos(r.service_ns), mode);
    }
}

/// msgsched's CP placement: `(hi32(key * 0x9E3779B97F4A7C15) * workers) >> 32`.
pub fn worker_of(conn: u64, workers: u32) -> usize {
    let h = conn.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    ((h * workers as u64) >> 32) as usize
}

fn ep_err(what: &str) -> impl Fn(nix::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Accepts `n` connections (blocking sockets, TCP_NODELAY) before `deadline`.
fn accept_all(
    listener: &TcpListener,
    n: usize,
    deadline: Instant,
) -> Result<Vec<TcpStream>, String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listener: {e}"))?;
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nodelay(true).map_err(|e| format!("nodelay: {e}"))?;
                s.set_nonblocking(false)
                    .map_err(|e| format!("blocking: {e}"))?;
                v.push(s);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(format!(
                        "only {} of {n} connections arrived within the server lifetime",
                        v.len()
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    }
    Ok(v)
}

/// Serves `spec.workload.connections` connections from `listener` with `model`.
pub fn serve(
    model: ServerModel,
    spec: &ServerSpec,
    listener: TcpListener,
) -> Result<ServerReport, String> {
    let w = &spec.workload;
    let deadline = Instant::now() + spec.lifetime;
    let mode = w.emu.service_mode;
    if mode == ServiceMode::Sleep {
        service::set_timer_slack();
        let _ = service::margin();
    }
    let streams = accept_all(&listener, w.connections as usize, deadline)?;
    drop(listener);
    let conns: Vec<Conn> = streams
        .into_iter()
        .map(|s| Conn::new(s, w.resp_size))
        .collect();
    let workers = w.emu.workers;
    let cpus = spec.cpus.clone();
    let mut report = match model {
        ServerModel::Cp => serve_cp(conns, workers, &cpus, mode, deadline)?,
        ServerModel::Cs => serve_cs(conns, workers, &cpus, mode, deadline)?,
        ServerModel::Pool => serve_pool(conns, workers, &cpus, mode, w.emu.unordered, deadline)?,
        // Refused by the argument checks (run.rs): ms is luna's message mode.
        ServerModel::Ms => return Err("--server-model ms runs on --stack luna only".into()),
    };
    report.connections = w.connections as u64;
    let mut extra = json!({
        "server_model": model.name(),
        "workers": workers,
        "service_mode": mode.name(),
    });
    if mode == ServiceMode::Sleep {
        extra["sleep_margin_us"] = json!(service::margin().as_secs_f64() * 1e6);
    }
    if model == ServerModel::Cp {
        let mut per = vec![0u32; workers as usize];
        for i in 0..w.connections {
            per[worker_of(i as u64, workers)] += 1;
        }
        extra["connections_per_worker"] = json!(per);
    }
    report.extra = extra;
    Ok(report)
}

fn join_all(
    hs: Vec<std::thread::ScopedJoinHandle<'_, Result<ServerReport, String>>>,
) -> Result<ServerReport, String> {
    let mut report = ServerReport::default();
    for h in hs {
        let r = h
            .join()
            .unwrap_or_else(|_| Err("server thread panicked".into()))?;
        report.add(&r.counters);
        report.errors.extend(r.errors);
    }
    Ok(report)
}

fn serve_cp(
    conns: Vec<Conn>,
    workers: u32,
    cpus: &[usize],
    mode: ServiceMode,
    deadline: Instant,
) -> Result<ServerReport, String> {
    let mut parts: Vec<Vec<Conn>> = (0..workers).map(|_| Vec::new()).collect();
    for (i, c) in conns.into_iter().enumerate() {
        parts[worker_of(i as u64, workers)].push(c);
    }
    std::thread::scope(|s| {
        let hs = parts
            .into_iter()
            .enumerate()
            .map(|(k, part)| {
                let cpu = cpus[k % cpus.len()];
                s.spawn(move || {
                    pin(cpu)?;
                    if mode == ServiceMode::Sleep {
                        service::set_timer_slack();
                    }
                    cp_worker(part, mode, deadline)
                })
            })
            .collect();
        join_all(hs)
    })
}

fn cp_worker(
    mut conns: Vec<Conn>,
    mode: ServiceMode,
    deadline: Instant,
) -> Result<ServerReport, String> {
    let mut report = ServerReport::default();
    let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(ep_err("epoll"))?;
    for (i, c) in conns.iter().enumerate() {
        ep.add(c.s.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
            .map_err(ep_err("epoll add"))?;
    }
    let mut open: Vec<bool> = vec![true; conns.len()];
    let mut left = conns.len();
    let mut buf = vec![0u8; READ_BUF];
    let mut evs = vec![EpollEvent::empty(); 64];
    while left > 0 && serving(deadline) {
        let n = match ep.wait(&mut evs, TICK_MS) {
            Ok(n) => n,
            Err(nix::Error::EINTR) => 0,
            Err(e) => return Err(format!("epoll wait: {e}")),
        };
        for ev in &evs[..n] {
            let i = ev.data() as usize;
            if !open[i] {
                continue;
            }
            let c = &mut conns[i];
            let alive = match c.read_once(&mut buf) {
                Read1::Data => c.serve_all(mode),
                Read1::Closed => false,
                Read1::Error(e) => {
                    report.errors.push(e);
                    false
                }
            };
            if !alive {
                open[i] = false;
                left -= 1;
                let _ = ep.delete(c.s.as_fd());
            }
        }
    }
    for c in &conns {
        report.add(&c.e.counters);
    }
    Ok(report)
}

fn serve_cs(
    conns: Vec<Conn>,
    workers: u32,
    cpus: &[usize],
    mode: ServiceMode,
    deadline: Instant,
) -> Result<ServerReport, String> {
    let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(ep_err("epoll"))?;
    let oneshot = EpollFlags::EPOLLIN | EpollFlags::EPOLLONESHOT;
    for (i, c) in conns.iter().enumerate() {
        ep.add(c.s.as_fd(), EpollEvent::new(oneshot, i as u64))
            .map_err(ep_err("epoll add"))?;
    }
    let n = conns.len();
    // EPOLLONESHOT gives a connection's event to one thread until it re-arms, so each
    // mutex is taken by one thread at a time (never contended).
    let conns: Vec<Mutex<(Conn, bool)>> =
        conns.into_iter().map(|c| Mutex::new((c, true))).collect();
    let left = AtomicUsize::new(n);
    let (ep, conns, left) = (&ep, &conns, &left);
    let errors = std::thread::scope(|s| {
        let hs: Vec<_> = (0..workers as usize)
            .map(|k| {
                let cpu = cpus[k % cpus.len()];
                s.spawn(move || -> Result<Vec<String>, String> {
                    pin(cpu)?;
                    if mode == ServiceMode::Sleep {
                        service::set_timer_slack();
                    }
                    let mut errs = Vec::new();
                    let mut buf = vec![0u8; READ_BUF];
                    let mut evs = vec![EpollEvent::empty(); 1];
                    while left.load(Ordering::Acquire) > 0 && serving(deadline) {
                        let got = match ep.wait(&mut evs, TICK_MS) {
                            Ok(n) => n,
                            Err(nix::Error::EINTR) => 0,
                            Err(e) => return Err(format!("epoll wait: {e}")),
                        };
                        if got == 0 {
                            continue;
                        }
                        let i = evs[0].data() as usize;
                        let mut g = conns[i].lock().unwrap_or_else(|p| p.into_inner());
                        let (c, open) = &mut *g;
                        if !*open {
                            continue;
                        }
                        let alive = match c.read_once(&mut buf) {
                            Read1::Data => c.serve_all(mode),
                            Read1::Closed => false,
                            Read1::Error(e) => {
                                errs.push(e);
                                false
                            }
                        };
                        if alive {
                            let mut ev = EpollEvent::new(oneshot, i as u64);
                            ep.modify(c.s.as_fd(), &mut ev)
                                .map_err(ep_err("epoll rearm"))?;
                        } else {
                            *open = false;
                            let _ = ep.delete(c.s.as_fd());
                            left.fetch_sub(1, Ordering::AcqRel);
                        }
                    }
                    Ok(errs)
                })
            })
            .collect();
        let mut errors = Vec::new();
        for h in hs {
            errors.extend(
                h.join()
                    .unwrap_or_else(|_| Err("server thread panicked".into()))?,
            );
        }
        Ok::<_, String>(errors)
    })?;
    let mut report = ServerReport {
        errors,
        ..Default::default()
    };
    for m in conns {
        let g = m.lock().unwrap_or_else(|p| p.into_inner());
        report.add(&g.0.e.counters);
    }
    Ok(report)
}

/// A request handed to the pool, and its reply coming back.
struct Job {
    conn: usize,
    seq: u64,
    req: Request,
}

/// The pool's bounded queue: a Mutex + Condvar ring.
struct Queue {
    m: Mutex<(VecDeque<Job>, bool)>,
    not_empty: Condvar,
    not_full: Condvar,
}

impl Queue {
    fn push(&self, j: Job) {
        let mut g = self.m.lock().unwrap_or_else(|p| p.into_inner());
        while g.0.len() >= QUEUE_CAP {
            g = self.not_full.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        g.0.push_back(j);
        drop(g);
        self.not_empty.notify_one();
    }

    /// None once closed and empty.
    fn pop(&self) -> Option<Job> {
        let mut g = self.m.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(j) = g.0.pop_front() {
                drop(g);
                self.not_full.notify_one();
                return Some(j);
            }
            if g.1 {
                return None;
            }
            g = self.not_empty.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn close(&self) {
        self.m.lock().unwrap_or_else(|p| p.into_inner()).1 = true;
        self.not_empty.notify_all();
    }
}

/// Per-connection reply state of the pool's I/O thread.
struct PoolConn {
    c: Conn,
    open: bool,
    next_in: u64,
    next_out: u64,
    held: BTreeMap<u64, Request>,
}

fn serve_pool(
    conns: Vec<Conn>,
    workers: u32,
    cpus: &[usize],
    mode: ServiceMode,
    unordered: bool,
    deadline: Instant,
) -> Result<ServerReport, String> {
    let queue = Arc::new(Queue {
        m: Mutex::new((VecDeque::new(), false)),
        not_empty: Condvar::new(),
        not_full: Condvar::new(),
    });
    let efd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
        .map_err(ep_err("eventfd"))?;
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::scope(|s| {
        let mut hs = Vec::new();
        for k in 0..workers as usize {
            let cpu = cpus[(k + 1) % cpus.len()];
            let (q, tx, efd) = (queue.clone(), tx.clone(), &efd);
            hs.push(s.spawn(move || -> Result<(), String> {
                pin(cpu)?;
                if mode == ServiceMode::Sleep {
                    service::set_timer_slack();
                }
                while let Some(j) = q.pop() {
                    occupy(&j.req, mode);
                    if tx.send(j).is_err() {
                        break;
                    }
                    let _ = efd.write(1);
                }
                Ok(())
            }));
        }
        drop(tx);
        let r = (|| {
            pin(cpus[0])?;
            pool_io(conns, &queue, &efd, &rx, unordered, deadline)
        })();
        queue.close();
        for h in hs {
            h.join()
                .unwrap_or_else(|_| Err("pool worker panicked".into()))?;
        }
        r
    })
}

const EFD_TOKEN: u64 = u64::MAX;

fn pool_io(
    conns: Vec<Conn>,
    queue: &Queue,
    efd: &EventFd,
    rx: &mpsc::Receiver<Job>,
    unordered: bool,
    deadline: Instant,
) -> Result<ServerReport, String> {
    let mut report = ServerReport::default();
    let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(ep_err("epoll"))?;
    ep.add(efd.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, EFD_TOKEN))
        .map_err(ep_err("epoll add eventfd"))?;
    for (i, c) in conns.iter().enumerate() {
        ep.add(c.s.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
            .map_err(ep_err("epoll add"))?;
    }
    let mut pc: Vec<PoolConn> = conns
        .into_iter()
        .map(|c| PoolConn {
            c,
            open: true,
            next_in: 0,
            next_out: 0,
            held: BTreeMap::new(),
        })
        .collect();
    let mut left = pc.len();
    let mut buf = vec![0u8; READ_BUF];
    let mut evs = vec![EpollEvent::empty(); 64];
    let close = |p: &mut PoolConn, ep: &Epoll, left: &mut usize| {
        if p.open {
            p.open = false;
            *left -= 1;
            let _ = ep.delete(p.c.s.as_fd());
        }
    };
    while left > 0 && serving(deadline) {
        let n = match ep.wait(&mut evs, TICK_MS) {
            Ok(n) => n,
            Err(nix::Error::EINTR) => 0,
            Err(e) => return Err(format!("epoll wait: {e}")),
        };
        for ev in &evs[..n] {
            let t = ev.data();
            if t == EFD_TOKEN {
                let _ = efd.read();
                continue;
            }
            let i = t as usize;
            let p = &mut pc[i];
            if !p.open {
                continue;
            }
            match p.c.read_once(&mut buf) {
                Read1::Data => {
                    for req in std::mem::take(&mut p.c.reqs) {
                        queue.push(Job {
                            conn: i,
                            seq: p.next_in,
                            req,
                        });
                        p.next_in += 1;
                    }
                }
                Read1::Closed => close(p, &ep, &mut left),
                Read1::Error(e) => {
                    report.errors.push(e);
                    close(p, &ep, &mut left);
                }
            }
        }
        // Replies (the eventfd only wakes the wait; the channel holds them).
        for j in rx.try_iter() {
            let p = &mut pc[j.conn];
            if !p.open {
                continue;
            }
            if unordered {
                p.c.e.respond(&j.req);
            } else {
                p.held.insert(j.seq, j.req);
                while let Some(r) = p.held.remove(&p.next_out) {
                    p.c.e.respond(&r);
                    p.next_out += 1;
                }
            }
            if !p.c.flush() {
                close(p, &ep, &mut left);
            }
        }
    }
    for p in &pc {
        report.add(&p.c.e.counters);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cp_placement_is_msgsched_hash_and_in_range() {
        for w in [1u32, 2, 4, 20] {
            for c in 0..1000u64 {
                assert!(worker_of(c, w) < w as usize);
            }
        }
        assert_eq!(worker_of(12345, 1), 0);
    }
}
