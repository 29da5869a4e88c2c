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

mod balance;
pub mod decide;
mod execute;
#[cfg(any(test, feature = "sim"))]
pub mod explore;
mod hint_batch;
mod orphan_round;
mod own_session;
mod report;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
mod takeover;
pub mod trace;
mod vocabulary;

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
    EndSession {
        epoch: u64,
        held: u64,
    },
    /// The item of a hint whose session has ended, read before its takeover (the hint batch's
    /// message `index`; the ended session `(owner, epoch)`).
    EndedRead {
        id: String,
        index: usize,
        owner: String,
        epoch: u64,
    },
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
        let session = self.may_claim(id, source)?;
        let session_epoch = session.as_ref().map(|s| s.epoch);
        self.tracked.insert(id.to_string(), Tracked::Claiming);
        self.run(
            Op::Claim { id: id.to_string(), listed: listed.filter(|_| session.is_some()), session },
            Pending::Claim { id: id.to_string(), source, session_epoch, from },
        );
        Ok(())
    }

    /// Whether a claim of `id` may start now, and under which session.
    fn may_claim(&self, id: &str, source: Source) -> Result<Option<Session>, Claim> {
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
        match (self.session_mode(), self.live_session()) {
            (false, _) => Ok(None),
            (true, Some(s)) => Ok(Some(s.clone())),
            (true, None) => Err(Claim::Failed),
        }
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
                            self.commands.push_back(Command::SendHint { id: id.clone(), ended: None });
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
            Pending::EndSession { epoch, held } => {
                // Hints of work under a session that has ended say so: the receivers take it
                // over as they read it, with no read of the fleet's sessions.
                let ended = match answer {
                    Answer::Done => {
                        info!(worker_id = %self.settings.worker_id, "session ended");
                        Some(crate::EndedSession { owner: self.settings.worker_id.clone(), epoch, held })
                    }
                    Answer::Failed(e) => {
                        warn!(worker_id = %self.settings.worker_id, error = %e, "session end failed; it will expire");
                        None
                    }
                    _ => None,
                };
                if self.settings.hints {
                    for id in std::mem::take(&mut self.held_at_shutdown) {
                        self.commands.push_back(Command::SendHint { id, ended: ended.clone() });
                    }
                }
                self.session = SessionPhase::Ended;
            }
            Pending::EndedRead { id, index, owner, epoch } => self.ended_read(id, index, owner, epoch, answer),
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
                    self.last_sessions = sessions;
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
}

#[cfg(test)]
mod tests;
