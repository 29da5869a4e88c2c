//! The engine's I/O vocabulary: what a driver is told to do ([`Command`], [`Op`]), what it
//! answers ([`Event`], [`Answer`]), the time it passes in ([`Now`]) and the worker's settings.

#[allow(unused_imports)]
use super::*;

/// An operation's id, echoed back with its answer.
pub type OpId = u64;

/// The time of a call: the store clock's wall (epoch ms) and monotonic ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Now {
    pub wall_ms: u64,
    pub mono_ms: u64,
}

/// A worker's settings, as the engine needs them.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Settings {
    pub worker_id: String,
    pub max_connections: usize,
    pub orphan_interval_ms: u64,
    pub desired_state_interval_ms: u64,
    pub metrics_interval_ms: u64,
    /// How long a cancelled handler may take to return before it is aborted.
    pub handler_grace_ms: u64,
    /// Session mode: claim at most a fair share and hand the excess over.
    pub balance: bool,
    /// A hint queue is there: receive hints, and hint released work to the fleet.
    pub hints: bool,
    /// The long-poll wait of one receive.
    pub hint_wait_ms: u64,
    /// How far behind the table the owner index may be ([`decide::DEFAULT_INDEX_LAG`]): an empty
    /// listing of a dead session's work retires it only when sent this long after its last write.
    #[serde(default = "default_index_lag_ms")]
    pub index_lag_ms: u64,
    /// Claims wait until the store's clock is known within this ([`Event::StoreClock`]);
    /// `None`: claims do not wait for it (the clock is the store's own, or the check is off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_tolerance_ms: Option<u64>,
}

fn default_index_lag_ms() -> u64 {
    decide::DEFAULT_INDEX_LAG.as_millis() as u64
}

impl Settings {
    /// A worker `worker_id` of `max_connections` with the design's defaults (balance on, no
    /// hint queue).
    pub fn new(worker_id: impl Into<String>, max_connections: usize) -> Self {
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        Self {
            worker_id: worker_id.into(),
            max_connections,
            orphan_interval_ms: ms(decide::DEFAULT_ORPHAN_INTERVAL),
            desired_state_interval_ms: ms(decide::DEFAULT_DESIRED_STATE_INTERVAL),
            metrics_interval_ms: ms(decide::DEFAULT_METRICS_INTERVAL),
            handler_grace_ms: ms(decide::DEFAULT_HANDLER_GRACE),
            balance: true,
            hints: false,
            hint_wait_ms: ms(decide::DEFAULT_HINT_WAIT),
            index_lag_ms: ms(decide::DEFAULT_INDEX_LAG),
            clock_tolerance_ms: None,
        }
    }
}

/// A store operation for the driver to run. `Renew`, `Release` and `RenewSession` name work
/// the driver holds a copy of (a held lease's copy moves with the handler's checkpoints).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Acquire STARTED work: per-item (`session` absent) or under the session; `listed`: the
    /// work as read under a dead session, taken over with the first request.
    Claim {
        id: String,
        session: Option<Session>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        listed: Option<Listed>,
    },
    /// Renew the held copy of `id`; give the request up (sending nothing else) at
    /// `until_mono_ms`, its deadline.
    Renew {
        id: String,
        until_mono_ms: u64,
    },
    /// Release the held copy of `id`.
    Release {
        id: String,
    },
    /// Release a lease not held here (work that is not running, a claim whose answer was lost).
    ReleaseLease {
        lease: Lease,
    },
    Get {
        id: String,
    },
    /// One page of orphans; with a sharded orphan index, read from `first_shard` first
    /// ([`crate::LeaseStore::orphans_page_from`]; absent: from the shard the cutoff picks).
    OrphansPage {
        cutoff_ms: u64,
        page_size: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        first_shard: Option<u32>,
    },
    Sessions,
    OwnedBy {
        owner: String,
    },
    RetireSession {
        owner: String,
        epoch: u64,
    },
    CreateSession {
        previous: Option<u64>,
    },
    /// Renew the session reporting `load`; give it up at `until_mono_ms` (the session's deadline).
    RenewSession {
        session: Session,
        load: SessionLoad,
        until_mono_ms: u64,
    },
    EndSession {
        session: Session,
        load: SessionLoad,
    },
    DesiredStates {
        ids: Vec<String>,
    },
    /// Take over, in one transaction, connections `listed` (2 to
    /// [`crate::protocol::TAKE_OVER_MAX`]) as read under the dead session `epoch` of `owner`
    /// ([`crate::LeaseStore::take_over_listed`]): the claims the engine started for them, sent
    /// together. Answered [`Answer::TakenOver`] (or `Failed`); each connection it leaves is then
    /// claimed on its own.
    TakeOver {
        owner: String,
        epoch: u64,
        session: Session,
        listed: Vec<LeaseItem>,
    },
}

/// Work read under a dead session: the item as [`Op::OwnedBy`] answered it and the epoch of the
/// dead session it was listed under. The claim's first request is the takeover transaction
/// ([`crate::protocol::ClaimInSession::takeover`]), not an UpdateItem that the item's held
/// sentinel refuses first: one request per connection taken over instead of two.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Listed {
    pub epoch: u64,
    pub item: LeaseItem,
}

impl Op {
    /// Reads change nothing: at the end of a run the driver drops those still in flight.
    pub fn is_read(&self) -> bool {
        matches!(
            self,
            Op::Get { .. } | Op::OrphansPage { .. } | Op::Sessions | Op::OwnedBy { .. } | Op::DesiredStates { .. }
        )
    }
}

/// An operation's answer.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// `Claim`: the lease claimed. `Renew`: the lease as renewed.
    Lease(Lease),
    /// `Release`, `ReleaseLease`, `RetireSession`, `EndSession`.
    Done,
    Item(Option<LeaseItem>),
    Orphans {
        items: Vec<LeaseItem>,
        full: bool,
    },
    Sessions(Vec<SessionItem>),
    Owned(Vec<LeaseItem>),
    /// `CreateSession`, `RenewSession`.
    Session(Session),
    DesiredStates(BTreeMap<String, Option<crate::DesiredState>>),
    /// `TakeOver`: per listed connection in order, the lease, or `None` where it was left.
    TakenOver(Vec<Option<Lease>>),
    Failed(Error),
}

/// One hint message as received.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HintMessage {
    /// What settles it (SQS: the receipt handle).
    pub receipt: String,
    pub body: Option<String>,
}

/// How a handler ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandlerEnd {
    Returned,
    Failed,
    Panicked,
    /// Cancelled, it did not return within the grace period and was aborted.
    Aborted,
}

/// What happened, for [`Engine::handle`].
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    Answer {
        op: OpId,
        answer: Answer,
    },
    /// The answer to [`Command::ReceiveHints`]: the messages, or why the receive failed.
    Hints {
        received: Result<Vec<HintMessage>, String>,
    },
    /// `reason`: why its token fired, as the driver saw it (a checkpoint can find the lease lost).
    HandlerEnded {
        id: String,
        end: HandlerEnd,
        reason: Option<CancelReason>,
    },
    Shutdown,
    /// The store's clock as measured now: its offset to the local wall clock and the
    /// uncertainty of that (the driver sends it when it changes; see [`crate::StoreClock`]).
    StoreClock {
        offset_ms: i64,
        uncertainty_ms: u64,
    },
}

/// What the driver does next, from [`Engine::poll_command`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Command {
    Run {
        op: OpId,
        request: Op,
    },
    /// Start a handler for `lease`, just claimed: the driver keeps its copy from now on.
    StartHandler {
        lease: Lease,
    },
    /// Fire the handler's token with `reason` (the first reason wins).
    CancelHandler {
        id: String,
        reason: CancelReason,
    },
    /// The handler ignored its cancellation for the grace period: stop it.
    AbortHandler {
        id: String,
    },
    /// A session renewal covers the lease: its deadline moves to `deadline_mono_ms`.
    SetDeadline {
        id: String,
        deadline_mono_ms: u64,
    },
    /// The lease is no longer held: fire its token with `Released` and drop the copy.
    Forget {
        id: String,
    },
    /// One long poll of the hint queue; answer with [`Event::Hints`].
    ReceiveHints {
        max: usize,
        wait_ms: u64,
    },
    /// Delete the handled hints; make those this worker had no room for visible again at once
    /// (`give_back`), and those it would not take at its fair share after `defer_ms` (`defer`):
    /// given back at once, a hint for work every worker at its share declines would go round
    /// the fleet without end, each receive costing a read of the sessions.
    SettleHints {
        delete: Vec<String>,
        give_back: Vec<String>,
        defer: Vec<String>,
        defer_ms: u64,
    },
    /// Hint released work to the fleet (best effort, no answer): the message body is
    /// [`Hint::of_ended_session`]`(id, ended)` ([`Command::hint_body`]). `ended`: the work is
    /// held under this worker's session, which it has ended (a graceful shutdown in session
    /// mode).
    SendHint {
        id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ended: Option<crate::EndedSession>,
    },
    /// Write a metrics line from [`Engine::take_metrics`].
    EmitMetrics,
    /// The run is over (after a shutdown): nothing more will be asked.
    Finished,
}

impl Command {
    /// The hint message body a [`Command::SendHint`] sends.
    pub fn hint_body(id: &str, ended: Option<&crate::EndedSession>) -> String {
        Hint::of_ended_session(id, ended.cloned()).to_json()
    }
}

/// How a claim attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    Claimed,
    AlreadyOurs,
    NoCapacity,
    /// Balance: this worker holds its fair share; the work is another's to take.
    AtLimit,
    Stopping,
    /// The store's clock is not known closely enough to decide a claim.
    ClockUntrusted,
    Conflict,
    Failed,
}
