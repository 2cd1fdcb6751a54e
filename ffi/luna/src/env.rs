//! `luna_init`: configuration, EAL, zbuf slab and device bring-up, as r2c does it; and
//! the runtime handle (`luna_run_inline` / `luna_run_batch`, stop, join, free).

use crate::error::{guard, null, Fail, Res};
use dpdk_sys::{Eal, ErrorKind};
use r2c::config::{Config, DeviceKind};
use r2c::device::dpdk::{memif_quiesce, port_name_from_vdev, DpdkDevice, DpdkDeviceConfig};
use r2c::device::mem::MemDevice;
use r2c::device::Device;
use r2c::{CoreOptions, CoreSetup, CoreStats, ReleaseHook, Runtime, StatsReader, StopHandle};
use std::cell::Cell;
use std::ffi::{c_char, c_int, CStr};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;
use zbuf::dpdk::DmaRegistry;
use zbuf::{Slab, SlabConfig};

/// Memory the zbuf slab may map (application buffers; received frames live in the
/// receive pool's zones, which the slab also holds).
const SLAB_MEMORY: usize = 128 << 20;
/// How long a memif side waits for its peer to stop polling before closing its port.
const QUIESCE_WAIT: Duration = Duration::from_secs(5);

/// The cores' queues, by device kind.
pub(crate) enum Cores {
    Dpdk(Vec<CoreSetup<DpdkDevice>>),
    Mem(Vec<CoreSetup<MemDevice>>),
}

/// An initialised luna: configuration, EAL, buffers and devices, ready to run once.
/// Opaque to C; made by [`luna_init`], freed by [`luna_env_free`].
pub struct luna_env_t {
    pub(crate) cores: Option<Cores>,
    pub(crate) n_cores: usize,
    pub(crate) opts: CoreOptions,
    /// Kept alive while any runtime started from this environment runs.
    pub(crate) keep: Keep,
}

/// What must outlive the cores: the EAL, the slab and the DMA registry.
#[derive(Clone, Default)]
pub(crate) struct Keep {
    _eal: Option<Eal>,
    _slab: Option<Slab>,
    _registry: Option<DmaRegistry>,
}

thread_local! {
    /// Set on a core's thread when it first calls the application.
    static ON_CORE: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as a core's (before each application callback).
pub(crate) fn on_core() {
    ON_CORE.with(|c| c.set(true));
}

/// `EINVAL` on a core's thread: `what` belongs to the controlling thread (a core cannot
/// join or free the runtime it runs in: joining itself deadlocked or panicked and lost
/// the runtime's threads; freeing it freed what the core was running on).
fn controlling(what: &str) -> Res<()> {
    if ON_CORE.with(Cell::get) {
        return Err(Fail::new(
            libc::EINVAL,
            format!("{what} is for the controlling thread, not a core's callback"),
        ));
    }
    Ok(())
}

fn dpdk_fail(what: &str, e: &dpdk_sys::Error) -> Fail {
    let errno = match e.kind() {
        ErrorKind::AlreadyInitialized => libc::EALREADY,
        ErrorKind::Preflight => libc::ENOMEM,
        ErrorKind::PortNotFound => libc::ENODEV,
        ErrorKind::PortBusy | ErrorKind::InterfaceBusy => libc::EBUSY,
        ErrorKind::InvalidArgument => libc::EINVAL,
        ErrorKind::Timeout => libc::ETIMEDOUT,
        _ => libc::EIO,
    };
    Fail::new(errno, format!("{what}: {e}"))
}

fn config_fail(e: r2c::config::ConfigError) -> Fail {
    let errno = if e.key == "<file>" {
        libc::ENOENT
    } else {
        libc::EINVAL
    };
    Fail::new(errno, e.to_string())
}

/// `key=value` overrides from C strings.
///
/// # Safety
/// `list` points to `n` C strings (or is NULL with `n == 0`).
unsafe fn overrides(list: *const *const c_char, n: usize) -> Res<Vec<(String, String)>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if list.is_null() {
        return Err(null("overrides"));
    }
    // SAFETY: the caller passes `n` valid pointers at `list`.
    let items = unsafe { std::slice::from_raw_parts(list, n) };
    items
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            if p.is_null() {
                return Err(null(&format!("overrides[{i}]")));
            }
            // SAFETY: each entry is a NUL-terminated string (caller's contract).
            let s = unsafe { CStr::from_ptr(p) }
                .to_str()
                .map_err(|_| Fail::new(libc::EINVAL, format!("overrides[{i}] is not UTF-8")))?;
            let (k, v) = s.split_once('=').ok_or_else(|| {
                Fail::new(
                    libc::EINVAL,
                    format!("overrides[{i}] {s:?} is not KEY=VALUE (e.g. net.ip=198.18.0.2)"),
                )
            })?;
            Ok((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

/// The `--vdev` argument of an EAL argument list.
fn vdev_of(eal: &[String]) -> Option<&str> {
    let mut it = eal.iter();
    while let Some(a) = it.next() {
        if a == "--vdev" {
            return it.next().map(String::as_str);
        }
        if let Some(v) = a.strip_prefix("--vdev=") {
            return Some(v);
        }
    }
    None
}

/// memif: both processes must stop polling before either closes its port (see
/// `r2c::device::dpdk::memif_quiesce`). The last core to stop meets the peer.
fn memif_hook(vdev: &str, cores: usize) -> Option<ReleaseHook> {
    if !vdev.starts_with("net_memif") || !vdev.contains("socket=") {
        return None;
    }
    let vdev = vdev.to_string();
    let stopped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    Some(ReleaseHook(Arc::new(move |_core| {
        use std::sync::atomic::Ordering;
        if stopped.fetch_add(1, Ordering::AcqRel) + 1 == cores {
            let _ = memif_quiesce(&vdev, QUIESCE_WAIT);
        }
    })))
}

/// Splits `devs` (core-major) into one set of `per_core` queues per core.
fn per_core<D>(devs: Vec<D>, per_core: usize) -> Vec<Vec<D>> {
    let mut out: Vec<Vec<D>> = Vec::new();
    for (i, d) in devs.into_iter().enumerate() {
        if i % per_core == 0 {
            out.push(Vec::new());
        }
        if let Some(last) = out.last_mut() {
            last.push(d);
        }
    }
    out
}

/// Core setups from the config, with each stack taking its device's checksum caps.
fn setups<D: Device>(cfg: &Config, devs: Vec<Vec<D>>) -> Res<Vec<CoreSetup<D>>> {
    let mut s = cfg.core_setups(devs).map_err(config_fail)?;
    for c in &mut s {
        if let Some(d) = c.devices.first() {
            c.stack.caps = d.caps();
        }
    }
    Ok(s)
}

fn init_dpdk(cfg: Config, port: &str) -> Res<luna_env_t> {
    // DPDK's threads (EAL's interrupt and multi-process threads) leave the application's
    // signals to its own threads (`dpdk_sys::tapsignal::AsyncSignalsBlocked`).
    let _signals = dpdk_sys::tapsignal::AsyncSignalsBlocked::now();
    let eal = Eal::builder()
        .args(cfg.eal.iter().cloned())
        .log_to_stderr(true)
        .init()
        .map_err(|e| dpdk_fail("EAL init", &e))?;
    let registry = DmaRegistry::new(&eal);
    let slab = Slab::new(registry.slab_config(SlabConfig::new().max_memory(SLAB_MEMORY)))
        .map_err(|e| Fail::new(libc::ENOMEM, format!("zbuf slab: {e}")))?;
    let mut dc = DpdkDeviceConfig::new(port);
    let q = cfg.queues_per_core as usize;
    let total = cfg.cores.len() * q;
    dc.queues = u16::try_from(total)
        .map_err(|_| Fail::new(libc::EINVAL, format!("{total} queues are too many")))?;
    dc.rx_mbufs = 16383u32.max(2048 * u32::from(dc.queues) + 8192);
    dc.pool_prefix = "luna".into();
    dc.tx_copy_max = cfg.tx_copy_max;
    let devs = DpdkDevice::open_all(&eal, &slab, &registry, &dc).map_err(|e| {
        let errno = match &e {
            r2c::device::dpdk::DeviceError::Dpdk(d) => dpdk_fail("", d).errno,
            r2c::device::dpdk::DeviceError::Config(_) => libc::EINVAL,
            _ => libc::ENODEV,
        };
        Fail::new(errno, format!("open {port}: {e}"))
    })?;
    let cores = setups(&cfg, per_core(devs, q))?;
    let mut opts = cfg.options.clone();
    opts.slab = Some(slab.clone());
    if let Some(v) = vdev_of(&cfg.eal).filter(|v| port_name_from_vdev(v) == Some(port)) {
        opts.before_release = memif_hook(v, cores.len());
    }
    Ok(luna_env_t {
        n_cores: cores.len(),
        cores: Some(Cores::Dpdk(cores)),
        opts,
        keep: Keep {
            _eal: Some(eal),
            _slab: Some(slab),
            _registry: Some(registry),
        },
    })
}

/// Rust-side constructor for tests and embedders without DPDK: an environment over
/// in-memory devices (`r2c::device::mem`), one `Vec` of queues per core of `config`
/// (its `[device] kind` must be `"mem"`). Free the result with [`luna_env_free`].
pub fn env_from_mem(config: &str, devices: Vec<Vec<MemDevice>>) -> Result<*mut luna_env_t, String> {
    let cfg = Config::parse(config).map_err(|e| e.to_string())?;
    if cfg.device != DeviceKind::Mem {
        return Err("env_from_mem needs [device] kind = \"mem\"".into());
    }
    let cores = setups(&cfg, devices).map_err(|f| f.msg)?;
    Ok(Box::into_raw(Box::new(luna_env_t {
        n_cores: cores.len(),
        cores: Some(Cores::Mem(cores)),
        opts: cfg.options.clone(),
        keep: Keep::default(),
    })))
}

/// Initialises luna from a TOML configuration file (r2c's format, the one r2c and knb
/// take; `NULL` = an empty file, all defaults) plus `n_overrides` `"key=value"` strings
/// (dotted keys, TOML values: `"net.ip=198.18.0.2"`, `"cores.list=[1]"`; they win over
/// the file). Starts the DPDK EAL with the config's `eal` arguments, maps the zbuf slab,
/// opens `[device] port` with one queue pair per core and waits for its link.
///
/// Returns the environment, or NULL with errno: `EINVAL` (bad config or argument; the
/// key and the fix are in [`crate::luna_last_error`]), `ENOENT` (no such file), `ENOTSUP`
/// (`kind = "mem"`, an in-memory device only Rust tests can pair), `EALREADY` (the EAL
/// was initialised before in this process), `ENOMEM` (hugepages), `ENODEV` (no such
/// port), `EBUSY` (port in use), `ETIMEDOUT` (link down), `EIO` (other DPDK failure).
///
/// # Safety
/// `config_path` is NULL or a NUL-terminated path; `overrides` holds `n_overrides`
/// NUL-terminated strings (or is NULL when `n_overrides` is 0).
#[no_mangle]
pub unsafe extern "C" fn luna_init(
    config_path: *const c_char,
    overrides: *const *const c_char,
    n_overrides: usize,
) -> *mut luna_env_t {
    guard(std::ptr::null_mut(), || {
        controlling("luna_init")?;
        // SAFETY: forwarded caller contract.
        let o = unsafe { self::overrides(overrides, n_overrides) }?;
        let cfg = if config_path.is_null() {
            Config::parse_with_overrides("", &o)
        } else {
            // SAFETY: a non-NULL path is NUL-terminated (caller's contract).
            let p = unsafe { CStr::from_ptr(config_path) }
                .to_str()
                .map_err(|_| Fail::new(libc::EINVAL, "config path is not UTF-8"))?;
            Config::load(Path::new(p), &o)
        }
        .map_err(config_fail)?;
        let env = match cfg.device.clone() {
            DeviceKind::Dpdk { port } => init_dpdk(cfg, &port)?,
            DeviceKind::Mem => {
                return Err(Fail::new(
                    libc::ENOTSUP,
                    "[device] kind = \"mem\" is an in-process test link: use kind = \"dpdk\"",
                ))
            }
        };
        Ok(Box::into_raw(Box::new(env)))
    })
}

/// Number of cores (run-loop threads) the environment runs; -1 with `EINVAL` for NULL.
///
/// # Safety
/// `env` is NULL or a live environment from [`luna_init`].
#[no_mangle]
pub unsafe extern "C" fn luna_env_cores(env: *const luna_env_t) -> c_int {
    guard(-1, || {
        // SAFETY: NULL or live (caller's contract).
        let env = unsafe { env.as_ref() }.ok_or_else(|| null("env"))?;
        Ok(env.n_cores as c_int)
    })
}

/// Frees an environment (NULL is a no-op). A runtime started from it keeps what it
/// needs alive, so the order of `luna_env_free` and `luna_runtime_free` does not matter.
/// Called from a core's callback it frees nothing and sets errno to `EINVAL`.
///
/// # Safety
/// `env` is NULL or a live environment, not used again after this call.
#[no_mangle]
pub unsafe extern "C" fn luna_env_free(env: *mut luna_env_t) {
    guard((), || {
        if !env.is_null() {
            controlling("luna_env_free")?;
            // SAFETY: made by Box::into_raw in luna_init / env_from_mem, freed once.
            drop(unsafe { Box::from_raw(env) });
        }
        Ok(())
    })
}

/// Running (or joined) cores. Opaque to C; made by `luna_run_inline` /
/// `luna_run_batch`, freed by [`luna_runtime_free`].
///
/// Stop, finished and stats are for any thread, also while the controlling thread waits
/// in `luna_runtime_join`: they go through the stop flag and the stats readers, never
/// through the `Runtime` that `join` takes out of the lock.
pub struct luna_runtime_t {
    /// The cores until `luna_runtime_join` takes them.
    rt: Mutex<Option<Runtime>>,
    stop: StopHandle,
    readers: Vec<StatsReader>,
    /// Final counters once joined.
    final_stats: OnceLock<Vec<CoreStats>>,
    cores: usize,
    _keep: Keep,
}

impl luna_runtime_t {
    fn run(&self) -> MutexGuard<'_, Option<Runtime>> {
        self.rt.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Starts the environment's cores with `spawn`; the environment's devices are used up.
pub(crate) fn start(
    env: *mut luna_env_t,
    spawn: impl FnOnce(Cores, CoreOptions) -> Result<Runtime, r2c::RuntimeError>,
) -> Res<*mut luna_runtime_t> {
    controlling("luna_run_*")?;
    // The cores leave the application's signals to its own threads (a net_tap core
    // unblocks the tap's receive signal it takes).
    let _signals = dpdk_sys::tapsignal::AsyncSignalsBlocked::now();
    // SAFETY: NULL or a live environment (caller's contract, forwarded).
    let env = unsafe { env.as_mut() }.ok_or_else(|| null("env"))?;
    let cores = env.cores.take().ok_or_else(|| {
        Fail::new(
            libc::EBUSY,
            "this environment's cores were already started (one runtime per luna_init)",
        )
    })?;
    let n = env.n_cores;
    let rt = spawn(cores, env.opts.clone())
        .map_err(|e| Fail::new(libc::EIO, format!("start the runtime: {e}")))?;
    Ok(Box::into_raw(Box::new(luna_runtime_t {
        stop: rt.stop_handle(),
        readers: (0..rt.cores()).filter_map(|i| rt.stats_reader(i)).collect(),
        rt: Mutex::new(Some(rt)),
        final_stats: OnceLock::new(),
        cores: n,
        _keep: env.keep.clone(),
    })))
}

/// # Safety
/// `rt` is NULL or live.
unsafe fn rt_ref<'a>(rt: *const luna_runtime_t) -> Res<&'a luna_runtime_t> {
    // SAFETY: NULL or live (caller's contract).
    unsafe { rt.as_ref() }.ok_or_else(|| null("runtime"))
}

/// Asks every core to stop gracefully (any thread, also from a callback, also while the
/// controlling thread waits in `luna_runtime_join`): each core calls
/// `on_stop`, then closes its connections (reset after the config's shutdown grace).
/// 0, or -1 with `EINVAL` (NULL).
///
/// # Safety
/// `rt` is NULL or a live runtime.
#[no_mangle]
pub unsafe extern "C" fn luna_runtime_stop(rt: *const luna_runtime_t) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        unsafe { rt_ref(rt) }?.stop.stop();
        Ok(0)
    })
}

/// 1 when every core thread has exited (the application stopped it, or a core failed),
/// 0 while any runs (and while `luna_runtime_join` waits), -1 with `EINVAL` (NULL).
///
/// # Safety
/// `rt` is NULL or a live runtime.
#[no_mangle]
pub unsafe extern "C" fn luna_runtime_finished(rt: *const luna_runtime_t) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller contract.
        let r = unsafe { rt_ref(rt) }?;
        if r.final_stats.get().is_some() {
            return Ok(1);
        }
        // While `luna_runtime_join` waits the cores are not known finished (0) until it
        // returns.
        Ok(r.run()
            .as_ref()
            .map_or(0, |run| c_int::from(run.is_finished())))
    })
}

/// Waits for every core to exit (call [`luna_runtime_stop`] first, or let a callback
/// call `luna_ctx_request_stop` / `luna_sock_request_stop`; another thread may call
/// `luna_runtime_stop` and read the stats while this waits). The final counters stay
/// readable with `luna_runtime_stats`. 0; -1 with `EIO` when a core failed or panicked
/// (message in `luna_last_error`), `EINVAL` (NULL, already joined, or called from a
/// core's callback: a core cannot join itself).
///
/// # Safety
/// `rt` is NULL or a live runtime; not called from one of its own core threads.
#[no_mangle]
pub unsafe extern "C" fn luna_runtime_join(rt: *mut luna_runtime_t) -> c_int {
    guard(-1, || {
        controlling("luna_runtime_join")?;
        // SAFETY: NULL or live (caller's contract); shared: other threads may stop the
        // runtime or read its stats meanwhile.
        let r = unsafe { rt_ref(rt) }?;
        // Taken out of the lock: the wait below holds nothing another thread needs.
        let run = r.run().take().ok_or_else(|| {
            Fail::new(
                libc::EINVAL,
                "the runtime was already joined (or is being joined)",
            )
        })?;
        let res = run.join();
        let mut s: Vec<CoreStats> = r.readers.iter().map(StatsReader::read).collect();
        let out = match res {
            Ok(reports) => {
                for rep in reports {
                    if let Some(slot) = s.get_mut(rep.index) {
                        *slot = rep.stats;
                    }
                }
                Ok(0)
            }
            Err(e) => Err(Fail::new(libc::EIO, format!("runtime: {e}"))),
        };
        let _ = r.final_stats.set(s);
        out
    })
}

/// Frees a runtime (NULL is a no-op); one still running is stopped and joined first.
/// Called from a core's callback it frees nothing and sets errno to `EINVAL`.
///
/// # Safety
/// `rt` is NULL or a live runtime, not used again; not called from its core threads.
#[no_mangle]
pub unsafe extern "C" fn luna_runtime_free(rt: *mut luna_runtime_t) {
    guard((), || {
        if !rt.is_null() {
            controlling("luna_runtime_free")?;
            // SAFETY: made by Box::into_raw in `start`, freed once.
            drop(unsafe { Box::from_raw(rt) });
        }
        Ok(())
    })
}

/// Number of cores of the runtime; -1 with `EINVAL` (NULL).
///
/// # Safety
/// `rt` is NULL or a live runtime.
#[no_mangle]
pub unsafe extern "C" fn luna_runtime_cores(rt: *const luna_runtime_t) -> c_int {
    // SAFETY: forwarded caller contract.
    guard(-1, || Ok(unsafe { rt_ref(rt) }?.cores as c_int))
}

/// Core `core`'s latest published counters (final ones after join).
pub(crate) fn core_stats(rt: *const luna_runtime_t, core: usize) -> Res<CoreStats> {
    // SAFETY: NULL or live (caller's contract, forwarded by the stats functions).
    let r = unsafe { rt_ref(rt) }?;
    if core >= r.cores {
        return Err(Fail::new(
            libc::EINVAL,
            format!("core {core} out of range (the runtime has {})", r.cores),
        ));
    }
    let s = match r.final_stats.get() {
        Some(s) => s.get(core).copied(),
        None => r.readers.get(core).map(StatsReader::read),
    };
    s.ok_or_else(|| Fail::new(libc::EINVAL, format!("no core {core}")))
}
