//! The worker's decisions as plain functions of (what the store said, now, config): what to
//! claim, when to poll again, what a renewal result means, when to give up on a lease. The
//! engine ([`super::Engine`]) is made of these; the Node driver still calls some directly.

use std::collections::HashMap;
use std::time::Duration;

use crate::lease::{backoff_ms, claim_cutoff, is_orphan};
use crate::{DesiredState, Error, Lease, LeaseItem, Session, SessionItem, TableConfig};

// The fleet's balance (session mode) has a file of its own; its decisions are read from here too.
pub use super::balance::*;

// Why a handler's token fired is the keeper's word (a held lease of any kind is cancelled with one).
pub use crate::keeper::CancelReason;

/// Whether the worker gives the lease up (expiry 0) once the handler has ended. A lost lease is
/// someone else's now; after a missed deadline the release is still safe (it is conditional on
/// owner and fence) and lets the next owner start without waiting for the expiry.
pub fn should_release(reason: Option<CancelReason>) -> bool {
    !matches!(reason, Some(CancelReason::Lost))
}

/// Whether the end of a lease counts as a lost lease in the metrics.
pub fn counts_as_lost(reason: Option<CancelReason>) -> bool {
    matches!(reason, Some(CancelReason::Lost | CancelReason::Deadline))
}

/// Whether the worker releases the connection itself once its handler has ended: as
/// [`should_release`], except at shutdown in session mode, where one session write frees
/// everything the worker holds.
pub fn releases_after_handler(reason: Option<CancelReason>, session_mode: bool) -> bool {
    should_release(reason) && !(session_mode && reason == Some(CancelReason::Shutdown))
}

/// The design's defaults for a worker (every driver uses these).
pub const DEFAULT_MAX_CONNECTIONS: usize = 700;
/// The most connections one worker may be set to hold.
pub const MAX_CONNECTIONS_LIMIT: usize = 100_000;
pub const DEFAULT_ORPHAN_INTERVAL: Duration = Duration::from_secs(2);
pub const DEFAULT_DESIRED_STATE_INTERVAL: Duration = Duration::from_secs(10);
pub const DEFAULT_METRICS_INTERVAL: Duration = Duration::from_secs(60);
pub const DEFAULT_HANDLER_GRACE: Duration = Duration::from_secs(5);
/// The hint queue's long-poll wait; a shutdown waits for the poll in flight, so keep it short.
pub const DEFAULT_HINT_WAIT: Duration = Duration::from_secs(5);
/// How far behind the table the owner index may be (DynamoDB's global secondary indexes are
/// eventually consistent: usually under a second, longer under write pressure). A dead session
/// whose work the index does not list is retired only once a listing sent this long after the
/// session's last write still lists nothing: work claimed just before it died is taken over,
/// not stranded, whenever the index lags less than this.
pub const DEFAULT_INDEX_LAG: Duration = Duration::from_secs(10);
/// SQS's longest long poll.
pub const MAX_HINT_WAIT: Duration = Duration::from_secs(20);
/// How long after its wait time a long poll may still take to be answered.
pub const POLL_ANSWER_MARGIN: Duration = Duration::from_secs(5);
/// How long a hand-over hint (work released at shutdown) may take to send.
pub const HAND_OVER_TIMEOUT: Duration = Duration::from_secs(2);
/// Claims in flight at once from one orphan poll (a crashed peer's work is taken in parallel).
pub const CLAIM_CONCURRENCY: usize = 16;
/// Claims in flight at once from one batch of hints.
pub const HINT_CLAIM_CONCURRENCY: usize = 10;
/// How long a batch of hints whose claims are still in flight holds the next long poll back.
/// A batch answered sooner (the usual case) runs one poll at a time; a slower one (its claims
/// wait on a loaded table) lets the hints of a hand-over that trickle in meanwhile be received
/// at once, not after the whole batch.
pub const HINT_POLL_OVERLAP_MS: u64 = 200;
/// Session mode: how long a batch of hints waits for the orphan round it started (its reads of
/// the index, the fleet and a dead session's work) before its own claims go.
pub const HINT_ROUND_WAIT_MS: u64 = 500;

/// How much of a `[0, 1)` random draw moves a periodic interval: ±20 %.
pub const JITTER_FRACTION: f64 = 0.2;

/// `interval_ms` moved by up to ±[`JITTER_FRACTION`], so a fleet does not poll in step.
pub fn jittered_ms(interval_ms: u64, unit: f64) -> u64 {
    let factor = 1.0 - JITTER_FRACTION + 2.0 * JITTER_FRACTION * unit.clamp(0.0, 1.0);
    (interval_ms as f64 * factor).round() as u64
}

/// How far past "claimable now" the orphan query looks: the longest jittered interval and a
/// margin. An item that becomes claimable before the next regular poll is seen by this one, so
/// the poll can be scheduled right after its expiry instead of up to one interval later.
pub fn orphan_lookahead_ms(interval_ms: u64) -> u64 {
    jittered_ms(interval_ms, 1.0) + 250
}

/// The cutoff to query the orphan index with at wall time `now_ms`.
pub fn orphan_query_cutoff(now_ms: u64, config: &TableConfig, interval_ms: u64) -> u64 {
    claim_cutoff(now_ms, config) + orphan_lookahead_ms(interval_ms)
}

/// When to query the orphan index again after `failures` failed polls in a row.
pub fn orphan_retry_ms(failures: u32, interval_ms: u64, unit: f64) -> u64 {
    interval_ms + backoff_ms(failures, interval_ms / 4, 4 * interval_ms, unit)
}

/// When to poll the hint queue again after `failures` failed receives in a row.
pub fn hint_retry_ms(failures: u32, unit: f64) -> u64 {
    backoff_ms(failures, 200, 10_000, unit)
}

/// The random phase of the desired-state loop: spreads a fleet's reads over one interval (after
/// it the period is exact, so a STOP is seen within one interval).
pub fn desired_state_phase_ms(interval_ms: u64, unit: f64) -> u64 {
    (interval_ms as f64 * unit.clamp(0.0, 1.0)) as u64
}

/// What one orphan poll decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrphanPlan {
    /// Ids to claim now, oldest expiry first, at most the capacity.
    pub claim: Vec<String>,
    /// When to poll again, from now.
    pub wake_in_ms: u64,
}

/// One orphan poll's inputs.
#[derive(Debug, Clone, Copy)]
pub struct OrphanPoll<'a> {
    /// What the query (cutoff [`orphan_query_cutoff`]) returned, oldest expiry first.
    pub items: &'a [LeaseItem],
    /// The query returned as many items as it was allowed to: more may be waiting.
    pub page_was_full: bool,
    /// Wall time, epoch ms.
    pub now_ms: u64,
    /// Leases this worker may still take.
    pub capacity: usize,
    /// The regular poll interval.
    pub interval_ms: u64,
    /// A random draw in `[0, 1)` for the jitter.
    pub unit: f64,
    /// With a sharded orphan index: the most claims of one shard's work in one poll
    /// ([`claims_per_shard`]).
    pub per_shard: Option<usize>,
}

/// How many shards a worker's claims of one poll spread over, at least: its work is then spread
/// over that many orphan-index partition values (more over the polls, each read first from the
/// shard it holds least of), so what it lets go at once moves a fraction of its connections'
/// index entries on one value. A page is read shard after shard and fills from the first:
/// unspread, a per-item worker that claimed its 700 from one page held them on one value, and
/// its shutdown's releases and their claims elsewhere (2 units each) took 2,800 units of that
/// value's 1,000 a second. Per-item mode (a release and a claim per connection handed over):
/// 16. A balanced session worker polls at most every half interval and moves one entry per
/// connection a takeover takes: 4, so a burst of new work is still shared within seconds.
pub const CLAIM_SPREAD_SHARDS: u32 = 16;
pub const CLAIM_SPREAD_SHARDS_BALANCED: u32 = 4;

/// The most claims of one shard's work in one orphan poll (`None`: the index is not sharded):
/// `max_connections` over [`CLAIM_SPREAD_SHARDS`] or, `balanced`,
/// [`CLAIM_SPREAD_SHARDS_BALANCED`] (or over the shards, when fewer).
pub fn claims_per_shard(max_connections: usize, shards: u32, balanced: bool) -> Option<usize> {
    let spread = if balanced { CLAIM_SPREAD_SHARDS_BALANCED } else { CLAIM_SPREAD_SHARDS };
    (shards > 1).then(|| max_connections.div_ceil(shards.min(spread) as usize).max(1))
}

/// Decides an orphan poll. Items claimable at `now_ms` are claimed up to `capacity`, at most
/// `per_shard` of one shard's; an item that becomes claimable before the regular next poll
/// moves the next poll to just after that moment; a full page with claims, or orphans left for
/// the shard limit, means more may be claimed now, so poll again at once.
pub fn plan_orphans(poll: &OrphanPoll<'_>, config: &TableConfig, is_ours: impl Fn(&str) -> bool) -> OrphanPlan {
    let mut claim = Vec::new();
    let mut wake_in_ms = jittered_ms(poll.interval_ms, poll.unit);
    let mut of_shard: HashMap<u32, usize> = HashMap::new();
    let mut left_for_shard_limit = false;
    for item in poll.items.iter().filter(|i| i.desired_state == Some(DesiredState::Started) && !is_ours(&i.id)) {
        if is_orphan(item, poll.now_ms, config) {
            if claim.len() < poll.capacity {
                if let Some(limit) = poll.per_shard {
                    let n = of_shard.entry(crate::config::orphan_shard_of(&item.id, config.orphan_shards)).or_default();
                    if *n >= limit {
                        left_for_shard_limit = true;
                        continue;
                    }
                    *n += 1;
                }
                claim.push(item.id.clone());
            }
        } else if let Some(exp) = item.expires_at_ms {
            // Claimable once `exp < now - skew`, i.e. from `exp + skew + 1`.
            let claimable_at = exp + config.skew_ms() + 1;
            wake_in_ms = wake_in_ms.min(claimable_at.saturating_sub(poll.now_ms));
        }
    }
    if (poll.page_was_full || left_for_shard_limit) && !claim.is_empty() && claim.len() < poll.capacity {
        wake_in_ms = 0;
    }
    OrphanPlan { claim, wake_in_ms }
}

/// Leases still free under `max_connections`.
pub fn capacity_left(max_connections: usize, held: usize) -> usize {
    max_connections.saturating_sub(held)
}

/// How an acquire that did not succeed is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimFailure {
    /// Someone holds it or it is stopped: the normal outcome of racing for work.
    Conflict,
    /// The store failed.
    Error,
}

pub fn claim_failure(err: &Error) -> ClaimFailure {
    match err {
        Error::Held { .. } | Error::Stopped { .. } => ClaimFailure::Conflict,
        Error::Lost { .. }
        | Error::NotFound { .. }
        | Error::SeqNotIncreasing { .. }
        | Error::Throttled
        | Error::Timeout { .. }
        | Error::Unreachable(_)
        | Error::AccessDenied(_)
        | Error::NotConfigured(_)
        | Error::TableNotFound { .. }
        | Error::InvalidInput { .. }
        | Error::Script(_)
        | Error::Store(_) => ClaimFailure::Error,
    }
}

/// Only running fleet work gets a handler: a hint may name an id that is not (or no longer)
/// STARTED, and acquiring it must not start work nobody asked for.
pub fn is_fleet_work(lease: &Lease) -> bool {
    lease.desired_state == Some(DesiredState::Started)
}

pub use crate::keeper::MIN_RETRY_MS;

/// Session mode: how long to wait before opening a session again after `err`, the
/// `failures`-th failure in a row (0-based). Our own session of an earlier run that still lives
/// by rule 1 is waited out; anything else backs off. Never longer than one lease.
pub fn session_retry_ms(err: &Error, failures: u32, now_ms: u64, config: &TableConfig, unit: f64) -> u64 {
    let wait = match err {
        Error::Held { expires_at_ms, .. } => expires_at_ms.saturating_sub(now_ms) + config.skew_ms() + 1,
        _ => config.renew_ms() / 4 + backoff_ms(failures, config.renew_ms() / 4, config.renew_ms(), unit),
    };
    wait.min(config.lease_ms())
}

/// Session mode: when the session loop wakes next (monotonic): the renewal, or the deadline
/// when that comes first. At the deadline every handler stops (rule 2) and a new epoch begins.
pub fn session_wake_at(session: &Session, config: &TableConfig) -> u64 {
    session.next_renew_mono_ms(config).min(session.deadline_mono_ms)
}

/// Session mode: whether a held connection's deadline moves with a renewal of `session`: only
/// work claimed under that epoch and not already given up.
pub fn moves_with_session(claimed_under: Option<u64>, reason: Option<CancelReason>, session: &Session) -> bool {
    claimed_under == Some(session.epoch) && !matches!(reason, Some(CancelReason::Deadline | CancelReason::Lost))
}

/// Session mode: whether a claim that landed under epoch `claimed_under` is cancelled at once
/// (`Deadline`) because the worker's session was lost, or a new epoch began, while it was in
/// flight (`epoch_now`).
pub fn claim_outlived_session(claimed_under: Option<u64>, epoch_now: Option<u64>) -> bool {
    claimed_under != epoch_now
}

/// Session mode: whose connections a dead-session poll claims, as (owner, epoch to retire once
/// it holds nothing): the dead sessions found (except our own, never retired by us), and our own
/// earlier epochs' work once after a new epoch began (`reclaim_own`).
pub fn dead_session_owners(dead: &[SessionItem], own: &str, reclaim_own: bool) -> Vec<(String, Option<u64>)> {
    let mut owners: Vec<(String, Option<u64>)> =
        dead.iter().map(|s| (s.owner.clone(), Some(s.epoch).filter(|_| s.owner != own))).collect();
    if reclaim_own {
        owners.push((own.to_string(), None));
    }
    owners
}

/// The held ids whose desired state is STOPPED, sorted.
pub fn stopped_ids(states: &HashMap<String, Option<DesiredState>>) -> Vec<String> {
    let mut ids: Vec<String> =
        states.iter().filter(|(_, s)| **s == Some(DesiredState::Stopped)).map(|(id, _)| id.clone()).collect();
    ids.sort();
    ids
}

/// How many hint messages to ask SQS for: no more than the free capacity, and SQS's limit of 10.
pub fn hint_batch_size(capacity: usize) -> i32 {
    capacity.clamp(1, 10) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> TableConfig {
        TableConfig::default()
    }

    fn plan(items: &[LeaseItem], capacity: usize, full: bool, ours: &str) -> OrphanPlan {
        let poll = OrphanPoll {
            items,
            page_was_full: full,
            now_ms: 100_000,
            capacity,
            interval_ms: 2_000,
            unit: 0.5,
            per_shard: None,
        };
        plan_orphans(&poll, &cfg(), |id| id == ours)
    }

    fn started(id: &str, exp: u64) -> LeaseItem {
        LeaseItem {
            id: id.into(),
            desired_state: Some(DesiredState::Started),
            expires_at_ms: Some(exp),
            ..Default::default()
        }
    }

    /// A page read from one shard (it fills from the first shard read) gives a poll at most its
    /// share of one shard's work; what is left for the limit is polled for again at once.
    #[test]
    fn a_polls_claims_of_one_shards_work_are_limited_and_the_rest_polled_for_at_once() {
        let config = TableConfig { orphan_shards: 16, ..cfg() };
        let of = |k: u32| (0..).map(|i| format!("s{i}")).filter(move |id| crate::config::orphan_shard_of(id, 16) == k);
        let mut items: Vec<LeaseItem> = of(3).take(200).map(|id| started(&id, 1)).collect();
        items.extend(of(4).take(50).map(|id| started(&id, 1)));
        let per_shard = claims_per_shard(700, 16, false);
        assert_eq!(
            (per_shard, claims_per_shard(700, 16, true), claims_per_shard(700, 1, false)),
            (Some(44), Some(175), None)
        );
        assert_eq!(claims_per_shard(700, 2, false), Some(350), "fewer shards than the spread: over them all");
        let poll = OrphanPoll {
            items: &items,
            page_was_full: false,
            now_ms: 100_000,
            capacity: 700,
            interval_ms: 2_000,
            unit: 0.5,
            per_shard,
        };
        let plan = plan_orphans(&poll, &config, |_| false);
        let shard_of = |id: &String| crate::config::orphan_shard_of(id, 16);
        assert_eq!(plan.claim.iter().filter(|id| shard_of(id) == 3).count(), 44);
        assert_eq!(plan.claim.iter().filter(|id| shard_of(id) == 4).count(), 44);
        assert_eq!(plan.wake_in_ms, 0, "orphans were left for the limit: poll again now");
        let all = plan_orphans(&OrphanPoll { per_shard: None, ..poll }, &config, |_| false);
        assert_eq!((all.claim.len(), all.wake_in_ms > 0), (250, true));
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        assert_eq!(jittered_ms(2_000, 0.0), 1_600);
        assert_eq!(jittered_ms(2_000, 0.5), 2_000);
        assert_eq!(jittered_ms(2_000, 1.0), 2_400);
        assert_eq!(jittered_ms(2_000, 7.0), 2_400);
        assert_eq!(orphan_lookahead_ms(2_000), 2_650);
        assert_eq!(orphan_query_cutoff(100_000, &cfg(), 2_000), 99_000 + 2_650);
    }

    #[test]
    fn retry_waits_grow_and_stay_bounded() {
        assert_eq!(orphan_retry_ms(1, 2_000, 0.0), 2_000);
        assert_eq!(orphan_retry_ms(30, 2_000, 1.0), 10_000);
        assert_eq!(hint_retry_ms(30, 1.0), 10_000);
        assert_eq!(desired_state_phase_ms(10_000, 0.5), 5_000);
        assert_eq!(desired_state_phase_ms(10_000, 3.0), 10_000);
    }

    #[test]
    fn session_decisions() {
        let c = cfg();
        let held = Error::Held { owner: "w".into(), expires_at_ms: 105_000 };
        // Our own live session: waited out past the skew, at most one lease.
        assert_eq!(session_retry_ms(&held, 0, 100_000, &c, 0.5), 6_001);
        assert_eq!(session_retry_ms(&held, 0, 0, &c, 0.5), c.lease_ms());
        assert_eq!(session_retry_ms(&Error::Throttled, 0, 0, &c, 0.5), 1_250 + 625);
        assert!(session_retry_ms(&Error::Throttled, 30, 0, &c, 1.0) <= c.lease_ms());
        let s = Session { owner: "w".into(), epoch: 3, expires_at_ms: 0, deadline_mono_ms: 19_000 };
        assert_eq!(session_wake_at(&s, &c), 5_000);
        assert!(moves_with_session(Some(3), None, &s) && moves_with_session(Some(3), Some(CancelReason::Stopped), &s));
        assert!(!moves_with_session(Some(2), None, &s) && !moves_with_session(None, None, &s));
        assert!(!moves_with_session(Some(3), Some(CancelReason::Deadline), &s));
        assert!(claim_outlived_session(Some(3), None) && claim_outlived_session(Some(3), Some(4)));
        assert!(!claim_outlived_session(Some(3), Some(3)));
        let dead = [
            SessionItem { owner: "a".into(), epoch: 2, expires_at_ms: 0, load: None },
            SessionItem { owner: "me".into(), epoch: 1, expires_at_ms: 0, load: None },
        ];
        assert_eq!(dead_session_owners(&dead, "me", false), vec![("a".into(), Some(2)), ("me".into(), None)]);
        assert_eq!(dead_session_owners(&[], "me", true), vec![("me".to_string(), None)]);
        assert!(releases_after_handler(Some(CancelReason::Shutdown), false));
        assert!(!releases_after_handler(Some(CancelReason::Shutdown), true));
        assert!(releases_after_handler(Some(CancelReason::Deadline), true));
        assert!(!releases_after_handler(Some(CancelReason::Lost), true));
    }

    #[test]
    fn claims_orphans_up_to_capacity_oldest_first() {
        // Now is 100,000 throughout.
        let items = [started("a", 0), started("b", 50_000), started("c", 98_999), started("d", 99_000)];
        assert_eq!(plan(&items, 2, false, "").claim, vec!["a", "b"]);
        // "d" expired at 99,000 and becomes claimable at 100,001 (1 s skew): poll then.
        let plan = plan(&items, 10, false, "");
        assert_eq!(plan.claim, vec!["a", "b", "c"]);
        assert_eq!(plan.wake_in_ms, 1);
    }

    #[test]
    fn expiring_items_pull_the_next_poll_forward_only() {
        let soon = plan(&[started("x", 100_500)], 5, false, "");
        assert!(soon.claim.is_empty());
        assert_eq!(soon.wake_in_ms, 1_501);
        assert_eq!(plan(&[started("x", 105_000)], 5, false, "").wake_in_ms, 2_000);
    }

    #[test]
    fn own_stopped_and_foreign_items_are_skipped() {
        let mut stopped = started("s", 0);
        stopped.desired_state = Some(DesiredState::Stopped);
        let leader = LeaseItem { id: "leader/x".into(), expires_at_ms: Some(0), ..Default::default() };
        let items = [started("mine", 0), stopped, leader, started("free", 0)];
        assert_eq!(plan(&items, 5, false, "mine").claim, vec!["free"]);
    }

    #[test]
    fn a_full_page_with_claims_polls_again_at_once() {
        let items = [started("a", 0), started("b", 0)];
        assert_eq!(plan(&items, 5, true, "").wake_in_ms, 0);
        // At capacity there is nothing more to take: wait for the interval.
        assert_eq!(plan(&items, 2, true, "").wake_in_ms, 2_000);
        assert_eq!(plan(&items, 5, false, "").wake_in_ms, 2_000);
    }

    #[test]
    fn conflicts_are_not_errors() {
        assert_eq!(claim_failure(&Error::Held { owner: "w".into(), expires_at_ms: 1 }), ClaimFailure::Conflict);
        assert_eq!(claim_failure(&Error::Stopped { id: "a".into() }), ClaimFailure::Conflict);
        assert_eq!(claim_failure(&Error::Throttled), ClaimFailure::Error);
        assert_eq!(claim_failure(&Error::Store("x".into())), ClaimFailure::Error);
    }

    fn lease(deadline: u64, state: Option<DesiredState>) -> Lease {
        Lease {
            id: "a".into(),
            owner: "w".into(),
            fence: 1,
            expires_at_ms: 0,
            last_seq: None,
            url: None,
            desired_state: state,
            deadline_mono_ms: deadline,
        }
    }

    #[test]
    fn release_and_lost_accounting() {
        assert!(should_release(None));
        assert!(should_release(Some(CancelReason::Stopped)));
        assert!(should_release(Some(CancelReason::Shutdown)));
        assert!(should_release(Some(CancelReason::Deadline)));
        assert!(!should_release(Some(CancelReason::Lost)));
        assert!(counts_as_lost(Some(CancelReason::Deadline)) && counts_as_lost(Some(CancelReason::Lost)));
        assert!(!counts_as_lost(Some(CancelReason::Stopped)) && !counts_as_lost(None));
    }

    #[test]
    fn only_started_work_runs() {
        assert!(is_fleet_work(&lease(0, Some(DesiredState::Started))));
        assert!(!is_fleet_work(&lease(0, None)));
        assert!(!is_fleet_work(&lease(0, Some(DesiredState::Stopped))));
    }

    #[test]
    fn stopped_ids_and_batch_sizes() {
        let states = HashMap::from([
            ("b".to_string(), Some(DesiredState::Stopped)),
            ("a".to_string(), Some(DesiredState::Stopped)),
            ("c".to_string(), Some(DesiredState::Started)),
            ("d".to_string(), None),
        ]);
        assert_eq!(stopped_ids(&states), vec!["a", "b"]);
        assert_eq!((hint_batch_size(0), hint_batch_size(3), hint_batch_size(700)), (1, 3, 10));
        assert_eq!((capacity_left(5, 7), capacity_left(5, 2)), (0, 3));
    }
}
