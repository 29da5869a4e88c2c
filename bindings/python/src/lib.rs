//! `leaselock._native`: the Rust core seen from Python. Each module wraps one core module and
//! only converts: arguments in, a core call, the result out. The public API is the pure-Python
//! package `leaselock` around it.

mod args;
mod election;
mod errors;
mod fenced;
mod lease;
mod session;
mod table;
mod wake;
mod worker;

use std::future::Future;

use leaselock::SystemClock;
use pyo3::prelude::*;

pub(crate) use wake::awaitable;

/// How many worker threads the binding's runtime has: `LEASELOCK_RUNTIME_THREADS`, 1 by default
/// (checked when the module is imported). A Python process's lease I/O is light next to its
/// Python work, and each extra worker adds cross-thread wake-ups to every request (about 13% of
/// the CPU of a renewal on two cores, measured side by side). No runtime thread ever waits for
/// the GIL (handlers are entered from `spawn_blocking` threads), so one thread keeps renewing
/// while Python code is busy.
fn runtime_threads_from_env() -> Result<usize, String> {
    match std::env::var("LEASELOCK_RUNTIME_THREADS") {
        Err(_) => Ok(1),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if (1..=256).contains(&n) => Ok(n),
            _ => Err(format!("LEASELOCK_RUNTIME_THREADS must be a whole number from 1 to 256, got {v:?}")),
        },
    }
}

/// The one runtime every call runs on, so sync and async calls share the SDK's connection pool.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(runtime_threads_from_env().unwrap_or(1))
            .thread_name("leaselock-runtime")
            .enable_all()
            .build()
            .expect("the leaselock runtime could not start")
    })
}

/// Runs `fut` to completion with the GIL released: every blocking call of the binding goes
/// through here. The operation runs as a task on the runtime thread, next to the connection task
/// it talks to, and this thread only waits for its end: one wake-up each way per call. (Polling
/// it here with `block_on` would make every step of the exchange a cross-thread wake-up: about
/// 15% more CPU per renewal, measured side by side.)
/// A panic in the task ends as an `InternalError` (the last-resort guard), never in Python.
pub(crate) fn detached<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    py.detach(|| {
        let task = runtime().spawn(fut);
        match runtime().block_on(task) {
            Ok(out) => Ok(out),
            Err(e) if e.is_panic() => Err(errors::panicked(e.into_panic())),
            Err(e) => Err(errors::machinery(e.to_string())),
        }
    })
}

/// [`detached`] for a core operation, its error mapped to the Python exception tree.
pub(crate) fn wait<F, T>(py: Python<'_>, fut: F) -> PyResult<T>
where
    F: Future<Output = leaselock::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    detached(py, fut)?.map_err(|e| errors::to_py(py, e))
}

/// `None` or the Python repr of a string.
pub(crate) fn repr_opt<T: std::fmt::Debug>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "None".to_string(), |v| format!("{v:?}"))
}

/// A deadline as Python reads time: the `time.monotonic()` reading at which core's monotonic
/// clock (the system clock every store of the binding measures deadlines on, whose instants are
/// Rust's `Lease::deadline()`) reads `mono_ms`. The two clocks' origins are matched once.
pub(crate) fn monotonic_seconds(py: Python<'_>, mono_ms: u64) -> PyResult<f64> {
    static ORIGIN: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let origin = match ORIGIN.get() {
        Some(origin) => *origin,
        None => {
            let monotonic = py.import("time")?.getattr("monotonic")?;
            let before = SystemClock::instant_at(0).elapsed();
            let now: f64 = monotonic.call0()?.extract()?;
            let after = SystemClock::instant_at(0).elapsed();
            *ORIGIN.get_or_init(|| now - (before + after).as_secs_f64() / 2.0)
        }
    };
    Ok(origin + mono_ms as f64 / 1000.0)
}

/// Seconds from now to the monotonic deadline `deadline_mono_ms`, 0.0 once it has passed (Rust's
/// `time_left()`).
pub(crate) fn seconds_left(deadline_mono_ms: u64) -> f64 {
    SystemClock::instant_at(deadline_mono_ms).saturating_duration_since(std::time::Instant::now()).as_secs_f64()
}

/// With `LEASELOCK_LOG` set (a filter such as `info` or `warn,leaselock::engine=debug`), the
/// library's own logs go to stderr as the CLI writes them: timestamp, level, target, fields.
/// Unset, it logs nothing (the application's logging is its own). A filter that does not parse
/// is reported once on stderr.
fn log_from_env() {
    let Ok(spec) = std::env::var("LEASELOCK_LOG") else { return };
    match tracing_subscriber::EnvFilter::try_new(&spec) {
        Ok(filter) => {
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            // Another subscriber already installed in this process stays.
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(ansi)
                .with_writer(std::io::stderr)
                .try_init();
        }
        Err(e) => eprintln!("leaselock: LEASELOCK_LOG={spec:?} ignored: {e}"),
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    runtime_threads_from_env().map_err(pyo3::exceptions::PyValueError::new_err)?;
    log_from_env();
    errors::register(m)?;
    // The workspace version, the one the wheel's metadata carries too.
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<table::PyLeaseTable>()?;
    m.add_class::<lease::PyLease>()?;
    m.add_class::<lease::PyLeaseItem>()?;
    m.add_class::<session::PySession>()?;
    m.add_class::<session::PySessionItem>()?;
    m.add_class::<worker::PyWorker>()?;
    m.add_class::<worker::PyConnection>()?;
    m.add_class::<worker::PyWorkerSnapshot>()?;
    m.add_class::<worker::PyWorkerDefaults>()?;
    m.add("WORKER_DEFAULTS", worker::PyWorkerDefaults::default())?;
    m.add_class::<election::PyLeaderElector>()?;
    m.add_class::<election::PyRedisElection>()?;
    m.add_class::<election::PyTerm>()?;
    Ok(())
}
