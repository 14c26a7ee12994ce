//! `airlock image`.

use std::path::PathBuf;
use std::process::ExitCode;

use airlock::RunRecord;
use airlock::image::{
    BuildEvent, BuildOptions, DEFAULT_IMAGE, DEFAULT_LOCK, ImageStore, LockOptions, PackageIndex, lock_header,
};
use anyhow::{Context, bail};
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build an image from a lock, inside a sandbox: every file checked
    /// against its hash, no package code run on this host.
    Build {
        /// The image's name.
        name: String,
        /// The host interpreter to build for [default: python3 on PATH].
        #[arg(long, value_name = "INTERPRETER", default_value = "python3")]
        python: String,
        /// The lock (a pylock.toml, made with `airlock image lock`) [default: python-data's].
        #[arg(long, value_name = "FILE")]
        lock: Option<PathBuf>,
        #[command(flatten)]
        fetch: FetchArgs,
        /// Replaced by --lock: images are built from a lock now.
        #[arg(long, value_name = "FILE", hide = true)]
        requirements: Option<PathBuf>,
    },
    /// Resolve loose requirements into a lock (a pylock.toml), inside a
    /// sandbox whose only network is the package index.
    Lock {
        /// A requirements.txt with the packages wanted.
        requirements: PathBuf,
        /// Where to write the lock [default: standard output].
        #[arg(short = 'o', long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// The host interpreter to resolve for [default: python3 on PATH].
        #[arg(long, value_name = "INTERPRETER", default_value = "python3")]
        python: String,
        /// Lock for every Python from this one's version up, on any Linux (a lock to check in).
        #[arg(long)]
        universal: bool,
        /// Lock extra packages for this image: its versions hold, its packages are left out.
        #[arg(long, value_name = "IMAGE")]
        base: Option<String>,
        #[command(flatten)]
        fetch: FetchArgs,
    },
    /// Set the extra packages runs in an image may ask for (`airlock run --with`): a lock made with `--base`.
    Vet { name: String, lock: PathBuf },
    /// Re-hash every file of an image and name any that changed since it was built.
    Verify { name: String },
    /// List the images.
    List,
    /// Show an image: its Python, every package and version, its size, what it was built with.
    Show { name: String },
    /// Remove an image.
    Rm { name: String },
}

/// Where packages come from.
#[derive(Debug, clap::Args)]
pub struct FetchArgs {
    /// The package index (its simple API) [default: the host's pip or uv
    /// configuration, else PyPI]. The build's sandbox may reach it and nothing else.
    #[arg(long, value_name = "URL")]
    index_url: Option<String>,
    /// Build source distributions for packages without a wheel (inside the sandbox).
    #[arg(long)]
    allow_source_builds: bool,
}

pub fn run(command: ImageCommand) -> anyhow::Result<ExitCode> {
    let store = ImageStore::open_default()?;
    let with_index = |fetch: &FetchArgs| -> anyhow::Result<ImageStore> {
        Ok(store.clone().with_index(PackageIndex::from_operator(fetch.index_url.as_deref())?))
    };
    match command {
        ImageCommand::Build { requirements: Some(_), .. } => bail!(
            "images are built from a lock now, every file pinned by its hash: make one with `airlock image lock \
             REQUIREMENTS -o pylock.toml`, then `airlock image build NAME --lock pylock.toml`"
        ),
        ImageCommand::Build { name, python, lock, fetch, requirements: None } => {
            let lock = match &lock {
                Some(path) => std::fs::read_to_string(path).with_context(|| format!("--lock {}", path.display()))?,
                None if name == DEFAULT_IMAGE => DEFAULT_LOCK.to_owned(),
                None => bail!("give the lock with --lock FILE (only {DEFAULT_IMAGE} has one built in)"),
            };
            let options = BuildOptions { python, lock, allow_source_builds: fetch.allow_source_builds };
            let built = with_index(&fetch)?.build(&name, &options, &mut show_progress)?;
            for record in &built.records {
                eprintln!("{}", step_summary(record));
            }
            let image = &built.image;
            println!("{} {} ({:.0} MiB)", image.name, image.manifest.hash, mib(image.manifest.size_bytes));
        }
        ImageCommand::Lock { requirements, output, python, universal, base, fetch } => {
            let text = std::fs::read_to_string(&requirements)
                .with_context(|| format!("reading {}", requirements.display()))?;
            let base = match base.as_deref() {
                None => None,
                Some(DEFAULT_IMAGE) => Some(DEFAULT_LOCK.to_owned()),
                Some(name) => {
                    let image = store.get(name)?;
                    let path = image.dir.join("lock.toml");
                    Some(std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?)
                }
            };
            let options = LockOptions { python, universal, allow_source_builds: fetch.allow_source_builds, base };
            let store = with_index(&fetch)?;
            let locked = store.lock(&text, &options)?;
            eprintln!("{}", step_summary(&locked.record));
            let source = requirements.display().to_string();
            let written = locked.lock.to_toml(&lock_header(&source, &store.index()?.url));
            match output {
                Some(path) => {
                    std::fs::write(&path, written).with_context(|| format!("writing {}", path.display()))?;
                    eprintln!("locked {} packages into {}", locked.lock.packages.len(), path.display());
                }
                None => print!("{written}"),
            }
        }
        ImageCommand::Vet { name, lock } => {
            let text = std::fs::read_to_string(&lock).with_context(|| format!("reading {}", lock.display()))?;
            let vetted = store.vet(&name, &text)?;
            println!("runs in {name} may now add, with --with:");
            for p in &vetted.packages {
                println!("  {} {}", p.name, p.version);
            }
        }
        ImageCommand::Verify { name } => {
            let found = store.verify(&name)?;
            if found.is_clean() {
                println!("{name}: {} entries checked, every one as built", found.checked);
            } else {
                for (what, paths) in [("changed", &found.changed), ("missing", &found.missing), ("added", &found.added)]
                {
                    for path in paths {
                        println!("{what}: {path}");
                    }
                }
                eprintln!(
                    "airlock: image {name} was changed since it was built ({} changed, {} missing, {} added); \
                     rebuild it with `airlock image rm {name}` and `airlock image build {name}`",
                    found.changed.len(),
                    found.missing.len(),
                    found.added.len()
                );
                return Ok(ExitCode::FAILURE);
            }
        }
        ImageCommand::List => {
            let images = store.list()?;
            if images.is_empty() {
                println!("no images yet; `airlock image build {DEFAULT_IMAGE}` makes the default one");
            }
            for image in images {
                match image {
                    Ok(i) => println!(
                        "{:<20} {}  Python {:<8} {:>3} packages {:>6.0} MiB  {}",
                        i.name,
                        i.manifest.hash,
                        i.manifest.python.version,
                        i.manifest.packages.len(),
                        mib(i.manifest.size_bytes),
                        i.manifest.created_at
                    ),
                    Err(e) => println!("{e}"),
                }
            }
        }
        ImageCommand::Show { name } => {
            let i = store.get(&name)?;
            let m = &i.manifest;
            println!("name:     {}", i.name);
            println!("hash:     {}", m.hash);
            println!("python:   {} ({})", m.python.version, m.python.executable.display());
            println!(
                "size:     {:.1} MiB, {} entries (`airlock image verify {name}` checks them)",
                mib(m.size_bytes),
                m.file_count
            );
            println!("built:    {} with {}, in runs {}", m.created_at, m.built_with, m.build_runs.join(", "));
            println!("lock:     sha256 {}", m.lock_sha256);
            if m.built_from_source {
                println!(
                    "sources:  some packages were built from their sdists here, with build backends the index \
                     gave unpinned (--allow-source-builds): the image is only as trusted as the index"
                );
            }
            println!("packages:");
            for p in &m.packages {
                println!("  {} {}  ({} sha256 {})", p.name, p.version, p.file, p.sha256);
            }
            if let Some(vetted) = store.vetted(&name)? {
                println!("may add with --with:");
                for p in &vetted.packages {
                    println!("  {} {}", p.name, p.version);
                }
            }
        }
        ImageCommand::Rm { name } => {
            store.remove(&name)?;
            println!("removed {name}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Shows a build's progress on stderr.
pub fn show_progress(event: BuildEvent) {
    match event {
        BuildEvent::Step { index, total, what } => eprintln!("[{index}/{total}] {what}"),
        BuildEvent::Package { index, total, name } => eprintln!("      ({index}/{total}) {name}"),
        BuildEvent::Reused { hash } => eprintln!("already built with the same inputs: {hash}"),
        BuildEvent::Done { .. } => {}
    }
}

/// One line per build step: its record, and where its network went.
fn step_summary(record: &RunRecord) -> String {
    let hosts: std::collections::BTreeSet<String> =
        record.network.iter().flat_map(|n| n.connections.iter()).map(|c| format!("{}:{}", c.host, c.port)).collect();
    let network = if hosts.is_empty() {
        "no network".to_owned()
    } else {
        format!("network to {} only", hosts.into_iter().collect::<Vec<_>>().join(", "))
    };
    format!("recorded run {} ({} ms, {network})", record.id, record.usage.wall_ms)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}
