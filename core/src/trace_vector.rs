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

/// The replay test of a machine's vectors in `dir`: with `LEASELOCK_RECORD_TRACES` set, the
/// `recorded` traces are written there first (as `{name}.json`); then every vector there must
/// replay (at least as many as were recorded) and every one in `dir/broken` must not (at least
/// one).
#[cfg(test)]
pub(crate) fn replay_vectors<T, M>(
    dir: &std::path::Path,
    recorded: &[T],
    name: impl Fn(&T) -> &str,
    replay: impl Fn(&T) -> Result<(), Mismatch<M>>,
) where
    T: serde::Serialize + serde::de::DeserializeOwned,
    M: serde::Serialize,
{
    let read = |path: &std::path::Path| -> T { serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap() };
    if std::env::var_os("LEASELOCK_RECORD_TRACES").is_some() {
        std::fs::create_dir_all(dir.join("broken")).unwrap();
        for t in recorded {
            let path = dir.join(format!("{}.json", name(t)));
            std::fs::write(&path, serde_json::to_string_pretty(t).unwrap() + "\n").unwrap();
        }
    }
    let mut replayed = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            if let Err(m) = replay(&read(&path)) {
                panic!("{}: {m}", path.display());
            }
            replayed += 1;
        }
    }
    assert!(replayed >= recorded.len(), "{replayed} vectors in {}", dir.display());
    let mut broken = 0;
    for entry in std::fs::read_dir(dir.join("broken")).unwrap() {
        let path = entry.unwrap().path();
        assert!(replay(&read(&path)).is_err(), "{} replayed although broken", path.display());
        broken += 1;
    }
    assert!(broken >= 1);
}
