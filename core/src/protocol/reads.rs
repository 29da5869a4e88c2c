//! The reads: one item, desired states in batches, orphan pages, an owner's leases, every item.
//! Reads are idempotent, so throttling, timeouts and 5xx are all retried within the budget.

use std::collections::{BTreeMap, HashMap};

use super::ops::consistent_get;
use super::request::{BatchGetItem, KeysAndAttributes, Output, Query, Request, Scan};
use super::value::{is_own, item_from_attrs, key, n, s, Item};
use super::{read_answer, Budget, Input, Operation, Step};
use crate::config::validate_id;
use crate::store::{unique_ids, OrphanCursor, OrphanPage};
use crate::{DesiredState, LeaseItem, SessionItem, SessionLoad, TableConfig};

/// BatchGetItem's limit of keys per request.
pub const BATCH_GET_MAX: usize = 100;

/// A read that sends `pending` until it gets an output.
#[derive(Debug, Clone)]
pub(super) struct Reads {
    table: String,
    budget: Budget,
    pending: Request,
}

impl Reads {
    pub(super) fn new(config: &TableConfig, first: Request) -> Self {
        Self { table: config.table_name.clone(), budget: Budget::operation(config), pending: first }
    }

    /// The output of the pending request, or the step to take first.
    #[allow(clippy::result_large_err)]
    pub(super) fn step<T>(&mut self, input: &mut Input) -> Result<Output, Step<T>> {
        match input.answer.take() {
            None => Err(self.budget.send(input.mono_ms, self.pending.clone())),
            Some(answer) => read_answer(&mut self.budget, input, answer, &self.table),
        }
    }

    /// Sends the next page's request, with a fresh budget.
    pub(super) fn then<T>(&mut self, input: &Input, request: Request) -> Step<T> {
        self.pending = request;
        self.budget.restart(input.mono_ms);
        self.budget.send(input.mono_ms, self.pending.clone())
    }
}

/// `get`: a strongly consistent read of one item.
#[derive(Debug, Clone)]
pub struct Get {
    config: TableConfig,
    reads: Reads,
}

impl Get {
    pub fn new(config: &TableConfig, id: &str) -> crate::Result<Self> {
        validate_id("id", id)?;
        Ok(Self { config: config.clone(), reads: Reads::new(config, consistent_get(config, id)) })
    }
}

impl Operation for Get {
    type Output = Option<LeaseItem>;
    fn next(&mut self, mut input: Input) -> Step<Option<LeaseItem>> {
        match self.reads.step(&mut input) {
            Ok(out) => Step::Done(out.item.map(|i| item_from_attrs(&self.config, &i))),
            Err(step) => step,
        }
    }
}

/// Consistent BatchGetItems of `ids` (in chunks of [`BATCH_GET_MAX`]), asking again for the
/// unprocessed keys; gives every item found under the config's names.
#[derive(Debug, Clone)]
pub(crate) struct BatchGet {
    config: TableConfig,
    chunks: Vec<Vec<Item>>,
    projection: Option<(String, BTreeMap<String, String>)>,
    pub(crate) found: Vec<LeaseItem>,
}

impl BatchGet {
    pub(crate) fn new(config: &TableConfig, ids: &[&str], projection: Option<(&str, &[(&str, &str)])>) -> Self {
        let keys: Vec<Item> = ids.iter().map(|id| key(config, id)).collect();
        let mut chunks: Vec<Vec<Item>> = keys.chunks(BATCH_GET_MAX).map(<[Item]>::to_vec).collect();
        chunks.reverse();
        let projection = projection
            .map(|(p, names)| (p.to_string(), names.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()));
        Self { config: config.clone(), chunks, projection, found: Vec::new() }
    }

    fn request(&self, keys: Vec<Item>) -> Request {
        let (projection_expression, expression_attribute_names) = match &self.projection {
            Some((p, names)) => (Some(p.clone()), names.clone()),
            None => (None, BTreeMap::new()),
        };
        let ask =
            KeysAndAttributes { keys, projection_expression, expression_attribute_names, consistent_read: Some(true) };
        Request::BatchGetItem(BatchGetItem { request_items: BTreeMap::from([(self.config.table_name.clone(), ask)]) })
    }

    /// The first request, or `None` when there is nothing to read.
    pub(crate) fn first(&mut self) -> Option<Request> {
        self.chunks.pop().map(|keys| self.request(keys))
    }

    /// Takes in one answer; the next request, or `None` when every key was read.
    pub(crate) fn take(&mut self, out: Output) -> Option<Request> {
        let table = &self.config.table_name;
        for attrs in out.responses.and_then(|mut r| r.remove(table)).unwrap_or_default() {
            self.found.push(item_from_attrs(&self.config, &attrs));
        }
        let unprocessed = out.unprocessed_keys.and_then(|mut u| u.remove(table)).map(|k| k.keys).unwrap_or_default();
        if !unprocessed.is_empty() {
            return Some(self.request(unprocessed));
        }
        self.first()
    }
}

/// `batch_desired_states`: the desired state of every id (`None` without an item or a state).
#[derive(Debug, Clone)]
pub struct BatchDesiredStates {
    ids: Vec<String>,
    batch: BatchGet,
    reads: Option<Reads>,
}

impl BatchDesiredStates {
    pub fn new(config: &TableConfig, ids: &[String]) -> crate::Result<Self> {
        let unique = unique_ids(ids)?;
        let a = &config.attributes;
        let mut batch =
            BatchGet::new(config, &unique, Some(("#pk, #ds", &[("#pk", &a.id), ("#ds", &a.desired_state)])));
        let reads = batch.first().map(|r| Reads::new(config, r));
        Ok(Self { ids: unique.into_iter().map(str::to_string).collect(), batch, reads })
    }

    fn result(&self) -> HashMap<String, Option<DesiredState>> {
        let mut out: HashMap<String, Option<DesiredState>> = self.ids.iter().map(|id| (id.clone(), None)).collect();
        for item in &self.batch.found {
            out.insert(item.id.clone(), item.desired_state);
        }
        out
    }
}

impl Operation for BatchDesiredStates {
    type Output = HashMap<String, Option<DesiredState>>;
    fn next(&mut self, mut input: Input) -> Step<Self::Output> {
        let Some(reads) = self.reads.as_mut() else { return Step::Done(self.result()) };
        let out = match reads.step(&mut input) {
            Ok(out) => out,
            Err(step) => return step,
        };
        match self.batch.take(out) {
            Some(request) => self.reads.as_mut().expect("reading").then(&input, request),
            None => Step::Done(self.result()),
        }
    }
}

/// `orphans_page`: STARTED items whose expiry is below `cutoff_ms`, oldest first (a Query on the
/// orphan index). With [`TableConfig::orphan_shards`] N > 1 the page reads the shards in turn,
/// from [`TableConfig::first_orphan_shard`] of the cutoff round all N (or from the cursor's
/// shard), oldest first within each, one Query after another until the page is full: a page may
/// hold items of several shards, and the cursor says in which shard to go on.
#[derive(Debug, Clone)]
pub struct OrphansPage {
    config: TableConfig,
    cutoff_ms: u64,
    page_size: usize,
    /// The shard the pending Query reads, and how many were read before it in this listing.
    shard: u32,
    done_before: u32,
    items: Vec<LeaseItem>,
    reads: Reads,
}

impl OrphansPage {
    pub fn new(config: &TableConfig, cutoff_ms: u64, page_size: usize, after: Option<OrphanCursor>) -> Self {
        Self::listing(config, cutoff_ms, page_size, after, config.first_orphan_shard(cutoff_ms))
    }

    /// The first page of a listing that reads shard `first_shard` (modulo N) first instead of
    /// the one the cutoff picks, then goes round all of them: workers that poll at one moment
    /// each start where they choose, so their claims spread over the shards. A listing begun
    /// here is one page (a cursor from it goes on as [`OrphansPage::new`] would).
    pub fn starting_at(config: &TableConfig, cutoff_ms: u64, page_size: usize, first_shard: u32) -> Self {
        Self::listing(config, cutoff_ms, page_size, None, first_shard % config.orphan_shards.max(1))
    }

    fn listing(
        config: &TableConfig,
        cutoff_ms: u64,
        page_size: usize,
        after: Option<OrphanCursor>,
        first: u32,
    ) -> Self {
        let page_size = page_size.clamp(1, i32::MAX as usize);
        let shards = config.orphan_shards.max(1);
        let shard = after.as_ref().map_or(first, |c| c.shard.min(shards - 1));
        let done_before = (shard + shards - first) % shards;
        let query = Self::query(config, cutoff_ms, shard, page_size, after);
        Self {
            config: config.clone(),
            cutoff_ms,
            page_size,
            shard,
            done_before,
            items: Vec::new(),
            reads: Reads::new(config, query),
        }
    }

    fn query(config: &TableConfig, cutoff_ms: u64, shard: u32, limit: usize, after: Option<OrphanCursor>) -> Request {
        let a = &config.attributes;
        let partition = config.started_partitions().swap_remove(shard as usize);
        let start = after.map(|c| {
            Item::from([
                (a.id.clone(), s(c.key)),
                (a.desired_state.clone(), s(&partition)),
                (a.expires_at_ms.clone(), n(c.expires_at_ms)),
            ])
        });
        Request::Query(Query {
            table_name: config.table_name.clone(),
            index_name: Some(config.index_name.clone()),
            key_condition_expression: "#ds = :started AND #exp < :cutoff".into(),
            expression_attribute_names: BTreeMap::from([
                ("#ds".into(), a.desired_state.clone()),
                ("#exp".into(), a.expires_at_ms.clone()),
            ]),
            expression_attribute_values: Item::from([
                (":started".into(), s(partition)),
                (":cutoff".into(), n(cutoff_ms)),
            ]),
            limit: Some(limit as u32),
            exclusive_start_key: start,
            ..Query::default()
        })
    }
}

impl Operation for OrphansPage {
    type Output = OrphanPage;
    fn next(&mut self, mut input: Input) -> Step<OrphanPage> {
        let out = match self.reads.step(&mut input) {
            Ok(out) => out,
            Err(step) => return step,
        };
        let a = &self.config.attributes;
        let shard = self.shard;
        let next = out.last_evaluated_key.clone().filter(|k| !k.is_empty()).and_then(|k| {
            Some(OrphanCursor {
                key: k.get(&a.id)?.as_s()?.to_string(),
                expires_at_ms: k.get(&a.expires_at_ms)?.as_n()?.parse().ok()?,
                shard,
            })
        });
        self.items.extend(own_items(&self.config, out.items.unwrap_or_default()));
        let more_shards = self.done_before + 1 < self.config.orphan_shards;
        if next.is_some() || !more_shards {
            return Step::Done(OrphanPage { items: std::mem::take(&mut self.items), next });
        }
        // This shard is read to its end.
        if self.items.len() < self.page_size {
            self.shard = (self.shard + 1) % self.config.orphan_shards;
            self.done_before += 1;
            let query = Self::query(&self.config, self.cutoff_ms, self.shard, self.page_size - self.items.len(), None);
            return self.reads.then(&input, query);
        }
        // Full at the end of a shard: the next page goes on after its last item (and finds the
        // next shard).
        let next = self.items.last().map(|i| OrphanCursor {
            key: self.config.key(&i.id),
            expires_at_ms: i.expires_at_ms.unwrap_or(0),
            shard,
        });
        Step::Done(OrphanPage { items: std::mem::take(&mut self.items), next })
    }
}

/// `sessions`: the session items whose expiry is below `below_ms` (dead sessions with a claim
/// cutoff; every session with `u64::MAX`), oldest first. A Query of the orphan index's session
/// partition, every page: sessions are found without a scan.
#[derive(Debug, Clone)]
pub struct Sessions {
    config: TableConfig,
    query: Query,
    found: Vec<SessionItem>,
    reads: Reads,
}

impl Sessions {
    pub fn new(config: &TableConfig, below_ms: u64) -> Self {
        let a = &config.attributes;
        let query = Query {
            table_name: config.table_name.clone(),
            index_name: Some(config.index_name.clone()),
            key_condition_expression: "#ds = :session AND #exp < :below".into(),
            expression_attribute_names: BTreeMap::from([
                ("#ds".into(), a.desired_state.clone()),
                ("#exp".into(), a.expires_at_ms.clone()),
            ]),
            expression_attribute_values: Item::from([
                (":session".into(), s(&config.session_partition)),
                // DynamoDB numbers are decimals: u64::MAX is a valid bound.
                (":below".into(), n(below_ms)),
            ]),
            ..Query::default()
        };
        Self {
            config: config.clone(),
            reads: Reads::new(config, Request::Query(query.clone())),
            query,
            found: Vec::new(),
        }
    }
}

impl Operation for Sessions {
    type Output = Vec<SessionItem>;
    fn next(&mut self, mut input: Input) -> Step<Vec<SessionItem>> {
        let out = match self.reads.step(&mut input) {
            Ok(out) => out,
            Err(step) => return step,
        };
        for attrs in out.items.iter().flatten().filter(|attrs| is_own(&self.config, attrs)) {
            let item = item_from_attrs(&self.config, attrs);
            if let Some(owner) = self.config.session_owner(&item.id) {
                let load = |name: &str| super::session::number(attrs, name);
                let load = load(&self.config.session_held_attribute)
                    .zip(load(&self.config.session_capacity_attribute))
                    .map(|(held, max_connections)| SessionLoad { held, max_connections });
                self.found.push(SessionItem {
                    owner: owner.to_string(),
                    epoch: item.fence,
                    expires_at_ms: item.expires_at_ms.unwrap_or(0),
                    load,
                });
            }
        }
        if let Some(start) = next_start(&out) {
            let query = Query { exclusive_start_key: Some(start), ..self.query.clone() };
            return self.reads.then(&input, Request::Query(query));
        }
        let mut found = std::mem::take(&mut self.found);
        found.sort_by(|a, b| (a.expires_at_ms, &a.owner).cmp(&(b.expires_at_ms, &b.owner)));
        Step::Done(found)
    }
}

fn own_items(config: &TableConfig, items: Vec<Item>) -> Vec<LeaseItem> {
    items.iter().filter(|attrs| is_own(config, attrs)).map(|attrs| item_from_attrs(config, attrs)).collect()
}

fn next_start(out: &Output) -> Option<Item> {
    out.last_evaluated_key.clone().filter(|k| !k.is_empty())
}

/// `owned_by`: the items whose lease `owner` holds now. A Query on the owner index (keys only,
/// every page), then consistent BatchGetItems of the ids found, kept when held by `owner` at the
/// wall time of the last answer. No scan: the cost follows the owner's items, not the table.
#[derive(Debug, Clone)]
pub struct OwnedBy {
    config: TableConfig,
    owner: String,
    query: Query,
    ids: Vec<String>,
    batch: Option<BatchGet>,
    reads: Reads,
}

impl OwnedBy {
    pub fn new(config: &TableConfig, owner: &str) -> crate::Result<Self> {
        validate_id("owner", owner)?;
        let query = Query {
            table_name: config.table_name.clone(),
            index_name: Some(config.owner_index_name.clone()),
            key_condition_expression: "#owner = :owner".into(),
            expression_attribute_names: BTreeMap::from([("#owner".into(), config.attributes.owner.clone())]),
            expression_attribute_values: Item::from([(":owner".into(), s(owner))]),
            ..Query::default()
        };
        Ok(Self {
            config: config.clone(),
            owner: owner.into(),
            reads: Reads::new(config, Request::Query(query.clone())),
            query,
            ids: Vec::new(),
            batch: None,
        })
    }

    fn held(&self, now_ms: u64) -> Vec<LeaseItem> {
        let mut items: Vec<LeaseItem> = self
            .batch
            .iter()
            .flat_map(|b| b.found.iter())
            .filter(|i| i.holder_at(now_ms) == Some(self.owner.as_str()))
            .cloned()
            .collect();
        items.sort_by(|a, b| a.id.cmp(&b.id));
        items
    }
}

impl Operation for OwnedBy {
    type Output = Vec<LeaseItem>;
    fn next(&mut self, mut input: Input) -> Step<Vec<LeaseItem>> {
        let out = match self.reads.step(&mut input) {
            Ok(out) => out,
            Err(step) => return step,
        };
        if let Some(batch) = self.batch.as_mut() {
            return match batch.take(out) {
                Some(request) => self.reads.then(&input, request),
                None => Step::Done(self.held(input.now_ms)),
            };
        }
        let a = &self.config.attributes;
        for attrs in out.items.iter().flatten().filter(|attrs| is_own(&self.config, attrs)) {
            if let Some(k) = attrs.get(&a.id).and_then(|v| v.as_s()) {
                self.ids.push(self.config.id_of(k).to_string());
            }
        }
        if let Some(start) = next_start(&out) {
            let query = Query { exclusive_start_key: Some(start), ..self.query.clone() };
            return self.reads.then(&input, Request::Query(query));
        }
        let ids: Vec<&str> = self.ids.iter().map(String::as_str).collect();
        let mut batch = BatchGet::new(&self.config, &ids, None);
        let first = batch.first();
        self.batch = Some(batch);
        match first {
            Some(request) => self.reads.then(&input, request),
            None => Step::Done(Vec::new()),
        }
    }
}

/// `items`: every item under the key prefix (a Scan, every page).
#[derive(Debug, Clone)]
pub struct Items {
    config: TableConfig,
    found: Vec<LeaseItem>,
    reads: Reads,
}

impl Items {
    pub fn new(config: &TableConfig) -> Self {
        let scan = Scan { table_name: config.table_name.clone(), ..Scan::default() };
        Self { config: config.clone(), found: Vec::new(), reads: Reads::new(config, Request::Scan(scan)) }
    }
}

impl Operation for Items {
    type Output = Vec<LeaseItem>;
    fn next(&mut self, mut input: Input) -> Step<Vec<LeaseItem>> {
        let out = match self.reads.step(&mut input) {
            Ok(out) => out,
            Err(step) => return step,
        };
        let start = next_start(&out);
        self.found.extend(own_items(&self.config, out.items.unwrap_or_default()));
        match start {
            Some(start) => {
                let scan = Scan {
                    table_name: self.config.table_name.clone(),
                    exclusive_start_key: Some(start),
                    ..Scan::default()
                };
                self.reads.then(&input, Request::Scan(scan))
            }
            None => Step::Done(std::mem::take(&mut self.found)),
        }
    }
}

/// `count_by_state`: how many items of this application have the desired state `state` in the
/// orphan index (a `COUNT` query over every page, no item read), keeping only those whose expiry
/// is at least `min_expires_at_ms` when given. STARTED counts the index's started partition
/// values (every orphan shard, one after another).
#[derive(Debug, Clone)]
pub struct CountByState {
    query: Query,
    /// The partition values still to count after the pending one (the other orphan shards).
    partitions: Vec<String>,
    total: u64,
    reads: Reads,
}

impl CountByState {
    pub fn new(config: &TableConfig, state: DesiredState, min_expires_at_ms: Option<u64>) -> Self {
        let a = &config.attributes;
        let mut partitions = match state {
            DesiredState::Started => config.started_partitions(),
            DesiredState::Stopped => vec![state.as_str().to_string()],
        };
        let partition = partitions.remove(0);
        let mut names = BTreeMap::from([("#ds".to_string(), a.desired_state.clone())]);
        let mut values = Item::from([(":state".to_string(), s(partition))]);
        let mut key_condition = "#ds = :state".to_string();
        if let Some(min) = min_expires_at_ms {
            key_condition.push_str(" AND #exp >= :min");
            names.insert("#exp".into(), a.expires_at_ms.clone());
            values.insert(":min".into(), n(min));
        }
        // Other applications may share the table under other prefixes.
        let filter_expression = (!config.key_prefix.is_empty()).then(|| {
            names.insert("#pk".into(), a.id.clone());
            values.insert(":prefix".into(), s(&config.key_prefix));
            "begins_with(#pk, :prefix)".to_string()
        });
        let query = Query {
            table_name: config.table_name.clone(),
            index_name: Some(config.index_name.clone()),
            key_condition_expression: key_condition,
            expression_attribute_names: names,
            expression_attribute_values: values,
            select: Some("COUNT".into()),
            filter_expression,
            ..Query::default()
        };
        Self { reads: Reads::new(config, Request::Query(query.clone())), query, partitions, total: 0 }
    }
}

impl Operation for CountByState {
    type Output = u64;
    fn next(&mut self, mut input: Input) -> Step<u64> {
        let out = match self.reads.step(&mut input) {
            Ok(out) => out,
            Err(step) => return step,
        };
        self.total += out.count.unwrap_or(0);
        match out.last_evaluated_key.filter(|k| !k.is_empty()) {
            Some(start) => {
                let query = Query { exclusive_start_key: Some(start), ..self.query.clone() };
                self.reads.then(&input, Request::Query(query))
            }
            None if self.partitions.is_empty() => Step::Done(self.total),
            None => {
                let mut query = Query { exclusive_start_key: None, ..self.query.clone() };
                query.expression_attribute_values.insert(":state".into(), s(self.partitions.remove(0)));
                self.query = query.clone();
                self.reads.then(&input, Request::Query(query))
            }
        }
    }
}
