//! The worker engine for JavaScript: events in and commands out as JSON, times as numbers (ms).
//! A JavaScript driver runs each command with the user's AWS SDK clients and feeds back each
//! answer, exactly as the tokio driver does in Rust.

use leaselock::engine::trace::Timing;
use leaselock::engine::{Engine, Event, Now, Settings};
use leaselock::TableConfig;
use wasm_bindgen::prelude::*;

use crate::{parse, text, Table};

fn now(wall_ms: f64, mono_ms: f64) -> Now {
    Now { wall_ms: wall_ms.max(0.0) as u64, mono_ms: mono_ms.max(0.0) as u64 }
}

fn start(config: TableConfig, settings_json: &str, seed: f64, at: Now) -> Result<WorkerEngine, JsValue> {
    let settings: Settings = parse("settings", settings_json)?;
    Ok(WorkerEngine { engine: Engine::new(settings, config, seed as u64, at) })
}

/// One worker's engine (see `leaselock::engine`).
#[wasm_bindgen]
pub struct WorkerEngine {
    engine: Engine,
}

#[wasm_bindgen]
impl WorkerEngine {
    /// A worker on `table` with `settings_json` (the engine's settings), seeded with `seed`.
    #[wasm_bindgen(constructor)]
    pub fn new(
        table: &Table,
        settings_json: &str,
        seed: f64,
        wall_ms: f64,
        mono_ms: f64,
    ) -> Result<WorkerEngine, JsValue> {
        start(table.config.clone(), settings_json, seed, now(wall_ms, mono_ms))
    }

    /// As [`WorkerEngine::new`] with a trace's timing (`{mode, lease_ms, renew_ms, skew_ms}`).
    pub fn with_timing(
        timing_json: &str,
        settings_json: &str,
        seed: f64,
        wall_ms: f64,
        mono_ms: f64,
    ) -> Result<WorkerEngine, JsValue> {
        let timing: Timing = parse("timing", timing_json)?;
        let config = timing.config().map_err(|e| crate::throw(&e))?;
        start(config, settings_json, seed, now(wall_ms, mono_ms))
    }

    /// Something happened (`event_json`: an engine event).
    pub fn handle(&mut self, event_json: &str, wall_ms: f64, mono_ms: f64) -> Result<(), JsValue> {
        let event: Event = parse("event", event_json)?;
        self.engine.handle(event, now(wall_ms, mono_ms));
        Ok(())
    }

    pub fn handle_timeout(&mut self, wall_ms: f64, mono_ms: f64) {
        self.engine.handle_timeout(now(wall_ms, mono_ms));
    }

    /// The next command as JSON, or `undefined`.
    pub fn poll_command(&mut self) -> Option<String> {
        self.engine.poll_command().map(text)
    }

    /// When `handle_timeout` is due next (monotonic ms), or `undefined`.
    pub fn poll_timeout(&self) -> Option<f64> {
        self.engine.poll_timeout().map(|t| t as f64)
    }

    pub fn snapshot(&self) -> String {
        text(self.engine.snapshot())
    }
}
