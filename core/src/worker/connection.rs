//! What a handler gets for one held lease: the work's id and url, where to resume, the fence for
//! downstream writes, a cancellation token, and checkpoints that go through the lease.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use super::decide::CancelReason;
use crate::{Error, Lease, LeaseStore, Result};

/// A cancellation token with the first reason it was cancelled for.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cancel {
    token: CancellationToken,
    reason: Arc<OnceLock<CancelReason>>,
}

impl Cancel {
    /// Cancels for `reason`; a later reason does not replace the first one.
    pub(crate) fn cancel(&self, reason: CancelReason) -> bool {
        let first = self.reason.set(reason).is_ok();
        self.token.cancel();
        first
    }

    pub(crate) fn reason(&self) -> Option<CancelReason> {
        self.reason.get().copied()
    }

    pub(crate) fn token(&self) -> &CancellationToken {
        &self.token
    }
}

/// The state of one held lease, shared by its renewal schedule, its handler and the worker.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) id: String,
    /// Checkpoints and renewals take turns on the lease.
    pub(crate) lease: tokio::sync::Mutex<Lease>,
    pub(crate) cancel: Cancel,
    /// The local deadline of the last successful renewal, monotonic ms (readable without the lock).
    pub(crate) deadline_mono_ms: AtomicU64,
    /// Session mode: the epoch of the session it was claimed under.
    pub(crate) session_epoch: Option<u64>,
    /// The claim's fence (how many times the work was claimed) and the order of the claim in
    /// this worker: what a hand-over picks by.
    pub(crate) fence: u64,
    pub(crate) claim_order: u64,
    /// Picked for a hand-over in this round (0: not picked): no longer reported as held, and
    /// cancelled once a session renewal sent after the pick has said so (so no worker counts it
    /// twice, as held here and as unowned).
    pub(crate) handing_over: AtomicU64,
}

impl Held {
    pub(crate) fn new(lease: Lease, session_epoch: Option<u64>, claim_order: u64) -> Self {
        Self {
            id: lease.id.clone(),
            session_epoch,
            fence: lease.fence,
            claim_order,
            handing_over: AtomicU64::new(0),
            deadline_mono_ms: AtomicU64::new(lease.deadline_mono_ms),
            lease: tokio::sync::Mutex::new(lease),
            cancel: Cancel::default(),
        }
    }

    pub(crate) fn deadline_mono_ms(&self) -> u64 {
        self.deadline_mono_ms.load(Ordering::SeqCst)
    }
}

/// One leased unit of work, handed to the handler. Cloning it is cheap; every clone sees the
/// same lease and the same token.
///
/// The token fires at the lease's local deadline, when the lease is lost, when the work is
/// STOPPED, when the worker shuts down, and after the handler returns. A handler should stop
/// acting for the work as soon as it fires; if it has not returned within the worker's
/// `handler_grace` it is aborted.
#[derive(Clone)]
pub struct Connection {
    held: Arc<Held>,
    store: Arc<dyn LeaseStore>,
    url: Option<String>,
    last_seq: Option<u64>,
    fence: u64,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("id", &self.held.id)
            .field("url", &self.url)
            .field("fence", &self.fence)
            .field("last_seq", &self.last_seq)
            .field("cancel_reason", &self.held.cancel.reason())
            .finish()
    }
}

impl Connection {
    pub(crate) fn new(held: Arc<Held>, store: Arc<dyn LeaseStore>, lease: &Lease) -> Self {
        Self { held, store, url: lease.url.clone(), last_seq: lease.last_seq, fence: lease.fence }
    }

    /// The work's id (`connection_id`).
    pub fn id(&self) -> &str {
        &self.held.id
    }

    /// Where to connect (`ws_url`).
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    /// The last sequence number checkpointed when the lease was claimed: resume after it.
    pub fn last_seq(&self) -> Option<u64> {
        self.last_seq
    }

    /// This claim's fencing token; downstream writes conditional on it fail after a takeover.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The lease as it stands now (renewals move its deadline, checkpoints its `last_seq`).
    pub async fn lease(&self) -> Lease {
        self.held.lease.lock().await.clone()
    }

    /// When this worker must stop acting for the work, on the store clock's monotonic ms.
    pub fn deadline_mono_ms(&self) -> u64 {
        self.held.deadline_mono_ms()
    }

    /// The token that fires when the handler must stop.
    pub fn token(&self) -> &CancellationToken {
        self.held.cancel.token()
    }

    /// Resolves when the token fires.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.held.cancel.token().cancelled()
    }

    pub fn is_cancelled(&self) -> bool {
        self.held.cancel.token().is_cancelled()
    }

    /// Why the token fired, once it has.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.held.cancel.reason()
    }

    /// Records `seq` as processed, under the lease (owner and fence) and only forward. A `Lost`
    /// answer cancels the token: the work belongs to someone else now. Resolves by the lease's
    /// local deadline at the latest: past it, `Lost` without a request.
    pub async fn checkpoint(&self, seq: u64) -> Result<()> {
        let mut lease = self.lock_to_act().await?;
        let result = self.by_deadline(self.store.checkpoint(&mut lease, seq)).await;
        self.note(result)
    }

    // Rule 2 for everything a handler awaits (the bindings' equivalents must follow the same
    // rule): the wait for the lease's lock and every request are bounded by the lease's local
    // deadline, whether the holder may act is decided once the lock is held, and past the
    // deadline the call fails with `Lost` without sending anything.

    /// Takes the lease's lock for one operation, waiting no later than the deadline (a renewal
    /// stuck in the network holds the lock until then), and checks it may act once it has it.
    pub(crate) async fn lock_to_act(&self) -> Result<tokio::sync::MutexGuard<'_, Lease>> {
        self.ensure_may_act()?;
        let mut lease = self.by_deadline(async { Ok(self.held.lease.lock().await) }).await?;
        self.ensure_may_act()?;
        // In session mode the session's renewals move the deadline, not the lease's own.
        lease.deadline_mono_ms = lease.deadline_mono_ms.max(self.held.deadline_mono_ms());
        Ok(lease)
    }

    /// Runs `operation`, or gives it up (dropping whatever request is in flight, sending no
    /// other) and fails with `Lost` once the lease's local deadline has passed.
    pub(crate) async fn by_deadline<T>(&self, operation: impl Future<Output = Result<T>>) -> Result<T> {
        tokio::select! {
            biased;
            done = operation => done,
            () = self.deadline_passed() => {
                self.held.cancel.cancel(CancelReason::Deadline);
                Err(self.lost())
            }
        }
    }

    /// Resolves once the store clock reaches the lease's local deadline; a renewal that lands
    /// meanwhile moves it (only while the lock is not held, as in a fenced write without a
    /// checkpoint).
    async fn deadline_passed(&self) {
        loop {
            let (now, deadline) = (self.store.clock().monotonic_ms(), self.held.deadline_mono_ms());
            if now >= deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(deadline - now)).await;
        }
    }

    /// Refuses to act once the lease is gone: lost, past the deadline, or given up.
    pub(crate) fn ensure_may_act(&self) -> Result<()> {
        let gone = matches!(
            self.held.cancel.reason(),
            Some(CancelReason::Lost | CancelReason::Deadline | CancelReason::Released)
        ) || self.store.clock().monotonic_ms() >= self.held.deadline_mono_ms();
        if gone {
            return Err(self.lost());
        }
        Ok(())
    }

    fn lost(&self) -> Error {
        Error::Lost { id: self.held.id.clone() }
    }

    /// Cancels the token when `result` says the lease is lost.
    pub(crate) fn note<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(Error::Lost { .. }) = &result {
            self.held.cancel.cancel(CancelReason::Lost);
        }
        result
    }

    pub(crate) fn store(&self) -> &Arc<dyn LeaseStore> {
        &self.store
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_reason_wins() {
        let cancel = Cancel::default();
        assert_eq!(cancel.reason(), None);
        assert!(cancel.cancel(CancelReason::Stopped));
        assert!(!cancel.cancel(CancelReason::Lost));
        assert_eq!(cancel.reason(), Some(CancelReason::Stopped));
        assert!(cancel.token().is_cancelled());
    }
}
