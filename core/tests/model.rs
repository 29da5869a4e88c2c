//! Model-based property tests: random operation sequences from several owners whose clocks
//! disagree (within the skew) against `MemoryStore`, checking the safety invariants; then the
//! same sequences replayed against DynamoDB (the local engine) must give the same outcomes.

mod common;
mod model_support;

use std::collections::HashMap;
use std::sync::Arc;

use leaselock::{Clock, Lease, LeaseStore, ManualClock, TableConfig};
use model_support::*;
use proptest::prelude::*;

const WORKERS: usize = 4;

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
        3 => advance().prop_map(Op::Advance),
    ]
}

/// Runs `ops` with one store handle per worker (each seeing its own clock), checks the
/// invariants, and returns every outcome plus the final items.
async fn run(stores: &[Arc<dyn LeaseStore>], truth: &ManualClock, ops: &[Op]) -> Run {
    let mut held: Vec<HashMap<usize, Lease>> = vec![HashMap::new(); WORKERS];
    let mut ledger = Ledger::new();
    let mut out = Vec::new();
    for op in ops {
        let now_mono = truth.monotonic_ms();
        let outcome = match *op {
            Op::Advance(ms) => {
                truth.advance(ms);
                Outcome::Done
            }
            Op::Start(i) => start(&*stores[0], i).await,
            Op::Stop(i) => stop(&*stores[0], i).await,
            Op::Acquire(w, i) => match stores[w].acquire(&id(i), &name(w)).await {
                Ok(lease) => {
                    ledger[i].claimed(w, i, &lease, now_mono);
                    let o = Outcome::of_lease(&lease);
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
                        Outcome::of_lease(lease)
                    }
                    Err(e) => {
                        held[w].remove(&i);
                        Outcome::Failed(e.to_string())
                    }
                },
            },
            Op::Release(w, i) => release(&*stores[w], &mut held[w], &mut ledger[i], i, now_mono).await,
            Op::Checkpoint(w, i, seq) => checkpoint(&*stores[w], &mut held[w], &mut ledger[i], i, seq).await,
        };
        out.push(outcome);
    }
    (out, final_items(&*stores[0], &ledger).await)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn memory_store_keeps_the_safety_invariants(offsets in offsets(WORKERS), ops in proptest::collection::vec(op(), 1..120)) {
        let truth = Arc::new(ManualClock::new(T0));
        let stores = memory_stores(TableConfig::default(), &truth, &offsets);
        block_on(run(&stores, &truth, &ops));
    }
}

/// Replays `ops` against DynamoDB and against memory and requires identical outcomes.
async fn differential_run(offsets: &[i64], ops: &[Op]) {
    differential(
        TableConfig::default(),
        offsets,
        |n| format!("{:?}", ops[n]),
        |stores, truth| async move { run(&stores, &truth, ops).await },
    )
    .await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, max_shrink_iters: 64, ..ProptestConfig::default() })]

    #[test]
    fn dynamodb_gives_the_same_outcomes_as_memory(offsets in offsets(WORKERS), ops in proptest::collection::vec(op(), 1..50)) {
        block_on(differential_run(&offsets, &ops));
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
    block_on(differential_run(&[0, 0, 0, 0], &ops));
}
