//! The manual's worker sample (docs/src/quick-start.md includes it from its first `use`): it
//! runs until SIGTERM, which bindings/python/tests/test_manual.py sends it; twice, against the
//! local engine.

use leaselock::worker::BoxError;
use leaselock::{Connection, LeaseTable, TableConfig, Worker};
use std::sync::Arc;

#[tokio::main]
async fn main() -> leaselock::Result<()> {
    let table = LeaseTable::connect(TableConfig::new("leases")).await?;
    let worker = Worker::builder(Arc::new(table)).max_connections(500).build(|conn: Connection| async move {
        let mut seq = conn.last_seq().unwrap_or(0);
        loop {
            tokio::select! {
                _ = conn.cancelled() => return Ok::<(), BoxError>(()), // deadline, STOP, lost, shutdown
                _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {
                    seq += 1; // process message `seq` of conn.url() ...
                    conn.checkpoint(seq).await?;
                }
            }
        }
    })?;
    let last = worker.run().await; // until SIGTERM / SIGINT
    eprintln!("released {}", last.released);
    Ok(())
}
