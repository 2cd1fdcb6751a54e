//! Link impairments (netem semantics): loss, duplicate, corrupt, delay with jitter, reorder,
//! rate. Applied to the egress of a kernel-side interface, by one of two backends:
//!
//! * [`Backend::Netem`]: `tc qdisc replace dev <if> root netem ...` where the kernel has
//!   sch_netem.
//! * [`Backend::Nfqueue`]: for kernels without sch_netem (this project's machines): an
//!   iptables `NFQUEUE` rule in the namespace's mangle/POSTROUTING hands each IPv4 packet
//!   leaving the interface to the user-space engine in [`crate::nfq`], which drops,
//!   duplicates, corrupts, delays and reorders it with netem's semantics; `rate` is a
//!   `tbf` qdisc. Non-IPv4 frames (ARP) pass unimpaired on this backend.
//!
//! [`Backend::select`] probes once; `LUNA_TESTBED_IMPAIR=netem|nfqueue` forces one.

use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::sys;

/// Environment variable forcing the backend: `netem`, `nfqueue` or `auto` (default).
pub const BACKEND_ENV: &str = "LUNA_TESTBED_IMPAIR";

/// What to do to packets leaving one interface. Percentages are 0–100.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Impairment {
    /// Fixed one-way delay added to every packet (except reordered ones).
    pub delay: Duration,
    /// Uniform jitter: the delay is drawn from `delay ± jitter` (may reorder, as in netem).
    pub jitter: Duration,
    /// Percent of packets dropped.
    pub loss: f64,
    /// Percent of packets sent at once, jumping ahead of delayed ones (needs `delay`).
    pub reorder: f64,
    /// Percent of packets sent twice.
    pub duplicate: f64,
    /// Percent of packets with one random bit flipped.
    pub corrupt: f64,
    /// Egress rate limit in bits per second.
    pub rate_bps: Option<u64>,
    /// Seed for the nfqueue engine's random choices (`None`: seeded from the clock).
    pub seed: Option<u64>,
}

impl Impairment {
    /// Checks ranges and netem's rule that reorder needs a delay.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("loss", self.loss),
            ("reorder", self.reorder),
            ("duplicate", self.duplicate),
            ("corrupt", self.corrupt),
        ] {
            if !(0.0..=100.0).contains(&v) || v.is_nan() {
                return Err(Error::BadImpairment(format!(
                    "{name} {v}% is outside 0–100%"
                )));
            }
        }
        if self.reorder > 0.0 && self.delay.is_zero() {
            return Err(Error::BadImpairment(
                "reorder needs a delay (reordered packets are the ones sent without it); add e.g. --delay 10ms".into(),
            ));
        }
        if self.jitter > self.delay {
            return Err(Error::BadImpairment(format!(
                "jitter {:?} exceeds delay {:?}",
                self.jitter, self.delay
            )));
        }
        if self.rate_bps == Some(0) {
            return Err(Error::BadImpairment("rate 0 would stop the link".into()));
        }
        Ok(())
    }

    /// True when nothing would be changed.
    pub fn is_empty(&self) -> bool {
        self.delay.is_zero()
            && self.jitter.is_zero()
            && self.loss == 0.0
            && self.reorder == 0.0
            && self.duplicate == 0.0
            && self.corrupt == 0.0
            && self.rate_bps.is_none()
    }

    /// Whether per-packet work (anything but `rate`) is asked for.
    pub(crate) fn needs_engine(&self) -> bool {
        !(self.delay.is_zero() && self.loss == 0.0 && self.duplicate == 0.0 && self.corrupt == 0.0)
    }

    /// The arguments after `tc qdisc replace dev X root netem`.
    pub fn netem_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if !self.delay.is_zero() {
            a.push("delay".into());
            a.push(format!("{}us", self.delay.as_micros()));
            if !self.jitter.is_zero() {
                a.push(format!("{}us", self.jitter.as_micros()));
            }
        }
        let pct = |a: &mut Vec<String>, name: &str, v: f64| {
            if v > 0.0 {
                a.push(name.into());
                a.push(format!("{v}%"));
            }
        };
        pct(&mut a, "loss", self.loss);
        pct(&mut a, "duplicate", self.duplicate);
        pct(&mut a, "corrupt", self.corrupt);
        pct(&mut a, "reorder", self.reorder); // netem: the % sent at once
        if let Some(r) = self.rate_bps {
            a.push("rate".into());
            a.push(format!("{r}bit"));
        }
        a
    }
}

impl fmt::Display for Impairment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&self.netem_args().join(" "))
    }
}

/// Parses `2%`, `2` or `0.5%` as a percentage in 0–100.
pub fn parse_percent(s: &str) -> Result<f64> {
    let err = |why| Error::Parse {
        what: "percentage",
        given: s.to_string(),
        why,
    };
    let v: f64 = s
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| err("expected a number with optional %, e.g. 2% or 0.5"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(err("must be between 0 and 100"));
    }
    Ok(v)
}

/// Parses `10ms`, `250us`, `1.5ms`, `1s` or `0`.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let err = |why| Error::Parse {
        what: "duration",
        given: s.to_string(),
        why,
    };
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| err("missing unit: use us, ms or s, e.g. 10ms"))?;
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| err("expected a number before the unit, e.g. 10ms"))?;
    let secs = match unit {
        "us" | "usec" => v / 1e6,
        "ms" | "msec" => v / 1e3,
        "s" | "sec" => v,
        _ => return Err(err("unknown unit: use us, ms or s")),
    };
    if !(0.0..=3600.0).contains(&secs) {
        return Err(err("must be between 0 and 1 hour"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a rate in tc's units: `100mbit`, `1gbit`, `500kbit`, `64000bit`, `10mbps`
/// (bytes), into bits per second.
pub fn parse_rate(s: &str) -> Result<u64> {
    let err = |why| Error::Parse {
        what: "rate",
        given: s.to_string(),
        why,
    };
    let t = s.trim().to_ascii_lowercase();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| {
            err("missing unit: use bit, kbit, mbit, gbit (or bps, kbps, mbps, gbps for bytes)")
        })?;
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| err("expected a number before the unit, e.g. 100mbit"))?;
    let mult = match unit {
        "bit" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        "bps" => 8.0,
        "kbps" => 8e3,
        "mbps" => 8e6,
        "gbps" => 8e9,
        _ => {
            return Err(err(
                "unknown unit: use bit, kbit, mbit, gbit, bps, kbps, mbps or gbps",
            ))
        }
    };
    let bps = v * mult;
    if !(1.0..=1e12).contains(&bps) {
        return Err(err("must be between 1 bit/s and 1 Tbit/s"));
    }
    Ok(bps as u64)
}

/// How an impairment is put on a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Backend {
    /// The kernel's netem qdisc.
    Netem,
    /// iptables NFQUEUE + the user-space engine, tbf for rate.
    Nfqueue,
}

impl Backend {
    /// The backend named by `$LUNA_TESTBED_IMPAIR`, else netem if the kernel has it (probed
    /// once in `probe_netns`), else nfqueue.
    pub fn select(probe_netns: &str) -> Result<Backend> {
        match std::env::var(BACKEND_ENV).as_deref() {
            Ok("netem") => {
                if netem_supported(probe_netns) {
                    Ok(Backend::Netem)
                } else {
                    Err(Error::NetemUnsupported)
                }
            }
            Ok("nfqueue") => Ok(Backend::Nfqueue),
            Ok("") | Ok("auto") | Err(_) => Ok(if netem_supported(probe_netns) {
                Backend::Netem
            } else {
                Backend::Nfqueue
            }),
            Ok(other) => Err(Error::BadImpairment(format!(
                "{BACKEND_ENV}={other} is not one of netem, nfqueue, auto"
            ))),
        }
    }
}

/// Whether the kernel has sch_netem: tries a netem qdisc on `netns`'s loopback (cached).
pub fn netem_supported(netns: &str) -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        let ok = sys::exec_in(netns, "tc", &["qdisc", "add", "dev", "lo", "root", "netem"]).is_ok();
        if ok {
            let _ = sys::exec_in(netns, "tc", &["qdisc", "del", "dev", "lo", "root"]);
        }
        ok
    })
}

/// Mark carried by packets the engine injects (duplicates), so the NFQUEUE rule skips them.
pub(crate) const ENGINE_MARK: u32 = 0x4c55_4e41;
/// NFQUEUE number used in every namespace (queues are per network namespace).
pub(crate) const QUEUE_NUM: u16 = 100;

fn iptables() -> Result<&'static str> {
    // x_tables is in every kernel we target; the nft-based iptables needs nft_compat.
    if sys::find_tool("iptables-legacy", "iptables").is_ok() {
        Ok("iptables-legacy")
    } else {
        sys::find_tool("iptables", "iptables").map(|_| "iptables")
    }
}

fn nfqueue_rule(iface: &str) -> Vec<String> {
    let mark = format!("0x{ENGINE_MARK:x}");
    let q = QUEUE_NUM.to_string();
    [
        "POSTROUTING",
        "-o",
        iface,
        "-m",
        "mark",
        "!",
        "--mark",
        &mark,
        "-j",
        "NFQUEUE",
        "--queue-num",
        &q,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Installs the NFQUEUE rule for `iface` in `netns` (idempotent).
pub(crate) fn install_nfqueue_rule(netns: &str, iface: &str) -> Result<()> {
    let ipt = iptables()?;
    let rule = nfqueue_rule(iface);
    let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
    let check = [&["-w", "-t", "mangle", "-C"][..], &rule].concat();
    if sys::exec_in(netns, ipt, &check).is_ok() {
        return Ok(());
    }
    let add = [&["-w", "-t", "mangle", "-A"][..], &rule].concat();
    sys::exec_in(netns, ipt, &add).map(|_| ())
}

/// Removes the NFQUEUE rule for `iface` in `netns` if present.
pub(crate) fn remove_nfqueue_rule(netns: &str, iface: &str) -> Result<()> {
    if !sys::netns_exists(netns) {
        return Ok(());
    }
    let ipt = iptables()?;
    let rule = nfqueue_rule(iface);
    let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
    let del = [&["-w", "-t", "mangle", "-D"][..], &rule].concat();
    while sys::exec_in(netns, ipt, &del).is_ok() {}
    Ok(())
}

/// The tbf qdisc arguments for `rate` (burst: 10 ms of traffic, at least 32 KiB).
fn tbf_args(rate_bps: u64) -> Vec<String> {
    let burst = (rate_bps / 8 / 100).max(32 * 1024);
    vec![
        "tbf".into(),
        "rate".into(),
        format!("{rate_bps}bit"),
        "burst".into(),
        burst.to_string(),
        "latency".into(),
        "100ms".into(),
    ]
}

/// Puts the root qdisc for `imp` on `iface`: netem (netem backend) or tbf/none (nfqueue).
pub(crate) fn set_qdisc(
    netns: &str,
    iface: &str,
    backend: Backend,
    imp: &Impairment,
) -> Result<()> {
    let args: Vec<String> = match backend {
        Backend::Netem => [vec!["netem".to_string()], imp.netem_args()].concat(),
        Backend::Nfqueue => match imp.rate_bps {
            Some(r) => tbf_args(r),
            None => return clear_qdisc(netns, iface),
        },
    };
    let mut full = vec!["qdisc", "replace", "dev", iface, "root"];
    full.extend(args.iter().map(String::as_str));
    sys::exec_in(netns, "tc", &full).map(|_| ())
}

/// Restores the default root qdisc on `iface` (no error if none was set).
pub(crate) fn clear_qdisc(netns: &str, iface: &str) -> Result<()> {
    if !sys::netns_exists(netns) || !sys::link_exists(Some(netns), iface) {
        return Ok(());
    }
    match sys::exec_in(netns, "tc", &["qdisc", "del", "dev", iface, "root"]) {
        Ok(_) => Ok(()),
        // Deleting the default qdisc fails; that is the state we want.
        Err(Error::Command { stderr, .. })
            if stderr.contains("handle of zero") || stderr.contains("No such file") =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// `tc qdisc show dev <iface>` in `netns`.
pub fn qdisc_show(netns: &str, iface: &str) -> Result<String> {
    sys::exec_in(netns, "tc", &["qdisc", "show", "dev", iface])
}

/// The NFQUEUE rules in `netns` (`iptables -t mangle -S POSTROUTING`), empty if none.
pub fn nfqueue_rules(netns: &str) -> Result<String> {
    let ipt = iptables()?;
    let out = sys::exec_in(netns, ipt, &["-w", "-t", "mangle", "-S", "POSTROUTING"])?;
    Ok(out
        .lines()
        .filter(|l| l.contains("NFQUEUE"))
        .collect::<Vec<_>>()
        .join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_percentages() {
        assert_eq!(parse_percent("2%").unwrap(), 2.0);
        assert_eq!(parse_percent("0.5").unwrap(), 0.5);
        assert!(parse_percent("101%").is_err());
        assert!(parse_percent("-1").is_err());
        assert!(parse_percent("lots")
            .unwrap_err()
            .to_string()
            .contains("percentage"));
    }

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("10ms").unwrap(), Duration::from_millis(10));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(
            parse_duration("1.5ms").unwrap(),
            Duration::from_micros(1500)
        );
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("10")
            .unwrap_err()
            .to_string()
            .contains("unit"));
        assert!(parse_duration("10min").is_err());
        assert!(parse_duration("ms").is_err());
    }

    #[test]
    fn parses_rates() {
        assert_eq!(parse_rate("100mbit").unwrap(), 100_000_000);
        assert_eq!(parse_rate("1Gbit").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate("10mbps").unwrap(), 80_000_000);
        assert!(parse_rate("100").is_err());
        assert!(parse_rate("0mbit").is_err());
        assert!(parse_rate("5furlongs").is_err());
    }

    #[test]
    fn reorder_without_delay_is_refused() {
        let imp = Impairment {
            reorder: 25.0,
            ..Default::default()
        };
        let e = imp.validate().unwrap_err().to_string();
        assert!(e.contains("reorder needs a delay"), "{e}");
    }

    #[test]
    fn out_of_range_values_are_refused() {
        for imp in [
            Impairment {
                loss: 150.0,
                ..Default::default()
            },
            Impairment {
                corrupt: f64::NAN,
                ..Default::default()
            },
            Impairment {
                rate_bps: Some(0),
                ..Default::default()
            },
            Impairment {
                jitter: Duration::from_millis(5),
                ..Default::default()
            },
        ] {
            assert!(imp.validate().is_err(), "{imp:?}");
        }
    }

    #[test]
    fn netem_arguments_follow_tc_syntax() {
        let imp = Impairment {
            delay: Duration::from_millis(10),
            jitter: Duration::from_millis(2),
            loss: 2.0,
            reorder: 25.0,
            duplicate: 1.0,
            corrupt: 0.1,
            rate_bps: Some(100_000_000),
            seed: None,
        };
        imp.validate().unwrap();
        assert_eq!(
            imp.netem_args().join(" "),
            "delay 10000us 2000us loss 2% duplicate 1% corrupt 0.1% reorder 25% rate 100000000bit"
        );
        assert_eq!(Impairment::default().to_string(), "none");
        assert!(Impairment::default().is_empty());
    }
}
