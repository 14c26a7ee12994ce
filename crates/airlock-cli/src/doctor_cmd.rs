//! `airlock doctor`: what this host can enforce, per backend, and for each
//! missing piece the exact fix. The fix printed here is the very text a
//! refused run shows (both come from the backend's probe), so a user who
//! hits a refusal and runs `airlock doctor` reads the same instruction.

use std::process::ExitCode;

use airlock::image::{DEFAULT_IMAGE, ImageStore};
use airlock::{BackendKind, Policy};

/// Prints the report; exits 0 only if the default policy can run on the
/// default backend (linux) as this user, here.
pub fn run() -> anyhow::Result<ExitCode> {
    let default_runs = report_backend(BackendKind::Linux, true)?;
    report_backend(BackendKind::Wasm, false)?;
    report_images();
    println!();
    if default_runs {
        println!("ok: the default policy can run here (linux backend)");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("not ok: the default policy cannot run here; apply the fixes above, then run `airlock doctor` again");
        Ok(ExitCode::from(1))
    }
}

/// Prints one backend's layers and facts; returns whether the default
/// policy passes its check.
fn report_backend(kind: BackendKind, is_default: bool) -> anyhow::Result<bool> {
    let backend = airlock::backend_for(kind)?;
    let probe = backend.probe()?;
    println!("{kind} backend{}", if is_default { " (the default)" } else { "" });
    for (key, value) in &probe.details {
        println!("  {key:<22} {value}");
    }
    let available: Vec<&str> = probe.available.iter().map(|l| l.name()).collect();
    println!("  {:<22} {}", "enforces", if available.is_empty() { "nothing".to_owned() } else { available.join(", ") });
    for (layer, why) in &probe.missing {
        println!("  missing {layer}: {why}");
    }
    let verdict = probe.check(&Policy::default());
    match &verdict {
        Ok(_) => println!("  the default policy: can run"),
        Err(error) => println!("  the default policy: refused: {error}"),
    }
    Ok(verdict.is_ok())
}

/// The images runs of the linux backend use: the default is built on first
/// use, which needs PyPI; say whether it is there yet.
fn report_images() {
    println!("images");
    let store = match ImageStore::open_default() {
        Ok(store) => store,
        Err(error) => {
            println!("  cannot open the image store: {error}");
            return;
        }
    };
    match store.list() {
        Ok(images) => {
            if !images.iter().any(|i| i.as_ref().is_ok_and(|i| i.name == DEFAULT_IMAGE)) {
                println!(
                    "  {DEFAULT_IMAGE:<22} not built: the first Python run builds it (a few minutes, needs PyPI), \
                     or `airlock image build {DEFAULT_IMAGE}` now"
                );
            }
            for image in images {
                match image {
                    Ok(i) => println!("  {:<22} {} (Python {})", i.name, i.manifest.hash, i.manifest.python.version),
                    Err(error) => println!("  unusable: {error}"),
                }
            }
        }
        Err(error) => println!("  cannot list the images: {error}"),
    }
}
