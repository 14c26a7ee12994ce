//! The driver's bytecode, made once per interpreter on the host and kept in
//! airlock's data directory.
//!
//! Python compiles the script it is given at every start, and the driver
//! (`airlock_core::driver`) is a few hundred lines: its compile was about a
//! tenth of a small run. So the runtime brings the driver's bytecode, made by
//! the interpreter the runs use, run on the host as `python -I -S` (isolated
//! and without `site`: no environment variable, no user site, no package's
//! `.pth` runs; it reads nothing but the driver's source on its standard
//! input). Inside, `driver_start.py` uses a `.pyc` only if this interpreter
//! made it from the very source beside it (its magic number and the source's
//! hash, as Python's import system checks a checked-hash `.pyc`); anything
//! else is compiled from the source as before. A wrong or missing entry here
//! costs the compile, never a difference in what runs.

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use airlock_core::driver::{COMPILED_FILES, PROGRAM_DIR, ProgramFile};

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

/// The driver's bytecode for the interpreter whose executable on the host is
/// `executable`: from the cache, else made now and cached. Empty when it
/// cannot be had (the driver is then compiled inside at each run).
pub(crate) fn driver_bytecode(executable: &Path) -> Vec<ProgramFile> {
    let Some(dir) = cache_dir() else { return Vec::new() };
    driver_bytecode_in(&dir, executable)
}

fn cache_dir() -> Option<PathBuf> {
    airlock_core::paths::data_dir().ok().map(|d| d.join("cache/bytecode"))
}

/// [`driver_bytecode`], cached in `dir`.
pub(crate) fn driver_bytecode_in(dir: &Path, executable: &Path) -> Vec<ProgramFile> {
    let Some(identity) = interpreter_identity(executable) else { return Vec::new() };
    let entries: Vec<(PathBuf, &'static str, &'static str, &'static str)> = COMPILED_FILES
        .iter()
        .map(|&(name, pyc, source)| {
            let key = airlock_core::sha256_hex(
                format!("{identity}\n{name}\n{}", airlock_core::sha256_hex(source.as_bytes())).as_bytes(),
            );
            (dir.join(format!("{}.pyc", &key[..32])), name, pyc, source)
        })
        .collect();
    let cached: Option<Vec<ProgramFile>> = entries
        .iter()
        .map(|(path, _, pyc, _)| fs::read(path).ok().map(|content| ProgramFile { name: pyc, content }))
        .collect();
    if let Some(files) = cached {
        return files;
    }
    let sources: Vec<(&str, &str)> = entries.iter().map(|(_, name, _, source)| (*name, *source)).collect();
    let Some(made) = compile_on_host(executable, &sources) else { return Vec::new() };
    if fs::create_dir_all(dir).is_ok() {
        for ((path, ..), content) in entries.iter().zip(&made) {
            // A cache: a failed save costs a compile next time, nothing more.
            let tmp = dir.join(format!(".{}.{}.tmp", std::process::id(), content.len()));
            if fs::write(&tmp, content).is_ok() && fs::rename(&tmp, path).is_err() {
                let _ = fs::remove_file(&tmp);
            }
        }
    }
    entries.iter().zip(made).map(|((_, _, pyc, _), content)| ProgramFile { name: pyc, content }).collect()
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

/// Runs `executable -I -S` on the host to compile `sources` (name in
/// [`PROGRAM_DIR`], text); their .pyc files in order, or `None`.
fn compile_on_host(executable: &Path, sources: &[(&str, &str)]) -> Option<Vec<Vec<u8>>> {
    let mut command = Command::new(executable);
    command.args(["-I", "-S", "-c", COMPILE]);
    for (name, source) in sources {
        command.arg(format!("{PROGRAM_DIR}/{name}")).arg(source.len().to_string());
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
    fn bytecode_is_made_once_then_read_from_the_cache() {
        let Some(python) = host_python() else { return };
        let dir = tempfile::tempdir().unwrap();
        let made = driver_bytecode_in(dir.path(), &python);
        assert_eq!(made.iter().map(|f| f.name).collect::<Vec<_>>(), ["driver.pyc", "driver_report.pyc"]);
        for file in &made {
            assert_eq!(&file.content[4..8], b"\x03\x00\x00\x00", "a checked-hash .pyc");
        }
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2, "one cache entry per file");
        assert_eq!(driver_bytecode_in(dir.path(), &python), made, "the cached entries are read back");
        assert!(driver_bytecode_in(dir.path(), Path::new("/nonexistent/python3")).is_empty());
    }
}
