//! TCP: sequence arithmetic, the RFC 9293 state machine, loss recovery and congestion control.

pub mod config;
pub mod conn;
pub mod counters;
pub mod seq;
mod sendq;

pub use config::TcpConfig;
pub use conn::{CloseReason, Connection, Disposition, Events, FourTuple, OutSegment, RecvError, SendError, State};
pub use counters::{ConnCounters, DropReason};
pub use seq::SeqNum;
