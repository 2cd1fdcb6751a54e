//! Traffic model: client port partitioning, rte_flow rule compilation and the kernel
//! exception path that let luna and the kernel share one NIC.
//!
//! Not implemented yet; nothing here pretends to work.
#![forbid(unsafe_code)]
