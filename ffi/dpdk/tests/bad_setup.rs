//! Bad setup is reported, not crashed: each case runs the scenario helper in
//! its own process (one EAL per process) with a hard timeout and expects one
//! clear error naming the step and the fix.

mod common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(60);

fn with(tag: &str, extra: &[&str]) -> (Vec<String>, RunDirGuard) {
    let mut eal = eal_base(tag);
    eal.extend(extra.iter().map(|s| s.to_string()));
    (eal, RunDirGuard(prefix(tag)))
}

fn contains_all(text: &str, parts: &[&str]) {
    for p in parts {
        assert!(text.contains(p), "expected {p:?} in:\n{text}");
    }
}

#[test]
fn unknown_eal_flag_is_named() {
    let (eal, _g) = with("bogus", &["--bogus-flag"]);
    let e = run(scenario(&["eal-init"], &eal), LIMIT).error("EalInit");
    contains_all(
        &e,
        &[
            "EAL init",
            "unknown option --bogus-flag",
            "remove or correct it",
        ],
    );
}

#[test]
fn huge_dir_that_is_not_hugetlbfs_fails_preflight() {
    let dir = std::env::temp_dir().join(format!("ldp-nohuge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Without --in-memory EAL would take pages from --huge-dir.
    let (mut eal, _g) = with("hugedir", &[]);
    eal.retain(|a| a != "--in-memory");
    eal.push(format!("--huge-dir={}", dir.display()));
    let e = run(scenario(&["eal-init"], &eal), LIMIT).error("Preflight");
    let _ = std::fs::remove_dir(&dir);
    contains_all(
        &e,
        &[
            "EAL preflight (hugepages)",
            "is not a hugetlbfs mount",
            "mount -t hugetlbfs",
        ],
    );
}

/// A real system without hugetlbfs: a private mount namespace where
/// /dev/hugepages is unmounted. The preflight names the fix; with the
/// preflight off, EAL's own failure is still reported with a fix.
#[test]
fn no_hugetlbfs_mount_is_reported_by_preflight_and_by_eal() {
    for (tag, preflight, kind, parts) in [
        (
            "nomount",
            "on",
            "Preflight",
            &["no hugetlbfs is mounted", "mount -t hugetlbfs"][..],
        ),
        (
            "nomount-eal",
            "off",
            "EalInit",
            &[
                "EAL init (rte_eal_init)",
                "Cannot get hugepage information",
                "hugepage",
            ][..],
        ),
    ] {
        let (mut eal, _g) = with(tag, &[]);
        eal.retain(|a| a != "--in-memory");
        let inner = format!(
            "umount /dev/hugepages 2>/dev/null; ! grep -q hugetlbfs /proc/mounts || exit 97; exec \"$0\" eal-init --preflight {preflight} -- \"$@\""
        );
        let mut cmd = std::process::Command::new("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &inner,
            BIN,
        ])
        .args(&eal);
        let out = run(cmd, LIMIT);
        assert_ne!(
            out.code,
            Some(97),
            "could not hide hugetlbfs mounts: {out:?}"
        );
        contains_all(&out.error(kind), parts);
    }
}

#[test]
fn missing_vdev_driver_lists_what_exists() {
    let (eal, _g) = with("novdev", &["--vdev=net_doesnotexist0"]);
    let e = run(scenario(&["eal-init"], &eal), LIMIT).error("EalInit");
    contains_all(
        &e,
        &[
            "unknown device in --vdev net_doesnotexist0",
            "net_memif",
            "net_tap",
        ],
    );
}

#[test]
fn vdev_that_fails_probe_is_explained_at_port_lookup() {
    let (eal, _g) = with("badprobe", &["--vdev=net_af_packet0,iface=ldpnope0"]);
    let e = run(scenario(&["port", "--name", "net_af_packet0"], &eal), LIMIT).error("PortNotFound");
    contains_all(
        &e,
        &[
            "failed to probe `net_af_packet0,iface=ldpnope0` at EAL init",
            "iface=",
        ],
    );
}

#[test]
fn unknown_port_name_lists_known_ports() {
    let (eal, _g) = with("noport", &["--vdev=net_null0"]);
    let e = run(scenario(&["port", "--name", "net_nope0"], &eal), LIMIT).error("PortNotFound");
    contains_all(
        &e,
        &["find port \"net_nope0\"", "known: 0:net_null0", "--vdev"],
    );
}

#[test]
fn too_many_queues_fails_configure_with_limits() {
    let (eal, _g) = with("queues", &["--vdev=net_ring0"]);
    let e = run(
        scenario(&["port", "--name", "net_ring0", "--rxq", "32"], &eal),
        LIMIT,
    )
    .error("PortConfigure");
    contains_all(
        &e,
        &[
            "configure port net_ring0",
            "asked for 32 rx",
            "supports ≤ 16 rx",
        ],
    );
}

#[test]
fn mtu_beyond_device_frame_limit_fails_configure() {
    let sock = format!("/tmp/ldp-mtu-{}.sock", std::process::id());
    let vdev = format!("--vdev=net_memif0,role=server,socket={sock}");
    let (eal, _g) = with("mtu", &[&vdev]);
    let e = run(
        scenario(&["port", "--name", "net_memif0", "--mtu", "9000"], &eal),
        LIMIT,
    )
    .error("PortConfigure");
    let _ = std::fs::remove_file(&sock);
    contains_all(&e, &["MTU 9000", "frames ≤ 1518 B"]);
}

#[test]
fn second_eal_init_is_refused_cleanly() {
    let (eal, _g) = with("double", &[]);
    let ok = run(scenario(&["double-init"], &eal), LIMIT).ok();
    contains_all(&ok, &["already initialised", "cannot initialise twice"]);
}

#[test]
fn flow_on_pmd_without_rte_flow_is_a_clean_error() {
    let (eal, _g) = with("flow", &["--vdev=net_null0"]);
    let e = run(
        scenario(&["flow-validate", "--name", "net_null0"], &eal),
        LIMIT,
    )
    .error("Flow");
    contains_all(
        &e,
        &[
            "validate flow on port net_null0",
            "does not implement rte_flow",
        ],
    );
}

#[test]
fn rss_is_masked_by_device_capabilities() {
    let (eal, _g) = with("rss", &["--vdev=net_null0"]);
    let ok = run(
        scenario(
            &["port", "--name", "net_null0", "--rxq", "4", "--txq", "4"],
            &eal,
        ),
        LIMIT,
    )
    .ok();
    // "rss_hf X (asked A, device D)": X must equal A & D and be non-zero.
    let num = |key: &str| -> u64 {
        let s = &ok[ok.find(key).unwrap_or_else(|| panic!("{key} in {ok}")) + key.len()..];
        let s = s.trim_start().trim_start_matches("0x");
        let end = s.find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(s.len());
        u64::from_str_radix(&s[..end], 16).unwrap()
    };
    let (eff, asked, dev) = (num("rss_hf"), num("asked"), num("device"));
    assert_eq!(eff, asked & dev, "{ok}");
    assert_ne!(eff, 0, "{ok}");
}

#[test]
fn mbuf_and_burst_api_behave() {
    let (eal, _g) = with("mbuf", &["--vdev=net_ring0"]);
    let ok = run(scenario(&["mbuf-api"], &eal), LIMIT).ok();
    assert!(ok.contains("mbuf API checks passed"), "{ok}");
}

/// Threads register as lcores for as long as they live: 300 in a row (more than
/// RTE_MAX_LCORE) each get an id, keep their pinning, and give their id and their
/// mempool cache back when they exit; more at once than there are ids get a named error.
#[test]
fn lcore_registrations_end_with_their_threads() {
    let (eal, _g) = with("lcores", &[]);
    let ok = run(scenario(&["lcores"], &eal), LIMIT).ok();
    assert!(ok.contains("300 threads registered"), "{ok}");
    assert!(ok.contains("all 1023 mbufs back in the ring"), "{ok}");
    assert!(ok.contains("of 140 at once refused by name"), "{ok}");
}

/// The interrupt-thread hold memif teardown relies on: no interrupt or alarm callback
/// runs while it is held, holders take turns, and EAL still cleans up (its last drop
/// parks the thread for good) with a clean exit.
#[test]
fn interrupt_thread_hold_holds_back_callbacks() {
    let (eal, _g) = with("intrhold", &[]);
    let ok = run(scenario(&["intr-hold"], &eal), LIMIT).ok();
    assert!(ok.contains("alarm held back until the release"), "{ok}");
}

#[test]
fn scenario_usage_errors_are_reported() {
    let out = run(std::process::Command::new(BIN), LIMIT);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stdout.contains("usage"), "{out:?}");
}

/// Regression: a second primary process with a file prefix in use failed with
/// "Success (errno 0)" (rte_eal_init returns -1 without setting rte_errno when
/// the lock on /var/run/dpdk/<prefix>/config is taken).
#[test]
fn reused_file_prefix_names_the_prefix_and_the_fix() {
    // Without --in-memory EAL creates and locks its shared config file.
    let (mut eal, _g) = with("reuse", &["--huge-unlink"]);
    eal.retain(|a| a != "--in-memory");
    let ready = std::env::temp_dir().join(format!("ldp-reuse-{}.ready", std::process::id()));
    let _ = std::fs::remove_file(&ready);
    let holder = spawn(scenario(
        &["eal-hold", "--ready-file", &ready.display().to_string()],
        &eal,
    ));
    let end = std::time::Instant::now() + LIMIT;
    while !ready.exists() && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = run(scenario(&["eal-init"], &eal), LIMIT);
    let _ = std::fs::remove_file(&ready);
    let held = holder.wait(LIMIT);
    held.ok();
    let e = second.error("EalInit");
    let p = prefix("reuse");
    contains_all(
        &e,
        &[
            "EAL init (rte_eal_init)",
            "another DPDK process (pid ",
            &format!("is using file prefix {p}"),
            "stop it or choose another --file-prefix",
        ],
    );
    assert!(!e.contains("Success"), "{e}");
    assert!(!e.contains("errno 0"), "{e}");
}
