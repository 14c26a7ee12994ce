//! A stored run as the console and the HTML report show it: plain strings,
//! numbers and flags, ready for a template. Everything here that came out
//! of the sandbox is hostile; it is made terminal-safe here (control
//! characters and direction overrides shown as `\u{..}`, so that code cannot
//! read other than it runs) and HTML-escaped by the template engine. CSS
//! classes come only from the fixed sets below, never from a run.

use airlock::audit::{Neighbours, StoredRun, human_bytes, human_seconds, policy_fields};
use airlock::{Limit, NetworkVerdict, RunRecord, Status};
use airlock_core::terminal_safe as safe;

/// How a status looks: its word (the colour never stands alone) and the
/// class that colours it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusView {
    pub word: String,
    pub class: &'static str,
}

impl StatusView {
    pub fn of(status: Status) -> StatusView {
        // A status this match does not name yet (one added to the record
        // later) shows its own name, in the neutral colour.
        #[allow(unreachable_patterns)]
        let (word, class) = match status {
            Status::Ok => ("ok", "good"),
            Status::Failed => ("failed", "bad"),
            Status::Timeout => ("timed out", "limit"),
            Status::MemoryLimit => ("memory limit", "limit"),
            Status::CpuLimit => ("CPU limit", "limit"),
            Status::OutputLimit => ("output limit", "limit"),
            Status::SandboxError => ("sandbox error", "broken"),
            other => return StatusView { word: other.name().replace('_', " "), class: "other" },
        };
        StatusView { word: word.to_owned(), class }
    }
}

/// What stopped the run, or the limits it reached and finished anyway.
pub fn limits_text(stopping: Option<Limit>, hit: &[Limit]) -> String {
    let names: Vec<&str> = hit.iter().filter(|limit| Some(**limit) != stopping).map(|limit| limit.name()).collect();
    match (stopping, names.is_empty()) {
        (Some(limit), true) => format!("stopped by {}", limit.name()),
        (Some(limit), false) => format!("stopped by {}; also reached {}", limit.name(), names.join(", ")),
        (None, false) => format!("reached {}", names.join(", ")),
        (None, true) => String::new(),
    }
}

/// One line of code, numbered from 1.
#[derive(Clone, Debug)]
pub struct CodeLine {
    pub number: usize,
    pub text: String,
    /// The line the error points at.
    pub marked: bool,
}

#[derive(Clone, Debug)]
pub struct OutputView {
    pub name: &'static str,
    pub text: String,
    /// Size, truncation, lossy decoding, in words.
    pub notes: String,
}

#[derive(Clone, Debug)]
pub struct ErrorView {
    /// The line the error points at, 0 when it names none.
    pub line: u32,
    pub kind: String,
    pub message: String,
    pub traceback: String,
    pub at: String,
}

/// Where a content can be had: a URL of the console, a `data:` URL in the
/// report, or nowhere, with why.
#[derive(Clone, Debug)]
pub enum Source {
    Url(String),
    Missing(String),
}

#[derive(Clone, Debug)]
pub struct FigureView {
    pub index: usize,
    pub name: String,
    pub width: u32,
    pub height: u32,
    pub size: String,
    pub sha256: String,
    pub source: Source,
}

#[derive(Clone, Debug)]
pub struct ArtifactView {
    pub path: String,
    pub size: String,
    pub sha256: String,
    /// Where it went, or why it was refused.
    pub note: String,
    pub source: Source,
    /// The content as text, when it is small UTF-8.
    pub text: Option<String>,
}

#[derive(Clone, Debug)]
pub struct InputView {
    pub path: String,
    pub size: String,
    pub sha256: String,
}

#[derive(Clone, Debug)]
pub struct ConnectionView {
    pub target: String,
    pub resolved: String,
    pub verdict: &'static str,
    pub class: &'static str,
    pub reason: String,
    pub traffic: String,
}

/// One checked property of the entry's place in the chain.
#[derive(Clone, Debug)]
pub struct ChainCheck {
    pub what: &'static str,
    pub verdict: &'static str,
    pub class: &'static str,
    pub detail: String,
}

/// Everything a run page and a report show.
#[derive(Clone, Debug)]
pub struct RunView {
    pub id: String,
    /// The id as a URL path segment.
    pub id_path: String,
    pub seq: u64,
    pub status: StatusView,
    pub exit: String,
    pub limits: String,
    pub message: String,
    pub principal: String,
    pub started_at: String,
    pub recorded_at: String,
    pub usage: String,
    pub language: String,
    pub code_sha256: String,
    pub how_started: String,
    pub backend: String,
    pub layers: Vec<String>,
    pub degraded: Vec<String>,
    pub details: Vec<(String, String)>,
    pub image: String,
    pub policy: Vec<(&'static str, String)>,
    pub allowed_hosts: String,
    pub connections: Vec<ConnectionView>,
    pub code: Vec<CodeLine>,
    pub outputs: Vec<OutputView>,
    pub value: Option<String>,
    pub error: Option<ErrorView>,
    pub figures: Vec<FigureView>,
    pub artifacts: Vec<ArtifactView>,
    pub inputs: Vec<InputView>,
    pub entry_hash: String,
    pub prev_hash: String,
    pub chain: Vec<ChainCheck>,
}

/// Artefacts this small and UTF-8 are shown as text too.
pub const TEXT_PREVIEW_BYTES: u64 = 64 * 1024;

/// How contents are reached: the figure's and the artefact's source, and
/// the text of a small artefact.
pub trait Contents {
    fn figure(&self, index: usize, sha256: &str) -> Source;
    fn artifact(&self, index: usize, sha256: &str) -> Source;
    fn text(&self, sha256: &str) -> Option<String>;
}

impl RunView {
    pub fn new(run: &StoredRun, neighbours: Option<&Neighbours>, contents: &dyn Contents) -> RunView {
        let record = &run.record;
        let entry = &run.entry;
        let error_line = record.error.as_ref().and_then(|error| error.line).map(|line| line as usize);
        RunView {
            id: safe(&entry.run_id),
            id_path: path_segment(&entry.run_id),
            seq: entry.seq,
            status: StatusView::of(record.status),
            exit: exit_text(record),
            limits: limits_text(record.stopping_limit(), &record.limits_hit),
            message: record.message.as_deref().map(safe).unwrap_or_default(),
            principal: entry.principal.as_deref().map_or_else(|| "no token (a local run)".to_owned(), safe),
            started_at: safe(&record.started_at),
            recorded_at: safe(&entry.recorded_at),
            usage: usage_text(record),
            language: record.language.name().to_owned(),
            code_sha256: safe(&record.code_sha256),
            how_started: how_started(record),
            backend: if record.isolation.backend.is_empty() {
                "unknown".to_owned()
            } else {
                safe(&record.isolation.backend)
            },
            layers: record.isolation.layers.iter().map(|layer| layer.name().to_owned()).collect(),
            degraded: record.isolation.degraded.iter().map(|layer| layer.name().to_owned()).collect(),
            details: record.isolation.details.iter().map(|(key, value)| (safe(key), safe(value))).collect(),
            image: record
                .image
                .as_ref()
                .map_or_else(String::new, |image| format!("{} ({})", safe(&image.name), safe(&image.hash))),
            policy: policy_fields(&record.policy),
            allowed_hosts: allowed_hosts(record),
            connections: connections(record),
            code: code_lines(&record.code, error_line),
            outputs: outputs(record),
            value: record.value.as_deref().map(safe),
            error: record.error.as_ref().map(|error| ErrorView {
                line: error.line.unwrap_or(0),
                kind: safe(&error.kind),
                message: safe(&error.message),
                traceback: safe(&error.traceback),
                at: match (error.line, error.column) {
                    (Some(line), Some(column)) => format!("line {line}, column {column}"),
                    (Some(line), None) => format!("line {line}"),
                    _ => String::new(),
                },
            }),
            figures: record
                .figures
                .iter()
                .enumerate()
                .map(|(index, figure)| FigureView {
                    index,
                    name: safe(&figure.name),
                    width: figure.width,
                    height: figure.height,
                    size: human_bytes(figure.bytes),
                    sha256: safe(&figure.sha256),
                    source: contents.figure(index, &figure.sha256),
                })
                .collect(),
            artifacts: artifacts(record, contents),
            inputs: record
                .inputs
                .iter()
                .map(|input| InputView {
                    path: safe(&input.path),
                    size: human_bytes(input.bytes),
                    sha256: safe(&input.sha256),
                })
                .collect(),
            entry_hash: safe(&entry.entry_hash),
            prev_hash: safe(&entry.prev_hash),
            chain: chain_checks(run, neighbours),
        }
    }
}

/// How the run started. The record does not say yet (cold, from a pool of
/// started sandboxes, forked from a warm one); when it does, this is the
/// one place that shows it.
fn how_started(record: &RunRecord) -> String {
    match record.isolation.details.get("start") {
        Some(start) => safe(start),
        None => "not recorded".to_owned(),
    }
}

/// `text` as one URL path segment: every byte but the unreserved ones
/// percent-encoded, so no id can leave its segment or start a scheme.
pub fn path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn exit_text(record: &RunRecord) -> String {
    match (record.exit_code, record.signal) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "no exit code".to_owned(),
    }
}

fn usage_text(record: &RunRecord) -> String {
    let usage = &record.usage;
    let mut parts = vec![format!("wall {}", human_seconds(usage.wall_ms))];
    if let Some(cpu) = usage.cpu_ms {
        parts.push(format!("CPU {}", human_seconds(cpu)));
    }
    if let Some(peak) = usage.peak_memory_bytes {
        parts.push(format!("peak memory {}", human_bytes(peak)));
    }
    parts.join(", ")
}

fn allowed_hosts(record: &RunRecord) -> String {
    let hosts = match &record.network {
        Some(network) => network.allowed_hosts.clone(),
        None => record.policy.allow_hosts.clone().unwrap_or_default(),
    };
    if hosts.is_empty() { "none: no network".to_owned() } else { safe(&hosts.join(", ")) }
}

fn connections(record: &RunRecord) -> Vec<ConnectionView> {
    let Some(network) = &record.network else { return Vec::new() };
    network
        .connections
        .iter()
        .map(|connection| {
            let (verdict, class) = match connection.verdict {
                NetworkVerdict::Allowed => ("allowed", "good"),
                NetworkVerdict::Denied => ("refused", "bad"),
            };
            ConnectionView {
                target: format!("{}:{}", safe(&connection.host), connection.port),
                resolved: connection.resolved.as_deref().map(safe).unwrap_or_default(),
                verdict,
                class,
                reason: connection.reason.as_deref().map(safe).unwrap_or_default(),
                traffic: format!("{} out, {} in", human_bytes(connection.bytes_out), human_bytes(connection.bytes_in)),
            }
        })
        .collect()
}

fn code_lines(code: &str, error_line: Option<usize>) -> Vec<CodeLine> {
    airlock_core::source_lines(code)
        .into_iter()
        .enumerate()
        .map(|(index, text)| CodeLine { number: index + 1, text: safe(text), marked: error_line == Some(index + 1) })
        .collect()
}

fn outputs(record: &RunRecord) -> Vec<OutputView> {
    let stream = |name, text: &str, truncated: bool, binary: bool| {
        let mut notes = vec![human_bytes(text.len() as u64)];
        if truncated {
            notes.push("cut at the output limit".to_owned());
        }
        if binary {
            notes.push("not UTF-8: shown decoded lossily, the exact bytes are in the record".to_owned());
        }
        OutputView { name, text: safe(text), notes: notes.join(", ") }
    };
    vec![
        stream("stdout", &record.stdout, record.stdout_truncated, record.stdout_base64.is_some()),
        stream("stderr", &record.stderr, record.stderr_truncated, record.stderr_base64.is_some()),
    ]
}

fn artifacts(record: &RunRecord, contents: &dyn Contents) -> Vec<ArtifactView> {
    record
        .artifacts
        .iter()
        .enumerate()
        .map(|(index, artifact)| {
            let sha256 = artifact.sha256.as_deref().unwrap_or_default();
            let source = match (&artifact.error, artifact.sha256.as_deref()) {
                (None, Some(sha256)) => contents.artifact(index, sha256),
                _ => Source::Missing("refused".to_owned()),
            };
            let small = artifact.bytes.is_some_and(|size| size <= TEXT_PREVIEW_BYTES);
            let text =
                if small && artifact.error.is_none() && !sha256.is_empty() { contents.text(sha256) } else { None };
            let note = match (&artifact.error, &artifact.saved_to) {
                (Some(error), _) => format!("refused: {}", safe(error)),
                (None, Some(saved)) => format!("saved to {}", safe(saved)),
                (None, None) => String::new(),
            };
            ArtifactView {
                path: safe(&artifact.path),
                size: artifact.bytes.map_or_else(String::new, human_bytes),
                sha256: safe(sha256),
                note,
                source,
                text: text.map(|text| safe(&text)),
            }
        })
        .collect()
}

fn chain_checks(run: &StoredRun, neighbours: Option<&Neighbours>) -> Vec<ChainCheck> {
    let entry = &run.entry;
    let mut checks = vec![if run.hash_matches {
        ChainCheck {
            what: "content",
            verdict: "holds",
            class: "good",
            detail: "its fields hash to its entry hash".into(),
        }
    } else {
        ChainCheck {
            what: "content",
            verdict: "EDITED",
            class: "bad",
            detail: "its fields no longer hash to its entry hash: the entry was edited after it was recorded".into(),
        }
    }];
    let Some(neighbours) = neighbours else { return checks };
    checks.push(match (&neighbours.previous, entry.seq) {
        (_, 1) if entry.prev_hash == airlock::audit::GENESIS_HASH => ChainCheck {
            what: "link back",
            verdict: "holds",
            class: "good",
            detail: "the first entry: it links to 64 zeros".into(),
        },
        (Some(previous), _) if previous.entry_hash == entry.prev_hash => ChainCheck {
            what: "link back",
            verdict: "holds",
            class: "good",
            detail: format!("entry {} hashes to the hash this one names", previous.seq),
        },
        (Some(previous), _) => ChainCheck {
            what: "link back",
            verdict: "BROKEN",
            class: "bad",
            detail: format!("entry {} hashes to {}, not to the hash this one names", previous.seq, previous.entry_hash),
        },
        (None, seq) => ChainCheck {
            what: "link back",
            verdict: "BROKEN",
            class: "bad",
            detail: format!("entry {} is missing", seq.saturating_sub(1)),
        },
    });
    checks.push(match &neighbours.next {
        None => ChainCheck {
            what: "link forward",
            verdict: "latest",
            class: "other",
            detail: "no entry follows yet (the chain's head is on the chain page)".into(),
        },
        Some(next) if next.prev_hash == entry.entry_hash => ChainCheck {
            what: "link forward",
            verdict: "holds",
            class: "good",
            detail: format!("entry {} names this entry's hash", next.seq),
        },
        Some(next) => ChainCheck {
            what: "link forward",
            verdict: "BROKEN",
            class: "bad",
            detail: format!("entry {} names {}, not this entry's hash", next.seq, safe(&next.prev_hash)),
        },
    });
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_mark_lands_on_the_line_python_reported() {
        // Python numbers "x = 1\r" as line 1 and the raise as line 3.
        let lines = code_lines("x = 1\ry = 2\r\nraise ValueError(x)\n", Some(3));
        let marked: Vec<&str> = lines.iter().filter(|line| line.marked).map(|line| line.text.as_str()).collect();
        assert_eq!(marked, ["raise ValueError(x)"]);
        assert_eq!(lines.len(), 3);
    }

    #[test]
    fn ids_stay_in_their_path_segment() {
        assert_eq!(path_segment("r-1_a.b~"), "r-1_a.b~");
        assert_eq!(path_segment("../x?y#z"), "..%2Fx%3Fy%23z");
        assert_eq!(path_segment("javascript:alert(1)"), "javascript%3Aalert%281%29");
    }

    #[test]
    fn every_status_has_a_word_and_a_known_class() {
        for status in Status::ALL {
            let view = StatusView::of(status);
            assert!(!view.word.is_empty());
            assert!(["good", "bad", "limit", "broken", "other"].contains(&view.class));
        }
    }

    #[test]
    fn limits_say_what_stopped_the_run_and_what_else_was_reached() {
        assert_eq!(limits_text(Some(Limit::WallTime), &[Limit::WallTime]), "stopped by wall_time");
        assert_eq!(
            limits_text(Some(Limit::Memory), &[Limit::Pids, Limit::Memory]),
            "stopped by memory; also reached pids"
        );
        assert_eq!(limits_text(None, &[Limit::Disk]), "reached disk");
        assert_eq!(limits_text(None, &[]), "");
    }
}
