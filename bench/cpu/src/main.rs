//! Process CPU time per renew and per acquire of the Rust `LeaseTable`, against the endpoint in
//! `AWS_ENDPOINT_URL` (make bench points it at a keep-alive server answering canned responses).
//! Prints one JSON object: `rust_cpu_us_per_renew`, `rust_cpu_us_per_acquire`, and side by side
//! in the same run, taking turns, a renew on the store's clock (every answer's `Date` measured,
//! the default) and on the local clock as it is (`rust_cpu_us_per_renew_store_clock`,
//! `rust_cpu_us_per_renew_local_clock`, and the median of the turns' ratios,
//! `rust_renew_store_clock_cpu_ratio`); then the same pairs with the client answered in
//! process (no socket: the client's own CPU only, the ratio undiluted by the kernel's share):
//! `rust_cpu_us_per_renew_in_process_store_clock`, `..._local_clock`,
//! `rust_renew_store_clock_cpu_ratio_in_process`.
//!
//! usage: leaselock-bench-cpu OPS

use std::sync::Arc;
use std::time::Duration;

use leaselock::{Lease, LeaseStore, LeaseTable, SystemClock, TableConfig};

/// User + system CPU of the whole process so far, microseconds.
fn cpu_us() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

#[tokio::main]
async fn main() -> leaselock::Result<()> {
    let ops: usize = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(3_000);
    let config =
        TableConfig::new("bench").lease_duration(Duration::from_secs(20)).renew_interval(Duration::from_secs(5));
    let table = LeaseTable::connect(config).await?;
    let mut lease = table.acquire("bench", "bench-owner").await?;
    for _ in 0..ops / 10 {
        table.renew(&mut lease).await?;
    }
    let start = cpu_us();
    for _ in 0..ops {
        table.renew(&mut lease).await?;
    }
    let renew = (cpu_us() - start) / ops as f64;
    for _ in 0..ops / 10 {
        table.acquire("bench", "bench-owner").await?;
    }
    let start = cpu_us();
    for _ in 0..ops {
        table.acquire("bench", "bench-owner").await?;
    }
    let acquire = (cpu_us() - start) / ops as f64;
    let (store_clock, local_clock, ratio) = renew_side_by_side(&table, &mut lease, ops).await?;
    let sdk = table.client().config().to_builder().http_client(in_process::client()).build();
    let answered_here = LeaseTable::new(aws_sdk_dynamodb::Client::from_conf(sdk), table.config().clone())?;
    let mut here = answered_here.acquire("bench", "bench-owner").await?;
    let (here_store, here_local, here_ratio) = renew_side_by_side(&answered_here, &mut here, 4 * ops).await?;
    println!(
        "{{\"rust_cpu_us_per_renew\": {renew:.1}, \"rust_cpu_us_per_acquire\": {acquire:.1}, \
         \"rust_cpu_us_per_renew_store_clock\": {store_clock:.1}, \"rust_cpu_us_per_renew_local_clock\": {local_clock:.1}, \
         \"rust_renew_store_clock_cpu_ratio\": {ratio:.3}, \
         \"rust_cpu_us_per_renew_in_process_store_clock\": {here_store:.1}, \
         \"rust_cpu_us_per_renew_in_process_local_clock\": {here_local:.1}, \
         \"rust_renew_store_clock_cpu_ratio_in_process\": {here_ratio:.3}}}"
    );
    Ok(())
}

/// CPU per renew on the table's own clock (the store's, measured) and on the local clock as it
/// is, in 40 pairs of turns of `ops / 20` renewals each (which goes first alternating), and the
/// median of the pairs' ratios: on a shared machine the load drifts between turns, much less
/// within one pair.
async fn renew_side_by_side(table: &LeaseTable, lease: &mut Lease, ops: usize) -> leaselock::Result<(f64, f64, f64)> {
    let local = table.clone().with_clock(Arc::new(SystemClock));
    let turn = (ops / 20).max(1);
    let (mut store_us, mut local_us) = (0.0, 0.0);
    let mut ratios = Vec::new();
    for pair in 0..40 {
        let mut spent = [0.0; 2];
        for i in 0..2 {
            let on_store_clock = (pair + i) % 2 == 0;
            let t = if on_store_clock { table } else { &local };
            let start = cpu_us();
            for _ in 0..turn {
                t.renew(lease).await?;
            }
            spent[usize::from(!on_store_clock)] = cpu_us() - start;
        }
        store_us += spent[0];
        local_us += spent[1];
        ratios.push(spent[0] / spent[1]);
    }
    ratios.sort_by(f64::total_cmp);
    let per = (40 * turn) as f64;
    Ok((store_us / per, local_us / per, ratios[ratios.len() / 2]))
}
/// An HTTP client answering every request at once with the canned lease item of a renewal and
/// the `Date` header DynamoDB sends.
mod in_process {
    use aws_smithy_runtime_api::client::http::{
        http_client_fn, HttpConnector, HttpConnectorFuture, SharedHttpClient, SharedHttpConnector,
    };
    use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
    use aws_smithy_types::body::SdkBody;
    use aws_smithy_types::date_time::{DateTime, Format};

    const BODY: &str = r#"{"Attributes":{"connection_id":{"S":"bench"},"desired_state":{"S":"STARTED"},"ws_url":{"S":"wss://feed.example/bench"},"lease_owner":{"S":"bench-owner"},"lease_expires_at_ms":{"N":"4102444800000"},"fence":{"N":"7"},"last_seq":{"N":"41"}}}"#;

    #[derive(Debug)]
    struct Canned;

    impl HttpConnector for Canned {
        fn call(&self, _request: HttpRequest) -> HttpConnectorFuture {
            let mut response = HttpResponse::new(200u16.try_into().expect("a status"), SdkBody::from(BODY));
            let date = DateTime::from(std::time::SystemTime::now()).fmt(Format::HttpDate).expect("a date");
            let headers = response.headers_mut();
            headers.insert("content-type", "application/x-amz-json-1.0");
            headers.insert("date", date);
            HttpConnectorFuture::ready(Ok(response))
        }
    }

    pub fn client() -> SharedHttpClient {
        let connector = SharedHttpConnector::new(Canned);
        http_client_fn(move |_, _| connector.clone())
    }
}
