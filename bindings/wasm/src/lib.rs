//! leaselock for Node: the lease protocol, the worker engine, the held-lease keeper and the
//! election machine compiled to WebAssembly.
//!
//! Nothing here does I/O. JavaScript (`bindings/wasm/lib/`) sends the requests an operation asks
//! for with the user's `DynamoDBClient`, feeds the answers back with its clocks and a random
//! draw, and waits where the decisions say. The worker engine's commands, answers and events and
//! the keeper's leases cross as plain JavaScript values (serde-wasm-bindgen); a protocol step's
//! request and the SDK's output cross as JSON text, which is the DynamoDB API's own JSON (what the
//! AWS SDK for JavaScript v3 takes) and what options are validated from.
//!
//! Errors cross as JSON too (`{ kind, message, ...fields }`), thrown as a string by the few
//! functions that throw; `lib/errors.js` makes the `Error` subclasses from it, in one place.

mod config;
mod engine;
mod error;
mod keeper;
mod lease;
mod logs;
mod protocol;
mod session;
mod store_clock;
mod worker;

use leaselock::protocol::{
    Acquire, BatchDesiredStates, CheckTable, Checkpoint, CreateTable, FencedWrite, Get, Items, OrphansPage, OwnedBy,
    Release, Renew, Start, Stop,
};
use leaselock::worker::decide;
use leaselock::{Error, Lease, TableConfig};
use wasm_bindgen::prelude::*;

use crate::lease::JsLease;
use crate::protocol::{Op, Orphans};

#[wasm_bindgen(typescript_custom_section)]
const TYPES: &'static str = r#"
/** What the fleet should be doing with a unit of work. */
export type DesiredState = "STARTED" | "STOPPED";

/** A stored lease item (ids without the key prefix). */
export interface LeaseItem {
  id: string;
  desiredState: DesiredState | null;
  url: string | null;
  owner: string | null;
  /** Absolute expiry, epoch ms; 0 = released; null = never claimed. */
  expiresAtMs: number | null;
  lastSeq: number | null;
  /** Claims so far; 0 when never claimed. */
  fence: number;
  ttl: number | null;
}

/** A held lease's data. `deadline` is on the `performance.now()` clock. */
export interface LeaseData {
  id: string;
  owner: string;
  fence: number;
  expiresAtMs: number;
  lastSeq: number | null;
  url: string | null;
  desiredState: DesiredState | null;
  deadline: number;
}

/** Attribute names of a lease item; the defaults are the AWS reference worker's schema. */
export interface AttributeNames {
  id?: string;
  desiredState?: string;
  url?: string;
  owner?: string;
  expiresAtMs?: string;
  lastSeq?: string;
  fence?: string;
  ttl?: string;
}

/** Why a handler's signal aborted. */
export type CancelReason = "Deadline" | "Lost" | "Stopped" | "Shutdown" | "Released" | "HandOver";

/** The kinds of error a lease operation ends with (`error.kind`). */
export type ErrorKind =
  | "Held" | "Lost" | "NotFound" | "Stopped" | "SeqNotIncreasing" | "Throttled" | "InvalidInput"
  | "Timeout" | "Unreachable" | "AccessDenied" | "TableNotFound" | "Store";
"#;

/// Throws `e` as its JSON text (see the module docs).
fn throw(e: &Error) -> JsValue {
    JsValue::from_str(&error::to_json(e).to_string())
}

fn parse<T: serde::de::DeserializeOwned>(what: &str, json: &str) -> Result<T, JsValue> {
    serde_json::from_str(json).map_err(|e| throw(&Error::invalid(what, e)))
}

fn text(v: impl serde::Serialize) -> String {
    serde_json::to_string(&v).expect("plain data serializes")
}

/// A table's validated configuration, and the decisions that depend on it.
#[wasm_bindgen]
pub struct Table {
    config: TableConfig,
}

#[wasm_bindgen]
impl Table {
    /// Validates `new LeaseTable(...)`'s options (JSON, without `client`).
    #[wasm_bindgen(constructor)]
    pub fn new(options_json: &str) -> Result<Table, JsValue> {
        config::table_config(options_json).map(|config| Table { config }).map_err(|e| throw(&e))
    }

    #[wasm_bindgen(getter, js_name = tableName)]
    pub fn table_name(&self) -> String {
        self.config.table_name.clone()
    }

    #[wasm_bindgen(getter, js_name = leaseMs)]
    pub fn lease_ms(&self) -> f64 {
        self.config.lease_ms() as f64
    }

    #[wasm_bindgen(getter, js_name = renewMs)]
    pub fn renew_ms(&self) -> f64 {
        self.config.renew_ms() as f64
    }

    #[wasm_bindgen(getter, js_name = clockSkewMs)]
    pub fn clock_skew_ms(&self) -> f64 {
        self.config.skew_ms() as f64
    }

    #[wasm_bindgen(getter, js_name = allowEventualGlobalTable)]
    pub fn allow_eventual_global_table(&self) -> bool {
        self.config.allow_eventual_global_table
    }
}

/// The lease operations: each returns an [`Op`] for `lib/drive.js` to step, or throws bad input.
#[wasm_bindgen]
impl Table {
    #[wasm_bindgen(js_name = createTable)]
    pub fn create_table(&self) -> Op {
        Op::new(CreateTable::new(&self.config))
    }

    /// The table check (one DescribeTable, or nothing with `allowEventualGlobalTable`): done with
    /// `{kind: "single-region" | "strong" | "not-checked", regions?}`, or the refusal.
    #[wasm_bindgen(js_name = checkTable)]
    pub fn check_table(&self) -> Op {
        Op::new(CheckTable::new(&self.config))
    }

    pub fn start(&self, id: &str, url: &str) -> Result<Op, JsValue> {
        Start::new(&self.config, id, url).map(Op::new).map_err(|e| throw(&e))
    }

    pub fn stop(&self, id: &str, now_ms: f64) -> Result<Op, JsValue> {
        Stop::new(&self.config, id, now_ms as u64).map(Op::new).map_err(|e| throw(&e))
    }

    pub fn acquire(&self, id: &str, owner: &str) -> Result<Op, JsValue> {
        Acquire::new(&self.config, id, owner).map(Op::new).map_err(|e| throw(&e))
    }

    #[wasm_bindgen(js_name = acquireStarted)]
    pub fn acquire_started(&self, id: &str, owner: &str) -> Result<Op, JsValue> {
        Acquire::started(&self.config, id, owner).map(Op::new).map_err(|e| throw(&e))
    }

    pub fn renew(&self, lease_json: &str) -> Result<Op, JsValue> {
        let lease = Lease::from(parse::<JsLease>("lease", lease_json)?);
        Ok(Op::new(Renew::new(&self.config, &lease)))
    }

    pub fn release(&self, lease_json: &str) -> Result<Op, JsValue> {
        let lease = Lease::from(parse::<JsLease>("lease", lease_json)?);
        Ok(Op::new(Release::new(&self.config, &lease)))
    }

    pub fn checkpoint(&self, lease_json: &str, seq: f64) -> Result<Op, JsValue> {
        let lease = Lease::from(parse::<JsLease>("lease", lease_json)?);
        Ok(Op::new(Checkpoint::new(&self.config, &lease, seq as u64)))
    }

    /// A fenced write of `writes` caller's actions (appended by the driver), with the lease's
    /// checkpoint to `checkpoint` when it is not negative.
    #[wasm_bindgen(js_name = fencedWrite)]
    pub fn fenced_write(
        &self,
        lease_json: &str,
        now_ms: f64,
        checkpoint: f64,
        writes: u32,
        token: &str,
    ) -> Result<Op, JsValue> {
        let lease = Lease::from(parse::<JsLease>("lease", lease_json)?);
        let (now, writes) = (now_ms as u64, writes as usize);
        let op = if checkpoint < 0.0 {
            FencedWrite::new(&self.config, &lease, now, writes, token)
        } else {
            FencedWrite::with_checkpoint(&self.config, &lease, now, checkpoint as u64, writes, token)
        };
        op.map(Op::new).map_err(|e| throw(&e))
    }

    pub fn get(&self, id: &str) -> Result<Op, JsValue> {
        Get::new(&self.config, id).map(Op::new).map_err(|e| throw(&e))
    }

    /// Orphans below `cutoff_ms` (claimable now when negative), at most `limit` (none when
    /// negative), read `page_size` at a time.
    pub fn orphans(&self, cutoff_ms: f64, limit: f64, page_size: f64) -> Op {
        let cutoff = (cutoff_ms >= 0.0).then_some(cutoff_ms as u64);
        let limit = (limit >= 0.0).then_some(limit as usize);
        Op::new(Orphans::new(&self.config, cutoff, limit, page_size as usize))
    }

    /// One page of orphans below `cutoff_ms` (the worker's poll).
    #[wasm_bindgen(js_name = orphansPage)]
    pub fn orphans_page(&self, cutoff_ms: f64, page_size: f64) -> Op {
        Op::new(OrphansPage::new(&self.config, cutoff_ms as u64, page_size as usize, None))
    }

    #[wasm_bindgen(js_name = desiredStates)]
    pub fn desired_states(&self, ids_json: &str) -> Result<Op, JsValue> {
        let ids: Vec<String> = parse("ids", ids_json)?;
        BatchDesiredStates::new(&self.config, &ids).map(Op::new).map_err(|e| throw(&e))
    }

    #[wasm_bindgen(js_name = ownedBy)]
    pub fn owned_by(&self, owner: &str) -> Result<Op, JsValue> {
        OwnedBy::new(&self.config, owner).map(Op::new).map_err(|e| throw(&e))
    }

    pub fn items(&self) -> Op {
        Op::new(Items::new(&self.config))
    }
}

/// A value as an error quotes it (`leaselock::render::value`): quoted, escaped, bounded.
#[wasm_bindgen(js_name = renderValue)]
pub fn render_value(s: &str) -> String {
    leaselock::render::value(s)
}

/// A value that may hold lone surrogates as an error quotes it (`leaselock::render::utf16_value`):
/// `head` is its first UTF-16 code units, `total_bytes` its whole length in bytes.
#[wasm_bindgen(js_name = renderUtf16)]
pub fn render_utf16(head: &[u16], total_bytes: f64) -> String {
    leaselock::render::utf16_value(head, total_bytes as usize)
}

/// Whether the lease is given up once the handler has ended, given why it was cancelled.
#[wasm_bindgen(js_name = shouldRelease)]
pub fn should_release(reason: Option<String>) -> bool {
    decide::should_release(worker::reason(reason.as_deref()))
}

/// Election: the candidate registry's operations and the elector's decisions (`lib/election.js`).
mod election;
