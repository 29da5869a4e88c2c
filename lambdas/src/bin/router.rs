//! The router Lambda: START/STOP from API Gateway, SQS or direct invocation.

use lambda_runtime::{service_fn, LambdaEvent};
use leaselock_lambdas::{connect, router, Config};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = Config::from_env()?;
    let (table, hints) = connect(&config).await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| router::handle(event, &table, &hints))).await
}
