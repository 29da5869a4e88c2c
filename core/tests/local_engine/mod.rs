//! The one guard of every test that needs the local AWS engine or the local Redis. Under `make test`
//! (`scripts/with-services.sh` sets `LEASELOCK_REQUIRE_SERVICES=1`) or CI (`CI` set) a missing
//! engine fails the test loudly; anywhere else the test says it was skipped, and why, and passes.

/// The engine's endpoint, or `None` after saying that `test` was skipped.
#[allow(dead_code)] // a test crate of Redis alone includes this module too
pub fn endpoint(test: &str) -> Option<String> {
    service(test, "AWS_ENDPOINT_URL", "the local engine")
}

/// The local Redis's URL, or `None` after saying that `test` was skipped.
#[allow(dead_code)] // not every test crate that includes this module uses Redis
pub fn redis(test: &str) -> Option<String> {
    service(test, "LEASELOCK_REDIS_URL", "the local Redis")
}

fn service(test: &str, variable: &str, what: &str) -> Option<String> {
    if let Ok(url) = std::env::var(variable) {
        return Some(url);
    }
    let required = std::env::var_os("LEASELOCK_REQUIRE_SERVICES").is_some() || std::env::var_os("CI").is_some();
    assert!(!required, "{test}: {variable} is not set; run it through scripts/with-services.sh");
    eprintln!("skipped: {test} needs {what} ({variable} is not set; scripts/with-services.sh starts it)");
    None
}
