//! r2c: the per-core run-to-completion runtime of luna.
//!
//! One thread per core, pinned, owning its NIC queue pair(s) through a [`device::Device`],
//! its own `luna_stack::stack::Stack`, timers and zbuf cache. No locks and no shared writes
//! on the data path. Being built (issue "r2c and knb"); see the README for what works.
#![warn(missing_docs)]

pub mod device;
