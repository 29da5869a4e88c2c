//! `leaselock sweep`: session mode's backstop by hand. A consistent read of the whole table
//! (never an index) for stranded work: connections held under a session that is gone, of another
//! epoch, or dead beyond the grace, which survivors never list when the owner index lagged past
//! their wait. Prints each id, then one JSON line; with a queue, sends a START hint for each, so
//! any worker takes it over.

use std::io::Write;

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use leaselock::config::validate_queue_url;
use leaselock::render::escaped;
use leaselock::{Hint, LeaseStore};

use crate::ops::{check_queue, connect, sdk_config, sdk_error};
use crate::{other, CliResult, TableArgs};

/// Items one part of the sweep reads: the ids of a part are printed (and hinted) as it ends.
const PART_ITEMS: u64 = 10_000;
/// SendMessageBatch's limit.
const HINT_BATCH: usize = 10;

#[derive(clap::Args, Debug)]
pub struct SweepArgs {
    /// How long a session must have been dead, beyond the clock skew, before its work counts as
    /// stranded, ms.
    #[arg(long, env = "LEASELOCK_SWEEP_GRACE_MS", default_value_t = 60_000)]
    grace_ms: u64,
    /// Send a START hint (marked stranded) for every stranded id to this SQS queue.
    #[arg(long, env = "LEASELOCK_QUEUE_URL")]
    queue_url: Option<String>,
}

/// The last line `sweep` prints.
#[derive(Debug, Default, serde::Serialize)]
struct Summary {
    stranded: u64,
    /// Items read: the sweep costs about one read unit per 4 KB of them.
    items_read: u64,
    grace_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    hints_sent: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hints_failed: Option<u64>,
}

pub async fn run(args: &TableArgs, sweep: &SweepArgs) -> CliResult {
    if let Some(queue_url) = &sweep.queue_url {
        validate_queue_url(queue_url)?;
    }
    let table = connect(args).await?;
    let sqs = match &sweep.queue_url {
        Some(queue_url) => {
            let sqs = aws_sdk_sqs::Client::new(&sdk_config().await);
            check_queue(&sqs, queue_url).await?;
            Some((sqs, queue_url.as_str()))
        }
        None => None,
    };
    let mut summary = Summary {
        grace_ms: sweep.grace_ms,
        hints_sent: sqs.as_ref().map(|_| 0),
        hints_failed: sqs.as_ref().map(|_| 0),
        ..Summary::default()
    };
    let mut after = None;
    loop {
        let page = table.stranded_page(sweep.grace_ms, after.take(), PART_ITEMS).await?;
        summary.items_read += page.scanned;
        summary.stranded += page.ids.len() as u64;
        let mut out = std::io::stdout().lock();
        for id in &page.ids {
            writeln!(out, "{}", escaped(id)).map_err(other)?;
        }
        drop(out);
        if let Some((sqs, queue_url)) = &sqs {
            let (sent, failed) = send_hints(sqs, queue_url, &page.ids).await;
            *summary.hints_sent.get_or_insert(0) += sent;
            *summary.hints_failed.get_or_insert(0) += failed;
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    println!("{}", serde_json::to_string(&summary).map_err(other)?);
    match summary.hints_failed {
        Some(failed) if failed > 0 => Err(other(format!(
            "{failed} of {} hints were not sent; run the sweep again, or let the reconciler's sweep send them",
            summary.stranded
        ))),
        _ => Ok(()),
    }
}

/// Sends one stranded hint per id ([`Hint::stranded`]: a worker takes it whatever its fair
/// share), [`HINT_BATCH`] per request: (sent, not sent).
async fn send_hints(sqs: &aws_sdk_sqs::Client, queue_url: &str, ids: &[String]) -> (u64, u64) {
    let (mut sent, mut failed) = (0, 0);
    for chunk in ids.chunks(HINT_BATCH) {
        let entries: Result<Vec<_>, _> = chunk
            .iter()
            .enumerate()
            .map(|(i, id)| {
                SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(Hint::stranded(id).to_json())
                    .build()
            })
            .collect();
        let answer = match entries {
            Ok(entries) => sqs.send_message_batch().queue_url(queue_url).set_entries(Some(entries)).send().await,
            Err(e) => {
                tracing::warn!(error = %e, "a hint batch could not be built");
                failed += chunk.len() as u64;
                continue;
            }
        };
        match answer {
            Ok(out) => {
                sent += out.successful().len() as u64;
                failed += (chunk.len() - out.successful().len()) as u64;
            }
            Err(e) => {
                tracing::warn!("{}", sdk_error("SendMessageBatch", e));
                failed += chunk.len() as u64;
            }
        }
    }
    (sent, failed)
}
