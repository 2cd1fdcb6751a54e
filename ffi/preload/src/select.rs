//! `select(2)`/`pselect(2)` over luna sockets: the fd sets become a `pollfd` array for
//! the mixed poll path and the answer is written back into the sets, with the bit
//! meanings of Linux's `fs/select.c`.

use libc::{c_int, c_short, c_ulong, fd_set, pollfd};
use std::time::Duration;

const BITS: usize = c_ulong::BITS as usize;

/// Linux's `POLLIN_SET`: what makes a descriptor of `readfds` ready (a socket at end of
/// stream or with an error is readable).
pub(crate) const IN_SET: c_short =
    libc::POLLIN | libc::POLLRDNORM | libc::POLLRDBAND | libc::POLLHUP | libc::POLLERR;
/// Linux's `POLLOUT_SET` (`writefds`).
pub(crate) const OUT_SET: c_short =
    libc::POLLOUT | libc::POLLWRNORM | libc::POLLWRBAND | libc::POLLERR;
/// Linux's `POLLEX_SET` (`exceptfds`).
pub(crate) const EX_SET: c_short = libc::POLLPRI;

/// The three sets of a call (each may be null).
#[derive(Clone, Copy)]
pub(crate) struct Sets {
    pub nfds: usize,
    pub sets: [*mut fd_set; 3],
}

impl Sets {
    fn words(&self) -> usize {
        self.nfds.div_ceil(BITS)
    }

    /// Word `i` of set `k` (0 when the set is null).
    ///
    /// # Safety
    /// Each non-null set holds at least `nfds` bits (select(2)'s contract).
    unsafe fn word(&self, k: usize, i: usize) -> c_ulong {
        let p = self.sets[k];
        if p.is_null() {
            return 0;
        }
        // SAFETY: the caller's set holds `nfds` bits, so word `i` < words() exists.
        unsafe { std::ptr::read_unaligned(p.cast::<c_ulong>().add(i)) }
    }

    /// The descriptors below `nfds` in any set, in order.
    ///
    /// # Safety
    /// As [`Sets::word`].
    pub unsafe fn fds(&self) -> Vec<c_int> {
        let mut v = Vec::new();
        for i in 0..self.words() {
            // SAFETY: i < words().
            let mut w = unsafe { self.word(0, i) | self.word(1, i) | self.word(2, i) };
            while w != 0 {
                let b = w.trailing_zeros() as usize;
                w &= w - 1;
                let fd = i * BITS + b;
                if fd < self.nfds {
                    v.push(fd as c_int);
                }
            }
        }
        v
    }

    /// Whether `fd` (< `nfds`) is in any set.
    ///
    /// # Safety
    /// As [`Sets::word`].
    pub unsafe fn contains(&self, fd: c_int) -> bool {
        if fd < 0 || fd as usize >= self.nfds {
            return false;
        }
        let (i, b) = (fd as usize / BITS, fd as usize % BITS);
        // SAFETY: i < words() since fd < nfds.
        (0..3).any(|k| unsafe { self.word(k, i) } >> b & 1 != 0)
    }

    /// The `pollfd` array asking what the sets ask: `readfds` → `POLLIN`, `writefds`
    /// → `POLLOUT`, `exceptfds` → `POLLPRI`.
    ///
    /// # Safety
    /// As [`Sets::word`].
    pub unsafe fn poll_array(&self) -> Vec<pollfd> {
        // SAFETY: the caller's contract.
        let fds = unsafe { self.fds() };
        fds.into_iter()
            .map(|fd| {
                let (i, b) = (fd as usize / BITS, fd as usize % BITS);
                let mut events = 0;
                for (k, ev) in [(0, libc::POLLIN), (1, libc::POLLOUT), (2, libc::POLLPRI)] {
                    // SAFETY: fd < nfds.
                    if unsafe { self.word(k, i) } >> b & 1 != 0 {
                        events |= ev;
                    }
                }
                pollfd {
                    fd,
                    events,
                    revents: 0,
                }
            })
            .collect()
    }

    /// Rewrites the sets in place from the answered `p` (as Linux, whole words up to
    /// `nfds`); the number of bits set across the three sets.
    ///
    /// # Safety
    /// As [`Sets::word`]; the sets are writable.
    pub unsafe fn write_back(&self, p: &[pollfd]) -> c_int {
        let mut out = vec![[0 as c_ulong; 3]; self.words()];
        let mut n = 0;
        for x in p {
            let (i, b) = (x.fd as usize / BITS, x.fd as usize % BITS);
            for (k, asked, set) in [
                (0, libc::POLLIN, IN_SET),
                (1, libc::POLLOUT, OUT_SET),
                (2, libc::POLLPRI, EX_SET),
            ] {
                if x.events & asked != 0 && x.revents & set != 0 {
                    out[i][k] |= 1 << b;
                    n += 1;
                }
            }
        }
        for (k, &p) in self.sets.iter().enumerate() {
            if p.is_null() {
                continue;
            }
            for (i, w) in out.iter().enumerate() {
                // SAFETY: the caller's writable set holds `nfds` bits.
                unsafe { std::ptr::write_unaligned(p.cast::<c_ulong>().add(i), w[k]) };
            }
        }
        n
    }
}

/// select(2)'s timeout: `None` waits forever; `EINVAL` for a negative one (the
/// microseconds may exceed a second, as Linux accepts).
pub(crate) fn timeval(tv: Option<libc::timeval>) -> Result<Option<Duration>, i32> {
    let Some(tv) = tv else { return Ok(None) };
    if tv.tv_sec < 0 || tv.tv_usec < 0 {
        return Err(libc::EINVAL);
    }
    Ok(Some(
        Duration::from_secs(tv.tv_sec as u64) + Duration::from_micros(tv.tv_usec as u64),
    ))
}

/// pselect(2)'s timeout: `EINVAL` unless `0 <= tv_nsec < 10^9` and `tv_sec >= 0`.
pub(crate) fn timespec(ts: Option<libc::timespec>) -> Result<Option<Duration>, i32> {
    let Some(ts) = ts else { return Ok(None) };
    if ts.tv_sec < 0 || !(0..1_000_000_000).contains(&ts.tv_nsec) {
        return Err(libc::EINVAL);
    }
    Ok(Some(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)))
}

/// The time left as select(2) writes it back into its timeval.
pub(crate) fn left(d: Duration) -> libc::timeval {
    libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(fds: &[c_int]) -> fd_set {
        // SAFETY: fd_set is plain data; FD_ZERO/FD_SET on a live set.
        unsafe {
            let mut s: fd_set = std::mem::zeroed();
            libc::FD_ZERO(&mut s);
            for &fd in fds {
                libc::FD_SET(fd, &mut s);
            }
            s
        }
    }

    fn members(s: &fd_set) -> Vec<c_int> {
        (0..libc::FD_SETSIZE as c_int)
            // SAFETY: a live set; fds below FD_SETSIZE.
            .filter(|&fd| unsafe { libc::FD_ISSET(fd, s) })
            .collect()
    }

    #[test]
    fn sets_become_pollfds_and_answers_become_sets() {
        let (mut r, mut w, mut e) = (set(&[3, 70, 200]), set(&[3, 5]), set(&[70]));
        let s = Sets {
            nfds: 71,
            sets: [&mut r, &mut w, &mut e],
        };
        // SAFETY: the sets are live fd_sets of FD_SETSIZE bits, more than nfds.
        let mut p = unsafe { s.poll_array() };
        // 200 is beyond nfds: not asked, and its word (beyond nfds') left alone.
        let asked: Vec<(c_int, c_short)> = p.iter().map(|x| (x.fd, x.events)).collect();
        assert_eq!(
            asked,
            vec![
                (3, libc::POLLIN | libc::POLLOUT),
                (5, libc::POLLOUT),
                (70, libc::POLLIN | libc::POLLPRI)
            ]
        );
        // 3: hung up (readable, and POLLHUP alone is not writable); 5: error (writable);
        // 70: urgent data only.
        p[0].revents = libc::POLLHUP;
        p[1].revents = libc::POLLERR;
        p[2].revents = libc::POLLPRI;
        // SAFETY: the sets are live, writable fd_sets of FD_SETSIZE bits, more than nfds.
        assert_eq!(unsafe { s.write_back(&p) }, 3);
        assert_eq!(members(&r), vec![3, 200], "3 readable; 200 untouched");
        assert_eq!(members(&w), vec![5]);
        assert_eq!(members(&e), vec![70]);
    }

    #[test]
    fn readable_means_in_hup_or_err() {
        for (rev, ready) in [
            (libc::POLLIN, true),
            (libc::POLLRDNORM, true),
            (libc::POLLHUP, true),
            (libc::POLLERR, true),
            (libc::POLLOUT, false),
        ] {
            let mut r = set(&[4]);
            let s = Sets {
                nfds: 5,
                sets: [&mut r, std::ptr::null_mut(), std::ptr::null_mut()],
            };
            // SAFETY: the sets are live fd_sets of FD_SETSIZE bits, more than nfds.
            let mut p = unsafe { s.poll_array() };
            p[0].revents = rev;
            // SAFETY: the sets are live, writable fd_sets of FD_SETSIZE bits, more than nfds.
            assert_eq!(unsafe { s.write_back(&p) }, ready as c_int, "{rev:#x}");
            assert_eq!(members(&r).is_empty(), !ready);
        }
    }

    #[test]
    fn timeouts_are_checked() {
        let tv = |s, u| libc::timeval {
            tv_sec: s,
            tv_usec: u,
        };
        assert_eq!(timeval(None), Ok(None));
        assert_eq!(timeval(Some(tv(0, 0))), Ok(Some(Duration::ZERO)));
        assert_eq!(
            timeval(Some(tv(1, 2_500_000))),
            Ok(Some(Duration::from_millis(3500)))
        );
        assert_eq!(timeval(Some(tv(-1, 0))), Err(libc::EINVAL));
        assert_eq!(timeval(Some(tv(0, -1))), Err(libc::EINVAL));
        let ts = |s, n| libc::timespec {
            tv_sec: s,
            tv_nsec: n,
        };
        assert_eq!(timespec(Some(ts(2, 5))), Ok(Some(Duration::new(2, 5))));
        assert_eq!(timespec(Some(ts(0, 1_000_000_000))), Err(libc::EINVAL));
        let l = left(Duration::from_micros(1_250_000));
        assert_eq!((l.tv_sec, l.tv_usec), (1, 250_000));
    }
}
