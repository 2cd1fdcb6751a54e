//! packetdrill-syntax conformance scripts for luna-stack: one test per script in
//! `tests/packetdrill/scripts/`, plus tests of the runner itself (parse errors name the
//! line, wrong expectations fail with expected vs actual packets, nothing panics).
//!
//! Run one script: `cargo test -p luna-stack --test packetdrill -- <name>`; the table of
//! all: `cargo test -p luna-stack --test packetdrill -- table --nocapture`.

#[path = "packetdrill/mod.rs"]
mod packetdrill;

use packetdrill::{manifest, run_text, scripts_dir, ExpectedFailure};
use std::time::Instant as WallClock;

/// Run one script and hold it to the manifest: it must pass, or fail exactly where the
/// manifest says luna's bug shows.
fn check(name: &str) -> Result<String, String> {
    let path = scripts_dir().join(format!("{name}.pkt"));
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let expected = manifest()?.get(name).cloned();
    let r = run_text(&text);
    match (r, expected) {
        (Ok(o), None) => Ok(format!(
            "pass ({} events, {} frames in, {} out, virtual {:?})",
            o.events, o.frames_in, o.frames_out, o.end
        )),
        (Err(f), None) => Err(format!(
            "{name}.pkt:{} (seed {:#x}): {}",
            f.error.line, f.seed, f.error.msg
        )),
        (Err(f), Some(ExpectedFailure { line, rfc, .. })) if f.error.line == line => {
            Ok(format!("expected failure at line {line} ({rfc})"))
        }
        (Err(f), Some(x)) => Err(format!(
            "{name}.pkt: the manifest expects a failure at line {} but it failed at line {}: {}",
            x.line, f.error.line, f.error.msg
        )),
        (Ok(_), Some(x)) => Err(format!(
            "{name}.pkt now passes but expected_failures.txt lists it (line {}, {}): the bug is \
             fixed, delete the entry",
            x.line, x.rfc
        )),
    }
}

macro_rules! scripts {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                if let Err(e) = check(stringify!($name)) {
                    panic!("{e}");
                }
            }
        )*
        const SCRIPTS: &[&str] = &[$(stringify!($name)),*];
    };
}

scripts! {
    ack_of_unsent_data,
    ack_too_old,
    challenge_ack_rate_limit,
    close_active,
    close_active_fin_ack_together,
    close_passive,
    close_simultaneous,
    close_with_unread_data_rst,
    data_after_close_rst,
    delayed_ack_off_default,
    delayed_ack_on,
    dupack_needs_same_window,
    fast_retransmit,
    fin_retransmitted_on_rto,
    fin_wait2_orphan_timeout,
    handshake_active,
    handshake_active_blocking,
    handshake_passive,
    handshake_passive_no_options,
    initial_window,
    keepalive,
    listener_rst,
    mss_default_and_mtu_clamp,
    mss_zero,
    nagle_off_by_default,
    nagle_on,
    newreno_partial_ack,
    ooo_fin,
    ooo_immediate_sack,
    oow_ack_rate_limit,
    out_of_window_data,
    overlapping_segments,
    paws,
    persist_window_opens,
    receive_window_full,
    rst_challenge_ack,
    rto_backoff,
    rto_loss_window,
    rto_syn_backoff,
    sack_recovery,
    sender_sws_avoidance,
    seq_wraparound,
    simultaneous_open,
    syn_backlog_full_no_cookies,
    syn_cookie_no_timestamps,
    syn_cookies,
    syn_in_established,
    syn_received_bad_ack_rst,
    syn_received_dup_syn,
    syn_received_rst,
    syn_sent_ignores_bare_ack,
    syn_sent_rst_refused,
    time_wait_expires,
    time_wait_ignores_rst,
    time_wait_syn_reuse,
    window_scaling,
    zero_window_data_in_flight,
    zero_window_probe,
}

#[test]
fn every_script_is_registered() {
    let mut on_disk: Vec<String> = std::fs::read_dir(scripts_dir())
        .expect("scripts directory")
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "pkt").then(|| p.file_stem()?.to_str().map(str::to_string))?
        })
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = SCRIPTS.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "add new scripts to the scripts! list");
    for name in manifest().expect("manifest parses").keys() {
        assert!(
            listed.contains(name),
            "expected_failures.txt names unknown script {name}"
        );
    }
}

/// All scripts in one table (what CI logs show with --nocapture).
#[test]
fn table() {
    let mut failed = Vec::new();
    println!("{:<40} {:>9}  result", "script", "wall ms");
    for name in SCRIPTS {
        let t = WallClock::now();
        let r = check(name);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        match r {
            Ok(s) => println!("{name:<40} {ms:>9.1}  {s}"),
            Err(e) => {
                println!("{name:<40} {ms:>9.1}  FAIL");
                failed.push(e);
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

#[test]
#[ignore]
fn lpd_adhoc() {
    let p = std::env::var("LPD_SCRIPT").expect("LPD_SCRIPT");
    let text = std::fs::read_to_string(p).unwrap();
    match run_text(&text) {
        Ok(o) => println!("pass {o:?}"),
        Err(f) => panic!("line {}: {}", f.error.line, f.error.msg),
    }
}
