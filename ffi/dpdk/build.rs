//! Finds DPDK with pkg-config, generates bindings with bindgen over
//! csrc/wrapper.h (allowlisted, nothing is checked in: the crate must build
//! against 22.11 and 23.11 alike) and compiles the C shim csrc/shim.c.

use std::env;
use std::path::PathBuf;
use std::process::{self, Command};

const MIN_DPDK: &str = "21.11";

fn fail(msg: &str) -> ! {
    eprintln!("\nerror: dpdk-sys: {msg}\n");
    process::exit(1);
}

fn pkg_config_cflags() -> Vec<String> {
    let pkg_config = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".into());
    let out = Command::new(&pkg_config)
        .args(["--cflags", "libdpdk"])
        .output()
        .unwrap_or_else(|e| {
            fail(&format!(
                "cannot run `{pkg_config}` ({e}); install pkg-config and libdpdk-dev: run `make setup`"
            ))
        });
    if !out.status.success() {
        fail(&format!(
            "`{pkg_config} --cflags libdpdk` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc/wrapper.h");
    println!("cargo:rerun-if-changed=csrc/shim.c");
    for var in [
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "LIBCLANG_PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    // Probe first without emitting link flags: the static shim must come
    // before the shared DPDK libraries on the link line (--as-needed).
    let lib = pkg_config::Config::new()
        .atleast_version(MIN_DPDK)
        .cargo_metadata(false)
        .probe("libdpdk")
        .unwrap_or_else(|e| {
            fail(&format!(
                "pkg-config cannot find libdpdk >= {MIN_DPDK}: install libdpdk-dev: run `make setup` \
                 (or `apt-get install libdpdk-dev pkg-config`; set PKG_CONFIG_PATH for a DPDK built \
                 from source).\n  pkg-config said: {e}"
            ))
        });
    let cflags = pkg_config_cflags();
    for dir in &lib.include_paths {
        println!(
            "cargo:rerun-if-changed={}",
            dir.join("rte_version.h").display()
        );
    }

    let mut shim = cc::Build::new();
    shim.file("csrc/shim.c")
        .include("csrc")
        // The shim is the fast path (rx/tx burst, mbuf alloc/free): keep it
        // optimised even in debug builds.
        .opt_level(2)
        .warnings(true)
        .flag_if_supported("-Wno-unused-parameter");
    for f in &cflags {
        shim.flag(f);
    }
    shim.compile("dpdk_sys_shim");

    // Now the shared libraries, after the shim.
    pkg_config::Config::new()
        .atleast_version(MIN_DPDK)
        .probe("libdpdk")
        .unwrap_or_else(|e| fail(&format!("pkg-config libdpdk: {e}")));

    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR set by cargo"));
    let bindings = bindgen::Builder::default()
        .header("csrc/wrapper.h")
        .clang_args(&cflags)
        .parse_callbacks(Box::new(Renamer))
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .allowlist_function("dpdk_sys_.*")
        .allowlist_var("DPDK_SYS_C_.*")
        .allowlist_var("RTE_EAL_PMD_PATH")
        .allowlist_var("RTE_ETH_MQ_.*")
        .allowlist_type("dpdk_sys_.*")
        .allowlist_type("rte_pktmbuf_extmem")
        .allowlist_type("rte_iova_mode")
        .allowlist_type("rte_flow_item_type")
        .allowlist_type("rte_flow_action_type")
        .allowlist_type("rte_flow_error_type")
        .allowlist_type("rte_eth_rx_mq_mode")
        .allowlist_type("rte_eth_tx_mq_mode")
        .allowlist_type("rte_eth_hash_function")
        .allowlist_type("rte_flow_item_(eth|ipv4|tcp|udp)")
        .allowlist_type("rte_flow_action_(queue|rss)")
        .allowlist_function(
            "rte_(eal_init|eal_cleanup|eal_get_runtime_dir|eal_process_type|strerror|openlog_stream|\
             log_cur_msg_loglevel|log_set_global_level|log_get_global_level|\
             get_tsc_hz|socket_id|lcore_count|get_main_lcore|get_next_lcore|\
             lcore_to_socket_id|eal_remote_launch|eal_wait_lcore|eal_mp_wait_lcore|\
             thread_register|thread_unregister|dev_probe|mem_virt2iova|delay_us_block|\
             extmem_register|extmem_unregister|eal_iova_mode|mem_virt2memseg_list|\
             eal_alarm_set|eal_alarm_cancel)",
        )
        .allowlist_function(
            "rte_eth_(dev_count_avail|find_next|dev_get_port_by_name|dev_get_name_by_port|\
             dev_is_valid_port|dev_info_get|dev_configure|rx_queue_setup|tx_queue_setup|\
             dev_start|dev_stop|dev_close|dev_socket_id|dev_set_mtu|dev_get_mtu|\
             dev_adjust_nb_rx_tx_desc|stats_get|stats_reset|xstats_get_names|xstats_get|\
             xstats_reset|macaddr_get|promiscuous_enable|promiscuous_disable|\
             promiscuous_get|allmulticast_enable|dev_rss_hash_conf_get)",
        )
        .allowlist_function(
            "rte_(pktmbuf_pool_create|pktmbuf_free_bulk|mempool_free|mempool_avail_count|\
             mempool_in_use_count|mempool_lookup)",
        )
        .allowlist_function("rte_flow_(validate|create|destroy|flush|isolate)")
        .default_enum_style(bindgen::EnumVariation::ModuleConsts)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .generate()
        .unwrap_or_else(|e| {
            fail(&format!(
                "bindgen over csrc/wrapper.h failed ({e}); needs clang and libclang-dev \
                 (`make setup`)"
            ))
        });
    bindings
        .write_to_file(out.join("bindings.rs"))
        .unwrap_or_else(|e| fail(&format!("writing bindings.rs: {e}")));

    if let Some(dir) = lib.include_paths.first() {
        println!("cargo:include={}", dir.display());
    }
    println!("cargo:version={}", lib.version);
}

/// `DPDK_SYS_C_RTE_ETH_RSS_IP` (a `static const` clang evaluates for us) is
/// exported to Rust as `RTE_ETH_RSS_IP`.
#[derive(Debug)]
struct Renamer;

impl bindgen::callbacks::ParseCallbacks for Renamer {
    fn item_name(&self, item: bindgen::callbacks::ItemInfo<'_>) -> Option<String> {
        item.name.strip_prefix("DPDK_SYS_C_").map(str::to_owned)
    }
}
