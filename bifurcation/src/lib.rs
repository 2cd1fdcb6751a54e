//! Traffic model: how luna and the kernel share one NIC, and how luna's threads share
//! the traffic (LUNA, ATC'23 §4.3).
//!
//! - [`toeplitz`](mod@toeplitz): the RSS Toeplitz hash and redirection table, to predict
//!   which receive queue a flow lands on.
//! - [`ports`]: client source ports 61440–65535 reserved for the stack and partitioned
//!   among applications, queues and threads; a chooser that picks, for `connect()`, a port
//!   whose replies the NIC steers to the calling thread's queue.
//!
//! - [`model`]: the traffic model — which flows are luna's (listening ports, the client
//!   range and its split) and that everything else is the kernel's — loaded from the
//!   `[traffic]` TOML section and validated against the kernel's port sysctls.
//! - [`classify`](mod@classify): the software classifier for the exception path (one
//!   frame in, luna / kernel / drop out, counted by reason).
//! - [`rules`]: the rule compiler — luna's ports to luna's queues as value/mask rules,
//!   with rule counts against naive steering.
//! - [`install`] (feature `dpdk`): rte_flow installation with flow isolation, falling
//!   back to the software classifier with one log line where the PMD has no flow API.
//! - [`sriov`]: the SR-IOV command generator for ConnectX-4 Lx / mlx5.
//!
//! Server side: connections to one listening port are spread over threads by the hash of
//! their 4-tuple — the NIC's RSS when each thread owns a queue, or the same Toeplitz hash
//! computed in software ([`toeplitz::RssConfig::queue_of_ipv4_tcp`] over a table of
//! workers) when one I/O core hands connections to worker threads (r2c split mode).
//!
//! Not here: the exception interface plumbing (r2c's poll loop hands kernel frames to an
//! exception port, net_tap) and netlink mirroring (crate `netlink-sync`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod classify;
#[cfg(feature = "dpdk")]
pub mod install;
pub mod model;
pub mod ports;
pub mod rules;
pub mod sriov;
pub mod toeplitz;

pub use classify::{classify, Classifier, Counters, DropReason, KernelReason, LunaTarget, Verdict};
pub use model::{KernelPorts, ModelError, PortOwner, TrafficConfig, TrafficModel, L4};
pub use rules::{
    compile, compile_for, compile_plan, mask_cover, PortMask, PortRule, RuleSet, Target,
};

pub use ports::{
    AppSpec, Assignment, ChooseError, PartitionPlan, PlanError, PortChooser, PortRange, Share,
    Steering, ThreadSlot,
};
pub use toeplitz::{toeplitz, RssConfig, RssError, MICROSOFT_KEY};
