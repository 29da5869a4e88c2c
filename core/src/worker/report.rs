//! The worker's metrics lines: one EMF line per interval with the deltas since the previous
//! line, and a last one at shutdown. The engine keeps the counters and says when.

use std::io::Write;
use std::sync::Mutex;

use tracing::warn;

use crate::engine::{Metrics, Totals};
use crate::metrics::Emf;

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
    pub(crate) fn emit(&self, worker_id: &str, m: &Metrics, session_mode: bool, now_ms: u64) {
        let now = m.totals;
        let delta = {
            let mut last = self.last.lock().expect("metrics poisoned");
            let before = std::mem::replace(&mut *last, now);
            move |f: fn(&Totals) -> u64| f(&now).saturating_sub(f(&before))
        };
        let mut emf = Emf::new(&self.namespace)
            .dimension("Service", "worker")
            .dimension("WorkerId", worker_id)
            .count("ActiveConnections", m.held as u64)
            .count("Acquired", delta(|t| t.acquired))
            .count("AcquireConflicts", delta(|t| t.acquire_conflicts))
            .count("AcquireErrors", delta(|t| t.acquire_errors))
            .count("LeasesLost", delta(|t| t.leases_lost))
            .count("Released", delta(|t| t.released))
            .count("HandlerFailures", delta(|t| t.handler_errors + t.handler_panics))
            .milliseconds("RenewLatency", &m.renew_latency_ms);
        if session_mode {
            emf = emf
                .count("Sessions", u64::from(m.session_live))
                .milliseconds("SessionRenewLatency", &m.session_renew_latency_ms)
                .count("SessionTakeovers", delta(|t| t.session_takeovers));
        }
        let line = emf.to_line(now_ms);
        let mut writer = self.writer.lock().expect("metrics writer poisoned");
        if let Err(e) = writeln!(writer, "{line}").and_then(|()| writer.flush()) {
            warn!(error = %e, "metrics line not written");
        }
    }
}
