//! The store's clock for the JavaScript driver: core's reckoning ([`leaselock::StoreTime`]) on
//! the readings `lib/drive.js` takes when it sends a request and when its answer (with its
//! `Date` and `Age` headers) comes back.

use leaselock::store_clock::Sample;
use leaselock::StoreTime;
use wasm_bindgen::prelude::*;

fn ms(v: f64) -> u64 {
    v.max(0.0) as u64
}

/// A table's measure of the store's clock (see `leaselock::StoreClock`).
#[wasm_bindgen]
pub struct StoreClock {
    time: StoreTime,
}

#[wasm_bindgen]
impl StoreClock {
    /// The store's time applied to the wall clock once known within `trust_ms` (half the
    /// table's clock skew).
    #[wasm_bindgen(constructor)]
    pub fn new(trust_ms: f64) -> StoreClock {
        StoreClock { time: StoreTime::new(ms(trust_ms)) }
    }

    /// One answer: the local clocks when its request was sent and when it came back, and its
    /// `Date` and `Age` headers. Whether it measured anything.
    pub fn observe(
        &mut self,
        sent_wall: f64,
        sent_mono: f64,
        received_wall: f64,
        received_mono: f64,
        date: Option<String>,
        age: Option<String>,
    ) -> bool {
        let sent = (ms(sent_wall), ms(sent_mono));
        let received = (ms(received_wall), ms(received_mono));
        match Sample::from_answer(sent, received, date.as_deref(), age.as_deref()) {
            Ok(sample) => {
                self.time.observe(&sample);
                true
            }
            Err(_) => false,
        }
    }

    /// The store's time (epoch ms) when the local clocks read `wall` and `mono`.
    #[wasm_bindgen(js_name = wallMs)]
    pub fn wall_ms(&mut self, wall: f64, mono: f64) -> f64 {
        self.time.wall_ms(ms(wall), ms(mono)) as f64
    }

    /// `{ offsetMs, uncertaintyMs, samples }` at these readings, or `undefined` before any answer.
    pub fn estimate(&self, wall: f64, mono: f64) -> JsValue {
        use serde::Serialize;
        let Some(e) = self.time.estimate(ms(wall), ms(mono)) else { return JsValue::UNDEFINED };
        let e = JsEstimate { offset_ms: e.offset_ms, uncertainty_ms: e.uncertainty_ms, samples: e.samples };
        e.serialize(&serde_wasm_bindgen::Serializer::json_compatible()).unwrap_or(JsValue::UNDEFINED)
    }

    /// When to send the next request (on the `performance.now()` clock) so that its answer
    /// narrows the estimate most; `round_trip_ms`: about what a request takes.
    #[wasm_bindgen(js_name = probeAt)]
    pub fn probe_at(&self, mono: f64, round_trip_ms: f64) -> f64 {
        self.time.probe_at(ms(mono), ms(round_trip_ms)) as f64
    }
}

/// An estimate as JavaScript reads it.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct JsEstimate {
    offset_ms: i64,
    uncertainty_ms: u64,
    samples: u32,
}
