//! The readable report of a run: the code, with line numbers, above what it
//! did. The `airlock run` command prints it; the MCP tool returns it.

use std::fmt::Write;

use airlock_policy::{DisplayResult, ResultKind, RunRecord};

fn section(out: &mut String, title: &str) {
    let _ = writeln!(out, "── {title} {}", "─".repeat(60usize.saturating_sub(title.len())));
}

/// One output stream, when it has anything to show.
fn stream(out: &mut String, name: &str, text: &str, truncated: bool) {
    if text.is_empty() && !truncated {
        return;
    }
    section(out, name);
    out.push_str(text);
    if !text.ends_with('\n') {
        out.push('\n');
    }
    if truncated {
        let _ = writeln!(out, "[… {name} truncated at the output limit]");
    }
}

/// The other representations of a rich result, named, for a reader of text.
fn also_shown_as(out: &mut String, result: &DisplayResult) {
    let others: Vec<&str> = result.data.keys().map(String::as_str).filter(|mime| *mime != "text/plain").collect();
    if !others.is_empty() {
        let _ = writeln!(out, "[also as {}]", others.join(", "));
    }
}

/// The report: code, output, value or error, figures, artefacts, then a
/// status line with the limit that stopped the run and what it used. Nearly
/// all of it came from the sandbox, so it is escaped as a whole: nothing in
/// it can drive the terminal that shows it.
pub fn render(record: &RunRecord) -> String {
    airlock_core::terminal_safe(&render_raw(record))
}

fn render_raw(record: &RunRecord) -> String {
    let mut out = String::new();
    section(&mut out, &format!("code ({})", record.language));
    let lines: Vec<&str> = record.code.lines().collect();
    let width = lines.len().max(1).to_string().len();
    for (i, line) in lines.iter().enumerate() {
        let _ = writeln!(out, "{:>width$} │ {line}", i + 1);
    }
    stream(&mut out, "stdout", &record.stdout, record.stdout_truncated);
    stream(&mut out, "stderr", &record.stderr, record.stderr_truncated);
    for result in record.results.iter().filter(|r| r.kind == ResultKind::Display) {
        section(&mut out, "display");
        let _ = writeln!(out, "{}", result.text());
        also_shown_as(&mut out, result);
    }
    if let Some(value) = &record.value {
        section(&mut out, "value");
        let _ = writeln!(out, "{value}");
        if let Some(result) = record.results.iter().find(|r| r.kind == ResultKind::Value) {
            also_shown_as(&mut out, result);
        }
    }
    if let Some(error) = &record.error {
        section(&mut out, "error");
        let at = match (error.line, error.column) {
            (Some(l), Some(c)) => format!(" (line {l}, column {c})"),
            (Some(l), None) => format!(" (line {l})"),
            _ => String::new(),
        };
        // The name is the code's to choose (any class name): one line.
        let _ = writeln!(out, "{}: {}{at}", airlock_core::one_line(&error.kind), error.message);
    }
    if !record.figures.is_empty() {
        section(&mut out, "figures");
        for f in &record.figures {
            let place = f.saved_to.as_deref().map_or_else(String::new, |p| format!(" saved to {p}"));
            let _ = writeln!(out, "{} ({}x{}, {} bytes){place}", f.name, f.width, f.height, f.bytes);
        }
    }
    if !record.artifacts.is_empty() {
        section(&mut out, "artifacts");
        for a in &record.artifacts {
            match (&a.error, &a.saved_to) {
                (Some(e), _) => {
                    let _ = writeln!(out, "{}: not copied out: {e}", a.path);
                }
                (None, Some(to)) => {
                    let _ = writeln!(out, "{} → {to} ({} bytes)", a.path, a.bytes.unwrap_or(0));
                }
                (None, None) => {
                    let _ = writeln!(out, "{} ({} bytes)", a.path, a.bytes.unwrap_or(0));
                }
            }
        }
    }
    section(&mut out, "status");
    let mut status = format!("{}", record.status);
    if let Some(limit) = record.stopping_limit() {
        let _ = write!(status, " (stopped by the {limit} limit)");
    }
    if let Some(code) = record.exit_code {
        let _ = write!(status, " · exit {code}");
    }
    if let Some(signal) = record.signal {
        let _ = write!(status, " · signal {signal}");
    }
    let u = &record.usage;
    let _ = write!(status, " · {:.2} s", u.wall_ms as f64 / 1000.0);
    if let Some(cpu) = u.cpu_ms {
        let _ = write!(status, " · CPU {:.2} s", cpu as f64 / 1000.0);
    }
    if let Some(peak) = u.peak_memory_bytes {
        let _ = write!(status, " · peak memory {:.1} MiB", peak as f64 / 1048576.0);
    }
    if let (Some(ms), Some(cached)) = (u.image_ms, u.image_cached) {
        let how = if cached { "cached" } else { "built now" };
        let _ = write!(status, " · image with extra packages {how} in {:.2} s", ms as f64 / 1000.0);
    }
    let _ = writeln!(out, "{status}");
    let others: Vec<&str> =
        record.limits_hit.iter().filter(|l| Some(**l) != record.stopping_limit()).map(|l| l.name()).collect();
    if !others.is_empty() {
        let _ = writeln!(out, "limits reached: {}", others.join(", "));
    }
    if let Some(message) = &record.message {
        let _ = writeln!(out, "{message}");
    }
    out
}
