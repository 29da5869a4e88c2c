//! CloudWatch embedded metric format (EMF): one JSON line per report, printed to a log stream,
//! so metrics cost no API calls (the format Powertools writes).

use serde_json::{json, Map, Value};

/// The namespace every leaselock metric is published under.
pub const NAMESPACE: &str = "leaselock";

/// EMF allows at most 100 values for one metric in one line.
pub const MAX_VALUES: usize = 100;

/// CloudWatch units used by leaselock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Count,
    Milliseconds,
}

impl Unit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Count => "Count",
            Unit::Milliseconds => "Milliseconds",
        }
    }
}

/// One EMF record: a namespace, dimensions and the metrics measured under them. The metrics are
/// published under every leading run of the dimensions (`[Service]`, `[Service, WorkerId]`, ...),
/// so dashboards and scaling policies can read the fleet-wide roll-up as well as each worker.
///
/// ```
/// use leaselock::metrics::Emf;
///
/// let line = Emf::new("leaselock")
///     .dimension("Service", "worker")
///     .count("Acquired", 3)
///     .milliseconds("RenewLatency", &[12, 7, 30])
///     .to_line(1_700_000_000_000);
/// let v: serde_json::Value = serde_json::from_str(&line).unwrap();
/// assert_eq!(v["Acquired"], 3);
/// assert_eq!(v["RenewLatency"], serde_json::json!([7, 12, 30]));
/// assert_eq!(v["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0][0], "Service");
/// ```
#[derive(Debug, Clone)]
pub struct Emf {
    namespace: String,
    dimensions: Vec<(String, String)>,
    metrics: Vec<(String, Unit, Value)>,
}

impl Emf {
    pub fn new(namespace: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), dimensions: Vec::new(), metrics: Vec::new() }
    }

    pub fn dimension(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.dimensions.push((name.into(), value.into()));
        self
    }

    pub fn count(mut self, name: impl Into<String>, value: u64) -> Self {
        self.metrics.push((name.into(), Unit::Count, json!(value)));
        self
    }

    /// A distribution in milliseconds, sorted and reduced to at most [`MAX_VALUES`] quantiles.
    /// An empty set of samples is left out (EMF has no way to say "no samples").
    pub fn milliseconds(mut self, name: impl Into<String>, samples: &[u64]) -> Self {
        if !samples.is_empty() {
            let mut sorted = samples.to_vec();
            sorted.sort_unstable();
            self.metrics.push((name.into(), Unit::Milliseconds, json!(downsample(&sorted, MAX_VALUES))));
        }
        self
    }

    /// One value in milliseconds, which may be negative (an offset between two clocks).
    pub fn millisecond_value(mut self, name: impl Into<String>, value: i64) -> Self {
        self.metrics.push((name.into(), Unit::Milliseconds, json!(value)));
        self
    }

    /// The record as one line of JSON (no trailing newline).
    pub fn to_line(&self, timestamp_ms: u64) -> String {
        let mut root = Map::new();
        let definitions: Vec<Value> =
            self.metrics.iter().map(|(name, unit, _)| json!({"Name": name, "Unit": unit.as_str()})).collect();
        let names: Vec<&str> = self.dimensions.iter().map(|(k, _)| k.as_str()).collect();
        let dimension_sets: Vec<&[&str]> = (1..=names.len()).map(|n| &names[..n]).collect();
        root.insert(
            "_aws".into(),
            json!({
                "Timestamp": timestamp_ms,
                "CloudWatchMetrics": [{
                    "Namespace": self.namespace,
                    "Dimensions": dimension_sets,
                    "Metrics": definitions,
                }],
            }),
        );
        for (name, value) in &self.dimensions {
            root.insert(name.clone(), json!(value));
        }
        for (name, _, value) in &self.metrics {
            root.insert(name.clone(), value.clone());
        }
        Value::Object(root).to_string()
    }
}

/// At most `max` values that keep the shape of a sorted distribution: evenly spaced quantiles,
/// always including the minimum and the maximum.
pub fn downsample(sorted: &[u64], max: usize) -> Vec<u64> {
    if sorted.len() <= max {
        return sorted.to_vec();
    }
    let last = sorted.len() - 1;
    match max {
        0 => Vec::new(),
        1 => vec![sorted[last]],
        _ => (0..max).map(|i| sorted[(i * last + (max - 1) / 2) / (max - 1)]).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_has_the_emf_shape() {
        let line = Emf::new(NAMESPACE)
            .dimension("Service", "worker")
            .dimension("WorkerId", "w1")
            .count("ActiveConnections", 5)
            .milliseconds("RenewLatency", &[])
            .to_line(42);
        let v: Value = serde_json::from_str(&line).unwrap();
        assert!(!line.contains('\n'));
        let meta = &v["_aws"];
        assert_eq!(meta["Timestamp"], 42);
        let cw = &meta["CloudWatchMetrics"][0];
        assert_eq!(cw["Namespace"], "leaselock");
        assert_eq!(cw["Dimensions"], json!([["Service"], ["Service", "WorkerId"]]));
        assert_eq!(cw["Metrics"], json!([{"Name": "ActiveConnections", "Unit": "Count"}]));
        assert_eq!((v["Service"].as_str(), v["WorkerId"].as_str()), (Some("worker"), Some("w1")));
        assert_eq!(v["ActiveConnections"], 5);
        assert!(v.get("RenewLatency").is_none(), "no samples, no metric");
    }

    #[test]
    fn downsample_keeps_min_max_and_size() {
        let values: Vec<u64> = (0..1000).collect();
        let d = downsample(&values, MAX_VALUES);
        assert_eq!(d.len(), MAX_VALUES);
        assert_eq!((d[0], d[99]), (0, 999));
        assert!(d.windows(2).all(|w| w[0] <= w[1]));
        // The median stays near the median.
        assert!((490..=510).contains(&d[50]), "{}", d[50]);
        assert_eq!(downsample(&[1, 2, 3], MAX_VALUES), vec![1, 2, 3]);
        assert!(downsample(&[], MAX_VALUES).is_empty());
    }

    #[test]
    fn many_samples_are_reduced_to_the_emf_limit() {
        let samples: Vec<u64> = (0..250).rev().collect();
        let v: Value = serde_json::from_str(&Emf::new("n").milliseconds("L", &samples).to_line(0)).unwrap();
        let values = v["L"].as_array().unwrap();
        assert_eq!(values.len(), MAX_VALUES);
        assert_eq!((values[0].as_u64(), values[99].as_u64()), (Some(0), Some(249)));
        assert_eq!(v["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Unit"], "Milliseconds");
    }
}
