//! Change → visible-on-every-reader latency (the `nl-latency` benchmark; needs root).
//!
//! In a private [`TestNet`], a syncer thread follows `nl0` and `readers` threads each spin
//! like a core's poll loop (`Reader::refresh` then a check). The driver feeds one `ip`
//! command at a time to `ip -batch -` and waits until every reader sees its effect; the
//! latency of a change is from just before its line is written to the last reader seeing
//! it, so it includes `ip`'s parsing and the kernel. Changes cycle through
//! `neigh replace` (new MAC), `route add`, `route del`, `neigh del`, so each one is a
//! visible state transition. Numbers from a loaded machine are not final.

use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::netns::{TestNet, HOST_IF};
use crate::snapshot::Snapshot;
use crate::syncer::{Interface, SyncConfig, Syncer};
use crate::SyncCounters;

/// How long one change may take to become visible before it is counted lost.
pub const CHANGE_TIMEOUT: Duration = Duration::from_secs(1);

/// What a run measured.
#[derive(Debug, Clone)]
pub struct LatencyReport {
    /// Latency of every change that became visible on every reader, sorted.
    pub samples: Vec<Duration>,
    /// Changes not visible on every reader within [`CHANGE_TIMEOUT`].
    pub lost: usize,
    /// The syncer's counters at the end.
    pub counters: SyncCounters,
}

impl LatencyReport {
    /// The `q`-quantile (0.0..=1.0) of the samples (nearest rank).
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.samples.is_empty() {
            return None;
        }
        let rank = ((q * self.samples.len() as f64).ceil() as usize).clamp(1, self.samples.len());
        Some(self.samples[rank - 1])
    }
}

/// Whether a change is visible in a snapshot.
pub type Check = Box<dyn Fn(&Snapshot) -> bool + Send>;

/// Change `i` of the cycle: the `ip -batch` line for [`HOST_IF`] and the check that it is
/// visible in a snapshot (also used by r2c's `mirror_cores` test, through r2c's cores).
pub fn change(i: usize) -> (String, Check) {
    let slot = (i / 4) % 200;
    let neigh = Ipv4Addr::new(198, 18, 0, 10 + slot as u8);
    let net = Ipv4Addr::new(198, 19, slot as u8, 0);
    let probe = Ipv4Addr::new(198, 19, slot as u8, 1);
    let mac = [2, 0, 0, (i >> 16) as u8, (i >> 8) as u8, i as u8];
    match i % 4 {
        0 => (
            format!(
                "neigh replace {neigh} lladdr {:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x} dev {HOST_IF} nud permanent\n",
                mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]
            ),
            Box::new(move |s: &Snapshot| s.neighbour(neigh).is_some_and(|n| n.mac.0 == mac)),
        ),
        1 => (
            format!("route add {net}/24 via 198.18.0.2 dev {HOST_IF}\n"),
            Box::new(move |s: &Snapshot| s.routes().lookup(probe).is_some()),
        ),
        2 => (
            format!("route del {net}/24\n"),
            Box::new(move |s: &Snapshot| s.routes().lookup(probe).is_none()),
        ),
        _ => (
            format!("neigh del {neigh} dev {HOST_IF}\n"),
            Box::new(move |s: &Snapshot| s.neighbour(neigh).is_none()),
        ),
    }
}

/// Runs `changes` changes with `readers` reader threads.
pub fn run(changes: usize, readers: usize) -> io::Result<LatencyReport> {
    let readers = readers.max(1);
    let net = TestNet::new()?;
    let syncer = net
        .in_host(|| Syncer::open(Interface::Name(HOST_IF.into()), &SyncConfig::default()))?
        .map_err(io::Error::other)?;
    let publisher = syncer.publisher();
    let stop = Arc::new(AtomicBool::new(false));
    let sync_thread = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || syncer.run(&stop))
    };
    // current: the change readers look for (usize::MAX: none); seen[r]: last change reader r saw.
    let current = Arc::new(AtomicUsize::new(usize::MAX));
    let seen: Arc<Vec<AtomicUsize>> =
        Arc::new((0..readers).map(|_| AtomicUsize::new(usize::MAX)).collect());
    let mut handles = Vec::new();
    for r in 0..readers {
        let mut reader = publisher.reader();
        let (stop, current, seen) = (Arc::clone(&stop), Arc::clone(&current), Arc::clone(&seen));
        handles.push(std::thread::spawn(move || {
            let mut when = vec![None; changes];
            let mut checking: Option<(usize, Check)> = None;
            while !stop.load(Ordering::Relaxed) {
                reader.refresh();
                let c = current.load(Ordering::Acquire);
                if c < changes && seen[r].load(Ordering::Relaxed) != c {
                    if checking.as_ref().map(|x| x.0) != Some(c) {
                        checking = Some((c, change(c).1));
                    }
                    if checking.as_ref().is_some_and(|(_, f)| f(reader.snapshot())) {
                        when[c] = Some(Instant::now());
                        seen[r].store(c, Ordering::Release);
                    }
                }
                std::thread::yield_now();
            }
            when
        }));
    }
    let mut child = Command::new("ip")
        .args(["-n", &net.host, "-force", "-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| io::Error::other("no stdin"))?;
    let mut started = Vec::with_capacity(changes);
    let mut lost = 0;
    for i in 0..changes {
        let (cmd, _) = change(i);
        current.store(i, Ordering::Release);
        let t0 = Instant::now();
        stdin.write_all(cmd.as_bytes())?;
        stdin.flush()?;
        started.push(t0);
        while !seen.iter().all(|s| s.load(Ordering::Acquire) == i) {
            if t0.elapsed() > CHANGE_TIMEOUT {
                lost += 1;
                break;
            }
            std::thread::yield_now();
        }
    }
    drop(stdin);
    let _ = child.wait();
    stop.store(true, Ordering::Relaxed);
    let whens: Vec<Vec<Option<Instant>>> = handles
        .into_iter()
        .map(|h| h.join().map_err(|_| io::Error::other("reader panicked")))
        .collect::<io::Result<_>>()?;
    sync_thread
        .join()
        .map_err(|_| io::Error::other("syncer panicked"))?
        .map_err(io::Error::other)?;
    let mut samples = Vec::with_capacity(changes);
    for (i, t0) in started.iter().enumerate() {
        let last = whens.iter().map(|w| w[i]).collect::<Option<Vec<_>>>();
        if let Some(ts) = last {
            if let Some(max) = ts.into_iter().max() {
                samples.push(max.saturating_duration_since(*t0));
            }
        }
    }
    samples.sort();
    let counters = *publisher.current().counters();
    Ok(LatencyReport {
        samples,
        lost,
        counters,
    })
}
