//! A loopback TCP proxy in front of the local engine that can stall the network: once stalled,
//! it accepts every connection and reads what is sent, but forwards nothing and never answers.
//! It notes every request: when it arrived, whether it was stalled, what it said and when an
//! answer began to come back. The engine closes every connection after one answer, so one
//! connection is one request.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// One request (one connection) as the proxy saw it.
#[derive(Debug)]
pub struct Request {
    pub arrived: Instant,
    pub stalled: bool,
    bytes: Mutex<Vec<u8>>,
    answered: Mutex<Option<Instant>>,
}

impl Request {
    /// Whether what the client sent so far contains `needle`.
    pub fn contains(&self, needle: &str) -> bool {
        let bytes = self.bytes.lock().unwrap();
        String::from_utf8_lossy(&bytes).contains(needle)
    }

    /// When the first byte of an answer came back, if one did.
    pub fn answered(&self) -> Option<Instant> {
        *self.answered.lock().unwrap()
    }
}

#[derive(Debug, Default)]
struct State {
    stalled: AtomicBool,
    requests: Mutex<Vec<Arc<Request>>>,
}

/// The proxy; dropping it closes every connection.
#[derive(Debug)]
pub struct Proxy {
    pub addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// A proxy to `upstream`; with `None`, a listener that never answers anything.
    pub async fn start(upstream: Option<SocketAddr>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State { stalled: AtomicBool::new(upstream.is_none()), ..State::default() });
        let task = {
            let state = state.clone();
            tokio::spawn(async move {
                let mut connections = JoinSet::new();
                while let Ok((client, _)) = listener.accept().await {
                    let stalled = state.stalled.load(Ordering::SeqCst);
                    let request = Arc::new(Request {
                        arrived: Instant::now(),
                        stalled,
                        bytes: Mutex::default(),
                        answered: Mutex::default(),
                    });
                    state.requests.lock().unwrap().push(request.clone());
                    connections.spawn(serve(client, request, upstream.filter(|_| !stalled)));
                }
            })
        };
        Proxy { addr, state, task }
    }

    /// A proxy to the engine `AWS_ENDPOINT_URL` names.
    pub async fn to_engine() -> Proxy {
        Proxy::start(Some(engine_addr())).await
    }

    /// `http://` and the proxy's address, for an SDK's endpoint.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on nothing is forwarded and nothing answered.
    pub fn stall(&self) {
        self.state.stalled.store(true, Ordering::SeqCst);
    }

    pub fn requests(&self) -> Vec<Arc<Request>> {
        self.state.requests.lock().unwrap().clone()
    }

    /// The requests that contain `needle`.
    pub fn requests_with(&self, needle: &str) -> Vec<Arc<Request>> {
        self.requests().into_iter().filter(|r| r.contains(needle)).collect()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The engine's address from `AWS_ENDPOINT_URL` (`http://host:port`).
pub fn engine_addr() -> SocketAddr {
    let url = std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL");
    let host_port = url.trim_start_matches("http://").trim_end_matches('/');
    host_port.to_socket_addrs().unwrap().next().expect("an engine address")
}

async fn serve(client: TcpStream, request: Arc<Request>, upstream: Option<SocketAddr>) {
    let (mut from_client, mut to_client) = client.into_split();
    let Some(upstream) = upstream else {
        // Stalled: read (so the client's write completes) and never answer.
        let mut buf = [0u8; 4096];
        while let Ok(n) = from_client.read(&mut buf).await {
            if n == 0 {
                return;
            }
            request.bytes.lock().unwrap().extend_from_slice(&buf[..n]);
        }
        return;
    };
    let Ok(server) = TcpStream::connect(upstream).await else { return };
    let (mut from_server, mut to_server) = server.into_split();
    let up = {
        let request = request.clone();
        async move {
            let mut buf = [0u8; 8192];
            while let Ok(n) = from_client.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                request.bytes.lock().unwrap().extend_from_slice(&buf[..n]);
                if to_server.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            let _ = to_server.shutdown().await;
        }
    };
    let down = async move {
        let mut buf = [0u8; 8192];
        while let Ok(n) = from_server.read(&mut buf).await {
            if n == 0 {
                break;
            }
            request.answered.lock().unwrap().get_or_insert_with(Instant::now);
            if to_client.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = to_client.shutdown().await;
    };
    tokio::join!(up, down);
}
