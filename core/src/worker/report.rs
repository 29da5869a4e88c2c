//! The worker's metrics lines: one EMF line per interval with the deltas since the previous
//! line, and a last one at shutdown. The engine keeps the counters and says when.

use std::io::Write;
use std::sync::Mutex;

use tracing::warn;

use crate::engine::{Metrics, Totals};

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
        let before = std::mem::replace(&mut *self.last.lock().expect("metrics poisoned"), m.totals);
        let line = m.emf_line(&self.namespace, worker_id, &before, session_mode, now_ms);
        let mut writer = self.writer.lock().expect("metrics writer poisoned");
        if let Err(e) = writeln!(writer, "{line}").and_then(|()| writer.flush()) {
            warn!(error = %e, "metrics line not written");
        }
    }
}
