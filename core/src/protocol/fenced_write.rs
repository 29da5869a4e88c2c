//! Fenced writes: the caller's writes made conditional on still holding the lease, in one
//! TransactWriteItems whose first action is the lease's own (a ConditionCheck, or the checkpoint
//! Update). The condition compares owner and fence, so a worker paused past its deadline (GC,
//! SIGSTOP) that lost the lease to a new claim cannot write any more: every claim bumps the fence.

use std::collections::BTreeMap;

use super::request::{CancellationReason, ConditionCheck, Request, TransactWriteItem, TransactWriteItems, Update};
use super::value::{item_from_attrs, key, n, s, Item};
use super::{triage, Budget, Cause, Input, Operation, Step, Triage};
use crate::{Error, Lease, TableConfig};

/// DynamoDB's limit of actions in one transaction; one is the lease's own action.
pub const MAX_FENCED_WRITES: usize = 99;

/// The lease condition: still ours (`owner` and `fence`) and not released or expired by our own
/// clock (`expires_at > now`). Owner and fence are what refuse a zombie after a takeover; the
/// expiry part also refuses writes after our own release.
const HELD: &str = "#owner = :me AND #fence = :fence AND #exp > :now";

fn held(config: &TableConfig, lease: &Lease, now_ms: u64) -> (Item, BTreeMap<String, String>, Item) {
    let a = &config.attributes;
    let names = BTreeMap::from([
        ("#owner".to_string(), a.owner.clone()),
        ("#fence".to_string(), a.fence.clone()),
        ("#exp".to_string(), a.expires_at_ms.clone()),
    ]);
    let values = Item::from([
        (":me".to_string(), s(&lease.owner)),
        (":fence".to_string(), n(lease.fence)),
        (":now".to_string(), n(now_ms)),
    ]);
    (key(config, &lease.id), names, values)
}

/// The ConditionCheck on the lease item: still held at the writer's wall time `now_ms`.
pub fn lease_condition(config: &TableConfig, lease: &Lease, now_ms: u64) -> ConditionCheck {
    let (key, names, values) = held(config, lease, now_ms);
    ConditionCheck {
        table_name: config.table_name.clone(),
        key,
        condition_expression: HELD.into(),
        expression_attribute_names: names,
        expression_attribute_values: values,
        return_values_on_condition_check_failure: None,
    }
}

/// The lease action of a checkpointing write: `last_seq = seq` under the lease condition, only
/// forward; a failed condition returns the old item (to tell `Lost` from `SeqNotIncreasing`).
pub fn checkpoint_update(config: &TableConfig, lease: &Lease, now_ms: u64, seq: u64) -> Update {
    let (key, mut names, mut values) = held(config, lease, now_ms);
    names.insert("#seq".into(), config.attributes.last_seq.clone());
    values.insert(":seq".into(), n(seq));
    Update {
        table_name: config.table_name.clone(),
        key,
        update_expression: "SET #seq = :seq".into(),
        condition_expression: Some(format!("{HELD} AND (attribute_not_exists(#seq) OR #seq < :seq)")),
        expression_attribute_names: names,
        expression_attribute_values: values,
        return_values_on_condition_check_failure: Some("ALL_OLD".into()),
    }
}

/// What a cancelled transaction's reasons (lease action first) mean.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Cancelled {
    LeaseLost,
    WriteCondition(usize),
    Retry,
    Other,
}

pub(crate) fn cancellation_verdict(codes: &[&str]) -> Cancelled {
    if codes.first() == Some(&"ConditionalCheckFailed") {
        return Cancelled::LeaseLost;
    }
    if let Some(i) = codes.iter().position(|c| *c == "ConditionalCheckFailed") {
        return Cancelled::WriteCondition(i - 1);
    }
    // `ReplicatedWriteConflict`: the reason a multi-Region strong consistency table would give
    // for an item another Region is writing, should it ever list one for a transaction.
    let retried =
        ["TransactionConflict", "ReplicatedWriteConflict", "ThrottlingError", "ProvisionedThroughputExceeded"];
    if codes.iter().any(|c| retried.contains(c)) {
        return Cancelled::Retry;
    }
    Cancelled::Other
}

/// A fenced write: `writes` caller's actions (1 to [`MAX_FENCED_WRITES`]) applied atomically with
/// the lease's action. The request carries only the lease's action: the driver appends the
/// caller's actions after it, in order, on every attempt. `Lost` when the lease is no longer
/// ours; `SeqNotIncreasing` (checkpointing writes) when `seq` is not past `last_seq`; a failed
/// condition of one of the caller's actions is a `Store` error naming its position. Throttling,
/// conflicts, timeouts and 5xx are retried for up to one renew interval with the same client
/// request token, so an applied transaction is not applied twice.
#[derive(Debug, Clone)]
pub struct FencedWrite {
    config: TableConfig,
    lease: Lease,
    seq: Option<u64>,
    request: TransactWriteItems,
    budget: Budget,
}

impl FencedWrite {
    /// `token`: the client request token (any unique string of up to 36 characters), `now_ms`:
    /// the writer's wall clock, `writes`: how many actions the caller appends.
    pub fn new(config: &TableConfig, lease: &Lease, now_ms: u64, writes: usize, token: &str) -> crate::Result<Self> {
        Self::build(config, lease, None, now_ms, writes, token)
    }

    /// A fenced write that also checkpoints `seq`: the output and the resume point move together.
    pub fn with_checkpoint(
        config: &TableConfig,
        lease: &Lease,
        now_ms: u64,
        seq: u64,
        writes: usize,
        token: &str,
    ) -> crate::Result<Self> {
        Self::build(config, lease, Some(seq), now_ms, writes, token)
    }

    fn build(
        config: &TableConfig,
        lease: &Lease,
        seq: Option<u64>,
        now_ms: u64,
        writes: usize,
        token: &str,
    ) -> crate::Result<Self> {
        if writes == 0 || writes > MAX_FENCED_WRITES {
            return Err(Error::invalid("writes", format!("1 to {MAX_FENCED_WRITES} actions, got {writes}")));
        }
        let action = match seq {
            Some(seq) => {
                TransactWriteItem { update: Some(checkpoint_update(config, lease, now_ms, seq)), ..Default::default() }
            }
            None => TransactWriteItem {
                condition_check: Some(lease_condition(config, lease, now_ms)),
                ..Default::default()
            },
        };
        let request =
            TransactWriteItems { transact_items: vec![action], client_request_token: Some(token.to_string()) };
        Ok(Self {
            config: config.clone(),
            lease: lease.clone(),
            seq,
            request,
            // Like a checkpoint: retries end at the lease's deadline, and then the lease is lost.
            budget: Budget::until(lease.deadline_mono_ms),
        })
    }

    fn cancelled(&mut self, reasons: Vec<CancellationReason>, input: &Input) -> Step<()> {
        let codes: Vec<&str> = reasons.iter().map(|r| r.code.as_deref().unwrap_or("None")).collect();
        match cancellation_verdict(&codes) {
            Cancelled::LeaseLost => {
                // A checkpointing write returns the old lease item: still ours means the
                // sequence number was the condition that failed.
                let old = reasons.first().and_then(|r| r.item.as_ref()).map(|o| item_from_attrs(&self.config, o));
                let ours = old
                    .as_ref()
                    .is_some_and(|o| o.owner.as_deref() == Some(&self.lease.owner) && o.fence == self.lease.fence);
                match (self.seq, old.and_then(|o| o.last_seq).filter(|_| ours)) {
                    (Some(seq), Some(last_seq)) => {
                        Step::Fail(Error::SeqNotIncreasing { id: self.lease.id.clone(), last_seq, seq })
                    }
                    _ => Step::Fail(Error::Lost { id: self.lease.id.clone() }),
                }
            }
            Cancelled::WriteCondition(i) => {
                Step::Fail(Error::Store(format!("fenced write {i}: its own condition failed")))
            }
            Cancelled::Retry => {
                tracing::debug!(connection_id = %self.lease.id, ?codes, "fenced write retried");
                self.budget.pause(input, Cause::Throttled)
            }
            Cancelled::Other => Step::Fail(Error::Store(format!("transaction cancelled: {codes:?}"))),
        }
    }
}

impl Operation for FencedWrite {
    type Output = ();
    fn next(&mut self, input: Input) -> Step<()> {
        let id = self.lease.id.clone();
        super::ops::lost_when_exhausted(self.step(input), &id)
    }
}

impl FencedWrite {
    fn step(&mut self, mut input: Input) -> Step<()> {
        let Some(answer) = input.answer.take() else {
            return self.budget.send(input.mono_ms, Request::TransactWriteItems(self.request.clone()));
        };
        match triage(answer, &self.config.table_name) {
            Triage::Ok(_) => Step::Done(()),
            Triage::Canceled(reasons) => self.cancelled(reasons, &input),
            Triage::Retry(cause) => self.budget.pause(&input, cause),
            // The token makes a repeat of an applied transaction a no-op.
            Triage::Ambiguous => {
                self.budget.maybe_applied = true;
                self.budget.pause(&input, Cause::Timeout)
            }
            Triage::Fail(e) => Step::Fail(e),
            Triage::Condition(_) => Step::Fail(Error::Store("a transaction fails by cancellation".into())),
        }
    }
}
