//! Linux (`net.ipv4.tcp_*`) and FreeBSD (`net.inet.tcp.*`) sysctls mapped to luna's
//! `StackConfig`/`TcpConfig`. A knob luna has no counterpart for is accepted only at the
//! value luna behaves like anyway; anything else is a skip reason (docs/packetdrill.md).

use super::KeepaliveOpts;
use luna_stack::stack::{RstLimit, StackConfig, SynCookieMode};
use luna_stack::tcp::cc::InitialWindow;
use luna_stack::tcp::config::CcAlgorithm;
use luna_stack::time::Duration;

/// Knobs whose luna equivalent combines several sysctls.
#[derive(Debug, Clone, Copy)]
pub struct SysctlState {
    /// FreeBSD's RTO floor is `rexmit_min + rexmit_slop` (30 + 200 ms by default).
    bsd_rexmit_min_ms: u64,
    bsd_rexmit_slop_ms: u64,
    /// FreeBSD `syncookies` (on by default) and `syncookies_only`.
    bsd_syncookies: bool,
    bsd_syncookies_only: bool,
}

impl Default for SysctlState {
    fn default() -> Self {
        SysctlState {
            bsd_rexmit_min_ms: 30,
            bsd_rexmit_slop_ms: 200,
            bsd_syncookies: true,
            bsd_syncookies_only: false,
        }
    }
}

/// What a sysctl assignment acts on.
pub struct Target<'a> {
    pub cfg: &'a mut StackConfig,
    pub keepalive: &'a mut KeepaliveOpts,
    pub state: &'a mut SysctlState,
}

fn num(name: &str, v: &str) -> Result<u64, String> {
    v.trim()
        .parse()
        .map_err(|_| format!("sysctl {name}={v}: not a number luna can use"))
}

fn flag(name: &str, v: &str) -> Result<bool, String> {
    match v.trim() {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(format!("sysctl {name}={v}: luna has only on/off")),
    }
}

/// `"min default max"` (tcp_rmem/tcp_wmem): the default.
fn middle(name: &str, v: &str) -> Result<u32, String> {
    let parts: Vec<&str> = v.split_whitespace().collect();
    match parts.get(1).map(|d| d.parse()) {
        Some(Ok(d)) if parts.len() == 3 => Ok(d),
        _ => Err(format!("sysctl {name}=\"{v}\": want \"min default max\"")),
    }
}

/// Accept `v` only if it is `ok` (what luna does anyway).
fn only(name: &str, v: &str, ok: &[&str], why: &str) -> Result<(), String> {
    if ok.contains(&v.trim()) {
        Ok(())
    } else {
        Err(format!("sysctl {name}={v}: {why}"))
    }
}

/// Apply one `name=value`; `Err` is the reason to skip the script.
pub fn apply(t: &mut Target<'_>, name: &str, v: &str) -> Result<(), String> {
    let tcp = &mut t.cfg.tcp;
    let ms = |x: u64| Duration::from_millis(x);
    let secs = |x: u64| Duration::from_secs(x);
    if let Some(k) = name.strip_prefix("net.ipv4.") {
        match k {
            "tcp_sack" => tcp.sack = flag(name, v)?,
            // 0: no early retransmit, no loss probes; 3 (the default) and 4: tail loss
            // probes (RFC 8985 §7; 3 adds RACK's reordering timer to them). 1 and 2 are
            // RFC 5827 early retransmit, which luna does not have.
            // Bit 0 turns RACK's loss detection on (Linux's default, 1); the other bits
            // (static reordering window, no DupThresh) change RACK in ways luna does not.
            "tcp_recovery" => match v.trim() {
                "0" => tcp.rack = false,
                "1" => tcp.rack = true,
                _ => {
                    return Err(format!(
                        "sysctl {name}={v}: luna's RACK has only on (1) and off (0)"
                    ))
                }
            },
            "tcp_early_retrans" => match v.trim() {
                "0" => tcp.tlp = None,
                "3" | "4" => tcp.tlp = tcp.tlp.or(Some(luna_stack::tcp::TcpConfig::TLP_FLOOR)),
                _ => {
                    return Err(format!(
                    "sysctl {name}={v}: early retransmit (RFC 5827) is not in luna; 0, 3 and 4 are"
                ))
                }
            },
            "tcp_timestamps" => {
                // 2 is "on without random offsets" (Linux); luna always randomises.
                tcp.timestamps = match v.trim() {
                    "0" => false,
                    "1" | "2" => true,
                    _ => return Err(format!("sysctl {name}={v}: unknown value")),
                }
            }
            "tcp_window_scaling" => tcp.window_scaling = flag(name, v)?,
            "tcp_syncookies" => {
                t.cfg.syn_cookies = match v.trim() {
                    "0" => SynCookieMode::Off,
                    "1" => SynCookieMode::WhenFull,
                    "2" => SynCookieMode::Always,
                    _ => return Err(format!("sysctl {name}={v}: want 0, 1 or 2")),
                }
            }
            // Linux's limit is per host, luna's per connection (both per second).
            "tcp_challenge_ack_limit" => tcp.challenge_ack_limit = num(name, v)? as u32,
            "tcp_rmem" => tcp.rcv_buf = middle(name, v)?,
            "tcp_wmem" => tcp.snd_buf = middle(name, v)?,
            "tcp_fin_timeout" => tcp.fin_timeout = secs(num(name, v)?),
            "tcp_keepalive_time" => t.keepalive.idle = secs(num(name, v)?),
            "tcp_keepalive_intvl" => t.keepalive.interval = secs(num(name, v)?),
            "tcp_keepalive_probes" => t.keepalive.probes = num(name, v)? as u32,
            "tcp_syn_retries" => tcp.syn_retries = num(name, v)? as u32,
            "tcp_synack_retries" => tcp.synack_retries = num(name, v)? as u32,
            "tcp_retries2" => tcp.max_retries = num(name, v)? as u32,
            "tcp_rto_min_us" => tcp.rtt.min_rto = Duration::from_micros(num(name, v)?),
            "tcp_rto_max_ms" => tcp.rtt.max_rto = ms(num(name, v)?),
            "tcp_congestion_control" => {
                tcp.cc = match v.trim() {
                    "reno" => CcAlgorithm::NewReno,
                    "cubic" => CcAlgorithm::Cubic,
                    _ => return Err(format!("sysctl {name}={v}: luna has reno and cubic")),
                }
            }
            "tcp_ecn" => only(name, v, &["0"], "luna has no ECN")?,
            "tcp_fastopen" => only(name, v, &["0"], "luna has no TCP Fast Open")?,
            "tcp_dsack" => only(name, v, &["1"], "luna always sends D-SACK")?,
            "tcp_fack" => only(name, v, &["0"], "luna has no FACK")?,
            "tcp_rfc1337" => only(name, v, &["1"], "luna ignores RST in TIME-WAIT")?,
            _ => return Err(format!("sysctl {name}: no luna counterpart")),
        }
        return Ok(());
    }
    if let Some(k) = name.strip_prefix("net.inet.tcp.") {
        match k {
            "sack.enable" => tcp.sack = flag(name, v)?,
            "rfc1323" => {
                let (ws, ts) = match v.trim() {
                    "0" => (false, false),
                    "1" => (true, true),
                    "2" => (true, false),
                    "3" => (false, true),
                    _ => return Err(format!("sysctl {name}={v}: want 0..3")),
                };
                tcp.window_scaling = ws;
                tcp.timestamps = ts;
            }
            "delayed_ack" => {
                tcp.delayed_ack = if flag(name, v)? {
                    Some(tcp.delayed_ack.unwrap_or(ms(100)))
                } else {
                    None
                }
            }
            // FreeBSD delays ACKs by default: setting the time implies they are on.
            "delacktime" => tcp.delayed_ack = Some(ms(num(name, v)?)).filter(|d| !d.is_zero()),
            "syncookies" | "syncookies_only" => {
                let on = flag(name, v)?;
                if k == "syncookies" {
                    t.state.bsd_syncookies = on;
                } else {
                    t.state.bsd_syncookies_only = on;
                }
                t.cfg.syn_cookies = match (t.state.bsd_syncookies, t.state.bsd_syncookies_only) {
                    (_, true) => SynCookieMode::Always,
                    (true, false) => SynCookieMode::WhenFull,
                    (false, false) => SynCookieMode::Off,
                };
            }
            "insecure_rst" | "insecure_syn" => {
                only(name, v, &["0"], "luna always applies RFC 5961")?
            }
            "rexmit_initial" => tcp.rtt.initial_rto = ms(num(name, v)?),
            "rexmit_min" | "rexmit_slop" => {
                if k == "rexmit_min" {
                    t.state.bsd_rexmit_min_ms = num(name, v)?;
                } else {
                    t.state.bsd_rexmit_slop_ms = num(name, v)?;
                }
                tcp.rtt.min_rto = ms(t.state.bsd_rexmit_min_ms + t.state.bsd_rexmit_slop_ms);
            }
            "rexmit_drop_options" => only(
                name,
                v,
                &["0"],
                "luna keeps the SYN's options on retransmission",
            )?,
            "recvspace" => tcp.rcv_buf = num(name, v)? as u32,
            "sendspace" => tcp.snd_buf = num(name, v)? as u32,
            "keepidle" => t.keepalive.idle = ms(num(name, v)?),
            "keepintvl" => t.keepalive.interval = ms(num(name, v)?),
            "keepcnt" => t.keepalive.probes = num(name, v)? as u32,
            "msl" => tcp.time_wait = ms(2 * num(name, v)?),
            "finwait2_timeout" => tcp.fin_timeout = ms(num(name, v)?),
            "initcwnd_segments" => {
                tcp.cc_config.initial_window = InitialWindow::Segments(num(name, v)? as u32)
            }
            "cc.algorithm" => {
                tcp.cc = match v.trim() {
                    "newreno" => CcAlgorithm::NewReno,
                    "cubic" => CcAlgorithm::Cubic,
                    _ => return Err(format!("sysctl {name}={v}: luna has newreno and cubic")),
                }
            }
            "mssdflt" => only(
                name,
                v,
                &["536"],
                "luna's default MSS is 536 (RFC 9293 §3.7.1)",
            )?,
            "hostcache.purgenow" => {} // luna keeps no host cache
            "blackhole" => only(name, v, &["0"], "luna answers closed ports with RST")?,
            // 2: accept ECN only when the peer asks. luna never negotiates it, so a script
            // whose peer asks fails visibly where luna does not echo it.
            "ecn.enable" => only(name, v, &["0", "2"], "luna has no ECN")?,
            "fastopen.client_enable" | "fastopen.server_enable" => {
                only(name, v, &["0"], "luna has no TCP Fast Open")?
            }
            "udp_tunneling_port" => only(name, v, &["0"], "luna has no UDP encapsulation")?,
            "udp_tunneling_overhead" => {} // meaningless without a tunneling port
            // 1 (FreeBSD's default): a port or protocol unreachable aborts a connection in
            // SYN-SENT, as luna does (FreeBSD also acts on admin-prohibited and time
            // exceeded, which luna treats as soft: such a script fails visibly).
            "icmp_may_rst" => only(
                name,
                v,
                &["1"],
                "luna aborts a connection attempt on ICMP port/protocol unreachable",
            )?,
            "nolocaltimewait" => only(name, v, &["0"], "luna keeps TIME-WAIT for local peers")?,
            _ => return Err(format!("sysctl {name}: no luna counterpart")),
        }
        return Ok(());
    }
    match name {
        "kern.ipc.maxsockbuf" => Ok(()), // luna has no global cap on buffer sizes
        // FreeBSD's badport_bandlim: RSTs (and ICMP errors) for segments that match no
        // socket, per second (0: no limit). luna limits only the RSTs, burst = rate.
        "net.inet.icmp.icmplim" => {
            let n = u32::try_from(num(name, v)?)
                .map_err(|_| format!("sysctl {name}={v}: out of range"))?;
            t.cfg.rst_limit = RstLimit {
                per_sec: n,
                burst: n,
            };
            Ok(())
        }
        "net.inet.icmp.icmplim_output" => Ok(()), // only logs the limiting
        _ => Err(format!("sysctl {name}: no luna counterpart")),
    }
}
