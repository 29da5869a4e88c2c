//! `leaselock::election` (and `leaselock::redis`) for Python: core's `LeaderElector` claims,
//! renews, cancels at the deadline and releases; each elected action is a Python coroutine it
//! starts on the caller's event loop and cancels when the term ends.
//!
//! As in the worker, the renewals and the deadline are tokio tasks that never take the GIL, and
//! the calls into Python (start, cancel) run on tokio's blocking pool.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leaselock::election::{ElectionBackend, ElectionOptions, TermEnd};
use leaselock::redis::{RedisElection, RedisOptions};
use leaselock::{Candidate, Clock, DynamoRegistry, LeaderElector, Outcome, StoreElection, Strategy, SystemClock, Term};
use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PyTuple};
use tokio::sync::oneshot;

use crate::errors::{invalid, to_py};
use crate::table::PyLeaseTable;
use crate::{awaitable, seconds_left, wait};

fn ms(py: Python<'_>, field: &str, v: i64) -> PyResult<Duration> {
    u64::try_from(v)
        .map(Duration::from_millis)
        .map_err(|_| invalid(py, field, &format!("{field} {v}: must not be negative")))
}

/// The Redis election store: leader, slot and candidate keys under `key_prefix`.
#[pyclass(module = "leaselock._native", name = "RedisElection", frozen)]
pub struct PyRedisElection {
    backend: Arc<RedisElection>,
}

#[pymethods]
impl PyRedisElection {
    #[new]
    #[pyo3(signature = (url, *, lease_ms=20_000, renew_ms=5_000, clock_skew_ms=1_000, key_prefix="leaselock:".to_string()))]
    fn new(
        py: Python<'_>,
        url: String,
        lease_ms: i64,
        renew_ms: i64,
        clock_skew_ms: i64,
        key_prefix: String,
    ) -> PyResult<Self> {
        let options = RedisOptions::default()
            .lease(ms(py, "lease_ms", lease_ms)?)
            .renew(ms(py, "renew_ms", renew_ms)?)
            .skew(ms(py, "clock_skew_ms", clock_skew_ms)?)
            .key_prefix(key_prefix);
        let backend =
            wait(py, async move { RedisElection::connect(&url, options).await }).map_err(|e| rename_timing(py, e))?;
        Ok(Self { backend: Arc::new(backend) })
    }

    #[getter]
    fn lease_ms(&self) -> u64 {
        self.backend.options().lease.as_millis() as u64
    }
    #[getter]
    fn renew_ms(&self) -> u64 {
        self.backend.options().renew.as_millis() as u64
    }
    #[getter]
    fn clock_skew_ms(&self) -> u64 {
        self.backend.options().skew.as_millis() as u64
    }
    #[getter]
    fn key_prefix(&self) -> &str {
        &self.backend.options().key_prefix
    }
}

/// Core names the Redis timing fields `lease`, `renew`, `skew`; the caller passed `*_ms`.
fn rename_timing(py: Python<'_>, e: PyErr) -> PyErr {
    let field: Option<String> = e.value(py).getattr("field").and_then(|f| f.extract()).ok();
    let renamed = match field.as_deref() {
        Some("lease") => "lease_ms",
        Some("renew") => "renew_ms",
        Some("skew") => "clock_skew_ms",
        _ => return e,
    };
    let _ = e.value(py).setattr("field", renamed);
    e
}

/// What an elected action is handed: the claim's fence and its term's deadline.
#[pyclass(module = "leaselock._native", name = "Term", frozen)]
pub struct PyTerm {
    term: Term,
}

#[pymethods]
impl PyTerm {
    /// The claim's fencing token: strictly greater than every earlier holder's of this name.
    #[getter]
    fn fence(&self) -> u64 {
        self.term.fence()
    }
    /// The stored lease key (`{prefix}leader/{name}` or `{prefix}group/{name}#slot-{i}`).
    #[getter]
    fn key(&self) -> &str {
        &self.term.lease().id
    }
    /// The slot held, for group elections.
    #[getter]
    fn slot(&self) -> Option<u32> {
        self.term.slot()
    }
    /// Seconds left before the local deadline (negative once it has passed).
    #[getter]
    fn deadline(&self) -> f64 {
        seconds_left(self.term.deadline_mono_ms(), SystemClock.monotonic_ms())
    }
    /// True once the term is over.
    #[getter]
    fn cancelled(&self) -> bool {
        self.term.is_cancelled()
    }
    fn __repr__(&self) -> String {
        format!("Term(key={:?}, fence={})", self.term.lease().id, self.term.fence())
    }
}

/// Runs one action: starts it on the event loop, cancels it when the term ends, and ends when
/// the Python task has ended (its result stays on the Python side).
async fn run_action(start: Arc<Py<PyAny>>, term: Term) {
    let (done_tx, done_rx) = oneshot::channel::<()>();
    let py_term = PyTerm { term: term.clone() };
    let running = tokio::task::spawn_blocking(move || {
        Python::attach(|py| -> PyResult<Py<PyAny>> {
            let done_tx = Mutex::new(Some(done_tx));
            let on_done = PyCFunction::new_closure(py, None, None, move |_args: &Bound<'_, PyTuple>, _kwargs| {
                if let Some(tx) = done_tx.lock().expect("on_done poisoned").take() {
                    let _ = tx.send(());
                }
                PyResult::Ok(())
            })?;
            start.call1(py, (Py::new(py, py_term)?, on_done))
        })
    })
    .await;
    // A start that failed never began a task: nothing to wait for.
    let Ok(Ok(running)) = running else { return };
    tokio::pin!(done_rx);
    tokio::select! {
        _ = &mut done_rx => {}
        () = term.cancelled() => {
            let cancelled = tokio::task::spawn_blocking(move || {
                Python::attach(|py| running.call_method0(py, "cancel").map(drop))
            })
            .await;
            if matches!(cancelled, Ok(Ok(()))) {
                let _ = done_rx.await;
            }
        }
    }
}

fn end_name(end: TermEnd) -> &'static str {
    match end {
        TermEnd::Finished => "finished",
        TermEnd::Lost => "lost",
        TermEnd::SteppedDown => "stepped_down",
    }
}

/// `(fence, end, None)` when led, `(None, None, holder)` when skipped.
type Result3 = (Option<u64>, Option<&'static str>, Option<String>);

fn outcome(o: Outcome<()>) -> Result3 {
    match o {
        Outcome::Led { fence, end, .. } => (Some(fence), Some(end_name(end)), None),
        Outcome::Skipped { holder } => (None, None, holder),
    }
}

fn strategy_arg(py: Python<'_>, strategy: &str, preferred: Option<String>) -> PyResult<Strategy> {
    match (strategy, preferred) {
        ("highest_score", None) => Ok(Strategy::HighestScore),
        ("least_loaded", None) => Ok(Strategy::LeastLoaded),
        ("preferred", Some(id)) => Ok(Strategy::PreferredNode(id)),
        (s, _) => Err(invalid(
            py,
            "strategy",
            &format!("strategy {s:?}: \"highest_score\", \"least_loaded\" or (\"preferred\", id)"),
        )),
    }
}

/// Runs actions only while this process holds an election lease.
#[pyclass(module = "leaselock._native", name = "LeaderElector", frozen)]
pub struct PyLeaderElector {
    elector: LeaderElector,
}

#[pymethods]
impl PyLeaderElector {
    #[new]
    #[pyo3(signature = (backend, candidate_id, *, wait_ms=0, min_lease_ms=0, retry_ms=200, key_prefix=String::new(), term_ms=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        backend: &Bound<'_, PyAny>,
        candidate_id: String,
        wait_ms: i64,
        min_lease_ms: i64,
        retry_ms: i64,
        key_prefix: String,
        term_ms: Option<i64>,
    ) -> PyResult<Self> {
        let backend: Arc<dyn ElectionBackend> = if let Ok(table) = backend.cast::<PyLeaseTable>() {
            let table = (*table.get().table).clone();
            let registry = DynamoRegistry::for_table(&table);
            Arc::new(StoreElection::new(table, registry))
        } else if let Ok(redis) = backend.cast::<PyRedisElection>() {
            redis.get().backend.clone()
        } else {
            return Err(invalid(py, "backend", "backend: a LeaseTable or a RedisElection"));
        };
        let mut options = ElectionOptions::default()
            .wait(ms(py, "wait_ms", wait_ms)?)
            .min_lease(ms(py, "min_lease_ms", min_lease_ms)?)
            .retry_delay(ms(py, "retry_ms", retry_ms)?)
            .key_prefix(key_prefix);
        if let Some(t) = term_ms {
            options = options.term(ms(py, "term_ms", t)?);
        }
        let elector = LeaderElector::new(backend, candidate_id, options).map_err(|e| match e {
            leaselock::Error::InvalidInput { field, message } => {
                let field = match field.as_str() {
                    "owner" => "candidate_id",
                    "retry_delay" => "retry_ms",
                    "term" => "term_ms",
                    other => other,
                };
                invalid(py, field, &format!("invalid {field}: {message}"))
            }
            e => to_py(py, e),
        })?;
        Ok(Self { elector })
    }

    #[getter]
    fn candidate_id(&self) -> &str {
        self.elector.owner()
    }

    /// Resolves with `(fence, end, holder)` once the term is over (see `leaselock.election`).
    fn run_if_leader_async<'py>(&self, py: Python<'py>, name: String, start: Py<PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let (elector, start) = (self.elector.clone(), Arc::new(start));
        awaitable(
            py,
            async move { elector.run_if_leader(&name, move |term| run_action(start, term)).await.map(outcome) },
        )
    }

    fn run_if_slot_async<'py>(
        &self,
        py: Python<'py>,
        name: String,
        slots: u32,
        start: Py<PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (elector, start) = (self.elector.clone(), Arc::new(start));
        awaitable(py, async move {
            elector.run_if_slot(&name, slots, move |term| run_action(start, term)).await.map(outcome)
        })
    }

    #[pyo3(signature = (name, start, *, score=0.0, load=0.0, metadata=None, strategy="highest_score", preferred=None))]
    #[allow(clippy::too_many_arguments)]
    fn run_if_elected_async<'py>(
        &self,
        py: Python<'py>,
        name: String,
        start: Py<PyAny>,
        score: f64,
        load: f64,
        metadata: Option<BTreeMap<String, String>>,
        strategy: &str,
        preferred: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let strategy = strategy_arg(py, strategy, preferred)?;
        let candidate = Candidate {
            metadata: metadata.unwrap_or_default(),
            ..Candidate::new(self.elector.owner(), score).load(load)
        };
        let (elector, start) = (self.elector.clone(), Arc::new(start));
        awaitable(py, async move {
            elector.run_if_elected(&name, candidate, &strategy, move |term| run_action(start, term)).await.map(outcome)
        })
    }
}
