//! What every airlock backend implements and shares.
//!
//! A backend (Linux namespaces, WebAssembly) implements [`Backend`]: it says
//! what the host lets it enforce, refuses a policy it cannot honour, and makes
//! [`Instance`]s, each one sandbox with its own work directory. An instance
//! runs [`Job`]s and reports an [`Execution`]; [`record::assemble`] turns that
//! into the [`airlock_policy::RunRecord`] every front door returns.
//!
//! Backends share the Python [`driver`] (values, errors and figures, the way a
//! notebook shows them), [`output::CappedBuffer`] for stdout and stderr, and
//! the [`runtime::Runtime`] description of what the code runs with.

#![forbid(unsafe_code)]

pub mod backend;
pub mod driver;
pub mod error;
pub mod host;
pub mod output;
pub mod paths;
pub mod record;
pub mod runtime;

pub use backend::{Backend, Execution, Instance, Job, KillSwitch, Probe};
pub use error::{ArtifactError, SandboxError};
pub use runtime::{PYTHON_MOUNT, Runtime, RuntimeFile, RuntimeMount};

/// `text` with everything that could drive a terminal made visible: control
/// characters other than newline and tab become `\u{..}` escapes, and so do
/// the Unicode direction overrides that make code read other than it runs.
/// For printing what a sandbox produced (its output, its code) to a person.
pub fn terminal_safe(text: &str) -> String {
    use std::fmt::Write;
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        let direction_override =
            matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}');
        if (c.is_control() && c != '\n' && c != '\t') || direction_override {
            let _ = write!(shown, "\\u{{{:x}}}", u32::from(c));
        } else {
            shown.push(c);
        }
    }
    shown
}

/// Lower-case hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}
