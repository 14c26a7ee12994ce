//! `airlock-wasm-worker`: the process that hosts one wasm guest, confined
//! (`--guest`; see `airlock_wasm::worker`), and, without arguments, the
//! Linux backend's helper, which makes each wasm sandbox's stage. The
//! supervisor starts it; it is not meant to be run by hand.

fn main() {
    if std::env::args_os().nth(1).is_some_and(|arg| arg == "--guest") {
        airlock_wasm::worker::main()
    } else {
        airlock_linux::child::main()
    }
}
