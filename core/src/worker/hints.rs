//! The SQS hint loop: a START hint makes the worker try to claim the work at once instead of at
//! the next orphan poll. Only a hint: the claim is an ordinary conditional acquire, so a stale,
//! repeated or misdirected hint costs one write at most.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::{ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message};
use futures::StreamExt;
use tracing::{debug, warn};

use super::decide::{hint_batch_size, hint_retry_ms, HAND_OVER_TIMEOUT, HINT_CLAIM_CONCURRENCY, POLL_ANSWER_MARGIN};
use super::{Claim, HintQueue, Inner};
use crate::Hint;

pub(crate) async fn hint_loop(inner: Arc<Inner>, queue: HintQueue) {
    let mut failures = 0u32;
    loop {
        // Only take hints while there is room: a full worker leaves them to the others. Shutdown
        // comes first: once it is requested no new long poll starts (room is always there when
        // idle, and an unbiased pick would often start one more).
        let room = tokio::select! {
            biased;
            () = inner.shutdown.cancelled() => return,
            permit = inner.permits.clone().acquire_owned() => permit,
        };
        drop(room);
        // A long poll is not abandoned at shutdown: SQS may still hand messages to a poll whose
        // client has gone, and they then stay invisible for the whole visibility timeout. The
        // poll runs out (at most `wait`) and what it brings is given back at once. One the
        // server has not answered `POLL_ANSWER_MARGIN` after its wait is over (a connection
        // lost, an SQS client without timeouts) counts as failed, so it cannot hold the worker.
        let poll = queue
            .client
            .receive_message()
            .queue_url(&queue.queue_url)
            .max_number_of_messages(hint_batch_size(inner.room().max(1)))
            .wait_time_seconds(queue.wait.as_secs() as i32)
            .send();
        let received = match tokio::time::timeout(queue.wait + POLL_ANSWER_MARGIN, poll).await {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => Err(aws_sdk_sqs::error::DisplayErrorContext(&e).to_string()),
            Err(_) => Err(format!("no answer {POLL_ANSWER_MARGIN:?} after the {:?} long poll", queue.wait)),
        };
        let messages = match received {
            Ok(out) => {
                failures = 0;
                out.messages.unwrap_or_default()
            }
            Err(error) => {
                failures += 1;
                let delay = hint_retry_ms(failures, rand::random());
                warn!(%error, retry_in_ms = delay, "hint receive failed");
                tokio::select! {
                    biased;
                    () = inner.shutdown.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(delay)) => continue,
                }
            }
        };
        if messages.is_empty() {
            continue;
        }
        inner.counters.add(&inner.counters.hints_received, messages.len() as u64);
        // Hints come in tens (a peer's shutdown, a batch of STARTs): one index query finds all
        // the work they point at and claims it in parallel. At the fair share, one read of the
        // sessions first says whether the share has grown (a peer left).
        inner.poll_orphans_now.notify_one();
        if !inner.below_claim_limit() {
            let refreshed = super::reconcile::refresh_claim_limit(&inner);
            let _ = tokio::time::timeout(inner.settings.orphan_interval, refreshed).await;
        }
        let outcomes: Vec<(Message, Claim)> = futures::stream::iter(messages)
            .map(|m| {
                let inner = &inner;
                async move {
                    let outcome = match m.body().map(Hint::from_json) {
                        Some(Ok(hint)) => inner.claim(&hint.connection_id, "hint").await,
                        Some(Err(e)) => {
                            warn!(message_id = m.message_id().unwrap_or_default(), error = %e, "unreadable hint dropped");
                            Claim::Failed
                        }
                        None => Claim::Failed,
                    };
                    (m, outcome)
                }
            })
            .buffer_unordered(HINT_CLAIM_CONCURRENCY)
            .collect()
            .await;
        settle(&queue, outcomes).await;
    }
}

/// Deletes every handled hint (claimed or not: it was only a hint); a hint this worker had no
/// room for is made visible again at once, for another worker.
async fn settle(queue: &HintQueue, outcomes: Vec<(Message, Claim)>) {
    let mut delete = Vec::new();
    let mut give_back = Vec::new();
    for (i, (m, outcome)) in outcomes.iter().enumerate() {
        let Some(receipt) = m.receipt_handle() else { continue };
        debug!(message_id = m.message_id().unwrap_or_default(), outcome = ?outcome, "hint handled");
        if matches!(outcome, Claim::NoCapacity | Claim::Stopping) {
            give_back.push(
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(receipt)
                    .visibility_timeout(0)
                    .build(),
            );
        } else {
            delete.push(DeleteMessageBatchRequestEntry::builder().id(i.to_string()).receipt_handle(receipt).build());
        }
    }
    let delete: Vec<_> = delete.into_iter().filter_map(|e| e.ok()).collect();
    let give_back: Vec<_> = give_back.into_iter().filter_map(|e| e.ok()).collect();
    if !delete.is_empty() {
        let sent =
            queue.client.delete_message_batch().queue_url(&queue.queue_url).set_entries(Some(delete)).send().await;
        match sent {
            Ok(out) if !out.failed().is_empty() => warn!(failed = out.failed().len(), "some hints not deleted"),
            Ok(_) => {}
            Err(e) => warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "hint delete failed"),
        }
    }
    if !give_back.is_empty() {
        let sent = queue
            .client
            .change_message_visibility_batch()
            .queue_url(&queue.queue_url)
            .set_entries(Some(give_back))
            .send()
            .await;
        if let Err(e) = sent {
            warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "hint give-back failed");
        }
    }
}

/// Hints work this worker released on shutdown, so another worker claims it at once instead
/// of at its next orphan poll. Best effort: the orphan index finds whatever a lost hint leaves.
pub(crate) async fn hand_over(queue: &HintQueue, id: &str) {
    let sent = queue.client.send_message().queue_url(&queue.queue_url).message_body(Hint::new(id).to_json()).send();
    match tokio::time::timeout(HAND_OVER_TIMEOUT, sent).await {
        Ok(Ok(_)) => debug!(connection_id = %id, "released work hinted to the fleet"),
        Ok(Err(e)) => {
            warn!(connection_id = %id, error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "hand-over hint failed")
        }
        Err(_) => warn!(connection_id = %id, "hand-over hint timed out"),
    }
}
