//! Turning what a backend observed into the run record.

use std::io::Read;
use std::time::{SystemTime, UNIX_EPOCH};

use airlock_policy::{
    ArtifactRecord, FigureRecord, ImageRef, InputRecord, Isolation, Policy, RECORD_SCHEMA_VERSION, RunRecord, Status,
};
use base64::Engine;

use crate::backend::{Execution, Job};
use crate::error::SandboxError;
use crate::sha256_hex;

/// What the caller knows about a run, beside what the backend observed.
#[derive(Clone, Debug)]
pub struct RunContext<'a> {
    pub id: String,
    pub started_at: String,
    pub job: &'a Job,
    pub policy: &'a Policy,
    pub image: Option<ImageRef>,
    /// Describes the runtime (Python version, packages) for a missing-module hint.
    pub runtime_description: &'a str,
    pub inputs: Vec<InputRecord>,
}

impl RunContext<'_> {
    fn base(&self) -> RunRecord {
        RunRecord {
            schema_version: RECORD_SCHEMA_VERSION,
            id: self.id.clone(),
            started_at: self.started_at.clone(),
            code: self.job.code.clone(),
            code_sha256: sha256_hex(self.job.code.as_bytes()),
            language: self.job.language,
            policy: self.policy.to_spec(),
            inputs: self.inputs.clone(),
            image: self.image.clone(),
            ..RunRecord::default()
        }
    }
}

/// The record of a run the backend carried out. Artefacts are added by the
/// caller once it has read them.
pub fn assemble(ctx: &RunContext<'_>, execution: Execution) -> RunRecord {
    let mut record = ctx.base();
    let (stdout, stdout_base64) = execution.stdout.text();
    let (stderr, stderr_base64) = execution.stderr.text();
    record.status = execution.status;
    record.limits_hit = execution.limits_hit.into_iter().collect();
    record.message = execution.message;
    record.exit_code = execution.exit_code;
    record.signal = execution.signal;
    record.stdout_truncated = execution.stdout.truncated();
    record.stderr_truncated = execution.stderr.truncated();
    record.stdout = stdout;
    record.stderr = stderr;
    record.stdout_base64 = stdout_base64;
    record.stderr_base64 = stderr_base64;
    record.usage = execution.usage;
    record.isolation = execution.isolation;
    record.network = execution.network;
    if let Some(report) = execution.report {
        record.value = report.value;
        record.results = report.results;
        record.error = report.error;
        if let (Some(module), Some(error)) = (&report.missing_module, record.error.as_mut()) {
            error.message = missing_module_message(module, &error.message, ctx);
        }
        record.figures = report
            .figures
            .into_iter()
            .map(|f| FigureRecord {
                name: f.name,
                width: f.width,
                height: f.height,
                bytes: f.png.len() as u64,
                sha256: sha256_hex(&f.png),
                saved_to: None,
                png_base64: Some(base64::engine::general_purpose::STANDARD.encode(&f.png)),
            })
            .collect();
        if !report.problems.is_empty() {
            // The driver runs inside, with the code: its notes are the
            // sandbox's words, and say so, beside the supervisor's own, each
            // on one line (a line of its own could pass for the report's).
            let problems: Vec<String> = report.problems.iter().map(|p| crate::one_line(p)).collect();
            let note = format!("the code's driver reported: {}", problems.join("; "));
            record.message = Some(match record.message.take() {
                Some(m) => format!("{m}; {note}"),
                None => note,
            });
        }
    }
    record
}

fn missing_module_message(module: &str, original: &str, ctx: &RunContext<'_>) -> String {
    // The module's name is the code's to choose (`ModuleNotFoundError(name=...)`),
    // and this message reads as airlock's: one line, as any note from inside.
    let (module, original) = (crate::one_line(module), crate::one_line(original));
    let top = module.split('.').next().unwrap_or(&module);
    let image = ctx.image.as_ref().map_or("the host interpreter".to_owned(), |i| format!("image {:?}", i.name));
    format!(
        "{original}. The code ran in {image} ({}), which does not have it; use what it has.{OPERATOR_ADVICE} put \
         `{top}` in a requirements file and run `airlock image build NAME --requirements FILE`, then run with \
         --image NAME.",
        ctx.runtime_description
    )
}

/// Where the advice to whoever runs airlock begins in an error message (a
/// missing module: build an image). A door that shows the message to a
/// model, which cannot act on it, cuts it there ([`without_operator_advice`]).
pub const OPERATOR_ADVICE: &str = " To add it to the sandbox:";

/// `message` without the advice meant for whoever runs airlock.
pub fn without_operator_advice(message: &str) -> &str {
    message.split_once(OPERATOR_ADVICE).map_or(message, |(before, _)| before)
}

/// The record of a run whose sandbox never started the code. (Once the code
/// has started, the backend's [`Execution`] carries everything observed, and
/// [`assemble`] makes the record even when airlock itself failed.)
pub fn sandbox_error(ctx: &RunContext<'_>, error: &SandboxError, isolation: Isolation) -> RunRecord {
    let mut record = ctx.base();
    record.status = Status::SandboxError;
    record.message = Some(error.to_string());
    record.isolation = isolation;
    record
}

/// Marks artefacts on a record, and the limit if any was refused for size.
pub fn add_artifacts(record: &mut RunRecord, artifacts: Vec<ArtifactRecord>, any_over_cap: bool) {
    record.artifacts = artifacts;
    if any_over_cap && !record.limits_hit.contains(&airlock_policy::Limit::Artifacts) {
        record.limits_hit.push(airlock_policy::Limit::Artifacts);
    }
}

/// A fresh random run id: 32 hex digits.
pub fn new_id() -> String {
    let mut bytes = [0u8; 16];
    let filled = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if filled.is_err() {
        // No /dev/urandom (a very odd host): fall back on time and a counter,
        // which is unique within this process; ids are names, not secrets.
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        bytes[..8].copy_from_slice(&(nanos as u64).to_le_bytes());
        bytes[8..].copy_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    }
    hex::encode(bytes)
}

/// The current time as RFC 3339 in UTC, to the millisecond.
pub fn now_rfc3339() -> String {
    format_rfc3339(SystemTime::now())
}

/// `time` as RFC 3339 in UTC, to the millisecond.
pub fn format_rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant's algorithm.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_dates() {
        assert_eq!(format_rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_943_045_123);
        assert_eq!(format_rfc3339(t), "2026-11-29T09:04:05.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(format_rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn ids_are_distinct() {
        assert_ne!(new_id(), new_id());
        assert_eq!(new_id().len(), 32);
    }
}
