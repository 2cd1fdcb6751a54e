//! `libluna-preload.so`: an `LD_PRELOAD` shim that puts an unmodified program's IPv4 TCP
//! sockets on luna, leaving every other descriptor to the kernel.
//!
//! Contract (the design is in `ffi/preload/README.md`):
//! * Without `LUNA_CONFIG` (r2c's TOML configuration) every call goes to libc.
//! * An `AF_INET`/`SOCK_STREAM` kernel socket becomes a luna socket when it is bound to
//!   luna's address or `0.0.0.0`, or connected (unbound) to an address luna routes (not
//!   loopback). The first such call starts DPDK and the poll thread (r2c batch mode, one
//!   core). UNIX, IPv6, UDP and everything else stay in the kernel.
//! * A luna socket keeps its kernel descriptor number (the original, never-bound kernel
//!   socket stays open as a placeholder), so numbers never collide; `fcntl`
//!   `F_GETFL`/`F_SETFL` and `FIONBIO` act on that placeholder, whose `O_NONBLOCK` the
//!   shim reads.
//! * Application threads never touch the stack: they read and write per-socket buffers
//!   that the poll thread fills and drains; blocking calls sleep in a futex wait on the
//!   socket (a signal ends or restarts it as on Linux).
//! * epoll sets mix kernel and luna descriptors; `poll`, `select` and `pselect` too.
//! * After `fork` the child sees luna sockets as their (unconnected) kernel
//!   placeholders: it must not use them (redis: `save ""`, `appendonly no`).
//! * No call panics across the C boundary: a failure is `-1` and `errno`.

#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

mod engine;
mod epoll;
mod hooks;
mod real;
mod select;
mod sock;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// luna is running in this process (false before the first luna socket and in a forked
/// child).
pub(crate) static ACTIVE: AtomicBool = AtomicBool::new(false);
/// This process is a child forked after luna started.
pub(crate) static FORKED: AtomicBool = AtomicBool::new(false);
/// The process that started luna (0: not started).
pub(crate) static PID: AtomicI32 = AtomicI32::new(0);

/// Whether the caller is a child that shares this process's memory without being it: a
/// `vfork` (CPython's subprocess starts its children so; `pthread_atfork` handlers do
/// not run) between its start and its `exec`. Its `dup2`/`close` act on its own
/// descriptors and must not touch the shared descriptor table of the parent's luna
/// sockets.
pub(crate) fn vfork_child() -> bool {
    let p = PID.load(Ordering::Relaxed);
    // SAFETY: getpid has no preconditions (a system call: glibc caches no pid).
    p != 0 && p != unsafe { libc::getpid() }
}

thread_local! {
    static INTERNAL: Cell<u32> = const { Cell::new(0) };
}

/// While alive, the calling thread's libc calls go straight to libc (the shim's own
/// work: loading the config, DPDK's initialisation).
pub(crate) struct Internal;

impl Internal {
    pub(crate) fn enter() -> Internal {
        let _ = INTERNAL.try_with(|c| c.set(c.get().saturating_add(1)));
        Internal
    }

    /// For good: the poll thread.
    pub(crate) fn mark_thread() {
        let _ = INTERNAL.try_with(|c| c.set(u32::MAX / 2));
    }
}

impl Drop for Internal {
    fn drop(&mut self) {
        let _ = INTERNAL.try_with(|c| c.set(c.get().saturating_sub(1)));
    }
}

/// Whether the calling thread is the shim's own (also during thread teardown, when the
/// thread-local is gone).
pub(crate) fn internal() -> bool {
    INTERNAL.try_with(|c| c.get() > 0).unwrap_or(true)
}

/// `LUNA_PRELOAD_DEBUG` is set: the poll thread reports failed connections on stderr.
pub(crate) fn debug() -> bool {
    static DEBUG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var_os("LUNA_PRELOAD_DEBUG").is_some())
}

/// The calling thread's `errno`.
pub(crate) fn errno() -> i32 {
    // SAFETY: glibc's per-thread errno location is always valid.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e }
}
