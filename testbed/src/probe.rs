//! Reachability probes from kernel hosts, for tests and health checks.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::sys;
use crate::topology::KernelHost;

/// What `ping` reported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PingStats {
    /// Echo requests sent.
    pub transmitted: u32,
    /// Distinct replies received.
    pub received: u32,
    /// Duplicate replies (`+N duplicates`).
    pub duplicates: u32,
    /// Smallest RTT, if any reply came.
    pub rtt_min: Option<Duration>,
    /// Mean RTT.
    pub rtt_avg: Option<Duration>,
    /// Largest RTT.
    pub rtt_max: Option<Duration>,
}

impl PingStats {
    /// Parses iputils ping's summary lines.
    pub fn parse(out: &str) -> Option<PingStats> {
        let mut s = PingStats::default();
        let mut seen_summary = false;
        for line in out.lines() {
            if line.contains("packets transmitted") {
                seen_summary = true;
                for part in line.split(", ") {
                    let n: u32 = part
                        .trim_start_matches('+')
                        .split_whitespace()
                        .next()
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                    if part.ends_with("packets transmitted") {
                        s.transmitted = n;
                    } else if part.ends_with("received") {
                        s.received = n;
                    } else if part.contains("duplicates") {
                        s.duplicates = n;
                    }
                }
            } else if let Some(rest) = line.strip_prefix("rtt min/avg/max/mdev = ") {
                // `... = a/b/c/d ms` optionally followed by `, pipe N`.
                let ms: Vec<f64> = rest
                    .split(" ms")
                    .next()
                    .unwrap_or("")
                    .split('/')
                    .filter_map(|v| v.parse().ok())
                    .collect();
                if ms.len() == 4 {
                    let d = |v: f64| Some(Duration::from_secs_f64(v / 1e3));
                    (s.rtt_min, s.rtt_avg, s.rtt_max) = (d(ms[0]), d(ms[1]), d(ms[2]));
                }
            }
        }
        seen_summary.then_some(s)
    }
}

impl KernelHost {
    /// Pings `dst` `count` times, `interval` apart, waiting at most `wait` for each reply.
    /// An unreachable peer is not an error: it shows as `received == 0`.
    pub fn ping(
        &self,
        dst: Ipv4Addr,
        count: u32,
        interval: Duration,
        wait: Duration,
    ) -> Result<PingStats> {
        sys::find_tool("ping", "iputils-ping")?;
        let out = self
            .command("ping")
            .args(["-n", "-q", "-c", &count.to_string()])
            .args(["-i", &format!("{:.3}", interval.as_secs_f64())])
            .args(["-W", &format!("{:.3}", wait.as_secs_f64().max(0.001))])
            .arg(dst.to_string())
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| Error::io("running ping", e))?;
        let text = String::from_utf8_lossy(&out.stdout);
        PingStats::parse(&text).ok_or_else(|| Error::Command {
            cmd: format!("ip netns exec {} ping {dst}", self.netns),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_iputils_summaries() {
        let out = "--- 198.18.2.2 ping statistics ---\n\
                   10 packets transmitted, 10 received, +3 duplicates, 0% packet loss, time 905ms\n\
                   rtt min/avg/max/mdev = 0.033/40.055/100.077/0.022 ms, pipe 5\n";
        let s = PingStats::parse(out).unwrap();
        assert_eq!((s.transmitted, s.received, s.duplicates), (10, 10, 3));
        assert_eq!(s.rtt_max, Some(Duration::from_micros(100_077)));
        let lost = "3 packets transmitted, 0 received, 100% packet loss, time 2031ms\n";
        let s = PingStats::parse(lost).unwrap();
        assert_eq!((s.received, s.rtt_avg), (0, None));
        assert_eq!(
            PingStats::parse("ping: connect: Network is unreachable"),
            None
        );
    }
}
