//! Locks: every distribution an image holds, at its exact version, each
//! file pinned by its SHA-256.
//!
//! The format is PEP 751's `pylock.toml`, not a `requirements.txt` with
//! `--hash` lines, because a pylock names each file (its name, URL, size and
//! hash) rather than listing a package's acceptable hashes. So the host picks
//! the one wheel an interpreter takes from the lock alone, knows before any
//! download exactly which file must arrive and what it must hash to, and
//! never has to ask an index which file a hash belongs to. uv and pip both
//! read and write it.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use super::marker::{self, MarkerEnv};
use super::tags::{SupportedTags, WheelName, normalize};
use crate::interpreter::Interpreter;

/// A lock that cannot be used, naming the package and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    #[error("the lock is not a valid pylock.toml (PEP 751): {0}")]
    Syntax(String),
    #[error("the lock's lock-version is {0:?}; airlock reads lock-version 1.x")]
    Version(String),
    #[error("the lock has no packages")]
    Empty,
    #[error(
        "package {package:?} in the lock: file {file:?} has no sha256 hash; every file must be pinned by its SHA-256 \
         (make the lock with `airlock image lock`, which pins every file)"
    )]
    MissingHash { package: String, file: String },
    #[error("package {package:?} in the lock: {problem}")]
    Package { package: String, problem: String },
    #[error(
        "package {package} {version} has no wheel in the lock, only a source distribution; airlock installs binary \
         wheels only, unless source builds are allowed (`--allow-source-builds`), which then run inside the sandbox"
    )]
    SourceOnly { package: String, version: String },
    #[error(
        "no wheel of {package} {version} in the lock fits {interpreter} (the lock has: {available}); make a lock for \
         this interpreter with `airlock image lock REQUIREMENTS --python INTERPRETER`"
    )]
    NoCompatibleWheel { package: String, version: String, interpreter: String, available: String },
    #[error("the lock needs Python {needs}, and the interpreter is Python {version}")]
    Python { needs: String, version: String },
}

/// A checked lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lock {
    pub requires_python: Option<String>,
    pub packages: Vec<LockedPackage>,
}

/// One distribution at one version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockedPackage {
    /// Normalised (PEP 503).
    pub name: String,
    pub version: String,
    /// Installed only where this environment marker holds.
    pub marker: Option<String>,
    pub requires_python: Option<String>,
    pub wheels: Vec<LockedFile>,
    pub sdist: Option<LockedFile>,
    /// Normalised names of the locked packages it depends on.
    pub dependencies: Vec<String>,
}

/// One file of a distribution, pinned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockedFile {
    pub file_name: String,
    pub url: String,
    pub size: Option<u64>,
    /// Lower-case hex.
    pub sha256: String,
}

/// What an interpreter installs from a lock: one file per package.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selected {
    pub name: String,
    pub version: String,
    pub file: LockedFile,
    /// A source distribution, built inside the sandbox (only when allowed).
    pub source: bool,
}

#[derive(Deserialize)]
struct RawLock {
    #[serde(rename = "lock-version")]
    lock_version: Option<String>,
    #[serde(rename = "requires-python")]
    requires_python: Option<String>,
    #[serde(default)]
    packages: Vec<RawPackage>,
}

#[derive(Deserialize)]
struct RawPackage {
    name: String,
    version: Option<String>,
    marker: Option<String>,
    #[serde(rename = "requires-python")]
    requires_python: Option<String>,
    #[serde(default)]
    wheels: Vec<RawFile>,
    sdist: Option<RawFile>,
    vcs: Option<toml::Value>,
    directory: Option<toml::Value>,
    archive: Option<toml::Value>,
    #[serde(default)]
    dependencies: Vec<RawDependency>,
}

#[derive(Deserialize)]
struct RawFile {
    name: Option<String>,
    url: Option<String>,
    path: Option<String>,
    size: Option<u64>,
    #[serde(default)]
    hashes: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct RawDependency {
    name: String,
}

impl Lock {
    /// Reads and checks a pylock.toml: every package at an exact version,
    /// every file from a URL, named as its package's and pinned by SHA-256.
    pub fn parse(text: &str) -> Result<Lock, LockError> {
        let raw: RawLock = toml::from_str(text).map_err(|e| LockError::Syntax(e.message().to_owned()))?;
        let version = raw.lock_version.unwrap_or_default();
        if version.split('.').next() != Some("1") {
            return Err(LockError::Version(version));
        }
        if raw.packages.is_empty() {
            return Err(LockError::Empty);
        }
        let mut seen = BTreeSet::new();
        let mut packages = Vec::new();
        for raw in raw.packages {
            let package = check_package(raw)?;
            // One entry per name and marker: a universal lock may list a
            // package twice under exclusive markers.
            if !seen.insert((package.name.clone(), package.marker.clone())) {
                return Err(LockError::Package {
                    package: package.name,
                    problem: "it is listed twice under the same marker".to_owned(),
                });
            }
            packages.push(package);
        }
        Ok(Lock { requires_python: raw.requires_python, packages })
    }

    /// The one file each package applies to `python` with: the best wheel
    /// its tags take, or, when `allow_source`, the source distribution of a
    /// package without one. Packages whose marker does not hold are left out.
    pub fn select(&self, python: &Interpreter, allow_source: bool) -> Result<Vec<Selected>, LockError> {
        let env = MarkerEnv::of(python);
        let python_fits = |needs: &str| {
            marker::satisfies(&python.version, needs).map_err(|e| LockError::Syntax(format!("requires-python: {e}")))
        };
        if let Some(needs) = &self.requires_python
            && !python_fits(needs)?
        {
            return Err(LockError::Python { needs: needs.clone(), version: python.version.clone() });
        }
        let tags = SupportedTags::of(python);
        let mut selected = Vec::new();
        for package in &self.packages {
            if let Some(m) = &package.marker {
                let applies = marker::evaluate(m, &env)
                    .map_err(|problem| LockError::Package { package: package.name.clone(), problem })?;
                if !applies {
                    continue;
                }
            }
            if let Some(needs) = &package.requires_python
                && !python_fits(needs)?
            {
                return Err(LockError::Python {
                    needs: format!("{needs} (for {})", package.name),
                    version: python.version.clone(),
                });
            }
            selected.push(choose(package, &tags, allow_source)?);
        }
        Ok(selected)
    }

    /// The package called `name` (any spelling) that applies to `python`.
    pub fn find(&self, name: &str) -> Option<&LockedPackage> {
        let name = normalize(name);
        self.packages.iter().find(|p| p.name == name)
    }

    /// Keeps only the wheels `keep` accepts (a universal lock trimmed to Linux).
    pub fn retain_wheels(&mut self, keep: impl Fn(&WheelName) -> bool) {
        for package in &mut self.packages {
            package.wheels.retain(|w| WheelName::parse(&w.file_name).is_some_and(|n| keep(&n)));
        }
    }

    /// The lock as a pylock.toml, one `[[packages]]` table per package.
    pub fn to_toml(&self, header: &str) -> String {
        let mut out = String::new();
        for line in header.lines() {
            out.push_str(&format!("# {line}\n").replace("# \n", "#\n"));
        }
        out.push_str("lock-version = \"1.0\"\ncreated-by = \"airlock\"\n");
        if let Some(needs) = &self.requires_python {
            out.push_str(&format!("requires-python = {}\n", quote(needs)));
        }
        for p in &self.packages {
            out.push_str(&format!("\n[[packages]]\nname = {}\nversion = {}\n", quote(&p.name), quote(&p.version)));
            if let Some(m) = &p.marker {
                out.push_str(&format!("marker = {}\n", quote(m)));
            }
            if let Some(needs) = &p.requires_python {
                out.push_str(&format!("requires-python = {}\n", quote(needs)));
            }
            if !p.dependencies.is_empty() {
                let deps: Vec<String> = p.dependencies.iter().map(|d| format!("{{ name = {} }}", quote(d))).collect();
                out.push_str(&format!("dependencies = [{}]\n", deps.join(", ")));
            }
            if let Some(sdist) = &p.sdist {
                out.push_str(&format!("sdist = {}\n", file_table(sdist)));
            }
            if !p.wheels.is_empty() {
                out.push_str("wheels = [\n");
                for w in &p.wheels {
                    out.push_str(&format!("    {},\n", file_table(w)));
                }
                out.push_str("]\n");
            }
        }
        out
    }
}

fn quote(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

fn file_table(file: &LockedFile) -> String {
    let size = file.size.map(|s| format!(", size = {s}")).unwrap_or_default();
    format!(
        "{{ name = {}, url = {}{size}, hashes = {{ sha256 = {} }} }}",
        quote(&file.file_name),
        quote(&file.url),
        quote(&file.sha256)
    )
}

fn check_package(raw: RawPackage) -> Result<LockedPackage, LockError> {
    let name = normalize(&raw.name);
    let problem = |problem: String| LockError::Package { package: name.clone(), problem };
    if raw.vcs.is_some() || raw.directory.is_some() || raw.archive.is_some() {
        return Err(problem(
            "it comes from a VCS, a directory or an archive URL; an image takes packages from the index only, as \
             wheels pinned by hash"
                .to_owned(),
        ));
    }
    let version = raw.version.filter(|v| !v.trim().is_empty()).ok_or_else(|| {
        problem("it has no exact version; a lock pins each package (make one with `airlock image lock`)".to_owned())
    })?;
    let mut wheels = Vec::new();
    for file in raw.wheels {
        let file = check_file(&name, file)?;
        let wheel = WheelName::parse(&file.file_name)
            .ok_or_else(|| problem(format!("{:?} is not a wheel's file name", file.file_name)))?;
        if normalize(&wheel.distribution) != name || !same_version(&wheel.version, &version) {
            return Err(problem(format!("{:?} is not a wheel of {name} {version}", file.file_name)));
        }
        wheels.push(file);
    }
    let sdist = match raw.sdist {
        Some(file) => {
            let file = check_file(&name, file)?;
            let stem = file.file_name.strip_suffix(".tar.gz").or_else(|| file.file_name.strip_suffix(".zip"));
            let belongs = stem
                .and_then(|s| s.rsplit_once('-'))
                .is_some_and(|(dist, v)| normalize(dist) == name && same_version(v, &version));
            if !belongs {
                return Err(problem(format!("{:?} is not a source distribution of {name} {version}", file.file_name)));
            }
            Some(file)
        }
        None => None,
    };
    if wheels.is_empty() && sdist.is_none() {
        return Err(problem("it lists no file to install".to_owned()));
    }
    let mut dependencies: Vec<String> = raw.dependencies.iter().map(|d| normalize(&d.name)).collect();
    dependencies.sort();
    dependencies.dedup();
    Ok(LockedPackage {
        name,
        version,
        marker: raw.marker,
        requires_python: raw.requires_python,
        wheels,
        sdist,
        dependencies,
    })
}

fn same_version(in_file_name: &str, locked: &str) -> bool {
    in_file_name == locked || in_file_name.replace('_', "-") == locked.replace('_', "-")
}

fn check_file(package: &str, raw: RawFile) -> Result<LockedFile, LockError> {
    let problem = |problem: String| LockError::Package { package: package.to_owned(), problem };
    if raw.path.is_some() && raw.url.is_none() {
        return Err(problem("a file given by a local path; the lock must name each file's URL".to_owned()));
    }
    let url = raw.url.ok_or_else(|| problem("a file without a URL".to_owned()))?;
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(problem(format!("{url:?} is not an http(s) URL")));
    }
    let file_name = match raw.name {
        Some(name) => name,
        None => url_file_name(&url).ok_or_else(|| problem(format!("cannot tell a file name from {url:?}")))?,
    };
    if file_name.is_empty() || file_name.contains(['/', '\\', '\0']) || file_name.starts_with('.') {
        return Err(problem(format!("{file_name:?} is not a plain file name")));
    }
    let sha256 = raw
        .hashes
        .get("sha256")
        .ok_or_else(|| LockError::MissingHash { package: package.to_owned(), file: file_name.clone() })?
        .to_ascii_lowercase();
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(problem(format!("{file_name}: {sha256:?} is not a SHA-256 (64 hex digits)")));
    }
    Ok(LockedFile { file_name, url, size: raw.size, sha256 })
}

/// The last path segment of a URL, percent-decoded.
fn url_file_name(url: &str) -> Option<String> {
    let path = url.split(['?', '#']).next()?;
    let last = path.rsplit('/').next()?;
    let bytes = last.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok())?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().filter(|s| !s.is_empty())
}

fn choose(package: &LockedPackage, tags: &SupportedTags, allow_source: bool) -> Result<Selected, LockError> {
    let best = package
        .wheels
        .iter()
        .filter_map(|w| Some((tags.rank(&WheelName::parse(&w.file_name)?)?, w)))
        .min_by_key(|(rank, _)| *rank)
        .map(|(_, w)| w);
    let pick = |file: &LockedFile, source: bool| Selected {
        name: package.name.clone(),
        version: package.version.clone(),
        file: file.clone(),
        source,
    };
    match (best, &package.sdist) {
        (Some(wheel), _) => Ok(pick(wheel, false)),
        (None, Some(sdist)) if allow_source => Ok(pick(sdist, true)),
        (None, Some(_)) if package.wheels.is_empty() => {
            Err(LockError::SourceOnly { package: package.name.clone(), version: package.version.clone() })
        }
        (None, _) => {
            let mut available: Vec<&str> = package.wheels.iter().map(|w| w.file_name.as_str()).take(6).collect();
            if package.wheels.len() > 6 {
                available.push("...");
            }
            Err(LockError::NoCompatibleWheel {
                package: package.name.clone(),
                version: package.version.clone(),
                interpreter: tags.describe.clone(),
                available: available.join(", "),
            })
        }
    }
}

/// Reads uv's `requirements.txt` output with `# via` annotations (one per
/// line) into each package's dependencies: the pylock uv writes does not
/// record them, and a run that asks for one vetted package needs to know
/// which others come with it.
pub fn dependencies_from_annotations(annotated: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut needs: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in annotated.lines() {
        let Some((requirement, via)) = line.split_once("# via") else { continue };
        let Some(name) = requirement.split(['=', ';', ' ', '[']).next().map(normalize) else { continue };
        if name.is_empty() {
            continue;
        }
        for dependent in via.split(',').map(str::trim).filter(|d| !d.is_empty() && !d.starts_with('-')) {
            // `via pandas (extra: x)` style details are dropped.
            let dependent = normalize(dependent.split_whitespace().next().unwrap_or(dependent));
            needs.entry(dependent).or_default().insert(name.clone());
        }
    }
    needs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpreter::Platform;

    const HASH_A: &str = "0a10eec6e13ef16b627fabed9a5f2ba61a62b1c67f327305f4e7e412a70b4aec";
    const HASH_B: &str = "d76f8fdcb6936f5e1045a0c9dd721a4bf11112e60d1e243bfa1d39f06a8b3104";

    pub(crate) fn python() -> Interpreter {
        Interpreter {
            executable: "/usr/bin/python3".into(),
            base_prefix: "/usr".into(),
            prefix: "/usr".into(),
            version: "3.11.7".into(),
            platform: Platform {
                implementation: "cpython".into(),
                machine: "x86_64".into(),
                libc: "glibc".into(),
                libc_version: "2.36".into(),
                abiflags: String::new(),
            },
        }
    }

    fn lock_text() -> String {
        format!(
            r#"
lock-version = "1.0"
created-by = "uv"
requires-python = ">=3.11"

[[packages]]
name = "FontTools"
version = "4.68.0"
wheels = [
    {{ url = "https://files.example/f/fonttools-4.68.0-py3-none-any.whl", size = 10, hashes = {{ sha256 = "{HASH_A}" }} }},
    {{ url = "https://files.example/f/fonttools-4.68.0-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", hashes = {{ sha256 = "{HASH_B}" }} }},
]

[[packages]]
name = "colorama"
version = "0.4.6"
marker = "sys_platform == 'win32'"
wheels = [{{ url = "https://files.example/c/colorama-0.4.6-py2.py3-none-any.whl", hashes = {{ sha256 = "{HASH_A}" }} }}]
"#
        )
    }

    #[test]
    fn the_best_wheel_of_each_applying_package_is_selected() {
        let lock = Lock::parse(&lock_text()).unwrap();
        let selected = lock.select(&python(), false).unwrap();
        assert_eq!(selected.len(), 1, "colorama is for Windows only: {selected:?}");
        assert_eq!(selected[0].name, "fonttools");
        assert_eq!(selected[0].file.sha256, HASH_B, "the native wheel beats the pure one");
        let mut old = python();
        old.version = "3.10.4".into();
        assert!(matches!(lock.select(&old, false), Err(LockError::Python { .. })));
    }

    #[test]
    fn a_file_without_a_hash_is_refused_naming_the_package() {
        let text =
            lock_text().replacen(&format!("hashes = {{ sha256 = \"{HASH_A}\" }}"), "hashes = { md5 = \"x\" }", 1);
        let err = Lock::parse(&text).unwrap_err();
        assert!(matches!(&err, LockError::MissingHash { package, .. } if package == "fonttools"), "{err}");
        assert!(err.to_string().contains("sha256"), "{err}");
        let no_hashes = lock_text().replacen(&format!(", size = 10, hashes = {{ sha256 = \"{HASH_A}\" }}"), "", 1);
        assert!(matches!(Lock::parse(&no_hashes), Err(LockError::MissingHash { .. })));
    }

    #[test]
    fn files_that_are_not_the_package_are_refused() {
        for (from, to) in [
            ("fonttools-4.68.0-py3-none-any.whl", "evil-4.68.0-py3-none-any.whl"),
            ("fonttools-4.68.0-py3-none-any.whl", "fonttools-4.69.0-py3-none-any.whl"),
            ("fonttools-4.68.0-py3-none-any.whl", "fonttools-4.68.0.tar.gz"),
            ("https://files.example/f/fonttools-4.68.0-py3-none-any", "file:///etc/fonttools-4.68.0-py3-none-any"),
            ("version = \"4.68.0\"", "version = \"\""),
        ] {
            let err = Lock::parse(&lock_text().replacen(from, to, 1)).unwrap_err();
            assert!(matches!(err, LockError::Package { .. }), "{from} -> {to}: {err}");
        }
        assert!(matches!(Lock::parse("lock-version = \"2.0\"\n"), Err(LockError::Version(_))));
        assert!(matches!(Lock::parse("not toml ["), Err(LockError::Syntax(_))));
    }

    #[test]
    fn source_distributions_need_permission() {
        let text = format!(
            "lock-version = \"1.0\"\n[[packages]]\nname = \"tiny\"\nversion = \"1.0\"\n\
             sdist = {{ url = \"https://x.example/tiny-1.0.tar.gz\", hashes = {{ sha256 = \"{HASH_A}\" }} }}\n"
        );
        let lock = Lock::parse(&text).unwrap();
        assert!(matches!(lock.select(&python(), false), Err(LockError::SourceOnly { .. })));
        let selected = lock.select(&python(), true).unwrap();
        assert!(selected[0].source);
    }

    #[test]
    fn no_fitting_wheel_says_what_the_lock_has() {
        let text = lock_text()
            .replace("py3-none-any.whl", "cp312-cp312-win_amd64.whl")
            .replace("cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64", "cp312-cp312-manylinux_2_17_x86_64");
        let err = Lock::parse(&text).unwrap().select(&python(), false).unwrap_err().to_string();
        assert!(
            err.contains("fonttools 4.68.0") && err.contains("win_amd64") && err.contains("airlock image lock"),
            "{err}"
        );
    }

    #[test]
    fn written_locks_read_back_the_same() {
        let mut lock = Lock::parse(&lock_text()).unwrap();
        lock.packages[0].dependencies = vec!["numpy".into()];
        let again = Lock::parse(&lock.to_toml("made by a test\n\nsecond line")).unwrap();
        assert_eq!(again, lock);
    }

    #[test]
    fn annotations_become_dependencies() {
        let annotated = "numpy==2.4.6\n    # via\n\
                         patsy==1.0.1  # via statsmodels\n\
                         scipy==1.17.1  # via scikit-learn, statsmodels\n\
                         statsmodels==0.15.0  # via -r requirements.in\n\
                         tzdata==2026.6 ; sys_platform == 'win32'  # via pandas\n";
        let needs = dependencies_from_annotations(annotated);
        assert_eq!(needs["statsmodels"], BTreeSet::from(["patsy".to_owned(), "scipy".to_owned()]));
        assert_eq!(needs["pandas"], BTreeSet::from(["tzdata".to_owned()]));
        assert!(!needs.contains_key("-r requirements.in"));
    }
}
