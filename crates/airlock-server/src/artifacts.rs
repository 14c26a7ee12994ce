//! The artefacts of past runs, kept so that a result too big for a model's
//! context can name them (an MCP resource link, `GET
//! /v1/runs/{id}/artifacts/{index}`) instead of carrying them.
//!
//! Content-addressed: each artefact is one file named by its SHA-256, which
//! the run's record in the audit store already holds, so the record is the
//! index and permissions are the record's. Each principal (a token's name)
//! has a folder of its own, and the store is capped as a whole: past the
//! cap, the oldest files of the principal holding the most go first. One
//! token's runs then push out only their own artefacts, until it holds no
//! more than any other; a link to a file gone answers that it is no longer
//! kept.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::Digest;

/// Where artefacts are kept, and how much.
#[derive(Debug)]
pub struct ArtifactStore {
    dir: PathBuf,
    budget: u64,
    /// One writer at a time, so that trimming sees a settled folder.
    writing: Mutex<()>,
}

/// The folder of a principal's artefacts: named by a hash of its name, so
/// that no name the operator chose reaches a path, and a run without a
/// principal (a stdio MCP server's) has one too.
fn folder_of(principal: Option<&str>) -> String {
    let name = principal.map_or_else(|| "\0none".to_owned(), |name| format!("\0token:{name}"));
    let hash = sha2::Sha256::digest(name.as_bytes());
    let hex: String = hash.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("by-{hex}")
}

/// A file of the store, for trimming.
struct Kept {
    modified: std::time::SystemTime,
    size: u64,
    path: PathBuf,
}

impl ArtifactStore {
    /// A store in `dir` (made if missing) keeping at most `budget` bytes.
    pub fn open(dir: PathBuf, budget: u64) -> std::io::Result<ArtifactStore> {
        std::fs::create_dir_all(&dir)?;
        Ok(ArtifactStore { dir, budget, writing: Mutex::new(()) })
    }

    fn path(&self, principal: Option<&str>, sha256: &str) -> Option<PathBuf> {
        let valid = sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        valid.then(|| self.dir.join(folder_of(principal)).join(sha256))
    }

    /// Keeps `data`, whose SHA-256 is `sha256`, for `principal`'s runs, then
    /// trims the store to its budget. An artefact larger than the whole
    /// budget is not kept.
    pub fn put(&self, principal: Option<&str>, sha256: &str, data: &[u8]) -> std::io::Result<()> {
        let Some(path) = self.path(principal, sha256) else { return Ok(()) };
        if data.len() as u64 > self.budget {
            return Ok(());
        }
        let _alone = self.writing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if path.is_file() {
            // Touched, so that trimming counts it as new.
            return std::fs::File::options().append(true).open(&path)?.set_modified(std::time::SystemTime::now());
        }
        let folder = path.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(folder)?;
        let staged = folder.join(format!(".{sha256}.{}", std::process::id()));
        airlock::save_to_host(&staged, data).and_then(|_| std::fs::rename(&staged, &path)).inspect_err(|_| {
            let _ = std::fs::remove_file(&staged);
        })?;
        self.trim()
    }

    /// The artefact whose SHA-256 is `sha256`, of `principal`'s runs, if it
    /// is still kept.
    pub fn get(&self, principal: Option<&str>, sha256: &str) -> Option<Vec<u8>> {
        std::fs::read(self.path(principal, sha256)?).ok()
    }

    /// The kept files of one folder, oldest first (staged ones left out).
    fn kept_in(folder: &Path) -> std::io::Result<Vec<Kept>> {
        let mut files: Vec<Kept> = std::fs::read_dir(folder)?
            .filter_map(Result::ok)
            .filter(|entry| !entry.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|entry| {
                let meta = entry.metadata().ok().filter(std::fs::Metadata::is_file)?;
                Some(Kept { modified: meta.modified().ok()?, size: meta.len(), path: entry.path() })
            })
            .collect();
        files.sort_by(|a, b| (a.modified, &a.path).cmp(&(b.modified, &b.path)));
        Ok(files)
    }

    /// Drops artefacts until the store fits its budget: each time the
    /// oldest of the folder that holds the most. Files a store of an
    /// earlier version kept at the top count as one folder.
    fn trim(&self) -> std::io::Result<()> {
        let mut folders: Vec<(u64, std::collections::VecDeque<Kept>)> = Vec::new();
        let mut add = |files: Vec<Kept>| {
            if !files.is_empty() {
                folders.push((files.iter().map(|f| f.size).sum(), files.into()));
            }
        };
        add(Self::kept_in(&self.dir)?);
        for entry in std::fs::read_dir(&self.dir)?.filter_map(Result::ok) {
            if entry.file_name().to_string_lossy().starts_with("by-") && entry.file_type()?.is_dir() {
                add(Self::kept_in(&entry.path())?);
            }
        }
        let mut total: u64 = folders.iter().map(|(size, _)| size).sum();
        while total > self.budget {
            let Some((held, files)) = folders.iter_mut().max_by_key(|(held, _)| *held) else { break };
            let Some(oldest) = files.pop_front() else { break };
            std::fs::remove_file(&oldest.path)?;
            *held -= oldest.size;
            total -= oldest.size;
        }
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_within_its_budget_oldest_out_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::open(dir.path().join("a"), 10).unwrap();
        let (one, two) = ("1".repeat(64), "2".repeat(64));
        store.put(None, &one, b"123456").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        store.put(None, &two, b"123456").unwrap();
        assert_eq!(store.get(None, &one), None, "the oldest went to make room");
        assert_eq!(store.get(None, &two).as_deref(), Some(&b"123456"[..]));
        store.put(None, &"3".repeat(64), &[0; 11]).unwrap();
        assert_eq!(store.get(None, &"3".repeat(64)), None, "larger than the budget: not kept");
        assert_eq!(store.get(None, "../../etc/passwd"), None);
        assert_eq!(store.get(Some("../.."), &two), None, "another principal's folder");
    }

    #[test]
    fn one_principals_flood_pushes_out_only_its_own_artefacts() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::open(dir.path().join("a"), 100).unwrap();
        let quiet = "a".repeat(64);
        store.put(Some("quiet"), &quiet, &[1; 30]).unwrap();
        for n in 0..20u8 {
            std::thread::sleep(std::time::Duration::from_millis(5));
            store.put(Some("flood"), &format!("{n:064x}"), &[n; 20]).unwrap();
        }
        assert_eq!(store.get(Some("quiet"), &quiet).as_deref(), Some(&[1; 30][..]), "the flood's own files went");
        let newest = format!("{:064x}", 19);
        assert_eq!(store.get(Some("flood"), &newest).as_deref(), Some(&[19; 20][..]));
        assert_eq!(store.get(Some("flood"), &format!("{:064x}", 0)), None, "the flood's oldest went first");
        assert_eq!(store.get(Some("other"), &quiet), None, "a principal reads only its own folder");
        // The quiet principal's file goes only once it holds the most.
        store.put(Some("quiet"), &"b".repeat(64), &[2; 50]).unwrap();
        assert_eq!(store.get(Some("quiet"), &quiet), None);
        assert!(store.get(Some("quiet"), &"b".repeat(64)).is_some());
    }
}
