//! The pool of warm sandboxes, attacked: each pooled run must be as fresh
//! as a cold one. One run leaves something behind (files, environment,
//! module state, /dev/shm, descriptors, processes) and the next run of the
//! same pool looks for it; randomness must differ from run to run; limits
//! hold from the release; a pool that cannot refill runs cold and says so.

use std::time::Duration;

#[path = "../../crates/airlock-net/tests/common/mod.rs"]
mod servers;

use airlock::{
    NetworkVerdict, Policy, PolicySpec, Pool, PoolMode, PoolOptions, RunRecord, RunRequest, RunStart, Status,
};
use airlock_tests::{
    EACH_START_METHOD_SUMS, ENDS_WITH_WORK_LEFT, POOLS_OF_EACH_START_METHOD, assert_ended_as_an_exit_does, data_image,
    exclusive, linux,
};

/// A pool of `size` on the python-data image, filled before it is returned.
/// Each test holds the run lock alone ([`exclusive`]): a pool's refills run
/// in the background, and the leftovers check must see only its own.
fn pool(policy: Policy, size: usize, preload: &[&str]) -> Pool {
    pool_in(PoolMode::Pooled, policy, size, preload)
}

/// As [`pool`], its sandboxes made as `mode` says.
fn pool_in(mode: PoolMode, policy: Policy, size: usize, preload: &[&str]) -> Pool {
    let options = PoolOptions {
        size,
        preload: preload.iter().map(|m| m.to_string()).collect(),
        idle_expiry: Duration::from_secs(600),
        memory_budget: None,
        env_at_claim: Vec::new(),
        mode,
    };
    let pool = Pool::with_backend(linux(), policy, data_image(), options, None);
    assert!(pool.wait_ready(size, Duration::from_secs(120)), "the pool did not fill: {:?}", pool.stats());
    pool
}

fn run(pool: &Pool, code: &str) -> RunRecord {
    pool.run(pool.policy(), &[], &RunRequest::python(code)).expect("a pooled run")
}

/// The run was served warm, and ended well.
fn pooled_ok(record: &RunRecord) -> &str {
    served_ok(record, PoolMode::Pooled)
}

/// How a pool of `mode` serves a run warm.
fn start_of(mode: PoolMode) -> RunStart {
    match mode {
        PoolMode::Pooled => RunStart::Pooled,
        PoolMode::Forked => RunStart::Forked,
    }
}

/// The run was served warm by a pool of `mode`, and ended well.
fn served_ok(record: &RunRecord, mode: PoolMode) -> &str {
    assert_eq!(record.usage.start, Some(start_of(mode)), "not {mode:?}: {:?}", record.isolation.details);
    assert_eq!(record.status, Status::Ok, "stderr: {}\nmessage: {:?}", record.stderr, record.message);
    record.stdout.trim()
}

#[test]
fn a_pooled_run_has_pandas_imported_and_its_files_in() {
    has_pandas_imported_and_its_files_in(PoolMode::Pooled);
}

#[test]
fn a_forked_run_has_pandas_imported_and_its_files_in() {
    has_pandas_imported_and_its_files_in(PoolMode::Forked);
}

fn has_pandas_imported_and_its_files_in(mode: PoolMode) {
    let _alone = exclusive();
    let pool = pool_in(mode, Policy::default(), 1, &["numpy", "pandas", "matplotlib"]);
    let csv = b"x,w\n1,1\n2,1\n3,5\n".to_vec();
    let code = "import sys\nimport pandas as pd\nprint('pandas' in sys.modules)\nint(pd.read_csv('data.csv').x.sum())";
    let record = pool.run(pool.policy(), &[("data.csv".to_owned(), csv)], &RunRequest::python(code)).unwrap();
    assert_eq!(served_ok(&record, mode), "True");
    assert_eq!(record.value.as_deref(), Some("6"));
    assert_eq!(record.inputs.len(), 1);
    assert!(record.usage.pool_wait_ms.is_some());
    let first = record.usage.first_instruction_ms.expect("the driver announced the first instruction");
    assert!(first <= record.usage.wall_ms + 1000, "{first} ms to the first instruction");
    // Every layer of a cold run is in force.
    let cold = airlock::Sandbox::with_backend(linux(), Policy::default(), data_image()).unwrap().run("1");
    assert_eq!(cold.usage.start, Some(RunStart::Cold));
    assert!(cold.usage.first_instruction_ms.is_some() && cold.usage.pool_wait_ms.is_none(), "{:?}", cold.usage);
    assert_eq!(record.isolation.layers, cold.isolation.layers);
    assert!(record.isolation.layers.contains(&airlock::Layer::Seccomp), "{:?}", record.isolation.layers);
    // The record says whose host ids the run has: a fork's are its
    // template's (before, it said "this sandbox's alone" for forks too).
    let ids = &record.isolation.details["host_ids"];
    let shared = ids.contains("shared with every run forked from it");
    assert_eq!(shared, mode == PoolMode::Forked, "{ids}");

    // matplotlib imported ahead still renders off-screen and hands the figure back.
    assert!(pool.wait_ready(1, Duration::from_secs(120)), "no refill: {:?}", pool.stats());
    let plot = run(&pool, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()");
    served_ok(&plot, mode);
    assert_eq!(plot.figures.len(), 1, "{:?}", plot.message);
    // Its /tmp holds what a cold run's does (matplotlib's configuration).
    let listing = "import os\nprint(sorted(os.listdir('/tmp')))";
    assert!(pool.wait_ready(1, Duration::from_secs(120)), "no refill: {:?}", pool.stats());
    let warm = run(&pool, listing);
    let cold = airlock::Sandbox::with_backend(linux(), Policy::default(), data_image()).unwrap().run(listing);
    assert_eq!(served_ok(&warm, mode), cold.stdout.trim());
}

/// What the first run plants, each checked by the run itself.
const PLANT: &str = r#"
import os, sys, threading, time, json
import pandas
planted = {}
open("/work/left.txt", "w").write("left")
open("/tmp/left.txt", "w").write("left")
planted["files"] = os.path.exists("/work/left.txt") and os.path.exists("/tmp/left.txt")
os.environ["AIRLOCK_LEFT"] = "1"
planted["env"] = os.environ.get("AIRLOCK_LEFT") == "1"
pandas.airlock_left = "1"
sys.modules["airlock_left_module"] = type(sys)("airlock_left_module")
planted["module"] = getattr(pandas, "airlock_left", None) == "1"
try:
    open("/dev/shm/airlock_left", "w").write("left")
    planted["shm"] = os.path.exists("/dev/shm/airlock_left")
except OSError as e:
    planted["shm"] = "refused: %s" % e
fd = os.open("/work/left.txt", os.O_RDONLY)
os.dup2(fd, 100, inheritable=True)
planted["fd"] = os.path.exists("/proc/self/fd/100")
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sh", ["/bin/sh", "-c", "sleep 60; : airlock-left-behind"])
    os._exit(0)
time.sleep(0.2)
planted["process"] = any(
    b"airlock-left-behind" in open("/proc/%s/cmdline" % p, "rb").read()
    for p in os.listdir("/proc") if p.isdigit()
)
print(json.dumps(planted))
"#;

/// What the next run looks for.
const LOOK: &str = r#"
import os, sys, json
import pandas
found = {
    "files": [p for p in ("/work/left.txt", "/tmp/left.txt") if os.path.exists(p)],
    "env": os.environ.get("AIRLOCK_LEFT"),
    "module": getattr(pandas, "airlock_left", None) or ("airlock_left_module" in sys.modules),
    "shm": os.path.exists("/dev/shm/airlock_left"),
    "fd": os.path.exists("/proc/self/fd/100"),
    "process": [p for p in os.listdir("/proc") if p.isdigit()
                and b"airlock-left-behind" in open("/proc/%s/cmdline" % p, "rb").read()],
}
print(json.dumps(found))
def target(fd):
    try:
        return os.readlink("/proc/self/fd/" + fd).split(":")[0]
    except OSError:
        return "gone"
print(sorted((fd, target(fd)) for fd in os.listdir("/proc/self/fd")))
"#;

#[test]
fn a_pooled_run_finds_nothing_an_earlier_pooled_run_left() {
    finds_nothing_an_earlier_run_left(PoolMode::Pooled);
}

#[test]
fn a_forked_run_finds_nothing_an_earlier_forked_run_left() {
    finds_nothing_an_earlier_run_left(PoolMode::Forked);
}

fn finds_nothing_an_earlier_run_left(mode: PoolMode) {
    let _alone = exclusive();
    let pool = pool_in(mode, Policy::default(), 1, &["numpy", "pandas"]);
    let planted = run(&pool, PLANT);
    let planted: serde_json::Value = serde_json::from_str(served_ok(&planted, mode)).unwrap();
    for (what, done) in planted.as_object().unwrap() {
        // /dev/shm may be absent or read-only: then nothing can be left there either.
        assert!(
            done == &serde_json::Value::Bool(true) || what == "shm",
            "the first run could not plant {what}: {done}"
        );
    }
    assert!(pool.wait_ready(1, Duration::from_secs(120)), "no refill: {:?}", pool.stats());
    let look = run(&pool, LOOK);
    let out = served_ok(&look, mode);
    let (found, fds) = out.split_once('\n').unwrap();
    let found: serde_json::Value = serde_json::from_str(found).unwrap();
    let clean = serde_json::json!({
        "files": [], "env": null, "module": false, "shm": false, "fd": false, "process": [],
    });
    assert_eq!(found, clean, "the second {mode:?} run found what the first left");
    // Its descriptors are a cold run's (its standard input a pipe), no
    // more; a fork's driver has its own report pipe open at 3 besides,
    // where a cold run's opens its report FIFO when it writes.
    let cold = airlock::Sandbox::with_backend(linux(), Policy::default(), data_image()).unwrap().run(LOOK);
    let cold_fds = cold.stdout.trim().split_once('\n').unwrap().1.replacen("'/dev/null'", "'pipe'", 1);
    let expected = match mode {
        PoolMode::Pooled => cold_fds,
        PoolMode::Forked => cold_fds.replacen("('3', 'gone')", "('3', 'pipe'), ('4', 'gone')", 1),
    };
    assert_eq!(fds, expected, "descriptors differ from a cold run's");

    // The probe is real: the same two runs in one sandbox (one /work) find the file.
    let mut shared = airlock::Sandbox::with_backend(linux(), Policy::default(), data_image()).unwrap();
    assert_eq!(shared.run(PLANT).status, Status::Ok);
    let again = shared.run(LOOK);
    assert!(again.stdout.contains("/work/left.txt"), "{}", again.stdout);

    assert_eq!(pool.stats().hits, 2);
    drop(pool);
    airlock_tests::assert_nothing_left("airlock-left-behind");
}

#[test]
fn a_pooled_run_ends_as_an_exit_does_threads_atexit_and_open_files_included() {
    ends_as_an_exit_does(PoolMode::Pooled);
}

#[test]
fn a_forked_run_ends_as_an_exit_does_threads_atexit_and_open_files_included() {
    ends_as_an_exit_does(PoolMode::Forked);
}

fn ends_as_an_exit_does(mode: PoolMode) {
    let _alone = exclusive();
    let pool = pool_in(mode, Policy::default(), 1, &["numpy", "pandas"]);
    // A warm run's process ends without the interpreter's teardown: what an
    // exit must do still happens.
    // (Its objects are finalized, a reference cycle's too: the collection at
    // the end; before it, a warm run's cycles never were.)
    let mut sandbox = pool.sandbox(pool.policy()).unwrap();
    let record = sandbox.run(ENDS_WITH_WORK_LEFT);
    let out = served_ok(&record, mode).to_owned();
    assert_ended_as_an_exit_does(&out, &mut sandbox);
    // An exit status is kept.
    pool.wait_ready(1, Duration::from_secs(120));
    let record = run(&pool, "import sys\nsys.exit(3)");
    assert_eq!((record.usage.start, record.exit_code), (Some(start_of(mode)), Some(3)));
    // So is a signal's.
    pool.wait_ready(1, Duration::from_secs(120));
    let record = run(&pool, "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)");
    assert_eq!((record.usage.start, record.signal), (Some(start_of(mode)), Some(15)), "{:?}", record.message);
}

#[test]
fn a_pooled_run_starts_multiprocessing_pools_by_every_method() {
    starts_multiprocessing_pools_by_every_method(PoolMode::Pooled);
}

#[test]
fn a_forked_run_starts_multiprocessing_pools_by_every_method() {
    starts_multiprocessing_pools_by_every_method(PoolMode::Forked);
}

/// A warm run's `__main__` is a file its children can run again, as a cold
/// run's is (`tests/driver.rs`), also where the warm driver imported
/// multiprocessing before the run (pandas does not; the preload here does).
fn starts_multiprocessing_pools_by_every_method(mode: PoolMode) {
    let _alone = exclusive();
    let pool = pool_in(mode, Policy::default(), 1, &["multiprocessing", "pandas"]);
    let record = run(&pool, POOLS_OF_EACH_START_METHOD);
    assert_eq!(served_ok(&record, mode), format!("{EACH_START_METHOD_SUMS} <code> /work"));
}

/// Whether this host lets a warm driver collapse its pages into 2 MiB
/// transparent huge pages: THP not `never` (the supervisor then does not
/// ask), 2 MiB huge pages, and a collapse that works here now (MADV_COLLAPSE,
/// Linux 6.1; a free huge page), tried on memory of this test's own.
fn host_collapses_huge_pages() -> bool {
    const MADV_COLLAPSE: libc::c_int = 25;
    const HUGE: usize = 2 << 20;
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let enabled = read("/sys/kernel/mm/transparent_hugepage/enabled");
    if enabled.is_empty()
        || enabled.contains("[never]")
        || read("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size").trim() != "2097152"
    {
        return false;
    }
    let length = 2 * HUGE;
    // SAFETY: a fresh private anonymous mapping of our own, touched and
    // unmapped here; no other code holds its address.
    unsafe {
        let memory = libc::mmap(
            std::ptr::null_mut(),
            length,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if memory == libc::MAP_FAILED {
            return false;
        }
        let aligned = (memory as usize + HUGE - 1) & !(HUGE - 1);
        std::ptr::write_bytes(aligned as *mut u8, 1, HUGE);
        let collapsed = libc::madvise(aligned as *mut libc::c_void, HUGE, MADV_COLLAPSE) == 0;
        libc::munmap(memory, length);
        collapsed
    }
}

/// The warm driver moved the preload's dense memory into huge pages before
/// the run (driver.py, `_collapse_into_huge_pages`), so that the run's exit
/// frees it at once. (A fork is not checked this way: its writes, and its
/// template's, split a shared huge page's mapping back into small pages.)
#[test]
fn a_pooled_run_finds_its_preload_in_huge_pages() {
    if !host_collapses_huge_pages() {
        eprintln!("skipped: this host cannot collapse pages into 2 MiB transparent huge pages (MADV_COLLAPSE)");
        return;
    }
    let _alone = exclusive();
    let pool = pool(Policy::default(), 1, &["numpy", "pandas", "matplotlib"]);
    let code =
        "print([int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages:')][0])";
    let huge_kib: u64 = pooled_ok(&run(&pool, code)).parse().expect("AnonHugePages in kB");
    assert!(huge_kib >= 8 * 1024, "only {huge_kib} kB of the preload in huge pages");
}

/// The warm driver had CPython take the preload's object arenas from
/// chunks aligned to huge pages (driver.py, `_align_arenas`), so that its
/// collapse reaches them too: what the run's exit frees page by page, the
/// anonymous memory outside huge pages, is a fraction of what it was
/// (about 30 MB with CPython's own arenas, each a 1 MiB mapping of its own
/// between the libraries the preload loads).
#[test]
fn a_pooled_run_finds_its_preload_arenas_in_huge_pages() {
    if !host_collapses_huge_pages() {
        eprintln!("skipped: this host cannot collapse pages into 2 MiB transparent huge pages (MADV_COLLAPSE)");
        return;
    }
    let _alone = exclusive();
    let pool = pool(Policy::default(), 1, &["numpy", "pandas", "matplotlib"]);
    let code = "\
rollup = {l.split()[0]: int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.endswith(' kB\\n')}
assert '/memfd:airlock-native' in open('/proc/self/maps').read(), 'the arena allocator\\'s library is not loaded'
print(rollup['Anonymous:'] - rollup['AnonHugePages:'], rollup['AnonHugePages:'])";
    let output = pooled_ok(&run(&pool, code)).to_owned();
    let (small_kib, huge_kib) = output.split_once(' ').expect("two figures");
    let (small_kib, huge_kib): (u64, u64) = (small_kib.parse().expect("kB"), huge_kib.parse().expect("kB"));
    eprintln!("anonymous memory of a pooled run: {small_kib} kB in small pages, {huge_kib} kB in huge pages");
    assert!(small_kib < 16 * 1024, "{small_kib} kB of anonymous memory in small pages ({huge_kib} kB in huge ones)");
}

/// The native library every warm sandbox loads (a template's steps, a
/// pooled driver's arena allocator) is one sealed memfd that the supervisor
/// shares with all of them (airlock-linux, `native`). A run must not be
/// able to reach it, and so another run through it: the descriptor is gone
/// before the code's first instruction, the mapping cannot be reopened
/// through `/proc/self/map_files`, and the program's folder, which once held
/// a copy and was executable for it, is `noexec` in every mode.
#[test]
fn a_warm_run_cannot_reach_the_native_library_its_neighbours_share() {
    for mode in [PoolMode::Pooled, PoolMode::Forked] {
        let _alone = exclusive();
        let pool = pool_in(mode, Policy::default(), 1, &["json"]);
        let code = r#"
import os, json
found = {"noexec": bool(os.statvfs("/.airlock").f_flag & os.ST_NOEXEC),
         "files": sorted(os.listdir("/.airlock")), "descriptors": [], "reopened": []}
for fd in os.listdir("/proc/self/fd"):
    try:
        if "airlock-native" in os.readlink("/proc/self/fd/" + fd):
            found["descriptors"].append(fd)
    except OSError:
        pass
mapped = [l.split()[0] for l in open("/proc/self/maps") if "/memfd:airlock-native" in l]
found["mapped"] = len(mapped)
for span in mapped:
    for flags in (os.O_RDONLY, os.O_RDWR):
        try:
            os.close(os.open("/proc/self/map_files/" + span, flags))
            found["reopened"].append(span)
        except OSError:
            pass
print(json.dumps(found))
"#;
        let record = run(&pool, code);
        let found: serde_json::Value = serde_json::from_str(served_ok(&record, mode)).unwrap();
        assert_eq!(found["noexec"], true, "{mode:?}: the program's folder is executable: {found}");
        assert!(
            !found["files"].to_string().contains("libairlock_fork"),
            "{mode:?}: a copy of the library in the program's folder: {found}"
        );
        assert_eq!(found["descriptors"], serde_json::json!([]), "{mode:?}: the library's descriptor is open: {found}");
        assert_eq!(found["reopened"], serde_json::json!([]), "{mode:?}: the shared library was reopened: {found}");
        // Forked runs always load it; a pooled run where huge pages make
        // its allocator worth having (as the supervisor reads the setting).
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        if mode == PoolMode::Forked || thp.contains("[always]") || thp.contains("[madvise]") {
            assert!(found["mapped"].as_u64().unwrap_or(0) > 0, "{mode:?}: the library is not mapped: {found}");
        }
    }
}

/// A forked run's init (PID 1, a fork of the template) unmapped what it
/// inherited of the template before the fork was ready
/// (`fork::shed_the_templates_memory`), so that its death at the run's end,
/// which the record waits for, has little to free; and it still reaps the
/// code's orphans, as a cold run's init does.
#[test]
fn a_forked_runs_init_holds_little_of_the_template_and_still_reaps() {
    let _alone = exclusive();
    let pool = pool_in(PoolMode::Forked, Policy::default(), 1, &["numpy", "pandas"]);
    let code = r#"
import os, time
def vm(pid, field):
    for line in open("/proc/%d/status" % pid):
        if line.startswith(field + ":"):
            return int(line.split()[1])
# An orphan: its parent exits at once (reaped here), so PID 1 must reap it
# once it ends; it says its pid first.
r, w = os.pipe()
child = os.fork()
if child == 0:
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode())
        os._exit(0)
    os._exit(0)
os.waitpid(child, 0)
os.close(w)
orphan = int(os.read(r, 32))
def state(pid):
    try:
        return open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "reaped"
deadline = time.monotonic() + 10
while state(orphan) != "reaped" and time.monotonic() < deadline:
    time.sleep(0.01)
zombies = [] if state(orphan) == "reaped" else [state(orphan)]
print(vm(1, "VmSize"), vm(1, "VmRSS"), vm(os.getpid(), "VmSize"), len(zombies))
"#;
    let record = run(&pool, code);
    let out = served_ok(&record, PoolMode::Forked).to_owned();
    let figures: Vec<u64> = out.split_whitespace().map(|f| f.parse().expect("a figure")).collect();
    let [init_size, init_rss, code_size, zombies] = figures[..] else { panic!("{out}") };
    eprintln!("a forked run's init: VmSize {init_size} kB, VmRSS {init_rss} kB; its code's VmSize {code_size} kB");
    // (Only x86-64 sheds: elsewhere a shadow stack is not checked for.)
    if cfg!(target_arch = "x86_64") {
        assert!(init_size * 4 < code_size, "the init holds {init_size} kB of address space, its code {code_size} kB");
    }
    assert_eq!(zombies, 0, "the init left an orphan unreaped");
}

/// The warm driver unmapped the preload's libraries' pages before the run
/// (driver.py, `_unmap_file_pages`), so that the run's exit has fewer page
/// table entries to clear: a run that does not use pandas finds none of the
/// pages of pandas' extension modules' read-only mappings mapped (about
/// 6.5 MB without the unmapping; mappings holding private copies, the
/// relocated pages the driver keeps, are left out as it leaves them), and a
/// run that does use pandas gets its answer, the pages it needs mapped again.
#[test]
fn a_pooled_run_finds_its_preload_libraries_unmapped() {
    let _alone = exclusive();
    let pool = pool(Policy::default(), 1, &["numpy", "pandas", "matplotlib"]);
    let mapped_kib_of_pandas_libraries = "\
def mapped_kib_of_pandas_libraries():
    total, mapping = 0, None
    for line in open('/proc/self/smaps').read().splitlines() + ['end']:
        fields = line.split()
        if not fields[0].endswith(':'):
            if mapping and mapping['Anonymous:'] == 0:
                total += mapping['Rss:']
            pandas_library = len(fields) > 5 and '/pandas/' in fields[5] and fields[5].endswith('.so')
            mapping = {} if pandas_library and 'w' not in fields[1] else None
        elif mapping is not None and fields[0] in ('Rss:', 'Anonymous:'):
            mapping[fields[0]] = int(fields[1])
    return total
";
    let code = format!("{mapped_kib_of_pandas_libraries}print(mapped_kib_of_pandas_libraries())");
    let untouched_kib: u64 = pooled_ok(&run(&pool, &code)).parse().expect("kB mapped");
    assert!(untouched_kib < 256, "{untouched_kib} kB of pandas' libraries still mapped in a run that never used them");
    pool.wait_ready(1, Duration::from_secs(120));
    let code = format!(
        "{mapped_kib_of_pandas_libraries}import pandas\n\
         frame = pandas.DataFrame({{'price': [3.0, 1.0, 2.0], 'units': [1, 5, 1]}})\n\
         assert frame.sort_values('price')['units'].cumsum().tolist() == [5, 6, 7]\n\
         print(mapped_kib_of_pandas_libraries())"
    );
    let used_kib: u64 = pooled_ok(&run(&pool, &code)).parse().expect("kB mapped");
    assert!(used_kib >= untouched_kib + 64, "pandas ran with only {used_kib} kB of its libraries mapped");
    eprintln!("pandas' libraries mapped: {untouched_kib} kB in a run without pandas, {used_kib} kB in one with it");
}

#[test]
fn randomness_differs_across_twenty_pooled_runs() {
    randomness_differs_across_twenty_runs(PoolMode::Pooled);
}

#[test]
fn randomness_differs_across_twenty_forked_runs() {
    randomness_differs_across_twenty_runs(PoolMode::Forked);
}

fn randomness_differs_across_twenty_runs(mode: PoolMode) {
    let _alone = exclusive();
    // concurrent.futures.process imports multiprocessing, which draws its
    // authkey at import: before, every fork of the template had its key.
    let pool = pool_in(mode, Policy::default(), 2, &["random", "numpy", "concurrent.futures.process"]);
    let code = "import os, random, numpy, multiprocessing\n\
                print(random.random(), numpy.random.random(), os.urandom(16).hex(), hash('airlock'), \
                multiprocessing.current_process().authkey.hex())";
    let mut seen: Vec<Vec<String>> = vec![Vec::new(); 5];
    for _ in 0..20 {
        pool.wait_ready(1, Duration::from_secs(120));
        let record = run(&pool, code);
        let values: Vec<String> = served_ok(&record, mode).split(' ').map(String::from).collect();
        assert_eq!(values.len(), 5, "{values:?}");
        for (column, value) in seen.iter_mut().zip(values) {
            column.push(value);
        }
    }
    for (name, column) in ["random.random", "numpy.random", "os.urandom", "hash", "authkey"].iter().zip(&seen) {
        let mut distinct = column.clone();
        distinct.sort();
        distinct.dedup();
        // The hash seed is fixed when an interpreter starts: forks of one
        // template share it (docs/design.md says why that is acceptable).
        let expected = if *name == "hash" && mode == PoolMode::Forked { 1 } else { 20 };
        assert_eq!(distinct.len(), expected, "{name} across {mode:?} runs: {column:?}");
    }
}

#[test]
fn a_pooled_run_is_killed_at_its_memory_limit_and_its_own_clocks() {
    killed_at_its_memory_limit_and_its_own_clocks(PoolMode::Pooled);
}

#[test]
fn a_forked_run_is_killed_at_its_memory_limit_and_its_own_clocks() {
    killed_at_its_memory_limit_and_its_own_clocks(PoolMode::Forked);
}

/// Once the pool is full again, a run of `code` with the pool's limits as
/// `change` leaves them.
fn run_with_limits(pool: &Pool, change: impl FnOnce(&mut airlock::Limits), code: &str) -> RunRecord {
    assert!(pool.wait_ready(1, Duration::from_secs(120)), "the pool did not refill: {:?}", pool.stats());
    let mut limits = pool.policy().limits.clone();
    change(&mut limits);
    let request = RunRequest { limits: Some(limits), ..RunRequest::python(code) };
    pool.run(pool.policy(), &[], &request).unwrap()
}

fn killed_at_its_memory_limit_and_its_own_clocks(mode: PoolMode) {
    let _alone = exclusive();
    let mut policy = Policy::default();
    policy.limits.memory_bytes = 256 << 20;
    let pool = pool_in(mode, policy, 1, &["numpy", "pandas"]);
    let record = run(&pool, "import numpy\nx = numpy.ones(64 << 20)\nprint('survived', x.sum())");
    assert_eq!(record.usage.start, Some(start_of(mode)));
    assert_eq!(record.status, Status::MemoryLimit, "stdout: {} message: {:?}", record.stdout, record.message);
    assert!(!record.stdout.contains("survived"));

    // A lower wall time for one run holds from the release.
    let record = run_with_limits(&pool, |l| l.wall_time = Duration::from_secs(2), "import time\ntime.sleep(30)");
    assert_eq!(record.usage.start, Some(start_of(mode)));
    assert_eq!(record.status, Status::Timeout, "{:?}", record.message);
    assert!(record.usage.wall_ms < 10_000, "{} ms", record.usage.wall_ms);
    // The record judges the run by the claim's clocks, not the pool's
    // (before, it said "the wall-time limit of 20 s" here).
    let message = record.message.as_deref().unwrap_or_default();
    assert!(message.contains("wall-time limit of 2 s"), "{message}");
    // A lower CPU time likewise.
    let record = run_with_limits(&pool, |l| l.cpu_time = Duration::from_secs(1), "while True:\n    pass");
    assert_eq!(record.usage.start, Some(start_of(mode)));
    assert_eq!(record.status, Status::CpuLimit, "{:?}", record.message);
    let message = record.message.as_deref().unwrap_or_default();
    assert!(message.contains("CPU-time limit of 1 s"), "{message}");
    // Processes: a fork bomb stops at the pids limit, and the run ends.
    pool.wait_ready(1, Duration::from_secs(120));
    let bomb = "import os, time\nfor _ in range(10000):\n    try:\n        os.fork() or time.sleep(30)\n    except OSError:\n        break\nprint('stopped')";
    let record = run(&pool, bomb);
    assert_eq!(record.usage.start, Some(start_of(mode)));
    assert!(record.limits_hit.contains(&airlock::Limit::Pids), "{:?} {:?}", record.limits_hit, record.message);
}

#[test]
fn a_pool_that_cannot_refill_runs_cold_and_says_why() {
    cannot_refill_runs_cold_and_says_why(PoolMode::Pooled);
}

/// A template whose preload fails never serves forks: as a pool's refill.
#[test]
fn a_forked_pool_whose_template_cannot_start_runs_cold_and_says_why() {
    cannot_refill_runs_cold_and_says_why(PoolMode::Forked);
}

fn cannot_refill_runs_cold_and_says_why(mode: PoolMode) {
    let _alone = exclusive();
    let options = PoolOptions {
        size: 1,
        preload: vec!["airlock_no_such_module".to_owned()],
        idle_expiry: Duration::from_secs(600),
        memory_budget: None,
        env_at_claim: Vec::new(),
        mode,
    };
    let pool = Pool::with_backend(linux(), Policy::default(), data_image(), options, None);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while pool.stats().refill_failures == 0 {
        assert!(std::time::Instant::now() < deadline, "the refill never failed: {:?}", pool.stats());
        std::thread::sleep(Duration::from_millis(100));
    }
    let record = run(&pool, "print(6 * 7)");
    assert_eq!(record.status, Status::Ok, "{:?}", record.message);
    assert_eq!(record.stdout.trim(), "42");
    assert_eq!(record.usage.start, Some(RunStart::Cold));
    let why = &record.isolation.details["pool"];
    assert!(why.contains("refill failed") && why.contains("airlock_no_such_module"), "{why}");
    assert_eq!(pool.stats().ready, 0);

    // A failed refill rests before it tries again, however often claims come:
    // every claim wakes the refill thread, and one that retried at each wake
    // made a whole sandbox (or a template) per claim while the image was gone.
    let failures = pool.stats().refill_failures;
    let began = std::time::Instant::now();
    for _ in 0..20 {
        assert_eq!(run(&pool, "pass").usage.start, Some(RunStart::Cold));
    }
    let retries = pool.stats().refill_failures - failures;
    // At most one try per backoff (2 s), and one more that was under way.
    let at_most = (began.elapsed().as_secs_f64() / 2.0).floor() as u64 + 2;
    assert!(retries <= at_most, "{retries} retries in {:?} of claims: more than one per backoff", began.elapsed());

    // A run whose environment differs from the pool's runs cold too, and says so.
    let mut other = Policy::default();
    other.env.insert("A".to_owned(), "b".to_owned());
    let record = pool.run(&other, &[], &RunRequest::python("import os\nprint(os.environ['A'])")).unwrap();
    assert_eq!(record.stdout.trim(), "b");
    assert_eq!(record.usage.start, Some(RunStart::Cold));
    assert!(record.isolation.details["pool"].contains("env"), "{:?}", record.isolation.details);
}

#[test]
fn a_claim_lowers_the_memory_and_process_limits_and_the_lower_ones_are_enforced() {
    let _alone = exclusive();
    let pool = pool(Policy::default(), 1, &["numpy", "pandas"]);
    let with = |limits: &airlock::Limits, code: &str| {
        pool.wait_ready(1, Duration::from_secs(120));
        let request = RunRequest { limits: Some(limits.clone()), ..RunRequest::python(code) };
        pool.run(pool.policy(), &[], &request).expect("a pooled run")
    };
    // 320 MiB of ones: under the pool's 512 MiB with the preload, over 200.
    let allocate = "import numpy\nx = numpy.ones(40 << 20)\nprint('survived', x.sum())";
    let mut lower = pool.policy().limits.clone();
    lower.memory_bytes = 200 << 20;
    let record = with(&lower, allocate);
    assert_eq!(record.usage.start, Some(RunStart::Pooled), "{:?}", record.isolation.details);
    assert_eq!(record.status, Status::MemoryLimit, "stdout: {} message: {:?}", record.stdout, record.message);
    assert!(!record.stdout.contains("survived"));
    assert!(record.message.as_deref().unwrap_or("").contains("200 MiB"), "{:?}", record.message);
    assert_eq!(record.policy.memory_mb, Some(200));
    // The pool's own limit lets the same code through: the lower one killed it.
    let record = with(&pool.policy().limits, allocate);
    assert_eq!(pooled_ok(&record), "survived 41943040.0");

    // Threads until the process limit stops them.
    let threads = r#"
import threading
done = threading.Event()
started = 0
try:
    for _ in range(40):
        threading.Thread(target=done.wait, daemon=True).start()
        started += 1
except RuntimeError:
    pass
done.set()
print(started)
"#;
    let mut fewer = pool.policy().limits.clone();
    fewer.pids = 8;
    let record = with(&fewer, threads);
    let started: u32 = pooled_ok(&record).parse().unwrap();
    assert!(started < 8, "{started} threads under a limit of 8 processes");
    assert!(record.limits_hit.contains(&airlock::Limit::Pids), "{:?}", record.limits_hit);
    let record = with(&pool.policy().limits, threads);
    assert_eq!(pooled_ok(&record), "40");

    // Lower than what the ready sandbox already holds: cold, saying why.
    let mut under_the_preload = pool.policy().limits.clone();
    under_the_preload.memory_bytes = 32 << 20;
    let record = with(&under_the_preload, "print(1)");
    assert_eq!(record.usage.start, Some(RunStart::Cold));
    let why = &record.isolation.details["pool"];
    assert!(why.contains("memory in use") && why.contains("not under the 32 MiB"), "{why}");
    assert_eq!(pool.stats().unsuited, 1, "{:?}", pool.stats());

    // What the ready sandboxes hold is measured.
    assert!(pool.wait_ready(1, Duration::from_secs(120)));
    let held = pool.stats().memory_bytes.expect("the ready sandbox's cgroup memory");
    assert!(held > 32 << 20, "{held} bytes for an interpreter with pandas imported");
}

/// A run whose memory limit is under what every ready sandbox holds runs
/// cold without taking one: before, each such run destroyed a ready sandbox
/// at its claim, so that any caller could drain the pool with a legal
/// request (two runs asking for 40 MiB left a pool of two empty).
#[test]
fn a_memory_limit_no_ready_sandbox_could_meet_leaves_the_pool_as_it_was() {
    let _alone = exclusive();
    let pool = pool(Policy::default(), 2, &["numpy", "pandas"]);
    let mut small = pool.policy().clone();
    small.limits.memory_bytes = 32 << 20;
    for _ in 0..3 {
        let record = pool.run(&small, &[], &RunRequest::python("print(1)")).expect("a cold run");
        assert_eq!(record.usage.start, Some(RunStart::Cold));
        assert_eq!(record.status, Status::Ok, "{:?} {}", record.message, record.stderr);
        let why = &record.isolation.details["pool"];
        assert!(why.contains("not above what each ready sandbox holds"), "{why}");
    }
    let stats = pool.stats();
    assert_eq!((stats.ready, stats.unsuited, stats.hits), (2, 3, 0), "{stats:?}");
    // The ready sandboxes were kept for the runs they can serve.
    assert_eq!(pooled_ok(&run(&pool, "import pandas; print(pandas.__name__)")), "pandas");
}

#[test]
fn a_pool_stays_within_its_memory_budget() {
    let _alone = exclusive();
    let one = pool(Policy::default(), 1, &["numpy", "pandas"]);
    let each = one.stats().memory_bytes.expect("a ready sandbox's memory");
    drop(one);
    // Room for two and a half: the third would take it past the budget.
    let options = PoolOptions {
        size: 4,
        preload: ["numpy", "pandas"].map(String::from).to_vec(),
        idle_expiry: Duration::from_secs(600),
        memory_budget: Some(each * 5 / 2),
        env_at_claim: Vec::new(),
        mode: PoolMode::Pooled,
    };
    let pool = Pool::with_backend(linux(), Policy::default(), data_image(), options, None);
    assert!(pool.wait_ready(2, Duration::from_secs(120)), "{:?}", pool.stats());
    assert!(!pool.wait_ready(3, Duration::from_secs(15)), "past its budget: {:?}", pool.stats());
    let stats = pool.stats();
    assert_eq!((stats.ready, stats.refills), (2, 2), "{stats:?}");
    assert!(stats.memory_bytes.is_some_and(|held| held <= each * 5 / 2), "{stats:?}");
    // A run takes one; the pool makes one more, and stops again.
    assert_eq!(pooled_ok(&run(&pool, "print(1)")), "1");
    assert!(pool.wait_ready(2, Duration::from_secs(120)), "{:?}", pool.stats());
    assert!(!pool.wait_ready(3, Duration::from_secs(5)), "past its budget: {:?}", pool.stats());
}

/// A run that asks for extra packages never gets a sandbox without them: a
/// pool's sandboxes hold its image alone, so the run goes cold the way any
/// sandbox does, through the image with the packages (found, built or
/// refused, exactly as without a pool). Before the fix the pool made the
/// cold sandbox on its own image, and the run went on without its packages.
#[test]
fn a_run_with_extra_packages_goes_cold_through_the_image_that_has_them() {
    let _only = exclusive();
    let policy = Policy { with_packages: ["airlock-no-such-extra".to_owned()].into(), ..Policy::default() };
    let refused = Pool::new(policy.clone(), Some(data_image()), PoolOptions::default()).unwrap_err().to_string();
    assert!(refused.contains("with_packages"), "{refused}");

    let pool = pool(Policy::default(), 1, &[]);
    let plain =
        airlock::Sandbox::with_backend(linux(), policy.clone(), data_image()).map(|_| ()).map_err(|e| e.to_string());
    let pooled = pool.sandbox(&policy).map(|_| ()).map_err(|e| e.to_string());
    assert!(plain.is_err(), "a package no image has was given to a plain sandbox: {plain:?}");
    assert_eq!(pooled, plain, "the pooled sandbox did not take the plain sandbox's way to its packages");
    assert_eq!(pool.stats().ready, 1, "a ready sandbox was spent on a run it cannot serve: {:?}", pool.stats());
}

/// A pool whose runs may set `TASK_ID` at the claim, its own value "pool".
fn pool_with_task_id(env_at_claim: &[&str]) -> (Pool, Policy) {
    let mut policy = Policy::default();
    policy.env.insert("TASK_ID".to_owned(), "pool".to_owned());
    let options = PoolOptions {
        size: 1,
        preload: vec!["json".to_owned()],
        env_at_claim: env_at_claim.iter().map(|name| name.to_string()).collect(),
        ..PoolOptions::default()
    };
    let pool = Pool::with_backend(linux(), policy.clone(), data_image(), options, None);
    assert!(pool.wait_ready(1, Duration::from_secs(120)), "the pool did not fill: {:?}", pool.stats());
    (pool, policy)
}

/// What the code sees of TASK_ID: in Python, and in a child process (the
/// driver's os.environ also calls putenv).
const SEE_TASK_ID: &str = "import os, subprocess\nprint(os.environ.get('TASK_ID'), subprocess.run(['sh', '-c', 'echo ${TASK_ID-unset}'], capture_output=True, text=True).stdout.strip())";

/// A variable the operator lists in env_at_claim is set warm, after the
/// claim and before the code: the code and its children see the run's
/// value, the record shows it, and the next run of the same pool sees the
/// pool's again; a run may remove it too. Before env_at_claim a run whose
/// env differed from the pool's ran cold (this test's first assertion).
#[test]
fn a_variable_the_pool_lists_reaches_the_code_warm_and_no_later_run() {
    let _alone = exclusive();
    let (pool, policy) = pool_with_task_id(&["TASK_ID"]);
    let mut own = policy.clone();
    own.env.insert("TASK_ID".to_owned(), "run-1".to_owned());
    let record = pool.run(&own, &[], &RunRequest::python(SEE_TASK_ID)).unwrap();
    assert_eq!(pooled_ok(&record), "run-1 run-1");
    assert_eq!(record.policy.env.as_ref().and_then(|env| env.get("TASK_ID")).map(String::as_str), Some("run-1"));

    assert!(pool.wait_ready(1, Duration::from_secs(120)), "no refill: {:?}", pool.stats());
    let record = pool.run(&policy, &[], &RunRequest::python(SEE_TASK_ID)).unwrap();
    assert_eq!(pooled_ok(&record), "pool pool", "the next run saw the previous run's value");

    assert!(pool.wait_ready(1, Duration::from_secs(120)), "no refill: {:?}", pool.stats());
    let mut without = policy.clone();
    without.env.remove("TASK_ID");
    let record = pool.run(&without, &[], &RunRequest::python(SEE_TASK_ID)).unwrap();
    assert_eq!(pooled_ok(&record), "None unset");
    assert_eq!(pool.stats().hits, 3);
}

/// Any other difference in the environment still goes cold, with a reason
/// that names the variable and how to allow it; so does a name read at
/// start-up that a pool made without Pool::new's check lists.
#[test]
fn a_variable_the_pool_does_not_list_goes_cold_and_says_how_to_allow_it() {
    let _alone = exclusive();
    let (pool, policy) = pool_with_task_id(&["TASK_ID", "PYTHONHASHSEED"]);
    for (name, value) in [("OTHER_ID", "x"), ("PYTHONHASHSEED", "0")] {
        let mut other = policy.clone();
        other.env.insert(name.to_owned(), value.to_owned());
        let code = format!("import os\nprint(os.environ['{name}'])");
        let record = pool.run(&other, &[], &RunRequest::python(&code)).unwrap();
        assert_eq!(record.usage.start, Some(RunStart::Cold), "{name} was set warm");
        assert_eq!((record.status, record.stdout.trim()), (Status::Ok, value));
        let why = record.isolation.details.get("pool").cloned().unwrap_or_default();
        assert!(why.contains(name) && why.contains("env_at_claim"), "{name}: {why}");
    }
    assert_eq!(pool.stats().ready, 1, "a ready sandbox was spent on a run it cannot serve: {:?}", pool.stats());
}

/// A name known to be read at start-up is refused in env_at_claim when the
/// pool is made, with the reason and the fix.
#[test]
fn a_name_read_at_start_up_is_refused_in_env_at_claim() {
    for name in ["LD_PRELOAD", "PYTHONPATH", "OMP_NUM_THREADS", "LANG", "TZ", "TASK-ID"] {
        let options =
            PoolOptions { env_at_claim: vec!["TASK_ID".to_owned(), name.to_owned()], ..PoolOptions::default() };
        let refused = Pool::new(Policy::default(), Some(data_image()), options).unwrap_err().to_string();
        assert!(refused.contains(name) && refused.contains("env_at_claim"), "{name}: {refused}");
    }
}

/// What of a sandbox this process holds: its namespaces' descriptors and
/// its host-id lock (root's), by what each descriptor names.
fn sandbox_descriptors() -> Vec<String> {
    let namespaces = ["mnt:[", "user:[", "pid:[", "net:[", "ipc:[", "uts:[", "cgroup:["];
    std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| std::fs::read_link(entry.path()).ok())
        .map(|target| target.display().to_string())
        .filter(|target| namespaces.iter().any(|ns| target.starts_with(ns)) || target.ends_with("host-ids.lock"))
        .collect()
}

/// This process's children (a sandbox's helper is one while it lives).
fn children() -> Vec<String> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .filter(|stat| stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)) == Some(&me))
        .collect()
}

/// A pooled run's sandbox is destroyed off the caller's path, by the
/// pool's reaper, and the pool refills at once; closing the pool right
/// after the run must still leave nothing: no process, cgroup or mount, no
/// namespace or host id held. Checked once, without waiting. Before the
/// fix, `close` returned while the refill was still making a sandbox (its
/// helper and cgroup alive); with the reaper not joined, the run's
/// sandbox's namespaces and host id are still held.
#[test]
fn a_pool_closed_right_after_a_run_leaves_no_process_cgroup_mount_or_namespace() {
    closed_right_after_a_run_leaves_nothing(PoolMode::Pooled);
}

/// As above, for a forked pool: its template, its forks made ready and the
/// run's fork all go with `close`.
#[test]
fn a_forked_pool_closed_right_after_a_run_leaves_no_process_cgroup_mount_or_namespace() {
    closed_right_after_a_run_leaves_nothing(PoolMode::Forked);
}

fn closed_right_after_a_run_leaves_nothing(mode: PoolMode) {
    let _alone = exclusive();
    let held_before = sandbox_descriptors();
    assert!(children().is_empty(), "children before the pool: {:?}", children());
    let pool = pool_in(mode, Policy::default(), 1, &[]);
    assert_eq!(served_ok(&run(&pool, "print(6 * 7)"), mode), "42");
    pool.close();
    assert_eq!(airlock_tests::leftovers(""), Vec::<String>::new(), "cgroups or mounts left after close");
    assert_eq!(children(), Vec::<String>::new(), "processes left after close");
    assert_eq!(sandbox_descriptors(), held_before, "a sandbox's namespaces or host id held after close");
    // A run after close is cold, and its sandbox destroyed by its caller.
    let record = run(&pool, "print(1)");
    assert_eq!(record.usage.start, Some(RunStart::Cold), "{:?}", record.isolation.details);
    assert_eq!(sandbox_descriptors(), held_before, "a cold run's sandbox outlived its run after close");
}

/// A stand-in for the forks' native library that lies: its forks look
/// confined where a process's word could be taken (every capability set
/// empty, no_new_privs, a seccomp filter: an allow-all one, when
/// `with_filter`) but make no namespace, mount, Landlock domain or real
/// filter. The supervisor must catch it from outside.
const LYING_LIBRARY: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void look_confined(int with_filter) {
    for (int cap = 0; cap < 64; cap++) prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct none[2] = {{0}};
    syscall(SYS_capset, &header, none);
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    if (with_filter) {
        struct sock_filter allow = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
        struct sock_fprog program = {1, &allow};
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &program);
    }
}
int airlock_fork_unshare_pid(void) { return unshare(CLONE_NEWPID) ? errno : 0; }
int airlock_fork_join_pid_namespace(int fd) { return setns(fd, CLONE_NEWPID) ? errno : 0; }
int airlock_fork_init(int plan, int lifeline, int ready) {
    look_confined(1);
    write(ready, "1", 1);
    for (;;) if (wait(0) < 0) pause();
}
int airlock_fork_child(int plan, int setup, int lifeline) {
    look_confined(WITH_FILTER);
    return 0;
}
"#;

/// A backend whose helper has the lying library beside it, built with
/// `with_filter`.
fn backend_with_lying_library(with_filter: bool) -> (&'static airlock_linux::LinuxBackend, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let source = dir.path().join("lying.c");
    std::fs::write(&source, LYING_LIBRARY).unwrap();
    let library = dir.path().join(airlock_linux::FORK_LIB_NAME);
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(format!("-DWITH_FILTER={}", i32::from(with_filter)))
        .arg(&source)
        .status()
        .expect("cc, the C compiler the Rust toolchain links with");
    assert!(built.success(), "the lying library did not build");
    let helper = dir.path().join("airlock-init");
    std::fs::copy(airlock_tests::helper(), &helper).unwrap();
    let backend: &'static airlock_linux::LinuxBackend =
        Box::leak(Box::new(airlock_linux::LinuxBackend::with_helper(helper)));
    (backend, dir)
}

#[test]
fn a_fork_that_only_looks_confined_is_caught_from_outside_and_the_run_goes_cold() {
    let _alone = exclusive();
    for (with_filter, caught) in [(true, "shares the template's mnt namespace"), (false, "seccomp filters, not")] {
        let (backend, _dir) = backend_with_lying_library(with_filter);
        let options =
            PoolOptions { size: 1, preload: vec!["json".to_owned()], mode: PoolMode::Forked, ..PoolOptions::default() };
        let pool = Pool::with_backend(backend, Policy::default(), data_image(), options, None);
        assert!(!pool.wait_ready(1, Duration::from_secs(15)), "a lying fork was made ready: {:?}", pool.stats());
        let stats = pool.stats();
        let error = stats.last_refill_error.clone().unwrap_or_default();
        assert!(stats.templates >= 1 && error.contains(caught), "with_filter {with_filter}: {stats:?}");
        let record = run(&pool, "print('ran')");
        assert_eq!((record.usage.start, record.stdout.trim()), (Some(RunStart::Cold), "ran"));
        let why = record.isolation.details.get("pool").cloned().unwrap_or_default();
        assert!(why.contains(caught), "{why}");
        drop(pool);
        airlock_tests::assert_nothing_left("airlock-lying-fork");
    }
}

/// A pooled sandbox's run, and a forked pool's template, is made on a
/// thread of its own, which may not use a helper started on the refill's
/// (`spare`): the backend starts none for it. It used to start one for each
/// that made a network namespace (as root) and was then refused, unused.
#[test]
fn a_pooled_sandbox_starts_no_helper_for_its_run_that_it_does_not_use() {
    let (made, starts) = helper_starts_of_a_pool(PoolMode::Pooled);
    // Each sandbox's setup and its run: two starts a sandbox, and one
    // spare more, for a first run, with the backend's probe.
    assert!(made >= 4, "{made} sandboxes made");
    assert!(starts.lines().count() as u64 <= 2 * made + 2, "{made} pooled sandboxes:\n{starts}");
}

#[test]
fn a_forked_pools_template_starts_no_helper_for_its_run_that_it_does_not_use() {
    helper_starts_of_a_pool(PoolMode::Forked);
}

/// The sandboxes a pool of `mode` made for three runs (a forked pool's
/// each from a template of its own) and the helper's starts meanwhile, each
/// line its arguments; asserts that at most one helper was started ahead of
/// a run (the backend's, with its probe).
fn helper_starts_of_a_pool(mode: PoolMode) -> (u64, String) {
    use std::os::unix::fs::PermissionsExt;
    let _alone = exclusive();
    // The helper, behind a script that notes each start's arguments.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("starts");
    let noting = dir.path().join("airlock-init");
    std::fs::write(
        &noting,
        format!("#!/bin/sh\necho \"start $*\" >> {log:?}\nexec {:?} \"$@\"\n", airlock_tests::helper()),
    )
    .unwrap();
    std::fs::set_permissions(&noting, std::fs::Permissions::from_mode(0o755)).unwrap();
    // The forked mode's library, from beside the real helper.
    let library = airlock_tests::helper().with_file_name(airlock_linux::FORK_LIB_NAME);
    let backend: &'static airlock_linux::LinuxBackend =
        Box::leak(Box::new(airlock_linux::LinuxBackend::with_helper(&noting).with_fork_library(library)));
    // A forked pool's template is made again once it passes the expiry:
    // each run then comes from a template of its own.
    let idle_expiry = Duration::from_secs(if mode == PoolMode::Forked { 1 } else { 600 });
    let options = PoolOptions { size: 1, preload: Vec::new(), mode, idle_expiry, ..PoolOptions::default() };
    let pool = Pool::with_backend(backend, Policy::default(), data_image(), options, None);
    for _ in 0..3 {
        if mode == PoolMode::Forked {
            std::thread::sleep(Duration::from_millis(1500));
        }
        assert!(pool.wait_ready(1, Duration::from_secs(120)), "the pool did not fill: {:?}", pool.stats());
        assert_eq!(served_ok(&run(&pool, "print(1+1)"), mode), "2");
        assert!(pool.wait_ready(1, Duration::from_secs(120)), "the pool did not refill: {:?}", pool.stats());
    }
    let starts = std::fs::read_to_string(&log).unwrap();
    let made = pool.stats().refills;
    if mode == PoolMode::Forked {
        assert!(pool.stats().templates >= 2, "no template was made again after the expiry: {:?}", pool.stats());
    }
    let spares = starts.lines().filter(|line| line.contains("run-spare")).count();
    assert!(spares <= 1, "{spares} helpers started ahead of runs, for {made} {mode:?} sandboxes:\n{starts}");
    (made, starts)
}

/// A run that allows hosts is served warm, whatever the pool's own
/// allowlist: each pooled sandbox makes its proxy's listener with the rest,
/// and at the claim the proxy starts with the run's allowlist (the proxy's
/// variables set then), so it serves the run alone, from its release; a run
/// that allows none finds the listener closed and no variable, as a cold
/// run. Each reaches its allowed host and nothing else, and its record holds
/// its own connections and allowlist. A forked pool's forks have no
/// listener: a run that allows hosts goes cold there, and says why, and one
/// that allows none is forked whatever the pool's policy allows. (Before,
/// every run whose network was not the pool's went cold, and a pool whose
/// policy allowed hosts never filled.)
#[test]
fn runs_that_allow_hosts_are_served_warm_through_a_proxy_started_at_the_claim() {
    let _alone = exclusive();
    let (first, second) = (servers::Server::http(), servers::Server::http());
    let allowing = |server: &servers::Server| {
        let spec = PolicySpec { allow_hosts: Some(vec![format!("127.0.0.1:{}", server.port())]), ..Default::default() };
        Policy::from_spec(&spec, &airlock::host_facts().unwrap()).unwrap()
    };
    let code = format!(
        "import os, socket, urllib.request, urllib.error\n\
         def fetch(url):\n\
         \x20   try:\n\
         \x20       with urllib.request.urlopen(url, timeout=10) as r:\n\
         \x20           return r.status, r.read().decode()\n\
         \x20   except urllib.error.HTTPError as e:\n\
         \x20       return e.code, ''\n\
         \x20   except Exception as e:\n\
         \x20       return type(e).__name__\n\
         print(os.environ.get('HTTP_PROXY'))\n\
         print(fetch('http://127.0.0.1:{a}/first'))\n\
         print(fetch('http://127.0.0.1:{b}/second'))\n\
         try:\n\
         \x20   socket.create_connection(('127.0.0.1', 3128), timeout=5).close()\n\
         \x20   print('3128 open')\n\
         except OSError as e:\n\
         \x20   print(type(e).__name__)",
        a = first.port(),
        b = second.port()
    );
    let ask = |pool: &Pool, policy: &Policy| pool.run(policy, &[], &RunRequest::python(&code)).expect("a run");
    let verdicts = |record: &RunRecord| -> Vec<NetworkVerdict> {
        record.network.as_ref().map(|n| n.connections.iter().map(|c| c.verdict).collect()).unwrap_or_default()
    };
    let proxy = "http://127.0.0.1:3128";
    let refused = "ConnectionRefusedError";

    // A pool that allows no host: a run that allows the first, then one that allows none.
    let pool = pool(Policy::default(), 1, &["json"]);
    let record = ask(&pool, &allowing(&first));
    let lines: Vec<&str> = pooled_ok(&record).lines().collect();
    assert_eq!(lines, [proxy, "(200, 'hello from /first')", "(403, '')", "3128 open"]);
    // The bare connection to the proxy, which sent no request, is in the record too.
    assert_eq!(verdicts(&record), [NetworkVerdict::Allowed, NetworkVerdict::Denied, NetworkVerdict::Denied]);
    let allowed = &record.network.as_ref().unwrap().allowed_hosts;
    assert_eq!(allowed, &[format!("127.0.0.1:{}", first.port())], "the run's allowlist, not the pool's");
    assert!(pool.wait_ready(1, Duration::from_secs(120)), "the pool did not refill: {:?}", pool.stats());
    let record = ask(&pool, &Policy::default());
    let lines: Vec<&str> = pooled_ok(&record).lines().collect();
    assert_eq!(lines, ["None", "URLError", "URLError", refused], "no network, no proxy, nothing listening");
    assert!(record.network.is_none(), "{:?}", record.network);
    drop(pool);

    // A pool that allows the first host: a run that allows the second.
    let pool = pool_in(PoolMode::Pooled, allowing(&first), 1, &["json"]);
    let record = ask(&pool, &allowing(&second));
    let lines: Vec<&str> = pooled_ok(&record).lines().collect();
    assert_eq!(lines, [proxy, "(403, '')", "(200, 'hello from /second')", "3128 open"]);
    assert_eq!(verdicts(&record), [NetworkVerdict::Denied, NetworkVerdict::Allowed, NetworkVerdict::Denied]);
    drop(pool);
    assert_eq!((first.requests().len(), second.requests().len()), (1, 1), "a host not allowed was dialled");

    // A forked pool, whose own policy allows the first host: a run that
    // allows none is forked (its template makes no listener), a run that
    // allows hosts goes cold. (Before, such a template refused to start.)
    let forked = pool_in(PoolMode::Forked, allowing(&first), 1, &["json"]);
    let record = ask(&forked, &Policy::default());
    let lines: Vec<&str> = served_ok(&record, PoolMode::Forked).lines().collect();
    assert_eq!(lines, ["None", "URLError", "URLError", refused], "no network, no proxy, nothing listening");
    assert!(forked.wait_ready(1, Duration::from_secs(120)), "the pool did not refill: {:?}", forked.stats());
    let refills = forked.stats().refills;
    let record = ask(&forked, &allowing(&first));
    assert_eq!(record.status, Status::Ok, "{:?}", record.message);
    assert_eq!(record.usage.start, Some(RunStart::Cold));
    assert!(record.stdout.contains("(200, 'hello from /first')"), "{}", record.stdout);
    let why = &record.isolation.details["pool"];
    assert!(why.contains("no proxy listener"), "{why}");
    // Decided before a fork is taken: the ready one stays for another run,
    // and none is made (before, each such run destroyed one, made again).
    std::thread::sleep(Duration::from_millis(500));
    let stats = forked.stats();
    assert_eq!((stats.ready, stats.unsuited, stats.refills), (1, 1, refills), "{stats:?}");
}
