//! Impairments on the veth topology (run as root): visible in tc/iptables and measurably
//! effective. Assertions are loose behaviour checks, not benchmarks.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{assert_nothing_left, cli_run, prefix};
use testbed::{impair, Backend, Impairment, Kind, Topology};

const GAP: Duration = Duration::from_millis(100);
const WAIT: Duration = Duration::from_millis(800);

/// What shows that an impairment is installed on the host's interface.
fn installed(t: &Topology, link: &str) -> String {
    let v = t.veth().unwrap();
    let h = if link == "k1" { &v.k1 } else { &v.k2 };
    let q = impair::qdisc_show(&h.netns, &h.iface).unwrap();
    let r = impair::nfqueue_rules(&h.netns).unwrap();
    format!("{q}\n{r}")
}

fn veth(tag: &str) -> Topology {
    Topology::up(Kind::Veth, &prefix(tag)).unwrap()
}

#[test]
fn full_loss_stops_ping_and_clear_restores_it() {
    let mut t = veth("i1");
    let v = t.veth().unwrap().clone();
    assert_eq!(v.k1.ping(v.k2.ip, 2, GAP, WAIT).unwrap().received, 2);
    let b = t
        .set_impairment(
            "k1",
            &Impairment {
                loss: 100.0,
                ..Default::default()
            },
        )
        .unwrap();
    let shown = installed(&t, "k1");
    match b {
        Backend::Netem => assert!(
            shown.contains("netem") && shown.contains("loss 100%"),
            "{shown}"
        ),
        Backend::Nfqueue => assert!(
            shown.contains("NFQUEUE") && shown.contains(&v.k1.iface),
            "{shown}"
        ),
    }
    let s = v.k1.ping(v.k2.ip, 3, GAP, WAIT).unwrap();
    assert_eq!(s.received, 0, "{s:?}");
    if b == Backend::Nfqueue {
        assert!(t.impairment_stats("k1").unwrap().dropped >= 3);
    }
    // Egress of k1 only: k2's requests get through, k1's replies do not.
    assert_eq!(v.k2.ping(v.k1.ip, 2, GAP, WAIT).unwrap().received, 0);
    t.clear_impairment("k1").unwrap();
    let shown = installed(&t, "k1");
    assert!(
        !shown.contains("netem") && !shown.contains("NFQUEUE"),
        "{shown}"
    );
    assert_eq!(v.k1.ping(v.k2.ip, 2, GAP, WAIT).unwrap().received, 2);
    let p = t.prefix().clone();
    drop(t);
    assert_nothing_left(&p);
}

#[test]
fn delay_raises_rtt_on_each_impaired_end() {
    let mut t = veth("i2");
    let v = t.veth().unwrap().clone();
    let base = v.k1.ping(v.k2.ip, 3, GAP, WAIT).unwrap();
    assert!(
        base.rtt_avg.unwrap() < Duration::from_millis(20),
        "{base:?}"
    );
    t.set_impairment(
        "k1",
        &Impairment {
            delay: Duration::from_millis(40),
            ..Default::default()
        },
    )
    .unwrap();
    let one = v.k1.ping(v.k2.ip, 3, GAP, WAIT).unwrap();
    assert_eq!(one.received, 3);
    assert!(one.rtt_min.unwrap() >= Duration::from_millis(35), "{one:?}");
    // Both ends of a veth can be impaired at once.
    t.set_impairment(
        "k2",
        &Impairment {
            delay: Duration::from_millis(40),
            ..Default::default()
        },
    )
    .unwrap();
    let both = v.k1.ping(v.k2.ip, 3, GAP, WAIT).unwrap();
    assert_eq!(both.received, 3);
    assert!(
        both.rtt_min.unwrap() >= Duration::from_millis(75),
        "{both:?}"
    );
    assert!(
        both.rtt_max.unwrap() < Duration::from_millis(500),
        "{both:?}"
    );
}

#[test]
fn duplicate_makes_ping_see_duplicates() {
    let mut t = veth("i3");
    let v = t.veth().unwrap().clone();
    t.set_impairment(
        "k1",
        &Impairment {
            duplicate: 100.0,
            ..Default::default()
        },
    )
    .unwrap();
    let s = v.k1.ping(v.k2.ip, 5, GAP, WAIT).unwrap();
    assert_eq!(s.received, 5, "{s:?}");
    assert!(s.duplicates >= 4, "{s:?}");
}

#[test]
fn corrupt_breaks_checksums_so_replies_never_come() {
    let mut t = veth("i4");
    let v = t.veth().unwrap().clone();
    t.set_impairment(
        "k1",
        &Impairment {
            corrupt: 100.0,
            ..Default::default()
        },
    )
    .unwrap();
    let s = v.k1.ping(v.k2.ip, 4, GAP, WAIT).unwrap();
    // A flipped bit lands in the IPv4 header (its checksum fails) or in the ICMP message
    // (its checksum fails): the peer drops every request.
    assert_eq!(s.received, 0, "{s:?}");
    if let Some(st) = t.impairment_stats("k1") {
        assert!(st.corrupted >= 4, "{st:?}");
    }
}

#[test]
fn reorder_sends_some_packets_ahead_of_delayed_ones() {
    let mut t = veth("i5");
    let v = t.veth().unwrap().clone();
    let imp = Impairment {
        delay: Duration::from_millis(100),
        reorder: 50.0,
        seed: Some(7),
        ..Default::default()
    };
    t.set_impairment("k1", &imp).unwrap();
    let s =
        v.k1.ping(
            v.k2.ip,
            20,
            Duration::from_millis(20),
            Duration::from_secs(1),
        )
        .unwrap();
    assert_eq!(s.received, 20, "{s:?}");
    // Bimodal: some replies skip the delay, others carry it.
    assert!(s.rtt_min.unwrap() < Duration::from_millis(50), "{s:?}");
    assert!(s.rtt_max.unwrap() >= Duration::from_millis(90), "{s:?}");
}

/// Seconds until k2 has received `bytes` over TCP from k1 (netcat, bounded by `limit`).
fn tcp_transfer_secs(t: &Topology, bytes: usize, limit: Duration) -> f64 {
    let v = t.veth().unwrap();
    // The receiver exits at the sender's FIN; timing it (not the sender, whose writes end
    // in its socket buffer) measures the link.
    let server =
        v.k2.command("sh")
            .arg("-c")
            .arg(format!(
                "timeout {} nc.openbsd -l -p 5201 | wc -c",
                limit.as_secs()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    let out =
        v.k1.command("sh")
            .arg("-c")
            .arg(format!(
                "head -c {bytes} /dev/zero | timeout {} nc.openbsd -N {} 5201",
                limit.as_secs(),
                v.k2.ip
            ))
            .output()
            .unwrap();
    assert!(
        out.status.success(),
        "sender failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = server.wait_with_output().unwrap();
    let secs = start.elapsed().as_secs_f64();
    let n: usize = String::from_utf8_lossy(&got.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    assert_eq!(n, bytes, "receiver got {n} of {bytes} bytes");
    secs
}

/// `nstat -a -s -z` in `h`'s namespace: counter -> absolute value.
fn nstat(h: &testbed::KernelHost, name: &str) -> u64 {
    let out = h
        .command("nstat")
        .args(["-a", "-s", "-z"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == name).then(|| w.next()?.parse().ok())?
        })
        .unwrap_or(0)
}

/// Locally generated TCP is CHECKSUM_PARTIAL at POSTROUTING, where the NFQUEUE rule
/// sits. Were the checksum completed after the engine, over the engine's bytes, a flipped
/// bit would travel under a valid checksum and the receiver would take corrupt data. It
/// is not (nfq.rs module docs): every corrupted segment is one `TcpInCsumErrors` at the
/// receiver, and TCP repairs the stream byte for byte.
#[test]
fn corrupt_tcp_is_caught_by_the_receivers_checksum() {
    let mut t = veth("ic");
    let v = t.veth().unwrap().clone();
    let backend = t
        .set_impairment(
            "k1",
            &Impairment {
                corrupt: 3.0,
                seed: Some(11),
                ..Default::default()
            },
        )
        .unwrap();
    let dir = std::env::temp_dir().join(format!("skk-corrupt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, dst) = (dir.join("src"), dir.join("dst"));
    let data: Vec<u8> = (0..3_000_000u64)
        .map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    let errs0 = nstat(&v.k2, "TcpInCsumErrors");
    let server =
        v.k2.command("sh")
            .arg("-c")
            .arg(format!(
                "timeout 60 nc.openbsd -l -p 5202 > {}",
                dst.display()
            ))
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out =
        v.k1.command("sh")
            .arg("-c")
            .arg(format!(
                "timeout 60 nc.openbsd -N {} 5202 < {}",
                v.k2.ip,
                src.display()
            ))
            .output()
            .unwrap();
    assert!(
        out.status.success(),
        "sender failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(server.wait_with_output().unwrap().status.success());
    // Stop the engine first: its final counters cover every packet it sent.
    let st = t.stop_impairment("k1").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let got = std::fs::read(&dst).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        got == data,
        "{} of {} bytes, or different",
        got.len(),
        data.len()
    );
    let errs = nstat(&v.k2, "TcpInCsumErrors") - errs0;
    println!("backend {backend:?}, engine {st:?}, receiver TcpInCsumErrors {errs}");
    if backend == Backend::Nfqueue {
        let st = st.expect("engine counters");
        assert!(st.corrupted > 20, "{st:?}");
        assert_eq!(st.partial_checksums, 0, "{st:?}");
        assert_eq!(
            errs, st.corrupted,
            "receiver's checksum errors vs corrupted: {st:?}"
        );
    } else {
        assert!(errs > 0, "netem corrupted nothing the receiver saw");
    }
}

#[test]
fn rate_limits_tcp_throughput() {
    let mut t = veth("i6");
    let fast = tcp_transfer_secs(&t, 1_000_000, Duration::from_secs(10));
    let b = t
        .set_impairment(
            "k1",
            &Impairment {
                rate_bps: Some(4_000_000),
                ..Default::default()
            },
        )
        .unwrap();
    let shown = installed(&t, "k1");
    match b {
        Backend::Netem => assert!(shown.contains("rate 4Mbit"), "{shown}"),
        Backend::Nfqueue => assert!(
            shown.contains("tbf") && shown.contains("rate 4Mbit"),
            "{shown}"
        ),
    }
    // 1 MB at 4 Mbit/s is 2 s; allow the token bucket's burst and slack. A lower bound
    // only: the bucket makes the transfer at least this slow however idle the machine is,
    // while a loaded machine can make the unlimited transfer slow too, so no ratio.
    let slow = tcp_transfer_secs(&t, 1_000_000, Duration::from_secs(20));
    assert!(
        slow > 1.5,
        "rate-limited transfer took {slow:.2}s (unlimited {fast:.2}s)"
    );
}

#[test]
fn invalid_impairments_are_refused_before_touching_the_link() {
    let mut t = veth("i7");
    let e = t
        .set_impairment(
            "k1",
            &Impairment {
                reorder: 10.0,
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("reorder needs a delay"), "{e}");
    let e = t
        .set_impairment(
            "k3",
            &Impairment {
                loss: 1.0,
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("valid links: k1, k2"), "{e}");
    assert!(!installed(&t, "k1").contains("NFQUEUE"));
}

#[test]
fn cli_netem_outlives_the_cli_and_clears() {
    let p = prefix("i8");
    let ps = p.as_str();
    assert!(cli_run(&["up", "veth", "--prefix", ps]).status.success());
    let t = Topology::attach(Kind::Veth, &p).unwrap();
    let v = t.veth().unwrap().clone();
    let out = cli_run(&["netem", "k2", "--prefix", ps, "--loss", "100%"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(v.k1.ping(v.k2.ip, 2, GAP, WAIT).unwrap().received, 0);
    let st = String::from_utf8_lossy(&cli_run(&["status", "--prefix", ps]).stdout).into_owned();
    assert!(st.contains("impairment on k2: loss 100%"), "{st}");
    assert!(!st.contains("NOT RUNNING"), "{st}");
    // Replacing works and is effective.
    let out = cli_run(&["netem", "k2", "--prefix", ps, "--delay", "30ms"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = v.k1.ping(v.k2.ip, 2, GAP, WAIT).unwrap();
    assert_eq!(s.received, 2);
    assert!(s.rtt_min.unwrap() >= Duration::from_millis(25), "{s:?}");
    assert!(cli_run(&["netem", "k2", "--prefix", ps, "--clear"])
        .status
        .success());
    let s = v.k1.ping(v.k2.ip, 2, GAP, WAIT).unwrap();
    assert!(s.rtt_max.unwrap() < Duration::from_millis(20), "{s:?}");
    assert!(testbed::daemon::persistent_impairments(&p).is_empty());
    drop(t); // attached values tear down like any other
    assert_nothing_left(&p);
}

#[test]
fn forcing_the_netem_backend_is_honest_about_the_kernel() {
    let p = prefix("i9");
    let ps = p.as_str();
    assert!(cli_run(&["up", "veth", "--prefix", ps]).status.success());
    let out = common::cli()
        .args(["netem", "k1", "--prefix", ps, "--loss", "1%"])
        .env("LUNA_TESTBED_IMPAIR", "netem")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if impair::netem_supported(&format!("{ps}-k1")) {
        assert!(out.status.success(), "{err}");
    } else {
        assert!(!out.status.success());
        assert!(
            err.contains("no netem qdisc") && err.contains("LUNA_TESTBED_IMPAIR"),
            "{err}"
        );
    }
    let out = common::cli()
        .args(["netem", "k1", "--prefix", ps, "--loss", "1%"])
        .env("LUNA_TESTBED_IMPAIR", "bogus")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not one of netem, nfqueue, auto"));
    testbed::sweep(&p).unwrap();
    assert_nothing_left(&p);
}
