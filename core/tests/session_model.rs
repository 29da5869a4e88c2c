//! Session mode, model-based: random sequences of session openings, renewals and endings
//! interleaved with claims (of unowned work and of dead sessions' work), checkpoints, releases and
//! sweeps for stranded work, from several workers whose clocks disagree within the skew, against
//! `MemoryStore`, checking the safety invariants (never two holders whose deadlines overlap, fence
//! +1 per claim, last_seq monotonic, no sweep naming work a live session holds); then the same
//! sequences against DynamoDB (the local engine) must give the same outcomes.

mod common;
mod model_support;

use std::collections::HashMap;
use std::sync::Arc;

use leaselock::lease::claim_cutoff;
use leaselock::{Clock, Lease, LeaseMode, LeaseStore, ManualClock, Session, TableConfig};
use model_support::*;
use proptest::prelude::*;

const WORKERS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Start(usize),
    Stop(usize),
    /// A worker without a live session opens one (a new epoch once its old one's deadline passed).
    Open(usize),
    RenewSession(usize),
    EndSession(usize),
    Claim(usize, usize),
    Release(usize, usize),
    Checkpoint(usize, usize, u64),
    /// Lists the dead sessions (by the worker's clock) and retires those without connections.
    Reap(usize),
    /// Sweeps the table for stranded work (by the worker's clock) with this grace, ms.
    Sweep(usize, u64),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let w = 0..WORKERS;
    let id = 0..IDS;
    prop_oneof![
        1 => id.clone().prop_map(Op::Start),
        1 => id.clone().prop_map(Op::Stop),
        3 => w.clone().prop_map(Op::Open),
        3 => w.clone().prop_map(Op::RenewSession),
        1 => w.clone().prop_map(Op::EndSession),
        5 => (w.clone(), id.clone()).prop_map(|(w, i)| Op::Claim(w, i)),
        2 => (w.clone(), id.clone()).prop_map(|(w, i)| Op::Release(w, i)),
        3 => (w.clone(), id, 0..40u64).prop_map(|(w, i, s)| Op::Checkpoint(w, i, s)),
        1 => w.clone().prop_map(Op::Reap),
        1 => (w.clone(), prop::sample::select(vec![0u64, 5_000, 60_000])).prop_map(|(w, g)| Op::Sweep(w, g)),
        3 => advance().prop_map(Op::Advance),
    ]
}

struct WorkerState {
    session: Option<Session>,
    /// The epoch of the last session, kept to start the next one at once.
    last_epoch: Option<u64>,
    held: HashMap<usize, Lease>,
}

pub fn session_config() -> TableConfig {
    TableConfig::default().mode(LeaseMode::Session)
}

async fn run(stores: &[Arc<dyn LeaseStore>], truth: &ManualClock, ops: &[Op]) -> Run {
    let mut workers: Vec<WorkerState> =
        (0..WORKERS).map(|_| WorkerState { session: None, last_epoch: None, held: HashMap::new() }).collect();
    let mut ledger = Ledger::new();
    let mut out = Vec::new();
    for op in ops {
        let now_mono = truth.monotonic_ms();
        // Rule 2 on the session: at its deadline every handler of the worker stops.
        for w in workers.iter_mut() {
            if w.session.as_ref().is_some_and(|s| s.is_past_deadline(now_mono)) {
                w.session = None;
                w.held.clear();
            }
        }
        let outcome = match *op {
            Op::Advance(ms) => {
                truth.advance(ms);
                Outcome::Done
            }
            Op::Start(i) => start(&*stores[0], i).await,
            Op::Stop(i) => stop(&*stores[0], i).await,
            Op::Open(w) if workers[w].session.is_some() => Outcome::Skipped,
            Op::Open(w) => match stores[w].create_session(&name(w), workers[w].last_epoch).await {
                Ok(session) => {
                    assert!(workers[w].last_epoch.is_none_or(|e| session.epoch > e), "epochs go up");
                    workers[w].last_epoch = Some(session.epoch);
                    let o = Outcome::of_session(&session);
                    workers[w].session = Some(session);
                    o
                }
                Err(e) => Outcome::Failed(e.to_string()),
            },
            Op::RenewSession(w) => match workers[w].session.as_mut() {
                None => Outcome::Skipped,
                Some(session) => match stores[w].renew_session(session).await {
                    Ok(()) => {
                        let session = session.clone();
                        for (&i, lease) in workers[w].held.iter_mut() {
                            // A live session's work cannot have been taken over.
                            assert_eq!(lease.fence, ledger[i].fence, "w{w} renewed a session whose work moved");
                            session.cover(lease);
                            ledger[i].holder_deadline = session.deadline_mono_ms;
                        }
                        Outcome::of_session(&session)
                    }
                    Err(e) => {
                        workers[w].session = None;
                        workers[w].held.clear();
                        Outcome::Failed(e.to_string())
                    }
                },
            },
            Op::EndSession(w) => match workers[w].session.take() {
                None => Outcome::Skipped,
                Some(session) => {
                    let result = stores[w].end_session(&session).await;
                    // Graceful: the worker stops acting for everything it held before the write.
                    for (i, lease) in workers[w].held.drain() {
                        if ledger[i].fence == lease.fence {
                            ledger[i].holder_deadline = now_mono;
                        }
                    }
                    match result {
                        Ok(()) => Outcome::Done,
                        Err(e) => Outcome::Failed(e.to_string()),
                    }
                }
            },
            Op::Claim(w, i) => match workers[w].session.clone() {
                None => Outcome::Skipped,
                Some(session) => match stores[w].claim_in_session(&id(i), &session).await {
                    Ok(lease) => {
                        assert_eq!(lease.deadline_mono_ms, session.deadline_mono_ms, "the session's deadline");
                        if let Some(h) = ledger[i].claimed(w, i, &lease, now_mono).filter(|&h| h != w) {
                            workers[h].held.remove(&i);
                        }
                        let o = Outcome::of_lease(&lease);
                        workers[w].held.insert(i, lease);
                        o
                    }
                    Err(e) => Outcome::Failed(e.to_string()),
                },
            },
            Op::Release(w, i) => release(&*stores[w], &mut workers[w].held, &mut ledger[i], i, now_mono).await,
            Op::Checkpoint(w, i, seq) => checkpoint(&*stores[w], &mut workers[w].held, &mut ledger[i], i, seq).await,
            Op::Reap(w) => {
                let cutoff = claim_cutoff(stores[w].clock().now_ms(), stores[w].config());
                let dead = stores[w].sessions(cutoff).await.unwrap();
                let mut retired = Vec::new();
                for s in &dead {
                    // A dead session's connections, through the owner index.
                    let owned = stores[w].owned_by(&s.owner).await.unwrap();
                    if owned.is_empty() {
                        retired.push(stores[w].retire_session(&s.owner, s.epoch).await.unwrap());
                    }
                }
                Outcome::Dead(dead, retired)
            }
            Op::Sweep(w, grace) => {
                let ids = stores[w].stranded(grace).await.unwrap();
                // Only work nobody may act for is named: a hint for it cannot disturb a holder.
                for (h, worker) in workers.iter().enumerate() {
                    for (&i, lease) in &worker.held {
                        let named = ids.contains(&id(i)) && lease.fence == ledger[i].fence;
                        assert!(!named, "w{w}'s sweep named {} while w{h} holds it", id(i));
                    }
                }
                Outcome::Stranded(ids)
            }
        };
        out.push(outcome);
    }
    let mut finals = final_items(&*stores[0], &ledger).await;
    for w in 0..WORKERS {
        finals.push(stores[0].get(&format!("session/{}", name(w))).await.unwrap());
    }
    (out, finals)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn memory_store_keeps_the_session_invariants(offsets in offsets(WORKERS), ops in proptest::collection::vec(op(), 1..120)) {
        let truth = Arc::new(ManualClock::new(T0));
        let stores = memory_stores(session_config(), &truth, &offsets);
        block_on(run(&stores, &truth, &ops));
    }
}

/// Replays `ops` against DynamoDB and against memory, requires identical outcomes, and returns them.
async fn differential_run(offsets: &[i64], ops: &[Op]) -> Vec<Outcome> {
    differential(
        session_config(),
        offsets,
        |n| format!("{:?}", ops[n]),
        |stores, truth| async move { run(&stores, &truth, ops).await },
    )
    .await
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, max_shrink_iters: 64, ..ProptestConfig::default() })]

    #[test]
    fn dynamodb_gives_the_same_session_outcomes_as_memory(offsets in offsets(WORKERS), ops in proptest::collection::vec(op(), 1..50)) {
        block_on(differential_run(&offsets, &ops));
    }
}

#[test]
fn dynamodb_and_memory_agree_on_session_takeovers() {
    use Op::*;
    // Unowned claims; a held claim refused while the holder's session lives (renewed), taken by
    // one transaction once it is dead beyond the skew (not one ms earlier); a new epoch of the
    // old holder, whose old-epoch work another epoch may take; an ended session frees its work
    // at once; dead sessions listed and retired once empty.
    let ops = vec![
        Start(0),
        Start(1),
        Open(0),
        Open(1),
        Claim(0, 0),
        Claim(0, 1),
        Checkpoint(0, 0, 5),
        Claim(1, 0),
        Advance(4_000),
        RenewSession(0),
        RenewSession(1),
        Advance(18_000),
        RenewSession(1),
        Claim(1, 0),
        Advance(3_000),
        Claim(1, 0),
        Advance(1),
        Claim(1, 0),
        Checkpoint(1, 0, 6),
        Checkpoint(0, 0, 7),
        Open(0),
        Claim(0, 1),
        Claim(1, 1),
        EndSession(1),
        Open(2),
        Claim(2, 0),
        Claim(2, 1),
        Release(2, 1),
        Claim(2, 1),
        Advance(2_000),
        Reap(2),
        Stop(1),
        Claim(0, 1),
    ];
    let out = block_on(differential_run(&[0, 0, 0], &ops));
    let held = |o: &Outcome| matches!(o, Outcome::Failed(m) if m.starts_with("held by w0"));
    let fence = |o: &Outcome| match o {
        Outcome::Lease { fence, .. } => *fence,
        other => panic!("{other:?}"),
    };
    assert!(held(&out[7]) && held(&out[13]), "a live session's work is held");
    assert!(held(&out[15]), "not at expiry + skew");
    assert_eq!(fence(&out[17]), 2, "taken 1 ms after expiry + skew");
    assert!(matches!(out[17], Outcome::Lease { last_seq: Some(5), .. }), "resumed from the checkpoint");
    assert_eq!(fence(&out[21]), 2, "work of an old epoch is taken by the new one");
    assert_eq!(fence(&out[25]), 3, "an ended session's work is free at once");
    assert!(matches!(&out[30], Outcome::Dead(dead, retired) if dead.len() == 1 && retired == &[true]));
}
