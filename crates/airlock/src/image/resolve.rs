//! `airlock image lock`: loose requirements resolved into a lock by uv, in
//! a sandbox whose only network is the package index, every file of the
//! result pinned by its hash and checked on the host.

use std::collections::BTreeSet;
use std::time::Duration;

use airlock_core::RuntimeMount;
use airlock_policy::RunRecord;

use super::ImageStore;
use super::fetch::{self, shell_quote};
use super::lock::{Lock, dependencies_from_annotations};
use super::step::{Step, StepLimits};
use super::uv::{self, UV_DIR, UV_VERSION};
use crate::Error;
use crate::interpreter::Interpreter;

/// How to resolve.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockOptions {
    /// The interpreter to resolve for (a name on PATH, or a path).
    pub python: String,
    /// Resolve for every Python from this interpreter's version up and
    /// every Linux platform (a lock to check in), not only this interpreter.
    pub universal: bool,
    /// Let the lock name source distributions where a package has no wheel.
    pub allow_source_builds: bool,
    /// A base image's lock: its versions constrain the resolution, and its
    /// packages are left out (a vetted set of extra packages for it).
    pub base: Option<String>,
}

/// A resolved lock, and the record of the step that resolved it.
#[derive(Clone, Debug)]
pub struct Locked {
    pub lock: Lock,
    pub record: RunRecord,
}

impl ImageStore {
    /// Resolves `requirements` (a requirements.txt's text) into a lock.
    pub fn lock(&self, requirements: &str, options: &LockOptions) -> Result<Locked, Error> {
        let fail = |reason: String| Error::ImageBuild { name: String::new(), reason: format!("locking: {reason}") };
        let python = Interpreter::resolve(&options.python)?;
        let base = options.base.as_deref().map(Lock::parse).transpose()?;
        let tools = self.toolbox()?;
        let (steps, index, cache, uv_root) = (tools.steps(), &tools.index, &tools.cache, &tools.uv_root);
        let wanted: Vec<_> = uv::wanted(uv_root)?.into_iter().collect();
        fetch::ensure(cache, &wanted, index, &python, &steps)?;
        let uv = uv::binary_dir(uv_root, cache)?;

        let mut runtime = python.runtime();
        runtime.describe = "an image lock's resolve step".to_owned();
        runtime.mounts.push(RuntimeMount::read_only(&uv, UV_DIR));
        let ca = fetch::mount_ca_bundle(&mut runtime)?;
        let constraints: String =
            base.iter().flat_map(|b| b.packages.iter()).map(|p| format!("{}=={}\n", p.name, p.version)).collect();
        let short_version: String = python.version.split('.').take(2).collect::<Vec<_>>().join(".");
        let mut common = format!(
            "--quiet --no-header --system-certs --default-index {} --python {}",
            shell_quote(&index.url),
            shell_quote(&python.executable_inside().display().to_string())
        );
        if options.universal {
            common.push_str(&format!(" --universal --python-version {short_version}"));
        }
        if !options.allow_source_builds {
            common.push_str(" --only-binary :all:");
        }
        if base.is_some() {
            common.push_str(" -c /work/constraints.txt");
        }
        let script = format!(
            "set -eu\n\
             uv={UV_DIR}/uv\n\
             export UV_CACHE_DIR=/tmp/uv-cache UV_NO_CONFIG=1 UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1 SSL_CERT_FILE={ca}\n\
             \"$uv\" pip compile /work/requirements.in {common} --format pylock.toml -o /work/pylock.toml\n\
             \"$uv\" pip compile /work/requirements.in {common} --annotation-style line -o /work/annotated.txt\n"
        );
        let step = Step {
            what: "lock",
            limits: StepLimits {
                wall_time: Duration::from_secs(600),
                hosts: index.allow_hosts(),
                bytes_in: 1 << 30,
                disk_bytes: 1 << 30,
            },
            runtime,
            inputs: vec![
                ("/work/requirements.in".to_owned(), requirements.as_bytes().to_vec()),
                ("/work/constraints.txt".to_owned(), constraints.into_bytes()),
            ],
            script,
            outputs: vec![("/work/pylock.toml", 64 << 20), ("/work/annotated.txt", 16 << 20)],
        };
        let outcome = steps.run(step).map_err(fail)?;
        let text = outcome.outputs.get("/work/pylock.toml").ok_or_else(|| fail("uv wrote no lock".to_owned()))?;
        let text = String::from_utf8(text.clone()).map_err(|_| fail("uv's lock is not UTF-8".to_owned()))?;
        let mut lock = Lock::parse(&text)?;
        if options.universal {
            // Images run on Linux, on the architectures airlock pins uv for:
            // other platforms' wheels are noise in a lock to check in.
            lock.retain_wheels(|wheel| {
                wheel.tags.iter().any(|(_, _, platform)| {
                    platform == "any"
                        || (platform.contains("linux")
                            && (platform.ends_with("_x86_64") || platform.ends_with("_aarch64")))
                })
            });
        }
        let annotated = outcome.outputs.get("/work/annotated.txt").map(|a| String::from_utf8_lossy(a).into_owned());
        let needs = dependencies_from_annotations(annotated.as_deref().unwrap_or(""));
        for package in &mut lock.packages {
            package.dependencies = needs.get(&package.name).map(|d| d.iter().cloned().collect()).unwrap_or_default();
        }
        if let Some(base) = &base {
            let in_base: BTreeSet<&str> = base.packages.iter().map(|p| p.name.as_str()).collect();
            lock.packages.retain(|p| !in_base.contains(p.name.as_str()));
            for package in &mut lock.packages {
                package.dependencies.retain(|d| !in_base.contains(d.as_str()));
            }
        }
        if let Some(empty) = lock.packages.iter().find(|p| p.wheels.is_empty() && p.sdist.is_none()) {
            return Err(fail(format!("{} {} has no Linux wheel", empty.name, empty.version)));
        }
        Ok(Locked { lock, record: outcome.record })
    }
}

/// The comment a lock written by `airlock image lock` opens with.
pub fn lock_header(source: &str, index: &str) -> String {
    format!(
        "Made by `airlock image lock {source}`: resolved by uv {UV_VERSION} in a sandbox whose only network was\n\
         {index}; every file is pinned by its SHA-256, which each build checks. Edit {source}, not this."
    )
}
