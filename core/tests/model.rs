//! Model-based property tests: random operation sequences from several owners whose clocks
//! disagree (within the skew) against `MemoryStore`, checking the safety invariants; then the
//! same sequences replayed against DynamoDB (the local engine) must give the same outcomes.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use leaselock::{Clock, Lease, LeaseItem, LeaseStore, ManualClock, MemoryStore, SkewedClock, TableConfig};
use proptest::prelude::*;

const WORKERS: usize = 4;
const IDS: usize = 3;
const T0: u64 = 1_800_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    Start(usize),
    Stop(usize),
    Acquire(usize, usize),
    Renew(usize, usize),
    Release(usize, usize),
    Checkpoint(usize, usize, u64),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let w = 0..WORKERS;
    let id = 0..IDS;
    prop_oneof![
        1 => id.clone().prop_map(Op::Start),
        1 => id.clone().prop_map(Op::Stop),
        5 => (w.clone(), id.clone()).prop_map(|(w, i)| Op::Acquire(w, i)),
        3 => (w.clone(), id.clone()).prop_map(|(w, i)| Op::Renew(w, i)),
        2 => (w.clone(), id.clone()).prop_map(|(w, i)| Op::Release(w, i)),
        3 => (w, id, 0..40u64).prop_map(|(w, i, s)| Op::Checkpoint(w, i, s)),
        3 => prop_oneof![
            0..3_000u64,
            15_000..25_000u64,
            // Exactly on the boundaries of the rules (expiry, expiry + skew, deadline).
            prop::sample::select(vec![1u64, 999, 1_000, 1_001, 4_000, 5_000, 19_000, 20_000, 21_000, 21_001]),
        ]
        .prop_map(Op::Advance),
    ]
}

/// Worker clocks off by up to +-450 ms: any two differ by less than the 1 s skew. Repeated
/// values make workers agree exactly, so the boundaries are hit to the millisecond.
fn offsets() -> impl Strategy<Value = Vec<i64>> {
    let offset = prop_oneof![-450i64..450, prop::sample::select(vec![-450i64, -1, 0, 0, 1, 449])];
    proptest::collection::vec(offset, WORKERS)
}

/// What an operation returned, comparable across stores.
#[derive(Debug, PartialEq)]
enum Outcome {
    Lease { fence: u64, expires_at_ms: u64, last_seq: Option<u64>, deadline_mono_ms: u64 },
    Item(LeaseItem),
    Done,
    Skipped,
    Failed(String),
}

fn lease_outcome(l: &Lease) -> Outcome {
    Outcome::Lease {
        fence: l.fence,
        expires_at_ms: l.expires_at_ms,
        last_seq: l.last_seq,
        deadline_mono_ms: l.deadline_mono_ms,
    }
}

/// Per id: the highest fence issued, the deadline its holder may act until, and the
/// deadlines of all earlier fences (which must all end before a new claim).
#[derive(Default)]
struct Ledger {
    fence: u64,
    holder_deadline: u64,
    previous_deadline: u64,
    last_seq: Option<u64>,
}

/// Runs `ops` with one store handle per worker (each seeing its own clock), checks the
/// invariants, and returns every outcome plus the final items.
async fn run(
    stores: &[Arc<dyn LeaseStore>],
    truth: &ManualClock,
    ops: &[Op],
) -> (Vec<Outcome>, Vec<Option<LeaseItem>>) {
    let id = |i: usize| format!("work-{i}");
    let mut held: Vec<HashMap<usize, Lease>> = vec![HashMap::new(); WORKERS];
    let mut ledger: Vec<Ledger> = (0..IDS).map(|_| Ledger::default()).collect();
    let mut out = Vec::new();
    for op in ops {
        let now_mono = truth.monotonic_ms();
        let outcome = match *op {
            Op::Advance(ms) => {
                truth.advance(ms);
                Outcome::Done
            }
            Op::Start(i) => match stores[0].start(&id(i), &format!("wss://feed.example/{i}")).await {
                Ok(item) => Outcome::Item(item),
                Err(e) => Outcome::Failed(e.to_string()),
            },
            Op::Stop(i) => match stores[0].stop(&id(i)).await {
                Ok(item) => Outcome::Item(item),
                Err(e) => Outcome::Failed(e.to_string()),
            },
            Op::Acquire(w, i) => match stores[w].acquire(&id(i), &format!("w{w}")).await {
                Ok(lease) => {
                    let l = &mut ledger[i];
                    assert_eq!(lease.fence, l.fence + 1, "fences go up by one per claim");
                    l.previous_deadline = l.previous_deadline.max(l.holder_deadline);
                    assert!(
                        l.previous_deadline <= now_mono,
                        "w{w} claimed {} at {now_mono} while fence {} may act until {}",
                        id(i),
                        l.fence,
                        l.previous_deadline
                    );
                    assert_eq!(lease.last_seq, l.last_seq, "a claim resumes from the last checkpoint");
                    l.fence = lease.fence;
                    l.holder_deadline = lease.deadline_mono_ms;
                    let o = lease_outcome(&lease);
                    held[w].insert(i, lease);
                    o
                }
                Err(e) => Outcome::Failed(e.to_string()),
            },
            Op::Renew(w, i) => match held[w].get_mut(&i) {
                None => Outcome::Skipped,
                Some(lease) => match stores[w].renew(lease).await {
                    Ok(()) => {
                        assert_eq!(lease.fence, ledger[i].fence, "only the newest fence can renew");
                        ledger[i].holder_deadline = lease.deadline_mono_ms;
                        lease_outcome(lease)
                    }
                    Err(e) => {
                        held[w].remove(&i);
                        Outcome::Failed(e.to_string())
                    }
                },
            },
            Op::Release(w, i) => match held[w].remove(&i) {
                None => Outcome::Skipped,
                Some(lease) => match stores[w].release(&lease).await {
                    Ok(()) => {
                        assert_eq!(lease.fence, ledger[i].fence, "only the newest fence can release");
                        ledger[i].holder_deadline = now_mono;
                        Outcome::Done
                    }
                    Err(e) => Outcome::Failed(e.to_string()),
                },
            },
            Op::Checkpoint(w, i, seq) => match held[w].get_mut(&i) {
                None => Outcome::Skipped,
                Some(lease) => match stores[w].checkpoint(lease, seq).await {
                    Ok(()) => {
                        let l = &mut ledger[i];
                        assert_eq!(lease.fence, l.fence, "only the newest fence can checkpoint");
                        assert!(l.last_seq.is_none_or(|last| seq > last), "last_seq only moves forward");
                        l.last_seq = Some(seq);
                        lease_outcome(lease)
                    }
                    Err(leaselock::Error::SeqNotIncreasing { last_seq, .. }) => {
                        assert_eq!(Some(last_seq), ledger[i].last_seq);
                        Outcome::Failed("SeqNotIncreasing".into())
                    }
                    Err(e) => {
                        held[w].remove(&i);
                        Outcome::Failed(e.to_string())
                    }
                },
            },
        };
        out.push(outcome);
    }
    let mut finals = Vec::new();
    for (i, l) in ledger.iter().enumerate() {
        let item = stores[0].get(&id(i)).await.unwrap();
        if let Some(item) = &item {
            assert_eq!(item.fence, l.fence);
            assert_eq!(item.last_seq, l.last_seq);
        }
        finals.push(item);
    }
    (out, finals)
}

fn clocks(truth: &Arc<ManualClock>, offsets: &[i64]) -> Vec<Arc<dyn Clock>> {
    offsets
        .iter()
        .map(|&offset_ms| Arc::new(SkewedClock { inner: truth.clone(), offset_ms }) as Arc<dyn Clock>)
        .collect()
}

fn memory_stores(truth: &Arc<ManualClock>, offsets: &[i64]) -> Vec<Arc<dyn LeaseStore>> {
    let base = MemoryStore::new(TableConfig::default(), truth.clone()).unwrap();
    clocks(truth, offsets).into_iter().map(|c| Arc::new(base.with_clock(c)) as Arc<dyn LeaseStore>).collect()
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn memory_store_keeps_the_safety_invariants(offsets in offsets(), ops in proptest::collection::vec(op(), 1..120)) {
        let truth = Arc::new(ManualClock::new(T0));
        let stores = memory_stores(&truth, &offsets);
        block_on(run(&stores, &truth, &ops));
    }
}

/// Replays `ops` against DynamoDB and against memory and requires identical outcomes.
async fn differential(offsets: &[i64], ops: &[Op]) {
    let truth = Arc::new(ManualClock::new(T0));
    let Some(table) = common::table(TableConfig::default(), Some(truth.clone())).await else { return };
    let tables: Vec<Arc<dyn LeaseStore>> = clocks(&truth, offsets)
        .into_iter()
        .map(|c| Arc::new(table.clone().with_clock(c)) as Arc<dyn LeaseStore>)
        .collect();
    let remote = run(&tables, &truth, ops).await;

    let truth = Arc::new(ManualClock::new(T0));
    let local = run(&memory_stores(&truth, offsets), &truth, ops).await;
    assert_eq!(remote.0.len(), local.0.len());
    for (n, (r, l)) in remote.0.iter().zip(&local.0).enumerate() {
        assert_eq!(r, l, "op {n} {:?}", ops[n]);
    }
    assert_eq!(remote.1, local.1, "final items");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, max_shrink_iters: 64, ..ProptestConfig::default() })]

    #[test]
    fn dynamodb_gives_the_same_outcomes_as_memory(offsets in offsets(), ops in proptest::collection::vec(op(), 1..50)) {
        block_on(differential(&offsets, &ops));
    }
}

#[test]
fn dynamodb_and_memory_agree_on_the_boundaries() {
    use Op::*;
    // Claims exactly at expiry + skew (refused) and one ms later (taken), a checkpoint at the
    // last_seq (refused), renewals at and just before the deadline, STOP and START again.
    let ops = vec![
        Start(0),
        Acquire(0, 0),
        Checkpoint(0, 0, 3),
        Checkpoint(0, 0, 3),
        Advance(21_000),
        Acquire(1, 0),
        Advance(1),
        Acquire(1, 0),
        Renew(0, 0),
        Checkpoint(1, 0, 4),
        Advance(18_999),
        Renew(1, 0),
        Advance(19_000),
        Renew(1, 0),
        Stop(0),
        Advance(25_000),
        Acquire(2, 0),
        Start(0),
        Acquire(2, 0),
        Release(2, 0),
        Acquire(3, 0),
        Acquire(3, 1),
        Release(3, 1),
        Acquire(0, 1),
    ];
    block_on(differential(&[0, 0, 0, 0], &ops));
}
