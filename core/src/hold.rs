//! One lease held outside a [`Worker`](crate::Worker): the handle behind a "hold this id while
//! this block runs" scope, and the held-lease state every holder shares with its upkeep task
//! (a worker's connections use it too). Its upkeep task drives the lease's
//! [`Holder`] (renewed in the background, watched, or covered by the
//! session it was claimed under); its token fires at the local deadline, on a lost lease, when
//! the work is STOPPED, when its session is lost or ended and once it is released.
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

use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tracing::{debug, info};

use crate::engine::decide::CancelReason;
use crate::holder::{Holder, Input, Mode, Output, Setup};
use crate::keeper::Upkeep;
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
}

/// A [`Holder`] and the renewal it asked for, shared by a [`Hold`] and its upkeep task.
#[derive(Debug)]
struct Holding {
    machine: Mutex<Machine>,
    /// Wakes the upkeep task when the holder is told something (a cover, a cancellation).
    wake: Notify,
}

#[derive(Debug)]
struct Machine {
    holder: Holder,
    /// The renewal the holder asked for and the task has not sent yet, with its give-up time.
    renew: Option<(u64, u64)>,
}

impl Holding {
    fn new(setup: Setup, lease: &Lease, now_mono_ms: u64) -> Self {
        let holder = Holder::new(setup, lease, rand::random(), now_mono_ms);
        Self { machine: Mutex::new(Machine { holder, renew: None }), wake: Notify::new() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Machine> {
        self.machine.lock().expect("holder poisoned")
    }

    /// Tells the holder `input` (`None`: only the time) at `now_mono_ms` and does what it says
    /// to `held` at once; a renewal it asks for is left for the upkeep task.
    fn handle(&self, held: &HeldLease, input: Option<Input>, now_mono_ms: u64) {
        let mut m = self.lock();
        match input {
            Some(input) => m.holder.handle(input, now_mono_ms),
            None => m.holder.handle_timeout(now_mono_ms),
        }
        while let Some(output) = m.holder.poll_output() {
            match output {
                Output::Renew { id, until_mono_ms } => m.renew = Some((id, until_mono_ms)),
                Output::Covered { deadline_mono_ms } => held.cover(deadline_mono_ms),
                Output::Cancel { reason } => {
                    if held.cancel.cancel(reason) && reason == CancelReason::Stopped {
                        info!(connection_id = %held.id, "stopped (seen on renewal)");
                    }
                }
                Output::Over => m.renew = None,
            }
        }
    }

    /// [`Holding::handle`] from the holder's side: the upkeep task is woken to see it.
    fn tell(&self, held: &HeldLease, input: Input, now_mono_ms: u64) {
        self.handle(held, Some(input), now_mono_ms);
        self.wake.notify_one();
    }
}

/// The upkeep task: drives the [`Holder`] of `held` (renewing on its schedule, or with
/// [`Mode::Watch`] and [`Mode::Session`] only watching the deadline, which covers and renewals
/// by hand move) until it is over (lost, past the deadline or given up). A renewal that reports
/// STOPPED cancels the token but keeps renewing, so the lease stays ours while the holder winds
/// down; so does a holder cancelled for any reason that leaves the lease held (shutdown, a
/// hand-over).
async fn keep(store: &dyn LeaseStore, held: &HeldLease, holding: &Holding) {
    let clock = store.clock();
    loop {
        // What the holder's own calls did meanwhile (a renewal or checkpoint by hand moved the
        // deadline, one past the deadline or refused cancelled the token), then the time.
        if let Some(reason) = held.cancel.reason().filter(|_| held.cancel.is_gone()) {
            holding.handle(held, Some(Input::Cancel { reason }), clock.monotonic_ms());
        }
        holding.handle(held, Some(Input::Cover { deadline_mono_ms: held.deadline_mono_ms() }), clock.monotonic_ms());
        let (renew, timeout) = {
            let mut m = holding.lock();
            if m.holder.is_over() {
                return;
            }
            (m.renew.take(), m.holder.poll_timeout())
        };
        if let Some((id, until_mono_ms)) = renew {
            // Rule 2: nothing may run past the deadline, a renewal stuck in the network included.
            let answer = tokio::select! {
                answer = async {
                    let mut lease = held.lease.lock().await;
                    store.renew(&mut lease).await.map(|()| lease.clone())
                } => Some(answer),
                () = sleep_until_mono(clock, until_mono_ms) => None,
            };
            // Given up at the deadline, it reports nothing: the holder's own time decides.
            if let Some(result) = answer {
                match &result {
                    Ok(lease) => held.update(lease),
                    Err(e) => debug!(connection_id = %held.id, error = %e, "renewal failed"),
                }
                holding.handle(held, Some(Input::Answer { id, result }), clock.monotonic_ms());
            }
            continue;
        }
        let Some(at) = timeout else { return };
        let token = held.cancel.token();
        tokio::select! {
            () = sleep_until_mono(clock, at) => {}
            () = holding.wake.notified() => {}
            () = token.cancelled(), if !token.is_cancelled() => {}
        }
    }
}

/// A held lease; see the module docs. Dropping it stops the background upkeep (the lease then
/// expires unless released).
pub struct Hold {
    store: Arc<dyn LeaseStore>,
    held: Arc<HeldLease>,
    holding: Arc<Holding>,
    mode: Mode,
    keeping: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("lease", &self.current())
            .field("mode", &self.mode)
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
        let mode = match upkeep {
            Upkeep::Renew => Mode::Renew,
            Upkeep::Watch => Mode::Watch,
        };
        Self::with_mode(store, lease, mode)
    }

    /// Holds `lease`, just claimed under a session (needs a tokio runtime): it acts until the
    /// session's deadline, which [`Hold::cover`] moves on every session renewal, and stops at once
    /// when the session is lost ([`Hold::session_lost`]) or ended ([`Hold::session_ended`]).
    pub fn in_session(store: Arc<dyn LeaseStore>, lease: Lease) -> Self {
        Self::with_mode(store, lease, Mode::Session)
    }

    fn with_mode(store: Arc<dyn LeaseStore>, lease: Lease, mode: Mode) -> Self {
        let setup = Setup::of(store.config(), mode);
        let holding = Arc::new(Holding::new(setup, &lease, store.clock().monotonic_ms()));
        let held = Arc::new(HeldLease::new(lease));
        let keeping = tokio::spawn({
            let (store, held, holding) = (store.clone(), held.clone(), holding.clone());
            async move { keep(&*store, &held, &holding).await }
        });
        Self { store, held, holding, mode, keeping }
    }

    /// Rule 2: whether the holder may act now (before the deadline, the lease neither lost nor
    /// given up).
    pub fn may_act(&self) -> bool {
        let now = self.store.clock().monotonic_ms();
        !self.held.cancel.is_gone() && self.holding.lock().holder.may_act(now)
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
        self.tell(Input::Cover { deadline_mono_ms });
    }

    /// Session mode: the session this lease is held under was lost; the token fires (`Lost`)
    /// and the holder may not act any more.
    pub fn session_lost(&self) {
        self.tell(Input::SessionLost);
    }

    /// Session mode: the session this lease is held under was ended; the token fires
    /// (`Released`) and the holder may not act any more.
    pub fn session_ended(&self) {
        self.tell(Input::SessionEnded);
    }

    fn tell(&self, input: Input) {
        self.holding.tell(&self.held, input, self.store.clock().monotonic_ms());
    }

    /// Fires the token without writing anything: the holder must stop acting (session mode: the
    /// session this lease was held under was lost or ended). Every later call is refused
    /// locally as `Lost`, except a release after `Released`.
    pub fn cancel(&self, reason: CancelReason) {
        self.held.cancel.cancel(reason);
        self.tell(Input::Cancel { reason });
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
        self.cancel(CancelReason::Released);
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

    #[tokio::test]
    async fn a_session_lease_stops_at_once_when_its_session_is_lost_or_ended() {
        use crate::{ManualClock, MemoryStore, TableConfig};
        let clock = Arc::new(ManualClock::new(1_000));
        let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new(TableConfig::default(), clock.clone()).unwrap());
        for (id, lost, reason) in [("s1", true, CancelReason::Lost), ("s2", false, CancelReason::Released)] {
            let hold = Hold::in_session(store.clone(), store.acquire(id, "a").await.unwrap());
            let covered = hold.deadline_mono_ms() + 5_000;
            hold.cover(covered);
            assert_eq!((hold.deadline_mono_ms(), hold.may_act()), (covered, true));
            if lost {
                hold.session_lost();
            } else {
                hold.session_ended();
            }
            assert_eq!((hold.cancel_reason(), hold.may_act()), (Some(reason), false));
            assert!(hold.token().is_cancelled());
            assert!(matches!(hold.checkpoint(1).await, Err(Error::Lost { .. })));
        }
        // A lease not held under a session is not a session's to stop.
        let watched = Hold::new(store.clone(), store.acquire("s3", "a").await.unwrap(), Upkeep::Watch);
        watched.session_lost();
        assert_eq!((watched.cancel_reason(), watched.may_act()), (None, true));
        clock.advance(watched.time_left().as_millis() as u64);
        assert!(!watched.may_act(), "past the deadline");
    }

    /// The store's clock is a manual one and tokio's time is paused: the upkeep task wakes when
    /// tokio's time reaches what it waits for, and the outcome is the manual clock's.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_by_hand_moves_the_deadline_the_upkeep_task_waits_for() {
        use crate::{ManualClock, MemoryStore, TableConfig};
        let clock = Arc::new(ManualClock::new(0));
        let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new(TableConfig::default(), clock.clone()).unwrap());
        let hold = Hold::new(store.clone(), store.acquire("w", "a").await.unwrap(), Upkeep::Watch);
        let first = hold.deadline_mono_ms();
        clock.advance(first / 2);
        hold.renew().await.unwrap();
        let renewed = hold.deadline_mono_ms();
        assert!(renewed > first);
        // Past the first deadline: the task wakes for it, sees the renewal and keeps waiting.
        clock.advance(first - first / 2);
        tokio::time::sleep(Duration::from_millis(first + 1)).await;
        assert_eq!((hold.cancel_reason(), hold.may_act()), (None, true));
        // At the renewed one it cancels.
        clock.advance(renewed - first);
        tokio::time::sleep(Duration::from_millis(renewed - first + 1)).await;
        assert_eq!((hold.cancel_reason(), hold.may_act()), (Some(CancelReason::Deadline), false));
    }
}
