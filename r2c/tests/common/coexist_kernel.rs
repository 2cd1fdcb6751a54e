//! The kernel's side of the `coexist` topology's tests (issue 11), shared by
//! r2c/tests/coexist.rs (r2c's own echo server as luna) and examples/knb/tests/coexist.rs
//! (knb's luna server): on luna's IP, in the host namespace, the kernel serves HTTP
//! (`python3 -m http.server`) and a TCP echo; from the wire namespace a long-lived
//! kernel TCP session ("ssh") exchanges a line every 20 ms, an HTTP GET and `ping` run.
//! Include with `#[path]` next to `children.rs` (as `mod children`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use testbed::Coexist;

use crate::children::{spawn, Proc};

/// The kernel's HTTP server port (host namespace, luna's IP).
pub const HTTP_PORT: u16 = 8080;
/// The kernel's echo server port, which the long-lived session talks to.
pub const ECHO_PORT: u16 = 9000;

/// The kernel's servers and the long-lived session, running.
pub struct KernelSide {
    /// `python3 -m http.server` on luna's IP.
    pub http: Proc,
    /// The echo server of the long-lived session.
    pub echo: Proc,
    /// The long-lived session; ends (printing `LONG ok lines=N`) once `long_stop` exists.
    pub long: Proc,
    /// Create this file to end the long-lived session.
    pub long_stop: PathBuf,
}

/// Starts the kernel's HTTP and echo servers in the host namespace and the long-lived
/// session from the wire namespace; returns once the session has exchanged 5 lines (or
/// after 30 s: the session's own output then says why). Files go to `dir`.
pub fn start(c: &Coexist, dir: &Path) -> KernelSide {
    let long_stop = dir.join("coexist-long-stop");
    let long_up = dir.join("coexist-long-up");
    for f in [&long_stop, &long_up] {
        let _ = std::fs::remove_file(f);
    }
    let www = dir.join("www");
    std::fs::create_dir_all(&www).expect("www dir");
    std::fs::write(www.join("hello.txt"), b"kernel says hello\n").expect("file");
    let mut http = c.exception.command("python3");
    http.args(["-m", "http.server", &HTTP_PORT.to_string(), "--bind"])
        .arg(c.exception.ip.to_string())
        .arg("--directory")
        .arg(&www);
    let http = spawn(http, "kernel http server");
    let echo_srv = format!(
        "import socket\n\
         s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         s.bind(('{ip}',{ECHO_PORT})); s.listen(1)\n\
         c,_=s.accept()\n\
         while True:\n  d=c.recv(4096)\n  if not d: break\n  c.sendall(d)\n\
         print('ECHO-SERVER done')\n",
        ip = c.exception.ip
    );
    let mut e = c.exception.command("python3");
    e.args(["-c", &echo_srv]);
    let echo = spawn(e, "kernel echo server");
    // The long-lived kernel session ("ssh"): one line every 20 ms until the stop file.
    let long = format!(
        "import socket,time,os,sys\n\
         end=time.time()+20\n\
         while True:\n  try:\n    c=socket.create_connection(('{ip}',{ECHO_PORT}),timeout=5); break\n  \
         except OSError:\n    if time.time()>end: raise\n    time.sleep(0.1)\n\
         c.settimeout(10)\n\
         n=0\n\
         deadline=time.time()+80\n\
         while not os.path.exists('{stop}') and time.time()<deadline:\n  \
         m=b'line %d\\n' % n\n  c.sendall(m)\n  got=b''\n  \
         while len(got)<len(m):\n    d=c.recv(len(m)-len(got))\n    if not d: print('LONG broken', n); sys.exit(1)\n    got+=d\n  \
         if got!=m: print('LONG mismatch', n); sys.exit(1)\n  n+=1\n  \
         if n==5: open('{up}','w').write('up')\n  time.sleep(0.02)\n\
         c.close()\n\
         print('LONG ok lines=%d' % n)\n",
        ip = c.exception.ip,
        stop = long_stop.display(),
        up = long_up.display()
    );
    let mut l = c.wire.command("python3");
    l.args(["-c", &long]);
    let long = spawn(l, "long-lived kernel session");
    let end = Instant::now() + Duration::from_secs(30);
    while !long_up.exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    KernelSide {
        http,
        echo,
        long,
        long_stop,
    }
}

/// An HTTP GET of the kernel's file from the wire: prints `HTTP 200 ok`.
pub fn http_get(c: &Coexist) -> Command {
    let get = format!(
        "import urllib.request,time\n\
         end=time.time()+30\n\
         while True:\n  try:\n    r=urllib.request.urlopen('http://{ip}:{HTTP_PORT}/hello.txt',timeout=5); break\n  \
         except OSError:\n    if time.time()>end: raise\n    time.sleep(0.2)\n\
         b=r.read()\n\
         print('HTTP', r.status, 'ok' if b==b'kernel says hello\\n' else 'mismatch')\n",
        ip = c.exception.ip
    );
    let mut g = c.wire.command("python3");
    g.args(["-c", &get]);
    g
}

/// `ping -c count` of luna's IP from the wire (`-W wait` seconds per reply).
pub fn ping(c: &Coexist, count: u32, wait: u32) -> Command {
    let mut p = c.wire.command("ping");
    p.args([
        "-c",
        &count.to_string(),
        "-i",
        "0.2",
        "-W",
        &wait.to_string(),
    ])
    .arg(c.exception.ip.to_string());
    p
}

/// The number of lines the long-lived session reported (`LONG ok lines=N`), 0 if none.
pub fn long_lines(line: &str) -> u64 {
    line.split("lines=")
        .nth(1)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}
