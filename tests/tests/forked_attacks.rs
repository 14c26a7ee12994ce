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
