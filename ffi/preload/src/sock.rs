//! A luna socket as the application sees it: the buffers and flags the poll thread fills
//! and drains (like a kernel socket's buffers), and the application-side calls on them.

use crate::engine::{Cmd, Shared};
use core::net::{Ipv4Addr, SocketAddrV4};
use r2c::batch::{Fd as BFd, Interest};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Bytes the poll thread buffers per socket for the application to read; beyond it leaves
/// data in the stack (whose window then closes).
pub(crate) const RX_CAP: usize = 1 << 20;
/// Bytes an application may queue per socket before `write` blocks (`EAGAIN`).
pub(crate) const TX_CAP: usize = 1 << 20;

const IN: u32 = libc::EPOLLIN as u32;
const OUT: u32 = libc::EPOLLOUT as u32;
const ERR: u32 = libc::EPOLLERR as u32;
const HUP: u32 = libc::EPOLLHUP as u32;
const RDHUP: u32 = libc::EPOLLRDHUP as u32;
/// Linux's TCP reports these with `IN`/`OUT` (`tcp_poll`); `poll(POLLRDNORM)` asks only them.
const RDNORM: u32 = libc::EPOLLRDNORM as u32;
const WRNORM: u32 = libc::EPOLLWRNORM as u32;

/// Where a socket is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Bound (maybe to port 0), neither listening nor connected.
    Fresh,
    /// `listen` asked; waiting for the poll thread's answer.
    Opening,
    /// Listening.
    Listening,
    /// `connect` started; the handshake is running.
    Connecting,
    /// Connected (or accepted).
    Connected,
    /// Closed by the application.
    Closed,
}

/// Options answered from here (`setsockopt`/`getsockopt`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Opts {
    pub reuseaddr: i32,
    pub reuseport: i32,
    pub keepalive: i32,
    /// 0 or 1 (Linux reads any non-zero value as 1); 0 turns Nagle's algorithm on.
    pub nodelay: i32,
    pub rcvbuf: i32,
    pub sndbuf: i32,
    /// `IP_TOS`: its DiffServ codepoint (the upper six bits) marks the connection's
    /// segments; the ECN bits read 0 (Linux keeps a TCP socket's ECN bits its own).
    pub tos: u8,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            reuseaddr: 0,
            reuseport: 0,
            keepalive: 0,
            // luna has no Nagle algorithm: every socket behaves as TCP_NODELAY.
            nodelay: 1,
            rcvbuf: RX_CAP as i32,
            sndbuf: TX_CAP as i32,
            tos: 0,
        }
    }
}

/// The state shared by the application threads and the poll thread.
#[derive(Debug)]
pub(crate) struct State {
    pub phase: Phase,
    /// Bound address (port 0: none yet).
    pub local: SocketAddrV4,
    pub peer: Option<SocketAddrV4>,
    /// The poll thread's socket (poll thread only).
    pub bfd: Option<BFd>,
    /// The interest registered with batch mode (poll thread only).
    pub interest: Option<Interest>,
    pub rx: VecDeque<u8>,
    /// The peer's FIN was read.
    pub eof: bool,
    /// `shutdown(SHUT_RD)`: reads return 0.
    pub shut_rd: bool,
    pub tx: VecDeque<u8>,
    /// `shutdown(SHUT_WR)` asked; `shut_sent` once the poll thread passed it on.
    pub shut_wr: bool,
    pub shut_sent: bool,
    /// The connection failed (errno): it is dead in both directions (Linux: `TCP_CLOSE`,
    /// `sk_shutdown == SHUTDOWN_MASK`).
    pub fatal: Option<i32>,
    /// The pending error (Linux's `sk_err`): reported once, by whichever comes first of
    /// a read with nothing queued, a write, or `SO_ERROR`; afterwards reads return 0 and
    /// writes `EPIPE`.
    pub so_error: Option<i32>,
    /// Accepted connections not yet taken by `accept`.
    pub accept_q: VecDeque<Arc<Sock>>,
    pub backlog: usize,
    /// The poll thread's answer to `listen`/`connect`.
    pub reply: Option<Result<(), i32>>,
    /// The poll thread's answer to [`crate::engine::Cmd::Info`].
    pub tcp_info: Option<Box<libc::tcp_info>>,
    /// A thread's `connect` queued the command that starts the handshake and waits for
    /// its answer: another thread's `connect` waits for it too, then finds the handshake
    /// running (Linux's socket lock holds the second caller), instead of starting a
    /// second one.
    pub starting: bool,
    /// The poll thread's socket is a listener (poll thread only).
    pub listener: bool,
    /// Epoll sets watching this socket: (epoll fd, its wake-up eventfd).
    pub watchers: Vec<(i32, Arc<Notifier>)>,
    /// Closed so that the connection must be reset, not finished (Linux's `tcp_close`:
    /// `SO_LINGER` `{1, 0}`, or bytes the application never read; RFC 1122 §4.2.2.13:
    /// also bytes that arrive after the close): queued bytes are dropped and a RST goes.
    pub reset_on_close: bool,
    /// Closed with bytes still queued here: the poll thread told the stack the
    /// connection is closed (`Sockets::orphan`), so the stack's limits for a closed
    /// connection bound it while those bytes go (poll thread only).
    pub orphaned: bool,
    /// Closed with `SO_LINGER` on and a time: the closing caller waits until the peer
    /// acknowledged everything sent and the FIN (or the time passes, then it clears
    /// this); the poll thread keeps the connection open to watch, and notifies when it
    /// closes it.
    pub linger: bool,
    pub opts: Opts,
}

/// One luna socket.
#[derive(Debug)]
pub(crate) struct Sock {
    st: Mutex<State>,
    /// The futex word blocked callers sleep on: bumped by every [`Sock::notify`].
    wake: AtomicU32,
    /// Callers asleep on `wake` (changed under the state lock): `notify` makes the wake
    /// system call only when there is one.
    sleepers: AtomicU32,
    /// Bumped whenever readiness may have grown (edge-triggered epoll compares it).
    pub gen: AtomicU64,
    /// Descriptors naming this socket (`dup`): the socket closes with the last one.
    /// Changed under the descriptor table's write lock.
    pub fds: AtomicUsize,
}

/// An eventfd an epoll set waits on; the poll thread writes it when a member may have
/// become ready.
#[derive(Debug)]
pub(crate) struct Notifier {
    pub efd: i32,
}

impl Notifier {
    /// A new non-blocking eventfd, or the errno.
    pub fn new() -> Result<Notifier, i32> {
        // SAFETY: plain syscall wrapper; eventfd is not interposed by this shim.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(crate::errno());
        }
        Ok(Notifier { efd })
    }

    /// Wake the waiter (a full counter just stays readable).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd (real libc write).
        let _ = unsafe { crate::real::call_real!(write(self.efd, (&one as *const u64).cast(), 8)) };
    }

    /// Reset the counter.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own non-blocking eventfd.
        let _ = unsafe { crate::real::call_real!(read(self.efd, (&mut v as *mut u64).cast(), 8)) };
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        // SAFETY: closes the eventfd this value owns (real libc close).
        let _ = unsafe { crate::real::call_real!(close(self.efd)) };
    }
}

impl State {
    fn new(phase: Phase, local: SocketAddrV4) -> State {
        State {
            phase,
            local,
            peer: None,
            bfd: None,
            interest: None,
            rx: VecDeque::new(),
            eof: false,
            shut_rd: false,
            tx: VecDeque::new(),
            shut_wr: false,
            shut_sent: false,
            fatal: None,
            so_error: None,
            accept_q: VecDeque::new(),
            backlog: 128,
            reply: None,
            tcp_info: None,
            starting: false,
            listener: false,
            watchers: Vec::new(),
            reset_on_close: false,
            orphaned: false,
            linger: false,
            opts: Opts::default(),
        }
    }

    /// A connect that failed has reported its error: the socket is unconnected again
    /// and a new `connect` starts a new handshake (Linux's `__inet_stream_connect`,
    /// `sock_error`: `SS_UNCONNECTED`). The dead connection's poll-thread socket (`bfd`)
    /// is closed by the poll thread.
    pub fn unconnect(&mut self) {
        self.phase = Phase::Fresh;
        self.peer = None;
        self.fatal = None;
        self.so_error = None;
        self.eof = false;
        self.shut_rd = false;
        self.shut_wr = false;
        self.shut_sent = false;
        self.rx.clear();
        self.tx.clear();
    }

    /// The connection failed with `e`: dead, `e` pending.
    pub fn fail(&mut self, e: i32) {
        self.fatal = Some(e);
        self.so_error = Some(e);
    }

    /// epoll readiness bits, level triggered, as Linux reports them for TCP.
    pub fn mask(&self) -> u32 {
        let err = if self.so_error.is_some() { ERR } else { 0 };
        // A dead connection (reset, refused, timed out): both directions shut.
        let dead = IN | RDNORM | RDHUP | OUT | WRNORM | HUP | err;
        match self.phase {
            Phase::Fresh => OUT | WRNORM | HUP,
            Phase::Opening => 0,
            Phase::Listening => {
                if self.accept_q.is_empty() {
                    0
                } else {
                    IN | RDNORM
                }
            }
            Phase::Connecting => match self.fatal {
                Some(_) => dead,
                None => 0,
            },
            Phase::Connected if self.fatal.is_some() => dead,
            Phase::Connected => {
                let mut m = err;
                // Linux's RCV_SHUTDOWN: the peer's FIN or shutdown(SHUT_RD) (tcp_poll).
                let rcv_shut = self.eof || self.shut_rd;
                if !self.rx.is_empty() || rcv_shut {
                    m |= IN | RDNORM;
                }
                // After SHUT_WR Linux reports writable (a write fails at once: EPIPE).
                if self.tx.len() < TX_CAP || self.shut_wr {
                    m |= OUT | WRNORM;
                }
                if rcv_shut && self.shut_wr {
                    m |= HUP;
                }
                if rcv_shut {
                    m |= RDHUP;
                }
                m
            }
            Phase::Closed => HUP,
        }
    }
}

/// Ways an application call ends without a result.
pub(crate) type Errno = i32;

impl Sock {
    /// A socket bound (or not) to `local`.
    pub fn new(phase: Phase, local: SocketAddrV4) -> Arc<Sock> {
        Arc::new(Sock {
            st: Mutex::new(State::new(phase, local)),
            wake: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            gen: AtomicU64::new(0),
            fds: AtomicUsize::new(0),
        })
    }

    /// The state, even if a panicking thread poisoned the lock (the state stays
    /// consistent: every update is a few field writes).
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wake blocked callers and epoll sets: readiness may have grown. Called with the
    /// state locked (`st`), as every change a blocked caller waits for is made.
    pub fn notify(&self, st: &State) {
        self.gen.fetch_add(1, Ordering::Release);
        self.wake.fetch_add(1, Ordering::Release);
        if self.sleepers.load(Ordering::Relaxed) != 0 {
            futex_wake_all(&self.wake);
        }
        for (_, n) in &st.watchers {
            n.signal();
        }
    }

    /// Sleeps until the next [`Sock::notify`] (the caller checked, under the lock `g`,
    /// that what it waits for has not happened). `Interrupted` when a signal handler ran
    /// in this thread and was installed without `SA_RESTART`: the sleep is a futex wait
    /// without a timeout, which the kernel restarts after a handler with `SA_RESTART`
    /// and ends with `EINTR` after one without, the rule Linux applies to a blocking
    /// `recv`, `send`, `accept` or `connect` (signal(7)); the caller then returns
    /// `EINTR`, or what it already transferred. If the poll thread is gone, the socket
    /// fails with `ENETDOWN` instead of sleeping: nothing would wake it (the poll thread
    /// fails and wakes every socket it knows as it ends, [`crate::engine::PollApp`]).
    fn wait<'a>(&'a self, g: MutexGuard<'a, State>) -> (MutexGuard<'a, State>, Woke) {
        self.wait_until(g, None)
    }

    /// [`Sock::wait`] until `deadline` at the latest (`Woke::TimedOut`). A sleep with a
    /// deadline is a timed futex wait, which any signal handler ends (`EINTR`), as
    /// Linux's socket calls with `SO_RCVTIMEO`/`SO_SNDTIMEO` are never restarted
    /// (signal(7)).
    fn wait_until<'a>(
        &'a self,
        mut g: MutexGuard<'a, State>,
        deadline: Option<std::time::Instant>,
    ) -> (MutexGuard<'a, State>, Woke) {
        // (Also for a socket that failed already: a command it waits for, such as a
        // second connect, is never run either.)
        if !crate::engine::alive() {
            if g.fatal.is_none() {
                g.fail(libc::ENETDOWN);
            }
            g.reply.get_or_insert(Err(libc::ENETDOWN));
            return (g, Woke::Notified);
        }
        let left = match deadline {
            None => None,
            Some(d) => match d.checked_duration_since(std::time::Instant::now()) {
                Some(left) if !left.is_zero() => Some(left),
                _ => return (g, Woke::TimedOut),
            },
        };
        let seen = self.wake.load(Ordering::Acquire);
        self.sleepers.fetch_add(1, Ordering::Relaxed);
        drop(g);
        let woke = futex_wait(&self.wake, seen, left);
        let g = self.lock();
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
        (g, woke)
    }

    /// Callers asleep on the socket now (for tests that must know a call blocked).
    #[cfg(test)]
    pub fn sleepers(&self) -> u32 {
        self.sleepers.load(Ordering::Relaxed)
    }

    /// The step of a blocking call that found nothing to do under the lock `g`. The
    /// first time it asks `how` (`O_NONBLOCK`, the socket's timeout) unlocked, once per
    /// call as Linux reads them once, and comes back locked for the caller to check
    /// everything again (anything may have changed, and been notified, meanwhile);
    /// after that it sleeps until the next notification or the timeout. `Err` ends the
    /// call.
    fn block<'a>(
        &'a self,
        g: MutexGuard<'a, State>,
        b: &mut Blocking,
        how: &dyn Fn() -> Wait,
    ) -> Result<MutexGuard<'a, State>, Stop> {
        if !b.asked {
            drop(g);
            let w = how();
            if w == Wait::No {
                return Err(Stop::WouldBlock);
            }
            b.deadline = w.deadline();
            b.asked = true;
            return Ok(self.lock());
        }
        match self.wait_until(g, b.deadline) {
            (g, Woke::Notified) => Ok(g),
            (_, Woke::Interrupted) => Err(Stop::Interrupted),
            // SO_RCVTIMEO / SO_SNDTIMEO ran out: EAGAIN, as Linux (sock_rcvtimeo).
            (_, Woke::TimedOut) => Err(Stop::WouldBlock),
        }
    }

    /// Waits for the poll thread's answer to a command (prompt: not interruptible, as
    /// `listen` and the start of `connect` are not on Linux).
    pub fn wait_reply(&self) -> Result<(), Errno> {
        let mut g = self.lock();
        loop {
            if let Some(r) = g.reply.take() {
                return r;
            }
            g = self.wait(g).0;
        }
    }

    /// `read`/`recv` with `MSG_PEEK`/`MSG_WAITALL` in `flags`: `how` it may wait
    /// (`O_NONBLOCK`, `SO_RCVTIMEO`) is asked only when the call would block. `MSG_WAITALL` (without `MSG_PEEK`) makes a blocking
    /// read wait for all of `bufs` unless end of stream or an error comes first (recv(2)).
    pub fn read(
        &self,
        bufs: &mut [&mut [u8]],
        flags: i32,
        how: &dyn Fn() -> Wait,
    ) -> Result<usize, Errno> {
        let peek = flags & libc::MSG_PEEK != 0;
        let waitall = flags & libc::MSG_WAITALL != 0 && !peek;
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        // Bytes already taken by earlier rounds (MSG_WAITALL).
        let mut got = 0usize;
        // How the call blocks (asked once, as Linux reads the flag once).
        let mut blocking = Blocking::default();
        let mut g = self.lock();
        loop {
            match g.phase {
                Phase::Connected | Phase::Connecting => {}
                _ if got > 0 => return Ok(got),
                _ => return Err(libc::ENOTCONN),
            }
            if want == 0 {
                return Ok(0);
            }
            if !g.rx.is_empty() {
                let n = copy_out(&g.rx, bufs, got);
                if peek {
                    return Ok(n);
                }
                let was_full = g.rx.len() >= RX_CAP;
                g.rx.drain(..n);
                if was_full {
                    crate::engine::room_made();
                }
                got += n;
                if !waitall || got == want {
                    return Ok(got);
                }
                continue;
            }
            // (shutdown(SHUT_RD) ends reading once the queue is empty, as the peer's
            // FIN does: tcp_recvmsg copies queued bytes before it checks RCV_SHUTDOWN.)
            if got > 0 && (g.fatal.is_some() || g.eof || g.shut_rd) {
                return Ok(got);
            }
            if g.fatal.is_some() {
                // The pending error once, then end of stream (tcp_recvmsg: sk_err, then
                // RCV_SHUTDOWN).
                return match g.so_error.take() {
                    Some(e) => Err(e),
                    None => Ok(0),
                };
            }
            if g.eof || g.shut_rd {
                return Ok(0);
            }
            g = match self.block(g, &mut blocking, how) {
                Ok(g) => g,
                // tcp_recvmsg: what was copied, else the reason.
                Err(stop) => return if got > 0 { Ok(got) } else { Err(stop.errno()) },
            };
        }
    }

    /// `write`/`send`: queues bytes for the poll thread. Blocking sockets queue all of
    /// `bufs`; non-blocking ones what fits (`EAGAIN` if nothing does).
    pub fn write(
        self: &Arc<Self>,
        sh: &Shared,
        bufs: &[&[u8]],
        how: &dyn Fn() -> Wait,
    ) -> Result<usize, Errno> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut done = 0usize;
        // How the call blocks (asked once).
        let mut blocking = Blocking::default();
        let mut g = self.lock();
        loop {
            match g.phase {
                Phase::Connected => {}
                Phase::Connecting if g.fatal.is_none() => {
                    g = self.block(g, &mut blocking, how).map_err(Stop::errno)?;
                    continue;
                }
                Phase::Connecting => {}
                _ => return Err(libc::ENOTCONN),
            }
            if g.fatal.is_some() || g.shut_wr {
                // The pending error once (no SIGPIPE), then EPIPE (tcp_sendmsg,
                // sk_stream_error).
                return match (done, g.so_error.take()) {
                    (0, Some(e)) => Err(e),
                    (0, None) => Err(libc::EPIPE),
                    (n, e) => {
                        g.so_error = e;
                        Ok(n)
                    }
                };
            }
            if total == 0 {
                return Ok(0);
            }
            let room = TX_CAP.saturating_sub(g.tx.len());
            if room > 0 {
                let was_empty = g.tx.is_empty();
                let mut left = room;
                let mut skip = done;
                for b in bufs {
                    if left == 0 {
                        break;
                    }
                    if skip >= b.len() {
                        skip -= b.len();
                        continue;
                    }
                    let part = &b[skip..];
                    skip = 0;
                    let n = part.len().min(left);
                    g.tx.extend(&part[..n]);
                    left -= n;
                    done += n;
                }
                drop(g);
                if was_empty {
                    sh.push(Cmd::Flush(Arc::clone(self)));
                }
                if done == total {
                    return Ok(done);
                }
                g = self.lock();
                continue;
            }
            g = match self.block(g, &mut blocking, how) {
                Ok(g) => g,
                // sk_stream_wait_memory: what was queued, else the reason.
                Err(stop) => {
                    return if done > 0 {
                        Ok(done)
                    } else {
                        Err(stop.errno())
                    }
                }
            };
        }
    }

    /// `accept`: an accepted connection; `how` it may wait as for `read`.
    pub fn accept(&self, how: &dyn Fn() -> Wait) -> Result<Arc<Sock>, Errno> {
        let mut blocking = Blocking::default();
        let mut g = self.lock();
        loop {
            if g.phase != Phase::Listening {
                return Err(libc::EINVAL);
            }
            let was_full = g.accept_q.len() >= g.backlog.max(1);
            if let Some(s) = g.accept_q.pop_front() {
                if was_full {
                    crate::engine::room_made();
                }
                return Ok(s);
            }
            if let Some(e) = g.fatal {
                return Err(e);
            }
            g = self.block(g, &mut blocking, how).map_err(Stop::errno)?;
        }
    }

    /// Blocking `connect`: waits for the handshake. Interrupted, it fails with `EINTR`
    /// and the handshake goes on (a later `connect` waits for it again, or answers
    /// `EALREADY` when non-blocking; Linux's `__inet_stream_connect`). A close by
    /// another thread ends it with `ECONNABORTED`. At `deadline` (`SO_SNDTIMEO`) it
    /// answers `on_timeout` and the handshake goes on (Linux: `EINPROGRESS` to the first
    /// `connect`, `EALREADY` to a repeat).
    pub fn wait_connected(
        &self,
        deadline: Option<std::time::Instant>,
        on_timeout: Errno,
    ) -> Result<(), Errno> {
        let mut g = self.lock();
        loop {
            if let Some(e) = g.fatal {
                g.unconnect();
                return Err(e);
            }
            if g.phase == Phase::Connected {
                return Ok(());
            }
            if g.phase != Phase::Connecting {
                // Closed by another thread: the handshake is dropped with the socket
                // (__inet_stream_connect: disconnected while waiting).
                return Err(libc::ECONNABORTED);
            }
            let woke;
            (g, woke) = self.wait_until(g, deadline);
            match woke {
                Woke::Notified => {}
                Woke::Interrupted => return Err(libc::EINTR),
                Woke::TimedOut => return Err(on_timeout),
            }
        }
    }

    /// `connect` on a socket that already started one (`None`: it has not, start it).
    /// Linux (`__inet_stream_connect`): `EALREADY` while a non-blocking handshake runs (a
    /// blocking call waits for it), `EISCONN` once connected, and after a failure its
    /// pending error (else `ECONNABORTED`) rather than `EALREADY` forever.
    /// `None` claims the start for the caller ([`State::starting`]).
    pub fn connect_again(&self, how: &dyn Fn() -> Wait) -> Option<Result<(), Errno>> {
        let mut g = self.lock();
        // Another thread is starting a handshake: its answer first (not interrupted, as
        // the wait for the answer itself is not).
        while g.starting {
            g = self.wait(g).0;
        }
        Some(match g.phase {
            Phase::Fresh => {
                g.starting = true;
                return None;
            }
            Phase::Connecting if g.fatal.is_some() => {
                let e = g.so_error.take().unwrap_or(libc::ECONNABORTED);
                g.unconnect();
                Err(e)
            }
            Phase::Connecting => {
                drop(g);
                match how() {
                    Wait::No => Err(libc::EALREADY),
                    w => self.wait_connected(w.deadline(), libc::EALREADY),
                }
            }
            Phase::Connected => Err(libc::EISCONN),
            _ => Err(libc::EINVAL),
        })
    }

    /// `connect(2)`: `start` queues the poll thread's command that starts the handshake
    /// (when none started yet); then a non-blocking socket gets `EINPROGRESS`, a
    /// blocking one waits for the handshake.
    pub fn connect(&self, start: &dyn Fn(), how: &dyn Fn() -> Wait) -> Result<(), Errno> {
        if let Some(r) = self.connect_again(how) {
            return r;
        }
        start();
        let r = self.wait_reply();
        {
            let mut g = self.lock();
            g.starting = false;
            self.notify(&g);
        }
        r?;
        match how() {
            Wait::No => Err(libc::EINPROGRESS),
            w => self.wait_connected(w.deadline(), libc::EINPROGRESS),
        }
    }

    /// `close(2)` with `SO_LINGER` `{1, t > 0}` ([`State::linger`] set, the close command
    /// queued): waits until the poll thread closed the connection after the peer
    /// acknowledged everything sent and the FIN (Linux's `sk_stream_wait_close`), the
    /// connection failed, `deadline`, or a signal handler ran in this thread. Past the
    /// deadline or the signal (Linux's close returns 0 then), the close goes on without
    /// the caller: `linger` is
    /// cleared and the close command queued again, so the poll thread finishes it as a
    /// plain close (the connection is not reset: Linux's `tcp_close` leaves it to finish
    /// as an orphan).
    pub fn linger_wait(self: &Arc<Self>, sh: &Shared, deadline: std::time::Instant) {
        let mut g = self.lock();
        loop {
            if !g.linger || g.bfd.is_none() || g.fatal.is_some() {
                return;
            }
            let woke;
            (g, woke) = self.wait_until(g, Some(deadline));
            // A signal ends the wait as on Linux (`sk_stream_wait_close` stops at
            // `signal_pending`; close still returns 0). net_tap's receive signals reach
            // the poll thread only (r2c's `Device::on_core_thread`), not this one.
            if woke != Woke::Notified {
                break;
            }
        }
        if !g.linger || g.bfd.is_none() {
            return;
        }
        g.linger = false;
        drop(g);
        sh.push(Cmd::Close(Arc::clone(self)));
    }

    /// Bytes readable now (`FIONREAD`).
    pub fn readable(&self) -> usize {
        self.lock().rx.len()
    }
}

/// How a call may wait when it would block: not at all (`O_NONBLOCK`, `MSG_DONTWAIT`),
/// until it can go on, or at most a time (`SO_RCVTIMEO`, `SO_SNDTIMEO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    No,
    Forever,
    For(std::time::Duration),
}

impl Wait {
    /// When a wait that starts now must end (`For`).
    fn deadline(self) -> Option<std::time::Instant> {
        match self {
            Wait::For(t) => Some(std::time::Instant::now() + t),
            _ => None,
        }
    }
}

/// A blocking call's state in [`Sock::block`]: whether it asked how it may wait, and
/// until when.
#[derive(Debug, Default)]
struct Blocking {
    asked: bool,
    deadline: Option<std::time::Instant>,
}

/// Why a blocking call ([`Sock::block`]) ends without its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Non-blocking, and nothing to do now: `EAGAIN`.
    WouldBlock,
    /// A signal handler without `SA_RESTART` ran: `EINTR`.
    Interrupted,
}

impl Stop {
    fn errno(self) -> Errno {
        match self {
            Stop::WouldBlock => libc::EAGAIN,
            Stop::Interrupted => libc::EINTR,
        }
    }
}

/// How a [`Sock::wait`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woke {
    /// Notified, or woken for no reason (the caller checks its condition again).
    Notified,
    /// A signal handler without `SA_RESTART` ran in this thread (with a deadline: any
    /// handler).
    Interrupted,
    /// The deadline passed.
    TimedOut,
}

/// Sleeps while `word` holds `seen`, at most `left`. Without a timeout the kernel applies
/// `SA_RESTART` (a handler installed with it restarts the wait, one without ends it);
/// with one, any handler ends it.
fn futex_wait(word: &AtomicU32, seen: u32, left: Option<std::time::Duration>) -> Woke {
    let ts = left.map(|d| libc::timespec {
        tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(d.subsec_nanos() as i32),
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT on a live, aligned u32 of this process (private futex); `tsp`
    // is null (no timeout) or points to a live relative timespec. The kernel only reads
    // them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            seen,
            tsp,
        )
    };
    match (r < 0).then(crate::errno) {
        Some(libc::EINTR) => Woke::Interrupted,
        Some(libc::ETIMEDOUT) => Woke::TimedOut,
        // Woken, or the word changed before the sleep (EAGAIN).
        _ => Woke::Notified,
    }
}

/// Wakes every thread asleep on `word`.
fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a live, aligned u32 of this process; no memory is written.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

/// Copies `rx` from byte 0 into `bufs` from byte `skip` on; the count copied.
fn copy_out(rx: &VecDeque<u8>, bufs: &mut [&mut [u8]], mut skip: usize) -> usize {
    let (a, b) = rx.as_slices();
    let mut src = a.iter().chain(b.iter());
    let mut n = 0;
    for buf in bufs.iter_mut() {
        if skip >= buf.len() {
            skip -= buf.len();
            continue;
        }
        for slot in buf[skip..].iter_mut() {
            match src.next() {
                Some(&x) => {
                    *slot = x;
                    n += 1;
                }
                None => return n,
            }
        }
        skip = 0;
    }
    n
}

/// `0.0.0.0:0`.
pub(crate) const UNBOUND: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);

#[cfg(test)]
/// (Tests.) Waits up to 2 s for `t`; if it is still blocked on `s`, wakes it (so the test
/// process is not left with a thread asleep for ever) and fails with `what`.
pub(crate) fn ends_soon<T>(s: &Sock, t: std::thread::JoinHandle<T>, what: &str) -> T {
    let start = std::time::Instant::now();
    while !t.is_finished() {
        if start.elapsed() > std::time::Duration::from_secs(2) {
            let mut g = s.lock();
            g.fail(libc::ETIMEDOUT);
            s.notify(&g);
            drop(g);
            panic!("{what}: the call slept through a notified change");
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    t.join().unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Cmd, Shared};
    use std::time::Duration;

    fn connected() -> Arc<Sock> {
        Sock::new(
            Phase::Connected,
            SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 6379),
        )
    }

    const NB: &dyn Fn() -> Wait = &|| Wait::No;

    /// close(2) with SO_LINGER {1, t}: the caller waits until the poll thread closed the
    /// connection (the peer acknowledged everything) and wakes at once then; when the
    /// time passes first it returns, the wait is cleared and the close goes to the poll
    /// thread again (it finishes as a plain close, not a reset).
    #[test]
    fn a_lingering_close_waits_for_the_acknowledgement_or_its_time() {
        use std::time::Instant;
        let sh = Shared::new();
        let c = connected();
        let linger = |c: &Sock| {
            let mut g = c.lock();
            g.phase = Phase::Closed;
            g.bfd = Some(BFd(1));
            g.linger = true;
        };
        linger(&c);
        let t0 = Instant::now();
        c.linger_wait(&sh, t0 + Duration::from_millis(80));
        assert!(t0.elapsed() >= Duration::from_millis(80), "returned early");
        assert!(!c.lock().linger, "the wait is over");
        assert!(matches!(sh.take()[..], [Cmd::Close(_)]), "closed again");
        linger(&c);
        let c2 = Arc::clone(&c);
        let poll_thread = std::thread::spawn(move || {
            while c2.sleepers() == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(50));
            let mut g = c2.lock();
            g.bfd = None;
            c2.notify(&g);
        });
        let t0 = Instant::now();
        c.linger_wait(&sh, t0 + Duration::from_secs(30));
        assert!(t0.elapsed() < Duration::from_secs(10));
        assert!(t0.elapsed() >= Duration::from_millis(50), "did not wait");
        assert!(sh.take().is_empty(), "nothing more to do");
        poll_thread.join().unwrap();
    }

    /// The poll thread stops receiving at a full queue (`RX_CAP` bytes, `backlog`
    /// connections) and leaves the rest in the stack; the call that makes room there is
    /// work for it that no command announces: it must ring the doorbell, or under
    /// `idle = "backoff"` the rest waited for the poll thread's sleep to end.
    #[test]
    fn taking_from_a_full_queue_wakes_the_poll_thread() {
        use crate::engine::ROOM_MADE;
        let rung = || ROOM_MADE.with(std::cell::Cell::get);
        let c = connected();
        c.lock().rx.extend(std::iter::repeat_n(1u8, RX_CAP - 10));
        let mut buf = vec![0u8; 100];
        assert_eq!(c.read(&mut [&mut buf], 0, NB), Ok(100));
        assert_eq!(rung(), 0, "room in a queue that was not full: no ring");
        c.lock().rx.extend(std::iter::repeat_n(1u8, 200));
        assert_eq!(c.read(&mut [&mut buf], libc::MSG_PEEK, NB), Ok(100));
        assert_eq!(rung(), 0, "a peek takes nothing");
        assert_eq!(c.read(&mut [&mut buf], 0, NB), Ok(100));
        assert_eq!(rung(), 1, "a read from a full receive queue rings");
        let l = Sock::new(Phase::Listening, UNBOUND);
        l.lock().backlog = 2;
        l.lock().accept_q.push_back(connected());
        assert!(l.accept(NB).is_ok());
        assert_eq!(rung(), 1);
        l.lock().accept_q.extend([connected(), connected()]);
        assert!(l.accept(NB).is_ok());
        assert_eq!(rung(), 2, "an accept from a full accept queue rings");
    }

    #[test]
    fn readiness_follows_linux_tcp() {
        let s = Sock::new(Phase::Fresh, UNBOUND);
        assert_eq!(s.lock().mask(), OUT | WRNORM | HUP);
        let l = Sock::new(Phase::Listening, UNBOUND);
        assert_eq!(l.lock().mask(), 0);
        l.lock().accept_q.push_back(connected());
        assert_eq!(l.lock().mask(), IN | RDNORM);
        let c = connected();
        assert_eq!(c.lock().mask(), OUT | WRNORM);
        c.lock().rx.extend(b"x");
        assert_eq!(c.lock().mask(), IN | RDNORM | OUT | WRNORM);
        c.lock().rx.clear();
        c.lock().tx.extend(std::iter::repeat_n(0u8, TX_CAP));
        assert_eq!(c.lock().mask(), 0, "full send queue: not writable");
        c.lock().eof = true;
        assert_eq!(c.lock().mask(), IN | RDNORM | RDHUP);
        c.lock().shut_wr = true;
        assert_eq!(
            c.lock().mask(),
            IN | RDNORM | RDHUP | OUT | WRNORM | HUP,
            "both directions shut: writable (EPIPE at once) and hung up"
        );
        c.lock().fail(libc::ECONNRESET);
        let dead = IN | RDNORM | RDHUP | OUT | WRNORM | HUP;
        assert_eq!(c.lock().mask(), dead | ERR);
        c.lock().so_error = None;
        assert_eq!(c.lock().mask(), dead, "POLLERR while the error is pending");
    }

    /// poll(2) with POLLRDNORM/POLLWRNORM only (as select-on-poll shims ask): Linux's
    /// tcp_poll sets them with POLLIN/POLLOUT.
    #[test]
    fn poll_rdnorm_and_wrnorm_are_reported() {
        let c = connected();
        c.lock().rx.extend(b"x");
        let m = c.lock().mask() as libc::c_short;
        assert_ne!(m & libc::POLLRDNORM, 0);
        assert_ne!(m & libc::POLLWRNORM, 0);
    }

    #[test]
    fn read_scatters_peeks_and_ends() {
        let c = connected();
        c.lock().rx.extend(b"hello world");
        let (mut a, mut b) = ([0u8; 4], [0u8; 3]);
        assert_eq!(c.read(&mut [&mut a, &mut b], libc::MSG_PEEK, NB), Ok(7));
        assert_eq!((&a, &b), (b"hell", b"o w"));
        assert_eq!(c.lock().rx.len(), 11, "peek leaves the bytes");
        assert_eq!(c.read(&mut [&mut a, &mut b], 0, NB), Ok(7));
        let mut rest = [0u8; 16];
        assert_eq!(c.read(&mut [&mut rest], 0, NB), Ok(4));
        assert_eq!(&rest[..4], b"orld");
        assert_eq!(c.read(&mut [&mut rest], 0, NB), Err(libc::EAGAIN));
        c.lock().eof = true;
        assert_eq!(c.read(&mut [&mut rest], 0, NB), Ok(0));
        let f = Sock::new(Phase::Fresh, UNBOUND);
        assert_eq!(f.read(&mut [&mut rest], 0, NB), Err(libc::ENOTCONN));
    }

    /// recv(2) on a reset connection: queued bytes, then ECONNRESET once (the pending
    /// error, sk_err), then end of stream, as tcp_recvmsg does; not ECONNRESET forever.
    #[test]
    fn reset_is_reported_once_then_end_of_stream() {
        let c = connected();
        let mut b = [0u8; 16];
        c.lock().rx.extend(b"z");
        c.lock().fail(libc::ECONNRESET);
        assert_eq!(
            c.read(&mut [&mut b], 0, NB),
            Ok(1),
            "bytes before the error"
        );
        assert_eq!(c.read(&mut [&mut b], 0, NB), Err(libc::ECONNRESET));
        assert_eq!(c.read(&mut [&mut b], 0, NB), Ok(0), "then end of stream");
        assert_eq!(
            c.read(&mut [&mut b], 0, &|| Wait::Forever),
            Ok(0),
            "never blocks"
        );
    }

    /// send(2) after the peer reset: the pending ECONNRESET once, then EPIPE (which the
    /// hook turns into SIGPIPE unless MSG_NOSIGNAL), as tcp_sendmsg/sk_stream_error do.
    #[test]
    fn send_after_reset_is_econnreset_once_then_epipe() {
        let sh = Shared::new();
        let c = connected();
        c.lock().fail(libc::ECONNRESET);
        assert_eq!(c.write(&sh, &[b"x"], NB), Err(libc::ECONNRESET));
        assert_eq!(c.write(&sh, &[b"x"], NB), Err(libc::EPIPE));
        // SO_ERROR consumed the error: the read then sees end of stream.
        let d = connected();
        d.lock().fail(libc::ECONNRESET);
        assert_eq!(d.lock().so_error.take(), Some(libc::ECONNRESET));
        let mut b = [0u8; 4];
        assert_eq!(d.read(&mut [&mut b], 0, NB), Ok(0));
        assert_eq!(d.write(&sh, &[b"x"], NB), Err(libc::EPIPE));
    }

    /// recv(2) MSG_WAITALL: a blocking read waits for the whole request (across poll
    /// thread rounds), stopping early only at end of stream or an error.
    #[test]
    fn waitall_waits_for_the_whole_request() {
        let c = connected();
        c.lock().rx.extend(b"ab");
        let c2 = Arc::clone(&c);
        let t = std::thread::spawn(move || {
            let (mut x, mut y) = ([0u8; 3], [0u8; 3]);
            let n = c2.read(&mut [&mut x, &mut y], libc::MSG_WAITALL, &|| Wait::Forever);
            (n, x, y)
        });
        for chunk in [&b"cd"[..], b"ef", b"gh"] {
            std::thread::sleep(Duration::from_millis(30));
            let mut g = c.lock();
            g.rx.extend(chunk);
            c.notify(&g);
        }
        let (n, x, y) = t.join().unwrap();
        assert_eq!(n, Ok(6));
        assert_eq!((&x, &y), (b"abc", b"def"));
        assert_eq!(c.lock().rx.iter().copied().collect::<Vec<u8>>(), b"gh");
        // End of stream first: what came.
        c.lock().eof = true;
        let mut z = [0u8; 8];
        assert_eq!(
            c.read(&mut [&mut z], libc::MSG_WAITALL, &|| Wait::Forever),
            Ok(2)
        );
        // Non-blocking: what is queued.
        let d = connected();
        d.lock().rx.extend(b"q");
        assert_eq!(d.read(&mut [&mut z], libc::MSG_WAITALL, NB), Ok(1));
    }

    /// connect(2) again: EALREADY while the non-blocking handshake runs, EISCONN once
    /// connected, and after a failure the error once (ECONNREFUSED, or ECONNABORTED
    /// once SO_ERROR took it) instead of EALREADY for ever; that leaves the socket
    /// unconnected, so the next connect starts a new handshake (__inet_stream_connect's
    /// sock_error: SS_UNCONNECTED), as after a blocking connect that failed.
    #[test]
    fn connect_again_reports_progress_and_failure() {
        let f = Sock::new(Phase::Fresh, UNBOUND);
        assert_eq!(f.connect_again(NB), None);
        let s = Sock::new(Phase::Connecting, UNBOUND);
        assert_eq!(s.connect_again(NB), Some(Err(libc::EALREADY)));
        s.lock().fail(libc::ECONNREFUSED);
        assert_eq!(s.connect_again(NB), Some(Err(libc::ECONNREFUSED)));
        assert_eq!(s.connect_again(NB), None, "a new handshake");
        let a = Sock::new(Phase::Connecting, UNBOUND);
        a.lock().fail(libc::ECONNREFUSED);
        assert_eq!(a.lock().so_error.take(), Some(libc::ECONNREFUSED));
        assert_eq!(a.connect_again(NB), Some(Err(libc::ECONNABORTED)));
        assert_eq!(a.connect_again(NB), None, "a new handshake");
        let b = Sock::new(Phase::Connecting, UNBOUND);
        b.lock().fail(libc::ECONNREFUSED);
        assert_eq!(
            b.wait_connected(None, libc::EINPROGRESS),
            Err(libc::ECONNREFUSED)
        );
        assert_eq!(
            b.connect_again(NB),
            None,
            "blocking: a new handshake at once"
        );
        assert_eq!(b.lock().so_error, None);
        // A blocking second connect waits for the handshake.
        let w = Sock::new(Phase::Connecting, UNBOUND);
        let w2 = Arc::clone(&w);
        let t = std::thread::spawn(move || w2.connect_again(&|| Wait::Forever));
        std::thread::sleep(Duration::from_millis(30));
        {
            let mut g = w.lock();
            g.phase = Phase::Connected;
            w.notify(&g);
        }
        assert_eq!(t.join().unwrap(), Some(Ok(())));
        assert_eq!(w.connect_again(NB), Some(Err(libc::EISCONN)));
    }

    /// Two threads connect(2) one blocking socket at once: the handshake starts once
    /// (one command; a second would open a second connection and overwrite the answer
    /// the first thread waits for), and both return when it completes, as on Linux
    /// (the second caller finds the connect in progress and waits for it).
    #[test]
    fn two_threads_connecting_one_socket_start_one_handshake() {
        let s = Sock::new(Phase::Fresh, UNBOUND);
        let sh = Arc::new(Shared::new());
        let callers: Vec<_> = (0..2)
            .map(|_| {
                let (s, sh) = (Arc::clone(&s), Arc::clone(&sh));
                std::thread::spawn(move || {
                    let to = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 7);
                    s.connect(&|| sh.push(Cmd::Connect(Arc::clone(&s), to)), &|| {
                        Wait::Forever
                    })
                })
            })
            .collect();
        // The poll thread: answers what is queued (after both callers had their chance
        // to queue), then completes the handshake.
        std::thread::sleep(Duration::from_millis(200));
        let cmds = sh.take();
        for c in &cmds {
            if let Cmd::Connect(c, _) = c {
                let mut g = c.lock();
                g.phase = Phase::Connecting;
                g.reply = Some(Ok(()));
                c.notify(&g);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
        {
            let mut g = s.lock();
            g.phase = Phase::Connected;
            s.notify(&g);
        }
        let start = std::time::Instant::now();
        while !callers.iter().all(|t| t.is_finished()) {
            if start.elapsed() > Duration::from_secs(2) {
                let mut g = s.lock();
                g.reply = Some(Err(libc::ETIMEDOUT));
                s.notify(&g);
                drop(g);
                panic!("a connect slept on ({} commands)", cmds.len());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        for t in callers {
            assert_eq!(t.join().unwrap(), Ok(()));
        }
        assert_eq!(cmds.len(), 1, "one handshake");
    }

    /// shutdown(SHUT_RD) on Linux's TCP does not drop the receive queue: recv returns
    /// what is queued, then 0 instead of blocking (tcp_recvmsg copies queued data
    /// before it looks at RCV_SHUTDOWN); epoll reports EPOLLIN | EPOLLRDHUP (tcp_poll).
    #[test]
    fn shut_rd_reads_what_is_queued_then_end_of_stream() {
        let c = connected();
        c.lock().rx.extend(b"queued");
        c.lock().shut_rd = true;
        assert_eq!(c.lock().mask() & (IN | RDNORM | RDHUP), IN | RDNORM | RDHUP);
        let mut b = [0u8; 16];
        assert_eq!(c.read(&mut [&mut b], 0, &|| Wait::Forever), Ok(6));
        assert_eq!(&b[..6], b"queued");
        assert_eq!(
            c.read(&mut [&mut b], 0, &|| Wait::Forever),
            Ok(0),
            "then 0, no wait"
        );
        assert_eq!(c.lock().mask() & RDHUP, RDHUP);
    }

    #[test]
    fn blocking_read_waits_for_the_poll_thread() {
        let c = connected();
        let c2 = Arc::clone(&c);
        let t = std::thread::spawn(move || {
            let mut b = [0u8; 8];
            let n = c2.read(&mut [&mut b], 0, &|| Wait::Forever).unwrap();
            b[..n].to_vec()
        });
        std::thread::sleep(Duration::from_millis(50));
        {
            let mut g = c.lock();
            g.rx.extend(b"late");
            c.notify(&g);
        }
        assert_eq!(t.join().unwrap(), b"late");
    }

    #[test]
    fn write_queues_flushes_once_and_stops_at_the_cap() {
        let sh = Shared::new();
        let c = connected();
        assert_eq!(c.write(&sh, &[b"ab", b"cd"], NB), Ok(4));
        assert_eq!(c.write(&sh, &[b"e"], NB), Ok(1));
        assert_eq!(
            sh.take().len(),
            1,
            "one flush while the queue was non-empty"
        );
        let big = vec![7u8; TX_CAP];
        assert_eq!(c.write(&sh, &[&big], NB), Ok(TX_CAP - 5), "partial");
        assert_eq!(c.write(&sh, &[b"x"], NB), Err(libc::EAGAIN));
        assert_eq!(
            c.lock().tx.iter().take(5).copied().collect::<Vec<u8>>(),
            b"abcde"
        );
        c.lock().tx.clear();
        c.lock().shut_wr = true;
        assert_eq!(c.write(&sh, &[b"x"], NB), Err(libc::EPIPE));
    }

    #[test]
    fn write_skips_what_an_earlier_round_took() {
        let sh = Shared::new();
        let c = connected();
        c.lock().tx.extend(std::iter::repeat_n(0u8, TX_CAP - 3));
        let c2 = Arc::clone(&c);
        let t = std::thread::spawn(move || {
            let sh = Shared::new();
            c2.write(&sh, &[b"12", b"345", b"6"], &|| Wait::Forever)
        });
        // The poll thread drains; the blocked writer goes on where it stopped.
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(10));
            let mut g = c.lock();
            let n = g.tx.len();
            if n >= TX_CAP - 3 + 3 {
                g.tx.drain(..TX_CAP - 3);
                c.notify(&g);
                break;
            }
        }
        assert_eq!(t.join().unwrap(), Ok(6));
        assert_eq!(c.lock().tx.iter().copied().collect::<Vec<u8>>(), b"123456");
        drop(sh);
    }

    #[test]
    fn accept_takes_queued_connections() {
        let l = Sock::new(Phase::Listening, UNBOUND);
        assert_eq!(l.accept(NB).err(), Some(libc::EAGAIN));
        let c = connected();
        l.lock().accept_q.push_back(Arc::clone(&c));
        assert!(Arc::ptr_eq(&l.accept(NB).unwrap(), &c));
        let f = Sock::new(Phase::Fresh, UNBOUND);
        assert_eq!(f.accept(NB).err(), Some(libc::EINVAL));
    }

    /// Serialises the tests that install a SIGUSR1 handler (process-wide).
    static SIGNAL_TESTS: Mutex<()> = Mutex::new(());

    extern "C" fn on_usr1(_: libc::c_int) {}

    /// Installs a no-op SIGUSR1 handler, with `SA_RESTART` or without.
    fn handle_usr1(restart: bool) {
        // SAFETY: sigaction is plain data, zeroed is valid; the handler is async-signal
        // safe (it does nothing).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_usr1 as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = if restart { libc::SA_RESTART } else { 0 };
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
        }
    }

    /// Runs `call` on a thread until it sleeps on `s`, then sends that thread SIGUSR1;
    /// returns the thread (its result comes with `join`).
    fn blocked_then_signalled<T: Send + 'static>(
        s: &Arc<Sock>,
        call: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let t = std::thread::spawn(call);
        let start = std::time::Instant::now();
        while s.sleepers.load(Ordering::Relaxed) == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the call never slept"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        use std::os::unix::thread::JoinHandleExt;
        assert_eq!(
            // SAFETY: the thread is alive (it sleeps on `s`); SIGUSR1 has a handler.
            unsafe { libc::pthread_kill(t.as_pthread_t(), libc::SIGUSR1) },
            0
        );
        t
    }

    /// A signal whose handler has no SA_RESTART ends a blocking read, write, accept and
    /// connect with EINTR (what a read or write had already moved is returned instead),
    /// as Linux's tcp_recvmsg, sk_stream_wait_memory, inet_csk_wait_for_connect and
    /// __inet_stream_connect do: a Python client's Ctrl-C (KeyboardInterrupt) or a
    /// server's SIGTERM handler is not held up until data comes.
    #[test]
    fn a_signal_without_sa_restart_interrupts_blocking_calls() {
        let _g = SIGNAL_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        handle_usr1(false);
        let c = connected();
        let c2 = Arc::clone(&c);
        let t = blocked_then_signalled(&c, move || {
            c2.read(&mut [&mut [0u8; 4]], 0, &|| Wait::Forever)
        });
        assert_eq!(t.join().unwrap(), Err(libc::EINTR));
        // MSG_WAITALL with part of the request read: the part.
        c.lock().rx.extend(b"ab");
        let c2 = Arc::clone(&c);
        let t = blocked_then_signalled(&c, move || {
            c2.read(&mut [&mut [0u8; 4]], libc::MSG_WAITALL, &|| Wait::Forever)
        });
        assert_eq!(t.join().unwrap(), Ok(2));
        // A write blocked on a full send queue: EINTR, or what it queued.
        let w = connected();
        w.lock().tx.extend(std::iter::repeat_n(0u8, TX_CAP));
        let (w2, sh) = (Arc::clone(&w), Arc::new(Shared::new()));
        let sh2 = Arc::clone(&sh);
        let t = blocked_then_signalled(&w, move || w2.write(&sh2, &[b"xyz"], &|| Wait::Forever));
        assert_eq!(t.join().unwrap(), Err(libc::EINTR));
        w.lock().tx.truncate(TX_CAP - 2);
        let (w2, sh2) = (Arc::clone(&w), Arc::clone(&sh));
        let t = blocked_then_signalled(&w, move || w2.write(&sh2, &[b"xyz"], &|| Wait::Forever));
        assert_eq!(t.join().unwrap(), Ok(2));
        // accept on an empty queue, and a blocking connect's handshake wait.
        let l = Sock::new(Phase::Listening, UNBOUND);
        let l2 = Arc::clone(&l);
        let t = blocked_then_signalled(&l, move || l2.accept(&|| Wait::Forever).map(|_| ()));
        assert_eq!(t.join().unwrap(), Err(libc::EINTR));
        let k = Sock::new(Phase::Connecting, UNBOUND);
        let k2 = Arc::clone(&k);
        let t = blocked_then_signalled(&k, move || k2.wait_connected(None, libc::EINPROGRESS));
        assert_eq!(t.join().unwrap(), Err(libc::EINTR));
        // The handshake goes on; connect again waits for it.
        assert_eq!(k.lock().phase, Phase::Connecting);
        // The command wait of listen/connect is not interrupted.
        let r = Sock::new(Phase::Opening, UNBOUND);
        let r2 = Arc::clone(&r);
        let t = blocked_then_signalled(&r, move || r2.wait_reply());
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished(), "wait_reply ended on the signal");
        let mut g = r.lock();
        g.reply = Some(Ok(()));
        r.notify(&g);
        drop(g);
        assert_eq!(t.join().unwrap(), Ok(()));
    }

    /// SO_RCVTIMEO / SO_SNDTIMEO (`Wait::For`): a read, an accept and a write that find
    /// nothing to do end with EAGAIN once the time has passed (Linux's sock_rcvtimeo /
    /// sock_sndtimeo), what was moved first is returned, and data that comes in time
    /// is read; a blocking connect that times out answers EINPROGRESS (the handshake
    /// goes on) and a repeat EALREADY.
    #[test]
    fn socket_timeouts_end_blocking_calls_with_eagain() {
        use std::time::Instant;
        let t = || Wait::For(Duration::from_millis(60));
        let c = connected();
        let start = Instant::now();
        assert_eq!(c.read(&mut [&mut [0u8; 4]], 0, &t), Err(libc::EAGAIN));
        assert!(start.elapsed() >= Duration::from_millis(60));
        // MSG_WAITALL with part read: the part.
        c.lock().rx.extend(b"ab");
        assert_eq!(c.read(&mut [&mut [0u8; 4]], libc::MSG_WAITALL, &t), Ok(2));
        // Data in time.
        let c2 = Arc::clone(&c);
        let r = std::thread::spawn(move || {
            let mut b = [0u8; 4];
            let long = || Wait::For(Duration::from_secs(10));
            c2.read(&mut [&mut b], 0, &long).map(|n| b[..n].to_vec())
        });
        while c.sleepers() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut g = c.lock();
        g.rx.extend(b"in");
        c.notify(&g);
        drop(g);
        assert_eq!(r.join().unwrap(), Ok(b"in".to_vec()));
        // A full send queue: EAGAIN, or what was queued.
        let w = connected();
        w.lock().tx.extend(std::iter::repeat_n(0u8, TX_CAP - 1));
        let sh = Shared::new();
        assert_eq!(w.write(&sh, &[b"xyz"], &t), Ok(1));
        assert_eq!(w.write(&sh, &[b"xyz"], &t), Err(libc::EAGAIN));
        let l = Sock::new(Phase::Listening, UNBOUND);
        assert_eq!(l.accept(&t).err(), Some(libc::EAGAIN));
        // connect: EINPROGRESS at the first call, EALREADY at a repeat.
        let k = Sock::new(Phase::Connecting, UNBOUND);
        assert_eq!(k.connect_again(&t), Some(Err(libc::EALREADY)));
        assert_eq!(k.lock().phase, Phase::Connecting);
        let f = Sock::new(Phase::Fresh, UNBOUND);
        let f2 = Arc::clone(&f);
        let start = Instant::now();
        let r = std::thread::spawn(move || {
            f2.connect(
                &|| {
                    // The poll thread's answer: started.
                    let mut g = f2.lock();
                    g.phase = Phase::Connecting;
                    g.reply = Some(Ok(()));
                    f2.notify(&g);
                },
                &|| Wait::For(Duration::from_millis(60)),
            )
        });
        assert_eq!(r.join().unwrap(), Err(libc::EINPROGRESS));
        assert!(start.elapsed() >= Duration::from_millis(60));
        assert_eq!(f.lock().phase, Phase::Connecting);
    }

    /// With SA_RESTART the handler runs and the call goes on waiting (the kernel
    /// restarts the futex wait, as it restarts a blocking recv), then returns the data.
    #[test]
    fn a_signal_with_sa_restart_lets_the_call_go_on() {
        let _g = SIGNAL_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        handle_usr1(true);
        let c = connected();
        let c2 = Arc::clone(&c);
        let t = blocked_then_signalled(&c, move || {
            let mut b = [0u8; 4];
            c2.read(&mut [&mut b], 0, &|| Wait::Forever)
                .map(|n| b[..n].to_vec())
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished(), "the read ended on a SA_RESTART signal");
        let mut g = c.lock();
        g.rx.extend(b"hi");
        c.notify(&g);
        drop(g);
        assert_eq!(t.join().unwrap(), Ok(b"hi".to_vec()));
        // With a timeout (SO_RCVTIMEO) a call is never restarted (signal(7)): EINTR.
        let c = connected();
        let c2 = Arc::clone(&c);
        let t = blocked_then_signalled(&c, move || {
            c2.read(&mut [&mut [0u8; 4]], 0, &|| {
                Wait::For(Duration::from_secs(30))
            })
        });
        assert_eq!(t.join().unwrap(), Err(libc::EINTR));
    }

    /// A blocking call asks `O_NONBLOCK` (an `fcntl`) with the state unlocked; a change
    /// made meanwhile, notified by whoever made it (the poll thread connecting, another
    /// thread closing the socket or shutting a listener down), must not be slept
    /// through: the sleep has no timeout, so a missed notification is a hang. Here the
    /// `nonblock` check itself makes the change, as the other thread would in that gap.
    #[test]
    fn a_change_while_o_nonblock_is_read_is_not_slept_through() {
        fn close(s: &Sock) {
            let mut g = s.lock();
            g.phase = Phase::Closed;
            s.notify(&g);
        }
        // read: the socket closed by another thread.
        let c = connected();
        let c2 = Arc::clone(&c);
        let t = std::thread::spawn(move || {
            let c3 = Arc::clone(&c2);
            c2.read(&mut [&mut [0u8; 4]], 0, &move || {
                close(&c3);
                Wait::Forever
            })
        });
        assert_eq!(ends_soon(&c, t, "read"), Err(libc::ENOTCONN));
        // write on a connecting socket: the handshake ends.
        let k = Sock::new(Phase::Connecting, UNBOUND);
        let k2 = Arc::clone(&k);
        let t = std::thread::spawn(move || {
            let (k3, sh) = (Arc::clone(&k2), Shared::new());
            k2.write(&sh, &[b"hi"], &move || {
                let mut g = k3.lock();
                g.phase = Phase::Connected;
                k3.notify(&g);
                Wait::Forever
            })
        });
        assert_eq!(ends_soon(&k, t, "write (connecting)"), Ok(2));
        // write on a full send queue: the socket closed by another thread.
        let w = connected();
        w.lock().tx.extend(std::iter::repeat_n(0u8, TX_CAP));
        let w2 = Arc::clone(&w);
        let t = std::thread::spawn(move || {
            let (w3, sh) = (Arc::clone(&w2), Shared::new());
            w2.write(&sh, &[b"x"], &move || {
                close(&w3);
                Wait::Forever
            })
        });
        assert_eq!(ends_soon(&w, t, "write (full)"), Err(libc::ENOTCONN));
        // accept: the listener shut down (shutdown(2) makes it Fresh and notifies).
        let l = Sock::new(Phase::Listening, UNBOUND);
        let l2 = Arc::clone(&l);
        let t = std::thread::spawn(move || {
            let l3 = Arc::clone(&l2);
            l2.accept(&move || {
                let mut g = l3.lock();
                g.phase = Phase::Fresh;
                l3.notify(&g);
                Wait::Forever
            })
            .map(|_| ())
        });
        assert_eq!(ends_soon(&l, t, "accept"), Err(libc::EINVAL));
    }
}
