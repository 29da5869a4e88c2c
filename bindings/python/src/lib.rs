//! `leaselock._native`: the Rust core seen from Python. Each module wraps one core module and
//! only converts: arguments in, a core call, the result out. The public API is the pure-Python
//! package `leaselock` around it.

mod election;
mod errors;
mod fenced;
mod lease;
mod session;
mod table;
mod wake;
mod worker;

use std::future::Future;

use pyo3::prelude::*;

pub(crate) use wake::awaitable;

/// The one runtime every call runs on (pyo3-async-runtimes' own), so sync and async calls share
/// the SDK's connection pool.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

/// Runs `fut` to completion with the GIL released: every blocking call of the binding goes
/// through here.
pub(crate) fn detached<F>(py: Python<'_>, fut: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    py.detach(|| runtime().block_on(fut))
}

/// [`detached`] for a core operation, its error mapped to the Python exception tree.
pub(crate) fn wait<F, T>(py: Python<'_>, fut: F) -> PyResult<T>
where
    F: Future<Output = leaselock::Result<T>> + Send,
    T: Send,
{
    detached(py, fut).map_err(|e| errors::to_py(py, e))
}

/// `None` or the Python repr of a string.
pub(crate) fn repr_opt<T: std::fmt::Debug>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "None".to_string(), |v| format!("{v:?}"))
}

/// Monotonic seconds from the store clock's reading `now_ms` to `deadline_ms` (negative once past).
pub(crate) fn seconds_left(deadline_ms: u64, now_ms: u64) -> f64 {
    (deadline_ms as f64 - now_ms as f64) / 1000.0
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<table::PyLeaseTable>()?;
    m.add_class::<lease::PyLease>()?;
    m.add_class::<lease::PyLeaseItem>()?;
    m.add_class::<session::PySession>()?;
    m.add_class::<session::PySessionItem>()?;
    m.add_class::<worker::PyWorker>()?;
    m.add_class::<worker::PyConnection>()?;
    m.add_class::<worker::PyWorkerSnapshot>()?;
    m.add_class::<election::PyLeaderElector>()?;
    m.add_class::<election::PyRedisElection>()?;
    m.add_class::<election::PyTerm>()?;
    Ok(())
}
