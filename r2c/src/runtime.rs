//! Starting cores on their threads, reading their stats, stopping them.

use crate::batch::{BatchApp, BatchMode};
use crate::control::{ControlServer, Probe};
use crate::core::{CoreError, CoreLoop, CoreOptions, CoreReport, CoreSetup, Mode, Shared};
use crate::device::Device;
use crate::inline::{InlineApp, InlineMode};
use crate::stats::{CoreStats, StatsCell};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Stops a runtime from anywhere (signal handler thread, test, another core).
#[derive(Debug, Clone)]
pub struct StopHandle(pub(crate) Arc<AtomicBool>);

impl StopHandle {
    /// Ask every core to shut down gracefully.
    pub fn stop(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether a stop was requested.
    pub fn is_stopped(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Reads one core's published stats.
#[derive(Debug, Clone)]
pub struct StatsReader(pub(crate) Arc<StatsCell>);

impl StatsReader {
    /// The latest snapshot (never blocks the core).
    pub fn read(&self) -> CoreStats {
        self.0.read()
    }

    /// How many snapshots the core has published.
    pub fn generation(&self) -> u64 {
        self.0.generation()
    }
}

/// Running cores.
pub struct Runtime {
    stop: StopHandle,
    cells: Vec<Arc<StatsCell>>,
    threads: Vec<JoinHandle<Result<CoreReport, CoreError>>>,
    control: Option<JoinHandle<()>>,
    extra: Vec<Box<dyn FnOnce() -> Result<(), CoreError> + Send>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("cores", &self.cells.len())
            .finish()
    }
}

/// Why a runtime failed.
#[derive(Debug)]
pub struct RuntimeError {
    /// Core index.
    pub core: usize,
    /// What went wrong.
    pub error: CoreError,
}

impl std::fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "core {}: {}", self.core, self.error)
    }
}

impl std::error::Error for RuntimeError {}

/// Raises the runtime's stop flag when a core's thread unwinds (its application or the
/// core panicked): the other cores shut down gracefully and [`Runtime::join`] returns
/// the panic, rather than waiting for cores nothing may ever stop (the panicked core's
/// application could have been the one to request the stop), and a runtime does not go
/// on with a dead core whose queue the NIC still steers connections to.
pub(crate) struct StopOnPanic(pub(crate) Arc<AtomicBool>);

impl Drop for StopOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Release);
        }
    }
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

impl Runtime {
    /// Start one thread per core running `make_app(core_index)` inline.
    pub fn spawn_inline<D, A, F>(
        cores: Vec<CoreSetup<D>>,
        opts: CoreOptions,
        make_app: F,
    ) -> Result<Runtime, RuntimeError>
    where
        D: Device + Send + 'static,
        A: InlineApp + 'static,
        F: Fn(usize) -> A + Send + Sync + 'static,
    {
        let burst = opts.burst;
        Self::spawn_with(cores, opts, move |i| InlineMode::new(make_app(i), burst))
    }

    /// Start one thread per core running `make_app(core_index)` in batch mode.
    pub fn spawn_batch<D, A, F>(
        cores: Vec<CoreSetup<D>>,
        opts: CoreOptions,
        make_app: F,
    ) -> Result<Runtime, RuntimeError>
    where
        D: Device + Send + 'static,
        A: BatchApp + 'static,
        F: Fn(usize) -> A + Send + Sync + 'static,
    {
        let idle = opts.idle;
        Self::spawn_with(cores, opts, move |i| BatchMode::new(make_app(i), idle))
    }

    /// Spawn cores, each building its mode on its own thread. Returns once every core has
    /// started (or the first error, after stopping the others).
    pub(crate) fn spawn_with<D, M, F>(
        cores: Vec<CoreSetup<D>>,
        opts: CoreOptions,
        make_mode: F,
    ) -> Result<Runtime, RuntimeError>
    where
        D: Device + Send + 'static,
        M: Mode + 'static,
        F: Fn(usize) -> M + Send + Sync + 'static,
    {
        // Bound before any core starts: a socket in use fails the start cleanly.
        let control = match &opts.control {
            Some(c) => Some(ControlServer::bind(c).map_err(|e| RuntimeError {
                core: 0,
                error: CoreError::Control(e.to_string()),
            })?),
            None => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let make_mode = Arc::new(make_mode);
        let mut probes = Vec::new();
        let (ready_tx, ready_rx) = mpsc::channel::<(usize, Result<(), String>)>();
        let mut rt = Runtime {
            stop: StopHandle(Arc::clone(&stop)),
            cells: Vec::new(),
            threads: Vec::new(),
            control: None,
            extra: Vec::new(),
        };
        let n = cores.len();
        for setup in cores {
            let index = setup.index;
            let cell = Arc::new(StatsCell::default());
            rt.cells.push(Arc::clone(&cell));
            let probe = Arc::new(Probe::default());
            probes.push((Arc::clone(&probe), Arc::clone(&cell)));
            let shared = Shared {
                stop: Arc::clone(&stop),
                cell,
                probe,
            };
            let opts = opts.clone();
            let make_mode = Arc::clone(&make_mode);
            let ready = ready_tx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("r2c-core-{index}"))
                .spawn(move || {
                    let _stop_on_panic = StopOnPanic(Arc::clone(&shared.stop));
                    let core = match CoreLoop::new(setup, &opts, shared) {
                        Ok(c) => c,
                        Err(e) => {
                            let _ = ready.send((index, Err(e.to_string())));
                            return Err(e);
                        }
                    };
                    let mut mode = make_mode(index);
                    let _ = ready.send((index, Ok(())));
                    drop(ready);
                    Ok(core.run(&mut mode))
                });
            match spawned {
                Ok(h) => rt.threads.push(h),
                Err(e) => {
                    rt.stop.stop();
                    let _ = rt.join();
                    return Err(RuntimeError {
                        core: index,
                        error: CoreError::Spawn(e.to_string()),
                    });
                }
            }
        }
        drop(ready_tx);
        for _ in 0..n {
            if let Ok((_, Ok(()))) = ready_rx.recv() {
                continue;
            }
            // A core failed to start (or died): stop the others and report its error.
            rt.stop.stop();
            let mut first = None;
            for (i, h) in rt.threads.drain(..).enumerate() {
                let err = match h.join() {
                    Ok(Err(error)) => Some(error),
                    Err(p) => Some(CoreError::Panicked(panic_message(p))),
                    Ok(Ok(_)) => None,
                };
                if let (None, Some(error)) = (&first, err) {
                    first = Some(RuntimeError { core: i, error });
                }
            }
            return Err(first.unwrap_or(RuntimeError {
                core: 0,
                error: CoreError::Panicked("a core exited during start".into()),
            }));
        }
        if let Some(server) = control {
            match server.spawn(Arc::clone(&stop), probes, opts.slab.clone()) {
                Ok(h) => rt.control = Some(h),
                Err(e) => {
                    rt.stop.stop();
                    let _ = rt.join();
                    return Err(RuntimeError {
                        core: 0,
                        error: CoreError::Control(format!("cannot spawn its thread: {e}")),
                    });
                }
            }
        }
        Ok(rt)
    }

    pub(crate) fn add_thread(&mut self, join: Box<dyn FnOnce() -> Result<(), CoreError> + Send>) {
        self.extra.push(join);
    }

    pub(crate) fn stop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop.0)
    }

    /// Number of cores.
    pub fn cores(&self) -> usize {
        self.cells.len()
    }

    /// A handle that stops the runtime.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Ask every core to shut down gracefully (see [`Runtime::join`]).
    pub fn stop(&self) {
        self.stop.stop();
    }

    /// A reader of core `i`'s stats, for another thread.
    pub fn stats_reader(&self, i: usize) -> Option<StatsReader> {
        self.cells.get(i).map(|c| StatsReader(Arc::clone(c)))
    }

    /// The latest snapshot of every core.
    pub fn stats(&self) -> Vec<CoreStats> {
        self.cells.iter().map(|c| c.read()).collect()
    }

    /// Whether every core thread has exited.
    pub fn is_finished(&self) -> bool {
        self.threads.iter().all(JoinHandle::is_finished)
    }

    /// Wait for every core to stop (call [`Runtime::stop`] first, or let the application
    /// request it) and collect their reports. A core whose thread panics stops the
    /// runtime (the others shut down gracefully) and its panic is the error returned.
    pub fn join(mut self) -> Result<Vec<CoreReport>, RuntimeError> {
        let mut reports = Vec::new();
        let mut first_err = None;
        for (i, h) in self.threads.drain(..).enumerate() {
            match h.join() {
                Ok(Ok(r)) => reports.push(r),
                Ok(Err(error)) => {
                    first_err.get_or_insert(RuntimeError { core: i, error });
                }
                Err(p) => {
                    first_err.get_or_insert(RuntimeError {
                        core: i,
                        error: CoreError::Panicked(panic_message(p)),
                    });
                }
            }
        }
        if let Some(c) = self.control.take() {
            let _ = c.join();
        }
        for join in self.extra.drain(..) {
            if let Err(error) = join() {
                first_err.get_or_insert(RuntimeError {
                    core: usize::MAX,
                    error,
                });
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(reports),
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Never leave core threads spinning behind a dropped handle.
        self.stop.stop();
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
        if let Some(c) = self.control.take() {
            let _ = c.join();
        }
        for join in self.extra.drain(..) {
            let _ = join();
        }
    }
}
