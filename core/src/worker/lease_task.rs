//! One held lease's task: runs the handler, renews on schedule, enforces the local deadline,
//! and gives the lease back when the handler has ended.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use super::connection::{Connection, Held};
use super::decide::{
    after_renewal, after_renewal_error, counts_as_lost, is_fleet_work, releases_after_handler, CancelReason, RenewStep,
};
use super::Inner;
use crate::{Error, LeaseStore};

/// Sleeps until the store clock's monotonic time reaches `at_mono_ms`.
pub(crate) async fn sleep_until_mono(store: &dyn LeaseStore, at_mono_ms: u64) {
    let now = store.clock().monotonic_ms();
    if at_mono_ms > now {
        tokio::time::sleep(Duration::from_millis(at_mono_ms - now)).await;
    }
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
        let renewing = async {
            if inner.session_mode() {
                hold_until_deadline(&inner, &held).await
            } else {
                renew_until_lost(&inner, &held).await
            }
        };
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

/// Session mode: nothing is renewed per connection; the session's renewals move the deadline.
/// Cancels the token at the deadline (rule 2), or returns once it has fired for another reason.
async fn hold_until_deadline(inner: &Inner, held: &Held) {
    let store = &*inner.store;
    loop {
        let deadline = held.deadline_mono_ms();
        if store.clock().monotonic_ms() >= deadline {
            held.cancel.cancel(CancelReason::Deadline);
            return;
        }
        tokio::select! {
            () = sleep_until_mono(store, deadline) => {}
            () = held.cancel.token().cancelled() => {
                // Stopped, shutdown or handed over: the work stays ours while the handler winds down.
                let reason = held.cancel.reason();
                if !matches!(reason, Some(CancelReason::Stopped | CancelReason::Shutdown | CancelReason::HandOver)) {
                    return;
                }
                sleep_until_mono(store, held.deadline_mono_ms()).await;
            }
        }
    }
}

/// Renews on schedule until the lease is lost or its deadline passes (then cancels the token
/// and returns). A renewal that reports STOPPED cancels the handler but keeps renewing, so the
/// lease stays ours while the handler winds down; the release follows once it has.
async fn renew_until_lost(inner: &Inner, held: &Held) {
    let store = &*inner.store;
    let config = store.config();
    let mut next = held.lease.lock().await.next_renew_mono_ms(config);
    let mut attempt = 0;
    loop {
        let deadline = held.deadline_mono_ms();
        if store.clock().monotonic_ms() >= deadline {
            held.cancel.cancel(CancelReason::Deadline);
            return;
        }
        sleep_until_mono(store, next.min(deadline)).await;
        let now = store.clock().monotonic_ms();
        if now >= deadline {
            held.cancel.cancel(CancelReason::Deadline);
            return;
        }
        if now < next {
            continue;
        }
        // Rule 2: nothing may run past the deadline, a renewal stuck in the network included.
        let renewed = tokio::select! {
            renewed = async {
                let mut lease = held.lease.lock().await;
                let started = store.clock().monotonic_ms();
                let result = store.renew(&mut lease).await;
                let latency = store.clock().monotonic_ms().saturating_sub(started);
                result.map(|()| (lease.clone(), latency))
            } => renewed,
            () = sleep_until_mono(store, deadline) => {
                held.cancel.cancel(CancelReason::Deadline);
                return;
            }
        };
        let step = match &renewed {
            Ok((lease, latency)) => {
                inner.counters.renew_latency(*latency);
                held.deadline_mono_ms.store(lease.deadline_mono_ms, Ordering::SeqCst);
                attempt = 0;
                after_renewal(lease, config)
            }
            Err(e) => {
                let step = after_renewal_error(
                    e,
                    attempt,
                    store.clock().monotonic_ms(),
                    held.deadline_mono_ms(),
                    config,
                    rand::random(),
                );
                debug!(connection_id = %held.id, error = %e, attempt, "renewal failed");
                attempt += 1;
                step
            }
        };
        match step {
            RenewStep::RenewAt(at) => next = at,
            RenewStep::StoppedRenewAt(at) => {
                if held.cancel.cancel(CancelReason::Stopped) {
                    info!(connection_id = %held.id, "stopped (seen on renewal)");
                }
                next = at;
            }
            RenewStep::RetryAt(at) => next = at,
            RenewStep::Lost => {
                held.cancel.cancel(CancelReason::Lost);
                return;
            }
            RenewStep::Deadline => {
                // Wait out the deadline itself: the loop cancels with `Deadline` there.
                next = held.deadline_mono_ms();
            }
        }
    }
}
