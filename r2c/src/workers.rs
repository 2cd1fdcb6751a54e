//! Worker threads of split and message mode: named, optionally pinned, each with its own
//! zbuf core cache (core ids follow the I/O core's), joined by one extra runtime thread.

use crate::core::CoreError;
use std::thread::JoinHandle;
use zbuf::{CoreCache, Slab};

/// How to start a group of worker threads.
pub(crate) struct Spawn<'a> {
    /// Thread name prefix (`<name>-<index>`).
    pub name: &'a str,
    /// The I/O core's index: worker `w` gets zbuf core id `io_index + 1 + w`.
    pub io_index: usize,
    /// Pin worker `w` to `cpus[w]` (when given).
    pub pin: bool,
    pub cpus: &'a [usize],
    pub slab: Option<Slab>,
}

type Handle = JoinHandle<Result<(), CoreError>>;

/// Starts one thread per item, running `body(index, item, cache)`.
pub(crate) fn spawn<T, F>(s: &Spawn<'_>, items: Vec<T>, body: F) -> Result<Vec<Handle>, String>
where
    T: Send + 'static,
    F: Fn(usize, T, Option<CoreCache>) + Send + Sync + 'static,
{
    let body = std::sync::Arc::new(body);
    let mut handles = Vec::with_capacity(items.len());
    for (w, item) in items.into_iter().enumerate() {
        let body = std::sync::Arc::clone(&body);
        let slab = s.slab.clone();
        let (pin, cpu, io_index) = (s.pin, s.cpus.get(w).copied(), s.io_index);
        let h = std::thread::Builder::new()
            .name(format!("{}-{w}", s.name))
            .spawn(move || {
                if let (true, Some(cpu)) = (pin, cpu) {
                    if !crate::core::pin_to(cpu) {
                        return Err(CoreError::Pin { core: w, cpu });
                    }
                }
                let cache = match &slab {
                    Some(s) => Some(s.core_cache(io_index + 1 + w).map_err(CoreError::Slab)?),
                    None => None,
                };
                body(w, item, cache);
                Ok(())
            })
            .map_err(|e| e.to_string())?;
        handles.push(h);
    }
    Ok(handles)
}

/// The runtime's extra thread for a worker group: runs `first`, then joins every worker
/// (the first error, or a panic, is the group's result).
pub(crate) fn joiner(
    handles: Vec<Handle>,
    first: impl FnOnce() + Send + 'static,
) -> Box<dyn FnOnce() -> Result<(), CoreError> + Send> {
    Box::new(move || {
        first();
        let mut res = Ok(());
        for h in handles {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => res = Err(e),
                Err(_) => res = Err(CoreError::Panicked("worker".into())),
            }
        }
        res
    })
}
