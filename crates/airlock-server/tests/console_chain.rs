//! The console's chain verification over real HTTP: a real console on a
//! real listener, a real store, signed in through the login form.

// A test: a failure to set up or a surprise is a failed test, said plainly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use common::{Console, chain_page};
use reqwest::StatusCode;

#[test]
fn only_a_viewer_who_sees_every_run_verifies() {
    let console = Console::start(2);
    let alice = console.sign_in("alice");
    let (page, csrf) = chain_page(&console, &alice);
    assert!(!page.contains("action=\"/ui/chain/verify\""), "no verify form for alice");
    assert_eq!(console.verify(&alice, &csrf, ""), StatusCode::FORBIDDEN, "alice may not verify");
    let auditor = console.sign_in("auditor");
    let (page, _) = chain_page(&console, &auditor);
    assert!(page.contains("Not verified from the console"), "alice's refused attempt left no verdict: {page}");
    assert!(page.contains("action=\"/ui/chain/verify\""), "the auditor gets the form");
}

#[test]
fn verdicts_are_listed_by_who_and_an_anchored_break_stays_shown() {
    let console = Console::start(3);
    let auditor = console.sign_in("auditor");
    let (_, csrf) = chain_page(&console, &auditor);
    // An anchor noted by the auditor that the chain no longer matches.
    let wrong = format!("2:{}", "e".repeat(64));
    assert_eq!(console.verify(&auditor, &csrf, &wrong), StatusCode::SEE_OTHER);

    let second = console.sign_in("second-auditor");
    let (page, csrf2) = chain_page(&console, &second);
    assert!(!page.contains(&format!("value=\"{wrong}\"")), "another's anchor is never pre-filled: {page}");
    assert_eq!(console.verify(&second, &csrf2, ""), StatusCode::SEE_OTHER);
    let (page, _) = chain_page(&console, &second);
    let state = common::between(&page, "role=\"status\">", "</p>");
    assert!(state.starts_with("BROKEN at entry 2") && state.contains("by auditor"), "the break stands: {state}");
    assert!(state.contains(&format!("against the anchor {wrong}")), "{state}");
    let listed = common::between(&page, "<tbody>", "</tbody>");
    assert_eq!(listed.matches("<tr>").count(), 2, "both verdicts listed: {listed}");
    let newest = listed.split("<tr>").nth(1).unwrap();
    assert!(
        newest.contains("second-auditor") && newest.contains("none given") && newest.contains("Intact"),
        "{newest}"
    );
    let oldest = listed.split("<tr>").nth(2).unwrap();
    assert!(oldest.contains(">auditor<") && oldest.contains(&wrong) && oldest.contains("BROKEN"), "{oldest}");

    // Their own anchor is offered back to the auditor, and the run page
    // says the chain is broken too.
    let (page, _) = chain_page(&console, &auditor);
    assert!(page.contains(&format!("value=\"{wrong}\"")), "{page}");
    let run = console.get(&auditor, "/ui/runs/run-2").text().unwrap();
    assert!(run.contains("BROKEN: verified at"), "{run}");

    // Asked again at once: the verdict just made answers; no new walk.
    assert_eq!(console.verify(&second, &csrf2, ""), StatusCode::SEE_OTHER);
    let (page, _) = chain_page(&console, &second);
    assert_eq!(common::between(&page, "<tbody>", "</tbody>").matches("<tr>").count(), 2, "reused, not walked again");
}
