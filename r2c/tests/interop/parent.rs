//! The test side: topology, impairment, capture, the luna child, and every assertion.
//!
//! A run has two segments, each a fresh luna child (and so a fresh tap) running all four
//! phases under its own capture:
//! 1. `clean`: no impairment, captured whole (`-s 0`) so tshark verifies every IP and TCP
//!    checksum of both sides;
//! 2. `impaired`: the acceptance impairment both ways, captured with the plan's snaplen
//!    (whole frames in the reduced run, 128 B of headers in the full-size one; on
//!    truncated frames tshark checks only the IP checksum).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use testbed::{EngineStats, Impairment, Kind, Prefix, Tap, Topology};

use super::capture::{self, CaptureReport};
use super::luna::{DRAIN_ENV, GO_ENV, READY_ENV};
use super::proc::{Outcome, Proc};
use super::*;

/// The MSS luna advertises on a 1500-byte link, and the TCP timestamp option's size.
const LUNA_MSS: u64 = 1460;
const TS_OPTION: u64 = 12;

/// One run: its tag (a letter: the testbed prefix is `lio<tag>p<pid>`) and the two
/// segments' plans.
pub struct Run {
    pub tag: char,
    pub clean: Plan,
    pub impaired: Plan,
    /// tcpdump snaplen of the impaired segment (0: whole frames).
    pub impaired_snaplen: u32,
}

/// A segment's results.
pub struct Segment {
    pub name: &'static str,
    pub plan: Plan,
    pub snaplen: u32,
    pub phases: Vec<Kv>,
    pub ok: Kv,
    pub capture: CaptureReport,
    pub tcpdump_dropped: u64,
    pub pcap_bytes: u64,
    pub secs: f64,
    /// The kernel-side engine's final counters (impaired segment, nfqueue backend).
    pub engine: Option<EngineStats>,
    /// The kernel's counters over the whole segment (nstat in its namespace before the
    /// go and after the luna child exited): `TcpInCsumErrors`, `IpExtInCsumErrors`,
    /// `TcpInErrs`.
    pub k_tcp_csum_errors: u64,
    pub k_ip_csum_errors: u64,
    pub k_in_errs: u64,
}

/// Removes the capture directory unless the test failed (then it is kept and named).
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("LIO_KEEP_PCAP").is_some() {
            eprintln!("lio: captures kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn base36(mut n: u32) -> String {
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(digits[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ascii")
}

/// `lio<tag>p<pid>`: unique per test process, so runs by several engineers on one machine
/// never share a namespace; at most 10 characters (pids < 36^5).
fn prefix_for(tag: char, pid: u32) -> String {
    format!("lio{tag}p{}", base36(pid))
}

/// The pid in a `lio<tag>p<pid>` prefix, `None` for any other name.
fn pid_of(prefix: &str) -> Option<u32> {
    let rest = prefix.strip_prefix("lio")?;
    let mut c = rest.chars();
    let tag = c.next()?;
    if !tag.is_ascii_lowercase() || c.next()? != 'p' {
        return None;
    }
    u32::from_str_radix(c.as_str(), 36).ok()
}

/// Removes what runs killed before their cleanup left behind (their process is gone).
fn sweep_dead_runs() {
    let Ok(list) = testbed::sys::netns_list() else {
        return;
    };
    let mut dead = std::collections::BTreeSet::new();
    for ns in list {
        let Some((p, _)) = ns.split_once('-') else {
            continue;
        };
        if let Some(pid) = pid_of(p) {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                dead.insert(p.to_string());
            }
        }
    }
    for p in dead {
        if let Ok(p) = Prefix::new(&p) {
            let _ = testbed::sweep(&p);
        }
    }
}

pub fn run(r: &Run) -> Vec<Segment> {
    sweep_dead_runs();
    let name = prefix_for(r.tag, std::process::id());
    let prefix = Prefix::new(&name).expect("prefix");
    let mut topo = Topology::up(Kind::Tap, &prefix).expect("tap topology (root, make setup)");
    let tap = topo.tap().expect("tap details").clone();
    let dir = Dir(std::env::temp_dir().join(&name));
    std::fs::create_dir_all(&dir.0).expect("capture dir");
    let clean = segment(&mut topo, &tap, "clean", &r.clean, 0, &dir.0);
    check(&clean);
    let imp = r
        .impaired
        .impair
        .expect("the impaired plan has an impairment");
    // Counting corrupted frames at the receivers needs whole frames in the capture.
    assert!(
        imp.corrupt == 0.0 || r.impaired_snaplen == 0,
        "corruption needs impaired_snaplen 0"
    );
    let backend = topo
        .set_impairment(
            "tap",
            &Impairment {
                delay: imp.delay,
                jitter: imp.jitter,
                loss: imp.loss,
                reorder: imp.reorder,
                duplicate: imp.duplicate,
                corrupt: imp.corrupt,
                seed: Some(r.impaired.seed ^ 0x6b65_726e),
                ..Impairment::default()
            },
        )
        .expect("impair the kernel's egress");
    let impaired = segment(
        &mut topo,
        &tap,
        "impaired",
        &r.impaired,
        r.impaired_snaplen,
        &dir.0,
    );
    let engine = impaired.engine;
    topo.clear_impairment("tap").expect("clear impairment");
    drop(topo);
    println!("lio: kernel egress impairment backend {backend:?}, engine {engine:?}");
    check(&impaired);
    // Both directions really were impaired.
    let e = engine.expect("the nfqueue engine's counters");
    assert!(
        e.dropped > 0 && e.duplicated > 0 && e.reordered > 0,
        "kernel -> luna impairment did nothing: {e:?}"
    );
    let ok = &impaired.ok;
    for k in ["stage_dropped", "stage_duplicated", "stage_reordered"] {
        assert!(ok.get::<u64>(k) > 0, "luna -> kernel stage: {k}=0 in {ok}");
    }
    if imp.corrupt > 0.0 {
        assert!(e.corrupted > 0, "kernel -> luna: nothing corrupted: {e:?}");
        assert!(
            ok.get::<u64>("stage_corrupted") > 0,
            "luna -> kernel stage: nothing corrupted in {ok}"
        );
    }
    let sum = |k: &str| impaired.phases.iter().map(|p| p.get::<u64>(k)).sum::<u64>();
    assert!(sum("l_retrans_segs") > 0, "luna never retransmitted");
    assert!(sum("k_retrans_segs") > 0, "the kernel never retransmitted");
    // Reordering and loss make both receivers report SACK blocks (RFC 2018).
    let streams = impaired.capture.streams.values();
    let (ls, ks) = streams.fold((0, 0), |(l, k), s| (l + s.luna_sacks, k + s.kernel_sacks));
    assert!(
        ls > 0 && ks > 0,
        "SACK blocks: from luna {ls}, from the kernel {ks}"
    );
    let segs = vec![clean, impaired];
    print_summary(&segs);
    segs
}

fn luna_command(tap: &Tap, plan: &Plan, ready: &Path, go: &Path) -> std::process::Command {
    // Hugepages are shared: the pools here need far less than the testbed's default.
    let mut port = tap.dpdk.clone();
    port.eal.memory_mb = 64;
    let exe = std::env::current_exe().expect("test binary");
    let mut c = testbed::netns_command(&port.netns, exe);
    c.args(["role_child", "--exact", "--ignored", "--nocapture"])
        .env(ROLE_ENV, "luna")
        .env(ARG_ENV, plan.encode())
        .env(PORT_ENV, serde_json::to_string(&port).expect("json"))
        .env(READY_ENV, ready)
        .env(GO_ENV, go);
    c
}

fn fail(what: &str, outs: &[&Outcome]) -> ! {
    let mut msg = format!("{what}\n");
    for o in outs {
        msg += &o.dump();
    }
    panic!("{msg}");
}

/// `nstat` in the kernel's namespace: (TcpInCsumErrors, IpExtInCsumErrors, TcpInErrs).
fn kernel_errors(tap: &Tap) -> (u64, u64, u64) {
    let out = tap
        .host
        .command("nstat")
        .args(["-a", "-s", "-z"])
        .output()
        .expect("nstat (iproute2)");
    let m = super::report::parse_nstat(&String::from_utf8_lossy(&out.stdout));
    let g = |k: &str| m.get(k).copied().unwrap_or(0);
    (g("TcpInCsumErrors"), g("IpExtInCsumErrors"), g("TcpInErrs"))
}

fn segment(
    topo: &mut Topology,
    tap: &Tap,
    name: &'static str,
    plan: &Plan,
    snaplen: u32,
    dir: &Path,
) -> Segment {
    let started = Instant::now();
    let ready = topo.state_dir().join(format!("lio-{name}-ready"));
    let go = topo.state_dir().join(format!("lio-{name}-go"));
    let drain = topo.state_dir().join(format!("lio-{name}-drain"));
    let _ = std::fs::remove_file(&ready);
    let _ = std::fs::remove_file(&go);
    let _ = std::fs::remove_file(&drain);
    let mut cmd = luna_command(tap, plan, &ready, &go);
    cmd.env(DRAIN_ENV, &drain);
    let mut luna = Proc::spawn(cmd, "luna", false).unwrap_or_else(|e| panic!("{e}"));
    let end = Instant::now() + Duration::from_secs(60);
    while !ready.exists() {
        if Instant::now() > end || luna.exited() {
            let o = luna.wait(Duration::from_secs(5));
            fail("the luna child did not open its port", &[&o]);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    tap.configure_host(Duration::from_secs(30))
        .expect("tap interface from the DPDK process");
    let pcap = dir.join(format!("{name}.pcap"));
    let dump = capture::start(&tap.host, &pcap, snaplen);
    let k0 = kernel_errors(tap);
    std::fs::write(&go, b"go").expect("go file");
    let limit = plan.phase_limit * 4 + Duration::from_secs(120);
    // Once the phases are done: stop the kernel-side engine (it releases what it holds),
    // then let the child read the rest and report.
    let done = luna.wait_line("PHASES_DONE", limit).is_some();
    let engine = topo
        .stop_impairment("tap")
        .expect("stop the kernel-side impairment");
    if done {
        std::fs::write(&drain, b"drain").expect("drain file");
    }
    let out = luna.wait(Duration::from_secs(150));
    let k1 = kernel_errors(tap);
    let (td, tcpdump_dropped) = capture::stop(dump);
    let _ = std::fs::remove_file(&ready);
    let _ = std::fs::remove_file(&go);
    let _ = std::fs::remove_file(&drain);
    let Some(ok) = out.ok().then(|| out.line("OK ")).flatten().map(Kv::parse) else {
        fail(
            &format!("segment {name}: the luna child failed"),
            &[&out, &td],
        );
    };
    let phases: Vec<Kv> = out.lines("PHASE ").map(Kv::parse).collect();
    for p in &phases {
        println!("lio {name}: {p}");
    }
    println!("lio {name}: {ok}");
    let capture = capture::analyze(&pcap, tap.host.ip);
    println!("lio {name}: capture {capture:?} tcpdump_dropped={tcpdump_dropped}");
    Segment {
        name,
        plan: plan.clone(),
        snaplen,
        phases,
        ok,
        capture,
        tcpdump_dropped,
        pcap_bytes: std::fs::metadata(&pcap).map(|m| m.len()).unwrap_or(0),
        secs: started.elapsed().as_secs_f64(),
        engine,
        k_tcp_csum_errors: k1.0 - k0.0,
        k_ip_csum_errors: k1.1 - k0.1,
        k_in_errs: k1.2 - k0.2,
    }
}

/// Every per-segment assertion.
fn check(s: &Segment) {
    let name = s.name;
    let plan = &s.plan;
    assert_eq!(s.phases.len(), 4, "{name}: four phases");
    for p in &s.phases {
        let ph = p.str("name");
        let ctx = format!("{name}/{ph}: {p}");
        // Byte-exact: both ends checked every byte against the pattern; the counts close
        // the loop (nothing missing at the end).
        match ph {
            "bulk-luna-client" => {
                assert_eq!(p.get::<u64>("bytes"), plan.bulk, "{ctx}");
                assert_eq!(p.get::<u64>("kp_bytes_in"), plan.bulk, "{ctx}");
            }
            "bulk-kernel-client" => {
                assert_eq!(p.get::<u64>("bytes"), plan.bulk, "{ctx}");
                assert_eq!(p.get::<u64>("kp_bytes_out"), plan.bulk, "{ctx}");
            }
            _ => {
                assert_eq!(p.get::<u64>("rpcs"), plan.rpcs, "{ctx}");
                assert_eq!(p.get::<u64>("kp_rpcs"), plan.rpcs, "{ctx}");
            }
        }
        // Orderly close: the kernel peer read a FIN (not a reset) and luna's connection
        // ended in TIME-WAIT (it closed first) or CLOSED with reason Normal.
        assert_eq!(p.get::<u8>("kp_eof"), 1, "{ctx}");
        let luna_first = ph.contains("luna-client");
        let want = if luna_first { "time_wait" } else { "closed" };
        assert_eq!(p.str("close"), want, "{ctx}");
        // Options: luna and the kernel agree on SACK, timestamps and window scaling.
        assert_eq!(p.get::<u8>("neg_sack"), 1, "{ctx}");
        assert_eq!(p.get::<u8>("neg_ts"), 1, "{ctx}");
        assert_eq!(p.get::<u8>("ss_sack"), 1, "{ctx}");
        assert_eq!(p.get::<u8>("ss_ts"), 1, "{ctx}");
        assert_eq!(
            p.get::<u8>("ss_snd_wscale"),
            p.get::<u8>("neg_rcv_wscale"),
            "kernel scales luna's window by luna's shift: {ctx}"
        );
        assert_eq!(
            p.get::<u8>("ss_rcv_wscale"),
            p.get::<u8>("neg_snd_wscale"),
            "luna scales the kernel's window by the kernel's shift: {ctx}"
        );
        assert!(p.get::<u8>("neg_rcv_wscale") > 0, "{ctx}");
        // MSS: luna takes the kernel's 1460 (MTU - 40); the kernel sends luna's 1460
        // minus the timestamp option. (ss's advmss has the option deducted on this
        // kernel, so it is reported, not compared.)
        assert_eq!(p.get::<u64>("neg_mss"), LUNA_MSS, "{ctx}");
        assert_eq!(p.get::<u64>("ss_mss"), LUNA_MSS - TS_OPTION, "{ctx}");
        if ph == "bulk-luna-client" {
            // luna fills its segments: the kernel sees full-sized ones.
            assert_eq!(p.get::<u64>("ss_rcvmss"), LUNA_MSS - TS_OPTION, "{ctx}");
        }
        // The same options on the wire, in the SYN and SYN-ACK of this connection.
        let port: u16 = match ph {
            "bulk-luna-client" => PORT_BULK_LUNA_CLIENT,
            "bulk-kernel-client" => PORT_BULK_KERNEL_CLIENT,
            "rpc-luna-client" => PORT_RPC_LUNA_CLIENT,
            _ => PORT_RPC_KERNEL_CLIENT,
        };
        let st = s
            .capture
            .streams
            .values()
            .find(|st| st.port == port)
            .unwrap_or_else(|| panic!("{name}: no connection on port {port} captured"));
        let syn = |o: Option<capture::SynOptions>, ws: u8| {
            let o = o.unwrap_or_else(|| panic!("{name}/{ph}: no SYN captured: {st:?}"));
            assert_eq!(o.mss, Some(LUNA_MSS as u16), "{name}/{ph}: {o:?}");
            assert_eq!(o.wscale, Some(ws), "{name}/{ph}: {o:?}");
            assert!(o.sack_permitted && o.timestamps, "{name}/{ph}: {o:?}");
        };
        syn(st.luna_syn, p.get("neg_rcv_wscale"));
        syn(st.kernel_syn, p.get("neg_snd_wscale"));
        // RFC 7323 §3.2: with timestamps negotiated, every non-RST segment carries one.
        assert_eq!(st.luna_without_ts, 0, "{name}/{ph}: {st:?}");
        assert_eq!(st.kernel_without_ts, 0, "{name}/{ph}: {st:?}");
        // The kernel saw no bad checksum and no error, and none of its connections was
        // reset; on a clean link it sent no RST at all (impaired: see the capture check).
        // Checksum errors: only for the frames luna's stage corrupted, and those are
        // compared over the whole segment below (a frame sent at the end of one phase
        // can be counted in the next one's window).
        for k in ["k_estab_resets", "k_ip_csum_errors"] {
            assert_eq!(p.get::<u64>(k), 0, "{k}: {ctx}");
        }
        // TcpInErrs also counts a SYN reaching an established socket (Linux's
        // tcp_validate_incoming answers it with a challenge ACK, RFC 5961 §4.2): on the
        // impaired link a duplicated or retransmitted SYN / SYN-ACK from luna does that
        // (seen once in a 1 GiB soak run). At most one per SYN beyond one each way.
        let extra_syns = if plan.impair.is_some() {
            st.syns.saturating_sub(2)
        } else {
            0
        };
        // Linux counts a checksum error in TcpInErrs too (tcp_v4_rcv: csum_error falls
        // through to bad_packet).
        let csum = p.get::<u64>("k_tcp_csum_errors");
        assert!(
            p.get::<u64>("k_in_errs") <= extra_syns + csum,
            "k_in_errs above the {extra_syns} extra SYNs captured and {csum} checksum errors: {ctx}"
        );
        if plan.impair.is_none() {
            assert_eq!(p.get::<u64>("k_out_rsts"), 0, "{ctx}");
        }
        if plan.impair.is_none() {
            // A clean link: nothing for luna to drop, except the duplicates a kernel's
            // spurious retransmission makes (a tail loss probe or an RTO when luna was
            // slow to ACK on a loaded machine): each is below RCV.NXT, dropped as
            // `out_of_window` and D-SACKed, at most one per kernel retransmission.
            for (k, v) in p.0.iter().filter(|(k, _)| k.starts_with("l_drop_")) {
                if k == "l_drop_out_of_window" {
                    let n: u64 = p.get(k);
                    assert!(
                        n <= p.get::<u64>("k_retrans_segs"),
                        "{k} on a clean link: {ctx}"
                    );
                } else {
                    assert_eq!(v, "0", "{k} on a clean link: {ctx}");
                }
            }
        }
    }
    let ok = &s.ok;
    for k in ["leaked", "dev_copied", "dev_tx_invalid", "tx_unsent"] {
        assert_eq!(ok.get::<u64>(k), 0, "{name}: {k} in {ok}");
    }
    // Corruption, both directions, exact. luna -> kernel: every frame luna's stage
    // corrupted (after luna's checksum) is one TCP checksum error for the kernel and one
    // bad TCP checksum for tshark, and there are no others. kernel -> luna: every frame
    // the engine corrupted (a checksum that cannot verify, testbed nfq.rs) is one
    // `malformed` drop in luna, and luna drops nothing else as malformed; tshark sees the
    // same frames with bad checksums. The final counts are taken with both stages
    // drained (the engine stopped, luna's stage flushed) and the child gone.
    let luna_bad = ok.get::<u64>("stage_corrupted");
    let engine_bad = s.engine.map_or(0, |e| e.corrupted);
    let c = &s.capture;
    if luna_bad + engine_bad > 0 {
        assert_eq!(ok.get::<u8>("sw_checksums"), 1, "{name}: {ok}");
        assert_eq!(s.snaplen, 0, "{name}: corruption needs whole frames");
    }
    if let Some(e) = s.engine {
        assert_eq!(e.errors, 0, "{name}: engine errors: {e:?}");
        assert_eq!(e.partial_checksums, 0, "{name}: {e:?}");
    }
    assert_eq!(
        s.k_tcp_csum_errors, luna_bad,
        "{name}: kernel TcpInCsumErrors vs frames luna's stage corrupted"
    );
    assert_eq!(s.k_ip_csum_errors, 0, "{name}: kernel IP checksum errors");
    assert_eq!(
        c.bad_tcp_checksums_from_luna, luna_bad,
        "{name}: tshark's bad checksums from luna vs frames luna's stage corrupted: {c:?}"
    );
    assert_eq!(
        ok.get::<u64>("stack_malformed"),
        engine_bad,
        "{name}: luna's malformed drops vs frames the engine corrupted: {ok} {:?}",
        s.engine
    );
    assert_eq!(
        c.bad_tcp_checksums_from_kernel, engine_bad,
        "{name}: tshark's bad checksums from the kernel vs frames the engine corrupted: {c:?}"
    );
    if plan.impair.is_none() {
        assert_eq!(ok.get::<u64>("stack_rsts_sent"), 0, "{name}: {ok}");
        assert_eq!(ok.get::<u64>("stack_drops"), 0, "{name}: {ok}");
    }
    // The capture: no malformed frame, no bad checksum, a FIN from each side of each of
    // the four connections, and no RST before both FINs. After both FINs an RST can be
    // the right answer to a stray segment: under reordering a delayed ACK reaches a
    // TIME-WAIT end, which re-ACKs (RFC 9293 §3.10.7.4), and that ACK finds the other
    // end already CLOSED, which answers any segment with RST (§3.10.7.1), as Linux does.
    // Such late RSTs are allowed on the impaired link only, and counted.
    assert_eq!(s.tcpdump_dropped, 0, "{name}: tcpdump dropped packets");
    assert!(c.tcp_packets > 0, "{name}: empty capture");
    assert_eq!(c.malformed, 0, "{name}: {c:?}");
    assert_eq!(c.bad_ip_checksums, 0, "{name}: {c:?}");
    assert_eq!(c.checksum_or_malformed_errors(), 0, "{name}: {c:?}");
    if s.snaplen == 0 {
        assert_eq!(
            c.good_tcp_checksums + c.ffff_tcp_checksums_from_kernel,
            c.tcp_packets,
            "{name}: every TCP checksum verified: {c:?}"
        );
    }
    assert_eq!(c.streams.len(), 4, "{name}: four connections: {c:?}");
    assert_eq!(c.ffff_tcp_checksums_from_luna, 0, "{name}: {c:?}");
    for (i, st) in &c.streams {
        assert_eq!(st.rsts_before_close, 0, "{name}: stream {i} reset: {st:?}");
        if plan.impair.is_none() {
            assert_eq!(st.rsts_after_close, 0, "{name}: RST in stream {i}: {st:?}");
        }
        assert!(st.syns >= 2, "{name}: stream {i}: {st:?}");
        assert!(
            st.fins_from_kernel >= 1 && st.fins_from_luna >= 1,
            "{name}: a FIN from each side in stream {i}: {st:?}"
        );
    }
}

fn print_summary(segs: &[Segment]) {
    println!("\nlio summary");
    for s in segs {
        let imp = s.plan.impair.map_or("none".to_string(), |i| {
            format!(
                "loss {}% reorder {}% duplicate {}% corrupt {}% delay {:?} ± {:?} (both ways)",
                i.loss, i.reorder, i.duplicate, i.corrupt, i.delay, i.jitter
            )
        });
        println!(
            "segment {}: {:.1} s, impairment {imp}, capture {} packets / {} bytes (snaplen {})",
            s.name, s.secs, s.capture.packets, s.pcap_bytes, s.snaplen
        );
        println!(
            "| phase | size | secs | goodput Mbit/s | luna retrans/RTO/fast/SACK-rec/TLP | kernel retrans/RTO/fast/SACK-rec/TLP |"
        );
        println!("|---|---|---|---|---|---|");
        for p in &s.phases {
            let size = if p.has("rpcs") && p.str("name").starts_with("rpc") {
                format!("{} RPCs", p.str("rpcs"))
            } else {
                format!("{} B", p.str("bytes"))
            };
            println!(
                "| {} | {size} | {} | {} | {}/{}/{}/{}/{} | {}/{}/{}/{}/{} |",
                p.str("name"),
                p.str("secs"),
                p.str("goodput_mbit"),
                p.str("l_retrans_segs"),
                p.str("l_rtos"),
                p.str("l_fast_retrans"),
                p.str("l_sack_recoveries"),
                p.str("l_loss_probes"),
                p.str("k_retrans_segs"),
                p.str("k_rtos"),
                p.str("k_fast_retrans"),
                p.str("k_sack_recoveries"),
                p.str("k_loss_probes"),
            );
        }
        let sacks = s.capture.streams.values();
        let (ls, ks) = sacks.fold((0, 0), |(l, k), x| (l + x.luna_sacks, k + x.kernel_sacks));
        println!("segments with SACK blocks: from luna {ls}, from the kernel {ks}");
        let late: u64 = s.capture.streams.values().map(|x| x.rsts_after_close).sum();
        println!(
            "tshark: {} malformed, {} bad IP / {} bad TCP checksums ({} from luna, {} from the kernel), {} TCP checksums sent as 0xFFFF by the kernel; RSTs after both FINs: {late}",
            s.capture.malformed,
            s.capture.bad_ip_checksums,
            s.capture.bad_tcp_checksums,
            s.capture.bad_tcp_checksums_from_luna,
            s.capture.bad_tcp_checksums_from_kernel,
            s.capture.ffff_tcp_checksums_from_kernel,
        );
        println!(
            "corruption: luna's stage {} frames = kernel TcpInCsumErrors {} (TcpInErrs {}) = tshark bad from luna {}; engine {} frames = luna malformed drops {} = tshark bad from the kernel {}",
            s.ok.str("stage_corrupted"),
            s.k_tcp_csum_errors,
            s.k_in_errs,
            s.capture.bad_tcp_checksums_from_luna,
            s.engine.map_or(0, |e| e.corrupted),
            s.ok.str("stack_malformed"),
            s.capture.bad_tcp_checksums_from_kernel,
        );
        if let Some(p) = s.phases.first() {
            println!(
                "negotiated: luna mss {} sack {} ts {} wscale snd {} rcv {}; kernel ss: mss {} advmss {} rcvmss {} wscale {},{}",
                p.str("neg_mss"),
                p.str("neg_sack"),
                p.str("neg_ts"),
                p.str("neg_snd_wscale"),
                p.str("neg_rcv_wscale"),
                p.str("ss_mss"),
                p.str("ss_advmss"),
                p.str("ss_rcvmss"),
                p.str("ss_snd_wscale"),
                p.str("ss_rcv_wscale"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_prefixes_are_valid_unique_and_recognised() {
        for pid in [1, 4242, 4_194_304, 36u32.pow(5) - 1] {
            let p = prefix_for('r', pid);
            assert!(Prefix::new(&p).is_ok(), "{p}");
            assert_eq!(pid_of(&p), Some(pid));
        }
        assert_ne!(prefix_for('r', 7), prefix_for('f', 7));
        // Other people's names are never taken for ours.
        for other in [
            "luna", "liored", "lio", "lior", "liorx12", "ldvtap", "ltabp12", "lioRp1",
        ] {
            assert_eq!(pid_of(other), None, "{other}");
        }
    }
}
