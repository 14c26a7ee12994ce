//! Writing artefacts on the host: plain 0644 files, written whole or not at all.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Writes `data` to `path` on the host as a plain 0644 file, through a
/// temporary file renamed into place, so a reader never sees half of it.
/// Returns the absolute path written.
pub fn save_to_host(path: &Path, data: &[u8]) -> std::io::Result<PathBuf> {
    let absolute = std::path::absolute(path)?;
    let dir = absolute.parent().ok_or_else(|| std::io::Error::other("no parent folder"))?;
    let name = absolute.file_name().ok_or_else(|| std::io::Error::other("no file name"))?;
    let tmp = dir.join(format!(".{}.airlock-{}.tmp", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&tmp)?;
        file.write_all(data)?;
        // The umask may have narrowed the mode: set it exactly.
        file.set_permissions(fs::Permissions::from_mode(0o644))?;
        file.sync_all()?;
        fs::rename(&tmp, &absolute)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map(|()| absolute)
}
