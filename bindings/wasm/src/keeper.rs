//! The holder machine of one held lease (`leaselock::holder::Holder`) for JavaScript:
//! `lib/keeper.js` renews a lease held in `LeaseTable.using` when it says and aborts its signal
//! on the reason it gives; a lease claimed under a session (`lib/session.js`) is covered by the
//! session's renewals and stopped by its loss or end through it. Outputs come out as JSON text;
//! answers and events go in by kind. (An election term's keeper is inside the election machine:
//! `ElectorMachine`.)

use leaselock::holder::{Holder, Input, Mode, Setup};
use leaselock::worker::decide::CancelReason;
use leaselock::{Error, Result};
use serde_json::Value;
use wasm_bindgen::prelude::*;

use crate::lease::JsLease;
use crate::{parse, text, throw, Table};

fn mono(ms: f64) -> u64 {
    ms.max(0.0) as u64
}

/// One held lease's machine.
#[wasm_bindgen]
pub struct HolderMachine {
    machine: Holder,
}

#[wasm_bindgen]
impl HolderMachine {
    /// Holds `lease_json` (`Lease.toJSON()`, just claimed) of `table` in `mode`: `"renew"`
    /// (renewed on the table's schedule), `"watch"` (renewed by hand only) or `"session"` (held
    /// under a session); `seed` seeds the retry jitter.
    #[wasm_bindgen(constructor)]
    pub fn new(
        table: &Table,
        lease_json: &str,
        mode: &str,
        seed: f64,
        now_mono_ms: f64,
    ) -> std::result::Result<HolderMachine, JsValue> {
        let lease = parse::<JsLease>("lease", lease_json)?.into();
        let mode = match mode {
            "renew" => Mode::Renew,
            "watch" => Mode::Watch,
            "session" => Mode::Session,
            _ => return Err(throw(&Error::invalid("mode", "must be renew, watch or session"))),
        };
        let setup = Setup::of(&table.config, mode);
        Ok(HolderMachine { machine: Holder::new(setup, &lease, seed as u64, mono(now_mono_ms)) })
    }

    /// Renewal `id` answered with the lease as renewed (`Lease.toJSON()`).
    pub fn renewed(&mut self, id: f64, lease_json: &str, now_mono_ms: f64) -> std::result::Result<(), JsValue> {
        let lease = parse::<JsLease>("lease", lease_json)?.into();
        self.answer(id, Ok(lease), now_mono_ms);
        Ok(())
    }

    /// Renewal `id` failed with `error_json` (`lib/errors.js` `toRust`).
    pub fn failed(&mut self, id: f64, error_json: &str, now_mono_ms: f64) -> std::result::Result<(), JsValue> {
        let error = crate::error::from_json(&parse::<Value>("error", error_json)?);
        self.answer(id, Err(error), now_mono_ms);
        Ok(())
    }

    /// The deadline moves to `deadline` if later (a renewal by hand; a session's renewal).
    pub fn cover(&mut self, deadline: f64, now_mono_ms: f64) {
        self.machine.handle(Input::Cover { deadline_mono_ms: mono(deadline) }, mono(now_mono_ms));
    }

    /// The session the lease is held under was lost.
    #[wasm_bindgen(js_name = sessionLost)]
    pub fn session_lost(&mut self, now_mono_ms: f64) {
        self.machine.handle(Input::SessionLost, mono(now_mono_ms));
    }

    /// The session the lease is held under was ended.
    #[wasm_bindgen(js_name = sessionEnded)]
    pub fn session_ended(&mut self, now_mono_ms: f64) {
        self.machine.handle(Input::SessionEnded, mono(now_mono_ms));
    }

    /// The holder cancels for `reason` (a CancelReason's name: `"Shutdown"`, `"Released"`, ...).
    pub fn cancel(&mut self, reason: &str, now_mono_ms: f64) -> std::result::Result<(), JsValue> {
        let reason = [
            CancelReason::Deadline,
            CancelReason::Lost,
            CancelReason::Stopped,
            CancelReason::Shutdown,
            CancelReason::Released,
            CancelReason::HandOver,
        ]
        .into_iter()
        .find(|r| r.as_str() == reason)
        .ok_or_else(|| throw(&Error::invalid("reason", "must be a CancelReason")))?;
        self.machine.handle(Input::Cancel { reason }, mono(now_mono_ms));
        Ok(())
    }

    #[wasm_bindgen(js_name = handleTimeout)]
    pub fn handle_timeout(&mut self, now_mono_ms: f64) {
        self.machine.handle_timeout(mono(now_mono_ms));
    }

    /// The next output as JSON (`{ output: "renew", id, until_mono_ms }`, `covered` with its
    /// `deadline_mono_ms`, `cancel` with its `reason`, `over`), or undefined.
    #[wasm_bindgen(js_name = pollOutput)]
    pub fn poll_output(&mut self) -> Option<String> {
        self.machine.poll_output().map(text)
    }

    /// When (monotonic ms) `handleTimeout` is due next, or undefined once over.
    #[wasm_bindgen(js_name = pollTimeout)]
    pub fn poll_timeout(&self) -> Option<f64> {
        self.machine.poll_timeout().map(|at| at as f64)
    }

    /// Rule 2: whether the holder may act at monotonic `now`.
    #[wasm_bindgen(js_name = mayAct)]
    pub fn may_act(&self, now_mono_ms: f64) -> bool {
        self.machine.may_act(mono(now_mono_ms))
    }

    /// When the holder must stop acting, on the monotonic clock.
    #[wasm_bindgen(getter)]
    pub fn deadline(&self) -> f64 {
        self.machine.deadline_mono_ms() as f64
    }

    fn answer(&mut self, id: f64, result: Result<leaselock::Lease>, now_mono_ms: f64) {
        self.machine.handle(Input::Answer { id: id as u64, result }, mono(now_mono_ms));
    }
}
