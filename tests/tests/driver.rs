//! The driver starts and ends the code's interpreter as plain Python would,
//! only cheaper (issue 15, the cold path): where the runtime's `site` is
//! known the driver sets it up itself (Python starts with `-S`); the code
//! is compiled without the `ast` types `compile()` makes first; every run
//! ends without the interpreter's teardown, after what an exit must do.
//! Each test holds the code's view to plain Python's, on real sandboxes.

// A test: a failure to set up or a surprise is a failed test, said plainly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use airlock::{Policy, RunRecord, RunRequest, Sandbox, Status};
use airlock_tests::{
    EACH_START_METHOD_SUMS, ENDS_WITH_WORK_LEFT, POOLS_OF_EACH_START_METHOD, assert_ended_as_an_exit_does, data_image,
    linux, shared,
};

fn ok(record: &RunRecord) -> &str {
    assert_eq!(
        record.status,
        Status::Ok,
        "stderr: {}\nerror: {:?}\nmessage: {:?}",
        record.stderr,
        record.error,
        record.message
    );
    record.stdout.trim()
}

/// What the code's interpreter was set up with, as JSON: its prefixes, its
/// path from the standard library on (the first entry is the script's
/// folder, which differs by design), the builtins `site` adds.
const SET_UP: &str = r#"import builtins, json, sys
print(json.dumps({
    "prefix": sys.prefix, "exec_prefix": sys.exec_prefix, "base_prefix": sys.base_prefix,
    "home": getattr(sys, "_home", None), "path": sys.path[1:],
    "builtins": {n: type(getattr(builtins, n, None)).__name__ for n in ("exit", "quit", "help")},
    "texts": [str(getattr(builtins, n, "")).split()[0] for n in ("copyright", "credits", "license")],
}, sort_keys=True))"#;

#[test]
fn a_run_from_an_image_starts_as_pythons_own_site_would_have_it() {
    let _guard = shared();
    let runtime = data_image();
    assert_eq!(runtime.known_site.as_deref(), Some(Path::new("/opt/airlock/image")), "the image's site is known");
    let mut sandbox = Sandbox::with_backend(linux(), Policy::default(), runtime).unwrap();
    sandbox.write("/work/set_up.py", SET_UP.as_bytes()).unwrap();
    // The driver's interpreter (no `site`), then a child Python started
    // plainly in the same sandbox, whose `site` runs as Python's own.
    let code = "import sys, subprocess\nprint(sys.flags.no_site, 'site' in sys.modules)\n\
                exec(open('/work/set_up.py').read())\nsys.stdout.flush()\n\
                subprocess.run([sys.executable, '/work/set_up.py'], check=True)\n";
    let record = sandbox.run(code);
    let out = ok(&record);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert_eq!(lines[0], "1 False", "the driver set up the image's site itself");
    assert_eq!(lines[1], lines[2], "the driver's set-up differs from Python's own `site`");
    let set_up: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(set_up["prefix"], "/opt/airlock/image");
    assert_eq!(set_up["builtins"]["exit"], "Quitter");
    assert_eq!(set_up["texts"][0], "Copyright");

    // The builtins work as `site`'s do, and the packages import.
    let record = sandbox.run("import numpy\nprint(repr(quit), numpy.__name__)\nexit(7)");
    assert_eq!((record.exit_code, record.stdout.trim()), (Some(7), "Use quit() or Ctrl-D (i.e. EOF) to exit numpy"));
}

/// A venv of the host's Python holding `files` (path below its
/// site-packages, content), in a folder others may read (the sandbox's user
/// is not the caller).
fn venv_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("airlock-venv-").tempdir_in("/var/tmp").unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let made = std::process::Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(dir.path().join("venv"))
        .status()
        .unwrap();
    assert!(made.success());
    let site_packages = std::fs::read_dir(dir.path().join("venv/lib"))
        .unwrap()
        .map(|e| e.unwrap().path().join("site-packages"))
        .next()
        .unwrap();
    for (name, content) in files {
        std::fs::write(site_packages.join(name), content).unwrap();
    }
    dir
}

fn venv_runtime(dir: &tempfile::TempDir) -> airlock::Runtime {
    let python = dir.path().join("venv/bin/python");
    airlock::interpreter::Interpreter::resolve(python.to_str().unwrap()).unwrap().runtime()
}

#[test]
fn a_venv_whose_site_would_run_code_keeps_pythons_own_site() {
    let _guard = shared();
    // A .pth file with an import line: code `site` runs at every start.
    let dir = venv_with(&[("airlock_probe.pth", "import sys; sys.airlock_pth_ran = True\n")]);
    let runtime = venv_runtime(&dir);
    assert_eq!(runtime.known_site, None, "a .pth file leaves site to Python");
    let mut sandbox = Sandbox::with_backend(linux(), Policy::default(), runtime).unwrap();
    let record = sandbox.run("import sys\nprint(sys.flags.no_site, getattr(sys, 'airlock_pth_ran', False))");
    assert_eq!(ok(&record), "0 True");

    // Without one, the same venv's site is known, and set up by the driver,
    // unless the interpreter's own library holds a sitecustomize (Debian's
    // /usr/bin/python3 does), which site would run.
    let dir = venv_with(&[]);
    let runtime = venv_runtime(&dir);
    let probe = "import importlib.util, sys; print(importlib.util.find_spec('sitecustomize') is not None)";
    let base =
        std::process::Command::new(dir.path().join("venv/bin/python")).args(["-I", "-c", probe]).output().unwrap();
    let expected = match String::from_utf8_lossy(&base.stdout).trim() {
        "False" => Some(Path::new("/opt/airlock/venv")),
        "True" => None,
        other => panic!("the interpreter's probe said {other:?}: {}", String::from_utf8_lossy(&base.stderr)),
    };
    assert_eq!(runtime.known_site.as_deref(), expected);
}

#[test]
fn a_sitecustomize_on_the_runs_own_pythonpath_still_runs() {
    let _guard = shared();
    // The runtime's site is known, but the run's environment names a folder
    // the supervisor did not look at: the driver hands over to `site`.
    let mut policy = Policy::default();
    policy.env.insert("PYTHONPATH".to_owned(), "/work/lib".to_owned());
    let mut sandbox = Sandbox::with_backend(linux(), policy, data_image()).unwrap();
    sandbox.write("/work/lib/sitecustomize.py", b"import builtins\nbuiltins.customized = 'yes'\n").unwrap();
    let record = sandbox.run("import sys\nprint(customized, sys.prefix)");
    assert_eq!(ok(&record), "yes /opt/airlock/image");
}

#[test]
fn a_cold_run_ends_as_an_exit_does_threads_atexit_finalizers_and_open_files_included() {
    let _guard = shared();
    let mut sandbox = Sandbox::with_backend(linux(), Policy::default(), data_image()).unwrap();
    // The process ends without the interpreter's teardown; what an exit must
    // do still happens, in an exit's order.
    let record = sandbox.run(ENDS_WITH_WORK_LEFT);
    let out = ok(&record).to_owned();
    assert_ended_as_an_exit_does(&out, &mut sandbox);
    // Exit statuses and signals are the code's.
    assert_eq!(sandbox.run("import sys\nsys.exit(3)").exit_code, Some(3));
    assert_eq!(sandbox.run("raise SystemExit('bye')").exit_code, Some(1));
    assert_eq!(sandbox.run("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)").signal, Some(15));
}

/// The compile without compile() (driver.py, `_compile`) takes the code's
/// own frame only: an import the compiler makes on the way (a named
/// character escape needs unicodedata, a coding cookie its codec) runs as
/// it would, and the code's `__future__` imports hold.
#[test]
fn code_that_makes_the_compiler_import_compiles_as_compile_would() {
    let _guard = shared();
    let mut sandbox = Sandbox::with_backend(linux(), Policy::default(), data_image()).unwrap();
    let record = sandbox.run("print('\\N{BULLET} item')");
    assert_eq!(ok(&record), "\u{2022} item");
    let record = sandbox.run("# -*- coding: cp1252 -*-\nimport sys\nprint('cookie', sys.flags.no_site)");
    assert_eq!(ok(&record), "cookie 1");
    let record =
        sandbox.run("from __future__ import annotations\ndef f(x: not_defined): pass\nprint(f.__annotations__)");
    assert_eq!(ok(&record), "{'x': 'not_defined'}");
    let record = sandbox.run("import re\nm = re.match('\\d+', '42')\nm.group()");
    assert_eq!((record.status, record.value.as_deref()), (Status::Ok, Some("'42'")), "{record:?}");
}

/// A finalizer that runs at the end sees the module's globals, as at a
/// normal exit; a stdout that cannot be flushed at the end fails the run
/// with Python's status for it, 120, and says so.
#[test]
fn the_end_keeps_globals_for_finalizers_and_a_failed_flush_is_not_silent() {
    let _guard = shared();
    let mut sandbox = Sandbox::with_backend(linux(), Policy::default(), data_image()).unwrap();
    let code = "import os\nclass Saver:\n    def __del__(self):\n        os.write(1, b'saved\\n')\ns = Saver()\n";
    assert_eq!(ok(&sandbox.run(code)), "saved");
    let record = sandbox.run("import sys\nsys.stdout = open('/dev/full', 'w')\nprint('lost')");
    assert_eq!(record.exit_code, Some(120), "{record:?}");
    assert!(record.stderr.contains("Exception ignored in"), "{}", record.stderr);
}

#[test]
fn the_codes_own_name_is_in_its_tracebacks_warnings_and_nested_code() {
    let _guard = shared();
    let mut sandbox = Sandbox::with_backend(linux(), Policy::default(), data_image()).unwrap();
    let code = "import sys, warnings\n\
                def f():\n    return [g for g in (lambda: 1,)][0].__code__.co_filename\n\
                print(f(), f.__code__.co_filename, sys.gettrace())\n\
                warnings.warn('careful')\n\
                1 / 0\n";
    let request = RunRequest { display_name: Some("job.py".to_owned()), ..RunRequest::python(code) };
    let record = sandbox.run_request(&request);
    assert_eq!(record.stdout.trim(), "job.py job.py None", "{}", record.stderr);
    assert!(record.stderr.starts_with("job.py:5: UserWarning: careful"), "{}", record.stderr);
    assert!(record.stderr.contains("File \"job.py\", line 6, in <module>"), "{}", record.stderr);
    assert_eq!(record.error.as_ref().map(|e| e.line), Some(Some(6)));

    // A warning the compiler gives names the code's file too.
    let request =
        RunRequest { display_name: Some("job.py".to_owned()), ..RunRequest::python("x = 1\nif x is 1: pass\n") };
    let record = sandbox.run_request(&request);
    assert!(record.stderr.contains("job.py:2: SyntaxWarning"), "{}", record.stderr);

    // A syntax error names the code's file, as compile() would.
    let request = RunRequest { display_name: Some("job.py".to_owned()), ..RunRequest::python("x = (1,\n") };
    let record = sandbox.run_request(&request);
    assert!(record.stderr.contains("File \"job.py\", line 1"), "{}", record.stderr);
    let error = record.error.unwrap();
    assert_eq!((error.kind.as_str(), error.line), ("SyntaxError", Some(1)));
}

#[test]
fn multiprocessing_pools_start_by_every_method_for_inline_and_named_code() {
    let _guard = shared();
    let mut sandbox = Sandbox::with_backend(linux(), Policy::default(), data_image()).unwrap();
    let each = EACH_START_METHOD_SUMS;

    // Whoever else reads `__main__.__file__` (pandas does, at every repr)
    // gets the display name, and no script is written for them.
    let code = "import os, __main__, pandas\nprint(repr(pandas.DataFrame({'a': [1]})).split()[0], \
                __main__.__file__, os.path.exists('/tmp/.airlock-main.py'))";
    assert_eq!(ok(&sandbox.run(code)), "a <code> False");

    // The code's `__file__` is its display name, as before.
    let record = sandbox.run(POOLS_OF_EACH_START_METHOD);
    assert_eq!(ok(&record), format!("{each} <code> /work"));
    assert_eq!(record.value.as_deref(), Some("3"), "the last expression, evaluated by the run alone");
    let named = |code: &str| RunRequest { display_name: Some("job.py".to_owned()), ..RunRequest::python(code) };
    let record = sandbox.run_request(&named(POOLS_OF_EACH_START_METHOD));
    assert_eq!(ok(&record), format!("{each} job.py /work"));

    // A file of that name the run was given is neither run by the children
    // nor touched; nor is the working directory.
    sandbox.write("/work/job.py", b"def square(x):\n    return -1\n").unwrap();
    let code =
        POOLS_OF_EACH_START_METHOD.replace("len(sums)", "    print(open('job.py').read(), os.listdir('.'))\nlen(sums)");
    let record = sandbox.run_request(&named(&code));
    assert_eq!(ok(&record), format!("{each} job.py /work\ndef square(x):\n    return -1\n ['job.py']"));

    // A last expression that shares its line (split by the AST) is left
    // out of the children's code too.
    let record = sandbox.run(&POOLS_OF_EACH_START_METHOD.replace("len(sums)", "done = True; len(sums)"));
    assert_eq!(ok(&record), format!("{each} <code> /work"));
    assert_eq!(record.value.as_deref(), Some("3"));

    // The runs of one sandbox share its /tmp, where the children's script
    // is: each run's children run that run's code.
    let record = sandbox.run(&POOLS_OF_EACH_START_METHOD.replace("x * x", "x * x * x"));
    assert_eq!(ok(&record), "spawn 2025 True forkserver 2025 True fork 2025 True <code> /work");
}

#[test]
fn a_spawned_child_has_what_the_driver_gives_the_code_display_plots_and_exit() {
    let _guard = shared();
    let mut sandbox = Sandbox::with_backend(linux(), Policy::default(), data_image()).unwrap();
    // Each child runs the code's top level again, as `__mp_main__`: its
    // `display` prints, its plots render off-screen, `exit` is Python's.
    let code = r#"import multiprocessing as mp
import matplotlib.pyplot as plt
display("shown by each child too")
def draw(n):
    plt.plot(range(n))
    plt.savefig(f"/tmp/{n}.png")
    return type(exit).__name__
if __name__ == "__main__":
    pool = mp.get_context("spawn").Pool(1)
    print(pool.map(draw, [3]))
    # Closed, not terminated, so that the child flushes its output as it exits.
    pool.close()
    pool.join()
"#;
    let record = sandbox.run(code);
    assert_eq!(ok(&record), "['Quitter']\n'shown by each child too'");
    assert_eq!(record.results.len(), 1, "the run's own display: {:?}", record.results);
}

#[test]
fn a_process_that_a_spawned_child_starts_runs_the_code_too() {
    let _guard = shared();
    let mut sandbox = Sandbox::with_backend(linux(), Policy::default(), data_image()).unwrap();
    // A Process started by spawn or forkserver starts one of its own by
    // each method. Plain Python, running the script from the working
    // directory, runs it in every generation; the grandchild used to be told
    // to run `/work/<display name>`, not there, and died as it started.
    let code = r#"import multiprocessing as mp
def leaf(q):
    q.put(f"leaf {__file__}")
def middle(q, method):
    # A module that prepares children, loaded only now (as joblib loads
    # loky's when first asked for workers), points them at the script too.
    import sys
    sys.modules.pop("multiprocessing.spawn")
    import multiprocessing.spawn as loaded_now
    q.put(loaded_now.get_preparation_data("x").get("init_main_from_path"))
    p = mp.get_context(method).Process(target=leaf, args=(q,))
    p.start()
    p.join()
    q.put(f"{method} {p.exitcode}")
if __name__ == "__main__":
    for outer in ("spawn", "forkserver"):
        for inner in ("spawn", "forkserver"):
            q = mp.get_context(outer).Queue()
            p = mp.get_context(outer).Process(target=middle, args=(q, inner))
            p.start()
            p.join(30)
            print(outer, *(q.get(timeout=5) for _ in range(3)), p.exitcode)
"#;
    let expected = |name: &str| {
        ["spawn spawn", "spawn forkserver", "forkserver spawn", "forkserver forkserver"]
            .map(|pair| {
                let (outer, inner) = pair.split_once(' ').unwrap();
                format!("{outer} /tmp/.airlock-main.py leaf {name} {inner} 0 0")
            })
            .join("\n")
    };
    assert_eq!(ok(&sandbox.run(code)), expected("<code>"));

    // Named, with a file of that name in the working directory: the
    // grandchildren run the code, not the file.
    sandbox.write("/work/job.py", b"raise SystemExit('the given file ran')\n").unwrap();
    let request = RunRequest { display_name: Some("job.py".to_owned()), ..RunRequest::python(code) };
    assert_eq!(ok(&sandbox.run_request(&request)), expected("job.py"));
}
