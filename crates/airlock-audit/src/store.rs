//! The store itself: one SQLite file, one table of chained entries.

use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use airlock_core::record::now_rfc3339;
use airlock_policy::RunRecord;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, TransactionBehavior, params};
use serde::{Deserialize, Serialize};

use crate::contents::ContentsPolicy;
use crate::error::AuditError;
use crate::hash::{EntryFields, GENESIS_HASH, HASH_VERSION};
use crate::time;

/// The schema version this build writes and reads. Version 2 added the
/// `contents` table and the `code_search` index; a version 1 store is
/// brought to version 2 when a writer opens it ([`AuditStore::open`], see
/// [`migrate_to_2`]), and read as it is by [`AuditStore::open_existing`].
pub const SCHEMA_VERSION: i64 = 2;

/// What the `schema_version` table's `format` column says.
const FORMAT: &str = "airlock-audit";

/// "AIRL", in the SQLite header's application id. It tells an airlock audit
/// database from any other SQLite file before a table is read, and
/// `sqlite3 FILE 'PRAGMA application_id'` shows it.
pub const APPLICATION_ID: i32 = 0x4149_524C;

/// How long a writer waits for another to finish before giving up. Appends
/// take milliseconds; this is long enough for a burst of 16 concurrent
/// writers each syncing to disk, short enough that a stuck lock is reported.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(15);

const MAX_PRINCIPAL_CHARS: usize = 200;

/// STRICT tables: SQLite refuses a value of the wrong type rather than
/// storing it, so a row always reads back as written.
const SCHEMA: &str = "
CREATE TABLE schema_version (
    format     TEXT NOT NULL,
    version    INTEGER NOT NULL,
    created_at TEXT NOT NULL
) STRICT;

CREATE TABLE runs (
    seq          INTEGER PRIMARY KEY NOT NULL CHECK (seq >= 1),
    run_id       TEXT NOT NULL UNIQUE,
    recorded_at  TEXT NOT NULL,
    started_at   TEXT NOT NULL,
    status       TEXT NOT NULL,
    principal    TEXT,
    hash_version INTEGER NOT NULL,
    prev_hash    TEXT NOT NULL,
    entry_hash   TEXT NOT NULL,
    record       TEXT NOT NULL
) STRICT;
CREATE INDEX runs_by_started_at ON runs (started_at);
CREATE INDEX runs_by_status ON runs (status, seq);
CREATE INDEX runs_by_principal ON runs (principal, seq);

CREATE TABLE chain_head (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    seq        INTEGER NOT NULL,
    entry_hash TEXT NOT NULL
) STRICT;
";

/// What version 2 added: figure and artefact contents, by their SHA-256
/// (outside the chain: the chained record holds the hash, and a reader
/// checks the bytes against it), and a trigram index of each run's code
/// (rowid = seq) for substring search. Contentless: the code is stored once,
/// in the record.
const SCHEMA_2: &str = "
CREATE TABLE contents (
    sha256 TEXT PRIMARY KEY NOT NULL,
    bytes  BLOB NOT NULL
) STRICT;
CREATE TABLE contents_skipped (
    sha256 TEXT PRIMARY KEY NOT NULL,
    reason TEXT NOT NULL
) STRICT;
CREATE VIRTUAL TABLE code_search USING fts5(code, content='', tokenize='trigram');
";

const ENTRY_COLUMNS: &str =
    "seq, run_id, recorded_at, started_at, status, principal, hash_version, prev_hash, entry_hash, record";

/// The audit store: a handle on one SQLite file. Share it between threads
/// (`Arc<AuditStore>`); appends from one handle take turns, appends from
/// several handles or processes are serialised by SQLite's write lock.
/// Every call blocks on disk I/O: call it from a blocking context.
pub struct AuditStore {
    path: PathBuf,
    connection: Mutex<Connection>,
    contents: ContentsPolicy,
    /// The file's schema version: [`SCHEMA_VERSION`], or 1 when a reader
    /// opened a version 1 store and left it as it was.
    schema: i64,
}

/// How a store is opened: to record runs, or only to read them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    /// Creates, migrates and heals the file as needed.
    Writer,
    /// Changes nothing in the file's schema: a version 1 store is read as
    /// version 1 (without code search or kept contents).
    Reader,
}

impl std::fmt::Debug for AuditStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditStore").field("path", &self.path).finish_non_exhaustive()
    }
}

/// Where an entry sits in the chain, as written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Position in the chain: 1, 2, 3... with no gaps.
    pub seq: u64,
    pub run_id: String,
    /// When the entry was written (RFC 3339, UTC).
    pub recorded_at: String,
    /// The name of the token that asked for the run, when a token did.
    pub principal: Option<String>,
    pub prev_hash: String,
    pub entry_hash: String,
}

/// A recorded run, read back.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StoredRun {
    pub entry: AuditEntry,
    /// The record as stored: artefact and figure contents are not kept, only
    /// their hashes.
    pub record: RunRecord,
    /// Whether the entry's stored fields still hash to its stored hash. Its
    /// place in the chain is for [`AuditStore::verify`] to check.
    pub hash_matches: bool,
}

/// The last entry of the chain. Kept outside the store (a log line, another
/// machine), it lets a later `verify_anchored` notice entries cut from the end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainHead {
    pub seq: u64,
    pub entry_hash: String,
}

impl ChainHead {
    /// Reads `SEQ:HASH`, the form [`ChainHead`]'s `Display` writes.
    pub fn parse(text: &str) -> Option<ChainHead> {
        let (seq, hash) = text.trim().split_once(':')?;
        let is_hash = hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        Some(ChainHead { seq: seq.parse().ok()?, entry_hash: hash.to_owned() }).filter(|_| is_hash)
    }
}

impl std::fmt::Display for ChainHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.seq, self.entry_hash)
    }
}

/// One row of `runs`, as stored.
pub(crate) struct RawEntry {
    pub seq: i64,
    pub run_id: String,
    pub recorded_at: String,
    pub started_at: String,
    pub status: String,
    pub principal: Option<String>,
    pub hash_version: i64,
    pub prev_hash: String,
    pub entry_hash: String,
    pub record: String,
}

impl RawEntry {
    /// Reads a row selected with [`ENTRY_COLUMNS`].
    pub(crate) fn from_row(row: &Row<'_>) -> rusqlite::Result<RawEntry> {
        Ok(RawEntry {
            seq: row.get(0)?,
            run_id: row.get(1)?,
            recorded_at: row.get(2)?,
            started_at: row.get(3)?,
            status: row.get(4)?,
            principal: row.get(5)?,
            hash_version: row.get(6)?,
            prev_hash: row.get(7)?,
            entry_hash: row.get(8)?,
            record: row.get(9)?,
        })
    }

    /// The fields the entry hash covers, with `seq` already checked positive.
    pub(crate) fn fields(&self, seq: u64) -> EntryFields<'_> {
        EntryFields {
            seq,
            prev_hash: &self.prev_hash,
            run_id: &self.run_id,
            recorded_at: &self.recorded_at,
            started_at: &self.started_at,
            status: &self.status,
            principal: self.principal.as_deref(),
            record: &self.record,
        }
    }
}

/// The `SELECT` that reads whole entries, for `verify` and `get`.
pub(crate) fn select_entries(rest: &str) -> String {
    format!("SELECT {ENTRY_COLUMNS} FROM runs {rest}")
}

/// The recorded head, `(0, GENESIS_HASH)` before the first entry; `None` only
/// when someone deleted the row.
pub(crate) fn read_head(connection: &Connection) -> rusqlite::Result<Option<(i64, String)>> {
    connection
        .query_row("SELECT seq, entry_hash FROM chain_head WHERE id = 1", [], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()
}

impl AuditStore {
    /// `<data_dir>/audit.sqlite3`, the data directory being airlock's
    /// ([`airlock_core::paths::data_dir`]).
    pub fn default_path() -> Result<PathBuf, AuditError> {
        Ok(airlock_core::paths::data_dir().map_err(|source| AuditError::DataDir { source })?.join("audit.sqlite3"))
    }

    /// Opens the audit database at `path`, creating it (mode 0600, in a
    /// folder made 0700 if missing) with its schema when it does not exist.
    /// Refuses a file that is not an airlock audit database, or one written
    /// by a newer airlock. An existing file's permissions are left as they are.
    /// A version 1 store is brought to version 2, and the code-search index
    /// is caught up with entries an older airlock appended since.
    pub fn open(path: &Path) -> Result<AuditStore, AuditError> {
        create_file(path)?;
        AuditStore::open_file(path, Access::Writer)
    }

    /// Opens the audit database at `path` only if the file exists: for
    /// commands that read (`airlock audit verify`, `show`), where a missing
    /// file means a wrong path, not a store to start. The schema is left as
    /// it is: a version 1 store is read without code search, whose use then
    /// names the command that migrates it, and is not written to.
    pub fn open_existing(path: &Path) -> Result<AuditStore, AuditError> {
        if !path.is_file() {
            return Err(AuditError::Missing { path: path.to_owned() });
        }
        AuditStore::open_file(path, Access::Reader)
    }

    fn open_file(path: &Path, access: Access) -> Result<AuditStore, AuditError> {
        let sqlite = |action: &'static str| move |error| AuditError::sqlite(path, action, error, BUSY_TIMEOUT);
        let mut connection =
            Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)
                .map_err(sqlite("opened"))?;
        connection.busy_timeout(BUSY_TIMEOUT).map_err(sqlite("opened"))?;
        // Anyone who could write the file could have put views or triggers in
        // it; with trusted_schema off they cannot call functions with side effects.
        connection.pragma_update(None, "trusted_schema", false).map_err(sqlite("opened"))?;
        let fresh = check_identity(&connection, path)?;
        // WAL: a commit is one append to the log, so a crash at any moment
        // leaves the database at the last commit, never between two; and
        // readers (verify, listings) do not block the writer.
        let mode: String =
            retry_while_busy(|| connection.pragma_update_and_check(None, "journal_mode", "wal", |row| row.get(0)))
                .map_err(sqlite("opened"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(AuditError::Storage {
                path: path.to_owned(),
                action: "opened",
                cause: format!(
                    "SQLite would not use its write-ahead log here (journal mode stayed {mode:?}); \
                     keep the database on a local file system"
                ),
                disk_full: false,
            });
        }
        // FULL rather than WAL's usual NORMAL: under NORMAL a commit reaches
        // the disk only at the next checkpoint, so a power cut could lose
        // entries the caller was told were recorded. FULL syncs the log at
        // every commit; one fsync per run is a price an audit trail pays.
        connection.pragma_update(None, "synchronous", "FULL").map_err(sqlite("opened"))?;
        if fresh {
            initialize(&mut connection).map_err(sqlite("initialised"))?;
        }
        let mut schema = check_schema_version(&connection, path)?;
        if access == Access::Writer {
            if schema < SCHEMA_VERSION {
                migrate_to_2(&mut connection).map_err(sqlite("brought to the current schema"))?;
                schema = SCHEMA_VERSION;
            }
            heal_code_search(&connection).map_err(sqlite("indexed"))?;
        }
        let connection = Mutex::new(connection);
        Ok(AuditStore { path: path.to_owned(), connection, contents: ContentsPolicy::default(), schema })
    }

    /// Keeps contents as `policy` says from now on (the default: all, up to
    /// [`crate::DEFAULT_CONTENTS_QUOTA`]).
    pub fn with_contents(mut self, policy: ContentsPolicy) -> AuditStore {
        self.contents = policy;
        self
    }

    /// Whether the file has this build's schema; `false` only for a version
    /// 1 store a reader opened, which has no code search and no kept contents.
    pub fn is_current(&self) -> bool {
        self.schema >= SCHEMA_VERSION
    }

    /// The error for `what`, which a version 1 store opened to read cannot do.
    pub(crate) fn needs_migration(&self, what: &'static str) -> AuditError {
        AuditError::OldSchema { path: self.path.clone(), found: self.schema, what }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records `record` as the next entry of the chain, with `principal`, the
    /// *name* of the token that asked for the run (never the token itself).
    /// Artefact and figure contents leave the record, which keeps their
    /// hashes; contents that match their hash are kept beside the chain
    /// (see [`AuditStore::content`]), as the store's [`ContentsPolicy`] allows.
    ///
    /// The entry is one transaction: either wholly written and linked, or
    /// not at all (a full disk returns [`AuditError::Storage`] and leaves the
    /// chain as it was). The contents follow in a transaction of their own,
    /// once the entry is committed: a content that does not fit (the quota,
    /// a full disk) is skipped and noted ([`AuditStore::content_state`]),
    /// and the entry stays. The link to the previous entry is made under
    /// SQLite's write lock, so concurrent appenders, in threads or processes,
    /// cannot fork the chain.
    pub fn append(&self, record: &RunRecord, principal: Option<&str>) -> Result<AuditEntry, AuditError> {
        if let Some(name) = principal {
            check_principal(name)?;
        }
        if record.id.is_empty() {
            return Err(AuditError::BadRecord { reason: "it has no run id".to_owned() });
        }
        if !self.is_current() {
            return Err(self.needs_migration("recording a run"));
        }
        let stored = serde_json::to_string(&record.without_contents())
            .map_err(|error| AuditError::BadRecord { reason: format!("it cannot be written as JSON: {error}") })?;
        // A started_at that is not RFC 3339 is kept as written: the run is
        // still recorded, it just sorts oddly in time filters.
        let started_at = time::normalize(&record.started_at).unwrap_or_else(|| record.started_at.clone());
        let sqlite = |error| AuditError::sqlite(&self.path, "written", error, BUSY_TIMEOUT);

        let mut connection = self.lock();
        let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate).map_err(sqlite)?;
        let existing: Option<i64> = transaction
            .query_row("SELECT seq FROM runs WHERE run_id = ?1", [&record.id], |row| row.get(0))
            .optional()
            .map_err(sqlite)?;
        if let Some(seq) = existing {
            return Err(AuditError::Duplicate { run_id: record.id.clone(), seq: seq.unsigned_abs() });
        }
        // The recorded head, not the last row: if rows were cut from the end,
        // the next entry still links to the true head and the gap shows.
        let head = match read_head(&transaction).map_err(sqlite)? {
            Some(head) => head,
            None => transaction
                .query_row("SELECT seq, entry_hash FROM runs ORDER BY seq DESC LIMIT 1", [], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })
                .optional()
                .map_err(sqlite)?
                .unwrap_or((0, GENESIS_HASH.to_owned())),
        };
        let (head_seq, prev_hash) = head;
        let seq =
            head_seq.checked_add(1).and_then(|next| u64::try_from(next).ok().filter(|s| *s >= 1)).ok_or_else(|| {
                AuditError::UnreadableEntry {
                    path: self.path.clone(),
                    seq: head_seq,
                    reason: "the recorded chain head has an impossible sequence number".to_owned(),
                }
            })?;
        let recorded_at = now_rfc3339();
        let fields = EntryFields {
            seq,
            prev_hash: &prev_hash,
            run_id: &record.id,
            recorded_at: &recorded_at,
            started_at: &started_at,
            status: record.status.name(),
            principal,
            record: &stored,
        };
        let entry_hash = fields.hash();
        transaction
            .execute(
                &format!("INSERT INTO runs ({ENTRY_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
                params![
                    head_seq + 1,
                    record.id,
                    recorded_at,
                    started_at,
                    record.status.name(),
                    principal,
                    HASH_VERSION,
                    prev_hash,
                    entry_hash,
                    stored
                ],
            )
            .map_err(sqlite)?;
        transaction
            .execute("INSERT INTO code_search (rowid, code) VALUES (?1, ?2)", params![head_seq + 1, record.code])
            .map_err(sqlite)?;
        transaction
            .execute(
                "INSERT OR REPLACE INTO chain_head (id, seq, entry_hash) VALUES (1, ?1, ?2)",
                params![head_seq + 1, entry_hash],
            )
            .map_err(sqlite)?;
        transaction.commit().map_err(sqlite)?;
        if let Err(error) = crate::contents::keep(&mut connection, record, self.contents) {
            // Shown to viewers: the kind of failure, never the store's path.
            let reason = if error.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
                "the disk was full when the run was recorded".to_owned()
            } else {
                format!("the store could not write it when the run was recorded ({error})")
            };
            crate::contents::note_unkept(&mut connection, record, &reason);
        }
        Ok(AuditEntry {
            seq,
            run_id: record.id.clone(),
            recorded_at,
            principal: principal.map(str::to_owned),
            prev_hash,
            entry_hash,
        })
    }

    /// The run recorded under `run_id`, if any.
    pub fn get(&self, run_id: &str) -> Result<Option<StoredRun>, AuditError> {
        let connection = self.lock();
        let raw = connection
            .query_row(&select_entries("WHERE run_id = ?1"), [run_id], RawEntry::from_row)
            .optional()
            .map_err(|error| AuditError::sqlite(&self.path, "read", error, BUSY_TIMEOUT))?;
        drop(connection);
        let Some(raw) = raw else { return Ok(None) };
        let unreadable = |reason: String| AuditError::UnreadableEntry { path: self.path.clone(), seq: raw.seq, reason };
        let seq = u64::try_from(raw.seq).map_err(|_| unreadable("its sequence number is negative".to_owned()))?;
        let record: RunRecord = serde_json::from_str(&raw.record)
            .map_err(|error| unreadable(format!("its record is not valid: {error}")))?;
        let hash_matches = raw.hash_version == HASH_VERSION && raw.fields(seq).hash() == raw.entry_hash;
        Ok(Some(StoredRun {
            entry: AuditEntry {
                seq,
                run_id: raw.run_id,
                recorded_at: raw.recorded_at,
                principal: raw.principal,
                prev_hash: raw.prev_hash,
                entry_hash: raw.entry_hash,
            },
            record,
            hash_matches,
        }))
    }

    /// Who asked for run `run_id`: `None` when there is no such run,
    /// `Some(None)` when it was recorded without a principal. One indexed
    /// look-up: check this before reading a run for a viewer, so that a run
    /// they may not see costs the same as one that is not there.
    pub fn principal_of(&self, run_id: &str) -> Result<Option<Option<String>>, AuditError> {
        self.lock()
            .query_row("SELECT principal FROM runs WHERE run_id = ?1", [run_id], |row| row.get(0))
            .optional()
            .map_err(|error| AuditError::sqlite(&self.path, "read", error, BUSY_TIMEOUT))
    }

    /// The recorded head of the chain, `None` while it is empty.
    pub fn head(&self) -> Result<Option<ChainHead>, AuditError> {
        let head =
            read_head(&self.lock()).map_err(|error| AuditError::sqlite(&self.path, "read", error, BUSY_TIMEOUT))?;
        Ok(head.and_then(|(seq, entry_hash)| {
            u64::try_from(seq).ok().filter(|seq| *seq >= 1).map(|seq| ChainHead { seq, entry_hash })
        }))
    }

    /// A connection of its own on the file, for a long read (a walk of the
    /// whole chain) that should not hold the shared one. Read-only: it can
    /// change nothing, whatever the file holds.
    pub(crate) fn own_reader(&self) -> Result<Connection, AuditError> {
        let sqlite = |error| AuditError::sqlite(&self.path, "opened", error, BUSY_TIMEOUT);
        let connection =
            Connection::open_with_flags(&self.path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
                .map_err(sqlite)?;
        connection.busy_timeout(BUSY_TIMEOUT).map_err(sqlite)?;
        connection.pragma_update(None, "trusted_schema", false).map_err(sqlite)?;
        Ok(connection)
    }

    /// The connection. A thread that panicked while holding it left no
    /// transaction open (dropping one rolls it back), so a poisoned lock is
    /// still a usable connection.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Connection> {
        self.connection.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Makes the file 0600 (and its folder 0700) before SQLite opens it: SQLite
/// would make it with the umask's mode, and gives the -wal and -shm files the
/// database file's own mode.
fn create_file(path: &Path) -> Result<(), AuditError> {
    let create_error = |source| AuditError::Create { path: path.to_owned(), source };
    if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        DirBuilder::new().recursive(true).mode(0o700).create(parent).map_err(create_error)?;
    }
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(create_error)?;
    Ok(())
}

/// Runs `step` again while SQLite answers busy, until [`BUSY_TIMEOUT`].
/// Switching a fresh file to WAL needs the file to itself, and SQLite
/// answers busy at once instead of calling the busy handler, so processes
/// opening a new store together need this.
fn retry_while_busy<T>(mut step: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    let deadline = Instant::now() + BUSY_TIMEOUT;
    loop {
        match step() {
            Err(error)
                if error.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy)
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            result => return result,
        }
    }
}

/// Whether the file is an empty database to initialise (`true`) or already
/// an airlock audit database (`false`); anything else is refused.
fn check_identity(connection: &Connection, path: &Path) -> Result<bool, AuditError> {
    let sqlite = |error| AuditError::sqlite(path, "read", error, BUSY_TIMEOUT);
    // One snapshot for both reads: another process may be initialising the
    // file meanwhile, and its id without its tables (or the reverse) would
    // look like a stranger's database.
    let snapshot = connection.unchecked_transaction().map_err(sqlite)?;
    let application_id: i32 = snapshot.pragma_query_value(None, "application_id", |row| row.get(0)).map_err(sqlite)?;
    if application_id == APPLICATION_ID {
        return Ok(false);
    }
    let not_ours = |reason: String| AuditError::NotAuditDatabase { path: path.to_owned(), reason };
    if application_id != 0 {
        return Err(not_ours(format!(
            "its SQLite application id is {application_id:#010x}, not airlock's {APPLICATION_ID:#010x}"
        )));
    }
    let mut statement =
        snapshot.prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name").map_err(sqlite)?;
    let tables = statement.query_map([], |row| row.get(0)).map_err(sqlite)?.collect::<Result<Vec<String>, _>>();
    let tables = tables.map_err(sqlite)?;
    if !tables.is_empty() {
        return Err(not_ours(format!("it is an SQLite database of something else, with tables {}", tables.join(", "))));
    }
    Ok(true)
}

fn initialize(connection: &mut Connection) -> rusqlite::Result<()> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Another process may have initialised the file since we looked.
    let application_id: i32 = transaction.pragma_query_value(None, "application_id", |row| row.get(0))?;
    if application_id == APPLICATION_ID {
        return Ok(());
    }
    transaction.execute_batch(SCHEMA)?;
    transaction.execute_batch(SCHEMA_2)?;
    transaction.execute(
        "INSERT INTO schema_version (format, version, created_at) VALUES (?1, ?2, ?3)",
        params![FORMAT, SCHEMA_VERSION, now_rfc3339()],
    )?;
    transaction.execute("INSERT INTO chain_head (id, seq, entry_hash) VALUES (1, 0, ?1)", [GENESIS_HASH])?;
    transaction.pragma_update(None, "application_id", APPLICATION_ID)?;
    transaction.commit()
}

/// The file's schema version: this build's, or an older one it can bring
/// up to date.
fn check_schema_version(connection: &Connection, path: &Path) -> Result<i64, AuditError> {
    let not_ours = |reason: String| AuditError::NotAuditDatabase { path: path.to_owned(), reason };
    let rows: Result<Vec<(String, i64)>, _> = connection
        .prepare("SELECT format, version FROM schema_version")
        .and_then(|mut statement| statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?.collect());
    let rows = rows.map_err(|error| not_ours(format!("its schema_version table cannot be read: {error}")))?;
    match rows.as_slice() {
        [(format, version)] if format == FORMAT => match *version {
            found @ (1 | SCHEMA_VERSION) => Ok(found),
            found if found > SCHEMA_VERSION => {
                Err(AuditError::NewerSchema { path: path.to_owned(), found, supported: SCHEMA_VERSION })
            }
            found => Err(not_ours(format!("its schema version {found} was never written by airlock"))),
        },
        _ => Err(not_ours("its schema_version table does not name the airlock-audit format".to_owned())),
    }
}

/// Brings a version 1 store to version 2, in one transaction: the new
/// tables, and every recorded run's code in the search index. Contents of
/// runs recorded before were never kept, so they stay absent. The chain is
/// not touched. Another process may have migrated the file since we looked.
fn migrate_to_2(connection: &mut Connection) -> rusqlite::Result<()> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i64 = transaction.query_row("SELECT version FROM schema_version", [], |row| row.get(0))?;
    if version != 1 {
        return Ok(());
    }
    transaction.execute_batch(SCHEMA_2)?;
    transaction.execute(
        "INSERT INTO code_search (rowid, code)
         SELECT seq, json_extract(record, '$.code') FROM runs WHERE json_valid(record)",
        [],
    )?;
    transaction.execute("UPDATE schema_version SET version = ?1", [SCHEMA_VERSION])?;
    transaction.commit()
}

/// Indexes the code of entries past the last one indexed: an older airlock
/// that had the file open when it was migrated goes on appending without
/// indexing, and a writer's open catches up. Cheap when nothing is missing:
/// one look at each end.
fn heal_code_search(connection: &Connection) -> rusqlite::Result<()> {
    let indexed: i64 = connection
        .query_row("SELECT rowid FROM code_search ORDER BY rowid DESC LIMIT 1", [], |row| row.get(0))
        .optional()?
        .unwrap_or(0);
    let last: i64 = connection.query_row("SELECT coalesce(max(seq), 0) FROM runs", [], |row| row.get(0))?;
    if last <= indexed {
        return Ok(());
    }
    connection.execute(
        "INSERT INTO code_search (rowid, code)
         SELECT seq, json_extract(record, '$.code') FROM runs WHERE seq > ?1 AND json_valid(record)",
        [indexed],
    )?;
    Ok(())
}

fn check_principal(name: &str) -> Result<(), AuditError> {
    let bad = |reason| Err(AuditError::BadPrincipal { principal: name.to_owned(), reason });
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.chars().count() > MAX_PRINCIPAL_CHARS {
        return bad("it is longer than 200 characters");
    }
    if name.chars().any(char::is_control) {
        return bad("it contains control characters");
    }
    Ok(())
}
