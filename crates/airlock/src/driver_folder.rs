//! The driver's folder: the driver's files for one interpreter, made once on
//! the host, kept in airlock's data directory and bound read-only into every
//! sandbox at `DRIVER_DIR` (see `Runtime::driver_dir`).
//!
//! Bound once per sandbox rather than copied into each run: the driver and
//! its bytecode are about 100 KB, the same for every run of an interpreter,
//! and a run that brought them paid for them at every step (encoded into
//! its plan, decoded by the helper, written into the run's tmpfs, held in
//! each pooled sandbox's memory).
//!
//! Python compiles the script it is given at every start, and the driver
//! (`airlock_core::driver`) is a few hundred lines: its compile was about a
//! tenth of a small run. So the folder holds the driver's bytecode too, made
//! by the interpreter the runs use, run on the host as `python -I -S`
//! (isolated and without `site`: no environment variable, no user site, no
//! package's `.pth` runs; it reads nothing but the driver's source on its
//! standard input). Inside, `driver_start.py` uses a `.pyc` only if this
//! interpreter made it from the very source beside it (its magic number and
//! the source's hash, as Python's import system checks a checked-hash
//! `.pyc`); anything else is compiled from the source. A wrong entry here
//! costs the compile, never a difference in what runs.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use airlock_core::driver::{COMPILED_FILES, DRIVER_DIR, DRIVER_FILES, DRIVER_FINGERPRINT};

/// Compiles each file the arguments name (its path inside, its length; the
/// sources follow one another on standard input) into a checked-hash .pyc,
/// written to standard output as its length (8 bytes, little-endian) and its
/// bytes. Only modules built into the interpreter are imported.
const COMPILE: &str = r#"import _imp, marshal, sys
import _frozen_importlib_external as bootstrap
data = sys.stdin.buffer.read()
args, at, out = sys.argv[1:], 0, sys.stdout.buffer
for path, size in zip(args[::2], args[1::2]):
    source, at = data[at:at + int(size)], at + int(size)
    code = compile(source, path, "exec", dont_inherit=True)
    pyc = bootstrap.MAGIC_NUMBER + b"\x03\x00\x00\x00"
    pyc += _imp.source_hash(bootstrap._RAW_MAGIC_NUMBER, source) + marshal.dumps(code)
    out.write(len(pyc).to_bytes(8, "little") + pyc)
"#;

/// The driver's folder for the interpreter whose executable on the host is
/// `executable`: found in the cache, else made now. `None` when it cannot be
/// had (no data directory, an interpreter that does not compile): each run
/// then brings the driver's sources, compiled inside.
pub(crate) fn driver_folder(executable: &Path) -> Option<PathBuf> {
    let dir = airlock_core::paths::data_dir().ok()?.join("cache/driver");
    driver_folder_in(&dir, executable)
}

/// [`driver_folder`], kept in `dir`: one folder per interpreter (as the file
/// it is now) and driver (its every source, by their fingerprint, and where
/// it is bound inside, which its bytecode names).
pub(crate) fn driver_folder_in(dir: &Path, executable: &Path) -> Option<PathBuf> {
    let identity = interpreter_identity(executable)?;
    let key = format!("{identity}\n{DRIVER_DIR}\n{DRIVER_FINGERPRINT:016x}");
    let folder = dir.join(&airlock_core::sha256_hex(key.as_bytes())[..32]);
    if is_whole(&folder) {
        return Some(folder);
    }
    let sources: Vec<(&str, &str)> = COMPILED_FILES.iter().map(|&(name, _, source)| (name, source)).collect();
    let bytecode = compile_on_host(executable, &sources)?;
    make_folder(dir, &folder, &bytecode).ok()?;
    Some(folder)
}

/// Whether `folder` holds every file of the driver, each source at its
/// length: a folder damaged on the host (a file removed or cut short) is
/// made again rather than bound into every sandbox, whose runs it would
/// fail. One `stat` a file: the folder is checked at every start.
fn is_whole(folder: &Path) -> bool {
    let size = |name: &str| fs::symlink_metadata(folder.join(name)).ok().filter(|m| m.is_file()).map(|m| m.len());
    DRIVER_FILES.iter().all(|(name, source)| size(name) == Some(source.len() as u64))
        && COMPILED_FILES.iter().all(|(_, pyc, _)| size(pyc).is_some_and(|len| len > 16))
}

/// Writes the driver's sources and `bytecode` into a folder of their own
/// below `dir`, then renames it to `folder`: a folder that exists is whole.
/// Readable by everyone, as every tree bound into a sandbox must be when
/// the sandbox's user is not the caller.
fn make_folder(dir: &Path, folder: &Path, bytecode: &[Vec<u8>]) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let name = folder.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let staging = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    // What a process of this pid left behind, killed while it wrote.
    let _ = fs::remove_dir_all(&staging);
    // A damaged folder of this name goes first (a rename does not replace
    // a folder that holds anything).
    if folder.exists() && !is_whole(folder) {
        let _ = fs::remove_dir_all(folder);
    }
    fs::create_dir(&staging)?;
    let written = (|| {
        for (name, source) in DRIVER_FILES {
            write_readable(&staging.join(name), source.as_bytes())?;
        }
        for ((_, pyc, _), content) in COMPILED_FILES.iter().zip(bytecode) {
            write_readable(&staging.join(pyc), content)?;
        }
        fs::set_permissions(&staging, fs::Permissions::from_mode(0o755))?;
        fs::rename(&staging, folder)
    })();
    if written.is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    match written {
        // Another process made the same folder first: it is as good.
        Err(_) if folder.is_dir() => Ok(()),
        other => other,
    }
}

fn write_readable(path: &Path, content: &[u8]) -> io::Result<()> {
    fs::write(path, content)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644))
}

/// What the bytecode depends on besides the source: the interpreter, as the
/// file it is now (a reinstall at the same path is another interpreter).
fn interpreter_identity(executable: &Path) -> Option<String> {
    let meta = fs::metadata(executable).ok()?;
    Some(format!(
        "{}|{}|{}|{}|{}.{}",
        executable.display(),
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec()
    ))
}

/// Runs `executable -I -S` on the host to compile `sources` (name in the
/// driver's folder, text); their .pyc files in order, or `None`.
fn compile_on_host(executable: &Path, sources: &[(&str, &str)]) -> Option<Vec<Vec<u8>>> {
    let mut command = Command::new(executable);
    command.args(["-I", "-S", "-c", COMPILE]);
    for (name, source) in sources {
        command.arg(format!("{DRIVER_DIR}/{name}")).arg(source.len().to_string());
    }
    let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().ok()?;
    let mut stdin = child.stdin.take()?;
    let written = sources.iter().try_for_each(|(_, source)| stdin.write_all(source.as_bytes()));
    drop(stdin);
    let output = child.wait_with_output().ok()?;
    if written.is_err() || !output.status.success() {
        return None;
    }
    let mut rest = output.stdout.as_slice();
    let mut files = Vec::new();
    for _ in sources {
        let (size, after) = rest.split_first_chunk::<8>()?;
        let size = usize::try_from(u64::from_le_bytes(*size)).ok()?;
        if after.len() < size {
            return None;
        }
        let (pyc, after) = after.split_at(size);
        files.push(pyc.to_vec());
        rest = after;
    }
    rest.is_empty().then_some(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_python() -> Option<PathBuf> {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path).map(|d| d.join("python3")).find(|p| p.is_file())
    }

    #[test]
    fn the_folder_is_made_once_whole_and_readable_then_found() {
        let Some(python) = host_python() else { return };
        let dir = tempfile::tempdir().unwrap();
        let folder = driver_folder_in(dir.path(), &python).expect("the folder is made");
        let mut names: Vec<String> =
            fs::read_dir(&folder).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "driver.py",
                "driver.pyc",
                "driver_report.py",
                "driver_report.pyc",
                "driver_start.py",
                "driver_template.py"
            ]
        );
        for (name, source) in DRIVER_FILES {
            assert_eq!(fs::read_to_string(folder.join(name)).unwrap(), source);
        }
        for (_, pyc, _) in COMPILED_FILES {
            assert_eq!(&fs::read(folder.join(pyc)).unwrap()[4..8], b"\x03\x00\x00\x00", "a checked-hash .pyc");
            let mode = fs::metadata(folder.join(pyc)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o644, "{pyc}");
        }
        assert_eq!(fs::metadata(&folder).unwrap().permissions().mode() & 0o777, 0o755);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "one folder, no staging left");

        // Found, not made again: a mark left in it stays.
        fs::write(folder.join("mark"), "").unwrap();
        assert_eq!(driver_folder_in(dir.path(), &python).as_deref(), Some(folder.as_path()));
        assert!(folder.join("mark").exists());

        // Damaged on the host (a file gone, a file cut short): made again, whole.
        for damage in
            [|f: &Path| fs::remove_file(f.join("driver_start.py")), |f: &Path| fs::write(f.join("driver.py"), "")]
        {
            damage(&folder).unwrap();
            assert_eq!(driver_folder_in(dir.path(), &python).as_deref(), Some(folder.as_path()));
            assert!(is_whole(&folder) && !folder.join("mark").exists(), "the damaged folder was not made again");
            fs::write(folder.join("mark"), "").unwrap();
        }

        assert_eq!(driver_folder_in(dir.path(), Path::new("/nonexistent/python3")), None);
    }

    #[test]
    fn a_folder_another_process_made_first_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("made-by-another");
        let bytecode = [vec![7; 32], vec![8; 32]];
        make_folder(dir.path(), &folder, &bytecode).unwrap();
        assert!(is_whole(&folder));
        // Made whole by another process between our look and our rename.
        fs::write(folder.join("mark"), "").unwrap();
        make_folder(dir.path(), &folder, &bytecode).expect("the other's folder stands");
        assert!(folder.join("mark").exists(), "the other's folder was replaced");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "the staging folder is removed");
    }
}
