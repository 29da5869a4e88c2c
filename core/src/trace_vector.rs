//! What the trace vectors of every machine share (the worker engine's, the elector's, the
//! holder's): where a replay parted from its trace.

/// Where a replay parted from its trace: the step (0: the machine's creation, then 1-based),
/// what the trace says comes out there, and what came out.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch<T> {
    pub step: usize,
    pub expected: Vec<T>,
    pub got: Vec<T>,
}

impl<T: serde::Serialize> std::fmt::Display for Mismatch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let json = |v: &[T]| serde_json::to_string(v).unwrap_or_default();
        write!(f, "step {}: expected {} got {}", self.step, json(&self.expected), json(&self.got))
    }
}
