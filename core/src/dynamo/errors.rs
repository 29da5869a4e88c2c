//! SDK errors turned, in one place, into the protocol's answer kinds. What each kind means for the
//! operation is decided by the protocol, not here.

use aws_credential_types::provider::error::CredentialsError;
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
    // Credentials and the region are resolved before anything is sent: retrying cannot help.
    if matches!(err, SdkError::DispatchFailure(_) | SdkError::ConstructionFailure(_)) {
        if let Some(missing) = missing_setup(&err) {
            return Answer::NotConfigured(missing);
        }
    }
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

/// What the SDK lacks to build a request (credentials, a region), named for the user, when
/// that is why `err` failed.
fn missing_setup(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cause {
        if e.downcast_ref::<CredentialsError>().is_some() {
            return Some(format!(
                "no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run with a \
                 role); the SDK said: {}",
                causes(e)
            ));
        }
        // The signing error and the endpoint rules' error are not public types: their text is
        // all there is to go by (with an endpoint URL the signer misses it, without one the rules).
        let text = e.to_string();
        if text == "missing signing region" || text.ends_with("Missing Region") {
            return Some("no region (set AWS_REGION, or a region in the AWS_PROFILE's config)".into());
        }
        cause = e.source();
    }
    None
}

/// `e` and its sources, each as its own one-line text.
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cause = Some(e);
    while let Some(e) = cause {
        let text = e.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        cause = e.source();
    }
    crate::render::text(&parts.join(": "))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use aws_credential_types::provider::{future, ProvideCredentials};
    use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};

    use super::CredentialsError;
    use crate::{Error, LeaseStore, LeaseTable, TableConfig};

    /// The credential chain of a machine with nothing configured: it finds nothing.
    #[derive(Debug)]
    struct NoCredentials;

    impl ProvideCredentials for NoCredentials {
        fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
        where
            Self: 'a,
        {
            future::ProvideCredentials::ready(Err(CredentialsError::not_loaded(
                "no providers in chain provided credentials",
            )))
        }
    }

    /// The first request's error and how long it took. The endpoint (the discard port) is never
    /// reached: what is missing is found before anything is sent.
    async fn first_request(config: aws_sdk_dynamodb::config::Builder) -> (Error, Duration) {
        let client = aws_sdk_dynamodb::Client::from_conf(config.behavior_version(BehaviorVersion::latest()).build());
        let table = LeaseTable::new(client, TableConfig::new("leases")).unwrap();
        let started = Instant::now();
        let err = table.get("stream-1").await.expect_err("nothing can be sent");
        (err, started.elapsed())
    }

    fn dummy_credentials() -> Credentials {
        Credentials::new("AKIDEXAMPLE", "secret", None, None, "test")
    }

    #[tokio::test]
    async fn missing_credentials_fail_at_once_naming_them() {
        let (err, took) = first_request(
            aws_sdk_dynamodb::Config::builder()
                .region(Region::new("us-east-1"))
                .endpoint_url("http://127.0.0.1:9")
                .credentials_provider(NoCredentials),
        )
        .await;
        assert!(matches!(err, Error::NotConfigured(_)), "{err:?}");
        let text = err.to_string();
        assert!(text.starts_with("AWS SDK not configured: no credentials (set AWS_ACCESS_KEY_ID"), "{text}");
        assert!(text.contains("no providers in chain provided credentials"), "{text}");
        assert!(took < Duration::from_secs(3), "{took:?}");
    }

    #[tokio::test]
    async fn a_missing_region_fails_at_once_naming_it() {
        // With an endpoint URL the signer misses the region; without one, the endpoint rules do.
        for endpoint in [Some("http://127.0.0.1:9"), None] {
            let mut config = aws_sdk_dynamodb::Config::builder().credentials_provider(dummy_credentials());
            config.set_endpoint_url(endpoint.map(String::from));
            let (err, took) = first_request(config).await;
            assert!(matches!(err, Error::NotConfigured(_)), "{endpoint:?}: {err:?}");
            assert_eq!(
                err.to_string(),
                "AWS SDK not configured: no region (set AWS_REGION, or a region in the AWS_PROFILE's config)"
            );
            assert!(took < Duration::from_secs(3), "{endpoint:?}: {took:?}");
        }
    }
}
