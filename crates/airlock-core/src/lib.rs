//! What every airlock backend implements and shares.
//!
//! A backend (Linux namespaces, WebAssembly) implements [`Backend`]: it says
//! what the host lets it enforce, refuses a policy it cannot honour, and makes
//! [`Instance`]s, each one sandbox with its own work directory. An instance
//! runs [`Job`]s and reports an [`Execution`]; [`record::assemble`] turns that
//! into the [`airlock_policy::RunRecord`] every front door returns. How a
//! run ended is decided by one pure function, [`outcome::classify`], from
//! what the backend observed.
//!
//! Backends share the Python [`driver`] (values, errors and figures, the way a
//! notebook shows them), [`output::CappedBuffer`] for stdout and stderr, and
//! the [`runtime::Runtime`] description of what the code runs with.

#![forbid(unsafe_code)]

pub mod backend;
pub mod driver;
pub mod error;
pub mod host;
pub mod outcome;
pub mod output;
pub mod paths;
pub mod record;
pub mod runtime;

pub use backend::{Backend, Claim, Claimed, Execution, Instance, Job, KillSwitch, Probe, Template, WarmInstance};
pub use error::{ArtifactError, SandboxError};
pub use runtime::{PYTHON_MOUNT, Runtime, RuntimeFile, RuntimeMount};

/// `text` with everything that could drive a terminal or hide in a page made
/// visible: control characters other than newline and tab become `\u{..}`
/// escapes, and so does every Unicode format character (category Cf: the
/// direction overrides and isolates that make code read other than it runs,
/// zero-width spaces and joiners, the byte-order mark, the Arabic letter
/// mark, invisible operators, tag characters) and the line and paragraph
/// separators (Zl, Zp), which some viewers break lines at. For showing what
/// a sandbox produced (its output, its code) to a person.
pub fn terminal_safe(text: &str) -> String {
    escaped(text, true)
}

/// As [`terminal_safe`], and newlines and tabs escaped too: for text from
/// the sandbox put into one of the record's sentences (its `message`),
/// where a line of its own could pass for a line of the report.
pub fn one_line(text: &str) -> String {
    escaped(text, false)
}

fn escaped(text: &str, keep_lines: bool) -> String {
    use std::fmt::Write;
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if (c.is_control() && !(keep_lines && (c == '\n' || c == '\t'))) || is_invisible(c) {
            let _ = write!(shown, "\\u{{{:x}}}", u32::from(c));
        } else {
            shown.push(c);
        }
    }
    shown
}

/// A format character or a line or paragraph separator; the whole tag
/// block too, unassigned ones included, since a newer Unicode may assign them.
fn is_invisible(c: char) -> bool {
    use unicode_general_category::{GeneralCategory, get_general_category};
    matches!(c, '\u{E0000}'..='\u{E007F}')
        || matches!(
            get_general_category(c),
            GeneralCategory::Format | GeneralCategory::LineSeparator | GeneralCategory::ParagraphSeparator
        )
}

/// The lines of `code` as Python numbers them: ended by `\r\n`, `\r` or
/// `\n` (its tokenizer's three), so that line N here is the line N of a
/// traceback. Like [`str::lines`], a final line ending adds no empty line.
pub fn source_lines(code: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut rest = code;
    while !rest.is_empty() {
        match rest.find(['\r', '\n']) {
            Some(end) => {
                lines.push(&rest[..end]);
                let ending = if rest[end..].starts_with("\r\n") { 2 } else { 1 };
                rest = &rest[end + ending..];
            }
            None => {
                lines.push(rest);
                rest = "";
            }
        }
    }
    lines
}

/// Lower-case hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invisible_and_format_characters_are_shown_escaped() {
        for c in [
            '\u{200B}',
            '\u{200C}',
            '\u{200D}',
            '\u{2060}',
            '\u{2061}',
            '\u{2062}',
            '\u{2063}',
            '\u{2064}',
            '\u{FEFF}',
            '\u{061C}',
            '\u{00AD}',
            '\u{E0000}',
            '\u{E0001}',
            '\u{E0041}',
            '\u{E007F}',
            '\u{2028}',
            '\u{2029}',
            '\u{202E}',
            '\u{2066}',
            '\u{200E}',
            '\u{1B}',
            '\u{7}',
            '\u{85}',
        ] {
            let shown = terminal_safe(&format!("a{c}b"));
            assert_eq!(shown, format!("a\\u{{{:x}}}b", u32::from(c)), "U+{:04X}", u32::from(c));
        }
        assert_eq!(terminal_safe("tab\tnew\nline é 漢 🙂"), "tab\tnew\nline é 漢 🙂", "text stays text");
    }

    #[test]
    fn lines_are_numbered_as_python_numbers_them() {
        assert_eq!(source_lines("a\rb\r\nc\nd"), ["a", "b", "c", "d"]);
        assert_eq!(source_lines("a\n\nb\n"), ["a", "", "b"]);
        assert_eq!(source_lines("a\r\r\n"), ["a", ""]);
        assert_eq!(
            source_lines("form\u{c}feed\u{2028}x"),
            ["form\u{c}feed\u{2028}x"],
            "Python's tokenizer does not split these"
        );
        assert!(source_lines("").is_empty());
    }
}
