//! Opening the memif port of a DPDK side (shared by the smoltcp and, later, luna backends).

use std::time::Duration;

use dpdk_sys::{Eal, Mempool, PoolConfig, Port, PortConf, RxQueue, TxQueue};

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
}

fn err(step: &str) -> impl Fn(dpdk_sys::Error) -> String + '_ {
    move |e| format!("{step}: {e}")
}

/// The `socket=` path of the memif vdev in `eal` args.
pub fn socket_of(eal: &[String]) -> Option<String> {
    eal.iter()
        .find(|a| a.contains("net_memif"))?
        .split(',')
        .find_map(|kv| kv.strip_prefix("socket="))
        .map(str::to_owned)
}

/// Initialises the EAL with `eal`, configures net_memif0 with `lanes` queue pairs (mbufs
/// that hold a whole frame of IP MTU `mtu`) and starts it. The server calls `ready` once its socket listens; the client waits for the
/// server's socket and restarts its port until the link is up (memif clients connect
/// only at start). Returns after link up.
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
        port.start_until_link_up(link_timeout, Duration::from_millis(500))
            .map_err(err("memif link"))?;
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
    }
}
