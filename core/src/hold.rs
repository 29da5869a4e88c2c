//! One lease held outside a [`Worker`](crate::Worker): the handle behind a "hold this id while
//! this block runs" scope. Optionally renewed in the background on the lease model's schedule
//! (the same decisions as the worker's lease task); its token fires at the local deadline, on a
//! lost lease, when the work is STOPPED and once it is released.
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::worker::decide::{after_renewal, after_renewal_error, CancelReason, RenewStep};
use crate::{Error, Lease, LeaseStore, Result};

/// A held lease; see the module docs. Dropping it stops the background renewal (the lease then
/// expires unless released).
pub struct Hold {
    shared: Arc<Shared>,
    renewing: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("lease", &self.current())
            .field("renewing", &self.renewing.is_some())
            .field("cancel_reason", &self.cancel_reason())
            .finish()
    }
}

struct Shared {
    store: Arc<dyn LeaseStore>,
    /// Renewals, checkpoints and the release take turns on the lease.
    lease: tokio::sync::Mutex<Lease>,
    /// A copy of the lease after the last successful operation (readable without waiting).
    current: Mutex<Lease>,
    deadline_mono_ms: AtomicU64,
    token: CancellationToken,
    reason: OnceLock<CancelReason>,
}

impl Shared {
    fn cancel(&self, reason: CancelReason) {
        let _ = self.reason.set(reason);
        self.token.cancel();
    }

    fn update(&self, lease: &Lease) {
        self.deadline_mono_ms.fetch_max(lease.deadline_mono_ms, Ordering::SeqCst);
        *self.current.lock().expect("lease poisoned") = lease.clone();
    }

    fn now(&self) -> u64 {
        self.store.clock().monotonic_ms()
    }
}

impl Hold {
    /// Claims `id` for `owner`; with `renew`, keeps renewing it in the background (needs a
    /// tokio runtime).
    pub async fn acquire(store: Arc<dyn LeaseStore>, id: &str, owner: &str, renew: bool) -> Result<Self> {
        let lease = store.acquire(id, owner).await?;
        Ok(Self::new(store, lease, renew))
    }

    /// Holds an already claimed `lease`; with `renew`, renews it in the background.
    pub fn new(store: Arc<dyn LeaseStore>, lease: Lease, renew: bool) -> Self {
        let shared = Arc::new(Shared {
            store,
            deadline_mono_ms: AtomicU64::new(lease.deadline_mono_ms),
            current: Mutex::new(lease.clone()),
            lease: tokio::sync::Mutex::new(lease),
            token: CancellationToken::new(),
            reason: OnceLock::new(),
        });
        let renewing = renew.then(|| tokio::spawn(renew_until_lost(shared.clone())));
        Self { shared, renewing }
    }

    /// The lease after the last successful operation.
    pub fn current(&self) -> Lease {
        self.shared.current.lock().expect("lease poisoned").clone()
    }

    /// When the owner must stop acting, on the store clock's monotonic ms.
    pub fn deadline_mono_ms(&self) -> u64 {
        self.shared.deadline_mono_ms.load(Ordering::SeqCst)
    }

    /// Fires at the deadline, on a lost lease, on STOP (background renewal only) and on release.
    pub fn token(&self) -> &CancellationToken {
        &self.shared.token
    }

    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.shared.token.cancelled()
    }

    /// Why the token fired, once it has.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.shared.reason.get().copied()
    }

    /// Session mode: a lease claimed under a session acts until the session's deadline, which
    /// every session renewal moves later; this moves the lease's with it (never earlier).
    pub fn cover(&self, deadline_mono_ms: u64) {
        self.shared.deadline_mono_ms.fetch_max(deadline_mono_ms, Ordering::SeqCst);
    }

    /// Fires the token without writing anything: the holder must stop acting (session mode: the
    /// session this lease was held under was lost or ended). Every later call is refused
    /// locally as `Lost`, except a release after `Released`.
    pub fn cancel(&self, reason: CancelReason) {
        self.shared.cancel(reason);
    }

    /// Extends the lease now (the background schedule, if any, carries on from it).
    pub async fn renew(&self) -> Result<()> {
        self.ensure_may_act()?;
        let mut lease = self.lock_covered().await;
        let result = self.shared.store.renew(&mut lease).await;
        if result.is_ok() {
            self.shared.update(&lease);
        }
        self.note(result)
    }

    /// Records `seq` as processed, under the lease and only forward.
    pub async fn checkpoint(&self, seq: u64) -> Result<()> {
        self.ensure_may_act()?;
        let mut lease = self.lock_covered().await;
        let result = self.shared.store.checkpoint(&mut lease, seq).await;
        if result.is_ok() {
            self.shared.update(&lease);
        }
        self.note(result)
    }

    /// Stops the renewal and gives the lease up (conditional on owner and fence, so it never
    /// touches a lease someone else holds now; `Lost` then).
    pub async fn release(&self) -> Result<()> {
        if let Some(task) = &self.renewing {
            task.abort();
        }
        let lost = self.cancel_reason() == Some(CancelReason::Lost);
        self.shared.cancel(CancelReason::Released);
        if lost {
            return Err(Error::Lost { id: self.current().id });
        }
        let lease = self.shared.lease.lock().await;
        self.shared.store.release(&lease).await
    }

    /// The lease, its deadline moved to the latest [`Hold::cover`].
    async fn lock_covered(&self) -> tokio::sync::MutexGuard<'_, Lease> {
        let mut lease = self.shared.lease.lock().await;
        lease.deadline_mono_ms = lease.deadline_mono_ms.max(self.deadline_mono_ms());
        lease
    }

    /// Refuses to act once the lease is lost, past its deadline or given up.
    fn ensure_may_act(&self) -> Result<()> {
        let gone =
            matches!(self.cancel_reason(), Some(CancelReason::Lost | CancelReason::Deadline | CancelReason::Released))
                || self.shared.now() >= self.deadline_mono_ms();
        if gone {
            return Err(Error::Lost { id: self.current().id });
        }
        Ok(())
    }

    fn note<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(Error::Lost { .. }) = &result {
            self.shared.cancel(CancelReason::Lost);
        }
        result
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(task) = &self.renewing {
            task.abort();
        }
    }
}

async fn sleep_until_mono(shared: &Shared, at_mono_ms: u64) {
    let now = shared.now();
    if at_mono_ms > now {
        tokio::time::sleep(Duration::from_millis(at_mono_ms - now)).await;
    }
}

/// Renews on schedule until the lease is lost or its deadline passes; STOPPED cancels the token
/// but keeps renewing, so the lease stays ours while the holder winds down.
async fn renew_until_lost(shared: Arc<Shared>) {
    let config = shared.store.config();
    let mut next = shared.lease.lock().await.next_renew_mono_ms(config);
    let mut attempt = 0;
    loop {
        let deadline = shared.deadline_mono_ms.load(Ordering::SeqCst);
        sleep_until_mono(&shared, next.min(deadline)).await;
        let now = shared.now();
        if now >= deadline {
            shared.cancel(CancelReason::Deadline);
            return;
        }
        if now < next {
            continue;
        }
        // Rule 2: nothing may run past the deadline, a renewal stuck in the network included.
        let renewed = tokio::select! {
            renewed = async {
                let mut lease = shared.lease.lock().await;
                shared.store.renew(&mut lease).await.map(|()| lease.clone())
            } => renewed,
            () = sleep_until_mono(&shared, deadline) => {
                shared.cancel(CancelReason::Deadline);
                return;
            }
        };
        let step = match &renewed {
            Ok(lease) => {
                shared.update(lease);
                attempt = 0;
                after_renewal(lease, config)
            }
            Err(e) => {
                let step = after_renewal_error(e, attempt, shared.now(), deadline, config, rand::random());
                attempt += 1;
                step
            }
        };
        match step {
            RenewStep::RenewAt(at) | RenewStep::RetryAt(at) => next = at,
            RenewStep::StoppedRenewAt(at) => {
                shared.cancel(CancelReason::Stopped);
                next = at;
            }
            RenewStep::Lost => {
                shared.cancel(CancelReason::Lost);
                return;
            }
            RenewStep::Deadline => next = shared.deadline_mono_ms.load(Ordering::SeqCst),
        }
    }
}
