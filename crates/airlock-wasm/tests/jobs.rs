//! Real jobs on the wasm backend: pandas on a CSV, a matplotlib figure.

// Helpers panic on a failed setup, as the tests themselves do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use airlock_policy::{SandboxPath, Status};
use common::*;

/// 4,000 rows of `value,weight` from a fixed-seed generator: values in
/// hundredths, weights whole, so the expected answer is exact.
pub fn weighted_median_csv() -> (String, Vec<(u64, u64)>) {
    let mut state: u64 = 0x5eed_2026;
    let mut next = move || {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut csv = String::from("value,weight\n");
    let mut rows = Vec::new();
    for _ in 0..4000 {
        let cents = next() % 100_000;
        let weight = next() % 100 + 1;
        csv.push_str(&format!("{}.{:02},{weight}\n", cents / 100, cents % 100));
        rows.push((cents, weight));
    }
    (csv, rows)
}

/// The smallest value whose cumulative weight (values sorted) reaches half the total.
fn expected_weighted_median(rows: &[(u64, u64)]) -> f64 {
    let mut sorted = rows.to_vec();
    sorted.sort_by_key(|&(cents, _)| cents);
    let total: u64 = sorted.iter().map(|&(_, w)| w).sum();
    let mut cumulative = 0;
    for (cents, weight) in sorted {
        cumulative += weight;
        if cumulative * 2 >= total {
            return format!("{}.{:02}", cents / 100, cents % 100).parse().unwrap();
        }
    }
    unreachable!("the weights are positive")
}

pub const WEIGHTED_MEDIAN: &str = r#"import pandas as pd
df = pd.read_csv("data.csv").sort_values("value", kind="stable")
cumulative = df["weight"].cumsum()
float(df.loc[cumulative * 2 >= df["weight"].sum(), "value"].iloc[0])
"#;

#[test]
fn the_weighted_median_is_exact() {
    let (csv, rows) = weighted_median_csv();
    let mut instance = sandbox(&policy(60));
    instance.write(&SandboxPath::parse("/work/data.csv").unwrap(), csv.as_bytes()).unwrap();
    let e = run_in(&mut instance, WEIGHTED_MEDIAN);
    assert_eq!(e.status, Status::Ok, "{}", stderr(&e));
    let got: f64 = value(&e).parse().unwrap_or_else(|_| panic!("a float, got {:?}", value(&e)));
    assert_eq!(got, expected_weighted_median(&rows));
}

#[test]
fn a_figure_comes_back_as_a_png_of_the_right_size() {
    let code = r#"import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(4, 3), dpi=100)
ax.plot([1, 2, 3], [3, 1, 2])
ax.set_title("wasm")
plt.show()
"#;
    let e = run(&policy(60), code);
    assert_eq!(e.status, Status::Ok, "{}", stderr(&e));
    let report = e.report.expect("a report");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.figures.len(), 1);
    let figure = &report.figures[0];
    assert_eq!((figure.width, figure.height), (400, 300));
    assert!(figure.png.starts_with(b"\x89PNG\r\n\x1a\n"));
    assert!(figure.png.ends_with(&[0xae, 0x42, 0x60, 0x82]), "the PNG ends with its IEND chunk");
}
