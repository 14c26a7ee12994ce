//! `airlock-init`: the single-threaded helper that builds each sandbox.
//! The supervisor starts it; it is not meant to be run by hand.

fn main() {
    // `airlock-init hold` keeps a systemd scope open for its supervisor (see
    // the cgroup module); `airlock-init probe-userns` tries one user
    // namespace for the host's probe; every other start builds a sandbox,
    // `airlock-init run-spare` a run's, started ahead of its request.
    let arg = std::env::args_os().nth(1);
    if arg.as_deref().is_some_and(|arg| arg == airlock_linux::HOLD_ARG) {
        airlock_linux::hold()
    }
    if arg.as_deref().is_some_and(|arg| arg == airlock_linux::PROBE_USERNS_ARG) {
        airlock_linux::try_user_namespace()
    }
    airlock_linux::child::main(arg.as_deref().is_some_and(|arg| arg == airlock_linux::child::RUN_SPARE_ARG))
}
