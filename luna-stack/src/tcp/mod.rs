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
pub mod seq;
pub mod syncookie;

pub use config::TcpConfig;
pub use conn::{
    CloseReason, Connection, Disposition, Events, FourTuple, OutSegment, RecvError, SendError,
    State,
};
pub use counters::{ConnCounters, DropReason};
pub use seq::SeqNum;
