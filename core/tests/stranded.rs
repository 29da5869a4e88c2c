//! Session mode's backstop for stranded work: work held under a session that is gone, of another
//! epoch, or dead beyond a grace is found by a consistent read of the table, whatever the
//! indexes say (a retired session is no longer listed). The same scenario runs on `MemoryStore`
//! and on DynamoDB (the local engine) and must find the same ids at every sweep.

mod common;
mod model_support;

use std::sync::Arc;

use leaselock::{LeaseMode, LeaseStore, ManualClock, Session, TableConfig};
use model_support::*;

const GRACE: u64 = 60_000;

fn config() -> TableConfig {
    TableConfig::default().mode(LeaseMode::Session)
}

fn work(i: usize) -> String {
    format!("conn-{i}")
}

/// Every stranded id found in parts of `max_items` items, the cursor carried from part to part.
async fn swept_in_parts(store: &dyn LeaseStore, max_items: u64) -> Vec<String> {
    let mut ids = Vec::new();
    let mut after = None;
    let mut parts = 0;
    loop {
        let page = store.stranded_page(GRACE, after, max_items).await.unwrap();
        assert!(page.scanned <= max_items, "a part reads at most its budget: {} > {max_items}", page.scanned);
        ids.extend(page.ids);
        parts += 1;
        assert!(parts < 100, "the cursor goes forward");
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    ids.sort();
    ids
}

/// Workers: w0 dies holding conn-0 and conn-1 (and its session is retired, as survivors do once
/// the owner index lists nothing under it); w1 lives throughout, holding conn-2 (and conn-4,
/// stopped); w2 ends its session holding conn-3; w3 holds conn-5 and restarts with a new epoch.
async fn scenario(stores: Vec<Arc<dyn LeaseStore>>, truth: Arc<ManualClock>) -> Run {
    let mut out = Vec::new();
    let s = &stores;
    let sweep = |w: usize| {
        let store = s[w].clone();
        async move { Outcome::Stranded(store.stranded(GRACE).await.unwrap()) }
    };
    for i in 0..6 {
        s[0].start(&work(i), &format!("wss://feed.example/{i}")).await.unwrap();
    }
    let mut sessions: Vec<Session> = Vec::new();
    for (w, store) in s.iter().enumerate() {
        sessions.push(store.create_session(&name(w), None).await.unwrap());
    }
    for (w, i) in [(0, 0), (0, 1), (1, 2), (2, 3), (1, 4), (3, 5)] {
        let lease = s[w].claim_in_session(&work(i), &sessions[w]).await.unwrap();
        out.push(Outcome::of_lease(&lease));
    }
    s[0].stop(&work(4)).await.unwrap();
    out.push(sweep(1).await); // nothing: every session lives
    s[2].end_session(&sessions[2]).await.unwrap();
    out.push(sweep(1).await); // conn-3: an ended session (expiry 0) is dead beyond any grace

    // w0 stops renewing; w1 and w3 renew every 5 s. After 25 s w0 is dead, within the grace.
    for _ in 0..5 {
        truth.advance(5_000);
        s[1].renew_session(&mut sessions[1]).await.unwrap();
        s[3].renew_session(&mut sessions[3]).await.unwrap();
    }
    out.push(sweep(1).await); // conn-3 only: w0 is dead, but not beyond the grace

    // w3 restarts: a new epoch, its old-epoch work (conn-5) is takeable at once.
    truth.advance(5_000);
    s[1].renew_session(&mut sessions[1]).await.unwrap();
    let restarted = s[3].create_session(&name(3), Some(sessions[3].epoch)).await.unwrap();
    out.push(Outcome::of_session(&restarted));
    out.push(sweep(1).await); // conn-3, conn-5

    // 75 s later w0 is dead beyond the grace; its session is retired (no longer listed).
    for _ in 0..15 {
        truth.advance(5_000);
        s[1].renew_session(&mut sessions[1]).await.unwrap();
    }
    out.push(Outcome::Done);
    assert!(s[1].retire_session(&name(0), sessions[0].epoch).await.unwrap(), "w0's session is dead");
    let listed = s[1].sessions(u64::MAX).await.unwrap();
    assert!(listed.iter().all(|l| l.owner != name(0)), "a retired session is not listed: {listed:?}");
    out.push(sweep(1).await); // conn-0, conn-1, conn-3, conn-5: never conn-2 (w1 lives), nor conn-4 (stopped)
    out.push(Outcome::Stranded(swept_in_parts(&*s[1], 2).await));

    // A hint for conn-0 makes w1 claim it: the takeover lands, and the sweep stops naming it.
    let taken = s[1].claim_in_session(&work(0), &sessions[1]).await.unwrap();
    out.push(Outcome::of_lease(&taken));
    out.push(sweep(1).await);

    let mut finals = Vec::new();
    for i in 0..6 {
        finals.push(s[0].get(&work(i)).await.unwrap());
    }
    (out, finals)
}

#[test]
fn dynamodb_and_memory_find_the_same_stranded_work() {
    let out = block_on(differential(config(), &[0, 0, 0, 0], |n| format!("step {n}"), scenario));
    let stranded = |n: usize| match &out[n] {
        Outcome::Stranded(ids) => ids.clone(),
        other => panic!("step {n}: {other:?}"),
    };
    let ids = |list: &[usize]| list.iter().map(|&i| work(i)).collect::<Vec<_>>();
    assert_eq!(stranded(6), ids(&[]), "every session lives");
    assert_eq!(stranded(7), ids(&[3]), "an ended session's work");
    assert_eq!(stranded(8), ids(&[3]), "a session dead within the grace keeps its work out of the sweep");
    assert_eq!(stranded(10), ids(&[3, 5]), "work of an earlier epoch");
    assert_eq!(stranded(12), ids(&[0, 1, 3, 5]), "a session dead beyond the grace, retired and unlisted");
    assert_eq!(stranded(13), stranded(12), "a sweep in parts of 2 items finds the same");
    assert!(matches!(out[14], Outcome::Lease { fence: 2, .. }), "the hinted claim takes it over: {:?}", out[14]);
    assert_eq!(stranded(15), ids(&[1, 3, 5]));
}
