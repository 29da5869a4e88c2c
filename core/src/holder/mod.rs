//! One held lease as a machine without I/O: the [`Keeper`]'s renewal schedule, retry policy and
//! rule 2 deadline, plus what the holder is told from outside (a deadline covered by a renewal
//! made by hand or by the session it is held under, the session's loss or end, its own
//! cancellation) and the cancel reason that follows, on the monotonic milliseconds the driver
//! passes in. `Hold` (and through it Python's leases, session leases included), Node's
//! `using()` and session leases, and the election machine's terms drive it.
//!
//! A driver creates a [`Holder`] and then, until it emits [`Output::Over`]:
//! - sends every [`Output::Renew`], giving it up once the monotonic clock reaches its
//!   `until_mono_ms` (it then reports nothing: the deadline decides), and feeds the answer back
//!   with [`Holder::handle`] ([`Input::Answer`]);
//! - fires the holder's cancellation on [`Output::Cancel`] (the first reason only is emitted)
//!   and moves its deadline on [`Output::Covered`];
//! - reports covers, session events and its own cancellation as [`Input`]s;
//! - calls [`Holder::handle_timeout`] once the monotonic clock reaches [`Holder::poll_timeout`].
//!
//! [`Holder::may_act`] is rule 2 for the holder: before the deadline and not over.
//! `tests/conformance/holder/` holds runs as trace vectors that Rust and Node replay alike.

use std::collections::VecDeque;

use crate::keeper::{CancelReason, Keeper, Renewal, Upkeep, Wake};
use crate::{DesiredState, Error, Lease, TableConfig};

/// How the lease stays alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Renewed on the lease model's schedule (`hold()`, `using()`).
    Renew,
    /// Nothing is renewed: the holder renews by hand ([`Input::Cover`]); only the deadline is
    /// watched.
    Watch,
    /// Held under a session: the session's renewals move the deadline, its loss or end cancels.
    Session,
}

/// The settings of one held lease.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Setup {
    pub mode: Mode,
    pub lease_ms: u64,
    pub renew_ms: u64,
    pub skew_ms: u64,
}

impl Setup {
    /// A lease of a table with `config`, kept in `mode`.
    pub fn of(config: &TableConfig, mode: Mode) -> Self {
        Self { mode, lease_ms: config.lease_ms(), renew_ms: config.renew_ms(), skew_ms: config.skew_ms() }
    }

    /// The renewal a claim or renewal that left `lease` calls for.
    fn renewal(&self, lease: &Lease) -> Renewal {
        Renewal {
            deadline_mono_ms: lease.deadline_mono_ms,
            next_renew_mono_ms: (lease.deadline_mono_ms + self.skew_ms + self.renew_ms).saturating_sub(self.lease_ms),
            stopped: lease.desired_state == Some(DesiredState::Stopped),
        }
    }
}

/// What happens to the held lease.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "input", rename_all = "snake_case")]
pub enum Input {
    /// The answer to renewal `id`: the lease as renewed, or why not.
    Answer { id: u64, result: Result<Lease, Error> },
    /// The deadline moves to `deadline_mono_ms` if that is later (a renewal or checkpoint made
    /// by hand; under a session, the session's renewal).
    Cover { deadline_mono_ms: u64 },
    /// The session the lease is held under was lost: stop acting (`Lost`).
    SessionLost,
    /// The session the lease is held under was ended: stop acting (`Released`).
    SessionEnded,
    /// The holder cancels for `reason` (shutdown, a hand-over, a release ...).
    Cancel { reason: CancelReason },
}

/// What the driver does.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "output", rename_all = "snake_case")]
pub enum Output {
    /// Send renewal `id`; give it up once the monotonic clock reaches `until_mono_ms`.
    Renew { id: u64, until_mono_ms: u64 },
    /// The deadline moved later, to `deadline_mono_ms`.
    Covered { deadline_mono_ms: u64 },
    /// Fire the holder's cancellation for `reason` (its first reason).
    Cancel { reason: CancelReason },
    /// Nothing more is renewed or timed: the lease is lost, past its deadline or given up.
    Over,
}

/// One held lease; see the module docs.
#[derive(Debug)]
pub struct Holder {
    setup: Setup,
    keeper: Keeper,
    /// The first reason the holder was cancelled for.
    reason: Option<CancelReason>,
    over: bool,
    /// The renewal in flight.
    renewal: Option<u64>,
    next_id: u64,
    rng: u64,
    out: VecDeque<Output>,
    /// The latest time passed in.
    now: u64,
}

impl Holder {
    /// Holds `lease`, just claimed (or renewed) at `now_mono_ms`; `seed` seeds the retry jitter.
    pub fn new(setup: Setup, lease: &Lease, seed: u64, now_mono_ms: u64) -> Self {
        let claim = setup.renewal(lease);
        Self::from_claim(setup, claim, seed, now_mono_ms)
    }

    /// Holds a lease whose claim left `claim` (its deadline and first renewal), at
    /// `now_mono_ms`: an election's term, whose first renewal is due a renew interval after its
    /// claim was sent.
    pub(crate) fn from_claim(setup: Setup, claim: Renewal, seed: u64, now_mono_ms: u64) -> Self {
        let upkeep = if setup.mode == Mode::Renew { Upkeep::Renew } else { Upkeep::Watch };
        let keeper = Keeper::from_claim(claim, upkeep, setup.renew_ms);
        let mut h = Self {
            setup,
            keeper,
            reason: None,
            over: false,
            renewal: None,
            next_id: 0,
            rng: seed,
            out: VecDeque::new(),
            now: now_mono_ms,
        };
        h.advance(now_mono_ms);
        h
    }

    pub fn setup(&self) -> &Setup {
        &self.setup
    }

    /// The next thing to do, if any.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// When the holder must stop acting, monotonic ms.
    pub fn deadline_mono_ms(&self) -> u64 {
        self.keeper.deadline_mono_ms()
    }

    /// Why the holder was cancelled first, once it has been.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.reason
    }

    /// Whether nothing more is renewed or timed ([`Output::Over`] has been emitted).
    pub fn is_over(&self) -> bool {
        self.over
    }

    /// Rule 2: the holder may act only before its deadline, and not once the lease is lost,
    /// past its deadline or given up.
    pub fn may_act(&self, now_mono_ms: u64) -> bool {
        !self.over && self.keeper.may_act(now_mono_ms)
    }

    /// When (monotonic ms) [`Holder::handle_timeout`] is due next, if anything is timed.
    pub fn poll_timeout(&self) -> Option<u64> {
        if self.over {
            return None;
        }
        if self.renewal.is_some() {
            return Some(self.keeper.deadline_mono_ms());
        }
        Some(match self.keeper.poll(self.now) {
            Wake::SleepUntil(at) => at,
            Wake::Renew { .. } | Wake::Deadline => self.now,
        })
    }

    /// The monotonic clock reached `now_mono_ms`.
    pub fn handle_timeout(&mut self, now_mono_ms: u64) {
        self.advance(now_mono_ms);
    }

    /// `input` arrived at `now_mono_ms`.
    pub fn handle(&mut self, input: Input, now_mono_ms: u64) {
        self.take(input, now_mono_ms);
        self.advance(now_mono_ms);
    }

    /// `input` arrived at `now_mono_ms`, and what it decides (a lost lease, a cancellation) is
    /// done; what falls due at that time waits for [`Holder::handle_timeout`], which the driver
    /// calls next at the same time after its own checks of it (the elector's minimum lease).
    pub(crate) fn take(&mut self, input: Input, now_mono_ms: u64) {
        self.now = self.now.max(now_mono_ms);
        match input {
            Input::Answer { id, result } if self.renewal == Some(id) && !self.over => {
                self.renewal = None;
                self.renewed(result, now_mono_ms);
            }
            // A late answer to a renewal given up, or one after the end.
            Input::Answer { .. } => {}
            Input::Cover { deadline_mono_ms } => self.cover(deadline_mono_ms),
            Input::SessionLost if self.setup.mode == Mode::Session => self.cancel(CancelReason::Lost),
            Input::SessionEnded if self.setup.mode == Mode::Session => self.cancel(CancelReason::Released),
            Input::SessionLost | Input::SessionEnded => {}
            Input::Cancel { reason } => self.cancel(reason),
        }
    }

    /// A uniform draw in [0, 1) from the seeded source.
    fn unit(&mut self) -> f64 {
        crate::config::unit_draw(&mut self.rng)
    }

    fn cover(&mut self, deadline_mono_ms: u64) {
        if self.over {
            return;
        }
        let before = self.keeper.deadline_mono_ms();
        self.keeper.cover(deadline_mono_ms);
        let after = self.keeper.deadline_mono_ms();
        if after > before {
            self.out.push_back(Output::Covered { deadline_mono_ms: after });
        }
    }

    fn renewed(&mut self, result: Result<Lease, Error>, now: u64) {
        let unit = self.unit();
        let before = self.keeper.deadline_mono_ms();
        let stop = match result {
            Ok(lease) => self.keeper.renewed(Ok(self.setup.renewal(&lease)), now, unit),
            Err(e) => self.keeper.renewed(Err(&e), now, unit),
        };
        let after = self.keeper.deadline_mono_ms();
        if after > before {
            self.out.push_back(Output::Covered { deadline_mono_ms: after });
        }
        if let Some(reason) = stop {
            self.cancel(reason);
        }
    }

    /// Cancels for `reason` (emitted if it is the first); a reason that leaves the lease
    /// unusable ends the holder, the others (STOPPED, shutdown, a hand-over) keep it renewed
    /// while the holder winds down.
    fn cancel(&mut self, reason: CancelReason) {
        if self.over {
            return;
        }
        if self.reason.is_none() {
            self.reason = Some(reason);
            self.out.push_back(Output::Cancel { reason });
        }
        if matches!(reason, CancelReason::Lost | CancelReason::Deadline | CancelReason::Released) {
            self.over = true;
            self.renewal = None;
            self.out.push_back(Output::Over);
        }
    }

    /// Does what is due at `now`: rule 2, then the renewal schedule.
    fn advance(&mut self, now: u64) {
        self.now = self.now.max(now);
        if self.over {
            return;
        }
        match self.keeper.poll(now) {
            Wake::Deadline => self.cancel(CancelReason::Deadline),
            Wake::Renew { until_mono_ms } if self.renewal.is_none() => {
                self.next_id += 1;
                self.renewal = Some(self.next_id);
                self.out.push_back(Output::Renew { id: self.next_id, until_mono_ms });
            }
            _ => {}
        }
    }
}

pub mod vectors;

#[cfg(test)]
mod tests;
