//! `testbed`: bring the NIC-less topologies up and down, impair links, clean up.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use testbed::{
    daemon, impair, parse_duration, parse_percent, parse_rate, Details, Error, Impairment, Kind,
    Prefix, Result, Topology,
};

#[derive(Parser)]
#[command(
    name = "testbed",
    version,
    about = "luna's NIC-less testbed: namespaces, veth/tap/af_packet/memif, impairments"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args)]
struct PrefixArg {
    /// Name prefix of everything created (1-10 lowercase letters/digits).
    #[arg(long, env = "LUNA_TESTBED_PREFIX", default_value = "luna")]
    prefix: String,
}

impl PrefixArg {
    fn get(&self) -> Result<Prefix> {
        Prefix::new(&self.prefix)
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Install packages, reserve hugepages, mount hugetlbfs (runs testbed/setup.sh).
    Setup,
    /// Bring a topology up (idempotent): memif, tap, afpacket, veth or coexist.
    Up {
        /// memif | tap | afpacket | veth | coexist
        topology: String,
        #[command(flatten)]
        prefix: PrefixArg,
        /// Stay in the foreground and tear down on SIGINT/SIGTERM.
        #[arg(long)]
        hold: bool,
    },
    /// Tear down one topology, or (without one) everything with the prefix, crash
    /// leftovers included.
    Down {
        /// memif | tap | afpacket | veth | coexist; omit for all.
        topology: Option<String>,
        #[command(flatten)]
        prefix: PrefixArg,
    },
    /// Impair the egress of a kernel-side link (k1, k2, tap, host); --clear removes it.
    Netem {
        /// k1 | k2 (veth), tap (tap), host (afpacket)
        link: String,
        #[command(flatten)]
        prefix: PrefixArg,
        /// Drop this percentage of packets, e.g. 2%.
        #[arg(long)]
        loss: Option<String>,
        /// Add this one-way delay, e.g. 10ms.
        #[arg(long)]
        delay: Option<String>,
        /// Uniform jitter around the delay, e.g. 1ms.
        #[arg(long)]
        jitter: Option<String>,
        /// Send this percentage at once, ahead of delayed ones (needs --delay).
        #[arg(long)]
        reorder: Option<String>,
        /// Send this percentage twice.
        #[arg(long)]
        duplicate: Option<String>,
        /// Flip one bit in this percentage.
        #[arg(long)]
        corrupt: Option<String>,
        /// Rate limit, e.g. 100mbit.
        #[arg(long)]
        rate: Option<String>,
        /// Seed for the user-space engine's random choices.
        #[arg(long)]
        seed: Option<u64>,
        /// Remove the impairment instead.
        #[arg(long, conflicts_with_all = ["loss", "delay", "jitter", "reorder", "duplicate", "corrupt", "rate"])]
        clear: bool,
    },
    /// Show what is up under the prefix, with impairments.
    Status {
        #[command(flatten)]
        prefix: PrefixArg,
    },
    /// Print the EAL arguments of one DPDK side, one per line:
    /// memif-server, memif-client, tap, afpacket.
    Eal {
        /// memif-server | memif-client | tap | afpacket
        side: String,
        #[command(flatten)]
        prefix: PrefixArg,
    },
    /// (internal) The user-space impairment engine daemon.
    #[command(hide = true)]
    Impaird {
        #[arg(long)]
        netns: String,
        #[arg(long)]
        spec: String,
    },
}

fn opt<T>(v: &Option<String>, f: fn(&str) -> Result<T>) -> Result<Option<T>> {
    v.as_deref().map(f).transpose()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("testbed: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Setup => {
            let st = std::process::Command::new("bash")
                .arg(testbed::SETUP_SCRIPT)
                .status()
                .map_err(|e| Error::Config(format!("running {}: {e}", testbed::SETUP_SCRIPT)))?;
            if st.success() {
                Ok(())
            } else {
                Err(Error::Config(format!(
                    "{} failed ({st})",
                    testbed::SETUP_SCRIPT
                )))
            }
        }
        Cmd::Up {
            topology,
            prefix,
            hold,
        } => {
            let kind: Kind = topology.parse()?;
            let prefix = prefix.get()?;
            let t = Topology::up(kind, &prefix)?;
            print_details(t.details());
            if hold {
                println!("holding {kind} under prefix {prefix}; SIGINT/SIGTERM tears it down");
                wait_for_signal()?;
                t.down()
            } else {
                t.detach();
                Ok(())
            }
        }
        Cmd::Down { topology, prefix } => {
            let prefix = prefix.get()?;
            match topology {
                Some(name) => {
                    let kind: Kind = name.parse()?;
                    testbed::teardown_kind(kind, &prefix)
                }
                None => {
                    let r = testbed::sweep(&prefix)?;
                    if r.is_empty() {
                        println!("nothing with prefix {prefix} to remove");
                    } else {
                        println!(
                            "removed: namespaces [{}], root links [{}], {} processes, {} dpdk files, state dir: {}",
                            r.namespaces.join(", "),
                            r.links.join(", "),
                            r.processes,
                            r.dpdk_files,
                            r.state_dir
                        );
                    }
                    Ok(())
                }
            }
        }
        Cmd::Netem {
            link,
            prefix,
            loss,
            delay,
            jitter,
            reorder,
            duplicate,
            corrupt,
            rate,
            seed,
            clear,
        } => {
            let prefix = prefix.get()?;
            testbed::require_root()?;
            if clear {
                daemon::clear_persistent(&prefix, &link)?;
                println!("{link}: impairment cleared");
                return Ok(());
            }
            let imp = Impairment {
                delay: opt(&delay, parse_duration)?.unwrap_or(Duration::ZERO),
                jitter: opt(&jitter, parse_duration)?.unwrap_or(Duration::ZERO),
                loss: opt(&loss, parse_percent)?.unwrap_or(0.0),
                reorder: opt(&reorder, parse_percent)?.unwrap_or(0.0),
                duplicate: opt(&duplicate, parse_percent)?.unwrap_or(0.0),
                corrupt: opt(&corrupt, parse_percent)?.unwrap_or(0.0),
                rate_bps: opt(&rate, parse_rate)?,
                seed,
            };
            if imp.is_empty() {
                return Err(Error::BadImpairment(
                    "nothing to apply: give --loss/--delay/--reorder/--duplicate/--corrupt/--rate, or --clear".into(),
                ));
            }
            let exe = std::env::current_exe()
                .map_err(|e| Error::Config(format!("locating the testbed binary: {e}")))?;
            let backend = daemon::set_persistent(&exe, &prefix, &link, &imp)?;
            println!("{link}: {imp} (backend {backend:?})");
            Ok(())
        }
        Cmd::Status { prefix } => status(&prefix.get()?),
        Cmd::Eal { side, prefix } => {
            let prefix = prefix.get()?;
            let (kind, pick) = match side.as_str() {
                "memif-server" => (Kind::Memif, 0),
                "memif-client" => (Kind::Memif, 1),
                "tap" => (Kind::Tap, 0),
                "afpacket" => (Kind::AfPacket, 0),
                "coexist" => (Kind::Coexist, 0),
                "coexist-wire" => (Kind::Coexist, 1),
                other => {
                    return Err(Error::Config(format!(
                    "unknown DPDK side `{other}`; valid: memif-server, memif-client, tap, afpacket, coexist, coexist-wire"
                )))
                }
            };
            let port = match (Details::of(kind, &prefix), pick) {
                (Details::Memif(m), 0) => m.server,
                (Details::Memif(m), _) => m.client,
                (Details::Tap(t), _) => t.dpdk,
                (Details::AfPacket(a), _) => a.dpdk,
                (Details::Coexist(c), 0) => c.dpdk,
                (Details::Coexist(c), _) => c.wire_dpdk,
                (Details::Veth(_), _) => unreachable!("veth has no DPDK side"),
            };
            for a in port.eal.args() {
                println!("{a}");
            }
            Ok(())
        }
        Cmd::Impaird { netns, spec } => {
            let imp: Impairment = serde_json::from_str(&spec)
                .map_err(|e| Error::BadImpairment(format!("bad --spec: {e}")))?;
            imp.validate()?;
            daemon::run_daemon(&netns, imp)
        }
    }
}

fn wait_for_signal() -> Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.thread_block()
        .map_err(|e| Error::Config(format!("blocking signals: {e}")))?;
    set.wait()
        .map_err(|e| Error::Config(format!("waiting for a signal: {e}")))?;
    Ok(())
}

fn print_details(d: &Details) {
    match d {
        Details::Memif(m) => {
            println!(
                "memif: namespace {}, socket {}",
                m.netns,
                m.socket.display()
            );
            for (role, p) in [("server", &m.server), ("client", &m.client)] {
                println!(
                    "  {role}: {}/{} mac {}  EAL: {}",
                    p.ip,
                    p.prefix_len,
                    p.mac,
                    p.eal.args().join(" ")
                );
            }
        }
        Details::Tap(t) => {
            println!(
                "tap: namespace {} (DPDK runs here and creates {})",
                t.host.netns, t.host.iface
            );
            println!(
                "  kernel host: {}/{} mac {} on {}",
                t.host.ip, t.host.prefix_len, t.host.mac, t.host.iface
            );
            println!(
                "  dpdk: {} mac {}  EAL: {}",
                t.dpdk.ip,
                t.dpdk.mac,
                t.dpdk.eal.args().join(" ")
            );
        }
        Details::AfPacket(a) => {
            println!(
                "afpacket: DPDK in {} on {}; kernel host in {}",
                a.dpdk.netns, a.dut_iface, a.host.netns
            );
            println!(
                "  kernel host: {}/{} mac {} on {}",
                a.host.ip, a.host.prefix_len, a.host.mac, a.host.iface
            );
            println!(
                "  dpdk: {} mac {}  EAL: {}",
                a.dpdk.ip,
                a.dpdk.mac,
                a.dpdk.eal.args().join(" ")
            );
        }
        Details::Coexist(c) => {
            println!("coexist (MTU {}):", c.wire.mtu);
            println!(
                "  {}: {}/{} mac {} on {} (kernel client)",
                c.wire.netns, c.wire.ip, c.wire.prefix_len, c.wire.mac, c.wire.iface
            );
            println!(
                "  {}: luna client {} on {} (DPDK af_packet, same MAC)  EAL: {}",
                c.wire_dpdk.netns,
                c.wire_dpdk.ip,
                c.wire.iface,
                c.wire_dpdk.eal.args().join(" ")
            );
            println!(
                "  {}: luna {} mac {} on {} (DPDK af_packet), exception tap {} ({})  EAL: {}",
                c.dpdk.netns,
                c.dpdk.ip,
                c.dpdk.mac,
                c.nic_iface,
                c.exception.iface,
                c.exception_port,
                c.dpdk.eal.args().join(" ")
            );
        }
        Details::Veth(v) => {
            println!("veth (MTU {}):", v.k1.mtu);
            for h in [&v.k1, &v.k2] {
                println!(
                    "  {}: {}/{} mac {} on {}",
                    h.netns, h.ip, h.prefix_len, h.mac, h.iface
                );
            }
        }
    }
}

fn status(prefix: &Prefix) -> Result<()> {
    testbed::require_root()?;
    println!(
        "prefix {prefix}, state dir {}",
        prefix.state_dir().display()
    );
    let mut any = false;
    for kind in Kind::ALL {
        if Topology::is_up(kind, prefix) {
            any = true;
            print_details(&Details::of(kind, prefix));
        }
    }
    if !any {
        println!("no topology is up");
    }
    for r in daemon::persistent_impairments(prefix) {
        let alive = r
            .pid
            .map(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        println!(
            "impairment on {}: {} (backend {:?}{})",
            r.link,
            r.impairment,
            r.backend,
            match (r.pid, alive) {
                (Some(p), Some(true)) => format!(", engine pid {p}"),
                (Some(p), _) => format!(", engine pid {p} NOT RUNNING"),
                _ => String::new(),
            }
        );
        if let Some(kind) = Kind::of_link(&r.link) {
            if let Ok((ns, iface)) = Details::of(kind, prefix).link_target(&r.link) {
                if let Ok(q) = impair::qdisc_show(&ns, &iface) {
                    print!("  {q}");
                }
                if let Ok(rules) = impair::nfqueue_rules(&ns) {
                    if !rules.is_empty() {
                        println!("  {rules}");
                    }
                }
            }
        }
    }
    let left = testbed::leftovers(prefix)?;
    let known: Vec<String> = Kind::ALL
        .iter()
        .flat_map(|k| Details::of(*k, prefix).namespaces())
        .collect();
    let strays: Vec<&String> = left
        .iter()
        .filter(|l| l.starts_with("namespace ") && !known.iter().any(|k| l.ends_with(k.as_str())))
        .collect();
    if !strays.is_empty() {
        println!("unexpected leftovers (remove with `testbed down --prefix {prefix}`): {strays:?}");
    }
    Ok(())
}
