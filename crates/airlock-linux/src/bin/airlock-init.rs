//! `airlock-init`: the single-threaded helper that builds each sandbox.
//! The supervisor starts it; it is not meant to be run by hand.

fn main() {
    // `airlock-init hold` keeps a systemd scope open for its supervisor (see
    // the cgroup module); every other start builds a sandbox.
    if std::env::args_os().nth(1).is_some_and(|arg| arg == airlock_linux::HOLD_ARG) {
        airlock_linux::hold()
    }
    airlock_linux::child::main()
}
