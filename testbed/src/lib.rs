//! The NIC-less testbed: network namespaces, veth/tap/af_packet/memif/coexist topologies for DPDK
//! and kernel hosts, link impairments, and crash cleanup.
//!
//! Contract:
//! * Everything created is named `<prefix>-...` ([`Prefix`], default `luna`, env
//!   `LUNA_TESTBED_PREFIX`); addresses come only from 198.18.0.0/15 and live only inside
//!   namespaces the testbed made. Nothing is configured in the root namespace.
//! * [`Topology::up`] is idempotent; a [`Topology`] tears itself down on drop;
//!   [`sweep()`] removes whatever a crash left behind.
//! * [`Impairment`]s follow netem's semantics on the egress of kernel-side interfaces,
//!   via tc netem where the kernel has it and a user-space NFQUEUE engine where not.
//! * Root is required; missing tools give errors naming the package to install.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Module layers, lowest first (no file imports one that imports it back; checked by
// tests/modcycles.rs): error; prefix, sys; impair; nfq, records; topology; daemon,
// probe, sweep.
pub mod daemon;
mod error;
pub mod impair;
pub mod nfq;
mod prefix;
mod probe;
mod records;
mod sweep;
pub mod sys;
mod topology;

pub use error::{Error, Result};
pub use impair::{parse_duration, parse_percent, parse_rate, Backend, Impairment};
pub use nfq::EngineStats;
pub use prefix::{state_root, Prefix, DEFAULT_PREFIX, PREFIX_ENV, STATE_ROOT_ENV};
pub use probe::PingStats;
pub use sweep::{leftovers, sweep, SweepReport};
pub use sys::{netns_command, netns_command_pinned, netns_exists, require_root};
pub use topology::{
    read_state, state_file, teardown_kind, AfPacket, Coexist, Details, DpdkPort, EalArgs,
    KernelHost, Kind, MacAddr, Memif, Tap, Topology, Veth, MTU, PREFIX_LEN,
};

/// Path of `setup.sh` (installs packages, reserves hugepages); `testbed setup` runs it.
pub const SETUP_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/setup.sh");
