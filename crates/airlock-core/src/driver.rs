//! How a job becomes a program inside the sandbox, and what the Python driver
//! reports back.
//!
//! Python code runs under `driver.py` (shipped inside this crate), which
//! returns the last expression's value, structured errors and figures through
//! a report file. Python is given `driver_start.py`, which runs the driver
//! from the bytecode beside it when it was made by this interpreter from
//! this very source, else from its source. The driver's files come from the
//! runtime's folder ([`Runtime::driver_dir`], bound at [`DRIVER_DIR`]) or,
//! without one, with each run's program.
//! Shell code runs under `/bin/sh` as it is.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use airlock_policy::{DisplayResult, ErrorInfo, Language, ResultKind};
use base64::Engine;
use serde::Deserialize;

use crate::backend::Job;
use crate::runtime::Runtime;

/// The Python driver's source: what every run needs.
pub const DRIVER_SOURCE: &str = include_str!("driver.py");
/// The rest of the driver, loaded inside only when there is something to
/// report (an error, figures).
pub const DRIVER_REPORT_SOURCE: &str = include_str!("driver_report.py");
/// The script Python is given: runs the driver from its bytecode or its source.
pub const DRIVER_START_SOURCE: &str = include_str!("driver_start.py");
/// The fork server of a forked pool's template (`Start::Template`), compiled
/// from its source once per template.
pub const DRIVER_TEMPLATE_SOURCE: &str = include_str!("driver_template.py");

/// The driver's files that may run from bytecode, each as (its name in
/// the driver's folder, the name of its bytecode there, its source). The
/// bytecode of `x.py` is `x.pyc`, a checked-hash .pyc that
/// `driver_start.py` checks against the interpreter and the source.
pub const COMPILED_FILES: [(&str, &str, &str); 2] =
    [("driver.py", "driver.pyc", DRIVER_SOURCE), ("driver_report.py", "driver_report.pyc", DRIVER_REPORT_SOURCE)];

/// Every source file of the driver, as (its name in the driver's folder, its
/// text): what a runtime's driver folder holds, beside the bytecode of
/// [`COMPILED_FILES`].
pub const DRIVER_FILES: [(&str, &str); 4] = [
    ("driver_start.py", DRIVER_START_SOURCE),
    ("driver.py", DRIVER_SOURCE),
    ("driver_report.py", DRIVER_REPORT_SOURCE),
    ("driver_template.py", DRIVER_TEMPLATE_SOURCE),
];

/// A fingerprint of every file of [`DRIVER_FILES`], its name and its text,
/// computed as this crate is compiled: what a cache of the driver's files
/// is keyed by, at no cost at run time (hashing the sources at every start
/// cost about 0.1 ms). FNV-1a: it tells this build's driver from another's,
/// and is no defence against anyone who can write airlock's data directory
/// (who could change the images too).
pub const DRIVER_FINGERPRINT: u64 = {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut file = 0;
    while file < DRIVER_FILES.len() {
        let (name, text) = DRIVER_FILES[file];
        let mut part = 0;
        while part < 2 {
            let bytes = if part == 0 { name.as_bytes() } else { text.as_bytes() };
            let mut at = 0;
            while at < bytes.len() {
                hash = (hash ^ bytes[at] as u64).wrapping_mul(0x0100_0000_01b3);
                at += 1;
            }
            // A separator, so that no two different lists of files run together alike.
            hash = (hash ^ 0xff).wrapping_mul(0x0100_0000_01b3);
            part += 1;
        }
        file += 1;
    }
    hash
};

/// Whether `folder` holds this build's driver and only `owner` (the user
/// that made it: the caller) or root can change it: every source of
/// [`DRIVER_FILES`], byte for byte, and any bytecode of [`COMPILED_FILES`]
/// (which `driver_start.py` checks against those sources inside: its
/// header, not its code, so none may come from anyone else); the folder
/// and its files owned by `owner` or root and writable by no one else; its
/// three parents (`<data>/cache/driver/<key>`) owned by them too, and
/// writable by no one else or sticky (where no one else can move what is
/// ours); every file and the folder readable
/// by everyone, as a tree bound into a sandbox whose user is not the caller
/// must be. Anything else (a file gone, cut short, changed or a link, a
/// folder another user could add to or swap) is not bound into a sandbox,
/// whose every later run it would reach. About 60 KB read.
pub fn folder_holds_this_driver(folder: &Path, owner: u32) -> bool {
    let ours = |meta: &std::fs::Metadata| meta.uid() == owner || meta.uid() == 0;
    let closed = |meta: &std::fs::Metadata| ours(meta) && meta.mode() & 0o022 == 0;
    let Ok(top) = std::fs::symlink_metadata(folder) else { return false };
    if !top.is_dir() || !closed(&top) || top.mode() & 0o005 != 0o005 {
        return false;
    }
    let parents_safe = folder.ancestors().skip(1).take(3).all(|parent| {
        std::fs::symlink_metadata(parent)
            .is_ok_and(|meta| meta.is_dir() && ours(&meta) && (meta.mode() & 0o022 == 0 || meta.mode() & 0o1000 != 0))
    });
    // A regular file, ours, closed to others' writes, open to their reads;
    // `None` when nothing is there at all.
    let file = |name: &str| match std::fs::symlink_metadata(folder.join(name)) {
        Ok(meta) => Some(meta.is_file() && closed(&meta) && meta.mode() & 0o004 != 0),
        Err(_) => None,
    };
    parents_safe
        && DRIVER_FILES.iter().all(|(name, text)| {
            file(name) == Some(true) && std::fs::read(folder.join(name)).is_ok_and(|content| content == text.as_bytes())
        })
        && COMPILED_FILES.iter().all(|(_, pyc, _)| file(pyc) != Some(false))
}

/// How often the use of a driver folder is written down, as its mtime
/// ([`note_folder_used`]).
pub const FOLDER_USE_NOTED_EVERY: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Writes down that `folder`, a driver folder, is in use: sets its mtime to
/// now when it is older than [`FOLDER_USE_NOTED_EVERY`] (at most one write a
/// day, not one per start). Every runtime that takes a folder and every
/// sandbox that binds one notes it, so a folder whose mtime is weeks old is
/// one nothing uses, which the folder's maker may remove. Best effort: a
/// folder whose time cannot be set is only the more likely to be made again.
pub fn note_folder_used(folder: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(meta) = std::fs::symlink_metadata(folder) else { return };
    let noted_lately =
        meta.modified().ok().and_then(|t| t.elapsed().ok()).is_some_and(|age| age < FOLDER_USE_NOTED_EVERY);
    if !meta.is_dir() || noted_lately {
        return;
    }
    let opened = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW).open(folder);
    if let Ok(dir) = opened {
        let _ = dir.set_modified(std::time::SystemTime::now());
    }
}

/// The read-only folder inside the sandbox that holds each run's own
/// program: the code, the report and its FIFOs; the driver too when the
/// runtime has no folder of its own for it.
pub const PROGRAM_DIR: &str = "/.airlock";

/// Where a runtime's driver folder ([`Runtime::driver_dir`]) is bound
/// read-only inside the sandbox, once for the sandbox's life.
pub const DRIVER_DIR: &str = "/.airlock-driver";

/// Name of the report file in [`PROGRAM_DIR`]; a FIFO on the Linux backend.
pub const REPORT_FILE: &str = "report";

/// Name of the FIFO in [`PROGRAM_DIR`] on which the driver announces, one
/// byte each, that its preload is imported ([`READY_PRELOADED`]) and that the
/// code's first instruction runs ([`READY_CODE`]). Written from inside, so
/// untrusted: timing only, never a status or a limit.
pub const READY_FILE: &str = "ready";
/// The byte a warm driver writes once its preload is imported.
pub const READY_PRELOADED: u8 = b'P';
/// The byte the driver writes just before the code's first instruction.
pub const READY_CODE: u8 = b'C';
/// Name of the FIFO in [`PROGRAM_DIR`] through which a warm driver receives
/// its code ([`feed`]).
pub const CODE_FIFO: &str = "code";

/// How the driver starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start<'a> {
    /// Reads the code from its file and runs it.
    Cold,
    /// As `Cold`, and announces the code's first instruction on [`READY_FILE`].
    Announced,
    /// Imports `preload`, announces it, then waits for the code on
    /// [`CODE_FIFO`] (see [`feed`]): a sandbox made ready before its run.
    /// With `huge_pages` (the host's transparent huge pages are not
    /// `never`), the preload's dense memory is first moved into huge pages,
    /// so that the run's exit frees it sooner (driver.py).
    Warm { preload: &'a [String], huge_pages: bool },
    /// Imports `preload` (as `Warm` does, `huge_pages` included), then
    /// serves forks on its standard input (driver_template.py), each of
    /// which goes on as a warm driver with its report, ready and code pipes
    /// at descriptors 3, 4 and 5.
    Template { preload: &'a [String], huge_pages: bool },
}

/// Caps on what the driver may report. The supervisor enforces them again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportCaps {
    /// Characters of the last expression's repr, and of each text
    /// representation of a rich result.
    pub value_chars: usize,
    pub max_figures: usize,
    /// Rich results (`display()` calls and the value) kept per run.
    pub max_results: usize,
    /// Bytes of one PNG, figure or rich result's image.
    pub figure_bytes: usize,
    /// Bytes of the whole report as read from the sandbox.
    pub report_bytes: usize,
}

impl Default for ReportCaps {
    fn default() -> Self {
        ReportCaps {
            value_chars: 64 * 1024,
            max_figures: 16,
            max_results: 32,
            figure_bytes: 4 * 1024 * 1024,
            report_bytes: 24 * 1024 * 1024,
        }
    }
}

/// A file a run's program needs in [`PROGRAM_DIR`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramFile {
    pub name: &'static str,
    pub content: Vec<u8>,
}

impl ProgramFile {
    fn text(name: &'static str, content: &str) -> ProgramFile {
        ProgramFile { name, content: content.as_bytes().to_vec() }
    }
}

/// What to execute inside the sandbox for a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    /// argv; argv[0] is the absolute path to execute.
    pub argv: Vec<String>,
    /// Files to place in [`PROGRAM_DIR`] first.
    pub files: Vec<ProgramFile>,
    /// Whether the program writes a report to [`REPORT_FILE`].
    pub reports: bool,
    /// Whether it announces itself on [`READY_FILE`].
    pub announces: bool,
    /// Whether it waits for its code on [`CODE_FIFO`].
    pub fed: bool,
}

/// Serde for the program's files as a plan carries them to a helper: each
/// file's name and its bytes in base64 (source text or bytecode alike).
pub mod files_in_base64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(files: &[(String, Vec<u8>)], serializer: S) -> Result<S::Ok, S::Error> {
        let encoded: Vec<(&str, String)> = files
            .iter()
            .map(|(name, content)| (name.as_str(), base64::engine::general_purpose::STANDARD.encode(content)))
            .collect();
        encoded.serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<(String, Vec<u8>)>, D::Error> {
        let encoded: Vec<(String, String)> = Vec::deserialize(deserializer)?;
        encoded
            .into_iter()
            .map(|(name, text)| {
                base64::engine::general_purpose::STANDARD
                    .decode(text.as_bytes())
                    .map(|content| (name, content))
                    .map_err(serde::de::Error::custom)
            })
            .collect()
    }
}

/// What a warm driver reads from [`CODE_FIFO`] for `job`: a line of four
/// lengths, then the display name, the working directory, the variables
/// to set (`NAME=VALUE`) or remove (`NAME`) before the code, each ended by
/// a NUL (neither a name nor a value holds one), and the code.
pub fn feed(job: &Job, env: &[(String, Option<String>)]) -> Vec<u8> {
    let cwd = job.cwd.as_ref().map_or_else(|| "/work".to_owned(), ToString::to_string);
    let name = job.display_name();
    let mut changes = String::new();
    for (key, value) in env {
        changes.push_str(key);
        if let Some(value) = value {
            changes.push('=');
            changes.push_str(value);
        }
        changes.push('\0');
    }
    let mut bytes = format!("{} {} {} {}\n", name.len(), cwd.len(), changes.len(), job.code.len()).into_bytes();
    for part in [name, cwd.as_str(), changes.as_str(), job.code.as_str()] {
        bytes.extend_from_slice(part.as_bytes());
    }
    bytes
}

/// Builds the program for `job` with `runtime`.
pub fn program(job: &Job, runtime: &Runtime, caps: &ReportCaps) -> Program {
    program_with(job, runtime, caps, Start::Cold)
}

/// Builds the program for `job` with `runtime`, the driver started as
/// `start` says (a warm start is always Python, and ignores the job's code).
pub fn program_with(job: &Job, runtime: &Runtime, caps: &ReportCaps, start: Start<'_>) -> Program {
    let warm = matches!(start, Start::Warm { .. } | Start::Template { .. });
    match job.language {
        Language::Sh if !warm => Program {
            argv: vec!["/bin/sh".to_owned(), format!("{PROGRAM_DIR}/main.sh")],
            files: vec![ProgramFile::text("main.sh", &job.code)],
            reports: false,
            announces: false,
            fed: false,
        },
        _ => python_program(job, runtime, caps, start),
    }
}

fn python_program(job: &Job, runtime: &Runtime, caps: &ReportCaps, start: Start<'_>) -> Program {
    // The driver: bound from the runtime's folder, or else brought by the
    // run itself (its sources only: the template's when a template needs it).
    let template = matches!(start, Start::Template { .. });
    let (driver_dir, mut files) = match runtime.driver_dir {
        Some(_) => (DRIVER_DIR, Vec::new()),
        None => (
            PROGRAM_DIR,
            DRIVER_FILES
                .iter()
                .filter(|(name, _)| template || *name != "driver_template.py")
                .map(|&(name, source)| ProgramFile::text(name, source))
                .collect(),
        ),
    };
    let (code_path, report_path, ready_path) = match start {
        Start::Warm { .. } => (
            format!("{PROGRAM_DIR}/{CODE_FIFO}"),
            format!("{PROGRAM_DIR}/{REPORT_FILE}"),
            format!("{PROGRAM_DIR}/{READY_FILE}"),
        ),
        Start::Template { .. } => ("fd:5".to_owned(), "fd:3".to_owned(), "fd:4".to_owned()),
        Start::Cold | Start::Announced => {
            files.push(ProgramFile::text("main.py", &job.code));
            (
                format!("{PROGRAM_DIR}/main.py"),
                format!("{PROGRAM_DIR}/{REPORT_FILE}"),
                format!("{PROGRAM_DIR}/{READY_FILE}"),
            )
        }
    };
    let mut argv = vec![
        runtime.python.to_string_lossy().into_owned(),
        // Unbuffered, so output written before a kill is not lost.
        "-u".to_owned(),
    ];
    // Where the runtime's `site` is known, the driver sets it up itself
    // (`-S`: Python's own `site` does not run); "-" lets Python's run.
    let site = match &runtime.known_site {
        Some(prefix) => {
            argv.push("-S".to_owned());
            prefix.to_string_lossy().into_owned()
        }
        None => "-".to_owned(),
    };
    argv.extend([
        format!("{driver_dir}/driver_start.py"),
        site,
        code_path,
        job.display_name().to_owned(),
        report_path,
        caps.value_chars.to_string(),
        caps.max_figures.to_string(),
        caps.figure_bytes.to_string(),
        caps.max_results.to_string(),
    ]);
    if start != Start::Cold {
        argv.push(ready_path);
    }
    match start {
        Start::Warm { preload, huge_pages } => warm_argv(&mut argv, "warm", huge_pages, preload),
        Start::Template { preload, huge_pages } => warm_argv(&mut argv, "template", huge_pages, preload),
        Start::Cold | Start::Announced => {}
    }
    // A template's forks have pipes, not FIFOs.
    Program {
        argv,
        files,
        reports: !template,
        announces: start != Start::Cold && !template,
        fed: matches!(start, Start::Warm { .. }),
    }
}

/// A warm driver's arguments after READY_PATH: its mode, whether to move
/// the preload into huge pages, the preload.
fn warm_argv(argv: &mut Vec<String>, mode: &str, huge_pages: bool, preload: &[String]) {
    argv.push(mode.to_owned());
    argv.push(if huge_pages { "huge" } else { "small" }.to_owned());
    argv.extend(preload.iter().cloned());
}

/// A figure the driver returned, checked to be a PNG.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Figure {
    pub name: String,
    pub width: u32,
    pub height: u32,
    pub png: Vec<u8>,
}

/// What the driver reported, after checking.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverReport {
    pub value: Option<String>,
    /// Rich results in order, each representation checked.
    pub results: Vec<DisplayResult>,
    pub error: Option<ErrorInfo>,
    /// The module a `ModuleNotFoundError` named.
    pub missing_module: Option<String>,
    pub figures: Vec<Figure>,
    /// Problems with the report itself or with figures, for the record's message.
    pub problems: Vec<String>,
}

#[derive(Deserialize)]
struct RawReport {
    value: Option<String>,
    #[serde(default)]
    value_truncated: bool,
    error: Option<RawError>,
    #[serde(default)]
    figures: Vec<RawFigure>,
    #[serde(default)]
    figure_errors: Vec<String>,
    #[serde(default)]
    figures_dropped: u32,
    #[serde(default)]
    results: Vec<RawResult>,
    #[serde(default)]
    result_errors: Vec<String>,
    #[serde(default)]
    results_dropped: u32,
}

#[derive(Deserialize)]
struct RawResult {
    kind: ResultKind,
    data: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct RawError {
    #[serde(rename = "type")]
    kind: String,
    message: String,
    traceback: String,
    line: Option<u32>,
    column: Option<u32>,
    module: Option<String>,
}

#[derive(Deserialize)]
struct RawFigure {
    name: String,
    png_base64: String,
}

const MAX_TEXT: usize = 256 * 1024;

/// Parses the driver's report. The bytes come from inside the sandbox: every
/// field is capped and every figure re-checked; a bad report is a problem
/// noted in the result, never an error of the run.
pub fn parse_report(bytes: &[u8], caps: &ReportCaps) -> DriverReport {
    let mut report = DriverReport::default();
    if bytes.is_empty() {
        return report;
    }
    if bytes.len() > caps.report_bytes {
        report
            .problems
            .push(format!("the driver's report passed its cap of {} bytes and was dropped", caps.report_bytes));
        return report;
    }
    let raw: RawReport = match serde_json::from_slice(bytes) {
        Ok(raw) => raw,
        Err(e) => {
            report.problems.push(format!("the driver's report could not be read: {e}"));
            return report;
        }
    };
    report.value = raw.value.map(|v| cap_chars(v, caps.value_chars));
    if raw.value_truncated {
        report.problems.push(format!("the value was cut at {} characters", caps.value_chars));
    }
    if let Some(e) = raw.error {
        report.missing_module = e.module.filter(|_| e.kind == "ModuleNotFoundError").map(|m| cap_chars(m, 256));
        report.error = Some(ErrorInfo {
            kind: cap_chars(e.kind, 256),
            message: cap_chars(e.message, MAX_TEXT),
            traceback: cap_chars(e.traceback, MAX_TEXT),
            line: e.line,
            column: e.column,
        });
    }
    for fig in raw.figures {
        if report.figures.len() >= caps.max_figures {
            report.problems.push(format!("figures past the first {} were dropped", caps.max_figures));
            break;
        }
        let name = sanitize_name(&fig.name);
        let png = match base64::engine::general_purpose::STANDARD.decode(fig.png_base64.as_bytes()) {
            Ok(png) => png,
            Err(_) => {
                report.problems.push(format!("{name} was not valid base64 and was dropped"));
                continue;
            }
        };
        if png.len() > caps.figure_bytes {
            report.problems.push(format!("{name} was {} bytes, above the cap of {}", png.len(), caps.figure_bytes));
            continue;
        }
        match png_size(&png) {
            Some((width, height)) => report.figures.push(Figure { name, width, height, png }),
            None => report.problems.push(format!("{name} was not a PNG and was dropped")),
        }
    }
    report.problems.extend(raw.figure_errors.into_iter().take(16).map(|e| cap_chars(e, 1000)));
    if raw.figures_dropped > 0 {
        report.problems.push(format!("{} figures past the cap were not rendered", raw.figures_dropped));
    }
    for result in raw.results {
        if report.results.len() >= caps.max_results {
            report.problems.push(format!("rich results past the first {} were dropped", caps.max_results));
            break;
        }
        if let Some(result) = check_result(result, caps, &mut report.problems) {
            report.results.push(result);
        }
    }
    report.problems.extend(raw.result_errors.into_iter().take(16).map(|e| cap_chars(e, 1000)));
    if raw.results_dropped > 0 {
        report.problems.push(format!("{} rich results past the cap were not kept", raw.results_dropped));
    }
    report
}

/// One rich result from inside the sandbox: known MIME types only, text
/// within the value cap (text/plain cut, other text dropped: cut markup is
/// broken markup), images decoded and checked like figures.
fn check_result(raw: RawResult, caps: &ReportCaps, problems: &mut Vec<String>) -> Option<DisplayResult> {
    let mut data = BTreeMap::new();
    for (mime, content) in raw.data {
        let Some(known) = DisplayResult::TYPES.iter().find(|known| **known == mime) else {
            problems.push(format!("a rich result's {:?} is not a type airlock returns", cap_chars(mime, 100)));
            continue;
        };
        if DisplayResult::BINARY_TYPES.contains(known) {
            match base64::engine::general_purpose::STANDARD.decode(content.as_bytes()) {
                Ok(bytes) if bytes.len() > caps.figure_bytes => {
                    problems.push(format!("a rich result's {known} was above the cap of {} bytes", caps.figure_bytes))
                }
                Ok(bytes) if image_matches(known, &bytes) => {
                    data.insert((*known).to_owned(), content);
                }
                _ => problems.push(format!("a rich result's {known} was not a valid image and was dropped")),
            }
        } else if content.chars().nth(caps.value_chars).is_none() {
            data.insert((*known).to_owned(), content);
        } else if *known == "text/plain" {
            data.insert((*known).to_owned(), cap_chars(content, caps.value_chars));
        } else {
            problems.push(format!("a rich result's {known} was above the cap of {} characters", caps.value_chars));
        }
    }
    // Every result can be read as text.
    data.entry("text/plain".to_owned()).or_default();
    Some(DisplayResult { kind: raw.kind, data })
}

/// Whether `bytes` look like an image of type `mime`.
fn image_matches(mime: &str, bytes: &[u8]) -> bool {
    match mime {
        "image/png" => png_size(bytes).is_some(),
        "image/jpeg" => bytes.starts_with(&[0xFF, 0xD8, 0xFF]),
        _ => false,
    }
}

fn cap_chars(mut text: String, max: usize) -> String {
    if let Some((at, _)) = text.char_indices().nth(max) {
        text.truncate(at);
    }
    text
}

/// A file name safe to write on the host: no separators, no leading dot.
fn sanitize_name(name: &str) -> String {
    let clean: String = name
        .chars()
        .take(100)
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' { c } else { '_' })
        .collect();
    let clean = clean.trim_start_matches('.').to_owned();
    if clean.is_empty() { "figure.png".to_owned() } else { clean }
}

/// Width and height from a PNG's header, or `None` if it is not a PNG.
pub fn png_size(png: &[u8]) -> Option<(u32, u32)> {
    const SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
    if png.len() < 24 || &png[..8] != SIGNATURE || &png[12..16] != b"IHDR" {
        return None;
    }
    let width = u32::from_be_bytes(png[16..20].try_into().ok()?);
    let height = u32::from_be_bytes(png[20..24].try_into().ok()?);
    (width > 0 && height > 0).then_some((width, height))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fingerprint_of(files: &[(&str, &str)]) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for (name, text) in files {
            for bytes in [name.as_bytes(), text.as_bytes()] {
                for byte in bytes.iter().chain([&0xff]) {
                    hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
                }
            }
        }
        hash
    }

    #[test]
    fn the_drivers_fingerprint_follows_its_every_file() {
        assert_eq!(DRIVER_FINGERPRINT, fingerprint_of(&DRIVER_FILES), "computed at compile time as at run time");
        let mut changed = DRIVER_FILES;
        let edited = DRIVER_SOURCE.replacen("import sys", "import  sys", 1);
        changed[1].1 = &edited;
        assert_ne!(fingerprint_of(&changed), DRIVER_FINGERPRINT, "a change to driver.py");
        let mut renamed = DRIVER_FILES;
        renamed[3].0 = "driver_templates.py";
        assert_ne!(fingerprint_of(&renamed), DRIVER_FINGERPRINT, "a renamed file");
    }

    fn tiny_png(w: u32, h: u32) -> Vec<u8> {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        png.extend_from_slice(&w.to_be_bytes());
        png.extend_from_slice(&h.to_be_bytes());
        png.extend_from_slice(&[8, 6, 0, 0, 0]);
        png
    }

    #[test]
    fn reads_a_report_and_checks_figures() {
        let b64 = base64::engine::general_purpose::STANDARD.encode(tiny_png(640, 480));
        let json = format!(
            r#"{{"value": "42", "figures": [{{"name": "../figure-1.png", "png_base64": "{b64}"}}, {{"name": "x", "png_base64": "bm90IGEgcG5n"}}]}}"#
        );
        let r = parse_report(json.as_bytes(), &ReportCaps::default());
        assert_eq!(r.value.as_deref(), Some("42"));
        assert_eq!(r.figures.len(), 1);
        assert_eq!((r.figures[0].width, r.figures[0].height), (640, 480));
        assert_eq!(r.figures[0].name, "_figure-1.png");
        assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
    }

    #[test]
    fn garbage_is_a_problem_not_a_failure() {
        let r = parse_report(b"{not json", &ReportCaps::default());
        assert!(r.value.is_none());
        assert_eq!(r.problems.len(), 1);
        let caps = ReportCaps { report_bytes: 4, ..ReportCaps::default() };
        assert_eq!(parse_report(b"{\"value\": \"x\"}", &caps).problems.len(), 1);
    }

    #[test]
    fn rich_results_are_checked_like_figures() {
        let png = base64::engine::general_purpose::STANDARD.encode(tiny_png(2, 2));
        let json = format!(
            r#"{{"results": [
                {{"kind": "display", "data": {{"text/plain": "a", "text/html": "<b>a</b>", "image/png": "{png}"}}}},
                {{"kind": "display", "data": {{"image/png": "bm90IGEgcG5n", "application/x-evil": "x"}}}},
                {{"kind": "value", "data": {{"text/plain": "xxxxxxxx", "text/html": "<table>xxxxxxxx</table>"}}}}
            ]}}"#
        );
        let caps = ReportCaps { value_chars: 10, ..ReportCaps::default() };
        let r = parse_report(json.as_bytes(), &caps);
        assert_eq!(r.results.len(), 3);
        assert_eq!(r.results[0].data.len(), 3, "{:?}", r.results[0]);
        assert_eq!(
            r.results[1].data.keys().collect::<Vec<_>>(),
            ["text/plain"],
            "a bad PNG and an unknown type are dropped"
        );
        assert_eq!((r.results[2].kind, r.results[2].text()), (ResultKind::Value, "xxxxxxxx"));
        assert!(!r.results[2].data.contains_key("text/html"), "cut markup is dropped, not cut");
        assert_eq!(r.problems.len(), 3, "{:?}", r.problems);
    }
}
