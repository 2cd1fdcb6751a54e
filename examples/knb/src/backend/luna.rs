//! luna through the r2c runtime — **not available yet**: r2c (branch `r2c`) and its DPDK
//! device (branch `devdpdk`) are being written. Until they are merged this backend
//! reports itself unavailable; `knb rpc --stack luna` fails with that message (exit 1)
//! and `knb compare` writes its luna ratios as null with a note. Nothing is faked.
//!
//! # What the luna backend needs (the drop-in contract)
//!
//! Topology and placement are already decided: [`Backend::topology`] is `Kind::Memif`
//! and [`Backend::endpoints`] is the smoltcp backend's (same memif vdev, MACs,
//! 198.18.3.1 server / .2 client, EAL `-l <cpu> --in-memory --no-telemetry`). The memif
//! port can be opened with [`super::memif::open`] (one queue pair per thread; memif maps
//! client queue *i* to server queue *i*) unless r2c wants to open it itself from the
//! same EAL arguments. From r2c, per thread (lane):
//!
//! 1. A runtime built on one queue pair: `r2c::device::Device` over an rx/tx queue
//!    (devdpdk's memif device), a `luna_stack::stack::Stack` configured with
//!    `ServerSpec::ip`/`prefix_len` and the port MAC, its clock and timers; and a
//!    `poll(now)` (or `run_once`) that does rx → stack → events → tx for one iteration
//!    without blocking, so the lane loop can interleave knb's load generator.
//! 2. Server: listen on `ServerSpec::port`; an inline-r2c callback per received data
//!    io-vector `(conn, &[Zbuf])` that knb forwards slice by slice to
//!    [`crate::proto::ServerConn::on_rx`], then sends [`crate::proto::ServerConn::tx`]'s
//!    pending bytes (`send(conn, &[u8]) -> usize` accepting a prefix is enough; a
//!    zero-copy `send_zbuf` would let the response payload skip a copy); events for
//!    accepted and closed connections, so the server can exit when all are closed.
//! 3. Client: `connect(remote, local_port) -> ConnId`, an "established" event, the same
//!    receive callback (fed to [`crate::engine::ClientWorker::on_rx`]), `send`, a
//!    "send space available" signal (or just retry each iteration), and `close` /
//!    `abort` at the end.
//! 4. Counters for the report (frames, drops, retransmissions) as a `serde_json::Value`.
//!
//! With those, `serve` / `run_client` are the smoltcp backend's lane loops with the
//! smoltcp calls replaced (about 150 lines); framing, validation, load generation,
//! timing, CPU accounting and reporting are shared and need no change.
//!
//! [`Backend::topology`]: super::Backend::topology
//! [`Backend::endpoints`]: super::Backend::endpoints

use testbed::{Kind, Topology};

use super::{Backend, ClientPlan, ClientSpec, Endpoints, ServerReport, ServerSpec};
use crate::engine::ThreadResult;
use crate::workload::Stack;

/// The luna backend (placeholder until r2c lands).
pub struct Luna;

/// Why luna cannot run yet.
pub const UNAVAILABLE: &str = "the luna backend is not available yet: it needs the r2c runtime \
(branch r2c) and its DPDK memif device (branch devdpdk), which are not merged; \
see examples/knb/src/backend/luna.rs for what it needs";

impl Backend for Luna {
    fn stack(&self) -> Stack {
        Stack::Luna
    }

    fn topology(&self) -> Kind {
        Kind::Memif
    }

    fn unavailable(&self) -> Option<String> {
        Some(UNAVAILABLE.into())
    }

    fn endpoints(
        &self,
        topo: &Topology,
        server_cpus: &[usize],
        client_cpus: &[usize],
    ) -> Result<Endpoints, String> {
        super::smoltcp::Smoltcp.endpoints(topo, server_cpus, client_cpus)
    }

    fn serve(&self, _: &ServerSpec, _: &mut dyn FnMut()) -> Result<ServerReport, String> {
        Err(UNAVAILABLE.into())
    }

    fn run_client(&self, _: &ClientSpec, _: &ClientPlan) -> Result<Vec<ThreadResult>, String> {
        Err(UNAVAILABLE.into())
    }
}
