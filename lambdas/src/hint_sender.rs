//! Sending START hints ([`leaselock::Hint`], the worker's message format). A hint only speeds
//! things up; the lease decides ownership, and workers find unhinted work through the orphan index.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
pub use leaselock::Hint;

/// SendMessageBatch's limit.
pub const MAX_BATCH: usize = 10;

/// The whole request failed (nothing is known to have been sent).
#[derive(Debug, Clone, thiserror::Error)]
#[error("sending hints failed: {0}")]
pub struct HintError(pub String);

/// Where hints go: SQS in Lambda, memory in tests.
#[async_trait::async_trait]
pub trait HintSender: Send + Sync {
    /// Sends one hint.
    async fn send(&self, hint: &Hint) -> Result<(), HintError>;

    /// Sends up to [`MAX_BATCH`] hints in one request; returns the positions of the hints that
    /// were not accepted (the caller may retry them).
    async fn send_batch(&self, hints: &[Hint]) -> Result<Vec<usize>, HintError>;
}

/// Hints on an SQS queue.
#[derive(Debug, Clone)]
pub struct SqsHints {
    client: aws_sdk_sqs::Client,
    queue_url: String,
}

impl SqsHints {
    pub fn new(client: aws_sdk_sqs::Client, queue_url: impl Into<String>) -> Self {
        SqsHints { client, queue_url: queue_url.into() }
    }

    pub fn client(&self) -> &aws_sdk_sqs::Client {
        &self.client
    }

    pub fn queue_url(&self) -> &str {
        &self.queue_url
    }
}

fn sqs_error<E: std::error::Error + 'static>(e: E) -> HintError {
    HintError(aws_sdk_sqs::error::DisplayErrorContext(&e).to_string())
}

#[async_trait::async_trait]
impl HintSender for SqsHints {
    async fn send(&self, hint: &Hint) -> Result<(), HintError> {
        self.client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(hint.to_json())
            .send()
            .await
            .map_err(sqs_error)?;
        Ok(())
    }

    async fn send_batch(&self, hints: &[Hint]) -> Result<Vec<usize>, HintError> {
        if hints.is_empty() {
            return Ok(Vec::new());
        }
        assert!(hints.len() <= MAX_BATCH, "at most {MAX_BATCH} hints per batch, got {}", hints.len());
        let entries = hints
            .iter()
            .enumerate()
            .map(|(i, h)| SendMessageBatchRequestEntry::builder().id(i.to_string()).message_body(h.to_json()).build())
            .collect::<Result<Vec<_>, _>>()
            .map_err(sqs_error)?;
        let out = self
            .client
            .send_message_batch()
            .queue_url(&self.queue_url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(sqs_error)?;
        let mut failed: Vec<usize> = out.failed().iter().filter_map(|f| f.id().parse().ok()).collect();
        // An entry reported neither way counts as failed: retrying a hint is harmless.
        let reported = out.successful().len() + out.failed().len();
        if reported < hints.len() {
            let ok: Vec<usize> = out.successful().iter().filter_map(|s| s.id().parse().ok()).collect();
            failed = (0..hints.len()).filter(|i| !ok.contains(i)).collect();
        }
        Ok(failed)
    }
}

/// Hints kept in memory, with failures injectable per entry.
#[derive(Debug, Default)]
pub struct MemoryHints {
    sent: Mutex<Vec<Hint>>,
    fail_entries: AtomicUsize,
    fail_requests: AtomicUsize,
}

impl MemoryHints {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every hint accepted so far, in order.
    pub fn sent(&self) -> Vec<Hint> {
        self.sent.lock().expect("hints poisoned").clone()
    }

    /// The next `n` hints offered are refused one by one (as SQS does for single batch entries).
    pub fn fail_next_entries(&self, n: usize) {
        self.fail_entries.store(n, Ordering::SeqCst);
    }

    /// The next `n` requests fail as a whole.
    pub fn fail_next_requests(&self, n: usize) {
        self.fail_requests.store(n, Ordering::SeqCst);
    }

    fn take(counter: &AtomicUsize) -> bool {
        counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    }
}

#[async_trait::async_trait]
impl HintSender for MemoryHints {
    async fn send(&self, hint: &Hint) -> Result<(), HintError> {
        match self.send_batch(std::slice::from_ref(hint)).await? {
            failed if failed.is_empty() => Ok(()),
            _ => Err(HintError("refused".into())),
        }
    }

    async fn send_batch(&self, hints: &[Hint]) -> Result<Vec<usize>, HintError> {
        assert!(hints.len() <= MAX_BATCH, "at most {MAX_BATCH} hints per batch, got {}", hints.len());
        if Self::take(&self.fail_requests) {
            return Err(HintError("injected request failure".into()));
        }
        let mut failed = Vec::new();
        let mut sent = self.sent.lock().expect("hints poisoned");
        for (i, hint) in hints.iter().enumerate() {
            if Self::take(&self.fail_entries) {
                failed.push(i);
            } else {
                sent.push(hint.clone());
            }
        }
        Ok(failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_hints_refuse_what_they_are_told_to() {
        let hints = MemoryHints::new();
        hints.fail_next_entries(2);
        let batch: Vec<Hint> = (0..4).map(|i| Hint::new(format!("s{i}"))).collect();
        assert_eq!(hints.send_batch(&batch).await.unwrap(), vec![0, 1]);
        assert_eq!(hints.sent(), batch[2..].to_vec());
        hints.fail_next_requests(1);
        assert!(hints.send(&batch[0]).await.is_err());
        hints.send(&batch[0]).await.unwrap();
        assert_eq!(hints.sent().len(), 3);
    }
}
