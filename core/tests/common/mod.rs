//! Shared set-up for tests against the local AWS engine (moto server).
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use leaselock::{Clock, LeaseTable, TableConfig};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A fresh, uniquely named table on the local engine, or `None` (with a note) when no engine is
/// configured. Under `make test` (`LEASELOCK_REQUIRE_SERVICES=1`) a missing engine is a failure.
pub async fn table(config: TableConfig, clock: Option<Arc<dyn Clock>>) -> Option<LeaseTable> {
    if std::env::var_os("AWS_ENDPOINT_URL").is_none() {
        assert!(
            std::env::var_os("LEASELOCK_REQUIRE_SERVICES").is_none(),
            "AWS_ENDPOINT_URL is not set; run through scripts/with-services.sh"
        );
        eprintln!("skipped: AWS_ENDPOINT_URL is not set (make test-rust starts the local engine)");
        return None;
    }
    let name = format!("t{}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst), config.table_name);
    let config = TableConfig { table_name: name, ..config };
    let mut table = LeaseTable::connect(config).await.expect("store");
    if let Some(clock) = clock {
        table = table.with_clock(clock);
    }
    table.create_table().await.expect("create table");
    Some(table)
}
