//! One lease held outside a [`Worker`](crate::Worker): the handle behind a "hold this id while
//! this block runs" scope, and the held-lease state every holder shares with its upkeep task
//! (a worker's connections use it too). Optionally renewed in the background on
//! the [`Keeper`]'s schedule; its token fires at the local deadline, on a lost lease, when the
//! work is STOPPED and once it is released.
//!
//! ```no_run
//! # async fn demo() -> leaselock::Result<()> {
//! use std::sync::Arc;
//! use leaselock::hold::Hold;
//! use leaselock::{LeaseStore, LeaseTable, TableConfig};
//!
//! let table: Arc<dyn LeaseStore> = Arc::new(LeaseTable::connect(TableConfig::new("leases")).await?);
//! let hold = Hold::acquire(table, "leader", "node-a", true).await?;
//! tokio::select! {
//!     _ = hold.cancelled() => println!("lost the lease: {:?}", hold.cancel_reason()),
//!     _ = tokio::time::sleep(std::time::Duration::from_secs(60)) => {}
//! }
//! hold.release().await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tracing::{debug, info};

use crate::engine::decide::CancelReason;
use crate::keeper::{Keeper, Renewal, Upkeep, Wake};
use crate::{Clock, Error, Lease, LeaseStore, Result};

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

    /// The holder may not act any more: the lease is lost, past its deadline, or given up.
    pub(crate) fn is_gone(&self) -> bool {
        matches!(self.reason(), Some(CancelReason::Lost | CancelReason::Deadline | CancelReason::Released))
    }
}

/// Sleeps until `clock`'s monotonic time reaches `at_mono_ms`.
pub(crate) async fn sleep_until_mono(clock: &dyn Clock, at_mono_ms: u64) {
    let now = clock.monotonic_ms();
    if at_mono_ms > now {
        tokio::time::sleep(Duration::from_millis(at_mono_ms - now)).await;
    }
}

/// One held lease, shared by its holder and its upkeep task: the lease (operations take turns
/// on it), a copy readable without waiting, the local deadline and the cancellation token.
///
/// Rule 2 for everything a holder awaits lives here once: the wait for the lease's lock and
/// every request are bounded by the local deadline, whether the holder may act is decided once
/// the lock is held, and past the deadline a call fails with `Lost` without sending anything.
#[derive(Debug)]
pub(crate) struct HeldLease {
    pub(crate) id: String,
    pub(crate) lease: tokio::sync::Mutex<Lease>,
    current: Mutex<Lease>,
    /// The local deadline, monotonic ms: the lease's own, or a session's that covers it.
    pub(crate) deadline_mono_ms: AtomicU64,
    pub(crate) cancel: Cancel,
}

impl HeldLease {
    pub(crate) fn new(lease: Lease) -> Self {
        Self {
            id: lease.id.clone(),
            deadline_mono_ms: AtomicU64::new(lease.deadline_mono_ms),
            current: Mutex::new(lease.clone()),
            lease: tokio::sync::Mutex::new(lease),
            cancel: Cancel::default(),
        }
    }

    pub(crate) fn deadline_mono_ms(&self) -> u64 {
        self.deadline_mono_ms.load(Ordering::SeqCst)
    }

    /// Moves the deadline later (a session renewal covers the lease); never earlier.
    pub(crate) fn cover(&self, deadline_mono_ms: u64) {
        self.deadline_mono_ms.fetch_max(deadline_mono_ms, Ordering::SeqCst);
    }

    /// The lease after the last successful operation.
    pub(crate) fn current(&self) -> Lease {
        self.current.lock().expect("lease poisoned").clone()
    }

    fn update(&self, lease: &Lease) {
        self.cover(lease.deadline_mono_ms);
        *self.current.lock().expect("lease poisoned") = lease.clone();
    }

    pub(crate) fn lost(&self) -> Error {
        Error::Lost { id: self.id.clone() }
    }

    /// Refuses to act once the lease is gone: lost, past the deadline, or given up.
    pub(crate) fn ensure_may_act(&self, clock: &dyn Clock) -> Result<()> {
        if self.cancel.is_gone() || clock.monotonic_ms() >= self.deadline_mono_ms() {
            return Err(self.lost());
        }
        Ok(())
    }

    /// Takes the lease's lock for one operation, waiting no later than the deadline (a renewal
    /// stuck in the network holds the lock until then), and checks it may act once it has it.
    pub(crate) async fn lock_to_act(&self, clock: &dyn Clock) -> Result<tokio::sync::MutexGuard<'_, Lease>> {
        self.ensure_may_act(clock)?;
        let mut lease = self.by_deadline(clock, async { Ok(self.lease.lock().await) }).await?;
        self.ensure_may_act(clock)?;
        // Under a session the session's renewals move the deadline, not the lease's own.
        lease.deadline_mono_ms = lease.deadline_mono_ms.max(self.deadline_mono_ms());
        Ok(lease)
    }

    /// Runs `operation`, or gives it up (dropping whatever request is in flight, sending no
    /// other) and fails with `Lost` once the local deadline has passed.
    pub(crate) async fn by_deadline<T>(
        &self,
        clock: &dyn Clock,
        operation: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        tokio::select! {
            biased;
            done = operation => done,
            () = self.deadline_passed(clock) => {
                self.cancel.cancel(CancelReason::Deadline);
                Err(self.lost())
            }
        }
    }

    /// Resolves once `clock` reaches the local deadline; a cover or renewal that lands
    /// meanwhile moves it.
    async fn deadline_passed(&self, clock: &dyn Clock) {
        loop {
            let (now, deadline) = (clock.monotonic_ms(), self.deadline_mono_ms());
            if now >= deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(deadline - now)).await;
        }
    }

    /// Cancels the token when `result` says the lease is lost.
    pub(crate) fn note<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(Error::Lost { .. }) = &result {
            self.cancel.cancel(CancelReason::Lost);
        }
        result
    }

    /// Extends the lease now, under rule 2.
    pub(crate) async fn renew(&self, store: &dyn LeaseStore) -> Result<()> {
        let mut lease = self.lock_to_act(store.clock()).await?;
        let result = self.by_deadline(store.clock(), store.renew(&mut lease)).await;
        if result.is_ok() {
            self.update(&lease);
        }
        drop(lease);
        self.note(result)
    }

    /// Records `seq` as processed, under the lease and only forward, under rule 2.
    pub(crate) async fn checkpoint(&self, store: &dyn LeaseStore, seq: u64) -> Result<()> {
        let mut lease = self.lock_to_act(store.clock()).await?;
        let result = self.by_deadline(store.clock(), store.checkpoint(&mut lease, seq)).await;
        if result.is_ok() {
            self.update(&lease);
        }
        drop(lease);
        self.note(result)
    }

    fn stopped_on_renewal(&self) {
        if self.cancel.cancel(CancelReason::Stopped) {
            info!(connection_id = %self.id, "stopped (seen on renewal)");
        }
    }

    /// The upkeep task: renews on the [`Keeper`]'s schedule (or, with [`Upkeep::Watch`], only
    /// watches the deadline, which covers and renewals by hand move) until the lease is lost or
    /// its deadline passes, then cancels the token and returns. A renewal that reports STOPPED
    /// cancels the token but keeps renewing, so the lease stays ours while the holder winds
    /// down; so does a holder cancelled for any reason that leaves the lease held (shutdown, a
    /// hand-over). `renewed` is told of each successful renewal and its latency in ms.
    pub(crate) async fn keep(&self, store: &dyn LeaseStore, upkeep: Upkeep, mut renewed: impl FnMut(u64)) {
        let (config, clock) = (store.config(), store.clock());
        let mut keeper = Keeper::new(&self.current(), upkeep, config);
        loop {
            keeper.cover(self.deadline_mono_ms());
            if self.cancel.is_gone() {
                return;
            }
            match keeper.poll(clock.monotonic_ms()) {
                Wake::Deadline => {
                    self.cancel.cancel(CancelReason::Deadline);
                    return;
                }
                Wake::SleepUntil(at) => {
                    let token = self.cancel.token();
                    if token.is_cancelled() {
                        sleep_until_mono(clock, at).await;
                    } else {
                        tokio::select! {
                            () = sleep_until_mono(clock, at) => {}
                            () = token.cancelled() => {}
                        }
                    }
                }
                Wake::Renew { until_mono_ms } => {
                    // Rule 2: nothing may run past the deadline, a renewal stuck in the network included.
                    let answer = tokio::select! {
                        answer = async {
                            let mut lease = self.lease.lock().await;
                            let started = clock.monotonic_ms();
                            let result = store.renew(&mut lease).await;
                            result.map(|()| (lease.clone(), clock.monotonic_ms().saturating_sub(started)))
                        } => answer,
                        () = sleep_until_mono(clock, until_mono_ms) => {
                            self.cancel.cancel(CancelReason::Deadline);
                            return;
                        }
                    };
                    let now = clock.monotonic_ms();
                    let stop = match &answer {
                        Ok((lease, latency)) => {
                            self.update(lease);
                            renewed(*latency);
                            keeper.renewed(Ok(Renewal::of(lease, config)), now, rand::random())
                        }
                        Err(e) => {
                            debug!(connection_id = %self.id, error = %e, "renewal failed");
                            keeper.renewed(Err(e), now, rand::random())
                        }
                    };
                    match stop {
                        // Wind down; the lease stays renewed until the holder has.
                        Some(CancelReason::Stopped) => self.stopped_on_renewal(),
                        Some(reason) => {
                            self.cancel.cancel(reason);
                            return;
                        }
                        None => {}
                    }
                }
            }
        }
    }
}

/// A held lease; see the module docs. Dropping it stops the background upkeep (the lease then
/// expires unless released).
pub struct Hold {
    store: Arc<dyn LeaseStore>,
    held: Arc<HeldLease>,
    upkeep: Upkeep,
    keeping: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("lease", &self.current())
            .field("upkeep", &self.upkeep)
            .field("cancel_reason", &self.cancel_reason())
            .finish()
    }
}

impl Hold {
    /// Claims `id` for `owner`; with `renew`, keeps renewing it in the background, else only
    /// its deadline is watched (needs a tokio runtime either way). The store's table is checked
    /// first, once per store object ([`LeaseStore::check_table`]).
    pub async fn acquire(store: Arc<dyn LeaseStore>, id: &str, owner: &str, renew: bool) -> Result<Self> {
        store.check_table().await?;
        let lease = store.acquire(id, owner).await?;
        let upkeep = if renew { Upkeep::Renew } else { Upkeep::Watch };
        Ok(Self::new(store, lease, upkeep))
    }

    /// Holds an already claimed `lease` with `upkeep` (needs a tokio runtime): a task renews it
    /// on schedule, or only watches its deadline, and fires the token when it passes.
    pub fn new(store: Arc<dyn LeaseStore>, lease: Lease, upkeep: Upkeep) -> Self {
        let held = Arc::new(HeldLease::new(lease));
        let keeping = tokio::spawn({
            let (store, held) = (store.clone(), held.clone());
            async move { held.keep(&*store, upkeep, |_| {}).await }
        });
        Self { store, held, upkeep, keeping }
    }

    /// The lease after the last successful operation.
    pub fn current(&self) -> Lease {
        self.held.current()
    }

    /// When the owner must stop acting, on the store clock's monotonic ms.
    pub fn deadline_mono_ms(&self) -> u64 {
        self.held.deadline_mono_ms()
    }

    /// How long the holder may still act, on the store clock: zero once past the deadline.
    pub fn time_left(&self) -> Duration {
        Duration::from_millis(self.deadline_mono_ms().saturating_sub(self.store.clock().monotonic_ms()))
    }

    /// Fires at the deadline, on a lost lease, on STOP (background renewal only) and on release.
    pub fn token(&self) -> &CancellationToken {
        self.held.cancel.token()
    }

    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.held.cancel.token().cancelled()
    }

    /// Why the token fired, once it has.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.held.cancel.reason()
    }

    /// Session mode: a lease claimed under a session acts until the session's deadline, which
    /// every session renewal moves later; this moves the lease's with it (never earlier).
    pub fn cover(&self, deadline_mono_ms: u64) {
        self.held.cover(deadline_mono_ms);
    }

    /// Fires the token without writing anything: the holder must stop acting (session mode: the
    /// session this lease was held under was lost or ended). Every later call is refused
    /// locally as `Lost`, except a release after `Released`.
    pub fn cancel(&self, reason: CancelReason) {
        self.held.cancel.cancel(reason);
    }

    /// Extends the lease now (the background schedule, if any, carries on from it). Neither the
    /// wait for a renewal in flight nor the request outlasts the deadline.
    pub async fn renew(&self) -> Result<()> {
        self.held.renew(&*self.store).await
    }

    /// Records `seq` as processed, under the lease and only forward, by the deadline.
    pub async fn checkpoint(&self, seq: u64) -> Result<()> {
        self.held.checkpoint(&*self.store, seq).await
    }

    /// Stops the upkeep and gives the lease up (conditional on owner and fence, so it never
    /// touches a lease someone else holds now; `Lost` then).
    pub async fn release(&self) -> Result<()> {
        self.keeping.abort();
        let lost = self.cancel_reason() == Some(CancelReason::Lost);
        self.held.cancel.cancel(CancelReason::Released);
        if lost {
            return Err(self.held.lost());
        }
        let lease = self.held.lease.lock().await;
        self.store.release(&lease).await
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.keeping.abort();
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
