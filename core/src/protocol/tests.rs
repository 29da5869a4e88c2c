//! Each operation's step function over every answer kind, without any network.

use std::time::Duration;

use super::request::*;
use super::*;
use crate::{DesiredState, Error, Lease, TableConfig};

const NOW: u64 = 1_800_000_000_000;

fn cfg() -> TableConfig {
    TableConfig::new("leases")
}

/// Clocks `mono` ms after the start, and a draw in the middle.
fn at(mono: u64) -> Input {
    Input::new(NOW + mono, mono, 0.5)
}

fn sent<T: std::fmt::Debug>(step: Step<T>) -> (Request, u64) {
    match step {
        Step::Send { request, attempt_timeout_ms } => (request, attempt_timeout_ms),
        other => panic!("expected a Send, got {other:?}"),
    }
}

fn update_of(step: Step<impl std::fmt::Debug>) -> UpdateItem {
    match sent(step).0 {
        Request::UpdateItem(u) => u,
        other => panic!("expected an UpdateItem, got {other:?}"),
    }
}

fn done<T: std::fmt::Debug>(step: Step<T>) -> T {
    match step {
        Step::Done(v) => v,
        other => panic!("expected Done, got {other:?}"),
    }
}

fn failed<T: std::fmt::Debug>(step: Step<T>) -> Error {
    match step {
        Step::Fail(e) => e,
        other => panic!("expected Fail, got {other:?}"),
    }
}

fn summary<T>(step: Step<T>) -> String {
    match step {
        Step::Send { request: Request::GetItem(g), .. } if g.consistent_read == Some(true) => "reread".into(),
        Step::Send { request, .. } => format!("send {}", request.operation()),
        Step::Sleep { .. } => "sleep".into(),
        Step::Done(_) => "done".into(),
        Step::Fail(e) => format!("fail {}", e.kind()),
    }
}

/// A lease item as stored.
fn stored(id: &str, owner: Option<&str>, exp: Option<u64>, fence: u64, state: Option<DesiredState>) -> Item {
    let mut item = key(&cfg(), id);
    if let Some(o) = owner {
        item.insert("lease_owner".into(), s(o));
    }
    if let Some(e) = exp {
        item.insert("lease_expires_at_ms".into(), n(e));
    }
    item.insert("fence".into(), n(fence));
    if let Some(st) = state {
        item.insert("desired_state".into(), s(st.as_str()));
    }
    item
}

fn with_seq(mut item: Item, seq: u64) -> Item {
    item.insert("last_seq".into(), n(seq));
    item
}

fn new_item(item: Item) -> Answer {
    Answer::Ok(Output { attributes: Some(item), ..Output::default() })
}

fn read(item: Option<Item>) -> Answer {
    Answer::Ok(Output { item, ..Output::default() })
}

fn lease(config: &TableConfig) -> Lease {
    let item = item_from_attrs(config, &stored("s1", Some("a"), Some(NOW + 20_000), 3, Some(DesiredState::Started)));
    Lease::from_item(item, "a", 0, config)
}

/// What a write to an item that another Region is writing gets from a multi-Region strong
/// consistency global table, as the SDKs surface it: HTTP 400, this code and message.
fn replicated_write_conflict() -> Answer {
    Answer::from_service_error(
        "ReplicatedWriteConflictException",
        "The request was rejected because one or more items in the request are being modified by a request in \
         another Region.",
        400,
    )
}

fn failures() -> Vec<(&'static str, Answer)> {
    vec![
        ("Throttled", Answer::Throttled("ProvisionedThroughputExceededException: slow down".into())),
        ("Conflict", replicated_write_conflict()),
        ("Ambiguous", Answer::Ambiguous("timeout".into())),
        ("Unreachable", Answer::Unreachable("connection refused".into())),
        ("AccessDenied", Answer::AccessDenied("AccessDeniedException: no".into())),
        ("NotConfigured", Answer::NotConfigured("no region".into())),
        ("ResourceNotFound", Answer::ResourceNotFound("ResourceNotFoundException: no table".into())),
        ("Other", Answer::Other("ValidationException: bad".into())),
    ]
}

type Runner = Box<dyn FnMut(Answer) -> String>;
type MakeRunner = Box<dyn Fn() -> Runner>;

/// Each operation, sent once, then given `answer`.
fn operations() -> Vec<(&'static str, MakeRunner)> {
    fn run<O: Operation + 'static>(mut op: O) -> Runner {
        let first = summary(op.next(at(0)));
        assert!(first.starts_with("send") || first == "reread", "{first}");
        Box::new(move |answer| summary(op.next(at(10).with(answer))))
    }
    let c = cfg();
    let l = lease(&c);
    vec![
        ("start", Box::new(move || run(Start::new(&cfg(), "s1", "wss://x/s1").unwrap()))),
        ("stop", Box::new(move || run(Stop::new(&cfg(), "s1", NOW).unwrap()))),
        ("acquire", Box::new(move || run(Acquire::new(&cfg(), "s1", "a").unwrap()))),
        ("acquire_started", Box::new(move || run(Acquire::started(&cfg(), "s1", "a").unwrap()))),
        (
            "renew",
            Box::new({
                let l = l.clone();
                move || run(Renew::new(&cfg(), &l))
            }),
        ),
        (
            "release",
            Box::new({
                let l = l.clone();
                move || run(Release::new(&cfg(), &l))
            }),
        ),
        (
            "checkpoint",
            Box::new({
                let l = l.clone();
                move || run(Checkpoint::new(&cfg(), &l, 5))
            }),
        ),
        (
            "fenced_write",
            Box::new({
                let l = l.clone();
                move || run(FencedWrite::new(&cfg(), &l, NOW, 1, "t").unwrap())
            }),
        ),
        ("get", Box::new(move || run(Get::new(&cfg(), "s1").unwrap()))),
        ("batch_desired_states", Box::new(move || run(BatchDesiredStates::new(&cfg(), &["s1".into()]).unwrap()))),
        ("orphans_page", Box::new(move || run(OrphansPage::new(&cfg(), NOW, 10, None)))),
        ("count_by_state", Box::new(move || run(CountByState::new(&cfg(), DesiredState::Started, None)))),
        ("owned_by", Box::new(move || run(OwnedBy::new(&cfg(), "a").unwrap()))),
        ("items", Box::new(move || run(Items::new(&cfg())))),
        ("stranded", Box::new(move || run(Stranded::new(&cfg(), 60_000, None, u64::MAX)))),
        ("create_table", Box::new(move || run(CreateTable::new(&cfg())))),
    ]
}

#[test]
fn every_operation_over_every_failure_kind() {
    for (name, make) in operations() {
        for (kind, answer) in failures() {
            let got = make()(answer);
            // A write that may have landed is re-read where the answer decides something; an
            // idempotent one (start, stop, a tokened transaction, table creation) and any read
            // is simply sent again after a pause.
            let rereads = matches!(name, "acquire" | "acquire_started" | "renew" | "release" | "checkpoint");
            let want = match kind {
                "Throttled" | "Conflict" | "Unreachable" => "sleep",
                "Ambiguous" if rereads => "reread",
                "Ambiguous" => "sleep",
                "AccessDenied" => "fail AccessDenied",
                "NotConfigured" => "fail NotConfigured",
                "ResourceNotFound" => "fail TableNotFound",
                _ => "fail Store",
            };
            assert_eq!(got, want, "{name} answered {kind}");
        }
    }
}

#[test]
fn a_missing_table_is_named() {
    let mut op = Start::new(&cfg(), "s1", "wss://x/s1").unwrap();
    op.next(at(0));
    let err = failed(op.next(at(1).with(Answer::ResourceNotFound("ResourceNotFoundException".into()))));
    assert!(matches!(&err, Error::TableNotFound { table } if table == "leases"), "{err:?}");
    assert!(err.to_string().contains("leases") && err.to_string().contains("leaselock table create"), "{err}");
}

#[test]
fn requests_are_the_dynamodb_json_api() {
    let mut op = Acquire::new(&cfg().key_prefix("app/"), "s1", "a").unwrap();
    let (request, _) = sent(op.next(at(0)));
    let json = serde_json::to_value(&request).unwrap();
    let body = &json["UpdateItem"];
    assert_eq!(body["TableName"], "leases");
    assert_eq!(body["Key"], serde_json::json!({"connection_id": {"S": "app/s1"}}));
    assert_eq!(body["UpdateExpression"], "SET #owner = :owner, #exp = :exp ADD #fence :one");
    assert_eq!(
        body["ConditionExpression"],
        "(attribute_not_exists(#exp) OR #exp < :cutoff) AND (attribute_not_exists(#ds) OR #ds <> :stopped)"
    );
    assert_eq!(body["ExpressionAttributeNames"]["#owner"], "lease_owner");
    assert_eq!(body["ExpressionAttributeValues"][":cutoff"], serde_json::json!({"N": (NOW - 1_000).to_string()}));
    assert_eq!(body["ExpressionAttributeValues"][":owner"], serde_json::json!({"S": "a"}));
    assert_eq!(body["ReturnValues"], "ALL_NEW");
    assert_eq!(body["ReturnValuesOnConditionCheckFailure"], "ALL_OLD");
    assert_eq!(serde_json::from_value::<Request>(json).unwrap(), request, "round trip");

    // What a JavaScript driver hands back: the SDK's output, extra fields and all.
    let answer: Answer = serde_json::from_str(
        r#"{"Ok": {"Attributes": {"connection_id": {"S": "app/s1"}, "fence": {"N": "1"}}, "$metadata": {"httpStatusCode": 200}}}"#,
    )
    .unwrap();
    let lease = done(op.next(at(5).with(answer)));
    assert_eq!((lease.id.as_str(), lease.fence), ("s1", 1));

    let get = serde_json::to_value(ops::consistent_get(&cfg(), "s1")).unwrap();
    assert_eq!(
        get,
        serde_json::json!({"GetItem": {"TableName": "leases", "Key": {"connection_id": {"S": "s1"}}, "ConsistentRead": true}})
    );
}

#[test]
fn service_errors_are_classified_by_code_and_status() {
    let kind = |code: &str, status| match Answer::from_service_error(code, "m", status) {
        Answer::Throttled(_) => "Throttled",
        Answer::Conflict(_) => "Conflict",
        Answer::Ambiguous(_) => "Ambiguous",
        Answer::AccessDenied(_) => "AccessDenied",
        Answer::ResourceNotFound(_) => "ResourceNotFound",
        Answer::ResourceInUse(_) => "ResourceInUse",
        Answer::Other(_) => "Other",
        _ => "unexpected",
    };
    assert_eq!(kind("ProvisionedThroughputExceededException", 400), "Throttled");
    assert_eq!(kind("ThrottlingException", 400), "Throttled");
    assert_eq!(kind("TransactionConflictException", 400), "Conflict");
    assert_eq!(kind("ReplicatedWriteConflictException", 400), "Conflict");
    assert_eq!(kind("InternalServerError", 500), "Ambiguous");
    assert_eq!(kind("ServiceUnavailable", 503), "Ambiguous");
    assert_eq!(kind("TransactionInProgressException", 400), "Ambiguous");
    assert_eq!(kind("AccessDeniedException", 400), "AccessDenied");
    assert_eq!(kind("UnrecognizedClientException", 400), "AccessDenied");
    assert_eq!(kind("ResourceNotFoundException", 400), "ResourceNotFound");
    assert_eq!(kind("ResourceInUseException", 400), "ResourceInUse");
    assert_eq!(kind("ValidationException", 400), "Other");
}

#[test]
fn acquire_decides_from_the_old_item() {
    let c = cfg();
    // Lands: the deadline counts from this send.
    let mut op = Acquire::new(&c, "s1", "a").unwrap();
    op.next(at(100));
    let lease = done(op.next(at(150).with(new_item(stored("s1", Some("a"), Some(NOW + 20_100), 1, None)))));
    assert_eq!((lease.fence, lease.expires_at_ms, lease.deadline_mono_ms), (1, NOW + 20_100, 100 + 19_000));

    // Held (by the expiry of the failed condition's item, no extra read).
    let mut op = Acquire::new(&c, "s1", "a").unwrap();
    op.next(at(0));
    let old = stored("s1", Some("b"), Some(NOW - 1_000), 4, Some(DesiredState::Started));
    assert!(matches!(failed(op.next(at(5).with(Answer::ConditionFailed { item: Some(old) }))),
        Error::Held { owner, expires_at_ms } if owner == "b" && expires_at_ms == NOW - 1_000));

    // Stopped.
    let mut op = Acquire::new(&c, "s1", "a").unwrap();
    op.next(at(0));
    let old = stored("s1", None, Some(0), 4, Some(DesiredState::Stopped));
    assert!(matches!(failed(op.next(at(5).with(Answer::ConditionFailed { item: Some(old) }))), Error::Stopped { .. }));

    // Failed, yet claimable by what came back (it changed in between): claim again, with the
    // cutoff of the new attempt's clock.
    let mut op = Acquire::new(&c, "s1", "a").unwrap();
    op.next(at(0));
    let old = stored("s1", Some("b"), Some(0), 4, None);
    assert_eq!(summary(op.next(at(5).with(Answer::ConditionFailed { item: Some(old) }))), "sleep");
    let again = update_of(op.next(at(300)));
    assert_eq!(again.expression_attribute_values[":cutoff"], n(NOW + 300 - 1_000));
    assert_eq!(again.expression_attribute_values[":exp"], n(NOW + 300 + 20_000));
}

#[test]
fn an_ambiguous_claim_that_landed_is_ours_from_the_first_send() {
    let c = cfg();
    let mut op = Acquire::new(&c, "s1", "a").unwrap();
    op.next(at(1_000));
    // The response was lost; the re-read shows our own claim.
    assert_eq!(summary(op.next(at(3_000).with(Answer::Ambiguous("timeout".into())))), "reread");
    let ours = stored("s1", Some("a"), Some(NOW + 1_000 + 20_000), 1, Some(DesiredState::Started));
    let lease = done(op.next(at(3_100).with(read(Some(ours)))));
    assert_eq!(lease.fence, 1);
    assert_eq!(lease.deadline_mono_ms, 1_000 + 19_000, "counted from the first send, not the re-read");

    // The same through a retry: the first claim landed unseen, the second fails its condition
    // on our own lease.
    let mut op = Acquire::new(&c, "s1", "a").unwrap();
    op.next(at(0));
    op.next(at(2_000).with(Answer::Ambiguous("timeout".into())));
    assert_eq!(summary(op.next(at(2_100).with(Answer::Ambiguous("timeout".into())))), "sleep");
    op.next(at(2_200)); // the re-read again
    assert_eq!(summary(op.next(at(2_300).with(read(None)))), "sleep", "not there: claim again");
    update_of(op.next(at(2_400)));
    let ours = stored("s1", Some("a"), Some(NOW + 20_000), 1, None);
    let lease = done(op.next(at(2_500).with(Answer::ConditionFailed { item: Some(ours) })));
    assert_eq!(lease.deadline_mono_ms, 19_000);

    // Someone else's claim: Held, not ours.
    let mut op = Acquire::new(&c, "s1", "a").unwrap();
    op.next(at(0));
    op.next(at(2_000).with(Answer::Ambiguous("timeout".into())));
    let theirs = stored("s1", Some("b"), Some(NOW + 20_000), 1, None);
    assert!(matches!(failed(op.next(at(2_100).with(read(Some(theirs))))), Error::Held { .. }));

    // Without an ambiguous attempt, our name on a held item is not taken as our claim.
    let mut op = Acquire::new(&c, "s1", "a").unwrap();
    op.next(at(0));
    let stale_self = stored("s1", Some("a"), Some(NOW + 5_000), 7, None);
    assert!(matches!(
        failed(op.next(at(5).with(Answer::ConditionFailed { item: Some(stale_self) }))),
        Error::Held { .. }
    ));
}

#[test]
fn the_fleet_claim_needs_a_started_item_and_writes_nothing_otherwise() {
    let c = cfg();
    let mut op = Acquire::started(&c, "typo", "a").unwrap();
    let claim = update_of(op.next(at(0)));
    assert_eq!(
        claim.condition_expression.as_deref(),
        Some("(attribute_not_exists(#exp) OR #exp < :cutoff) AND #ds = :started")
    );
    assert_eq!(claim.expression_attribute_values[":started"], s("STARTED"));
    assert!(
        matches!(failed(op.next(at(5).with(Answer::ConditionFailed { item: None }))), Error::NotFound { id } if id == "typo")
    );

    let mut op = Acquire::started(&c, "s1", "a").unwrap();
    op.next(at(0));
    let stateless = stored("s1", Some("x"), Some(0), 2, None);
    assert!(matches!(
        failed(op.next(at(5).with(Answer::ConditionFailed { item: Some(stateless) }))),
        Error::NotFound { .. }
    ));

    let mut op = Acquire::started(&c, "s1", "a").unwrap();
    op.next(at(0));
    let stopped = stored("s1", None, Some(0), 2, Some(DesiredState::Stopped));
    assert!(matches!(
        failed(op.next(at(5).with(Answer::ConditionFailed { item: Some(stopped) }))),
        Error::Stopped { .. }
    ));

    // An ambiguous attempt, and nothing there: NotFound (the condition cannot have created it).
    let mut op = Acquire::started(&c, "s1", "a").unwrap();
    op.next(at(0));
    op.next(at(5).with(Answer::Ambiguous("timeout".into())));
    assert!(matches!(failed(op.next(at(6).with(read(None)))), Error::NotFound { .. }));

    // Leader-style keys: a missing item is simply claimed (and created by the write).
    let mut op = Acquire::new(&c, "leader", "a").unwrap();
    op.next(at(0));
    assert_eq!(summary(op.next(at(5).with(Answer::ConditionFailed { item: None }))), "sleep");
}

fn short() -> TableConfig {
    cfg()
        .lease_duration(Duration::from_millis(3_000))
        .renew_interval(Duration::from_millis(1_000))
        .clock_skew(Duration::from_millis(500))
}

#[test]
fn a_retry_that_would_pass_the_budget_fails_with_the_real_cause() {
    let c = short();
    // acquire: one renew interval (1 s) from the first send.
    let mut op = Acquire::new(&c, "s1", "a").unwrap();
    op.next(at(0));
    assert_eq!(summary(op.next(Input::new(NOW, 900, 0.0).with(Answer::Throttled("t".into())))), "sleep");
    op.next(at(900));
    assert!(matches!(
        failed(op.next(Input::new(NOW, 990, 0.999).with(Answer::Throttled("t".into())))),
        Error::Throttled
    ));

    let mut op = Acquire::new(&c, "s1", "a").unwrap();
    op.next(at(0));
    op.next(at(10).with(Answer::Ambiguous("timeout".into())));
    let err = failed(op.next(Input::new(NOW, 995, 0.999).with(Answer::Ambiguous("timeout".into()))));
    assert!(matches!(err, Error::Timeout { outcome_unknown: true }), "{err:?}");

    // Operations holding no lease: the operation budget, and the cause of the last attempt.
    let c = cfg().operation_budget(Duration::from_secs(10)).operation_attempt_timeout(Duration::from_secs(5));
    let mut op = Start::new(&c, "s1", "wss://x/s1").unwrap();
    assert_eq!(sent(op.next(at(0))).1, 5_000);
    assert_eq!(summary(op.next(at(5_000).with(Answer::Ambiguous("timeout".into())))), "sleep");
    assert_eq!(sent(op.next(at(9_000))).1, 1_000, "the last attempt ends with the budget");
    let err = failed(op.next(Input::new(NOW, 9_990, 0.999).with(Answer::Ambiguous("timeout".into()))));
    assert!(matches!(err, Error::Timeout { outcome_unknown: true }), "{err:?}");
    assert!(err.to_string().contains("may have been applied"));

    // A throttled operation never starts an attempt with less than a fifth of its budget left,
    // so a slow throttling answer cannot become a timeout.
    let tight = cfg().operation_budget(Duration::from_millis(1_500));
    let mut op = Start::new(&tight, "s1", "wss://x/s1").unwrap();
    let mut now = 0;
    assert_eq!(sent(op.next(at(now))).1, 1_500);
    let err = loop {
        now += 10;
        match op.next(Input::new(NOW, now, 0.999).with(Answer::Throttled("t".into()))) {
            Step::Sleep { ms } => now += ms,
            Step::Fail(e) => break e,
            other => panic!("{other:?}"),
        }
        let (_, timeout) = sent(op.next(at(now)));
        assert!(timeout >= 300, "an attempt at {now} ms got {timeout} ms");
    };
    assert!(matches!(err, Error::Throttled), "{err:?}");

    let mut op = Get::new(&c, "s1").unwrap();
    op.next(at(0));
    let err = failed(op.next(Input::new(NOW, 9_990, 0.999).with(Answer::Ambiguous("timeout".into()))));
    assert!(matches!(err, Error::Timeout { outcome_unknown: false }), "a read changes nothing: {err:?}");

    let mut op = Stop::new(&c, "s1", NOW).unwrap();
    op.next(at(0));
    let err = failed(op.next(Input::new(NOW, 9_990, 0.999).with(Answer::Unreachable("connection refused".into()))));
    assert!(matches!(err, Error::Unreachable(ref m) if m.contains("refused")), "{err:?}");
}

#[test]
fn renew_decides_lost_and_keeps_the_deadline_of_the_send_that_landed() {
    let c = short();
    let l = lease(&c); // deadline 2_500
    let mut op = Renew::new(&c, &l);
    let u = update_of(op.next(at(1_000)));
    assert_eq!(u.condition_expression.as_deref(), Some("#owner = :me AND #fence = :fence AND #exp > :zero"));
    assert_eq!(u.expression_attribute_values[":exp"], n(NOW + 1_000 + 3_000));
    let renewed = done(op.next(at(1_050).with(new_item(stored("s1", Some("a"), Some(NOW + 4_000), 3, None)))));
    assert_eq!((renewed.expires_at_ms, renewed.deadline_mono_ms), (NOW + 4_000, 1_000 + 2_500));

    let mut op = Renew::new(&c, &l);
    op.next(at(1_000));
    assert!(matches!(failed(op.next(at(1_050).with(Answer::ConditionFailed { item: None }))), Error::Lost { .. }));

    // Ambiguous, and the re-read shows the expiry this attempt wrote: renewed from its send.
    let mut op = Renew::new(&c, &l);
    op.next(at(1_000));
    op.next(at(1_800).with(Answer::Ambiguous("timeout".into())));
    let landed = stored("s1", Some("a"), Some(NOW + 4_000), 3, None);
    assert_eq!(done(op.next(at(1_900).with(read(Some(landed))))).deadline_mono_ms, 3_500);

    // Re-read: still ours, but not our write: try again; not ours: Lost.
    let mut op = Renew::new(&c, &l);
    op.next(at(1_000));
    op.next(at(1_100).with(Answer::Ambiguous("timeout".into())));
    let unchanged = stored("s1", Some("a"), Some(NOW + 20_000), 3, None);
    assert_eq!(summary(op.next(at(1_200).with(read(Some(unchanged))))), "sleep");
    assert_eq!(summary(op.next(at(1_300))), "send UpdateItem");
    let mut op = Renew::new(&c, &l);
    op.next(at(1_000));
    op.next(at(1_100).with(Answer::Ambiguous("timeout".into())));
    let taken = stored("s1", Some("b"), Some(NOW + 20_000), 4, None);
    assert!(matches!(failed(op.next(at(1_200).with(read(Some(taken))))), Error::Lost { .. }));

    // A retry that would pass the deadline is Lost, not Throttled; past it nothing is sent.
    let mut op = Renew::new(&c, &l);
    op.next(at(2_000));
    assert!(matches!(
        failed(op.next(Input::new(NOW, 2_490, 0.999).with(Answer::Throttled("t".into())))),
        Error::Lost { .. }
    ));
    let mut op = Renew::new(&c, &l);
    assert!(matches!(failed(op.next(at(2_500))), Error::Lost { .. }));
}

#[test]
fn release_and_checkpoint_decide_from_the_item() {
    let c = short();
    let l = lease(&c);
    let mut op = Release::new(&c, &l);
    assert_eq!(update_of(op.next(at(0))).update_expression, "SET #exp = :zero");
    done(op.next(at(5).with(new_item(Item::new()))));
    let mut op = Release::new(&c, &l);
    op.next(at(0));
    assert!(matches!(failed(op.next(at(5).with(Answer::ConditionFailed { item: None }))), Error::Lost { .. }));
    let mut op = Release::new(&c, &l);
    op.next(at(0));
    op.next(at(5).with(Answer::Ambiguous("t".into())));
    done(op.next(at(6).with(read(Some(stored("s1", Some("a"), Some(0), 3, None))))));

    let mut op = Checkpoint::new(&c, &l, 5);
    let u = update_of(op.next(at(0)));
    assert_eq!(
        u.condition_expression.as_deref(),
        Some("#owner = :me AND #fence = :fence AND (attribute_not_exists(#seq) OR #seq < :seq) AND #exp > :zero")
    );
    assert_eq!(done(op.next(at(5).with(new_item(Item::new())))).last_seq, Some(5));

    let mut op = Checkpoint::new(&c, &l, 5);
    op.next(at(0));
    let ours = with_seq(stored("s1", Some("a"), Some(NOW + 3_000), 3, None), 9);
    assert!(matches!(
        failed(op.next(at(5).with(Answer::ConditionFailed { item: Some(ours) }))),
        Error::SeqNotIncreasing { last_seq: 9, seq: 5, .. }
    ));
    let mut op = Checkpoint::new(&c, &l, 5);
    op.next(at(0));
    let theirs = with_seq(stored("s1", Some("b"), Some(NOW + 3_000), 4, None), 9);
    assert!(matches!(failed(op.next(at(5).with(Answer::ConditionFailed { item: Some(theirs) }))), Error::Lost { .. }));

    // Ambiguous: the re-read tells landed / refused / try again.
    for (stored_seq, want) in [(5, "done"), (7, "fail SeqNotIncreasing"), (3, "sleep")] {
        let mut op = Checkpoint::new(&c, &l, 5);
        op.next(at(0));
        op.next(at(5).with(Answer::Ambiguous("t".into())));
        let current = with_seq(stored("s1", Some("a"), Some(NOW + 3_000), 3, None), stored_seq);
        assert_eq!(summary(op.next(at(6).with(read(Some(current))))), want, "stored {stored_seq}");
    }
    let mut op = Checkpoint::new(&c, &l, 5);
    op.next(at(0));
    assert!(matches!(
        failed(op.next(Input::new(NOW, 2_490, 0.999).with(Answer::Throttled("t".into())))),
        Error::Lost { .. }
    ));
}

#[test]
fn start_and_stop() {
    let c = cfg();
    let mut op = Start::new(&c, "s1", "wss://x/s1").unwrap();
    let u = update_of(op.next(at(0)));
    assert_eq!(u.update_expression, "SET #ds = :started, #url = :url, #exp = if_not_exists(#exp, :zero) REMOVE #ttl");
    assert_eq!(u.condition_expression, None);
    let item = done(op.next(at(5).with(new_item(stored("s1", None, Some(0), 0, Some(DesiredState::Started))))));
    assert_eq!(item.desired_state, Some(DesiredState::Started));

    let mut op = Stop::new(&c, "s1", NOW).unwrap();
    let u = update_of(op.next(at(0)));
    assert_eq!(u.expression_attribute_values[":ttl"], n(NOW / 1000 + 7 * 24 * 3600));
    assert!(matches!(failed(op.next(at(5).with(Answer::ConditionFailed { item: None }))), Error::NotFound { .. }));

    assert!(matches!(Start::new(&c, "", "wss://x"), Err(Error::InvalidInput { .. })));
    assert!(matches!(Start::new(&c, "s1", "http://x"), Err(Error::InvalidInput { .. })));
    assert!(matches!(Acquire::started(&c, "s1", ""), Err(Error::InvalidInput { .. })));
}

#[test]
fn fenced_writes_decide_from_the_cancellation_reasons() {
    let c = cfg();
    let l = lease(&c);
    let reason = |code: &str, item: Option<Item>| CancellationReason { code: Some(code.into()), message: None, item };
    let cancelled = |reasons| Answer::TransactionCanceled { reasons };

    let mut op = FencedWrite::new(&c, &l, NOW, 2, "token-1").unwrap();
    let (Request::TransactWriteItems(t), _) = sent(op.next(at(0))) else { panic!() };
    assert_eq!(t.client_request_token.as_deref(), Some("token-1"));
    let check = t.transact_items[0].condition_check.as_ref().unwrap();
    assert_eq!(check.condition_expression, "#owner = :me AND #fence = :fence AND #exp > :now");
    assert_eq!(check.expression_attribute_values[":now"], n(NOW));
    assert!(matches!(
        failed(op.next(at(5).with(cancelled(vec![reason("ConditionalCheckFailed", None), reason("None", None)])))),
        Error::Lost { .. }
    ));

    let mut op = FencedWrite::new(&c, &l, NOW, 2, "t").unwrap();
    op.next(at(0));
    let err = failed(op.next(at(5).with(cancelled(vec![
        reason("None", None),
        reason("None", None),
        reason("ConditionalCheckFailed", None),
    ]))));
    assert!(err.to_string().contains("fenced write 1"), "{err}");

    let mut op = FencedWrite::new(&c, &l, NOW, 1, "t").unwrap();
    op.next(at(0));
    assert_eq!(
        summary(op.next(at(5).with(cancelled(vec![reason("None", None), reason("TransactionConflict", None)])))),
        "sleep"
    );
    let (Request::TransactWriteItems(again), _) = sent(op.next(at(100))) else { panic!() };
    assert_eq!(again.client_request_token.as_deref(), Some("t"), "the same token on every attempt");
    assert!(matches!(
        failed(op.next(at(105).with(cancelled(vec![reason("None", None), reason("ValidationError", None)])))),
        Error::Store(_)
    ));

    // Checkpointing: the old lease item tells SeqNotIncreasing from Lost.
    let mut op = FencedWrite::with_checkpoint(&c, &l, NOW, 5, 1, "t").unwrap();
    let (Request::TransactWriteItems(t), _) = sent(op.next(at(0))) else { panic!() };
    let update = t.transact_items[0].update.as_ref().unwrap();
    assert_eq!(
        update.condition_expression.as_deref(),
        Some("#owner = :me AND #fence = :fence AND #exp > :now AND (attribute_not_exists(#seq) OR #seq < :seq)")
    );
    assert_eq!(update.return_values_on_condition_check_failure.as_deref(), Some("ALL_OLD"));
    let ours = with_seq(stored("s1", Some("a"), Some(NOW + 1), 3, None), 8);
    assert!(matches!(
        failed(
            op.next(at(5).with(cancelled(vec![reason("ConditionalCheckFailed", Some(ours)), reason("None", None)])))
        ),
        Error::SeqNotIncreasing { last_seq: 8, seq: 5, .. }
    ));
    let mut op = FencedWrite::with_checkpoint(&c, &l, NOW, 5, 1, "t").unwrap();
    op.next(at(0));
    let theirs = with_seq(stored("s1", Some("b"), Some(NOW + 1), 4, None), 8);
    assert!(matches!(
        failed(op.next(at(5).with(cancelled(vec![reason("ConditionalCheckFailed", Some(theirs))])))),
        Error::Lost { .. }
    ));

    // Like a checkpoint: retried while the lease's deadline (19 s) allows, then the lease is lost.
    let mut op = FencedWrite::new(&c, &l, NOW, 1, "t").unwrap();
    op.next(at(0));
    assert_eq!(summary(op.next(Input::new(NOW, 4_990, 0.999).with(Answer::Ambiguous("t".into())))), "sleep");
    op.next(at(5_100));
    let err = failed(op.next(Input::new(NOW, 18_990, 0.999).with(Answer::Ambiguous("t".into()))));
    assert!(matches!(err, Error::Lost { .. }), "{err:?}");
    assert!(FencedWrite::new(&c, &l, NOW, 0, "t").is_err() && FencedWrite::new(&c, &l, NOW, 100, "t").is_err());
}

#[test]
fn owned_by_queries_the_owner_index_then_reads_the_ids_found() {
    let c = cfg();
    let mut op = OwnedBy::new(&c, "a").unwrap();
    let (Request::Query(q), _) = sent(op.next(at(0))) else { panic!("a Query, not a Scan") };
    assert_eq!(q.index_name.as_deref(), Some("lease_owner-index"));
    assert_eq!(q.key_condition_expression, "#owner = :owner");
    let page = |ids: &[&str], last: Option<&str>| {
        Answer::Ok(Output {
            items: Some(
                ids.iter()
                    .map(|id| {
                        let mut k = key(&c, id);
                        k.insert("lease_owner".into(), s("a"));
                        k
                    })
                    .collect(),
            ),
            last_evaluated_key: last.map(|id| key(&c, id)),
            ..Output::default()
        })
    };
    let (Request::Query(q2), _) = sent(op.next(at(5).with(page(&["s1", "s2"], Some("s2"))))) else { panic!() };
    assert_eq!(q2.exclusive_start_key, Some(key(&c, "s2")));
    let (Request::BatchGetItem(b), _) = sent(op.next(at(6).with(page(&["s3"], None)))) else { panic!() };
    let ask = &b.request_items["leases"];
    assert_eq!((ask.keys.len(), ask.consistent_read), (3, Some(true)));
    // s3 comes back unprocessed once; s2 was released; s1 is held.
    let answer = Answer::Ok(Output {
        responses: Some(
            [(
                "leases".to_string(),
                vec![stored("s1", Some("a"), Some(NOW + 9_000), 1, None), stored("s2", Some("a"), Some(0), 1, None)],
            )]
            .into(),
        ),
        unprocessed_keys: Some(
            [("leases".to_string(), KeysAndAttributes { keys: vec![key(&c, "s3")], ..Default::default() })].into(),
        ),
        ..Output::default()
    });
    let (Request::BatchGetItem(b), _) = sent(op.next(at(7).with(answer))) else { panic!() };
    assert_eq!(b.request_items["leases"].keys, vec![key(&c, "s3")]);
    let answer = Answer::Ok(Output {
        responses: Some([("leases".to_string(), vec![stored("s3", Some("b"), Some(NOW + 9_000), 2, None)])].into()),
        ..Output::default()
    });
    let held = done(op.next(at(8).with(answer)));
    assert_eq!(held.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), ["s1"], "held by a now, not released nor taken");
}

#[test]
fn batches_pages_and_cursors() {
    let c = cfg();
    let ids: Vec<String> = (0..150).map(|i| format!("s{i}")).collect();
    let mut op = BatchDesiredStates::new(&c, &ids).unwrap();
    let (Request::BatchGetItem(b), _) = sent(op.next(at(0))) else { panic!() };
    assert_eq!(b.request_items["leases"].keys.len(), BATCH_GET_MAX);
    assert_eq!(b.request_items["leases"].projection_expression.as_deref(), Some("#pk, #ds"));
    let found = Answer::Ok(Output {
        responses: Some(
            [("leases".to_string(), vec![stored("s0", None, None, 0, Some(DesiredState::Stopped))])].into(),
        ),
        ..Output::default()
    });
    let (Request::BatchGetItem(b), _) = sent(op.next(at(1).with(found))) else { panic!() };
    assert_eq!(b.request_items["leases"].keys.len(), 50);
    let states = done(op.next(at(2).with(Answer::Ok(Output::default()))));
    assert_eq!((states.len(), states["s0"], states["s1"]), (150, Some(DesiredState::Stopped), None));
    assert!(done(BatchDesiredStates::new(&c, &[]).unwrap().next(at(0))).is_empty(), "nothing to read, nothing sent");

    let mut op =
        OrphansPage::new(&c, NOW, 2, Some(crate::OrphanCursor { key: "s1".into(), expires_at_ms: 5, shard: 0 }));
    let (Request::Query(q), _) = sent(op.next(at(0))) else { panic!() };
    assert_eq!(q.key_condition_expression, "#ds = :started AND #exp < :cutoff");
    assert_eq!(q.limit, Some(2));
    assert_eq!(q.exclusive_start_key.as_ref().unwrap()["lease_expires_at_ms"], n(5));
    let mut last = key(&c, "s3");
    last.insert("lease_expires_at_ms".into(), n(7));
    let page = done(op.next(at(1).with(Answer::Ok(Output {
        items: Some(vec![stored("s3", None, Some(7), 0, Some(DesiredState::Started))]),
        last_evaluated_key: Some(last),
        ..Output::default()
    }))));
    assert_eq!(page.next, Some(crate::OrphanCursor { key: "s3".into(), expires_at_ms: 7, shard: 0 }));

    let c = cfg().key_prefix("app/");
    let mut op = Items::new(&c);
    op.next(at(0));
    let mut other = key(&cfg(), "x");
    other.insert("fence".into(), n(1));
    let first = Answer::Ok(Output {
        items: Some(vec![key(&c, "a"), other]),
        last_evaluated_key: Some(key(&c, "a")),
        ..Output::default()
    });
    let (Request::Scan(scan), _) = sent(op.next(at(1).with(first))) else { panic!() };
    assert_eq!(scan.exclusive_start_key, Some(key(&c, "a")));
    let all = done(op.next(at(2).with(Answer::Ok(Output { items: Some(vec![key(&c, "b")]), ..Output::default() }))));
    assert_eq!(all.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), ["a", "b"], "only this prefix");
}

#[test]
fn create_table_adds_the_owner_index_to_a_table_that_lacks_it() {
    let c = cfg();
    let mut op = CreateTable::new(&c);
    let (Request::CreateTable(def), _) = sent(op.next(at(0))) else { panic!() };
    let owner = def.global_secondary_indexes.iter().find(|g| g.index_name == "lease_owner-index").expect("owner index");
    assert_eq!(owner.projection.projection_type, "KEYS_ONLY");
    assert_eq!(
        owner.key_schema,
        vec![KeySchemaElement { attribute_name: "lease_owner".into(), key_type: "HASH".into() }]
    );
    assert!(def
        .attribute_definitions
        .contains(&AttributeDefinition { attribute_name: "lease_owner".into(), attribute_type: "S".into() }));

    let describe = |status: &str, indexes: &[(&str, &str)]| {
        Answer::Ok(Output {
            table: Some(TableDescription {
                table_status: Some(status.into()),
                global_secondary_indexes: indexes
                    .iter()
                    .map(|(n, s)| IndexDescription { index_name: n.to_string(), index_status: Some(s.to_string()) })
                    .collect(),
                ..TableDescription::default()
            }),
            ..Output::default()
        })
    };
    let orphan = "desired_state-lease_expires_at_ms-index";
    // An older table: exists, active, without the owner index.
    assert_eq!(summary(op.next(at(1).with(Answer::ResourceInUse("exists".into())))), "send DescribeTable");
    let (Request::UpdateTable(u), _) = sent(op.next(at(2).with(describe("ACTIVE", &[(orphan, "ACTIVE")])))) else {
        panic!()
    };
    assert_eq!(u.global_secondary_index_updates[0].create.as_ref().unwrap().index_name, "lease_owner-index");
    assert_eq!(summary(op.next(at(3).with(Answer::Ok(Output::default())))), "send DescribeTable");
    assert_eq!(
        summary(op.next(at(4).with(describe("UPDATING", &[(orphan, "ACTIVE"), ("lease_owner-index", "CREATING")])))),
        "sleep"
    );
    assert_eq!(summary(op.next(at(300))), "send DescribeTable");
    assert_eq!(
        summary(op.next(at(301).with(describe("ACTIVE", &[(orphan, "ACTIVE"), ("lease_owner-index", "ACTIVE")])))),
        "send DescribeTimeToLive"
    );
    let ttl = |status: &str| {
        Answer::Ok(Output {
            time_to_live_description: Some(TimeToLiveDescription { time_to_live_status: Some(status.into()) }),
            ..Output::default()
        })
    };
    let (Request::UpdateTimeToLive(t), _) = sent(op.next(at(302).with(ttl("DISABLED")))) else { panic!() };
    assert_eq!(t.time_to_live_specification, TimeToLiveSpecification { enabled: true, attribute_name: "ttl".into() });
    done(op.next(at(303).with(Answer::Ok(Output::default()))));

    // Never active: gives up after the wait.
    let mut op = CreateTable::new(&c);
    op.next(at(0));
    op.next(at(1).with(Answer::Ok(Output::default())));
    assert_eq!(summary(op.next(at(2).with(describe("CREATING", &[])))), "sleep");
    op.next(at(CREATE_TABLE_WAIT_MS + 10));
    assert_eq!(summary(op.next(at(CREATE_TABLE_WAIT_MS + 11).with(describe("CREATING", &[])))), "fail Store");
}

/// Session mode: every operation over every answer kind.
mod session {
    use super::*;
    use crate::lease::HELD_UNDER_SESSION_MS;
    use crate::{LeaseItem, Session};

    fn session(deadline: u64) -> Session {
        Session { owner: "me".into(), epoch: 3, expires_at_ms: NOW + 20_000, deadline_mono_ms: deadline }
    }

    fn session_item(exp: u64, epoch: u64) -> Item {
        let mut item = key(&cfg(), "session/old");
        item.insert("lease_expires_at_ms".into(), n(exp));
        item.insert("fence".into(), n(epoch));
        item.insert("desired_state".into(), s("SESSION"));
        item
    }

    /// A connection held under `owner`'s session `epoch`.
    fn held_under(owner: &str, epoch: u64, fence: u64) -> Item {
        let mut item = stored("c1", Some(owner), Some(HELD_UNDER_SESSION_MS), fence, Some(DesiredState::Started));
        item.insert("session_epoch".into(), n(epoch));
        item.insert("last_seq".into(), n(41));
        item
    }

    fn ok_attrs(attrs: Item) -> Answer {
        Answer::Ok(Output { attributes: Some(attrs), ..Output::default() })
    }

    fn ok_item(item: Option<Item>) -> Answer {
        Answer::Ok(Output { item, ..Output::default() })
    }

    fn reason(code: &str, item: Option<Item>) -> CancellationReason {
        CancellationReason { code: Some(code.into()), message: None, item }
    }

    #[test]
    fn create_session_writes_the_session_partition_and_bumps_the_epoch() {
        let mut op = CreateSession::new(&cfg(), "me", Some(2)).unwrap();
        let u = update_of(op.next(at(10)));
        assert_eq!(u.key, key(&cfg(), "session/me"));
        assert_eq!(u.update_expression, "SET #exp = :exp, #ds = :partition ADD #fence :one");
        assert_eq!(
            u.condition_expression.as_deref(),
            Some("(attribute_not_exists(#exp) OR #exp < :cutoff) OR #fence = :previous")
        );
        assert_eq!(u.expression_attribute_values[":partition"], s("SESSION"));
        assert_eq!(u.expression_attribute_values[":cutoff"], n(NOW + 10 - 1_000));
        let mut item = key(&cfg(), "session/me");
        item.insert("fence".into(), n(3));
        item.insert("lease_expires_at_ms".into(), n(NOW + 10 + 20_000));
        let s = done(op.next(at(30).with(ok_attrs(item.clone()))));
        assert_eq!((s.epoch, s.expires_at_ms, s.deadline_mono_ms), (3, NOW + 20_010, 10 + 19_000));

        // Alive by rule 1: Held with its expiry, nothing more sent.
        let mut op = CreateSession::new(&cfg(), "me", None).unwrap();
        assert!(update_of(op.next(at(0))).condition_expression.unwrap().ends_with("< :cutoff)"));
        let e = failed(op.next(at(5).with(Answer::ConditionFailed { item: Some(item.clone()) })));
        assert!(matches!(e, Error::Held { expires_at_ms, .. } if expires_at_ms == NOW + 20_010));

        // Ambiguous: a re-read showing our expiry is our epoch, counted from that send.
        let mut op = CreateSession::new(&cfg(), "me", None).unwrap();
        update_of(op.next(at(10)));
        assert_eq!(summary(op.next(at(2_010).with(Answer::Ambiguous("timeout".into())))), "reread");
        let s = done(op.next(at(2_020).with(ok_item(Some(item.clone())))));
        assert_eq!((s.epoch, s.deadline_mono_ms), (3, 19_010));
        // ... and one without it is retried after a pause.
        let mut op = CreateSession::new(&cfg(), "me", None).unwrap();
        update_of(op.next(at(0)));
        op.next(at(2_000).with(Answer::Ambiguous("timeout".into())));
        assert_eq!(summary(op.next(at(2_010).with(ok_item(None)))), "sleep");
        assert_eq!(summary(op.next(at(2_600))), "send UpdateItem");
        // Throttled: retried; denied: failed.
        let mut op = CreateSession::new(&cfg(), "me", None).unwrap();
        op.next(at(0));
        assert_eq!(summary(op.next(at(5).with(Answer::Throttled("slow down".into())))), "sleep");
        let mut op = CreateSession::new(&cfg(), "me", None).unwrap();
        op.next(at(0));
        assert_eq!(summary(op.next(at(5).with(Answer::AccessDenied("no".into())))), "fail AccessDenied");
    }

    #[test]
    fn renew_session_moves_the_deadline_or_loses_the_session() {
        let mut op = RenewSession::new(&cfg(), &session(19_000));
        let u = update_of(op.next(at(5_000)));
        assert_eq!(u.condition_expression.as_deref(), Some("#fence = :epoch AND #exp > :zero"));
        assert_eq!(u.expression_attribute_values[":epoch"], n(3));
        assert_eq!(u.update_expression, "SET #exp = :exp");
        // Reporting the load: the same write carries it.
        let load = crate::SessionLoad { held: 7, max_connections: 700 };
        let mut reporting = RenewSession::new(&cfg(), &session(19_000)).reporting(load);
        let r = update_of(reporting.next(at(5_000)));
        assert_eq!(r.update_expression, "SET #exp = :exp, #held = :held, #max = :max");
        assert_eq!(r.expression_attribute_names["#held"], "held_connections");
        assert_eq!(r.expression_attribute_names["#max"], "max_connections");
        assert_eq!((&r.expression_attribute_values[":held"], &r.expression_attribute_values[":max"]), (&n(7), &n(700)));
        assert_eq!(r.condition_expression, u.condition_expression);
        let s = done(op.next(at(5_040).with(ok_attrs(Item::new()))));
        assert_eq!((s.deadline_mono_ms, s.expires_at_ms), (24_000, NOW + 25_000));
        // Another epoch (or gone): Lost.
        let mut op = RenewSession::new(&cfg(), &session(19_000));
        op.next(at(5_000));
        assert_eq!(summary(op.next(at(5_010).with(Answer::ConditionFailed { item: None }))), "fail Lost");
        // Past the deadline: Lost without a request.
        let mut op = RenewSession::new(&cfg(), &session(19_000));
        assert_eq!(summary(op.next(at(19_000))), "fail Lost");
        // Throttled until the deadline: Lost.
        let mut op = RenewSession::new(&cfg(), &session(19_000));
        op.next(at(18_990));
        assert_eq!(summary(op.next(at(18_995).with(Answer::Throttled("slow".into())))), "fail Lost");
        // Ambiguous, then a re-read with our expiry and epoch: renewed from that send.
        let mut op = RenewSession::new(&cfg(), &session(19_000));
        op.next(at(5_000));
        assert_eq!(summary(op.next(at(7_000).with(Answer::Ambiguous("5xx".into())))), "reread");
        let item = session_item(NOW + 25_000, 3);
        assert_eq!(done(op.next(at(7_010).with(ok_item(Some(item))))).deadline_mono_ms, 24_000);
        // ... a re-read of another epoch: Lost.
        let mut op = RenewSession::new(&cfg(), &session(19_000));
        op.next(at(5_000));
        op.next(at(7_000).with(Answer::Ambiguous("5xx".into())));
        let item = session_item(NOW + 25_000, 4);
        assert_eq!(summary(op.next(at(7_010).with(ok_item(Some(item))))), "fail Lost");
    }

    #[test]
    fn end_and_retire_session() {
        let mut op = EndSession::new(&cfg(), &session(19_000));
        let u = update_of(op.next(at(0)));
        assert_eq!(
            (u.update_expression.as_str(), u.condition_expression.as_deref()),
            ("SET #exp = :zero", Some("#fence = :epoch"))
        );
        assert_eq!(summary(op.next(at(5).with(Answer::Ambiguous("timeout".into())))), "sleep");
        assert_eq!(summary(op.next(at(600))), "send UpdateItem");
        done(op.next(at(610).with(ok_attrs(Item::new()))));
        let mut op = EndSession::new(&cfg(), &session(19_000));
        op.next(at(0));
        assert_eq!(summary(op.next(at(5).with(Answer::ConditionFailed { item: None }))), "fail Lost");
        // Reporting what it frees: the same write carries it, under the same condition.
        let freed = crate::SessionLoad { held: 6, max_connections: 700 };
        let r = update_of(EndSession::new(&cfg(), &session(19_000)).reporting(freed).next(at(0)));
        assert_eq!(r.update_expression, "SET #exp = :zero, #held = :held, #max = :max");
        assert_eq!(r.condition_expression.as_deref(), Some("#fence = :epoch"));
        assert_eq!((&r.expression_attribute_values[":held"], &r.expression_attribute_values[":max"]), (&n(6), &n(700)));

        let mut op = RetireSession::new(&cfg(), "old", 7).unwrap();
        let u = update_of(op.next(at(0)));
        assert_eq!(u.update_expression, "REMOVE #ds");
        assert_eq!(u.condition_expression.as_deref(), Some("#fence = :epoch AND #exp < :cutoff"));
        assert!(done(op.next(at(5).with(ok_attrs(Item::new())))));
        let mut op = RetireSession::new(&cfg(), "old", 7).unwrap();
        op.next(at(0));
        assert!(!done(op.next(at(5).with(Answer::ConditionFailed { item: None }))));
    }

    #[test]
    fn claiming_unowned_work_sets_owner_epoch_fence_and_the_sentinel() {
        let mut op = ClaimInSession::new(&cfg(), "c1", &session(19_000)).unwrap();
        let u = update_of(op.next(at(100)));
        assert_eq!(u.update_expression, "SET #owner = :me, #epoch = :epoch, #exp = :held ADD #fence :one");
        assert_eq!(
            u.condition_expression.as_deref(),
            Some("(attribute_not_exists(#exp) OR #exp < :cutoff) AND #ds = :started")
        );
        assert_eq!(u.expression_attribute_values[":held"], n(HELD_UNDER_SESSION_MS));
        assert_eq!(u.expression_attribute_names["#epoch"], "session_epoch");
        let mut new = held_under("me", 3, 5);
        new.remove("last_seq");
        let lease = done(op.next(at(120).with(ok_attrs(new))));
        assert_eq!((lease.fence, lease.expires_at_ms, lease.deadline_mono_ms), (5, HELD_UNDER_SESSION_MS, 19_000));
        // Past the session's deadline: nothing is sent.
        let mut op = ClaimInSession::new(&cfg(), "c1", &session(19_000)).unwrap();
        assert_eq!(summary(op.next(at(19_000))), "fail Lost");
    }

    #[test]
    fn refusals_name_what_holds_the_work() {
        let fail_with = |old: Option<Item>| {
            let mut op = ClaimInSession::new(&cfg(), "c1", &session(19_000)).unwrap();
            op.next(at(0));
            summary(op.next(at(5).with(Answer::ConditionFailed { item: old })))
        };
        assert_eq!(fail_with(None), "fail NotFound");
        assert_eq!(fail_with(Some(stored("c1", None, Some(0), 0, None))), "fail NotFound");
        assert_eq!(fail_with(Some(stored("c1", None, Some(0), 0, Some(DesiredState::Stopped)))), "fail Stopped");
        // A per-item lease that has not expired.
        assert_eq!(
            fail_with(Some(stored("c1", Some("b"), Some(NOW + 9_000), 2, Some(DesiredState::Started)))),
            "fail Held"
        );
        // Already ours under this epoch.
        assert_eq!(fail_with(Some(held_under("me", 3, 4))), "fail Held");
        // Held under another session: the takeover transaction.
        assert_eq!(fail_with(Some(held_under("old", 7, 4))), "send TransactWriteItems");
        // Ours under an older epoch: taken back the same way.
        assert_eq!(fail_with(Some(held_under("me", 2, 4))), "send TransactWriteItems");
    }

    fn takeover() -> (ClaimInSession, TransactWriteItems) {
        let mut op = ClaimInSession::new(&cfg(), "c1", &session(19_000)).unwrap();
        op.next(at(0));
        let (request, _) = sent(op.next(at(5).with(Answer::ConditionFailed { item: Some(held_under("old", 7, 4)) })));
        let Request::TransactWriteItems(t) = request else { panic!("{request:?}") };
        (op, t)
    }

    #[test]
    fn a_dead_sessions_work_is_taken_by_one_transaction() {
        let (mut op, t) = takeover();
        assert_eq!(t.transact_items.len(), 2);
        let check = t.transact_items[0].condition_check.as_ref().unwrap();
        assert_eq!(check.key, key(&cfg(), "session/old"));
        assert_eq!(check.condition_expression, "attribute_not_exists(#pk) OR #exp < :cutoff OR #fence <> :epoch");
        assert_eq!(check.expression_attribute_values[":epoch"], n(7));
        assert_eq!(check.expression_attribute_values[":cutoff"], n(NOW + 5 - 1_000));
        let update = t.transact_items[1].update.as_ref().unwrap();
        assert_eq!(
            update.condition_expression.as_deref(),
            Some("#owner = :old_owner AND #epoch = :old_epoch AND #fence = :old_fence AND #ds = :started")
        );
        assert_eq!(update.expression_attribute_values[":old_fence"], n(4));
        assert_eq!(update.expression_attribute_values[":epoch"], n(3));
        let lease = done(op.next(at(50).with(Answer::Ok(Output::default()))));
        assert_eq!((lease.fence, lease.owner.as_str(), lease.last_seq), (5, "me", Some(41)));
        assert_eq!(lease.deadline_mono_ms, 19_000);
    }

    /// Work listed under a dead session (the owner index's answer) is taken over with the first
    /// request: the transaction the claim of [`ClaimInSession::new`] sends second.
    #[test]
    fn work_listed_under_a_dead_session_is_taken_over_with_the_first_request() {
        let listed = item_from_attrs(&cfg(), &held_under("old", 7, 4));
        let mut op = ClaimInSession::takeover(&cfg(), &listed, 7, &session(19_000)).unwrap();
        let (request, _) = sent(op.next(at(5)));
        let (_, second) = takeover();
        assert_eq!(request, Request::TransactWriteItems(second), "the same transaction, at once");
        let lease = done(op.next(at(50).with(Answer::Ok(Output::default()))));
        assert_eq!((lease.fence, lease.owner.as_str(), lease.last_seq), (5, "me", Some(41)));
        // The listing was stale (released since): the item in the cancellation decides, at once.
        let mut op = ClaimInSession::takeover(&cfg(), &listed, 7, &session(19_000)).unwrap();
        op.next(at(0));
        let released = stored("c1", Some("old"), Some(0), 4, Some(DesiredState::Started));
        let reasons = vec![reason("None", None), reason("ConditionalCheckFailed", Some(released))];
        assert_eq!(summary(op.next(at(50).with(Answer::TransactionCanceled { reasons }))), "send UpdateItem");
        // A wrong epoch guess: the item's own epoch is taken over, at once.
        let mut op = ClaimInSession::takeover(&cfg(), &listed, 8, &session(19_000)).unwrap();
        let (Request::TransactWriteItems(t), _) = sent(op.next(at(0))) else { panic!() };
        assert_eq!(t.transact_items[0].condition_check.as_ref().unwrap().expression_attribute_values[":epoch"], n(8));
        let reasons = vec![reason("None", None), reason("ConditionalCheckFailed", Some(held_under("old", 7, 4)))];
        let (Request::TransactWriteItems(t), _) = sent(op.next(at(50).with(Answer::TransactionCanceled { reasons })))
        else {
            panic!()
        };
        assert_eq!(t.transact_items[0].condition_check.as_ref().unwrap().expression_attribute_values[":epoch"], n(7));
        assert_eq!(t.transact_items[1].update.as_ref().unwrap().expression_attribute_values[":old_epoch"], n(7));
        // Not listed as held under a session (a per-item lease, our own session, released work):
        // claimed as ClaimInSession::new claims, the UpdateItem first.
        for other in [
            item_from_attrs(&cfg(), &stored("c1", Some("b"), Some(NOW + 9_000), 2, Some(DesiredState::Started))),
            item_from_attrs(&cfg(), &held_under("me", 3, 4)),
            item_from_attrs(&cfg(), &stored("c1", None, Some(0), 0, Some(DesiredState::Started))),
        ] {
            let mut op = ClaimInSession::takeover(&cfg(), &other, 3, &session(19_000)).unwrap();
            assert_eq!(summary(op.next(at(0))), "send UpdateItem", "{other:?}");
        }
    }

    /// `n` connections c0.. listed under the dead session 7 of "old", at fence 4.
    fn listed(n: usize) -> Vec<LeaseItem> {
        (0..n)
            .map(|i| {
                let mut attrs = held_under("old", 7, 4);
                attrs.insert("connection_id".into(), s(format!("c{i}")));
                item_from_attrs(&cfg(), &attrs)
            })
            .collect()
    }

    fn transaction<T: std::fmt::Debug>(step: Step<T>) -> TransactWriteItems {
        match sent(step).0 {
            Request::TransactWriteItems(t) => t,
            other => panic!("{other:?}"),
        }
    }

    fn updated_ids(t: &TransactWriteItems) -> Vec<String> {
        t.transact_items
            .iter()
            .filter_map(|a| a.update.as_ref())
            .map(|u| u.key["connection_id"].as_s().unwrap().to_string())
            .collect()
    }

    /// One transaction for several connections of one dead session: the takeover's check once,
    /// then each connection's takeover Update, all or none.
    #[test]
    fn connections_listed_under_one_dead_session_are_taken_over_in_one_transaction() {
        let mut op = TakeOverListed::new(&cfg(), "old", 7, listed(3), &session(19_000)).unwrap();
        let t = transaction(op.next(at(5)));
        let (_, single) = takeover();
        assert_eq!(t.transact_items.len(), 4);
        assert_eq!(t.transact_items[0], single.transact_items[0], "the dead session's check, as one takeover's");
        assert_eq!(updated_ids(&t), ["c0", "c1", "c2"]);
        let mut first = t.transact_items[1].update.clone().unwrap();
        first.key = single.transact_items[1].update.as_ref().unwrap().key.clone();
        assert_eq!(Some(&first), single.transact_items[1].update.as_ref(), "each Update as one takeover's");
        let leases = done(op.next(at(50).with(Answer::Ok(Output::default()))));
        assert!(leases
            .iter()
            .all(|l| l.as_ref().is_some_and(|l| l.fence == 5 && l.owner == "me" && l.deadline_mono_ms == 19_000)));
        assert_eq!(leases.iter().map(|l| l.as_ref().unwrap().id.clone()).collect::<Vec<_>>(), ["c0", "c1", "c2"]);
    }

    #[test]
    fn a_batch_leaves_what_changed_and_takes_the_rest() {
        // c1 changed since the listing: left to a claim of its own; the rest sent again at once.
        let mut op = TakeOverListed::new(&cfg(), "old", 7, listed(3), &session(19_000)).unwrap();
        op.next(at(5));
        let reasons = vec![
            reason("None", None),
            reason("None", None),
            reason("ConditionalCheckFailed", None),
            reason("None", None),
        ];
        let t = transaction(op.next(at(50).with(Answer::TransactionCanceled { reasons })));
        assert_eq!(updated_ids(&t), ["c0", "c2"]);
        let leases = done(op.next(at(90).with(Answer::Ok(Output::default()))));
        assert_eq!(leases.iter().map(Option::is_some).collect::<Vec<_>>(), [true, false, true]);
        // The dead session's item says it lives: every connection left.
        let mut op = TakeOverListed::new(&cfg(), "old", 7, listed(2), &session(19_000)).unwrap();
        op.next(at(5));
        let reasons = vec![
            reason("ConditionalCheckFailed", Some(session_item(NOW + 7_000, 7))),
            reason("None", None),
            reason("None", None),
        ];
        assert_eq!(done(op.next(at(50).with(Answer::TransactionCanceled { reasons }))), vec![None, None]);
        // A conflict with another transaction, or another Region's write (MRSC): the same
        // transaction again after a pause.
        for conflict in ["TransactionConflict", "ReplicatedWriteConflict"] {
            let mut op = TakeOverListed::new(&cfg(), "old", 7, listed(2), &session(19_000)).unwrap();
            op.next(at(5));
            let reasons = vec![reason("None", None), reason(conflict, None), reason("None", None)];
            assert_eq!(summary(op.next(at(50).with(Answer::TransactionCanceled { reasons }))), "sleep");
            assert_eq!(updated_ids(&transaction(op.next(at(600)))), ["c0", "c1"]);
        }
        // Refused for good (access denied): every connection left, no error.
        let mut op = TakeOverListed::new(&cfg(), "old", 7, listed(2), &session(19_000)).unwrap();
        op.next(at(5));
        assert_eq!(done(op.next(at(50).with(Answer::AccessDenied("no".into())))), vec![None, None]);
        // Past the session's deadline: nothing sent.
        let mut op = TakeOverListed::new(&cfg(), "old", 7, listed(2), &session(19_000)).unwrap();
        assert_eq!(done(op.next(at(19_000))), vec![None, None]);
    }

    #[test]
    fn an_unknown_batch_outcome_is_settled_by_reading_the_connections() {
        let mut op = TakeOverListed::new(&cfg(), "old", 7, listed(2), &session(19_000)).unwrap();
        op.next(at(5));
        let (request, _) = sent(op.next(at(2_000).with(Answer::Ambiguous("timeout".into()))));
        let Request::BatchGetItem(b) = request else { panic!("{request:?}") };
        assert_eq!(b.request_items[&cfg().table_name].consistent_read, Some(true));
        // c0 is ours at the fence the takeover writes; c1 is still the dead session's.
        let mut ours = held_under("me", 3, 5);
        ours.insert("connection_id".into(), s("c0"));
        let mut theirs = held_under("old", 7, 4);
        theirs.insert("connection_id".into(), s("c1"));
        let out = Output {
            responses: Some(std::collections::BTreeMap::from([(cfg().table_name.clone(), vec![ours, theirs])])),
            ..Output::default()
        };
        let leases = done(op.next(at(2_010).with(Answer::Ok(out))));
        assert_eq!((leases[0].as_ref().map(|l| l.fence), leases[1].is_some()), (Some(5), false));
    }

    #[test]
    fn a_batch_takes_1_to_99_connections_held_under_the_dead_session() {
        for n in [0, TAKE_OVER_MAX + 1] {
            let e = TakeOverListed::new(&cfg(), "old", 7, listed(n), &session(19_000)).unwrap_err();
            assert!(matches!(e, Error::InvalidInput { ref field, .. } if field == "listed"), "{e:?}");
        }
        assert_eq!(TAKE_OVER_MAX, 99);
        // Not held under that session (released since, a per-item lease, a repeat): left at once.
        let mut items = listed(3);
        items[1].expires_at_ms = Some(0);
        items[2] = items[0].clone();
        let mut op = TakeOverListed::new(&cfg(), "old", 7, items, &session(19_000)).unwrap();
        assert_eq!(updated_ids(&transaction(op.next(at(5)))), ["c0"]);
        assert_eq!(
            done(op.next(at(50).with(Answer::Ok(Output::default())))).iter().map(Option::is_some).collect::<Vec<_>>(),
            [true, false, false]
        );
    }

    #[test]
    fn a_takeover_refused_or_raced_decides_again() {
        // The old session lives: Held until its expiry.
        let (mut op, _) = takeover();
        let reasons = vec![reason("ConditionalCheckFailed", Some(session_item(NOW + 7_000, 7))), reason("None", None)];
        let e = failed(op.next(at(50).with(Answer::TransactionCanceled { reasons })));
        assert!(
            matches!(e, Error::Held { ref owner, expires_at_ms } if owner == "old" && expires_at_ms == NOW + 7_000),
            "{e:?}"
        );
        // The connection was released in between: claimed as unowned work at once.
        let (mut op, _) = takeover();
        let released = stored("c1", Some("old"), Some(0), 4, Some(DesiredState::Started));
        let reasons = vec![reason("None", None), reason("ConditionalCheckFailed", Some(released))];
        assert_eq!(summary(op.next(at(50).with(Answer::TransactionCanceled { reasons }))), "send UpdateItem");
        // Claimed by a third worker in between (a live per-item lease): Held.
        let (mut op, _) = takeover();
        let taken = stored("c1", Some("x"), Some(NOW + 19_000), 5, Some(DesiredState::Started));
        let reasons = vec![reason("None", None), reason("ConditionalCheckFailed", Some(taken))];
        assert_eq!(summary(op.next(at(50).with(Answer::TransactionCanceled { reasons }))), "fail Held");
        // A transaction conflict, or another Region's write (MRSC): retried after a pause, the
        // same transaction.
        for conflict in ["TransactionConflict", "ReplicatedWriteConflict"] {
            let (mut op, _) = takeover();
            let reasons = vec![reason(conflict, None), reason("None", None)];
            assert_eq!(summary(op.next(at(50).with(Answer::TransactionCanceled { reasons }))), "sleep");
            assert_eq!(summary(op.next(at(600))), "send TransactWriteItems");
        }
        // Ambiguous: a re-read showing our claim is the lease.
        let (mut op, _) = takeover();
        assert_eq!(summary(op.next(at(2_000).with(Answer::Ambiguous("timeout".into())))), "reread");
        let lease = done(op.next(at(2_010).with(ok_item(Some(held_under("me", 3, 5))))));
        assert_eq!(lease.fence, 5);
        // ... one showing it did not land: the decision again, after a pause.
        let (mut op, _) = takeover();
        op.next(at(2_000).with(Answer::Ambiguous("timeout".into())));
        assert_eq!(summary(op.next(at(2_010).with(ok_item(Some(held_under("old", 7, 4)))))), "sleep");
        assert_eq!(summary(op.next(at(2_500))), "send TransactWriteItems");
        // Throttled, access denied, table gone.
        let (mut op, _) = takeover();
        assert_eq!(summary(op.next(at(50).with(Answer::Throttled("slow".into())))), "sleep");
        let (mut op, _) = takeover();
        assert_eq!(summary(op.next(at(50).with(Answer::AccessDenied("no".into())))), "fail AccessDenied");
        let (mut op, _) = takeover();
        assert_eq!(summary(op.next(at(50).with(Answer::ResourceNotFound("gone".into())))), "fail TableNotFound");
    }

    #[test]
    fn sessions_are_a_query_of_the_session_partition() {
        let mut op = Sessions::new(&cfg(), NOW);
        let (request, _) = sent(op.next(at(0)));
        let Request::Query(q) = request else { panic!() };
        assert_eq!(q.index_name.as_deref(), Some(crate::config::DEFAULT_INDEX_NAME));
        assert_eq!(q.key_condition_expression, "#ds = :session AND #exp < :below");
        let mut other = session_item(NOW - 50_000, 2);
        other.insert("connection_id".into(), s("session/a"));
        let page = Output {
            items: Some(vec![session_item(NOW - 9_000, 7)]),
            last_evaluated_key: Some(key(&cfg(), "session/old")),
            ..Output::default()
        };
        let (request, _) = sent(op.next(at(10).with(Answer::Ok(page))));
        let Request::Query(q2) = request else { panic!() };
        assert!(q2.exclusive_start_key.is_some());
        let found = done(op.next(at(20).with(Answer::Ok(Output { items: Some(vec![other]), ..Output::default() }))));
        let owners: Vec<_> = found.iter().map(|s| (s.owner.as_str(), s.epoch)).collect();
        assert_eq!(owners, [("a", 2), ("old", 7)], "oldest first");
    }
}

/// A release is final: a released lease (expiry 0, owner and fence unchanged because nobody
/// claimed since) is not renewed or checkpointed again, on the first answer or on a re-read.
#[test]
fn a_released_lease_is_lost_for_renew_and_checkpoint() {
    let c = short();
    let l = lease(&c);
    let released = || stored("s1", Some("a"), Some(0), 3, None);
    let mut op = Renew::new(&c, &l);
    op.next(at(0));
    op.next(at(5).with(Answer::Ambiguous("t".into())));
    assert!(matches!(failed(op.next(at(6).with(read(Some(released()))))), Error::Lost { .. }));

    let mut op = Checkpoint::new(&c, &l, 5);
    op.next(at(0));
    let old = Answer::ConditionFailed { item: Some(released()) };
    assert!(matches!(failed(op.next(at(5).with(old))), Error::Lost { .. }));
}

#[test]
fn count_by_state_counts_every_page_of_the_index_without_reading_items() {
    let c = cfg().key_prefix("app/");
    let mut op = CountByState::new(&c, DesiredState::Started, Some(NOW));
    let (Request::Query(q), _) = sent(op.next(at(0))) else { panic!("a query") };
    assert_eq!(q.index_name.as_deref(), Some(c.index_name.as_str()));
    assert_eq!(q.select.as_deref(), Some("COUNT"));
    assert_eq!(q.key_condition_expression, "#ds = :state AND #exp >= :min");
    assert_eq!(q.filter_expression.as_deref(), Some("begins_with(#pk, :prefix)"));
    assert_eq!(q.expression_attribute_values[":state"], s(&c.started_partition));
    assert_eq!(q.expression_attribute_values[":prefix"], s("app/"));
    let page = |count, last: Option<Item>| {
        Answer::Ok(Output { count: Some(count), last_evaluated_key: last, ..Output::default() })
    };
    let (Request::Query(next), _) = sent(op.next(at(1).with(page(3, Some(key(&c, "s3")))))) else { panic!("page 2") };
    assert_eq!(next.exclusive_start_key, Some(key(&c, "s3")));
    assert_eq!(summary(op.next(at(2).with(Answer::Throttled("slow".into())))), "sleep");
    op.next(at(60));
    assert_eq!(done(op.next(at(61).with(page(4, Some(Item::new()))))), 7);

    // STOPPED, no bound, no prefix: the stopped partition, nothing filtered.
    let mut op = CountByState::new(&cfg(), DesiredState::Stopped, None);
    let (Request::Query(q), _) = sent(op.next(at(0))) else { panic!("a query") };
    assert_eq!((q.key_condition_expression.as_str(), q.filter_expression), ("#ds = :state", None));
    assert_eq!(q.expression_attribute_values[":state"], s("STOPPED"));
    assert_eq!(done(op.next(at(1).with(page(0, None)))), 0);
}

#[test]
fn sharded_orphan_index_writes_the_shard_and_reads_every_shard() {
    let c = cfg().orphan_shards(4);
    let value = c.started_value("s1");
    assert!(value.starts_with("STARTED#") && value != "STARTED", "{value}");
    // start and the claim of started work write / check the item's own shard value.
    let (Request::UpdateItem(u), _) = sent(Start::new(&c, "s1", "wss://x/s1").unwrap().next(at(0))) else { panic!() };
    assert_eq!(u.expression_attribute_values[":started"], s(&value));
    let (Request::UpdateItem(u), _) = sent(Acquire::started(&c, "s1", "a").unwrap().next(at(0))) else { panic!() };
    assert_eq!(u.expression_attribute_values[":started"], s(&value));
    let mut item = stored("s1", None, Some(0), 0, None);
    item.insert("desired_state".into(), s(&value));
    assert_eq!(super::value::item_from_attrs(&c, &item).desired_state, Some(DesiredState::Started));

    // A page reads the shard the cutoff picks, then (not full, no cursor from DynamoDB) the
    // next one, ... until full, round all of them.
    let first = c.first_orphan_shard(NOW);
    let nth = |i: u32| format!("STARTED#{}", (first + i) % 4);
    let query_of = |step: Step<crate::OrphanPage>| match sent(step) {
        (Request::Query(q), _) => q,
        other => panic!("a query, got {other:?}"),
    };
    let found = |ids: &[&str], last: Option<Item>| {
        let items = ids.iter().map(|id| stored(id, None, Some(1), 0, Some(DesiredState::Started))).collect();
        Answer::Ok(Output { items: Some(items), last_evaluated_key: last, ..Output::default() })
    };
    let mut op = OrphansPage::new(&c, NOW, 3, None);
    let q = query_of(op.next(at(0)));
    assert_eq!((q.expression_attribute_values[":started"].clone(), q.limit), (s(nth(0)), Some(3)));
    let q = query_of(op.next(at(1).with(found(&["a"], None))));
    assert_eq!((q.expression_attribute_values[":started"].clone(), q.limit), (s(nth(1)), Some(2)));
    assert_eq!(q.exclusive_start_key, None);
    let q = query_of(op.next(at(2).with(found(&[], None))));
    assert_eq!((q.expression_attribute_values[":started"].clone(), q.limit), (s(nth(2)), Some(2)));
    // Full inside the third shard: the cursor names it, and the next page resumes there.
    let mut last = key(&c, "c");
    last.insert("lease_expires_at_ms".into(), n(1));
    last.insert("desired_state".into(), s(nth(2)));
    let page = done(op.next(at(3).with(found(&["b", "c"], Some(last)))));
    assert_eq!(page.items.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), ["a", "b", "c"]);
    let cursor = page.next.expect("more may follow");
    assert_eq!((cursor.key.as_str(), cursor.expires_at_ms, cursor.shard), ("c", 1, (first + 2) % 4));
    let mut op = OrphansPage::new(&c, NOW, 3, Some(cursor));
    let q = query_of(op.next(at(0)));
    assert_eq!(q.expression_attribute_values[":started"], s(nth(2)));
    assert_eq!(q.exclusive_start_key.as_ref().unwrap()["desired_state"], s(nth(2)));
    let q = query_of(op.next(at(1).with(found(&[], None))));
    assert_eq!(q.expression_attribute_values[":started"], s(nth(3)));
    // The last shard of the round read to its end: no cursor.
    let page = done(op.next(at(2).with(found(&["d"], None))));
    assert_eq!((page.items.len(), page.next), (1, None));

    // Listings at other cutoffs start elsewhere (workers polling at different moments).
    let starts: std::collections::BTreeSet<u32> = (0..64).map(|k| c.first_orphan_shard(NOW + k * 1_000)).collect();
    assert_eq!(starts.len(), 4, "{starts:?}");

    // Unsharded: one query, as before.
    let mut op = OrphansPage::new(&cfg(), NOW, 3, None);
    assert_eq!(query_of(op.next(at(0))).expression_attribute_values[":started"], s("STARTED"));
    assert_eq!(done(op.next(at(1).with(found(&["a"], None)))).next, None);

    // The count of STARTED work adds every shard's count.
    let mut op = CountByState::new(&c, DesiredState::Started, None);
    let count = |n| Answer::Ok(Output { count: Some(n), ..Output::default() });
    let mut step = op.next(at(0));
    for (k, n) in [1u64, 2, 3, 4].into_iter().enumerate() {
        let (Request::Query(q), _) = sent(step) else { panic!("shard {k}") };
        assert_eq!(q.expression_attribute_values[":state"], s(format!("STARTED#{k}")));
        step = op.next(at(k as u64 + 1).with(count(n)));
    }
    assert_eq!(done(step), 10);
}

#[test]
fn a_replicated_write_conflict_is_contention_retried_within_the_deadline() {
    let c = short();
    assert!(
        matches!(replicated_write_conflict(), Answer::Conflict(m) if m.starts_with("ReplicatedWriteConflictException: "))
    );

    // A claim backs off and asks again; the item then says who holds it: Held, not an error.
    let mut op = Acquire::new(&c, "s1", "a").unwrap();
    op.next(at(0));
    assert_eq!(summary(op.next(at(40).with(replicated_write_conflict()))), "sleep");
    assert_eq!(summary(op.next(at(100))), "send UpdateItem");
    let held = stored("s1", Some("b"), Some(NOW + 3_000), 4, None);
    let err = failed(op.next(at(140).with(Answer::ConditionFailed { item: Some(held) })));
    assert!(matches!(err, Error::Held { ref owner, .. } if owner == "b"), "{err:?}");
    // ... or it lands, its deadline counted from the send that landed.
    let mut op = Acquire::new(&c, "s1", "a").unwrap();
    op.next(at(0));
    op.next(at(40).with(replicated_write_conflict()));
    op.next(at(100));
    let ours = stored("s1", Some("a"), Some(NOW + 3_100), 5, None);
    assert_eq!(done(op.next(at(150).with(new_item(ours)))).deadline_mono_ms, 100 + 2_500);
    // Conflicts for the whole claim budget (one renew interval): throttled, nothing claimed.
    let mut op = Acquire::new(&c, "s1", "a").unwrap();
    op.next(at(0));
    assert!(matches!(failed(op.next(Input::new(NOW, 990, 0.999).with(replicated_write_conflict()))), Error::Throttled));

    // A renewal is retried, not lost: renewed from the send that landed.
    let l = lease(&c); // deadline 2_500
    let mut op = Renew::new(&c, &l);
    op.next(at(1_000));
    assert_eq!(summary(op.next(at(1_060).with(replicated_write_conflict()))), "sleep");
    assert_eq!(summary(op.next(at(1_200))), "send UpdateItem");
    let renewed = done(op.next(at(1_250).with(new_item(stored("s1", Some("a"), Some(NOW + 4_200), 3, None)))));
    assert_eq!(renewed.deadline_mono_ms, 1_200 + 2_500);
    // Lost only when no retry fits before the deadline (rule 2), as under throttling.
    let mut op = Renew::new(&c, &l);
    op.next(at(2_000));
    assert!(matches!(
        failed(op.next(Input::new(NOW, 2_490, 0.999).with(replicated_write_conflict()))),
        Error::Lost { .. }
    ));

    // A fenced write's transaction would list the conflict as a cancellation reason: retried.
    assert_eq!(
        fenced_write::cancellation_verdict(&["None", "ReplicatedWriteConflict"]),
        fenced_write::Cancelled::Retry
    );
}

/// The stranded-work sweep: consistent Scans of the base table, then the owners' session items.
mod stranded {
    use super::*;
    use crate::lease::HELD_UNDER_SESSION_MS;
    use crate::{StrandedPage, SweepCursor};

    const GRACE: u64 = 60_000;

    /// An answer as the SDKs hand it back (DynamoDB's JSON, extra fields and all).
    fn answer(json: serde_json::Value) -> Answer {
        serde_json::from_value(serde_json::json!({ "Ok": json })).unwrap()
    }

    /// A connection held under `owner`'s session `epoch`, as the projection returns it.
    fn held(id: &str, owner: &str, epoch: u64) -> serde_json::Value {
        serde_json::json!({
            "connection_id": {"S": id}, "lease_owner": {"S": owner}, "session_epoch": {"N": epoch.to_string()},
            "lease_expires_at_ms": {"N": HELD_UNDER_SESSION_MS.to_string()}, "desired_state": {"S": "STARTED"},
            "fence": {"N": "4"}
        })
    }

    fn session(owner: &str, epoch: u64, exp: u64) -> serde_json::Value {
        serde_json::json!({
            "connection_id": {"S": format!("session/{owner}")}, "fence": {"N": epoch.to_string()},
            "lease_expires_at_ms": {"N": exp.to_string()}, "desired_state": {"S": "SESSION"}
        })
    }

    fn scan_of<T: std::fmt::Debug>(step: Step<T>) -> Scan {
        match sent(step).0 {
            Request::Scan(scan) => scan,
            other => panic!("expected a Scan, got {other:?}"),
        }
    }

    #[test]
    fn the_sweep_is_a_consistent_scan_of_the_base_table_trimmed_to_held_work_and_sessions() {
        let c = cfg().key_prefix("app/");
        let mut op = Stranded::new(&c, GRACE, None, u64::MAX);
        let (request, _) = sent(op.next(at(0)));
        let json = serde_json::to_value(&request).unwrap();
        let body = &json["Scan"];
        assert_eq!(body["TableName"], "leases");
        assert_eq!(body["ConsistentRead"], true, "never an eventually consistent read");
        assert!(
            body.get("IndexName").is_none() && body.get("Limit").is_none() && body.get("ExclusiveStartKey").is_none()
        );
        assert_eq!(body["ProjectionExpression"], "#pk, #owner, #epoch, #exp, #ds, #fence");
        assert_eq!(
            body["FilterExpression"],
            "begins_with(#pk, :sessions) OR (#exp = :held AND attribute_exists(#owner) AND attribute_exists(#epoch) \
             AND begins_with(#pk, :prefix))"
        );
        assert_eq!(body["ExpressionAttributeNames"]["#epoch"], "session_epoch");
        assert_eq!(body["ExpressionAttributeValues"][":sessions"], serde_json::json!({"S": "app/session/"}));
        assert_eq!(body["ExpressionAttributeValues"][":prefix"], serde_json::json!({"S": "app/"}));
        assert_eq!(
            body["ExpressionAttributeValues"][":held"],
            serde_json::json!({"N": HELD_UNDER_SESSION_MS.to_string()})
        );
        assert_eq!(serde_json::from_value::<Request>(json).unwrap(), request, "round trip");
        // Without a prefix, no prefix condition (begins_with of an empty string is refused).
        let scan = scan_of(Stranded::new(&cfg(), GRACE, None, u64::MAX).next(at(0)));
        assert!(!scan.filter_expression.unwrap().contains(":prefix"));
        assert!(!scan.expression_attribute_values.contains_key(":prefix"));
    }

    #[test]
    fn work_under_a_gone_other_epoch_or_long_dead_session_is_stranded() {
        let mut op = Stranded::new(&cfg(), GRACE, None, u64::MAX);
        op.next(at(0));
        let mut stopped = held("stopped", "gone", 1);
        stopped["desired_state"] = serde_json::json!({"S": "STOPPED"});
        let mut released = held("released", "gone", 1);
        released["lease_expires_at_ms"] = serde_json::json!({"N": "0"});
        let mut per_item = held("per-item", "gone", 1);
        per_item.as_object_mut().unwrap().remove("session_epoch");
        let mut sharded = held("sharded", "gone", 1);
        sharded["desired_state"] = serde_json::json!({"S": "STARTED#3"});
        // Page 1: a live session's work before and after its session item, an old epoch of it,
        // and work of sessions not on this page.
        let first = answer(serde_json::json!({
            "Items": [
                held("a-gone", "gone", 1), held("b-live", "live", 3), held("c-old-epoch", "live", 2),
                session("live", 3, NOW + 10_000), held("d-recent", "recent", 1), held("e-long", "long", 4),
                stopped, released, per_item, sharded
            ],
            "Count": 10, "ScannedCount": 250,
            "LastEvaluatedKey": {"connection_id": {"S": "sharded"}},
            "ResponseMetadata": {"HTTPStatusCode": 200}
        }));
        let scan = scan_of(op.next(at(10).with(first)));
        assert_eq!(scan.exclusive_start_key, Some(key(&cfg(), "sharded")));
        assert_eq!(scan.consistent_read, Some(true));
        // Page 2, the last: more of the live session's work, which is dropped at once.
        let second = answer(serde_json::json!({
            "Items": [held("f-live", "live", 3)], "Count": 1, "ScannedCount": 120
        }));
        let (request, _) = sent(op.next(at(20).with(second)));
        let Request::BatchGetItem(b) = request else { panic!("{request:?}") };
        let ask = &b.request_items["leases"];
        assert_eq!(ask.consistent_read, Some(true));
        assert_eq!(ask.projection_expression.as_deref(), Some("#pk, #exp, #fence"));
        let keys: Vec<&str> = ask.keys.iter().map(|k| k["connection_id"].as_s().unwrap()).collect();
        assert_eq!(keys, ["session/gone", "session/live", "session/long", "session/recent"], "owners left, once each");
        // Read at NOW + 30: dead beyond the grace is an expiry below NOW + 30 - skew - grace.
        let edge = NOW + 30 - 1_000 - GRACE;
        let sessions = answer(serde_json::json!({
            "Responses": {"leases": [
                session("live", 3, NOW + 10_000), session("recent", 1, edge), session("long", 4, edge - 1)
            ]},
            "UnprocessedKeys": {}
        }));
        let page = done(op.next(at(30).with(sessions)));
        assert_eq!(
            page,
            StrandedPage {
                ids: vec!["a-gone".into(), "c-old-epoch".into(), "e-long".into(), "sharded".into()],
                scanned: 370,
                next: None
            },
            "gone, another epoch, dead beyond the grace; not a live session's, nor one dead within the grace, \
             nor stopped, released or per-item work"
        );
    }

    #[test]
    fn a_call_reads_at_most_its_budget_and_says_where_to_go_on() {
        let after = Some(SweepCursor { key: "m".into() });
        let mut op = Stranded::new(&cfg(), GRACE, after, 100);
        let scan = scan_of(op.next(at(0)));
        assert_eq!((scan.limit, scan.exclusive_start_key), (Some(100), Some(key(&cfg(), "m"))));
        let page = |n: u64, last: &str| {
            answer(serde_json::json!({
                "Items": [], "Count": 0, "ScannedCount": n, "LastEvaluatedKey": {"connection_id": {"S": last}}
            }))
        };
        let scan = scan_of(op.next(at(10).with(page(60, "p"))));
        assert_eq!(scan.limit, Some(40), "what is left of the budget");
        // The budget is spent: nothing held was read, so nothing more is sent.
        let done_page = done(op.next(at(20).with(page(40, "t"))));
        assert_eq!(done_page, StrandedPage { ids: vec![], scanned: 100, next: Some(SweepCursor { key: "t".into() }) });
        // The table's end: no cursor.
        let mut op = Stranded::new(&cfg(), GRACE, None, 100);
        op.next(at(0));
        let end = answer(serde_json::json!({"Items": [], "Count": 0, "ScannedCount": 7}));
        assert_eq!(done(op.next(at(10).with(end))).next, None);
    }

    #[test]
    fn other_applications_items_are_not_read_as_ours() {
        let c = cfg().key_prefix("app/");
        let mut op = Stranded::new(&c, GRACE, None, u64::MAX);
        op.next(at(0));
        // Another application's held work, and our work held under a session only another
        // application's table has (ours is gone).
        let first = answer(serde_json::json!({
            "Items": [held("other/x", "w", 1), held("app/ours", "w", 1), session("w", 1, NOW + 10_000)],
            "ScannedCount": 3
        }));
        let (request, _) = sent(op.next(at(10).with(first)));
        let Request::BatchGetItem(b) = request else { panic!("{request:?}") };
        assert_eq!(b.request_items["leases"].keys, vec![key(&c, "session/w")]);
        let page = done(op.next(at(20).with(answer(serde_json::json!({"Responses": {"leases": []}})))));
        assert_eq!(page.ids, ["ours"]);
    }
}
