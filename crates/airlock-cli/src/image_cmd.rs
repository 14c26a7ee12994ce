//! `airlock image`.

use std::path::PathBuf;

use airlock::image::{BuildEvent, DEFAULT_IMAGE, DEFAULT_REQUIREMENTS, ImageStore};
use anyhow::Context;
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build an image: a Python environment with pinned packages from the package index.
    Build {
        /// The image's name.
        name: String,
        /// The host interpreter to build on [default: python3 on PATH].
        #[arg(long, value_name = "INTERPRETER", default_value = "python3")]
        python: String,
        /// A pip requirements file with the packages, pinned [default: python-data's set].
        #[arg(long, value_name = "FILE")]
        requirements: Option<PathBuf>,
    },
    /// List the images.
    List,
    /// Show an image: its Python, every package and version, its size.
    Show { name: String },
    /// Remove an image.
    Rm { name: String },
}

pub fn run(command: ImageCommand) -> anyhow::Result<()> {
    let store = ImageStore::open_default()?;
    match command {
        ImageCommand::Build { name, python, requirements } => {
            let requirements = match &requirements {
                Some(path) => {
                    std::fs::read_to_string(path).with_context(|| format!("--requirements {}", path.display()))?
                }
                None if name == DEFAULT_IMAGE => DEFAULT_REQUIREMENTS.to_owned(),
                None => {
                    anyhow::bail!("give the packages with --requirements FILE (only {DEFAULT_IMAGE} has a default set)")
                }
            };
            let image = store.build(&name, &python, &requirements, &mut |event| match event {
                BuildEvent::Step { index, total, what } => eprintln!("[{index}/{total}] {what}"),
                BuildEvent::Package { index, total, name } => eprintln!("      ({index}/{total}) {name}"),
                BuildEvent::Reused { hash } => eprintln!("already built with the same inputs: {hash}"),
                BuildEvent::Done { .. } => {}
            })?;
            println!("{} {} ({:.0} MiB)", image.name, image.manifest.hash, mib(image.manifest.size_bytes));
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
            println!("name:     {}", i.name);
            println!("hash:     {}", i.manifest.hash);
            println!("python:   {} ({})", i.manifest.python.version, i.manifest.python.executable.display());
            println!("size:     {:.1} MiB", mib(i.manifest.size_bytes));
            println!("built:    {}", i.manifest.created_at);
            println!("packages:");
            for p in &i.manifest.packages {
                println!("  {} {}", p.name, p.version);
            }
        }
        ImageCommand::Rm { name } => {
            store.remove(&name)?;
            println!("removed {name}");
        }
    }
    Ok(())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}
