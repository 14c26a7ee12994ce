//! Extra packages for a run, from the operator's vetted set: a lock of
//! their own per image (`airlock image vet NAME LOCK`; the default image
//! has airlock's). An allowed request builds, once, a derived image: a
//! layer with only the extra packages over the base, installed like any
//! image (in a sandbox, from checked files), cached by the hash of what it
//! holds, mounted at [`LAYER_MOUNT`]. The run itself never gets network.

use std::collections::BTreeSet;
use std::fs;
use std::time::Instant;

use airlock_core::Runtime;
use airlock_policy::RunRecord;

use super::build::{Target, image_hash, packages};
use super::fetch;
use super::lock::{Lock, LockedPackage};
use super::manifest::{FORMAT, ImageLink, Manifest};
use super::tags::normalize;
use super::uv::{self, UV_VERSION};
use super::{BuildEvent, DEFAULT_IMAGE, DEFAULT_VETTED, Image, ImageStore, LAYER_MOUNT, MANIFEST};
use crate::Error;

/// An image ready for a run with extra packages, and what getting it cost.
#[derive(Clone, Debug)]
pub struct PreparedImage {
    pub image: Image,
    /// The derived image was in the cache (or no package was needed).
    pub cached: bool,
    /// Time spent finding or building it.
    pub wall_ms: u64,
    /// The build's step records, when it was built now.
    pub records: Vec<RunRecord>,
}

impl ImageStore {
    fn vetted_file(&self, name: &str) -> std::path::PathBuf {
        self.root.join("vetted").join(format!("{name}.pylock.toml"))
    }

    /// The extra packages runs in image `name` may ask for: the lock set
    /// with [`ImageStore::vet`], else airlock's own for the default image.
    pub fn vetted(&self, name: &str) -> Result<Option<Lock>, Error> {
        super::check_name(name)?;
        match fs::read_to_string(self.vetted_file(name)) {
            Ok(text) => Ok(Some(Lock::parse(&text)?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Ok(if name == DEFAULT_IMAGE { Some(Lock::parse(DEFAULT_VETTED)?) } else { None })
            }
            Err(e) => Err(Error::Io { context: format!("reading {}", self.vetted_file(name).display()), source: e }),
        }
    }

    /// Makes `lock_text` (a pylock.toml, every file hashed) the set of extra
    /// packages runs in image `name` may ask for.
    pub fn vet(&self, name: &str, lock_text: &str) -> Result<Lock, Error> {
        super::check_name(name)?;
        let lock = Lock::parse(lock_text)?;
        let path = self.vetted_file(name);
        let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
        let io = |e| Error::Io { context: format!("writing {}", path.display()), source: e };
        fs::create_dir_all(self.root.join("vetted")).map_err(io)?;
        fs::write(&tmp, lock_text).and_then(|()| fs::rename(&tmp, &path)).map_err(io)?;
        Ok(lock)
    }

    /// `base` with `requested` added from its vetted set: the base itself
    /// when it holds them all, else the derived image, built on first use.
    pub fn with_packages(
        &self,
        base: &Image,
        requested: &[String],
        progress: &mut dyn FnMut(BuildEvent),
    ) -> Result<PreparedImage, Error> {
        let started = Instant::now();
        let elapsed = || started.elapsed().as_millis() as u64;
        if base.base.is_some() {
            return Err(Error::ImageBuild {
                name: base.name.clone(),
                reason: "extra packages go on a named image, not on one that already has extras".to_owned(),
            });
        }
        let in_base: BTreeSet<String> = base.manifest.packages.iter().map(|p| normalize(&p.name)).collect();
        let wanted: BTreeSet<String> =
            requested.iter().map(|r| normalize(r)).filter(|r| !in_base.contains(r)).collect();
        if wanted.is_empty() {
            return Ok(PreparedImage { image: base.clone(), cached: true, wall_ms: elapsed(), records: Vec::new() });
        }
        let vetted = self.vetted(&base.name)?;
        let allowed = || match &vetted {
            Some(lock) => lock.packages.iter().map(|p| format!("{} {}", p.name, p.version)).collect(),
            None => Vec::new(),
        };
        let Some(vetted) = &vetted else {
            return Err(Error::NotVetted {
                image: base.name.clone(),
                requested: wanted.into_iter().collect(),
                allowed: allowed(),
            });
        };
        let outside: Vec<String> = wanted.iter().filter(|w| vetted.find(w).is_none()).cloned().collect();
        if !outside.is_empty() {
            return Err(Error::NotVetted { image: base.name.clone(), requested: outside, allowed: allowed() });
        }
        let closure = closure(vetted, &wanted, &in_base)
            .map_err(|reason| Error::ImageBuild { name: base.name.clone(), reason })?;
        let subset = Lock { requires_python: vetted.requires_python.clone(), packages: closure };
        let python = &base.manifest.python;
        let selected = subset.select(python, false)?;
        let base_manifest_sha256 = fs::read(base.dir.join(MANIFEST))
            .map(|b| airlock_core::sha256_hex(&b))
            .map_err(|e| Error::Io { context: format!("reading {}", base.dir.display()), source: e })?;
        let mut files: Vec<String> = selected.iter().map(|s| s.file.sha256.clone()).collect();
        files.sort();
        let hash = image_hash(&[
            &format!("derived from {} {base_manifest_sha256}", base.manifest.hash),
            &format!("files {}", files.join(" ")),
        ]);
        let name = format!("{}+{}", base.name, wanted.iter().cloned().collect::<Vec<_>>().join("+"));
        let fail = |reason: String| Error::ImageBuild { name: name.clone(), reason };
        let _lock = self.lock_hash(&hash).map_err(fail)?;
        if let Some(image) = self.reuse(&name, &hash, Some(base))? {
            return Ok(PreparedImage { image, cached: true, wall_ms: elapsed(), records: Vec::new() });
        }

        let tools = self.toolbox()?;
        let (steps, index, cache, uv_root) = (tools.steps(), &tools.index, &tools.cache, &tools.uv_root);
        let fetch_list = tools.fetch_list(&selected)?;
        progress(BuildEvent::Step {
            index: 2,
            total: 4,
            what: format!("fetching {} files for {name} in a sandbox, each checked against its hash", fetch_list.len()),
        });
        let mut records: Vec<RunRecord> =
            fetch::ensure(cache, &fetch_list, index, python, &steps)?.into_iter().collect();
        let uv = uv::binary_dir(uv_root, cache)?;
        progress(BuildEvent::Step {
            index: 3,
            total: 4,
            what: format!("installing {} packages in a sandbox", selected.len()),
        });
        let staging = self.root.join(format!(".build-{hash}-{}-{}", std::process::id(), fetch::unique()));
        let base_venv = base.dir.join("venv");
        let made = self.make(
            &staging,
            "layer",
            Target::Layer { base: &base_venv },
            python,
            &selected,
            cache,
            &uv,
            index,
            &steps,
            &mut records,
            progress,
            |_| Ok(()),
        );
        let made = made.inspect_err(|_| {
            let _ = fs::remove_dir_all(&staging);
        })?;
        let manifest = Manifest {
            format: FORMAT,
            hash: hash.clone(),
            python: python.clone(),
            lock_sha256: base.manifest.lock_sha256.clone(),
            packages: packages(&selected),
            base: Some(ImageLink { hash: base.manifest.hash.clone(), manifest_sha256: base_manifest_sha256 }),
            files_sha256: made.files_sha256,
            file_count: made.count,
            size_bytes: made.size_bytes,
            created_at: airlock_core::record::now_rfc3339(),
            build_runs: records.iter().map(|r| r.id.clone()).collect(),
            built_with: format!("uv {UV_VERSION}"),
            // Layered on a base built from source, it holds those packages too.
            built_from_source: selected.iter().any(|s| s.source) || base.manifest.built_from_source,
        };
        let image = self.finish(&name, &staging, &hash, manifest, Some(base)).inspect_err(|_| {
            let _ = fs::remove_dir_all(&staging);
        })?;
        Ok(PreparedImage { image, cached: false, wall_ms: elapsed(), records })
    }
}

impl Image {
    /// Adds this derived image's layer to its base's runtime: mounted
    /// read-only, first on the module path, its scripts on PATH.
    pub(super) fn add_layer(&self, runtime: &mut Runtime) {
        runtime.mounts.push(airlock_core::RuntimeMount::read_only(self.dir.join("layer"), LAYER_MOUNT));
        runtime.env.insert("PYTHONPATH".to_owned(), LAYER_MOUNT.to_owned());
        if let Some(path) = runtime.env.get_mut("PATH") {
            *path = format!("{LAYER_MOUNT}/bin:{path}");
        }
    }
}

/// The vetted packages `wanted` needs: each, and what it depends on within
/// the vetted set, leaving out what the base already has.
fn closure(vetted: &Lock, wanted: &BTreeSet<String>, in_base: &BTreeSet<String>) -> Result<Vec<LockedPackage>, String> {
    let mut names: BTreeSet<String> = BTreeSet::new();
    let mut queue: Vec<String> = wanted.iter().cloned().collect();
    while let Some(name) = queue.pop() {
        if in_base.contains(&name) || !names.insert(name.clone()) {
            continue;
        }
        let package = vetted.find(&name).ok_or_else(|| {
            format!("the vetted set is incomplete: a package needs {name}, which it does not hold; lock it again with `airlock image lock --base`")
        })?;
        queue.extend(package.dependencies.iter().cloned());
    }
    Ok(vetted.packages.iter().filter(|p| names.contains(&p.name)).cloned().collect())
}
