//! Buffers at the C edge: `luna_zbuf_mut_t` (writable, from a core's zbuf cache),
//! `luna_zbuf_t` (frozen, shared, zero copy), `luna_iovec_t` (received segments).
//! Every handle C gets is C's to free, once; luna never takes one over (sending a
//! `luna_zbuf_t` shares its bytes by reference count).

use crate::error::{guard, null, Fail, Res};
use std::ffi::{c_int, c_void};
use zbuf::{IoVec, Zbuf, ZbufMut};

/// A writable buffer. Opaque; from `luna_ctx_alloc` / `luna_sock_alloc`.
pub struct luna_zbuf_mut_t(pub(crate) ZbufMut);
/// A frozen (read-only, shareable) buffer. Opaque.
pub struct luna_zbuf_t(pub(crate) Zbuf);
/// Received bytes as a list of zero-copy segments. Opaque.
pub struct luna_iovec_t(pub(crate) IoVec);

// Buffers may be freed on any thread (the slab takes remote frees).
const _: () = {
    const fn send<T: Send>() {}
    send::<Zbuf>();
    send::<ZbufMut>();
    send::<IoVec>();
};

pub(crate) fn boxed<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

/// # Safety
/// `p` is NULL or a live handle of this type.
pub(crate) unsafe fn get<'a, T>(p: *const T, what: &str) -> Res<&'a T> {
    // SAFETY: NULL or live (caller's contract).
    unsafe { p.as_ref() }.ok_or_else(|| null(what))
}

/// # Safety
/// `p` is NULL or a live handle of this type, not aliased.
pub(crate) unsafe fn get_mut<'a, T>(p: *mut T, what: &str) -> Res<&'a mut T> {
    // SAFETY: NULL or live and unaliased (caller's contract).
    unsafe { p.as_mut() }.ok_or_else(|| null(what))
}

/// Appends `len` bytes from `data`; 0, or -1 with `ENOBUFS` (no tailroom: nothing
/// appended), `EINVAL` (NULL).
///
/// # Safety
/// `b` is NULL or live; `data` points to `len` readable bytes (may be NULL if `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn luna_zbuf_mut_append(
    b: *mut luna_zbuf_mut_t,
    data: *const c_void,
    len: usize,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let b = unsafe { get_mut(b, "buffer") }?;
        if len == 0 {
            return Ok(0);
        }
        if data.is_null() {
            return Err(null("data"));
        }
        // SAFETY: `data` holds `len` readable bytes (caller's contract).
        let src = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
        b.0.extend_from_slice(src).map_err(|_| {
            Fail::new(
                libc::ENOBUFS,
                format!("{len} bytes do not fit (tailroom {})", b.0.tailroom()),
            )
        })?;
        Ok(0)
    })
}

/// Grows the buffer by `len` zeroed bytes and returns a pointer to them, to write in
/// place (valid until the next call on `b`); NULL with `ENOBUFS` (no tailroom),
/// `EINVAL` (NULL).
///
/// # Safety
/// `b` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn luna_zbuf_mut_extend(b: *mut luna_zbuf_mut_t, len: usize) -> *mut u8 {
    guard(std::ptr::null_mut(), || {
        // SAFETY: forwarded caller contract.
        let b = unsafe { get_mut(b, "buffer") }?;
        let room = b.0.tailroom();
        let s = b.0.append(len).map_err(|_| {
            Fail::new(
                libc::ENOBUFS,
                format!("{len} bytes do not fit (tailroom {room})"),
            )
        })?;
        s.fill(0);
        Ok(s.as_mut_ptr())
    })
}

/// Bytes written so far; 0 for NULL.
///
/// # Safety
/// `b` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn luna_zbuf_mut_len(b: *const luna_zbuf_mut_t) -> usize {
    // SAFETY: forwarded caller contract.
    guard(0, || Ok(unsafe { get(b, "buffer") }?.0.len()))
}

/// Bytes that can still be appended; 0 for NULL.
///
/// # Safety
/// `b` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn luna_zbuf_mut_tailroom(b: *const luna_zbuf_mut_t) -> usize {
    // SAFETY: forwarded caller contract.
    guard(0, || Ok(unsafe { get(b, "buffer") }?.0.tailroom()))
}

/// Freezes a writable buffer into a shareable one. `b` is consumed (also on failure);
/// NULL with `EINVAL` for NULL.
///
/// # Safety
/// `b` is NULL or live, not used again.
#[no_mangle]
pub unsafe extern "C" fn luna_zbuf_freeze(b: *mut luna_zbuf_mut_t) -> *mut luna_zbuf_t {
    guard(std::ptr::null_mut(), || {
        if b.is_null() {
            return Err(null("buffer"));
        }
        // SAFETY: made by Box::into_raw, consumed once here.
        let m = unsafe { Box::from_raw(b) };
        Ok(boxed(luna_zbuf_t(m.0.freeze())))
    })
}

/// Frees a writable buffer (NULL is a no-op).
///
/// # Safety
/// `b` is NULL or live, not used again.
#[no_mangle]
pub unsafe extern "C" fn luna_zbuf_mut_free(b: *mut luna_zbuf_mut_t) {
    if !b.is_null() {
        guard((), || {
            // SAFETY: made by Box::into_raw, freed once.
            drop(unsafe { Box::from_raw(b) });
            Ok(())
        })
    }
}

/// The buffer's bytes (`luna_zbuf_len` of them; NULL for NULL or an empty buffer).
///
/// # Safety
/// `z` is NULL or live; the pointer is valid while `z` is.
#[no_mangle]
pub unsafe extern "C" fn luna_zbuf_data(z: *const luna_zbuf_t) -> *const u8 {
    guard(std::ptr::null(), || {
        // SAFETY: forwarded caller contract.
        let z = unsafe { get(z, "buffer") }?;
        Ok(if z.0.is_empty() {
            std::ptr::null()
        } else {
            z.0.as_slice().as_ptr()
        })
    })
}

/// The buffer's length; 0 for NULL.
///
/// # Safety
/// `z` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn luna_zbuf_len(z: *const luna_zbuf_t) -> usize {
    // SAFETY: forwarded caller contract.
    guard(0, || Ok(unsafe { get(z, "buffer") }?.0.len()))
}

/// A new handle on bytes `off..off+len` of `z` (zero copy, shares the memory); NULL with
/// `EINVAL` (NULL, or the range is outside the buffer).
///
/// # Safety
/// `z` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn luna_zbuf_slice(
    z: *const luna_zbuf_t,
    off: usize,
    len: usize,
) -> *mut luna_zbuf_t {
    guard(std::ptr::null_mut(), || {
        // SAFETY: forwarded caller contract.
        let z = unsafe { get(z, "buffer") }?;
        let end = off
            .checked_add(len)
            .filter(|&e| e <= z.0.len())
            .ok_or_else(|| {
                Fail::new(
                    libc::EINVAL,
                    format!(
                        "range {off}+{len} is outside the buffer of {} bytes",
                        z.0.len()
                    ),
                )
            })?;
        Ok(boxed(luna_zbuf_t(z.0.slice(off..end))))
    })
}

/// Frees a buffer handle (NULL is a no-op); the memory goes back to its cache when the
/// last handle (or send queue) holding it lets go. Any thread.
///
/// # Safety
/// `z` is NULL or live, not used again.
#[no_mangle]
pub unsafe extern "C" fn luna_zbuf_free(z: *mut luna_zbuf_t) {
    if !z.is_null() {
        guard((), || {
            // SAFETY: made by Box::into_raw, freed once.
            drop(unsafe { Box::from_raw(z) });
            Ok(())
        })
    }
}

/// Total bytes of the io-vector; 0 for NULL.
///
/// # Safety
/// `v` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn luna_iovec_len(v: *const luna_iovec_t) -> usize {
    // SAFETY: forwarded caller contract.
    guard(0, || Ok(unsafe { get(v, "iovec") }?.0.len()))
}

/// Number of segments; 0 for NULL.
///
/// # Safety
/// `v` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn luna_iovec_count(v: *const luna_iovec_t) -> usize {
    // SAFETY: forwarded caller contract.
    guard(0, || Ok(unsafe { get(v, "iovec") }?.0.num_segments()))
}

/// Segment `i`: its bytes in `*data` and `*len` (valid while `v` is). 0, or -1 with
/// `EINVAL` (NULL argument, `i` out of range).
///
/// # Safety
/// `v` is NULL or live; `data` and `len` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn luna_iovec_segment(
    v: *const luna_iovec_t,
    i: usize,
    data: *mut *const u8,
    len: *mut usize,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let v = unsafe { get(v, "iovec") }?;
        if data.is_null() || len.is_null() {
            return Err(null("data or len"));
        }
        let seg = v.0.segments().get(i).ok_or_else(|| {
            Fail::new(
                libc::EINVAL,
                format!("segment {i} out of range ({} segments)", v.0.num_segments()),
            )
        })?;
        // SAFETY: both out pointers are non-NULL and writable (caller's contract).
        unsafe {
            *data = seg.as_slice().as_ptr();
            *len = seg.len();
        }
        Ok(0)
    })
}

/// Segment `i` as its own buffer handle (zero copy; free it with `luna_zbuf_free`);
/// NULL with `EINVAL` (NULL, out of range).
///
/// # Safety
/// `v` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn luna_iovec_zbuf(v: *const luna_iovec_t, i: usize) -> *mut luna_zbuf_t {
    guard(std::ptr::null_mut(), || {
        // SAFETY: forwarded caller contract.
        let v = unsafe { get(v, "iovec") }?;
        let seg =
            v.0.segments()
                .get(i)
                .ok_or_else(|| Fail::new(libc::EINVAL, format!("segment {i} out of range")))?;
        Ok(boxed(luna_zbuf_t(seg.clone())))
    })
}

/// Frees an io-vector (NULL is a no-op). Any thread.
///
/// # Safety
/// `v` is NULL or live, not used again.
#[no_mangle]
pub unsafe extern "C" fn luna_iovec_free(v: *mut luna_iovec_t) {
    if !v.is_null() {
        guard((), || {
            // SAFETY: made by Box::into_raw, freed once.
            drop(unsafe { Box::from_raw(v) });
            Ok(())
        })
    }
}
