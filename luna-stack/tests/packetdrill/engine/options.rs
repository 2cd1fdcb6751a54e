//! Per-run choices (`--profile`, `--lenient`, `--peer`, `--define`) and the header options
//! of other stacks' scripts (`--local_ip`, `--speed`, ...).

use super::{Runner, ScriptError};
use crate::packetdrill::script::Result;
use luna_stack::time::Duration;

/// Whose socket API the script was written for: decides what getsockopt returns where
/// kernels differ (Linux doubles SO_RCVBUF/SO_SNDBUF on set, BSD does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Profile {
    #[default]
    Linux,
    Bsd,
}

/// The TCP behaviour the script's author's stack had where luna's defaults differ and a
/// knob exists: delayed ACKs (luna: off; Linux: 40 ms; BSD: 100 ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Peer {
    #[default]
    Luna,
    Linux,
    Bsd,
}

impl Peer {
    pub fn delayed_ack(self) -> Option<Duration> {
        match self {
            Peer::Luna => None,
            Peer::Linux => Some(Duration::from_millis(40)),
            Peer::Bsd => Some(Duration::from_millis(100)),
        }
    }
}

/// How one run interprets a script.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub profile: Profile,
    pub peer: Peer,
    /// Ignore advertised windows, option order and NOP/EOL padding on luna's packets.
    pub lenient: bool,
    /// Names `#ifdef` tests; empty means the profile's (`Linux` or `FreeBSD`).
    pub defines: Vec<String>,
}

impl RunOptions {
    /// `--profile=linux|bsd --peer=luna|linux|bsd --lenient --define=A[,B]`; other
    /// arguments are returned for the caller (`--json`).
    pub fn from_args<'a>(
        args: impl IntoIterator<Item = &'a str>,
    ) -> std::result::Result<(RunOptions, Vec<String>), String> {
        let mut o = RunOptions::default();
        let mut rest = Vec::new();
        for a in args {
            let (k, v) = a.split_once('=').unwrap_or((a, ""));
            match (k, v) {
                ("--profile", "linux") => o.profile = Profile::Linux,
                ("--profile", "bsd" | "freebsd") => o.profile = Profile::Bsd,
                ("--peer", "luna") => o.peer = Peer::Luna,
                ("--peer", "linux") => o.peer = Peer::Linux,
                ("--peer", "bsd" | "freebsd") => o.peer = Peer::Bsd,
                ("--lenient", "") => o.lenient = true,
                ("--define", d) if !d.is_empty() => {
                    o.defines.extend(d.split(',').map(str::to_string))
                }
                ("--profile" | "--peer" | "--define", _) => {
                    return Err(format!("bad value in `{a}`"))
                }
                _ => rest.push(a.to_string()),
            }
        }
        Ok((o, rest))
    }

    /// The `#ifdef` names of this run.
    pub fn parse_options(&self) -> crate::packetdrill::script::ParseOptions {
        let defines = if self.defines.is_empty() {
            vec![match self.profile {
                Profile::Linux => "Linux".to_string(),
                Profile::Bsd => "FreeBSD".to_string(),
            }]
        } else {
            self.defines.clone()
        };
        crate::packetdrill::script::ParseOptions { defines }
    }
}

/// Header options of upstream scripts that luna has no use for but that change nothing it
/// checks (addresses are the runner's own; the virtual link has no speed).
const IGNORED: &[&str] = &[
    "local_ip",
    "remote_ip",
    "gateway_ip",
    "netmask_ip",
    "speed",
    "tolerance_percent",
    "v",
    "verbose",
    "strict_segments",
    "dry_run",
    "wire_client",
    "wire_server",
    "wire_server_ip",
    "wire_server_port",
    "wire_client_dev",
    "wire_server_dev",
];

/// Upstream header options that change behaviour luna cannot reproduce.
const UNSUPPORTED: &[&str] = &[
    "non_fatal",
    "init_scripts",
    "tcp_ts_ecr_scaled",
    "send_omit_free",
    "so_flavor",
    "psp_udp_port",
    "mtu_probe",
    "persistent_tun",
];

impl Runner {
    /// Header options other than luna's own (`apply_options` falls back to this).
    pub(super) fn upstream_option(&mut self, line: usize, n: &str, v: &str) -> Result<()> {
        if IGNORED.contains(&n) {
            if n.ends_with("_ip") && v.contains(':') {
                return Err(ScriptError::skip(line, format!("--{n}={v}: IPv4 only")));
            }
            return Ok(());
        }
        if matches!(n, "bind_port" | "connect_port") {
            if v == super::LUNA_PORT.to_string() {
                return Ok(());
            }
            return Err(ScriptError::skip(
                line,
                format!("--{n}={v}: the runner uses port {}", super::LUNA_PORT),
            ));
        }
        if UNSUPPORTED.contains(&n) {
            return Err(ScriptError::skip(
                line,
                format!("header option --{n} is not supported"),
            ));
        }
        Err(ScriptError::new(
            line,
            format!(
                "unknown header option --{n} (supported: tolerance_usecs, tcp_ts_tick_usecs, \
                 ip_version=ipv4, mtu, the upstream options in docs/packetdrill.md and the \
                 luna_* knobs)"
            ),
        ))
    }
}
