//! Who is looking: the API's bearer tokens, exchanged on the login form for
//! a session cookie, and the CSRF tokens that guard every form.
//!
//! The session cookie is HttpOnly (no script reads it), SameSite=Strict (no
//! other site's page sends it), scoped to `/ui`, and Secure when the console
//! is reached over TLS. It carries 32 random bytes; the server keeps only
//! their SHA-256, with the viewer, the session's CSRF token and its expiry.
//! The token itself is checked once, at login, and kept nowhere.
//!
//! Every form carries a CSRF token that must match the session's (the login
//! form, before there is a session, one that must match a cookie it set),
//! and a POST whose browser says it came from another site is refused
//! whatever it carries.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue, header};
use sha2::Digest;

/// Who is looking, and what they may read: the API's rule, exactly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Viewer {
    /// The token's name: the principal its runs are recorded under.
    pub name: String,
    /// May read every run, not only its own.
    pub see_all_runs: bool,
}

impl Viewer {
    /// Whether this viewer may see a run recorded under `principal`.
    pub fn may_see(&self, principal: Option<&str>) -> bool {
        self.see_all_runs || principal == Some(self.name.as_str())
    }
}

/// Turns a presented token into its viewer, or `None`.
pub type Authenticate = std::sync::Arc<dyn Fn(&str) -> Option<Viewer> + Send + Sync>;

pub const SESSION_COOKIE: &str = "airlock_session";
pub const LOGIN_COOKIE: &str = "airlock_login";
/// How long a login lasts.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(8 * 3600);
/// Sessions kept at most; past it the one closest to expiry goes.
const MAX_SESSIONS: usize = 10_000;
/// Sessions one viewer keeps at most (browsers, machines); past it their own
/// session closest to expiry goes, so that one token signing in over and
/// over never ends anyone else's session.
pub const MAX_SESSIONS_PER_VIEWER: usize = 16;

/// A logged-in viewer and the CSRF token of their forms.
#[derive(Clone, Debug)]
pub struct Session {
    pub viewer: Viewer,
    pub csrf: String,
    expires: Instant,
}

/// The live sessions, by the SHA-256 of their cookie.
#[derive(Debug, Default)]
pub struct Sessions {
    live: Mutex<HashMap<[u8; 32], Session>>,
}

impl Sessions {
    /// A new session for `viewer`; returns the cookie value.
    pub fn start(&self, viewer: Viewer) -> std::io::Result<String> {
        let cookie = random_token()?;
        let session = Session { viewer, csrf: random_token()?, expires: Instant::now() + SESSION_LIFETIME };
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        live.retain(|_, session| session.expires > now);
        let theirs = live.iter().filter(|(_, old)| old.viewer.name == session.viewer.name);
        if theirs.clone().count() >= MAX_SESSIONS_PER_VIEWER {
            let oldest = theirs.min_by_key(|(_, old)| old.expires).map(|(key, _)| *key);
            if let Some(key) = oldest {
                live.remove(&key);
            }
        }
        if live.len() >= MAX_SESSIONS {
            let oldest = live.iter().min_by_key(|(_, session)| session.expires).map(|(key, _)| *key);
            if let Some(key) = oldest {
                live.remove(&key);
            }
        }
        live.insert(digest(&cookie), session);
        Ok(cookie)
    }

    /// The session the request's cookie names, if it is live.
    pub fn find(&self, headers: &HeaderMap) -> Option<Session> {
        let cookie = cookie(headers, SESSION_COOKIE)?;
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        live.get(&digest(&cookie)).filter(|session| session.expires > Instant::now()).cloned()
    }

    /// Ends the session the request's cookie names.
    pub fn end(&self, headers: &HeaderMap) {
        if let Some(cookie) = cookie(headers, SESSION_COOKIE) {
            self.live.lock().unwrap_or_else(PoisonError::into_inner).remove(&digest(&cookie));
        }
    }
}

/// 32 random bytes, hex.
pub fn random_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes)
        .map_err(|error| std::io::Error::other(format!("the system's random number source failed: {error}")))?;
    Ok(hex::encode(bytes))
}

fn digest(text: &str) -> [u8; 32] {
    sha2::Sha256::digest(text.as_bytes()).into()
}

/// Whether two secrets are equal, in time that does not depend on where
/// they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    digest(a) == digest(b) && a.len() == b.len()
}

/// The value of cookie `name` in the request, if sent once.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    let mut found = None;
    for value in headers.get_all(header::COOKIE) {
        let Ok(text) = value.to_str() else { continue };
        for pair in text.split(';') {
            let Some((key, value)) = pair.trim().split_once('=') else { continue };
            if key != name {
                continue;
            }
            if found.is_some() {
                // Two cookies of one name: one was planted; trust neither.
                return None;
            }
            found = Some(value.to_owned());
        }
    }
    found
}

/// A `Set-Cookie` for the console: HttpOnly, SameSite=Strict, path `/ui`,
/// Secure over TLS. `None` as the value removes the cookie.
pub fn set_cookie(name: &str, value: Option<&str>, max_age: Duration, secure: bool) -> HeaderValue {
    let (value, max_age) = match value {
        Some(value) => (value, max_age.as_secs()),
        None => ("", 0),
    };
    let secure = if secure { "; Secure" } else { "" };
    let text = format!("{name}={value}; Path=/ui; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}");
    // Names are ours and values hex: always a valid header value.
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("invalid=; Max-Age=0"))
}

/// Whether the browser says this request came from another site: by Fetch
/// Metadata alone when the browser sends it (a proxy that rewrites `Host`
/// would make a same-origin `Origin` look foreign), else by an Origin that
/// is not this host. Browsers that send neither are judged by the CSRF
/// token alone.
pub fn cross_site(headers: &HeaderMap) -> bool {
    if let Some(fetch_site) = headers.get("sec-fetch-site") {
        return !matches!(fetch_site.to_str(), Ok("same-origin" | "none"));
    }
    let origin = headers.get(header::ORIGIN).and_then(|value| value.to_str().ok());
    let host = headers.get(header::HOST).and_then(|value| value.to_str().ok());
    match (origin, host) {
        (Some("null"), _) => true,
        (Some(origin), Some(host)) => {
            let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest);
            origin_host != host
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn a_cookie_is_read_only_when_sent_once() {
        assert_eq!(cookie(&headers(&[("cookie", "a=1; airlock_session=xyz")]), SESSION_COOKIE).as_deref(), Some("xyz"));
        assert_eq!(
            cookie(&headers(&[("cookie", "airlock_session=x"), ("cookie", "airlock_session=y")]), SESSION_COOKIE),
            None
        );
        assert_eq!(cookie(&headers(&[("cookie", "xairlock_session=x")]), SESSION_COOKIE), None);
    }

    #[test]
    fn sessions_live_until_ended() {
        let sessions = Sessions::default();
        let viewer = Viewer { name: "alice".into(), see_all_runs: false };
        let value = sessions.start(viewer.clone()).unwrap();
        let request = headers(&[("cookie", &format!("{SESSION_COOKIE}={value}"))]);
        assert_eq!(sessions.find(&request).map(|session| session.viewer), Some(viewer));
        assert!(sessions.find(&headers(&[("cookie", &format!("{SESSION_COOKIE}={value}0"))])).is_none());
        sessions.end(&request);
        assert!(sessions.find(&request).is_none());
    }

    #[test]
    fn one_viewer_signing_in_over_and_over_ends_only_their_own_sessions() {
        let sessions = Sessions::default();
        let cookie = |value: &str| headers(&[("cookie", &format!("{SESSION_COOKIE}={value}"))]);
        let bob = sessions.start(Viewer { name: "bob".into(), see_all_runs: false }).unwrap();
        let alice = |_| sessions.start(Viewer { name: "alice".into(), see_all_runs: false }).unwrap();
        let first = alice(0);
        let rest: Vec<String> = (1..MAX_SESSIONS_PER_VIEWER * 2).map(alice).collect();
        assert!(sessions.find(&cookie(&bob)).is_some(), "bob's session outlives alice's many");
        assert!(sessions.find(&cookie(&first)).is_none(), "alice's oldest went");
        assert!(sessions.find(&cookie(rest.last().unwrap())).is_some());
        let live = sessions.live.lock().unwrap();
        assert_eq!(live.values().filter(|session| session.viewer.name == "alice").count(), MAX_SESSIONS_PER_VIEWER);
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_secure_over_tls() {
        let plain = set_cookie(SESSION_COOKIE, Some("ab"), SESSION_LIFETIME, false);
        assert_eq!(plain.to_str().unwrap(), "airlock_session=ab; Path=/ui; Max-Age=28800; HttpOnly; SameSite=Strict");
        assert!(set_cookie(SESSION_COOKIE, Some("ab"), SESSION_LIFETIME, true).to_str().unwrap().ends_with("; Secure"));
    }

    #[test]
    fn requests_from_other_sites_are_told_apart() {
        assert!(cross_site(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(!cross_site(&headers(&[("sec-fetch-site", "same-origin")])));
        assert!(cross_site(&headers(&[("origin", "http://evil.example"), ("host", "127.0.0.1:8750")])));
        assert!(!cross_site(&headers(&[("origin", "http://127.0.0.1:8750"), ("host", "127.0.0.1:8750")])));
        assert!(cross_site(&headers(&[("origin", "null")])));
        // Behind a proxy that rewrites Host, the browser's word decides.
        let proxied =
            [("sec-fetch-site", "same-origin"), ("origin", "https://console.example"), ("host", "10.0.0.5:8750")];
        assert!(!cross_site(&headers(&proxied)));
        assert!(cross_site(&headers(&[("sec-fetch-site", "same-site"), ("origin", "http://a"), ("host", "a")])));
        assert!(cross_site(&headers(&[("sec-fetch-site", "bogus")])));
        assert!(!cross_site(&headers(&[])));
        assert!(same_secret("abc", "abc") && !same_secret("abc", "abd"));
    }
}
