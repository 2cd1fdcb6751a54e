//! errno at the C edge: every failing call sets `errno` and a per-thread message
//! ([`luna_last_error`]); panics are caught and become `EIO`.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A failure to report to C: the errno value and a one-line message.
#[derive(Debug, Clone)]
pub(crate) struct Fail {
    pub errno: i32,
    pub msg: String,
}

impl Fail {
    pub(crate) fn new(errno: i32, msg: impl Into<String>) -> Fail {
        Fail {
            errno,
            msg: msg.into(),
        }
    }
}

pub(crate) type Res<T> = Result<T, Fail>;

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Sets `errno` and this thread's last message.
pub(crate) fn set(f: &Fail) {
    let msg = CString::new(f.msg.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = msg);
    errno::set_errno(errno::Errno(f.errno));
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs `f`; on error (or a panic, reported as `EIO`) sets errno and returns `on_err`.
pub(crate) fn guard<T>(on_err: T, f: impl FnOnce() -> Res<T>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set(&e);
            on_err
        }
        Err(p) => {
            set(&Fail::new(
                libc::EIO,
                format!(
                    "internal error (panic caught at the C boundary): {}",
                    panic_text(&*p)
                ),
            ));
            on_err
        }
    }
}

/// The message of the last call that failed on this thread (`""` if none did). The
/// string stays valid until the next failing call on the same thread; never NULL.
#[no_mangle]
pub extern "C" fn luna_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// `EINVAL` for a NULL argument named `what`.
pub(crate) fn null(what: &str) -> Fail {
    Fail::new(libc::EINVAL, format!("{what} is NULL"))
}

/// `EBADF` for an unknown handle.
pub(crate) fn bad_handle(what: &str, v: u64) -> Fail {
    Fail::new(
        libc::EBADF,
        format!("{what} {v:#x} is not open on this core"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: luna_last_error returns a live NUL-terminated string.
        unsafe { CStr::from_ptr(luna_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_eio_with_its_message() {
        let r = guard(-1, || -> Res<i32> { panic!("boom at the edge") });
        assert_eq!(r, -1);
        assert_eq!(errno::errno().0, libc::EIO);
        assert!(last().contains("boom at the edge"), "{}", last());
    }

    #[test]
    fn errors_set_errno_and_the_message_successes_leave_them() {
        assert_eq!(
            guard(-1, || Err(Fail::new(libc::EBADF, "nope\0inside"))),
            -1
        );
        assert_eq!(errno::errno().0, libc::EBADF);
        assert_eq!(
            last(),
            "nope inside",
            "a NUL in a message cannot cut it short"
        );
        assert_eq!(guard(-1, || Ok(7)), 7);
        assert_eq!(last(), "nope inside");
    }
}
