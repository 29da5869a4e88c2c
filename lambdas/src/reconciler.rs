//! The reconciler: on a schedule, finds running work that nobody holds (the sparse orphan index),
//! sends START hints for it in batches, and reports counts as EMF metrics. It never claims a
//! lease: workers do, and the lease decides.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{AttributeValue, Select};
use futures::{stream, StreamExt};
use lambda_runtime::{Diagnostic, LambdaEvent};
use leaselock::lease::claim_cutoff;
use leaselock::{DesiredState, LeaseItem, LeaseStore, LeaseTable, MemoryStore, OrphanCursor};
use serde::Serialize;
use serde_json::Value;
use tracing::{info, warn};

use crate::emf::EmfWriter;
use crate::hint::{Hint, HintSender, MAX_BATCH};

/// Orphans read per index query (default).
pub const PAGE_SIZE: usize = 1000;
/// Hint batches in flight at once (default).
pub const CONCURRENT_BATCHES: usize = 16;
/// Tries per hint batch (the first send and the retries of refused entries).
pub const SEND_ATTEMPTS: u32 = 4;
/// Tries per page of the orphan query.
pub const PAGE_ATTEMPTS: u32 = 3;

/// Counts over the orphan index, without reading the items.
#[async_trait::async_trait]
pub trait StateCounts: LeaseStore {
    /// Items whose desired state is `state`, keeping only those whose expiry is at least
    /// `min_expires_at_ms` when given.
    async fn count_by_state(&self, state: DesiredState, min_expires_at_ms: Option<u64>) -> leaselock::Result<u64>;
}

#[async_trait::async_trait]
impl StateCounts for LeaseTable {
    async fn count_by_state(&self, state: DesiredState, min_expires_at_ms: Option<u64>) -> leaselock::Result<u64> {
        let config = self.config();
        let a = &config.attributes;
        let partition = match state {
            DesiredState::Started => config.started_partition.clone(),
            DesiredState::Stopped => state.as_str().to_string(),
        };
        let mut names = HashMap::from([("#ds".to_string(), a.desired_state.clone())]);
        let mut values = HashMap::from([(":state".to_string(), AttributeValue::S(partition))]);
        let mut key_condition = "#ds = :state".to_string();
        if let Some(min) = min_expires_at_ms {
            key_condition.push_str(" AND #exp >= :min");
            names.insert("#exp".into(), a.expires_at_ms.clone());
            values.insert(":min".into(), AttributeValue::N(min.to_string()));
        }
        // Other applications may share the table under other prefixes.
        let filter = (!config.key_prefix.is_empty()).then(|| {
            names.insert("#pk".into(), a.id.clone());
            values.insert(":prefix".into(), AttributeValue::S(config.key_prefix.clone()));
            "begins_with(#pk, :prefix)".to_string()
        });
        let mut total = 0u64;
        let mut start = None;
        loop {
            let page = self
                .client()
                .query()
                .table_name(&config.table_name)
                .index_name(&config.index_name)
                .select(Select::Count)
                .key_condition_expression(&key_condition)
                .set_filter_expression(filter.clone())
                .set_expression_attribute_names(Some(names.clone()))
                .set_expression_attribute_values(Some(values.clone()))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| leaselock::Error::Store(aws_sdk_dynamodb::error::DisplayErrorContext(&e).to_string()))?;
            total += page.count().max(0) as u64;
            match page.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => return Ok(total),
            }
        }
    }
}

#[async_trait::async_trait]
impl StateCounts for MemoryStore {
    async fn count_by_state(&self, state: DesiredState, min_expires_at_ms: Option<u64>) -> leaselock::Result<u64> {
        let matches = |i: &LeaseItem| {
            // The index is sparse: only items with both a state and an expiry are in it.
            i.desired_state == Some(state)
                && i.expires_at_ms.is_some_and(|exp| min_expires_at_ms.is_none_or(|min| exp >= min))
        };
        Ok(self.items().await?.iter().filter(|i| matches(i)).count() as u64)
    }
}

/// What one run found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Items whose expiry was below this when the run started were orphans.
    pub cutoff_ms: u64,
    pub orphans: u64,
    pub hints_sent: u64,
    /// Hints still refused after every retry.
    pub hints_failed: u64,
    /// STARTED items (orphans + owned); `None` when the count failed.
    pub started: Option<u64>,
    pub stopped: Option<u64>,
    /// STARTED items with a live lease.
    pub owned: Option<u64>,
    pub duration_ms: u64,
}

impl Report {
    /// The metrics to emit (counts that failed are left out rather than reported as zero).
    pub fn metrics(&self) -> Vec<(&'static str, u64)> {
        let mut metrics =
            vec![("Orphans", self.orphans), ("HintsSent", self.hints_sent), ("HintsFailed", self.hints_failed)];
        for (name, value) in [("Started", self.started), ("Stopped", self.stopped), ("Owned", self.owned)] {
            if let Some(value) = value {
                metrics.push((name, value));
            }
        }
        metrics
    }
}

/// Sends one batch, retrying refused entries a bounded number of times. Returns (sent, failed).
async fn send_batch_with_retry(hints: &dyn HintSender, batch: Vec<Hint>) -> (u64, u64) {
    let total = batch.len() as u64;
    let mut pending = batch;
    for attempt in 0..SEND_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
        }
        match hints.send_batch(&pending).await {
            Ok(failed) if failed.is_empty() => return (total, 0),
            Ok(failed) => pending = failed.into_iter().filter_map(|i| pending.get(i).cloned()).collect(),
            Err(e) => warn!(error = %e, attempt, hints = pending.len(), "hint batch failed"),
        }
    }
    let failed = pending.len() as u64;
    warn!(failed, "hints not sent after {SEND_ATTEMPTS} attempts; the next run sends them again");
    (total - failed, failed)
}

/// How a run reads and sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Orphans read per index query.
    pub page_size: usize,
    /// Hint batches (of up to [`MAX_BATCH`]) in flight at once.
    pub concurrency: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options { page_size: PAGE_SIZE, concurrency: CONCURRENT_BATCHES }
    }
}

/// Reads every orphan below `cutoff_ms`. The store retries within its own budget; a page whose
/// query still failed is tried again here, so one slow moment does not cost the whole run.
async fn list_orphans<S: LeaseStore + ?Sized>(
    store: &S,
    cutoff_ms: u64,
    page_size: usize,
) -> leaselock::Result<Vec<LeaseItem>> {
    let mut orphans = Vec::new();
    let mut after: Option<OrphanCursor> = None;
    loop {
        let mut attempt = 1;
        let page = loop {
            match store.orphans_page(cutoff_ms, page_size, after.clone()).await {
                Ok(page) => break page,
                Err(e @ (leaselock::Error::Throttled | leaselock::Error::Store(_))) if attempt < PAGE_ATTEMPTS => {
                    warn!(error = %e, attempt, "orphan query failed, trying again");
                    tokio::time::sleep(Duration::from_millis(250 << attempt)).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        };
        orphans.extend(page.items);
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(orphans),
        }
    }
}

/// Sends one hint per orphan, [`MAX_BATCH`] per request, `concurrency` requests at once.
/// Returns (sent, failed).
async fn send_hints(hints: &dyn HintSender, orphans: &[LeaseItem], concurrency: usize) -> (u64, u64) {
    stream::iter(orphans.chunks(MAX_BATCH))
        .map(|chunk| send_batch_with_retry(hints, chunk.iter().map(|item| Hint::new(item.id.as_str())).collect()))
        .buffer_unordered(concurrency.max(1))
        .fold((0, 0), |(sent, failed), (s, f)| async move { (sent + s, failed + f) })
        .await
}

/// One reconciliation: a hint for every orphan, and the counts. Fails only if the orphan query
/// does; a failed count leaves its metric out.
///
/// `started` is `owned + orphans`, counted a moment apart: work claimed in between may be counted
/// twice, which a metric can live with.
pub async fn reconcile<S: StateCounts + ?Sized>(store: &S, hints: &dyn HintSender) -> leaselock::Result<Report> {
    reconcile_with(store, hints, Options::default()).await
}

/// [`reconcile`] with other [`Options`].
pub async fn reconcile_with<S: StateCounts + ?Sized>(
    store: &S,
    hints: &dyn HintSender,
    options: Options,
) -> leaselock::Result<Report> {
    let started_at = Instant::now();
    let cutoff_ms = claim_cutoff(store.clock().now_ms(), store.config());
    let orphans = list_orphans(store, cutoff_ms, options.page_size).await?;
    let ((hints_sent, hints_failed), owned, stopped) = tokio::join!(
        send_hints(hints, &orphans, options.concurrency),
        store.count_by_state(DesiredState::Started, Some(cutoff_ms)),
        store.count_by_state(DesiredState::Stopped, None),
    );
    let counted = |what: &str, count: leaselock::Result<u64>| {
        count.inspect_err(|e| warn!(error = %e, "counting {what} failed; the metric is left out")).ok()
    };
    let owned = counted("owned", owned);
    let stopped = counted("stopped", stopped);
    let orphans = orphans.len() as u64;
    Ok(Report {
        cutoff_ms,
        orphans,
        hints_sent,
        hints_failed,
        started: owned.map(|owned| owned + orphans),
        stopped,
        owned,
        duration_ms: started_at.elapsed().as_millis() as u64,
    })
}

/// The reconciler failed to read the orphan index.
#[derive(Debug, thiserror::Error)]
#[error("reconciliation failed: {0}")]
pub struct ReconcileError(#[from] pub leaselock::Error);

impl From<ReconcileError> for Diagnostic {
    fn from(err: ReconcileError) -> Self {
        Diagnostic { error_type: format!("Reconcile{}", err.0.kind()), error_message: err.to_string() }
    }
}

/// The Lambda handler: any payload (an EventBridge schedule event) triggers one run; the report
/// is returned and its metrics written as one EMF line.
pub async fn handle<S: StateCounts + ?Sized, W: Write>(
    _event: LambdaEvent<Value>,
    store: &S,
    hints: &dyn HintSender,
    metrics: &EmfWriter<W>,
) -> Result<Value, ReconcileError> {
    let report = reconcile(store, hints).await?;
    info!(
        orphans = report.orphans,
        hints_sent = report.hints_sent,
        hints_failed = report.hints_failed,
        started = report.started,
        stopped = report.stopped,
        duration_ms = report.duration_ms,
        "reconciled"
    );
    if let Err(e) = metrics.emit(store.clock().now_ms(), &report.metrics()) {
        warn!(error = %e, "writing metrics failed");
    }
    Ok(serde_json::to_value(&report).expect("a report serializes"))
}
