//! How far apart the host placed the two CPUs a run uses: the machine's "two speeds".
//!
//! On this VM every DPDK stack (luna, smoltcp, the raw memif link) ran at one of two
//! speeds that switched every few minutes whatever we ran, about 2.5× apart
//! (docs/benchmarks.md, "The two speeds explained"). The cause is where the host runs our
//! two virtual CPUs: a cache line handed from one to the other and back takes 60–100 ns
//! when they sit on cores that share a last-level cache, and 330–390 ns when they do not
//! (another core complex or socket). memif is shared memory between the two processes,
//! so every descriptor and every payload byte a stack sends crosses that path: in the far
//! placement the raw 4 KiB round trip falls from ~620k/s to ~210k/s and the stacks with
//! it, while the kernel over veth (one CPU does most of the work) barely moves.
//!
//! knb measures it before and after every run — a cache line bounced between two threads
//! pinned to the client's and the server's first CPU, [`BATCHES`] batches of [`BATCH`]
//! round trips, the fastest batch — and labels the run [`Link::Near`], [`Link::Far`] or
//! [`Link::Changed`] (the placement moved during the run). `knb compare` then gives
//! ratios over the rounds where both stacks ran in the same placement instead of guessing
//! the speed from the RPC rate.
//!
//! The probe runs only between runs (never beside the busy pollers) and takes a few
//! milliseconds; every wait is bounded, so a CPU that never schedules the peer makes the
//! probe fail, not hang.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Round trips per batch.
pub const BATCH: u32 = 2_000;
/// Measured batches (the fastest counts: a preempted batch is only slower).
pub const BATCHES: usize = 5;
/// Round trips for this long before the first batch (both threads running, the vCPUs
/// awake).
const WARMUP: Duration = Duration::from_millis(1);
/// A fastest batch slower than this (ns per round trip) was disturbed throughout: no
/// verdict. Far placements measure 320–390 ns here, cross-socket ones stay under 1 µs.
pub const IMPLAUSIBLE_NS: f64 = 2_000.0;
/// A round trip slower than this (ns) puts the two CPUs far apart. The two placements
/// measured here are 60–100 and 330–390 ns; the threshold sits between them.
pub const FAR_NS: f64 = 200.0;
/// The whole probe gives up after this long (a peer that is never scheduled).
const DEADLINE: Duration = Duration::from_millis(500);

/// Where the host ran the two CPUs during a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Sharing a last-level cache: a cache line round trip under [`FAR_NS`].
    Near,
    /// Apart: at or over [`FAR_NS`].
    Far,
    /// Near before the run and far after it, or the other way round.
    Changed,
}

impl Link {
    /// `near`, `far`, `changed`.
    pub fn name(self) -> &'static str {
        match self {
            Link::Near => "near",
            Link::Far => "far",
            Link::Changed => "changed",
        }
    }

    /// The inverse of [`Link::name`].
    pub fn parse(s: &str) -> Option<Link> {
        match s {
            "near" => Some(Link::Near),
            "far" => Some(Link::Far),
            "changed" => Some(Link::Changed),
            _ => None,
        }
    }

    /// The placement one probe measured.
    pub fn of_ns(ns: f64) -> Link {
        if ns < FAR_NS {
            Link::Near
        } else {
            Link::Far
        }
    }
}

/// The placement of a run from the probes before and after it (either may have failed).
pub fn classify(before: Option<f64>, after: Option<f64>) -> Option<Link> {
    match (before, after) {
        (Some(b), Some(a)) => {
            let (x, y) = (Link::of_ns(b), Link::of_ns(a));
            Some(if x == y { x } else { Link::Changed })
        }
        (Some(x), None) | (None, Some(x)) => Some(Link::of_ns(x)),
        (None, None) => None,
    }
}

/// The line the two threads hand back and forth, alone in its cache lines.
#[repr(align(128))]
struct Line(AtomicU64);

/// Either side's "give up" (its pin failed, or the deadline passed), in lines of its own
/// so that no store of the handshake can overwrite it.
#[repr(align(128))]
struct Stop(AtomicBool);

/// Spins until `line` holds `want` (true), or `stop` is raised or the deadline passes
/// (false).
fn wait_for(line: &AtomicU64, want: u64, stop: &AtomicBool, deadline: Instant) -> bool {
    let mut spins = 0u32;
    loop {
        if line.load(Ordering::Acquire) == want {
            return true;
        }
        spins = spins.wrapping_add(1);
        if spins % 1024 == 0 && (stop.load(Ordering::Relaxed) || Instant::now() >= deadline) {
            return false;
        }
    }
}

/// Raises `stop` (so the other side's waits end) and returns the error.
fn give_up<T>(stop: &AtomicBool, e: String) -> Result<T, String> {
    stop.store(true, Ordering::Relaxed);
    Err(e)
}

/// The cache-line round trip between CPUs `a` and `b` in ns: the fastest of [`BATCHES`]
/// batches of [`BATCH`] round trips after [`WARMUP`] of warm-up. A preemption only slows
/// a batch, so the fastest one is the placement's; a minimum still over
/// [`IMPLAUSIBLE_NS`] means every batch was disturbed, and the probe says so instead of
/// calling the CPUs far apart. Runs two short-lived pinned threads; the calling thread's
/// affinity is not touched.
pub fn round_trip_ns(a: usize, b: usize) -> Result<f64, String> {
    if a == b {
        return Err(format!(
            "client and server share CPU {a}: nothing to measure"
        ));
    }
    let line = Line(AtomicU64::new(0));
    let stop = Stop(AtomicBool::new(false));
    let (line, stop) = (&line.0, &stop.0);
    let deadline = Instant::now() + DEADLINE;
    std::thread::scope(|s| {
        let peer = std::thread::Builder::new()
            .name("knb-probe-peer".into())
            .spawn_scoped(s, move || -> Result<(), String> {
                if let Err(e) = crate::backend::pin(b) {
                    return give_up(stop, e);
                }
                // Answers every odd value with the next even one until told to stop.
                let mut k = 0u64;
                while wait_for(line, 2 * k + 1, stop, deadline) {
                    line.store(2 * k + 2, Ordering::Release);
                    k += 1;
                }
                Ok(())
            })
            .map_err(|e| format!("cannot start the probe's peer thread: {e}"))?;
        let me = std::thread::Builder::new()
            .name("knb-probe".into())
            .spawn_scoped(s, move || -> Result<f64, String> {
                if let Err(e) = crate::backend::pin(a) {
                    return give_up(stop, e);
                }
                let mut k = 0u64;
                let mut round_trip = || -> bool {
                    line.store(2 * k + 1, Ordering::Release);
                    let ok = wait_for(line, 2 * k + 2, stop, deadline);
                    k += 1;
                    ok
                };
                let warm_until = Instant::now() + WARMUP;
                while Instant::now() < warm_until {
                    if !round_trip() {
                        return give_up(
                            stop,
                            format!("CPU {b} did not answer within {DEADLINE:?}"),
                        );
                    }
                }
                let mut best = f64::INFINITY;
                for _ in 0..BATCHES {
                    let t = Instant::now();
                    for _ in 0..BATCH {
                        if !round_trip() {
                            return give_up(
                                stop,
                                format!(
                                    "CPU {b} stopped answering (the probe's {DEADLINE:?} ran out)"
                                ),
                            );
                        }
                    }
                    best = best.min(t.elapsed().as_nanos() as f64 / f64::from(BATCH));
                }
                // Done: release the peer.
                stop.store(true, Ordering::Relaxed);
                if best > IMPLAUSIBLE_NS {
                    return Err(format!(
                        "every batch took over {IMPLAUSIBLE_NS:.0} ns per round trip (fastest \
                         {best:.0} ns): the CPUs were busy, not measured"
                    ));
                }
                Ok(best)
            })
            .map_err(|e| give_up::<f64>(stop, format!("cannot start the probe thread: {e}")));
        let mine = match me {
            Ok(h) => h
                .join()
                .unwrap_or_else(|_| Err("the probe thread panicked".into())),
            Err(e) => e,
        };
        let theirs = peer
            .join()
            .unwrap_or_else(|_| Err("the probe's peer thread panicked".into()));
        theirs.and(mine)
    })
}

/// Waits (bounded) for the two CPUs to be near: calls `probe` until it measures a round
/// trip under [`FAR_NS`] or `max` has passed, sleeping `step` between probes. Returns how
/// long it waited and whether the last probe found them near. A failing probe counts as
/// not near (the wait ends by `max`, never hangs).
pub fn wait_near(
    max: Duration,
    step: Duration,
    mut probe: impl FnMut() -> Result<f64, String>,
    mut sleep: impl FnMut(Duration),
) -> (Duration, bool) {
    let mut waited = Duration::ZERO;
    loop {
        if matches!(probe(), Ok(ns) if ns < FAR_NS) {
            return (waited, true);
        }
        if waited >= max {
            return (waited, false);
        }
        let d = step.min(max - waited);
        sleep(d);
        waited += d;
    }
}

/// `--wait-near SECS` for a run on `cpus` (client, server): [`wait_near`] with the real
/// probe, a probe a second; says on stderr (after `who`) when the CPUs were not near in
/// time. Returns the seconds waited and whether they were near.
pub fn wait_before_run(secs: f64, cpus: (usize, usize), who: &str) -> (f64, bool) {
    let (w, near) = wait_near(
        Duration::from_secs_f64(secs),
        Duration::from_secs(1),
        || round_trip_ns(cpus.0, cpus.1),
        std::thread::sleep,
    );
    if !near {
        eprintln!("{who}: the CPUs were not near within {secs:.0} s; running anyway");
    }
    (w.as_secs_f64(), near)
}

/// The probes around one run: [`Bracket::begin`] right before it, [`Bracket::end`] right
/// after it (while nothing polls).
pub struct Bracket {
    /// (client CPU, server CPU); None: nothing to probe.
    cpus: Option<(usize, usize)>,
    before: Result<f64, String>,
}

impl Bracket {
    fn probe(cpus: Option<(usize, usize)>) -> Result<f64, String> {
        match cpus {
            Some((a, b)) => round_trip_ns(a, b),
            None => Err("no CPUs to probe".into()),
        }
    }

    /// Probes before the run.
    pub fn begin(cpus: Option<(usize, usize)>) -> Bracket {
        Bracket {
            cpus,
            before: Self::probe(cpus),
        }
    }

    /// Probes after the run: the run report's `host_link`.
    pub fn end(self) -> Value {
        to_json(&self.before, &Self::probe(self.cpus))
    }
}

/// `host_link` of a run report from the probes before and after it.
pub fn to_json(before: &Result<f64, String>, after: &Result<f64, String>) -> Value {
    let ns = |r: &Result<f64, String>| r.as_ref().ok().map(|x| (x * 10.0).round() / 10.0);
    let (b, a) = (ns(before), ns(after));
    let errors: Vec<&String> = [before, after]
        .into_iter()
        .filter_map(|r| r.as_ref().err())
        .collect();
    json!({
        "before_ns": b,
        "after_ns": a,
        "far_ns": FAR_NS,
        "mode": classify(b, a).map(Link::name),
        "errors": errors,
    })
}

/// The placement recorded in a run report (None: not measured).
pub fn of_run(r: &Value) -> Option<Link> {
    mode(&r["host_link"])
}

/// The placement of a `host_link` value (None: not measured).
pub fn mode(host_link: &Value) -> Option<Link> {
    host_link["mode"].as_str().and_then(Link::parse)
}

/// `host placement: near (cache-line round trip 71 ns before the run, 75 after)`.
pub fn describe(r: &Value) -> Option<String> {
    let h = r.get("host_link").filter(|h| h.is_object())?;
    let ns = |v: &Value| v.as_f64().map_or("-".into(), |x| format!("{x:.0}"));
    let mode = h["mode"].as_str().unwrap_or("not measured");
    let mut s = format!(
        "host placement of the two CPUs: {mode} (cache-line round trip {} ns before the run, \
         {} after; far from {FAR_NS:.0})",
        ns(&h["before_ns"]),
        ns(&h["after_ns"])
    );
    for e in h["errors"].as_array().into_iter().flatten() {
        s.push_str(&format!("; probe: {}", e.as_str().unwrap_or("")));
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_near_far_or_changed() {
        assert_eq!(classify(Some(71.0), Some(75.0)), Some(Link::Near));
        assert_eq!(classify(Some(355.0), Some(361.0)), Some(Link::Far));
        assert_eq!(classify(Some(75.0), Some(360.0)), Some(Link::Changed));
        assert_eq!(classify(Some(360.0), Some(75.0)), Some(Link::Changed));
        // The threshold itself is far; one failed probe leaves the other's verdict.
        assert_eq!(classify(Some(200.0), None), Some(Link::Far));
        assert_eq!(classify(None, Some(64.0)), Some(Link::Near));
        assert_eq!(classify(None, None), None);
        for l in [Link::Near, Link::Far, Link::Changed] {
            assert_eq!(Link::parse(l.name()), Some(l));
        }
        assert_eq!(Link::parse("fast"), None);
    }

    #[test]
    fn waiting_for_near_is_bounded() {
        let step = Duration::from_secs(1);
        // Far twice, then near: two steps of waiting.
        let mut seen = vec![Ok(75.0), Ok(350.0), Ok(340.0)];
        let mut slept = Duration::ZERO;
        let r = wait_near(
            Duration::from_secs(10),
            step,
            || seen.pop().unwrap(),
            |d| slept += d,
        );
        assert_eq!(r, (Duration::from_secs(2), true));
        assert_eq!(slept, Duration::from_secs(2));
        // Never near (or the probe fails): gives up after max, the last step cut short.
        let mut n = 0;
        let r = wait_near(
            Duration::from_millis(2500),
            step,
            || {
                n += 1;
                if n % 2 == 0 {
                    Err("busy".into())
                } else {
                    Ok(350.0)
                }
            },
            |_| {},
        );
        assert_eq!(r, (Duration::from_millis(2500), false));
        assert_eq!(n, 4);
        // No wait asked: one probe, no sleep.
        let r = wait_near(Duration::ZERO, step, || Ok(350.0), |_| panic!("slept"));
        assert_eq!(r, (Duration::ZERO, false));
    }

    #[test]
    fn a_report_carries_the_probes_and_the_verdict() {
        let v = json!({"host_link": to_json(&Ok(70.04), &Err("CPU 1 did not answer".into()))});
        assert_eq!(v["host_link"]["before_ns"], json!(70.0));
        assert_eq!(v["host_link"]["after_ns"], Value::Null);
        assert_eq!(of_run(&v), Some(Link::Near));
        let d = describe(&v).unwrap();
        assert!(
            d.contains("near") && d.contains("probe: CPU 1 did not answer"),
            "{d}"
        );
        assert_eq!(of_run(&json!({})), None);
        assert_eq!(describe(&json!({})), None);
    }

    #[test]
    fn one_cpu_cannot_be_probed_and_a_missing_cpu_fails_fast() {
        assert!(round_trip_ns(0, 0).is_err());
        let t = Instant::now();
        let e = round_trip_ns(0, 4095).unwrap_err();
        assert!(e.contains("4095"), "{e}");
        assert!(t.elapsed() < DEADLINE * 2, "{:?}", t.elapsed());
    }

    /// On a machine with two CPUs the probe measures something finite and positive
    /// (the value itself depends on the host: not asserted).
    #[test]
    fn two_cpus_give_a_round_trip() {
        if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            return;
        }
        match round_trip_ns(0, 1) {
            Ok(ns) => assert!(ns.is_finite() && ns > 0.0, "{ns}"),
            // A loaded test machine may not schedule the peer in time: a clear error.
            Err(e) => assert!(e.contains("CPU"), "{e}"),
        }
    }
}
