//! The candidate registry of strategic elections on DynamoDB, as protocol operations: one item
//! per election (`{prefix}candidates/{name}`, the elector's key) holding a map of candidates
//! (score, load, metadata, expiry), so listing is one consistent GetItem and a heartbeat one
//! UpdateItem. The item has no desired state: it is never in the orphan index.
//!
//! Listing also prunes: entries that ran out more than a lease ago are removed, under a condition
//! on each removed entry's expiry, so a candidate that registered again in between keeps its
//! fresh entry.
//!
//! [`Candidate`], what every election backend registers and lists, and the liveness of a
//! registration ([`is_live`], [`is_prunable`]) are defined here, with the registry's requests.

use std::collections::BTreeMap;

use super::ops::consistent_get;
use super::request::{Request, UpdateItem};
use super::value::{key, n, s, AttributeValue, Item};
use super::{read_answer, triage, Budget, Cause, Input, Operation, Step, Triage};
use crate::config::validate_id;
use crate::{Error, TableConfig};

/// A candidate of a strategic election, as registered (and as listed, with its expiry).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Candidate {
    /// The candidate's owner id (what it claims the leader lease as).
    pub id: String,
    /// Higher is better for the `HighestScore` strategy.
    pub score: f64,
    /// Lower is better for the `LeastLoaded` strategy.
    pub load: f64,
    pub metadata: BTreeMap<String, String>,
    /// When the registration runs out (the backend's clock, epoch ms); set by the backend.
    #[serde(default)]
    pub expires_at_ms: u64,
}

impl Candidate {
    pub fn new(id: impl Into<String>, score: f64) -> Self {
        Self { id: id.into(), score, load: 0.0, metadata: BTreeMap::new(), expires_at_ms: 0 }
    }

    pub fn load(mut self, load: f64) -> Self {
        self.load = load;
        self
    }

    pub fn meta(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }
}

/// Whether a registration expiring at `expires_at_ms` still counts at `now_ms`.
pub fn is_live(expires_at_ms: u64, now_ms: u64) -> bool {
    expires_at_ms > now_ms
}

/// Whether a registration expiring at `expires_at_ms` has been dead so long (`grace_ms`) that it
/// may be deleted: no reader, whatever its clock skew, still counts it.
pub fn is_prunable(expires_at_ms: u64, now_ms: u64, grace_ms: u64) -> bool {
    expires_at_ms.saturating_add(grace_ms) < now_ms
}

/// The attribute of a registry item holding the candidates.
pub const CANDIDATES_ATTRIBUTE: &str = "candidates";

/// At most this many expired entries are removed by one listing (the rest by the next ones).
pub const PRUNE_MAX: usize = 25;

/// How many times a registration goes round refresh / create when other writers keep
/// creating and removing the map under it.
const REGISTER_ROUNDS: u32 = 3;

/// A candidate's entry in the map.
pub fn candidate_entry(candidate: &Candidate, expires_at_ms: u64) -> AttributeValue {
    let meta: Item = candidate.metadata.iter().map(|(k, v)| (k.clone(), s(v))).collect();
    AttributeValue::M(Item::from([
        ("score".to_string(), AttributeValue::N(candidate.score.to_string())),
        ("load".to_string(), AttributeValue::N(candidate.load.to_string())),
        ("meta".to_string(), AttributeValue::M(meta)),
        ("exp".to_string(), n(expires_at_ms)),
    ]))
}

/// Every candidate of a registry item (live or not), sorted by id.
pub fn parse_candidates(item: &Item) -> Vec<Candidate> {
    let Some(AttributeValue::M(map)) = item.get(CANDIDATES_ATTRIBUTE) else { return Vec::new() };
    let num = |e: &Item, f: &str| e.get(f).and_then(AttributeValue::as_n).and_then(|n| n.parse::<f64>().ok());
    let mut out: Vec<Candidate> = map
        .iter()
        .filter_map(|(id, e)| {
            let AttributeValue::M(e) = e else { return None };
            let metadata = match e.get("meta") {
                Some(AttributeValue::M(m)) => {
                    m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_s()?.to_string()))).collect()
                }
                _ => Default::default(),
            };
            Some(Candidate {
                id: id.clone(),
                score: num(e, "score")?,
                load: num(e, "load").unwrap_or(0.0),
                metadata,
                expires_at_ms: num(e, "exp")?.max(0.0) as u64,
            })
        })
        .collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

/// An UpdateItem of the registry item of `election`, with no return values.
fn registry_update(
    config: &TableConfig,
    election: &str,
    update: String,
    condition: String,
    names: Vec<(String, String)>,
    values: Item,
) -> UpdateItem {
    UpdateItem {
        table_name: config.table_name.clone(),
        key: key(config, election),
        update_expression: update,
        condition_expression: Some(condition),
        expression_attribute_names: names.into_iter().collect(),
        expression_attribute_values: values,
        return_values: None,
        return_values_on_condition_check_failure: None,
    }
}

/// Sets one entry of an existing map (the heartbeat).
pub fn refresh_request(config: &TableConfig, election: &str, candidate: &Candidate, expires_at_ms: u64) -> UpdateItem {
    registry_update(
        config,
        election,
        "SET #c.#id = :entry".into(),
        "attribute_exists(#c)".into(),
        vec![("#c".into(), CANDIDATES_ATTRIBUTE.into()), ("#id".into(), candidate.id.clone())],
        Item::from([(":entry".to_string(), candidate_entry(candidate, expires_at_ms))]),
    )
}

/// Creates the map with its first entry (when the refresh found no map).
pub fn create_request(config: &TableConfig, election: &str, candidate: &Candidate, expires_at_ms: u64) -> UpdateItem {
    let map = AttributeValue::M(Item::from([(candidate.id.clone(), candidate_entry(candidate, expires_at_ms))]));
    registry_update(
        config,
        election,
        "SET #c = :map".into(),
        "attribute_not_exists(#c)".into(),
        vec![("#c".into(), CANDIDATES_ATTRIBUTE.into())],
        Item::from([(":map".to_string(), map)]),
    )
}

/// Removes one entry (its condition fails harmlessly when there is no map).
pub fn withdraw_request(config: &TableConfig, election: &str, candidate_id: &str) -> UpdateItem {
    registry_update(
        config,
        election,
        "REMOVE #c.#id".into(),
        "attribute_exists(#c)".into(),
        vec![("#c".into(), CANDIDATES_ATTRIBUTE.into()), ("#id".into(), candidate_id.into())],
        Item::new(),
    )
}

/// Removes the expired entries `stale` (id, expiry as read), each only while its expiry is still
/// the one read: a candidate that registered again meanwhile keeps its new entry.
pub fn prune_request(config: &TableConfig, election: &str, stale: &[(String, u64)]) -> UpdateItem {
    let mut names = vec![("#c".to_string(), CANDIDATES_ATTRIBUTE.to_string()), ("#exp".into(), "exp".into())];
    let mut values = Item::new();
    let (mut paths, mut checks) = (Vec::new(), Vec::new());
    for (i, (id, exp)) in stale.iter().enumerate() {
        names.push((format!("#p{i}"), id.clone()));
        values.insert(format!(":e{i}"), n(*exp));
        paths.push(format!("#c.#p{i}"));
        checks.push(format!("#c.#p{i}.#exp = :e{i}"));
    }
    registry_update(config, election, format!("REMOVE {}", paths.join(", ")), checks.join(" AND "), names, values)
}

/// Which write a registration sends next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    Refresh,
    Create,
}

/// Registers or refreshes a candidate for `ttl_ms` from the first send: sets its entry in the
/// map, creating the map when there is none. Both writes are idempotent, so an ambiguous attempt
/// is simply sent again.
#[derive(Debug, Clone)]
pub struct RegisterCandidate {
    config: TableConfig,
    election: String,
    candidate: Candidate,
    ttl_ms: u64,
    expires_at_ms: Option<u64>,
    write: Write,
    rounds: u32,
    budget: Budget,
}

impl RegisterCandidate {
    pub fn new(config: &TableConfig, election: &str, candidate: &Candidate, ttl_ms: u64) -> crate::Result<Self> {
        validate_id("election", election)?;
        candidate.validate()?;
        if ttl_ms == 0 {
            return Err(Error::invalid("candidate_ttl", "must be greater than zero"));
        }
        Ok(Self {
            config: config.clone(),
            election: election.into(),
            candidate: candidate.clone(),
            ttl_ms,
            expires_at_ms: None,
            write: Write::Refresh,
            rounds: 0,
            budget: Budget::operation(config),
        })
    }

    fn send(&mut self, input: &Input) -> Step<()> {
        let exp = *self.expires_at_ms.get_or_insert(input.now_ms + self.ttl_ms);
        let (config, election, candidate) = (&self.config, self.election.as_str(), &self.candidate);
        let request = match self.write {
            Write::Refresh => refresh_request(config, election, candidate, exp),
            Write::Create => create_request(config, election, candidate, exp),
        };
        self.budget.send(input.mono_ms, Request::UpdateItem(request))
    }
}

impl Operation for RegisterCandidate {
    type Output = ();
    fn next(&mut self, mut input: Input) -> Step<()> {
        let Some(answer) = input.answer.take() else { return self.send(&input) };
        match triage(answer, &self.config.table_name) {
            Triage::Ok(_) => Step::Done(()),
            // No map yet: create it. The map appeared meanwhile (another candidate created it):
            // refresh again.
            Triage::Condition(_) => {
                self.write = match self.write {
                    Write::Refresh => Write::Create,
                    Write::Create => {
                        self.rounds += 1;
                        if self.rounds >= REGISTER_ROUNDS {
                            return Step::Fail(Error::Store(format!(
                                "candidate registry {}: the map kept changing",
                                self.election
                            )));
                        }
                        Write::Refresh
                    }
                };
                self.send(&input)
            }
            Triage::Retry(cause) => self.budget.pause(&input, cause),
            Triage::Ambiguous => {
                self.budget.maybe_applied = true;
                self.budget.pause(&input, Cause::Timeout)
            }
            Triage::Fail(e) => Step::Fail(e),
            Triage::Canceled(_) => Step::Fail(Error::Store("not a transaction".into())),
        }
    }
}

/// Removes a candidate; done as well when it (or the whole map) is not there.
#[derive(Debug, Clone)]
pub struct WithdrawCandidate {
    config: TableConfig,
    request: UpdateItem,
    budget: Budget,
}

impl WithdrawCandidate {
    pub fn new(config: &TableConfig, election: &str, candidate_id: &str) -> crate::Result<Self> {
        validate_id("election", election)?;
        validate_id("candidate.id", candidate_id)?;
        Ok(Self {
            config: config.clone(),
            request: withdraw_request(config, election, candidate_id),
            budget: Budget::operation(config),
        })
    }
}

impl Operation for WithdrawCandidate {
    type Output = ();
    fn next(&mut self, mut input: Input) -> Step<()> {
        let Some(answer) = input.answer.take() else {
            return self.budget.send(input.mono_ms, Request::UpdateItem(self.request.clone()));
        };
        match triage(answer, &self.config.table_name) {
            Triage::Ok(_) | Triage::Condition(_) => Step::Done(()),
            Triage::Retry(cause) => self.budget.pause(&input, cause),
            Triage::Ambiguous => self.budget.pause(&input, Cause::Timeout),
            Triage::Fail(e) => Step::Fail(e),
            Triage::Canceled(_) => Step::Fail(Error::Store("not a transaction".into())),
        }
    }
}

/// Lists the live candidates of an election (one consistent read), then prunes the entries that
/// ran out more than `prune_after_ms` ago (a lease, by default). The pruning never fails the
/// listing: whatever its answer, the live candidates read are the result.
#[derive(Debug, Clone)]
pub struct ListCandidates {
    config: TableConfig,
    election: String,
    prune_after_ms: u64,
    budget: Budget,
    /// The live candidates once read; the prune is in flight then.
    live: Option<Vec<Candidate>>,
}

impl ListCandidates {
    pub fn new(config: &TableConfig, election: &str) -> crate::Result<Self> {
        validate_id("election", election)?;
        Ok(Self {
            config: config.clone(),
            election: election.into(),
            prune_after_ms: config.lease_ms(),
            budget: Budget::operation(config),
            live: None,
        })
    }

    /// Entries are removed once they ran out more than `ms` ago.
    pub fn prune_after_ms(mut self, ms: u64) -> Self {
        self.prune_after_ms = ms;
        self
    }
}

impl Operation for ListCandidates {
    type Output = Vec<Candidate>;
    fn next(&mut self, mut input: Input) -> Step<Vec<Candidate>> {
        let Some(answer) = input.answer.take() else {
            return self.budget.send(input.mono_ms, consistent_get(&self.config, &self.election));
        };
        if let Some(live) = self.live.take() {
            if !matches!(answer, super::Answer::Ok(_) | super::Answer::ConditionFailed { .. }) {
                tracing::debug!(election = %self.election, ?answer, "pruning expired candidates failed");
            }
            return Step::Done(live);
        }
        let out = match read_answer(&mut self.budget, &input, answer, &self.config.table_name) {
            Ok(out) => out,
            Err(step) => return step,
        };
        let all = out.item.as_ref().map(parse_candidates).unwrap_or_default();
        let stale: Vec<(String, u64)> = all
            .iter()
            .filter(|c| is_prunable(c.expires_at_ms, input.now_ms, self.prune_after_ms))
            .take(PRUNE_MAX)
            .map(|c| (c.id.clone(), c.expires_at_ms))
            .collect();
        let live: Vec<Candidate> = all.into_iter().filter(|c| is_live(c.expires_at_ms, input.now_ms)).collect();
        if stale.is_empty() {
            return Step::Done(live);
        }
        self.live = Some(live);
        let prune = prune_request(&self.config, &self.election, &stale);
        self.budget.send(input.mono_ms, Request::UpdateItem(prune))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Answer, Output};
    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    fn cfg() -> TableConfig {
        TableConfig::new("leases").key_prefix("app/")
    }

    fn at(mono: u64) -> Input {
        Input::new(NOW + mono, mono, 0.5)
    }

    fn update<T: std::fmt::Debug>(step: Step<T>) -> UpdateItem {
        match step {
            Step::Send { request: Request::UpdateItem(u), .. } => u,
            other => panic!("expected an UpdateItem, got {other:?}"),
        }
    }

    fn summary<T>(step: &Step<T>) -> String {
        match step {
            Step::Send { request: Request::GetItem(g), .. } if g.consistent_read == Some(true) => "read".into(),
            Step::Send { request: Request::UpdateItem(u), .. } => format!("update {}", u.update_expression),
            Step::Send { request, .. } => format!("send {}", request.operation()),
            Step::Sleep { .. } => "sleep".into(),
            Step::Done(_) => "done".into(),
            Step::Fail(e) => format!("fail {}", e.kind()),
        }
    }

    /// The answer kinds that are neither a success nor a failed condition, and what each
    /// operation does with them (before its budget runs out).
    fn failures() -> Vec<(Answer, &'static str)> {
        vec![
            (Answer::Throttled("slow down".into()), "sleep"),
            (Answer::Ambiguous("cut".into()), "sleep"),
            (Answer::Unreachable("refused".into()), "sleep"),
            (Answer::AccessDenied("no".into()), "fail AccessDenied"),
            (Answer::ResourceNotFound("gone".into()), "fail TableNotFound"),
            (Answer::Other("ValidationException".into()), "fail Store"),
        ]
    }

    fn registry_item(entries: &[(&Candidate, u64)]) -> Item {
        let mut item = key(&cfg(), "candidates/jobs");
        let map = entries.iter().map(|(c, exp)| (c.id.clone(), candidate_entry(c, *exp))).collect();
        item.insert(CANDIDATES_ATTRIBUTE.into(), AttributeValue::M(map));
        item
    }

    fn read(item: Option<Item>) -> Answer {
        Answer::Ok(Output { item, ..Output::default() })
    }

    #[test]
    fn entries_round_trip_and_requests_are_the_dynamodb_json_api() {
        let c = Candidate::new("node-1", 30.5).load(0.25).meta("zone", "a");
        let r = refresh_request(&cfg(), "candidates/jobs", &c, 99);
        let json = serde_json::to_value(Request::UpdateItem(r.clone())).unwrap();
        assert_eq!(json["UpdateItem"]["Key"], serde_json::json!({ "connection_id": { "S": "app/candidates/jobs" } }));
        assert_eq!(json["UpdateItem"]["UpdateExpression"], "SET #c.#id = :entry");
        assert_eq!(json["UpdateItem"]["ExpressionAttributeNames"]["#id"], "node-1");
        assert!(json["UpdateItem"].get("ReturnValues").is_none(), "{json}");
        let stored = registry_item(&[(&c, 99)]);
        assert_eq!(parse_candidates(&stored), vec![Candidate { expires_at_ms: 99, ..c.clone() }]);
        let created = create_request(&cfg(), "candidates/jobs", &c, 99);
        let mut item = Item::new();
        item.insert(CANDIDATES_ATTRIBUTE.into(), created.expression_attribute_values[":map"].clone());
        assert_eq!(parse_candidates(&item), vec![Candidate { expires_at_ms: 99, ..c }]);
        assert!(parse_candidates(&Item::new()).is_empty());
    }

    #[test]
    fn register_refreshes_creates_the_map_when_missing_and_gives_up_on_a_map_that_keeps_changing() {
        let c = Candidate::new("a", 1.0);
        let mut op = RegisterCandidate::new(&cfg(), "candidates/jobs", &c, 1_500).unwrap();
        let first = update(op.next(at(0)));
        assert_eq!(first.condition_expression.as_deref(), Some("attribute_exists(#c)"));
        assert_eq!(first.expression_attribute_values[":entry"], candidate_entry(&c, NOW + 1_500));
        let create = update(op.next(at(5).with(Answer::ConditionFailed { item: None })));
        assert_eq!(create.update_expression, "SET #c = :map");
        // The expiry is counted from the first send, on every attempt.
        assert_eq!(
            create.expression_attribute_values[":map"],
            AttributeValue::M(Item::from([("a".to_string(), candidate_entry(&c, NOW + 1_500))]))
        );
        assert!(matches!(op.next(at(9).with(Answer::Ok(Output::default()))), Step::Done(())));

        // Someone else keeps creating and removing the map: three rounds, then a store error.
        let mut op = RegisterCandidate::new(&cfg(), "candidates/jobs", &c, 1_500).unwrap();
        let mut seen = vec![summary(&op.next(at(0)))];
        for i in 1..=6 {
            seen.push(summary(&op.next(at(i).with(Answer::ConditionFailed { item: None }))));
        }
        assert_eq!(
            seen,
            [
                "update SET #c.#id = :entry",
                "update SET #c = :map",
                "update SET #c.#id = :entry",
                "update SET #c = :map",
                "update SET #c.#id = :entry",
                "update SET #c = :map",
                "fail Store"
            ]
        );
    }

    #[test]
    fn every_registry_operation_over_every_failure_kind() {
        let c = Candidate::new("a", 1.0);
        for (answer, expected) in failures() {
            let mut register = RegisterCandidate::new(&cfg(), "candidates/jobs", &c, 1_000).unwrap();
            let sent = update(register.next(at(0)));
            let step = register.next(at(1).with(answer.clone()));
            assert_eq!(summary(&step), expected, "register, {answer:?}");
            if expected == "sleep" {
                // The same write again after the pause (idempotent, same expiry).
                assert_eq!(update(register.next(at(900))), sent, "register, {answer:?}");
            }

            let mut withdraw = WithdrawCandidate::new(&cfg(), "candidates/jobs", "a").unwrap();
            assert_eq!(summary(&withdraw.next(at(0))), "update REMOVE #c.#id");
            assert_eq!(summary(&withdraw.next(at(1).with(answer.clone()))), expected, "withdraw, {answer:?}");

            let mut list = ListCandidates::new(&cfg(), "candidates/jobs").unwrap();
            assert_eq!(summary(&list.next(at(0))), "read");
            assert_eq!(summary(&list.next(at(1).with(answer.clone()))), expected, "list, {answer:?}");
        }
        let mut withdraw = WithdrawCandidate::new(&cfg(), "candidates/none", "a").unwrap();
        withdraw.next(at(0));
        assert!(matches!(withdraw.next(at(1).with(Answer::ConditionFailed { item: None })), Step::Done(())));
    }

    #[test]
    fn a_budget_that_runs_out_reports_the_cause() {
        let config = cfg().operation_budget(std::time::Duration::from_millis(100));
        let mut op = RegisterCandidate::new(&config, "candidates/jobs", &Candidate::new("a", 1.0), 1_000).unwrap();
        op.next(at(0));
        let step = op.next(at(99).with(Answer::Throttled("slow".into())));
        assert!(matches!(step, Step::Fail(Error::Throttled)), "{step:?}");
    }

    #[test]
    fn listing_returns_the_live_candidates_and_prunes_only_the_long_expired_under_their_expiry() {
        let (live, recent, old) = (Candidate::new("a", 1.0), Candidate::new("b", 2.0), Candidate::new("c", 3.0));
        let lease = cfg().lease_ms();
        let item = registry_item(&[(&live, NOW + 500), (&recent, NOW - 10), (&old, NOW - lease - 1)]);
        let mut op = ListCandidates::new(&cfg(), "candidates/jobs").unwrap();
        op.next(at(0));
        let prune = update(op.next(at(0).with(read(Some(item.clone())))));
        assert_eq!(prune.update_expression, "REMOVE #c.#p0");
        assert_eq!(prune.condition_expression.as_deref(), Some("#c.#p0.#exp = :e0"));
        assert_eq!(prune.expression_attribute_names["#p0"], "c");
        assert_eq!(prune.expression_attribute_values[":e0"], n(NOW - lease - 1));
        // c registered again in between: the condition fails, and the listing stands.
        let Step::Done(listed) = op.next(at(3).with(Answer::ConditionFailed { item: None })) else { panic!() };
        assert_eq!(listed.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["a"]);

        // A failed prune does not fail the listing, and is not retried by it.
        for answer in [Answer::Throttled("t".into()), Answer::Ambiguous("cut".into()), Answer::Other("x".into())] {
            let mut op = ListCandidates::new(&cfg(), "candidates/jobs").unwrap();
            op.next(at(0));
            op.next(at(0).with(read(Some(item.clone()))));
            assert!(matches!(op.next(at(3).with(answer)), Step::Done(l) if l.len() == 1));
        }

        // Nothing to prune: no write; no item: no candidates.
        let mut op = ListCandidates::new(&cfg(), "candidates/jobs").unwrap().prune_after_ms(u64::MAX / 2);
        op.next(at(0));
        assert!(matches!(op.next(at(1).with(read(Some(item)))), Step::Done(l) if l.len() == 1));
        let mut op = ListCandidates::new(&cfg(), "candidates/jobs").unwrap();
        op.next(at(0));
        assert!(matches!(op.next(at(1).with(read(None))), Step::Done(l) if l.is_empty()));
    }

    #[test]
    fn a_prune_names_every_stale_entry_at_most_prune_max() {
        let many: Vec<Candidate> = (0..30).map(|i| Candidate::new(format!("c{i:02}"), 1.0)).collect();
        let entries: Vec<(&Candidate, u64)> = many.iter().map(|c| (c, 5)).collect();
        let mut op = ListCandidates::new(&cfg(), "candidates/jobs").unwrap();
        op.next(at(0));
        let prune = update(op.next(at(0).with(read(Some(registry_item(&entries))))));
        assert_eq!(prune.expression_attribute_values.len(), PRUNE_MAX);
        assert!(prune.update_expression.starts_with("REMOVE #c.#p0, #c.#p1,"), "{}", prune.update_expression);
    }

    #[test]
    fn bad_input_is_refused_before_any_request() {
        let c = Candidate::new("a", f64::NAN);
        let field = |r: crate::Result<RegisterCandidate>| match r {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(RegisterCandidate::new(&cfg(), "candidates/jobs", &c, 1_000)), "candidate.score");
        assert_eq!(
            field(RegisterCandidate::new(&cfg(), "candidates/jobs", &Candidate::new("", 1.0), 1_000)),
            "candidate.id"
        );
        assert_eq!(
            field(RegisterCandidate::new(&cfg(), "candidates/jobs", &Candidate::new("a", 1.0), 0)),
            "candidate_ttl"
        );
        assert!(WithdrawCandidate::new(&cfg(), "", "a").is_err());
        assert!(ListCandidates::new(&cfg(), "").is_err());
    }
}
