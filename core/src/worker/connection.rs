//! What a handler gets for one held lease: the work's id and url, where to resume, the fence for
//! downstream writes, a cancellation token, and checkpoints that go through the lease.

use std::future::Future;
use std::sync::Arc;

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use super::decide::CancelReason;
use crate::hold::HeldLease;
use crate::{Lease, LeaseStore, Result};

/// The state of one held lease, shared by its handler and the driver (renewals and releases
/// take turns with the handler's checkpoints on it).
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) state: HeldLease,
}

impl Held {
    pub(crate) fn new(lease: Lease) -> Self {
        Self { state: HeldLease::new(lease) }
    }
}

impl std::ops::Deref for Held {
    type Target = HeldLease;

    fn deref(&self) -> &HeldLease {
        &self.state
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

    /// How long this worker may still act for the work, on the store clock: zero once past
    /// the deadline.
    pub fn time_left(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.deadline_mono_ms().saturating_sub(self.store.clock().monotonic_ms()))
    }

    /// The store's time now (epoch ms): the time to stamp what the handler writes with, so
    /// that stamps agree across the fleet whatever each host's clock says (see
    /// [`crate::StoreClock`]).
    pub fn now_ms(&self) -> u64 {
        self.store.clock().now_ms()
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
        self.held.checkpoint(&*self.store, seq).await
    }

    // Rule 2 for everything a handler awaits lives in `HeldLease` (shared with `Hold`).

    /// Takes the lease's lock for one operation, waiting no later than the deadline.
    pub(crate) async fn lock_to_act(&self) -> Result<tokio::sync::MutexGuard<'_, Lease>> {
        self.held.lock_to_act(self.store.clock()).await
    }

    /// Runs `operation`, or gives it up and fails with `Lost` once the deadline has passed.
    pub(crate) async fn by_deadline<T>(&self, operation: impl Future<Output = Result<T>>) -> Result<T> {
        self.held.by_deadline(self.store.clock(), operation).await
    }

    /// Cancels the token when `result` says the lease is lost.
    pub(crate) fn note<T>(&self, result: Result<T>) -> Result<T> {
        self.held.note(result)
    }

    pub(crate) fn store(&self) -> &Arc<dyn LeaseStore> {
        &self.store
    }
}
