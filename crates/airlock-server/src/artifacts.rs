//! The artefacts of past runs, kept so that a result too big for a model's
//! context can name them (an MCP resource link, `GET
//! /v1/runs/{id}/artifacts/{index}`) instead of carrying them.
//!
//! Content-addressed: each artefact is one file named by its SHA-256, which
//! the run's record in the audit store already holds, so the record is the
//! index and permissions are the record's. The store is capped; past the cap
//! the oldest files go first, and a link to one of them answers that it is no
//! longer kept.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where artefacts are kept, and how much.
#[derive(Debug)]
pub struct ArtifactStore {
    dir: PathBuf,
    budget: u64,
    /// One writer at a time, so that trimming sees a settled folder.
    writing: Mutex<()>,
}

impl ArtifactStore {
    /// A store in `dir` (made if missing) keeping at most `budget` bytes.
    pub fn open(dir: PathBuf, budget: u64) -> std::io::Result<ArtifactStore> {
        std::fs::create_dir_all(&dir)?;
        Ok(ArtifactStore { dir, budget, writing: Mutex::new(()) })
    }

    fn path(&self, sha256: &str) -> Option<PathBuf> {
        let valid = sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        valid.then(|| self.dir.join(sha256))
    }

    /// Keeps `data`, whose SHA-256 is `sha256`, then trims the store to its
    /// budget. An artefact larger than the whole budget is not kept.
    pub fn put(&self, sha256: &str, data: &[u8]) -> std::io::Result<()> {
        let Some(path) = self.path(sha256) else { return Ok(()) };
        if data.len() as u64 > self.budget {
            return Ok(());
        }
        let _alone = self.writing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if path.is_file() {
            // Touched, so that trimming counts it as new.
            return std::fs::File::options().append(true).open(&path)?.set_modified(std::time::SystemTime::now());
        }
        let staged = self.dir.join(format!(".{sha256}.{}", std::process::id()));
        airlock::save_to_host(&staged, data).and_then(|_| std::fs::rename(&staged, &path)).inspect_err(|_| {
            let _ = std::fs::remove_file(&staged);
        })?;
        self.trim()
    }

    /// The artefact whose SHA-256 is `sha256`, if it is still kept.
    pub fn get(&self, sha256: &str) -> Option<Vec<u8>> {
        std::fs::read(self.path(sha256)?).ok()
    }

    /// Drops the oldest artefacts until the store fits its budget.
    fn trim(&self) -> std::io::Result<()> {
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = std::fs::read_dir(&self.dir)?
            .filter_map(Result::ok)
            .filter(|entry| !entry.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|entry| {
                let meta = entry.metadata().ok()?;
                Some((meta.modified().ok()?, meta.len(), entry.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|(_, size, _)| size).sum();
        files.sort();
        for (_, size, path) in files {
            if total <= self.budget {
                break;
            }
            std::fs::remove_file(&path)?;
            total -= size;
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
        store.put(&one, b"123456").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        store.put(&two, b"123456").unwrap();
        assert_eq!(store.get(&one), None, "the oldest went to make room");
        assert_eq!(store.get(&two).as_deref(), Some(&b"123456"[..]));
        store.put(&"3".repeat(64), &[0; 11]).unwrap();
        assert_eq!(store.get(&"3".repeat(64)), None, "larger than the budget: not kept");
        assert_eq!(store.get("../../etc/passwd"), None);
    }
}
