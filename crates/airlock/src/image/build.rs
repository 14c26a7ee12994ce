//! Building an image: the host picks the files from the lock, has them
//! fetched and checks them, then an install step in a sandbox makes the
//! environment (its one writable tree), and the host seals the result and
//! renames it into place. See the module docs of [`super`] for the why.

use std::fs;
use std::path::Path;
use std::time::Duration;

use airlock_core::RuntimeMount;
use airlock_policy::RunRecord;

use super::fetch::{self, FileCache, shell_quote};
use super::index::PackageIndex;
use super::lock::{Lock, Selected};
use super::manifest::{self, FORMAT, Manifest, Package};
use super::step::{Step, StepLimits, Steps};
use super::tags::normalize;
use super::uv::{self, UV_DIR, UV_VERSION};
use super::{BuildEvent, DEFAULT_LOCK, FILES, IMAGE_MOUNT, Image, ImageStore, LAYER_MOUNT, MANIFEST, SEALED_APART};
use crate::Error;
use crate::interpreter::Interpreter;

/// What to build an image from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildOptions {
    /// The host interpreter the image is for (a name on PATH, or a path).
    pub python: String,
    /// The lock's text (a pylock.toml).
    pub lock: String,
    /// Build source distributions the lock gives for packages without a
    /// wheel (inside the sandbox, which may then reach the index for their
    /// build backends). Off by default: wheels only.
    pub allow_source_builds: bool,
}

impl BuildOptions {
    /// The default image: python3 on PATH, airlock's own lock.
    pub fn default_image() -> BuildOptions {
        BuildOptions { python: "python3".to_owned(), lock: DEFAULT_LOCK.to_owned(), allow_source_builds: false }
    }
}

/// A finished build.
#[derive(Clone, Debug)]
pub struct Built {
    pub image: Image,
    /// The image existed already, with the same inputs: nothing was run.
    pub reused: bool,
    /// The records of the build's steps (download, install), as the audit
    /// store keeps them.
    pub records: Vec<RunRecord>,
}

/// Where the checked files appear inside an install step.
const FILES_DIR: &str = "/opt/airlock-build/files";
/// The bytecode compiler the install step runs.
const COMPILE_PY: &str = include_str!("compile.py");
/// Lists the distributions installed below a folder, from their metadata
/// alone (run with -I -S: no package code).
const LIST_PY: &str = "import importlib.metadata as m, json, sys\n\
print(json.dumps(sorted([d.metadata['Name'], d.version] for d in m.distributions(path=[sys.argv[1]]))))\n";
/// Starts the image's interpreter with its site-packages once (whatever a
/// package runs at start-up runs here, in the sandbox), and builds
/// matplotlib's font list when it is there.
const START_PY: &str = "import importlib.util\n\
if importlib.util.find_spec('matplotlib'):\n    import matplotlib.font_manager\n";

/// Where an install step puts what it makes.
pub(crate) enum Target<'a> {
    /// A new environment, at [`IMAGE_MOUNT`].
    Venv,
    /// Extra packages at [`LAYER_MOUNT`], over the base environment at `base`.
    Layer { base: &'a Path },
}

/// One install step's work.
pub(crate) struct Install<'a> {
    pub python: &'a Interpreter,
    pub selected: &'a [Selected],
    pub target: Target<'a>,
    /// The writable host folder the step fills.
    pub tree: &'a Path,
    pub cache: &'a FileCache,
    pub uv: &'a Path,
    pub index: &'a PackageIndex,
}

/// What an install step made, besides the tree.
pub(crate) struct Installed {
    pub record: RunRecord,
    /// matplotlib's font list: its file name and content.
    pub font_list: Option<(String, Vec<u8>)>,
}

impl ImageStore {
    /// Builds image `name` as `options` say, or reuses the identical image
    /// if it was built before, and points the name at it.
    pub fn build(
        &self,
        name: &str,
        options: &BuildOptions,
        progress: &mut dyn FnMut(BuildEvent),
    ) -> Result<Built, Error> {
        self.build_named(name, options, progress).map_err(|e| super::named(e, name))
    }

    fn build_named(
        &self,
        name: &str,
        options: &BuildOptions,
        progress: &mut dyn FnMut(BuildEvent),
    ) -> Result<Built, Error> {
        super::check_name(name)?;
        let fail = |reason: String| Error::ImageBuild { name: name.to_owned(), reason };
        const STEPS: usize = 4;
        progress(BuildEvent::Step { index: 1, total: STEPS, what: format!("reading the lock for {}", options.python) });
        let python = Interpreter::resolve(&options.python)?;
        let lock = Lock::parse(&options.lock)?;
        let selected = lock.select(&python, options.allow_source_builds)?;
        let lock_sha256 = airlock_core::sha256_hex(options.lock.as_bytes());
        let hash = image_hash(&[
            &format!("python {} {}", python.executable.display(), python.version),
            &format!("lock {lock_sha256}"),
            &format!("source builds {}", options.allow_source_builds),
        ]);
        let _lock = self.lock_hash(&hash).map_err(fail)?;
        if let Some(image) = self.reuse(name, &hash, None)? {
            progress(BuildEvent::Reused { hash: hash.clone() });
            return Ok(Built { image, reused: true, records: Vec::new() });
        }

        let tools = self.toolbox()?;
        let (steps, index, cache, uv_root) = (tools.steps(), &tools.index, &tools.cache, &tools.uv_root);
        let wanted = tools.fetch_list(&selected)?;
        progress(BuildEvent::Step {
            index: 2,
            total: STEPS,
            what: format!(
                "fetching {} files from {} ({}) in a sandbox, each checked against its hash",
                wanted.len(),
                index.url,
                index.source
            ),
        });
        let mut records: Vec<RunRecord> = fetch::ensure(cache, &wanted, index, &python, &steps)?.into_iter().collect();
        for (i, w) in wanted.iter().enumerate() {
            progress(BuildEvent::Package { index: i + 1, total: wanted.len(), name: w.file.file_name.clone() });
        }
        let uv = uv::binary_dir(uv_root, cache)?;

        progress(BuildEvent::Step {
            index: 3,
            total: STEPS,
            what: format!("installing {} packages in a sandbox (Python {})", selected.len(), python.version),
        });
        let staging = self.root.join(format!(".build-{hash}-{}-{}", std::process::id(), fetch::unique()));
        let made = self.make(
            &staging,
            "venv",
            Target::Venv,
            &python,
            &selected,
            cache,
            &uv,
            index,
            &steps,
            &mut records,
            progress,
            |tree| fs::write(tree.join("lock.toml"), &options.lock),
        );
        let manifest = match made {
            Ok(made) => Manifest {
                format: FORMAT,
                hash: hash.clone(),
                python: python.clone(),
                lock_sha256,
                packages: packages(&selected),
                base: None,
                files_sha256: made.files_sha256,
                file_count: made.count,
                size_bytes: made.size_bytes,
                created_at: airlock_core::record::now_rfc3339(),
                build_runs: records.iter().map(|r| r.id.clone()).collect(),
                built_with: format!("uv {UV_VERSION}"),
                built_from_source: selected.iter().any(|s| s.source),
            },
            Err(e) => {
                let _ = fs::remove_dir_all(&staging);
                return Err(e);
            }
        };
        let image = self.finish(name, &staging, &hash, manifest, None).inspect_err(|_| {
            let _ = fs::remove_dir_all(&staging);
        })?;
        progress(BuildEvent::Done { hash, size_bytes: image.manifest.size_bytes });
        Ok(Built { image, reused: false, records })
    }

    /// Holds the build of `hash` for this process alone, across processes.
    pub(crate) fn lock_hash(&self, hash: &str) -> Result<fs::File, String> {
        fs::create_dir_all(self.root.join("names")).map_err(|e| format!("creating {}: {e}", self.root.display()))?;
        let path = self.root.join(format!(".{hash}.lock"));
        let file = fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive).map_err(|e| format!("locking: {e}"))?;
        Ok(file)
    }

    /// The image `hash` when it is already built and whole, named `name`
    /// (`None`: a derived image, named by its hash). A folder under that
    /// hash that is not a whole image is removed.
    pub(crate) fn reuse(&self, name: &str, hash: &str, base: Option<&Image>) -> Result<Option<Image>, Error> {
        let dir = self.root.join(hash);
        let manifest_path = dir.join(MANIFEST);
        if let Ok(bytes) = fs::read(&manifest_path) {
            let sha = airlock_core::sha256_hex(&bytes);
            if let Ok(manifest) = super::read_manifest(&dir, hash, &sha) {
                self.point(&pointer_name(name, hash, base), hash, &sha)?;
                let base = base.map(|b| Box::new(b.clone()));
                return Ok(Some(Image { name: name.to_owned(), dir, manifest, base }));
            }
        }
        if dir.exists() {
            // Not a valid image under the final name: never trust it.
            fs::remove_dir_all(&dir).map_err(|e| Error::ImageBuild {
                name: name.to_owned(),
                reason: format!("removing the broken {}: {e}", dir.display()),
            })?;
        }
        Ok(None)
    }

    /// Makes `staging` with the installed tree in `staging/<tree_name>`
    /// (a venv, or a derived image's layer), extra host-written files from
    /// `extra`, sealed and listed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn make(
        &self,
        staging: &Path,
        tree_name: &str,
        target: Target<'_>,
        python: &Interpreter,
        selected: &[Selected],
        cache: &FileCache,
        uv: &Path,
        index: &PackageIndex,
        steps: &Steps<'_>,
        records: &mut Vec<RunRecord>,
        progress: &mut dyn FnMut(BuildEvent),
        extra: impl FnOnce(&Path) -> std::io::Result<()>,
    ) -> Result<Sealed, Error> {
        let fail = |reason: String| Error::ImageBuild { name: String::new(), reason };
        let tree = staging.join(tree_name);
        fetch::create_private_dir(staging)
            .and_then(|()| fetch::create_private_dir(&tree))
            .map_err(|e| fail(format!("creating {}: {e}", tree.display())))?;
        // Hashed again right before the install reads them.
        for s in selected {
            if !cache.holds(&s.file) {
                return Err(fail(format!("{} left the cache or changed there before the install", s.file.file_name)));
            }
        }
        let installed =
            install(steps, &Install { python, selected, target, tree: &tree, cache, uv, index }).map_err(fail)?;
        records.push(installed.record);
        progress(BuildEvent::Step {
            index: 4,
            total: 4,
            what: "checking, hashing and recording what was installed".to_owned(),
        });
        if let Some((file_name, content)) = installed.font_list {
            let dir = staging.join("mplconfig");
            fs::create_dir(&dir)
                .and_then(|()| fs::write(dir.join(file_name), content))
                .map_err(|e| fail(format!("keeping matplotlib's font list: {e}")))?;
        }
        extra(staging).map_err(|e| fail(format!("writing into {}: {e}", staging.display())))?;
        let listing = manifest::seal(staging, &SEALED_APART).map_err(|e| fail(format!("the built tree: {e}")))?;
        write_synced(&staging.join(FILES), listing.text.as_bytes())
            .map_err(|e| fail(format!("writing {FILES}: {e}")))?;
        Ok(Sealed {
            files_sha256: airlock_core::sha256_hex(listing.text.as_bytes()),
            count: listing.count,
            size_bytes: listing.size_bytes,
        })
    }

    /// Writes the manifest, renames `staging` into place as image `hash`,
    /// and points the name at it.
    pub(crate) fn finish(
        &self,
        name: &str,
        staging: &Path,
        hash: &str,
        manifest: Manifest,
        base: Option<&Image>,
    ) -> Result<Image, Error> {
        let fail = |reason: String| Error::ImageBuild { name: name.to_owned(), reason };
        let bytes = serde_json::to_vec_pretty(&manifest).map_err(|e| fail(e.to_string()))?;
        write_synced(&staging.join(MANIFEST), &bytes).map_err(|e| fail(format!("writing the manifest: {e}")))?;
        // Readable by all, as the rest: the sandbox's user reads nothing
        // here, but `airlock image list` run by anyone may.
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(staging, fs::Permissions::from_mode(0o755))
            .and_then(|()| fs::File::open(staging)?.sync_all())
            .map_err(|e| fail(format!("finishing {}: {e}", staging.display())))?;
        let dir = self.root.join(hash);
        fs::rename(staging, &dir).map_err(|e| fail(format!("moving the image into place: {e}")))?;
        let _ = fs::File::open(&self.root).and_then(|d| d.sync_all());
        self.point(&pointer_name(name, hash, base), hash, &airlock_core::sha256_hex(&bytes))?;
        Ok(Image { name: name.to_owned(), dir, manifest, base: base.map(|b| Box::new(b.clone())) })
    }
}

/// A sealed tree's list.
pub(crate) struct Sealed {
    pub files_sha256: String,
    pub count: u64,
    pub size_bytes: u64,
}

/// A named image is pointed at by its name; a derived one by a hidden
/// pointer named for its hash.
fn pointer_name(name: &str, hash: &str, base: Option<&Image>) -> String {
    if base.is_some() { format!(".{hash}") } else { name.to_owned() }
}

/// The packages of a selection, as the manifest lists them.
pub(crate) fn packages(selected: &[Selected]) -> Vec<Package> {
    let mut packages: Vec<Package> = selected
        .iter()
        .map(|s| Package {
            name: s.name.clone(),
            version: s.version.clone(),
            file: s.file.file_name.clone(),
            sha256: s.file.sha256.clone(),
        })
        .collect();
    packages.sort_by(|a, b| a.name.cmp(&b.name));
    packages
}

/// The hash of an image's inputs, with the image format.
pub(crate) fn image_hash(parts: &[&str]) -> String {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(format!("airlock-image-format {FORMAT}\n"));
    for part in parts {
        hasher.update(part);
        hasher.update("\n");
    }
    hex::encode(&hasher.finalize()[..16])
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let file = fs::File::create(path)?;
    std::io::Write::write_all(&mut &file, bytes)?;
    file.sync_all()
}

/// Runs the install step: uv installs the checked files into the tree,
/// then the post-install steps run there. The host then checks the
/// listing against what it asked for.
pub(crate) fn install(steps: &Steps<'_>, plan: &Install<'_>) -> Result<Installed, String> {
    let source_build = plan.selected.iter().any(|s| s.source);
    let mut runtime = plan.python.runtime();
    runtime.describe = "an image build's install step".to_owned();
    runtime.mounts.push(RuntimeMount::read_only(plan.uv, UV_DIR));
    runtime.mounts.push(RuntimeMount::read_only(&plan.cache.root, FILES_DIR));
    let (root, image_python, install_into) = match plan.target {
        Target::Venv => {
            runtime.mounts.push(RuntimeMount::writable(plan.tree, IMAGE_MOUNT));
            (IMAGE_MOUNT, format!("{IMAGE_MOUNT}/bin/python"), String::new())
        }
        Target::Layer { base } => {
            runtime.mounts.push(RuntimeMount::read_only(base, IMAGE_MOUNT));
            runtime.mounts.push(RuntimeMount::writable(plan.tree, LAYER_MOUNT));
            (LAYER_MOUNT, format!("{IMAGE_MOUNT}/bin/python"), format!(" --target {LAYER_MOUNT}"))
        }
    };
    let files: Vec<String> = plan
        .selected
        .iter()
        .map(|s| shell_quote(&format!("{FILES_DIR}/{}/{}", s.file.sha256, s.file.file_name)))
        .collect();
    // Wheels only, from the checked files alone: no index, no network, and
    // every dependency must be among them. A source build needs its build
    // backend from the index; the step may then reach it, and only it.
    let (sources, tls) = if source_build {
        let ca = fetch::mount_ca_bundle(&mut runtime).map_err(|e| e.to_string())?;
        (
            format!("--default-index {} --no-deps", shell_quote(&plan.index.url)),
            format!(" SSL_CERT_FILE={ca} UV_SYSTEM_CERTS=1"),
        )
    } else {
        ("--offline --no-index --no-build".to_owned(), String::new())
    };
    let make_venv = match plan.target {
        Target::Venv => format!(
            "\"$uv\" venv --quiet --allow-existing --python {} {IMAGE_MOUNT}\n",
            // The interpreter where the sandbox has it, never its host path.
            shell_quote(&plan.python.executable_inside().display().to_string())
        ),
        Target::Layer { .. } => String::new(),
    };
    let purelib = match plan.target {
        Target::Venv => site_packages(plan.python),
        Target::Layer { .. } => LAYER_MOUNT.to_owned(),
    };
    let start = match plan.target {
        // Once the tree is listed: whatever a package runs at start-up or
        // import runs now, here, and never on the host.
        Target::Venv => "MPLCONFIGDIR=/work/mplconfig MPLBACKEND=Agg \"$python\" /work/start.py\n\
for f in /work/mplconfig/fontlist-*.json; do\n  if [ -f \"$f\" ]; then cp \"$f\" /work/fontlist.json; basename \"$f\" > /work/fontlist.name; fi\ndone\n"
            .to_owned(),
        Target::Layer { .. } => "PYTHONPATH=/opt/airlock/layer \"$python\" /work/start.py\n".to_owned(),
    };
    let script = format!(
        "set -eu\n\
         uv={UV_DIR}/uv\n\
         python={image_python}\n\
         export UV_CACHE_DIR={root}/.airlock-uv-cache UV_NO_CONFIG=1 UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1{tls}\n\
         {make_venv}\
         \"$uv\" pip install --quiet --python \"$python\"{install_into} {sources} --link-mode hardlink \\\n  {}\n\
         rm -rf \"$UV_CACHE_DIR\"\n\
         \"$python\" -I -S /work/list.py {purelib} > /work/installed.json\n\
         \"$python\" -I -S /work/compile.py {root}\n\
         {start}",
        files.join(" \\\n  ")
    );
    let largest = plan.selected.iter().map(|s| s.file.size.unwrap_or(1 << 30)).max().unwrap_or(0);
    let step = Step {
        what: "install",
        limits: StepLimits {
            wall_time: Duration::from_secs(1200),
            hosts: if source_build { plan.index.allow_hosts() } else { Vec::new() },
            bytes_in: 2 << 30,
            disk_bytes: (4 * largest).max(2 << 30),
        },
        runtime,
        inputs: vec![
            ("/work/compile.py".to_owned(), COMPILE_PY.as_bytes().to_vec()),
            ("/work/list.py".to_owned(), LIST_PY.as_bytes().to_vec()),
            ("/work/start.py".to_owned(), START_PY.as_bytes().to_vec()),
        ],
        script,
        outputs: vec![
            ("/work/installed.json", 1 << 20),
            ("/work/fontlist.json", 16 << 20),
            ("/work/fontlist.name", 4096),
        ],
    };
    let outcome = steps.run(step)?;
    // The step's uv cache is gone (hard links into it stay as the files).
    let leftover = plan.tree.join(".airlock-uv-cache");
    if fs::symlink_metadata(&leftover).is_ok() {
        fs::remove_dir_all(&leftover).map_err(|e| format!("removing {}: {e}", leftover.display()))?;
    }
    check_installed(outcome.outputs.get("/work/installed.json"), plan.selected)?;
    let font_list = match (outcome.outputs.get("/work/fontlist.name"), outcome.outputs.get("/work/fontlist.json")) {
        (Some(name), Some(content)) => {
            let name = String::from_utf8_lossy(name).trim().to_owned();
            let plain = name.starts_with("fontlist-") && name.ends_with(".json") && !name.contains('/');
            plain.then(|| (name, content.clone()))
        }
        _ => None,
    };
    Ok(Installed { record: outcome.record, font_list })
}

/// Where a venv made at [`IMAGE_MOUNT`] for `python` keeps its packages.
fn site_packages(python: &Interpreter) -> String {
    let short: Vec<&str> = python.version.split('.').take(2).collect();
    let threaded = if python.platform.abiflags.contains('t') { "t" } else { "" };
    format!("{IMAGE_MOUNT}/lib/python{}{threaded}/site-packages", short.join("."))
}

/// The install step's listing must name exactly the packages asked for, at
/// their versions: nothing missing, nothing more.
fn check_installed(listing: Option<&Vec<u8>>, selected: &[Selected]) -> Result<(), String> {
    let listing = listing.ok_or("the install step did not list what it installed")?;
    let found: Vec<(String, String)> =
        serde_json::from_slice(listing).map_err(|e| format!("the install step's listing is not usable: {e}"))?;
    let mut found: Vec<(String, String)> = found.into_iter().map(|(n, v)| (normalize(&n), v)).collect();
    found.sort();
    let mut wanted: Vec<(String, String)> = selected.iter().map(|s| (s.name.clone(), s.version.clone())).collect();
    wanted.sort();
    if found != wanted {
        let missing: Vec<String> =
            wanted.iter().filter(|w| !found.contains(w)).map(|(n, v)| format!("{n} {v}")).collect();
        let extra: Vec<String> =
            found.iter().filter(|f| !wanted.contains(f)).map(|(n, v)| format!("{n} {v}")).collect();
        return Err(format!(
            "the environment does not hold what the lock names: missing [{}], not in the lock [{}]",
            missing.join(", "),
            extra.join(", ")
        ));
    }
    Ok(())
}
