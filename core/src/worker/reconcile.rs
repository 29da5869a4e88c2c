//! The worker-wide loops that read the table: orphan reconciliation (the sparse GSI) and the
//! batched desired-state check of every held lease.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tracing::{debug, info, warn};

use super::decide::{
    dead_session_owners, desired_state_phase_ms, jittered_ms, orphan_query_cutoff, orphan_retry_ms, plan_orphans,
    stopped_ids, CancelReason, OrphanPlan, OrphanPoll, CLAIM_CONCURRENCY,
};
use super::Inner;
use crate::Result;

pub(crate) async fn orphan_loop(inner: Arc<Inner>) {
    let mut failures = 0;
    loop {
        if inner.shutdown.is_cancelled() {
            return;
        }
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

/// One poll: query orphans (and leases about to expire), claim what fits, say when to poll next.
async fn poll_orphans(inner: &Inner) -> Result<u64> {
    let store = &*inner.store;
    let config = store.config();
    let interval_ms = inner.settings.orphan_interval.as_millis() as u64;
    let capacity = inner.permits.available_permits();
    if capacity == 0 {
        return Ok(jittered_ms(interval_ms, rand::random()));
    }
    let cutoff = orphan_query_cutoff(store.clock().now_ms(), config, interval_ms);
    // Only a read: at shutdown it is dropped rather than waited for (claims, below, are not).
    let page = tokio::select! {
        biased;
        () = inner.shutdown.cancelled() => return Ok(0),
        page = store.orphans_page(cutoff, capacity, None) => page?,
    };
    inner.counters.add(&inner.counters.orphan_polls, 1);
    let poll = OrphanPoll {
        items: &page.items,
        page_was_full: page.next.is_some(),
        now_ms: store.clock().now_ms(),
        capacity,
        interval_ms,
        unit: rand::random(),
    };
    let OrphanPlan { claim, wake_in_ms } = plan_orphans(&poll, config, |id| inner.is_tracked(id));
    if !claim.is_empty() {
        debug!(count = claim.len(), "claiming orphans");
        futures::stream::iter(claim)
            .map(|id| async move { inner.claim(&id, "orphan").await })
            .buffer_unordered(CLAIM_CONCURRENCY)
            .for_each(|_| async {})
            .await;
    }
    if inner.session_mode() {
        claim_dead_sessions(inner).await?;
    }
    Ok(wake_in_ms)
}

/// Session mode: the connections of dead sessions (a query of the session partition, then the
/// owner index per dead session) are claimed like orphans; a dead session left with none is
/// retired so later queries skip it. Work of our own earlier epochs is claimed back too.
async fn claim_dead_sessions(inner: &Inner) -> Result<()> {
    let store = &*inner.store;
    if inner.current_session().is_none() || inner.shutdown.is_cancelled() {
        return Ok(());
    }
    let cutoff = crate::lease::claim_cutoff(store.clock().now_ms(), store.config());
    let dead = store.sessions(cutoff).await?;
    let reclaim_own = inner.reclaim_own.swap(false, std::sync::atomic::Ordering::SeqCst);
    let owners = dead_session_owners(&dead, &inner.id, reclaim_own);
    for (owner, epoch) in owners {
        if inner.shutdown.is_cancelled() || inner.permits.available_permits() == 0 {
            return Ok(());
        }
        let owned = store.owned_by(&owner).await?;
        if owned.is_empty() {
            if let Some(epoch) = epoch {
                store.retire_session(&owner, epoch).await?;
            }
            continue;
        }
        let ids: Vec<String> = owned.into_iter().map(|i| i.id).filter(|id| !inner.is_tracked(id)).collect();
        let claimed = futures::stream::iter(ids)
            .map(|id| async move { inner.claim(&id, "dead session").await })
            .buffer_unordered(CLAIM_CONCURRENCY)
            .filter(|c| futures::future::ready(*c == super::Claim::Claimed))
            .count()
            .await;
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
