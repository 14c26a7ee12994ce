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
    // The filter is for the target, which a cross build tells apart from the
    // machine running this script: both architectures' tables are compiled in.
    let target = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let arch = seccomp::Arch::from_target(&target)
        .unwrap_or_else(|| panic!("airlock-linux has seccomp syscall tables for x86_64 and aarch64, not {target}"));
    let policy = seccomp::Policy::default_policy(arch).unwrap_or_else(|e| panic!("seccomp/default.toml: {e}"));
    let program = seccomp::compile(&policy).unwrap_or_else(|e| panic!("compiling seccomp/default.toml: {e}"));
    let bytes = seccomp::Instruction::to_bytes(&program);
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("default-seccomp.bpf");
    std::fs::write(&out, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
}
