//! Writes whose response is lost on the way back (applied, but the caller sees a dropped
//! connection) are resolved by a consistent re-read, not reported as failures or retried blindly.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use leaselock::{LeaseStore, LeaseTable, TableConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A loopback TCP proxy to the local engine that, while `drop_responses > 0`, forwards a request
/// and then cuts the connection instead of returning the response.
async fn lossy_proxy(upstream: String, drop_responses: Arc<AtomicU32>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            let drop_responses = drop_responses.clone();
            tokio::spawn(async move {
                let server = TcpStream::connect(upstream).await.unwrap();
                let (mut client_rx, mut client_tx) = client.into_split();
                let (mut server_rx, mut server_tx) = server.into_split();
                let to_server = tokio::spawn(async move { tokio::io::copy(&mut client_rx, &mut server_tx).await });
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match server_rx.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    let lose =
                        drop_responses.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |d| d.checked_sub(1)).is_ok();
                    if lose || client_tx.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                to_server.abort();
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn lost_responses_are_resolved_by_rereading() {
    let Some(direct) = common::table(TableConfig::default(), None).await else { return };
    let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap();
    let upstream = endpoint.trim_start_matches("http://").trim_end_matches('/').to_string();
    let drop_responses = Arc::new(AtomicU32::new(0));
    let proxy = lossy_proxy(upstream, drop_responses.clone()).await;

    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let client =
        aws_sdk_dynamodb::Client::from_conf(aws_sdk_dynamodb::config::Builder::from(&sdk).endpoint_url(proxy).build());
    let table = LeaseTable::new(client, direct.config().clone()).unwrap();
    table.start("s1", "wss://feed.example/s1").await.unwrap();

    drop_responses.store(1, Ordering::SeqCst);
    let mut lease = table.acquire("s1", "a").await.expect("an applied claim is ours, not Held by ourselves");
    assert_eq!(drop_responses.load(Ordering::SeqCst), 0, "the claim's response was lost");
    assert_eq!(lease.fence, 1);
    assert_eq!(direct.get("s1").await.unwrap().unwrap().fence, 1, "claimed once");

    drop_responses.store(1, Ordering::SeqCst);
    table.renew(&mut lease).await.expect("an applied renewal counts");
    let item = direct.get("s1").await.unwrap().unwrap();
    assert_eq!(Some(lease.expires_at_ms), item.expires_at_ms);

    drop_responses.store(1, Ordering::SeqCst);
    table.checkpoint(&mut lease, 9).await.expect("an applied checkpoint counts");
    assert_eq!(direct.get("s1").await.unwrap().unwrap().last_seq, Some(9));

    drop_responses.store(1, Ordering::SeqCst);
    table.release(&lease).await.expect("an applied release counts");
    assert_eq!(direct.get("s1").await.unwrap().unwrap().expires_at_ms, Some(0));
    assert_eq!(drop_responses.load(Ordering::SeqCst), 0);
}
