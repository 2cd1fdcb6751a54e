//! The real libc functions (`dlsym(RTLD_NEXT, ..)`), resolved once.

use libc::{c_int, c_void, epoll_event, iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};
use std::sync::OnceLock;

/// Pointers to libc's implementations of every function this shim exports.
pub(crate) struct Real {
    pub bind: Option<unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int>,
    pub listen: Option<unsafe extern "C" fn(c_int, c_int) -> c_int>,
    pub accept4: Option<unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int>,
    pub connect: Option<unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int>,
    pub read: Option<unsafe extern "C" fn(c_int, *mut c_void, size_t) -> ssize_t>,
    pub write: Option<unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t>,
    pub readv: Option<unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t>,
    pub writev: Option<unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t>,
    pub send: Option<unsafe extern "C" fn(c_int, *const c_void, size_t, c_int) -> ssize_t>,
    pub recv: Option<unsafe extern "C" fn(c_int, *mut c_void, size_t, c_int) -> ssize_t>,
    #[allow(clippy::type_complexity)]
    pub sendto: Option<
        unsafe extern "C" fn(
            c_int,
            *const c_void,
            size_t,
            c_int,
            *const sockaddr,
            socklen_t,
        ) -> ssize_t,
    >,
    #[allow(clippy::type_complexity)]
    pub recvfrom: Option<
        unsafe extern "C" fn(
            c_int,
            *mut c_void,
            size_t,
            c_int,
            *mut sockaddr,
            *mut socklen_t,
        ) -> ssize_t,
    >,
    pub sendmsg: Option<unsafe extern "C" fn(c_int, *const msghdr, c_int) -> ssize_t>,
    pub recvmsg: Option<unsafe extern "C" fn(c_int, *mut msghdr, c_int) -> ssize_t>,
    pub close: Option<unsafe extern "C" fn(c_int) -> c_int>,
    pub close_range: Option<unsafe extern "C" fn(libc::c_uint, libc::c_uint, c_int) -> c_int>,
    pub closefrom: Option<unsafe extern "C" fn(c_int)>,
    pub shutdown: Option<unsafe extern "C" fn(c_int, c_int) -> c_int>,
    pub setsockopt:
        Option<unsafe extern "C" fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int>,
    pub getsockopt:
        Option<unsafe extern "C" fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int>,
    pub getsockname: Option<unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int>,
    pub getpeername: Option<unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int>,
    pub ioctl: Option<unsafe extern "C" fn(c_int, libc::c_ulong, *mut c_void) -> c_int>,
    pub epoll_ctl: Option<unsafe extern "C" fn(c_int, c_int, c_int, *mut epoll_event) -> c_int>,
    pub epoll_wait: Option<unsafe extern "C" fn(c_int, *mut epoll_event, c_int, c_int) -> c_int>,
    #[allow(clippy::type_complexity)]
    pub epoll_pwait: Option<
        unsafe extern "C" fn(c_int, *mut epoll_event, c_int, c_int, *const libc::sigset_t) -> c_int,
    >,
    #[allow(clippy::type_complexity)]
    pub epoll_pwait2: Option<
        unsafe extern "C" fn(
            c_int,
            *mut epoll_event,
            c_int,
            *const libc::timespec,
            *const libc::sigset_t,
        ) -> c_int,
    >,
    pub poll: Option<unsafe extern "C" fn(*mut libc::pollfd, libc::nfds_t, c_int) -> c_int>,
    #[allow(clippy::type_complexity)]
    pub ppoll: Option<
        unsafe extern "C" fn(
            *mut libc::pollfd,
            libc::nfds_t,
            *const libc::timespec,
            *const libc::sigset_t,
        ) -> c_int,
    >,
    #[allow(clippy::type_complexity)]
    pub select: Option<
        unsafe extern "C" fn(
            c_int,
            *mut libc::fd_set,
            *mut libc::fd_set,
            *mut libc::fd_set,
            *mut libc::timeval,
        ) -> c_int,
    >,
    #[allow(clippy::type_complexity)]
    pub pselect: Option<
        unsafe extern "C" fn(
            c_int,
            *mut libc::fd_set,
            *mut libc::fd_set,
            *mut libc::fd_set,
            *const libc::timespec,
            *const libc::sigset_t,
        ) -> c_int,
    >,
    pub dup: Option<unsafe extern "C" fn(c_int) -> c_int>,
    pub dup2: Option<unsafe extern "C" fn(c_int, c_int) -> c_int>,
    pub dup3: Option<unsafe extern "C" fn(c_int, c_int, c_int) -> c_int>,
    /// Variadic in C; declared with its one word argument (see `hooks::fcntl`).
    pub fcntl: Option<unsafe extern "C" fn(c_int, c_int, libc::c_ulong) -> c_int>,
    pub fcntl64: Option<unsafe extern "C" fn(c_int, c_int, libc::c_ulong) -> c_int>,
}

pub(crate) fn sym<T: Copy>(name: &std::ffi::CStr) -> Option<T> {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds the next definition
    // after this library (libc's).
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: T is the function-pointer type of the symbol named `name`, as declared by
    // glibc's headers (each field above spells the prototype); pointer sized.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

/// libc's functions.
pub(crate) fn real() -> &'static Real {
    static REAL: OnceLock<Real> = OnceLock::new();
    REAL.get_or_init(|| Real {
        bind: sym(c"bind"),
        listen: sym(c"listen"),
        accept4: sym(c"accept4"),
        connect: sym(c"connect"),
        read: sym(c"read"),
        write: sym(c"write"),
        readv: sym(c"readv"),
        writev: sym(c"writev"),
        send: sym(c"send"),
        recv: sym(c"recv"),
        sendto: sym(c"sendto"),
        recvfrom: sym(c"recvfrom"),
        sendmsg: sym(c"sendmsg"),
        recvmsg: sym(c"recvmsg"),
        close: sym(c"close"),
        close_range: sym(c"close_range"),
        closefrom: sym(c"closefrom"),
        shutdown: sym(c"shutdown"),
        setsockopt: sym(c"setsockopt"),
        getsockopt: sym(c"getsockopt"),
        getsockname: sym(c"getsockname"),
        getpeername: sym(c"getpeername"),
        ioctl: sym(c"ioctl"),
        epoll_ctl: sym(c"epoll_ctl"),
        epoll_wait: sym(c"epoll_wait"),
        epoll_pwait: sym(c"epoll_pwait"),
        epoll_pwait2: sym(c"epoll_pwait2"),
        poll: sym(c"poll"),
        ppoll: sym(c"ppoll"),
        select: sym(c"select"),
        pselect: sym(c"pselect"),
        dup: sym(c"dup"),
        dup2: sym(c"dup2"),
        dup3: sym(c"dup3"),
        fcntl: sym(c"fcntl"),
        fcntl64: sym(c"fcntl64"),
    })
}

/// Calls libc's `$name` with `$args`, or fails with `ENOSYS` if it was not found.
macro_rules! call_real {
    ($name:ident ( $($arg:expr),* $(,)? )) => {
        match $crate::real::real().$name {
            Some(f) => f($($arg),*),
            None => {
                $crate::set_errno(libc::ENOSYS);
                -1 as _
            }
        }
    };
}
pub(crate) use call_real;
