//! Shared set-up for tests against the local AWS engine (moto server).
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use leaselock::{Clock, LeaseStore, LeaseTable, TableConfig};

#[path = "../local_engine/mod.rs"]
pub mod local_engine;
pub mod proxy;
pub mod recorded;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A fresh, uniquely named table on the local engine, or `None` (with a note) when no engine is
/// configured. Under `make test` (`LEASELOCK_REQUIRE_SERVICES=1`) a missing engine is a failure.
pub async fn table(config: TableConfig, clock: Option<Arc<dyn Clock>>) -> Option<LeaseTable> {
    local_engine::endpoint(&config.table_name)?;
    let name = format!("t{}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst), config.table_name);
    let config = TableConfig { table_name: name, ..config };
    let mut table = LeaseTable::connect(config).await.expect("store");
    if let Some(clock) = clock {
        table = table.with_clock(clock);
    }
    table.create_table().await.expect("create table");
    Some(table)
}

/// The local engine's `host:port`.
pub fn upstream() -> String {
    let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap();
    endpoint.trim_start_matches("http://").trim_end_matches('/').to_string()
}

/// A store on a fresh table reached through the fault proxy, and one reaching it directly.
pub async fn stores(config: TableConfig) -> Option<(LeaseTable, LeaseTable, Arc<proxy::Faults>)> {
    stores_with_clock(config, None).await
}

/// [`stores`], both seeing time through `clock` when given.
pub async fn stores_with_clock(
    config: TableConfig,
    clock: Option<Arc<dyn Clock>>,
) -> Option<(LeaseTable, LeaseTable, Arc<proxy::Faults>)> {
    let direct = table(config, clock.clone()).await?;
    let faults = Arc::new(proxy::Faults::default());
    let url = proxy::proxy(upstream(), faults.clone()).await;
    let mut faulty = LeaseTable::new(proxy::client_to(&url).await, direct.config().clone()).unwrap();
    if let Some(clock) = clock {
        faulty = faulty.with_clock(clock);
    }
    Some((faulty, direct, faults))
}
