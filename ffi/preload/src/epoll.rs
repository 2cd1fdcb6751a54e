//! epoll sets holding luna sockets next to kernel fds.
//!
//! The epoll fd stays the kernel's. A set that gets a luna socket also gets an eventfd
//! (data [`MAGIC`]) in the kernel set; the poll thread writes it when a member may have
//! become ready. `epoll_wait` first reports ready luna members, then waits in the real
//! `epoll_wait` on the kernel fds plus that eventfd.

use crate::real::call_real;
use crate::sock::{Notifier, Sock};
use libc::{c_int, epoll_event};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The kernel-set data word of a set's eventfd ("LUNAPREL").
pub(crate) const MAGIC: u64 = 0x4c55_4e41_5052_454c;

const ET: u32 = libc::EPOLLET as u32;
const ONESHOT: u32 = libc::EPOLLONESHOT as u32;
const ALWAYS: u32 = (libc::EPOLLERR | libc::EPOLLHUP) as u32;

struct Member {
    fd: c_int,
    sock: Arc<Sock>,
    events: u32,
    data: u64,
    /// Edge-triggered: the socket's generation last reported.
    seen: u64,
    /// One-shot: reported, waiting for `EPOLL_CTL_MOD`.
    disarmed: bool,
}

pub(crate) struct Set {
    note: Arc<Notifier>,
    members: Mutex<Vec<Member>>,
    /// Where the next `collect` starts: after the last member reported when `maxevents`
    /// ran out (epoll_wait(2): successive calls round-robin through the ready fds).
    cursor: AtomicUsize,
    /// The last wait filled `maxevents` with luna members without asking the kernel:
    /// the next one asks the kernel first.
    kernel_skipped: AtomicBool,
}

impl Set {
    fn lock(&self) -> MutexGuard<'_, Vec<Member>> {
        self.members.lock().unwrap_or_else(|p| p.into_inner())
    }
}

static SETS: LazyLock<Mutex<HashMap<c_int, Arc<Set>>>> = LazyLock::new(Default::default);

fn sets() -> MutexGuard<'static, HashMap<c_int, Arc<Set>>> {
    SETS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The set of `epfd`, if it has ever held a luna socket.
pub(crate) fn set(epfd: c_int) -> Option<Arc<Set>> {
    if !crate::ACTIVE.load(Ordering::Acquire) {
        return None;
    }
    sets().get(&epfd).cloned()
}

/// `epoll_ctl` with a luna socket `fd`.
pub(crate) fn ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    sock: Arc<Sock>,
    ev: Option<epoll_event>,
) -> Result<(), i32> {
    let set = match set(epfd) {
        Some(s) => s,
        None if op == libc::EPOLL_CTL_ADD => create(epfd)?,
        None => return Err(libc::ENOENT),
    };
    let mut m = set.lock();
    let pos = m.iter().position(|x| x.fd == fd);
    match op {
        libc::EPOLL_CTL_ADD => {
            let ev = ev.ok_or(libc::EFAULT)?;
            if pos.is_some() {
                return Err(libc::EEXIST);
            }
            m.push(Member {
                fd,
                sock: Arc::clone(&sock),
                events: ev.events,
                data: ev.u64,
                seen: u64::MAX,
                disarmed: false,
            });
            sock.lock().watchers.push((epfd, Arc::clone(&set.note)));
            // Whatever is ready already is found by the next wait.
            set.note.signal();
        }
        libc::EPOLL_CTL_MOD => {
            let ev = ev.ok_or(libc::EFAULT)?;
            let x = &mut m[pos.ok_or(libc::ENOENT)?];
            x.events = ev.events;
            x.data = ev.u64;
            x.seen = u64::MAX;
            x.disarmed = false;
            set.note.signal();
        }
        libc::EPOLL_CTL_DEL => {
            m.remove(pos.ok_or(libc::ENOENT)?);
            // The socket may be a member under another descriptor too (a dup copy):
            // then the set still watches it.
            if !m.iter().any(|x| Arc::ptr_eq(&x.sock, &sock)) {
                sock.lock().watchers.retain(|(e, _)| *e != epfd);
            }
        }
        _ => return Err(libc::EINVAL),
    }
    Ok(())
}

fn create(epfd: c_int) -> Result<Arc<Set>, i32> {
    let note = Arc::new(Notifier::new()?);
    let mut ev = epoll_event {
        events: libc::EPOLLIN as u32,
        u64: MAGIC,
    };
    // SAFETY: adds our eventfd to the application's kernel epoll set; `ev` is live.
    let r = unsafe { call_real!(epoll_ctl(epfd, libc::EPOLL_CTL_ADD, note.efd, &mut ev)) };
    if r < 0 {
        return Err(crate::errno());
    }
    let set = Arc::new(Set {
        note,
        members: Mutex::new(Vec::new()),
        cursor: AtomicUsize::new(0),
        kernel_skipped: AtomicBool::new(false),
    });
    sets().insert(epfd, Arc::clone(&set));
    Ok(set)
}

/// `close(epfd)`: forget the set.
/// [`forget_set`] for every set whose descriptor is in `first..=last` (`close_range`).
pub(crate) fn forget_sets_in(first: c_int, last: c_int) {
    if !crate::ACTIVE.load(Ordering::Acquire) {
        return;
    }
    let fds: Vec<c_int> = sets()
        .keys()
        .copied()
        .filter(|fd| (first..=last).contains(fd))
        .collect();
    for fd in fds {
        forget_set(fd);
    }
}

pub(crate) fn forget_set(epfd: c_int) {
    if !crate::ACTIVE.load(Ordering::Acquire) {
        return;
    }
    let Some(set) = sets().remove(&epfd) else {
        return;
    };
    for m in set.lock().drain(..) {
        m.sock
            .lock()
            .watchers
            .retain(|(e, n)| !(*e == epfd && Arc::ptr_eq(n, &set.note)));
    }
}

/// The last descriptor of a luna socket closed: it leaves every set, under whichever
/// descriptor it was registered (a `dup` copy may have been registered and closed
/// before), as Linux drops a file's registrations when the file closes.
pub(crate) fn forget_sock(sock: &Arc<Sock>) {
    let watchers = std::mem::take(&mut sock.lock().watchers);
    for (epfd, _) in watchers {
        if let Some(set) = set(epfd) {
            set.lock().retain(|m| !Arc::ptr_eq(&m.sock, sock));
        }
    }
}

/// Ready luna members into `out` (up to its length), starting where the last full
/// collection stopped.
fn collect(set: &Set, out: &mut [epoll_event]) -> usize {
    let mut n = 0;
    let mut members = set.lock();
    let len = members.len();
    let start = set.cursor.load(Ordering::Relaxed) % len.max(1);
    for k in 0..len {
        if n == out.len() {
            break;
        }
        let i = (start + k) % len;
        let m = &mut members[i];
        if m.disarmed {
            continue;
        }
        let gen = m.sock.gen.load(Ordering::Acquire);
        if m.events & ET != 0 && gen == m.seen {
            continue;
        }
        let ready = m.sock.lock().mask() & (m.events | ALWAYS);
        if ready == 0 {
            continue;
        }
        m.seen = gen;
        if m.events & ONESHOT != 0 {
            m.disarmed = true;
        }
        out[n] = epoll_event {
            events: ready,
            u64: m.data,
        };
        n += 1;
        if n == out.len() {
            set.cursor.store(i + 1, Ordering::Relaxed);
        }
    }
    n
}

/// Drops the set's own eventfd from `ev[..n]`; the new count.
fn strip(ev: &mut [epoll_event], n: usize) -> (usize, bool) {
    let (mut k, mut woke) = (0, false);
    for i in 0..n {
        if ev[i].u64 == MAGIC {
            woke = true;
            continue;
        }
        ev[k] = ev[i];
        k += 1;
    }
    (k, woke)
}

/// `epoll_wait`/`epoll_pwait` on a set with luna members. `wait(buf, timeout)` is the
/// real call.
pub(crate) fn wait(
    set: &Set,
    out: &mut [epoll_event],
    timeout: c_int,
    real: &mut dyn FnMut(&mut [epoll_event], c_int) -> c_int,
) -> c_int {
    let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    loop {
        let mut n = 0;
        // Luna members filled the last answer: the kernel's fds go first this time.
        let kernel_first = set.kernel_skipped.swap(false, Ordering::Relaxed);
        if kernel_first {
            let r = real(out, 0);
            if r > 0 {
                n = strip(out, r as usize).0;
            }
        }
        n += collect(set, &mut out[n..]);
        if n == 0 {
            set.note.drain();
            n = collect(set, out);
        }
        if n > 0 {
            // Kernel fds ready now join them (without waiting).
            if !kernel_first {
                if n < out.len() {
                    let r = real(&mut out[n..], 0);
                    if r > 0 {
                        let (k, _) = strip(&mut out[n..], r as usize);
                        n += k;
                    }
                } else {
                    set.kernel_skipped.store(true, Ordering::Relaxed);
                }
            }
            return n as c_int;
        }
        let left = match deadline {
            None => -1,
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .as_millis()
                .min(i32::MAX as u128) as c_int,
        };
        let r = real(out, left);
        if r < 0 {
            return r;
        }
        let (k, woke) = strip(out, r as usize);
        if k > 0 {
            let extra = collect(set, &mut out[k..]);
            return (k + extra) as c_int;
        }
        if !woke && deadline.is_some_and(|d| Instant::now() >= d) {
            return 0;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return collect(set, out) as c_int;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sock::{Phase, UNBOUND};

    fn set_with(events: u32) -> (Set, Arc<Sock>) {
        let s = Sock::new(Phase::Connected, UNBOUND);
        let set = Set {
            note: Arc::new(Notifier::new().unwrap()),
            members: Mutex::new(vec![Member {
                fd: 5,
                sock: Arc::clone(&s),
                events,
                data: 77,
                seen: u64::MAX,
                disarmed: false,
            }]),
            cursor: AtomicUsize::new(0),
            kernel_skipped: AtomicBool::new(false),
        };
        (set, s)
    }

    /// epoll_wait(2): "If more than maxevents file descriptors are ready when
    /// epoll_wait() is called, then successive epoll_wait() calls will round robin
    /// through the set of ready file descriptors." Two ready luna sockets and a ready
    /// kernel fd, maxevents 1: three waits report all three (no starvation).
    #[test]
    fn full_answers_round_robin_over_luna_and_kernel_fds() {
        let (set, s) = set_with(libc::EPOLLIN as u32);
        s.lock().rx.extend(b"x");
        let t = Sock::new(Phase::Connected, UNBOUND);
        t.lock().rx.extend(b"y");
        set.lock().push(Member {
            fd: 6,
            sock: t,
            events: libc::EPOLLIN as u32,
            data: 78,
            seen: u64::MAX,
            disarmed: false,
        });
        let mut seen = Vec::new();
        for _ in 0..3 {
            let mut out = [epoll_event { events: 0, u64: 0 }; 1];
            let n = wait(&set, &mut out, -1, &mut |b, _| {
                b[0] = epoll_event {
                    events: libc::EPOLLIN as u32,
                    u64: 99,
                };
                1
            });
            assert_eq!(n, 1);
            seen.push(out[0].u64);
        }
        seen.sort();
        assert_eq!(seen, vec![77, 78, 99]);
    }

    fn ev() -> [epoll_event; 4] {
        [epoll_event { events: 0, u64: 0 }; 4]
    }

    #[test]
    fn level_triggered_reports_until_drained() {
        let (set, s) = set_with(libc::EPOLLIN as u32);
        let mut out = ev();
        assert_eq!(collect(&set, &mut out), 0, "writable only, not asked");
        s.lock().rx.extend(b"x");
        for _ in 0..2 {
            assert_eq!(collect(&set, &mut out), 1);
            assert_eq!({ out[0].events }, libc::EPOLLIN as u32);
            assert_eq!({ out[0].u64 }, 77);
        }
        s.lock().rx.clear();
        assert_eq!(collect(&set, &mut out), 0);
        s.lock().fail(libc::ECONNRESET);
        assert_eq!(collect(&set, &mut out), 1);
        assert_ne!(
            { out[0].events } & (libc::EPOLLERR | libc::EPOLLHUP) as u32,
            0,
            "always reported"
        );
    }

    #[test]
    fn edge_triggered_reports_once_per_change() {
        let (set, s) = set_with((libc::EPOLLIN | libc::EPOLLET) as u32);
        let mut out = ev();
        {
            let mut g = s.lock();
            g.rx.extend(b"x");
            s.notify(&g);
        }
        assert_eq!(collect(&set, &mut out), 1);
        assert_eq!(collect(&set, &mut out), 0, "no new edge");
        {
            let g = s.lock();
            s.notify(&g);
        }
        assert_eq!(collect(&set, &mut out), 1);
    }

    #[test]
    fn oneshot_disarms() {
        let (set, s) = set_with((libc::EPOLLIN | libc::EPOLLONESHOT) as u32);
        s.lock().rx.extend(b"x");
        let mut out = ev();
        assert_eq!(collect(&set, &mut out), 1);
        assert_eq!(collect(&set, &mut out), 0);
    }

    #[test]
    fn strip_drops_the_wakeup_eventfd() {
        let mut out = ev();
        out[0].u64 = 1;
        out[1].u64 = MAGIC;
        out[2].u64 = 3;
        assert_eq!(strip(&mut out, 3), (2, true));
        assert_eq!(({ out[0].u64 }, { out[1].u64 }), (1, 3));
        assert_eq!(strip(&mut out, 2), (2, false));
    }

    #[test]
    fn wait_returns_luna_readiness_without_the_kernel() {
        let (set, s) = set_with(libc::EPOLLIN as u32);
        s.lock().rx.extend(b"x");
        let mut out = ev();
        let mut calls = Vec::new();
        let n = wait(&set, &mut out, -1, &mut |_, t| {
            calls.push(t);
            0
        });
        assert_eq!(n, 1);
        assert_eq!(calls, vec![0], "kernel fds polled without waiting");
    }

    /// One socket registered in a set under two descriptors (a dup copy), one of them
    /// removed with EPOLL_CTL_DEL: the other registration still wakes the set when the
    /// socket becomes ready (the set's eventfd is still signalled), so an epoll_wait
    /// blocked in the kernel is not left asleep.
    #[test]
    fn del_of_one_of_two_registrations_keeps_the_other_woken() {
        crate::ACTIVE.store(true, Ordering::Release);
        // SAFETY: plain system call (not interposed).
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0);
        let s = Sock::new(Phase::Connected, UNBOUND);
        let ev = epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 1,
        };
        // (Descriptor numbers far above this process's: nothing else uses them.)
        ctl(ep, libc::EPOLL_CTL_ADD, 9001, Arc::clone(&s), Some(ev)).unwrap();
        ctl(ep, libc::EPOLL_CTL_ADD, 9002, Arc::clone(&s), Some(ev)).unwrap();
        ctl(ep, libc::EPOLL_CTL_DEL, 9001, Arc::clone(&s), None).unwrap();
        let set = set(ep).unwrap();
        set.note.drain();
        {
            let mut g = s.lock();
            g.rx.extend(b"x");
            s.notify(&g);
        }
        let mut out = [epoll_event { events: 0, u64: 0 }; 2];
        // SAFETY: the real epoll_wait on our set, `out` has room for 2 events.
        let n = unsafe { call_real!(epoll_wait(ep, out.as_mut_ptr(), 2, 0)) };
        assert_eq!(n, 1, "the set's eventfd was not signalled");
        assert_eq!({ out[0].u64 }, MAGIC);
        forget_set(ep);
        // SAFETY: closing the epoll fd this test opened (real close).
        assert_eq!(unsafe { call_real!(close(ep)) }, 0);
    }

    #[test]
    fn wait_times_out() {
        let (set, _s) = set_with(libc::EPOLLIN as u32);
        let mut out = ev();
        let n = wait(&set, &mut out, 0, &mut |_, _| 0);
        assert_eq!(n, 0);
    }
}
