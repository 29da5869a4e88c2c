//! Fenced writes: a downstream write made conditional on still holding the lease, in one
//! TransactWriteItems. The ConditionCheck compares owner and fence, so a worker that was paused
//! past its deadline (GC, SIGSTOP) and lost the lease to a new claim cannot write any more:
//! every claim bumps the fence.

use aws_sdk_dynamodb::types::{ConditionCheck, Put, TransactWriteItem, Update};
use aws_sdk_dynamodb::Client;

use crate::dynamo::convert;
use crate::dynamo::drive;
use crate::protocol::{self, FencedWrite};
use crate::{Clock, Lease, Result, SystemClock, TableConfig};

pub use crate::protocol::MAX_FENCED_WRITES;

/// The ConditionCheck on the lease item (see [`protocol::lease_condition`]): still ours (owner
/// and fence) and not expired by the writer's clock `now_ms`.
pub fn lease_condition(config: &TableConfig, lease: &Lease, now_ms: u64) -> Result<ConditionCheck> {
    Ok(convert::condition_check(&protocol::lease_condition(config, lease, now_ms))?)
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
/// of `writes` is a `Store` error naming its position. Throttling, transaction conflicts and
/// ambiguous attempts are retried with backoff for up to one renew interval; every attempt
/// carries the same client request token, so a retried transaction that had already been
/// applied is not applied twice. (The decisions are [`protocol::FencedWrite`]'s.)
pub async fn fenced_write(
    client: &Client,
    config: &TableConfig,
    lease: &Lease,
    now_ms: u64,
    writes: Vec<TransactWriteItem>,
) -> Result<()> {
    write_on(client, &SystemClock, config, lease, now_ms, None, writes).await
}

/// The lease action of a checkpointing write (see [`protocol::checkpoint_update`]): sets
/// `last_seq = seq` on the lease item under the lease check's condition, and only forward.
pub fn checkpoint_update(config: &TableConfig, lease: &Lease, now_ms: u64, seq: u64) -> Result<Update> {
    Ok(convert::update(&protocol::checkpoint_update(config, lease, now_ms, seq))?)
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
    write_on(client, &SystemClock, config, lease, now_ms, Some(seq), writes).await
}

/// A fenced write (with the checkpoint `seq`, if any) whose retries are timed on `clock`: a
/// connection's writes run on its table's clock, as its deadline does.
async fn write_on(
    client: &Client,
    clock: &dyn Clock,
    config: &TableConfig,
    lease: &Lease,
    now_ms: u64,
    seq: Option<u64>,
    writes: Vec<TransactWriteItem>,
) -> Result<()> {
    let op = match seq {
        Some(seq) => FencedWrite::with_checkpoint(config, lease, now_ms, seq, writes.len(), &token())?,
        None => FencedWrite::new(config, lease, now_ms, writes.len(), &token())?,
    };
    drive(client, clock, op, &writes, None).await
}

/// A client request token, the same on every attempt of one write.
fn token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl crate::worker::Connection {
    /// [`fenced_put`] with this connection's current lease and the store's clock. Refused
    /// without a request once the lease is lost, past its deadline or given up; a `Lost`
    /// answer cancels the token.
    pub async fn fenced_put(&self, client: &Client, put: Put) -> Result<()> {
        self.fenced_write(client, vec![TransactWriteItem::builder().put(put).build()]).await
    }

    /// [`fenced_write`] with this connection's current lease and the store's clock. Like every
    /// call through the connection, it resolves by the lease's local deadline at the latest.
    pub async fn fenced_write(&self, client: &Client, writes: Vec<TransactWriteItem>) -> Result<()> {
        let lease = self.lock_to_act().await?.clone();
        let store = self.store();
        let (config, clock) = (store.config(), store.clock());
        let result = self.by_deadline(write_on(client, clock, config, &lease, clock.now_ms(), None, writes)).await;
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
        // Held across the write so a renewal cannot replace the lease under the new last_seq.
        let mut lease = self.lock_to_act().await?;
        let store = self.store();
        let (config, clock) = (store.config(), store.clock());
        let write = write_on(client, clock, config, &lease, clock.now_ms(), Some(seq), writes);
        let result = self.by_deadline(write).await;
        if result.is_ok() {
            lease.last_seq = Some(seq);
        }
        self.note(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::types::AttributeValue;

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
