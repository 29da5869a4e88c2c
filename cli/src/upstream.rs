//! A local upstream feed: one sequenced WebSocket stream per path, resumable with `?from=SEQ`.
//! It counts subscribers per stream and flags "double owner" moments: successive owners (fences)
//! of a stream must process disjoint, ordered runs of it, so an acknowledgement of seq `s` under
//! fence `f` while another fence `g > f` has already acknowledged some seq `<= s` (or `g < f` one
//! `>= s`) means two owners processed the stream at once.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::{other, CliResult};

#[derive(clap::Args, Debug, Clone)]
pub struct UpstreamArgs {
    /// Address to listen on (loopback).
    #[arg(long, default_value = "127.0.0.1:9100")]
    pub listen: SocketAddr,
    /// Messages per second on each stream.
    #[arg(long, default_value_t = 5.0)]
    pub rate: f64,
}

/// One message of a stream, as sent on the wire.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FeedMessage {
    pub stream: String,
    pub seq: u64,
    pub data: String,
}

/// What a subscriber sends back after it has durably processed `ack`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Ack {
    pub ack: u64,
}

struct StreamState {
    origin: Instant,
    /// Subscriber id -> its fence.
    subscribers: HashMap<u64, u64>,
    /// Fence -> (lowest, highest) seq acknowledged under it.
    acked: HashMap<u64, (u64, u64)>,
}

/// Counters the demo reads.
#[derive(Debug, Default, Clone, Copy, PartialEq, serde::Serialize)]
pub struct FeedStats {
    pub connections: u64,
    pub acks: u64,
    pub double_owner: u64,
    pub max_subscribers_per_stream: usize,
}

pub struct Feed {
    rate: f64,
    streams: Mutex<HashMap<String, StreamState>>,
    flagged: Mutex<HashSet<(String, u64, u64)>>,
    next_sub: AtomicU64,
    stats: Mutex<FeedStats>,
}

impl Feed {
    pub fn new(rate: f64) -> Arc<Self> {
        Arc::new(Self {
            rate: rate.max(0.001),
            streams: Mutex::default(),
            flagged: Mutex::default(),
            next_sub: AtomicU64::new(1),
            stats: Mutex::default(),
        })
    }

    pub fn stats(&self) -> FeedStats {
        *self.stats.lock().unwrap()
    }

    fn due(&self, origin: Instant, seq: u64) -> Instant {
        origin + Duration::from_secs_f64((seq.saturating_sub(1)) as f64 / self.rate)
    }

    fn subscribe(&self, stream: &str, fence: u64) -> (u64, Instant) {
        let id = self.next_sub.fetch_add(1, Ordering::SeqCst);
        let mut streams = self.streams.lock().unwrap();
        let state = streams.entry(stream.to_string()).or_insert_with(|| StreamState {
            origin: Instant::now(),
            subscribers: HashMap::new(),
            acked: HashMap::new(),
        });
        state.subscribers.insert(id, fence);
        let mut stats = self.stats.lock().unwrap();
        stats.connections += 1;
        stats.max_subscribers_per_stream = stats.max_subscribers_per_stream.max(state.subscribers.len());
        (id, state.origin)
    }

    fn unsubscribe(&self, stream: &str, id: u64) {
        if let Some(state) = self.streams.lock().unwrap().get_mut(stream) {
            state.subscribers.remove(&id);
        }
    }

    fn ack(&self, stream: &str, id: u64, seq: u64) {
        let mut streams = self.streams.lock().unwrap();
        let Some(state) = streams.get_mut(stream) else { return };
        let Some(&fence) = state.subscribers.get(&id) else { return };
        let overlapping: Vec<u64> = state
            .acked
            .iter()
            .filter(|(&g, &(low, high))| (g > fence && low <= seq) || (g < fence && high >= seq))
            .map(|(&g, _)| g)
            .collect();
        let range = state.acked.entry(fence).or_insert((seq, seq));
        *range = (range.0.min(seq), range.1.max(seq));
        let mut stats = self.stats.lock().unwrap();
        stats.acks += 1;
        let mut flagged = self.flagged.lock().unwrap();
        for g in overlapping {
            if flagged.insert((stream.to_string(), fence.min(g), fence.max(g))) {
                stats.double_owner += 1;
                tracing::warn!(stream, fence, other_fence = g, seq, "two owners processed the stream at once");
            }
        }
    }
}

/// Serves the feed until `shutdown` fires.
pub async fn serve(listener: TcpListener, feed: Arc<Feed>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => {
                let Ok((socket, _)) = accepted else { continue };
                let (feed, shutdown) = (feed.clone(), shutdown.clone());
                tokio::spawn(async move {
                    if let Err(e) = subscriber(socket, feed, shutdown).await {
                        tracing::debug!(error = %e, "subscriber ended");
                    }
                });
            }
        }
    }
}

/// Splits `/path?from=3&fence=2` into the stream name and its parameters.
fn parse_target(target: &str) -> (String, u64, u64) {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut from = 0;
    let mut fence = 0;
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("from", v)) => from = v.parse().unwrap_or(0),
            Some(("fence", v)) => fence = v.parse().unwrap_or(0),
            _ => {}
        }
    }
    (path.trim_start_matches('/').to_string(), from, fence)
}

// The handshake callback's error type is tungstenite's (a whole HTTP response).
#[allow(clippy::result_large_err)]
async fn subscriber(socket: TcpStream, feed: Arc<Feed>, shutdown: CancellationToken) -> Result<(), String> {
    let mut target = String::new();
    let ws = tokio_tungstenite::accept_hdr_async(socket, |req: &Request, resp: Response| {
        target = req.uri().to_string();
        Ok(resp)
    })
    .await
    .map_err(|e| e.to_string())?;
    let (stream, from, fence) = parse_target(&target);
    let (id, origin) = feed.subscribe(&stream, fence);
    let (mut tx, mut rx) = ws.split();
    let mut next = from + 1;
    let result = loop {
        tokio::select! {
            _ = shutdown.cancelled() => break Ok(()),
            _ = tokio::time::sleep_until(feed.due(origin, next)) => {
                let msg = FeedMessage { stream: stream.clone(), seq: next, data: format!("{stream}:{next}") };
                let text = serde_json::to_string(&msg).map_err(|e| e.to_string())?;
                if let Err(e) = tx.send(Message::Text(text)).await {
                    break Err(e.to_string());
                }
                next += 1;
            }
            incoming = rx.next() => match incoming {
                Some(Ok(Message::Text(text))) => {
                    if let Ok(ack) = serde_json::from_str::<Ack>(&text) {
                        feed.ack(&stream, id, ack.ack);
                    }
                }
                Some(Ok(Message::Close(_))) | None => break Ok(()),
                Some(Ok(_)) => {}
                Some(Err(e)) => break Err(e.to_string()),
            }
        }
    };
    feed.unsubscribe(&stream, id);
    result
}

pub async fn run(args: UpstreamArgs) -> CliResult {
    let listener = TcpListener::bind(args.listen).await.map_err(other)?;
    let feed = Feed::new(args.rate);
    let shutdown = CancellationToken::new();
    eprintln!("upstream: ws://{} ({} msg/s per stream)", listener.local_addr().map_err(other)?, args.rate);
    let server = tokio::spawn(serve(listener, feed.clone(), shutdown.clone()));
    let mut report = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = leaselock::worker::shutdown_signal() => break,
            _ = report.tick() => eprintln!("upstream: {}", serde_json::to_string(&feed.stats()).map_err(other)?),
        }
    }
    shutdown.cancel();
    let _ = server.await;
    println!("{}", serde_json::to_string(&feed.stats()).map_err(other)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        assert_eq!(parse_target("/streams/s1?from=41&fence=3"), ("streams/s1".into(), 41, 3));
        assert_eq!(parse_target("/s2"), ("s2".into(), 0, 0));
    }

    #[tokio::test]
    async fn interleaved_runs_of_two_fences_are_flagged_once() {
        let feed = Feed::new(10.0);
        let (old, _) = feed.subscribe("s", 1);
        let (new, _) = feed.subscribe("s", 2);
        let (other, _) = feed.subscribe("other", 2);
        for seq in 1..=5 {
            feed.ack("s", old, seq);
        }
        feed.ack("other", other, 1);
        // A hand-over: the new owner resumes after the old one's last message.
        for seq in 6..=8 {
            feed.ack("s", new, seq);
        }
        // A late acknowledgement of a message the old owner processed before the hand-over.
        feed.ack("s", old, 5);
        assert_eq!(feed.stats().double_owner, 0);
        // The old owner processing past the new owner's start is two owners at once, counted once.
        feed.ack("s", old, 7);
        feed.ack("s", old, 8);
        assert_eq!(feed.stats().double_owner, 1);
        assert_eq!(feed.stats().max_subscribers_per_stream, 2);
        // The new owner reprocessing the old owner's range is flagged too.
        let (third, _) = feed.subscribe("other", 3);
        feed.ack("other", third, 1);
        assert_eq!(feed.stats().double_owner, 2);
    }
}
