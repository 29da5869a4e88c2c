//! `leaselock._native`: the Rust core seen from Python. Each module wraps one core module and
//! only converts: arguments in, a core call, the result out. The public API is the pure-Python
//! package `leaselock` around it.

mod election;
mod errors;
mod fenced;
mod lease;
mod session;
mod table;
mod worker;

use std::future::Future;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::{intern, IntoPyObjectExt};

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

/// The awaitable form of `fut`: an asyncio future of the running loop, resolved from the tokio
/// task that ran `fut` (one task, one wake-up of the loop per call). The operation runs to its
/// end even if the awaiting task is cancelled: a lease write is never abandoned half-sent.
pub(crate) fn awaitable<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = leaselock::Result<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let event_loop = pyo3_async_runtimes::get_running_loop(py)?;
    let py_fut = event_loop.call_method0(intern!(py, "create_future"))?;
    let (loop_ref, fut_ref) = (event_loop.unbind(), py_fut.clone().unbind());
    runtime().spawn(async move {
        let result = fut.await;
        // The loop thread waits in select() without the GIL: taking it here is brief.
        Python::attach(|py| {
            let (ok, value) = match result.map_err(|e| errors::to_py(py, e)).and_then(|v| v.into_py_any(py)) {
                Ok(v) => (true, v),
                Err(e) => (false, e.into_value(py).into_any()),
            };
            let resolve = RESOLVE.get_or_init(py, || {
                wrap_pyfunction!(resolve, py).expect("resolve is a plain function").into_any().unbind()
            });
            let scheduled =
                loop_ref.call_method1(py, intern!(py, "call_soon_threadsafe"), (resolve, fut_ref, ok, value));
            // Only a closed loop refuses: nobody is awaiting any more.
            drop(scheduled);
        })
    });
    Ok(py_fut)
}

static RESOLVE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Sets the outcome of an awaitable, on its loop, unless it was cancelled meanwhile.
#[pyfunction]
fn resolve(fut: &Bound<'_, PyAny>, ok: bool, value: Bound<'_, PyAny>) -> PyResult<()> {
    let py = fut.py();
    if fut.call_method0(intern!(py, "done"))?.is_truthy()? {
        return Ok(());
    }
    if ok {
        fut.call_method1(intern!(py, "set_result"), (value,))?;
    } else {
        fut.call_method1(intern!(py, "set_exception"), (value,))?;
    }
    Ok(())
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
