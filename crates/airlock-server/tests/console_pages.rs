//! What the console's pages and contents answer, over real HTTP: caching,
//! altered and skipped contents, store errors, the `audit ui` fallback.

// A test: a failure to set up or a surprise is a failed test, said plainly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use airlock::audit::{AuditStore, ContentsPolicy, KeepContents};
use base64::Engine as _;
use common::{Console, record};
use reqwest::StatusCode;

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n-a-png-by-its-signature";

/// Run `id` of alice's, with `png` as its figure, inline.
fn with_figure(id: &str, png: &[u8]) -> airlock::RunRecord {
    let mut run = record(1);
    run.id = id.to_owned();
    run.figures = vec![airlock::FigureRecord {
        name: "figure-1.png".to_owned(),
        width: 1,
        height: 1,
        bytes: png.len() as u64,
        sha256: airlock_core::sha256_hex(png),
        saved_to: None,
        png_base64: Some(base64::engine::general_purpose::STANDARD.encode(png)),
    }];
    run
}

fn console_with(policy: ContentsPolicy, runs: &[airlock::RunRecord]) -> Console {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("audit.sqlite3");
    let store = AuditStore::open(&db).unwrap().with_contents(policy);
    for run in runs {
        store.append(run, Some("alice")).unwrap();
    }
    Console::serve(dir, db, Arc::new(store))
}

#[test]
fn figures_are_not_cached_and_an_altered_one_says_altered() {
    let console = console_with(ContentsPolicy::default(), &[with_figure("fig", PNG)]);
    let alice = console.sign_in("alice");
    let figure = console.get(&alice, "/ui/runs/fig/figures/0");
    assert_eq!(figure.status(), StatusCode::OK);
    assert_eq!(figure.headers()["cache-control"], "no-store", "a run's figure is kept by no cache");

    // Someone with the file rewrites the kept bytes.
    let raw = rusqlite::Connection::open(&console.db).unwrap();
    raw.execute("UPDATE contents SET bytes = ?1", [b"\x89PNG\r\n\x1a\n-swapped".to_vec()]).unwrap();
    drop(raw);
    let page = console.get(&alice, "/ui/runs/fig").text().unwrap();
    assert!(page.contains("ALTERED"), "the page says so: {page}");
    assert!(!page.contains("/ui/runs/fig/figures/0"), "no broken image pointing at it: {page}");
    let served = console.get(&alice, "/ui/runs/fig/figures/0");
    assert_eq!(served.status(), StatusCode::CONFLICT);
    let text = served.text().unwrap();
    assert!(text.contains("ALTERED") && !text.contains(&console.dir.path().display().to_string()), "{text}");
}

#[test]
fn a_skipped_content_says_why() {
    let policy = ContentsPolicy { keep: KeepContents::Off, ..ContentsPolicy::default() };
    let console = console_with(policy, &[with_figure("off", PNG)]);
    let alice = console.sign_in("alice");
    let page = console.get(&alice, "/ui/runs/off").text().unwrap();
    assert!(page.contains("not kept: the store keeps no contents"), "{page}");
}

#[test]
fn store_errors_name_no_server_path() {
    let console = Console::start(1);
    let alice = console.sign_in("alice");
    assert_eq!(console.get(&alice, "/ui/runs/run-1").status(), StatusCode::OK);
    let raw = rusqlite::Connection::open(&console.db).unwrap();
    raw.execute_batch("ALTER TABLE runs RENAME TO runs_gone").unwrap();
    drop(raw);
    let folder = console.dir.path().display().to_string();
    for path in ["/ui/runs/run-1", "/ui/runs", "/ui/runs/run-1/report.html", "/ui/runs/run-1/figures/0"] {
        let answer = console.get(&alice, path);
        assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR, "{path}");
        let text = answer.text().unwrap();
        assert!(!text.contains(&folder) && !text.contains("sqlite"), "{path}: {text}");
        assert!(text.contains("could not be read"), "{path}: {text}");
    }
}

#[test]
fn the_audit_ui_fallback_is_hardened_too() {
    let console = Console::start(0);
    let answer = common::client().get(console.url("/anything/else")).send().unwrap();
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    assert_eq!(answer.headers()["location"], "/ui/runs");
    assert_eq!(answer.headers()["x-frame-options"], "DENY");
    assert_eq!(answer.headers()["x-content-type-options"], "nosniff");
    assert!(answer.headers()["content-security-policy"].to_str().unwrap().contains("frame-ancestors 'none'"));
}

#[test]
fn another_principals_run_and_a_missing_one_answer_alike() {
    let console = Console::start(2);
    let alice = console.sign_in("alice");
    let theirs = console.get(&alice, "/ui/runs/run-2");
    let missing = console.get(&alice, "/ui/runs/run-9");
    assert_eq!((theirs.status(), missing.status()), (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND));
    let (theirs, missing) = (theirs.text().unwrap(), missing.text().unwrap());
    assert_eq!(theirs.replace("run-2", "ID"), missing.replace("run-9", "ID"), "the same page, word for word");
}
