//! The worker-wide loops that read the table: orphan reconciliation (the sparse GSI) and the
//! batched desired-state check of every held lease.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tracing::{debug, info, warn};

use super::decide::{
    balance_pace_ms, dead_session_owners, desired_state_phase_ms, jittered_ms, orphan_counts, orphan_query_cutoff,
    orphan_retry_ms, plan_orphans, stopped_ids, CancelReason, FleetView, OrphanPlan, OrphanPoll, PeerSession,
    CLAIM_CONCURRENCY,
};
use super::Inner;
use crate::Result;

pub(crate) async fn orphan_loop(inner: Arc<Inner>) {
    let mut failures = 0;
    loop {
        if inner.shutdown.is_cancelled() {
            return;
        }
        settle_unknown_claims(&inner).await;
        let wake_in_ms = match poll_orphans(&inner).await {
            Ok(ms) => {
                failures = 0;
                ms
            }
            Err(e) => {
                warn!(error = %e, "orphan query failed");
                failures += 1;
                orphan_retry_ms(failures, inner.settings.orphan_interval.as_millis() as u64, rand::random())
            }
        };
        tokio::select! {
            biased;
            () = inner.shutdown.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(wake_in_ms)) => {}
            () = inner.poll_orphans_now.notified() => {}
        }
    }
}

/// A claim whose answer was lost may still have landed: its item then names this worker, and
/// nobody renews or releases it, so it would wait out a whole lease before anyone else may
/// claim it. Each one is read again; one that names us with a fence we do not hold is released
/// (conditioned on that owner and fence, so a later claim by anyone is left alone).
async fn settle_unknown_claims(inner: &Inner) {
    let ids = std::mem::take(&mut *inner.unsettled.lock().expect("unsettled poisoned"));
    let store = &*inner.store;
    for id in ids {
        if inner.is_tracked(&id) || inner.shutdown.is_cancelled() {
            continue;
        }
        let item = match store.get(&id).await {
            Ok(Some(item)) => item,
            Ok(None) => continue,
            Err(e) => {
                debug!(connection_id = %id, error = %e, "re-read of an unknown claim failed, trying again");
                inner.unsettled.lock().expect("unsettled poisoned").insert(id);
                continue;
            }
        };
        if item.owner.as_deref() != Some(inner.id.as_str()) || item.expires_at_ms == Some(0) || inner.is_tracked(&id) {
            continue;
        }
        let lease = crate::Lease::from_item(item, &inner.id, store.clock().monotonic_ms(), store.config());
        match store.release(&lease).await {
            Ok(()) => {
                info!(connection_id = %id, fence = lease.fence, "a claim whose answer was lost had landed: released")
            }
            Err(e) => debug!(connection_id = %id, error = %e, "release of an unknown claim refused"),
        }
    }
}

/// One poll: query orphans (and leases about to expire), claim what fits, say when to poll next.
async fn poll_orphans(inner: &Inner) -> Result<u64> {
    let store = &*inner.store;
    let config = store.config();
    let interval_ms = inner.settings.orphan_interval.as_millis() as u64;
    let session_mode = inner.session_mode();
    let capacity = inner.permits.available_permits();
    // Session mode polls even when full: the poll also decides the balance.
    if capacity == 0 && !session_mode {
        return Ok(jittered_ms(interval_ms, rand::random()));
    }
    let cutoff = orphan_query_cutoff(store.clock().now_ms(), config, interval_ms);
    // With balance every orphan counts as the fleet's work, not only those that fit here.
    let page_size = if inner.balanced() { inner.settings.max_connections } else { capacity.max(1) };
    // Only a read: at shutdown it is dropped rather than waited for (claims, below, are not).
    let page = tokio::select! {
        biased;
        () = inner.shutdown.cancelled() => return Ok(0),
        page = store.orphans_page(cutoff, page_size, None) => page?,
    };
    inner.counters.add(&inner.counters.orphan_polls, 1);
    let now_ms = store.clock().now_ms();
    let fleet = if session_mode && inner.current_session().is_some() {
        // A failed read of the fleet leaves the limit as it was; the orphans are still claimed.
        read_fleet(inner).await.inspect_err(|e| warn!(error = %e, "reading the sessions failed")).ok()
    } else {
        None
    };
    let dead = if let Some(fleet) = fleet {
        if inner.balanced() {
            // In flight: released by us (a hand-over) and not claimed yet.
            let (unowned_orphans, in_flight) =
                orphan_counts(&page.items, now_ms, config, &inner.id, |id| inner.is_tracked(id));
            let dead_work: usize = fleet.dead.iter().map(|d| d.ids.len()).sum();
            balance(inner, &fleet.peers, unowned_orphans + dead_work as u64, in_flight);
        }
        fleet.dead
    } else {
        Vec::new()
    };
    // With balance every claimable orphan is a candidate; the waves keep to the room.
    let capacity = if inner.balanced() { inner.permits.available_permits() } else { inner.room() };
    let poll = OrphanPoll {
        items: &page.items,
        page_was_full: page.next.is_some(),
        now_ms,
        capacity,
        interval_ms,
        unit: rand::random(),
    };
    let OrphanPlan { claim, wake_in_ms } = plan_orphans(&poll, config, |id| inner.is_tracked(id));
    if inner.balanced() {
        claim_in_waves(inner, claim, "orphan").await;
    } else if !claim.is_empty() {
        debug!(count = claim.len(), "claiming orphans");
        futures::stream::iter(claim)
            .map(|id| async move { inner.claim(&id, "orphan").await })
            .buffer_unordered(CLAIM_CONCURRENCY)
            .for_each(|_| async {})
            .await;
    }
    if session_mode {
        claim_dead_sessions(inner, dead).await?;
    }
    Ok(wake_in_ms)
}

/// A dead session (or an older epoch of ours, `epoch` `None`) and its connections not tracked here.
struct DeadSession {
    owner: String,
    epoch: Option<u64>,
    /// How many connections the owner index still lists under it (here or not).
    listed: usize,
    ids: Vec<String>,
}

/// The live sessions of the other workers and the dead sessions with their connections.
struct Fleet {
    peers: Vec<PeerSession>,
    dead: Vec<DeadSession>,
}

/// One query of the session partition (live and dead alike), then the owner index per dead
/// session. Work of our own earlier epochs is listed too, once after a new epoch was opened.
async fn read_fleet(inner: &Inner) -> Result<Fleet> {
    let store = &*inner.store;
    let config = store.config();
    let sessions = store.sessions(u64::MAX).await?;
    let (now_ms, mono_ms) = (store.clock().now_ms(), store.clock().monotonic_ms());
    let (peers, dead_sessions) = inner.balancer().read(sessions, &inner.id, now_ms, mono_ms, config);
    let reclaim_own = inner.reclaim_own.swap(false, std::sync::atomic::Ordering::SeqCst);
    let mut dead = Vec::new();
    for (owner, epoch) in dead_session_owners(&dead_sessions, &inner.id, reclaim_own) {
        let owned = store.owned_by(&owner).await?;
        let listed = owned.len();
        let ids = owned.into_iter().map(|i| i.id).filter(|id| !inner.is_tracked(id)).collect();
        dead.push(DeadSession { owner, epoch, listed, ids });
    }
    Ok(Fleet { peers, dead })
}

/// Sets the claim limit from the fleet's load and, paced, hands a few connections over when
/// this worker is above its share while another is short of its own.
fn balance(inner: &Inner, peers: &[PeerSession], unowned: u64, in_flight: u64) {
    let store = &*inner.store;
    let config = store.config();
    let pace_ms = balance_pace_ms(config.renew_ms(), inner.settings.orphan_interval.as_millis() as u64);
    let view = FleetView { me: inner.load(), peers, unowned, in_flight };
    let step = inner.balancer().step(&view, store.clock().monotonic_ms(), pace_ms);
    inner.claim_limit.store(step.claim_limit as usize, std::sync::atomic::Ordering::SeqCst);
    inner.balance_changed.notify_waiters();
    let (Some(share), count) = (step.share, step.hand_over) else { return };
    if count > 0 && !inner.shutdown.is_cancelled() {
        let ids = inner.hand_over(count as usize);
        info!(
            worker_id = %inner.id, handing_over = ids.len(), share = share.mine, work = share.work,
            sessions = peers.len() + 1, "above the fair share: handing over"
        );
    }
}

/// At the claim limit with hints waiting: one query of the sessions says whether the share has
/// grown (a peer left or died: its last report says what it held). Only ever raises the limit;
/// the next orphan poll sets it from the whole view.
pub(crate) async fn refresh_claim_limit(inner: &Inner) {
    let store = &*inner.store;
    let Ok(sessions) = store.sessions(u64::MAX).await else { return };
    let pace_ms = balance_pace_ms(store.config().renew_ms(), inner.settings.orphan_interval.as_millis() as u64);
    let now_ms = store.clock().now_ms();
    let me = inner.load();
    let limit = inner.balancer().refreshed_limit(&sessions, &inner.id, me, now_ms, store.config(), pace_ms);
    inner.claim_limit.fetch_max(limit as usize, std::sync::atomic::Ordering::SeqCst);
}

/// Claims `ids` in waves no larger than the room left (all at once for our own earlier work):
/// a claim lost to another worker frees its room for the next wave, so racing claimers share
/// the work in one poll. Returns how many were claimed.
async fn claim_in_waves(inner: &Inner, mut ids: Vec<String>, source: &'static str) -> usize {
    let own = source == super::RECLAIM_OWN;
    if inner.balanced() {
        // Claimers racing over one list in one order would mostly collide.
        use rand::seq::SliceRandom;
        ids.shuffle(&mut rand::thread_rng());
    }
    let mut claimed = 0;
    while !ids.is_empty() && !inner.shutdown.is_cancelled() {
        let room = if own { ids.len() } else { inner.room().min(ids.len()) };
        if room == 0 {
            break;
        }
        let wave: Vec<String> = ids.drain(..room).collect();
        claimed += futures::stream::iter(wave)
            .map(|id| async move { inner.claim(&id, source).await })
            .buffer_unordered(CLAIM_CONCURRENCY)
            .filter(|c| futures::future::ready(*c == super::Claim::Claimed))
            .count()
            .await;
    }
    claimed
}

/// Session mode: the connections of dead sessions are claimed like orphans (within the claim
/// limit); a dead session left with none is retired so later queries skip it.
async fn claim_dead_sessions(inner: &Inner, dead: Vec<DeadSession>) -> Result<()> {
    let store = &*inner.store;
    for DeadSession { owner, epoch, listed, ids } in dead {
        if inner.shutdown.is_cancelled() {
            return Ok(());
        }
        if listed == 0 {
            if let Some(epoch) = epoch {
                store.retire_session(&owner, epoch).await?;
            }
            continue;
        }
        let own = epoch.is_none();
        if inner.room() == 0 && !own {
            continue;
        }
        let source = if own { super::RECLAIM_OWN } else { "dead session" };
        let wanted = ids.len();
        let claimed = claim_in_waves(inner, ids, source).await;
        if own && claimed < wanted {
            // Some of our earlier work is still listed under us: look again at the next poll.
            inner.reclaim_own.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        if claimed > 0 {
            info!(owner = %owner, claimed, "took over a dead session's work");
            inner.counters.add(&inner.counters.session_takeovers, claimed as u64);
        }
    }
    Ok(())
}

/// Every interval, one batched read of the desired state of every held lease; STOPPED cancels
/// the handler (its lease task releases the lease once the handler has returned).
pub(crate) async fn desired_state_loop(inner: Arc<Inner>) {
    let interval = inner.settings.desired_state_interval;
    // A random phase spreads a fleet's reads; after it the period is exact, so a STOP is seen
    // within one interval.
    let phase = Duration::from_millis(desired_state_phase_ms(interval.as_millis() as u64, rand::random()));
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + phase, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = inner.shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let held = inner.held();
        if held.is_empty() {
            continue;
        }
        let ids: Vec<String> = held.iter().map(|h| h.id.clone()).collect();
        // Shutdown cancels every handler anyway: the read is dropped, not waited for.
        let states = tokio::select! {
            biased;
            () = inner.shutdown.cancelled() => return,
            states = inner.store.batch_desired_states(&ids) => states,
        };
        match states {
            Ok(states) => {
                for id in stopped_ids(&states) {
                    if let Some(h) = held.iter().find(|h| h.id == id) {
                        if h.cancel.cancel(CancelReason::Stopped) {
                            info!(connection_id = %id, "stopped");
                        }
                    }
                }
            }
            Err(e) => warn!(error = %e, held = ids.len(), "desired-state check failed"),
        }
    }
}
