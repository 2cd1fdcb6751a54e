//! Per-connection TCP configuration.

use crate::time::Duration;

/// Congestion control algorithm, chosen per connection.
pub use super::cc::Algorithm as CcAlgorithm;
/// Congestion control tuning (initial window, ABC limit, Cubic fast convergence).
pub use super::cc::CcConfig;
/// RTO bounds and initial value.
pub use super::rtt::RttConfig;

/// Keepalive probing (RFC 9293 §3.8.4; off by default as RFC 1122 §4.2.3.6 requires).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepaliveConfig {
    /// Idle time before the first probe.
    pub idle: Duration,
    /// Time between unanswered probes.
    pub interval: Duration,
    /// Unanswered probes before the connection is aborted.
    pub probes: u32,
}

impl Default for KeepaliveConfig {
    /// RFC 9293 §3.8.4 (MUST-28): the idle interval defaults to no less than two hours.
    /// Interval and count as Linux's (`tcp_keepalive_intvl` 75 s, `tcp_keepalive_probes` 9).
    fn default() -> Self {
        KeepaliveConfig {
            idle: Duration::from_secs(2 * 3600),
            interval: Duration::from_secs(75),
            probes: 9,
        }
    }
}

/// TCP tuning knobs. `Default` is tuned for datacenter RPC: Nagle off, quick ACKs,
/// SACK, timestamps and window scaling on.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// MSS we advertise and the upper bound of what we send (RFC 6691: the TCP payload,
    /// without IP or TCP options). Clamped to the interface MTU minus 40.
    pub mss: u16,
    /// Receive buffer: the most in-order plus out-of-order payload bytes held per connection.
    pub rcv_buf: u32,
    /// The receive memory (truesize, as `Connection::recv_mem` counts it) a connection
    /// whose application reads is guaranteed under the stack-wide bound
    /// (`StackConfig::rcv_mem_total`), Linux's `tcp_rmem[0]`: while it holds less, a
    /// segment is refused for that bound only when all connections together hold the
    /// whole of it. The part of the bound above two thirds is kept for such connections;
    /// the others stop below it. At most the connection's own bound (twice `rcv_buf`)
    /// counts. Default 96 KiB, what 64 KiB of full-sized segments take in 2 KiB receive
    /// buffers: the window of the handshake (unscaled, RFC 7323 §2.2), promised before the
    /// connection's memory was known. `0` turns the floor and the reserve off: every
    /// connection may then take the whole bound, first come first served.
    pub rcv_mem_min: u32,
    /// Send buffer: the most unacknowledged plus unsent bytes queued per connection.
    pub snd_buf: u32,
    /// Offer window scaling (RFC 7323 §2); the shift is derived from `rcv_buf`.
    pub window_scaling: bool,
    /// Offer timestamps (RFC 7323 §3).
    pub timestamps: bool,
    /// Offer SACK (RFC 2018).
    pub sack: bool,
    /// Nagle's algorithm (RFC 9293 §3.7.4). Off by default: RPC latency matters more.
    pub nagle: bool,
    /// Delayed ACK timeout (RFC 9293 §3.8.6.3: MUST be under 0.5 s). `None` acks every segment.
    pub delayed_ack: Option<Duration>,
    /// Congestion control algorithm.
    pub cc: CcAlgorithm,
    /// Congestion control tuning; the initial window defaults to IW10 (RFC 6928).
    pub cc_config: CcConfig,
    /// RTO configuration (RFC 6298, with datacenter-friendly bounds).
    pub rtt: RttConfig,
    /// SYN retransmissions before a connection attempt gives up. The default, 7, keeps it
    /// alive for 183 s with the default RTOs (1 s initial, back-off capped at 60 s): RFC 9293
    /// §3.8.3 (MUST-23) wants at least 3 minutes for a SYN (6 gave up after 123 s).
    pub syn_retries: u32,
    /// SYN-ACK retransmissions before a half-open passive connection is dropped (Linux
    /// `tcp_synack_retries`). The default, 6, holds its backlog slot for 123 s: longer would
    /// help a SYN flood more than a lossy client (a full backlog falls back to SYN cookies).
    pub synack_retries: u32,
    /// Data retransmissions (RTO expiries in a row) before aborting (RFC 9293 §3.8.3 R2).
    pub max_retries: u32,
    /// Keepalive, off by default.
    pub keepalive: Option<KeepaliveConfig>,
    /// TIME-WAIT duration, 2*MSL (RFC 9293 §3.4.2). Datacenter deployments shorten it.
    pub time_wait: Duration,
    /// How long a connection the application released (closed) waits in FIN-WAIT-2 for the
    /// peer's FIN before it is reset (Linux tcp_fin_timeout, 60 s). Connections still held
    /// by the application wait indefinitely, as RFC 9293 specifies. Must be positive.
    pub fin_timeout: Duration,
    /// Challenge ACKs per connection per second (RFC 5961 §7). Per connection, never global:
    /// a global limit leaks state to off-path attackers (CVE-2016-5696).
    pub challenge_ack_limit: u32,
    /// Floor of the out-of-order segment bound per connection; the bound actually used is
    /// at least two segments per MSS of `rcv_buf`, so the advertised window can be held.
    pub max_ooo_segments: usize,
    /// Least time between ACKs sent in reply to unacceptable segments without data
    /// (out-of-window or PAWS-failed pure ACKs), per connection; like Linux's
    /// tcp_invalid_ratelimit. Segments with data or FIN are always acknowledged at once.
    /// Zero disables the limit; at most 1 s so that peers' keepalives are still answered.
    pub oow_ack_interval: Duration,
    /// Header prediction (Van Jacobson; BSD tcp_input, Linux tcp_rcv_established): in-order
    /// segments in ESTABLISHED that need nothing but the common processing skip the full
    /// RFC 9293 §3.10.7.4 checks. The result is identical either way; turning it off exists
    /// for the equivalence tests and for measuring what it saves.
    pub header_prediction: bool,
    /// RFC 1122 §4.2.2.13: reopen a TIME-WAIT connection for a SYN with SEG.SEQ > RCV.NXT
    /// when timestamps cannot decide (either side does not use them). Off by default: the
    /// sequence number alone cannot tell a new SYN from an old duplicate, so without
    /// timestamps on both sides such a SYN gets a challenge ACK (RFC 5961 §4.2).
    pub time_wait_reopen_by_seq: bool,
    /// Segments of new data the stack may make from one pass of a connection's output
    /// logic (software segmentation, as a NIC's TSO or Linux's GSO does after TCP): the
    /// send decision (windows, SWS, Nagle, RTT probe, timers) is taken once for up to this
    /// many full segments, and the stack cuts the frames from it, each with its own
    /// header. The frames on the wire are the same as one decision per segment gives
    /// (retransmissions, recovery and segments carrying SACK blocks are always one).
    /// `1` turns it off. At most 64.
    pub send_burst: u16,
    /// Tail loss probes (RFC 8985 §7, with SACK): `Some(floor)` sends a probe about two
    /// round trips after the last ACK instead of waiting for the RTO when the end of a
    /// flight is lost; `floor` is the least probe timeout, so that a round trip of
    /// microseconds does not turn every scheduling hiccup into a probe (Linux used 10 ms
    /// until 4.10, then two timer ticks added to 2 SRTT; [`TcpConfig::TLP_FLOOR`] is the
    /// suggested value: this project's VMs stall a polling thread for 1-8 ms about once a
    /// second). At most `rtt.max_rto`.
    ///
    /// On by default (`Some(TLP_FLOOR)`), as in Linux: a lost tail costs 10-40 ms instead
    /// of the 200 ms RTO. `None` turns probes off. The probe timeout restarts on every
    /// flight and ACK; the stack's timer queue moves such a deadline without waking the
    /// connection, so probes cost about 60 instructions per RPC per side; on the lossless
    /// memif link no rate difference shows at 1 or 16 connections, and about 3% at 5,000
    /// in the medians of a noisy host (earlier 14-25%, before the timer queue). A loaded
    /// peer whose round trip outgrows 2 SRTT draws needless probes (D-SACKed, then backed
    /// off) at under 1% of RPCs (docs/benchmarks.md, "Timer queue; tail loss probes on by
    /// default").
    pub tlp: Option<Duration>,
    /// RFC 8985 §7.2 `TLP.max_ack_delay`: what the probe timeout allows for the peer to
    /// delay its ACK when a single segment is in flight (no second segment forces an
    /// immediate ACK). Default 40 ms, Linux's shortest delayed-ACK timeout
    /// (`TCP_DELACK_MIN`; luna itself acknowledges at once by default): a peer that waits
    /// longer draws one needless probe, which its D-SACK reports, and nothing is reduced.
    /// At most `rtt.max_rto`.
    pub tlp_ack_delay: Duration,
    /// RACK's reordering timer (RFC 8985 §6.2, with SACK): data SACKed above a hole for
    /// longer than the reordering window (a quarter of the minimum RTT; a smoothed RTT once
    /// reordering was seen) marks the hole lost and starts fast recovery, though fewer than
    /// DupThresh segments are SACKed. Without it a loss in a flight of two to four
    /// segments (an RPC) waits for the RTO. On by default (Linux `tcp_recovery` bit 1).
    pub rack: bool,
}

/// The default [`TcpConfig::rcv_mem_min`]: 96 KiB, the truesize of a 64 KiB window (the
/// most a SYN or SYN-ACK offers) of full-sized segments in 2 KiB receive buffers (about
/// 2/3 of their truesize is payload).
pub const DEFAULT_RCV_MEM_MIN: u32 = 96 << 10;

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            mss: 1460,
            rcv_buf: 1 << 20,
            rcv_mem_min: DEFAULT_RCV_MEM_MIN,
            snd_buf: 1 << 20,
            window_scaling: true,
            timestamps: true,
            sack: true,
            nagle: false,
            delayed_ack: None,
            cc: CcAlgorithm::NewReno,
            cc_config: CcConfig::default(),
            rtt: RttConfig::default(),
            syn_retries: 7,
            synack_retries: 6,
            max_retries: 15,
            keepalive: None,
            time_wait: Duration::from_secs(60),
            fin_timeout: Duration::from_secs(60),
            challenge_ack_limit: 10,
            max_ooo_segments: 256,
            oow_ack_interval: Duration::from_millis(500),
            header_prediction: true,
            time_wait_reopen_by_seq: false,
            send_burst: 16,
            tlp: Some(TcpConfig::TLP_FLOOR),
            tlp_ack_delay: Duration::from_millis(40),
            rack: true,
        }
    }
}

impl TcpConfig {
    /// The least probe timeout [`TcpConfig::tlp`] has by default.
    pub const TLP_FLOOR: Duration = Duration::from_millis(10);

    /// Check the settings; the error names the offending one.
    pub fn validate(&self) -> Result<(), String> {
        if self.mss < 88 {
            return Err(format!("mss {} is below 88", self.mss));
        }
        if self.rcv_buf == 0 || self.snd_buf == 0 {
            return Err("rcv_buf and snd_buf must be positive".into());
        }
        if self.rcv_buf > 1 << 30 {
            return Err(format!(
                "rcv_buf {} exceeds 2^30 (RFC 7323 §2.3)",
                self.rcv_buf
            ));
        }
        if self.max_ooo_segments == 0 {
            return Err("max_ooo_segments must be positive".into());
        }
        if let Some(d) = self.delayed_ack {
            // RFC 9293 §3.8.6.3: the delay MUST be less than 0.5 seconds.
            if d >= Duration::from_millis(500) {
                return Err(format!(
                    "delayed_ack {d:?} must be below 500 ms (RFC 9293 §3.8.6.3)"
                ));
            }
        }
        if let Some(ka) = self.keepalive {
            if ka.probes == 0 || ka.interval.is_zero() || ka.idle.is_zero() {
                return Err("keepalive idle, interval and probes must be positive".into());
            }
        }
        if self.fin_timeout.is_zero() {
            return Err("fin_timeout must be positive".into());
        }
        if self.oow_ack_interval > Duration::from_secs(1) {
            return Err(format!(
                "oow_ack_interval {:?} exceeds 1 s: peers' keepalives would go unanswered",
                self.oow_ack_interval
            ));
        }
        if !(1..=64).contains(&self.send_burst) {
            return Err(format!("send_burst {} is not in 1..=64", self.send_burst));
        }
        if self.tlp_ack_delay > self.rtt.max_rto {
            return Err(format!(
                "tlp_ack_delay {:?} exceeds max_rto ({:?})",
                self.tlp_ack_delay, self.rtt.max_rto
            ));
        }
        if let Some(floor) = self.tlp {
            if floor.is_zero() || floor > self.rtt.max_rto {
                return Err(format!(
                    "tlp floor {floor:?} must be positive and at most max_rto ({:?})",
                    self.rtt.max_rto
                ));
            }
        }
        self.rtt.validate().map_err(|e| format!("rtt: {e}"))?;
        Ok(())
    }

    /// The window-scale shift we offer: the smallest that lets the window field cover
    /// `rcv_buf`, capped at 14 (RFC 7323 §2.3).
    pub fn rcv_wscale(&self) -> u8 {
        if !self.window_scaling {
            return 0;
        }
        let mut shift = 0u8;
        while shift < 14 && (u64::from(u16::MAX) << shift) < u64::from(self.rcv_buf) {
            shift += 1;
        }
        shift
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 9293 §3.8.4: keep-alive is off by default (MUST-25) and, once asked for with
    /// the default settings, waits at least two hours of idleness (MUST-28).
    #[test]
    fn rfc9293_3_8_4_keepalive_off_by_default_and_two_hours_when_on() {
        assert_eq!(TcpConfig::default().keepalive, None);
        let ka = KeepaliveConfig::default();
        assert!(ka.idle >= Duration::from_secs(7200), "{ka:?}");
        let on = TcpConfig {
            keepalive: Some(ka),
            ..TcpConfig::default()
        };
        assert!(on.validate().is_ok());
    }

    #[test]
    fn validate_names_the_bad_setting() {
        assert!(TcpConfig::default().validate().is_ok());
        let bad = TcpConfig {
            delayed_ack: Some(Duration::from_secs(1)),
            ..TcpConfig::default()
        };
        assert!(bad.validate().unwrap_err().contains("delayed_ack"));
        let bad = TcpConfig {
            mss: 10,
            ..TcpConfig::default()
        };
        assert!(bad.validate().unwrap_err().contains("mss"));
        let bad = TcpConfig {
            rcv_buf: 0,
            ..TcpConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = TcpConfig {
            oow_ack_interval: Duration::from_secs(2),
            ..TcpConfig::default()
        };
        assert!(bad.validate().unwrap_err().contains("oow_ack_interval"));
        let bad = TcpConfig {
            fin_timeout: Duration::ZERO,
            ..TcpConfig::default()
        };
        assert!(bad.validate().unwrap_err().contains("fin_timeout"));
        for floor in [Duration::ZERO, Duration::from_secs(121)] {
            let bad = TcpConfig {
                tlp: Some(floor),
                ..TcpConfig::default()
            };
            assert!(bad.validate().unwrap_err().contains("tlp"), "{floor:?}");
        }
        let off = TcpConfig {
            tlp: None,
            ..TcpConfig::default()
        };
        assert!(off.validate().is_ok());
        let bad = TcpConfig {
            tlp_ack_delay: Duration::from_secs(61),
            ..TcpConfig::default()
        };
        assert!(bad.validate().unwrap_err().contains("tlp_ack_delay"));
        let off = TcpConfig {
            oow_ack_interval: Duration::ZERO,
            ..TcpConfig::default()
        };
        assert!(off.validate().is_ok());
    }

    #[test]
    fn rfc7323_2_3_wscale_covers_buffer_and_caps_at_14() {
        let mut c = TcpConfig {
            rcv_buf: 65_535,
            ..TcpConfig::default()
        };
        assert_eq!(c.rcv_wscale(), 0);
        c.rcv_buf = 1 << 20;
        assert_eq!(c.rcv_wscale(), 5);
        c.rcv_buf = u32::MAX;
        assert_eq!(c.rcv_wscale(), 14);
        c.window_scaling = false;
        assert_eq!(c.rcv_wscale(), 0);
    }
}
