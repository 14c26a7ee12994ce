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
