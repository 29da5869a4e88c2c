//! A loopback proxy in front of the local engine that injects faults: lost responses (applied
//! upstream, never answered), throttling, slow answers, no answer at all; it also records the
//! DynamoDB operation (`X-Amz-Target`) of every request it forwards. Self-contained, so other
//! crates' tests can include it with `#[path]`.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
pub struct Faults {
    /// Forward the next N requests but cut the connection instead of answering.
    pub lose_responses: AtomicU32,
    /// Answer the next N requests with DynamoDB's throttling error, forwarding nothing.
    pub throttle: AtomicU32,
    /// Requests that reached the engine.
    pub forwarded: AtomicU32,
    /// Hold every answer this long before passing it on.
    pub delay_ms: AtomicU64,
    /// Read requests and never answer (nothing is forwarded).
    pub silent: AtomicBool,
    /// While silent, still forward (and answer) the next N requests: a command's table check
    /// gets through, the write after it meets the silence.
    pub pass_while_silent: AtomicU32,
    /// The operation of every forwarded request (`Query`, `Scan`, ...), in order.
    pub operations: Mutex<Vec<String>>,
}

impl Faults {
    /// How many forwarded requests were of `operation`.
    pub fn count(&self, operation: &str) -> usize {
        self.operations.lock().unwrap().iter().filter(|o| *o == operation).count()
    }
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

/// The operation named by a request's `X-Amz-Target: DynamoDB_20120810.Query` header.
fn operation_of(request: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(request);
    text.lines().find_map(|l| {
        let lower = l.to_ascii_lowercase();
        lower.starts_with("x-amz-target:").then(|| l.rsplit('.').next().unwrap_or_default().trim().to_string())
    })
}

const THROTTLED: &str = "{\"__type\":\"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException\",\
\"message\":\"The level of configured provisioned throughput for the table was exceeded.\"}";

/// Starts the proxy to `upstream` (`host:port`); returns its `http://` endpoint.
pub async fn proxy(upstream: String, faults: Arc<Faults>) -> String {
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
                    if faults.silent.load(Ordering::SeqCst) && !take(&faults.pass_while_silent) {
                        // Holds the connection open without a word until the client gives up.
                        let mut rest = Vec::new();
                        let _ = client_rx.read_to_end(&mut rest).await;
                        return;
                    }
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
                    if let Some(op) = operation_of(&request) {
                        faults.operations.lock().unwrap().push(op);
                    }
                    let Some(response) = read_message(&mut server_rx).await else { return };
                    if take(&faults.lose_responses) {
                        return; // applied upstream; the caller never hears back
                    }
                    let delay = faults.delay_ms.load(Ordering::SeqCst);
                    if delay > 0 {
                        tokio::time::sleep(Duration::from_millis(delay)).await;
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

/// A DynamoDB client of the default configuration sending to `endpoint`.
pub async fn client_to(endpoint: &str) -> aws_sdk_dynamodb::Client {
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    aws_sdk_dynamodb::Client::from_conf(aws_sdk_dynamodb::config::Builder::from(&sdk).endpoint_url(endpoint).build())
}
