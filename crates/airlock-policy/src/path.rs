//! Paths inside the sandbox's work directory, checked before anything touches a file.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The sandbox's writable work directory, where data goes in and comes out.
pub const WORK_DIR: &str = "/work";

/// Longest path accepted, in bytes (the kernel's PATH_MAX less room for /work).
const MAX_PATH_BYTES: usize = 4000;

/// Longest name of one file or folder, in bytes (the kernel's NAME_MAX).
const MAX_NAME_BYTES: usize = 255;

/// A path beneath `/work`, already checked: absolute under `/work` or
/// relative to it, no `..`, no empty or `.` components, no NUL.
///
/// Checking the text is the first half of the defence; the second is that
/// backends open these paths beneath the work directory without following
/// links (see the Linux backend's `copy` module), because the sandbox may
/// have planted a link at any component.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxPath {
    /// Components below /work, joined with '/'; never empty.
    relative: String,
}

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxPathError {
    #[error("the path is empty; name a file such as /work/data.csv")]
    Empty,
    #[error("{0:?} is outside /work; files go in and come out only under /work, e.g. /work/data.csv")]
    OutsideWork(String),
    #[error("{0:?} contains '..'; name the file directly under /work")]
    ParentComponent(String),
    #[error("{0:?} names /work itself; name a file inside it")]
    WorkItself(String),
    #[error("{0:?} contains a NUL byte")]
    Nul(String),
    #[error("the path is longer than {MAX_PATH_BYTES} bytes")]
    TooLong,
    #[error("a name in {0:?} is longer than {MAX_NAME_BYTES} bytes, the most a file name may have")]
    NameTooLong(String),
}

impl SandboxPath {
    /// Checks `text`: `/work/a/b.csv`, `a/b.csv` (relative to /work) are fine;
    /// `/etc/passwd`, `../x`, `/work/../x`, `` and `/work` are not.
    pub fn parse(text: &str) -> Result<SandboxPath, SandboxPathError> {
        if text.is_empty() {
            return Err(SandboxPathError::Empty);
        }
        if text.len() > MAX_PATH_BYTES {
            return Err(SandboxPathError::TooLong);
        }
        if text.contains('\0') {
            return Err(SandboxPathError::Nul(text.to_owned()));
        }
        let below = if let Some(rest) = text.strip_prefix('/') {
            match rest.strip_prefix("work") {
                Some("") => return Err(SandboxPathError::WorkItself(text.to_owned())),
                Some(r) if r.starts_with('/') => r,
                _ => return Err(SandboxPathError::OutsideWork(text.to_owned())),
            }
        } else {
            text
        };
        let mut parts = Vec::new();
        for part in below.split('/') {
            match part {
                "" | "." => continue,
                ".." => return Err(SandboxPathError::ParentComponent(text.to_owned())),
                p if p.len() > MAX_NAME_BYTES => return Err(SandboxPathError::NameTooLong(text.to_owned())),
                p => parts.push(p),
            }
        }
        if parts.is_empty() {
            return Err(SandboxPathError::WorkItself(text.to_owned()));
        }
        Ok(SandboxPath { relative: parts.join("/") })
    }

    /// The path below /work, e.g. `a/b.csv`.
    pub fn relative(&self) -> &str {
        &self.relative
    }

    /// The directories between /work and the file, outermost first.
    pub fn parents(&self) -> impl Iterator<Item = &str> {
        let parts: Vec<&str> = self.relative.split('/').collect();
        let n = parts.len().saturating_sub(1);
        parts.into_iter().take(n)
    }

    /// The last component, e.g. `b.csv`.
    pub fn file_name(&self) -> &str {
        self.relative.rsplit('/').next().unwrap_or(&self.relative)
    }
}

impl fmt::Display for SandboxPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{WORK_DIR}/{}", self.relative)
    }
}

impl TryFrom<String> for SandboxPath {
    type Error = SandboxPathError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        SandboxPath::parse(&value)
    }
}

impl From<SandboxPath> for String {
    fn from(value: SandboxPath) -> Self {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_paths_under_work() {
        assert_eq!(SandboxPath::parse("/work/a.csv").unwrap().relative(), "a.csv");
        assert_eq!(SandboxPath::parse("a/b.csv").unwrap().relative(), "a/b.csv");
        assert_eq!(SandboxPath::parse("/work//a/./b").unwrap().to_string(), "/work/a/b");
        let p = SandboxPath::parse("/work/x/y/z.txt").unwrap();
        assert_eq!(p.parents().collect::<Vec<_>>(), vec!["x", "y"]);
        assert_eq!(p.file_name(), "z.txt");
    }

    #[test]
    fn refuses_escapes() {
        for bad in [
            "",
            "/etc/passwd",
            "/workshop/a",
            "../a",
            "/work/../etc/passwd",
            "a/../../b",
            "/work",
            "/work/",
            "a\0b",
            "/",
        ] {
            assert!(SandboxPath::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
