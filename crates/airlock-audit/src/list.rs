//! Listing runs: the API's pages ([`AuditStore::list`]) and the console's
//! ([`AuditStore::browse`]), from one query builder. Every listing walks an
//! index newest first and stops after one page: none loads the store.

use airlock_policy::{Language, Limit, Status};
use rusqlite::types::Value;
use rusqlite::{Row, params_from_iter};
use serde::{Deserialize, Serialize};

use crate::error::AuditError;
use crate::store::{AuditStore, BUSY_TIMEOUT};
use crate::time;

const DEFAULT_PAGE_SIZE: u32 = 50;
const MAX_PAGE_SIZE: u32 = 1000;
/// Longer searches are refused: each trigram of the phrase is one more
/// lookup in the index, and a piece of a line finds a run as well as a page.
const MAX_SEARCH_CHARS: usize = 64;
/// The index holds trigrams: the shortest text it can find.
const TRIGRAM: usize = 3;
/// How much of the code a listing carries for its first line.
const EXCERPT_CHARS: usize = 240;

/// What to list. Every field is optional; `Deserialize` reads it from a
/// query string or JSON body as is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListFilter {
    pub status: Option<Status>,
    /// Runs started at or after this RFC 3339 time (or bare date).
    pub since: Option<String>,
    /// Runs started before this RFC 3339 time (or bare date).
    pub until: Option<String>,
    /// Runs asked for by the token of this name.
    pub principal: Option<String>,
    /// Runs per page: 1 to 1000, 50 when absent.
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// One page of runs, newest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Page {
    pub runs: Vec<RunSummary>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    /// Cursors stay valid while runs are being added.
    pub next_cursor: Option<String>,
}

/// A run in a listing: what the columns and a glance at the record say.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RunSummary {
    pub seq: u64,
    pub run_id: String,
    pub started_at: String,
    pub recorded_at: String,
    pub status: Status,
    pub principal: Option<String>,
    pub language: Option<Language>,
    pub code_sha256: Option<String>,
    pub exit_code: Option<i32>,
    pub wall_ms: Option<u64>,
    pub limits_hit: Vec<Limit>,
}

/// What the console lists: [`ListFilter`]'s filters, text in the code, and
/// pages both ways from an entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Browse {
    pub status: Option<Status>,
    pub since: Option<String>,
    pub until: Option<String>,
    pub principal: Option<String>,
    /// Runs whose code contains this text (3 characters or more), ignoring case.
    pub code_contains: Option<String>,
    pub from: Position,
    /// Runs per page: 1 to 1000, 50 when 0.
    pub limit: u32,
}

/// Where a page starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Position {
    /// The newest runs.
    #[default]
    Newest,
    /// The runs just older than entry `seq`.
    Before(u64),
    /// The runs just newer than entry `seq`.
    After(u64),
}

/// One page of the console's listing, newest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Browsed {
    pub runs: Vec<BrowsedRun>,
    /// `Position::Before(older)` gives the next older page, when there is one.
    pub older: Option<u64>,
    /// `Position::After(newer)` gives the next newer page, when there is one.
    pub newer: Option<u64>,
}

/// A run in the console's listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrowsedRun {
    pub summary: RunSummary,
    /// The code's first line that is not blank, cut at 240 characters of
    /// the code, as stored.
    pub first_line: String,
}

/// The conditions of a listing, as SQL with its values in order.
#[derive(Default)]
struct Conditions {
    sql: Vec<&'static str>,
    values: Vec<Value>,
}

impl Conditions {
    fn add(&mut self, sql: &'static str, value: Value) {
        self.sql.push(sql);
        self.values.push(value);
    }

    fn new(
        status: Option<Status>,
        since: Option<&str>,
        until: Option<&str>,
        principal: Option<&str>,
    ) -> Result<Conditions, AuditError> {
        let mut conditions = Conditions::default();
        if let Some(status) = status {
            conditions.add("status = ?", Value::Text(status.name().to_owned()));
        }
        for (field, text, sql) in [("since", since, "started_at >= ?"), ("until", until, "started_at < ?")] {
            if let Some(text) = text {
                let normalized = time::normalize(text).ok_or_else(|| AuditError::BadFilter {
                    field,
                    message: format!("{text:?} is not an RFC 3339 time; write e.g. 2026-11-29T09:00:00Z or 2026-11-29"),
                })?;
                conditions.add(sql, Value::Text(normalized));
            }
        }
        if let Some(principal) = principal {
            conditions.add("principal = ?", Value::Text(principal.to_owned()));
        }
        Ok(conditions)
    }

    /// Runs whose code holds `text`, ignoring case, through the trigram
    /// index (which answers exact substrings). Text shorter than a trigram
    /// is refused: the index cannot answer it, and reading every run's code
    /// instead took seconds with 100,000 runs (bench/results/console.md).
    fn code_contains(&mut self, text: &str) -> Result<(), AuditError> {
        let chars = text.chars().count();
        if chars == 0 {
            return Ok(());
        }
        if chars < TRIGRAM {
            return Err(AuditError::BadFilter {
                field: "code_contains",
                message: format!(
                    "{chars} characters is too short: search for at least {TRIGRAM} characters of the code \
                     (it is indexed by trigrams)"
                ),
            });
        }
        if chars > MAX_SEARCH_CHARS {
            return Err(AuditError::BadFilter {
                field: "code_contains",
                message: format!(
                    "{chars} characters is too long: search for at most {MAX_SEARCH_CHARS} characters of the \
                     code (a shorter piece of it finds the same runs)"
                ),
            });
        }
        // One FTS5 string: the text, its double quotes doubled.
        let phrase = format!("\"{}\"", text.replace('"', "\"\""));
        self.add("seq IN (SELECT rowid FROM code_search WHERE code_search MATCH ?)", Value::Text(phrase));
        Ok(())
    }

    fn where_clause(&self, extra: Option<&str>) -> String {
        let all: Vec<&str> = self.sql.iter().copied().chain(extra).collect();
        if all.is_empty() { String::new() } else { format!("WHERE {}", all.join(" AND ")) }
    }
}

fn page_size(limit: u32) -> Result<u32, AuditError> {
    if (1..=MAX_PAGE_SIZE).contains(&limit) {
        Ok(limit)
    } else {
        Err(AuditError::BadFilter {
            field: "limit",
            message: format!("{limit} is not between 1 and {MAX_PAGE_SIZE}; page through with the cursor"),
        })
    }
}

fn to_i64(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

impl AuditStore {
    /// One page of runs matching `filter`, newest first.
    pub fn list(&self, filter: &ListFilter) -> Result<Page, AuditError> {
        let limit = page_size(filter.limit.unwrap_or(DEFAULT_PAGE_SIZE))?;
        let mut conditions = Conditions::new(
            filter.status,
            filter.since.as_deref(),
            filter.until.as_deref(),
            filter.principal.as_deref(),
        )?;
        if let Some(cursor) = &filter.cursor {
            let before = cursor.parse::<i64>().ok().filter(|seq| *seq >= 1).ok_or_else(|| AuditError::BadFilter {
                field: "cursor",
                message: format!("{cursor:?} is not a cursor this store returned; pass a page's next_cursor as it is"),
            })?;
            conditions.add("seq < ?", Value::Integer(before));
        }
        let (mut runs, more) = self.page(&conditions, None, true, limit)?;
        let runs: Vec<RunSummary> = runs.drain(..).map(|run| run.summary).collect();
        let next_cursor = more.then(|| runs.last().map(|run| run.seq.to_string())).flatten();
        Ok(Page { runs, next_cursor })
    }

    /// One page of the console's listing: the runs matching `browse`, newest
    /// first, from where it says, and whether pages lie either side.
    pub fn browse(&self, browse: &Browse) -> Result<Browsed, AuditError> {
        let limit = page_size(if browse.limit == 0 { DEFAULT_PAGE_SIZE } else { browse.limit })?;
        let mut conditions = Conditions::new(
            browse.status,
            browse.since.as_deref(),
            browse.until.as_deref(),
            browse.principal.as_deref(),
        )?;
        if let Some(text) = &browse.code_contains {
            if !self.is_current() {
                return Err(self.needs_migration("searching the code"));
            }
            conditions.code_contains(text)?;
        }
        let (runs, more_older, more_newer) = match browse.from {
            Position::Newest => {
                let (runs, more) = self.page(&conditions, None, true, limit)?;
                (runs, more, false)
            }
            Position::Before(seq) => {
                let (runs, more) = self.page(&conditions, Some(("seq < ?", seq)), true, limit)?;
                let newer = self.exists(&conditions, "seq >= ?", seq)?;
                (runs, more, newer)
            }
            Position::After(seq) => {
                let (mut runs, more) = self.page(&conditions, Some(("seq > ?", seq)), false, limit)?;
                runs.reverse();
                let older = self.exists(&conditions, "seq <= ?", seq)?;
                (runs, older, more)
            }
        };
        let older = more_older.then(|| runs.last().map(|run| run.summary.seq)).flatten();
        let newer = more_newer.then(|| runs.first().map(|run| run.summary.seq)).flatten();
        Ok(Browsed { runs, older, newer })
    }

    /// Up to `limit` runs matching `conditions` and `bound`, newest first
    /// (or oldest first when `!newest_first`), and whether more follow.
    fn page(
        &self,
        conditions: &Conditions,
        bound: Option<(&'static str, u64)>,
        newest_first: bool,
        limit: u32,
    ) -> Result<(Vec<BrowsedRun>, bool), AuditError> {
        let mut values = conditions.values.clone();
        if let Some((_, seq)) = bound {
            values.push(Value::Integer(to_i64(seq)));
        }
        // One more than the page, to know whether another page follows.
        values.push(Value::Integer(i64::from(limit) + 1));
        let order = if newest_first { "DESC" } else { "ASC" };
        // One json_extract with several paths parses the record once; a row
        // whose record is not JSON still lists, without the glance.
        let sql = format!(
            "SELECT seq, run_id, started_at, recorded_at, status, principal,
                    CASE WHEN json_valid(record) THEN json_extract(record, '$.language', '$.code_sha256',
                        '$.exit_code', '$.usage.wall_ms', '$.limits_hit') END,
                    CASE WHEN json_valid(record) THEN substr(json_extract(record, '$.code'), 1, {EXCERPT_CHARS}) END
             FROM runs {} ORDER BY seq {order} LIMIT ?",
            conditions.where_clause(bound.map(|(sql, _)| sql))
        );
        let sqlite = |error| AuditError::sqlite(self.path(), "read", error, BUSY_TIMEOUT);
        let connection = self.lock();
        let mut statement = connection.prepare(&sql).map_err(sqlite)?;
        let mut rows = statement.query(params_from_iter(values)).map_err(sqlite)?;
        let mut runs = Vec::new();
        while let Some(row) = rows.next().map_err(sqlite)? {
            runs.push(self.browsed_run(row)?);
        }
        let more = runs.len() > limit as usize;
        runs.truncate(limit as usize);
        Ok((runs, more))
    }

    /// Whether any run matches `conditions` and `bound` (on `seq`).
    fn exists(&self, conditions: &Conditions, bound: &'static str, seq: u64) -> Result<bool, AuditError> {
        let mut values = conditions.values.clone();
        values.push(Value::Integer(to_i64(seq)));
        let sql = format!("SELECT EXISTS (SELECT 1 FROM runs {})", conditions.where_clause(Some(bound)));
        self.lock()
            .query_row(&sql, params_from_iter(values), |row| row.get(0))
            .map_err(|error| AuditError::sqlite(self.path(), "read", error, BUSY_TIMEOUT))
    }

    fn browsed_run(&self, row: &Row<'_>) -> Result<BrowsedRun, AuditError> {
        type Columns = (i64, String, String, String, String, Option<String>, Option<String>, Option<String>);
        let read = || -> rusqlite::Result<Columns> {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?, row.get(5)?, row.get(6)?, row.get(7)?))
        };
        let (seq, run_id, started_at, recorded_at, status_name, principal, glance, excerpt) =
            read().map_err(|error| AuditError::sqlite(self.path(), "read", error, BUSY_TIMEOUT))?;
        let status = Status::parse(&status_name).ok_or_else(|| AuditError::UnreadableEntry {
            path: self.path().to_owned(),
            seq,
            reason: format!("its status {status_name:?} is not a status"),
        })?;
        type Glance = (Option<Language>, Option<String>, Option<i32>, Option<u64>, Option<Vec<Limit>>);
        let (language, code_sha256, exit_code, wall_ms, limits_hit): Glance =
            glance.and_then(|text| serde_json::from_str(&text).ok()).unwrap_or_default();
        let first_line =
            excerpt.unwrap_or_default().lines().find(|line| !line.trim().is_empty()).unwrap_or_default().to_owned();
        let summary = RunSummary {
            seq: seq.unsigned_abs(),
            run_id,
            started_at,
            recorded_at,
            status,
            principal,
            language,
            code_sha256,
            exit_code,
            wall_ms,
            limits_hit: limits_hit.unwrap_or_default(),
        };
        Ok(BrowsedRun { summary, first_line })
    }
}
