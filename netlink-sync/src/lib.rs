//! Mirrors the kernel's IPv4 neighbours, routes and addresses of one interface into tables
//! that every luna core reads without a lock.
//!
//! The layers, bottom up:
//! - [`mirror`]: sans-IO. [`mirror::Mirror::apply_datagram`] applies the bytes of one
//!   netlink `recv` (dump replies and notifications alike) idempotently; malformed input is
//!   counted and skipped, never a panic.
//! - [`snapshot`]: immutable [`snapshot::Snapshot`]s (longest-prefix match, then neighbour
//!   MAC; local addresses) published through `arc-swap` plus a version counter; each core
//!   holds a [`snapshot::Reader`] and refreshes it once per poll iteration.
//! - [`syncer`]: the I/O driver on a synchronous `netlink-sys` socket: subscribe, dump,
//!   follow; re-dump on overrun. [`trace`] is what it saw (for failure messages).
//! - [`pending`]: sans-IO queues of packets whose next hop is not resolved yet (bounded,
//!   counted), with nudge pacing; [`nudge`] makes the kernel resolve from a kernel socket.
//! - [`netns`]: a private veth topology for the tests and the `nl-latency` benchmark;
//!   [`latency`] is that benchmark.
//!
//! IPv4 only; the main routing table only. See docs/netlink-sync.md.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod latency;
pub mod mirror;
pub mod netns;
pub mod nudge;
pub mod pending;
pub mod snapshot;
pub mod syncer;
pub mod trace;

pub use mirror::{Mirror, Outcome, SyncCounters};
pub use nudge::Nudger;
pub use pending::{Egress, PendingConfig, PendingCounters, PendingNextHops};
pub use snapshot::{LocalAddress, Lookup, MirroredNeighbour, Publisher, Reader, Snapshot};
pub use syncer::{Error, Interface, PollStatus, SyncConfig, Syncer};
pub use trace::{kernel_socket_line, SyncTrace, TraceEvent, TraceHandle};
