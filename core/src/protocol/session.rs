//! Session mode: one session item per worker (`session/{owner}`: expiry and epoch, the epoch
//! being the item's fence) renewed for every connection the worker holds, and the claim of a
//! connection under a session: unowned work with one UpdateItem, the work of a dead session
//! (expired beyond the skew, gone, or of another epoch) with one TransactWriteItems.

use std::collections::BTreeMap;

use super::ops::{consistent_get, update_item};
use super::request::{CancellationReason, ConditionCheck, Request, TransactWriteItem, TransactWriteItems, Update};
use super::value::{item_from_attrs, key, n, s, AttributeValue, Item};
use super::{triage, Budget, Cause, Input, Operation, Step, Triage};
use crate::config::validate_id;
use crate::lease::{claim_cutoff, deadline, expiry_for, HELD_UNDER_SESSION_MS};
use crate::{DesiredState, Error, Lease, LeaseItem, Session, SessionLoad, TableConfig};

pub(crate) fn number(attrs: &Item, name: &str) -> Option<u64> {
    attrs.get(name).and_then(AttributeValue::as_n).and_then(|v| v.parse().ok())
}

/// The session epoch a connection item records (`None`: not held under a session).
pub fn epoch_of(config: &TableConfig, attrs: &Item) -> Option<u64> {
    number(attrs, &config.attributes.session_epoch)
}

fn session_lost<T>(config: &TableConfig, owner: &str) -> Step<T> {
    Step::Fail(Error::Lost { id: config.session_id(owner) })
}

/// Which request the next call without an answer sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Write,
    Reread,
}

/// `create_session`: a new epoch of `owner`'s session. Refused (`Held`) while a session of
/// `owner` lives by rule 1, unless it is the epoch `previous` this worker itself held and has
/// stopped acting for (its deadline passed): a worker that lost its session starts over at once.
#[derive(Debug, Clone)]
pub struct CreateSession {
    config: TableConfig,
    owner: String,
    previous: Option<u64>,
    budget: Budget,
    phase: Phase,
    /// (expiry written, monotonic send time) of every attempt.
    attempts: Vec<(u64, u64)>,
}

impl CreateSession {
    pub fn new(config: &TableConfig, owner: &str, previous: Option<u64>) -> crate::Result<Self> {
        validate_id("owner", owner)?;
        Ok(Self {
            config: config.clone(),
            owner: owner.into(),
            previous,
            budget: Budget::lease(config.renew_ms()),
            phase: Phase::Write,
            attempts: Vec::new(),
        })
    }

    fn write(&mut self, input: &Input) -> Step<Session> {
        let a = &self.config.attributes;
        let exp = expiry_for(input.now_ms, &self.config);
        self.attempts.push((exp, input.mono_ms));
        let mut condition = "(attribute_not_exists(#exp) OR #exp < :cutoff)".to_string();
        let mut values = vec![
            (":exp", n(exp)),
            (":one", n(1)),
            (":cutoff", n(claim_cutoff(input.now_ms, &self.config))),
            (":partition", s(&self.config.session_partition)),
        ];
        if let Some(previous) = self.previous {
            condition.push_str(" OR #fence = :previous");
            values.push((":previous", n(previous)));
        }
        let request = update_item(
            &self.config,
            &self.config.session_id(&self.owner),
            "SET #exp = :exp, #ds = :partition ADD #fence :one",
            Some(condition),
            &[("#exp", &a.expires_at_ms), ("#fence", &a.fence), ("#ds", &a.desired_state)],
            values,
        );
        self.budget.send(input.mono_ms, Request::UpdateItem(request))
    }

    fn session(&self, item: &LeaseItem, sent: u64) -> Session {
        Session {
            owner: self.owner.clone(),
            epoch: item.fence,
            expires_at_ms: item.expires_at_ms.unwrap_or(0),
            deadline_mono_ms: deadline(sent, &self.config),
        }
    }
}

impl Operation for CreateSession {
    type Output = Session;
    fn next(&mut self, mut input: Input) -> Step<Session> {
        let Some(answer) = input.answer.take() else {
            return match self.phase {
                Phase::Write => self.write(&input),
                Phase::Reread => {
                    let id = self.config.session_id(&self.owner);
                    self.budget.send(input.mono_ms, consistent_get(&self.config, &id))
                }
            };
        };
        match (self.phase, triage(answer, &self.config.table_name)) {
            (Phase::Write, Triage::Ok(out)) => {
                let item = item_from_attrs(&self.config, &out.attributes.unwrap_or_default());
                let sent = self.attempts.last().map_or(input.mono_ms, |a| a.1);
                Step::Done(self.session(&item, sent))
            }
            (Phase::Write, Triage::Condition(old)) => {
                let old = item_from_attrs(&self.config, &old.unwrap_or_default());
                Step::Fail(Error::Held { owner: self.owner.clone(), expires_at_ms: old.expires_at_ms.unwrap_or(0) })
            }
            (Phase::Write, Triage::Ambiguous) => {
                self.budget.maybe_applied = true;
                self.phase = Phase::Reread;
                let id = self.config.session_id(&self.owner);
                self.budget.send(input.mono_ms, consistent_get(&self.config, &id))
            }
            (Phase::Reread, Triage::Ok(out)) => {
                let item = out.item.map(|i| item_from_attrs(&self.config, &i)).unwrap_or_default();
                // One of our attempts landed (its expiry is on the item): that epoch is ours.
                if let Some(&(_, sent)) = self.attempts.iter().find(|(exp, _)| Some(*exp) == item.expires_at_ms) {
                    return Step::Done(self.session(&item, sent));
                }
                self.phase = Phase::Write;
                self.budget.pause(&input, Cause::Timeout)
            }
            (Phase::Reread, Triage::Ambiguous) => self.budget.pause(&input, Cause::Timeout),
            (_, Triage::Retry(cause)) => self.budget.pause(&input, cause),
            (_, Triage::Fail(e)) => Step::Fail(e),
            (_, Triage::Condition(_) | Triage::Canceled(_)) => super::unexpected(),
        }
    }
}

/// `renew_session`: extends the session (one write for every connection held under it); `Lost`
/// once the epoch is not the item's any more or no attempt fits before the deadline. Returns the
/// session with its deadline counted from the send that landed.
#[derive(Debug, Clone)]
pub struct RenewSession {
    config: TableConfig,
    session: Session,
    load: Option<SessionLoad>,
    budget: Budget,
    phase: Phase,
    attempts: Vec<(u64, u64)>,
}

impl RenewSession {
    pub fn new(config: &TableConfig, session: &Session) -> Self {
        Self {
            config: config.clone(),
            session: session.clone(),
            load: None,
            budget: Budget::until(session.deadline_mono_ms),
            phase: Phase::Write,
            attempts: Vec::new(),
        }
    }

    /// The renewal also records what the session holds (the same write, for the fleet's balance).
    pub fn reporting(mut self, load: SessionLoad) -> Self {
        self.load = Some(load);
        self
    }

    fn lost<T>(&self) -> Step<T> {
        session_lost(&self.config, &self.session.owner)
    }

    fn retry(&mut self, input: &Input, cause: Cause) -> Step<Session> {
        match self.budget.pause(input, cause) {
            Step::Fail(Error::Throttled | Error::Timeout { .. } | Error::Unreachable(_)) => self.lost(),
            step => step,
        }
    }

    fn renewed(&self, exp: u64, sent: u64) -> Step<Session> {
        Step::Done(Session {
            expires_at_ms: exp,
            deadline_mono_ms: deadline(sent, &self.config),
            ..self.session.clone()
        })
    }
}

impl Operation for RenewSession {
    type Output = Session;
    fn next(&mut self, mut input: Input) -> Step<Session> {
        let id = self.config.session_id(&self.session.owner);
        let Some(answer) = input.answer.take() else {
            return match self.phase {
                Phase::Write => {
                    if self.session.is_past_deadline(input.mono_ms) {
                        return self.lost();
                    }
                    let a = &self.config.attributes;
                    let exp = expiry_for(input.now_ms, &self.config);
                    self.attempts.push((exp, input.mono_ms));
                    let mut update = "SET #exp = :exp".to_string();
                    let mut names = vec![("#exp", a.expires_at_ms.as_str()), ("#fence", a.fence.as_str())];
                    let mut values = vec![(":exp", n(exp)), (":epoch", n(self.session.epoch)), (":zero", n(0))];
                    set_load(&self.config, self.load, &mut update, &mut names, &mut values);
                    // An ended session (expiry 0) stays ended.
                    let condition = Some("#fence = :epoch AND #exp > :zero".into());
                    let request = update_item(&self.config, &id, &update, condition, &names, values);
                    self.budget.send(input.mono_ms, Request::UpdateItem(request))
                }
                Phase::Reread => self.budget.send(input.mono_ms, consistent_get(&self.config, &id)),
            };
        };
        match (self.phase, triage(answer, &self.config.table_name)) {
            (Phase::Write, Triage::Ok(_)) => {
                let (exp, sent) = *self.attempts.last().expect("a renewal was sent");
                self.renewed(exp, sent)
            }
            (Phase::Write, Triage::Condition(_)) => self.lost(),
            (Phase::Write, Triage::Ambiguous) => {
                tracing::warn!(owner = %self.session.owner, "session renewal outcome unknown, re-reading");
                self.phase = Phase::Reread;
                self.budget.send(input.mono_ms, consistent_get(&self.config, &id))
            }
            (Phase::Reread, Triage::Ok(out)) => {
                let item = out.item.map(|i| item_from_attrs(&self.config, &i));
                let Some(item) = item.filter(|i| i.fence == self.session.epoch && i.expires_at_ms != Some(0)) else {
                    return self.lost();
                };
                if let Some(&(exp, sent)) = self.attempts.iter().find(|(exp, _)| Some(*exp) == item.expires_at_ms) {
                    return self.renewed(exp, sent);
                }
                self.phase = Phase::Write;
                self.retry(&input, Cause::Timeout)
            }
            (Phase::Reread, Triage::Ambiguous) => self.retry(&input, Cause::Timeout),
            (_, Triage::Retry(cause)) => self.retry(&input, cause),
            (_, Triage::Fail(e)) => Step::Fail(e),
            (_, Triage::Condition(_) | Triage::Canceled(_)) => super::unexpected(),
        }
    }
}

/// Adds what a session holds (`load`) to a session write: ", #held = :held, #max = :max".
fn set_load<'a>(
    config: &'a TableConfig,
    load: Option<SessionLoad>,
    update: &mut String,
    names: &mut Vec<(&'static str, &'a str)>,
    values: &mut Vec<(&'static str, AttributeValue)>,
) {
    if let Some(load) = load {
        update.push_str(", #held = :held, #max = :max");
        names.push(("#held", &config.session_held_attribute));
        names.push(("#max", &config.session_capacity_attribute));
        values.push((":held", n(load.held)));
        values.push((":max", n(load.max_connections)));
    }
}

/// `end_session`: session expiry 0, which frees every connection held under it at once (the
/// fleet claims them as a dead session's). `Lost` when the epoch was no longer the item's. An
/// ambiguous attempt is simply sent again (the write is idempotent).
#[derive(Debug, Clone)]
pub struct EndSession {
    config: TableConfig,
    session: Session,
    load: Option<SessionLoad>,
    budget: Budget,
}

impl EndSession {
    pub fn new(config: &TableConfig, session: &Session) -> Self {
        Self { config: config.clone(), session: session.clone(), load: None, budget: Budget::lease(config.renew_ms()) }
    }

    /// The end also records `load`, what it frees (the same write): a worker at its fair share
    /// that reads the ended session counts that as work nobody holds.
    pub fn reporting(mut self, load: SessionLoad) -> Self {
        self.load = Some(load);
        self
    }
}

impl Operation for EndSession {
    type Output = ();
    fn next(&mut self, mut input: Input) -> Step<()> {
        let Some(answer) = input.answer.take() else {
            let a = &self.config.attributes;
            let mut update = "SET #exp = :zero".to_string();
            let mut names = vec![("#exp", a.expires_at_ms.as_str()), ("#fence", a.fence.as_str())];
            let mut values = vec![(":zero", n(0)), (":epoch", n(self.session.epoch))];
            set_load(&self.config, self.load, &mut update, &mut names, &mut values);
            let id = self.config.session_id(&self.session.owner);
            let request = update_item(&self.config, &id, &update, Some("#fence = :epoch".into()), &names, values);
            return self.budget.send(input.mono_ms, Request::UpdateItem(request));
        };
        match triage(answer, &self.config.table_name) {
            Triage::Ok(_) => Step::Done(()),
            Triage::Condition(_) => session_lost(&self.config, &self.session.owner),
            Triage::Retry(cause) => self.budget.pause(&input, cause),
            Triage::Ambiguous => {
                self.budget.maybe_applied = true;
                self.budget.pause(&input, Cause::Timeout)
            }
            Triage::Fail(e) => Step::Fail(e),
            Triage::Canceled(_) => Step::Fail(Error::Store("not a transaction".into())),
        }
    }
}

/// `retire_session`: takes a dead session with no connections left out of the session partition
/// of the index, so dead-session queries stop returning it. Conditioned on the epoch and on the
/// session being dead by rule 1; `Done(false)` when it was not (renewed, or a new epoch).
#[derive(Debug, Clone)]
pub struct RetireSession {
    config: TableConfig,
    owner: String,
    epoch: u64,
    budget: Budget,
}

impl RetireSession {
    pub fn new(config: &TableConfig, owner: &str, epoch: u64) -> crate::Result<Self> {
        validate_id("owner", owner)?;
        Ok(Self { config: config.clone(), owner: owner.into(), epoch, budget: Budget::operation(config) })
    }
}

impl Operation for RetireSession {
    type Output = bool;
    fn next(&mut self, mut input: Input) -> Step<bool> {
        let Some(answer) = input.answer.take() else {
            let a = &self.config.attributes;
            let request = update_item(
                &self.config,
                &self.config.session_id(&self.owner),
                "REMOVE #ds",
                Some("#fence = :epoch AND #exp < :cutoff".into()),
                &[("#exp", &a.expires_at_ms), ("#fence", &a.fence), ("#ds", &a.desired_state)],
                vec![(":epoch", n(self.epoch)), (":cutoff", n(claim_cutoff(input.now_ms, &self.config)))],
            );
            return self.budget.send(input.mono_ms, Request::UpdateItem(request));
        };
        match triage(answer, &self.config.table_name) {
            Triage::Ok(_) => Step::Done(true),
            Triage::Condition(_) => Step::Done(false),
            Triage::Retry(cause) => self.budget.pause(&input, cause),
            Triage::Ambiguous => self.budget.pause(&input, Cause::Timeout),
            Triage::Fail(e) => Step::Fail(e),
            Triage::Canceled(_) => Step::Fail(Error::Store("not a transaction".into())),
        }
    }
}

/// What the claim sends next.
#[derive(Debug, Clone, PartialEq)]
enum ClaimPhase {
    /// The UpdateItem that takes unowned work (never claimed, released, or expired by rule 1).
    Unowned,
    /// The transaction that takes the work of a dead session: the connection as it was read.
    Takeover {
        owner: String,
        epoch: u64,
        fence: u64,
        item: LeaseItem,
    },
    Reread,
}

/// `claim_in_session`: the fleet's claim of STARTED work under `session`. Unowned work is taken
/// with one UpdateItem (owner, session epoch, fence + 1, the held sentinel expiry); work held
/// under another session is taken, when that session is dead, with one TransactWriteItems: a
/// ConditionCheck on the old owner's session item (expired beyond the skew, gone, or another
/// epoch) and the Update of the connection conditioned on the recorded owner, epoch and fence.
/// `Held` (with the session's expiry) while the owner's session lives; `NotFound` / `Stopped`
/// as [`super::Acquire::started`]. The lease's deadline is the session's.
#[derive(Debug, Clone)]
pub struct ClaimInSession {
    config: TableConfig,
    id: String,
    session: Session,
    budget: Budget,
    phase: ClaimPhase,
    /// A claim was sent and its outcome is unknown.
    ambiguous: bool,
    /// The claim's last decision was sent at once; a retry after a re-read pauses first.
    takeover: bool,
}

impl ClaimInSession {
    pub fn new(config: &TableConfig, id: &str, session: &Session) -> crate::Result<Self> {
        validate_id("id", id)?;
        Ok(Self {
            config: config.clone(),
            id: id.into(),
            session: session.clone(),
            budget: Budget::lease(config.renew_ms()),
            phase: ClaimPhase::Unowned,
            ambiguous: false,
            takeover: false,
        })
    }

    /// The claim of work listed under the dead session `(listed.owner, epoch)` (as
    /// [`super::OwnedBy`] read it): its first request is the takeover transaction, with no
    /// UpdateItem that the sentinel expiry would refuse first. Whatever changed since the listing
    /// (another claim, a release, a stop, an older epoch) cancels the transaction, which returns
    /// the item as it is, and the claim decides again as [`ClaimInSession::new`] does. Work that
    /// is not listed as held under a session is claimed as [`ClaimInSession::new`] claims it.
    pub fn takeover(config: &TableConfig, listed: &LeaseItem, epoch: u64, session: &Session) -> crate::Result<Self> {
        let mut claim = Self::new(config, &listed.id, session)?;
        if let Some(owner) = listed.owner.as_deref().filter(|o| held_under_another(listed, o, epoch, session)) {
            claim.phase =
                ClaimPhase::Takeover { owner: owner.to_string(), epoch, fence: listed.fence, item: listed.clone() };
        }
        Ok(claim)
    }

    fn claim_set(&self) -> (String, Vec<(&'static str, AttributeValue)>) {
        (
            "SET #owner = :me, #epoch = :epoch, #exp = :held ADD #fence :one".into(),
            vec![
                (":me", s(&self.session.owner)),
                (":epoch", n(self.session.epoch)),
                (":held", n(HELD_UNDER_SESSION_MS)),
                (":one", n(1)),
                (":started", s(self.config.started_value(&self.id))),
            ],
        )
    }

    fn names(&self) -> Vec<(&'static str, String)> {
        let a = &self.config.attributes;
        vec![
            ("#owner", a.owner.clone()),
            ("#epoch", a.session_epoch.clone()),
            ("#exp", a.expires_at_ms.clone()),
            ("#fence", a.fence.clone()),
            ("#ds", a.desired_state.clone()),
        ]
    }

    fn unowned(&self, input: &Input) -> Request {
        let (update, mut values) = self.claim_set();
        values.push((":cutoff", n(claim_cutoff(input.now_ms, &self.config))));
        let names = self.names();
        let names: Vec<(&str, &str)> = names.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Request::UpdateItem(update_item(
            &self.config,
            &self.id,
            &update,
            Some("(attribute_not_exists(#exp) OR #exp < :cutoff) AND #ds = :started".into()),
            &names,
            values,
        ))
    }

    fn takeover_request(&self, input: &Input, owner: &str, epoch: u64, fence: u64) -> Request {
        let a = &self.config.attributes;
        let session_check = ConditionCheck {
            table_name: self.config.table_name.clone(),
            key: key(&self.config, &self.config.session_id(owner)),
            condition_expression: "attribute_not_exists(#pk) OR #exp < :cutoff OR #fence <> :epoch".into(),
            expression_attribute_names: BTreeMap::from([
                ("#pk".into(), a.id.clone()),
                ("#exp".into(), a.expires_at_ms.clone()),
                ("#fence".into(), a.fence.clone()),
            ]),
            expression_attribute_values: Item::from([
                (":cutoff".into(), n(claim_cutoff(input.now_ms, &self.config))),
                (":epoch".into(), n(epoch)),
            ]),
            return_values_on_condition_check_failure: Some("ALL_OLD".into()),
        };
        let (update, values) = self.claim_set();
        let mut values: Item = values.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        values.insert(":old_owner".into(), s(owner));
        values.insert(":old_epoch".into(), n(epoch));
        values.insert(":old_fence".into(), n(fence));
        let connection = Update {
            table_name: self.config.table_name.clone(),
            key: key(&self.config, &self.id),
            update_expression: update,
            condition_expression: Some(
                "#owner = :old_owner AND #epoch = :old_epoch AND #fence = :old_fence AND #ds = :started".into(),
            ),
            expression_attribute_names: self.names().into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            expression_attribute_values: values,
            return_values_on_condition_check_failure: Some("ALL_OLD".into()),
        };
        Request::TransactWriteItems(TransactWriteItems {
            transact_items: vec![
                TransactWriteItem { condition_check: Some(session_check), update: None },
                TransactWriteItem { condition_check: None, update: Some(connection) },
            ],
            client_request_token: None,
        })
    }

    fn send(&mut self, input: &Input) -> Step<Lease> {
        let request = match &self.phase {
            ClaimPhase::Unowned => self.unowned(input),
            ClaimPhase::Takeover { owner, epoch, fence, .. } => self.takeover_request(input, owner, *epoch, *fence),
            ClaimPhase::Reread => consistent_get(&self.config, &self.id),
        };
        self.budget.send(input.mono_ms, request)
    }

    fn lease(&self, item: LeaseItem) -> Lease {
        let mut lease = Lease::from_item(item, &self.session.owner, 0, &self.config);
        self.session.cover(&mut lease);
        lease
    }

    /// Whether `attrs` is this claim, landed (after an ambiguous attempt).
    fn is_ours(&self, attrs: &Item) -> bool {
        let item = item_from_attrs(&self.config, attrs);
        item.owner.as_deref() == Some(self.session.owner.as_str())
            && epoch_of(&self.config, attrs) == Some(self.session.epoch)
            && item.expires_at_ms == Some(HELD_UNDER_SESSION_MS)
    }

    /// What the current connection item says: the next phase (sent at once when `now`), or the
    /// end of the claim.
    fn decide(&mut self, attrs: Option<Item>, input: &Input, now: bool) -> Step<Lease> {
        let Some(attrs) = attrs else { return Step::Fail(Error::NotFound { id: self.id.clone() }) };
        if self.ambiguous && self.is_ours(&attrs) {
            return Step::Done(self.lease(item_from_attrs(&self.config, &attrs)));
        }
        let item = item_from_attrs(&self.config, &attrs);
        match item.desired_state {
            None => return Step::Fail(Error::NotFound { id: self.id.clone() }),
            Some(DesiredState::Stopped) => return Step::Fail(Error::Stopped { id: self.id.clone() }),
            Some(DesiredState::Started) => {}
        }
        let cutoff = claim_cutoff(input.now_ms, &self.config);
        let exp = item.expires_at_ms.unwrap_or(0);
        self.phase = if exp < cutoff {
            ClaimPhase::Unowned
        } else {
            match (item.owner.clone(), epoch_of(&self.config, &attrs)) {
                // Held under a session (the sentinel): whether it is really held is the session's.
                (Some(owner), Some(epoch)) if exp == HELD_UNDER_SESSION_MS => {
                    if owner == self.session.owner && epoch == self.session.epoch {
                        return Step::Fail(Error::Held { owner, expires_at_ms: self.session.expires_at_ms });
                    }
                    ClaimPhase::Takeover { owner, epoch, fence: item.fence, item }
                }
                // A per-item lease that has not expired.
                (owner, _) => return Step::Fail(Error::Held { owner: owner.unwrap_or_default(), expires_at_ms: exp }),
            }
        };
        if now {
            return self.send(input);
        }
        let cause = if self.ambiguous { Cause::Timeout } else { Cause::Contention };
        self.budget.pause(input, cause)
    }

    fn cancelled(&mut self, reasons: Vec<CancellationReason>, input: &Input) -> Step<Lease> {
        let code = |i: usize| reasons.get(i).and_then(|r| r.code.as_deref()).unwrap_or("None");
        if code(0) == "ConditionalCheckFailed" {
            // The owner's session lives: the work is held until the session's expiry.
            let ClaimPhase::Takeover { owner, .. } = &self.phase else { return self.unexpected() };
            let session = item_from_attrs(&self.config, &reasons[0].item.clone().unwrap_or_default());
            return Step::Fail(Error::Held { owner: owner.clone(), expires_at_ms: session.expires_at_ms.unwrap_or(0) });
        }
        if code(1) == "ConditionalCheckFailed" {
            // The connection changed since it was read (released, claimed, stopped): decide again.
            let current = reasons.get(1).and_then(|r| r.item.clone());
            let first_decision = !self.takeover;
            self.takeover = true;
            return self.decide(current, input, first_decision);
        }
        if reasons.iter().any(|r| is_write_conflict(r.code.as_deref())) {
            return self.budget.pause(input, Cause::Throttled);
        }
        Step::Fail(Error::Store(format!(
            "claim transaction cancelled: {}",
            reasons.iter().map(|r| r.code.clone().unwrap_or_default()).collect::<Vec<_>>().join(", ")
        )))
    }

    fn unexpected<T>(&self) -> Step<T> {
        super::unexpected()
    }
}

/// A cancellation reason that another writer of the same item gives: a concurrent transaction,
/// or (a multi-Region strong consistency table) a write in another Region. Contention, retried.
fn is_write_conflict(code: Option<&str>) -> bool {
    matches!(code, Some("TransactionConflict" | "ReplicatedWriteConflict"))
}

/// Whether `listed` is STARTED work held (the sentinel) under the session `epoch` of `owner`, a
/// session other than `session`: work a takeover may be sent for as listed.
fn held_under_another(listed: &LeaseItem, owner: &str, epoch: u64, session: &Session) -> bool {
    listed.expires_at_ms == Some(HELD_UNDER_SESSION_MS)
        && listed.desired_state == Some(DesiredState::Started)
        && (owner != session.owner || epoch != session.epoch)
}

/// Connections one [`TakeOverListed`] takes: a transaction holds at most 100 actions, one of
/// them the check of the dead session.
pub const TAKE_OVER_MAX: usize = 99;

/// What the transaction did to one listed connection.
#[derive(Debug, Clone, PartialEq)]
enum Listed {
    /// In the next transaction.
    Pending,
    Taken(Lease),
    /// Left to a claim of its own ([`ClaimInSession::takeover`], which decides from what the item
    /// is now): it changed since the listing, the session lives, or the batch failed.
    Left,
}

/// Several connections listed under one dead session, taken over under `session` with one
/// TransactWriteItems: the ConditionCheck of [`ClaimInSession`]'s takeover on the dead session's
/// item and one Update per connection, each conditioned on the owner, epoch and fence it was
/// listed with (the same writes as that many takeovers, all or none). Output, per listed item in
/// order: the lease, or `None` where the connection was left to a claim of its own.
///
/// A cancellation naming connections that changed since the listing leaves them out and sends
/// the rest again; a conflict with another transaction is retried after a pause within the
/// budget; a live session leaves them all. An answer that may or may not have been applied is
/// settled by a consistent read of the connections: those held under `session` at the fence the
/// takeover writes are taken. Every other failure leaves them all.
#[derive(Debug, Clone)]
pub struct TakeOverListed {
    config: TableConfig,
    session: Session,
    owner: String,
    epoch: u64,
    items: Vec<LeaseItem>,
    state: Vec<Listed>,
    budget: Budget,
    /// Connections left out after a cancellation were sent again at once; the next time pauses.
    resent: bool,
    /// After an ambiguous answer: the consistent read of the pending connections and its
    /// request in flight.
    reread: Option<(super::BatchGet, Request)>,
}

impl TakeOverListed {
    /// `listed`: at most [`TAKE_OVER_MAX`] connections as read under the dead session `epoch` of
    /// `owner`. One listed otherwise (another owner, not held under a session, stopped) is left
    /// at once.
    pub fn new(
        config: &TableConfig,
        owner: &str,
        epoch: u64,
        listed: Vec<LeaseItem>,
        session: &Session,
    ) -> crate::Result<Self> {
        validate_id("owner", owner)?;
        if listed.is_empty() || listed.len() > TAKE_OVER_MAX {
            return Err(Error::InvalidInput {
                field: "listed".into(),
                message: format!("1 to {TAKE_OVER_MAX} connections, not {}", listed.len()),
            });
        }
        let mut ids = std::collections::HashSet::new();
        let state = listed
            .iter()
            .map(|item| {
                let held = item.owner.as_deref() == Some(owner) && held_under_another(item, owner, epoch, session);
                if held && ids.insert(item.id.clone()) {
                    Listed::Pending
                } else {
                    Listed::Left
                }
            })
            .collect();
        Ok(Self {
            config: config.clone(),
            session: session.clone(),
            owner: owner.into(),
            epoch,
            items: listed,
            state,
            budget: Budget::lease(config.renew_ms()),
            resent: false,
            reread: None,
        })
    }

    fn pending(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.items.len()).filter(|i| self.state[*i] == Listed::Pending)
    }

    fn output(&mut self) -> Step<Vec<Option<Lease>>> {
        let state = std::mem::take(&mut self.state);
        Step::Done(
            state
                .into_iter()
                .map(|s| match s {
                    Listed::Taken(lease) => Some(lease),
                    Listed::Pending | Listed::Left => None,
                })
                .collect(),
        )
    }

    fn leave_pending(&mut self) -> Step<Vec<Option<Lease>>> {
        for s in &mut self.state {
            if *s == Listed::Pending {
                *s = Listed::Left;
            }
        }
        self.output()
    }

    fn lease(&self, i: usize) -> Lease {
        let mut item = self.items[i].clone();
        item.fence += 1;
        item.owner = Some(self.session.owner.clone());
        item.expires_at_ms = Some(HELD_UNDER_SESSION_MS);
        let mut lease = Lease::from_item(item, &self.session.owner, 0, &self.config);
        self.session.cover(&mut lease);
        lease
    }

    fn send(&mut self, input: &Input) -> Step<Vec<Option<Lease>>> {
        let pending: Vec<usize> = self.pending().collect();
        if pending.is_empty() {
            return self.output();
        }
        let mut items = Vec::with_capacity(pending.len() + 1);
        for (n, i) in pending.iter().enumerate() {
            let claim = ClaimInSession::new(&self.config, &self.items[*i].id, &self.session);
            let Ok(claim) = claim else { return self.leave_pending() };
            let Request::TransactWriteItems(t) =
                claim.takeover_request(input, &self.owner, self.epoch, self.items[*i].fence)
            else {
                return super::unexpected();
            };
            let mut actions = t.transact_items.into_iter();
            let (check, update) = (actions.next(), actions.next());
            if n == 0 {
                items.extend(check);
            }
            items.extend(update);
        }
        self.budget.send(
            input.mono_ms,
            Request::TransactWriteItems(TransactWriteItems { transact_items: items, client_request_token: None }),
        )
    }

    fn cancelled(&mut self, reasons: Vec<CancellationReason>, input: &Input) -> Step<Vec<Option<Lease>>> {
        let code = |r: Option<&CancellationReason>| r.and_then(|r| r.code.clone()).unwrap_or_else(|| "None".into());
        if code(reasons.first()) == "ConditionalCheckFailed" {
            // The dead session's item says it lives (or came back): no takeover.
            return self.leave_pending();
        }
        let pending: Vec<usize> = self.pending().collect();
        let mut changed = false;
        for (n, i) in pending.iter().enumerate() {
            match code(reasons.get(n + 1)).as_str() {
                "None" | "TransactionConflict" | "ReplicatedWriteConflict" => {}
                "ConditionalCheckFailed" => {
                    self.state[*i] = Listed::Left;
                    changed = true;
                }
                _ => return self.leave_pending(),
            }
        }
        let conflict = reasons.iter().any(|r| is_write_conflict(r.code.as_deref()));
        if conflict {
            return self.budget.pause(input, Cause::Throttled);
        }
        if !changed {
            return self.leave_pending();
        }
        if self.resent {
            return self.budget.pause(input, Cause::Contention);
        }
        self.resent = true;
        self.send(input)
    }

    /// After an answer that may have been applied: what the connections say now.
    fn reread(&mut self, input: &mut Input) -> Step<Vec<Option<Lease>>> {
        let Some((batch, request)) = self.reread.as_mut() else { return self.leave_pending() };
        let Some(answer) = input.answer.take() else {
            return self.budget.send(input.mono_ms, request.clone());
        };
        let out = match super::read_answer(&mut self.budget, input, answer, &self.config.table_name) {
            Ok(out) => out,
            Err(Step::Fail(_)) => return self.leave_pending(),
            Err(step) => return step,
        };
        if let Some(next) = batch.take(out) {
            *request = next.clone();
            return self.budget.send(input.mono_ms, next);
        }
        let found = std::mem::take(&mut batch.found);
        for i in self.pending().collect::<Vec<_>>() {
            let listed = &self.items[i];
            let ours = found.iter().any(|f| {
                f.id == listed.id
                    && f.owner.as_deref() == Some(self.session.owner.as_str())
                    && f.expires_at_ms == Some(HELD_UNDER_SESSION_MS)
                    && f.fence == listed.fence + 1
            });
            self.state[i] = if ours { Listed::Taken(self.lease(i)) } else { Listed::Left };
        }
        self.output()
    }
}

impl Operation for TakeOverListed {
    type Output = Vec<Option<Lease>>;
    fn next(&mut self, mut input: Input) -> Step<Vec<Option<Lease>>> {
        if self.reread.is_some() {
            return self.reread(&mut input);
        }
        let Some(answer) = input.answer.take() else {
            if self.session.is_past_deadline(input.mono_ms) {
                return self.leave_pending();
            }
            return self.send(&input);
        };
        match triage(answer, &self.config.table_name) {
            Triage::Ok(_) => {
                for i in self.pending().collect::<Vec<_>>() {
                    self.state[i] = Listed::Taken(self.lease(i));
                }
                self.output()
            }
            Triage::Canceled(reasons) => self.cancelled(reasons, &input),
            Triage::Ambiguous => {
                tracing::warn!(owner = %self.owner, "takeover outcome unknown, re-reading");
                self.budget.maybe_applied = true;
                let ids: Vec<&str> = self.pending().map(|i| self.items[i].id.as_str()).collect();
                let mut batch = super::BatchGet::new(&self.config, &ids, None);
                let Some(request) = batch.first() else { return self.leave_pending() };
                self.reread = Some((batch, request));
                self.reread(&mut input)
            }
            Triage::Retry(cause) => self.budget.pause(&input, cause),
            Triage::Condition(_) | Triage::Fail(_) => self.leave_pending(),
        }
    }
}

impl Operation for ClaimInSession {
    type Output = Lease;
    fn next(&mut self, mut input: Input) -> Step<Lease> {
        let Some(answer) = input.answer.take() else {
            if self.session.is_past_deadline(input.mono_ms) {
                return session_lost(&self.config, &self.session.owner);
            }
            return self.send(&input);
        };
        match triage(answer, &self.config.table_name) {
            Triage::Ok(out) => match std::mem::replace(&mut self.phase, ClaimPhase::Reread) {
                ClaimPhase::Unowned => {
                    Step::Done(self.lease(item_from_attrs(&self.config, &out.attributes.unwrap_or_default())))
                }
                ClaimPhase::Takeover { fence, mut item, .. } => {
                    // A transaction returns no item: the connection is the one read, claimed.
                    item.fence = fence + 1;
                    item.owner = Some(self.session.owner.clone());
                    item.expires_at_ms = Some(HELD_UNDER_SESSION_MS);
                    Step::Done(self.lease(item))
                }
                ClaimPhase::Reread => self.decide(out.item, &input, false),
            },
            Triage::Condition(old) => {
                if self.phase != ClaimPhase::Unowned {
                    return self.unexpected();
                }
                self.decide(old, &input, true)
            }
            Triage::Canceled(reasons) => {
                if !matches!(self.phase, ClaimPhase::Takeover { .. }) {
                    return self.unexpected();
                }
                self.cancelled(reasons, &input)
            }
            Triage::Ambiguous if self.phase != ClaimPhase::Reread => {
                tracing::warn!(connection_id = %self.id, "claim outcome unknown, re-reading");
                self.ambiguous = true;
                self.budget.maybe_applied = true;
                self.phase = ClaimPhase::Reread;
                self.send(&input)
            }
            Triage::Ambiguous => self.budget.pause(&input, Cause::Timeout),
            Triage::Retry(cause) => self.budget.pause(&input, cause),
            Triage::Fail(e) => Step::Fail(e),
        }
    }
}
