//! The elector as a machine without I/O: one `run_if_*` call from its first request to its
//! outcome. Claim attempts and their retry pauses within the wait, the candidate heartbeat and
//! listings of a strategic election, the step-down check at every term boundary, the minimum
//! lease, the release and the withdrawal are all decided here, on the monotonic milliseconds the
//! driver passes in. The term's lease is kept by a [`Holder`] the elector steps (its renewal
//! schedule, retry policy, rule 2 deadline and first cancel reason), as every held lease is.
//!
//! A driver creates an [`Elector`] and then, until it emits [`Output::Done`]:
//! - sends every [`Output::Send`] (giving a request up at its `until_mono_ms`, if it has one:
//!   it then reports nothing, the machine's own timeout at that time decides) and feeds each
//!   answer back with [`Elector::handle`] ([`Input::Answer`]);
//! - starts the action on [`Output::Elected`], moves the term's deadline on [`Output::Renewed`],
//!   cancels the action on [`Output::TermOver`], and reports the action's return with
//!   [`Input::Finished`] (or the caller's own cancellation with [`Input::Abort`]);
//! - calls [`Elector::handle_timeout`] once the monotonic clock reaches
//!   [`Elector::poll_timeout`].
//!
//! The store's clock enters through the answers only (a claim's expiry is its store time plus a
//! lease), so a run is a function of its inputs and its seed: `tests/conformance/elector/` holds
//! runs as trace vectors that the tokio elector's and Node's drivers replay alike.

use std::collections::VecDeque;

use super::rules::{self, MinLease};
use super::{Candidate, Strategy, Timing};
use crate::holder::{self, Holder};
use crate::keeper::{CancelReason, Renewal};
use crate::{Error, Lease};

/// Why a term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TermEnd {
    /// The action returned while the lease was held.
    Finished,
    /// The lease was lost or its local deadline passed; the action was cancelled.
    Lost,
    /// A strategic leader stepped down at a term boundary for a better candidate.
    SteppedDown,
}

/// Why the action's term is over (what its cancellation says).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TermOver {
    /// The local deadline passed with no renewal landed in time.
    Deadline,
    /// A renewal was refused: someone else holds the lease.
    Lost,
    /// A better candidate appeared; the lease is released.
    SteppedDown,
    /// The caller cancelled the call; the lease is kept or released as after a return.
    Aborted,
    /// The action returned and the lease was released or left to run out.
    Released,
}

impl TermOver {
    fn end(self) -> TermEnd {
        match self {
            TermOver::Deadline | TermOver::Lost => TermEnd::Lost,
            TermOver::SteppedDown => TermEnd::SteppedDown,
            TermOver::Aborted | TermOver::Released => TermEnd::Finished,
        }
    }

    /// The term's holder's cancel reason for it.
    fn cancel_reason(self) -> CancelReason {
        match self {
            TermOver::Deadline => CancelReason::Deadline,
            TermOver::Lost => CancelReason::Lost,
            TermOver::SteppedDown => CancelReason::HandOver,
            TermOver::Aborted => CancelReason::Shutdown,
            TermOver::Released => CancelReason::Released,
        }
    }

    /// What the term's holder's cancel reason says (a term is never stopped: its renewals carry
    /// no desired state).
    fn of(reason: CancelReason) -> Self {
        match reason {
            CancelReason::Deadline => TermOver::Deadline,
            CancelReason::Lost => TermOver::Lost,
            CancelReason::HandOver => TermOver::SteppedDown,
            CancelReason::Shutdown | CancelReason::Stopped => TermOver::Aborted,
            CancelReason::Released => TermOver::Released,
        }
    }
}

/// What the call competes for.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Race {
    /// The leader lease `key`.
    Leader { key: String },
    /// One of `slots` slots of the group `key`.
    Slot { key: String, slots: u32 },
    /// The leader lease `key`, only while `strategy` picks this owner among the registered
    /// candidates; the registration is refreshed every `heartbeat_ms` and the strategy asked
    /// again every `term_ms` of a term.
    Elected { key: String, strategy: Strategy, term_ms: u64, heartbeat_ms: u64 },
}

/// The settings of one call.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Setup {
    pub owner: String,
    pub race: Race,
    pub lease_ms: u64,
    pub renew_ms: u64,
    pub skew_ms: u64,
    pub wait_ms: u64,
    pub retry_delay_ms: u64,
    pub min_lease_ms: u64,
}

impl Setup {
    fn timing(&self) -> Timing {
        let ms = std::time::Duration::from_millis;
        Timing { lease: ms(self.lease_ms), renew: ms(self.renew_ms), skew: ms(self.skew_ms) }
    }

    /// How a term's holder keeps the lease: renewed on the lease's schedule.
    fn holder(&self) -> holder::Setup {
        holder::Setup {
            mode: holder::Mode::Renew,
            lease_ms: self.lease_ms,
            renew_ms: self.renew_ms,
            skew_ms: self.skew_ms,
        }
    }
}

/// A request the driver sends for the machine.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    /// Registers (or refreshes) this call's candidate in the election, for the candidate ttl.
    Register,
    /// The live candidates of the election.
    Candidates,
    /// Claims the leader lease `key`.
    Claim { key: String },
    /// Claims one free slot of the group `key`.
    ClaimSlot { key: String, slots: u32 },
    /// Renews the held lease (answered with the renewed lease).
    Renew { lease: Lease },
    /// Releases the held lease.
    Release { lease: Lease },
    /// Withdraws this call's candidate from the election.
    Withdraw,
}

/// A request's answer.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// Done, nothing to return (register, release, withdraw).
    Done,
    /// The lease a claim took or a renewal extended.
    Lease(Lease),
    /// The live candidates.
    Candidates(Vec<Candidate>),
}

/// What happens to the machine.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "input", rename_all = "snake_case")]
pub enum Input {
    /// The answer to request `id`.
    Answer { id: u64, result: Result<Reply, Error> },
    /// The action returned.
    Finished,
    /// The caller cancelled the call.
    Abort,
}

/// How the call ended.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Ended {
    /// Elected; the action ran and its term ended so.
    Led { fence: u64, end: TermEnd },
    /// Someone else held the lease, or the strategy picked someone else, for the whole wait.
    Skipped { holder: Option<String> },
    /// A request failed in a way the election cannot go on from.
    Failed { error: Error },
    /// The caller cancelled the call before it was elected.
    Aborted,
}

/// What the driver does.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "output", rename_all = "snake_case")]
pub enum Output {
    /// Send `request`; give it up once the monotonic clock reaches `until_mono_ms`.
    Send { id: u64, request: Request, until_mono_ms: Option<u64> },
    /// Elected: run the action with a term of `lease`.
    Elected { lease: Lease },
    /// A renewal landed: the term's lease (and local deadline) is now `lease`.
    Renewed { lease: Lease },
    /// The term is over: cancel the action (it is still awaited).
    TermOver { reason: TermOver },
    /// The call is over.
    Done { ended: Ended },
}

/// Where the call stands.
#[derive(Debug)]
enum Phase {
    /// Strategic: the first registration is in flight.
    Registering {
        id: u64,
    },
    /// Strategic: the candidates are being listed before an attempt.
    Listing {
        id: u64,
    },
    Claiming {
        id: u64,
        sent_mono: u64,
    },
    /// Waiting before the next attempt.
    Pausing {
        until: u64,
    },
    Term(Box<Term>),
    /// Strategic: the candidate withdraws (once no refresh is in flight), then the call ends.
    Withdrawing {
        id: Option<u64>,
        ended: Ended,
    },
    Done,
}

#[derive(Debug)]
struct Term {
    lease: Lease,
    /// Keeps the lease: when to renew, the retries, the deadline and the first cancel reason
    /// (the one [`Output::TermOver`] says).
    holder: Holder,
    /// Why the term ended, once it has: nothing more is renewed or checked.
    ended: Option<TermEnd>,
    /// The action has returned.
    done: bool,
    /// The lease is to be released before the call ends, and the release in flight.
    must_release: bool,
    release: Option<u64>,
    /// The renewal in flight: its request's id and the holder's.
    renewal: Option<(u64, u64)>,
    /// Strategic: the next term boundary, and the step-down listing in flight.
    next_term: Option<u64>,
    checking: Option<u64>,
    started_mono: u64,
    started_store: u64,
}

/// One `run_if_*` call's election; see the module docs.
#[derive(Debug)]
pub struct Elector {
    setup: Setup,
    timing: Timing,
    wait_until: u64,
    rng: u64,
    next_id: u64,
    out: VecDeque<Output>,
    phase: Phase,
    /// Strategic: the next refresh (`u64::MAX` while one is in flight) and the one in flight.
    heartbeat_at: u64,
    heartbeat: Option<u64>,
    /// Strategic: the id the strategy picked at the last listing (the holder when skipped).
    pick: Option<String>,
    /// The latest time passed in.
    now: u64,
}

impl Elector {
    /// A call starting at `now_mono_ms`; `seed` seeds its random source (the retry jitter).
    pub fn new(setup: Setup, seed: u64, now_mono_ms: u64) -> Self {
        let timing = setup.timing();
        let mut m = Elector {
            wait_until: now_mono_ms.saturating_add(setup.wait_ms),
            timing,
            setup,
            rng: seed,
            next_id: 0,
            out: VecDeque::new(),
            phase: Phase::Done,
            heartbeat_at: u64::MAX,
            heartbeat: None,
            pick: None,
            now: now_mono_ms,
        };
        m.phase = match m.setup.race {
            Race::Elected { .. } => Phase::Registering { id: m.send(Request::Register, None) },
            _ => m.claim(now_mono_ms),
        };
        m
    }

    /// The next thing to do, if any.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// Whether the call is over (its [`Output::Done`] has been emitted).
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// When (monotonic ms) [`Elector::handle_timeout`] is due next, if anything is timed.
    pub fn poll_timeout(&self) -> Option<u64> {
        let mut at = self.heartbeat_at;
        match &self.phase {
            Phase::Pausing { until } => at = at.min(*until),
            Phase::Term(t) if t.ended.is_none() => {
                at = at.min(t.holder.poll_timeout().unwrap_or(u64::MAX));
                if t.checking.is_none() {
                    at = at.min(t.next_term.unwrap_or(u64::MAX));
                }
                if t.done {
                    at = at.min(t.started_mono.saturating_add(self.setup.min_lease_ms));
                }
            }
            Phase::Done => return None,
            _ => {}
        }
        (at != u64::MAX).then_some(at)
    }

    /// The monotonic clock reached `now_mono_ms`.
    pub fn handle_timeout(&mut self, now_mono_ms: u64) {
        self.advance(now_mono_ms);
    }

    /// `input` arrived at `now_mono_ms`.
    pub fn handle(&mut self, input: Input, now_mono_ms: u64) {
        match input {
            Input::Answer { id, result } => self.answered(id, result, now_mono_ms),
            Input::Finished => self.finished(),
            Input::Abort => self.abort(now_mono_ms),
        }
        self.advance(now_mono_ms);
    }

    /// A uniform draw in [0, 1) from the seeded source.
    fn unit(&mut self) -> f64 {
        crate::config::unit_draw(&mut self.rng)
    }

    fn send(&mut self, request: Request, until_mono_ms: Option<u64>) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.out.push_back(Output::Send { id, request, until_mono_ms });
        id
    }

    fn claim(&mut self, now: u64) -> Phase {
        let request = match &self.setup.race {
            Race::Leader { key } | Race::Elected { key, .. } => Request::Claim { key: key.clone() },
            Race::Slot { key, slots } => Request::ClaimSlot { key: key.clone(), slots: *slots },
        };
        Phase::Claiming { id: self.send(request, None), sent_mono: now }
    }

    /// The next attempt: a strategic call lists the candidates first.
    fn attempt(&mut self, now: u64) -> Phase {
        match self.setup.race {
            Race::Elected { .. } => Phase::Listing { id: self.send(Request::Candidates, None) },
            _ => self.claim(now),
        }
    }

    /// Not this time: pause before the next attempt, or skip if it would start after the wait.
    fn pause(&mut self, holder: Option<String>, now: u64) -> Phase {
        let unit = self.unit();
        let delay = rules::retry_pause_ms(self.setup.retry_delay_ms, unit);
        if rules::retry_within_wait(now, delay, self.wait_until) {
            Phase::Pausing { until: now + delay }
        } else {
            self.end(Ended::Skipped { holder })
        }
    }

    /// The call's end: a strategic call withdraws its candidate first.
    fn end(&mut self, ended: Ended) -> Phase {
        if matches!(self.setup.race, Race::Elected { .. }) {
            self.heartbeat_at = u64::MAX;
            let mut p = Phase::Withdrawing { id: None, ended };
            if self.heartbeat.is_none() {
                p = self.withdraw(p);
            }
            p
        } else {
            self.out.push_back(Output::Done { ended });
            Phase::Done
        }
    }

    fn withdraw(&mut self, phase: Phase) -> Phase {
        match phase {
            Phase::Withdrawing { id: None, ended } => {
                Phase::Withdrawing { id: Some(self.send(Request::Withdraw, None)), ended }
            }
            p => p,
        }
    }

    fn elected(&mut self, lease: Lease, sent_mono: u64, now: u64) -> Phase {
        // The first renewal is due a renew interval after the claim was sent.
        let claim = Renewal {
            deadline_mono_ms: lease.deadline_mono_ms,
            next_renew_mono_ms: sent_mono + self.setup.renew_ms,
            stopped: false,
        };
        // The call's random source goes on in the holder: the term's retries draw from it as the
        // claim's pauses did (nothing is drawn after a term).
        let holder = Holder::from_claim(self.setup.holder(), claim, self.rng, now);
        // The minimum lease counts from the action's start (the claim's answer is in), so two
        // runs are never closer than it whatever the claim's latency.
        let started_store = rules::claim_store_ms(lease.expires_at_ms, &self.timing) + now.saturating_sub(sent_mono);
        let next_term = match &self.setup.race {
            Race::Elected { term_ms, .. } => Some(sent_mono + term_ms),
            _ => None,
        };
        self.out.push_back(Output::Elected { lease: lease.clone() });
        Phase::Term(Box::new(Term {
            lease,
            holder,
            ended: None,
            done: false,
            must_release: false,
            release: None,
            renewal: None,
            next_term,
            checking: None,
            started_mono: now,
            started_store,
        }))
    }

    fn answered(&mut self, id: u64, result: Result<Reply, Error>, now: u64) {
        if self.heartbeat == Some(id) {
            self.heartbeat = None;
            if let Phase::Withdrawing { .. } = self.phase {
                let p = std::mem::replace(&mut self.phase, Phase::Done);
                self.phase = self.withdraw(p);
            } else if let Race::Elected { heartbeat_ms, .. } = self.setup.race {
                self.heartbeat_at = now + heartbeat_ms;
            }
            return;
        }
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        self.phase = match phase {
            Phase::Registering { id: r } if r == id => match result {
                Ok(_) => {
                    if let Race::Elected { heartbeat_ms, .. } = self.setup.race {
                        self.heartbeat_at = now + heartbeat_ms;
                    }
                    self.attempt(now)
                }
                // Nothing registered: nothing to withdraw.
                Err(error) => {
                    self.out.push_back(Output::Done { ended: Ended::Failed { error } });
                    Phase::Done
                }
            },
            Phase::Listing { id: l } if l == id => match result {
                Ok(Reply::Candidates(c)) => self.listed(&c, now),
                Ok(_) => self.end(Ended::Failed { error: unexpected("a listing") }),
                Err(error) => self.end(Ended::Failed { error }),
            },
            Phase::Claiming { id: c, sent_mono } if c == id => match result {
                Ok(Reply::Lease(lease)) => self.elected(lease, sent_mono, now),
                Ok(_) => self.end(Ended::Failed { error: unexpected("a claim") }),
                Err(Error::Held { owner, .. }) => {
                    let holder = match self.setup.race {
                        Race::Elected { .. } => self.pick.clone(),
                        _ => Some(owner),
                    };
                    self.pause(holder, now)
                }
                Err(error) => self.end(Ended::Failed { error }),
            },
            Phase::Term(mut t) => {
                if let Some((_, renewal)) = t.renewal.filter(|(request, _)| *request == id) {
                    t.renewal = None;
                    self.renewed(&mut t, renewal, result, now);
                } else if t.checking == Some(id) {
                    t.checking = None;
                    self.checked(&mut t, result, now);
                } else if t.release == Some(id) {
                    // Whatever the answer: a release that failed leaves the lease to run out.
                    t.release = None;
                    t.must_release = false;
                }
                Phase::Term(t)
            }
            Phase::Withdrawing { id: Some(w), ended } if w == id => {
                self.out.push_back(Output::Done { ended });
                Phase::Done
            }
            // A late answer to a request given up (a renewal past the deadline, ...).
            other => other,
        };
    }

    fn listed(&mut self, candidates: &[Candidate], now: u64) -> Phase {
        let (pick, competes) = match &self.setup.race {
            Race::Elected { strategy, .. } => (
                strategy.pick(candidates).map(str::to_string),
                rules::competes(strategy, candidates, &self.setup.owner),
            ),
            _ => (None, false),
        };
        self.pick = pick;
        if competes {
            self.claim(now)
        } else {
            self.pause(self.pick.clone(), now)
        }
    }

    /// The answer to the holder's renewal `renewal`: a refusal ends the term at once; what
    /// falls due after it waits for the upkeep that follows (the minimum lease comes first).
    fn renewed(&mut self, t: &mut Term, renewal: u64, result: Result<Reply, Error>, now: u64) {
        if t.ended.is_some() {
            return;
        }
        let result = match result {
            Ok(Reply::Lease(lease)) => {
                t.lease = lease.clone();
                self.out.push_back(Output::Renewed { lease: lease.clone() });
                // A term has no desired state: whatever the lease says, it is not stopped.
                Ok(Lease { desired_state: None, ..lease })
            }
            Ok(_) => Err(unexpected("a renewal")),
            Err(e) => Err(e),
        };
        t.holder.take(holder::Input::Answer { id: renewal, result }, now);
        self.keep(t);
    }

    /// Turns what the term's holder emitted into the elector's outputs: its renewals into
    /// requests, its first cancel reason into [`Output::TermOver`], and its end (the lease lost
    /// or past its deadline) into the term's.
    fn keep(&mut self, t: &mut Term) {
        while let Some(output) = t.holder.poll_output() {
            match output {
                holder::Output::Renew { id, until_mono_ms } => {
                    let request = self.send(Request::Renew { lease: t.lease.clone() }, Some(until_mono_ms));
                    t.renewal = Some((request, id));
                }
                holder::Output::Cancel { reason } => {
                    self.out.push_back(Output::TermOver { reason: TermOver::of(reason) });
                }
                holder::Output::Over if t.ended.is_none() => {
                    t.ended = Some(TermEnd::Lost);
                    t.renewal = None;
                    t.checking = None;
                }
                // Every renewal landed is told as `Renewed`, covered or not; an end the elector
                // decided is the term's already.
                holder::Output::Covered { .. } | holder::Output::Over => {}
            }
        }
    }

    fn checked(&mut self, t: &mut Term, result: Result<Reply, Error>, now: u64) {
        let Race::Elected { strategy, term_ms, .. } = &self.setup.race else { return };
        if t.ended.is_some() {
            return;
        }
        if let Ok(Reply::Candidates(c)) = &result {
            if rules::steps_down(strategy, c, &self.setup.owner) {
                self.over(t, TermOver::SteppedDown, now);
                return;
            }
        }
        // Staying on (a failed listing too): the next boundary one term later.
        t.next_term = t.next_term.map(|at| at + term_ms);
    }

    /// The term ends for `reason` (told to the driver if it is the first): nothing more is
    /// renewed; stepping down releases the lease.
    fn over(&mut self, t: &mut Term, reason: TermOver, now: u64) {
        t.ended = Some(reason.end());
        t.must_release = reason == TermOver::SteppedDown;
        t.renewal = None;
        t.checking = None;
        t.holder.take(holder::Input::Cancel { reason: reason.cancel_reason() }, now);
        t.holder.take(holder::Input::Cancel { reason: CancelReason::Released }, now);
        self.keep(t);
    }

    fn finished(&mut self) {
        if let Phase::Term(t) = &mut self.phase {
            t.done = true;
        }
    }

    fn abort(&mut self, now: u64) {
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        self.phase = match phase {
            // Told once, as the first reason; the lease is kept until the action returns.
            Phase::Term(mut t) => {
                t.holder.take(holder::Input::Cancel { reason: TermOver::Aborted.cancel_reason() }, now);
                self.keep(&mut t);
                Phase::Term(t)
            }
            Phase::Registering { .. } => {
                self.out.push_back(Output::Done { ended: Ended::Aborted });
                Phase::Done
            }
            Phase::Listing { .. } | Phase::Claiming { .. } | Phase::Pausing { .. } => self.end(Ended::Aborted),
            other => other,
        };
    }

    /// Does what is due at `now`.
    fn advance(&mut self, now: u64) {
        self.now = self.now.max(now);
        if matches!(self.setup.race, Race::Elected { .. }) && now >= self.heartbeat_at {
            self.heartbeat_at = u64::MAX;
            self.heartbeat = Some(self.send(Request::Register, None));
        }
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        self.phase = match phase {
            Phase::Pausing { until } if now >= until => self.attempt(now),
            Phase::Term(mut t) => {
                self.upkeep(&mut t, now);
                if t.ended.is_none() || !t.done {
                    Phase::Term(t)
                } else if t.must_release {
                    if t.release.is_none() {
                        t.release = Some(self.send(Request::Release { lease: t.lease.clone() }, None));
                    }
                    Phase::Term(t)
                } else {
                    let end = t.ended.unwrap_or(TermEnd::Finished);
                    self.end(Ended::Led { fence: t.lease.fence, end })
                }
            }
            other => other,
        };
    }

    /// A held term at `now`: the minimum lease once the action is done, then the holder (rule 2
    /// and the renewal schedule) and the term boundary.
    fn upkeep(&mut self, t: &mut Term, now: u64) {
        if t.ended.is_some() {
            return;
        }
        if t.done {
            let step =
                rules::min_lease(t.started_mono, self.setup.min_lease_ms, now, t.lease.expires_at_ms, t.started_store);
            match step {
                MinLease::WaitUntil(_) => {}
                MinLease::RunOut | MinLease::Release => {
                    self.over(t, TermOver::Released, now);
                    t.must_release = step == MinLease::Release;
                    return;
                }
            }
        }
        t.holder.handle_timeout(now);
        self.keep(t);
        if t.ended.is_some() {
            return;
        }
        if t.checking.is_none() && t.next_term.is_some_and(|at| now >= at) {
            t.checking = Some(self.send(Request::Candidates, None));
        }
    }
}

fn unexpected(what: &str) -> Error {
    Error::Store(format!("{what} was answered with the wrong kind of reply"))
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
