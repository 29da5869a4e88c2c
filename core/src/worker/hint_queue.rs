//! The SQS side of hints: a START hint makes the worker try to claim the work at once instead of
//! at the next orphan poll. Only a hint: the claim is an ordinary conditional acquire, so a
//! stale, repeated or misdirected hint costs one write at most. The engine decides what to
//! receive, claim, settle and send; these run it against SQS.

use std::time::Duration;

use aws_sdk_sqs::types::{ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry};
use tracing::{debug, warn};

use super::decide::{HAND_OVER_TIMEOUT, POLL_ANSWER_MARGIN};
use super::HintQueue;
use crate::engine::{Event, HintMessage};

/// One long poll of the hint queue, answered as the engine's [`Event::Hints`]. A long poll is
/// not abandoned at shutdown: SQS may still hand messages to a poll whose client has gone, and
/// they then stay invisible for the whole visibility timeout; the engine gives back what it
/// brings. One the server has not answered `POLL_ANSWER_MARGIN` after its wait is over (a
/// connection lost, an SQS client without timeouts) counts as failed.
pub(crate) async fn receive(queue: HintQueue, max: usize, wait: Duration) -> Event {
    let poll = queue
        .client
        .receive_message()
        .queue_url(&queue.queue_url)
        .max_number_of_messages(max.clamp(1, 10) as i32)
        .wait_time_seconds(wait.as_secs() as i32)
        .send();
    let received = match tokio::time::timeout(wait + POLL_ANSWER_MARGIN, poll).await {
        Ok(Ok(out)) => Ok(out
            .messages
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| {
                let receipt = m.receipt_handle?;
                Some(HintMessage { receipt, body: m.body })
            })
            .collect()),
        Ok(Err(e)) => Err(aws_sdk_sqs::error::DisplayErrorContext(&e).to_string()),
        Err(_) => Err(format!("no answer {POLL_ANSWER_MARGIN:?} after the {wait:?} long poll")),
    };
    Event::Hints { received }
}

/// Deletes the handled hints, makes `give_back` visible again at once and `defer` after
/// `defer_ms`.
pub(crate) async fn settle(
    queue: HintQueue,
    delete: Vec<String>,
    give_back: Vec<String>,
    defer: Vec<String>,
    defer_ms: u64,
) {
    debug!(deleted = delete.len(), given_back = give_back.len(), deferred = defer.len(), "hints settled");
    if !delete.is_empty() {
        let entries: Vec<_> = delete
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                DeleteMessageBatchRequestEntry::builder().id(i.to_string()).receipt_handle(r).build().ok()
            })
            .collect();
        let sent =
            queue.client.delete_message_batch().queue_url(&queue.queue_url).set_entries(Some(entries)).send().await;
        match sent {
            Ok(out) if !out.failed().is_empty() => warn!(failed = out.failed().len(), "some hints not deleted"),
            Ok(_) => {}
            Err(e) => warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "hint delete failed"),
        }
    }
    let visible_in_s = defer_ms.div_ceil(1_000).min(43_200) as i32;
    let entries: Vec<_> = give_back
        .iter()
        .map(|r| (r, 0))
        .chain(defer.iter().map(|r| (r, visible_in_s)))
        .enumerate()
        .filter_map(|(i, (r, s))| {
            ChangeMessageVisibilityBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(r)
                .visibility_timeout(s)
                .build()
                .ok()
        })
        .collect();
    if !entries.is_empty() {
        let sent = queue
            .client
            .change_message_visibility_batch()
            .queue_url(&queue.queue_url)
            .set_entries(Some(entries))
            .send()
            .await;
        if let Err(e) = sent {
            warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "hint give-back failed");
        }
    }
}

/// Hints work this worker released on shutdown, so another worker claims it at once instead
/// of at its next orphan poll. Best effort: the orphan index finds whatever a lost hint leaves.
pub(crate) async fn hand_over(queue: &HintQueue, id: &str, body: String) {
    let sent = queue.client.send_message().queue_url(&queue.queue_url).message_body(body).send();
    match tokio::time::timeout(HAND_OVER_TIMEOUT, sent).await {
        Ok(Ok(_)) => debug!(connection_id = %id, "released work hinted to the fleet"),
        Ok(Err(e)) => {
            warn!(connection_id = %id, error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "hand-over hint failed")
        }
        Err(_) => warn!(connection_id = %id, "hand-over hint timed out"),
    }
}
