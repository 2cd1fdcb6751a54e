//! packetdrill-syntax conformance scripts for luna-stack: one test per script in
//! `tests/packetdrill/scripts/`, plus tests of the runner itself (parse errors name the
//! line, wrong expectations fail with expected vs actual packets, nothing panics).
//!
//! Run one script: `cargo test -p luna-stack --test packetdrill -- <name>`; the counts of
//! all, per directory: `cargo test -p luna-stack --test packetdrill -- pass_counts --nocapture`.

#[path = "packetdrill/mod.rs"]
mod packetdrill;

#[path = "packetdrill/corpus/mod.rs"]
mod corpus;

use packetdrill::engine::RunOptions;
use packetdrill::{manifest, run_text, run_text_with, script, scripts_dir, ExpectedFailure};
use proptest::prelude::*;

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
    closing_fin_retransmit,
    data_after_close_rst,
    delayed_ack_off_default,
    dsack_rfc2883_4,
    delayed_ack_on,
    dupack_needs_same_window,
    ecn_setup_syn_not_negotiated,
    fast_retransmit,
    fin_retransmitted_on_rto,
    fin_wait2_orphan_timeout,
    handshake_active,
    handshake_active_blocking,
    handshake_passive,
    handshake_passive_no_options,
    icmp_frag_needed,
    icmp_port_unreachable_syn_received,
    icmp_port_unreachable_syn_sent,
    icmp_soft_errors_established,
    initial_window,
    keepalive,
    last_ack_rst,
    listen_syn_fin_syn_rst_rfc9293_3_10_7_2,
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
    peer_window_shrinks,
    persist_window_opens,
    rack_reordering_timer,
    receive_window_full,
    recv_peek,
    rst_challenge_ack,
    rst_with_data,
    rto_backoff,
    rto_loss_window,
    rto_skips_sacked,
    rto_syn_backoff,
    sack_recovery,
    sender_sws_avoidance,
    seq_wraparound,
    simultaneous_open,
    syn_backlog_full_no_cookies,
    syn_cookie_no_timestamps,
    syn_cookies,
    syn_in_established,
    syn_no_ts_established_rfc5961_4_2,
    syn_received_bad_ack_rst,
    syn_received_dup_syn,
    syn_received_rst,
    syn_retries_exhausted,
    syn_sent_ignores_bare_ack,
    syn_sent_rst_refused,
    stray_ack_rst_limit,
    time_wait_expires,
    time_wait_ignores_rst,
    time_wait_in_window_ack,
    time_wait_reopen_by_seq,
    time_wait_syn_no_timestamps,
    time_wait_syn_reuse,
    time_wait_syn_timestamps,
    tlp_off_rto,
    tlp_tail_loss,
    ts_recent_hole,
    upstream_sockopts,
    upstream_state_checks,
    upstream_sysctl_shell,
    window_scaling,
    zero_window_data_in_flight,
    zero_window_probe,
    zero_window_rst,
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
    let generated = corpus::names();
    for name in manifest().expect("manifest parses").keys() {
        assert!(
            listed.contains(name) || generated.contains(name),
            "expected_failures.txt names unknown script {name}"
        );
    }
}

/// Every script, hand-written and generated, says in its header comment what it proves:
/// an RFC section (`RFC <number>`), or, for the few that test no RFC rule, the reason
/// (`No RFC rule: ...`).
#[test]
fn every_script_states_its_rfc_or_a_reason() {
    let mut files = Vec::new();
    pkt_files(&scripts_dir(), &mut files);
    pkt_files(&corpus::corpus_dir(), &mut files);
    assert!(files.len() >= 476, "{} scripts", files.len());
    let mut missing = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("script readable");
        let header: Vec<&str> = text
            .lines()
            .take_while(|l| {
                let l = l.trim_start();
                l.is_empty() || l.starts_with("//") || l.starts_with("/*") || l.starts_with('*')
            })
            .collect();
        if !header
            .iter()
            .any(|l| cites_rfc(l) || l.contains("No RFC rule:"))
        {
            missing.push(f.display().to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "scripts whose header names no RFC section and gives no reason:\n{}",
        missing.join("\n")
    );
}

/// Whether `line` cites an RFC: `RFC` followed by a number.
fn cites_rfc(line: &str) -> bool {
    line.match_indices("RFC").any(|(i, _)| {
        line[i + 3..]
            .trim_start()
            .starts_with(|c: char| c.is_ascii_digit())
    })
}

/// The pass count `make test` prints (`-- pass_counts --nocapture`): every hand-written
/// script and every generated one, run once each, counted per directory as passed /
/// failed / skipped / expected-fail (the manifest's). Fails naming every script that
/// does not behave as the manifest says; a skip fails too (our own scripts must run).
/// `cargo test --workspace` (make test) skips this test and runs it alone with the output
/// shown; the generated families have no other test in a default run (`family_*` are
/// ignored), so the corpus runs once.
#[test]
fn pass_counts() {
    let xfail = manifest().expect("manifest parses");
    let mut rows = Vec::new();
    let mut hand = corpus::Tally::default();
    for name in SCRIPTS {
        let text = script_text(name);
        hand.add(corpus::judge(name, &text, &xfail));
    }
    rows.push(("scripts".to_string(), hand));
    for fam in corpus::FAMILIES {
        rows.push((format!("corpus/{fam}"), corpus::tally_family(fam)));
    }
    let mut all = corpus::Tally::default();
    println!("packetdrill scripts (luna-stack/tests/packetdrill):");
    println!("{}", corpus::TALLY_HEADER);
    for (dir, t) in &rows {
        println!("{}", t.row(dir));
        all.passed += t.passed;
        all.failed += t.failed;
        all.skipped += t.skipped;
        all.expected_fail += t.expected_fail;
        all.problems.extend(t.problems.iter().cloned());
    }
    println!("{}", all.row("total"));
    assert!(all.problems.is_empty(), "{}", all.problems.join("\n\n"));
}

/// Author's tool: run any script file, e.g.
/// `LPD_SCRIPT=/tmp/x.pkt LPD_TRACE=1 cargo test -p luna-stack --test packetdrill -- --ignored run_script_from_env --nocapture`.
#[test]
#[ignore = "tool for script authors: needs LPD_SCRIPT=<path>"]
fn run_script_from_env() {
    let path = std::env::var("LPD_SCRIPT").expect("set LPD_SCRIPT to a .pkt file");
    let text = std::fs::read_to_string(&path).expect("LPD_SCRIPT is readable");
    match run_text(&text) {
        Ok(o) => println!("{path}: pass ({o:?})"),
        Err(f) => panic!(
            "{path}:{} (seed {:#x}): {}",
            f.error.line, f.seed, f.error.msg
        ),
    }
}

/// Run `text` with `opts`, expecting it to be skipped at `line` for a reason containing
/// `needle`.
fn expect_skip_with(opts: &RunOptions, text: &str, line: usize, needle: &str) {
    match run_text_with(text, opts) {
        Ok(_) => panic!("expected a skip at line {line} ({needle}), the script passed:\n{text}"),
        Err(f) => assert!(
            f.error.line == line && f.error.msg.contains(needle) && f.error.skip,
            "expected a skip at line {line} containing {needle:?}, got line {} (skip: {}): {}\n\
             --- script:\n{text}",
            f.error.line,
            f.error.skip,
            f.error.msg
        ),
    }
}

fn expect_skip(text: &str, line: usize, needle: &str) {
    expect_skip_with(&RunOptions::default(), text, line, needle)
}

/// Run `text`, expecting a failure at `line` whose message contains `needle`.
fn expect_error(text: &str, line: usize, needle: &str) {
    match run_text(text) {
        Ok(_) => panic!("expected an error at line {line} ({needle}), the script passed:\n{text}"),
        Err(f) => assert!(
            f.error.line == line && f.error.msg.contains(needle) && !f.error.skip,
            "expected line {line} containing {needle:?}, got line {}: {}\n--- script:\n{text}",
            f.error.line,
            f.error.msg
        ),
    }
}

const SOCKET: &str = "0 socket(..., SOCK_STREAM, IPPROTO_TCP) = 3\n";
const LISTEN: &str = "0 socket(..., SOCK_STREAM, IPPROTO_TCP) = 3\n+0 bind(3, ..., ...) = 0\n\
                      +0 listen(3, 1) = 0\n";

#[test]
fn unsupported_and_malformed_lines_name_the_line() {
    let cases: &[(String, usize, &str)] = &[
        ("/* never closed\n0 socket(..., SOCK_STREAM, IPPROTO_TCP) = 3".into(), 1, "unterminated"),
        (format!("{SOCKET}--tolerance_usecs=1"), 2, "before the first event"),
        ("--bogus_option=1\n0 socket(..., SOCK_STREAM, IPPROTO_TCP) = 3".into(), 1, "unknown header option"),
        ("--luna_rcv_buf=lots\n0 socket(..., SOCK_STREAM, IPPROTO_TCP) = 3".into(), 1, "bad number"),
        ("0.1234567 socket(..., SOCK_STREAM, IPPROTO_TCP) = 3".into(), 1, "6 decimals"),
        ("-1 socket(..., SOCK_STREAM, IPPROTO_TCP) = 3".into(), 1, "negative times"),
        (format!("{SOCKET}0.5 socket(..., SOCK_STREAM, IPPROTO_TCP) = 4\n0.1 socket(..., SOCK_STREAM, IPPROTO_TCP) = 5"), 3, "before the previous event"),
        ("* socket(..., SOCK_STREAM, IPPROTO_TCP) = 3".into(), 1, "only for outbound"),
        (format!("{LISTEN}* < S 0:0(0) win 100"), 4, "only for outbound"),
        (format!("{LISTEN}0...0.1 < S 0:0(0) win 1"), 4, "only system calls"),
        (format!("{LISTEN}+0 < Q 0:0(0) win 100"), 4, "unknown TCP flag"),
        (format!("{LISTEN}+0 < SS 0:0(0) win 100"), 4, "repeated"),
        (format!("{LISTEN}+0 < S 0:10(5) win 100"), 4, "does not span"),
        (format!("{LISTEN}+0 < S 0:0(0) win 70000"), 4, "out of range"),
        (format!("{LISTEN}+0 < . 1:1(0) win 100"), 4, "needs `ack N`"),
        (format!("{LISTEN}+0 < S 0:0(0)"), 4, "needs `win N`"),
        (format!("{LISTEN}+0 < S 0:0(0) win 100 <...>"), 4, "only meaningful on outbound"),
        (format!("{LISTEN}+0 < S 0:0(0) win 100 <mss 1460,sackOK>"), 4, "not a multiple of 4"),
        (format!("{LISTEN}+0 < S 0:0(0) win 100 <mss 1460"), 4, "unterminated option list"),
        (format!("{LISTEN}+0 < S 0:0(0) win 100 <sack 1:2 3:4 5:6 7:8 9:10>"), 4, "at most 4"),
        (format!("{LISTEN}+0 > S. 0:0(0) ecn 1"), 4, "unsupported packet keyword"),
        (format!("{SOCKET}+0 close(3) = -1"), 2, "needs an errno name"),
        (format!("{SOCKET}+0 close(3) = 0 EBADF"), 2, "only with a -1"),
        (format!("{SOCKET}+0 close(3) = 0 junk junk"), 2, "after the return value"),
        (format!("{SOCKET}+0 close(3) = -1 EFOO"), 2, "unknown errno"),
        ("0 socket(..., SOCK_DGRAM, IPPROTO_UDP) = 3".into(), 1, "SOCK_STREAM"),
        (format!("{SOCKET}+0 shutdown(3, SHUT_RD) = 0"), 2, "SHUT_RD"),
        (format!("{LISTEN}+0 accept(3, ..., ...) = 4"), 4, "would block"),
        (format!("{LISTEN}+0 getsockopt(3, SOL_TCP, TCP_INFO, {{tcpi_bogus=1}}, [...]) = 0"), 4, "not supported"),
        (format!("{LISTEN}+0 listen(3, 1) = 0"), 4, "returned -1 EINVAL, expected 0"),
        ("--luna_mss=10\n0 socket(..., SOCK_STREAM, IPPROTO_TCP) = 3\n+0 bind(3, ..., ...) = 0\n+0 listen(3, 1) = 0".into(), 4, "rejected the configuration"),
        (format!("{LISTEN}+0...0.5 accept(3, ..., ...) = 4"), 4, "still blocked at the end"),
        (format!("{LISTEN}+0...0.5 accept(3, ..., ...) = 4\n+1 < S 0:0(0) win 100"), 4, "did not return by 0.500000"),
    ];
    for (text, line, needle) in cases {
        expect_error(text, *line, needle);
    }
}

/// Valid upstream syntax luna cannot run is a skip naming the line and the reason, never a
/// pass and never a failure.
#[test]
fn unsupported_upstream_features_skip_with_the_reason() {
    let cases: &[(String, usize, &str)] = &[
        (
            format!("{SOCKET}+0 `echo hi`"),
            2,
            "shell command `echo hi` is not supported",
        ),
        ("%{ print(1) }%".into(), 1, "python"),
        (
            format!("{LISTEN}+0 < S 0:0(0) win 100 <md5 abc>"),
            4,
            "unsupported TCP option",
        ),
        (format!("{LISTEN}+0 < udp (100)"), 4, "TCP only"),
        (
            format!("{SOCKET}+0 epoll_create(1) = 4"),
            2,
            "not supported",
        ),
        (
            format!("{SOCKET}+0 setsockopt(3, SOL_TCP, TCP_CONGESTION, [1], 4) = 0"),
            2,
            "not supported",
        ),
        (
            format!("{LISTEN}+0 setsockopt(3, SOL_TCP, TCP_NODELAY, [0], 4) = 0"),
            4,
            "per-socket",
        ),
        (
            "--ip_version=ipv6\n0 socket(..., SOCK_STREAM, IPPROTO_TCP) = 3".into(),
            1,
            "IPv4 only",
        ),
        (
            format!("{SOCKET}+0 `sysctl -q net.ipv4.tcp_frto=2`"),
            2,
            "tcp_frto: no luna counterpart",
        ),
        (
            format!("{SOCKET}+0 `sysctl -w net.inet.tcp.insecure_rst=1`"),
            2,
            "RFC 5961",
        ),
        (
            format!("{SOCKET}+0 `sysctl -q net.ipv4.tcp_early_retrans=2`"),
            2,
            "early retransmit (RFC 5827) is not in luna",
        ),
        (
            format!("{SOCKET}+0 `sysctl -q net.ipv4.tcp_recovery=3`"),
            2,
            "only on (1) and off (0)",
        ),
        (
            format!("{SOCKET}+0 `sysctl -q net.ipv4.tcp_sack=1; nstat > /dev/null`"),
            2,
            "`nstat`",
        ),
        (
            format!("`../common/defaults.sh\n../common/set_sysctls.py /proc/sys/x=1`\n{SOCKET}"),
            1,
            "set_sysctls.py",
        ),
        (
            format!("{LISTEN}+0 `sysctl -q net.ipv4.tcp_sack=0`"),
            4,
            "fixed once the stack runs",
        ),
        (
            format!(
                "{SOCKET}+0 setsockopt(3, SOL_SOCKET, SO_LINGER, {{l_onoff=1, l_linger=5}}, 8) = 0"
            ),
            2,
            "never blocks",
        ),
        (
            format!("{SOCKET}+0 setsockopt(3, SOL_IP, IP_TTL, [3], 4) = 0"),
            2,
            "TTL is 64",
        ),
        (
            format!("{SOCKET}+0 setsockopt(3, SOL_TCP, TCP_NOOPT, [1], 4) = 0"),
            2,
            "always sends its options",
        ),
        (
            format!("{SOCKET}+0 getsockopt(3, SOL_TCP, TCP_CONGESTION, [1], [4]) = 0"),
            2,
            "not supported",
        ),
        (
            format!("{LISTEN}+0 > icmp unreachable port_unreachable"),
            4,
            "no ICMP errors",
        ),
        (format!("{LISTEN}+0 < (hlim 3) S 0:0(0) win 100"), 4, "IPv6"),
        (
            format!("{LISTEN}+0 > S. ...(0) ack 1 <...>/udp(9811 > 2)"),
            4,
            "encapsulation",
        ),
        (
            format!("{LISTEN}+0 `ss -tn state syn-recv | grep -c foo`"),
            4,
            "not answerable",
        ),
        (
            "0 socket(..., SOCK_STREAM, IPPROTO_TCP) = 3\n%{\nassert 1\n}%".into(),
            2,
            "python",
        ),
    ];
    for (text, line, needle) in cases {
        expect_skip(text, *line, needle);
    }
}

fn script_text(name: &str) -> String {
    std::fs::read_to_string(scripts_dir().join(format!("{name}.pkt"))).expect("script exists")
}

/// Replace the first `from` after the start of 1-based line `line` with `to`.
fn edit_line(text: &str, line: usize, from: &str, to: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    assert!(
        lines[line - 1].contains(from),
        "line {line} has no {from:?}"
    );
    lines[line - 1] = lines[line - 1].replacen(from, to, 1);
    lines.join("\n")
}

#[test]
fn wrong_expectations_fail_with_script_and_actual_packets() {
    let base = script_text("handshake_passive_no_options");
    assert!(run_text(&base).is_ok());
    let syn_ack = 8; // `> S. 0:0(0) ack 1 win 65535 <mss 1460>`
    for (from, to, needle) in [
        ("ack 1", "ack 2", "ack 1 != expected 2"),
        ("win 65535", "win 65534", "win 65535 != expected 65534"),
        (
            "<mss 1460>",
            "<mss 1400>",
            "`mss 1460` != expected `mss 1400`",
        ),
        (
            "<mss 1460>",
            "<mss 1460,nop,nop,sackOK>",
            "1 options, expected 4",
        ),
        ("S.", "S", "flags S. != expected S"),
        ("+0 ", "+.2 ", "outbound packet timing"),
    ] {
        let text = edit_line(&base, syn_ack, from, to);
        expect_error(&text, syn_ack, needle);
        let msg = run_text(&text).unwrap_err().error.msg;
        assert!(
            msg.contains("script packet:") && msg.contains("actual packet:"),
            "{msg}"
        );
    }
    // A packet luna never sends, one it sends that nobody expects, a wrong return value.
    let trimmed = base.trim_end();
    let last = trimmed.lines().count();
    expect_error(
        &format!("{trimmed}\n+0 > . 1:1(0) ack 1"),
        last + 1,
        "luna sent nothing",
    );
    let lines: Vec<&str> = base.lines().collect();
    let dropped = [&lines[..syn_ack - 1], &lines[syn_ack..]]
        .concat()
        .join("\n");
    expect_error(&dropped, syn_ack, "unexpected packet");
    expect_error(
        &edit_line(&base, 10, "= 4", "= 5"),
        10,
        "accept returned 4, expected 5",
    );
    // Data must be exactly what was written: luna cannot send bytes beyond the write.
    expect_error(
        &edit_line(&base, 11, "2500) = 2500", "2400) = 2400"),
        14,
        "payload length",
    );
}

/// Every expected packet of every passing script constrains luna: deleting any `>` line or
/// changing its seq, ack or window makes the script fail. A surviving mutant means the
/// script (or the runner) checks less than it claims.
#[test]
fn every_outbound_line_is_load_bearing() {
    let xfail = manifest().expect("manifest");
    let mut survivors = Vec::new();
    let mut mutants = 0;
    for name in SCRIPTS.iter().filter(|n| !xfail.contains_key(**n)) {
        let text = script_text(name);
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let Ok(s) = script::parse(l) else { continue };
            let Some(ev) = s.events.first() else { continue };
            let script::EventKind::Packet(p) = &ev.kind else {
                continue;
            };
            if p.dir != script::Direction::Outbound {
                continue;
            }
            // Deleting a line moves every later relative time, so only lines at `+0` or an
            // absolute time are deleted; every line gets its flags, ack, window, seq changed.
            let mut variants = Vec::new();
            if matches!(ev.time, script::Time::Rel(0) | script::Time::Abs(_)) {
                variants.push([&lines[..i], &lines[i + 1..]].concat().join("\n"));
            }
            let mut tweak = |from: String, to: String| {
                let mut v: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
                v[i] = v[i].replacen(&from, &to, 1);
                variants.push(v.join("\n"));
            };
            if let Some(a) = p.ack {
                tweak(format!("ack {a}"), format!("ack {}", a.wrapping_add(1)));
            }
            if let Some(w) = p.win {
                tweak(format!("win {w}"), format!("win {}", w ^ 1));
            }
            let psh_toggled = packetdrill::packet::flags_str(p.flags ^ script::flag::PSH);
            tweak(
                format!("{} ", packetdrill::packet::flags_str(p.flags)),
                format!("{psh_toggled} "),
            );
            if p.flags & script::flag::SYN == 0 {
                let end = p.seq.wrapping_add(p.len);
                tweak(
                    format!("{}:{}(", p.seq, end),
                    format!("{}:{}(", p.seq.wrapping_add(1), end.wrapping_add(1)),
                );
            }
            for v in variants {
                mutants += 1;
                if run_text(&v).is_ok() {
                    survivors.push(format!("{name}.pkt:{}: {l}", i + 1));
                }
            }
        }
    }
    assert!(mutants > 300, "only {mutants} mutants");
    assert!(
        survivors.is_empty(),
        "mutants that still pass:\n{}",
        survivors.join("\n")
    );
}

/// Random edits of a script's text: delete, duplicate, swap or re-time lines, or replace a
/// number.
fn mangle(text: &str, edits: &[(usize, u8, u32)]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for &(at, op, v) in edits {
        if lines.is_empty() {
            break;
        }
        let i = at % lines.len();
        match op {
            0 => {
                lines.remove(i);
            }
            1 => {
                let l = lines[i].clone();
                lines.insert(i, l);
            }
            2 => {
                let j = (at / 7) % lines.len();
                lines.swap(i, j);
            }
            3 => {
                // Re-time the line: any time form on any statement.
                const TIMES: [&str; 6] =
                    ["*", "+0...0.1", "0", "+1000", "+.5...+.1", "3599.999999"];
                let l = lines[i].trim_start();
                let rest = l.find(char::is_whitespace).map_or("", |k| &l[k..]);
                lines[i] = format!("{}{rest}", TIMES[v as usize % TIMES.len()]);
            }
            _ => {
                // Replace the n-th run of digits on the line with `v`.
                let l = &lines[i];
                let runs: Vec<(usize, usize)> = l
                    .char_indices()
                    .filter(|&(j, c)| {
                        c.is_ascii_digit() && (j == 0 || !l.as_bytes()[j - 1].is_ascii_digit())
                    })
                    .map(|(j, _)| {
                        let end = l[j..]
                            .find(|c: char| !c.is_ascii_digit())
                            .map_or(l.len(), |e| j + e);
                        (j, end)
                    })
                    .collect();
                if let Some(&(a, b)) = runs.get((at / 3) % runs.len().max(1)) {
                    lines[i] = format!("{}{}{}", &l[..a], v, &l[b..]);
                }
            }
        }
    }
    lines.join("\n")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Arbitrary text gives a parse result or an error naming a line, never a panic.
    #[test]
    fn parser_never_panics(text in "\\PC{0,300}") {
        if let Err(e) = script::parse(&text) {
            prop_assert!(e.line >= 1 && e.line <= text.lines().count().max(1));
        }
    }

    /// Mangled real scripts (lines dropped, repeated, swapped, numbers changed) run to a
    /// pass or an error, never a panic or a hang, in the runner or in luna.
    #[test]
    fn mangled_scripts_never_panic(
        which in 0..SCRIPTS.len(),
        edits in proptest::collection::vec((any::<usize>(), 0u8..5, any::<u32>()), 1..5),
    ) {
        let text = mangle(&script_text(SCRIPTS[which]), &edits);
        let _ = run_text(&text);
    }
}

/// The verdict on one script of another stack's corpus.
enum Verdict {
    Pass,
    Fail(usize, String),
    Skip(usize, String),
}

/// A reason without its numbers, so that the same cause groups across scripts.
fn reason_class(msg: &str) -> String {
    let first = msg.lines().next().unwrap_or("");
    let mut out = String::new();
    let mut in_num = false;
    for c in first.chars() {
        if c.is_ascii_digit() {
            if !in_num {
                out.push('N');
            }
            in_num = true;
        } else {
            in_num = false;
            out.push(c);
        }
    }
    out.chars().take(110).collect()
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn pkt_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            pkt_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "pkt") {
            out.push(p);
        }
    }
}

/// Run another stack's corpus: every `.pkt` under `LPD_DIR`, with `LPD_ARGS`
/// (`--profile=linux|bsd --peer=luna|linux|bsd --lenient --define=A,B --json --list`).
/// Prints passed / failed / skipped per directory and the commonest reasons, e.g.
/// `LPD_DIR=/tmp/pd/gtests/net/tcp LPD_ARGS="--lenient" cargo test -p luna-stack --test packetdrill -- --ignored run_dir --nocapture`.
#[test]
#[ignore = "tool for outside testers: needs LPD_DIR=<directory of .pkt scripts>"]
fn run_dir() {
    let root = std::path::PathBuf::from(std::env::var("LPD_DIR").expect("set LPD_DIR"));
    let args = std::env::var("LPD_ARGS").unwrap_or_default();
    let (opts, rest) = RunOptions::from_args(args.split_whitespace()).expect("LPD_ARGS");
    let json = rest.iter().any(|a| a == "--json");
    let list = rest.iter().any(|a| a == "--list");
    if let Some(bad) = rest
        .iter()
        .find(|a| !matches!(a.as_str(), "--json" | "--list"))
    {
        panic!("unknown LPD_ARGS argument {bad}");
    }
    let mut files = Vec::new();
    pkt_files(&root, &mut files);
    assert!(!files.is_empty(), "no .pkt files under {}", root.display());
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut results = Vec::new();
    for f in &files {
        let text = String::from_utf8_lossy(&std::fs::read(f).expect("readable")).into_owned();
        let r = std::panic::catch_unwind(|| run_text_with(&text, &opts));
        let v = match r {
            Ok(Ok(_)) => Verdict::Pass,
            Ok(Err(e)) if e.error.skip => Verdict::Skip(e.error.line, e.error.msg),
            Ok(Err(e)) => Verdict::Fail(e.error.line, e.error.msg),
            Err(p) => {
                let what = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Verdict::Fail(0, format!("panic (luna or runner bug): {what}"))
            }
        };
        let rel = f.strip_prefix(&root).unwrap_or(f).display().to_string();
        results.push((rel, v));
    }
    std::panic::set_hook(hook);
    // Per directory counts and reason tallies.
    let mut dirs: std::collections::BTreeMap<String, [usize; 3]> = Default::default();
    let mut reasons: [std::collections::BTreeMap<String, (usize, String)>; 2] = Default::default();
    for (rel, v) in &results {
        let d = rel.rsplit_once('/').map_or(".", |(d, _)| d).to_string();
        let c = dirs.entry(d).or_default();
        match v {
            Verdict::Pass => c[0] += 1,
            Verdict::Fail(_, m) | Verdict::Skip(_, m) => {
                let k = usize::from(matches!(v, Verdict::Skip(..)));
                c[1 + k] += 1;
                let e = reasons[k]
                    .entry(reason_class(m))
                    .or_insert((0, rel.clone()));
                e.0 += 1;
            }
        }
    }
    let total = |i: usize| dirs.values().map(|c| c[i]).sum::<usize>();
    if json {
        let mut o = String::from("{\"scripts\":[");
        for (i, (rel, v)) in results.iter().enumerate() {
            let (res, line, msg) = match v {
                Verdict::Pass => ("pass", 0, ""),
                Verdict::Fail(l, m) => ("fail", *l, m.as_str()),
                Verdict::Skip(l, m) => ("skip", *l, m.as_str()),
            };
            if i > 0 {
                o.push(',');
            }
            o.push_str(&format!(
                "{{\"path\":{},\"result\":\"{res}\",\"line\":{line},\"reason\":{}}}",
                json_str(rel),
                json_str(msg)
            ));
        }
        o.push_str("],\"directories\":{");
        for (i, (d, c)) in dirs.iter().enumerate() {
            if i > 0 {
                o.push(',');
            }
            o.push_str(&format!(
                "{}:{{\"passed\":{},\"failed\":{},\"skipped\":{}}}",
                json_str(d),
                c[0],
                c[1],
                c[2]
            ));
        }
        o.push_str(&format!(
            "}},\"passed\":{},\"failed\":{},\"skipped\":{}}}",
            total(0),
            total(1),
            total(2)
        ));
        println!("{o}");
        return;
    }
    if list {
        for (rel, v) in &results {
            match v {
                Verdict::Pass => println!("pass  {rel}"),
                Verdict::Fail(l, m) => {
                    println!("FAIL  {rel}:{l}: {}", m.lines().next().unwrap_or(""))
                }
                Verdict::Skip(l, m) => {
                    println!("skip  {rel}:{l}: {}", m.lines().next().unwrap_or(""))
                }
            }
        }
        println!();
    }
    println!(
        "{:<40} {:>6} {:>6} {:>7}",
        "directory", "passed", "failed", "skipped"
    );
    for (d, c) in &dirs {
        println!("{d:<40} {:>6} {:>6} {:>7}", c[0], c[1], c[2]);
    }
    println!(
        "{:<40} {:>6} {:>6} {:>7}   ({} scripts, {opts:?})",
        "total",
        total(0),
        total(1),
        total(2),
        results.len()
    );
    for (k, title) in [(1, "skip reasons"), (0, "failure reasons")] {
        let mut v: Vec<_> = reasons[k].iter().collect();
        v.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(b.0)));
        println!("\ntop {title}:");
        for (r, (n, ex)) in v.iter().take(20) {
            println!("{n:>5}  {r}   (e.g. {ex})");
        }
    }
}

fn opts(args: &str) -> RunOptions {
    RunOptions::from_args(args.split_whitespace())
        .expect("options")
        .0
}

/// Passive handshake whose SYN-ACK line is `syn_ack`.
fn passive(syn_ack: &str) -> String {
    format!(
        "{LISTEN}+0 < S 0:0(0) win 65535 <mss 1000,sackOK,nop,nop,nop,wscale 7>\n\
         +0 > {syn_ack}\n+.1 < . 1:1(0) ack 1 win 257\n+0 accept(3, ..., ...) = 4\n"
    )
}

#[test]
fn lenient_mode_ignores_windows_option_order_and_padding_only() {
    // luna sends <mss 1460,nop,nop,sackOK,nop,wscale 5> win 65535; Linux's shift is 8.
    let linux = passive("S. 0:0(0) ack 1 win 29200 <mss 1460,sackOK,wscale 8,eol,eol>");
    expect_error(&linux, 5, "outbound packet mismatch");
    assert!(run_text_with(&linux, &opts("--lenient")).is_ok());
    // Still compared in lenient mode: which options, their values, flags, ack.
    for bad in [
        "S. 0:0(0) ack 1 win 29200 <mss 1400,sackOK,wscale 8>",
        "S. 0:0(0) ack 1 win 29200 <mss 1460,wscale 8>",
        "S. 0:0(0) ack 1 win 29200 <mss 1460,sackOK,wscale 8,TS val 1 ecr 0>",
        "S. 0:0(0) ack 2 win 29200 <mss 1460,sackOK,wscale 8>",
        "S 0:0(0) win 29200 <mss 1460,sackOK,wscale 8>",
    ] {
        let r = run_text_with(&passive(bad), &opts("--lenient"));
        assert!(
            r.is_err_and(|f| f.error.line == 5 && !f.error.skip),
            "{bad}"
        );
    }
}

#[test]
fn peer_profiles_set_the_delayed_ack() {
    let base = passive("S. 0:0(0) ack 1 win 65535 <mss 1460,nop,nop,sackOK,nop,wscale 5>");
    let data = "+.1 < P. 1:1001(1000) ack 1 win 257\n";
    for (args, delay) in [("", "+0"), ("--peer=linux", "+.04"), ("--peer=bsd", "+.1")] {
        let text = format!("{base}{data}{delay} > . 1:1(0) ack 1001 win 32736\n");
        assert!(run_text_with(&text, &opts(args)).is_ok(), "{args}");
        let wrong = format!("{base}{data}+.02 > . 1:1(0) ack 1001 win 32736\n");
        assert!(run_text_with(&wrong, &opts(args)).is_err(), "{args}");
    }
}

#[test]
fn profile_decides_buffer_sizes_getsockopt_returns() {
    let text = format!(
        "{SOCKET}+0 setsockopt(3, SOL_SOCKET, SO_SNDBUF, [50000], 4) = 0\n\
         +0 getsockopt(3, SOL_SOCKET, SO_SNDBUF, [N], [4]) = 0\n"
    );
    let linux = text.replace("[N]", "[100000]");
    let bsd = text.replace("[N]", "[50000]");
    assert!(run_text_with(&linux, &opts("--profile=linux")).is_ok());
    assert!(run_text_with(&bsd, &opts("--profile=bsd")).is_ok());
    assert!(run_text_with(&bsd, &opts("--profile=linux")).is_err());
    assert!(run_text_with(&linux, &opts("--profile=bsd")).is_err());
}

#[test]
fn ifdef_follows_the_runs_defines() {
    let text = format!(
        "{SOCKET}#ifdef Linux\n+0 close(3) = 0\n#else\n+0 close(3) = -1 EBADF\n#endif\n\
         #ifndef FreeBSD\n+0 close(3) = -1 EBADF\n#endif\n"
    );
    assert!(run_text(&text).is_ok());
    let bsd = run_text_with(&text, &opts("--define=FreeBSD")).unwrap_err();
    assert_eq!(
        (bsd.error.line, bsd.error.skip),
        (5, false),
        "{}",
        bsd.error.msg
    );
    assert!(run_text_with(&text, &opts("--profile=bsd")).is_err());
    for (bad, line, needle) in [
        ("#ifdef A\n", 1, "without #endif"),
        ("#endif\n", 1, "without #ifdef"),
        ("#ifdef A\n#else\n#else\n#endif\n", 3, "#else without"),
        ("#if A\n", 1, "unsupported directive"),
    ] {
        expect_error(bad, line, needle);
    }
}

#[test]
fn upstream_syntax_parses() {
    let text = "--local_ip=192.168.0.1\n--remote_ip=192.0.2.1\n--speed=1000\n-v\n\
                `../common/defaults.sh\nsysctl -q net.ipv4.tcp_rmem=\"4096 540000 $((15*1024*1024))\"`\n\
                %{\nassert 1\n}%\n\
                + 0.00 socket(..., SOCK_STREAM, IPPROTO_TCP) = 3\n\
                +0 fcntl(3, F_GETFL) = 0x02 (flags O_RDWR)\n\
                +0 connect(3, {sa_family=AF_INET, sin_port=htons(8080), sin_addr=inet_addr(\"192.0.2.1\")}, 16) = 0\n\
                +0 > (tos 0x0, ttl 64) [noecn] S. ...(0) ack 1 <...>\n\
                +0 < [ect0] - 1:1(0) win 100\n\
                +0 < icmp unreachable frag_needed mtu 1200 [1:1001(1000)]\n\
                +0 <icmp time_exceeded ttl_exceeded_in_transit\n";
    let s = script::parse(text).expect("parses");
    assert_eq!(s.options.len(), 4);
    let kinds: Vec<&script::EventKind> = s.events.iter().map(|e| &e.kind).collect();
    assert!(
        matches!(kinds[0], script::EventKind::Shell(c) if c.contains("tcp_rmem") && c.contains('\n'))
    );
    assert!(matches!(kinds[1], script::EventKind::Python(_)));
    assert_eq!(s.events[2].line, 10);
    let script::EventKind::Packet(p) = kinds[5] else {
        panic!("packet")
    };
    assert!(p.seq_any && p.ip.ttl == Some(64) && p.ip.ecn.as_deref() == Some("noecn"));
    let script::EventKind::Packet(p) = kinds[6] else {
        panic!("packet")
    };
    assert_eq!(p.flags, 0);
    let script::EventKind::Icmp(i) = kinds[7] else {
        panic!("icmp")
    };
    assert_eq!(
        (i.kind.as_str(), i.code.as_str(), i.mtu, i.quote),
        ("unreachable", "frag_needed", Some(1200), Some((1, 1001)))
    );
    // The multi-line block's sysctls apply; the python block then skips the script.
    let f = run_text(text).unwrap_err();
    assert!(f.error.skip && f.error.line == 7, "{}", f.error.msg);
}

#[test]
fn shell_commands_split_like_sh() {
    let c = packetdrill::engine::split_shell(
        "sysctl -q a=\"1 2 3\" > /dev/null 2>&1; ! ss -tn | grep -c X && b\\\nc",
    )
    .expect("splits");
    let words = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(c.len(), 3);
    assert_eq!(c[0], vec![words(&["sysctl", "-q", "a=1 2 3"])]);
    assert_eq!(
        c[1],
        vec![words(&["!", "ss", "-tn"]), words(&["grep", "-c", "X"])]
    );
    assert_eq!(c[2], vec![words(&["b", "c"])]);
}

#[test]
fn state_checks_fail_the_script_when_grep_would() {
    let text = format!("{LISTEN}+0 `netstat -n | grep -c ESTABLISHED`\n");
    expect_error(&text, 4, "exit status 1");
    expect_error(
        &format!("{LISTEN}+0 `sockstat -s | grep -c LISTEN | grep 2`\n"),
        4,
        "exit status 1",
    );
}
