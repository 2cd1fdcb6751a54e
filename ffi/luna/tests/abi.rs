//! The C ABI exercised from Rust as a C program would call it, over r2c's in-memory
//! link (no DPDK, no root): an inline-mode echo server (zero copy: received io-vector
//! segments sent back as they are) and a batch-mode client (socket / connect /
//! register / poll / send / recv / shutdown / close) in two environments of one
//! process; then the error edge: NULL and stale handles, bad configs, sizes.

use errno::errno;
use luna::*;
use r2c::device::mem::{MemConfig, MemPair};
use std::ffi::{c_void, CStr, CString};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const PORT: u16 = 7000;
const LEN: usize = 50_000;
/// What the zbuf test's callback found.
static ZB_RESULT: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn config(ip: &str) -> String {
    format!(
        "[device]\nkind = \"mem\"\n[cores]\nlist = [0]\n[net]\nip = \"{ip}\"\nprefix_len = 24\n\
         [runtime]\nidle = \"yield\"\npin = false\n"
    )
}

fn byte(i: usize) -> u8 {
    (i * 7 + i / 251) as u8
}

fn last_error() -> String {
    // SAFETY: luna_last_error never returns NULL and the string lives until the next
    // failing call on this thread.
    unsafe { CStr::from_ptr(luna_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// What the server saw.
#[derive(Default)]
struct Server {
    accepted: AtomicUsize,
    echoed: AtomicU64,
    closed: AtomicUsize,
    bad: Mutex<Vec<String>>,
}

impl Server {
    fn bad(&self, s: String) {
        self.bad.lock().unwrap().push(s);
    }
}

fn server_of<'a>(user: *mut c_void) -> &'a Server {
    // SAFETY: `user` is the test's `Server`, alive until both runtimes are joined.
    unsafe { &*(user as *const Server) }
}

extern "C" fn s_start(ctx: *mut luna_ctx_t, user: *mut c_void) {
    let mut l = 0;
    // SAFETY: ctx is this callback's context.
    if unsafe { luna_listen(ctx, PORT, 64, &mut l) } != 0 || l == 0 {
        server_of(user).bad(format!("listen: {}", last_error()));
    }
}

extern "C" fn s_accept(
    ctx: *mut luna_ctx_t,
    conn: luna_conn_t,
    l: luna_listener_t,
    user: *mut c_void,
) {
    let s = server_of(user);
    s.accepted.fetch_add(1, Ordering::Relaxed);
    // SAFETY: ctx is this callback's context; the pointer is only stored.
    unsafe {
        if l == 0 || luna_conn_set_user(ctx, conn, 0x5eed as *mut c_void) != 0 {
            s.bad(format!("accept: listener {l}, set_user {}", last_error()));
        }
        // A made-up id is EBADF, never another connection.
        if luna_send_capacity(ctx, conn ^ (1 << 40)) != -1 || errno().0 != libc::EBADF {
            s.bad("a stale id was accepted".into());
        }
    }
}

extern "C" fn s_readable(ctx: *mut luna_ctx_t, conn: luna_conn_t, user: *mut c_void) {
    let s = server_of(user);
    // SAFETY: ctx is this callback's context; every handle is freed once.
    unsafe {
        if luna_conn_user(ctx, conn) != 0x5eed as *mut c_void {
            s.bad("user pointer lost".into());
        }
        loop {
            let mut v = null_mut();
            let n = luna_recv_iovec(ctx, conn, 1 << 20, &mut v);
            if n > 0 {
                let mut total = 0;
                for i in 0..luna_iovec_count(v) {
                    let z = luna_iovec_zbuf(v, i);
                    total += luna_zbuf_len(z);
                    if luna_send_all(ctx, conn, z) != 0 {
                        s.bad(format!("send_all: {}", last_error()));
                    }
                    luna_zbuf_free(z);
                }
                if total != luna_iovec_len(v) || total != n as usize {
                    s.bad(format!("iovec of {n} bytes has segments of {total}"));
                }
                luna_iovec_free(v);
                s.echoed.fetch_add(n as u64, Ordering::Relaxed);
            } else if n == 0 {
                if luna_close(ctx, conn) != 0 {
                    s.bad(format!("close: {}", last_error()));
                }
                s.closed.fetch_add(1, Ordering::Relaxed);
                // The id died with close.
                if luna_close(ctx, conn) != -1 || errno().0 != libc::EBADF {
                    s.bad("double close was not EBADF".into());
                }
                return;
            } else {
                if errno().0 != libc::EAGAIN {
                    s.bad(format!("recv: {}", last_error()));
                }
                return;
            }
        }
    }
}

/// The batch client's state (one core: only its thread touches it).
struct Client {
    fd: i32,
    sent: usize,
    got: Vec<u8>,
    shut: bool,
    done: bool,
    errors: Vec<String>,
}

extern "C" fn c_poll(s: *mut luna_sockets_t, user: *mut c_void) {
    // SAFETY: `user` is the test's Client, used only by this core's thread.
    let c = unsafe { &mut *(user as *mut Client) };
    // SAFETY: `s` is this callback's socket API; buffers are local.
    unsafe {
        if c.fd < 0 {
            c.fd = luna_sock_socket(s);
            let to = luna_addr_t {
                addr: u32::from(std::net::Ipv4Addr::new(198, 18, 0, 1)).to_be(),
                port: PORT,
                reserved: 0,
            };
            if luna_sock_connect(s, c.fd, &to) != -1 || errno().0 != libc::EINPROGRESS {
                c.errors.push(format!("connect: {}", last_error()));
            }
            if luna_sock_register(s, c.fd, LUNA_POLLIN | LUNA_POLLOUT) != 0 {
                c.errors.push(format!("register: {}", last_error()));
            }
            if luna_sock_register(s, c.fd, 0x8000) != -1 || errno().0 != libc::EINVAL {
                c.errors.push("unknown event bits accepted".into());
            }
            return;
        }
        let mut evs = [luna_poll_event_t::default(); 4];
        let n = luna_sock_poll(s, evs.as_mut_ptr(), evs.len());
        for ev in &evs[..n.max(0) as usize] {
            if ev.fd != c.fd {
                c.errors.push(format!("event for unknown fd {}", ev.fd));
                continue;
            }
            if ev.events & LUNA_POLLERR != 0 {
                c.errors.push(format!("socket error {}", ev.error));
            }
            if ev.events & LUNA_POLLOUT != 0 && c.sent < LEN {
                let data: Vec<u8> = (c.sent..LEN).map(byte).collect();
                let k = luna_sock_send(s, c.fd, data.as_ptr().cast(), data.len());
                if k > 0 {
                    c.sent += k as usize;
                } else if errno().0 != libc::EAGAIN {
                    c.errors.push(format!("send: {}", last_error()));
                }
            }
            if c.sent == LEN && !c.shut {
                c.shut = luna_sock_shutdown(s, c.fd) == 0;
                luna_sock_register(s, c.fd, LUNA_POLLIN);
            }
            if ev.events & (LUNA_POLLIN | LUNA_POLLHUP) != 0 {
                let mut buf = [0u8; 3000];
                loop {
                    let k = luna_sock_recv(s, c.fd, buf.as_mut_ptr().cast(), buf.len());
                    if k > 0 {
                        c.got.extend_from_slice(&buf[..k as usize]);
                        continue;
                    }
                    if k == 0 {
                        luna_sock_close(s, c.fd);
                        c.done = true;
                        luna_sock_request_stop(s);
                    } else if errno().0 != libc::EAGAIN {
                        c.errors.push(format!("recv: {}", last_error()));
                    }
                    break;
                }
            }
        }
    }
}

fn wait(rt: *mut luna_runtime_t, limit: Duration) {
    let end = Instant::now() + limit;
    // SAFETY: rt is live.
    while unsafe { luna_runtime_finished(rt) } == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn stats(rt: *mut luna_runtime_t) -> luna_core_stats_t {
    let mut st = luna_core_stats_t::default();
    // SAFETY: rt is live; st is a writable luna_core_stats_t.
    let rc = unsafe { luna_runtime_stats(rt, 0, &mut st, std::mem::size_of_val(&st)) };
    assert_eq!(rc, 0, "{}", last_error());
    st
}

/// Runs a one-core batch runtime on a memory link whose `on_start` is `start` (which does
/// its calls and requests the stop) and whose `on_poll` does nothing; joins and frees it
/// and the environment.
fn run_batch_start(start: extern "C" fn(*mut luna_sockets_t, *mut c_void)) {
    let (a, _b) = MemPair::build(&MemConfig::default()).expect("mem link");
    let env = env_from_mem(&config("198.18.0.1"), vec![a]).expect("env");
    extern "C" fn poll(_s: *mut luna_sockets_t, _u: *mut c_void) {}
    // SAFETY: env is live; the runtime is joined and freed once, then the environment.
    unsafe {
        let ops = luna_batch_ops_t {
            on_start: Some(start),
            on_poll: Some(poll),
            on_stop: None,
        };
        let rt = luna_run_batch(env, &ops, null_mut());
        assert!(!rt.is_null(), "{}", last_error());
        wait(rt, Duration::from_secs(10));
        assert_eq!(luna_runtime_join(rt), 0, "{}", last_error());
        luna_runtime_free(rt);
        luna_env_free(env);
    }
}

#[test]
fn inline_echo_server_and_batch_client_through_the_c_abi() {
    let (a, b) = MemPair::build(&MemConfig::default()).expect("mem link");
    let senv = env_from_mem(&config("198.18.0.1"), vec![a]).expect("server env");
    let cenv = env_from_mem(&config("198.18.0.2"), vec![b]).expect("client env");
    // SAFETY: the environments are live; ops and user outlive the runtimes.
    unsafe {
        assert_eq!(luna_env_cores(senv), 1);
        let server = Box::new(Server::default());
        let sops = luna_inline_ops_t {
            on_start: Some(s_start),
            on_accept: Some(s_accept),
            on_connected: None,
            on_readable: Some(s_readable),
            on_writable: None,
            on_closed: None,
            on_poll: None,
            on_stop: None,
        };
        let srt = luna_run_inline(senv, &sops, &*server as *const Server as *mut c_void);
        assert!(!srt.is_null(), "{}", last_error());
        // One runtime per environment.
        assert!(luna_run_inline(senv, &sops, null_mut()).is_null());
        assert_eq!(errno().0, libc::EBUSY);

        let mut client = Box::new(Client {
            fd: -1,
            sent: 0,
            got: Vec::new(),
            shut: false,
            done: false,
            errors: Vec::new(),
        });
        let cops = luna_batch_ops_t {
            on_start: None,
            on_poll: Some(c_poll),
            on_stop: None,
        };
        let crt = luna_run_batch(cenv, &cops, &mut *client as *mut Client as *mut c_void);
        assert!(!crt.is_null(), "{}", last_error());
        wait(crt, Duration::from_secs(30));
        assert_eq!(luna_runtime_join(crt), 0, "{}", last_error());
        assert_eq!(luna_runtime_join(crt), -1, "joined twice");
        assert_eq!(errno().0, libc::EINVAL);
        // The server closes its side when it reads the client's FIN.
        let end = Instant::now() + Duration::from_secs(10);
        while server.closed.load(Ordering::Relaxed) == 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(luna_runtime_stop(srt), 0);
        assert_eq!(luna_runtime_join(srt), 0, "{}", last_error());

        assert!(client.errors.is_empty(), "client: {:?}", client.errors);
        assert!(
            server.bad.lock().unwrap().is_empty(),
            "server: {:?}",
            server.bad.lock().unwrap()
        );
        assert!(client.done, "the client finished");
        assert_eq!(client.sent, LEN);
        assert_eq!(client.got.len(), LEN, "echoed bytes");
        assert!(
            client.got.iter().enumerate().all(|(i, &v)| v == byte(i)),
            "echo differs"
        );
        assert_eq!(server.echoed.load(Ordering::Relaxed), LEN as u64);
        assert_eq!(server.accepted.load(Ordering::Relaxed), 1);

        // Final counters, as a struct and as name/value pairs.
        let (ss, cs) = (stats(srt), stats(crt));
        assert_eq!((ss.accepted, ss.stopped), (1, 1));
        assert_eq!((cs.connected, cs.stopped), (1, 1));
        let n = luna_stats_count();
        let mut vals = vec![0u64; n];
        assert_eq!(
            luna_runtime_stats_values(srt, 0, vals.as_mut_ptr(), n),
            n as i32
        );
        let name = |i| CStr::from_ptr(luna_stats_name(i)).to_str().unwrap();
        let idx = (0..n).find(|&i| name(i) == "accepted").unwrap();
        assert_eq!(vals[idx], 1);
        let rx = (0..n).find(|&i| name(i) == "rx_frames").unwrap();
        assert_eq!(vals[rx], ss.rx_frames);
        assert!(ss.rx_frames > 0 && cs.tx_frames > 0);

        // Errors at the edge.
        let mut st = luna_core_stats_t::default();
        assert_eq!(
            luna_runtime_stats(srt, 1, &mut st, std::mem::size_of_val(&st)),
            -1
        );
        assert_eq!(errno().0, libc::EINVAL, "core out of range");
        assert_eq!(luna_runtime_stats(srt, 0, &mut st, 8), -1);
        assert_eq!(errno().0, libc::EINVAL, "short struct size");
        assert!(last_error().contains("out_size"), "{}", last_error());
        // A program built against the first header passes its smaller struct: it gets
        // the fields it has and nothing past them.
        let mut old = luna_core_stats_t {
            events_coalesced: 0xdead,
            exc_table_version: 0xbeef,
            ..Default::default()
        };
        assert_eq!(
            luna_runtime_stats(srt, 0, &mut old, LUNA_CORE_STATS_SIZE_VER0),
            0
        );
        assert_eq!(old.rx_frames, ss.rx_frames);
        assert_eq!(
            (old.events_coalesced, old.exc_table_version),
            (0xdead, 0xbeef)
        );
        assert_eq!(
            luna_runtime_stats(srt, 0, &mut old, LUNA_CORE_STATS_SIZE_VER0 - 8),
            -1
        );

        luna_runtime_free(srt);
        luna_runtime_free(crt);
        luna_env_free(senv);
        luna_env_free(cenv);
    }
}

#[test]
fn null_and_bad_arguments_are_errors_not_crashes() {
    // SAFETY: every pointer passed is NULL or valid; that is the point of the test.
    unsafe {
        assert_eq!(luna_env_cores(null()), -1);
        assert_eq!(errno().0, libc::EINVAL);
        assert!(last_error().contains("NULL"), "{}", last_error());
        assert_eq!(luna_runtime_stop(null()), -1);
        assert_eq!(luna_runtime_join(null_mut()), -1);
        assert_eq!(luna_runtime_finished(null()), -1);
        assert_eq!(luna_runtime_cores(null()), -1);
        assert!(luna_run_inline(null_mut(), null(), null_mut()).is_null());
        assert_eq!(errno().0, libc::EINVAL);
        assert!(luna_run_batch(null_mut(), null(), null_mut()).is_null());
        assert_eq!(luna_ctx_core(null_mut()), -1);
        assert_eq!(errno().0, libc::EINVAL);
        assert_eq!(luna_sock_socket(null_mut()), -1);
        assert_eq!(luna_recv(null_mut(), 1, null_mut()), -1);
        assert!(luna_ctx_alloc(null_mut(), 10).is_null());
        assert_eq!(luna_zbuf_len(null()), 0);
        assert!(luna_zbuf_freeze(null_mut()).is_null());
        assert_eq!(errno().0, libc::EINVAL);
        assert_eq!(luna_iovec_segment(null(), 0, null_mut(), null_mut()), -1);
        luna_zbuf_free(null_mut());
        luna_zbuf_mut_free(null_mut());
        luna_iovec_free(null_mut());
        luna_env_free(null_mut());
        luna_runtime_free(null_mut());

        // Batch ops without on_poll.
        let (a, _b) = MemPair::build(&MemConfig::default()).expect("mem link");
        let env = env_from_mem(&config("198.18.0.1"), vec![a]).expect("env");
        let ops = luna_batch_ops_t {
            on_start: None,
            on_poll: None,
            on_stop: None,
        };
        assert!(luna_run_batch(env, &ops, null_mut()).is_null());
        assert_eq!(errno().0, libc::EINVAL);
        luna_env_free(env);
    }
}

#[test]
fn init_reports_config_errors_with_errno_and_the_fix() {
    let over = |v: &[&str]| {
        v.iter()
            .map(|s| CString::new(*s).unwrap())
            .collect::<Vec<_>>()
    };
    // SAFETY: every pointer passed is NULL or a valid C string array.
    unsafe {
        let o = over(&[
            "device.kind=dpdk",
            "device.port=net_null0",
            "cores.list=[0]",
            "net.ip=not-an-ip",
        ]);
        let p: Vec<_> = o.iter().map(|c| c.as_ptr()).collect();
        assert!(luna_init(null(), p.as_ptr(), p.len()).is_null());
        assert_eq!(errno().0, libc::EINVAL);
        assert!(last_error().contains("net.ip"), "{}", last_error());

        let o = over(&["no equals sign"]);
        let p: Vec<_> = o.iter().map(|c| c.as_ptr()).collect();
        assert!(luna_init(null(), p.as_ptr(), 1).is_null());
        assert_eq!(errno().0, libc::EINVAL);
        assert!(last_error().contains("KEY=VALUE"), "{}", last_error());

        assert!(
            luna_init(null(), null(), 1).is_null(),
            "NULL list with n = 1"
        );
        assert_eq!(errno().0, libc::EINVAL);

        let path = CString::new("/nonexistent/luna.toml").unwrap();
        assert!(luna_init(path.as_ptr(), null(), 0).is_null());
        assert_eq!(errno().0, libc::ENOENT);

        let o = over(&["device.kind=mem", "cores.list=[0]", "net.ip=198.18.0.1"]);
        let p: Vec<_> = o.iter().map(|c| c.as_ptr()).collect();
        assert!(luna_init(null(), p.as_ptr(), p.len()).is_null());
        assert_eq!(errno().0, libc::ENOTSUP, "{}", last_error());
    }
}

#[test]
fn zbuf_handles_write_freeze_slice_and_bounds() {
    extern "C" fn start(s: *mut luna_sockets_t, _u: *mut c_void) {
        let mut r = Vec::new();
        // SAFETY: `s` is this callback's API; handles freed once.
        unsafe {
            let m = luna_sock_alloc(s, 64);
            assert!(!m.is_null());
            assert_eq!(luna_zbuf_mut_append(m, b"hello ".as_ptr().cast(), 6), 0);
            let p = luna_zbuf_mut_extend(m, 5);
            std::ptr::copy_nonoverlapping(b"world".as_ptr(), p, 5);
            r.push(format!("len={}", luna_zbuf_mut_len(m)));
            let big = vec![0u8; 1000];
            if luna_zbuf_mut_append(m, big.as_ptr().cast(), big.len()) == -1 {
                r.push(format!("append-errno={}", errno().0));
            }
            let z = luna_zbuf_freeze(m);
            let s5 = luna_zbuf_slice(z, 6, 5);
            let bytes = std::slice::from_raw_parts(luna_zbuf_data(s5), luna_zbuf_len(s5));
            r.push(String::from_utf8_lossy(bytes).into_owned());
            if luna_zbuf_slice(z, 6, 6).is_null() {
                r.push(format!("slice-errno={}", errno().0));
            }
            luna_zbuf_free(s5);
            luna_zbuf_free(z);
            // A socket that does not exist.
            if luna_sock_close(s, 12345) == -1 {
                r.push(format!("close-errno={}", errno().0));
            }
            if luna_sock_close(s, -1) == -1 {
                r.push(format!("negative-errno={}", errno().0));
            }
            luna_sock_request_stop(s);
        }
        *ZB_RESULT.lock().unwrap() = r;
    }
    run_batch_start(start);
    let r = ZB_RESULT.lock().unwrap().clone();
    assert_eq!(
        r,
        vec![
            "len=11".to_string(),
            format!("append-errno={}", libc::ENOBUFS),
            "world".into(),
            format!("slice-errno={}", libc::EINVAL),
            format!("close-errno={}", libc::EBADF),
            format!("negative-errno={}", libc::EBADF),
        ]
    );
}

/// A listener on `PORT` and nothing else (the connections stay open, idle).
extern "C" fn listen_only(ctx: *mut luna_ctx_t, _user: *mut c_void) {
    // SAFETY: ctx is this callback's context.
    assert_eq!(unsafe { luna_listen(ctx, PORT, 64, null_mut()) }, 0);
}

/// The poll-fairness client: two sockets, both registered for writability.
struct Fair {
    fds: [i32; 2],
    polls: usize,
    seen: [usize; 2],
    errors: Vec<String>,
}

extern "C" fn fair_poll(s: *mut luna_sockets_t, user: *mut c_void) {
    // SAFETY: `user` is the test's Fair, used only by this core's thread.
    let f = unsafe { &mut *(user as *mut Fair) };
    // SAFETY: `s` is this callback's socket API.
    unsafe {
        if f.fds[0] < 0 {
            let to = luna_addr_t {
                addr: u32::from(std::net::Ipv4Addr::new(198, 18, 0, 1)).to_be(),
                port: PORT,
                reserved: 0,
            };
            for i in 0..2 {
                f.fds[i] = luna_sock_socket(s);
                if luna_sock_connect(s, f.fds[i], &to) != -1 || errno().0 != libc::EINPROGRESS {
                    f.errors.push(format!("connect: {}", last_error()));
                }
                luna_sock_register(s, f.fds[i], LUNA_POLLOUT);
            }
            return;
        }
        // One event per call: an idle connection stays writable (level triggered), and
        // "ready sockets beyond max show up at the next call".
        let mut ev = [luna_poll_event_t::default(); 1];
        if f.polls >= 200 {
            return;
        }
        if luna_sock_poll(s, ev.as_mut_ptr(), 1) == 1 && ev[0].events & LUNA_POLLOUT != 0 {
            f.polls += 1;
            for i in 0..2 {
                if ev[0].fd == f.fds[i] {
                    f.seen[i] += 1;
                }
            }
        }
        if f.polls >= 200 {
            luna_sock_request_stop(s);
        }
    }
}

#[test]
fn poll_with_a_small_max_reports_every_ready_socket_in_turn() {
    let (a, b) = MemPair::build(&MemConfig::default()).expect("mem link");
    let senv = env_from_mem(&config("198.18.0.1"), vec![a]).expect("server env");
    let cenv = env_from_mem(&config("198.18.0.2"), vec![b]).expect("client env");
    let mut fair = Box::new(Fair {
        fds: [-1, -1],
        polls: 0,
        seen: [0, 0],
        errors: Vec::new(),
    });
    // SAFETY: the environments are live; ops and user outlive the runtimes.
    unsafe {
        let sops = luna_inline_ops_t {
            on_start: Some(listen_only),
            on_accept: None,
            on_connected: None,
            on_readable: None,
            on_writable: None,
            on_closed: None,
            on_poll: None,
            on_stop: None,
        };
        let srt = luna_run_inline(senv, &sops, null_mut());
        assert!(!srt.is_null(), "{}", last_error());
        let cops = luna_batch_ops_t {
            on_start: None,
            on_poll: Some(fair_poll),
            on_stop: None,
        };
        let crt = luna_run_batch(cenv, &cops, &mut *fair as *mut Fair as *mut c_void);
        assert!(!crt.is_null(), "{}", last_error());
        wait(crt, Duration::from_secs(30));
        assert_eq!(luna_runtime_join(crt), 0, "{}", last_error());
        assert_eq!(luna_runtime_stop(srt), 0);
        assert_eq!(luna_runtime_join(srt), 0, "{}", last_error());
        luna_runtime_free(srt);
        luna_runtime_free(crt);
        luna_env_free(senv);
        luna_env_free(cenv);
    }
    assert!(fair.errors.is_empty(), "{:?}", fair.errors);
    assert_eq!(fair.polls, 200);
    assert!(
        fair.seen[0] >= 90 && fair.seen[1] >= 90,
        "two always-writable sockets, one event per poll: seen {:?}",
        fair.seen
    );
}

/// What a callback got when it called the controlling thread's functions.
struct SelfJoin {
    rt: std::sync::atomic::AtomicPtr<luna_runtime_t>,
    got: Mutex<Option<(i32, i32, i32)>>,
}

extern "C" fn self_join_poll(s: *mut luna_sockets_t, user: *mut c_void) {
    // SAFETY: `user` is the test's SelfJoin, alive until the runtime is joined.
    let sj = unsafe { &*(user as *const SelfJoin) };
    let rt = sj.rt.load(Ordering::Acquire);
    if rt.is_null() || sj.got.lock().unwrap().is_some() {
        return;
    }
    // SAFETY: rt is live (the main thread frees it after joining); a core cannot join
    // itself: the call must be refused, not deadlock or take the runtime away.
    unsafe {
        let rc = luna_runtime_join(rt);
        let e = errno().0;
        let mut freed = 0;
        if rc == -1 && e == libc::EINVAL {
            luna_runtime_free(rt);
            freed = errno().0;
        }
        *sj.got.lock().unwrap() = Some((rc, e, freed));
        luna_sock_request_stop(s);
    }
}

#[test]
fn a_callback_cannot_join_or_free_its_own_runtime() {
    let (a, _b) = MemPair::build(&MemConfig::default()).expect("mem link");
    let env = env_from_mem(&config("198.18.0.1"), vec![a]).expect("env");
    let sj = Box::new(SelfJoin {
        rt: std::sync::atomic::AtomicPtr::new(null_mut()),
        got: Mutex::new(None),
    });
    // SAFETY: env is live; sj outlives the runtime.
    unsafe {
        let ops = luna_batch_ops_t {
            on_start: None,
            on_poll: Some(self_join_poll),
            on_stop: None,
        };
        let rt = luna_run_batch(env, &ops, &*sj as *const SelfJoin as *mut c_void);
        assert!(!rt.is_null(), "{}", last_error());
        sj.rt.store(rt, Ordering::Release);
        let end = Instant::now() + Duration::from_secs(10);
        while sj.got.lock().unwrap().is_none() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        let got = *sj.got.lock().unwrap();
        assert_eq!(
            got,
            Some((-1, libc::EINVAL, libc::EINVAL)),
            "join and free from a callback are refused"
        );
        assert_eq!(luna_runtime_join(rt), 0, "{}", last_error());
        let mut st = luna_core_stats_t::default();
        assert_eq!(
            luna_runtime_stats(rt, 0, &mut st, std::mem::size_of_val(&st)),
            0
        );
        assert_eq!(st.stopped, 1);
        luna_runtime_free(rt);
        luna_env_free(env);
    }
}

/// What the server's `luna_send_all` / `luna_send_copy` of buffers too large to ever be
/// taken whole returned: (rc, errno) each, then a buffer of the send buffer's size.
static BIG_SEND: Mutex<Vec<(i32, i32)>> = Mutex::new(Vec::new());

extern "C" fn big_accept(
    ctx: *mut luna_ctx_t,
    conn: luna_conn_t,
    _l: luna_listener_t,
    _user: *mut c_void,
) {
    let mut r = Vec::new();
    // SAFETY: ctx is this callback's context; handles freed once.
    unsafe {
        // The defaults: a 1 MiB send buffer and a 4 MiB backlog.
        for len in [6 << 20, 1 << 20] {
            let m = luna_ctx_alloc(ctx, len);
            assert!(!m.is_null(), "{}", last_error());
            luna_zbuf_mut_extend(m, len);
            let z = luna_zbuf_freeze(m);
            let rc = luna_send_all(ctx, conn, z);
            r.push((rc, if rc == 0 { 0 } else { errno().0 }));
            luna_zbuf_free(z);
        }
        let big = vec![0u8; 6 << 20];
        let rc = luna_send_copy(ctx, conn, big.as_ptr().cast(), big.len());
        r.push((rc, if rc == 0 { 0 } else { errno().0 }));
        luna_abort(ctx, conn);
    }
    *BIG_SEND.lock().unwrap() = r;
}

extern "C" fn connect_once(ctx: *mut luna_ctx_t, _user: *mut c_void) {
    let to = luna_addr_t {
        addr: u32::from(std::net::Ipv4Addr::new(198, 18, 0, 1)).to_be(),
        port: PORT,
        reserved: 0,
    };
    // SAFETY: ctx is this callback's context.
    assert_eq!(unsafe { luna_connect(ctx, &to, null_mut()) }, 0);
}

#[test]
fn send_all_of_a_buffer_that_can_never_be_taken_whole_is_emsgsize_not_eagain() {
    let (a, b) = MemPair::build(&MemConfig::default()).expect("mem link");
    let senv = env_from_mem(&config("198.18.0.1"), vec![a]).expect("server env");
    let cenv = env_from_mem(&config("198.18.0.2"), vec![b]).expect("client env");
    let none = luna_inline_ops_t {
        on_start: None,
        on_accept: None,
        on_connected: None,
        on_readable: None,
        on_writable: None,
        on_closed: None,
        on_poll: None,
        on_stop: None,
    };
    // SAFETY: the environments are live; ops outlive the runtimes.
    unsafe {
        let sops = luna_inline_ops_t {
            on_start: Some(listen_only),
            on_accept: Some(big_accept),
            ..none
        };
        let cops = luna_inline_ops_t {
            on_start: Some(connect_once),
            ..none
        };
        let srt = luna_run_inline(senv, &sops, null_mut());
        assert!(!srt.is_null(), "{}", last_error());
        let crt = luna_run_inline(cenv, &cops, null_mut());
        assert!(!crt.is_null(), "{}", last_error());
        let end = Instant::now() + Duration::from_secs(10);
        while BIG_SEND.lock().unwrap().is_empty() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        for rt in [srt, crt] {
            luna_runtime_stop(rt);
            assert_eq!(luna_runtime_join(rt), 0, "{}", last_error());
            luna_runtime_free(rt);
        }
        luna_env_free(senv);
        luna_env_free(cenv);
    }
    assert_eq!(
        *BIG_SEND.lock().unwrap(),
        vec![(-1, libc::EMSGSIZE), (0, 0), (-1, libc::EMSGSIZE)],
        "6 MiB is more than the send buffer and the backlog together: EAGAIN would be retried for ever"
    );
}

/// What `luna_sock_alloc` of sizes no heap has gave: (NULL?, errno) each.
static HUGE_ALLOC: Mutex<Vec<(bool, i32)>> = Mutex::new(Vec::new());

extern "C" fn huge_alloc_start(s: *mut luna_sockets_t, _u: *mut c_void) {
    let mut r = Vec::new();
    // SAFETY: `s` is this callback's API; a returned buffer is freed once.
    unsafe {
        for len in [1usize << 50, usize::MAX] {
            let m = luna_sock_alloc(s, len);
            r.push((m.is_null(), if m.is_null() { errno().0 } else { 0 }));
            luna_zbuf_mut_free(m);
        }
        let m = luna_sock_alloc(s, 0);
        r.push((m.is_null(), luna_zbuf_mut_tailroom(m) as i32));
        luna_zbuf_mut_free(m);
        luna_sock_request_stop(s);
    }
    *HUGE_ALLOC.lock().unwrap() = r;
}

#[test]
fn sock_alloc_of_more_than_memory_is_enobufs_not_an_abort() {
    run_batch_start(huge_alloc_start);
    assert_eq!(
        *HUGE_ALLOC.lock().unwrap(),
        vec![(true, libc::ENOBUFS), (true, libc::ENOBUFS), (false, 0)]
    );
}

/// Set by the test's watchdog: the callback stops the runtime itself.
static FALLBACK_STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Set when the main thread's join returned.
static JOINED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn stop_on_fallback(s: *mut luna_sockets_t, _u: *mut c_void) {
    if FALLBACK_STOP.load(Ordering::Relaxed) {
        // SAFETY: `s` is this callback's API.
        unsafe { luna_sock_request_stop(s) };
    }
}

struct SendPtr(*mut luna_runtime_t);
// SAFETY: the runtime's stop and stats functions are documented for any thread.
unsafe impl Send for SendPtr {}

#[test]
fn another_thread_stops_and_reads_the_runtime_while_the_main_thread_waits_in_join() {
    let (a, _b) = MemPair::build(&MemConfig::default()).expect("mem link");
    let env = env_from_mem(&config("198.18.0.1"), vec![a]).expect("env");
    // SAFETY: env is live; the runtime is freed after the helper thread is joined.
    unsafe {
        let ops = luna_batch_ops_t {
            on_start: None,
            on_poll: Some(stop_on_fallback),
            on_stop: None,
        };
        let rt = luna_run_batch(env, &ops, null_mut());
        assert!(!rt.is_null(), "{}", last_error());
        // The usual C shape: main blocks in join, a signal-handling thread stops.
        let p = SendPtr(rt);
        let helper = std::thread::spawn(move || {
            let p = p;
            std::thread::sleep(Duration::from_millis(200));
            let mut st = luna_core_stats_t::default();
            let stats = luna_runtime_stats(p.0, 0, &mut st, std::mem::size_of_val(&st));
            let stats_errno = if stats == 0 { 0 } else { errno().0 };
            let stop = luna_runtime_stop(p.0);
            let end = Instant::now() + Duration::from_secs(5);
            while !JOINED.load(Ordering::Relaxed) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(5));
            }
            FALLBACK_STOP.store(true, Ordering::Relaxed);
            (stats, stats_errno, stop, st.iterations > 0)
        });
        let t0 = Instant::now();
        assert_eq!(luna_runtime_join(rt), 0, "{}", last_error());
        let waited = t0.elapsed();
        JOINED.store(true, Ordering::Relaxed);
        let got = helper.join().unwrap();
        luna_runtime_free(rt);
        luna_env_free(env);
        assert_eq!(got, (0, 0, 0, true), "stats and stop during join");
        assert!(
            waited < Duration::from_secs(3),
            "luna_runtime_stop from another thread did not end the join: {waited:?}"
        );
    }
}

/// What `luna_sock_recv` with `len` 0 returned for a socket that does not exist and for
/// one that is not connected: (rc, errno) each.
static EMPTY_RECV: Mutex<Vec<(isize, i32)>> = Mutex::new(Vec::new());

extern "C" fn empty_recv_start(s: *mut luna_sockets_t, _u: *mut c_void) {
    let mut r = Vec::new();
    // SAFETY: `s` is this callback's API; no buffer is touched with `len` 0.
    unsafe {
        let fresh = luna_sock_socket(s);
        for sock in [12345, fresh] {
            let rc = luna_sock_recv(s, sock, null_mut(), 0);
            r.push((rc, if rc < 0 { errno().0 } else { 0 }));
        }
        luna_sock_close(s, fresh);
        luna_sock_request_stop(s);
    }
    *EMPTY_RECV.lock().unwrap() = r;
}

#[test]
fn an_empty_recv_on_a_socket_that_does_not_exist_is_ebadf_not_end_of_stream() {
    run_batch_start(empty_recv_start);
    assert_eq!(
        *EMPTY_RECV.lock().unwrap(),
        vec![(-1, libc::EBADF), (-1, libc::ENOTCONN)],
        "recv(fd, buf, 0) checks the socket as recv(2) does (0 reads as end of stream)"
    );
}

/// What the server's `on_closed` got from `luna_close` and `luna_abort` on the id it was
/// handed (valid until `on_closed` returns), and from a call after `luna_close`.
static CLOSE_IN_CLOSED: Mutex<Vec<(i32, i32)>> = Mutex::new(Vec::new());

extern "C" fn close_in_closed(
    ctx: *mut luna_ctx_t,
    conn: luna_conn_t,
    _reason: i32,
    _user: *mut c_void,
) {
    // SAFETY: ctx is this callback's context.
    unsafe {
        let user = luna_conn_set_user(ctx, conn, 0x5eed as *mut c_void);
        let close = luna_close(ctx, conn);
        let again = luna_abort(ctx, conn);
        CLOSE_IN_CLOSED
            .lock()
            .unwrap()
            .extend([(user, 0), (close, 0), (again, errno().0)]);
    }
}

/// The client's connection and when it connected (ns on the core clock).
static CONNECTED: Mutex<Option<(luna_conn_t, u64)>> = Mutex::new(None);

extern "C" fn note_connect(ctx: *mut luna_ctx_t, conn: luna_conn_t, _user: *mut c_void) {
    // SAFETY: ctx is this callback's context.
    *CONNECTED.lock().unwrap() = Some((conn, unsafe { luna_ctx_now_ns(ctx) }));
}

/// Resets the connection 20 ms after it connected (the server has accepted it by then).
extern "C" fn abort_later(ctx: *mut luna_ctx_t, _user: *mut c_void) {
    let mut c = CONNECTED.lock().unwrap();
    // SAFETY: ctx is this callback's context.
    unsafe {
        if let Some((conn, at)) = *c {
            if luna_ctx_now_ns(ctx) > at + 20_000_000 {
                luna_abort(ctx, conn);
                *c = None;
            }
        }
    }
}

#[test]
fn close_inside_on_closed_is_accepted_once_and_leaves_the_core_sound() {
    let (a, b) = MemPair::build(&MemConfig::default()).expect("mem link");
    let senv = env_from_mem(&config("198.18.0.1"), vec![a]).expect("server env");
    let cenv = env_from_mem(&config("198.18.0.2"), vec![b]).expect("client env");
    let none = luna_inline_ops_t {
        on_start: None,
        on_accept: None,
        on_connected: None,
        on_readable: None,
        on_writable: None,
        on_closed: None,
        on_poll: None,
        on_stop: None,
    };
    // SAFETY: the environments are live; ops outlive the runtimes.
    unsafe {
        let sops = luna_inline_ops_t {
            on_start: Some(listen_only),
            on_closed: Some(close_in_closed),
            ..none
        };
        let cops = luna_inline_ops_t {
            on_start: Some(connect_once),
            on_connected: Some(note_connect),
            on_poll: Some(abort_later),
            ..none
        };
        let srt = luna_run_inline(senv, &sops, null_mut());
        let crt = luna_run_inline(cenv, &cops, null_mut());
        assert!(!srt.is_null() && !crt.is_null(), "{}", last_error());
        let end = Instant::now() + Duration::from_secs(10);
        while CLOSE_IN_CLOSED.lock().unwrap().is_empty() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        let live = stats(srt);
        for rt in [srt, crt] {
            luna_runtime_stop(rt);
            assert_eq!(luna_runtime_join(rt), 0, "{}", last_error());
        }
        let fin = stats(srt);
        luna_runtime_free(srt);
        luna_runtime_free(crt);
        luna_env_free(senv);
        luna_env_free(cenv);
        assert_eq!(
            *CLOSE_IN_CLOSED.lock().unwrap(),
            vec![(0, 0), (0, 0), (-1, libc::EBADF)]
        );
        assert_eq!((live.accepted, live.closed), (1, 1));
        assert_eq!(live.open_connections, 0);
        assert_eq!((fin.closed, fin.shutdown_aborts), (1, 0));
    }
}

/// Connection ids the two server cores were given: (core, id).
static IDS_BY_CORE: Mutex<Vec<(i32, luna_conn_t)>> = Mutex::new(Vec::new());
/// Calls that took another core's id as one of their own.
static CROSS_CORE_HITS: AtomicUsize = AtomicUsize::new(0);
/// Cross-core calls made (each must be EBADF).
static CROSS_CORE_CALLS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn record_accept(
    ctx: *mut luna_ctx_t,
    conn: luna_conn_t,
    _l: luna_listener_t,
    _user: *mut c_void,
) {
    // SAFETY: ctx is this callback's context.
    let core = unsafe { luna_ctx_core(ctx) };
    IDS_BY_CORE.lock().unwrap().push((core, conn));
}

/// Uses every id of the other core as if it were this core's (the thread-rule slip the
/// README answers with EBADF).
extern "C" fn try_foreign_ids(ctx: *mut luna_ctx_t, _user: *mut c_void) {
    // SAFETY: ctx is this callback's context.
    let core = unsafe { luna_ctx_core(ctx) };
    let foreign: Vec<luna_conn_t> = IDS_BY_CORE
        .lock()
        .unwrap()
        .iter()
        .filter(|(c, _)| *c != core)
        .map(|&(_, id)| id)
        .collect();
    for id in foreign {
        CROSS_CORE_CALLS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        if unsafe { luna_send_capacity(ctx, id) } != -1 || errno().0 != libc::EBADF {
            CROSS_CORE_HITS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The client: opens eight connections from its one core.
extern "C" fn connect_eight(ctx: *mut luna_ctx_t, _user: *mut c_void) {
    let to = luna_addr_t {
        addr: u32::from(std::net::Ipv4Addr::new(198, 18, 0, 1)).to_be(),
        port: PORT,
        reserved: 0,
    };
    for _ in 0..8 {
        // SAFETY: ctx is this callback's context.
        assert_eq!(unsafe { luna_connect(ctx, &to, null_mut()) }, 0);
    }
}

#[test]
fn a_connection_id_of_one_core_is_ebadf_on_another() {
    let cfg = MemConfig {
        queues_a: 2,
        queues_b: 1,
        rss: true,
        ..MemConfig::default()
    };
    let (mut a, b) = MemPair::build(&cfg).expect("mem link");
    let a1 = a.pop().unwrap();
    let a0 = a.pop().unwrap();
    let scfg = config("198.18.0.1").replace("list = [0]", "list = [0, 1]");
    let senv = env_from_mem(&scfg, vec![vec![a0], vec![a1]]).expect("server env");
    let cenv = env_from_mem(&config("198.18.0.2"), vec![b]).expect("client env");
    let none = luna_inline_ops_t {
        on_start: None,
        on_accept: None,
        on_connected: None,
        on_readable: None,
        on_writable: None,
        on_closed: None,
        on_poll: None,
        on_stop: None,
    };
    // SAFETY: the environments are live; ops outlive the runtimes.
    unsafe {
        assert_eq!(luna_env_cores(senv), 2);
        let sops = luna_inline_ops_t {
            on_start: Some(listen_only),
            on_accept: Some(record_accept),
            on_poll: Some(try_foreign_ids),
            ..none
        };
        let cops = luna_inline_ops_t {
            on_start: Some(connect_eight),
            ..none
        };
        let srt = luna_run_inline(senv, &sops, null_mut());
        let crt = luna_run_inline(cenv, &cops, null_mut());
        assert!(!srt.is_null() && !crt.is_null(), "{}", last_error());
        let end = Instant::now() + Duration::from_secs(10);
        while IDS_BY_CORE.lock().unwrap().len() < 8 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        for rt in [crt, srt] {
            luna_runtime_stop(rt);
            assert_eq!(luna_runtime_join(rt), 0, "{}", last_error());
            luna_runtime_free(rt);
        }
        luna_env_free(senv);
        luna_env_free(cenv);
    }
    let ids = IDS_BY_CORE.lock().unwrap().clone();
    assert_eq!(ids.len(), 8, "{ids:?}");
    assert!(
        ids.iter().any(|&(c, _)| c == 0) && ids.iter().any(|&(c, _)| c == 1),
        "RSS spread the connections over both cores: {ids:x?}"
    );
    assert!(CROSS_CORE_CALLS.load(Ordering::Relaxed) > 0);
    assert_eq!(
        CROSS_CORE_HITS.load(Ordering::Relaxed),
        0,
        "another core's id reached one of this core's connections: {ids:x?}"
    );
}

/// What a core thread's signal mask blocked, seen from its `on_start`: (SIGUSR1, SIGTERM,
/// SIGSEGV).
static CORE_MASK: Mutex<Option<(bool, bool, bool)>> = Mutex::new(None);

fn blocked_here(sig: libc::c_int) -> bool {
    // SAFETY: plain data, filled by pthread_sigmask (no change asked for).
    let mut cur: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: reads this thread's mask into `cur`.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur) };
    // SAFETY: `cur` was filled above.
    unsafe { libc::sigismember(&cur, sig) == 1 }
}

extern "C" fn record_mask(s: *mut luna_sockets_t, _u: *mut c_void) {
    *CORE_MASK.lock().unwrap() = Some((
        blocked_here(libc::SIGUSR1),
        blocked_here(libc::SIGTERM),
        blocked_here(libc::SIGSEGV),
    ));
    // SAFETY: `s` is this callback's API.
    unsafe { luna_sock_request_stop(s) };
}

/// luna's core threads leave the application's asynchronous signals to its own threads
/// (a signal the application blocks to take with sigwait is not delivered to a core,
/// where its default action would end the process); a fault in luna's code is still a
/// fault (SIGSEGV unblocked); the controlling thread's mask is left as it was.
#[test]
fn cores_block_the_applications_asynchronous_signals() {
    assert!(!blocked_here(libc::SIGUSR1));
    run_batch_start(record_mask);
    assert_eq!(*CORE_MASK.lock().unwrap(), Some((true, true, false)));
    assert!(
        !blocked_here(libc::SIGUSR1),
        "the caller's mask is restored"
    );
}
