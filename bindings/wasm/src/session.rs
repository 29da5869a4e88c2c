//! Session mode for JavaScript: the session operations of the protocol (create, renew, end,
//! retire, the claim under a session, the listing) as [`Op`]s, and the session loop's decisions
//! (`leaselock::worker::decide`). Sessions cross as `{ owner, epoch, expiresAtMs, deadline }`,
//! `deadline` on the driver's monotonic clock like a lease's.

use leaselock::protocol::{ClaimInSession, CreateSession, EndSession, RenewSession, RetireSession, Sessions};
use leaselock::worker::decide;
use leaselock::{LeaseMode, Session, SessionItem, SessionLoad};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;

use crate::protocol::{IntoJs, Op};
use crate::{error, parse, text, throw, worker, Table};

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

    #[wasm_bindgen(js_name = renewSession)]
    pub fn renew_session(&self, session_json: &str) -> Result<Op, JsValue> {
        Ok(Op::new(RenewSession::new(&self.config, &session(session_json)?)))
    }

    #[wasm_bindgen(js_name = endSession)]
    pub fn end_session(&self, session_json: &str) -> Result<Op, JsValue> {
        Ok(Op::new(EndSession::new(&self.config, &session(session_json)?)))
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
