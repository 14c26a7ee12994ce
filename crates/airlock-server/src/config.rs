//! The operator's configuration: a TOML file with the defaults and the
//! ceilings of every run, the tokens that may ask for runs, and the data every
//! run starts with.
//!
//! ```toml
//! listen = "127.0.0.1:8750"     # where `airlock serve` listens
//! concurrency = 2               # runs at once [default: the number of cores]
//! queue = 8                     # runs waiting for a slot; past it, 429 [default: 4 x concurrency].
//!                               # Each token with none running or waiting keeps one place in it
//! max_body_bytes = 33554432     # request bodies above this get 413 [default: 32 MiB]
//! max_code_bytes = 1048576      # a run's code above this gets 400; the audit store keeps every
//!                               # run's code, indexed, at about 6 times its size [default: 1 MiB]
//! body_bytes_in_flight = 134217728  # the most of all request bodies read at once; a body that
//!                               # would pass it gets 429 [default: 4 x max_body_bytes]. One
//!                               # token's share: this over the tokens, at least one body
//! body_timeout_s = 30           # a request body must arrive whole within this, else 408 [default: 30]
//! max_connections = 512         # connections open at once; past it a new one is closed at
//!                               # once [default: 512]
//! header_timeout_s = 10         # a request head (and an idle connection's next one) must
//!                               # arrive within this, else the connection is closed [default: 10]
//! write_timeout_s = 30          # an answer the client stops reading for this long closes its
//!                               # connection (an idle event stream writes nothing) [default: 30]
//! max_mcp_sessions = 64         # MCP sessions at /mcp at once; past it `initialize` gets 429
//!                               # [default: 64]. A session idle for 300 s ends
//! max_mcp_sessions_per_token = 16  # the most one token holds [default: max_mcp_sessions / 4]
//! grace_period_s = 10           # on SIGTERM, how long running runs may finish [default: 10]
//! mcp_result_bytes = 262144     # the most one MCP tool result carries [default: 256 KiB]; past it,
//!                               # output is cut and files, figures and images become resource links
//! artifact_store_bytes = 1073741824  # artefacts kept for GET /v1/runs/{id}/artifacts/{index} and MCP
//!                               # resource links, the oldest of the token holding the most
//!                               # dropped first [default: 1 GiB]
//! image = "python-data"         # the runtime image [default: python-data], or:
//! # python = "/usr/bin/python3" # a host interpreter as it is
//! # audit_db = "/var/lib/airlock/audit.sqlite3"  # [default: audit.sqlite3 in the data directory]
//! keep_contents = "all"         # figures and inline artefacts kept beside the chain, for
//!                               # the console: "all", "figures" or "off" [default: all]
//! contents_quota_mb = 1024      # the most kept contents take in all; past it a content is
//!                               # skipped (and noted), the run still recorded [default: 1024]
//!
//! [defaults]                    # a PolicySpec: what a run gets when it asks for nothing
//! timeout_s = 10
//!
//! [ceiling]                     # a PolicySpec: the most a run may ask for
//! timeout_s = 60
//! memory_mb = 1024
//! allow_hosts = ["pypi.org"]
//!
//! [[tokens]]                    # printf %s "$TOKEN" | sha256sum
//! name = "ci-bot"
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! # see_all_runs = true        # may read every run, not only its own
//!
//! [[files]]                     # copied into every run's /work
//! host = "/srv/data/sales.csv"
//! sandbox = "/work/sales.csv"   # [default: /work/<file name>]
//!
//! [pool]                        # sandboxes kept ready for the image, preload imported
//! size = 2                      # [default: 2 with [pool], none without; `airlock mcp`: 1]; 0 turns it off
//! preload = ["numpy", "pandas", "matplotlib"]  # modules imported ahead [default: these]
//! idle_expiry_s = 600           # a ready sandbox older than this is made anew [default: 600]
//! memory_budget_mb = 1024       # the most the ready sandboxes hold together; no refill past it
//!                               # [default: none]. Refills run one at a time: at most one
//!                               # sandbox's CPU limit is spent on them
//! env_at_claim = ["TASK_ID"]    # variables a run's env may set warm, at its claim [default: none];
//!                               # only names nothing reads before the code starts: those known
//!                               # to be read at start-up (PYTHON*, LD_*, OMP_*, LANG, TZ...) are
//!                               # refused here
//! mode = "pooled"               # "pooled": each ready sandbox a fresh interpreter that imported
//!                               # the preload; "forked": each forked from one template that did
//!                               # (tens of ms a sandbox, for throughput; forked runs share the
//!                               # template's address layout and hash seed) [default: "pooled"]
//! ```
//!
//! A pooled run answers without paying for its interpreter and imports;
//! only a run with the defaults' policy (its own files, code, input, a
//! lower timeout, CPU time, memory or process limit, the variables
//! `env_at_claim` lists, and its own allowed hosts, whose proxy starts at
//! the claim; in the forked mode, none) can take a ready sandbox, any other
//! runs cold (see
//! `airlock::pool`).
//!
//! A field left out of `[ceiling]` keeps the library's default as its
//! ceiling, and one left out of `[defaults]` keeps the library's default; the
//! defaults must fit under the ceiling, and the server refuses to start if
//! they do not, naming the field.

use std::path::{Path, PathBuf};
use std::time::Duration;

use airlock::audit::{ContentsPolicy, DEFAULT_CONTENTS_QUOTA, KeepContents};
use airlock::{
    CopyIn, CopyInError, HostFacts, Policy, PolicyError, PolicySpec, PoolMode, PoolOptions, Runtime, SandboxPath,
};
use serde::Deserialize;
use sha2::Digest;

/// The address `airlock serve` listens on when the config names none.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8750";
/// Request bodies above this get 413 unless the config says otherwise: room
/// for the default 16 MiB file cap in base64 with some to spare.
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 << 20;
/// A run's code above this gets 400 unless the config says otherwise: a
/// model's code is kilobytes, and the audit store keeps each run's, indexed
/// for search, at about six times its size.
pub const DEFAULT_MAX_CODE_BYTES: usize = 1 << 20;
/// How long runs may go on after SIGTERM before they are killed.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(10);
/// Waiting runs per slot when the config does not size the queue.
pub const DEFAULT_QUEUE_PER_SLOT: usize = 4;
/// The most one MCP tool result carries unless the config says otherwise:
/// a report and a few figures, small enough for a model's context.
pub const DEFAULT_MCP_RESULT_BYTES: usize = 256 << 10;
/// The artefacts kept for later fetching, in bytes, unless the config says otherwise.
pub const DEFAULT_ARTIFACT_STORE_BYTES: u64 = 1 << 30;
/// Request bodies being read at once, in largest bodies, unless the config
/// sets `body_bytes_in_flight`: a few clients may send their largest at once.
pub const DEFAULT_BODIES_IN_FLIGHT: usize = 4;
/// How long a request body may take to arrive unless the config says otherwise.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections open at once unless the config says otherwise: each holds a
/// descriptor and a read buffer.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// How long a request head (and an idle connection's next one) may take.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an answer may wait for its client to read on.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// MCP sessions at once unless the config says otherwise.
pub const DEFAULT_MAX_MCP_SESSIONS: usize = 64;

/// The configuration file as written. [`Settings::new`] checks it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    pub listen: Option<String>,
    pub concurrency: Option<usize>,
    pub queue: Option<usize>,
    pub max_body_bytes: Option<usize>,
    pub max_code_bytes: Option<usize>,
    pub body_bytes_in_flight: Option<usize>,
    pub body_timeout_s: Option<f64>,
    pub max_connections: Option<usize>,
    pub header_timeout_s: Option<f64>,
    pub write_timeout_s: Option<f64>,
    pub max_mcp_sessions: Option<usize>,
    pub max_mcp_sessions_per_token: Option<usize>,
    pub grace_period_s: Option<f64>,
    pub mcp_result_bytes: Option<usize>,
    pub artifact_store_bytes: Option<u64>,
    pub image: Option<String>,
    pub python: Option<String>,
    pub audit_db: Option<PathBuf>,
    pub keep_contents: Option<KeepContents>,
    pub contents_quota_mb: Option<u64>,
    #[serde(default)]
    pub defaults: PolicySpec,
    #[serde(default)]
    pub ceiling: PolicySpec,
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
    #[serde(default)]
    pub files: Vec<FileConfig>,
    pub pool: Option<PoolConfig>,
}

/// `[pool]`: sandboxes kept ready for the server's image and defaults.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub size: Option<usize>,
    pub preload: Option<Vec<String>>,
    pub idle_expiry_s: Option<f64>,
    pub memory_budget_mb: Option<u64>,
    pub env_at_claim: Option<Vec<String>>,
    pub mode: Option<String>,
}

/// The most sandboxes a pool keeps ready: each holds an interpreter with
/// its preload (about 100 MB with pandas).
pub const MAX_POOL_SIZE: usize = 64;
/// The largest memory budget a pool takes, MiB (1 TiB).
const MAX_BUDGET_MB: u64 = 1 << 20;
/// The most connections the server holds: each is a descriptor.
const MAX_CONNECTIONS: usize = 1 << 20;
/// The most MCP sessions the server holds: each is a task and its buffers.
const MAX_MCP_SESSIONS: usize = 1 << 16;

/// A bearer token, kept as the SHA-256 of the token: the file never holds
/// the token itself.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Who the token belongs to: the name runs are recorded under.
    pub name: String,
    /// Lower-case hex SHA-256 of the token's bytes.
    pub sha256: String,
    /// May read every recorded run, not only the runs it asked for.
    #[serde(default)]
    pub see_all_runs: bool,
}

/// A host file copied into the work directory of every run.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub host: PathBuf,
    /// Where it appears; `/work/<file name>` when absent.
    pub sandbox: Option<String>,
}

impl FileConfig {
    /// Reads the `--file HOST_PATH[:SANDBOX_PATH]` form.
    pub fn parse(arg: &str) -> FileConfig {
        match arg.split_once(':') {
            Some((host, sandbox)) => FileConfig { host: PathBuf::from(host), sandbox: Some(sandbox.to_owned()) },
            None => FileConfig { host: PathBuf::from(arg), sandbox: None },
        }
    }
}

/// A configuration that cannot be used, naming the setting and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the config {path} is not valid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{setting}: {source}")]
    Policy {
        setting: &'static str,
        #[source]
        source: PolicyError,
    },
    #[error("{setting}: {message}")]
    Invalid { setting: String, message: String },
    #[error("files: {path}: {message}")]
    File { path: PathBuf, message: String },
}

impl ServerConfig {
    /// Reads and parses a TOML config file. Unknown settings are refused.
    pub fn load(path: &Path) -> Result<ServerConfig, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        toml::from_str(&text).map_err(|error| ConfigError::Parse { path: path.to_owned(), message: error.to_string() })
    }
}

/// A token the server accepts: its name and the hash of its bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    pub name: String,
    pub sha256: [u8; 32],
    pub see_all_runs: bool,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not even the hash goes to a log.
        f.debug_struct("Token").field("name", &self.name).field("see_all_runs", &self.see_all_runs).finish()
    }
}

/// A checked configuration, ready to serve.
#[derive(Clone, Debug)]
pub struct Settings {
    pub listen: String,
    pub concurrency: usize,
    pub queue: usize,
    pub max_body_bytes: usize,
    /// The most bytes of code a run may have.
    pub max_code_bytes: usize,
    /// The most of all request bodies the server reads at once, in bytes.
    pub body_bytes_in_flight: usize,
    /// How long a request body may take to arrive whole.
    pub body_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// How long a request head, or an idle connection's next one, may take.
    pub header_timeout: Duration,
    /// How long an answer may wait for its client to read on.
    pub write_timeout: Duration,
    /// MCP sessions at once, in all and per token.
    pub max_mcp_sessions: usize,
    pub max_mcp_sessions_per_token: usize,
    pub grace_period: Duration,
    /// The most one MCP tool result carries, in bytes.
    pub mcp_result_bytes: usize,
    /// The most the artefact store keeps, in bytes.
    pub artifact_store_bytes: u64,
    /// What a run gets when it asks for nothing.
    pub defaults: Policy,
    /// The most a run may ask for.
    pub ceiling: Policy,
    pub host: HostFacts,
    pub runtime: Runtime,
    pub tokens: Vec<Token>,
    /// The files every run starts with, read once, within the defaults' caps.
    pub files: CopyIn,
    pub audit_db: PathBuf,
    /// Which contents the audit store keeps, and how much in all.
    pub contents: ContentsPolicy,
    /// The pool of ready sandboxes, if any.
    pub pool: Option<PoolOptions>,
}

impl Settings {
    /// Checks `config` against this host. `runtime` is what the code runs
    /// with ([`resolve_runtime`]); `audit_db` is where runs are recorded when
    /// the config does not say.
    pub fn new(
        config: &ServerConfig,
        host: HostFacts,
        runtime: Runtime,
        default_audit_db: PathBuf,
    ) -> Result<Settings, ConfigError> {
        let ceiling = Policy::from_spec(&config.ceiling, &host)
            .map_err(|source| ConfigError::Policy { setting: "ceiling", source })?;
        let defaults = Policy::from_spec(&config.defaults, &host)
            .map_err(|source| ConfigError::Policy { setting: "defaults", source })?;
        defaults.to_spec().check_within(&ceiling).map_err(|source| ConfigError::Invalid {
            setting: format!("defaults.{}", source.field()),
            message: format!(
                "{source} (a default left unset is the library's; set it in [defaults], or raise [ceiling])"
            ),
        })?;
        let concurrency = config.concurrency.unwrap_or(host.cpus as usize);
        if concurrency == 0 {
            return Err(invalid("concurrency", "must be at least 1 run at once"));
        }
        let queue = config.queue.unwrap_or(concurrency * DEFAULT_QUEUE_PER_SLOT);
        let max_body_bytes = config.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
        if max_body_bytes < 1024 {
            return Err(invalid("max_body_bytes", "must be at least 1024 bytes, room for a small run"));
        }
        let max_code_bytes = config.max_code_bytes.unwrap_or(DEFAULT_MAX_CODE_BYTES);
        if max_code_bytes == 0 {
            return Err(invalid("max_code_bytes", "must be at least 1 byte, room for a run's code"));
        }
        let body_bytes_in_flight =
            config.body_bytes_in_flight.unwrap_or(max_body_bytes.saturating_mul(DEFAULT_BODIES_IN_FLIGHT));
        if body_bytes_in_flight < max_body_bytes {
            return Err(invalid(
                "body_bytes_in_flight",
                &format!(
                    "{body_bytes_in_flight} bytes is less than max_body_bytes ({max_body_bytes}): the largest body could never be read"
                ),
            ));
        }
        let body_timeout = seconds("body_timeout_s", config.body_timeout_s, DEFAULT_BODY_TIMEOUT, 0.1..=3600.0)?;
        let max_connections = config.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS);
        if !(1..=MAX_CONNECTIONS).contains(&max_connections) {
            return Err(invalid(
                "max_connections",
                &format!("{max_connections} is not a number of connections from 1 to {MAX_CONNECTIONS}"),
            ));
        }
        let header_timeout = seconds("header_timeout_s", config.header_timeout_s, DEFAULT_HEADER_TIMEOUT, 0.1..=600.0)?;
        let write_timeout = seconds("write_timeout_s", config.write_timeout_s, DEFAULT_WRITE_TIMEOUT, 0.1..=3600.0)?;
        let max_mcp_sessions = config.max_mcp_sessions.unwrap_or(DEFAULT_MAX_MCP_SESSIONS);
        if !(1..=MAX_MCP_SESSIONS).contains(&max_mcp_sessions) {
            return Err(invalid(
                "max_mcp_sessions",
                &format!("{max_mcp_sessions} is not a number of sessions from 1 to {MAX_MCP_SESSIONS}"),
            ));
        }
        let max_mcp_sessions_per_token = config.max_mcp_sessions_per_token.unwrap_or((max_mcp_sessions / 4).max(1));
        if !(1..=max_mcp_sessions).contains(&max_mcp_sessions_per_token) {
            return Err(invalid(
                "max_mcp_sessions_per_token",
                &format!(
                    "{max_mcp_sessions_per_token} is not a number of sessions from 1 to max_mcp_sessions ({max_mcp_sessions})"
                ),
            ));
        }
        let grace_period = match config.grace_period_s {
            None => DEFAULT_GRACE_PERIOD,
            Some(s) if s.is_finite() && (0.0..=3600.0).contains(&s) => Duration::from_secs_f64(s),
            Some(s) => {
                return Err(invalid("grace_period_s", &format!("{s} is not a number of seconds from 0 to 3600")));
            }
        };
        let mcp_result_bytes = config.mcp_result_bytes.unwrap_or(DEFAULT_MCP_RESULT_BYTES);
        if mcp_result_bytes < 4096 {
            return Err(invalid("mcp_result_bytes", "must be at least 4096 bytes, room for a short report"));
        }
        let artifact_store_bytes = config.artifact_store_bytes.unwrap_or(DEFAULT_ARTIFACT_STORE_BYTES);
        let tokens = config.tokens.iter().enumerate().map(|(i, t)| check_token(i, t)).collect::<Result<Vec<_>, _>>()?;
        for (i, token) in tokens.iter().enumerate() {
            if tokens[..i].iter().any(|other| other.name == token.name) {
                return Err(invalid(&format!("tokens[{i}].name"), &format!("{:?} is used twice", token.name)));
            }
            if tokens[..i].iter().any(|other| other.sha256 == token.sha256) {
                return Err(invalid(&format!("tokens[{i}].sha256"), "the same token is listed twice"));
            }
        }
        let files = read_files(&config.files, &defaults)?;
        let quota_mb = config.contents_quota_mb.unwrap_or(DEFAULT_CONTENTS_QUOTA >> 20);
        let quota_bytes = quota_mb
            .checked_mul(1 << 20)
            .ok_or_else(|| invalid("contents_quota_mb", &format!("{quota_mb} MiB is more than any disk holds")))?;
        let contents = ContentsPolicy { keep: config.keep_contents.unwrap_or_default(), quota_bytes };
        let pool = config.pool.as_ref().map(check_pool).transpose()?.filter(|p| p.size > 0);
        Ok(Settings {
            listen: config.listen.clone().unwrap_or_else(|| DEFAULT_LISTEN.to_owned()),
            concurrency,
            queue,
            max_body_bytes,
            max_code_bytes,
            body_bytes_in_flight,
            body_timeout,
            max_connections,
            header_timeout,
            write_timeout,
            max_mcp_sessions,
            max_mcp_sessions_per_token,
            grace_period,
            mcp_result_bytes,
            artifact_store_bytes,
            defaults,
            ceiling,
            host,
            runtime,
            tokens,
            files,
            audit_db: config.audit_db.clone().unwrap_or(default_audit_db),
            contents,
            pool,
        })
    }

    /// The token whose hash matches `presented`, compared in constant time.
    pub fn token(&self, presented: &str) -> Option<&Token> {
        find_token(&self.tokens, presented)
    }
}

/// The token of `tokens` whose hash matches `presented`, compared in
/// constant time: for the API's bearer tokens and the console's login.
pub fn find_token<'a>(tokens: &'a [Token], presented: &str) -> Option<&'a Token> {
    let digest: [u8; 32] = sha2::Sha256::digest(presented.as_bytes()).into();
    let mut found = None;
    for token in tokens {
        let difference = token.sha256.iter().zip(digest.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if difference == 0 {
            found = Some(token);
        }
    }
    found
}

/// What the code runs with: the wasm backend's own interpreter when the
/// defaults choose it, else the image named in the config (built on first
/// use when it is the default image), or a host interpreter as it is.
pub fn resolve_runtime(config: &ServerConfig) -> Result<Runtime, airlock::Error> {
    let host = airlock::host_facts()?;
    let backend = Policy::from_spec(&config.defaults, &host).map(|p| p.backend).unwrap_or_default();
    let name = config.image.as_deref().unwrap_or(airlock::image::DEFAULT_IMAGE).to_owned();
    let mut progress = |event: airlock::image::BuildEvent| eprintln!("airlock: image {name}: {event:?}");
    airlock::resolve_runtime(backend, config.image.as_deref(), config.python.as_deref(), &mut progress)
}

fn check_pool(pool: &PoolConfig) -> Result<PoolOptions, ConfigError> {
    let defaults = PoolOptions::default();
    let size = pool.size.unwrap_or(defaults.size);
    if size > MAX_POOL_SIZE {
        return Err(invalid(
            "pool.size",
            &format!("{size} ready sandboxes is more than {MAX_POOL_SIZE}; each holds an interpreter and its imports"),
        ));
    }
    let idle_expiry = match pool.idle_expiry_s {
        None => defaults.idle_expiry,
        Some(s) if s.is_finite() && (1.0..=86_400.0).contains(&s) => Duration::from_secs_f64(s),
        Some(s) => {
            return Err(invalid("pool.idle_expiry_s", &format!("{s} is not a number of seconds from 1 to 86400")));
        }
    };
    let memory_budget = match pool.memory_budget_mb {
        None => None,
        Some(mb @ 1..=MAX_BUDGET_MB) => Some(mb << 20),
        Some(mb) => {
            return Err(invalid(
                "pool.memory_budget_mb",
                &format!("{mb} is not a number of MiB from 1 to {MAX_BUDGET_MB}"),
            ));
        }
    };
    let preload = pool.preload.clone().unwrap_or(defaults.preload);
    let env_at_claim = pool.env_at_claim.clone().unwrap_or_default();
    let mode = match pool.mode.as_deref() {
        None => defaults.mode,
        Some(name) => PoolMode::parse(name)
            .ok_or_else(|| invalid("pool.mode", &format!("{name:?} is not a mode: use \"pooled\" or \"forked\"")))?,
    };
    let options = PoolOptions { size, preload, idle_expiry, memory_budget, env_at_claim, mode };
    if let Some(bad) = options.bad_preload() {
        return Err(invalid(
            "pool.preload",
            &format!("{bad:?} is not a module name (like \"pandas\" or \"matplotlib.pyplot\")"),
        ));
    }
    if let Some((name, why)) = options.refused_env_at_claim() {
        return Err(invalid("pool.env_at_claim", &format!("{name:?} cannot be set at a claim: {why}; take it out")));
    }
    Ok(options)
}

/// The lower-case hex SHA-256 of a token, as the config keeps it.
pub fn token_sha256(token: &str) -> String {
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// A number of seconds from the config, within `range`, or `default`.
fn seconds(
    setting: &str,
    value: Option<f64>,
    default: Duration,
    range: std::ops::RangeInclusive<f64>,
) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(s) if s.is_finite() && range.contains(&s) => Ok(Duration::from_secs_f64(s)),
        Some(s) => {
            Err(invalid(setting, &format!("{s} is not a number of seconds from {} to {}", range.start(), range.end())))
        }
    }
}

fn invalid(setting: &str, message: &str) -> ConfigError {
    ConfigError::Invalid { setting: setting.to_owned(), message: message.to_owned() }
}

fn check_token(index: usize, token: &TokenConfig) -> Result<Token, ConfigError> {
    let name = token.name.trim();
    if name.is_empty() || name.len() > 200 || name.chars().any(char::is_control) {
        return Err(invalid(
            &format!("tokens[{index}].name"),
            "give each token a name of 1 to 200 printable characters; runs are recorded under it",
        ));
    }
    let mut sha256 = [0u8; 32];
    let hash = token.sha256.trim();
    let decoded = hex::decode_to_slice(hash, &mut sha256);
    if decoded.is_err() || hash.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(invalid(
            &format!("tokens[{index}].sha256"),
            "must be the 64 lower-case hex digits of the token's SHA-256 (printf %s \"$TOKEN\" | sha256sum), never the token",
        ));
    }
    Ok(Token { name: name.to_owned(), sha256, see_all_runs: token.see_all_runs })
}

fn read_files(files: &[FileConfig], defaults: &Policy) -> Result<CopyIn, ConfigError> {
    let mut read = CopyIn::new(&defaults.limits);
    for file in files {
        let fail = |message: String| ConfigError::File { path: file.host.clone(), message };
        let inside = match &file.sandbox {
            Some(path) => path.clone(),
            None => {
                let name = file.host.file_name().ok_or_else(|| fail("name a file, not a folder".to_owned()))?;
                format!("/work/{}", name.to_string_lossy())
            }
        };
        let path = SandboxPath::parse(&inside).map_err(|e| fail(e.to_string()))?;
        if read.files().iter().any(|(taken, _)| *taken == path) {
            return Err(fail(format!("{path} is named twice")));
        }
        read.add_host_file(&file.host, path).map_err(|error| match error {
            CopyInError::Host { reason, .. } => fail(reason),
            other => fail(format!("{other}, in [defaults]")),
        })?;
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> HostFacts {
        HostFacts { memory_bytes: 8 << 30, cpus: 2, pid_max: 32768, nr_open: 1 << 20 }
    }

    fn settings(toml_text: &str) -> Result<Settings, ConfigError> {
        let config: ServerConfig = toml::from_str(toml_text)
            .map_err(|e| ConfigError::Parse { path: PathBuf::from("test.toml"), message: e.to_string() })?;
        Settings::new(&config, host(), Runtime::default(), PathBuf::from("/tmp/audit.sqlite3"))
    }

    #[test]
    fn an_empty_config_serves_with_the_defaults() {
        let s = settings("").unwrap();
        assert_eq!(s.concurrency, 2, "one run per core");
        assert_eq!(s.queue, 8);
        assert_eq!(s.listen, DEFAULT_LISTEN);
        assert_eq!(s.defaults, Policy::default());
        assert!(s.tokens.is_empty());
    }

    #[test]
    fn the_front_door_limits_have_defaults_and_are_checked() {
        let s = settings("").unwrap();
        assert_eq!(s.body_bytes_in_flight, 4 * DEFAULT_MAX_BODY_BYTES);
        assert_eq!((s.body_timeout, s.header_timeout), (DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT));
        assert_eq!(s.max_connections, DEFAULT_MAX_CONNECTIONS);
        assert_eq!((s.max_mcp_sessions, s.max_mcp_sessions_per_token), (64, 16));
        let s = settings("max_body_bytes = 4096\nmax_mcp_sessions = 2\nheader_timeout_s = 0.5").unwrap();
        assert_eq!((s.body_bytes_in_flight, s.max_mcp_sessions_per_token), (4 * 4096, 1));
        assert_eq!(s.header_timeout, Duration::from_millis(500));
        for (bad, setting) in [
            ("body_bytes_in_flight = 1000", "body_bytes_in_flight: 1000 bytes is less than max_body_bytes"),
            ("body_timeout_s = 0", "body_timeout_s: 0 is not a number of seconds"),
            ("body_timeout_s = nan", "body_timeout_s"),
            ("header_timeout_s = 601", "header_timeout_s: 601 is not"),
            ("max_connections = 0", "max_connections: 0 is not"),
            ("max_mcp_sessions = 0", "max_mcp_sessions: 0 is not"),
            (
                "max_mcp_sessions_per_token = 65",
                "max_mcp_sessions_per_token: 65 is not a number of sessions from 1 to max_mcp_sessions (64)",
            ),
        ] {
            let error = settings(bad).unwrap_err().to_string();
            assert!(error.contains(setting), "{bad}: {error}");
        }
    }

    #[test]
    fn unknown_settings_and_policy_fields_are_refused() {
        let error = settings("lisen = \"x\"").unwrap_err().to_string();
        assert!(error.contains("lisen"), "{error}");
        let error = settings("[ceiling]\nmemroy_mb = 5").unwrap_err().to_string();
        assert!(error.contains("memroy_mb"), "{error}");
    }

    #[test]
    fn defaults_above_the_ceiling_are_refused_naming_the_field() {
        let error = settings("[ceiling]\ntimeout_s = 5").unwrap_err().to_string();
        assert!(error.starts_with("defaults.timeout_s:"), "{error}");
        settings("[ceiling]\ntimeout_s = 5\n[defaults]\ntimeout_s = 5").unwrap();
    }

    #[test]
    fn tokens_are_hashes_with_unique_names() {
        let hash = token_sha256("s3cret");
        let s = settings(&format!("[[tokens]]\nname = \"bot\"\nsha256 = \"{hash}\"")).unwrap();
        assert_eq!(s.token("s3cret").map(|t| t.name.as_str()), Some("bot"));
        assert!(s.token("s3cre").is_none());
        assert!(s.token("").is_none());
        let error = settings("[[tokens]]\nname = \"bot\"\nsha256 = \"s3cret\"").unwrap_err().to_string();
        assert!(error.contains("tokens[0].sha256") && error.contains("never the token"), "{error}");
        let twice = format!(
            "[[tokens]]\nname = \"a\"\nsha256 = \"{hash}\"\n[[tokens]]\nname = \"a\"\nsha256 = \"{}\"",
            token_sha256("x")
        );
        assert!(settings(&twice).unwrap_err().to_string().contains("tokens[1].name"));
        // The hash does not even reach a Debug print.
        assert!(!format!("{:?}", s.tokens).contains(&hash[..16]));
    }

    #[test]
    fn files_are_read_once_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("sales.csv");
        std::fs::write(&data, "a,b\n1,2\n").unwrap();
        let s = settings(&format!("[[files]]\nhost = {:?}", data.display().to_string())).unwrap();
        assert_eq!(s.files.files()[0].0.to_string(), "/work/sales.csv");
        assert_eq!(&*s.files.files()[0].1, b"a,b\n1,2\n");
        let error = settings(&format!("[[files]]\nhost = {:?}\nsandbox = \"/etc/passwd\"", data.display().to_string()))
            .unwrap_err()
            .to_string();
        assert!(error.contains("/etc/passwd"), "{error}");
        let error = settings("[[files]]\nhost = \"/nonexistent/x.csv\"").unwrap_err().to_string();
        assert!(error.contains("/nonexistent/x.csv"), "{error}");
        assert_eq!(FileConfig::parse("a.csv:/work/b.csv").sandbox.as_deref(), Some("/work/b.csv"));
    }

    #[test]
    fn the_pool_is_off_without_its_section_and_checked_with_it() {
        assert!(settings("").unwrap().pool.is_none());
        assert!(settings("[pool]\nsize = 0").unwrap().pool.is_none());
        let pool = settings("[pool]").unwrap().pool.unwrap();
        assert_eq!(pool, PoolOptions::default());
        let pool = settings(
            "[pool]\nsize = 4\npreload = [\"numpy\", \"matplotlib.pyplot\"]\nidle_expiry_s = 30\nmemory_budget_mb = 300",
        )
            .unwrap()
            .pool
            .unwrap();
        assert_eq!((pool.size, pool.preload.len(), pool.idle_expiry), (4, 2, Duration::from_secs(30)));
        assert_eq!(pool.memory_budget, Some(300 << 20));
        let pool = settings("[pool]\nenv_at_claim = [\"TASK_ID\"]").unwrap().pool.unwrap();
        assert_eq!(pool.env_at_claim, ["TASK_ID"]);
        assert_eq!(settings("[pool]\nmode = \"forked\"").unwrap().pool.unwrap().mode, PoolMode::Forked);
        for (bad, setting) in [
            ("size = 1000", "pool.size"),
            ("preload = [\"os; import x\"]", "pool.preload"),
            ("preload = [\"\"]", "pool.preload"),
            ("idle_expiry_s = 0", "pool.idle_expiry_s"),
            ("memory_budget_mb = 0", "pool.memory_budget_mb"),
            ("env_at_claim = [\"PYTHONPATH\"]", "PYTHON* variables at its start"),
            ("env_at_claim = [\"TASK_ID\", \"OMP_NUM_THREADS\"]", "\"OMP_NUM_THREADS\" cannot be set at a claim"),
            ("env_at_claim = [\"A=B\"]", "not a variable's name"),
            ("mode = \"fork\"", "use \"pooled\" or \"forked\""),
        ] {
            let error = settings(&format!("[pool]\n{bad}")).unwrap_err().to_string();
            assert!(error.contains(setting), "{bad}: {error}");
        }
    }
}
