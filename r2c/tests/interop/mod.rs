//! Helpers of the kernel interoperability suite (`tests/interop_kernel.rs`).
//!
//! Three kinds of process take part in a run:
//! * the parent (the test itself): brings up the testbed's tap topology, impairs the
//!   kernel's egress (testbed NFQUEUE engine), captures with tcpdump on the kernel side
//!   and checks the capture with tshark ([`parent`], [`capture`]);
//! * the luna child: this test binary re-executed inside the tap namespace as a DPDK
//!   process, a `Stack` over a `DpdkDevice` with a minimal poll loop that impairs its own
//!   egress the same way ([`luna`], [`impair`]); it runs the four phases and starts:
//! * the kernel peers: this binary again (no EAL), plain `std::net` sockets in the same
//!   namespace, one per phase ([`kernel`]).
//!
//! Every process reports on stdout with `KEY k=v ...` lines ([`Kv`]).

#[cfg(test)]
mod bugs;
pub mod capture;
pub mod impair;
pub mod kernel;
pub mod luna;
pub mod parent;
pub mod proc;
pub mod report;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::str::FromStr;
use std::time::Duration;

/// Environment variables of the child processes.
pub const ROLE_ENV: &str = "LIO_ROLE";
pub const ARG_ENV: &str = "LIO_ARG";
pub const PORT_ENV: &str = "LIO_PORT";

/// Pattern seeds, one per stream direction and kind.
pub const SEED_BULK_UP: u64 = 0x6c69_6f01; // luna -> kernel bulk
pub const SEED_BULK_DOWN: u64 = 0x6c69_6f02; // kernel -> luna bulk
pub const SEED_REQ: u64 = 0x6c69_6f03; // RPC requests (client -> server)
pub const SEED_RESP: u64 = 0x6c69_6f04; // RPC responses (server -> client)

/// TCP ports of the four phases.
pub const PORT_BULK_LUNA_CLIENT: u16 = 7101;
pub const PORT_BULK_KERNEL_CLIENT: u16 = 7102;
pub const PORT_RPC_LUNA_CLIENT: u16 = 7103;
pub const PORT_RPC_KERNEL_CLIENT: u16 = 7104;

/// Byte `i` of the stream with `seed`: a multiplicative hash of the offset, so a segment
/// delivered at the wrong offset (or twice, or not at all) never matches by accident.
#[inline]
pub fn pattern(seed: u64, i: u64) -> u8 {
    let x = (i ^ seed.rotate_left(40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((x ^ (x >> 32)).wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 56) as u8
}

/// Fills `buf` with the stream bytes at `start..`.
pub fn fill(seed: u64, start: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern(seed, start + i as u64);
    }
}

/// The stream offset of the first byte of `buf` (at `start`) that differs from the pattern.
pub fn mismatch(seed: u64, start: u64, buf: &[u8]) -> Option<u64> {
    buf.iter()
        .enumerate()
        .find(|&(i, &b)| b != pattern(seed, start + i as u64))
        .map(|(i, _)| start + i as u64)
}

/// Impairment of one direction, netem semantics: drop `loss`%, send `duplicate`% twice,
/// flip one bit in `corrupt`% (inside the TCP segment, outside its data offset: a bit the
/// receiver's checksum must catch), hold every packet for `delay ± jitter` (uniform)
/// except `reorder`% which go at once (overtaking the held ones). The same values go to
/// the testbed engine (kernel -> luna) and to the luna child's stage (luna -> kernel).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkImpair {
    pub loss: f64,
    pub reorder: f64,
    pub duplicate: f64,
    /// Percent of TCP frames with one bit flipped after the sender's checksum.
    pub corrupt: f64,
    pub delay: Duration,
    /// At most `delay`; zero keeps the hold queue FIFO.
    pub jitter: Duration,
}

impl LinkImpair {
    /// The acceptance impairment: 2% loss, 25% reorder, 1% duplicate. Reordering needs a
    /// delay for the other 75% to be overtaken: 1 ms.
    pub fn acceptance() -> Self {
        LinkImpair {
            loss: 2.0,
            reorder: 25.0,
            duplicate: 1.0,
            corrupt: 0.0,
            delay: Duration::from_millis(1),
            jitter: Duration::ZERO,
        }
    }
}

/// What one luna child runs: the four phases and their sizes.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Bytes of each bulk phase.
    pub bulk: u64,
    /// RPCs of each RPC phase.
    pub rpcs: u64,
    /// Request and response size.
    pub rpc_size: usize,
    /// RPCs outstanding at once (pipelined on one connection).
    pub depth: usize,
    /// Impairment of both directions, `None` for a clean link.
    pub impair: Option<LinkImpair>,
    /// Seed of luna's egress impairment stage.
    pub seed: u64,
    /// Wall-clock limit of each phase.
    pub phase_limit: Duration,
}

impl Plan {
    /// Encodes as one `k=v` line (passed to the luna child in the environment).
    pub fn encode(&self) -> String {
        let mut kv = Kv::default();
        kv.set("bulk", self.bulk);
        kv.set("rpcs", self.rpcs);
        kv.set("rpc_size", self.rpc_size);
        kv.set("depth", self.depth);
        kv.set("seed", self.seed);
        kv.set("phase_limit_s", self.phase_limit.as_secs());
        if let Some(i) = self.impair {
            kv.set("loss", i.loss);
            kv.set("reorder", i.reorder);
            kv.set("duplicate", i.duplicate);
            kv.set("corrupt", i.corrupt);
            kv.set("delay_us", i.delay.as_micros());
            kv.set("jitter_us", i.jitter.as_micros());
        }
        kv.line("")
    }

    /// Parses [`Plan::encode`]'s output.
    pub fn decode(s: &str) -> Result<Plan, String> {
        let kv = Kv::parse(s);
        let impair = if kv.has("loss") {
            Some(LinkImpair {
                loss: kv.try_get("loss")?,
                reorder: kv.try_get("reorder")?,
                duplicate: kv.try_get("duplicate")?,
                corrupt: kv.try_get("corrupt")?,
                delay: Duration::from_micros(kv.try_get("delay_us")?),
                jitter: Duration::from_micros(kv.try_get("jitter_us")?),
            })
        } else {
            None
        };
        let plan = Plan {
            bulk: kv.try_get("bulk")?,
            rpcs: kv.try_get("rpcs")?,
            rpc_size: kv.try_get("rpc_size")?,
            depth: kv.try_get("depth")?,
            seed: kv.try_get("seed")?,
            phase_limit: Duration::from_secs(kv.try_get("phase_limit_s")?),
            impair,
        };
        if plan.rpc_size == 0 || plan.depth == 0 {
            return Err(format!("rpc_size and depth must be positive in {s:?}"));
        }
        Ok(plan)
    }
}

/// Ordered `key=value` pairs: the report format of every process.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Kv(pub BTreeMap<String, String>);

impl Kv {
    /// Parses whitespace-separated `k=v` words; other words are ignored.
    pub fn parse(line: &str) -> Kv {
        Kv(line
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    pub fn set(&mut self, k: &str, v: impl ToString) {
        self.0.insert(k.to_string(), v.to_string());
    }

    pub fn has(&self, k: &str) -> bool {
        self.0.contains_key(k)
    }

    pub fn try_get<T: FromStr>(&self, k: &str) -> Result<T, String> {
        let v = self.0.get(k).ok_or_else(|| format!("no {k}= in {self}"))?;
        v.parse()
            .map_err(|_| format!("{k}={v} is not a valid value in {self}"))
    }

    /// The value of `k`; panics naming the line when missing.
    pub fn get<T: FromStr>(&self, k: &str) -> T {
        self.try_get(k).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn str(&self, k: &str) -> &str {
        self.0.get(k).map(String::as_str).unwrap_or("")
    }

    /// `head k=v k=v ...`.
    pub fn line(&self, head: &str) -> String {
        let mut s = head.to_string();
        for (k, v) in &self.0 {
            if !s.is_empty() {
                s.push(' ');
            }
            let _ = write!(s, "{k}={v}");
        }
        s
    }
}

impl std::fmt::Display for Kv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.line(""))
    }
}

/// Entry point of every child process (see the module docs).
pub fn role_main() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    let arg = std::env::var(ARG_ENV).unwrap_or_default();
    match role.as_str() {
        "luna" => luna::main(&arg),
        k if k.starts_with("k-") => kernel::main(k, &arg),
        other => panic!("unknown role {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_differs_under_every_small_shift() {
        // A segment delivered 1..=3000 bytes off must not match: count equal bytes.
        let a: Vec<u8> = (0..4096).map(|i| pattern(SEED_BULK_UP, i)).collect();
        for d in 1..3000u64 {
            let same = (0..4096u64)
                .filter(|&i| pattern(SEED_BULK_UP, i + d) == a[i as usize])
                .count();
            assert!(same < 200, "shift {d}: {same} of 4096 bytes equal");
        }
        // Different seeds give different streams.
        let b: Vec<u8> = (0..4096).map(|i| pattern(SEED_BULK_DOWN, i)).collect();
        assert_ne!(a, b);
    }

    #[test]
    fn mismatch_finds_the_first_wrong_byte() {
        let mut buf = vec![0u8; 1000];
        fill(SEED_REQ, 5000, &mut buf);
        assert_eq!(mismatch(SEED_REQ, 5000, &buf), None);
        assert_eq!(mismatch(SEED_REQ, 5001, &buf), Some(5001));
        buf[700] ^= 1;
        assert_eq!(mismatch(SEED_REQ, 5000, &buf), Some(5700));
    }

    #[test]
    fn plan_round_trips_and_bad_plans_are_refused() {
        let mut p = Plan {
            bulk: 32 << 20,
            rpcs: 5000,
            rpc_size: 4096,
            depth: 16,
            impair: Some(LinkImpair::acceptance()),
            seed: 7,
            phase_limit: Duration::from_secs(90),
        };
        assert_eq!(Plan::decode(&p.encode()), Ok(p.clone()));
        p.impair = Some(LinkImpair {
            jitter: Duration::from_micros(300),
            corrupt: 0.1,
            ..LinkImpair::acceptance()
        });
        assert_eq!(Plan::decode(&p.encode()), Ok(p.clone()));
        p.impair = None;
        assert_eq!(Plan::decode(&p.encode()), Ok(p.clone()));
        assert!(Plan::decode("bulk=1").unwrap_err().contains("rpcs"));
        assert!(Plan::decode(&p.encode().replace("depth=16", "depth=0")).is_err());
        assert!(Plan::decode(&p.encode().replace("bulk=", "bulk=x"))
            .unwrap_err()
            .contains("bulk"));
    }

    #[test]
    fn kv_parses_ignores_plain_words_and_names_missing_keys() {
        let kv = Kv::parse("PHASE name=x bytes=10 junk a=b=c");
        assert_eq!(kv.get::<u64>("bytes"), 10);
        assert_eq!(kv.str("name"), "x");
        assert_eq!(kv.str("a"), "b=c");
        assert!(kv.try_get::<u64>("nope").unwrap_err().contains("nope"));
        assert!(kv.try_get::<u64>("name").is_err());
        assert_eq!(Kv::parse(&kv.line("HEAD")), kv);
    }
}
