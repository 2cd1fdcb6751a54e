//! Bindings to the installed DPDK and a thin safe layer over them.
//!
//! Not implemented yet (issue "Foundation").
