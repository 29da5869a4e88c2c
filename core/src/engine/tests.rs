//! The engine on a manual clock: a fleet of engines on the memory store ([`super::sim`]).

use std::time::Duration;

use super::decide::CancelReason;
use super::sim::{block_on, Sim};
use super::trace::{replay, Recorder, Trace};
use super::*;
use crate::{Clock, LeaseStore, TableConfig};

const START: u64 = 1_700_000_000_000;

/// The design's defaults, with a 1 s long poll (the tests' hints arrive within one).
fn settings(id: &str, max: usize) -> Settings {
    Settings { hint_wait_ms: 1_000, ..Settings::new(id, max) }
}

fn config(mode: LeaseMode, lease_ms: u64, renew_ms: u64, skew_ms: u64) -> TableConfig {
    let ms = Duration::from_millis;
    let mut c =
        TableConfig::new("leaselock").lease_duration(ms(lease_ms)).renew_interval(ms(renew_ms)).clock_skew(ms(skew_ms));
    c.mode = mode;
    c.validated().unwrap()
}

fn start_work(sim: &Sim, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let id = format!("s{i:03}");
            block_on(sim.store.start(&id, "wss://feed.example")).unwrap();
            id
        })
        .collect()
}

#[test]
fn per_item_claims_renews_and_releases_everything_at_shutdown() {
    let mut sim = Sim::new(config(LeaseMode::PerItem, 20_000, 5_000, 1_000), START);
    let ids = start_work(&sim, 5);
    let w = sim.spawn(Settings { hints: true, ..settings("a", 10) }, 1);
    assert!(sim.run_while(10_000, 100, |s| s.running(w) == 5), "claims the orphans");
    sim.run_until(60_000);
    let snap = sim.nodes[w].engine.snapshot();
    assert_eq!((snap.held, snap.acquired, snap.leases_lost), (ids.clone(), 5, 0));
    // Renewed on schedule: about one renewal per 5 s per lease, the fences untouched.
    let renewals = sim.ops["renew"];
    assert!((50..=65).contains(&renewals), "{renewals} renewals");
    assert!(sim.cancels(CancelReason::Deadline).is_empty());
    sim.shutdown(w);
    assert!(sim.run_while(70_000, 10, |s| s.nodes[w].finished), "finishes");
    for id in &ids {
        assert_eq!(sim.holder_of(id), None, "{id} released");
    }
    let hinted = sim.log.iter().filter(|e| matches!(e.command, Command::SendHint { .. })).count();
    assert_eq!((sim.nodes[w].engine.snapshot().released, hinted), (5, 5));
}

/// A claim whose answer arrives after a session renewal must act until the renewed deadline:
/// before the engine covered claims in flight, each such claim was cancelled with `Deadline`
/// 0.3-1 s after it was claimed while the session was live.
#[test]
fn a_claim_answered_after_a_session_renewal_acts_until_the_renewed_deadline() {
    let mut sim = Sim::new(config(LeaseMode::Session, 3_000, 1_000, 500), START);
    sim.behaviour.claim_answer_delay_ms = 2_400;
    start_work(&sim, 3);
    let w = sim.spawn(settings("a", 10), 7);
    sim.run_until(10_000);
    assert!(sim.cancels(CancelReason::Deadline).is_empty(), "{:?}", sim.cancels(CancelReason::Deadline));
    let snap = sim.nodes[w].engine.snapshot();
    assert_eq!((snap.held.len(), snap.acquired, snap.leases_lost), (3, 3, 0));
}

#[test]
fn no_lease_is_cancelled_by_its_deadline_while_renewed_in_either_mode() {
    for mode in [LeaseMode::PerItem, LeaseMode::Session] {
        let mut sim = Sim::new(config(mode, 3_000, 1_000, 500), START);
        sim.behaviour.latency_ms = 200;
        sim.behaviour.claim_answer_delay_ms = 900;
        start_work(&sim, 40);
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            sim.spawn(settings(name, 30), i as u64);
        }
        sim.run_until(60_000);
        assert!(sim.cancels(CancelReason::Deadline).is_empty(), "{mode:?}");
        let held: usize = (0..3).map(|w| sim.running(w)).sum();
        assert_eq!(held, 40, "{mode:?}");
    }
}

#[test]
fn a_crashed_workers_work_is_held_again_within_lease_skew_and_3_s() {
    for mode in [LeaseMode::PerItem, LeaseMode::Session] {
        let mut sim = Sim::new(config(mode, 3_000, 1_000, 500), START);
        let ids = start_work(&sim, 30);
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            sim.spawn(settings(name, 30), i as u64 + 10);
        }
        assert!(sim.run_while(20_000, 100, |s| ids.iter().all(|id| s.running_on(id).len() == 1)));
        sim.run_until(30_000);
        let lost: Vec<String> = ids.iter().filter(|id| sim.running_on(id) == vec![0]).cloned().collect();
        assert!(!lost.is_empty());
        sim.crash(0);
        let crashed_at = sim.clock.monotonic_ms();
        let bound = 3_000 + 500 + 3_000;
        let back = sim.run_while(crashed_at + 20_000, 50, |s| ids.iter().all(|id| s.running_on(id).len() == 1));
        let took = sim.clock.monotonic_ms() - crashed_at;
        assert!(back && took <= bound, "{mode:?}: {took} ms");
        // Never two owners acting at once.
        assert!(ids.iter().all(|id| sim.running_on(id).len() <= 1));
    }
}

/// A peer session that stops renewing is taken over once its expiry is past the skew, not at
/// the survivors' next orphan poll (10 s apart here), and each of its connections is claimed
/// with the item as it was listed under it (the takeover is the claim's first request), the
/// survivors starting with different connections.
#[test]
fn a_dead_session_is_taken_over_when_it_expires_not_at_the_next_poll() {
    let mut sim = Sim::new(config(LeaseMode::Session, 5_000, 1_250, 250), START);
    let ids = start_work(&sim, 30);
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        sim.spawn(Settings { orphan_interval_ms: 10_000, ..settings(name, 30) }, i as u64 + 40);
    }
    assert!(sim.run_while(60_000, 100, |s| ids.iter().all(|id| s.running_on(id).len() == 1)));
    sim.run_until(sim.clock.monotonic_ms() + 3_333);
    let held: Vec<String> = ids.iter().filter(|id| sim.running_on(id) == vec![0]).cloned().collect();
    assert!(!held.is_empty());
    sim.crash(0);
    let crashed_at = sim.clock.monotonic_ms();
    let session = block_on(sim.store.sessions(u64::MAX)).unwrap().into_iter().find(|s| s.owner == "a").unwrap();
    // When a survivor may take it over (its wall clock is the store's here), on the monotonic clock.
    let dies_at = crashed_at + (session.expires_at_ms + 250 + 1 - sim.clock.now_ms());
    assert!(sim.run_while(crashed_at + 30_000, 10, |s| held.iter().all(|id| s.running_on(id).len() == 1)));
    let claims: Vec<(u64, bool)> = sim
        .log
        .iter()
        .filter(|e| e.at_mono_ms > crashed_at)
        .flat_map(|e| claims_sent(&e.command).into_iter().map(move |c| (e.at_mono_ms, c)))
        .filter(|(_, (id, _))| held.contains(id))
        .map(|(at, (_, listed_under))| (at, listed_under.as_deref() == Some("a")))
        .collect();
    // Each survivor's takeovers go out together: transactions of several.
    let transactions = sim
        .log
        .iter()
        .filter(|e| e.at_mono_ms > crashed_at && matches!(e.command, Command::Run { request: Op::TakeOver { .. }, .. }))
        .count();
    assert!((1..held.len()).contains(&transactions), "{transactions} transactions for {}", held.len());
    // Every claim starts from the listing, and the survivors take different connections
    // (rendezvous ranking, each from its own end): one claim per connection. In a random order
    // of each survivor's own they made 23 claims for these 19; taking their own first, 20.
    assert!(claims.iter().all(|(_, listed)| *listed), "{claims:?}");
    assert_eq!(claims.len(), held.len(), "{claims:?}");
    let first = claims.iter().map(|(at, _)| *at).min().unwrap();
    // The reads before the claims: orphan page, sessions, the owner index (5 ms each).
    assert!((dies_at..=dies_at + 100).contains(&first), "first claim {first}, takeover possible from {dies_at}");
}

#[test]
fn a_session_worker_ends_its_session_once_every_handler_has_returned_then_hints() {
    let mut sim = Sim::new(config(LeaseMode::Session, 3_000, 1_000, 500), START);
    let ids = start_work(&sim, 4);
    let w = sim.spawn(Settings { hints: true, ..settings("a", 10) }, 3);
    assert!(sim.run_while(10_000, 50, |s| s.running(w) == 4));
    sim.behaviour.handler_stop_ms = 700;
    sim.shutdown(w);
    assert!(sim.run_while(20_000, 10, |s| s.nodes[w].finished));
    let at = |pred: &dyn Fn(&Command) -> bool| {
        sim.log.iter().filter(|e| pred(&e.command)).map(|e| e.at_mono_ms).collect::<Vec<_>>()
    };
    let ended = at(&|c| matches!(c, Command::Run { request: Op::EndSession { .. }, .. }));
    let forgotten = at(&|c| matches!(c, Command::Forget { .. }));
    let hinted = at(&|c| matches!(c, Command::SendHint { .. }));
    assert_eq!((ended.len(), forgotten.len(), hinted.len()), (1, 4, 4));
    assert!(forgotten.iter().all(|t| *t <= ended[0]) && hinted.iter().all(|t| *t >= ended[0]));
    // No per-connection release: the one session write freed them.
    assert_eq!(sim.ops.get("release"), None);
    for id in &ids {
        let item = block_on(sim.store.get(id)).unwrap().unwrap();
        assert!(item.holder_at(sim.clock.now_ms()).is_some(), "the sentinel stays; the session is what ended");
    }
    let sessions = block_on(sim.store.sessions(u64::MAX)).unwrap();
    assert_eq!(
        sessions.iter().map(|s| (s.expires_at_ms, s.load.map(|l| l.held))).collect::<Vec<_>>(),
        vec![(0, Some(4))]
    );
}

#[test]
fn a_handler_that_ignores_its_cancellation_is_aborted_after_the_grace() {
    let mut sim = Sim::new(config(LeaseMode::PerItem, 20_000, 5_000, 1_000), START);
    start_work(&sim, 2);
    sim.behaviour.stubborn = vec!["s000".into()];
    let w = sim.spawn(Settings { handler_grace_ms: 1_500, ..settings("a", 10) }, 5);
    assert!(sim.run_while(10_000, 50, |s| s.running(w) == 2));
    sim.shutdown(w);
    let asked = sim.clock.monotonic_ms();
    assert!(sim.run_while(asked + 10_000, 10, |s| s.nodes[w].finished));
    let aborted: Vec<_> =
        sim.log.iter().filter(|e| matches!(&e.command, Command::AbortHandler { id } if id == "s000")).collect();
    assert_eq!(aborted.len(), 1);
    assert_eq!(aborted[0].at_mono_ms - asked, 1_500);
    assert_eq!(sim.nodes[w].engine.snapshot().released, 2);
}

#[test]
fn stopped_work_is_cancelled_within_one_desired_state_interval_and_released() {
    let mut sim = Sim::new(config(LeaseMode::PerItem, 20_000, 5_000, 1_000), START);
    start_work(&sim, 3);
    let w = sim.spawn(settings("a", 10), 9);
    assert!(sim.run_while(10_000, 50, |s| s.running(w) == 3));
    block_on(sim.store.stop("s001")).unwrap();
    let at = sim.clock.monotonic_ms();
    assert!(sim.run_while(at + 12_000, 50, |s| s.running(w) == 2));
    let stopped = sim.cancels(CancelReason::Stopped);
    assert_eq!(stopped.len(), 1);
    assert!(stopped[0].0 - at <= 10_000);
    assert_eq!(sim.holder_of("s001"), None);
}

#[test]
fn hints_are_claimed_at_once_and_a_full_worker_leaves_the_rest_on_the_queue() {
    let mut sim = Sim::new(config(LeaseMode::PerItem, 20_000, 5_000, 1_000), START);
    let w = sim.spawn(Settings { hints: true, orphan_interval_ms: 60_000, ..settings("a", 2) }, 4);
    sim.run_until(70_000);
    let ids = start_work(&sim, 3);
    for id in &ids {
        sim.send_hint(id);
    }
    let at = sim.clock.monotonic_ms();
    assert!(sim.run_while(at + 3_000, 10, |s| s.running(w) == 2), "claimed from the hints, not the index");
    assert!(sim.clock.monotonic_ms() - at < 1_100, "within one long poll");
    sim.run_until(at + 30_000);
    // Full: it takes no more hints; the third waits for another worker.
    assert_eq!((sim.hints_waiting(), sim.nodes[w].engine.snapshot().hints_received), (1, 2));
}

/// A lone balanced session worker at a share of 0 (no work yet) takes new work its hints name
/// at once: the ids a hint names are work nobody holds, not hints to defer by an orphan interval.
#[test]
fn a_lone_balanced_worker_takes_hinted_new_work_without_deferring_the_hints() {
    let mut sim = Sim::new(config(LeaseMode::Session, 3_000, 1_000, 500), START);
    let w = sim.spawn(Settings { hints: true, orphan_interval_ms: 60_000, ..settings("a", 10) }, 4);
    sim.run_until(5_000);
    assert_eq!(sim.nodes[w].engine.snapshot().claim_limit, Some(0), "no work: a share of 0");
    let ids = start_work(&sim, 2);
    for id in &ids {
        sim.send_hint(id);
    }
    let at = sim.clock.monotonic_ms();
    assert!(sim.run_while(at + 3_000, 10, |s| s.running(w) == 2), "claimed at once");
    sim.run_until(at + 5_000);
    let deferred: usize = sim
        .log
        .iter()
        .map(|e| match &e.command {
            Command::SettleHints { defer, .. } => defer.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(deferred, 0, "no hint deferred");
}

/// A session worker's graceful end hints its work once the session is ended: the survivor's
/// hints name the ended session: its work is read and taken as listed (the takeover transaction
/// first, sent together), not one claim per hint that the session's sentinel refuses first.
#[test]
fn a_graceful_session_ends_work_is_taken_as_listed_not_one_claim_per_hint() {
    let mut sim = Sim::new(config(LeaseMode::Session, 3_000, 1_000, 500), START);
    sim.behaviour.latency_ms = 20;
    start_work(&sim, 12);
    let a = sim.spawn(Settings { hints: true, orphan_interval_ms: 1_000, ..settings("a", 100) }, 1);
    let b = sim.spawn(Settings { hints: true, orphan_interval_ms: 1_000, ..settings("b", 100) }, 2);
    assert!(sim.run_while(60_000, 10, |s| s.running(a) == 6 && s.running(b) == 6), "balanced");
    sim.run_until(sim.clock.monotonic_ms() + 3_000);
    let left = sim.held_only_by(b);
    assert_eq!(left.len(), 6);
    let from = sim.log.len();
    let hinted = sim.nodes[a].engine.snapshot().hints_received;
    sim.shutdown(b);
    let at = sim.clock.monotonic_ms();
    assert!(sim.run_while(at + 5_000, 5, |s| s.running(a) == 12), "a holds all 12");
    let claims: Vec<(String, bool)> = sim.log[from..]
        .iter()
        .filter(|e| e.worker == a)
        .flat_map(|e| claims_sent(&e.command))
        .map(|(id, listed_under)| (id, listed_under.is_some()))
        .collect();
    let mut claimed: Vec<&String> = claims.iter().map(|(id, _)| id).collect();
    claimed.sort();
    assert_eq!(claimed, left.iter().collect::<Vec<_>>(), "one claim each: {claims:?}");
    assert!(claims.iter().all(|(_, listed)| *listed), "every claim as listed: {claims:?}");
    // The hints of b's end came (a batch's first started the round that took the work).
    assert!(sim.nodes[a].engine.snapshot().hints_received > hinted, "the hints came");
}

/// A worker that ends its session hints its work naming that session ([`crate::Hint::ended`]):
/// each survivor a hint reaches reads the item and takes it over as listed, a batch's hints in
/// one transaction, with no orphan round, no read of the sessions and no listing of the owner
/// index. A deploy's hints reach every worker at once, and the sessions are one partition value
/// the whole fleet reads.
#[test]
fn hints_of_an_ended_session_are_taken_over_as_read_with_no_read_of_the_sessions() {
    let mut sim = Sim::new(config(LeaseMode::Session, 3_000, 1_000, 500), START);
    sim.behaviour.latency_ms = 20;
    let ids = start_work(&sim, 40);
    let with = |id: &str| Settings { hints: true, orphan_interval_ms: 10_000, ..settings(id, 100) };
    let workers: Vec<usize> =
        ["a", "b", "c", "d"].iter().enumerate().map(|(i, id)| sim.spawn(with(id), i as u64 + 1)).collect();
    let balanced = |s: &Sim| s.all_held_once(&ids) && workers.iter().all(|w| s.running(*w) >= 8);
    assert!(sim.run_while(180_000, 10, balanced), "balanced");
    let (leaving, survivors) = (workers[3], &workers[..3]);
    let left = sim.held_only_by(leaving);
    assert!(!left.is_empty());
    let from = sim.log.len();
    sim.shutdown(leaving);
    let at = sim.clock.monotonic_ms();
    let handed = |s: &Sim| s.nodes[leaving].finished && survivors.iter().map(|w| s.running(*w)).sum::<usize>() == 40;
    assert!(sim.run_while(at + 5_000, 5, handed), "the survivors hold all 40");
    let took = sim.clock.monotonic_ms() - at;
    let runs: Vec<&Op> = sim.log[from..]
        .iter()
        .filter(|e| survivors.contains(&e.worker))
        .filter_map(|e| match &e.command {
            Command::Run { request, .. } => Some(request),
            _ => None,
        })
        .collect();
    let count = |pred: &dyn Fn(&Op) -> bool| runs.iter().filter(|o| pred(o)).count();
    assert_eq!(count(&|o| matches!(o, Op::Sessions | Op::OwnedBy { .. } | Op::OrphansPage { .. })), 0, "{runs:?}");
    assert_eq!(count(&|o| matches!(o, Op::Get { .. })), left.len(), "one read of each hinted item");
    let claims: Vec<(String, Option<String>)> = sim.log[from..]
        .iter()
        .filter(|e| survivors.contains(&e.worker))
        .flat_map(|e| claims_sent(&e.command))
        .collect();
    let mut claimed: Vec<&String> = claims.iter().map(|(id, _)| id).collect();
    claimed.sort();
    assert_eq!(claimed, left.iter().collect::<Vec<_>>(), "one claim each: {claims:?}");
    assert!(claims.iter().all(|(_, under)| under.as_deref() == Some("d")), "every claim as listed under d: {claims:?}");
    let transactions = count(&|o| matches!(o, Op::TakeOver { .. }));
    assert!((1..left.len()).contains(&transactions), "{transactions} takeover transactions for {}", left.len());
    // The end, the hints' long polls, the reads and the transactions: a few latencies.
    assert!(took <= 500, "handed over in {took} ms");
}

/// The claims a command sends: one, or those of a takeover transaction; with the owner of the
/// dead session each was listed under.
fn claims_sent(command: &Command) -> Vec<(String, Option<String>)> {
    match command {
        Command::Run { request: Op::Claim { id, listed, .. }, .. } => {
            vec![(id.clone(), listed.as_ref().and_then(|l| l.item.owner.clone()))]
        }
        Command::Run { request: Op::TakeOver { owner, listed, .. }, .. } => {
            listed.iter().map(|item| (item.id.clone(), Some(owner.clone()))).collect()
        }
        _ => Vec::new(),
    }
}

fn drain(engine: &mut Engine) -> Vec<Command> {
    std::iter::from_fn(|| engine.poll_command()).collect()
}

fn hint(receipt: &str, id: &str) -> HintMessage {
    HintMessage { receipt: receipt.into(), body: Some(crate::Hint::new(id).to_json()) }
}

fn receives(cmds: &[Command]) -> usize {
    cmds.iter().filter(|c| matches!(c, Command::ReceiveHints { .. })).count()
}

fn claim_of(cmds: &[Command], want: &str) -> Option<OpId> {
    cmds.iter().find_map(|c| match c {
        Command::Run { op, request: Op::Claim { id, .. } } if id == want => Some(*op),
        _ => None,
    })
}

fn held_by_b(op: OpId) -> Event {
    Event::Answer {
        op,
        answer: Answer::Failed(crate::Error::Held { owner: "b".into(), expires_at_ms: START + 20_000 }),
    }
}

fn hinting_engine() -> Engine {
    let now = Now { wall_ms: START, mono_ms: 0 };
    let cfg = config(LeaseMode::PerItem, 20_000, 5_000, 1_000);
    let mut e = Engine::new(Settings { hints: true, orphan_interval_ms: 60_000, ..settings("a", 10) }, cfg, 1, now);
    assert_eq!(receives(&drain(&mut e)), 1, "the first long poll");
    e
}

/// A batch of hints answered within the overlap runs one long poll at a time: the next poll
/// opens as the batch is settled, not before (an idle worker signalled right after a hint has
/// no poll in flight, so it exits at once).
#[test]
fn a_quick_batch_of_hints_opens_the_next_long_poll_when_it_is_settled() {
    let mut e = hinting_engine();
    let at = |ms| Now { wall_ms: START + ms, mono_ms: ms };
    e.handle(Event::Hints { received: Ok(vec![hint("r1", "s1")]) }, at(10));
    let first = drain(&mut e);
    let s1 = claim_of(&first, "s1").expect("s1 claimed");
    assert_eq!(receives(&first), 0, "{first:?}");
    e.handle(held_by_b(s1), at(10 + HINT_POLL_OVERLAP_MS - 1));
    let settled = drain(&mut e);
    assert!(settled.iter().any(|c| matches!(c, Command::SettleHints { .. })), "{settled:?}");
    assert_eq!(receives(&settled), 1, "the next poll with the settle: {settled:?}");
}

/// A batch whose claims wait on a slow table opens the next long poll after the overlap: a
/// hint released meanwhile (a hand-over trickling in) is received and claimed at once, not
/// after the batch; both are settled together once every claim is answered.
#[test]
fn a_slow_batch_of_hints_opens_the_next_long_poll_after_the_overlap() {
    let (mut e, s1) = slow_batch();
    let at = |ms| Now { wall_ms: START + ms, mono_ms: ms };
    e.handle(Event::Hints { received: Ok(vec![hint("r2", "s2")]) }, at(HINT_POLL_OVERLAP_MS + 5));
    let second = drain(&mut e);
    let s2 = claim_of(&second, "s2").expect("s2 claimed while s1's claim is in flight");
    e.handle(held_by_b(s1), at(400));
    assert!(!drain(&mut e).iter().any(|c| matches!(c, Command::SettleHints { .. })), "settled with s2's answer");
    e.handle(held_by_b(s2), at(410));
    let settled = drain(&mut e);
    let Some(Command::SettleHints { delete, .. }) = settled.iter().find(|c| matches!(c, Command::SettleHints { .. }))
    else {
        panic!("settled: {settled:?}")
    };
    assert_eq!(delete, &vec!["r1".to_string(), "r2".to_string()]);
    // The poll held back since r2 arrived opens with the settle.
    assert_eq!(receives(&settled), 1, "{settled:?}");
}

/// An engine whose batch of one hint (s1, its claim op returned) is still unanswered when the
/// overlap has passed, and the next long poll that opened then.
fn slow_batch() -> (Engine, OpId) {
    let mut e = hinting_engine();
    let at = |ms| Now { wall_ms: START + ms, mono_ms: ms };
    e.handle(Event::Hints { received: Ok(vec![hint("r1", "s1")]) }, at(0));
    let s1 = claim_of(&drain(&mut e), "s1").expect("s1 claimed");
    assert_eq!(e.poll_timeout(), Some(HINT_POLL_OVERLAP_MS), "wakes for the overlap");
    e.handle_timeout(at(HINT_POLL_OVERLAP_MS));
    let next = drain(&mut e);
    assert_eq!(receives(&next), 1, "the next poll while s1's claim is in flight: {next:?}");
    (e, s1)
}

/// At shutdown a poll opened during a slow batch is drained, never a new one sent, and what it
/// brings is given back for another worker.
#[test]
fn a_long_poll_open_at_shutdown_is_drained_and_its_hints_given_back() {
    let (mut e, s1) = slow_batch();
    let at = |ms| Now { wall_ms: START + ms, mono_ms: ms };
    e.handle(Event::Shutdown, at(300));
    let stopping = drain(&mut e);
    assert_eq!(receives(&stopping), 0, "{stopping:?}");
    e.handle(Event::Hints { received: Ok(vec![hint("r2", "s2")]) }, at(320));
    e.handle(held_by_b(s1), at(330));
    let last = drain(&mut e);
    assert_eq!(receives(&last), 0, "{last:?}");
    let Some(Command::SettleHints { delete, give_back, .. }) =
        last.iter().find(|c| matches!(c, Command::SettleHints { .. }))
    else {
        panic!("settled: {last:?}")
    };
    assert_eq!((delete, give_back), (&vec!["r1".to_string()], &vec!["r2".to_string()]));
    assert!(last.iter().any(|c| matches!(c, Command::Finished)), "finished: {last:?}");
}

// ---- trace vectors ----

fn traces_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/conformance/worker")
}

/// Records the vectors' runs (set `LEASELOCK_RECORD_TRACES=1` to write them again).
fn record_all() -> Vec<Trace> {
    let mut traces = Vec::new();
    // A session claim whose answer arrives after a renewal: the claim is covered. (No index
    // lag allowed for: its own earlier work is listed once, when the session opens.)
    {
        let c = config(LeaseMode::Session, 3_000, 1_000, 500);
        let mut sim = Sim::new(c.clone(), START);
        sim.behaviour.claim_answer_delay_ms = 2_400;
        start_work(&sim, 2);
        traces.push(record(
            "session_claim_covered",
            "Session mode: a claim answered 2.4 s late, after a session renewal, is covered by the renewed session (SetDeadline) and never cancelled by its deadline.",
            sim,
            Settings { index_lag_ms: 0, ..settings("a", 10) },
            8_000,
            None,
        ));
    }
    {
        let c = config(LeaseMode::PerItem, 20_000, 5_000, 1_000);
        let sim = Sim::new(c, START);
        start_work(&sim, 2);
        traces.push(record(
            "per_item_claim_renew_shutdown",
            "Per-item mode: orphans claimed, renewed on schedule, then a shutdown cancels, releases and hints each.",
            sim,
            Settings { hints: true, ..settings("a", 10) },
            12_000,
            Some(12_000),
        ));
    }
    {
        let c = config(LeaseMode::Session, 3_000, 1_000, 500);
        let sim = Sim::new(c, START);
        start_work(&sim, 2);
        traces.push(record(
            "session_shutdown_hints_name_the_ended_session",
            "Session mode: a shutdown cancels each handler, ends the session in one write reporting what it held, then hints each connection naming the ended session (owner, epoch, held) so that receivers take it over as read.",
            sim,
            Settings { hints: true, index_lag_ms: 0, ..settings("a", 10) },
            6_000,
            Some(6_000),
        ));
    }
    traces
}

/// Runs `sim` with one worker to `until_ms` (a shutdown at `shutdown_at`), then feeds the
/// inputs it handled to a recording twin: same settings and seed, so the same commands.
fn record(
    name: &str,
    description: &str,
    mut sim: Sim,
    settings: Settings,
    until_ms: u64,
    shutdown_at: Option<u64>,
) -> Trace {
    let start = sim.now();
    sim.record_inputs = true;
    let w = sim.spawn(settings.clone(), 42);
    match shutdown_at {
        Some(at) => {
            sim.run_until(at);
            sim.shutdown(w);
            sim.run_until(until_ms + 10_000);
            assert!(sim.nodes[w].finished);
        }
        None => sim.run_until(until_ms),
    }
    let mut twin = Recorder::new(name, description, settings, sim.store.config().clone(), 42, start);
    let mut emitted = twin.start_commands();
    for (worker, at, event) in std::mem::take(&mut sim.inputs) {
        assert_eq!(worker, w);
        emitted.extend(twin.step(at, event));
    }
    let log: Vec<Command> = sim.log.iter().map(|e| e.command.clone()).collect();
    assert_eq!(emitted, log, "the twin emitted what the worker did");
    twin.finish()
}

#[test]
fn worker_trace_vectors_replay() {
    let dir = traces_dir();
    if std::env::var_os("LEASELOCK_RECORD_TRACES").is_some() {
        for t in record_all() {
            let path = dir.join(format!("{}.json", t.name));
            std::fs::write(&path, serde_json::to_string_pretty(&t).unwrap() + "\n").unwrap();
        }
    }
    let mut replayed = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let trace: Trace = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            if let Err(m) = replay(&trace) {
                panic!("{}: {m}", path.display());
            }
            replayed += 1;
        }
    }
    assert!(replayed >= 2, "{replayed} vectors in {}", dir.display());
    let mut broken = 0;
    for entry in std::fs::read_dir(dir.join("broken")).unwrap() {
        let path = entry.unwrap().path();
        let trace: Trace = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(replay(&trace).is_err(), "{} replayed although broken", path.display());
        broken += 1;
    }
    assert!(broken >= 1);
}

#[test]
fn two_balanced_session_workers_stop_moving_work_once_even() {
    let mut sim = Sim::new(config(LeaseMode::Session, 3_000, 1_000, 500), START);
    let ids = start_work(&sim, 50);
    for (i, name) in ["a", "b"].iter().enumerate() {
        sim.spawn(Settings { orphan_interval_ms: 500, ..settings(name, 50) }, i as u64 + 21);
    }
    assert!(sim.run_while(30_000, 100, |s| s.all_held_once(&ids)));
    sim.run_until(40_000);
    let before = sim.ops.get("release").copied().unwrap_or(0);
    let spread = |s: &Sim| (s.running(0), s.running(1));
    let at = spread(&sim);
    sim.run_until(70_000);
    let moved = sim.ops.get("release").copied().unwrap_or(0) - before;
    assert_eq!((moved, spread(&sim)), (0, at), "hand-overs after the fleet was even at {at:?}");
}

/// What became of work claimed just before its worker died while the owner index lagged.
#[derive(Debug)]
struct Stranding {
    /// After the kill, when the work ran again on a live worker (None: not within the run).
    owned_again_after_ms: Option<u64>,
    /// After the kill, when the dead session was first retired (None: not within the run).
    retired_after_ms: Option<u64>,
}

/// Session mode, lease 5 s, renew 1.25 s, skew 250 ms, three workers of `settings`; the owner
/// index lags `lag_ms` behind the table (the orphan index does not: its stale entry of the
/// unclaimed work would lead the survivors to it). A stream `fresh` is STARTed (no hint), and
/// its claimer, which holds nothing else, dies right after its claim lands, before the index
/// lists the claim under it. Returns the sim, the victim's id and when it died.
fn claimer_killed_under_index_lag(lag_ms: u64, settings: impl Fn(&str) -> Settings) -> (Sim, String, u64) {
    let mut sim = Sim::new(config(LeaseMode::Session, 5_000, 1_250, 250), START);
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        sim.spawn(settings(name), i as u64 + 60);
    }
    sim.store.set_lag_of(crate::memory::Index::Owner, lag_ms);
    sim.run_until(20_000);
    block_on(sim.store.start("fresh", "wss://feed.example")).unwrap();
    let started_at = sim.clock.monotonic_ms();
    let claimed = sim.run_while(started_at + 30_000, 1, |s| s.running_on("fresh").len() == 1);
    assert!(claimed, "claimed from the orphan index");
    let victim = sim.running_on("fresh")[0];
    let victim_id = sim.nodes[victim].engine.settings().worker_id.clone();
    sim.crash(victim);
    let killed_at = sim.clock.monotonic_ms();
    (sim, victim_id, killed_at)
}

/// Whether `sim` retired the session of `owner` after `since`, and when.
fn retired_at(sim: &Sim, owner: &str, since: u64) -> Option<u64> {
    sim.log
        .iter()
        .find(|e| {
            e.at_mono_ms > since
                && matches!(&e.command, Command::Run { request: Op::RetireSession { owner: o, .. }, .. } if o == owner)
        })
        .map(|e| e.at_mono_ms)
}

/// [`claimer_killed_under_index_lag`], the engines retiring a dead session from an empty
/// listing as `index_lag_ms` allows.
fn claim_then_kill_with_index_lag(lag_ms: u64, index_lag_ms: u64) -> Stranding {
    let (mut sim, victim_id, killed_at) =
        claimer_killed_under_index_lag(lag_ms, |name| Settings { index_lag_ms, ..settings(name, 30) });
    let id = "fresh";
    let owned = sim.run_while(killed_at + 60_000, 10, |s| s.running_on(id).len() == 1);
    let owned_again_after_ms = owned.then(|| sim.clock.monotonic_ms() - killed_at);
    sim.run_until(killed_at + 60_000);
    // Never two live owners at once.
    assert!(sim.running_on(id).len() <= 1);
    let retired_after_ms = retired_at(&sim, &victim_id, killed_at).map(|at| at - killed_at);
    Stranding { owned_again_after_ms, retired_after_ms }
}

/// An owner index 8 s behind the table, longer than the 5 s session lease: the survivors find
/// the dead session before the index lists its last claim. They keep listing it (its silence
/// is no answer until a listing sent `index_lag_ms` after its last write), take the work over
/// once the index lists it, and retire the session only after that. The bound: lease + skew +
/// the index's lag + one orphan interval (2 s) + 1 s.
#[test]
fn work_claimed_just_before_its_worker_died_is_taken_over_when_the_lagging_index_lists_it() {
    let out = claim_then_kill_with_index_lag(8_000, 10_000);
    let owned = out.owned_again_after_ms.expect("the work is owned by a live worker again");
    assert!(owned <= 5_000 + 250 + 8_000 + 2_000 + 1_000, "{out:?}");
    let retired = out.retired_after_ms.expect("the dead session is retired");
    assert!(retired > owned, "retired before its work was taken over: {out:?}");
    // The scenario is the one that strands work when the engine trusts the index's silence:
    // with no lag allowed for, the session is retired from an empty listing and the work is
    // never owned again.
    let trusting = claim_then_kill_with_index_lag(8_000, 0);
    assert_eq!(trusting.owned_again_after_ms, None, "{trusting:?}");
    assert!(trusting.retired_after_ms.is_some(), "{trusting:?}");
    eprintln!("index lag 8 s: allowed for {out:?}; trusted {trusting:?}");
}

/// An owner index 40 s behind, past what the engines allow for (10 s): the dead session is
/// retired before its last claim is listed, and that work would be stranded. The consistent
/// sweep (`LeaseStore::stranded`, which reads no index) finds it once the session has been
/// dead for its grace, and a hint for it brings it back to a live worker, long before the
/// index catches up.
#[test]
fn work_stranded_by_an_index_lagging_past_the_allowance_is_found_by_the_sweep_and_hinted_back() {
    let (mut sim, victim_id, killed_at) =
        claimer_killed_under_index_lag(40_000, |name| Settings { hints: true, ..settings(name, 30) });
    let id = "fresh".to_string();
    let retired = |s: &Sim| retired_at(s, &victim_id, killed_at).is_some();
    assert!(sim.run_while(killed_at + 30_000, 10, retired), "the dead session is retired");
    assert!(sim.running_on(&id).is_empty(), "stranded: held under a retired session the index does not list yet");
    // The sweep, as the reconciler runs it: held under a session dead for longer than the grace.
    let grace_ms = 10_000;
    let found = block_on(sim.store.stranded(grace_ms)).unwrap();
    assert_eq!(found, vec![id.clone()]);
    for id in &found {
        sim.hints_push(crate::Hint::stranded(id).to_json());
    }
    let swept_at = sim.clock.monotonic_ms();
    assert!(sim.run_while(swept_at + 5_000, 10, |s| s.running_on(&id).len() == 1), "owned again from the hint");
    assert!(sim.clock.monotonic_ms() - killed_at < 40_000, "before the index caught up");
    assert!(block_on(sim.store.stranded(grace_ms)).unwrap().is_empty());
}

/// Per-item mode under both indexes 8 s behind: nothing waits on the index's silence. A crashed
/// worker's leases are listed at an older expiry (already past the cutoff, or soon), claimed once
/// the item's own expiry passes the skew (the conditional write decides), and new work STARTed
/// meanwhile is listed once the orphan index has it.
#[test]
fn per_item_work_is_held_again_under_a_lagging_index_within_lease_skew_lag_and_an_interval() {
    let mut sim = Sim::new(config(LeaseMode::PerItem, 3_000, 1_000, 500), START);
    let ids = start_work(&sim, 30);
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        sim.spawn(settings(name, 30), i as u64 + 80);
    }
    assert!(sim.run_while(20_000, 100, |s| ids.iter().all(|id| s.running_on(id).len() == 1)));
    sim.store.set_index_lag_ms(8_000);
    sim.run_until(40_000);
    assert!(ids.iter().all(|id| sim.running_on(id).len() == 1), "held all along");
    let lost: Vec<String> = ids.iter().filter(|id| sim.running_on(id) == vec![0]).cloned().collect();
    assert!(!lost.is_empty());
    sim.crash(0);
    let crashed_at = sim.clock.monotonic_ms();
    let back = sim.run_while(crashed_at + 60_000, 50, |s| ids.iter().all(|id| s.running_on(id).len() == 1));
    let took = sim.clock.monotonic_ms() - crashed_at;
    assert!(back && took <= 3_000 + 500 + 8_000 + 2_000 + 1_000, "{took} ms");
    assert!(ids.iter().all(|id| sim.running_on(id).len() <= 1));
    eprintln!("per-item, indexes 8 s behind: the crashed worker's {} held again after {took} ms", lost.len());
}

// ---- the store's clock ----

/// A worker whose claims wait until the store's clock is known within 500 ms.
fn on_the_store_clock(id: &str, max: usize) -> Settings {
    Settings { clock_tolerance_ms: Some(500), ..settings(id, max) }
}

/// Rule 1 compares expiries with the worker's clock: it claims nothing until its driver has
/// measured the store's clock within the tolerance, keeps (and renews) what it holds while the
/// measurement is too loose, and says why in its snapshot; a large offset does not stop it.
#[test]
fn claims_wait_for_the_store_clock_and_held_work_is_kept_meanwhile() {
    let mut sim = Sim::new(config(LeaseMode::PerItem, 20_000, 5_000, 1_000), START);
    let ids = start_work(&sim, 4);
    let w = sim.spawn(on_the_store_clock("a", 10), 3);
    sim.run_until(10_000);
    let snap = sim.nodes[w].engine.snapshot();
    assert_eq!((sim.running(w), snap.acquired), (0, 0), "nothing claimed before the clock is measured");
    assert!(snap.orphan_polls >= 4, "it polls meanwhile (its reads measure the clock)");
    assert_eq!(snap.claims_paused.as_deref(), Some("the store's clock is not measured yet"));
    assert_eq!((snap.clock_offset_ms, snap.clock_uncertainty_ms), (None, None));

    sim.measure_store_clock(w, 3_000, 800);
    sim.run_until(15_000);
    let snap = sim.nodes[w].engine.snapshot();
    assert_eq!(sim.running(w), 0, "800 ms is not within 500 ms");
    assert!(snap.claims_paused.as_deref().is_some_and(|why| why.contains("800 ms")), "{:?}", snap.claims_paused);

    // Measured closely, 3 s off: it claims (the offset is reported, not acted on).
    sim.measure_store_clock(w, 3_000, 40);
    assert!(sim.run_while(20_000, 10, |s| s.running(w) == 4), "claims once measured");
    let snap = sim.nodes[w].engine.snapshot();
    assert_eq!((snap.clock_offset_ms, snap.clock_uncertainty_ms, snap.claims_paused), (Some(3_000), Some(40), None));

    // The measurement widens again (the window restarted): held work is kept and renewed on
    // the monotonic clock, new work waits.
    sim.measure_store_clock(w, 3_000, 900);
    let renewals = sim.ops.get("renew").copied().unwrap_or(0);
    let more = (4..6).map(|i| format!("s{i:03}")).collect::<Vec<_>>();
    for id in &more {
        block_on(sim.store.start(id, "wss://feed.example")).unwrap();
    }
    sim.run_until(60_000);
    let snap = sim.nodes[w].engine.snapshot();
    assert_eq!((snap.held, snap.leases_lost), (ids.clone(), 0), "kept, none of the new work claimed");
    assert!(sim.ops["renew"] >= renewals + 4 * 7, "renewed meanwhile: {} -> {}", renewals, sim.ops["renew"]);
    assert!(sim.cancels(CancelReason::Deadline).is_empty());
    for id in &more {
        assert_eq!(sim.holder_of(id), None, "{id}");
    }
    sim.measure_store_clock(w, 3_000, 30);
    assert!(sim.run_while(70_000, 10, |s| s.running(w) == 6), "claims again");
}

/// The metrics line of every driver carries the store's clock once measured.
#[test]
fn the_metrics_line_carries_the_store_clocks_offset_and_uncertainty() {
    let mut sim = Sim::new(config(LeaseMode::PerItem, 20_000, 5_000, 1_000), START);
    let w = sim.spawn(on_the_store_clock("a", 10), 3);
    let line = |sim: &mut Sim| {
        let m = sim.nodes[w].engine.take_metrics();
        let line = m.emf_line("leaselock", "a", &Totals::default(), false, START);
        serde_json::from_str::<serde_json::Value>(&line).unwrap()
    };
    let before = line(&mut sim);
    assert!(before.get("ClockOffsetMs").is_none(), "not measured yet: {before}");
    sim.measure_store_clock(w, -2_137, 12);
    let after = line(&mut sim);
    assert_eq!((after["ClockOffsetMs"].as_i64(), after["ClockUncertaintyMs"].as_i64()), (Some(-2_137), Some(12)));
    let names: Vec<&str> = after["_aws"]["CloudWatchMetrics"][0]["Metrics"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["Name"].as_str())
        .collect();
    assert!(names.contains(&"ClockOffsetMs") && names.contains(&"ClockUncertaintyMs"), "{names:?}");
}

/// While claims wait for the store's clock the worker receives no hints (they stay on the queue
/// for the others); once the clock is measured it receives them and claims at once.
#[test]
fn hints_wait_on_the_queue_while_claims_wait_for_the_clock() {
    let mut sim = Sim::new(config(LeaseMode::PerItem, 20_000, 5_000, 1_000), START);
    let w = sim.spawn(Settings { hints: true, orphan_interval_ms: 60_000, ..on_the_store_clock("a", 10) }, 4);
    sim.run_until(2_000);
    let ids = start_work(&sim, 1);
    sim.send_hint(&ids[0]);
    sim.run_until(5_000);
    let receives = |sim: &Sim| sim.log.iter().filter(|e| matches!(e.command, Command::ReceiveHints { .. })).count();
    assert_eq!((receives(&sim), sim.running(w), sim.hints_waiting()), (0, 0, 1), "no long poll while paused");
    sim.measure_store_clock(w, 0, 20);
    assert!(sim.run_while(8_000, 10, |s| s.running(w) == 1), "the hint claimed once measured");
    // Found too loose again: the long poll in flight ends, no other opens, the next hint waits.
    sim.measure_store_clock(w, 0, 900);
    sim.run_until(9_500);
    let polls = receives(&sim);
    block_on(sim.store.start("s001", "wss://feed.example")).unwrap();
    sim.send_hint("s001");
    sim.run_until(15_000);
    assert_eq!((receives(&sim), sim.running(w), sim.hints_waiting()), (polls, 1, 1));
}

#[test]
fn a_cold_start_on_one_hot_orphan_partition_is_throttled_kept_within_its_limits_and_still_all_held() {
    // 2,000 orphans on one orphan-index partition value, 20 workers claiming at once: 4,000
    // index write units wanted in the first second against DynamoDB's 1,000.
    let mut sim = Sim::new(config(LeaseMode::PerItem, 20_000, 5_000, 1_000), START);
    sim.keep_log = false;
    sim.account = true;
    sim.behaviour.throttle = true;
    let ids = start_work(&sim, 2_000);
    for i in 0..20 {
        sim.spawn(Settings { hints: true, ..settings(&format!("w{i:02}"), 120) }, i + 1);
    }
    let held = sim.run_while(60_000, 100, |s| s.all_held_once(&ids));
    assert!(held, "{} of {} held", sim.held_once_count(), ids.len());
    let refused = sim.partitions.throttled.get(super::sim::ORPHAN_INDEX).copied().unwrap_or(0);
    assert!(refused > 0 && sim.throttled.get("claim").is_some_and(|n| *n > 0), "{:?}", sim.partitions.throttled);
    for (place, (units, partition)) in &sim.partitions.peak {
        assert!(*units <= super::sim::partition_limit(place), "{place} {partition}: {units} units in one second");
    }
    // The busiest second of the orphan index used its whole budget, no more.
    assert!(sim.partitions.peak[super::sim::ORPHAN_INDEX].0 > 900.0, "{:?}", sim.partitions.peak);
    // Without throttling the same start passes the limit.
    let mut free = Sim::new(config(LeaseMode::PerItem, 20_000, 5_000, 1_000), START);
    free.keep_log = false;
    free.account = true;
    let ids = start_work(&free, 2_000);
    for i in 0..20 {
        free.spawn(Settings { hints: true, ..settings(&format!("w{i:02}"), 120) }, i + 1);
    }
    assert!(free.run_while(60_000, 100, |s| s.all_held_once(&ids)));
    assert!(free.partitions.peak[super::sim::ORPHAN_INDEX].0 > 1_000.0, "{:?}", free.partitions.peak);
    assert!(free.partitions.throttled.is_empty());
}

/// Session mode: a release that fails (its retries outlasted by a throttled partition) is sent
/// again. Given up, the work would stay held under the live session (the sentinel never
/// expires) with no handler: STARTed again, nobody would run it until that session ended.
#[test]
fn a_failed_session_release_is_sent_again_so_the_work_is_not_left_held_without_a_handler() {
    let mut sim = Sim::new(config(LeaseMode::Session, 5_000, 1_250, 250), START);
    let ids = start_work(&sim, 2);
    let a = sim.spawn(settings("a", 10), 90);
    let b = sim.spawn(settings("b", 10), 91);
    assert!(sim.run_while(30_000, 10, |s| s.all_held_once(&ids)), "held");
    let id = ids[0].clone();
    let holder = sim.running_on(&id)[0];
    sim.behaviour.failing_releases = 3;
    block_on(sim.store.stop(&id)).unwrap();
    let stopped_at = sim.clock.monotonic_ms();
    // Released within the desired-state interval (10 s) and the retries' pauses (0.25 + 0.5 + 1 s).
    let released = sim.run_while(stopped_at + 15_000, 10, |s| s.holder_of(&id).is_none());
    assert!(released, "released in the end (holder {:?})", sim.holder_of(&id));
    assert_eq!(sim.behaviour.failing_releases, 0);
    block_on(sim.store.start(&id, "wss://feed.example")).unwrap();
    let started_at = sim.clock.monotonic_ms();
    assert!(sim.run_while(started_at + 10_000, 10, |s| s.running_on(&id).len() == 1), "runs again");
    assert!([a, b].contains(&holder) && ids.iter().all(|id| sim.running_on(id).len() == 1));
}

/// A simulation at the default timing on 16 orphan shards, billed and throttled as DynamoDB is.
fn throttled_on_16_shards(mode: LeaseMode) -> Sim {
    let mut c = config(mode, 20_000, 5_000, 1_000);
    c.orphan_shards = 16;
    let mut sim = Sim::new(c, START);
    sim.keep_log = false;
    sim.account = true;
    sim.behaviour.throttle = true;
    sim
}

/// A session fleet given a burst of new work on a sharded orphan index, as DynamoDB throttles
/// it: each worker counts the whole index's unowned work from its one page (its shards stand
/// for the rest) and claims its share at once, not one page's share per session renewal; and
/// its claims are paced so that no orphan-index partition value is asked for more than it serves.
#[test]
fn a_burst_of_work_on_a_sharded_index_is_shared_at_once_and_not_throttled() {
    let mut sim = throttled_on_16_shards(LeaseMode::Session);
    for i in 0..15 {
        sim.spawn(settings(&format!("w{i:02}"), 250), i + 1);
    }
    // The fleet is up and every session has reported its load (none).
    sim.run_until(8_000);
    let ids: Vec<String> = (0..3_000)
        .map(|i| {
            let id = format!("c{i:05}");
            block_on(sim.store.start(&id, "wss://feed.example")).unwrap();
            id
        })
        .collect();
    // A page of 250 holds a twelfth of the work; counted alone, the fleet's shares would grow
    // by about one page per session renewal (5 s): a minute for all of it.
    let held = sim.run_while(8_000 + 12_000, 100, |s| s.all_held_once(&ids));
    assert!(held, "{} of {} held after 12 s", sim.held_once_count(), ids.len());
    assert_eq!(sim.throttled.get("claim"), None, "claims throttled: {:?}", sim.partitions.throttled);
    for (place, (units, partition)) in &sim.partitions.peak {
        assert!(*units <= super::sim::partition_limit(place), "{place} {partition}: {units} units in one second");
    }
    // Shared: every worker took part, and the balance evens out the rest (shares of 200).
    let loads: Vec<usize> = (0..15).map(|w| sim.running(w)).collect();
    assert!(loads.iter().all(|n| (100..=250).contains(n)), "{loads:?}");
    sim.run_until(sim.clock.monotonic_ms() + 40_000);
    let loads: Vec<usize> = (0..15).map(|w| sim.running(w)).collect();
    assert!(sim.all_held_once(&ids) && loads.iter().all(|n| (185..=215).contains(n)), "{loads:?}");
}

/// Per-item mode lists no fleet, so each worker counts the claimers beside it from its orphan
/// page (the work nobody holds over what one worker can take): a cold start of 8,000 on 16
/// orphan shards by 40 workers of 250 at once is paced so that no orphan-index partition value is
/// asked for more than it serves (peak 676 units), and is still all held within seconds (2.3 s).
/// Unpaced, each worker claims its page at once, and the shards it picks are asked for more
/// than they serve (1,874 claims throttled).
#[test]
fn a_per_item_cold_start_on_a_sharded_index_is_paced_by_the_claimers_it_estimates() {
    let mut sim = throttled_on_16_shards(LeaseMode::PerItem);
    let ids = start_work(&sim, 8_000);
    for i in 0..40 {
        sim.spawn(settings(&format!("w{i:02}"), 250), i + 1);
    }
    let held = sim.run_while(20_000, 100, |s| s.all_held_once(&ids));
    assert!(held, "{} of {} held after 20 s", sim.held_once_count(), ids.len());
    assert_eq!(sim.throttled.get("claim"), None, "claims throttled: {:?}", sim.partitions.throttled);
    for (place, (units, partition)) in &sim.partitions.peak {
        assert!(*units <= super::sim::partition_limit(place), "{place} {partition}: {units} units in one second");
    }
}

/// The engine sends the takeovers it starts together (work listed under one dead session) as
/// one transaction ([`Op::TakeOver`]), which the simulation runs as every driver does: one
/// condition check of the dead session's item for all of them, not one each (2 units a check,
/// on one partition value).
#[test]
fn a_dead_sessions_work_is_taken_over_in_batches_with_one_check_of_its_session_each() {
    let mut sim = Sim::new(config(LeaseMode::Session, 5_000, 1_250, 250), START);
    sim.keep_log = false;
    sim.account = true;
    let ids = start_work(&sim, 200);
    let a = sim.spawn(settings("a", 200), 1);
    assert!(sim.run_while(30_000, 100, |s| s.all_held_once(&ids)));
    for (i, name) in ["b", "c"].iter().enumerate() {
        sim.spawn(settings(name, 200), i as u64 + 2);
    }
    // b and c are live (not yet given any of a's work: the balance watches them for a pace).
    sim.run_until(sim.clock.monotonic_ms() + 1_000);
    assert_eq!(sim.held_only_by(a).len(), 200);
    let session_units = |s: &Sim| s.partitions.total.get(super::sim::SESSION_ITEMS).copied().unwrap_or(0.0);
    let before = session_units(&sim);
    sim.crash(a);
    let from = sim.clock.monotonic_ms();
    assert!(sim.run_while(from + 20_000, 100, |s| s.all_held_once(&ids)), "taken over");
    let snapshots: Vec<_> = [1, 2].iter().map(|w| sim.nodes[*w].engine.snapshot()).collect();
    let taken: u64 = snapshots.iter().map(|s| s.session_takeovers).sum();
    let transactions: u64 = snapshots.iter().map(|s| s.takeover_transactions).sum();
    assert!((1..=taken / 8).contains(&transactions), "{transactions} takeover transactions for {taken} connections");
    // Each of b and c renews its session every 1.25 s (1 unit) meanwhile; one by one, the
    // takeovers' checks alone would be 400 units.
    let renewals = 2.0 * (sim.clock.monotonic_ms() - from) as f64 / 1_250.0 + 4.0;
    let checks = session_units(&sim) - before - renewals;
    assert!(taken >= 200 && checks <= 2.0 * 200.0 / 8.0, "{checks} units of checks for {taken} takeovers");
}

#[test]
fn survivors_of_a_crash_do_not_all_claim_down_the_dead_sessions_whole_listing() {
    let mut sim = Sim::new(config(LeaseMode::Session, 5_000, 1_250, 250), START);
    sim.keep_log = false;
    let ids = start_work(&sim, 600);
    let workers: Vec<usize> = (0..12).map(|i| sim.spawn(settings(&format!("w{i:02}"), 80), i + 1)).collect();
    assert!(sim.run_while(60_000, 100, |s| s.all_held_once(&ids)), "cold start");
    sim.run_until(sim.clock.monotonic_ms() + 15_000);
    let victims = sim.held_only_by(workers[0]).len();
    assert!(victims >= 20, "{victims}");
    let claims = sim.ops["claim"];
    sim.crash(workers[0]);
    let from = sim.clock.monotonic_ms();
    assert!(sim.run_while(from + 20_000, 100, |s| s.all_held_once(&ids)), "taken over");
    // Each survivor lists the dead session's work and goes for its own picks first. Going on
    // down the list while the others take theirs, they sent 166 claims for 50 connections; a
    // wave refused whole ends that (75); each connection assigned to one survivor with room
    // below the fair level, as every survivor assigns them alike, ends most of the rest.
    let sent = sim.ops["claim"] - claims;
    assert!(sent <= victims as u64 * 5 / 4, "{sent} claims to take over {victims} connections");
}

/// The survivors' assignment of a dead session's work: every connection to exactly one live
/// worker, none past the fair level, and the same whoever computes it.
#[test]
fn a_dead_sessions_work_is_assigned_once_within_every_survivors_room() {
    let load = |held, max| Some(SessionLoad { held, max_connections: max });
    let loads: Vec<(String, Option<SessionLoad>)> =
        (0..12).map(|i| (format!("w{i:02}"), load(50 + (i % 3) * 4, 80))).collect();
    let ids: Vec<String> = (0..60).map(|i| format!("s{i:03}")).collect();
    let refs: Vec<&String> = ids.iter().collect();
    let mut seen = std::collections::BTreeMap::new();
    for (owner, l) in &loads {
        let mine = takeover_assignment(owner, &loads, &refs).unwrap();
        // 12 workers holding 648 and 60 more: a fair level of 59.
        let room = 59 - l.unwrap().held.min(59);
        assert!(mine.len() as u64 <= room, "{owner}: {} past a room of {room}", mine.len());
        for id in mine {
            assert!(seen.insert(id.clone(), owner.clone()).is_none(), "{id} assigned twice");
        }
    }
    assert_eq!(seen.len(), ids.len(), "every connection assigned");
    // A live session that has not reported: the plain ranking.
    let mut unknown = loads.clone();
    unknown[3].1 = None;
    assert!(takeover_assignment("w00", &unknown, &refs).is_none());
}

/// A hint declined at the fair share is deleted, not deferred: deferred, it came back to the
/// next worker at its share, and the next (each receipt a read of the sessions), for as long as
/// the queue kept it.
#[test]
fn a_hint_declined_at_the_fair_share_is_not_passed_round_the_fleet() {
    let mut sim = Sim::new(config(LeaseMode::Session, 3_000, 1_000, 500), START);
    let ids = start_work(&sim, 20);
    let workers: Vec<usize> =
        (0..2).map(|i| sim.spawn(Settings { hints: true, ..settings(&format!("w{i}"), 40) }, i + 1)).collect();
    assert!(sim.run_while(30_000, 100, |s| s.all_held_once(&ids)), "cold start");
    sim.run_until(sim.clock.monotonic_ms() + 10_000);
    let received = |s: &Sim| workers.iter().map(|w| s.nodes[*w].engine.snapshot().hints_received).sum::<u64>();
    let before = received(&sim);
    // A stale hint: the work it names is held, and both workers are at their share.
    sim.send_hint(&ids[0]);
    sim.run_until(sim.clock.monotonic_ms() + 30_000);
    assert_eq!(received(&sim) - before, 1, "the hint was received again");
    assert_eq!(sim.hints_waiting(), 0);
    assert!(sim.all_held_once(&ids));
}

/// A page fills from the first shard it reads: a worker that claimed a whole page held its work
/// on one orphan-index partition value, and what it let go at once (a per-item shutdown's
/// releases and their claims elsewhere, 2 units each; a crash's expiries; a session's end and
/// its takeovers) fell on that value together. Each poll reads first from the shard the worker
/// holds least of and claims at most its limit of one shard's work ([`decide::claims_per_shard`]),
/// so its work spreads over the shards, in per-item and in session mode.
#[test]
fn a_workers_claims_spread_over_the_orphan_shards() {
    for mode in [LeaseMode::PerItem, LeaseMode::Session] {
        let mut c = config(mode, 20_000, 5_000, 1_000);
        c.orphan_shards = 8;
        let mut sim = Sim::new(c, START);
        sim.keep_log = false;
        // 100 connections on each shard; one worker takes 100 of them.
        start_work(&sim, 800);
        let w = sim.spawn(settings("a", 100), 7);
        assert!(sim.run_while(60_000, 100, |s| s.running(w) == 100), "{mode:?}: 100 held");
        // 100 over 8 shards (per-item), over 4 (a balanced session worker).
        let limit = if mode == LeaseMode::Session { 25 } else { 13 };
        let mut per_shard = [0usize; 8];
        for id in sim.held_only_by(w) {
            per_shard[crate::config::orphan_shard_of(&id, 8) as usize] += 1;
        }
        // One page would have put all 100 on the shard it read first.
        let most = *per_shard.iter().max().unwrap();
        assert!(most <= 2 * limit, "{mode:?}: {most} on one shard (limit {limit} a poll): {per_shard:?}");
        let used = per_shard.iter().filter(|n| **n > 0).count();
        assert!(used >= 100usize.div_ceil(limit), "{mode:?}: {used} shards: {per_shard:?}");
    }
}
