//! Message sockets: RPCs detached from connections and scheduled across workers
//! (Rakaia-style CP/CS/MS queueing, power-of-two choices, stealing, transmit delegation).
//!
//! Not implemented yet; nothing here pretends to work.
#![forbid(unsafe_code)]
