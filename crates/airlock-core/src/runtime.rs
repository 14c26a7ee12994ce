//! What the code runs with: an interpreter, the host folders it needs, and
//! the environment the runtime itself sets.

use std::collections::BTreeMap;
use std::path::PathBuf;

use airlock_policy::ImageRef;

/// The environment every sandbox starts from, before the runtime's and the
/// policy's own variables. Nothing else is inherited from the caller.
pub const BASE_ENV: [(&str, &str); 4] =
    [("PATH", "/usr/local/bin:/usr/bin:/bin"), ("HOME", "/tmp"), ("LANG", "C.UTF-8"), ("TMPDIR", "/tmp")];

/// A host folder a runtime needs, and where it appears in the sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeMount {
    pub host: PathBuf,
    pub sandbox: PathBuf,
}

impl RuntimeMount {
    /// A folder that appears at the same path inside as outside (an
    /// interpreter whose library path is compiled in).
    pub fn same_path(path: impl Into<PathBuf>) -> RuntimeMount {
        let path = path.into();
        RuntimeMount { host: path.clone(), sandbox: path }
    }
}

/// A Python runtime: an interpreter on the host, and what it needs to run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Runtime {
    /// The interpreter to execute, as a path inside the sandbox.
    pub python: PathBuf,
    /// Host folders the interpreter needs (its installation, an image's
    /// packages), mounted read-only. The host's /usr is always there.
    pub mounts: Vec<RuntimeMount>,
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
}

impl Runtime {
    /// The environment the code receives: the base, then the runtime's
    /// variables, then the policy's.
    pub fn environment(&self, policy_env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut env: BTreeMap<String, String> =
            BASE_ENV.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        env.extend(self.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        env.extend(policy_env.iter().map(|(k, v)| (k.clone(), v.clone())));
        env
    }
}
