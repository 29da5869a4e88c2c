//! Session mode for JavaScript: the session operations of the protocol (create, renew, end,
//! retire, the claim under a session, the listing) as [`Op`]s, and the session loop's decisions
//! (`leaselock::worker::decide`). Sessions cross as `{ owner, epoch, expiresAtMs, deadline }`,
//! `deadline` on the driver's monotonic clock like a lease's.

use std::collections::HashSet;

use leaselock::protocol::{ClaimInSession, CreateSession, EndSession, RenewSession, RetireSession, Sessions};
use leaselock::worker::decide::{self, Balancer, FleetView, PeerSession};
use leaselock::{LeaseItem, LeaseMode, Session, SessionItem, SessionLoad, TableConfig};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;

use crate::protocol::{IntoJs, Op};
use crate::worker::{self, JsOrphanPoll};
use crate::{error, parse, text, throw, Table};

/// A live session (`Session`), as JavaScript sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JsSession {
    pub owner: String,
    pub epoch: u64,
    pub expires_at_ms: u64,
    pub deadline: u64,
}

impl From<Session> for JsSession {
    fn from(s: Session) -> Self {
        JsSession { owner: s.owner, epoch: s.epoch, expires_at_ms: s.expires_at_ms, deadline: s.deadline_mono_ms }
    }
}

impl From<JsSession> for Session {
    fn from(s: JsSession) -> Self {
        Session { owner: s.owner, epoch: s.epoch, expires_at_ms: s.expires_at_ms, deadline_mono_ms: s.deadline }
    }
}

/// A stored session item (`SessionItem`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JsSessionItem {
    pub owner: String,
    pub epoch: u64,
    pub expires_at_ms: u64,
    /// What the session last reported holding (session renewals of balancing workers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_connections: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u64>,
}

impl From<JsSessionItem> for SessionItem {
    fn from(s: JsSessionItem) -> Self {
        let load = s
            .held_connections
            .zip(s.max_connections)
            .map(|(held, max_connections)| SessionLoad { held, max_connections });
        SessionItem { owner: s.owner, epoch: s.epoch, expires_at_ms: s.expires_at_ms, load }
    }
}

impl IntoJs for Session {
    fn into_js(self) -> Value {
        json!(JsSession::from(self))
    }
}

impl IntoJs for Vec<SessionItem> {
    fn into_js(self) -> Value {
        let items = self.into_iter().map(|s| JsSessionItem {
            owner: s.owner,
            epoch: s.epoch,
            expires_at_ms: s.expires_at_ms,
            held_connections: s.load.map(|l| l.held),
            max_connections: s.load.map(|l| l.max_connections),
        });
        Value::Array(items.map(|s| json!(s)).collect())
    }
}

impl IntoJs for bool {
    fn into_js(self) -> Value {
        Value::Bool(self)
    }
}

fn session(json: &str) -> Result<Session, JsValue> {
    Ok(Session::from(parse::<JsSession>("session", json)?))
}

/// A whole number from JavaScript, `None` when negative (not given).
fn optional(v: f64) -> Option<u64> {
    (v >= 0.0).then_some(v as u64)
}

#[wasm_bindgen]
impl Table {
    /// How many orphan-index partition values running work is spread over (1: unsharded).
    #[wasm_bindgen(getter, js_name = orphanShards)]
    pub fn orphan_shards(&self) -> u32 {
        self.config.orphan_shards
    }

    /// `"item"` or `"session"`.
    #[wasm_bindgen(getter)]
    pub fn mode(&self) -> String {
        match self.config.mode {
            LeaseMode::PerItem => "item".into(),
            LeaseMode::Session => "session".into(),
        }
    }

    /// A new epoch of `owner`'s session; `previous_epoch` (negative: none) is the epoch this
    /// worker held and stopped acting for.
    #[wasm_bindgen(js_name = createSession)]
    pub fn create_session(&self, owner: &str, previous_epoch: f64) -> Result<Op, JsValue> {
        CreateSession::new(&self.config, owner, optional(previous_epoch)).map(Op::new).map_err(|e| throw(&e))
    }

    /// The session's renewal; with `load_json` (`{ held, maxConnections }`) the same write
    /// reports what the worker holds, for the fleet's balance.
    #[wasm_bindgen(js_name = renewSession)]
    pub fn renew_session(&self, session_json: &str, load_json: Option<String>) -> Result<Op, JsValue> {
        let renew = RenewSession::new(&self.config, &session(session_json)?);
        Ok(Op::new(match load_json {
            Some(json) => renew.reporting(parse::<JsLoad>("load", &json)?.into()),
            None => renew,
        }))
    }

    #[wasm_bindgen(js_name = endSession)]
    pub fn end_session(&self, session_json: &str, load_json: Option<String>) -> Result<Op, JsValue> {
        let end = EndSession::new(&self.config, &session(session_json)?);
        Ok(Op::new(match load_json {
            Some(json) => end.reporting(parse::<JsLoad>("load", &json)?.into()),
            None => end,
        }))
    }

    #[wasm_bindgen(js_name = retireSession)]
    pub fn retire_session(&self, owner: &str, epoch: f64) -> Result<Op, JsValue> {
        RetireSession::new(&self.config, owner, epoch as u64).map(Op::new).map_err(|e| throw(&e))
    }

    /// The fleet's claim of STARTED work `id` under the session (a dead session's work by one
    /// TransactWriteItems).
    #[wasm_bindgen(js_name = claimInSession)]
    pub fn claim_in_session(&self, id: &str, session_json: &str) -> Result<Op, JsValue> {
        ClaimInSession::new(&self.config, id, &session(session_json)?).map(Op::new).map_err(|e| throw(&e))
    }

    /// Session items whose expiry is below `below_ms` (negative: all), oldest first.
    pub fn sessions(&self, below_ms: f64) -> Op {
        Op::new(Sessions::new(&self.config, optional(below_ms).unwrap_or(u64::MAX)))
    }

    /// The cutoff below which a session is dead (rule 1) at wall time `now_ms`.
    #[wasm_bindgen(js_name = claimCutoff)]
    pub fn claim_cutoff(&self, now_ms: f64) -> f64 {
        leaselock::lease::claim_cutoff(now_ms as u64, &self.config) as f64
    }

    /// How long to wait before opening a session again after `error_json`.
    #[wasm_bindgen(js_name = sessionRetryMs)]
    pub fn session_retry_ms(&self, error_json: &str, failures: u32, now_ms: f64, random: f64) -> Result<f64, JsValue> {
        let err = error::from_json(&parse("error", error_json)?);
        Ok(decide::session_retry_ms(&err, failures, now_ms as u64, &self.config, random) as f64)
    }

    /// When the session loop wakes next (monotonic): the renewal or the deadline.
    #[wasm_bindgen(js_name = sessionWakeAt)]
    pub fn session_wake_at(&self, session_json: &str) -> Result<f64, JsValue> {
        Ok(decide::session_wake_at(&session(session_json)?, &self.config) as f64)
    }
}

/// What a balancing worker reports with each session renewal.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsLoad {
    held: u64,
    max_connections: u64,
}

impl From<JsLoad> for SessionLoad {
    fn from(l: JsLoad) -> Self {
        SessionLoad { held: l.held, max_connections: l.max_connections }
    }
}

/// A balancing worker's side of the fleet-aware balance (`decide::Balancer`): fed the listing
/// of every session and the orphan page at each orphan poll, it says the claim limit and how
/// many connections to hand over now.
#[wasm_bindgen]
pub struct Balance {
    config: TableConfig,
    own: String,
    pace_ms: u64,
    balancer: Balancer,
    /// The other workers' live sessions, from the last [`Balance::read`].
    peers: Vec<PeerSession>,
}

#[wasm_bindgen]
impl Balance {
    /// The balance of worker `own` on `table`, whose orphan poll runs every `orphan_interval_ms`.
    #[wasm_bindgen(constructor)]
    pub fn new(table: &Table, own: &str, orphan_interval_ms: f64) -> Balance {
        let pace_ms = decide::balance_pace_ms(table.config.renew_ms(), orphan_interval_ms as u64);
        Balance {
            config: table.config.clone(),
            own: own.into(),
            pace_ms,
            balancer: Balancer::default(),
            peers: Vec::new(),
        }
    }

    /// Reads the listing of every session (as `sessions()` gives it): keeps the others' live
    /// sessions and returns the dead ones, ours included (same shape).
    pub fn read(&mut self, sessions_json: &str, now_ms: f64, mono_ms: f64) -> Result<String, JsValue> {
        let sessions = parse::<Vec<JsSessionItem>>("sessions", sessions_json)?.into_iter().map(Into::into).collect();
        let (peers, dead) = self.balancer.read(sessions, &self.own, now_ms as u64, mono_ms as u64, &self.config);
        self.peers = peers;
        Ok(dead.into_js().to_string())
    }

    /// Of an orphan poll (the JSON `planOrphans` takes), `[unowned, inFlight]`: the STARTED
    /// orphans not in `ours`, and those of them naming this worker (handed over, not claimed yet).
    #[wasm_bindgen(js_name = orphanCounts)]
    pub fn orphan_counts(&self, poll_json: &str) -> Result<Vec<f64>, JsValue> {
        let poll: JsOrphanPoll = parse("poll", poll_json)?;
        let items: Vec<LeaseItem> = poll.items.into_iter().map(Into::into).collect();
        let ours: HashSet<&str> = poll.ours.iter().map(String::as_str).collect();
        let (unowned, in_flight) =
            decide::orphan_counts(&items, poll.now_ms, &self.config, &self.own, |id| ours.contains(id));
        Ok(vec![unowned as f64, in_flight as f64])
    }

    /// At the claim limit with hints waiting: the claim limit one listing of every session (as
    /// `sessions()` gives it) allows now; a peer that ended or died counts what it last reported
    /// as unowned work, once (`Balancer::refreshed_limit`). Only ever raise the limit with it.
    #[wasm_bindgen(js_name = refreshedLimit)]
    pub fn refreshed_limit(
        &mut self,
        sessions_json: &str,
        held: f64,
        max_connections: f64,
        now_ms: f64,
    ) -> Result<f64, JsValue> {
        let sessions: Vec<SessionItem> =
            parse::<Vec<JsSessionItem>>("sessions", sessions_json)?.into_iter().map(Into::into).collect();
        let me = SessionLoad { held: held as u64, max_connections: max_connections as u64 };
        let limit = self.balancer.refreshed_limit(&sessions, &self.own, me, now_ms as u64, &self.config, self.pace_ms);
        Ok(limit as f64)
    }

    /// With this worker's load and the work nobody holds, `{ claimLimit, handOver, share }`
    /// (`share`: `{ work, mine }`, or null while a live session does not report its load).
    pub fn step(&mut self, held: f64, max_connections: f64, unowned: f64, in_flight: f64, mono_ms: f64) -> String {
        let me = SessionLoad { held: held as u64, max_connections: max_connections as u64 };
        let view = FleetView { me, peers: &self.peers, unowned: unowned as u64, in_flight: in_flight as u64 };
        let step = self.balancer.step(&view, mono_ms as u64, self.pace_ms);
        let share = step.share.map(|s| json!({ "work": s.work, "mine": s.mine }));
        json!({ "claimLimit": step.claim_limit, "handOver": step.hand_over, "share": share }).to_string()
    }
}

/// Which held connections to hand over: `held` is `[[id, fence, claimOrder], ...]`; the fewest
/// claimed, then the longest held, first (`decide::hand_over_picks`).
#[wasm_bindgen(js_name = handOverPicks)]
pub fn hand_over_picks(held_json: &str, count: u32) -> Result<Vec<String>, JsValue> {
    let held: Vec<(String, u64, u64)> = parse("held", held_json)?;
    Ok(decide::hand_over_picks(&held, count as usize))
}

/// Whether a held connection with cancel reason `reason` (none: it runs) counts in the load a
/// session renewal reports (`decide::counts_in_load`): not once it is leaving, still while the
/// worker shuts down (the end write frees it).
#[wasm_bindgen(js_name = countsInLoad)]
pub fn counts_in_load(reason: Option<String>, handing_over: bool) -> bool {
    decide::counts_in_load(worker::reason(reason.as_deref()), handing_over)
}

/// Whether a held connection claimed under `claimed_under` (negative: none) with cancel reason
/// `reason` moves along with a renewal of the session of epoch `epoch`.
#[wasm_bindgen(js_name = movesWithSession)]
pub fn moves_with_session(claimed_under: f64, reason: Option<String>, epoch: f64) -> bool {
    let s = Session { owner: String::new(), epoch: epoch as u64, expires_at_ms: 0, deadline_mono_ms: 0 };
    decide::moves_with_session(optional(claimed_under), worker::reason(reason.as_deref()), &s)
}

/// Whether a claim that landed under `claimed_under` is cancelled at once because the session
/// changed (`epoch_now`, negative: none) while it was in flight.
#[wasm_bindgen(js_name = claimOutlivedSession)]
pub fn claim_outlived_session(claimed_under: f64, epoch_now: f64) -> bool {
    decide::claim_outlived_session(optional(claimed_under), optional(epoch_now))
}

/// Whose connections a dead-session poll claims: `[[owner, epochToRetire | null], ...]`.
#[wasm_bindgen(js_name = deadSessionOwners)]
pub fn dead_session_owners(dead_json: &str, own: &str, reclaim_own: bool) -> Result<String, JsValue> {
    let dead: Vec<SessionItem> =
        parse::<Vec<JsSessionItem>>("sessions", dead_json)?.into_iter().map(Into::into).collect();
    Ok(text(decide::dead_session_owners(&dead, own, reclaim_own)))
}

/// Whether the worker releases the connection itself once its handler has ended.
#[wasm_bindgen(js_name = releasesAfterHandler)]
pub fn releases_after_handler(reason: Option<String>, session_mode: bool) -> bool {
    decide::releases_after_handler(worker::reason(reason.as_deref()), session_mode)
}
