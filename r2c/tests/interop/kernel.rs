//! The kernel peers: blocking `std::net` programs run inside the tap namespace by the
//! luna child, one per phase. Each verifies every byte it receives against the pattern
//! at its stream offset and prints `KPEER ok ...`, or panics (non-zero exit) saying what
//! went wrong.
//!
//! Close discipline (no RST from the kernel): a peer reads to end of stream before it
//! closes, so it never closes a socket with unread data.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddrV4, TcpListener, TcpStream};
use std::sync::mpsc::sync_channel;
use std::time::{Duration, Instant};

use super::{fill, mismatch, Kv, SEED_BULK_DOWN, SEED_BULK_UP, SEED_REQ, SEED_RESP};

/// Arguments of a kernel peer.
#[derive(Clone, Debug)]
pub struct PeerArgs {
    /// Port to listen on (servers) or connect to (clients).
    pub port: u16,
    /// luna's address (clients).
    pub luna: std::net::Ipv4Addr,
    pub bytes: u64,
    pub rpcs: u64,
    pub rpc_size: usize,
    pub depth: usize,
    pub limit: Duration,
}

impl PeerArgs {
    pub fn encode(&self) -> String {
        let mut kv = Kv::default();
        kv.set("port", self.port);
        kv.set("luna", self.luna);
        kv.set("bytes", self.bytes);
        kv.set("rpcs", self.rpcs);
        kv.set("rpc_size", self.rpc_size);
        kv.set("depth", self.depth);
        kv.set("limit_s", self.limit.as_secs());
        kv.line("")
    }

    pub fn decode(s: &str) -> Result<PeerArgs, String> {
        let kv = Kv::parse(s);
        Ok(PeerArgs {
            port: kv.try_get("port")?,
            luna: kv.try_get("luna")?,
            bytes: kv.try_get("bytes")?,
            rpcs: kv.try_get("rpcs")?,
            rpc_size: kv.try_get("rpc_size")?,
            depth: kv.try_get("depth")?,
            limit: Duration::from_secs(kv.try_get("limit_s")?),
        })
    }
}

pub fn main(role: &str, arg: &str) {
    let a = PeerArgs::decode(arg).unwrap_or_else(|e| panic!("{role}: {e}"));
    let started = Instant::now();
    let r = match role {
        "k-bulk-server" => bulk_server(&a),
        "k-bulk-client" => bulk_client(&a),
        "k-rpc-server" => rpc_server(&a),
        "k-rpc-client" => rpc_client(&a),
        other => Err(format!("unknown kernel role {other}")),
    };
    match r {
        Ok(mut kv) => {
            kv.set("role", role);
            kv.set("secs", format!("{:.3}", started.elapsed().as_secs_f64()));
            println!("{}", kv.line("KPEER ok"));
        }
        Err(e) => panic!("{role}: {e}"),
    }
}

fn io(what: &str) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("{what}: {e} ({:?})", e.kind())
}

fn listen(a: &PeerArgs) -> Result<TcpStream, String> {
    let l = TcpListener::bind(("0.0.0.0", a.port)).map_err(io("bind"))?;
    // The luna child waits for this line before it connects.
    println!("LISTENING port={}", a.port);
    l.set_nonblocking(true).map_err(io("nonblocking"))?;
    let end = Instant::now() + a.limit;
    let s = loop {
        match l.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < end => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => return Err(io("accept")(e)),
        }
    };
    s.set_nonblocking(false).map_err(io("blocking"))?;
    timeouts(&s, a.limit)?;
    Ok(s)
}

fn connect(a: &PeerArgs) -> Result<TcpStream, String> {
    let to = SocketAddrV4::new(a.luna, a.port);
    let s = TcpStream::connect_timeout(&to.into(), a.limit).map_err(io("connect"))?;
    timeouts(&s, a.limit)?;
    Ok(s)
}

fn timeouts(s: &TcpStream, limit: Duration) -> Result<(), String> {
    s.set_read_timeout(Some(limit)).map_err(io("timeout"))?;
    s.set_write_timeout(Some(limit)).map_err(io("timeout"))
}

/// Reads the rest of the stream; it must end with a FIN (read returns 0), not a reset.
fn read_to_eof(s: &mut TcpStream) -> Result<Vec<u8>, String> {
    let mut v = Vec::new();
    s.read_to_end(&mut v).map_err(io("read to end of stream"))?;
    Ok(v)
}

/// Receives `a.bytes` of the luna -> kernel bulk stream, checks them, answers `GOOD`.
fn bulk_server(a: &PeerArgs) -> Result<Kv, String> {
    let mut s = listen(a)?;
    let mut buf = vec![0u8; 1 << 16];
    let mut got = 0u64;
    loop {
        let n = s.read(&mut buf).map_err(io("read"))?;
        if n == 0 {
            break;
        }
        if let Some(at) = mismatch(SEED_BULK_UP, got, &buf[..n]) {
            return Err(format!("byte {at} differs from the pattern"));
        }
        got += n as u64;
    }
    if got != a.bytes {
        s.write_all(b"BAD!").map_err(io("verdict"))?;
        return Err(format!("end of stream after {got} of {} bytes", a.bytes));
    }
    s.write_all(b"GOOD").map_err(io("verdict"))?;
    s.shutdown(Shutdown::Write).map_err(io("shutdown"))?;
    let mut kv = Kv::default();
    kv.set("bytes_in", got);
    kv.set("eof", 1);
    Ok(kv)
}

/// Sends `a.bytes` of the kernel -> luna bulk stream, expects `GOOD` then end of stream.
fn bulk_client(a: &PeerArgs) -> Result<Kv, String> {
    let mut s = connect(a)?;
    let mut buf = vec![0u8; 1 << 16];
    let mut sent = 0u64;
    while sent < a.bytes {
        let n = (a.bytes - sent).min(buf.len() as u64) as usize;
        fill(SEED_BULK_DOWN, sent, &mut buf[..n]);
        s.write_all(&buf[..n]).map_err(io("write"))?;
        sent += n as u64;
    }
    s.shutdown(Shutdown::Write).map_err(io("shutdown"))?;
    let verdict = read_to_eof(&mut s)?;
    if verdict != b"GOOD" {
        return Err(format!(
            "luna's verdict {:?}",
            String::from_utf8_lossy(&verdict)
        ));
    }
    let mut kv = Kv::default();
    kv.set("bytes_out", sent);
    kv.set("eof", 1);
    Ok(kv)
}

/// Answers `a.rpcs` requests (checked) with responses, then expects end of stream.
fn rpc_server(a: &PeerArgs) -> Result<Kv, String> {
    let mut s = listen(a)?;
    s.set_nodelay(true).map_err(io("nodelay"))?;
    let size = a.rpc_size as u64;
    let mut req = vec![0u8; a.rpc_size];
    let mut resp = vec![0u8; a.rpc_size];
    for i in 0..a.rpcs {
        s.read_exact(&mut req)
            .map_err(|e| format!("request {i}: {e}"))?;
        if let Some(at) = mismatch(SEED_REQ, i * size, &req) {
            return Err(format!("request {i}: byte {at} differs from the pattern"));
        }
        fill(SEED_RESP, i * size, &mut resp);
        s.write_all(&resp)
            .map_err(|e| format!("response {i}: {e}"))?;
    }
    let rest = read_to_eof(&mut s)?;
    if !rest.is_empty() {
        return Err(format!("{} bytes after the last request", rest.len()));
    }
    s.shutdown(Shutdown::Write).map_err(io("shutdown"))?;
    let mut kv = Kv::default();
    kv.set("rpcs", a.rpcs);
    kv.set("eof", 1);
    Ok(kv)
}

/// Issues `a.rpcs` requests, `a.depth` outstanding, checks every response; closes after
/// the last one and expects luna's end of stream.
fn rpc_client(a: &PeerArgs) -> Result<Kv, String> {
    let mut s = connect(a)?;
    s.set_nodelay(true).map_err(io("nodelay"))?;
    let mut w = s.try_clone().map_err(io("clone"))?;
    let (credit_tx, credit_rx) = sync_channel::<()>(a.depth);
    let (n, size, depth) = (a.rpcs, a.rpc_size, a.depth as u64);
    let writer = std::thread::spawn(move || -> Result<(), String> {
        let mut req = vec![0u8; size];
        for i in 0..n {
            if i >= depth && credit_rx.recv().is_err() {
                return Ok(()); // the reader failed and says why
            }
            fill(SEED_REQ, i * size as u64, &mut req);
            w.write_all(&req).map_err(|e| format!("request {i}: {e}"))?;
        }
        Ok(())
    });
    let mut resp = vec![0u8; size];
    let mut lat = Vec::with_capacity(n as usize);
    let mut last = Instant::now();
    let mut result = Ok(());
    for i in 0..n {
        if let Err(e) = s.read_exact(&mut resp) {
            result = Err(format!("response {i}: {e}"));
            break;
        }
        if let Some(at) = mismatch(SEED_RESP, i * size as u64, &resp) {
            result = Err(format!("response {i}: byte {at} differs from the pattern"));
            break;
        }
        let now = Instant::now();
        lat.push(now - last);
        last = now;
        let _ = credit_tx.send(());
    }
    drop(credit_tx);
    let wr = writer.join().map_err(|_| "writer panicked".to_string())?;
    result?;
    wr?;
    s.shutdown(Shutdown::Write).map_err(io("shutdown"))?;
    let rest = read_to_eof(&mut s)?;
    if !rest.is_empty() {
        return Err(format!("{} bytes after the last response", rest.len()));
    }
    lat.sort_unstable();
    let mut kv = Kv::default();
    kv.set("rpcs", n);
    kv.set(
        "max_gap_ms",
        format!("{:.1}", lat.last().map_or(0.0, |d| d.as_secs_f64() * 1e3)),
    );
    kv.set("eof", 1);
    Ok(kv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn args(port: u16) -> PeerArgs {
        PeerArgs {
            port,
            luna: Ipv4Addr::LOCALHOST,
            bytes: 300_000,
            rpcs: 200,
            rpc_size: 4096,
            depth: 8,
            limit: Duration::from_secs(20),
        }
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[test]
    fn peer_args_round_trip() {
        let a = args(7);
        let b = PeerArgs::decode(&a.encode()).unwrap();
        assert_eq!(a.encode(), b.encode());
        assert!(PeerArgs::decode("port=1").unwrap_err().contains("luna"));
    }

    // The peers against each other over loopback: proves the verification and close
    // logic the interop runs rely on (a wrong byte or a short stream is an error).
    #[test]
    fn rpc_client_and_server_agree_over_loopback() {
        let a = args(free_port());
        let s = {
            let a = a.clone();
            std::thread::spawn(move || rpc_server(&a))
        };
        std::thread::sleep(Duration::from_millis(100));
        let c = rpc_client(&a).unwrap();
        let s = s.join().unwrap().unwrap();
        assert_eq!(c.get::<u64>("rpcs"), 200);
        assert_eq!(s.get::<u64>("eof"), 1);
    }

    #[test]
    fn bulk_server_rejects_a_wrong_byte() {
        let a = args(free_port());
        let s = {
            let a = a.clone();
            std::thread::spawn(move || bulk_server(&a))
        };
        std::thread::sleep(Duration::from_millis(100));
        let mut c = TcpStream::connect(("127.0.0.1", a.port)).unwrap();
        let mut buf = vec![0u8; 5000];
        fill(SEED_BULK_UP, 0, &mut buf);
        buf[4321] ^= 0x40;
        c.write_all(&buf).unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let e = s.join().unwrap().unwrap_err();
        assert!(e.contains("byte 4321"), "{e}");
    }

    #[test]
    fn bulk_server_rejects_a_short_stream() {
        let a = args(free_port());
        let s = {
            let a = a.clone();
            std::thread::spawn(move || bulk_server(&a))
        };
        std::thread::sleep(Duration::from_millis(100));
        let mut c = TcpStream::connect(("127.0.0.1", a.port)).unwrap();
        let mut buf = vec![0u8; 1000];
        fill(SEED_BULK_UP, 0, &mut buf);
        c.write_all(&buf).unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut v = Vec::new();
        c.read_to_end(&mut v).unwrap();
        assert_eq!(v, b"BAD!");
        let e = s.join().unwrap().unwrap_err();
        assert!(e.contains("after 1000 of 300000"), "{e}");
    }
}
