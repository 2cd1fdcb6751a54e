//! Mirrors the kernel's neighbours, routes and addresses into luna-stack's tables.
//!
//! Not implemented yet; nothing here pretends to work.
#![forbid(unsafe_code)]
