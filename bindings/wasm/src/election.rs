//! Election for JavaScript: the candidate registry's protocol operations (stepped by
//! `lib/drive.js` like every lease operation), the elector's option checks, keys, slot order and
//! strategy picks, and the election machine of a call (`leaselock::election::machine`:
//! `ElectorMachine`), which `lib/election.js` drives: claim attempts, retry pauses, heartbeats,
//! renewals, term boundaries, the minimum lease, the release and the withdrawal are its.

use std::collections::BTreeMap;

use leaselock::election::machine::{Elector, Input, Race, Reply, Setup};
use leaselock::election::{rules, Candidate, ElectionOptions, Strategy, Timing};
use leaselock::protocol::{ListCandidates, RegisterCandidate, WithdrawCandidate};
use leaselock::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;

use crate::lease::JsLease;
use crate::protocol::{IntoJs, Op};
use crate::{parse, text, throw, Table};

/// A candidate as JavaScript sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsCandidate {
    #[serde(default)]
    id: String,
    #[serde(default)]
    score: f64,
    #[serde(default)]
    load: f64,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    expires_at_ms: u64,
}

impl From<JsCandidate> for Candidate {
    fn from(c: JsCandidate) -> Self {
        Candidate { id: c.id, score: c.score, load: c.load, metadata: c.metadata, expires_at_ms: c.expires_at_ms }
    }
}

impl From<Candidate> for JsCandidate {
    fn from(c: Candidate) -> Self {
        JsCandidate { id: c.id, score: c.score, load: c.load, metadata: c.metadata, expires_at_ms: c.expires_at_ms }
    }
}

impl IntoJs for Vec<Candidate> {
    fn into_js(self) -> Value {
        json!(self.into_iter().map(JsCandidate::from).collect::<Vec<_>>())
    }
}

fn candidates(json: &str) -> std::result::Result<Vec<Candidate>, JsValue> {
    Ok(parse::<Vec<JsCandidate>>("candidates", json)?.into_iter().map(Candidate::from).collect())
}

/// `"HighestScore"`, `"LeastLoaded"` or `{ "preferredNode": id }`.
fn strategy(json: &str) -> Result<Strategy> {
    let bad = || Error::invalid("strategy", "must be 'HighestScore', 'LeastLoaded' or { preferredNode: id }");
    match serde_json::from_str::<Value>(json).map_err(|_| bad())? {
        Value::String(s) if s == "HighestScore" => Ok(Strategy::HighestScore),
        Value::String(s) if s == "LeastLoaded" => Ok(Strategy::LeastLoaded),
        Value::Object(o) => match o.get("preferredNode") {
            Some(Value::String(id)) => {
                leaselock::config::validate_id("strategy.preferredNode", id)?;
                Ok(Strategy::PreferredNode(id.clone()))
            }
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// The candidate registry's operations on this table.
#[wasm_bindgen]
impl Table {
    /// Registers or refreshes `candidate_json` (`{ id, score, load, metadata }`) in `election`
    /// for `ttl_ms`.
    #[wasm_bindgen(js_name = registerCandidate)]
    pub fn register_candidate(
        &self,
        election: &str,
        candidate_json: &str,
        ttl_ms: f64,
    ) -> std::result::Result<Op, JsValue> {
        let candidate = Candidate::from(parse::<JsCandidate>("candidate", candidate_json)?);
        RegisterCandidate::new(&self.config, election, &candidate, ttl_ms as u64).map(Op::new).map_err(|e| throw(&e))
    }

    #[wasm_bindgen(js_name = withdrawCandidate)]
    pub fn withdraw_candidate(&self, election: &str, candidate_id: &str) -> std::result::Result<Op, JsValue> {
        WithdrawCandidate::new(&self.config, election, candidate_id).map(Op::new).map_err(|e| throw(&e))
    }

    /// The live candidates of `election`; long-expired ones are pruned on the way.
    #[wasm_bindgen(js_name = listCandidates)]
    pub fn list_candidates(&self, election: &str) -> std::result::Result<Op, JsValue> {
        ListCandidates::new(&self.config, election).map(Op::new).map_err(|e| throw(&e))
    }
}

/// `new LeaderElector(...)`'s options, parsed (camelCase, milliseconds); each error names the
/// option the caller wrote.
struct Options {
    owner: String,
    options: ElectionOptions,
}

const OPTIONS: &[&str] = &["owner", "waitMs", "minLeaseMs", "keyPrefix", "retryDelayMs", "termMs", "candidateTtlMs"];

fn options(json: &str) -> Result<Options> {
    use crate::config::{known_keys, millis, object, string};
    let map = object("options", serde_json::from_str(json).map_err(|e| Error::invalid("options", e))?)?;
    known_keys(&map, "", OPTIONS)?;
    let owner = string(&map, "owner")?.ok_or_else(|| Error::invalid("owner", "required"))?;
    let d = ElectionOptions::default();
    let options = ElectionOptions {
        wait: millis(&map, "waitMs")?.unwrap_or(d.wait),
        min_lease: millis(&map, "minLeaseMs")?.unwrap_or(d.min_lease),
        key_prefix: string(&map, "keyPrefix")?.unwrap_or_default(),
        retry_delay: millis(&map, "retryDelayMs")?.unwrap_or(d.retry_delay),
        term: millis(&map, "termMs")?,
        candidate_ttl: millis(&map, "candidateTtlMs")?,
    };
    Ok(Options { owner, options })
}

/// An elector's validated options and the decisions it follows.
#[wasm_bindgen]
pub struct ElectionRules {
    owner: String,
    options: ElectionOptions,
    timing: Timing,
}

#[wasm_bindgen]
impl ElectionRules {
    /// Validates `new LeaderElector(...)`'s options (JSON) for claims on `table`.
    #[wasm_bindgen(constructor)]
    pub fn new(options_json: &str, table: &Table) -> std::result::Result<ElectionRules, JsValue> {
        let o = options(options_json).map_err(|e| throw(&e))?;
        let options = o.options;
        options.validate(&o.owner).map_err(|e| throw(&e))?;
        let c = &table.config;
        let timing = Timing { lease: c.lease_duration, renew: c.renew_interval, skew: c.clock_skew };
        Ok(ElectionRules { owner: o.owner, options, timing })
    }

    #[wasm_bindgen(getter)]
    pub fn owner(&self) -> String {
        self.owner.clone()
    }

    #[wasm_bindgen(getter, js_name = waitMs)]
    pub fn wait_ms(&self) -> f64 {
        self.options.wait.as_millis() as f64
    }

    #[wasm_bindgen(getter, js_name = minLeaseMs)]
    pub fn min_lease_ms(&self) -> f64 {
        self.options.min_lease.as_millis() as f64
    }

    /// A strategic leader's term (the lease, unless set).
    #[wasm_bindgen(getter, js_name = termMs)]
    pub fn term_ms(&self) -> f64 {
        self.options.term.unwrap_or(self.timing.lease).as_millis() as f64
    }

    /// How long a registration lasts without a refresh (the lease, unless set).
    #[wasm_bindgen(getter, js_name = candidateTtlMs)]
    pub fn candidate_ttl_ms(&self) -> f64 {
        self.options.candidate_ttl.unwrap_or(self.timing.lease).as_millis() as f64
    }

    /// `{prefix}leader/{name}`; throws InvalidInput (field `name`) for a bad name.
    #[wasm_bindgen(js_name = leaderKey)]
    pub fn leader_key(&self, name: &str) -> std::result::Result<String, JsValue> {
        named(name).map(|n| rules::leader_key(&self.options.key_prefix, n))
    }

    #[wasm_bindgen(js_name = groupKey)]
    pub fn group_key(&self, name: &str) -> std::result::Result<String, JsValue> {
        named(name).map(|n| rules::group_key(&self.options.key_prefix, n))
    }

    #[wasm_bindgen(js_name = candidatesKey)]
    pub fn candidates_key(&self, name: &str) -> std::result::Result<String, JsValue> {
        named(name).map(|n| rules::candidates_key(&self.options.key_prefix, n))
    }

    /// The slot lease ids of the group `key` in the order to try them; throws for 0 slots.
    #[wasm_bindgen(js_name = slotOrder)]
    pub fn slot_order(&self, key: &str, slots: JsValue, random: f64) -> std::result::Result<Vec<String>, JsValue> {
        // A number only: "2", true or [2] are refused, not coerced.
        let whole = slots.as_f64().filter(|n| n.fract() == 0.0 && *n >= 0.0 && *n <= u64::MAX as f64);
        let Some(n) = whole else {
            return Err(throw(&Error::invalid("slots", "must be a whole number")));
        };
        let slots = leaselock::election::slots_from(n as u64).map_err(|e| throw(&e))?;
        Ok(rules::slot_order(slots, random).into_iter().map(|i| leaselock::election::slot_id(key, i)).collect())
    }

    /// Checks a strategy (JSON); throws InvalidInput (field `strategy`).
    #[wasm_bindgen(js_name = checkStrategy)]
    pub fn check_strategy(&self, strategy_json: &str) -> std::result::Result<(), JsValue> {
        strategy(strategy_json).map(|_| ()).map_err(|e| throw(&e))
    }

    /// Checks a candidate (`{ score, load, metadata }`) and returns it as registered: with this
    /// elector's owner as its id.
    #[wasm_bindgen(js_name = candidate)]
    pub fn candidate(&self, candidate_json: &str) -> std::result::Result<String, JsValue> {
        let c = JsCandidate { id: self.owner.clone(), ..parse::<JsCandidate>("candidate", candidate_json)? };
        Candidate::from(c.clone()).validate().map_err(|e| throw(&e))?;
        Ok(text(c))
    }

    /// The machine of a `runIfLeader` call on the lease `key`, started at `now_mono_ms`.
    #[wasm_bindgen(js_name = leaderMachine)]
    pub fn leader_machine(&self, key: &str, seed: f64, now_mono_ms: f64) -> ElectorMachine {
        self.machine(Race::Leader { key: key.to_string() }, seed, now_mono_ms)
    }

    /// The machine of a `runIfSlot` call on the group `key` of `slots` slots (checked by
    /// `slotOrder` first).
    #[wasm_bindgen(js_name = slotMachine)]
    pub fn slot_machine(&self, key: &str, slots: u32, seed: f64, now_mono_ms: f64) -> ElectorMachine {
        self.machine(Race::Slot { key: key.to_string(), slots }, seed, now_mono_ms)
    }

    /// The machine of a `runIfElected` call for the lease `key` under `strategy_json`.
    #[wasm_bindgen(js_name = electedMachine)]
    pub fn elected_machine(
        &self,
        key: &str,
        strategy_json: &str,
        seed: f64,
        now_mono_ms: f64,
    ) -> std::result::Result<ElectorMachine, JsValue> {
        let strategy = strategy(strategy_json).map_err(|e| throw(&e))?;
        let term_ms = self.term_ms() as u64;
        let heartbeat_ms = self.candidate_ttl_ms() as u64 / 3;
        let race = Race::Elected { key: key.to_string(), strategy, term_ms, heartbeat_ms };
        Ok(self.machine(race, seed, now_mono_ms))
    }

    fn machine(&self, race: Race, seed: f64, now_mono_ms: f64) -> ElectorMachine {
        let setup = Setup {
            owner: self.owner.clone(),
            race,
            lease_ms: self.timing.lease_ms(),
            renew_ms: self.timing.renew_ms(),
            skew_ms: self.timing.skew_ms(),
            wait_ms: self.options.wait.as_millis() as u64,
            retry_delay_ms: self.options.retry_delay.as_millis() as u64,
            min_lease_ms: self.options.min_lease.as_millis() as u64,
        };
        ElectorMachine { machine: Elector::new(setup, seed as u64, mono(now_mono_ms)) }
    }
}

fn mono(ms: f64) -> u64 {
    ms.max(0.0) as u64
}

/// One election call's machine (`leaselock::election::machine::Elector`). Outputs come out as
/// JSON text (`pollOutput`: `{ output: "send", id, request, until_mono_ms }`, `elected`,
/// `renewed`, `term_over` with its `reason`, `done` with how the call `ended`); answers go in by
/// kind. The trace runner (`tests/elector_traces.test.mjs`) makes it as the elector does and
/// feeds a trace's inputs through the same methods (no JSON reader of the inputs in the wasm).
#[wasm_bindgen]
pub struct ElectorMachine {
    machine: Elector,
}

#[wasm_bindgen]
impl ElectorMachine {
    /// Request `id` is done (a registration, a release, a withdrawal).
    pub fn answered(&mut self, id: f64, now_mono_ms: f64) {
        self.answer(id, Ok(Reply::Done), now_mono_ms);
    }

    /// Request `id` (a claim or a renewal) answered with the lease (`Lease.toJSON()`).
    #[wasm_bindgen(js_name = answeredLease)]
    pub fn answered_lease(&mut self, id: f64, lease_json: &str, now_mono_ms: f64) -> std::result::Result<(), JsValue> {
        let lease = parse::<JsLease>("lease", lease_json)?;
        self.answer(id, Ok(Reply::Lease(lease.into())), now_mono_ms);
        Ok(())
    }

    /// Request `id` (a listing) answered with the candidates (JSON, as `listCandidates` gives).
    #[wasm_bindgen(js_name = answeredCandidates)]
    pub fn answered_candidates(
        &mut self,
        id: f64,
        candidates_json: &str,
        now_mono_ms: f64,
    ) -> std::result::Result<(), JsValue> {
        let listed = candidates(candidates_json)?;
        self.answer(id, Ok(Reply::Candidates(listed)), now_mono_ms);
        Ok(())
    }

    /// Request `id` failed with `error_json` (`{ kind, ... }`: `lib/errors.js` `toRust`, and
    /// the `owner` of a `Held`).
    pub fn failed(&mut self, id: f64, error_json: &str, now_mono_ms: f64) -> std::result::Result<(), JsValue> {
        let error = crate::error::from_json(&parse::<Value>("error", error_json)?);
        self.answer(id, Err(error), now_mono_ms);
        Ok(())
    }

    /// The action returned.
    pub fn finished(&mut self, now_mono_ms: f64) {
        self.machine.handle(Input::Finished, mono(now_mono_ms));
    }

    /// The caller's signal aborted.
    pub fn abort(&mut self, now_mono_ms: f64) {
        self.machine.handle(Input::Abort, mono(now_mono_ms));
    }

    #[wasm_bindgen(js_name = handleTimeout)]
    pub fn handle_timeout(&mut self, now_mono_ms: f64) {
        self.machine.handle_timeout(mono(now_mono_ms));
    }

    /// The next output as JSON, or undefined.
    #[wasm_bindgen(js_name = pollOutput)]
    pub fn poll_output(&mut self) -> Option<String> {
        self.machine.poll_output().map(text)
    }

    /// When (monotonic ms) `handleTimeout` is due next, or undefined.
    #[wasm_bindgen(js_name = pollTimeout)]
    pub fn poll_timeout(&self) -> Option<f64> {
        self.machine.poll_timeout().map(|at| at as f64)
    }

    fn answer(&mut self, id: f64, result: Result<Reply>, now_mono_ms: f64) {
        self.machine.handle(Input::Answer { id: id as u64, result }, mono(now_mono_ms));
    }
}

fn named(name: &str) -> std::result::Result<&str, JsValue> {
    leaselock::config::validate_id("name", name).map_err(|e| throw(&e))?;
    Ok(name)
}

/// The slot number of a slot lease id, or undefined.
#[wasm_bindgen(js_name = slotOf)]
pub fn slot_of(id: &str) -> Option<u32> {
    leaselock::election::slot_of(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_parse_from_javascript_values() {
        assert_eq!(strategy(r#""HighestScore""#).unwrap(), Strategy::HighestScore);
        assert_eq!(strategy(r#""LeastLoaded""#).unwrap(), Strategy::LeastLoaded);
        assert_eq!(strategy(r#"{"preferredNode":"n1"}"#).unwrap(), Strategy::PreferredNode("n1".into()));
        for bad in [r#""Best""#, "{}", "7", "nope"] {
            assert!(
                matches!(strategy(bad), Err(Error::InvalidInput { ref field, .. }) if field == "strategy"),
                "{bad}"
            );
        }
    }

    #[test]
    fn candidates_cross_as_camel_case() {
        let c = Candidate::new("a", 2.5).load(0.5).meta("zone", "z");
        let js = json!(vec![c.clone()].into_js());
        assert_eq!(js[0]["expiresAtMs"], 0);
        let back = candidates(&js.to_string()).unwrap();
        assert_eq!(back, vec![c]);
    }
}
