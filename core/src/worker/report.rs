//! The worker's counters and its metrics loop: one EMF line per interval with the deltas since
//! the previous line, and a last one at shutdown.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::warn;

use super::Inner;
use crate::metrics::Emf;

/// Renewal latencies kept between two metrics lines (about 700 leases x 12 renewals a minute).
const MAX_LATENCY_SAMPLES: usize = 20_000;

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) acquired: AtomicU64,
    pub(crate) acquire_conflicts: AtomicU64,
    pub(crate) acquire_errors: AtomicU64,
    pub(crate) leases_lost: AtomicU64,
    pub(crate) released: AtomicU64,
    pub(crate) handler_errors: AtomicU64,
    pub(crate) handler_panics: AtomicU64,
    pub(crate) orphan_polls: AtomicU64,
    pub(crate) hints_received: AtomicU64,
    pub(crate) session_takeovers: AtomicU64,
    pub(crate) handed_over: AtomicU64,
    renew_latency_ms: Mutex<Vec<u64>>,
    session_renew_latency_ms: Mutex<Vec<u64>>,
}

/// The counters' values at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    pub(crate) acquired: u64,
    pub(crate) acquire_conflicts: u64,
    pub(crate) acquire_errors: u64,
    pub(crate) leases_lost: u64,
    pub(crate) released: u64,
    pub(crate) handler_errors: u64,
    pub(crate) handler_panics: u64,
    pub(crate) orphan_polls: u64,
    pub(crate) hints_received: u64,
    pub(crate) session_takeovers: u64,
    pub(crate) handed_over: u64,
}

impl Counters {
    pub(crate) fn add(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn renew_latency(&self, ms: u64) {
        let mut samples = self.renew_latency_ms.lock().expect("latencies poisoned");
        if samples.len() < MAX_LATENCY_SAMPLES {
            samples.push(ms);
        }
    }

    fn take_latencies(&self) -> Vec<u64> {
        std::mem::take(&mut *self.renew_latency_ms.lock().expect("latencies poisoned"))
    }

    pub(crate) fn session_renew_latency(&self, ms: u64) {
        let mut samples = self.session_renew_latency_ms.lock().expect("latencies poisoned");
        if samples.len() < MAX_LATENCY_SAMPLES {
            samples.push(ms);
        }
    }

    fn take_session_latencies(&self) -> Vec<u64> {
        std::mem::take(&mut *self.session_renew_latency_ms.lock().expect("latencies poisoned"))
    }

    pub(crate) fn totals(&self) -> Totals {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Totals {
            acquired: get(&self.acquired),
            acquire_conflicts: get(&self.acquire_conflicts),
            acquire_errors: get(&self.acquire_errors),
            leases_lost: get(&self.leases_lost),
            released: get(&self.released),
            handler_errors: get(&self.handler_errors),
            handler_panics: get(&self.handler_panics),
            orphan_polls: get(&self.orphan_polls),
            hints_received: get(&self.hints_received),
            session_takeovers: get(&self.session_takeovers),
            handed_over: get(&self.handed_over),
        }
    }
}

/// Writes the EMF lines.
pub(crate) struct Reporter {
    writer: Mutex<Box<dyn Write + Send>>,
    last: Mutex<Totals>,
    namespace: String,
}

impl Reporter {
    pub(crate) fn new(namespace: String, writer: Box<dyn Write + Send>) -> Self {
        Self { namespace, writer: Mutex::new(writer), last: Mutex::default() }
    }

    /// One line with the deltas since the previous one.
    pub(crate) fn emit(&self, inner: &Inner) {
        let now = inner.counters.totals();
        let delta = {
            let mut last = self.last.lock().expect("metrics poisoned");
            let before = std::mem::replace(&mut *last, now);
            move |f: fn(&Totals) -> u64| f(&now).saturating_sub(f(&before))
        };
        let mut emf = Emf::new(&self.namespace)
            .dimension("Service", "worker")
            .dimension("WorkerId", inner.id.as_str())
            .count("ActiveConnections", inner.held().len() as u64)
            .count("Acquired", delta(|t| t.acquired))
            .count("AcquireConflicts", delta(|t| t.acquire_conflicts))
            .count("AcquireErrors", delta(|t| t.acquire_errors))
            .count("LeasesLost", delta(|t| t.leases_lost))
            .count("Released", delta(|t| t.released))
            .count("HandlerFailures", delta(|t| t.handler_errors + t.handler_panics))
            .milliseconds("RenewLatency", &inner.counters.take_latencies());
        if inner.store.config().mode == crate::LeaseMode::Session {
            emf = emf
                .count("Sessions", u64::from(inner.current_session().is_some()))
                .milliseconds("SessionRenewLatency", &inner.counters.take_session_latencies())
                .count("SessionTakeovers", delta(|t| t.session_takeovers));
        }
        let line = emf.to_line(inner.store.clock().now_ms());
        let mut writer = self.writer.lock().expect("metrics writer poisoned");
        if let Err(e) = writeln!(writer, "{line}").and_then(|()| writer.flush()) {
            warn!(error = %e, "metrics line not written");
        }
    }
}

pub(crate) async fn metrics_loop(inner: Arc<Inner>, reporter: Arc<Reporter>) {
    let interval: Duration = inner.settings.metrics_interval;
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = inner.shutdown.cancelled() => return,
            _ = ticks.tick() => reporter.emit(&inner),
        }
    }
}
