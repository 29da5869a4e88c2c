//! The manual's fenced-write sample (docs/src/patterns.md includes it from its first `use`): each
//! result and its checkpoint in one transaction that applies only while the lease is ours. Run
//! twice against the local engine by bindings/python/tests/test_manual.py.

use std::sync::Arc;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, Put, ScalarAttributeType,
    TransactWriteItem,
};
use leaselock::worker::BoxError;
use leaselock::{Connection, LeaseStore, LeaseTable, TableConfig, Worker};
use tokio::sync::Notify;

const RESULTS: &str = "leases-results";

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let table = LeaseTable::connect(TableConfig::new("leases")).await?;
    table.create_table().await?;
    table.start("stream-7", "wss://feed.example/stream-7").await?;
    let client = table.client().clone();
    create_results_table(&client).await?;

    let done = Arc::new(Notify::new());
    let finished = done.clone();
    let worker = Worker::builder(Arc::new(table)).max_connections(1).build(move |conn: Connection| {
        let (client, done) = (client.clone(), done.clone());
        async move {
            let mut seq = conn.last_seq().unwrap_or(0);
            for _ in 0..3 {
                seq += 1; // the result of message `seq`, written with the checkpoint or not at all
                let put = Put::builder()
                    .table_name(RESULTS)
                    .item("pk", AttributeValue::S(format!("{}#{seq}", conn.id())))
                    .item("fence", AttributeValue::N(conn.fence().to_string()))
                    .build()?;
                let write = TransactWriteItem::builder().put(put).build();
                conn.fenced_write_with_checkpoint(&client, seq, vec![write]).await?;
                // Lost once taken over
            }
            done.notify_one(); // the sample's end; SIGTERM ends a real worker
            conn.cancelled().await;
            Ok::<(), BoxError>(())
        }
    })?;
    let last = worker.run_until(async move { finished.notified().await }).await;
    println!("released {}", last.released);
    Ok(())
}

/// The results table (any DynamoDB table works: a fenced write is one transaction with a check
/// of the lease item).
async fn create_results_table(client: &aws_sdk_dynamodb::Client) -> Result<(), BoxError> {
    let created = client
        .create_table()
        .table_name(RESULTS)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder().attribute_name("pk").attribute_type(ScalarAttributeType::S).build()?,
        )
        .key_schema(KeySchemaElement::builder().attribute_name("pk").key_type(KeyType::Hash).build()?)
        .send()
        .await;
    match created {
        Ok(_) => Ok(()),
        Err(e) if e.as_service_error().is_some_and(|e| e.is_resource_in_use_exception()) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
