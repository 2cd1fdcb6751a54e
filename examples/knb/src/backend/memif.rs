//! What the two memif backends (smoltcp and luna) share: where each side runs and with
//! which EAL arguments, reading those arguments back, putting extra lane threads on
//! their CPUs and into the EAL, and (smoltcp, which drives dpdk-sys queues itself)
//! opening the port. luna opens the same port through r2c's `DpdkDevice` instead.

use std::time::Duration;

use dpdk_sys::{Eal, Mempool, PoolConfig, Port, PortConf, RxQueue, TxQueue};
use testbed::Topology;

use super::{pin, Endpoints, Place};

/// Where the server and client of a memif run go: the testbed's memif ports, with the
/// EAL's main lcore on each side's first CPU, no telemetry socket and no shared runtime
/// files (runs leave nothing behind). `who` names the backend in the error.
pub fn endpoints(
    topo: &Topology,
    server_cpus: &[usize],
    client_cpus: &[usize],
    who: &str,
) -> Result<Endpoints, String> {
    let m = topo
        .memif()
        .ok_or_else(|| format!("the {who} backend needs the memif topology"))?;
    let first = |cpus: &[usize]| cpus.first().copied().ok_or("no CPU given");
    Ok(Endpoints {
        server: place(&m.server, first(server_cpus)?),
        client: place(&m.client, first(client_cpus)?),
    })
}

fn place(p: &testbed::DpdkPort, cpu: usize) -> Place {
    let mut eal = p.eal.clone();
    eal.lcores = cpu.to_string();
    eal.extra = vec!["--no-telemetry".into(), "--in-memory".into()];
    Place {
        netns: p.netns.clone(),
        ip: p.ip,
        prefix_len: p.prefix_len,
        eal: eal.args(),
    }
}

/// memif zero-copy mode on a client's EAL arguments: `zero-copy=yes` on its memif vdev
/// and `--single-file-segments` (DPDK's zero-copy client shares each of EAL's memory
/// segment lists with the server as one file; DPDK accepts it next to the testbed's
/// `--huge-unlink` only with `--in-memory`, which [`endpoints`] always gives). The server
/// side needs nothing: it always copies, now straight into and out of the client's
/// buffers.
pub fn zero_copy_client(eal: &mut Vec<String>) {
    let mut changed = false;
    for a in eal.iter_mut().filter(|a| a.starts_with("net_memif")) {
        if !a.contains("zero-copy=") {
            a.push_str(",zero-copy=yes");
        }
        changed = true;
    }
    if changed && !eal.iter().any(|a| a == "--single-file-segments") {
        eal.push("--single-file-segments".into());
    }
}

/// Whether `eal` puts its memif vdev in zero-copy mode.
pub fn is_zero_copy(eal: &[String]) -> bool {
    vdev_of(eal).is_some_and(|v| v.starts_with("net_memif") && v.contains("zero-copy=yes"))
}

/// Pins the calling lane thread to `cpu` and makes sure it has an lcore id (per-lcore
/// mempool caches for every mbuf it allocates and frees). A luna lane has one already:
/// r2c registers its core thread when the core starts (before this pin, so DPDK's record
/// of the lcore's CPU set is the unpinned one: only its NUMA socket id reads it). A
/// smoltcp lane registers here.
pub fn register_lane(eal: &Eal, cpu: usize) -> Result<(), String> {
    pin(cpu)?;
    eal.register_thread()
        .map_err(|e| format!("register the lane thread on CPU {cpu} with the EAL: {e}"))?;
    Ok(())
}

/// The `--vdev` value in `eal` args.
pub fn vdev_of(eal: &[String]) -> Option<&str> {
    let mut it = eal.iter();
    while let Some(a) = it.next() {
        if a == "--vdev" {
            return it.next().map(String::as_str);
        }
        if let Some(v) = a.strip_prefix("--vdev=") {
            return Some(v);
        }
    }
    None
}

/// An opened memif port with one queue pair per lane.
pub struct MemifDev {
    /// The EAL (kept alive while the port is used).
    pub eal: Eal,
    /// The port.
    pub port: Port,
    /// Packet buffers for all lanes.
    pub pool: Mempool,
    /// (rx, tx) queue of each lane.
    pub queues: Vec<(RxQueue, TxQueue)>,
    /// The port's MAC.
    pub mac: [u8; 6],
    /// IP MTU the buffers are sized for.
    pub mtu: u16,
    /// The `--vdev` value the port was opened with (for the quiescence rendezvous).
    pub vdev: String,
}

fn err(step: &str) -> impl Fn(dpdk_sys::Error) -> String + '_ {
    move |e| format!("{step}: {e}")
}

/// The `socket=` path of the memif vdev in `eal` args.
pub fn socket_of(eal: &[String]) -> Option<String> {
    vdev_of(eal)
        .filter(|v| v.starts_with("net_memif"))?
        .split(',')
        .find_map(|kv| kv.strip_prefix("socket="))
        .map(str::to_owned)
}

/// Initialises the EAL with `eal`, configures net_memif0 with `lanes` queue pairs (mbufs
/// that hold a whole frame of IP MTU `mtu`) and starts it. The server calls `ready` once its socket listens; the client waits for the
/// server's socket and restarts its port until the link is up (memif clients connect
/// only at start; a zero-copy client starts once, see `Port::start_once_until_link_up`).
/// Returns after link up.
pub fn open(
    eal_args: &[String],
    server: bool,
    lanes: u16,
    mtu: u16,
    link_timeout: Duration,
    ready: &mut dyn FnMut(),
) -> Result<MemifDev, String> {
    let eal = Eal::builder()
        .args(eal_args.iter().cloned())
        .log_to_stderr(true)
        .init()
        .map_err(err("EAL init"))?;
    let mut port = Port::by_name(&eal, "net_memif0").map_err(err("memif port"))?;
    // Rings of 1024 per queue on each side plus what the stacks hold in flight; jumbo
    // frames get one mbuf each (fewer of them: EAL memory is 256 MB).
    let mut pc = PoolConfig::new("lkb_pool", 16383 * lanes as u32);
    if mtu > 1500 {
        pc = PoolConfig::new("lkb_pool", 4095 * lanes as u32);
        pc.data_room = (crate::workload::memif_bsize(mtu) + 128) as u16;
    }
    let pool = Mempool::create(&eal, &pc).map_err(err("mempool"))?;
    let conf = PortConf {
        rx_queues: lanes,
        tx_queues: lanes,
        rx_desc: 1024,
        tx_desc: 1024,
        ..Default::default()
    };
    port.configure(&conf, &pool)
        .map_err(err("configure memif"))?;
    if server {
        port.start().map_err(err("start memif"))?;
        ready();
        port.wait_link_up(link_timeout)
            .map_err(err("wait for the client"))?;
    } else {
        let sock = socket_of(eal_args).ok_or("no net_memif socket= in the EAL arguments")?;
        dpdk_sys::ethdev::wait_memif_listener(&sock, link_timeout)
            .map_err(err("wait for the server"))?;
        let zero_copy = vdev_of(eal_args).is_some_and(|v| v.contains("zero-copy=yes"));
        if zero_copy {
            // The server is started (it said so before we were spawned), and a
            // zero-copy client must not restart (`Port::start_once_until_link_up`).
            port.start_once_until_link_up(link_timeout)
                .map_err(err("memif link"))?;
        } else {
            port.start_until_link_up(link_timeout, Duration::from_millis(500))
                .map_err(err("memif link"))?;
        }
    }
    let mac = port.mac().map_err(err("memif MAC"))?;
    let mut queues = Vec::new();
    for q in 0..lanes {
        queues.push((
            port.rx_queue(q).map_err(err("rx queue"))?,
            port.tx_queue(q).map_err(err("tx queue"))?,
        ));
    }
    Ok(MemifDev {
        eal,
        port,
        pool,
        queues,
        mac,
        mtu,
        vdev: vdev_of(eal_args).unwrap_or_default().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_memif_socket() {
        let a = vec![
            "--no-pci".to_string(),
            "--vdev".into(),
            "net_memif0,role=client,id=0,socket=/run/x/memif.sock,socket-abstract=no".into(),
        ];
        assert_eq!(socket_of(&a).as_deref(), Some("/run/x/memif.sock"));
        assert_eq!(socket_of(&a[..1]), None);
        let tap = vec!["--vdev=net_tap0,iface=x".to_string()];
        assert_eq!(socket_of(&tap), None);
    }

    #[test]
    fn zero_copy_edits_only_the_memif_vdev_once() {
        let mut a: Vec<String> = ["--no-pci", "--vdev", "net_memif0,role=client,socket=/x"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert!(!is_zero_copy(&a));
        zero_copy_client(&mut a);
        zero_copy_client(&mut a);
        assert_eq!(a[2], "net_memif0,role=client,socket=/x,zero-copy=yes");
        assert_eq!(
            a.iter().filter(|x| *x == "--single-file-segments").count(),
            1
        );
        assert!(is_zero_copy(&a));
        let mut tap = vec!["--vdev".to_string(), "net_tap0,iface=x".into()];
        zero_copy_client(&mut tap);
        assert_eq!(tap, ["--vdev", "net_tap0,iface=x"]);
    }

    #[test]
    fn finds_the_vdev() {
        let a: Vec<String> = ["--no-pci", "--vdev", "net_memif0,role=server,socket=/x"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(vdev_of(&a), Some("net_memif0,role=server,socket=/x"));
        assert_eq!(vdev_of(&["--vdev=net_tap0".to_string()]), Some("net_tap0"));
        assert_eq!(vdev_of(&a[..2]), None);
        assert_eq!(vdev_of(&[]), None);
    }
}
