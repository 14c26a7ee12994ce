//! Who holds the server's places: each run running or waiting for a slot
//! holds one, and there are as many as slots plus the queue.
//!
//! Shared first come, first served, one token's burst could take every
//! place and get another token's first run a 429. So each configured token
//! with nothing running or waiting keeps one place in the queue: a caller
//! that already holds places may take another only when the places left
//! outnumber the places kept for tokens that hold none, of which there are
//! at most as many as the queue has (never a slot: a slot kept idle for a
//! token that may never run, an auditor's, would only slow the others). A
//! caller's first run is refused only when every place is taken, which with
//! more tokens than queued places can still happen.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Who asked: a token's name, or none (a stdio MCP server, a library caller).
pub type Principal = Option<String>;

/// The places and who holds them.
#[derive(Debug)]
pub struct Places {
    capacity: usize,
    /// The queue's places: the most that can be kept for idle tokens.
    queue: usize,
    /// The configured tokens' names: each keeps a place while it holds none.
    tokens: Vec<String>,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    by: HashMap<Principal, usize>,
    total: usize,
}

/// Why a caller got no place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Every place is taken.
    Full,
    /// The caller holds `held` places and the rest are kept for tokens that
    /// hold none.
    KeptForOthers { held: usize },
}

/// One place, given back when dropped (the run ended, or its caller left
/// before it got a slot).
#[derive(Debug)]
pub struct Place {
    places: Arc<Places>,
    principal: Principal,
}

impl Places {
    /// `slots` running and `queue` waiting, shared by `tokens`.
    pub fn new(slots: usize, queue: usize, tokens: Vec<String>) -> Arc<Places> {
        Arc::new(Places { capacity: slots + queue, queue, tokens, held: Mutex::new(Held::default()) })
    }

    /// A place for `principal`, or why there is none.
    pub fn take(self: &Arc<Self>, principal: Principal) -> Result<Place, Refusal> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = held.by.get(&principal).copied().unwrap_or(0);
        if held.total >= self.capacity {
            return Err(Refusal::Full);
        }
        if mine > 0 {
            let kept_for_others = self
                .tokens
                .iter()
                .filter(|name| principal.as_deref() != Some(name.as_str()))
                .filter(|name| held.by.get(&Some((*name).clone())).is_none_or(|n| *n == 0))
                .count()
                .min(self.queue);
            if held.total + 1 + kept_for_others > self.capacity {
                return Err(Refusal::KeptForOthers { held: mine });
            }
        }
        held.total += 1;
        *held.by.entry(principal.clone()).or_default() += 1;
        Ok(Place { places: self.clone(), principal })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut held = self.places.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.total = held.total.saturating_sub(1);
        if let Some(mine) = held.by.get_mut(&self.principal) {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                held.by.remove(&self.principal);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(name: &str) -> Principal {
        Some(name.to_owned())
    }

    #[test]
    fn a_burst_leaves_one_place_for_each_token_that_holds_none() {
        let places = Places::new(1, 3, vec!["alice".into(), "bob".into(), "carol".into()]);
        let alice: Vec<Place> = (0..2).map(|_| places.take(who("alice")).unwrap()).collect();
        assert_eq!(places.take(who("alice")).unwrap_err(), Refusal::KeptForOthers { held: 2 });
        let bob = places.take(who("bob")).unwrap();
        let carol = places.take(who("carol")).unwrap();
        assert_eq!(places.take(who("bob")).unwrap_err(), Refusal::Full);
        drop(carol);
        // Carol holds none again: her place is kept from alice and bob.
        assert_eq!(places.take(who("alice")).unwrap_err(), Refusal::KeptForOthers { held: 2 });
        assert!(places.take(who("carol")).is_ok());
        drop((alice, bob));
    }

    #[test]
    fn one_token_alone_has_every_place_and_gets_them_back() {
        let places = Places::new(1, 2, vec!["alice".into()]);
        let taken: Vec<Place> = (0..3).map(|_| places.take(who("alice")).unwrap()).collect();
        assert_eq!(places.take(who("alice")).unwrap_err(), Refusal::Full);
        assert_eq!(places.take(None).unwrap_err(), Refusal::Full);
        drop(taken);
        // Alice, idle now, keeps a place from a caller without a name.
        let unnamed: Vec<Place> = (0..2).map(|_| places.take(None).unwrap()).collect();
        assert_eq!(places.take(None).unwrap_err(), Refusal::KeptForOthers { held: 2 });
        assert!(places.take(who("alice")).is_ok());
        drop(unnamed);
        let no_tokens = Places::new(1, 1, Vec::new());
        let again: Vec<Place> = (0..2).map(|_| no_tokens.take(None).unwrap()).collect();
        assert_eq!(no_tokens.take(None).unwrap_err(), Refusal::Full);
        drop(again);
    }

    #[test]
    fn no_slot_is_kept_idle_for_a_token_that_holds_none() {
        // Two slots, no queue, an auditor that never runs: Alice has both.
        let places = Places::new(2, 0, vec!["alice".into(), "auditor".into()]);
        let both: Vec<Place> = (0..2).map(|_| places.take(who("alice")).unwrap()).collect();
        assert_eq!(places.take(who("auditor")).unwrap_err(), Refusal::Full);
        drop(both);
        // One queued place: kept for the auditor, not for a third of Alice's.
        let places = Places::new(2, 1, vec!["alice".into(), "auditor".into()]);
        let both: Vec<Place> = (0..2).map(|_| places.take(who("alice")).unwrap()).collect();
        assert_eq!(places.take(who("alice")).unwrap_err(), Refusal::KeptForOthers { held: 2 });
        assert!(places.take(who("auditor")).is_ok());
        drop(both);
    }
}
