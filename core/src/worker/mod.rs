//! The tokio worker runtime: holds up to `max_connections` leases and runs one handler per held
//! lease.
//!
//! Per held lease: one renewal schedule, the handler task and a cancellation token. Worker-wide:
//! an orphan loop (the GSI), an SQS hint loop (hints only: the lease decides ownership), a
//! batched desired-state loop, a metrics loop (EMF lines), and a shutdown path that stops
//! claiming, cancels every handler and releases every lease in parallel. The decisions live in
//! [`decide`] as plain functions.
//!
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
mod hints;
mod lease_task;
mod reconcile;
mod report;
mod session;

use std::collections::HashMap;
use std::future::Future;
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

pub use clock::TokioClock;
pub use connection::Connection;
pub use decide::{
    CancelReason, DEFAULT_DESIRED_STATE_INTERVAL, DEFAULT_HANDLER_GRACE, DEFAULT_HINT_WAIT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_METRICS_INTERVAL, DEFAULT_ORPHAN_INTERVAL, MAX_CONNECTIONS_LIMIT, MAX_HINT_WAIT, POLL_ANSWER_MARGIN,
};

use crate::config::{validate_duration, validate_id, validate_queue_url, validate_text};
use crate::{Error, LeaseMode, LeaseStore, Result, Session, SessionLoad};
use connection::Held;
use decide::{claim_failure, claim_outlived_session, counts_in_load, is_fleet_work, moves_with_session, ClaimFailure};
use report::{Counters, Reporter};

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

/// Timing and limits of a worker (see the builder methods for each).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) max_connections: usize,
    pub(crate) orphan_interval: Duration,
    pub(crate) desired_state_interval: Duration,
    pub(crate) metrics_interval: Duration,
    pub(crate) handler_grace: Duration,
    /// Session mode: claim at most a fair share of the fleet's work, hand the excess over.
    pub(crate) balance: bool,
}

/// Builds a [`Worker`]; every knob has the design's default.
pub struct WorkerBuilder {
    store: Arc<dyn LeaseStore>,
    worker_id: Option<String>,
    settings: Settings,
    hints: Option<HintQueue>,
    hint_wait: Duration,
    metrics_writer: Option<Box<dyn Write + Send>>,
    metrics_namespace: String,
}

impl WorkerBuilder {
    /// The owner name written into leases (default: host, pid and a random suffix).
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
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
        self.metrics_namespace = namespace.into();
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

    /// Receive START hints from this SQS queue (long poll, [`DEFAULT_HINT_WAIT`]).
    pub fn hint_queue(mut self, client: aws_sdk_sqs::Client, queue_url: impl Into<String>) -> Self {
        self.hints = Some(HintQueue { client, queue_url: queue_url.into(), wait: DEFAULT_HINT_WAIT });
        self
    }

    /// The long-poll wait of the hint queue (default and most 20 s).
    pub fn hint_wait(mut self, d: Duration) -> Self {
        self.hint_wait = d;
        self
    }

    /// Builds the worker with `handler`, called once per claimed lease. The handler's return
    /// (`Ok` or `Err`) releases the lease; so does a panic, which does not stop the worker.
    pub fn build<H, Fut, E>(mut self, handler: H) -> Result<Worker>
    where
        H: Fn(Connection) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        if let Some(h) = &mut self.hints {
            h.wait = self.hint_wait;
        }
        let s = &self.settings;
        let invalid = |field: &str, msg: String| Err(Error::invalid(field, msg));
        if !(1..=MAX_CONNECTIONS_LIMIT).contains(&s.max_connections) {
            return invalid(
                "max_connections",
                format!("{} is out of range: 1 to {MAX_CONNECTIONS_LIMIT}", s.max_connections),
            );
        }
        for (field, d) in [
            ("orphan_interval", s.orphan_interval),
            ("desired_state_interval", s.desired_state_interval),
            ("metrics_interval", s.metrics_interval),
            ("handler_grace", s.handler_grace),
        ] {
            validate_duration(field, d)?;
            if d.is_zero() && field != "handler_grace" {
                return invalid(field, "must be greater than zero".into());
            }
        }
        if self.hint_wait > MAX_HINT_WAIT {
            return invalid("hint_wait", format!("{} ms is too long: at most 20000 ms", self.hint_wait.as_millis()));
        }
        if let Some(h) = &self.hints {
            validate_queue_url(&h.queue_url)?;
        }
        validate_text("metrics_namespace", &self.metrics_namespace, 255)?;
        if self.metrics_namespace.is_empty() {
            return invalid("metrics_namespace", "must not be empty".into());
        }
        let worker_id = self.worker_id.unwrap_or_else(default_worker_id);
        validate_id("worker_id", &worker_id)?;
        let handler: Handler = Arc::new(move |conn| {
            let fut = handler(conn);
            Box::pin(async move { fut.await.map_err(Into::into) })
        });
        let (new_leases, new_leases_rx) = mpsc::unbounded_channel();
        let max_connections = self.settings.max_connections;
        let inner = Arc::new(Inner {
            store: self.store,
            id: worker_id,
            permits: Arc::new(Semaphore::new(self.settings.max_connections)),
            settings: self.settings,
            handler,
            leases: Mutex::new(Leases::default()),
            counters: Counters::default(),
            shutdown: CancellationToken::new(),
            finished: CancellationToken::new(),
            new_leases,
            hand_over: self.hints.clone(),
            poll_orphans_now: tokio::sync::Notify::new(),
            session: Mutex::new(None),
            reclaim_own: std::sync::atomic::AtomicBool::new(false),
            unsettled: Mutex::new(std::collections::BTreeSet::new()),
            claim_limit: AtomicUsize::new(max_connections),
            balancer: Mutex::new(decide::Balancer::default()),
            balance_changed: tokio::sync::Notify::new(),
            claims: AtomicU64::new(0),
            renew_now: tokio::sync::Notify::new(),
            hand_over_rounds: AtomicU64::new(0),
        });
        let writer = self.metrics_writer.unwrap_or_else(|| Box::new(std::io::stdout()));
        Ok(Worker {
            inner,
            new_leases: new_leases_rx,
            hints: self.hints,
            reporter: Reporter::new(self.metrics_namespace, writer),
        })
    }
}

/// host-pid-random: unique per process, and readable in the table.
pub fn default_worker_id() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let host = if host.is_empty() { "worker".to_string() } else { host };
    format!("{host}-{}-{:06x}", std::process::id(), rand::random::<u32>() & 0xff_ffff)
}

/// What is tracked per id: a claim in flight, or a held lease.
#[derive(Debug)]
enum Tracked {
    Claiming,
    Held(Arc<Held>),
}

#[derive(Debug, Default)]
struct Leases {
    by_id: HashMap<String, Tracked>,
    /// Set once shutdown began: a claim that lands afterwards is cancelled at once.
    stopping: bool,
}

/// How a claim attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    Claimed,
    AlreadyOurs,
    NoCapacity,
    Stopping,
    Conflict,
    Failed,
}

/// The claim source of our own earlier epochs' work.
pub(crate) const RECLAIM_OWN: &str = "own earlier epoch";

/// A new lease for the run loop to supervise, with the capacity it takes.
type NewLease = (Arc<Held>, OwnedSemaphorePermit);

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn LeaseStore>,
    pub(crate) id: String,
    pub(crate) settings: Settings,
    handler: Handler,
    leases: Mutex<Leases>,
    /// One permit per lease that may still be held.
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) counters: Counters,
    /// Fires when shutdown is requested: the loops stop claiming.
    pub(crate) shutdown: CancellationToken,
    /// Fires when `run_until` has returned.
    finished: CancellationToken,
    new_leases: mpsc::UnboundedSender<NewLease>,
    /// Where running work released on shutdown is hinted, so the fleet claims it at once.
    pub(crate) hand_over: Option<HintQueue>,
    /// Wakes the orphan loop early (hints arrived: more work may be waiting in the index).
    pub(crate) poll_orphans_now: tokio::sync::Notify,
    /// Session mode: the live session, if any.
    session: Mutex<Option<Session>>,
    /// Session mode: a new epoch was opened; the orphan loop claims back our older epochs' work.
    pub(crate) reclaim_own: std::sync::atomic::AtomicBool,
    /// Ids whose claim failed with its outcome unknown (the write may have landed and name us
    /// with nobody renewing it): the orphan loop releases those it finds ours and not tracked.
    pub(crate) unsettled: Mutex<std::collections::BTreeSet<String>>,
    /// Session mode with balance: the most this worker may hold after a claim (its fair
    /// share), set by every orphan poll.
    pub(crate) claim_limit: AtomicUsize,
    /// Session mode with balance: what the orphan polls (and the hint loop's refreshes)
    /// remember from one listing of the sessions to the next.
    pub(crate) balancer: Mutex<decide::Balancer>,
    /// Fires when the claim limit was set again (the hint loop waits on it while at the limit).
    pub(crate) balance_changed: tokio::sync::Notify,
    /// Claims so far: the order of each held lease's claim.
    claims: AtomicU64,
    /// Asks the session loop for a renewal now (a hand-over round is waiting on it).
    pub(crate) renew_now: tokio::sync::Notify,
    /// Hand-over rounds so far.
    hand_over_rounds: AtomicU64,
}

impl Inner {
    pub(crate) fn session_mode(&self) -> bool {
        self.store.config().mode == LeaseMode::Session
    }

    /// The live session (session mode).
    pub(crate) fn current_session(&self) -> Option<Session> {
        self.session.lock().expect("session poisoned").clone()
    }

    /// A renewed (or new) session: every connection held under it acts until its new deadline.
    pub(crate) fn set_session(&self, session: Option<Session>) {
        let leases = self.leases.lock().expect("leases poisoned");
        if let Some(s) = &session {
            for t in leases.by_id.values() {
                if let Tracked::Held(h) = t {
                    // Only work claimed under this epoch and not already given up moves along.
                    if moves_with_session(h.session_epoch, h.cancel.reason(), s) {
                        h.deadline_mono_ms.fetch_max(s.deadline_mono_ms, std::sync::atomic::Ordering::SeqCst);
                    }
                }
            }
        }
        *self.session.lock().expect("session poisoned") = session;
    }

    /// Rule 2 on the session: its deadline passed (or it was lost), so every handler stops.
    pub(crate) fn lose_session(&self, reason: CancelReason) {
        let leases = self.leases.lock().expect("leases poisoned");
        *self.session.lock().expect("session poisoned") = None;
        for t in leases.by_id.values() {
            if let Tracked::Held(h) = t {
                h.cancel.cancel(reason);
            }
        }
    }

    /// Session mode with balance on.
    pub(crate) fn balanced(&self) -> bool {
        self.settings.balance && self.session_mode()
    }

    /// What the session reports: the work held or being claimed here (not what is being
    /// handed over, stopped or lost) and `max_connections`.
    pub(crate) fn balancer(&self) -> std::sync::MutexGuard<'_, decide::Balancer> {
        self.balancer.lock().expect("balancer poisoned")
    }

    pub(crate) fn load(&self) -> SessionLoad {
        let leases = self.leases.lock().expect("leases poisoned");
        let held = leases
            .by_id
            .values()
            .filter(|t| match t {
                Tracked::Claiming => true,
                Tracked::Held(h) => counts_in_load(h.cancel.reason(), h.handing_over.load(Ordering::SeqCst) != 0),
            })
            .count();
        SessionLoad { held: held as u64, max_connections: self.settings.max_connections as u64 }
    }

    /// Claims that fit now: the free capacity, and with balance the room below the claim limit.
    pub(crate) fn room(&self) -> usize {
        let capacity = self.permits.available_permits();
        if !self.balanced() {
            return capacity;
        }
        capacity.min(self.claim_limit.load(Ordering::SeqCst).saturating_sub(self.tracked()))
    }

    /// Whether a claim now would be within the claim limit (always, without balance).
    pub(crate) fn below_claim_limit(&self) -> bool {
        !self.balanced() || self.tracked() < self.claim_limit.load(Ordering::SeqCst)
    }

    /// Picks `count` held connections to hand over ([`decide::hand_over_picks`]) and asks for a
    /// session renewal at once: it reports them as no longer held, and once it has landed their
    /// handlers are cancelled with [`CancelReason::HandOver`] ([`Inner::start_hand_overs`]);
    /// each lease task then releases and hints its connection. Returns the ids.
    pub(crate) fn hand_over(&self, count: usize) -> Vec<String> {
        let leases = self.leases.lock().expect("leases poisoned");
        let candidates: Vec<(String, u64, u64)> = leases
            .by_id
            .values()
            .filter_map(|t| match t {
                Tracked::Held(h) if h.cancel.reason().is_none() && h.handing_over.load(Ordering::SeqCst) == 0 => {
                    Some((h.id.clone(), h.fence, h.claim_order))
                }
                _ => None,
            })
            .collect();
        let picks = decide::hand_over_picks(&candidates, count);
        let round = self.hand_over_rounds.fetch_add(1, Ordering::SeqCst) + 1;
        for id in &picks {
            if let Some(Tracked::Held(h)) = leases.by_id.get(id) {
                h.handing_over.store(round, Ordering::SeqCst);
            }
        }
        if !picks.is_empty() {
            self.renew_now.notify_one();
        }
        picks
    }

    /// The latest hand-over round: a session renewal reads it before it reads the load.
    pub(crate) fn hand_over_round(&self) -> u64 {
        self.hand_over_rounds.load(Ordering::SeqCst)
    }

    /// A session renewal that read `round` has reported the connections picked up to that
    /// round as gone: cancel their handlers.
    pub(crate) fn start_hand_overs(&self, round: u64) {
        let leases = self.leases.lock().expect("leases poisoned");
        for t in leases.by_id.values() {
            if let Tracked::Held(h) = t {
                let picked = h.handing_over.load(Ordering::SeqCst);
                if picked != 0 && picked <= round {
                    h.cancel.cancel(CancelReason::HandOver);
                }
            }
        }
    }

    /// Ids held or being claimed here.
    pub(crate) fn tracked(&self) -> usize {
        self.leases.lock().expect("leases poisoned").by_id.len()
    }

    /// Whether `id` is held or being claimed here.
    pub(crate) fn is_tracked(&self, id: &str) -> bool {
        self.leases.lock().expect("leases poisoned").by_id.contains_key(id)
    }

    /// Tries to claim `id`: needs capacity, must not be ours already, and the store decides.
    pub(crate) async fn claim(&self, id: &str, source: &'static str) -> Claim {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            return Claim::NoCapacity;
        };
        {
            let mut leases = self.leases.lock().expect("leases poisoned");
            if leases.stopping {
                return Claim::Stopping;
            }
            if leases.by_id.contains_key(id) {
                return Claim::AlreadyOurs;
            }
            // Our own earlier epochs' work is taken back whatever the share (nobody else sees it
            // as orphaned while we live); the excess is then handed over like any other.
            let limited = self.balanced() && source != RECLAIM_OWN;
            if limited && leases.by_id.len() >= self.claim_limit.load(Ordering::SeqCst) {
                return Claim::NoCapacity;
            }
            leases.by_id.insert(id.to_string(), Tracked::Claiming);
        }
        let session = self.current_session();
        let acquired = match (&session, self.session_mode()) {
            (_, false) => self.store.acquire_started(id, &self.id).await,
            (Some(session), true) => self.store.claim_in_session(id, session).await,
            (None, true) => {
                self.leases.lock().expect("leases poisoned").by_id.remove(id);
                return Claim::Failed;
            }
        };
        let lease = match acquired {
            Ok(lease) if is_fleet_work(&lease) => lease,
            Ok(lease) => {
                self.leases.lock().expect("leases poisoned").by_id.remove(id);
                debug!(connection_id = %id, desired_state = ?lease.desired_state, "not running work, giving it back");
                if let Err(e) = self.store.release(&lease).await {
                    warn!(connection_id = %id, error = %e, "release of non-running work failed");
                }
                self.counters.add(&self.counters.acquire_conflicts, 1);
                return Claim::Conflict;
            }
            Err(e) => {
                self.leases.lock().expect("leases poisoned").by_id.remove(id);
                if matches!(e, Error::Timeout { outcome_unknown: true }) {
                    self.unsettled.lock().expect("unsettled poisoned").insert(id.to_string());
                }
                return match claim_failure(&e) {
                    ClaimFailure::Conflict => {
                        debug!(connection_id = %id, source, reason = %e, "claim conflict");
                        self.counters.add(&self.counters.acquire_conflicts, 1);
                        Claim::Conflict
                    }
                    ClaimFailure::Error => {
                        warn!(connection_id = %id, source, error = %e, "claim failed");
                        self.counters.add(&self.counters.acquire_errors, 1);
                        Claim::Failed
                    }
                };
            }
        };
        let fence = lease.fence;
        let order = self.claims.fetch_add(1, Ordering::SeqCst);
        let held = Arc::new(Held::new(lease, session.as_ref().map(|s| s.epoch), order));
        {
            let mut leases = self.leases.lock().expect("leases poisoned");
            leases.by_id.insert(id.to_string(), Tracked::Held(held.clone()));
            if leases.stopping {
                held.cancel.cancel(CancelReason::Shutdown);
            }
            // The session was lost (or a new epoch began) while the claim was in flight.
            let session_now = self.session.lock().expect("session poisoned").clone();
            let epoch_now = session_now.as_ref().map(|s| s.epoch);
            if self.session_mode() && claim_outlived_session(held.session_epoch, epoch_now) {
                held.cancel.cancel(CancelReason::Deadline);
            }
            // Session cover reaches claims in flight: a renewal that landed while the claim's
            // answer was on its way moves this claim's deadline too (the leases lock orders it
            // with `set_session`, which moves only what is already held).
            if let Some(s) = session_now.filter(|s| moves_with_session(held.session_epoch, held.cancel.reason(), s)) {
                held.deadline_mono_ms.fetch_max(s.deadline_mono_ms, Ordering::SeqCst);
            }
        }
        self.counters.add(&self.counters.acquired, 1);
        info!(connection_id = %id, fence, source, worker_id = %self.id, "claimed");
        if self.new_leases.send((held, permit)).is_err() {
            // The run loop is gone (the worker was dropped): nothing will supervise it.
            self.leases.lock().expect("leases poisoned").by_id.remove(id);
        }
        Claim::Claimed
    }

    /// The held leases (not the claims in flight).
    pub(crate) fn held(&self) -> Vec<Arc<Held>> {
        let leases = self.leases.lock().expect("leases poisoned");
        leases
            .by_id
            .values()
            .filter_map(|t| match t {
                Tracked::Held(h) => Some(h.clone()),
                Tracked::Claiming => None,
            })
            .collect()
    }

    /// Forgets `held` once its task has ended (only if the entry is still this claim).
    pub(crate) fn forget(&self, held: &Arc<Held>) {
        let mut leases = self.leases.lock().expect("leases poisoned");
        if matches!(leases.by_id.get(&held.id), Some(Tracked::Held(h)) if Arc::ptr_eq(h, held)) {
            leases.by_id.remove(&held.id);
        }
    }

    /// Stops new claims from running and cancels every held lease's handler; returns their ids.
    fn stop_all(&self) -> Vec<String> {
        let held = {
            let mut leases = self.leases.lock().expect("leases poisoned");
            leases.stopping = true;
            leases
                .by_id
                .values()
                .filter_map(|t| if let Tracked::Held(h) = t { Some(h.clone()) } else { None })
                .collect::<Vec<_>>()
        };
        for h in &held {
            h.cancel.cancel(CancelReason::Shutdown);
        }
        held.iter().map(|h| h.id.clone()).collect()
    }

    fn snapshot(&self) -> WorkerSnapshot {
        let mut held: Vec<String> = self.held().iter().map(|h| h.id.clone()).collect();
        held.sort();
        let c = self.counters.totals();
        WorkerSnapshot {
            worker_id: self.id.clone(),
            max_connections: self.settings.max_connections,
            held,
            acquired: c.acquired,
            acquire_conflicts: c.acquire_conflicts,
            acquire_errors: c.acquire_errors,
            leases_lost: c.leases_lost,
            released: c.released,
            handler_errors: c.handler_errors,
            handler_panics: c.handler_panics,
            orphan_polls: c.orphan_polls,
            hints_received: c.hints_received,
            session_epoch: self.current_session().map(|s| s.epoch),
            session_takeovers: c.session_takeovers,
            handed_over: c.handed_over,
            claim_limit: self.balanced().then(|| self.claim_limit.load(Ordering::SeqCst)),
            stopping: self.shutdown.is_cancelled(),
        }
    }
}

/// A point-in-time view of a worker (counters are totals since start).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WorkerSnapshot {
    pub worker_id: String,
    pub max_connections: usize,
    /// Ids whose lease this worker holds, sorted.
    pub held: Vec<String>,
    pub acquired: u64,
    pub acquire_conflicts: u64,
    pub acquire_errors: u64,
    /// Lost to another owner or past the deadline.
    pub leases_lost: u64,
    pub released: u64,
    pub handler_errors: u64,
    pub handler_panics: u64,
    pub orphan_polls: u64,
    pub hints_received: u64,
    /// Session mode: the epoch of the live session.
    pub session_epoch: Option<u64>,
    /// Session mode: connections claimed from dead sessions.
    pub session_takeovers: u64,
    /// Session mode: connections handed over to balance the fleet.
    pub handed_over: u64,
    /// Session mode with balance: the most this worker may hold after a claim now.
    pub claim_limit: Option<usize>,
    pub stopping: bool,
}

/// Controls a running worker from elsewhere (the CLI, tests): trigger shutdown, read a snapshot.
#[derive(Clone)]
pub struct WorkerHandle {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHandle").field("worker_id", &self.inner.id).finish()
    }
}

impl WorkerHandle {
    pub fn worker_id(&self) -> &str {
        &self.inner.id
    }

    /// Starts the shutdown path: stop claiming, cancel handlers, release every lease.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }

    pub fn snapshot(&self) -> WorkerSnapshot {
        self.inner.snapshot()
    }

    /// Ids held now, sorted.
    pub fn held_ids(&self) -> Vec<String> {
        self.inner.snapshot().held
    }

    /// Resolves once the worker's run has returned.
    pub async fn finished(&self) {
        self.inner.finished.cancelled().await
    }
}

/// A lease worker; see the module docs.
pub struct Worker {
    inner: Arc<Inner>,
    new_leases: mpsc::UnboundedReceiver<NewLease>,
    hints: Option<HintQueue>,
    reporter: Reporter,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("worker_id", &self.inner.id).field("settings", &self.inner.settings).finish()
    }
}

impl Worker {
    pub fn builder(store: Arc<dyn LeaseStore>) -> WorkerBuilder {
        WorkerBuilder {
            store,
            worker_id: None,
            settings: Settings {
                max_connections: DEFAULT_MAX_CONNECTIONS,
                orphan_interval: DEFAULT_ORPHAN_INTERVAL,
                desired_state_interval: DEFAULT_DESIRED_STATE_INTERVAL,
                metrics_interval: DEFAULT_METRICS_INTERVAL,
                handler_grace: DEFAULT_HANDLER_GRACE,
                balance: true,
            },
            hints: None,
            hint_wait: DEFAULT_HINT_WAIT,
            metrics_writer: None,
            metrics_namespace: crate::metrics::NAMESPACE.to_string(),
        }
    }

    pub fn worker_id(&self) -> &str {
        &self.inner.id
    }

    pub fn handle(&self) -> WorkerHandle {
        WorkerHandle { inner: self.inner.clone() }
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

    /// Runs until `shutdown` resolves (or [`WorkerHandle::shutdown`]), then stops claiming,
    /// cancels every handler, waits for them (at most `handler_grace` each, then aborts them),
    /// releases every lease in parallel and returns the final snapshot.
    ///
    /// Dropping this future instead (or aborting its task) is a crash: every task stops at once
    /// and no lease is released, so other workers take over after the expiry.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> WorkerSnapshot {
        let Worker { inner, mut new_leases, hints, reporter } = self;
        let reporter = Arc::new(reporter);
        let mut tasks = JoinSet::new();
        let mut lease_tasks = JoinSet::new();
        tasks.spawn(reconcile::orphan_loop(inner.clone()));
        tasks.spawn(reconcile::desired_state_loop(inner.clone()));
        tasks.spawn(report::metrics_loop(inner.clone(), reporter.clone()));
        if let Some(queue) = hints {
            tasks.spawn(hints::hint_loop(inner.clone(), queue));
        }
        let session_stop = CancellationToken::new();
        // Dropping `run_until` (a crash) stops the heartbeat too.
        let mut session_task = inner
            .session_mode()
            .then(|| AbortOnDrop(tokio::spawn(session::session_loop(inner.clone(), session_stop.clone()))));
        info!(worker_id = %inner.id, max_connections = inner.settings.max_connections, "worker started");
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                () = inner.shutdown.cancelled() => break,
                Some((held, permit)) = new_leases.recv() => {
                    lease_tasks.spawn(lease_task::supervise(inner.clone(), held, permit));
                }
                Some(joined) = lease_tasks.join_next() => log_task_end(joined),
                Some(joined) = tasks.join_next() => log_task_end(joined),
            }
        }
        info!(worker_id = %inner.id, held = inner.held().len(), "shutting down");
        inner.shutdown.cancel();
        let held_at_shutdown = inner.stop_all();
        // Session mode: the one session write frees everything, so it comes once no claim is in
        // flight and every handler has returned (not after the loops: a long poll may be pending).
        if let Some(task) = session_task.as_mut() {
            while inner.tracked() > 0 || !new_leases.is_empty() {
                tokio::select! {
                    biased;
                    Some((held, permit)) = new_leases.recv() => {
                        lease_tasks.spawn(lease_task::supervise(inner.clone(), held, permit));
                    }
                    Some(joined) = lease_tasks.join_next() => log_task_end(joined),
                    // A claim in flight sends no event when it fails: look again shortly.
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
            session_stop.cancel();
            let _ = (&mut task.0).await;
            end_session(&inner, &held_at_shutdown).await;
        }
        // Claims already in flight still land (and are cancelled at once); every lease task
        // waits for its handler and releases its lease, all of them at the same time.
        while !(tasks.is_empty() && lease_tasks.is_empty() && new_leases.is_empty()) {
            tokio::select! {
                biased;
                Some((held, permit)) = new_leases.recv() => {
                    lease_tasks.spawn(lease_task::supervise(inner.clone(), held, permit));
                }
                Some(joined) = lease_tasks.join_next(), if !lease_tasks.is_empty() => log_task_end(joined),
                Some(joined) = tasks.join_next(), if !tasks.is_empty() => log_task_end(joined),
            }
        }
        let snapshot = inner.snapshot();
        reporter.emit(&inner);
        info!(worker_id = %inner.id, released = snapshot.released, "worker stopped");
        inner.finished.cancel();
        snapshot
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Session mode's graceful end: one write (session expiry 0) frees everything still held, then
/// the work is hinted to the fleet. No per-connection write is waited for.
async fn end_session(inner: &Inner, ids: &[String]) {
    let Some(session) = inner.current_session() else { return };
    // The end reports what it frees: a peer at its share counts it when the hints arrive.
    let freed = SessionLoad { held: ids.len() as u64, max_connections: inner.settings.max_connections as u64 };
    match inner.store.end_session_reporting(&session, freed).await {
        Ok(()) => info!(worker_id = %inner.id, epoch = session.epoch, "session ended"),
        Err(e) => warn!(worker_id = %inner.id, error = %e, "session end failed; it will expire"),
    }
    inner.set_session(None);
    if let Some(queue) = &inner.hand_over {
        futures::future::join_all(ids.iter().map(|id| hints::hand_over(queue, id))).await;
    }
}

fn log_task_end(joined: std::result::Result<(), tokio::task::JoinError>) {
    if let Err(e) = joined {
        if e.is_panic() {
            error!(error = %e, "worker task panicked");
        }
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
}
