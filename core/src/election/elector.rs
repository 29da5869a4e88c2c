//! The elector: claim (with an optional wait), hold while the action runs (renewing in the
//! background), cancel at the local deadline, keep the minimum lease, release.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::decide::{self, MinLease};
use super::{slot_of, Candidate, ElectionBackend, ElectionOptions, Strategy, Timing};
use crate::config::validate_id;
use crate::keeper::{Keeper, Renewal, Upkeep, Wake};
use crate::{Error, Lease, Result};

/// Why a term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TermEnd {
    /// The action returned while the lease was held.
    Finished,
    /// The lease was lost or its local deadline passed; the action was cancelled.
    Lost,
    /// A strategic leader stepped down at a term boundary for a better candidate.
    SteppedDown,
}

/// What a `run_if_*` call did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// This process was elected and ran the action.
    Led { fence: u64, value: T, end: TermEnd },
    /// Someone else held the lease (or the strategy picked someone else) for the whole wait.
    Skipped { holder: Option<String> },
}

impl<T> Outcome<T> {
    pub fn is_skipped(&self) -> bool {
        matches!(self, Outcome::Skipped { .. })
    }
}

/// What an elected action is handed: the fence and the cancellation of its term.
#[derive(Clone)]
pub struct Term {
    lease: Lease,
    cancel: CancellationToken,
    deadline_mono_ms: Arc<AtomicU64>,
    backend: Arc<dyn ElectionBackend>,
}

impl std::fmt::Debug for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Term").field("lease", &self.lease).field("cancelled", &self.is_cancelled()).finish()
    }
}

impl Term {
    /// The claim's fencing token: strictly greater than every earlier holder's of this lease.
    pub fn fence(&self) -> u64 {
        self.lease.fence
    }

    /// The lease as claimed (id, owner, fence), for fenced writes.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The slot held, for group elections.
    pub fn slot(&self) -> Option<u32> {
        slot_of(&self.lease.id)
    }

    /// The local deadline, on the backend clock's monotonic milliseconds.
    pub fn deadline_mono_ms(&self) -> u64 {
        self.deadline_mono_ms.load(Ordering::SeqCst)
    }

    /// True once the term is over: cancelled, or past the local deadline (checked on the clock
    /// itself, so a process resumed after a pause sees it before any timer has run).
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled() || self.backend.clock().monotonic_ms() >= self.deadline_mono_ms()
    }

    /// Resolves when the term is over.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// A token cancelled with the term (for code that takes a `CancellationToken`).
    pub fn token(&self) -> CancellationToken {
        self.cancel.child_token()
    }
}

/// Runs actions only while this process holds an election lease.
#[derive(Clone)]
pub struct LeaderElector {
    backend: Arc<dyn ElectionBackend>,
    owner: String,
    options: ElectionOptions,
}

/// A strategic leader's recheck at every term boundary.
struct StepDown<'a> {
    election: &'a str,
    strategy: &'a Strategy,
    term_ms: u64,
}

/// What a claim attempt within the wait ended in.
enum Claimed {
    Lease { lease: Lease, sent_mono: u64 },
    Skipped(Option<String>),
}

impl LeaderElector {
    /// An elector claiming as `owner` (unique per process: a host name plus a pid, for example).
    pub fn new(backend: Arc<dyn ElectionBackend>, owner: impl Into<String>, options: ElectionOptions) -> Result<Self> {
        let owner = owner.into();
        options.validate(&owner)?;
        Ok(Self { backend, owner, options })
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub fn options(&self) -> &ElectionOptions {
        &self.options
    }

    pub fn backend(&self) -> &Arc<dyn ElectionBackend> {
        &self.backend
    }

    /// The key of the leader lease of `name`.
    pub fn leader_key(&self, name: &str) -> String {
        decide::leader_key(&self.options.key_prefix, name)
    }

    /// The key of the group `name` (its slots are `{key}#slot-{i}`).
    pub fn group_key(&self, name: &str) -> String {
        decide::group_key(&self.options.key_prefix, name)
    }

    /// The registry key of the candidates of `name`.
    pub fn candidates_key(&self, name: &str) -> String {
        decide::candidates_key(&self.options.key_prefix, name)
    }

    /// Runs `action` only if this process becomes the leader of `name` within the wait.
    pub async fn run_if_leader<F, Fut, T>(&self, name: &str, action: F) -> Result<Outcome<T>>
    where
        F: FnOnce(Term) -> Fut,
        Fut: Future<Output = T>,
    {
        validate_id("name", name)?;
        self.backend.check().await?;
        let key = self.leader_key(name);
        match self.claim_within(|| self.backend.claim(&key, &self.owner), self.options.wait).await? {
            Claimed::Skipped(holder) => Ok(Outcome::Skipped { holder }),
            Claimed::Lease { lease, sent_mono } => self.hold(lease, sent_mono, action, None).await,
        }
    }

    /// Runs `action` only if this process gets one of the `slots` slots of the group `name`.
    pub async fn run_if_slot<F, Fut, T>(&self, name: &str, slots: u32, action: F) -> Result<Outcome<T>>
    where
        F: FnOnce(Term) -> Fut,
        Fut: Future<Output = T>,
    {
        validate_id("name", name)?;
        super::validate_slots(slots)?;
        self.backend.check().await?;
        let key = self.group_key(name);
        match self.claim_within(|| self.backend.claim_slot(&key, slots, &self.owner), self.options.wait).await? {
            Claimed::Skipped(holder) => Ok(Outcome::Skipped { holder }),
            Claimed::Lease { lease, sent_mono } => self.hold(lease, sent_mono, action, None).await,
        }
    }

    /// Strategic election: registers `candidate` (its id is this elector's owner) for as long as
    /// the call runs; only when `strategy` picks this candidate does it compete for the leader
    /// lease of `name`. A leader asks the strategy again at every term boundary and steps down
    /// (its action is cancelled, the lease released) when a better candidate has appeared.
    pub async fn run_if_elected<F, Fut, T>(
        &self,
        name: &str,
        candidate: Candidate,
        strategy: &Strategy,
        action: F,
    ) -> Result<Outcome<T>>
    where
        F: FnOnce(Term) -> Fut,
        Fut: Future<Output = T>,
    {
        validate_id("name", name)?;
        strategy.validate()?;
        let candidate = Candidate { id: self.owner.clone(), ..candidate };
        candidate.validate()?;
        self.backend.check().await?;
        let timing = self.backend.timing();
        let election = self.candidates_key(name);
        let ttl = self.options.candidate_ttl.unwrap_or(timing.lease);
        self.backend.register(&election, &candidate, ttl).await?;
        let heartbeat = async {
            loop {
                tokio::time::sleep(ttl / 3).await;
                if let Err(e) = self.backend.register(&election, &candidate, ttl).await {
                    warn!(election = %election, error = %e, "candidate refresh failed");
                }
            }
        };
        let elect = self.elect(name, &election, strategy, &timing, action);
        let result = tokio::select! {
            r = elect => r,
            _ = heartbeat => unreachable!("the heartbeat never ends"),
        };
        if let Err(e) = self.backend.withdraw(&election, &self.owner).await {
            warn!(election = %election, error = %e, "candidate withdrawal failed");
        }
        result
    }

    async fn elect<F, Fut, T>(
        &self,
        name: &str,
        election: &str,
        strategy: &Strategy,
        timing: &Timing,
        action: F,
    ) -> Result<Outcome<T>>
    where
        F: FnOnce(Term) -> Fut,
        Fut: Future<Output = T>,
    {
        let key = self.leader_key(name);
        let clock = self.backend.clock();
        let wait_until = clock.monotonic_ms() + self.options.wait.as_millis() as u64;
        loop {
            let candidates = self.backend.candidates(election).await?;
            let pick = strategy.pick(&candidates).map(str::to_string);
            if decide::competes(strategy, &candidates, &self.owner) {
                match self.claim_within(|| self.backend.claim(&key, &self.owner), Duration::ZERO).await? {
                    Claimed::Lease { lease, sent_mono } => {
                        let term_ms = self.options.term.unwrap_or(timing.lease).as_millis() as u64;
                        let step_down = StepDown { election, strategy, term_ms };
                        return self.hold(lease, sent_mono, action, Some(step_down)).await;
                    }
                    Claimed::Skipped(_) => {}
                }
            }
            let delay = self.retry_pause();
            if !decide::retry_within_wait(clock.monotonic_ms(), delay, wait_until) {
                return Ok(Outcome::Skipped { holder: pick });
            }
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
    }

    /// A jittered pause between half the retry delay and all of it, in ms.
    fn retry_pause(&self) -> u64 {
        decide::retry_pause_ms(self.options.retry_delay.as_millis() as u64, rand::random::<f64>())
    }

    async fn claim_within<Fut>(&self, claim: impl Fn() -> Fut, wait: Duration) -> Result<Claimed>
    where
        Fut: Future<Output = Result<Lease>>,
    {
        let clock = self.backend.clock();
        let wait_until = clock.monotonic_ms() + wait.as_millis() as u64;
        loop {
            let sent_mono = clock.monotonic_ms();
            match claim().await {
                Ok(lease) => return Ok(Claimed::Lease { lease, sent_mono }),
                Err(Error::Held { owner, .. }) => {
                    let delay = self.retry_pause();
                    if !decide::retry_within_wait(clock.monotonic_ms(), delay, wait_until) {
                        return Ok(Claimed::Skipped(Some(owner)));
                    }
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Runs the action under `lease`, renewing it; ends the term at the deadline, on a lost
    /// renewal or (strategic) at a term boundary; then keeps the minimum lease or releases.
    async fn hold<F, Fut, T>(
        &self,
        lease: Lease,
        sent_mono: u64,
        action: F,
        step_down: Option<StepDown<'_>>,
    ) -> Result<Outcome<T>>
    where
        F: FnOnce(Term) -> Fut,
        Fut: Future<Output = T>,
    {
        let fence = lease.fence;
        debug!(key = %lease.id, fence, owner = %self.owner, "elected");
        let term = Term {
            lease: lease.clone(),
            cancel: CancellationToken::new(),
            deadline_mono_ms: Arc::new(AtomicU64::new(lease.deadline_mono_ms)),
            backend: self.backend.clone(),
        };
        let timing = self.backend.timing();
        let claim_store_ms = decide::claim_store_ms(lease.expires_at_ms, &timing);
        let (tx, mut rx) = watch::channel(lease);
        let keeper = self.keep(&tx, &term, sent_mono, step_down.as_ref());
        tokio::pin!(keeper);
        // The minimum lease counts from the action's start (the claim's answer is in), so two
        // runs are never closer than it whatever the claim's latency.
        let started_mono = self.backend.clock().monotonic_ms();
        let started = (started_mono, claim_store_ms + started_mono.saturating_sub(sent_mono));
        let work = action(term.clone());
        tokio::pin!(work);
        let (value, ended) = tokio::select! {
            v = &mut work => (v, None),
            end = &mut keeper => {
                term.cancel.cancel();
                (work.await, Some(end))
            }
        };
        let end = match ended {
            Some(end) => end,
            None => {
                // The minimum lease: keep renewing until the stored expiry covers it (then leave
                // the lease to run out) or until it has passed (then release).
                let min_ms = self.options.min_lease.as_millis() as u64;
                let clock = self.backend.clock();
                let (started_mono, started_store_ms) = started;
                let kept = async {
                    loop {
                        let held = rx.borrow_and_update().clone();
                        let now = clock.monotonic_ms();
                        let until =
                            match decide::min_lease(started_mono, min_ms, now, held.expires_at_ms, started_store_ms) {
                                MinLease::Release => return true,
                                MinLease::RunOut => return false,
                                MinLease::WaitUntil(at) => at,
                            };
                        let left = until.saturating_sub(now);
                        tokio::select! {
                            _ = rx.changed() => {}
                            _ = tokio::time::sleep(Duration::from_millis(left)) => {}
                        }
                    }
                };
                let outcome = tokio::select! {
                    elapsed = kept => Ok(elapsed),
                    end = &mut keeper => Err(end),
                };
                let held = tx.borrow().clone();
                match outcome {
                    Ok(true) => self.release(&held).await,
                    Ok(false) => debug!(fence, "kept to the minimum lease"),
                    Err(end) => {
                        term.cancel.cancel();
                        return Ok(Outcome::Led { fence, value, end });
                    }
                }
                TermEnd::Finished
            }
        };
        term.cancel.cancel();
        if end == TermEnd::SteppedDown {
            let held = tx.borrow().clone();
            self.release(&held).await;
        }
        Ok(Outcome::Led { fence, value, end })
    }

    async fn release(&self, lease: &Lease) {
        match self.backend.release(lease).await {
            Ok(()) => debug!(key = %lease.id, fence = lease.fence, "released"),
            Err(e) => warn!(key = %lease.id, fence = lease.fence, error = %e, "release failed; the lease runs out"),
        }
    }

    /// Renews the lease until the term ends; returns why it ended. Never ends on its own
    /// otherwise (it is dropped when the action is done). The schedule, the retry policy and
    /// rule 2 are the [`Keeper`]'s, as for every held lease.
    async fn keep(
        &self,
        tx: &watch::Sender<Lease>,
        term: &Term,
        sent_mono: u64,
        step_down: Option<&StepDown<'_>>,
    ) -> TermEnd {
        let clock = self.backend.clock();
        let timing = self.backend.timing();
        let claim = Renewal {
            deadline_mono_ms: tx.borrow().deadline_mono_ms,
            next_renew_mono_ms: sent_mono + timing.renew_ms(),
            stopped: false,
        };
        let mut keeper = Keeper::from_claim(claim, Upkeep::Renew, timing.renew_ms());
        let mut next_term = step_down.map(|s| sent_mono + s.term_ms);
        loop {
            let now = clock.monotonic_ms();
            match keeper.poll(now) {
                Wake::Deadline => return TermEnd::Lost,
                Wake::SleepUntil(at) => {
                    let wake = at.min(next_term.unwrap_or(u64::MAX));
                    tokio::time::sleep(Duration::from_millis(wake.saturating_sub(now))).await;
                    let now = clock.monotonic_ms();
                    if !keeper.may_act(now) {
                        return TermEnd::Lost;
                    }
                    if let (Some(at), Some(s)) = (next_term, step_down) {
                        if now >= at {
                            match self.backend.candidates(s.election).await {
                                Ok(c) if decide::steps_down(s.strategy, &c, &self.owner) => {
                                    debug!(election = %s.election, "a better candidate: stepping down at the term boundary");
                                    return TermEnd::SteppedDown;
                                }
                                Ok(_) => {}
                                Err(e) => {
                                    warn!(election = %s.election, error = %e, "candidate list failed; staying on")
                                }
                            }
                            next_term = Some(at + s.term_ms);
                        }
                    }
                }
                Wake::Renew { until_mono_ms } => {
                    let mut lease = tx.borrow().clone();
                    // Rule 2: the renewal is given up at the deadline.
                    let budget = Duration::from_millis(until_mono_ms.saturating_sub(now));
                    let answer = match tokio::time::timeout(budget, self.backend.renew(&mut lease)).await {
                        Ok(answer) => answer,
                        Err(_) => return TermEnd::Lost,
                    };
                    let now = clock.monotonic_ms();
                    let stop = match &answer {
                        Ok(()) => {
                            let renewal = Renewal {
                                deadline_mono_ms: lease.deadline_mono_ms,
                                next_renew_mono_ms: decide::next_renew_after_success(lease.deadline_mono_ms, &timing),
                                stopped: false,
                            };
                            term.deadline_mono_ms.store(lease.deadline_mono_ms, Ordering::SeqCst);
                            tx.send_replace(lease);
                            keeper.renewed(Ok(renewal), now, rand::random())
                        }
                        Err(e) => {
                            warn!(error = %e, "renewal failed; retrying until the deadline");
                            keeper.renewed(Err(e), now, rand::random())
                        }
                    };
                    if stop.is_some() {
                        return TermEnd::Lost;
                    }
                }
            }
        }
    }
}
