//! A stored run as plain text for a terminal: `airlock audit show ID`.

use std::fmt::Write as _;

use airlock_core::terminal_safe as safe;
use airlock_policy::{PolicySpec, RunRecord, Usage};

use crate::store::StoredRun;

/// `run` as text: a header (status, limits, usage, policy, isolation, the
/// entry's place in the chain), then the code with line numbers, then what
/// it printed and returned. Text that came out of the sandbox is shown with
/// control characters escaped, so it cannot drive the terminal showing it.
pub fn render(run: &StoredRun) -> String {
    let record = &run.record;
    let entry = &run.entry;
    let mut out = String::new();
    let by = entry.principal.as_deref().map_or(String::new(), |name| format!(", asked by {}", safe(name)));
    line(
        &mut out,
        "run",
        &format!("{} (entry {}, recorded {}{by})", safe(&entry.run_id), entry.seq, entry.recorded_at),
    );
    line(&mut out, "status", &status_line(record));
    if !record.limits_hit.is_empty() {
        let limits: Vec<&str> = record.limits_hit.iter().map(|limit| limit.name()).collect();
        line(&mut out, "limits hit", &limits.join(", "));
    }
    if let Some(message) = &record.message {
        line(&mut out, "message", &safe(message));
    }
    line(&mut out, "started", &safe(&record.started_at));
    line(&mut out, "usage", &usage_line(&record.usage));
    line(&mut out, "policy", &policy_line(&record.policy));
    let hosts = record.policy.allow_hosts.as_deref().unwrap_or_default();
    let network = if hosts.is_empty() { "none".to_owned() } else { safe(&hosts.join(", ")) };
    line(&mut out, "network", &network);
    let isolation = &record.isolation;
    let mut layers: Vec<&str> = isolation.layers.iter().map(|layer| layer.name()).collect();
    if layers.is_empty() {
        layers.push("no layers recorded");
    }
    let backend = if isolation.backend.is_empty() { "backend unknown".to_owned() } else { safe(&isolation.backend) };
    let mut isolation_text = format!("{backend}: {}", layers.join(", "));
    if !isolation.degraded.is_empty() {
        let degraded: Vec<&str> = isolation.degraded.iter().map(|layer| layer.name()).collect();
        let _ = write!(isolation_text, " (running without: {})", degraded.join(", "));
    }
    line(&mut out, "isolation", &isolation_text);
    if let Some(image) = &record.image {
        line(&mut out, "image", &format!("{} ({})", safe(&image.name), safe(&image.hash)));
    }
    for input in &record.inputs {
        let text = format!("{} ({}, sha256 {})", safe(&input.path), bytes(input.bytes), safe(&input.sha256));
        line(&mut out, "input", &text);
    }
    for artifact in &record.artifacts {
        let text = match (&artifact.error, &artifact.sha256) {
            (Some(error), _) => format!("{} refused: {}", safe(&artifact.path), safe(error)),
            (None, Some(sha256)) => format!(
                "{} ({}, sha256 {})",
                safe(&artifact.path),
                artifact.bytes.map_or("size unknown".to_owned(), bytes),
                safe(sha256)
            ),
            (None, None) => safe(&artifact.path),
        };
        line(&mut out, "artefact", &text);
    }
    for figure in &record.figures {
        let text = format!(
            "{} ({}x{} PNG, {}, sha256 {})",
            safe(&figure.name),
            figure.width,
            figure.height,
            bytes(figure.bytes),
            safe(&figure.sha256)
        );
        line(&mut out, "figure", &text);
    }
    if let Some(network) = &record.network {
        for connection in &network.connections {
            let verdict = match connection.verdict {
                airlock_policy::NetworkVerdict::Allowed => "allowed",
                airlock_policy::NetworkVerdict::Denied => "denied",
            };
            let reason = connection.reason.as_deref().map_or(String::new(), |why| format!(": {}", safe(why)));
            let text = format!(
                "{}:{} {verdict}{reason} ({} out, {} in)",
                safe(&connection.host),
                connection.port,
                bytes(connection.bytes_out),
                bytes(connection.bytes_in)
            );
            line(&mut out, "connection", &text);
        }
    }
    let integrity = if run.hash_matches {
        "matches its content"
    } else {
        "DOES NOT match its content: the entry was edited; run `airlock audit verify`"
    };
    line(&mut out, "entry hash", &format!("{} ({integrity})", entry.entry_hash));
    line(&mut out, "prev hash", &entry.prev_hash);

    let error_line = record.error.as_ref().and_then(|error| error.line);
    section(&mut out, &format!("code ({}, sha256 {})", record.language, safe(&record.code_sha256)));
    numbered_code(&mut out, &record.code, error_line);
    stream(&mut out, "stdout", &record.stdout, record.stdout_truncated, record.stdout_base64.is_some());
    stream(&mut out, "stderr", &record.stderr, record.stderr_truncated, record.stderr_base64.is_some());
    if let Some(value) = &record.value {
        section(&mut out, "value");
        block(&mut out, value);
    }
    if let Some(error) = &record.error {
        let at = error.line.map_or(String::new(), |line| format!(" at line {line}"));
        section(&mut out, &format!("error: {}{at}", safe(&error.kind)));
        block(&mut out, &error.message);
        if !error.traceback.is_empty() {
            block(&mut out, &error.traceback);
        }
    }
    out
}

fn status_line(record: &RunRecord) -> String {
    let mut text = record.status.name().to_owned();
    match (record.exit_code, record.signal) {
        (Some(code), _) => {
            let _ = write!(text, " (exit code {code})");
        }
        (None, Some(signal)) => {
            let _ = write!(text, " (killed by signal {signal})");
        }
        (None, None) => {}
    }
    text
}

fn usage_line(usage: &Usage) -> String {
    let mut parts = vec![format!("wall {}", seconds(usage.wall_ms))];
    if let Some(cpu_ms) = usage.cpu_ms {
        parts.push(format!("cpu {}", seconds(cpu_ms)));
    }
    if let Some(peak) = usage.peak_memory_bytes {
        parts.push(format!("peak memory {}", bytes(peak)));
    }
    parts.join(", ")
}

fn policy_line(policy: &PolicySpec) -> String {
    let parts: Vec<String> = policy_fields(policy).into_iter().map(|(name, value)| format!("{name} {value}")).collect();
    parts.join(", ")
}

/// The policy's settings that the record names, as (what, value) in words,
/// values that came from the request made terminal-safe: for every view of
/// a run (the terminal's, the console's, the HTML report's).
pub fn policy_fields(policy: &PolicySpec) -> Vec<(&'static str, String)> {
    let mut fields = Vec::new();
    let mut add = |name: &'static str, value: Option<String>| {
        if let Some(value) = value {
            fields.push((name, value));
        }
    };
    add("backend", policy.backend.as_deref().map(safe));
    add("timeout", policy.timeout_s.map(|s| format!("{s} s")));
    add("cpu time", policy.cpu_time_s.map(|s| format!("{s} s")));
    add("memory", policy.memory_mb.map(|mb| format!("{mb} MiB")));
    add("cpus", policy.cpus.map(|cpus| cpus.to_string()));
    add("pids", policy.pids.map(|pids| pids.to_string()));
    add("disk", policy.disk_mb.map(|mb| format!("{mb} MiB")));
    add("inodes", policy.disk_inodes.map(|n| n.to_string()));
    add("open files", policy.open_files.map(|n| n.to_string()));
    add("output", policy.max_output_bytes.map(|n| format!("{} per stream", bytes(n))));
    add("files in/out", policy.max_file_bytes.map(bytes));
    if let Some(env) = policy.env.as_ref().filter(|env| !env.is_empty()) {
        let names: Vec<String> = env.keys().map(|key| safe(key)).collect();
        add("env", Some(names.join(" ")));
    }
    if let Some(layers) = policy.allow_degraded.as_ref().filter(|layers| !layers.is_empty()) {
        add("may run without", Some(safe(&layers.join(" "))));
    }
    fields
}

/// One header line: kept to one line whatever its text holds (a path, an
/// exception's name, a host the sandbox or a client chose), so that no
/// text can add a line that passes for the header's own.
fn line(out: &mut String, label: &str, text: &str) {
    let _ = writeln!(out, "{label:<11} {}", airlock_core::one_line(text));
}

/// A section's title, one line as a header's is.
fn section(out: &mut String, title: &str) {
    let _ = writeln!(out, "\n--- {} ---", airlock_core::one_line(title));
}

fn block(out: &mut String, text: &str) {
    out.push_str(&safe(text));
    if !text.ends_with('\n') {
        out.push('\n');
    }
}

/// The code, each line numbered; the line an error points at is marked `>`.
fn numbered_code(out: &mut String, code: &str, error_line: Option<u32>) {
    if code.is_empty() {
        out.push_str("(no code)\n");
        return;
    }
    let lines = airlock_core::source_lines(code);
    let width = lines.len().to_string().len();
    for (index, text) in lines.into_iter().enumerate() {
        let number = index + 1;
        let marker = if error_line.is_some_and(|line| line as usize == number) { '>' } else { ' ' };
        let _ = writeln!(out, "{marker}{number:>width$} | {}", safe(text));
    }
}

fn stream(out: &mut String, name: &str, text: &str, truncated: bool, binary: bool) {
    let mut notes = vec![bytes(text.len() as u64)];
    if truncated {
        notes.push("truncated at the output limit".to_owned());
    }
    if binary {
        notes.push("not UTF-8, shown decoded lossily; the exact bytes are in the record".to_owned());
    }
    if text.is_empty() {
        section(out, &format!("{name}: empty"));
    } else {
        section(out, &format!("{name} ({})", notes.join(", ")));
        block(out, text);
    }
}

/// A size as people write it: `12 B`, `1.5 KiB`, `512 MiB`.
pub fn bytes(count: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if count < 1024 {
        return format!("{count} B");
    }
    let mut value = count as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 { format!("{value:.0} {}", UNITS[unit]) } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// Milliseconds as seconds: `1.234 s`.
pub fn seconds(millis: u64) -> String {
    format!("{}.{:03} s", millis / 1000, millis % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_would_drive_a_terminal() {
        assert_eq!(safe("ok\n\tline"), "ok\n\tline");
        assert_eq!(safe("\u{1b}[2J"), "\\u{1b}[2J");
        assert_eq!(safe("over\rwrite"), "over\\u{d}write");
        assert_eq!(safe("a\u{202E}b"), "a\\u{202e}b");
        assert_eq!(safe("\u{9b}31m"), "\\u{9b}31m");
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(bytes(12), "12 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(512 * 1024 * 1024), "512 MiB");
        assert_eq!(seconds(1234), "1.234 s");
    }
}
