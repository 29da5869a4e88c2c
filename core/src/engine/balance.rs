//! Fleet-aware balance (session mode). Every session renewal records what the session holds and
//! the most it takes, so each worker sees the fleet's load in the one query of the sessions it
//! makes anyway. The work is what the live sessions hold plus what nobody holds (orphans and dead
//! sessions' connections); a worker's fair share is its part of that work when it is spread as
//! evenly as every worker's `max_connections` allows (work / live sessions, rounded up, when
//! every cap is large enough). A worker claims up to its share, and a worker above its share
//! hands the excess over, a few at a time and only while some worker is short of its share by
//! more than a slack, counting the work as the most any view of the last while counted (work in
//! transit is in no view for a moment); nothing moves while the fleet is changing. The slack is in when to move,
//! not in what to claim: a claim limit above the share would have a donor claim back what it
//! has just handed over. A live session that has not renewed for about a renew interval (a
//! paused or partitioned worker) keeps what it holds in the count but gets no share of the work
//! nobody holds, so a dead worker's work does not wait for the stalled session to expire.

#[allow(unused_imports)]
use super::decide::*;
use std::collections::{HashMap, HashSet};

use crate::lease::is_orphan;
use crate::{DesiredState, LeaseItem, SessionItem, TableConfig};

/// How far below its share a worker may be before others hand work over to it: one connection.
pub const BALANCE_SLACK: u64 = 1;

/// The fewest connections handed over in one round (when the excess is that large).
pub const HAND_OVER_MIN_BATCH: u64 = 4;

/// Rounds hand over at most this fraction of the excess (rounded up): the bulk moves quickly,
/// the last few slowly.
pub const HAND_OVER_FRACTION: u64 = 2;

/// How long a live session of another worker may go without renewing before it counts as
/// stalled: one renew interval and the skew. A session that renews writes a new expiry every
/// renew interval (the skew covers the time a renewal takes); a paused or partitioned worker
/// keeps its session live for a whole lease after its last renewal, but takes no work meanwhile.
/// Measured on this worker's monotonic clock, from the first listing that showed the session's
/// current expiry, so neither clock differences nor the peer's settings matter.
pub fn stalled_after_ms(config: &TableConfig) -> u64 {
    config.renew_ms() + config.skew_ms()
}

/// A stalled session's load as the balance counts it: what it holds still counts as held (it is
/// not claimable while the session lives), but it can take nothing more until it renews, so it
/// gets no share of the work nobody holds (a dead worker's, the orphans), which the workers that
/// renew claim instead of leaving it to wait for the stalled session's expiry.
fn stalled_load(load: Option<crate::SessionLoad>) -> Option<crate::SessionLoad> {
    load.map(|l| crate::SessionLoad { held: l.held, max_connections: l.held.min(l.max_connections) })
}

/// What a live session of another worker reported, and how long this worker has seen it live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerSession {
    /// `None`: it has not reported yet (a new session, or a driver that does not report).
    /// From [`Balancer::read`], a stalled session's `max_connections` is what it holds: it
    /// takes nothing more until it renews ([`stalled_after_ms`]).
    pub load: Option<crate::SessionLoad>,
    /// How long this worker has seen this epoch of it live, ms.
    pub seen_for_ms: u64,
}

/// One worker's view of the fleet.
#[derive(Debug, Clone, Copy)]
pub struct FleetView<'a> {
    /// This worker: held (claims in flight included, hand-overs in progress excluded) and its
    /// `max_connections`.
    pub me: crate::SessionLoad,
    /// The other live sessions.
    pub peers: &'a [PeerSession],
    /// Work nobody holds: claimable orphans and the connections of dead sessions seen.
    pub unowned: u64,
    /// Of the orphans, those this worker released (handed over) and nobody has claimed yet.
    pub in_flight: u64,
}

/// The balance of one view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// Every connection of the fleet.
    pub work: u64,
    /// This worker's fair share.
    pub mine: u64,
    /// The most this worker may hold after claiming: its share (within `max_connections`).
    pub claim_limit: u64,
    /// How far this worker is above its share.
    pub excess: u64,
    /// The excess of every live session, this one included.
    pub fleet_excess: u64,
    /// How many connections the workers below their share still miss, less the unowned work
    /// that will fill them without any hand-over.
    pub open_deficit: u64,
    /// The largest shortfall of one worker below its share.
    pub largest_shortfall: u64,
    /// A session appeared less than one pace ago: hand nothing over until the fleet settles.
    pub settling: bool,
    /// Connections this worker handed over that nobody has claimed yet.
    pub in_flight: u64,
}

/// The fair level: the smallest `level` with `sum(min(cap, level)) >= work`, so each worker's
/// share is `min(its cap, level)` (the integer form of work / workers, rounded up, when every
/// cap is large enough). Above the fleet's capacity every worker's share is its cap.
pub fn fair_level(work: u64, caps: &[u64]) -> u64 {
    let room = |level: u64| caps.iter().map(|c| (*c).min(level)).sum::<u64>();
    let (mut low, mut high) = (0, caps.iter().copied().max().unwrap_or(0));
    if room(high) < work {
        return high;
    }
    while low < high {
        let mid = low + (high - low) / 2;
        if room(mid) >= work {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    low
}

/// How long hand-over rounds are apart, and how long a new session is watched before any work
/// moves: one orphan poll (the receivers claim; a hint is quicker) and two session renewals
/// (their reports then say so). A donor reports what it gives up before it lets it go, so no
/// view counts work twice, and starts no round while work it handed over is still unclaimed.
pub fn balance_pace_ms(renew_ms: u64, orphan_interval_ms: u64) -> u64 {
    2 * renew_ms + orphan_interval_ms
}

/// The balance of `view`; `None` when a live session does not report its load: the fleet's
/// work is unknown, so this worker claims up to its `max_connections` and hands nothing over.
pub fn fair_share(view: &FleetView<'_>, pace_ms: u64) -> Option<Share> {
    let mut loads = vec![view.me];
    for peer in view.peers {
        loads.push(peer.load?);
    }
    let work = loads.iter().map(|l| l.held).sum::<u64>() + view.unowned;
    let caps: Vec<u64> = loads.iter().map(|l| l.max_connections).collect();
    let level = fair_level(work, &caps);
    let share = |l: &crate::SessionLoad| l.max_connections.min(level);
    let mine = share(&view.me);
    let fleet_excess = loads.iter().map(|l| l.held.saturating_sub(share(l))).sum();
    let shortfalls = loads.iter().map(|l| share(l).saturating_sub(l.held));
    let deficit: u64 = shortfalls.clone().sum();
    Some(Share {
        work,
        mine,
        claim_limit: mine,
        excess: view.me.held.saturating_sub(mine),
        fleet_excess,
        open_deficit: deficit.saturating_sub(view.unowned),
        largest_shortfall: shortfalls.max().unwrap_or(0),
        settling: view.peers.iter().any(|p| p.seen_for_ms < pace_ms),
        in_flight: view.in_flight,
    })
}

/// How many connections to hand over now: none while the fleet settles, while the last round's
/// connections are not all claimed, within one pace of the last round, or while no worker is
/// short by more than the slack; otherwise this worker's part
/// of the open deficit (in proportion to its excess), at most half its excess (at least
/// [`HAND_OVER_MIN_BATCH`]).
pub fn hand_over_now(share: &Share, since_last_round_ms: Option<u64>, pace_ms: u64) -> u64 {
    if share.settling || share.in_flight > 0 || share.excess == 0 || share.largest_shortfall <= BALANCE_SLACK {
        return 0;
    }
    if since_last_round_ms.is_some_and(|ms| ms < pace_ms) {
        return 0;
    }
    let part = (share.open_deficit * share.excess).div_ceil(share.fleet_excess.max(1));
    let batch = share.excess.div_ceil(HAND_OVER_FRACTION).max(HAND_OVER_MIN_BATCH);
    share.excess.min(part).min(batch)
}

/// Whether a held connection counts in the load a session renewal reports: not once it is
/// leaving (handed over, stopped, lost, past its deadline, released), but still while the worker
/// shuts down: it stays held under the session until the end write frees it all at once. The
/// ended session's last report is then the work it freed, which [`Balancer::refreshed_limit`] counts.
pub fn counts_in_load(reason: Option<CancelReason>, handing_over: bool) -> bool {
    !handing_over && matches!(reason, None | Some(CancelReason::Shutdown))
}

/// Which connections to hand over: those claimed the fewest times (lowest fence) first, then
/// the longest held (lowest claim order), so no connection keeps moving while others stay.
/// `held` is (id, fence, claim order); returns `count` ids.
pub fn hand_over_picks(held: &[(String, u64, u64)], count: usize) -> Vec<String> {
    let mut held: Vec<&(String, u64, u64)> = held.iter().collect();
    held.sort_by(|a, b| (a.1, a.2, &a.0).cmp(&(b.1, b.2, &b.0)));
    held.into_iter().take(count).map(|(id, _, _)| id.clone()).collect()
}

/// Of one orphan poll's page, in balance terms: `unowned`, the STARTED orphans nobody here holds
/// or claims; `in_flight`, those of them that name this worker (handed over, not claimed yet).
pub fn orphan_counts(
    items: &[LeaseItem],
    now_ms: u64,
    config: &TableConfig,
    own: &str,
    is_tracked: impl Fn(&str) -> bool,
) -> (u64, u64) {
    let orphans: Vec<&LeaseItem> =
        items.iter().filter(|i| counts_as_unowned(i, now_ms, config, |id| is_tracked(id))).collect();
    let in_flight = orphans.iter().filter(|i| i.owner.as_deref() == Some(own)).count();
    (orphans.len() as u64, in_flight as u64)
}

/// Whether `item` of an orphan page is work nobody holds, in balance terms: STARTED, claimable
/// at `now_ms`, and not held or claimed here.
pub fn counts_as_unowned(
    item: &LeaseItem,
    now_ms: u64,
    config: &TableConfig,
    is_tracked: impl Fn(&str) -> bool,
) -> bool {
    item.desired_state == Some(DesiredState::Started) && !is_tracked(&item.id) && is_orphan(item, now_ms, config)
}

/// Whether a wave of takeovers of a dead session's listed work (sent together, up to
/// [`CLAIM_CONCURRENCY`]) came back with every one refused by its item's condition: the rest of
/// that listing is then left to the next round's listing rather than claimed down the list.
pub fn takeover_wave_was_lost(taken: usize, refused: usize) -> bool {
    taken == 0 && refused > 0
}

/// The unowned work in the whole orphan index, estimated from one page of it: the page's count
/// (`counted` says which items count) when the page was not full (it then read every shard) or
/// the index is not sharded; otherwise the page read shards `first_shard`, `first_shard + 1`, ...
/// (modulo `shards`) to their end and stopped inside the shard of its last item, and running
/// work is spread evenly over the shards by its id's hash, so the shards read to their end
/// stand for all of them (what they held, times `shards` over their number), and a page that
/// filled within its first shard says every shard holds at least as much. A fleet that counts
/// one page of a cold start of 100,000 (700 items) would share 700 connections at a time; the
/// estimate lets each worker claim its share of the whole at once.
pub fn unowned_estimate(
    page: &[LeaseItem],
    full: bool,
    first_shard: u32,
    shards: u32,
    counted: impl Fn(&LeaseItem) -> bool,
) -> u64 {
    let count = page.iter().filter(|i| counted(i)).count() as u64;
    let shards = shards.max(1);
    let Some(last) = page.last().filter(|_| full && shards > 1) else { return count };
    let position = |id: &str| (crate::orphan_shard_of(id, shards) + shards - first_shard % shards) % shards;
    let read_whole = position(&last.id);
    if read_whole == 0 {
        return count.saturating_mul(u64::from(shards));
    }
    let in_whole = page.iter().filter(|i| position(&i.id) < read_whole && counted(i)).count() as u64;
    count.max(in_whole * u64::from(shards) / u64::from(read_whole))
}

/// The least time between two session renewals sent early to report a moving load.
pub const REPORT_MIN_GAP_MS: u64 = 1_000;

/// How far a balancing worker's load moves (claims, or work leaving) before its session renews
/// early to report it: a twentieth of `max_connections`, at least one. Held steady, a worker
/// renews on its interval only.
pub fn report_change(max_connections: usize) -> usize {
    (max_connections / 20).max(1)
}

/// Write units one partition value of an index takes per second (DynamoDB's per-partition limit).
pub const PARTITION_WRITE_UNITS: f64 = 1_000.0;

/// Orphan-index write units of one claim: the item's index sort key (its expiry) moves, a
/// delete and a put in the index.
pub const ORPHAN_UNITS_PER_CLAIM: f64 = 2.0;

/// The part of one orphan-index partition value's write capacity that the workers claiming
/// from it at once may use between them, leaving room for the rest of the fleet's writes
/// (renewals, releases, starts) and for workers that pick the same shard.
pub const CLAIM_BUDGET_SHARE: f64 = 0.5;

/// How many claims a second one worker of a fleet of `workers` sends, with the orphan index
/// spread over `shards` partition values (session mode paces its claims by it, so a cold start
/// or a mass hand-over stays within the index's partitions instead of being throttled). A
/// worker claims from one shard at a time, picked at random for each poll, so a shard has
/// `workers / shards` claimers on average; the rate lets the busiest shard (the mean, three
/// standard deviations of its count and one more) take [`CLAIM_BUDGET_SHARE`] of its capacity.
/// Unsharded, every worker claims from the one partition value. `seen_whole`: the last page
/// held every orphan of the index (it was not full), spread over this many shards in effect
/// (`(sum n)^2 / sum n^2` of the orphans in each): every worker then claims from the same
/// few shards (the last of a cold start), so the fleet's claims share their capacity.
pub fn claim_rate_per_s(shards: u32, workers: usize, seen_whole: Option<f64>) -> f64 {
    let workers = workers.max(1) as f64;
    let crowd = match seen_whole {
        _ if shards <= 1 => workers,
        Some(spread) => workers / spread.clamp(1.0, f64::from(shards)),
        None => {
            let mean = workers / f64::from(shards);
            (mean + 3.0 * mean.sqrt() + 1.0).min(workers)
        }
    };
    PARTITION_WRITE_UNITS * CLAIM_BUDGET_SHARE / ORPHAN_UNITS_PER_CLAIM / crowd.max(1.0)
}

/// How many claims a second one worker of a fleet of `workers` sends of work spread over every
/// shard (a dead session's listed work, hinted work: ids hash to shards at random): the
/// fleet's claims land on all `shards` partition values, `workers / shards` claimers each, and
/// take [`CLAIM_BUDGET_SHARE`] of them between them.
pub fn spread_claim_rate_per_s(shards: u32, workers: usize) -> f64 {
    claim_rate_per_s(shards, workers, Some(f64::from(shards.max(1))))
}

/// How many shards `items` (orphans of one page) are spread over in effect: `(sum n)^2 / sum
/// n^2` of their counts per shard (k evenly spread shards: k); `None` without orphans.
pub fn shard_spread(items: &[&LeaseItem], shards: u32) -> Option<f64> {
    let mut counts: HashMap<u32, f64> = HashMap::new();
    for item in items {
        *counts.entry(crate::orphan_shard_of(&item.id, shards.max(1))).or_default() += 1.0;
    }
    let squares: f64 = counts.values().map(|n| n * n).sum();
    (squares > 0.0).then(|| (items.len() as f64).powi(2) / squares)
}

/// What a balancing worker remembers from one orphan poll to the next: when it first saw each
/// live session of the others (a new one is watched for a pace before any work moves) and
/// when its last hand-over round began. Every driver keeps one and feeds it the session listing.
#[derive(Debug, Default, Clone)]
pub struct Balancer {
    /// When each live session (owner, epoch) was first seen, monotonic ms.
    seen: HashMap<(String, u64), u64>,
    /// When the last hand-over round began, monotonic ms.
    last_round_mono_ms: Option<u64>,
    /// The work each recent view counted, (monotonic ms, work), oldest first: hand-overs are
    /// decided on the most of them ([`Balancer::step`]).
    works: std::collections::VecDeque<(u64, u64)>,
    /// Dead sessions (owner, epoch) whose last report [`Balancer::refreshed_limit`] has counted
    /// (once: the work it freed is claimed after; kept until the session is no longer listed).
    counted_dead: std::collections::HashSet<(String, u64)>,
    /// Each live session's (owner, epoch) latest expiry seen, since when (monotonic ms), and
    /// whether the last listing found it stalled ([`stalled_after_ms`]).
    renewals: HashMap<(String, u64), Renewal>,
}

/// The latest renewal of one live session seen in the listings.
#[derive(Debug, Clone, Copy)]
struct Renewal {
    expires_at_ms: u64,
    since_mono_ms: u64,
    stalled: bool,
}

/// One balance decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BalanceStep {
    /// The most this worker may hold after claiming (its `max_connections` while a live
    /// session does not report its load).
    pub claim_limit: u64,
    /// How many connections to hand over now (a round begins when this is not zero).
    pub hand_over: u64,
    /// The balance the hand-over was decided on (its work the most of the recent views'),
    /// when every live session reports its load.
    pub share: Option<Share>,
}

impl Balancer {
    /// Splits the listing of every session into the others' live sessions (as peers, with how
    /// long each epoch has been seen; one whose expiry has not moved for longer than
    /// [`stalled_after_ms`] can take no more than it holds) and the dead sessions (ours included).
    pub fn read(
        &mut self,
        sessions: Vec<SessionItem>,
        own: &str,
        now_ms: u64,
        mono_ms: u64,
        config: &TableConfig,
    ) -> (Vec<PeerSession>, Vec<SessionItem>) {
        let mut peers = Vec::new();
        let mut dead = Vec::new();
        let mut live = HashSet::new();
        for s in sessions {
            if s.is_dead(now_ms, config) {
                dead.push(s);
            } else if s.owner != own {
                let key = (s.owner, s.epoch);
                let first_seen = *self.seen.entry(key.clone()).or_insert(mono_ms);
                let renewal = self.renewals.entry(key.clone()).or_insert(Renewal {
                    expires_at_ms: s.expires_at_ms,
                    since_mono_ms: mono_ms,
                    stalled: false,
                });
                if renewal.expires_at_ms != s.expires_at_ms {
                    *renewal = Renewal { expires_at_ms: s.expires_at_ms, since_mono_ms: mono_ms, stalled: false };
                }
                renewal.stalled = mono_ms.saturating_sub(renewal.since_mono_ms) > stalled_after_ms(config);
                let load = if renewal.stalled { stalled_load(s.load) } else { s.load };
                live.insert(key);
                peers.push(PeerSession { load, seen_for_ms: mono_ms.saturating_sub(first_seen) });
            }
        }
        self.seen.retain(|k, _| live.contains(k));
        self.renewals.retain(|k, _| live.contains(k));
        (peers, dead)
    }

    /// At the claim limit with hints waiting: the limit one listing of every session allows
    /// now. A session of another worker that ended or died counts what it last reported as work
    /// nobody holds (a peer left: the share grows), the first time it is seen dead only (after
    /// that the work it freed is being claimed, here or elsewhere). A live session that the last
    /// [`Balancer::read`] found stalled, and that has not renewed since, gets no share of it.
    /// `hinted` is how many ids the waiting hints name that this worker does not hold: at least
    /// that much work is unowned (new work, hinted before any orphan poll has counted it), so a
    /// lone worker at a share of 0 takes it, and a fleet at its shares takes its share of it.
    /// Callers only ever raise their limit with it; the next orphan poll sets the limit from the
    /// whole view. `max_connections` while a live peer has not reported.
    #[allow(clippy::too_many_arguments)]
    pub fn refreshed_limit(
        &mut self,
        sessions: &[SessionItem],
        own: &str,
        me: crate::SessionLoad,
        hinted: u64,
        now_ms: u64,
        config: &TableConfig,
        pace_ms: u64,
    ) -> u64 {
        let mut peers = Vec::new();
        let mut unowned = 0;
        let mut dead = std::collections::HashSet::new();
        for s in sessions.iter().filter(|s| s.owner != own) {
            if s.is_dead(now_ms, config) {
                let key = (s.owner.clone(), s.epoch);
                if !self.counted_dead.contains(&key) {
                    unowned += s.load.map_or(0, |l| l.held);
                }
                dead.insert(key);
            } else {
                let key = (s.owner.clone(), s.epoch);
                let renewal = self.renewals.get(&key);
                let stalled = renewal.is_some_and(|r| r.stalled && r.expires_at_ms == s.expires_at_ms);
                let load = if stalled { stalled_load(s.load) } else { s.load };
                peers.push(PeerSession { load, seen_for_ms: u64::MAX });
            }
        }
        self.counted_dead = dead;
        let view = FleetView { me, peers: &peers, unowned: unowned.max(hinted), in_flight: 0 };
        fair_share(&view, pace_ms).map_or(me.max_connections, |s| s.claim_limit)
    }

    /// The claim limit and, paced, how many connections to hand over now ([`fair_share`],
    /// [`hand_over_now`]); a round that hands something over starts at `mono_ms`.
    ///
    /// Hand-overs are decided on the most work any view of the last `window_ms` counted (one
    /// pace and the index lag: [`balance_pace_ms`], `index_lag_ms`), the rest of it as work in
    /// transit. A session reports its load when it renews, and the orphan index lags, so a
    /// connection in transit can be in no view for a moment: released by a donor that no longer
    /// counts it but not yet listed as an orphan, or claimed by a worker that has not reported
    /// it and no longer listed. The work then looks smaller, every share smaller, and each
    /// worker at its share would hand one over to the worker that looks short. Work that has
    /// really gone (streams stopped) is decided on a window later; the claim limit follows the
    /// view itself, so a view that counts work twice never raises what a worker claims.
    pub fn step(&mut self, view: &FleetView<'_>, mono_ms: u64, pace_ms: u64, window_ms: u64) -> BalanceStep {
        let share = fair_share(view, pace_ms);
        let claim_limit = share.map_or(view.me.max_connections, |s| s.claim_limit);
        let decided = share.map(|share| {
            self.works.retain(|(at, _)| mono_ms.saturating_sub(*at) < window_ms);
            self.works.push_back((mono_ms, share.work));
            let most = self.works.iter().map(|(_, w)| *w).max().unwrap_or(share.work);
            match most.saturating_sub(share.work) {
                0 => share,
                in_transit => {
                    fair_share(&FleetView { unowned: view.unowned + in_transit, ..*view }, pace_ms).unwrap_or(share)
                }
            }
        });
        let hand_over = decided.map_or(0, |share| {
            let since = self.last_round_mono_ms.map(|t| mono_ms.saturating_sub(t));
            hand_over_now(&share, since, pace_ms)
        });
        if hand_over > 0 {
            self.last_round_mono_ms = Some(mono_ms);
        }
        BalanceStep { claim_limit, hand_over, share: decided }
    }
}

#[cfg(test)]
mod balance_tests {
    use super::*;
    use crate::SessionLoad;

    fn load(held: u64, max_connections: u64) -> SessionLoad {
        SessionLoad { held, max_connections }
    }

    fn peer(held: u64) -> PeerSession {
        PeerSession { load: Some(load(held, 700)), seen_for_ms: 60_000 }
    }

    fn share(me: u64, peers: &[PeerSession], unowned: u64) -> Share {
        fair_share(&FleetView { me: load(me, 700), peers, unowned, in_flight: 0 }, 2_000).unwrap()
    }

    #[test]
    fn the_level_is_work_over_workers_rounded_up_within_each_cap() {
        assert_eq!(fair_level(120, &[700, 700, 700, 700]), 30);
        assert_eq!(fair_level(121, &[700, 700, 700, 700]), 31);
        assert_eq!(fair_level(0, &[700, 700]), 0);
        assert_eq!(fair_level(2_000, &[700, 700, 700]), 667);
        // A small worker takes its cap; the others share the rest.
        assert_eq!(fair_level(100, &[10, 700, 700]), 45);
        // Beyond the fleet's capacity everyone is full.
        assert_eq!(fair_level(3_000, &[700, 700]), 700);
        assert_eq!(fair_level(5, &[]), 0);
    }

    #[test]
    fn claims_stop_at_the_share() {
        // Alone with 120: all of it.
        let s = share(0, &[], 120);
        assert_eq!((s.work, s.mine, s.claim_limit), (120, 120, 120));
        // A new worker beside one holding 120 claims up to 60, not 120.
        let s = share(0, &[peer(120)], 0);
        assert_eq!((s.mine, s.claim_limit, s.excess), (60, 60, 0));
        // Within max_connections.
        let s =
            fair_share(&FleetView { me: load(0, 20), peers: &[peer(120)], unowned: 0, in_flight: 0 }, 2_000).unwrap();
        assert_eq!((s.mine, s.claim_limit), (20, 20));
    }

    #[test]
    fn a_shutting_down_worker_still_reports_what_it_holds() {
        assert!(counts_in_load(None, false));
        assert!(counts_in_load(Some(CancelReason::Shutdown), false));
        for leaving in [CancelReason::HandOver, CancelReason::Stopped, CancelReason::Lost, CancelReason::Deadline] {
            assert!(!counts_in_load(Some(leaving), false), "{leaving:?}");
        }
        assert!(!counts_in_load(None, true));
    }

    #[test]
    fn a_peer_that_left_raises_the_refreshed_limit_once() {
        let config = TableConfig::default();
        let now = 1_000_000;
        let session = |owner: &str, expires_at_ms: u64, held: Option<u64>| SessionItem {
            owner: owner.into(),
            epoch: 1,
            expires_at_ms,
            load: held.map(|h| load(h, 700)),
        };
        let refreshed = |b: &mut Balancer, held: u64, sessions: &[SessionItem]| {
            b.refreshed_limit(sessions, "a", load(held, 700), 0, now, &config, 2_000)
        };
        let live = now + 10_000;
        let mut b = Balancer::default();
        // Both live with 6 each: the limit stays at 6.
        assert_eq!(refreshed(&mut b, 6, &[session("a", live, Some(6)), session("b", live, Some(6))]), 6);
        // b ended (expiry 0) having reported 6: its 6 are unowned, and a alone takes all 12.
        let ended = [session("a", live, Some(6)), session("b", 0, Some(6))];
        assert_eq!(refreshed(&mut b, 6, &ended), 12);
        // Seen again once a holds 9 of them: b's 6 are not counted twice.
        assert_eq!(refreshed(&mut b, 9, &ended), 9);
        // Alone at a share of 0, hinted two new ids: they are work nobody holds.
        let alone = [session("a", live, Some(0))];
        assert_eq!(Balancer::default().refreshed_limit(&alone, "a", load(0, 700), 2, now, &config, 2_000), 2);
        // Beside b at 6 each, hinted 2 more: a's share of 14 is 7, not all of them.
        let both = [session("a", live, Some(6)), session("b", live, Some(6))];
        assert_eq!(Balancer::default().refreshed_limit(&both, "a", load(6, 700), 2, now, &config, 2_000), 7);
        // A peer that left reported more than the hints name: counted once, not added to them.
        let left = [session("a", live, Some(6)), session("c", 0, Some(6))];
        assert_eq!(Balancer::default().refreshed_limit(&left, "a", load(6, 700), 6, now, &config, 2_000), 12);
        // b died, and c is live with 6: 18 over two.
        let three = [session("a", live, Some(6)), session("b", now - 60_000, Some(6)), session("c", live, Some(6))];
        assert_eq!(refreshed(&mut Balancer::default(), 6, &three), 9);
        // Our own dead earlier epoch is not a peer's work.
        let own = [session("a", 0, Some(50)), session("b", live, Some(6))];
        assert_eq!(refreshed(&mut Balancer::default(), 6, &own), 6);
        // A live peer that has not reported: the fleet's work is unknown, max_connections.
        assert_eq!(refreshed(&mut Balancer::default(), 6, &[session("b", live, None)]), 700);
    }

    #[test]
    fn an_unreported_session_turns_balance_off() {
        let silent = PeerSession { load: None, seen_for_ms: 60_000 };
        assert_eq!(
            fair_share(&FleetView { me: load(120, 700), peers: &[silent], unowned: 0, in_flight: 0 }, 2_000),
            None
        );
    }

    #[test]
    fn the_excess_goes_over_in_paced_rounds_of_a_few() {
        // 120 here, a settled peer with none: excess 60, half of it now.
        let s = share(120, &[peer(0)], 0);
        assert_eq!((s.excess, s.open_deficit, s.fleet_excess), (60, 60, 60));
        assert_eq!(hand_over_now(&s, None, 2_000), 30);
        assert_eq!(hand_over_now(&s, Some(1_999), 2_000), 0, "within one pace of the last round");
        assert_eq!(hand_over_now(&s, Some(2_000), 2_000), 30);
        // Released work nobody has claimed yet fills the deficit first; while some of it is
        // ours, the next round waits.
        let s = share(105, &[peer(0)], 15);
        assert_eq!(s.open_deficit, 45);
        let view = FleetView { me: load(105, 700), peers: &[peer(0)], unowned: 15, in_flight: 15 };
        let s = fair_share(&view, 2_000).unwrap();
        assert_eq!(hand_over_now(&s, None, 2_000), 0);
        // Small excesses still move a few at a time.
        let s = share(33, &[peer(30), peer(30), peer(27)], 0);
        assert_eq!(hand_over_now(&s, None, 2_000), 3);
    }

    #[test]
    fn a_view_that_misses_work_in_transit_hands_nothing_over() {
        // Four at 30 of 120; one has just claimed 4 it has not reported, and the orphan index no
        // longer lists them: the view counts 116, a share of 29 and that worker 4 short of it.
        let even = [peer(30), peer(30), peer(30)];
        let stale = [peer(30), peer(30), peer(26)];
        let view = |peers| FleetView { me: load(30, 700), peers, unowned: 0, in_flight: 0 };
        let s = fair_share(&view(&stale), 2_000).unwrap();
        assert_eq!((s.work, s.mine, s.excess, s.largest_shortfall), (116, 29, 1, 3));
        assert_eq!(hand_over_now(&s, None, 2_000), 1, "the view alone would hand one over");
        let mut b = Balancer::default();
        assert_eq!(b.step(&view(&even), 10_000, 2_000, 5_000).hand_over, 0);
        let step = b.step(&view(&stale), 11_000, 2_000, 5_000);
        assert_eq!((step.hand_over, step.claim_limit), (0, 29), "120 a view ago: 4 in transit");
        assert_eq!(step.share.map(|s| (s.work, s.mine, s.excess)), Some((120, 30, 0)));
        // Work that has gone is decided on once no view of the window counted it.
        assert_eq!(b.step(&view(&stale), 14_999, 2_000, 5_000).hand_over, 0);
        assert_eq!(b.step(&view(&stale), 15_000, 2_000, 5_000).hand_over, 1);
        // A real shortfall moves at once: a newcomer at 0 beside three at 40.
        let newcomer = [peer(40), peer(40), peer(0)];
        let view = FleetView { me: load(40, 700), peers: &newcomer, unowned: 0, in_flight: 0 };
        assert_eq!(Balancer::default().step(&view, 20_000, 2_000, 5_000).hand_over, 5);
    }

    #[test]
    fn donors_split_the_deficit_by_their_excess() {
        // Three at 40, a newcomer at 0: each gives a third of 30, half of it now.
        let s = share(40, &[peer(40), peer(40), peer(0)], 0);
        assert_eq!((s.mine, s.excess, s.fleet_excess, s.open_deficit), (30, 10, 30, 30));
        assert_eq!(hand_over_now(&s, None, 2_000), 5);
        let s = share(200, &[peer(200), peer(0)], 0);
        assert_eq!((s.excess, hand_over_now(&s, None, 2_000)), (66, 33));
        // One donor with a big excess, one with a small one.
        let s = share(2, &[peer(78), peer(0)], 0);
        assert_eq!(hand_over_now(&s, None, 2_000), 0, "below its share: nothing to give");
        let s = share(44, &[peer(76), peer(0)], 0);
        assert_eq!((s.mine, s.excess, s.fleet_excess), (40, 4, 40));
        assert_eq!(hand_over_now(&s, None, 2_000), 4);
    }

    #[test]
    fn nothing_moves_within_the_slack_or_while_the_fleet_settles() {
        // 31/30/30/29: nobody short by more than one.
        let s = share(31, &[peer(30), peer(30), peer(29)], 0);
        assert_eq!(hand_over_now(&s, None, 2_000), 0);
        // 121 over four: 31/30/30/30 is as even as it gets.
        let s = share(31, &[peer(30), peer(30), peer(30)], 0);
        assert_eq!((s.mine, hand_over_now(&s, None, 2_000)), (31, 0));
        // A session seen for less than one pace: wait.
        let new = PeerSession { load: Some(load(0, 700)), seen_for_ms: 500 };
        let s = fair_share(&FleetView { me: load(120, 700), peers: &[new], unowned: 0, in_flight: 0 }, 2_000).unwrap();
        assert!(s.settling);
        assert_eq!(hand_over_now(&s, None, 2_000), 0);
    }

    #[test]
    fn the_least_moved_and_longest_held_go_first() {
        let held = vec![("c".to_string(), 2, 0), ("a".to_string(), 1, 5), ("b".to_string(), 1, 3), ("d".into(), 3, 1)];
        assert_eq!(hand_over_picks(&held, 3), vec!["b", "a", "c"]);
        assert_eq!(hand_over_picks(&held, 0), Vec::<String>::new());
        assert_eq!(hand_over_picks(&held, 9).len(), 4);
    }

    #[test]
    fn the_balancer_watches_new_sessions_and_paces_its_rounds() {
        let config = TableConfig::default();
        let session = |owner: &str, epoch, expires_at_ms, held| SessionItem {
            owner: owner.into(),
            epoch,
            expires_at_ms,
            load: Some(load(held, 700)),
        };
        let now = 1_000_000;
        let mut b = Balancer::default();
        let listing =
            || vec![session("me", 1, now + 5_000, 0), session("a", 1, now + 5_000, 30), session("d", 1, 1, 9)];
        let (peers, dead) = b.read(listing(), "me", now, 50_000, &config);
        assert_eq!(peers, vec![PeerSession { load: Some(load(30, 700)), seen_for_ms: 0 }]);
        assert_eq!(dead.iter().map(|s| s.owner.as_str()).collect::<Vec<_>>(), ["d"]);
        fn view(peers: &[PeerSession]) -> FleetView<'_> {
            FleetView { me: load(0, 700), peers, unowned: 0, in_flight: 0 }
        }
        // Seen for less than a pace: the share is known, nothing moves yet.
        let step = b.step(&view(&peers), 50_000, 12_000, 0);
        assert_eq!((step.claim_limit, step.hand_over), (15, 0));
        // A pace later the same epoch has been seen long enough; "a" (not this worker) would
        // hand over, this one, short of its share, claims up to it.
        let (peers, _) = b.read(listing(), "me", now, 62_000, &config);
        assert_eq!(peers[0].seen_for_ms, 12_000);
        let (donor, _) = Balancer::default().read(listing(), "a", now, 0, &config);
        let mut d = Balancer::default();
        let donor_view = FleetView {
            me: load(30, 700),
            peers: &[PeerSession { seen_for_ms: 60_000, ..donor[0] }],
            unowned: 0,
            in_flight: 0,
        };
        assert_eq!(d.step(&donor_view, 62_000, 12_000, 0).hand_over, 8);
        assert_eq!(d.step(&donor_view, 62_001, 12_000, 0).hand_over, 0, "within one pace of the last round");
        assert_eq!(d.step(&donor_view, 74_000, 12_000, 0).hand_over, 8);
        // A new epoch of a peer is a new session: watched again from zero.
        let relisted = vec![session("a", 2, now + 5_000, 30)];
        assert_eq!(b.read(relisted, "me", now, 70_000, &config).0[0].seen_for_ms, 0);
        // A session without a report turns the balance off: claim up to max_connections.
        let silent = [PeerSession { load: None, seen_for_ms: 60_000 }];
        assert_eq!(
            b.step(&view(&silent), 80_000, 12_000, 0),
            BalanceStep { claim_limit: 700, hand_over: 0, share: None }
        );
    }

    #[test]
    fn orphans_in_balance_terms() {
        let config = TableConfig::default();
        let item = |id: &str, owner: Option<&str>, exp: u64, state| LeaseItem {
            id: id.into(),
            owner: owner.map(Into::into),
            expires_at_ms: Some(exp),
            desired_state: Some(state),
            ..LeaseItem::default()
        };
        let now = 1_000_000;
        let items = [
            item("free", None, 0, DesiredState::Started),
            item("mine-released", Some("me"), 0, DesiredState::Started),
            item("tracked", Some("me"), 0, DesiredState::Started),
            item("held", Some("a"), now + 5_000, DesiredState::Started),
            item("stopped", None, 0, DesiredState::Stopped),
        ];
        assert_eq!(orphan_counts(&items, now, &config, "me", |id| id == "tracked"), (2, 1));
    }

    #[test]
    fn a_full_page_of_a_sharded_index_stands_for_every_shard() {
        let shards = 8;
        let ids: Vec<String> = (0..4_000).map(|i| format!("c{i:05}")).collect();
        let shard = |id: &String| crate::orphan_shard_of(id, shards);
        // A page as the store reads it: shard `first` to its end, then the next, ... `size` items.
        let page = |first: u32, size: usize| -> Vec<LeaseItem> {
            (0..shards)
                .flat_map(|k| ids.iter().filter(move |id| shard(id) == (first + k) % shards))
                .take(size)
                .map(|id| LeaseItem {
                    id: id.clone(),
                    desired_state: Some(DesiredState::Started),
                    expires_at_ms: Some(0),
                    ..LeaseItem::default()
                })
                .collect()
        };
        let all = |_: &LeaseItem| true;
        // Not full: every shard was read, the count is exact.
        assert_eq!(unowned_estimate(&page(3, 5_000), false, 3, shards, all), 4_000);
        // Full within its first shard: every shard holds at least as much.
        let in_one = page(3, 300);
        assert!(in_one.iter().all(|i| shard(&i.id) == 3));
        assert_eq!(unowned_estimate(&in_one, true, 3, shards, all), 300 * u64::from(shards));
        // Full in its third shard: the two read to their end stand for all eight.
        let in_three = page(6, 1_200);
        let whole: u64 = ids.iter().filter(|id| [6, 7].contains(&shard(id))).count() as u64;
        assert_eq!(unowned_estimate(&in_three, true, 6, shards, all), whole * 8 / 2);
        let estimate = unowned_estimate(&in_three, true, 6, shards, all);
        assert!((3_600..=4_400).contains(&estimate), "{estimate} of 4,000");
        // Only what counts (claimable, not ours) is scaled; unsharded, a page is what it holds.
        let none = |_: &LeaseItem| false;
        assert_eq!(unowned_estimate(&in_three, true, 6, shards, none), 0);
        assert_eq!(unowned_estimate(&in_one, true, 0, 1, all), 300);
    }

    #[test]
    fn claims_are_paced_so_the_busiest_orphan_partition_stays_within_its_write_units() {
        // One partition value: the fleet's claims share its 1,000 units (2 a claim) to the
        // budget's share.
        let whole = PARTITION_WRITE_UNITS * CLAIM_BUDGET_SHARE / ORPHAN_UNITS_PER_CLAIM;
        assert_eq!(whole, 250.0);
        assert_eq!(claim_rate_per_s(1, 1, None), whole);
        assert_eq!(claim_rate_per_s(1, 100, None), whole / 100.0);
        assert_eq!(claim_rate_per_s(1, 100, Some(5.0)), whole / 100.0);
        // 150 workers on 64 shards: about 2.3 a shard, the busiest about 8.
        let rate = claim_rate_per_s(64, 150, None);
        let busiest = 150.0 / 64.0 + 3.0 * (150.0_f64 / 64.0).sqrt() + 1.0;
        assert!((rate * busiest - whole).abs() < 1e-6, "{rate}");
        assert!((28.0..34.0).contains(&rate), "{rate}");
        // Never more claimers on a shard than workers.
        assert_eq!(claim_rate_per_s(64, 1, None), whole);
        assert_eq!(claim_rate_per_s(64, 0, None), whole);
        // The last orphans of a cold start, all in 3 shards, seen by every worker: the fleet's
        // claims share those three.
        assert_eq!(claim_rate_per_s(64, 150, Some(3.0)), whole * 3.0 / 150.0);
        assert_eq!(claim_rate_per_s(64, 2, Some(3.0)), whole);
        // Work spread over every shard (a dead session's, hinted work): the whole fleet's claims
        // keep every shard at the budget's share, and a worker sends three times the one-shard
        // pace (a deploy's hand-over took seconds at that pace).
        let spread = spread_claim_rate_per_s(64, 150);
        assert!((spread * 150.0 / 64.0 - whole).abs() < 1e-6, "{spread}");
        assert!(spread > 3.0 * rate, "{spread} against {rate}");
        assert_eq!(spread_claim_rate_per_s(1, 150), claim_rate_per_s(1, 150, None));
        assert_eq!(spread_claim_rate_per_s(64, 10), whole);
        let item = |id: &str| LeaseItem { id: id.into(), ..LeaseItem::default() };
        let ids: Vec<LeaseItem> = (0..600).map(|i| item(&format!("c{i}"))).collect();
        let in_shards = |k: u32| -> Vec<&LeaseItem> {
            ids.iter().filter(|i| crate::orphan_shard_of(&i.id, 64) < k).take(30 * k as usize).collect()
        };
        let even = |k: u32| {
            let page = in_shards(k);
            let counts: Vec<usize> =
                (0..k).map(|s| page.iter().filter(|i| crate::orphan_shard_of(&i.id, 64) == s).count()).collect();
            (shard_spread(&page, 64).unwrap(), counts)
        };
        let (one, _) = even(1);
        assert_eq!(one, 1.0);
        let (spread, counts) = even(4);
        assert!(spread > 3.0 && spread <= 4.0, "{spread} {counts:?}");
        assert_eq!(shard_spread(&[], 64), None);
    }

    #[test]
    fn a_session_whose_expiry_stops_moving_is_stalled_after_one_renew_interval_and_the_skew() {
        let config = TableConfig::default();
        assert_eq!(stalled_after_ms(&config), 6_000);
        let now = 1_000_000;
        let listing = |epoch: u64, expires_at_ms: u64, reported: Option<SessionLoad>| {
            vec![SessionItem { owner: "b".into(), epoch, expires_at_ms, load: reported }]
        };
        let mut b = Balancer::default();
        let loads = |b: &mut Balancer, mono_ms: u64, sessions: Vec<SessionItem>| {
            b.read(sessions, "a", now, mono_ms, &config).0.into_iter().map(|p| p.load).collect::<Vec<_>>()
        };
        let reported = Some(load(4, 700));
        // First seen, and seen again with the same expiry for up to one renew interval and the skew.
        assert_eq!(loads(&mut b, 10_000, listing(1, now + 15_000, reported)), [reported]);
        assert_eq!(loads(&mut b, 16_000, listing(1, now + 15_000, reported)), [reported]);
        // Longer: stalled, it keeps what it holds and may take nothing more.
        assert_eq!(loads(&mut b, 16_001, listing(1, now + 15_000, reported)), [Some(load(4, 4))]);
        // It renewed: its expiry moved, it takes work again, and is watched from then on.
        assert_eq!(loads(&mut b, 17_000, listing(1, now + 17_000, reported)), [reported]);
        assert_eq!(loads(&mut b, 23_000, listing(1, now + 17_000, reported)), [reported]);
        assert_eq!(loads(&mut b, 23_001, listing(1, now + 17_000, reported)), [Some(load(4, 4))]);
        // A new epoch is a new session.
        assert_eq!(loads(&mut b, 30_000, listing(2, now + 17_000, reported)), [reported]);
        // A stalled session that holds more than it may take keeps all it holds in the count;
        // one that has not reported is still unknown.
        assert_eq!(loads(&mut b, 40_000, listing(2, now + 17_000, Some(load(9, 5)))), [Some(load(9, 5))]);
        assert_eq!(loads(&mut b, 40_000, listing(2, now + 17_000, None)), [None]);
    }

    #[test]
    fn a_dead_workers_work_goes_to_the_workers_that_renew() {
        let config = TableConfig::default();
        let now = 1_000_000;
        let session = |owner: &str, expires_at_ms: u64, held: u64| SessionItem {
            owner: owner.into(),
            epoch: 1,
            expires_at_ms,
            load: Some(load(held, 700)),
        };
        // a, b and c held 4 each; c died (its 4 are unowned). b last renewed with expiry `b_exp`.
        let listing =
            |b_exp: u64| vec![session("a", now + 20_000, 4), session("b", b_exp, 4), session("c", now - 60_000, 4)];
        let limit = |b: &mut Balancer, mono_ms: u64, b_exp: u64| {
            let (peers, dead) = b.read(listing(b_exp), "a", now, mono_ms, &config);
            assert_eq!(dead.len(), 1);
            let view = FleetView { me: load(4, 700), peers: &peers, unowned: 4, in_flight: 0 };
            let step = b.step(&view, mono_ms, 12_000, 0);
            (step.claim_limit, step.share.map(|s| (s.work, s.open_deficit, s.largest_shortfall)))
        };
        // b renews: a and b share c's 4, 6 each.
        let mut renewing = Balancer::default();
        assert_eq!(limit(&mut renewing, 0, now + 19_000).0, 6);
        assert_eq!(limit(&mut renewing, 7_000, now + 19_500).0, 6);
        // b has not renewed for longer than a renew interval (paused, partitioned): a takes all
        // 4; b's own 4 still count as held.
        let mut watching = Balancer::default();
        assert_eq!(limit(&mut watching, 0, now + 19_000).0, 6);
        assert_eq!(limit(&mut watching, 7_000, now + 19_000), (8, Some((12, 0, 4))));
        // At the claim limit with hints waiting: c ended having reported 4. b, found stalled by
        // the last listing, gets no share of c's work while it has not renewed since.
        let ended = |b_exp: u64| vec![session("a", now + 20_000, 4), session("b", b_exp, 4), session("c", 0, 4)];
        let refreshed = |b: &Balancer, sessions: &[SessionItem]| {
            b.clone().refreshed_limit(sessions, "a", load(4, 700), 0, now, &config, 12_000)
        };
        assert_eq!(refreshed(&watching, &ended(now + 19_000)), 8);
        assert_eq!(refreshed(&watching, &ended(now + 19_900)), 6, "b renewed since");
        assert_eq!(refreshed(&renewing, &ended(now + 19_500)), 6);
        // Three workers renew beside the stalled one: c's 4 are theirs (a share of 6 each).
        let stalled = PeerSession { load: Some(load(4, 4)), seen_for_ms: 60_000 };
        let s = share(4, &[stalled, peer(4), peer(4)], 4);
        assert_eq!((s.mine, s.claim_limit), (6, 6));
        // A stalled session holding more than its share still counts all it holds: the shares
        // are as if it renewed (6 each); it hands its excess over once it renews again.
        let stalled = PeerSession { load: Some(load(10, 10)), seen_for_ms: 60_000 };
        let s = share(2, &[stalled], 0);
        assert_eq!((s.work, s.mine, s.claim_limit, s.excess), (12, 6, 6, 0));
    }

    #[test]
    fn the_pace_is_two_renewals_and_one_poll() {
        assert_eq!(balance_pace_ms(5_000, 2_000), 12_000);
        assert_eq!(balance_pace_ms(1_000, 1_000), 3_000);
    }
}
