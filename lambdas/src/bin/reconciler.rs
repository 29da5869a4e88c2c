//! The reconciler Lambda: on a schedule, hints every orphan and emits the fleet's counts; in
//! session mode, every few runs, sweeps the table for stranded work.

use lambda_runtime::{service_fn, LambdaEvent};
use leaselock_lambdas::{connect, reconciler, Config, EmfWriter};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = Config::from_env()?;
    let (table, hints) = connect(&config).await?;
    let metrics = EmfWriter::new(&config.metrics_namespace, "reconciler", std::io::stdout());
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| {
        reconciler::handle_with(event, &table, &hints, &metrics, config.sweep)
    }))
    .await
}
