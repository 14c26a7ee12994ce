//! The forked pool mode, attacked from the code of a forked run (the
//! isolation and limit attacks both modes share are in `pool.rs`).

use std::time::Duration;

use airlock::{Policy, Pool, PoolMode, PoolOptions, RunRequest, RunStart, Status};
use airlock_tests::{data_image, exclusive, linux};

fn forked_pool(policy: Policy, preload: &[&str]) -> Pool {
    let options = PoolOptions {
        size: 1,
        preload: preload.iter().map(|m| m.to_string()).collect(),
        idle_expiry: Duration::from_secs(600),
        memory_budget: None,
        env_at_claim: Vec::new(),
        mode: PoolMode::Forked,
    };
    let pool = Pool::with_backend(linux(), policy, data_image(), options, None);
    assert!(pool.wait_ready(1, Duration::from_secs(120)), "the pool did not fill: {:?}", pool.stats());
    pool
}

/// A child made with CLONE_PARENT is its parent's sibling: a child of the
/// template (or a cold run's helper), outside the run's PID namespace,
/// which reaps only the code's process and the init. Unreaped, its zombie
/// holds the run's init in the kernel (an init's exit waits until every pid
/// of its namespace is freed): the run did not end when its code did, but
/// at its wall-time limit, an internal error, its init and cgroup left for
/// the template's lifetime. The code must not make one.
#[test]
fn a_child_made_with_clone_parent_is_refused_and_the_run_ends_with_its_code() {
    let _alone = exclusive();
    let code = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
CLONE_PARENT, SIGCHLD, SYS_clone = 0x8000, 17, {"x86_64": 56, "aarch64": 220}[os.uname().machine]
pid = libc.syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0)
if pid == 0:
    os._exit(0)
print(pid, os.strerror(ctypes.get_errno()) if pid < 0 else "")
"#;
    let pool = forked_pool(Policy::default(), &["json"]);
    let forked = pool.run(pool.policy(), &[], &RunRequest::python(code)).unwrap();
    let cold = airlock::Sandbox::with_backend(linux(), Policy::default(), data_image()).unwrap().run(code);
    let outcome = |record: &airlock::RunRecord| {
        (record.usage.start, record.status, record.stdout.trim().to_owned(), record.message.clone())
    };
    let refused = |start| (Some(start), Status::Ok, "-1 Operation not permitted".to_owned(), None);
    assert_eq!([outcome(&forked), outcome(&cold)], [refused(RunStart::Forked), refused(RunStart::Cold)]);
}

/// The run's init (PID 1) is the template's fork, an interpreter's: it kept
/// CPython's SIGINT handler. A PID 1 receives from its own namespace only
/// the signals it catches, so the code could interrupt it wherever Landlock
/// does not scope signals (ABI 5 and older). It must catch none the cold
/// run's init does not (Rust's SIGSEGV and SIGBUS handlers, which do
/// nothing for a signal that is not a fault).
#[test]
fn the_forked_run_s_init_catches_no_signal_as_a_cold_run_s() {
    let _alone = exclusive();
    let code = "print([l.split()[1] for l in open('/proc/1/status') if l.startswith('SigCgt:')][0])";
    let pool = forked_pool(Policy::default(), &["json"]);
    let forked = pool.run(pool.policy(), &[], &RunRequest::python(code)).unwrap();
    let cold = airlock::Sandbox::with_backend(linux(), Policy::default(), data_image()).unwrap().run(code);
    assert_eq!(forked.usage.start, Some(RunStart::Forked), "{:?}", forked.isolation.details);
    let caught = |record: &airlock::RunRecord| (record.status, record.stdout.trim().to_owned());
    let rust = (Status::Ok, format!("{:016x}", (1 << (libc::SIGSEGV - 1)) | (1 << (libc::SIGBUS - 1))));
    assert_eq!([caught(&forked), caught(&cold)], [(Status::Ok, "0000000000000000".to_owned()), rust]);
}
