//! Figures of a run saved beside the readable report ([`airlock::report::render`]).

use std::path::Path;

use airlock::RunRecord;
use base64::Engine;

/// Saves the record's figures as PNG files in `dir`, replacing their base64
/// with where they were saved. The files are named here, `figure-N.png`,
/// never after the name the sandbox reported: that name is the code's to
/// choose, and must not pick which host file gets replaced.
pub fn save_figures(record: &mut RunRecord, dir: &Path) {
    for (index, figure) in record.figures.iter_mut().enumerate() {
        let Some(b64) = figure.png_base64.take() else { continue };
        let Ok(png) = base64::engine::general_purpose::STANDARD.decode(b64.as_bytes()) else { continue };
        let file = format!("figure-{}.png", index + 1);
        match airlock::save_to_host(&dir.join(&file), &png) {
            Ok(path) => figure.saved_to = Some(path.display().to_string()),
            Err(e) => eprintln!("airlock: could not save {file}: {e}"),
        }
    }
}
