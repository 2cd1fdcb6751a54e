//! Traffic model: how luna and the kernel share one NIC, and how luna's threads share
//! the traffic (LUNA, ATC'23 §4.3).
//!
//! - [`toeplitz`]: the RSS Toeplitz hash and redirection table, to predict which receive
//!   queue a flow lands on.
//! - [`ports`]: client source ports 61440–65535 reserved for the stack and partitioned
//!   among applications, queues and threads; a chooser that picks, for `connect()`, a port
//!   whose replies the NIC steers to the calling thread's queue.
//!
//! Server side: connections to one listening port are spread over threads by the hash of
//! their 4-tuple — the NIC's RSS when each thread owns a queue, or the same Toeplitz hash
//! computed in software ([`toeplitz::RssConfig::queue_of_ipv4_tcp`] over a table of
//! workers) when one I/O core hands connections to worker threads (r2c split mode).
//!
//! Not here yet: the rte_flow rule compiler and the kernel exception path.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod ports;
pub mod toeplitz;

pub use ports::{
    AppSpec, Assignment, ChooseError, PartitionPlan, PlanError, PortChooser, PortRange, Share,
    Steering, ThreadSlot,
};
pub use toeplitz::{toeplitz, RssConfig, RssError, MICROSOFT_KEY};
