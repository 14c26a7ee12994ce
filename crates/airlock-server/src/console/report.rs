//! One run as one self-contained HTML file: what was run, under which
//! policy, with which inputs, and what came out, figures embedded, readable
//! offline. `airlock audit show ID --html`, and the download link on a
//! run's page.
//!
//! The file carries its own Content-Security-Policy (a `<meta>` tag): no
//! script, no request anywhere, images only from the `data:` URLs inside
//! it, and only its own stylesheet, pinned by hash. So a report opened from
//! a mail attachment is as inert as the console's pages.

use airlock::audit::{AuditError, AuditStore, StoredRun};
use askama::Template;
use base64::Engine as _;
use sha2::Digest;

use super::pages::STYLESHEET;
use super::view::{Contents, RunView, Source};

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Audit(#[from] AuditError),
    #[error("the report could not be rendered: {0}")]
    Render(#[from] askama::Error),
}

#[derive(Template)]
#[template(path = "console/report.html")]
struct ReportPage {
    csp: String,
    version: &'static str,
    css: &'static str,
    made_at: String,
    run: RunView,
}

/// The report's policy: its own stylesheet (by hash) and its own images.
/// (Served by the console, the answer adds `frame-ancestors`, which a
/// `<meta>` policy cannot carry.)
pub(super) fn policy() -> String {
    let hash = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(STYLESHEET.as_bytes()));
    format!("default-src 'none'; img-src data:; style-src 'sha256-{hash}'; base-uri 'none'; form-action 'none'")
}

/// Contents as a report embeds them: figures as `data:` URLs, small text
/// artefacts as text; nothing is fetched.
struct Embedded<'a> {
    store: &'a AuditStore,
}

impl Contents for Embedded<'_> {
    fn figure(&self, _index: usize, sha256: &str) -> Source {
        match self.store.content(sha256) {
            Ok(Some(png)) if png.starts_with(b"\x89PNG\r\n\x1a\n") => {
                Source::Url(format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(&png)))
            }
            Ok(Some(_)) => Source::Missing("the recorded figure is not a PNG, so it is not shown".to_owned()),
            Ok(None) => Source::Missing("not kept in the store".to_owned()),
            Err(error) => Source::Missing(unreadable(&error)),
        }
    }

    fn artifact(&self, _index: usize, sha256: &str) -> Source {
        match self.store.has_content(sha256) {
            Ok(true) => Source::Missing("kept in the store, not embedded here; its sha256 names it".to_owned()),
            Ok(false) => Source::Missing("not kept in the store".to_owned()),
            Err(error) => Source::Missing(unreadable(&error)),
        }
    }

    fn text(&self, sha256: &str) -> Option<String> {
        String::from_utf8(self.store.content(sha256).ok()??).ok()
    }
}

/// What a report says of a content it could not read: ALTERED, or that the
/// store failed (the detail logged, never the server's paths in the file).
fn unreadable(error: &AuditError) -> String {
    if let AuditError::ContentAltered { .. } = error {
        return super::pages::ALTERED.to_owned();
    }
    eprintln!("airlock: report: {error}");
    "could not be read from the store".to_owned()
}

/// The report of `run`, its contents read from `store`.
pub fn report(run: &StoredRun, store: &AuditStore) -> Result<String, ReportError> {
    let neighbours = store.neighbours(run.entry.seq)?;
    let mut view = RunView::new(run, Some(&neighbours), &Embedded { store });
    // The page's small texts: they show only when kept and UTF-8.
    for artifact in &mut view.artifacts {
        if artifact.text.is_some() {
            artifact.source = Source::Missing("embedded below".to_owned());
        }
    }
    let page = ReportPage {
        csp: policy(),
        version: env!("CARGO_PKG_VERSION"),
        css: STYLESHEET,
        made_at: airlock_core::record::now_rfc3339(),
        run: view,
    };
    Ok(page.render()?)
}
