//! TCP: sequence arithmetic, the RFC 9293 state machine, loss recovery and congestion control.

// The algorithms' internals: crate-private unless the `internals` feature exposes them to
// the benchmarks (and to outside tests that need them); the API is `Connection`.
#[cfg(feature = "internals")]
pub mod assembler;
#[cfg(not(feature = "internals"))]
#[allow(dead_code)] // the parts only the tests and benchmarks use
pub(crate) mod assembler;
pub mod cc;
pub mod config;
pub mod conn;
pub mod counters;
pub(crate) mod isn;
pub(crate) mod rtt;
#[cfg(feature = "internals")]
pub mod scoreboard;
#[cfg(not(feature = "internals"))]
#[allow(dead_code)] // the parts only the tests and benchmarks use
pub(crate) mod scoreboard;
mod sendq;
pub(crate) mod syncookie;

/// Re-exported from the wire layer, which owns it (TCP headers carry it); kept here
/// because the TCP layer is where users import it from.
pub use crate::wire::SeqNum;
pub use assembler::SEG_OVERHEAD;
pub use config::{TcpConfig, DEFAULT_RCV_MEM_MIN};
pub use conn::{
    CloseReason, Connection, Disposition, Events, FourTuple, OutSegment, RecvError, SendError,
    SoftError, State,
};
pub use counters::{ConnCounters, DropReason};
/// The RTT estimator a connection exposes ([`Connection::rtt`]) and congestion control reads.
pub use rtt::{RttEstimator, SampleSource};
