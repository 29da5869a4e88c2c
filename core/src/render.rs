//! How a value someone sent appears in an error message, a log line or a listing: escaped once,
//! and (in errors) bounded, so a hostile value can neither forge lines, rewrite a terminal, nor
//! make an error larger than a few hundred bytes.
//!
//! ```
//! use leaselock::render;
//!
//! assert_eq!(render::value("stream-1"), r#""stream-1""#);
//! assert_eq!(render::value("a\u{1b}[2Jb\n"), r#""a\u{1b}[2Jb\n""#);
//! let long = "x".repeat(5000);
//! assert_eq!(render::value(&long), format!("\"{}\"... (5000 bytes)", "x".repeat(64)));
//! assert_eq!(render::escaped("ok"), "ok");
//! ```

use std::borrow::Cow;
use std::fmt::Write;

/// Invisible format characters an id (or url) may not contain, besides every control character
/// (Unicode category Cc: U+0000..U+001F, U+007F..U+009F). Each is invisible on a terminal or in
/// a log, and most reorder or hide the text around them, so two ids that look the same could
/// differ, or an id could disguise the line it is printed on.
pub const REFUSED_FORMAT_CHARS: &[(char, char, &str)] = &[
    ('\u{00AD}', '\u{00AD}', "soft hyphen"),
    ('\u{061C}', '\u{061C}', "Arabic letter mark"),
    ('\u{180E}', '\u{180E}', "Mongolian vowel separator"),
    ('\u{200B}', '\u{200F}', "zero-width space, joiners and direction marks"),
    ('\u{2028}', '\u{2029}', "line and paragraph separators"),
    ('\u{202A}', '\u{202E}', "bidirectional embeddings and overrides"),
    ('\u{2060}', '\u{206F}', "word joiner, invisible operators, bidirectional isolates"),
    ('\u{FEFF}', '\u{FEFF}', "byte order mark"),
    ('\u{FFF9}', '\u{FFFB}', "interlinear annotation"),
    ('\u{E0000}', '\u{E007F}', "tag characters"),
];

/// Whether ids and urls refuse `c`: a control character or one of [`REFUSED_FORMAT_CHARS`].
pub fn is_refused_char(c: char) -> bool {
    c.is_control() || REFUSED_FORMAT_CHARS.iter().any(|&(lo, hi, _)| (lo..=hi).contains(&c))
}

/// How many characters of a rejected value an error shows.
pub const VALUE_CHARS: usize = 64;

/// How many characters of another component's error text (a parser's, an SDK's) are kept.
pub const TEXT_CHARS: usize = 300;

/// Whether a character is shown as an escape: control characters (Unicode Cc), the invisible
/// format characters ids refuse ([`is_refused_char`]) and the backslash (so an
/// escape in the output is never ambiguous).
fn needs_escape(c: char) -> bool {
    c == '\\' || is_refused_char(c)
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\\' => out.push_str("\\\\"),
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

/// `s` with control and invisible characters as escapes (`\n`, `\u{1b}`), whole: for listings,
/// where the full id must be visible. Borrowed when nothing needs escaping.
pub fn escaped(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if needs_escape(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A message (whose quoted values are already rendered) kept on one line: control and invisible
/// characters escaped, nothing else; backslashes are left alone, so nothing is escaped twice.
pub fn one_line(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_refused_char) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(bounded(s, usize::MAX, false).0)
}

/// The most bytes of an error message as a binding hands it over (Python's exception, Node's
/// `Error`): its quoted values are bounded already (see [`value`] and [`text`]); this is the
/// backstop for everything else a message may carry.
pub const MESSAGE_BYTES: usize = 1000;

/// `s` in at most `max_bytes` bytes: whole when it fits, else cut at a character boundary and
/// followed by `... (N bytes)`, N its whole length (the suffix counted in `max_bytes`). The one
/// place an over-long text is cut, for error details ([`crate::Error::invalid`]) and for the
/// messages the bindings raise ([`message`]).
pub fn cut(s: &str, max_bytes: usize) -> Cow<'_, str> {
    if s.len() <= max_bytes {
        return Cow::Borrowed(s);
    }
    let suffix = format!("... ({} bytes)", s.len());
    let mut end = max_bytes.saturating_sub(suffix.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}{suffix}", &s[..end]))
}

/// An error message as a binding raises it: on one line ([`one_line`]) and at most
/// [`MESSAGE_BYTES`] bytes ([`cut`]).
pub fn message(s: &str) -> Cow<'_, str> {
    match one_line(s) {
        Cow::Borrowed(line) => cut(line, MESSAGE_BYTES),
        Cow::Owned(line) => Cow::Owned(cut(&line, MESSAGE_BYTES).into_owned()),
    }
}

/// Up to `limit` characters of `s`, escaped; `quote` (a value of ours, quoted) also escapes
/// `"` and `\`, which other components' texts already use as escapes. Returns whether it was cut.
fn bounded(s: &str, limit: usize, quote: bool) -> (String, bool) {
    let mut out = String::with_capacity(s.len().min(limit) + 2);
    let mut chars = s.chars();
    for c in chars.by_ref().take(limit) {
        if is_refused_char(c) || (quote && c == '\\') {
            push_escaped(&mut out, c);
        } else if quote && c == '"' {
            out.push_str("\\\"");
        } else {
            out.push(c);
        }
    }
    (out, chars.next().is_some())
}

/// A rejected value as an error quotes it: in double quotes, escaped, at most [`VALUE_CHARS`]
/// characters, followed by the total length when cut: `"xxxx..."... (5000 bytes)`.
pub fn value(s: &str) -> String {
    let (text, cut) = bounded(s, VALUE_CHARS, true);
    if cut {
        format!("\"{text}\"... ({} bytes)", s.len())
    } else {
        format!("\"{text}\"")
    }
}

/// [`value`] for text that is not valid Unicode: UTF-16 code units (a JavaScript or Python
/// string) that may hold lone surrogates, shown as `\u{d800}` escapes, never replaced.
/// `head` is the start of the value (at least [`VALUE_CHARS`] + 1 units when it is longer);
/// `total_bytes` its whole length in bytes, a lone surrogate counting 3.
pub fn utf16_value(head: &[u16], total_bytes: usize) -> String {
    let mut out = String::new();
    let mut cut = false;
    for (shown, unit) in char::decode_utf16(head.iter().copied()).enumerate() {
        if shown == VALUE_CHARS {
            cut = true;
            break;
        }
        match unit {
            Ok(c) if is_refused_char(c) || c == '\\' => push_escaped(&mut out, c),
            Ok('"') => out.push_str("\\\""),
            Ok(c) => out.push(c),
            Err(lone) => {
                let _ = write!(out, "\\u{{{:x}}}", lone.unpaired_surrogate());
            }
        }
    }
    if cut {
        format!("\"{out}\"... ({total_bytes} bytes)")
    } else {
        format!("\"{out}\"")
    }
}

/// Another component's error text (which may quote the input) made safe to pass on: at most
/// [`TEXT_CHARS`] characters, followed by the total length when cut, with control and invisible
/// characters escaped. What the text escaped itself (a parser quoting a string) is left as it is.
pub fn text(s: &str) -> String {
    let (mut text, cut) = bounded(s, TEXT_CHARS, false);
    if cut {
        let _ = write!(text, "... ({} bytes)", s.len());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_quoted_escaped_and_bounded() {
        assert_eq!(value(""), r#""""#);
        assert_eq!(value("say \"hi\""), r#""say \"hi\"""#);
        assert_eq!(value("a\0b\r\n\u{7f}\u{9b}"), r#""a\u{0}b\r\n\u{7f}\u{9b}""#);
        assert_eq!(value("\u{202e}txt.exe\u{200b}\u{feff}"), r#""\u{202e}txt.exe\u{200b}\u{feff}""#);
        assert_eq!(value(r"C:\x"), r#""C:\\x""#);
        // Printable non-ASCII is kept as it is.
        assert_eq!(value("flux-é-日本"), "\"flux-é-日本\"");

        let exact = "y".repeat(VALUE_CHARS);
        assert_eq!(value(&exact), format!("\"{exact}\""));
        let long = format!("{exact}z");
        assert_eq!(value(&long), format!("\"{exact}\"... (65 bytes)"));
        // The bound is in characters, and escapes do not let it grow past a fixed size.
        let escapes = "\u{1b}".repeat(1_000_000);
        assert!(value(&escapes).len() <= VALUE_CHARS * 10 + 32, "{}", value(&escapes).len());
        assert!(value(&"\u{10ffff}".repeat(1000)).len() < 400);
    }

    #[test]
    fn lone_surrogates_are_escaped_not_replaced() {
        let units: Vec<u16> = "s1\u{1b}".encode_utf16().chain([0xd800, u16::from(b'"')]).collect();
        assert_eq!(utf16_value(&units, 9), r#""s1\u{1b}\u{d800}\"""#);
        let long: Vec<u16> = std::iter::repeat_n(0xdc00, 100).collect();
        let shown = utf16_value(&long, 300);
        assert!(shown.ends_with("\"... (300 bytes)") && shown.matches("\\u{dc00}").count() == VALUE_CHARS, "{shown}");
        // Valid text renders as `value` does.
        let ok: Vec<u16> = "flux-é-日本 \\".encode_utf16().collect();
        assert_eq!(utf16_value(&ok, 0), value("flux-é-日本 \\"));
    }

    #[test]
    fn a_message_is_cut_to_its_bound_at_a_character_boundary() {
        assert_eq!(cut("short", 10), "short");
        let long = "é".repeat(2_500_000);
        let text = format!("invalid score: {long}\n");
        let m = message(&text);
        assert!(m.len() <= MESSAGE_BYTES, "{} bytes", m.len());
        // The newline is escaped first (two bytes), then the line is cut.
        assert!(m.starts_with("invalid score: éé") && m.ends_with("é... (5000017 bytes)"), "{m}");
        assert_eq!(cut("abcdef", 3), "... (6 bytes)", "a bound below the suffix keeps the suffix alone");
    }

    #[test]
    fn text_keeps_the_message_on_one_line() {
        let t = text("line one\nline two \"quoted\"");
        assert_eq!(t, "line one\\nline two \"quoted\"");
        // A parser's own escapes are not escaped again.
        let parser = format!("invalid value: string {:?}", "a\u{1b}b");
        assert_eq!(text(&parser), r#"invalid value: string "a\u{1b}b""#);
        let long = "e".repeat(10_000);
        assert_eq!(text(&long), format!("{}... (10000 bytes)", "e".repeat(TEXT_CHARS)));
        assert!(!text(&"\n".repeat(10_000)).contains('\n'));
    }

    #[test]
    fn a_rendered_message_is_not_escaped_twice() {
        let message = format!("invalid id: {} holds U+001B", value("s\u{1b}"));
        assert_eq!(one_line(&message), r#"invalid id: "s\u{1b}" holds U+001B"#);
        assert_eq!(one_line("two\nlines"), "two\\nlines");
    }

    #[test]
    fn listings_show_the_whole_value_escaped() {
        assert!(matches!(escaped("stream-1"), Cow::Borrowed("stream-1")));
        let id = format!("{}\u{1b}]0;pwned\u{7}", "a".repeat(100));
        assert_eq!(escaped(&id), format!("{}\\u{{1b}}]0;pwned\\u{{7}}", "a".repeat(100)));
    }
}
