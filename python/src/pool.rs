//! `airlock._native.Pool`: [`airlock::Pool`] for Python's `airlock.Pool`.
//!
//! The pool's sandboxes are made ready on its own thread; every call here
//! that can wait (making the pool, a cold sandbox, waiting for it to fill,
//! closing it) lets go of the GIL.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock::image::BuildEvent;
use airlock::{Backend, BackendKind, Policy, PoolMode, PoolOptions};
use pyo3::prelude::*;

use crate::errors::{Failure, Kind};
use crate::{NativeSandbox, helper, log_build, open_audit, parse_spec};

/// A pool. Python's `airlock.Pool` wraps it.
#[pyclass(frozen, module = "airlock._native", name = "Pool")]
pub(crate) struct NativePool {
    /// `None` once closed. A sandbox taken from it holds its own reference,
    /// so closing never pulls a sandbox from under a run.
    pool: Mutex<Option<Arc<airlock::Pool>>>,
}

#[pymethods]
impl NativePool {
    /// A pool of `size` sandboxes with the `PolicySpec` `spec_json`, running
    /// image `image` (built first if it is the default image and missing),
    /// each importing `preload` (`None`: the default preload) before it
    /// waits; one ready longer than `idle_expiry_s` is made anew; no refill
    /// takes the ready ones past `memory_budget_mb`; a run may set the
    /// variables `env_at_claim` names warm; `mode` (`None`: pooled) says how
    /// the ready ones are made. Returns at once: the pool fills in the
    /// background.
    #[new]
    #[pyo3(signature = (spec_json, image, size, preload=None, idle_expiry_s=None, memory_budget_mb=None, audit=None, env_at_claim=None, mode=None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, one for one
    fn new(
        py: Python<'_>,
        spec_json: &str,
        image: &str,
        size: usize,
        preload: Option<Vec<String>>,
        idle_expiry_s: Option<f64>,
        memory_budget_mb: Option<u64>,
        audit: Option<&str>,
        env_at_claim: Option<Vec<String>>,
        mode: Option<&str>,
    ) -> PyResult<NativePool> {
        let keep = Keep { size, preload, idle_expiry_s, memory_budget_mb, env_at_claim, mode: mode.map(str::to_owned) };
        let pool = py.detach(|| create(spec_json, image, keep, audit)).map_err(|f| f.into_py(py))?;
        Ok(NativePool { pool: Mutex::new(Some(Arc::new(pool))) })
    }

    /// A sandbox with the pool's settings, those of the `PolicySpec`
    /// `spec_json` over them: a ready one when the pool has one and the
    /// settings can be applied to it at the claim, else one made cold (its
    /// first run's record says why). Never waits for the pool.
    #[pyo3(signature = (spec_json=None))]
    fn sandbox(&self, py: Python<'_>, spec_json: Option<&str>) -> PyResult<NativeSandbox> {
        let sandbox = py
            .detach(|| {
                let pool = self.open()?;
                let policy = match spec_json {
                    None => pool.policy().clone(),
                    Some(json) => with_spec(pool.policy(), json)?,
                };
                Ok::<_, Failure>(pool.sandbox(&policy)?)
            })
            .map_err(|f| f.into_py(py))?;
        Ok(NativeSandbox::wrap(sandbox))
    }

    /// Waits up to `timeout_s` until `n` sandboxes are ready (at most the
    /// pool's size); whether they are.
    fn wait_ready(&self, py: Python<'_>, n: usize, timeout_s: f64) -> PyResult<bool> {
        let timeout = Duration::try_from_secs_f64(timeout_s).map_err(|_| {
            Failure::new(Kind::Policy, format!("timeout_s={timeout_s} is not a number of seconds")).into_py(py)
        })?;
        py.detach(|| Ok(self.open()?.wait_ready(n, timeout))).map_err(|f: Failure| f.into_py(py))
    }

    /// What the pool has done and holds, as JSON (`airlock.PoolStats`).
    fn stats(&self, py: Python<'_>) -> PyResult<String> {
        let stats = py.detach(|| self.open().map(|pool| pool.stats())).map_err(|f| f.into_py(py))?;
        let json = serde_json::json!({
            "size": stats.size,
            "ready": stats.ready,
            "memory_bytes": stats.memory_bytes,
            "hits": stats.hits,
            "misses": stats.misses,
            "unsuited": stats.unsuited,
            "refills": stats.refills,
            "last_refill_ms": stats.last_refill_ms,
            "refill_ms_total": stats.refill_ms_total,
            "refill_failures": stats.refill_failures,
            "last_refill_error": stats.last_refill_error,
            "expired": stats.expired,
            "templates": stats.templates,
            "template_memory_bytes": stats.template_memory_bytes,
        });
        Ok(json.to_string())
    }

    /// Destroys the ready sandboxes and stops making more; sandboxes taken
    /// from the pool live on until closed. Closing twice is fine.
    fn close(&self, py: Python<'_>) {
        let taken = py.detach(|| self.pool.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take());
        // Joins the refill and reaper threads: the sandboxes they held are gone when it returns.
        py.detach(move || {
            if let Some(pool) = taken {
                pool.close();
            }
        });
    }

    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        py.detach(|| self.pool.lock().map_or(true, |guard| guard.is_none()))
    }
}

impl NativePool {
    fn open(&self) -> Result<Arc<airlock::Pool>, Failure> {
        let guard = self.pool.lock().map_err(|_| Failure::new(Kind::Sandbox, "this pool broke; make a new one"))?;
        guard.clone().ok_or_else(|| {
            Failure::new(
                Kind::Sandbox,
                "this pool is closed; make a new one (`with Pool(...) as pool:` closes it at the end of the block)",
            )
        })
    }
}

/// How the pool is kept, as Python gave it.
struct Keep {
    size: usize,
    preload: Option<Vec<String>>,
    idle_expiry_s: Option<f64>,
    memory_budget_mb: Option<u64>,
    env_at_claim: Option<Vec<String>>,
    /// `pooled` or `forked` (`PoolMode::parse`).
    mode: Option<String>,
}

fn create(spec_json: &str, image: &str, keep: Keep, audit: Option<&str>) -> Result<airlock::Pool, Failure> {
    let Keep { size, preload, idle_expiry_s, memory_budget_mb, env_at_claim, mode } = keep;
    let mode = match mode.as_deref() {
        None => PoolMode::default(),
        Some(name) => PoolMode::parse(name).ok_or_else(|| {
            Failure::new(Kind::Policy, format!("mode={name:?} is not a pool mode: use \"pooled\" or \"forked\""))
        })?,
    };
    let spec = parse_spec(spec_json)?;
    if spec.with_packages.as_ref().is_some_and(|packages| !packages.is_empty()) {
        return Err(Failure::new(
            Kind::Policy,
            "with_packages: a pool keeps its image's sandboxes ready, without extra packages; use \
             Sandbox(with_packages=...) for a sandbox with them",
        ));
    }
    let backend = helper::backend()?;
    let policy = Policy::from_spec(&spec, &backend.probe()?.host).map_err(airlock::Error::from)?;
    let defaults = PoolOptions::default();
    let idle_expiry = match idle_expiry_s {
        None => defaults.idle_expiry,
        Some(s) => Duration::try_from_secs_f64(s).ok().filter(|d| !d.is_zero()).ok_or_else(|| {
            Failure::new(Kind::Policy, format!("idle_expiry_s={s} is not a positive number of seconds"))
        })?,
    };
    let memory_budget = match memory_budget_mb {
        Some(0) => {
            return Err(Failure::new(Kind::Policy, "memory_budget_mb=0: give a number of MiB, or None for no budget"));
        }
        mb => mb.map(|mb| mb.saturating_mul(1 << 20)),
    };
    let options = PoolOptions {
        size,
        preload: preload.unwrap_or(defaults.preload),
        idle_expiry,
        memory_budget,
        env_at_claim: env_at_claim.unwrap_or_default(),
        mode,
    };
    if let Some(bad) = options.bad_preload() {
        return Err(Failure::new(
            Kind::Policy,
            format!("preload: {bad:?} is not a module name (like \"pandas\" or \"matplotlib.pyplot\")"),
        ));
    }
    if let Some((name, why)) = options.refused_env_at_claim() {
        return Err(Failure::new(
            Kind::Policy,
            format!("env_at_claim: {name:?} cannot be set at a claim: {why}; take it out"),
        ));
    }
    let audit = audit.map(open_audit).transpose()?;
    let mut progress = |event: BuildEvent| log_build(&event);
    let runtime = airlock::resolve_runtime(BackendKind::Linux, Some(image), None, &mut progress)?;
    Ok(airlock::Pool::with_backend(backend, policy, runtime, options, audit))
}

/// `policy` with the `PolicySpec` in `json` over it.
fn with_spec(policy: &Policy, json: &str) -> Result<Policy, Failure> {
    let spec = parse_spec(json)?;
    if spec.with_packages.as_ref().is_some_and(|packages| !packages.is_empty()) {
        return Err(Failure::new(
            Kind::Policy,
            "with_packages: a pool's sandboxes run its image as it is; use Sandbox(with_packages=...)",
        ));
    }
    let host = helper::backend()?.probe()?.host;
    Ok(policy.with_spec(&spec, &host).map_err(airlock::Error::from)?)
}
