//! Operator commands: table, start, stop, ls, status.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::{AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType};
use leaselock::config::{validate_id, validate_queue_url, validate_table_name, validate_url};
use leaselock::lease::{claim_cutoff, is_orphan};
use leaselock::protocol::TableReplication;
use leaselock::render::escaped;
use leaselock::{Clock, DesiredState, Hint, LeaseItem, LeaseStore, LeaseTable, SystemClock};

use crate::{other, CliResult, Failure, TableArgs};

/// A failed SDK call in one line: the service's error code and message, or what kind of
/// failure it was. The whole error chain is logged at debug level (`LEASELOCK_LOG=debug`).
pub fn sdk_error<E, R>(what: &str, e: SdkError<E, R>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    tracing::debug!(error = %aws_sdk_dynamodb::error::DisplayErrorContext(&e), "{what} failed");
    match &e {
        SdkError::ServiceError(service) => {
            let err = service.err();
            format!("{what}: {}: {}", err.code().unwrap_or("error"), err.message().unwrap_or_default())
        }
        SdkError::TimeoutError(_) => format!("{what}: the request timed out"),
        SdkError::DispatchFailure(failure) if failure.is_timeout() => format!("{what}: the request timed out"),
        SdkError::DispatchFailure(_) => format!("{what}: could not connect (check AWS_ENDPOINT_URL / the region)"),
        SdkError::ResponseError(_) => format!("{what}: the response could not be read"),
        SdkError::ConstructionFailure(_) => format!("{what}: the request could not be built"),
        _ => format!("{what}: failed"),
    }
}

/// A DynamoDB call on `table` that failed; a missing table says what to run.
fn dynamodb_failure<E, R>(table: &str, what: &str, e: SdkError<E, R>) -> Failure
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    if e.as_service_error().and_then(|s| s.code()) == Some("ResourceNotFoundException") {
        return leaselock::Error::TableNotFound { table: table.to_string() }.into();
    }
    other(sdk_error(what, e))
}

pub async fn connect(args: &TableArgs) -> CliResult<LeaseTable> {
    Ok(LeaseTable::connect(args.config()?).await?)
}

/// The table check of the commands that write (`LeaseTable::replication`): a global table in
/// multi-Region eventual consistency is refused by the store's answer, so it exits 1 like any
/// refusal of the store (2 is for input refused before any request).
pub async fn check(table: &LeaseTable) -> CliResult<TableReplication> {
    table.replication().await.map_err(|e| match e {
        leaselock::Error::InvalidInput { .. } => Failure::Other(e.to_string()),
        e => e.into(),
    })
}

/// A connected table that passed [`check`].
pub async fn connect_checked(args: &TableArgs) -> CliResult<LeaseTable> {
    let table = connect(args).await?;
    check(&table).await?;
    Ok(table)
}

pub async fn sdk_config() -> aws_config::SdkConfig {
    aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await
}

pub async fn table_create(args: &TableArgs) -> CliResult {
    // Both names are checked before either table is created.
    args.config()?;
    validate_table_name("messages_table", &args.messages_table)?;
    let table = connect(args).await?;
    table.create_table().await?;
    // CreateTable makes a single-Region table; one that existed may be a global table.
    let replication = check(&table).await?;
    println!("lease table {} ready (index {}): {}", args.table_name, args.index_name, replication.describe());
    if replication == TableReplication::SingleRegion {
        println!(
            "  to span Regions, make it a global table in multi-Region strong consistency (MRSC): an eventually \
             consistent one is refused"
        );
    }
    create_messages_table(table.client(), &args.messages_table).await?;
    println!("messages table {} ready", args.messages_table);
    Ok(())
}

/// The reference worker's output: one item per (stream, seq).
pub async fn create_messages_table(client: &aws_sdk_dynamodb::Client, name: &str) -> CliResult {
    let attr = |n: &str, t| AttributeDefinition::builder().attribute_name(n).attribute_type(t).build().map_err(other);
    let key = |n: &str, t| KeySchemaElement::builder().attribute_name(n).key_type(t).build().map_err(other);
    let created = client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr("stream", ScalarAttributeType::S)?)
        .attribute_definitions(attr("seq", ScalarAttributeType::N)?)
        .key_schema(key("stream", KeyType::Hash)?)
        .key_schema(key("seq", KeyType::Range)?)
        .send()
        .await;
    match created {
        Ok(_) => Ok(()),
        Err(e) if e.as_service_error().is_some_and(|e| e.is_resource_in_use_exception()) => Ok(()),
        Err(e) => Err(dynamodb_failure(name, &format!("creating table {name}"), e)),
    }
}

pub async fn table_describe(args: &TableArgs) -> CliResult {
    let table = connect(args).await?;
    let out = table
        .client()
        .describe_table()
        .table_name(&args.table_name)
        .send()
        .await
        .map_err(|e| dynamodb_failure(&args.table_name, "DescribeTable", e))?;
    let t = out.table().ok_or_else(|| other("no table description"))?;
    println!("table      {}", t.table_name().unwrap_or_default());
    println!("status     {}", t.table_status().map(|s| s.as_str()).unwrap_or("?"));
    println!("items      {}", t.item_count().unwrap_or_default());
    for k in t.key_schema() {
        println!("key        {} ({})", k.attribute_name(), k.key_type().as_str());
    }
    for g in t.global_secondary_indexes() {
        let keys: Vec<_> =
            g.key_schema().iter().map(|k| format!("{} {}", k.attribute_name(), k.key_type().as_str())).collect();
        println!(
            "index      {} [{}] {}",
            g.index_name().unwrap_or_default(),
            keys.join(", "),
            g.index_status().map(|s| s.as_str()).unwrap_or("")
        );
    }
    let config = table.config();
    println!(
        "leases     {} ms, renew {} ms, skew {} ms, prefix {:?}",
        config.lease_ms(),
        config.renew_ms(),
        config.skew_ms(),
        config.key_prefix
    );
    Ok(())
}

/// Fails unless the hint queue exists (GetQueueAttributes), so `start` writes nothing when its
/// hint could not be sent.
pub async fn check_queue(sqs: &aws_sdk_sqs::Client, queue_url: &str) -> CliResult {
    let checked = sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await;
    match checked {
        Ok(_) => Ok(()),
        Err(e) if e.as_service_error().is_some_and(|s| s.is_queue_does_not_exist()) => Err(other(format!(
            "queue {} does not exist: create it or fix --queue-url / LEASELOCK_QUEUE_URL (nothing was written)",
            leaselock::render::value(queue_url)
        ))),
        Err(e) => Err(other(format!("{} (nothing was written)", sdk_error("checking the hint queue", e)))),
    }
}

pub async fn start(args: &TableArgs, id: &str, url: &str, queue_url: Option<&str>) -> CliResult {
    validate_id("id", id)?;
    validate_url(url)?;
    if let Some(queue_url) = queue_url {
        validate_queue_url(queue_url)?;
    }
    let table = connect_checked(args).await?;
    let sqs = match queue_url {
        Some(queue_url) => {
            let sqs = aws_sdk_sqs::Client::new(&sdk_config().await);
            check_queue(&sqs, queue_url).await?;
            Some((sqs, queue_url))
        }
        None => None,
    };
    let item = table.start(id, url).await?;
    println!("{id} STARTED (owner {}, fence {})", escaped(item.owner.as_deref().unwrap_or("-")), item.fence);
    if let Some((sqs, queue_url)) = sqs {
        let sent = sqs.send_message().queue_url(queue_url).message_body(Hint::new(id).to_json()).send().await;
        if let Err(e) = sent {
            return Err(other(format!(
                "{id} is STARTED but its hint was not sent ({}); a worker will claim it from the orphan index",
                sdk_error("SendMessage", e)
            )));
        }
    }
    Ok(())
}

pub async fn stop(args: &TableArgs, id: &str) -> CliResult {
    validate_id("id", id)?;
    let table = connect_checked(args).await?;
    let item = table.stop(id).await?;
    println!(
        "{id} STOPPED (owner {} lets go within one desired-state interval)",
        escaped(item.owner.as_deref().unwrap_or("-"))
    );
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct LsArgs {
    /// Only items in this desired state (STARTED or STOPPED).
    #[arg(long, value_parser = crate::parse_state)]
    state: Option<DesiredState>,
    /// Only items whose lease this worker holds now.
    #[arg(long)]
    owner: Option<String>,
    /// Only orphans: STARTED work nobody holds (from the orphan index).
    #[arg(long, conflicts_with_all = ["state", "owner"])]
    orphans: bool,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn ls(args: &TableArgs, ls: &LsArgs) -> CliResult {
    if let Some(owner) = &ls.owner {
        validate_id("owner", owner)?;
    }
    let table = connect(args).await?;
    let now = SystemClock.now_ms();
    let mut items = if ls.orphans {
        let cutoff = claim_cutoff(now, table.config());
        let mut orphans = table.orphans(cutoff, None).await?;
        // Session mode: the work of a dead session is orphaned too (the fleet takes it over).
        if table.config().mode == leaselock::LeaseMode::Session {
            for dead in table.sessions(cutoff).await? {
                orphans.extend(table.owned_by(&dead.owner).await?);
            }
        }
        orphans
    } else if let Some(owner) = &ls.owner {
        table.owned_by(owner).await?
    } else {
        table.items().await?
    };
    items.retain(|i| ls.state.is_none_or(|s| i.desired_state == Some(s)));
    items.sort_by(|a, b| a.id.cmp(&b.id));
    let mut out = std::io::stdout().lock();
    if ls.json {
        for item in &items {
            writeln!(out, "{}", serde_json::to_string(item).map_err(other)?).map_err(other)?;
        }
        return Ok(());
    }
    write!(out, "{}", render_table(&items, now)).map_err(other)?;
    Ok(())
}

/// "12.3s", "expired 4.0s ago", "released", or "-".
pub fn expires_in(item: &LeaseItem, now_ms: u64) -> String {
    match item.expires_at_ms {
        None => "-".into(),
        Some(0) => "released".into(),
        Some(exp) if exp > now_ms => format!("{:.1}s", (exp - now_ms) as f64 / 1000.0),
        Some(exp) => format!("expired {:.1}s ago", (now_ms - exp) as f64 / 1000.0),
    }
}

/// The `ls` table. Ids and owners are printed escaped: a table may hold values written by
/// other tools, and one must not rewrite the operator's terminal.
pub fn render_table(items: &[LeaseItem], now_ms: u64) -> String {
    let rows: Vec<[String; 6]> = items
        .iter()
        .map(|i| {
            [
                escaped(&i.id).into_owned(),
                i.desired_state.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
                escaped(i.holder_at(now_ms).unwrap_or("-")).into_owned(),
                i.fence.to_string(),
                expires_in(i, now_ms),
                i.last_seq.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let header = ["ID", "STATE", "OWNER", "FENCE", "EXPIRES IN", "LAST_SEQ"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out.push_str(&format!("{} item(s)\n", rows.len()));
    out
}

/// What `status` shows.
#[derive(Debug, Default, PartialEq, serde::Serialize)]
pub struct Status {
    pub started: usize,
    pub stopped: usize,
    pub owned: usize,
    pub orphans: usize,
    pub expiring_soon: usize,
    pub per_worker: BTreeMap<String, usize>,
}

pub fn summarize(items: &[LeaseItem], now_ms: u64, config: &leaselock::TableConfig) -> Status {
    let mut s = Status::default();
    for item in items {
        match item.desired_state {
            Some(DesiredState::Started) => s.started += 1,
            Some(DesiredState::Stopped) => s.stopped += 1,
            None => {}
        }
        if is_orphan(item, now_ms, config) {
            s.orphans += 1;
        }
        if let Some(owner) = item.holder_at(now_ms) {
            s.owned += 1;
            *s.per_worker.entry(owner.to_string()).or_default() += 1;
            if item.expires_at_ms.is_some_and(|e| e <= now_ms + config.renew_ms()) {
                s.expiring_soon += 1;
            }
        }
    }
    s
}

pub fn render_status(s: &Status, table: &str) -> String {
    let mut out = format!(
        "table {}: {} started, {} stopped, {} owned, {} orphaned, {} expiring within one renew interval\n",
        escaped(table),
        s.started,
        s.stopped,
        s.owned,
        s.orphans,
        s.expiring_soon
    );
    out.push_str(&format!("{:<40} {:>6}\n", "WORKER", "LEASES"));
    for (w, n) in &s.per_worker {
        // Worker ids come from the table: escaped, as in `ls`.
        out.push_str(&format!("{:<40} {n:>6}\n", escaped(w)));
    }
    out
}

/// Session mode: every session, whether it lives, and how many items it holds.
pub fn render_sessions(
    sessions: &[leaselock::SessionItem],
    items: &[LeaseItem],
    now_ms: u64,
    config: &leaselock::TableConfig,
) -> String {
    let mut out = format!("{:<40} {:>6} {:>22} {:>6}\n", "SESSION", "EPOCH", "EXPIRES", "HOLDS");
    for s in sessions {
        let holds = items
            .iter()
            .filter(|i| i.owner.as_deref() == Some(s.owner.as_str()))
            .filter(|i| i.expires_at_ms == Some(leaselock::lease::HELD_UNDER_SESSION_MS))
            .count();
        let expiry = LeaseItem { expires_at_ms: Some(s.expires_at_ms), ..LeaseItem::default() };
        let state = if s.is_dead(now_ms, config) {
            format!("dead ({})", expires_in(&expiry, now_ms))
        } else {
            expires_in(&expiry, now_ms)
        };
        out.push_str(&format!("{:<40} {:>6} {:>22} {:>6}\n", s.owner, s.epoch, state, holds));
    }
    out
}

pub async fn status(args: &TableArgs, watch: bool, interval: Duration) -> CliResult {
    let table = connect(args).await?;
    loop {
        let items = table.items().await?;
        // Expiries are on the store's clock: measured closely enough to read them on it.
        table.measure_clock(args.skew_ms / 2).await;
        let now = table.clock().now_ms();
        let mut text = render_status(&summarize(&items, now, table.config()), &args.table_name);
        if table.config().mode == leaselock::LeaseMode::Session {
            text.push_str(&render_sessions(&table.sessions(u64::MAX).await?, &items, now, table.config()));
        }
        text.push_str(&crate::clock::describe(table.store_clock().and_then(|c| c.estimate())));
        text.push('\n');
        if watch {
            // Clear the screen and home the cursor between refreshes.
            print!("\x1b[2J\x1b[H{text}");
            std::io::stdout().flush().map_err(other)?;
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = tokio::signal::ctrl_c() => return Ok(()),
            }
        } else {
            print!("{text}");
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: &str, state: Option<DesiredState>, owner: Option<&str>, exp: Option<u64>) -> LeaseItem {
        LeaseItem {
            id: id.into(),
            desired_state: state,
            owner: owner.map(String::from),
            expires_at_ms: exp,
            fence: 1,
            ..Default::default()
        }
    }

    #[test]
    fn status_counts_owners_orphans_and_soon_expiring() {
        let config = leaselock::TableConfig::default();
        let now = 100_000;
        let items = [
            item("a", Some(DesiredState::Started), Some("w1"), Some(now + 3_000)),
            item("b", Some(DesiredState::Started), Some("w1"), Some(now + 15_000)),
            item("c", Some(DesiredState::Started), Some("w2"), Some(now - 5_000)),
            item("d", Some(DesiredState::Stopped), None, Some(0)),
            item("leader/x", None, Some("w2"), Some(now + 9_000)),
        ];
        let s = summarize(&items, now, &config);
        assert_eq!((s.started, s.stopped, s.owned, s.orphans, s.expiring_soon), (3, 1, 3, 1, 1));
        assert_eq!(s.per_worker, BTreeMap::from([("w1".into(), 2), ("w2".into(), 1)]));
    }

    #[test]
    fn ls_table_is_aligned() {
        let now = 50_000;
        let text = render_table(
            &[
                item("stream-1", Some(DesiredState::Started), Some("worker-a"), Some(now + 1_500)),
                item("s2", Some(DesiredState::Stopped), None, Some(0)),
            ],
            now,
        );
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines[0], "ID        STATE    OWNER     FENCE  EXPIRES IN  LAST_SEQ");
        assert_eq!(lines[1], "stream-1  STARTED  worker-a  1      1.5s        -");
        assert_eq!(lines[2], "s2        STOPPED  -         1      released    -");
        assert_eq!(lines[3], "2 item(s)");
    }
}
