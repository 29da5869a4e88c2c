//! The DynamoDB store: every operation is one conditional write or one read, with the safety
//! rules of the lease model, throttling backoff and ambiguous-write resolution.

mod codec;
mod errors;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, GlobalSecondaryIndex, IndexStatus, KeySchemaElement, KeyType,
    KeysAndAttributes, Projection, ProjectionType, ReturnValue, ReturnValuesOnConditionCheckFailure,
    ScalarAttributeType, TableStatus, TimeToLiveSpecification, TimeToLiveStatus,
};
use aws_sdk_dynamodb::Client;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use tracing::{debug, warn};

use crate::config::{validate_id, validate_url};
use crate::lease::{backoff_ms, claim_cutoff, expiry_for, holds, retry_fits};
use crate::store::{unique_ids, OrphanCursor, OrphanPage};
use crate::{Clock, DesiredState, Error, Lease, LeaseItem, LeaseStore, Result, SystemClock, TableConfig};
use codec::{item_from_attrs, key, n, s, Attrs};
use errors::{classify, Failure};

/// How long one request attempt may take before it counts as ambiguous.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// BatchGetItem's limit.
const BATCH_GET_MAX: usize = 100;

/// What a request ended in, once throttling has been retried.
enum Outcome<T, C> {
    Done(T),
    Condition(C),
    /// Timed out or 5xx: may or may not have been applied.
    Ambiguous,
}

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
    config: TableConfig,
    clock: Arc<dyn Clock>,
}

impl LeaseTable {
    /// A store over `client`; the config is validated first.
    pub fn new(client: Client, config: TableConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self { client, config, clock: Arc::new(SystemClock) })
    }

    /// A store with the SDK's default configuration (environment, profile; `AWS_ENDPOINT_URL`).
    pub async fn connect(config: TableConfig) -> Result<Self> {
        let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        Self::new(Client::new(&sdk), config)
    }

    /// The same table seen through another clock (tests, simulations).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Creates the table, its sparse orphan index and TTL on `ttl`; waits until all are active.
    /// Does nothing to a table that already exists.
    pub async fn create_table(&self) -> Result<()> {
        let a = &self.config.attributes;
        let attr = |name: &str, t: ScalarAttributeType| {
            AttributeDefinition::builder().attribute_name(name).attribute_type(t).build().map_err(store_err)
        };
        let key_el = |name: &str, t: KeyType| {
            KeySchemaElement::builder().attribute_name(name).key_type(t).build().map_err(store_err)
        };
        let gsi = GlobalSecondaryIndex::builder()
            .index_name(&self.config.index_name)
            .key_schema(key_el(&a.desired_state, KeyType::Hash)?)
            .key_schema(key_el(&a.expires_at_ms, KeyType::Range)?)
            .projection(Projection::builder().projection_type(ProjectionType::All).build())
            .build()
            .map_err(store_err)?;
        let created = self
            .client
            .create_table()
            .table_name(&self.config.table_name)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(attr(&a.id, ScalarAttributeType::S)?)
            .attribute_definitions(attr(&a.desired_state, ScalarAttributeType::S)?)
            .attribute_definitions(attr(&a.expires_at_ms, ScalarAttributeType::N)?)
            .key_schema(key_el(&a.id, KeyType::Hash)?)
            .global_secondary_indexes(gsi)
            .send()
            .await;
        match created {
            Ok(_) => debug!(table = %self.config.table_name, "table created"),
            Err(e) if e.as_service_error().is_some_and(|e| e.is_resource_in_use_exception()) => {}
            Err(e) => return Err(sdk_err(e)),
        }
        self.wait_active(Duration::from_secs(120)).await?;
        let ttl =
            self.client.describe_time_to_live().table_name(&self.config.table_name).send().await.map_err(sdk_err)?;
        let status = ttl.time_to_live_description().and_then(|d| d.time_to_live_status().cloned());
        if !matches!(status, Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)) {
            self.client
                .update_time_to_live()
                .table_name(&self.config.table_name)
                .time_to_live_specification(
                    TimeToLiveSpecification::builder()
                        .enabled(true)
                        .attribute_name(&a.ttl)
                        .build()
                        .map_err(store_err)?,
                )
                .send()
                .await
                .map_err(sdk_err)?;
        }
        Ok(())
    }

    async fn wait_active(&self, limit: Duration) -> Result<()> {
        let until = tokio::time::Instant::now() + limit;
        loop {
            let out = self.client.describe_table().table_name(&self.config.table_name).send().await.map_err(sdk_err)?;
            let table = out.table();
            let table_active = table.and_then(|t| t.table_status()) == Some(&TableStatus::Active);
            let index_active = table
                .map(|t| t.global_secondary_indexes())
                .unwrap_or_default()
                .iter()
                .all(|g| g.index_status().is_none_or(|s| *s == IndexStatus::Active));
            if table_active && index_active {
                return Ok(());
            }
            if tokio::time::Instant::now() >= until {
                return Err(Error::Store(format!("table {} not active after {limit:?}", self.config.table_name)));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn budget_until(&self) -> u64 {
        self.clock.monotonic_ms() + self.config.renew_ms()
    }

    /// Backs off before retry `attempt`, or says `Throttled` when the budget would run out.
    async fn pause(&self, attempt: u32, until_mono: u64) -> Result<()> {
        let delay = backoff_ms(attempt, 25, 1_000, jitter_unit());
        if !retry_fits(self.clock.monotonic_ms(), delay, until_mono) {
            return Err(Error::Throttled);
        }
        tokio::time::sleep(Duration::from_millis(delay)).await;
        Ok(())
    }

    /// Sends `op`, retrying throttling with backoff (and, for reads, ambiguous failures) within
    /// the budget. Conditional failures and ambiguous writes go back to the caller.
    async fn send<T, E, C, Fut>(
        &self,
        until_mono: u64,
        retry_ambiguous: bool,
        condition: impl Fn(&E) -> Option<C>,
        op: impl Fn() -> Fut,
    ) -> Result<Outcome<T, C>>
    where
        Fut: Future<Output = std::result::Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let mut attempt = 0;
        loop {
            let failure = match op().await {
                Ok(out) => return Ok(Outcome::Done(out)),
                Err(e) => classify(e, &condition),
            };
            match failure {
                Failure::Condition(c) => return Ok(Outcome::Condition(c)),
                Failure::Throttled(msg) => debug!(%msg, attempt, "throttled"),
                Failure::Ambiguous(msg) if retry_ambiguous => debug!(%msg, attempt, "read failed, retrying"),
                Failure::Ambiguous(msg) => {
                    warn!(%msg, "write outcome unknown, re-reading");
                    return Ok(Outcome::Ambiguous);
                }
                Failure::Fatal(msg) if msg.starts_with("ResourceNotFoundException") => {
                    return Err(Error::TableNotFound { table: self.config.table_name.clone() })
                }
                Failure::Fatal(msg) => return Err(Error::Store(msg)),
            }
            self.pause(attempt, until_mono).await?;
            attempt += 1;
        }
    }

    /// A read: throttling and ambiguous failures are retried within the budget.
    async fn send_read<T, E, Fut>(&self, until_mono: u64, op: impl Fn() -> Fut) -> Result<T>
    where
        Fut: Future<Output = std::result::Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        match self.send(until_mono, true, |_: &E| None::<()>, op).await? {
            Outcome::Done(out) => Ok(out),
            Outcome::Condition(()) | Outcome::Ambiguous => unreachable!("reads retry ambiguity and have no condition"),
        }
    }

    /// One UpdateItem returning the new item, or the old one when the condition fails.
    async fn update(&self, until_mono: u64, req: &UpdateRequest) -> Result<Outcome<LeaseItem, Option<LeaseItem>>> {
        let config = &self.config;
        let outcome = self
            .send(
                until_mono,
                false,
                |e: &UpdateItemError| match e {
                    UpdateItemError::ConditionalCheckFailedException(c) => {
                        Some(c.item().map(|old| item_from_attrs(config, old)))
                    }
                    _ => None,
                },
                || {
                    self.client
                        .update_item()
                        .table_name(&config.table_name)
                        .set_key(Some(key(config, &req.id)))
                        .update_expression(&req.update)
                        .set_condition_expression(req.condition.clone())
                        .set_expression_attribute_names(Some(req.names.clone()))
                        .set_expression_attribute_values((!req.values.is_empty()).then(|| req.values.clone()))
                        .return_values(ReturnValue::AllNew)
                        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                        .customize()
                        .config_override(single_attempt())
                        .send()
                },
            )
            .await?;
        Ok(match outcome {
            Outcome::Done(out) => Outcome::Done(item_from_attrs(config, out.attributes().unwrap_or(&HashMap::new()))),
            Outcome::Condition(old) => Outcome::Condition(old),
            Outcome::Ambiguous => Outcome::Ambiguous,
        })
    }

    /// A strongly consistent read, retried within the budget.
    async fn read(&self, id: &str, until_mono: u64) -> Result<Option<LeaseItem>> {
        let out = self
            .send_read(until_mono, || {
                self.client
                    .get_item()
                    .table_name(&self.config.table_name)
                    .set_key(Some(key(&self.config, id)))
                    .consistent_read(true)
                    .customize()
                    .config_override(single_attempt())
                    .send()
            })
            .await?;
        Ok(out.item().map(|attrs| item_from_attrs(&self.config, attrs)))
    }

    /// Scans the table (optionally filtered), page by page.
    async fn scan(&self, filter: Option<(&str, Attrs, HashMap<String, String>)>) -> Result<Vec<LeaseItem>> {
        let mut out = Vec::new();
        let mut start: Option<Attrs> = None;
        loop {
            let until = self.budget_until();
            let page = self
                .send_read(until, || {
                    let mut req =
                        self.client.scan().table_name(&self.config.table_name).set_exclusive_start_key(start.clone());
                    if let Some((expr, values, names)) = &filter {
                        req = req
                            .filter_expression(*expr)
                            .set_expression_attribute_values(Some(values.clone()))
                            .set_expression_attribute_names(Some(names.clone()));
                    }
                    req.customize().config_override(single_attempt()).send()
                })
                .await?;
            out.extend(self.own_items(page.items()));
            match page.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => return Ok(out),
            }
        }
    }

    /// Items under this table's key prefix.
    fn own_items<'a>(&'a self, items: &'a [Attrs]) -> impl Iterator<Item = LeaseItem> + 'a {
        items.iter().filter_map(|attrs| {
            let k = attrs.get(&self.config.attributes.id)?.as_s().ok()?;
            k.starts_with(&self.config.key_prefix).then(|| item_from_attrs(&self.config, attrs))
        })
    }

    fn names(&self, pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }
}

impl LeaseTable {
    async fn renew_within_deadline(&self, lease: &mut Lease) -> Result<()> {
        let a = &self.config.attributes;
        let mut sent_attempts: Vec<(u64, u64)> = Vec::new();
        let mut attempt = 0;
        loop {
            let now = self.clock.now_ms();
            let sent = self.clock.monotonic_ms();
            if lease.is_past_deadline(sent) {
                return Err(Error::Lost { id: lease.id.clone() });
            }
            let exp = expiry_for(now, &self.config);
            let req = UpdateRequest::under_lease(
                &self.config,
                lease,
                "SET #exp = :exp",
                None,
                &[("#exp", &a.expires_at_ms)],
                vec![(":exp", n(exp))],
            );
            match self.update(lease.deadline_mono_ms, &req).await? {
                Outcome::Done(item) => {
                    *lease = Lease::from_item(item, &lease.owner, sent, &self.config);
                    return Ok(());
                }
                Outcome::Condition(_) => return Err(Error::Lost { id: lease.id.clone() }),
                Outcome::Ambiguous => {
                    sent_attempts.push((exp, sent));
                    let current = self.read(&lease.id, lease.deadline_mono_ms).await?;
                    if !holds(&current, lease) {
                        return Err(Error::Lost { id: lease.id.clone() });
                    }
                    let item = current.expect("held item exists");
                    if let Some(&(_, sent)) = sent_attempts.iter().find(|(exp, _)| Some(*exp) == item.expires_at_ms) {
                        *lease = Lease::from_item(item, &lease.owner, sent, &self.config);
                        return Ok(());
                    }
                }
            }
            self.pause(attempt, lease.deadline_mono_ms).await?;
            attempt += 1;
        }
    }

    async fn checkpoint_within_deadline(&self, lease: &mut Lease, seq: u64) -> Result<()> {
        let a = &self.config.attributes;
        let req = UpdateRequest::under_lease(
            &self.config,
            lease,
            "SET #seq = :seq",
            Some("(attribute_not_exists(#seq) OR #seq < :seq)"),
            &[("#seq", &a.last_seq)],
            vec![(":seq", n(seq))],
        );
        let mut attempt = 0;
        loop {
            if lease.is_past_deadline(self.clock.monotonic_ms()) {
                return Err(Error::Lost { id: lease.id.clone() });
            }
            let current = match self.update(lease.deadline_mono_ms, &req).await? {
                Outcome::Done(_) => {
                    lease.last_seq = Some(seq);
                    return Ok(());
                }
                Outcome::Condition(old) => Some(old),
                Outcome::Ambiguous => {
                    let current = self.read(&lease.id, lease.deadline_mono_ms).await?;
                    if holds(&current, lease) && current.as_ref().and_then(|i| i.last_seq) == Some(seq) {
                        lease.last_seq = Some(seq);
                        return Ok(());
                    }
                    (!holds(&current, lease) || current.as_ref().and_then(|i| i.last_seq) > Some(seq))
                        .then_some(current)
                }
            };
            if let Some(current) = current {
                if !holds(&current, lease) {
                    return Err(Error::Lost { id: lease.id.clone() });
                }
                let last_seq = current.and_then(|i| i.last_seq).unwrap_or(0);
                return Err(Error::SeqNotIncreasing { id: lease.id.clone(), last_seq, seq });
            }
            self.pause(attempt, lease.deadline_mono_ms).await?;
            attempt += 1;
        }
    }
}

/// One UpdateItem's expressions.
struct UpdateRequest {
    id: String,
    update: String,
    condition: Option<String>,
    names: HashMap<String, String>,
    values: Attrs,
}

impl UpdateRequest {
    /// An update of `lease`'s item made only while it is still this lease: owner and fence
    /// (plus `extra`, if any) must match. `#owner`, `#fence`, `:me` and `:fence` are added.
    fn under_lease(
        config: &TableConfig,
        lease: &Lease,
        update: &str,
        extra: Option<&str>,
        names: &[(&str, &str)],
        values: Vec<(&str, AttributeValue)>,
    ) -> Self {
        let a = &config.attributes;
        let condition = match extra {
            Some(extra) => format!("#owner = :me AND #fence = :fence AND {extra}"),
            None => "#owner = :me AND #fence = :fence".to_string(),
        };
        let names = names.iter().copied().chain([("#owner", a.owner.as_str()), ("#fence", a.fence.as_str())]);
        let values = values.into_iter().chain([(":me", s(&lease.owner)), (":fence", n(lease.fence))]);
        UpdateRequest {
            id: lease.id.clone(),
            update: update.to_string(),
            condition: Some(condition),
            names: names.map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            values: values.map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }
}

/// Our own loop retries; the SDK's must not (a blind retry of an applied claim would look held).
fn single_attempt() -> aws_sdk_dynamodb::config::Builder {
    aws_sdk_dynamodb::config::Builder::default()
        .retry_config(RetryConfig::disabled())
        .timeout_config(TimeoutConfig::builder().operation_attempt_timeout(ATTEMPT_TIMEOUT).build())
}

fn store_err(e: impl std::fmt::Display) -> Error {
    Error::Store(e.to_string())
}

fn sdk_err<E: std::error::Error + 'static>(e: SdkError<E, HttpResponse>) -> Error {
    Error::Store(aws_smithy_types::error::display::DisplayErrorContext(&e).to_string())
}

/// A uniform draw in [0, 1) for backoff jitter.
fn jitter_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(SystemClock.monotonic_ms());
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// A renewal or checkpoint that cannot get through before the deadline has lost the lease.
fn lost_if_throttled(e: Error, id: String) -> Error {
    match e {
        Error::Throttled => Error::Lost { id },
        e => e,
    }
}

#[async_trait::async_trait]
impl LeaseStore for LeaseTable {
    fn config(&self) -> &TableConfig {
        &self.config
    }

    fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    async fn start(&self, id: &str, url: &str) -> Result<LeaseItem> {
        validate_id("id", id)?;
        validate_url(url)?;
        let a = &self.config.attributes;
        let req = UpdateRequest {
            id: id.to_string(),
            update: "SET #ds = :started, #url = :url, #exp = if_not_exists(#exp, :zero) REMOVE #ttl".into(),
            condition: None,
            names: self.names(&[
                ("#ds", &a.desired_state),
                ("#url", &a.url),
                ("#exp", &a.expires_at_ms),
                ("#ttl", &a.ttl),
            ]),
            values: HashMap::from([
                (":started".into(), s(DesiredState::Started.as_str())),
                (":url".into(), s(url)),
                (":zero".into(), n(0)),
            ]),
        };
        let until = self.budget_until();
        let mut attempt = 0;
        loop {
            // Idempotent: an ambiguous attempt is simply sent again.
            match self.update(until, &req).await? {
                Outcome::Done(item) => return Ok(item),
                Outcome::Condition(_) => unreachable!("start has no condition"),
                Outcome::Ambiguous => self.pause(attempt, until).await?,
            }
            attempt += 1;
        }
    }

    async fn stop(&self, id: &str) -> Result<LeaseItem> {
        validate_id("id", id)?;
        let a = &self.config.attributes;
        let ttl = self.clock.now_ms() / 1000 + self.config.stopped_retention.as_secs();
        let req = UpdateRequest {
            id: id.to_string(),
            update: "SET #ds = :stopped, #ttl = :ttl".into(),
            condition: Some("attribute_exists(#pk)".into()),
            names: self.names(&[("#ds", &a.desired_state), ("#ttl", &a.ttl), ("#pk", &a.id)]),
            values: HashMap::from([(":stopped".into(), s(DesiredState::Stopped.as_str())), (":ttl".into(), n(ttl))]),
        };
        let until = self.budget_until();
        let mut attempt = 0;
        loop {
            match self.update(until, &req).await? {
                Outcome::Done(item) => return Ok(item),
                Outcome::Condition(_) => return Err(Error::NotFound { id: id.to_string() }),
                Outcome::Ambiguous => self.pause(attempt, until).await?,
            }
            attempt += 1;
        }
    }

    async fn acquire(&self, id: &str, owner: &str) -> Result<Lease> {
        validate_id("id", id)?;
        validate_id("owner", owner)?;
        let a = &self.config.attributes;
        let until = self.budget_until();
        let first_sent = self.clock.monotonic_ms();
        let mut ambiguous = false;
        let mut attempt = 0;
        loop {
            let now = self.clock.now_ms();
            let sent = self.clock.monotonic_ms();
            let cutoff = claim_cutoff(now, &self.config);
            let req = UpdateRequest {
                id: id.to_string(),
                update: "SET #owner = :owner, #exp = :exp ADD #fence :one".into(),
                // Rule 1: only an expiry older than our clock minus the skew may be taken.
                condition: Some(
                    "(attribute_not_exists(#exp) OR #exp < :cutoff) AND (attribute_not_exists(#ds) OR #ds <> :stopped)"
                        .into(),
                ),
                names: self.names(&[
                    ("#owner", &a.owner),
                    ("#exp", &a.expires_at_ms),
                    ("#fence", &a.fence),
                    ("#ds", &a.desired_state),
                ]),
                values: HashMap::from([
                    (":owner".into(), s(owner)),
                    (":exp".into(), n(expiry_for(now, &self.config))),
                    (":one".into(), n(1)),
                    (":cutoff".into(), n(cutoff)),
                    (":stopped".into(), s(DesiredState::Stopped.as_str())),
                ]),
            };
            let current = match self.update(until, &req).await? {
                Outcome::Done(item) => return Ok(Lease::from_item(item, owner, sent, &self.config)),
                Outcome::Condition(old) => old,
                Outcome::Ambiguous => {
                    ambiguous = true;
                    self.read(id, until).await?
                }
            };
            if let Some(item) = &current {
                // After an ambiguous attempt our own claim may have landed: the deadline then
                // counts from the first send, the earliest it can have been written.
                if ambiguous && item.owner.as_deref() == Some(owner) && item.expires_at_ms.is_some_and(|e| e >= cutoff)
                {
                    return Ok(Lease::from_item(item.clone(), owner, first_sent, &self.config));
                }
                if item.desired_state == Some(DesiredState::Stopped) {
                    return Err(Error::Stopped { id: id.to_string() });
                }
                if let Some(exp) = item.expires_at_ms.filter(|&e| e >= cutoff) {
                    return Err(Error::Held { owner: item.owner.clone().unwrap_or_default(), expires_at_ms: exp });
                }
            }
            self.pause(attempt, until).await?;
            attempt += 1;
        }
    }

    async fn renew(&self, lease: &mut Lease) -> Result<()> {
        let id = lease.id.clone();
        self.renew_within_deadline(lease).await.map_err(|e| lost_if_throttled(e, id))
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let a = &self.config.attributes;
        let req = UpdateRequest::under_lease(
            &self.config,
            lease,
            "SET #exp = :zero",
            None,
            &[("#exp", &a.expires_at_ms)],
            vec![(":zero", n(0))],
        );
        let until = self.budget_until();
        let mut attempt = 0;
        loop {
            match self.update(until, &req).await? {
                Outcome::Done(_) => return Ok(()),
                Outcome::Condition(_) => return Err(Error::Lost { id: lease.id.clone() }),
                Outcome::Ambiguous => {
                    let current = self.read(&lease.id, until).await?;
                    if !holds(&current, lease) {
                        return Err(Error::Lost { id: lease.id.clone() });
                    }
                    if current.and_then(|i| i.expires_at_ms) == Some(0) {
                        return Ok(());
                    }
                }
            }
            self.pause(attempt, until).await?;
            attempt += 1;
        }
    }

    async fn checkpoint(&self, lease: &mut Lease, seq: u64) -> Result<()> {
        let id = lease.id.clone();
        self.checkpoint_within_deadline(lease, seq).await.map_err(|e| lost_if_throttled(e, id))
    }

    async fn get(&self, id: &str) -> Result<Option<LeaseItem>> {
        validate_id("id", id)?;
        self.read(id, self.budget_until()).await
    }

    async fn batch_desired_states(&self, ids: &[String]) -> Result<HashMap<String, Option<DesiredState>>> {
        let ids = unique_ids(ids)?;
        let a = &self.config.attributes;
        let mut out: HashMap<String, Option<DesiredState>> = ids.iter().map(|id| (id.to_string(), None)).collect();
        for chunk in ids.chunks(BATCH_GET_MAX) {
            let mut pending: Vec<Attrs> = chunk.iter().map(|id| key(&self.config, id)).collect();
            let until = self.budget_until();
            let mut attempt = 0;
            while !pending.is_empty() {
                let keys = KeysAndAttributes::builder()
                    .set_keys(Some(std::mem::take(&mut pending)))
                    .projection_expression("#pk, #ds")
                    .expression_attribute_names("#pk", &a.id)
                    .expression_attribute_names("#ds", &a.desired_state)
                    .consistent_read(true)
                    .build()
                    .map_err(store_err)?;
                let request = HashMap::from([(self.config.table_name.clone(), keys.clone())]);
                let resp = self
                    .send_read(until, || {
                        self.client
                            .batch_get_item()
                            .set_request_items(Some(request.clone()))
                            .customize()
                            .config_override(single_attempt())
                            .send()
                    })
                    .await?;
                for attrs in resp.responses().and_then(|r| r.get(&self.config.table_name)).into_iter().flatten() {
                    let item = item_from_attrs(&self.config, attrs);
                    out.insert(item.id, item.desired_state);
                }
                if let Some(unprocessed) = resp.unprocessed_keys().and_then(|u| u.get(&self.config.table_name)) {
                    pending = unprocessed.keys().to_vec();
                }
                if !pending.is_empty() {
                    self.pause(attempt, until).await?;
                    attempt += 1;
                }
            }
        }
        Ok(out)
    }

    async fn orphans_page(&self, cutoff_ms: u64, page_size: usize, after: Option<OrphanCursor>) -> Result<OrphanPage> {
        let a = &self.config.attributes;
        let start = after.map(|c| {
            HashMap::from([
                (a.id.clone(), s(c.key)),
                (a.desired_state.clone(), s(&self.config.started_partition)),
                (a.expires_at_ms.clone(), n(c.expires_at_ms)),
            ])
        });
        let until = self.budget_until();
        let page = self
            .send_read(until, || {
                self.client
                    .query()
                    .table_name(&self.config.table_name)
                    .index_name(&self.config.index_name)
                    .key_condition_expression("#ds = :started AND #exp < :cutoff")
                    .expression_attribute_names("#ds", &a.desired_state)
                    .expression_attribute_names("#exp", &a.expires_at_ms)
                    .expression_attribute_values(":started", s(&self.config.started_partition))
                    .expression_attribute_values(":cutoff", n(cutoff_ms))
                    .limit(page_size.clamp(1, i32::MAX as usize) as i32)
                    .set_exclusive_start_key(start.clone())
                    .customize()
                    .config_override(single_attempt())
                    .send()
            })
            .await?;
        let next = page.last_evaluated_key().filter(|k| !k.is_empty()).and_then(|k| {
            Some(OrphanCursor {
                key: k.get(&a.id)?.as_s().ok()?.clone(),
                expires_at_ms: k.get(&a.expires_at_ms)?.as_n().ok()?.parse().ok()?,
            })
        });
        Ok(OrphanPage { items: self.own_items(page.items()).collect(), next })
    }

    async fn owned_by(&self, owner: &str) -> Result<Vec<LeaseItem>> {
        validate_id("owner", owner)?;
        let a = &self.config.attributes;
        let values = HashMap::from([(":o".to_string(), s(owner)), (":now".to_string(), n(self.clock.now_ms()))]);
        let names = self.names(&[("#owner", &a.owner), ("#exp", &a.expires_at_ms)]);
        self.scan(Some(("#owner = :o AND #exp > :now", values, names))).await
    }

    async fn items(&self) -> Result<Vec<LeaseItem>> {
        self.scan(None).await
    }
}
