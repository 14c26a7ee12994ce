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
//! `.pyc`); anything else is compiled from the source. The sources
//! themselves are checked against this build's, byte for byte, each time a
//! runtime takes the folder and each time a sandbox binds it.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use airlock_core::driver::{
    COMPILED_FILES, DRIVER_DIR, DRIVER_FILES, DRIVER_FINGERPRINT, FOLDER_USE_NOTED_EVERY, folder_holds_this_driver,
    note_folder_used,
};

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
/// `executable`: found in the cache, else made now. `None` when no folder
/// this process can trust can be had (no data directory, one another user
/// can write): each run then brings the driver's sources, compiled inside.
pub(crate) fn driver_folder(executable: &Path) -> Option<PathBuf> {
    let dir = airlock_core::paths::data_dir().ok()?.join("cache/driver");
    driver_folder_in(&dir, executable)
}

/// [`driver_folder`], kept in `dir`: one folder per interpreter (as the file
/// it is now) and driver (its every source, by their fingerprint, and where
/// it is bound inside, which its bytecode names). A folder is used only if
/// it holds this driver and no other user can change it
/// ([`folder_holds_this_driver`]); one that does not (damaged, left half
/// made) is made again.
pub(crate) fn driver_folder_in(dir: &Path, executable: &Path) -> Option<PathBuf> {
    let identity = interpreter_identity(executable)?;
    let key = format!("{identity}\n{DRIVER_DIR}\n{DRIVER_FINGERPRINT:016x}");
    let folder = dir.join(&airlock_core::sha256_hex(key.as_bytes())[..KEY_CHARS]);
    let owner = rustix::process::geteuid().as_raw();
    // Noted before it is checked: a folder about to be used is never one a
    // pruner that reads its mtime after this takes for unused.
    note_folder_used(&folder);
    if folder_holds_this_driver(&folder, owner) {
        return Some(folder);
    }
    // Whatever went wrong making it, the folder is used only as checked,
    // and the others pruned only where it passed (its parents ours alone).
    let _ = make_folder(dir, &folder, executable);
    let made = folder_holds_this_driver(&folder, owner);
    if made {
        remove_unused_folders(dir, &folder);
    }
    made.then_some(folder)
}

/// The length of a folder's name: hexadecimal digits of its key's hash.
const KEY_CHARS: usize = 32;

/// A folder nothing has noted using for this long is removed when another
/// is made ([`remove_unused_folders`]): about 130 KB each, one per
/// interpreter and airlock build, would otherwise pile up with every
/// upgrade. Many times [`FOLDER_USE_NOTED_EVERY`], so that a folder in use
/// is never this old.
const UNUSED_FOR: std::time::Duration = FOLDER_USE_NOTED_EVERY.saturating_mul(30);

/// Removes the driver folders in `dir` but `made` whose mtime, which every
/// runtime and sandbox that uses one keeps within a day
/// ([`note_folder_used`]), is older than [`UNUSED_FOR`]. Only once a folder
/// was made (a new interpreter or airlock build, or one found damaged) and
/// passed its check, so never through a cache folder another user could
/// swap. A folder removed while something held it costs that holder its
/// speed: a runtime that finds none makes it again, and a sandbox binds
/// only a folder it checked, each noting it first. One window stays: a
/// sandbox that checked a folder unused for a month in the microseconds
/// before another process removes it fails to be made, and says so.
fn remove_unused_folders(dir: &Path, made: &Path) {
    let unused = |path: &Path| {
        fs::symlink_metadata(path)
            .ok()
            .filter(fs::Metadata::is_dir)
            .and_then(|meta| meta.modified().ok())
            .and_then(|modified| modified.elapsed().ok())
            .is_some_and(|age| age > UNUSED_FOR)
    };
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let is_key = name.len() == KEY_CHARS
            && name.to_str().is_some_and(|n| n.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
        // Its mtime read just before the removal: one noted meanwhile stays.
        if is_key && path != made && unused(&path) {
            let _ = remove(&path);
        }
    }
}

/// Each staging folder of this process has a name of its own: two threads
/// making the same folder at once must not write into each other's.
static STAGING: AtomicU64 = AtomicU64::new(0);

/// Writes the driver's sources and, where `executable` compiles them, their
/// bytecode into a staging folder below `dir`, then renames it to `folder`:
/// a folder that exists is whole. Readable by everyone, as every tree bound
/// into a sandbox must be when the sandbox's user is not the caller, and
/// writable by its owner alone, whatever the umask.
fn make_folder(dir: &Path, folder: &Path, executable: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    remove_stale_staging(dir);
    // The cache of an earlier airlock, which kept the bytecode alone.
    if let Some(cache) = dir.parent() {
        let _ = fs::remove_dir_all(cache.join("bytecode"));
    }
    let name = folder.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let staging =
        dir.join(format!(".{name}.{}.{}{STAGING_SUFFIX}", std::process::id(), STAGING.fetch_add(1, Ordering::Relaxed)));
    // Made before the interpreter is asked to compile: a folder that cannot
    // be written costs no compile.
    fs::create_dir(&staging)?;
    let written = (|| {
        for (name, source) in DRIVER_FILES {
            write_readable(&staging.join(name), source.as_bytes())?;
        }
        // Without bytecode, the folder still saves each run its copy; the
        // driver is then compiled inside at each run.
        let sources: Vec<(&str, &str)> = COMPILED_FILES.iter().map(|&(name, _, source)| (name, source)).collect();
        if let Some(bytecode) = compile_on_host(executable, &sources) {
            for ((_, pyc, _), content) in COMPILED_FILES.iter().zip(&bytecode) {
                write_readable(&staging.join(pyc), content)?;
            }
        }
        fs::set_permissions(&staging, fs::Permissions::from_mode(0o755))?;
        // Another process may have made it meanwhile; else what is there is
        // damaged (a rename does not replace a folder that holds anything).
        if folder_holds_this_driver(folder, rustix::process::geteuid().as_raw()) {
            return Ok(());
        }
        if fs::symlink_metadata(folder).is_ok() {
            remove(folder)?;
        }
        fs::rename(&staging, folder)
    })();
    let _ = remove(&staging);
    written
}

const STAGING_SUFFIX: &str = ".tmp";

/// Removes the staging folders that processes killed while they wrote left
/// here more than ten minutes ago.
fn remove_stale_staging(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let old = entry
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() > 600);
        if name.starts_with('.') && name.ends_with(STAGING_SUFFIX) && old {
            let _ = remove(&entry.path());
        }
    }
}

/// Removes a folder, a file or a link at `path` (never what a link names).
fn remove(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
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

    /// A cache folder of its own (in a folder removed with the returned
    /// guard), and the driver's folder made in it for `python`.
    fn folder_in_a_new_cache(python: &Path) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache/driver");
        let folder = driver_folder_in(&cache, python).expect("the folder is made");
        (dir, cache, folder)
    }

    fn owner() -> u32 {
        rustix::process::geteuid().as_raw()
    }

    #[test]
    fn the_folder_is_made_once_whole_and_readable_then_found() {
        let Some(python) = host_python() else { return };
        let (_dir, cache, folder) = folder_in_a_new_cache(&python);
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
        for (_, pyc, _) in COMPILED_FILES {
            assert_eq!(&fs::read(folder.join(pyc)).unwrap()[4..8], b"\x03\x00\x00\x00", "a checked-hash .pyc");
        }
        assert!(folder_holds_this_driver(&folder, owner()));
        assert_eq!(fs::read_dir(&cache).unwrap().count(), 1, "one folder, no staging left");

        // Found, not made again: a mark left in it stays.
        fs::write(folder.join("mark"), "").unwrap();
        assert_eq!(driver_folder_in(&cache, &python).as_deref(), Some(folder.as_path()));
        assert!(folder.join("mark").exists());

        assert_eq!(driver_folder_in(&cache, Path::new("/nonexistent/python3")), None);
    }

    /// A folder that does not hold this driver, or that another user could
    /// change, is never taken: it is made again, or, where it cannot be,
    /// there is no folder (each run brings the driver). (Before, a length
    /// check let a changed driver_start.py of the same length run.)
    #[test]
    fn a_damaged_or_changed_folder_is_made_again() {
        let Some(python) = host_python() else { return };
        let (_dir, cache, folder) = folder_in_a_new_cache(&python);
        let changed = airlock_core::driver::DRIVER_START_SOURCE.replacen("exec(", "eval(", 1);
        assert!(
            changed.len() == airlock_core::driver::DRIVER_START_SOURCE.len()
                && changed != airlock_core::driver::DRIVER_START_SOURCE
        );
        type Damage = (&'static str, fn(&Path));
        let damages: [Damage; 9] = [
            ("a source gone", |f| fs::remove_file(f.join("driver_start.py")).unwrap()),
            ("a source cut short", |f| fs::write(f.join("driver.py"), "").unwrap()),
            ("a source changed, same length", |f| {
                let changed = airlock_core::driver::DRIVER_START_SOURCE.replacen("exec(", "eval(", 1);
                fs::write(f.join("driver_start.py"), changed).unwrap();
            }),
            ("a source replaced by a link", |f| {
                fs::remove_file(f.join("driver_report.py")).unwrap();
                std::os::unix::fs::symlink("/etc/passwd", f.join("driver_report.py")).unwrap();
            }),
            ("a file others may write", |f| {
                fs::set_permissions(f.join("driver.pyc"), fs::Permissions::from_mode(0o666)).unwrap()
            }),
            ("the folder closed to others", |f| fs::set_permissions(f, fs::Permissions::from_mode(0o700)).unwrap()),
            // Sticky does not close a folder: anyone may add the bytecode it lacks.
            ("the folder open to all, sticky", |f| {
                fs::remove_file(f.join("driver.pyc")).unwrap();
                fs::set_permissions(f, fs::Permissions::from_mode(0o1777)).unwrap();
            }),
            ("a file open to all, sticky", |f| {
                fs::set_permissions(f.join("driver.py"), fs::Permissions::from_mode(0o1666)).unwrap()
            }),
            ("bytecode replaced by a link", |f| {
                fs::remove_file(f.join("driver.pyc")).unwrap();
                std::os::unix::fs::symlink("/nonexistent/driver.pyc", f.join("driver.pyc")).unwrap();
            }),
        ];
        for (what, damage) in damages {
            fs::write(folder.join("mark"), "").unwrap();
            damage(&folder);
            assert!(!folder_holds_this_driver(&folder, owner()), "{what}: taken as it is");
            assert_eq!(driver_folder_in(&cache, &python).as_deref(), Some(folder.as_path()), "{what}");
            assert!(
                folder_holds_this_driver(&folder, owner()) && !folder.join("mark").exists(),
                "{what}: not made again"
            );
        }

        // A cache folder another user could swap the folder in: none used.
        fs::set_permissions(&cache, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!folder_holds_this_driver(&folder, owner()));
        // (Made again, and the cache folder closed again, by its owner.)
        assert_eq!(driver_folder_in(&cache, &python).as_deref(), Some(folder.as_path()));
        assert_eq!(fs::metadata(&cache).unwrap().permissions().mode() & 0o777, 0o755);
        // A file another user owns (who could change it): not taken.
        if owner() == 0 {
            std::os::unix::fs::chown(folder.join("driver.py"), Some(65534), None).unwrap();
            assert!(!folder_holds_this_driver(&folder, owner()), "a file nobody owns is taken");
            assert_eq!(driver_folder_in(&cache, &python).as_deref(), Some(folder.as_path()));
            assert_eq!(fs::metadata(folder.join("driver.py")).unwrap().uid(), 0, "not made again");
        }
    }

    fn set_age(path: &Path, days: u64) {
        let when = std::time::SystemTime::now() - std::time::Duration::from_secs(days * 24 * 3600);
        fs::File::open(path).unwrap().set_modified(when).unwrap();
    }

    fn age_in_days(path: &Path) -> u64 {
        fs::symlink_metadata(path).unwrap().modified().unwrap().elapsed().unwrap_or_default().as_secs() / (24 * 3600)
    }

    /// A folder in use is noted as such (its mtime, at most once a day), and
    /// a folder nothing used for a month is removed when another is made:
    /// only a folder with a key's name, never a link or anything else. (Before,
    /// every interpreter's and airlock build's folder stayed for good.)
    #[test]
    fn a_folder_unused_for_a_month_is_removed_when_another_is_made() {
        let Some(python) = host_python() else { return };
        let (dir, cache, folder) = folder_in_a_new_cache(&python);

        set_age(&folder, 10);
        assert_eq!(driver_folder_in(&cache, &python).as_deref(), Some(folder.as_path()));
        assert_eq!(age_in_days(&folder), 0, "a folder taken is noted as used");
        let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        fs::File::open(&folder).unwrap().set_modified(an_hour_ago).unwrap();
        driver_folder_in(&cache, &python).unwrap();
        assert_eq!(fs::metadata(&folder).unwrap().modified().unwrap(), an_hour_ago, "noted at most once a day");

        let key = |c: char| cache.join(c.to_string().repeat(KEY_CHARS));
        let (old, recent, not_a_key, linked) = (key('a'), key('b'), cache.join("old-but-not-a-key"), key('c'));
        let upper_case = key('D');
        let outside = dir.path().join("outside");
        for made in [&old, &recent, &not_a_key, &upper_case, &outside] {
            fs::create_dir(made).unwrap();
            fs::write(made.join("file"), "").unwrap();
        }
        std::os::unix::fs::symlink(&outside, &linked).unwrap();
        for (path, days) in
            [(&old, 31), (&recent, 29), (&not_a_key, 90), (&upper_case, 90), (&outside, 90), (&folder, 31)]
        {
            set_age(path, days);
        }

        // Another interpreter (the same file by another path: another key).
        let other = dir.path().join("python-by-another-path");
        std::os::unix::fs::symlink(&python, &other).unwrap();
        let made = driver_folder_in(&cache, &other).unwrap();
        assert_ne!(made, folder);
        assert!(!old.exists() && !folder.exists(), "folders unused for a month are removed");
        assert!(recent.join("file").exists() && not_a_key.join("file").exists() && made.exists());
        assert!(upper_case.join("file").exists(), "no key is upper case");
        assert!(fs::symlink_metadata(&linked).is_ok() && outside.join("file").exists(), "a link is not followed");
    }

    #[test]
    fn two_threads_making_the_same_folder_both_get_it_whole() {
        let Some(python) = host_python() else { return };
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache/driver");
        let made: Vec<Option<PathBuf>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4).map(|_| scope.spawn(|| driver_folder_in(&cache, &python))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let folder = made[0].clone().expect("made");
        assert!(made.iter().all(|m| m.as_deref() == Some(folder.as_path())), "{made:?}");
        assert!(folder_holds_this_driver(&folder, owner()));
        assert_eq!(fs::read_dir(&cache).unwrap().count(), 1, "no staging folder left");
    }
}
