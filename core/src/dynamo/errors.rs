//! SDK errors mapped, in one place, to what the retry loop does with them.

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;

/// What a failed request means for the caller.
#[derive(Debug)]
pub(crate) enum Failure<C> {
    /// The condition failed; carries what the operation's error says (the old item).
    Condition(C),
    /// Throttled: nothing was applied, retry after a backoff.
    Throttled(String),
    /// Timed out or 5xx: it may have been applied; re-read before deciding.
    Ambiguous(String),
    /// Anything else: report it.
    Fatal(String),
}

const THROTTLING_CODES: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "ThrottlingException",
    "Throttling",
    "TransactionConflictException",
];

/// Classifies an SDK error; `condition` picks out the conditional-check failure of the operation.
pub(crate) fn classify<E, C>(err: SdkError<E, HttpResponse>, condition: impl FnOnce(&E) -> Option<C>) -> Failure<C>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match &err {
        SdkError::ServiceError(service) => {
            if let Some(c) = condition(service.err()) {
                return Failure::Condition(c);
            }
            let code = service.err().code().unwrap_or_default();
            let message = format!("{code}: {}", service.err().message().unwrap_or_default());
            if THROTTLING_CODES.contains(&code) {
                Failure::Throttled(message)
            } else if service.raw().status().is_server_error() {
                Failure::Ambiguous(message)
            } else {
                Failure::Fatal(message)
            }
        }
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            Failure::Ambiguous(format!("{}", aws_smithy_types::error::display::DisplayErrorContext(&err)))
        }
        _ => Failure::Fatal(format!("{}", aws_smithy_types::error::display::DisplayErrorContext(&err))),
    }
}
