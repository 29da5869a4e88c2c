//! `leaselock::election` (and `leaselock::redis`) for Python: core's `LeaderElector` claims,
//! renews, cancels at the deadline and releases; each elected action is a Python coroutine it
//! starts on the caller's event loop and cancels when the term ends.
//!
//! As in the worker, the renewals and the deadline are tokio tasks that never take the GIL, and
//! the calls into Python (start, cancel) run on tokio's blocking pool.

use std::sync::{Arc, Mutex};

use leaselock::election::{ElectionBackend, ElectionOptions, TermEnd};
use leaselock::redis::{RedisElection, RedisOptions};
use leaselock::{Candidate, DynamoRegistry, LeaderElector, Outcome, StoreElection, Strategy, Term};
use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PyTuple};
use tokio::sync::oneshot;

use crate::args::Arg;
use crate::errors::{guarded, invalid, to_py, to_py_named};
use crate::table::PyLeaseTable;
use crate::{awaitable, detached, monotonic_seconds, seconds_left};

/// Core's Redis option names and the arguments the caller passed.
const REDIS_NAMES: &[(&str, &str)] =
    &[("lease", "lease_ms"), ("renew", "renew_ms"), ("skew", "clock_skew_ms"), ("redis url", "url")];

/// Core's elector option names and the arguments the caller passed (the retry delay's is
/// `retry_delay_ms`, or `retry_ms` when the caller used that older name).
fn elector_names(retry: &'static str) -> [(&'static str, &'static str); 6] {
    [
        ("owner", "candidate_id"),
        ("wait", "wait_ms"),
        ("min_lease", "min_lease_ms"),
        ("retry_delay", retry),
        ("term", "term_ms"),
        ("candidate_ttl", "candidate_ttl_ms"),
    ]
}

/// Core's strategic-election names and the arguments the caller passed.
const CANDIDATE_NAMES: &[(&str, &str)] =
    &[("candidate.score", "score"), ("candidate.load", "load"), ("candidate.metadata", "metadata")];

/// The Redis election store: leader, slot and candidate keys under `key_prefix`.
#[pyclass(module = "leaselock._native", name = "RedisElection", frozen)]
pub struct PyRedisElection {
    backend: Arc<RedisElection>,
}

#[pymethods]
impl PyRedisElection {
    #[new]
    #[pyo3(signature = (url, *, lease_ms=Arg::Int(20_000), renew_ms=Arg::Int(5_000), clock_skew_ms=Arg::Int(1_000),
        key_prefix=Arg::Text("leaselock:")))]
    fn new(
        py: Python<'_>,
        url: Arg,
        lease_ms: Arg,
        renew_ms: Arg,
        clock_skew_ms: Arg,
        key_prefix: Arg,
    ) -> PyResult<Self> {
        guarded(|| {
            let url = url.text(py, "url")?;
            let options = RedisOptions::default()
                .lease(lease_ms.ms(py, "lease_ms")?)
                .renew(renew_ms.ms(py, "renew_ms")?)
                .skew(clock_skew_ms.ms(py, "clock_skew_ms")?)
                .key_prefix(key_prefix.text(py, "key_prefix")?);
            options.validate().map_err(|e| to_py_named(py, e, REDIS_NAMES))?;
            let backend = detached(py, async move { RedisElection::connect(&url, options).await })?
                .map_err(|e| to_py_named(py, e, REDIS_NAMES))?;
            Ok(Self { backend: Arc::new(backend) })
        })
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
    /// The local deadline: the `time.monotonic()` reading at which the term ends.
    #[getter]
    fn deadline(&self, py: Python<'_>) -> PyResult<f64> {
        monotonic_seconds(py, self.term.deadline_mono_ms())
    }
    /// Seconds left before the deadline, 0.0 once it has passed.
    fn time_left(&self) -> f64 {
        seconds_left(self.term.deadline_mono_ms())
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
    let strategy = match (strategy, preferred) {
        ("highest_score", None) => Strategy::HighestScore,
        ("least_loaded", None) => Strategy::LeastLoaded,
        ("preferred", Some(id)) => Strategy::PreferredNode(id),
        (s, _) => {
            return Err(invalid(
                py,
                "strategy",
                &format!(
                    "invalid strategy: {} is not \"highest_score\", \"least_loaded\" or (\"preferred\", id)",
                    leaselock::render::value(s)
                ),
            ))
        }
    };
    strategy.validate().map_err(|e| to_py(py, e))?;
    Ok(strategy)
}

/// Runs actions only while this process holds an election lease.
#[pyclass(module = "leaselock._native", name = "LeaderElector", frozen)]
pub struct PyLeaderElector {
    elector: LeaderElector,
}

#[pymethods]
impl PyLeaderElector {
    /// The options in the order of core's `ElectionOptions` and Node's elector; `retry_ms` is
    /// the older name of `retry_delay_ms`, still accepted (not both).
    #[new]
    #[pyo3(signature = (backend, candidate_id, *, wait_ms=Arg::Int(0), min_lease_ms=Arg::Int(0), key_prefix=Arg::Text(""),
        retry_delay_ms=Arg::Absent, term_ms=Arg::Absent, candidate_ttl_ms=Arg::Absent, retry_ms=Arg::Absent))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        backend: &Bound<'_, PyAny>,
        candidate_id: Arg,
        wait_ms: Arg,
        min_lease_ms: Arg,
        key_prefix: Arg,
        retry_delay_ms: Arg,
        term_ms: Arg,
        candidate_ttl_ms: Arg,
        retry_ms: Arg,
    ) -> PyResult<Self> {
        guarded(|| {
            let backend: Arc<dyn ElectionBackend> = if let Ok(table) = backend.cast::<PyLeaseTable>() {
                let table = (*table.get().table).clone();
                let registry = DynamoRegistry::for_table(&table);
                Arc::new(StoreElection::new(table, registry))
            } else if let Ok(redis) = backend.cast::<PyRedisElection>() {
                redis.get().backend.clone()
            } else {
                return Err(invalid(py, "backend", "invalid backend: a LeaseTable or a RedisElection"));
            };
            let candidate_id = candidate_id.text(py, "candidate_id")?;
            let (retry, retry_field) = match (retry_delay_ms, retry_ms) {
                (Arg::Absent, Arg::Absent) => (Arg::Int(200), "retry_delay_ms"),
                (given, Arg::Absent) => (given, "retry_delay_ms"),
                (Arg::Absent, older) => (older, "retry_ms"),
                _ => {
                    return Err(invalid(
                        py,
                        "retry_ms",
                        "invalid retry_ms: the older name of retry_delay_ms; give one of them",
                    ))
                }
            };
            let mut options = ElectionOptions::default()
                .wait(wait_ms.ms(py, "wait_ms")?)
                .min_lease(min_lease_ms.ms(py, "min_lease_ms")?)
                .key_prefix(key_prefix.text(py, "key_prefix")?)
                .retry_delay(retry.ms(py, retry_field)?);
            if let Some(t) = term_ms.opt_ms(py, "term_ms")? {
                options = options.term(t);
            }
            if let Some(t) = candidate_ttl_ms.opt_ms(py, "candidate_ttl_ms")? {
                options = options.candidate_ttl(t);
            }
            let elector = LeaderElector::new(backend, candidate_id, options)
                .map_err(|e| to_py_named(py, e, &elector_names(retry_field)))?;
            Ok(Self { elector })
        })
    }

    #[getter]
    fn candidate_id(&self) -> &str {
        self.elector.owner()
    }

    /// Resolves with `(fence, end, holder)` once the term is over (see `leaselock.election`).
    fn run_if_leader_async<'py>(&self, py: Python<'py>, name: Arg, start: Py<PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let name = name.text(py, "name")?;
        leaselock::config::validate_id("name", &name).map_err(|e| to_py(py, e))?;
        let (elector, start) = (self.elector.clone(), Arc::new(start));
        awaitable(
            py,
            async move { elector.run_if_leader(&name, move |term| run_action(start, term)).await.map(outcome) },
        )
    }

    fn run_if_slot_async<'py>(
        &self,
        py: Python<'py>,
        name: Arg,
        slots: Arg,
        start: Py<PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let name = name.text(py, "name")?;
        leaselock::config::validate_id("name", &name).map_err(|e| to_py(py, e))?;
        let slots = slots.count::<u64>(py, "slots")?;
        let slots = leaselock::election::slots_from(slots).map_err(|e| to_py(py, e))?;
        let (elector, start) = (self.elector.clone(), Arc::new(start));
        awaitable(py, async move {
            elector.run_if_slot(&name, slots, move |term| run_action(start, term)).await.map(outcome)
        })
    }

    #[pyo3(signature = (name, start, *, score=Arg::Int(0), load=Arg::Int(0), metadata=Arg::Absent,
        strategy=Arg::Text("highest_score"), preferred=Arg::Absent))]
    #[allow(clippy::too_many_arguments)]
    fn run_if_elected_async<'py>(
        &self,
        py: Python<'py>,
        name: Arg,
        start: Py<PyAny>,
        score: Arg,
        load: Arg,
        metadata: Arg,
        strategy: Arg,
        preferred: Arg,
    ) -> PyResult<Bound<'py, PyAny>> {
        let name = name.text(py, "name")?;
        leaselock::config::validate_id("name", &name).map_err(|e| to_py(py, e))?;
        let strategy = strategy_arg(py, &strategy.text(py, "strategy")?, preferred.opt_text(py, "strategy")?)?;
        let candidate = Candidate {
            metadata: metadata.text_map(py, "metadata")?,
            ..Candidate::new(self.elector.owner(), score.number(py, "score")?).load(load.number(py, "load")?)
        };
        candidate.validate().map_err(|e| to_py_named(py, e, CANDIDATE_NAMES))?;
        let (elector, start) = (self.elector.clone(), Arc::new(start));
        awaitable(py, async move {
            elector.run_if_elected(&name, candidate, &strategy, move |term| run_action(start, term)).await.map(outcome)
        })
    }
}
