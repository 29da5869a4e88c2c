//! The writes of the lease model: start, stop, claim (acquire / acquire_started), renew, release,
//! checkpoint. Each names its expressions here and decides from every answer.

use super::request::{GetItem, Request, UpdateItem};
use super::value::{item_from_attrs, key, n, s, AttributeValue, Item};
use super::{triage, Budget, Cause, Input, Operation, Step, Triage};
use crate::config::{validate_id, validate_url};
use crate::lease::{claim_cutoff, expiry_for, holds, holds_unreleased};
use crate::{DesiredState, Error, Lease, LeaseItem, TableConfig};

/// An UpdateItem returning the new item, or the old one when its condition fails.
pub(crate) fn update_item(
    config: &TableConfig,
    id: &str,
    update: &str,
    condition: Option<String>,
    names: &[(&str, &str)],
    values: Vec<(&str, AttributeValue)>,
) -> UpdateItem {
    UpdateItem {
        table_name: config.table_name.clone(),
        key: key(config, id),
        update_expression: update.to_string(),
        condition_expression: condition,
        expression_attribute_names: names.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        expression_attribute_values: values.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        return_values: Some("ALL_NEW".into()),
        return_values_on_condition_check_failure: Some("ALL_OLD".into()),
    }
}

/// An update of `lease`'s item made only while it is still this lease: owner and fence (plus
/// `extra`, if any) must match. `#owner`, `#fence`, `:me` and `:fence` are added.
/// A released lease (expiry 0) is not renewed or checkpointed again.
const NOT_RELEASED: &str = "#exp > :zero";

fn under_lease(
    config: &TableConfig,
    lease: &Lease,
    update: &str,
    extra: Option<&str>,
    names: &[(&str, &str)],
    values: Vec<(&str, AttributeValue)>,
) -> UpdateItem {
    let a = &config.attributes;
    let condition = match extra {
        Some(extra) => format!("#owner = :me AND #fence = :fence AND {extra}"),
        None => "#owner = :me AND #fence = :fence".to_string(),
    };
    let mut names = names.to_vec();
    names.extend([("#owner", a.owner.as_str()), ("#fence", a.fence.as_str())]);
    let mut values = values;
    values.extend([(":me", s(&lease.owner)), (":fence", n(lease.fence))]);
    update_item(config, &lease.id, update, Some(condition), &names, values)
}

/// A strongly consistent read of one item.
pub(crate) fn consistent_get(config: &TableConfig, id: &str) -> Request {
    Request::GetItem(GetItem {
        table_name: config.table_name.clone(),
        key: key(config, id),
        consistent_read: Some(true),
    })
}

fn new_item(config: &TableConfig, attrs: Option<Item>) -> LeaseItem {
    item_from_attrs(config, &attrs.unwrap_or_default())
}

/// Which request the next call without an answer sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Write,
    Reread,
}

/// An idempotent write (start, stop): an ambiguous attempt is simply sent again.
#[derive(Debug, Clone)]
struct Idempotent {
    config: TableConfig,
    request: UpdateItem,
    budget: Budget,
}

impl Idempotent {
    fn next(&mut self, mut input: Input, on_condition: impl FnOnce() -> Error) -> Step<LeaseItem> {
        let Some(answer) = input.answer.take() else {
            return self.budget.send(input.mono_ms, Request::UpdateItem(self.request.clone()));
        };
        match triage(answer, &self.config.table_name) {
            Triage::Ok(out) => Step::Done(new_item(&self.config, out.attributes)),
            Triage::Condition(_) => Step::Fail(on_condition()),
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

/// `start`: sets STARTED and the url, keeps owner, fence and last_seq, clears the cleanup TTL.
#[derive(Debug, Clone)]
pub struct Start(Idempotent);

impl Start {
    pub fn new(config: &TableConfig, id: &str, url: &str) -> crate::Result<Self> {
        validate_id("id", id)?;
        validate_url(url)?;
        let a = &config.attributes;
        let request = update_item(
            config,
            id,
            "SET #ds = :started, #url = :url, #exp = if_not_exists(#exp, :zero) REMOVE #ttl",
            None,
            &[("#ds", &a.desired_state), ("#url", &a.url), ("#exp", &a.expires_at_ms), ("#ttl", &a.ttl)],
            vec![(":started", s(config.started_value(id))), (":url", s(url)), (":zero", n(0))],
        );
        Ok(Self(Idempotent { config: config.clone(), request, budget: Budget::operation(config) }))
    }
}

impl Operation for Start {
    type Output = LeaseItem;
    fn next(&mut self, input: Input) -> Step<LeaseItem> {
        self.0.next(input, || Error::Store("start has no condition".into()))
    }
}

/// `stop`: sets STOPPED and the cleanup TTL; `NotFound` when the id has no item.
#[derive(Debug, Clone)]
pub struct Stop {
    inner: Idempotent,
    id: String,
}

impl Stop {
    /// `now_ms` sets the cleanup TTL (`stopped_retention` from now).
    pub fn new(config: &TableConfig, id: &str, now_ms: u64) -> crate::Result<Self> {
        validate_id("id", id)?;
        let a = &config.attributes;
        let ttl = now_ms / 1000 + config.stopped_retention.as_secs();
        let request = update_item(
            config,
            id,
            "SET #ds = :stopped, #ttl = :ttl",
            Some("attribute_exists(#pk)".into()),
            &[("#ds", &a.desired_state), ("#ttl", &a.ttl), ("#pk", &a.id)],
            vec![(":stopped", s(DesiredState::Stopped.as_str())), (":ttl", n(ttl))],
        );
        Ok(Self {
            inner: Idempotent { config: config.clone(), request, budget: Budget::operation(config) },
            id: id.into(),
        })
    }
}

impl Operation for Stop {
    type Output = LeaseItem;
    fn next(&mut self, input: Input) -> Step<LeaseItem> {
        let id = &self.id;
        self.inner.next(input, || Error::NotFound { id: id.clone() })
    }
}

/// A claim. [`Acquire::new`] takes any id that nobody holds and that is not STOPPED (leader-style
/// keys; the item is created when missing). [`Acquire::started`] takes only an existing item
/// whose desired state is STARTED (fleet work), and writes nothing otherwise.
#[derive(Debug, Clone)]
pub struct Acquire {
    config: TableConfig,
    id: String,
    owner: String,
    started_only: bool,
    budget: Budget,
    phase: Phase,
    /// When the first claim was sent: the earliest an ambiguous claim of ours can have landed.
    first_sent: Option<u64>,
    sent: u64,
    cutoff: u64,
    ambiguous: bool,
}

impl Acquire {
    pub fn new(config: &TableConfig, id: &str, owner: &str) -> crate::Result<Self> {
        validate_id("id", id)?;
        validate_id("owner", owner)?;
        Ok(Self {
            config: config.clone(),
            id: id.into(),
            owner: owner.into(),
            started_only: false,
            budget: Budget::lease(config.renew_ms()),
            phase: Phase::Write,
            first_sent: None,
            sent: 0,
            cutoff: 0,
            ambiguous: false,
        })
    }

    /// The fleet's claim: `NotFound` when the id has no item or no desired state, `Stopped` when
    /// it is STOPPED; nothing is written then.
    pub fn started(config: &TableConfig, id: &str, owner: &str) -> crate::Result<Self> {
        Ok(Self { started_only: true, ..Self::new(config, id, owner)? })
    }

    fn claim(&self, now_ms: u64) -> UpdateItem {
        let a = &self.config.attributes;
        // Rule 1: only an expiry older than our clock minus the skew may be taken.
        let state = if self.started_only { "#ds = :started" } else { "(attribute_not_exists(#ds) OR #ds <> :stopped)" };
        let mut values = vec![
            (":owner", s(&self.owner)),
            (":exp", n(expiry_for(now_ms, &self.config))),
            (":one", n(1)),
            (":cutoff", n(self.cutoff)),
        ];
        values.push(if self.started_only {
            (":started", s(self.config.started_value(&self.id)))
        } else {
            (":stopped", s(DesiredState::Stopped.as_str()))
        });
        update_item(
            &self.config,
            &self.id,
            "SET #owner = :owner, #exp = :exp ADD #fence :one",
            Some(format!("(attribute_not_exists(#exp) OR #exp < :cutoff) AND {state}")),
            &[("#owner", &a.owner), ("#exp", &a.expires_at_ms), ("#fence", &a.fence), ("#ds", &a.desired_state)],
            values,
        )
    }

    /// What the current item (old item of a failed condition, or the re-read) says.
    fn decide(&mut self, current: Option<LeaseItem>, input: &Input) -> Step<Lease> {
        match &current {
            Some(item) => {
                // After an ambiguous attempt our own claim may have landed: the deadline then
                // counts from the first send, the earliest it can have been written.
                if self.ambiguous
                    && item.owner.as_deref() == Some(self.owner.as_str())
                    && item.expires_at_ms.is_some_and(|e| e >= self.cutoff)
                {
                    let first = self.first_sent.unwrap_or(self.sent);
                    return Step::Done(Lease::from_item(item.clone(), &self.owner, first, &self.config));
                }
                if item.desired_state == Some(DesiredState::Stopped) {
                    return Step::Fail(Error::Stopped { id: self.id.clone() });
                }
                if let Some(exp) = item.expires_at_ms.filter(|&e| e >= self.cutoff) {
                    return Step::Fail(Error::Held {
                        owner: item.owner.clone().unwrap_or_default(),
                        expires_at_ms: exp,
                    });
                }
                if self.started_only && item.desired_state.is_none() {
                    return Step::Fail(Error::NotFound { id: self.id.clone() });
                }
            }
            None if self.started_only => return Step::Fail(Error::NotFound { id: self.id.clone() }),
            None => {}
        }
        self.phase = Phase::Write;
        let cause = if self.ambiguous { Cause::Timeout } else { Cause::Contention };
        self.budget.pause(input, cause)
    }
}

impl Operation for Acquire {
    type Output = Lease;
    fn next(&mut self, mut input: Input) -> Step<Lease> {
        let Some(answer) = input.answer.take() else {
            return match self.phase {
                Phase::Write => {
                    self.sent = input.mono_ms;
                    self.first_sent.get_or_insert(input.mono_ms);
                    self.cutoff = claim_cutoff(input.now_ms, &self.config);
                    let claim = self.claim(input.now_ms);
                    self.budget.send(input.mono_ms, Request::UpdateItem(claim))
                }
                Phase::Reread => self.budget.send(input.mono_ms, consistent_get(&self.config, &self.id)),
            };
        };
        match (self.phase, triage(answer, &self.config.table_name)) {
            (Phase::Write, Triage::Ok(out)) => Step::Done(Lease::from_item(
                new_item(&self.config, out.attributes),
                &self.owner,
                self.sent,
                &self.config,
            )),
            (Phase::Write, Triage::Condition(old)) => {
                let old = old.map(|o| item_from_attrs(&self.config, &o));
                self.decide(old, &input)
            }
            (Phase::Write, Triage::Ambiguous) => {
                tracing::warn!(connection_id = %self.id, "claim outcome unknown, re-reading");
                self.ambiguous = true;
                self.budget.maybe_applied = true;
                self.phase = Phase::Reread;
                self.budget.send(input.mono_ms, consistent_get(&self.config, &self.id))
            }
            (Phase::Reread, Triage::Ok(out)) => {
                let current = out.item.map(|i| item_from_attrs(&self.config, &i));
                self.decide(current, &input)
            }
            (Phase::Reread, Triage::Ambiguous) => self.budget.pause(&input, Cause::Timeout),
            (_, Triage::Retry(cause)) => self.budget.pause(&input, cause),
            (_, Triage::Fail(e)) => Step::Fail(e),
            (_, Triage::Condition(_) | Triage::Canceled(_)) => super::unexpected(),
        }
    }
}

/// Maps the budget running out to `Lost`: a renewal or checkpoint that cannot get through before
/// the deadline has lost the lease.
pub(crate) fn lost_when_exhausted<T>(step: Step<T>, id: &str) -> Step<T> {
    match step {
        Step::Fail(Error::Throttled | Error::Timeout { .. } | Error::Unreachable(_)) => {
            Step::Fail(Error::Lost { id: id.to_string() })
        }
        step => step,
    }
}

/// `renew`: extends the lease; `Lost` once it is not ours, or no attempt fits before the deadline.
/// Returns the renewed lease (its deadline counted from the send that landed).
#[derive(Debug, Clone)]
pub struct Renew {
    config: TableConfig,
    lease: Lease,
    budget: Budget,
    phase: Phase,
    /// (expiry written, monotonic send time) of each ambiguous attempt.
    ambiguous_attempts: Vec<(u64, u64)>,
    exp: u64,
    sent: u64,
}

impl Renew {
    pub fn new(config: &TableConfig, lease: &Lease) -> Self {
        Self {
            config: config.clone(),
            lease: lease.clone(),
            budget: Budget::until(lease.deadline_mono_ms),
            phase: Phase::Write,
            ambiguous_attempts: Vec::new(),
            exp: 0,
            sent: 0,
        }
    }

    fn lost<T>(&self) -> Step<T> {
        Step::Fail(Error::Lost { id: self.lease.id.clone() })
    }

    fn retry(&mut self, input: &Input, cause: Cause) -> Step<Lease> {
        lost_when_exhausted(self.budget.pause(input, cause), &self.lease.id)
    }
}

impl Operation for Renew {
    type Output = Lease;
    fn next(&mut self, mut input: Input) -> Step<Lease> {
        let Some(answer) = input.answer.take() else {
            return match self.phase {
                Phase::Write => {
                    if self.lease.is_past_deadline(input.mono_ms) {
                        return self.lost();
                    }
                    self.sent = input.mono_ms;
                    self.exp = expiry_for(input.now_ms, &self.config);
                    let a = &self.config.attributes;
                    let request = under_lease(
                        &self.config,
                        &self.lease,
                        "SET #exp = :exp",
                        Some(NOT_RELEASED),
                        &[("#exp", &a.expires_at_ms)],
                        vec![(":exp", n(self.exp)), (":zero", n(0))],
                    );
                    self.budget.send(input.mono_ms, Request::UpdateItem(request))
                }
                Phase::Reread => self.budget.send(input.mono_ms, consistent_get(&self.config, &self.lease.id)),
            };
        };
        match (self.phase, triage(answer, &self.config.table_name)) {
            (Phase::Write, Triage::Ok(out)) => Step::Done(Lease::from_item(
                new_item(&self.config, out.attributes),
                &self.lease.owner,
                self.sent,
                &self.config,
            )),
            (Phase::Write, Triage::Condition(_)) => self.lost(),
            (Phase::Write, Triage::Ambiguous) => {
                tracing::warn!(connection_id = %self.lease.id, "renewal outcome unknown, re-reading");
                self.ambiguous_attempts.push((self.exp, self.sent));
                self.phase = Phase::Reread;
                self.budget.send(input.mono_ms, consistent_get(&self.config, &self.lease.id))
            }
            (Phase::Reread, Triage::Ok(out)) => {
                let current = out.item.map(|i| item_from_attrs(&self.config, &i));
                if !holds_unreleased(&current, &self.lease) {
                    return self.lost();
                }
                let item = current.expect("held item exists");
                // One of our ambiguous renewals landed: the deadline counts from its send.
                if let Some(&(_, sent)) =
                    self.ambiguous_attempts.iter().find(|(exp, _)| Some(*exp) == item.expires_at_ms)
                {
                    return Step::Done(Lease::from_item(item, &self.lease.owner, sent, &self.config));
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

/// `release`: expiry 0 under the lease; `Lost` when it was no longer ours.
#[derive(Debug, Clone)]
pub struct Release {
    config: TableConfig,
    lease: Lease,
    budget: Budget,
    phase: Phase,
}

impl Release {
    pub fn new(config: &TableConfig, lease: &Lease) -> Self {
        Self {
            config: config.clone(),
            lease: lease.clone(),
            budget: Budget::lease(config.renew_ms()),
            phase: Phase::Write,
        }
    }

    fn lost<T>(&self) -> Step<T> {
        Step::Fail(Error::Lost { id: self.lease.id.clone() })
    }
}

impl Operation for Release {
    type Output = ();
    fn next(&mut self, mut input: Input) -> Step<()> {
        let Some(answer) = input.answer.take() else {
            let request = match self.phase {
                Phase::Write => {
                    let a = &self.config.attributes;
                    Request::UpdateItem(under_lease(
                        &self.config,
                        &self.lease,
                        "SET #exp = :zero",
                        None,
                        &[("#exp", &a.expires_at_ms)],
                        vec![(":zero", n(0))],
                    ))
                }
                Phase::Reread => consistent_get(&self.config, &self.lease.id),
            };
            return self.budget.send(input.mono_ms, request);
        };
        match (self.phase, triage(answer, &self.config.table_name)) {
            (Phase::Write, Triage::Ok(_)) => Step::Done(()),
            (Phase::Write, Triage::Condition(_)) => self.lost(),
            (Phase::Write, Triage::Ambiguous) => {
                self.budget.maybe_applied = true;
                self.phase = Phase::Reread;
                self.budget.send(input.mono_ms, consistent_get(&self.config, &self.lease.id))
            }
            (Phase::Reread, Triage::Ok(out)) => {
                let current = out.item.map(|i| item_from_attrs(&self.config, &i));
                if !holds(&current, &self.lease) {
                    return self.lost();
                }
                if current.and_then(|i| i.expires_at_ms) == Some(0) {
                    return Step::Done(());
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

/// `checkpoint`: `last_seq = seq` under the lease, only forward. Returns the lease with the new
/// `last_seq`; `Lost` when not ours (or the deadline passes), `SeqNotIncreasing` when `seq` is
/// not past the stored one.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    config: TableConfig,
    lease: Lease,
    seq: u64,
    budget: Budget,
    phase: Phase,
}

impl Checkpoint {
    pub fn new(config: &TableConfig, lease: &Lease, seq: u64) -> Self {
        Self {
            config: config.clone(),
            lease: lease.clone(),
            seq,
            budget: Budget::until(lease.deadline_mono_ms),
            phase: Phase::Write,
        }
    }

    fn done(&self) -> Step<Lease> {
        Step::Done(Lease { last_seq: Some(self.seq), ..self.lease.clone() })
    }

    /// A failed condition (or a re-read that shows the write did not land and cannot).
    fn refused(&self, current: Option<LeaseItem>) -> Step<Lease> {
        if !holds_unreleased(&current, &self.lease) {
            return Step::Fail(Error::Lost { id: self.lease.id.clone() });
        }
        let last_seq = current.and_then(|i| i.last_seq).unwrap_or(0);
        Step::Fail(Error::SeqNotIncreasing { id: self.lease.id.clone(), last_seq, seq: self.seq })
    }

    fn retry(&mut self, input: &Input, cause: Cause) -> Step<Lease> {
        lost_when_exhausted(self.budget.pause(input, cause), &self.lease.id)
    }
}

impl Operation for Checkpoint {
    type Output = Lease;
    fn next(&mut self, mut input: Input) -> Step<Lease> {
        let Some(answer) = input.answer.take() else {
            return match self.phase {
                Phase::Write => {
                    if self.lease.is_past_deadline(input.mono_ms) {
                        return Step::Fail(Error::Lost { id: self.lease.id.clone() });
                    }
                    let a = &self.config.attributes;
                    let request = under_lease(
                        &self.config,
                        &self.lease,
                        "SET #seq = :seq",
                        Some("(attribute_not_exists(#seq) OR #seq < :seq) AND #exp > :zero"),
                        &[("#seq", &a.last_seq), ("#exp", &a.expires_at_ms)],
                        vec![(":seq", n(self.seq)), (":zero", n(0))],
                    );
                    self.budget.send(input.mono_ms, Request::UpdateItem(request))
                }
                Phase::Reread => self.budget.send(input.mono_ms, consistent_get(&self.config, &self.lease.id)),
            };
        };
        match (self.phase, triage(answer, &self.config.table_name)) {
            (Phase::Write, Triage::Ok(_)) => self.done(),
            (Phase::Write, Triage::Condition(old)) => {
                let old = old.map(|o| item_from_attrs(&self.config, &o));
                self.refused(old)
            }
            (Phase::Write, Triage::Ambiguous) => {
                tracing::warn!(connection_id = %self.lease.id, "checkpoint outcome unknown, re-reading");
                self.phase = Phase::Reread;
                self.budget.send(input.mono_ms, consistent_get(&self.config, &self.lease.id))
            }
            (Phase::Reread, Triage::Ok(out)) => {
                let current = out.item.map(|i| item_from_attrs(&self.config, &i));
                let last_seq = current.as_ref().and_then(|i| i.last_seq);
                if holds(&current, &self.lease) && last_seq == Some(self.seq) {
                    return self.done();
                }
                if !holds_unreleased(&current, &self.lease) || last_seq > Some(self.seq) {
                    return self.refused(current);
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
