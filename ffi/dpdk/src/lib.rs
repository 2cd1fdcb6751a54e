//! Bindings to the installed DPDK and a thin safe layer over them.
//!
//! * [`ffi`]: bindgen output for an allowlisted part of DPDK, generated at
//!   build time from the headers pkg-config finds (Debian's 22.11; 24.11 checked by
//!   `make test-dpdk-compat`),
//!   plus `dpdk_sys_*` wrappers (csrc/shim.c) for DPDK's static-inline fast
//!   path and for structs whose layout differs between releases.
//! * Safe layer: [`eal`] (init once, cleanup on drop, hugepage
//!   [`preflight`]), [`mempool`], [`mbuf`], [`ethdev`] (ports, queues,
//!   bursts), [`flow`] (rte_flow) and [`error`].
//!
//! PMDs: Debian's shared DPDK loads every driver in its plugin directory
//! ([`eal::pmd_dir`]) at `rte_eal_init`, so `net_memif`, `net_tap`,
//! `net_af_packet`, `net_ring` and `net_null` need no `-d` argument.
//!
//! Send/Sync summary: [`Eal`], [`Mempool`] and [`Mbuf`] are `Send + Sync`;
//! [`Port`], [`RxQueue`], [`TxQueue`] and [`flow::Flow`] are `Send` only —
//! a queue belongs to one thread (lcore) at a time.

#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

#[allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    missing_docs,
    dead_code,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc,
    unsafe_op_in_unsafe_fn
)]
pub mod ffi {
    //! Raw bindings (bindgen) and shim declarations.
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

pub mod eal;
pub mod error;
pub mod ethdev;
pub mod flow;
mod log;
pub mod mbuf;
pub mod mempool;
pub mod preflight;
pub mod tapclaim;
pub mod tapsignal;

pub use eal::{Eal, EalBuilder};
pub use error::{Error, ErrorKind, Result};
pub use ethdev::{DevInfo, Link, Port, PortConf, RxQueue, Stats, TxQueue};
pub use flow::{Flow, FlowAction, FlowAttr, FlowItem, FlowRule};
pub use log::set_forward_to_stderr as set_log_to_stderr;
pub use mbuf::Mbuf;
pub use mempool::{ExtMem, Mempool, PoolConfig, TxOffloadFields};

#[cfg(test)]
mod tests {
    use super::*;

    fn send<T: Send>() {}
    fn sync<T: Sync>() {}

    /// The thread-safety contract documented above, checked by the compiler.
    #[test]
    fn send_sync_contract() {
        send::<Eal>();
        sync::<Eal>();
        send::<Mempool>();
        sync::<Mempool>();
        send::<Mbuf>();
        sync::<Mbuf>();
        send::<Port>();
        send::<RxQueue>();
        send::<TxQueue>();
        send::<Flow>();
    }

    #[test]
    fn constants_come_from_dpdk_headers() {
        assert_eq!(
            ffi::RTE_ETH_RSS_IP & ffi::RTE_ETH_RSS_IPV4,
            ffi::RTE_ETH_RSS_IPV4
        );
        assert_eq!(
            ffi::RTE_MBUF_DEFAULT_BUF_SIZE,
            ffi::RTE_MBUF_DEFAULT_DATAROOM + ffi::RTE_PKTMBUF_HEADROOM
        );
        assert_ne!(ffi::RTE_ETH_TX_OFFLOAD_MULTI_SEGS, 0);
    }
}
