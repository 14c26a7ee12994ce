//! Compiles the seccomp policies (seccomp/default.toml, and the forked
//! mode's template: the default widened by seccomp/template.toml) to BPF at
//! build time, as Firecracker does, so no run pays for parsing and compiling
//! them. The policy files stay the source of truth: a test compiles them
//! again at run time and checks the programs are the same.

#[allow(dead_code, unused_imports)]
#[path = "src/seccomp/mod.rs"]
mod seccomp;

/// What `seccomp::default_program` and `seccomp::template_program` read in
/// the library; the build script is what makes them, so here they are empty.
#[allow(dead_code)]
const DEFAULT_SECCOMP_BPF: &[u8] = &[];
#[allow(dead_code)]
const TEMPLATE_SECCOMP_BPF: &[u8] = &[];

fn main() {
    println!("cargo:rerun-if-changed=seccomp/default.toml");
    println!("cargo:rerun-if-changed=seccomp/template.toml");
    println!("cargo:rerun-if-changed=src/seccomp");
    // The filter is for the target, which a cross build tells apart from the
    // machine running this script: both architectures' tables are compiled in.
    let target = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let arch = seccomp::Arch::from_target(&target)
        .unwrap_or_else(|| panic!("airlock-linux has seccomp syscall tables for x86_64 and aarch64, not {target}"));
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default());
    let policies = [
        ("seccomp/default.toml", "default-seccomp.bpf", seccomp::Policy::default_policy(arch)),
        ("seccomp/template.toml", "template-seccomp.bpf", seccomp::Policy::template_policy(arch)),
    ];
    for (source, file, policy) in policies {
        let policy = policy.unwrap_or_else(|e| panic!("{source}: {e}"));
        let program = seccomp::compile(&policy).unwrap_or_else(|e| panic!("compiling {source}: {e}"));
        let out = out.join(file);
        std::fs::write(&out, seccomp::Instruction::to_bytes(&program))
            .unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    }
}
