//! Capabilities: every set emptied, so the code holds none even inside its
//! own user namespace, and no_new_privs so it can never gain one.

use rustix::thread::{
    CapabilitySet, CapabilitySets, clear_ambient_capability_set, remove_capability_from_bounding_set, set_capabilities,
    set_no_new_privs,
};

use crate::protocol::Failure;

/// The highest capability number any kernel airlock supports defines
/// (CAP_CHECKPOINT_RESTORE = 40), with room for a few more.
const CAP_LAST: u32 = 63;

/// Child side: empties the bounding, ambient, inheritable, permitted and
/// effective sets, then sets no_new_privs. The bounding set goes first, as
/// dropping from it needs CAP_SETPCAP, which the last step gives up.
pub fn drop_all() -> Result<(), Failure> {
    let step = "drop capabilities";
    for cap in 0..=CAP_LAST {
        match remove_capability_from_bounding_set(CapabilitySet::from_bits_retain(1 << cap)) {
            Ok(()) => {}
            // EINVAL: the kernel does not know this capability number.
            Err(rustix::io::Errno::INVAL) => {}
            Err(e) => {
                return Err(Failure::new(step, format!("bounding set, capability {cap}"), &e.into()));
            }
        }
    }
    clear_ambient_capability_set().map_err(|e| Failure::new(step, "ambient set", &e.into()))?;
    let none = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    };
    set_capabilities(None, none).map_err(|e| Failure::new(step, "capset", &e.into()))?;
    set_no_new_privs(true).map_err(|e| Failure::new("set no_new_privs", "", &e.into()))
}

/// A forked pool's template (see `fork`): every capability gone but
/// CAP_SYS_ADMIN and CAP_SETPCAP, kept permitted, effective, inheritable and ambient, so
/// that the interpreter it executes (as the sandbox's user, who is not uid 0
/// there) still holds it; then no_new_privs. It holds it in the sandbox's
/// own user namespace only, which has no power over the host's: enough for
/// each fork to make its namespaces and mounts, which the fork then gives up
/// with [`drop_all`] before any code runs.
pub fn keep_only_sys_admin() -> Result<(), Failure> {
    let step = "keep CAP_SYS_ADMIN for the template";
    // CAP_SETPCAP too: the run's init, a fork that makes no user namespace
    // of its own, needs it to empty its bounding set.
    let admin = CapabilitySet::SYS_ADMIN | CapabilitySet::SETPCAP;
    for cap in (0..=CAP_LAST).map(|cap| CapabilitySet::from_bits_retain(1 << cap)).filter(|cap| !admin.contains(*cap)) {
        match remove_capability_from_bounding_set(cap) {
            Ok(()) | Err(rustix::io::Errno::INVAL) => {}
            Err(e) => return Err(Failure::new(step, format!("bounding set, {cap:?}"), &e.into())),
        }
    }
    clear_ambient_capability_set().map_err(|e| Failure::new(step, "ambient set", &e.into()))?;
    let only = CapabilitySets { effective: admin, permitted: admin, inheritable: admin };
    set_capabilities(None, only).map_err(|e| Failure::new(step, "capset", &e.into()))?;
    for cap in [CapabilitySet::SYS_ADMIN, CapabilitySet::SETPCAP] {
        rustix::thread::configure_capability_in_ambient_set(cap, true)
            .map_err(|e| Failure::new(step, "ambient set", &e.into()))?;
    }
    set_no_new_privs(true).map_err(|e| Failure::new("set no_new_privs", "", &e.into()))
}
