//! TCP: sequence arithmetic, the RFC 9293 state machine, loss recovery and congestion control.

pub mod assembler;
pub mod cc;
pub mod config;
pub mod conn;
pub mod counters;
pub mod isn;
pub mod rtt;
pub mod scoreboard;
mod sendq;
pub mod syncookie;

/// Re-exported from the wire layer, which owns it (TCP headers carry it); kept here
/// because the TCP layer is where users import it from.
pub use crate::wire::SeqNum;
pub use config::TcpConfig;
pub use conn::{
    CloseReason, Connection, Disposition, Events, FourTuple, OutSegment, RecvError, SendError,
    State,
};
pub use counters::{ConnCounters, DropReason};
