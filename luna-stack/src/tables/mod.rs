//! Neighbour (ARP) and route tables the core reads; filled statically or by netlink-sync.
//!
//! Both are bounded and deterministic: the same sequence of calls gives the same contents
//! and the same answers, whatever the hash seed or insertion history.

use core::fmt;

pub mod neighbour;
pub mod route;

pub use neighbour::{Neighbour, NeighbourConfig, NeighbourState, NeighbourTable, Resolution};
pub use route::{NextHop, Route, RouteTable};

/// A bounded table has no room, and nothing may be evicted for the new entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableFull;

impl fmt::Display for TableFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("table full")
    }
}

impl std::error::Error for TableFull {}
