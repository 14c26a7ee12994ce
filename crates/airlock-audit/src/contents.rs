//! Figure and artefact contents, kept beside the chain by their SHA-256.
//!
//! The chained record holds each content's hash; the bytes live in table
//! `contents`, keyed by that hash, once however many runs produced them.
//! A reader checks the bytes against the hash before handing them out, so
//! an edited content is reported, never shown; a deleted one is merely
//! absent (a store may be pruned of contents without breaking its chain).

use airlock_policy::RunRecord;
use base64::Engine as _;
use rusqlite::{Connection, OptionalExtension};

use crate::error::AuditError;
use crate::store::{AuditStore, BUSY_TIMEOUT};

/// Keeps the contents `record` carries inline (figures, and the artefacts
/// the caller asked for inline) whose bytes match the hash the record gives
/// them. A content that does not decode or match is left out: the record
/// still names its hash, and readers say the content was not kept.
pub(crate) fn keep(connection: &Connection, record: &RunRecord) -> rusqlite::Result<()> {
    let figures = record.figures.iter().map(|figure| (Some(&figure.sha256), figure.png_base64.as_ref()));
    let artifacts =
        record.artifacts.iter().map(|artifact| (artifact.sha256.as_ref(), artifact.content_base64.as_ref()));
    let mut insert = connection.prepare_cached("INSERT OR IGNORE INTO contents (sha256, bytes) VALUES (?1, ?2)")?;
    for (sha256, content) in figures.chain(artifacts) {
        let (Some(sha256), Some(content)) = (sha256, content) else { continue };
        let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(content.as_bytes()) else { continue };
        if airlock_core::sha256_hex(&bytes) == *sha256 {
            insert.execute(rusqlite::params![sha256, bytes])?;
        }
    }
    Ok(())
}

impl AuditStore {
    /// Whether a content of this SHA-256 is kept (unchecked: reading it
    /// with [`AuditStore::content`] checks it).
    pub fn has_content(&self, sha256: &str) -> Result<bool, AuditError> {
        self.lock()
            .query_row("SELECT EXISTS (SELECT 1 FROM contents WHERE sha256 = ?1)", [sha256], |row| row.get(0))
            .map_err(|error| AuditError::sqlite(self.path(), "read", error, BUSY_TIMEOUT))
    }

    /// The content whose SHA-256 is `sha256` (lower-case hex), checked
    /// against it; `None` when it was never kept (recorded by an older
    /// airlock, returned to a file instead of inline, or pruned).
    /// [`AuditError::ContentAltered`] when the stored bytes no longer match.
    pub fn content(&self, sha256: &str) -> Result<Option<Vec<u8>>, AuditError> {
        let bytes: Option<Vec<u8>> = self
            .lock()
            .query_row("SELECT bytes FROM contents WHERE sha256 = ?1", [sha256], |row| row.get(0))
            .optional()
            .map_err(|error| AuditError::sqlite(self.path(), "read", error, BUSY_TIMEOUT))?;
        match bytes {
            Some(bytes) if airlock_core::sha256_hex(&bytes) != sha256 => {
                Err(AuditError::ContentAltered { path: self.path().to_owned(), sha256: sha256.to_owned() })
            }
            other => Ok(other),
        }
    }
}
