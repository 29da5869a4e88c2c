//! The holder machine on a manual clock: every outcome below is decided by the times passed in,
//! none by a sleep.

use super::*;

const LEASE: u64 = 2_000;
const RENEW: u64 = 500;
const SKEW: u64 = 200;
/// The store's clock: the monotonic clock plus this.
const STORE: u64 = 1_700_000_000_000;

fn setup(mode: Mode) -> Setup {
    Setup { mode, lease_ms: LEASE, renew_ms: RENEW, skew_ms: SKEW }
}

/// The lease a claim or renewal sent at monotonic `sent` leaves: deadline sent + 1,800, the next
/// renewal due at sent + 500.
fn lease(sent: u64) -> Lease {
    Lease {
        id: "job/1".into(),
        owner: "a".into(),
        fence: 3,
        expires_at_ms: STORE + sent + LEASE,
        last_seq: None,
        url: None,
        desired_state: None,
        deadline_mono_ms: sent + LEASE - SKEW,
    }
}

fn stopped(sent: u64) -> Lease {
    Lease { desired_state: Some(DesiredState::Stopped), ..lease(sent) }
}

fn outs(h: &mut Holder) -> Vec<Output> {
    std::iter::from_fn(|| h.poll_output()).collect()
}

fn answer(id: u64, result: Result<Lease, Error>) -> Input {
    Input::Answer { id, result }
}

fn lost() -> Error {
    Error::Lost { id: "job/1".into() }
}

use Output::{Cancel, Covered, Over, Renew};

#[test]
fn renews_on_schedule_and_stops_at_the_deadline_when_a_renewal_never_answers() {
    let mut h = Holder::new(setup(Mode::Renew), &lease(0), 1, 0);
    assert_eq!((outs(&mut h), h.poll_timeout()), (vec![], Some(500)));
    h.handle_timeout(499);
    assert_eq!(outs(&mut h), vec![]);
    h.handle_timeout(500);
    assert_eq!(outs(&mut h), vec![Renew { id: 1, until_mono_ms: 1_800 }]);
    h.handle(answer(1, Ok(lease(500))), 510);
    assert_eq!(outs(&mut h), vec![Covered { deadline_mono_ms: 2_300 }]);
    assert_eq!((h.deadline_mono_ms(), h.poll_timeout()), (2_300, Some(1_000)));
    h.handle_timeout(1_000);
    assert_eq!(outs(&mut h), vec![Renew { id: 2, until_mono_ms: 2_300 }]);
    // In flight: only the deadline is timed, and nothing else is sent.
    assert_eq!(h.poll_timeout(), Some(2_300));
    h.handle_timeout(2_299);
    assert_eq!(outs(&mut h), vec![]);
    assert!(h.may_act(2_299));
    h.handle_timeout(2_300);
    assert_eq!(outs(&mut h), vec![Cancel { reason: CancelReason::Deadline }, Over]);
    assert!(!h.may_act(2_300) && h.is_over() && h.poll_timeout().is_none());
    // The late answer changes nothing.
    h.handle(answer(2, Ok(lease(1_000))), 2_400);
    assert_eq!((outs(&mut h), h.deadline_mono_ms(), h.may_act(2_400)), (vec![], 2_300, false));
}

#[test]
fn stopped_winds_down_renewed_and_a_refused_renewal_ends_the_holder() {
    let mut h = Holder::new(setup(Mode::Renew), &lease(0), 2, 0);
    h.handle_timeout(500);
    h.handle(answer(1, Ok(stopped(500))), 505);
    assert_eq!(
        outs(&mut h),
        vec![
            Renew { id: 1, until_mono_ms: 1_800 },
            Covered { deadline_mono_ms: 2_300 },
            Cancel { reason: CancelReason::Stopped }
        ]
    );
    // Stopped: still renewed, still may act while it winds down.
    assert!(h.may_act(600));
    h.handle_timeout(1_000);
    assert_eq!(outs(&mut h), vec![Renew { id: 2, until_mono_ms: 2_300 }]);
    h.handle(answer(2, Err(lost())), 1_010);
    // The first reason stays; the holder is over and may not act although before the deadline.
    assert_eq!(outs(&mut h), vec![Over]);
    assert_eq!((h.cancel_reason(), h.may_act(1_010), h.poll_timeout()), (Some(CancelReason::Stopped), false, None));
}

#[test]
fn a_failed_renewal_is_retried_with_jitter_until_no_retry_fits() {
    let mut h = Holder::new(setup(Mode::Renew), &lease(0), 3, 0);
    h.handle_timeout(500);
    h.handle(answer(1, Err(Error::Throttled)), 520);
    let retry = h.poll_timeout().unwrap();
    assert!((530..=620).contains(&retry), "{retry}: 10 ms to 100 ms after the failure");
    h.handle_timeout(retry);
    assert_eq!(outs(&mut h), vec![Renew { id: 1, until_mono_ms: 1_800 }, Renew { id: 2, until_mono_ms: 1_800 }]);
    // Late in the lease no retry fits: the next wake is the deadline itself.
    h.handle(answer(2, Err(Error::Store("x".into()))), 1_790);
    assert_eq!((outs(&mut h), h.poll_timeout()), (vec![], Some(1_800)));
    assert!(h.may_act(1_799));
    h.handle_timeout(1_800);
    assert_eq!(outs(&mut h), vec![Cancel { reason: CancelReason::Deadline }, Over]);
}

#[test]
fn a_watched_lease_renews_nothing_and_covers_move_its_deadline_only_later() {
    let mut h = Holder::new(setup(Mode::Watch), &lease(0), 4, 0);
    assert_eq!((outs(&mut h), h.poll_timeout()), (vec![], Some(1_800)));
    h.handle(Input::Cover { deadline_mono_ms: 2_500 }, 700);
    h.handle(Input::Cover { deadline_mono_ms: 2_000 }, 710);
    assert_eq!(outs(&mut h), vec![Covered { deadline_mono_ms: 2_500 }]);
    assert_eq!(h.poll_timeout(), Some(2_500));
    // Session events are not a watched lease's.
    h.handle(Input::SessionLost, 720);
    assert_eq!((outs(&mut h), h.may_act(720)), (vec![], true));
    h.handle_timeout(2_500);
    assert_eq!(outs(&mut h), vec![Cancel { reason: CancelReason::Deadline }, Over]);
}

#[test]
fn a_session_lease_acts_until_the_session_is_lost_or_ended() {
    for (event, reason) in [(Input::SessionLost, CancelReason::Lost), (Input::SessionEnded, CancelReason::Released)] {
        let mut h = Holder::new(setup(Mode::Session), &lease(0), 5, 0);
        h.handle(Input::Cover { deadline_mono_ms: 3_000 }, 1_000);
        assert_eq!(outs(&mut h), vec![Covered { deadline_mono_ms: 3_000 }]);
        assert!(h.may_act(2_000));
        h.handle(event, 2_000);
        assert_eq!(outs(&mut h), vec![Cancel { reason }, Over]);
        assert!(!h.may_act(2_000));
        // A cover after the end moves nothing.
        h.handle(Input::Cover { deadline_mono_ms: 5_000 }, 2_100);
        assert_eq!((outs(&mut h), h.deadline_mono_ms()), (vec![], 3_000));
    }
}

#[test]
fn a_shutdown_keeps_the_lease_renewed_and_a_release_ends_it() {
    let mut h = Holder::new(setup(Mode::Renew), &lease(0), 6, 0);
    h.handle(Input::Cancel { reason: CancelReason::Shutdown }, 100);
    assert_eq!(outs(&mut h), vec![Cancel { reason: CancelReason::Shutdown }]);
    h.handle_timeout(500);
    assert_eq!(outs(&mut h), vec![Renew { id: 1, until_mono_ms: 1_800 }]);
    h.handle(Input::Cancel { reason: CancelReason::Released }, 510);
    assert_eq!(outs(&mut h), vec![Over]);
    h.handle(answer(1, Ok(lease(500))), 520);
    assert_eq!((outs(&mut h), h.deadline_mono_ms(), h.cancel_reason()), (vec![], 1_800, Some(CancelReason::Shutdown)));
}

#[test]
fn the_jitter_is_the_seeds() {
    let retry = |seed| {
        let mut h = Holder::new(setup(Mode::Renew), &lease(0), seed, 0);
        h.handle_timeout(500);
        h.handle(answer(1, Err(Error::Throttled)), 500);
        h.poll_timeout().unwrap()
    };
    assert_eq!(retry(7), retry(7));
    assert!((1..50).map(retry).collect::<std::collections::HashSet<_>>().len() > 5);
}

mod vectors {
    use std::path::PathBuf;

    use super::super::vectors::{replay, Recorder, Trace};
    use super::*;

    fn dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/conformance/holder")
    }

    /// The id of the renewal the last step sent.
    fn sent(r: &Recorder) -> u64 {
        r.last().iter().find(|o| o["output"] == "renew").and_then(|o| o["id"].as_u64()).expect("a renewal was sent")
    }

    fn record_all() -> Vec<Trace> {
        let mut all = Vec::new();

        let mut r = Recorder::new(
            "renewed_on_schedule_then_the_deadline",
            "A renewed lease (2 s, renewed every 500 ms, 200 ms of skew): renewed at 500 ms, the deadline moves to 2,300 ms; the next renewal never answers: at its deadline the holder is cancelled (Deadline) and over, and the late answer changes nothing.",
            setup(Mode::Renew),
            lease(0),
            11,
            0,
        );
        r.step(500, None);
        let renew = sent(&r);
        r.step(510, Some(answer(renew, Ok(lease(500)))));
        r.step(1_000, None);
        let renew = sent(&r);
        r.step(2_299, None);
        r.step(2_300, None);
        r.step(2_400, Some(answer(renew, Ok(lease(1_000)))));
        all.push(r.finish());

        let mut r = Recorder::new(
            "stopped_then_lost",
            "A renewal finds the work STOPPED: the holder is cancelled (Stopped) and may still act, renewed while it winds down; the next renewal is refused (Lost): the holder is over and may not act although its deadline is ahead.",
            setup(Mode::Renew),
            lease(0),
            12,
            0,
        );
        r.step(500, None);
        let renew = sent(&r);
        r.step(505, Some(answer(renew, Ok(stopped(500)))));
        r.step(1_000, None);
        let renew = sent(&r);
        r.step(1_010, Some(answer(renew, Err(lost()))));
        all.push(r.finish());

        let mut r = Recorder::new(
            "renewal_retried_until_no_retry_fits",
            "Renewals fail (throttled, then a store error) and are retried with jitter while a retry fits before the deadline; once none fits the holder waits out the deadline and is cancelled (Deadline).",
            setup(Mode::Renew),
            lease(0),
            13,
            0,
        );
        r.step(500, None);
        let mut at = 500;
        while !r.machine().is_over() {
            if let Some(id) = r.last().iter().find(|o| o["output"] == "renew").and_then(|o| o["id"].as_u64()) {
                let error = if id % 2 == 1 { Error::Throttled } else { Error::Store("unavailable".into()) };
                at = (at + 60).min(1_790);
                r.step(at, Some(answer(id, Err(error))));
            } else {
                at = r.machine().poll_timeout().unwrap();
                r.step(at, None);
            }
        }
        all.push(r.finish());

        let mut r = Recorder::new(
            "watched_covered_by_hand",
            "A watched lease (no renewal of its own): a renewal by hand covers it to 2,500 ms, an older one moves nothing; at 2,500 ms it is cancelled (Deadline).",
            setup(Mode::Watch),
            lease(0),
            14,
            0,
        );
        r.step(700, Some(Input::Cover { deadline_mono_ms: 2_500 }));
        r.step(710, Some(Input::Cover { deadline_mono_ms: 2_000 }));
        r.step(2_499, None);
        r.step(2_500, None);
        all.push(r.finish());

        let mut r = Recorder::new(
            "session_covered_then_lost",
            "A lease held under a session: each session renewal covers it; the session is lost: the holder is cancelled (Lost) and over at once, and a later cover moves nothing.",
            setup(Mode::Session),
            lease(0),
            15,
            0,
        );
        r.step(1_000, Some(Input::Cover { deadline_mono_ms: 2_800 }));
        r.step(2_000, Some(Input::Cover { deadline_mono_ms: 3_800 }));
        r.step(2_500, Some(Input::SessionLost));
        r.step(2_600, Some(Input::Cover { deadline_mono_ms: 4_400 }));
        all.push(r.finish());

        let mut r = Recorder::new(
            "session_ended",
            "A lease held under a session that is ended: cancelled (Released) and over at once, well before its deadline.",
            setup(Mode::Session),
            lease(0),
            16,
            0,
        );
        r.step(600, Some(Input::Cover { deadline_mono_ms: 2_400 }));
        r.step(900, Some(Input::SessionEnded));
        r.step(2_400, None);
        all.push(r.finish());

        let mut r = Recorder::new(
            "shutdown_renewed_until_released",
            "The holder is cancelled for a shutdown: the lease stays renewed while it winds down; the release ends it, and the answer of the renewal then in flight changes nothing.",
            setup(Mode::Renew),
            lease(0),
            17,
            0,
        );
        r.step(100, Some(Input::Cancel { reason: CancelReason::Shutdown }));
        r.step(500, None);
        let renew = sent(&r);
        r.step(510, Some(answer(renew, Ok(lease(500)))));
        r.step(1_000, None);
        let renew = sent(&r);
        r.step(1_005, Some(Input::Cancel { reason: CancelReason::Released }));
        r.step(1_010, Some(answer(renew, Ok(lease(1_000)))));
        all.push(r.finish());

        all
    }

    #[test]
    fn holder_trace_vectors_replay() {
        let dir = dir();
        let recorded = record_all();
        for t in &recorded {
            // Every scripted run ends with the holder over.
            let over = t.steps.iter().any(|s| s.expect.iter().any(|o| o["output"] == "over"));
            assert!(over, "{} does not end", t.name);
        }
        crate::trace_vector::replay_vectors(&dir, &recorded, |t| &t.name, replay);
    }
}
