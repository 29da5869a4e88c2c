//! The elector's decisions as plain functions of (clocks, what the store said, options): no
//! tokio, no I/O. The election machine ([`super::machine::Elector`]) takes them, and the tokio
//! elector and the Node elector (through wasm) drive the machine, so every language elects,
//! renews, keeps and steps down alike.

use super::{Candidate, Strategy, Timing};
// Whether a registration counts, or may be removed, is the registry protocol's rule.
pub use crate::protocol::election::{is_live, is_prunable};

/// The key of the leader lease of `name` (`{prefix}leader/{name}`).
pub fn leader_key(prefix: &str, name: &str) -> String {
    format!("{prefix}leader/{name}")
}

/// The key of the group `name` (its slots are `{key}#slot-{i}`).
pub fn group_key(prefix: &str, name: &str) -> String {
    format!("{prefix}group/{name}")
}

/// The registry key of the candidates of `name`.
pub fn candidates_key(prefix: &str, name: &str) -> String {
    format!("{prefix}candidates/{name}")
}

/// A jittered pause between half of `retry_delay_ms` and all of it (`random` in `[0, 1)`).
pub fn retry_pause_ms(retry_delay_ms: u64, random: f64) -> u64 {
    let half = retry_delay_ms / 2;
    half + (random.clamp(0.0, 1.0) * (retry_delay_ms - half) as f64) as u64
}

/// Whether another attempt after `delay_ms` still starts within the wait (else: skipped).
pub fn retry_within_wait(now_mono_ms: u64, delay_ms: u64, wait_until_mono_ms: u64) -> bool {
    now_mono_ms + delay_ms <= wait_until_mono_ms
}

/// The order a group claim tries its `slots` in: from a random slot on, so contenders do not
/// all queue on slot 0.
pub fn slot_order(slots: u32, random: f64) -> Vec<u32> {
    if slots == 0 {
        return Vec::new();
    }
    let first = ((random.clamp(0.0, 1.0) * slots as f64) as u32).min(slots - 1);
    (0..slots).map(|i| (first + i) % slots).collect()
}

/// Whether a strategic leader steps down at a term boundary: the strategy picks someone else
/// among the live candidates (or nobody).
pub fn steps_down(strategy: &Strategy, candidates: &[Candidate], owner: &str) -> bool {
    strategy.pick(candidates) != Some(owner)
}

/// Whether this candidate may compete for the leader lease now.
pub fn competes(strategy: &Strategy, candidates: &[Candidate], owner: &str) -> bool {
    strategy.pick(candidates) == Some(owner)
}

/// When the next renewal is due after one landed whose deadline is `deadline_mono_ms`.
pub fn next_renew_after_success(deadline_mono_ms: u64, timing: &Timing) -> u64 {
    deadline_mono_ms + timing.skew_ms() + timing.renew_ms() - timing.lease_ms()
}

/// The stored time of a claim: the expiry it wrote minus one lease.
pub fn claim_store_ms(claimed_expires_at_ms: u64, timing: &Timing) -> u64 {
    claimed_expires_at_ms.saturating_sub(timing.lease_ms())
}

/// What a leader whose action is done does about its minimum lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "step", content = "at")]
pub enum MinLease {
    /// The minimum lease has passed: release now.
    Release,
    /// The stored expiry already covers the minimum lease: stop renewing, let it run out.
    RunOut,
    /// Keep renewing; decide again at this monotonic time (or after the next renewal).
    WaitUntil(u64),
}

/// The minimum-lease decision: a short action keeps the lease `min_lease_ms` from its start
/// (`start_mono_ms`; `start_store_ms` is the same moment on the store's clock), so a job run on
/// every host does not run twice in one period.
pub fn min_lease(
    start_mono_ms: u64,
    min_lease_ms: u64,
    now_mono_ms: u64,
    held_expires_at_ms: u64,
    start_store_ms: u64,
) -> MinLease {
    let until = start_mono_ms + min_lease_ms;
    if now_mono_ms >= until {
        MinLease::Release
    } else if held_expires_at_ms >= start_store_ms + min_lease_ms {
        MinLease::RunOut
    } else {
        MinLease::WaitUntil(until)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn timing() -> Timing {
        Timing {
            lease: Duration::from_millis(2_000),
            renew: Duration::from_millis(500),
            skew: Duration::from_millis(200),
        }
    }

    #[test]
    fn keys_match_the_documented_layout() {
        assert_eq!(leader_key("app/", "nightly"), "app/leader/nightly");
        assert_eq!(group_key("", "etl"), "group/etl");
        assert_eq!(candidates_key("x:", "jobs"), "x:candidates/jobs");
    }

    #[test]
    fn retry_pauses_stay_between_half_and_all_of_the_delay() {
        assert_eq!(retry_pause_ms(200, 0.0), 100);
        assert_eq!(retry_pause_ms(200, 0.999_999), 199);
        assert_eq!(retry_pause_ms(201, 0.5), 150);
        assert!(retry_within_wait(100, 50, 150));
        assert!(!retry_within_wait(101, 50, 150));
    }

    #[test]
    fn slot_order_visits_every_slot_once_from_a_random_start() {
        assert_eq!(slot_order(4, 0.6), vec![2, 3, 0, 1]);
        assert_eq!(slot_order(3, 0.999_999), vec![2, 0, 1]);
        assert_eq!(slot_order(1, 0.0), vec![0]);
        assert!(slot_order(0, 0.5).is_empty());
    }

    #[test]
    fn a_leader_steps_down_only_when_the_strategy_picks_someone_else() {
        let c = vec![Candidate::new("a", 1.0), Candidate::new("b", 2.0)];
        assert!(steps_down(&Strategy::HighestScore, &c, "a"));
        assert!(!steps_down(&Strategy::HighestScore, &c, "b"));
        assert!(competes(&Strategy::PreferredNode("a".into()), &c, "a"));
        assert!(steps_down(&Strategy::HighestScore, &[], "b"));
    }

    #[test]
    fn renewals_follow_the_lease_schedule() {
        let t = timing();
        // A deadline at 10_000 (lease - skew after the send at 1_200): renew one interval after the send.
        assert_eq!(next_renew_after_success(10_000, &t), 10_000 + 200 + 500 - 2_000);
        assert_eq!(claim_store_ms(1_000_002_000, &t), 1_000_000_000);
    }

    #[test]
    fn the_minimum_lease_is_kept_then_released_or_left_to_run_out() {
        // Claimed at mono 100 (store time 1_000), 3 s minimum, 2 s lease (expiry 3_000).
        assert_eq!(min_lease(100, 3_000, 150, 3_000, 1_000), MinLease::WaitUntil(3_100));
        // Renewed to expiry 4_000 >= 1_000 + 3_000: the stored lease covers the minimum.
        assert_eq!(min_lease(100, 3_000, 1_500, 4_000, 1_000), MinLease::RunOut);
        assert_eq!(min_lease(100, 3_000, 3_100, 3_000, 1_000), MinLease::Release);
        // No minimum: release at once.
        assert_eq!(min_lease(100, 0, 100, 3_000, 1_000), MinLease::Release);
    }

    #[test]
    fn registrations_are_pruned_only_long_after_they_ran_out() {
        assert!(is_live(1_001, 1_000));
        assert!(!is_live(1_000, 1_000));
        assert!(!is_prunable(1_000, 3_000, 2_000));
        assert!(is_prunable(1_000, 3_001, 2_000));
    }
}
