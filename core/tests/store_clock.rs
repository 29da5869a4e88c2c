//! The store's clock measured from the local engine's answers: its `Date` header, against a
//! host clock shifted 2 s and 5 s either way.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leaselock::{Clock, LeaseStore, SkewedClock, StoreOffset, SystemClock, TableConfig};

#[tokio::test]
async fn the_offset_to_the_store_is_measured_from_its_answers() {
    let Some(table) = common::table(TableConfig::default(), None).await else { return };
    let shifts = [-5_000, -2_000, 0, 2_000, 5_000];
    let measured = futures::future::join_all(shifts.map(|shift| {
        let local: Arc<dyn Clock> = Arc::new(SkewedClock { inner: SystemClock, offset_ms: shift });
        let table = table.clone().with_store_clock(local);
        async move {
            assert_eq!(table.clock().store_offset(), StoreOffset::Unknown);
            let clock = table.store_clock().expect("measured");
            // Each read sent so that the store answers it on its second boundary as estimated.
            for _ in 0..12 {
                let wait = clock.probe_at(5).saturating_sub(SystemClock.monotonic_ms());
                tokio::time::sleep(Duration::from_millis(wait)).await;
                table.get("nothing-here").await.unwrap();
            }
            let StoreOffset::Measured(e) = table.clock().store_offset() else { panic!("no estimate") };
            // The local engine reads the true clock: the store's offset to the shifted one is −shift.
            let error = (e.offset_ms + shift).abs();
            assert!(error <= e.uncertainty_ms as i64 + 1, "shift {shift}: {e:?}");
            assert!(e.uncertainty_ms <= 50 && error < 100, "shift {shift}: {e:?}");
            // The table's clock reads the store's time, not the shifted one.
            let table_now = table.clock().now_ms() as i64;
            assert!((table_now - SystemClock.now_ms() as i64).abs() <= 2 * e.uncertainty_ms as i64 + 5, "{shift}");
            (shift, e)
        }
    }))
    .await;
    for (shift, e) in measured {
        println!(
            "shift {shift:>6} ms: offset {:>6} ± {} ms after {} answers",
            e.offset_ms, e.uncertainty_ms, e.samples
        );
    }
}
