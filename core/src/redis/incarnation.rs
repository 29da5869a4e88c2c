//! How the Redis store survives the server losing its state (a restart without persistence, a
//! restart from an older snapshot, a failover to a replica that missed the last writes, a
//! `FLUSHALL`): the two rules every script applies first, as plain functions. The scripts in
//! `mod.rs` are the same rules in Lua; the tests below run them on a manual clock.
//!
//! **Detection.** Each key prefix has a marker hash, `{prefix}incarnation`, written without expiry
//! at first use: the run id of the server that holds the prefix's keys (`INFO server`, read once
//! per connection) and the server time at which a loss was last noticed. A script that finds the
//! marker missing, or naming another server run, has found a loss and writes a new marker.
//!
//! **Hold-off.** Every claim (leader key, group slot, and so the leader key a strategic candidate
//! competes for) is refused until one lease + skew after the loss was noticed. A holder that has
//! not seen the loss had its last renewal answered by the old server, before the loss, so it
//! stops at its own deadline (`sent + lease - skew`) before anyone can claim. The time is kept in
//! the marker, on the server's clock, so every process honours the same hold-off whenever it
//! notices; a second loss removes the marker again and restarts the hold-off. Renewals, releases
//! and fenced writes are not held off: they only succeed on a key the server still has, token
//! and fence included.
//!
//! **Fences.** A claim's fence is `max(server TIME in microseconds, last fence of the key + 1)`.
//! The `+ 1` keeps fences increasing while the server keeps its state; the clock keeps them
//! increasing across a loss, when the last fence is gone. This assumes the server's clock does
//! not step back by more than the time between the last claim before a loss and the first one
//! after it (a restart, plus the hold-off).

/// What the marker of a prefix says: which server run holds the keys, and when a loss was last
/// noticed (server time, epoch ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incarnation {
    pub run_id: String,
    pub lost_at_ms: u64,
}

/// What a script decides from the marker before it does its own work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// The marker to write: a loss was noticed now (`None`: the stored one stands).
    pub write: Option<Incarnation>,
    /// Server time (epoch ms) from which claims are accepted again.
    pub claims_open_at_ms: u64,
}

impl Check {
    /// Whether a claim made at `now_ms` (server time) may proceed.
    pub fn claims_open(&self, now_ms: u64) -> bool {
        now_ms >= self.claims_open_at_ms
    }

    /// Whether this check noticed a loss.
    pub fn noticed_loss(&self) -> bool {
        self.write.is_some()
    }
}

/// The decision of every script: `stored` is the prefix's marker (`None` when missing), `run_id`
/// the server run the caller is connected to, `now_ms` the server's clock, `hold_off_ms` one
/// lease + skew of the caller.
pub fn check(stored: Option<&Incarnation>, run_id: &str, now_ms: u64, hold_off_ms: u64) -> Check {
    match stored {
        Some(marker) if marker.run_id == run_id => {
            Check { write: None, claims_open_at_ms: marker.lost_at_ms.saturating_add(hold_off_ms) }
        }
        _ => Check {
            write: Some(Incarnation { run_id: run_id.to_string(), lost_at_ms: now_ms }),
            claims_open_at_ms: now_ms.saturating_add(hold_off_ms),
        },
    }
}

/// How long claims are refused after a loss: one lease + skew, so every holder of the lost state
/// has passed its deadline (`sent + lease - skew`) first.
pub fn hold_off_ms(lease_ms: u64, skew_ms: u64) -> u64 {
    lease_ms + skew_ms
}

/// The fence of a new claim: the server's clock in microseconds, or one above the key's last
/// fence (`None` when the server has none, e.g. after a loss) when that is higher.
pub fn next_fence(now_us: u64, last: Option<u64>) -> u64 {
    now_us.max(last.map_or(0, |l| l.saturating_add(1)))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::{Clock, ManualClock};

    const LEASE: u64 = 2_000;
    const SKEW: u64 = 200;
    const HOLD: u64 = LEASE + SKEW;

    /// A Redis server as the scripts see it: the marker, the fence keys and the leader keys
    /// (owner, fence, expiry), its run id, and its clock (the manual clock).
    struct Server<'a> {
        clock: &'a ManualClock,
        run_id: String,
        marker: Option<Incarnation>,
        fences: HashMap<String, u64>,
        leases: HashMap<String, (String, u64, u64)>,
    }

    /// A process of the election: the run id its connection read.
    struct Process {
        run_id: String,
    }

    impl<'a> Server<'a> {
        fn new(clock: &'a ManualClock, run_id: &str) -> Self {
            Server { clock, run_id: run_id.into(), marker: None, fences: HashMap::new(), leases: HashMap::new() }
        }

        fn connect(&self) -> Process {
            Process { run_id: self.run_id.clone() }
        }

        /// The server restarts empty (no persistence): a new run id, every key gone.
        fn lose_everything(&mut self, new_run: &str) {
            self.run_id = new_run.into();
            self.marker = None;
            self.fences.clear();
            self.leases.clear();
        }

        /// The prelude of every script.
        fn prelude(&mut self, p: &Process) -> Check {
            let c = check(self.marker.as_ref(), &p.run_id, self.clock.now_ms(), HOLD);
            if let Some(m) = &c.write {
                self.marker = Some(m.clone());
            }
            c
        }

        /// The claim script: `Err(open_at)` while held off, `Ok(None)` while held by someone.
        fn claim(&mut self, p: &Process, key: &str, owner: &str) -> Result<Option<u64>, u64> {
            let c = self.prelude(p);
            let now = self.clock.now_ms();
            if !c.claims_open(now) {
                return Err(c.claims_open_at_ms);
            }
            if self.leases.get(key).is_some_and(|(_, _, exp)| *exp > now) {
                return Ok(None);
            }
            let fence = next_fence(now * 1_000, self.fences.get(key).copied());
            self.fences.insert(key.into(), fence);
            self.leases.insert(key.into(), (owner.into(), fence, now + LEASE));
            Ok(Some(fence))
        }

        /// The renewal script: only the holder of a key the server still has extends it.
        fn renew(&mut self, p: &Process, key: &str, owner: &str, fence: u64) -> bool {
            self.prelude(p);
            let now = self.clock.now_ms();
            match self.leases.get_mut(key) {
                Some((o, f, exp)) if o == owner && *f == fence && *exp > now => {
                    *exp = now + LEASE;
                    true
                }
                _ => false,
            }
        }
    }

    #[test]
    fn first_use_holds_claims_off_once_then_never_again() {
        let clock = ManualClock::new(1_000_000);
        let mut server = Server::new(&clock, "run-a");
        let p = server.connect();
        // A fresh server cannot be told from one that just lost everything.
        assert_eq!(server.claim(&p, "leader/x", "p"), Err(1_000_000 + HOLD));
        clock.advance(HOLD - 1);
        assert!(server.claim(&p, "leader/x", "p").is_err());
        clock.advance(1);
        assert!(matches!(server.claim(&p, "leader/x", "p"), Ok(Some(_))));
        // The marker stands: later scripts notice nothing.
        clock.advance(60_000);
        assert!(!server.prelude(&p).noticed_loss());
    }

    #[test]
    fn processes_noticing_a_loss_at_different_times_honour_one_hold_off() {
        let clock = ManualClock::new(5_000_000);
        let mut server = Server::new(&clock, "run-a");
        let a = server.connect();
        assert!(server.prelude(&a).noticed_loss(), "first use");
        clock.advance(HOLD);
        let Ok(Some(fence)) = server.claim(&a, "leader/x", "a") else { panic!("a claims") };
        clock.advance(500);
        server.lose_everything("run-b");
        // Every connection died with the server: the processes reconnect at different times.
        clock.advance(100);
        let b = server.connect();
        let noticed = clock.now_ms();
        assert_eq!(server.claim(&b, "leader/x", "b"), Err(noticed + HOLD), "b notices first");
        clock.advance(900);
        let c = server.connect();
        assert_eq!(server.claim(&c, "leader/x", "c"), Err(noticed + HOLD), "c gets the same hold-off");
        // The old holder's renewal finds its key gone: it stops at once.
        let a = server.connect();
        assert!(!server.renew(&a, "leader/x", "a", fence));
        clock.set_wall(noticed + HOLD - 1);
        assert!(server.claim(&c, "leader/x", "c").is_err());
        clock.set_wall(noticed + HOLD);
        let Ok(Some(next)) = server.claim(&c, "leader/x", "c") else { panic!("c claims") };
        assert!(next > fence);
    }

    #[test]
    fn a_second_loss_during_a_hold_off_restarts_it() {
        let clock = ManualClock::new(9_000_000);
        let mut server = Server::new(&clock, "run-a");
        let p = server.connect();
        let first = server.claim(&p, "leader/x", "p").unwrap_err();
        clock.advance(HOLD / 2);
        server.lose_everything("run-b");
        let p = server.connect();
        clock.advance(10);
        let second = server.claim(&p, "leader/x", "p").unwrap_err();
        assert_eq!(second, clock.now_ms() + HOLD);
        assert!(second > first);
        clock.advance(HOLD / 2 + 100);
        assert!(server.claim(&p, "leader/x", "p").is_err(), "the first hold-off's end no longer opens claims");
    }

    #[test]
    fn another_server_run_with_the_marker_still_there_is_a_loss() {
        // A restart from an older snapshot, or a failover to a replica: the marker came along,
        // but its run id is not the server's.
        let clock = ManualClock::new(2_000_000);
        let stored = Incarnation { run_id: "primary".into(), lost_at_ms: 1_000_000 };
        let same = check(Some(&stored), "primary", clock.now_ms(), HOLD);
        assert!(!same.noticed_loss() && same.claims_open(clock.now_ms()));
        let failover = check(Some(&stored), "replica", clock.now_ms(), HOLD);
        assert_eq!(failover.write, Some(Incarnation { run_id: "replica".into(), lost_at_ms: 2_000_000 }));
        assert!(!failover.claims_open(clock.now_ms()));
        assert!(failover.claims_open(2_000_000 + HOLD));
    }

    #[test]
    fn fences_never_go_backward_across_losses() {
        let clock = ManualClock::new(3_000_000);
        let mut server = Server::new(&clock, "run-0");
        let mut fences = Vec::new();
        for restart in 0..5 {
            let p = server.connect();
            let open = server.claim(&p, "leader/x", "p").unwrap_err();
            clock.set_wall(open);
            for _ in 0..3 {
                let fence = server.claim(&p, "leader/x", "p").unwrap().unwrap();
                fences.push(fence);
                // Released at once: the next claim comes in the same millisecond.
                server.leases.clear();
            }
            clock.advance(50);
            server.lose_everything(&format!("run-{}", restart + 1));
        }
        assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
        // Within one millisecond the clock alone would repeat itself: the last fence + 1 wins.
        assert_eq!(fences[1], fences[0] + 1);
        assert_eq!(next_fence(10, Some(50)), 51);
        assert_eq!(next_fence(10, None), 10);
        assert_eq!(next_fence(u64::MAX, Some(u64::MAX)), u64::MAX);
    }

    #[test]
    fn an_unaware_holder_is_past_its_deadline_before_claims_open() {
        // A holder whose last renewal was sent at `sent` (answered by the old server, so before
        // the loss at `lost`) stops at `sent + lease - skew`; the loss is noticed at `noticed`.
        for sent in [0u64, 1, 700, 1_999] {
            for after_renewal in [0u64, 1, 1_500] {
                for notice_delay in [0u64, 3, 5_000] {
                    let lost = sent + after_renewal;
                    let noticed = lost + notice_delay;
                    let deadline = sent + LEASE - SKEW;
                    let c = check(None, "run", noticed, hold_off_ms(LEASE, SKEW));
                    assert!(!c.claims_open(deadline), "sent {sent}, lost {lost}, noticed {noticed}");
                    assert!(c.claims_open_at_ms >= deadline + 2 * SKEW);
                }
            }
        }
    }
}
