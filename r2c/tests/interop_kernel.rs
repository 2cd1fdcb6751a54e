//! TCP interoperability of luna with the Linux kernel (docs/interop.md).
//!
//! The kernel, in the testbed's tap namespace, is client and server of a luna `Stack`
//! driven over a `DpdkDevice` (net_tap): 1 GiB bulk each way and 100,000 pipelined 4 KiB
//! RPCs in each role under 2% loss, 25% reordering and 1% duplication in both directions
//! (full size: `make interop`; a reduced run is part of `make test`). Every byte is
//! checked against a pattern at both ends, the capture of each run goes through tshark
//! (no malformed frame, no bad checksum, no RST, a FIN from each side), and the options
//! luna negotiated are compared with what `ss -tin` shows for the kernel's socket.
//!
//! Needs root, hugepages, tcpdump and tshark (`make setup`).

mod interop;

use std::time::Duration;

use interop::parent::{run, Run};
use interop::{LinkImpair, Plan};

fn plan(bulk: u64, rpcs: u64, impair: Option<LinkImpair>, limit: Duration) -> Plan {
    Plan {
        bulk,
        rpcs,
        rpc_size: 4096,
        depth: 16,
        impair,
        seed: 0x6c69_6f5f_7365_6564,
        phase_limit: limit,
    }
}

/// The clean segment of both runs: whole-frame capture for tshark's checksum check.
fn clean() -> Plan {
    plan(4 << 20, 1_000, None, Duration::from_secs(60))
}

/// `make test`: 32 MiB bulk and 5,000 RPCs in each role, impaired both ways.
#[test]
fn lio_kernel_interop_reduced() {
    run(&Run {
        tag: 'r',
        clean: clean(),
        impaired: plan(
            32 << 20,
            5_000,
            Some(LinkImpair::acceptance()),
            Duration::from_secs(120),
        ),
        impaired_snaplen: 0,
    });
}

/// `make interop`: 1 GiB bulk and 100,000 RPCs in each role, impaired both ways; the
/// impaired capture keeps 128 bytes of each frame.
#[test]
#[ignore = "full-size run (about half an hour): make interop"]
fn lio_kernel_interop_full() {
    run(&Run {
        tag: 'f',
        clean: clean(),
        impaired: plan(
            1 << 30,
            100_000,
            Some(LinkImpair::acceptance()),
            Duration::from_secs(1800),
        ),
        impaired_snaplen: 128,
    });
}

/// Entry point of the child processes (ignored in normal runs; see `interop/mod.rs`).
#[test]
#[ignore = "child-process entry point, run by the other tests"]
fn role_child() {
    interop::role_main();
}
