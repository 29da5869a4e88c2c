//! Shared set-up for the worker tests: a store on tokio's clock, a record of which handler runs
//! where, a store wrapper that injects faults, and the local AWS engine.
#![allow(dead_code)]

#[path = "../local_engine/mod.rs"]
pub mod local_engine;
pub mod proxy;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leaselock::worker::{BoxError, Connection, TokioClock, WorkerBuilder, WorkerHandle};
use leaselock::{
    Clock, DesiredState, Error, Lease, LeaseItem, LeaseStore, LeaseTable, MemoryStore, OrphanCursor, OrphanPage,
    Result, SkewedClock, TableConfig, WorkerSnapshot,
};

pub const EPOCH_MS: u64 = 1_700_000_000_000;

/// Short leases for tests: lease 3 s, renew 1 s, skew 0.5 s.
pub fn short_config() -> TableConfig {
    TableConfig::new("leases")
        .lease_duration(Duration::from_secs(3))
        .renew_interval(Duration::from_secs(1))
        .clock_skew(Duration::from_millis(500))
        .validated()
        .unwrap()
}

/// A memory store whose clock follows tokio's (paused) time.
pub fn memory_store(config: TableConfig) -> MemoryStore {
    MemoryStore::new(config, Arc::new(TokioClock::new(EPOCH_MS))).unwrap()
}

/// Another worker's view of the same items, its wall clock `offset_ms` off `store`'s.
pub fn skewed(store: &MemoryStore, offset_ms: i64) -> MemoryStore {
    store.with_clock(Arc::new(SkewedClock { inner: ClockOf(store.clone()), offset_ms }))
}

/// The clock a store sees time through.
#[derive(Debug)]
pub struct ClockOf(pub MemoryStore);

impl Clock for ClockOf {
    fn now_ms(&self) -> u64 {
        self.0.clock().now_ms()
    }

    fn monotonic_ms(&self) -> u64 {
        self.0.clock().monotonic_ms()
    }
}

pub async fn start_items(store: &dyn LeaseStore, prefix: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = format!("{prefix}{i:02}");
        store.start(&id, &format!("wss://feed.example/{id}")).await.unwrap();
        ids.push(id);
    }
    ids
}

/// Polls `cond` every 10 ms until it holds; panics with `what` after `limit`. Returns the time
/// it took.
pub async fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let start = tokio::time::Instant::now();
    loop {
        if cond() {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Which worker's handler runs for which id right now; any overlap is recorded.
#[derive(Debug, Default)]
pub struct Tracker {
    inside: Mutex<HashMap<String, String>>,
    per_worker: Mutex<HashMap<String, (usize, usize)>>,
    violations: Mutex<Vec<String>>,
    entries: AtomicU64,
}

pub struct Inside {
    tracker: Arc<Tracker>,
    id: String,
    worker: String,
}

impl Tracker {
    pub fn enter(self: &Arc<Self>, id: &str, worker: &str) -> Inside {
        let mut inside = self.inside.lock().unwrap();
        if let Some(other) = inside.insert(id.to_string(), worker.to_string()) {
            self.violations.lock().unwrap().push(format!("{id}: {worker} entered while {other} was running it"));
        }
        let mut per = self.per_worker.lock().unwrap();
        let (now, max) = per.entry(worker.to_string()).or_default();
        *now += 1;
        *max = (*max).max(*now);
        self.entries.fetch_add(1, Ordering::SeqCst);
        Inside { tracker: self.clone(), id: id.to_string(), worker: worker.to_string() }
    }

    pub fn violations(&self) -> Vec<String> {
        self.violations.lock().unwrap().clone()
    }

    /// The most handlers `worker` ran at once.
    pub fn max_concurrent(&self, worker: &str) -> usize {
        self.per_worker.lock().unwrap().get(worker).map_or(0, |(_, max)| *max)
    }

    pub fn running(&self, worker: &str) -> usize {
        self.per_worker.lock().unwrap().get(worker).map_or(0, |(now, _)| *now)
    }

    pub fn entries(&self) -> u64 {
        self.entries.load(Ordering::SeqCst)
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let mut inside = self.tracker.inside.lock().unwrap();
        if inside.get(&self.id) == Some(&self.worker) {
            inside.remove(&self.id);
        }
        if let Some((now, _)) = self.tracker.per_worker.lock().unwrap().get_mut(&self.worker) {
            *now -= 1;
        }
    }
}

/// A metrics writer the test can read back.
#[derive(Debug, Clone, Default)]
pub struct Lines(pub Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    pub fn json(&self) -> Vec<serde_json::Value> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines().map(|l| serde_json::from_str(l).expect("each metrics line is JSON")).collect()
    }
}

/// A store that delegates to another and injects faults: a partition (every call fails),
/// renewals or checkpoints that never answer, claims applied whose answer is lost, and slow
/// releases. It notes when (store clock,
/// monotonic ms) each checkpoint call began.
#[derive(Debug)]
pub struct Faulty<S> {
    pub inner: S,
    pub partitioned: AtomicBool,
    pub renew_hangs: AtomicBool,
    pub checkpoint_hangs: AtomicBool,
    /// Every checkpoint that reached the store: (the store clock's monotonic ms, the lease's fence).
    pub checkpoint_calls: Mutex<Vec<(u64, u64)>>,
    pub release_delay_ms: AtomicU64,
    pub releases_in_flight: AtomicU32,
    pub max_releases_in_flight: AtomicU32,
    /// The next this many fleet claims are applied, then answered "outcome unknown".
    pub claim_answers_lost: AtomicU32,
    /// While set, orphan-index and owner-index reads wait (the session listing does not);
    /// `orphan_reads_waiting` counts the reads waiting.
    pub orphan_reads_held_back: AtomicBool,
    pub orphan_reads_waiting: AtomicU32,
    /// A claim under a session is applied at once and answered this much later (a slow answer).
    pub session_claim_answer_delay_ms: AtomicU64,
}

impl<S> Faulty<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            partitioned: AtomicBool::new(false),
            renew_hangs: AtomicBool::new(false),
            checkpoint_hangs: AtomicBool::new(false),
            checkpoint_calls: Mutex::new(Vec::new()),
            release_delay_ms: AtomicU64::new(0),
            releases_in_flight: AtomicU32::new(0),
            max_releases_in_flight: AtomicU32::new(0),
            claim_answers_lost: AtomicU32::new(0),
            orphan_reads_held_back: AtomicBool::new(false),
            orphan_reads_waiting: AtomicU32::new(0),
            session_claim_answer_delay_ms: AtomicU64::new(0),
        }
    }

    /// Unreachable: the error; with `renew_hangs`, never answers.
    async fn renewal_allowed(&self) -> Result<()> {
        self.reachable()?;
        if self.renew_hangs.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    async fn orphan_read_allowed(&self) {
        if !self.orphan_reads_held_back.load(Ordering::SeqCst) {
            return;
        }
        self.orphan_reads_waiting.fetch_add(1, Ordering::SeqCst);
        while self.orphan_reads_held_back.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.orphan_reads_waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<S> Faulty<S> {
    fn reachable(&self) -> Result<()> {
        if self.partitioned.load(Ordering::SeqCst) {
            return Err(Error::Store("partitioned".into()));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl<S: LeaseStore> LeaseStore for Faulty<S> {
    fn config(&self) -> &TableConfig {
        self.inner.config()
    }
    fn clock(&self) -> &dyn Clock {
        self.inner.clock()
    }
    async fn start(&self, id: &str, url: &str) -> Result<LeaseItem> {
        self.reachable()?;
        self.inner.start(id, url).await
    }
    async fn stop(&self, id: &str) -> Result<LeaseItem> {
        self.reachable()?;
        self.inner.stop(id).await
    }
    async fn acquire(&self, id: &str, owner: &str) -> Result<Lease> {
        self.reachable()?;
        self.inner.acquire(id, owner).await
    }
    async fn acquire_started(&self, id: &str, owner: &str) -> Result<Lease> {
        self.reachable()?;
        let lease = self.inner.acquire_started(id, owner).await?;
        let lose = self.claim_answers_lost.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if lose.is_ok() {
            return Err(Error::Timeout { outcome_unknown: true });
        }
        Ok(lease)
    }
    async fn renew(&self, lease: &mut Lease) -> Result<()> {
        self.renewal_allowed().await?;
        self.inner.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.reachable()?;
        let now = self.releases_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_releases_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(self.release_delay_ms.load(Ordering::SeqCst))).await;
        let out = self.inner.release(lease).await;
        self.releases_in_flight.fetch_sub(1, Ordering::SeqCst);
        out
    }
    async fn checkpoint(&self, lease: &mut Lease, seq: u64) -> Result<()> {
        self.reachable()?;
        self.checkpoint_calls.lock().unwrap().push((self.inner.clock().monotonic_ms(), lease.fence));
        if self.checkpoint_hangs.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.inner.checkpoint(lease, seq).await
    }
    async fn get(&self, id: &str) -> Result<Option<LeaseItem>> {
        self.reachable()?;
        self.inner.get(id).await
    }
    async fn batch_desired_states(&self, ids: &[String]) -> Result<HashMap<String, Option<DesiredState>>> {
        self.reachable()?;
        self.inner.batch_desired_states(ids).await
    }
    async fn orphans_page(&self, cutoff_ms: u64, page_size: usize, after: Option<OrphanCursor>) -> Result<OrphanPage> {
        self.reachable()?;
        self.orphan_read_allowed().await;
        self.inner.orphans_page(cutoff_ms, page_size, after).await
    }
    async fn owned_by(&self, owner: &str) -> Result<Vec<LeaseItem>> {
        self.reachable()?;
        self.orphan_read_allowed().await;
        self.inner.owned_by(owner).await
    }
    async fn items(&self) -> Result<Vec<LeaseItem>> {
        self.reachable()?;
        self.inner.items().await
    }
    async fn create_session(&self, owner: &str, previous: Option<u64>) -> Result<leaselock::Session> {
        self.renewal_allowed().await?;
        self.inner.create_session(owner, previous).await
    }
    async fn renew_session(&self, session: &mut leaselock::Session) -> Result<()> {
        self.renewal_allowed().await?;
        self.inner.renew_session(session).await
    }
    async fn renew_session_reporting(
        &self,
        session: &mut leaselock::Session,
        load: leaselock::SessionLoad,
    ) -> Result<()> {
        self.renewal_allowed().await?;
        self.inner.renew_session_reporting(session, load).await
    }
    async fn end_session(&self, session: &leaselock::Session) -> Result<()> {
        self.reachable()?;
        self.inner.end_session(session).await
    }
    async fn end_session_reporting(&self, session: &leaselock::Session, load: leaselock::SessionLoad) -> Result<()> {
        self.reachable()?;
        self.inner.end_session_reporting(session, load).await
    }
    async fn retire_session(&self, owner: &str, epoch: u64) -> Result<bool> {
        self.reachable()?;
        self.inner.retire_session(owner, epoch).await
    }
    async fn claim_in_session(&self, id: &str, session: &leaselock::Session) -> Result<Lease> {
        self.reachable()?;
        let claimed = self.inner.claim_in_session(id, session).await;
        tokio::time::sleep(Duration::from_millis(self.session_claim_answer_delay_ms.load(Ordering::SeqCst))).await;
        claimed
    }
    async fn sessions(&self, below_ms: u64) -> Result<Vec<leaselock::SessionItem>> {
        self.reachable()?;
        self.inner.sessions(below_ms).await
    }
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A name no other test (or run) uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}-{:04x}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst), rand::random::<u16>())
}

/// The SDK configuration for the local AWS engine, or `None` (with a note) when none is
/// configured. With `LEASELOCK_REQUIRE_SERVICES=1` a missing engine is a failure.
pub async fn aws() -> Option<aws_config::SdkConfig> {
    local_engine::endpoint(std::thread::current().name().unwrap_or("a worker test"))?;
    Some(aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await)
}

/// A fresh lease table on the local engine.
pub async fn lease_table(sdk: &aws_config::SdkConfig, config: TableConfig) -> LeaseTable {
    let config = TableConfig { table_name: unique("worker"), ..config };
    let table = LeaseTable::new(aws_sdk_dynamodb::Client::new(sdk), config).unwrap();
    table.create_table().await.unwrap();
    table
}

/// Starts `builder`'s worker with handlers that wait to be cancelled, taking START hints from
/// `queue` (long polls of 1 s) and polling orphans every `orphan_interval`.
pub fn spawn_hinted(
    builder: WorkerBuilder,
    sqs: &aws_sdk_sqs::Client,
    queue: &str,
    orphan_interval: Duration,
) -> (WorkerHandle, tokio::task::JoinHandle<WorkerSnapshot>) {
    let worker = builder
        .orphan_interval(orphan_interval)
        .hint_queue(sqs.clone(), queue)
        .hint_wait(Duration::from_secs(1))
        .metrics_writer(Lines::default())
        .build(|conn: Connection| async move {
            conn.cancelled().await;
            Ok::<(), BoxError>(())
        })
        .unwrap();
    let handle = worker.handle();
    (handle, tokio::spawn(worker.run_until(std::future::pending())))
}
