#!/usr/bin/env python3
"""How long a warm interpreter's run and exit take, by what it did before (issue 15).

A pooled run's interpreter has imported the preload, so its exit (the
kernel unmapping its address space) is on the run's path; bare `python -c`
exits holding almost nothing. Each sample: a child imports MODULES, does
what its arm does next, writes one byte and blocks on its stdin, like a
warm driver at its gate; the time is from the byte that releases it to its
reaping, through JOB (a file of Python, run as a pooled run's code is; by
default `print(1+1)`) and `os._exit(0)`. A JOB runs in a scratch folder
holding a copy of examples/sales.csv, its `/work/` paths pointed there, so
examples/weighted_median.py is the everyday job. Four arms, alternating:

- the imports alone;
- then the driver's collapse (driver.py's `_collapse_into_huge_pages`);
- then its unmapping of the libraries' pages as well (`_unmap_file_pages`);
- all of that, the imports made from arenas aligned for huge pages
  (`_align_arenas`, with the native library libairlock_fork.so that
  AIRLOCK_FORK_LIB names, by default the release build's),

each run from the checkout's driver.py. Run it with the image's interpreter
and site-packages, e.g.

    cargo build --release -p airlock-fork
    V=$(ls -d "$AIRLOCK_HOME"/images/*/venv | head -n1)
    PYTHONPATH=$(ls -d "$V"/lib/python3*/site-packages) OPENBLAS_NUM_THREADS=1 \\
        /root/.pyenv/versions/3.11.7/bin/python3.11 -S bench/interpreter_exit.py 'import pandas, numpy, matplotlib' 30 [JOB]
"""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CHECKOUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DRIVER = os.path.join(CHECKOUT, "crates", "airlock-core", "src", "driver.py")

# The driver's module body only defines things when it is not __main__.
LOAD_DRIVER = (
    f"driver = {{'__name__': 'airlock_driver', '__file__': {DRIVER!r}}}\n"
    f"exec(compile(open({DRIVER!r}).read(), {DRIVER!r}, 'exec'), driver)\n"
)
NATIVE = os.environ.get("AIRLOCK_FORK_LIB") or os.path.join(CHECKOUT, "target", "release", "libairlock_fork.so")
COLLAPSE = "driver['_collapse_into_huge_pages']()\n"
UNMAP = "driver['_unmap_file_pages']()\n"
# Each arm: what it does before the imports, and after them.
ARMS = {
    "imports": ("", ""),
    "then the collapse": ("", LOAD_DRIVER + COLLAPSE),
    "then the collapse and the unmapping": ("", LOAD_DRIVER + COLLAPSE + UNMAP),
    "aligned arenas, the collapse and the unmapping": (
        LOAD_DRIVER + f"import ctypes\ndriver['_align_arenas'](ctypes.CDLL({NATIVE!r}))\n",
        COLLAPSE + UNMAP,
    ),
}


def sample(code, work):
    child = subprocess.Popen(
        [sys.executable, "-S", "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=work
    )
    if child.stdout.read(1) != b"x":
        sys.exit(f"the child failed: {child.wait()}")
    time.sleep(0.05)  # let the child reach its read
    began = time.perf_counter()
    child.stdin.write(b"x")
    child.stdin.flush()
    child.stdout.read()
    if child.wait() != 0:
        sys.exit(f"the child's job failed: {child.returncode}")
    return (time.perf_counter() - began) * 1000


def main():
    imports = sys.argv[1] if len(sys.argv) > 1 else "pass"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    work = tempfile.mkdtemp(prefix="airlock-exit-")
    shutil.copy(os.path.join(CHECKOUT, "examples", "sales.csv"), work)
    job = open(sys.argv[3]).read().replace("/work/", "") if len(sys.argv) > 3 else "print(1+1)"
    gate = "sys.stdout.write('x'); sys.stdout.flush(); sys.stdin.read(1)\n"
    run = f"exec(compile({job!r}, '<run>', 'exec'), {{'__name__': '__main__'}})\nsys.stdout.flush(); os._exit(0)"
    if not os.path.isfile(NATIVE):
        sys.exit(f"no native library at {NATIVE}: build it (cargo build --release -p airlock-fork) or set AIRLOCK_FORK_LIB")
    codes = {name: f"import os, sys\n{before}{imports}\n{after}{gate}{run}" for name, (before, after) in ARMS.items()}
    samples = {name: [] for name in codes}
    for _ in range(rounds):
        for name, code in codes.items():
            samples[name].append(sample(code, work))
    shutil.rmtree(work)
    what = "print(1+1)" if len(sys.argv) <= 3 else sys.argv[3]
    for name, times in samples.items():
        print(f"{imports!r}, {name}: {what} and exit, median {statistics.median(times):.2f} ms, "
              f"min {min(times):.2f} ms ({rounds} rounds)")
    alone = samples["imports"]
    for name in list(codes)[1:]:
        ratios = [b / a for a, b in zip(alone, samples[name])]
        print(f"{name} / imports alone, paired median: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
