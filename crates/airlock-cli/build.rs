//! Puts the sandbox helper, `airlock-init`, beside the `airlock` command in
//! this build's profile folder, where the command finds it: as airlock-build
//! provides it to every front door (static where the musl target is
//! installed, since each cold run starts it twice).

use std::env;
use std::path::PathBuf;

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let provided = manifest_dir
        .ancestors()
        .nth(2)
        .ok_or_else(|| "the command's folder is not crates/airlock-cli".to_owned())
        .and_then(|workspace| airlock_build::provide(workspace, &airlock_build::HELPER))
        .and_then(|built| {
            let beside = airlock_build::profile_dir()?.join(airlock_build::HELPER.binary);
            airlock_build::install(&built, &beside)
        });
    if let Err(message) = provided {
        // A build script reports failure by panicking; say what to do.
        panic!("providing airlock-init beside the command failed: {message}");
    }
}
