//! The table's answers measure the store's clock: an interceptor on the table's client notes
//! the local clocks when a request is sent (at most one in
//! [`crate::store_clock::SAMPLE_SPACING_MS`]) and when its answer comes back, and hands the
//! answer's `Date` (and `Age`) header with them to the table's [`StoreClock`].

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_smithy_runtime_api::client::interceptors::{dyn_dispatch_hint, Intercept};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};

use crate::store_clock::Sample;
use crate::{Clock, StoreClock};

/// The clock a table measures into.
pub(crate) type TableClock = Arc<StoreClock<Arc<dyn Clock>>>;

/// `client` set up for the protocol's requests ([`super::single_attempt_client`]), measuring
/// every answer into `clock` when there is one.
pub(crate) fn attempts_client(client: &Client, clock: Option<TableClock>) -> Client {
    let Some(clock) = clock else { return super::single_attempt_client(client) };
    Client::from_conf(super::single_attempt_config(client).interceptor(MeasureStoreClock(clock)).build())
}

/// The local clocks (wall, monotonic ms) when the request went out.
#[derive(Debug, Clone, Copy)]
struct SentAt(u64, u64);

impl Storable for SentAt {
    type Storer = StoreReplace<Self>;
}

/// Feeds each answer to the table's clock.
#[derive(Debug)]
struct MeasureStoreClock(TableClock);

#[dyn_dispatch_hint]
impl Intercept for MeasureStoreClock {
    fn name(&self) -> &'static str {
        "MeasureStoreClock"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let mono = self.0.local().monotonic_ms();
        if self.0.wants_sample(mono) {
            cfg.interceptor_state().store_put(SentAt(self.0.local().now_ms(), mono));
        }
        Ok(())
    }

    fn read_before_deserialization(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(&SentAt(wall, mono)) = cfg.load::<SentAt>() else { return Ok(()) };
        let received = self.0.local_now();
        let headers = context.response().headers();
        if let Ok(sample) = Sample::from_answer((wall, mono), received, headers.get("date"), headers.get("age")) {
            self.0.observe(&sample);
        }
        Ok(())
    }
}

/// Probes (DescribeTable: no capacity used) until the store's clock is known within
/// `within_ms`, at most [`MAX_PROBES`].
pub(crate) async fn measure(client: &Client, table: &str, clock: &TableClock, within_ms: u64) {
    let mut round_trip_ms = 10;
    for _ in 0..MAX_PROBES {
        if clock.estimate().is_some_and(|e| e.uncertainty_ms <= within_ms) {
            return;
        }
        round_trip_ms = probe(client, table, clock, round_trip_ms).await.unwrap_or(round_trip_ms);
    }
}

/// Enough to narrow a first answer's second to tens of ms, at about one a second.
pub(crate) const MAX_PROBES: usize = 12;

/// One probe, sent to land on the store's second boundary as estimated so far
/// ([`StoreClock::probe_at`]): whichever second its answer names about halves the interval.
/// Returns its round trip (ms), or `None` when no answer came in time.
pub(crate) async fn probe(client: &Client, table: &str, clock: &TableClock, round_trip_ms: u64) -> Option<u64> {
    let wait = clock.probe_at(round_trip_ms).saturating_sub(clock.local().monotonic_ms());
    tokio::time::sleep(Duration::from_millis(wait)).await;
    let sent = clock.local().monotonic_ms();
    let probe = client.describe_table().table_name(table).send();
    // A refusal measures as well as a success: any answer has its Date.
    let _answer = tokio::time::timeout(Duration::from_secs(2), probe).await.ok()?;
    Some(clock.local().monotonic_ms().saturating_sub(sent).clamp(1, 500))
}
