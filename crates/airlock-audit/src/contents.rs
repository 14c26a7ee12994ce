//! Figure and artefact contents, kept beside the chain by their SHA-256.
//!
//! The chained record holds each content's hash; the bytes live in table
//! `contents`, keyed by that hash, once however many runs produced them.
//! A reader checks the bytes against the hash before handing them out, so
//! an edited content is reported, never shown; a deleted one is merely
//! absent (a store may be pruned of contents without breaking its chain).

use airlock_policy::RunRecord;
use base64::Engine as _;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::error::AuditError;
use crate::store::{AuditStore, BUSY_TIMEOUT};

/// Which contents a store keeps beside the chain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeepContents {
    /// Figures and the artefacts returned inline.
    #[default]
    All,
    /// Figures only: artefacts stay hashes in the record.
    Figures,
    /// Nothing: every content stays a hash in the record.
    Off,
}

/// What a store keeps, and the most it keeps in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContentsPolicy {
    pub keep: KeepContents,
    /// The bytes of all kept contents together, at most; a content that
    /// would pass it is not kept (and noted so).
    pub quota_bytes: u64,
}

/// 1 GiB: hundreds of thousands of figures; a run that writes 64 MiB each
/// time stops being kept after sixteen such runs, not when the disk fills.
pub const DEFAULT_CONTENTS_QUOTA: u64 = 1 << 30;

impl Default for ContentsPolicy {
    fn default() -> ContentsPolicy {
        ContentsPolicy { keep: KeepContents::All, quota_bytes: DEFAULT_CONTENTS_QUOTA }
    }
}

/// Whether a content is kept, and if not, why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContentState {
    Kept,
    /// Not kept, for the noted reason (the quota, the disk, the switch).
    Skipped(String),
    /// Never kept and nothing noted: recorded by an older airlock, returned
    /// to a file rather than inline, or pruned.
    Absent,
}

/// A content the record carries inline: its hash and its base64 bytes.
struct Inline<'a> {
    sha256: &'a str,
    base64: &'a str,
    figure: bool,
}

fn inline(record: &RunRecord) -> Vec<Inline<'_>> {
    let figures = record.figures.iter().filter_map(|figure| {
        Some(Inline { sha256: &figure.sha256, base64: figure.png_base64.as_deref()?, figure: true })
    });
    let artifacts = record.artifacts.iter().filter_map(|artifact| {
        Some(Inline { sha256: artifact.sha256.as_deref()?, base64: artifact.content_base64.as_deref()?, figure: false })
    });
    figures.chain(artifacts).collect()
}

/// Keeps the contents `record` carries inline (figures, and the artefacts
/// the caller asked for inline) whose bytes match the hash the record gives
/// them, as `policy` allows: its own transaction, after the entry's, so a
/// content never costs the record. A content the switch or the quota
/// leaves out is noted in `contents_skipped` with the reason; one that does
/// not decode or match is left out unnoted (the record still names its
/// hash). A full disk stops the step: what was kept stays, the rest is
/// noted if there is room for a note, and the error is returned for the
/// caller to log.
pub(crate) fn keep(connection: &mut Connection, record: &RunRecord, policy: ContentsPolicy) -> rusqlite::Result<()> {
    let contents = inline(record);
    if contents.is_empty() {
        return Ok(());
    }
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut used: u64 =
        transaction.query_row("SELECT CAST(total(length(bytes)) AS INTEGER) FROM contents", [], |row| row.get(0))?;
    for content in &contents {
        let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(content.base64.as_bytes()) else { continue };
        if airlock_core::sha256_hex(&bytes) != content.sha256 {
            continue;
        }
        let skip = match policy.keep {
            KeepContents::Off => Some("the store keeps no contents (keep_contents = \"off\")".to_owned()),
            KeepContents::Figures if !content.figure => {
                Some("the store keeps figures only (keep_contents = \"figures\")".to_owned())
            }
            _ if used.saturating_add(bytes.len() as u64) > policy.quota_bytes => Some(format!(
                "the store's quota for kept contents ({} bytes) was reached; raise contents_quota_mb or prune",
                policy.quota_bytes
            )),
            _ => None,
        };
        if let Some(reason) = skip {
            note_skipped(&transaction, content.sha256, &reason)?;
            continue;
        }
        let added = transaction
            .prepare_cached("INSERT OR IGNORE INTO contents (sha256, bytes) VALUES (?1, ?2)")?
            .execute(params![content.sha256, bytes])?;
        if added == 1 {
            used = used.saturating_add(bytes.len() as u64);
            transaction.execute("DELETE FROM contents_skipped WHERE sha256 = ?1", [content.sha256])?;
        }
    }
    transaction.commit()
}

fn note_skipped(connection: &Connection, sha256: &str, reason: &str) -> rusqlite::Result<()> {
    connection
        .prepare_cached("INSERT OR REPLACE INTO contents_skipped (sha256, reason) VALUES (?1, ?2)")?
        .execute(params![sha256, reason])?;
    Ok(())
}

/// After an error stopped [`keep`] (a full disk, most likely): notes every
/// content of `record` not kept, with `reason`, if even that fits; a note
/// that does not fit is let go (the console then says the content was not
/// kept, without the reason).
pub(crate) fn note_unkept(connection: &mut Connection, record: &RunRecord, reason: &str) {
    let noted = (|| -> rusqlite::Result<()> {
        let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
        for content in inline(record) {
            let kept: bool = transaction.query_row(
                "SELECT EXISTS (SELECT 1 FROM contents WHERE sha256 = ?1)",
                [content.sha256],
                |row| row.get(0),
            )?;
            if !kept {
                note_skipped(&transaction, content.sha256, reason)?;
            }
        }
        transaction.commit()
    })();
    let _ = noted;
}

impl AuditStore {
    /// Whether a content of this SHA-256 is kept (unchecked: reading it
    /// with [`AuditStore::content`] checks it).
    pub fn has_content(&self, sha256: &str) -> Result<bool, AuditError> {
        if !self.is_current() {
            return Ok(false);
        }
        self.lock()
            .query_row("SELECT EXISTS (SELECT 1 FROM contents WHERE sha256 = ?1)", [sha256], |row| row.get(0))
            .map_err(|error| AuditError::sqlite(self.path(), "read", error, BUSY_TIMEOUT))
    }

    /// Whether the content of this SHA-256 is kept, or why it is not.
    pub fn content_state(&self, sha256: &str) -> Result<ContentState, AuditError> {
        if !self.is_current() {
            return Ok(ContentState::Absent);
        }
        let connection = self.lock();
        let read = |error| AuditError::sqlite(self.path(), "read", error, BUSY_TIMEOUT);
        let kept: bool = connection
            .query_row("SELECT EXISTS (SELECT 1 FROM contents WHERE sha256 = ?1)", [sha256], |row| row.get(0))
            .map_err(read)?;
        if kept {
            return Ok(ContentState::Kept);
        }
        let reason: Option<String> = connection
            .query_row("SELECT reason FROM contents_skipped WHERE sha256 = ?1", [sha256], |row| row.get(0))
            .optional()
            .map_err(read)?;
        Ok(reason.map_or(ContentState::Absent, ContentState::Skipped))
    }

    /// The content whose SHA-256 is `sha256` (lower-case hex), checked
    /// against it; `None` when it was never kept (recorded by an older
    /// airlock, returned to a file instead of inline, or pruned).
    /// [`AuditError::ContentAltered`] when the stored bytes no longer match.
    pub fn content(&self, sha256: &str) -> Result<Option<Vec<u8>>, AuditError> {
        if !self.is_current() {
            return Ok(None);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_policy::FigureRecord;

    /// A record carrying one figure of `bytes`, inline.
    fn with_figure(id: &str, bytes: &[u8]) -> RunRecord {
        RunRecord {
            id: id.to_owned(),
            code: "print(1)\n".to_owned(),
            figures: vec![FigureRecord {
                name: "figure-1.png".to_owned(),
                bytes: bytes.len() as u64,
                sha256: airlock_core::sha256_hex(bytes),
                png_base64: Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
                ..FigureRecord::default()
            }],
            ..RunRecord::default()
        }
    }

    /// `len` bytes, different for each `len`: hashes of counters.
    fn noise(len: usize) -> Vec<u8> {
        use sha2::Digest;
        let mut out: Vec<u8> = (0..len / 32 + 1).flat_map(|i| sha2::Sha256::digest(format!("{len}/{i}"))).collect();
        out.truncate(len);
        out
    }

    #[test]
    fn a_full_disk_costs_the_contents_never_the_entry() {
        let dir = tempfile::tempdir().unwrap();
        let store = AuditStore::open(&dir.path().join("audit.sqlite3")).unwrap();
        // A real SQLITE_FULL: the file may grow by about 160 KiB more, room
        // for entries but not for a 2 MiB figure.
        {
            let connection = store.lock();
            let pages: i64 = connection.pragma_query_value(None, "page_count", |row| row.get(0)).unwrap();
            connection.pragma_update(None, "max_page_count", pages + 40).unwrap();
        }
        let big = noise(2 << 20);
        let entry = store.append(&with_figure("big", &big), Some("alice")).expect("the entry is recorded");
        assert_eq!(entry.seq, 1);
        let run = store.get("big").unwrap().expect("and can be read back");
        assert!(run.hash_matches);
        assert!(!store.has_content(&airlock_core::sha256_hex(&big)).unwrap(), "the figure was not kept");
        match store.content_state(&airlock_core::sha256_hex(&big)).unwrap() {
            ContentState::Skipped(reason) => assert!(reason.contains("disk was full"), "{reason}"),
            other => assert_eq!(other, ContentState::Absent, "noted if there was room for a note"),
        }
        store.append(&with_figure("next", b"small"), None).expect("the next run is recorded too");
        assert!(store.verify().unwrap().is_intact());
    }

    #[test]
    fn the_quota_and_the_switch_skip_contents_and_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let policy = ContentsPolicy { keep: KeepContents::All, quota_bytes: 1000 };
        let store = AuditStore::open(&dir.path().join("audit.sqlite3")).unwrap().with_contents(policy);
        let first = noise(600);
        let second = noise(601);
        store.append(&with_figure("first", &first), None).unwrap();
        store.append(&with_figure("second", &second), None).unwrap();
        assert_eq!(store.content_state(&airlock_core::sha256_hex(&first)).unwrap(), ContentState::Kept);
        match store.content_state(&airlock_core::sha256_hex(&second)).unwrap() {
            ContentState::Skipped(reason) => assert!(reason.contains("quota") && reason.contains("1000"), "{reason}"),
            other => panic!("the second passes the quota: {other:?}"),
        }
        assert!(store.get("second").unwrap().is_some(), "its entry is recorded");

        let off = ContentsPolicy { keep: KeepContents::Off, ..ContentsPolicy::default() };
        let store = AuditStore::open(&dir.path().join("off.sqlite3")).unwrap().with_contents(off);
        store.append(&with_figure("off", b"png"), None).unwrap();
        let state = store.content_state(&airlock_core::sha256_hex(b"png")).unwrap();
        assert!(matches!(&state, ContentState::Skipped(reason) if reason.contains("keep_contents")), "{state:?}");
    }
}
