//! `DpdkDevice` under a real `luna_stack::stack::Stack`, on the testbed's topologies:
//!
//! * memif: two DPDK processes, each a Stack over a DpdkDevice, open a TCP connection and
//!   move 64 MiB byte-exact, with no payload copy on either side.
//! * tap: the kernel (inside the topology's namespace) talks to the luna stack both as a
//!   client (luna echoes its bytes back zero-copy) and as a server (luna sends, the kernel
//!   checks).
//!
//! Each DPDK process is this test binary re-executed inside the topology's namespace with
//! its role set (`common/children.rs`) (the ignored `role_child` test is the entry point); it prints an
//! `OK key=value...` line. Needs root, hugepages and the testbed's tools (`make setup`).

use std::collections::VecDeque;
use std::io::Read;
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use dpdk_sys::Eal;
use luna_stack::context::Rng;
use luna_stack::stack::RecvError;
use luna_stack::stack::{Event, SocketHandle, Stack, StackConfig, Transmit};
use luna_stack::tcp::CloseReason;
use luna_stack::time::Instant as StackInstant;
use luna_stack::wire::Ipv4Cidr;
use r2c::device::dpdk::{from_testbed, DpdkDevice};
use r2c::device::Device;
use testbed::{DpdkPort, Kind, Prefix, Topology};

#[path = "common/children.rs"]
mod children;
use children::{field, lines, role_command, spawn, spawn_on_tap, Outcome, ARG, PORT_JSON, ROLE};
use zbuf::dpdk::DmaRegistry;
use zbuf::{copy_stats, CoreCache, Slab, SlabConfig, Zbuf};

const LIMIT: Duration = Duration::from_secs(240);

/// 64 MiB over memif.
const MEMIF_BYTES: u64 = 64 << 20;
/// Each direction over tap (the kernel side is Python).
const TAP_BYTES: u64 = 2 << 20;
const MEMIF_PORT: u16 = 5001;
const TAP_ECHO_PORT: u16 = 7000;
const TAP_KERNEL_PORT: u16 = 7001;

/// Byte `i` of every test stream: not periodic at segment sizes.
fn pattern(i: u64) -> u8 {
    ((i as u32).wrapping_mul(2_654_435_761) >> 24) as u8
}

const PY_PATTERN: &str = "bytes(((i * 2654435761) & 0xffffffff) >> 24 for i in range(N))";

// ---------------------------------------------------------------- parent side

#[test]
fn memif_two_stacks_move_64_mib_without_copying() {
    let prefix = Prefix::new("ldvmem").unwrap();
    let topo = Topology::up(Kind::Memif, &prefix).expect("memif topology (root, make setup)");
    let m = topo.memif().expect("memif details").clone();
    let server = spawn(role_command("memif-server", &m.server, ""), "memif server");
    let client = spawn(
        role_command("memif-client", &m.client, &m.socket.display().to_string()),
        "memif client",
    );
    let (c_out, s_out) = (client.wait(LIMIT), server.wait(LIMIT));
    drop(topo);
    let got = lines(&[(&c_out, "OK "), (&s_out, "OK ")]);
    let (c, s) = (&got[0], &got[1]);
    assert_eq!(field(s, "received"), MEMIF_BYTES, "{s}");
    assert_eq!(field(c, "sent"), MEMIF_BYTES, "{c}");
    for line in [s, c] {
        assert_eq!(field(line, "device_copied"), 0, "{line}");
        assert_eq!(field(line, "zbuf_copied"), 0, "{line}");
        assert_eq!(field(line, "rx_flattened"), 0, "{line}");
        assert_eq!(field(line, "tx_in_flight"), 0, "{line}");
        assert_eq!(field(line, "leaked"), 0, "{line}");
        // A frame the ring refused waited built for the next try.
        assert_eq!(field(line, "tx_unsent"), 0, "{line}");
    }
    assert_eq!(
        field(s, "in_zone"),
        field(s, "chunks"),
        "every payload chunk in a zone: {s}"
    );
    // net_memif has no flow API: rte_flow_isolate refuses, nothing to undo.
    assert_software_fallback(&s_out, s, false);
    assert_software_fallback(&c_out, c, false);
}

#[test]
fn tap_kernel_is_client_and_server_of_the_luna_stack() {
    let prefix = Prefix::new("ldvtap").unwrap();
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let t = topo.tap().expect("tap details").clone();
    let n = TAP_BYTES.to_string();
    // Kernel server first (binds before the tap exists), checks what luna sends.
    let server_py = format!(
        "import socket,sys\nN={n}\n\
         s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         s.bind(('0.0.0.0',{TAP_KERNEL_PORT})); s.listen(1); s.settimeout(120)\n\
         want={PY_PATTERN}\n\
         c,a=s.accept(); c.settimeout(60); buf=bytearray()\n\
         while True:\n  d=c.recv(1<<16)\n  if not d: break\n  buf+=d\n\
         ok = bytes(buf)==want\n\
         c.sendall(b'GOOD' if ok else b'BAD!'); c.close()\n\
         print('KERNEL-SERVER', 'ok' if ok else 'mismatch', len(buf), a[0])\n\
         sys.exit(0 if ok else 1)\n"
    );
    let mut cmd = t.host.command("python3");
    cmd.args(["-c", &server_py]);
    let kserver = spawn(cmd, "kernel server");
    let dpdk = spawn_on_tap(&topo, "tap", "luna on net_tap");
    // Kernel client: sends N bytes, expects them echoed back.
    let client_py = format!(
        "import socket,sys,time\nN={n}\ndata={PY_PATTERN}\n\
         end=time.time()+60\n\
         while True:\n  try:\n    c=socket.create_connection(('{ip}',{TAP_ECHO_PORT}),timeout=5); break\n  \
         except OSError:\n    if time.time()>end: raise\n    time.sleep(0.2)\n\
         c.settimeout(60); c.sendall(data); c.shutdown(socket.SHUT_WR); buf=bytearray()\n\
         while True:\n  d=c.recv(1<<16)\n  if not d: break\n  buf+=d\n\
         ok = bytes(buf)==data\n\
         print('KERNEL-CLIENT', 'ok' if ok else 'mismatch', len(buf))\n\
         sys.exit(0 if ok else 1)\n",
        ip = t.dpdk.ip
    );
    let mut cmd = t.host.command("python3");
    cmd.args(["-c", &client_py]);
    let kclient = spawn(cmd, "kernel client");
    let (kc, ks, d_out) = (kclient.wait(LIMIT), kserver.wait(LIMIT), dpdk.wait(LIMIT));
    drop(topo);
    let got = lines(&[
        (&kc, "KERNEL-CLIENT ok"),
        (&ks, "KERNEL-SERVER ok"),
        (&d_out, "OK "),
    ]);
    let (kc, ks, d) = (&got[0], &got[1], &got[2]);
    assert!(kc.contains(&n), "{kc}");
    assert!(ks.contains(&format!("{n} {}", t.dpdk.ip)), "{ks}");
    assert_eq!(field(d, "echoed"), TAP_BYTES, "{d}");
    assert_eq!(field(d, "sent"), TAP_BYTES, "{d}");
    assert_eq!(field(d, "device_copied"), 0, "{d}");
    assert_eq!(field(d, "zbuf_copied"), 0, "{d}");
    assert_eq!(field(d, "leaked"), 0, "{d}");
    // net_tap took the isolation but not the rules: undone, and the traffic above flowed.
    assert_software_fallback(&d_out, d, true);
}

/// Regression: a second DPDK process opening the same net_tap `iface=` silently took the
/// interface over (the kernel attached it as another queue) and cut the first off. Now the
/// second is refused before EAL starts, naming the interface and the first process, and the
/// first still answers the kernel's ping.
#[test]
fn second_process_on_the_same_tap_is_refused_and_the_first_keeps_working() {
    let prefix = Prefix::new("ldvtapdup").unwrap();
    let topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let t = topo.tap().expect("tap details").clone();
    let first = spawn_on_tap(&topo, "tap-hold", "first luna on net_tap");
    let ready = topo.state_dir().join("r2c-tap-hold-ready");
    let first_pid = std::fs::read_to_string(&ready).unwrap_or_default();
    // Its own file prefix, so only the interface is shared.
    let mut port2 = t.dpdk.clone();
    port2.eal.file_prefix.push_str("-2");
    let second = spawn(
        role_command("tap-second", &port2, ""),
        "second luna on net_tap",
    )
    .wait(LIMIT);
    let ping = t.host.ping(
        t.dpdk.ip,
        3,
        Duration::from_millis(200),
        Duration::from_secs(1),
    );
    let _ = std::fs::remove_file(&ready);
    let first = first.wait(LIMIT);
    drop(topo);
    let got = lines(&[(&second, "OK "), (&first, "OK ")]);
    let refused = &got[0];
    assert!(refused.contains("refused:"), "{refused}");
    assert!(
        refused.contains(&format!("tap interface {} ", t.host.iface)),
        "{refused}"
    );
    assert!(
        refused.contains(&format!("pid {}", first_pid.trim())),
        "{refused}"
    );
    let ping = ping.expect("ping the first process after the refusal");
    assert_eq!(ping.received, ping.transmitted, "{ping:?}");
    assert!(field(&got[1], "rx_frames") > 0, "{}", got[1]);
}

#[test]
fn opening_a_missing_port_is_a_clean_error() {
    let prefix = Prefix::new("ldvbad").unwrap();
    let topo = Topology::up(Kind::Memif, &prefix).expect("memif topology");
    let m = topo.memif().expect("memif").clone();
    let d = spawn(role_command("bad-open", &m.server, ""), "bad open").wait(LIMIT);
    drop(topo);
    let d = &lines(&[(&d, "OK ")])[0];
    assert!(d.contains("no-such-port"), "{d}");
}

/// A memif zero-copy client whose slab is not EAL memory is refused at open with the
/// fix in the message (its peer would otherwise read and write outside the shared
/// region; DPDK would not even connect).
#[test]
fn memif_zero_copy_client_refuses_a_slab_outside_eal_memory() {
    let prefix = Prefix::new("ldvzc").unwrap();
    let topo = Topology::up(Kind::Memif, &prefix).expect("memif topology");
    let mut client = topo.memif().expect("memif").client.clone();
    client.eal.vdev.push_str(",zero-copy=yes");
    // --single-file-segments needs --in-memory next to the testbed's --huge-unlink.
    client.eal.extra.push("--single-file-segments".into());
    client.eal.extra.push("--in-memory".into());
    let d = spawn(role_command("bad-zero-copy", &client, ""), "bad zero-copy").wait(LIMIT);
    drop(topo);
    let d = &lines(&[(&d, "OK ")])[0];
    assert!(d.contains("dpdk_memory_slab_config"), "{d}");
}

// ---------------------------------------------------------------- child side

/// ISN/cookie randomness from the OS.
struct OsRng(std::fs::File);

impl Rng for OsRng {
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.0.read_exact(dest).expect("/dev/urandom");
    }
}

/// A Stack over a DpdkDevice with the poll loop of a run-to-completion core.
struct Node {
    dev: DpdkDevice,
    stack: Stack<OsRng>,
    epoch: Instant,
    rx: Vec<Zbuf>,
    tx: VecDeque<Transmit>,
}

impl Node {
    fn now(&self) -> StackInstant {
        StackInstant::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    /// One iteration: receive, timers, transmit. Returns whether anything happened.
    fn poll(&mut self) -> bool {
        let now = self.now();
        let n = self.dev.rx_burst(&mut self.rx, 64);
        for f in self.rx.drain(..) {
            self.stack.handle_frame(now, f);
        }
        if self.stack.poll_timeout().is_some_and(|t| t <= now) {
            self.stack.handle_timeouts(now);
        }
        let mut sent = 0;
        loop {
            while self.tx.len() < 64 {
                match self.stack.poll_transmit(now) {
                    Some(t) => self.tx.push_back(t),
                    None => break,
                }
            }
            if self.tx.is_empty() {
                break;
            }
            let k = self.dev.tx_burst(&mut self.tx);
            sent += k;
            if k == 0 {
                break; // ring full: keep the rest for the next iteration
            }
        }
        if n == 0 && sent == 0 {
            std::thread::yield_now();
        }
        n > 0 || sent > 0
    }
}

struct Env {
    _eal: Eal,
    slab: Slab,
    cache: CoreCache,
    node: Node,
}

fn setup(port: &DpdkPort) -> Env {
    let (args, mut cfg) = from_testbed(port).expect("testbed port");
    // Software checksums on every link here, memif included: this test is where the
    // stack's checksum paths meet a real device (the runtime tests use the memif default).
    cfg.virtual_link_checksums = false;
    cfg.steering = Some(steering_request());
    // The zero-copy transmit path is what these tests prove on a real device: no flat
    // copies, though net_memif in copy mode would choose them by default.
    cfg.tx_copy_max = Some(0);
    let eal = Eal::init(args).unwrap_or_else(|e| panic!("EAL: {e}"));
    let reg = DmaRegistry::new(&eal);
    let slab = Slab::new(reg.slab_config(SlabConfig::new().max_memory(160 << 20))).expect("slab");
    let cache = slab.core_cache(0).expect("core cache");
    let dev = DpdkDevice::open(&eal, &slab, &reg, &cfg).unwrap_or_else(|e| panic!("open: {e}"));
    assert_eq!(dev.mac().0, port.mac.0, "the vdev's MAC");
    assert_eq!(dev.tx_copy_max(), 0, "configured: never copy flat");
    assert!(dev.caps() == luna_stack::wire::ChecksumCaps::software());
    let mut sc = StackConfig::new(
        dev.mac(),
        Ipv4Cidr::new(port.ip, port.prefix_len).expect("cidr"),
    );
    sc.mtu = dev.mtu();
    sc.caps = dev.caps();
    let rng = OsRng(std::fs::File::open("/dev/urandom").expect("urandom"));
    let stack = Stack::new(sc, rng).expect("stack config");
    Env {
        _eal: eal,
        slab,
        cache,
        node: Node {
            dev,
            stack,
            epoch: Instant::now(),
            rx: Vec::with_capacity(64),
            tx: VecDeque::new(),
        },
    }
}

/// Sends a pattern stream: fills 16 KiB slab buffers, hands them to the stack.
struct Sender {
    total: u64,
    queued: u64,
    pending: Option<Zbuf>,
}

impl Sender {
    fn new(total: u64) -> Self {
        Sender {
            total,
            queued: 0,
            pending: None,
        }
    }

    fn done(&self) -> bool {
        self.queued == self.total && self.pending.is_none()
    }

    /// Queues as much as the connection takes. The bytes are produced in place (the
    /// application writing its data), not copied from elsewhere.
    fn pump(&mut self, cache: &CoreCache, stack: &mut Stack<OsRng>, h: SocketHandle) {
        loop {
            let z = match self.pending.take() {
                Some(z) => z,
                None if self.queued < self.total => {
                    let n = (self.total - self.queued).min(16 * 1024 - 128) as usize;
                    let mut m = cache.alloc(n).expect("slab buffer");
                    let at = self.queued;
                    for (i, b) in m.append(n).expect("room").iter_mut().enumerate() {
                        *b = pattern(at + i as u64);
                    }
                    self.queued += n as u64;
                    m.freeze()
                }
                None => return,
            };
            match stack.send(h, &z) {
                Ok(n) if n == z.len() => {}
                Ok(n) => {
                    self.pending = Some(z.slice(n..));
                    return;
                }
                Err(luna_stack::stack::SendError::WouldBlock) => {
                    self.pending = Some(z);
                    return;
                }
                Err(e) => panic!("send: {e:?}"),
            }
        }
    }
}

/// Entry point of the role children (ignored in normal runs; see the module docs).
#[test]
#[ignore = "child-process entry point, run by the other tests"]
fn role_child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let port: DpdkPort =
        serde_json::from_str(&std::env::var(PORT_JSON).expect("port json")).expect("port");
    let arg = std::env::var(ARG).unwrap_or_default();
    let msg = match role.as_str() {
        "memif-server" => memif_server(&port),
        "memif-client" => memif_client(&port, &arg),
        "tap" => tap(&port, &arg),
        "tap-hold" => tap_hold(&port, &arg),
        "tap-second" => tap_second(&port),
        "bad-open" => bad_open(&port),
        "bad-zero-copy" => bad_zero_copy(&port),
        other => panic!("unknown role {other}"),
    };
    println!("OK {msg}");
}

fn finish(env: Env, extra: String) -> String {
    let Env {
        _eal,
        slab,
        cache,
        node,
    } = env;
    let dev_stats = node.dev.stats();
    let ds = node.dev.dpdk_stats();
    let steering = node.dev.steering().expect("opened with a traffic model");
    drop(node);
    drop(cache);
    let leaked = slab.leak_report().objects_in_use;
    format!(
        "{extra} device_copied={} zbuf_copied={} rx_flattened={} tx_in_flight={} \
         attaches={} leaked={leaked} rx_frames={} tx_frames={} rx_missed={} \
         steering_hw={} steering_fallbacks={} tx_unsent={}",
        dev_stats.copied_bytes,
        copy_stats().bytes,
        ds.rx_flattened,
        ds.tx.in_flight,
        ds.tx.attaches,
        dev_stats.rx_frames,
        dev_stats.tx_frames,
        dev_stats.rx_missed,
        steering.hw(),
        steering.fallbacks(),
        dev_stats.tx_unsent,
    )
}

/// Every role's port is opened asking for hardware steering (`auto`) of a traffic model
/// with the test's listening ports: neither net_memif nor net_tap (without tc flower)
/// can, so each falls back to software with one line, and on net_tap the isolation it
/// accepted is undone — the traffic of the tests below still arrives.
fn steering_request() -> r2c::device::steering::SteeringRequest {
    let model = bifurcation::TrafficConfig {
        listen_tcp: vec![MEMIF_PORT, TAP_ECHO_PORT],
        apps: vec![bifurcation::model::AppConfig {
            name: "t".into(),
            ports: Default::default(),
            threads: Some(1),
            queues: None,
        }],
        ..bifurcation::TrafficConfig::default()
    }
    .validate(&bifurcation::KernelPorts::parse("32768 60999", "").expect("kernel ports"))
    .expect("traffic model");
    r2c::device::steering::SteeringRequest {
        mode: r2c::device::steering::SteeringMode::Auto,
        rules: bifurcation::compile(&model),
    }
}

/// The steering fallback, as a role child's stderr and OK line show it.
fn assert_software_fallback(o: &Outcome, line: &str, undo: bool) {
    assert_eq!(field(line, "steering_hw"), 0, "{line}");
    assert_eq!(field(line, "steering_fallbacks"), 1, "{line}");
    assert_eq!(
        o.err.matches("no hardware steering").count(),
        1,
        "one fallback line: {}",
        o.err
    );
    assert!(o.err.contains("falling back to software"), "{}", o.err);
    if undo {
        assert!(o.err.contains("isolation turned off again"), "{}", o.err);
    }
}

fn deadline() -> Instant {
    Instant::now() + LIMIT - Duration::from_secs(20)
}

fn memif_server(port: &DpdkPort) -> String {
    let mut env = setup(port);
    let l = env.node.stack.listen(MEMIF_PORT, 16).expect("listen");
    let end = deadline();
    let mut conn = None;
    let (mut received, mut chunks, mut in_zone) = (0u64, 0u64, 0u64);
    let mut finished = false;
    let mut closed = false;
    while !closed {
        assert!(Instant::now() < end, "timeout: {received} bytes received");
        env.node.poll();
        while let Some(ev) = env.node.stack.poll_event() {
            match ev {
                Event::Acceptable(_) => {
                    conn = env.node.stack.accept(l);
                }
                Event::Closed(h) if Some(h) == conn => closed = true,
                _ => {}
            }
        }
        let Some(h) = conn else { continue };
        if finished {
            // Closed by us: the handle is released, the stack finishes the close alone.
            if env.node.stack.connection_count() == 0 {
                closed = true;
            }
            continue;
        }
        loop {
            match env.node.stack.recv(h) {
                Ok(Some(z)) => {
                    chunks += 1;
                    if env.node.dev.rx_pool().contains(z.addr()) {
                        in_zone += 1;
                    }
                    for (i, &b) in z.iter().enumerate() {
                        assert_eq!(
                            b,
                            pattern(received + i as u64),
                            "byte {}",
                            received + i as u64
                        );
                    }
                    received += z.len() as u64;
                }
                Ok(None) => break,
                Err(RecvError::Finished) => {
                    if !finished {
                        finished = true;
                        // Reply so the client knows every byte arrived, then close.
                        let ack = Zbuf::from_static(b"GOOD");
                        assert_eq!(env.node.stack.send(h, &ack), Ok(4));
                        env.node.stack.close(h);
                    }
                    break;
                }
                Err(e) => panic!("recv: {e:?} after {received} bytes"),
            }
        }
    }
    // Let the last ACKs go out.
    let linger = Instant::now() + Duration::from_millis(300);
    while Instant::now() < linger {
        env.node.poll();
    }
    finish(
        env,
        format!("received={received} chunks={chunks} in_zone={in_zone}"),
    )
}

fn memif_client(port: &DpdkPort, _socket: &str) -> String {
    let mut env = setup(port);
    let end = deadline();
    let now = env.node.now();
    let h = env
        .node
        .stack
        .connect(now, SocketAddrV4::new(port.peer_ip, MEMIF_PORT), None)
        .expect("connect");
    let mut sender = Sender::new(MEMIF_BYTES);
    let mut connected = false;
    let mut shut = false;
    let mut reply = Vec::new();
    let started = Instant::now();
    let mut done_at = None;
    loop {
        assert!(
            Instant::now() < end,
            "timeout: {} bytes queued",
            sender.queued
        );
        env.node.poll();
        while let Some(ev) = env.node.stack.poll_event() {
            match ev {
                Event::Connected(x) if x == h => connected = true,
                _ => {}
            }
        }
        if connected && !shut {
            sender.pump(&env.cache, &mut env.node.stack, h);
            if sender.done() {
                env.node.stack.shutdown(h);
                shut = true;
            }
        }
        loop {
            match env.node.stack.recv(h) {
                Ok(Some(z)) => reply.extend_from_slice(&z),
                Ok(None) => break,
                Err(_) => {
                    done_at.get_or_insert_with(Instant::now);
                    break;
                }
            }
        }
        if done_at.is_some() {
            break;
        }
    }
    let secs = done_at.unwrap().duration_since(started).as_secs_f64();
    assert_eq!(
        reply,
        b"GOOD",
        "the server saw every byte (close reason {:?})",
        env.node.stack.close_reason(h)
    );
    env.node.stack.close(h);
    let linger = Instant::now() + Duration::from_millis(300);
    while Instant::now() < linger {
        env.node.poll();
    }
    finish(
        env,
        format!(
            "sent={} secs={secs:.2} mbit_s={:.0}",
            sender.queued,
            sender.queued as f64 * 8.0 / secs / 1e6
        ),
    )
}

/// Opens the tap, writes its pid to `ready` and answers ARP/ICMP until `ready` is removed.
fn tap_hold(port: &DpdkPort, ready: &str) -> String {
    let mut env = setup(port);
    std::fs::write(ready, std::process::id().to_string()).expect("ready file");
    let end = deadline();
    while std::path::Path::new(ready).exists() {
        assert!(Instant::now() < end, "timeout: {ready} was not removed");
        env.node.poll();
    }
    finish(env, "held=1".into())
}

/// Tries to start EAL on a tap another process has open: must be refused.
fn tap_second(port: &DpdkPort) -> String {
    let (args, _) = from_testbed(port).expect("testbed port");
    match Eal::init(args) {
        Ok(_) => panic!("a second process started EAL on the tap interface in use"),
        Err(e) => format!("refused: {}", e.to_string().replace('\n', " | ")),
    }
}

fn tap(port: &DpdkPort, ready: &str) -> String {
    let mut env = setup(port);
    std::fs::write(ready, b"open").expect("ready file");
    let end = deadline();
    let l = env.node.stack.listen(TAP_ECHO_PORT, 4).expect("listen");
    let kernel = SocketAddrV4::new(port.peer_ip, TAP_KERNEL_PORT);
    let now = env.node.now();
    let mut out = env.node.stack.connect(now, kernel, None).expect("connect");
    // The kernel side is configured in parallel: retry a refused connection a few times.
    let (mut refused, mut reconnect_at) = (0, None::<Instant>);
    let mut sender = Sender::new(TAP_BYTES);
    let (mut out_up, mut out_shut, mut verdict) = (false, false, Vec::new());
    let mut out_done = false;
    let mut echo: Option<SocketHandle> = None;
    let mut echo_q: VecDeque<Zbuf> = VecDeque::new();
    let (mut echoed, mut echo_eof, mut echo_closed) = (0u64, false, false);
    while !(out_done && echo_closed) {
        assert!(
            Instant::now() < end,
            "timeout: sent {} echoed {echoed}",
            sender.queued
        );
        env.node.poll();
        while let Some(ev) = env.node.stack.poll_event() {
            match ev {
                Event::Connected(h) if h == out => out_up = true,
                Event::Acceptable(_) => echo = env.node.stack.accept(l),
                _ => {}
            }
        }
        if reconnect_at.is_some_and(|t| Instant::now() >= t) {
            reconnect_at = None;
            let now = env.node.now();
            out = env
                .node
                .stack
                .connect(now, kernel, None)
                .expect("reconnect");
        }
        // luna as client: send the stream, read the kernel's verdict.
        if out_up && !out_shut {
            sender.pump(&env.cache, &mut env.node.stack, out);
            if sender.done() {
                env.node.stack.shutdown(out);
                out_shut = true;
            }
        }
        if !out_done && reconnect_at.is_none() {
            loop {
                match env.node.stack.recv(out) {
                    Ok(Some(z)) => verdict.extend_from_slice(&z),
                    Ok(None) => break,
                    Err(_)
                        if !out_up
                            && refused < 20
                            && env.node.stack.close_reason(out) == Some(CloseReason::Refused) =>
                    {
                        refused += 1;
                        reconnect_at = Some(Instant::now() + Duration::from_millis(250));
                        break;
                    }
                    Err(e) => {
                        assert_eq!(
                            verdict,
                            b"GOOD",
                            "the kernel checked our bytes ({e:?}, {:?})",
                            env.node.stack.close_reason(out)
                        );
                        env.node.stack.close(out);
                        out_done = true;
                        break;
                    }
                }
            }
        }
        // luna as server: echo the kernel's bytes back, the received buffers themselves.
        if let Some(h) = echo.filter(|_| !echo_closed) {
            loop {
                match env.node.stack.recv(h) {
                    Ok(Some(z)) => echo_q.push_back(z),
                    Ok(None) => break,
                    Err(_) => {
                        echo_eof = true;
                        break;
                    }
                }
            }
            while let Some(z) = echo_q.pop_front() {
                match env.node.stack.send(h, &z) {
                    Ok(n) => {
                        echoed += n as u64;
                        if n < z.len() {
                            echo_q.push_front(z.slice(n..));
                            break;
                        }
                    }
                    Err(luna_stack::stack::SendError::WouldBlock) => {
                        echo_q.push_front(z);
                        break;
                    }
                    Err(e) => panic!("echo send: {e:?}"),
                }
            }
            if echo_eof && echo_q.is_empty() {
                env.node.stack.close(h);
                echo_closed = true;
            }
        }
    }
    // Let FINs and ACKs go out.
    let linger = Instant::now() + Duration::from_millis(500);
    while Instant::now() < linger {
        env.node.poll();
    }
    finish(
        env,
        format!("sent={} echoed={echoed} refused={refused}", sender.queued),
    )
}

fn bad_zero_copy(port: &DpdkPort) -> String {
    let (args, cfg) = from_testbed(port).expect("testbed port");
    let eal = Eal::init(args).unwrap_or_else(|e| panic!("EAL: {e}"));
    let reg = DmaRegistry::new(&eal);
    let slab = Slab::new(reg.slab_config(SlabConfig::new().max_memory(64 << 20))).unwrap();
    let e = DpdkDevice::open(&eal, &slab, &reg, &cfg).expect_err("zones outside EAL memory");
    let text = e.to_string();
    assert!(text.contains("zero-copy"), "{text}");
    text
}

fn bad_open(port: &DpdkPort) -> String {
    let (args, mut cfg) = from_testbed(port).expect("testbed port");
    let eal = Eal::init(args).unwrap_or_else(|e| panic!("EAL: {e}"));
    let reg = DmaRegistry::new(&eal);
    let slab = Slab::new(reg.slab_config(SlabConfig::new().max_memory(64 << 20))).unwrap();
    cfg.port = "no-such-port".into();
    let e = DpdkDevice::open(&eal, &slab, &reg, &cfg).expect_err("missing port");
    let text = e.to_string();
    assert!(text.contains("no-such-port"), "{text}");
    // Bad sizes are refused before DPDK is touched.
    let mut c2 = from_testbed(port).unwrap().1;
    c2.rx_mbufs = 10;
    let e2 = DpdkDevice::open(&eal, &slab, &reg, &c2).expect_err("rx_mbufs too small");
    assert!(e2.to_string().contains("rx_mbufs"), "{e2}");
    assert!(slab.leak_report().is_clean());
    format!("{text} | {e2}")
}
