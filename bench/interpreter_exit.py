#!/usr/bin/env python3
"""How long an interpreter's exit takes, by what it imported (issue 15).

A pooled run's interpreter has imported the preload, so its exit (the
kernel freeing its address space) is on the run's path; bare `python -c`
exits holding almost nothing. Each sample: a child imports MODULES, writes
one byte, and calls os._exit(0); the time is from that byte to the child's
reaping. Two arms, alternating: the imports alone, and the imports followed
by what a warm driver does next (driver.py's `_collapse_into_huge_pages`,
run from the checkout's driver.py). Run it with the image's interpreter
and site-packages, e.g.

    V=$(ls -d "$AIRLOCK_HOME"/images/*/venv | head -n1)
    PYTHONPATH=$(ls -d "$V"/lib/python3*/site-packages) OPENBLAS_NUM_THREADS=1 \\
        /root/.pyenv/versions/3.11.7/bin/python3.11 -S bench/interpreter_exit.py 'import pandas, numpy, matplotlib' 30
"""

import os
import statistics
import subprocess
import sys
import time

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "airlock-core", "src", "driver.py")

# The driver's module body only defines things when it is not __main__.
COLLAPSE = (
    f"driver = {{'__name__': 'airlock_driver', '__file__': {DRIVER!r}}}\n"
    f"exec(compile(open({DRIVER!r}).read(), {DRIVER!r}, 'exec'), driver)\n"
    "driver['_collapse_into_huge_pages']()"
)


def sample(code):
    child = subprocess.Popen([sys.executable, "-S", "-c", code], stdout=subprocess.PIPE)
    if child.stdout.read(1) != b"x":
        sys.exit(f"the child failed: {child.wait()}")
    began = time.perf_counter()
    child.wait()
    return (time.perf_counter() - began) * 1000


def main():
    imports = sys.argv[1] if len(sys.argv) > 1 else "pass"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    exit_now = "sys.stdout.write('x'); sys.stdout.flush(); os._exit(0)"
    arms = {
        "imports": f"import os, sys\n{imports}\n{exit_now}",
        "imports, then the collapse": f"import os, sys\n{imports}\n{COLLAPSE}\n{exit_now}",
    }
    samples = {name: [] for name in arms}
    for _ in range(rounds):
        for name, code in arms.items():
            samples[name].append(sample(code))
    for name, times in samples.items():
        print(f"{imports!r}, {name}: exit median {statistics.median(times):.2f} ms, min {min(times):.2f} ms ({rounds} rounds)")
    ratios = [b / a for a, b in zip(samples["imports"], samples["imports, then the collapse"])]
    print(f"collapse / imports alone, paired median: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
