//! Landlock: the code may write only under /work and /tmp (and to a few
//! devices and the report FIFO), and may not reach abstract unix sockets or
//! signal processes outside its own sandbox (ABI 6 and later).

use landlock::{
    ABI, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, Scope,
};

use crate::protocol::{Failure, LandlockPlan};

/// The newest ABI this code knows; older kernels get the subset they have.
const NEWEST: ABI = ABI::V7;

/// What was put in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Enforced {
    /// Every requested restriction.
    Fully,
    /// The kernel's Landlock is older: some restrictions (named in the record
    /// through the ABI version) are missing.
    Partially,
    /// No Landlock on this kernel.
    Not,
}

/// Child side: restricts this process and its future children.
pub fn restrict(plan: &LandlockPlan) -> Result<Enforced, Failure> {
    let step = "apply Landlock";
    let fail = |detail: &str, e: &dyn std::fmt::Display| Failure::plain(step, format!("{detail}: {e}"));
    let write_dir: BitFlags<AccessFs> = AccessFs::from_write(NEWEST);
    let write_file: BitFlags<AccessFs> = AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;
    // Best effort: an older kernel still gets every restriction it has; only
    // no Landlock at all fails a run that requires it (checked below).
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(write_dir)
        .map_err(|e| fail("handle access", &e))?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(|e| fail("scope", &e))?
        .create()
        .map_err(|e| fail("create ruleset", &e))?;
    for dir in &plan.writable_dirs {
        let fd = PathFd::new(dir).map_err(|e| fail(dir, &e))?;
        ruleset = ruleset.add_rule(PathBeneath::new(fd, write_dir)).map_err(|e| fail(dir, &e))?;
    }
    for file in &plan.writable_files {
        let fd = PathFd::new(file).map_err(|e| fail(file, &e))?;
        ruleset = ruleset.add_rule(PathBeneath::new(fd, write_file)).map_err(|e| fail(file, &e))?;
    }
    let status = ruleset.restrict_self().map_err(|e| fail("restrict", &e))?;
    let enforced = match status.ruleset {
        RulesetStatus::FullyEnforced => Enforced::Fully,
        RulesetStatus::PartiallyEnforced => Enforced::Partially,
        RulesetStatus::NotEnforced => Enforced::Not,
    };
    if plan.required && enforced == Enforced::Not {
        return Err(Failure::plain(
            step,
            "this kernel has no Landlock (Linux 5.13 or later, with landlock in the lsm= boot list)",
        ));
    }
    Ok(enforced)
}
