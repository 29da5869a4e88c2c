//! One held lease's upkeep, decided without I/O: when to renew next, how a failed renewal is
//! retried, where the local deadline stands (a session renewal moves it), and whether the holder
//! may act now. Every held lease of every kind runs on it: a worker's connections, `Hold` (and
//! through it the Python leases, session leases included) and the elector's terms, so rule 2 and
//! the renewal retry policy are decided in one place.
//!
//! A driver asks [`Keeper::poll`] what to do at a monotonic time, sends the renewal it is told to
//! (giving it up at `until_mono_ms`: no request of the holder may be in flight past the deadline),
//! and reports the answer with [`Keeper::renewed`].

use crate::lease::{backoff_ms, retry_fits};
use crate::{DesiredState, Error, Lease, TableConfig};

/// Why a handler's cancellation token fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum CancelReason {
    /// The local deadline passed without a successful renewal (the store may be unreachable).
    Deadline,
    /// The store said the lease is no longer ours (taken over, or the item changed hands).
    Lost,
    /// The work's desired state became STOPPED.
    Stopped,
    /// The worker is shutting down.
    Shutdown,
    /// The handler returned and the lease was given up.
    Released,
    /// Session mode: the worker holds more than its fair share of the fleet's work and hands
    /// this connection over: checkpoint and return; it is released and hinted, and the next
    /// owner resumes from the checkpoint.
    HandOver,
}

impl CancelReason {
    pub fn as_str(self) -> &'static str {
        match self {
            CancelReason::Deadline => "Deadline",
            CancelReason::Lost => "Lost",
            CancelReason::Stopped => "Stopped",
            CancelReason::Shutdown => "Shutdown",
            CancelReason::Released => "Released",
            CancelReason::HandOver => "HandOver",
        }
    }
}

impl std::fmt::Display for CancelReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a held lease stays alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upkeep {
    /// Renewed on the lease model's schedule (per-item leases, `hold()`, election terms).
    Renew,
    /// Nothing is renewed for it: the holder renews by hand, or (session mode) the session's
    /// renewals move its deadline through [`Keeper::cover`]. Only the deadline is watched.
    Watch,
}

/// What the driver does at a given time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Send a renewal now, and give it up (sending nothing else) once the monotonic clock
    /// reaches `until_mono_ms`: that is the deadline, and then [`Wake::Deadline`] holds.
    Renew { until_mono_ms: u64 },
    /// The deadline has passed: the holder must stop acting (cancel with `Deadline`).
    Deadline,
    /// Nothing to do before this monotonic time.
    SleepUntil(u64),
}

/// One held lease's schedule; see the module docs.
#[derive(Debug, Clone)]
pub struct Keeper {
    upkeep: Upkeep,
    deadline_mono_ms: u64,
    /// The next renewal (renewing leases only; `u64::MAX` once nothing more is sent).
    next_renew_mono_ms: u64,
    /// Failed renewals in a row.
    attempt: u32,
    /// The renew interval: the retry policy backs off to half of it.
    renew_ms: u64,
}

/// A renewal that landed: the new local deadline, when the next renewal is due, and whether the
/// work was found STOPPED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewal {
    pub deadline_mono_ms: u64,
    pub next_renew_mono_ms: u64,
    pub stopped: bool,
}

impl Renewal {
    /// `lease` as a renewal (or a claim) left it.
    pub fn of(lease: &Lease, config: &TableConfig) -> Self {
        Self {
            deadline_mono_ms: lease.deadline_mono_ms,
            next_renew_mono_ms: lease.next_renew_mono_ms(config),
            stopped: lease.desired_state == Some(DesiredState::Stopped),
        }
    }
}

/// The shortest wait before a renewal is retried: a store that fails instantly does not turn
/// the retries into a busy loop.
pub const MIN_RETRY_MS: u64 = 10;

impl Keeper {
    /// The upkeep of `lease`, just claimed or renewed.
    pub fn new(lease: &Lease, upkeep: Upkeep, config: &TableConfig) -> Self {
        Self::from_claim(Renewal::of(lease, config), upkeep, config.renew_ms())
    }

    /// The upkeep of a lease whose claim (or last renewal) left `claim`, renewed every
    /// `renew_ms` (the election's terms, whose timing is their backend's).
    pub fn from_claim(claim: Renewal, upkeep: Upkeep, renew_ms: u64) -> Self {
        let next = match upkeep {
            Upkeep::Renew => claim.next_renew_mono_ms,
            Upkeep::Watch => u64::MAX,
        };
        Self { upkeep, deadline_mono_ms: claim.deadline_mono_ms, next_renew_mono_ms: next, attempt: 0, renew_ms }
    }

    pub fn upkeep(&self) -> Upkeep {
        self.upkeep
    }

    /// When the holder must stop acting, monotonic ms.
    pub fn deadline_mono_ms(&self) -> u64 {
        self.deadline_mono_ms
    }

    /// Moves the deadline to `deadline_mono_ms` if that is later (a session renewal, or a
    /// renewal made by hand); never earlier.
    pub fn cover(&mut self, deadline_mono_ms: u64) {
        self.deadline_mono_ms = self.deadline_mono_ms.max(deadline_mono_ms);
    }

    /// Brings the first renewal after a claim at `now_mono_ms` forward to a point spread over the
    /// renew interval by `phase` in [0, 1) (never later than it was). Renewals keep the phase of
    /// the claim they follow: claims that came in a burst (a cold start paced by a partition's
    /// write budget) would renew in the same burst every interval, and a sharded orphan index
    /// partition that took the claims at its limit would take their renewals at it for good.
    /// Spread, each partition value takes its leases' renewals evenly over the interval.
    pub fn spread_first_renewal(&mut self, now_mono_ms: u64, phase: f64) {
        if self.next_renew_mono_ms == u64::MAX || self.next_renew_mono_ms <= now_mono_ms {
            return;
        }
        let span = self.next_renew_mono_ms - now_mono_ms;
        let at = now_mono_ms + 1 + (phase.clamp(0.0, 1.0) * (span - 1) as f64) as u64;
        self.next_renew_mono_ms = self.next_renew_mono_ms.min(at);
    }

    /// Rule 2: the holder may act only before its deadline.
    pub fn may_act(&self, now_mono_ms: u64) -> bool {
        now_mono_ms < self.deadline_mono_ms
    }

    /// What to do at `now_mono_ms`.
    pub fn poll(&self, now_mono_ms: u64) -> Wake {
        if !self.may_act(now_mono_ms) {
            return Wake::Deadline;
        }
        if now_mono_ms >= self.next_renew_mono_ms {
            return Wake::Renew { until_mono_ms: self.deadline_mono_ms };
        }
        Wake::SleepUntil(self.next_renew_mono_ms.min(self.deadline_mono_ms))
    }

    /// The answer to the renewal [`Keeper::poll`] asked for, at `now_mono_ms`; `unit` is a
    /// uniform random number in [0, 1) for the retry's jitter. Returns why the holder must stop
    /// (`Lost`), or must wind down while the lease stays renewed (`Stopped`), if it must.
    pub fn renewed(&mut self, answer: Result<Renewal, &Error>, now_mono_ms: u64, unit: f64) -> Option<CancelReason> {
        match answer {
            Ok(renewal) => {
                self.attempt = 0;
                self.cover(renewal.deadline_mono_ms);
                self.next_renew_mono_ms = renewal.next_renew_mono_ms;
                renewal.stopped.then_some(CancelReason::Stopped)
            }
            Err(Error::Lost { .. } | Error::NotFound { .. }) => {
                self.next_renew_mono_ms = u64::MAX;
                Some(CancelReason::Lost)
            }
            Err(_) => {
                let delay = retry_delay_ms(self.attempt, self.renew_ms, unit);
                self.attempt += 1;
                self.next_renew_mono_ms = if retry_fits(now_mono_ms, delay, self.deadline_mono_ms) {
                    now_mono_ms + delay
                } else {
                    // No retry fits: wait out the deadline itself.
                    u64::MAX
                };
                None
            }
        }
    }
}

/// The one renewal retry policy: full-jitter backoff from 100 ms, capped at half a renew
/// interval, at least [`MIN_RETRY_MS`].
pub fn retry_delay_ms(attempt: u32, renew_ms: u64, unit: f64) -> u64 {
    backoff_ms(attempt, 100, (renew_ms / 2).max(100), unit).max(MIN_RETRY_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> TableConfig {
        TableConfig::default()
    }

    /// Claimed at monotonic `sent`: deadline sent + 19 s, next renewal sent + 5 s.
    fn lease(sent: u64, desired: Option<DesiredState>) -> Lease {
        Lease {
            id: "a".into(),
            owner: "w".into(),
            fence: 1,
            expires_at_ms: 0,
            deadline_mono_ms: sent + 19_000,
            last_seq: None,
            url: None,
            desired_state: desired,
        }
    }

    #[test]
    fn renews_on_schedule_and_stops_at_the_deadline() {
        let c = cfg();
        let mut k = Keeper::new(&lease(0, None), Upkeep::Renew, &c);
        assert_eq!(k.poll(1_000), Wake::SleepUntil(5_000));
        assert_eq!(k.poll(5_000), Wake::Renew { until_mono_ms: 19_000 });
        assert_eq!(k.renewed(Ok(Renewal::of(&lease(5_000, None), &c)), 5_050, 0.5), None);
        assert_eq!((k.deadline_mono_ms(), k.poll(5_050)), (24_000, Wake::SleepUntil(10_000)));
        // A STOPPED answer: wind down, keep renewing.
        assert_eq!(
            k.renewed(Ok(Renewal::of(&lease(10_000, Some(DesiredState::Stopped)), &c)), 10_010, 0.5),
            Some(CancelReason::Stopped)
        );
        assert_eq!(k.poll(10_010), Wake::SleepUntil(15_000));
        assert_eq!(k.poll(29_000), Wake::Deadline);
        assert!(!k.may_act(29_000) && k.may_act(28_999));
    }

    #[test]
    fn the_first_renewal_is_spread_over_the_interval_and_never_later() {
        let c = cfg();
        let due = Keeper::new(&lease(0, None), Upkeep::Renew, &c).next_renew_mono_ms;
        let at = |phase: f64| {
            let mut k = Keeper::new(&lease(0, None), Upkeep::Renew, &c);
            k.spread_first_renewal(0, phase);
            assert!(k.next_renew_mono_ms <= due && k.next_renew_mono_ms >= 1, "{phase}");
            k.next_renew_mono_ms
        };
        assert_eq!(at(0.0), 1);
        assert!(at(0.999_999) >= due - 1);
        // Evenly spread: a tenth of the phases land in each tenth of the interval.
        let mut tenths = [0usize; 10];
        for i in 0..1_000 {
            tenths[(at(f64::from(i) / 1_000.0) * 10 / due).min(9) as usize] += 1;
        }
        assert!(tenths.iter().all(|n| (95..=105).contains(n)), "{tenths:?}");
        // A watched lease (session mode) has no renewal to move.
        let mut w = Keeper::new(&lease(0, None), Upkeep::Watch, &c);
        w.spread_first_renewal(0, 0.5);
        assert!(matches!(w.poll(1), Wake::SleepUntil(_)));
    }

    #[test]
    fn failed_renewals_retry_with_jitter_until_no_retry_fits() {
        let c = cfg();
        let mut k = Keeper::new(&lease(0, None), Upkeep::Renew, &c);
        assert_eq!(k.renewed(Err(&Error::Throttled), 5_000, 0.5), None);
        assert_eq!(k.poll(5_000), Wake::SleepUntil(5_050));
        assert_eq!(k.renewed(Err(&Error::Throttled), 5_050, 0.0), None);
        assert_eq!(k.poll(5_050), Wake::SleepUntil(5_060), "the floor");
        // Late in the lease a retry that would pass the deadline is not scheduled.
        assert_eq!(k.renewed(Err(&Error::Store("x".into())), 18_990, 0.99), None);
        assert_eq!(k.poll(18_990), Wake::SleepUntil(19_000));
        assert_eq!(k.poll(19_000), Wake::Deadline);
        for gone in [Error::Lost { id: "a".into() }, Error::NotFound { id: "a".into() }] {
            let mut k = Keeper::new(&lease(0, None), Upkeep::Renew, &c);
            assert_eq!(k.renewed(Err(&gone), 5_000, 0.5), Some(CancelReason::Lost));
            assert_eq!(k.poll(6_000), Wake::SleepUntil(19_000), "nothing more is sent");
        }
    }

    #[test]
    fn a_watched_lease_renews_nothing_and_its_deadline_moves_only_later() {
        let c = cfg();
        let mut k = Keeper::new(&lease(0, None), Upkeep::Watch, &c);
        assert_eq!(k.poll(5_000), Wake::SleepUntil(19_000));
        k.cover(25_000);
        k.cover(20_000);
        assert_eq!((k.deadline_mono_ms(), k.poll(19_500)), (25_000, Wake::SleepUntil(25_000)));
        assert_eq!(k.poll(25_000), Wake::Deadline);
    }

    #[test]
    fn the_retry_policy_backs_off_to_half_a_renew_interval() {
        assert_eq!(retry_delay_ms(0, 5_000, 0.5), 50);
        assert_eq!(retry_delay_ms(30, 5_000, 1.0), 2_500);
        assert_eq!(retry_delay_ms(0, 5_000, 0.0), MIN_RETRY_MS);
    }
}
