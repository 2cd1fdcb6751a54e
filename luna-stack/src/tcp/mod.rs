//! TCP: sequence arithmetic, the RFC 9293 state machine, loss recovery and congestion control.

pub mod assembler;
pub mod cc;
pub mod isn;
pub mod rtt;
pub mod scoreboard;
pub mod seq;
pub mod syncookie;

pub use seq::SeqNum;
