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
//!
//! This file is the façade: the state, the driver's calls and one step of time. Each room holds
//! one concern: `vocabulary` (what drivers read and answer), `held` (held leases, their
//! keepers, handlers, hand-overs and wakes), `claims` (whether a claim may start, its answer),
//! `answers` (what each operation in flight was for), `own_session` (this worker's session),
//! `orphan_round` (orphan page, fleet, dead sessions, balance step, pacing), `takeover` (a dead
//! session's work: assignment and transactions), `hint_batch` (the hint queue), `balance` (fair
//! shares), `shutdown`, `report` (totals, snapshot, metrics line), `execute` (the one executor
//! of an [`Op`] against a store).

mod answers;
mod balance;
mod claims;
pub mod decide;
mod execute;
#[cfg(any(test, feature = "sim"))]
pub mod explore;
mod held;
mod hint_batch;
mod orphan_round;
mod own_session;
mod report;
mod shutdown;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
mod takeover;
pub mod trace;
mod vocabulary;

use answers::*;
use claims::*;
use held::*;
use hint_batch::*;
use orphan_round::*;
use own_session::*;
pub use report::{ClockReading, Metrics, Totals, WorkerSnapshot};
use takeover::*;
pub use vocabulary::*;

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

/// Renewal latencies kept between two metrics lines (about 700 leases x 12 renewals a minute).
const MAX_LATENCY_SAMPLES: usize = 20_000;

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
    /// The workers claiming beside this one, this one included: in session mode the live
    /// sessions of the last listing; in per-item mode, which lists no fleet, the fewest workers
    /// that can hold the work nobody holds (the last page's estimate over `max_connections`).
    fleet_size: usize,
    /// The last listing of the sessions, as read: hints of an ended session raise the claim
    /// limit from it with that session ended, with no read of their own.
    last_sessions: Vec<SessionItem>,
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
            last_sessions: Vec::new(),
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

    /// A uniform draw in [0, 1) from the seeded source.
    fn unit(&mut self) -> f64 {
        crate::config::unit_draw(&mut self.rng)
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

    // ---- time ----

    /// Starts whatever is due or possible now.
    fn advance(&mut self) {
        self.step();
        self.send_takeovers();
        self.schedule_dirty();
        self.next_timeout = self.compute_timeout();
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
}

#[cfg(test)]
mod tests;
