//! Compiles the seccomp policy (seccomp/default.toml) to BPF at build time,
//! as Firecracker does, so no run pays for parsing and compiling it. The
//! policy file stays the source of truth: a test compiles it again at run
//! time and checks the two programs are the same.

#[allow(dead_code, unused_imports)]
#[path = "src/seccomp/mod.rs"]
mod seccomp;

/// What `seccomp::default_program` reads in the library; the build script
/// is what makes it, so here it is empty.
#[allow(dead_code)]
const DEFAULT_SECCOMP_BPF: &[u8] = &[];

fn main() {
    println!("cargo:rerun-if-changed=seccomp/default.toml");
    println!("cargo:rerun-if-changed=src/seccomp");
    // The syscall tables are chosen by #[cfg(target_arch)], which in a build
    // script is the build machine's: refuse to build a filter for another.
    let target = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    assert_eq!(
        target,
        std::env::consts::ARCH,
        "airlock-linux compiles its seccomp filter at build time and cannot yet cross-compile it"
    );
    let policy = seccomp::Policy::default_policy().unwrap_or_else(|e| panic!("seccomp/default.toml: {e}"));
    let program = seccomp::compile(&policy).unwrap_or_else(|e| panic!("compiling seccomp/default.toml: {e}"));
    let bytes = seccomp::Instruction::to_bytes(&program);
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("default-seccomp.bpf");
    std::fs::write(&out, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
}
