//! SDK errors turned, in one place, into the protocol's answer kinds. What each kind means for the
//! operation is decided by the protocol, not here.

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_types::error::display::DisplayErrorContext;

use crate::protocol::Answer;

/// The answer kind of a failed request; `special` picks out the failed condition or the cancelled
/// transaction of the operation (with the old item / the reasons).
pub(crate) fn answer_of<E>(err: SdkError<E, HttpResponse>, special: impl FnOnce(&E) -> Option<Answer>) -> Answer
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match &err {
        SdkError::ServiceError(service) => {
            if let Some(answer) = special(service.err()) {
                return answer;
            }
            let e = service.err();
            Answer::from_service_error(
                e.code().unwrap_or_default(),
                e.message().unwrap_or_default(),
                service.raw().status().as_u16(),
            )
        }
        SdkError::DispatchFailure(_) if could_not_connect(&err) => {
            Answer::Unreachable(DisplayErrorContext(&err).to_string())
        }
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            Answer::Ambiguous(DisplayErrorContext(&err).to_string())
        }
        _ => Answer::Other(DisplayErrorContext(&err).to_string()),
    }
}

/// Whether the request failed before it could be sent (connect, DNS, TLS): then nothing was applied.
fn could_not_connect(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(io.kind(), std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::AddrNotAvailable) {
                return true;
            }
        }
        let text = e.to_string();
        if text.contains("client error (Connect)") || text.contains("tcp connect error") || text.contains("dns error") {
            return true;
        }
        cause = e.source();
    }
    false
}
