//! Configuration: a good file with overrides, and one clear error per bad input.

use clap::Parser;
use r2c::config::{CliOverrides, Config, ConfigError, DeviceKind, RunMode};
use r2c::device::mem::MemPair;

const GOOD: &str = r#"
eal = ["--no-pci", "--in-memory"]

[device]
kind = "mem"

[cores]
list = [0]

[net]
ip = "198.18.0.1"
prefix_len = 24
gateway = "198.18.0.254"
routes = [{ dest = "198.19.0.0/16", via = "198.18.0.254" }]
neighbours = [{ ip = "198.18.0.2", mac = "02:00:00:00:00:02" }]

[tcp]
mss = 1400
cc = "cubic"
delayed_ack_us = 200
rto_min_us = 5000
rto_max_us = 2000000
send_burst = 4
tlp_us = 5000
rack = false
tlp_ack_delay_us = 5000

[ports]
app = "knb"
apps = [{ name = "knb" }, { name = "other", ports = [61440, 62463], threads = 2 }]

[runtime]
mode = "batch"
idle = "yield"
"#;

fn bad(text: &str) -> ConfigError {
    Config::parse(text).expect_err("config should be refused")
}

fn with(extra: &str) -> String {
    format!("[device]\nkind = \"mem\"\n[cores]\nlist = [0]\n[net]\nip = \"198.18.0.1\"\n{extra}")
}

fn assert_names(e: &ConfigError, key: &str, words: &[&str]) {
    assert_eq!(e.key, key, "{e}");
    let msg = e.to_string();
    for w in words {
        assert!(msg.contains(w), "`{msg}` should mention `{w}`");
    }
    assert!(!e.fix.is_empty(), "every error says how to fix it: {e}");
}

#[test]
fn good_config_parses_and_builds_core_setups() {
    let c = Config::parse(GOOD).unwrap();
    assert_eq!(c.eal, vec!["--no-pci", "--in-memory"]);
    assert_eq!(c.device, DeviceKind::Mem);
    assert_eq!(c.mode, RunMode::Batch);
    assert_eq!(c.tcp.mss, 1400);
    assert_eq!(c.tcp.rtt.min_rto.as_micros(), 5000);
    assert_eq!(c.tcp.send_burst, 4);
    let d = Config::parse(&with("")).unwrap();
    assert_eq!(d.tcp.send_burst, 16, "the default");
    assert_eq!(c.tcp.tlp, Some(luna_stack::time::Duration::from_millis(5)));
    assert_eq!(
        d.tcp.tlp,
        Some(luna_stack::tcp::TcpConfig::TLP_FLOOR),
        "on by default"
    );
    assert!(!c.tcp.rack && d.tcp.rack, "rack: set off, on by default");
    assert_eq!(c.tcp.tlp_ack_delay.as_micros(), 5000);
    assert_eq!(d.tcp.tlp_ack_delay.as_millis(), 40, "the default");
    let off = Config::parse(&with("[tcp]\ntlp_us = 0\n")).unwrap();
    assert_eq!(off.tcp.tlp, None, "0 turns probes off");
    assert_eq!(c.net.routes.len(), 1);
    // "other" owns 61440-62463; "knb" (one core) gets the rest.
    let mine = c.ports.plan.ports_of("knb", 0);
    assert_eq!(mine.iter().map(|r| r.len()).sum::<u32>(), 4096 - 1024);
    assert!(mine.iter().all(|r| r.first() > 62463));
    let (a, _b) = MemPair::single();
    let setups = c.core_setups(vec![vec![a]]).unwrap();
    assert_eq!(setups[0].cpu, Some(0));
    assert_eq!(setups[0].neighbours.len(), 1);
    assert_eq!(setups[0].ports, mine);
    assert_eq!(
        setups[0].stack.gateway,
        Some("198.18.0.254".parse().unwrap())
    );
}

#[test]
fn cli_overrides_win_over_the_file() {
    let dir = std::env::temp_dir().join(format!("lrc-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("r2c.toml");
    std::fs::write(&path, GOOD).unwrap();
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        o: CliOverrides,
    }
    let cli = Cli::parse_from([
        "app",
        "--config",
        path.to_str().unwrap(),
        "--ip",
        "198.18.0.7",
        "--eal",
        "--no-pci --file-prefix=lrc",
        "--set",
        "tcp.mss=1200",
        "--set",
        "runtime.mode=inline",
    ]);
    let c = cli.o.load().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        c.net.ip,
        "198.18.0.7".parse::<std::net::Ipv4Addr>().unwrap()
    );
    assert_eq!(c.eal, vec!["--no-pci", "--file-prefix=lrc"]);
    assert_eq!(c.tcp.mss, 1200);
    assert_eq!(c.mode, RunMode::Inline);
}

#[test]
fn unknown_key() {
    let e = bad(&with("[tcp]\nmsss = 1400\n"));
    assert_names(&e, "tcp.msss", &["unknown key", "mss"]);
    let e = bad(&with("colour = \"blue\"\n"));
    assert_names(&e, "net.colour", &["unknown key"]);
    let e = bad(&(with("") + "[bogus]\nx = 1\n"));
    assert_names(&e, "bogus", &["unknown key", "runtime"]);
}

#[test]
fn bad_ip() {
    let e = bad("[device]\nkind = \"mem\"\n[cores]\nlist = [0]\n[net]\nip = \"198.18.0.300\"\n");
    assert_names(&e, "net.ip", &["198.18.0.300", "IPv4"]);
    let e = bad("[device]\nkind = \"mem\"\n[cores]\nlist = [0]\n[net]\nip = \"224.0.0.1\"\n");
    assert_names(&e, "net.ip", &["unicast"]);
    let e = bad(&with("gateway = \"10.0.0.1\"\n"));
    assert_names(&e, "net.gateway", &["not on"]);
    let e = bad(&with(
        "neighbours = [{ ip = \"198.18.0.2\", mac = \"ff:ff:ff:ff:ff:ff\" }]\n",
    ));
    assert_names(&e, "net.neighbours[0].mac", &["broadcast"]);
    let e = bad(&with("routes = [{ dest = \"198.19.0.0/40\" }]\n"));
    assert_names(&e, "net.routes[0].dest", &["prefix"]);
}

/// Regression: 0.0.0.0 (with the CLI's --ip too), loopback, the broadcast and the network
/// address were accepted as the interface address.
#[test]
fn interface_address_that_is_not_a_host_is_refused_in_file_and_override() {
    for (ip, len, why) in [
        ("0.0.0.0", 24, "unspecified"),
        ("255.255.255.255", 24, "limited broadcast"),
        ("224.0.0.1", 24, "multicast"),
        ("127.0.0.1", 8, "loopback"),
        ("198.18.0.0", 24, "network address"),
        ("198.18.0.255", 24, "broadcast address of its prefix"),
        ("240.1.2.3", 24, "reserved"),
    ] {
        let text = format!(
            "[device]\nkind = \"mem\"\n[cores]\nlist = [0]\n[net]\nip = \"{ip}\"\nprefix_len = {len}\n"
        );
        assert_names(&bad(&text), "net.ip", &[ip, why, "unicast host address"]);
        let e = Config::parse_with_overrides(
            &with(&format!("prefix_len = {len}\n")),
            &[("net.ip".into(), ip.into())],
        )
        .unwrap_err();
        assert_names(&e, "net.ip", &[ip, why]);
    }
    let o = CliOverrides {
        ip: Some("0.0.0.0".into()),
        ..CliOverrides::default()
    };
    let e = Config::parse_with_overrides(&with(""), &o.overrides().unwrap()).unwrap_err();
    assert_names(&e, "net.ip", &["0.0.0.0", "unspecified"]);
    // A /31's and a /32's every address is a host (RFC 3021).
    for (ip, len) in [("198.18.0.0", 31), ("198.18.0.255", 32)] {
        let text = format!(
            "[device]\nkind = \"mem\"\n[cores]\nlist = [0]\n[net]\nip = \"{ip}\"\nprefix_len = {len}\n"
        );
        Config::parse(&text).unwrap_or_else(|e| panic!("{ip}/{len}: {e}"));
    }
}

#[test]
fn core_out_of_range() {
    let e = bad("[device]\nkind = \"mem\"\n[cores]\nlist = [4095]\n[net]\nip = \"198.18.0.1\"\n");
    assert_names(&e, "cores.list[0]", &["4095", "out of range"]);
    let e = bad("[device]\nkind = \"mem\"\n[cores]\nlist = [0, 0]\n[net]\nip = \"198.18.0.1\"\n");
    assert_names(&e, "cores.list[1]", &["twice"]);
    let e = bad("[device]\nkind = \"mem\"\n[cores]\nlist = []\n[net]\nip = \"198.18.0.1\"\n");
    assert_names(&e, "cores.list", &["no CPUs"]);
    let e = bad("[device]\nkind = \"mem\"\n[cores]\nlist = [0]\nqueues_per_core = 0\n[net]\nip = \"198.18.0.1\"\n");
    assert_names(&e, "cores.queues_per_core", &["out of range"]);
}

#[test]
fn port_range_overlap() {
    let e = bad(&with(
        "[ports]\napp = \"a\"\napps = [{ name = \"a\" }, { name = \"b\", ports = [61440, 62000] }, { name = \"c\", ports = [61900, 63000] }]\n",
    ));
    assert_names(&e, "ports.apps", &["overlap", "`b`", "`c`"]);
    let e = bad(&with("[ports]\nrange = [65000, 61440]\n"));
    assert_names(&e, "ports.range", &["65000 > 61440"]);
    let e = bad(&with("[ports]\napp = \"x\"\napps = [{ name = \"y\" }]\n"));
    assert_names(&e, "ports.app", &["\"x\""]);
    let e = bad(&with("[ports]\napps = [{ name = \"r2c\", ports = 10 }]\n"));
    assert_names(&e, "ports.apps", &["belong to no application"]);
}

#[test]
fn missing_device() {
    let e = bad("[cores]\nlist = [0]\n[net]\nip = \"198.18.0.1\"\n");
    assert_names(&e, "device", &["no device", "kind"]);
    let e = bad("[device]\nkind = \"dpdk\"\n[cores]\nlist = [0]\n[net]\nip = \"198.18.0.1\"\n");
    assert_names(&e, "device.port", &["port name"]);
    let e = bad("[device]\nkind = \"nic\"\n[cores]\nlist = [0]\n[net]\nip = \"198.18.0.1\"\n");
    assert_names(&e, "device.kind", &["\"nic\""]);
}

#[test]
fn bad_tcp_and_runtime_knobs() {
    let e = bad(&with("[tcp]\ncc = \"bbr\"\n"));
    assert_names(&e, "tcp.cc", &["bbr", "cubic"]);
    let e = bad(&with("[tcp]\ndelayed_ack_us = 500000\n"));
    assert_names(&e, "tcp.delayed_ack_us", &["out of range"]);
    let e = bad(&with("[tcp]\nmss = 9000\n"));
    assert_names(&e, "tcp.mss", &["out of range"]);
    let e = bad(&with("[tcp]\nrto_min_us = 900\nrto_max_us = 800\n"));
    assert_names(&e, "tcp.rto_min_us", &["rto_max_us"]);
    for n in ["0", "65"] {
        let e = bad(&with(&format!("[tcp]\nsend_burst = {n}\n")));
        assert_names(&e, "tcp.send_burst", &["out of range"]);
    }
    let e = bad(&with("[tcp]\ntlp_us = -1\n"));
    assert_names(&e, "tcp.tlp_us", &["out of range"]);
    let e = bad(&with(
        "[tcp]\nrto_max_us = 1000000\ntlp_ack_delay_us = 2000000\n",
    ));
    assert_names(&e, "tcp.tlp_ack_delay_us", &["rto_max_us"]);
    let e = bad(&with("[tcp]\nrto_max_us = 1000000\ntlp_us = 2000000\n"));
    assert_names(&e, "tcp.tlp_us", &["rto_max_us"]);
    let e = bad(&with("[tcp]\nsack = \"yes\"\n"));
    assert_names(&e, "tcp.sack", &["true or false"]);
    let e = bad(&with("[runtime]\nmode = \"split\"\n"));
    assert_names(&e, "runtime.workers", &["worker"]);
    let e = bad(&with("[runtime]\nmode = \"turbo\"\n"));
    assert_names(&e, "runtime.mode", &["turbo"]);
    let e = bad(&with("[runtime]\nworkers = [0]\nmode = \"split\"\n"));
    assert_names(&e, "runtime.workers", &["also in cores.list"]);
    // The receive burst and its split (0 = never split).
    let d = Config::parse(&with("")).unwrap();
    assert_eq!(
        (d.options.burst, d.options.rx_split),
        (32, 4),
        "the defaults"
    );
    let r = Config::parse(&with("[runtime]\nburst = 64\nrx_split = 0\n")).unwrap();
    assert_eq!((r.options.burst, r.options.rx_split), (64, 0));
    let e = bad(&with("[runtime]\nrx_split = 513\n"));
    assert_names(&e, "runtime.rx_split", &["out of range"]);
    let e = bad(&with("[runtime]\nburst = 0\n"));
    assert_names(&e, "runtime.burst", &["out of range"]);
}

#[test]
fn bad_files_and_overrides() {
    let e = bad("[device\nkind = 1");
    assert_names(&e, "<toml>", &["TOML"]);
    let e =
        Config::parse_with_overrides(&with(""), &[("net.ip.x".into(), "1".into())]).unwrap_err();
    assert_names(&e, "net.ip", &["not a section"]);
    let e = Config::load(std::path::Path::new("/nonexistent/lrc.toml"), &[]).unwrap_err();
    assert_names(&e, "<file>", &["cannot read"]);
    let o = CliOverrides {
        set: vec!["novalue".into()],
        ..CliOverrides::default()
    };
    assert_names(&o.overrides().unwrap_err(), "novalue", &["KEY=VALUE"]);
    let e = Config::parse_with_overrides(&with(""), &[("net.ip".into(), "198.18.0.999".into())])
        .unwrap_err();
    assert_names(&e, "net.ip", &["198.18.0.999"]);
}

// ------------------------------------------------ [traffic] and [exception] (issue 11)

const COEXIST: &str = r#"
[device]
kind = "mem"

[cores]
list = [0, 1]

[net]
ip = "198.18.4.2"

[ports]
app = "knb"

[traffic]
client_range = [61440, 65535]
listen_tcp = [7700]
ip = "198.18.4.2"

[exception]
port = "net_tap1"
iface = "luna-exc"
mirror = true
"#;

fn kernel_default() -> bifurcation::KernelPorts {
    bifurcation::KernelPorts::parse("32768 60999", "").expect("kernel ports")
}

#[test]
fn traffic_section_feeds_the_port_chooser_and_the_exception_path() {
    let c = Config::parse_with_kernel(COEXIST, &kernel_default()).expect("config");
    let model = c.traffic.as_ref().expect("traffic model");
    assert_eq!(model.listen_tcp(), &[7700]);
    let e = c.exception.as_ref().expect("exception");
    assert_eq!(
        (e.port.as_str(), e.iface.as_str(), e.mirror, e.queue),
        ("net_tap1", "luna-exc", true, 1024)
    );
    // Two threads of "knb" split the client range; [traffic] replaced [ports].
    let p0 = c.ports.plan.ports_of("knb", 0);
    let p1 = c.ports.plan.ports_of("knb", 1);
    assert!(!p0.is_empty() && !p1.is_empty());
    assert_eq!(c.ports.range.first(), 61440);
    // Mirroring on: the kernel owns ARP, the stack must not answer it.
    let (a, _) = MemPair::single();
    use r2c::device::Device;
    assert!(!c.stack_config(a.mac()).answer_arp);
    let setups = c
        .core_setups(vec![vec![a], vec![MemPair::single().0]])
        .expect("setups");
    assert_eq!(setups[1].ports, p1);
}

#[test]
fn luna_ports_overlapping_the_kernels_ephemeral_range_are_refused() {
    // The kernel's ephemeral range reaches into luna's client range.
    let k = bifurcation::KernelPorts::parse("32768 65000", "").expect("kernel ports");
    let e = Config::parse_with_kernel(COEXIST, &k).expect_err("overlap refused");
    assert_names(&e, "traffic.client_range", &["ephemeral"]);
    assert!(e.fix.contains("sysctl"), "{e}");
    // A listening port inside the kernel's default ephemeral range.
    let text = COEXIST.replace("listen_tcp = [7700]", "listen_tcp = [40000]");
    let e = Config::parse_with_kernel(&text, &kernel_default()).expect_err("refused");
    assert_eq!(e.key, "traffic.listen_tcp", "{e}");
}

#[test]
fn traffic_and_exception_mistakes_are_named() {
    let k = kernel_default();
    let e = Config::parse_with_kernel(&COEXIST.replace("listen_tcp", "listen_tpc"), &k)
        .expect_err("unknown key");
    assert_eq!(e.key, "traffic", "{e}");
    let e = Config::parse_with_kernel(
        &COEXIST.replace("app = \"knb\"", "app = \"knb\"\nrange = [61440, 65535]"),
        &k,
    )
    .expect_err("ports.range with traffic");
    assert_eq!(e.key, "ports.range", "{e}");
    let e = Config::parse_with_kernel(&COEXIST.replace("iface = \"luna-exc\"\n", ""), &k)
        .expect_err("no iface");
    assert_eq!(e.key, "exception.iface", "{e}");
    let e = Config::parse_with_kernel(&COEXIST.replace("mirror = true", "mirror = 1"), &k)
        .expect_err("mirror type");
    assert_eq!(e.key, "exception.mirror", "{e}");
    let no_traffic: String = COEXIST
        .split("[traffic]")
        .next()
        .map(|head| format!("{head}[exception]\nport = \"net_tap1\"\niface = \"x\"\n"))
        .unwrap_or_default();
    let e = Config::parse_with_kernel(&no_traffic, &k).expect_err("exception without traffic");
    assert_eq!(e.key, "exception", "{e}");
    let e = Config::parse_with_kernel(
        &COEXIST.replace(
            "[traffic]",
            "[traffic]\napps = [{ name = \"knb\", threads = 3 }]",
        ),
        &k,
    )
    .expect_err("threads mismatch");
    assert_eq!(e.key, "traffic.apps", "{e}");
}

/// `device.steering` (issue 11's hardware path): `auto` by default with `[traffic]`, the
/// request carries the model's compiled rules; no request without `[traffic]`; a wrong
/// word, or steering without a traffic model, is named.
#[test]
fn steering_follows_the_traffic_model() {
    use r2c::device::steering::SteeringMode;
    let k = kernel_default();
    let c = Config::parse_with_kernel(COEXIST, &k).expect("config");
    assert_eq!(c.steering, SteeringMode::Auto);
    let req = c.steering_request().expect("a request with [traffic]");
    assert_eq!(req.mode, SteeringMode::Auto);
    // 7700's RSS rule plus the client range's two threads (aligned: one rule each).
    assert_eq!(req.rules.rules.len(), 3, "{:?}", req.rules);
    let c = Config::parse_with_kernel(
        &COEXIST.replace("kind = \"mem\"", "kind = \"mem\"\nsteering = \"software\""),
        &k,
    )
    .expect("config");
    assert_eq!(
        c.steering_request().map(|r| r.mode),
        Some(SteeringMode::Software)
    );
    let e = Config::parse_with_kernel(
        &COEXIST.replace("kind = \"mem\"", "kind = \"mem\"\nsteering = \"mlx5\""),
        &k,
    )
    .expect_err("unknown steering");
    assert_names(&e, "device.steering", &["mlx5"]);
    let plain = "[device]\nkind = \"mem\"\nsteering = \"hardware\"\n[cores]\nlist = [0]\n[net]\nip = \"198.18.4.2\"\n";
    let e = Config::parse_with_kernel(plain, &k).expect_err("steering without [traffic]");
    assert_names(&e, "device.steering", &["traffic"]);
    let c = Config::parse_with_kernel(&plain.replace("steering = \"hardware\"\n", ""), &k)
        .expect("config");
    assert!(c.steering_request().is_none());
}

/// `device.tx_copy_max`: unset leaves the choice to the device, a number sets it (0:
/// never copy flat), a negative or huge value or a word is named with the key.
#[test]
fn tx_copy_max_is_the_devices_choice_unless_set() {
    let c = Config::parse(&with("")).expect("config");
    assert_eq!(c.tx_copy_max, None);
    let set = |v: &str| {
        with("").replace(
            "kind = \"mem\"",
            &format!("kind = \"mem\"\ntx_copy_max = {v}"),
        )
    };
    assert_eq!(Config::parse(&set("0")).expect("0").tx_copy_max, Some(0));
    assert_eq!(
        Config::parse(&set("2048")).expect("2048").tx_copy_max,
        Some(2048)
    );
    for v in ["-1", "100000"] {
        assert_names(&bad(&set(v)), "device.tx_copy_max", &["out of range"]);
    }
    assert_names(&bad(&set("\"auto\"")), "device.tx_copy_max", &["integer"]);
}

/// `tcp.rcv_mem_min`, the floor of a connection whose application reads under the
/// stack-wide bound (`TcpConfig::rcv_mem_min`, Linux's `tcp_rmem[0]`): the stack's
/// default unset, as given when set (0 turns the floor and its reserve off), refused by
/// name when negative or not a number.
#[test]
fn rcv_mem_min_is_the_stacks_floor() {
    use luna_stack::tcp::DEFAULT_RCV_MEM_MIN;
    let setup = |c: &Config| {
        let (a, _b) = MemPair::single();
        c.core_setups(vec![vec![a]]).unwrap().remove(0)
    };
    let s = setup(&Config::parse(&with("")).expect("config"));
    assert_eq!(s.stack.tcp.rcv_mem_min, DEFAULT_RCV_MEM_MIN);
    assert_eq!(s.stack.rcv_mem_reserve(), s.stack.rcv_mem_total / 3);
    for n in [0, 4096, 1 << 20] {
        let c = Config::parse(&with(&format!("[tcp]\nrcv_mem_min = {n}\n"))).expect("set");
        let s = setup(&c);
        assert_eq!(s.stack.tcp.rcv_mem_min, n);
        let reserve = if n == 0 { 0 } else { s.stack.rcv_mem_total / 3 };
        assert_eq!(s.stack.rcv_mem_reserve(), reserve);
    }
    assert_names(
        &bad(&with("[tcp]\nrcv_mem_min = -1\n")),
        "tcp.rcv_mem_min",
        &["out of range"],
    );
    assert_names(
        &bad(&with("[tcp]\nrcv_mem_min = \"96K\"\n")),
        "tcp.rcv_mem_min",
        &["integer"],
    );
}

/// `tcp.rcv_mem_total`, the stack-wide receive-memory bound of each core's stack: unset,
/// r2c derives it from the core's receive pools (the stack's default until then); set,
/// it is the stack's value, kept as given (even the default's value); below the least
/// the stack accepts (`MIN_RCV_MEM_TOTAL`), or not a number, it is refused by name.
#[test]
fn rcv_mem_total_is_half_the_receive_pools_unless_set() {
    use luna_stack::stack::{DEFAULT_RCV_MEM_TOTAL, MIN_RCV_MEM_TOTAL};
    let setup = |c: &Config| {
        let (a, _b) = MemPair::single();
        c.core_setups(vec![vec![a]]).unwrap().remove(0)
    };
    let d = Config::parse(&with("")).expect("config");
    assert_eq!(d.rcv_mem_total, None);
    let s = setup(&d);
    assert!(!s.rcv_mem_total_set);
    assert_eq!(s.stack.rcv_mem_total, DEFAULT_RCV_MEM_TOTAL);
    for n in [MIN_RCV_MEM_TOTAL, DEFAULT_RCV_MEM_TOTAL, 64 << 20] {
        let c = Config::parse(&with(&format!("[tcp]\nrcv_mem_total = {n}\n"))).expect("set");
        assert_eq!(c.rcv_mem_total, Some(n));
        let s = setup(&c);
        assert!(s.rcv_mem_total_set);
        assert_eq!(s.stack.rcv_mem_total, n);
    }
    let low = MIN_RCV_MEM_TOTAL - 1;
    assert_names(
        &bad(&with(&format!("[tcp]\nrcv_mem_total = {low}\n"))),
        "tcp.rcv_mem_total",
        &["below", "65536", "MIN_RCV_MEM_TOTAL"],
    );
    assert_names(
        &bad(&with("[tcp]\nrcv_mem_total = -1\n")),
        "tcp.rcv_mem_total",
        &["out of range"],
    );
    assert_names(
        &bad(&with("[tcp]\nrcv_mem_total = \"8M\"\n")),
        "tcp.rcv_mem_total",
        &["integer"],
    );
}
