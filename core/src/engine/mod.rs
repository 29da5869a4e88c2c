//! The worker engine: everything a worker decides, as one state machine without I/O.
//!
//! It owns the tracked work (claims in flight, held leases and their [`Keeper`]s, claims whose
//! answer was lost), the claim limit and the balance, the session (epochs, renewals, the cover
//! they give every held lease, claims in flight included), hand-over rounds, the orphan polls,
//! the hint batches, the desired-state checks, shutdown and the counters a snapshot reports.
//! A driver does the I/O:
//!
//! - [`Engine::poll_command`] says what to do: run a store operation ([`Op`], with an id to echo
//!   back), receive, settle or send hints, start, cancel or abort a handler, move a held lease's
//!   deadline, forget a lease, write a metrics line;
//! - [`Engine::handle`] takes what happened ([`Event`]): an operation's answer, hints received,
//!   a handler that ended, a shutdown request;
//! - [`Engine::poll_timeout`] says when to call [`Engine::handle_timeout`] next.
//!
//! Time comes in with every call ([`Now`]: wall and monotonic ms of the store's clock) and
//! randomness from a seeded source, so a run is a function of its inputs: the tokio worker
//! drives it, tests drive it on a manual clock, and trace vectors (events in, commands out) are
//! replayed by every driver.

pub mod decide;
mod execute;
pub mod explore;
pub mod sim;
pub mod trace;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use tracing::{debug, info, warn};

pub use execute::execute;

use crate::keeper::{Keeper, Renewal, Upkeep, Wake};
use crate::{Error, Hint, Lease, LeaseItem, LeaseMode, Session, SessionItem, SessionLoad, TableConfig};
use decide::{
    balance_pace_ms, claim_failure, claim_outlived_session, counts_as_lost, counts_in_load, dead_session_owners,
    desired_state_phase_ms, hint_batch_size, hint_retry_ms, is_fleet_work, jittered_ms, moves_with_session,
    orphan_counts, orphan_query_cutoff, orphan_retry_ms, plan_orphans, releases_after_handler, session_retry_ms,
    session_wake_at, stopped_ids, unowned_estimate, Balancer, CancelReason, ClaimFailure, FleetView, OrphanPoll,
    PeerSession, CLAIM_CONCURRENCY, HINT_CLAIM_CONCURRENCY, HINT_POLL_OVERLAP_MS, HINT_ROUND_WAIT_MS,
};

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
    /// Hint released work to the fleet (best effort, no answer).
    SendHint {
        id: String,
    },
    /// Write a metrics line from [`Engine::take_metrics`].
    EmitMetrics,
    /// The run is over (after a shutdown): nothing more will be asked.
    Finished,
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

/// Where a claim came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Orphan,
    DeadSession,
    /// Our own earlier epochs' work: claimed whatever the share.
    ReclaimOwn,
    Hint,
    /// A hint for work held under a session nobody lists ([`Hint::stranded`]): claimed
    /// whatever the share, as no view of the fleet counts it.
    Stranded,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::Orphan => "orphan",
            Source::DeadSession => "dead session",
            Source::ReclaimOwn => "own earlier epoch",
            Source::Hint => "hint",
            Source::Stranded => "stranded hint",
        }
    }
}

/// The engine's counters (totals since the start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Totals {
    pub acquired: u64,
    pub acquire_conflicts: u64,
    pub acquire_errors: u64,
    pub leases_lost: u64,
    pub released: u64,
    pub handler_errors: u64,
    pub handler_panics: u64,
    pub orphan_polls: u64,
    pub hints_received: u64,
    pub session_takeovers: u64,
    /// Takeover transactions answered ([`Op::TakeOver`]: several connections each).
    pub takeover_transactions: u64,
    pub handed_over: u64,
}

/// What a metrics line reports: the totals, what is held, and the latencies since the last one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    pub totals: Totals,
    pub held: usize,
    pub session_live: bool,
    pub renew_latency_ms: Vec<u64>,
    pub session_renew_latency_ms: Vec<u64>,
    /// The store's clock as last measured (none yet, or the clock is the store's own).
    pub clock: Option<ClockReading>,
}

/// The store's clock as a worker last heard of it ([`Event::StoreClock`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClockReading {
    /// The store's clock minus the local wall clock.
    pub offset_ms: i64,
    /// How far the true offset may be from `offset_ms`.
    pub uncertainty_ms: u64,
}

impl Metrics {
    /// The worker's metrics line (EMF): what is held, the counters' deltas since `before` (the
    /// totals of the previous line), the renewal latencies; session mode adds the session's.
    /// Every driver writes this line, one per [`Command::EmitMetrics`].
    pub fn emf_line(
        &self,
        namespace: &str,
        worker_id: &str,
        before: &Totals,
        session_mode: bool,
        now_ms: u64,
    ) -> String {
        let now = self.totals;
        let delta = |f: fn(&Totals) -> u64| f(&now).saturating_sub(f(before));
        let mut emf = crate::metrics::Emf::new(namespace)
            .dimension("Service", "worker")
            .dimension("WorkerId", worker_id)
            .count("ActiveConnections", self.held as u64)
            .count("Acquired", delta(|t| t.acquired))
            .count("AcquireConflicts", delta(|t| t.acquire_conflicts))
            .count("AcquireErrors", delta(|t| t.acquire_errors))
            .count("LeasesLost", delta(|t| t.leases_lost))
            .count("Released", delta(|t| t.released))
            .count("HandlerFailures", delta(|t| t.handler_errors + t.handler_panics))
            .milliseconds("RenewLatency", &self.renew_latency_ms);
        if let Some(clock) = self.clock {
            emf = emf
                .millisecond_value("ClockOffsetMs", clock.offset_ms)
                .millisecond_value("ClockUncertaintyMs", clock.uncertainty_ms as i64);
        }
        if session_mode {
            emf = emf
                .count("Sessions", u64::from(self.session_live))
                .milliseconds("SessionRenewLatency", &self.session_renew_latency_ms)
                .count("SessionTakeovers", delta(|t| t.session_takeovers));
        }
        emf.to_line(now_ms)
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
    /// Session mode: transactions that took several of a dead session's connections at once.
    pub takeover_transactions: u64,
    /// Session mode: connections handed over to balance the fleet.
    pub handed_over: u64,
    /// Session mode with balance: the most this worker may hold after a claim now.
    pub claim_limit: Option<usize>,
    pub stopping: bool,
    /// The store's clock minus the local wall clock, as last measured (none yet, or the clock
    /// is the store's own), and the uncertainty of that.
    pub clock_offset_ms: Option<i64>,
    pub clock_uncertainty_ms: Option<u64>,
    /// Why the worker claims nothing now, while it keeps what it holds (the store's clock not
    /// known within the tolerance).
    pub claims_paused: Option<String>,
}

/// Renewal latencies kept between two metrics lines (about 700 leases x 12 renewals a minute).
const MAX_LATENCY_SAMPLES: usize = 20_000;

/// One held lease.
#[derive(Debug)]
struct HeldEntry {
    keeper: Keeper,
    /// The keeper still runs (not lost, not past its deadline, handler not ended).
    keeping: bool,
    /// A renewal in flight and when it was sent.
    renewing: Option<(OpId, u64)>,
    session_epoch: Option<u64>,
    fence: u64,
    claim_order: u64,
    /// The hand-over round it was picked in (0: not picked).
    handing_over: u64,
    reason: Option<CancelReason>,
    /// When an ignored cancellation aborts the handler.
    abort_at: Option<u64>,
    /// The handler has ended: the lease is being released (or left to the session's end).
    ended: bool,
    /// Session mode: a release that failed is sent again then (monotonic ms), and how many
    /// failed. Work held under a live session never expires: given up, it would stay ours with
    /// no handler until the session ends.
    release_again_at: Option<u64>,
    release_failures: u32,
}

#[derive(Debug)]
enum Tracked {
    Claiming,
    Held(Box<HeldEntry>),
}

/// What an operation in flight was for.
#[derive(Debug)]
enum Pending {
    Claim {
        id: String,
        source: Source,
        session_epoch: Option<u64>,
        from: ClaimFrom,
    },
    Renew {
        id: String,
    },
    Release {
        id: String,
    },
    GiveBack,
    Settle {
        id: String,
    },
    Page,
    Fleet,
    Owned {
        owner: String,
        epoch: Option<u64>,
    },
    Retire,
    CreateSession,
    RenewSession {
        round: u64,
        sent_mono_ms: u64,
    },
    EndSession,
    DesiredStates,
    RefreshLimit,
    /// An [`Op::TakeOver`]: the claims it carries (each pending on its own) and their requests.
    TakeOver {
        claims: Vec<(OpId, Op)>,
    },
}

/// Who waits for a claim's outcome.
#[derive(Debug, Clone, Copy)]
enum ClaimFrom {
    Poll,
    Hint(usize),
}

/// A dead session (or an older epoch of ours, `epoch` `None`) and its connections not tracked here.
#[derive(Debug)]
struct DeadSession {
    owner: String,
    epoch: Option<u64>,
    listed: usize,
    ids: Vec<String>,
}

/// Where a dead session's connection `id` stands in the claims of worker `me`, by rendezvous
/// hashing over the live workers `owners` (every worker reading the same sessions ranks alike):
/// first the connections `me` weighs highest for, heaviest first; then those another worker
/// weighs highest for, lightest first. That worker starts from the other end of the same list,
/// so two survivors meet on a connection only when both go past their own.
/// With `assigned` (from [`takeover_assignment`]), the connections assigned to `me` come first
/// instead of those it weighs highest for.
fn claim_rank(owners: &[String], me: &str, id: &str, assigned: Option<bool>) -> (bool, u64) {
    match (owners.iter().max_by_key(|o| (rendezvous_weight(o, id), *o)), assigned) {
        (_, Some(true)) => (false, u64::MAX - rendezvous_weight(me, id)),
        (Some(winner), None) if winner == me => (false, u64::MAX - rendezvous_weight(me, id)),
        (Some(winner), _) => (true, rendezvous_weight(winner, id)),
        (None, _) => (true, 0),
    }
}

fn rendezvous_weight(owner: &str, id: &str) -> u64 {
    crate::config::mixed_hash(owner.bytes().chain([0]).chain(id.bytes()))
}

/// Which of the dead sessions' connections `ids` worker `me` takes: each, in an order fixed by
/// its id, goes to the live worker rendezvous hashing weighs highest for it among those with
/// room left below the fair level of the listed loads. Every survivor reading the same listing
/// assigns alike, so a crash's work is taken in one round: ranked by weight alone, a survivor's
/// picks past its room were left to the next round's listing, round after round. `None` when a
/// live session has not reported its load (the plain ranking then).
fn takeover_assignment(
    me: &str,
    loads: &[(String, Option<SessionLoad>)],
    ids: &[&String],
) -> Option<std::collections::HashSet<String>> {
    let loads: Vec<(&String, SessionLoad)> = loads.iter().map(|(o, l)| l.map(|l| (o, l))).collect::<Option<_>>()?;
    if !loads.iter().any(|(o, _)| o.as_str() == me) {
        return None;
    }
    let caps: Vec<u64> = loads.iter().map(|(_, l)| l.max_connections).collect();
    let work = loads.iter().map(|(_, l)| l.held).sum::<u64>() + ids.len() as u64;
    let level = decide::fair_level(work, &caps);
    let mut room: Vec<u64> = loads.iter().map(|(_, l)| l.max_connections.min(level).saturating_sub(l.held)).collect();
    let mut order: Vec<&String> = ids.to_vec();
    order.sort_by_cached_key(|id| (crate::config::mixed_hash(id.bytes()), *id));
    order.dedup();
    let mut mine = std::collections::HashSet::new();
    for id in order {
        let pick =
            (0..loads.len()).filter(|k| room[*k] > 0).max_by_key(|k| (rendezvous_weight(loads[*k].0, id), loads[*k].0));
        let Some(k) = pick else { break };
        room[k] -= 1;
        if loads[k].0.as_str() == me {
            mine.insert(id.clone());
        }
    }
    Some(mine)
}

/// The work a dead session leaves to the fleet, in balance terms: what its owner last reported
/// less what this worker has claimed of it, and never less than what is still listed under it.
/// A peer that claimed some of it reports them only at its next renewal; counting only what is
/// still listed would shrink the fleet's work until then, and the survivors' shares with it.
/// `taken` is how many of it this worker has claimed so far (they count in its own load).
fn dead_work(dead: &DeadSession, sessions: &[SessionItem], taken: u64) -> u64 {
    let unclaimed = dead.ids.len() as u64;
    let claiming = (dead.listed - dead.ids.len()) as u64;
    let reported = dead
        .epoch
        .and_then(|epoch| sessions.iter().find(|s| s.owner == dead.owner && s.epoch == epoch))
        .and_then(|s| s.load)
        .map_or(0, |l| l.held.saturating_sub(claiming + taken));
    unclaimed.max(reported)
}

#[derive(Debug, Default)]
struct OrphanRound {
    page: Vec<LeaseItem>,
    full: bool,
    /// The session listing, once read (None: not read, or the read failed).
    peers: Option<Vec<PeerSession>>,
    dead_sessions: Vec<SessionItem>,
    owned_waiting: usize,
    owned_failed: bool,
    dead: Vec<DeadSession>,
    /// Claims to start, in order.
    queue: VecDeque<(String, Source)>,
    in_flight: usize,
    wake_in_ms: u64,
    own_wanted: usize,
    own_claimed: usize,
    takeovers: BTreeMap<String, usize>,
    /// The dead session (owner, epoch) each queued dead id is claimed from.
    dead_owner: HashMap<String, (String, u64)>,
    /// Each dead id as it was listed under its dead session.
    dead_listed: HashMap<String, Listed>,
    /// When the first live peer session, renewed no more, could be taken over (monotonic ms).
    peer_dies_at_mono_ms: Option<u64>,
    /// The owners of the live sessions, this worker's among them.
    live_owners: Vec<String>,
    /// The live sessions' loads as listed (this worker's as it last reported it): every
    /// survivor reading the same listing assigns a dead session's work alike.
    live_loads: Vec<(String, Option<SessionLoad>)>,
    /// When the dead sessions' work (and ours of earlier epochs, with `listed_own`) was listed.
    listed_at: Option<Now>,
    listed_own: bool,
    /// The takeovers of the wave in flight: taken, and refused by their items' conditions.
    wave_taken: usize,
    wave_refused: usize,
}

#[derive(Debug)]
enum PollPhase {
    Idle { at_mono_ms: u64 },
    Page,
    Fleet(OrphanRound),
    Claims(OrphanRound),
}

#[derive(Debug)]
struct HintBatch {
    messages: Vec<HintMessage>,
    outcomes: Vec<Option<Claim>>,
    queue: VecDeque<usize>,
    in_flight: usize,
    /// A refresh of the claim limit, and when it is given up.
    refresh_until: Option<u64>,
    /// The limit was refreshed for this batch: hints that join it later are not counted again
    /// (the ended session whose hints they are was counted by the first refresh).
    refreshed: bool,
    /// Session mode: the orphan round the hints started is waited for (the rounds planned
    /// when they arrived, and when the wait is given up), so the work of a session that has just
    /// ended is taken as listed, in takeovers sent together, not one claim per hint.
    round_wait: Option<(u64, u64)>,
    /// How many ids the hints name that are not tracked here (work nobody holds, at least).
    hinted: u64,
}

/// The hint queue's long poll. While a batch's claims are in flight the next poll waits
/// [`HINT_POLL_OVERLAP_MS`] (a batch answered within it runs one poll at a time), then opens:
/// the hints of a hand-over that trickles in while the batch's claims wait on a slow table are
/// received at once, not after the whole batch.
#[derive(Debug)]
enum HintPhase {
    Off,
    Idle { at_mono_ms: u64 },
    Receiving,
    Done,
}

#[derive(Debug)]
enum SessionPhase {
    /// Per-item mode.
    Off,
    Closed {
        retry_at_mono_ms: u64,
        failures: u32,
        previous: Option<u64>,
    },
    Opening {
        previous: Option<u64>,
        failures: u32,
    },
    Live {
        session: Session,
        renewing: bool,
    },
    Ending,
    Ended,
}

/// The worker engine; see the module docs.
#[derive(Debug)]
pub struct Engine {
    settings: Settings,
    config: TableConfig,
    rng: u64,
    now: Now,
    next_op: OpId,
    pending: HashMap<OpId, Pending>,
    commands: VecDeque<Command>,
    /// Claims of work listed under a dead session started in this step: sent together, one
    /// [`Op::TakeOver`] per dead session (see [`Engine::send_takeovers`]).
    takeovers: Vec<(OpId, Op)>,
    tracked: BTreeMap<String, Tracked>,
    stopping: bool,
    /// Held at the shutdown request (session mode hints them once the session has ended).
    held_at_shutdown: Vec<String>,
    finished: bool,
    unsettled: BTreeSet<String>,
    claim_limit: usize,
    balancer: Balancer,
    claims: u64,
    hand_over_rounds: u64,
    renew_session_now: bool,
    reclaim_own: bool,
    poll: PollPhase,
    poll_again: bool,
    /// Orphan rounds planned (or failed) so far.
    rounds_planned: u64,
    orphan_failures: u32,
    hints: HintPhase,
    /// Hints received and not yet settled (those received meanwhile join it).
    hint_batch: Option<HintBatch>,
    hint_failures: u32,
    session: SessionPhase,
    desired_at_mono_ms: u64,
    desired_in_flight: bool,
    metrics_at_mono_ms: u64,
    totals: Totals,
    renew_latency_ms: Vec<u64>,
    session_renew_latency_ms: Vec<u64>,
    /// What [`Engine::poll_timeout`] says, computed after every change.
    next_timeout: Option<u64>,
    /// Connections claimed from each dead session (owner, epoch) still listed.
    taken_from: HashMap<(String, u64), u64>,
    /// When each held lease may need something (a renewal, its deadline, an abort), at or
    /// before the real time: a lease is looked at only when one of its entries comes up, so an
    /// event costs what it touches, not what is held. Entries may be stale (early), never late.
    wakes: std::collections::BinaryHeap<std::cmp::Reverse<(u64, String)>>,
    /// Leases changed since their last entry: each gets a new entry at the end of the step.
    dirty: BTreeSet<String>,
    /// Sessions listed as ended (expiry 0), and when this worker first read them so (monotonic
    /// ms): the end was written before that, so a listing of their work sent
    /// `index_lag_ms` later lists everything they held.
    ended_seen: HashMap<(String, u64), u64>,
    /// Our own earlier epochs' work is listed again at each poll until then (monotonic ms): the
    /// index may not list all of it yet when the session opens.
    reclaim_own_until_mono_ms: u64,
    /// The store's clock as last measured ([`Event::StoreClock`]).
    clock: Option<ClockReading>,
    /// The orphan shard the last poll's page was read from first.
    poll_first_shard: u32,
    /// Live sessions in the last listing, this worker's included (session mode).
    fleet_size: usize,
    /// The last orphan page held every orphan of the index, over this many shards in effect.
    seen_whole: Option<f64>,
    /// Claims this worker may send now without passing its rate ([`decide::claim_rate_per_s`]),
    /// as of `claim_tokens_at_mono_ms`; at most one second's worth.
    claim_tokens: f64,
    claim_tokens_at_mono_ms: u64,
    /// The same for claims of work spread over every shard (takeovers, hinted work): their
    /// index writes land on as many partition values as there are shards.
    spread_tokens: f64,
    spread_tokens_at_mono_ms: u64,
    /// Claims wait for their rate until then.
    claims_paced_until: Option<u64>,
    /// What was tracked when the last session renewal was sent (its report), and when.
    reported_tracked: usize,
    report_sent_mono_ms: u64,
}

impl Engine {
    /// A worker that starts at `now`; `seed` seeds its random source (jitter, claim order).
    pub fn new(settings: Settings, config: TableConfig, seed: u64, now: Now) -> Self {
        let session_mode = config.mode == LeaseMode::Session;
        let mut engine = Self {
            claim_limit: settings.max_connections,
            hints: if settings.hints { HintPhase::Idle { at_mono_ms: now.mono_ms } } else { HintPhase::Off },
            session: if session_mode {
                SessionPhase::Closed { retry_at_mono_ms: now.mono_ms, failures: 0, previous: None }
            } else {
                SessionPhase::Off
            },
            poll: PollPhase::Idle { at_mono_ms: now.mono_ms },
            metrics_at_mono_ms: now.mono_ms + settings.metrics_interval_ms,
            desired_at_mono_ms: 0,
            settings,
            config,
            rng: seed,
            now,
            next_op: 1,
            pending: HashMap::new(),
            commands: VecDeque::new(),
            takeovers: Vec::new(),
            tracked: BTreeMap::new(),
            stopping: false,
            held_at_shutdown: Vec::new(),
            finished: false,
            unsettled: BTreeSet::new(),
            balancer: Balancer::default(),
            claims: 0,
            hand_over_rounds: 0,
            renew_session_now: false,
            reclaim_own: false,
            poll_again: false,
            rounds_planned: 0,
            orphan_failures: 0,
            hint_failures: 0,
            hint_batch: None,
            desired_in_flight: false,
            totals: Totals::default(),
            renew_latency_ms: Vec::new(),
            session_renew_latency_ms: Vec::new(),
            next_timeout: None,
            taken_from: HashMap::new(),
            wakes: std::collections::BinaryHeap::new(),
            dirty: BTreeSet::new(),
            ended_seen: HashMap::new(),
            reclaim_own_until_mono_ms: 0,
            clock: None,
            poll_first_shard: 0,
            fleet_size: 1,
            seen_whole: None,
            claim_tokens: f64::INFINITY,
            claim_tokens_at_mono_ms: now.mono_ms,
            spread_tokens: f64::INFINITY,
            spread_tokens_at_mono_ms: now.mono_ms,
            claims_paced_until: None,
            reported_tracked: 0,
            report_sent_mono_ms: now.mono_ms,
        };
        if let Some(tolerance_ms) = engine.settings.clock_tolerance_ms {
            info!(tolerance_ms, "claims wait until the store's clock is known within the tolerance");
        }
        let phase = desired_state_phase_ms(engine.settings.desired_state_interval_ms, engine.unit());
        engine.desired_at_mono_ms = now.mono_ms + phase;
        engine.advance();
        engine
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn config(&self) -> &TableConfig {
        &self.config
    }

    /// The next thing to do, if any.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// Whether the run is over ([`Command::Finished`] was emitted).
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Whether a shutdown was requested.
    pub fn is_stopping(&self) -> bool {
        self.stopping
    }

    /// Something happened at `now`.
    pub fn handle(&mut self, event: Event, now: Now) {
        self.set_now(now);
        match event {
            Event::Answer { op, answer } => match self.pending.remove(&op) {
                Some(pending) => self.answered(op, pending, answer),
                None => debug!(op, "answer to an operation no longer waited for"),
            },
            Event::Hints { received } => self.hints_received(received),
            Event::HandlerEnded { id, end, reason } => self.handler_ended(&id, end, reason),
            Event::Shutdown => self.shutdown(),
            Event::StoreClock { offset_ms, uncertainty_ms } => {
                self.store_clock_measured(ClockReading { offset_ms, uncertainty_ms })
            }
        }
        self.advance();
    }

    /// Time has passed: whatever was due by `now` happens.
    pub fn handle_timeout(&mut self, now: Now) {
        self.set_now(now);
        self.advance();
    }

    fn set_now(&mut self, now: Now) {
        self.now = Now { wall_ms: now.wall_ms.max(self.now.wall_ms), mono_ms: now.mono_ms.max(self.now.mono_ms) };
    }

    /// When [`Engine::handle_timeout`] is due next (monotonic ms), if anything waits on time.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.next_timeout
    }

    fn compute_timeout(&self) -> Option<u64> {
        if self.finished {
            return None;
        }
        let mut at = u64::MAX;
        let mut wake = |t: u64| at = at.min(t);
        if let Some(std::cmp::Reverse((t, _))) = self.wakes.peek() {
            wake(*t);
        }
        if !self.stopping {
            if let PollPhase::Idle { at_mono_ms } = self.poll {
                wake(at_mono_ms);
            }
            wake(self.desired_at_mono_ms);
            wake(self.metrics_at_mono_ms);
        }
        match &self.hints {
            // A full worker waits for room (an event), not for time.
            HintPhase::Idle { at_mono_ms } if !self.stopping && self.hint_room() > 0 => wake(*at_mono_ms),
            _ => {}
        }
        if let Some(t) = self.claims_paced_until {
            wake(t);
        }
        if let Some(t) = self.report_due_at() {
            wake(t);
        }
        // A batch waits for its refresh first, then (at most until its time) for the round.
        if let Some(batch) = &self.hint_batch {
            if let Some(t) = batch.refresh_until.or(batch.round_wait.map(|(_, until)| until)) {
                wake(t);
            }
        }
        match &self.session {
            SessionPhase::Closed { retry_at_mono_ms, .. } if !self.stopping => wake(*retry_at_mono_ms),
            SessionPhase::Live { session, renewing } => {
                wake(session.deadline_mono_ms);
                if !renewing {
                    wake(session_wake_at(session, &self.config));
                }
            }
            _ => {}
        }
        (at != u64::MAX).then_some(at)
    }

    /// A uniform draw in [0, 1) from the seeded source (SplitMix64).
    fn unit(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn session_mode(&self) -> bool {
        self.config.mode == LeaseMode::Session
    }

    fn balanced(&self) -> bool {
        self.settings.balance && self.session_mode()
    }

    fn run(&mut self, request: Op, pending: Pending) -> OpId {
        let op = self.next_op;
        self.next_op += 1;
        self.pending.insert(op, pending);
        if matches!(request, Op::Claim { session: Some(_), listed: Some(_), .. }) {
            self.takeovers.push((op, request));
        } else {
            self.commands.push_back(Command::Run { op, request });
        }
        op
    }

    /// Sends the takeovers started in this step: those of one dead session (and one session
    /// of ours) as [`Op::TakeOver`]s of up to [`crate::protocol::TAKE_OVER_MAX`] (one check of
    /// the dead session's item for all of them, a partition value every survivor's takeovers
    /// share); a lone one as its claim.
    fn send_takeovers(&mut self) {
        let mut groups: BTreeMap<(String, u64, u64), Vec<(OpId, Op)>> = BTreeMap::new();
        for (op, request) in std::mem::take(&mut self.takeovers) {
            let Op::Claim { session: Some(s), listed: Some(l), .. } = &request else { continue };
            let key = (l.item.owner.clone().unwrap_or_default(), l.epoch, s.epoch);
            groups.entry(key).or_default().push((op, request));
        }
        for ((owner, epoch, _), claims) in groups {
            for chunk in claims.chunks(crate::protocol::TAKE_OVER_MAX) {
                let request = match chunk {
                    [(op, request)] => {
                        self.commands.push_back(Command::Run { op: *op, request: request.clone() });
                        continue;
                    }
                    [(_, Op::Claim { session: Some(session), .. }), ..] => Op::TakeOver {
                        owner: owner.clone(),
                        epoch,
                        session: session.clone(),
                        listed: chunk
                            .iter()
                            .filter_map(|(_, r)| match r {
                                Op::Claim { listed: Some(l), .. } => Some(l.item.clone()),
                                _ => None,
                            })
                            .collect(),
                    },
                    _ => continue,
                };
                let op = self.next_op;
                self.next_op += 1;
                self.pending.insert(op, Pending::TakeOver { claims: chunk.to_vec() });
                self.commands.push_back(Command::Run { op, request });
            }
        }
    }

    /// A takeover transaction's answer: each connection taken is its claim's answer; each it
    /// left (changed since the listing: the item decides) is claimed on its own. A transaction
    /// that failed (throttled or unanswered past its budget) fails each of its claims alike.
    fn taken_over(&mut self, claims: Vec<(OpId, Op)>, answer: Answer) {
        let taken = match answer {
            Answer::TakenOver(taken) if taken.len() == claims.len() => {
                self.totals.takeover_transactions += 1;
                taken
            }
            Answer::Failed(e) => {
                debug!(error = %e, connections = claims.len(), "takeover transaction failed");
                for (op, _) in claims {
                    if let Some(pending) = self.pending.remove(&op) {
                        self.answered(op, pending, Answer::Failed(e.clone()));
                    }
                }
                return;
            }
            other => {
                warn!(answer = ?other, "unexpected answer to a takeover; claiming each connection on its own");
                vec![None; claims.len()]
            }
        };
        for ((op, request), lease) in claims.into_iter().zip(taken) {
            match lease {
                Some(lease) => {
                    if let Some(pending) = self.pending.remove(&op) {
                        self.answered(op, pending, Answer::Lease(lease));
                    }
                }
                None => self.commands.push_back(Command::Run { op, request }),
            }
        }
    }

    fn live_session(&self) -> Option<&Session> {
        match &self.session {
            SessionPhase::Live { session, .. } => Some(session),
            _ => None,
        }
    }

    // ---- capacity and load ----

    /// Free capacity: `max_connections` less what is tracked.
    fn capacity(&self) -> usize {
        self.settings.max_connections.saturating_sub(self.tracked.len())
    }

    /// Claims that fit now: the free capacity, and with balance the room below the claim limit.
    fn room(&self) -> usize {
        let capacity = self.capacity();
        if !self.balanced() {
            return capacity;
        }
        capacity.min(self.claim_limit.saturating_sub(self.tracked.len()))
    }

    fn below_claim_limit(&self) -> bool {
        !self.balanced() || self.tracked.len() < self.claim_limit
    }

    /// What the session reports: the work held or being claimed here (not what is being
    /// handed over, stopped or lost) and `max_connections`.
    pub fn load(&self) -> SessionLoad {
        let held = self
            .tracked
            .values()
            .filter(|t| match t {
                Tracked::Claiming => true,
                Tracked::Held(h) => counts_in_load(h.reason, h.handing_over != 0),
            })
            .count();
        SessionLoad { held: held as u64, max_connections: self.settings.max_connections as u64 }
    }

    // ---- handlers and held leases ----

    /// Fires the handler's token (the first reason wins) and starts its grace period.
    fn cancel(&mut self, id: &str, reason: CancelReason) -> bool {
        let grace = self.settings.handler_grace_ms;
        let now = self.now.mono_ms;
        let Some(Tracked::Held(h)) = self.tracked.get_mut(id) else { return false };
        if h.reason.is_some() || h.ended {
            return false;
        }
        self.dirty.insert(id.to_string());
        h.reason = Some(reason);
        if matches!(reason, CancelReason::Lost | CancelReason::Deadline) {
            h.keeping = false;
        }
        h.abort_at = Some(now + grace);
        self.commands.push_back(Command::CancelHandler { id: id.to_string(), reason });
        true
    }

    fn handler_ended(&mut self, id: &str, end: HandlerEnd, seen: Option<CancelReason>) {
        let session_mode = self.session_mode();
        let Some(Tracked::Held(h)) = self.tracked.get_mut(id) else { return };
        if h.ended {
            return;
        }
        h.ended = true;
        h.keeping = false;
        h.abort_at = None;
        // The driver's token is the authority: a checkpoint may have found the lease lost.
        let reason = h.reason.or(seen);
        h.reason = reason;
        match end {
            HandlerEnd::Returned => debug!(connection_id = %id, reason = ?reason, "handler returned"),
            HandlerEnd::Failed => {
                self.totals.handler_errors += 1;
                debug!(connection_id = %id, "handler failed");
            }
            HandlerEnd::Panicked => {
                self.totals.handler_panics += 1;
                debug!(connection_id = %id, "handler panicked");
            }
            HandlerEnd::Aborted => {
                warn!(connection_id = %id, grace_ms = self.settings.handler_grace_ms, "handler ignored cancellation; aborted")
            }
        }
        if counts_as_lost(reason) {
            self.totals.leases_lost += 1;
            warn!(connection_id = %id, reason = ?reason, "lease lost");
        }
        // Session mode: at shutdown one session write frees everything (after every handler ended).
        if releases_after_handler(reason, session_mode) {
            self.run(Op::Release { id: id.to_string() }, Pending::Release { id: id.to_string() });
        } else {
            self.forget(id);
        }
    }

    /// Session mode: whether the failed release of `id` is sent again (after a pause that grows
    /// with each failure, at most one renew interval). It is while the work is held under the
    /// live session and the worker is not stopping (the session's end then frees it); per-item
    /// work expires by itself.
    fn release_again(&mut self, id: &str) -> bool {
        let live = self.live_session().map(|s| s.epoch);
        let (now, renew_ms, stopping) = (self.now.mono_ms, self.config.renew_ms(), self.stopping);
        let Some(Tracked::Held(h)) = self.tracked.get_mut(id) else { return false };
        if stopping || live.is_none() || h.session_epoch != live {
            return false;
        }
        let pause = (250u64 << h.release_failures.min(8)).min(renew_ms);
        h.release_failures += 1;
        h.release_again_at = Some(now + pause);
        self.dirty.insert(id.to_string());
        true
    }

    fn forget(&mut self, id: &str) {
        if self.tracked.remove(id).is_some() {
            self.commands.push_back(Command::Forget { id: id.to_string() });
        }
    }

    /// A renewed (or new) session: every connection held under it acts until its new deadline.
    fn cover_all(&mut self, session: &Session) {
        let mut moved = Vec::new();
        for (id, t) in self.tracked.iter_mut() {
            if let Tracked::Held(h) = t {
                if moves_with_session(h.session_epoch, h.reason, session) && !h.ended {
                    h.keeper.cover(session.deadline_mono_ms);
                    moved.push(id.clone());
                }
            }
        }
        for id in moved {
            self.commands.push_back(Command::SetDeadline { id, deadline_mono_ms: session.deadline_mono_ms });
        }
    }

    /// Rule 2 on the session: its deadline passed or it was lost: every handler stops.
    fn lose_session(&mut self, epoch: u64) {
        let ids: Vec<String> = self.held_ids();
        for id in ids {
            self.cancel(&id, CancelReason::Deadline);
        }
        self.session = SessionPhase::Closed { retry_at_mono_ms: self.now.mono_ms, failures: 0, previous: Some(epoch) };
    }

    fn held_ids(&self) -> Vec<String> {
        self.tracked.iter().filter(|(_, t)| matches!(t, Tracked::Held(_))).map(|(id, _)| id.clone()).collect()
    }

    /// Picks `count` held connections to hand over and asks for a session renewal at once: it
    /// reports them as no longer held; once it has landed their handlers are cancelled with
    /// `HandOver` and each is released and hinted.
    fn hand_over(&mut self, count: usize) -> usize {
        let candidates: Vec<(String, u64, u64)> = self
            .tracked
            .iter()
            .filter_map(|(id, t)| match t {
                Tracked::Held(h) if h.reason.is_none() && h.handing_over == 0 && !h.ended => {
                    Some((id.clone(), h.fence, h.claim_order))
                }
                _ => None,
            })
            .collect();
        let picks = decide::hand_over_picks(&candidates, count);
        self.hand_over_rounds += 1;
        let round = self.hand_over_rounds;
        for id in &picks {
            if let Some(Tracked::Held(h)) = self.tracked.get_mut(id) {
                h.handing_over = round;
            }
        }
        if !picks.is_empty() {
            self.renew_session_now = true;
        }
        picks.len()
    }

    /// A session renewal that read `round` has reported the picks up to it as gone.
    fn start_hand_overs(&mut self, round: u64) {
        let picked: Vec<String> = self
            .tracked
            .iter()
            .filter_map(|(id, t)| match t {
                Tracked::Held(h) if h.handing_over != 0 && h.handing_over <= round => Some(id.clone()),
                _ => None,
            })
            .collect();
        for id in picked {
            self.cancel(&id, CancelReason::HandOver);
        }
    }

    // ---- the store's clock ----

    /// Why claims wait now, if they do: rule 1 compares expiries with this worker's clock, so
    /// it claims only on a clock known to be the store's within the tolerance.
    fn claims_paused(&self) -> Option<String> {
        let tolerance = self.settings.clock_tolerance_ms?;
        match self.clock {
            None => Some("the store's clock is not measured yet".to_string()),
            Some(c) if c.uncertainty_ms > tolerance => Some(format!(
                "the store's clock is known within {} ms, not within the tolerance of {tolerance} ms",
                c.uncertainty_ms
            )),
            Some(_) => None,
        }
    }

    fn store_clock_measured(&mut self, reading: ClockReading) {
        let (was_paused, before) = (self.claims_paused(), self.clock.replace(reading));
        let (offset_ms, uncertainty_ms) = (reading.offset_ms, reading.uncertainty_ms);
        match (was_paused, self.claims_paused()) {
            (Some(_), None) => info!(offset_ms, uncertainty_ms, "the store's clock is measured: claims resume"),
            (None, Some(why)) => warn!(offset_ms, uncertainty_ms, "claims wait: {why}"),
            _ => {}
        }
        // A large offset is reported (and alarmed on), not acted on: leases run on the store's clock.
        let large = |c: Option<ClockReading>| c.is_some_and(|c| c.offset_ms.unsigned_abs() > self.config.skew_ms() / 2);
        if large(Some(reading)) && !large(before) {
            warn!(
                offset_ms,
                uncertainty_ms,
                "this host's clock is off the store's by more than half the clock skew; leases run on the store's"
            );
        }
    }

    // ---- claims ----

    /// Starts a claim of `id` if it may: capacity, not ours already, within the claim limit.
    fn try_claim(&mut self, id: &str, source: Source, from: ClaimFrom, listed: Option<Listed>) -> Result<(), Claim> {
        if self.capacity() == 0 {
            return Err(Claim::NoCapacity);
        }
        if self.stopping {
            return Err(Claim::Stopping);
        }
        if self.tracked.contains_key(id) {
            return Err(Claim::AlreadyOurs);
        }
        if self.claims_paused().is_some() {
            return Err(Claim::ClockUntrusted);
        }
        let limited = self.balanced() && !matches!(source, Source::ReclaimOwn | Source::Stranded);
        if limited && self.tracked.len() >= self.claim_limit {
            return Err(Claim::AtLimit);
        }
        let session = match (self.session_mode(), self.live_session()) {
            (false, _) => None,
            (true, Some(s)) => Some(s.clone()),
            (true, None) => return Err(Claim::Failed),
        };
        let session_epoch = session.as_ref().map(|s| s.epoch);
        self.tracked.insert(id.to_string(), Tracked::Claiming);
        self.run(
            Op::Claim { id: id.to_string(), listed: listed.filter(|_| session.is_some()), session },
            Pending::Claim { id: id.to_string(), source, session_epoch, from },
        );
        Ok(())
    }

    fn claim_answered(&mut self, id: String, source: Source, session_epoch: Option<u64>, answer: Answer) -> Claim {
        self.tracked.remove(&id);
        let lease = match answer {
            Answer::Lease(lease) if is_fleet_work(&lease) => lease,
            Answer::Lease(lease) => {
                debug!(connection_id = %id, desired_state = ?lease.desired_state, "not running work, giving it back");
                self.run(Op::ReleaseLease { lease }, Pending::GiveBack);
                self.totals.acquire_conflicts += 1;
                return Claim::Conflict;
            }
            Answer::Failed(e) => {
                // A timeout may have landed; and work found held by this very worker, not tracked
                // here, is an earlier claim that landed unseen (its answer lost, its re-read made
                // while this claim was in flight): both are read again and given back.
                let own = matches!(&e, Error::Held { owner, .. } if *owner == self.settings.worker_id);
                if own || matches!(e, Error::Timeout { outcome_unknown: true }) {
                    self.unsettled.insert(id.clone());
                }
                return match claim_failure(&e) {
                    ClaimFailure::Conflict => {
                        debug!(connection_id = %id, source = source.as_str(), reason = %e, "claim conflict");
                        self.totals.acquire_conflicts += 1;
                        Claim::Conflict
                    }
                    ClaimFailure::Error => {
                        warn!(connection_id = %id, source = source.as_str(), error = %e, "claim failed");
                        self.totals.acquire_errors += 1;
                        Claim::Failed
                    }
                };
            }
            other => {
                warn!(connection_id = %id, answer = ?other, "unexpected answer to a claim");
                self.totals.acquire_errors += 1;
                return Claim::Failed;
            }
        };
        let upkeep = if self.session_mode() { Upkeep::Watch } else { Upkeep::Renew };
        let mut keeper = Keeper::new(&lease, upkeep, &self.config);
        if upkeep == Upkeep::Renew {
            // The phase comes from the connection and its fence, not the random source: the
            // same claim renews at the same point whoever replays it.
            let phase = crate::config::mixed_hash(id.bytes().chain(lease.fence.to_le_bytes())) as f64 / u64::MAX as f64;
            keeper.spread_first_renewal(self.now.mono_ms, phase);
        }
        let fence = lease.fence;
        let order = self.claims;
        self.claims += 1;
        // Session cover reaches claims in flight: a renewal that landed while the claim's answer
        // was on its way moves this claim's deadline too.
        let epoch_now = self.live_session().map(|s| s.epoch);
        let outlived = self.session_mode() && claim_outlived_session(session_epoch, epoch_now);
        let cover = self
            .live_session()
            .filter(|s| !outlived && moves_with_session(session_epoch, None, s))
            .map(|s| s.deadline_mono_ms)
            .filter(|d| *d > lease.deadline_mono_ms);
        // Rule 2: a claim whose answer comes after its deadline (the worker was paused while it
        // was on its way) starts no handler. It is given back (fenced: refused if another worker
        // has claimed it since), and the work is claimed again as any orphan is.
        if cover.unwrap_or(lease.deadline_mono_ms) <= self.now.mono_ms {
            warn!(connection_id = %id, fence, source = source.as_str(), "claimed past its deadline: giving it back");
            self.totals.leases_lost += 1;
            self.run(Op::ReleaseLease { lease }, Pending::GiveBack);
            return Claim::Failed;
        }
        if let Some(deadline) = cover {
            keeper.cover(deadline);
        }
        let entry = HeldEntry {
            keeper,
            keeping: true,
            renewing: None,
            session_epoch,
            fence,
            claim_order: order,
            handing_over: 0,
            reason: None,
            abort_at: None,
            ended: false,
            release_again_at: None,
            release_failures: 0,
        };
        self.tracked.insert(id.clone(), Tracked::Held(Box::new(entry)));
        self.dirty.insert(id.clone());
        self.totals.acquired += 1;
        info!(connection_id = %id, fence, source = source.as_str(), worker_id = %self.settings.worker_id, "claimed");
        self.commands.push_back(Command::StartHandler { lease });
        if let Some(deadline) = cover {
            self.commands.push_back(Command::SetDeadline { id: id.clone(), deadline_mono_ms: deadline });
        }
        if self.stopping {
            self.cancel(&id, CancelReason::Shutdown);
        }
        if outlived {
            // The session was lost (or a new epoch began) while the claim was in flight.
            self.cancel(&id, CancelReason::Deadline);
        }
        Claim::Claimed
    }

    // ---- answers ----

    fn answered(&mut self, op: OpId, pending: Pending, answer: Answer) {
        match pending {
            Pending::TakeOver { claims } => self.taken_over(claims, answer),
            Pending::Claim { id, source, session_epoch, from } => {
                let outcome = self.claim_answered(id.clone(), source, session_epoch, answer);
                self.claim_done(&id, source, from, outcome);
            }
            Pending::Renew { id } => self.renewed(op, &id, answer),
            Pending::Release { id } => {
                let reason = match self.tracked.get(&id) {
                    Some(Tracked::Held(h)) => h.reason,
                    _ => None,
                };
                match answer {
                    Answer::Done => {
                        self.totals.released += 1;
                        info!(connection_id = %id, reason = ?reason, "released");
                        if reason == Some(CancelReason::HandOver) {
                            self.totals.handed_over += 1;
                        }
                        let hinted = matches!(reason, Some(CancelReason::Shutdown | CancelReason::HandOver));
                        if hinted && self.settings.hints {
                            self.commands.push_back(Command::SendHint { id: id.clone() });
                        }
                    }
                    Answer::Failed(Error::Lost { .. }) => {
                        debug!(connection_id = %id, "already taken over; nothing to release")
                    }
                    Answer::Failed(e) if self.release_again(&id) => {
                        warn!(connection_id = %id, error = %e, "release failed; sent again shortly");
                        return;
                    }
                    Answer::Failed(e) => {
                        warn!(connection_id = %id, error = %e, "release failed; the lease will expire")
                    }
                    other => warn!(connection_id = %id, answer = ?other, "unexpected answer to a release"),
                }
                self.forget(&id);
            }
            Pending::GiveBack => {
                if let Answer::Failed(e) = answer {
                    warn!(error = %e, "release of non-running work failed");
                }
            }
            Pending::Settle { id } => self.settle_answered(id, answer),
            Pending::Page => self.page_answered(answer),
            Pending::Fleet => self.fleet_answered(answer),
            Pending::Owned { owner, epoch } => self.owned_answered(owner, epoch, answer),
            Pending::Retire => {
                if let Answer::Failed(e) = answer {
                    debug!(error = %e, "retiring a dead session failed");
                }
            }
            Pending::CreateSession => self.session_created(answer),
            Pending::RenewSession { round, sent_mono_ms } => self.session_renewed(round, sent_mono_ms, answer),
            Pending::EndSession => {
                match answer {
                    Answer::Done => info!(worker_id = %self.settings.worker_id, "session ended"),
                    Answer::Failed(e) => {
                        warn!(worker_id = %self.settings.worker_id, error = %e, "session end failed; it will expire")
                    }
                    _ => {}
                }
                if self.settings.hints {
                    for id in std::mem::take(&mut self.held_at_shutdown) {
                        self.commands.push_back(Command::SendHint { id });
                    }
                }
                self.session = SessionPhase::Ended;
            }
            Pending::DesiredStates => {
                self.desired_in_flight = false;
                match answer {
                    Answer::DesiredStates(states) => {
                        let states: HashMap<_, _> = states.into_iter().collect();
                        for id in stopped_ids(&states) {
                            if self.cancel(&id, CancelReason::Stopped) {
                                info!(connection_id = %id, "stopped");
                            }
                        }
                    }
                    Answer::Failed(e) => warn!(error = %e, "desired-state check failed"),
                    _ => {}
                }
            }
            Pending::RefreshLimit => {
                if let Answer::Sessions(sessions) = answer {
                    let pace = self.pace_ms();
                    let me = self.load();
                    let hinted = self.hint_batch.as_ref().map_or(0, |batch| batch.hinted);
                    let limit = self.balancer.refreshed_limit(
                        &sessions,
                        &self.settings.worker_id,
                        me,
                        hinted,
                        self.now.wall_ms,
                        &self.config,
                        pace,
                    );
                    self.claim_limit = self.claim_limit.max(limit as usize);
                }
                if let Some(batch) = &mut self.hint_batch {
                    batch.refresh_until = None;
                }
            }
        }
    }

    fn renewed(&mut self, op: OpId, id: &str, answer: Answer) {
        let unit = self.unit();
        let now = self.now.mono_ms;
        let config = self.config.clone();
        let Some(Tracked::Held(h)) = self.tracked.get_mut(id) else { return };
        if h.renewing.map(|(o, _)| o) != Some(op) {
            return;
        }
        self.dirty.insert(id.to_string());
        let sent = h.renewing.take().map_or(now, |(_, sent)| sent);
        if !h.keeping {
            return;
        }
        let stop = match &answer {
            Answer::Lease(lease) => {
                if self.renew_latency_ms.len() < MAX_LATENCY_SAMPLES {
                    self.renew_latency_ms.push(now.saturating_sub(sent));
                }
                h.keeper.renewed(Ok(Renewal::of(lease, &config)), now, unit)
            }
            Answer::Failed(e) => {
                debug!(connection_id = %id, error = %e, "renewal failed");
                h.keeper.renewed(Err(e), now, unit)
            }
            other => {
                warn!(connection_id = %id, answer = ?other, "unexpected answer to a renewal");
                h.keeper.renewed(Err(&Error::Store("unexpected answer".into())), now, unit)
            }
        };
        match stop {
            Some(CancelReason::Stopped) if self.cancel(id, CancelReason::Stopped) => {
                info!(connection_id = %id, "stopped (seen on renewal)");
            }
            Some(CancelReason::Stopped) => {}
            Some(reason) => {
                self.cancel(id, reason);
                if let Some(Tracked::Held(h)) = self.tracked.get_mut(id) {
                    h.keeping = false;
                }
            }
            None => {}
        }
    }

    fn settle_answered(&mut self, id: String, answer: Answer) {
        match answer {
            Answer::Item(Some(item)) => {
                let ours = item.owner.as_deref() == Some(self.settings.worker_id.as_str());
                if ours && matches!(self.tracked.get(&id), Some(Tracked::Claiming)) {
                    // A claim of it is in flight: read it again once that one is answered.
                    self.unsettled.insert(id);
                    return;
                }
                if !ours || item.expires_at_ms == Some(0) || self.tracked.contains_key(&id) {
                    return;
                }
                let lease = Lease::from_item(item, &self.settings.worker_id, self.now.mono_ms, &self.config);
                info!(connection_id = %id, fence = lease.fence, "a claim whose answer was lost had landed: releasing");
                self.run(Op::ReleaseLease { lease }, Pending::GiveBack);
            }
            Answer::Item(None) => {}
            _ => {
                debug!(connection_id = %id, "re-read of an unknown claim failed, trying again");
                self.unsettled.insert(id);
            }
        }
    }

    // ---- the orphan poll ----

    fn pace_ms(&self) -> u64 {
        balance_pace_ms(self.config.renew_ms(), self.settings.orphan_interval_ms)
    }

    fn start_poll(&mut self) {
        // A claim whose answer was lost may still have landed: read it again.
        for id in std::mem::take(&mut self.unsettled) {
            match self.tracked.get(&id) {
                None => {
                    self.run(Op::Get { id: id.clone() }, Pending::Settle { id });
                }
                // Read once the claim in flight is answered.
                Some(Tracked::Claiming) => {
                    self.unsettled.insert(id);
                }
                Some(_) => {}
            }
        }
        let interval = self.settings.orphan_interval_ms;
        let capacity = self.capacity();
        // Session mode polls even when full: the poll also decides the balance.
        if capacity == 0 && !self.session_mode() {
            let wait = jittered_ms(interval, self.unit());
            self.poll = PollPhase::Idle { at_mono_ms: self.now.mono_ms + wait };
            return;
        }
        let cutoff_ms = orphan_query_cutoff(self.now.wall_ms, &self.config, interval);
        // With balance every orphan counts as the fleet's work, not only those that fit here.
        let page_size = if self.balanced() { self.settings.max_connections } else { capacity.max(1) };
        // A sharded index is read from a shard picked at random each time: workers that poll
        // at one moment (a fleet started at once) claim from different shards.
        let shards = self.config.orphan_shards.max(1);
        let first_shard = (shards > 1).then(|| ((self.unit() * f64::from(shards)) as u32).min(shards - 1));
        self.poll_first_shard = first_shard.unwrap_or(0);
        self.run(Op::OrphansPage { cutoff_ms, page_size, first_shard }, Pending::Page);
        self.poll = PollPhase::Page;
    }

    fn poll_failed(&mut self, e: &Error) {
        warn!(error = %e, "orphan query failed");
        self.rounds_planned += 1;
        self.orphan_failures += 1;
        let wait = orphan_retry_ms(self.orphan_failures, self.settings.orphan_interval_ms, self.unit());
        self.poll = PollPhase::Idle { at_mono_ms: self.now.mono_ms + wait };
    }

    fn page_answered(&mut self, answer: Answer) {
        if !matches!(self.poll, PollPhase::Page) {
            return;
        }
        let (items, full) = match answer {
            Answer::Orphans { items, full } => (items, full),
            Answer::Failed(e) => return self.poll_failed(&e),
            other => return self.poll_failed(&Error::Store(format!("unexpected answer {other:?}"))),
        };
        self.totals.orphan_polls += 1;
        let round = OrphanRound { page: items, full, ..OrphanRound::default() };
        if self.session_mode() && self.live_session().is_some() {
            self.run(Op::Sessions, Pending::Fleet);
            self.poll = PollPhase::Fleet(round);
        } else {
            self.plan_round(round);
        }
    }

    fn fleet_answered(&mut self, answer: Answer) {
        if !matches!(self.poll, PollPhase::Fleet(_)) {
            return;
        }
        let PollPhase::Fleet(mut round) = std::mem::replace(&mut self.poll, PollPhase::Page) else { return };
        let sessions = match answer {
            Answer::Sessions(sessions) => sessions,
            other => {
                // A failed read of the fleet leaves the limit as it was; the orphans are still claimed.
                warn!(answer = ?other, "reading the sessions failed");
                return self.plan_round(round);
            }
        };
        self.taken_from.retain(|(owner, epoch), _| sessions.iter().any(|s| &s.owner == owner && s.epoch == *epoch));
        // A peer that stops renewing is dead once its expiry is past the skew: the next poll
        // then, not up to a whole interval later. A live peer renews long before; the next
        // poll reads its new expiry, so this wake never comes for it.
        let (wall, mono, skew) = (self.now.wall_ms, self.now.mono_ms, self.config.skew_ms());
        round.peer_dies_at_mono_ms = sessions
            .iter()
            .filter(|s| s.owner != self.settings.worker_id && s.expires_at_ms > 0)
            .map(|s| s.expires_at_ms.saturating_add(skew + 1))
            .filter(|at| *at > wall)
            .min()
            .map(|at| mono + (at - wall));
        let owners: Vec<(String, u64, u64, Option<SessionLoad>)> =
            sessions.iter().map(|s| (s.owner.clone(), s.epoch, s.expires_at_ms, s.load)).collect();
        let (peers, dead) =
            self.balancer.read(sessions, &self.settings.worker_id, self.now.wall_ms, self.now.mono_ms, &self.config);
        self.fleet_size = peers.len() + 1;
        round.peers = Some(peers);
        let me = &self.settings.worker_id;
        let is_dead = |owner: &String, epoch: u64| dead.iter().any(|d| &d.owner == owner && d.epoch == epoch);
        round.live_loads = owners
            .into_iter()
            .filter(|(owner, epoch, expires, _)| *expires > 0 && !is_dead(owner, *epoch))
            .map(|(owner, _, _, load)| (owner, load))
            .collect();
        round.live_owners = round
            .live_loads
            .iter()
            .map(|(owner, _)| owner.clone())
            .filter(|owner| owner != me)
            .chain(std::iter::once(me.clone()))
            .collect();
        let ended: Vec<(String, u64)> =
            dead.iter().filter(|s| s.expires_at_ms == 0).map(|s| (s.owner.clone(), s.epoch)).collect();
        self.ended_seen.retain(|key, _| ended.contains(key));
        for key in ended {
            self.ended_seen.entry(key).or_insert(mono);
        }
        let reclaim_own = std::mem::take(&mut self.reclaim_own);
        round.listed_at = Some(self.now);
        round.listed_own = reclaim_own;
        for (owner, epoch) in dead_session_owners(&dead, &self.settings.worker_id, reclaim_own) {
            self.run(Op::OwnedBy { owner: owner.clone() }, Pending::Owned { owner, epoch });
            round.owned_waiting += 1;
        }
        round.dead_sessions = dead;
        if round.owned_waiting == 0 {
            self.plan_round(round);
        } else {
            self.poll = PollPhase::Fleet(round);
        }
    }

    fn owned_answered(&mut self, owner: String, epoch: Option<u64>, answer: Answer) {
        let PollPhase::Fleet(round) = &mut self.poll else { return };
        round.owned_waiting -= 1;
        match answer {
            Answer::Owned(items) => {
                let listed = items.len();
                let mut ids = Vec::new();
                for item in items.into_iter().filter(|i| !self.tracked.contains_key(&i.id)) {
                    ids.push(item.id.clone());
                    if let Some(epoch) = epoch {
                        round.dead_listed.insert(item.id.clone(), Listed { epoch, item });
                    }
                }
                round.dead.push(DeadSession { owner, epoch, listed, ids });
            }
            other => {
                warn!(answer = ?other, "reading a dead session's work failed");
                round.owned_failed = true;
            }
        }
        if round.owned_waiting == 0 {
            let PollPhase::Fleet(mut round) = std::mem::replace(&mut self.poll, PollPhase::Page) else { return };
            if round.owned_failed {
                // As one failed read of the fleet: no balance, no dead sessions this time (our
                // own earlier work is looked for again next time).
                if round.dead.iter().any(|d| d.epoch.is_none()) || round.dead_sessions.is_empty() {
                    self.reclaim_own = true;
                }
                round.peers = None;
                round.dead.clear();
            }
            // Keep the owners' order stable.
            round.dead.sort_by(|a, b| (a.epoch.is_none(), &a.owner).cmp(&(b.epoch.is_none(), &b.owner)));
            self.plan_round(round);
        }
    }

    /// The page (and the fleet) are read: balance, then queue the claims.
    fn plan_round(&mut self, mut round: OrphanRound) {
        self.rounds_planned += 1;
        if self.stopping {
            self.poll = PollPhase::Idle { at_mono_ms: u64::MAX };
            return;
        }
        self.orphan_failures = 0;
        let own = self.settings.worker_id.clone();
        if let (Some(peers), true) = (round.peers.as_ref(), self.balanced()) {
            let tracked = &self.tracked;
            let (now_ms, config) = (self.now.wall_ms, &self.config);
            let (unowned, in_flight) = orphan_counts(&round.page, now_ms, config, &own, |id| tracked.contains_key(id));
            // The page may be one of many: its shards stand for the rest.
            let (first, shards) = (self.poll_first_shard, config.orphan_shards);
            let counts = |i: &LeaseItem| decide::counts_as_unowned(i, now_ms, config, |id| tracked.contains_key(id));
            let unowned = unowned.max(unowned_estimate(&round.page, round.full, first, shards, counts));
            let orphans: Vec<&LeaseItem> = round.page.iter().filter(|i| counts(i)).collect();
            self.seen_whole = if round.full { None } else { decide::shard_spread(&orphans, shards) };
            let taken = |d: &DeadSession| {
                d.epoch.and_then(|e| self.taken_from.get(&(d.owner.clone(), e))).copied().unwrap_or(0)
            };
            let dead_work: u64 = round.dead.iter().map(|d| dead_work(d, &round.dead_sessions, taken(d))).sum();
            let peers = peers.clone();
            self.balance(&peers, unowned + dead_work, in_flight);
        }
        let capacity = if self.balanced() { self.capacity() } else { self.room() };
        let poll = OrphanPoll {
            items: &round.page,
            page_was_full: round.full,
            now_ms: self.now.wall_ms,
            capacity,
            interval_ms: self.settings.orphan_interval_ms,
            unit: self.unit(),
        };
        let tracked = &self.tracked;
        let plan = plan_orphans(&poll, &self.config, |id| tracked.contains_key(id));
        round.wake_in_ms = plan.wake_in_ms;
        let mut claim = plan.claim;
        if self.balanced() {
            // Claimers racing over one list in one order would mostly collide.
            self.shuffle(&mut claim);
        }
        round.queue.extend(claim.into_iter().map(|id| (id, Source::Orphan)));
        if self.session_mode() {
            let assigned = if self.balanced() {
                let me = &self.settings.worker_id;
                let others: Vec<&String> =
                    round.dead.iter().filter(|d| d.epoch.is_some()).flat_map(|d| &d.ids).collect();
                takeover_assignment(me, &round.live_loads, &others)
            } else {
                None
            };
            for dead in std::mem::take(&mut round.dead) {
                if dead.listed == 0 {
                    // Nothing listed: retired only once the listing was sent late enough for
                    // the owner index to list all the session held (see `listing_is_whole`).
                    if let Some(epoch) = dead.epoch.filter(|e| self.listing_is_whole(&round, &dead.owner, *e)) {
                        self.run(Op::RetireSession { owner: dead.owner.clone(), epoch }, Pending::Retire);
                    }
                    continue;
                }
                let own_work = dead.epoch.is_none();
                let source = if own_work { Source::ReclaimOwn } else { Source::DeadSession };
                let mut ids = dead.ids;
                if self.balanced() {
                    self.shuffle(&mut ids);
                    // The survivors take different connections (rendezvous ranking), so their
                    // takeovers seldom race for one.
                    let me = &self.settings.worker_id;
                    let mine = |id: &String| assigned.as_ref().map(|a| a.contains(id.as_str()));
                    ids.sort_by_cached_key(|id| claim_rank(&round.live_owners, me, id, mine(id)));
                }
                if own_work {
                    round.own_wanted += ids.len();
                } else if let Some(epoch) = dead.epoch {
                    for id in &ids {
                        round.dead_owner.insert(id.clone(), (dead.owner.clone(), epoch));
                    }
                }
                round.queue.extend(ids.into_iter().map(|id| (id, source)));
            }
        }
        self.poll = PollPhase::Claims(round);
    }

    /// Whether the round's listing of the dead session `(owner, epoch)` was sent at least
    /// `index_lag_ms` after the session's last write, so that an owner index lagging less than
    /// that lists every connection the session held: its silence is then an answer. A session
    /// that died holds nothing claimed after its expiry (the listed one: a listing that lags
    /// shows an older expiry, never a later one); an ended one nothing claimed after its end,
    /// which came before this worker first read it as ended.
    fn listing_is_whole(&self, round: &OrphanRound, owner: &str, epoch: u64) -> bool {
        let Some(at) = round.listed_at else { return false };
        let lag = self.settings.index_lag_ms;
        match round.dead_sessions.iter().find(|s| s.owner == owner && s.epoch == epoch) {
            Some(s) if s.expires_at_ms > 0 => {
                at.wall_ms >= s.expires_at_ms.saturating_add(self.config.skew_ms()).saturating_add(lag)
            }
            Some(_) => self
                .ended_seen
                .get(&(owner.to_string(), epoch))
                .is_some_and(|seen| at.mono_ms >= seen.saturating_add(lag)),
            None => false,
        }
    }

    fn shuffle(&mut self, ids: &mut [String]) {
        for i in (1..ids.len()).rev() {
            let j = (self.unit() * (i + 1) as f64) as usize;
            ids.swap(i, j.min(i));
        }
    }

    /// Sets the claim limit from the fleet's load and, paced, hands a few connections over when
    /// this worker is above its share while another is short of its own.
    fn balance(&mut self, peers: &[PeerSession], unowned: u64, in_flight: u64) {
        let pace = self.pace_ms();
        let view = FleetView { me: self.load(), peers, unowned, in_flight };
        let step = self.balancer.step(&view, self.now.mono_ms, pace);
        self.claim_limit = step.claim_limit as usize;
        let (Some(share), count) = (step.share, step.hand_over) else { return };
        if count > 0 && !self.stopping {
            let n = self.hand_over(count as usize);
            info!(
                worker_id = %self.settings.worker_id, handing_over = n, share = share.mine, work = share.work,
                sessions = peers.len() + 1, "above the fair share: handing over"
            );
        }
    }

    /// Starts the round's claims that fit, at most [`CLAIM_CONCURRENCY`] in flight; a claim
    /// lost to another worker frees its room for the next.
    fn drive_poll_claims(&mut self) {
        if !matches!(self.poll, PollPhase::Claims(_)) {
            return;
        }
        let PollPhase::Claims(mut round) = std::mem::replace(&mut self.poll, PollPhase::Page) else { return };
        let mut wave = false;
        while round.in_flight < CLAIM_CONCURRENCY && !self.stopping {
            let Some((id, source)) = round.queue.front().cloned() else { break };
            // Takeovers go in waves, sent together once nothing is in flight: a driver sends
            // those of one dead session as one transaction (one check of its session item for
            // all of them, a partition value every survivor's takeovers would share).
            if source == Source::DeadSession && round.in_flight > 0 && !wave {
                break;
            }
            if source != Source::ReclaimOwn && self.room() == 0 {
                if round.in_flight > 0 {
                    break; // one in flight may fail and free room
                }
                // No room: what is left of others' work waits for the next poll.
                round.queue.retain(|(_, s)| *s == Source::ReclaimOwn);
                continue;
            }
            if !self.take_claim_token(source != Source::Orphan) {
                break;
            }
            round.queue.pop_front();
            let listed = if source == Source::DeadSession { round.dead_listed.remove(&id) } else { None };
            match self.try_claim(&id, source, ClaimFrom::Poll, listed) {
                Ok(()) => {
                    round.in_flight += 1;
                    wave |= source == Source::DeadSession;
                }
                Err(Claim::Stopping) => round.queue.clear(),
                Err(_) => {}
            }
        }
        if self.stopping {
            round.queue.clear();
        }
        if round.queue.is_empty() && round.in_flight == 0 {
            self.end_round(round);
        } else {
            self.poll = PollPhase::Claims(round);
        }
    }

    fn end_round(&mut self, round: OrphanRound) {
        let early = round.listed_at.is_some_and(|at| at.mono_ms < self.reclaim_own_until_mono_ms);
        if round.own_claimed < round.own_wanted || (round.listed_own && early) {
            // Some of our earlier work is still listed under us, or the index may not list all
            // of it yet: look again at the next poll.
            self.reclaim_own = true;
        }
        for (owner, claimed) in &round.takeovers {
            info!(owner = %owner, claimed, "took over a dead session's work");
        }
        let mut wake = self.now.mono_ms + round.wake_in_ms;
        if round.wake_in_ms == 0 && self.balanced() {
            // More orphans wait, but each round lists every session again (one partition value
            // of the index, read by the whole fleet): at most one round every half interval.
            let listed = round.listed_at.map_or(self.now.mono_ms, |at| at.mono_ms);
            wake = wake.max(listed + self.settings.orphan_interval_ms / 2);
        }
        let next = wake.min(round.peer_dies_at_mono_ms.unwrap_or(u64::MAX));
        let at = if self.poll_again { self.now.mono_ms } else { next };
        self.poll_again = false;
        self.poll = PollPhase::Idle { at_mono_ms: at };
    }

    fn claim_done(&mut self, id: &str, source: Source, from: ClaimFrom, outcome: Claim) {
        if outcome == Claim::Conflict {
            // Refused by the item's condition: nothing reached the index.
            match source {
                Source::Orphan => self.claim_tokens += 1.0,
                _ => self.spread_tokens += 1.0,
            }
        }
        match from {
            ClaimFrom::Poll => {
                let PollPhase::Claims(round) = &mut self.poll else { return };
                round.in_flight -= 1;
                if source == Source::DeadSession {
                    round.wave_taken += usize::from(outcome == Claim::Claimed);
                    round.wave_refused += usize::from(outcome == Claim::Conflict);
                    if round.in_flight == 0 {
                        if decide::takeover_wave_was_lost(round.wave_taken, round.wave_refused) {
                            // Every takeover of the wave was refused: the survivors are taking
                            // the dead session's work faster than this list ages. Going on
                            // down it would mostly collide with them (each refusal a write to
                            // the item, each wave a check of the one dead session's item); what
                            // is still unclaimed is listed again at the next round.
                            round.queue.retain(|(_, s)| *s != Source::DeadSession);
                        }
                        (round.wave_taken, round.wave_refused) = (0, 0);
                    }
                }
                if outcome == Claim::Claimed {
                    match source {
                        Source::ReclaimOwn => {
                            round.own_claimed += 1;
                            self.totals.session_takeovers += 1;
                        }
                        Source::DeadSession => self.totals.session_takeovers += 1,
                        _ => {}
                    }
                    if let Some(dead) = round.dead_owner.get(id).filter(|_| source == Source::DeadSession) {
                        *round.takeovers.entry(dead.0.clone()).or_default() += 1;
                        *self.taken_from.entry(dead.clone()).or_default() += 1;
                    }
                }
            }
            ClaimFrom::Hint(i) => {
                if let Some(batch) = &mut self.hint_batch {
                    batch.in_flight -= 1;
                    if let Some(slot) = batch.outcomes.get_mut(i) {
                        *slot = Some(outcome);
                    }
                }
            }
        }
    }

    /// Session mode paces claims by the orphan index's partitions: takes one claim's token, or
    /// says when the next is there. Claims from an orphan page come from one shard at a time
    /// ([`decide::claim_rate_per_s`] for this fleet's size); `spread`: claims of work spread
    /// over every shard (a dead session's, hinted work), whose index writes every shard shares
    /// ([`decide::spread_claim_rate_per_s`]: a worker hands a deploy's or a crash's work on at
    /// the fleet's pace, not at a one-shard crowd's).
    fn take_claim_token(&mut self, spread: bool) -> bool {
        if !self.balanced() {
            return true;
        }
        let (rate, tokens, at) = if spread {
            let rate = decide::spread_claim_rate_per_s(self.config.orphan_shards, self.fleet_size);
            (rate, &mut self.spread_tokens, &mut self.spread_tokens_at_mono_ms)
        } else {
            let rate = decide::claim_rate_per_s(self.config.orphan_shards, self.fleet_size, self.seen_whole);
            (rate, &mut self.claim_tokens, &mut self.claim_tokens_at_mono_ms)
        };
        let now = self.now.mono_ms;
        let elapsed_s = now.saturating_sub(*at) as f64 / 1_000.0;
        let burst = rate.max(CLAIM_CONCURRENCY as f64);
        *tokens = (*tokens + elapsed_s * rate).min(burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            return true;
        }
        let wait_ms = ((1.0 - *tokens) / rate * 1_000.0).ceil() as u64;
        self.claims_paced_until = Some(now + wait_ms.max(1));
        false
    }

    /// With balance: when the session should renew early to report a load that has moved by
    /// [`decide::report_change`] since its last report (claims of a cold start or a burst of new
    /// work), at most every [`decide::REPORT_MIN_GAP_MS`]: peers count this worker's load
    /// from its last report, and one renew interval behind they would undercount the fleet's
    /// work and stop below their shares.
    fn report_due_at(&self) -> Option<u64> {
        // Only a live session with no renewal in flight can send a report: a report due while
        // the session is closed (or being renewed) would ask to be woken now again and again.
        if !self.balanced() || self.stopping || !matches!(self.session, SessionPhase::Live { renewing: false, .. }) {
            return None;
        }
        let moved = self.tracked.len().abs_diff(self.reported_tracked);
        (moved >= decide::report_change(self.settings.max_connections))
            .then_some(self.report_sent_mono_ms + decide::REPORT_MIN_GAP_MS)
    }

    /// Wakes the orphan poll now (hints arrived, a new epoch began).
    fn poll_orphans_now(&mut self) {
        match &mut self.poll {
            PollPhase::Idle { at_mono_ms } => *at_mono_ms = (*at_mono_ms).min(self.now.mono_ms),
            _ => self.poll_again = true,
        }
    }

    // ---- hints ----

    fn hints_received(&mut self, received: Result<Vec<HintMessage>, String>) {
        if !matches!(self.hints, HintPhase::Receiving) {
            return;
        }
        let next =
            |e: &Self, at_mono_ms: u64| if e.stopping { HintPhase::Done } else { HintPhase::Idle { at_mono_ms } };
        let messages = match received {
            Ok(messages) => {
                self.hint_failures = 0;
                messages
            }
            Err(error) => {
                self.hint_failures += 1;
                let delay = hint_retry_ms(self.hint_failures, self.unit());
                warn!(%error, retry_in_ms = delay, "hint receive failed");
                self.hints = next(self, self.now.mono_ms + delay);
                return;
            }
        };
        if messages.is_empty() {
            self.hints = next(self, self.now.mono_ms);
            return;
        }
        self.totals.hints_received += messages.len() as u64;
        debug!(received = messages.len(), below_limit = self.below_claim_limit(), "hints received");
        // Hints come in tens: one index query finds all the work they point at. At the fair
        // share, one read of the sessions first says whether the share has grown.
        let round_ahead = !matches!(self.poll, PollPhase::Claims(_));
        self.poll_orphans_now();
        let hinted = messages
            .iter()
            .filter_map(|m| m.body.as_deref().and_then(|b| Hint::from_json(b).ok()))
            .map(|h| h.connection_id)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|id| !self.tracked.contains_key(id))
            .count() as u64;
        let mut batch = self.hint_batch.take().unwrap_or(HintBatch {
            hinted: 0,
            messages: Vec::new(),
            outcomes: Vec::new(),
            queue: VecDeque::new(),
            in_flight: 0,
            refresh_until: None,
            refreshed: false,
            round_wait: None,
        });
        // A session that ended hints its work once it is free: the round about to read the
        // fleet finds that session dead and takes its work as listed (no first write that the
        // session's sentinel refuses, and together: one [`Op::TakeOver`]).
        if self.session_mode() && round_ahead && !self.stopping && batch.round_wait.is_none() {
            batch.round_wait = Some((self.rounds_planned, self.now.mono_ms + HINT_ROUND_WAIT_MS));
        }
        batch.hinted += hinted;
        let first = batch.messages.len();
        batch.queue.extend(first..first + messages.len());
        batch.outcomes.resize(first + messages.len(), None);
        batch.messages.extend(messages);
        // A round about to read the fleet sets the limit anyway: no read of the sessions of
        // its own (every worker a deploy's hints reach reads them at once).
        if batch.round_wait.is_none() {
            self.refresh_limit(&mut batch);
        }
        self.hint_batch = Some(batch);
        // The next poll opens once the batch is settled, or after the overlap if it is not.
        self.hints = next(self, self.now.mono_ms + HINT_POLL_OVERLAP_MS);
    }

    /// A batch at the claim limit reads the sessions once to set the limit again (its claims
    /// wait for the answer, at most one orphan interval); says whether it did.
    fn refresh_limit(&mut self, batch: &mut HintBatch) -> bool {
        if self.below_claim_limit() || self.stopping || batch.refreshed {
            return false;
        }
        batch.refreshed = true;
        self.run(Op::Sessions, Pending::RefreshLimit);
        batch.refresh_until = Some(self.now.mono_ms + self.settings.orphan_interval_ms);
        true
    }

    /// Hints received and waiting for a claim.
    fn hints_waiting(&self) -> usize {
        self.hint_batch.as_ref().map_or(0, |b| b.queue.len())
    }

    /// Room for hints not yet received: the free capacity less the hints waiting for a claim;
    /// none while claims wait for the store's clock (the hints are left to the others).
    fn hint_room(&self) -> usize {
        if self.claims_paused().is_some() {
            return 0;
        }
        self.capacity().saturating_sub(self.hints_waiting())
    }

    fn drive_hints(&mut self) {
        // Claims first: a batch they settle opens the next poll now.
        self.claim_hints();
        if let HintPhase::Idle { at_mono_ms } = self.hints {
            if self.stopping {
                self.hints = HintPhase::Done;
            } else if at_mono_ms <= self.now.mono_ms && self.hint_room() > 0 {
                // Only take hints while there is room: a full worker leaves them to the others.
                let max = hint_batch_size(self.room().saturating_sub(self.hints_waiting()).max(1)) as usize;
                self.commands.push_back(Command::ReceiveHints { max, wait_ms: self.settings.hint_wait_ms });
                self.hints = HintPhase::Receiving;
            }
        }
    }

    /// Claims the hinted work of the batch (a few at a time); settles the batch once every
    /// claim is answered.
    fn claim_hints(&mut self) {
        let Some(mut batch) = self.hint_batch.take() else { return };
        if batch.refresh_until.is_some_and(|until| until > self.now.mono_ms) {
            self.hint_batch = Some(batch);
            return;
        }
        batch.refresh_until = None;
        if let Some((planned, until)) = batch.round_wait {
            if self.rounds_planned == planned && until > self.now.mono_ms && !self.stopping {
                self.hint_batch = Some(batch);
                return;
            }
            batch.round_wait = None;
            // The round was not in time to set the limit (its queries are slow, or it read
            // nothing new): the batch reads the sessions itself, as one with no round ahead does.
            if self.refresh_limit(&mut batch) {
                self.hint_batch = Some(batch);
                return;
            }
        }
        while batch.in_flight < HINT_CLAIM_CONCURRENCY {
            if batch.queue.is_empty() || !self.take_claim_token(true) {
                break;
            }
            let Some(i) = batch.queue.pop_front() else { break };
            let outcome = match batch.messages[i].body.as_deref().map(Hint::from_json) {
                Some(Ok(hint)) => {
                    let source = if hint.stranded { Source::Stranded } else { Source::Hint };
                    match self.try_claim(&hint.connection_id, source, ClaimFrom::Hint(i), None) {
                        Ok(()) => {
                            batch.in_flight += 1;
                            continue;
                        }
                        Err(outcome) => outcome,
                    }
                }
                Some(Err(e)) => {
                    warn!(receipt = %batch.messages[i].receipt, error = %e, "unreadable hint dropped");
                    Claim::Failed
                }
                None => Claim::Failed,
            };
            batch.outcomes[i] = Some(outcome);
        }
        if batch.queue.is_empty() && batch.in_flight == 0 {
            self.settle_hints(batch);
        } else {
            self.hint_batch = Some(batch);
        }
    }

    /// Deletes every handled hint (claimed or not: it was only a hint); a hint this worker had
    /// no room for is made visible again at once, for another worker; one it declined while its
    /// clock is not trusted one orphan interval later. One declined at the fair share (read
    /// again for the batch) is deleted too: the fleet's orphan and dead-session rounds find the
    /// work within an interval, and a hint deferred at the share came back to the next worker
    /// at its share, and the next, for as long as the queue kept it (each receipt a read of
    /// the sessions' partition value: in the simulation's steady state at 100,000 connections,
    /// about a third of those reads).
    fn settle_hints(&mut self, batch: HintBatch) {
        let mut delete = Vec::new();
        let mut give_back = Vec::new();
        let mut defer = Vec::new();
        for (m, outcome) in batch.messages.into_iter().zip(batch.outcomes) {
            match outcome {
                Some(Claim::NoCapacity | Claim::Stopping) => give_back.push(m.receipt),
                // Another worker may take it meanwhile; the orphan index finds it otherwise.
                Some(Claim::ClockUntrusted) => defer.push(m.receipt),
                _ => delete.push(m.receipt),
            }
        }
        let defer_ms = self.settings.orphan_interval_ms;
        self.commands.push_back(Command::SettleHints { delete, give_back, defer, defer_ms });
        // The poll the batch held back opens now (one already open or failing keeps its time).
        if let HintPhase::Idle { at_mono_ms } = &mut self.hints {
            if !self.stopping && self.hint_failures == 0 {
                *at_mono_ms = (*at_mono_ms).min(self.now.mono_ms);
            }
        }
    }

    // ---- the session ----

    fn session_created(&mut self, answer: Answer) {
        let SessionPhase::Opening { previous, failures } = self.session else { return };
        match answer {
            Answer::Session(session) => {
                info!(worker_id = %self.settings.worker_id, epoch = session.epoch, "session opened");
                self.cover_all(&session);
                self.session = SessionPhase::Live { session, renewing: false };
                // Work of an earlier epoch of ours is claimed back like a dead session's, listed
                // until the index has caught up with the writes of the earlier epochs.
                self.reclaim_own = true;
                self.reclaim_own_until_mono_ms = self.now.mono_ms.saturating_add(self.settings.index_lag_ms);
                self.poll_orphans_now();
            }
            Answer::Failed(e) => {
                // Our own session of an earlier run that still lives by rule 1 is waited out.
                let unit = self.unit();
                let wait = session_retry_ms(&e, failures, self.now.wall_ms, &self.config, unit);
                warn!(worker_id = %self.settings.worker_id, error = %e, wait_ms = wait, "session not opened");
                self.session = SessionPhase::Closed {
                    retry_at_mono_ms: self.now.mono_ms + wait,
                    failures: failures + 1,
                    previous,
                };
            }
            other => {
                warn!(answer = ?other, "unexpected answer to a session");
                self.session =
                    SessionPhase::Closed { retry_at_mono_ms: self.now.mono_ms, failures: failures + 1, previous };
            }
        }
    }

    fn session_renewed(&mut self, round: u64, sent_mono_ms: u64, answer: Answer) {
        let SessionPhase::Live { session, renewing: true } = &self.session else { return };
        let epoch = session.epoch;
        match answer {
            Answer::Session(renewed) if !renewed.is_past_deadline(self.now.mono_ms) => {
                if self.session_renew_latency_ms.len() < MAX_LATENCY_SAMPLES {
                    self.session_renew_latency_ms.push(self.now.mono_ms.saturating_sub(sent_mono_ms));
                }
                self.cover_all(&renewed);
                self.session = SessionPhase::Live { session: renewed, renewing: false };
                self.start_hand_overs(round);
            }
            other => {
                let error = match other {
                    Answer::Failed(e) => e.to_string(),
                    _ => "past its deadline".to_string(),
                };
                warn!(worker_id = %self.settings.worker_id, epoch, %error, "session lost");
                self.lose_session(epoch);
            }
        }
    }

    fn drive_session(&mut self) {
        let now = self.now.mono_ms;
        match &self.session {
            SessionPhase::Closed { retry_at_mono_ms, failures, previous } => {
                if self.stopping {
                    if self.tracked.is_empty() {
                        self.session = SessionPhase::Ended;
                    }
                    return;
                }
                if *retry_at_mono_ms <= now {
                    let (failures, previous) = (*failures, *previous);
                    self.run(Op::CreateSession { previous }, Pending::CreateSession);
                    self.session = SessionPhase::Opening { previous, failures };
                }
            }
            SessionPhase::Live { session, renewing } => {
                let session = session.clone();
                if now >= session.deadline_mono_ms {
                    warn!(worker_id = %self.settings.worker_id, epoch = session.epoch, "session past its deadline");
                    self.lose_session(session.epoch);
                    return;
                }
                if *renewing {
                    return;
                }
                if self.stopping && self.tracked.is_empty() {
                    // One write frees everything still held, then the work is hinted.
                    let load = SessionLoad {
                        held: self.held_at_shutdown.len() as u64,
                        max_connections: self.settings.max_connections as u64,
                    };
                    self.run(Op::EndSession { session, load }, Pending::EndSession);
                    self.session = SessionPhase::Ending;
                    return;
                }
                let report = self.report_due_at().is_some_and(|at| at <= now);
                if now >= session_wake_at(&session, &self.config) || self.renew_session_now || report {
                    self.renew_session_now = false;
                    (self.reported_tracked, self.report_sent_mono_ms) = (self.tracked.len(), now);
                    // The round first: a pick made after the load was read waits for the next renewal.
                    let round = self.hand_over_rounds;
                    let load = self.load();
                    let until_mono_ms = session.deadline_mono_ms;
                    self.run(
                        Op::RenewSession { session, load, until_mono_ms },
                        Pending::RenewSession { round, sent_mono_ms: now },
                    );
                    if let SessionPhase::Live { renewing, .. } = &mut self.session {
                        *renewing = true;
                    }
                }
            }
            _ => {}
        }
    }

    // ---- shutdown ----

    fn shutdown(&mut self) {
        if self.stopping {
            return;
        }
        self.stopping = true;
        self.held_at_shutdown = self.held_ids();
        info!(worker_id = %self.settings.worker_id, held = self.held_at_shutdown.len(), "shutting down");
        for id in self.held_at_shutdown.clone() {
            self.cancel(&id, CancelReason::Shutdown);
        }
        // Reads in flight are not waited for.
        if matches!(self.poll, PollPhase::Page | PollPhase::Fleet(_)) {
            self.poll = PollPhase::Idle { at_mono_ms: u64::MAX };
        }
        self.pending.retain(|_, p| {
            !matches!(
                p,
                Pending::Page
                    | Pending::Fleet
                    | Pending::Owned { .. }
                    | Pending::DesiredStates
                    | Pending::Settle { .. }
            )
        });
        if let HintPhase::Idle { .. } = self.hints {
            self.hints = HintPhase::Done;
        }
    }

    fn drive_shutdown(&mut self) {
        if !self.stopping || self.finished {
            return;
        }
        let hints_done = matches!(self.hints, HintPhase::Off | HintPhase::Done) && self.hint_batch.is_none();
        let session_done = matches!(self.session, SessionPhase::Off | SessionPhase::Ended);
        let poll_done = !matches!(self.poll, PollPhase::Claims(_));
        // Writes still in flight (releases, give-backs) are waited for by the driver.
        if self.tracked.is_empty() && hints_done && session_done && poll_done {
            self.commands.push_back(Command::EmitMetrics);
            self.finished = true;
            info!(worker_id = %self.settings.worker_id, released = self.totals.released, "worker stopped");
            self.commands.push_back(Command::Finished);
        }
    }

    // ---- time ----

    /// Starts whatever is due or possible now.
    fn advance(&mut self) {
        self.step();
        self.send_takeovers();
        self.schedule_dirty();
        self.next_timeout = self.compute_timeout();
    }

    /// A new entry in `wakes` for every lease changed in this step.
    fn schedule_dirty(&mut self) {
        let now = self.now.mono_ms;
        for id in std::mem::take(&mut self.dirty) {
            let Some(Tracked::Held(h)) = self.tracked.get(&id) else { continue };
            let mut at =
                h.abort_at.filter(|_| !h.ended).unwrap_or(u64::MAX).min(h.release_again_at.unwrap_or(u64::MAX));
            if h.keeping {
                at = at.min(match (h.renewing, h.keeper.poll(now)) {
                    (Some(_), _) => h.keeper.deadline_mono_ms(),
                    (None, Wake::SleepUntil(t)) => t,
                    (None, _) => now,
                });
            }
            if at != u64::MAX && !self.finished {
                self.wakes.push(std::cmp::Reverse((at, id)));
            }
        }
    }

    fn step(&mut self) {
        if self.finished {
            return;
        }
        let now = self.now.mono_ms;
        self.claims_paced_until = None;
        // Held leases: deadlines, renewals, aborts.
        let mut deadline = Vec::new();
        let mut renew = Vec::new();
        let mut abort = Vec::new();
        let mut release = Vec::new();
        let mut due = BTreeSet::new();
        while let Some(std::cmp::Reverse((at, _))) = self.wakes.peek() {
            if *at > now {
                break;
            }
            let Some(std::cmp::Reverse((_, id))) = self.wakes.pop() else { break };
            due.insert(id);
        }
        for id in due {
            let Some(Tracked::Held(h)) = self.tracked.get_mut(&id) else { continue };
            self.dirty.insert(id.clone());
            if h.abort_at.is_some_and(|at| at <= now) && !h.ended {
                h.abort_at = None;
                abort.push(id.clone());
            }
            if h.release_again_at.is_some_and(|at| at <= now) {
                h.release_again_at = None;
                release.push(id.clone());
            }
            if !h.keeping {
                continue;
            }
            match h.keeper.poll(now) {
                Wake::Deadline => deadline.push(id),
                Wake::Renew { until_mono_ms } if h.renewing.is_none() && h.keeper.upkeep() == Upkeep::Renew => {
                    renew.push((id, until_mono_ms))
                }
                _ => {}
            }
        }
        for id in abort {
            self.commands.push_back(Command::AbortHandler { id });
        }
        for id in release {
            if self.stopping {
                // The session's end frees it with everything else.
                self.forget(&id);
            } else {
                self.run(Op::Release { id: id.clone() }, Pending::Release { id });
            }
        }
        for id in deadline {
            if !self.cancel(&id, CancelReason::Deadline) {
                if let Some(Tracked::Held(h)) = self.tracked.get_mut(&id) {
                    h.keeping = false;
                }
            }
        }
        for (id, until_mono_ms) in renew {
            let op = self.run(Op::Renew { id: id.clone(), until_mono_ms }, Pending::Renew { id: id.clone() });
            if let Some(Tracked::Held(h)) = self.tracked.get_mut(&id) {
                h.renewing = Some((op, now));
            }
        }
        self.drive_session();
        if !self.stopping {
            if matches!(self.poll, PollPhase::Idle { at_mono_ms } if at_mono_ms <= now) {
                self.start_poll();
            }
            if self.desired_at_mono_ms <= now {
                let interval = self.settings.desired_state_interval_ms;
                // The period is exact; a late tick moves the next one (no burst of catch-ups).
                self.desired_at_mono_ms = (self.desired_at_mono_ms + interval).max(now + 1);
                let ids = self.held_ids();
                if !ids.is_empty() && !self.desired_in_flight {
                    self.desired_in_flight = true;
                    self.run(Op::DesiredStates { ids }, Pending::DesiredStates);
                }
            }
            if self.metrics_at_mono_ms <= now {
                self.metrics_at_mono_ms = (self.metrics_at_mono_ms + self.settings.metrics_interval_ms).max(now + 1);
                self.commands.push_back(Command::EmitMetrics);
            }
        }
        self.drive_poll_claims();
        self.drive_hints();
        // A claim may have ended a round or a batch that the drivers above started.
        self.drive_session();
        self.drive_shutdown();
    }

    // ---- reports ----

    /// The counters, what is held, and the latencies since the last call.
    pub fn take_metrics(&mut self) -> Metrics {
        Metrics {
            totals: self.totals,
            held: self.held_ids().len(),
            session_live: self.live_session().is_some(),
            renew_latency_ms: std::mem::take(&mut self.renew_latency_ms),
            session_renew_latency_ms: std::mem::take(&mut self.session_renew_latency_ms),
            clock: self.clock,
        }
    }

    pub fn totals(&self) -> Totals {
        self.totals
    }

    pub fn snapshot(&self) -> WorkerSnapshot {
        let c = self.totals;
        WorkerSnapshot {
            worker_id: self.settings.worker_id.clone(),
            max_connections: self.settings.max_connections,
            held: self.held_ids(),
            acquired: c.acquired,
            acquire_conflicts: c.acquire_conflicts,
            acquire_errors: c.acquire_errors,
            leases_lost: c.leases_lost,
            released: c.released,
            handler_errors: c.handler_errors,
            handler_panics: c.handler_panics,
            orphan_polls: c.orphan_polls,
            hints_received: c.hints_received,
            session_epoch: self.live_session().map(|s| s.epoch),
            session_takeovers: c.session_takeovers,
            takeover_transactions: c.takeover_transactions,
            handed_over: c.handed_over,
            claim_limit: self.balanced().then_some(self.claim_limit),
            stopping: self.stopping,
            clock_offset_ms: self.clock.map(|c| c.offset_ms),
            clock_uncertainty_ms: self.clock.map(|c| c.uncertainty_ms),
            claims_paused: self.claims_paused(),
        }
    }
}

#[cfg(test)]
mod tests;
