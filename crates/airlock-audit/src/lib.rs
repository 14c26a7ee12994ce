//! airlock's audit trail: every run recorded in one SQLite file, each entry
//! chained to the one before by a hash, so that editing or deleting an entry
//! shows.
//!
//! ```no_run
//! # fn main() -> Result<(), airlock_audit::AuditError> {
//! # let record = airlock_policy::RunRecord::default();
//! use airlock_audit::{AuditStore, ListFilter};
//! let store = AuditStore::open(&AuditStore::default_path()?)?;
//! let entry = store.append(&record, Some("ci-bot"))?;   // the token's name
//! let run = store.get(&entry.run_id)?;                   // Option<StoredRun>
//! let page = store.list(&ListFilter::default())?;        // newest first
//! let report = store.verify()?;                          // names the first break
//! if let Some(run) = run { print!("{}", airlock_audit::render(&run)); }
//! # Ok(()) }
//! ```
//!
//! # Durability
//!
//! The database runs in WAL mode with `synchronous=FULL`: each append is one
//! transaction whose commit is synced to disk before `append` returns. A
//! crash of the process or the machine at any moment leaves every entry
//! `append` returned, and nothing of an append that had not returned except
//! possibly that whole entry. A full disk makes `append` return
//! [`AuditError::Storage`] (with [`AuditError::is_disk_full`]) and leaves
//! the chain as it was. The entry never waits on the contents it names:
//! they are kept after it is committed, in a transaction of their own.
//!
//! # What is stored
//!
//! One row per run in table `runs`, with the columns listings filter on and
//! the whole record as JSON text (`record`): the code and its hash, the
//! policy, the inputs' names and hashes, the status, the limits hit, stdout
//! and stderr as capped in the record, the artefacts' and figures' hashes
//! (never their contents: `content_base64` and `png_base64` are dropped),
//! usage, the image, the isolation layers. `principal` is the name of the
//! token that asked, never the token.
//!
//! The contents the record carried inline (figures, artefacts returned
//! inline) are kept in table `contents`, keyed by their SHA-256, once
//! however many runs made them, and only when they hash to what the record
//! says, as the store's [`ContentsPolicy`] allows: all of them, figures
//! only, or none ([`KeepContents`]), up to a quota for all kept contents
//! together ([`DEFAULT_CONTENTS_QUOTA`], 1 GiB). A content left out by the
//! switch, the quota or a full disk is noted in `contents_skipped` with the
//! reason (when even the note fits), and [`AuditStore::content_state`]
//! says it; its run's entry is recorded all the same. They are outside the chain: the chained record holds each hash, and
//! [`AuditStore::content`] checks the bytes against it before returning
//! them, so an edited content is refused and a deleted one is only absent.
//! `code_search` is a trigram full-text index of each run's code (rowid =
//! `seq`), for [`AuditStore::browse`]'s search.
//!
//! ```sql
//! runs (seq INTEGER PRIMARY KEY, run_id TEXT UNIQUE, recorded_at TEXT, started_at TEXT,
//!       status TEXT, principal TEXT NULL, hash_version INTEGER, prev_hash TEXT,
//!       entry_hash TEXT, record TEXT)
//! chain_head (id = 1, seq INTEGER, entry_hash TEXT)       -- moved by every append
//! contents (sha256 TEXT PRIMARY KEY, bytes BLOB)          -- since schema version 2
//! contents_skipped (sha256 TEXT PRIMARY KEY, reason TEXT) -- since 2
//! code_search USING fts5 (code, content = '', tokenize = 'trigram')   -- since 2
//! schema_version (format = 'airlock-audit', version = 2, created_at TEXT)
//! ```
//!
//! A version 1 store is brought to version 2 when a writer first opens it
//! ([`AuditStore::open`]: a server, a run recorded, `airlock audit
//! migrate`): the tables are added and the code of every run indexed, in
//! one transaction; the chain is not touched. Readers
//! ([`AuditStore::open_existing`]: `audit verify`, `show`, `list`, `ui`)
//! change nothing: they read a version 1 store as it is, without code
//! search ([`AuditError::OldSchema`] names the command that migrates). An
//! older airlock refuses to open a migrated file, naming the newer schema;
//! one that had it open before goes on appending without indexing, so every
//! writer's open indexes the entries past the index's last.
//!
//! The SQLite header's application id is `0x4149524C` ("AIRL").
//! `started_at` is the record's start time brought to
//! `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC), which sorts as text in time order; a
//! start time that is not RFC 3339 is kept as written.
//!
//! # The chain (hash version 1)
//!
//! Entries are numbered `seq` = 1, 2, 3... without gaps. Entry `n` holds
//! `prev_hash`, the `entry_hash` of entry `n - 1`, or 64 zeros for entry 1.
//! Its `entry_hash` is the lower-case hex SHA-256 of these bytes, in order:
//!
//! 1. the 22 ASCII bytes `airlock-audit-entry/1` followed by a newline (0x0A);
//! 2. `seq` as an unsigned 64-bit big-endian integer (8 bytes);
//! 3. the text columns `prev_hash`, `run_id`, `recorded_at`, `started_at`,
//!    `status`, each as its UTF-8 byte length (unsigned 64-bit big-endian)
//!    followed by its UTF-8 bytes;
//! 4. `principal`: the byte 0x00 when it is NULL, else the byte 0x01
//!    followed by its length and bytes as in 3;
//! 5. `record`, as in 3: the exact stored JSON text, not a re-serialisation.
//!
//! Every field is length-prefixed, so no choice of contents makes two
//! different entries hash the same bytes; and since the stored text is
//! hashed as it is, a verifier needs SQLite and SHA-256, no JSON library.
//! `hash_version` names the scheme; a later scheme would use a new domain
//! tag and number, and old entries would keep theirs. `verify_chain.py`,
//! beside this crate's `Cargo.toml`, is an independent implementation in
//! 70 lines of Python's standard library, and the tests check it agrees.
//!
//! A verifier walks the rows in `seq` order and checks, for each: `seq` is
//! one more than the last (else rows were deleted); `prev_hash` equals the
//! previous `entry_hash`; the recomputed hash equals `entry_hash` (else the
//! row was edited). Then the last entry must be the one `chain_head` names.
//!
//! # What can and cannot be detected
//!
//! Detected by [`AuditStore::verify`]: any edit of any stored field of any
//! entry; a deleted entry anywhere but at the end; entries swapped or
//! renumbered; an entry rewritten with a recomputed hash (its successor's
//! link breaks); entries deleted from the end, or added at the end, without
//! also moving `chain_head`.
//!
//! Not detected by `verify` alone: someone able to write the file can
//! delete the last entries *and* move `chain_head` back, or rewrite the
//! whole chain from some entry on, recomputing every hash; the chain is
//! then consistent and only an outside copy of an earlier head tells. Note
//! [`VerifyReport::last_good`] (or [`AuditStore::head`]) somewhere the
//! writer of the file cannot change, and [`AuditStore::verify_anchored`]
//! checks the chain still holds that entry unchanged. Deleting the whole
//! file is likewise only visible from outside.

#![forbid(unsafe_code)]

mod contents;
mod error;
mod hash;
mod list;
mod render;
mod store;
mod time;
mod verify;

pub use contents::{ContentState, ContentsPolicy, DEFAULT_CONTENTS_QUOTA, KeepContents};
pub use error::AuditError;
pub use hash::{EntryFields, GENESIS_HASH, HASH_VERSION};
pub use list::{Browse, Browsed, BrowsedRun, ListFilter, Page, Position, RunSummary};
pub use render::{bytes as human_bytes, policy_fields, render, seconds as human_seconds};
pub use store::{APPLICATION_ID, AuditEntry, AuditStore, BUSY_TIMEOUT, ChainHead, SCHEMA_VERSION, StoredRun};
pub use verify::{ChainBreak, ChainLink, Neighbours, Problem, VerifyReport};
