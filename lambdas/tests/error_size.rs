//! Whatever a caller sends, up to Lambda's 6 MB request limit, the router's error answer and
//! its log lines stay a few kB and show no raw control character: a fuzzed set of payloads up to
//! 5 MB through the three event kinds, against the in-memory store.

mod common;

use std::sync::Arc;

use base64::Engine as _;
use common::*;
use leaselock::{LeaseStore, ManualClock, MemoryStore, TableConfig};
use leaselock_lambdas::MemoryHints;
use serde_json::{json, Value};

/// xorshift64*: reproducible without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Characters that grow when escaped, break lines, reorder text, or are just long in UTF-8.
const ALPHABET: &[char] = &[
    'a',
    'Z',
    '0',
    '/',
    '%',
    '"',
    '\\',
    ' ',
    '{',
    '}',
    ':',
    '\0',
    '\n',
    '\r',
    '\t',
    '\u{7}',
    '\u{1b}',
    '\u{7f}',
    '\u{9b}',
    '\u{200b}',
    '\u{202e}',
    '\u{2066}',
    '\u{feff}',
    'é',
    '日',
    '\u{10ffff}',
    '🚀',
];

/// A string of about `bytes` bytes of UTF-8 drawn from [`ALPHABET`].
fn noise(rng: &mut Rng, bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 4);
    while s.len() < bytes {
        s.push(ALPHABET[rng.below(ALPHABET.len())]);
    }
    s
}

/// One payload of `kind` with `s` placed where the shape `n` puts it.
fn payload(kind: Kind, n: usize, s: &str) -> Value {
    let b64 = base64::engine::general_purpose::STANDARD;
    match kind {
        Kind::Http => match n % 12 {
            0 => http_event(
                "POST",
                "/connections/{id}/start",
                "/connections/x/start",
                Some(s),
                Some(r#"{"url":"wss://a/"}"#),
            ),
            1 => http_event("POST", "$default", &format!("/connections/{}/start", percent_encode(s)), None, None),
            2 => http_event("POST", "$default", &format!("/connections/s1/{s}"), None, None),
            3 => http_event("POST", "/connections/{id}/start", "/connections/s1/start", Some("s1"), Some(s)),
            4 => {
                let body = json!({ "url": s }).to_string();
                http_event("POST", "/connections/{id}/start", "/connections/s1/start", Some("s1"), Some(&body))
            }
            5 => {
                let body = json!({ "url": "wss://a/", "connection_id": s }).to_string();
                http_event("POST", "/connections/{id}/start", "/connections/s1/start", Some("s1"), Some(&body))
            }
            6 => {
                let mut ev =
                    http_event("POST", "/connections/{id}/start", "/connections/s1/start", Some("s1"), Some(s));
                ev["isBase64Encoded"] = json!(true);
                ev
            }
            7 => {
                let mut bytes = s.as_bytes().to_vec();
                bytes.push(0xff);
                let mut ev = http_event("POST", "/connections/{id}/start", "/connections/s1/start", Some("s1"), None);
                ev["body"] = json!(b64.encode(bytes));
                ev["isBase64Encoded"] = json!(true);
                ev
            }
            8 => http_event("GET", "$default", s, None, None),
            9 => {
                let mut ev = http_event("GET", "$default", "/connections/s1", None, None);
                ev["requestContext"]["http"]["method"] = json!(s);
                ev
            }
            // Fields of the wrong type: the event parser's error quotes what it found.
            10 => {
                let mut ev = http_event("GET", "/connections/{id}", "/connections/s1", Some("s1"), None);
                ev["requestContext"]["http"] = json!(s);
                ev
            }
            _ => json!({ "requestContext": s, "routeKey": [s] }),
        },
        Kind::Sqs => {
            let body = match n % 8 {
                0 => s.to_string(),
                1 => start_command(s, "wss://a/").to_string(),
                2 => json!({"action": s, "connection_id": "s1"}).to_string(),
                3 => start_command("s1", s).to_string(),
                4 => json!({"action": "STOP", "connection_id": [s]}).to_string(),
                5 => {
                    // Many records sharing the payload.
                    let part = &s[..s.char_indices().map(|(i, _)| i).nth(s.chars().count() / 10).unwrap_or(0)];
                    return sqs_event(&vec![start_command(part, "wss://a/").to_string(); 10]);
                }
                6 => return json!({ "Records": [s, s] }),
                _ => {
                    let mut ev = sqs_event(&["{".to_string()]);
                    ev["Records"][0]["eventSourceARN"] = json!(s);
                    return ev;
                }
            };
            sqs_event(&[body])
        }
        Kind::Direct => match n % 6 {
            0 => start_command(s, "wss://a/"),
            1 => json!({"action": s, "connection_id": "s1"}),
            2 => start_command("s1", s),
            3 => json!(s),
            4 => json!([s, {"k": s}]),
            _ => json!({"action": "STOP", "connection_id": {"nested": [s]}}),
        },
    }
}

#[tokio::test]
async fn the_largest_error_answer_over_fuzzed_payloads_up_to_5_mb_stays_under_8_kb() {
    let store = MemoryStore::new(TableConfig::default(), Arc::new(ManualClock::new(1_700_000_000_000))).unwrap();
    let hints = MemoryHints::new();
    let logs = LogCapture::start();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let sizes = [0, 1, 63, 64, 65, 1023, 1024, 1025, 4096, 4097, 70_000, 1_000_000, 2_000_000, 5_000_000];
    let shapes = |kind| match kind {
        Kind::Http => 12,
        Kind::Sqs => 8,
        Kind::Direct => 6,
    };
    let (mut cases, mut errors, mut largest, mut largest_log, mut largest_payload) = (0, 0, (0, String::new()), 0, 0);
    for kind in KINDS {
        for &size in &sizes {
            for shape in 0..shapes(kind) {
                // The payload as sent (JSON, with escapes) is at most `size` plus the event's own
                // fields: the value is cut until it fits.
                let frame = payload(kind, shape, "").to_string().len();
                let mut s = noise(&mut rng, size);
                let mut event = payload(kind, shape, &s);
                let mut payload_bytes = event.to_string().len();
                while payload_bytes > size + frame && !s.is_empty() {
                    let keep = s.len() * size / payload_bytes;
                    s.truncate((0..=keep).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0));
                    event = payload(kind, shape, &s);
                    payload_bytes = event.to_string().len();
                }
                largest_payload = largest_payload.max(payload_bytes);
                let result = invoke(&store, &hints, event).await;
                cases += 1;
                let is_error = match (&result, kind) {
                    (Ok(v), Kind::Http) => v["statusCode"] != 200,
                    (Ok(_), Kind::Sqs) => true,
                    (Ok(_), Kind::Direct) => false,
                    (Err(_), _) => true,
                };
                if is_error {
                    errors += 1;
                    let bytes = answer_size(&result);
                    if bytes > largest.0 {
                        largest = (bytes, format!("{kind:?} shape {shape}, {size}-byte value"));
                    }
                    if let Some(text) = error_text(kind, &result) {
                        assert!(!shows_raw(&text), "{kind:?} shape {shape} size {size}: {text:?}");
                    }
                }
                for line in logs.take() {
                    largest_log = largest_log.max(line.len());
                    assert!(!shows_raw(&line), "{kind:?} shape {shape} size {size}: raw characters logged: {line:?}");
                }
            }
        }
    }
    eprintln!(
        "{cases} payloads (largest {largest_payload} bytes), {errors} errors; largest error answer {} bytes ({}), largest log line {largest_log} bytes",
        largest.0, largest.1
    );
    assert!((4_900_000..=5_010_000).contains(&largest_payload), "the set reaches 5 MB: {largest_payload}");
    assert!(errors * 10 >= cases * 9, "nearly every fuzzed payload is refused: {errors} of {cases}");
    assert!(largest.0 < MAX_ERROR_BYTES, "a {}-byte error answer: {}", largest.0, largest.1);
    assert!(largest_log < MAX_ERROR_BYTES, "a {largest_log}-byte log line");
    // Whatever slipped through as valid wrote ids and urls the rule accepts.
    for item in store.items().await.unwrap() {
        leaselock::config::validate_id("id", &item.id).unwrap();
    }
}
