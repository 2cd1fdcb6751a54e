//! Message sockets: RPCs detached from connections and scheduled across workers
//! (Rakaia-style CP/CS/MS queueing, power-of-two choices, stealing, transmit delegation).
//!
//! Layers ([`model`] names the CP / CS / MS queueing models for all of them):
//! - [`parser`]: where a message ends in a byte stream (the strparser contract), and the
//!   first parser, knb's 16-byte framing;
//! - [`framer`]: one connection's receive side, bytes in, bounded whole messages out
//!   (sans-IO, zero copy);
//! - [`reply`]: transmit delegation from workers to the I/O core and request order
//!   restored for ordered protocols;
//! - [`sched`]: the scheduler proper: per-worker FIFOs, placement, handoff, stealing;
//! - [`sim`]: a discrete-event simulator of the CP/CS/MS queueing models (the ideal the
//!   real system is measured against);
//! - [`doorbell`]: a wakeable idle sleep for the polling I/O core (producers ring after
//!   publishing work; no lost wakeup);
//! - [`virt`]: virtual workers, the deadline bookkeeping that lets one thread emulate
//!   many occupied workers (service-time emulation without a CPU per worker).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod doorbell;
pub mod framer;
pub mod model;
pub mod parser;
pub mod proto;
pub mod reply;
pub mod sched;
pub mod sim;
pub mod socket;
mod stall;
mod sync;
pub mod virt;
