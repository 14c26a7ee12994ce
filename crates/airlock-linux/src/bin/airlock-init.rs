//! `airlock-init`: the single-threaded helper that builds each sandbox.
//! The supervisor starts it; it is not meant to be run by hand.

fn main() {
    airlock_linux::child::main()
}
