//! The one guard of every test that needs the local AWS engine. Under `make test`
//! (`scripts/with-services.sh` sets `LEASELOCK_REQUIRE_SERVICES=1`) or CI (`CI` set) a missing
//! engine fails the test loudly; anywhere else the test says it was skipped, and why, and passes.

/// The engine's endpoint, or `None` after saying that `test` was skipped.
pub fn endpoint(test: &str) -> Option<String> {
    if let Ok(url) = std::env::var("AWS_ENDPOINT_URL") {
        return Some(url);
    }
    let required = std::env::var_os("LEASELOCK_REQUIRE_SERVICES").is_some() || std::env::var_os("CI").is_some();
    assert!(!required, "{test}: AWS_ENDPOINT_URL is not set; run it through scripts/with-services.sh");
    eprintln!(
        "skipped: {test} needs the local engine (AWS_ENDPOINT_URL is not set; scripts/with-services.sh starts it)"
    );
    None
}
