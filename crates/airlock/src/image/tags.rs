//! Which wheels an interpreter can install, best first (the wheel tags of
//! PEP 425 and the platform tags of PEP 600 and 656), decided on the host from
//! what the interpreter said about itself, so that the lock names the one
//! file to fetch before anything is fetched.

use std::collections::HashMap;

use crate::interpreter::Interpreter;

/// A wheel's file name, split: `{name}-{version}(-{build})?-{python}-{abi}-{platform}.whl`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WheelName {
    /// The distribution name as written (normalise with [`normalize`]).
    pub distribution: String,
    pub version: String,
    /// Each (python, abi, platform) the wheel claims, its compressed tag sets expanded.
    pub tags: Vec<(String, String, String)>,
}

impl WheelName {
    /// Parses a wheel file name; `None` if it is not one.
    pub fn parse(file: &str) -> Option<WheelName> {
        let stem = file.strip_suffix(".whl")?;
        let parts: Vec<&str> = stem.split('-').collect();
        let (distribution, version, python, abi, platform) = match parts[..] {
            [d, v, p, a, pl] | [d, v, _, p, a, pl] => (d, v, p, a, pl),
            _ => return None,
        };
        if [distribution, version, python, abi, platform].iter().any(|s| s.is_empty()) {
            return None;
        }
        let mut tags = Vec::new();
        for p in python.split('.') {
            for a in abi.split('.') {
                for pl in platform.split('.') {
                    tags.push((p.to_owned(), a.to_owned(), pl.to_owned()));
                }
            }
        }
        Some(WheelName { distribution: distribution.to_owned(), version: version.to_owned(), tags })
    }
}

/// A distribution name as PEP 503 compares them: lower case, runs of `-`,
/// `_` and `.` made one `-`.
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut separator = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            separator = true;
        } else {
            if separator && !out.is_empty() {
                out.push('-');
            }
            separator = false;
            out.extend(c.to_lowercase());
        }
    }
    out
}

/// The tags an interpreter installs, each with its rank (0 is best).
#[derive(Clone, Debug)]
pub struct SupportedTags {
    rank: HashMap<(String, String, String), usize>,
    /// For messages: what this interpreter is, in tag terms.
    pub describe: String,
}

impl SupportedTags {
    /// The tags of `python`, in the order `packaging.tags.sys_tags()` gives.
    pub fn of(python: &Interpreter) -> SupportedTags {
        let ordered = ordered_tags(python);
        let mut rank = HashMap::new();
        for (index, tag) in ordered.into_iter().enumerate() {
            rank.entry(tag).or_insert(index);
        }
        let describe = format!(
            "{} {} on {} ({})",
            python.platform.implementation,
            python.version,
            python.platform.machine,
            if python.platform.libc.is_empty() {
                "no known libc".to_owned()
            } else {
                format!("{} {}", python.platform.libc, python.platform.libc_version)
            }
        );
        SupportedTags { rank, describe }
    }

    /// The rank of the best tag of `wheel` this interpreter supports, or
    /// `None` if it supports none of them.
    pub fn rank(&self, wheel: &WheelName) -> Option<usize> {
        wheel.tags.iter().filter_map(|tag| self.rank.get(tag).copied()).min()
    }
}

fn ordered_tags(python: &Interpreter) -> Vec<(String, String, String)> {
    let (major, minor) = major_minor(&python.version);
    let platform = &python.platform;
    let platforms = platform_tags(&platform.machine, &platform.libc, &platform.libc_version);
    let mut tags = Vec::new();
    let mut push = |p: &str, a: &str, pl: &str| tags.push((p.to_owned(), a.to_owned(), pl.to_owned()));
    let cpython = platform.implementation == "cpython";
    if cpython {
        let interpreter = format!("cp{major}{minor}");
        let free_threaded = platform.abiflags.contains('t');
        let abi = format!("{interpreter}{}", platform.abiflags);
        for pl in &platforms {
            push(&interpreter, &abi, pl);
        }
        if !free_threaded {
            for pl in &platforms {
                push(&interpreter, "abi3", pl);
            }
        }
        for pl in &platforms {
            push(&interpreter, "none", pl);
        }
        if !free_threaded {
            for older in (2..minor).rev() {
                for pl in &platforms {
                    push(&format!("cp{major}{older}"), "abi3", pl);
                }
            }
        }
    }
    // Pure-Python tags: this version, the major alone, then older minors.
    let mut versions = vec![format!("py{major}{minor}"), format!("py{major}")];
    versions.extend((0..minor).rev().map(|m| format!("py{major}{m}")));
    for version in &versions {
        for pl in &platforms {
            push(version, "none", pl);
        }
    }
    if cpython {
        push(&format!("cp{major}{minor}"), "none", "any");
    }
    for version in &versions {
        push(version, "none", "any");
    }
    tags
}

/// Linux platform tags, best first: `manylinux_2_N` from the host's glibc
/// down (with the legacy aliases where they fall), or `musllinux_1_N`, then
/// the bare `linux_ARCH`.
fn platform_tags(machine: &str, libc: &str, libc_version: &str) -> Vec<String> {
    let arch = machine.replace(['-', '.', ' '], "_");
    let mut tags = Vec::new();
    let (libc_major, libc_minor) = major_minor(libc_version);
    match libc {
        "glibc" if libc_major == 2 => {
            // The oldest glibc each architecture's manylinux tags start at.
            let oldest = if matches!(arch.as_str(), "x86_64" | "i686") { 5 } else { 17 };
            for minor in (oldest..=libc_minor).rev() {
                tags.push(format!("manylinux_2_{minor}_{arch}"));
                let legacy = match minor {
                    17 => Some("manylinux2014"),
                    12 => Some("manylinux2010"),
                    5 => Some("manylinux1"),
                    _ => None,
                };
                if let Some(legacy) = legacy {
                    tags.push(format!("{legacy}_{arch}"));
                }
            }
        }
        "musl" if libc_major == 1 => {
            for minor in (0..=libc_minor).rev() {
                tags.push(format!("musllinux_1_{minor}_{arch}"));
            }
        }
        _ => {}
    }
    tags.push(format!("linux_{arch}"));
    tags
}

fn major_minor(version: &str) -> (u32, u32) {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpreter::Platform;

    fn python(version: &str, abiflags: &str) -> Interpreter {
        Interpreter {
            executable: "/usr/bin/python3".into(),
            base_prefix: "/usr".into(),
            prefix: "/usr".into(),
            version: version.into(),
            platform: Platform {
                implementation: "cpython".into(),
                machine: "x86_64".into(),
                libc: "glibc".into(),
                libc_version: "2.36".into(),
                abiflags: abiflags.into(),
            },
        }
    }

    fn rank(tags: &SupportedTags, file: &str) -> Option<usize> {
        tags.rank(&WheelName::parse(file).unwrap())
    }

    #[test]
    fn the_best_wheel_wins_and_foreign_ones_never_fit() {
        let tags = SupportedTags::of(&python("3.11.7", ""));
        let native = rank(&tags, "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl");
        let legacy = rank(&tags, "fonttools-4.68.0-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl");
        let abi3 = rank(&tags, "x-1-cp38-abi3-manylinux_2_17_x86_64.whl");
        let pure = rank(&tags, "fonttools-4.68.0-py3-none-any.whl");
        let old_pure = rank(&tags, "tzdata-2026.6-py2.py3-none-any.whl");
        assert!(native < legacy && legacy < abi3 && abi3 < pure, "{native:?} {legacy:?} {abi3:?} {pure:?}");
        assert!(old_pure.is_some());
        for foreign in [
            "numpy-2.4.6-cp312-cp312-manylinux_2_27_x86_64.whl",
            "numpy-2.4.6-cp311-cp311-manylinux_2_39_x86_64.whl",
            "numpy-2.4.6-cp311-cp311-manylinux_2_17_aarch64.whl",
            "numpy-2.4.6-cp311-cp311-musllinux_1_2_x86_64.whl",
            "numpy-2.4.6-cp311-cp311-win_amd64.whl",
            "numpy-2.4.6-cp311-cp311-macosx_14_0_arm64.whl",
            "x-1-cp311-cp311t-manylinux_2_17_x86_64.whl",
        ] {
            assert_eq!(rank(&tags, foreign), None, "{foreign}");
        }
    }

    #[test]
    fn free_threaded_interpreters_take_no_abi3() {
        let tags = SupportedTags::of(&python("3.13.1", "t"));
        assert!(rank(&tags, "x-1-cp313-cp313t-manylinux_2_17_x86_64.whl").is_some());
        assert_eq!(rank(&tags, "x-1-cp38-abi3-manylinux_2_17_x86_64.whl"), None);
        assert_eq!(rank(&tags, "x-1-cp313-cp313-manylinux_2_17_x86_64.whl"), None);
    }

    #[test]
    fn wheel_names_are_read_and_names_normalised() {
        let name = WheelName::parse("python_dateutil-4.0.0-1-py2.py3-none-any.whl").unwrap();
        assert_eq!(
            (name.distribution.as_str(), name.version.as_str(), name.tags.len()),
            ("python_dateutil", "4.0.0", 2)
        );
        assert!(WheelName::parse("pkg-1.0.tar.gz").is_none());
        assert!(WheelName::parse("pkg-1.0-py3-none.whl").is_none());
        assert_eq!(normalize("Python_Dateutil"), "python-dateutil");
        assert_eq!(normalize("zope.interface"), "zope-interface");
        assert_eq!(normalize("a__b--c"), "a-b-c");
    }
}
