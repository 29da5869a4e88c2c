//! `leaselock::worker` for Python: core's `Worker` runs the leases (claims, renewals, deadlines,
//! STOP, shutdown); each handler is a Python coroutine it starts on the caller's event loop and
//! cancels when the lease's token fires.
//!
//! The renewals and the deadline are tokio tasks that never take the GIL, so a handler that
//! blocks the event loop cannot keep a lease: at the deadline the core cancels, waits the
//! handler grace, drops the handler's future and releases the lease; every lease call the stuck
//! handler makes afterwards is refused (`LeaseLost`) in Rust. The calls into Python (start,
//! cancel) run on tokio's blocking pool, so waiting for the GIL stalls no renewal either.

use std::sync::{Arc, Mutex, OnceLock};

use leaselock::worker::{BoxError, WorkerField, WorkerSettings, WorkerSnapshot};
use leaselock::{Connection, LeaseStore, Worker, WorkerHandle};
use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PyTuple};
use tokio::sync::oneshot;

use crate::args::Arg;
use crate::errors::{guarded, invalid, to_py};
use crate::lease::seq_arg;
use crate::table::PyLeaseTable;
use crate::{awaitable, fenced, monotonic_seconds, repr_opt, seconds_left};

/// One leased unit of work, handed to the handler.
#[pyclass(module = "leaselock._native", name = "Connection", frozen)]
pub struct PyConnection {
    conn: Connection,
    client: aws_sdk_dynamodb::Client,
}

#[pymethods]
impl PyConnection {
    #[getter]
    fn id(&self) -> &str {
        self.conn.id()
    }
    #[getter]
    fn url(&self) -> Option<&str> {
        self.conn.url()
    }
    #[getter]
    fn last_seq(&self) -> Option<u64> {
        self.conn.last_seq()
    }
    #[getter]
    fn fence(&self) -> u64 {
        self.conn.fence()
    }
    /// The local deadline: the `time.monotonic()` reading at which the worker must stop acting.
    #[getter]
    fn deadline(&self, py: Python<'_>) -> PyResult<f64> {
        monotonic_seconds(py, self.conn.deadline_mono_ms())
    }
    /// Seconds left before the deadline, 0.0 once it has passed.
    fn time_left(&self) -> f64 {
        seconds_left(self.conn.deadline_mono_ms())
    }
    /// The store's time now (epoch ms): what to stamp the handler's writes with.
    fn now_ms(&self) -> u64 {
        self.conn.now_ms()
    }
    #[getter]
    fn cancelled(&self) -> bool {
        self.conn.is_cancelled()
    }
    #[getter]
    fn cancel_reason(&self) -> Option<&'static str> {
        self.conn.cancel_reason().map(|r| r.as_str())
    }

    fn checkpoint_async<'py>(&self, py: Python<'py>, seq: Arg) -> PyResult<Bound<'py, PyAny>> {
        let seq = seq_arg(py, seq)?;
        let conn = self.conn.clone();
        awaitable(py, async move { conn.checkpoint(seq).await })
    }
    fn fenced_write_async<'py>(&self, py: Python<'py>, writes: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let writes = fenced::writes(py, writes)?;
        let (conn, client) = (self.conn.clone(), self.client.clone());
        awaitable(py, async move { conn.fenced_write(&client, writes).await })
    }
    fn fenced_write_with_checkpoint_async<'py>(
        &self,
        py: Python<'py>,
        seq: Arg,
        writes: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let seq = seq_arg(py, seq)?;
        let writes = fenced::writes(py, writes)?;
        let (conn, client) = (self.conn.clone(), self.client.clone());
        awaitable(py, async move { conn.fenced_write_with_checkpoint(&client, seq, writes).await })
    }

    fn __repr__(&self) -> String {
        format!(
            "Connection(id={:?}, fence={}, last_seq={})",
            self.conn.id(),
            self.conn.fence(),
            repr_opt(&self.conn.last_seq())
        )
    }
}

/// A point-in-time view of a worker.
#[pyclass(module = "leaselock._native", name = "WorkerSnapshot", frozen, get_all)]
pub struct PyWorkerSnapshot {
    worker_id: String,
    max_connections: usize,
    held: Vec<String>,
    acquired: u64,
    acquire_conflicts: u64,
    acquire_errors: u64,
    leases_lost: u64,
    released: u64,
    handler_errors: u64,
    handler_panics: u64,
    orphan_polls: u64,
    hints_received: u64,
    /// Session mode: the live session's epoch.
    session_epoch: Option<u64>,
    /// Session mode: connections claimed from dead sessions.
    session_takeovers: u64,
    /// Session mode: transactions that took several of a dead session's connections at once.
    takeover_transactions: u64,
    /// Session mode: connections handed over to balance the fleet.
    handed_over: u64,
    /// Session mode with balance: the most held after claiming (the fair share).
    claim_limit: Option<usize>,
    stopping: bool,
    /// The store's clock minus this host's, as last measured (None: not yet).
    clock_offset_ms: Option<i64>,
    /// How far the true offset may be from `clock_offset_ms`.
    clock_uncertainty_ms: Option<u64>,
    /// Why the worker claims nothing now (it keeps what it holds), if it does not.
    claims_paused: Option<String>,
}

impl From<WorkerSnapshot> for PyWorkerSnapshot {
    fn from(s: WorkerSnapshot) -> Self {
        Self {
            worker_id: s.worker_id,
            max_connections: s.max_connections,
            held: s.held,
            acquired: s.acquired,
            acquire_conflicts: s.acquire_conflicts,
            acquire_errors: s.acquire_errors,
            leases_lost: s.leases_lost,
            released: s.released,
            handler_errors: s.handler_errors,
            handler_panics: s.handler_panics,
            orphan_polls: s.orphan_polls,
            hints_received: s.hints_received,
            session_epoch: s.session_epoch,
            session_takeovers: s.session_takeovers,
            takeover_transactions: s.takeover_transactions,
            handed_over: s.handed_over,
            claim_limit: s.claim_limit,
            stopping: s.stopping,
            clock_offset_ms: s.clock_offset_ms,
            clock_uncertainty_ms: s.clock_uncertainty_ms,
            claims_paused: s.claims_paused,
        }
    }
}

/// The Python side's `start(conn, on_done) -> running` (running has `cancel(reason)`); set
/// when the worker is served, since the handler is given after the worker is built.
type Starter = Arc<OnceLock<Py<PyAny>>>;

/// Runs one handler: starts it on the event loop, cancels it when the token fires, and ends
/// when the Python task has ended (`Err` carries what it raised).
async fn run_handler(starter: Starter, client: aws_sdk_dynamodb::Client, conn: Connection) -> Result<(), BoxError> {
    let (done_tx, done_rx) = oneshot::channel::<Option<String>>();
    let py_conn = PyConnection { conn: conn.clone(), client };
    let running = tokio::task::spawn_blocking(move || {
        Python::attach(|py| -> PyResult<Py<PyAny>> {
            let start = starter.get().ok_or_else(|| invalid(py, "handler", "handler: none registered"))?;
            let done_tx = Mutex::new(Some(done_tx));
            let on_done = PyCFunction::new_closure(py, None, None, move |args: &Bound<'_, PyTuple>, _kwargs| {
                let failure: Option<String> = args.get_item(0)?.extract()?;
                if let Some(tx) = done_tx.lock().expect("on_done poisoned").take() {
                    let _ = tx.send(failure);
                }
                PyResult::Ok(())
            })?;
            start.call1(py, (Py::new(py, py_conn)?, on_done))
        })
    })
    .await?
    .map_err(|e| e.to_string())?;
    tokio::pin!(done_rx);
    let ended = tokio::select! {
        ended = &mut done_rx => ended,
        () = conn.cancelled() => {
            let reason = conn.cancel_reason().map(|r| r.as_str()).unwrap_or("Released");
            tokio::task::spawn_blocking(move || {
                Python::attach(|py| running.call_method1(py, "cancel", (reason,)).map(drop))
            })
            .await?
            .map_err(|e| e.to_string())?;
            // The core aborts this future if the handler outlives the grace period.
            done_rx.await
        }
    };
    match ended {
        Ok(None) => Ok(()),
        Ok(Some(failure)) => Err(failure.into()),
        Err(_) => Err("the handler's task vanished".into()),
    }
}

/// A worker option as the Python caller spells it (durations in milliseconds: `_ms`).
fn py_name(field: WorkerField) -> &'static str {
    match field {
        WorkerField::WorkerId => "worker_id",
        WorkerField::QueueUrl => "queue_url",
        WorkerField::MaxConnections => "max_connections",
        WorkerField::OrphanInterval => "orphan_interval_ms",
        WorkerField::DesiredStateInterval => "desired_state_interval_ms",
        WorkerField::HandlerGrace => "handler_grace_ms",
        WorkerField::HintWait => "hint_wait_ms",
        WorkerField::IndexLag => "index_lag_ms",
        WorkerField::MetricsInterval => "metrics_interval_ms",
        WorkerField::MetricsNamespace => "metrics_namespace",
        WorkerField::Balance => "balance",
        WorkerField::ClockTolerance => "clock_tolerance_ms",
        WorkerField::WaitForStoreClock => "wait_for_store_clock",
    }
}

/// Core's default of every worker option, as Python spells them (`WORKER_DEFAULTS`: the
/// keyword defaults of `leaselock.Worker`).
#[pyclass(module = "leaselock._native", name = "WorkerDefaults", frozen, get_all)]
pub struct PyWorkerDefaults {
    max_connections: usize,
    orphan_interval_ms: u64,
    desired_state_interval_ms: u64,
    metrics_interval_ms: u64,
    handler_grace_ms: u64,
    hint_wait_ms: u64,
    index_lag_ms: u64,
    metrics_namespace: String,
    balance: bool,
    wait_for_store_clock: bool,
}

impl Default for PyWorkerDefaults {
    fn default() -> Self {
        let d = WorkerSettings::default();
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        Self {
            max_connections: d.max_connections,
            orphan_interval_ms: ms(d.orphan_interval),
            desired_state_interval_ms: ms(d.desired_state_interval),
            metrics_interval_ms: ms(d.metrics_interval),
            handler_grace_ms: ms(d.handler_grace),
            hint_wait_ms: ms(d.hint_wait),
            index_lag_ms: ms(d.index_lag),
            metrics_namespace: d.metrics_namespace,
            balance: d.balance,
            wait_for_store_clock: d.wait_for_store_clock,
        }
    }
}

/// A lease worker driven by core's runtime.
#[pyclass(module = "leaselock._native", name = "Worker", frozen)]
pub struct PyWorker {
    worker: Mutex<Option<Worker>>,
    handle: WorkerHandle,
    starter: Starter,
}

#[pymethods]
impl PyWorker {
    #[new]
    #[pyo3(signature = (table, *, queue_url=Arg::Absent, max_connections=Arg::Absent, worker_id=Arg::Absent,
        orphan_interval_ms=Arg::Absent, desired_state_interval_ms=Arg::Absent, metrics_interval_ms=Arg::Absent,
        handler_grace_ms=Arg::Absent, hint_wait_ms=Arg::Absent, index_lag_ms=Arg::Absent,
        metrics_namespace=Arg::Absent, balance=Arg::Absent, clock_tolerance_ms=Arg::Absent,
        wait_for_store_clock=Arg::Absent))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        table: &Bound<'_, PyAny>,
        queue_url: Arg,
        max_connections: Arg,
        worker_id: Arg,
        orphan_interval_ms: Arg,
        desired_state_interval_ms: Arg,
        metrics_interval_ms: Arg,
        handler_grace_ms: Arg,
        hint_wait_ms: Arg,
        index_lag_ms: Arg,
        metrics_namespace: Arg,
        balance: Arg,
        clock_tolerance_ms: Arg,
        wait_for_store_clock: Arg,
    ) -> PyResult<Self> {
        guarded(|| {
            let Ok(table) = table.cast::<PyLeaseTable>() else {
                return Err(invalid(py, "table", "invalid table: must be a LeaseTable"));
            };
            let table = table.get();
            // An argument left out keeps core's default; one passed is converted (`None` is
            // refused where the option is not optional), then core checks every limit.
            let mut s = WorkerSettings::default();
            if max_connections.passed() {
                s.max_connections = max_connections.count(py, py_name(WorkerField::MaxConnections))?;
            }
            for (field, arg, d) in [
                (WorkerField::OrphanInterval, &orphan_interval_ms, &mut s.orphan_interval),
                (WorkerField::DesiredStateInterval, &desired_state_interval_ms, &mut s.desired_state_interval),
                (WorkerField::MetricsInterval, &metrics_interval_ms, &mut s.metrics_interval),
                (WorkerField::HandlerGrace, &handler_grace_ms, &mut s.handler_grace),
                (WorkerField::HintWait, &hint_wait_ms, &mut s.hint_wait),
                (WorkerField::IndexLag, &index_lag_ms, &mut s.index_lag),
            ] {
                if arg.passed() {
                    *d = arg.ms(py, py_name(field))?;
                }
            }
            for (field, arg, on) in [
                (WorkerField::Balance, &balance, &mut s.balance),
                (WorkerField::WaitForStoreClock, &wait_for_store_clock, &mut s.wait_for_store_clock),
            ] {
                if arg.passed() {
                    *on = arg.flag(py, py_name(field))?;
                }
            }
            s.clock_tolerance = clock_tolerance_ms.opt_ms(py, py_name(WorkerField::ClockTolerance))?;
            s.worker_id = worker_id.opt_text(py, py_name(WorkerField::WorkerId))?;
            if let Some(ns) = metrics_namespace.opt_text(py, py_name(WorkerField::MetricsNamespace))? {
                s.metrics_namespace = ns;
            }
            s.queue_url = queue_url.opt_text(py, py_name(WorkerField::QueueUrl))?;
            s.validate(py_name).map_err(|e| to_py(py, e))?;
            let store: Arc<dyn LeaseStore> = table.table.clone();
            let queue_url = s.queue_url.clone();
            let mut builder = Worker::builder(store).settings(s);
            if let Some(url) = queue_url {
                builder = builder.hint_queue(aws_sdk_sqs::Client::new(&table.sdk), url);
            }
            let starter: Starter = Arc::default();
            let client = table.table.client().clone();
            let st = starter.clone();
            let worker =
                builder.build(move |conn| run_handler(st.clone(), client.clone(), conn)).map_err(|e| to_py(py, e))?;
            Ok(Self { handle: worker.handle(), worker: Mutex::new(Some(worker)), starter })
        })
    }

    #[getter]
    fn worker_id(&self) -> &str {
        self.handle.worker_id()
    }

    fn snapshot(&self) -> PyWorkerSnapshot {
        self.handle.snapshot().into()
    }

    /// Starts the shutdown path: stop claiming, cancel handlers, release every lease.
    fn shutdown(&self) {
        self.handle.shutdown();
    }

    /// Runs the worker until `shutdown()`; resolves with the final snapshot. `start` starts one
    /// handler on the event loop (see `leaselock.worker`). The table is checked first: a refused
    /// table (a global table in eventual consistency, a missing one) raises before anything is
    /// claimed.
    fn serve_async<'py>(&self, py: Python<'py>, start: Py<PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let worker = self.worker.lock().expect("worker poisoned").take();
        let worker = worker.ok_or_else(|| invalid(py, "worker", "worker: already served"))?;
        let _ = self.starter.set(start);
        awaitable(py, async move {
            worker.check_table().await?;
            Ok(PyWorkerSnapshot::from(worker.run_until(std::future::pending()).await))
        })
    }
}
