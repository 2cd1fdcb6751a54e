//! `bifurcation`: rule counts, config checks, SR-IOV commands and a trial rte_flow install.
//!
//! ```text
//! bifurcation rules --threads 12,6 [--balance 0.0625] [--list]   rule counts (and rules)
//! bifurcation rules --table                                     the docs/bifurcation.md table
//! bifurcation check CONFIG.toml                                 validate [traffic] against /proc
//! bifurcation sriov --pf ens1f0 --vfs 4 [...]                   print the SR-IOV commands
//! bifurcation install --port net_memif0 [--threads 1 | --config F [--app A]] -- EAL...
//!                                                               isolate + install, or fall back
//! ```

use bifurcation::model::{KernelPorts, TrafficConfig, TrafficModel};
use bifurcation::ports::{AppSpec, PartitionPlan, PortRange, Share};
use bifurcation::rules::{compile, counts, Origin, Target};
use bifurcation::sriov::{parse_mac, SriovPlan};
use clap::{Parser, Subcommand};
use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

/// Appends a line to the output buffer (printed once at the end, so a closed pipe
/// is an ignored write error, not a panic).
macro_rules! outln {
    ($o:expr, $($a:tt)*) => {{
        let _ = writeln!($o, $($a)*);
    }};
}

#[derive(Parser)]
#[command(name = "bifurcation", about = "luna's traffic model tools")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Rule counts for applications sharing 61440-65535 (one per --threads entry).
    Rules {
        /// Threads per application, comma separated (12,6 is the paper's case).
        #[arg(long, value_delimiter = ',', default_value = "12,6")]
        threads: Vec<u16>,
        /// Allowed deviation of a thread's share from even, to align boundaries.
        #[arg(long, default_value_t = 0.0625)]
        balance: f64,
        /// Print every rule.
        #[arg(long)]
        list: bool,
        /// Print the comparison table of docs/bifurcation.md instead.
        #[arg(long)]
        table: bool,
    },
    /// Validate a config file's [traffic] section against this host's kernel settings.
    Check {
        /// TOML file (r2c's config).
        file: String,
    },
    /// Print the commands that set up SR-IOV on a ConnectX-4 Lx / mlx5 PF.
    Sriov {
        /// PF netdev.
        #[arg(long)]
        pf: String,
        /// Number of VFs.
        #[arg(long)]
        vfs: u16,
        /// PF PCI address (for devlink).
        #[arg(long)]
        pci: Option<String>,
        /// MAC of VF 0 (VF i gets base + i).
        #[arg(long, default_value = "02:00:00:00:10:00")]
        mac_base: String,
        /// VF trust on.
        #[arg(long)]
        trust: bool,
        /// Turn spoof checking off (on by default).
        #[arg(long)]
        no_spoofchk: bool,
        /// VLAN for every VF.
        #[arg(long)]
        vlan: Option<u16>,
        /// MTU for the PF.
        #[arg(long)]
        mtu: Option<u16>,
        /// 2 MiB hugepages to reserve.
        #[arg(long, default_value_t = 1024)]
        hugepages: u32,
        /// NUMA node of the PF (read from sysfs when omitted).
        #[arg(long)]
        numa_node: Option<u32>,
    },
    /// Bring up a DPDK port, isolate it, install the rules (or fall back to software).
    #[cfg(feature = "dpdk")]
    Install {
        /// DPDK port name.
        #[arg(long)]
        port: String,
        /// Config file with a [traffic] section (default: one app with --threads threads).
        #[arg(long)]
        config: Option<String>,
        /// Threads of the default single application.
        #[arg(long, default_value_t = 1)]
        threads: u16,
        /// Install only this application's rules (its own port or VF).
        #[arg(long)]
        app: Option<String>,
        /// EAL arguments.
        #[arg(last = true)]
        eal: Vec<String>,
    },
}

fn plan(threads: &[u16], balance: f64) -> Result<PartitionPlan, String> {
    let apps: Vec<AppSpec> = threads
        .iter()
        .enumerate()
        .map(|(i, &t)| AppSpec::new(format!("app{i}"), Share::Rest, t))
        .collect();
    PartitionPlan::build_aligned(PortRange::RESERVED, &apps, balance).map_err(|e| e.to_string())
}

/// Largest relative deviation of a thread's share from its app's even share.
fn max_skew(p: &PartitionPlan) -> f64 {
    let mut worst: f64 = 0.0;
    for (i, a) in p.apps().iter().enumerate() {
        let total: u32 = p
            .assignments()
            .iter()
            .filter(|b| b.app == i)
            .map(|b| b.ports.len())
            .sum();
        let share = f64::from(total) / a.threads.len() as f64;
        for t in &a.threads {
            let n: u32 = p
                .assignments()
                .iter()
                .filter(|b| b.app == i && b.slot.thread == t.thread)
                .map(|b| b.ports.len())
                .sum();
            worst = worst.max((f64::from(n) - share).abs() / share);
        }
    }
    worst
}

fn table(o: &mut String) -> Result<(), String> {
    outln!(o, "| threads per app | per port | per range | masked, even split (naive) | masked, ±6.25% | masked, ±12.5% | masked, ±25% |");
    outln!(o, "|---|---:|---:|---:|---:|---:|---:|");
    let cases: [&[u16]; 9] = [
        &[12, 6],
        &[12],
        &[6],
        &[8],
        &[16],
        &[18],
        &[24],
        &[4, 4, 4],
        &[12, 6, 2],
    ];
    for t in cases {
        let even = counts(&plan(t, 0.0)?);
        let cell = |b: f64| -> Result<String, String> {
            let p = plan(t, b)?;
            Ok(format!(
                "{} (max skew {:.1}%)",
                counts(&p).masked,
                max_skew(&p) * 100.0
            ))
        };
        let names: Vec<String> = t.iter().map(|x| x.to_string()).collect();
        outln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} |",
            names.join(" + "),
            even.per_port,
            even.per_range,
            even.masked,
            cell(0.0625)?,
            cell(0.125)?,
            cell(0.25)?
        );
    }
    Ok(())
}

fn rules(o: &mut String, threads: &[u16], balance: f64, list: bool) -> Result<(), String> {
    let p = plan(threads, balance)?;
    let c = counts(&p);
    let naive = counts(&plan(threads, 0.0)?);
    outln!(
        o,
        "threads {threads:?} over {}: {} rules with masks (balance ±{:.2}%, max skew {:.2}%); naive: {} masked rules on the even split, {} range rules, {} exact-port rules",
        PortRange::RESERVED,
        c.masked,
        balance * 100.0,
        max_skew(&p) * 100.0,
        naive.masked,
        naive.per_range,
        naive.per_port
    );
    if list {
        for r in bifurcation::rules::compile_plan(&p, None).rules {
            let (Origin::Client { app, thread }, Target::Queue(q)) = (r.origin, &r.target) else {
                continue;
            };
            outln!(
                o,
                "app{app} thread {thread}: tcp dst {} ({}) -> queue {q}",
                r.port,
                r.port.range()
            );
        }
    }
    Ok(())
}

fn check(file: &str) -> Result<TrafficModel, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read {file}: {e}"))?;
    let cfg = TrafficConfig::from_config_file_text(&text).map_err(|e| e.to_string())?;
    let k = KernelPorts::from_proc().map_err(|e| e.to_string())?;
    cfg.validate(&k).map_err(|e| e.to_string())
}

#[cfg(feature = "dpdk")]
fn install(
    o: &mut String,
    port: &str,
    config: Option<&str>,
    threads: u16,
    app: Option<&str>,
    eal: Vec<String>,
) -> Result<(), String> {
    use bifurcation::install::{install, isolate};
    use dpdk_sys::{Eal, Mempool, PoolConfig, Port, PortConf};
    let model = match config {
        Some(f) => check(f)?,
        None => TrafficConfig {
            apps: vec![bifurcation::model::AppConfig {
                name: "luna".into(),
                ports: Default::default(),
                threads: Some(threads),
                queues: None,
            }],
            ..Default::default()
        }
        .validate(&KernelPorts::from_proc().map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?,
    };
    let rules = bifurcation::rules::compile_for(&model, app);
    if rules.is_empty() {
        return Err(format!(
            "no rules for application {app:?}: is it in [traffic].apps?"
        ));
    }
    let queues = model
        .plan()
        .apps()
        .iter()
        .flat_map(|a| a.threads.iter().map(|t| t.queue + 1))
        .max()
        .unwrap_or(1);
    let eal = Eal::init(eal).map_err(|e| e.to_string())?;
    let mut p = Port::by_name(&eal, port).map_err(|e| e.to_string())?;
    let iso = isolate(&p);
    let pool =
        Mempool::create(&eal, &PoolConfig::new("bif_install", 1023)).map_err(|e| e.to_string())?;
    p.configure(
        &PortConf {
            rx_queues: queues,
            tx_queues: queues,
            rx_desc: 128,
            tx_desc: 128,
            ..Default::default()
        },
        &pool,
    )
    .map_err(|e| e.to_string())?;
    p.start().map_err(|e| e.to_string())?;
    let s = install(&mut p, &iso, &rules);
    match &s {
        bifurcation::install::Installed::Hardware { flows } => {
            outln!(o, "steering: hardware, {} rules on {port}", flows.len())
        }
        bifurcation::install::Installed::Software { .. } => outln!(
            o,
            "steering: software on {port} ({} rules compiled, none installed)",
            rules.len()
        ),
    }
    drop(s);
    p.stop().map_err(|e| e.to_string())?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut o = String::new();
    let res = match cli.cmd {
        Cmd::Rules {
            threads,
            balance,
            list,
            table: t,
        } => {
            if t {
                table(&mut o)
            } else {
                rules(&mut o, &threads, balance, list)
            }
        }
        Cmd::Check { file } => check(&file).map(|m| {
            outln!(
                o,
                "ok: {} applications, {} threads, {} listening ports, {} rules",
                m.plan().apps().len(),
                m.plan()
                    .apps()
                    .iter()
                    .map(|a| a.threads.len())
                    .sum::<usize>(),
                m.listen_tcp().len() + m.listen_udp().len(),
                compile(&m).len()
            )
        }),
        Cmd::Sriov {
            pf,
            vfs,
            pci,
            mac_base,
            trust,
            no_spoofchk,
            vlan,
            mtu,
            hugepages,
            numa_node,
        } => (|| {
            let mut p = SriovPlan::new(pf, vfs);
            p.pci = pci;
            p.mac_base = parse_mac(&mac_base).ok_or_else(|| {
                format!("--mac-base {mac_base:?} is not a MAC (02:00:00:00:10:00)")
            })?;
            p.trust = trust;
            p.spoofchk = !no_spoofchk;
            p.vlan = vlan;
            p.mtu = mtu;
            p.hugepages_2m = hugepages;
            p.numa_node = numa_node;
            for l in p.commands().map_err(|e| e.to_string())? {
                outln!(&mut o, "{l}");
            }
            Ok(())
        })(),
        #[cfg(feature = "dpdk")]
        Cmd::Install {
            port,
            config,
            threads,
            app,
            eal,
        } => install(
            &mut o,
            &port,
            config.as_deref(),
            threads,
            app.as_deref(),
            eal,
        ),
    };
    let _ = std::io::stdout().lock().write_all(o.as_bytes());
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bifurcation: {e}");
            ExitCode::FAILURE
        }
    }
}
