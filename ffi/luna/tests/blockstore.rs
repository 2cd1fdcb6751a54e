//! The C example end to end: `examples/blockstore.c` is compiled with `cc` against
//! `include/luna.h` and the cdylib (`libluna.so`), run as a luna server on the
//! testbed's memif topology, and driven by knb's stock luna client with `--verify`
//! (4 KiB writes, each answered with the block read back from the store, re-keyed for
//! the client's pattern check). Asserts the client verified every reply and the
//! server's counts match the client's.
//!
//! Needs root, hugepages and the testbed (`make setup`), `cc`, and the knb binary next
//! to this test's target directory (`cargo test --workspace` builds it; alone:
//! `cargo build -p knb` first).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testbed::{DpdkPort, Kind, Prefix, Topology};

const PORT: u16 = 7700;
const IODEPTH: u64 = 4;
const CONNS: u64 = 2;
/// Hang guard for a child (never reached in a passing run).
const LIMIT: Duration = Duration::from_secs(90);

/// `target/<profile>` of this test binary.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// How the example is linked.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Link {
    /// `-lluna` against `libluna.so` (rpath to the target directory).
    Shared,
    /// `libluna.a` plus DPDK's libraries from pkg-config.
    Static,
}

/// `target/<profile>/deps`: where this test binary and the crate's libraries are.
fn deps_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    exe.parent().expect("target/<profile>/deps").to_path_buf()
}

/// Compiles the example; returns the binary.
fn build_blockstore(out: &Path, link: Link) -> PathBuf {
    build_example("blockstore", out, link)
}

/// Compiles `examples/<name>.c`; returns the binary.
fn build_example(name: &str, out: &Path, link: Link) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    // `cargo test` builds the crate's cdylib and staticlib next to this test binary
    // (`target/<profile>/deps`), from the same sources as the test.
    let lib = deps_dir();
    let file = match link {
        Link::Shared => "libluna.so",
        Link::Static => "libluna.a",
    };
    assert!(
        lib.join(file).exists(),
        "no {file} in {} (cargo builds it with the crate)",
        lib.display()
    );
    let bin = out.join(format!("{name}-{link:?}").to_lowercase());
    let mut cc = Command::new("cc");
    cc.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-I"])
        .arg(dir.join("include"))
        .arg(dir.join(format!("examples/{name}.c")));
    match link {
        Link::Shared => {
            cc.arg("-L")
                .arg(&lib)
                .arg(format!("-Wl,-rpath,{}", lib.display()))
                .arg("-lluna");
        }
        Link::Static => {
            let pc = Command::new("pkg-config")
                .args(["--libs", "libdpdk"])
                .output()
                .expect("run pkg-config (make setup installs it)");
            assert!(pc.status.success(), "pkg-config --libs libdpdk failed");
            cc.arg(lib.join(file))
                .args(String::from_utf8_lossy(&pc.stdout).split_whitespace())
                .args(["-ldl", "-lm", "-lgcc_s"]);
        }
    }
    let st = cc
        .args(["-lpthread", "-o"])
        .arg(&bin)
        .status()
        .expect("run cc (apt-get install build-essential)");
    assert!(
        st.success(),
        "cc failed to build blockstore.c ({link:?}): {st}"
    );
    bin
}

/// One memif run at a time: both sides poll the machine's two CPUs.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// EAL arguments as knb places a memif side: main lcore on `cpu`, no telemetry, no
/// runtime files.
fn eal(p: &DpdkPort, cpu: usize) -> Vec<String> {
    let mut e = p.eal.clone();
    e.lcores = cpu.to_string();
    e.extra = vec!["--no-telemetry".into(), "--in-memory".into()];
    e.args()
}

fn toml_list(v: &[String]) -> String {
    let q: Vec<String> = v
        .iter()
        .map(|s| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("[{}]", q.join(", "))
}

struct Proc {
    child: Child,
    out: std::thread::JoinHandle<String>,
    err: std::thread::JoinHandle<String>,
}

fn spawn(mut cmd: Command) -> Proc {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let read = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(r) = r {
                for l in BufReader::new(r).lines().map_while(Result::ok) {
                    s.push_str(&l);
                    s.push('\n');
                }
            }
            s
        })
    };
    let out = read(
        child
            .stdout
            .take()
            .map(|o| Box::new(o) as Box<dyn Read + Send>),
    );
    let err = read(
        child
            .stderr
            .take()
            .map(|o| Box::new(o) as Box<dyn Read + Send>),
    );
    Proc { child, out, err }
}

impl Proc {
    /// Waits (kills past `limit`); (exit ok, stdout, stderr).
    fn wait(mut self, limit: Duration) -> (bool, String, String) {
        let end = Instant::now() + limit;
        let ok = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break st.success(),
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break false;
                }
            }
        };
        (
            ok,
            self.out.join().unwrap_or_default(),
            self.err.join().unwrap_or_default(),
        )
    }
}

/// `key=value` of the first line starting with `prefix`.
fn field(out: &str, prefix: &str, key: &str) -> u64 {
    let line = out
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} line in:\n{out}"));
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line}"))
}

#[test]
fn knb_luna_client_verifies_blocks_served_by_the_c_example() {
    serve_and_verify(Link::Shared, "s");
}

#[test]
fn the_c_example_linked_with_the_staticlib_serves_knb_too() {
    serve_and_verify(Link::Static, "a");
}

fn serve_and_verify(link: Link, tag: &str) {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let knb = profile_dir().join("knb");
    assert!(
        knb.exists(),
        "{} is missing: build it with `cargo build -p knb` (cargo test --workspace does)",
        knb.display()
    );
    let prefix = Prefix::new(&format!("lcap{tag}{}", std::process::id() % 100_000)).unwrap();
    let topo = Topology::up(Kind::Memif, &prefix).expect("memif topology (root, make setup)");
    let m = topo.memif().expect("memif details").clone();
    let _ = std::fs::remove_file(&m.socket);
    r2c::device::dpdk::memif_quiesce_reset(&m.socket);
    let work = prefix.state_dir().join("capi");
    std::fs::create_dir_all(&work).expect("work dir");
    let bin = build_blockstore(&work, link);

    let (server_cpu, client_cpu) = (1 % num_cpus(), 0);
    let config = format!(
        "eal = {eal}\n\n[device]\nkind = \"dpdk\"\nport = \"net_memif0\"\n\n[cores]\nlist = [{server_cpu}]\n\n\
         [net]\nip = \"{ip}\"\nprefix_len = {plen}\n\n[runtime]\nidle = \"yield\"\npin = false\n",
        eal = toml_list(&eal(&m.server, server_cpu)),
        ip = m.server.ip,
        plen = m.server.prefix_len,
    );
    let cfg_path = work.join("blockstore.toml");
    std::fs::write(&cfg_path, &config).expect("write config");

    let mut scmd = testbed::netns_command(&m.server.netns, &bin);
    scmd.arg(&cfg_path).args([
        "--port",
        &PORT.to_string(),
        "--blocks",
        "256",
        "--write-reply",
        "block",
        "--conns",
        &CONNS.to_string(),
        "--lifetime",
        "60",
    ]);
    let server = spawn(scmd);
    // The memif server creates its control socket when its port starts.
    let end = Instant::now() + Duration::from_secs(30);
    while !m.socket.exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut ccmd = testbed::netns_command(&m.client.netns, &knb);
    ccmd.arg("client")
        .arg("--stack=luna")
        .arg(format!("--ip={}", m.client.ip))
        .arg(format!("--prefix-len={}", m.client.prefix_len))
        .arg(format!("--server-ip={}", m.server.ip))
        .arg(format!("--port={PORT}"))
        .arg(format!("--cpus={client_cpu}"))
        .args(["--req-size=4096", "--resp-size=4096", "--verify"])
        .arg(format!("--iodepth={IODEPTH}"))
        .arg(format!("--connections={CONNS}"))
        .args(["--duration=1", "--warmup=0", "--child"]);
    for a in eal(&m.client, client_cpu) {
        ccmd.arg(format!("--eal-arg={a}"));
    }
    let client = spawn(ccmd);
    let (cok, cout, cerr) = client.wait(LIMIT);
    let (sok, sout, serr) = server.wait(LIMIT);
    drop(topo);
    println!("server stdout:\n{sout}\nserver stderr:\n{serr}\nclient stderr:\n{cerr}");
    assert!(cok, "knb client failed:\n{cerr}\n{cout}");
    assert!(sok, "blockstore failed:\n{serr}\n{sout}");
    let result = cout
        .lines()
        .find_map(|l| l.strip_prefix("KNB_RESULT "))
        .unwrap_or_else(|| panic!("no KNB_RESULT from the client:\n{cout}"));
    let r: serde_json::Value = serde_json::from_str(result).expect("KNB_RESULT json");
    let errors = r["errors"].as_array().map_or(0, Vec::len);
    assert_eq!(errors, 0, "client errors: {}", r["errors"]);
    let rpcs = r["rpcs"].as_u64().expect("rpcs");
    println!("knb client ({link:?}): {rpcs} RPCs verified");
    assert!(rpcs > 0, "the client completed no RPC: {result}");

    let f = |k| field(&sout, "BLOCKSTORE_RESULT", k);
    let (writes, replies) = (f("writes"), f("replies"));
    assert_eq!(f("errors"), 0, "{sout}");
    assert_eq!(
        f("conns"),
        CONNS,
        "every client connection was served and closed"
    );
    assert_eq!(f("reads"), 0, "the client only wrote");
    assert_eq!(replies, writes, "each write answered with its block");
    assert_eq!(
        f("verified_bytes"),
        writes * 4096,
        "every written byte was checked"
    );
    // The client counts the RPCs completed in its measured window (no warm-up here);
    // the server also answered those still in flight when the window closed.
    assert!(
        writes >= rpcs && writes - rpcs <= CONNS * IODEPTH,
        "server wrote {writes} blocks, client verified {rpcs} replies"
    );
    assert_eq!(field(&sout, "LUNA_STATS", "accepted"), CONNS);
    assert_eq!(field(&sout, "LUNA_CORE0", "accepted"), CONNS);
    assert_eq!(field(&sout, "LUNA_CORE0", "stopped"), 1);
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Reads, acks and the error path, with a kernel client over the tap topology: the
/// client writes 16 blocks (`--write-reply ack`: empty answers), reads them back under
/// other ids (each reply must be knb's response pattern for the reader's id, which the
/// server derives from the stored bytes), then reads a block never written, which the
/// server must refuse by aborting the connection (one counted error, exit status 1).
#[test]
fn kernel_client_reads_back_blocks_written_earlier_over_tap() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let prefix = Prefix::new(&format!("lcapt{}", std::process::id() % 100_000)).unwrap();
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let t = topo.tap().expect("tap details").clone();
    let work = prefix.state_dir().join("capi");
    std::fs::create_dir_all(&work).expect("work dir");
    let bin = build_blockstore(&work, Link::Shared);
    let cpu = 1 % num_cpus();
    let config = format!(
        "eal = {eal}\n\n[device]\nkind = \"dpdk\"\nport = \"{port}\"\n\n[cores]\nlist = [{cpu}]\n\n\
         [net]\nip = \"{ip}\"\nprefix_len = {plen}\n\n[runtime]\nidle = \"yield\"\npin = false\n",
        eal = toml_list(&eal(&t.dpdk, cpu)),
        port = r2c::device::dpdk::port_name_from_vdev(&t.dpdk.eal.vdev).expect("tap vdev"),
        ip = t.dpdk.ip,
        plen = t.dpdk.prefix_len,
    );
    let cfg_path = work.join("blockstore-tap.toml");
    std::fs::write(&cfg_path, &config).expect("write config");
    let mut scmd = testbed::netns_command(&t.dpdk.netns, &bin);
    scmd.arg(&cfg_path).args([
        "--port",
        &PORT.to_string(),
        "--blocks",
        "256",
        "--write-reply",
        "ack",
        "--conns",
        "1",
        "--lifetime",
        "60",
    ]);
    let mut server = spawn(scmd);
    if !tap_up(&t, &mut server) {
        let (_, out, err) = server.wait(Duration::from_secs(1));
        panic!("the tap interface never appeared; server:\n{out}\n{err}");
    }
    let py = format!(
        "import socket,struct,sys\n\
         def pat(i,s,n): return bytes(((i*131+s+k)&0xff) for k in range(n))\n\
         c=socket.create_connection(('{ip}',{PORT}),timeout=10)\n\
         def msg():\n  h=b''\n  while len(h)<16:\n    d=c.recv(16-len(h))\n    if not d: return None\n    h+=d\n  \
         i,n,f,m=struct.unpack('<QIHH',h)\n  p=b''\n  while len(p)<n:\n    d=c.recv(n-len(p))\n    if not d: return None\n    p+=d\n  return i,f,m,p\n\
         c.sendall(b''.join(struct.pack('<QIHH',k,4096,2,0x6e6b)+pat(k,0x11,4096) for k in range(16)))\n\
         for k in range(16):\n  r=msg()\n  assert r==(k,3,0x6e6b,b''), ('ack',k,r and r[:3])\n\
         c.sendall(b''.join(struct.pack('<QIHH',256+k,0,2,0x6e6b) for k in range(16)))\n\
         for k in range(16):\n  r=msg()\n  assert r is not None and r[:3]==(256+k,3,0x6e6b), ('read',k,r and r[:3])\n  \
         assert r[3]==pat(256+k,0x5a,4096), ('read bytes',k)\n\
         print('READS-OK 16', flush=True)\n\
         c.sendall(struct.pack('<QIHH',100,0,2,0x6e6b))\n\
         try:\n  r=msg()\nexcept ConnectionResetError:\n  r=None\n\
         assert r is None, ('unwritten block answered', r and r[:3])\n\
         print('UNWRITTEN-REFUSED', flush=True)\n",
        ip = t.dpdk.ip
    );
    let mut ccmd = t.host.command("python3");
    ccmd.args(["-c", &py]);
    let (cok, cout, cerr) = spawn(ccmd).wait(LIMIT);
    let (sok, sout, serr) = server.wait(LIMIT);
    drop(topo);
    println!("client:\n{cout}{cerr}\nserver stdout:\n{sout}\nserver stderr:\n{serr}");
    assert!(cok, "kernel client failed:\n{cout}\n{cerr}");
    assert!(
        cout.contains("READS-OK 16") && cout.contains("UNWRITTEN-REFUSED"),
        "{cout}"
    );
    assert!(!sok, "the refused read is a counted error: exit status 1");
    let f = |k| field(&sout, "BLOCKSTORE_RESULT", k);
    assert_eq!(f("writes"), 16, "{sout}");
    assert_eq!(f("reads"), 17, "16 answered, 1 refused");
    assert_eq!(f("replies"), 32);
    assert_eq!(f("verified_bytes"), 16 * 4096);
    assert_eq!(f("errors"), 1);
    assert!(serr.contains("read of a block never written"), "{serr}");
}

/// The DPDK process creates the tap and starting its port resets it: configure the
/// kernel side until luna answers a ping (luna_init returns after link up). False when
/// the tap never appeared (the server's output says why).
fn tap_up(t: &testbed::Tap, server: &mut Proc) -> bool {
    let end = Instant::now() + Duration::from_secs(60);
    let mut configured = 0;
    while Instant::now() < end {
        if matches!(server.child.try_wait(), Ok(Some(_))) {
            break; // it failed: its output says why (below)
        }
        if t.configure_host(Duration::from_secs(30)).is_ok() {
            configured += 1;
        }
        std::thread::sleep(Duration::from_millis(500));
        if testbed::netns_command(&t.host.netns, "ping")
            .args(["-c", "1", "-W", "1", &t.dpdk.ip.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            break;
        }
    }
    configured > 0
}

/// The batch API from C: `examples/echo_batch.c` (an epoll loop with the calls replaced
/// by `luna_sock_*`) on the tap topology echoes 300,000 bytes to a kernel client that
/// writes and reads at the same time, then closes; every byte is checked.
#[test]
fn kernel_client_gets_its_bytes_back_from_the_batch_c_example() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let prefix = Prefix::new(&format!("lcapb{}", std::process::id() % 100_000)).unwrap();
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let t = topo.tap().expect("tap details").clone();
    let work = prefix.state_dir().join("capi");
    std::fs::create_dir_all(&work).expect("work dir");
    let bin = build_example("echo_batch", &work, Link::Shared);
    let cpu = 1 % num_cpus();
    let config = format!(
        "eal = {eal}\n\n[device]\nkind = \"dpdk\"\nport = \"{port}\"\n\n[cores]\nlist = [{cpu}]\n\n\
         [net]\nip = \"{ip}\"\nprefix_len = {plen}\n\n[runtime]\nidle = \"yield\"\npin = false\n",
        eal = toml_list(&eal(&t.dpdk, cpu)),
        port = r2c::device::dpdk::port_name_from_vdev(&t.dpdk.eal.vdev).expect("tap vdev"),
        ip = t.dpdk.ip,
        plen = t.dpdk.prefix_len,
    );
    let cfg_path = work.join("echo-batch.toml");
    std::fs::write(&cfg_path, &config).expect("write config");
    let mut scmd = testbed::netns_command(&t.dpdk.netns, &bin);
    scmd.arg(&cfg_path).args(["--port", "7000", "--conns", "1"]);
    let mut server = spawn(scmd);
    if !tap_up(&t, &mut server) {
        let (_, out, err) = server.wait(Duration::from_secs(1));
        panic!("the tap interface never appeared; server:\n{out}\n{err}");
    }
    let py = format!(
        "import socket,threading\n\
         N=300000\n\
         data=bytes(((k*7+k//251)&0xff) for k in range(N))\n\
         c=socket.create_connection(('{ip}',7000),timeout=20)\n\
         def w():\n  c.sendall(data); c.shutdown(socket.SHUT_WR)\n\
         th=threading.Thread(target=w); th.start()\n\
         got=bytearray()\n\
         while True:\n  d=c.recv(1<<16)\n  if not d: break\n  got+=d\n\
         th.join()\n\
         assert bytes(got)==data, ('echo differs', len(got))\n\
         print('ECHO-OK', len(got), flush=True)\n",
        ip = t.dpdk.ip
    );
    let mut ccmd = t.host.command("python3");
    ccmd.args(["-c", &py]);
    let (cok, cout, cerr) = spawn(ccmd).wait(LIMIT);
    let (sok, sout, serr) = server.wait(LIMIT);
    drop(topo);
    println!("client:\n{cout}{cerr}\nserver stdout:\n{sout}\nserver stderr:\n{serr}");
    assert!(
        cok && cout.contains("ECHO-OK 300000"),
        "kernel client failed:\n{cout}\n{cerr}"
    );
    assert!(sok, "echo_batch failed:\n{serr}\n{sout}");
    let f = |k| field(&sout, "ECHO_RESULT", k);
    assert_eq!(f("echoed"), 300_000);
    assert_eq!(f("conns"), 1);
    assert_eq!(f("errors"), 0);
}
