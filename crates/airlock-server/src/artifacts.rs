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

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
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
    /// A store in `dir` (made if missing, and made the server's alone as
    /// the audit database is: the runs' files are no other local user's to
    /// read) keeping at most `budget` bytes.
    pub fn open(dir: PathBuf, budget: u64) -> std::io::Result<ArtifactStore> {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
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
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(folder)?;
        // Written whole under another name, then renamed: a reader never
        // sees half of it.
        let staged = folder.join(format!(".{sha256}.{}", std::process::id()));
        let written = (|| {
            let mut file = std::fs::File::options().write(true).create_new(true).mode(0o600).open(&staged)?;
            file.write_all(data)?;
            file.sync_all()?;
            std::fs::rename(&staged, &path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&staged);
        }
        written?;
        self.trim()
    }

    /// The artefact whose SHA-256 is `sha256`, of `principal`'s runs, if it
    /// is still kept and still has that hash (what the record names is what
    /// is served, whatever changed the file since).
    pub fn get(&self, principal: Option<&str>, sha256: &str) -> Option<Vec<u8>> {
        let path = self.path(principal, sha256)?;
        // A store of an earlier version kept every artefact at the top: the
        // record that names one is the caller's, so it is served from there.
        let data = std::fs::read(&path).or_else(|_| std::fs::read(self.dir.join(sha256))).ok()?;
        (airlock_core::sha256_hex(&data) == sha256).then_some(data)
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

    /// Keeps `data` for `principal`; its SHA-256.
    fn keep(store: &ArtifactStore, principal: Option<&str>, data: &[u8]) -> String {
        let sha256 = airlock_core::sha256_hex(data);
        store.put(principal, &sha256, data).unwrap();
        // Distinct times, for the oldest-first order.
        std::thread::sleep(std::time::Duration::from_millis(5));
        sha256
    }

    #[test]
    fn keeps_within_its_budget_oldest_out_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::open(dir.path().join("a"), 10).unwrap();
        let one = keep(&store, None, b"123456");
        let two = keep(&store, None, b"654321");
        assert_eq!(store.get(None, &one), None, "the oldest went to make room");
        assert_eq!(store.get(None, &two).as_deref(), Some(&b"654321"[..]));
        let large = keep(&store, None, &[0; 11]);
        assert_eq!(store.get(None, &large), None, "larger than the budget: not kept");
        assert_eq!(store.get(None, "../../etc/passwd"), None);
        assert_eq!(store.get(Some("../.."), &two), None, "another principal's folder");
    }

    #[test]
    fn one_principals_flood_pushes_out_only_its_own_artefacts() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::open(dir.path().join("a"), 100).unwrap();
        let quiet = keep(&store, Some("quiet"), &[1; 30]);
        let flood: Vec<String> = (0..20u8).map(|n| keep(&store, Some("flood"), &[n; 20])).collect();
        assert_eq!(store.get(Some("quiet"), &quiet).as_deref(), Some(&[1; 30][..]), "the flood's own files went");
        assert_eq!(store.get(Some("flood"), &flood[19]).as_deref(), Some(&[19; 20][..]));
        assert_eq!(store.get(Some("flood"), &flood[0]), None, "the flood's oldest went first");
        assert_eq!(store.get(Some("other"), &quiet), None, "a principal reads only its own folder");
        // The quiet principal's file goes only once it holds the most.
        let larger = keep(&store, Some("quiet"), &[2; 50]);
        assert_eq!(store.get(Some("quiet"), &quiet), None);
        assert!(store.get(Some("quiet"), &larger).is_some());
    }

    #[test]
    fn the_store_is_the_servers_alone_and_serves_only_what_the_record_names() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("a");
        let store = ArtifactStore::open(root.clone(), 100).unwrap();
        let sha256 = keep(&store, Some("alice"), b"results");
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let file = store.path(Some("alice"), &sha256).unwrap();
        assert_eq!((mode(&root), mode(file.parent().unwrap()), mode(&file)), (0o700, 0o700, 0o600));
        // One an earlier version kept at the top is still served.
        let old = airlock_core::sha256_hex(b"from before");
        std::fs::write(root.join(&old), b"from before").unwrap();
        assert_eq!(store.get(Some("alice"), &old).as_deref(), Some(&b"from before"[..]));
        // Changed in place: no longer what the record names, so not served.
        std::fs::write(&file, b"swapped").unwrap();
        assert_eq!(store.get(Some("alice"), &sha256), None);
    }
}
