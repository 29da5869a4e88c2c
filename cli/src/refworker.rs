//! The reference worker: owns leased streams, connects to each `ws_url`, resumes after
//! `last_seq`, writes every message to the messages table together with the checkpoint in one
//! fenced transaction, and acknowledges the message upstream.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use futures::{SinkExt, StreamExt};
use leaselock::worker::BoxError;
use leaselock::{Connection, LeaseStore, Worker};
use tokio_tungstenite::tungstenite::Message;

use crate::upstream::{Ack, FeedMessage};
use crate::{other, CliResult, TableArgs};

#[derive(clap::Args, Debug, Clone)]
pub struct WorkerArgs {
    /// Owner name written into leases (default: host, pid and a random suffix).
    #[arg(long, env = "LEASELOCK_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Most leases held at once.
    #[arg(long, env = "LEASELOCK_MAX_CONNECTIONS", default_value_t = leaselock::worker::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// SQS queue of START hints (optional; the orphan index finds work without it).
    #[arg(long, env = "LEASELOCK_QUEUE_URL")]
    pub queue_url: Option<String>,
    /// Orphan index query interval, ms.
    #[arg(long, env = "LEASELOCK_ORPHAN_INTERVAL_MS", default_value_t = 2_000)]
    pub orphan_interval_ms: u64,
    /// Batched desired-state check interval, ms.
    #[arg(long, env = "LEASELOCK_DESIRED_STATE_INTERVAL_MS", default_value_t = 10_000)]
    pub desired_state_interval_ms: u64,
    /// CloudWatch namespace of the metrics.
    #[arg(long, env = "LEASELOCK_METRICS_NAMESPACE", default_value = leaselock::metrics::NAMESPACE)]
    pub metrics_namespace: String,
    /// Session mode: claim whatever is found up to --max-connections instead of a fair share of
    /// the fleet's work (and hand nothing over).
    #[arg(long, env = "LEASELOCK_NO_BALANCE")]
    pub no_balance: bool,
    /// Metrics (CloudWatch EMF lines on stdout) interval, ms.
    #[arg(long, env = "LEASELOCK_METRICS_INTERVAL_MS", default_value_t = 60_000)]
    pub metrics_interval_ms: u64,
    /// Session mode: how far behind the table the owner index may be, ms. A dead session is
    /// retired from an empty listing of its work only when the listing was sent this long after
    /// its last write.
    #[arg(long, env = "LEASELOCK_INDEX_LAG_MS", default_value_t = leaselock::worker::DEFAULT_INDEX_LAG.as_millis() as u64)]
    pub index_lag_ms: u64,
    /// Claims wait until the store's clock (measured from DynamoDB's answers) is known within
    /// this, ms (default: half the clock skew).
    #[arg(long, env = "LEASELOCK_CLOCK_TOLERANCE_MS")]
    pub clock_tolerance_ms: Option<u64>,
    /// Claim on this host's clock until the store's is known, instead of waiting for it.
    #[arg(long, env = "LEASELOCK_NO_WAIT_FOR_STORE_CLOCK")]
    pub no_wait_for_store_clock: bool,
    /// Leases on this host's wall clock as it is, not on the store's (nothing is measured):
    /// only for hosts whose clocks are known to agree.
    #[arg(long, env = "LEASELOCK_LOCAL_CLOCK")]
    pub local_clock: bool,
}

/// The messages table row written for `msg` under the connection's lease: one item per
/// (stream, seq); `writes` counts deliveries, so a message written twice shows as a duplicate.
fn message_write(
    table: &str,
    msg: &FeedMessage,
    conn: &Connection,
    worker_id: &str,
) -> Result<TransactWriteItem, BoxError> {
    let update = Update::builder()
        .table_name(table)
        .set_key(Some(HashMap::from([
            ("stream".to_string(), AttributeValue::S(conn.id().to_string())),
            ("seq".to_string(), AttributeValue::N(msg.seq.to_string())),
        ])))
        .update_expression("SET #data = :data, #fence = :fence, #worker = :worker, #at = :at ADD #writes :one")
        .expression_attribute_names("#data", "data")
        .expression_attribute_names("#fence", "fence")
        .expression_attribute_names("#worker", "worker")
        .expression_attribute_names("#at", "written_at_ms")
        .expression_attribute_names("#writes", "writes")
        .expression_attribute_values(":data", AttributeValue::S(msg.data.clone()))
        .expression_attribute_values(":fence", AttributeValue::N(conn.fence().to_string()))
        .expression_attribute_values(":worker", AttributeValue::S(worker_id.to_string()))
        .expression_attribute_values(":at", AttributeValue::N(conn.now_ms().to_string()))
        .expression_attribute_values(":one", AttributeValue::N("1".into()))
        .build()?;
    Ok(TransactWriteItem::builder().update(update).build())
}

struct Context {
    client: aws_sdk_dynamodb::Client,
    messages_table: String,
    worker_id: String,
}

/// Streams one leased connection until the lease's token fires.
async fn stream(conn: Connection, ctx: Arc<Context>) -> Result<(), BoxError> {
    let url = conn.url().ok_or("the item has no ws_url")?;
    let mut last = conn.last_seq().unwrap_or(0);
    let sep = if url.contains('?') { '&' } else { '?' };
    let target = format!("{url}{sep}from={last}&fence={}", conn.fence());
    let connected = tokio::select! {
        biased;
        _ = conn.cancelled() => return Ok(()),
        c = tokio::time::timeout(Duration::from_secs(5), tokio_tungstenite::connect_async(target)) => c,
    };
    let (ws, _) = connected.map_err(|_| "upstream connect timed out")??;
    tracing::info!(connection_id = %conn.id(), fence = conn.fence(), from = last, "streaming");
    let (mut tx, mut rx) = ws.split();
    loop {
        let incoming = tokio::select! {
            biased;
            _ = conn.cancelled() => {
                let _ = tx.send(Message::Close(None)).await;
                return Ok(());
            }
            incoming = rx.next() => incoming,
        };
        let text = match incoming {
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Close(_))) | None => return Err("upstream closed the stream".into()),
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(e.into()),
        };
        let msg: FeedMessage = serde_json::from_str(&text)?;
        if msg.seq <= last {
            continue;
        }
        if msg.seq != last + 1 {
            return Err(format!("upstream skipped from {last} to {}", msg.seq).into());
        }
        // The message and the checkpoint land together under the lease, or not at all.
        let write = message_write(&ctx.messages_table, &msg, &conn, &ctx.worker_id)?;
        conn.fenced_write_with_checkpoint(&ctx.client, msg.seq, vec![write]).await?;
        tx.send(Message::Text(serde_json::to_string(&Ack { ack: msg.seq })?)).await?;
        last = msg.seq;
    }
}

pub async fn run(args: &TableArgs, w: WorkerArgs) -> CliResult {
    let mut table = crate::ops::connect_checked(args).await?;
    if w.local_clock {
        table = table.with_clock(Arc::new(leaselock::SystemClock));
    }
    let client = table.client().clone();
    let store: Arc<dyn LeaseStore> = Arc::new(table);
    let mut builder = Worker::builder(store)
        .max_connections(w.max_connections)
        .orphan_interval(Duration::from_millis(w.orphan_interval_ms))
        .desired_state_interval(Duration::from_millis(w.desired_state_interval_ms))
        .metrics_interval(Duration::from_millis(w.metrics_interval_ms))
        .metrics_namespace(&w.metrics_namespace)
        .index_lag(Duration::from_millis(w.index_lag_ms))
        .balance(!w.no_balance)
        .wait_for_store_clock(!w.no_wait_for_store_clock);
    if let Some(ms) = w.clock_tolerance_ms {
        builder = builder.clock_tolerance(Duration::from_millis(ms));
    }
    let worker_id = w.worker_id.clone().unwrap_or_else(leaselock::worker::default_worker_id);
    builder = builder.worker_id(&worker_id);
    if let Some(queue_url) = &w.queue_url {
        let sqs = aws_sdk_sqs::Client::new(&crate::ops::sdk_config().await);
        builder = builder.hint_queue(sqs, queue_url);
    }
    let ctx = Arc::new(Context { client, messages_table: args.messages_table.clone(), worker_id });
    let worker = builder.build(move |conn| stream(conn, ctx.clone()))?;
    eprintln!("worker {}: running (max {} connections)", worker.worker_id(), w.max_connections);
    let snapshot = worker.run().await;
    eprintln!("worker {}: stopped, {}", snapshot.worker_id, serde_json::to_string(&snapshot).map_err(other)?);
    Ok(())
}
