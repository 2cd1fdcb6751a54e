//! luna-stack: the sans-IO protocol core of luna.
//!
//! Contract: nothing in this crate touches DPDK, libc, a clock or the network. Time is passed
//! in as [`time::Instant`], randomness comes through [`context::Rng`], frames come in through
//! `handle_frame(now, frame)` and go out through `poll_transmit`. Everything here runs
//! deterministically inside a unit test.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod context;
pub mod stack;
pub mod tables;
pub mod tcp;
#[cfg(any(test, feature = "testutils"))]
pub mod testutil;
pub mod time;
pub mod wire;
