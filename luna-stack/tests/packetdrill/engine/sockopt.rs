//! setsockopt/getsockopt. luna's options are per stack (`TcpConfig`), so an option set
//! before the stack is built shapes its configuration; afterwards a set succeeds only if it
//! changes nothing luna does, else the script is skipped (luna has no per-socket options).
//! Options without a luna counterpart succeed only at the value luna behaves like.
//! What getsockopt returns where kernels differ follows the run's `Profile`.

use super::options::Profile;
use super::{errno_name, errno_num, fail, ok, reason_errno, Attempt, FdKind, Runner};
use crate::packetdrill::script::{Arg, Result, ScriptError, Syscall};
use luna_stack::time::Duration;

/// What the script set on one fd (for getsockopt's answers).
#[derive(Debug, Clone, Copy, Default)]
pub struct FdOpts {
    pub rcvbuf: Option<i64>,
    pub sndbuf: Option<i64>,
    pub maxseg: Option<i64>,
    /// SO_LINGER (on, seconds).
    pub linger: Option<(i64, i64)>,
}

/// luna's IPv4 TTL and TOS (`Ipv4Repr::new`).
const LUNA_TTL: i64 = 64;
const LUNA_TOS: i64 = 0;

fn tcp_level(l: &str) -> bool {
    matches!(l, "SOL_TCP" | "IPPROTO_TCP")
}

fn ip_level(l: &str) -> bool {
    matches!(l, "SOL_IP" | "IPPROTO_IP")
}

/// `{l_onoff=1, l_linger=0}` (Linux names) or `{onoff=1, linger=0}`.
fn linger_arg(a: Option<&Arg>) -> Option<(i64, i64)> {
    let Some(Arg::Struct(f)) = a else { return None };
    let get = |names: [&str; 2]| {
        f.iter().find_map(|(k, v)| match v {
            Arg::Int(x) if names.contains(&k.as_str()) => Some(*x),
            _ => None,
        })
    };
    Some((get(["l_onoff", "onoff"])?, get(["l_linger", "linger"])?))
}

impl Runner {
    /// The time luna gives a connect before ETIMEDOUT: SYN back-off over `syn_retries`.
    fn connect_timeout(&self) -> Duration {
        let rtt = &self.cfg.tcp.rtt;
        let mut rto = rtt.initial_rto;
        let mut total = Duration::ZERO;
        for _ in 0..=self.cfg.tcp.syn_retries {
            total += rto;
            rto = (rto + rto).min(rtt.max_rto);
        }
        total
    }

    pub(super) fn sys_setsockopt(&mut self, sc: &Syscall) -> Result<Attempt> {
        self.want_args(sc, 5)?;
        let fd = self.fd(&sc.args, "setsockopt")?;
        if !self.fds.contains_key(&fd) {
            return Ok(Attempt::Done(fail("EBADF")));
        }
        let level = self.ident_arg(&sc.args, 1, "setsockopt")?.join("|");
        let name = self.ident_arg(&sc.args, 2, "setsockopt")?.join("|");
        if matches!(name.as_str(), "SO_REUSEADDR" | "SO_REUSEPORT") {
            return Ok(Attempt::Done(ok(0))); // luna reuses TIME-WAIT tuples on its own
        }
        let skip = |this: &Self, why: String| -> Result<Attempt> {
            Err(ScriptError::skip(
                this.line,
                format!("setsockopt({name}): {why}"),
            ))
        };
        if name == "SO_LINGER" {
            let Some((on, secs)) = linger_arg(sc.args.get(3)) else {
                return self.err("setsockopt(SO_LINGER): want {l_onoff=N, l_linger=N}");
            };
            if on != 0 && secs != 0 {
                return skip(
                    self,
                    "a lingering close blocks until data is acknowledged; luna's close never \
                     blocks"
                        .into(),
                );
            }
            self.sockopts.entry(fd).or_default().linger = Some((on, secs));
            return Ok(Attempt::Done(ok(0)));
        }
        let v = self.int_arg(&sc.args, 3, "setsockopt")?;
        let secs = |v: i64| Duration::from_secs(u64::try_from(v).unwrap_or(0));
        // Options with no luna counterpart: only what luna does anyway.
        let fixed = match (level.as_str(), name.as_str()) {
            (l, "TCP_NOOPT") if tcp_level(l) => Some((0, "luna always sends its options")),
            (l, "IP_TTL") if ip_level(l) => Some((LUNA_TTL, "luna's TTL is 64")),
            (l, "IP_TOS") if ip_level(l) => Some((LUNA_TOS, "luna sends TOS 0")),
            (l, "TCP_KEEPINIT") if tcp_level(l) => {
                let t = self.connect_timeout().as_secs() as i64;
                if v == t {
                    return Ok(Attempt::Done(ok(0)));
                }
                return skip(
                    self,
                    format!(
                        "luna has no connect timeout knob (its SYN back-off gives up after {t} s)"
                    ),
                );
            }
            _ => None,
        };
        if let Some((want, why)) = fixed {
            if v == want {
                return Ok(Attempt::Done(ok(0)));
            }
            return skip(self, why.into());
        }
        let before = (format!("{:?}", self.cfg), format!("{:?}", self.keepalive));
        let tcp = &mut self.cfg.tcp;
        let o = self.sockopts.entry(fd).or_default();
        match (level.as_str(), name.as_str()) {
            ("SOL_SOCKET", "SO_KEEPALIVE") => self.keepalive.on = v != 0,
            ("SOL_SOCKET", "SO_RCVBUF") => {
                tcp.rcv_buf = u32::try_from(v).unwrap_or(0);
                o.rcvbuf = Some(v);
            }
            ("SOL_SOCKET", "SO_SNDBUF") => {
                tcp.snd_buf = u32::try_from(v).unwrap_or(0);
                o.sndbuf = Some(v);
            }
            (l, "TCP_NODELAY") if tcp_level(l) => tcp.nagle = v == 0,
            (l, "TCP_MAXSEG") if tcp_level(l) => {
                tcp.mss = u16::try_from(v).unwrap_or(0);
                o.maxseg = Some(v);
            }
            (l, "TCP_KEEPIDLE") if tcp_level(l) => self.keepalive.idle = secs(v),
            (l, "TCP_KEEPINTVL") if tcp_level(l) => self.keepalive.interval = secs(v),
            (l, "TCP_KEEPCNT") if tcp_level(l) => {
                self.keepalive.probes = u32::try_from(v).unwrap_or(0)
            }
            _ => {
                return skip(
                    self,
                    format!(
                        "{level}/{name} is not supported (supported: SO_REUSEADDR, SO_KEEPALIVE, \
                         SO_RCVBUF, SO_SNDBUF, SO_LINGER, TCP_NODELAY, TCP_MAXSEG, TCP_KEEPIDLE, \
                         TCP_KEEPINTVL, TCP_KEEPCNT, TCP_KEEPINIT, TCP_NOOPT, IP_TTL, IP_TOS)"
                    ),
                )
            }
        }
        let after = (format!("{:?}", self.cfg), format!("{:?}", self.keepalive));
        if self.stack.is_some() && before != after {
            return skip(
                self,
                "set after the first listen/connect/packet changes luna's behaviour, and luna \
                 has no per-socket options (TcpConfig is per stack): set it before them"
                    .into(),
            );
        }
        Ok(Attempt::Done(ok(0)))
    }

    /// The value getsockopt reports for an integer option, or a skip.
    fn sockopt_value(&mut self, fd: i64, kind: FdKind, level: &str, name: &str) -> Result<i64> {
        let o = self.sockopts.get(&fd).copied().unwrap_or_default();
        let linux = self.opts.profile == Profile::Linux;
        // Linux doubles a buffer size set by the application (bookkeeping overhead);
        // BSD reports it as set.
        let buf = |set: Option<i64>, cfg: u32| match set {
            Some(v) if linux => v.saturating_mul(2),
            Some(v) => v,
            None => i64::from(cfg),
        };
        let conn = match kind {
            FdKind::Conn(h) => self.stack.as_ref().and_then(|s| s.connection(h)),
            _ => None,
        };
        Ok(match (level, name) {
            ("SOL_SOCKET", "SO_RCVBUF") => buf(o.rcvbuf, self.cfg.tcp.rcv_buf),
            ("SOL_SOCKET", "SO_SNDBUF") => buf(o.sndbuf, self.cfg.tcp.snd_buf),
            ("SOL_SOCKET", "SO_KEEPALIVE") => i64::from(self.keepalive.on),
            (l, "TCP_NODELAY") if tcp_level(l) => i64::from(!self.cfg.tcp.nagle),
            (l, "TCP_MAXSEG") if tcp_level(l) => match conn {
                Some(c) => i64::from(c.mss()),
                // Unconnected: the value set, else the RFC 9293 §3.7.1 default.
                None => o.maxseg.unwrap_or(536),
            },
            (l, "TCP_KEEPIDLE") if tcp_level(l) => self.keepalive.idle.as_secs() as i64,
            (l, "TCP_KEEPINTVL") if tcp_level(l) => self.keepalive.interval.as_secs() as i64,
            (l, "TCP_KEEPCNT") if tcp_level(l) => i64::from(self.keepalive.probes),
            (l, "TCP_KEEPINIT") if tcp_level(l) => self.connect_timeout().as_secs() as i64,
            (l, "TCP_NOOPT") if tcp_level(l) => 0,
            (l, "IP_TTL") if ip_level(l) => LUNA_TTL,
            (l, "IP_TOS") if ip_level(l) => LUNA_TOS,
            _ => {
                return Err(ScriptError::skip(
                    self.line,
                    format!(
                        "getsockopt({level}, {name}) is not supported (supported: SO_ERROR, \
                         SO_RCVBUF, SO_SNDBUF, SO_KEEPALIVE, SO_LINGER, TCP_NODELAY, TCP_MAXSEG, \
                         TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT, TCP_KEEPINIT, TCP_NOOPT, \
                         IP_TTL, IP_TOS, TCP_INFO)"
                    ),
                ))
            }
        })
    }

    pub(super) fn sys_getsockopt(&mut self, sc: &Syscall) -> Result<Attempt> {
        self.want_args(sc, 5)?;
        let fd = self.fd(&sc.args, "getsockopt")?;
        let Some(f) = self.fds.get(&fd).cloned() else {
            return Ok(Attempt::Done(fail("EBADF")));
        };
        let level = self.ident_arg(&sc.args, 1, "getsockopt")?.join("|");
        let name = self.ident_arg(&sc.args, 2, "getsockopt")?.join("|");
        match name.as_str() {
            "SO_ERROR" => {
                let want = match sc.args.get(3) {
                    Some(Arg::Array(v)) if v.len() == 1 => match &v[0] {
                        Arg::Int(x) => *x,
                        Arg::Ident(n) if n.len() == 1 => match errno_num(&n[0]) {
                            Some(x) => x,
                            None => return self.err(format!("unknown errno `{}`", n[0])),
                        },
                        _ => return self.err("getsockopt(SO_ERROR): want [0] or [ERRNO]"),
                    },
                    _ => return self.err("getsockopt(SO_ERROR): want [0] or [ERRNO]"),
                };
                let got = match f.kind {
                    FdKind::Conn(h) => {
                        let s = self.stack()?;
                        reason_errno(s.close_reason(h))
                            .and_then(errno_num)
                            .unwrap_or(0)
                    }
                    _ => 0,
                };
                if got != want {
                    return self.err(format!(
                        "getsockopt(SO_ERROR) is {} ({}), expected {want}",
                        got,
                        if got == 0 { "none" } else { errno_name(got) }
                    ));
                }
            }
            "TCP_INFO" => {
                let Some(Arg::Struct(fields)) = sc.args.get(3) else {
                    return self
                        .err("getsockopt(TCP_INFO): the value must be {tcpi_field=value, ...}");
                };
                self.check_tcp_info(&f, fields)?;
            }
            "SO_LINGER" => {
                let Some(want) = linger_arg(sc.args.get(3)) else {
                    return self.err("getsockopt(SO_LINGER): want {l_onoff=N, l_linger=N}");
                };
                let got = self
                    .sockopts
                    .get(&fd)
                    .and_then(|o| o.linger)
                    .unwrap_or((0, 0));
                if got != want {
                    return self.err(format!(
                        "getsockopt(SO_LINGER) is {{onoff={}, linger={}}}, expected {{onoff={}, \
                         linger={}}}",
                        got.0, got.1, want.0, want.1
                    ));
                }
            }
            _ => {
                let got = self.sockopt_value(fd, f.kind, &level, &name)?;
                let want = self.int_arg(&sc.args, 3, "getsockopt")?;
                if got != want {
                    return self.err(format!("getsockopt({name}) is {got}, expected {want}"));
                }
            }
        }
        Ok(Attempt::Done(ok(0)))
    }

    /// An accepted socket inherits what was set on its listener (as on Linux and BSD).
    pub(super) fn inherit_sockopts(&mut self, listener: i64, fd: i64) {
        if let Some(o) = self.sockopts.get(&listener).copied() {
            self.sockopts.insert(fd, o);
        } else {
            self.sockopts.remove(&fd);
        }
    }

    /// close() with SO_LINGER {1, 0} aborts (RST), as on Linux and BSD.
    pub(super) fn linger_abort(&self, fd: i64) -> bool {
        self.sockopts
            .get(&fd)
            .and_then(|o| o.linger)
            .is_some_and(|(on, secs)| on != 0 && secs == 0)
    }
}
