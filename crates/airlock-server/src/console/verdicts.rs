//! The chain verifications made from the console: a list kept in order,
//! each naming who verified, when, and against which anchor.
//!
//! Only a viewer who may see every run verifies (the walk reads every
//! entry); every viewer reads the list. A break once found stays shown:
//! a later check, anchored or not, does not hide it, because a chain
//! rewritten from some entry on is consistent again and only the earlier
//! verdict (or an anchor) tells. A verdict younger than [`REUSE_WITHIN`]
//! for the same anchor answers a new request instead of another walk.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use airlock::audit::{ChainHead, VerifyReport};

/// A request to verify within this long of a verdict for the same anchor
/// gets that verdict: a burst of clicks walks the chain once.
pub const REUSE_WITHIN: Duration = Duration::from_secs(5);

/// Verdicts kept at most. Past it the oldest intact verdict goes (a break
/// is kept while any intact one is left to drop): one walk per
/// [`REUSE_WITHIN`] per anchor fills this in hours, not minutes.
const MAX_VERDICTS: usize = 1_000;

/// One verification and who made it.
#[derive(Clone, Debug)]
pub struct Verdict {
    /// The name of the viewer who asked.
    pub by: String,
    /// When (RFC 3339, UTC).
    pub at: String,
    /// The anchor it was checked against, if one was given.
    pub anchor: Option<ChainHead>,
    pub report: VerifyReport,
    made: Instant,
}

impl Verdict {
    pub fn new(by: &str, anchor: Option<ChainHead>, report: VerifyReport) -> Verdict {
        Verdict { by: by.to_owned(), at: airlock_core::record::now_rfc3339(), anchor, report, made: Instant::now() }
    }

    pub fn is_broken(&self) -> bool {
        !self.report.is_intact()
    }
}

/// The verdicts, oldest first.
#[derive(Debug, Default)]
pub struct Verdicts {
    list: Mutex<Vec<Verdict>>,
}

impl Verdicts {
    /// Adds `verdict` at the end.
    pub fn record(&self, verdict: Verdict) {
        let mut list = self.lock();
        if list.len() >= MAX_VERDICTS {
            let drop_at = list.iter().position(|old| !old.is_broken()).unwrap_or(0);
            list.remove(drop_at);
        }
        list.push(verdict);
    }

    /// The verdict for `anchor` made less than [`REUSE_WITHIN`] ago, if any.
    pub fn fresh(&self, anchor: Option<&ChainHead>) -> Option<Verdict> {
        let list = self.lock();
        list.iter().rev().find(|old| old.made.elapsed() < REUSE_WITHIN && old.anchor.as_ref() == anchor).cloned()
    }

    /// Every verdict, newest first.
    pub fn newest_first(&self) -> Vec<Verdict> {
        self.lock().iter().rev().cloned().collect()
    }

    /// What the chain's state is, as the console shows it: the latest
    /// verdict that found a break, else the latest verdict.
    pub fn standing(&self) -> Option<Verdict> {
        let list = self.lock();
        list.iter().rev().find(|verdict| verdict.is_broken()).or_else(|| list.last()).cloned()
    }

    /// The anchor `viewer` gave last, to offer back to them (never another's).
    pub fn last_anchor_of(&self, viewer: &str) -> Option<ChainHead> {
        self.lock().iter().rev().filter(|verdict| verdict.by == viewer).find_map(|verdict| verdict.anchor.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Verdict>> {
        self.list.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock::audit::{ChainBreak, Problem};

    fn report(broken: bool) -> VerifyReport {
        VerifyReport {
            entries_checked: 1,
            last_good: None,
            first_break: broken.then_some(ChainBreak { seq: 2, run_id: None, problem: Problem::HeadMissing }),
        }
    }

    #[test]
    fn a_break_outlives_later_checks_and_the_cap() {
        let verdicts = Verdicts::default();
        let anchor = ChainHead { seq: 1, entry_hash: "a".repeat(64) };
        verdicts.record(Verdict::new("auditor", Some(anchor.clone()), report(true)));
        for _ in 0..MAX_VERDICTS + 5 {
            verdicts.record(Verdict::new("other", None, report(false)));
        }
        let standing = verdicts.standing().unwrap();
        assert!(standing.is_broken() && standing.by == "auditor" && standing.anchor == Some(anchor.clone()));
        assert_eq!(verdicts.newest_first().len(), MAX_VERDICTS);
        assert_eq!(verdicts.last_anchor_of("auditor"), Some(anchor.clone()));
        assert_eq!(verdicts.last_anchor_of("other"), None);
        assert!(verdicts.fresh(None).is_some() && verdicts.fresh(Some(&anchor)).is_some());
        assert!(verdicts.fresh(Some(&ChainHead { seq: 2, entry_hash: "b".repeat(64) })).is_none());
    }
}
