//! What the model-based tests of both lease modes (`model.rs`, `session_model.rs`) share: the
//! clocks that disagree within the skew, the ledger that checks the safety invariants per id,
//! the operations both modes have (start, stop, checkpoint, release), and the differential run
//! that replays one sequence against DynamoDB and against memory.
#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use leaselock::{
    Clock, Lease, LeaseItem, LeaseStore, ManualClock, MemoryStore, Session, SessionItem, SkewedClock, TableConfig,
};
use proptest::prelude::*;

use crate::common;

/// The ids every sequence works on.
pub const IDS: usize = 3;
pub const T0: u64 = 1_800_000_000_000;

pub fn id(i: usize) -> String {
    format!("work-{i}")
}

pub fn name(w: usize) -> String {
    format!("w{w}")
}

/// How far one step moves time: short steps, whole leases, and exactly the boundaries of the
/// rules (expiry, expiry + skew, deadline).
pub fn advance() -> impl Strategy<Value = u64> {
    prop_oneof![
        0..3_000u64,
        15_000..25_000u64,
        prop::sample::select(vec![1u64, 999, 1_000, 1_001, 4_000, 5_000, 19_000, 20_000, 21_000, 21_001]),
    ]
}

/// Worker clocks off by up to +-450 ms: any two differ by less than the 1 s skew. Repeated
/// values make workers agree exactly, so the boundaries are hit to the millisecond.
pub fn offsets(workers: usize) -> impl Strategy<Value = Vec<i64>> {
    let offset = prop_oneof![-450i64..450, prop::sample::select(vec![-450i64, -1, 0, 0, 1, 449])];
    proptest::collection::vec(offset, workers)
}

/// What an operation returned, comparable across stores.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    Lease {
        fence: u64,
        expires_at_ms: u64,
        last_seq: Option<u64>,
        deadline_mono_ms: u64,
    },
    Session {
        epoch: u64,
        expires_at_ms: u64,
        deadline_mono_ms: u64,
    },
    Item(LeaseItem),
    /// The dead sessions listed, and which of them were retired.
    Dead(Vec<SessionItem>, Vec<bool>),
    /// The ids a sweep for stranded work found.
    Stranded(Vec<String>),
    Done,
    Skipped,
    Failed(String),
}

impl Outcome {
    pub fn of_lease(l: &Lease) -> Self {
        Outcome::Lease {
            fence: l.fence,
            expires_at_ms: l.expires_at_ms,
            last_seq: l.last_seq,
            deadline_mono_ms: l.deadline_mono_ms,
        }
    }

    pub fn of_session(s: &Session) -> Self {
        Outcome::Session { epoch: s.epoch, expires_at_ms: s.expires_at_ms, deadline_mono_ms: s.deadline_mono_ms }
    }

    fn of_item(result: leaselock::Result<LeaseItem>) -> Self {
        match result {
            Ok(item) => Outcome::Item(item),
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }
}

/// Per id: the highest fence issued and who holds it, the deadline its holder may act until,
/// and the deadlines of all earlier fences (which must all end before a new claim).
#[derive(Default)]
pub struct Ledger {
    pub fence: u64,
    pub holder: Option<usize>,
    pub holder_deadline: u64,
    pub previous_deadline: u64,
    pub last_seq: Option<u64>,
}

impl Ledger {
    pub fn new() -> Vec<Ledger> {
        (0..IDS).map(|_| Ledger::default()).collect()
    }

    /// Worker `w` claimed id `i` at `now_mono` (true time): checks the claim rules and returns
    /// the previous holder.
    pub fn claimed(&mut self, w: usize, i: usize, lease: &Lease, now_mono: u64) -> Option<usize> {
        assert_eq!(lease.fence, self.fence + 1, "fences go up by one per claim");
        self.previous_deadline = self.previous_deadline.max(self.holder_deadline);
        assert!(
            self.previous_deadline <= now_mono,
            "w{w} claimed {} at {now_mono} while fence {} (holder {:?}) may act until {}",
            id(i),
            self.fence,
            self.holder,
            self.previous_deadline
        );
        assert_eq!(lease.last_seq, self.last_seq, "a claim resumes from the last checkpoint");
        self.fence = lease.fence;
        self.holder_deadline = lease.deadline_mono_ms;
        self.holder.replace(w)
    }
}

pub async fn start(store: &dyn LeaseStore, i: usize) -> Outcome {
    Outcome::of_item(store.start(&id(i), &format!("wss://feed.example/{i}")).await)
}

pub async fn stop(store: &dyn LeaseStore, i: usize) -> Outcome {
    Outcome::of_item(store.stop(&id(i)).await)
}

/// Releases the lease on id `i` in `held`, if any.
pub async fn release(
    store: &dyn LeaseStore,
    held: &mut HashMap<usize, Lease>,
    ledger: &mut Ledger,
    i: usize,
    now_mono: u64,
) -> Outcome {
    let Some(lease) = held.remove(&i) else { return Outcome::Skipped };
    match store.release(&lease).await {
        Ok(()) => {
            assert_eq!(lease.fence, ledger.fence, "only the newest fence can release");
            ledger.holder_deadline = now_mono;
            Outcome::Done
        }
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

/// Checkpoints `seq` under the lease on id `i` in `held`, if any; a lease the store refuses is
/// dropped.
pub async fn checkpoint(
    store: &dyn LeaseStore,
    held: &mut HashMap<usize, Lease>,
    ledger: &mut Ledger,
    i: usize,
    seq: u64,
) -> Outcome {
    let Some(lease) = held.get_mut(&i) else { return Outcome::Skipped };
    match store.checkpoint(lease, seq).await {
        Ok(()) => {
            assert_eq!(lease.fence, ledger.fence, "only the newest fence can checkpoint");
            assert!(ledger.last_seq.is_none_or(|last| seq > last), "last_seq only moves forward");
            ledger.last_seq = Some(seq);
            Outcome::of_lease(lease)
        }
        Err(leaselock::Error::SeqNotIncreasing { last_seq, .. }) => {
            assert_eq!(Some(last_seq), ledger.last_seq);
            Outcome::Failed("SeqNotIncreasing".into())
        }
        Err(e) => {
            held.remove(&i);
            Outcome::Failed(e.to_string())
        }
    }
}

/// Every id's item at the end, each checked against its ledger.
pub async fn final_items(store: &dyn LeaseStore, ledger: &[Ledger]) -> Vec<Option<LeaseItem>> {
    let mut finals = Vec::new();
    for (i, l) in ledger.iter().enumerate() {
        let item = store.get(&id(i)).await.unwrap();
        if let Some(item) = &item {
            assert_eq!(item.fence, l.fence);
            assert_eq!(item.last_seq, l.last_seq);
        }
        finals.push(item);
    }
    finals
}

fn clocks(truth: &Arc<ManualClock>, offsets: &[i64]) -> Vec<Arc<dyn Clock>> {
    offsets
        .iter()
        .map(|&offset_ms| Arc::new(SkewedClock { inner: truth.clone(), offset_ms }) as Arc<dyn Clock>)
        .collect()
}

/// One memory store handle per worker, each seeing true time through its own offset.
pub fn memory_stores(config: TableConfig, truth: &Arc<ManualClock>, offsets: &[i64]) -> Vec<Arc<dyn LeaseStore>> {
    let base = MemoryStore::new(config, truth.clone()).unwrap();
    clocks(truth, offsets).into_iter().map(|c| Arc::new(base.with_clock(c)) as Arc<dyn LeaseStore>).collect()
}

pub fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

/// What one run gave: every operation's outcome and the final items.
pub type Run = (Vec<Outcome>, Vec<Option<LeaseItem>>);

/// Runs one sequence (`run`, over one store handle per worker and the true clock) against
/// memory and, when the local engine is configured, against DynamoDB, and requires identical
/// outcomes; returns memory's.
pub async fn differential<F, Fut>(
    config: TableConfig,
    offsets: &[i64],
    describe: impl Fn(usize) -> String,
    run: F,
) -> Vec<Outcome>
where
    F: Fn(Vec<Arc<dyn LeaseStore>>, Arc<ManualClock>) -> Fut,
    Fut: Future<Output = Run>,
{
    let truth = Arc::new(ManualClock::new(T0));
    let local = run(memory_stores(config.clone(), &truth, offsets), truth).await;
    let truth = Arc::new(ManualClock::new(T0));
    let Some(table) = common::table(config, Some(truth.clone())).await else { return local.0 };
    let tables = clocks(&truth, offsets)
        .into_iter()
        .map(|c| Arc::new(table.clone().with_clock(c)) as Arc<dyn LeaseStore>)
        .collect();
    let remote = run(tables, truth).await;
    assert_eq!(remote.0.len(), local.0.len());
    for (n, (r, l)) in remote.0.iter().zip(&local.0).enumerate() {
        assert_eq!(r, l, "op {n} {}", describe(n));
    }
    assert_eq!(remote.1, local.1, "final items");
    if std::env::var_os("SHOW_OUTCOMES").is_some() {
        for (n, o) in remote.0.iter().enumerate() {
            eprintln!("{} => {o:?}", describe(n));
        }
    }
    local.0
}
