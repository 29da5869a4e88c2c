//! Faults between the store and DynamoDB, injected by a loopback proxy in front of the local
//! engine: responses lost after the write was applied must be resolved by a consistent re-read
//! (not reported as failures nor retried blindly), and throttling must be retried with backoff
//! only while the lease's deadline allows.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leaselock::{Error, LeaseStore, LeaseTable, TableConfig};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Faults {
    /// Forward the next N requests but cut the connection instead of answering.
    lose_responses: AtomicU32,
    /// Answer the next N requests with DynamoDB's throttling error, forwarding nothing.
    throttle: AtomicU32,
    /// Requests that reached the engine.
    forwarded: AtomicU32,
}

fn take(counter: &AtomicU32) -> bool {
    counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
}

/// Reads one HTTP/1.1 message (headers and a Content-Length body); `None` at end of stream.
async fn read_message<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> Option<Vec<u8>> {
    let mut message = Vec::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().ok()?;
        }
        assert!(!lower.starts_with("transfer-encoding: chunked"), "the proxy only speaks Content-Length");
        message.extend_from_slice(line.as_bytes());
        if line == "\r\n" {
            break;
        }
    }
    let start = message.len();
    message.resize(start + length, 0);
    r.read_exact(&mut message[start..]).await.ok()?;
    Some(message)
}

const THROTTLED: &str = "{\"__type\":\"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException\",\
\"message\":\"The level of configured provisioned throughput for the table was exceeded.\"}";

async fn proxy(upstream: String, faults: Arc<Faults>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (upstream, faults) = (upstream.clone(), faults.clone());
            tokio::spawn(async move {
                let (client_rx, mut client_tx) = client.into_split();
                let mut client_rx = BufReader::new(client_rx);
                let server = TcpStream::connect(upstream).await.unwrap();
                let (server_rx, mut server_tx) = server.into_split();
                let mut server_rx = BufReader::new(server_rx);
                while let Some(request) = read_message(&mut client_rx).await {
                    if take(&faults.throttle) {
                        let response = format!(
                            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/x-amz-json-1.0\r\n\
                             x-amzn-requestid: throttled\r\ncontent-length: {}\r\n\r\n{THROTTLED}",
                            THROTTLED.len()
                        );
                        client_tx.write_all(response.as_bytes()).await.unwrap();
                        continue;
                    }
                    server_tx.write_all(&request).await.unwrap();
                    faults.forwarded.fetch_add(1, Ordering::SeqCst);
                    let Some(response) = read_message(&mut server_rx).await else { return };
                    if take(&faults.lose_responses) {
                        return; // applied upstream; the caller never hears back
                    }
                    if client_tx.write_all(&response).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("http://{addr}")
}

/// A store on a fresh table reached through the fault proxy, and one reaching it directly.
async fn stores(config: TableConfig) -> Option<(LeaseTable, LeaseTable, Arc<Faults>)> {
    let direct = common::table(config, None).await?;
    let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap();
    let upstream = endpoint.trim_start_matches("http://").trim_end_matches('/').to_string();
    let faults = Arc::new(Faults::default());
    let url = proxy(upstream, faults.clone()).await;
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let client =
        aws_sdk_dynamodb::Client::from_conf(aws_sdk_dynamodb::config::Builder::from(&sdk).endpoint_url(url).build());
    let faulty = LeaseTable::new(client, direct.config().clone()).unwrap();
    Some((faulty, direct, faults))
}

#[tokio::test]
async fn lost_responses_are_resolved_by_rereading() {
    let Some((table, direct, faults)) = stores(TableConfig::default()).await else { return };
    table.start("s1", "wss://feed.example/s1").await.unwrap();

    faults.lose_responses.store(1, Ordering::SeqCst);
    let mut lease = table.acquire("s1", "a").await.expect("an applied claim is ours, not Held by ourselves");
    assert_eq!(faults.lose_responses.load(Ordering::SeqCst), 0, "the claim's response was lost");
    assert_eq!(lease.fence, 1);
    assert_eq!(direct.get("s1").await.unwrap().unwrap().fence, 1, "claimed once");

    faults.lose_responses.store(1, Ordering::SeqCst);
    table.renew(&mut lease).await.expect("an applied renewal counts");
    assert_eq!(Some(lease.expires_at_ms), direct.get("s1").await.unwrap().unwrap().expires_at_ms);

    faults.lose_responses.store(1, Ordering::SeqCst);
    table.checkpoint(&mut lease, 9).await.expect("an applied checkpoint counts");
    assert_eq!(direct.get("s1").await.unwrap().unwrap().last_seq, Some(9));

    faults.lose_responses.store(1, Ordering::SeqCst);
    table.release(&lease).await.expect("an applied release counts");
    assert_eq!(direct.get("s1").await.unwrap().unwrap().expires_at_ms, Some(0));
    assert_eq!(faults.lose_responses.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn throttling_is_retried_while_the_deadline_allows() {
    let config = TableConfig::default()
        .lease_duration(Duration::from_millis(3_000))
        .renew_interval(Duration::from_millis(1_000))
        .clock_skew(Duration::from_millis(500));
    let Some((table, direct, faults)) = stores(config).await else { return };

    faults.throttle.store(3, Ordering::SeqCst);
    let mut lease = table.acquire("s1", "a").await.expect("three throttles are retried");
    assert_eq!(faults.throttle.load(Ordering::SeqCst), 0);
    assert_eq!(direct.get("s1").await.unwrap().unwrap().fence, 1);

    faults.throttle.store(2, Ordering::SeqCst);
    table.renew(&mut lease).await.expect("renewal retried through throttling");

    // Throttled without end: the renewal gives up as Lost before its deadline, having sent
    // nothing that landed.
    faults.throttle.store(u32::MAX, Ordering::SeqCst);
    let forwarded = faults.forwarded.load(Ordering::SeqCst);
    let started = std::time::Instant::now();
    let deadline = lease.deadline();
    assert!(matches!(table.renew(&mut lease).await, Err(Error::Lost { .. })));
    assert!(std::time::Instant::now() <= deadline, "gave up by the deadline");
    assert!(started.elapsed() >= Duration::from_millis(500), "it did retry: {:?}", started.elapsed());
    assert_eq!(faults.forwarded.load(Ordering::SeqCst), forwarded);

    // Without a lease deadline, a claim gives up within its budget with Throttled.
    assert!(matches!(table.acquire("s2", "a").await, Err(Error::Throttled)));
    faults.throttle.store(0, Ordering::SeqCst);
}
