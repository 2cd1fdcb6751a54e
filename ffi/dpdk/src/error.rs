//! One error type for the safe layer: what failed (the step), why (DPDK's
//! errno text and the DPDK log lines printed while it failed) and how to fix
//! it.

use std::ffi::CStr;
use std::fmt;

use crate::ffi;

/// What kind of operation failed; match on this, print the [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The hugepage / hugetlbfs preflight before `rte_eal_init` found a problem.
    Preflight,
    /// EAL was already initialised (or initialised and cleaned up) in this process.
    AlreadyInitialized,
    /// `rte_eal_init` failed.
    EalInit,
    /// No port with that name or id.
    PortNotFound,
    /// The port is already opened through another [`crate::ethdev::Port`] handle.
    PortBusy,
    /// Configuring the device or setting up a queue failed.
    PortConfigure,
    /// `rte_eth_dev_start` / `stop` failed or the port is in the wrong state.
    PortState,
    /// Queries on a port (info, stats, link, MAC...) failed.
    PortQuery,
    /// Creating a mempool failed.
    Mempool,
    /// `rte_flow` validate / create / destroy failed.
    Flow,
    /// An argument was rejected before calling DPDK.
    InvalidArgument,
    /// A wait (link up...) ran out of time.
    Timeout,
    /// A tap interface (`iface=`) is already open in another process.
    InterfaceBusy,
}

/// Error of the safe layer. `Display` prints one line:
/// `<step> failed: <cause> (errno) — <fix>` followed by DPDK's own log lines,
/// if it printed any error while failing.
#[derive(Debug, Clone)]
pub struct Error {
    kind: ErrorKind,
    step: String,
    cause: String,
    errno: Option<i32>,
    fix: Option<String>,
    dpdk_log: Vec<String>,
}

/// Result alias of the safe layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn new(kind: ErrorKind, step: impl Into<String>, cause: impl Into<String>) -> Self {
        Error {
            kind,
            step: step.into(),
            cause: cause.into(),
            errno: None,
            fix: None,
            dpdk_log: Vec::new(),
        }
    }

    /// Error from a DPDK call that reported `errno` (positive). Some DPDK
    /// failures leave rte_errno at 0: then there is no errno to quote
    /// (strerror(0) would say "Success").
    pub(crate) fn dpdk(kind: ErrorKind, step: impl Into<String>, errno: i32) -> Self {
        let errno = errno.abs();
        let cause = if errno == 0 {
            "DPDK reported no error code".to_string()
        } else {
            strerror(errno)
        };
        let mut e = Error::new(kind, step, cause);
        e.errno = (errno != 0).then_some(errno);
        e.dpdk_log = crate::log::take_errors();
        e
    }

    pub(crate) fn with_fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }

    pub(crate) fn with_cause(mut self, cause: impl Into<String>) -> Self {
        self.cause = cause.into();
        self
    }

    pub(crate) fn with_log(mut self, lines: Vec<String>) -> Self {
        self.dpdk_log = lines;
        self
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    /// The step that failed, e.g. `EAL init` or `configure port net_memif0`.
    pub fn step(&self) -> &str {
        &self.step
    }
    /// Why it failed.
    pub fn cause(&self) -> &str {
        &self.cause
    }
    /// DPDK's errno (positive), if the failure came from DPDK.
    pub fn errno(&self) -> Option<i32> {
        self.errno
    }
    /// What to do about it.
    pub fn fix(&self) -> Option<&str> {
        self.fix.as_deref()
    }
    /// Error/warning lines DPDK logged while the step failed.
    pub fn dpdk_log(&self) -> &[String] {
        &self.dpdk_log
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.step, self.cause)?;
        if let Some(e) = self.errno {
            write!(f, " (errno {e})")?;
        }
        if let Some(fix) = &self.fix {
            write!(f, " — {fix}")?;
        }
        for line in &self.dpdk_log {
            write!(f, "\n  dpdk: {line}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

/// Text for a DPDK errno (covers DPDK's own codes beyond the libc range).
pub fn strerror(errno: i32) -> String {
    // SAFETY: rte_strerror returns a pointer to a static or per-lcore buffer
    // holding a NUL-terminated string; it is copied out at once.
    unsafe {
        let p = ffi::rte_strerror(errno.abs());
        if p.is_null() {
            return format!("error {errno}");
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// The calling thread's `rte_errno` (DPDK's per-lcore TLS errno).
pub fn rte_errno() -> i32 {
    // SAFETY: reads a thread-local int through the shim; no preconditions.
    unsafe { ffi::dpdk_sys_errno() }
}
