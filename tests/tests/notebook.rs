//! The Python driver behaves as a notebook cell does, on real sandboxes:
//! errors point at the user's own line, the last expression is found by a
//! notebook's rules, `display()` and rich results come back in order.
//! (Issue 14, items 1 and 4.)

// A test: a failure to set up or a surprise is a failed test, said plainly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use airlock::{Policy, ResultKind, RunRecord, Sandbox};
use airlock_tests::{data_image, linux, python};

/// Runs `code` with the python-data image (pandas, matplotlib).
fn with_data(code: &str) -> RunRecord {
    Sandbox::with_backend(linux(), Policy::default(), data_image()).expect("a sandbox").run(code)
}

#[test]
fn the_error_points_at_the_users_own_line_not_the_library_frame() {
    // json.loads raises deep in the json module (line 353 of its decoder).
    let record = python(Policy::default(), "import json\n\njson.loads('{bad')\n");
    let error = record.error.expect("an error");
    assert_eq!((error.kind.as_str(), error.line), ("JSONDecodeError", Some(3)), "{}", error.traceback);
    assert!(error.traceback.contains("decoder.py"), "the library frame stays in the traceback: {}", error.traceback);

    // A KeyError raised inside pandas, on line 3 of a cell.
    let record = with_data("import pandas as pd\ndf = pd.DataFrame({'a': [1]})\ndf['missing']\n");
    let error = record.error.expect("an error");
    assert_eq!((error.kind.as_str(), error.line), ("KeyError", Some(3)), "{}", error.traceback);
    assert!(error.traceback.contains("pandas"), "{}", error.traceback);

    // The user's own function: its line, the deepest of the user's frames.
    let record = python(Policy::default(), "def f(d):\n    return d['k']\n\nf({})\n");
    assert_eq!(record.error.unwrap().line, Some(2));

    // A SyntaxError raised by a library on a string: the user's call, not the string's line.
    let record = python(Policy::default(), "x = 1\nimport ast\nast.parse('\\n\\n(')\n");
    let error = record.error.unwrap();
    assert_eq!((error.kind.as_str(), error.line, error.column), ("SyntaxError", Some(3), None));

    // The code's own SyntaxError: the parser's line and column.
    let record = python(Policy::default(), "x = 1\ny = (2 +\n");
    let error = record.error.unwrap();
    assert_eq!((error.kind.as_str(), error.line), ("SyntaxError", Some(2)));
    assert!(error.column.is_some());
}

#[test]
fn the_last_value_on_a_shared_line_is_kept_as_a_notebook_keeps_it() {
    let value = |code: &str| python(Policy::default(), code).value;
    assert_eq!(value("x=1; x+1").as_deref(), Some("2"));
    assert_eq!(value("import math\nx = 2; y = 3; math.pow(x, y)").as_deref(), Some("8.0"));
    assert_eq!(value("x = 1; x + 1  # a comment; with a semicolon").as_deref(), Some("2"));
    assert_eq!(value("x = [1,\n 2]; len(x)").as_deref(), Some("2"));
    // A notebook shows nothing when a `;` ends the cell, or its last statement is not an expression.
    assert_eq!(value("x=1; x+1;"), None);
    assert_eq!(value("x = 1\nx + 1;"), None);
    assert_eq!(value("x = 1; y = 2"), None);
    assert_eq!(value("print('a;b')"), None);
    // The fast path is unchanged.
    assert_eq!(value("x = {'a': [1, 2]}\nx").as_deref(), Some("{'a': [1, 2]}"));
}

#[test]
fn display_and_rich_results_come_back_in_order_each_capped() {
    let code = "import pandas as pd\nimport matplotlib.pyplot as plt\n\
        df = pd.DataFrame({'a': [1, 2], 'b': [3, 4]})\n\
        display('first', df)\n\
        fig = plt.figure(figsize=(2, 1)); plt.plot([1, 2])\n\
        display(fig)\n\
        class Big:\n    def _repr_html_(self): return '<p>' + 'x' * 100000 + '</p>'\n\
        display(Big())\n\
        df.sum()\n";
    let record = with_data(code);
    assert!(record.ok(), "{:?}\n{}", record.error, record.stderr);
    let results = &record.results;
    assert_eq!(results.len(), 5, "{results:#?}");
    assert_eq!(results[0].text(), "'first'");
    assert!(results[1].data["text/html"].contains("<table"), "a DataFrame comes with its HTML");
    assert!(results[1].text().contains('a'), "and its text");
    let png = &results[2].data["image/png"];
    use base64::Engine;
    let png = base64::engine::general_purpose::STANDARD.decode(png).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(record.figures.is_empty(), "a displayed figure is not listed again among the figures");
    assert!(!results[3].data.contains_key("text/html"), "HTML past the cap is left out, not cut");
    assert!(record.message.as_deref().unwrap_or_default().contains("text/html"), "{:?}", record.message);
    assert_eq!(results[4].kind, ResultKind::Value);
    assert_eq!(results.iter().filter(|r| r.kind == ResultKind::Value).count(), 1);
    assert!(record.value.as_deref().unwrap().contains("a    3"), "{:?}", record.value);
    // The report names the displays and what else they carry.
    let report = airlock::report::render(&record);
    assert!(report.contains("── display") && report.contains("[also as text/html]"), "{report}");
    // The audit store keeps text, not images.
    assert!(!record.without_contents().results[2].data.contains_key("image/png"));
}

#[test]
fn display_needs_no_import_and_a_broken_repr_is_reported_not_fatal() {
    let code = "class Bad:\n    def _repr_html_(self): raise ValueError('no')\n    def __repr__(self): return 'Bad()'\n\
                display(Bad())\ndisplay({'text/markdown': '**hi**'}, raw=True)\nprint('after')";
    let record = python(Policy::default(), code);
    assert!(record.ok(), "{:?}", record.error);
    assert_eq!(record.stdout, "after\n");
    assert_eq!(record.results[0].text(), "Bad()");
    assert_eq!(record.results[1].data["text/markdown"], "**hi**");
    assert!(record.message.unwrap_or_default().contains("_repr_html_"));
}
