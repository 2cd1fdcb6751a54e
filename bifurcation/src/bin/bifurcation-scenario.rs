//! Test helper (one EAL per process): `tap-classify` brings up `net_tap0`, tries to
//! install the rules (this kernel lacks tc flower, so it falls back to software), gives
//! the tap's kernel side an address, makes the kernel send TCP SYNs to luna's client and
//! listening ports and to ssh, and UDP to a client port, and runs every frame the DPDK
//! side receives through the classifier. Prints `OK <counters>` or `ERROR <why>`.
//!
//! ```text
//! bifurcation-scenario tap-classify --iface biftap0 --kernel-addr 198.18.0.1/24 \
//!     --luna-ip 198.18.0.2 --ms 3000 -- <EAL args with --vdev=net_tap0,iface=biftap0>
//! ```

use bifurcation::classify::Classifier;
use bifurcation::install::{install, isolate, Installed};
use bifurcation::model::{KernelPorts, TrafficConfig};
use bifurcation::rules::compile;
use dpdk_sys::{Eal, Mempool, PoolConfig, Port, PortConf};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

fn arg(args: &[String], key: &str) -> Result<String, String> {
    args.iter()
        .position(|a| a == key)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .ok_or_else(|| format!("missing {key}"))
}

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

fn tap_classify(args: &[String], eal: Vec<String>) -> Result<String, String> {
    let iface = arg(args, "--iface")?;
    let kaddr = arg(args, "--kernel-addr")?;
    let luna: Ipv4Addr = arg(args, "--luna-ip")?
        .parse()
        .map_err(|e| format!("--luna-ip: {e}"))?;
    let ms: u64 = arg(args, "--ms")?
        .parse()
        .map_err(|e| format!("--ms: {e}"))?;
    let model = TrafficConfig::from_toml(&format!(
        "ip = \"{luna}\"\nlisten_tcp = [7000]\napps = [{{ name = \"luna\", threads = 2 }}]"
    ))
    .and_then(|c| c.validate(&KernelPorts::from_proc()?))
    .map_err(|e| e.to_string())?;
    let rules = compile(&model);

    let eal = Eal::init(eal).map_err(|e| e.to_string())?;
    let mut port = Port::by_name(&eal, "net_tap0").map_err(|e| e.to_string())?;
    let iso = isolate(&port);
    let pool =
        Mempool::create(&eal, &PoolConfig::new("bif_scn", 2047)).map_err(|e| e.to_string())?;
    port.configure(
        &PortConf {
            rx_queues: 2,
            tx_queues: 2,
            rx_desc: 256,
            tx_desc: 256,
            ..Default::default()
        },
        &pool,
    )
    .map_err(|e| e.to_string())?;
    port.start().map_err(|e| e.to_string())?;
    let steering = install(&mut port, &iso, &rules);
    let mode = match &steering {
        Installed::Hardware { flows } => format!("hardware ({} rules)", flows.len()),
        Installed::Software { .. } => "software".to_string(),
    };

    sh(&["ip", "addr", "add", &kaddr, "dev", &iface])?;
    sh(&["ip", "link", "set", &iface, "up"])?;
    let mac = port.mac().map_err(|e| e.to_string())?;
    let mac_s = bifurcation::sriov::mac_string(mac);
    sh(&[
        "ip",
        "neigh",
        "replace",
        &luna.to_string(),
        "lladdr",
        &mac_s,
        "dev",
        &iface,
    ])?;

    // The kernel's traffic towards "luna": SYNs to a client port, a listening port and
    // ssh; a UDP datagram to a client port. Nobody answers; the SYNs are retransmitted.
    let sender = std::thread::spawn(move || {
        for p in [61440u16, 7000, 22] {
            let a = SocketAddr::from((luna, p));
            let _ = TcpStream::connect_timeout(&a, Duration::from_millis(200));
        }
        if let Ok(u) = UdpSocket::bind("0.0.0.0:0") {
            let _ = u.send_to(b"x", (luna, 61441));
        }
    });

    let mut c = Classifier::new(model);
    let mut q0 = port.rx_queue(0).map_err(|e| e.to_string())?;
    let mut q1 = port.rx_queue(1).map_err(|e| e.to_string())?;
    let mut rx = Vec::new();
    let end = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < end {
        rx.clear();
        q0.rx_burst(&mut rx, 32);
        q1.rx_burst(&mut rx, 32);
        for m in rx.drain(..) {
            // Single-segment frames here; a chained frame is classified by its first
            // segment, which holds every header the classifier reads.
            c.classify(m.data());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = sender.join();
    drop((q0, q1));
    drop(steering);
    let _ = port.stop();
    let counts: Vec<String> = c
        .counters()
        .iter()
        .filter(|(_, v)| *v > 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    Ok(format!("steering {mode}; {}", counts.join(" ")))
}

fn main() -> ExitCode {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let (args, eal) = match all.iter().position(|a| a == "--") {
        Some(i) => (all[..i].to_vec(), all[i + 1..].to_vec()),
        None => (all.clone(), Vec::new()),
    };
    let res = match args.first().map(String::as_str) {
        Some("tap-classify") => tap_classify(&args, eal),
        _ => Err("usage: bifurcation-scenario tap-classify --iface I --kernel-addr CIDR --luna-ip IP --ms N -- EAL...".into()),
    };
    match res {
        Ok(m) => {
            println!("OK {m}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("ERROR {e}");
            ExitCode::FAILURE
        }
    }
}
