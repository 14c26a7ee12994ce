//! The `airlock` command end to end: exit statuses, the readable report, the
//! JSON record, the weighted-median job, and the richer results.

use std::path::Path;
use std::process::Output;

use airlock_tests::{airlock_command, data_image};
use serde_json::Value;

fn run(args: &[&str], dir: &Path) -> Output {
    // Make sure the image exists before a command that would build it.
    let _ = data_image();
    airlock_command().arg("run").args(args).current_dir(dir).output().expect("run airlock")
}

fn json(args: &[&str], dir: &Path) -> (Value, i32) {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let output = run(&all, dir);
    let record: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}\n{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
    });
    (record, output.status.code().unwrap_or(-1))
}

#[test]
fn exit_statuses_follow_timeout_and_docker() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(json(&["-c", "print('hi')"], dir.path()).1, 0);
    assert_eq!(json(&["-c", "import sys; sys.exit(3)"], dir.path()).1, 3);
    assert_eq!(json(&["-c", "1/0"], dir.path()).1, 1);
    let (record, code) = json(&["--timeout", "1", "-c", "while True: pass"], dir.path());
    assert_eq!((record["status"].as_str(), code), (Some("timeout"), 124));
    let (record, code) =
        json(&["--memory", "64", "-c", "x = []\nwhile True: x.append(bytearray(8 << 20))"], dir.path());
    assert_eq!((record["status"].as_str(), code), (Some("memory_limit"), 137));
    let output = run(&["--memory", "0", "-c", "1"], dir.path());
    assert_eq!(output.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("memory_mb") && stderr.contains("16"), "names the field and the fix: {stderr}");
    let output = run(&["--timeout", "-1", "-c", "1"], dir.path());
    assert_eq!(output.status.code(), Some(125));
    let output = run(&["--file", "/nonexistent/file.csv", "-c", "1"], dir.path());
    assert!(String::from_utf8_lossy(&output.stderr).contains("/nonexistent/file.csv"));
    let output = run(&["--file", "/etc/hostname:/etc/passwd", "-c", "1"], dir.path());
    assert!(String::from_utf8_lossy(&output.stderr).contains("outside /work"));
}

#[test]
fn the_record_has_every_field() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.txt"), "hello").unwrap();
    let (record, _) = json(
        &[
            "--file",
            "in.txt",
            "--out",
            "/work/o.txt",
            "-c",
            "open('/work/o.txt','w').write(open('/work/in.txt').read())",
        ],
        dir.path(),
    );
    for field in [
        "status",
        "limits_hit",
        "exit_code",
        "signal",
        "stdout",
        "stderr",
        "stdout_truncated",
        "stderr_truncated",
        "code",
        "code_sha256",
        "language",
        "policy",
        "inputs",
        "artifacts",
        "usage",
        "isolation",
        "image",
    ] {
        assert!(record.get(field).is_some(), "missing {field}: {record}");
    }
    for field in ["wall_ms", "cpu_ms", "peak_memory_bytes"] {
        assert!(record["usage"][field].is_u64(), "usage.{field}: {record}");
    }
    assert_eq!(record["inputs"][0]["path"], "/work/in.txt");
    assert_eq!(record["inputs"][0]["sha256"], "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");
    assert_eq!(record["artifacts"][0]["bytes"], 5);
    assert!(record["artifacts"][0]["saved_to"].as_str().unwrap().ends_with("o.txt"));
    assert_eq!(std::fs::read_to_string(dir.path().join("o.txt")).unwrap(), "hello");
    assert_eq!(record["image"]["name"], "python-data");
    assert_eq!(record["policy"]["memory_mb"], 512);
}

#[test]
fn the_readable_report_shows_the_code_above_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(&["-c", "print('out')\nimport sys\nprint('err', file=sys.stderr)\n6 * 7"], dir.path());
    let text = String::from_utf8_lossy(&output.stdout);
    let code_at = text.find("1 │ print('out')").expect("numbered code");
    let out_at = text.find("── stdout").expect("stdout section");
    assert!(code_at < out_at, "{text}");
    assert!(text.contains("── value") && text.contains("\n42\n"), "{text}");
    assert!(text.contains("err\n"), "{text}");
    assert!(text.contains("ok · exit 0"), "{text}");
    assert!(text.contains("peak memory"), "{text}");
}

/// The weighted median of `price` weighted by `units`, computed here, outside any sandbox.
fn expected_weighted_median(csv: &str) -> f64 {
    let mut rows: Vec<(f64, f64)> = csv
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[3].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect();
    rows.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    let half = rows.iter().map(|r| r.1).sum::<f64>() / 2.0;
    let mut cumulative = 0.0;
    for (price, units) in rows {
        cumulative += units;
        if cumulative >= half {
            return price;
        }
    }
    unreachable!()
}

#[test]
fn the_weighted_median_job_from_the_readme() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(examples.join("weighted_median.py"), dir.path().join("weighted_median.py")).unwrap();
    std::fs::copy(examples.join("sales.csv"), dir.path().join("sales.csv")).unwrap();
    let output = run(&["weighted_median.py", "--file", "sales.csv", "--out", "/work/out.json:out.json"], dir.path());
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));
    let result: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("out.json")).unwrap()).unwrap();
    let csv = std::fs::read_to_string(dir.path().join("sales.csv")).unwrap();
    assert_eq!(result["rows"], 4000);
    assert_eq!(result["weighted_median"].as_f64().unwrap(), expected_weighted_median(&csv));
}

#[test]
fn figures_come_back_as_pngs_of_the_right_size() {
    let dir = tempfile::tempdir().unwrap();
    let code = "import matplotlib.pyplot as plt\nplt.figure(figsize=(4, 3), dpi=100)\nplt.plot([1, 2, 3])\nplt.show()\n\
                plt.figure(figsize=(8, 2))\nplt.bar(['a', 'b'], [3, 4])";
    let (record, code_) = json(&["-c", code], dir.path());
    assert_eq!(code_, 0, "{record}");
    let figures = record["figures"].as_array().unwrap();
    assert_eq!(figures.len(), 2, "{record}");
    assert_eq!((figures[0]["width"].as_u64(), figures[0]["height"].as_u64()), (Some(400), Some(300)));
    assert_eq!((figures[1]["width"].as_u64(), figures[1]["height"].as_u64()), (Some(800), Some(200)));
    use base64::Engine;
    let png = base64::engine::general_purpose::STANDARD.decode(figures[0]["png_base64"].as_str().unwrap()).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // Without --json the figures are saved beside the output.
    let output = run(&["-c", code], dir.path());
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("figure-1.png (400x300"), "{text}");
    let saved = std::fs::read(dir.path().join("figure-2.png")).unwrap();
    assert_eq!(&saved[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn the_last_expression_errors_and_syntax_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (record, _) = json(&["-c", "x = {'a': [1, 2]}\nx"], dir.path());
    assert_eq!(record["value"], "{'a': [1, 2]}");
    let (record, _) = json(&["-c", "x = 1\nprint(x)"], dir.path());
    assert!(record.get("value").is_none(), "no value without a final expression");

    let (record, code) = json(&["-c", "def f():\n    return 1 / 0\n\nf()"], dir.path());
    assert_eq!(code, 1);
    let error = &record["error"];
    assert_eq!(error["type"], "ZeroDivisionError");
    assert_eq!(error["line"], 2);
    let tb = error["traceback"].as_str().unwrap();
    assert!(tb.contains("line 4, in <module>") && tb.contains("line 2, in f"), "{tb}");
    assert!(!tb.contains("driver.py"), "airlock's own frames are removed: {tb}");

    let (record, _) = json(&["-c", "x = 1\ny = (2 +\nprint(x"], dir.path());
    assert_eq!(record["error"]["type"], "SyntaxError");
    assert_eq!(record["error"]["line"], 3);
    assert!(record["error"]["column"].as_u64().is_some(), "{record}");
}

#[test]
fn a_missing_package_says_what_the_image_holds_and_how_to_get_it() {
    let dir = tempfile::tempdir().unwrap();
    let (record, _) = json(&["-c", "import sklearn"], dir.path());
    let message = record["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("python-data") && message.contains("pandas") && message.contains("airlock image build"),
        "{message}"
    );
}

#[test]
fn shell_code_runs_in_the_image_with_the_usual_tools() {
    let dir = tempfile::tempdir().unwrap();
    let (record, code) = json(
        &["--lang", "sh", "-c", "echo a,b | cut -d, -f2; ls / | wc -l; python -c 'import pandas; print(1)'"],
        dir.path(),
    );
    assert_eq!(code, 0, "{record}");
    assert_eq!(record["stdout"].as_str().unwrap().lines().next(), Some("b"));
}

#[test]
fn the_image_is_read_only_from_inside() {
    let dir = tempfile::tempdir().unwrap();
    let (record, _) = json(
        &[
            "-c",
            "import pandas, os\np = os.path.dirname(pandas.__file__)\ntry:\n    open(p + '/x', 'w')\n    print('wrote')\nexcept OSError as e:\n    print(type(e).__name__)",
        ],
        dir.path(),
    );
    assert_eq!(record["stdout"].as_str().unwrap().trim(), "OSError");
}

#[test]
fn a_terminal_on_airlock_s_stdin_never_reaches_the_code() {
    use std::io::Read;
    use std::os::fd::AsFd;
    let _ = data_image();
    let master = rustix::pty::openpt(rustix::pty::OpenptFlags::RDWR | rustix::pty::OpenptFlags::NOCTTY).unwrap();
    rustix::pty::grantpt(&master).unwrap();
    rustix::pty::unlockpt(&master).unwrap();
    let name = rustix::pty::ptsname(&master, Vec::new()).unwrap();
    let slave = std::fs::OpenOptions::new().read(true).write(true).open(name.to_str().unwrap()).unwrap();
    let code = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
out = [os.isatty(0)]
for fd in (0, 1, 2):
    ctypes.set_errno(0)
    r = libc.ioctl(fd, 0x5412, ctypes.c_char_p(b"X"))
    out.append(errno.errorcode.get(ctypes.get_errno(), "OK"))
try:
    os.open("/dev/tty", os.O_RDWR)
    out.append("tty")
except OSError as e:
    out.append(errno.errorcode[e.errno])
print(out)
"#;
    let output = airlock_command()
        .args(["run", "--json", "-c", code])
        .stdin(std::process::Stdio::from(slave.as_fd().try_clone_to_owned().unwrap()))
        .output()
        .unwrap();
    let record: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(record["stdout"].as_str().unwrap().trim(), "[False, 'EPERM', 'EPERM', 'EPERM', 'ENOENT']", "{record}");
    // Nothing was typed into the terminal.
    rustix::fs::fcntl_setfl(&master, rustix::fs::OFlags::NONBLOCK).unwrap();
    let mut typed = Vec::new();
    let _ = std::fs::File::from(master).read_to_end(&mut typed);
    assert!(!typed.contains(&b'X'), "{typed:?}");
}

#[test]
fn images_lock_build_reuse_verify_and_refuse_when_broken() {
    let home = tempfile::tempdir().unwrap();
    let requirements = home.path().join("requirements.txt");
    std::fs::write(&requirements, "six==1.16.0\n").unwrap();
    let lock = home.path().join("pylock.toml");
    let image =
        |args: &[&str]| airlock_command().env("AIRLOCK_HOME", home.path()).arg("image").args(args).output().unwrap();
    // Resolved in a sandbox whose only network is the index: every file pinned.
    let locked = image(&["lock", requirements.to_str().unwrap(), "-o", lock.to_str().unwrap()]);
    assert!(locked.status.success(), "{}", String::from_utf8_lossy(&locked.stderr));
    let lock_text = std::fs::read_to_string(&lock).unwrap();
    assert!(lock_text.contains("name = \"six\"") && lock_text.contains("sha256 = "), "{lock_text}");
    // The old way is refused with the new one.
    let old = image(&["build", "tiny", "--requirements", requirements.to_str().unwrap()]);
    assert!(!old.status.success() && String::from_utf8_lossy(&old.stderr).contains("airlock image lock"));
    let built = image(&["build", "tiny", "--lock", lock.to_str().unwrap()]);
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let progress = String::from_utf8_lossy(&built.stderr);
    assert!(progress.contains("[3/4]") && progress.contains("six-1.16.0-py2.py3-none-any.whl"), "progress: {progress}");
    assert!(progress.contains("network to ") && progress.contains("no network"), "steps recorded: {progress}");
    let hash = String::from_utf8_lossy(&built.stdout).split_whitespace().nth(1).unwrap().to_owned();
    // Same inputs, same image: the rebuild reuses it.
    let again = image(&["build", "tiny", "--lock", lock.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already built"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(String::from_utf8_lossy(&again.stdout).contains(&hash));
    let show = String::from_utf8_lossy(&image(&["show", "tiny"]).stdout).into_owned();
    assert!(show.contains("six 1.16.0") && show.contains("python:"), "{show}");
    let list = String::from_utf8_lossy(&image(&["list"]).stdout).into_owned();
    assert!(list.contains("tiny") && list.contains(&hash), "{list}");
    let verified = image(&["verify", "tiny"]);
    assert!(verified.status.success(), "{}", String::from_utf8_lossy(&verified.stdout));
    // It runs, with its package and without others.
    let run = airlock_command()
        .env("AIRLOCK_HOME", home.path())
        .args(["run", "--json", "--image", "tiny", "-c", "import six; print(six.__version__)"])
        .output()
        .unwrap();
    let record: Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(record["stdout"], "1.16.0\n", "{record}");
    assert_eq!(record["image"]["hash"], hash.as_str());
    // A lock whose hash the index does not match fails, naming it, and leaves nothing half-made.
    let sha = lock_text.split("sha256 = \"").nth(1).unwrap().split('"').next().unwrap().to_owned();
    std::fs::write(&lock, lock_text.replace(&sha, &"0".repeat(64))).unwrap();
    let failed = image(&["build", "broken", "--lock", lock.to_str().unwrap()]);
    assert!(!failed.status.success());
    let err = String::from_utf8_lossy(&failed.stderr);
    assert!(err.contains("package six") && err.contains(&sha) && err.contains(&"0".repeat(64)), "{err}");
    let leftovers: Vec<_> = std::fs::read_dir(home.path().join("images"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".build") || n.starts_with(".trash"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // A corrupted image is refused with a clear error, never used.
    std::fs::remove_file(home.path().join("images").join(&hash).join("manifest.json")).unwrap();
    let run = airlock_command()
        .env("AIRLOCK_HOME", home.path())
        .args(["run", "--image", "tiny", "-c", "1"])
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(125));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("incomplete") && err.contains("airlock image build tiny"), "{err}");
    assert!(image(&["rm", "tiny"]).status.success());
    assert!(!home.path().join("images").join(&hash).exists());
}

/// The driver runs from the bytecode airlock keeps for an interpreter only
/// when that interpreter made it from this very source: an entry made by
/// another interpreter, from another source, unchecked or damaged changes
/// nothing of what runs (the driver is compiled from its source instead).
/// (With driver_start.py's check removed, the tampered entries ran instead
/// of the driver.)
#[test]
fn only_bytecode_this_interpreter_made_from_this_source_runs() {
    let home = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let run = |code: &str| -> Value {
        let output = airlock_command()
            .env("AIRLOCK_HOME", home.path())
            .args(["run", "--json", "--python", "python3", "-c", code])
            .current_dir(dir.path())
            .output()
            .expect("run airlock");
        serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stderr)))
    };
    let check = |what: &str| {
        let record = run("print('hi')\n6 * 7");
        assert_eq!(record["stdout"], "hi\n", "{what}: {record}");
        assert_eq!(record["value"], "42", "{what}: {record}");
        let record = run("x = 1\n1 / 0");
        assert_eq!(record["error"]["type"], "ZeroDivisionError", "{what}: {record}");
        assert_eq!(record["error"]["line"], 2, "{what}: {record}");
        assert!(!record["stderr"].as_str().unwrap_or_default().contains(".airlock"), "{what}: {record}");
    };
    check("the first run, which makes the bytecode");
    // The driver's folder for this interpreter, bound into each sandbox.
    let folders: Vec<std::path::PathBuf> = std::fs::read_dir(home.path().join("cache/driver"))
        .expect("the driver's folder was kept")
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(folders.len(), 1, "one folder for one interpreter: {folders:?}");
    let entries: Vec<std::path::PathBuf> = ["driver.pyc", "driver_report.pyc"].map(|name| folders[0].join(name)).into();
    check("a run from the kept bytecode");

    // A .pyc of another program, made by this interpreter: as another
    // source's (checked: its hash is not the driver's), and unchecked.
    let evil = dir.path().join("evil.py");
    std::fs::write(&evil, "print('TAMPERED')\nraise SystemExit(9)\n").unwrap();
    let compiled = |mode: &str| -> Vec<u8> {
        let pyc = dir.path().join(format!("evil-{mode}.pyc"));
        let status = std::process::Command::new("python3")
            .args(["-I", "-c"])
            .arg(format!(
                "import py_compile; py_compile.compile({:?}, cfile={:?}, dfile='/.airlock-driver/driver.py', \
                 invalidation_mode=py_compile.PycInvalidationMode.{mode}, doraise=True)",
                evil.display().to_string(),
                pyc.display().to_string()
            ))
            .status()
            .unwrap();
        assert!(status.success());
        std::fs::read(pyc).unwrap()
    };
    let original: Vec<Vec<u8>> = entries.iter().map(|e| std::fs::read(e).unwrap()).collect();
    let mut other_interpreter = original[0].clone();
    other_interpreter[0] ^= 0xff;
    for (what, content) in [
        ("another source's bytecode", compiled("CHECKED_HASH")),
        ("unchecked bytecode", compiled("UNCHECKED_HASH")),
        ("timestamped bytecode", compiled("TIMESTAMP")),
        ("another interpreter's bytecode", other_interpreter),
        ("a damaged entry", original[0][..40].to_vec()),
    ] {
        for entry in &entries {
            std::fs::write(entry, &content).unwrap();
        }
        check(what);
    }
}

/// A remembered trial user namespace never stands in for a sandbox's own:
/// with a helper that passes the trial but cannot make a sandbox, the run
/// is refused, and the remembered trial is forgotten, so that the next
/// start tries again (and can name the fix). (Without forgetting, the second
/// start trusted the entry.)
#[test]
fn a_remembered_trial_is_forgotten_when_no_sandbox_can_be_made() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("helper.log");
    let helper = dir.path().join("airlock-init");
    std::fs::write(
        &helper,
        format!(
            "#!/bin/sh\nif [ \"$1\" = probe-userns ]; then echo trial >> {log}; exit 0; fi\necho sandbox >> {log}\nexit 1\n",
            log = log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let trial = home.path().join(airlock_linux::PROBE_TRIAL_CACHE);
    for round in 1..=2 {
        let output = airlock_command()
            .env("AIRLOCK_HOME", home.path())
            .env("AIRLOCK_INIT", &helper)
            .args(["run", "--json", "--python", "python3", "-c", "print('ran')"])
            .current_dir(dir.path())
            .output()
            .expect("run airlock");
        assert_eq!(output.status.code(), Some(125), "round {round}: {}", String::from_utf8_lossy(&output.stderr));
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(!stdout.contains("ran\\n"), "round {round}: the code ran: {stdout}");
        assert!(!trial.exists(), "round {round}: the failed sandbox left its trial remembered");
        let lines = std::fs::read_to_string(&log).unwrap();
        assert_eq!(lines.matches("trial").count(), round, "round {round}: {lines}");
    }
}

#[test]
fn a_relative_data_directory_is_taken_from_where_the_command_starts() {
    // The sandbox binds the image's trees by absolute path: a relative
    // AIRLOCK_HOME once failed the setup ("... must be an absolute path").
    let _ = data_image();
    let home = airlock_tests::test_home();
    let (parent, name) = (home.parent().unwrap(), home.file_name().unwrap());
    let output = airlock_command()
        .env("AIRLOCK_HOME", name)
        .current_dir(parent)
        .args(["run", "-c", "print(6 * 7)"])
        .output()
        .expect("run airlock");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("42"), "{stderr}");
}

/// The command reaps every process it started before it exits. Left to
/// init, a helper still tearing the sandbox down would be a zombie of any
/// PID 1 that does not reap (a container whose first process is the
/// application calling `airlock run`), one more at every run; not waiting
/// saved about 0.3 ms a run (bench/results/startup.md, stop 41). A
/// subreaper that never reaps stands in for that PID 1 and counts what each
/// of ten runs leaves it: nothing, and nothing of the run (cgroups,
/// mounts) on the host. (A build that left its helpers left one in about
/// half its runs.)
#[test]
fn the_command_leaves_no_process_for_its_caller_s_init_to_reap() {
    let _ = data_image();
    let dir = tempfile::tempdir().unwrap();
    const SUBREAPER: &str = r#"
import ctypes, os, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(36, 1, 0, 0, 0) == 0, "PR_SET_CHILD_SUBREAPER"
for _ in range(10):
    command = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = command.communicate()
    # What the command left is this process's child now; a moment for
    # it to be one (the kernel reparents it as the command exits).
    time.sleep(0.05)
    left = []
    while True:
        try:
            found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            break
        if found is None:
            left.append("running")
            break
        left.append(found.si_pid)
    print(command.pid, command.returncode, len(left), repr(out.decode()), repr(err.decode()))
"#;
    let airlock = airlock_tests::airlock_bin();
    let output = std::process::Command::new("python3")
        .args(["-c", SUBREAPER, airlock.to_str().unwrap(), "run", "-c", "print(6 * 7)"])
        .env("AIRLOCK_INIT", airlock_tests::helper())
        .env("AIRLOCK_HOME", airlock_tests::test_home())
        .current_dir(dir.path())
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(stdout.lines().count(), 10, "{stdout}");
    for line in stdout.lines() {
        let [pid, status, left, shown, ..] = line.splitn(4, ' ').collect::<Vec<_>>()[..] else { panic!("{stdout}") };
        assert_eq!((status, left), ("0", "0"), "a run left processes for its caller to reap: {line}");
        assert!(shown.contains("42"), "{line}");
        let on_host = airlock_tests::leftovers_of(pid.parse().unwrap(), "");
        assert!(on_host.is_empty(), "left behind on the host: {on_host:#?}");
    }
}

/// A Python whose installation is the caller's home folder (one built with
/// `--prefix=$HOME`, here a copy of the system's beside a link to its
/// library) is refused: the sandbox would get the installation whole, and
/// with it the home folder's keys. Before, the code read the key at
/// /opt/airlock/python/.ssh/id_ed25519.
#[test]
fn a_python_installed_in_the_home_folder_is_refused_not_bound() {
    let home = tempfile::tempdir().unwrap();
    let root = home.path();
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("lib")).unwrap();
    std::fs::create_dir_all(root.join(".ssh")).unwrap();
    std::fs::copy("/usr/bin/python3.11", root.join("bin/python3.11")).unwrap();
    std::os::unix::fs::symlink("/usr/lib/python3.11", root.join("lib/python3.11")).unwrap();
    std::fs::write(root.join(".ssh/id_ed25519"), "PRIVATE KEY 6d1c").unwrap();
    let python = root.join("bin/python3.11");
    let asked = std::process::Command::new(&python).args(["-I", "-c", "import sys; print(sys.base_prefix)"]).output();
    let prefix = String::from_utf8_lossy(&asked.unwrap().stdout).trim().to_owned();
    assert_eq!(Path::new(&prefix), std::fs::canonicalize(root).unwrap(), "the copy's installation is the home folder");
    let output = airlock_command()
        .env("HOME", root)
        .args(["run", "--python", python.to_str().unwrap(), "-c"])
        .arg("print(open('/opt/airlock/python/.ssh/id_ed25519').read())")
        .current_dir(root)
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(!said.contains("PRIVATE KEY"), "the sandbox read the home folder's key: {said}");
    assert!(!output.status.success(), "{said}");
    assert!(said.contains("your home folder") && said.contains("a folder of its own"), "{said}");
}
