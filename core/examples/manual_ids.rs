//! The manual's input-rule sample (docs/src/api-reference.md includes it from its first `use`):
//! an id with a control character refused, naming the field and quoting the value. Run twice by
//! bindings/python/tests/test_manual.py; no engine needed.

use leaselock::{config::validate_id, Error};

fn main() {
    assert!(validate_id("id", "stream-1").is_ok());
    match validate_id("id", "s1\x1b[2J") {
        Err(Error::InvalidInput { field, message }) => {
            assert_eq!(field, "id");
            assert_eq!(
                message,
                r#""s1\u{1b}[2J" holds U+001B at byte 2: control and invisible format characters are not allowed"#
            );
        }
        other => panic!("{other:?}"),
    }
}
