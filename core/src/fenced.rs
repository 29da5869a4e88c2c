//! Fenced writes: a downstream write made conditional on still holding the lease, in one
//! TransactWriteItems. The ConditionCheck compares owner and fence, so a worker that was paused
//! past its deadline (GC, SIGSTOP) and lost the lease to a new claim cannot write any more:
//! every claim bumps the fence.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use aws_sdk_dynamodb::Client;
use tracing::debug;

use crate::lease::backoff_ms;
use crate::{Clock, Error, Lease, Result, SystemClock, TableConfig};

/// DynamoDB's limit of actions in one transaction; one is the lease check.
pub const MAX_FENCED_WRITES: usize = 99;

/// The lease condition: still ours (`owner` and `fence`) and not released or expired by our own
/// clock (`expires_at > now`). Owner and fence are what refuse a zombie after a takeover; the
/// expiry part also refuses writes after our own release.
const HELD: &str = "#owner = :me AND #fence = :fence AND #exp > :now";

/// The lease item's key, and the names and values [`HELD`] refers to.
type Held = (HashMap<String, AttributeValue>, HashMap<String, String>, HashMap<String, AttributeValue>);

fn held(config: &TableConfig, lease: &Lease, now_ms: u64) -> Held {
    let a = &config.attributes;
    let key = HashMap::from([(a.id.clone(), AttributeValue::S(config.key(&lease.id)))]);
    let names = HashMap::from([
        ("#owner".to_string(), a.owner.clone()),
        ("#fence".to_string(), a.fence.clone()),
        ("#exp".to_string(), a.expires_at_ms.clone()),
    ]);
    let values = HashMap::from([
        (":me".to_string(), AttributeValue::S(lease.owner.clone())),
        (":fence".to_string(), AttributeValue::N(lease.fence.to_string())),
        (":now".to_string(), AttributeValue::N(now_ms.to_string())),
    ]);
    (key, names, values)
}

/// The ConditionCheck on the lease item: [`HELD`].
pub fn lease_condition(config: &TableConfig, lease: &Lease, now_ms: u64) -> Result<ConditionCheck> {
    let (key, names, values) = held(config, lease, now_ms);
    ConditionCheck::builder()
        .table_name(&config.table_name)
        .set_key(Some(key))
        .condition_expression(HELD)
        .set_expression_attribute_names(Some(names))
        .set_expression_attribute_values(Some(values))
        .build()
        .map_err(|e| Error::invalid("request", e.to_string()))
}

/// Writes `put` only while `lease` is held; `Lost` when the lease is no longer ours.
///
/// ```no_run
/// # async fn demo(client: aws_sdk_dynamodb::Client, lease: leaselock::Lease) -> leaselock::Result<()> {
/// use aws_sdk_dynamodb::types::{AttributeValue, Put};
/// use leaselock::{fenced_put, TableConfig};
///
/// let put = Put::builder()
///     .table_name("messages")
///     .item("stream", AttributeValue::S(lease.id.clone()))
///     .item("seq", AttributeValue::N("42".into()))
///     .build()
///     .unwrap();
/// fenced_put(&client, &TableConfig::new("leases"), &lease, put).await?;
/// # Ok(()) }
/// ```
pub async fn fenced_put(client: &Client, config: &TableConfig, lease: &Lease, put: Put) -> Result<()> {
    fenced_write(client, config, lease, SystemClock.now_ms(), vec![TransactWriteItem::builder().put(put).build()]).await
}

/// Applies `writes` (at most [`MAX_FENCED_WRITES`]) atomically with the lease check, `now_ms`
/// being the writer's wall clock. `Lost` when the lease check fails; a failed condition of one
/// of `writes` is a `Store` error naming its position. Throttling and transaction conflicts are
/// retried with backoff for up to one renew interval; every attempt carries the same client
/// request token, so a retried transaction that had already been applied is not applied twice.
pub async fn fenced_write(
    client: &Client,
    config: &TableConfig,
    lease: &Lease,
    now_ms: u64,
    writes: Vec<TransactWriteItem>,
) -> Result<()> {
    let check = TransactWriteItem::builder().condition_check(lease_condition(config, lease, now_ms)?).build();
    transact(client, config, lease, check, writes).await
}

/// The lease action of a checkpointing write: sets `last_seq = seq` on the lease item under the
/// lease check's condition, and only forward.
pub fn checkpoint_update(config: &TableConfig, lease: &Lease, now_ms: u64, seq: u64) -> Result<Update> {
    let (key, mut names, mut values) = held(config, lease, now_ms);
    names.insert("#seq".into(), config.attributes.last_seq.clone());
    values.insert(":seq".into(), AttributeValue::N(seq.to_string()));
    Update::builder()
        .table_name(&config.table_name)
        .set_key(Some(key))
        .update_expression("SET #seq = :seq")
        .condition_expression(format!("{HELD} AND (attribute_not_exists(#seq) OR #seq < :seq)"))
        .set_expression_attribute_names(Some(names))
        .set_expression_attribute_values(Some(values))
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .build()
        .map_err(|e| Error::invalid("request", e.to_string()))
}

/// Applies `writes` and the checkpoint `seq` in one transaction under the lease: the output and
/// the resume point move together, so a takeover neither loses nor repeats a message. `Lost`
/// when the lease is no longer ours; `SeqNotIncreasing` when `seq` is not past `last_seq`.
pub async fn fenced_write_with_checkpoint(
    client: &Client,
    config: &TableConfig,
    lease: &Lease,
    now_ms: u64,
    seq: u64,
    writes: Vec<TransactWriteItem>,
) -> Result<()> {
    let update = TransactWriteItem::builder().update(checkpoint_update(config, lease, now_ms, seq)?).build();
    transact(client, config, lease, update, writes).await.map_err(|e| match e {
        Error::SeqNotIncreasing { id, last_seq, .. } => Error::SeqNotIncreasing { id, last_seq, seq },
        e => e,
    })
}

/// One TransactWriteItems: the lease action first, then `writes`.
async fn transact(
    client: &Client,
    config: &TableConfig,
    lease: &Lease,
    lease_action: TransactWriteItem,
    writes: Vec<TransactWriteItem>,
) -> Result<()> {
    if writes.is_empty() || writes.len() > MAX_FENCED_WRITES {
        return Err(Error::invalid("writes", format!("1 to {MAX_FENCED_WRITES} actions, got {}", writes.len())));
    }
    let mut items = Vec::with_capacity(writes.len() + 1);
    items.push(lease_action);
    items.extend(writes);
    let token = format!("{:032x}", rand::random::<u128>());
    let until = tokio::time::Instant::now() + config.renew_interval;
    let mut attempt = 0;
    loop {
        let sent = client
            .transact_write_items()
            .set_transact_items(Some(items.clone()))
            .client_request_token(&token)
            .send()
            .await;
        let retry = match sent {
            Ok(_) => return Ok(()),
            Err(e) => match classify(config, lease, e) {
                Verdict::Retry(msg) => msg,
                Verdict::Fail(err) => return Err(err),
            },
        };
        let delay = Duration::from_millis(backoff_ms(attempt, 25, 1_000, rand::random::<f64>()));
        if tokio::time::Instant::now() + delay >= until {
            return Err(Error::Throttled);
        }
        debug!(connection_id = %lease.id, attempt, reason = %retry, "fenced write retried");
        tokio::time::sleep(delay).await;
        attempt += 1;
    }
}

impl crate::worker::Connection {
    /// [`fenced_put`] with this connection's current lease and the store's clock. Refused
    /// without a request once the lease is lost, past its deadline or given up; a `Lost`
    /// answer cancels the token.
    pub async fn fenced_put(&self, client: &Client, put: Put) -> Result<()> {
        self.fenced_write(client, vec![TransactWriteItem::builder().put(put).build()]).await
    }

    /// [`fenced_write`] with this connection's current lease and the store's clock.
    pub async fn fenced_write(&self, client: &Client, writes: Vec<TransactWriteItem>) -> Result<()> {
        self.ensure_may_act()?;
        let lease = self.lease().await;
        let store = self.store();
        let result = fenced_write(client, store.config(), &lease, store.clock().now_ms(), writes).await;
        self.note(result)
    }

    /// [`fenced_write_with_checkpoint`] with this connection's current lease: `writes` and the
    /// checkpoint `seq` land together or not at all.
    pub async fn fenced_write_with_checkpoint(
        &self,
        client: &Client,
        seq: u64,
        writes: Vec<TransactWriteItem>,
    ) -> Result<()> {
        self.ensure_may_act()?;
        // Held across the write so a renewal cannot replace the lease under the new last_seq.
        let mut lease = self.lease_guard().await;
        let store = self.store();
        let result =
            fenced_write_with_checkpoint(client, store.config(), &lease, store.clock().now_ms(), seq, writes).await;
        if result.is_ok() {
            lease.last_seq = Some(seq);
        }
        self.note(result)
    }
}

enum Verdict {
    Retry(String),
    Fail(Error),
}

/// Throttling and conflicts are worth another try; a failed lease check means the lease is gone.
fn classify<R>(config: &TableConfig, lease: &Lease, err: SdkError<TransactWriteItemsError, R>) -> Verdict
where
    R: std::fmt::Debug,
{
    let service = match err {
        SdkError::ServiceError(s) => s.into_err(),
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            // The token makes a repeat of an applied transaction a no-op.
            return Verdict::Retry(format!("{}", aws_smithy_types::error::display::DisplayErrorContext(&err)));
        }
        other => {
            return Verdict::Fail(Error::Store(format!(
                "{}",
                aws_smithy_types::error::display::DisplayErrorContext(&other)
            )))
        }
    };
    match &service {
        TransactWriteItemsError::TransactionCanceledException(cancelled) => {
            let codes: Vec<&str> =
                cancelled.cancellation_reasons().iter().map(|r| r.code().unwrap_or("None")).collect();
            match cancellation_verdict(&codes) {
                Cancelled::LeaseLost => {
                    // A checkpointing write returns the old lease item: still ours means the
                    // sequence number was the condition that failed.
                    let old = cancelled.cancellation_reasons().first().and_then(|r| r.item());
                    let field =
                        |name: &str| old.and_then(|o| o.get(name)).and_then(|v| v.as_n().ok().or(v.as_s().ok()));
                    let a = &config.attributes;
                    let ours =
                        field(&a.owner) == Some(&lease.owner) && field(&a.fence) == Some(&lease.fence.to_string());
                    match field(&a.last_seq).and_then(|s| s.parse().ok()).filter(|_| ours) {
                        Some(last_seq) => {
                            Verdict::Fail(Error::SeqNotIncreasing { id: lease.id.clone(), last_seq, seq: 0 })
                        }
                        None => Verdict::Fail(Error::Lost { id: lease.id.clone() }),
                    }
                }
                Cancelled::WriteCondition(i) => {
                    Verdict::Fail(Error::Store(format!("fenced write {i}: its own condition failed")))
                }
                Cancelled::Retry => Verdict::Retry(format!("transaction cancelled: {codes:?}")),
                Cancelled::Other => Verdict::Fail(Error::Store(format!("transaction cancelled: {codes:?}"))),
            }
        }
        TransactWriteItemsError::TransactionInProgressException(_)
        | TransactWriteItemsError::ProvisionedThroughputExceededException(_)
        | TransactWriteItemsError::RequestLimitExceeded(_)
        | TransactWriteItemsError::ThrottlingException(_)
        | TransactWriteItemsError::InternalServerError(_) => {
            Verdict::Retry(format!("{}: {}", service.code().unwrap_or_default(), service.message().unwrap_or_default()))
        }
        _ => Verdict::Fail(Error::Store(format!(
            "{}: {}",
            service.code().unwrap_or_default(),
            service.message().unwrap_or_default()
        ))),
    }
}

/// What a cancelled transaction's reasons (lease check first) mean.
#[derive(Debug, PartialEq, Eq)]
enum Cancelled {
    LeaseLost,
    WriteCondition(usize),
    Retry,
    Other,
}

fn cancellation_verdict(codes: &[&str]) -> Cancelled {
    if codes.first() == Some(&"ConditionalCheckFailed") {
        return Cancelled::LeaseLost;
    }
    if let Some(i) = codes.iter().position(|c| *c == "ConditionalCheckFailed") {
        return Cancelled::WriteCondition(i - 1);
    }
    if codes.iter().any(|c| matches!(*c, "TransactionConflict" | "ThrottlingError" | "ProvisionedThroughputExceeded")) {
        return Cancelled::Retry;
    }
    Cancelled::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_check_failing_means_lost() {
        assert_eq!(cancellation_verdict(&["ConditionalCheckFailed", "None"]), Cancelled::LeaseLost);
        assert_eq!(cancellation_verdict(&["ConditionalCheckFailed", "ConditionalCheckFailed"]), Cancelled::LeaseLost);
        assert_eq!(cancellation_verdict(&["None", "None", "ConditionalCheckFailed"]), Cancelled::WriteCondition(1));
        assert_eq!(cancellation_verdict(&["None", "TransactionConflict"]), Cancelled::Retry);
        assert_eq!(cancellation_verdict(&["None", "ValidationError"]), Cancelled::Other);
    }

    #[test]
    fn condition_uses_configured_names() {
        let config = TableConfig::new("leases").key_prefix("app/");
        let lease = Lease {
            id: "s1".into(),
            owner: "w1".into(),
            fence: 4,
            expires_at_ms: 10,
            last_seq: None,
            url: None,
            desired_state: None,
            deadline_mono_ms: 0,
        };
        let check = lease_condition(&config, &lease, 99).unwrap();
        assert_eq!(check.key().get("connection_id"), Some(&AttributeValue::S("app/s1".into())));
        let names = check.expression_attribute_names().unwrap();
        assert_eq!(names.get("#fence").map(String::as_str), Some("fence"));
        assert_eq!(names.get("#exp").map(String::as_str), Some("lease_expires_at_ms"));
        let values = check.expression_attribute_values().unwrap();
        assert_eq!(values.get(":fence"), Some(&AttributeValue::N("4".into())));
        assert_eq!(values.get(":now"), Some(&AttributeValue::N("99".into())));
    }
}
