//! Provides the binaries the extension module carries, so that `pip install
//! ./python` needs nothing beside the wheel: the sandbox helper,
//! `airlock-init`, and the native library a forked pool's template loads,
//! `libairlock_fork.so`, as airlock-build provides them to every front door
//! (the profile folder's copy when fresh, else a nested build; the helper
//! static where the musl target is installed). The copies land in OUT_DIR,
//! where python/src/helper.rs embeds them from, stripped of symbols and
//! debug info: they travel inside the module.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap_or_default());
    let Some(workspace) = manifest_dir.parent() else {
        panic!("the Python package's folder has no parent: build it from a checkout of the airlock repository");
    };
    for shipped in [&airlock_build::HELPER, &airlock_build::FORK_LIBRARY] {
        let copy = out_dir.join(shipped.binary);
        let provided = airlock_build::provide(workspace, shipped).and_then(|built| {
            std::fs::copy(&built, &copy).map(drop).map_err(|e| format!("copying {} to OUT_DIR: {e}", built.display()))
        });
        if let Err(message) = provided {
            // A build script reports failure by panicking; say what to do.
            panic!("providing {} for the Python package failed: {message}", shipped.binary);
        }
        // Strip when a strip is there; an unstripped binary works the same. (A
        // shared library keeps its dynamic symbols, which ctypes looks up.)
        let _ = Command::new("strip").arg(&copy).status();
    }
}
