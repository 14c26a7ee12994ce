#!/usr/bin/env python3
"""The compatibility check: slices of numpy's, pandas' and matplotlib's own
test suites, run inside the sandbox and bare, outcome by outcome.

Not a timed test and not a benchmark of speed: it asks whether legitimate
scientific code behaves the same inside airlock as outside. Both sides run
the same interpreter and packages (the `compat` image: python-data's pins
plus pytest and hypothesis, bench/compat-requirements.txt), the same pytest
command, the same thread counts and matplotlib backend. Every test id's
outcome is compared; a test whose outcome differs is listed by name with
its error, for a person to explain (network, display...).

usage: bench/compat.py [--airlock PATH] [--label TEXT] [--only SUITE]
       (AIRLOCK_HOME chooses the data directory; default target/compat-home)
Writes bench/results/compat-<label>.json (adding to it with --only) and
prints the table.
"""
import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The slices: packages' installed test modules, a few thousand tests in all,
# chosen for what they exercise (linear algebra and BLAS threads, files,
# subprocesses, locale and time zones, fonts and rendering) and for running
# in minutes on a small machine.
SUITES = {
    "numpy": [
        "numpy.linalg.tests.test_linalg",
        "numpy.lib.tests.test_function_base",
        "numpy.lib.tests.test_io",
        "numpy._core.tests.test_multiarray",
        "numpy.random.tests.test_generator_mt19937",
        "numpy.fft.tests.test_pocketfft",
    ],
    "pandas": [
        "pandas.tests.frame.methods",
        "pandas.tests.groupby.aggregate",
        "pandas.tests.io.test_common",
        "pandas.tests.io.formats.test_format",
        "pandas.tests.io.parser.common",
        "pandas.tests.tslibs",
    ],
    "matplotlib": [
        "matplotlib.tests.test_axes",
        "matplotlib.tests.test_figure",
        "matplotlib.tests.test_colors",
        "matplotlib.tests.test_ticker",
        "matplotlib.tests.test_font_manager",
        "matplotlib.tests.test_backend_pdf",
        "matplotlib.tests.test_matplotlib",
    ],
}

# Runs pytest on the modules given (without the tests the projects mark slow,
# as their own default runs do) and writes {test id: [outcome, detail]}
# to the file named by the first argument. The same code runs both sides.
RUNNER = r'''
import json, sys, pytest
out, modules = sys.argv[1], sys.argv[2:]
results = {}
class Collect:
    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            outcome = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
            if report.when != "call" and report.outcome == "failed":
                outcome = "error"
            detail = ""
            if report.failed:
                detail = str(report.longrepr).strip().splitlines()[-1][:300] if report.longrepr else ""
            elif report.skipped and isinstance(report.longrepr, tuple):
                detail = str(report.longrepr[2])[:200]
            results[report.nodeid] = [outcome, detail]
    def pytest_collectreport(self, report):
        if report.failed:
            results[report.nodeid or "<collection>"] = ["error", str(report.longrepr).strip().splitlines()[-1][:300]]
# matplotlib's wheels leave out its baseline images, and its tests package
# refuses to import without their folder: its test modules run from a copy
# with an empty one (image comparisons then fail alike on both sides).
def matplotlib_tests():
    import importlib.util, os, shutil, tempfile
    src = os.path.join(os.path.dirname(importlib.util.find_spec("matplotlib").origin), "tests")
    dst = os.path.join(tempfile.gettempdir(), "mpl", "tests")
    if not os.path.isdir(dst):
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        os.makedirs(os.path.join(dst, "baseline_images"))
    return dst
args, extra = [], []
for m in modules:
    if m.startswith("matplotlib.tests."):
        args.append(matplotlib_tests() + "/" + m.rsplit(".", 1)[1] + ".py")
        extra = ["--rootdir", matplotlib_tests() + "/.."]
        continue
    try:
        __import__(m)
        args.append(m)
    except Exception as e:
        results[m] = ["missing", str(e)]
code = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-W", "ignore::DeprecationWarning",
                    "-m", "not slow", *extra, "--pyargs", *args], plugins=[Collect()])
with open(out, "w") as f:
    json.dump({"exit": int(code), "results": results}, f)
'''

ENV = {
    # Both sides are told the sandbox's memory: numpy's big-array tests
    # otherwise size themselves from /proc/meminfo, the host's.
    "NPY_AVAILABLE_MEM": "3GB",
    "MPLBACKEND": "Agg",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
    "HYPOTHESIS_NO_PLUGINS": "1",
}


def image_venv(home):
    names = glob.glob(os.path.join(home, "images", "names", "compat"))
    if not names:
        sys.exit(f"no compat image in {home}: build it with "
                 f"`airlock image build compat --requirements bench/compat-requirements.txt`")
    digest = open(names[0]).read().strip()
    return os.path.join(home, "images", digest, "venv")


def run_bare(venv, modules, work):
    """The image's own interpreter on the host, no sandbox."""
    with open(os.path.join(work, "runner.py"), "w") as f:
        f.write(RUNNER)
    env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8",
           "MPLCONFIGDIR": os.path.join(work, ".mpl"), **ENV}
    for key in ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"]:
        env[key] = "1"
    out = os.path.join(work, "bare.json")
    started = time.time()
    subprocess.run([f"{venv}/bin/python", "runner.py", out, *modules], cwd=work, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=3600)
    return json.load(open(out)), time.time() - started


def run_inside(airlock, modules, work):
    """The same through `airlock run`, with room for a test suite."""
    code = RUNNER.replace("sys.argv[1], sys.argv[2:]", repr("/work/inside.json") + ", " + repr(modules))
    script = os.path.join(work, "inside_runner.py")
    with open(script, "w") as f:
        f.write(code)
    args = [airlock, "run", "--image", "compat", "--json", "--timeout", "3600", "--cpu-time", "3600",
            "--memory", "4096", "--pids", "256", "--disk", "1024", "--disk-inodes", "65536",
            "--max-output", "1000000", "--out", f"/work/inside.json:{work}/inside.json"]
    for key, value in ENV.items():
        args += ["--env", f"{key}={value}"]
    started = time.time()
    done = subprocess.run(args + [script], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=4000)
    took = time.time() - started
    try:
        return json.load(open(os.path.join(work, "inside.json"))), took
    except OSError:
        record = done.stdout.decode(errors="replace")[-3000:]
        sys.exit(f"the sandboxed run left no results:\n{record}\n{done.stderr.decode(errors='replace')[-3000:]}")


def counts(results):
    c = collections.Counter(outcome for outcome, _ in results.values())
    return {k: c.get(k, 0) for k in ["passed", "failed", "error", "skipped", "xfailed", "missing"]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--airlock", default=os.path.join(ROOT, "target/release/airlock"))
    parser.add_argument("--label", default="after")
    parser.add_argument("--only", choices=sorted(SUITES))
    args = parser.parse_args()
    args.airlock = os.path.abspath(args.airlock)
    home = os.environ.setdefault("AIRLOCK_HOME", os.path.join(ROOT, "target/compat-home"))
    venv = image_venv(home)
    out = os.path.join(ROOT, "bench/results", f"compat-{args.label}.json")
    # Suites run one at a time (--only) add to what earlier runs wrote.
    report = json.load(open(out)) if os.path.exists(out) else {"label": args.label, "suites": {}}
    report["airlock"] = args.airlock
    for suite, modules in SUITES.items():
        if args.only and suite != args.only:
            continue
        with tempfile.TemporaryDirectory() as work:
            bare, bare_s = run_bare(venv, modules, work)
            inside, inside_s = run_inside(args.airlock, modules, work)
        differ = {}
        for test in sorted(set(bare["results"]) | set(inside["results"])):
            # Every test that ran has an outcome; absent: not collected on that side.
            b = bare["results"].get(test, ["absent", ""])
            i = inside["results"].get(test, ["absent", ""])
            if b[0] != i[0]:
                differ[test] = {"bare": b, "inside": i}
        report["suites"][suite] = {
            "modules": modules,
            "bare": counts(bare["results"]),
            "inside": counts(inside["results"]),
            "seconds": {"bare": round(bare_s), "inside": round(inside_s)},
            "differ": differ,
        }
        print(f"{suite}: bare {counts(bare['results'])}, inside {counts(inside['results'])}, "
              f"{len(differ)} differ", flush=True)
        with open(out, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
    print(f"wrote {out}\n")
    print("| suite | side | passed | failed | errors | skipped | xfailed | differ |")
    print("|---|---|---|---|---|---|---|---|")
    for suite, r in report["suites"].items():
        for side in ["bare", "inside"]:
            c = r[side]
            print(f"| {suite} | {side} | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped']} | "
                  f"{c['xfailed']} | {len(r['differ']) if side == 'inside' else ''} |")


if __name__ == "__main__":
    main()
