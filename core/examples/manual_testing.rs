//! The manual's testing sample (docs/src/testing.md includes it from its first `use`): a crash
//! takeover on the memory store and a manual clock, no engine needed. Run twice by
//! bindings/python/tests/test_manual.py.

use std::sync::Arc;

use leaselock::{Error, LeaseStore, ManualClock, MemoryStore, TableConfig};

#[tokio::main]
async fn main() -> leaselock::Result<()> {
    // The memory store has the DynamoDB store's semantics; the clock moves only when told.
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store = MemoryStore::new(TableConfig::new("leases"), clock.clone())?;
    store.start("stream-1", "wss://feed.example/stream-1").await?;

    let mut a = store.acquire("stream-1", "worker-a").await?;
    store.checkpoint(&mut a, 41).await?;

    // worker-a stops renewing (a crash). Within lease + skew nobody else may claim...
    clock.advance(20_000);
    assert!(matches!(store.acquire("stream-1", "worker-b").await, Err(Error::Held { .. })));
    // ...after it, worker-b takes over with the next fence and resumes after the checkpoint.
    clock.advance(1_001);
    let b = store.acquire("stream-1", "worker-b").await?;
    assert_eq!((b.fence, b.last_seq), (a.fence + 1, Some(41)));

    // worker-a's late renewal is refused: its fence is no longer the item's.
    assert!(matches!(store.renew(&mut a).await, Err(Error::Lost { .. })));
    println!("worker-b took stream-1 over under fence {}, resuming after 41", b.fence);
    Ok(())
}
