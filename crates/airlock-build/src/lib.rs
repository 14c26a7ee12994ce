//! How airlock's front doors get the binaries they ship: the sandbox helper,
//! `airlock-init`, and the forked mode's native library,
//! `libairlock_fork.so`. The `airlock` command finds them beside itself; the
//! Python module carries them inside. Both get them here, from their build
//! scripts, the same way:
//!
//! 1. the copy already in the build's profile folder (`target/release`),
//!    when it is newer than every source it is built from (and, for the
//!    helper where the musl target is installed, static): the usual case,
//!    and it costs nothing;
//! 2. else a build of its package by a nested cargo, `cargo build --release
//!    -p PACKAGE`, in `target/shipped-binaries` (kept between builds, so a
//!    rebuild is warm; a nested cargo cannot use the outer build's target
//!    folder, whose lock that build holds).
//!
//! The helper is built for the host's musl target where that target's
//! standard library is installed (`rustup target add
//! x86_64-unknown-linux-musl`), static: it starts without a dynamic loader
//! and without glibc's start-up, which probes the CPU's caches with `cpuid`
//! again and again, each one a trap in a virtual machine. Measured here, a
//! start of the glibc helper costs 1.1 to 1.6 ms of CPU, of the static musl
//! one 0.15 ms (`perf stat -r 300`), and a cold `airlock run` starts two.
//! Elsewhere, or where that build fails (a cross build without a musl
//! linker), it is built for the host's own target, as before, with a build
//! warning. (The profile folder is found from OUT_DIR, as cargo lays it out
//! by default: a `build-dir` of its own would need another way.)
//!
//! Cargo cannot depend on another package's binary, hence a nested cargo;
//! and the helper's own `[[bin]]` needs the feature `helper-bin`, so that the
//! workspace's own build does not also link one into the same folder.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

/// One binary a front door ships.
#[derive(Debug)]
pub struct Shipped {
    /// The package that builds it (crates/PACKAGE).
    pub package: &'static str,
    /// Which of the package's targets it is (`["--bin", NAME]` or
    /// `["--lib"]`), with the features it needs.
    pub cargo_target: &'static [&'static str],
    /// Its file name in the profile folder.
    pub binary: &'static str,
    /// Whether it is built static, for musl, where that target is installed.
    pub static_where_possible: bool,
}

/// The sandbox helper.
pub const HELPER: Shipped = Shipped {
    package: "airlock-linux",
    cargo_target: &["--bin", "airlock-init", "--features", "helper-bin"],
    binary: "airlock-init",
    static_where_possible: true,
};

/// The forked mode's native library (loaded by Python, so for the host's
/// own C library).
pub const FORK_LIBRARY: Shipped = Shipped {
    package: "airlock-fork",
    cargo_target: &["--lib"],
    binary: "libairlock_fork.so",
    static_where_possible: false,
};

/// What every shipped binary is built from beside its own package, below
/// the workspace: airlock-linux and what it builds on.
const COMMON_SOURCES: &[&str] =
    &["crates/airlock-linux", "crates/airlock-core", "crates/airlock-policy", "crates/airlock-net", "Cargo.lock"];

/// A fresh build of `shipped`, for the build script of a package of
/// `workspace`: the copy in the profile folder, or a nested build's.
pub fn provide(workspace: &Path, shipped: &Shipped) -> Result<PathBuf, String> {
    let own_sources = format!("crates/{}", shipped.package);
    let sources: Vec<&str> = std::iter::once(own_sources.as_str())
        .chain(COMMON_SOURCES.iter().copied().filter(|source| *source != own_sources))
        .collect();
    let manifest = workspace.join(&own_sources).join("Cargo.toml");
    if !manifest.is_file() {
        return Err(format!(
            "{} is missing: build the package from a checkout of the airlock repository",
            manifest.display()
        ));
    }
    for source in &sources {
        println!("cargo:rerun-if-changed={}", workspace.join(source).display());
    }
    let in_profile = profile_dir()?.join(shipped.binary);
    println!("cargo:rerun-if-changed={}", in_profile.display());
    let newest_source = sources.iter().filter_map(|s| newest(&workspace.join(s))).max();
    let host = env::var("TARGET").map_err(|_| "cargo did not set TARGET")?;
    // The musl target this binary would be built for, and whether it is here.
    let twin = musl_twin(&host).filter(|_| shipped.static_where_possible);
    let musl = twin.clone().filter(|musl| target_installed(musl));
    let fresh = modified(&in_profile).zip(newest_source).is_some_and(|(built, source)| built > source);
    if fresh && (musl.is_none() || is_static(&in_profile)) {
        return Ok(in_profile);
    }
    if let Some(musl) = &musl {
        match build_nested(&manifest, shipped, musl) {
            Ok(built) => return Ok(built),
            Err(why) => {
                println!("cargo:warning={} is built for {host}: its build for {musl} failed: {why}", shipped.binary)
            }
        }
    } else if let Some(musl) = twin {
        println!(
            "cargo:warning={} is built for {host}: `rustup target add {musl}` makes it static, and its every \
             start about a millisecond faster",
            shipped.binary
        );
    }
    build_nested(&manifest, shipped, &host)
}

/// The profile folder of the build this script is part of (`target/release`).
pub fn profile_dir() -> Result<PathBuf, String> {
    // OUT_DIR is <profile folder>/build/<package>-<hash>/out.
    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|_| "cargo did not set OUT_DIR")?);
    out_dir.ancestors().nth(3).map(Path::to_path_buf).ok_or_else(|| "OUT_DIR is not where cargo puts it".to_owned())
}

/// Copies `built` to `to`, whole or not at all (a program may be about to
/// run the copy at `to`).
pub fn install(built: &Path, to: &Path) -> Result<(), String> {
    if built == to {
        return Ok(());
    }
    let staged = to.with_extension(format!("{}.partial", std::process::id()));
    std::fs::copy(built, &staged)
        .and_then(|_| std::fs::rename(&staged, to))
        .map_err(|e| format!("copying {} to {}: {e}", built.display(), to.display()))
}

/// Builds `shipped` for `target` with a nested cargo; the binary's path.
fn build_nested(manifest: &Path, shipped: &Shipped, target: &str) -> Result<PathBuf, String> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let profile_dir = profile_dir()?;
    let target_dir = profile_dir.parent().unwrap_or(&profile_dir).join("shipped-binaries");
    let status = Command::new(&cargo)
        .arg("build")
        .arg("--release")
        .arg("--manifest-path")
        .arg(manifest)
        .args(shipped.cargo_target)
        .args(["--target", target])
        .arg("--target-dir")
        .arg(&target_dir)
        // The outer build's flags and wrappers are for the package being
        // built (and, under `cargo clippy`, for linting it), not for this.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .status()
        .map_err(|e| format!("running {cargo}: {e}"))?;
    if !status.success() {
        return Err(format!(
            "`{cargo} build --manifest-path {} {} --target {target}` exited with {status}",
            manifest.display(),
            shipped.cargo_target.join(" ")
        ));
    }
    Ok(target_dir.join(target).join("release").join(shipped.binary))
}

/// Whether the ELF file at `path` asks for no program interpreter: a
/// static executable. Anything unreadable counts as not.
fn is_static(path: &Path) -> bool {
    // The 64-bit little-endian layout (x86-64, AArch64): the program
    // headers' offset, size and count in the file header; PT_INTERP is 3.
    const PT_INTERP: u32 = 3;
    let Ok(bytes) = std::fs::read(path) else { return false };
    let number = |at: usize, width: usize| -> Option<u64> {
        let slice = bytes.get(at..at + width)?;
        Some(slice.iter().rev().fold(0u64, |n, byte| (n << 8) | u64::from(*byte)))
    };
    if bytes.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        return false;
    }
    let (Some(offset), Some(size), Some(count)) = (number(0x20, 8), number(0x36, 2), number(0x38, 2)) else {
        return false;
    };
    (0..count).all(|i| {
        usize::try_from(offset + i * size)
            .ok()
            .and_then(|at| number(at, 4))
            .is_some_and(|kind| kind != u64::from(PT_INTERP))
    })
}

/// `x86_64-unknown-linux-musl` for `x86_64-unknown-linux-gnu`.
fn musl_twin(target: &str) -> Option<String> {
    target.strip_suffix("-linux-gnu").map(|arch| format!("{arch}-linux-musl"))
}

/// Whether the standard library for `target` is installed beside the compiler.
fn target_installed(target: &str) -> bool {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let Ok(output) = Command::new(rustc).args(["--print", "target-libdir", "--target", target]).output() else {
        return false;
    };
    let libdir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    output.status.success()
        && std::fs::read_dir(libdir).is_ok_and(|entries| {
            entries.flatten().any(|entry| entry.file_name().to_string_lossy().starts_with("libstd-"))
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_static_executable_is_told_from_a_dynamic_one() {
        // This test's own binary asks for the loader; a file that is no ELF
        // counts as not static either.
        let own = std::env::current_exe().unwrap_or_default();
        assert!(!is_static(&own), "{}", own.display());
        assert!(!is_static(Path::new("/nonexistent")));
        let dir = std::env::temp_dir().join(format!("airlock-build-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        // A minimal ELF64 header with one PT_LOAD program header: static.
        let mut elf = vec![0u8; 64 + 56];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20] = 64; // e_phoff
        elf[0x36] = 56; // e_phentsize
        elf[0x38] = 1; // e_phnum
        elf[64] = 1; // PT_LOAD
        let file = dir.join("static");
        std::fs::write(&file, &elf).unwrap_or_default();
        assert!(is_static(&file));
        elf[64] = 3; // PT_INTERP
        std::fs::write(&file, &elf).unwrap_or_default();
        assert!(!is_static(&file));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_musl_twin_of_a_gnu_linux_target_only() {
        assert_eq!(musl_twin("x86_64-unknown-linux-gnu").as_deref(), Some("x86_64-unknown-linux-musl"));
        assert_eq!(musl_twin("aarch64-unknown-linux-gnu").as_deref(), Some("aarch64-unknown-linux-musl"));
        assert_eq!(musl_twin("x86_64-unknown-linux-musl"), None);
        assert_eq!(musl_twin("x86_64-apple-darwin"), None);
    }
}
