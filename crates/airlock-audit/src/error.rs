//! What can go wrong with the audit store, each case naming the file, the
//! problem and the fix.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::ErrorCode;

/// An audit store operation that failed. Problems found in the chain itself
/// are not errors: [`crate::AuditStore::verify`] reports them.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The file exists but is not an airlock audit database; airlock will not
    /// write into it.
    #[error(
        "{path} is not an airlock audit database ({reason}); point airlock at another file \
         (AIRLOCK_HOME) or move this one away"
    )]
    NotAuditDatabase { path: PathBuf, reason: String },

    /// The file was made by a newer airlock, whose schema this build does not know.
    #[error(
        "{path} holds audit schema version {found}, newer than the {supported} this airlock \
         understands; use a newer airlock to read it"
    )]
    NewerSchema { path: PathBuf, found: i64, supported: i64 },

    /// A version 1 store, opened to read and left as it is, cannot do this.
    #[error(
        "{path} holds audit schema version {found}, written by an older airlock, and was opened to read \
         without changing it; {what} needs version 2: run `airlock audit --db {path} migrate` (or record \
         a run into it) to bring it up to date"
    )]
    OldSchema { path: PathBuf, found: i64, what: &'static str },

    /// The file could not be read or written: a full disk, a read-only file
    /// system, an I/O error. Nothing was half written: the transaction was
    /// rolled back and the chain is as it was before the call.
    #[error("the audit database {path} could not be {action}: {cause}")]
    Storage { path: PathBuf, action: &'static str, cause: String, disk_full: bool },

    /// Another writer held the database longer than the busy timeout.
    #[error(
        "the audit database {path} stayed locked by another writer for {waited:?}; \
         nothing was written, try again (a long-running `sqlite3` session on the file can cause this)"
    )]
    Busy { path: PathBuf, waited: Duration },

    /// SQLite reports the file damaged (not an edit of the chain, which
    /// `verify` reports, but a file SQLite itself cannot read).
    #[error("the audit database {path} is damaged: {cause}; keep a copy and run `sqlite3 {path} .recover`")]
    Corrupt { path: PathBuf, cause: String },

    /// A stored row could not be read back as a run record.
    #[error("entry {seq} of the audit database {path} cannot be read: {reason}; run `airlock audit verify`")]
    UnreadableEntry { path: PathBuf, seq: i64, reason: String },

    /// The run id is already in the store; each run is recorded once.
    #[error("run {run_id} is already recorded in the audit database (entry {seq}); a run is recorded once")]
    Duplicate { run_id: String, seq: u64 },

    /// The record cannot be stored as it is.
    #[error("the run record cannot be recorded: {reason}")]
    BadRecord { reason: String },

    /// The principal is not a usable name.
    #[error("principal {principal:?} is not usable: {reason}; pass the token's name, never the token")]
    BadPrincipal { principal: String, reason: &'static str },

    /// A kept content no longer hashes to the hash its record gives it.
    #[error(
        "the content {sha256} kept in the audit database {path} was altered: its bytes no longer hash to \
         {sha256}; it is not shown (the record and its chain are checked by `airlock audit verify`)"
    )]
    ContentAltered { path: PathBuf, sha256: String },

    /// A listing filter that cannot be applied.
    #[error("{field}: {message}")]
    BadFilter { field: &'static str, message: String },

    /// airlock's data directory is unknown, so the default path is too.
    #[error("cannot tell where the audit database goes: {source}")]
    DataDir {
        #[source]
        source: airlock_core::SandboxError,
    },

    /// [`crate::AuditStore::open_existing`] found no file.
    #[error(
        "there is no audit database at {path}; runs are recorded there once a server or \
         `--audit` run has written one (set AIRLOCK_HOME if the data lives elsewhere)"
    )]
    Missing { path: PathBuf },

    /// Creating the file or its folder failed before SQLite was involved.
    #[error("could not create the audit database {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl AuditError {
    /// Classifies an SQLite error met while doing `action` on `path`.
    pub(crate) fn sqlite(
        path: &Path,
        action: &'static str,
        error: rusqlite::Error,
        busy_timeout: Duration,
    ) -> AuditError {
        let path = path.to_owned();
        let message = error.to_string();
        match error.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
                AuditError::Busy { path, waited: busy_timeout }
            }
            Some(ErrorCode::DiskFull) => AuditError::Storage {
                path,
                action,
                cause: format!("the disk is full ({message}); free space on the file system that holds it"),
                disk_full: true,
            },
            Some(ErrorCode::NotADatabase) => AuditError::NotAuditDatabase { path, reason: message },
            Some(ErrorCode::DatabaseCorrupt) => AuditError::Corrupt { path, cause: message },
            Some(ErrorCode::ReadOnly | ErrorCode::PermissionDenied | ErrorCode::CannotOpen) => AuditError::Storage {
                path,
                action,
                cause: format!(
                    "{message}; check that airlock may write the file, its -wal and -shm companions and its folder"
                ),
                disk_full: false,
            },
            _ => AuditError::Storage { path, action, cause: message, disk_full: false },
        }
    }

    /// Whether the error is a full disk: the server answers 507, not 500.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, AuditError::Storage { disk_full: true, .. })
    }
}
