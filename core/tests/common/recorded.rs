//! A loopback DynamoDB that answers every request from a function of its operation: recorded
//! answers of what the local engine cannot make (a global table's description, a Region's write
//! conflict). Self-contained, so other crates' tests can include it with `#[path]`.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// A recorded answer: HTTP status and JSON body.
pub type Answer = (u16, String);
type Answers = Arc<Mutex<dyn FnMut(&str, usize) -> Answer + Send>>;

/// A loopback DynamoDB that answers each request with `answer(operation, nth request of that
/// operation)`, and the operations it was asked, in order.
pub async fn recorded(answer: impl FnMut(&str, usize) -> Answer + Send + 'static) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let asked = Arc::new(Mutex::new(Vec::<String>::new()));
    let answers: Answers = Arc::new(Mutex::new(answer));
    let log = asked.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let (answers, log) = (answers.clone(), log.clone());
            tokio::spawn(async move {
                let (rx, mut tx) = socket.into_split();
                let mut rx = BufReader::new(rx);
                loop {
                    let (mut operation, mut length) = (String::new(), 0usize);
                    loop {
                        let mut line = String::new();
                        if rx.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap();
                        }
                        if lower.starts_with("x-amz-target:") {
                            operation = line.rsplit('.').next().unwrap_or_default().trim().to_string();
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; length];
                    rx.read_exact(&mut body).await.unwrap();
                    let nth = {
                        let mut log = log.lock().unwrap();
                        log.push(operation.clone());
                        log.iter().filter(|o| **o == operation).count() - 1
                    };
                    let (status, json) = (answers.lock().unwrap())(&operation, nth);
                    let response = format!(
                        "HTTP/1.1 {status} {}\r\ncontent-type: application/x-amz-json-1.0\r\nx-amzn-requestid: recorded\r\n\
                         content-length: {}\r\n\r\n{json}",
                        if status == 200 { "OK" } else { "Bad Request" },
                        json.len()
                    );
                    if tx.write_all(response.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), asked)
}

/// DescribeTable of a global table: `consistency` is `MultiRegionConsistency`, if any.
pub fn global_table(name: &str, consistency: Option<&str>) -> Answer {
    let mode = consistency.map(|m| format!(r#","MultiRegionConsistency":"{m}""#)).unwrap_or_default();
    (
        200,
        format!(
            r#"{{"Table":{{"TableName":"{name}","TableStatus":"ACTIVE","GlobalTableVersion":"2019.11.21",
            "Replicas":[{{"RegionName":"us-east-1","ReplicaStatus":"ACTIVE"}},{{"RegionName":"eu-west-1","ReplicaStatus":"ACTIVE"}}]{mode}}}}}"#
        ),
    )
}
