//! Session mode: the worker's one heartbeat. Opens a session, renews it every renew interval
//! (one write for everything the worker holds), moves every held connection's deadline with it,
//! and at the session's deadline (rule 2) cancels every handler and opens a new epoch.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::decide::{session_retry_ms, session_wake_at};
use super::lease_task::sleep_until_mono;
use super::{CancelReason, Inner};
use crate::{Error, Session};

/// Runs until `stop` fires between two renewals (a renewal in flight is finished first, so
/// none lands after the session's end).
pub(crate) async fn session_loop(inner: Arc<Inner>, stop: CancellationToken) {
    let store = inner.store.clone();
    let config = store.config().clone();
    let mut previous = None;
    let mut failures = 0;
    loop {
        if stop.is_cancelled() {
            return;
        }
        let session = match store.create_session(&inner.id, previous).await {
            Ok(session) => session,
            Err(e) => {
                // Our own session of an earlier run that still lives by rule 1 is waited out.
                let wait_ms = session_retry_ms(&e, failures, store.clock().now_ms(), &config, rand::random());
                warn!(worker_id = %inner.id, error = %e, wait_ms, "session not opened");
                failures += 1;
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(wait_ms)) => {}
                }
                continue;
            }
        };
        failures = 0;
        previous = Some(session.epoch);
        info!(worker_id = %inner.id, epoch = session.epoch, "session opened");
        inner.set_session(Some(session.clone()));
        // Work of an earlier epoch of ours is claimed back like a dead session's.
        inner.reclaim_own.store(true, std::sync::atomic::Ordering::SeqCst);
        inner.poll_orphans_now.notify_one();
        hold(&inner, session, &stop).await;
        if stop.is_cancelled() {
            return;
        }
    }
}

/// Renews `session` until it is lost (then every handler is cancelled) or `stop` fires.
async fn hold(inner: &Inner, mut session: Session, stop: &CancellationToken) {
    let store = &*inner.store;
    let config = store.config();
    loop {
        let deadline = session.deadline_mono_ms;
        tokio::select! {
            () = stop.cancelled() => return,
            () = sleep_until_mono(store, session_wake_at(&session, config)) => {}
            // A hand-over round: report the lower load first, then let the work go.
            () = inner.renew_now.notified() => {}
        }
        if store.clock().monotonic_ms() >= deadline {
            break;
        }
        let started = store.clock().monotonic_ms();
        // Rule 2: nothing runs past the deadline, a renewal stuck in the network included.
        let mut renewing = session.clone();
        // The round first: a pick made after the load was read waits for the next renewal.
        let round = inner.hand_over_round();
        let load = inner.load();
        let renewed = tokio::select! {
            // The same write tells the fleet what this worker holds (fleet-aware balance).
            renewed = store.renew_session_reporting(&mut renewing, load) => renewed,
            () = sleep_until_mono(store, deadline) => Err(Error::Lost { id: config.session_id(&inner.id) }),
        };
        match renewed {
            Ok(()) => {
                inner.counters.session_renew_latency(store.clock().monotonic_ms().saturating_sub(started));
                session = renewing;
                inner.set_session(Some(session.clone()));
                inner.start_hand_overs(round);
            }
            Err(e) => {
                warn!(worker_id = %inner.id, epoch = session.epoch, error = %e, "session lost");
                break;
            }
        }
    }
    inner.lose_session(CancelReason::Deadline);
}
