//! RPC latency under random loss, on virtual time: two luna stacks on a simulated link
//! (`luna_stack::testutil`), one connection, `rpcs` sequential request/response pairs of
//! `size` bytes each way, every frame lost with probability `loss` (ppm) in both
//! directions. Prints the completion-time distribution of the RPCs with the defaults
//! (RACK-TLP: tail loss probes, `TcpConfig::TLP_FLOOR`, and RACK's reordering timer),
//! also with no ACK delay allowed for a one-segment probe (peers that acknowledge at
//! once, as luna does), with RACK's reordering timer but no probes, and with neither
//! (RFC 6675 and the RTO alone), on the same seeds.
//!
//! `cargo run --release -p luna-stack --example loss_rpc -- [rpcs] [size] [loss_ppm] [seeds] [one_way_us]`
//!
//! Deterministic: the same arguments print the same numbers. A benchmark, not a test: it
//! reports, it asserts nothing.

use luna_stack::tcp::TcpConfig;
use luna_stack::testutil::{LinkConfig, LunaHost, Sim, SimLink, IP_A, IP_B, MAC_A, MAC_B};
use luna_stack::time::{Duration, Instant};
use std::net::SocketAddrV4;
use zbuf::Zbuf;

/// A usage error: what was wrong and the usage line, exit status 2.
fn usage(what: &str) -> ! {
    eprintln!("loss_rpc: {what}\nusage: loss_rpc [rpcs] [size] [loss_ppm] [seeds] [one_way_us]");
    std::process::exit(2)
}

fn arg(args: &[String], i: usize, name: &str, default: u64) -> u64 {
    match args.get(i) {
        None => default,
        Some(a) => a
            .parse()
            .unwrap_or_else(|_| usage(&format!("{name}: not a number: {a}"))),
    }
}

/// Completion times (µs) of `rpcs` sequential RPCs on one seeded lossy link.
fn run(
    tcp: &TcpConfig,
    rpcs: u64,
    size: usize,
    loss_ppm: u32,
    seed: u64,
    delay: Duration,
) -> Vec<u64> {
    let link = LinkConfig {
        delay,
        loss_ppm,
        ..LinkConfig::default()
    };
    let mut sim = Sim::new(
        LunaHost::new(MAC_A, IP_A, tcp.clone(), seed * 2 + 1),
        LunaHost::new(MAC_B, IP_B, tcp.clone(), seed * 2 + 2),
        SimLink::new(link, seed),
    );
    let limit = Instant::from_millis(3_600_000);
    let l = sim.b.stack.listen(80, 4).expect("listen");
    let c = sim
        .a
        .stack
        .connect(sim.now, SocketAddrV4::new(IP_B, 80), None)
        .expect("connect");
    let msg = Zbuf::copy_from_slice(&vec![7u8; size]);
    let mut server = None;
    while server.is_none() {
        while sim.b.stack.poll_event().is_some() {}
        while sim.a.stack.poll_event().is_some() {}
        server = sim.b.stack.accept(l);
        assert!(sim.now < limit && sim.step(), "no connection");
    }
    let s = server.expect("accepted");
    // Let the handshake's last ACK land before timing.
    sim.advance_to(sim.now + delay * 4);
    let mut times = Vec::with_capacity(rpcs as usize);
    for _ in 0..rpcs {
        let start = sim.now;
        let (mut sent, mut req, mut answered, mut resp) = (0, 0, 0, 0);
        while resp < size {
            if sent < size {
                sent += sim.a.stack.send(c, &msg.slice(sent..size)).unwrap_or(0);
            }
            while sim.b.stack.poll_event().is_some() {}
            while sim.a.stack.poll_event().is_some() {}
            while let Ok(Some(z)) = sim.b.stack.recv(s) {
                req += z.len();
            }
            if req == size && answered < size {
                answered += sim.b.stack.send(s, &msg.slice(answered..size)).unwrap_or(0);
            }
            while let Ok(Some(z)) = sim.a.stack.recv(c) {
                resp += z.len();
            }
            if resp < size {
                assert!(
                    sim.now < limit && sim.step(),
                    "RPC stalled at {:?}",
                    sim.now
                );
            }
        }
        times.push((sim.now - start).as_micros() as u64);
    }
    times
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rpcs = arg(&args, 1, "rpcs", 2_000);
    let size = arg(&args, 2, "size", 4096) as usize;
    let loss = arg(&args, 3, "loss_ppm", 10_000);
    let seeds = arg(&args, 4, "seeds", 5);
    let one_way = arg(&args, 5, "one_way_us", 50);
    if rpcs == 0 || size == 0 || seeds == 0 || loss >= 500_000 || size > 1 << 20 {
        usage("rpcs, size and seeds at least 1, size at most 1 MiB, loss_ppm under 500000");
    }
    let delay = Duration::from_micros(one_way);
    let tlp = TcpConfig::default();
    let tlp_no_ack_delay = TcpConfig {
        tlp_ack_delay: Duration::ZERO,
        ..tlp.clone()
    };
    let rack_only = TcpConfig {
        tlp: None,
        ..TcpConfig::default()
    };
    let neither = TcpConfig {
        rack: false,
        tlp: None,
        ..TcpConfig::default()
    };
    println!(
        "{rpcs} RPCs x {seeds} seeds, {size} B each way, loss {loss} ppm per frame each way, one-way delay {one_way} us"
    );
    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
        "config", "p50 us", "p99 us", "p99.9 us", "max us", "mean us", ">=200ms"
    );
    for (name, cfg) in [
        ("RACK-TLP (the default)", &tlp),
        ("RACK-TLP, tlp_ack_delay 0", &tlp_no_ack_delay),
        ("RACK only (no probes)", &rack_only),
        ("neither (RFC 6675 + RTO)", &neither),
    ] {
        let mut all: Vec<u64> = (0..seeds)
            .flat_map(|seed| run(cfg, rpcs, size, loss as u32, seed + 1, delay))
            .collect();
        all.sort_unstable();
        let q = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)];
        let mean = all.iter().sum::<u64>() as f64 / all.len() as f64;
        let slow = all.iter().filter(|&&t| t >= 200_000).count();
        println!(
            "{name:<28} {:>9} {:>9} {:>9} {:>9} {:>9.0} {:>7}",
            q(0.5),
            q(0.99),
            q(0.999),
            all[all.len() - 1],
            mean,
            slow
        );
    }
}
