//! Impairments that outlive the process that sets them (the `testbed netem` CLI): the
//! nfqueue engine runs as a detached `testbed impaird` process inside the link's namespace,
//! recorded by a pid file in the state dir so `clear`, `down` and `sweep` can stop it.
//!
//! Setting and clearing need the topology a link belongs to; the records and stopping a
//! daemon do not, and live below the topologies in `records.rs` (re-exported here), so
//! a topology's teardown can stop its links' daemons without importing this module.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{SigSet, Signal};

use crate::error::{Error, Result};
use crate::impair::{self, Backend, Impairment};
use crate::nfq::{enter_netns, Counters, Engine};
use crate::prefix::Prefix;
use crate::records::{log_file, spec_file, terminate};
pub use crate::records::{persistent_impairments, stop_impair_daemon, PersistentImpairment};
use crate::sys;
use crate::topology::{Details, Kind, Topology};

/// Removes the impairment `testbed netem` put on `link` (no error if none).
pub fn clear_persistent(prefix: &Prefix, link: &str) -> Result<()> {
    let kind = Kind::of_link(link).ok_or_else(|| unknown_link(link))?;
    let (ns, iface) = Details::of(kind, prefix).link_target(link)?;
    if sys::netns_exists(&ns) {
        impair::remove_nfqueue_rule(&ns, &iface)?;
    }
    stop_impair_daemon(prefix, link);
    impair::clear_qdisc(&ns, &iface)
}

fn unknown_link(link: &str) -> Error {
    let all: Vec<&str> = Kind::ALL
        .iter()
        .flat_map(|k| k.links().iter().copied())
        .collect();
    Error::UnknownLink {
        scope: "any topology".into(),
        given: link.to_string(),
        valid: all.join(", "),
    }
}

/// Puts `imp` on `link` so that it stays after this process exits. `exe` is the
/// `testbed` binary, started as `exe impaird ...` when the nfqueue engine is needed.
pub fn set_persistent(
    exe: &Path,
    prefix: &Prefix,
    link: &str,
    imp: &Impairment,
) -> Result<Backend> {
    imp.validate()?;
    let kind = Kind::of_link(link).ok_or_else(|| unknown_link(link))?;
    if !Topology::is_up(kind, prefix) {
        return Err(Error::NotUp {
            topology: kind.name(),
            prefix: prefix.to_string(),
        });
    }
    let (ns, iface) = Details::of(kind, prefix).link_target(link)?;
    clear_persistent(prefix, link)?;
    let backend = Backend::select(&ns)?;
    impair::set_qdisc(&ns, &iface, backend, imp)?;
    let mut pid = None;
    if backend == Backend::Nfqueue && imp.needs_engine() {
        let p = spawn_daemon(exe, prefix, link, &ns, imp)?;
        if let Err(e) = impair::install_nfqueue_rule(&ns, &iface) {
            terminate(p);
            return Err(e);
        }
        pid = Some(p);
    }
    let rec = PersistentImpairment {
        link: link.to_string(),
        impairment: imp.clone(),
        backend,
        pid,
    };
    let path = spec_file(prefix, link);
    let json = serde_json::to_string_pretty(&rec)
        .map_err(|e| Error::Engine(format!("serialising impairment: {e}")))?;
    std::fs::write(&path, json).map_err(|e| Error::io_path("writing", &path, e))?;
    Ok(backend)
}

fn spawn_daemon(
    exe: &Path,
    prefix: &Prefix,
    link: &str,
    ns: &str,
    imp: &Impairment,
) -> Result<u32> {
    std::fs::create_dir_all(prefix.state_dir())
        .map_err(|e| Error::io_path("creating state dir", &prefix.state_dir(), e))?;
    let log_path = log_file(prefix, link);
    let log =
        std::fs::File::create(&log_path).map_err(|e| Error::io_path("creating", &log_path, e))?;
    let spec = serde_json::to_string(imp).map_err(|e| Error::Engine(e.to_string()))?;
    let mut child = Command::new(exe)
        .args(["impaird", "--netns", ns, "--spec", &spec])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        // Its own process group: a Ctrl-C at the shell that ran `testbed netem` must not
        // reach it.
        .process_group(0)
        .spawn()
        .map_err(|e| Error::io(format!("starting {} impaird", exe.display()), e))?;
    let stdout = child.stdout.take();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        if let Some(out) = stdout {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        let _ = tx.send(line);
    });
    let pid = child.id();
    match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(line) if line.trim() == "ready" => Ok(pid),
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
            Err(Error::Engine(format!(
                "impairment daemon for {link} did not start: {}",
                tail.trim()
            )))
        }
    }
}

/// Body of `testbed impaird`: runs the engine in `netns` until SIGTERM/SIGINT/SIGHUP.
/// Prints `ready` on stdout once the queue is bound.
pub fn run_daemon(netns: &str, imp: Impairment) -> Result<()> {
    let mut set = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        set.add(s);
    }
    // Blocked before any thread starts, so every thread inherits the mask and only the
    // waiter below receives them.
    set.thread_block()
        .map_err(|e| Error::Engine(format!("blocking signals: {e}")))?;
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    std::thread::spawn(move || {
        let _ = set.wait();
        s2.store(true, Ordering::Relaxed);
    });
    enter_netns(netns)?;
    let counters = Arc::new(Counters::default());
    let engine = Engine::bind(imp, counters.clone())?;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    let r = engine.run(&stop);
    eprintln!("impaird {netns}: {:?}", counters.snapshot());
    r
}
