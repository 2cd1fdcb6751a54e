//! Linux TCP between the testbed's two kernel hosts (`veth`: client in `<p>-k1`, server
//! in `<p>-k2`, MTU 1500). Each side runs `threads` epoll loops (mio, edge-triggered),
//! one pinned per CPU, with TCP_NODELAY: what a careful kernel RPC server does.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use serde_json::json;
use testbed::{Kind, Topology};

use super::{pin, Backend, ClientPlan, ClientSpec, Endpoints, Place, ServerReport, ServerSpec};
use crate::engine::ThreadResult;
use crate::proto::ServerConn;
use crate::workload::Stack;

/// The kernel backend.
pub struct Kernel;

/// Stop reading a connection while this many response bytes wait to be sent.
const SERVER_TX_LIMIT: usize = 4 << 20;
const READ_BUF: usize = 256 * 1024;

impl Backend for Kernel {
    fn stack(&self) -> Stack {
        Stack::Kernel
    }

    fn topology(&self) -> Kind {
        Kind::Veth
    }

    fn endpoints(&self, topo: &Topology, _: &[usize], _: &[usize]) -> Result<Endpoints, String> {
        let v = topo
            .veth()
            .ok_or("the kernel backend needs the veth topology")?;
        let place = |h: &testbed::KernelHost| Place {
            netns: h.netns.clone(),
            ip: h.ip,
            prefix_len: h.prefix_len,
            eal: Vec::new(),
        };
        Ok(Endpoints {
            server: place(&v.k2),
            client: place(&v.k1),
        })
    }

    fn serve(&self, spec: &ServerSpec, ready: &mut dyn FnMut()) -> Result<ServerReport, String> {
        let w = &spec.workload;
        let deadline = Instant::now() + spec.lifetime;
        let addr = SocketAddr::from((spec.ip, spec.port));
        let listener =
            TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("listener: {e}"))?;
        ready();
        if let Some(m) = w.emu.server_model {
            return crate::servers::serve(m, spec, listener);
        }
        // Accept every expected connection, then hand them to the threads in order
        // (the client connects thread by thread, so the split matches).
        let mut streams = Vec::new();
        while streams.len() < w.connections as usize {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nodelay(true).map_err(|e| format!("nodelay: {e}"))?;
                    s.set_nonblocking(true)
                        .map_err(|e| format!("nonblocking: {e}"))?;
                    streams.push(TcpStream::from_std(s));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(format!(
                            "only {} of {} connections arrived within the server lifetime",
                            streams.len(),
                            w.connections
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(format!("accept: {e}")),
            }
        }
        drop(listener);
        let mut per_thread: Vec<Vec<TcpStream>> = (0..w.threads).map(|_| Vec::new()).collect();
        let mut it = streams.into_iter();
        for (t, bucket) in per_thread.iter_mut().enumerate() {
            let (_, n) = w.conns_of(t as u32);
            bucket.extend(it.by_ref().take(n as usize));
        }
        let resp = w.resp_size;
        let results: Vec<Result<ServerReport, String>> = std::thread::scope(|s| {
            let hs: Vec<_> = per_thread
                .into_iter()
                .enumerate()
                .map(|(t, conns)| {
                    let cpu = spec.cpus[t % spec.cpus.len()];
                    s.spawn(move || {
                        pin(cpu)?;
                        server_thread(conns, resp, deadline)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("server thread panicked".into()))
                })
                .collect()
        });
        let mut report = ServerReport {
            connections: w.connections as u64,
            extra: json!({}),
            ..Default::default()
        };
        for r in results {
            let r = r?;
            report.add(&r.counters);
            report.errors.extend(r.errors);
        }
        Ok(report)
    }

    fn run_client(
        &self,
        spec: &ClientSpec,
        plan: &Arc<ClientPlan>,
    ) -> Result<Vec<ThreadResult>, String> {
        let threads = plan.workload().threads;
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let cpu = spec.cpus[t as usize % spec.cpus.len()];
                    s.spawn(move || {
                        let r = client_thread(spec, plan, t, cpu);
                        if let Err(e) = &r {
                            plan.fail(e.clone());
                        }
                        r
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("client thread panicked".into()))
                })
                .collect()
        })
    }
}

struct SConn {
    s: TcpStream,
    e: ServerConn,
    readable: bool,
    open: bool,
}

fn server_thread(
    streams: Vec<TcpStream>,
    resp: u32,
    deadline: Instant,
) -> Result<ServerReport, String> {
    let mut poll = Poll::new().map_err(|e| format!("epoll: {e}"))?;
    let mut conns = Vec::new();
    for (i, mut s) in streams.into_iter().enumerate() {
        poll.registry()
            .register(&mut s, Token(i), Interest::READABLE | Interest::WRITABLE)
            .map_err(|e| format!("epoll register: {e}"))?;
        conns.push(SConn {
            s,
            e: ServerConn::new(resp),
            readable: true,
            open: true,
        });
    }
    let mut report = ServerReport::default();
    let mut buf = vec![0u8; READ_BUF];
    let mut events = Events::with_capacity(256);
    let mut open = conns.len();
    while open > 0 && super::serving(deadline) {
        let now = Instant::now();
        for c in conns.iter_mut().filter(|c| c.open) {
            if let Err(e) = service(c, &mut buf, now) {
                // A client that stops mid-run resets its connections: not an error.
                if !e.is_empty() {
                    report.errors.push(e);
                }
                c.open = false;
                open -= 1;
                report.add(&c.e.counters);
                let _ = poll.registry().deregister(&mut c.s);
            }
        }
        if open == 0 {
            break;
        }
        match poll.poll(&mut events, Some(Duration::from_millis(100))) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("epoll wait: {e}")),
        }
        for ev in events.iter() {
            if let Some(c) = conns.get_mut(ev.token().0) {
                if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                    c.readable = true;
                }
            }
        }
    }
    for c in conns.iter().filter(|c| c.open) {
        report.add(&c.e.counters);
    }
    Ok(report)
}

/// Writes what is queued and reads while the response backlog allows. Err("") when the
/// peer closed; Err(msg) on a protocol error.
fn service(c: &mut SConn, buf: &mut [u8], now: Instant) -> Result<(), String> {
    loop {
        while !c.e.tx().is_empty() {
            match c.s.write(c.e.tx().pending()) {
                Ok(n) => c.e.tx().consume(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Err(String::new()),
            }
        }
        if !c.readable || c.e.tx().len() >= SERVER_TX_LIMIT {
            return Ok(());
        }
        match c.s.read(buf) {
            Ok(0) => return Err(String::new()),
            Ok(n) => c.e.on_rx(&buf[..n], now).map_err(|e| e.to_string())?,
            Err(e) if e.kind() == ErrorKind::WouldBlock => c.readable = false,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Err(String::new()),
        }
    }
}

fn client_thread(
    spec: &ClientSpec,
    plan: &ClientPlan,
    t: u32,
    cpu: usize,
) -> Result<ThreadResult, String> {
    pin(cpu)?;
    let (_, n) = plan.workload().conns_of(t);
    let addr = SocketAddr::from((spec.server_ip, spec.port));
    let mut poll = Poll::new().map_err(|e| format!("epoll: {e}"))?;
    let mut streams = Vec::new();
    for i in 0..n as usize {
        let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        s.set_nodelay(true).map_err(|e| format!("nodelay: {e}"))?;
        s.set_nonblocking(true)
            .map_err(|e| format!("nonblocking: {e}"))?;
        let mut s = TcpStream::from_std(s);
        poll.registry()
            .register(&mut s, Token(i), Interest::READABLE | Interest::WRITABLE)
            .map_err(|e| format!("epoll register: {e}"))?;
        streams.push(s);
    }
    let mut w = plan.start(t)?;
    let mut blocked = vec![false; streams.len()];
    // Per iteration only the connections with something to do are visited (at 5,000
    // connections, scanning all of them twice per iteration kept the client behind its
    // schedule): `pending` holds those with bytes to write (blocked ones stay until
    // written), `ready` those epoll said are readable (kept while reads may give more).
    let mut pending = Ready::new(streams.len());
    let mut ready = Ready::new(streams.len());
    let mut touched = Vec::new();
    let mut buf = vec![0u8; READ_BUF];
    let mut events = Events::with_capacity(256);
    loop {
        let now = Instant::now();
        if w.finished(now) {
            break;
        }
        w.tick(now);
        w.take_touched(&mut touched);
        for i in touched.drain(..) {
            pending.add(i);
        }
        let chunk = w.send_chunk();
        pending.retain(|i| {
            let s = &mut streams[i];
            while !blocked[i] && !w.tx(i).is_empty() {
                let p = w.tx(i).pending();
                match s.write(&p[..p.len().min(chunk)]) {
                    Ok(k) => w.on_sent(i, k, now),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => blocked[i] = true,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        w.fail(format!("connection {i}: write: {e}"));
                        return false;
                    }
                }
            }
            !w.tx(i).is_empty()
        });
        let mut timeout = Duration::from_millis(5);
        if let Some(next) = w.next_arrival() {
            // epoll waits in whole milliseconds (mio rounds up): an arrival due sooner than
            // ~1.5 ms is waited for by polling without blocking, or it would leave up to
            // 1 ms late (counted as behind schedule).
            let gap = next.saturating_duration_since(now);
            timeout = if gap < Duration::from_micros(1500) {
                Duration::ZERO
            } else {
                timeout.min(gap - Duration::from_millis(1))
            };
        }
        if !ready.is_empty() || (w.streaming(now) && blocked.iter().any(|&b| !b)) {
            timeout = Duration::ZERO;
        }
        match poll.poll(&mut events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("epoll wait: {e}")),
        }
        for ev in events.iter() {
            let i = ev.token().0;
            if ev.is_writable() && blocked[i] {
                blocked[i] = false;
                pending.add(i);
            }
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                ready.add(i);
            }
        }
        let now = Instant::now();
        ready.retain(|i| {
            // Bounded reads per connection per round keep connections fair.
            for _ in 0..8 {
                match streams[i].read(&mut buf) {
                    Ok(0) => {
                        w.fail(format!("connection {i}: the server closed it"));
                        return false;
                    }
                    Ok(k) => w.on_rx(i, &buf[..k], now),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        w.fail(format!("connection {i}: read: {e}"));
                        return false;
                    }
                }
            }
            true
        });
    }
    plan.finished();
    Ok(w.finish())
}

/// A set of connection indices kept as a list (each once), visited in order: what a
/// poll iteration has to look at, without a scan over every connection.
struct Ready {
    list: Vec<usize>,
    member: Vec<bool>,
}

impl Ready {
    fn new(n: usize) -> Ready {
        Ready {
            list: Vec::new(),
            member: vec![false; n],
        }
    }

    fn add(&mut self, i: usize) {
        if !self.member[i] {
            self.member[i] = true;
            self.list.push(i);
        }
    }

    fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Visits every member in order; keeps those for which `f` returns true.
    fn retain(&mut self, mut f: impl FnMut(usize) -> bool) {
        let member = &mut self.member;
        self.list.retain(|&i| {
            let keep = f(i);
            member[i] = keep;
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::Ready;

    #[test]
    fn ready_holds_each_connection_once_and_drops_what_is_done() {
        let mut r = Ready::new(5);
        for i in [3, 1, 3, 4, 1] {
            r.add(i);
        }
        let mut seen = Vec::new();
        r.retain(|i| {
            seen.push(i);
            i != 1
        });
        assert_eq!(seen, [3, 1, 4], "in order, once each");
        r.add(1);
        r.add(3);
        let mut again = Vec::new();
        r.retain(|i| {
            again.push(i);
            false
        });
        assert_eq!(again, [3, 4, 1]);
        assert!(r.is_empty());
    }
}
