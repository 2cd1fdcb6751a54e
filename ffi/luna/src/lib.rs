//! luna's C ABI (`luna.h`): link luna into a C or C++ storage frontend.
//!
//! Call order: [`luna_init`] (TOML config + overrides → EAL, zbuf slab, device, one
//! queue pair per core) → [`luna_run_inline`] (C callbacks inside packet processing)
//! or [`luna_run_batch`] (a socket/epoll-like API from a C `on_poll`) → the cores run
//! on their own threads → [`luna_runtime_stop`] (or a callback's request) →
//! [`luna_runtime_join`] → [`luna_runtime_stats`] (final counters) →
//! [`luna_runtime_free`], [`luna_env_free`].
//!
//! Errors: functions return -1 / NULL and set `errno` (and a message for
//! [`luna_last_error`]); every errno is listed on its function and in the README.
//! Panics never cross the boundary: they are caught and reported as `EIO`. NULL
//! arguments are `EINVAL`; unknown connection, listener or socket ids are `EBADF`.
//! What cannot be checked: a dangling pointer (a freed handle, a context used after its
//! callback returned) — the README's thread rules say which pointer lives how long.
//!
//! `include/luna.h` is generated from this crate by cbindgen (`tests/header.rs` checks
//! it is current; `LUNA_UPDATE_HEADER=1 cargo test -p luna-capi --test header`
//! rewrites it).
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![allow(non_camel_case_types)]

mod batch;
mod buf;
mod env;
mod error;
mod handles;
mod inline;
mod stats;

pub use batch::*;
pub use buf::*;
pub use env::{
    env_from_mem, luna_env_cores, luna_env_free, luna_env_t, luna_init, luna_runtime_cores,
    luna_runtime_finished, luna_runtime_free, luna_runtime_join, luna_runtime_stop, luna_runtime_t,
};
pub use error::luna_last_error;
pub use inline::*;
pub use stats::*;

use luna_stack::tcp::CloseReason;
use std::ffi::c_void;
use std::net::{Ipv4Addr, SocketAddrV4};

/// An IPv4 address and TCP port.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct luna_addr_t {
    /// The address in network byte order, as `struct in_addr.s_addr`.
    pub addr: u32,
    /// The port in host byte order.
    pub port: u16,
    /// Zero.
    pub reserved: u16,
}

impl luna_addr_t {
    pub(crate) fn to_socket(self) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::from(u32::from_be(self.addr)), self.port)
    }

    pub(crate) fn from_socket(a: SocketAddrV4) -> luna_addr_t {
        luna_addr_t {
            addr: u32::from(*a.ip()).to_be(),
            port: a.port(),
            reserved: 0,
        }
    }
}

/// The errno of a close reason (0 for an orderly close).
pub(crate) fn errno_close(r: Option<CloseReason>) -> i32 {
    match r {
        None | Some(CloseReason::Normal) => 0,
        Some(CloseReason::Reset) => libc::ECONNRESET,
        Some(CloseReason::Refused) => libc::ECONNREFUSED,
        Some(CloseReason::Timeout) => libc::ETIMEDOUT,
        Some(CloseReason::Aborted) => libc::ECONNABORTED,
        Some(CloseReason::HostUnreachable) => libc::EHOSTUNREACH,
    }
}

/// The application's `void *user`, handed to every core's callbacks.
#[derive(Clone, Copy)]
pub(crate) struct UserPtr(pub *mut c_void);

// SAFETY: luna never dereferences the pointer; it only passes it back to the
// application's callbacks, which the documented thread rules make responsible for
// sharing what it points to between core threads.
unsafe impl Send for UserPtr {}
// SAFETY: as above: luna only copies the pointer value.
unsafe impl Sync for UserPtr {}
