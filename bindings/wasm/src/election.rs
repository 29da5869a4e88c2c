//! Election for JavaScript: the candidate registry's protocol operations (stepped by
//! `lib/drive.js` like every lease operation) and the elector's decisions
//! (`leaselock::election::decide`), which `lib/election.js` follows: keys, retry pauses, slot
//! order, strategy picks, term boundaries, renewal schedule, minimum lease.

use std::collections::BTreeMap;

use leaselock::election::{decide, Candidate, ElectionOptions, Strategy, Timing};
use leaselock::protocol::{ListCandidates, RegisterCandidate, WithdrawCandidate};
use leaselock::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;

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
        named(name).map(|n| decide::leader_key(&self.options.key_prefix, n))
    }

    #[wasm_bindgen(js_name = groupKey)]
    pub fn group_key(&self, name: &str) -> std::result::Result<String, JsValue> {
        named(name).map(|n| decide::group_key(&self.options.key_prefix, n))
    }

    #[wasm_bindgen(js_name = candidatesKey)]
    pub fn candidates_key(&self, name: &str) -> std::result::Result<String, JsValue> {
        named(name).map(|n| decide::candidates_key(&self.options.key_prefix, n))
    }

    /// A jittered pause before the next claim attempt.
    #[wasm_bindgen(js_name = retryPauseMs)]
    pub fn retry_pause_ms(&self, random: f64) -> f64 {
        decide::retry_pause_ms(self.options.retry_delay.as_millis() as u64, random) as f64
    }

    /// Whether another attempt after `delay_ms` still starts before `wait_until_mono_ms`.
    #[wasm_bindgen(js_name = retryWithinWait)]
    pub fn retry_within_wait(&self, now_mono_ms: f64, delay_ms: f64, wait_until_mono_ms: f64) -> bool {
        decide::retry_within_wait(now_mono_ms as u64, delay_ms as u64, wait_until_mono_ms as u64)
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
        Ok(decide::slot_order(slots, random).into_iter().map(|i| leaselock::election::slot_id(key, i)).collect())
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

    /// The id the strategy picks among `candidates_json`, or undefined.
    pub fn pick(&self, strategy_json: &str, candidates_json: &str) -> std::result::Result<Option<String>, JsValue> {
        let s = strategy(strategy_json).map_err(|e| throw(&e))?;
        Ok(s.pick(&candidates(candidates_json)?).map(str::to_string))
    }

    /// Whether this elector may compete for the leader lease now.
    pub fn competes(&self, strategy_json: &str, candidates_json: &str) -> std::result::Result<bool, JsValue> {
        let s = strategy(strategy_json).map_err(|e| throw(&e))?;
        Ok(decide::competes(&s, &candidates(candidates_json)?, &self.owner))
    }

    /// Whether this leader steps down at a term boundary.
    #[wasm_bindgen(js_name = stepsDown)]
    pub fn steps_down(&self, strategy_json: &str, candidates_json: &str) -> std::result::Result<bool, JsValue> {
        let s = strategy(strategy_json).map_err(|e| throw(&e))?;
        Ok(decide::steps_down(&s, &candidates(candidates_json)?, &self.owner))
    }

    /// The keeper of a term claimed with `deadline_mono_ms`, the claim sent at `sent_mono_ms`:
    /// renewed a renew interval after the claim, as the Rust elector keeps one.
    pub fn keeper(&self, deadline_mono_ms: f64, sent_mono_ms: f64) -> crate::keeper::LeaseKeeper {
        let renew_ms = self.timing.renew_ms();
        crate::keeper::LeaseKeeper::from_claim(deadline_mono_ms as u64, sent_mono_ms as u64 + renew_ms, renew_ms)
    }

    #[wasm_bindgen(js_name = nextRenewAfterSuccess)]
    pub fn next_renew_after_success(&self, deadline_mono_ms: f64) -> f64 {
        decide::next_renew_after_success(deadline_mono_ms as u64, &self.timing) as f64
    }

    #[wasm_bindgen(js_name = claimStoreMs)]
    pub fn claim_store_ms(&self, claimed_expires_at_ms: f64) -> f64 {
        decide::claim_store_ms(claimed_expires_at_ms as u64, &self.timing) as f64
    }

    /// The minimum-lease decision: `{ step: "Release" | "RunOut" }` or `{ step: "WaitUntil", at }`.
    #[wasm_bindgen(js_name = minLease)]
    pub fn min_lease(
        &self,
        start_mono_ms: f64,
        now_mono_ms: f64,
        held_expires_at_ms: f64,
        start_store_ms: f64,
    ) -> String {
        text(decide::min_lease(
            start_mono_ms as u64,
            self.options.min_lease.as_millis() as u64,
            now_mono_ms as u64,
            held_expires_at_ms as u64,
            start_store_ms as u64,
        ))
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
