//! The error type of the DPDK glue, below its registry, receive and transmit parts.

/// Errors of the DPDK glue: setup problems, never per-packet conditions.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DpdkError {
    /// A DPDK call failed (the error carries the step, errno and DPDK's log lines).
    #[error(transparent)]
    Dpdk(#[from] dpdk_sys::Error),
    /// The slab could not provide memory.
    #[error(transparent)]
    Alloc(#[from] crate::AllocError),
    /// Registering memory with DPDK failed.
    #[error("zbuf-dpdk: {0}")]
    Register(String),
    /// A parameter is out of range.
    #[error("zbuf-dpdk: invalid configuration: {0}")]
    Config(String),
}
