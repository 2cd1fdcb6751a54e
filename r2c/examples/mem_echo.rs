//! RPC ping-pong over the in-memory link: an inline echo server and inline clients, each
//! connection keeping one request in flight. Bounded: runs for `secs` (at most 10).
//!
//! `cargo run --release -p r2c --example mem_echo -- [cores] [conns_per_core] [msg_bytes] [secs]`
//!
//! `conns_per_core` 0 runs both runtimes idle (no connection): with the per-core
//! iteration counts printed at the end, that is the harness for instructions per idle
//! iteration under `valgrind --tool=callgrind` (docs/benchmarks.md, "r2c's poll loop").

use bifurcation::{AppSpec, PartitionPlan, PortRange, Share};
use luna_stack::stack::StackConfig;
use luna_stack::wire::{EthernetAddress, Ipv4Cidr};
use r2c::device::mem::{MemConfig, MemDevice, MemPair};
use r2c::{Conn, CoreOptions, CoreSetup, Ctx, IdleStrategy, InlineApp, Runtime};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use zbuf::Zbuf;

struct Echo;
impl InlineApp for Echo {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        ctx.listen(7, 4096).expect("port 7 free");
    }
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        loop {
            match ctx.recv(conn) {
                Ok(Some(buf)) => {
                    if ctx.send_all(conn, buf).is_err() {
                        return ctx.abort(conn);
                    }
                }
                Ok(None) => return,
                Err(_) => return ctx.close(conn),
            }
        }
    }
}

struct Client {
    conns: usize,
    msg: Zbuf,
    pending: HashMap<Conn, usize>,
    done: Arc<AtomicU64>,
}
impl InlineApp for Client {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        for _ in 0..self.conns {
            let c = ctx
                .connect(SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 7))
                .unwrap();
            self.pending.insert(c, 0);
        }
    }
    fn on_connected(&mut self, ctx: &mut Ctx<'_>, c: Conn) {
        ctx.send_all(c, self.msg.clone()).unwrap();
    }
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, c: Conn) {
        let mut got = self.pending[&c];
        while let Ok(Some(b)) = ctx.recv(c) {
            got += b.len();
        }
        while got >= self.msg.len() {
            got -= self.msg.len();
            self.done.fetch_add(1, Ordering::Relaxed);
            let _ = ctx.send_all(c, self.msg.clone());
        }
        self.pending.insert(c, got);
    }
}

fn setups(
    devs: Vec<MemDevice>,
    ip: Ipv4Addr,
    peer: (Ipv4Addr, EthernetAddress),
) -> Vec<CoreSetup<MemDevice>> {
    let n = devs.len() as u16;
    let plan = PartitionPlan::build(
        PortRange::RESERVED,
        &[AppSpec::new("bench", Share::Rest, n)],
    )
    .unwrap();
    devs.into_iter()
        .enumerate()
        .map(|(i, d)| {
            let cfg = StackConfig::new(d_mac(&d), Ipv4Cidr::new(ip, 24).unwrap());
            let mut s = CoreSetup::new(i, vec![d], cfg);
            s.neighbours.push(peer);
            s.ports = plan.ports_of("bench", i as u16);
            s
        })
        .collect()
}

fn d_mac(d: &MemDevice) -> EthernetAddress {
    use r2c::device::Device;
    d.mac()
}

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|s| s.parse().ok())
        .collect();
    let cores = a.first().copied().unwrap_or(1).max(1) as u16;
    let conns = a.get(1).copied().unwrap_or(1);
    let size = a.get(2).copied().unwrap_or(4096).max(1);
    let secs = a.get(3).copied().unwrap_or(3).clamp(1, 10) as u64;
    let cfg = MemConfig {
        queues_a: cores,
        queues_b: cores,
        ..MemConfig::default()
    };
    let (sa, sb) = MemPair::build(&cfg).unwrap();
    let (ma, mb) = (cfg.mac_a, cfg.mac_b);
    let (ipa, ipb) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
    let opts = CoreOptions {
        idle: IdleStrategy::Yield,
        pin: false,
        ..CoreOptions::default()
    };
    let srv = Runtime::spawn_inline(setups(sa, ipa, (ipb, mb)), opts.clone(), |_| Echo).unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let d2 = done.clone();
    let msg = Zbuf::from_vec(vec![0x5a; size]);
    let cli = Runtime::spawn_inline(setups(sb, ipb, (ipa, ma)), opts, move |_| Client {
        conns,
        msg: msg.clone(),
        pending: HashMap::new(),
        done: d2.clone(),
    })
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let start = (std::time::Instant::now(), done.load(Ordering::Relaxed));
    std::thread::sleep(std::time::Duration::from_secs(secs));
    let (t, n) = (
        start.0.elapsed().as_secs_f64(),
        done.load(Ordering::Relaxed) - start.1,
    );
    cli.stop();
    srv.stop();
    let total = done.load(Ordering::Relaxed);
    for (side, rt) in [("client", cli.join()), ("server", srv.join())] {
        for r in rt.unwrap_or_default() {
            println!(
                "{side} core {}: iterations={} idle_iterations={} rx_frames={} tx_frames={}",
                r.index,
                r.stats.iterations,
                r.stats.idle_iterations,
                r.stats.rx_frames,
                r.stats.tx_frames
            );
        }
    }
    println!("rpcs_total={total}");
    println!(
        "cores={cores} conns/core={conns} msg={size}B: {:.0} RPC/s, {:.2} Gbit/s each way, {:.1} us per RPC per connection",
        n as f64 / t,
        n as f64 * size as f64 * 8.0 / t / 1e9,
        t * 1e6 / (n as f64 / (conns as f64 * f64::from(cores))).max(1.0)
    );
}
