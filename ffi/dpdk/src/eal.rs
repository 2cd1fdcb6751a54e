//! EAL: initialise once per process, clean up when the last handle drops.

use std::ffi::{c_char, CString};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::{rte_errno, Error, ErrorKind, Result};
use crate::{ffi, log, preflight};

const UNINIT: u8 = 0;
const INITIALIZING: u8 = 1;
const ACTIVE: u8 = 2;
const FAILED: u8 = 3;
const CLEANED: u8 = 4;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// Mempools that could not be freed because mbufs were still out; while
/// non-zero, `rte_eal_cleanup` is skipped (it would unmap their memory).
pub(crate) static LEAKED_POOLS: AtomicUsize = AtomicUsize::new(0);

/// Handle to the initialised EAL. Cloning is cheap; `rte_eal_cleanup` runs
/// when the last clone (including those held by ports and mempools) drops.
///
/// `Eal` is `Send + Sync`: the handle carries no per-thread state.
#[derive(Clone)]
pub struct Eal {
    inner: Arc<EalInner>,
}

struct EalInner {
    args: Vec<String>,
    /// Warning/error lines DPDK logged during a successful init (e.g. a
    /// vdev whose probe failed: EAL carries on without that port).
    init_log: Vec<String>,
}

impl Drop for EalInner {
    fn drop(&mut self) {
        let leaked = LEAKED_POOLS.load(Ordering::SeqCst);
        if leaked != 0 {
            eprintln!(
                "dpdk-sys: skipping rte_eal_cleanup: {leaked} mempool(s) still had mbufs in use; \
                 their memory stays mapped until the process exits"
            );
        } else {
            match IntrHold::new(INTR_HOLD_WAIT) {
                // Cleanup would unmap memory the interrupt thread may still read.
                Err(e) => eprintln!(
                    "dpdk-sys: skipping rte_eal_cleanup: {e}; EAL memory stays mapped until \
                     the process exits"
                ),
                Ok(hold) => {
                    // Never released: the interrupt thread stays parked in our callback
                    // for good. rte_eal_cleanup wakes it (once any alarm was ever set,
                    // rte_eal_alarm_cleanup's unregister writes its rebuild pipe) and then
                    // unmaps EAL memory; rebuilding its epoll set, the thread reads every
                    // interrupt source's handle, and sources in EAL memory outlive their
                    // devices: DPDK 22.11 memif never unregisters its server's listener
                    // (memif_socket_remove_device only frees the handle), so the thread
                    // faulted in rte_intr_fd_get on the unmapped copy (core dumps; 7 of 10
                    // r2c memif loops once ports closed through alarms). Parked, it reads
                    // nothing.
                    std::mem::forget(hold);
                    let run_dir = runtime_dir();
                    // SAFETY: the last handle is gone, so no port, queue, mempool or
                    // flow of ours is left (each holds an Eal clone). EAL was
                    // initialised successfully (an EalInner exists only then).
                    unsafe {
                        ffi::rte_eal_cleanup();
                    }
                    // EAL leaves its (often empty) runtime directory behind; remove
                    // it if empty so runs with unique --file-prefix do not pile up.
                    if let Some(d) = run_dir {
                        let _ = std::fs::remove_dir(d);
                    }
                }
            }
        }
        STATE.store(CLEANED, Ordering::SeqCst);
    }
}

/// How long a hold of the interrupt thread waits for it (a callback already running,
/// e.g. memif's disconnect handling, must return first).
pub(crate) const INTR_HOLD_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The EAL interrupt thread parked in a callback of ours (shim
/// `dpdk_sys_intr_thread_hold`): while this lives, no PMD interrupt callback (e.g.
/// memif's control channel) and no `rte_eal_alarm` callback runs, so a teardown can
/// run on the calling thread without racing them. Made by
/// [`Eal::hold_interrupt_thread`]; released on drop, by the thread that made it (not
/// `Send`). Holds are one at a time process-wide: a second waits for the first's
/// release. Made on the interrupt thread itself, it holds nothing (that thread's own
/// callbacks are already serialised). Do not wait for a DPDK callback while holding
/// one: it cannot run.
pub struct IntrHold {
    parked: bool,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl IntrHold {
    /// Parks the interrupt thread, waiting up to `wait` for it. EAL must be initialised
    /// (callers hold an `Eal`, or are its last handle's drop).
    pub(crate) fn new(wait: std::time::Duration) -> Result<IntrHold> {
        let us = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
        // SAFETY: EAL is initialised (see above); the shim registers an interrupt
        // source of its own once and waits on its own mutex and condition variable.
        let ret = unsafe { ffi::dpdk_sys_intr_thread_hold(us) };
        match ret {
            0 | 1 => Ok(IntrHold {
                parked: ret == 0,
                _not_send: std::marker::PhantomData,
            }),
            e if e == -libc::ETIMEDOUT => Err(Error::new(
                ErrorKind::Timeout,
                "hold the EAL interrupt thread",
                format!("it did not come within {wait:?} (stuck in a callback)"),
            )),
            e => Err(Error::dpdk(
                ErrorKind::InvalidArgument,
                "hold the EAL interrupt thread",
                e,
            )),
        }
    }
}

impl Drop for IntrHold {
    fn drop(&mut self) {
        if self.parked {
            // SAFETY: this thread holds the interrupt thread (hold returned 0 here, and
            // IntrHold is not Send).
            unsafe { ffi::dpdk_sys_intr_thread_release() };
        }
    }
}

/// Builder for EAL initialisation.
#[derive(Debug, Clone)]
pub struct EalBuilder {
    args: Vec<String>,
    preflight: bool,
    log_to_stderr: bool,
}

impl Default for EalBuilder {
    fn default() -> Self {
        EalBuilder {
            args: Vec::new(),
            preflight: true,
            log_to_stderr: true,
        }
    }
}

impl EalBuilder {
    /// Adds one EAL argument (e.g. `--no-pci`, `--vdev=net_memif0`).
    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(a.into());
        self
    }

    /// Adds EAL arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Whether to run the hugepage preflight before `rte_eal_init` (default on).
    pub fn preflight(mut self, on: bool) -> Self {
        self.preflight = on;
        self
    }

    /// Whether DPDK's log also goes to stderr (default on). The recent
    /// error lines are captured for [`Error`] either way.
    pub fn log_to_stderr(mut self, on: bool) -> Self {
        self.log_to_stderr = on;
        self
    }

    /// Initialises EAL. Fails cleanly (never UB) if called a second time in
    /// the process, even after the first handle was dropped: DPDK cannot
    /// re-initialise.
    pub fn init(self) -> Result<Eal> {
        if let Err(prev) =
            STATE.compare_exchange(UNINIT, INITIALIZING, Ordering::SeqCst, Ordering::SeqCst)
        {
            let cause = match prev {
                ACTIVE | INITIALIZING => "EAL is already initialised in this process",
                FAILED => "an earlier rte_eal_init in this process failed and DPDK cannot retry",
                _ => "EAL was initialised and cleaned up already; DPDK cannot initialise twice",
            };
            return Err(
                Error::new(ErrorKind::AlreadyInitialized, "EAL init", cause).with_fix(
                    "EAL initialises once per process: share the existing `Eal` (it is Clone), \
                 or run each EAL instance as its own process with its own --file-prefix",
                ),
            );
        }
        match self.init_inner() {
            Ok(eal) => {
                STATE.store(ACTIVE, Ordering::SeqCst);
                Ok(eal)
            }
            Err(e) => {
                // Preflight and tap-claim failures never reached rte_eal_init: a retry is fine.
                let next = if matches!(e.kind(), ErrorKind::Preflight | ErrorKind::InterfaceBusy) {
                    UNINIT
                } else {
                    FAILED
                };
                STATE.store(next, Ordering::SeqCst);
                Err(e)
            }
        }
    }

    fn init_inner(self) -> Result<Eal> {
        if self.preflight {
            preflight::check(&self.args, &preflight::HugeEnv::probe(&self.args))?;
        }
        // Before rte_eal_init probes the vdevs: opening a tap another process has
        // open would take the interface over.
        crate::tapclaim::claim(&self.args)?;
        log::set_forward_to_stderr(self.log_to_stderr);
        log::install();
        log::clear();

        let mut argv_owned = Vec::with_capacity(self.args.len() + 1);
        argv_owned.push(CString::new("dpdk-sys").expect("no NUL in literal"));
        for a in &self.args {
            argv_owned.push(CString::new(a.as_bytes()).map_err(|_| {
                Error::new(
                    ErrorKind::InvalidArgument,
                    "EAL init",
                    format!("argument {a:?} contains a NUL byte"),
                )
            })?);
        }
        // EAL may keep pointers into argv (getopt permutes it, some options
        // are stored unduplicated), so argv lives for the whole process.
        let argv_owned: &'static [CString] = Box::leak(argv_owned.into_boxed_slice());
        let argv: &'static mut [*mut c_char] = Box::leak(
            argv_owned
                .iter()
                .map(|c| c.as_ptr() as *mut c_char)
                .collect(),
        );
        let argc = argv.len() as i32;
        // SAFETY: argv holds argc valid NUL-terminated strings that outlive
        // the process; STATE guarantees this is the only call in the process.
        let ret = unsafe { ffi::rte_eal_init(argc, argv.as_mut_ptr()) };
        // EAL prints usage with C stdio; flush it so it does not interleave
        // with Rust's output later.
        // SAFETY: fflush(NULL) flushes all C output streams; no preconditions.
        unsafe { libc::fflush(std::ptr::null_mut()) };
        if ret < 0 {
            return Err(diagnose_init_failure(&self.args, rte_errno()));
        }
        Ok(Eal {
            inner: Arc::new(EalInner {
                args: self.args,
                init_log: log::take_errors(),
            }),
        })
    }
}

/// Long options EAL 22.11/23.11 accepts, used only to name an unknown one.
const KNOWN_LONG: &[&str] = &[
    "allow",
    "base-virtaddr",
    "block",
    "create-uio-dev",
    "file-prefix",
    "force-max-simd-bitwidth",
    "help",
    "huge-dir",
    "huge-unlink",
    "huge-worker-stack",
    "in-memory",
    "iova-mode",
    "lcores",
    "legacy-mem",
    "log-level",
    "log-timestamp",
    "log-color",
    "main-lcore",
    "match-allocations",
    "mbuf-pool-ops-name",
    "no-hpet",
    "no-huge",
    "no-pci",
    "no-shconf",
    "no-telemetry",
    "proc-type",
    "service-corelist",
    "service-coremask",
    "single-file-segments",
    "socket-limit",
    "socket-mem",
    "syslog",
    "telemetry",
    "trace",
    "trace-bufsz",
    "trace-dir",
    "trace-mode",
    "vdev",
    "vfio-intr",
    "vfio-vf-token",
    "vmware-tsc-map",
    "version",
    "pci-whitelist",
    "pci-blacklist",
    "driver-path",
];

fn unknown_options(args: &[String]) -> Vec<String> {
    args.iter()
        .filter_map(|a| a.strip_prefix("--"))
        .map(|a| a.split('=').next().unwrap_or(a))
        .filter(|a| !a.is_empty() && !KNOWN_LONG.contains(a))
        .map(|a| format!("--{a}"))
        .collect()
}

fn runtime_dir() -> Option<std::path::PathBuf> {
    // SAFETY: EAL is initialised; returns a pointer to a static NUL-terminated path.
    let p = unsafe { ffi::rte_eal_get_runtime_dir() };
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null NUL-terminated string owned by EAL, copied at once.
    let s = unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned();
    (!s.is_empty()).then(|| s.into())
}

/// net PMDs present as plugins in the driver directory (`librte_net_X.so`).
pub fn available_net_pmds() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(pmd_dir())
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.strip_prefix("librte_net_")
                        .and_then(|s| s.strip_suffix(".so"))
                        .map(|s| format!("net_{s}"))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The `--file-prefix` in `args` (EAL's default is `rte`).
fn file_prefix(args: &[String]) -> String {
    let mut it = args.iter();
    let mut prefix = "rte".to_string();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix("--file-prefix=") {
            prefix = v.to_owned();
        } else if a == "--file-prefix" {
            if let Some(v) = it.next() {
                prefix = v.clone();
            }
        }
    }
    prefix
}

/// The pid holding EAL's write lock on `config` (EAL locks it with fcntl).
fn config_lock_holder(config: &std::path::Path) -> Option<i32> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(config).ok()?;
    // SAFETY: all-zero is a valid `struct flock`.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: `f` is an open fd for the call; `fl` is a valid flock that F_GETLK fills in.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut fl) };
    (r == 0 && fl.l_type != libc::F_UNLCK as libc::c_short && fl.l_pid > 0).then_some(fl.l_pid)
}

/// `" <comm>"` of a process, or empty if it cannot be read.
pub(crate) fn comm_of(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| format!(", {}", c.trim()))
        .unwrap_or_default()
}

fn diagnose_init_failure(args: &[String], errno: i32) -> Error {
    let err = Error::dpdk(ErrorKind::EalInit, "EAL init (rte_eal_init)", errno);
    let joined = err.dpdk_log().join("\n");
    let vdevs: Vec<String> = args
        .iter()
        .enumerate()
        .filter_map(|(i, a)| {
            a.strip_prefix("--vdev=")
                .map(str::to_owned)
                .or_else(|| (a == "--vdev").then(|| args.get(i + 1).cloned()).flatten())
        })
        .collect();
    // rte_eal_init returns -1 without setting rte_errno when the shared config
    // of the file prefix is locked by another primary process.
    if joined.contains("Cannot create lock on") || joined.contains("another primary process") {
        let prefix = file_prefix(args);
        let config = runtime_dir()
            .unwrap_or_else(|| format!("/var/run/dpdk/{prefix}").into())
            .join("config");
        let holder = match config_lock_holder(&config) {
            Some(pid) => format!(" (pid {pid}{})", comm_of(pid)),
            None => String::new(),
        };
        return err
            .with_cause(format!(
                "another DPDK process{holder} is using file prefix {prefix} (its lock on {} is held)",
                config.display()
            ))
            .with_fix(
                "stop it or choose another --file-prefix for this process (each primary DPDK process needs its own)",
            );
    }
    let unknown = unknown_options(args);
    if errno == libc::EINVAL && !unknown.is_empty() {
        let cause = format!(
            "invalid EAL arguments: unknown option {}",
            unknown.join(", ")
        );
        return err
            .with_cause(cause)
            .with_fix("remove or correct it; EAL options are listed by `dpdk-testpmd --help` or the DPDK EAL guide");
    }
    if errno == libc::EINVAL {
        return err
            .with_cause("invalid EAL arguments (see the DPDK log lines below)")
            .with_fix("check the option values passed to EAL");
    }
    let names: Vec<&str> = vdevs
        .iter()
        .map(|v| v.split(',').next().unwrap_or(v))
        .collect();
    if errno == libc::ENODEV && joined.contains("parse device") {
        return err
            .with_cause(format!(
                "unknown device in --vdev {} (no driver matches the name)",
                names.join(", ")
            ))
            .with_fix(format!(
                "vdev names are <driver><n>, e.g. net_memif0; net PMDs installed in {}: {}",
                pmd_dir(),
                available_net_pmds().join(", ")
            ));
    }
    if errno == libc::ENOTSUP && (joined.contains("probe") || !vdevs.is_empty()) {
        return err
            .with_cause(format!(
                "probing devices failed (--vdev {})",
                names.join(", ")
            ))
            .with_fix(format!(
                "check the vdev driver name and its arguments; net PMDs installed in {}: {}",
                pmd_dir(),
                available_net_pmds().join(", ")
            ));
    }
    if errno == libc::EACCES || errno == libc::ENOMEM || joined.contains("hugepage") {
        return err.with_fix(
            "EAL could not get hugepage memory: check HugePages_Free in /proc/meminfo, the hugetlbfs \
             mount and that you run as root (`make setup` reserves and mounts them)",
        );
    }
    if errno == libc::EALREADY {
        return err.with_fix("EAL initialises once per process");
    }
    err.with_fix("see the DPDK log lines below; run with --log-level=eal:debug for more")
}

impl Eal {
    /// Parks the EAL interrupt thread until the returned guard drops (see
    /// [`IntrHold`]), waiting up to `wait` for a callback that is running to return.
    /// dpdk-sys does this itself around a memif port's stop and close and before
    /// `rte_eal_cleanup`.
    pub fn hold_interrupt_thread(&self, wait: std::time::Duration) -> Result<IntrHold> {
        IntrHold::new(wait)
    }

    /// Starts building an EAL initialisation.
    pub fn builder() -> EalBuilder {
        EalBuilder::default()
    }

    /// Initialises EAL with `args` (without `argv[0]`) and the default checks.
    pub fn init<I, S>(args: I) -> Result<Eal>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Eal::builder().args(args).init()
    }

    /// The EAL arguments this process was initialised with.
    pub fn args(&self) -> &[String] {
        &self.inner.args
    }

    /// Warning/error lines DPDK logged during init (init succeeded anyway).
    pub fn init_log(&self) -> &[String] {
        &self.inner.init_log
    }

    /// TSC ticks per second.
    pub fn tsc_hz(&self) -> u64 {
        // SAFETY: EAL is initialised (self exists); reads a calibrated value.
        unsafe { ffi::rte_get_tsc_hz() }
    }

    /// Makes the calling thread an lcore, if it is not one already (EAL threads and
    /// threads registered before keep their id): it gets an lcore id and, with it, a
    /// per-lcore cache in every mempool, so its mbuf allocations and frees stay off the
    /// pools' shared rings (without one, each is a compare-and-swap on the ring: 11% of a
    /// message-mode I/O core's time at 5,000 connections, docs/benchmarks.md). Returns
    /// the lcore id.
    ///
    /// The registration lasts as long as the thread: when it exits, its caches are
    /// flushed back to their pools and the id is released (`rte_thread_unregister`), so
    /// threads that come and go do not use up the `RTE_MAX_LCORE` ids or strand mbufs in
    /// a cache nobody owns. Registering turns DPDK's multi-process channel off (DPDK
    /// refuses to register threads in a process that has a secondary attached).
    pub fn register_thread(&self) -> Result<u32> {
        if let Some(id) = lcore_id() {
            return Ok(id);
        }
        // SAFETY: EAL is initialised; registers the current thread only.
        let ret = unsafe { ffi::rte_thread_register() };
        if ret < 0 {
            return Err(Error::dpdk(
                ErrorKind::InvalidArgument,
                "register thread as lcore",
                rte_errno(),
            )
            .with_fix(
                "all RTE_MAX_LCORE lcore ids are in use (unregister threads or pass fewer -l \
                 cores), or a secondary process uses this EAL",
            ));
        }
        let registered = Registered { _eal: self.clone() };
        // The slot is empty (the thread had no id). On a thread already tearing down its
        // thread-locals the closure is dropped uncalled, and with it `registered`: the id
        // is released at once rather than never.
        let _ = REGISTERED.try_with(move |r| *r.borrow_mut() = Some(registered));
        Ok(lcore_id().unwrap_or(u32::MAX))
    }
}

/// An lcore registration made by [`Eal::register_thread`], released at thread exit.
struct Registered {
    /// Keeps the EAL up until the id is released.
    _eal: Eal,
}

impl Drop for Registered {
    fn drop(&mut self) {
        // SAFETY: thread-local destructor (or the failed store above) on the thread that
        // registered; the EAL is up (`_eal`). The flush walks the mempool list under
        // DPDK's lock and moves this lcore's cached objects back to their rings; then the
        // id is released for reuse.
        unsafe {
            ffi::dpdk_sys_flush_lcore_caches();
            ffi::rte_thread_unregister();
        }
    }
}

thread_local! {
    static REGISTERED: std::cell::RefCell<Option<Registered>> =
        const { std::cell::RefCell::new(None) };
}

/// The lcore id of the calling thread, `None` for a non-EAL thread.
pub fn lcore_id() -> Option<u32> {
    // SAFETY: reads a thread-local through the shim; no preconditions.
    let id = unsafe { ffi::dpdk_sys_lcore_id() };
    (id != ffi::LCORE_ID_ANY).then_some(id)
}

/// Reads the TSC (cycle counter).
pub fn rdtsc() -> u64 {
    // SAFETY: executes rdtsc through the shim; no preconditions.
    unsafe { ffi::dpdk_sys_rdtsc() }
}

/// The directory this DPDK build loads PMD plugins from (RTE_EAL_PMD_PATH).
pub fn pmd_dir() -> &'static str {
    let b: &'static [u8] = ffi::RTE_EAL_PMD_PATH;
    std::str::from_utf8(b.strip_suffix(&[0]).unwrap_or(b)).unwrap_or("")
}

/// DPDK's version string, e.g. `DPDK 22.11.11`.
pub fn version() -> String {
    // SAFETY: rte_version returns a static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(ffi::dpdk_sys_version()) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_option_is_named() {
        let args: Vec<String> = [
            "--no-pci",
            "--bogus-flag",
            "--vdev=net_null0",
            "--file-prefix=x",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(unknown_options(&args), vec!["--bogus-flag".to_string()]);
    }

    #[test]
    fn file_prefix_in_both_spellings_and_default() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(file_prefix(&v(&["--file-prefix=a1"])), "a1");
        assert_eq!(file_prefix(&v(&["--no-pci", "--file-prefix", "b2"])), "b2");
        assert_eq!(file_prefix(&v(&["--no-pci"])), "rte");
    }

    #[test]
    fn pmd_dir_is_a_path() {
        assert!(pmd_dir().starts_with('/'), "{}", pmd_dir());
    }
}
