//! The manual's lease-by-hand sample (docs/src/quick-start.md includes it from its first `use`):
//! bindings/python/tests/test_manual.py runs it twice against the local engine.

use leaselock::{Error, LeaseStore, LeaseTable, TableConfig};

#[tokio::main]
async fn main() -> leaselock::Result<()> {
    // Table, attribute and index names default to the AWS reference worker's schema.
    let table = LeaseTable::connect(TableConfig::new("leases")).await?;
    table.create_table().await?; // table + sparse orphan index + TTL; idempotent

    table.start("stream-1", "wss://feed.example/stream-1").await?; // desired_state = STARTED
    let mut lease = match table.acquire("stream-1", "worker-a").await {
        Ok(lease) => lease,
        Err(Error::Held { owner, expires_at_ms }) => {
            println!("{owner} holds it until {expires_at_ms}");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    println!("fence {}, resume after {:?}", lease.fence, lease.last_seq);

    let next = lease.last_seq.unwrap_or(0) + 1;
    table.checkpoint(&mut lease, next).await?; // only moves forward (SeqNotIncreasing otherwise)
    table.renew(&mut lease).await?; // every renew interval, before lease.deadline()
    table.release(&lease).await?; // claimable by anyone at once
    Ok(())
}
