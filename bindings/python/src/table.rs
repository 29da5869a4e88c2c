//! `leaselock::dynamo` for Python: the DynamoDB `LeaseTable`, every operation in a blocking form
//! and an awaitable one (`*_async`).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use leaselock::lease::claim_cutoff;
use leaselock::protocol::TableReplication;
use leaselock::{Attributes, Hold, LeaseMode, LeaseStore, LeaseTable, TableConfig};
use pyo3::prelude::*;

use crate::args::Arg;
use crate::errors::{guarded, invalid, to_py, to_py_named};
use crate::lease::{PyLease, PyLeaseItem};
use crate::session::{self, PySessionItem};
use crate::{awaitable, detached, wait};

/// Lease operations on one DynamoDB table.
#[pyclass(module = "leaselock._native", name = "LeaseTable", frozen)]
pub struct PyLeaseTable {
    pub(crate) table: Arc<LeaseTable>,
    /// Region, endpoint and credentials, for the worker's hint queue too.
    pub(crate) sdk: aws_config::SdkConfig,
}

/// `attributes={"owner": "holder", ...}` over the reference schema's names.
fn attributes_arg(py: Python<'_>, given: std::collections::BTreeMap<String, String>) -> PyResult<Attributes> {
    use leaselock::render;
    let mut a = Attributes::default();
    for (field, name) in given {
        let slot = match field.as_str() {
            "id" => &mut a.id,
            "desired_state" => &mut a.desired_state,
            "url" => &mut a.url,
            "owner" => &mut a.owner,
            "expires_at_ms" => &mut a.expires_at_ms,
            "last_seq" => &mut a.last_seq,
            "fence" => &mut a.fence,
            "ttl" => &mut a.ttl,
            _ => {
                return Err(invalid(
                    py,
                    "attributes",
                    &format!("invalid attributes: {} is not an attribute (id, desired_state, url, owner, expires_at_ms, last_seq, fence, ttl)", render::value(&field)),
                ))
            }
        };
        *slot = name;
    }
    Ok(a)
}

/// Core's config field names and the arguments the caller passed.
const CONFIG_NAMES: &[(&str, &str)] = &[
    ("lease_duration", "lease_ms"),
    ("renew_interval", "renew_ms"),
    ("clock_skew", "clock_skew_ms"),
    ("operation_budget", "operation_budget_ms"),
    ("operation_attempt_timeout", "operation_attempt_timeout_ms"),
];

/// A refused setting, named by the argument the caller passed.
fn config_error(py: Python<'_>, e: leaselock::Error) -> PyErr {
    to_py_named(py, e, CONFIG_NAMES)
}

impl PyLeaseTable {
    fn store(&self) -> Arc<dyn LeaseStore> {
        self.table.clone()
    }

    /// The store for a session operation: refused on a per-item table, whose workers would take
    /// a connection held under a session for one held forever.
    fn session_store(&self, py: Python<'_>) -> PyResult<Arc<dyn LeaseStore>> {
        if self.table.config().mode != LeaseMode::Session {
            return Err(invalid(py, "mode", "sessions need a table opened with mode=\"session\""));
        }
        Ok(self.store())
    }
}

/// One operation, as both forms of a method run it: `wait` for the blocking one, `awaitable` for
/// the `*_async` one.
type Op<T> = Pin<Box<dyn Future<Output = leaselock::Result<T>> + Send>>;

impl PyLeaseTable {
    fn sessions_op(&self, py: Python<'_>) -> PyResult<Op<Vec<PySessionItem>>> {
        let store = self.session_store(py)?;
        Ok(Box::pin(async move { store.sessions(u64::MAX).await.map(session_items) }))
    }
    /// The table check, once per table ([`LeaseTable::replication`]), as a short kind.
    fn check_table_op(&self) -> Op<&'static str> {
        let t = self.table.clone();
        Box::pin(async move { t.replication().await.map(|r| replication_kind(&r)) })
    }
    fn create_table_op(&self) -> Op<()> {
        let t = self.table.clone();
        Box::pin(async move { t.create_table().await })
    }
    fn start_op(&self, id: String, url: String) -> Op<PyLeaseItem> {
        let t = self.table.clone();
        Box::pin(async move { t.start(&id, &url).await.map(PyLeaseItem::from) })
    }
    fn stop_op(&self, id: String) -> Op<PyLeaseItem> {
        let t = self.table.clone();
        Box::pin(async move { t.stop(&id).await.map(PyLeaseItem::from) })
    }
    /// A claim; `renewed` makes it a `hold()`, renewed in the background.
    fn acquire_op(&self, id: String, owner: String, renewed: bool) -> Op<PyLease> {
        let store = self.store();
        Box::pin(async move { Hold::acquire(store, &id, &owner, renewed).await.map(PyLease::from) })
    }
    fn get_op(&self, id: String) -> Op<Option<PyLeaseItem>> {
        let t = self.table.clone();
        Box::pin(async move { t.get(&id).await.map(|i| i.map(PyLeaseItem::from)) })
    }
    fn orphans_op(&self, limit: Option<usize>) -> Op<Vec<PyLeaseItem>> {
        let t = self.table.clone();
        let cutoff = claim_cutoff(t.clock().now_ms(), t.config());
        Box::pin(async move { t.orphans(cutoff, limit).await.map(|v| v.into_iter().map(PyLeaseItem::from).collect()) })
    }
    fn desired_states_op(&self, ids: Vec<String>) -> Op<HashMap<String, Option<String>>> {
        let t = self.table.clone();
        Box::pin(async move { t.batch_desired_states(&ids).await.map(states) })
    }
    fn owned_by_op(&self, owner: String) -> Op<Vec<PyLeaseItem>> {
        let t = self.table.clone();
        Box::pin(async move { t.owned_by(&owner).await.map(|v| v.into_iter().map(PyLeaseItem::from).collect()) })
    }
}

fn session_items(v: Vec<leaselock::SessionItem>) -> Vec<PySessionItem> {
    v.into_iter().map(Into::into).collect()
}

#[pymethods]
impl PyLeaseTable {
    #[new]
    #[pyo3(signature = (table_name, *, region=Arg::Absent, endpoint_url=Arg::Absent, lease_ms=Arg::Int(20_000), renew_ms=Arg::Int(5_000),
        clock_skew_ms=Arg::Int(1_000), key_prefix=Arg::Text(""), index_name=Arg::Absent, owner_index_name=Arg::Absent, attributes=Arg::Absent, mode=Arg::Text("per-item"), orphan_shards=Arg::Int(1),
        allow_eventual_global_table=Arg::Bool(false), operation_budget_ms=Arg::Absent, operation_attempt_timeout_ms=Arg::Absent))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        table_name: Arg,
        region: Arg,
        endpoint_url: Arg,
        lease_ms: Arg,
        renew_ms: Arg,
        clock_skew_ms: Arg,
        key_prefix: Arg,
        index_name: Arg,
        owner_index_name: Arg,
        attributes: Arg,
        mode: Arg,
        orphan_shards: Arg,
        allow_eventual_global_table: Arg,
        operation_budget_ms: Arg,
        operation_attempt_timeout_ms: Arg,
    ) -> PyResult<Self> {
        guarded(|| {
            let mode = mode.text(py, "mode")?;
            let mode = LeaseMode::parse_option("mode", &mode).map_err(|e| to_py(py, e))?;
            let mut config = TableConfig::new(table_name.text(py, "table_name")?)
                .mode(mode)
                .lease_duration(lease_ms.ms(py, "lease_ms")?)
                .renew_interval(renew_ms.ms(py, "renew_ms")?)
                .clock_skew(clock_skew_ms.ms(py, "clock_skew_ms")?)
                .key_prefix(key_prefix.text(py, "key_prefix")?)
                .orphan_shards(orphan_shards.count(py, "orphan_shards")?)
                .allow_eventual_global_table(allow_eventual_global_table.flag(py, "allow_eventual_global_table")?)
                .attributes(attributes_arg(py, attributes.text_map(py, "attributes")?)?);
            if let Some(index) = index_name.opt_text(py, "index_name")? {
                config = config.index_name(index);
            }
            if let Some(index) = owner_index_name.opt_text(py, "owner_index_name")? {
                config = config.owner_index_name(index);
            }
            if let Some(budget) = operation_budget_ms.opt_ms(py, "operation_budget_ms")? {
                config = config.operation_budget(budget);
            }
            if let Some(timeout) = operation_attempt_timeout_ms.opt_ms(py, "operation_attempt_timeout_ms")? {
                config = config.operation_attempt_timeout(timeout);
            }
            config.validate().map_err(|e| config_error(py, e))?;
            let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
            if let Some(r) = region.opt_text(py, "region")? {
                loader = loader.region(aws_config::Region::new(r));
            }
            if let Some(e) = endpoint_url.opt_text(py, "endpoint_url")? {
                loader = loader.endpoint_url(e);
            }
            let sdk = detached(py, loader.load())?;
            let table = LeaseTable::new(aws_sdk_dynamodb::Client::new(&sdk), config).map_err(|e| to_py(py, e))?;
            Ok(Self { table: Arc::new(table), sdk })
        })
    }

    #[getter]
    fn table_name(&self) -> String {
        self.table.config().table_name.clone()
    }
    #[getter]
    fn lease_ms(&self) -> u64 {
        self.table.config().lease_ms()
    }
    #[getter]
    fn renew_ms(&self) -> u64 {
        self.table.config().renew_ms()
    }
    #[getter]
    fn operation_budget_ms(&self) -> u64 {
        self.table.config().operation_budget.as_millis() as u64
    }
    #[getter]
    fn operation_attempt_timeout_ms(&self) -> u64 {
        self.table.config().operation_attempt_timeout.as_millis() as u64
    }
    #[getter]
    fn clock_skew_ms(&self) -> u64 {
        self.table.config().skew_ms()
    }
    #[getter]
    fn key_prefix(&self) -> String {
        self.table.config().key_prefix.clone()
    }
    #[getter]
    fn orphan_shards(&self) -> u32 {
        self.table.config().orphan_shards
    }
    /// `"per-item"` or `"session"`.
    #[getter]
    fn mode(&self) -> &'static str {
        self.table.config().mode.as_str()
    }

    #[pyo3(signature = (owner, *, previous_epoch=Arg::Absent))]
    fn create_session(&self, py: Python<'_>, owner: Arg, previous_epoch: Arg) -> PyResult<session::PySession> {
        let store = self.session_store(py)?;
        let (owner, previous_epoch) = (owner.text(py, "owner")?, previous_epoch.opt_count(py, "previous_epoch")?);
        wait(py, session::create(store, owner, previous_epoch))
    }
    fn sessions(&self, py: Python<'_>) -> PyResult<Vec<PySessionItem>> {
        wait(py, self.sessions_op(py)?)
    }
    #[pyo3(signature = (owner, *, previous_epoch=Arg::Absent))]
    fn create_session_async<'py>(
        &self,
        py: Python<'py>,
        owner: Arg,
        previous_epoch: Arg,
    ) -> PyResult<Bound<'py, PyAny>> {
        let store = self.session_store(py)?;
        let (owner, previous_epoch) = (owner.text(py, "owner")?, previous_epoch.opt_count(py, "previous_epoch")?);
        awaitable(py, session::create(store, owner, previous_epoch))
    }
    fn sessions_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, self.sessions_op(py)?)
    }

    #[getter]
    fn allow_eventual_global_table(&self) -> bool {
        self.table.config().allow_eventual_global_table
    }

    fn check_table(&self, py: Python<'_>) -> PyResult<&'static str> {
        wait(py, self.check_table_op())
    }
    fn check_table_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, self.check_table_op())
    }
    fn create_table(&self, py: Python<'_>) -> PyResult<()> {
        wait(py, self.create_table_op())
    }
    fn start(&self, py: Python<'_>, id: Arg, url: Arg) -> PyResult<PyLeaseItem> {
        wait(py, self.start_op(id.text(py, "id")?, url.text(py, "url")?))
    }
    fn stop(&self, py: Python<'_>, id: Arg) -> PyResult<PyLeaseItem> {
        wait(py, self.stop_op(id.text(py, "id")?))
    }
    fn acquire(&self, py: Python<'_>, id: Arg, owner: Arg) -> PyResult<PyLease> {
        wait(py, self.acquire_op(id.text(py, "id")?, owner.text(py, "owner")?, false))
    }
    fn hold(&self, py: Python<'_>, id: Arg, owner: Arg) -> PyResult<PyLease> {
        wait(py, self.acquire_op(id.text(py, "id")?, owner.text(py, "owner")?, true))
    }
    fn get(&self, py: Python<'_>, id: Arg) -> PyResult<Option<PyLeaseItem>> {
        wait(py, self.get_op(id.text(py, "id")?))
    }
    #[pyo3(signature = (limit=Arg::Absent))]
    fn orphans(&self, py: Python<'_>, limit: Arg) -> PyResult<Vec<PyLeaseItem>> {
        wait(py, self.orphans_op(limit.opt_count(py, "limit")?))
    }
    fn desired_states(&self, py: Python<'_>, ids: Arg) -> PyResult<HashMap<String, Option<String>>> {
        wait(py, self.desired_states_op(ids.text_list(py, "ids")?))
    }
    fn owned_by(&self, py: Python<'_>, owner: Arg) -> PyResult<Vec<PyLeaseItem>> {
        wait(py, self.owned_by_op(owner.text(py, "owner")?))
    }

    fn create_table_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, self.create_table_op())
    }
    fn start_async<'py>(&self, py: Python<'py>, id: Arg, url: Arg) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, self.start_op(id.text(py, "id")?, url.text(py, "url")?))
    }
    fn stop_async<'py>(&self, py: Python<'py>, id: Arg) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, self.stop_op(id.text(py, "id")?))
    }
    fn acquire_async<'py>(&self, py: Python<'py>, id: Arg, owner: Arg) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, self.acquire_op(id.text(py, "id")?, owner.text(py, "owner")?, false))
    }
    fn hold_async<'py>(&self, py: Python<'py>, id: Arg, owner: Arg) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, self.acquire_op(id.text(py, "id")?, owner.text(py, "owner")?, true))
    }
    fn get_async<'py>(&self, py: Python<'py>, id: Arg) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, self.get_op(id.text(py, "id")?))
    }
    #[pyo3(signature = (limit=Arg::Absent))]
    fn orphans_async<'py>(&self, py: Python<'py>, limit: Arg) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, self.orphans_op(limit.opt_count(py, "limit")?))
    }
    fn desired_states_async<'py>(&self, py: Python<'py>, ids: Arg) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, self.desired_states_op(ids.text_list(py, "ids")?))
    }
    fn owned_by_async<'py>(&self, py: Python<'py>, owner: Arg) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, self.owned_by_op(owner.text(py, "owner")?))
    }
}

/// `"single-region"`, `"strong"` (a multi-Region strong consistency global table) or
/// `"not-checked"` (the table opts in to eventually consistent global tables).
fn replication_kind(r: &TableReplication) -> &'static str {
    match r {
        TableReplication::SingleRegion => "single-region",
        TableReplication::Strong { .. } => "strong",
        TableReplication::NotChecked => "not-checked",
    }
}

fn states(m: HashMap<String, Option<leaselock::DesiredState>>) -> HashMap<String, Option<String>> {
    m.into_iter().map(|(id, s)| (id, s.map(|s| s.as_str().to_string()))).collect()
}
