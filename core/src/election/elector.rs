//! The tokio elector: a driver of the election machine ([`super::machine::Elector`]), which
//! decides every claim attempt, retry pause, heartbeat, renewal, term boundary, minimum lease and
//! release. This sends the requests it asks for to the backend, wakes it at its timeouts, runs
//! the action it elects and cancels the action's [`Term`] when it says so.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::machine::{Elector, Ended, Input, Output, Race, Reply, Request, Setup};
use super::{rules, slot_of, Candidate, ElectionBackend, ElectionOptions, Strategy, TermEnd};
use crate::config::validate_id;
use crate::{Error, Lease, Result};

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

    /// How long the term may still act, on the backend clock: zero once past the deadline.
    pub fn time_left(&self) -> Duration {
        Duration::from_millis(self.deadline_mono_ms().saturating_sub(self.backend.clock().monotonic_ms()))
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

/// A request in flight: its id and its answer (`None`: given up at its deadline).
type Pending<'a> = Pin<Box<dyn Future<Output = (u64, Option<Result<Reply>>)> + Send + 'a>>;

/// What a strategic call registers, and where.
struct Registration<'a> {
    election: &'a str,
    candidate: &'a Candidate,
    ttl: Duration,
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
        rules::leader_key(&self.options.key_prefix, name)
    }

    /// The key of the group `name` (its slots are `{key}#slot-{i}`).
    pub fn group_key(&self, name: &str) -> String {
        rules::group_key(&self.options.key_prefix, name)
    }

    /// The registry key of the candidates of `name`.
    pub fn candidates_key(&self, name: &str) -> String {
        rules::candidates_key(&self.options.key_prefix, name)
    }

    /// Runs `action` only if this process becomes the leader of `name` within the wait.
    pub async fn run_if_leader<F, Fut, T>(&self, name: &str, action: F) -> Result<Outcome<T>>
    where
        F: FnOnce(Term) -> Fut,
        Fut: Future<Output = T>,
    {
        validate_id("name", name)?;
        self.backend.check().await?;
        self.drive(Race::Leader { key: self.leader_key(name) }, None, action).await
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
        self.drive(Race::Slot { key: self.group_key(name), slots }, None, action).await
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
        let race = Race::Elected {
            key: self.leader_key(name),
            strategy: strategy.clone(),
            term_ms: self.options.term.unwrap_or(timing.lease).as_millis() as u64,
            heartbeat_ms: (ttl / 3).as_millis() as u64,
        };
        let registration = Registration { election: &election, candidate: &candidate, ttl };
        self.drive(race, Some(registration), action).await
    }

    /// Runs one call's [`Elector`] machine: sends its requests (each concurrently, given up at
    /// its deadline), wakes it at its timeouts, runs the action it elects and cancels the term
    /// when it says so.
    async fn drive<F, Fut, T>(
        &self,
        race: Race,
        registration: Option<Registration<'_>>,
        action: F,
    ) -> Result<Outcome<T>>
    where
        F: FnOnce(Term) -> Fut,
        Fut: Future<Output = T>,
    {
        let clock = self.backend.clock();
        let timing = self.backend.timing();
        let setup = Setup {
            owner: self.owner.clone(),
            race,
            lease_ms: timing.lease_ms(),
            renew_ms: timing.renew_ms(),
            skew_ms: timing.skew_ms(),
            wait_ms: self.options.wait.as_millis() as u64,
            retry_delay_ms: self.options.retry_delay.as_millis() as u64,
            min_lease_ms: self.options.min_lease.as_millis() as u64,
        };
        let mut machine = Elector::new(setup, rand::random(), clock.monotonic_ms());
        let mut pending: FuturesUnordered<Pending<'_>> = FuturesUnordered::new();
        let mut action = Some(action);
        let mut work: Option<Pin<Box<Fut>>> = None;
        let mut term: Option<Term> = None;
        let mut value: Option<T> = None;
        loop {
            while let Some(output) = machine.poll_output() {
                match output {
                    Output::Send { id, request, until_mono_ms } => {
                        let budget =
                            until_mono_ms.map(|at| Duration::from_millis(at.saturating_sub(clock.monotonic_ms())));
                        pending.push(self.send(id, request, budget, registration.as_ref()));
                    }
                    Output::Elected { lease } => {
                        debug!(key = %lease.id, fence = lease.fence, owner = %self.owner, "elected");
                        let t = Term {
                            deadline_mono_ms: Arc::new(AtomicU64::new(lease.deadline_mono_ms)),
                            lease,
                            cancel: CancellationToken::new(),
                            backend: self.backend.clone(),
                        };
                        if let Some(action) = action.take() {
                            work = Some(Box::pin(action(t.clone())));
                        }
                        term = Some(t);
                    }
                    Output::Renewed { lease } => {
                        if let Some(t) = &term {
                            t.deadline_mono_ms.store(lease.deadline_mono_ms, Ordering::SeqCst);
                        }
                    }
                    Output::TermOver { reason } => {
                        debug!(?reason, "the term is over");
                        if let Some(t) = &term {
                            t.cancel.cancel();
                        }
                    }
                    Output::Done { ended } => {
                        if let Some(t) = &term {
                            t.cancel.cancel();
                        }
                        return match ended {
                            Ended::Led { fence, end } => match value.take() {
                                Some(value) => Ok(Outcome::Led { fence, value, end }),
                                None => Err(Error::Store("the term ended before its action".into())),
                            },
                            Ended::Skipped { holder } => Ok(Outcome::Skipped { holder }),
                            Ended::Failed { error } => Err(error),
                            Ended::Aborted => Ok(Outcome::Skipped { holder: None }),
                        };
                    }
                }
            }
            let wake = machine.poll_timeout().map(|at| Duration::from_millis(at.saturating_sub(clock.monotonic_ms())));
            let running = async {
                match work.as_mut() {
                    Some(w) => w.as_mut().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some((id, answer)) = pending.next(), if !pending.is_empty() => {
                    let now = clock.monotonic_ms();
                    match answer {
                        Some(result) => machine.handle(Input::Answer { id, result }, now),
                        None => machine.handle_timeout(now),
                    }
                }
                v = running => {
                    work = None;
                    value = Some(v);
                    machine.handle(Input::Finished, clock.monotonic_ms());
                }
                _ = tokio::time::sleep(wake.unwrap_or(Duration::MAX)), if wake.is_some() => {
                    machine.handle_timeout(clock.monotonic_ms());
                }
            }
        }
    }

    /// One request of the machine against the backend.
    fn send<'a>(
        &'a self,
        id: u64,
        request: Request,
        budget: Option<Duration>,
        registration: Option<&Registration<'a>>,
    ) -> Pending<'a> {
        let backend = &self.backend;
        let owner = &self.owner;
        let registration = registration.map(|r| (r.election, r.candidate, r.ttl));
        Box::pin(async move {
            let answer = async {
                let result = match (request, registration) {
                    (Request::Register, Some((election, candidate, ttl))) => {
                        backend.register(election, candidate, ttl).await.map(|()| Reply::Done)
                    }
                    (Request::Candidates, Some((election, ..))) => {
                        backend.candidates(election).await.map(Reply::Candidates)
                    }
                    (Request::Withdraw, Some((election, ..))) => {
                        backend.withdraw(election, owner).await.map(|()| Reply::Done)
                    }
                    (Request::Register | Request::Candidates | Request::Withdraw, None) => {
                        Err(Error::invalid("election", "only a strategic election has candidates"))
                    }
                    (Request::Claim { key }, _) => backend.claim(&key, owner).await.map(Reply::Lease),
                    (Request::ClaimSlot { key, slots }, _) => {
                        backend.claim_slot(&key, slots, owner).await.map(Reply::Lease)
                    }
                    (Request::Renew { mut lease }, _) => backend.renew(&mut lease).await.map(|()| Reply::Lease(lease)),
                    (Request::Release { lease }, _) => {
                        let released = backend.release(&lease).await;
                        match &released {
                            Ok(()) => debug!(key = %lease.id, fence = lease.fence, "released"),
                            Err(e) => {
                                warn!(key = %lease.id, fence = lease.fence, error = %e, "release failed; the lease runs out")
                            }
                        }
                        released.map(|()| Reply::Done)
                    }
                };
                if let Err(e) = &result {
                    if !matches!(e, Error::Held { .. }) {
                        warn!(error = %e, "election request failed");
                    }
                }
                result
            };
            match budget {
                // Rule 2: a renewal is given up at the deadline; the machine's timeout decides.
                Some(budget) => (id, tokio::time::timeout(budget, answer).await.ok()),
                None => (id, Some(answer.await)),
            }
        })
    }
}
