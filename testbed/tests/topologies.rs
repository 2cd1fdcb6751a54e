//! Topology life cycle against the real kernel (run as root): up, reachability, idempotent
//! up, teardown on drop, CLI errors, and sweep after a kill -9.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{assert_nothing_left, cli, cli_run, prefix};
use testbed::{netns_exists, Details, Error, Kind, Topology};

fn sysctl(ns: &str, key: &str) -> String {
    let out = testbed::netns_command(ns, "sysctl")
        .args(["-n", key])
        .output()
        .expect("sysctl");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn ip_in(ns: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("ip")
        .args(["-n", ns])
        .args(args)
        .output()
        .expect("ip");
    assert!(
        out.status.success(),
        "ip -n {ns} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const PING_WAIT: Duration = Duration::from_secs(1);
const PING_GAP: Duration = Duration::from_millis(200);

#[test]
fn veth_hosts_reach_each_other_and_drop_removes_everything() {
    let p = prefix("v1");
    {
        let t = Topology::up(Kind::Veth, &p).unwrap();
        let v = t.veth().unwrap();
        for h in [&v.k1, &v.k2] {
            assert!(netns_exists(&h.netns));
            let link = ip_in(&h.netns, &["link", "show", "dev", &h.iface]);
            assert!(
                link.contains("mtu 1500") && link.contains(&h.mac.to_string()),
                "{link}"
            );
            let addr = ip_in(&h.netns, &["-4", "addr", "show", "dev", &h.iface]);
            assert!(addr.contains(&format!("{}/24", h.ip)), "{addr}");
            // No IPv6 autoconf noise in captures.
            assert_eq!(sysctl(&h.netns, "net.ipv6.conf.default.disable_ipv6"), "1");
            // Load generators reuse TIME-WAIT ports (5,000 connections a run).
            assert_eq!(sysctl(&h.netns, "net.ipv4.tcp_tw_reuse"), "1");
            assert!(ip_in(&h.netns, &["-6", "addr", "show", "dev", &h.iface])
                .trim()
                .is_empty());
        }
        let s = v.k1.ping(v.k2.ip, 3, PING_GAP, PING_WAIT).unwrap();
        assert_eq!(s.received, 3, "{s:?}");
        let s = v.k2.ping(v.k1.ip, 2, PING_GAP, PING_WAIT).unwrap();
        assert_eq!(s.received, 2, "{s:?}");
        // The pinned-command helper really pins.
        let out =
            v.k1.pinned_command(0, "sh")
                .args(["-c", "taskset -p $$"])
                .output()
                .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.trim().ends_with(": 1"),
            "affinity mask should be core 0 only: {text}"
        );
        // Nothing was put in the root namespace.
        let root = testbed::sys::link_names(None).unwrap();
        assert!(
            !root.iter().any(|l| l.starts_with(&format!("{p}-"))),
            "{root:?}"
        );
        assert!(t.state_dir().join("veth.json").exists());
    }
    assert_nothing_left(&p);
}

#[test]
fn up_is_idempotent_and_heals_a_missing_piece() {
    let p = prefix("v2");
    let first = Topology::up(Kind::Veth, &p).unwrap();
    let v = first.veth().unwrap().clone();
    // Someone deleted an address behind our back: up again restores it.
    ip_in(&v.k2.netns, &["addr", "flush", "dev", &v.k2.iface]);
    let second = Topology::up(Kind::Veth, &p).unwrap();
    assert_eq!(second.details(), first.details());
    assert_eq!(
        v.k1.ping(v.k2.ip, 2, PING_GAP, PING_WAIT).unwrap().received,
        2
    );
    // The CLI's up is idempotent too.
    for _ in 0..2 {
        let out = cli_run(&["up", "veth", "--prefix", p.as_str()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    second.detach();
    drop(first);
    assert_nothing_left(&p);
}

#[test]
fn memif_provides_namespace_state_dir_and_paired_eal_args() {
    let p = prefix("m1");
    {
        let t = Topology::up(Kind::Memif, &p).unwrap();
        let m = t.memif().unwrap();
        assert!(netns_exists(&m.netns));
        assert!(t.state_dir().is_dir());
        assert!(m.socket.starts_with(t.state_dir()));
        let s = m.server.eal.args();
        assert!(
            s.windows(2)
                .any(|w| w == ["--file-prefix".to_string(), p.name("memif-server")]),
            "{s:?}"
        );
        assert!(s.contains(&"--no-pci".to_string()));
        let vdev = &m.server.eal.vdev;
        assert!(vdev.contains("role=server") && vdev.contains(&m.socket.display().to_string()));
        assert!(m.client.eal.vdev.contains("role=client"));
        assert_eq!(
            (m.server.peer_ip, m.client.peer_ip),
            (m.client.ip, m.server.ip)
        );
        // The state file carries the same details for other processes (knb, scripts).
        assert_eq!(
            testbed::read_state(Kind::Memif, &p).as_ref(),
            Some(t.details())
        );
        // memif has no kernel side to impair.
        let mut t = t;
        let e = t.set_impairment(
            "k1",
            &testbed::Impairment {
                loss: 1.0,
                ..Default::default()
            },
        );
        assert!(matches!(e, Err(Error::UnknownLink { .. })), "{e:?}");
    }
    assert_nothing_left(&p);
}

#[test]
fn tap_host_is_configured_once_the_interface_appears() {
    let p = prefix("t1");
    {
        let t = Topology::up(Kind::Tap, &p).unwrap();
        let tap = t.tap().unwrap().clone();
        assert!(netns_exists(&tap.host.netns));
        assert_eq!(tap.dpdk.netns, tap.host.netns);
        assert!(tap
            .dpdk
            .eal
            .vdev
            .contains(&format!("iface={}", tap.host.iface)));
        // Nothing creates the tap: a clear timeout naming the interface.
        let e = tap
            .configure_host(Duration::from_millis(300))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("timed out") && e.contains(&tap.host.iface),
            "{e}"
        );
        // Stand in for DPDK as net_tap behaves: create the tap a little later, give it the
        // port's MAC, and when the port starts bring it up and give it the port's MAC
        // again (ethdev replays the MAC on start, a moment after the link goes up). A host
        // configured before either lost its MAC to the port's: both ends on one MAC, and
        // the DPDK side dropped the kernel's frames (ARP) as its own.
        let (ns, ifname) = (tap.host.netns.clone(), tap.host.iface.clone());
        let port_mac = tap.dpdk.mac.to_string();
        let creator = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            ip_in(&ns, &["tuntap", "add", "dev", &ifname, "mode", "tap"]);
            ip_in(&ns, &["link", "set", "dev", &ifname, "address", &port_mac]);
            std::thread::sleep(Duration::from_millis(300));
            ip_in(&ns, &["link", "set", "dev", &ifname, "up"]);
            std::thread::sleep(Duration::from_millis(50));
            ip_in(&ns, &["link", "set", "dev", &ifname, "address", &port_mac]);
        });
        tap.configure_host(Duration::from_secs(5)).unwrap();
        creator.join().unwrap();
        let link = ip_in(&tap.host.netns, &["link", "show", "dev", &tap.host.iface]);
        assert!(
            link.contains("mtu 1500") && link.contains(&tap.host.mac.to_string()),
            "{link}"
        );
        let addr = ip_in(
            &tap.host.netns,
            &["-4", "addr", "show", "dev", &tap.host.iface],
        );
        assert!(addr.contains("198.18.0.1/24"), "{addr}");
        // Configuring again is harmless.
        tap.configure_host(Duration::from_secs(1)).unwrap();
    }
    assert_nothing_left(&p);
}

#[test]
fn afpacket_builds_a_silent_dut_end_and_a_kernel_host() {
    let p = prefix("a1");
    {
        let t = Topology::up(Kind::AfPacket, &p).unwrap();
        let a = t.afpacket().unwrap();
        let dut = ip_in(&a.dpdk.netns, &["link", "show", "dev", &a.dut_iface]);
        assert!(
            dut.contains(&a.dpdk.mac.to_string()) && dut.contains("UP"),
            "{dut}"
        );
        // The DUT kernel holds no address: DPDK alone owns 198.18.1.2.
        let addrs = ip_in(&a.dpdk.netns, &["addr", "show", "dev", &a.dut_iface]);
        assert!(!addrs.contains("inet"), "{addrs}");
        let host = ip_in(&a.host.netns, &["-4", "addr", "show", "dev", &a.host.iface]);
        assert!(host.contains("198.18.1.1/24"), "{host}");
        assert!(a.dpdk.eal.vdev.starts_with("net_af_packet0,iface="));
        // Without DPDK nobody answers for 198.18.1.2.
        let s = a
            .host
            .ping(a.dpdk.ip, 1, PING_GAP, Duration::from_millis(300))
            .unwrap();
        assert_eq!(s.received, 0);
    }
    assert_nothing_left(&p);
}

#[test]
fn unknown_topology_is_one_clear_error() {
    let e = "ring".parse::<Kind>().unwrap_err();
    assert!(matches!(e, Error::UnknownTopology { .. }));
    let p = prefix("x1");
    let out = cli_run(&["up", "ring", "--prefix", p.as_str()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown topology `ring`; valid topologies: memif, tap, afpacket, veth"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "one error line: {err}");
}

#[test]
fn bad_prefix_and_bad_netem_values_are_clear_errors() {
    let out = cli_run(&["up", "veth", "--prefix", "Bad-Prefix"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid prefix"));
    let p = prefix("x2");
    let ps = p.as_str();
    let out = cli_run(&["netem", "k1", "--prefix", ps, "--loss", "150%"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("between 0 and 100"));
    let out = cli_run(&["netem", "k9", "--prefix", ps, "--loss", "1%"]);
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("no impairable link `k9` in any topology; valid links: tap, host, k1, k2"));
    let out = cli_run(&["netem", "k1", "--prefix", ps, "--loss", "1%"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not up") && err.contains("testbed up veth"),
        "{err}"
    );
}

#[test]
fn missing_root_or_ip_binary_is_a_clear_error() {
    let p = prefix("x3");
    // Not root: drop privileges with setpriv (util-linux).
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_testbed"))
        .args(["up", "veth", "--prefix", p.as_str()])
        .output()
        .expect("setpriv");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("needs root"), "{err}");
    // No `ip` in PATH.
    let empty = tempdir("testbed-nopath");
    let out = cli()
        .args(["up", "veth", "--prefix", p.as_str()])
        .env("PATH", &empty)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("`ip` not found in PATH") && err.contains("iproute2"),
        "{err}"
    );
    assert!(!netns_exists(&p.name("k1")));
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn sweep_after_kill_9_leaves_nothing_behind() {
    let p = prefix("k9");
    let ps = p.as_str();
    // A process holding a veth topology, the way a test or knb would.
    let mut holder = cli()
        .args(["up", "veth", "--prefix", ps, "--hold"])
        .stdout(Stdio::null())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let ready = (0..250).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        testbed::read_state(Kind::Veth, &p).is_some()
    });
    assert!(ready, "holder never brought veth up");
    // More state of every kind: a memif topology with a stand-in DPDK process inside its
    // namespace, an impairment daemon, and DPDK runtime files like a crashed EAL leaves.
    assert!(cli_run(&["up", "memif", "--prefix", ps]).status.success());
    let out = cli_run(&["netem", "k1", "--prefix", ps, "--delay", "5ms"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut inside = testbed::netns_command(&p.name("memif"), "sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let fp = match Details::of(Kind::Memif, &p) {
        Details::Memif(m) => m.server.eal.file_prefix,
        _ => unreachable!(),
    };
    std::fs::create_dir_all(format!("/var/run/dpdk/{fp}")).unwrap();
    std::fs::write(format!("/var/run/dpdk/{fp}/config"), b"x").unwrap();
    std::fs::File::create(format!("/dev/hugepages/{fp}map_0")).unwrap();
    let daemons: Vec<u32> = testbed::daemon::persistent_impairments(&p)
        .iter()
        .filter_map(|r| r.pid)
        .collect();
    assert_eq!(daemons.len(), 1, "one impairment daemon expected");

    holder.kill().unwrap(); // SIGKILL: no teardown runs
    holder.wait().unwrap();
    assert!(
        netns_exists(&p.name("k1")),
        "kill -9 should have left the namespaces"
    );

    let rep = testbed::sweep(&p).unwrap();
    let mut ns = rep.namespaces.clone();
    ns.sort();
    assert_eq!(ns, [p.name("k1"), p.name("k2"), p.name("memif")]);
    assert!(rep.processes >= 2, "{rep:?}");
    // >= 1, not 2: on a shared machine another engineer's hugepage cleanup may remove the
    // fake hugepage file first; that nothing is left is asserted below either way.
    assert!(rep.dpdk_files >= 1 && rep.state_dir, "{rep:?}");
    assert_nothing_left(&p);
    // The processes inside are gone, not just the names.
    assert!(
        inside.try_wait().unwrap().is_some() || {
            std::thread::sleep(Duration::from_millis(200));
            inside.try_wait().unwrap().is_some()
        }
    );
    for pid in daemons {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "daemon {pid} survived"
        );
    }
    // A second sweep finds nothing.
    assert!(testbed::sweep(&p).unwrap().is_empty());
    // `testbed down` reports the same.
    let out = cli_run(&["down", "--prefix", ps]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("nothing with prefix {p}")));
}

#[test]
fn cli_up_status_down_round_trip() {
    let p = prefix("c1");
    let ps = p.as_str();
    for kind in ["veth", "afpacket", "memif", "tap"] {
        let out = cli_run(&["up", kind, "--prefix", ps]);
        assert!(
            out.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = cli_run(&["status", "--prefix", ps]);
    let s = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "veth (MTU 1500)",
        "afpacket:",
        "memif:",
        "tap:",
        "198.18.2.1/24",
    ] {
        assert!(s.contains(needle), "status lacks {needle}: {s}");
    }
    let out = cli_run(&["eal", "memif-client", "--prefix", ps]);
    let args = String::from_utf8_lossy(&out.stdout);
    assert!(args.lines().any(|l| l.contains("role=client")), "{args}");
    let out = cli_run(&["down", "veth", "--prefix", ps]);
    assert!(out.status.success());
    assert!(!netns_exists(&p.name("k1")) && netns_exists(&p.name("memif")));
    let out = cli_run(&["down", "--prefix", ps]);
    assert!(out.status.success());
    assert_nothing_left(&p);
}
