//! One held lease's task: runs the handler, renews on schedule, enforces the local deadline,
//! and gives the lease back when the handler has ended.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use super::connection::{Connection, Held};
use super::decide::{counts_as_lost, is_fleet_work, releases_after_handler, CancelReason};
use super::Inner;
use crate::keeper::Upkeep;
use crate::{Error, LeaseStore};

/// Sleeps until the store clock's monotonic time reaches `at_mono_ms`.
pub(crate) async fn sleep_until_mono(store: &dyn LeaseStore, at_mono_ms: u64) {
    crate::hold::sleep_until_mono(store.clock(), at_mono_ms).await
}

/// Aborts the task when dropped: a crashed (dropped) worker leaves no handler running.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How a handler ended.
enum HandlerEnd {
    Returned,
    Failed(String),
    Panicked(String),
    /// Cancelled, did not return within the grace period, and was aborted.
    Aborted,
}

pub(crate) async fn supervise(inner: Arc<Inner>, held: Arc<Held>, permit: OwnedSemaphorePermit) {
    let store = inner.store.clone();
    let lease = held.lease.lock().await.clone();
    let conn = Connection::new(held.clone(), store.clone(), &lease);
    let mut handler = AbortOnDrop(tokio::spawn((inner.handler)(conn)));

    // The block drops the renewal future before the release below: a renewal suspended in
    // the middle of a request holds the lease's lock.
    let end = {
        let ended = wait_for_handler(&mut handler.0, &held, inner.settings.handler_grace);
        // Session mode: nothing is renewed per connection; the session's renewals move the
        // deadline (`Inner::set_session`).
        let upkeep = if inner.session_mode() { Upkeep::Watch } else { Upkeep::Renew };
        let renewing = held.keep(&*store, upkeep, |latency| inner.counters.renew_latency(latency));
        tokio::pin!(ended, renewing);
        tokio::select! {
            end = &mut ended => end,
            // The lease is gone (the token has fired); the handler still has to stop.
            () = &mut renewing => ended.await,
        }
    };
    let reason = held.cancel.reason();
    let id = held.id.as_str();
    match &end {
        HandlerEnd::Returned => debug!(connection_id = %id, reason = ?reason, "handler returned"),
        HandlerEnd::Failed(e) => {
            inner.counters.add(&inner.counters.handler_errors, 1);
            warn!(connection_id = %id, error = %e, "handler failed");
        }
        HandlerEnd::Panicked(e) => {
            inner.counters.add(&inner.counters.handler_panics, 1);
            error!(connection_id = %id, error = %e, "handler panicked");
        }
        HandlerEnd::Aborted => {
            warn!(connection_id = %id, grace_ms = inner.settings.handler_grace.as_millis() as u64, "handler ignored cancellation; aborted")
        }
    }
    if counts_as_lost(reason) {
        inner.counters.add(&inner.counters.leases_lost, 1);
        warn!(connection_id = %id, reason = ?reason, "lease lost");
    }
    // Session mode: at shutdown one session write frees everything (after every handler ended).
    if releases_after_handler(reason, inner.session_mode()) {
        let lease = held.lease.lock().await;
        match store.release(&lease).await {
            Ok(()) => {
                inner.counters.add(&inner.counters.released, 1);
                info!(connection_id = %id, fence = lease.fence, reason = ?reason, "released");
                let hinted = matches!(reason, Some(CancelReason::Shutdown | CancelReason::HandOver));
                if reason == Some(CancelReason::HandOver) {
                    inner.counters.add(&inner.counters.handed_over, 1);
                }
                if let Some(queue) = inner.hand_over.as_ref().filter(|_| hinted) {
                    if is_fleet_work(&lease) {
                        super::hints::hand_over(queue, id).await;
                    }
                }
            }
            Err(Error::Lost { .. }) => debug!(connection_id = %id, "already taken over; nothing to release"),
            Err(e) => warn!(connection_id = %id, error = %e, "release failed; the lease will expire"),
        }
    }
    // Anything the handler left running with a clone of the connection stops now.
    held.cancel.cancel(CancelReason::Released);
    inner.forget(&held);
    drop(permit);
}

async fn wait_for_handler(
    handler: &mut JoinHandle<Result<(), super::BoxError>>,
    held: &Held,
    grace: Duration,
) -> HandlerEnd {
    let joined = tokio::select! {
        joined = &mut *handler => joined,
        () = held.cancel.token().cancelled() => match tokio::time::timeout(grace, &mut *handler).await {
            Ok(joined) => joined,
            Err(_) => {
                handler.abort();
                let _ = (&mut *handler).await;
                return HandlerEnd::Aborted;
            }
        },
    };
    match joined {
        Ok(Ok(())) => HandlerEnd::Returned,
        Ok(Err(e)) => HandlerEnd::Failed(e.to_string()),
        Err(e) if e.is_panic() => HandlerEnd::Panicked(panic_message(e.into_panic())),
        Err(_) => HandlerEnd::Aborted,
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => payload.downcast::<&'static str>().map(|s| s.to_string()).unwrap_or_else(|_| "panic".into()),
    }
}
