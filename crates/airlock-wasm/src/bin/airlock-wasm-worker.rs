//! `airlock-wasm-worker`: the process that hosts one wasm guest, confined
//! (`--guest`; see `airlock_wasm::worker`), the one that checks and compiles
//! the interpreter (`--compile`; see `airlock_wasm::compile`), and, without
//! arguments, the Linux backend's helper, which makes each wasm sandbox's
//! stage. The supervisor starts it; it is not meant to be run by hand.

fn main() {
    let first = std::env::args_os().nth(1);
    if first.as_ref().is_some_and(|arg| arg == "--guest") {
        airlock_wasm::worker::main()
    }
    if first.as_ref().is_some_and(|arg| arg == airlock_wasm::compile::COMPILE_ARG) {
        airlock_wasm::compile::worker_main()
    }
    // `hold` keeps the systemd scope of an ordinary user's runs open, as
    // `airlock-init hold` does for the Linux backend.
    if first.is_some_and(|arg| arg == airlock_linux::HOLD_ARG) {
        airlock_linux::hold()
    }
    airlock_linux::child::main(false)
}
