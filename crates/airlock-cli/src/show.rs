//! Figures of a run saved beside the readable report ([`airlock::report::render`]).

use std::path::Path;

use airlock::RunRecord;
use base64::Engine;

/// Saves the record's figures as PNG files in `dir`, replacing their base64
/// with where they were saved.
pub fn save_figures(record: &mut RunRecord, dir: &Path) {
    for figure in &mut record.figures {
        let Some(b64) = figure.png_base64.take() else { continue };
        let Ok(png) = base64::engine::general_purpose::STANDARD.decode(b64.as_bytes()) else { continue };
        match airlock::save_to_host(&dir.join(&figure.name), &png) {
            Ok(path) => figure.saved_to = Some(path.display().to_string()),
            Err(e) => eprintln!("airlock: could not save {}: {e}", figure.name),
        }
    }
}
