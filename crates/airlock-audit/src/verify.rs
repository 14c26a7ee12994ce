//! Walking the chain and naming the first place it is broken.

use std::fmt;

use rusqlite::Connection;
use serde::Serialize;

use crate::error::AuditError;
use crate::hash::{GENESIS_HASH, HASH_VERSION};
use crate::store::{AuditStore, BUSY_TIMEOUT, ChainHead, RawEntry, read_head, select_entries};

/// What [`AuditStore::verify`] found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// Entries that checked out, from the first on, before any break.
    pub entries_checked: u64,
    /// The last entry that checked out: note it somewhere else to detect a
    /// later truncation with [`AuditStore::verify_anchored`].
    pub last_good: Option<ChainHead>,
    /// The first broken link; `None` when the whole chain holds.
    pub first_break: Option<ChainBreak>,
}

impl VerifyReport {
    pub fn is_intact(&self) -> bool {
        self.first_break.is_none()
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.first_break, &self.last_good) {
            (None, None) => f.write_str("audit chain intact: no entries yet"),
            (None, Some(head)) => {
                write!(f, "audit chain intact: {}, head {head}", entries(self.entries_checked))
            }
            (Some(broken), _) => write!(
                f,
                "audit chain BROKEN at {broken}\n{} before it check out{}",
                entries(self.entries_checked),
                self.last_good.as_ref().map_or(String::new(), |good| format!(", the last being {good}"))
            ),
        }
    }
}

fn entries(count: u64) -> String {
    if count == 1 { "1 entry".to_owned() } else { format!("{count} entries") }
}

/// The first place the chain does not hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChainBreak {
    /// The first sequence number at which the chain is broken.
    pub seq: u64,
    /// The run stored at `seq`, when a row is there.
    pub run_id: Option<String>,
    pub problem: Problem,
}

impl fmt::Display for ChainBreak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seq = self.seq;
        match &self.run_id {
            Some(run_id) => write!(f, "entry {seq} (run {run_id}): ")?,
            None => write!(f, "entry {seq}: ")?,
        }
        match &self.problem {
            Problem::ContentEdited { stored_hash, computed_hash } => write!(
                f,
                "its content was edited: its fields hash to {computed_hash}, not to its stored hash {stored_hash}"
            ),
            Problem::LinkBroken { prev_hash, .. } if seq == 1 => write!(
                f,
                "its link is broken: the first entry's prev_hash must be 64 zeros, but it names {prev_hash}; \
                 entries before it were deleted and the rest renumbered, or this link was edited"
            ),
            Problem::LinkBroken { prev_hash, previous_entry_hash } => write!(
                f,
                "its link is broken: it names {prev_hash} as the entry before it, but entry {} hashes to \
                 {previous_entry_hash}; entry {} was rewritten with a recomputed hash, or this link was edited",
                seq.saturating_sub(1),
                seq.saturating_sub(1)
            ),
            Problem::Missing { through } if *through == seq => {
                write!(f, "it is missing: the row was deleted (the next entry present is {})", through + 1)
            }
            Problem::Missing { through } => write!(
                f,
                "it and the entries up to {through} are missing: the rows were deleted (the next entry present is {})",
                through + 1
            ),
            Problem::TailMissing { head_seq } => write!(
                f,
                "it is missing, and so is every entry up to {head_seq}, the chain's recorded head: \
                 entries were deleted from the end"
            ),
            Problem::BeyondHead { head_seq } => {
                write!(f, "it lies beyond the chain's recorded head (entry {head_seq}): it was added outside airlock")
            }
            Problem::HeadMismatch { head_hash, entry_hash } => write!(
                f,
                "it hashes to {entry_hash}, but the chain's recorded head says {head_hash}: the last entry was \
                 replaced"
            ),
            Problem::HeadMissing => f.write_str("the chain's recorded head (table chain_head) was deleted"),
            Problem::UnknownHashVersion { version } => {
                write!(f, "it names hash scheme {version}, which no airlock wrote (this one knows {HASH_VERSION})")
            }
            Problem::Unreadable { reason } => write!(f, "it cannot be read: {reason}"),
            Problem::AnchorMissing { anchor } => write!(
                f,
                "it is missing, but the chain was seen to reach {anchor} (the anchor given): entries were \
                 deleted from the end"
            ),
            Problem::AnchorMismatch { anchor_hash, entry_hash } => write!(
                f,
                "it hashes to {entry_hash}, but the anchor given says {anchor_hash}: the chain was rewritten \
                 from here or before"
            ),
        }
    }
}

/// Why the chain is broken at an entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Problem {
    /// The entry's stored fields do not hash to its stored hash: it was edited in place.
    ContentEdited {
        stored_hash: String,
        computed_hash: String,
    },
    /// The entry's `prev_hash` is not the previous entry's hash: the previous
    /// entry was rewritten with a recomputed hash, or this link was edited.
    LinkBroken {
        prev_hash: String,
        previous_entry_hash: String,
    },
    /// This entry and those up to `through` are absent; a later one is present.
    Missing {
        through: u64,
    },
    /// This entry and those up to `head_seq` are absent: the head says the
    /// chain went further.
    TailMissing {
        head_seq: u64,
    },
    /// The entry is past the recorded head: it was inserted by hand.
    BeyondHead {
        head_seq: u64,
    },
    /// The last entry is not the one the head recorded.
    HeadMismatch {
        head_hash: String,
        entry_hash: String,
    },
    /// The row that records the head is gone.
    HeadMissing,
    UnknownHashVersion {
        version: i64,
    },
    /// A row whose columns no longer have the types airlock wrote.
    Unreadable {
        reason: String,
    },
    /// The chain ends before the anchor's entry.
    AnchorMissing {
        anchor: ChainHead,
    },
    /// The anchor's entry is there but hashes differently.
    AnchorMismatch {
        anchor_hash: String,
        entry_hash: String,
    },
}

/// An entry's neighbours in the chain, as stored: what a page showing one
/// run checks of its place without walking the whole chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Neighbours {
    /// Entry `seq - 1`, when there is one.
    pub previous: Option<ChainLink>,
    /// Entry `seq + 1`, when there is one.
    pub next: Option<ChainLink>,
}

/// One entry's place in the chain: its hash and the hash it links to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChainLink {
    pub seq: u64,
    pub entry_hash: String,
    pub prev_hash: String,
}

impl AuditStore {
    /// The entries either side of entry `seq`, for checking its two links.
    pub fn neighbours(&self, seq: u64) -> Result<Neighbours, AuditError> {
        let sqlite = |error| AuditError::sqlite(self.path(), "read", error, BUSY_TIMEOUT);
        let connection = self.lock();
        let mut statement = connection
            .prepare_cached("SELECT seq, entry_hash, prev_hash FROM runs WHERE seq = ?1 - 1 OR seq = ?1 + 1")
            .map_err(sqlite)?;
        let seq_i64 = i64::try_from(seq).unwrap_or(i64::MAX - 1);
        let links = statement
            .query_map([seq_i64], |row| Ok((row.get::<_, i64>(0)?, row.get(1)?, row.get(2)?)))
            .map_err(sqlite)?;
        let mut neighbours = Neighbours { previous: None, next: None };
        for link in links {
            let (at, entry_hash, prev_hash) = link.map_err(sqlite)?;
            let link = ChainLink { seq: at.unsigned_abs(), entry_hash, prev_hash };
            if at < seq_i64 {
                neighbours.previous = Some(link);
            } else {
                neighbours.next = Some(link);
            }
        }
        Ok(neighbours)
    }

    /// Walks the whole chain and names the first broken link. `Err` only
    /// when the file cannot be read; a broken chain is a report.
    ///
    /// Reads one consistent snapshot: appends made meanwhile are not seen,
    /// and do not disturb the walk. The walk reads through a connection of
    /// its own, opened for it: this handle's connection stays free for the
    /// appends, listings and pages served meanwhile.
    pub fn verify(&self) -> Result<VerifyReport, AuditError> {
        self.walk(None)
    }

    /// [`AuditStore::verify`], and checks that the chain still holds
    /// `anchor`, a head noted earlier outside the store (a log line, the
    /// `last_good` of an earlier report). This catches entries cut from the
    /// end together with the recorded head, which `verify` alone cannot.
    pub fn verify_anchored(&self, anchor: &ChainHead) -> Result<VerifyReport, AuditError> {
        self.walk(Some(anchor))
    }

    fn walk(&self, anchor: Option<&ChainHead>) -> Result<VerifyReport, AuditError> {
        let sqlite = |error| AuditError::sqlite(self.path(), "read", error, BUSY_TIMEOUT);
        let mut connection = self.own_reader()?;
        // A read transaction: one snapshot of the head and the rows together.
        let snapshot = connection.transaction().map_err(sqlite)?;
        let report = walk(&snapshot, anchor).map_err(sqlite)?;
        drop(snapshot);
        Ok(report)
    }
}

/// The chain so far: what checked out, for the report and the next link.
struct Walk {
    checked: u64,
    last: Option<(ChainHead, String)>,
}

impl Walk {
    fn last_seq(&self) -> u64 {
        self.last.as_ref().map_or(0, |(head, _)| head.seq)
    }

    fn report(self, first_break: Option<ChainBreak>) -> VerifyReport {
        VerifyReport { entries_checked: self.checked, last_good: self.last.map(|(head, _)| head), first_break }
    }

    fn broken(self, seq: u64, run_id: Option<String>, problem: Problem) -> VerifyReport {
        self.report(Some(ChainBreak { seq, run_id, problem }))
    }
}

fn walk(connection: &Connection, anchor: Option<&ChainHead>) -> rusqlite::Result<VerifyReport> {
    let recorded_head = read_head(connection)?;
    // A negative head is reported after the walk; the rows are checked first.
    let head = recorded_head.clone().and_then(|(seq, hash)| Some((u64::try_from(seq).ok()?, hash)));
    let mut statement = connection.prepare(&select_entries("ORDER BY seq"))?;
    let mut rows = statement.query([])?;
    let mut chain = Walk { checked: 0, last: None };
    while let Some(row) = rows.next()? {
        let expected_seq = chain.last_seq() + 1;
        let entry = match RawEntry::from_row(row) {
            Ok(entry) => entry,
            Err(error) => {
                let reason = format!("a column has a type airlock never writes ({error})");
                return Ok(chain.broken(expected_seq, None, Problem::Unreadable { reason }));
            }
        };
        let Some(seq) = u64::try_from(entry.seq).ok().filter(|seq| *seq >= 1) else {
            let reason = format!("its sequence number {} is not positive", entry.seq);
            return Ok(chain.broken(expected_seq, Some(entry.run_id), Problem::Unreadable { reason }));
        };
        if seq > expected_seq {
            return Ok(chain.broken(expected_seq, None, Problem::Missing { through: seq - 1 }));
        }
        if entry.hash_version != HASH_VERSION {
            let version = entry.hash_version;
            return Ok(chain.broken(seq, Some(entry.run_id), Problem::UnknownHashVersion { version }));
        }
        let previous_entry_hash = chain.last.as_ref().map_or(GENESIS_HASH, |(head, _)| head.entry_hash.as_str());
        if entry.prev_hash != previous_entry_hash {
            let problem = Problem::LinkBroken {
                prev_hash: entry.prev_hash.clone(),
                previous_entry_hash: previous_entry_hash.to_owned(),
            };
            return Ok(chain.broken(seq, Some(entry.run_id), problem));
        }
        let computed_hash = entry.fields(seq).hash();
        if computed_hash != entry.entry_hash {
            let problem = Problem::ContentEdited { stored_hash: entry.entry_hash.clone(), computed_hash };
            return Ok(chain.broken(seq, Some(entry.run_id), problem));
        }
        if let Some((head_seq, head_hash)) = &head {
            // The head moves in the same transaction as the row it names,
            // so airlock never leaves a row past it.
            if seq > *head_seq {
                return Ok(chain.broken(seq, Some(entry.run_id), Problem::BeyondHead { head_seq: *head_seq }));
            }
            if seq == *head_seq && *head_hash != entry.entry_hash {
                let problem = Problem::HeadMismatch { head_hash: head_hash.clone(), entry_hash: entry.entry_hash };
                return Ok(chain.broken(seq, Some(entry.run_id), problem));
            }
        }
        if let Some(anchor) = anchor.filter(|anchor| anchor.seq == seq && anchor.entry_hash != entry.entry_hash) {
            let problem =
                Problem::AnchorMismatch { anchor_hash: anchor.entry_hash.clone(), entry_hash: entry.entry_hash };
            return Ok(chain.broken(seq, Some(entry.run_id), problem));
        }
        chain.checked += 1;
        chain.last = Some((ChainHead { seq, entry_hash: entry.entry_hash }, entry.run_id));
    }
    let next_seq = chain.last_seq() + 1;
    let head_seq = match (recorded_head, head) {
        (None, _) => return Ok(chain.broken(next_seq, None, Problem::HeadMissing)),
        (Some((seq, _)), None) => {
            let reason = format!("the recorded head's sequence number {seq} is negative");
            return Ok(chain.broken(next_seq, None, Problem::Unreadable { reason }));
        }
        (_, Some((head_seq, _))) => head_seq,
    };
    if head_seq >= next_seq {
        return Ok(chain.broken(next_seq, None, Problem::TailMissing { head_seq }));
    }
    if let Some(anchor) = anchor.filter(|anchor| anchor.seq >= next_seq) {
        return Ok(chain.broken(next_seq, None, Problem::AnchorMissing { anchor: anchor.clone() }));
    }
    Ok(chain.report(None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_does_not_hold_the_shared_connection() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(AuditStore::open(&dir.path().join("audit.sqlite3")).unwrap());
        let record = airlock_policy::RunRecord { id: "r1".to_owned(), ..airlock_policy::RunRecord::default() };
        store.append(&record, None).unwrap();
        // The shared connection busy (a page being served, an append)...
        let busy = store.lock();
        let (done, report) = std::sync::mpsc::channel();
        let walker = std::thread::spawn({
            let store = store.clone();
            move || done.send(store.verify().map(|report| report.is_intact())).unwrap()
        });
        // ...does not stop a walk. (Were it to, this fails after a minute
        // rather than hanging: the lock is let go below.)
        let walked = report.recv_timeout(std::time::Duration::from_secs(60));
        drop(busy);
        walker.join().unwrap();
        assert!(matches!(walked, Ok(Ok(true))), "{walked:?}");
    }
}
