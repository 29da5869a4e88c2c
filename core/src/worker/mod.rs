//! The tokio worker runtime: holds up to `max_connections` leases and runs one handler per held
//! lease.
//!
//! Every decision is the engine's ([`crate::engine::Engine`]: claims, renewals and deadlines,
//! the session and its cover, balance, orphan polls, hints, desired-state checks, shutdown);
//! this module is its driver on tokio: it runs each store operation, receives, settles and sends
//! the SQS hints, runs the handlers, writes the metrics lines, and feeds every answer back.

//! ```no_run
//! # async fn demo() -> Result<(), leaselock::worker::BoxError> {
//! use std::sync::Arc;
//! use leaselock::worker::Worker;
//! use leaselock::{LeaseTable, TableConfig};
//!
//! let table = Arc::new(LeaseTable::connect(TableConfig::new("leases")).await?);
//! let worker = Worker::builder(table).max_connections(100).build(|conn| async move {
//!     let resume_after = conn.last_seq().unwrap_or(0);
//!     let mut seq = resume_after;
//!     loop {
//!         tokio::select! {
//!             _ = conn.cancelled() => return Ok::<(), leaselock::Error>(()),
//!             _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {
//!                 seq += 1;
//!                 conn.checkpoint(seq).await?;
//!             }
//!         }
//!     }
//! })?;
//! let summary = worker.run().await; // until SIGTERM or SIGINT
//! println!("released {} leases", summary.released);
//! # Ok(()) }
//! ```

mod clock;
mod connection;
pub use crate::engine::decide;
mod hint_queue;
mod report;
mod settings;

use std::collections::HashMap;
use std::future::Future;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

pub use crate::engine::WorkerSnapshot;
pub use clock::TokioClock;
pub use connection::Connection;
pub use decide::{
    CancelReason, DEFAULT_DESIRED_STATE_INTERVAL, DEFAULT_HANDLER_GRACE, DEFAULT_HINT_WAIT, DEFAULT_INDEX_LAG,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_METRICS_INTERVAL, DEFAULT_ORPHAN_INTERVAL, MAX_CONNECTIONS_LIMIT, MAX_HINT_WAIT,
    POLL_ANSWER_MARGIN,
};
pub use settings::{WorkerField, WorkerSettings, MAX_METRICS_NAMESPACE_BYTES};

use crate::engine::{self, Answer, Command, Engine, Event, HandlerEnd, Now, Op};
use crate::{hold, Error, Lease, LeaseMode, LeaseStore, Result, StoreOffset};
use connection::Held;
use report::Reporter;

/// The error a handler may return.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

type Handler = Arc<dyn Fn(Connection) -> BoxFuture<'static, std::result::Result<(), BoxError>> + Send + Sync>;

/// Where START hints arrive.
#[derive(Debug, Clone)]
pub struct HintQueue {
    pub client: aws_sdk_sqs::Client,
    pub queue_url: String,
    /// Long-poll wait per receive (at most 20 s); shutdown interrupts it.
    pub wait: Duration,
}

/// Builds a [`Worker`]; every knob has the design's default ([`WorkerSettings`], which also
/// holds each one's limit).
pub struct WorkerBuilder {
    store: Arc<dyn LeaseStore>,
    settings: WorkerSettings,
    sqs: Option<aws_sdk_sqs::Client>,
    metrics_writer: Option<Box<dyn Write + Send>>,
}

impl WorkerBuilder {
    /// Every option at once (a queue url among them needs its client:
    /// [`WorkerBuilder::hint_queue`]).
    pub fn settings(mut self, settings: WorkerSettings) -> Self {
        self.settings = settings;
        self
    }

    /// The owner name written into leases (default: host, pid and a random suffix).
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.settings.worker_id = Some(id.into());
        self
    }

    /// The most leases held at once (default 700).
    pub fn max_connections(mut self, n: usize) -> Self {
        self.settings.max_connections = n;
        self
    }

    /// How often to query the orphan index (default 2 s, jittered ±20 %).
    pub fn orphan_interval(mut self, d: Duration) -> Self {
        self.settings.orphan_interval = d;
        self
    }

    /// How often to read the desired state of every held lease in one batch (default 10 s).
    pub fn desired_state_interval(mut self, d: Duration) -> Self {
        self.settings.desired_state_interval = d;
        self
    }

    /// How often to print a metrics line (default 60 s).
    pub fn metrics_interval(mut self, d: Duration) -> Self {
        self.settings.metrics_interval = d;
        self
    }

    /// The CloudWatch namespace of the metrics (default `leaselock`).
    pub fn metrics_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.settings.metrics_namespace = namespace.into();
        self
    }

    /// Where metrics lines go (default stdout).
    pub fn metrics_writer(mut self, writer: impl Write + Send + 'static) -> Self {
        self.metrics_writer = Some(Box::new(writer));
        self
    }

    /// How long a cancelled handler may take to return before it is aborted (default 5 s).
    pub fn handler_grace(mut self, d: Duration) -> Self {
        self.settings.handler_grace = d;
        self
    }

    /// Session mode: claim at most a fair share of the fleet's work (what the live sessions
    /// hold and what nobody holds, spread over the live sessions within each worker's
    /// `max_connections`) and hand the excess over a few at a time (default on).
    /// Off, a worker claims whatever it finds up to `max_connections`. Per-item mode ignores it.
    pub fn balance(mut self, on: bool) -> Self {
        self.settings.balance = on;
        self
    }

    /// Session mode: how far behind the table the owner index may be (default 10 s). A dead
    /// session whose work the index does not list is retired only once a listing sent this long
    /// after the session's last write lists nothing; until then the survivors list it again at
    /// each orphan poll. Work claimed just before its worker died is taken over within
    /// lease + clock skew + the index's real lag + one orphan interval, whenever that lag is
    /// below this. A longer setting costs one owner-index query per dead session per poll for
    /// longer; it never delays the takeover of work the index lists.
    pub fn index_lag(mut self, d: Duration) -> Self {
        self.settings.index_lag = d;
        self
    }

    /// Claims wait until the store's clock is known within this (default: half the table's
    /// clock skew). Rule 1 compares expiries with this worker's clock: claimed on the store's
    /// clock known within half the skew, two workers' clocks differ by less than the skew
    /// whatever their hosts' clocks say. Until then the worker keeps what it holds (its
    /// deadlines run on the monotonic clock) and says why in its log and snapshot.
    pub fn clock_tolerance(mut self, d: Duration) -> Self {
        self.settings.clock_tolerance = Some(d);
        self
    }

    /// Whether claims wait for the store's clock (default on; see
    /// [`WorkerBuilder::clock_tolerance`]). Off, a worker claims on its own clock until the
    /// store's is known; the offset is measured and reported either way.
    pub fn wait_for_store_clock(mut self, on: bool) -> Self {
        self.settings.wait_for_store_clock = on;
        self
    }

    /// Receive START hints from this SQS queue (long poll, [`DEFAULT_HINT_WAIT`]).
    pub fn hint_queue(mut self, client: aws_sdk_sqs::Client, queue_url: impl Into<String>) -> Self {
        self.settings.queue_url = Some(queue_url.into());
        self.sqs = Some(client);
        self
    }

    /// The long-poll wait of the hint queue (default [`DEFAULT_HINT_WAIT`], 5 s; at most 20 s).
    pub fn hint_wait(mut self, d: Duration) -> Self {
        self.settings.hint_wait = d;
        self
    }

    /// Builds the worker with `handler`, called once per claimed lease. The handler's return
    /// (`Ok` or `Err`) releases the lease; so does a panic, which does not stop the worker.
    pub fn build<H, Fut, E>(self, handler: H) -> Result<Worker>
    where
        H: Fn(Connection) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let mut s = self.settings;
        let worker_id = s.worker_id.get_or_insert_with(default_worker_id).clone();
        s.validate(WorkerField::name)?;
        let hints = match (s.queue_url.clone(), self.sqs) {
            (Some(queue_url), Some(client)) => Some(HintQueue { client, queue_url, wait: s.hint_wait }),
            (Some(_), None) => {
                let why = "needs an SQS client (WorkerBuilder::hint_queue)";
                return Err(Error::invalid(WorkerField::QueueUrl.name(), why));
            }
            (None, _) => None,
        };
        let handler: Handler = Arc::new(move |conn| {
            let fut = handler(conn);
            Box::pin(async move { fut.await.map_err(Into::into) })
        });
        let store = self.store;
        let clock = store.clock();
        let now = Now { wall_ms: clock.now_ms(), mono_ms: clock.monotonic_ms() };
        let settings = s.engine_settings(worker_id.clone(), store.config().skew_ms());
        let engine = Engine::new(settings, store.config().clone(), rand::random(), now);
        let shared = Arc::new(Shared {
            id: worker_id,
            engine: Mutex::new(engine),
            shutdown: CancellationToken::new(),
            finished: CancellationToken::new(),
        });
        let writer = self.metrics_writer.unwrap_or_else(|| Box::new(std::io::stdout()));
        Ok(Worker { shared, store, handler, hints, reporter: Reporter::new(s.metrics_namespace, writer) })
    }
}

/// host-pid-random: unique per process, and readable in the table.
pub fn default_worker_id() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let host = if host.is_empty() { "worker".to_string() } else { host };
    format!("{host}-{}-{:06x}", std::process::id(), rand::random::<u32>() & 0xff_ffff)
}

/// What the worker, its handles and its driver share: the engine (every decision) and the
/// shutdown and end signals.
struct Shared {
    id: String,
    engine: Mutex<Engine>,
    /// Fires when shutdown is requested through a handle.
    shutdown: CancellationToken,
    /// Fires when `run_until` has returned.
    finished: CancellationToken,
}

impl Shared {
    fn engine(&self) -> std::sync::MutexGuard<'_, Engine> {
        self.engine.lock().expect("engine poisoned")
    }
}

/// Controls a running worker from elsewhere (the CLI, tests): trigger shutdown, read a snapshot.
#[derive(Clone)]
pub struct WorkerHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHandle").field("worker_id", &self.shared.id).finish()
    }
}

impl WorkerHandle {
    pub fn worker_id(&self) -> &str {
        &self.shared.id
    }

    /// Starts the shutdown path: stop claiming, cancel handlers, release every lease.
    pub fn shutdown(&self) {
        self.shared.shutdown.cancel();
    }

    pub fn snapshot(&self) -> WorkerSnapshot {
        self.shared.engine().snapshot()
    }

    /// Ids held now, sorted.
    pub fn held_ids(&self) -> Vec<String> {
        self.snapshot().held
    }

    /// Resolves once the worker's run has returned.
    pub async fn finished(&self) {
        self.shared.finished.cancelled().await
    }
}

/// A lease worker; see the module docs.
pub struct Worker {
    shared: Arc<Shared>,
    store: Arc<dyn LeaseStore>,
    handler: Handler,
    hints: Option<HintQueue>,
    reporter: Reporter,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("worker_id", &self.shared.id)
            .field("settings", self.shared.engine().settings())
            .finish()
    }
}

impl Worker {
    pub fn builder(store: Arc<dyn LeaseStore>) -> WorkerBuilder {
        WorkerBuilder { store, settings: WorkerSettings::default(), sqs: None, metrics_writer: None }
    }

    pub fn worker_id(&self) -> &str {
        &self.shared.id
    }

    pub fn handle(&self) -> WorkerHandle {
        WorkerHandle { shared: self.shared.clone() }
    }

    /// Runs the worker on a task of its own until [`WorkerHandle::shutdown`]; the task returns
    /// the final snapshot. Aborting the task is a crash (see [`Worker::run_until`]).
    pub fn spawn(self) -> (WorkerHandle, tokio::task::JoinHandle<WorkerSnapshot>) {
        let handle = self.handle();
        (handle, tokio::spawn(self.run_until(std::future::pending())))
    }

    /// Runs until SIGTERM or SIGINT, then shuts down cleanly.
    pub async fn run(self) -> WorkerSnapshot {
        self.run_until(shutdown_signal()).await
    }

    /// Whether the store's leases can be exclusive ([`LeaseStore::check_table`]: for a lease
    /// table, single-Region or a multi-Region strong consistency global table). The run asks
    /// it first; call it before to get a refusal as an error (the table object keeps a
    /// success, so the run does not ask again).
    pub async fn check_table(&self) -> Result<()> {
        self.store.check_table().await
    }

    /// Runs until `shutdown` resolves (or [`WorkerHandle::shutdown`]), then stops claiming,
    /// cancels every handler, waits for them (at most `handler_grace` each, then aborts them),
    /// releases every lease in parallel and returns the final snapshot.
    ///
    /// The store's table is checked first ([`Worker::check_table`]), before anything is claimed:
    /// a throttled, slow or unreachable store is asked again until it answers or the shutdown
    /// comes; a refusal (a global table in eventual consistency, a missing table, refused
    /// credentials) is logged as an error and the run returns at once, having claimed nothing.
    ///
    /// Dropping this future instead (or aborting its task) is a crash: every task stops at once
    /// and no lease is released, so other workers take over after the expiry.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> WorkerSnapshot {
        let Worker { shared, store, handler, hints, reporter } = self;
        tokio::pin!(shutdown);
        if !table_checked(&*store, &shared, shutdown.as_mut()).await {
            shared.finished.cancel();
            return shared.engine().snapshot();
        }
        info!(worker_id = %shared.id, max_connections = shared.engine().settings().max_connections, "worker started");
        let mut driver = Driver {
            session_mode: store.config().mode == LeaseMode::Session,
            shared: shared.clone(),
            store,
            handler,
            hints,
            reporter,
            held: HashMap::new(),
            reads: FuturesUnordered::new(),
            tasks: FuturesUnordered::new(),
            effects: FuturesUnordered::new(),
            stopping: CancellationToken::new(),
            finished: false,
            clock_told: None,
        };
        driver.measure_store_clock();
        loop {
            driver.run_commands();
            if driver.finished {
                break;
            }
            let timeout = shared.engine().poll_timeout();
            let clock = driver.store.clock();
            let asked = driver.stopping.is_cancelled();
            let event = tokio::select! {
                biased;
                () = &mut shutdown, if !asked => Some(Event::Shutdown),
                () = shared.shutdown.cancelled(), if !asked => Some(Event::Shutdown),
                Some(event) = driver.tasks.next(), if !driver.tasks.is_empty() => Some(event),
                Some(event) = driver.reads.next(), if !driver.reads.is_empty() => Some(event),
                Some(()) = driver.effects.next(), if !driver.effects.is_empty() => None,
                () = hold::sleep_until_mono(clock, timeout.unwrap_or(u64::MAX)), if timeout.is_some() => None,
            };
            if matches!(event, Some(Event::Shutdown)) {
                driver.stopping.cancel();
            }
            // Answers ready at the same moment are all taken in before the engine's next
            // commands run, so the claims it starts in their place go out together too (those
            // of one dead session as one takeover transaction).
            let mut events: Vec<Event> = event.into_iter().collect();
            if !events.is_empty() {
                while let Some(Some(ready)) = driver.tasks.next().now_or_never() {
                    events.push(ready);
                }
            }
            if let Some(measured) = driver.store_clock_changed() {
                events.insert(0, measured);
            }
            let now = driver.now();
            let mut engine = shared.engine();
            if events.is_empty() {
                engine.handle_timeout(now);
            }
            for event in events {
                engine.handle(event, now);
            }
        }
        // Writes still in flight (work given back) and hints being sent or settled finish;
        // reads are dropped.
        while driver.tasks.next().await.is_some() {}
        while driver.effects.next().await.is_some() {}
        let snapshot = shared.engine().snapshot();
        shared.finished.cancel();
        snapshot
    }
}

/// The store's table check at the start of a run (see [`Worker::run_until`]): `true` once it
/// passed, `false` on a refusal or a shutdown before it could pass.
async fn table_checked(
    store: &dyn LeaseStore,
    shared: &Shared,
    mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
) -> bool {
    let mut attempt = 0;
    loop {
        let failure = tokio::select! {
            biased;
            () = &mut shutdown => return false,
            () = shared.shutdown.cancelled() => return false,
            checked = store.check_table() => match checked {
                Ok(()) => break,
                Err(e) => e,
            },
        };
        if !matches!(failure, Error::Throttled | Error::Timeout { .. } | Error::Unreachable(_)) {
            error!(worker_id = %shared.id, error = %failure, "table refused: the worker claims nothing and stops");
            return false;
        }
        let delay = crate::lease::backoff_ms(attempt, 1_000, 30_000, rand::random::<f64>());
        warn!(worker_id = %shared.id, error = %failure, delay_ms = delay, "table check failed; asking again");
        attempt = attempt.saturating_add(1);
        tokio::select! {
            biased;
            () = &mut shutdown => return false,
            () = shared.shutdown.cancelled() => return false,
            () = tokio::time::sleep(Duration::from_millis(delay)) => {}
        }
    }
    true
}

/// A held lease as the driver keeps it: the state its handler shares, and its task's abort.
struct Slot {
    held: Arc<Held>,
    abort: tokio::task::AbortHandle,
}

/// The tokio driver of the engine: runs each command, feeds back each answer, sleeps until the
/// engine's next timeout. Every future it runs lives in this run: dropping it is a crash.
struct Driver {
    shared: Arc<Shared>,
    store: Arc<dyn LeaseStore>,
    session_mode: bool,
    handler: Handler,
    hints: Option<HintQueue>,
    reporter: Reporter,
    held: HashMap<String, Slot>,
    /// Reads in flight (dropped at the end of the run).
    reads: FuturesUnordered<BoxFuture<'static, Event>>,
    /// Writes, handlers and hint receives: each ends in an event.
    tasks: FuturesUnordered<BoxFuture<'static, Event>>,
    /// Hints sent and settled: no answer.
    effects: FuturesUnordered<BoxFuture<'static, ()>>,
    /// Cancelled as the shutdown is taken in: a long poll the engine asked for before it and
    /// not yet sent is not sent (it answers empty at once).
    stopping: CancellationToken,
    finished: bool,
    /// The store's clock as last told to the engine.
    clock_told: Option<engine::ClockReading>,
}

impl Driver {
    /// Claims wait for the store's clock: a few requests timed to measure it at once, beside
    /// the engine's own (whose answers measure it too); given up at the shutdown.
    fn measure_store_clock(&mut self) {
        let Some(tolerance) = self.shared.engine().settings().clock_tolerance_ms else { return };
        let (store, stopping) = (self.store.clone(), self.stopping.clone());
        self.effects.push(
            async move {
                tokio::select! {
                    () = stopping.cancelled() => {}
                    () = store.measure_clock(tolerance) => {}
                }
            }
            .boxed(),
        );
    }

    /// The store's clock, when it changed since the engine was last told (a store that is its
    /// own clock reads exactly, offset 0).
    fn store_clock_changed(&mut self) -> Option<Event> {
        let reading = match self.store.clock().store_offset() {
            StoreOffset::Exact => engine::ClockReading { offset_ms: 0, uncertainty_ms: 0 },
            StoreOffset::Unknown => return None,
            StoreOffset::Measured(e) => {
                engine::ClockReading { offset_ms: e.offset_ms, uncertainty_ms: e.uncertainty_ms }
            }
        };
        if self.clock_told == Some(reading) {
            return None;
        }
        self.clock_told = Some(reading);
        Some(Event::StoreClock { offset_ms: reading.offset_ms, uncertainty_ms: reading.uncertainty_ms })
    }

    fn now(&self) -> Now {
        let clock = self.store.clock();
        Now { wall_ms: clock.now_ms(), mono_ms: clock.monotonic_ms() }
    }

    fn run_commands(&mut self) {
        loop {
            let Some(command) = self.shared.engine().poll_command() else { break };
            self.run(command);
        }
    }

    fn run(&mut self, command: Command) {
        match command {
            Command::Run { op, request } => {
                let read = request.is_read();
                let answer = self.operation(request);
                let event = async move { Event::Answer { op, answer: answer.await } }.boxed();
                if read {
                    self.reads.push(event);
                } else {
                    self.tasks.push(event);
                }
            }
            Command::StartHandler { lease } => self.start_handler(lease),
            Command::CancelHandler { id, reason } => {
                if let Some(slot) = self.held.get(&id) {
                    slot.held.cancel.cancel(reason);
                }
            }
            Command::AbortHandler { id } => {
                if let Some(slot) = self.held.get(&id) {
                    slot.abort.abort();
                }
            }
            Command::SetDeadline { id, deadline_mono_ms } => {
                if let Some(slot) = self.held.get(&id) {
                    slot.held.cover(deadline_mono_ms);
                }
            }
            Command::Forget { id } => {
                // Anything the handler left running with a clone of the connection stops now.
                if let Some(slot) = self.held.remove(&id) {
                    slot.held.cancel.cancel(CancelReason::Released);
                }
            }
            Command::ReceiveHints { max, wait_ms } => {
                if let Some(queue) = self.hints.clone() {
                    let stopping = self.stopping.clone();
                    self.tasks.push(
                        async move {
                            if stopping.is_cancelled() {
                                return Event::Hints { received: Ok(Vec::new()) };
                            }
                            hint_queue::receive(queue, max, Duration::from_millis(wait_ms)).await
                        }
                        .boxed(),
                    );
                }
            }
            Command::SettleHints { delete, give_back, defer, defer_ms } => {
                if let Some(queue) = self.hints.clone() {
                    self.effects.push(hint_queue::settle(queue, delete, give_back, defer, defer_ms).boxed());
                }
            }
            Command::SendHint { id, ended } => {
                if let Some(queue) = self.hints.clone() {
                    let body = Command::hint_body(&id, ended.as_ref());
                    self.effects.push(async move { hint_queue::hand_over(&queue, &id, body).await }.boxed());
                }
            }
            Command::EmitMetrics => {
                let metrics = self.shared.engine().take_metrics();
                self.reporter.emit(&self.shared.id, &metrics, self.session_mode, self.store.clock().now_ms());
            }
            Command::Finished => self.finished = true,
        }
    }

    fn start_handler(&mut self, lease: Lease) {
        let id = lease.id.clone();
        let held = Arc::new(Held::new(lease.clone()));
        let conn = Connection::new(held.clone(), self.store.clone(), &lease);
        let task = tokio::spawn((self.handler)(conn));
        let abort = task.abort_handle();
        let state = held.clone();
        self.tasks.push(
            async move {
                // Dropped with the run (a crash), the handler stops too.
                let mut task = AbortOnDrop(task);
                let end = match (&mut task.0).await {
                    Ok(Ok(())) => HandlerEnd::Returned,
                    Ok(Err(e)) => {
                        warn!(connection_id = %id, error = %e, "handler failed");
                        HandlerEnd::Failed
                    }
                    Err(e) if e.is_panic() => {
                        error!(connection_id = %id, error = %panic_message(e.into_panic()), "handler panicked");
                        HandlerEnd::Panicked
                    }
                    Err(_) => HandlerEnd::Aborted,
                };
                Event::HandlerEnded { id, end, reason: state.cancel.reason() }
            }
            .boxed(),
        );
        self.held.insert(lease.id, Slot { held, abort });
    }

    /// The store operation `request` as a future of its answer: [`engine::execute`], but for
    /// the renewal and the release of a held lease, which act on its holder, and a session
    /// renewal, which ends at its deadline.
    fn operation(&self, request: Op) -> BoxFuture<'static, Answer> {
        let store = self.store.clone();
        let owner = self.shared.id.clone();
        let answer = |r: Result<Answer>| r.unwrap_or_else(Answer::Failed);
        match request {
            Op::Renew { id, .. } => {
                let held = self.held.get(&id).map(|s| s.held.clone());
                async move {
                    let Some(held) = held else { return Answer::Failed(Error::Lost { id }) };
                    // Rule 2 inside: the wait for the lock and the request end at the deadline.
                    answer(held.renew(&*store).await.map(|()| Answer::Lease(held.current())))
                }
                .boxed()
            }
            Op::Release { id } => {
                let held = self.held.get(&id).map(|s| s.held.clone());
                async move {
                    let Some(held) = held else { return Answer::Failed(Error::Lost { id }) };
                    let lease = held.lease.lock().await;
                    answer(store.release(&lease).await.map(|()| Answer::Done))
                }
                .boxed()
            }
            Op::RenewSession { until_mono_ms, .. } => async move {
                // Rule 2: nothing runs past the deadline, a renewal stuck in the network included.
                let lost = Error::Lost { id: store.config().session_id(&owner) };
                tokio::select! {
                    renewed = engine::execute(&*store, &owner, request) => renewed,
                    () = hold::sleep_until_mono(store.clock(), until_mono_ms) => Answer::Failed(lost),
                }
            }
            .boxed(),
            request => async move { engine::execute(&*store, &owner, request).await }.boxed(),
        }
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => payload.downcast::<&'static str>().map(|s| s.to_string()).unwrap_or_else(|_| "panic".into()),
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => info!(signal = "SIGTERM", "shutdown requested"),
                    _ = tokio::signal::ctrl_c() => info!(signal = "SIGINT", "shutdown requested"),
                }
                return;
            }
            Err(e) => warn!(error = %e, "cannot listen for SIGTERM; only SIGINT stops the worker"),
        }
    }
    let _ = tokio::signal::ctrl_c().await;
    info!(signal = "SIGINT", "shutdown requested");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ManualClock, MemoryStore, TableConfig};

    fn store() -> Arc<dyn LeaseStore> {
        Arc::new(MemoryStore::new(TableConfig::default(), Arc::new(ManualClock::new(0))).unwrap())
    }

    fn build(b: WorkerBuilder) -> Result<Worker> {
        b.build(|_conn| async { Ok::<(), BoxError>(()) })
    }

    #[test]
    fn bad_settings_name_the_knob() {
        let err = |b: WorkerBuilder| build(b).unwrap_err().to_string();
        assert!(err(Worker::builder(store()).max_connections(0)).contains("max_connections"));
        assert!(err(Worker::builder(store()).orphan_interval(Duration::ZERO)).contains("orphan_interval"));
        assert!(err(Worker::builder(store()).worker_id("")).contains("worker_id"));
        let sdk =
            aws_sdk_sqs::Config::builder().behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest()).build();
        let sqs = aws_sdk_sqs::Client::from_conf(sdk);
        let long = Worker::builder(store())
            .hint_wait(Duration::from_secs(21))
            .hint_queue(sqs, "https://q.example/123456789012/hints");
        assert!(err(long).contains("hint_wait"));
        // Every option at once: a queue url without its client is refused, naming the url.
        let url = Some("https://q.example/123456789012/hints".into());
        let no_client = WorkerSettings { queue_url: url, ..WorkerSettings::default() };
        assert!(err(Worker::builder(store()).settings(no_client)).contains("queue_url"));
    }

    #[test]
    fn limits_are_refused_before_anything_is_allocated() {
        let field = |b: WorkerBuilder| match build(b) {
            Err(Error::InvalidInput { field, message }) => {
                assert!(message.len() < 200 && !message.contains('\n'), "{message}");
                field
            }
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("accepted"),
        };
        // 2^61 once panicked in the semaphore; the limit is refused with the option's name.
        assert_eq!(field(Worker::builder(store()).max_connections(1 << 61)), "max_connections");
        assert_eq!(field(Worker::builder(store()).max_connections(MAX_CONNECTIONS_LIMIT + 1)), "max_connections");
        build(Worker::builder(store()).max_connections(MAX_CONNECTIONS_LIMIT)).unwrap();
        let huge = Duration::from_millis(u64::MAX);
        assert_eq!(field(Worker::builder(store()).orphan_interval(huge)), "orphan_interval");
        assert_eq!(field(Worker::builder(store()).desired_state_interval(Duration::ZERO)), "desired_state_interval");
        assert_eq!(field(Worker::builder(store()).metrics_interval(huge)), "metrics_interval");
        assert_eq!(field(Worker::builder(store()).handler_grace(huge)), "handler_grace");
        assert_eq!(field(Worker::builder(store()).hint_wait(huge)), "hint_wait");
        assert_eq!(field(Worker::builder(store()).clock_tolerance(Duration::ZERO)), "clock_tolerance");
        assert_eq!(field(Worker::builder(store()).clock_tolerance(huge)), "clock_tolerance");
        assert_eq!(field(Worker::builder(store()).metrics_namespace("a\nb")), "metrics_namespace");
        let sdk =
            aws_sdk_sqs::Config::builder().behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest()).build();
        let sqs = aws_sdk_sqs::Client::from_conf(sdk);
        for url in ["javascript:alert(1)", "file:///etc/passwd", "", &"h".repeat(5_000_000)] {
            assert_eq!(field(Worker::builder(store()).hint_queue(sqs.clone(), url)), "queue_url", "{:.40}", url);
        }
    }

    #[test]
    fn default_worker_ids_are_unique_and_readable() {
        let (a, b) = (default_worker_id(), default_worker_id());
        assert_ne!(a, b);
        assert!(a.contains(&format!("-{}-", std::process::id())), "{a}");
        let w = build(Worker::builder(store())).unwrap();
        assert!(w.worker_id().contains(&std::process::id().to_string()));
        assert_eq!(w.handle().snapshot().max_connections, DEFAULT_MAX_CONNECTIONS);
    }

    #[test]
    fn claims_wait_for_the_store_clock_within_half_the_skew_unless_told_otherwise() {
        let tolerance = |b: WorkerBuilder| build(b).unwrap().shared.engine().settings().clock_tolerance_ms;
        assert_eq!(tolerance(Worker::builder(store())), Some(500));
        assert_eq!(tolerance(Worker::builder(store()).clock_tolerance(Duration::from_millis(80))), Some(80));
        assert_eq!(tolerance(Worker::builder(store()).wait_for_store_clock(false)), None);
    }

    /// A store whose clock is the process's own (memory) reads exactly: claims do not wait.
    #[tokio::test(start_paused = true)]
    async fn a_worker_on_a_store_of_its_own_clock_reports_offset_zero_and_claims() {
        let clock = Arc::new(TokioClock::new(1_700_000_000_000));
        let memory = MemoryStore::new(TableConfig::default(), clock).unwrap();
        memory.start("s1", "wss://feed.example").await.unwrap();
        let w = build(Worker::builder(Arc::new(memory)).orphan_interval(Duration::from_millis(100))).unwrap();
        let handle = w.handle();
        let (_, task) = w.spawn();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let snap = handle.snapshot();
        assert_eq!((snap.clock_offset_ms, snap.clock_uncertainty_ms, &snap.claims_paused), (Some(0), Some(0), &None));
        assert!(snap.acquired >= 1, "{snap:?}");
        handle.shutdown();
        task.await.unwrap();
    }
}
