//! The elector machine on a manual clock: every outcome below is decided by the times passed
//! in, none by a sleep.

use super::*;

const LEASE: u64 = 2_000;
const RENEW: u64 = 500;
const SKEW: u64 = 200;
/// The store's clock: the monotonic clock plus this.
const STORE: u64 = 1_700_000_000_000;

fn setup(race: Race) -> Setup {
    Setup {
        owner: "a".into(),
        race,
        lease_ms: LEASE,
        renew_ms: RENEW,
        skew_ms: SKEW,
        wait_ms: 0,
        retry_delay_ms: 200,
        min_lease_ms: 0,
    }
}

fn leader() -> Race {
    Race::Leader { key: "leader/job".into() }
}

fn elected(strategy: Strategy) -> Race {
    Race::Elected { key: "leader/job".into(), strategy, term_ms: 1_000, heartbeat_ms: 600 }
}

/// The lease a claim or renewal sent at monotonic `sent` gets (fence `fence`).
fn lease(owner: &str, fence: u64, sent: u64) -> Lease {
    Lease {
        id: "leader/job".into(),
        owner: owner.into(),
        fence,
        expires_at_ms: STORE + sent + LEASE,
        last_seq: None,
        url: None,
        desired_state: None,
        deadline_mono_ms: sent + LEASE - SKEW,
    }
}

/// The outputs so far, one short line each.
fn outs(m: &mut Elector) -> Vec<String> {
    std::iter::from_fn(|| m.poll_output())
        .map(|o| match o {
            Output::Send { id, request, until_mono_ms } => {
                let what = match request {
                    Request::Register => "register".to_string(),
                    Request::Candidates => "candidates".to_string(),
                    Request::Claim { key } => format!("claim {key}"),
                    Request::ClaimSlot { key, slots } => format!("claim {key} of {slots}"),
                    Request::Renew { lease } => format!("renew {}", lease.fence),
                    Request::Release { lease } => format!("release {}", lease.fence),
                    Request::Withdraw => "withdraw".to_string(),
                };
                match until_mono_ms {
                    Some(at) => format!("#{id} {what} until {at}"),
                    None => format!("#{id} {what}"),
                }
            }
            Output::Elected { lease } => format!("elected {}", lease.fence),
            Output::Renewed { lease } => format!("renewed to {}", lease.deadline_mono_ms),
            Output::TermOver { reason } => format!("over {reason:?}"),
            Output::Done { ended } => match ended {
                Ended::Led { fence, end } => format!("led {fence} {end:?}"),
                Ended::Skipped { holder } => format!("skipped {holder:?}"),
                Ended::Failed { error } => format!("failed {error}"),
                Ended::Aborted => "aborted".to_string(),
            },
        })
        .collect()
}

fn ok(m: &mut Elector, id: u64, reply: Reply, now: u64) {
    m.handle(Input::Answer { id, result: Ok(reply) }, now);
}

fn err(m: &mut Elector, id: u64, error: Error, now: u64) {
    m.handle(Input::Answer { id, result: Err(error) }, now);
}

fn held(owner: &str) -> Error {
    Error::Held { owner: owner.into(), expires_at_ms: STORE + 5_000 }
}

#[test]
fn a_leader_renews_on_schedule_and_releases_when_its_action_returns() {
    let mut m = Elector::new(setup(leader()), 1, 100);
    assert_eq!(outs(&mut m), ["#1 claim leader/job"]);
    ok(&mut m, 1, Reply::Lease(lease("a", 1, 100)), 110);
    assert_eq!(outs(&mut m), ["elected 1"]);
    // The first renewal is due a renew interval after the claim was sent; given up at the deadline.
    assert_eq!(m.poll_timeout(), Some(600));
    m.handle_timeout(599);
    assert!(outs(&mut m).is_empty());
    m.handle_timeout(600);
    assert_eq!(outs(&mut m), ["#2 renew 1 until 1900"]);
    // While it is in flight only the deadline is timed.
    assert_eq!(m.poll_timeout(), Some(1_900));
    ok(&mut m, 2, Reply::Lease(lease("a", 1, 600)), 620);
    assert_eq!(outs(&mut m), ["renewed to 2400"]);
    assert_eq!(m.poll_timeout(), Some(1_100));
    m.handle(Input::Finished, 700);
    assert_eq!(outs(&mut m), ["over Released", "#3 release 1"]);
    assert!(!m.is_done());
    ok(&mut m, 3, Reply::Done, 710);
    assert_eq!(outs(&mut m), ["led 1 Finished"]);
    assert!(m.is_done() && m.poll_timeout().is_none());
}

#[test]
fn a_held_lease_is_retried_within_the_wait_then_skipped() {
    let mut m = Elector::new(Setup { wait_ms: 1_000, ..setup(leader()) }, 7, 0);
    assert_eq!(outs(&mut m), ["#1 claim leader/job"]);
    err(&mut m, 1, held("b"), 10);
    assert!(outs(&mut m).is_empty());
    let mut id = 1;
    let mut at = 10;
    let mut attempts = 1;
    while let Some(wake) = m.poll_timeout() {
        // A jittered pause between half the retry delay and all of it.
        assert!((at + 100..at + 200).contains(&wake), "{wake} after {at}");
        m.handle_timeout(wake - 1);
        assert!(outs(&mut m).is_empty(), "not before the pause is over");
        m.handle_timeout(wake);
        id += 1;
        attempts += 1;
        assert_eq!(outs(&mut m), [format!("#{id} claim leader/job")]);
        at = wake + 5;
        err(&mut m, id, held("b"), at);
    }
    // Skipped once the next attempt would start after the wait: no later than 1_000.
    assert_eq!(outs(&mut m), ["skipped Some(\"b\")"]);
    assert!(at > 800 && (6..=11).contains(&attempts), "{at} {attempts}");
}

#[test]
fn a_waiting_contender_is_elected_once_the_leader_releases() {
    // The two calls of `a_waiting_contender_runs_once_the_leader_is_done` (core/tests/election.rs)
    // on one manual clock and a one-key store: `a` leads, its action takes 300 ms; `b` waits 3 s
    // with a 50 ms retry delay. `b` is elected after a's release, within one retry delay of it.
    let mut holder: Option<(&str, u64)> = None;
    let mut fence = 0;
    let mut a = Elector::new(setup(leader()), 1, 0);
    let mut b = Elector::new(Setup { owner: "b".into(), wait_ms: 3_000, retry_delay_ms: 50, ..setup(leader()) }, 2, 0);
    assert_eq!(outs(&mut a), ["#1 claim leader/job"]);
    fence += 1;
    holder = holder.or(Some(("a", fence)));
    ok(&mut a, 1, Reply::Lease(lease("a", fence, 0)), 5);
    assert_eq!(outs(&mut a), ["elected 1"]);
    let mut b_at = None;
    let mut released_at = None;
    for now in 5..3_000u64 {
        if now == 300 {
            a.handle(Input::Finished, now);
            assert_eq!(outs(&mut a), ["over Released", "#2 release 1"]);
            holder = None;
            ok(&mut a, 2, Reply::Done, now);
            assert_eq!(outs(&mut a), ["led 1 Finished"]);
            released_at = Some(now);
        }
        if a.poll_timeout().is_some_and(|t| t <= now) {
            a.handle_timeout(now);
            for o in outs(&mut a) {
                assert!(o.starts_with("#") && o.contains("renew"), "{o}");
                let id = o[1..].split(' ').next().unwrap().parse().unwrap();
                ok(&mut a, id, Reply::Lease(lease("a", 1, now)), now);
                assert_eq!(outs(&mut a), [format!("renewed to {}", now + LEASE - SKEW)]);
            }
        }
        if b.poll_timeout().is_some_and(|t| t <= now) {
            b.handle_timeout(now);
        }
        for o in outs(&mut b) {
            if let Some(id) = o.strip_prefix('#').and_then(|o| o.strip_suffix(" claim leader/job")) {
                let id = id.parse().unwrap();
                match holder {
                    Some((owner, _)) => err(&mut b, id, held(owner), now),
                    None => {
                        fence += 1;
                        holder = Some(("b", fence));
                        ok(&mut b, id, Reply::Lease(lease("b", fence, now)), now);
                    }
                }
            } else if o == "elected 2" {
                b_at = Some(now);
            }
        }
        if b_at.is_some() {
            break;
        }
    }
    let (released, elected) = (released_at.unwrap(), b_at.expect("b is elected within its wait"));
    assert!(elected >= released && elected < released + 50, "released at {released}, b elected at {elected}");
}

#[test]
fn the_deadline_ends_a_term_whose_renewal_never_answers() {
    let mut m = Elector::new(setup(leader()), 1, 0);
    outs(&mut m);
    ok(&mut m, 1, Reply::Lease(lease("a", 1, 0)), 20);
    m.handle_timeout(500);
    assert_eq!(outs(&mut m), ["elected 1", "#2 renew 1 until 1800"]);
    m.handle_timeout(1_799);
    assert!(outs(&mut m).is_empty());
    m.handle_timeout(1_800);
    assert_eq!(outs(&mut m), ["over Deadline"]);
    // The late answer changes nothing; the action's return ends the call, nothing released.
    ok(&mut m, 2, Reply::Lease(lease("a", 1, 500)), 1_900);
    m.handle(Input::Finished, 1_950);
    assert_eq!(outs(&mut m), ["led 1 Lost"]);
}

#[test]
fn a_refused_renewal_ends_the_term_at_once_and_a_failed_one_is_retried() {
    let mut m = Elector::new(setup(leader()), 3, 0);
    outs(&mut m);
    ok(&mut m, 1, Reply::Lease(lease("a", 1, 0)), 0);
    m.handle_timeout(500);
    assert_eq!(outs(&mut m), ["elected 1", "#2 renew 1 until 1800"]);
    err(&mut m, 2, Error::Throttled, 520);
    let retry = m.poll_timeout().unwrap();
    assert!((530..=770).contains(&retry), "{retry}");
    m.handle_timeout(retry);
    assert_eq!(outs(&mut m), ["#3 renew 1 until 1800"]);
    err(&mut m, 3, Error::Lost { id: "leader/job".into() }, retry + 10);
    assert_eq!(outs(&mut m), ["over Lost"]);
    assert_eq!(m.poll_timeout(), None, "nothing more is sent");
    m.handle(Input::Finished, retry + 20);
    assert_eq!(outs(&mut m), ["led 1 Lost"]);
}

#[test]
fn the_minimum_lease_is_kept_then_released_or_left_to_run_out() {
    // Lease 2 s, minimum 3 s: renewed past the action's return, then released at 3 s.
    let mut m = Elector::new(Setup { min_lease_ms: 3_000, ..setup(leader()) }, 1, 0);
    outs(&mut m);
    ok(&mut m, 1, Reply::Lease(lease("a", 1, 0)), 0);
    m.handle(Input::Finished, 100);
    assert_eq!(outs(&mut m), ["elected 1"]);
    let mut renewals = 0;
    let now = loop {
        let now = m.poll_timeout().expect("timed");
        m.handle_timeout(now);
        let o = outs(&mut m);
        if o.first().is_some_and(|s| s.starts_with("over")) {
            assert_eq!(o, ["over Released", "#7 release 1"]);
            break now;
        }
        for s in o {
            let id: u64 = s[1..].split(' ').next().unwrap().parse().unwrap();
            // Renewed, but with an expiry short of the minimum (an answer from a lagging store).
            let short = Lease { deadline_mono_ms: now + LEASE - SKEW, ..lease("a", 1, 900) };
            ok(&mut m, id, Reply::Lease(short), now);
            renewals += 1;
            outs(&mut m);
        }
    };
    assert_eq!(renewals, 5, "renewed at 500, 1000, ..., 2500");
    assert_eq!(now, 3_000, "released when the minimum lease has passed");

    // Renewed to an expiry that covers the minimum: left to run out, nothing released.
    let mut m = Elector::new(Setup { min_lease_ms: 2_500, ..setup(leader()) }, 1, 0);
    outs(&mut m);
    ok(&mut m, 1, Reply::Lease(lease("a", 1, 0)), 0);
    m.handle(Input::Finished, 100);
    assert_eq!(m.poll_timeout(), Some(500));
    m.handle_timeout(500);
    assert_eq!(outs(&mut m), ["elected 1", "#2 renew 1 until 1800"]);
    ok(&mut m, 2, Reply::Lease(lease("a", 1, 500)), 510);
    assert_eq!(outs(&mut m), ["renewed to 2300", "over Released", "led 1 Finished"]);
}

#[test]
fn a_strategic_leader_steps_down_at_a_term_boundary_releases_and_withdraws() {
    let mut m = Elector::new(setup(elected(Strategy::HighestScore)), 1, 0);
    assert_eq!(outs(&mut m), ["#1 register"]);
    ok(&mut m, 1, Reply::Done, 10);
    assert_eq!(outs(&mut m), ["#2 candidates"]);
    let alone = vec![Candidate::new("a", 1.0)];
    ok(&mut m, 2, Reply::Candidates(alone.clone()), 20);
    assert_eq!(outs(&mut m), ["#3 claim leader/job"]);
    ok(&mut m, 3, Reply::Lease(lease("a", 1, 20)), 30);
    assert_eq!(outs(&mut m), ["elected 1"]);
    // Renewals and the heartbeat (every ttl / 3 = 600 ms from the registration) go on.
    assert_eq!(m.poll_timeout(), Some(520));
    m.handle_timeout(520);
    assert_eq!(outs(&mut m), ["#4 renew 1 until 1820"]);
    ok(&mut m, 4, Reply::Lease(lease("a", 1, 520)), 530);
    m.handle_timeout(610);
    assert_eq!(outs(&mut m), ["renewed to 2320", "#5 register"]);
    ok(&mut m, 5, Reply::Done, 615);
    // The first boundary, a term after the claim was sent: the strategy still picks `a`.
    m.handle_timeout(1_020);
    assert_eq!(outs(&mut m), ["#6 renew 1 until 2320", "#7 candidates"]);
    ok(&mut m, 6, Reply::Lease(lease("a", 1, 1_020)), 1_025);
    ok(&mut m, 7, Reply::Candidates(alone), 1_030);
    assert_eq!(outs(&mut m), ["renewed to 2820"]);
    // The next one: `b` scores higher. The heartbeat is in flight when the term ends.
    m.handle_timeout(1_215);
    assert_eq!(outs(&mut m), ["#8 register"]);
    m.handle_timeout(2_020);
    let o = outs(&mut m);
    assert!(o.contains(&"#10 candidates".to_string()), "{o:?}");
    ok(&mut m, 10, Reply::Candidates(vec![Candidate::new("a", 1.0), Candidate::new("b", 2.0)]), 2_030);
    assert_eq!(outs(&mut m), ["over SteppedDown"]);
    m.handle(Input::Finished, 2_040);
    assert_eq!(outs(&mut m), ["#11 release 1"]);
    ok(&mut m, 11, Reply::Done, 2_050);
    assert!(outs(&mut m).is_empty(), "the withdrawal waits for the refresh in flight");
    ok(&mut m, 8, Reply::Done, 2_060);
    assert_eq!(outs(&mut m), ["#12 withdraw"]);
    ok(&mut m, 12, Reply::Done, 2_070);
    assert_eq!(outs(&mut m), ["led 1 SteppedDown"]);
}

#[test]
fn a_renewal_answered_late_is_followed_by_what_fell_due_meanwhile_in_the_usual_order() {
    let mut m = Elector::new(setup(elected(Strategy::HighestScore)), 1, 0);
    ok(&mut m, 1, Reply::Done, 10);
    ok(&mut m, 2, Reply::Candidates(vec![Candidate::new("a", 1.0)]), 20);
    ok(&mut m, 3, Reply::Lease(lease("a", 1, 20)), 30);
    m.handle_timeout(520);
    assert_eq!(
        outs(&mut m),
        ["#1 register", "#2 candidates", "#3 claim leader/job", "elected 1", "#4 renew 1 until 1820"]
    );
    // Answered at 1_100: the heartbeat (610), the next renewal (1_020) and the term boundary
    // (1_020) are all due by then; the refresh goes first, then the renewal, then the listing.
    ok(&mut m, 4, Reply::Lease(lease("a", 1, 520)), 1_100);
    assert_eq!(outs(&mut m), ["renewed to 2320", "#5 register", "#6 renew 1 until 2320", "#7 candidates"]);
}

#[test]
fn a_candidate_the_strategy_does_not_pick_is_skipped_with_the_pick_and_withdraws() {
    let mut m = Elector::new(Setup { wait_ms: 250, ..setup(elected(Strategy::HighestScore)) }, 5, 0);
    outs(&mut m);
    ok(&mut m, 1, Reply::Done, 0);
    let better = vec![Candidate::new("a", 1.0), Candidate::new("b", 2.0)];
    let mut id = 2;
    loop {
        assert_eq!(outs(&mut m), [format!("#{id} candidates")]);
        let now = m.now;
        ok(&mut m, id, Reply::Candidates(better.clone()), now);
        id += 1;
        if m.is_done() || matches!(m.phase, Phase::Withdrawing { .. }) {
            break;
        }
        let at = m.poll_timeout().unwrap();
        m.handle_timeout(at);
    }
    assert_eq!(outs(&mut m), [format!("#{id} withdraw")]);
    let now = m.now;
    ok(&mut m, id, Reply::Done, now);
    assert_eq!(outs(&mut m), ["skipped Some(\"b\")"]);
}

#[test]
fn a_failed_claim_ends_the_call_and_an_abort_ends_the_wait() {
    let mut m = Elector::new(setup(Race::Slot { key: "group/etl".into(), slots: 3 }), 1, 0);
    assert_eq!(outs(&mut m), ["#1 claim group/etl of 3"]);
    err(&mut m, 1, Error::Throttled, 5);
    assert_eq!(outs(&mut m), ["failed throttled by the store"]);

    let mut m = Elector::new(Setup { wait_ms: 5_000, ..setup(leader()) }, 1, 0);
    outs(&mut m);
    err(&mut m, 1, held("b"), 5);
    m.handle(Input::Abort, 50);
    assert_eq!(outs(&mut m), ["aborted"]);

    // Aborted in a term: the action is cancelled, the lease then released as after a return.
    let mut m = Elector::new(setup(leader()), 1, 0);
    outs(&mut m);
    ok(&mut m, 1, Reply::Lease(lease("a", 1, 0)), 0);
    m.handle(Input::Abort, 50);
    assert_eq!(outs(&mut m), ["elected 1", "over Aborted"]);
    m.handle(Input::Finished, 60);
    assert_eq!(outs(&mut m), ["#2 release 1"]);
}

mod vectors {
    //! The elector trace vectors (`tests/conformance/elector/`): recorded from the scripted
    //! calls below, replayed here (and by Node's runner through wasm).

    use std::path::PathBuf;

    use super::*;
    use crate::election::vectors::{replay, Recorder, Trace};

    fn dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/conformance/elector")
    }

    /// The id of the request of kind `what` the last step sent.
    fn sent(r: &Recorder, what: &str) -> u64 {
        let found = r.last().iter().find(|o| o["output"] == "send" && o["request"]["request"] == what);
        found.and_then(|o| o["id"].as_u64()).unwrap_or_else(|| panic!("no {what} in {:?}", r.last()))
    }

    fn answer(id: u64, result: Result<Reply, Error>) -> Option<Input> {
        Some(Input::Answer { id, result })
    }

    fn record_all() -> Vec<Trace> {
        let mut all = Vec::new();

        let mut r = Recorder::new(
            "leader_claim_renew_release",
            "A leader claims, renews on the lease's schedule (each renewal given up at the deadline) and releases when its action returns.",
            setup(leader()),
            11,
            100,
        );
        let claim = sent(&r, "claim");
        r.step(110, answer(claim, Ok(Reply::Lease(lease("a", 3, 100)))));
        r.step(600, None);
        let renew = sent(&r, "renew");
        r.step(615, answer(renew, Ok(Reply::Lease(lease("a", 3, 600)))));
        r.step(1_100, None);
        let renew = sent(&r, "renew");
        r.step(1_120, answer(renew, Ok(Reply::Lease(lease("a", 3, 1_100)))));
        r.step(1_300, Some(Input::Finished));
        let release = sent(&r, "release");
        r.step(1_310, answer(release, Ok(Reply::Done)));
        all.push(r.finish());

        let mut r = Recorder::new(
            "leader_held_for_the_whole_wait",
            "Another owner holds the lease: retried after jittered pauses of half the retry delay to all of it, skipped (naming the holder) once the next attempt would start after the wait.",
            Setup { wait_ms: 600, ..setup(leader()) },
            12,
            0,
        );
        let mut at = 0;
        while !r.machine().is_done() {
            let claim = sent(&r, "claim");
            r.step(at + 8, answer(claim, Err(held("b"))));
            if let Some(wake) = r.machine().poll_timeout() {
                at = wake;
                r.step(at, None);
            }
        }
        all.push(r.finish());

        let mut r = Recorder::new(
            "leader_renewal_refused",
            "A renewal fails (throttled) and is retried with jitter; the retry is refused (Lost): the term is over at once and nothing more is sent or released.",
            setup(leader()),
            13,
            0,
        );
        let claim = sent(&r, "claim");
        r.step(5, answer(claim, Ok(Reply::Lease(lease("a", 1, 0)))));
        r.step(500, None);
        let renew = sent(&r, "renew");
        r.step(520, answer(renew, Err(Error::Throttled)));
        let retry = r.machine().poll_timeout().unwrap();
        r.step(retry, None);
        let renew = sent(&r, "renew");
        r.step(retry + 10, answer(renew, Err(Error::Lost { id: "leader/job".into() })));
        r.step(retry + 40, Some(Input::Finished));
        all.push(r.finish());

        let mut r = Recorder::new(
            "leader_deadline_without_an_answer",
            "A renewal never answers: the term is over at the deadline (sent_at + lease - skew of the claim), and the late answer changes nothing.",
            setup(leader()),
            14,
            0,
        );
        let claim = sent(&r, "claim");
        r.step(20, answer(claim, Ok(Reply::Lease(lease("a", 2, 0)))));
        r.step(500, None);
        let renew = sent(&r, "renew");
        r.step(1_799, None);
        r.step(1_800, None);
        r.step(1_900, answer(renew, Ok(Reply::Lease(lease("a", 2, 500)))));
        r.step(1_950, Some(Input::Finished));
        all.push(r.finish());

        let mut r = Recorder::new(
            "minimum_lease_kept_then_released",
            "A 3 s minimum lease on a 2 s lease: the action returns at once, the lease is renewed until the minimum has passed, then released.",
            Setup { min_lease_ms: 3_000, ..setup(leader()) },
            15,
            0,
        );
        let claim = sent(&r, "claim");
        r.step(0, answer(claim, Ok(Reply::Lease(lease("a", 1, 0)))));
        r.step(100, Some(Input::Finished));
        while !r.machine().is_done() {
            let at = r.machine().poll_timeout().unwrap();
            r.step(at, None);
            if r.last().iter().any(|o| o["request"]["request"] == "release") {
                let release = sent(&r, "release");
                r.step(at + 5, answer(release, Ok(Reply::Done)));
            } else if r.last().iter().any(|o| o["request"]["request"] == "renew") {
                let renew = sent(&r, "renew");
                // Renewed with an expiry short of the minimum (a lagging store's answer).
                let short = Lease { deadline_mono_ms: at + LEASE - SKEW, ..lease("a", 1, 900) };
                r.step(at + 5, answer(renew, Ok(Reply::Lease(short))));
            }
        }
        all.push(r.finish());

        let mut r = Recorder::new(
            "strategic_step_down_at_a_term_boundary",
            "A strategic call registers, lists, competes and leads; its registration is refreshed every ttl / 3; at the second term boundary a better candidate is listed: the term is over, the lease released, then (once the refresh in flight has answered) the candidate withdrawn.",
            setup(elected(Strategy::HighestScore)),
            16,
            0,
        );
        r.step(10, answer(1, Ok(Reply::Done)));
        r.step(20, answer(sent(&r, "candidates"), Ok(Reply::Candidates(vec![Candidate::new("a", 1.0)]))));
        r.step(30, answer(sent(&r, "claim"), Ok(Reply::Lease(lease("a", 1, 20)))));
        r.step(520, None);
        r.step(530, answer(sent(&r, "renew"), Ok(Reply::Lease(lease("a", 1, 520)))));
        r.step(610, None);
        r.step(615, answer(sent(&r, "register"), Ok(Reply::Done)));
        r.step(1_020, None);
        let (renew, listing) = (sent(&r, "renew"), sent(&r, "candidates"));
        r.step(1_025, answer(renew, Ok(Reply::Lease(lease("a", 1, 1_020)))));
        r.step(1_030, answer(listing, Ok(Reply::Candidates(vec![Candidate::new("a", 1.0)]))));
        r.step(1_215, None);
        let refresh = sent(&r, "register");
        r.step(1_520, None);
        r.step(1_525, answer(sent(&r, "renew"), Ok(Reply::Lease(lease("a", 1, 1_520)))));
        r.step(2_020, None);
        let better = vec![Candidate::new("a", 1.0), Candidate::new("b", 2.0)];
        r.step(2_030, answer(sent(&r, "candidates"), Ok(Reply::Candidates(better))));
        r.step(2_040, Some(Input::Finished));
        r.step(2_050, answer(sent(&r, "release"), Ok(Reply::Done)));
        r.step(2_060, answer(refresh, Ok(Reply::Done)));
        r.step(2_070, answer(sent(&r, "withdraw"), Ok(Reply::Done)));
        all.push(r.finish());

        let mut r = Recorder::new(
            "slot_claim_then_abort",
            "A group call claims a slot; the caller aborts while the action runs: the term is over (Aborted), renewals go on until the action returns, then the lease is released as after any return.",
            setup(Race::Slot { key: "group/etl".into(), slots: 3 }),
            17,
            0,
        );
        let slot = Lease { id: "group/etl#slot-2".into(), ..lease("a", 4, 0) };
        r.step(6, answer(sent(&r, "claim_slot"), Ok(Reply::Lease(slot.clone()))));
        r.step(300, Some(Input::Abort));
        r.step(500, None);
        let renewed = Lease { id: "group/etl#slot-2".into(), ..lease("a", 4, 500) };
        r.step(510, answer(sent(&r, "renew"), Ok(Reply::Lease(renewed))));
        r.step(700, Some(Input::Finished));
        r.step(705, answer(sent(&r, "release"), Ok(Reply::Done)));
        all.push(r.finish());

        let mut r = Recorder::new(
            "strategic_not_picked_for_the_whole_wait",
            "A strategic call the strategy never picks lists the candidates before every attempt and never claims; once the next attempt would start after the wait it withdraws and is skipped, naming the pick.",
            Setup { wait_ms: 400, ..setup(elected(Strategy::LeastLoaded)) },
            18,
            0,
        );
        r.step(4, answer(1, Ok(Reply::Done)));
        let listed = vec![Candidate::new("a", 1.0).load(0.9), Candidate::new("c", 1.0).load(0.1)];
        while !r.machine().is_done() {
            if let Some(o) = r.last().iter().find(|o| o["output"] == "send") {
                let id = o["id"].as_u64().unwrap();
                let at = r.machine().now + 3;
                match o["request"]["request"].as_str() {
                    Some("candidates") => r.step(at, answer(id, Ok(Reply::Candidates(listed.clone())))),
                    _ => r.step(at, answer(id, Ok(Reply::Done))),
                };
            } else {
                let at = r.machine().poll_timeout().unwrap();
                r.step(at, None);
            }
        }
        all.push(r.finish());

        all
    }

    #[test]
    fn elector_trace_vectors_replay() {
        let dir = dir();
        let recorded = record_all();
        for t in &recorded {
            // Every scripted call runs to its end.
            let last = t.steps.last().map(|s| s.expect.clone()).unwrap_or_default();
            assert!(last.iter().any(|o| o["output"] == "done"), "{} does not end: {last:?}", t.name);
        }
        crate::trace_vector::replay_vectors(&dir, &recorded, |t| &t.name, replay);
    }
}
