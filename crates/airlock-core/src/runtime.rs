//! What the code runs with: an interpreter, the host folders it needs, and
//! the environment the runtime itself sets.

use std::collections::BTreeMap;
use std::path::PathBuf;

use airlock_policy::{ImageRef, Policy};

/// The environment every sandbox starts from, before the runtime's and the
/// policy's own variables. Nothing else is inherited from the caller.
pub const BASE_ENV: [(&str, &str); 4] =
    [("PATH", "/usr/local/bin:/usr/bin:/bin"), ("HOME", "/tmp"), ("LANG", "C.UTF-8"), ("TMPDIR", "/tmp")];

/// Where a runtime's interpreter installation appears in the sandbox,
/// whatever its path on the host: a fixed path, so that nothing the code can
/// read (`sys.executable`, /proc/self/mountinfo) names the host's folders.
pub const PYTHON_MOUNT: &str = "/opt/airlock/python";

/// A host folder a runtime needs, and where it appears in the sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeMount {
    pub host: PathBuf,
    pub sandbox: PathBuf,
    /// Whether the code may write below it. Only an image build asks for
    /// this, for the one directory it fills: the new environment, or the
    /// folder downloads land in. The backend hands such a directory to the
    /// sandbox's host user for the sandbox's life (as root: chown to it), and
    /// whoever asked takes it back and checks what is in it afterwards.
    pub writable: bool,
}

impl RuntimeMount {
    /// A read-only folder at `sandbox`.
    pub fn read_only(host: impl Into<PathBuf>, sandbox: impl Into<PathBuf>) -> RuntimeMount {
        RuntimeMount { host: host.into(), sandbox: sandbox.into(), writable: false }
    }

    /// A read-only folder that appears at the same path inside as outside (an
    /// interpreter whose library path is compiled in).
    pub fn same_path(path: impl Into<PathBuf>) -> RuntimeMount {
        let path = path.into();
        RuntimeMount::read_only(path.clone(), path)
    }

    /// A host directory the code may write, at `sandbox`. See [`RuntimeMount::writable`].
    pub fn writable(host: impl Into<PathBuf>, sandbox: impl Into<PathBuf>) -> RuntimeMount {
        RuntimeMount { host: host.into(), sandbox: sandbox.into(), writable: true }
    }
}

/// A small file or link a runtime needs in the sandbox, written by airlock
/// into the sandbox's own root (a venv's `pyvenv.cfg` naming where its
/// interpreter is inside, the venv's `bin/python`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuntimeFile {
    Text { sandbox: PathBuf, content: String },
    Link { sandbox: PathBuf, target: PathBuf },
}

/// A Python runtime: an interpreter on the host, and what it needs to run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Runtime {
    /// The interpreter to execute, as a path inside the sandbox.
    pub python: PathBuf,
    /// Host folders the interpreter needs (its installation, an image's
    /// packages), mounted read-only unless marked writable. The host's /usr
    /// is always there.
    pub mounts: Vec<RuntimeMount>,
    /// Files and links made in the sandbox's root for the runtime.
    pub files: Vec<RuntimeFile>,
    /// Variables the runtime sets (the matplotlib backend...); the policy's
    /// own `env` is applied over these.
    pub env: BTreeMap<String, String>,
    /// The image this runtime comes from, named in the record.
    pub image: Option<ImageRef>,
    /// Files placed in the sandbox's /tmp when it is made (a prebuilt font
    /// cache...): path below /tmp, and content.
    pub tmp_seed: Vec<(String, Vec<u8>)>,
    /// `python X.Y.Z` and the packages it holds, for messages about a missing module.
    pub describe: String,
    /// The host folder holding the driver for this interpreter: its sources
    /// and, where the interpreter could make it, their bytecode
    /// ([`crate::driver::DRIVER_FILES`]). The Linux backend binds it
    /// read-only at [`crate::driver::DRIVER_DIR`] once per sandbox, so that
    /// no run copies the driver in, if it still holds this driver then
    /// ([`crate::driver::folder_holds_this_driver`]). `None`, or a folder
    /// that no longer does: the driver's sources travel with each run's
    /// program, compiled inside.
    pub driver_dir: Option<PathBuf>,
    /// The venv (its prefix, inside the sandbox) whose `site` set-up is
    /// known before the interpreter starts, or `None` to let Python's own
    /// `site` module run. Known means: the venv leaves out the system's
    /// site-packages, and neither its site-packages nor the interpreter's
    /// own library holds anything `site` would run (a `.pth` file, a
    /// `sitecustomize` module). Python then starts without `site` (`-S`)
    /// and the driver sets up what `site` would have (driver.py,
    /// `_set_up_site`): that skips site's scans of the path and its
    /// `import os`, about 2 ms of a cold start here.
    pub known_site: Option<PathBuf>,
}

impl Runtime {
    /// The environment the code receives: the base, then the runtime's
    /// variables, then the thread counts for numerical libraries, then the
    /// policy's own (which win).
    pub fn environment(&self, policy: &Policy) -> BTreeMap<String, String> {
        let mut env: BTreeMap<String, String> =
            BASE_ENV.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        env.extend(self.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        // BLAS and OpenMP start a thread per host CPU, and a sandbox given
        // fewer CPUs than that spends its quota spinning them: tell them how
        // many CPUs the sandbox really has.
        let threads = (policy.limits.cpus.floor() as u64).max(1).to_string();
        for key in THREAD_ENV {
            env.insert(key.to_owned(), threads.clone());
        }
        env.extend(policy.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        env
    }
}

/// The variables numerical libraries read for their thread counts.
pub const THREAD_ENV: [&str; 4] = ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"];
