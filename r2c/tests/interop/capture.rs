//! tcpdump on the kernel side of the tap, and tshark over what it wrote.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use testbed::KernelHost;

use super::proc::{Outcome, Proc};

/// tshark expert severity "error" (epan/proto.h PI_ERROR).
const PI_ERROR: u64 = 0x0080_0000;
/// tshark expert groups (epan/proto.h).
const PI_CHECKSUM: u64 = 0x0100_0000;
const PI_MALFORMED: u64 = 0x0700_0000;

/// Starts tcpdump on `host`'s interface, writing `file` with `snaplen` (0: whole frames),
/// and waits until it captures.
pub fn start(host: &KernelHost, file: &Path, snaplen: u32) -> Proc {
    let mut c = host.command("tcpdump");
    c.args(["-i", &host.iface, "-n", "-U", "-Z", "root", "-B", "65536"])
        .args(["-s", &snaplen.to_string(), "-w"])
        .arg(file);
    let p = Proc::spawn(c, "tcpdump", true).unwrap_or_else(|e| panic!("{e}"));
    if p.wait_line("listening on", Duration::from_secs(20))
        .is_none()
    {
        panic!(
            "tcpdump did not start\n{}",
            p.wait(Duration::from_secs(2)).dump()
        );
    }
    p
}

/// Stops tcpdump; returns the packets its kernel buffer dropped.
pub fn stop(p: Proc) -> (Outcome, u64) {
    let o = p.terminate(Duration::from_secs(10));
    let dropped = o
        .err
        .lines()
        .find(|l| l.contains("dropped by kernel"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(u64::MAX);
    (o, dropped)
}

/// The options of a SYN or SYN-ACK as they were on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SynOptions {
    pub mss: Option<u16>,
    pub wscale: Option<u8>,
    pub sack_permitted: bool,
    pub timestamps: bool,
}

/// One TCP connection in the capture.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamInfo {
    /// The server port (the lower of the two).
    pub port: u16,
    pub syns: u64,
    pub fins_from_kernel: u64,
    pub fins_from_luna: u64,
    /// RSTs before both FINs were seen: a connection was reset.
    pub rsts_before_close: u64,
    /// RSTs after both FINs (see [`CaptureReport`]).
    pub rsts_after_close: u64,
    pub packets: u64,
    /// The first SYN (or SYN-ACK) of each side.
    pub luna_syn: Option<SynOptions>,
    pub kernel_syn: Option<SynOptions>,
    /// Non-SYN, non-RST segments without a timestamp option (RFC 7323 §3.2: once
    /// negotiated, every other segment carries one).
    pub luna_without_ts: u64,
    pub kernel_without_ts: u64,
    /// Segments carrying SACK blocks.
    pub luna_sacks: u64,
    pub kernel_sacks: u64,
}

/// What tshark found in a capture.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaptureReport {
    pub packets: u64,
    pub tcp_packets: u64,
    pub malformed: u64,
    pub bad_ip_checksums: u64,
    /// Wrong TCP checksums (the 0xFFFF form of zero excepted, below), and by sender.
    /// Such frames (corrupted on purpose by the impairment) count nowhere else: not in
    /// `tcp_packets`, the streams, `malformed` or `expert_errors` (a flipped bit can also
    /// break an option or a flag, which tshark reports).
    pub bad_tcp_checksums: u64,
    pub bad_tcp_checksums_from_kernel: u64,
    pub bad_tcp_checksums_from_luna: u64,
    /// TCP checksums sent as 0xFFFF where the sum is zero: the other representation of
    /// zero in ones' complement, equally valid for a receiver (RFC 1624 §3; Linux writes
    /// it when `skb_checksum_help` folds to 0, as for packets it hands to NFQUEUE).
    /// tshark marks them "bad" with a checksum *warning*; counted here by sender.
    pub ffff_tcp_checksums_from_kernel: u64,
    pub ffff_tcp_checksums_from_luna: u64,
    pub good_tcp_checksums: u64,
    pub unverified_tcp_checksums: u64,
    /// Error-severity expert items by group (hex), all groups.
    pub expert_errors: BTreeMap<String, u64>,
    pub streams: BTreeMap<u32, StreamInfo>,
}

impl CaptureReport {
    /// Expert errors of the checksum and malformed groups.
    pub fn checksum_or_malformed_errors(&self) -> u64 {
        [PI_CHECKSUM, PI_MALFORMED]
            .iter()
            .map(|g| {
                self.expert_errors
                    .get(&format!("{g:#x}"))
                    .copied()
                    .unwrap_or(0)
            })
            .sum()
    }
}

/// The tshark command (checksum validation on; sequence analysis and reassembly off:
/// neither is needed for malformed/checksum checks and both cost memory per packet).
pub fn tshark_command(file: &Path) -> Command {
    let mut c = Command::new("tshark");
    c.arg("-r").arg(file).args([
        "-n",
        "-o",
        "tcp.check_checksum:TRUE",
        "-o",
        "ip.check_checksum:TRUE",
        "-o",
        "tcp.analyze_sequence_numbers:FALSE",
        "-o",
        "tcp.desegment_tcp_streams:FALSE",
        "-T",
        "fields",
        "-E",
        "separator=/t",
        "-e",
        "frame.number",
        "-e",
        "ip.src",
        "-e",
        "tcp.stream",
        "-e",
        "tcp.srcport",
        "-e",
        "tcp.dstport",
        "-e",
        "tcp.flags.syn",
        "-e",
        "tcp.flags.fin",
        "-e",
        "tcp.flags.reset",
        "-e",
        "ip.checksum.status",
        "-e",
        "tcp.checksum.status",
        "-e",
        "_ws.expert.severity",
        "-e",
        "_ws.expert.group",
        "-e",
        "_ws.malformed",
        "-e",
        "tcp.options.mss_val",
        "-e",
        "tcp.options.wscale.shift",
        "-e",
        "tcp.options.sack_perm",
        "-e",
        "tcp.options.timestamp.tsval",
        "-e",
        "tcp.options.sack_le",
        "-e",
        "tcp.checksum",
    ]);
    // Our payload is a pattern, not a protocol: heuristic dissectors (Thrift, ...) that
    // claim some segments would report their own "errors" on it. Turn their protocols
    // off (`--disable-heuristic` wants per-dissector names that do not follow one rule).
    for h in tcp_heuristics() {
        c.arg("--disable-protocol").arg(h);
    }
    c
}

/// The protocols whose heuristic dissectors tshark tries on TCP payload
/// (`tshark -G heuristic-decodes`: table, protocol, enabled).
fn tcp_heuristics() -> Vec<String> {
    let out = Command::new("tshark")
        .args(["-G", "heuristic-decodes"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f.len() >= 3 && f[0] == "tcp" && f[2] == "T").then(|| f[1].to_string())
        })
        .collect()
}

/// Runs tshark over `file`.
pub fn analyze(file: &Path, kernel: Ipv4Addr) -> CaptureReport {
    let out = tshark_command(file)
        .output()
        .unwrap_or_else(|e| panic!("tshark: {e} (make setup installs it)"));
    assert!(
        out.status.success(),
        "tshark failed on {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    parse_fields(&String::from_utf8_lossy(&out.stdout), kernel)
}

/// Parses [`tshark_command`]'s output.
pub fn parse_fields(text: &str, kernel: Ipv4Addr) -> CaptureReport {
    let mut r = CaptureReport::default();
    let kernel = kernel.to_string();
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() < 19 {
            continue;
        }
        r.packets += 1;
        let flag = |i: usize| matches!(f[i], "1" | "True");
        // ip/tcp checksum status: 0 bad, 1 good, 2 unverified.
        if f[8] == "0" {
            r.bad_ip_checksums += 1;
        }
        match f[9] {
            "0" if f[18] == "0xffff" && f[1] == kernel => r.ffff_tcp_checksums_from_kernel += 1,
            "0" if f[18] == "0xffff" => r.ffff_tcp_checksums_from_luna += 1,
            "0" => {
                r.bad_tcp_checksums += 1;
                if f[1] == kernel {
                    r.bad_tcp_checksums_from_kernel += 1;
                } else {
                    r.bad_tcp_checksums_from_luna += 1;
                }
                continue;
            }
            "1" => r.good_tcp_checksums += 1,
            "2" => r.unverified_tcp_checksums += 1,
            _ => {}
        }
        if !f[12].is_empty() {
            r.malformed += 1;
        }
        let sev = f[10].split(',');
        let grp = f[11].split(',');
        for (s, g) in sev.zip(grp) {
            if s.parse::<u64>().ok() == Some(PI_ERROR) {
                let g = g.parse::<u64>().unwrap_or(0);
                *r.expert_errors.entry(format!("{g:#x}")).or_default() += 1;
            }
        }
        let Ok(stream) = f[2].parse::<u32>() else {
            continue;
        };
        r.tcp_packets += 1;
        let (sp, dp) = (f[3].parse().unwrap_or(0), f[4].parse().unwrap_or(0));
        let s = r.streams.entry(stream).or_default();
        s.port = u16::min(sp, dp);
        s.packets += 1;
        let from_kernel = f[1] == kernel;
        s.syns += u64::from(flag(5));
        if flag(5) {
            let o = SynOptions {
                mss: f[13].parse().ok(),
                wscale: f[14].parse().ok(),
                sack_permitted: !f[15].is_empty(),
                timestamps: !f[16].is_empty(),
            };
            let side = if from_kernel {
                &mut s.kernel_syn
            } else {
                &mut s.luna_syn
            };
            side.get_or_insert(o);
        } else if !flag(7) && f[16].is_empty() {
            *if from_kernel {
                &mut s.kernel_without_ts
            } else {
                &mut s.luna_without_ts
            } += 1;
        }
        if !f[17].is_empty() {
            *if from_kernel {
                &mut s.kernel_sacks
            } else {
                &mut s.luna_sacks
            } += 1;
        }
        if flag(6) {
            if from_kernel {
                s.fins_from_kernel += 1;
            } else {
                s.fins_from_luna += 1;
            }
        }
        if flag(7) {
            if s.fins_from_kernel > 0 && s.fins_from_luna > 0 {
                s.rsts_after_close += 1;
            } else {
                s.rsts_before_close += 1;
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    // Shape of `tshark -T fields` output (tshark 4.0) for the fields above: a handshake,
    // a FIN from each side, a 0xFFFF checksum (a warning), an RST after the close, an RST
    // that resets stream 1, a malformed frame, and two frames with bad TCP checksums (a
    // kernel RST, also flagged malformed, and a luna FIN) that count nowhere else.
    const OUT: &str = "\
1\t198.18.0.2\t0\t61440\t7101\t1\t0\t0\t1\t1\t\t\t\t1460\t5\t0402\t77\t\t0x1234
2\t198.18.0.1\t0\t7101\t61440\t1\t0\t0\t1\t1\t2097152\t33554432\t\t1460\t10\t\t\t\t0x5678
3\t198.18.0.2\t0\t61440\t7101\t0\t1\t0\t1\t1\t\t\t\t\t\t\t78\t1000,3000\t0x0001
4\t198.18.0.1\t0\t7101\t61440\t0\t1\t0\t1\t2\t\t\t\t\t\t\t\t\t0x0002
5\t198.18.0.1\t0\t7101\t61440\t0\t0\t0\t1\t0\t16777216\t6291456\t\t\t\t\t79\t\t0xffff
6\t198.18.0.2\t0\t61440\t7101\t0\t0\t1\t1\t1\t\t\t\t\t\t\t\t\t0x0003
7\t198.18.0.1\t1\t7102\t50000\t0\t0\t1\t0\t1\t\t\t\t\t\t\t\t\t0x0004
8\t198.18.0.2\t\t\t\t\t\t\t1\t\t8388608\t117440512\t1\t\t\t\t\t\t
9\t198.18.0.1\t0\t7101\t61440\t0\t0\t1\t1\t0\t2097152,8388608\t33554432,16777216\t1\t\t\t\t\t\t0x0bad
10\t198.18.0.2\t0\t61440\t7101\t0\t1\t0\t1\t0\t\t\t\t\t\t\t\t\t0x0bad
";

    #[test]
    fn tshark_fields_are_counted() {
        let r = parse_fields(OUT, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(r.packets, 10);
        assert_eq!(r.tcp_packets, 7);
        assert_eq!(r.bad_tcp_checksums, 2);
        assert_eq!(r.bad_tcp_checksums_from_kernel, 1);
        assert_eq!(r.bad_tcp_checksums_from_luna, 1);
        assert_eq!(r.ffff_tcp_checksums_from_kernel, 1);
        assert_eq!(r.ffff_tcp_checksums_from_luna, 0);
        assert_eq!(r.good_tcp_checksums, 5);
        assert_eq!(r.unverified_tcp_checksums, 1);
        assert_eq!(r.bad_ip_checksums, 1);
        assert_eq!(r.malformed, 1);
        assert_eq!(r.expert_errors.get("0x1000000"), None);
        assert_eq!(r.expert_errors.get("0x7000000"), Some(&1));
        assert_eq!(r.checksum_or_malformed_errors(), 1);
        let s0 = &r.streams[&0];
        assert_eq!(
            (s0.port, s0.syns, s0.fins_from_luna, s0.fins_from_kernel),
            (7101, 2, 1, 1)
        );
        // The RST after both FINs is a late one; the one in stream 1 resets it.
        assert_eq!((s0.rsts_before_close, s0.rsts_after_close), (0, 1));
        let luna = SynOptions {
            mss: Some(1460),
            wscale: Some(5),
            sack_permitted: true,
            timestamps: true,
        };
        assert_eq!(s0.luna_syn, Some(luna));
        let kernel = SynOptions {
            wscale: Some(10),
            sack_permitted: false,
            timestamps: false,
            ..luna
        };
        assert_eq!(s0.kernel_syn, Some(kernel));
        assert_eq!((s0.luna_without_ts, s0.kernel_without_ts), (0, 1));
        assert_eq!(s0.packets, 6);
        assert_eq!((s0.luna_sacks, s0.kernel_sacks), (1, 0));
        // An RST without a timestamp is not counted as a missing one.
        assert_eq!(r.streams[&1].rsts_before_close, 1);
        assert_eq!(r.streams[&1].kernel_without_ts, 0);
    }

    #[test]
    fn lines_that_are_not_tshark_fields_are_skipped() {
        let r = parse_fields("garbage\n\n1\t2\t3\n", Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(r, CaptureReport::default());
    }
}
