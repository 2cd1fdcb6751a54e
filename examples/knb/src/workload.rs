//! The workload options every RPC subcommand shares, and their validation.

use clap::{Args, ValueEnum};
use serde_json::{json, Value};

use crate::engine::Mode;

/// Errors of the RPC subcommands.
#[derive(Debug)]
pub enum Error {
    /// Bad arguments (exit 2).
    Usage(String),
    /// The run failed (exit 1).
    Run(String),
}

impl From<String> for Error {
    fn from(s: String) -> Error {
        Error::Run(s)
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Usage(s) | Error::Run(s) => f.write_str(s),
        }
    }
}

/// Result of the RPC subcommands.
pub type Res<T> = Result<T, Error>;

/// The network stacks knb can measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum Stack {
    /// Linux TCP between two namespaces over veth.
    Kernel,
    /// smoltcp 0.14 in two DPDK processes over memif.
    Smoltcp,
    /// luna (r2c runtime) in two DPDK processes over memif.
    Luna,
}

impl Stack {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Stack::Kernel => "kernel",
            Stack::Smoltcp => "smoltcp",
            Stack::Luna => "luna",
        }
    }
}

/// `rpc` or `bulk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// Request/response.
    Rpc,
    /// One-way streaming.
    Bulk,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Rpc => Mode::Rpc,
            ModeArg::Bulk => Mode::Bulk,
        }
    }
}

/// Parses seconds (`5`, `0.5`, `2s`) in 0..=3600.
pub fn parse_secs(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim_end_matches('s')
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(0.0..=3600.0).contains(&v) {
        return Err(format!("{v} s is outside 0..=3600"));
    }
    Ok(v)
}

/// Parses a byte size: `4096`, `4k`/`4K`/`4KiB`, `1m`.
pub fn parse_size(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let (num, mul) = if let Some(n) = lower
        .strip_suffix("kib")
        .or_else(|| lower.strip_suffix('k'))
    {
        (n, 1024)
    } else if let Some(n) = lower
        .strip_suffix("mib")
        .or_else(|| lower.strip_suffix('m'))
    {
        (n, 1024 * 1024)
    } else {
        (lower.strip_suffix('b').unwrap_or(&lower), 1)
    };
    let v: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 64, 4k, 64KiB)"))?;
    // Checked: 2^54 KiB wrapped around to 0 B (a "valid" size) in a release build.
    let v = v.saturating_mul(mul);
    if v > crate::proto::MAX_PAYLOAD as u64 {
        return Err(format!(
            "{s:?} is above the largest message ({} B)",
            crate::proto::MAX_PAYLOAD
        ));
    }
    Ok(v as u32)
}

/// A CPU list (one value on the command line, so clap does not treat it as repeated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cpus(pub Vec<usize>);

/// Parses a CPU list: `0`, `0,1`, `0-3`.
pub fn parse_cpus(s: &str) -> Result<Cpus, String> {
    let mut v = Vec::new();
    for part in s.split(',') {
        let p = part.trim();
        let num = |x: &str| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| format!("{x:?} is not a CPU number (expected e.g. 0,1 or 0-3)"))
        };
        match p.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b || b - a > 1023 {
                    return Err(format!("{p:?} is not a CPU range"));
                }
                v.extend(a..=b);
            }
            None => v.push(num(p)?),
        }
    }
    if v.is_empty() {
        return Err("empty CPU list".into());
    }
    Ok(Cpus(v))
}

/// The lowest `--rate` (RPC/s): one arrival per 1,000 s on average.
const MIN_RATE: f64 = 1e-3;

fn parse_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a rate in RPC/s"))?;
    // The lower bound keeps a thread's mean inter-arrival gap (rate / --threads, up to
    // 37 means at the RNG's extreme) far inside a Duration and an Instant: 1e-30 RPC/s
    // panicked converting the first gap.
    if !(MIN_RATE..=1e9).contains(&v) {
        return Err(format!("{v} RPC/s is outside [{MIN_RATE}, 1e9]"));
    }
    Ok(v)
}

/// What to run: sizes, concurrency, time, arrival process.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct Workload {
    /// Request payload bytes (bulk: bytes per write), e.g. 64, 4k, 64KiB.
    #[arg(long, default_value = "4096", value_parser = parse_size)]
    pub req_size: u32,
    /// Response payload bytes.
    #[arg(long, default_value = "4096", value_parser = parse_size)]
    pub resp_size: u32,
    /// Outstanding RPCs per connection (closed loop).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub iodepth: u32,
    /// Connections in total (spread over the threads).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16384))]
    pub connections: u32,
    /// Threads (cores) per side.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub threads: u32,
    /// Measured seconds (after warm-up).
    #[arg(long, default_value = "5", value_parser = parse_secs)]
    pub duration: f64,
    /// Warm-up seconds (not measured).
    #[arg(long, default_value = "1", value_parser = parse_secs)]
    pub warmup: f64,
    /// Open loop: Poisson arrivals at this many RPC/s in total (default: closed loop).
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// Fill payloads with a pattern and check every byte (costs CPU).
    #[arg(long)]
    pub verify: bool,
    /// rpc (request/response) or bulk (one-way stream, iperf-like).
    #[arg(long, value_enum, default_value = "rpc")]
    pub mode: ModeArg,
    /// IP MTU of the DPDK stacks' memif link (luna, smoltcp): 1500 like the veth, or up
    /// to 9000 (jumbo frames: a 4 KiB message in one frame, as the raw ceiling and the
    /// kernel's GSO/GRO over veth move it). The kernel's veth stays at 1500.
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u16).range(576..=9000))]
    pub mtu: u16,
    /// memif zero-copy mode for the DPDK stacks (luna, smoltcp): the client side's vdev
    /// gets `zero-copy=yes` (and its EAL `--single-file-segments`), so the server copies
    /// frames straight into and out of the client's buffers: one copy per frame on the
    /// link instead of two, closer to a NIC that DMAs into the stack's memory. luna's
    /// client then takes its zbuf zones from EAL memory. Off by default (see
    /// docs/benchmarks.md, "memif zero-copy mode").
    #[arg(long)]
    pub memif_zero_copy: bool,
    /// Service-time emulation, unordered replies, kernel server models.
    #[command(flatten)]
    pub emu: crate::service::Emu,
}

/// memif buffer size (`bsize`) for frames of IP MTU `mtu`: one buffer per frame (DPDK
/// 22.11's memif corrupts frames spanning several descriptors).
pub fn memif_bsize(mtu: u16) -> u32 {
    (u32::from(mtu) + 14 + 128).next_power_of_two().max(2048)
}

/// Bytes of frame buffers in each memif ring, whatever the buffer size: the one memif link
/// every user of it gets (`knb raw`'s ceiling and the stacks alike, at any MTU).
///
/// memif copies every frame into and out of its ring's buffers, and the ring is walked in
/// order, so its buffers' bytes are the link's working set: with 16 MiB (2,048 of 8 KiB,
/// as `knb raw` had, or 1,024 of 16 KiB at MTU 9000) each copy met cold lines, and raw
/// memif ran 20–25% slower than with 2 MiB (docs/benchmarks.md, "One memif link for
/// every user").
pub const MEMIF_RING_BYTES: u32 = 2 << 20;

/// log2 of the memif ring size (DPDK's `rsize`) for buffers of `bsize` bytes: as many
/// descriptors as [`MEMIF_RING_BYTES`] hold, 16 to 16,384 (1,024, DPDK's default, for
/// the 2 KiB buffers of MTU 1500; 128 for the 16 KiB of MTU 9000).
pub fn memif_rsize(bsize: u32) -> u8 {
    (MEMIF_RING_BYTES / bsize.max(1)).clamp(16, 1 << 14).ilog2() as u8
}

/// The memif vdev's ring arguments for buffers of `bsize` bytes:
/// `,bsize=B,rsize=R`, `R` from [`memif_rsize`] unless `KNB_MEMIF_RSIZE` says otherwise.
pub fn memif_ring_args(bsize: u32) -> Res<String> {
    let knob = memif_rsize_from_env(std::env::var("KNB_MEMIF_RSIZE").ok().as_deref())?;
    let rsize = knob.unwrap_or_else(|| memif_rsize(bsize));
    Ok(format!(",bsize={bsize},rsize={rsize}"))
}

/// `KNB_MEMIF_RSIZE` (an experiment knob, unset by default): log2 of the memif rings'
/// size both ends ask for (DPDK's `rsize`), in place of [`memif_rsize`]'s. `None` when
/// unset.
pub fn memif_rsize_from_env(v: Option<&str>) -> Res<Option<u8>> {
    let Some(v) = v else {
        return Ok(None);
    };
    v.trim()
        .parse::<u8>()
        .ok()
        .filter(|r| (4..=14).contains(r))
        .map(Some)
        .ok_or_else(|| {
            Error::Usage(format!(
                "KNB_MEMIF_RSIZE={v:?} is not log2 of a ring size from 4 to 14 (16 to 16,384 descriptors)"
            ))
        })
}

/// `--ip` / `--server-ip` must be a unicast host address on its `--prefix-len` prefix
/// (luna-stack's rule, so every stack and r2c refuse the same addresses). The kernel stack
/// also takes loopback addresses: it has a loopback interface (DPDK stacks do not).
pub fn check_ip(flag: &str, ip: std::net::Ipv4Addr, prefix_len: u8, stack: Stack) -> Res<()> {
    if stack == Stack::Kernel && ip.is_loopback() {
        return Ok(());
    }
    let cidr = luna_stack::wire::Ipv4Cidr::new(ip, prefix_len)
        .map_err(|_| Error::Usage(format!("{flag} {ip}: prefix length {prefix_len} above 32")))?;
    luna_stack::stack::check_host_address(cidr).map_err(|e| match e {
        luna_stack::stack::ConfigError::Address(_, why) => Error::Usage(format!(
            "{flag} {ip} (prefix length {prefix_len}) is {why}: give a unicast host address"
        )),
        other => Error::Usage(format!("{flag} {ip}/{prefix_len}: {other}")),
    })
}

impl Workload {
    /// Cross-field checks clap cannot express.
    pub fn validate(&self) -> Res<()> {
        if self.duration <= 0.0 {
            return Err(Error::Usage("--duration must be > 0".into()));
        }
        if self.threads > self.connections {
            return Err(Error::Usage(format!(
                "--threads {} needs at least as many --connections (got {})",
                self.threads, self.connections
            )));
        }
        if self.mode == ModeArg::Bulk && self.rate.is_some() {
            return Err(Error::Usage(
                "--rate (open loop) applies to --mode rpc, not bulk".into(),
            ));
        }
        if self.mode == ModeArg::Bulk && self.req_size == 0 {
            return Err(Error::Usage("bulk needs --req-size > 0".into()));
        }
        self.emu
            .validate(self.req_size, self.mode == ModeArg::Bulk)
            .map_err(Error::Usage)?;
        Ok(())
    }

    /// (first connection, count) of thread `t`: connections spread evenly.
    pub fn conns_of(&self, t: u32) -> (u32, u32) {
        let (c, n) = (self.connections, self.threads);
        let base = c / n;
        let extra = c % n;
        let first = t * base + t.min(extra);
        (first, base + u32::from(t < extra))
    }

    /// The arguments that reproduce this workload on a child's command line.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            format!("--req-size={}", self.req_size),
            format!("--resp-size={}", self.resp_size),
            format!("--iodepth={}", self.iodepth),
            format!("--connections={}", self.connections),
            format!("--threads={}", self.threads),
            format!("--duration={}", self.duration),
            format!("--warmup={}", self.warmup),
            format!(
                "--mode={}",
                match self.mode {
                    ModeArg::Rpc => "rpc",
                    ModeArg::Bulk => "bulk",
                }
            ),
        ];
        if let Some(r) = self.rate {
            a.push(format!("--rate={r}"));
        }
        if self.verify {
            a.push("--verify".into());
        }
        if self.mtu != 1500 {
            a.push(format!("--mtu={}", self.mtu));
        }
        if self.memif_zero_copy {
            a.push("--memif-zero-copy".into());
        }
        a.extend(self.emu.to_args());
        a
    }

    /// As JSON (the `config` object of a report).
    pub fn to_json(&self) -> Value {
        json!({
            "mode": match self.mode { ModeArg::Rpc => "rpc", ModeArg::Bulk => "bulk" },
            "req_size": self.req_size,
            "resp_size": self.resp_size,
            "iodepth": self.iodepth,
            "connections": self.connections,
            "threads": self.threads,
            "duration_s": self.duration,
            "warmup_s": self.warmup,
            "rate": self.rate,
            "mtu": self.mtu,
            "memif_zero_copy": self.memif_zero_copy,
            "verify": self.verify,
            "emu": self.emu.to_json(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: `knb server --ip 0.0.0.0` (and broadcast, multicast, loopback, network
    /// addresses) was accepted.
    #[test]
    fn ip_that_is_not_a_host_address_is_a_usage_error() {
        for (ip, len, why) in [
            ("0.0.0.0", 24, "unspecified"),
            ("255.255.255.255", 24, "limited broadcast"),
            ("224.0.0.1", 24, "multicast"),
            ("127.0.0.1", 8, "loopback"),
            ("198.18.0.0", 24, "network address"),
            ("198.18.0.255", 24, "broadcast address of its prefix"),
        ] {
            match check_ip("--ip", ip.parse().unwrap(), len, Stack::Luna) {
                Err(Error::Usage(m)) => {
                    assert!(
                        m.contains("--ip") && m.contains(ip) && m.contains(why),
                        "{m}"
                    )
                }
                other => panic!("{ip}/{len}: {other:?}"),
            }
        }
        let ok = |flag, ip: &str, len, stack| check_ip(flag, ip.parse().unwrap(), len, stack);
        assert!(ok("--server-ip", "198.18.0.2", 24, Stack::Smoltcp).is_ok());
        assert!(ok("--ip", "198.18.0.255", 32, Stack::Luna).is_ok());
        // The kernel has a loopback interface; 0.0.0.0 is still no server address.
        assert!(ok("--server-ip", "127.0.0.1", 8, Stack::Kernel).is_ok());
        assert!(ok("--ip", "0.0.0.0", 24, Stack::Kernel).is_err());
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("64"), Ok(64));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("0"), Ok(0));
        assert!(parse_size("2m").unwrap_err().contains("above the largest"));
        assert!(parse_size("lots").unwrap_err().contains("not a size"));
    }

    /// An open-loop rate is refused unless positive, finite and large enough for the
    /// Poisson gaps to fit a Duration: 1e-30 RPC/s was accepted and panicked the client.
    #[test]
    fn a_rate_too_small_for_the_schedule_is_refused() {
        for bad in [
            "0", "-5", "nan", "inf", "1e-30", "1e-300", "0.0001", "2e9", "x",
        ] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_rate("0.001"), Ok(0.001));
        assert_eq!(parse_rate("50000"), Ok(50_000.0));
        // The smallest rate on the most threads still schedules without overflow.
        let t = std::time::Instant::now();
        let timing = crate::engine::Timing {
            warm_end: t,
            end: t + std::time::Duration::from_secs(1),
        };
        let spec = crate::engine::WorkerSpec {
            first_conn: 0,
            conns: 1,
            req_size: 64,
            resp_size: 64,
            iodepth: 1,
            rate: Some(MIN_RATE / 64.0),
            verify: false,
            mode: Mode::Rpc,
            seed: 1,
            messages: false,
            service: None,
            unordered: false,
        };
        let mut w = crate::engine::ClientWorker::new(spec, timing, Default::default());
        w.tick(t + std::time::Duration::from_millis(1));
        assert!(w.next_arrival().is_some());
    }

    /// A size whose unit multiplication overflows u64 is refused, not wrapped around to
    /// a small size (release) or a panic (debug): 2^54 KiB is 2^64 B, which wrapped to 0.
    #[test]
    fn a_size_that_overflows_is_refused_not_wrapped() {
        assert!(parse_size("18014398509481984k")
            .unwrap_err()
            .contains("above the largest"));
        assert!(parse_size("17592186044416m")
            .unwrap_err()
            .contains("above the largest"));
        assert!(parse_size("18014398509481985kib")
            .unwrap_err()
            .contains("above the largest"));
    }

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(parse_cpus("0"), Ok(Cpus(vec![0])));
        assert_eq!(parse_cpus("1,0"), Ok(Cpus(vec![1, 0])));
        assert_eq!(parse_cpus("0-2,5"), Ok(Cpus(vec![0, 1, 2, 5])));
        assert!(parse_cpus("x").is_err());
        assert!(parse_cpus("3-1").is_err());
    }

    #[test]
    fn memif_buffers_hold_a_whole_frame() {
        assert_eq!(memif_bsize(1500), 2048);
        assert_eq!(memif_bsize(4000), 8192);
        assert_eq!(memif_bsize(9000), 16384);
        for mtu in [576u16, 1500, 1906, 1907, 8000, 9000] {
            assert!(memif_bsize(mtu) >= u32::from(mtu) + 14, "{mtu}");
        }
    }

    #[test]
    fn memif_rings_hold_the_same_bytes_at_every_buffer_size() {
        // DPDK's default at MTU 1500, the same 2 MiB of buffers at MTU 9000 and for raw's
        // 4,166-byte frames.
        assert_eq!(memif_rsize(memif_bsize(1500)), 10);
        assert_eq!(memif_rsize(memif_bsize(9000)), 7);
        assert_eq!(memif_rsize(8192), 8);
        for b in [2048u32, 4096, 8192, 16384] {
            assert_eq!(b << memif_rsize(b), MEMIF_RING_BYTES, "{b}");
        }
        // Bounds: memif takes 2^4 to 2^14 descriptors.
        assert_eq!(memif_rsize(1 << 20), 4);
        assert_eq!(memif_rsize(1), 14);
        assert_eq!(memif_rsize(0), 14);
    }

    #[test]
    fn memif_ring_size_knob_takes_log2_sizes_from_4_to_14() {
        assert_eq!(memif_rsize_from_env(None).unwrap(), None);
        assert_eq!(memif_rsize_from_env(Some("8")).unwrap(), Some(8));
        assert_eq!(memif_rsize_from_env(Some(" 14 ")).unwrap(), Some(14));
        for bad in ["3", "15", "256", "", "x", "-1"] {
            assert!(memif_rsize_from_env(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn connections_spread_evenly_over_threads() {
        let mut w = Workload {
            req_size: 1,
            resp_size: 1,
            iodepth: 1,
            connections: 5,
            threads: 2,
            duration: 1.0,
            warmup: 0.0,
            rate: None,
            verify: false,
            mode: ModeArg::Rpc,
            mtu: 1500,
            memif_zero_copy: false,
            emu: Default::default(),
        };
        assert_eq!(w.conns_of(0), (0, 3));
        assert_eq!(w.conns_of(1), (3, 2));
        w.threads = 6;
        assert!(matches!(w.validate(), Err(Error::Usage(_))));
    }
}
