//! The DynamoDB store: an executor of [`crate::protocol`] on `aws-sdk-dynamodb`. It sends the
//! requests the protocol names, turns each answer or SDK error into the protocol's answer kind,
//! sleeps when told, and returns what the protocol decides. The expressions and every decision
//! (what a failed condition means, re-reads, retries within the deadline) live in the protocol.

pub(crate) mod convert;
mod errors;
mod store_clock;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::StalledStreamProtectionConfig;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types as sdk;
use aws_sdk_dynamodb::Client;

use crate::protocol::{self, Answer, Input, Operation, Output, Request, Step};
use crate::store::{OrphanCursor, OrphanPage, StrandedPage, SweepCursor};
use crate::{
    Clock, DesiredState, Error, Lease, LeaseItem, LeaseStore, Result, Session, SessionItem, SessionLoad, StoreClock,
    SystemClock, TableConfig,
};
use convert::{from_sdk_item, names, to_sdk_item, values, Invalid};
use errors::answer_of;

/// Lease operations on one DynamoDB table.
///
/// ```no_run
/// # async fn demo() -> leaselock::Result<()> {
/// use leaselock::{LeaseStore, LeaseTable, TableConfig};
///
/// let table = LeaseTable::connect(TableConfig::new("leases")).await?;
/// table.create_table().await?;
/// table.start("stream-1", "wss://feed.example/stream-1").await?;
/// let mut lease = table.acquire("stream-1", "worker-a").await?;
/// table.checkpoint(&mut lease, 42).await?;
/// table.renew(&mut lease).await?;
/// table.release(&lease).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LeaseTable {
    client: Client,
    /// `client` for the protocol's own requests ([`single_attempt_client`]).
    attempts: Client,
    config: TableConfig,
    clock: Arc<dyn Clock>,
    /// The store's clock as measured from the table's answers (what `clock` is, unless
    /// [`LeaseTable::with_clock`] set another).
    store_clock: Option<Arc<StoreClock<Arc<dyn Clock>>>>,
    sent: Arc<RequestCounts>,
    /// What [`LeaseTable::replication`] found, once (shared by clones).
    replication: Arc<tokio::sync::OnceCell<protocol::TableReplication>>,
}

/// How many requests a [`LeaseTable`] (and its clones) sent, by DynamoDB operation: write cost
/// measured from what was sent, not computed from the configuration.
#[derive(Debug, Default)]
pub struct RequestCounts {
    counts: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
}

impl RequestCounts {
    fn count(&self, request: &Request) {
        *self.counts.lock().expect("counts poisoned").entry(request.operation()).or_default() += 1;
    }

    /// Requests sent so far, by operation name (`"UpdateItem"`, `"TransactWriteItems"`, ...).
    pub fn snapshot(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.counts.lock().expect("counts poisoned").clone()
    }

    /// Write requests sent so far (UpdateItem and TransactWriteItems).
    pub fn writes(&self) -> u64 {
        let counts = self.counts.lock().expect("counts poisoned");
        ["UpdateItem", "TransactWriteItems", "PutItem", "DeleteItem"].iter().filter_map(|k| counts.get(k)).sum()
    }
}

impl LeaseTable {
    /// A store over `client`; the config is validated first.
    ///
    /// Its clock is the store's ([`StoreClock`]): every answer's `Date` header is measured
    /// against the local clocks, and once the store's time is known within half the clock
    /// skew, leases are written and claims decided on it rather than on the local wall clock.
    pub fn new(client: Client, config: TableConfig) -> Result<Self> {
        config.validate()?;
        let table = Self {
            attempts: client.clone(),
            client,
            config,
            clock: Arc::new(SystemClock),
            store_clock: None,
            sent: Arc::default(),
            replication: Arc::default(),
        };
        Ok(table.with_store_clock(Arc::new(SystemClock)))
    }

    /// A store with the SDK's default configuration (environment, profile; `AWS_ENDPOINT_URL`).
    pub async fn connect(config: TableConfig) -> Result<Self> {
        let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        Self::new(Client::new(&sdk), config)
    }

    /// The same table seen through another clock, as it is (tests, simulations): the store's
    /// clock is not measured.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.attempts = store_clock::attempts_client(&self.client, None);
        self.clock = clock;
        self.store_clock = None;
        self
    }

    /// The same table on the store's clock measured against `local` (what [`LeaseTable::new`]
    /// does with the system clocks); a clone keeps measuring into the same estimate.
    pub fn with_store_clock(mut self, local: Arc<dyn Clock>) -> Self {
        let clock = Arc::new(StoreClock::new(local, self.config.skew_ms() / 2));
        self.attempts = store_clock::attempts_client(&self.client, Some(clock.clone()));
        self.clock = clock.clone();
        self.store_clock = Some(clock);
        self
    }

    /// The client the protocol's requests go through and the table's clock.
    pub(crate) fn requests_client_and_clock(&self) -> (Client, Arc<dyn Clock>) {
        (self.attempts.clone(), self.clock.clone())
    }

    /// Sends one request (a DescribeTable, which uses no capacity) at the moment its answer
    /// narrows the store's clock most ([`StoreClock::probe_at`]; `round_trip_ms`: about what a
    /// request takes), and returns its round trip; `None` when no answer came in time or the
    /// table does not measure the store's clock. About eight such probes know the clock within
    /// the round trip.
    pub async fn probe_clock(&self, round_trip_ms: u64) -> Option<u64> {
        let clock = self.store_clock.as_ref()?;
        store_clock::probe(&self.attempts, &self.config.table_name, clock, round_trip_ms).await
    }

    /// The store's clock as measured so far (`None` on a table given a clock of its own).
    pub fn store_clock(&self) -> Option<&StoreClock<Arc<dyn Clock>>> {
        self.store_clock.as_deref()
    }

    /// The client the table was made with (its own retry configuration; the table's requests go
    /// through a [`single_attempt_client`] of it).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The requests this table and its clones sent.
    pub fn requests_sent(&self) -> &RequestCounts {
        &self.sent
    }

    /// Creates the table, its sparse orphan and owner indexes and TTL on `ttl`; waits until all
    /// are active. A table that exists is kept; the owner index is added when it lacks it.
    pub async fn create_table(&self) -> Result<()> {
        self.run(protocol::CreateTable::new(&self.config)).await
    }

    /// Whether leases on this table can be exclusive: single-Region, or a global table in
    /// multi-Region strong consistency (MRSC). A global table in multi-Region eventual
    /// consistency is refused (`InvalidInput` on `table`, naming its replicas and the opt-in,
    /// [`TableConfig::allow_eventual_global_table`]); a missing table is `TableNotFound`. One
    /// DescribeTable per table object (clones share it), sent the first time it is asked; the
    /// answer is kept, a failure is not.
    pub async fn replication(&self) -> Result<protocol::TableReplication> {
        self.replication.get_or_try_init(|| self.run(protocol::CheckTable::new(&self.config))).await.cloned()
    }

    /// Runs one protocol operation to its end on this table's client and clock.
    pub async fn run<O: Operation>(&self, op: O) -> Result<O::Output> {
        drive(&self.attempts, &*self.clock, op, &[], Some(&self.sent)).await
    }
}

/// Runs `op` to its end: sends what it asks (with `extra` appended to a transaction's actions),
/// sleeps when told.
pub(crate) async fn drive<O: Operation>(
    client: &Client,
    clock: &dyn Clock,
    mut op: O,
    extra: &[sdk::TransactWriteItem],
    counts: Option<&RequestCounts>,
) -> Result<O::Output> {
    let mut answer = None;
    loop {
        let input = Input {
            now_ms: clock.now_ms(),
            mono_ms: clock.monotonic_ms(),
            random: jitter_unit(),
            answer: answer.take(),
        };
        match op.next(input) {
            Step::Send { request, attempt_timeout_ms } => {
                if let Some(counts) = counts {
                    counts.count(&request);
                }
                answer = Some(execute(client, request, Duration::from_millis(attempt_timeout_ms), extra).await);
            }
            Step::Sleep { ms } => tokio::time::sleep(Duration::from_millis(ms)).await,
            Step::Done(out) => return Ok(out),
            Step::Fail(e) => return Err(e),
        }
    }
}

/// `client` set up for the protocol, once: one attempt per request (the protocol retries; a blind
/// SDK retry of an applied claim would look held) and no stalled-stream monitor (every attempt
/// has its own deadline). It shares `client`'s connection pool and credentials. Requests through
/// it need no per-request configuration override (about 5% of a renewal's CPU, measured side
/// by side).
pub fn single_attempt_client(client: &Client) -> Client {
    if is_single_attempt(client) {
        return client.clone();
    }
    Client::from_conf(single_attempt_config(client).build())
}

/// `client`'s configuration with retries and stalled-stream protection off (the protocol
/// retries, and each request has its own deadline).
pub(crate) fn single_attempt_config(client: &Client) -> aws_sdk_dynamodb::config::Builder {
    client
        .config()
        .to_builder()
        .retry_config(RetryConfig::disabled())
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
}

fn is_single_attempt(client: &Client) -> bool {
    client.config().retry_config().is_some_and(|r| r.max_attempts() == 1)
}

/// For a client that would retry (one given to [`crate::fenced_put`] and friends): retries off
/// for this request only.
fn single_attempt_override() -> aws_sdk_dynamodb::config::Builder {
    aws_sdk_dynamodb::config::Builder::default().retry_config(RetryConfig::disabled())
}

/// `send` under the attempt's deadline: no answer in time is an ambiguous answer (the request
/// may have been applied), as the SDK's own attempt timeout would report it.
async fn within<T>(timeout: Duration, send: impl std::future::Future<Output = T>) -> std::result::Result<T, Answer> {
    tokio::time::timeout(timeout, send)
        .await
        .map_err(|_| Answer::Ambiguous(format!("no answer within the attempt's {} ms", timeout.as_millis())))
}

/// Sends the fluent request `$op` as one attempt under `$timeout` (retries switched off for this
/// request when the client would retry); returns from `execute` with an ambiguous answer when no
/// answer came in time.
macro_rules! attempt {
    ($op:expr, $retrying:expr, $timeout:expr) => {{
        let op = $op.customize();
        let op = if $retrying { op.config_override(single_attempt_override()) } else { op };
        match within($timeout, op.send()).await {
            Ok(sent) => sent,
            Err(answer) => return answer,
        }
    }};
}

fn ok(out: Output) -> Answer {
    Answer::Ok(out)
}

fn refused(e: Invalid) -> Answer {
    Answer::Other(format!("invalid request: {}", e.0))
}

/// Sends one request as one attempt and says what came back.
async fn execute(client: &Client, request: Request, timeout: Duration, extra: &[sdk::TransactWriteItem]) -> Answer {
    let retrying = !is_single_attempt(client);
    match request {
        Request::GetItem(r) => {
            let sent = attempt!(
                client
                    .get_item()
                    .table_name(r.table_name)
                    .set_key(Some(to_sdk_item(&r.key)))
                    .set_consistent_read(r.consistent_read),
                retrying,
                timeout
            );
            match sent {
                Ok(out) => ok(Output { item: out.item().map(from_sdk_item), ..Output::default() }),
                Err(e) => answer_of(e, |_| None),
            }
        }
        Request::UpdateItem(r) => {
            let sent = attempt!(
                client
                    .update_item()
                    .table_name(r.table_name)
                    .set_key(Some(to_sdk_item(&r.key)))
                    .update_expression(r.update_expression)
                    .set_condition_expression(r.condition_expression)
                    .set_expression_attribute_names(names(&r.expression_attribute_names))
                    .set_expression_attribute_values(values(&r.expression_attribute_values))
                    .set_return_values(r.return_values.as_deref().map(sdk::ReturnValue::from))
                    .set_return_values_on_condition_check_failure(convert::return_on_failure(
                        &r.return_values_on_condition_check_failure,
                    )),
                retrying,
                timeout
            );
            match sent {
                Ok(out) => ok(Output { attributes: out.attributes().map(from_sdk_item), ..Output::default() }),
                Err(e) => answer_of(e, |e| match e {
                    UpdateItemError::ConditionalCheckFailedException(c) => {
                        Some(Answer::ConditionFailed { item: c.item().map(from_sdk_item) })
                    }
                    _ => None,
                }),
            }
        }
        Request::Query(r) => {
            let sent = attempt!(
                client
                    .query()
                    .table_name(r.table_name)
                    .set_index_name(r.index_name)
                    .key_condition_expression(r.key_condition_expression)
                    .set_expression_attribute_names(names(&r.expression_attribute_names))
                    .set_expression_attribute_values(values(&r.expression_attribute_values))
                    .set_limit(r.limit.map(|l| l.min(i32::MAX as u32) as i32))
                    .set_exclusive_start_key(r.exclusive_start_key.as_ref().map(to_sdk_item))
                    .set_select(r.select.as_deref().map(sdk::Select::from))
                    .set_filter_expression(r.filter_expression.clone()),
                retrying,
                timeout
            );
            match sent {
                Ok(out) => ok(Output {
                    items: Some(out.items().iter().map(from_sdk_item).collect()),
                    last_evaluated_key: convert::last_key(out.last_evaluated_key()),
                    count: Some(out.count().max(0) as u64),
                    ..Output::default()
                }),
                Err(e) => answer_of(e, |_| None),
            }
        }
        Request::Scan(r) => {
            let sent = attempt!(
                client
                    .scan()
                    .table_name(r.table_name)
                    .set_consistent_read(r.consistent_read)
                    .set_limit(r.limit.map(|l| l.min(i32::MAX as u32) as i32))
                    .set_projection_expression(r.projection_expression.clone())
                    .set_filter_expression(r.filter_expression.clone())
                    .set_expression_attribute_names(names(&r.expression_attribute_names))
                    .set_expression_attribute_values(values(&r.expression_attribute_values))
                    .set_exclusive_start_key(r.exclusive_start_key.as_ref().map(to_sdk_item)),
                retrying,
                timeout
            );
            match sent {
                Ok(out) => ok(Output {
                    items: Some(out.items().iter().map(from_sdk_item).collect()),
                    last_evaluated_key: convert::last_key(out.last_evaluated_key()),
                    scanned_count: Some(out.scanned_count().max(0) as u64),
                    ..Output::default()
                }),
                Err(e) => answer_of(e, |_| None),
            }
        }
        Request::BatchGetItem(r) => {
            let mut items = HashMap::new();
            for (table, keys) in &r.request_items {
                match convert::keys_and_attributes(keys) {
                    Ok(k) => items.insert(table.clone(), k),
                    Err(e) => return refused(e),
                };
            }
            let sent = attempt!(client.batch_get_item().set_request_items(Some(items)), retrying, timeout);
            match sent {
                Ok(out) => ok(Output {
                    responses: convert::responses(out.responses()),
                    unprocessed_keys: convert::unprocessed(out.unprocessed_keys()),
                    ..Output::default()
                }),
                Err(e) => answer_of(e, |_| None),
            }
        }
        Request::TransactWriteItems(r) => {
            let mut items = Vec::with_capacity(r.transact_items.len() + extra.len());
            for t in &r.transact_items {
                match convert::transact_item(t) {
                    Ok(t) => items.push(t),
                    Err(e) => return refused(e),
                }
            }
            items.extend(extra.iter().cloned());
            let sent = attempt!(
                client
                    .transact_write_items()
                    .set_transact_items(Some(items))
                    .set_client_request_token(r.client_request_token),
                retrying,
                timeout
            );
            match sent {
                Ok(_) => ok(Output::default()),
                Err(e) => answer_of(e, |e| match e {
                    TransactWriteItemsError::TransactionCanceledException(c) => Some(Answer::TransactionCanceled {
                        reasons: convert::cancellation_reasons(c.cancellation_reasons()),
                    }),
                    _ => None,
                }),
            }
        }
        Request::CreateTable(r) => {
            let build = || -> std::result::Result<_, Invalid> {
                let defs =
                    r.attribute_definitions.iter().map(convert::attribute_definition).collect::<Result<Vec<_>, _>>()?;
                let gsis = r.global_secondary_indexes.iter().map(convert::gsi).collect::<Result<Vec<_>, _>>()?;
                Ok((defs, convert::key_schemas(&r.key_schema)?, gsis))
            };
            let (defs, key_schema, gsis) = match build() {
                Ok(parts) => parts,
                Err(e) => return refused(e),
            };
            let sent = attempt!(
                client
                    .create_table()
                    .table_name(&r.table_name)
                    .billing_mode(sdk::BillingMode::from(r.billing_mode.as_str()))
                    .set_attribute_definitions(Some(defs))
                    .set_key_schema(Some(key_schema))
                    .set_global_secondary_indexes(Some(gsis)),
                retrying,
                timeout
            );
            match sent {
                Ok(_) => ok(Output::default()),
                Err(e) => answer_of(e, |_| None),
            }
        }
        Request::UpdateTable(r) => {
            let build = || -> std::result::Result<_, Invalid> {
                let defs =
                    r.attribute_definitions.iter().map(convert::attribute_definition).collect::<Result<Vec<_>, _>>()?;
                let mut updates = Vec::new();
                for u in &r.global_secondary_index_updates {
                    let mut b = sdk::GlobalSecondaryIndexUpdate::builder();
                    if let Some(c) = &u.create {
                        b = b.create(convert::gsi_create(c)?);
                    }
                    updates.push(b.build());
                }
                Ok((defs, updates))
            };
            let (defs, updates) = match build() {
                Ok(parts) => parts,
                Err(e) => return refused(e),
            };
            let sent = attempt!(
                client
                    .update_table()
                    .table_name(&r.table_name)
                    .set_attribute_definitions(Some(defs))
                    .set_global_secondary_index_updates(Some(updates)),
                retrying,
                timeout
            );
            match sent {
                Ok(_) => ok(Output::default()),
                Err(e) => answer_of(e, |_| None),
            }
        }
        Request::DescribeTable(r) => {
            let sent = attempt!(client.describe_table().table_name(r.table_name), retrying, timeout);
            match sent {
                Ok(out) => ok(Output { table: out.table().map(convert::table_description), ..Output::default() }),
                Err(e) => answer_of(e, |_| None),
            }
        }
        Request::DescribeTimeToLive(r) => {
            let sent = attempt!(client.describe_time_to_live().table_name(r.table_name), retrying, timeout);
            match sent {
                Ok(out) => ok(Output {
                    time_to_live_description: out.time_to_live_description().map(|d| {
                        protocol::request::TimeToLiveDescription {
                            time_to_live_status: d.time_to_live_status().map(|s| s.as_str().to_string()),
                        }
                    }),
                    ..Output::default()
                }),
                Err(e) => answer_of(e, |_| None),
            }
        }
        Request::UpdateTimeToLive(r) => {
            let spec = match sdk::TimeToLiveSpecification::builder()
                .enabled(r.time_to_live_specification.enabled)
                .attribute_name(&r.time_to_live_specification.attribute_name)
                .build()
            {
                Ok(spec) => spec,
                Err(e) => return refused(Invalid(e.to_string())),
            };
            let sent = attempt!(
                client.update_time_to_live().table_name(r.table_name).time_to_live_specification(spec),
                retrying,
                timeout
            );
            match sent {
                Ok(_) => ok(Output::default()),
                Err(e) => answer_of(e, |_| None),
            }
        }
    }
}

/// A uniform draw in [0, 1) for backoff jitter.
fn jitter_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(SystemClock.monotonic_ms());
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[async_trait::async_trait]
impl LeaseStore for LeaseTable {
    fn config(&self) -> &TableConfig {
        &self.config
    }

    fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    async fn check_table(&self) -> Result<()> {
        self.replication().await.map(drop)
    }

    async fn measure_clock(&self, within_ms: u64) {
        if let Some(clock) = &self.store_clock {
            store_clock::measure(&self.attempts, &self.config.table_name, clock, within_ms).await;
        }
    }

    async fn start(&self, id: &str, url: &str) -> Result<LeaseItem> {
        self.run(protocol::Start::new(&self.config, id, url)?).await
    }

    async fn stop(&self, id: &str) -> Result<LeaseItem> {
        self.run(protocol::Stop::new(&self.config, id, self.clock.now_ms())?).await
    }

    async fn acquire(&self, id: &str, owner: &str) -> Result<Lease> {
        self.run(protocol::Acquire::new(&self.config, id, owner)?).await
    }

    async fn acquire_started(&self, id: &str, owner: &str) -> Result<Lease> {
        self.run(protocol::Acquire::started(&self.config, id, owner)?).await
    }

    async fn renew(&self, lease: &mut Lease) -> Result<()> {
        *lease = self.run(protocol::Renew::new(&self.config, lease)).await?;
        Ok(())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.run(protocol::Release::new(&self.config, lease)).await
    }

    async fn checkpoint(&self, lease: &mut Lease, seq: u64) -> Result<()> {
        *lease = self.run(protocol::Checkpoint::new(&self.config, lease, seq)).await?;
        Ok(())
    }

    async fn get(&self, id: &str) -> Result<Option<LeaseItem>> {
        self.run(protocol::Get::new(&self.config, id)?).await
    }

    async fn batch_desired_states(&self, ids: &[String]) -> Result<HashMap<String, Option<DesiredState>>> {
        self.run(protocol::BatchDesiredStates::new(&self.config, ids)?).await
    }

    async fn orphans_page(&self, cutoff_ms: u64, page_size: usize, after: Option<OrphanCursor>) -> Result<OrphanPage> {
        self.run(protocol::OrphansPage::new(&self.config, cutoff_ms, page_size, after)).await
    }

    async fn orphans_page_from(&self, cutoff_ms: u64, page_size: usize, first_shard: u32) -> Result<OrphanPage> {
        self.run(protocol::OrphansPage::starting_at(&self.config, cutoff_ms, page_size, first_shard)).await
    }

    async fn owned_by(&self, owner: &str) -> Result<Vec<LeaseItem>> {
        self.run(protocol::OwnedBy::new(&self.config, owner)?).await
    }

    async fn items(&self) -> Result<Vec<LeaseItem>> {
        self.run(protocol::Items::new(&self.config)).await
    }

    async fn create_session(&self, owner: &str, previous: Option<u64>) -> Result<Session> {
        self.run(protocol::CreateSession::new(&self.config, owner, previous)?).await
    }

    async fn renew_session(&self, session: &mut Session) -> Result<()> {
        *session = self.run(protocol::RenewSession::new(&self.config, session)).await?;
        Ok(())
    }

    async fn renew_session_reporting(&self, session: &mut Session, load: SessionLoad) -> Result<()> {
        *session = self.run(protocol::RenewSession::new(&self.config, session).reporting(load)).await?;
        Ok(())
    }

    async fn end_session(&self, session: &Session) -> Result<()> {
        self.run(protocol::EndSession::new(&self.config, session)).await
    }

    async fn end_session_reporting(&self, session: &Session, load: SessionLoad) -> Result<()> {
        self.run(protocol::EndSession::new(&self.config, session).reporting(load)).await
    }

    async fn retire_session(&self, owner: &str, epoch: u64) -> Result<bool> {
        self.run(protocol::RetireSession::new(&self.config, owner, epoch)?).await
    }

    async fn claim_in_session(&self, id: &str, session: &Session) -> Result<Lease> {
        self.run(protocol::ClaimInSession::new(&self.config, id, session)?).await
    }

    async fn claim_listed_in_session(&self, listed: &LeaseItem, epoch: u64, session: &Session) -> Result<Lease> {
        self.run(protocol::ClaimInSession::takeover(&self.config, listed, epoch, session)?).await
    }

    async fn take_over_listed(
        &self,
        owner: &str,
        epoch: u64,
        listed: Vec<LeaseItem>,
        session: &Session,
    ) -> Result<Vec<Option<Lease>>> {
        self.run(protocol::TakeOverListed::new(&self.config, owner, epoch, listed, session)?).await
    }

    async fn sessions(&self, below_ms: u64) -> Result<Vec<SessionItem>> {
        self.run(protocol::Sessions::new(&self.config, below_ms)).await
    }

    async fn stranded_page(&self, grace_ms: u64, after: Option<SweepCursor>, max_items: u64) -> Result<StrandedPage> {
        self.run(protocol::Stranded::new(&self.config, grace_ms, after, max_items)).await
    }
}

impl From<Invalid> for Error {
    fn from(e: Invalid) -> Self {
        Error::Store(format!("invalid request: {}", e.0))
    }
}
