//! Where airlock keeps its data on the host.

use std::path::{Path, PathBuf};

use crate::error::SandboxError;

/// Whether users other than the owner may read `path` (and enter it, if a
/// folder): what the sandbox's user needs of the trees bound into it.
pub fn open_to_others(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| {
        let needed = if m.is_dir() { 0o005 } else { 0o004 };
        m.permissions().mode() & needed == needed
    })
}

/// airlock's data directory: `$AIRLOCK_HOME`, else `$XDG_DATA_HOME/airlock`,
/// else `~/.local/share/airlock`. Images, the wasm interpreter, caches and the
/// audit database live here.
pub fn data_dir() -> Result<PathBuf, SandboxError> {
    if let Some(home) = std::env::var_os("AIRLOCK_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(home));
    }
    if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(xdg).join("airlock"));
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".local/share/airlock")),
        None => Err(SandboxError::Missing {
            what: "airlock's data directory".to_owned(),
            hint: "set AIRLOCK_HOME (or HOME, or XDG_DATA_HOME) to a folder airlock may write".to_owned(),
        }),
    }
}
