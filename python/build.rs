//! Builds the sandbox helper, `airlock-init`, so that the extension module
//! can carry it: `pip install ./python` then needs nothing beside the wheel.
//!
//! Cargo cannot depend on another package's binary, so this runs a second
//! cargo on the helper's package, in a target folder of its own (the outer
//! build holds a lock on its own), for the same target triple, in release.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    if let Err(message) = build_helper() {
        // A build script reports failure by panicking; say what to do.
        panic!("building the sandbox helper airlock-init failed: {message}");
    }
}

fn build_helper() -> Result<(), String> {
    let var = |name: &str| env::var(name).map_err(|_| format!("cargo did not set {name}"));
    let manifest_dir = PathBuf::from(var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(var("OUT_DIR")?);
    let target = var("TARGET")?;
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());

    let workspace = manifest_dir.parent().ok_or("the crate has no parent folder")?;
    let helper_manifest = workspace.join("crates/airlock-linux/Cargo.toml");
    if !helper_manifest.is_file() {
        return Err(format!(
            "{} is missing: build the package from a checkout of the airlock repository",
            helper_manifest.display()
        ));
    }
    for watched in ["crates/airlock-linux", "crates/airlock-core", "crates/airlock-policy", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", workspace.join(watched).display());
    }

    let target_dir = out_dir.join("helper-target");
    let status = Command::new(&cargo)
        .arg("build")
        .arg("--release")
        .arg("--manifest-path")
        .arg(&helper_manifest)
        .args(["--bin", "airlock-init", "--target", &target])
        .arg("--target-dir")
        .arg(&target_dir)
        // The outer build's flags and wrappers are for the extension module
        // (and, under `cargo clippy`, for linting it), not for the helper.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        // It travels inside the extension module: no symbols, no debug info.
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .status()
        .map_err(|e| format!("running {cargo}: {e}"))?;
    if !status.success() {
        return Err(format!("`{cargo} build -p airlock-linux --bin airlock-init` exited with {status}"));
    }
    let built = target_dir.join(&target).join("release/airlock-init");
    copy(&built, &out_dir.join("airlock-init"))
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::copy(from, to).map(drop).map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))
}
