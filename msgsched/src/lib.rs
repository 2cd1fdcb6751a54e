//! Message sockets: RPCs detached from connections and scheduled across workers
//! (Rakaia-style CP/CS/MS queueing, power-of-two choices, stealing, transmit delegation).
//!
//! Layers (each sans-IO except `sched`, which is the cross-thread queue):
//! - [`sim`]: a discrete-event simulator of the CP/CS/MS queueing models (the ideal the real
//!   system is measured against);
//! - [`sched`]: the scheduler proper: per-worker FIFOs, placement, handoff, stealing.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod sched;
pub mod sim;
