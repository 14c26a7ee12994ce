//! Provides the binaries the extension module carries, so that `pip install
//! ./python` needs nothing beside the wheel: the sandbox helper,
//! `airlock-init`, and the native library a forked pool's template loads,
//! `libairlock_fork.so`. Every binary in [`SHIPPED`] is found the same way:
//!
//! 1. the workspace's own build of it (`cargo build --release` puts it in
//!    the same profile folder this build uses), when it is newer than every
//!    source it is built from: the usual case, and it costs nothing;
//! 2. else a build of its package here (`cargo build --release -p PACKAGE`
//!    with `--bin NAME` or `--lib`), in `target/shipped-binaries` (kept
//!    between builds, so a rebuild is warm), for the same target triple.
//!
//! Either way the copy is stripped of symbols and debug info: it travels
//! inside the module. Cargo cannot depend on another package's binary, and a
//! nested cargo cannot use this build's target folder (this build holds its
//! lock), hence the folder of its own.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

/// One binary the module carries.
struct Shipped {
    /// The package that builds it (crates/PACKAGE).
    package: &'static str,
    /// Which of the package's targets it is: `["--bin", NAME]` or `["--lib"]`.
    cargo_target: &'static [&'static str],
    /// Its file name in the profile folder, and in OUT_DIR, where
    /// python/src/helper.rs embeds it from.
    binary: &'static str,
}

const SHIPPED: &[Shipped] = &[
    Shipped { package: "airlock-linux", cargo_target: &["--bin", "airlock-init"], binary: "airlock-init" },
    Shipped { package: "airlock-fork", cargo_target: &["--lib"], binary: "libairlock_fork.so" },
];

/// What every shipped binary is built from beside its own package, below
/// the workspace: airlock-linux and what it builds on.
const COMMON_SOURCES: &[&str] =
    &["crates/airlock-linux", "crates/airlock-core", "crates/airlock-policy", "crates/airlock-net", "Cargo.lock"];

fn main() {
    for shipped in SHIPPED {
        if let Err(message) = provide(shipped) {
            // A build script reports failure by panicking; say what to do.
            panic!("providing {} for the Python package failed: {message}", shipped.binary);
        }
    }
}

fn provide(shipped: &Shipped) -> Result<(), String> {
    let Shipped { package, cargo_target, binary } = *shipped;
    let own_sources = format!("crates/{package}");
    let sources: Vec<&str> = std::iter::once(own_sources.as_str())
        .chain(COMMON_SOURCES.iter().copied().filter(|source| *source != own_sources))
        .collect();
    let var = |name: &str| env::var(name).map_err(|_| format!("cargo did not set {name}"));
    let manifest_dir = PathBuf::from(var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(var("OUT_DIR")?);
    let workspace = manifest_dir.parent().ok_or("the crate has no parent folder")?;
    let manifest = workspace.join("crates").join(package).join("Cargo.toml");
    if !manifest.is_file() {
        return Err(format!(
            "{} is missing: build the package from a checkout of the airlock repository",
            manifest.display()
        ));
    }
    for source in &sources {
        println!("cargo:rerun-if-changed={}", workspace.join(source).display());
    }
    // OUT_DIR is <profile folder>/build/<package>-<hash>/out.
    let profile_dir = out_dir.ancestors().nth(3).ok_or("OUT_DIR is not where cargo puts it")?;
    let workspace_build = profile_dir.join(binary);
    println!("cargo:rerun-if-changed={}", workspace_build.display());
    let newest_source = sources.iter().filter_map(|s| newest(&workspace.join(s))).max();
    let fresh = modified(&workspace_build).zip(newest_source).is_some_and(|(built, source)| built > source);
    let built = if fresh { workspace_build } else { build_here(&manifest, cargo_target, binary, profile_dir)? };
    let copy = out_dir.join(binary);
    std::fs::copy(&built, &copy).map_err(|e| format!("copying {} to {}: {e}", built.display(), copy.display()))?;
    // Strip when a strip is there; an unstripped binary works the same. (A
    // shared library keeps its dynamic symbols, which ctypes looks up.)
    let _ = Command::new("strip").arg(&copy).status();
    Ok(())
}

fn build_here(manifest: &Path, cargo_target: &[&str], binary: &str, profile_dir: &Path) -> Result<PathBuf, String> {
    let target = env::var("TARGET").map_err(|_| "cargo did not set TARGET")?;
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let target_dir = profile_dir.parent().unwrap_or(profile_dir).join("shipped-binaries");
    let status = Command::new(&cargo)
        .arg("build")
        .arg("--release")
        .arg("--manifest-path")
        .arg(manifest)
        .args(cargo_target)
        .args(["--target", &target])
        .arg("--target-dir")
        .arg(&target_dir)
        // The outer build's flags and wrappers are for the extension module
        // (and, under `cargo clippy`, for linting it), not for the helper.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .status()
        .map_err(|e| format!("running {cargo}: {e}"))?;
    if !status.success() {
        return Err(format!(
            "`{cargo} build --manifest-path {} {}` exited with {status}",
            manifest.display(),
            cargo_target.join(" ")
        ));
    }
    Ok(target_dir.join(&target).join("release").join(binary))
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The newest modification time of `path` or anything below it.
fn newest(path: &Path) -> Option<SystemTime> {
    let own = modified(path);
    let below = std::fs::read_dir(path).into_iter().flatten().flatten().filter_map(|entry| newest(&entry.path())).max();
    own.into_iter().chain(below).max()
}
