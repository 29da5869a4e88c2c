//! What the engine reports: its counters, a worker's snapshot and its metrics line.

#[allow(unused_imports)]
use super::*;

/// The engine's counters (totals since the start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Totals {
    pub acquired: u64,
    pub acquire_conflicts: u64,
    pub acquire_errors: u64,
    pub leases_lost: u64,
    pub released: u64,
    pub handler_errors: u64,
    pub handler_panics: u64,
    pub orphan_polls: u64,
    pub hints_received: u64,
    pub session_takeovers: u64,
    /// Takeover transactions answered ([`Op::TakeOver`]: several connections each).
    pub takeover_transactions: u64,
    pub handed_over: u64,
}

/// What a metrics line reports: the totals, what is held, and the latencies since the last one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    pub totals: Totals,
    pub held: usize,
    pub session_live: bool,
    pub renew_latency_ms: Vec<u64>,
    pub session_renew_latency_ms: Vec<u64>,
    /// The store's clock as last measured (none yet, or the clock is the store's own).
    pub clock: Option<ClockReading>,
}

/// The store's clock as a worker last heard of it ([`Event::StoreClock`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClockReading {
    /// The store's clock minus the local wall clock.
    pub offset_ms: i64,
    /// How far the true offset may be from `offset_ms`.
    pub uncertainty_ms: u64,
}

impl Metrics {
    /// The worker's metrics line (EMF): what is held, the counters' deltas since `before` (the
    /// totals of the previous line), the renewal latencies; session mode adds the session's.
    /// Every driver writes this line, one per [`Command::EmitMetrics`].
    pub fn emf_line(
        &self,
        namespace: &str,
        worker_id: &str,
        before: &Totals,
        session_mode: bool,
        now_ms: u64,
    ) -> String {
        let now = self.totals;
        let delta = |f: fn(&Totals) -> u64| f(&now).saturating_sub(f(before));
        let mut emf = crate::metrics::Emf::new(namespace)
            .dimension("Service", "worker")
            .dimension("WorkerId", worker_id)
            .count("ActiveConnections", self.held as u64)
            .count("Acquired", delta(|t| t.acquired))
            .count("AcquireConflicts", delta(|t| t.acquire_conflicts))
            .count("AcquireErrors", delta(|t| t.acquire_errors))
            .count("LeasesLost", delta(|t| t.leases_lost))
            .count("Released", delta(|t| t.released))
            .count("HandlerFailures", delta(|t| t.handler_errors + t.handler_panics))
            .milliseconds("RenewLatency", &self.renew_latency_ms);
        if let Some(clock) = self.clock {
            emf = emf
                .millisecond_value("ClockOffsetMs", clock.offset_ms)
                .millisecond_value("ClockUncertaintyMs", clock.uncertainty_ms as i64);
        }
        if session_mode {
            emf = emf
                .count("Sessions", u64::from(self.session_live))
                .milliseconds("SessionRenewLatency", &self.session_renew_latency_ms)
                .count("SessionTakeovers", delta(|t| t.session_takeovers));
        }
        emf.to_line(now_ms)
    }
}

/// A point-in-time view of a worker (counters are totals since start).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WorkerSnapshot {
    pub worker_id: String,
    pub max_connections: usize,
    /// Ids whose lease this worker holds, sorted.
    pub held: Vec<String>,
    pub acquired: u64,
    pub acquire_conflicts: u64,
    pub acquire_errors: u64,
    /// Lost to another owner or past the deadline.
    pub leases_lost: u64,
    pub released: u64,
    pub handler_errors: u64,
    pub handler_panics: u64,
    pub orphan_polls: u64,
    pub hints_received: u64,
    /// Session mode: the epoch of the live session.
    pub session_epoch: Option<u64>,
    /// Session mode: connections claimed from dead sessions.
    pub session_takeovers: u64,
    /// Session mode: transactions that took several of a dead session's connections at once.
    pub takeover_transactions: u64,
    /// Session mode: connections handed over to balance the fleet.
    pub handed_over: u64,
    /// Session mode with balance: the most this worker may hold after a claim now.
    pub claim_limit: Option<usize>,
    pub stopping: bool,
    /// The store's clock minus the local wall clock, as last measured (none yet, or the clock
    /// is the store's own), and the uncertainty of that.
    pub clock_offset_ms: Option<i64>,
    pub clock_uncertainty_ms: Option<u64>,
    /// Why the worker claims nothing now, while it keeps what it holds (the store's clock not
    /// known within the tolerance).
    pub claims_paused: Option<String>,
}

impl Engine {
    /// The counters, what is held, and the latencies since the last call.
    pub fn take_metrics(&mut self) -> Metrics {
        Metrics {
            totals: self.totals,
            held: self.held_ids().len(),
            session_live: self.live_session().is_some(),
            renew_latency_ms: std::mem::take(&mut self.renew_latency_ms),
            session_renew_latency_ms: std::mem::take(&mut self.session_renew_latency_ms),
            clock: self.clock,
        }
    }

    pub fn totals(&self) -> Totals {
        self.totals
    }

    pub fn snapshot(&self) -> WorkerSnapshot {
        let c = self.totals;
        WorkerSnapshot {
            worker_id: self.settings.worker_id.clone(),
            max_connections: self.settings.max_connections,
            held: self.held_ids(),
            acquired: c.acquired,
            acquire_conflicts: c.acquire_conflicts,
            acquire_errors: c.acquire_errors,
            leases_lost: c.leases_lost,
            released: c.released,
            handler_errors: c.handler_errors,
            handler_panics: c.handler_panics,
            orphan_polls: c.orphan_polls,
            hints_received: c.hints_received,
            session_epoch: self.live_session().map(|s| s.epoch),
            session_takeovers: c.session_takeovers,
            takeover_transactions: c.takeover_transactions,
            handed_over: c.handed_over,
            claim_limit: self.balanced().then_some(self.claim_limit),
            stopping: self.stopping,
            clock_offset_ms: self.clock.map(|c| c.offset_ms),
            clock_uncertainty_ms: self.clock.map(|c| c.uncertainty_ms),
            claims_paused: self.claims_paused(),
        }
    }
}
