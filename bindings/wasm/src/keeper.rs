//! The held-lease keeper (`leaselock::keeper`) for JavaScript: `lib/keeper.js` renews a lease
//! held outside a worker (`LeaseTable.using`) when it says, and stops at the deadline it keeps
//! (rule 2), with core's one renewal retry policy. (An election term's keeper is inside the
//! election machine: `ElectorMachine`.)

use leaselock::keeper::{Keeper, Renewal, Upkeep, Wake};
use leaselock::{Error, Lease, TableConfig};
use serde_json::Value;
use wasm_bindgen::prelude::*;

use crate::lease::JsLease;
use crate::{parse, Table};

fn lease(v: JsValue) -> Result<Lease, JsValue> {
    serde_wasm_bindgen::from_value::<JsLease>(v).map(Lease::from).map_err(|e| crate::throw(&Error::invalid("lease", e)))
}

/// One held lease's keeper.
#[wasm_bindgen]
pub struct LeaseKeeper {
    keeper: Keeper,
    /// The table's, for `renewed`.
    config: TableConfig,
}

#[wasm_bindgen]
impl LeaseKeeper {
    /// Keeps `lease` (`LeaseData`, just claimed) of `table`, renewing it.
    #[wasm_bindgen(constructor)]
    pub fn new(table: &Table, lease_data: JsValue) -> Result<LeaseKeeper, JsValue> {
        let lease = lease(lease_data)?;
        Ok(LeaseKeeper { keeper: Keeper::new(&lease, Upkeep::Renew, &table.config), config: table.config.clone() })
    }

    /// What is due at monotonic `now`: a number (sleep until then), `"deadline"` (stop acting:
    /// the deadline has passed), or `"renew"` (renew now, giving the request up at `deadline`).
    pub fn poll(&self, now_mono_ms: f64) -> JsValue {
        match self.keeper.poll(now_mono_ms as u64) {
            Wake::SleepUntil(at) => JsValue::from_f64(at as f64),
            Wake::Deadline => JsValue::from_str("deadline"),
            Wake::Renew { .. } => JsValue::from_str("renew"),
        }
    }

    /// When the holder must stop acting for the lease, on the monotonic clock.
    #[wasm_bindgen(getter)]
    pub fn deadline(&self) -> f64 {
        self.keeper.deadline_mono_ms() as f64
    }

    /// A renewal answered with `lease_data` (the lease as renewed): the CancelReason it calls
    /// for (`"Stopped"`), if any.
    pub fn renewed(&mut self, lease_data: JsValue, now_mono_ms: f64, random: f64) -> Result<Option<String>, JsValue> {
        let renewal = Renewal::of(&lease(lease_data)?, &self.config);
        Ok(self.keeper.renewed(Ok(renewal), now_mono_ms as u64, random).map(|r| r.as_str().to_string()))
    }

    /// A renewal failed with `error_json` (`lib/errors.js` `toRust`): the CancelReason it calls
    /// for (`"Lost"`), if any; otherwise it is retried when `poll` says, while that fits the
    /// deadline.
    pub fn failed(&mut self, error_json: &str, now_mono_ms: f64, random: f64) -> Result<Option<String>, JsValue> {
        let error = crate::error::from_json(&parse::<Value>("error", error_json)?);
        Ok(self.keeper.renewed(Err(&error), now_mono_ms as u64, random).map(|r| r.as_str().to_string()))
    }
}
