//! Session mode, model-based: random sequences of session openings, renewals and endings
//! interleaved with claims (of unowned work and of dead sessions' work), checkpoints and releases,
//! from several workers whose clocks disagree within the skew, against `MemoryStore`, checking the
//! safety invariants (never two holders whose deadlines overlap, fence +1 per claim, last_seq
//! monotonic); then the same sequences against DynamoDB (the local engine) must give the same
//! outcomes.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use leaselock::lease::claim_cutoff;
use leaselock::{
    Clock, Lease, LeaseItem, LeaseMode, LeaseStore, ManualClock, MemoryStore, Session, SessionItem, SkewedClock,
    TableConfig,
};
use proptest::prelude::*;

const WORKERS: usize = 3;
const IDS: usize = 3;
const T0: u64 = 1_800_000_000_000;

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
        1 => w.prop_map(Op::Reap),
        3 => prop_oneof![
            0..3_000u64,
            15_000..25_000u64,
            prop::sample::select(vec![1u64, 999, 1_000, 1_001, 4_000, 5_000, 19_000, 20_000, 21_000, 21_001]),
        ]
        .prop_map(Op::Advance),
    ]
}

fn offsets() -> impl Strategy<Value = Vec<i64>> {
    let offset = prop_oneof![-450i64..450, prop::sample::select(vec![-450i64, -1, 0, 0, 1, 449])];
    proptest::collection::vec(offset, WORKERS)
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Lease { fence: u64, expires_at_ms: u64, last_seq: Option<u64>, deadline_mono_ms: u64 },
    Session { epoch: u64, expires_at_ms: u64, deadline_mono_ms: u64 },
    Item(LeaseItem),
    Dead(Vec<SessionItem>, Vec<bool>),
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

fn session_outcome(s: &Session) -> Outcome {
    Outcome::Session { epoch: s.epoch, expires_at_ms: s.expires_at_ms, deadline_mono_ms: s.deadline_mono_ms }
}

#[derive(Default)]
struct Ledger {
    fence: u64,
    holder: Option<usize>,
    holder_deadline: u64,
    previous_deadline: u64,
    last_seq: Option<u64>,
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

async fn run(
    stores: &[Arc<dyn LeaseStore>],
    truth: &ManualClock,
    ops: &[Op],
) -> (Vec<Outcome>, Vec<Option<LeaseItem>>) {
    let id = |i: usize| format!("work-{i}");
    let name = |w: usize| format!("w{w}");
    let mut workers: Vec<WorkerState> =
        (0..WORKERS).map(|_| WorkerState { session: None, last_epoch: None, held: HashMap::new() }).collect();
    let mut ledger: Vec<Ledger> = (0..IDS).map(|_| Ledger::default()).collect();
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
            Op::Start(i) => match stores[0].start(&id(i), &format!("wss://feed.example/{i}")).await {
                Ok(item) => Outcome::Item(item),
                Err(e) => Outcome::Failed(e.to_string()),
            },
            Op::Stop(i) => match stores[0].stop(&id(i)).await {
                Ok(item) => Outcome::Item(item),
                Err(e) => Outcome::Failed(e.to_string()),
            },
            Op::Open(w) if workers[w].session.is_some() => Outcome::Skipped,
            Op::Open(w) => match stores[w].create_session(&name(w), workers[w].last_epoch).await {
                Ok(session) => {
                    assert!(workers[w].last_epoch.is_none_or(|e| session.epoch > e), "epochs go up");
                    workers[w].last_epoch = Some(session.epoch);
                    let o = session_outcome(&session);
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
                        session_outcome(&session)
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
                        let l = &mut ledger[i];
                        assert_eq!(lease.fence, l.fence + 1, "fences go up by one per claim");
                        l.previous_deadline = l.previous_deadline.max(l.holder_deadline);
                        assert!(
                            l.previous_deadline <= now_mono,
                            "w{w} claimed {} at {now_mono} while fence {} (w{:?}) may act until {}",
                            id(i),
                            l.fence,
                            l.holder,
                            l.previous_deadline
                        );
                        assert_eq!(lease.last_seq, l.last_seq, "a claim resumes from the last checkpoint");
                        assert_eq!(lease.deadline_mono_ms, session.deadline_mono_ms, "the session's deadline");
                        if let Some(h) = l.holder.filter(|&h| h != w) {
                            workers[h].held.remove(&i);
                        }
                        l.fence = lease.fence;
                        l.holder = Some(w);
                        l.holder_deadline = lease.deadline_mono_ms;
                        let o = lease_outcome(&lease);
                        workers[w].held.insert(i, lease);
                        o
                    }
                    Err(e) => Outcome::Failed(e.to_string()),
                },
            },
            Op::Release(w, i) => match workers[w].held.remove(&i) {
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
            Op::Checkpoint(w, i, seq) => match workers[w].held.get_mut(&i) {
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
                        workers[w].held.remove(&i);
                        Outcome::Failed(e.to_string())
                    }
                },
            },
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
    for w in 0..WORKERS {
        finals.push(stores[0].get(&format!("session/{}", name(w))).await.unwrap());
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
    let base = MemoryStore::new(session_config(), truth.clone()).unwrap();
    clocks(truth, offsets).into_iter().map(|c| Arc::new(base.with_clock(c)) as Arc<dyn LeaseStore>).collect()
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn memory_store_keeps_the_session_invariants(offsets in offsets(), ops in proptest::collection::vec(op(), 1..120)) {
        let truth = Arc::new(ManualClock::new(T0));
        let stores = memory_stores(&truth, &offsets);
        block_on(run(&stores, &truth, &ops));
    }
}

async fn differential(offsets: &[i64], ops: &[Op]) -> Vec<Outcome> {
    let truth = Arc::new(ManualClock::new(T0));
    let Some(table) = common::table(session_config(), Some(truth.clone())).await else {
        let truth = Arc::new(ManualClock::new(T0));
        return run(&memory_stores(&truth, offsets), &truth, ops).await.0;
    };
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
    if std::env::var_os("SHOW_OUTCOMES").is_some() {
        for (op, o) in ops.iter().zip(&remote.0) {
            eprintln!("{op:?} => {o:?}");
        }
    }
    local.0
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, max_shrink_iters: 64, ..ProptestConfig::default() })]

    #[test]
    fn dynamodb_gives_the_same_session_outcomes_as_memory(offsets in offsets(), ops in proptest::collection::vec(op(), 1..50)) {
        block_on(differential(&offsets, &ops));
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
    let out = block_on(differential(&[0, 0, 0], &ops));
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
