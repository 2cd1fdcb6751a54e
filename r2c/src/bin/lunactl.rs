//! lunactl: look inside a running luna process through its control socket
//! (`[control] socket = "<path>"` in its config): counters, a top-like view, a
//! netstat-like list of luna's connections, and pcapng capture of a port.

use clap::{Parser, Subcommand};
use r2c::control::{request, ClientError, Command, CoreSnapshot, Reply};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "lunactl",
    about = "Inspect a running luna process (counters, connections, capture)"
)]
struct Cli {
    /// The process's control socket ([control] socket in its config).
    #[arg(short, long, default_value = "/run/luna/luna.sock")]
    socket: PathBuf,
    /// Seconds to wait for the process's answer.
    #[arg(long, default_value_t = 10)]
    timeout: u64,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Per-core counters (r2c, stack drops by reason, TCP, connections by state, devices,
    /// DPDK xstats, pools, zbuf).
    Stats {
        /// The process's reply as JSON, unchanged.
        #[arg(long)]
        json: bool,
    },
    /// A refreshing view of rates and gauges.
    Top {
        /// Refreshes before exiting (0 = until interrupted).
        #[arg(long, default_value_t = 0)]
        count: u64,
        /// Milliseconds between refreshes.
        #[arg(long, default_value_t = 1000)]
        interval: u64,
    },
    /// luna's connections, netstat-style.
    Conns {
        /// Listeners instead of connections.
        #[arg(short = 'l', long)]
        listening: bool,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Packet capture of a port into a pcapng file.
    Capture {
        #[command(subcommand)]
        op: CaptureOp,
    },
}

#[derive(Subcommand, Debug)]
enum CaptureOp {
    /// Start capturing (the file is written by the luna process).
    Start {
        /// DPDK port id (0 for the in-memory link).
        #[arg(long)]
        port: u16,
        /// Output file (pcapng); a relative path is made absolute here.
        #[arg(long)]
        file: PathBuf,
        /// Bytes kept per frame.
        #[arg(long)]
        snaplen: Option<u32>,
        /// Ring size in frames (the oldest are dropped, and counted, beyond it).
        #[arg(long)]
        ring_frames: Option<usize>,
    },
    /// Stop capturing and close the file.
    Stop {
        /// DPDK port id.
        #[arg(long)]
        port: u16,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lunactl: {e}");
            ExitCode::FAILURE
        }
    }
}

fn ask(cli: &Cli, cmd: &Command) -> Result<Reply, ClientError> {
    request(&cli.socket, cmd, Duration::from_secs(cli.timeout.max(1)))
}

fn run(cli: &Cli) -> Result<(), ClientError> {
    match &cli.cmd {
        Cmd::Stats { json } => {
            let r = ask(cli, &Command::Stats)?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
            } else {
                print_stats(&r);
            }
        }
        Cmd::Top { count, interval } => {
            top(cli, *count, Duration::from_millis((*interval).max(50)))?
        }
        Cmd::Conns { listening, json } => {
            let r = ask(cli, &Command::Conns)?;
            if *json {
                let v = if *listening {
                    serde_json::to_value(
                        r.cores
                            .iter()
                            .flat_map(|c| &c.listeners)
                            .collect::<Vec<_>>(),
                    )
                } else {
                    serde_json::to_value(r.cores.iter().flat_map(|c| &c.conns).collect::<Vec<_>>())
                };
                println!(
                    "{}",
                    serde_json::to_string_pretty(&v.unwrap_or_default()).unwrap_or_default()
                );
            } else if *listening {
                print_listeners(&r);
            } else {
                print_conns(&r);
            }
        }
        Cmd::Capture { op } => match op {
            CaptureOp::Start {
                port,
                file,
                snaplen,
                ring_frames,
            } => {
                let file = std::path::absolute(file).unwrap_or_else(|_| file.clone());
                let r = ask(
                    cli,
                    &Command::CaptureStart {
                        port: *port,
                        file,
                        snaplen: *snaplen,
                        ring_frames: *ring_frames,
                    },
                )?;
                if let Some(c) = r.capture {
                    println!(
                        "capturing port {} into {} (snaplen {}, ring {} frames, cores {:?})",
                        c.port,
                        c.file.display(),
                        c.snaplen,
                        c.ring_frames,
                        c.cores
                    );
                }
            }
            CaptureOp::Stop { port, json } => {
                let r = ask(cli, &Command::CaptureStop { port: *port })?;
                if let Some(c) = r.capture {
                    if *json {
                        println!("{}", serde_json::to_string_pretty(&c).unwrap_or_default());
                    } else {
                        let s = c.stats.unwrap_or_default();
                        println!(
                            "port {}: {} frames written to {} ({} bytes); {} captured, {} dropped (ring full)",
                            c.port,
                            s.written,
                            c.file.display(),
                            s.file_bytes,
                            s.captured,
                            s.dropped_oldest
                        );
                    }
                }
            }
        },
    }
    Ok(())
}

fn get(m: &BTreeMap<String, u64>, k: &str) -> u64 {
    m.get(k).copied().unwrap_or(0)
}

fn print_stats(r: &Reply) {
    println!("luna process {}, {} core(s)", r.pid, r.cores.len());
    for c in &r.cores {
        println!();
        println!(
            "core {}{}",
            c.core,
            if c.answered {
                ""
            } else {
                " (not answering: stopped? counters from its last publication)"
            }
        );
        section("r2c", &c.stats, false);
        section("stack", &c.stack, true);
        section("tcp", &c.tcp, true);
        section("connections by state", &c.states, false);
        if let Some(p) = c.capture {
            println!("  capture: port {p}");
        }
        for d in &c.devices {
            match d.lcore {
                Some(l) => println!("  device port {} queue {} (lcore {l})", d.port, d.queue),
                None => println!("  device port {} queue {}", d.port, d.queue),
            }
            for (k, v) in &d.stats {
                println!("    {k:<32} {v}");
            }
            for p in &d.pools {
                println!("    pool {:<27} {}/{} in use", p.name, p.in_use, p.size);
            }
            if !d.xstats.is_empty() {
                println!("    xstats:");
                for (k, v) in &d.xstats {
                    println!("      {k:<30} {v}");
                }
            }
        }
    }
    if let Some(z) = &r.zbuf {
        println!();
        println!(
            "zbuf: {} of {} objects in use, {} zones ({} on hugepages), {} bytes mapped, {} allocation failures",
            z.in_use, z.objects, z.zones, z.hugepage_zones, z.mapped_bytes, z.alloc_failures
        );
    }
}

/// Prints a counter group; with `skip_zero_drops`, drop reasons that are 0 are left out.
fn section(name: &str, m: &BTreeMap<String, u64>, skip_zero_drops: bool) {
    if m.is_empty() {
        return;
    }
    println!("  {name}:");
    for (k, v) in m {
        if skip_zero_drops && k.starts_with("drop_") && *v == 0 {
            continue;
        }
        println!("    {k:<32} {v}");
    }
}

fn print_conns(r: &Reply) {
    println!(
        "{:<4} {:<22} {:<22} {:<12} {:>9} {:>9} {:>8} {:>9} {:>6}",
        "core", "local", "remote", "state", "send-q", "recv-q", "cwnd", "srtt-us", "retx"
    );
    for c in r.cores.iter().flat_map(|c| &c.conns) {
        println!(
            "{:<4} {:<22} {:<22} {:<12} {:>9} {:>9} {:>8} {:>9} {:>6}",
            c.core,
            c.local,
            c.remote,
            c.state,
            c.send_queue,
            c.recv_queue,
            c.cwnd,
            c.srtt_us.map_or("-".to_string(), |s| s.to_string()),
            c.retransmits
        );
    }
}

fn print_listeners(r: &Reply) {
    println!(
        "{:<4} {:<22} {:>8} {:>10} {:>13}",
        "core", "local", "backlog", "half-open", "accept-queue"
    );
    for l in r.cores.iter().flat_map(|c| &c.listeners) {
        println!(
            "{:<4} {:<22} {:>8} {:>10} {:>13}",
            l.core, l.local, l.backlog, l.half_open, l.accept_queue
        );
    }
}

fn totals(
    cores: &[CoreSnapshot],
    group: fn(&CoreSnapshot) -> &BTreeMap<String, u64>,
    k: &str,
) -> u64 {
    cores.iter().map(|c| get(group(c), k)).sum()
}

fn top(cli: &Cli, count: u64, interval: Duration) -> Result<(), ClientError> {
    let tty = std::io::stdout().is_terminal();
    let mut last: Option<(Instant, Reply)> = None;
    let mut n = 0u64;
    loop {
        let r = ask(cli, &Command::Stats)?;
        let now = Instant::now();
        if tty {
            // Clear the screen and home the cursor.
            print!("\x1b[2J\x1b[H");
        }
        println!(
            "lunactl top: process {}, {} core(s), every {} ms",
            r.pid,
            r.cores.len(),
            interval.as_millis()
        );
        println!(
            "{:<5} {:>10} {:>10} {:>12} {:>12} {:>8} {:>8} {:>7} {:>7}",
            "core", "rx pps", "tx pps", "rx B/s", "tx B/s", "retx/s", "drops/s", "conns", "estab"
        );
        let rate = |cur: u64, prev: Option<u64>, dt: f64| match prev {
            Some(p) if dt > 0.0 => format!("{:.0}", cur.saturating_sub(p) as f64 / dt),
            _ => "-".to_string(),
        };
        for c in &r.cores {
            let prev = last
                .as_ref()
                .and_then(|(_, l)| l.cores.iter().find(|p| p.core == c.core));
            let dt = last
                .as_ref()
                .map_or(0.0, |(t, _)| now.duration_since(*t).as_secs_f64());
            let s = |k: &str| get(&c.stats, k);
            let ps = |k: &str| prev.map(|p| get(&p.stats, k));
            let drops = get(&c.stack, "drops");
            let pdrops = prev.map(|p| get(&p.stack, "drops"));
            println!(
                "{:<5} {:>10} {:>10} {:>12} {:>12} {:>8} {:>8} {:>7} {:>7}",
                c.core,
                rate(s("rx_frames"), ps("rx_frames"), dt),
                rate(s("tx_frames"), ps("tx_frames"), dt),
                rate(s("rx_bytes"), ps("rx_bytes"), dt),
                rate(s("tx_bytes"), ps("tx_bytes"), dt),
                rate(s("retransmits"), ps("retransmits"), dt),
                rate(drops, pdrops, dt),
                s("open_connections"),
                get(&c.states, "ESTABLISHED"),
            );
        }
        println!(
            "total: accepted {}, connected {}, closed {}, retransmits {}, stack drops {}",
            totals(&r.cores, |c| &c.stats, "accepted"),
            totals(&r.cores, |c| &c.stats, "connected"),
            totals(&r.cores, |c| &c.stats, "closed"),
            totals(&r.cores, |c| &c.tcp, "retransmits"),
            totals(&r.cores, |c| &c.stack, "drops"),
        );
        last = Some((now, r));
        n += 1;
        if count != 0 && n >= count {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}
