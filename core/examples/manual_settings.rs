//! The manual's configuration sample (docs/src/configuration.md includes it from its first
//! `use`): every table and worker setting spelled out at its default. Run twice by
//! bindings/python/tests/test_manual.py; no engine needed (the memory store).

use std::sync::Arc;
use std::time::Duration;

use leaselock::worker::BoxError;
use leaselock::{Connection, LeaseMode, MemoryStore, SystemClock, TableConfig, Worker};

fn main() -> leaselock::Result<()> {
    let config = TableConfig::new("leases")
        .lease_duration(Duration::from_secs(20)) // a claim or renewal holds the lease this long
        .renew_interval(Duration::from_secs(5)) // how often an owner renews
        .clock_skew(Duration::from_secs(1)) // the largest clock difference between two workers
        .mode(LeaseMode::PerItem) // or LeaseMode::Session: one heartbeat per worker
        .index_name("desired_state-lease_expires_at_ms-index") // the orphan index
        .owner_index_name("lease_owner-index") // session mode's takeovers
        .key_prefix("") // prepended to every id written
        .orphan_shards(1) // orphan-index partition values (1 to 256)
        .operation_budget(Duration::from_secs(10)) // retries of calls that hold no lease
        .operation_attempt_timeout(Duration::from_secs(5)) // one attempt of such a call
        .stopped_retention(Duration::from_secs(7 * 24 * 3600)) // STOPPED items, then TTL
        .allow_eventual_global_table(false)
        .validated()?;
    assert_eq!(config, TableConfig::new("leases"), "every value above is the default");

    let store = Arc::new(MemoryStore::new(config, Arc::new(SystemClock))?);
    let worker = Worker::builder(store)
        .max_connections(700) // the most leases held at once
        .orphan_interval(Duration::from_secs(2)) // orphan index polls (jittered +-20 %)
        .desired_state_interval(Duration::from_secs(10)) // STOP reaches an owner within this
        .handler_grace(Duration::from_secs(5)) // a cancelled handler's time to return
        .metrics_interval(Duration::from_secs(60)) // one EMF line per interval
        .metrics_namespace("leaselock")
        .balance(true) // session mode: fair share, hand the excess over
        .index_lag(Duration::from_secs(10)) // session mode: the owner index's allowed lag
        .wait_for_store_clock(true) // claims wait for the store's clock (tolerance: skew / 2)
        .hint_wait(Duration::from_secs(5)) // the hint queue's long poll, with .hint_queue(..)
        .build(|_conn: Connection| async move { Ok::<(), BoxError>(()) })?;
    println!("worker {} built with the defaults", worker.worker_id());
    Ok(())
}
