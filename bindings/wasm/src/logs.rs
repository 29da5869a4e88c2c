//! What core logs (`tracing`: info and above), kept for the JavaScript driver to hand to the
//! user's logger: `Worker` passes the worker engine's records to `logger.info` / `logger.warn`,
//! with the fields camelCase (`connection_id` becomes `connectionId`).

use std::cell::{Cell, RefCell};
use std::sync::Once;

use serde::Serialize;
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{span, Event, Level, Metadata, Subscriber};

/// One log record.
#[derive(Debug, Serialize)]
pub struct Record {
    /// `error`, `warn` or `info`.
    pub level: &'static str,
    pub message: String,
    pub fields: Map<String, Value>,
}

thread_local! {
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
    static RECORDS: RefCell<Vec<Record>> = const { RefCell::new(Vec::new()) };
}

/// Makes the collector the process's subscriber (once).
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = tracing::subscriber::set_global_default(Collector);
    });
}

/// Runs `f`, returning what it logged.
pub fn capture<T>(f: impl FnOnce() -> T) -> (T, Vec<Record>) {
    let was = CAPTURING.with(|c| c.replace(true));
    let out = f();
    CAPTURING.with(|c| c.set(was));
    let records = if was { Vec::new() } else { RECORDS.with(|r| std::mem::take(&mut *r.borrow_mut())) };
    (out, records)
}

fn camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

struct Fields {
    message: String,
    fields: Map<String, Value>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            self.message = match value {
                Value::String(s) => s,
                other => other.to_string(),
            };
        } else {
            self.fields.insert(camel(field.name()), value);
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_string()));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }
}

/// Keeps the records of info and above, only inside [`capture`].
struct Collector;

impl Subscriber for Collector {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::INFO
    }

    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }

    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}

    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}

    fn event(&self, event: &Event<'_>) {
        if !CAPTURING.with(Cell::get) {
            return;
        }
        let level = match *event.metadata().level() {
            Level::ERROR => "error",
            Level::WARN => "warn",
            _ => "info",
        };
        let mut fields = Fields { message: String::new(), fields: Map::new() };
        event.record(&mut fields);
        RECORDS.with(|r| r.borrow_mut().push(Record { level, message: fields.message, fields: fields.fields }));
    }

    fn enter(&self, _: &span::Id) {}

    fn exit(&self, _: &span::Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_what_is_logged_inside_capture_only() {
        install();
        tracing::info!(connection_id = "c1", fence = 3u64, "outside");
        let ((), records) = capture(|| {
            tracing::info!(connection_id = %"c1", fence = 3u64, source = "hint", "claimed");
            tracing::debug!("not kept");
        });
        assert_eq!(records.len(), 1, "{records:?}");
        let r = &records[0];
        assert_eq!((r.level, r.message.as_str()), ("info", "claimed"));
        assert_eq!(r.fields["connectionId"], "c1");
        assert_eq!(r.fields["fence"], 3);
        assert_eq!(r.fields["source"], "hint");
    }
}
