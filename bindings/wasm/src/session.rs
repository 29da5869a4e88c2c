//! Session mode for JavaScript: the session operations of the protocol (create, renew, end,
//! retire, the claim under a session, the listing) as [`Op`]s, and the session loop's decisions
//! (`leaselock::worker::decide`). Sessions cross as `{ owner, epoch, expiresAtMs, deadline }`,
//! `deadline` on the driver's monotonic clock like a lease's.

use leaselock::protocol::{ClaimInSession, CreateSession, EndSession, RenewSession, RetireSession, Sessions};
use leaselock::{Session, SessionItem, SessionLoad};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;

use crate::protocol::{IntoJs, Op};
use crate::{parse, throw, Table};

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

    /// `"per-item"` or `"session"` (the CLI's names).
    #[wasm_bindgen(getter)]
    pub fn mode(&self) -> String {
        self.config.mode.as_str().into()
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
