//! Parsers of the kernel's tools (`nstat`, `ss -tin`) and the counter reports.

use std::collections::BTreeMap;

use luna_stack::tcp::{ConnCounters, DropReason};

use super::Kv;

/// `nstat -a -s -z` output: counter name -> absolute value.
pub fn parse_nstat(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let name = w.next()?;
            let v = w.next()?.parse().ok()?;
            Some((name.to_string(), v))
        })
        .collect()
}

/// The kernel counters a phase reports (`k_*` keys), from the nstat names.
pub const KERNEL_COUNTERS: &[(&str, &[&str])] = &[
    ("k_retrans_segs", &["TcpRetransSegs"]),
    ("k_rtos", &["TcpExtTCPTimeouts"]),
    ("k_fast_retrans", &["TcpExtTCPFastRetrans"]),
    ("k_sack_recoveries", &["TcpExtTCPSackRecovery"]),
    ("k_loss_probes", &["TcpExtTCPLossProbes"]),
    ("k_spurious_rtos", &["TcpExtTCPSpuriousRTOs"]),
    ("k_sack_reorder", &["TcpExtTCPSACKReorder"]),
    ("k_dsack_recv", &["TcpExtTCPDSACKRecv"]),
    (
        "k_dsack_sent",
        &["TcpExtTCPDSACKOldSent", "TcpExtTCPDSACKOfoSent"],
    ),
    ("k_ofo_queued", &["TcpExtTCPOFOQueue"]),
    ("k_ofo_dropped", &["TcpExtTCPOFODrop"]),
    ("k_syn_retrans", &["TcpExtTCPSynRetrans"]),
    ("k_out_rsts", &["TcpOutRsts"]),
    ("k_estab_resets", &["TcpEstabResets"]),
    ("k_in_errs", &["TcpInErrs"]),
    ("k_tcp_csum_errors", &["TcpInCsumErrors"]),
    ("k_ip_csum_errors", &["IpExtInCsumErrors"]),
    ("k_segs_in", &["TcpInSegs"]),
    ("k_segs_out", &["TcpOutSegs"]),
];

/// Adds the kernel counters' change from `before` to `after` to `kv`.
pub fn kernel_delta(kv: &mut Kv, before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) {
    for (key, names) in KERNEL_COUNTERS {
        let d: u64 = names
            .iter()
            .map(|n| {
                let a = after.get(*n).copied().unwrap_or(0);
                a.saturating_sub(before.get(*n).copied().unwrap_or(0))
            })
            .sum();
        kv.set(key, d);
    }
}

/// Adds luna's counters' change (`l_*` keys).
pub fn luna_delta(kv: &mut Kv, before: &ConnCounters, after: &ConnCounters) {
    let d = |a: u64, b: u64| a.saturating_sub(b);
    kv.set("l_segs_in", d(after.segs_in, before.segs_in));
    kv.set("l_segs_out", d(after.segs_out, before.segs_out));
    kv.set("l_bytes_out", d(after.bytes_out, before.bytes_out));
    kv.set("l_retrans_segs", d(after.retransmits, before.retransmits));
    kv.set("l_rtos", d(after.rtos, before.rtos));
    kv.set(
        "l_fast_retrans",
        d(after.fast_retransmits, before.fast_retransmits),
    );
    kv.set(
        "l_sack_recoveries",
        d(after.sack_recoveries, before.sack_recoveries),
    );
    kv.set("l_dsacks", d(after.dsacks, before.dsacks));
    kv.set("l_loss_probes", d(after.tlp_probes, before.tlp_probes));
    kv.set(
        "l_rack_recoveries",
        d(after.rack_recoveries, before.rack_recoveries),
    );
    kv.set(
        "l_challenge_acks",
        d(after.challenge_acks, before.challenge_acks),
    );
    kv.set(
        "l_window_probes",
        d(after.window_probes, before.window_probes),
    );
    for r in DropReason::ALL {
        let n = d(after.drops(r), before.drops(r));
        kv.set(&format!("l_drop_{}", r.name()), n);
    }
}

/// What `ss -tin` says about one kernel socket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SsInfo {
    pub ts: bool,
    pub sack: bool,
    /// `wscale:<snd>,<rcv>`: the shift the kernel applies to the peer's window, and the
    /// one it applies to its own.
    pub wscale: Option<(u8, u8)>,
    /// Effective send MSS (options deducted).
    pub mss: Option<u32>,
    /// The MSS the kernel advertised.
    pub advmss: Option<u32>,
    /// The kernel's estimate of the peer's segment size.
    pub rcvmss: Option<u32>,
}

/// Parses the output of `ss -tinoH` for exactly one socket; `None` if there is none or
/// more than one (the filter must select a single connection).
pub fn parse_ss(text: &str) -> Option<SsInfo> {
    // A socket's first line starts at column 0, its details are indented.
    let sockets = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with([' ', '\t']))
        .count();
    if sockets != 1 {
        return None;
    }
    let mut s = SsInfo::default();
    let num = |v: &str| v.parse::<u32>().ok();
    for w in text.split_whitespace() {
        match w.split_once(':') {
            None if w == "ts" => s.ts = true,
            None if w == "sack" => s.sack = true,
            Some(("wscale", v)) => {
                s.wscale = v
                    .split_once(',')
                    .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
            }
            Some(("mss", v)) => s.mss = num(v),
            Some(("advmss", v)) => s.advmss = num(v),
            Some(("rcvmss", v)) => s.rcvmss = num(v),
            _ => {}
        }
    }
    Some(s)
}

/// Adds `ss_*` keys.
pub fn ss_kv(kv: &mut Kv, s: &SsInfo) {
    kv.set("ss_ts", u8::from(s.ts));
    kv.set("ss_sack", u8::from(s.sack));
    if let Some((a, b)) = s.wscale {
        kv.set("ss_snd_wscale", a);
        kv.set("ss_rcv_wscale", b);
    }
    for (k, v) in [
        ("ss_mss", s.mss),
        ("ss_advmss", s.advmss),
        ("ss_rcvmss", s.rcvmss),
    ] {
        if let Some(v) = v {
            kv.set(k, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Shape of `ip netns exec <ns> ss -tinoH state established` (iproute2 6.1; without
    // `-o` ss omits `ts` and `sack`).
    const SS: &str = "0      0      198.18.0.1:7101 198.18.0.2:61440 timer:(on,204ms,0)\n\t \
        ts sack cubic wscale:5,7 rto:204 rtt:1.82/0.41 ato:40 mss:1448 pmtu:1500 \
        rcvmss:1448 advmss:1460 cwnd:10 bytes_received:1234 segs_out:12 segs_in:90 \
        send 63.6Mbps lastsnd:4 rcv_space:14600 rcv_ssthresh:64076 minrtt:0.9\n";

    #[test]
    fn ss_details_are_parsed() {
        let s = parse_ss(SS).unwrap();
        assert!(s.ts && s.sack);
        assert_eq!(s.wscale, Some((5, 7)));
        assert_eq!(
            (s.mss, s.advmss, s.rcvmss),
            (Some(1448), Some(1460), Some(1448))
        );
        let mut kv = Kv::default();
        ss_kv(&mut kv, &s);
        assert_eq!(kv.get::<u8>("ss_snd_wscale"), 5);
        assert_eq!(kv.get::<u32>("ss_advmss"), 1460);
    }

    #[test]
    fn ss_without_options_or_with_two_sockets() {
        let plain = "0 0 198.18.0.1:7101 198.18.0.2:61440\n\t cubic rto:204 mss:536\n";
        let s = parse_ss(plain).unwrap();
        assert!(!s.ts && !s.sack && s.wscale.is_none());
        assert_eq!(s.mss, Some(536));
        assert_eq!(parse_ss(""), None);
        assert_eq!(parse_ss(&format!("{SS}{SS}")), None);
    }

    #[test]
    fn nstat_values_and_deltas() {
        let a = parse_nstat("#kernel\nTcpRetransSegs 10 0.0\nTcpExtTCPDSACKOldSent 1 0.0\n");
        let b = parse_nstat(
            "#kernel\nTcpRetransSegs 25 0.0\nTcpExtTCPDSACKOldSent 3 0.0\n\
             TcpExtTCPDSACKOfoSent 4 0.0\ngarbage\n",
        );
        assert_eq!(b.get("TcpRetransSegs"), Some(&25));
        let mut kv = Kv::default();
        kernel_delta(&mut kv, &a, &b);
        assert_eq!(kv.get::<u64>("k_retrans_segs"), 15);
        assert_eq!(kv.get::<u64>("k_dsack_sent"), 6);
        assert_eq!(kv.get::<u64>("k_rtos"), 0);
    }

    #[test]
    fn luna_delta_names_every_drop_reason() {
        let mut a = ConnCounters::default();
        let mut b = ConnCounters::default();
        a.retransmits = 3;
        b.retransmits = 10;
        b.drop(DropReason::OutOfWindow);
        let mut kv = Kv::default();
        luna_delta(&mut kv, &a, &b);
        assert_eq!(kv.get::<u64>("l_retrans_segs"), 7);
        assert_eq!(kv.get::<u64>("l_drop_out_of_window"), 1);
        assert_eq!(
            kv.0.keys().filter(|k| k.starts_with("l_drop_")).count(),
            DropReason::ALL.len()
        );
    }
}
