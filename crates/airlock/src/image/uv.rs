//! uv, the resolver and installer every build step runs: a single binary
//! from a wheel on PyPI. It is downloaded code like any package, so it is
//! pinned twice (the wheel's hash, as PyPI publishes it, and the binary's),
//! checked before every use, and only ever run inside a sandbox.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::fetch::{self, FileCache, Wanted};
use super::lock::LockedFile;
use crate::Error;

/// The uv airlock was written against.
pub const UV_VERSION: &str = "0.13.9";

/// Where uv's folder appears inside a build step.
pub(crate) const UV_DIR: &str = "/opt/airlock-build/uv";

/// One architecture's pinned uv.
struct Pin {
    machine: &'static str,
    wheel: &'static str,
    url: &'static str,
    size: u64,
    wheel_sha256: &'static str,
    /// Of `uv-VERSION.data/scripts/uv` inside the wheel.
    binary_sha256: &'static str,
}

const PINS: [Pin; 2] = [
    Pin {
        machine: "x86_64",
        wheel: "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        url: "https://files.pythonhosted.org/packages/3d/aa/26d64642d808de4a652579ef950d7cd2d37f080a8babf9c67c6b75fc4c3f/uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        size: 17_606_939,
        wheel_sha256: "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",
        binary_sha256: "b73acdf73b96c3ac9e56d2fa933427b3ee6a901e3cce6ba1e3ecb3f91ca0d86a",
    },
    Pin {
        machine: "aarch64",
        wheel: "uv-0.13.9-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl",
        url: "https://files.pythonhosted.org/packages/57/15/94b6cd62ac3ff6550288328e8035288875197cbc183f51554b266a69877b/uv-0.13.9-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl",
        size: 18_026_789,
        wheel_sha256: "5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe",
        binary_sha256: "bbecb5ac518030bb5e84f1999c577228460192832ac24a92bd772735682979f4",
    },
];

fn pin() -> Result<&'static Pin, Error> {
    PINS.iter().find(|p| p.machine == std::env::consts::ARCH).ok_or_else(|| Error::ImageBuild {
        name: String::new(),
        reason: format!(
            "airlock pins uv only for {}; this host is {}",
            PINS.iter().map(|p| p.machine).collect::<Vec<_>>().join(" and "),
            std::env::consts::ARCH
        ),
    })
}

/// The uv wheel to fetch, if the binary is not unpacked and whole yet.
pub(crate) fn wanted(dir: &Path) -> Result<Option<Wanted>, Error> {
    let pin = pin()?;
    if binary_ok(dir, pin) {
        return Ok(None);
    }
    Ok(Some(Wanted {
        package: "uv".to_owned(),
        file: LockedFile {
            file_name: pin.wheel.to_owned(),
            url: pin.url.to_owned(),
            size: Some(pin.size),
            sha256: pin.wheel_sha256.to_owned(),
        },
    }))
}

/// The folder holding the checked `uv` binary: unpacked from the cached
/// wheel (whose hash the cache checked) when needed, and hashed again now.
pub(crate) fn binary_dir(dir: &Path, cache: &FileCache) -> Result<PathBuf, Error> {
    let pin = pin()?;
    let fail = |reason: String| Error::ImageBuild { name: String::new(), reason };
    let folder = dir.join(pin.binary_sha256);
    if binary_ok(dir, pin) {
        return Ok(folder);
    }
    let wheel = LockedFile {
        file_name: pin.wheel.to_owned(),
        url: pin.url.to_owned(),
        size: Some(pin.size),
        sha256: pin.wheel_sha256.to_owned(),
    };
    if !cache.holds(&wheel) {
        return Err(fail(format!("the uv wheel {} is not in the cache", pin.wheel)));
    }
    fs::create_dir_all(&folder).map_err(|e| fail(format!("creating {}: {e}", folder.display())))?;
    let tmp = folder.join(format!(".uv.{}-{}", std::process::id(), fetch::unique()));
    let unpacked = unpack(&cache.path(&wheel), &tmp);
    match unpacked {
        Ok(hash) if hash == pin.binary_sha256 => {}
        Ok(hash) => {
            let _ = fs::remove_file(&tmp);
            return Err(Error::HashMismatch {
                package: "uv".to_owned(),
                file: format!("{}: uv-{UV_VERSION}.data/scripts/uv", pin.wheel),
                expected: pin.binary_sha256.to_owned(),
                actual: hash,
            });
        }
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(fail(format!("unpacking uv from {}: {e}", pin.wheel)));
        }
    }
    fs::rename(&tmp, folder.join("uv")).map_err(|e| fail(format!("placing uv: {e}")))?;
    Ok(folder)
}

fn binary_ok(dir: &Path, pin: &Pin) -> bool {
    fetch::hash_file(&dir.join(pin.binary_sha256).join("uv")).is_ok_and(|(hash, _)| hash == pin.binary_sha256)
}

/// Writes the wheel's `uv` binary to `to` (mode 0755) and returns its SHA-256.
fn unpack(wheel: &Path, to: &Path) -> std::io::Result<String> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut archive = zip::ZipArchive::new(fs::File::open(wheel)?).map_err(std::io::Error::other)?;
    let mut entry = archive.by_name(&format!("uv-{UV_VERSION}.data/scripts/uv")).map_err(std::io::Error::other)?;
    let mut out = fs::OpenOptions::new().write(true).create_new(true).mode(0o755).open(to)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    // The binary is ~40 MB; a zip entry claiming more is not this wheel's.
    let mut left: u64 = 256 << 20;
    loop {
        let n = entry.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        left = left.checked_sub(n as u64).ok_or_else(|| std::io::Error::other("the uv binary is too large"))?;
        hasher.update(&buffer[..n]);
        out.write_all(&buffer[..n])?;
    }
    out.sync_all()?;
    Ok(hex::encode(hasher.finalize()))
}
