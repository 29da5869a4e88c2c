//! The reconciler's metrics as CloudWatch EMF lines ([`leaselock::metrics::Emf`]), written to an
//! injectable sink: stdout in Lambda, whose log pipeline turns them into metrics without an API
//! call, and a buffer in tests.

use std::io::Write;
use std::sync::Mutex;

use leaselock::metrics::Emf;

/// Writes EMF lines for one namespace and service (dimension `Service`) to `out`.
#[derive(Debug)]
pub struct EmfWriter<W> {
    namespace: String,
    service: String,
    out: Mutex<W>,
}

impl<W: Write> EmfWriter<W> {
    pub fn new(namespace: impl Into<String>, service: impl Into<String>, out: W) -> Self {
        EmfWriter { namespace: namespace.into(), service: service.into(), out: Mutex::new(out) }
    }

    /// The line for `metrics` (name, count) at `timestamp_ms`, without the newline.
    pub fn line(&self, timestamp_ms: u64, metrics: &[(&str, u64)]) -> String {
        let emf = Emf::new(&self.namespace).dimension("Service", &self.service);
        metrics.iter().fold(emf, |emf, (name, value)| emf.count(*name, *value)).to_line(timestamp_ms)
    }

    /// Writes the line in a single write, so it never interleaves with log lines.
    pub fn emit(&self, timestamp_ms: u64, metrics: &[(&str, u64)]) -> std::io::Result<()> {
        let mut line = self.line(timestamp_ms, metrics);
        line.push('\n');
        let mut out = self.out.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        out.write_all(line.as_bytes())?;
        out.flush()
    }

    pub fn into_inner(self) -> W {
        self.out.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    #[test]
    fn one_line_per_report_with_the_service_dimension() {
        let emf = EmfWriter::new("leaselock", "reconciler", Vec::new());
        emf.emit(1_700_000_000_000, &[("Orphans", 3), ("HintsSent", 3)]).unwrap();
        let text = String::from_utf8(emf.into_inner()).unwrap();
        assert!(text.ends_with('\n') && text.lines().count() == 1);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["_aws"]["Timestamp"], 1_700_000_000_000u64);
        let directive = &v["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], "leaselock");
        assert_eq!(directive["Dimensions"], json!([["Service"]]));
        assert_eq!(directive["Metrics"][1], json!({"Name": "HintsSent", "Unit": "Count"}));
        assert_eq!(v["Service"], "reconciler");
        assert_eq!((v["Orphans"].as_u64(), v["HintsSent"].as_u64()), (Some(3), Some(3)));
    }
}
