//! Differential tests: luna-stack against smoltcp 0.14 (the reference peer) and against
//! itself, in-process over a seeded impaired Ethernet link on virtual time (loss,
//! reordering, duplication, delay/jitter and single-bit corruption).
//!
//! Per seed and role, two connections run at once: a full-duplex bulk transfer and a
//! request/response session. Every byte is checked against a deterministic pattern; the
//! connections must close normally; corrupted frames must be dropped by checksums and
//! counted by luna (`StackDrop::Malformed`).
//!
//! Knobs (environment): `LUNA_DIFF_SEEDS` (default 100), `LUNA_DIFF_SEED_BASE` (seeds run
//! from base + 1), `LUNA_DIFF_SEED` (run one seed),
//! `LUNA_DIFF_SCALE` (multiplies transfer sizes and RPC counts; default 1), `LUNA_DIFF_VERBOSE`
//! (one line per run). The defaults
//! keep each test well under a minute in a debug build; a soak:
//! `LUNA_DIFF_SEEDS=1000 LUNA_DIFF_SCALE=4 cargo test -p luna-stack --release --test differential`.

mod common;

use common::{Bulk, Rpc, SmolHost, Sockets};
use luna_stack::stack::StackDrop;
use luna_stack::tcp::config::CcAlgorithm;
use luna_stack::tcp::{CloseReason, TcpConfig};
use luna_stack::testutil::{
    Endpoint, FakeRng, LinkConfig, LunaHost, Sim, SimLink, IP_A, IP_B, MAC_A, MAC_B,
};
use luna_stack::time::{Duration, Instant};
use smoltcp::socket::tcp;
use std::net::SocketAddrV4;

const BULK_PORT: u16 = 5001;
const RPC_PORT: u16 = 5002;

/// Virtual-time limit per run: generous, since smoltcp's minimum RTO is 1 s.
const VIRTUAL_LIMIT: Duration = Duration::from_secs(900);
/// Step limit per run (a livelock shows up as steps without progress).
const STEP_LIMIT: u64 = 3_000_000;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn verbose() -> bool {
    std::env::var_os("LUNA_DIFF_VERBOSE").is_some()
}

fn seeds() -> Vec<u64> {
    if let Some(one) = std::env::var("LUNA_DIFF_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return vec![one];
    }
    let base = env_u64("LUNA_DIFF_SEED_BASE", 0);
    (base + 1..=base + env_u64("LUNA_DIFF_SEEDS", 100)).collect()
}

/// Sizes of one run, drawn from the seed.
#[derive(Debug, Clone)]
struct Workload {
    bulk_up: u64,
    bulk_down: u64,
    rpcs: Vec<(usize, usize)>,
}

fn workload(seed: u64) -> Workload {
    let scale = env_u64("LUNA_DIFF_SCALE", 1).max(1);
    let mut r = FakeRng::new(seed ^ 0xB01C);
    use luna_stack::context::Rng;
    // 256-384 KiB each way plus 200 RPCs of 1-8 KiB each way per run (tuned to the debug
    // build's time budget). The soak (LUNA_DIFF_SCALE) multiplies both.
    let bulk = |r: &mut FakeRng| (256 * 1024 + u64::from(r.next_u32() % (128 * 1024))) * scale;
    Workload {
        bulk_up: bulk(&mut r),
        bulk_down: bulk(&mut r),
        rpcs: common::rpc_schedule(seed, 200 * scale as usize, 1024, 8192),
    }
}

/// Luna's TCP settings vary with the seed so both congestion controllers, delayed ACKs and
/// the option combinations are covered.
fn luna_tcp(seed: u64) -> TcpConfig {
    let mut c = TcpConfig {
        cc: if seed % 2 == 0 {
            CcAlgorithm::NewReno
        } else {
            CcAlgorithm::Cubic
        },
        rcv_buf: 256 * 1024,
        snd_buf: 256 * 1024,
        ..TcpConfig::default()
    };
    if seed % 3 == 1 {
        c.delayed_ack = Some(Duration::from_millis(5));
    }
    if seed % 5 == 2 {
        c.sack = false;
    }
    if seed % 7 == 3 {
        c.timestamps = false;
    }
    c
}

fn link_for(seed: u64) -> SimLink {
    let mut cfg = LinkConfig::impaired(seed);
    // Every tenth seed runs clean, as a baseline for the impaired ones.
    if seed % 10 == 0 {
        cfg = LinkConfig::clean(cfg.delay);
    }
    SimLink::new(cfg, seed)
}

fn report<A: Endpoint, B: Endpoint>(
    what: &str,
    seed: u64,
    sim: &Sim<A, B>,
    err: &str,
    details: &[String],
) -> String {
    format!(
        "{what} seed {seed} FAILED at {:?} after {} steps: {err}\n  link {:?}\n  stats {:?}\n  {}\n  last segments:\n{}\n  rerun: LUNA_DIFF_SEED={seed} cargo test -p luna-stack --test differential",
        sim.now,
        sim.steps,
        sim.link.config(),
        sim.link.stats(),
        details.join("\n  "),
        sim.link.trace_dump()
    )
}

/// Corrupted frames that reached luna must all be counted as malformed, and nothing else.
fn check_corruption_counted(
    host: &LunaHost<FakeRng>,
    corrupted_to_luna: u64,
) -> Result<(), String> {
    let malformed = host.stack.counters().drops(StackDrop::Malformed);
    if malformed != corrupted_to_luna {
        return Err(format!(
            "luna counted {malformed} malformed frames, the link corrupted {corrupted_to_luna}"
        ));
    }
    Ok(())
}

/// luna is endpoint A, smoltcp endpoint B. `luna_client`: luna connects to smoltcp's
/// listeners, else smoltcp connects to luna's.
/// Calls `poll` (one round of the applications' work; `Ok(true)` once every stream is
/// done) and advances the simulation, until done, an error, the step or time limit, or
/// nothing left to schedule.
fn drive<A: Endpoint, B: Endpoint>(
    sim: &mut Sim<A, B>,
    limit: Instant,
    mut poll: impl FnMut(&mut Sim<A, B>) -> Result<bool, String>,
) -> Result<(), String> {
    loop {
        if poll(sim)? {
            return Ok(());
        }
        if sim.steps > STEP_LIMIT || sim.now >= limit {
            return Err("no completion within the limits".into());
        }
        if !sim.step_until(limit) {
            return Err("stalled: nothing scheduled".into());
        }
    }
}

fn run_luna_smol(seed: u64, luna_client: bool) -> Result<(), String> {
    let w = workload(seed);
    let ts = seed % 4 != 1;
    let mut sim = Sim::new(
        LunaHost::new(MAC_A, IP_A, luna_tcp(seed), seed),
        SmolHost::new(MAC_B.0, IP_B.octets(), seed),
        link_for(seed),
    );
    let smol_buf = 128 * 1024;
    // Luna handles (bulk, rpc) and smoltcp handles (bulk, rpc).
    let (mut l_bulk, mut l_rpc) = (None, None);
    let (s_bulk, s_rpc);
    let mut listeners = None;
    if luna_client {
        s_bulk = sim.b.listen(BULK_PORT, smol_buf, ts);
        s_rpc = sim.b.listen(RPC_PORT, smol_buf, ts);
        let now = sim.now;
        l_bulk = Some(
            sim.a
                .stack
                .connect(now, SocketAddrV4::new(IP_B, BULK_PORT), None)
                .map_err(|e| format!("{e:?}"))?,
        );
        l_rpc = Some(
            sim.a
                .stack
                .connect(now, SocketAddrV4::new(IP_B, RPC_PORT), None)
                .map_err(|e| format!("{e:?}"))?,
        );
    } else {
        let lb = sim
            .a
            .stack
            .listen(BULK_PORT, 4)
            .map_err(|e| format!("{e:?}"))?;
        let lr = sim
            .a
            .stack
            .listen(RPC_PORT, 4)
            .map_err(|e| format!("{e:?}"))?;
        listeners = Some((lb, lr));
        s_bulk = sim.b.connect(IP_A.octets(), BULK_PORT, 49152, smol_buf, ts);
        s_rpc = sim.b.connect(IP_A.octets(), RPC_PORT, 49153, smol_buf, ts);
    }
    // The client sends `bulk_up`, the server `bulk_down`.
    let (luna_tx, smol_tx) = if luna_client {
        (w.bulk_up, w.bulk_down)
    } else {
        (w.bulk_down, w.bulk_up)
    };
    let mut luna_bulk = Bulk::new(seed * 16 + 1, luna_tx, seed * 16 + 2, smol_tx);
    let mut smol_bulk = Bulk::new(seed * 16 + 2, smol_tx, seed * 16 + 1, luna_tx);
    let mut luna_rpc = Rpc::new(w.rpcs.clone(), luna_client, seed * 16 + 4);
    let mut smol_rpc = Rpc::new(w.rpcs.clone(), !luna_client, seed * 16 + 4);
    let limit = Instant::ZERO + VIRTUAL_LIMIT;

    let what = if luna_client {
        "luna client -> smoltcp server"
    } else {
        "smoltcp client -> luna server"
    };
    let mut result = drive(&mut sim, limit, |sim| {
        if let Some((lb, lr)) = listeners {
            common::drain_events(&mut sim.a);
            if l_bulk.is_none() {
                l_bulk = sim.a.stack.accept(lb);
            }
            if l_rpc.is_none() {
                l_rpc = sim.a.stack.accept(lr);
            }
        }
        if let Some(h) = l_bulk {
            luna_bulk
                .poll(&mut sim.a, h)
                .map_err(|e| format!("luna bulk: {e}"))?;
        }
        if let Some(h) = l_rpc {
            luna_rpc
                .poll(&mut sim.a, h)
                .map_err(|e| format!("luna rpc: {e}"))?;
        }
        smol_bulk
            .poll(&mut sim.b, s_bulk)
            .map_err(|e| format!("smoltcp bulk: {e}"))?;
        smol_rpc
            .poll(&mut sim.b, s_rpc)
            .map_err(|e| format!("smoltcp rpc: {e}"))?;
        Ok(luna_bulk.done() && smol_bulk.done() && luna_rpc.done() && smol_rpc.done())
    });
    // Let the closing handshakes finish (lossy link: give retransmissions time).
    if result.is_ok() {
        let end = sim.now + Duration::from_secs(120);
        while sim.step_until(end) {
            let luna_done = [l_bulk, l_rpc]
                .iter()
                .flatten()
                .all(|&h| matches!(sim.a.stack.close_reason(h), Some(CloseReason::Normal)));
            let smol_done = [s_bulk, s_rpc].iter().all(|&h| {
                matches!(
                    sim.b.tcp(h).state(),
                    tcp::State::TimeWait | tcp::State::Closed
                )
            });
            if luna_done && smol_done {
                break;
            }
        }
        for h in [l_bulk, l_rpc].into_iter().flatten() {
            let r = sim.a.stack.close_reason(h);
            if r != Some(CloseReason::Normal) {
                result = Err(format!("luna connection closed with {r:?}, not Normal"));
            }
        }
        for h in [s_bulk, s_rpc] {
            let st = sim.b.tcp(h).state();
            if !matches!(st, tcp::State::TimeWait | tcp::State::Closed) {
                result = Err(format!("smoltcp socket left in {st}"));
            }
        }
    }
    if result.is_ok() {
        result = check_corruption_counted(&sim.a, sim.link.stats().corrupted[1]);
    }
    if verbose() {
        eprintln!(
            "seed {seed} luna_client {luna_client}: {:?} virtual, {} steps, {:?}, luna tcp {:?}",
            sim.now,
            sim.steps,
            sim.link.stats(),
            sim.a.stack.tcp_counters()
        );
    }
    result.map_err(|e| {
        let mut details = vec![
            format!("luna bulk: {}", luna_bulk.progress()),
            format!("smoltcp bulk: {}", smol_bulk.progress()),
            format!("luna rpc: {}", luna_rpc.progress()),
            format!("smoltcp rpc: {}", smol_rpc.progress()),
            format!("smoltcp ts {ts}, luna tcp {:?}", luna_tcp(seed)),
        ];
        for h in [l_bulk, l_rpc].into_iter().flatten() {
            details.push(sim.a.describe(h));
        }
        for h in [s_bulk, s_rpc] {
            details.push(sim.b.describe(h));
        }
        details.push(format!("luna stack counters {:?}", sim.a.stack.counters()));
        report(what, seed, &sim, &e, &details)
    })
}

/// luna against luna: A connects to B's listeners.
fn run_luna_luna(seed: u64) -> Result<(), String> {
    let w = workload(seed);
    let mut tcp_b = luna_tcp(seed + 1);
    tcp_b.cc = luna_tcp(seed).cc;
    let mut sim = Sim::new(
        LunaHost::new(MAC_A, IP_A, luna_tcp(seed), seed),
        LunaHost::new(MAC_B, IP_B, tcp_b, seed + 1000),
        link_for(seed),
    );
    let lb = sim
        .b
        .stack
        .listen(BULK_PORT, 4)
        .map_err(|e| format!("{e:?}"))?;
    let lr = sim
        .b
        .stack
        .listen(RPC_PORT, 4)
        .map_err(|e| format!("{e:?}"))?;
    let now = sim.now;
    let c_bulk = sim
        .a
        .stack
        .connect(now, SocketAddrV4::new(IP_B, BULK_PORT), None)
        .map_err(|e| format!("{e:?}"))?;
    let c_rpc = sim
        .a
        .stack
        .connect(now, SocketAddrV4::new(IP_B, RPC_PORT), None)
        .map_err(|e| format!("{e:?}"))?;
    let (mut s_bulk, mut s_rpc) = (None, None);
    let mut a_bulk = Bulk::new(seed * 16 + 1, w.bulk_up, seed * 16 + 2, w.bulk_down);
    let mut b_bulk = Bulk::new(seed * 16 + 2, w.bulk_down, seed * 16 + 1, w.bulk_up);
    let mut a_rpc = Rpc::new(w.rpcs.clone(), true, seed * 16 + 4);
    let mut b_rpc = Rpc::new(w.rpcs.clone(), false, seed * 16 + 4);
    let limit = Instant::ZERO + VIRTUAL_LIMIT;
    let mut result = drive(&mut sim, limit, |sim| {
        common::drain_events(&mut sim.a);
        common::drain_events(&mut sim.b);
        if s_bulk.is_none() {
            s_bulk = sim.b.stack.accept(lb);
        }
        if s_rpc.is_none() {
            s_rpc = sim.b.stack.accept(lr);
        }
        a_bulk
            .poll(&mut sim.a, c_bulk)
            .map_err(|e| format!("A bulk: {e}"))?;
        a_rpc
            .poll(&mut sim.a, c_rpc)
            .map_err(|e| format!("A rpc: {e}"))?;
        if let Some(h) = s_bulk {
            b_bulk
                .poll(&mut sim.b, h)
                .map_err(|e| format!("B bulk: {e}"))?;
        }
        if let Some(h) = s_rpc {
            b_rpc
                .poll(&mut sim.b, h)
                .map_err(|e| format!("B rpc: {e}"))?;
        }
        Ok(a_bulk.done() && b_bulk.done() && a_rpc.done() && b_rpc.done())
    });
    if result.is_ok() {
        let end = sim.now + Duration::from_secs(120);
        let handles_b: Vec<_> = [s_bulk, s_rpc].into_iter().flatten().collect();
        while sim.step_until(end) {
            let a_ok = [c_bulk, c_rpc]
                .iter()
                .all(|&h| sim.a.stack.close_reason(h) == Some(CloseReason::Normal));
            let b_ok = handles_b
                .iter()
                .all(|&h| sim.b.stack.close_reason(h) == Some(CloseReason::Normal));
            if a_ok && b_ok {
                break;
            }
        }
        for (host, hs) in [(&sim.a, vec![c_bulk, c_rpc]), (&sim.b, handles_b)] {
            for h in hs {
                if host.stack.close_reason(h) != Some(CloseReason::Normal) {
                    result = Err(format!("{}: not closed normally", host.describe(h)));
                }
            }
        }
    }
    if result.is_ok() {
        result = check_corruption_counted(&sim.a, sim.link.stats().corrupted[1])
            .and_then(|_| check_corruption_counted(&sim.b, sim.link.stats().corrupted[0]));
    }
    if verbose() {
        eprintln!(
            "seed {seed} luna-luna: {:?} virtual, {} steps, {:?}, A tcp {:?}",
            sim.now,
            sim.steps,
            sim.link.stats(),
            sim.a.stack.tcp_counters()
        );
    }
    result.map_err(|e| {
        let mut details = vec![
            format!("A bulk: {}", a_bulk.progress()),
            format!("B bulk: {}", b_bulk.progress()),
            format!("A rpc: {}", a_rpc.progress()),
            format!("B rpc: {}", b_rpc.progress()),
            sim.a.describe(c_bulk),
            sim.a.describe(c_rpc),
        ];
        for h in [s_bulk, s_rpc].into_iter().flatten() {
            details.push(sim.b.describe(h));
        }
        report("luna <-> luna", seed, &sim, &e, &details)
    })
}

fn run_all(name: &str, f: impl Fn(u64) -> Result<(), String>) {
    let started = std::time::Instant::now();
    let seeds = seeds();
    let mut failures = Vec::new();
    for &seed in &seeds {
        if let Err(e) = f(seed) {
            eprintln!("{e}");
            failures.push(seed);
        }
    }
    eprintln!(
        "{name}: {} seeds in {:.1} s, {} failed",
        seeds.len(),
        started.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(failures.is_empty(), "{name}: failing seeds {failures:?}");
}

#[test]
fn differential_luna_client_smoltcp_server() {
    run_all("luna client / smoltcp server", |s| run_luna_smol(s, true));
}

#[test]
fn differential_smoltcp_client_luna_server() {
    run_all("smoltcp client / luna server", |s| run_luna_smol(s, false));
}

#[test]
fn differential_luna_luna() {
    run_all("luna <-> luna", run_luna_luna);
}
