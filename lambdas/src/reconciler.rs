//! The reconciler: on a schedule, finds running work that nobody holds (the sparse orphan index),
//! sends START hints for it in batches, and reports counts as EMF metrics. It never claims a
//! lease: workers do, and the lease decides.
//!
//! In session mode, every [`Sweep::every_minutes`] it also sweeps the table for stranded work:
//! connections held under a session that is gone, of another epoch, or dead for longer than the
//! grace, which survivors never list when the owner index lagged past their wait and the session
//! was retired ([`LeaseStore::stranded_page`]). The sweep reads the base table only, with
//! consistent Scans, never an index, so it finds such work whatever an index's lag; each id found
//! gets a START hint, and the claim it leads to takes the work over.
//!
//! # What a sweep costs
//!
//! One strongly consistent Scan of the whole table: about one read unit per 4 KB of items read
//! (the projection and the filter trim the answer, not the units), plus one consistent read per
//! owner of held work whose session it did not read live. At 100,000 items of about 250 bytes that
//! is 25 MB, about 6,100 read units per sweep; at the default interval (10 minutes, 4,320 sweeps
//! in a 30-day month) about 26.4 million read request units a month, about $3.30 on demand at
//! $0.125 per million (the us-east-1 price since November 2024). The cost grows with the table,
//! not with what is stranded; `0` turns the sweep off.

use std::collections::HashSet;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{stream, StreamExt};
use lambda_runtime::{Diagnostic, LambdaEvent};
use leaselock::lease::claim_cutoff;
use leaselock::protocol::CountByState;
use leaselock::{DesiredState, LeaseItem, LeaseStore, LeaseTable, MemoryStore, OrphanCursor, OrphanPage};
use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::emf::EmfWriter;
use crate::hint_sender::{Hint, HintSender, MAX_BATCH};

/// Orphans read per index query (default).
pub const PAGE_SIZE: usize = 1000;
/// Hint batches in flight at once (default).
pub const CONCURRENT_BATCHES: usize = 16;
/// Tries per hint batch (the first send and the retries of refused entries).
pub const SEND_ATTEMPTS: u32 = 4;
/// Tries per page of the orphan query.
pub const PAGE_ATTEMPTS: u32 = 3;
/// Items one part of the sweep reads (a few Scan pages, about 2.5 MB at 250-byte items): the
/// run's deadline is checked between parts, and each part's hints are sent as it ends.
pub const SWEEP_PART_ITEMS: u64 = 10_000;
/// Minutes between sweeps for stranded work (default).
pub const DEFAULT_SWEEP_INTERVAL_MINUTES: u32 = 10;
/// How long a session must have been dead, beyond the skew, before its work counts as stranded
/// (default): the survivors' own takeover has had that long.
pub const DEFAULT_SWEEP_GRACE_MS: u64 = 60_000;

/// When the reconciler sweeps the table for stranded work (session mode), and with what grace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sweep {
    /// A run sweeps when its invocation minute (minutes since the epoch, from the scheduled
    /// event's `time`) is a multiple of this: stateless, one sweep per interval when it is a
    /// multiple of the schedule's period. 0: never.
    pub every_minutes: u32,
    /// Work of a dead session is stranded once the session's expiry is older than
    /// `now - clock_skew - grace_ms`.
    pub grace_ms: u64,
}

impl Sweep {
    /// No sweep.
    pub const OFF: Sweep = Sweep { every_minutes: 0, grace_ms: DEFAULT_SWEEP_GRACE_MS };

    /// Whether a run invoked at `time_ms` (epoch ms) sweeps.
    pub fn is_due(&self, time_ms: u64) -> bool {
        self.every_minutes > 0 && (time_ms / 60_000) % u64::from(self.every_minutes) == 0
    }
}

impl Default for Sweep {
    fn default() -> Self {
        Sweep { every_minutes: DEFAULT_SWEEP_INTERVAL_MINUTES, grace_ms: DEFAULT_SWEEP_GRACE_MS }
    }
}

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
        self.run(CountByState::new(self.config(), state, min_expires_at_ms)).await
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
    /// Session mode: work held under dead sessions (counted in `orphans` and hinted too).
    pub dead_session_work: u64,
    pub hints_sent: u64,
    /// Hints still refused after every retry.
    pub hints_failed: u64,
    /// Orphans read but not hinted because the run's deadline came first.
    pub hints_deferred: u64,
    /// Every page of the index was read and every orphan offered a hint.
    pub complete: bool,
    /// Why the run was not complete.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut_short: Option<String>,
    /// STARTED items (orphans + owned); `None` when the count failed.
    pub started: Option<u64>,
    pub stopped: Option<u64>,
    /// STARTED items with a live lease.
    pub owned: Option<u64>,
    /// Session mode, on a sweep run: the stranded connections the sweep found (each hinted,
    /// unless hinted above as a dead session's work). `None` when no sweep ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stranded: Option<u64>,
    /// Items the sweep read (its cost: about one read unit per 4 KB of them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep_items_read: Option<u64>,
    /// The sweep read the whole table (the next sweep starts over otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep_complete: Option<bool>,
    pub duration_ms: u64,
}

impl Report {
    /// The metrics to emit (counts that failed are left out rather than reported as zero).
    pub fn metrics(&self) -> Vec<(&'static str, u64)> {
        let mut metrics = vec![
            ("Orphans", self.orphans),
            ("HintsSent", self.hints_sent),
            ("HintsFailed", self.hints_failed),
            ("HintsDeferred", self.hints_deferred),
            ("Incomplete", u64::from(!self.complete)),
        ];
        let counts =
            [("Started", self.started), ("Stopped", self.stopped), ("Owned", self.owned), ("Stranded", self.stranded)];
        for (name, value) in counts {
            if let Some(value) = value {
                metrics.push((name, value));
            }
        }
        metrics
    }
}

/// What became of the hints of a run, or of one part of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Tally {
    sent: u64,
    /// Refused after every attempt.
    failed: u64,
    /// Not offered (or not retried) because the run's deadline came first.
    deferred: u64,
}

impl std::ops::Add for Tally {
    type Output = Tally;
    fn add(self, o: Tally) -> Tally {
        Tally { sent: self.sent + o.sent, failed: self.failed + o.failed, deferred: self.deferred + o.deferred }
    }
}

fn passed(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// Waits `pause`, or returns false at once if the deadline comes before it is over.
async fn pause_within(pause: Duration, deadline: Option<Instant>) -> bool {
    if deadline.is_some_and(|d| Instant::now() + pause >= d) {
        return false;
    }
    tokio::time::sleep(pause).await;
    true
}

/// Sends one batch, retrying refused entries a bounded number of times, and no try starting
/// after the deadline.
async fn send_batch_with_retry(hints: &dyn HintSender, batch: Vec<Hint>, deadline: Option<Instant>) -> Tally {
    let total = batch.len() as u64;
    let mut pending = batch;
    for attempt in 0..SEND_ATTEMPTS {
        let may_try = if attempt == 0 {
            !passed(deadline)
        } else {
            pause_within(Duration::from_millis(50 << attempt), deadline).await
        };
        if !may_try {
            let deferred = pending.len() as u64;
            return Tally { sent: total - deferred, failed: 0, deferred };
        }
        match hints.send_batch(&pending).await {
            Ok(failed) if failed.is_empty() => return Tally { sent: total, ..Tally::default() },
            Ok(failed) => pending = failed.into_iter().filter_map(|i| pending.get(i).cloned()).collect(),
            Err(e) => warn!(error = %e, attempt, hints = pending.len(), "hint batch failed"),
        }
    }
    let failed = pending.len() as u64;
    warn!(failed, "hints not sent after {SEND_ATTEMPTS} attempts; the next run sends them again");
    Tally { sent: total - failed, failed, deferred: 0 }
}

/// How a run reads and sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Orphans read per index query.
    pub page_size: usize,
    /// Hint batches (of up to [`MAX_BATCH`]) in flight at once.
    pub concurrency: usize,
    /// No request starts after this instant: what is not read or hinted by then is left to the
    /// next run (the report says so). `None`: no limit.
    pub deadline: Option<Instant>,
    /// Session mode: sweep the table for stranded work in this run, with this grace (ms; see
    /// [`Sweep`]). `None` (the default): no sweep.
    pub sweep_grace_ms: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Options { page_size: PAGE_SIZE, concurrency: CONCURRENT_BATCHES, deadline: None, sweep_grace_ms: None }
    }
}

/// Reads one page of orphans. The store retries within its own budget; a page whose query still
/// failed is tried again here (while the deadline allows), so one slow moment does not cost the run.
async fn read_page<S: LeaseStore + ?Sized>(
    store: &S,
    cutoff_ms: u64,
    options: &Options,
    after: Option<OrphanCursor>,
) -> leaselock::Result<OrphanPage> {
    let mut attempt = 1;
    loop {
        match store.orphans_page(cutoff_ms, options.page_size, after.clone()).await {
            Ok(page) => return Ok(page),
            Err(
                e @ (leaselock::Error::Throttled
                | leaselock::Error::Timeout { .. }
                | leaselock::Error::Unreachable(_)
                | leaselock::Error::Store(_)),
            ) if attempt < PAGE_ATTEMPTS => {
                warn!(error = %e, attempt, "orphan query failed");
                if !pause_within(Duration::from_millis(250 << attempt), options.deadline).await {
                    return Err(e);
                }
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Sends one hint per orphan, [`MAX_BATCH`] per request, `concurrency` requests at once.
async fn send_hints(hints: &dyn HintSender, orphans: &[LeaseItem], options: &Options) -> Tally {
    let batch: Vec<Hint> = orphans.iter().map(|item| Hint::new(item.id.as_str())).collect();
    send_hints_for(hints, &batch, options).await
}

/// Sends `all`, [`MAX_BATCH`] per request, `concurrency` requests at once.
async fn send_hints_for(hints: &dyn HintSender, all: &[Hint], options: &Options) -> Tally {
    stream::iter(all.chunks(MAX_BATCH))
        .map(|chunk| {
            let batch = chunk.to_vec();
            send_batch_with_retry(hints, batch, options.deadline)
        })
        .buffer_unordered(options.concurrency.max(1))
        .fold(Tally::default(), |total, t| async move { total + t })
        .await
}

/// What [`hint_orphans`] got done.
#[derive(Debug, Default)]
struct Hinted {
    orphans: u64,
    tally: Tally,
    /// Why the run stopped before the end of the index, if it did.
    cut_short: Option<String>,
}

/// Reads the orphan index page by page, sending each page's hints while the next page is read.
/// Fails only if the first page cannot be read; a later page that cannot be read, or the
/// deadline, ends the run early and says why.
async fn hint_orphans<S: LeaseStore + ?Sized>(
    store: &S,
    hints: &dyn HintSender,
    cutoff_ms: u64,
    options: &Options,
) -> leaselock::Result<Hinted> {
    let mut done = Hinted::default();
    let mut page = read_page(store, cutoff_ms, options, None).await?;
    loop {
        done.orphans += page.items.len() as u64;
        let next = async {
            match page.next.clone() {
                None => Ok(None),
                Some(_) if passed(options.deadline) => Err("the deadline came before the next page".to_string()),
                Some(after) => read_page(store, cutoff_ms, options, Some(after))
                    .await
                    .map(Some)
                    .map_err(|e| format!("reading the next page failed: {e}")),
            }
        };
        let (tally, next) = tokio::join!(send_hints(hints, &page.items, options), next);
        done.tally = done.tally + tally;
        match next {
            Ok(Some(next)) => page = next,
            Ok(None) => break,
            Err(why) => {
                done.cut_short = Some(why);
                break;
            }
        }
    }
    if done.cut_short.is_none() && done.tally.deferred > 0 {
        done.cut_short = Some("the deadline came before every hint was sent".into());
    }
    Ok(done)
}

/// A count, or `None` (logged) when it failed or the deadline came first.
async fn count_within<F>(what: &str, deadline: Option<Instant>, count: F) -> Option<u64>
where
    F: std::future::Future<Output = leaselock::Result<u64>>,
{
    let outcome = match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, count)
            .await
            .unwrap_or_else(|_| Err(leaselock::Error::Store("the deadline came first".into()))),
        None => count.await,
    };
    outcome.inspect_err(|e| warn!(error = %e, "counting {what} failed; the metric is left out")).ok()
}

/// One reconciliation: a hint for every orphan, and the counts. Fails only if the orphan query
/// does before anything was read; a failed count leaves its metric out.
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
    let (hinted, owned, stopped) = tokio::join!(
        hint_orphans(store, hints, cutoff_ms, &options),
        count_within("owned", options.deadline, store.count_by_state(DesiredState::Started, Some(cutoff_ms))),
        count_within("stopped", options.deadline, store.count_by_state(DesiredState::Stopped, None)),
    );
    let Hinted { mut orphans, mut tally, cut_short } = hinted?;
    // Session mode: the work of a dead session is orphaned too; the owner index lists it.
    let session_mode = store.config().mode == leaselock::LeaseMode::Session;
    let mut dead_session_work = 0;
    let mut hinted = HashSet::new();
    if session_mode && !passed(options.deadline) {
        match dead_sessions_work(store, cutoff_ms).await {
            Ok(work) => {
                dead_session_work = work.len() as u64;
                orphans += dead_session_work;
                tally = tally + send_hints(hints, &work, &options).await;
                hinted.extend(work.into_iter().map(|item| item.id));
            }
            Err(e) => warn!(error = %e, "listing dead sessions failed; the next run tries again"),
        }
    }
    // Session mode's backstop, on a sweep run: what no index listed.
    let swept = match options.sweep_grace_ms {
        Some(grace_ms) if session_mode => Some(sweep_stranded(store, hints, grace_ms, &hinted, &options).await),
        _ => None,
    };
    if let Some(swept) = &swept {
        tally = tally + swept.tally;
    }
    if let Some(why) = &cut_short {
        warn!(orphans, hints_sent = tally.sent, hints_deferred = tally.deferred, "run cut short: {why}");
    }
    Ok(Report {
        cutoff_ms,
        orphans,
        dead_session_work,
        hints_sent: tally.sent,
        hints_failed: tally.failed,
        hints_deferred: tally.deferred,
        complete: cut_short.is_none(),
        cut_short,
        started: owned.map(|owned| owned + orphans),
        stopped,
        owned,
        stranded: swept.as_ref().map(|s| s.stranded),
        sweep_items_read: swept.as_ref().map(|s| s.items_read),
        sweep_complete: swept.as_ref().map(|s| s.cut_short.is_none()),
        duration_ms: started_at.elapsed().as_millis() as u64,
    })
}

/// What [`sweep_stranded`] got done.
#[derive(Debug, Default)]
struct Swept {
    stranded: u64,
    items_read: u64,
    tally: Tally,
    /// Why the sweep stopped before the end of the table, if it did.
    cut_short: Option<String>,
}

/// Sweeps the whole table for stranded work, part by part ([`SWEEP_PART_ITEMS`] items each, the
/// deadline checked between parts), sending a stranded hint ([`Hint::stranded`]) for each part's
/// ids (but those in `hinted`) as it ends.
/// A part that fails ends the sweep; the next sweep starts over.
async fn sweep_stranded<S: LeaseStore + ?Sized>(
    store: &S,
    hints: &dyn HintSender,
    grace_ms: u64,
    hinted: &HashSet<String>,
    options: &Options,
) -> Swept {
    let mut swept = Swept::default();
    let mut after = None;
    loop {
        if passed(options.deadline) {
            swept.cut_short = Some("the deadline came before the sweep read the whole table".into());
            break;
        }
        let page = match store.stranded_page(grace_ms, after.take(), SWEEP_PART_ITEMS).await {
            Ok(page) => page,
            Err(e) => {
                swept.cut_short = Some(format!("sweeping for stranded work failed: {e}"));
                break;
            }
        };
        swept.items_read += page.scanned;
        swept.stranded += page.ids.len() as u64;
        // Stranded hints: a worker takes such work whatever its fair share, which counts none of it.
        let fresh: Vec<Hint> = page.ids.iter().filter(|id| !hinted.contains(*id)).map(Hint::stranded).collect();
        for hint in &fresh {
            info!(connection_id = %hint.connection_id, "stranded: held under a gone, older or long-dead session");
        }
        swept.tally = swept.tally + send_hints_for(hints, &fresh, options).await;
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    if let Some(why) = &swept.cut_short {
        warn!(stranded = swept.stranded, items_read = swept.items_read, "sweep cut short: {why}");
    }
    swept
}

/// The STARTED work held under sessions that are dead by `cutoff_ms` (a query of the session
/// partition, then the owner index per dead session).
async fn dead_sessions_work<S: LeaseStore + ?Sized>(store: &S, cutoff_ms: u64) -> leaselock::Result<Vec<LeaseItem>> {
    let mut work = Vec::new();
    for dead in store.sessions(cutoff_ms).await? {
        work.extend(
            store.owned_by(&dead.owner).await?.into_iter().filter(|i| i.desired_state == Some(DesiredState::Started)),
        );
    }
    Ok(work)
}

/// Time kept back from the Lambda's deadline for the in-flight requests, the metrics and the
/// response.
pub const DEADLINE_RESERVE: Duration = Duration::from_millis(1500);

/// The instant a run started `now` must stop starting requests, from the invocation's deadline
/// (milliseconds since the epoch). `None` (no limit) when there is none (0, as in tests) or when it
/// is not in the future: Lambda's is always ahead, and a local emulator may send a relative
/// timeout instead.
pub fn run_deadline(context_deadline_ms: u64, now: SystemTime) -> Option<Instant> {
    let remaining = (UNIX_EPOCH + Duration::from_millis(context_deadline_ms)).duration_since(now).ok()?;
    if remaining.is_zero() {
        return None;
    }
    Some(Instant::now() + remaining.saturating_sub(DEADLINE_RESERVE))
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

/// [`handle_with`] without a sweep for stranded work.
pub async fn handle<S: StateCounts + ?Sized, W: Write>(
    event: LambdaEvent<Value>,
    store: &S,
    hints: &dyn HintSender,
    metrics: &EmfWriter<W>,
) -> Result<Value, ReconcileError> {
    handle_with(event, store, hints, metrics, Sweep::OFF).await
}

/// The epoch ms of an EventBridge event's `time` (`2026-03-12T19:05:00Z`, UTC, whole or
/// fractional seconds); `None` when there is none or it is not such a time.
pub fn event_time_ms(event: &Value) -> Option<u64> {
    let (date, clock) = event.get("time")?.as_str()?.strip_suffix('Z')?.split_once('T')?;
    let number = |s: &str| s.parse::<u64>().ok().filter(|_| s.bytes().all(|b| b.is_ascii_digit()));
    let mut date = date.split('-').map(number);
    let (year, month, day) = (date.next()??, date.next()??, date.next()??);
    let mut clock = clock.split(':');
    let (hour, minute) = (clock.next().and_then(number)?, clock.next().and_then(number)?);
    let second: f64 = clock.next()?.parse().ok().filter(|s: &f64| (0.0..61.0).contains(s))?;
    let valid = date.next().is_none() && clock.next().is_none();
    if !valid || !(1970..=9999).contains(&year) || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    if hour > 23 || minute > 59 {
        return None;
    }
    // Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let (era, yoe) = (y / 400, y % 400);
    let doy = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some(((days * 24 + hour) * 60 + minute) * 60_000 + (second * 1000.0) as u64)
}

/// The Lambda handler: any payload (an EventBridge schedule event) triggers one run, which
/// stops starting requests [`DEADLINE_RESERVE`] before the invocation's deadline; the report is
/// returned and its metrics written as one EMF line. In session mode the run also sweeps for
/// stranded work when `sweep` is due at the event's `time` (the store's clock without one).
pub async fn handle_with<S: StateCounts + ?Sized, W: Write>(
    event: LambdaEvent<Value>,
    store: &S,
    hints: &dyn HintSender,
    metrics: &EmfWriter<W>,
    sweep: Sweep,
) -> Result<Value, ReconcileError> {
    let deadline = run_deadline(event.context.deadline, SystemTime::now());
    if deadline.is_none() && event.context.deadline != 0 {
        warn!(
            deadline_ms = event.context.deadline,
            "the invocation deadline has passed or is not a time; running without one"
        );
    }
    let invoked_ms = event_time_ms(&event.payload).unwrap_or_else(|| store.clock().now_ms());
    let sweep_grace_ms = sweep.is_due(invoked_ms).then_some(sweep.grace_ms);
    let options = Options { deadline, sweep_grace_ms, ..Options::default() };
    let report = reconcile_with(store, hints, options).await?;
    info!(
        orphans = report.orphans,
        hints_sent = report.hints_sent,
        hints_failed = report.hints_failed,
        hints_deferred = report.hints_deferred,
        complete = report.complete,
        started = report.started,
        stopped = report.stopped,
        stranded = report.stranded,
        duration_ms = report.duration_ms,
        "reconciled"
    );
    if let Err(e) = metrics.emit(store.clock().now_ms(), &report.metrics()) {
        warn!(error = %e, "writing metrics failed");
    }
    Ok(serde_json::to_value(&report).expect("a report serializes"))
}
