//! What the trace vectors of every machine share (the worker engine's, the elector's, the
//! holder's): where a replay parted from its trace; and for the machines driven by inputs and the
//! time whose outputs are recorded as JSON (the elector, the holder), the replay of a run and its
//! recording, generic over the machine and its step type.

use serde_json::Value;

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

/// A machine whose runs are trace vectors: inputs and the time go in (monotonic ms), outputs
/// come out.
pub trait Machine {
    type Input: serde::Serialize + serde::de::DeserializeOwned;
    type Output: serde::Serialize;
    fn handle(&mut self, input: Self::Input, now_mono_ms: u64);
    fn handle_timeout(&mut self, now_mono_ms: u64);
    fn poll_output(&mut self) -> Option<Self::Output>;
}

/// One step of a run of machine `M`: at `at`, `input` (none: only the time) and what came out.
pub trait Step<M>: Sized {
    fn at(&self) -> u64;
    fn input(&self) -> Option<&Value>;
    fn expect(&self) -> &[Value];
    /// The step `machine` just took: `input` in at `at`, `expect` out (a step type may record
    /// more of the machine's state after it).
    fn took(machine: &M, at: u64, input: Option<Value>, expect: Vec<Value>) -> Self;
    /// What a replay compares: what came out, and whatever else the step records.
    fn shown(&self) -> Vec<Value> {
        self.expect().to_vec()
    }
}

/// Everything `machine` has emitted, as JSON.
pub fn drain<M: Machine>(machine: &mut M) -> Vec<Value> {
    std::iter::from_fn(|| machine.poll_output())
        .map(|o| serde_json::to_value(&o).expect("outputs are plain data"))
        .collect()
}

/// Replays a run on `machine`, just created: what it emits as it is created must be
/// `start_expect`, then each step must show what the trace's does; the first that does not is
/// the error.
pub fn replay<M: Machine, S: Step<M>>(
    mut machine: M,
    start_expect: &[Value],
    steps: &[S],
) -> Result<(), Mismatch<Value>> {
    let got = drain(&mut machine);
    if got != start_expect {
        return Err(Mismatch { step: 0, expected: start_expect.to_vec(), got });
    }
    for (i, step) in steps.iter().enumerate() {
        match step.input() {
            Some(input) => match serde_json::from_value::<M::Input>(input.clone()) {
                Ok(input) => machine.handle(input, step.at()),
                Err(e) => {
                    let got = vec![Value::String(format!("unreadable input: {e}"))];
                    return Err(Mismatch { step: i + 1, expected: step.expect().to_vec(), got });
                }
            },
            None => machine.handle_timeout(step.at()),
        }
        let outputs = drain(&mut machine);
        let (expected, got) = (step.shown(), S::took(&machine, step.at(), None, outputs).shown());
        if got != expected {
            return Err(Mismatch { step: i + 1, expected, got });
        }
    }
    Ok(())
}

/// A run recorded while it drives its machine: what the machine emitted as it was created, then
/// its steps.
#[derive(Debug)]
pub struct Run<M, S> {
    machine: M,
    start_expect: Vec<Value>,
    steps: Vec<S>,
}

impl<M: Machine, S: Step<M>> Run<M, S> {
    /// Records `machine`, just created.
    pub fn new(mut machine: M) -> Self {
        let start_expect = drain(&mut machine);
        Self { machine, start_expect, steps: Vec::new() }
    }

    /// What the machine emitted so far: at its creation, or in the last step.
    pub fn last(&self) -> &[Value] {
        self.steps.last().map_or(&self.start_expect, |s| s.expect())
    }

    pub fn machine(&self) -> &M {
        &self.machine
    }

    /// `input` at `at` (`None`: the time only); returns what came out.
    pub fn step(&mut self, at: u64, input: Option<M::Input>) -> &[Value] {
        let recorded = input.as_ref().map(|i| serde_json::to_value(i).expect("inputs are plain data"));
        match input {
            Some(input) => self.machine.handle(input, at),
            None => self.machine.handle_timeout(at),
        }
        let expect = drain(&mut self.machine);
        self.steps.push(S::took(&self.machine, at, recorded, expect));
        self.last()
    }

    /// What the machine emitted as it was created, and the steps.
    pub fn finish(self) -> (Vec<Value>, Vec<S>) {
        (self.start_expect, self.steps)
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
