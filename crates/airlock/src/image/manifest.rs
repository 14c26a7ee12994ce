//! What an image holds, checked: the manifest (its packages, its inputs, the
//! hash of its file list) and the file list itself (`files.txt`: every
//! folder, file and link with its hash and mode). The name that points at an
//! image pins the manifest's own hash; the manifest pins the file list; the
//! list pins every file. `airlock image verify` walks that chain.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::fetch::hash_file;
use crate::interpreter::Interpreter;

/// Bumped when the layout of an image folder changes. 2: built in a
/// sandbox from a hashed lock, every file listed with its hash.
pub const FORMAT: u32 = 2;

/// What an image holds, written last when it is built.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// The hash of the image's inputs, which names its folder.
    pub hash: String,
    pub python: Interpreter,
    /// SHA-256 of the lock it was built from, as given.
    pub lock_sha256: String,
    /// Every package installed, with the file it came from.
    pub packages: Vec<Package>,
    /// For an image with extra packages: the image it layers on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<ImageLink>,
    /// SHA-256 of `files.txt`.
    pub files_sha256: String,
    pub file_count: u64,
    pub size_bytes: u64,
    pub created_at: String,
    /// The audit-store ids of the runs that built it (download, install).
    pub build_runs: Vec<String>,
    /// What installed it: `uv 0.13.9`.
    pub built_with: String,
    /// Whether a package was built from its sdist (`--allow-source-builds`):
    /// its build backend, and what that needs, then came from the index as
    /// the build asked for them, pinned by no hash. Left out when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub built_from_source: bool,
}

/// Another image, pinned: its hash and its manifest's SHA-256.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageLink {
    pub hash: String,
    pub manifest_sha256: String,
}

/// One installed package.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Package {
    pub name: String,
    pub version: String,
    /// The wheel (or source distribution) it was installed from.
    #[serde(default)]
    pub file: String,
    #[serde(default)]
    pub sha256: String,
}

/// A finished tree, listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    /// The text of `files.txt`.
    pub text: String,
    pub count: u64,
    pub size_bytes: u64,
}

/// What `verify` found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Differences {
    pub checked: u64,
    /// Paths whose content, mode, kind or link target changed.
    pub changed: Vec<String>,
    pub missing: Vec<String>,
    pub added: Vec<String>,
}

impl Differences {
    pub fn is_clean(&self) -> bool {
        self.changed.is_empty() && self.missing.is_empty() && self.added.is_empty()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    kind: &'static str,
    /// File content's or link target's SHA-256; `-` for a folder.
    hash: String,
    /// Permission bits; `-` for a link.
    mode: String,
    size: u64,
}

impl Entry {
    fn line(&self, path: &str) -> String {
        format!("{} {} {} {path}\n", self.kind, self.hash, self.mode)
    }
}

/// Takes a finished build's tree back from the sandbox's user and lists it:
/// every entry becomes the caller's (as root; the sandbox wrote as another
/// user), readable by all and writable by its owner only, setuid and the
/// like dropped; anything but folders, regular files and links is refused.
/// Nothing is followed: a link is listed by its target's text.
/// Top-level names in `apart` are left out (the list itself, and the
/// manifest that pins it).
pub fn seal(root: &Path, apart: &[&str]) -> Result<Listing, String> {
    let owner = rustix::process::geteuid().is_root().then(|| (rustix::process::geteuid(), rustix::process::getegid()));
    let mut text = String::new();
    let (mut count, mut size) = (0, 0);
    walk(root, "", apart, &mut |path, meta| {
        let full = root.join(path);
        if let Some((uid, gid)) = owner
            && (meta.uid() != uid.as_raw() || meta.gid() != gid.as_raw())
        {
            rustix::fs::chownat(rustix::fs::CWD, &full, Some(uid), Some(gid), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| format!("taking back {}: {e}", full.display()))?;
        }
        if !meta.file_type().is_symlink() {
            let mode = meta.permissions().mode() & 0o777;
            let wanted = if meta.is_dir() || mode & 0o111 != 0 { 0o755 } else { 0o644 };
            if meta.permissions().mode() & 0o7777 != wanted {
                fs::set_permissions(&full, fs::Permissions::from_mode(wanted))
                    .map_err(|e| format!("setting the mode of {}: {e}", full.display()))?;
            }
        }
        let entry = describe(&full, &fs::symlink_metadata(&full).map_err(|e| format!("{}: {e}", full.display()))?)?;
        count += 1;
        size += entry.size;
        text.push_str(&entry.line(path));
        Ok(())
    })?;
    Ok(Listing { text, count, size_bytes: size })
}

/// Compares the tree at `root` with the list made when it was sealed.
pub fn compare(root: &Path, listing: &str, apart: &[&str]) -> Result<Differences, String> {
    let mut expected: BTreeMap<&str, (&str, &str, &str)> = BTreeMap::new();
    for line in listing.lines() {
        let mut parts = line.splitn(4, ' ');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(kind), Some(hash), Some(mode), Some(path)) => {
                expected.insert(path, (kind, hash, mode));
            }
            _ => return Err(format!("files.txt has a line that is not an entry: {line:?}")),
        }
    }
    let mut found = Differences::default();
    walk(root, "", apart, &mut |path, meta| {
        found.checked += 1;
        let entry = describe(&root.join(path), meta)?;
        match expected.remove(path) {
            None => found.added.push(path.to_owned()),
            Some(listed) if listed != (entry.kind, entry.hash.as_str(), entry.mode.as_str()) => {
                found.changed.push(path.to_owned())
            }
            Some(_) => {}
        }
        Ok(())
    })?;
    found.missing = expected.into_keys().map(str::to_owned).collect();
    Ok(found)
}

fn describe(full: &Path, meta: &fs::Metadata) -> Result<Entry, String> {
    let kind = meta.file_type();
    let mode = format!("{:o}", meta.permissions().mode() & 0o7777);
    if kind.is_symlink() {
        let target = fs::read_link(full).map_err(|e| format!("{}: {e}", full.display()))?;
        let hash = airlock_core::sha256_hex(target.as_os_str().as_encoded_bytes());
        Ok(Entry { kind: "link", hash, mode: "-".to_owned(), size: 0 })
    } else if kind.is_dir() {
        Ok(Entry { kind: "dir", hash: "-".to_owned(), mode, size: 0 })
    } else if kind.is_file() {
        let (hash, size) = hash_file(full).map_err(|e| format!("hashing {}: {e}", full.display()))?;
        Ok(Entry { kind: "file", hash, mode, size })
    } else {
        Err(format!(
            "{} is a device, FIFO or socket; an image holds only folders, regular files and links",
            full.display()
        ))
    }
}

/// Visits every entry below `root` (not `root` itself), folders before
/// their contents, in name order, never following a link. Paths are relative.
fn walk(
    root: &Path,
    relative: &str,
    apart: &[&str],
    visit: &mut dyn FnMut(&str, &fs::Metadata) -> Result<(), String>,
) -> Result<(), String> {
    let dir = root.join(relative);
    let mut names: Vec<String> = Vec::new();
    for entry in fs::read_dir(&dir).map_err(|e| format!("listing {}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| format!("listing {}: {e}", dir.display()))?;
        let name = entry.file_name().into_string().map_err(|n| {
            format!("{} holds a name that is not UTF-8 ({n:?}); package files never have one", dir.display())
        })?;
        if name.contains(['\n', '\r']) {
            return Err(format!("{} holds a name with a line break ({name:?})", dir.display()));
        }
        if !(relative.is_empty() && apart.contains(&name.as_str())) {
            names.push(name);
        }
    }
    names.sort();
    for name in names {
        let path = if relative.is_empty() { name } else { format!("{relative}/{name}") };
        let meta = fs::symlink_metadata(root.join(&path)).map_err(|e| format!("{path}: {e}"))?;
        visit(&path, &meta)?;
        if meta.is_dir() {
            walk(root, &path, &[], visit)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_tree_is_opened_to_all_and_changes_are_named() {
        let root = tempfile::tempdir().unwrap();
        let lib = root.path().join("lib");
        fs::create_dir(&lib).unwrap();
        fs::set_permissions(&lib, fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(lib.join("a.py"), "x = 1").unwrap();
        fs::set_permissions(lib.join("a.py"), fs::Permissions::from_mode(0o4600)).unwrap();
        fs::write(lib.join("tool"), "#!/bin/sh").unwrap();
        fs::set_permissions(lib.join("tool"), fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", lib.join("link")).unwrap();
        fs::write(root.path().join("files.txt"), "apart").unwrap();
        let listing = seal(root.path(), &["files.txt"]).unwrap();
        assert_eq!(listing.count, 4);
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!((mode(&lib), mode(&lib.join("a.py")), mode(&lib.join("tool"))), (0o755, 0o644, 0o755));
        assert!(compare(root.path(), &listing.text, &["files.txt"]).unwrap().is_clean());

        fs::write(lib.join("a.py"), "x = 2").unwrap();
        fs::remove_file(lib.join("tool")).unwrap();
        fs::write(lib.join("new.py"), "").unwrap();
        fs::remove_file(lib.join("link")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", lib.join("link")).unwrap();
        let found = compare(root.path(), &listing.text, &["files.txt"]).unwrap();
        assert_eq!(found.changed, vec!["lib/a.py", "lib/link"]);
        assert_eq!(found.missing, vec!["lib/tool"]);
        assert_eq!(found.added, vec!["lib/new.py"]);
    }

    #[test]
    fn special_files_are_refused() {
        let root = tempfile::tempdir().unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.path().join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let err = seal(root.path(), &[]).unwrap_err();
        assert!(err.contains("FIFO"), "{err}");
    }
}
