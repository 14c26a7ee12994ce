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
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    data_dir_from(var("AIRLOCK_HOME"), var("XDG_DATA_HOME"), var("HOME"))
}

/// [`data_dir`] from the three variables' values. The result is always
/// absolute, because the sandbox binds the image's trees by absolute path:
/// a relative `AIRLOCK_HOME` is taken from the current folder (a program
/// that changes its folder should set an absolute one); a relative
/// `XDG_DATA_HOME` or `HOME` is ignored, as the XDG specification says.
fn data_dir_from(
    airlock_home: Option<PathBuf>,
    xdg_data_home: Option<PathBuf>,
    home: Option<PathBuf>,
) -> Result<PathBuf, SandboxError> {
    if let Some(home) = airlock_home {
        return std::path::absolute(&home).map_err(|e| SandboxError::Missing {
            what: format!("airlock's data directory ({}: {e})", home.display()),
            hint: "set AIRLOCK_HOME to an absolute path".to_owned(),
        });
    }
    if let Some(xdg) = xdg_data_home.filter(|p| p.is_absolute()) {
        return Ok(xdg.join("airlock"));
    }
    match home.filter(|p| p.is_absolute()) {
        Some(home) => Ok(home.join(".local/share/airlock")),
        None => Err(SandboxError::Missing {
            what: "airlock's data directory".to_owned(),
            hint: "set AIRLOCK_HOME (or HOME, or XDG_DATA_HOME) to an absolute path of a folder airlock may write"
                .to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_directory_is_absolute_whatever_the_variables_hold() {
        let cwd = std::env::current_dir().unwrap();
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(data_dir_from(p("rel/home"), None, p("/h")).unwrap(), cwd.join("rel/home"));
        assert_eq!(data_dir_from(p("/abs"), p("/x"), p("/h")).unwrap(), PathBuf::from("/abs"));
        assert_eq!(data_dir_from(None, p("/x"), p("/h")).unwrap(), PathBuf::from("/x/airlock"));
        assert_eq!(data_dir_from(None, p("x"), p("/h")).unwrap(), PathBuf::from("/h/.local/share/airlock"));
        assert!(data_dir_from(None, p("x"), p("h")).is_err());
        assert!(data_dir_from(None, None, None).is_err());
    }
}
