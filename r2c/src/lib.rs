//! r2c: the per-core run-to-completion runtime (inline and batch modes).
//!
//! Not implemented yet (issue "r2c and knb"); nothing here pretends to work.
#![forbid(unsafe_code)]
