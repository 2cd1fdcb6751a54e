//! Captures DPDK's log stream so that errors can quote what DPDK said.
//!
//! DPDK logs through a `FILE *` (rte_openlog_stream). We install a glibc
//! `fopencookie` stream whose write callback forwards each line to stderr (if
//! enabled) and keeps the recent warning/error lines in a small ring that
//! [`crate::Error`] drains when a DPDK call fails.

use std::collections::VecDeque;
use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::ffi;

const KEEP_LINES: usize = 32;
/// RTE_LOG_WARNING; lines at this level or more severe are kept.
const KEEP_LEVEL: c_int = 5;

struct State {
    partial: Vec<u8>,
    partial_level: c_int,
    errors: VecDeque<String>,
}

static STATE: Mutex<State> = Mutex::new(State {
    partial: Vec::new(),
    partial_level: 0,
    errors: VecDeque::new(),
});
static FORWARD: AtomicBool = AtomicBool::new(true);
static INSTALLED: AtomicBool = AtomicBool::new(false);

fn state() -> std::sync::MutexGuard<'static, State> {
    // A poisoned lock only means a panic elsewhere; the log ring is still fine.
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Drains the warning/error lines DPDK logged since the last call.
pub(crate) fn take_errors() -> Vec<String> {
    state().errors.drain(..).collect()
}

/// Forgets earlier lines so the next [`take_errors`] reports only new ones.
pub(crate) fn clear() {
    state().errors.clear();
}

/// Whether DPDK's log lines are also written to stderr (default: yes).
pub fn set_forward_to_stderr(on: bool) {
    FORWARD.store(on, Ordering::Relaxed);
}

extern "C" fn write_cb(buf: *const c_char, size: usize) -> std::os::raw::c_long {
    if buf.is_null() || size == 0 {
        return 0;
    }
    // SAFETY: stdio hands us `size` readable bytes at `buf` for this call.
    let bytes = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), size) };
    if FORWARD.load(Ordering::Relaxed) {
        // SAFETY: writes the caller's bytes to fd 2; a short write only loses log text.
        unsafe {
            libc::write(2, bytes.as_ptr().cast(), bytes.len());
        }
    }
    // SAFETY: no preconditions; returns the level of the message being
    // written by this thread.
    let level = unsafe { ffi::rte_log_cur_msg_loglevel() };
    let mut st = state();
    if st.partial.is_empty() {
        st.partial_level = level;
    }
    for &b in bytes {
        if b == b'\n' {
            let line = String::from_utf8_lossy(&st.partial).trim().to_owned();
            let lvl = st.partial_level;
            st.partial.clear();
            st.partial_level = level;
            if !line.is_empty() && lvl > 0 && lvl <= KEEP_LEVEL {
                if st.errors.len() == KEEP_LINES {
                    st.errors.pop_front();
                }
                st.errors.push_back(line);
            }
        } else {
            st.partial.push(b);
        }
    }
    size as std::os::raw::c_long
}

/// Installs the capture stream (idempotent). Called before `rte_eal_init`.
pub(crate) fn install() {
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return;
    }
    // SAFETY: write_cb is a thread-safe extern "C" function living for the
    // whole process; the shim's FILE is never closed.
    if unsafe { ffi::dpdk_sys_log_capture(Some(write_cb)) } != 0 {
        INSTALLED.store(false, Ordering::SeqCst);
    }
}
