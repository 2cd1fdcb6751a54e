//! r2c: the per-core run-to-completion runtime of luna.
//!
//! One thread per core, pinned, owning its NIC queue pair(s) through a [`device::Device`],
//! its own [`luna_stack::stack::Stack`], timers and zbuf cache. No locks and no shared
//! writes on the data path; per-core stats are published through a seqlock every
//! `stats_interval` iterations.
//!
//! Poll iteration: `rx_burst` (up to 32) → `handle_frames` (the burst, each connection's
//! in-order run coalesced) → `handle_timeouts` →
//! application work → send backlog → `poll_transmit` until `None` → `tx_burst` (frames
//! the ring refuses are retried next iteration; after `tx_retry_limit` tries in a row that
//! took nothing, one burst is dropped from the queue's head, and counted, and the next
//! frames get the same tries).
//!
//! Four ways to run an application:
//! - [`inline`]: callbacks inside packet processing ([`InlineApp`], [`Ctx`]);
//! - [`batch`]: a BSD-socket/epoll-like API polled once per iteration;
//! - [`split`]: I/O + TCP on one core, handlers on worker threads over lock-free rings;
//! - [`msg`]: split mode with message sockets: parsers on the I/O core, whole messages
//!   scheduled across workers by msgsched (CP / CS / MS), replies in request order for
//!   ordered protocols (as they complete for unordered ones); or per-connection sessions
//!   (HTTP/2) on the I/O core (`Runtime::spawn_msg_session`).
//!
//! Sending has one meaning per call (as quinn's `SendStream::write` / `write_all`):
//! [`Ctx::send`] takes what the TCP send buffer takes now and returns how much;
//! [`Ctx::send_all`] takes all or nothing, parking what does not fit in the runtime's
//! bounded backlog. Bytes in the backlog always go first, so mixing the two keeps the
//! byte order. Applications read the stack through the read-only [`view::StackView`].
//!
//! [`control`] is the `lunactl` endpoint (counters, connections, [`capture`] to pcapng).
//!
//! [`config`] reads the TOML configuration (with CLI overrides); [`device::mem`] is an
//! in-memory multi-queue link for tests and CI without DPDK.
#![warn(missing_docs)]
#![deny(unsafe_code)]

pub mod batch;
pub mod capture;
pub mod clock;
pub mod config;
pub mod control;
mod core;
pub mod device;
pub mod exception;
pub mod inline;
pub mod msg;
pub mod rng;
mod runtime;
pub mod split;
pub mod stats;
pub mod view;
mod workers;

pub use crate::core::{
    rx_split_first, Conn, CoreError, CoreOptions, CoreReport, CoreSetup, CoreState, HandleHash,
    HandleHashing, IdleStrategy, Listener, ReleaseHook,
};
pub use inline::{Ctx, InlineApp};
pub use runtime::{Runtime, RuntimeError, StatsReader, StopHandle};
pub use stats::CoreStats;
pub use view::{ConnView, StackView};
